/* test_sync_shm's cases (test_sync_shm.h): random values, random and
 * fixed cases, one rank's steps and their reference, and the run with the
 * shared path on against the run with it off. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../support/time_bound.h"
#include "shard_check.h"
#include "../support/clock.h"
#include "../support/mesh_util.h"
#include "../support/rank_check.h"
#include "test_sync_shm.h"

/* ------------------------------------------------------------------ */
/* Random values                                                       */
/* ------------------------------------------------------------------ */

/* vsnprintf through a helper (GCC's -Wformat-truncation would flag the
 * intended truncation of long messages). */
void put_msg(char *buf, size_t size, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, size, fmt, ap);
  va_end(ap);
}

static uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/* A non-integer value in [-3, 3) with a full mantissa, a function of its
 * coordinates only (so both runs write the same gradients). */
static double gen(unsigned seed, int rank, int p, int step, int mb, size_t i) {
  uint64_t h = mix64(((uint64_t)seed << 32) ^ (uint64_t)(unsigned)rank);
  h = mix64(h ^ ((uint64_t)(unsigned)p << 40) ^ ((uint64_t)(unsigned)step << 20) ^
            (uint64_t)(unsigned)mb);
  h = mix64(h ^ (uint64_t)i);
  return ((double)(h >> 11) * 0x1p-53 - 0.5) * 6.0;
}

/* ------------------------------------------------------------------ */
/* Cases                                                               */
/* ------------------------------------------------------------------ */

/* One recorded piece of a rank's results, to name a difference. */
typedef struct pc_seg {
  int step, param, is_param; /* is_param: the gathered param, else the grad */
  size_t at, bytes, first;   /* blob offset, length, first element */
} pc_seg;

#define PC_MAX_SEGS (PC_STEPS * PC_MAX_PARAMS * 2)

typedef struct pc_res {
  unsigned char *blob;
  size_t len, cap;
  int nsegs;
  pc_seg segs[PC_MAX_SEGS];
  int shm_buffers, num_buffers, want_buffers;
  int want_shm;     /* buffers expected on the shared path */
  int local, hier;  /* of them: on one host; across hosts (hierarchical) */
  int spanning;     /* buffers of 2+ members across hosts not on it */
  int exact;        /* elements checked against the reference */
  unsigned char hier_param[PC_MAX_PARAMS]; /* reduced hierarchically */
  unsigned char sharded_param[PC_MAX_PARAMS]; /* in a sharded buffer */
  int nmem[PC_MAX_PARAMS], mem[PC_MAX_PARAMS][PC_MAX_RANKS]; /* its group's ranks */
  size_t shm_bytes;
  sc_out out; /* a failing rank's message */
} pc_res;

typedef struct pc_run {
  const pcase *c;
  int shm; /* the value MESHPG_SHM has in this run (1 or 0) */
  pc_res res[PC_MAX_RANKS];
} pc_run;

/* hosts 2: halves; 3: parity; 4: uneven, 3 + 1 (rank % 4 == 3 on the
 * second host). */
static int host_index(const pcase *c, int rank) {
  if (c->hosts == 2) return rank >= c->world / 2;
  if (c->hosts == 3) return rank % 2;
  if (c->hosts == 4) return rank % 4 == 3;
  return 0;
}

static const char *host_of(const pcase *c, int rank) {
  if (c->hosts == 0) return NULL;
  return host_index(c, rank) ? "nodeB" : "nodeA";
}

static int same_host(const pcase *c, int a, int b) {
  return host_index(c, a) == host_index(c, b);
}

void pc_add(pcase *c, size_t count, mpg_dtype dt, const char *rd, int tied) {
  pc_param *p = &c->params[c->nparams++];
  p->count = count;
  p->dtype = dt;
  p->reduce_dims = rd;
  p->tied = tied;
}

void pc_init(pcase *c, const char *name, const char *mesh, const char *flatten,
                    int world) {
  memset(c, 0, sizeof *c);
  snprintf(c->name, sizeof c->name, "%s", name);
  snprintf(c->mesh, sizeof c->mesh, "%s", mesh);
  snprintf(c->flatten, sizeof c->flatten, "%s", flatten ? flatten : "");
  c->world = world;
  c->op = MPG_OP_AVG;
  c->grad_scale = 1.0;
  c->reduce_dtype = MPG_REDUCE_F32;
  c->bucket_mb = 0.004;
  c->first_bucket_mb = 0.001;
  c->seed = 1;
}

/* A random case: world 2..16 (even with two hosts), dims dp (or
 * dp_replicate x dp_shard in shard mode), cp, maybe tp and pp, in a random
 * order; params of every float dtype and odd sizes, some with reduce dims
 * of their own, maybe one tied over the first and last stage; small
 * buckets; op, grad_scale, reduce_dtype and the shard dims at random. */
