/* The thread backend, part 3 of 3 (test_thread.c has the overview):
 * contexts in sequence and side by side, large worlds, lazy groups,
 * mpg_thread_run's contract, context creation errors, partial groups.
 * Ranks are threads; a rank records its first failure (RCHECK,
 * tests/support/rank_check.h). */
#include <criterion/criterion.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "meshpg.h"
#include "../support/rank_check.h"
#include "run_ranks.h"
#include "../support/time_bound.h"

/* ------------------------------------------------------------------------ */
/* Contexts one after the other and side by side                             */
/* ------------------------------------------------------------------------ */

/* Without run_ranks' context (no_ctx): two of its own, twice. */
static mpg_status two_ctx_main(rr_rank *r) {
  for (int round = 0; round < 2; round++) {
    mpg_ctx *a = NULL, *b = NULL;
    RCALL(mpg_ctx_create(r->mesh, r->opts, &a));
    RCALL(mpg_ctx_create(r->mesh, r->opts, &b));
    mpg_group *ga, *gb;
    RCALL(mpg_ctx_group(a, "tp", &ga));
    RCALL(mpg_ctx_group(b, "tp", &gb));
    int32_t x = r->rank, sa = 0, sb = 0;
    mpg_work *wa, *wb;
    /* b first on purpose: each context matches its own calls. */
    RCALL(mpg_all_reduce(gb, &x, &sb, 1, MPG_I32, MPG_OP_MAX, NULL, &wb));
    RCALL(mpg_all_reduce(ga, &x, &sa, 1, MPG_I32, MPG_OP_MIN, NULL, &wa));
    RCALL(mpg_work_wait(wa));
    RCALL(mpg_work_wait(wb));
    int m0, m1;
    RCALL(mpg_group_member(ga, 0, &m0));
    RCALL(mpg_group_member(ga, 1, &m1));
    RCHECK(sa == m0 && sb == m1, "round %d: min %d max %d, members %d %d", round, sa, sb, m0, m1);
    RCALL(mpg_ctx_destroy(b));
    RCALL(mpg_ctx_destroy(a));
  }
  return MPG_OK;
}

Test(thread_ctx, contexts_in_sequence_and_side_by_side) {
  run_ranks_ok("dp=2,tp=2", 4, two_ctx_main, NULL, &(rr_opts){.no_ctx = 1});
}

/* ------------------------------------------------------------------------ */
/* A 1024-rank world                                                         */
/* ------------------------------------------------------------------------ */

typedef struct big_arg {
  double t_create[1024], t_reduce[1024];
} big_arg;

/* Makes its context itself (no_ctx), to time it; run_ranks destroys it. */
static mpg_status big_main(rr_rank *r) {
  big_arg *ba = r->arg;
  double t0 = now_s();
  RCALL(mpg_ctx_create(r->mesh, r->opts, &r->ctx));
  tl_ctx = r->ctx;
  mpg_ctx *ctx = r->ctx;
  int rank = r->rank;
  double t1 = now_s();
  mpg_group *world, *tp;
  RCALL(mpg_ctx_group(ctx, "world", &world));
  RCALL(mpg_ctx_group(ctx, "tp", &tp));
  int64_t x[2] = {rank, 1}, s[2];
  RCALL(mpg_all_reduce(world, x, s, 2, MPG_I64, MPG_OP_SUM, NULL, NULL));
  double t2 = now_s();
  RCHECK(s[0] == 1023LL * 1024 / 2 && s[1] == 1024, "world sum %lld %lld", (long long)s[0],
         (long long)s[1]);
  float f = 1.0f, avg = 0;
  RCALL(mpg_all_reduce(tp, &f, &avg, 1, MPG_F32, MPG_OP_AVG, NULL, NULL));
  RCHECK(avg == 1.0f, "tp avg %g", avg);
  int32_t me = rank, first = -1;
  RCALL(mpg_broadcast(tp, mpg_group_position(tp) == 0 ? &me : &first, 1, MPG_I32, 0, NULL, NULL));
  int m0;
  RCALL(mpg_group_member(tp, 0, &m0));
  RCHECK(mpg_group_position(tp) == 0 || first == m0, "tp broadcast gave %d, expected %d", first, m0);
  ba->t_create[rank] = t1 - t0;
  ba->t_reduce[rank] = t2 - t1;
  return MPG_OK;
}

