/* The checkpoint metadata format (ckpt_format.h): XXH64, the encoder and
 * the strict decoder.  Every integer is (de)serialized byte by byte,
 * little-endian; the decoder reads only through a bounded cursor and
 * checks every count against the bytes left before allocating. */
#include "ckpt_format.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Fixed header: magic 8, version 4, flags 4, length 8, save_id 8, step 8,
 * world 4, nfiles 4, ntensors 4, nchunks 4, nhashes 8, block_bytes 8,
 * mesh length 4. */
enum { HEADER_BYTES = 76, TRAILER_BYTES = 8 };
/* Smallest encodings, used to bound counts before allocating. */
enum { FILE_BYTES = 12, TENSOR_MIN = 2 + 1 + 3 + 8 + 8, CHUNK_MIN = 8 + 16 + 32 };

/* ------------------------------------------------------------------ */
/* dtypes, small helpers                                                */
/* ------------------------------------------------------------------ */

size_t mpg__ckpt_dtype_size(int dtype) {
  static const size_t sizes[MPG__CKPT_DT_COUNT] = {4, 8, 2, 2, 4, 8, 1};
  return dtype >= 0 && dtype < MPG__CKPT_DT_COUNT ? sizes[dtype] : 0;
}

const char *mpg__ckpt_dtype_name(int dtype) {
  static const char *const names[MPG__CKPT_DT_COUNT] = {"F32", "F64", "F16", "BF16",
                                                        "I32", "I64", "U8"};
  return dtype >= 0 && dtype < MPG__CKPT_DT_COUNT ? names[dtype] : "?";
}

const char *mpg__ckpt_kind_name(int kind) {
  static const char *const names[] = {"param", "state", "bytes"};
  return kind >= 0 && kind <= MPG_CKPT_BYTES ? names[kind] : "?";
}

uint64_t mpg__ckpt_nblocks(uint64_t bytes, uint64_t block_bytes) {
  if (block_bytes == 0) return 0;
  return bytes / block_bytes + (bytes % block_bytes != 0);
}

uint64_t mpg__ckpt_box_elems(const uint64_t *box_shape, int ndim) {
  uint64_t n = 1;
  for (int i = 0; i < ndim; i++) {
    if (box_shape[i] != 0 && n > UINT64_MAX / box_shape[i]) return UINT64_MAX;
    n *= box_shape[i];
  }
  return n;
}

void mpg__ckpt_data_path(const char *dir, uint32_t rank, char *buf, size_t cap) {
  if (!buf || cap == 0) return;
  snprintf(buf, cap, "%s/data-%05u.bin", dir ? dir : ".", (unsigned)rank);
}

int mpg__ckpt_meta_find(const mpg__ckpt_meta *m, const char *name) {
  if (!m || !name || !m->tensors) return -1;
  size_t lo = 0, hi = m->ntensors;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    int c = strcmp(m->tensors[mid].name ? m->tensors[mid].name : "", name);
    if (c == 0) return (int)mid;
    if (c < 0) lo = mid + 1;
    else hi = mid;
  }
  return -1;
}

void mpg__ckpt_meta_free(mpg__ckpt_meta *m) {
  if (!m) return;
  if (m->tensors)
    for (uint32_t i = 0; i < m->ntensors; i++) free(m->tensors[i].name);
  free(m->tensors);
  free(m->files);
  free(m->chunks);
  free(m->hashes);
  free(m->mesh);
  memset(m, 0, sizeof *m);
}

/* ------------------------------------------------------------------ */
/* XXH64 (the published algorithm, github.com/Cyan4973/xxHash)          */
/* ------------------------------------------------------------------ */

#define P1 0x9E3779B185EBCA87ull
#define P2 0xC2B2AE3D27D4EB4Full
#define P3 0x165667B19E3779F9ull
#define P4 0x85EBCA77C2B2AE63ull
#define P5 0x27D4EB2F165667C5ull

static uint64_t rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

