/* The sync module on the thread backend: every rank is a thread running
 * the public API (mpg_thread_run).  The policy scenarios of
 * sync_scenarios.h check, element by element, that each gradient ends as
 * the reduction over exactly its group; the tests below add bucket order,
 * the first bucket, timeouts and every error path. */
#include <criterion/criterion.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../support/time_bound.h"
#include "../support/clock.h"
#include "../support/rank_check.h"
#include "../support/run_ranks.h"
#include "sync_scenarios.h"

/* ------------------------------------------------------------------ */
/* Scenarios                                                           */
/* ------------------------------------------------------------------ */

typedef struct targ {
  scenario *sc;
  sc_out out[SC_MAX_RANKS];
} targ;

static mpg_status scenario_rank(const mpg_init_opts *opts, void *arg) {
  targ *t = arg;
  return sc_run(opts, t->sc, &t->out[opts->rank]);
}

/* Run scenario `name` on `world` thread ranks (optionally changing it
 * first) and assert that every rank passed. */
static void run_scenario_with(const char *name, int world, void (*tweak)(scenario *, int),
                              int arg) {
  targ *t = calloc(1, sizeof *t);
  scenario *sc = malloc(sizeof *sc);
  cr_assert(t && sc);
  cr_assert_eq(sc_build(sc, name, world), 0, "no scenario %s for %d ranks", name, world);
  if (tweak) tweak(sc, arg);
  t->sc = sc;
  mpg_status st[SC_MAX_RANKS];
  mpg_status rc = mpg_thread_run(world, 20.0, scenario_rank, t, st);
  char all[8192];
  rank_failures(all, sizeof all, world, st, t->out[0].msg, sizeof t->out[0]);
  cr_assert_eq(rc, MPG_OK, "scenario %s on %d ranks failed: %s%s", name, world,
               mpg_last_error(), all);
  free(sc);
  free(t);
}

static void run_scenario(const char *name, int world) {
  run_scenario_with(name, world, NULL, 0);
}

/* Scenario `name` on w1 ranks, then (w2 > 0) on w2 ranks. */
static void run_worlds(const char *name, int w1, int w2) {
  run_scenario(name, w1);
  if (w2 > 0) run_scenario(name, w2);
}

Test(sync_policy, dp_cp_default_8) { run_worlds("dp_cp_default", 8, 0); }
Test(sync_policy, dp_cp_default_4) { run_worlds("dp_cp_default", 4, 0); }
Test(sync_policy, default_is_union_of_dp_and_cp_without_a_flatten) {
  run_worlds("no_flatten_union", 8, 0);
}
Test(sync_policy, fsdp_owns_dp_reduces_over_cp_only) { run_worlds("fsdp_cp_only", 8, 4); }
Test(sync_policy, fsdp_owns_dp_without_cp_reduces_nothing) { run_worlds("fsdp_no_cp", 8, 4); }
Test(sync_policy, default_dims_overrides_the_default) { run_worlds("default_dims", 8, 0); }
Test(sync_policy, sequence_parallel_norms_also_over_tp) { run_worlds("sp_norm", 8, 4); }
Test(sync_policy, expert_weights_over_expert_data_parallel) { run_worlds("experts", 8, 0); }
Test(sync_policy, tied_embedding_first_and_last_stage_pp2) { run_worlds("tied_pp2", 8, 0); }
Test(sync_policy, tied_embedding_first_and_last_stage_pp3) { run_worlds("tied_pp3", 6, 12); }
Test(sync_policy, tied_embedding_pp2_4_ranks) { run_worlds("tied_pp2", 4, 0); }
Test(sync_policy, every_dtype_avg) { run_worlds("dtypes", 8, 4); }
Test(sync_policy, every_dtype_sum_native) { run_worlds("dtypes_sum", 8, 0); }
Test(sync_policy, grad_scale_avg) { run_worlds("grad_scale", 8, 4); }
Test(sync_policy, grad_scale_sum) { run_worlds("grad_scale_sum", 8, 0); }
Test(sync_buckets, param_larger_than_a_bucket_gets_its_own) { run_worlds("buckets_big", 8, 0); }
Test(sync_buckets, many_tiny_params_share_one_bucket) { run_worlds("buckets_tiny", 8, 4); }
Test(sync_buckets, tiny_bucket_cap_mixed) { run_worlds("buckets_tiny_small_cap", 8, 0); }
Test(sync_buckets, finish_launches_params_never_marked) { run_worlds("unmarked", 8, 0); }
Test(sync_step, sync_all) { run_worlds("sync_all", 8, 4); }

/* Pipeline stages with different params (issue 20): a norm reduced over
 * "dp,tp" on one stage only, a tied embedding on the first and last stage,
 * and so on, on random meshes (sync_scenarios.h: sc_build_random).  Before
 * commit agreed on the union of the reduce groups, a stage whose params
 * named a dim set that another stage's did not entered a split alone and
 * every rank timed out.  Commit must succeed, and every gradient must be
 * the average over exactly its group (plus the tied sum). */
Test(sync_pipeline, stages_with_different_params_random_meshes, .timeout = 600) {
  static const int worlds[] = {4, 6, 8, 12, 16};
  int ran = 0;
  for (int seed = 1; seed <= 30; seed++) {
    int world = worlds[seed % 5];
    char name[32];
    snprintf(name, sizeof name, "pp_random:%d", seed);
    run_scenario(name, world);
    ran++;
  }
  cr_log_info("%d random pipeline scenarios passed", ran);
}

