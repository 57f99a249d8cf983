/* Property checks of the sync's shard mode (MPG_SYNC_SHARD), shared by
 * test_shard.c (thread backend, ranks are threads) and sync_mpi_worker.c
 * (MPI backend, ranks are processes).
 *
 * A shard case is a mesh, the shard options and a parameter list (counts,
 * dtypes f32/f64/bf16, some with reduce dims of their own, which keeps
 * them replicated; reduce dims that name the sync's own data-parallel group
 * change nothing: such a param is sharded like the others).  Every rank runs it with shc_run, which checks, from the
 * public API only and against expectations computed here from the mesh
 * coordinates:
 *
 *  - the shard group size (stats.shard_size) and padding: the sharded
 *    buffers (every param's elements plus pad_elems) add up to a multiple
 *    of lcm(S, 128) (x 65536 with pad_for_nccl); with one param per bucket
 *    (bucket_mb tiny) exactly: each bucket is the param rounded up to that
 *    multiple, position r of the shard group owns slice r of it, and
 *    pad_elems is the sum of the round-ups;
 *  - mpg_sync_get_shard: replicated params whole, sharded ranges inside the
 *    param, state ranges [shard_offset, +count) disjoint and inside
 *    shard_elems;
 *  - the owned ranges of the members of each shard group (all-gathered over
 *    the world) partition every sharded param: each element exactly once;
 *  - after each step (micro-batches accumulated, params marked ready in a
 *    per-rank random order) every owned gradient element equals the
 *    average (or sum) over exactly the data-parallel ranks (shard and
 *    replicate dims), times grad_scale; replicated params over their own
 *    dims.  Gradient values are never 0, so an owned range that fell on
 *    padding would show;
 *  - an "optimizer" writes a known value into the owned part of every
 *    param (replicated params whole); after mpg_sync_gather_begin and the
 *    waits (per param in forward order, checking each param right after
 *    its wait, or part of them and then mpg_sync_gather_all, or only
 *    mpg_sync_gather_all) every rank holds every param in full.
 *
 * shc_random builds a random case for a given world size (random dims and
 * their order, shard/replicate dims, params, buckets, micro-batches). */
#ifndef SHARD_CHECK_H
#define SHARD_CHECK_H

#include "sync_scenarios.h"

#define SHC_MAX_PARAMS 24

typedef struct shc_param {
  size_t count;
  mpg_dtype dtype;
  const char *reduce_dims; /* NULL: sharded; else replicated over these */
} shc_param;

typedef struct shard_case {
  char name[64];
  char mesh[96];
  char flatten[96];       /* "dp_cp=dp,cp" */
  char shard_dims[48];    /* "": the default group, dp_cp */
  char replicate_dims[48]; /* "": none */
  int world;
  int pad_for_nccl;
  double bucket_mb, first_bucket_mb;
  mpg_op op;
  double grad_scale;
  int microbatches, steps;
  int one_per_bucket;     /* bucket_mb so small that each param has its own */
  unsigned seed;          /* ready order, gather pattern */
  int nparams;
  shc_param params[SHC_MAX_PARAMS];
} shard_case;

static SC_UNUSED size_t shc_lcm(size_t a, size_t b) {
  size_t x = a, y = b;
  while (y) {
    size_t t = x % y;
    x = y;
    y = t;
  }
  return a / x * b;
}

/* A gradient value: odd, so never 0 (|v| <= 13: sums stay exact). */
static SC_UNUSED long shc_grad(int rank, int p, size_t i, int step, int mb) {
  return 2 * sc_value(rank, p, i, step, mb) + 1;
}

/* The value the "optimizer" gives element i of param p at `step`: a small
 * integer, exact in bf16. */
static SC_UNUSED double shc_pval(int p, size_t i, int step) {
  return (double)((long)((p * 7 + (long)(i % 4096) * 3 + step * 5) % 61) - 30);
}

/* Mask of mesh dims named by "a,b" (dims, flattened sets, "world"); ""
 * gives 0.  Returns 0, or -1 for an unknown name. */