static void pc_random(pcase *c, unsigned seed, int shard, int hosts) {
  unsigned s = seed * 2654435761u + 977u;
  for (int k = 0; k < 3; k++) sc_rand(&s);
  int world = 2 + (int)(sc_rand(&s) % 15);
  if (hosts >= 2 && world % 2) world++;
  int hsdp = shard && sc_rand(&s) % 3 == 0;
  const char *names[5];
  int size[5] = {1, 1, 1, 1, 1}, nd = sc_dp_dims(names, hsdp);
  int ndp = nd; /* dims of dp_cp */
  int has_tp = sc_rand(&s) % 3 != 0, has_pp = sc_rand(&s) % 2 == 0;
  if (has_tp) names[nd++] = "tp";
  if (has_pp) names[nd++] = "pp";
  /* Deal the prime factors: the first to a data-parallel dim, so that
   * the default group has 2+ members in most cases. */
  int w = world, dealt = 0;
  for (int f = 2; w > 1; f++)
    while (w % f == 0) {
      unsigned to = dealt++ == 0 ? sc_rand(&s) % (unsigned)ndp : sc_rand(&s) % (unsigned)nd;
      size[to] *= f;
      w /= f;
    }
  int perm[5] = {0, 1, 2, 3, 4};
  sc_shuffle(perm, nd, &s);
  char mesh[96] = "", flat[96] = "dp_cp=";
  int first = 1, pp_size = 1;
  for (int k = 0; k < nd; k++) {
    size_t len = strlen(mesh);
    snprintf(mesh + len, sizeof mesh - len, "%s%s=%d", k ? "," : "", names[perm[k]],
             size[perm[k]]);
    if (perm[k] < ndp) {
      len = strlen(flat);
      snprintf(flat + len, sizeof flat - len, "%s%s", first ? "" : ",", names[perm[k]]);
      first = 0;
    }
    if (strcmp(names[perm[k]], "pp") == 0) pp_size = size[perm[k]];
  }
  char name[48];
  snprintf(name, sizeof name, "%s%u%s", shard ? "shard" : "replicate", seed,
           hosts == 2 ? "_2hosts" : hosts == 3 ? "_2hosts_cyclic" : "");
  pc_init(c, name, mesh, flat, world);
  c->seed = seed;
  c->hosts = hosts >= 2 ? hosts : (int)(sc_rand(&s) % 2);
  c->shard = shard;
  if (shard) {
    static const char *const plain[][2] = {{"", ""},   {"dp", "cp"},    {"cp", "dp"},
                                           {"dp", ""}, {"dp_cp", ""},   {"cp,dp", ""}};
    static const char *const hs[][2] = {{"dp_shard,cp", "dp_replicate"},
                                        {"dp_shard", "dp_replicate,cp"},
                                        {"", ""},
                                        {"cp,dp_shard", "dp_replicate"}};
    unsigned k = sc_rand(&s) % (hsdp ? 4u : 6u);
    snprintf(c->shard_dims, sizeof c->shard_dims, "%s", hsdp ? hs[k][0] : plain[k][0]);
    snprintf(c->replicate_dims, sizeof c->replicate_dims, "%s", hsdp ? hs[k][1] : plain[k][1]);
  }
  c->op = sc_rand(&s) % 3 == 0 ? MPG_OP_SUM : MPG_OP_AVG;
  c->grad_scale = sc_rand(&s) % 2 ? 0.37 : 1.0;
  c->reduce_dtype = sc_rand(&s) % 4 == 0 ? MPG_REDUCE_NATIVE : MPG_REDUCE_F32;
  unsigned b = sc_rand(&s) % 5;
  if (b == 0) {
    c->bucket_mb = c->first_bucket_mb = 1e-6; /* one param per bucket */
  } else {
    c->bucket_mb = 0.002 + (double)(sc_rand(&s) % 80) * 0.0001;
    c->first_bucket_mb = c->bucket_mb * (0.25 + (double)(sc_rand(&s) % 4) * 0.25);
  }
  static const mpg_dtype dts[4] = {MPG_F32, MPG_F64, MPG_F16, MPG_BF16};
  int np = 4 + (int)(sc_rand(&s) % 9);
  /* (no tied param across two hosts: the reference does not model the
   * tied sum, and hierarchical results are checked against it) */
  int tied_at = hosts < 2 && has_pp && pp_size > 1 && sc_rand(&s) % 2
                    ? (int)(sc_rand(&s) % (unsigned)np)
                    : -1;
  for (int p = 0; p < np; p++) {
    unsigned kind = sc_rand(&s) % 7;
    size_t count = kind == 0   ? 1 + 2 * (sc_rand(&s) % 4)
                   : kind <= 2 ? 1500 + sc_rand(&s) % 3000 /* several buckets' worth */
                               : 15 + 2 * (sc_rand(&s) % 400);
    const char *rd = NULL;
    unsigned r = sc_rand(&s) % 8;
    if (r == 0) rd = hsdp ? "dp_shard" : "dp";
    else if (r == 1) rd = "cp";
    else if (r == 2 && has_tp) rd = "dp_cp,tp";
    else if (r == 3 && has_tp) rd = "tp";
    pc_add(c, count, dts[sc_rand(&s) % 4], rd, p == tied_at);
  }
}

static void describe(const pcase *c, char *buf, size_t cap) {
  size_t n = (size_t)snprintf(
      buf, cap,
      "case %s: world %d, mesh %s (%s), hosts %d, %s%s%s%s%s, %s x %g, reduce_dtype %s, "
      "bucket_mb %g first %g, params",
      c->name, c->world, c->mesh, c->flatten, c->hosts, c->shard ? "shard \"" : "replicate",
      c->shard ? c->shard_dims : "", c->shard ? "\" replicate \"" : "",
      c->shard ? c->replicate_dims : "", c->shard ? "\"" : "",
      c->op == MPG_OP_AVG ? "avg" : "sum", c->grad_scale,
      c->reduce_dtype == MPG_REDUCE_F32 ? "f32" : "native", c->bucket_mb, c->first_bucket_mb);
  for (int p = 0; p < c->nparams && n < cap; p++)
    n += (size_t)snprintf(buf + n, cap - n, " p%d:%zux%s%s%s%s", p, c->params[p].count,
                          mpg_dtype_name(c->params[p].dtype),
                          c->params[p].reduce_dims ? "@" : "",
                          c->params[p].reduce_dims ? c->params[p].reduce_dims : "",
                          c->params[p].tied ? "(tied)" : "");
}

