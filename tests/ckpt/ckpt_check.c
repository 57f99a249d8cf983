/* Resharding checks of the checkpoints: see ckpt_check.h. */
#include "ckpt_check.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../support/mesh_util.h"

/* ------------------------------------------------------------------ */
/* Random cases                                                        */
/* ------------------------------------------------------------------ */

static uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

static unsigned rnd(uint64_t *s) {
  *s = mix64(*s);
  return (unsigned)(*s >> 33);
}

uint64_t ck_bits(int t, size_t g, int version) {
  return mix64(((uint64_t)(unsigned)t << 48) ^ ((uint64_t)(unsigned)version << 40) ^
               (uint64_t)g);
}

size_t ck_esize(const ck_tensor *t) { return t->bytes ? 1 : mpg_dtype_size(t->dtype); }

static size_t elems_of(const size_t *shape, int ndim) {
  size_t n = 1;
  for (int a = 0; a < ndim; a++) n *= shape[a];
  return n;
}

size_t ck_case_bytes(const ck_case *c) {
  size_t b = 0;
  for (int t = 0; t < c->ntensors; t++)
    b += elems_of(c->t[t].shape, c->t[t].ndim) * ck_esize(&c->t[t]);
  return b;
}

static void append(char *buf, size_t cap, const char *fmt, ...) {
  size_t n = strlen(buf);
  if (n >= cap) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf + n, cap - n, fmt, ap);
  va_end(ap);
}

/* The mesh: pp, dp (or dp_replicate, dp_shard), cp, tp with the world's
 * prime factors dealt at random, in a random order; dp_cp flattened. */
static void mesh_dims(ck_mesh *m, uint64_t *s, int world, int *hsdp) {
  const char *names[5] = {"pp", "dp", "cp", "tp", NULL};
  int size[5] = {1, 1, 1, 1, 1}, nd = 4;
  *hsdp = rnd(s) % 3 == 0;
  if (*hsdp) {
    names[1] = "dp_replicate";
    names[4] = "dp_shard";
    nd = 5;
  }
  int w = world;
  for (int f = 2; w > 1; f++)
    while (w % f == 0) {
      size[rnd(s) % (unsigned)nd] *= f;
      w /= f;
    }
  int perm[5] = {0, 1, 2, 3, 4};
  for (int k = nd - 1; k > 0; k--) {
    int j = (int)(rnd(s) % (unsigned)(k + 1)), x = perm[k];
    perm[k] = perm[j];
    perm[j] = x;
  }
  m->dims[0] = '\0';
  snprintf(m->flatten, sizeof m->flatten, "dp_cp=");
  int first = 1;
  for (int k = 0; k < nd; k++) {
    const char *nm = names[perm[k]];
    append(m->dims, sizeof m->dims, "%s%s=%d", k ? "," : "", nm, size[perm[k]]);
    if (strcmp(nm, "pp") && strcmp(nm, "tp")) {
      append(m->flatten, sizeof m->flatten, "%s%s", first ? "" : ",", nm);
      first = 0;
    }
    if (!strcmp(nm, "pp")) m->pp = size[perm[k]];
    if (!strcmp(nm, "tp")) m->tp = size[perm[k]];
  }
  m->world = world;
}

static void mesh_make(ck_mesh *m, uint64_t *s, int world) {
  memset(m, 0, sizeof *m);
  int hsdp;
  mesh_dims(m, s, world, &hsdp);
  static const char *const plain[][2] = {{"", ""}, {"dp", "cp"}, {"cp", "dp"}, {"dp", ""}};
  static const char *const hs[][2] = {
      {"dp_shard,cp", "dp_replicate"}, {"dp_shard", "dp_replicate,cp"}, {"", ""}};
  m->sync_mode = rnd(s) % 4 == 0 ? MPG_SYNC_REPLICATE : MPG_SYNC_SHARD;
  if (m->sync_mode == MPG_SYNC_SHARD) {
    const char *const *pick = hsdp ? hs[rnd(s) % 3] : plain[rnd(s) % 4];
    snprintf(m->shard_dims, sizeof m->shard_dims, "%s", pick[0]);
    snprintf(m->replicate_dims, sizeof m->replicate_dims, "%s", pick[1]);
  }
  m->bucket_mb = rnd(s) % 2 ? 25.0 : 0.0005 + (double)(rnd(s) % 50) * 0.0001;
  static const size_t blocks[3] = {4096, 8192, (size_t)1 << 20};
  m->block_bytes = blocks[rnd(s) % 3];
}

