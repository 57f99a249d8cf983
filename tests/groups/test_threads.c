/* One group used from two threads at once (issue 29), on the thread
 * backend.  The rule (docs/groups.md, "Threads"): a group is used by one
 * thread at a time; a call that finds another call on the same group still
 * running fails with MPG_ERR_STATE, posting nothing, so that the two never
 * run side by side, and the context stays healthy.
 *
 *  - hammer: two threads per rank run all-reduces of distinct values on
 *    one group, retrying a call refused with MPG_ERR_STATE.  Every call
 *    gives MPG_ERR_STATE with the precise message, or MPG_OK with a sum
 *    of exactly one whole contribution of each rank, its own being this
 *    call's; every call of every rank is met exactly once, and the ranks
 *    agree on which calls met.  Which thread's call meets which is not
 *    fixed: two threads cannot issue "in the same order on every rank",
 *    which is why the rule forbids it; the check here is that nothing
 *    is mixed.  The overlap is forced, not hoped for: the other ranks
 *    start only once rank 0 saw a MPG_ERR_STATE, which it must, because
 *    its first claimed call cannot return before they start.
 *  - every_issuing_call_refused: while one thread of rank 0 is blocked in an
 *    all-reduce (rank 1 holds back), the other thread tries every call
 *    that issues on the group (the collectives, async ones included,
 *    send / recv, mpg_p2p_batch, all-to-all(v), the f32-accumulating
 *    variants, the host all-gather of the library's checks): each fails
 *    with MPG_ERR_STATE naming itself, hands out no work, and the context
 *    stays healthy; mpg_work_wait of an earlier handle is allowed meanwhile.
 *
 * Links the static library for the internal calls (groups_internal.h).
 * Ranks are threads, and each rank starts two more: failures go through
 * tests/rank_check.h (RCHECK, RCALL), which the helper threads set up for
 * themselves (tl_rank, tl_ctx). */
#include <criterion/criterion.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "meshpg.h"
#include "groups_internal.h" /* f32acc, host all-gather */
#include "../support/rank_check.h"
#include "run_ranks.h"

#define TIMEOUT_S 60.0 /* the contexts' timeout: far beyond any wait here */
#define HOLD_S 30.0    /* how long a rank waits for the forced overlap */

/* In a rank's helper thread: fail unless the call gave MPG_ERR_STATE with
 * the message of a call on a group in use, naming `fn` and this rank. */
static mpg_status expect_busy(mpg_status st, const char *fn, int rank) {
  const char *msg = mpg_last_error();
  char who[64];
  snprintf(who, sizeof who, "world rank %d)", rank);
  RCHECK(st == MPG_ERR_STATE, "%s on a group in use gave %s (\"%s\"), expected "
         "MPG_ERR_STATE", fn, mpg_status_name(st), msg);
  RCHECK(strncmp(msg, fn, strlen(fn)) == 0 && msg[strlen(fn)] == ' ' &&
         strstr(msg, "on dp[0] (position ") && strstr(msg, who) &&
         strstr(msg, "must not be used from two threads at once") &&
         strstr(msg, "nothing was posted"),
         "%s: unexpected message \"%s\"", fn, msg);
  return MPG_OK;
}

/* Wait (polling) until *flag is set; fail after HOLD_S, or at once when
 * another thread failed (it will not be set then). */
static mpg_status wait_flag(atomic_int *flag, const char *what) {
  double until = now_s() + HOLD_S;
  while (!atomic_load(flag)) {
    RCHECK(now_s() < until && !rank_failed(), "%s did not happen (within %.0f s)", what,
           HOLD_S);
    sleep_s(0.001);
  }
  return MPG_OK;
}

/* Run two threads of fn(arg) on this rank; the first failure of either. */
typedef struct helper {
  pthread_t th;
  mpg_status (*fn)(void *);
  void *arg;
  int rank;
  mpg_ctx *ctx;
  mpg_status st;
} helper;

