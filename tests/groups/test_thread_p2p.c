/* The thread backend, part 2 of 3 (test_thread.c has the overview):
 * point to point, mismatched calls, timeouts and abort.  Ranks are threads;
 * a rank records its first failure (RCHECK, tests/support/rank_check.h). */
#include <criterion/criterion.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "meshpg.h"
#include "../support/rank_check.h"
#include "../support/time_bound.h"

/* ------------------------------------------------------------------------ */
/* Point to point                                                            */
/* ------------------------------------------------------------------------ */

static mpg_status p2p_main(const mpg_init_opts *opts, void *arg) {
  const mpg_mesh *mesh = arg;
  tl_rank = opts->rank;
  mpg_ctx *ctx = NULL;
  RCALL(mpg_ctx_create(mesh, opts, &ctx));
  tl_ctx = ctx;
  mpg_group *g;
  RCALL(mpg_ctx_group(ctx, "world", &g));
  int me = mpg_group_position(g);
  if (me == 0) {
    /* Receives posted before the sends, from two peers, matched in order. */
    int64_t a[3][4];
    mpg_work *w[3];
    RCALL(mpg_recv(g, a[0], 4, MPG_I64, 1, NULL, &w[0]));
    RCALL(mpg_recv(g, a[1], 4, MPG_I64, 2, NULL, &w[1]));
    RCALL(mpg_recv(g, a[2], 4, MPG_I64, 1, NULL, &w[2]));
    RCALL(mpg_barrier(g, NULL));
    for (int k = 2; k >= 0; k--) RCALL(mpg_work_wait(w[k]));
    for (int i = 0; i < 4; i++) {
      RCHECK(a[0][i] == 100 + i, "first message from 1: [%d] = %lld", i, (long long)a[0][i]);
      RCHECK(a[1][i] == 200 + i, "message from 2: [%d] = %lld", i, (long long)a[1][i]);
      RCHECK(a[2][i] == 110 + i, "second message from 1: [%d] = %lld", i, (long long)a[2][i]);
    }
    /* Messages sent before the receive, received in order. */
    RCALL(mpg_barrier(g, NULL));
    for (int k = 0; k < 5; k++) {
      float f[2];
      RCALL(mpg_recv(g, f, 2, MPG_F32, 3, NULL, NULL));
      RCHECK(f[0] == (float)k && f[1] == -(float)k, "message %d from 3: %g %g", k, f[0], f[1]);
    }
    /* Size mismatch: the receive fails and says why. */
    int32_t small[2];
    mpg_status st = mpg_recv(g, small, 2, MPG_I32, 1, NULL, NULL);
    RCHECK(st == MPG_ERR_INVALID, "mismatched recv gave %s", mpg_status_name(st));
    RCHECK(strstr(mpg_last_error(), "bytes") != NULL, "message: %s", mpg_last_error());
  } else if (me == 1 || me == 2) {
    RCALL(mpg_barrier(g, NULL)); /* after rank 0 posted its receives */
    int64_t b[4];
    for (int i = 0; i < 4; i++) b[i] = me * 100 + i;
    RCALL(mpg_send(g, b, 4, MPG_I64, 0, NULL, NULL));
    if (me == 1) {
      for (int i = 0; i < 4; i++) b[i] = 110 + i;
      mpg_work *w = NULL;
      RCALL(mpg_send(g, b, 4, MPG_I64, 0, NULL, &w));
      RCALL(mpg_work_wait(w));
    }
    RCALL(mpg_barrier(g, NULL));
    if (me == 1) {
      int32_t big[3] = {1, 2, 3};
      RCALL(mpg_send(g, big, 3, MPG_I32, 0, NULL, NULL));
    }
  } else {
    RCALL(mpg_barrier(g, NULL));
    for (int k = 0; k < 5; k++) {
      float f[2] = {(float)k, -(float)k};
      RCALL(mpg_send(g, f, 2, MPG_F32, 0, NULL, NULL));
    }
    RCALL(mpg_barrier(g, NULL));
  }
  /* Bad peers are refused up front. */
  char buf[8];
  RCHECK(mpg_send(g, buf, 1, MPG_I32, me, NULL, NULL) == MPG_ERR_INVALID, "send to self");
  RCHECK(mpg_recv(g, buf, 1, MPG_I32, 99, NULL, NULL) == MPG_ERR_INVALID, "recv from 99");
  RCALL(mpg_barrier(g, NULL));
  tl_ctx = NULL;
  RCALL(mpg_ctx_destroy(ctx));
  return MPG_OK;
}

