/* Shard mode with an expert grid (issue 21): expert params (reduce_dims
 * "edp") shard over the expert data-parallel group, dense params over
 * dp_cp, in one sync; optimizer_instances N > 1 shards each over
 * Megatron's intra-partial group and all-reduces the slice over the inter
 * group; the first pipeline stage may hold no experts (DeepSeek's dense
 * first layers).  On thread ranks over random meshes.  Every expectation
 * is computed here from the mesh's own group listings
 * (mpg_mesh_group_of / _members), not from the sync:
 *  - the owned gradient elements equal the average over the param's whole
 *    reduce group (edp, dp_cp, or dp_cp x tp for a replicated norm);
 *  - the owned ranges of the members of a shard group (a contiguous part
 *    of the reduce group's members, Megatron's create_hierarchical_groups)
 *    partition every sharded param;
 *  - after the gather every rank holds every updated element. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shard_check.h"

enum { K_DENSE, K_EXPERT, K_NORM };
static const char *const kind_dims[] = {NULL, "edp", "dp_cp,tp"};
static const char *const kind_set[] = {"dp_cp", "edp", "dp_cp,tp"};

typedef struct xparam {
  size_t count;
  mpg_dtype dtype;
  int kind;
} xparam;

typedef struct xcase {
  int pp, dp, cp, tp, etp, ep;
  int instances;
  int dense_first;  /* pipeline stage 0 registers no expert params */
  int no_expert_shard; /* expert_shard_dims = "none": expert params replicated */
  int microbatches;
  double bucket_mb;
  unsigned seed;
  int nparams;
  xparam p[10];
} xcase;

typedef struct xarg {
  const xcase *c;
  sc_out out[SC_MAX_RANKS];
} xarg;

/* Members of rank's group of `set` (position order) and its position. */
static int group_members(const mpg_mesh *m, const char *set, int rank, int *members,
                         int *pos) {
  int ds, gi, size;
  if (mpg_mesh_dimset_find(m, set, &ds) == MPG_OK) {
    if (mpg_mesh_group_of(m, ds, rank, &gi, pos, &size) ||
        mpg_mesh_group_members(m, ds, gi, members))
      return -1;
    return size;
  }
  /* "dp_cp,tp": the members sharing rank's pp coordinate, in rank order
   * (pp is the outermost dim of these meshes). */
  int world = mpg_mesh_world_size(m), n = 0, stage;
  if (mpg_mesh_dimset_find(m, "pp", &ds) || mpg_mesh_group_of(m, ds, rank, NULL, &stage, NULL))
    return -1;
  for (int q = 0; q < world; q++) {
    int s2;
    mpg_mesh_group_of(m, ds, q, NULL, &s2, NULL);
    if (s2 == stage) {
      if (q == rank) *pos = n;
      members[n++] = q;
    }
  }
  return n;
}