static SC_UNUSED int shc_mask(const mpg_mesh *mesh, const char *list, unsigned *mask) {
  char buf[128];
  snprintf(buf, sizeof buf, "%s", list ? list : "");
  *mask = 0;
  char *save = NULL;
  for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    int set, dims[MPG_MAX_DIMS], n;
    if (mpg_mesh_dimset_find(mesh, tok, &set) != MPG_OK ||
        mpg_mesh_dimset_dims(mesh, set, dims, &n) != MPG_OK)
      return -1;
    for (int k = 0; k < n; k++) *mask |= 1u << dims[k];
  }
  return 0;
}

/* Row-major position of `rank` over the dims of `mask` (mesh order). */
static SC_UNUSED int shc_position(const mpg_mesh *mesh, const sc_mesh_info *mi, int rank,
                                  unsigned mask) {
  int pos = 0;
  for (int d = 0; d < mi->ndims; d++)
    if (mask & (1u << d)) {
      int size;
      mpg_mesh_dim(mesh, d, NULL, &size);
      pos = pos * size + mi->coord[rank][d];
    }
  return pos;
}

/* Expected reduced gradient of element i of param p on rank r over the
 * ranks sharing r's coordinates outside `mask`. */
static SC_UNUSED double shc_expected(const shard_case *c, const sc_mesh_info *mi, unsigned mask,
                                     int r, int p, size_t i, int step) {
  int n;
  double v = (double)sc_group_sum(mi, mask, r, c->microbatches, 1, p, i, step, &n);
  if (c->op == MPG_OP_AVG) v /= n;
  return v * c->grad_scale;
}

