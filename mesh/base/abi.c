/* The library's version and the ABI rule for versioned structs: read what
 * fits in the caller's size, default the rest, write only what fits. */
#include "internal.h"

#include <stdio.h>
#include <string.h>

#define STR2(x) #x
#define STR(x) STR2(x)

/* No field may follow the one MPG__ABI_LAST_<type> names: what is left
 * after it must be tail padding, smaller than the struct's alignment. */
#define LAST_FIELD_CHECK(type)                                             \
  _Static_assert(sizeof(type) - MPG__ABI_END(type) < _Alignof(type),     \
                 #type ": MPG__ABI_LAST_" #type " is not its last field")
LAST_FIELD_CHECK(mpg_spec);
LAST_FIELD_CHECK(mpg_nic_info);
LAST_FIELD_CHECK(mpg_gpu_info);
LAST_FIELD_CHECK(mpg_binding);
LAST_FIELD_CHECK(mpg_placement_opts);
LAST_FIELD_CHECK(mpg_init_opts);
LAST_FIELD_CHECK(mpg_launch);
LAST_FIELD_CHECK(mpg_sync_opts);
LAST_FIELD_CHECK(mpg_param_opts);
LAST_FIELD_CHECK(mpg_sync_stats);
LAST_FIELD_CHECK(mpg_shard_info);
LAST_FIELD_CHECK(mpg_tensor_layout);
LAST_FIELD_CHECK(mpg_ckpt_opts);

unsigned mpg_version(void) { return MPG_VERSION_HEX; }

const char *mpg_version_string(void) {
  return STR(MPG_VERSION_MAJOR) "." STR(MPG_VERSION_MINOR) "." STR(MPG_VERSION_PATCH);
}

mpg_status mpg__abi_check(const void *caller, uint32_t magic, const char *what,
                          const char *init) {
  if (!caller) return mpg__fail(MPG_ERR_INVALID, "%s is NULL", what);
  const mpg__abi_head *h = caller;
  if (h->magic != magic)
    return mpg__fail(MPG_ERR_INVALID,
                     "%s was not set up with %s (magic 0x%08x, expected 0x%08x)",
                     what, init, (unsigned)h->magic, (unsigned)magic);
  return MPG_OK;
}

mpg_status mpg__abi_in(void *full, size_t full_size, const void *caller,
                       uint32_t magic, const char *what, const char *init) {
  mpg_status st = mpg__abi_check(caller, magic, what, init);
  if (st) return st;
  const mpg__abi_head *h = caller;
  size_t n = h->size < full_size ? h->size : full_size;
  if (n > sizeof *h)
    memcpy((char *)full + sizeof *h, (const char *)caller + sizeof *h, n - sizeof *h);
  /* A caller built against a newer header: say so if it set any field
   * this library does not know (an appended field's zero is its default).
   * Our own tail padding (under 8 bytes) is not such a field. */
  size_t ours = (full_size + 7) & ~(size_t)7;
  size_t nonzero = 0;
  for (size_t i = ours; i < h->size; i++) nonzero += ((const unsigned char *)caller)[i] != 0;
  if (nonzero || h->version > MPG_API_VERSION)
    mpg__log(1, "%s: built against API version %u (%zu bytes); this library is "
             "version %u (%zu bytes of fields) and ignores what it does not know "
             "(%zu non-zero bytes past its fields)",
             what, (unsigned)h->version, h->size, (unsigned)MPG_API_VERSION, full_size,
             nonzero);
  mpg__abi_head *fh = full;
  fh->size = full_size;
  fh->magic = magic;
  fh->version = MPG_API_VERSION;
  return MPG_OK;
}

void mpg__abi_out(void *caller, const void *full, size_t full_size) {
  const mpg__abi_head *h = caller;
  size_t n = h->size < full_size ? h->size : full_size;
  if (n > sizeof *h)
    memcpy((char *)caller + sizeof *h, (const char *)full + sizeof *h, n - sizeof *h);
}
