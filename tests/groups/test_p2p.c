/* mpg_p2p_batch on the thread backend, through the public API: a ring of
 * pipeline stages exchanging 64 MiB both ways in one batch (also with an
 * inbox so small that a send-first exchange would wait forever), several
 * operations to one peer matched in order, a mix of dtypes, the work
 * handle, a peer that never arrives (MPG_ERR_TIMEOUT, context aborted),
 * a batch refused as a whole, size-1 groups and n == 0.  The same exchange
 * runs on MPI processes in mpi_worker.c (mode p2p_batch) and on NCCL in
 * test_nccl.c.
 *
 * Ranks are threads: Criterion's asserts must not run on them, so a rank
 * records its first failure (RCHECK, tests/rank_check.h) and returns
 * MPG_ERR_STATE, aborting its context so that its peers stop waiting; the
 * test thread asserts. */
#include <criterion/criterion.h>

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

/* A call that must fail with `want` and a message holding `text` (the
 * status it gave kept in got_ for the message). */
static _Thread_local mpg_status got_;
static int failed_as(mpg_status st, mpg_status want, const char *text) {
  got_ = st;
  return st == want && strstr(mpg_last_error(), text) != NULL;
}
#define REXPECT(expr, want, text)                                                                  \
  RCHECK(failed_as((expr), (want), (text)), "%s gave %s (\"%s\"), expected %s with \"%s\"", #expr, \
         mpg_status_name(got_), mpg_last_error(), mpg_status_name(want), text)

/* Destroys the rank's context now, its status unchecked, and hands
 * run_ranks none to destroy. */
static void leave_ctx(rr_rank *rk) {
  mpg_ctx *ctx = rk->ctx;
  rk->ctx = NULL;
  tl_ctx = NULL;
  (void)mpg_ctx_destroy(ctx);
}

/* run_ranks with the issue-order checker on (check 1) or off (0). */
static void run_order_checked(int check, const char *dims, int n, rr_fn fn, void *arg) {
  setenv("MESHPG_CHECK_ORDER", check ? "1" : "0", 1);
  run_ranks(dims, n, fn, arg);
}

/* The element i of the message that position `src` sends in direction
 * `dir` (0: to the next stage, 1: to the previous; more for extra
 * messages): different for every sender, direction and index. */
static int32_t val(int src, int dir, size_t i) {
  return (int32_t)(((uint32_t)i * 2654435761u) ^ ((uint32_t)src << 24) ^
                   ((uint32_t)dir << 20));
}

static void fill(int32_t *buf, size_t n, int src, int dir) {
  for (size_t i = 0; i < n; i++) buf[i] = val(src, dir, i);
}

/* The index of the first wrong element, or n. */
static size_t first_bad(const int32_t *buf, size_t n, int src, int dir) {
  for (size_t i = 0; i < n; i++)
    if (buf[i] != val(src, dir, i)) return i;
  return n;
}

/* ------------------------------------------------------------------------ */
/* The pipeline ring: every stage sends to the next and to the previous     */
/* stage and receives from both, in one batch                               */
/* ------------------------------------------------------------------------ */

typedef struct ring_arg {
  const char *group;
  size_t count;   /* int32 elements per message */
  int async;      /* through a work handle, polled with mpg_work_test */
  int rounds;
} ring_arg;

static mpg_status ring_main(rr_rank *r) {
  const ring_arg *a = r->arg;
  mpg_group *g;
  RCALL(mpg_ctx_group(r->ctx, a->group, &g));
  int me = mpg_group_position(g), size = mpg_group_size(g);
  int next = (me + 1) % size, prev = (me + size - 1) % size;
  size_t n = a->count;
  int32_t *to_next = malloc(n * 4), *to_prev = malloc(n * 4);
  int32_t *from_prev = malloc(n * 4), *from_next = malloc(n * 4);
  RCHECK(to_next && to_prev && from_prev && from_next, "out of memory");
  fill(to_next, n, me, 0);
  fill(to_prev, n, me, 1);
  for (int round = 0; round < a->rounds; round++) {
    memset(from_prev, 0, n * 4);
    memset(from_next, 0, n * 4);
    /* Sends first in the list: the batch must not let them wait for the
     * receives that follow. */
    mpg_p2p_op ops[4] = {
        {MPG_P2P_SEND, next, to_next, n, MPG_I32},
        {MPG_P2P_SEND, prev, to_prev, n, MPG_I32},
        {MPG_P2P_RECV, prev, from_prev, n, MPG_I32},
        {MPG_P2P_RECV, next, from_next, n, MPG_I32},
    };
    if (a->async) {
      mpg_work *w = NULL;
      RCALL(mpg_p2p_batch(g, ops, 4, NULL, &w));
      RCHECK(w != NULL, "no work handle for a pending batch");
      int done = 0;
      while (!done) RCALL(mpg_work_test(w, &done));
      RCALL(mpg_work_test(w, &done)); /* still done, still owned */
      RCHECK(done == 1, "done went back to 0");
      RCALL(mpg_work_wait(w));
    } else {
      RCALL(mpg_p2p_batch(g, ops, 4, NULL, NULL));
    }
    /* With two stages, next == prev: the two messages from it are told
     * apart by their order (to_next was listed first by the sender). */
    size_t bad = first_bad(from_prev, n, prev, 0);
    RCHECK(bad == n, "round %d: from_prev[%zu] = %d, expected %d", round, bad,
           bad < n ? from_prev[bad] : 0, bad < n ? val(prev, 0, bad) : 0);
    bad = first_bad(from_next, n, next, 1);
    RCHECK(bad == n, "round %d: from_next[%zu] = %d, expected %d", round, bad,
           bad < n ? from_next[bad] : 0, bad < n ? val(next, 1, bad) : 0);
  }
  free(to_next);
  free(to_prev);
  free(from_prev);
  free(from_next);
  return MPG_OK;
}

