/* meshpg ckpt: inspect a checkpoint directory (info) and consolidate its
 * tensors into one safetensors file (export).  Reads the metadata with the
 * library's decoder (sync/ckpt_format.h) and the data files itself, one
 * tensor in memory at a time, checking every block's checksum. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

static const char *const kind_names[] = {"param", "state", "bytes"};

static const char *kind_name(int kind) {
  return kind >= 0 && kind <= MPG_CKPT_BYTES ? kind_names[kind] : "?";
}

/* "meshpg ckpt: <message>" on stderr; returns TOOL_EXIT_FAIL. */
static int ck_fail(const char *fmt, ...) TOOL_PRINTF(1, 2);
static int ck_fail(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("meshpg ckpt: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
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
/* A growing string (the JSON of info --json and the safetensors header) */
/* ------------------------------------------------------------------ */

typedef struct sbuf {
  char *s;
  size_t len, cap;
  int nomem;
} sbuf;

static void sb_add(sbuf *b, const char *fmt, ...) TOOL_PRINTF(2, 3);
static void sb_add(sbuf *b, const char *fmt, ...) {
  if (b->nomem) return;
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    size_t room = b->cap - b->len;
    int n = vsnprintf(b->s ? b->s + b->len : NULL, room, fmt, ap);
    va_end(ap);
    if (n < 0) {
      b->nomem = 1;
      return;
    }
    if ((size_t)n < room) {
      b->len += (size_t)n;
      return;
    }
    size_t cap = b->cap ? b->cap * 2 : 4096;
    while (cap - b->len <= (size_t)n) cap *= 2;
    char *s = realloc(b->s, cap);
    if (!s) {
      b->nomem = 1;
      return;
    }
    b->s = s;
    b->cap = cap;
  }
}

/* A JSON string: quotes, backslashes and control bytes escaped; other
 * bytes as they are (names and the mesh text are UTF-8). */
static void sb_json_string(sbuf *b, const char *s) {
  sb_add(b, "\"");
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    if (*p == '"' || *p == '\\') sb_add(b, "\\%c", *p);
    else if (*p < 0x20) sb_add(b, "\\u%04x", *p);
    else sb_add(b, "%c", *p);
  }
  sb_add(b, "\"");
}

/* ------------------------------------------------------------------ */
/* info                                                                 */
/* ------------------------------------------------------------------ */

static void info_totals(const mpg__ckpt_meta *m, uint64_t *bytes, uint64_t *file_bytes,
                        uint32_t count[3]) {
  *bytes = *file_bytes = 0;
  count[0] = count[1] = count[2] = 0;
  for (uint32_t i = 0; i < m->ntensors; i++) {
    *bytes += tensor_bytes(&m->tensors[i]);
    if (m->tensors[i].kind >= 0 && m->tensors[i].kind <= MPG_CKPT_BYTES)
      count[m->tensors[i].kind]++;
  }
  for (uint32_t f = 0; f < m->nfiles; f++) *file_bytes += m->files[f].bytes;
}

static void info_text(const char *dir, const mpg__ckpt_meta *m) {
  uint64_t bytes, file_bytes;
  uint32_t count[3];
  info_totals(m, &bytes, &file_bytes, count);
  printf("checkpoint  %s\n", dir);
  printf("mesh        %s\n", m->mesh);
  printf("step        %" PRId64 "\n", m->step);
  printf("world size  %" PRIu32 "\n", m->world);
  printf("format      version %" PRIu32 ", checksum blocks of %" PRIu64 " bytes, save id "
         "%016" PRIx64 "\n", m->version, m->block_bytes, m->save_id);
  printf("files       %" PRIu32 ", %" PRIu64 " bytes\n", m->nfiles, file_bytes);
  for (uint32_t f = 0; f < m->nfiles; f++)
    printf("  data-%05" PRIu32 ".bin  %" PRIu64 " bytes\n", m->files[f].rank,
           m->files[f].bytes);
  int wn = 4, ws = 5, wb = 5; /* widths of name, shape, bytes */
  char shape[MPG_CKPT_MAX_NDIM * 24 + 4];
  for (uint32_t i = 0; i < m->ntensors; i++) {
    int n = (int)strlen(m->tensors[i].name);
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
    shape_text(t->shape, t->ndim, shape, sizeof shape);
    printf("  %-*s  %-5s  %-5s  %-*s  %6" PRIu32 "  %*" PRIu64 "\n", wn, t->name,
           mpg__ckpt_dtype_name(t->dtype), kind_name(t->kind), ws, shape, t->nchunks, wb,
           tensor_bytes(t));
  }
  printf("total       %" PRIu32 " tensors (%" PRIu32 " param, %" PRIu32 " state, %" PRIu32
         " bytes), %" PRIu32 " chunks, %" PRIu64 " bytes\n",
         m->ntensors, count[0], count[1], count[2], m->nchunks, bytes);
}

