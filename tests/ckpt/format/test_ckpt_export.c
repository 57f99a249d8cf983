/* meshpg ckpt info / export (tools/cmd_ckpt.c), run as the real program on
 * a checkpoint directory built here by hand: the metadata through
 * mpg__ckpt_meta_encode, the data files written as the format says
 * (docs/checkpoints.md), tensors of F32, BF16, I64 and U8 split in several
 * chunks over three files, boxes over two and three axes, a box cut in two
 * ranges, and 12-byte checksum blocks (so elements straddle blocks).  The
 * safetensors file is read back by a reader written here from the
 * safetensors spec and compared bit for bit with the tensors. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../../sync/ckpt_format.h"
#include "../../support/run_util.h"
#include "../../sync/cli_check.h"

/* ------------------------------------------------------------------ */
/* The checkpoint                                                       */
/* ------------------------------------------------------------------ */

enum { NT = 5, NF = 3, MAXC = 16, FILE_CAP = 4096 };

typedef struct spec_tensor {
  const char *name;
  int dtype, kind, ndim;
  uint64_t shape[3];
} spec_tensor;

static const spec_tensor tensors[NT] = {
    {"emb.w", MPG_F32, MPG_CKPT_PARAM, 2, {6, 10}},
    {"h.bias", MPG_BF16, MPG_CKPT_PARAM, 1, {10}},
    {"opt.m", MPG_F32, MPG_CKPT_STATE, 2, {6, 10}},
    {"pos.idx", MPG_I64, MPG_CKPT_PARAM, 3, {2, 3, 4}},
    {"trainer", MPG__CKPT_DT_U8, MPG_CKPT_BYTES, 1, {37}},
};
static const uint32_t ranks[NF] = {0, 1, 5}; /* files A, B, C */

typedef struct spec_chunk {
  uint32_t tensor, file;
  uint64_t off[3], shape[3], range_off, range_count; /* range_count 0: the whole box */
} spec_chunk;

static const spec_chunk chunks[] = {
    {0, 0, {0, 0}, {3, 4}, 0, 0},      {0, 1, {0, 4}, {3, 6}, 0, 10},
    {0, 2, {0, 4}, {3, 6}, 10, 8},     {0, 2, {3, 0}, {3, 4}, 0, 0},
    {0, 0, {3, 4}, {3, 6}, 0, 0},      {1, 1, {0}, {10}, 0, 4},
    {1, 0, {0}, {10}, 4, 6},           {2, 1, {0, 0}, {6, 10}, 0, 0},
    {3, 2, {0, 0, 0}, {2, 3, 2}, 0, 0}, {3, 0, {0, 0, 2}, {2, 3, 2}, 0, 0},
    {4, 2, {0}, {37}, 0, 0},
};
#define NCHUNKS (sizeof chunks / sizeof chunks[0])

static unsigned char *ref[NT]; /* every tensor, row-major */
static char dir[64], st_path[96];

static uint64_t elems_of(const uint64_t *shape, int ndim) {
  uint64_t n = 1;
  for (int d = 0; d < ndim; d++) n *= shape[d];
  return n;
}

static uint64_t bytes_of(int t) {
  return elems_of(tensors[t].shape, tensors[t].ndim) * mpg__ckpt_dtype_size(tensors[t].dtype);
}

/* Global element index of element k (row-major) of a box. */
static uint64_t global_index(const spec_tensor *t, const uint64_t *off, const uint64_t *shape,
                             uint64_t k) {
  uint64_t g = 0, stride = 1;
  for (int d = t->ndim - 1; d >= 0; d--) {
    g += (off[d] + k % shape[d]) * stride;
    k /= shape[d];
    stride *= t->shape[d];
  }
  return g;
}

static void write_file(const char *path, const void *p, size_t n) {
  FILE *f = fopen(path, "wb");
  cr_assert_not_null(f, "%s", path);
  cr_assert_eq(fwrite(p, 1, n, f), n);
  fclose(f);
}

