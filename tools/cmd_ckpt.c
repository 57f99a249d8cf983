/* meshpg ckpt: inspect a checkpoint directory (info) and consolidate its
 * tensors into one safetensors file (export).  Reads the metadata with the
 * library's decoder (sync/ckpt_format.h) and the data files itself, one
 * tensor in memory at a time, checking every block's checksum. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../sync/ckpt_format.h"
#include "cmd.h"

static const char ckpt_usage[] =
    "usage: meshpg ckpt info DIR [--json]\n"
    "       meshpg ckpt export DIR --safetensors FILE [--all]\n"
    "\n"
    "Inspect a checkpoint directory written by mpg_ckpt_save, or export its\n"
    "tensors.\n"
    "\n"
    "  info DIR            the mesh, step, world size, format version, data\n"
    "                      files and every tensor (dtype, kind, shape, chunks,\n"
    "                      bytes), with totals\n"
    "  --json              info: print JSON instead of text\n"
    "  export DIR          write the params (kind param) into one safetensors\n"
    "                      file, checking every block's checksum\n"
    "  --safetensors FILE  export: the file to write (required)\n"
    "  --all               export: every tensor, optimizer state and bytes too\n";

#define kind_name mpg__ckpt_kind_name

/* While an export may start again (a save replaced the checkpoint under
 * it), its failure message is kept here rather than printed. */
static int g_defer;
static char g_msg[2048];

/* "meshpg ckpt: <message>" on stderr (or kept in g_msg while g_defer);
 * returns TOOL_EXIT_FAIL. */
static int ck_fail(const char *fmt, ...) TOOL_PRINTF(1, 2);
static int ck_fail(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  if (g_defer) {
    vsnprintf(g_msg, sizeof g_msg, fmt, ap);
  } else {
    fputs("meshpg ckpt: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
  }
  va_end(ap);
  return TOOL_EXIT_FAIL;
}

static uint64_t tensor_elems(const mpg__ckpt_tensor *t) {
  return mpg__ckpt_box_elems(t->shape, t->ndim);
}

static uint64_t tensor_bytes(const mpg__ckpt_tensor *t) {
  return tensor_elems(t) * mpg__ckpt_dtype_size(t->dtype); /* fits: the decoder checks */
}

/* "[4, 6]" into buf. */
static void shape_text(const uint64_t *shape, int ndim, char *buf, size_t cap) {
  size_t n = (size_t)snprintf(buf, cap, "[");
  for (int a = 0; a < ndim && n < cap; a++)
    n += (size_t)snprintf(buf + n, cap - n, "%s%" PRIu64, a ? ", " : "", shape[a]);
  if (n < cap) snprintf(buf + n, cap - n, "]");
}

/* ------------------------------------------------------------------ */
/* JSON strings (info --json and the safetensors header; mpg__strbuf) */
/* ------------------------------------------------------------------ */

/* A JSON string: quotes, backslashes and control bytes escaped; UTF-8
 * as it is (names and the mesh text are UTF-8: the decoder checks); a byte
 * that is not UTF-8 (only in DIR as given) as \u00NN, so that the output
 * is always valid JSON. */
static void sb_json_string(mpg__strbuf *b, const char *s) {
  mpg__strbuf_add(b, "\"");
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    unsigned c = *p;
    size_t k = c < 0x80 ? 0 : (c & 0xE0) == 0xC0 ? 1 : (c & 0xF0) == 0xE0 ? 2
             : (c & 0xF8) == 0xF0 ? 3 : 9;
    int ok = k < 9 && (k != 1 || c >= 0xC2);
    for (size_t j = 1; ok && j <= k; j++) ok = (p[j] & 0xC0) == 0x80;
    if (c == '"' || c == '\\')
      mpg__strbuf_add(b, "\\%c", c);
    else if (c < 0x20 || !ok)
      mpg__strbuf_add(b, "\\u%04x", c);
    else if (k == 0)
      mpg__strbuf_add(b, "%c", c);
    else {
      mpg__strbuf_add(b, "%.*s", (int)(k + 1), (const char *)p);
      p += k;
    }
  }
  mpg__strbuf_add(b, "\"");
}

/* ------------------------------------------------------------------ */
/* info                                                                 */
/* ------------------------------------------------------------------ */

/* A 128-bit sum (hi, lo): no total wraps. */
typedef struct sum128 {
  uint64_t hi, lo;
} sum128;

static void sum_add(sum128 *s, uint64_t v) {
  s->lo += v;
  s->hi += s->lo < v;
}