/* The case from the issue, by hand: pp=2, dp=2, tp=2; stage 0 holds the
 * embedding (tied to stage 1's head), a layer and a norm reduced over
 * "dp,tp"; stage 1 a layer and the head.  It timed out in commit. */
static void set_stages_issue20(scenario *sc, int unused) {
  (void)unused;
  sc_init(sc, "pp_issue20", "pp=2,dp=2,tp=2", NULL, 8);
  sc_add(sc, "embed", 256, MPG_F32, NULL, "dp", 1);
  sc->params[0].stages = 3u; /* both stages: "embed" on 0, "head" on 1 */
  sc->params[0].last_name = "head";
  sc_add(sc, "l0.w", 300, MPG_F32, NULL, "dp", 0);
  sc->params[1].stages = 1u;
  sc_add(sc, "l0.norm", 16, MPG_F32, "dp,tp", "dp,tp", 0);
  sc->params[2].stages = 1u;
  sc_add(sc, "l1.w", 300, MPG_F32, NULL, "dp", 0);
  sc->params[3].stages = 2u;
  sc->seed = 3;
}
Test(sync_pipeline, stage_only_reduce_dims_and_tied_head) {
  run_scenario_with("dp_cp_default", 8, set_stages_issue20, 0);
}

static void set_microbatches(scenario *sc, int m) {
  sc->microbatches = m;
  sc->steps = 2;
}
Test(sync_step, accumulation_1_to_4_microbatches) {
  for (int m = 1; m <= 4; m++) run_scenario_with("accumulate", 8, set_microbatches, m);
}

static void set_seed(scenario *sc, int seed) { sc->seed = (unsigned)seed; }
Test(sync_step, random_ready_orders) {
  for (int seed = 100; seed < 106; seed++) {
    run_scenario_with("buckets_tiny_small_cap", 8, set_seed, seed);
    run_scenario_with("sp_norm", 8, set_seed, seed);
  }
  run_scenario_with("experts", 8, set_seed, 0); /* backward order */
}

static void set_lazy(scenario *sc, int unused) {
  (void)unused;
  sc->lazy = 1;
}
Test(sync_policy, lazy_groups_are_created_in_the_same_order) {
  run_scenario_with("sp_norm", 8, set_lazy, 0);
  run_scenario_with("experts", 8, set_lazy, 0);
  run_scenario_with("tied_pp3", 12, set_lazy, 0);
  run_scenario_with("fsdp_no_cp", 8, set_lazy, 0);
  run_scenario_with("dtypes_sum", 8, set_lazy, 0);
}

static void set_native(scenario *sc, int unused) {
  (void)unused;
  sc->reduce_dtype = MPG_REDUCE_NATIVE;
}
Test(sync_policy, reduce_dtype_native) { run_scenario_with("dtypes", 8, set_native, 0); }

/* ------------------------------------------------------------------ */
/* Helpers for the hand-written rank bodies                             */
/* ------------------------------------------------------------------ */

typedef struct hand hand;
/* A rank body of run_hand: its opts (opts->rank its rank), its o, and x's
 * context (run_ranks' over h's mesh; x->sync is the body's, destroyed
 * after it). */
typedef mpg_status (*hand_body)(hand *h, const mpg_init_opts *opts, sc_out *o, sc_objs *x);

struct hand {
  const char *mesh, *flatten;
  int world;
  int lazy;       /* a lazy context */
  hand_body body; /* what hand_rank runs */
  sc_out out[SC_MAX_RANKS];       /* a failing rank's message */
  mpg_status got[SC_MAX_RANKS][8]; /* statuses a rank records for the test */
  int valid[SC_MAX_RANKS];
  double seconds[SC_MAX_RANKS];
  long launched[SC_MAX_RANKS][8];
};

/* The rank bodies below fail through sync_scenarios.h's SC_TRY and
 * SC_CHECK (o: the rank's h->out); H_EXPECT also wants a status and a
 * message containing needle (NULL: any). */
static int has_text(const char *msg, const char *needle) {
  return !needle || strstr(msg, needle) != NULL;
}

#define H_EXPECT(call, want, needle)                                                     \
  do {                                                                                   \
    mpg_status st_ = (call);                                                             \
    SC_CHECK(st_ == (want), "%s -> %s, expected %s (%s)", #call, mpg_status_name(st_),   \
             mpg_status_name(want), mpg_last_error());                                   \
    SC_CHECK(has_text(mpg_last_error(), (needle)), "%s: message \"%s\" lacks \"%s\"", #call, \
             mpg_last_error(), (needle) ? (const char *)(needle) : "");                  \
  } while (0)

/* A rank of run_ranks (tests/support/run_ranks.h) running h's body;
 * destroys the sync the body left, and keeps a failure's message. */
static mpg_status hand_rank(rr_rank *rr) {
  hand *h = rr->arg;
  sc_out *o = &h->out[rr->rank];
  sc_objs x = {.ctx = rr->ctx};
  mpg_status rc = h->body(h, rr->opts, o, &x);
  mpg_sync_destroy(x.sync);
  return rc;
}

/* x->sync, committed: buckets of bucket_mb (the first of first_mb), n
 * params "w0".."w<n-1>" of count elements of dt. */