/* Run case `c` as one rank.  Returns MPG_OK, or a status with o->msg. */
static SC_UNUSED mpg_status shc_run(const mpg_init_opts *opts, const shard_case *c, sc_out *o) {
  mpg_status rc = MPG_OK;
  int rank = opts->rank;
  sc_objs h = {0};
  sc_mesh_info *mi = calloc(1, sizeof *mi);
  void *gv[SHC_MAX_PARAMS], *pv[SHC_MAX_PARAMS];
  mpg_shard_info info[SHC_MAX_PARAMS];
  unsigned pmask[SHC_MAX_PARAMS];
  int64_t *mine = NULL, *all = NULL;
  unsigned char *cover = NULL;
  o->msg[0] = '\0';
  SC_CHECK(mi, "out of memory");
  SC_CHECK(c->nparams <= SHC_MAX_PARAMS, "too many params");
  if ((rc = sc_open(opts, c->mesh, c->flatten[0] ? c->flatten : NULL, 0, &h, mi, o))) goto done;
  rank = mpg_ctx_rank(h.ctx);

  /* The expected groups: shard (default dp_cp), replicate, their union. */
  unsigned smask = 0, rmask = 0;
  SC_CHECK(shc_mask(h.mesh, c->shard_dims[0] ? c->shard_dims : "dp_cp", &smask) == 0,
           "bad shard_dims \"%s\"", c->shard_dims);
  SC_CHECK(shc_mask(h.mesh, c->replicate_dims, &rmask) == 0, "bad replicate_dims \"%s\"",
           c->replicate_dims);
  unsigned dmask = smask | rmask;
  int S = 1;
  for (int d = 0; d < mi->ndims; d++)
    if (smask & (1u << d)) {
      int size;
      mpg_mesh_dim(h.mesh, d, NULL, &size);
      S *= size;
    }
  int spos = shc_position(h.mesh, mi, rank, smask);
  size_t L = shc_lcm((size_t)S, 128);
  if (c->pad_for_nccl) L = shc_lcm(L, 65536);

  mpg_sync_opts so = MPG_SYNC_OPTS_INIT;
  so.sync.mode = MPG_SYNC_SHARD;
  snprintf(so.sync.shard_dims, sizeof so.sync.shard_dims, "%s", c->shard_dims);
  snprintf(so.sync.replicate_dims, sizeof so.sync.replicate_dims, "%s", c->replicate_dims);
  so.sync.pad_for_nccl = c->pad_for_nccl;
  so.sync.bucket_mb = c->bucket_mb;
  so.sync.first_bucket_mb = c->first_bucket_mb;
  so.sync.op = c->op;
  so.grad_scale = c->grad_scale;
  SC_TRY(mpg_sync_create(h.ctx, &so, &h.sync));
  for (int p = 0; p < c->nparams; p++) {
    const shc_param *pa = &c->params[p];
    char name[32];
    snprintf(name, sizeof name, "p%d", p);
    mpg_param_opts po = MPG_PARAM_OPTS_INIT;
    po.reduce_dims = pa->reduce_dims;
    int id;
    SC_TRY(mpg_sync_add_param(h.sync, name, pa->count, pa->dtype, &po, &id));
    SC_CHECK(id == p, "param %d got id %d", p, id);
    if (pa->reduce_dims)
      SC_CHECK(shc_mask(h.mesh, pa->reduce_dims, &pmask[p]) == 0, "bad reduce_dims");
    else
      pmask[p] = dmask;
  }
  SC_TRY(mpg_sync_commit(h.sync));

  /* Layout facts. */
  mpg_sync_stats stats = MPG_SYNC_STATS_INIT;
  SC_TRY(mpg_sync_get_stats(h.sync, &stats));
  o->nbuckets = stats.num_buckets;
  o->nbuffers = stats.num_buffers;
  SC_CHECK(stats.shard_size == S, "shard_size %d, expected %d (shard dims \"%s\")",
           stats.shard_size, S, c->shard_dims);
  size_t sharded_elems = 0, repl_elems = 0, owned_sum = 0, pad_want = 0;
  for (int p = 0; p < c->nparams; p++) {
    const shc_param *pa = &c->params[p];
    info[p] = (mpg_shard_info)MPG_SHARD_INFO_INIT;
    SC_TRY(mpg_sync_get_shard(h.sync, p, &info[p]));
    SC_TRY(mpg_sync_grad(h.sync, p, &gv[p]));
    SC_TRY(mpg_sync_param(h.sync, p, &pv[p]));
    SC_CHECK(gv[p] && pv[p] && gv[p] != pv[p], "param p%d: views %p %p", p, gv[p], pv[p]);
    const mpg_shard_info *in = &info[p];
    /* Replicated: reduce dims of its own (other dims than the sync's
     * data-parallel group; naming that group's dims is no change). */
    int repl = pa->reduce_dims && pmask[p] != dmask;
    if (repl) {
      SC_CHECK(!in->sharded && in->param_offset == 0 && in->count == pa->count,
               "param p%d (reduce_dims %s): sharded %d [%zu, +%zu) of %zu, expected the "
               "whole param replicated",
               p, pa->reduce_dims, in->sharded, in->param_offset, in->count, pa->count);
      repl_elems += pa->count;
    } else {
      SC_CHECK(in->sharded == 1, "param p%d: not sharded", p);
      SC_CHECK(in->param_offset + in->count <= pa->count,
               "param p%d: owned [%zu, +%zu) outside its %zu elements", p, in->param_offset,
               in->count, pa->count);
      sharded_elems += pa->count;
      if (c->one_per_bucket) {
        /* Its own bucket: the param rounded up to L, slice r to position r. */
        size_t bucket = (pa->count + L - 1) / L * L, slice = bucket / (size_t)S;
        size_t lo = (size_t)spos * slice;
        size_t want = lo < pa->count ? (pa->count - lo < slice ? pa->count - lo : slice) : 0;
        pad_want += bucket - pa->count;
        SC_CHECK(in->count == want && (want == 0 || in->param_offset == lo),
                 "param p%d (%zu x %s, own bucket of %zu = %zu slices of %zu): shard position "
                 "%d owns [%zu, +%zu), expected [%zu, +%zu)",
                 p, pa->count, mpg_dtype_name(pa->dtype), bucket, (size_t)S, slice, spos,
                 in->param_offset, in->count, lo, want);
      }
    }
    SC_CHECK(in->shard_offset + in->count <= stats.shard_elems,
             "param p%d: state [%zu, +%zu) outside shard_elems %zu", p, in->shard_offset,
             in->count, stats.shard_elems);
    owned_sum += in->count;
  }
  /* State ranges are disjoint. */
  for (int a = 0; a < c->nparams; a++)
    for (int b = a + 1; b < c->nparams; b++) {
      const mpg_shard_info *x = &info[a], *y = &info[b];
      if (!x->count || !y->count) continue;
      SC_CHECK(x->shard_offset + x->count <= y->shard_offset ||
                   y->shard_offset + y->count <= x->shard_offset,
               "state ranges of p%d [%zu, +%zu) and p%d [%zu, +%zu) overlap", a,
               x->shard_offset, x->count, b, y->shard_offset, y->count);
    }
  SC_CHECK(owned_sum <= stats.shard_elems, "owned %zu > shard_elems %zu", owned_sum,
           stats.shard_elems);
  SC_CHECK(stats.shard_elems >= repl_elems, "shard_elems %zu < %zu replicated elements",
           stats.shard_elems, repl_elems);
  /* Padding: the sharded buffers hold whole buckets of multiples of L. */
  SC_CHECK((sharded_elems + stats.pad_elems) % L == 0,
           "sharded elements %zu + pad_elems %zu is not a multiple of lcm(S=%d, 128%s) = %zu",
           sharded_elems, stats.pad_elems, S, c->pad_for_nccl ? ", 65536" : "", L);
  if (c->one_per_bucket)
    SC_CHECK(stats.pad_elems == pad_want, "pad_elems %zu, expected %zu", stats.pad_elems,
             pad_want);

  /* The owned ranges of each shard group partition every sharded param. */
  mpg_group *world_g = NULL;
  SC_TRY(mpg_ctx_group(h.ctx, "world", &world_g));
  size_t words = 2 * (size_t)c->nparams;
  mine = calloc(words, sizeof *mine);
  all = calloc(words * (size_t)mi->world, sizeof *all);
  size_t maxcount = 1;
  for (int p = 0; p < c->nparams; p++)
    if (c->params[p].count > maxcount) maxcount = c->params[p].count;
  cover = calloc(maxcount, 1);
  SC_CHECK(mine && all && cover, "out of memory");
  for (int p = 0; p < c->nparams; p++) {
    mine[2 * p] = (int64_t)info[p].param_offset;
    mine[2 * p + 1] = (int64_t)info[p].count;
  }
  SC_TRY(mpg_all_gather(world_g, mine, all, words, MPG_I64, NULL, NULL));
  for (int p = 0; p < c->nparams; p++) {
    if (!info[p].sharded) continue;
    memset(cover, 0, c->params[p].count);
    for (int q = 0; q < mi->world; q++) {
      if (!sc_same_outside(mi, rank, q, smask)) continue;
      const int64_t *e = &all[(size_t)q * words + 2 * (size_t)p];
      SC_CHECK(e[0] >= 0 && e[1] >= 0 && e[0] + e[1] <= (int64_t)c->params[p].count,
               "param p%d: rank %d owns [%lld, +%lld) of %zu", p, q, (long long)e[0],
               (long long)e[1], c->params[p].count);
      for (int64_t i = e[0]; i < e[0] + e[1]; i++) {
        SC_CHECK(cover[i] == 0, "param p%d element %lld: owned twice (again by rank %d)", p,
                 (long long)i, q);
        cover[i] = 1;
      }
    }
    for (size_t i = 0; i < c->params[p].count; i++)
      SC_CHECK(cover[i], "param p%d (%zu x %s) element %zu: owned by no member of the shard "
               "group of rank %d", p, c->params[p].count, mpg_dtype_name(c->params[p].dtype),
               i, rank);
  }

  /* Steps. */
  int order[SHC_MAX_PARAMS];
  unsigned rs = c->seed * 2654435761u + (unsigned)rank * 40503u + 17u;
  for (int step = 0; step < c->steps; step++) {
    for (int m = 0; m < c->microbatches; m++) {
      int last = m == c->microbatches - 1;
      for (int p = 0; p < c->nparams; p++) order[p] = c->nparams - 1 - p;
      for (int p = c->nparams - 1; p > 0 && c->seed; p--) {
        int j = (int)(sc_rand(&rs) % (unsigned)(p + 1));
        int t = order[p];
        order[p] = order[j];
        order[j] = t;
      }
      SC_TRY(mpg_sync_begin(h.sync, step, last, NULL));
      for (int k = 0; k < c->nparams; k++) {
        int p = order[k];
        const shc_param *pa = &c->params[p];
        for (size_t i = 0; i < pa->count; i++)
          sc_set(gv[p], pa->dtype, i,
                 sc_get(gv[p], pa->dtype, i) + (double)shc_grad(rank, p, i, step, m));
        SC_TRY(mpg_sync_mark_ready(h.sync, p));
      }
      SC_TRY(mpg_sync_finish(h.sync));
    }
    SC_CHECK(mpg_sync_grads_valid(h.sync) == 1, "grads_valid is 0 after a good step");
    /* The owned gradients (replicated params: all of it). */
    for (int p = 0; p < c->nparams; p++) {
      const shc_param *pa = &c->params[p];
      size_t lo = info[p].param_offset, hi = lo + info[p].count;
      for (size_t i = lo; i < hi; i++) {
        double want = shc_expected(c, mi, pmask[p], rank, p, i, step);
        double got = sc_get(gv[p], pa->dtype, i);
        SC_CHECK(sc_near(pa->dtype, got, want),
                 "step %d: param p%d (%zu x %s%s%s) owned element %zu of [%zu, %zu): got "
                 "%.9g, expected %.9g",
                 step, p, pa->count, mpg_dtype_name(pa->dtype),
                 pa->reduce_dims ? ", reduce_dims " : "", pa->reduce_dims ? pa->reduce_dims : "",
                 i, lo, hi, got, want);
      }
    }
    /* The optimizer: owned elements only (replicated params whole). */
    for (int p = 0; p < c->nparams; p++) {
      size_t lo = info[p].param_offset, hi = lo + info[p].count;
      for (size_t i = lo; i < hi; i++) sc_set(pv[p], c->params[p].dtype, i, shc_pval(p, i, step));
    }
    SC_TRY(mpg_sync_zero_grads(h.sync));
    SC_TRY(mpg_sync_gather_begin(h.sync, NULL));
    /* Wait per param at first use (forward = registration order), or some
     * then gather_all, or gather_all at once. */
    int pattern = (int)((c->seed + (unsigned)step) % 3), upto = c->nparams;
    if (pattern == 1) upto = c->nparams / 2;
    if (pattern == 2) upto = 0;
    for (int p = 0; p < upto; p++) {
      SC_TRY(mpg_sync_gather_wait(h.sync, p));
      for (size_t i = 0; i < c->params[p].count; i++) {
        double want = shc_pval(p, i, step), got = sc_get(pv[p], c->params[p].dtype, i);
        SC_CHECK(got == want,
                 "step %d: param p%d element %zu right after its gather_wait: %.9g, "
                 "expected %.9g",
                 step, p, i, got, want);
      }
    }
    if (upto < c->nparams) SC_TRY(mpg_sync_gather_all(h.sync));
    for (int p = 0; p < c->nparams; p++)
      for (size_t i = 0; i < c->params[p].count; i++) {
        double want = shc_pval(p, i, step), got = sc_get(pv[p], c->params[p].dtype, i);
        SC_CHECK(got == want, "step %d: param p%d element %zu after the gather: %.9g, "
                 "expected %.9g", step, p, i, got, want);
      }
  }
  SC_TRY(mpg_sync_get_stats(h.sync, &stats));
  o->launched = stats.launched_buckets;

done:
  return sc_destroy(o, rank, rc, &h, 4, (void *[]){mi, mine, all, cover});
}