/* The sum in decimal into buf (at least 40 bytes). */
static const char *sum_text(sum128 s, char *buf, size_t cap) {
  char d[48];
  int n = 0;
  do { /* divide (hi, lo) by 10, 32 bits at a time */
    uint64_t parts[4] = {s.hi >> 32, s.hi & 0xFFFFFFFFu, s.lo >> 32, s.lo & 0xFFFFFFFFu}, r = 0;
    for (int i = 0; i < 4; i++) {
      uint64_t cur = (r << 32) | parts[i];
      parts[i] = cur / 10;
      r = cur % 10;
    }
    s.hi = parts[0] << 32 | parts[1];
    s.lo = parts[2] << 32 | parts[3];
    d[n++] = (char)('0' + r);
  } while (s.hi || s.lo);
  size_t k = 0;
  while (n > 0 && k + 1 < cap) buf[k++] = d[--n];
  buf[k] = '\0';
  return buf;
}

static void info_totals(const mpg__ckpt_meta *m, sum128 *bytes, sum128 *file_bytes,
                        uint32_t count[3]) {
  *bytes = *file_bytes = (sum128){0, 0};
  count[0] = count[1] = count[2] = 0;
  for (uint32_t i = 0; i < m->ntensors; i++) {
    sum_add(bytes, tensor_bytes(&m->tensors[i]));
    if (m->tensors[i].kind >= 0 && m->tensors[i].kind <= MPG_CKPT_BYTES)
      count[m->tensors[i].kind]++;
  }
  for (uint32_t f = 0; f < m->nfiles; f++) sum_add(file_bytes, m->files[f].bytes);
}

/* A name or the mesh text for the terminal: printable UTF-8 as it is;
 * control characters (C0, DEL, C1), backslashes and bytes that are not
 * UTF-8 escaped (\n, \t, \\, \xNN, \u0085), so that no escape sequence
 * reaches the terminal and no newline makes a row.  Into buf; returns its
 * length in columns (one per code point). */
static int text_escape(const char *s, char *buf, size_t cap) {
  const unsigned char *p = (const unsigned char *)s;
  size_t n = 0;
  int cols = 0;
  buf[0] = '\0';
  while (*p && n + 8 < cap) {
    unsigned c = *p;
    size_t k = c < 0x80 ? 0 : (c & 0xE0) == 0xC0 ? 1 : (c & 0xF0) == 0xE0 ? 2
             : (c & 0xF8) == 0xF0 ? 3 : 9;
    int ok = k < 9 && (k != 1 || c >= 0xC2);
    for (size_t j = 1; ok && j <= k; j++) ok = (p[j] & 0xC0) == 0x80;
    if (c == '\\') {
      n += (size_t)snprintf(buf + n, cap - n, "\\\\");
      cols += 2;
    } else if (c == '\n' || c == '\t') {
      n += (size_t)snprintf(buf + n, cap - n, "\\%c", c == '\n' ? 'n' : 't');
      cols += 2;
    } else if (c < 0x20 || c == 0x7F || !ok) {
      n += (size_t)snprintf(buf + n, cap - n, "\\x%02x", c);
      cols += 4;
      k = 0;
    } else if (c == 0xC2 && p[1] < 0xA0) { /* C1 control */
      n += (size_t)snprintf(buf + n, cap - n, "\\u%04x", (unsigned)p[1]);
      cols += 6;
    } else {
      memcpy(buf + n, p, k + 1);
      n += k + 1;
      buf[n] = '\0';
      cols++;
    }
    p += k + 1;
  }
  if (*p && n + 4 < cap) n += (size_t)snprintf(buf + n, cap - n, "...");
  return cols;
}