static void *helper_main(void *p) {
  helper *h = p;
  tl_rank = h->rank;
  tl_ctx = h->ctx;
  h->st = h->fn(h->arg);
  return NULL;
}

static mpg_status run_two(int rank, mpg_ctx *ctx, mpg_status (*fn)(void *), void *a0,
                          void *a1) {
  helper h[2] = {{.fn = fn, .arg = a0, .rank = rank, .ctx = ctx},
                 {.fn = fn, .arg = a1, .rank = rank, .ctx = ctx}};
  int started[2];
  for (int t = 0; t < 2; t++) started[t] = pthread_create(&h[t].th, NULL, helper_main, &h[t]) == 0;
  for (int t = 0; t < 2; t++)
    if (started[t]) pthread_join(h[t].th, NULL);
  RCHECK(started[0] && started[1], "pthread_create failed");
  for (int t = 0; t < 2; t++)
    RCHECK(h[t].st == MPG_OK, "helper thread %d failed (see the first failure)", t);
  return MPG_OK;
}

/* After the threads: one more all-reduce on g is right and the context is
 * still healthy (no MPG_ERR_STATE aborted anything). */
static mpg_status finish(mpg_ctx *ctx, mpg_group *g) {
  int size = mpg_group_size(g);
  int64_t x = mpg_group_position(g) + 1;
  RCALL(mpg_all_reduce(g, &x, &x, 1, MPG_I64, MPG_OP_SUM, NULL, NULL));
  RCHECK(x == (int64_t)size * (size + 1) / 2, "final all-reduce gave %lld",
         (long long)x);
  RCHECK(mpg_ctx_status(ctx) == MPG_OK, "the context is %s after the refused calls",
         mpg_status_name(mpg_ctx_status(ctx)));
  return MPG_OK; /* run_ranks destroys the context */
}

/* ------------------------------------------------------------------------ */
/* hammer: two threads per rank, all-reduces of distinct values             */
/* ------------------------------------------------------------------------ */

enum { H_WORLD = 3, H_ROUNDS = 150, H_COUNT = 8, H_TAGS = 2 * H_ROUNDS };

/* Rank r's call with tag t (1..H_TAGS) sends, as element i, the 16-bit
 * field (t << 3 | i) at bits 16 r: the sum of one call of every rank
 * holds each rank's field whole, so the tags can be read back. */
static int64_t contribution(int rank, int tag, int i) {
  return (int64_t)((uint64_t)((unsigned)tag << 3 | (unsigned)i) << (16 * rank));
}

typedef struct hammer_arg {
  atomic_int overlap_seen; /* rank 0 saw a MPG_ERR_STATE: the others start */
  atomic_int states[H_WORLD];
  atomic_int seen[H_WORLD][H_WORLD][H_TAGS + 1]; /* [rank][peer][tag]: calls met */
  int match[H_WORLD][H_TAGS + 1][H_WORLD]; /* [rank][its tag]: the tag of each rank
                                              in that call's sum */
} hammer_arg;

typedef struct hammer_thread {
  hammer_arg *a;
  mpg_group *g;
  int rank, t;
} hammer_thread;