/* How mesh m holds tensor t (after the tensors exist). */
static void mesh_assign(ck_mesh *m, const ck_tensor *t, int k, uint64_t *s) {
  m->stage[k] = t->bytes ? 0 : (int)(rnd(s) % (unsigned)m->pp);
  m->axis[k] = (int)(rnd(s) % (unsigned)t->ndim);
  m->split[k] = t->split_axis >= 0 && rnd(s) % 2;
  if (t->bytes) {
    m->mode[k] = CK_WHOLE;
    return;
  }
  unsigned r = rnd(s) % (t->kind == MPG_CKPT_STATE ? 6u : 3u);
  m->mode[k] = r >= 3 ? CK_STATE : (ck_mode)r;
  m->norm[k] = m->mode[k] == CK_STATE && !m->split[k] && rnd(s) % 3 == 0;
}

static int gcd(int a, int b) { return b ? gcd(b, a % b) : a; }

static void tensor_make(ck_tensor *t, int k, uint64_t *s, int lcm_tp, int big) {
  static const mpg_dtype dts[6] = {MPG_F32, MPG_F64, MPG_F16, MPG_BF16, MPG_I32, MPG_I64};
  static const char *const words[6] = {"fc.w", "attn.qkv", "norm", "exp_avg", "emb", "b"};
  /* a random first letter: the bytewise name order is not the index order */
  snprintf(t->name, sizeof t->name, "%c%d.%s", 'a' + (int)(rnd(s) % 26), k,
           words[rnd(s) % 6]);
  t->dtype = dts[rnd(s) % 6];
  t->kind = rnd(s) % 2 ? MPG_CKPT_STATE : MPG_CKPT_PARAM;
  t->ndim = 1 + (int)(rnd(s) % 3);
  for (int a = 0; a < t->ndim; a++) t->shape[a] = 1 + rnd(s) % 9;
  if (big && rnd(s) % 3 == 0) t->shape[0] = 200 + rnd(s) % 2000;
  t->split_axis = -1;
  if (rnd(s) % 3) {
    t->split_axis = (int)(rnd(s) % (unsigned)t->ndim);
    t->shape[t->split_axis] = (size_t)lcm_tp * (1 + rnd(s) % 4);
  }
}

void ck_case_make(ck_case *c, unsigned seed, int ws, int wl, int big) {
  memset(c, 0, sizeof *c);
  c->seed = seed;
  uint64_t s = (uint64_t)seed * 0x2545f4914f6cdd1dull + 7;
  mesh_make(&c->mesh[0], &s, ws);
  mesh_make(&c->mesh[1], &s, wl);
  int a = c->mesh[0].tp, b = c->mesh[1].tp, lcm_tp = a / gcd(a, b) * b;
  int nt = 2 + (int)(rnd(&s) % 8);
  for (int k = 0; k < nt; k++) tensor_make(&c->t[k], k, &s, lcm_tp, big);
  ck_tensor *bt = &c->t[nt]; /* the trainer's bytes */
  snprintf(bt->name, sizeof bt->name, "trainer");
  bt->bytes = 1;
  bt->kind = MPG_CKPT_BYTES;
  bt->ndim = 1;
  bt->shape[0] = 1 + rnd(&s) % 100;
  bt->split_axis = -1;
  c->ntensors = nt + 1;
  for (int w = 0; w < 2; w++)
    for (int k = 0; k < c->ntensors; k++) mesh_assign(&c->mesh[w], &c->t[k], k, &s);
}