/* Build the checkpoint in `dir`, leaving out chunk `skip` (-1: none). */
static void build(int skip) {
  uint64_t s = 12345;
  for (int t = 0; t < NT; t++) {
    free(ref[t]);
    ref[t] = malloc(bytes_of(t));
    for (uint64_t i = 0; i < bytes_of(t); i++) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      ref[t][i] = (unsigned char)(s >> 56);
    }
  }
  static unsigned char data[NF][FILE_CAP];
  mpg__ckpt_meta m;
  memset(&m, 0, sizeof m);
  memset(data, 0, sizeof data);
  m.version = 1, m.save_id = 42, m.step = 1234, m.world = 6, m.block_bytes = 12;
  m.mesh = strdup("dp=2,tp=3 sync=shard");
  m.nfiles = NF;
  m.files = calloc(NF, sizeof *m.files);
  for (int f = 0; f < NF; f++) m.files[f].rank = ranks[f];
  m.ntensors = NT;
  m.tensors = calloc(NT, sizeof *m.tensors);
  m.chunks = calloc(MAXC, sizeof *m.chunks);
  m.hashes = calloc(256, sizeof *m.hashes);
  for (int t = 0; t < NT; t++) {
    mpg__ckpt_tensor *mt = &m.tensors[t];
    mt->name = strdup(tensors[t].name);
    mt->dtype = tensors[t].dtype, mt->kind = tensors[t].kind, mt->ndim = tensors[t].ndim;
    memcpy(mt->shape, tensors[t].shape, sizeof tensors[t].shape);
    mt->first_chunk = m.nchunks;
    for (size_t k = 0; k < NCHUNKS; k++) {
      const spec_chunk *sc = &chunks[k];
      if (sc->tensor != (uint32_t)t || (int)k == skip) continue;
      mpg__ckpt_chunk *c = &m.chunks[m.nchunks++];
      mt->nchunks++;
      size_t es = mpg__ckpt_dtype_size(mt->dtype);
      c->tensor = (uint32_t)t, c->file = sc->file;
      memcpy(c->box_off, sc->off, sizeof sc->off);
      memcpy(c->box_shape, sc->shape, sizeof sc->shape);
      c->range_off = sc->range_off;
      c->range_count = sc->range_count ? sc->range_count : elems_of(sc->shape, mt->ndim);
      c->file_off = m.files[sc->file].bytes + 3 * (k % 2); /* some gaps */
      unsigned char *p = data[sc->file] + c->file_off;
      for (uint64_t e = 0; e < c->range_count; e++)
        memcpy(p + e * es,
               ref[t] + es * global_index(&tensors[t], sc->off, sc->shape, c->range_off + e),
               es);
      uint64_t bytes = c->range_count * es;
      m.files[sc->file].bytes = c->file_off + bytes;
      cr_assert_leq(m.files[sc->file].bytes, FILE_CAP);
      c->first_hash = m.nhashes;
      for (uint64_t at = 0; at < bytes; at += m.block_bytes)
        m.hashes[m.nhashes++] = mpg__xxh64(p + at, bytes - at < 12 ? bytes - at : 12, 0);
    }
  }
  unsigned char *meta = NULL;
  size_t len = 0;
  cr_assert_eq(mpg__ckpt_meta_encode(&m, &meta, &len), MPG_OK, "%s", mpg_last_error());
  char path[128];
  for (int f = 0; f < NF; f++) {
    mpg__ckpt_data_path(dir, ranks[f], path, sizeof path);
    write_file(path, data[f], (size_t)m.files[f].bytes);
  }
  snprintf(path, sizeof path, "%s/meta.mpgc", dir);
  write_file(path, meta, len);
  free(meta);
  mpg__ckpt_meta_free(&m);
}

static void setup(void) {
  snprintf(dir, sizeof dir, "/tmp/mpg_ckpt_export_XXXXXX");
  cr_assert_not_null(mkdtemp(dir));
  snprintf(st_path, sizeof st_path, "%s.safetensors", dir);
}

static void teardown(void) {
  char cmd[256];
  snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s'", dir, st_path);
  run(cmd, NULL);
  for (int t = 0; t < NT; t++) free(ref[t]), ref[t] = NULL;
}

static int ckpt(const char *args) {
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "'%s' ckpt %s", env_program("MESHPG_CLI"), args);
  return run(cmd, NULL);
}

/* ------------------------------------------------------------------ */
/* A JSON reader (enough for the safetensors header and info --json)    */
/* ------------------------------------------------------------------ */

typedef struct jv {
  char type; /* 'o' object, 'a' array, 's' string, 'n' number, 'b' true/false/null */
  char *str;
  unsigned long long num; /* non-negative integers only */
  int neg;
  int n;
  char **keys;
  struct jv *items;
} jv;

static const char *jp; /* the parser's position */

