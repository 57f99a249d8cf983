/* mpg_all_to_all and mpg_all_to_all_v on the thread backend, through the
 * public API:
 *  - a property test over random worlds of 1..16 ranks on random meshes of
 *    three dims (pp, dp, tp; sizes 1 included), on every group of the mesh
 *    (each dim, world): random per-pair counts with zeros, blocks laid out
 *    in a random order with random gaps on both sides, every dtype,
 *    blocking and through a work handle, every element checked byte for
 *    byte and every gap left untouched; the issue-order check after each
 *    world;
 *  - refusals before anything is posted (NULL pointers, bad dtype,
 *    overflowing sizes, overlapping buffers, this member's own counts),
 *    which abort nothing; counts that differ between two members
 *    (MPG_ERR_INVALID on the receiver, nothing written); size-1 groups;
 *  - a member that never calls it: the others get MPG_ERR_TIMEOUT naming
 *    it, within tests/support/time_bound.h's bounds, blocking and async;
 *  - the issue-order checker: members that issue an all-to-all of another
 *    dtype are caught, the call named as all_to_all(...) / all_to_all_v(...);
 *  - the groups' shared-memory channel (groups/shm/a2a.c; the threads of
 *    one process always share a host): the property test above runs
 *    through it, and again with MESHPG_SHM=0 through the backend's point to
 *    point, against the same bytes; three all-to-alls in flight on one
 *    group, waited for last first; a member's mpg_ctx_abort reaching the
 *    peers that wait for it in the channel at once.
 * The same exchange runs on MPI processes in mpi_worker.c (mode
 * all_to_all) and on NCCL over the test double in
 * tests/double/test_double_vs_thread.c.
 *
 * Ranks are threads: they record their first failure (RCHECK,
 * tests/rank_check.h) and the test thread asserts. */
#include <criterion/criterion.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "meshpg.h"
#include "../support/rank_check.h"
#include "run_ranks.h"
#include "../support/time_bound.h"
#include "values.h" /* tv_mix64 */

/* A call that must fail with `want` and a message holding `text`. */
#define REXPECT(expr, want, text)                                               \
  do {                                                                          \
    mpg_status st_ = (expr);                                                    \
    RCHECK(st_ == (want) && strstr(mpg_last_error(), (text)),                   \
           "%s gave %s (\"%s\"), expected %s with \"%s\"", #expr,               \
           mpg_status_name(st_), mpg_last_error(), mpg_status_name(want), text); \
  } while (0)

#define MAXG 16     /* members of a group at most */
#define MAXC 24     /* elements per block at most */
#define SENTINEL 0xA5

/* run_ranks with the issue-order checker on (check 1) or off (0). */
static void run_order_checked(int check, const char *dims, int n, rr_fn fn, void *arg) {
  setenv("MESHPG_CHECK_ORDER", check ? "1" : "0", 1);
  run_ranks(dims, n, fn, arg);
}

/* Destroys the rank's context now, its status unchecked, and hands
 * run_ranks none to destroy. */
static void leave_ctx(rr_rank *rk) {
  mpg_ctx *ctx = rk->ctx;
  rk->ctx = NULL;
  tl_ctx = NULL;
  (void)mpg_ctx_destroy(ctx);
}

static uint64_t h4(uint64_t a, uint64_t b, uint64_t c, uint64_t d) {
  return tv_mix64(tv_mix64(tv_mix64(tv_mix64(a) ^ b) ^ c) ^ d);
}

/* ------------------------------------------------------------------------ */
/* One all-to-all, described the same way on every member                   */
/* ------------------------------------------------------------------------ */

/* Case `key` (the same on every member of the group): the count position
 * s sends to position t (equal form: one count for all pairs). */
static size_t pair_count(uint64_t key, int v, int s, int t) {
  if (!v) return (size_t)(tv_mix64(key) % 7); /* 0 .. 6, 0 now and then */
  uint64_t h = h4(key, 1, (uint64_t)s, (uint64_t)t);
  return h % 4 == 0 ? 0 : (size_t)(h >> 8) % (MAXC + 1);
}

/* Byte b of element k of the block s -> t. */
static unsigned char byte_of(uint64_t key, int s, int t, size_t k, size_t b) {
  return (unsigned char)(h4(key, ((uint64_t)s << 32) | (uint64_t)t, k, 2) >> (8 * (b % 8)));
}

/* The layout of one side on member `me` (side 0: send, 1: recv): the
 * blocks in a random order with gaps of 0..2 elements between them.
 * Equal form: block p at p * count, as mpg_all_to_all defines it.
 * Returns the elements spanned. */