static uint64_t le_get(const unsigned char *p, int k) {
  uint64_t v = 0;
  for (int i = k - 1; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}

/* The hot loop's loads: one unaligned 8-byte load (memcpy), swapped on a
 * big-endian host, instead of le_get's byte loop (5x slower here). */
static inline uint64_t le64(const unsigned char *p) {
  uint64_t v;
  memcpy(&v, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  v = __builtin_bswap64(v);
#endif
  return v;
}

static uint64_t xxh_round(uint64_t acc, uint64_t input) {
  acc += input * P2;
  acc = rotl64(acc, 31);
  return acc * P1;
}

static uint64_t xxh_merge(uint64_t acc, uint64_t val) {
  acc ^= xxh_round(0, val);
  return acc * P1 + P4;
}

uint64_t mpg__xxh64(const void *data, size_t n, uint64_t seed) {
  static const unsigned char none[1];
  const unsigned char *p = data && n ? (const unsigned char *)data : none;
  const unsigned char *end = p + (data ? n : 0);
  if (!data) n = 0;
  uint64_t h;
  if (n >= 32) {
    uint64_t v1 = seed + P1 + P2, v2 = seed + P2, v3 = seed, v4 = seed - P1;
    const unsigned char *limit = end - 32;
    do {
      v1 = xxh_round(v1, le64(p));
      v2 = xxh_round(v2, le64(p + 8));
      v3 = xxh_round(v3, le64(p + 16));
      v4 = xxh_round(v4, le64(p + 24));
      p += 32;
    } while (p <= limit);
    h = rotl64(v1, 1) + rotl64(v2, 7) + rotl64(v3, 12) + rotl64(v4, 18);
    h = xxh_merge(h, v1);
    h = xxh_merge(h, v2);
    h = xxh_merge(h, v3);
    h = xxh_merge(h, v4);
  } else {
    h = seed + P5;
  }
  h += (uint64_t)n;
  for (; end - p >= 8; p += 8) h = rotl64(h ^ xxh_round(0, le64(p)), 27) * P1 + P4;
  if (end - p >= 4) {
    h = rotl64(h ^ (le_get(p, 4) * P1), 23) * P2 + P3;
    p += 4;
  }
  for (; p < end; p++) h = rotl64(h ^ (*p * P5), 11) * P1;
  h ^= h >> 33;
  h *= P2;
  h ^= h >> 29;
  h *= P3;
  h ^= h >> 32;
  return h;
}

/* ------------------------------------------------------------------ */
/* Decoder: a bounded cursor                                            */
/* ------------------------------------------------------------------ */

typedef struct rd {
  const unsigned char *b;
  size_t n;   /* bytes before the trailer */
  size_t pos; /* next byte */
  const char *path;
  char ctx[320]; /* "tensor 3 (h1.w)", "chunk 5 of tensor h1.w" or "" */
} rd;

/* "path: ctx: <message> (byte offset off)". */
static mpg_status bad(const rd *r, size_t off, const char *fmt, ...) MPG__PRINTF(3, 4);
static mpg_status bad(const rd *r, size_t off, const char *fmt, ...) {
  char msg[700];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return mpg__fail(MPG_ERR_INVALID, "%s: %s%s%s (byte offset %zu)", r->path, r->ctx,
                   r->ctx[0] ? ": " : "", msg, off);
}

/* Read a k-byte little-endian field named `field`. */
static mpg_status get(rd *r, int k, uint64_t *v, const char *field) {
  if (r->n - r->pos < (size_t)k)
    return bad(r, r->pos, "%s truncated: %d bytes needed, %zu left before the trailer", field,
               k, r->n - r->pos);
  *v = le_get(r->b + r->pos, k);
  r->pos += (size_t)k;
  return MPG_OK;
}

#define GET(r, k, v, field)                          \
  do {                                               \
    mpg_status st_ = get((r), (k), (v), (field));    \
    if (st_ != MPG_OK) return st_;                   \
  } while (0)

/* Magic, version, flags and length of a file of `size` bytes whose first
 * `have` bytes are b (have >= min(size, HEADER_BYTES)). */
static mpg_status dec_prefix(const unsigned char *b, size_t have, uint64_t size,
                             const char *path, uint32_t *version_out) {
  if (have < 8 || memcmp(b, MPG__CKPT_MAGIC, 8) != 0)
    return mpg__fail(MPG_ERR_INVALID,
                     "%s: not a meshpg checkpoint metadata file (%s at byte offset 0)", path,
                     have < 8 ? "shorter than the 8-byte magic" : "no \"MPGCKPT\\n\" magic");
  if (have < 12)
    return mpg__fail(MPG_ERR_INVALID, "%s: truncated: %zu bytes, the version field ends at 12",
                     path, have);
  uint64_t version = le_get(b + 8, 4);
  if (version > MPG__CKPT_VERSION)
    return mpg__fail(MPG_ERR_UNSUPPORTED,
                     "%s: format version %llu is newer than this library's (%u) (byte offset 8)",
                     path, (unsigned long long)version, MPG__CKPT_VERSION);
  if (version == 0)
    return mpg__fail(MPG_ERR_INVALID, "%s: format version 0 is not a version (byte offset 8)",
                     path);
  *version_out = (uint32_t)version;
  if (size < HEADER_BYTES + TRAILER_BYTES)
    return mpg__fail(MPG_ERR_INVALID,
                     "%s: truncated: %llu bytes, shorter than the %d-byte header and trailer",
                     path, (unsigned long long)size, HEADER_BYTES + TRAILER_BYTES);
  uint64_t flags = le_get(b + 12, 4), length = le_get(b + 16, 8);
  if (flags != 0)
    return mpg__fail(MPG_ERR_INVALID, "%s: flags 0x%llx, not 0 (byte offset 12)", path,
                     (unsigned long long)flags);
  if (length != size)
    return mpg__fail(MPG_ERR_INVALID,
                     "%s: length field %llu (byte offset 16) but the file has %llu bytes%s",
                     path, (unsigned long long)length, (unsigned long long)size,
                     length > size ? " (truncated)" : "");
  return MPG_OK;
}

/* Magic, version, flags, length and trailer: what must hold before any
 * other field is trusted. */
static mpg_status dec_envelope(const unsigned char *buf, size_t len, const char *path,
                               mpg__ckpt_meta *m) {
  mpg_status st = dec_prefix(buf, len, len, path, &m->version);
  if (st != MPG_OK) return st;
  uint64_t want = le_get(buf + len - TRAILER_BYTES, 8);
  uint64_t got = mpg__xxh64(buf, len - TRAILER_BYTES, 0);
  if (want != got)
    return mpg__fail(MPG_ERR_INVALID,
                     "%s: checksum mismatch: the trailer at byte offset %zu holds 0x%016llx, "
                     "the bytes before it hash to 0x%016llx (corrupted)",
                     path, len - TRAILER_BYTES, (unsigned long long)want,
                     (unsigned long long)got);
  return MPG_OK;
}

/* Valid UTF-8 without NUL: 0 when fine, else the offset of the bad byte + 1. */
static size_t utf8_bad(const unsigned char *s, size_t n) {
  size_t i = 0;
  while (i < n) {
    unsigned c = s[i];
    size_t k = c < 0x80 ? 0 : (c & 0xE0) == 0xC0 ? 1 : (c & 0xF0) == 0xE0 ? 2
             : (c & 0xF8) == 0xF0 ? 3 : 4;
    if (c == 0 || k == 4 || (k == 1 && c < 0xC2) || (k == 3 && c > 0xF4) || n - i <= k)
      return i + 1;
    uint32_t cp = k == 0 ? c : c & (0x3Fu >> k);
    for (size_t j = 1; j <= k; j++) {
      if ((s[i + j] & 0xC0) != 0x80) return i + 1;
      cp = (cp << 6) | (s[i + j] & 0x3Fu);
    }
    if ((k == 2 && cp < 0x800) || (k == 3 && cp < 0x10000) || cp > 0x10FFFF ||
        (cp >= 0xD800 && cp <= 0xDFFF))
      return i + 1;
    i += k + 1;
  }
  return 0;
}

const char *mpg__ckpt_name_rule(const char *name) {
  const unsigned char *s = (const unsigned char *)name;
  size_t n = strlen(name);
  if (utf8_bad(s, n)) return "a name is UTF-8 (this one holds an invalid byte sequence)";
  for (size_t i = 0; i < n; i++) {
    if (s[i] < 0x20 || s[i] == 0x7F)
      return "a name holds no control character (U+0000..U+001F, U+007F)";
    if (s[i] == 0xC2 && i + 1 < n && s[i + 1] >= 0x80 && s[i + 1] <= 0x9F)
      return "a name holds no control character (U+0080..U+009F)";
  }
  if (strcmp(name, "__metadata__") == 0)
    return "\"__metadata__\" is reserved (the key of a safetensors header's metadata)";
  return NULL;
}

/* The header's fields after the envelope, the mesh text, and the bound of
 * every count by the bytes left. */
static mpg_status dec_header(rd *r, mpg__ckpt_meta *m) {
  uint64_t v = 0, meshlen = 0;
  r->pos = 24;
  GET(r, 8, &m->save_id, "save_id");
  GET(r, 8, &v, "step");
  m->step = (int64_t)v;
  size_t at = r->pos;
  GET(r, 4, &v, "world size");
  if (v == 0) return bad(r, at, "world size 0");
  m->world = (uint32_t)v;
  GET(r, 4, &v, "nfiles");
  m->nfiles = (uint32_t)v;
  GET(r, 4, &v, "ntensors");
  m->ntensors = (uint32_t)v;
  GET(r, 4, &v, "nchunks");
  m->nchunks = (uint32_t)v;
  GET(r, 8, &m->nhashes, "nhashes");
  at = r->pos;
  GET(r, 8, &m->block_bytes, "block_bytes");
  if (m->block_bytes == 0) return bad(r, at, "block_bytes 0");
  at = r->pos;
  GET(r, 4, &meshlen, "mesh text length");
  if (meshlen > r->n - r->pos)
    return bad(r, at, "mesh text length %llu exceeds the %zu bytes left",
               (unsigned long long)meshlen, r->n - r->pos);
  size_t ubad = utf8_bad(r->b + r->pos, (size_t)meshlen);
  if (ubad) return bad(r, r->pos + ubad - 1, "mesh text is not UTF-8 without NUL");
  m->mesh = malloc((size_t)meshlen + 1);
  if (!m->mesh) return mpg__fail(MPG_ERR_NOMEM, "%s: out of memory", r->path);
  memcpy(m->mesh, r->b + r->pos, (size_t)meshlen);
  m->mesh[meshlen] = '\0';
  r->pos += (size_t)meshlen;
  /* Each term is below 2^38 but nhashes, which is bounded first. */
  size_t left = r->n - r->pos;
  uint64_t need = (uint64_t)m->nfiles * FILE_BYTES + (uint64_t)m->ntensors * TENSOR_MIN +
                  (uint64_t)m->nchunks * CHUNK_MIN;
  if (m->nhashes > left / 8 || need > left - m->nhashes * 8)
    return bad(r, r->pos,
               "the counts do not fit the file: %u files, %u tensors, %u chunks and %llu "
               "hashes need more than the %zu bytes left",
               m->nfiles, m->ntensors, m->nchunks, (unsigned long long)m->nhashes, left);
  return MPG_OK;
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

static mpg_status dec_files(rd *r, mpg__ckpt_meta *m) {
  size_t start = r->pos;
  uint64_t v = 0;
  if (m->nfiles == 0) return MPG_OK;
  m->files = calloc(m->nfiles, sizeof *m->files);
  uint64_t *keys = malloc((size_t)m->nfiles * sizeof *keys);
  if (!m->files || !keys) {
    free(keys);
    return mpg__fail(MPG_ERR_NOMEM, "%s: out of memory for %u files", r->path, m->nfiles);
  }
  for (uint32_t i = 0; i < m->nfiles; i++) {
    snprintf(r->ctx, sizeof r->ctx, "file %u", i);
    size_t at = r->pos;
    mpg_status st = get(r, 4, &v, "rank");
    if (st == MPG_OK && v >= m->world)
      st = bad(r, at, "rank %llu is not below the world size %u", (unsigned long long)v,
               m->world);
    m->files[i].rank = (uint32_t)v;
    if (st == MPG_OK) st = get(r, 8, &m->files[i].bytes, "bytes");
    if (st != MPG_OK) {
      free(keys);
      return st;
    }
    keys[i] = (uint64_t)m->files[i].rank << 32 | i;
  }
  qsort(keys, m->nfiles, sizeof *keys, cmp_u64);
  for (uint32_t i = 1; i < m->nfiles; i++) {
    if (keys[i] >> 32 != keys[i - 1] >> 32) continue;
    uint32_t a = (uint32_t)keys[i - 1], b = (uint32_t)keys[i];
    snprintf(r->ctx, sizeof r->ctx, "file %u", b);
    free(keys);
    return bad(r, start + (size_t)b * FILE_BYTES, "rank %u already has file %u",
               m->files[b].rank, a);
  }
  free(keys);
  r->ctx[0] = '\0';
  return MPG_OK;
}

/* One tensor's name; `prev` is the previous tensor's (NULL for the first). */
static mpg_status dec_name(rd *r, mpg__ckpt_tensor *t, const char *prev) {
  uint64_t len = 0;
  size_t at = r->pos;
  GET(r, 2, &len, "name length");
  if (len == 0 || len > MPG__CKPT_NAME_MAX)
    return bad(r, at, "name length %llu is not in 1..%d", (unsigned long long)len,
               MPG__CKPT_NAME_MAX);
  if (len > r->n - r->pos)
    return bad(r, r->pos, "name truncated: %llu bytes needed, %zu left before the trailer",
               (unsigned long long)len, r->n - r->pos);
  if (memchr(r->b + r->pos, 0, (size_t)len))
    return bad(r, r->pos, "the name holds a NUL byte");
  t->name = malloc((size_t)len + 1);
  if (!t->name) return mpg__fail(MPG_ERR_NOMEM, "%s: out of memory", r->path);
  memcpy(t->name, r->b + r->pos, (size_t)len);
  t->name[len] = '\0';
  size_t n = strlen(r->ctx);
  snprintf(r->ctx + n, sizeof r->ctx - n, " (%s)", t->name);
  int c = prev ? strcmp(prev, t->name) : -1;
  if (c == 0) return bad(r, r->pos, "duplicate name (the previous tensor's)");
  if (c > 0)
    return bad(r, r->pos, "name not after the previous tensor's (%s) in bytewise order", prev);
  r->pos += (size_t)len;
  return MPG_OK;
}

static mpg_status dec_tensor(rd *r, const mpg__ckpt_meta *m, uint32_t i, uint64_t *next_chunk) {
  mpg__ckpt_tensor *t = &m->tensors[i];
  uint64_t v = 0;
  snprintf(r->ctx, sizeof r->ctx, "tensor %u", i);
  mpg_status st = dec_name(r, t, i ? m->tensors[i - 1].name : NULL);
  if (st != MPG_OK) return st;
  size_t at = r->pos;
  GET(r, 1, &v, "dtype");
  t->dtype = (int)v;
  if (v >= MPG__CKPT_DT_COUNT) return bad(r, at, "dtype %llu is unknown", (unsigned long long)v);
  GET(r, 1, &v, "kind");
  t->kind = (int)v;
  if (v > MPG_CKPT_BYTES) return bad(r, at + 1, "kind %llu is unknown", (unsigned long long)v);
  GET(r, 1, &v, "ndim");
  t->ndim = (int)v;
  if (v < 1 || v > MPG_CKPT_MAX_NDIM)
    return bad(r, at + 2, "ndim %llu is not in 1..%d", (unsigned long long)v, MPG_CKPT_MAX_NDIM);
  uint64_t bytes = mpg__ckpt_dtype_size(t->dtype);
  for (int a = 0; a < t->ndim; a++) {
    at = r->pos;
    GET(r, 8, &t->shape[a], "shape");
    if (t->shape[a] == 0) return bad(r, at, "extent 0 on axis %d", a);
    if (bytes > UINT64_MAX / t->shape[a])
      return bad(r, at, "the tensor's byte size overflows 64 bits on axis %d", a);
    bytes *= t->shape[a];
  }
  at = r->pos;
  GET(r, 4, &v, "first chunk");
  t->first_chunk = (uint32_t)v;
  if (v != *next_chunk)
    return bad(r, at, "first chunk %llu, expected %llu (the chunks before it)",
               (unsigned long long)v, (unsigned long long)*next_chunk);
  GET(r, 4, &v, "chunk count");
  t->nchunks = (uint32_t)v;
  if (v > m->nchunks - *next_chunk)
    return bad(r, at + 4, "chunk count %llu exceeds the %llu chunks left of %u",
               (unsigned long long)v, (unsigned long long)(m->nchunks - *next_chunk),
               m->nchunks);
  *next_chunk += v;
  return MPG_OK;
}

static mpg_status dec_tensors(rd *r, mpg__ckpt_meta *m) {
  uint64_t next = 0;
  if (m->ntensors) {
    m->tensors = calloc(m->ntensors, sizeof *m->tensors);
    if (!m->tensors)
      return mpg__fail(MPG_ERR_NOMEM, "%s: out of memory for %u tensors", r->path, m->ntensors);
  }
  for (uint32_t i = 0; i < m->ntensors; i++) {
    mpg_status st = dec_tensor(r, m, i, &next);
    if (st != MPG_OK) return st;
  }
  r->ctx[0] = '\0';
  if (next != m->nchunks)
    return bad(r, r->pos, "the tensors' chunk ranges cover %llu of the %u chunks",
               (unsigned long long)next, m->nchunks);
  return MPG_OK;
}

/* A chunk's box, range and bytes in its file (its tensor is t). */
static mpg_status dec_box(rd *r, const mpg__ckpt_meta *m, const mpg__ckpt_tensor *t,
                          mpg__ckpt_chunk *c) {
  size_t at = r->pos;
  for (int a = 0; a < t->ndim; a++) GET(r, 8, &c->box_off[a], "box offset");
  for (int a = 0; a < t->ndim; a++) {
    size_t off_at = at + 8 * (size_t)a, sh_at = r->pos;
    GET(r, 8, &c->box_shape[a], "box shape");
    if (c->box_shape[a] == 0) return bad(r, sh_at, "box extent 0 on axis %d", a);
    if (c->box_off[a] > t->shape[a] || c->box_shape[a] > t->shape[a] - c->box_off[a])
      return bad(r, off_at, "box exceeds the shape on axis %d (offset %llu + %llu > %llu)", a,
                 (unsigned long long)c->box_off[a], (unsigned long long)c->box_shape[a],
                 (unsigned long long)t->shape[a]);
  }
  uint64_t elems = mpg__ckpt_box_elems(c->box_shape, t->ndim);
  at = r->pos;
  GET(r, 8, &c->range_off, "range offset");
  GET(r, 8, &c->range_count, "range count");
  if (c->range_count == 0) return bad(r, at + 8, "range count 0");
  if (c->range_off > elems || c->range_count > elems - c->range_off)
    return bad(r, at, "range exceeds the box (offset %llu + count %llu > %llu elements)",
               (unsigned long long)c->range_off, (unsigned long long)c->range_count,
               (unsigned long long)elems);
  uint64_t bytes = c->range_count * mpg__ckpt_dtype_size(t->dtype); /* <= the tensor's */
  uint64_t fbytes = m->files[c->file].bytes;
  at = r->pos;
  GET(r, 8, &c->file_off, "file offset");
  if (c->file_off > fbytes || bytes > fbytes - c->file_off)
    return bad(r, at,
               "bytes [%llu, +%llu) exceed file %u (data-%05u.bin) of %llu bytes",
               (unsigned long long)c->file_off, (unsigned long long)bytes, c->file,
               m->files[c->file].rank, (unsigned long long)fbytes);
  return MPG_OK;
}

static mpg_status dec_chunk(rd *r, const mpg__ckpt_meta *m, uint32_t ci, uint32_t ti,
                            uint64_t *next_hash) {
  const mpg__ckpt_tensor *t = &m->tensors[ti];
  mpg__ckpt_chunk *c = &m->chunks[ci];
  uint64_t v = 0;
  snprintf(r->ctx, sizeof r->ctx, "chunk %u of tensor %s", ci, t->name);
  size_t at = r->pos;
  GET(r, 4, &v, "tensor");
  c->tensor = (uint32_t)v;
  if (v != ti)
    return bad(r, at, "tensor index %llu, but the tensors' chunk ranges give %u",
               (unsigned long long)v, ti);
  GET(r, 4, &v, "file");
  c->file = (uint32_t)v;
  if (v >= m->nfiles)
    return bad(r, at + 4, "file %llu is not below nfiles %u", (unsigned long long)v, m->nfiles);
  mpg_status st = dec_box(r, m, t, c);
  if (st != MPG_OK) return st;
  at = r->pos;
  GET(r, 8, &c->first_hash, "first hash");
  uint64_t nb = mpg__ckpt_nblocks(c->range_count * mpg__ckpt_dtype_size(t->dtype),
                                  m->block_bytes);
  if (c->first_hash != *next_hash)
    return bad(r, at, "first hash %llu, expected %llu (the blocks before it)",
               (unsigned long long)c->first_hash, (unsigned long long)*next_hash);
  if (nb > m->nhashes - *next_hash)
    return bad(r, at, "its %llu blocks exceed the %llu hashes left of %llu",
               (unsigned long long)nb, (unsigned long long)(m->nhashes - *next_hash),
               (unsigned long long)m->nhashes);
  *next_hash += nb;
  return MPG_OK;
}

static mpg_status dec_chunks(rd *r, mpg__ckpt_meta *m) {
  uint64_t next_hash = 0;
  if (m->nchunks) {
    m->chunks = calloc(m->nchunks, sizeof *m->chunks);
    if (!m->chunks)
      return mpg__fail(MPG_ERR_NOMEM, "%s: out of memory for %u chunks", r->path, m->nchunks);
  }
  uint32_t ti = 0;
  for (uint32_t ci = 0; ci < m->nchunks; ci++) {
    /* The partition holds (dec_tensors), so some tensor owns chunk ci. */
    while (ci >= m->tensors[ti].first_chunk + (uint64_t)m->tensors[ti].nchunks) ti++;
    mpg_status st = dec_chunk(r, m, ci, ti, &next_hash);
    if (st != MPG_OK) return st;
  }
  r->ctx[0] = '\0';
  if (next_hash != m->nhashes)
    return bad(r, r->pos, "the chunks' blocks use %llu of the %llu hashes",
               (unsigned long long)next_hash, (unsigned long long)m->nhashes);
  if (m->nhashes) {
    m->hashes = malloc((size_t)m->nhashes * sizeof *m->hashes);
    if (!m->hashes) return mpg__fail(MPG_ERR_NOMEM, "%s: out of memory for the hashes", r->path);
  }
  for (uint64_t h = 0; h < m->nhashes; h++) GET(r, 8, &m->hashes[h], "hash");
  if (r->pos != r->n)
    return bad(r, r->pos, "%zu unexpected bytes between the hashes and the trailer",
               r->n - r->pos);
  return MPG_OK;
}

mpg_status mpg__ckpt_meta_decode(const unsigned char *buf, size_t len, const char *path,
                                 mpg__ckpt_meta *m) {
  if (!m) return mpg__fail(MPG_ERR_INVALID, "mpg__ckpt_meta_decode: NULL meta");
  memset(m, 0, sizeof *m);
  if (!path) path = "<checkpoint metadata>";
  if (!buf && len) return mpg__fail(MPG_ERR_INVALID, "%s: NULL buffer", path);
  mpg_status st = dec_envelope(buf, len, path, m);
  if (st != MPG_OK) return st;
  rd r = {buf, len - TRAILER_BYTES, 0, path, ""};
  st = dec_header(&r, m);
  /* Until the arrays exist, the counts must not describe them. */
  uint32_t nf = m->nfiles, nt = m->ntensors, nc = m->nchunks;
  uint64_t nh = m->nhashes;
  m->nfiles = m->ntensors = m->nchunks = 0;
  m->nhashes = 0;
  if (st == MPG_OK) m->nfiles = nf, st = dec_files(&r, m);
  if (st == MPG_OK) m->ntensors = nt, m->nchunks = nc, st = dec_tensors(&r, m);
  if (st == MPG_OK) m->nhashes = nh, st = dec_chunks(&r, m);
  return st;
}

/* ------------------------------------------------------------------ */
/* Encoder                                                              */
/* ------------------------------------------------------------------ */

static unsigned char *put(unsigned char *p, uint64_t v, int k) {
  for (int i = 0; i < k; i++, v >>= 8) p[i] = (unsigned char)(v & 0xFF);
  return p + k;
}

/* What the writer itself relies on (array sizes, lengths); the decoder
 * checks the rest on the encoded bytes.  Sets *len to the encoded size. */
static mpg_status enc_size(const mpg__ckpt_meta *m, size_t *len) {
  const char *who = "checkpoint metadata to encode";
  size_t meshlen = m->mesh ? strlen(m->mesh) : 0;
  if ((m->nfiles && !m->files) || (m->ntensors && !m->tensors) || (m->nchunks && !m->chunks) ||
      (m->nhashes && !m->hashes))
    return mpg__fail(MPG_ERR_INVALID, "%s: a count is set but its array is NULL", who);
  if (meshlen > UINT32_MAX || m->nhashes > SIZE_MAX / 32)
    return mpg__fail(MPG_ERR_INVALID, "%s: mesh text or nhashes too large", who);
  uint64_t n = HEADER_BYTES + meshlen + (uint64_t)m->nfiles * FILE_BYTES + m->nhashes * 8 +
               TRAILER_BYTES;
  for (uint32_t i = 0; i < m->ntensors; i++) {
    const mpg__ckpt_tensor *t = &m->tensors[i];
    size_t nl = t->name ? strlen(t->name) : 0;
    if (nl == 0 || nl > MPG__CKPT_NAME_MAX)
      return mpg__fail(MPG_ERR_INVALID, "%s: tensor %u: name length %zu is not in 1..%d", who,
                       i, nl, MPG__CKPT_NAME_MAX);
    if (t->ndim < 1 || t->ndim > MPG_CKPT_MAX_NDIM)
      return mpg__fail(MPG_ERR_INVALID, "%s: tensor %u (%s): ndim %d is not in 1..%d", who, i,
                       t->name, t->ndim, MPG_CKPT_MAX_NDIM);
    n += 2 + nl + 3 + 8 * (uint64_t)t->ndim + 8;
  }
  for (uint32_t c = 0; c < m->nchunks; c++) {
    if (m->chunks[c].tensor >= m->ntensors)
      return mpg__fail(MPG_ERR_INVALID, "%s: chunk %u: tensor %u is not below ntensors %u", who,
                       c, m->chunks[c].tensor, m->ntensors);
    n += 8 + 16 * (uint64_t)m->tensors[m->chunks[c].tensor].ndim + 32;
  }
  if (n > SIZE_MAX / 2) return mpg__fail(MPG_ERR_INVALID, "%s: too large (%llu bytes)", who,
                                         (unsigned long long)n);
  *len = (size_t)n;
  return MPG_OK;
}

static void enc_body(const mpg__ckpt_meta *m, unsigned char *p, size_t len) {
  size_t meshlen = m->mesh ? strlen(m->mesh) : 0;
  memcpy(p, MPG__CKPT_MAGIC, 8);
  p = put(p + 8, MPG__CKPT_VERSION, 4);
  p = put(p, 0, 4);
  p = put(p, len, 8);
  p = put(p, m->save_id, 8);
  p = put(p, (uint64_t)m->step, 8);
  p = put(p, m->world, 4);
  p = put(p, m->nfiles, 4);
  p = put(p, m->ntensors, 4);
  p = put(p, m->nchunks, 4);
  p = put(p, m->nhashes, 8);
  p = put(p, m->block_bytes, 8);
  p = put(p, meshlen, 4);
  if (meshlen) memcpy(p, m->mesh, meshlen);
  p += meshlen;
  for (uint32_t i = 0; i < m->nfiles; i++) {
    p = put(p, m->files[i].rank, 4);
    p = put(p, m->files[i].bytes, 8);
  }
  for (uint32_t i = 0; i < m->ntensors; i++) {
    const mpg__ckpt_tensor *t = &m->tensors[i];
    size_t nl = strlen(t->name);
    p = put(p, nl, 2);
    memcpy(p, t->name, nl);
    p = put(p + nl, (uint64_t)t->dtype, 1);
    p = put(p, (uint64_t)t->kind, 1);
    p = put(p, (uint64_t)t->ndim, 1);
    for (int a = 0; a < t->ndim; a++) p = put(p, t->shape[a], 8);
    p = put(p, t->first_chunk, 4);
    p = put(p, t->nchunks, 4);
  }
  for (uint32_t i = 0; i < m->nchunks; i++) {
    const mpg__ckpt_chunk *c = &m->chunks[i];
    int nd = m->tensors[c->tensor].ndim;
    p = put(p, c->tensor, 4);
    p = put(p, c->file, 4);
    for (int a = 0; a < nd; a++) p = put(p, c->box_off[a], 8);
    for (int a = 0; a < nd; a++) p = put(p, c->box_shape[a], 8);
    p = put(p, c->range_off, 8);
    p = put(p, c->range_count, 8);
    p = put(p, c->file_off, 8);
    p = put(p, c->first_hash, 8);
  }
  for (uint64_t h = 0; h < m->nhashes; h++) p = put(p, m->hashes[h], 8);
}

mpg_status mpg__ckpt_meta_encode(const mpg__ckpt_meta *m, unsigned char **out, size_t *len) {
  if (out) *out = NULL;
  if (len) *len = 0;
  if (!m || !out || !len) return mpg__fail(MPG_ERR_INVALID, "mpg__ckpt_meta_encode: NULL argument");
  size_t n = 0;
  mpg_status st = enc_size(m, &n);
  if (st != MPG_OK) return st;
  unsigned char *buf = malloc(n);
  if (!buf) return mpg__fail(MPG_ERR_NOMEM, "checkpoint metadata: out of memory (%zu bytes)", n);
  enc_body(m, buf, n);
  put(buf + n - TRAILER_BYTES, mpg__xxh64(buf, n - TRAILER_BYTES, 0), 8);
  /* The decoder is the one statement of the rules: run it on the result. */
  mpg__ckpt_meta check;
  st = mpg__ckpt_meta_decode(buf, n, "checkpoint metadata to encode", &check);
  mpg__ckpt_meta_free(&check);
  if (st != MPG_OK) {
    free(buf);
    return st == MPG_ERR_NOMEM ? st : MPG_ERR_INVALID;
  }
  *out = buf;
  *len = n;
  return MPG_OK;
}

/* ------------------------------------------------------------------ */
/* The header of meta.mpgc before its body (ckpt_open.c reads the file)  */
/* ------------------------------------------------------------------ */

mpg_status mpg__ckpt_meta_precheck(const unsigned char *hdr, uint64_t size, const char *path) {
  if (!path) path = "<checkpoint metadata>";
  size_t have = size < HEADER_BYTES ? (size_t)size : HEADER_BYTES;
  uint32_t version = 0;
  mpg_status st = dec_prefix(hdr, have, size, path, &version);
  if (st != MPG_OK) return st;
  /* The most bytes the counts allow: every name 255 bytes, every shape of
   * MPG_CKPT_MAX_NDIM axes. */
  uint64_t nfiles = le_get(hdr + 44, 4), ntensors = le_get(hdr + 48, 4);
  uint64_t nchunks = le_get(hdr + 52, 4), nhashes = le_get(hdr + 56, 8);
  uint64_t meshlen = le_get(hdr + 72, 4);
  uint64_t most = HEADER_BYTES + TRAILER_BYTES + meshlen + nfiles * FILE_BYTES +
                  ntensors * (2 + MPG__CKPT_NAME_MAX + 3 + 8 * MPG_CKPT_MAX_NDIM + 8) +
                  nchunks * (8 + 16 * MPG_CKPT_MAX_NDIM + 32); /* < 2^45 */
  if (nhashes <= (UINT64_MAX - most) / 8 && size > most + nhashes * 8)
    return mpg__fail(MPG_ERR_INVALID,
                     "%s: %llu bytes, more than the header's counts allow (%llu files, %llu "
                     "tensors, %llu chunks, %llu hashes: at most %llu bytes)",
                     path, (unsigned long long)size, (unsigned long long)nfiles,
                     (unsigned long long)ntensors, (unsigned long long)nchunks,
                     (unsigned long long)nhashes, (unsigned long long)(most + nhashes * 8));
  return MPG_OK;
}
