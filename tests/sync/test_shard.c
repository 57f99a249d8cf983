/* The sync's shard mode (MPG_SYNC_SHARD) on the thread backend: property
 * tests over random meshes and random param lists (shard_check.h: padding,
 * owned ranges that partition every param across the shard group, state
 * offsets, reduce-scattered gradients against a reference, gathers that
 * restore every param on every rank), the fixed cases the MPI worker also
 * runs, and the API's error paths. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shard_check.h"
#include "../support/mesh_util.h"
#include "../support/rank_check.h"
#include "../support/run_ranks.h"

typedef struct sarg {
  const shard_case *c;
  sc_out out[SC_MAX_RANKS];
} sarg;

static mpg_status shard_rank(const mpg_init_opts *opts, void *arg) {
  sarg *t = arg;
  return shc_run(opts, t->c, &t->out[opts->rank]);
}

static void describe(const shard_case *c, char *buf, size_t cap) {
  size_t n = (size_t)snprintf(buf, cap,
                              "%s: mesh %s (%s), shard \"%s\" replicate \"%s\", bucket_mb %g "
                              "first %g%s, %d micro-batches, %s x %g, params",
                              c->name, c->mesh, c->flatten, c->shard_dims, c->replicate_dims,
                              c->bucket_mb, c->first_bucket_mb,
                              c->pad_for_nccl ? " pad_for_nccl" : "", c->microbatches,
                              c->op == MPG_OP_AVG ? "avg" : "sum", c->grad_scale);
  for (int p = 0; p < c->nparams && n < cap; p++)
    n += (size_t)snprintf(buf + n, cap - n, " %zu%s%s", c->params[p].count,
                          mpg_dtype_name(c->params[p].dtype),
                          c->params[p].reduce_dims ? "(repl)" : "");
}

/* Run case `c` on its world of thread ranks; assert every rank passed. */
static void run_case(const shard_case *c) {
  sarg *t = calloc(1, sizeof *t);
  cr_assert_not_null(t);
  t->c = c;
  mpg_status st[SC_MAX_RANKS];
  mpg_status rc = mpg_thread_run(c->world, 30.0, shard_rank, t, st);
  char what[1024], all[8192];
  describe(c, what, sizeof what);
  rank_failures(all, sizeof all, c->world, st, t->out[0].msg, sizeof t->out[0]);
  cr_assert_eq(rc, MPG_OK, "%s\nfailed on %d ranks: %s%s", what, c->world, mpg_last_error(),
               all);
  free(t);
}

/* ------------------------------------------------------------------ */
/* Properties                                                          */
/* ------------------------------------------------------------------ */

/* 150 random meshes of 1..24 ranks (dp or dp_replicate x dp_shard, cp, tp in a
 * random order), random shard / replicate dims, param lists, buckets. */
Test(shard_props, random_meshes_and_params, .timeout = 300) {
  shard_case *c = malloc(sizeof *c);
  cr_assert_not_null(c);
  int one_per_bucket = 0, hsdp = 0, repl = 0;
  for (unsigned seed = 1; seed <= 150; seed++) {
    unsigned s = seed * 48271u;
    int world = 1 + (int)(sc_rand(&s) % 24);
    shc_random(c, seed, world);
    one_per_bucket += c->one_per_bucket;
    hsdp += strstr(c->mesh, "dp_shard") != NULL;
    repl += c->replicate_dims[0] != 0;
    run_case(c);
  }
  /* the generator covered each kind */
  cr_assert_gt(one_per_bucket, 3);
  cr_assert_gt(hsdp, 3);
  cr_assert_gt(repl, 3);
  free(c);
}

/* Shard groups that do not divide 128 (S = 3, 5, 6, 12): padding to
 * lcm(S, 128), one param per bucket, so every slice is checked exactly. */