void ck_mesh_plain(ck_mesh *m, const char *dims, const char *flatten, int world,
                   int ntensors) {
  memset(m, 0, sizeof *m);
  snprintf(m->dims, sizeof m->dims, "%s", dims);
  snprintf(m->flatten, sizeof m->flatten, "%s", flatten ? flatten : "");
  m->world = world;
  m->pp = 1;
  m->tp = 1;
  m->sync_mode = MPG_SYNC_SHARD;
  m->bucket_mb = 25.0;
  m->block_bytes = 4096;
  for (int k = 0; k < ntensors && k < CK_MAX_T; k++) m->mode[k] = CK_WHOLE;
}

void ck_mesh_describe(const ck_case *c, const ck_mesh *m, char *buf, size_t cap) {
  static const char *const mn[4] = {"whole", "box", "range", "state"};
  buf[0] = '\0';
  append(buf, cap, "mesh %s (%s), sync %s(\"%s\" \"%s\"), block %zu:", m->dims, m->flatten,
         m->sync_mode == MPG_SYNC_SHARD ? "shard" : "replicate", m->shard_dims,
         m->replicate_dims, m->block_bytes);
  for (int k = 0; k < c->ntensors; k++) {
    const ck_tensor *t = &c->t[k];
    append(buf, cap, " %s[", t->name);
    for (int a = 0; a < t->ndim; a++) append(buf, cap, "%s%zu", a ? "x" : "", t->shape[a]);
    append(buf, cap, "]%s:%s%s%s@pp%d", t->bytes ? "u8" : mpg_dtype_name(t->dtype),
           mn[m->mode[k]], m->split[k] ? "/tp" : "", m->norm[k] ? "/norm" : "", m->stage[k]);
    if (m->mode[k] == CK_BOX) append(buf, cap, "/axis%d", m->axis[k]);
  }
}

/* ------------------------------------------------------------------ */
/* A rank's registrations                                              */
/* ------------------------------------------------------------------ */

static mpg_status failf(ck_rank *s, mpg_status st, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(s->msg, sizeof s->msg, fmt, ap);
  va_end(ap);
  return st;
}