static mpg_status x_rank(const mpg_init_opts *opts, void *arg) {
  xarg *xa = arg;
  const xcase *c = xa->c;
  int rank = opts->rank;
  sc_out *o = &xa->out[rank];
  mpg_status rc = MPG_OK;
  sc_objs h = {0};
  int64_t *mine = NULL, *all = NULL;
  unsigned char *cover = NULL;
  int *members = NULL;
  o->msg[0] = '\0';
  mpg_spec spec = MPG_SPEC_INIT;
  char dims[96];
  snprintf(dims, sizeof dims, "pp=%d,dp=%d,cp=%d,tp=%d", c->pp, c->dp, c->cp, c->tp);
  SC_TRY(mpg_spec_init(&spec));
  SC_TRY(mpg_spec_set_mesh(&spec, dims));
  SC_TRY(mpg_spec_add_flatten(&spec, "dp_cp", "dp,cp"));
  SC_TRY(mpg_spec_set_experts(&spec, c->etp, c->ep, NULL));
  SC_TRY(mpg_mesh_create(&spec, 0, &h.mesh));
  SC_TRY(mpg_ctx_create(h.mesh, opts, &h.ctx));
  int world = mpg_mesh_world_size(h.mesh);
  members = malloc(sizeof(int) * (size_t)world);
  SC_CHECK(members != NULL, "out of memory");
  int ppds, stage;
  SC_TRY(mpg_mesh_dimset_find(h.mesh, "pp", &ppds));
  SC_TRY(mpg_mesh_group_of(h.mesh, ppds, rank, NULL, &stage, NULL));

  mpg_sync_opts so = MPG_SYNC_OPTS_INIT;
  so.sync.mode = MPG_SYNC_SHARD;
  so.sync.optimizer_instances = c->instances;
  snprintf(so.sync.expert_shard_dims, sizeof so.sync.expert_shard_dims, "%s", c->no_expert_shard ? "none" : "");
  so.sync.bucket_mb = so.sync.first_bucket_mb = c->bucket_mb;
  SC_TRY(mpg_sync_create(h.ctx, &so, &h.sync));
  int id_of[10];
  for (int p = 0; p < c->nparams; p++) {
    id_of[p] = -1;
    if (c->p[p].kind == K_EXPERT && c->dense_first && stage == 0) continue;
    char name[32];
    snprintf(name, sizeof name, "%s%d", c->p[p].kind == K_EXPERT ? "expert" : "w", p);
    mpg_param_opts po = MPG_PARAM_OPTS_INIT;
    po.reduce_dims = kind_dims[c->p[p].kind];
    SC_TRY(mpg_sync_add_param(h.sync, name, c->p[p].count, c->p[p].dtype, &po, &id_of[p]));
  }
  SC_TRY(mpg_sync_commit(h.sync));

  void *gv[10], *pv[10];
  mpg_shard_info info[10];
  for (int p = 0; p < c->nparams; p++) {
    info[p] = (mpg_shard_info)MPG_SHARD_INFO_INIT;
    if (id_of[p] < 0) continue;
    SC_TRY(mpg_sync_get_shard(h.sync, id_of[p], &info[p]));
    SC_TRY(mpg_sync_grad(h.sync, id_of[p], &gv[p]));
    SC_TRY(mpg_sync_param(h.sync, id_of[p], &pv[p]));
    /* A norm's "dp_cp,tp" names other dims than the data-parallel group
     * (even with tp = 1): replicated. */
    int want = c->p[p].kind == K_DENSE || (c->p[p].kind == K_EXPERT && !c->no_expert_shard);
    SC_CHECK(info[p].sharded == want, "param %d (%s): sharded %d, expected %d", p,
             kind_set[c->p[p].kind], info[p].sharded, want);
  }

  unsigned rs = c->seed * 2654435761u + (unsigned)rank * 40503u + 17u;
  for (int step = 0; step < 2; step++) {
    for (int mb = 0; mb < c->microbatches; mb++) {
      SC_TRY(mpg_sync_begin(h.sync, step, mb == c->microbatches - 1, NULL));
      int order[10], n = 0;
      for (int p = c->nparams - 1; p >= 0; p--)
        if (id_of[p] >= 0) order[n++] = p;
      for (int k = n - 1; k > 0; k--) {
        int j = (int)(sc_rand(&rs) % (unsigned)(k + 1)), t = order[k];
        order[k] = order[j];
        order[j] = t;
      }
      for (int k = 0; k < n; k++) {
        int p = order[k];
        for (size_t i = 0; i < c->p[p].count; i++)
          sc_set(gv[p], c->p[p].dtype, i,
                 sc_get(gv[p], c->p[p].dtype, i) + (double)shc_grad(rank, p, i, step, mb));
        SC_TRY(mpg_sync_mark_ready(h.sync, id_of[p]));
      }
      SC_TRY(mpg_sync_finish(h.sync));
    }
    /* Owned gradients: the average over the whole reduce group. */
    for (int p = 0; p < c->nparams; p++) {
      if (id_of[p] < 0) continue;
      int pos, n = group_members(h.mesh, kind_set[c->p[p].kind], rank, members, &pos);
      SC_CHECK(n > 0, "no group %s", kind_set[c->p[p].kind]);
      for (size_t i = info[p].param_offset; i < info[p].param_offset + info[p].count; i++) {
        long sum = 0;
        for (int q = 0; q < n; q++)
          for (int mb = 0; mb < c->microbatches; mb++)
            sum += shc_grad(members[q], p, i, step, mb);
        double want = (double)sum / n, got = sc_get(gv[p], c->p[p].dtype, i);
        SC_CHECK(sc_near(c->p[p].dtype, got, want),
                 "step %d: param %d (%s, %zu x %s) element %zu: got %.9g, expected %.9g "
                 "(the average over %d members)",
                 step, p, kind_set[c->p[p].kind], c->p[p].count, mpg_dtype_name(c->p[p].dtype),
                 i, got, want, n);
      }
      for (size_t i = info[p].param_offset; i < info[p].param_offset + info[p].count; i++)
        sc_set(pv[p], c->p[p].dtype, i, shc_pval(p, i, step));
    }
    SC_TRY(mpg_sync_zero_grads(h.sync));
    SC_TRY(mpg_sync_gather_begin(h.sync, NULL));
    SC_TRY(mpg_sync_gather_all(h.sync));
    for (int p = 0; p < c->nparams; p++)
      for (size_t i = 0; id_of[p] >= 0 && i < c->p[p].count; i++) {
        double want = shc_pval(p, i, step), got = sc_get(pv[p], c->p[p].dtype, i);
        SC_CHECK(got == want, "step %d: param %d (%s) element %zu after the gather: %.9g, "
                 "expected %.9g", step, p, kind_set[c->p[p].kind], i, got, want);
      }
  }

  /* The owned ranges of each shard group (part `pos / part` of the reduce
   * group's members) partition every sharded param. */
  mpg_group *wg = NULL;
  SC_TRY(mpg_ctx_group(h.ctx, "world", &wg));
  size_t words = 2 * (size_t)c->nparams;
  mine = calloc(words, sizeof *mine);
  all = calloc(words * (size_t)world, sizeof *all);
  cover = calloc(4096, 1);
  SC_CHECK(mine && all && cover, "out of memory");
  for (int p = 0; p < c->nparams; p++) {
    mine[2 * p] = id_of[p] < 0 ? -1 : (int64_t)info[p].param_offset;
    mine[2 * p + 1] = id_of[p] < 0 ? -1 : (int64_t)info[p].count;
  }
  SC_TRY(mpg_all_gather(wg, mine, all, words, MPG_I64, NULL, NULL));
  for (int p = 0; p < c->nparams; p++) {
    if (id_of[p] < 0 || !info[p].sharded) continue;
    int pos, n = group_members(h.mesh, kind_set[c->p[p].kind], rank, members, &pos);
    int part = n / c->instances, lo = pos / part * part;
    memset(cover, 0, c->p[p].count);
    for (int k = lo; k < lo + part; k++) {
      const int64_t *e = &all[(size_t)members[k] * words + 2 * (size_t)p];
      SC_CHECK(e[0] >= 0 && e[0] + e[1] <= (int64_t)c->p[p].count,
               "param %d: rank %d owns [%lld, +%lld)", p, members[k], (long long)e[0],
               (long long)e[1]);
      for (int64_t i = e[0]; i < e[0] + e[1]; i++) {
        SC_CHECK(!cover[i], "param %d (%s) element %lld owned twice in the shard group of "
                 "rank %d (again by rank %d)", p, kind_set[c->p[p].kind], (long long)i, rank,
                 members[k]);
        cover[i] = 1;
      }
    }
    for (size_t i = 0; i < c->p[p].count; i++)
      SC_CHECK(cover[i], "param %d (%s) element %zu: no member of rank %d's shard group "
               "(part of %d of %d) owns it", p, kind_set[c->p[p].kind], i, rank, part, n);
  }

done:
  return sc_destroy(o, rank, rc, &h, 4, (void *[]){mine, all, cover, members});
}