Test(shard_props, uneven_shard_groups_exact_slices, .timeout = 120) {
  shard_case *c = malloc(sizeof *c);
  cr_assert_not_null(c);
  const char *meshes[] = {"dp=3", "dp=5,tp=2", "dp=3,cp=2", "dp_replicate=2,dp_shard=3,cp=2"};
  const char *flat[] = {"dp_cp=dp", "dp_cp=dp", "dp_cp=dp,cp", "dp_cp=dp_replicate,dp_shard,cp"};
  const int worlds[] = {3, 10, 6, 12};
  for (int k = 0; k < 4; k++) {
    shc_init(c, "uneven", meshes[k], flat[k], worlds[k]);
    if (k == 3) {
      snprintf(c->shard_dims, sizeof c->shard_dims, "dp_shard,cp");
      snprintf(c->replicate_dims, sizeof c->replicate_dims, "dp_replicate");
    }
    c->bucket_mb = c->first_bucket_mb = 1e-6;
    c->one_per_bucket = 1;
    const size_t counts[] = {1, 2, 127, 128, 129, 383, 384, 385, 1000, 7};
    for (int p = 0; p < 10; p++)
      shc_add(c, counts[p], p % 3 == 0 ? MPG_BF16 : p % 3 == 1 ? MPG_F32 : MPG_F64, NULL);
    c->microbatches = 2;
    c->seed = (unsigned)k + 1;
    run_case(c);
  }
  free(c);
}

/* Larger worlds: 16 and 64 ranks. */
Test(shard_props, worlds_16_and_64, .timeout = 300) {
  shard_case *c = malloc(sizeof *c);
  cr_assert_not_null(c);
  shc_random(c, 1001, 16);
  run_case(c);
  shc_init(c, "world64_hsdp", "dp_replicate=2,dp_shard=4,cp=2,tp=4",
           "dp_cp=dp_replicate,dp_shard,cp", 64);
  snprintf(c->shard_dims, sizeof c->shard_dims, "dp_shard,cp");
  snprintf(c->replicate_dims, sizeof c->replicate_dims, "dp_replicate");
  shc_add(c, 700, MPG_F32, NULL);
  shc_add(c, 33, MPG_BF16, NULL);
  shc_add(c, 16, MPG_F32, "dp_cp,tp");
  shc_add(c, 129, MPG_F64, NULL);
  c->bucket_mb = 0.001;
  c->first_bucket_mb = 0.0005;
  c->seed = 4;
  run_case(c);
  shc_init(c, "world64_default", "dp=4,cp=4,tp=4", "dp_cp=dp,cp", 64);
  shc_add(c, 1000, MPG_F32, NULL);
  shc_add(c, 16, MPG_F32, "dp_cp,tp");
  shc_add(c, 3, MPG_F64, NULL);
  c->microbatches = 2;
  run_case(c);
  free(c);
}

/* The fixed cases of the MPI worker, on threads. */
Test(shard_props, mpi_worker_cases_on_threads, .timeout = 120) {
  shard_case *c = malloc(sizeof *c);
  cr_assert_not_null(c);
  for (int w = 4; w <= 8; w += 4)
    for (int k = 0; shc_names[k]; k++) {
      cr_assert_eq(shc_build(c, shc_names[k], w), 0, "no case %s for %d ranks", shc_names[k],
                   w);
      run_case(c);
    }
  free(c);
}

/* ------------------------------------------------------------------ */
/* The API's rules                                                     */
/* ------------------------------------------------------------------ */

typedef struct api_arg {
  char msg[SC_MAX_RANKS][512];
} api_arg;

#define A_CHECK(cond, ...)                                                 \
  do {                                                                     \
    if (!(cond)) {                                                         \
      snprintf(a->msg[r], sizeof a->msg[r], __VA_ARGS__);                  \
      rc = MPG_ERR_STATE;                                                  \
      goto done;                                                           \
    }                                                                      \
  } while (0)
#define A_EXPECT(call, want)                                               \
  do {                                                                     \
    mpg_status got_ = (call);                                              \
    A_CHECK(got_ == (want), "line %d: %s -> %s, expected %s: %s", __LINE__, \
            #call, mpg_status_name(got_), mpg_status_name(want),           \
            mpg_last_error());                                             \
  } while (0)

/* A rank of run_ranks (tests/support/run_ranks.h): its context on the
 * run's mesh. */
