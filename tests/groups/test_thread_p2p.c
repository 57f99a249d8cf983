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
#include "run_ranks.h"
#include "../support/time_bound.h"

/* The collective timeout of the tests where a peer never arrives. */
#define TIMEOUT_S 0.5

/* ------------------------------------------------------------------------ */
/* Point to point                                                            */
/* ------------------------------------------------------------------------ */

/* run_ranks with the issue-order checker on (check 1) or off (0). */
static void run_order_checked(int check, const char *dims, int n, rr_fn fn, void *arg) {
  setenv("MESHPG_CHECK_ORDER", check ? "1" : "0", 1);
  run_ranks(dims, n, fn, arg);
}

static mpg_status p2p_main(rr_rank *r) {
  mpg_group *g;
  RCALL(mpg_ctx_group(r->ctx, "world", &g));
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
  return MPG_OK;
}

Test(thread_p2p, fifo_per_peer_and_errors) { run_ranks("dp=4", 4, p2p_main, NULL); }

/* Bounded send buffering (back-pressure): with an inbox of 4 messages
 * (MESHPG_THREAD_INBOX_MSGS) or 64 bytes (MESHPG_THREAD_INBOX_BYTES), a
 * send to a full inbox waits until the receiver takes a message; if the
 * receiver takes none within the timeout it fails with MPG_ERR_TIMEOUT. */
typedef struct bp_arg {
  int receive;        /* 0: rank 0 never receives (the timeout case) */
  size_t count;       /* int32 elements per message */
  int nsend;
  double blocked_s;   /* the longest of rank 1's sends */
} bp_arg;

