/* Internal helpers shared by every module (names start mpg__). */
#ifndef MPG_INTERNAL_H
#define MPG_INTERNAL_H

#include "meshpg.h"

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The pre-multiplied sum (NCCL's ncclRedOpCreatePreMulSum): each input
 * times a scale, then summed.  Internal: the public calls reach it only
 * through mpg_all_reduce_scaled and mpg_reduce_scatter_scaled, and reject
 * it as an mpg_op. */
#define MPG__OP_PREMUL_SUM ((mpg_op)4)

#if defined(__GNUC__)
#define MPG__PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define MPG__PRINTF(a, b)
#endif

/* The monotonic clock (CLOCK_MONOTONIC) in seconds: every timeout,
 * deadline and duration of the library (base/clock.c). */
double mpg__now(void);
/* Sleep for `ms` milliseconds (a fraction allowed), EINTR resumed. */
void mpg__sleep_ms(double ms);

/* A growing string (base/strbuf.c): the dump of the flight recorder, the
 * CLI's JSON and reports.  Starts zeroed (MPG__STRBUF_INIT, or a max).
 * `st` is sticky: after the first failure every append does nothing, and
 * the writer looks once at the end.  s is NUL-terminated once anything
 * was appended (NULL before). */
typedef struct mpg__strbuf {
  char *s;
  size_t len, cap;
  size_t max;     /* most bytes of text it may hold; 0: no bound of its own */
  mpg_status st;  /* MPG_OK; MPG_ERR_NOMEM, MPG_ERR_RANGE (over max: the text
                   * holds what came before the append that did not fit),
                   * MPG_ERR_INVALID (the format's encoding error) */
} mpg__strbuf;
#define MPG__STRBUF_INIT {NULL, 0, 0, 0, MPG_OK}
/* Append the formatted text (C's format strings, checked by the compiler). */
void mpg__strbuf_add(mpg__strbuf *b, const char *fmt, ...) MPG__PRINTF(2, 3);
void mpg__strbuf_vadd(mpg__strbuf *b, const char *fmt, va_list ap);
/* The text, the caller's to free ("" when nothing was appended), and the
 * buffer emptied; NULL (the text freed) after a failure. */
char *mpg__strbuf_take(mpg__strbuf *b);
void mpg__strbuf_free(mpg__strbuf *b);

/* Files (base/file.c, where the rules are written): every file is named
 * by a directory handle `dfd` (AT_FDCWD: the working directory) and a
 * path relative to it; `shown` is how messages name it.  Each error is
 * MPG_ERR_IO naming the path and the system's error text unless said. */

/* Open `name` for reading, only when it is a regular file: O_NONBLOCK |
 * O_NOFOLLOW (no hang on a FIFO, no symbolic link followed), fstat, then
 * blocking reads.  *size: its size.  MPG_ERR_NOT_FOUND when missing;
 * MPG_ERR_IO otherwise ("run/x/meta.mpgc is a symbolic link (not
 * followed)", "cannot read run/x/meta.mpgc: not a regular file (a FIFO)"). */
mpg_status mpg__file_open_regular(int dfd, const char *name, const char *shown, int *fd,
                                  uint64_t *size);

/* n bytes at offset off of fd, all of them (EINTR retried).  A read that
 * meets the file's end is MPG_ERR_IO "truncated". */
mpg_status mpg__file_pread_all(int fd, void *buf, size_t n, uint64_t off, const char *shown);
mpg_status mpg__file_pwrite_all(int fd, const void *buf, size_t n, uint64_t off,
                                const char *shown);

/* Replacing a file whole: a temporary file beside `path` (O_CREAT |
 * O_EXCL | O_NOFOLLOW, mode as open's, less the umask), written through
 * o->fd, then mpg__file_out_commit: fsync, rename over path (a reader sees
 * the old file or the new one, never half of one), fsync of the
 * directory.  The temporary name is `tmp_name` when the caller owns the
 * directory and its cleanup knows the name, else .NAME.PID.N.XXXXXXXX, a
 * name no other writer uses.  Commit and abandon release o; on every
 * failure the temporary file is removed. */
typedef struct mpg__file_out {
  int fd;            /* the temporary file, open for writing */
  int dirfd, own_dir;
  const char *shown; /* the caller's: must outlive o */
  char name[256];    /* the target's name in dirfd */
  char tmp[300];     /* the temporary file's; "" when none is ours */
} mpg__file_out;
mpg_status mpg__file_out_open(mpg__file_out *o, int dfd, const char *path, const char *shown,
                              const char *tmp_name, unsigned mode);
mpg_status mpg__file_out_commit(mpg__file_out *o);
void mpg__file_out_abandon(mpg__file_out *o);
/* Both at once, for `len` bytes already in memory. */
mpg_status mpg__file_write_whole(int dfd, const char *path, const char *shown,
                                 const char *tmp_name, const void *buf, size_t len,
                                 unsigned mode);

/* Record the thread's last error message and return `status`. */
mpg_status mpg__fail(mpg_status status, const char *fmt, ...) MPG__PRINTF(2, 3);

/* Record an error positioned in a spec source: "file:line:col: " prefix
 * when pos->line > 0 (file "" gives "<string>"). */
mpg_status mpg__fail_at(mpg_status status, const char *source,
                        mpg_srcpos pos, const char *fmt, ...)
    MPG__PRINTF(4, 5);

/* Record "<context>: <the thread's current message>" and return `status`:
 * how a caller adds its context to the error of a call it made. */
mpg_status mpg__fail_wrap(mpg_status status, const char *fmt, ...)
    MPG__PRINTF(2, 3);

/* Keep the thread's message across clean-up calls that may overwrite it:
 * save, clean up, then restore (which returns `status`). */
typedef struct mpg__saved_error {
  char msg[1024];
} mpg__saved_error;
void mpg__error_save(mpg__saved_error *saved);
mpg_status mpg__error_restore(mpg_status status, const mpg__saved_error *saved);

/* The ABI rule for versioned structs (meshpg.h, "Versioned structs").
 * Every such struct starts with this header. */
typedef struct mpg__abi_head {
  size_t size;
  uint32_t magic;
  uint32_t version;
} mpg__abi_head;

/* Where the data of each versioned struct ends: after its last field, not
 * at sizeof, so that a caller's appended field that lands in the tail
 * padding of the library's struct is never read or written.  When a field
 * is appended to a public struct, its line here names the new last field
 * (mesh/base/abi.c checks that no field follows). */
#define MPG__ABI_FIELD_END(type, field) \
  (offsetof(type, field) + sizeof(((type *)0)->field))
#define MPG__ABI_LAST_mpg_spec source
#define MPG__ABI_LAST_mpg_nic_info cpuset
#define MPG__ABI_LAST_mpg_gpu_info nvlink_peers
#define MPG__ABI_LAST_mpg_binding thread
#define MPG__ABI_LAST_mpg_placement_opts inner_dims
#define MPG__ABI_LAST_mpg_init_opts trace_entries
#define MPG__ABI_LAST_mpg_launch source
#define MPG__ABI_LAST_mpg_sync_opts register_buffers
#define MPG__ABI_LAST_mpg_param_opts tied_group
#define MPG__ABI_LAST_mpg_sync_stats shm_bytes
#define MPG__ABI_LAST_mpg_shard_info shard_offset
#define MPG__ABI_LAST_mpg_tensor_layout kind
#define MPG__ABI_LAST_mpg_ckpt_opts block_bytes
#define MPG__ABI_END(type) MPG__ABI_FIELD_END(type, MPG__ABI_LAST_##type)

/* Import a caller's input struct: `full` (the library's own struct, whose
 * data ends at `full_size`, its MPG__ABI_END) holds the defaults on entry;
 * the fields wholly inside the caller's size are copied over them, and
 * full's header is set to the library's size and version.  MPG_ERR_INVALID "<what> was not set up with
 * <init>" for a NULL or a wrong magic. */
mpg_status mpg__abi_in(void *full, size_t full_size, const void *caller,
                       uint32_t magic, const char *what, const char *init);

/* Check a caller's output struct: MPG_ERR_INVALID as mpg__abi_in. */
mpg_status mpg__abi_check(const void *caller, uint32_t magic, const char *what,
                          const char *init);

/* Export into a caller's output struct (checked with mpg__abi_check): the
 * fields of `full` after the header, as many as the caller's size holds.
 * The caller's header is left alone. */
void mpg__abi_out(void *caller, const void *full, size_t full_size);

/* Clear the thread's last error (successful public calls need not). */
void mpg__clear_error(void);

/* Logging, only when MESHPG_LOG=info|debug.  level 1 = info, 2 = debug.
 * The level is read from MESHPG_LOG once per process, and set again by
 * mpg_ctx_create (mpg__log_set_level) from its one read of the variables;
 * a log line never reads the environment. */
int mpg__log_level(void);
void mpg__log_set_level(int level);
void mpg__log(int level, const char *fmt, ...) MPG__PRINTF(2, 3);

/* Every timeout (opts.backend.timeout_s, the spec's backend.timeout_s,
 * mpg_ctx_set_timeout) is a finite number of seconds below this bound
 * (about 31 years): NaN, inf and 1e300 would make a missing peer hang
 * for ever. */
#define MPG__TIMEOUT_MAX 1e9
#define MPG__TIMEOUT_MAX_TEXT "1e9" /* for messages */

/* Name rules shared by the spec and the mesh. */
int mpg__name_valid(const char *name);

/* The next `sep`-separated item of *s into buf (cap bytes), without the
 * blanks (spaces, tabs) around it.  *s advances past the separator and
 * becomes NULL after the last item.  Returns 1 for an item (possibly
 * empty), 0 when *s is NULL, -1 when the item does not fit (buf then holds
 * its start and "..."). */
int mpg__list_next(const char **s, char sep, char *buf, size_t cap);

/* Smallest edit distance name among candidates, or NULL if none is close. */
const char *mpg__closest(const char *word, const char *const *cands, int n);

/* 64-bit hashing for the library's agreement checks (sync's layout
 * fingerprints, groups' issue order): FNV-1a of a string, and a mix of a
 * value into a running hash.  Every rank computes them alike. */
static inline uint64_t mpg__hash_str(const char *s) {
  uint64_t f = 0xcbf29ce484222325ull;
  for (const unsigned char *c = (const unsigned char *)s; *c; c++)
    f = (f ^ *c) * 0x100000001b3ull;
  return f;
}

static inline uint64_t mpg__hash_mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  h ^= h >> 31;
  h *= 0xbf58476d1ce4e5b9ull;
  return h ^ (h >> 29);
}

#ifdef __cplusplus
}
#endif
#endif