Test(thread_scale, world_of_1024_ranks, .timeout = 120) {
  big_arg *ba = calloc(1, sizeof *ba);
  double t0 = now_s();
  run_ranks_ok("dp=32,tp=32", 1024, big_main, ba, &(rr_opts){.timeout_s = 60.0, .no_ctx = 1});
  double t = now_s() - t0;
  double cmax = 0, rmax = 0;
  for (int r = 0; r < 1024; r++) {
    if (ba->t_create[r] > cmax) cmax = ba->t_create[r];
    if (ba->t_reduce[r] > rmax) rmax = ba->t_reduce[r];
  }
  fprintf(stderr, "thread 1024 ranks: run %.2f s, ctx_create (world + 2 splits) max %.3f s, "
          "world all_reduce max %.3f s\n", t, cmax, rmax);
  cr_assert(t < 30.0, "1024 ranks took %.2f s", t);
  free(ba);
}

/* The largest world mpg_thread_run accepts. */
static mpg_status huge_main(rr_rank *r) {
  mpg_group *world, *dp;
  RCALL(mpg_ctx_group(r->ctx, "world", &world));
  RCALL(mpg_ctx_group(r->ctx, "dp", &dp));
  int64_t x = r->rank, s = 0, mx = 0;
  RCALL(mpg_all_reduce(world, &x, &s, 1, MPG_I64, MPG_OP_SUM, NULL, NULL));
  RCHECK(s == 4095LL * 4096 / 2, "world sum %lld", (long long)s);
  RCALL(mpg_all_reduce(dp, &x, &mx, 1, MPG_I64, MPG_OP_MAX, NULL, NULL));
  int last;
  RCALL(mpg_group_member(dp, mpg_group_size(dp) - 1, &last));
  RCHECK(mx == last, "dp max %lld, expected %d", (long long)mx, last);
  return MPG_OK;
}

Test(thread_scale, world_of_4096_ranks, .timeout = 120) {
  double t0 = now_s();
  run_ranks_ok("dp=64,tp=64", 4096, huge_main, NULL, &(rr_opts){.timeout_s = 60.0});
  double t = now_s() - t0;
  fprintf(stderr, "thread 4096 ranks: %.2f s\n", t);
  /* 30 s plain (about 10 s measured on CI's loaded 2 cores); a sanitizer
   * slows each of the 4,096 threads (gcc's TSan measured 31 s). */
  double bound = 30.0 * tb_sanitizer_factor();
  cr_assert(t < bound, "4096 ranks took %.2f s (bound %.0f s)", t, bound);
}

/* A world of one rank: every group has size 1. */
static mpg_status single_main(rr_rank *r) {
  mpg_group *g;
  RCALL(mpg_ctx_group(r->ctx, "world", &g));
  RCHECK(mpg_group_size(g) == 1 && mpg_group_position(g) == 0, "world of one");
  double x[3] = {1, 2, 3}, y[3] = {0};
  RCALL(mpg_all_reduce_scaled(g, x, y, 3, MPG_F64, 0.5, NULL, NULL));
  RCHECK(y[0] == 0.5 && y[2] == 1.5, "scaled: %g %g", y[0], y[2]);
  RCALL(mpg_barrier(g, NULL));
  return MPG_OK;
}

Test(thread_scale, world_of_one_rank) {
  run_ranks_ok("dp=1,tp=1", 1, single_main, NULL, &(rr_opts){.timeout_s = 5.0});
}

/* Lazy groups: each is split off the world on first use. */
static mpg_status lazy_main(rr_rank *r) {
  const char *names[] = {"tp", "dp_cp", "cp", "dp", "world"};
  for (int i = 0; i < 5; i++) {
    mpg_group *g;
    RCALL(mpg_ctx_group(r->ctx, names[i], &g));
    int32_t one = 1, n = 0;
    RCALL(mpg_all_reduce(g, &one, &n, 1, MPG_I32, MPG_OP_SUM, NULL, NULL));
    RCHECK(n == mpg_group_size(g), "%s: %d members counted, size %d", names[i], n,
           mpg_group_size(g));
  }
  return MPG_OK;
}

Test(thread_ctx, lazy_groups) {
  run_ranks_ok("dp=2,cp=2,tp=3", 12, lazy_main, NULL,
               &(rr_opts){.flatten = "dp_cp=dp,cp", .lazy_groups = 1});
}

/* ------------------------------------------------------------------------ */
/* mpg_thread_run and initialisation errors                                  */
/* ------------------------------------------------------------------------ */