static void run_ring(const char *dims, int world, const char *group, size_t count,
                     int async, int rounds) {
  ring_arg a = {group, count, async, rounds};
  double t0 = now_s();
  run_ranks_ok(dims, world, ring_main, &a, &(rr_opts){.timeout_s = 30.0});
  cr_log_info("ring %s over %s, %zu bytes each way: %.3f s", dims, group, count * 4,
              now_s() - t0);
}

enum { MIB64 = 16 << 20 }; /* int32 elements in 64 MiB */

Test(p2p_batch, ring_64mib_both_ways_in_one_batch, .timeout = 120) {
  run_ring("pp=4", 4, "pp", MIB64, 0, 1);
}

Test(p2p_batch, ring_with_a_work_handle, .timeout = 120) {
  run_ring("pp=4", 4, "pp", 1 << 20, 1, 2); /* 4 MiB each way, twice */
}

/* Two stages: next == prev, two messages each way between the same pair. */
Test(p2p_batch, two_stages_exchange_both_messages, .timeout = 120) {
  run_ring("pp=2", 2, "pp", MIB64, 0, 1);
}

/* An inbox of 4 KiB (an empty inbox still takes one message): a stage that
 * sent both messages before posting its receives would wait forever for
 * room in an inbox already holding the other neighbour's message.  Rings
 * inside sub-groups (pp over pp=3 x tp=2), several rounds. */
Test(p2p_batch, ring_never_waits_on_a_full_inbox, .timeout = 120) {
  setenv("MESHPG_THREAD_INBOX_BYTES", "4096", 1);
  run_ring("pp=3,tp=2", 6, "pp", 64 << 10, 0, 5);
  run_ring("pp=3,tp=2", 6, "pp", 64 << 10, 1, 5);
}

/* ------------------------------------------------------------------------ */
/* Order, dtypes, mixing with mpg_send / mpg_recv                            */
/* ------------------------------------------------------------------------ */