static mpg_status hammer_one(void *p) {
  hammer_thread *h = p;
  hammer_arg *a = h->a;
  int r = h->rank;
  if (r != 0) {
    mpg_status st = wait_flag(&a->overlap_seen, "rank 0's overlap");
    if (st) return st;
  }
  int64_t send[H_COUNT], recv[H_COUNT];
  for (int k = 0; k < H_ROUNDS; k++) {
    int tag = h->t * H_ROUNDS + k + 1;
    for (int i = 0; i < H_COUNT; i++) send[i] = contribution(r, tag, i);
    mpg_status st;
    for (;;) {
      memset(recv, 0, sizeof recv);
      st = mpg_all_reduce(h->g, send, recv, H_COUNT, MPG_I64, MPG_OP_SUM, NULL, NULL);
      if (st != MPG_ERR_STATE) break;
      if ((st = expect_busy(st, "mpg_all_reduce", r))) return st;
      atomic_fetch_add(&a->states[r], 1);
      if (r == 0) atomic_store(&a->overlap_seen, 1);
      sleep_s(20e-6); /* let the holder's peers run */
    }
    RCHECK(st == MPG_OK, "thread %d, call %d: %s: %s", h->t, k, mpg_status_name(st),
           mpg_last_error());
    int tags[H_WORLD] = {0};
    for (int i = 0; i < H_COUNT; i++)
      for (int q = 0; q < H_WORLD; q++) {
        unsigned f = (unsigned)((uint64_t)recv[i] >> (16 * q)) & 0xffffu;
        int tq = (int)(f >> 3);
        RCHECK((int)(f & 7) == i && tq >= 1 && tq <= H_TAGS && (i == 0 || tq == tags[q]),
               "thread %d, call %d (tag %d): element %d = %#llx: rank %d's part is not "
               "one whole contribution", h->t, k, tag, i, (unsigned long long)recv[i], q);
        RCHECK(q != r || tq == tag, "thread %d, call %d: element %d holds this rank's "
               "tag %d, not this call's %d", h->t, k, i, tq, tag);
        tags[q] = tq;
      }
    RCHECK((uint64_t)recv[H_COUNT - 1] >> (16 * H_WORLD) == 0, "bits above the fields set");
    for (int q = 0; q < H_WORLD; q++) {
      atomic_fetch_add(&a->seen[r][q][tags[q]], 1);
      a->match[r][tag][q] = tags[q];
    }
  }
  return MPG_OK;
}

static mpg_status hammer_main(rr_rank *rk) {
  hammer_arg *a = rk->arg;
  mpg_ctx *ctx = rk->ctx;
  mpg_group *g = NULL;
  RCALL(mpg_ctx_group(ctx, "dp", &g));
  mpg_status st = MPG_OK;
  int r = rk->rank;
  hammer_thread h[2] = {{a, g, r, 0}, {a, g, r, 1}};
  if ((st = run_two(r, ctx, hammer_one, &h[0], &h[1]))) return st;
  /* Both threads of every rank completed H_ROUNDS calls each, matched in
   * one order on every rank: each call of each peer was met exactly once. */
  for (int q = 0; q < H_WORLD; q++)
    for (int t = 1; t <= H_TAGS; t++)
      RCHECK(atomic_load(&a->seen[r][q][t]) == 1, "rank %d's call with tag %d was met %d "
             "times here, expected once", q, t, atomic_load(&a->seen[r][q][t]));
  return finish(ctx, g);
}

Test(threads, hammer_one_group_from_two_threads, .timeout = 300) {
  hammer_arg *a = calloc(1, sizeof *a);
  cr_assert(a);
  double t0 = now_s();
  run_ranks_ok("dp=3", H_WORLD, hammer_main, a, &(rr_opts){.timeout_s = TIMEOUT_S});
  int total = 0;
  for (int r = 0; r < H_WORLD; r++) total += atomic_load(&a->states[r]);
  cr_log_info("hammer: %d x 2 threads x %d all-reduces in %.2f s; MPG_ERR_STATE seen "
              "%d times (rank 0: %d)", H_WORLD, H_ROUNDS, now_s() - t0, total,
              atomic_load(&a->states[0]));
  cr_assert(atomic_load(&a->states[0]) >= 1, "rank 0 never saw MPG_ERR_STATE");
  /* Every rank saw each matched call alike: the call of rank r with tag t
   * met the calls T[q] of the others, and each of those met the same. */
  for (int r = 0; r < H_WORLD; r++)
    for (int t = 1; t <= H_TAGS; t++)
      for (int q = 0; q < H_WORLD; q++)
        cr_assert_eq(memcmp(a->match[q][a->match[r][t][q]], a->match[r][t],
                            sizeof a->match[r][t]), 0,
                     "rank %d's call %d met rank %d's call %d, which saw another sum", r, t,
                     q, a->match[r][t][q]);
  free(a);
}