Test(thread_p2p, fifo_per_peer_and_errors) {
  mpg_mesh *mesh = make_mesh("dp=4", NULL);
  EXPECT_RUN_OK(mpg_thread_run(4, 20.0, p2p_main, mesh, NULL));
  mpg_mesh_destroy(mesh);
}

/* Bounded send buffering (back-pressure): with an inbox of 4 messages
 * (MESHPG_THREAD_INBOX_MSGS) or 64 bytes (MESHPG_THREAD_INBOX_BYTES), a
 * send to a full inbox waits until the receiver takes a message; if the
 * receiver takes none within the timeout it fails with MPG_ERR_TIMEOUT. */
typedef struct bp_arg {
  const mpg_mesh *mesh;
  int receive;        /* 0: rank 0 never receives (the timeout case) */
  size_t count;       /* int32 elements per message */
  int nsend;
  double blocked_s;   /* the longest of rank 1's sends */
} bp_arg;

static mpg_status bp_main(const mpg_init_opts *opts, void *arg) {
  bp_arg *a = arg;
  tl_rank = opts->rank;
  mpg_ctx *ctx = NULL;
  RCALL(mpg_ctx_create(a->mesh, opts, &ctx));
  mpg_group *g;
  RCALL(mpg_ctx_group(ctx, "world", &g));
  int32_t buf[32];
  if (opts->rank == 1) {
    for (int k = 0; k < a->nsend; k++) {
      for (size_t i = 0; i < a->count; i++) buf[i] = k * 100 + (int32_t)i;
      double t0 = now_s();
      mpg_status st = mpg_send(g, buf, a->count, MPG_I32, 0, NULL, NULL);
      if (now_s() - t0 > a->blocked_s) a->blocked_s = now_s() - t0;
      if (!a->receive && k == a->nsend - 1) {
        RCHECK(st == MPG_ERR_TIMEOUT, "send to a full inbox gave %s", mpg_status_name(st));
        RCHECK(strstr(mpg_last_error(), "the inbox of position 0 (world rank 0) is full") &&
                   strstr(mpg_last_error(), "limits"),
               "message: %s", mpg_last_error());
        RCHECK(mpg_ctx_status(ctx) == MPG_ERR_TIMEOUT, "the context was not aborted");
      } else {
        RCHECK(st == MPG_OK, "send %d: %s: %s", k, mpg_status_name(st), mpg_last_error());
      }
    }
  } else if (a->receive) {
    sleep_s(0.3); /* rank 1 fills the inbox and blocks meanwhile */
    for (int k = 0; k < a->nsend; k++) {
      RCALL(mpg_recv(g, buf, a->count, MPG_I32, 1, NULL, NULL));
      for (size_t i = 0; i < a->count; i++)
        RCHECK(buf[i] == k * 100 + (int32_t)i, "message %d [%zu] = %d", k, i, buf[i]);
    }
  } else {
    /* Never receives (and makes no call that could time out first). */
    sleep_s(1.0);
  }
  RCALL(mpg_ctx_destroy(ctx));
  return MPG_OK;
}

Test(thread_p2p, full_inbox_blocks_the_sender_until_received) {
  setenv("MESHPG_THREAD_INBOX_MSGS", "4", 1);
  mpg_mesh *mesh = make_mesh("dp=2", NULL);
  bp_arg a = {mesh, 1, 2, 6, 0};
  EXPECT_RUN_OK(mpg_thread_run(2, 20.0, bp_main, &a, NULL));
  cr_expect_gt(a.blocked_s, 0.1, "the longest send took %.3f s: the 5th should wait for room",
               a.blocked_s);
  mpg_mesh_destroy(mesh);
}

Test(thread_p2p, inbox_byte_limit_blocks_but_takes_one_large_message) {
  setenv("MESHPG_THREAD_INBOX_BYTES", "64", 1);
  mpg_mesh *mesh = make_mesh("dp=2", NULL);
  bp_arg a = {mesh, 1, 25, 2, 0}; /* 100-byte messages: one fits an empty inbox */
  EXPECT_RUN_OK(mpg_thread_run(2, 20.0, bp_main, &a, NULL));
  cr_expect_gt(a.blocked_s, 0.1, "the 2nd send took %.3f s", a.blocked_s);
  mpg_mesh_destroy(mesh);
}