static mpg_status hand_sync(sc_objs *x, double bucket_mb, double first_mb, int n, size_t count,
                            mpg_dtype dt) {
  mpg_sync_opts so = MPG_SYNC_OPTS_INIT;
  so.sync.bucket_mb = bucket_mb;
  so.sync.first_bucket_mb = first_mb;
  mpg_status st = mpg_sync_create(x->ctx, &so, &x->sync);
  for (int p = 0; p < n && !st; p++) {
    char name[16];
    int id;
    snprintf(name, sizeof name, "w%d", p);
    st = mpg_sync_add_param(x->sync, name, count, dt, NULL, &id);
  }
  return st ? st : mpg_sync_commit(x->sync);
}

/* A zeroed hand for `world` ranks on `mesh` (flatten may be NULL). */
static hand *new_hand(const char *mesh, const char *flatten, int world) {
  hand *h = calloc(1, sizeof *h);
  cr_assert_not_null(h, "out of memory for the test state");
  h->mesh = mesh;
  h->flatten = flatten;
  h->world = world;
  return h;
}

static void run_hand(hand *h, hand_body body, double timeout_s) {
  mpg_status st[SC_MAX_RANKS];
  h->body = body;
  rr_opts ro = {.flatten = h->flatten, .timeout_s = timeout_s, .lazy_groups = h->lazy,
                .statuses = st};
  mpg_status rc = run_ranks_ex(h->mesh, h->world, hand_rank, h, &ro);
  char all[8192];
  rank_failures(all, sizeof all, h->world, st, h->out[0].msg, sizeof h->out[0]);
  cr_assert_eq(rc, MPG_OK, "%s%s", mpg_last_error(), all);
}

/* run_hand on a fresh hand (hand_new's arguments), then frees it. */
static void run_hand_once(const char *mesh, const char *flatten, int world, hand_body body,
                          double timeout_s) {
  hand *h = new_hand(mesh, flatten, world);
  run_hand(h, body, timeout_s);
  free(h);
}

/* ------------------------------------------------------------------ */
/* Bucket order and the first bucket                                    */
/* ------------------------------------------------------------------ */

/* 40 params of 1 KiB (f32 x 256); first bucket 2.6 KB -> params 39, 38;
 * then 20 KiB buckets: 37..18 and 17..0. */
static mpg_status order_body(hand *h, const mpg_init_opts *opts, sc_out *o, sc_objs *x) {
  int rank = opts->rank;
  mpg_status rc = MPG_OK;
  (void)h;
  SC_TRY(hand_sync(x, 0.02, 0.0025, 40, 256, MPG_F32));
  mpg_sync_stats stats = MPG_SYNC_STATS_INIT;
  SC_TRY(mpg_sync_get_stats(x->sync, &stats));
  SC_CHECK(stats.num_buckets == 3 && stats.num_buffers == 1,
          "rank %d: %d buckets in %d buffers, expected 3 in 1", rank, stats.num_buckets,
          stats.num_buffers);
  SC_CHECK(stats.total_bytes == 40 * 1024, "total_bytes %zu", stats.total_bytes);
  for (int step = 0; step < 2; step++) {
    long base = stats.launched_buckets;
    for (int p = 0; p < 40; p++) {
      float *g;
      SC_TRY(mpg_sync_grad(x->sync, p, (void **)&g));
      for (int i = 0; i < 256; i++) g[i] = (float)(rank * 1000 + p + i + step);
    }
    SC_TRY(mpg_sync_begin(x->sync, step, 1, NULL));
    /* Bucket 1 (params 37..18) completes first: it must wait for bucket 0. */
    for (int p = 18; p <= 37; p++) SC_TRY(mpg_sync_mark_ready(x->sync, p));
    SC_TRY(mpg_sync_get_stats(x->sync, &stats));
    SC_CHECK(stats.launched_buckets == base, "rank %d: bucket 1 launched before bucket 0",
            rank);
    SC_TRY(mpg_sync_mark_ready(x->sync, 39));
    SC_TRY(mpg_sync_get_stats(x->sync, &stats));
    SC_CHECK(stats.launched_buckets == base, "rank %d: first bucket launched with 1 of its "
            "2 params", rank);
    SC_TRY(mpg_sync_mark_ready(x->sync, 38));
    SC_TRY(mpg_sync_get_stats(x->sync, &stats));
    SC_CHECK(stats.launched_buckets == base + 2,
            "rank %d: after the first bucket: %ld launched, expected 2 (buckets 0 and 1)",
            rank, stats.launched_buckets - base);
    for (int p = 17; p >= 1; p--) SC_TRY(mpg_sync_mark_ready(x->sync, p));
    SC_TRY(mpg_sync_get_stats(x->sync, &stats));
    SC_CHECK(stats.launched_buckets == base + 2, "rank %d: last bucket launched early", rank);
    SC_TRY(mpg_sync_mark_ready(x->sync, 0));
    SC_TRY(mpg_sync_get_stats(x->sync, &stats));
    SC_CHECK(stats.launched_buckets == base + 3, "rank %d: last bucket not launched", rank);
    SC_TRY(mpg_sync_finish(x->sync));
    SC_CHECK(mpg_sync_grads_valid(x->sync), "rank %d: grads invalid", rank);
    /* dp=2, cp=2 is the whole world: the mean of rank*1000 is 1500. */
    for (int p = 0; p < 40; p++) {
      float *g;
      SC_TRY(mpg_sync_grad(x->sync, p, (void **)&g));
      for (int i = 0; i < 256; i++)
        SC_CHECK(g[i] == (float)(1500 + p + i + step), "rank %d: w%d[%d] = %g, expected %g",
                rank, p, i, g[i], (double)(1500 + p + i + step));
    }
    SC_TRY(mpg_sync_get_stats(x->sync, &stats));
  }
done:
  return rc;
}