static void info_text(const char *dir, const mpg__ckpt_meta *m) {
  sum128 bytes, file_bytes;
  uint32_t count[3];
  char num[48], num2[48], esc[2048];
  info_totals(m, &bytes, &file_bytes, count);
  text_escape(dir, esc, sizeof esc);
  printf("checkpoint  %s\n", esc);
  text_escape(m->mesh, esc, sizeof esc);
  printf("mesh        %s\n", esc);
  printf("step        %" PRId64 "\n", m->step);
  printf("world size  %" PRIu32 "\n", m->world);
  printf("format      version %" PRIu32 ", checksum blocks of %" PRIu64 " bytes, save id "
         "%016" PRIx64 "\n", m->version, m->block_bytes, m->save_id);
  printf("files       %" PRIu32 ", %s bytes\n", m->nfiles, sum_text(file_bytes, num, sizeof num));
  for (uint32_t f = 0; f < m->nfiles; f++)
    printf("  data-%05" PRIu32 ".bin  %" PRIu64 " bytes\n", m->files[f].rank,
           m->files[f].bytes);
  int wn = 4, ws = 5, wb = 5; /* widths of name, shape, bytes */
  char shape[MPG_CKPT_MAX_NDIM * 24 + 4];
  for (uint32_t i = 0; i < m->ntensors; i++) {
    int n = text_escape(m->tensors[i].name, esc, sizeof esc);
    shape_text(m->tensors[i].shape, m->tensors[i].ndim, shape, sizeof shape);
    if (n > wn) wn = n;
    if ((int)strlen(shape) > ws) ws = (int)strlen(shape);
    n = snprintf(NULL, 0, "%" PRIu64, tensor_bytes(&m->tensors[i]));
    if (n > wb) wb = n;
  }
  printf("tensors     %" PRIu32 "\n", m->ntensors);
  if (m->ntensors)
    printf("  %-*s  %-5s  %-5s  %-*s  %6s  %*s\n", wn, "name", "dtype", "kind", ws, "shape",
           "chunks", wb, "bytes");
  for (uint32_t i = 0; i < m->ntensors; i++) {
    const mpg__ckpt_tensor *t = &m->tensors[i];
    int cols = text_escape(t->name, esc, sizeof esc);
    shape_text(t->shape, t->ndim, shape, sizeof shape);
    printf("  %s%*s  %-5s  %-5s  %-*s  %6" PRIu32 "  %*" PRIu64 "\n", esc, wn - cols, "",
           mpg__ckpt_dtype_name(t->dtype), kind_name(t->kind), ws, shape, t->nchunks, wb,
           tensor_bytes(t));
  }
  printf("total       %" PRIu32 " tensors (%" PRIu32 " param, %" PRIu32 " state, %" PRIu32
         " bytes), %" PRIu32 " chunks, %s bytes\n",
         m->ntensors, count[0], count[1], count[2], m->nchunks,
         sum_text(bytes, num2, sizeof num2));
}

static int info_json(const char *dir, const mpg__ckpt_meta *m) {
  sum128 bytes, file_bytes;
  uint32_t count[3];
  char num[48], num2[48];
  info_totals(m, &bytes, &file_bytes, count);
  mpg__strbuf b = MPG__STRBUF_INIT;
  mpg__strbuf_add(&b, "{\"dir\": ");
  sb_json_string(&b, dir);
  mpg__strbuf_add(&b, ", \"mesh\": ");
  sb_json_string(&b, m->mesh);
  mpg__strbuf_add(&b,
                  ", \"step\": %" PRId64 ", \"world_size\": %" PRIu32 ", \"version\": %" PRIu32
                  ", \"block_bytes\": %" PRIu64 ", \"save_id\": \"%016" PRIx64 "\", \"files\": [",
                  m->step, m->world, m->version, m->block_bytes, m->save_id);
  for (uint32_t f = 0; f < m->nfiles; f++)
    mpg__strbuf_add(&b,
                    "%s{\"name\": \"data-%05" PRIu32 ".bin\", \"rank\": %" PRIu32
                    ", \"bytes\": %" PRIu64 "}",
                    f ? ", " : "", m->files[f].rank, m->files[f].rank, m->files[f].bytes);
  mpg__strbuf_add(&b, "], \"tensors\": [");
  for (uint32_t i = 0; i < m->ntensors; i++) {
    const mpg__ckpt_tensor *t = &m->tensors[i];
    mpg__strbuf_add(&b, "%s{\"name\": ", i ? ", " : "");
    sb_json_string(&b, t->name);
    mpg__strbuf_add(&b, ", \"dtype\": \"%s\", \"kind\": \"%s\", \"shape\": [",
                    mpg__ckpt_dtype_name(t->dtype), kind_name(t->kind));
    for (int a = 0; a < t->ndim; a++) mpg__strbuf_add(&b, "%s%" PRIu64, a ? ", " : "", t->shape[a]);
    mpg__strbuf_add(&b, "], \"chunks\": %" PRIu32 ", \"bytes\": %" PRIu64 "}", t->nchunks,
                    tensor_bytes(t));
  }
  mpg__strbuf_add(&b,
                  "], \"total\": {\"tensors\": %" PRIu32 ", \"chunks\": %" PRIu32
                  ", \"bytes\": %s, \"file_bytes\": %s, \"kinds\": {\"param\": %" PRIu32
                  ", \"state\": %" PRIu32 ", \"bytes\": %" PRIu32 "}}}\n",
                  m->ntensors, m->nchunks, sum_text(bytes, num, sizeof num),
                  sum_text(file_bytes, num2, sizeof num2), count[0], count[1], count[2]);
  int rc = TOOL_EXIT_OK;
  if (b.st) rc = ck_fail("out of memory");
  else fputs(b.s, stdout);
  free(b.s);
  return rc;
}