Test(thread_p2p, full_inbox_times_out_with_a_precise_error) {
  setenv("MESHPG_THREAD_INBOX_MSGS", "4", 1);
  mpg_mesh *mesh = make_mesh("dp=2", NULL);
  bp_arg a = {mesh, 0, 2, 5, 0};
  EXPECT_RUN_OK(mpg_thread_run(2, 0.5, bp_main, &a, NULL));
  cr_expect_geq(a.blocked_s, 0.4, "the send gave up after %.3f s", a.blocked_s);
  mpg_mesh_destroy(mesh);
}

/* ------------------------------------------------------------------------ */
/* Mismatched calls                                                          */
/* ------------------------------------------------------------------------ */

static mpg_status mismatch_main(const mpg_init_opts *opts, void *arg) {
  const mpg_mesh *mesh = arg;
  tl_rank = opts->rank;
  mpg_ctx *ctx = NULL;
  RCALL(mpg_ctx_create(mesh, opts, &ctx));
  mpg_group *g;
  RCALL(mpg_ctx_group(ctx, "world", &g));
  float in[5] = {1, 2, 3, 4, 5}, out[5];
  size_t count = opts->rank == 2 ? 4 : 5;
  mpg_status st = mpg_all_reduce(g, in, out, count, MPG_F32, MPG_OP_SUM, NULL, NULL);
  RCHECK(st == MPG_ERR_INVALID, "mismatched all_reduce gave %s", mpg_status_name(st));
  RCHECK(strstr(mpg_last_error(), "does not match") && strstr(mpg_last_error(), "count 4") &&
             strstr(mpg_last_error(), "rank 2"),
         "message: %s", mpg_last_error());
  /* A kind mismatch too: the group still works afterwards. */
  if (opts->rank == 0)
    st = mpg_barrier(g, NULL);
  else
    st = mpg_broadcast(g, in, 5, MPG_F32, 0, NULL, NULL);
  RCHECK(st == MPG_ERR_INVALID, "barrier vs broadcast gave %s", mpg_status_name(st));
  RCHECK(strstr(mpg_last_error(), "barrier") && strstr(mpg_last_error(), "broadcast"),
         "message: %s", mpg_last_error());
  /* The issue-order checker sees them too, on every rank (between ranks 0
   * and 1: the barrier against the broadcast). */
  st = mpg_ctx_check_order(ctx);
  RCHECK(st == MPG_ERR_STATE && strstr(mpg_last_error(), "rank 0 issued barrier on") &&
             strstr(mpg_last_error(), "rank 1 issued broadcast(f32, count 5)"),
         "check_order gave %s: %s", mpg_status_name(st), mpg_last_error());
  RCALL(mpg_all_reduce(g, in, out, 5, MPG_F32, MPG_OP_SUM, NULL, NULL));
  RCHECK(out[4] == 5.0f * 4, "sum after the mismatch: %g", out[4]);
  RCALL(mpg_ctx_destroy(ctx));
  return MPG_OK;
}

Test(thread_errors, mismatched_collectives_fail_everywhere) {
  setenv("MESHPG_CHECK_ORDER", "1", 1);
  mpg_mesh *mesh = make_mesh("dp=4", NULL);
  EXPECT_RUN_OK(mpg_thread_run(4, 20.0, mismatch_main, mesh, NULL));
  mpg_mesh_destroy(mesh);
}

/* ------------------------------------------------------------------------ */
/* Timeouts and abort                                                        */
/* ------------------------------------------------------------------------ */

#define TIMEOUT_S 0.5

typedef struct timeout_arg {
  const mpg_mesh *mesh;
  int skipper;
  int async;
  const char *group;
  double elapsed[64];
  mpg_status got[64];
  mpg_status later[64];
  char msg[64][256];
} timeout_arg;