static void skip_ws(void) {
  while (*jp == ' ' || *jp == '\n' || *jp == '\t' || *jp == '\r') jp++;
}

static char *parse_string(void) {
  cr_assert_eq(*jp, '"', "JSON: string expected at \"%.20s\"", jp);
  jp++;
  char *s = malloc(strlen(jp) + 1), *o = s;
  while (*jp != '"') {
    cr_assert(*jp, "JSON: unterminated string");
    if (*jp == '\\') {
      jp++;
      if (*jp == 'u') {
        unsigned v = 0;
        cr_assert_eq(sscanf(jp + 1, "%4x", &v), 1);
        cr_assert_lt(v, 0x80, "JSON: only \\u00XX escapes expected");
        *o++ = (char)v;
        jp += 5;
        continue;
      }
      *o++ = *jp == 'n' ? '\n' : *jp == 't' ? '\t' : *jp;
      jp++;
      continue;
    }
    *o++ = *jp++;
  }
  jp++;
  *o = '\0';
  return s;
}

static void parse_value(jv *v) {
  memset(v, 0, sizeof *v);
  skip_ws();
  if (*jp == '{' || *jp == '[') {
    char close = *jp == '{' ? '}' : ']';
    v->type = *jp == '{' ? 'o' : 'a';
    jp++;
    skip_ws();
    while (*jp != close) {
      v->items = realloc(v->items, (size_t)(v->n + 1) * sizeof *v->items);
      v->keys = realloc(v->keys, (size_t)(v->n + 1) * sizeof *v->keys);
      v->keys[v->n] = NULL;
      if (v->type == 'o') {
        v->keys[v->n] = parse_string();
        skip_ws();
        cr_assert_eq(*jp, ':', "JSON: ':' expected at \"%.20s\"", jp);
        jp++;
      }
      parse_value(&v->items[v->n++]);
      skip_ws();
      if (*jp == ',') jp++, skip_ws();
      else cr_assert_eq(*jp, close, "JSON: ',' or '%c' expected at \"%.20s\"", close, jp);
    }
    jp++;
  } else if (*jp == '"') {
    v->type = 's';
    v->str = parse_string();
  } else if (*jp == '-' || (*jp >= '0' && *jp <= '9')) {
    v->type = 'n';
    v->neg = *jp == '-';
    char *end;
    v->num = strtoull(jp + v->neg, &end, 10);
    jp = end;
  } else {
    v->type = 'b';
    int len = !strncmp(jp, "true", 4) || !strncmp(jp, "null", 4) ? 4 : 5;
    cr_assert(!strncmp(jp, "true", 4) || !strncmp(jp, "null", 4) || !strncmp(jp, "false", 5),
              "JSON: value expected at \"%.20s\"", jp);
    jp += len;
  }
}

static void parse_json(const char *text, jv *v) {
  jp = text;
  parse_value(v);
  skip_ws();
  cr_assert_eq(*jp, '\0', "JSON: trailing text \"%.20s\"", jp);
}

static void jv_free(jv *v) {
  for (int i = 0; i < v->n; i++) {
    free(v->keys[i]);
    jv_free(&v->items[i]);
  }
  free(v->keys);
  free(v->items);
  free(v->str);
}

static const jv *jget(const jv *o, const char *key) {
  for (int i = 0; o->type == 'o' && i < o->n; i++)
    if (!strcmp(o->keys[i], key)) return &o->items[i];
  return NULL;
}

/* ------------------------------------------------------------------ */
/* A safetensors reader (github.com/huggingface/safetensors, "Format")  */
/* ------------------------------------------------------------------ */

/* Read FILE and check it against the tensors: exactly those of `want`
 * (a bit per tensor index), in name order, bit for bit. */