static void run_x(const xcase *c) {
  xarg *xa = calloc(1, sizeof *xa);
  cr_assert_not_null(xa);
  xa->c = c;
  int world = c->pp * c->dp * c->cp * c->tp;
  mpg_status st[SC_MAX_RANKS];
  mpg_status rc = mpg_thread_run(world, 30.0, x_rank, xa, st);
  char all[4096] = "";
  size_t n = 0;
  for (int r = 0; r < world; r++)
    if (st[r] != MPG_OK && n < sizeof all)
      n += (size_t)snprintf(all + n, sizeof all - n, "\n  rank %d: %s", r, xa->out[r].msg);
  cr_assert_eq(rc, MPG_OK,
               "pp=%d,dp=%d,cp=%d,tp=%d experts etp=%d ep=%d, instances %d%s%s: %s%s", c->pp,
               c->dp, c->cp, c->tp, c->etp, c->ep, c->instances,
               c->dense_first ? ", dense first stage" : "",
               c->no_expert_shard ? ", expert params replicated" : "", mpg_last_error(), all);
  free(xa);
}

static int common_divisor(int a, int b, unsigned pick) {
  int d[16], n = 0;
  for (int k = 1; k <= a && k <= b; k++)
    if (a % k == 0 && b % k == 0) d[n++] = k;
  return d[pick % (unsigned)n];
}