static mpg_status ok_main(const mpg_init_opts *opts, void *arg) {
  (void)arg;
  return opts->backend.name == MPG_BACKEND_THREAD && opts->thread_world ? MPG_OK : MPG_ERR_STATE;
}

Test(thread_run, bad_arguments) {
  cr_assert_eq(mpg_thread_run(0, 1.0, ok_main, NULL, NULL), MPG_ERR_INVALID);
  cr_assert(strstr(mpg_last_error(), "nranks") != NULL, "%s", mpg_last_error());
  cr_assert_eq(mpg_thread_run(4097, 1.0, ok_main, NULL, NULL), MPG_ERR_INVALID);
  cr_assert(strstr(mpg_last_error(), "4097") != NULL, "%s", mpg_last_error());
  cr_assert_eq(mpg_thread_run(2, 0.0, ok_main, NULL, NULL), MPG_ERR_INVALID);
  cr_assert(strstr(mpg_last_error(), "timeout") != NULL, "%s", mpg_last_error());
  cr_assert_eq(mpg_thread_run(2, 1.0, NULL, NULL, NULL), MPG_ERR_INVALID);
  cr_assert(strstr(mpg_last_error(), "main") != NULL, "%s", mpg_last_error());
}

typedef struct opts_arg {
  mpg_init_opts seen[8];
} opts_arg;

static mpg_status record_opts(const mpg_init_opts *opts, void *arg) {
  opts_arg *oa = arg;
  oa->seen[opts->rank] = *opts;
  return MPG_OK;
}

Test(thread_run, each_rank_gets_its_options) {
  opts_arg oa;
  memset(&oa, 0, sizeof oa);
  mpg_status st[8];
  cr_assert_eq(mpg_thread_run(8, 2.5, record_opts, &oa, st), MPG_OK, "%s", mpg_last_error());
  for (int r = 0; r < 8; r++) {
    const mpg_init_opts *o = &oa.seen[r];
    cr_assert_eq(st[r], MPG_OK);
    cr_assert_eq(o->magic, MPG_INIT_OPTS_MAGIC);
    cr_assert_eq(o->size, sizeof(mpg_init_opts));
    cr_assert_eq(o->backend.name, MPG_BACKEND_THREAD);
    cr_assert_eq(o->rank, r);
    cr_assert_eq(o->world_size, 8);
    cr_assert_eq(o->local_rank, r);
    cr_assert_eq(o->local_world_size, 8);
    cr_assert(o->backend.timeout_s == 2.5);
    cr_assert_not_null(o->thread_world);
    cr_assert_eq(o->thread_world, oa.seen[0].thread_world);
  }
}

static mpg_status fail_on_2(const mpg_init_opts *opts, void *arg) {
  const mpg_mesh *mesh = arg;
  if (opts->rank != 2) return MPG_OK;
  int s;
  return mpg_mesh_dimset_find(mesh, "nosuchdim", &s);
}

Test(thread_run, first_failure_and_its_message_reach_the_caller) {
  mpg_mesh *mesh = make_mesh("dp=4", NULL);
  mpg_status st[4];
  mpg_status got = mpg_thread_run(4, 1.0, fail_on_2, mesh, st);
  cr_assert_eq(got, MPG_ERR_NOT_FOUND, "%s", mpg_status_name(got));
  cr_assert(strstr(mpg_last_error(), "nosuchdim") != NULL, "message: %s", mpg_last_error());
  for (int r = 0; r < 4; r++)
    cr_assert_eq(st[r], r == 2 ? MPG_ERR_NOT_FOUND : MPG_OK, "rank %d", r);
  mpg_mesh_destroy(mesh);
}

typedef struct init_arg {
  const mpg_mesh *mesh;
  int mode;
  mpg_status got[8];
  char msg[8][256];
} init_arg;

static mpg_status init_err_main(const mpg_init_opts *opts, void *arg) {
  init_arg *ia = arg;
  mpg_init_opts o = *opts;
  if (ia->mode == 1) o.world_size = 8; /* claims the mesh's size, not the world's */
  if (ia->mode == 2) o.thread_world = NULL;
  mpg_ctx *const sentinel = (mpg_ctx *)(uintptr_t)0x10;
  mpg_ctx *ctx = sentinel; /* must be reset to NULL */
  ia->got[opts->rank] = mpg_ctx_create(ia->mesh, &o, &ctx);
  snprintf(ia->msg[opts->rank], sizeof ia->msg[0], "%s", mpg_last_error());
  if (ctx == sentinel) return MPG_ERR_STATE;
  if (ctx) {
    mpg_ctx_destroy(ctx);
    return MPG_ERR_STATE;
  }
  return MPG_OK;
}