static size_t layout(uint64_t key, int v, int side, int me, int n, size_t *counts,
                     size_t *displs) {
  for (int p = 0; p < n; p++)
    counts[p] = side == 0 ? pair_count(key, v, me, p) : pair_count(key, v, p, me);
  if (!v) {
    for (int p = 0; p < n; p++) displs[p] = (size_t)p * counts[0];
    return (size_t)n * counts[0];
  }
  int order[MAXG];
  for (int p = 0; p < n; p++) order[p] = p;
  for (int p = n - 1; p > 0; p--) { /* Fisher-Yates, seeded per member and side */
    int q = (int)(h4(key, 3 + (uint64_t)side, (uint64_t)me, (uint64_t)p) % (uint64_t)(p + 1));
    int x = order[p];
    order[p] = order[q];
    order[q] = x;
  }
  size_t at = 0;
  for (int i = 0; i < n; i++) {
    at += h4(key, 5 + (uint64_t)side, (uint64_t)me, (uint64_t)i) % 3; /* the gap */
    displs[order[i]] = at;
    at += counts[order[i]];
  }
  return at + 1;
}

/* Run case `key` on g (dtype dt, equal or v, blocking or async) and check
 * every byte of recv.  MPG_OK or rank_fail's status. */
/* The settings and per-rank results of the abort, absent-member and
 * issue-order tests (a2a_arg, run_ranks' arg). */
#define TWORLD 8

typedef struct a2a_arg {
  int async, v; /* through a work handle; all_to_all_v */
  int warm;     /* 1: an all-to-all on the group first (its channel made) */
  int skipper;  /* world rank that never calls it */
  mpg_status got[TWORLD], later[TWORLD];
  double elapsed[TWORLD];
  int position[TWORLD]; /* in "dp" */
  char msg[TWORLD][1024];
} a2a_arg;

static mpg_status one_case(mpg_group *g, uint64_t key, mpg_dtype dt, int v, int async) {
  int me = mpg_group_position(g), n = mpg_group_size(g);
  size_t es = mpg_dtype_size(dt);
  size_t sc[MAXG], sd[MAXG], rc[MAXG], rd[MAXG];
  size_t sn = layout(key, v, 0, me, n, sc, sd), rn = layout(key, v, 1, me, n, rc, rd);
  unsigned char *send = malloc(sn * es + 1), *recv = malloc(rn * es + 1);
  RCHECK(send && recv, "out of memory");
  memset(send, 0x5A, sn * es + 1);
  memset(recv, SENTINEL, rn * es + 1);
  for (int t = 0; t < n; t++)
    for (size_t k = 0; k < sc[t]; k++)
      for (size_t b = 0; b < es; b++) send[(sd[t] + k) * es + b] = byte_of(key, me, t, k, b);
  mpg_work *w = NULL;
  mpg_work **wp = async ? &w : NULL;
  mpg_status st = v ? mpg_all_to_all_v(g, send, sc, sd, recv, rc, rd, dt, NULL, wp)
                    : mpg_all_to_all(g, send, recv, sc[0], dt, NULL, wp);
  if (!st && async) {
    int done = 0;
    for (int spins = 0; !done && !st; spins++) st = mpg_work_test(w, &done);
    mpg_status st2 = mpg_work_wait(w);
    if (!st) st = st2;
  }
  RCHECK(st == MPG_OK, "%s(%s, %s) on \"%s\" (position %d of %d): %s: %s",
         v ? "all_to_all_v" : "all_to_all", mpg_dtype_name(dt), async ? "async" : "blocking",
         mpg_group_name(g), me, n, mpg_status_name(st), mpg_last_error());
  /* Every element of every block, then everything outside the blocks. */
  unsigned char *mark = calloc(rn * es + 1, 1);
  RCHECK(mark != NULL, "out of memory");
  for (int s = 0; s < n; s++)
    for (size_t k = 0; k < rc[s]; k++)
      for (size_t b = 0; b < es; b++) {
        size_t at = (rd[s] + k) * es + b;
        mark[at] = 1;
        unsigned char want = byte_of(key, s, me, k, b);
        RCHECK(recv[at] == want, "%s(%s) on \"%s\": position %d, element %zu from position "
               "%d, byte %zu: 0x%02x, expected 0x%02x", v ? "all_to_all_v" : "all_to_all",
               mpg_dtype_name(dt), mpg_group_name(g), me, k, s, b, recv[at], want);
      }
  for (size_t at = 0; at < rn * es + 1; at++)
    RCHECK(mark[at] || recv[at] == SENTINEL, "%s(%s) on \"%s\": position %d: byte %zu "
           "outside every block was written (0x%02x)", v ? "all_to_all_v" : "all_to_all",
           mpg_dtype_name(dt), mpg_group_name(g), me, at, recv[at]);
  free(mark);
  free(send);
  free(recv);
  return MPG_OK;
}

