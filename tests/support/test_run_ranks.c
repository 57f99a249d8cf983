/* The shared thread-rank runner (tests/support/run_ranks.h) on its own:
 * a context made and destroyed for each rank, the world taken from the
 * dims, runs without a mesh or with the rank's own context, and a failing
 * rank named on the test thread while its peers, whose waits its abort
 * ends, return within the time bound. */
#include <criterion/criterion.h>
#include <string.h>

#include "run_ranks.h"

/* Every rank sums its rank over tp and checks what it was given. */
static mpg_status sum_rank(rr_rank *r) {
  int *want_world = r->arg;
  RCHECK(r->ctx && r->mesh, "no context or mesh");
  RCHECK(r->world == *want_world && r->opts->rank == r->rank &&
             r->opts->world_size == r->world && mpg_ctx_rank(r->ctx) == r->rank,
         "rank %d of %d (want %d ranks), opts %d of %d", r->rank, r->world, *want_world,
         r->opts->rank, r->opts->world_size);
  mpg_group *tp;
  RCALL(mpg_ctx_group(r->ctx, "tp", &tp));
  int32_t x = r->rank, y = 0;
  RCALL(mpg_all_reduce(tp, &x, &y, 1, MPG_I32, MPG_OP_SUM, NULL, NULL));
  int m0, m1;
  RCALL(mpg_group_member(tp, 0, &m0));
  RCALL(mpg_group_member(tp, 1, &m1));
  RCHECK(y == m0 + m1, "tp sum %d, members %d and %d", y, m0, m1);
  return MPG_OK;
}

Test(run_ranks, each_rank_has_a_context) {
  int world = 4;
  run_ranks("dp=2,tp=2", 4, sum_rank, &world);
}

Test(run_ranks, world_from_the_dims) {
  int world = 6;
  run_ranks("dp=3,tp=2", 0, sum_rank, &world);
}

/* Without dims: no mesh, no context; the rank still knows its place. */
static mpg_status bare_rank(rr_rank *r) {
  RCHECK(!r->ctx && !r->mesh && r->world == 3, "ctx %p mesh %p world %d", (void *)r->ctx,
         (const void *)r->mesh, r->world);
  int *seen = r->arg;
  seen[r->rank] = 1;
  return MPG_OK;
}

Test(run_ranks, no_mesh) {
  int seen[3] = {0};
  run_ranks(NULL, 3, bare_rank, seen);
  for (int r = 0; r < 3; r++) cr_expect_eq(seen[r], 1, "rank %d did not run", r);
}

/* no_ctx: the rank makes (and destroys) its own context, lazy here. */
static mpg_status own_ctx_rank(rr_rank *r) {
  RCHECK(!r->ctx && r->mesh, "a context was made for the rank");
  mpg_init_opts o = *r->opts;
  o.backend.lazy_groups = 1;
  mpg_ctx *ctx = NULL;
  RCALL(mpg_ctx_create(r->mesh, &o, &ctx));
  tl_ctx = ctx;
  mpg_group *w;
  RCALL(mpg_ctx_group(ctx, "world", &w));
  RCALL(mpg_barrier(w, NULL));
  tl_ctx = NULL;
  RCALL(mpg_ctx_destroy(ctx));
  return MPG_OK;
}

Test(run_ranks, rank_makes_its_own_context) {
  rr_opts o = {.no_ctx = 1};
  run_ranks_ok("dp=2", 2, own_ctx_rank, NULL, &o);
}

/* Rank 2 fails before the barrier its peers wait in: its abort ends their
 * wait, each rank's status comes back, and the first failure names it. */
static mpg_status fail_on_2(rr_rank *r) {
  mpg_group *w;
  RCALL(mpg_ctx_group(r->ctx, "world", &w));
  RCHECK(r->rank != 2, "planned failure on rank %d", r->rank);
  return mpg_barrier(w, NULL);
}

Test(run_ranks, failing_rank_is_named) {
  mpg_status st[4];
  rr_rank ranks[4];
  /* The peers' barrier ends at the abort, long before their 30 s timeout. */
  rr_opts o = {.timeout_s = 30, .bound_s = 5, .statuses = st, .ranks = ranks};
  mpg_status rc = run_ranks_ex("dp=4", 4, fail_on_2, NULL, &o);
  cr_assert_neq(rc, MPG_OK, "the run passed");
  cr_assert_eq(st[2], MPG_ERR_STATE, "rank 2: %s", mpg_status_name(st[2]));
  cr_assert(strstr(fail_msg, "rank 2 at ") && strstr(fail_msg, "planned failure on rank 2"),
            "first failure: %s", fail_msg);
  cr_assert(strstr(ranks[2].msg, "planned failure"), "rank 2's message: %s", ranks[2].msg);
  for (int r = 0; r < 4; r++)
    if (r != 2) cr_assert_neq(st[r], MPG_OK, "rank %d passed its barrier without rank 2", r);
}
