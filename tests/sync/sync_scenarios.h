/* Sync policy scenarios shared by test_sync.c (thread backend, ranks are
 * threads) and sync_mpi_worker.c (MPI backend, ranks are processes).
 *
 * A scenario is a mesh, sync options and a parameter list.  Every rank
 * runs it with sc_run: it registers the parameters, writes gradients that
 * are a function of (rank, param, element, step, micro-batch), accumulates
 * them over the micro-batches, marks them ready in a per-rank random order
 * and checks, after each step, that every gradient equals the reduction
 * over exactly the ranks of its expected group (computed here from mesh
 * coordinates, independently of the library): the average (or sum) over
 * the ranks that share all coordinates outside the expected dims, times
 * grad_scale, then summed over the tied ranks (first and last pp stage).
 *
 * Nothing here uses Criterion: ranks report failures through a message
 * buffer and a status, and the caller asserts. */
#ifndef SYNC_SCENARIOS_H
#define SYNC_SCENARIOS_H

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "meshpg.h"
#include "../support/mesh_util.h"
#include "../support/values.h"

#if defined(__GNUC__)
#define SC_UNUSED __attribute__((unused))
#else
#define SC_UNUSED
#endif

#define SC_MAX_PARAMS 640
#define SC_MAX_RANKS 64

typedef struct sc_param {
  char name[40];
  size_t count;
  mpg_dtype dtype;
  const char *reduce_dims; /* given to the library (NULL: default) */
  const char *expect_dims; /* the mesh dims the test expects: "dp,cp"; "" */
  int tied;                /* 1: tied over pp positions {0, P-1} */
  unsigned stages;         /* pipeline stages that hold it (bit s: stage s);
                              0: every rank */
  const char *last_name;   /* its name on the last stage (a tied head named
                              apart from the embedding), or NULL */
} sc_param;

typedef struct scenario {
  char name[48];
  const char *mesh;     /* "dp=2,cp=2,tp=2" */
  const char *flatten;  /* "dp_cp=dp,cp;edp=..." or NULL */
  int world;            /* its world size */
  int fsdp;
  mpg_op op;
  double grad_scale;
  double bucket_mb, first_bucket_mb;
  const char *default_dims;
  mpg_reduce_dtype reduce_dtype;
  int microbatches;     /* 1..4 */
  int steps;
  unsigned seed;        /* ready order: 0 backward order, else random per rank */
  int sync_all;         /* last micro-batch through mpg_sync_all */
  int unmarked;         /* last micro-batch: every k-th param is never marked */
  int expect_buckets;   /* -1: not checked */
  int expect_buffers;   /* -1: not checked */
  int lazy;             /* a context with lazy groups: creation is collective */
  int check_differs;    /* check that gradients differ across the named dim */
  const char *differs_dim;
  int nparams;
  sc_param params[SC_MAX_PARAMS];
  /* Storage for generated scenarios (sc_build_random): the strings above
   * point here. */
  char mesh_buf[96], flatten_buf[32], dims_buf[16][24];
} scenario;

/* ------------------------------------------------------------------ */
/* Halves and element access                                           */
/* ------------------------------------------------------------------ */

/* bf16: tv_bf16_to_f32 and tv_f32_to_bf16 (tests/support/values.h). */

static SC_UNUSED float sc_f16_to_f32(uint16_t h) {
  int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
  float v;
  if (e == 0) v = ldexpf((float)m, -24);
  else if (e == 31) v = m ? NAN : INFINITY;
  else v = ldexpf((float)(m | 1024), e - 25);
  return s ? -v : v;
}

static SC_UNUSED uint16_t sc_f32_to_f16(float f) {
  /* Exact for the small values used here (|v| < 65504, multiples of 2^-14),
   * round to nearest even otherwise. */
  uint16_t s = f < 0 ? 0x8000u : 0;
  double a = fabs((double)f);
  if (a == 0) return s;
  int e;
  double m = frexp(a, &e); /* a = m * 2^e, m in [0.5, 1) */
  int ex = e - 1 + 15;     /* biased exponent of 1.xxx form */
  if (ex <= 0) {           /* subnormal */
    double q = nearbyint(a * 16777216.0);
    return (uint16_t)(s | (uint16_t)q);
  }
  double q = nearbyint((m * 2 - 1) * 1024.0);
  if (q >= 1024) {
    q = 0;
    ex++;
  }
  if (ex >= 31) return (uint16_t)(s | 0x7c00u);
  return (uint16_t)(s | (uint16_t)(ex << 10) | (uint16_t)q);
}

static SC_UNUSED double sc_get(const void *v, mpg_dtype dt, size_t i) {
  switch (dt) {
    case MPG_F32: return ((const float *)v)[i];
    case MPG_F64: return ((const double *)v)[i];
    case MPG_F16: return sc_f16_to_f32(((const uint16_t *)v)[i]);
    case MPG_BF16: return tv_bf16_to_f32(((const uint16_t *)v)[i]);
    case MPG_I32: return ((const int32_t *)v)[i];
    case MPG_I64: return (double)((const int64_t *)v)[i];
  }
  return NAN;
}

static SC_UNUSED void sc_set(void *v, mpg_dtype dt, size_t i, double x) {
  switch (dt) {
    case MPG_F32: ((float *)v)[i] = (float)x; break;
    case MPG_F64: ((double *)v)[i] = x; break;
    case MPG_F16: ((uint16_t *)v)[i] = sc_f32_to_f16((float)x); break;
    case MPG_BF16: ((uint16_t *)v)[i] = tv_f32_to_bf16((float)x); break;
    case MPG_I32: ((int32_t *)v)[i] = (int32_t)x; break;
    case MPG_I64: ((int64_t *)v)[i] = (int64_t)x; break;
  }
}

/* Relative tolerance: about two units in the last place. */
static SC_UNUSED double sc_tol(mpg_dtype dt) {
  switch (dt) {
    case MPG_F32: return 2e-6;
    case MPG_F64: return 1e-13;
    case MPG_F16: return 2.0 / 1024;
    case MPG_BF16: return 2.0 / 128;
    default: return 0;
  }
}