static void check_safetensors(const char *path, unsigned want) {
  FILE *f = fopen(path, "rb");
  cr_assert_not_null(f, "%s", path);
  fseek(f, 0, SEEK_END);
  long size = ftell(f);
  fseek(f, 0, SEEK_SET);
  unsigned char *b = malloc((size_t)size + 1);
  cr_assert_eq(fread(b, 1, (size_t)size, f), (size_t)size);
  fclose(f);
  cr_assert_geq(size, 8);
  uint64_t n = 0;
  for (int i = 7; i >= 0; i--) n = n << 8 | b[i]; /* u64 little-endian */
  cr_assert_leq(8 + n, (uint64_t)size, "header length %llu", (unsigned long long)n);
  cr_expect_eq(n % 8, 0, "the header is padded to 8 bytes");
  char *hdr = malloc(n + 1);
  memcpy(hdr, b + 8, n);
  hdr[n] = '\0';
  cr_assert_eq(hdr[0], '{', "the header starts with '{': %s", hdr);
  jv root;
  parse_json(hdr, &root); /* padding spaces are trailing whitespace */
  cr_assert_eq(root.type, 'o');
  const jv *meta = jget(&root, "__metadata__");
  cr_assert(meta && meta->type == 'o');
  cr_expect_str_eq(jget(meta, "format")->str, "pt");
  cr_expect_str_eq(jget(meta, "step")->str, "1234");
  const unsigned char *data = b + 8 + n;
  uint64_t data_len = (uint64_t)size - 8 - n, end = 0;
  int seen = 0, last = -1;
  for (int i = 0; i < root.n; i++) {
    if (!strcmp(root.keys[i], "__metadata__")) continue;
    int t = -1;
    for (int k = 0; k < NT; k++)
      if (!strcmp(root.keys[i], tensors[k].name)) t = k;
    cr_assert(t >= 0 && (want >> t & 1), "unexpected tensor %s", root.keys[i]);
    cr_expect_gt(t, last, "tensors in name order");
    last = t;
    seen |= 1 << t;
    const jv *e = &root.items[i], *dt = jget(e, "dtype"), *sh = jget(e, "shape"),
             *off = jget(e, "data_offsets");
    cr_assert(dt && sh && off && sh->type == 'a' && off->type == 'a' && off->n == 2);
    cr_expect_str_eq(dt->str, mpg__ckpt_dtype_name(tensors[t].dtype), "%s", root.keys[i]);
    cr_assert_eq(sh->n, tensors[t].ndim);
    for (int d = 0; d < sh->n; d++) cr_expect_eq(sh->items[d].num, tensors[t].shape[d]);
    uint64_t b0 = off->items[0].num, b1 = off->items[1].num;
    cr_expect_eq(b0, end, "%s: contiguous data", root.keys[i]);
    cr_assert_eq(b1 - b0, bytes_of(t), "%s: data_offsets [%llu, %llu]", root.keys[i],
                 (unsigned long long)b0, (unsigned long long)b1);
    cr_assert_leq(b1, data_len);
    cr_expect(!memcmp(data + b0, ref[t], bytes_of(t)), "%s: data differs", root.keys[i]);
    end = b1;
  }
  cr_expect_eq((unsigned)seen, want, "tensors present %#x, want %#x", (unsigned)seen, want);
  cr_expect_eq(end, data_len, "no bytes after the last tensor");
  jv_free(&root);
  free(hdr);
  free(b);
}

/* ------------------------------------------------------------------ */
/* Tests                                                                */
/* ------------------------------------------------------------------ */

TestSuite(ckpt_export, .init = setup, .fini = teardown, .timeout = 60);

/* The line of `out` that starts with "  <name> ". */
static const char *line_of(const char *name) {
  static char line[512];
  char key[64];
  snprintf(key, sizeof key, "\n  %s ", name);
  const char *p = strstr(out, key);
  cr_assert_not_null(p, "no line for %s in:\n%s", name, out);
  p += 1;
  size_t n = strcspn(p, "\n");
  snprintf(line, sizeof line, "%.*s", (int)n, p);
  return line;
}

/* The words of a line, in order, with any spaces between. */
static void expect_words(const char *line, const char *const *words) {
  const char *p = line;
  for (int i = 0; words[i]; i++) {
    const char *q = strstr(p, words[i]);
    cr_expect_not_null(q, "\"%s\" not in order in \"%s\"", words[i], line);
    if (q) p = q + strlen(words[i]);
  }
}