/* ------------------------------------------------------------------ */
/* export: one tensor assembled from its chunks                         */
/* ------------------------------------------------------------------ */

typedef struct assembly {
  const char *dir;
  mpg__ckpt_reader *r; /* the directory's snapshot: its data files */
  const mpg__ckpt_meta *m;
  const mpg__ckpt_tensor *t;
  size_t esize;
  uint64_t stride[MPG_CKPT_MAX_NDIM]; /* of the tensor, in elements */
  unsigned char *data;                /* the whole tensor */
  unsigned char *seen;                /* one bit per element */
} assembly;

/* The global element index of element e (row-major in chunk c's box), and
 * how many elements from it on stay contiguous (the rest of its row). */
static uint64_t box_to_global(const assembly *a, const mpg__ckpt_chunk *c, uint64_t e,
                              uint64_t *run) {
  int nd = a->t->ndim;
  uint64_t g = 0, rem = e, last = 0;
  for (int d = nd - 1; d >= 0; d--) {
    uint64_t coord = rem % c->box_shape[d];
    rem /= c->box_shape[d];
    if (d == nd - 1) last = coord;
    g += (c->box_off[d] + coord) * a->stride[d];
  }
  *run = c->box_shape[nd - 1] - last;
  return g;
}

/* Copy n bytes of chunk c's data, from its byte p on, into the tensor. */
static void scatter(assembly *a, const mpg__ckpt_chunk *c, uint64_t p, const unsigned char *src,
                    size_t n) {
  while (n > 0) {
    uint64_t run, in = p % a->esize;
    uint64_t g = box_to_global(a, c, c->range_off + p / a->esize, &run);
    uint64_t k = run * a->esize - in;
    if (k > n) k = n;
    memcpy(a->data + g * a->esize + in, src, (size_t)k);
    src += k;
    p += k;
    n -= (size_t)k;
  }
}

/* Mark the elements chunk c holds as covered. */
static void mark(assembly *a, const mpg__ckpt_chunk *c) {
  uint64_t e = c->range_off, end = c->range_off + c->range_count;
  while (e < end) {
    uint64_t run, g = box_to_global(a, c, e, &run);
    if (run > end - e) run = end - e;
    for (uint64_t i = g; i < g + run; i++) a->seen[i / 8] |= (unsigned char)(1u << (i % 8));
    e += run;
  }
}

/* Read exactly n bytes at off; 0, or the bytes read before the end / -1. */
static long long read_at(int fd, unsigned char *buf, size_t n, uint64_t off) {
  size_t got = 0;
  while (got < n) {
    ssize_t k = pread(fd, buf + got, n - got, (off_t)(off + got));
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) return -1;
    if (k == 0) return (long long)got;
    got += (size_t)k;
  }
  return 0;
}

/* Read chunk ci block by block, check each block's hash, scatter it. */
static int read_chunk(assembly *a, uint32_t ci, unsigned char *block) {
  const mpg__ckpt_meta *m = a->m;
  const mpg__ckpt_chunk *c = &m->chunks[ci];
  char path[4096];
  mpg__ckpt_data_path(a->dir, m->files[c->file].rank, path, sizeof path);
  int fd;
  mpg_status st = mpg__ckpt_reader_file(a->r, c->file, &fd); /* kept open by the reader */
  if (st != MPG_OK) return ck_fail("tensor %s: %s", a->t->name, tool_why(st));
  uint64_t bytes = c->range_count * a->esize, nb = mpg__ckpt_nblocks(bytes, m->block_bytes);
  for (uint64_t b = 0; b < nb; b++) {
    uint64_t at = b * m->block_bytes, off = c->file_off + at;
    size_t n = (size_t)(bytes - at < m->block_bytes ? bytes - at : m->block_bytes);
    long long r = read_at(fd, block, n, off);
    if (r != 0) {
      int e = errno;
      if (r < 0)
        return ck_fail("tensor %s: cannot read %s at byte offset %" PRIu64 ": %s", a->t->name,
                       path, off, strerror(e));
      return ck_fail("tensor %s: %s is truncated: %zu bytes at byte offset %" PRIu64
                     ", the file ends after %lld",
                     a->t->name, path, n, off, r);
    }
    uint64_t want = m->hashes[c->first_hash + b], got = mpg__xxh64(block, n, 0);
    if (want != got) {
      return ck_fail("tensor %s: checksum mismatch in %s at byte offset %" PRIu64
                     " (block %" PRIu64 " of chunk %" PRIu32 ", %zu bytes): stored %016" PRIx64
                     ", read %016" PRIx64,
                     a->t->name, path, off, b, ci, n, want, got);
    }
    scatter(a, c, at, block, n);
  }
  mark(a, c);
  return TOOL_EXIT_OK;
}