/* ------------------------------------------------------------------ */
/* Cases                                                               */
/* ------------------------------------------------------------------ */

static SC_UNUSED void shc_init(shard_case *c, const char *name, const char *mesh,
                               const char *flatten, int world) {
  *c = (shard_case){.world = world, .bucket_mb = 25.0, .first_bucket_mb = 1.0,
                    .op = MPG_OP_AVG, .grad_scale = 1.0, .microbatches = 1, .steps = 2};
  snprintf(c->name, sizeof c->name, "%s", name);
  snprintf(c->mesh, sizeof c->mesh, "%s", mesh);
  snprintf(c->flatten, sizeof c->flatten, "%s", flatten ? flatten : "");
}

static SC_UNUSED void shc_add(shard_case *c, size_t count, mpg_dtype dt, const char *reduce_dims) {
  shc_param *p = &c->params[c->nparams++];
  p->count = count;
  p->dtype = dt;
  p->reduce_dims = reduce_dims;
}

/* A random case over `world` ranks (world <= SC_MAX_RANKS). */
static SC_UNUSED void shc_random(shard_case *c, unsigned seed, int world) {
  unsigned s = seed * 7919u + 1u;
  int hsdp = (int)(sc_rand(&s) % 3) == 0;
  /* dims: dp (or dp_replicate, dp_shard), cp, tp; world's prime factors
   * dealt to them at random */
  const char *names[4];
  int size[4] = {1, 1, 1, 1}, nd = sc_dp_dims(names, hsdp);
  names[nd++] = "tp";
  int w = world;
  for (int f = 2; w > 1; f++)
    while (w % f == 0) {
      size[sc_rand(&s) % (unsigned)nd] *= f;
      w /= f;
    }
  /* a random mesh order */
  int perm[4] = {0, 1, 2, 3};
  sc_shuffle(perm, nd, &s);
  char mesh[96] = "", flat[96] = "dp_cp=";
  for (int k = 0; k < nd; k++) {
    size_t len = strlen(mesh);
    snprintf(mesh + len, sizeof mesh - len, "%s%s=%d", k ? "," : "", names[perm[k]],
             size[perm[k]]);
  }
  int first = 1;
  for (int k = 0; k < nd; k++) {
    if (strcmp(names[perm[k]], "tp") == 0) continue;
    size_t len = strlen(flat);
    snprintf(flat + len, sizeof flat - len, "%s%s", first ? "" : ",", names[perm[k]]);
    first = 0;
  }
  char name[64];
  snprintf(name, sizeof name, "random%u", seed);
  shc_init(c, name, mesh, flat, world);
  c->seed = seed;
  /* shard / replicate dims */
  static const char *const plain[][2] = {{"", ""},     {"dp", "cp"}, {"cp", "dp"},
                                         {"dp", ""},   {"dp_cp", ""}, {"cp,dp", ""},
                                         {"cp", ""}};
  static const char *const hs[][2] = {{"dp_shard,cp", "dp_replicate"},
                                      {"dp_shard", "dp_replicate,cp"},
                                      {"", ""},
                                      {"cp,dp_shard", "dp_replicate"}};
  if (hsdp) {
    unsigned k = sc_rand(&s) % 4;
    snprintf(c->shard_dims, sizeof c->shard_dims, "%s", hs[k][0]);
    snprintf(c->replicate_dims, sizeof c->replicate_dims, "%s", hs[k][1]);
  } else {
    unsigned k = sc_rand(&s) % 7;
    snprintf(c->shard_dims, sizeof c->shard_dims, "%s", plain[k][0]);
    snprintf(c->replicate_dims, sizeof c->replicate_dims, "%s", plain[k][1]);
  }
  /* buckets */
  unsigned b = sc_rand(&s) % 4;
  if (b == 0) {
    c->bucket_mb = c->first_bucket_mb = 1e-6; /* one param per bucket */
    c->one_per_bucket = 1;
  } else if (b == 1) {
    c->bucket_mb = 25.0;
    c->first_bucket_mb = 1.0;
    c->pad_for_nccl = (int)(sc_rand(&s) % 3) == 0;
  } else {
    c->bucket_mb = 0.0005 + (double)(sc_rand(&s) % 100) * 0.0001;
    c->first_bucket_mb = c->bucket_mb * (0.25 + (double)(sc_rand(&s) % 4) * 0.25);
  }
  c->microbatches = 1 + (int)(sc_rand(&s) % 3);
  c->op = (int)(sc_rand(&s) % 5) == 0 ? MPG_OP_SUM : MPG_OP_AVG;
  c->grad_scale = (int)(sc_rand(&s) % 4) == 0 ? 0.5 : 1.0;
  /* params */
  static const mpg_dtype dts[3] = {MPG_F32, MPG_F64, MPG_BF16};
  int np = 1 + (int)(sc_rand(&s) % 14);
  for (int p = 0; p < np; p++) {
    unsigned kind = sc_rand(&s) % 6;
    size_t count = kind == 0   ? 1 + sc_rand(&s) % 5
                   : kind == 5 ? 1000 + sc_rand(&s) % 2500
                               : 20 + sc_rand(&s) % 700;
    const char *rd = (int)(sc_rand(&s) % 4) == 0 ? "dp_cp,tp" : NULL;
    shc_add(c, count, dts[sc_rand(&s) % 3], rd);
  }
}