Test(ckpt_export, info_lists_the_checkpoint) {
  build(-1);
  char args[256];
  snprintf(args, sizeof args, "info '%s'", dir);
  cr_assert_eq(ckpt(args), 0, "%s", out);
  cr_expect(strstr(out, "mesh        dp=2,tp=3 sync=shard\n"), "%s", out);
  cr_expect(strstr(out, "step        1234\n"), "%s", out);
  cr_expect(strstr(out, "world size  6\n"), "%s", out);
  cr_expect(strstr(out, "format      version 1, checksum blocks of 12 bytes"), "%s", out);
  cr_expect(strstr(out, "files       3, "), "%s", out);
  cr_expect(strstr(out, "\n  data-00005.bin  "), "%s", out);
  expect_words(line_of("emb.w"), (const char *const[]){"emb.w", "F32", "param", "[6, 10]",
                                                        " 5 ", " 240", NULL});
  expect_words(line_of("h.bias"), (const char *const[]){"BF16", "param", "[10]", " 2 ", " 20",
                                                         NULL});
  expect_words(line_of("opt.m"), (const char *const[]){"F32", "state", "[6, 10]", " 1 ", " 240",
                                                        NULL});
  expect_words(line_of("pos.idx"), (const char *const[]){"I64", "param", "[2, 3, 4]", " 2 ",
                                                          " 192", NULL});
  expect_words(line_of("trainer"), (const char *const[]){"U8", "bytes", "[37]", " 1 ", " 37",
                                                          NULL});
  /* aligned: every tensor line has its dtype in the same column */
  const char *names[] = {"emb.w", "h.bias", "opt.m", "pos.idx", "trainer"};
  long col = -1;
  for (int i = 0; i < NT; i++) {
    const char *l = line_of(names[i]);
    long c = (long)(strpbrk(l + 2 + strlen(names[i]), "FBIU") - l);
    if (col < 0) col = c;
    cr_expect_eq(c, col, "dtype column of %s", names[i]);
  }
  cr_expect(strstr(out, "total       5 tensors (3 param, 1 state, 1 bytes), 11 chunks, 729 bytes"),
            "%s", out);
}

Test(ckpt_export, info_json) {
  build(-1);
  char args[256];
  snprintf(args, sizeof args, "info --json '%s'", dir);
  cr_assert_eq(ckpt(args), 0, "%s", out);
  jv root;
  parse_json(out, &root);
  cr_expect_str_eq(jget(&root, "mesh")->str, "dp=2,tp=3 sync=shard");
  cr_expect_eq(jget(&root, "step")->num, 1234);
  cr_expect_eq(jget(&root, "world_size")->num, 6);
  cr_expect_eq(jget(&root, "version")->num, 1);
  cr_expect_eq(jget(&root, "files")->n, 3);
  cr_expect_eq(jget(&jget(&root, "files")->items[2], "rank")->num, 5);
  const jv *ts = jget(&root, "tensors");
  cr_assert_eq(ts->n, NT);
  for (int t = 0; t < NT; t++) {
    const jv *e = &ts->items[t];
    cr_expect_str_eq(jget(e, "name")->str, tensors[t].name);
    cr_expect_str_eq(jget(e, "dtype")->str, mpg__ckpt_dtype_name(tensors[t].dtype));
    cr_expect_eq(jget(e, "shape")->n, tensors[t].ndim);
    cr_expect_eq(jget(e, "bytes")->num, bytes_of(t));
  }
  cr_expect_str_eq(jget(&ts->items[2], "kind")->str, "state");
  cr_expect_eq(jget(&ts->items[0], "chunks")->num, 5);
  const jv *tot = jget(&root, "total");
  cr_expect_eq(jget(tot, "tensors")->num, 5);
  cr_expect_eq(jget(tot, "chunks")->num, 11);
  cr_expect_eq(jget(tot, "bytes")->num, 729);
  cr_expect_eq(jget(jget(tot, "kinds"), "param")->num, 3);
  jv_free(&root);
}

Test(ckpt_export, export_params_bit_for_bit) {
  build(-1);
  char args[512];
  snprintf(args, sizeof args, "export '%s' --safetensors '%s'", dir, st_path);
  cr_assert_eq(ckpt(args), 0, "%s", out);
  cr_expect(strstr(out, "3 tensors, 452 bytes of data (step 1234)"), "%s", out);
  check_safetensors(st_path, 1u << 0 | 1u << 1 | 1u << 3);
}

Test(ckpt_export, export_all_bit_for_bit) {
  build(-1);
  char args[512];
  snprintf(args, sizeof args, "export '%s' --all --safetensors '%s'", dir, st_path);
  cr_assert_eq(ckpt(args), 0, "%s", out);
  check_safetensors(st_path, (1u << NT) - 1);
}