/* 60 random meshes of 2..16 ranks with an expert grid: dense, expert and
 * norm params mixed in one sync; instances a common divisor of the dp_cp
 * and edp sizes; half of the pipelined meshes with a dense first stage. */
Test(shard_experts, random_meshes, .timeout = 300) {
  xcase *c = calloc(1, sizeof *c);
  cr_assert_not_null(c);
  int partial = 0, dense_first = 0, etp_differs = 0;
  for (unsigned seed = 1; seed <= 60; seed++) {
    unsigned s = seed * 7919u;
    memset(c, 0, sizeof *c);
    c->pp = 1 + (int)(sc_rand(&s) % 2);
    c->dp = 1 << (int)(sc_rand(&s) % 3);
    c->cp = 1 + (int)(sc_rand(&s) % 2);
    c->tp = 1 + (int)(sc_rand(&s) % 2);
    if (c->pp * c->dp * c->cp * c->tp < 2) c->dp = 2;
    int stage = c->dp * c->cp * c->tp;
    c->etp = sc_rand(&s) % 2 ? c->tp : 1;
    c->ep = 1 << (int)(sc_rand(&s) % 3);
    while (stage % (c->etp * c->ep)) c->ep /= 2;
    if (c->ep < 1) c->ep = 1;
    int edp = stage / (c->etp * c->ep);
    c->instances = common_divisor(c->dp * c->cp, edp, sc_rand(&s));
    c->dense_first = c->pp > 1 && sc_rand(&s) % 2;
    c->no_expert_shard = seed % 10 == 0;
    c->microbatches = 1 + (int)(sc_rand(&s) % 2);
    c->bucket_mb = sc_rand(&s) % 2 ? 1e-6 : 0.002;
    c->seed = seed;
    c->nparams = 4 + (int)(sc_rand(&s) % 6);
    for (int p = 0; p < c->nparams; p++) {
      c->p[p].count = 1 + sc_rand(&s) % 700;
      unsigned k = sc_rand(&s) % 5;
      c->p[p].kind = k < 2 ? K_DENSE : k < 4 ? K_EXPERT : K_NORM;
      unsigned d = sc_rand(&s) % 3;
      c->p[p].dtype = d == 0 ? MPG_F32 : d == 1 ? MPG_BF16 : MPG_F64;
    }
    c->p[0].kind = K_EXPERT;
    c->p[1].kind = K_DENSE;
    partial += c->instances > 1;
    dense_first += c->dense_first;
    etp_differs += c->etp != c->tp;
    run_x(c);
  }
  cr_assert_gt(partial, 5, "only %d cases with instances > 1", partial);
  cr_assert_gt(dense_first, 5, "only %d cases with a dense first stage", dense_first);
  cr_assert_gt(etp_differs, 5, "only %d cases with etp != tp", etp_differs);
  free(c);
}

/* A DeepSeek-like stage layout at world 16: pp=2, dp=4, tp=2; experts
 * etp=1, ep=4 (edp=2); stage 0 dense; 2 optimizer instances. */