/* ------------------------------------------------------------------------ */
/* The property test                                                         */
/* ------------------------------------------------------------------------ */

typedef struct prop_arg {
  uint64_t seed;
  int cases; /* all-to-alls per group */
} prop_arg;

static mpg_status prop_main(rr_rank *r) {
  const prop_arg *a = r->arg;
  mpg_status st = MPG_OK;
  int nsets = mpg_mesh_num_dimsets(r->mesh);
  for (int s = 0; s < nsets; s++) {
    mpg_group *g = NULL;
    RCALL(mpg_ctx_group_at(r->ctx, s, &g));
    int index = mpg_group_index(g);
    for (int c = 0; c < a->cases; c++) {
      /* The same key on every member of this group; other groups of the
       * set get others. */
      uint64_t key = h4(a->seed, (uint64_t)s, (uint64_t)index, (uint64_t)c);
      mpg_dtype dt = (mpg_dtype)(c % MPG_DTYPE_COUNT);
      /* Every 12 cases: each dtype in both forms, half of them through a
       * work handle; the next 12 swap blocking and async. */
      int v = (c / MPG_DTYPE_COUNT) % 2, async = (c / (2 * MPG_DTYPE_COUNT) + c) % 2;
      if ((st = one_case(g, key, dt, v, async))) return st;
    }
  }
  RCALL(mpg_ctx_check_order(r->ctx)); /* recorded alike on every member */
  RCHECK(mpg_ctx_status(r->ctx) == MPG_OK, "context status %s",
         mpg_status_name(mpg_ctx_status(r->ctx)));
  return MPG_OK;
}

/* The divisor of n picked by h, the largest one only when it is the
 * only other choice than 1 (so that meshes get several dims > 1). */
static int pick_divisor(int n, uint64_t h) {
  int divs[16], nd = 0;
  for (int d = 1; d <= n; d++)
    if (n % d == 0) divs[nd++] = d;
  if (nd > 2) nd--;
  return divs[h % (uint64_t)nd];
}

/* Random meshes pp=a,dp=b,tp=c of random world sizes (world 1 and 16
 * always among them); 24 all-to-alls per group up to world 8, 12 above
 * (16 threads on a small machine are slow to schedule). */
Test(all_to_all, random_meshes_groups_counts_dtypes, .timeout = 300) {
  setenv("MESHPG_CHECK_ORDER", "1", 1);
  const int runs = 10;
  for (int r = 0; r < runs; r++) {
    uint64_t seed = tv_mix64(0xa2a0000u + (uint64_t)r);
    int world = r == 0 ? 1 : r == 1 ? 16 : 1 + (int)(seed % 16);
    int pp = pick_divisor(world, seed >> 8), rest = world / pp;
    int dp = pick_divisor(rest, seed >> 16), tp = rest / dp;
    char dims[64];
    snprintf(dims, sizeof dims, "pp=%d,dp=%d,tp=%d", pp, dp, tp);
    prop_arg a = {seed, world > 8 ? 2 * MPG_DTYPE_COUNT : 4 * MPG_DTYPE_COUNT};
    double t0 = now_s();
    run_ranks_ok(dims, world, prop_main, &a, &(rr_opts){.timeout_s = 30.0});
    cr_log_info("%s (world %d): %d all-to-alls per group, %.3f s", dims, world, a.cases,
                now_s() - t0);
  }
}

/* MESHPG_SHM=0: the thread backend's own point to point instead of the
 * groups' shared-memory channels (groups/shm/a2a.c), checked against the
 * same bytes: the two paths agree byte for byte. */
Test(all_to_all, random_meshes_without_shared_memory, .timeout = 300) {
  setenv("MESHPG_CHECK_ORDER", "1", 1);
  setenv("MESHPG_SHM", "0", 1);
  for (int r = 0; r < 4; r++) {
    uint64_t seed = tv_mix64(0xa2a0000u + (uint64_t)r);
    int world = r == 0 ? 2 : 2 + (int)(seed % 7);
    int dp = pick_divisor(world, seed >> 16), tp = world / dp;
    char dims[64];
    snprintf(dims, sizeof dims, "pp=1,dp=%d,tp=%d", dp, tp);
    prop_arg a = {seed, 2 * MPG_DTYPE_COUNT};
    run_ranks_ok(dims, world, prop_main, &a, &(rr_opts){.timeout_s = 30.0});
  }
  unsetenv("MESHPG_SHM");
}