static mpg_status bp_main(rr_rank *r) {
  bp_arg *a = r->arg;
  mpg_group *g;
  RCALL(mpg_ctx_group(r->ctx, "world", &g));
  int32_t buf[32];
  if (r->rank == 1) {
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
        RCHECK(mpg_ctx_status(r->ctx) == MPG_ERR_TIMEOUT, "the context was not aborted");
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
  return MPG_OK;
}

Test(thread_p2p, full_inbox_blocks_the_sender_until_received) {
  setenv("MESHPG_THREAD_INBOX_MSGS", "4", 1);
  bp_arg a = {1, 2, 6, 0};
  run_ranks("dp=2", 2, bp_main, &a);
  cr_expect_gt(a.blocked_s, 0.1, "the longest send took %.3f s: the 5th should wait for room",
               a.blocked_s);
}

Test(thread_p2p, inbox_byte_limit_blocks_but_takes_one_large_message) {
  setenv("MESHPG_THREAD_INBOX_BYTES", "64", 1);
  bp_arg a = {1, 25, 2, 0}; /* 100-byte messages: one fits an empty inbox */
  run_ranks("dp=2", 2, bp_main, &a);
  cr_expect_gt(a.blocked_s, 0.1, "the 2nd send took %.3f s", a.blocked_s);
}

Test(thread_p2p, full_inbox_times_out_with_a_precise_error) {
  setenv("MESHPG_THREAD_INBOX_MSGS", "4", 1);
  bp_arg a = {0, 2, 5, 0};
  run_ranks_ok("dp=2", 2, bp_main, &a, &(rr_opts){.timeout_s = 0.5});
  cr_expect_geq(a.blocked_s, 0.4, "the send gave up after %.3f s", a.blocked_s);
}

/* ------------------------------------------------------------------------ */
/* Mismatched calls                                                          */
/* ------------------------------------------------------------------------ */

static mpg_status mismatch_main(rr_rank *r) {
  mpg_group *g;
  RCALL(mpg_ctx_group(r->ctx, "world", &g));
  float in[5] = {1, 2, 3, 4, 5}, out[5];
  size_t count = r->rank == 2 ? 4 : 5;
  mpg_status st = mpg_all_reduce(g, in, out, count, MPG_F32, MPG_OP_SUM, NULL, NULL);
  RCHECK(st == MPG_ERR_INVALID, "mismatched all_reduce gave %s", mpg_status_name(st));
  RCHECK(strstr(mpg_last_error(), "does not match") && strstr(mpg_last_error(), "count 4") &&
             strstr(mpg_last_error(), "rank 2"),
         "message: %s", mpg_last_error());
  /* A kind mismatch too: the group still works afterwards. */
  if (r->rank == 0)
    st = mpg_barrier(g, NULL);
  else
    st = mpg_broadcast(g, in, 5, MPG_F32, 0, NULL, NULL);
  RCHECK(st == MPG_ERR_INVALID, "barrier vs broadcast gave %s", mpg_status_name(st));
  RCHECK(strstr(mpg_last_error(), "barrier") && strstr(mpg_last_error(), "broadcast"),
         "message: %s", mpg_last_error());
  /* The issue-order checker sees them too, on every rank (between ranks 0
   * and 1: the barrier against the broadcast). */
  st = mpg_ctx_check_order(r->ctx);
  RCHECK(st == MPG_ERR_STATE && strstr(mpg_last_error(), "rank 0 issued barrier on") &&
             strstr(mpg_last_error(), "rank 1 issued broadcast(f32, count 5)"),
         "check_order gave %s: %s", mpg_status_name(st), mpg_last_error());
  RCALL(mpg_all_reduce(g, in, out, 5, MPG_F32, MPG_OP_SUM, NULL, NULL));
  RCHECK(out[4] == 5.0f * 4, "sum after the mismatch: %g", out[4]);
  return MPG_OK;
}

Test(thread_errors, mismatched_collectives_fail_everywhere) {
  run_order_checked(1, "dp=4", 4, mismatch_main, NULL);
}

/* ------------------------------------------------------------------------ */
/* Timeouts and abort                                                        */
/* ------------------------------------------------------------------------ */

typedef struct timeout_arg {
  int skipper;
  int async;
  const char *group;
  double elapsed[64];
  mpg_status got[64];
  mpg_status later[64];
  char msg[64][256];
} timeout_arg;

/* The arguments of a timeout run (free them): the rank that skips (-1:
 * none skips), async or not, the group. */
static timeout_arg *new_timeout_arg(int skipper, int async, const char *group) {
  timeout_arg *ta = calloc(1, sizeof *ta);
  cr_assert_not_null(ta);
  ta->skipper = skipper;
  ta->async = async;
  ta->group = group;
  return ta;
}

/* Destroys the rank's context now, its status unchecked, and hands
 * run_ranks none to destroy. */
static void leave_ctx(rr_rank *rk) {
  mpg_ctx *ctx = rk->ctx;
  rk->ctx = NULL;
  tl_ctx = NULL;
  (void)mpg_ctx_destroy(ctx);
}

static mpg_status timeout_main(rr_rank *rk) {
  timeout_arg *ta = rk->arg;
  int r = rk->rank;
  tl_ctx = NULL; /* a failed check does not abort: the peers time out */
  mpg_group *g;
  RCALL(mpg_ctx_group(rk->ctx, ta->group, &g));
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
  leave_ctx(rk);
  return MPG_OK;
}

static void run_timeout(const char *dims, int world, const char *group, int skipper,
                        int async) {
  /* The skipper breaks the rule the issue-order checker checks: its
   * destroy would enter the check over the world while the others still
   * wait in their world all-reduce (same communicator). */
  setenv("MESHPG_CHECK_ORDER", "0", 1);
  mpg_mesh *mesh = make_mesh(dims, NULL);
  timeout_arg *ta = new_timeout_arg(skipper, async, group);
  double t0 = now_s();
  run_ranks_ok(dims, world, timeout_main, ta, &(rr_opts){.timeout_s = TIMEOUT_S});
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
  double elapsed[2][8];
  mpg_status got[2][8], bad[8];
} settime_arg;

/* run_ranks makes the context with lazy groups and a 120 s timeout
 * (start-up). */
static mpg_status settime_main(rr_rank *rk) {
  settime_arg *sa = rk->arg;
  int r = rk->rank;
  mpg_ctx *ctx = rk->ctx;
  tl_ctx = NULL; /* as before run_ranks: a failed check does not abort */
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
  leave_ctx(rk);
  return MPG_OK;
}

Test(thread_timeout, set_timeout_shortens_later_operations) {
  setenv("MESHPG_CHECK_ORDER", "0", 1); /* see run_timeout */
  settime_arg *sa = calloc(1, sizeof *sa);
  run_ranks_ok("dp=2,tp=2", 4, settime_main, sa, &(rr_opts){.timeout_s = 120, .lazy_groups = 1});
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
}

/* The message of a rank that gave up on its own names the missing rank. */
Test(thread_timeout, message_names_the_missing_rank) {
  setenv("MESHPG_CHECK_ORDER", "0", 1); /* see run_timeout */
  timeout_arg *ta = new_timeout_arg(1, 0, "world");
  run_ranks_ok("dp=2", 2, timeout_main, ta, &(rr_opts){.timeout_s = TIMEOUT_S});
  cr_assert_eq(ta->got[0], MPG_ERR_TIMEOUT);
  cr_assert(strstr(ta->msg[0], "rank 1") != NULL && strstr(ta->msg[0], "all_reduce") != NULL,
            "message: %s", ta->msg[0]);
  free(ta);
}

/* One rank never creates its context: the others give up in time. */
static mpg_status absent_main(rr_rank *rk) {
  timeout_arg *ta = rk->arg;
  int r = rk->rank;
  if (r == ta->skipper) return MPG_OK;
  double t0 = now_s();
  ta->got[r] = mpg_ctx_create(rk->mesh, rk->opts, &rk->ctx);
  ta->elapsed[r] = now_s() - t0;
  snprintf(ta->msg[r], sizeof ta->msg[0], "%s", mpg_last_error());
  leave_ctx(rk);
  return MPG_OK;
}

Test(thread_timeout, absent_rank_at_context_creation) {
  timeout_arg *ta = new_timeout_arg(5, 0, NULL);
  run_ranks_ok("dp=2,tp=4", 8, absent_main, ta, &(rr_opts){.timeout_s = TIMEOUT_S, .no_ctx = 1});
  for (int r = 0; r < 8; r++) {
    if (r == 5) continue;
    cr_assert_eq(ta->got[r], MPG_ERR_TIMEOUT, "rank %d: %s (%s)", r,
                 mpg_status_name(ta->got[r]), ta->msg[r]);
    cr_assert(ta->elapsed[r] < tb_bound(TIMEOUT_S + 1.0, 8), "rank %d waited %.3f s", r,
              ta->elapsed[r]);
    cr_assert(strstr(ta->msg[r], "world") != NULL, "rank %d: %s", r, ta->msg[r]);
  }
  free(ta);
}

/* mpg_ctx_abort wakes the waiting peers long before the timeout. */
static mpg_status abort_main(rr_rank *rk) {
  timeout_arg *ta = rk->arg;
  int r = rk->rank;
  mpg_ctx *ctx = rk->ctx;
  tl_ctx = NULL; /* as before run_ranks: a failed check does not abort */
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
  leave_ctx(rk);
  return MPG_OK;
}

Test(thread_timeout, abort_wakes_waiters) {
  timeout_arg *ta = new_timeout_arg(-1, 0, NULL);
  run_ranks_ok("dp=4", 4, abort_main, ta, &(rr_opts){.timeout_s = 10.0});
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
}