static void run_init_err(int mode, int nranks, const char *want_sub) {
  mpg_mesh *mesh = make_mesh("dp=2,tp=4", NULL); /* 8 ranks */
  init_arg *ia = calloc(1, sizeof *ia);
  ia->mesh = mesh;
  ia->mode = mode;
  EXPECT_RUN_OK(mpg_thread_run(nranks, 1.0, init_err_main, ia, NULL));
  for (int r = 0; r < nranks; r++) {
    cr_assert(ia->got[r] == MPG_ERR_INVALID || ia->got[r] == MPG_ERR_ENV,
              "mode %d rank %d: %s (%s)", mode, r, mpg_status_name(ia->got[r]), ia->msg[r]);
    cr_assert(strstr(ia->msg[r], want_sub) != NULL, "mode %d rank %d: message \"%s\" lacks \"%s\"",
              mode, r, ia->msg[r], want_sub);
  }
  free(ia);
  mpg_mesh_destroy(mesh);
}

Test(thread_init, world_smaller_than_the_mesh) { run_init_err(0, 4, "8"); }
Test(thread_init, options_disagree_with_the_thread_world) { run_init_err(1, 4, "4"); }
Test(thread_init, no_thread_world) { run_init_err(2, 8, "thread"); }

/* mpg_ctx_status: healthy until an abort, then the reason, and collectives
 * fail at once with MPG_ERR_ABORTED. */
static mpg_status status_main(rr_rank *r) {
  mpg_ctx *ctx = r->ctx;
  mpg_status st = MPG_OK;
  if (mpg_ctx_status(ctx) != MPG_OK) st = MPG_ERR_STATE;
  if (!st && mpg_ctx_abort(ctx) != MPG_OK) st = MPG_ERR_STATE;
  if (!st && mpg_ctx_status(ctx) != MPG_ERR_ABORTED) st = MPG_ERR_STATE;
  mpg_group *g = NULL;
  int x = 1;
  if (!st) st = mpg_ctx_group(ctx, "dp", &g);
  if (!st && mpg_all_reduce(g, &x, &x, 1, MPG_I32, MPG_OP_SUM, NULL, NULL) != MPG_ERR_ABORTED)
    st = MPG_ERR_STATE;
  tl_ctx = NULL;
  (void)mpg_ctx_destroy(ctx); /* its status unchecked, as an aborted context's */
  r->ctx = NULL;
  return st;
}

Test(thread_misc, ctx_status_after_abort) {
  run_ranks_ok("dp=2", 2, status_main, NULL, &(rr_opts){.timeout_s = 5.0});
}

/* ------------------------------------------------------------------------ */
/* Partial data-parallel groups (mpg_ctx_group_partial)                      */
/* ------------------------------------------------------------------------ */

/* The members of this rank's intra and inter groups, as Megatron's
 * create_hierarchical_groups lays them out over the members of the group of
 * `set` (written here from its einops pattern "(l s u) -> (l u) s": level 0
 * takes s = c consecutive members, level 1 takes every c-th), checked
 * against the library's groups, and an all-reduce over each. */
typedef struct partial_arg {
  const mpg_mesh *mesh;
  const char *set;
  int instances;
} partial_arg;