/* ------------------------------------------------------------------------ */
/* Several in flight; an abort reaches the channel                           */
/* ------------------------------------------------------------------------ */

#define INFLIGHT 3
#define PER 300 /* elements per block: 4 members x 300 x 4 bytes */

/* Three all-to-alls through work handles on one group before any is
 * waited for, then waited for last first: each post completes the one
 * before it as far as this member's part goes (the channel holds one in
 * flight), and every block arrives. */
static mpg_status inflight_main(rr_rank *r) {
  mpg_group *g;
  RCALL(mpg_ctx_group(r->ctx, "dp", &g));
  int me = mpg_group_position(g), n = mpg_group_size(g);
  float *send[INFLIGHT], *recv[INFLIGHT];
  mpg_work *w[INFLIGHT];
  for (int i = 0; i < INFLIGHT; i++) {
    send[i] = malloc(sizeof(float) * PER * (size_t)n);
    recv[i] = calloc((size_t)PER * (size_t)n, sizeof(float));
    RCHECK(send[i] && recv[i], "out of memory");
    for (int j = 0; j < n; j++)
      for (int k = 0; k < PER; k++)
        send[i][j * PER + k] = (float)(i * 100000 + me * 1000 + j * 100 + k % 97);
  }
  RCALL(mpg_all_to_all(g, send[0], recv[0], PER, MPG_F32, NULL, NULL)); /* the channel */
  for (int i = 0; i < INFLIGHT; i++)
    RCALL(mpg_all_to_all(g, send[i], recv[i], PER, MPG_F32, NULL, &w[i]));
  for (int i = INFLIGHT - 1; i >= 0; i--) RCALL(mpg_work_wait(w[i]));
  for (int i = 0; i < INFLIGHT; i++) {
    for (int s = 0; s < n; s++)
      for (int k = 0; k < PER; k++) {
        float want = (float)(i * 100000 + s * 1000 + me * 100 + k % 97);
        RCHECK(recv[i][s * PER + k] == want, "all-to-all %d: element %d from position %d is "
               "%g, expected %g", i, k, s, recv[i][s * PER + k], want);
      }
    free(send[i]);
    free(recv[i]);
  }
  RCALL(mpg_ctx_check_order(r->ctx));
  return MPG_OK;
}

Test(all_to_all, three_in_flight_waited_last_first) {
  run_order_checked(1, "dp=4", 4, inflight_main, NULL);
}

/* After one all-to-all, rank 0 aborts its context (a watchdog would)
 * instead of issuing the second; the others, waiting for it in the
 * channel, return MPG_ERR_ABORTED at once naming it, long before the
 * timeout. */
static mpg_status abort_main(rr_rank *rk) {
  a2a_arg *a = rk->arg;
  mpg_group *g;
  RCALL(mpg_ctx_group(rk->ctx, "dp", &g));
  int32_t s[16], r[16];
  for (int i = 0; i < 16; i++) s[i] = i;
  RCALL(mpg_all_to_all(g, s, r, 4, MPG_I32, NULL, NULL));
  int me = rk->rank;
  double t0 = now_s();
  if (me == 0) {
    sleep_s(0.3); /* the others wait in the channel by then */
    a->got[0] = mpg_ctx_abort(rk->ctx);
  } else {
    a->got[me] = mpg_all_to_all(g, s, r, 4, MPG_I32, NULL, NULL);
    snprintf(a->msg[me], sizeof a->msg[me], "%s", mpg_last_error());
  }
  a->elapsed[me] = now_s() - t0;
  leave_ctx(rk);
  return MPG_OK;
}

Test(all_to_all, an_abort_reaches_the_peers_in_the_channel, .timeout = 60) {
  setenv("MESHPG_CHECK_ORDER", "0", 1); /* rank 0 skips a call, by design */
  a2a_arg *a = calloc(1, sizeof *a);
  run_ranks("dp=4", 4, abort_main, a);
  cr_assert_eq(a->got[0], MPG_OK, "mpg_ctx_abort: %s", mpg_status_name(a->got[0]));
  for (int r = 1; r < 4; r++) {
    cr_assert_eq(a->got[r], MPG_ERR_ABORTED, "rank %d got %s: %s", r,
                 mpg_status_name(a->got[r]), a->msg[r]);
    cr_assert(strstr(a->msg[r], "aborted by position 0 (world rank 0)"), "rank %d: %s", r,
              a->msg[r]);
    cr_assert(a->elapsed[r] < tb_bound(2.0, 4), "rank %d waited %.3f s (timeout 20 s)", r,
              a->elapsed[r]);
  }
  free(a);
}