static int info_json(const char *dir, const mpg__ckpt_meta *m) {
  uint64_t bytes, file_bytes;
  uint32_t count[3];
  info_totals(m, &bytes, &file_bytes, count);
  sbuf b = {0};
  sb_add(&b, "{\"dir\": ");
  sb_json_string(&b, dir);
  sb_add(&b, ", \"mesh\": ");
  sb_json_string(&b, m->mesh);
  sb_add(&b, ", \"step\": %" PRId64 ", \"world_size\": %" PRIu32 ", \"version\": %" PRIu32
         ", \"block_bytes\": %" PRIu64 ", \"save_id\": \"%016" PRIx64 "\", \"files\": [",
         m->step, m->world, m->version, m->block_bytes, m->save_id);
  for (uint32_t f = 0; f < m->nfiles; f++)
    sb_add(&b, "%s{\"name\": \"data-%05" PRIu32 ".bin\", \"rank\": %" PRIu32
           ", \"bytes\": %" PRIu64 "}", f ? ", " : "", m->files[f].rank, m->files[f].rank,
           m->files[f].bytes);
  sb_add(&b, "], \"tensors\": [");
  for (uint32_t i = 0; i < m->ntensors; i++) {
    const mpg__ckpt_tensor *t = &m->tensors[i];
    sb_add(&b, "%s{\"name\": ", i ? ", " : "");
    sb_json_string(&b, t->name);
    sb_add(&b, ", \"dtype\": \"%s\", \"kind\": \"%s\", \"shape\": [",
           mpg__ckpt_dtype_name(t->dtype), kind_name(t->kind));
    for (int a = 0; a < t->ndim; a++) sb_add(&b, "%s%" PRIu64, a ? ", " : "", t->shape[a]);
    sb_add(&b, "], \"chunks\": %" PRIu32 ", \"bytes\": %" PRIu64 "}", t->nchunks,
           tensor_bytes(t));
  }
  sb_add(&b, "], \"total\": {\"tensors\": %" PRIu32 ", \"chunks\": %" PRIu32
         ", \"bytes\": %" PRIu64 ", \"file_bytes\": %" PRIu64 ", \"kinds\": {\"param\": %"
         PRIu32 ", \"state\": %" PRIu32 ", \"bytes\": %" PRIu32 "}}}\n",
         m->ntensors, m->nchunks, bytes, file_bytes, count[0], count[1], count[2]);
  int rc = TOOL_EXIT_OK;
  if (b.nomem) rc = ck_fail("out of memory");
  else fputs(b.s, stdout);
  free(b.s);
  return rc;
}

/* ------------------------------------------------------------------ */
/* export: one tensor assembled from its chunks                         */
/* ------------------------------------------------------------------ */

