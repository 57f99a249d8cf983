/* The checkpoint metadata format (sync/ckpt_format.c, ckpt_format.h):
 * XXH64 against the reference implementation's values, encode/decode round
 * trips of random metadata, every decoder rule on a small hand-laid file
 * (each failure names the path, the field and the byte offset), truncation
 * at every length, flipped bytes, a future version, and the small helpers.
 * Run under valgrind and ASan by the suites, which catch any read outside
 * the buffer. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../../sync/ckpt_format.h"

#define PATH "t/meta.mpgc"

/* ------------------------------------------------------------------ */
/* Helpers                                                              */
/* ------------------------------------------------------------------ */

static uint64_t rnd(uint64_t *s) { /* splitmix64 */
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static uint64_t below(uint64_t *s, uint64_t n) { return rnd(s) % n; }

static void put_le(unsigned char *p, uint64_t v, int k) {
  for (int i = 0; i < k; i++, v >>= 8) p[i] = (unsigned char)v;
}

static uint64_t get_le(const unsigned char *p, int k) {
  uint64_t v = 0;
  for (int i = k - 1; i >= 0; i--) v = v << 8 | p[i];
  return v;
}

/* Make a patched file consistent again: its length field and trailer. */
static void fixup(unsigned char *b, size_t len) {
  put_le(b + 16, len, 8);
  put_le(b + len - 8, mpg__xxh64(b, len - 8, 0), 8);
}

/* The small metadata every rule test patches:
 *   files   rank 0 (4096 bytes), rank 3 (1000 bytes); block_bytes 64
 *   a.bias  F32  param [8]    1 chunk: whole, file 0 at 0   (1 block)
 *   b.w     BF16 state [4,6]  2 chunks: rows 0..1 whole, file 1 at 0 (1);
 *                             rows 2..3 range 2+10, file 0 at 100 (1)
 *   c.rng   U8   bytes [200]  1 chunk: whole, file 1 at 100 (4 blocks) */
static void small_meta(mpg__ckpt_meta *m) {
  memset(m, 0, sizeof *m);
  m->version = 1;
  m->save_id = 0x1122334455667788ull;
  m->step = -5;
  m->world = 4;
  m->block_bytes = 64;
  m->mesh = strdup("dp=2,tp=2");
  m->nfiles = 2;
  m->files = calloc(2, sizeof *m->files);
  m->files[0] = (mpg__ckpt_file){0, 4096};
  m->files[1] = (mpg__ckpt_file){3, 1000};
  m->ntensors = 3;
  m->tensors = calloc(3, sizeof *m->tensors);
  m->tensors[0] = (mpg__ckpt_tensor){strdup("a.bias"), MPG_F32, MPG_CKPT_PARAM, 1, {8}, 0, 1};
  m->tensors[1] = (mpg__ckpt_tensor){strdup("b.w"), MPG_BF16, MPG_CKPT_STATE, 2, {4, 6}, 1, 2};
  m->tensors[2] = (mpg__ckpt_tensor){strdup("c.rng"), MPG__CKPT_DT_U8, MPG_CKPT_BYTES, 1,
                                     {200}, 3, 1};
  m->nchunks = 4;
  m->chunks = calloc(4, sizeof *m->chunks);
  m->chunks[0] = (mpg__ckpt_chunk){0, 0, {0}, {8}, 0, 8, 0, 0};
  m->chunks[1] = (mpg__ckpt_chunk){1, 1, {0, 0}, {2, 6}, 0, 12, 0, 1};
  m->chunks[2] = (mpg__ckpt_chunk){1, 0, {2, 0}, {2, 6}, 2, 10, 100, 2};
  m->chunks[3] = (mpg__ckpt_chunk){2, 1, {0}, {200}, 0, 200, 100, 3};
  m->nhashes = 7;
  m->hashes = calloc(7, sizeof *m->hashes);
  for (int i = 0; i < 7; i++) m->hashes[i] = 0xA0A0A0A000000000ull + (uint64_t)i;
}

/* Byte offsets of the small meta's parts, laid out by hand from the spec. */
enum {
  O_MESH = 76, O_FILES = 85, O_T0 = 109, O_T1 = 136, O_T2 = 168, O_C0 = 194, O_C1 = 250,
  O_C2 = 322, O_C3 = 394, O_HASHES = 450, SMALL_LEN = 514
};

static unsigned char *small_bytes(size_t *len) {
  mpg__ckpt_meta m;
  unsigned char *b = NULL;
  small_meta(&m);
  mpg_status st = mpg__ckpt_meta_encode(&m, &b, len);
  cr_assert_eq(st, MPG_OK, "encode: %s", mpg_last_error());
  mpg__ckpt_meta_free(&m);
  return b;
}

/* Where two metas differ ("" when equal). */
static const char *meta_diff(const mpg__ckpt_meta *a, const mpg__ckpt_meta *b) {
  static char why[200];
  if (a->save_id != b->save_id || a->step != b->step || a->world != b->world ||
      a->block_bytes != b->block_bytes || strcmp(a->mesh ? a->mesh : "", b->mesh))
    return "header";
  if (a->nfiles != b->nfiles || a->ntensors != b->ntensors || a->nchunks != b->nchunks ||
      a->nhashes != b->nhashes)
    return "counts";
  for (uint32_t i = 0; i < a->nfiles; i++)
    if (a->files[i].rank != b->files[i].rank || a->files[i].bytes != b->files[i].bytes)
      return snprintf(why, sizeof why, "file %u", i), why;
  for (uint32_t i = 0; i < a->ntensors; i++) {
    const mpg__ckpt_tensor *x = &a->tensors[i], *y = &b->tensors[i];
    int same = !strcmp(x->name, y->name) && x->dtype == y->dtype && x->kind == y->kind &&
               x->ndim == y->ndim && x->first_chunk == y->first_chunk &&
               x->nchunks == y->nchunks;
    for (int d = 0; same && d < x->ndim; d++) same = x->shape[d] == y->shape[d];
    if (!same) return snprintf(why, sizeof why, "tensor %u", i), why;
  }
  for (uint32_t i = 0; i < a->nchunks; i++) {
    const mpg__ckpt_chunk *x = &a->chunks[i], *y = &b->chunks[i];
    int nd = a->tensors[x->tensor].ndim;
    int same = x->tensor == y->tensor && x->file == y->file && x->range_off == y->range_off &&
               x->range_count == y->range_count && x->file_off == y->file_off &&
               x->first_hash == y->first_hash;
    for (int d = 0; same && d < nd; d++)
      same = x->box_off[d] == y->box_off[d] && x->box_shape[d] == y->box_shape[d];
    if (!same) return snprintf(why, sizeof why, "chunk %u", i), why;
  }
  for (uint64_t h = 0; h < a->nhashes; h++)
    if (a->hashes[h] != b->hashes[h]) return "hashes";
  return "";
}

/* A random valid meta: up to 16 ranks, 6 tensors of every dtype and kind,
 * 1-4 axes, 0-3 chunks each with random boxes and ranges, block sizes
 * 1-100 bytes (so chunks span several blocks). */
static void random_meta(uint64_t *s, mpg__ckpt_meta *m) {
  memset(m, 0, sizeof *m);
  m->version = 1;
  m->save_id = rnd(s);
  m->step = (int64_t)rnd(s);
  m->world = 1 + (uint32_t)below(s, 16);
  m->block_bytes = 1 + below(s, 100);
  char mesh[64];
  int ml = (int)below(s, 40);
  for (int i = 0; i < ml; i++) mesh[i] = (char)(' ' + below(s, 95));
  mesh[ml] = '\0';
  if (below(s, 4) == 0 && ml < 60) strcat(mesh, "\xc3\xa9"); /* U+00E9 */
  m->mesh = strdup(mesh);
  uint32_t perm[16];
  for (uint32_t i = 0; i < m->world; i++) perm[i] = i;
  for (uint32_t i = m->world - 1; i > 0; i--) {
    uint32_t j = (uint32_t)below(s, i + 1), t = perm[i];
    perm[i] = perm[j], perm[j] = t;
  }
  m->nfiles = 1 + (uint32_t)below(s, m->world);
  m->files = calloc(m->nfiles, sizeof *m->files);
  for (uint32_t i = 0; i < m->nfiles; i++) m->files[i].rank = perm[i];
  m->ntensors = (uint32_t)below(s, 7);
  m->tensors = calloc(m->ntensors + 1, sizeof *m->tensors);
  m->chunks = calloc(3 * m->ntensors + 1, sizeof *m->chunks);
  m->hashes = calloc(1, sizeof *m->hashes);
  for (uint32_t i = 0; i < m->ntensors; i++) {
    mpg__ckpt_tensor *t = &m->tensors[i];
    char name[40];
    int n = snprintf(name, sizeof name, "t%02u", i);
    for (int k = (int)below(s, 8); k > 0; k--) name[n++] = (char)(below(s, 2) ? 'a' + below(s, 26) : 0x80 + below(s, 0x7f));
    name[n] = '\0';
    t->name = strdup(name);
    t->dtype = (int)below(s, MPG__CKPT_DT_COUNT);
    t->kind = (int)below(s, 3);
    t->ndim = 1 + (int)below(s, 4);
    for (int d = 0; d < t->ndim; d++) t->shape[d] = 1 + below(s, 5);
    t->first_chunk = m->nchunks;
    t->nchunks = (uint32_t)below(s, 4);
    for (uint32_t k = 0; k < t->nchunks; k++) {
      mpg__ckpt_chunk *c = &m->chunks[m->nchunks++];
      c->tensor = i;
      c->file = (uint32_t)below(s, m->nfiles);
      for (int d = 0; d < t->ndim; d++) {
        c->box_off[d] = below(s, t->shape[d]);
        c->box_shape[d] = 1 + below(s, t->shape[d] - c->box_off[d]);
      }
      uint64_t elems = mpg__ckpt_box_elems(c->box_shape, t->ndim);
      c->range_off = below(s, elems);
      c->range_count = 1 + below(s, elems - c->range_off);
      c->file_off = m->files[c->file].bytes + below(s, 10);
      m->files[c->file].bytes = c->file_off + c->range_count * mpg__ckpt_dtype_size(t->dtype);
      c->first_hash = m->nhashes;
      uint64_t nb = mpg__ckpt_nblocks(c->range_count * mpg__ckpt_dtype_size(t->dtype),
                                      m->block_bytes);
      m->hashes = realloc(m->hashes, (size_t)(m->nhashes + nb) * sizeof *m->hashes);
      for (uint64_t b = 0; b < nb; b++) m->hashes[m->nhashes++] = rnd(s);
    }
  }
  for (uint32_t i = 0; i < m->nfiles; i++) m->files[i].bytes += below(s, 5);
}

static mpg_status decode(const unsigned char *b, size_t len, mpg__ckpt_meta *m) {
  return mpg__ckpt_meta_decode(b, len, PATH, m);
}

/* ------------------------------------------------------------------ */
/* XXH64                                                                */
/* ------------------------------------------------------------------ */

/* Values from python3-xxhash 3.2.0 (the reference C implementation). */
Test(ckpt_format, xxh64_test_vectors) {
  cr_expect_eq(mpg__xxh64("", 0, 0), 0xef46db3751d8e999ull);
  cr_expect_eq(mpg__xxh64(NULL, 0, 0), 0xef46db3751d8e999ull);
  cr_expect_eq(mpg__xxh64("abc", 3, 0), 0x44bc2cf5ad770999ull);
  cr_expect_eq(mpg__xxh64("abc", 3, 1), 0xbea9ca8199328908ull);
  cr_expect_eq(mpg__xxh64("meshpg checkpoint", 17, 0xdeadbeefcafef00dull),
               0x1c018519f5be39aeull);
  unsigned char seq[100], pat[300];
  for (int i = 0; i < 100; i++) seq[i] = (unsigned char)i;
  for (int i = 0; i < 300; i++) pat[i] = (unsigned char)(i * 7 % 251);
  cr_expect_eq(mpg__xxh64(seq, 100, 0), 0x6ac1e58032166597ull);
  cr_expect_eq(mpg__xxh64(pat, 100, 1234567), 0x8e14d7a63d5d2dc5ull);
  /* every tail path: 1-3 bytes, 4, 8, the 32-byte stripes and their edges */
  static const struct { size_t n; uint64_t h; } v[] = {
      {1, 0xe934a84adb052768ull},  {3, 0x9ff70a635a6209abull},   {4, 0xae5acdc00a55ac41ull},
      {7, 0xd734a6b26f3da63eull},  {8, 0x87116b3365b924ebull},   {9, 0x340667a92c4324ffull},
      {31, 0x0f187c62b1e722b7ull}, {32, 0x91b0cb0931a8c629ull},  {33, 0x931b043cf8d65b94ull},
      {63, 0x575186c12dcebcfdull}, {64, 0xab64977b5af9d022ull},  {100, 0xb7fe1d84b2f23a05ull},
      {255, 0x23ed94aca21b9530ull}};
  for (size_t i = 0; i < sizeof v / sizeof v[0]; i++)
    cr_expect_eq(mpg__xxh64(pat, v[i].n, 0), v[i].h, "XXH64 of %zu bytes: %016llx", v[i].n,
                 (unsigned long long)mpg__xxh64(pat, v[i].n, 0));
}

/* ------------------------------------------------------------------ */
/* Round trips                                                          */
/* ------------------------------------------------------------------ */

Test(ckpt_format, small_meta_layout_matches_the_spec) {
  size_t len;
  unsigned char *b = small_bytes(&len);
  cr_assert_eq(len, SMALL_LEN);
  cr_expect(!memcmp(b, "MPGCKPT\n", 8));
  cr_expect_eq(get_le(b + 8, 4), 1);
  cr_expect_eq(get_le(b + 16, 8), SMALL_LEN);
  cr_expect_eq(get_le(b + 24, 8), 0x1122334455667788ull);
  cr_expect_eq((int64_t)get_le(b + 32, 8), -5);
  cr_expect_eq(get_le(b + 40, 4), 4);
  cr_expect_eq(get_le(b + 56, 8), 7);
  cr_expect_eq(get_le(b + 72, 4), 9);
  cr_expect(!memcmp(b + O_MESH, "dp=2,tp=2", 9));
  cr_expect_eq(get_le(b + O_FILES + 12, 4), 3);
  cr_expect_eq(get_le(b + O_FILES + 16, 8), 1000);
  cr_expect_eq(get_le(b + O_T0, 2), 6);
  cr_expect(!memcmp(b + O_T0 + 2, "a.bias", 6));
  cr_expect(!memcmp(b + O_T1 + 2, "b.w", 3));
  cr_expect_eq(b[O_T1 + 5], MPG_BF16);
  cr_expect_eq(b[O_T1 + 7], 2);
  cr_expect_eq(get_le(b + O_T1 + 8 + 8, 8), 6);
  cr_expect_eq(get_le(b + O_C2 + 8 + 0, 8), 2);  /* box offset axis 0 */
  cr_expect_eq(get_le(b + O_C2 + 40, 8), 2);     /* range offset */
  cr_expect_eq(get_le(b + O_C2 + 56, 8), 100);   /* file offset */
  cr_expect_eq(get_le(b + O_C3 + 48, 8), 3);     /* first hash */
  cr_expect_eq(get_le(b + O_HASHES + 8 * 6, 8), 0xA0A0A0A000000006ull);
  cr_expect_eq(get_le(b + SMALL_LEN - 8, 8), mpg__xxh64(b, SMALL_LEN - 8, 0));
  mpg__ckpt_meta m;
  cr_assert_eq(decode(b, len, &m), MPG_OK, "%s", mpg_last_error());
  mpg__ckpt_meta want;
  small_meta(&want);
  cr_expect_str_empty(meta_diff(&want, &m));
  cr_expect_eq(m.version, 1);
  mpg__ckpt_meta_free(&want);
  mpg__ckpt_meta_free(&m);
  free(b);
}

/* The it-th random meta of the stream s in *m (NULL: freed), and its
 * encoding b (len bytes; asserted). */
static void random_encoded(uint64_t *s, int it, mpg__ckpt_meta *m, unsigned char **b,
                           size_t *len) {
  mpg__ckpt_meta own;
  if (!m) m = &own;
  random_meta(s, m);
  cr_assert_eq(mpg__ckpt_meta_encode(m, b, len), MPG_OK, "meta %d: %s", it, mpg_last_error());
  if (m == &own) mpg__ckpt_meta_free(&own);
}

/* Property: decode(encode(m)) == m and encoding is canonical, over random
 * metas. */
Test(ckpt_format, random_metas_round_trip) {
  uint64_t s = 20240531;
  for (int it = 0; it < 400; it++) {
    mpg__ckpt_meta m, d;
    unsigned char *b = NULL, *b2 = NULL;
    size_t len = 0, len2 = 0;
    random_encoded(&s, it, &m, &b, &len);
    cr_assert_eq(decode(b, len, &d), MPG_OK, "meta %d: %s", it, mpg_last_error());
    cr_assert_str_empty(meta_diff(&m, &d), "meta %d differs after a round trip", it);
    for (uint32_t i = 0; i < m.ntensors; i++)
      cr_assert_eq(mpg__ckpt_meta_find(&d, m.tensors[i].name), (int)i);
    cr_assert_eq(mpg__ckpt_meta_encode(&d, &b2, &len2), MPG_OK, "%s", mpg_last_error());
    cr_assert(len2 == len && !memcmp(b, b2, len), "meta %d: not canonical", it);
    mpg__ckpt_meta_free(&m);
    mpg__ckpt_meta_free(&d);
    free(b);
    free(b2);
  }
}

/* ------------------------------------------------------------------ */
/* Every decoder rule, on the small meta patched and made consistent    */
/* ------------------------------------------------------------------ */

typedef struct rule {
  size_t at;           /* byte to patch */
  int width;           /* bytes */
  uint64_t value;      /* little-endian */
  const char *message; /* expected in the message */
  long offset;         /* the byte offset the message names, -1: none */
} rule;

static const rule rules[] = {
    {0, 1, 'N', "not a meshpg checkpoint metadata file", 0},
    {8, 4, 0, "format version 0", 8},
    {12, 4, 1, "flags 0x1, not 0", 12},
    {40, 4, 0, "world size 0", 40},
    {64, 8, 0, "block_bytes 0", 64},
    {72, 4, 500, "mesh text length 500 exceeds", 72},
    {O_MESH + 2, 1, 0, "mesh text is not UTF-8", O_MESH + 2},
    {O_MESH + 4, 1, 0xC3, "mesh text is not UTF-8", O_MESH + 4},
    {44, 4, 0xFFFFFFFF, "the counts do not fit the file", O_FILES},
    {48, 4, 1000, "the counts do not fit the file", O_FILES},
    {56, 8, UINT64_MAX / 4, "the counts do not fit the file", O_FILES},
    {O_FILES + 12, 4, 4, "file 1: rank 4 is not below the world size 4", O_FILES + 12},
    {O_FILES + 12, 4, 0, "file 1: rank 0 already has file 0", O_FILES + 12},
    {O_T0, 2, 0, "tensor 0: name length 0 is not in 1..255", O_T0},
    {O_T0, 2, 256, "tensor 0: name length 256 is not in 1..255", O_T0},
    {O_T0, 2, 60000, "tensor 0: name length 60000", O_T0},
    {O_T0 + 3, 1, 0, "tensor 0: the name holds a NUL byte", O_T0 + 2},
    {O_T1 + 2, 1, 'z', "tensor 2 (c.rng): name not after the previous tensor's (z.w)", O_T2 + 2},
    {O_T0 + 2, 1, 'c', "tensor 1 (b.w): name not after the previous tensor's (c.bias)", O_T1 + 2},
    {O_T1 + 5, 1, 7, "tensor 1 (b.w): dtype 7 is unknown", O_T1 + 5},
    {O_T1 + 6, 1, 3, "tensor 1 (b.w): kind 3 is unknown", O_T1 + 6},
    {O_T1 + 7, 1, 0, "tensor 1 (b.w): ndim 0 is not in 1..8", O_T1 + 7},
    {O_T1 + 7, 1, 9, "tensor 1 (b.w): ndim 9 is not in 1..8", O_T1 + 7},
    {O_T1 + 16, 8, 0, "tensor 1 (b.w): extent 0 on axis 1", O_T1 + 16},
    {O_T1 + 8, 8, 1ull << 62, "tensor 1 (b.w): the tensor's byte size overflows", O_T1 + 16},
    {O_T1 + 24, 4, 2, "tensor 1 (b.w): first chunk 2, expected 1", O_T1 + 24},
    {O_T2 + 22, 4, 5, "tensor 2 (c.rng): chunk count 5 exceeds the 1 chunks left of 4",
     O_T2 + 22},
    {O_T2 + 22, 4, 0, "the tensors' chunk ranges cover 3 of the 4 chunks", O_C0},
    {O_C1, 4, 0, "chunk 1 of tensor b.w: tensor index 0, but the tensors' chunk ranges give 1",
     O_C1},
    {O_C1 + 4, 4, 2, "chunk 1 of tensor b.w: file 2 is not below nfiles 2", O_C1 + 4},
    {O_C2 + 24, 8, 0, "chunk 2 of tensor b.w: box extent 0 on axis 0", O_C2 + 24},
    {O_C2 + 8, 8, 3, "chunk 2 of tensor b.w: box exceeds the shape on axis 0 (offset 3 + 2 > 4)",
     O_C2 + 8},
    {O_C2 + 16, 8, UINT64_MAX, "box exceeds the shape on axis 1", O_C2 + 16},
    {O_C2 + 48, 8, 0, "chunk 2 of tensor b.w: range count 0", O_C2 + 48},
    {O_C2 + 40, 8, 3,
     "chunk 2 of tensor b.w: range exceeds the box (offset 3 + count 10 > 12 elements)",
     O_C2 + 40},
    {O_C2 + 48, 8, UINT64_MAX, "range exceeds the box", O_C2 + 40},
    {O_C3 + 40, 8, 900,
     "chunk 3 of tensor c.rng: bytes [900, +200) exceed file 1 (data-00003.bin) of 1000 bytes",
     O_C3 + 40},
    {O_C3 + 40, 8, UINT64_MAX, "exceed file 1", O_C3 + 40},
    {O_FILES + 16, 8, 299, "chunk 3 of tensor c.rng: bytes [100, +200) exceed file 1", O_C3 + 40},
    {O_C1 + 64, 8, 0, "chunk 1 of tensor b.w: first hash 0, expected 1", O_C1 + 64},
    {56, 8, 6, "chunk 3 of tensor c.rng: its 4 blocks exceed the 3 hashes left of 6",
     O_C3 + 48},
};

Test(ckpt_format, every_rule_is_rejected_with_path_field_and_offset) {
  size_t len;
  unsigned char *b = small_bytes(&len);
  for (size_t i = 0; i < sizeof rules / sizeof rules[0]; i++) {
    const rule *r = &rules[i];
    unsigned char *p = malloc(len);
    memcpy(p, b, len);
    put_le(p + r->at, r->value, r->width);
    fixup(p, len);
    mpg__ckpt_meta m;
    mpg_status st = decode(p, len, &m);
    const char *msg = mpg_last_error();
    cr_expect_eq(st, MPG_ERR_INVALID, "rule %zu (%s): status %s", i, r->message,
                 mpg_status_name(st));
    cr_expect(!strncmp(msg, PATH ": ", strlen(PATH) + 2), "rule %zu: no path: %s", i, msg);
    cr_expect(strstr(msg, r->message), "rule %zu: want \"%s\" in \"%s\"", i, r->message, msg);
    char off[64];
    snprintf(off, sizeof off, "byte offset %ld)", r->offset);
    cr_expect(strstr(msg, off), "rule %zu: want \"%s\" in \"%s\"", i, off, msg);
    mpg__ckpt_meta_free(&m);
    free(p);
  }
  free(b);
}

/* The rules that no byte patch of the small meta reaches. */
Test(ckpt_format, rules_reached_through_the_encoder) {
  mpg__ckpt_meta m;
  unsigned char *b = (unsigned char *)"x";
  size_t len = 1;
  small_meta(&m); /* two tensors of one name */
  free(m.tensors[1].name);
  m.tensors[1].name = strdup("a.bias");
  cr_expect_eq(mpg__ckpt_meta_encode(&m, &b, &len), MPG_ERR_INVALID);
  cr_expect(b == NULL && len == 0);
  cr_expect(strstr(mpg_last_error(), "tensor 1 (a.bias): duplicate name"), "%s",
            mpg_last_error());
  mpg__ckpt_meta_free(&m);
  small_meta(&m); /* a hash no block uses */
  m.hashes = realloc(m.hashes, 8 * sizeof *m.hashes);
  m.nhashes = 8;
  cr_expect_eq(mpg__ckpt_meta_encode(&m, &b, &len), MPG_ERR_INVALID);
  cr_expect(strstr(mpg_last_error(), "the chunks' blocks use 7 of the 8 hashes"), "%s",
            mpg_last_error());
  m.nhashes = 7; /* what the writer itself needs */
  m.tensors[0].ndim = 9;
  cr_expect_eq(mpg__ckpt_meta_encode(&m, &b, &len), MPG_ERR_INVALID);
  cr_expect(strstr(mpg_last_error(), "tensor 0 (a.bias): ndim 9"), "%s", mpg_last_error());
  m.tensors[0].ndim = 1;
  m.chunks[2].tensor = 3;
  cr_expect_eq(mpg__ckpt_meta_encode(&m, &b, &len), MPG_ERR_INVALID);
  cr_expect(strstr(mpg_last_error(), "chunk 2: tensor 3 is not below ntensors 3"), "%s",
            mpg_last_error());
  m.chunks[2].tensor = 1;
  free(m.tensors[2].name);
  m.tensors[2].name = strdup("");
  cr_expect_eq(mpg__ckpt_meta_encode(&m, &b, &len), MPG_ERR_INVALID);
  cr_expect(strstr(mpg_last_error(), "tensor 2: name length 0"), "%s", mpg_last_error());
  mpg__ckpt_meta_free(&m);
  cr_expect_eq(mpg__ckpt_meta_encode(NULL, &b, &len), MPG_ERR_INVALID);
}

Test(ckpt_format, bytes_after_the_hashes_and_bad_trailer_and_length) {
  size_t len;
  unsigned char *b = small_bytes(&len);
  unsigned char *p = calloc(1, len + 8);
  memcpy(p, b, len - 8); /* 8 extra zero bytes before the trailer */
  fixup(p, len + 8);
  mpg__ckpt_meta m;
  cr_expect_eq(decode(p, len + 8, &m), MPG_ERR_INVALID);
  cr_expect(strstr(mpg_last_error(), "8 unexpected bytes between the hashes and the trailer "
                                     "(byte offset 506)"), "%s", mpg_last_error());
  mpg__ckpt_meta_free(&m);
  memcpy(p, b, len);
  p[len - 1] ^= 0x40;
  cr_expect_eq(decode(p, len, &m), MPG_ERR_INVALID);
  cr_expect(strstr(mpg_last_error(), PATH ": checksum mismatch: the trailer at byte offset 506"),
            "%s", mpg_last_error());
  mpg__ckpt_meta_free(&m);
  memcpy(p, b, len);
  put_le(p + 16, len + 1, 8);
  cr_expect_eq(decode(p, len, &m), MPG_ERR_INVALID);
  cr_expect(strstr(mpg_last_error(), "length field 515 (byte offset 16) but the file has 514 "
                                     "bytes (truncated)"), "%s", mpg_last_error());
  mpg__ckpt_meta_free(&m);
  free(p);
  free(b);
}

/* A newer version is MPG_ERR_UNSUPPORTED naming both versions, whatever
 * follows it (a future layout need not match this one). */
Test(ckpt_format, future_version_is_unsupported) {
  size_t len;
  unsigned char *b = small_bytes(&len);
  mpg__ckpt_meta m;
  static const uint64_t versions[] = {2, 77, 0xFFFFFFFFull};
  for (int i = 0; i < 3; i++) {
    put_le(b + 8, versions[i], 4);
    cr_expect_eq(decode(b, len, &m), MPG_ERR_UNSUPPORTED);
    char want[120];
    snprintf(want, sizeof want, PATH ": format version %llu is newer than this library's (1)",
             (unsigned long long)versions[i]);
    cr_expect(strstr(mpg_last_error(), want), "%s", mpg_last_error());
    mpg__ckpt_meta_free(&m);
    cr_expect_eq(decode(b, 12, &m), MPG_ERR_UNSUPPORTED); /* only the version read */
    mpg__ckpt_meta_free(&m);
  }
  free(b);
}

/* Every prefix of the file is rejected: as it is (the length field or the
 * size catches it), and made consistent (length and trailer patched), so
 * that the field reader itself meets the end.  Each copy is its own
 * malloc'ed block of exactly that size, so ASan and valgrind see any read
 * past it. */
Test(ckpt_format, truncation_at_every_length) {
  size_t len;
  unsigned char *b = small_bytes(&len);
  for (size_t n = 0; n < len; n++) {
    unsigned char *p = malloc(n ? n : 1);
    memcpy(p, b, n);
    mpg__ckpt_meta m;
    cr_assert_eq(decode(n ? p : NULL, n, &m), MPG_ERR_INVALID, "length %zu", n);
    cr_assert(!strncmp(mpg_last_error(), PATH ": ", strlen(PATH) + 2), "%s", mpg_last_error());
    mpg__ckpt_meta_free(&m);
    if (n >= 84) {
      memcpy(p, b, n - 8);
      fixup(p, n);
      cr_assert_eq(decode(p, n, &m), MPG_ERR_INVALID, "consistent length %zu", n);
      cr_assert(strstr(mpg_last_error(), "truncated") || strstr(mpg_last_error(), "do not fit") ||
                    strstr(mpg_last_error(), "exceeds"),
                "length %zu: %s", n, mpg_last_error());
      mpg__ckpt_meta_free(&m);
    }
    free(p);
  }
  free(b);
}

/* Any flipped bit is caught by the trailer (or, in the envelope, by the
 * magic, version or length); once the trailer is made consistent, the
 * decoder either rejects the file or decodes a meta that encodes back to
 * exactly those bytes. */
Test(ckpt_format, flipped_bytes) {
  uint64_t s = 7;
  for (int it = 0; it < 40; it++) {
    mpg__ckpt_meta d;
    unsigned char *b = NULL, *b2 = NULL;
    size_t len = 0, len2 = 0;
    random_encoded(&s, it, NULL, &b, &len);
    for (size_t at = 0; at < len; at++) {
      unsigned char bit = (unsigned char)(1u << below(&s, 8));
      b[at] ^= bit;
      mpg_status st = decode(b, len, &d);
      cr_assert(st == MPG_ERR_INVALID || (st == MPG_ERR_UNSUPPORTED && at >= 8 && at < 12),
                "byte %zu: %s", at, mpg_status_name(st));
      mpg__ckpt_meta_free(&d);
      if (at >= 24 && at < len - 8) {
        put_le(b + len - 8, mpg__xxh64(b, len - 8, 0), 8);
        if (decode(b, len, &d) == MPG_OK) {
          cr_assert_eq(mpg__ckpt_meta_encode(&d, &b2, &len2), MPG_OK, "%s", mpg_last_error());
          cr_assert(len2 == len && !memcmp(b, b2, len), "byte %zu: not canonical", at);
          free(b2);
        }
        mpg__ckpt_meta_free(&d);
      }
      b[at] ^= bit;
      put_le(b + len - 8, mpg__xxh64(b, len - 8, 0), 8);
    }
    free(b);
  }
}

/* Random garbage with a valid envelope never crashes and never decodes
 * into something that does not re-encode identically. */
Test(ckpt_format, random_bodies) {
  uint64_t s = 99;
  for (int it = 0; it < 3000; it++) {
    size_t len = 84 + (size_t)below(&s, 300);
    unsigned char *b = malloc(len);
    for (size_t i = 0; i < len; i++) b[i] = (unsigned char)(below(&s, 4) ? below(&s, 4) : rnd(&s));
    memcpy(b, "MPGCKPT\n", 8);
    put_le(b + 8, 1, 4);
    put_le(b + 12, 0, 4);
    put_le(b + 40, 1 + below(&s, 4), 4);
    put_le(b + 64, 1 + below(&s, 64), 8);
    put_le(b + 72, below(&s, 3), 4);
    fixup(b, len);
    mpg__ckpt_meta d;
    if (decode(b, len, &d) == MPG_OK) {
      unsigned char *b2 = NULL;
      size_t len2 = 0;
      cr_assert_eq(mpg__ckpt_meta_encode(&d, &b2, &len2), MPG_OK, "%s", mpg_last_error());
      cr_assert(len2 == len && !memcmp(b, b2, len));
      free(b2);
    }
    mpg__ckpt_meta_free(&d);
    free(b);
  }
}

/* ------------------------------------------------------------------ */
/* Helpers and reading a directory                                      */
/* ------------------------------------------------------------------ */

Test(ckpt_format, helpers) {
  cr_expect_eq(mpg__ckpt_nblocks(0, 64), 0);
  cr_expect_eq(mpg__ckpt_nblocks(1, 64), 1);
  cr_expect_eq(mpg__ckpt_nblocks(64, 64), 1);
  cr_expect_eq(mpg__ckpt_nblocks(65, 64), 2);
  cr_expect_eq(mpg__ckpt_nblocks(UINT64_MAX, 1ull << 20), (UINT64_MAX >> 20) + 1);
  uint64_t box[3] = {2, 3, 7};
  cr_expect_eq(mpg__ckpt_box_elems(box, 3), 42);
  cr_expect_eq(mpg__ckpt_box_elems(box, 1), 2);
  static const size_t sizes[] = {4, 8, 2, 2, 4, 8, 1};
  static const char *const names[] = {"F32", "F64", "F16", "BF16", "I32", "I64", "U8"};
  for (int d = 0; d < MPG__CKPT_DT_COUNT; d++) {
    cr_expect_eq(mpg__ckpt_dtype_size(d), sizes[d]);
    cr_expect_str_eq(mpg__ckpt_dtype_name(d), names[d]);
  }
  cr_expect_eq(mpg__ckpt_dtype_size(-1), 0);
  cr_expect_eq(mpg__ckpt_dtype_size(7), 0);
  cr_expect_str_eq(mpg__ckpt_dtype_name(7), "?");
  cr_expect_eq(mpg__ckpt_dtype_size(MPG_BF16), mpg_dtype_size(MPG_BF16));
  char p[64];
  mpg__ckpt_data_path("run/step-10", 3, p, sizeof p);
  cr_expect_str_eq(p, "run/step-10/data-00003.bin");
  mpg__ckpt_data_path("d", 123456, p, sizeof p);
  cr_expect_str_eq(p, "d/data-123456.bin");
  mpg__ckpt_data_path("run/step-10", 3, p, 8); /* truncated, terminated */
  cr_expect_str_eq(p, "run/ste");
  mpg__ckpt_meta m;
  small_meta(&m);
  cr_expect_eq(mpg__ckpt_meta_find(&m, "a.bias"), 0);
  cr_expect_eq(mpg__ckpt_meta_find(&m, "b.w"), 1);
  cr_expect_eq(mpg__ckpt_meta_find(&m, "c.rng"), 2);
  cr_expect_eq(mpg__ckpt_meta_find(&m, "b"), -1);
  cr_expect_eq(mpg__ckpt_meta_find(&m, "zzz"), -1);
  cr_expect_eq(mpg__ckpt_meta_find(&m, ""), -1);
  mpg__ckpt_meta_free(&m);
  cr_expect_eq(m.tensors, NULL);
  mpg__ckpt_meta_free(&m); /* zeroed: nothing */
  mpg__ckpt_meta_free(NULL);
}

Test(ckpt_format, meta_read_from_a_directory) {
  char dir[] = "/tmp/mpg_ckpt_fmt_XXXXXX";
  cr_assert_not_null(mkdtemp(dir));
  mpg__ckpt_meta m;
  char want[160], path[160];
  cr_expect_eq(mpg__ckpt_meta_read(dir, &m), MPG_ERR_NOT_FOUND);
  snprintf(want, sizeof want, "%s is not a checkpoint: no meta.mpgc", dir);
  cr_expect_str_eq(mpg_last_error(), want);
  mpg__ckpt_meta_free(&m);
  snprintf(path, sizeof path, "%s/missing", dir);
  cr_expect_eq(mpg__ckpt_meta_read(path, &m), MPG_ERR_NOT_FOUND);
  size_t len;
  unsigned char *b = small_bytes(&len);
  snprintf(path, sizeof path, "%s/meta.mpgc", dir);
  FILE *f = fopen(path, "wb");
  cr_assert_not_null(f);
  fwrite(b, 1, len, f);
  fclose(f);
  cr_assert_eq(mpg__ckpt_meta_read(dir, &m), MPG_OK, "%s", mpg_last_error());
  cr_expect_eq(m.step, -5);
  cr_expect_str_eq(m.mesh, "dp=2,tp=2");
  mpg__ckpt_meta_free(&m);
  f = fopen(path, "wb"); /* truncated: the message names the file */
  fwrite(b, 1, len - 1, f);
  fclose(f);
  cr_expect_eq(mpg__ckpt_meta_read(dir, &m), MPG_ERR_INVALID);
  cr_expect(!strncmp(mpg_last_error(), path, strlen(path)), "%s", mpg_last_error());
  mpg__ckpt_meta_free(&m);
  unlink(path);
  cr_expect_eq(mkdir(path, 0700), 0); /* meta.mpgc a directory */
  cr_expect_eq(mpg__ckpt_meta_read(dir, &m), MPG_ERR_IO);
  cr_expect(strstr(mpg_last_error(), "not a regular file"), "%s", mpg_last_error());
  rmdir(path);
  rmdir(dir);
  free(b);
}

/* The seeds of the fuzz target (tests/fuzz/ckpt_meta/seed-N.mpgc) are
 * golden files: the small meta, a meta without tensors and random ones,
 * exactly as this encoder writes them, so that a change of the format's
 * bytes cannot go unnoticed.  On a difference the new encoding is written
 * to /tmp/ckpt_meta_seeds/ (copy it over the seeds if the change is meant,
 * with a new format version). */
Test(ckpt_format, fuzz_seeds_are_the_encoders_bytes) {
  const char *data = getenv("MESHPG_TEST_DATA");
  cr_assert_not_null(data, "MESHPG_TEST_DATA is not set (run through meson test)");
  uint64_t s = 31;
  for (int i = 0; i < 8; i++) {
    mpg__ckpt_meta m;
    if (i == 0) small_meta(&m);
    else random_meta(&s, &m);
    if (i == 1) { /* no tensors */
      mpg__ckpt_meta_free(&m);
      memset(&m, 0, sizeof m);
      m.world = 1;
      m.block_bytes = 1 << 20;
      m.mesh = strdup("dp=1");
    }
    unsigned char *b = NULL, *g = NULL;
    size_t len = 0;
    cr_assert_eq(mpg__ckpt_meta_encode(&m, &b, &len), MPG_OK, "%s", mpg_last_error());
    mpg__ckpt_meta_free(&m);
    char path[512];
    snprintf(path, sizeof path, "%s/fuzz/ckpt_meta/seed-%d.mpgc", data, i);
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "%s", path);
    g = malloc(len + 1);
    size_t n = fread(g, 1, len + 1, f);
    fclose(f);
    if (n != len || memcmp(g, b, len)) {
      mkdir("/tmp/ckpt_meta_seeds", 0755);
      snprintf(path, sizeof path, "/tmp/ckpt_meta_seeds/seed-%d.mpgc", i);
      f = fopen(path, "wb");
      if (f) fwrite(b, 1, len, f), fclose(f);
      cr_assert_fail("seed-%d.mpgc differs from the encoder's %zu bytes (written to %s)", i,
                     len, path);
    }
    free(g);
    free(b);
  }
}