static mpg_status api_rank(rr_rank *rr) {
  api_arg *a = rr->arg;
  int r = rr->rank;
  mpg_status rc = MPG_OK;
  mpg_ctx *ctx = rr->ctx;
  mpg_sync *rep = NULL, *sh = NULL, *bad = NULL;
  mpg_shard_info info = MPG_SHARD_INFO_INIT;
  void *v = NULL;
  int id;

  /* Replicate mode: no shards, no param buffer, no gathers. */
  A_EXPECT(mpg_sync_create(ctx, NULL, &rep), MPG_OK);
  A_EXPECT(mpg_sync_add_param(rep, "w", 100, MPG_F32, NULL, &id), MPG_OK);
  A_EXPECT(mpg_sync_commit(rep), MPG_OK);
  A_EXPECT(mpg_sync_get_shard(rep, 0, &info), MPG_ERR_STATE);
  A_EXPECT(mpg_sync_param(rep, 0, &v), MPG_ERR_STATE);
  A_EXPECT(mpg_sync_gather_begin(rep, NULL), MPG_ERR_STATE);
  mpg_sync_stats st = MPG_SYNC_STATS_INIT;
  A_EXPECT(mpg_sync_get_stats(rep, &st), MPG_OK);
  A_CHECK(st.shard_elems == 0 && st.pad_elems == 0,
          "replicate mode: shard_elems %zu pad_elems %zu, expected 0", st.shard_elems,
          st.pad_elems);

  /* Bad options. */
  mpg_sync_opts so = MPG_SYNC_OPTS_INIT;
  so.sync.mode = MPG_SYNC_SHARD;
  so.sync.fsdp_owns_dp = 1;
  A_EXPECT(mpg_sync_create(ctx, &so, &bad), MPG_ERR_INVALID);
  so.sync.fsdp_owns_dp = 0;
  snprintf(so.sync.shard_dims, sizeof so.sync.shard_dims, "%s", "dp,cp");
  snprintf(so.sync.replicate_dims, sizeof so.sync.replicate_dims, "%s", "cp");
  A_EXPECT(mpg_sync_create(ctx, &so, &bad), MPG_ERR_INVALID);
  A_CHECK(strstr(mpg_last_error(), "cp"), "overlap message: %s", mpg_last_error());
  snprintf(so.sync.shard_dims, sizeof so.sync.shard_dims, "%s", "dq");
  so.sync.replicate_dims[0] = '\0';
  A_EXPECT(mpg_sync_create(ctx, &so, &bad), MPG_ERR_NOT_FOUND);
  A_CHECK(strstr(mpg_last_error(), "dq"), "unknown dim message: %s", mpg_last_error());

  /* Shard mode: before commit, bad ids and magic, gathers inside a step
   * and twice. */
  so.sync.shard_dims[0] = '\0';
  A_EXPECT(mpg_sync_create(ctx, &so, &sh), MPG_OK);
  A_EXPECT(mpg_sync_add_param(sh, "w", 300, MPG_F32, NULL, &id), MPG_OK);
  mpg_param_opts po = MPG_PARAM_OPTS_INIT;
  po.reduce_dims = "dp_cp,tp";
  A_EXPECT(mpg_sync_add_param(sh, "norm", 8, MPG_F32, &po, &id), MPG_OK);
  A_EXPECT(mpg_sync_get_shard(sh, 0, &info), MPG_ERR_STATE);
  A_EXPECT(mpg_sync_param(sh, 0, &v), MPG_ERR_STATE);
  A_EXPECT(mpg_sync_gather_begin(sh, NULL), MPG_ERR_STATE);
  A_EXPECT(mpg_sync_commit(sh), MPG_OK);
  A_EXPECT(mpg_sync_get_shard(sh, 2, &info), MPG_ERR_RANGE);
  A_EXPECT(mpg_sync_get_shard(sh, -1, &info), MPG_ERR_RANGE);
  A_EXPECT(mpg_sync_get_shard(sh, 0, NULL), MPG_ERR_INVALID);
  mpg_shard_info badinfo = MPG_SHARD_INFO_INIT;
  badinfo.magic = 0;
  A_EXPECT(mpg_sync_get_shard(sh, 0, &badinfo), MPG_ERR_INVALID);
  A_EXPECT(mpg_sync_get_shard(NULL, 0, &info), MPG_ERR_INVALID);
  A_EXPECT(mpg_sync_param(sh, 2, &v), MPG_ERR_RANGE);
  A_EXPECT(mpg_sync_gather_wait(sh, 5), MPG_ERR_RANGE);
  A_EXPECT(mpg_sync_get_shard(sh, 1, &info), MPG_OK);
  A_CHECK(info.sharded == 0 && info.count == 8, "norm: sharded %d count %zu", info.sharded,
          info.count);
  A_EXPECT(mpg_sync_get_stats(sh, &st), MPG_OK);
  A_CHECK(st.shard_size == 4, "shard_size %d, expected 4 (dp_cp)", st.shard_size);
  A_EXPECT(mpg_sync_begin(sh, 0, 1, NULL), MPG_OK);
  A_EXPECT(mpg_sync_gather_begin(sh, NULL), MPG_ERR_STATE);
  A_EXPECT(mpg_sync_finish(sh), MPG_OK);
  A_EXPECT(mpg_sync_gather_begin(sh, NULL), MPG_OK);
  A_EXPECT(mpg_sync_gather_begin(sh, NULL), MPG_ERR_STATE);
  A_EXPECT(mpg_sync_gather_all(sh), MPG_OK);
  /* and again, waiting per param this time */
  A_EXPECT(mpg_sync_gather_begin(sh, NULL), MPG_OK);
  A_EXPECT(mpg_sync_gather_wait(sh, 1), MPG_OK); /* replicated: at once */
  A_EXPECT(mpg_sync_gather_wait(sh, 0), MPG_OK); /* the last bucket: ends the gather */
  /* nothing open: both do nothing */
  A_EXPECT(mpg_sync_gather_wait(sh, 0), MPG_OK);
  A_EXPECT(mpg_sync_gather_all(sh), MPG_OK);
  A_EXPECT(mpg_sync_gather_begin(sh, NULL), MPG_OK); /* so the gather had ended */
  A_EXPECT(mpg_sync_gather_all(sh), MPG_OK);
  A_EXPECT(mpg_sync_all(sh, 1, NULL), MPG_OK);

done:
  mpg_sync_destroy(bad);
  mpg_sync_destroy(sh);
  mpg_sync_destroy(rep);
  return rc;
}