/* ------------------------------------------------------------------------ */
/* Refusals, mismatched counts, size-1 groups                                */
/* ------------------------------------------------------------------------ */

static mpg_status args_main(rr_rank *rk) {
  mpg_group *g;
  RCALL(mpg_ctx_group(rk->ctx, "dp", &g));
  mpg_status st = MPG_OK;
  int me = mpg_group_position(g), peer = 1 - me;
  float s[8] = {1, 2, 3, 4, 5, 6, 7, 8}, r[8];
  size_t c2[2] = {2, 2}, d2[2] = {0, 2};

  /* Refused before anything is posted (every one on both members; none
   * is collective). */
  REXPECT(mpg_all_to_all(NULL, s, r, 2, MPG_F32, NULL, NULL), MPG_ERR_INVALID,
          "mpg_all_to_all: group is NULL");
  REXPECT(mpg_all_to_all_v(NULL, s, c2, d2, r, c2, d2, MPG_F32, NULL, NULL), MPG_ERR_INVALID,
          "mpg_all_to_all_v: group is NULL");
  REXPECT(mpg_all_to_all(g, s, r, 2, (mpg_dtype)6, NULL, NULL), MPG_ERR_INVALID,
          "unknown dtype 6");
  REXPECT(mpg_all_to_all_v(g, s, c2, d2, r, c2, d2, (mpg_dtype)-3, NULL, NULL),
          MPG_ERR_INVALID, "unknown dtype -3");
  REXPECT(mpg_all_to_all(g, NULL, r, 2, MPG_F32, NULL, NULL), MPG_ERR_INVALID,
          "send buffer is NULL for 4 elements");
  REXPECT(mpg_all_to_all(g, s, NULL, 2, MPG_F32, NULL, NULL), MPG_ERR_INVALID,
          "receive buffer is NULL for 4 elements");
  REXPECT(mpg_all_to_all_v(g, s, NULL, d2, r, c2, d2, MPG_F32, NULL, NULL), MPG_ERR_INVALID,
          "send_counts is NULL");
  REXPECT(mpg_all_to_all_v(g, s, c2, NULL, r, c2, d2, MPG_F32, NULL, NULL), MPG_ERR_INVALID,
          "send_displs is NULL");
  REXPECT(mpg_all_to_all_v(g, s, c2, d2, r, NULL, d2, MPG_F32, NULL, NULL), MPG_ERR_INVALID,
          "recv_counts is NULL");
  REXPECT(mpg_all_to_all_v(g, s, c2, d2, r, c2, NULL, MPG_F32, NULL, NULL), MPG_ERR_INVALID,
          "recv_displs is NULL");
  /* Overflows, as the other collectives' count checks. */
  REXPECT(mpg_all_to_all(g, s, r, SIZE_MAX / 6, MPG_F32, NULL, NULL), MPG_ERR_RANGE,
          "overflows size_t bytes");
  REXPECT(mpg_all_to_all(g, s, r, SIZE_MAX / 8 / 2 + 1, MPG_F64, NULL, NULL), MPG_ERR_RANGE,
          "x 2 members overflows");
  size_t big[2] = {SIZE_MAX / 4, 0}, one[2] = {1, 1}, huge[2] = {0, SIZE_MAX / 2};
  REXPECT(mpg_all_to_all_v(g, s, one, big, r, one, d2, MPG_F32, NULL, NULL), MPG_ERR_RANGE,
          "send_displs[0] + send_counts[0]");
  REXPECT(mpg_all_to_all_v(g, s, one, d2, r, huge, d2, MPG_I32, NULL, NULL), MPG_ERR_RANGE,
          "recv_displs[1] + recv_counts[1]");
  /* Never in place: any overlap of the send and receive spans. */
  REXPECT(mpg_all_to_all(g, s, s, 2, MPG_F32, NULL, NULL), MPG_ERR_INVALID, "never in place");
  REXPECT(mpg_all_to_all(g, s, s + 3, 2, MPG_F32, NULL, NULL), MPG_ERR_INVALID,
          "never in place");
  REXPECT(mpg_all_to_all_v(g, s, c2, d2, s + 3, c2, d2, MPG_F32, NULL, NULL),
          MPG_ERR_INVALID, "never in place");
  /* This member's own pair. */
  size_t own[2] = {2, 2};
  own[me] = 3;
  REXPECT(mpg_all_to_all_v(g, s, c2, d2, r, own, d2, MPG_F32, NULL, NULL), MPG_ERR_INVALID,
          "sends itself 2 elements");
  RCHECK(mpg_ctx_status(rk->ctx) == MPG_OK, "a refused call aborted the context");

  /* Disjoint blocks of one array are fine: send s[0], s[1], receive into
   * s[4] (from position 0) and s[5] (from position 1). */
  size_t c1[2] = {1, 1}, d1[2] = {0, 1}, far[2] = {4, 5};
  s[4] = s[5] = -1;
  RCALL(mpg_all_to_all_v(g, s, c1, d1, s, c1, far, MPG_F32, NULL, NULL));
  RCHECK(s[4] == (float)(me + 1) && s[5] == (float)(me + 1),
         "blocks in one array: s[4] = %g, s[5] = %g", s[4], s[5]);
  /* Zero elements everywhere, NULL buffers: an exchange of nothing. */
  size_t z[2] = {0, 0};
  RCALL(mpg_all_to_all(g, NULL, NULL, 0, MPG_BF16, NULL, NULL));
  mpg_work *w = (mpg_work *)&w;
  RCALL(mpg_all_to_all_v(g, NULL, z, z, NULL, z, z, MPG_I64, NULL, &w));
  RCALL(mpg_work_wait(w));
  /* Checked here: the mismatched equal counts below differ on purpose. */
  RCALL(mpg_ctx_check_order(rk->ctx));

  /* Counts that differ between the two members.  (a) equal form, count 2
   * on position 0 and 3 on position 1: each receives a message of the
   * wrong size; both fail, nothing is written. */
  float big_r[8];
  memset(big_r, SENTINEL, sizeof big_r);
  st = mpg_all_to_all(g, s, big_r, me == 0 ? 2 : 3, MPG_F32, NULL, NULL);
  RCHECK(st == MPG_ERR_INVALID && strstr(mpg_last_error(), "do not match") &&
             strstr(mpg_last_error(), "bytes expected"),
         "mismatched equal counts gave %s: %s", mpg_status_name(st), mpg_last_error());
  unsigned char *bytes = (unsigned char *)big_r;
  for (size_t i = (size_t)(me == 0 ? 2 : 0) * 4; i < (size_t)(me == 0 ? 4 : 3) * 4; i++)
    RCHECK(bytes[i] == SENTINEL, "the block from the mismatched peer was written (byte %zu)",
           i);
  /* (b) v form: position 1 expects 5 elements from position 0, which
   * sends 3 (a short message), then 1 (a long one): position 1 fails
   * with MPG_ERR_INVALID naming both sizes and nothing is written past
   * or into its block; position 0 completes. */
  for (int round = 0; round < 2; round++) {
    size_t sc[2] = {1, 1}, sd[2] = {0, 1}, rc[2] = {1, 1}, rd[2] = {0, 6};
    if (me == 0) sc[1] = 3;
    if (me == 1) rc[0] = round == 0 ? 5 : 1;
    memset(big_r, SENTINEL, sizeof big_r);
    st = mpg_all_to_all_v(g, s, sc, sd, big_r, rc, rd, MPG_F32, NULL, NULL);
    if (me == 0) {
      RCALL(st);
    } else {
      RCHECK(st == MPG_ERR_INVALID && strstr(mpg_last_error(), "mpg_all_to_all_v") &&
                 strstr(mpg_last_error(), "got a message of 12 bytes"),
             "round %d: mismatched counts gave %s: %s", round, mpg_status_name(st),
             mpg_last_error());
      for (size_t i = 0; i < 5 * 4; i++)
        RCHECK(bytes[i] == SENTINEL, "round %d: byte %zu of the block from position 0 was "
               "written", round, i);
    }
  }
  /* Nothing aborted, nothing left over: a correct exchange still works. */
  RCHECK(mpg_ctx_status(rk->ctx) == MPG_OK, "a count mismatch aborted the context (%s)",
         mpg_status_name(mpg_ctx_status(rk->ctx)));
  RCALL(mpg_barrier(g, NULL));
  float a[4] = {(float)me, (float)me + 10, (float)me + 20, (float)me + 30}, b[4] = {0};
  RCALL(mpg_all_to_all(g, a, b, 2, MPG_F32, NULL, NULL));
  RCHECK(b[2 * peer] == (float)peer + (float)(20 * me) && b[2 * me] == a[2 * me],
         "after the mismatch: b = %g %g %g %g", b[0], b[1], b[2], b[3]);

  /* A size-1 group: its one block is copied, no work handle is left. */
  mpg_group *solo;
  RCALL(mpg_ctx_group(rk->ctx, "tp", &solo));
  RCHECK(mpg_group_size(solo) == 1, "tp has %d members", mpg_group_size(solo));
  float x[3] = {7, 8, 9}, y[5] = {0, 0, 0, 0, 0};
  w = (mpg_work *)&w;
  RCALL(mpg_all_to_all(solo, x, y, 3, MPG_F32, NULL, &w));
  RCHECK(w == NULL && y[0] == 7 && y[2] == 9, "size 1: w %p, y = %g %g %g", (void *)w, y[0],
         y[1], y[2]);
  size_t sc1 = 2, sd1 = 1, rc1 = 2, rd1 = 3;
  RCALL(mpg_all_to_all_v(solo, x, &sc1, &sd1, y, &rc1, &rd1, MPG_F32, NULL, NULL));
  RCHECK(y[3] == 8 && y[4] == 9, "size 1, v: y[3..4] = %g %g", y[3], y[4]);
  REXPECT(mpg_all_to_all(solo, x, x, 3, MPG_F32, NULL, NULL), MPG_ERR_INVALID,
          "never in place");

  return MPG_OK;
}