/* got is want within dt's tolerance (relative above 1). */
static SC_UNUSED int sc_near(mpg_dtype dt, double got, double want) {
  return fabs(got - want) <= sc_tol(dt) * (fabs(want) > 1 ? fabs(want) : 1);
}

static SC_UNUSED int sc_is_int(mpg_dtype dt) { return dt == MPG_I32 || dt == MPG_I64; }

/* ------------------------------------------------------------------ */
/* The gradient function and the expected results                      */
/* ------------------------------------------------------------------ */

/* A small integer in -6..6: exact in every dtype, and sums of a few of
 * them stay exact in bf16. */
static SC_UNUSED long sc_value(int rank, int p, size_t i, int step, int mb) {
  long x = (long)rank * 37 + (long)p * 11 + (long)(i % 1000) * 5 + (long)(i / 1000) * 3 +
           (long)step * 3 + (long)mb * 7;
  return x % 13 - 6;
}

typedef struct sc_mesh_info {
  int world, ndims;
  int coord[SC_MAX_RANKS][MPG_MAX_DIMS];
  int pp_dim, pp_size;
} sc_mesh_info;

/* Mask of mesh dims from "dp,cp" (dim names only). */
static SC_UNUSED int sc_mask(const mpg_mesh *mesh, const char *dims, unsigned *mask) {
  *mask = 0;
  char buf[256];
  snprintf(buf, sizeof buf, "%s", dims);
  char *save = NULL;
  for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    int d, found = 0;
    for (d = 0; d < mpg_mesh_ndims(mesh) && !found; d++) {
      const char *name;
      mpg_mesh_dim(mesh, d, &name, NULL);
      if (strcmp(name, tok) == 0) {
        *mask |= 1u << d;
        found = 1;
      }
    }
    if (!found) return -1;
  }
  return 0;
}

static SC_UNUSED int sc_same_outside(const sc_mesh_info *mi, int a, int b, unsigned mask) {
  for (int d = 0; d < mi->ndims; d++)
    if (!(mask & (1u << d)) && mi->coord[a][d] != mi->coord[b][d]) return 0;
  return 1;
}

/* The sum, over the ranks sharing r's coordinates outside mask (*n of
 * them), of their gradients of element i of param p in mbs micro-batches
 * of `step`: sc_value, or with odd 2 * sc_value + 1 (shard_check.h's). */
static SC_UNUSED long sc_group_sum(const sc_mesh_info *mi, unsigned mask, int r, int mbs,
                                   int odd, int p, size_t i, int step, int *n) {
  long sum = 0;
  *n = 0;
  for (int q = 0; q < mi->world; q++) {
    if (!sc_same_outside(mi, r, q, mask)) continue;
    ++*n;
    for (int m = 0; m < mbs; m++) sum += (odd + 1) * sc_value(q, p, i, step, m) + odd;
  }
  return sum;
}

/* The reduced (not yet tied-summed) value of element i of param p on rank r
 * after the last micro-batch of `step`. */
static SC_UNUSED double sc_reduced(const scenario *sc, const sc_mesh_info *mi,
                                   unsigned mask, int r, int p, size_t i, int step) {
  const sc_param *pa = &sc->params[p];
  int n;
  long sum = sc_group_sum(mi, mask, r, sc->microbatches, 0, p, i, step, &n);
  if (sc_is_int(pa->dtype)) return (double)(sc->op == MPG_OP_AVG ? sum / n : sum);
  double v = (double)sum;
  if (sc->op == MPG_OP_AVG) v /= n;
  return v * sc->grad_scale;
}

static SC_UNUSED double sc_expected(const scenario *sc, const sc_mesh_info *mi,
                                    unsigned mask, int r, int p, size_t i, int step) {
  const sc_param *pa = &sc->params[p];
  int P = mi->pp_size;
  if (!pa->tied || mi->pp_dim < 0) return sc_reduced(sc, mi, mask, r, p, i, step);
  int my = mi->coord[r][mi->pp_dim];
  if (my != 0 && my != P - 1) return sc_reduced(sc, mi, mask, r, p, i, step);
  double sum = 0;
  for (int q = 0; q < mi->world; q++) {
    int qp = mi->coord[q][mi->pp_dim];
    if (qp != 0 && qp != P - 1) continue;
    if (!sc_same_outside(mi, r, q, 1u << mi->pp_dim)) continue;
    sum += sc_reduced(sc, mi, mask, q, p, i, step);
  }
  return sum;
}

/* ------------------------------------------------------------------ */
/* Running a scenario on one rank                                       */
/* ------------------------------------------------------------------ */

typedef struct sc_out {
  char msg[1024];
  long launched;
  int nbuckets, nbuffers;
} sc_out;

/* vsnprintf through a helper: GCC's -Wformat-truncation would flag the
 * intended truncation of long messages. */
__attribute__((format(printf, 3, 4))) static SC_UNUSED void sc_fmt(char *buf, size_t cap,
                                                                   const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, cap, fmt, ap);
  va_end(ap);
}

static SC_UNUSED mpg_status sc_failf(sc_out *o, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(o->msg, sizeof o->msg, fmt, ap);
  va_end(ap);
  return MPG_ERR_STATE;
}

/* A failure at file:line of rank's run: "rank R: FILE:LINE: " and the
 * message into o->msg; MPG_ERR_STATE. */
__attribute__((format(printf, 5, 6))) static SC_UNUSED mpg_status
sc_fail_at(sc_out *o, int rank, const char *file, int line, const char *fmt, ...) {
  char m[700];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(m, sizeof m, fmt, ap);
  va_end(ap);
  return sc_failf(o, "rank %d: %s:%d: %s", rank, file, line, m);
}

/* In a rank's run (rc, o, rank and a label done in scope): unless cond
 * holds, record the failure and go to done. */
#define SC_CHECK(cond, ...)                                           \
  do {                                                                \
    if (!(cond)) {                                                    \
      rc = sc_fail_at(o, rank, __FILE__, __LINE__, __VA_ARGS__);      \
      goto done;                                                      \
    }                                                                 \
  } while (0)

/* st, the status of expr at file:line: MPG_OK, or a failure naming expr,
 * st and mpg_last_error(). */