Test(sync_buckets, launch_in_bucket_order_and_small_first_bucket) {
  hand *h = new_hand("dp=2,cp=2", "dp_cp=dp,cp", 4);
  run_hand(h, order_body, 20.0);
  free(h);
}

/* ------------------------------------------------------------------ */
/* Timeouts: a failed step is never silently half-reduced                */
/* ------------------------------------------------------------------ */

/* Mode 0: rank 0 never marks param 0 (the last bucket) and calls finish
 * late.  Mode 1: rank 0 skips finish altogether and destroys the sync with
 * the step open.  Mode 2: like 0, on a lazy context. */
static int g_timeout_mode;

static mpg_status timeout_body(hand *h, const mpg_init_opts *opts, sc_out *o, sc_objs *x) {
  int rank = opts->rank;
  mpg_status rc = MPG_OK;
  SC_TRY(hand_sync(x, 0.001, 0.001, 6, 300, MPG_F32));
  /* A good step first. */
  SC_TRY(mpg_sync_all(x->sync, 0, NULL));
  SC_CHECK(mpg_sync_grads_valid(x->sync) == 1, "rank %d: invalid after a good step", rank);

  SC_TRY(mpg_sync_begin(x->sync, 1, 1, NULL));
  for (int p = 5; p >= 1; p--) SC_TRY(mpg_sync_mark_ready(x->sync, p));
  if (rank != 0) SC_TRY(mpg_sync_mark_ready(x->sync, 0));
  double t0 = now_s();
  if (rank == 0) {
    sleep_s(1.5);
    if (g_timeout_mode == 1) {
      SC_TRY(mpg_sync_destroy(x->sync)); /* waits for nothing that cannot finish */
      x->sync = NULL;
      h->seconds[rank] = now_s() - t0;
      goto done;
    }
  }
  h->got[rank][0] = mpg_sync_finish(x->sync);
  h->seconds[rank] = now_s() - t0;
  char msg[800];
  snprintf(msg, sizeof msg, "%s", mpg_last_error());
  h->valid[rank] = mpg_sync_grads_valid(x->sync);
  SC_CHECK(h->got[rank][0] == MPG_ERR_TIMEOUT || h->got[rank][0] == MPG_ERR_ABORTED,
          "rank %d: finish -> %s, expected a timeout or abort: %s", rank,
          mpg_status_name(h->got[rank][0]), msg);
  SC_CHECK(strstr(msg, "sync step 1") && strstr(msg, "bucket"),
          "rank %d: the message names neither the step nor the bucket: %s", rank, msg);
  SC_CHECK(h->valid[rank] == 0, "rank %d: grads_valid is 1 after a failed step", rank);
  /* The next step says clearly that the context is gone. */
  H_EXPECT(mpg_sync_begin(x->sync, 2, 1, NULL), MPG_ERR_ABORTED, "aborted in step 1");
  H_EXPECT(mpg_sync_begin(x->sync, 2, 0, NULL), MPG_ERR_ABORTED, "destroy the sync");
  SC_CHECK(mpg_sync_grads_valid(x->sync) == 0, "rank %d: valid again", rank);
  /* A step that is not open cannot be finished. */
  H_EXPECT(mpg_sync_finish(x->sync), MPG_ERR_STATE, "no step is open");
done:
  return rc;
}

static void run_timeout(int mode) {
  hand *h = new_hand("dp=2,cp=2", "dp_cp=dp,cp", 4);
  g_timeout_mode = mode;
  h->lazy = mode == 2;
  double t0 = now_s();
  run_hand(h, timeout_body, 0.5);
  for (int r = 1; r < 4; r++)
    cr_assert_lt(h->seconds[r], tb_bound(0.5 + 1.0, 4), "rank %d waited %.2f s with a 0.5 s timeout", r,
                 h->seconds[r]);
  cr_assert_lt(now_s() - t0, 10.0);
  free(h);
}

Test(sync_errors, timeout_late_finish_invalidates, .timeout = 60) { run_timeout(0); }
Test(sync_errors, timeout_skipped_finish_invalidates, .timeout = 60) { run_timeout(1); }
Test(sync_errors, timeout_lazy_context, .timeout = 60) { run_timeout(2); }

/* An abort of the context before a step: the launch fails with
 * MPG_ERR_ABORTED, the step is invalid and later begins say so. */