typedef struct assembly {
  const char *dir;
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
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ck_fail("tensor %s: cannot open %s: %s", a->t->name, path, strerror(errno));
  uint64_t bytes = c->range_count * a->esize, nb = mpg__ckpt_nblocks(bytes, m->block_bytes);
  for (uint64_t b = 0; b < nb; b++) {
    uint64_t at = b * m->block_bytes, off = c->file_off + at;
    size_t n = (size_t)(bytes - at < m->block_bytes ? bytes - at : m->block_bytes);
    long long r = read_at(fd, block, n, off);
    if (r != 0) {
      int e = errno;
      close(fd);
      if (r < 0)
        return ck_fail("tensor %s: cannot read %s at byte offset %" PRIu64 ": %s", a->t->name,
                       path, off, strerror(e));
      return ck_fail("tensor %s: %s is truncated: %zu bytes at byte offset %" PRIu64
                     ", the file ends after %lld",
                     a->t->name, path, n, off, r);
    }
    uint64_t want = m->hashes[c->first_hash + b], got = mpg__xxh64(block, n, 0);
    if (want != got) {
      close(fd);
      return ck_fail("tensor %s: checksum mismatch in %s at byte offset %" PRIu64
                     " (block %" PRIu64 " of chunk %" PRIu32 ", %zu bytes): stored %016" PRIx64
                     ", read %016" PRIx64,
                     a->t->name, path, off, b, ci, n, want, got);
    }
    scatter(a, c, at, block, n);
  }
  close(fd);
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
static int st_header(const mpg__ckpt_meta *m, int all, sbuf *b) {
  uint64_t off = 0;
  sb_add(b, "{\"__metadata__\":{\"format\":\"pt\",\"step\":\"%" PRId64 "\"}", m->step);
  for (uint32_t i = 0; i < m->ntensors; i++) {
    const mpg__ckpt_tensor *t = &m->tensors[i];
    if (!selected(t, all)) continue;
    sb_add(b, ",");
    sb_json_string(b, t->name);
    sb_add(b, ":{\"dtype\":\"%s\",\"shape\":[", mpg__ckpt_dtype_name(t->dtype));
    for (int a = 0; a < t->ndim; a++) sb_add(b, "%s%" PRIu64, a ? "," : "", t->shape[a]);
    sb_add(b, "],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}", off, off + tensor_bytes(t));
    off += tensor_bytes(t);
  }
  sb_add(b, "}");
  while (!b->nomem && b->len % 8) sb_add(b, " ");
  return b->nomem ? ck_fail("out of memory for the safetensors header") : TOOL_EXIT_OK;
}

static int st_write(FILE *f, const char *file, const void *p, size_t n) {
  if (n && fwrite(p, 1, n, f) != n) return ck_fail("cannot write %s: %s", file, strerror(errno));
  return TOOL_EXIT_OK;
}

static int export_tensors(const char *dir, const mpg__ckpt_meta *m, int all, FILE *f,
                          const char *file, uint32_t *count, uint64_t *bytes) {
  sbuf hdr = {0};
  int rc = st_header(m, all, &hdr);
  unsigned char len8[8];
  for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)hdr.len >> (8 * i));
  if (rc == TOOL_EXIT_OK) rc = st_write(f, file, len8, 8);
  if (rc == TOOL_EXIT_OK) rc = st_write(f, file, hdr.s, hdr.len);
  free(hdr.s);
  for (uint32_t i = 0; rc == TOOL_EXIT_OK && i < m->ntensors; i++) {
    if (!selected(&m->tensors[i], all)) continue;
    assembly a = {dir, m, NULL, 0, {0}, NULL, NULL};
    rc = assemble(&a, i);
    if (rc == TOOL_EXIT_OK) rc = st_write(f, file, a.data, (size_t)tensor_bytes(a.t));
    free(a.data);
    (*count)++;
    *bytes += tensor_bytes(&m->tensors[i]);
  }
  return rc;
}

static int export_file(const char *dir, const mpg__ckpt_meta *m, const char *file, int all) {
  uint32_t want = 0;
  for (uint32_t i = 0; i < m->ntensors; i++) want += (uint32_t)selected(&m->tensors[i], all);
  if (want == 0)
    return ck_fail("%s holds no %s to export%s", dir, all ? "tensor" : "param",
                   all ? "" : " (--all exports every tensor)");
  FILE *f = fopen(file, "wb");
  if (!f) return ck_fail("cannot create %s: %s", file, strerror(errno));
  uint32_t count = 0;
  uint64_t bytes = 0;
  int rc = export_tensors(dir, m, all, f, file, &count, &bytes);
  if (fclose(f) != 0 && rc == TOOL_EXIT_OK)
    rc = ck_fail("cannot write %s: %s", file, strerror(errno));
  if (rc != TOOL_EXIT_OK) {
    remove(file); /* no partial file */
    return rc;
  }
  printf("wrote %s: %" PRIu32 " tensor%s, %" PRIu64 " bytes of data (step %" PRId64 ")\n",
         file, count, count == 1 ? "" : "s", bytes, m->step);
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
  mpg__ckpt_meta m;
  mpg_status st = mpg__ckpt_meta_read(dir, &m);
  if (st != MPG_OK) {
    mpg__ckpt_meta_free(&m);
    return ck_fail("%s", tool_why(st));
  }
  int rc = info ? (json ? info_json(dir, &m) : (info_text(dir, &m), TOOL_EXIT_OK))
                : export_file(dir, &m, file, all);
  mpg__ckpt_meta_free(&m);
  return rc;
}