/* ------------------------------------------------------------------------ */
/* every_call_refused: each issuing call, while another thread holds the    */
/* group; waiting on a handle is allowed meanwhile                          */
/* ------------------------------------------------------------------------ */

typedef struct refuse_arg {
  atomic_int prober;  /* rank 0: a thread took the prober's part */
  atomic_int probed;  /* rank 0 tried everything: rank 1 comes in */
  int calls_tried;
} refuse_arg;

typedef struct refuse_thread {
  refuse_arg *a;
  mpg_ctx *ctx;
  mpg_group *g;
  mpg_work *w0; /* a barrier posted before the threads started */
} refuse_thread;

/* One call with a work handle: refused, and *work left NULL. */
#define TRY_ASYNC(fn, call)                                                   \
  do {                                                                        \
    mpg_work *w_ = (mpg_work *)&marker;                                       \
    mpg_work **work = &w_;                                                    \
    if ((st = expect_busy((call), fn, 0))) return st;                         \
    RCHECK(w_ == NULL, "%s: a refused call handed out work", fn);             \
    n++;                                                                      \
  } while (0)

/* Everything that issues on t->g, each expected to be refused. */
static mpg_status probe_all(refuse_thread *t) {
  mpg_group *g = t->g;
  static int marker;
  mpg_status st;
  int n = 0;
  /* Allowed while the group is in use: waiting posts nothing. */
  RCALL(mpg_work_wait(t->w0));
  t->w0 = NULL;
  float f[8] = {0}, f2[8] = {0};
  uint16_t half[8] = {0}, half2[8] = {0};
  size_t counts[2] = {1, 1}, displs[2] = {0, 1};
  mpg_p2p_op ops[2] = {{MPG_P2P_SEND, 1, f, 1, MPG_F32}, {MPG_P2P_RECV, 1, f2, 1, MPG_F32}};
  TRY_ASYNC("mpg_all_reduce", mpg_all_reduce(g, f, f2, 1, MPG_F32, MPG_OP_SUM, NULL, work));
  TRY_ASYNC("mpg_all_reduce_scaled",
            mpg_all_reduce_scaled(g, f, f2, 1, MPG_F32, 0.5, NULL, work));
  TRY_ASYNC("mpg_broadcast", mpg_broadcast(g, f, 1, MPG_F32, 0, NULL, work));
  TRY_ASYNC("mpg_all_gather", mpg_all_gather(g, f, f2, 1, MPG_F32, NULL, work));
  TRY_ASYNC("mpg_reduce_scatter",
            mpg_reduce_scatter(g, f, f2, 1, MPG_F32, MPG_OP_SUM, NULL, work));
  TRY_ASYNC("mpg_reduce_scatter_scaled",
            mpg_reduce_scatter_scaled(g, f, f2, 1, MPG_F32, 0.5, NULL, work));
  TRY_ASYNC("mpg_barrier", mpg_barrier(g, work));
  TRY_ASYNC("mpg_send", mpg_send(g, f, 1, MPG_F32, 1, NULL, work));
  TRY_ASYNC("mpg_recv", mpg_recv(g, f2, 1, MPG_F32, 1, NULL, work));
  TRY_ASYNC("mpg_p2p_batch", mpg_p2p_batch(g, ops, 2, NULL, work));
  TRY_ASYNC("mpg_all_to_all", mpg_all_to_all(g, f, f2, 1, MPG_F32, NULL, work));
  TRY_ASYNC("mpg_all_to_all_v", mpg_all_to_all_v(g, f, counts, displs, f2, counts, displs,
                                                 MPG_F32, NULL, work));
  TRY_ASYNC("mpg_all_reduce", mpg__all_reduce_f32acc(g, half, half2, 8, MPG_BF16,
                                                     MPG_OP_SUM, 1.0, NULL, work));
  TRY_ASYNC("mpg_reduce_scatter", mpg__reduce_scatter_f32acc(g, half, half2, 4, MPG_BF16,
                                                             MPG_OP_AVG, 1.0, NULL, work));
  /* Blocking forms too, and the library's own host all-gather. */
  if ((st = expect_busy(mpg_all_reduce(g, f, f2, 1, MPG_F32, MPG_OP_SUM, NULL, NULL),
                        "mpg_all_reduce", 0)))
    return st;
  if ((st = expect_busy(mpg_barrier(g, NULL), "mpg_barrier", 0))) return st;
  if ((st = expect_busy(mpg__group_host_all_gather(g, f, f2, 1, MPG_F32),
                        "all_gather (host)", 0)))
    return st;
  n += 3;
  RCHECK(mpg_ctx_status(t->ctx) == MPG_OK, "the context is %s after refused calls",
         mpg_status_name(mpg_ctx_status(t->ctx)));
  t->a->calls_tried = n;
  return MPG_OK;
}