/* ------------------------------------------------------------------ */
/* One rank                                                            */
/* ------------------------------------------------------------------ */

/* prop_rank fails through sync_scenarios.h's SC_TRY and SC_CHECK (o: the
 * rank's res->out). */

static int record(pc_res *o, int step, int p, int is_param, const void *src, size_t first,
                  size_t bytes) {
  if (o->nsegs >= PC_MAX_SEGS) return -1;
  if (o->len + bytes > o->cap) {
    size_t cap = (o->len + bytes) * 2 + 4096;
    unsigned char *nb = realloc(o->blob, cap);
    if (!nb) return -1;
    o->blob = nb;
    o->cap = cap;
  }
  if (bytes) memcpy(o->blob + o->len, src, bytes);
  o->segs[o->nsegs++] = (pc_seg){step, p, is_param, o->len, bytes, first};
  o->len += bytes;
  return 0;
}

/* Write (or add) micro-batch `mb` of `step` into param p's gradient. */
static void fill(const pcase *c, void *g, int rank, int p, int step, int mb, int add) {
  const pc_param *pa = &c->params[p];
  for (size_t i = 0; i < pa->count; i++) {
    double x = gen(c->seed, rank, p, step, mb, i);
    sc_set(g, pa->dtype, i, add ? sc_get(g, pa->dtype, i) + x : x);
  }
}

/* Member q's gradient element i of param p as it stands when `step` is
 * reduced (what fill wrote, rounded to the dtype). */
static double stored(const pcase *c, int q, int p, int step, size_t i) {
  mpg_dtype dt = c->params[p].dtype;
  uint64_t cell = 0;
  if (step == 1) {
    sc_set(&cell, dt, 0, 0.0 + gen(c->seed, q, p, step, 0, i));
    sc_set(&cell, dt, 0, sc_get(&cell, dt, 0) + gen(c->seed, q, p, step, 1, i));
  } else {
    sc_set(&cell, dt, 0, gen(c->seed, q, p, step, 0, i));
  }
  return sc_get(&cell, dt, 0);
}

/* The reference reduction of element i of param p over members[0..n)
 * (group position order), written to *out in the param's dtype, as
 * groups/reduce.c's one kernel (mpg__reduce_sources, for the thread
 * backend and shm/) computes it: every addend first multiplied by scale
 * when premul, the sum divided by div at the end when div > 0; f32
 * accumulation for f32/f16/bf16, f64 for f64; one rounding to the dtype at
 * the end.  hier: the sum over each node's members (position order)
 * first, then those partial sums in node order (nodes numbered by their
 * first member), the hierarchical order of groups/shm/shm_internal.h. */
static void level_ref(const pcase *c, int p, int step, size_t i, const int *members,
                      const int *node, int n, int hier, int premul, double scale, int div,
                      void *out) {
  mpg_dtype dt = c->params[p].dtype;
  int nodes = hier ? 2 : 1;
  if (dt == MPG_F64) {
    double tot = 0;
    for (int nd = 0; nd < nodes; nd++) {
      double acc = 0;
      int first = 1;
      for (int k = 0; k < n; k++) {
        if (hier && node[k] != nd) continue;
        volatile double x = stored(c, members[k], p, step, i);
        if (premul) x = x * scale;
        acc = first ? x : acc + x;
        first = 0;
      }
      tot = nd == 0 ? acc : tot + acc;
    }
    if (div > 0) tot = tot / (double)div;
    sc_set(out, dt, 0, tot);
  } else {
    float tot = 0, f = (float)scale;
    for (int nd = 0; nd < nodes; nd++) {
      float acc = 0;
      int first = 1;
      for (int k = 0; k < n; k++) {
        if (hier && node[k] != nd) continue;
        volatile float x = (float)stored(c, members[k], p, step, i);
        if (premul) x = x * f;
        acc = first ? x : acc + x;
        first = 0;
      }
      tot = nd == 0 ? acc : tot + acc;
    }
    if (div > 0) tot = tot / (float)div;
    sc_set(out, dt, 0, (double)tot);
  }
}

/* The all-reduce as sync/step.c asks for it: with grad_scale != 1 a sum
 * whose every addend is first multiplied by grad_scale (/ n for avg);
 * else the sum, divided by n at the end for avg. */
static void reduce_ref(const pcase *c, int p, int step, size_t i, const int *members,
                       const int *node, int n, int hier, void *out) {
  double scale = c->grad_scale;
  if (c->op == MPG_OP_AVG) scale /= n;
  int premul = c->grad_scale != 1.0, avg = !premul && c->op == MPG_OP_AVG;
  level_ref(c, p, step, i, members, node, n, hier, premul, scale, avg ? n : 0, out);
}

/* The ranks that share rank's coordinates outside mask, in rank order
 * (the group's position order), and each one's node (0: the first's);
 * *hier: the same number >= 2 on each of two nodes. */