static SC_UNUSED mpg_status sc_try(sc_out *o, int rank, const char *file, int line,
                                   mpg_status st, const char *expr) {
  if (st == MPG_OK) return MPG_OK;
  return sc_fail_at(o, rank, file, line, "%s -> %s: %s", expr, mpg_status_name(st),
                    mpg_last_error());
}

/* SC_CHECK that call gives MPG_OK. */
#define SC_TRY(call)                                                         \
  do {                                                                       \
    mpg_status e_ = sc_try(o, rank, __FILE__, __LINE__, (call), #call);      \
    if (e_) {                                                                \
      rc = e_;                                                               \
      goto done;                                                             \
    }                                                                        \
  } while (0)

/* A rank's objects: its mesh, context and sync. */
typedef struct sc_objs {
  mpg_mesh *mesh;
  mpg_ctx *ctx;
  mpg_sync *sync;
} sc_objs;

/* The end of a rank's run: destroys its sync (a failure of that becomes
 * the rank's, unless rc already is one), context and mesh, frees the
 * nbufs buffers bufs; returns rc. */
static SC_UNUSED mpg_status sc_destroy(sc_out *o, int rank, mpg_status rc, sc_objs *h,
                                       int nbufs, void **bufs) {
  mpg_status st = h->sync ? mpg_sync_destroy(h->sync) : MPG_OK;
  if (st && !rc) rc = sc_failf(o, "rank %d: mpg_sync_destroy: %s", rank, mpg_last_error());
  if (h->ctx) mpg_ctx_destroy(h->ctx);
  mpg_mesh_destroy(h->mesh);
  for (int k = 0; k < nbufs; k++) free(bufs[k]);
  return rc;
}

static SC_UNUSED unsigned sc_rand(unsigned *s) {
  *s = *s * 1103515245u + 12345u;
  return (*s >> 8) & 0xffffffu;
}

/* Shuffles v[0..n) with sc_rand (Fisher-Yates, from the end). */
static SC_UNUSED void sc_shuffle(int *v, int n, unsigned *s) {
  for (int k = n - 1; k > 0; k--) {
    int j = (int)(sc_rand(s) % (unsigned)(k + 1)), t = v[k];
    v[k] = v[j];
    v[j] = t;
  }
}

/* The data-parallel dims of a random shard case into names: dp, or
 * dp_replicate and dp_shard (hsdp), then cp; returns how many. */
static SC_UNUSED int sc_dp_dims(const char **names, int hsdp) {
  int nd = 0;
  if (hsdp) names[nd++] = "dp_replicate", names[nd++] = "dp_shard";
  else names[nd++] = "dp";
  names[nd++] = "cp";
  return nd;
}

/* Fills mi's world and dims from mesh, and when the world fits, every
 * rank's coordinates. */
static SC_UNUSED mpg_status sc_mesh_info_of(const mpg_mesh *mesh, sc_mesh_info *mi) {
  mi->world = mpg_mesh_world_size(mesh);
  mi->ndims = mpg_mesh_ndims(mesh);
  mpg_status st = MPG_OK;
  for (int r = 0; r < mi->world && r < SC_MAX_RANKS && !st; r++)
    st = mpg_mesh_coord_of(mesh, r, mi->coord[r]);
  return st;
}

/* The start of a rank's run: h's mesh from dims and flatten, the rank's
 * context on it (lazy: lazy groups), mi filled from the mesh. */
static SC_UNUSED mpg_status sc_open(const mpg_init_opts *opts, const char *dims,
                                    const char *flatten, int lazy, sc_objs *h, sc_mesh_info *mi,
                                    sc_out *o) {
  mpg_status rc = MPG_OK;
  int rank = opts->rank;
  SC_TRY(mesh_build(dims, flatten, 0, &h->mesh));
  mpg_init_opts copts = *opts;
  if (lazy) copts.backend.lazy_groups = 1;
  SC_TRY(mpg_ctx_create(h->mesh, &copts, &h->ctx));
  SC_TRY(sc_mesh_info_of(h->mesh, mi));
  SC_CHECK(mi->world <= SC_MAX_RANKS, "world %d too large", mi->world);
done:
  return rc;
}

/* A mesh from the scenario's mesh and flatten strings. */
static SC_UNUSED mpg_status sc_make_mesh(const scenario *sc, mpg_mesh **mesh) {
  return mesh_build(sc->mesh, sc->flatten, 0, mesh);
}

/* Run `sc` as one rank.  opts come from mpg_thread_run or from
 * MPG_INIT_OPTS_INIT (MPI).  Returns MPG_OK, or a status with o->msg. */
static SC_UNUSED mpg_status sc_run(const mpg_init_opts *opts, const scenario *sc, sc_out *o) {
  mpg_status rc = MPG_OK;
  int rank = opts->rank;
  sc_objs h = {0};
  sc_mesh_info *mi = calloc(1, sizeof *mi);
  void **views = calloc(SC_MAX_PARAMS, sizeof *views);
  int *ids = calloc(SC_MAX_PARAMS, sizeof *ids);
  int *order = calloc(SC_MAX_PARAMS, sizeof *order);
  unsigned *masks = calloc(SC_MAX_PARAMS, sizeof *masks);
  o->msg[0] = '\0';
  SC_CHECK(mi && views && ids && order && masks, "out of memory");
  if ((rc = sc_open(opts, sc->mesh, sc->flatten, sc->lazy, &h, mi, o))) goto done;
  rank = mpg_ctx_rank(h.ctx);
  int npresent = 0;

  mi->pp_dim = -1;
  mi->pp_size = 1;
  for (int d = 0; d < mi->ndims; d++) {
    const char *name;
    int size;
    mpg_mesh_dim(h.mesh, d, &name, &size);
    if (strcmp(name, "pp") == 0) mi->pp_dim = d, mi->pp_size = size;
  }

  /* The tied group: first and last pipeline stage (every rank calls). */
  mpg_group *tied = NULL;
  int any_tied = 0;
  for (int p = 0; p < sc->nparams; p++) any_tied |= sc->params[p].tied;
  if (any_tied) {
    SC_CHECK(mi->pp_dim >= 0, "tied params need a pp dim");
    int pos[2] = {0, mi->pp_size - 1};
    SC_TRY(mpg_ctx_group_select(h.ctx, "pp", pos, mi->pp_size > 1 ? 2 : 1, &tied));
    int stage = mi->coord[rank][mi->pp_dim];
    int member = stage == 0 || stage == mi->pp_size - 1;
    SC_CHECK((tied != NULL) == member, "tied group: member %d but group %p", member,
             (void *)tied);
  }

  /* Which params this rank's pipeline stage holds (all without pp). */
  int stage = mi->pp_dim >= 0 ? mi->coord[rank][mi->pp_dim] : 0;
#define SC_HERE(pa) (!(pa)->stages || ((pa)->stages >> stage & 1u))

  mpg_sync_opts so = MPG_SYNC_OPTS_INIT;
  so.sync.fsdp_owns_dp = sc->fsdp;
  so.sync.op = sc->op;
  so.grad_scale = sc->grad_scale;
  so.sync.bucket_mb = sc->bucket_mb;
  so.sync.first_bucket_mb = sc->first_bucket_mb;
  so.default_dims = sc->default_dims;
  so.sync.reduce_dtype = sc->reduce_dtype;
  SC_TRY(mpg_sync_create(h.ctx, &so, &h.sync));

  for (int p = 0; p < sc->nparams; p++) {
    const sc_param *pa = &sc->params[p];
    ids[p] = -1;
    SC_CHECK(sc_mask(h.mesh, pa->expect_dims, &masks[p]) == 0, "bad expect_dims \"%s\"",
             pa->expect_dims);
    if (!SC_HERE(pa)) continue;
    mpg_param_opts po = MPG_PARAM_OPTS_INIT;
    po.reduce_dims = pa->reduce_dims;
    po.tied_group = pa->tied ? tied : NULL;
    const char *pname = pa->last_name && mi->pp_dim >= 0 && stage == mi->pp_size - 1
                            ? pa->last_name : pa->name;
    SC_TRY(mpg_sync_add_param(h.sync, pname, pa->count, pa->dtype, &po, &ids[p]));
    SC_CHECK(ids[p] == npresent, "param %s got id %d, expected %d", pa->name, ids[p],
             npresent);
    npresent++;
  }
  SC_TRY(mpg_sync_commit(h.sync));

  mpg_sync_stats stats = MPG_SYNC_STATS_INIT;
  SC_TRY(mpg_sync_get_stats(h.sync, &stats));
  o->nbuckets = stats.num_buckets;
  o->nbuffers = stats.num_buffers;
  SC_CHECK(stats.num_params == npresent, "num_params %d, expected %d", stats.num_params,
           npresent);
  SC_CHECK(stats.launched_buckets == 0, "launched %ld before any step", stats.launched_buckets);
  if (sc->expect_buckets >= 0)
    SC_CHECK(stats.num_buckets == sc->expect_buckets, "num_buckets %d, expected %d",
             stats.num_buckets, sc->expect_buckets);
  if (sc->expect_buffers >= 0)
    SC_CHECK(stats.num_buffers == sc->expect_buffers, "num_buffers %d, expected %d",
             stats.num_buffers, sc->expect_buffers);
  SC_CHECK(stats.num_buckets >= stats.num_buffers, "%d buckets < %d buffers",
           stats.num_buckets, stats.num_buffers);

  /* Views: zeroed, inside total_bytes, and laid out in reverse
   * registration order within a buffer (same dtype, group and tied). */
  size_t sum_bytes = 0;
  for (int p = 0; p < sc->nparams; p++) {
    const sc_param *pa = &sc->params[p];
    if (!SC_HERE(pa)) continue;
    SC_TRY(mpg_sync_grad(h.sync, ids[p], &views[p]));
    SC_CHECK(views[p] != NULL, "param %s: NULL view", pa->name);
    for (size_t i = 0; i < pa->count; i++)
      SC_CHECK(sc_get(views[p], pa->dtype, i) == 0, "param %s[%zu] not zero at start",
               pa->name, i);
    sum_bytes += pa->count * mpg_dtype_size(pa->dtype);
    mpg_group *g = NULL;
    SC_TRY(mpg_sync_param_group(h.sync, ids[p], &g));
    int want = 1;
    for (int q = 0; q < mi->world; q++)
      if (q != rank && sc_same_outside(mi, rank, q, masks[p])) want++;
    SC_CHECK(g && mpg_group_size(g) == want, "param %s: group \"%s\" of %d ranks, expected %d",
             pa->name, mpg_group_name(g), mpg_group_size(g), want);
  }
  SC_CHECK(stats.total_bytes >= sum_bytes, "total_bytes %zu < %zu", stats.total_bytes, sum_bytes);
  SC_CHECK(stats.total_bytes <= sum_bytes + (size_t)npresent * 64,
           "total_bytes %zu: more than 64 bytes of padding per param over %zu",
           stats.total_bytes, sum_bytes);
  for (int a = 0; a < sc->nparams; a++) {
    const sc_param *pa = &sc->params[a];
    if (!SC_HERE(pa)) continue;
    char *lo_a = views[a], *hi_a = lo_a + pa->count * mpg_dtype_size(pa->dtype);
    for (int b = a + 1; b < sc->nparams; b++) {
      const sc_param *pb = &sc->params[b];
      if (!SC_HERE(pb)) continue;
      char *lo_b = views[b], *hi_b = lo_b + pb->count * mpg_dtype_size(pb->dtype);
      SC_CHECK(hi_a <= lo_b || hi_b <= lo_a, "views of %s and %s overlap", pa->name, pb->name);
      int same = pa->dtype == pb->dtype && masks[a] == masks[b] && pa->tied == pb->tied;
      if (same)
        SC_CHECK(hi_b <= lo_a, "params %s (id %d) and %s (id %d) share a buffer but "
                 "are not in reverse registration order", pa->name, a, pb->name, b);
    }
  }

  long launched = 0;
  for (int step = 0; step < sc->steps; step++) {
    for (int m = 0; m < sc->microbatches; m++) {
      int last = m == sc->microbatches - 1;
      /* Backward: a per-rank order (random, or reverse registration). */
      for (int p = 0; p < sc->nparams; p++) order[p] = sc->nparams - 1 - p;
      if (sc->seed) {
        unsigned s = sc->seed * 7919u + (unsigned)rank * 104729u + (unsigned)step * 31u +
                     (unsigned)m;
        for (int p = sc->nparams - 1; p > 0; p--) {
          int j = (int)(sc_rand(&s) % (unsigned)(p + 1));
          int t = order[p];
          order[p] = order[j];
          order[j] = t;
        }
      }
      if (last && sc->sync_all) {
        for (int k = 0; k < sc->nparams; k++) {
          int p = order[k];
          if (!SC_HERE(&sc->params[p])) continue;
          for (size_t i = 0; i < sc->params[p].count; i++)
            sc_set(views[p], sc->params[p].dtype, i,
                   sc_get(views[p], sc->params[p].dtype, i) + (double)sc_value(rank, p, i, step, m));
        }
        SC_TRY(mpg_sync_all(h.sync, step, NULL));
      } else {
        SC_TRY(mpg_sync_begin(h.sync, step, last, NULL));
        for (int k = 0; k < sc->nparams; k++) {
          int p = order[k];
          const sc_param *pa = &sc->params[p];
          if (!SC_HERE(pa)) continue;
          for (size_t i = 0; i < pa->count; i++)
            sc_set(views[p], pa->dtype, i,
                   sc_get(views[p], pa->dtype, i) + (double)sc_value(rank, p, i, step, m));
          if (last && sc->unmarked && p % sc->unmarked == 0) continue;
          SC_TRY(mpg_sync_mark_ready(h.sync, ids[p]));
        }
        SC_TRY(mpg_sync_get_stats(h.sync, &stats));
        if (!last)
          SC_CHECK(stats.launched_buckets == launched,
                   "step %d micro-batch %d (not last): %ld buckets launched, expected %ld",
                   step, m, stats.launched_buckets, launched);
        SC_TRY(mpg_sync_finish(h.sync));
      }
      SC_TRY(mpg_sync_get_stats(h.sync, &stats));
      if (last) launched += stats.num_buckets;
      SC_CHECK(stats.launched_buckets == launched,
               "step %d micro-batch %d: %ld buckets launched in all, expected %ld", step, m,
               stats.launched_buckets, launched);
    }
    SC_CHECK(mpg_sync_grads_valid(h.sync) == 1, "grads_valid is 0 after a good step");
    /* Every element against the reduction over exactly its group. */
    for (int p = 0; p < sc->nparams; p++) {
      const sc_param *pa = &sc->params[p];
      if (!SC_HERE(pa)) continue;
      for (size_t i = 0; i < pa->count; i++) {
        double want = sc_expected(sc, mi, masks[p], rank, p, i, step);
        double got = sc_get(views[p], pa->dtype, i);
        SC_CHECK(sc_near(pa->dtype, got, want),
                 "step %d: param %s (%s, expected dims \"%s\"%s) element %zu: got %.9g, "
                 "expected %.9g",
                 step, pa->name, mpg_dtype_name(pa->dtype), pa->expect_dims,
                 pa->tied ? ", tied" : "", i, got, want);
      }
    }
    if (sc->check_differs && step == 0) {
      /* The reduction leaves `differs_dim` alone: the rank next along it
       * ends with other values (so a reduce over it would have shown). */
      unsigned dmask;
      SC_CHECK(sc_mask(h.mesh, sc->differs_dim, &dmask) == 0, "bad differs_dim");
      int q = -1;
      for (int r2 = 0; r2 < mi->world && q < 0; r2++)
        if (r2 != rank && sc_same_outside(mi, rank, r2, dmask)) q = r2;
      SC_CHECK(q >= 0, "no neighbour along %s", sc->differs_dim);
      int differ = 0;
      for (int p = 0; p < sc->nparams && !differ; p++)
        for (size_t i = 0; i < sc->params[p].count && !differ; i++)
          differ = sc_expected(sc, mi, masks[p], rank, p, i, step) !=
                   sc_expected(sc, mi, masks[p], q, p, i, step);
      SC_CHECK(differ, "ranks %d and %d (along %s) end with equal gradients", rank, q,
               sc->differs_dim);
    }
    SC_TRY(mpg_sync_zero_grads(h.sync));
    for (int p = 0; p < sc->nparams; p++)
      for (size_t i = 0; SC_HERE(&sc->params[p]) && i < sc->params[p].count; i++)
        SC_CHECK(sc_get(views[p], sc->params[p].dtype, i) == 0, "param %s[%zu] not zeroed",
                 sc->params[p].name, i);
  }
  o->launched = launched;
#undef SC_HERE

done:
  return sc_destroy(o, rank, rc, &h, 5, (void *[]){mi, views, ids, order, masks});
}

/* ------------------------------------------------------------------ */
/* The scenarios                                                       */
/* ------------------------------------------------------------------ */

static SC_UNUSED void sc_init(scenario *sc, const char *name, const char *mesh,
                              const char *flatten, int world) {
  memset(sc, 0, sizeof *sc);
  snprintf(sc->name, sizeof sc->name, "%s", name);
  sc->mesh = mesh;
  sc->flatten = flatten;
  sc->world = world;
  sc->op = MPG_OP_AVG;
  sc->grad_scale = 1.0;
  sc->bucket_mb = 25.0;
  sc->first_bucket_mb = 1.0;
  sc->reduce_dtype = MPG_REDUCE_F32;
  sc->microbatches = 1;
  sc->steps = 2;
  sc->expect_buckets = -1;
  sc->expect_buffers = -1;
}

/* The scenario's bucket cap and first bucket, in MB. */
static SC_UNUSED void sc_buckets(scenario *sc, double bucket_mb, double first_bucket_mb) {
  sc->bucket_mb = bucket_mb;
  sc->first_bucket_mb = first_bucket_mb;
}

static SC_UNUSED void sc_add(scenario *sc, const char *name, size_t count, mpg_dtype dtype,
                             const char *reduce_dims, const char *expect_dims, int tied) {
  sc_param *p = &sc->params[sc->nparams];
  if (name)
    snprintf(p->name, sizeof p->name, "%s", name);
  else
    snprintf(p->name, sizeof p->name, "p%d", sc->nparams);
  p->count = count;
  p->dtype = dtype;
  p->reduce_dims = reduce_dims;
  p->expect_dims = expect_dims;
  p->tied = tied;
  sc->nparams++;
}

/* A small transformer-like stage: embedding, layers of (qkv, proj, norm),
 * final norm; the norms are sequence-parallel when `sp`. */
static SC_UNUSED void sc_add_model(scenario *sc, int layers, mpg_dtype dt, const char *dflt,
                                   const char *sp) {
  char name[40];
  sc_add(sc, "embedding", 700, dt, NULL, dflt, 0);
  for (int l = 0; l < layers; l++) {
    snprintf(name, sizeof name, "layer%d.qkv", l);
    sc_add(sc, name, 300 + (size_t)l * 17, dt, NULL, dflt, 0);
    snprintf(name, sizeof name, "layer%d.proj", l);
    sc_add(sc, name, 129, dt, NULL, dflt, 0);
    snprintf(name, sizeof name, "layer%d.norm", l);
    sc_add(sc, name, 16, dt, sp ? "dp_cp,tp" : NULL, sp ? sp : dflt, 0);
  }
  sc_add(sc, "final_norm", 16, dt, sp ? "dp_cp,tp" : NULL, sp ? sp : dflt, 0);
}

/* "pp_random:SEED" (issue 20): a random pipeline mesh for `world` ranks,
 * whose stages register different params.  pp is 2..4 (a divisor of the
 * world), the rest of the world split at random over dp, cp and tp (sizes
 * 1 allowed), the four dims in a random order, dp_cp flattened.  4..14
 * params, each on a random non-empty set of stages, with a random count,
 * dtype (f32, f64, bf16) and reduce_dims: the default (dp_cp) or a random
 * non-empty subset of {dp, cp, tp} (never pp: ranks of different stages
 * hold different params).  Some are tied over the first and last stage
 * (present on both, and maybe on stages between, where they are plain
 * params).  Every stage holds at least one param.  Random micro-batches,
 * bucket sizes and ready orders.  Returns -1 when no pp fits the world. */
static SC_UNUSED int sc_build_random(scenario *sc, unsigned seed, int world) {
  unsigned r = seed * 2654435761u + 977u;
  int pps[3], npp = 0;
  for (int P = 2; P <= 4; P++)
    if (world % P == 0) pps[npp++] = P;
  if (npp == 0 || world > SC_MAX_RANKS) return -1;
  int P = pps[sc_rand(&r) % (unsigned)npp], rest = world / P, size[3] = {1, 1, 1};
  /* rest over dp, cp, tp: deal its prime factors at random. */
  for (int f = 2; rest > 1; f++)
    while (rest % f == 0) {
      size[sc_rand(&r) % 3] *= f;
      rest /= f;
    }
  sc_init(sc, "", NULL, NULL, world);
  snprintf(sc->name, sizeof sc->name, "pp_random:%u", seed);
  const char *dn[4] = {"pp", "dp", "cp", "tp"};
  int ds[4] = {P, size[0], size[1], size[2]}, perm[4] = {0, 1, 2, 3};
  sc_shuffle(perm, 4, &r);
  int n = 0;
  for (int i = 0; i < 4; i++)
    n += snprintf(sc->mesh_buf + n, sizeof sc->mesh_buf - (size_t)n, "%s%s=%d", i ? "," : "",
                  dn[perm[i]], ds[perm[i]]);
  /* Dim lists name the dims in mesh order (the spec's rule). */
  int at[4];
  for (int i = 0; i < 4; i++) at[perm[i]] = i;
  snprintf(sc->flatten_buf, sizeof sc->flatten_buf, "dp_cp=%s",
           at[1] < at[2] ? "dp,cp" : "cp,dp");
  sc->mesh = sc->mesh_buf;
  sc->flatten = sc->flatten_buf;
  /* reduce_dims strings: subset k (bits dp 1, cp 2, tp 4) at dims_buf[k]. */
  for (unsigned k = 1; k < 8; k++) {
    char *b = sc->dims_buf[k];
    size_t len = 0;
    b[0] = '\0';
    for (int i = 0; i < 4; i++) {
      int d = perm[i] - 1; /* mesh order; pp (-1) never */
      if (d >= 0 && (k >> d & 1u))
        len += (size_t)snprintf(b + len, sizeof sc->dims_buf[k] - len, "%s%s", len ? "," : "",
                                dn[1 + d]);
    }
  }
  static const mpg_dtype dts[3] = {MPG_F32, MPG_F64, MPG_BF16};
  int np = 4 + (int)(sc_rand(&r) % 11u);
  unsigned all = (1u << P) - 1u, covered = 0;
  for (int i = 0; i < np; i++) {
    int tied = sc_rand(&r) % 5u == 0;
    unsigned k = sc_rand(&r) % 10u; /* 0..2: the default, else subset k - 2 (1..7) */
    const char *rd = k < 3 ? NULL : sc->dims_buf[k - 2];
    sc_add(sc, NULL, 1 + sc_rand(&r) % 300u, dts[sc_rand(&r) % 3u], rd, rd ? rd : "dp,cp",
           tied);
    unsigned st = sc_rand(&r) & all;
    if (tied) st |= 1u | (1u << (P - 1));
    if (!st) st = 1u << (sc_rand(&r) % (unsigned)P);
    sc->params[i].stages = st;
    covered |= st;
  }
  for (int s = 0; s < P; s++) /* every stage holds something */
    if (!(covered >> s & 1u)) sc->params[sc_rand(&r) % (unsigned)np].stages |= 1u << s;
  sc->microbatches = 1 + (int)(sc_rand(&r) % 2u);
  sc->bucket_mb = 0.0005 + 0.0005 * (double)(sc_rand(&r) % 8u);
  sc->first_bucket_mb = 0.0005;
  sc->seed = 1 + sc_rand(&r) % 1000u;
  return 0;
}

/* Fill `sc` with the scenario called `name` for `world` ranks; 0 or -1. */
static SC_UNUSED int sc_build(scenario *sc, const char *name, int world) {
  if (strncmp(name, "pp_random:", 10) == 0)
    return sc_build_random(sc, (unsigned)strtoul(name + 10, NULL, 10), world);
  if (strcmp(name, "dp_cp_default") == 0 && world == 8) {
    sc_init(sc, name, "dp=2,cp=2,tp=2", "dp_cp=dp,cp", 8);
    sc_add_model(sc, 3, MPG_F32, "dp,cp", NULL);
    sc->expect_buffers = 1;
    sc->check_differs = 1;
    sc->differs_dim = "tp";
  } else if (strcmp(name, "dp_cp_default") == 0 && world == 4) {
    sc_init(sc, name, "dp=2,cp=2", "dp_cp=dp,cp", 4);
    sc_add_model(sc, 3, MPG_F32, "dp,cp", NULL);
    sc->expect_buffers = 1;
  } else if (strcmp(name, "no_flatten_union") == 0 && world == 8) {
    /* No dp_cp set: the union of dp and cp. */
    sc_init(sc, name, "dp=2,tp=2,cp=2", NULL, 8);
    sc_add_model(sc, 2, MPG_F32, "dp,cp", NULL);
  } else if (strcmp(name, "fsdp_cp_only") == 0 && (world == 8 || world == 4)) {
    sc_init(sc, name, world == 8 ? "dp=2,cp=2,tp=2" : "dp=2,cp=2", "dp_cp=dp,cp", world);
    sc->fsdp = 1;
    sc_add_model(sc, 2, MPG_F32, "cp", NULL);
    sc->seed = 5;
  } else if (strcmp(name, "fsdp_no_cp") == 0 && (world == 8 || world == 4)) {
    /* Nothing to reduce: each rank keeps its own gradients (x grad_scale). */
    sc_init(sc, name, world == 8 ? "dp=4,tp=2" : "dp=2,tp=2", NULL, world);
    sc->fsdp = 1;
    sc->grad_scale = 0.5;
    sc_add_model(sc, 2, MPG_F32, "", NULL);
  } else if (strcmp(name, "default_dims") == 0 && world == 8) {
    sc_init(sc, name, "dp=2,cp=2,tp=2", "dp_cp=dp,cp", 8);
    sc->default_dims = "dp";
    sc_add_model(sc, 2, MPG_F64, "dp", NULL);
  } else if (strcmp(name, "sp_norm") == 0 && (world == 8 || world == 4)) {
    sc_init(sc, name, world == 8 ? "dp=2,cp=2,tp=2" : "dp=2,tp=2",
            world == 8 ? "dp_cp=dp,cp" : "dp_cp=dp", world);
    sc_add_model(sc, 4, MPG_F32, world == 8 ? "dp,cp" : "dp", world == 8 ? "dp,cp,tp" : "dp,tp");
    sc->expect_buffers = 2;
    sc->seed = 11;
  } else if (strcmp(name, "experts") == 0 && world == 8) {
    /* Dense weights average over all data-parallel ranks (edp x ep);
     * expert weights over the expert-data-parallel dim only. */
    sc_init(sc, name, "edp=2,ep=2,tp=2", "dp_cp=edp,ep", 8);
    sc_add(sc, "embedding", 500, MPG_F32, NULL, "edp,ep", 0);
    for (int l = 0; l < 3; l++) {
      char n[40];
      snprintf(n, sizeof n, "layer%d.attn", l);
      sc_add(sc, n, 200, MPG_F32, NULL, "edp,ep", 0);
      snprintf(n, sizeof n, "layer%d.router", l);
      sc_add(sc, n, 8, MPG_F32, NULL, "edp,ep", 0);
      snprintf(n, sizeof n, "layer%d.experts", l);
      sc_add(sc, n, 333, MPG_F32, "edp", "edp", 0);
      snprintf(n, sizeof n, "layer%d.norm", l);
      sc_add(sc, n, 16, MPG_F32, "dp_cp,tp", "edp,ep,tp", 0);
    }
    sc->expect_buffers = 3;
    sc->seed = 3;
  } else if (strcmp(name, "tied_pp2") == 0 && world == 8) {
    sc_init(sc, name, "pp=2,dp=2,cp=2", "dp_cp=dp,cp", 8);
    sc_add(sc, "wte", 640, MPG_F32, NULL, "dp,cp", 1);
    sc_add_model(sc, 2, MPG_F32, "dp,cp", NULL);
    sc->seed = 9;
  } else if (strcmp(name, "tied_pp3") == 0 && (world == 6 || world == 12)) {
    sc_init(sc, name, world == 6 ? "pp=3,dp=2" : "pp=3,dp=2,tp=2", NULL, world);
    sc_add(sc, "wte", 512, MPG_F32, NULL, "dp", 1);
    sc_add(sc, "wte_bf16", 100, MPG_BF16, NULL, "dp", 1);
    sc_add_model(sc, 2, MPG_F32, "dp", world == 12 ? "dp,tp" : NULL);
    if (world == 12) {
      for (int p = 0; p < sc->nparams; p++)
        if (sc->params[p].reduce_dims) sc->params[p].reduce_dims = "dp,tp";
    }
    sc->microbatches = 2;
  } else if (strcmp(name, "tied_pp2") == 0 && world == 4) {
    sc_init(sc, name, "pp=2,dp=2", NULL, 4);
    sc_add(sc, "wte", 64, MPG_F64, NULL, "dp", 1);
    sc_add(sc, "w", 64, MPG_F64, NULL, "dp", 0);
    sc_add(sc, "wte_norm", 8, MPG_F64, "world", "pp,dp", 1);
    sc->microbatches = 2;
  } else if (strcmp(name, "dtypes") == 0 && (world == 8 || world == 4)) {
    sc_init(sc, name, world == 8 ? "dp=2,cp=2,tp=2" : "dp=2,cp=2", "dp_cp=dp,cp", world);
    const mpg_dtype dts[] = {MPG_F32, MPG_F64, MPG_F16, MPG_BF16, MPG_I32, MPG_I64};
    for (int k = 0; k < 12; k++) sc_add(sc, NULL, 50 + (size_t)k * 13, dts[k % 6], NULL, "dp,cp", 0);
    sc->expect_buffers = 6;
    sc->microbatches = 3;
    sc->seed = 21;
  } else if (strcmp(name, "dtypes_sum") == 0 && world == 8) {
    sc_init(sc, name, "dp=2,cp=2,tp=2", "dp_cp=dp,cp", 8);
    sc->op = MPG_OP_SUM;
    const mpg_dtype dts[] = {MPG_F32, MPG_F64, MPG_F16, MPG_BF16, MPG_I32, MPG_I64};
    for (int k = 0; k < 6; k++) sc_add(sc, NULL, 77, dts[k], NULL, "dp,cp", 0);
    for (int k = 0; k < 6; k++) sc_add(sc, NULL, 33, dts[k], "dp_cp,tp", "dp,cp,tp", 0);
    sc->expect_buffers = 12;
    sc->reduce_dtype = MPG_REDUCE_NATIVE;
  } else if (strcmp(name, "grad_scale") == 0 && (world == 8 || world == 4)) {
    sc_init(sc, name, world == 8 ? "dp=2,cp=2,tp=2" : "dp=2,cp=2", "dp_cp=dp,cp", world);
    sc->grad_scale = 1.0 / 3.0;
    sc->microbatches = 3;
    const mpg_dtype dts[] = {MPG_F32, MPG_F64, MPG_F16, MPG_BF16};
    for (int k = 0; k < 8; k++) sc_add(sc, NULL, 90, dts[k % 4], NULL, "dp,cp", 0);
    sc_add(sc, "norm", 16, MPG_F32, world == 8 ? "dp_cp,tp" : "world", "dp,cp", 0);
    if (world == 8) sc->params[sc->nparams - 1].expect_dims = "dp,cp,tp";
    sc->seed = 77;
  } else if (strcmp(name, "grad_scale_sum") == 0 && world == 8) {
    sc_init(sc, name, "dp=2,cp=2,tp=2", "dp_cp=dp,cp", 8);
    sc->op = MPG_OP_SUM;
    sc->grad_scale = 0.25;
    sc_add_model(sc, 2, MPG_F32, "dp,cp", "dp,cp,tp");
  } else if (strcmp(name, "buckets_big") == 0 && world == 8) {
    /* Every param larger than a bucket: one bucket each. */
    sc_init(sc, name, "dp=2,cp=2,tp=2", "dp_cp=dp,cp", 8);
    sc_buckets(sc, 0.001, 0.001);
    for (int k = 0; k < 10; k++) sc_add(sc, NULL, 1000 + (size_t)k, MPG_F32, NULL, "dp,cp", 0);
    sc->expect_buckets = 10;
    sc->seed = 1;
  } else if (strcmp(name, "buckets_tiny") == 0 && (world == 8 || world == 4)) {
    /* Many tiny params share one bucket. */
    sc_init(sc, name, world == 8 ? "dp=2,cp=2,tp=2" : "dp=2,cp=2", "dp_cp=dp,cp", world);
    for (int k = 0; k < 500; k++) sc_add(sc, NULL, 1 + (size_t)(k % 4), MPG_F32, NULL, "dp,cp", 0);
    sc->expect_buckets = 1;
    sc->expect_buffers = 1;
    sc->seed = 2;
    sc->steps = 1;
  } else if (strcmp(name, "buckets_tiny_small_cap") == 0 && world == 8) {
    sc_init(sc, name, "dp=2,cp=2,tp=2", "dp_cp=dp,cp", 8);
    sc_buckets(sc, 0.001, 0.001);
    for (int k = 0; k < 300; k++) sc_add(sc, NULL, 1 + (size_t)(k % 3), MPG_F32, NULL, "dp,cp", 0);
    for (int k = 0; k < 40; k++) sc_add(sc, NULL, 700, MPG_F32, "dp_cp,tp", "dp,cp,tp", 0);
    for (int k = 0; k < 100; k++) sc_add(sc, NULL, 2, MPG_BF16, NULL, "dp,cp", 0);
    sc->seed = 4;
    sc->microbatches = 2;
  } else if (strcmp(name, "accumulate") == 0 && world == 8) {
    sc_init(sc, name, "dp=2,cp=2,tp=2", "dp_cp=dp,cp", 8);
    sc_add_model(sc, 3, MPG_F32, "dp,cp", "dp,cp,tp");
    sc->microbatches = 4;
    sc->steps = 3;
    sc->seed = 8;
    sc_buckets(sc, 0.002, 0.0005);
  } else if (strcmp(name, "sync_all") == 0 && (world == 8 || world == 4)) {
    sc_init(sc, name, world == 8 ? "dp=2,cp=2,tp=2" : "dp=2,cp=2", "dp_cp=dp,cp", world);
    sc_add_model(sc, 3, MPG_F32, "dp,cp", NULL);
    sc_add(sc, "half", 99, MPG_BF16, NULL, "dp,cp", 0);
    sc->sync_all = 1;
    sc->microbatches = 2;
    sc_buckets(sc, 0.003, 0.001);
  } else if (strcmp(name, "unmarked") == 0 && world == 8) {
    /* finish launches buckets whose params were never marked. */
    sc_init(sc, name, "dp=2,cp=2,tp=2", "dp_cp=dp,cp", 8);
    sc_add_model(sc, 3, MPG_F32, "dp,cp", "dp,cp,tp");
    sc->unmarked = 3;
    sc_buckets(sc, 0.002, 0.0005);
    sc->seed = 13;
  } else {
    return -1;
  }
  if (sc->world != world) return -1;
  return 0;
}

/* Every scenario name, for the MPI worker's "all" mode. */
static SC_UNUSED const char *const sc_names[] = {
    "dp_cp_default", "no_flatten_union", "fsdp_cp_only", "fsdp_no_cp",
    "default_dims",  "sp_norm",          "experts",      "tied_pp2",
    "tied_pp3",      "dtypes",           "dtypes_sum",   "grad_scale",
    "grad_scale_sum", "buckets_big",     "buckets_tiny", "buckets_tiny_small_cap",
    "accumulate",    "sync_all",         "unmarked",
    NULL};

#endif