/* "[1, 3]": the coordinate of global element g. */
static void coord_text(const mpg__ckpt_tensor *t, uint64_t g, char *buf, size_t cap) {
  uint64_t coord[MPG_CKPT_MAX_NDIM];
  for (int d = t->ndim - 1; d >= 0; d--) {
    coord[d] = g % t->shape[d];
    g /= t->shape[d];
  }
  shape_text(coord, t->ndim, buf, cap);
}

/* Assemble tensor ti into a->data (allocated here) from its chunks. */
static int assemble(assembly *a, uint32_t ti) {
  const mpg__ckpt_meta *m = a->m;
  const mpg__ckpt_tensor *t = &m->tensors[ti];
  uint64_t elems = tensor_elems(t), bytes = tensor_bytes(t);
  a->t = t;
  a->esize = mpg__ckpt_dtype_size(t->dtype);
  a->stride[t->ndim - 1] = 1;
  for (int d = t->ndim - 2; d >= 0; d--) a->stride[d] = a->stride[d + 1] * t->shape[d + 1];
  uint64_t block_cap = 0;
  for (uint32_t c = t->first_chunk; c < t->first_chunk + t->nchunks; c++) {
    uint64_t cb = m->chunks[c].range_count * a->esize;
    uint64_t bb = cb < m->block_bytes ? cb : m->block_bytes;
    if (bb > block_cap) block_cap = bb;
  }
  if (bytes > SIZE_MAX / 2 || block_cap > SIZE_MAX / 2)
    return ck_fail("tensor %s: %" PRIu64 " bytes do not fit in memory", t->name, bytes);
  a->data = malloc((size_t)bytes);
  a->seen = calloc((size_t)(elems / 8 + 1), 1);
  unsigned char *block = malloc((size_t)block_cap + 1);
  int rc = TOOL_EXIT_OK;
  if (!a->data || !a->seen || !block)
    rc = ck_fail("tensor %s: out of memory for %" PRIu64 " bytes", t->name, bytes);
  for (uint32_t c = t->first_chunk; rc == TOOL_EXIT_OK && c < t->first_chunk + t->nchunks; c++)
    rc = read_chunk(a, c, block);
  free(block);
  for (uint64_t g = 0; rc == TOOL_EXIT_OK && g < elems; g++) {
    if (a->seen[g / 8] & (1u << (g % 8))) continue;
    uint64_t missing = 0;
    for (uint64_t h = g; h < elems; h++) missing += !(a->seen[h / 8] & (1u << (h % 8)));
    char where[MPG_CKPT_MAX_NDIM * 24 + 4];
    coord_text(t, g, where, sizeof where);
    rc = ck_fail("tensor %s: %" PRIu64 " of its %" PRIu64 " elements are in no chunk, the "
                 "first at %s (the checkpoint is incomplete)",
                 t->name, missing, elems, where);
  }
  free(a->seen);
  a->seen = NULL;
  return rc;
}

/* ------------------------------------------------------------------ */
/* export: the safetensors file                                         */
/* ------------------------------------------------------------------ */

static int selected(const mpg__ckpt_tensor *t, int all) {
  return all || t->kind == MPG_CKPT_PARAM;
}

/* The JSON header, padded with spaces to a multiple of 8 bytes. */
static int st_header(const mpg__ckpt_meta *m, int all, mpg__strbuf *b) {
  uint64_t off = 0;
  mpg__strbuf_add(b, "{\"__metadata__\":{\"format\":\"pt\",\"step\":\"%" PRId64 "\"}", m->step);
  for (uint32_t i = 0; i < m->ntensors; i++) {
    const mpg__ckpt_tensor *t = &m->tensors[i];
    if (!selected(t, all)) continue;
    mpg__strbuf_add(b, ",");
    sb_json_string(b, t->name);
    mpg__strbuf_add(b, ":{\"dtype\":\"%s\",\"shape\":[", mpg__ckpt_dtype_name(t->dtype));
    for (int a = 0; a < t->ndim; a++) mpg__strbuf_add(b, "%s%" PRIu64, a ? "," : "", t->shape[a]);
    mpg__strbuf_add(b, "],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}", off, off + tensor_bytes(t));
    off += tensor_bytes(t);
  }
  mpg__strbuf_add(b, "}");
  while (!b->st && b->len % 8) mpg__strbuf_add(b, " ");
  return b->st ? ck_fail("out of memory for the safetensors header") : TOOL_EXIT_OK;
}