static mpg_status order_main(rr_rank *rk) {
  mpg_group *g;
  RCALL(mpg_ctx_group(rk->ctx, "world", &g));
  int me = mpg_group_position(g), peer = 1 - me;

  /* Three messages each way to the same peer, sends and receives
   * interleaved in the list, of different lengths: matched in order. */
  enum { A = 5, B = 1000, C = 3 };
  int32_t s[3][B], r[3][B];
  const size_t len[3] = {A, B, C};
  for (int k = 0; k < 3; k++) fill(s[k], len[k], me, 10 + k);
  memset(r, 0, sizeof r);
  mpg_p2p_op ops[6] = {
      {MPG_P2P_RECV, peer, r[0], A, MPG_I32}, {MPG_P2P_SEND, peer, s[0], A, MPG_I32},
      {MPG_P2P_SEND, peer, s[1], B, MPG_I32}, {MPG_P2P_RECV, peer, r[1], B, MPG_I32},
      {MPG_P2P_RECV, peer, r[2], C, MPG_I32}, {MPG_P2P_SEND, peer, s[2], C, MPG_I32},
  };
  RCALL(mpg_p2p_batch(g, ops, 6, NULL, NULL));
  for (int k = 0; k < 3; k++) {
    size_t bad = first_bad(r[k], len[k], peer, 10 + k);
    RCHECK(bad == len[k], "message %d from %d: [%zu] = %d", k, peer, bad, r[k][bad]);
  }

  /* A mix of dtypes in one batch; each message bit-exact. */
  float f32s[4] = {1.5f, -2.25f, 3e-8f, (float)me}, f32r[4] = {0};
  double f64s[3] = {1.0 / 3, -1e300, (double)me}, f64r[3] = {0};
  uint16_t f16s[5] = {0x3c00, 0xc000, 0x0001, 0x7bff, (uint16_t)me}, f16r[5] = {0};
  uint16_t bf16s[2] = {0x3f80, (uint16_t)(0x4000 + me)}, bf16r[2] = {0};
  int64_t i64s[2] = {INT64_MIN, (int64_t)me << 40}, i64r[2] = {0};
  int32_t i32s[1] = {-7 * me - 1}, i32r[1] = {0};
  mpg_p2p_op mix[12] = {
      {MPG_P2P_SEND, peer, f32s, 4, MPG_F32},   {MPG_P2P_SEND, peer, f64s, 3, MPG_F64},
      {MPG_P2P_RECV, peer, f32r, 4, MPG_F32},   {MPG_P2P_SEND, peer, f16s, 5, MPG_F16},
      {MPG_P2P_RECV, peer, f64r, 3, MPG_F64},   {MPG_P2P_RECV, peer, f16r, 5, MPG_F16},
      {MPG_P2P_SEND, peer, bf16s, 2, MPG_BF16}, {MPG_P2P_RECV, peer, bf16r, 2, MPG_BF16},
      {MPG_P2P_SEND, peer, i64s, 2, MPG_I64},   {MPG_P2P_RECV, peer, i64r, 2, MPG_I64},
      {MPG_P2P_SEND, peer, i32s, 1, MPG_I32},   {MPG_P2P_RECV, peer, i32r, 1, MPG_I32},
  };
  RCALL(mpg_p2p_batch(g, mix, 12, NULL, NULL));
  float f32w[4] = {1.5f, -2.25f, 3e-8f, (float)peer};
  double f64w[3] = {1.0 / 3, -1e300, (double)peer};
  uint16_t f16w[5] = {0x3c00, 0xc000, 0x0001, 0x7bff, (uint16_t)peer};
  uint16_t bf16w[2] = {0x3f80, (uint16_t)(0x4000 + peer)};
  int64_t i64w[2] = {INT64_MIN, (int64_t)peer << 40};
  RCHECK(memcmp(f32r, f32w, sizeof f32w) == 0, "f32 message differs");
  RCHECK(memcmp(f64r, f64w, sizeof f64w) == 0, "f64 message differs");
  RCHECK(memcmp(f16r, f16w, sizeof f16w) == 0, "f16 message differs");
  RCHECK(memcmp(bf16r, bf16w, sizeof bf16w) == 0, "bf16 message differs");
  RCHECK(memcmp(i64r, i64w, sizeof i64w) == 0, "i64 message differs");
  RCHECK(i32r[0] == -7 * peer - 1, "i32 message: %d", i32r[0]);

  /* Empty messages (NULL buffers of zero elements) match too. */
  int32_t x[8];
  mpg_p2p_op empty[2] = {{MPG_P2P_SEND, peer, NULL, 0, MPG_F64},
                         {MPG_P2P_RECV, peer, NULL, 0, MPG_F64}};
  RCALL(mpg_p2p_batch(g, empty, 2, NULL, NULL));
  fill(x, 8, me, 20);

  /* n == 0: nothing moves, no work handle. */
  mpg_work *w = (mpg_work *)&w;
  RCALL(mpg_p2p_batch(g, NULL, 0, NULL, &w));
  RCHECK(w == NULL, "n == 0 gave a work handle");
  RCALL(mpg_p2p_batch(g, ops, 0, NULL, NULL));

  /* A bad operation anywhere refuses the whole batch before anything is
   * posted: the good send listed first must not reach the peer. */
  int32_t stale[2] = {-1, -1}, fresh[2] = {42, 43}, got[2] = {0, 0};
  mpg_p2p_op bad[2] = {{MPG_P2P_SEND, peer, stale, 2, MPG_I32},
                       {MPG_P2P_RECV, me, got, 2, MPG_I32}};
  REXPECT(mpg_p2p_batch(g, bad, 2, NULL, NULL), MPG_ERR_INVALID, "ops[1] (recv): peer");
  bad[1].peer = peer;
  bad[1].kind = (mpg_p2p_kind)7;
  REXPECT(mpg_p2p_batch(g, bad, 2, NULL, NULL), MPG_ERR_INVALID, "ops[1].kind is 7");
  mpg_p2p_op good[2] = {{MPG_P2P_SEND, peer, fresh, 2, MPG_I32},
                        {MPG_P2P_RECV, peer, got, 2, MPG_I32}};
  RCALL(mpg_p2p_batch(g, good, 2, NULL, NULL));
  RCHECK(got[0] == 42 && got[1] == 43, "received %d %d: the refused batch posted its send",
         got[0], got[1]);
  RCHECK(mpg_ctx_status(rk->ctx) == MPG_OK, "an argument error aborted the context");

  /* A size-1 group has no peer at all; n == 0 is still fine there. */
  mpg_group *one;
  RCALL(mpg_ctx_group(rk->ctx, "tp", &one));
  RCHECK(mpg_group_size(one) == 1, "tp has %d members", mpg_group_size(one));
  mpg_p2p_op self = {MPG_P2P_SEND, 0, x, 1, MPG_I32};
  REXPECT(mpg_p2p_batch(one, &self, 1, NULL, NULL), MPG_ERR_INVALID,
          "is not another member (positions 0..0, this rank is 0)");
  RCALL(mpg_p2p_batch(one, NULL, 0, NULL, NULL));

  RCALL(mpg_barrier(g, NULL));
  return MPG_OK;
}