static int group_of(const pcase *c, const sc_mesh_info *mi, int rank, unsigned mask, int *mem,
                    int *node, int *hier) {
  int n = 0, count[2] = {0, 0};
  for (int q = 0; q < mi->world; q++)
    if (sc_same_outside(mi, rank, q, mask)) mem[n++] = q;
  for (int k = 0; k < n; k++) count[node[k] = !same_host(c, mem[0], mem[k])]++;
  *hier = count[1] && count[0] == count[1] && count[0] >= 2;
  return n;
}

/* The oracle of element i of a sharded param p that `rank` owns, as
 * sync/shard.c asks for it: the reduce-scatter over the shard group (one
 * level: as the all-reduce; with a replicate group: a sum, each addend
 * times grad_scale (/ shard x replicate for avg) unless that is 1),
 * hierarchical when the shared path is on and the shard group has the
 * same number >= 2 on each host, rounded to the dtype; then, with a
 * replicate group, the sum of the replicate members' rounded slices in
 * position order (f32, f64 for f64), rounded once. */
static void shard_ref(const pcase *c, const sc_mesh_info *mi, int shm, unsigned smask,
                      unsigned rmask, int rank, int p, int step, size_t i, void *out) {
  mpg_dtype dt = c->params[p].dtype;
  int levels = c->replicate_dims[0] != 0;
  int rep[PC_MAX_RANKS], rnode[PC_MAX_RANKS], mem[PC_MAX_RANKS], node[PC_MAX_RANKS], hier;
  int nrep = levels ? group_of(c, mi, rank, rmask, rep, rnode, &hier) : 1;
  if (!levels) rep[0] = rank;
  int domain = group_of(c, mi, rank, smask | rmask, mem, node, &hier);
  double scale = c->op == MPG_OP_AVG ? c->grad_scale / domain : c->grad_scale;
  double tot = 0;
  for (int j = 0; j < nrep; j++) {
    int n = group_of(c, mi, rep[j], smask, mem, node, &hier);
    uint64_t v = 0;
    if (levels)
      level_ref(c, p, step, i, mem, node, n, shm && hier, scale != 1.0, scale, 0, &v);
    else
      reduce_ref(c, p, step, i, mem, node, n, shm && hier, &v);
    volatile double x = sc_get(&v, dt, 0);
    if (dt == MPG_F64) tot = j ? tot + x : x;
    else tot = (double)(j ? (float)tot + (float)x : (float)x);
  }
  sc_set(out, dt, 0, tot);
}

/* Destroys the rank's sync, context and mesh; a failing destroy becomes
 * the rank's failure (its status) unless rc is one already. */
static mpg_status prop_close(sc_out *o, int rank, mpg_status rc, sc_objs *x) {
  mpg_status st = x->sync ? mpg_sync_destroy(x->sync) : MPG_OK;
  const char *what = "mpg_sync_destroy";
  if (!st && x->ctx) st = mpg_ctx_destroy(x->ctx), what = "mpg_ctx_destroy";
  else if (x->ctx) mpg_ctx_destroy(x->ctx);
  if (st && !rc) {
    sc_fmt(o->msg, sizeof o->msg, "rank %d: %s -> %s: %s", rank, what, mpg_status_name(st),
           mpg_last_error());
    rc = st;
  }
  mpg_mesh_destroy(x->mesh);
  return rc;
}

/* One rank of a run (t->shm: the path on or off): PC_STEPS steps of
 * case t->c, its results recorded in t->res[rank], checked against the
 * reference where exact. */