Test(ckpt_export, corrupted_byte_names_tensor_and_file) {
  build(-1);
  /* emb.w's second chunk is the first data of file B (rank 1), at byte 3:
   * flip byte 5, in checksum block 0 of that chunk */
  char path[128], args[512];
  mpg__ckpt_data_path(dir, 1, path, sizeof path);
  FILE *f = fopen(path, "r+b");
  cr_assert_not_null(f);
  fseek(f, 5, SEEK_SET);
  int c = fgetc(f);
  fseek(f, 5, SEEK_SET);
  fputc(c ^ 0x10, f);
  fclose(f);
  snprintf(args, sizeof args, "export '%s' --safetensors '%s'", dir, st_path);
  cr_assert_eq(ckpt(args), 1, "%s", out);
  cr_expect(!strncmp(out, "meshpg ckpt: tensor emb.w: checksum mismatch in ", 48), "%s", out);
  cr_expect(strstr(out, "/data-00001.bin at byte offset 3 (block 0 of chunk 1"), "%s", out);
  cr_expect_eq(strchr(out, '\n') - out, (long)strlen(out) - 1, "one line: %s", out);
  cr_expect_neq(access(st_path, F_OK), 0, "no partial safetensors file");
  /* info reads the metadata only */
  snprintf(args, sizeof args, "info '%s'", dir);
  cr_expect_eq(ckpt(args), 0, "%s", out);
}

Test(ckpt_export, uncovered_elements_name_the_tensor) {
  build(3); /* emb.w without its box at (3, 0) */
  char args[512];
  snprintf(args, sizeof args, "export '%s' --safetensors '%s'", dir, st_path);
  cr_assert_eq(ckpt(args), 1, "%s", out);
  cr_expect(strstr(out, "meshpg ckpt: tensor emb.w: 12 of its 60 elements are in no chunk, the "
                        "first at [3, 0]"), "%s", out);
  cr_expect_neq(access(st_path, F_OK), 0);
}

Test(ckpt_export, truncated_and_missing_files) {
  build(-1);
  char path[128], args[512];
  snprintf(args, sizeof args, "export '%s' --safetensors '%s'", dir, st_path);
  mpg__ckpt_data_path(dir, 5, path, sizeof path);
  cr_assert_eq(truncate(path, 20), 0);
  cr_assert_eq(ckpt(args), 1, "%s", out);
  cr_expect(strstr(out, "meshpg ckpt: tensor emb.w: ") && strstr(out, "data-00005.bin is truncated"),
            "%s", out);
  unlink(path);
  cr_assert_eq(ckpt(args), 1, "%s", out);
  cr_expect(strstr(out, "cannot open ") && strstr(out, "data-00005.bin: No such file"), "%s",
            out);
}

Test(ckpt_export, not_a_checkpoint) {
  char args[512];
  snprintf(args, sizeof args, "info '%s'", dir);
  cr_assert_eq(ckpt(args), 1, "%s", out);
  char want[160];
  snprintf(want, sizeof want, "meshpg ckpt: %s is not a checkpoint: no meta.mpgc\n", dir);
  cr_expect_str_eq(out, want);
  snprintf(args, sizeof args, "export '%s/nothing' --safetensors '%s'", dir, st_path);
  cr_assert_eq(ckpt(args), 1, "%s", out);
  cr_expect(strstr(out, "is not a checkpoint: no meta.mpgc"), "%s", out);
  /* corrupted metadata: the decoder's message, naming the file */
  build(-1);
  char path[128];
  snprintf(path, sizeof path, "%s/meta.mpgc", dir);
  cr_assert_eq(truncate(path, 100), 0);
  snprintf(args, sizeof args, "info '%s'", dir);
  cr_assert_eq(ckpt(args), 1, "%s", out);
  cr_expect(strstr(out, "meta.mpgc: length field "), "%s", out);
}

/* `meshpg ckpt ARGS`: its exit code and what its output holds. */
static const cli_row usage_rows[] = {
    {.args = "", .code = 2},
    {"frobnicate x", 2, {"unknown subcommand \"frobnicate\""}},
    {.args = "info", .code = 2},
    {.args = "info a b", .code = 2},
    {.args = "info a --all", .code = 2},
    {"export a", 2, {"export needs --safetensors FILE"}},
    {.args = "export a --safetensors", .code = 2},
    {"--help", 0, {"--safetensors FILE", "--json", "--all"}},
    {.args = "export --help", .code = 0},
};
Test(ckpt_export, usage_errors) { CLI_ROWS(usage_rows, ckpt, 0); }