Test(shard_api, error_paths, .timeout = 60) {
  api_arg *a = calloc(1, sizeof *a);
  cr_assert_not_null(a);
  mpg_status st[SC_MAX_RANKS];
  rr_opts ro = {.flatten = "dp_cp=dp,cp", .statuses = st};
  mpg_status rc = run_ranks_ex("dp=2,cp=2,tp=2", 8, api_rank, a, &ro);
  for (int r = 0; r < 8; r++)
    cr_expect_eq(st[r], MPG_OK, "rank %d: %s", r, a->msg[r]);
  cr_assert_eq(rc, MPG_OK, "%s", mpg_last_error());
  free(a);
}

/* The sync options given spec's sync section hold these. */
static void expect_opts_sync(const mpg_spec *spec, mpg_sync_mode mode, const char *shard_dims,
                             const char *replicate_dims, int pad_for_nccl) {
  mpg_sync_opts so = MPG_SYNC_OPTS_INIT;
  so.sync = spec->sync;
  cr_assert_eq(so.sync.mode, mode);
  cr_assert_str_eq(so.sync.shard_dims, shard_dims);
  cr_assert_str_eq(so.sync.replicate_dims, replicate_dims);
  cr_assert_eq(so.sync.pad_for_nccl, pad_for_nccl);
}

/* [sync] mode, shard_dims, replicate_dims and pad_for_nccl are the
 * options' sync section. */
Test(shard_api, opts_hold_the_specs_sync, .timeout = 30) {
  mpg_spec spec = MPG_SPEC_INIT;
  mpg_status st = mpg_spec_load_string(
      "[mesh]\n"
      "dims = [ { name = \"dp_replicate\", size = 2 }, { name = \"dp_shard\", size = 2 },\n"
      "         { name = \"cp\", size = 2 } ]\n"
      "flatten = { dp_cp = [\"dp_replicate\", \"dp_shard\", \"cp\"] }\n"
      "[sync]\nmode = \"shard\"\nshard_dims = \"dp_shard,cp\"\n"
      "replicate_dims = \"dp_replicate\"\npad_for_nccl = true\n",
      "hsdp.toml", &spec);
  cr_assert_eq(st, MPG_OK, "%s", mpg_last_error());
  expect_opts_sync(&spec, MPG_SYNC_SHARD, "dp_shard,cp", "dp_replicate", 1);
  /* the default: replicate, no dims */
  mpg_spec plain = MPG_SPEC_INIT;
  cr_assert_eq(mpg_spec_set_mesh(&plain, "dp=2"), MPG_OK);
  expect_opts_sync(&plain, MPG_SYNC_REPLICATE, "", "", 0);
}