Test(shard_experts, deepseek_like_16) {
  xcase c = {.pp = 2, .dp = 4, .cp = 1, .tp = 2, .etp = 1, .ep = 4, .instances = 2,
             .dense_first = 1, .microbatches = 2, .bucket_mb = 0.001, .seed = 3, .nparams = 6};
  const xparam ps[6] = {{513, MPG_F32, K_EXPERT}, {300, MPG_BF16, K_DENSE},
                        {64, MPG_F32, K_NORM},    {1000, MPG_F32, K_EXPERT},
                        {129, MPG_F64, K_DENSE},  {7, MPG_F32, K_EXPERT}};
  memcpy(c.p, ps, sizeof ps);
  run_x(&c);
}

/* The options' rules. */
static mpg_status opts_rank(const mpg_init_opts *opts, void *arg) {
  (void)arg;
  int rank = opts->rank;
  mpg_status rc = MPG_OK;
  sc_out oo, *o = &oo;
  mpg_spec spec = MPG_SPEC_INIT;
  mpg_mesh *mesh = NULL;
  mpg_ctx *ctx = NULL;
  mpg_sync *sync = NULL;
  SC_TRY(mpg_spec_init(&spec));
  SC_TRY(mpg_spec_set_mesh(&spec, "dp=4"));
  SC_TRY(mpg_spec_set_experts(&spec, 1, 2, NULL));
  SC_TRY(mpg_mesh_create(&spec, 0, &mesh));
  SC_TRY(mpg_ctx_create(mesh, opts, &ctx));
  mpg_sync_opts so = MPG_SYNC_OPTS_INIT;
  so.sync.optimizer_instances = 2;
  SC_CHECK(mpg_sync_create(ctx, &so, &sync) == MPG_ERR_INVALID &&
               strstr(mpg_last_error(), "optimizer_instances needs opts.sync.mode"),
           "replicate mode with instances: %s", mpg_last_error());
  so = (mpg_sync_opts)MPG_SYNC_OPTS_INIT;
  so.sync.mode = MPG_SYNC_SHARD;
  so.sync.optimizer_instances = -1;
  SC_CHECK(mpg_sync_create(ctx, &so, &sync) == MPG_ERR_INVALID &&
               strstr(mpg_last_error(), "optimizer_instances is -1"),
           "instances -1: %s", mpg_last_error());
  so.sync.optimizer_instances = 3;
  SC_CHECK(mpg_sync_create(ctx, &so, &sync) == MPG_ERR_RANGE &&
               strstr(mpg_last_error(), "instances 3 does not divide the group size 4"),
           "instances 3: %s", mpg_last_error());
  so.sync.optimizer_instances = 2;
  snprintf(so.sync.expert_shard_dims, sizeof so.sync.expert_shard_dims, "%s", "dp");
  SC_CHECK(mpg_sync_create(ctx, &so, &sync) == MPG_ERR_INVALID &&
               strstr(mpg_last_error(), "expert_shard_dims \"dp\" is the data-parallel"),
           "expert dims = dp: %s", mpg_last_error());
  snprintf(so.sync.expert_shard_dims, sizeof so.sync.expert_shard_dims, "%s", "xx");
  SC_CHECK(mpg_sync_create(ctx, &so, &sync) == MPG_ERR_NOT_FOUND, "expert dims xx: %s",
           mpg_last_error());
  so.sync.expert_shard_dims[0] = '\0';
  SC_TRY(mpg_sync_create(ctx, &so, &sync));
  SC_TRY(mpg_sync_commit(sync));
  mpg_sync_stats st = MPG_SYNC_STATS_INIT;
  SC_TRY(mpg_sync_get_stats(sync, &st));
  SC_CHECK(st.shard_size == 2, "shard_size %d with 2 instances over dp=4", st.shard_size);
done:
  if (sync) mpg_sync_destroy(sync);
  if (ctx) mpg_ctx_destroy(ctx);
  mpg_mesh_destroy(mesh);
  if (rc) cr_log_error("%s", o->msg);
  return rc;
}

Test(shard_experts, option_errors) {
  cr_assert_eq(mpg_thread_run(4, 30.0, opts_rank, NULL, NULL), MPG_OK, "%s", mpg_last_error());
}
