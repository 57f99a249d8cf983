/* libFuzzer target: the checkpoint metadata decoder (sync/ckpt_format.c,
 * mpg__ckpt_meta_decode).  The input is decoded twice: as it is, and with
 * its length field and trailer made consistent (so that mutations reach
 * the fields behind the checksum).  A failure is MPG_ERR_INVALID or
 * MPG_ERR_UNSUPPORTED with a message that names the file; the header
 * check before the body (mpg__ckpt_meta_precheck) accepts whatever the
 * decoder accepts; a success gives
 * a meta that holds every rule the decoder promises, encodes back to the
 * same bytes, and decodes again to the same meta. */
#include "fuzz_common.h"

#include "../../sync/ckpt_format.h"

#define PATH "fuzz/meta.mpgc"

static void put_le(unsigned char *p, uint64_t v, int k) {
  for (int i = 0; i < k; i++, v >>= 8) p[i] = (unsigned char)v;
}

/* The rules of ckpt_format.h on a decoded meta. */
static void check_rules(const mpg__ckpt_meta *m) {
  FUZZ_CHECK(m->version == MPG__CKPT_VERSION && m->world >= 1 && m->block_bytes >= 1);
  FUZZ_CHECK(m->mesh != NULL);
  for (uint32_t i = 0; i < m->nfiles; i++) {
    FUZZ_CHECK(m->files[i].rank < m->world);
    for (uint32_t j = 0; j < i; j++) FUZZ_CHECK(m->files[j].rank != m->files[i].rank);
  }
  uint64_t next_chunk = 0, next_hash = 0;
  for (uint32_t i = 0; i < m->ntensors; i++) {
    const mpg__ckpt_tensor *t = &m->tensors[i];
    size_t nl = strlen(t->name);
    FUZZ_CHECK(nl >= 1 && nl <= MPG__CKPT_NAME_MAX);
    FUZZ_CHECK(i == 0 || strcmp(m->tensors[i - 1].name, t->name) < 0);
    FUZZ_CHECK(mpg__ckpt_meta_find(m, t->name) == (int)i);
    FUZZ_CHECK(mpg__ckpt_dtype_size(t->dtype) > 0 && t->kind >= 0 && t->kind <= MPG_CKPT_BYTES);
    FUZZ_CHECK(t->ndim >= 1 && t->ndim <= MPG_CKPT_MAX_NDIM);
    for (int a = 0; a < t->ndim; a++) FUZZ_CHECK(t->shape[a] >= 1);
    FUZZ_CHECK(t->first_chunk == next_chunk);
    next_chunk += t->nchunks;
    for (uint32_t c = t->first_chunk; c < t->first_chunk + t->nchunks; c++) {
      const mpg__ckpt_chunk *k = &m->chunks[c];
      FUZZ_CHECK(k->tensor == i && k->file < m->nfiles);
      for (int a = 0; a < t->ndim; a++)
        FUZZ_CHECK(k->box_shape[a] >= 1 && k->box_off[a] + k->box_shape[a] <= t->shape[a]);
      uint64_t elems = mpg__ckpt_box_elems(k->box_shape, t->ndim);
      FUZZ_CHECK(k->range_count >= 1 && k->range_off + k->range_count <= elems);
      uint64_t bytes = k->range_count * mpg__ckpt_dtype_size(t->dtype);
      FUZZ_CHECK(k->file_off + bytes <= m->files[k->file].bytes && k->file_off + bytes >= bytes);
      FUZZ_CHECK(k->first_hash == next_hash);
      next_hash += mpg__ckpt_nblocks(bytes, m->block_bytes);
    }
  }
  FUZZ_CHECK(next_chunk == m->nchunks && next_hash == m->nhashes);
}

static void one(const unsigned char *buf, size_t len) {
  mpg__ckpt_meta m;
  mpg__clear_error();
  /* The header check a reader makes before reading the body (ckpt_open.c)
   * never refuses what the decoder accepts. */
  mpg_status pre = mpg__ckpt_meta_precheck(buf, len, PATH);
  fuzz_check_status(pre);
  mpg__clear_error();
  mpg_status st = mpg__ckpt_meta_decode(buf, len, PATH, &m);
  fuzz_check_status(st);
  FUZZ_CHECK(st != MPG_OK || pre == MPG_OK);
  if (st != MPG_OK) {
    FUZZ_CHECK(st == MPG_ERR_INVALID || st == MPG_ERR_UNSUPPORTED || st == MPG_ERR_NOMEM);
    FUZZ_CHECK(strncmp(mpg_last_error(), PATH ": ", strlen(PATH) + 2) == 0);
    mpg__ckpt_meta_free(&m);
    return;
  }
  check_rules(&m);
  unsigned char *out = NULL;
  size_t n = 0;
  FUZZ_CHECK(mpg__ckpt_meta_encode(&m, &out, &n) == MPG_OK);
  FUZZ_CHECK(n == len && memcmp(out, buf, len) == 0);
  mpg__ckpt_meta again;
  FUZZ_CHECK(mpg__ckpt_meta_decode(out, n, PATH, &again) == MPG_OK);
  unsigned char *out2 = NULL;
  size_t n2 = 0;
  FUZZ_CHECK(mpg__ckpt_meta_encode(&again, &out2, &n2) == MPG_OK);
  FUZZ_CHECK(n2 == n && memcmp(out2, out, n) == 0);
  FUZZ_CHECK(again.step == m.step && again.save_id == m.save_id && !strcmp(again.mesh, m.mesh));
  free(out);
  free(out2);
  mpg__ckpt_meta_free(&again);
  mpg__ckpt_meta_free(&m);
  FUZZ_CHECK(m.tensors == NULL && m.ntensors == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  /* An exact-size copy, so that ASan sees any read past the end. */
  unsigned char *buf = malloc(size ? size : 1);
  if (!buf) abort();
  memcpy(buf, data, size);
  one(buf, size);
  if (size >= 84) {
    put_le(buf + 16, size, 8);
    put_le(buf + size - 8, mpg__xxh64(buf, size - 8, 0), 8);
    one(buf, size);
  }
  free(buf);
  return 0;
}