Test(all_to_all, refusals_mismatches_and_size_one) {
  run_order_checked(1, "dp=2,tp=1", 2, args_main, NULL);
}

/* ------------------------------------------------------------------------ */
/* A member that never arrives                                               */
/* ------------------------------------------------------------------------ */

#define TIMEOUT_S 0.5

static mpg_status absent_main(rr_rank *rk) {
  a2a_arg *a = rk->arg;
  mpg_group *g;
  int r = rk->rank;
  RCALL(mpg_ctx_group(rk->ctx, "dp", &g));
  mpg_status st = MPG_OK;
  a->position[r] = mpg_group_position(g);
  int n = mpg_group_size(g);
  int32_t s[4 * TWORLD], rv[4 * TWORLD];
  size_t c[TWORLD], d[TWORLD];
  for (int p = 0; p < n; p++) c[p] = 4, d[p] = 4 * (size_t)p;
  for (int i = 0; i < 4 * n; i++) s[i] = i;
  if (a->warm) RCALL(mpg_all_to_all(g, s, rv, 4, MPG_I32, NULL, NULL));
  if (r != a->skipper) {
    mpg_work *w = NULL;
    mpg_work **wp = a->async ? &w : NULL;
    double t0 = now_s();
    st = a->v ? mpg_all_to_all_v(g, s, c, d, rv, c, d, MPG_I32, NULL, wp)
              : mpg_all_to_all(g, s, rv, 4, MPG_I32, NULL, wp);
    if (!st && a->async) st = mpg_work_wait(w);
    a->elapsed[r] = now_s() - t0;
    a->got[r] = st;
    snprintf(a->msg[r], sizeof a->msg[r], "%s", mpg_last_error());
    a->later[r] = mpg_all_to_all(g, s, rv, 4, MPG_I32, NULL, NULL);
  } else {
    sleep_s(TIMEOUT_S * 3); /* never calls it */
  }
  leave_ctx(rk);
  return MPG_OK;
}