/* Fixed cases for the MPI worker (world 4 or 8); 0, or -1 when none. */
static SC_UNUSED int shc_build(shard_case *c, const char *name, int world) {
  if (strcmp(name, "shard_default") == 0 && (world == 4 || world == 8)) {
    /* shard over dp_cp, SP norms replicated over dp_cp,tp */
    shc_init(c, name, world == 8 ? "dp=2,cp=2,tp=2" : "dp=2,cp=2", "dp_cp=dp,cp", world);
    if (world == 4) snprintf(c->mesh, sizeof c->mesh, "dp=2,cp=2,tp=1");
    for (int l = 0; l < 3; l++) {
      shc_add(c, 301 + (size_t)l * 17, MPG_F32, NULL);
      shc_add(c, 129, MPG_F32, NULL);
      shc_add(c, 16, MPG_F32, "dp_cp,tp");
    }
    shc_add(c, 5, MPG_F32, NULL);
    c->microbatches = 2;
    c->seed = 3;
  } else if (strcmp(name, "shard_hsdp") == 0 && (world == 4 || world == 8)) {
    shc_init(c, name, world == 8 ? "dp_replicate=2,dp_shard=2,cp=2" : "dp_replicate=2,dp_shard=2",
             world == 8 ? "dp_cp=dp_replicate,dp_shard,cp" : "dp_cp=dp_replicate,dp_shard", world);
    snprintf(c->shard_dims, sizeof c->shard_dims, "%s", world == 8 ? "dp_shard,cp" : "dp_shard");
    snprintf(c->replicate_dims, sizeof c->replicate_dims, "dp_replicate");
    shc_add(c, 1000, MPG_F32, NULL);
    shc_add(c, 77, MPG_F64, NULL);
    shc_add(c, 333, MPG_BF16, NULL);
    shc_add(c, 8, MPG_F32, "dp_cp");
    c->bucket_mb = 0.001;
    c->first_bucket_mb = 0.0005;
    c->seed = 5;
  } else if (strcmp(name, "shard_dp_rep_cp") == 0 && (world == 4 || world == 8)) {
    /* shard over dp, then all-reduce the shard over cp */
    shc_init(c, name, world == 8 ? "dp=4,cp=2" : "dp=2,cp=2", "dp_cp=dp,cp", world);
    snprintf(c->shard_dims, sizeof c->shard_dims, "dp");
    snprintf(c->replicate_dims, sizeof c->replicate_dims, "cp");
    shc_add(c, 999, MPG_F32, NULL);
    shc_add(c, 1, MPG_F32, NULL);
    shc_add(c, 130, MPG_BF16, NULL);
    c->op = MPG_OP_SUM;
    c->grad_scale = 0.5;
    c->seed = 9;
  } else if (strcmp(name, "shard_own_buckets") == 0 && (world == 4 || world == 8)) {
    /* one param per bucket: exact slices, counts around multiples of 128 */
    shc_init(c, name, world == 8 ? "dp=8" : "dp=4", NULL, world);
    snprintf(c->flatten, sizeof c->flatten, "dp_cp=dp");
    c->bucket_mb = c->first_bucket_mb = 1e-6;
    c->one_per_bucket = 1;
    const size_t counts[] = {1, 127, 128, 129, 500, 1025, 3};
    for (int k = 0; k < 7; k++) shc_add(c, counts[k], k % 2 ? MPG_F64 : MPG_F32, NULL);
    c->microbatches = 3;
    c->seed = 11;
  } else if (strcmp(name, "shard_pad_nccl") == 0 && (world == 4 || world == 8)) {
    shc_init(c, name, world == 8 ? "dp=2,cp=2,tp=2" : "dp=2,cp=2", "dp_cp=dp,cp", world);
    c->pad_for_nccl = 1;
    shc_add(c, 70000, MPG_F32, NULL);
    shc_add(c, 100, MPG_BF16, NULL);
    c->seed = 0;
  } else {
    return -1;
  }
  return c->world == world ? 0 : -1;
}

static SC_UNUSED const char *const shc_names[] = {"shard_default", "shard_hsdp", "shard_dp_rep_cp",
                                                  "shard_own_buckets", "shard_pad_nccl", NULL};

#endif