static int st_write(FILE *f, const char *file, const void *p, size_t n) {
  if (n && fwrite(p, 1, n, f) != n) return ck_fail("cannot write %s: %s", file, strerror(errno));
  return TOOL_EXIT_OK;
}

static int export_tensors(const char *dir, mpg__ckpt_reader *r, int all, FILE *f,
                          const char *file, uint32_t *count, uint64_t *bytes) {
  const mpg__ckpt_meta *m = &r->m;
  mpg__strbuf hdr = MPG__STRBUF_INIT;
  int rc = st_header(m, all, &hdr);
  unsigned char len8[8];
  for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)hdr.len >> (8 * i));
  if (rc == TOOL_EXIT_OK) rc = st_write(f, file, len8, 8);
  if (rc == TOOL_EXIT_OK) rc = st_write(f, file, hdr.s, hdr.len);
  free(hdr.s);
  for (uint32_t i = 0; rc == TOOL_EXIT_OK && i < m->ntensors; i++) {
    if (!selected(&m->tensors[i], all)) continue;
    assembly a = {dir, r, m, NULL, 0, {0}, NULL, NULL};
    rc = assemble(&a, i);
    if (rc == TOOL_EXIT_OK) rc = st_write(f, file, a.data, (size_t)tensor_bytes(a.t));
    free(a.data);
    (*count)++;
    *bytes += tensor_bytes(&m->tensors[i]);
  }
  return rc;
}

/* The directory part of `file` ("." when none) into buf. */
static void parent_of(const char *file, char *buf, size_t cap) {
  const char *slash = strrchr(file, '/');
  if (!slash) snprintf(buf, cap, ".");
  else if (slash == file) snprintf(buf, cap, "/");
  else snprintf(buf, cap, "%.*s", (int)(slash - file), file);
}

/* Where FILE may be written: not a symbolic link, not something other
 * than a regular file, and not inside the checkpoint directory (its folder
 * is not DIR nor under it). */
static int export_target_ok(const char *dir, const char *file, const char *parent) {
  struct stat sb;
  if (lstat(file, &sb) == 0) {
    if (S_ISLNK(sb.st_mode))
      return ck_fail("%s is a symbolic link: export does not write through one (give the "
                     "path of the file itself)", file);
    if (!S_ISREG(sb.st_mode))
      return ck_fail("%s exists and is not a regular file", file);
  } else if (errno != ENOENT) {
    return ck_fail("%s: %s", file, strerror(errno));
  }
  char rdir[PATH_MAX], rpar[PATH_MAX];
  if (!realpath(parent, rpar)) return ck_fail("%s: %s", parent, strerror(errno));
  if (!realpath(dir, rdir)) return TOOL_EXIT_OK; /* no checkpoint: the reader says so */
  size_t n = strlen(rdir);
  struct stat sd, sp;
  int same = stat(rdir, &sd) == 0 && stat(rpar, &sp) == 0 && sd.st_dev == sp.st_dev &&
             sd.st_ino == sp.st_ino;
  if (same || (strncmp(rpar, rdir, n) == 0 && (rpar[n] == '/' || rpar[n] == '\0' ||
                                                 strcmp(rdir, "/") == 0)))
    return ck_fail("%s is inside the checkpoint %s: export writes no file there (give a "
                   "path outside it)", file, dir);
  return TOOL_EXIT_OK;
}