static mpg_status prop_rank(const mpg_init_opts *opts, void *arg) {
  pc_run *t = arg;
  pc_res *res = &t->res[opts->rank];
  sc_out *o = &res->out;
  const pcase *c = t->c;
  int rank = opts->rank;
  mpg_status rc = MPG_OK;
  sc_objs x = {0};
  sc_mesh_info *mi = calloc(1, sizeof *mi);
  void *gv[PC_MAX_PARAMS], *pv[PC_MAX_PARAMS];
  mpg_shard_info info[PC_MAX_PARAMS];
  mpg_group *tied_of[PC_MAX_PARAMS];
  int order[PC_MAX_PARAMS];
  /* Per param: the members of its reduce group in position order, their
   * node (0: the first member's), whether it is checked exactly. */
  int members[PC_MAX_PARAMS][PC_MAX_RANKS], node[PC_MAX_PARAMS][PC_MAX_RANKS];
  int nmembers[PC_MAX_PARAMS], checked[PC_MAX_PARAMS];
  SC_CHECK(mi, "out of memory");

  SC_TRY(mesh_build(c->mesh, c->flatten, 0, &x.mesh));
  mpg_init_opts copts = *opts;
  copts.host_id = host_of(c, rank);
  SC_TRY(mpg_ctx_create(x.mesh, &copts, &x.ctx));
  SC_CHECK(mpg_ctx_rank(x.ctx) == rank, "ctx rank %d", mpg_ctx_rank(x.ctx));
  SC_TRY(sc_mesh_info_of(x.mesh, mi));
  SC_CHECK(mi->world == c->world, "world %d, expected %d", mi->world, c->world);
  int pp_dim = -1, pp_size = 1;
  for (int d = 0; d < mi->ndims; d++) {
    const char *nm;
    int size;
    mpg_mesh_dim(x.mesh, d, &nm, &size);
    if (strcmp(nm, "pp") == 0) pp_dim = d, pp_size = size;
  }

  /* The tied group: the first and last pipeline stage (every rank calls). */
  mpg_group *tied = NULL;
  int any_tied = 0;
  for (int p = 0; p < c->nparams; p++) any_tied |= c->params[p].tied;
  if (any_tied) {
    SC_CHECK(pp_dim >= 0 && pp_size > 1, "a tied param needs pp >= 2");
    int pos[2] = {0, pp_size - 1};
    SC_TRY(mpg_ctx_group_select(x.ctx, "pp", pos, 2, &tied));
  }

  mpg_sync_opts so = MPG_SYNC_OPTS_INIT;
  so.grad_scale = c->grad_scale;
  /* the settings' other fields keep their defaults (0, "") */
  so.sync = (mpg_sync_settings){.op = c->op, .bucket_mb = c->bucket_mb,
                                .first_bucket_mb = c->first_bucket_mb,
                                .reduce_dtype = c->reduce_dtype,
                                .mode = c->shard ? MPG_SYNC_SHARD : MPG_SYNC_REPLICATE};
  if (c->shard) {
    snprintf(so.sync.shard_dims, sizeof so.sync.shard_dims, "%s", c->shard_dims);
    snprintf(so.sync.replicate_dims, sizeof so.sync.replicate_dims, "%s", c->replicate_dims);
  }
  SC_TRY(mpg_sync_create(x.ctx, &so, &x.sync));
  for (int p = 0; p < c->nparams; p++) {
    char name[16];
    snprintf(name, sizeof name, "p%d", p);
    mpg_param_opts po = MPG_PARAM_OPTS_INIT;
    po.reduce_dims = c->params[p].reduce_dims;
    tied_of[p] = c->params[p].tied ? tied : NULL; /* middle stages: untied */
    po.tied_group = tied_of[p];
    int id;
    SC_TRY(mpg_sync_add_param(x.sync, name, c->params[p].count, c->params[p].dtype, &po, &id));
    SC_CHECK(id == p, "param %d got id %d", p, id);
  }
  SC_TRY(mpg_sync_commit(x.sync));

  /* Which buffers should be on the shared path: one per (dtype, reduce
   * group, tied group, sharded); reduced over the shard group when
   * sharded, else over the reduce group.  Shared when that group has 2+
   * members on one host, or (all-reduced buffers only) the same number
   * >= 2 on each of several hosts: hierarchical. */
  unsigned smask = 0, rmask = 0;
  if (c->shard)
    SC_CHECK(shc_mask(x.mesh, c->shard_dims[0] ? c->shard_dims : "dp_cp", &smask) == 0,
            "bad shard dims %s", c->shard_dims);
  if (c->shard && c->replicate_dims[0])
    SC_CHECK(shc_mask(x.mesh, c->replicate_dims, &rmask) == 0, "bad replicate dims %s",
            c->replicate_dims);
  struct {
    mpg_dtype dt;
    mpg_group *g, *tied;
    int sharded;
  } keys[PC_MAX_PARAMS];
  int nkeys = 0;
  for (int p = 0; p < c->nparams; p++) {
    mpg_group *g = NULL;
    SC_TRY(mpg_sync_param_group(x.sync, p, &g));
    SC_TRY(mpg_sync_grad(x.sync, p, &gv[p]));
    info[p] = (mpg_shard_info)MPG_SHARD_INFO_INIT;
    if (c->shard) {
      SC_TRY(mpg_sync_get_shard(x.sync, p, &info[p]));
      SC_TRY(mpg_sync_param(x.sync, p, &pv[p]));
    } else {
      info[p].count = c->params[p].count;
    }
    int sharded = c->shard && info[p].sharded;
    /* The members the buffer is reduced over, in position order. */
    int n = 0, *mem = members[p];
    if (sharded) {
      for (int q = 0; q < mi->world; q++)
        if (sc_same_outside(mi, rank, q, smask)) mem[n++] = q;
    } else {
      n = mpg_group_size(g);
      SC_CHECK(n <= PC_MAX_RANKS, "group of %d", n);
      for (int pos = 0; pos < n; pos++) SC_TRY(mpg_group_member(g, pos, &mem[pos]));
    }
    nmembers[p] = n;
    int count[2] = {0, 0};
    for (int k = 0; k < n; k++) {
      node[p][k] = same_host(c, mem[0], mem[k]) ? 0 : 1;
      count[node[p][k]]++;
    }
    /* Shared: on one host, or the same number >= 2 on each (all-reduced
     * or reduce-scattered hierarchically); uneven hosts or one member per
     * host: the backend's collectives. */
    int shared = n >= 2 && (!count[1] || (count[0] == count[1] && count[0] >= 2));
    res->hier_param[p] = (unsigned char)(shared && count[1]);
    res->sharded_param[p] = (unsigned char)sharded;
    res->nmem[p] = n;
    memcpy(res->mem[p], mem, sizeof(int) * (size_t)n);
    /* Exactly checked: all-reduced and untied (the reference has no tied
     * sum), or sharded (shard_ref). */
    checked[p] = sharded || !tied_of[p];
    int k = 0;
    while (k < nkeys && !(keys[k].dt == c->params[p].dtype && keys[k].g == g &&
                          keys[k].tied == tied_of[p] && keys[k].sharded == sharded))
      k++;
    if (k < nkeys) continue;
    keys[nkeys].dt = c->params[p].dtype;
    keys[nkeys].g = g;
    keys[nkeys].tied = tied_of[p];
    keys[nkeys].sharded = sharded;
    nkeys++;
    res->want_shm += shared;
    res->local += shared && !count[1];
    res->hier += shared && count[1];
    res->spanning += n >= 2 && !shared && count[1];
  }
  mpg_sync_stats stats = MPG_SYNC_STATS_INIT;
  SC_TRY(mpg_sync_get_stats(x.sync, &stats));
  res->shm_buffers = stats.shm_buffers;
  res->shm_bytes = stats.shm_bytes;
  res->num_buffers = stats.num_buffers;
  res->want_buffers = nkeys;
  SC_CHECK(stats.num_buffers == nkeys, "rank %d: %d buffers, the test expected %d", rank,
          stats.num_buffers, nkeys);
  if (t->shm) {
    SC_CHECK(stats.shm_buffers == res->want_shm,
            "rank %d: MESHPG_SHM=1: shm_buffers %d, expected %d (of %d buffers: %d on one "
            "host, %d hierarchical across hosts; %d others span hosts)",
            rank, stats.shm_buffers, res->want_shm, nkeys, res->local, res->hier, res->spanning);
    SC_CHECK((stats.shm_bytes > 0) == (res->want_shm > 0), "rank %d: shm_bytes %zu with %d shm "
            "buffers", rank, stats.shm_bytes, stats.shm_buffers);
    /* Each segment maps every local member's copy of its buffer: both
     * (the gradients' and the params') at least the shard group's members
     * on this host x total_bytes (which counts both buffers); across two
     * hosts (hierarchical) half of the shard group is on this host. */
    size_t per_host = (size_t)stats.shard_size / (c->hosts >= 2 ? 2 : 1);
    SC_CHECK(!c->param_shm || stats.shm_bytes >= per_host * stats.total_bytes,
            "rank %d: shm_bytes %zu < %zu members on this host x total_bytes %zu: the params "
            "are not in shared memory", rank, stats.shm_bytes, per_host, stats.total_bytes);
  } else {
    SC_CHECK(stats.shm_buffers == 0 && stats.shm_bytes == 0,
            "rank %d: MESHPG_SHM=0: shm_buffers %d, shm_bytes %zu, expected 0", rank,
            stats.shm_buffers, stats.shm_bytes);
  }

  /* Three steps: 0 written and mpg_sync_all; 1 zeroed, two micro-batches
   * accumulated, marked in a random order; 2 overwritten (replicate mode;
   * shard mode zeroes after each step), half of the params marked, finish
   * launching the rest. */
  unsigned rs = c->seed * 40503u + (unsigned)rank * 2654435761u + 5u;
  for (int step = 0; step < PC_STEPS; step++) {
    if (step == 0) {
      for (int p = 0; p < c->nparams; p++) fill(c, gv[p], rank, p, step, 0, 0);
      SC_TRY(mpg_sync_all(x.sync, step, NULL));
    } else if (step == 1) {
      SC_TRY(mpg_sync_zero_grads(x.sync));
      for (int mb = 0; mb < 2; mb++) {
        SC_TRY(mpg_sync_begin(x.sync, step, mb == 1, NULL));
        for (int p = 0; p < c->nparams; p++) order[p] = c->nparams - 1 - p;
        sc_shuffle(order, c->nparams, &rs);
        for (int k = 0; k < c->nparams; k++) {
          fill(c, gv[order[k]], rank, order[k], step, mb, 1);
          SC_TRY(mpg_sync_mark_ready(x.sync, order[k]));
        }
        SC_TRY(mpg_sync_finish(x.sync));
      }
    } else {
      SC_TRY(mpg_sync_begin(x.sync, step, 1, NULL));
      for (int p = 0; p < c->nparams; p++) order[p] = p;
      sc_shuffle(order, c->nparams, &rs);
      for (int k = 0; k < c->nparams; k++) {
        fill(c, gv[order[k]], rank, order[k], step, 0, 0);
        if (k < c->nparams / 2) SC_TRY(mpg_sync_mark_ready(x.sync, order[k]));
      }
      SC_TRY(mpg_sync_finish(x.sync));
    }
    SC_CHECK(mpg_sync_grads_valid(x.sync) == 1, "rank %d: step %d: grads invalid", rank, step);
    /* All-reduced untied params: bit for bit the reference (position
     * order; hierarchical order for a buffer shared across hosts). */
    for (int p = 0; p < c->nparams; p++) {
      if (!checked[p]) continue;
      mpg_dtype dt = c->params[p].dtype;
      size_t es = mpg_dtype_size(dt);
      int hier = t->shm && res->hier_param[p];
      for (size_t i = info[p].param_offset; i < info[p].param_offset + info[p].count; i++) {
        uint64_t want = 0;
        if (res->sharded_param[p])
          shard_ref(c, mi, t->shm, smask, rmask, rank, p, step, i, &want);
        else
          reduce_ref(c, p, step, i, members[p], node[p], nmembers[p], hier, &want);
        const char *got = (const char *)gv[p] + i * es;
        SC_CHECK(memcmp(got, &want, es) == 0,
                "rank %d: MESHPG_SHM=%d: step %d: param p%d (%zu x %s, %sgroup of %d%s) "
                "element %zu: %.17g, the %s-order reference %.17g",
                rank, t->shm, step, p, c->params[p].count, mpg_dtype_name(dt),
                res->sharded_param[p] ? "sharded, shard " : "", nmembers[p],
                res->hier_param[p] ? " across 2 hosts" : "", i, sc_get(got, dt, 0),
                hier ? "node-then-position" : "position", sc_get(&want, dt, 0));
        res->exact++;
      }
    }
    /* What is defined: the owned part of each gradient (all of it in
     * replicate mode and for replicated params). */
    for (int p = 0; p < c->nparams; p++) {
      size_t es = mpg_dtype_size(c->params[p].dtype);
      SC_CHECK(record(res, step, p, 0, (char *)gv[p] + info[p].param_offset * es,
                     info[p].param_offset, info[p].count * es) == 0,
              "out of memory for the results");
    }
    if (c->shard) {
      /* An "optimizer": param = -grad on the owned part, then the gather
       * (every rank's params then hold every member's reduced slices).  A
       * sharded buffer reduced hierarchically has other sums with the
       * shared path on than off (the node-then-position order): its owned
       * part is set from (param, element, step) instead, the same in both
       * runs, so that its gather across hosts is compared with
       * MESHPG_SHM=0's bit for bit (first_difference). */
      for (int p = 0; p < c->nparams; p++) {
        size_t es = mpg_dtype_size(c->params[p].dtype);
        unsigned char *dst = (unsigned char *)pv[p] + info[p].param_offset * es;
        if (res->sharded_param[p] && res->hier_param[p]) {
          for (size_t b = 0; b < info[p].count * es; b++) {
            uint32_t g = (uint32_t)(info[p].param_offset * es + b);
            dst[b] = (unsigned char)((g * 2654435761u + (uint32_t)p * 97u +
                                      (uint32_t)step * 31u) >> 13);
          }
          continue;
        }
        memcpy(dst, (char *)gv[p] + info[p].param_offset * es, info[p].count * es);
        for (size_t i = 0; i < info[p].count; i++) dst[i * es + es - 1] ^= 0x80u;
      }
      SC_TRY(mpg_sync_zero_grads(x.sync));
      SC_TRY(mpg_sync_gather_begin(x.sync, NULL));
      SC_TRY(mpg_sync_gather_all(x.sync));
      for (int p = 0; p < c->nparams; p++)
        SC_CHECK(record(res, step, p, 1, pv[p], 0,
                       c->params[p].count * mpg_dtype_size(c->params[p].dtype)) == 0,
                "out of memory for the results");
    }
  }
  SC_TRY(mpg_sync_get_stats(x.sync, &stats));
  SC_CHECK(stats.shm_buffers == res->shm_buffers, "rank %d: shm_buffers changed from %d to %d",
          rank, res->shm_buffers, stats.shm_buffers);

done:
  free(mi);
  return prop_close(o, rank, rc, &x);
}