static mpg_status abort_body(hand *h, const mpg_init_opts *opts, sc_out *o, sc_objs *x) {
  int rank = opts->rank;
  mpg_status rc = MPG_OK;
  (void)h;
  SC_TRY(mpg_sync_create(x->ctx, NULL, &x->sync));
  int id;
  SC_TRY(mpg_sync_add_param(x->sync, "w", 10, MPG_F64, NULL, &id));
  SC_TRY(mpg_sync_add_param(x->sync, "b", 3, MPG_F64, NULL, &id));
  SC_TRY(mpg_sync_commit(x->sync));
  SC_TRY(mpg_sync_all(x->sync, 6, NULL));
  SC_TRY(mpg_ctx_abort(x->ctx));
  /* Gradient accumulation communicates nothing, so it still works. */
  SC_TRY(mpg_sync_begin(x->sync, 7, 0, NULL));
  SC_TRY(mpg_sync_mark_ready(x->sync, 1));
  SC_TRY(mpg_sync_mark_ready(x->sync, 0));
  SC_TRY(mpg_sync_finish(x->sync));
  SC_CHECK(mpg_sync_grads_valid(x->sync) == 1, "rank %d: no step failed yet", rank);
  /* The last micro-batch launches, and fails. */
  SC_TRY(mpg_sync_begin(x->sync, 7, 1, NULL));
  SC_TRY(mpg_sync_mark_ready(x->sync, 1)); /* b: half of the only bucket */
  H_EXPECT(mpg_sync_mark_ready(x->sync, 0), MPG_ERR_ABORTED, "sync step 7: bucket 0 of 1");
  SC_CHECK(mpg_sync_grads_valid(x->sync) == 0, "rank %d: valid after a failed launch", rank);
  H_EXPECT(mpg_sync_finish(x->sync), MPG_ERR_ABORTED, "\"w\"");
  SC_CHECK(mpg_sync_grads_valid(x->sync) == 0, "rank %d: valid after a failed step", rank);
  H_EXPECT(mpg_sync_all(x->sync, 8, NULL), MPG_ERR_ABORTED, "aborted in step 7");
  H_EXPECT(mpg_sync_begin(x->sync, 8, 0, NULL), MPG_ERR_ABORTED, "aborted in step 7");
  /* Zeroing needs no communication. */
  SC_TRY(mpg_sync_zero_grads(x->sync));
done:
  return rc;
}

Test(sync_errors, aborted_context_fails_the_step) {
  run_hand_once("dp=2", NULL, 2, abort_body, 5.0);
}

/* ------------------------------------------------------------------ */
/* API errors on one rank                                               */
/* ------------------------------------------------------------------ */