/* 1 when s is UTF-8 (no invalid, overlong or surrogate sequence). */
static int utf8_only(const char *s) {
  for (const unsigned char *p = (const unsigned char *)s; *p;) {
    unsigned c = *p;
    size_t k = c < 0x80 ? 0 : (c & 0xE0) == 0xC0 ? 1 : (c & 0xF0) == 0xE0 ? 2
             : (c & 0xF8) == 0xF0 ? 3 : 9;
    if (k == 9 || (k == 1 && c < 0xC2) || (k == 3 && c > 0xF4)) return 0;
    uint32_t cp = k == 0 ? c : c & (0x3Fu >> k);
    for (size_t j = 1; j <= k; j++) {
      if ((p[j] & 0xC0) != 0x80) return 0;
      cp = (cp << 6) | (p[j] & 0x3Fu);
    }
    if ((k == 2 && cp < 0x800) || (k == 3 && cp < 0x10000) || cp > 0x10FFFF ||
        (cp >= 0xD800 && cp <= 0xDFFF))
      return 0;
    p += k + 1;
  }
  return 1;
}

/* Every selected name can be a key of the safetensors header: UTF-8
 * (checkpoints written before mpg_ckpt_add refused other names may hold
 * one). */
static int names_carried(const mpg__ckpt_meta *m, int all) {
  for (uint32_t i = 0; i < m->ntensors; i++) {
    const mpg__ckpt_tensor *t = &m->tensors[i];
    if (!selected(t, all)) continue;
    mpg__strbuf b = MPG__STRBUF_INIT;
    sb_json_string(&b, t->name);
    int changed = b.st || b.len < 2 || !utf8_only(t->name);
    free(b.s);
    if (changed) {
      char esc[1200];
      text_escape(t->name, esc, sizeof esc);
      return ck_fail("tensor %s: a safetensors header cannot carry its name (it is not UTF-8)",
                     esc);
    }
  }
  return TOOL_EXIT_OK;
}

/* Make tmp (a fresh file beside `file`) and write the export into it,
 * starting again when a save replaces the checkpoint while it is read.
 * Returns the exit code; the message is printed. */
static int export_into(const char *dir, const char *tmp, int fd, int all, uint32_t *count,
                       uint64_t *bytes, int64_t *step) {
  int own = dup(fd); /* the stream's: fd stays open for mpg__file_out_commit */
  FILE *f = own < 0 ? NULL : fdopen(own, "wb");
  if (!f) {
    if (own >= 0) close(own);
    return ck_fail("cannot write %s: %s", tmp, strerror(errno));
  }
  int rc = TOOL_EXIT_FAIL;
  for (int tries = 1;; tries++) {
    mpg__ckpt_reader r;
    g_defer = 1;
    mpg_status st = mpg__ckpt_reader_open(&r, dir);
    if (st == MPG_OK) mpg__ckpt_reader_open_all(&r, MPG__CKPT_EAGER_FILES);
    *count = 0;
    *bytes = 0;
    if (st != MPG_OK) rc = ck_fail("%s", tool_why(st));
    if (st == MPG_OK) {
      uint32_t want = 0;
      for (uint32_t i = 0; i < r.m.ntensors; i++) want += (uint32_t)selected(&r.m.tensors[i], all);
      int meta = mpg__ckpt_meta_find(&r.m, "__metadata__");
      if (want == 0)
        rc = ck_fail("%s holds no %s to export%s", dir, all ? "tensor" : "param",
                     all ? "" : " (--all exports every tensor)");
      else if (meta >= 0 && selected(&r.m.tensors[meta], all))
        rc = ck_fail("%s holds a tensor named \"__metadata__\": a safetensors file cannot "
                     "carry it (the name is its header's metadata key)", dir);
      else if ((rc = names_carried(&r.m, all)) != TOOL_EXIT_OK)
        ;
      else
        rc = export_tensors(dir, &r, all, f, tmp, count, bytes);
      *step = r.m.step;
    }
    int moved = rc != TOOL_EXIT_OK && mpg__ckpt_reader_moved(&r);
    mpg__ckpt_reader_close(&r);
    g_defer = 0;
    if (rc == TOOL_EXIT_OK || !moved || tries == MPG__CKPT_READ_TRIES) {
      if (rc != TOOL_EXIT_OK)
        ck_fail("%s%s", g_msg, moved ? " (the checkpoint was replaced by a save at every try)"
                                    : "");
      break;
    }
    /* Start again on the new checkpoint, from an empty file. */
    if (fflush(f) != 0 || ftruncate(fd, 0) != 0 || fseek(f, 0, SEEK_SET) != 0) {
      rc = ck_fail("cannot write %s: %s", tmp, strerror(errno));
      break;
    }
  }
  if (rc == TOOL_EXIT_OK && fflush(f) != 0)
    rc = ck_fail("cannot write %s: %s", tmp, strerror(errno));
  if (fclose(f) != 0 && rc == TOOL_EXIT_OK)
    rc = ck_fail("cannot write %s: %s", tmp, strerror(errno));
  return rc;
}