/* ------------------------------------------------------------------ */
/* On against off                                                      */
/* ------------------------------------------------------------------ */

static pc_run *run_once(const pcase *c, int shm, const char *env_value) {
  pc_run *t = calloc(1, sizeof *t);
  cr_assert_not_null(t);
  t->c = c;
  t->shm = shm;
  /* Set in this (the main) thread before any rank thread starts. */
  if (env_value) setenv("MESHPG_SHM", env_value, 1);
  else unsetenv("MESHPG_SHM");
  mpg_status st[PC_MAX_RANKS];
  mpg_status rc = mpg_thread_run(c->world, 30.0, prop_rank, t, st);
  char what[2048], all[8192];
  describe(c, what, sizeof what);
  rank_failures(all, sizeof all, c->world, st, t->res[0].out.msg, sizeof t->res[0]);
  cr_assert_eq(rc, MPG_OK, "%s\nMESHPG_SHM=%s: failed: %s%s", what,
               env_value ? env_value : "(unset)", mpg_last_error(), all);
  return t;
}

static void free_run(pc_run *t) {
  for (int r = 0; r < PC_MAX_RANKS; r++) free(t->res[r].blob);
  free(t);
}

/* The first differing element of two runs' results of one rank, described;
 * 0 when equal.  Params reduced hierarchically across hosts are left out
 * (another summation order: checked against their own reference), except
 * the gathered params of a sharded one (set independently of the sums:
 * the hierarchical gather's bytes against the backend's). */