static mpg_status api_body(hand *h, const mpg_init_opts *opts, sc_out *o, sc_objs *x) {
  int rank = opts->rank;
  mpg_status rc = MPG_OK;
  (void)h;
  mpg_mesh *mesh2 = NULL;
  mpg_ctx *ctx = x->ctx, *ctx2 = NULL;
  mpg_sync *s = NULL, *s2 = (mpg_sync *)&rc;
  mpg_sync_opts so = MPG_SYNC_OPTS_INIT;

  /* create */
  H_EXPECT(mpg_sync_create(ctx, NULL, NULL), MPG_ERR_INVALID, "out is NULL");
  H_EXPECT(mpg_sync_create(NULL, NULL, &s2), MPG_ERR_INVALID, "ctx is NULL");
  SC_CHECK(s2 == NULL, "*out not NULL after a failure");
  so.magic = 0;
  H_EXPECT(mpg_sync_create(ctx, &so, &s), MPG_ERR_INVALID, "MPG_SYNC_OPTS_INIT");
  so = (mpg_sync_opts)MPG_SYNC_OPTS_INIT;
  so.sync.bucket_mb = 0;
  H_EXPECT(mpg_sync_create(ctx, &so, &s), MPG_ERR_INVALID, "bucket_mb is 0");
  so = (mpg_sync_opts)MPG_SYNC_OPTS_INIT;
  so.sync.first_bucket_mb = -1;
  H_EXPECT(mpg_sync_create(ctx, &so, &s), MPG_ERR_INVALID, "first_bucket_mb is -1");
  so = (mpg_sync_opts)MPG_SYNC_OPTS_INIT;
  so.grad_scale = NAN;
  H_EXPECT(mpg_sync_create(ctx, &so, &s), MPG_ERR_INVALID, "grad_scale");
  so = (mpg_sync_opts)MPG_SYNC_OPTS_INIT;
  so.sync.op = (mpg_op)7;
  H_EXPECT(mpg_sync_create(ctx, &so, &s), MPG_ERR_INVALID, "opts.sync.op is 7");
  so = (mpg_sync_opts)MPG_SYNC_OPTS_INIT;
  so.sync.reduce_dtype = (mpg_reduce_dtype)9;
  H_EXPECT(mpg_sync_create(ctx, &so, &s), MPG_ERR_INVALID, "reduce_dtype is 9");
  so = (mpg_sync_opts)MPG_SYNC_OPTS_INIT;
  so.default_dims = "";
  H_EXPECT(mpg_sync_create(ctx, &so, &s), MPG_ERR_INVALID, "default_dims");
  so.default_dims = "dp,nope";
  H_EXPECT(mpg_sync_create(ctx, &so, &s), MPG_ERR_NOT_FOUND, "nope");
  SC_CHECK(s == NULL, "*out not NULL after a failure");

  /* A mesh with neither dp_cp nor dp / cp. */
  {
    scenario *sc = calloc(1, sizeof *sc);
    sc->mesh = "tp=2,pp=1";
    SC_TRY(sc_make_mesh(sc, &mesh2));
    free(sc);
    SC_TRY(mpg_ctx_create(mesh2, opts, &ctx2));
    H_EXPECT(mpg_sync_create(ctx2, NULL, &s), MPG_ERR_NOT_FOUND, "dp_cp");
    H_EXPECT(mpg_sync_create(ctx2, NULL, &s), MPG_ERR_NOT_FOUND, "tp, pp");
    so = (mpg_sync_opts)MPG_SYNC_OPTS_INIT;
    so.default_dims = "tp";
    SC_TRY(mpg_sync_create(ctx2, &so, &s));
    SC_TRY(mpg_sync_destroy(s));
    s = NULL;
  }

  /* a spec's [sync] is the options' sync section */
  {
    mpg_spec *spec = malloc(sizeof *spec);
    SC_CHECK(spec, "out of memory");
    *spec = (mpg_spec)MPG_SPEC_INIT;
    mpg_status st = mpg_spec_load_string(
        "[mesh]\ndims = [ { name = \"dp\", size = 1 } ]\n"
        "[sync]\nfsdp_owns_dp = true\nop = \"sum\"\nbucket_mb = 4.5\n"
        "first_bucket_mb = 0.5\nreduce_dtype = \"native\"\n",
        "t.toml", spec);
    if (st) {
      free(spec);
      SC_CHECK(0, "load_string: %s", mpg_last_error());
    }
    mpg_sync_opts fo = MPG_SYNC_OPTS_INIT;
    fo.grad_scale = 0.5;
    fo.sync = spec->sync;
    free(spec);
    mpg_sync *fs = NULL;
    st = mpg_sync_create(ctx, &fo, &fs);
    SC_CHECK(st == MPG_OK, "sync from a spec's [sync]: %s", mpg_last_error());
    SC_TRY(mpg_sync_destroy(fs));
    SC_CHECK(fo.sync.fsdp_owns_dp == 1 && fo.sync.op == MPG_OP_SUM && fo.sync.bucket_mb == 4.5 &&
                fo.sync.first_bucket_mb == 0.5 && fo.sync.reduce_dtype == MPG_REDUCE_NATIVE &&
                fo.grad_scale == 0.5 && fo.default_dims == NULL,
            "the spec's [sync] holds the wrong values");
  }

  /* add_param */
  SC_TRY(mpg_sync_create(ctx, NULL, &s));
  int id = 5;
  H_EXPECT(mpg_sync_add_param(s, NULL, 3, MPG_F32, NULL, &id), MPG_ERR_INVALID, "name");
  SC_CHECK(id == -1, "*param is %d after a failure", id);
  H_EXPECT(mpg_sync_add_param(s, "", 3, MPG_F32, NULL, &id), MPG_ERR_INVALID, "empty");
  H_EXPECT(mpg_sync_add_param(s, "zero", 0, MPG_F32, NULL, &id), MPG_ERR_INVALID,
           "param \"zero\": count is 0");
  H_EXPECT(mpg_sync_add_param(s, "dt", 3, (mpg_dtype)17, NULL, &id), MPG_ERR_INVALID,
           "param \"dt\": unknown dtype 17");
  H_EXPECT(mpg_sync_add_param(s, "huge", SIZE_MAX / 2, MPG_F64, NULL, &id), MPG_ERR_RANGE,
           "huge");
  mpg_param_opts po = MPG_PARAM_OPTS_INIT;
  po.magic = 0;
  H_EXPECT(mpg_sync_add_param(s, "po", 3, MPG_F32, &po, &id), MPG_ERR_INVALID,
           "MPG_PARAM_OPTS_INIT");
  po = (mpg_param_opts)MPG_PARAM_OPTS_INIT;
  po.reduce_dims = "dp,xyz";
  H_EXPECT(mpg_sync_add_param(s, "norm", 3, MPG_F32, &po, &id), MPG_ERR_NOT_FOUND,
           "param \"norm\": reduce_dims \"dp,xyz\"");
  po.reduce_dims = "dp,";
  H_EXPECT(mpg_sync_add_param(s, "norm", 3, MPG_F32, &po, &id), MPG_ERR_INVALID,
           "param \"norm\": reduce_dims");
  SC_TRY(mpg_sync_add_param(s, "a", 3, MPG_F32, NULL, &id));
  SC_CHECK(id == 0, "first id %d", id);
  H_EXPECT(mpg_sync_add_param(s, "a", 4, MPG_F64, NULL, &id), MPG_ERR_INVALID,
           "param \"a\": the name is already registered (id 0)");
  po.reduce_dims = " dp , tp ";
  SC_TRY(mpg_sync_add_param(s, "b", 5, MPG_I32, &po, &id));
  SC_CHECK(id == 1, "second id %d", id);

  /* before commit */
  void *g = (void *)&rc;
  H_EXPECT(mpg_sync_grad(s, 0, &g), MPG_ERR_STATE, "mpg_sync_commit");
  SC_CHECK(g == NULL, "*grad not NULL after a failure");
  mpg_group *grp;
  H_EXPECT(mpg_sync_param_group(s, 0, &grp), MPG_ERR_STATE, "commit");
  H_EXPECT(mpg_sync_begin(s, 0, 1, NULL), MPG_ERR_STATE, "commit");
  H_EXPECT(mpg_sync_zero_grads(s), MPG_ERR_STATE, "commit");
  SC_TRY(mpg_sync_commit(s));
  H_EXPECT(mpg_sync_commit(s), MPG_ERR_STATE, "already committed");
  H_EXPECT(mpg_sync_add_param(s, "late", 3, MPG_F32, NULL, &id), MPG_ERR_STATE,
           "\"late\": the sync is already committed");

  /* views and groups */
  H_EXPECT(mpg_sync_grad(s, 2, &g), MPG_ERR_RANGE, "param 2 is outside 0..1");
  H_EXPECT(mpg_sync_grad(s, -1, &g), MPG_ERR_RANGE, NULL);
  H_EXPECT(mpg_sync_grad(s, 0, NULL), MPG_ERR_INVALID, NULL);
  SC_TRY(mpg_sync_param_group(s, 1, &grp));
  SC_CHECK(mpg_group_size(grp) == 2, "b's group has %d ranks, expected dp x tp = 2",
          mpg_group_size(grp));
  SC_TRY(mpg_sync_param_group(s, 0, &grp));
  SC_CHECK(mpg_group_size(grp) == 1, "a's group (dp_cp) has %d ranks", mpg_group_size(grp));
  H_EXPECT(mpg_sync_param_group(s, 9, &grp), MPG_ERR_RANGE, NULL);

  /* step state */
  H_EXPECT(mpg_sync_mark_ready(s, 0), MPG_ERR_STATE, "mpg_sync_begin");
  H_EXPECT(mpg_sync_finish(s), MPG_ERR_STATE, "no step is open");
  SC_TRY(mpg_sync_begin(s, 3, 1, NULL));
  H_EXPECT(mpg_sync_begin(s, 4, 1, NULL), MPG_ERR_STATE, "step 3 is still open");
  H_EXPECT(mpg_sync_all(s, 4, NULL), MPG_ERR_STATE, "step 3 is still open");
  H_EXPECT(mpg_sync_mark_ready(s, 7), MPG_ERR_RANGE, "param 7");
  SC_TRY(mpg_sync_mark_ready(s, 1));
  H_EXPECT(mpg_sync_mark_ready(s, 1), MPG_ERR_STATE, "\"b\" (param 1): already marked "
           "ready in step 3");
  H_EXPECT(mpg_sync_zero_grads(s), MPG_ERR_STATE, "in flight");
  SC_TRY(mpg_sync_finish(s));
  SC_TRY(mpg_sync_zero_grads(s));
  /* A non-last micro-batch may zero (nothing in flight). */
  SC_TRY(mpg_sync_begin(s, 4, 0, NULL));
  SC_TRY(mpg_sync_zero_grads(s));
  SC_TRY(mpg_sync_finish(s));

  /* int params cannot take a grad_scale */
  {
    mpg_sync *s3 = NULL;
    so = (mpg_sync_opts)MPG_SYNC_OPTS_INIT;
    so.grad_scale = 0.5;
    SC_TRY(mpg_sync_create(ctx, &so, &s3));
    mpg_status st = mpg_sync_add_param(s3, "steps", 1, MPG_I64, NULL, &id);
    char msg[512];
    snprintf(msg, sizeof msg, "%s", mpg_last_error());
    mpg_sync_destroy(s3);
    SC_CHECK(st == MPG_ERR_INVALID && strstr(msg, "param \"steps\": dtype i64 cannot take "
                                                 "grad_scale 0.5"),
            "int with grad_scale: %s: %s", mpg_status_name(st), msg);
  }

  /* NULLs */
  SC_CHECK(mpg_sync_destroy(NULL) == MPG_OK, "destroy(NULL)");
  SC_CHECK(mpg_sync_grads_valid(NULL) == 0, "grads_valid(NULL)");
  mpg_sync_stats stats = MPG_SYNC_STATS_INIT;
  H_EXPECT(mpg_sync_get_stats(NULL, &stats), MPG_ERR_INVALID, NULL);
  H_EXPECT(mpg_sync_get_stats(s, NULL), MPG_ERR_INVALID, NULL);
  H_EXPECT(mpg_sync_begin(NULL, 0, 1, NULL), MPG_ERR_INVALID, NULL);
  H_EXPECT(mpg_sync_mark_ready(NULL, 0), MPG_ERR_INVALID, NULL);
  H_EXPECT(mpg_sync_finish(NULL), MPG_ERR_INVALID, NULL);
  H_EXPECT(mpg_sync_all(NULL, 0, NULL), MPG_ERR_INVALID, NULL);
  H_EXPECT(mpg_sync_zero_grads(NULL), MPG_ERR_INVALID, NULL);
  H_EXPECT(mpg_sync_commit(NULL), MPG_ERR_INVALID, NULL);
  H_EXPECT(mpg_sync_add_param(NULL, "x", 1, MPG_F32, NULL, &id), MPG_ERR_INVALID, NULL);
  H_EXPECT(mpg_sync_add_param(s, "x", 1, MPG_F32, NULL, NULL), MPG_ERR_INVALID, NULL);
  SC_TRY(mpg_sync_get_stats(s, &stats));
  SC_CHECK(stats.num_params == 2 && stats.num_buffers == 2 && stats.num_buckets == 2 &&
              stats.launched_buckets == 2,
          "stats: %d params, %d buffers, %d buckets, %ld launched", stats.num_params,
          stats.num_buffers, stats.num_buckets, stats.launched_buckets);
done:
  mpg_sync_destroy(s);
  mpg_ctx_destroy(ctx2);
  mpg_mesh_destroy(mesh2);
  return rc;
}