/* Rank 0's two threads: an all-reduce each, retried after MPG_ERR_STATE.
 * The first to claim the group blocks (rank 1 holds back), so the other is
 * refused and takes the prober's part, then lets rank 1 in. */
static mpg_status contend(void *p) {
  refuse_thread *t = p;
  float x = 1.0f, y = 0.0f;
  mpg_status st;
  while ((st = mpg_all_reduce(t->g, &x, &y, 1, MPG_F32, MPG_OP_SUM, NULL, NULL)) ==
         MPG_ERR_STATE) {
    int none = 0;
    if (atomic_compare_exchange_strong(&t->a->prober, &none, 1)) {
      if ((st = probe_all(t))) return st;
      atomic_store(&t->a->probed, 1);
    }
    sleep_s(20e-6);
  }
  RCHECK(st == MPG_OK, "mpg_all_reduce: %s: %s", mpg_status_name(st), mpg_last_error());
  RCHECK(y == 3.0f, "all-reduce gave %g, expected 3", (double)y);
  return MPG_OK;
}

static mpg_status refuse_main(rr_rank *rk) {
  refuse_arg *a = rk->arg;
  mpg_group *g = NULL;
  mpg_work *w0 = NULL;
  RCALL(mpg_ctx_group(rk->ctx, "dp", &g));
  RCALL(mpg_barrier(g, &w0)); /* waited for by rank 0's prober */
  mpg_status st = MPG_OK;
  if (rk->rank == 0) {
    refuse_thread t = {a, rk->ctx, g, w0};
    if ((st = run_two(0, rk->ctx, contend, &t, &t))) return st;
    RCHECK(t.w0 == NULL, "no thread took the prober's part");
  } else {
    RCALL(mpg_work_wait(w0));
    if ((st = wait_flag(&a->probed, "rank 0's probes"))) return st;
    for (int k = 0; k < 2; k++) { /* rank 0's two all-reduces */
      float x = 2.0f, y = 0.0f;
      RCALL(mpg_all_reduce(g, &x, &y, 1, MPG_F32, MPG_OP_SUM, NULL, NULL));
      RCHECK(y == 3.0f, "all-reduce %d gave %g, expected 3", k, (double)y);
    }
  }
  return finish(rk->ctx, g);
}

Test(threads, every_issuing_call_refused_while_another_thread_holds_the_group,
     .timeout = 300) {
  refuse_arg *a = calloc(1, sizeof *a);
  cr_assert(a);
  run_ranks_ok("dp=2", 2, refuse_main, a, &(rr_opts){.timeout_s = TIMEOUT_S});
  cr_assert_eq(a->calls_tried, 17, "%d calls tried", a->calls_tried);
  free(a);
}