static mpg_status timeout_main(const mpg_init_opts *opts, void *arg) {
  timeout_arg *ta = arg;
  int r = opts->rank;
  tl_rank = r;
  mpg_ctx *ctx = NULL;
  RCALL(mpg_ctx_create(ta->mesh, opts, &ctx));
  mpg_group *g;
  RCALL(mpg_ctx_group(ctx, ta->group, &g));
  double x = 1, y = 0;
  if (r != ta->skipper) {
    double t0 = now_s();
    mpg_status st;
    if (ta->async) {
      mpg_work *w = NULL;
      st = mpg_all_reduce(g, &x, &y, 1, MPG_F64, MPG_OP_SUM, NULL, &w);
      if (!st) st = mpg_work_wait(w);
    } else {
      st = mpg_all_reduce(g, &x, &y, 1, MPG_F64, MPG_OP_SUM, NULL, NULL);
    }
    ta->elapsed[r] = now_s() - t0;
    ta->got[r] = st;
    snprintf(ta->msg[r], sizeof ta->msg[r], "%s", mpg_last_error());
    /* The context is aborted now: later calls fail at once. */
    ta->later[r] = mpg_barrier(g, NULL);
  }
  /* The skipper leaves without joining (destroy never blocks). */
  mpg_status st = mpg_ctx_destroy(ctx);
  (void)st;
  return MPG_OK;
}

static void run_timeout(const char *dims, int world, const char *group, int skipper,
                        int async) {
  /* The skipper breaks the rule the issue-order checker checks: its
   * destroy would enter the check over the world while the others still
   * wait in their world all-reduce (same communicator). */
  setenv("MESHPG_CHECK_ORDER", "0", 1);
  mpg_mesh *mesh = make_mesh(dims, NULL);
  timeout_arg *ta = calloc(1, sizeof *ta);
  ta->mesh = mesh;
  ta->skipper = skipper;
  ta->async = async;
  ta->group = group;
  double t0 = now_s();
  EXPECT_RUN_OK(mpg_thread_run(world, TIMEOUT_S, timeout_main, ta, NULL));
  double total = now_s() - t0;
  int dimset, index, size;
  cr_assert_eq(mpg_mesh_dimset_find(mesh, group, &dimset), MPG_OK);
  cr_assert_eq(mpg_mesh_group_of(mesh, dimset, skipper, &index, NULL, &size), MPG_OK);
  int members[64];
  mpg_mesh_group_members(mesh, dimset, index, members);
  for (int p = 0; p < size; p++) {
    int r = members[p];
    if (r == skipper) continue;
    cr_assert_eq(ta->got[r], MPG_ERR_TIMEOUT, "rank %d got %s (%s)", r,
                 mpg_status_name(ta->got[r]), ta->msg[r]);
    cr_assert(ta->elapsed[r] < tb_bound(TIMEOUT_S + 1.0, world), "rank %d waited %.3f s", r,
              ta->elapsed[r]);
    cr_assert(ta->elapsed[r] > TIMEOUT_S * 0.5, "rank %d gave up after only %.3f s", r,
              ta->elapsed[r]);
    cr_assert(strstr(ta->msg[r], "time") != NULL, "rank %d message: %s", r, ta->msg[r]);
    cr_assert(ta->later[r] == MPG_ERR_ABORTED || ta->later[r] == MPG_ERR_TIMEOUT,
              "rank %d: a collective after the timeout gave %s", r,
              mpg_status_name(ta->later[r]));
  }
  cr_assert(total < tb_bound(TIMEOUT_S + 5.0, world), "the whole run took %.3f s", total);
  free(ta);
  mpg_mesh_destroy(mesh);
}

Test(thread_timeout, skipped_world_all_reduce) {
  run_timeout("dp=2,tp=2", 4, "world", 3, 0);
}

Test(thread_timeout, skipped_async_all_reduce) {
  run_timeout("dp=2,tp=2", 4, "world", 1, 1);
}

Test(thread_timeout, skipped_all_reduce_in_a_subgroup) {
  run_timeout("dp=4,tp=4", 16, "dp", 6, 0);
}

/* mpg_ctx_set_timeout: a context made with a long timeout (start-up) that
 * is then shortened for the steps gives up on a missing peer after the new
 * timeout, on a group created before the change and on one created after;
 * bad values are refused. */
typedef struct settime_arg {
  const mpg_mesh *mesh;
  double elapsed[2][8];
  mpg_status got[2][8], bad[8];
} settime_arg;