Test(sync_errors, api_errors_and_states) {
  run_hand_once("dp=1,cp=1,tp=2", "dp_cp=dp,cp", 2, api_body, 10.0);
}

/* One rank: every collective is a local copy; avg over one rank is the
 * gradient itself, and grad_scale still applies. */
static mpg_status single_body(hand *h, const mpg_init_opts *opts, sc_out *o, sc_objs *x) {
  int rank = opts->rank;
  mpg_status rc = MPG_OK;
  (void)h;
  mpg_sync_opts so = MPG_SYNC_OPTS_INIT;
  so.grad_scale = 0.25;
  SC_TRY(mpg_sync_create(x->ctx, &so, &x->sync));
  int id;
  SC_TRY(mpg_sync_add_param(x->sync, "w", 100, MPG_F32, NULL, &id));
  SC_TRY(mpg_sync_add_param(x->sync, "h", 100, MPG_BF16, NULL, &id));
  SC_TRY(mpg_sync_commit(x->sync));
  float *w;
  uint16_t *hb;
  SC_TRY(mpg_sync_grad(x->sync, 0, (void **)&w));
  SC_TRY(mpg_sync_grad(x->sync, 1, (void **)&hb));
  for (int i = 0; i < 100; i++) {
    w[i] = (float)i;
    hb[i] = tv_f32_to_bf16((float)(i % 16));
  }
  SC_TRY(mpg_sync_all(x->sync, 0, NULL));
  for (int i = 0; i < 100; i++) {
    SC_CHECK(w[i] == (float)i * 0.25f, "w[%d] = %g", i, w[i]);
    SC_CHECK(tv_bf16_to_f32(hb[i]) == (float)(i % 16) * 0.25f, "h[%d] = %g", i,
            tv_bf16_to_f32(hb[i]));
  }
  /* A sync without parameters is valid and does nothing. */
  {
    mpg_sync *e = NULL;
    mpg_sync_stats st = MPG_SYNC_STATS_INIT;
    SC_TRY(mpg_sync_create(x->ctx, NULL, &e));
    mpg_status r1 = mpg_sync_commit(e);
    mpg_status r2 = r1 ? r1 : mpg_sync_all(e, 0, NULL);
    mpg_status r3 = r2 ? r2 : mpg_sync_zero_grads(e);
    mpg_status r4 = r3 ? r3 : mpg_sync_get_stats(e, &st);
    mpg_sync_destroy(e);
    SC_CHECK(r4 == MPG_OK, "empty sync: %s", mpg_last_error());
    SC_CHECK(st.num_params == 0 && st.num_buffers == 0 && st.num_buckets == 0 &&
                st.total_bytes == 0 && st.launched_buckets == 0,
            "empty sync stats");
  }
done:
  return rc;
}