/* Export into FILE: complete or absent.  The data goes to a fresh file
 * beside it (.NAME.PID.N.XXXXXXXX, never through a symbolic link), then
 * mpg__file_out_commit fsyncs it, renames it over FILE and fsyncs the
 * folder; an existing FILE stays as it was until then, and a failed export
 * removes only its own file.  The export is written by pieces (one tensor
 * at a time), not whole: the library's mpg__file_out, without
 * mpg__file_write_whole. */
static int export_file(const char *dir, const char *file, int all) {
  char parent[PATH_MAX];
  if (strlen(file) >= PATH_MAX - 16) return ck_fail("%s: the path is too long", file);
  const char *base = strrchr(file, '/') ? strrchr(file, '/') + 1 : file;
  if (!*base) return ck_fail("%s names a folder: give the file to write", file);
  parent_of(file, parent, sizeof parent);
  int rc = export_target_ok(dir, file, parent);
  if (rc != TOOL_EXIT_OK) return rc;
  mpg__file_out out;
  mpg_status st = mpg__file_out_open(&out, AT_FDCWD, file, file, NULL, 0666);
  if (st != MPG_OK) return ck_fail("%s", tool_why(st));
  char tmp[PATH_MAX + 320];
  snprintf(tmp, sizeof tmp, "%s/%s", parent, out.tmp);
  uint32_t count = 0;
  uint64_t bytes = 0;
  int64_t step = 0;
  rc = export_into(dir, tmp, out.fd, all, &count, &bytes, &step);
  if (rc != TOOL_EXIT_OK) {
    mpg__file_out_abandon(&out); /* only this export's file */
    return rc;
  }
  st = mpg__file_out_commit(&out);
  if (st != MPG_OK) rc = ck_fail("%s", tool_why(st));
  if (rc != TOOL_EXIT_OK) return rc;
  printf("wrote %s: %" PRIu32 " tensor%s, %" PRIu64 " bytes of data (step %" PRId64 ")\n",
         file, count, count == 1 ? "" : "s", bytes, step);
  return TOOL_EXIT_OK;
}

/* ------------------------------------------------------------------ */
/* Arguments                                                            */
/* ------------------------------------------------------------------ */

static int usage_error(const char *fmt, const char *arg) TOOL_PRINTF(1, 0);
static int usage_error(const char *fmt, const char *arg) {
  fputs("meshpg ckpt: ", stderr);
  fprintf(stderr, fmt, arg);
  fputc('\n', stderr);
  tool_usage_hint(ckpt_usage);
  return TOOL_EXIT_USAGE;
}

int cmd_ckpt(int argc, char **argv) {
  const char *sub = argc > 1 ? argv[1] : NULL, *dir = NULL, *file = NULL;
  int json = 0, all = 0;
  if (!sub) return usage_error("give a subcommand: info or export%s", "");
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      fputs(ckpt_usage, stdout);
      return TOOL_EXIT_OK;
    }
  }
  if (strcmp(sub, "info") != 0 && strcmp(sub, "export") != 0)
    return usage_error("unknown subcommand \"%s\" (info or export)", sub);
  int info = strcmp(sub, "info") == 0;
  for (int i = 2; i < argc; i++) {
    const char *a = argv[i];
    if (info && strcmp(a, "--json") == 0) {
      json = 1;
    } else if (!info && strcmp(a, "--all") == 0) {
      all = 1;
    } else if (!info && strcmp(a, "--safetensors") == 0) {
      if (i + 1 >= argc) return usage_error("%s needs a value", a);
      file = argv[++i];
    } else if (a[0] == '-' && a[1] != '\0') {
      return usage_error(info ? "unknown option \"%s\" of info"
                              : "unknown option \"%s\" of export", a);
    } else if (dir) {
      return usage_error("unexpected argument \"%s\" (one DIR)", a);
    } else {
      dir = a;
    }
  }
  if (!dir) return usage_error("give the checkpoint directory%s", "");
  if (!info && !file) return usage_error("export needs --safetensors FILE%s", "");
  if (!info) return export_file(dir, file, all);
  mpg__ckpt_meta m;
  mpg_status st = mpg__ckpt_meta_read(dir, &m);
  if (st != MPG_OK) {
    mpg__ckpt_meta_free(&m);
    return ck_fail("%s", tool_why(st));
  }
  int rc = json ? info_json(dir, &m) : (info_text(dir, &m), TOOL_EXIT_OK);
  mpg__ckpt_meta_free(&m);
  return rc;
}