/* Mesh dp=4,tp=2: the skipper's dp group has 4 members, 3 of which wait. */
static void run_absent(int async, int v, int skipper, int warm) {
  setenv("MESHPG_CHECK_ORDER", "0", 1); /* the skipper breaks the order, by design */
  mpg_mesh *mesh = make_dims_mesh("dp=4,tp=2");
  a2a_arg *a = calloc(1, sizeof *a);
  a->async = async;
  a->v = v;
  a->skipper = skipper;
  a->warm = warm;
  run_ranks_ok("dp=4,tp=2", TWORLD, absent_main, a, &(rr_opts){.timeout_s = TIMEOUT_S});
  int dimset, index, size, members[TWORLD];
  cr_assert_eq(mpg_mesh_dimset_find(mesh, "dp", &dimset), MPG_OK);
  cr_assert_eq(mpg_mesh_group_of(mesh, dimset, skipper, &index, NULL, &size), MPG_OK);
  mpg_mesh_group_members(mesh, dimset, index, members);
  char peer[32], rank[32], named[64];
  snprintf(peer, sizeof peer, "peer position %d", a->position[skipper]);
  snprintf(rank, sizeof rank, "rank %d", skipper);
  snprintf(named, sizeof named, "position %d (world rank %d)", a->position[skipper], skipper);
  int own = 0;
  for (int p = 0; p < size; p++) {
    int r = members[p];
    if (r == skipper) continue;
    cr_assert_eq(a->got[r], MPG_ERR_TIMEOUT, "rank %d got %s: %s", r,
                 mpg_status_name(a->got[r]), a->msg[r]);
    cr_assert(a->elapsed[r] > TIMEOUT_S * 0.5 && a->elapsed[r] < tb_bound(TIMEOUT_S + 1.0,
                                                                           TWORLD),
              "rank %d gave up after %.3f s", r, a->elapsed[r]);
    /* The call (the wait, for a work handle, as for every collective) and
     * group, and the missing member: every waiter's message
     * names its receive from it ("peer position P"); the one that timed out itself
     * (the others are woken by its abort) also names its world rank. */
    /* Through shared memory (thread backend: one host), the channel
     * names the missing member on every waiter, "position P (world rank R)";
     * at the group's first all-to-all the counts go round point to point
     * before the channel is made (groups/alltoall.c, first_call), and
     * every waiter's receive from it names it ("peer position P"), the one that
     * timed out itself also its world rank. */
    const char *call = async ? "mpg_work_wait" : v ? "mpg_all_to_all_v" : "mpg_all_to_all";
    cr_assert(strstr(a->msg[r], warm ? call : v ? "mpg_all_to_all_v" : "mpg_all_to_all") &&
                  strstr(a->msg[r], " on dp[") && strstr(a->msg[r], warm ? named : peer),
              "rank %d: message: %s", r, a->msg[r]);
    own += warm ? strstr(a->msg[r], "timed out") && strstr(a->msg[r], named) != NULL
                : strstr(a->msg[r], "no message from position") && strstr(a->msg[r], rank);
    cr_assert(a->later[r] == MPG_ERR_ABORTED || a->later[r] == MPG_ERR_TIMEOUT,
              "rank %d: a call after the timeout gave %s", r, mpg_status_name(a->later[r]));
  }
  cr_assert_geq(own, 1, "no waiter names rank %d as missing", skipper);
  free(a);
  mpg_mesh_destroy(mesh);
}