Test(sync_step, single_rank_world) {
  run_hand_once("dp=1", NULL, 1, single_body, 5.0);
}

/* Ranks whose syncs were created with different options that shape the
 * collectives fail commit alike, naming the option, instead of hanging on
 * mismatched buckets. */
typedef struct {
  int field; /* 0: bucket_mb, 1: reduce_dtype, 2: mode, 3: register_buffers */
  mpg_status st[4];
  char msg[4][512];
} opts_job;

/* A rank of run_ranks (tests/support/run_ranks.h) over dp=4. */
static mpg_status differing_opts_rank(rr_rank *rr) {
  opts_job *j = rr->arg;
  int r = mpg_ctx_rank(rr->ctx);
  mpg_status st;
  mpg_sync_opts so = MPG_SYNC_OPTS_INIT;
  if (r == 3) {
    if (j->field == 0) so.sync.bucket_mb = 4;
    if (j->field == 1) so.sync.reduce_dtype = MPG_REDUCE_NATIVE;
    if (j->field == 2) so.sync.mode = MPG_SYNC_SHARD;
    if (j->field == 3) so.register_buffers = 1; /* NCCL: all or none (L4) */
  }
  mpg_sync *s = NULL;
  int id;
  st = mpg_sync_create(rr->ctx, &so, &s);
  if (!st) st = mpg_sync_add_param(s, "w", 1000, MPG_BF16, NULL, &id);
  if (!st) st = mpg_sync_commit(s);
  j->st[r] = st;
  snprintf(j->msg[r], sizeof j->msg[r], "%s", st ? mpg_last_error() : "");
  mpg_sync_destroy(s);
  return MPG_OK;
}

Test(sync_errors, ranks_with_different_options_fail_commit_alike) {
  const char *names[] = {"opts.sync.bucket_mb is 25 on world rank 0 but 4 on world rank 3",
                         "opts.sync.reduce_dtype is 1 on world rank 0 but 0 on world rank 3",
                         "opts.sync.mode is 0 on world rank 0 but 1 on world rank 3",
                         "opts.register_buffers is 0 on world rank 0 but 1 on world rank 3"};
  for (int f = 0; f < 4; f++) {
    opts_job j = {.field = f};
    run_ranks("dp=4", 4, differing_opts_rank, &j);
    for (int r = 0; r < 4; r++) {
      cr_assert_eq(j.st[r], MPG_ERR_STATE, "field %d rank %d: %s: %s", f, r,
                   mpg_status_name(j.st[r]), j.msg[r]);
      cr_assert(strstr(j.msg[r], names[f]), "rank %d: %s", r, j.msg[r]);
    }
  }
}