static mpg_status settime_main(const mpg_init_opts *opts, void *arg) {
  settime_arg *sa = arg;
  int r = opts->rank;
  mpg_init_opts o = *opts;
  o.backend.timeout_s = 120; /* start-up */
  o.backend.lazy_groups = 1;
  mpg_ctx *ctx = NULL;
  RCALL(mpg_ctx_create(sa->mesh, &o, &ctx));
  mpg_group *dp = NULL, *tp = NULL;
  RCALL(mpg_ctx_group(ctx, "dp", &dp)); /* created under 120 s */
  sa->bad[r] = mpg_ctx_set_timeout(ctx, 0);
  if (sa->bad[r] == MPG_ERR_INVALID) sa->bad[r] = mpg_ctx_set_timeout(ctx, -1);
  if (sa->bad[r] == MPG_ERR_INVALID) sa->bad[r] = mpg_ctx_set_timeout(NULL, 1);
  RCALL(mpg_ctx_set_timeout(ctx, TIMEOUT_S));
  RCALL(mpg_ctx_group(ctx, "tp", &tp)); /* created after the change */
  /* Rank 3 skips one all-reduce on each: its dp peer (rank 1) and its tp
   * peer (rank 2) give up after TIMEOUT_S, not 120 s. */
  mpg_group *gs[2] = {dp, tp};
  for (int k = 0; k < 2; k++) {
    if (r == 3) break;
    double x = 1, y = 0, t0 = now_s();
    sa->got[k][r] = mpg_all_reduce(gs[k], &x, &y, 1, MPG_F64, MPG_OP_SUM, NULL, NULL);
    sa->elapsed[k][r] = now_s() - t0;
    if (sa->got[k][r] != MPG_OK) break; /* the context is aborted now */
  }
  mpg_ctx_destroy(ctx);
  return MPG_OK;
}

Test(thread_timeout, set_timeout_shortens_later_operations) {
  setenv("MESHPG_CHECK_ORDER", "0", 1); /* see run_timeout */
  mpg_mesh *mesh = make_mesh("dp=2,tp=2", NULL);
  settime_arg *sa = calloc(1, sizeof *sa);
  sa->mesh = mesh;
  EXPECT_RUN_OK(mpg_thread_run(4, 120, settime_main, sa, NULL));
  for (int r = 0; r < 4; r++)
    cr_assert_eq(sa->bad[r], MPG_ERR_INVALID, "rank %d: a bad timeout gave %s", r,
                 mpg_status_name(sa->bad[r]));
  /* mesh dp=2,tp=2: rank 3's dp peer is rank 1, its tp peer rank 2.  Rank 1
   * times out on dp; rank 2 passes dp (with rank 0) and times out on tp. */
  cr_assert_eq(sa->got[0][1], MPG_ERR_TIMEOUT, "rank 1 on dp: %s",
               mpg_status_name(sa->got[0][1]));
  cr_assert_eq(sa->got[0][2], MPG_OK, "rank 2 on dp: %s", mpg_status_name(sa->got[0][2]));
  cr_assert_eq(sa->got[1][2], MPG_ERR_TIMEOUT, "rank 2 on tp: %s",
               mpg_status_name(sa->got[1][2]));
  double waited[2] = {sa->elapsed[0][1], sa->elapsed[1][2]};
  for (int k = 0; k < 2; k++) {
    cr_assert(waited[k] < tb_bound(TIMEOUT_S + 1.0, 4), "%s: gave up after %.3f s, not "
              "the new %.1f s", k ? "tp (created after)" : "dp (created before)", waited[k],
              TIMEOUT_S);
    cr_assert(waited[k] > TIMEOUT_S * 0.5, "gave up after only %.3f s", waited[k]);
  }
  free(sa);
  mpg_mesh_destroy(mesh);
}

/* The message of a rank that gave up on its own names the missing rank. */
Test(thread_timeout, message_names_the_missing_rank) {
  setenv("MESHPG_CHECK_ORDER", "0", 1); /* see run_timeout */
  mpg_mesh *mesh = make_mesh("dp=2", NULL);
  timeout_arg *ta = calloc(1, sizeof *ta);
  ta->mesh = mesh;
  ta->skipper = 1;
  ta->group = "world";
  EXPECT_RUN_OK(mpg_thread_run(2, TIMEOUT_S, timeout_main, ta, NULL));
  cr_assert_eq(ta->got[0], MPG_ERR_TIMEOUT);
  cr_assert(strstr(ta->msg[0], "rank 1") != NULL && strstr(ta->msg[0], "all_reduce") != NULL,
            "message: %s", ta->msg[0]);
  free(ta);
  mpg_mesh_destroy(mesh);
}