Test(p2p_batch, order_per_peer_dtypes_and_refusal) { run_ranks("dp=2,tp=1", 2, order_main, NULL); }

/* A batch on one side, plain mpg_send / mpg_recv on the other.  The
 * issue-order checker counts each batch as a call of the whole group, so
 * it is off here (MESHPG_CHECK_ORDER=0): mixing is legal for the backends,
 * not for the checker. */
static mpg_status mixed_main(rr_rank *r) {
  mpg_group *g;
  RCALL(mpg_ctx_group(r->ctx, "world", &g));
  int me = mpg_group_position(g), peer = 1 - me;
  int32_t x[8], y[8] = {0};
  fill(x, 8, me, 20);
  if (me == 0) {
    mpg_p2p_op o[3] = {{MPG_P2P_SEND, 1, x, 8, MPG_I32},
                       {MPG_P2P_RECV, 1, NULL, 0, MPG_F64},
                       {MPG_P2P_RECV, 1, y, 8, MPG_I32}};
    mpg_work *w = NULL;
    RCALL(mpg_p2p_batch(g, o, 3, NULL, &w));
    RCALL(mpg_work_wait(w));
  } else {
    mpg_work *w = NULL;
    RCALL(mpg_recv(g, y, 8, MPG_I32, 0, NULL, &w));
    RCALL(mpg_send(g, NULL, 0, MPG_F64, 0, NULL, NULL));
    RCALL(mpg_send(g, x, 8, MPG_I32, 0, NULL, NULL));
    RCALL(mpg_work_wait(w));
  }
  RCHECK(first_bad(y, 8, peer, 20) == 8, "mixed exchange: y[0] = %d", y[0]);
  return MPG_OK;
}

Test(p2p_batch, a_batch_matches_plain_send_and_recv) {
  run_order_checked(0, "dp=2", 2, mixed_main, NULL);
}

/* A chain (not a ring) of three stages where one step involves only the
 * first two: the idle stage passes n == 0, which the issue-order checker
 * counts like the others' batches, so the check passes. */
static mpg_status chain_main(rr_rank *r) {
  mpg_group *g;
  RCALL(mpg_ctx_group(r->ctx, "pp", &g));
  int me = mpg_group_position(g);
  int32_t buf[16];
  fill(buf, 16, me, 30);
  mpg_p2p_op op = {me == 0 ? MPG_P2P_SEND : MPG_P2P_RECV, 1 - me, buf, 16, MPG_I32};
  RCALL(mpg_p2p_batch(g, &op, me < 2 ? 1 : 0, NULL, NULL));
  if (me == 1) RCHECK(first_bad(buf, 16, 0, 30) == 16, "stage 1 got buf[0] = %d", buf[0]);
  RCALL(mpg_ctx_check_order(r->ctx));
  return MPG_OK;
}

Test(p2p_batch, an_idle_stage_passes_n_zero_and_the_order_check) {
  run_order_checked(1, "pp=3", 3, chain_main, NULL);
}

/* ------------------------------------------------------------------------ */
/* A peer that never arrives                                                 */
/* ------------------------------------------------------------------------ */

typedef struct absent_arg {
  int async;
  mpg_status got, later;
  double elapsed;
  char msg[1024];
} absent_arg;