static mpg_status partial_main(const mpg_init_opts *opts, void *arg) {
  partial_arg *pa = arg;
  int r = opts->rank;
  tl_rank = r;
  mpg_ctx *ctx = NULL;
  RCALL(mpg_ctx_create(pa->mesh, opts, &ctx));
  tl_ctx = ctx;
  int ds, gi, pos, size;
  RCALL(mpg_mesh_dimset_find(pa->mesh, pa->set, &ds));
  RCALL(mpg_mesh_group_of(pa->mesh, ds, r, &gi, &pos, &size));
  int *all = malloc(sizeof(int) * (size_t)size);
  RCHECK(all != NULL, "out of memory");
  RCALL(mpg_mesh_group_members(pa->mesh, ds, gi, all));
  int n = pa->instances, c = size / n;
  mpg_group *intra = NULL, *inter = NULL, *again = NULL;
  RCALL(mpg_ctx_group_partial(ctx, pa->set, n, MPG_PARTIAL_INTRA, &intra));
  RCALL(mpg_ctx_group_partial(ctx, pa->set, n, MPG_PARTIAL_INTER, &inter));
  RCALL(mpg_ctx_group_partial(ctx, pa->set, n, MPG_PARTIAL_INTRA, &again));
  RCHECK(again == intra, "the intra group was not cached");
  RCHECK(mpg_group_size(intra) == c && mpg_group_size(inter) == n,
         "sizes %d and %d, expected %d and %d", mpg_group_size(intra),
         mpg_group_size(inter), c, n);
  RCHECK(mpg_group_position(intra) == pos % c && mpg_group_position(inter) == pos / c,
         "positions %d and %d in %s (position %d, c %d)", mpg_group_position(intra),
         mpg_group_position(inter), pa->set, pos, c);
  long want_intra = 0, want_inter = 0;
  for (int p = 0; p < c; p++) {
    int m;
    RCALL(mpg_group_member(intra, p, &m));
    RCHECK(m == all[pos / c * c + p], "intra member %d is rank %d, expected %d", p, m,
           all[pos / c * c + p]);
    want_intra += m;
  }
  for (int p = 0; p < n; p++) {
    int m;
    RCALL(mpg_group_member(inter, p, &m));
    RCHECK(m == all[pos % c + p * c], "inter member %d is rank %d, expected %d", p, m,
           all[pos % c + p * c]);
    want_inter += m;
  }
  /* The communicators hold exactly those members. */
  int64_t x = r, s1 = 0, s2 = 0;
  RCALL(mpg_all_reduce(intra, &x, &s1, 1, MPG_I64, MPG_OP_SUM, NULL, NULL));
  RCALL(mpg_all_reduce(inter, &x, &s2, 1, MPG_I64, MPG_OP_SUM, NULL, NULL));
  RCHECK(s1 == want_intra && s2 == want_inter, "sums %lld and %lld, expected %ld and %ld",
         (long long)s1, (long long)s2, want_intra, want_inter);
  free(all);
  tl_ctx = NULL;
  RCALL(mpg_ctx_destroy(ctx));
  return MPG_OK;
}

/* Random meshes with an expert grid; a random dim set among dp_cp, edp,
 * dp and world, and a random divisor of its size as instances. */
Test(thread_partial, megatron_partial_groups_on_random_meshes, .timeout = 300) {
  uint64_t seed = 0x5eed2026u;
  const char *sets[] = {"edp", "dp_cp", "dp", "world"};
  int cases = 0;
  for (int t = 0; t < 40; t++) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    int tp = 1 << (int)((seed >> 33) % 2), cp = 1 << (int)((seed >> 35) % 2),
        dp = 1 << (int)((seed >> 37) % 3), pp = 1 << (int)((seed >> 40) % 2);
    char dims[96];
    snprintf(dims, sizeof dims, "pp=%d,dp=%d,cp=%d,tp=%d", pp, dp, cp, tp);
    mpg_spec spec = MPG_SPEC_INIT;
    cr_assert_eq(mpg_spec_init(&spec), MPG_OK);
    cr_assert_eq(mpg_spec_set_mesh(&spec, dims), MPG_OK, "%s", mpg_last_error());
    cr_assert_eq(mpg_spec_add_flatten(&spec, "dp_cp", "dp,cp"), MPG_OK, "%s", mpg_last_error());
    int stage = tp * cp * dp, ep = 1 << (int)((seed >> 43) % 3);
    if (stage % ep) ep = 1;
    cr_assert_eq(mpg_spec_set_experts(&spec, 1, ep, NULL), MPG_OK, "%s", mpg_last_error());
    mpg_mesh *m = NULL;
    cr_assert_eq(mpg_mesh_create(&spec, 0, &m), MPG_OK, "%s (ep %d): %s", dims, ep,
                 mpg_last_error());
    partial_arg *pa = calloc(1, sizeof *pa);
    pa->mesh = m;
    pa->set = sets[(seed >> 47) % 4];
    int ds, size;
    cr_assert_eq(mpg_mesh_dimset_find(m, pa->set, &ds), MPG_OK);
    cr_assert_eq(mpg_mesh_group_of(m, ds, 0, NULL, NULL, &size), MPG_OK);
    int divs[16], nd = 0;
    for (int d = 1; d <= size; d++)
      if (size % d == 0) divs[nd++] = d;
    pa->instances = divs[(seed >> 51) % (uint64_t)nd];
    EXPECT_RUN_OK(mpg_thread_run(pp * stage, 30.0, partial_main, pa, NULL));
    cases++;
    free(pa);
    mpg_mesh_destroy(m);
  }
  cr_assert_eq(cases, 40);
}