#define CK_TRY(call)                                                                  \
  do {                                                                                \
    mpg_status st_ = (call);                                                          \
    if (st_ != MPG_OK)                                                                \
      return failf(s, st_, "rank %d: %s:%d: %s -> %s: %s", s->rank, __FILE__, __LINE__, \
                   #call, mpg_status_name(st_), mpg_last_error());                    \
  } while (0)

/* Position and size of this rank in its group of dim set `name`. */
static mpg_status group_pos(ck_rank *s, const char *name, int *pos, int *size) {
  int set;
  CK_TRY(mpg_mesh_dimset_find(s->mesh, name, &set));
  CK_TRY(mpg_mesh_group_of(s->mesh, set, s->rank, NULL, pos, size));
  return MPG_OK;
}

/* Part `pos` of `total` cut into `n` uneven parts (weights 1..3 from the
 * tensor): [*lo, *hi). */
static void uneven_part(const ck_case *c, int t, size_t total, int n, int pos, size_t *lo,
                        size_t *hi) {
  size_t w[CK_MAX_RANKS + 1], sum = 0, before = 0;
  for (int i = 0; i < n; i++) {
    w[i] = 1 + mix64((uint64_t)c->seed * 131 + (uint64_t)t * 17 + (uint64_t)i) % 3;
    sum += w[i];
    if (i < pos) before += w[i];
  }
  *lo = total * before / sum;
  *hi = total * (before + w[pos]) / sum;
}

static mpg_status alloc_reg(ck_rank *s, ck_reg *g, size_t base_elems, size_t piece_at) {
  g->alloc_elems = CK_GUARD_ELEMS + base_elems + CK_GUARD_ELEMS;
  g->piece_at = CK_GUARD_ELEMS + piece_at;
  g->alloc = malloc(g->alloc_elems * g->esize);
  if (!g->alloc) return failf(s, MPG_ERR_NOMEM, "rank %d: out of memory", s->rank);
  memset(g->alloc, CK_GUARD, g->alloc_elems * g->esize);
  memset(g->alloc + g->piece_at * g->esize, 0, g->n * g->esize);
  return MPG_OK;
}

/* The box of tensor k under the mesh (whole, or cut over tp) into g and
 * the layout. */
static mpg_status box_of(ck_rank *s, int k, ck_reg *g, mpg_tensor_layout *lay) {
  const ck_tensor *t = &s->c->t[k];
  lay->ndim = t->ndim;
  lay->kind = t->kind;
  for (int a = 0; a < t->ndim; a++) {
    lay->shape[a] = t->shape[a];
    g->box_off[a] = 0;
    g->box_shape[a] = t->shape[a];
  }
  if (s->m->split[k]) {
    int pos, size, a = t->split_axis;
    mpg_status st = group_pos(s, "tp", &pos, &size);
    if (st) return st;
    lay->split_dims = "tp";
    lay->split_axis = a;
    g->box_shape[a] = t->shape[a] / (size_t)size;
    g->box_off[a] = (size_t)pos * g->box_shape[a];
  }
  return MPG_OK;
}

static ck_reg *new_reg(ck_rank *s, int k) {
  ck_reg *g = &s->reg[s->nreg];
  memset(g, 0, sizeof *g);
  g->t = k;
  g->esize = ck_esize(&s->c->t[k]);
  return g;
}

/* CK_WHOLE, CK_BOX, CK_RANGE and the trainer's bytes. */
static mpg_status reg_plain(ck_rank *s, int k) {
  const ck_tensor *t = &s->c->t[k];
  const ck_mesh *m = s->m;
  ck_reg *g = new_reg(s, k);
  mpg_tensor_layout lay = MPG_TENSOR_LAYOUT_INIT;
  mpg_status st = box_of(s, k, g, &lay);
  if (st) return st;
  g->n = elems_of(g->box_shape, t->ndim);
  int pos = 0, size = 1;
  if (m->mode[k] == CK_BOX || m->mode[k] == CK_RANGE)
    if ((st = group_pos(s, "dp_cp", &pos, &size))) return st;
  if (m->skip[k] == 2 && pos != 0) return MPG_OK;
  size_t lo, hi;
  if (m->mode[k] == CK_BOX) { /* the box (maybe a tp part) cut over dp_cp */
    int a = m->axis[k];
    uneven_part(s->c, k, g->box_shape[a], size, pos, &lo, &hi);
    if (lo == hi) return MPG_OK; /* an empty part: nothing to register */
    g->box_off[a] += lo;
    g->box_shape[a] = hi - lo;
    g->n = elems_of(g->box_shape, t->ndim);
    lay.split_dims = NULL;
    lay.split_axis = -1;
    for (int x = 0; x < t->ndim; x++) {
      lay.box_offset[x] = g->box_off[x];
      lay.box_shape[x] = g->box_shape[x];
    }
  } else if (m->mode[k] == CK_RANGE) {
    uneven_part(s->c, k, g->n, size, pos, &lo, &hi);
    if (lo == hi) return MPG_OK;
    g->range_off = lay.range_offset = lo;
    g->n = lay.range_count = hi - lo;
  }
  if ((st = alloc_reg(s, g, g->n, 0))) return st;
  void *data = g->alloc + g->piece_at * g->esize;
  if (t->bytes)
    CK_TRY(mpg_ckpt_add_bytes(s->ck, t->name, data, g->n));
  else
    CK_TRY(mpg_ckpt_add(s->ck, t->name, t->dtype, &lay, data, NULL));
  s->nreg++;
  return MPG_OK;
}

/* CK_STATE: sync param `pid`'s optimizer state. */
static mpg_status reg_state(ck_rank *s, int k, int pid) {
  const ck_tensor *t = &s->c->t[k];
  ck_reg *g = new_reg(s, k);
  mpg_tensor_layout lay = MPG_TENSOR_LAYOUT_INIT;
  mpg_status st = box_of(s, k, g, &lay);
  if (st) return st;
  size_t box_n = elems_of(g->box_shape, t->ndim), base = box_n, at = 0;
  g->n = box_n;
  if (s->m->sync_mode == MPG_SYNC_SHARD) {
    mpg_sync_stats stats = MPG_SYNC_STATS_INIT;
    mpg_shard_info info = MPG_SHARD_INFO_INIT;
    CK_TRY(mpg_sync_get_stats(s->sync, &stats));
    CK_TRY(mpg_sync_get_shard(s->sync, pid, &info));
    base = stats.shard_elems;
    at = info.shard_offset;
    g->range_off = info.param_offset;
    g->n = info.count;
  }
  if ((st = alloc_reg(s, g, base, at))) return st;
  CK_TRY(mpg_ckpt_add_state(s->ck, t->name, t->dtype, &lay, s->sync, pid,
                            g->alloc + CK_GUARD_ELEMS * g->esize));
  s->nreg++;
  return MPG_OK;
}

/* This rank's pipeline stage (its pp coordinate; 0 without pp). */
static mpg_status my_stage(ck_rank *s, int *stage) {
  int coord[MPG_MAX_DIMS];
  *stage = 0;
  CK_TRY(mpg_mesh_coord_of(s->mesh, s->rank, coord));
  for (int d = 0; d < mpg_mesh_ndims(s->mesh); d++) {
    const char *name;
    CK_TRY(mpg_mesh_dim(s->mesh, d, &name, NULL));
    if (!strcmp(name, "pp")) *stage = coord[d];
  }
  return MPG_OK;
}

/* The sync (when the mesh holds any tensor as CK_STATE; collective): a
 * dummy param, then this stage's CK_STATE tensors' params (pid[k]). */
static mpg_status make_sync(ck_rank *s, int stage, int *pid) {
  const ck_mesh *m = s->m;
  int any = 0;
  for (int k = 0; k < s->c->ntensors; k++) any |= m->mode[k] == CK_STATE;
  if (!any) return MPG_OK;
  mpg_sync_opts so = MPG_SYNC_OPTS_INIT;
  so.sync.mode = m->sync_mode;
  snprintf(so.sync.shard_dims, sizeof so.sync.shard_dims, "%s", m->shard_dims);
  snprintf(so.sync.replicate_dims, sizeof so.sync.replicate_dims, "%s", m->replicate_dims);
  so.sync.bucket_mb = m->bucket_mb;
  so.sync.first_bucket_mb = m->bucket_mb < 1 ? m->bucket_mb : 1.0;
  CK_TRY(mpg_sync_create(s->ctx, &so, &s->sync));
  int id;
  CK_TRY(mpg_sync_add_param(s->sync, "dummy", 64, MPG_F32, NULL, &id));
  for (int k = 0; k < s->c->ntensors; k++) {
    if (m->mode[k] != CK_STATE || m->stage[k] != stage || m->skip[k] == 1) continue;
    ck_reg g;
    mpg_tensor_layout lay = MPG_TENSOR_LAYOUT_INIT;
    mpg_status st = box_of(s, k, &g, &lay);
    if (st) return st;
    mpg_param_opts po = MPG_PARAM_OPTS_INIT;
    po.reduce_dims = m->norm[k] ? "dp_cp,tp" : NULL;
    char name[64];
    snprintf(name, sizeof name, "p.%s", s->c->t[k].name);
    CK_TRY(mpg_sync_add_param(s->sync, name, elems_of(g.box_shape, s->c->t[k].ndim),
                              MPG_F32, &po, &pid[k]));
  }
  CK_TRY(mpg_sync_commit(s->sync));
  return MPG_OK;
}

mpg_status ck_open(ck_rank *s, const mpg_init_opts *opts, const ck_case *c, const ck_mesh *m,
                   const mpg_ckpt_opts *co) {
  memset(s, 0, sizeof *s);
  s->c = c;
  s->m = m;
  s->rank = opts->rank;
  CK_TRY(mesh_build(m->dims, m->flatten, m->world, &s->mesh));
  CK_TRY(mpg_ctx_create(s->mesh, opts, &s->ctx));
  s->rank = mpg_ctx_rank(s->ctx);
  s->world = mpg_ctx_world_size(s->ctx);
  int stage, pid[CK_MAX_T];
  mpg_status st = my_stage(s, &stage);
  if (!st) st = make_sync(s, stage, pid);
  if (st) return st;
  mpg_ckpt_opts o = MPG_CKPT_OPTS_INIT;
  o.timeout_s = 120;
  o.block_bytes = m->block_bytes ? m->block_bytes : o.block_bytes;
  CK_TRY(mpg_ckpt_create(s->ctx, co ? co : &o, &s->ck));
  for (int k = 0; k < c->ntensors && !st; k++) {
    if (m->skip[k] == 1 || (!c->t[k].bytes && m->stage[k] != stage)) continue;
    st = m->mode[k] == CK_STATE ? reg_state(s, k, pid[k]) : reg_plain(s, k);
  }
  return st;
}

void ck_close(ck_rank *s) {
  if (s->ck) mpg_ckpt_destroy(s->ck);
  if (s->sync) mpg_sync_destroy(s->sync);
  if (s->ctx) mpg_ctx_destroy(s->ctx);
  mpg_mesh_destroy(s->mesh);
  for (int i = 0; i < s->nreg; i++) free(s->reg[i].alloc);
  s->ck = NULL;
  s->sync = NULL;
  s->ctx = NULL;
  s->mesh = NULL;
  s->nreg = 0;
}

/* ------------------------------------------------------------------ */
/* Values                                                              */
/* ------------------------------------------------------------------ */

/* Walks a piece's elements in order: their global indices, without a
 * division per element. */
typedef struct walk {
  const ck_tensor *t;
  const ck_reg *g;
  size_t idx[3];
} walk;

static void walk_init(walk *w, const ck_tensor *t, const ck_reg *g) {
  w->t = t;
  w->g = g;
  size_t j = g->range_off;
  for (int a = t->ndim - 1; a >= 0; a--) {
    w->idx[a] = j % g->box_shape[a];
    j /= g->box_shape[a];
  }
}

static size_t walk_global(const walk *w) {
  size_t gi = 0;
  for (int a = 0; a < w->t->ndim; a++) gi = gi * w->t->shape[a] + w->g->box_off[a] + w->idx[a];
  return gi;
}

static void walk_next(walk *w) {
  for (int a = w->t->ndim - 1; a >= 0; a--) {
    if (++w->idx[a] < w->g->box_shape[a]) return;
    w->idx[a] = 0;
  }
}

/* The expected bytes of the element at the walk's position. */
static void want_bytes(const ck_reg *g, const walk *w, int version, unsigned char *out) {
  if (version < 0) {
    memset(out, -version - 1, g->esize);
    return;
  }
  uint64_t b = ck_bits(g->t, walk_global(w), version);
  memcpy(out, &b, g->esize); /* little-endian hosts */
}

void ck_fill(ck_rank *s, int version) {
  for (int r = 0; r < s->nreg; r++) {
    ck_reg *g = &s->reg[r];
    unsigned char *p = g->alloc + g->piece_at * g->esize;
    walk w;
    walk_init(&w, &s->c->t[g->t], g);
    for (size_t i = 0; i < g->n; i++, walk_next(&w)) want_bytes(g, &w, version, p + i * g->esize);
  }
}

void ck_set_bytes(ck_rank *s, unsigned char byte) {
  for (int r = 0; r < s->nreg; r++) {
    ck_reg *g = &s->reg[r];
    memset(g->alloc + g->piece_at * g->esize, byte, g->n * g->esize);
  }
}

static int check_reg(ck_rank *s, const ck_reg *g, int version) {
  const ck_tensor *t = &s->c->t[g->t];
  size_t lo = g->piece_at * g->esize, hi = lo + g->n * g->esize;
  for (size_t b = 0; b < g->alloc_elems * g->esize; b++)
    if ((b < lo || b >= hi) && g->alloc[b] != CK_GUARD) {
      snprintf(s->msg, sizeof s->msg,
               "rank %d: tensor %s: guard byte %zd (relative to the piece's start) is 0x%02x: "
               "written outside the %zu registered elements",
               s->rank, t->name, (ptrdiff_t)b - (ptrdiff_t)lo, g->alloc[b], g->n);
      return -1;
    }
  unsigned char want[8];
  walk w;
  walk_init(&w, t, g);
  for (size_t i = 0; i < g->n; i++, walk_next(&w)) {
    const unsigned char *p = g->alloc + lo + i * g->esize;
    want_bytes(g, &w, version, want);
    if (memcmp(p, want, g->esize) == 0) continue;
    uint64_t got = 0, exp = 0;
    memcpy(&got, p, g->esize);
    memcpy(&exp, want, g->esize);
    size_t gi = walk_global(&w);
    snprintf(s->msg, sizeof s->msg,
             "rank %d: tensor %s (%s, %d axes) element %zu of the piece (global index %zu, "
             "range offset %zu, box offset %zu,%zu,%zu): bits 0x%llx, expected 0x%llx "
             "(version %d)",
             s->rank, t->name, t->bytes ? "u8" : mpg_dtype_name(t->dtype), t->ndim, i, gi,
             g->range_off, g->box_off[0], g->box_off[1], g->box_off[2],
             (unsigned long long)got, (unsigned long long)exp, version);
    return -1;
  }
  return 0;
}

int ck_check(ck_rank *s, int version) {
  for (int r = 0; r < s->nreg; r++)
    if (check_reg(s, &s->reg[r], version)) return -1;
  return 0;
}

/* ------------------------------------------------------------------ */
/* Jobs                                                                */
/* ------------------------------------------------------------------ */

static double mono_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The save or load itself; 0, or -1 with s->msg. */
static int job_call(ck_rank *s, ck_job *j, int r) {
  mpg_status st;
  long step = -1;
  double t0 = mono_s();
  if (j->which == 0) {
    ck_fill(s, j->version);
    if (j->before) j->before(s, j);
    st = mpg_ckpt_save(s->ck, j->dir, j->step, NULL);
    if (st == MPG_OK && j->async) {
      ck_fill(s, j->version + 1000); /* the checkpoint must keep the old values */
      st = mpg_ckpt_wait(s->ck);
    }
  } else {
    if (j->expect != MPG_OK) ck_set_bytes(s, CK_POISON);
    if (j->before) j->before(s, j);
    st = mpg_ckpt_load(s->ck, j->dir, &step, NULL);
  }
  j->secs[r] = mono_s() - t0;
  snprintf(j->err[r], sizeof j->err[r], "%s", st ? mpg_last_error() : "");
  const char *what = j->which ? "mpg_ckpt_load" : j->async ? "mpg_ckpt_save + wait"
                                                            : "mpg_ckpt_save";
  if (st != j->expect) {
    snprintf(s->msg, sizeof s->msg, "rank %d: %s(%s) -> %s, expected %s: %s", s->rank, what,
             j->dir, mpg_status_name(st), mpg_status_name(j->expect), j->err[r]);
    return -1;
  }
  if (j->which == 0) return 0;
  j->got_step[r] = step;
  if (j->version == CK_BY_STEP) return ck_check(s, st == MPG_OK ? (int)step : -CK_POISON - 1);
  if (st == MPG_OK && step != j->step) {
    snprintf(s->msg, sizeof s->msg, "rank %d: load(%s) gave step %ld, expected %ld", s->rank,
             j->dir, step, j->step);
    return -1;
  }
  /* after a failed load every buffer is as it was */
  return ck_check(s, st == MPG_OK ? j->version : -CK_POISON - 1);
}

mpg_status ck_job_rank(const mpg_init_opts *opts, ck_job *j) {
  int r = opts->rank;
  ck_rank *s = calloc(1, sizeof *s);
  if (!s) return MPG_ERR_NOMEM;
  mpg_status rc = ck_open(s, opts, j->c, &j->c->mesh[j->which], NULL);
  if (rc == MPG_OK && job_call(s, j, r) != 0) rc = MPG_ERR_STATE;
  if (rc != MPG_OK) {
    snprintf(j->msg[r], sizeof j->msg[r], "%s", s->msg);
    if (s->ctx) mpg_ctx_abort(s->ctx); /* peers stop waiting for this rank */
  }
  ck_close(s);
  free(s);
  j->st[r] = rc;
  return rc;
}

mpg_status ck_job_thread(const mpg_init_opts *opts, void *arg) {
  return ck_job_rank(opts, arg);
}

const char *ck_job_failures(const ck_job *j, int world, char *buf, size_t cap) {
  buf[0] = '\0';
  for (int r = 0; r < world; r++)
    if (j->st[r] != MPG_OK) append(buf, cap, "\n  rank %d: %s", r, j->msg[r]);
  return buf;
}