/* One rank never creates its context: the others give up in time. */
static mpg_status absent_main(const mpg_init_opts *opts, void *arg) {
  timeout_arg *ta = arg;
  if (opts->rank == ta->skipper) return MPG_OK;
  mpg_ctx *ctx = NULL;
  double t0 = now_s();
  ta->got[opts->rank] = mpg_ctx_create(ta->mesh, opts, &ctx);
  ta->elapsed[opts->rank] = now_s() - t0;
  snprintf(ta->msg[opts->rank], sizeof ta->msg[0], "%s", mpg_last_error());
  mpg_ctx_destroy(ctx);
  return MPG_OK;
}

Test(thread_timeout, absent_rank_at_context_creation) {
  mpg_mesh *mesh = make_mesh("dp=2,tp=4", NULL);
  timeout_arg *ta = calloc(1, sizeof *ta);
  ta->mesh = mesh;
  ta->skipper = 5;
  EXPECT_RUN_OK(mpg_thread_run(8, TIMEOUT_S, absent_main, ta, NULL));
  for (int r = 0; r < 8; r++) {
    if (r == 5) continue;
    cr_assert_eq(ta->got[r], MPG_ERR_TIMEOUT, "rank %d: %s (%s)", r,
                 mpg_status_name(ta->got[r]), ta->msg[r]);
    cr_assert(ta->elapsed[r] < tb_bound(TIMEOUT_S + 1.0, 8), "rank %d waited %.3f s", r,
              ta->elapsed[r]);
    cr_assert(strstr(ta->msg[r], "world") != NULL, "rank %d: %s", r, ta->msg[r]);
  }
  free(ta);
  mpg_mesh_destroy(mesh);
}

/* mpg_ctx_abort wakes the waiting peers long before the timeout. */
static mpg_status abort_main(const mpg_init_opts *opts, void *arg) {
  timeout_arg *ta = arg;
  int r = opts->rank;
  mpg_ctx *ctx = NULL;
  tl_rank = r;
  RCALL(mpg_ctx_create(ta->mesh, opts, &ctx));
  mpg_group *g;
  RCALL(mpg_ctx_group(ctx, "world", &g));
  if (r == 0) {
    sleep_s(0.2);
    RCALL(mpg_ctx_abort(ctx));
    float x = 0;
    ta->later[r] = mpg_all_reduce(g, &x, &x, 1, MPG_F32, MPG_OP_SUM, NULL, NULL);
  } else {
    float x = 1, y = 0;
    double t0 = now_s();
    ta->got[r] = mpg_all_reduce(g, &x, &y, 1, MPG_F32, MPG_OP_SUM, NULL, NULL);
    ta->elapsed[r] = now_s() - t0;
    snprintf(ta->msg[r], sizeof ta->msg[0], "%s", mpg_last_error());
  }
  mpg_ctx_destroy(ctx);
  return MPG_OK;
}

Test(thread_timeout, abort_wakes_waiters) {
  mpg_mesh *mesh = make_mesh("dp=4", NULL);
  timeout_arg *ta = calloc(1, sizeof *ta);
  ta->mesh = mesh;
  EXPECT_RUN_OK(mpg_thread_run(4, 10.0, abort_main, ta, NULL));
  cr_assert_eq(ta->later[0], MPG_ERR_ABORTED, "after abort: %s", mpg_status_name(ta->later[0]));
  for (int r = 1; r < 4; r++) {
    cr_assert_eq(ta->got[r], MPG_ERR_ABORTED, "rank %d: %s (%s)", r,
                 mpg_status_name(ta->got[r]), ta->msg[r]);
    /* Woken by the abort at 0.2 s, not by the 10 s timeout: the abort's
     * time plus the promise's 1 s and the scheduler's allowance. */
    cr_assert(ta->elapsed[r] < tb_bound(0.2 + 1.0, 4), "rank %d waited %.3f s (bound %.3f s)",
              r, ta->elapsed[r], tb_bound(0.2 + 1.0, 4));
    cr_assert(strstr(ta->msg[r], "aborted by world rank 0") != NULL, "rank %d: %s", r, ta->msg[r]);
  }
  free(ta);
  mpg_mesh_destroy(mesh);
}