static int first_difference(const pcase *c, const pc_res *a, const pc_res *b, char *buf,
                            size_t cap) {
  for (int k = 0; k < a->nsegs; k++) {
    const pc_seg *s = &a->segs[k];
    if (!s->bytes) continue;
    if (a->hier_param[s->param] && !(s->is_param && a->sharded_param[s->param])) continue;
    if (memcmp(a->blob + s->at, b->blob + s->at, s->bytes) == 0) continue;
    mpg_dtype dt = c->params[s->param].dtype;
    size_t es = mpg_dtype_size(dt);
    for (size_t e = 0; e * es < s->bytes; e++)
      if (memcmp(a->blob + s->at + e * es, b->blob + s->at + e * es, es) != 0) {
        put_msg(buf, cap,
                "step %d, %s of param p%d (%zu x %s), element %zu: shm %.17g, no shm %.17g",
                s->step, s->is_param ? "gathered param" : "owned gradient", s->param,
                c->params[s->param].count, mpg_dtype_name(dt), s->first + e,
                sc_get(a->blob + s->at, dt, e), sc_get(b->blob + s->at, dt, e));
        return 1;
      }
  }
  return 0;
}

/* Shard mode, one level, its shard group across hosts (hierarchical): each
 * rank's owned slice of every such param equals, byte for byte, the same
 * elements after replicate mode's hierarchical all-reduce of the same
 * data over the same group (run here, shared path on).  Returns the
 * elements compared. */