static mpg_status absent_main(rr_rank *rk) {
  absent_arg *a = rk->arg;
  mpg_group *g;
  RCALL(mpg_ctx_group(rk->ctx, "pp", &g));
  mpg_status st = MPG_OK;
  if (mpg_group_position(g) == 0) {
    int32_t s[4] = {1, 2, 3, 4}, r[4];
    mpg_p2p_op ops[2] = {{MPG_P2P_SEND, 1, s, 4, MPG_I32}, {MPG_P2P_RECV, 1, r, 4, MPG_I32}};
    double t0 = now_s();
    if (a->async) {
      mpg_work *w = NULL;
      st = mpg_p2p_batch(g, ops, 2, NULL, &w);
      if (!st) st = mpg_work_wait(w);
    } else {
      st = mpg_p2p_batch(g, ops, 2, NULL, NULL);
    }
    a->elapsed = now_s() - t0;
    a->got = st;
    snprintf(a->msg, sizeof a->msg, "%s", mpg_last_error());
    a->later = mpg_ctx_status(rk->ctx);
    /* The context is aborted: a later batch fails at once. */
    st = mpg_p2p_batch(g, ops, 2, NULL, NULL);
    RCHECK(st == MPG_ERR_ABORTED, "a batch after the timeout gave %s", mpg_status_name(st));
  } else {
    sleep_s(TIMEOUT_S * 3); /* never posts anything */
  }
  leave_ctx(rk);
  return MPG_OK;
}

static void run_absent(int async) {
  absent_arg *a = calloc(1, sizeof *a);
  a->async = async;
  run_ranks_ok("pp=2", 2, absent_main, a, &(rr_opts){.timeout_s = TIMEOUT_S});
  cr_assert_eq(a->got, MPG_ERR_TIMEOUT, "got %s: %s", mpg_status_name(a->got), a->msg);
  cr_assert(a->elapsed > TIMEOUT_S * 0.5 && a->elapsed < tb_bound(TIMEOUT_S + 1.0, 2),
            "gave up after %.3f s", a->elapsed);
  cr_assert(strstr(a->msg, "mpg_") && strstr(a->msg, " on pp[0] (position 0 of 2, world rank 0)") &&
                strstr(a->msg, "no message from position 1"),
            "message: %s", a->msg);
  cr_assert_eq(a->later, MPG_ERR_TIMEOUT, "context status %s", mpg_status_name(a->later));
  free(a);
}

Test(p2p_batch, absent_peer_times_out_and_aborts) { run_absent(0); }

Test(p2p_batch, absent_peer_times_out_through_the_work_handle) { run_absent(1); }

/* A post that fails after others were posted: with an inbox of one
 * message already full, the batch's receive is posted, then its send waits
 * for room and times out.  The batch fails with that timeout (the context
 * aborted) and the posted receive is released, not left behind. */
typedef struct midway_arg {
  mpg_status got;
  char msg[1024];
  mpg_status ctx_status;
} midway_arg;

static mpg_status midway_main(rr_rank *rk) {
  midway_arg *a = rk->arg;
  mpg_group *g;
  RCALL(mpg_ctx_group(rk->ctx, "pp", &g));
  if (mpg_group_position(g) == 0) {
    int32_t first[2] = {1, 2}, s[2] = {3, 4}, r[2];
    RCALL(mpg_send(g, first, 2, MPG_I32, 1, NULL, NULL)); /* fills the inbox */
    mpg_p2p_op ops[2] = {{MPG_P2P_SEND, 1, s, 2, MPG_I32}, {MPG_P2P_RECV, 1, r, 2, MPG_I32}};
    a->got = mpg_p2p_batch(g, ops, 2, NULL, NULL);
    snprintf(a->msg, sizeof a->msg, "%s", mpg_last_error());
    a->ctx_status = mpg_ctx_status(rk->ctx);
  } else {
    sleep_s(TIMEOUT_S * 3); /* never receives */
  }
  leave_ctx(rk);
  return MPG_OK;
}

Test(p2p_batch, failed_post_midway_releases_what_was_posted) {
  setenv("MESHPG_THREAD_INBOX_MSGS", "1", 1);
  midway_arg *a = calloc(1, sizeof *a);
  run_ranks_ok("pp=2", 2, midway_main, a, &(rr_opts){.timeout_s = TIMEOUT_S});
  cr_assert_eq(a->got, MPG_ERR_TIMEOUT, "got %s: %s", mpg_status_name(a->got), a->msg);
  cr_assert(strstr(a->msg, "mpg_p2p_batch") && strstr(a->msg, "(world rank 1) is full"), "message: %s",
            a->msg);
  cr_assert_eq(a->ctx_status, MPG_ERR_TIMEOUT, "context status %s",
               mpg_status_name(a->ctx_status));
  free(a);
}