Test(all_to_all, absent_member_times_out_blocking, .timeout = 60) { run_absent(0, 0, 5, 1); }

Test(all_to_all, absent_member_times_out_v_through_a_work_handle, .timeout = 60) {
  run_absent(1, 1, 2, 1);
}

Test(all_to_all, absent_member_at_the_first_all_to_all_times_out, .timeout = 60) {
  run_absent(0, 1, 3, 0);
}

/* ------------------------------------------------------------------------ */
/* The issue-order checker records all-to-alls as collectives of the group   */
/* ------------------------------------------------------------------------ */

/* The two members exchange 4-byte elements under different dtypes (f32 on
 * position 0, i32 on position 1): the thread backend moves the bytes, the
 * checker finds the difference. */
static mpg_status order_main(rr_rank *rk) {
  a2a_arg *a = rk->arg;
  mpg_group *g;
  RCALL(mpg_ctx_group(rk->ctx, "dp", &g));
  int me = mpg_group_position(g);
  mpg_dtype dt = me == 0 ? MPG_F32 : MPG_I32;
  int32_t s[4] = {1, 2, 3, 4}, r[4];
  size_t c[2] = {2, 2}, d[2] = {0, 2};
  RCALL(mpg_all_to_all(g, s, r, 2, MPG_F32, NULL, NULL)); /* the same on both */
  RCALL(a->v ? mpg_all_to_all_v(g, s, c, d, r, c, d, dt, NULL, NULL)
             : mpg_all_to_all(g, s, r, 2, dt, NULL, NULL));
  a->got[rk->rank] = mpg_ctx_check_order(rk->ctx);
  snprintf(a->msg[rk->rank], sizeof a->msg[0], "%s", mpg_last_error());
  return MPG_OK;
}

static void run_order(int v) {
  setenv("MESHPG_CHECK_ORDER", "1", 1);
  a2a_arg *a = calloc(1, sizeof *a);
  a->v = v;
  run_ranks("dp=2", 2, order_main, a);
  const char *want0 = v ? "all_to_all_v(f32) on \"dp\"" : "all_to_all(f32, count 2) on \"dp\"";
  const char *want1 = v ? "all_to_all_v(i32) on \"dp\"" : "all_to_all(i32, count 2) on \"dp\"";
  for (int r = 0; r < 2; r++) {
    cr_assert_eq(a->got[r], MPG_ERR_STATE, "rank %d: %s: %s", r, mpg_status_name(a->got[r]),
                 a->msg[r]);
    cr_assert(strstr(a->msg[r], "issue order differs") && strstr(a->msg[r], want0) &&
                  strstr(a->msg[r], want1),
              "rank %d: %s", r, a->msg[r]);
  }
  free(a);
}

Test(all_to_all, order_checker_names_a_differing_all_to_all) { run_order(0); }

Test(all_to_all, order_checker_names_a_differing_all_to_all_v) { run_order(1); }