static long against_replicate_mode(const pcase *c, const pc_run *on) {
  int any = 0;
  for (int r = 0; r < c->world; r++)
    for (int p = 0; p < c->nparams; p++)
      any |= on->res[r].sharded_param[p] && on->res[r].hier_param[p];
  if (!c->shard || c->replicate_dims[0] || !any) return 0;
  pcase *rc = malloc(sizeof *rc);
  cr_assert_not_null(rc);
  *rc = *c;
  rc->shard = 0;
  pc_run *rep = run_once(rc, 1, NULL);
  char what[2048];
  describe(c, what, sizeof what);
  long compared = 0;
  for (int r = 0; r < c->world; r++) {
    const pc_res *a = &on->res[r], *b = &rep->res[r];
    for (int k = 0; k < a->nsegs; k++) {
      const pc_seg *sa = &a->segs[k];
      int p = sa->param;
      if (sa->is_param || !a->sharded_param[p] || !a->hier_param[p]) continue;
      /* the same group in both modes (shard_dims may name a smaller one) */
      if (a->nmem[p] != b->nmem[p] ||
          memcmp(a->mem[p], b->mem[p], sizeof(int) * (size_t)a->nmem[p]) != 0)
        continue;
      cr_assert(b->hier_param[p], "%s\nrank %d: param p%d is hierarchical in shard mode, not "
                "in replicate mode", what, r, p);
      const pc_seg *sb = NULL;
      for (int j = 0; j < b->nsegs && !sb; j++)
        if (!b->segs[j].is_param && b->segs[j].step == sa->step && b->segs[j].param == p)
          sb = &b->segs[j];
      cr_assert_not_null(sb, "%s\nrank %d: no replicate-mode result of p%d", what, r, p);
      mpg_dtype dt = c->params[p].dtype;
      size_t es = mpg_dtype_size(dt);
      for (size_t e = 0; e * es < sa->bytes; e++) {
        const unsigned char *x = a->blob + sa->at + e * es;
        const unsigned char *y = b->blob + sb->at + (sa->first + e) * es;
        cr_assert(memcmp(x, y, es) == 0,
                  "%s\nrank %d: step %d: param p%d (%s) element %zu: shard mode's hierarchical "
                  "reduce-scatter %.17g, replicate mode's hierarchical all-reduce %.17g",
                  what, r, sa->step, p, mpg_dtype_name(dt), sa->first + e, sc_get(x, dt, 0),
                  sc_get(y, dt, 0));
        compared++;
      }
    }
  }
  if (!c->shard_dims[0])
    cr_assert_gt(compared, 0, "%s\nno owned slice was compared with replicate mode", what);
  cr_log_info("%s: %ld owned elements equal replicate mode's hierarchical all-reduce", what,
              compared);
  free_run(rep);
  free(rc);
  return compared;
}

/* Run case c with the shared path on, then off; every rank's results must
 * be equal byte for byte (the hierarchical ones: see first_difference). */
void run_pair(const pcase *c, pc_tally *tally) {
  /* On: MESHPG_SHM unset (the default) or "1". */
  pc_run *on = run_once(c, 1, c->seed % 2 ? "1" : NULL);
  pc_run *off = run_once(c, 0, "0");
  char what[2048];
  describe(c, what, sizeof what);
  for (int r = 0; r < c->world; r++) {
    const pc_res *a = &on->res[r], *b = &off->res[r];
    cr_assert_gt(a->nsegs, 0, "%s\nrank %d recorded nothing", what, r);
    cr_assert_eq(a->len, b->len, "%s\nrank %d: %zu bytes of results with shm, %zu without",
                 what, r, a->len, b->len);
    char diff[512];
    if (first_difference(c, a, b, diff, sizeof diff))
      cr_assert_fail("%s\nrank %d: the shared-memory path and MESHPG_SHM=0 differ: %s", what,
                     r, diff);
  }
  /* Buffers of each kind: the most any rank has. */
  int with = 0, span = 0, local = 0, hier = 0;
#define PC_MAX_OF(v, x) ((v) = (x) > (v) ? (x) : (v))
  for (int r = 0; r < c->world; r++) {
    with |= on->res[r].want_shm > 0;
    PC_MAX_OF(local, on->res[r].local);
    PC_MAX_OF(hier, on->res[r].hier);
    PC_MAX_OF(span, on->res[r].spanning);
    tally->exact += on->res[r].exact + off->res[r].exact;
  }
#undef PC_MAX_OF
  tally->cases++;
  tally->with_shm += with;
  tally->local += local;
  tally->hier += hier;
  tally->spanning += span;
  tally->local_and_spanning += local && (span || hier);
  tally->exact += against_replicate_mode(c, on);
  cr_log_info("%s: equal; rank 0: %d of %d buffers shared (%d hierarchical)", what,
              on->res[0].shm_buffers, on->res[0].num_buffers, on->res[0].hier);
  free_run(on);
  free_run(off);
}

void run_random(unsigned first_seed, int n, int shard, int hosts, pc_tally *tally) {
  pcase *c = malloc(sizeof *c);
  cr_assert_not_null(c);
  for (unsigned seed = first_seed; seed < first_seed + (unsigned)n; seed++) {
    pc_random(c, seed, shard, hosts);
    run_pair(c, tally);
  }
  free(c);
}
