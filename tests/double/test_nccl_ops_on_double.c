/* The NCCL backend's operations (groups/nccl/ops.c) on the CUDA/NCCL test
 * double, two ranks as threads on devices 0 and 1 sharing a caller-made
 * unique id (issue 35):
 *
 *  - an abort never completes an operation "successfully".  ncclCommAbort
 *    cuts the kernels short and the stream goes on, so the event recorded
 *    after the collective fires although no data moved (the double models
 *    it, tests/double/nccl_double_kernel.c launch_run).  Rank 1 never posts; rank
 *    0's context is aborted by a watchdog thread while rank 0 waits, or
 *    before it waits, or during a sync step before mpg_sync_finish; and a
 *    timeout on group A aborts the context while group B's work, posted
 *    before, is still pending.  Each wait must fail with the abort's reason
 *    (MPG_ERR_ABORTED, or MPG_ERR_TIMEOUT after the timeout), never MPG_OK
 *    on the unreduced data, and the sync's gradients must not be valid;
 *  - the timeout counts from the GPU's arrival at the operation: both
 *    ranks' streams held busy longer than the timeout before an all-reduce
 *    (a host function, as a long backward) still complete it; a missing
 *    peer is still found within the timeout after the held stream reaches
 *    the collective; and a stream that never reaches it ends at the start
 *    limit (4 x the timeout after the post, ops.c).
 * Link: meshpg's objects and the double, like test_double_vs_thread. */
#include <criterion/criterion.h>
#include <criterion/logging.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "meshpg.h"
#include "../support/time_bound.h"
#include "on_double.h"

#define N 4099 /* f32 elements per all-reduce */

/* ------------------------------------------------------------------------ */
/* Two NCCL ranks as threads                                                 */
/* ------------------------------------------------------------------------ */

typedef struct world world;
/* A rank's part of a scenario; records its outcome in w. */
typedef void (*rank_fn)(world *w, int rank, mpg_ctx *ctx);

struct world {
  mpg_mesh *mesh;
  rank_fn fn;
  double hold_s, timeout_s; /* scenario parameters */
  int during;               /* abort_sync_step: abort during mpg_sync_finish;
                               held: poll a work handle with mpg_work_test */
  pthread_barrier_t done;   /* both ranks finished their part */
  mpg_status create[2];
  char create_msg[2][512];
  mpg_status st[2], st2[2]; /* the scenario's results */
  char msg[2][1024], msg2[2][1024];
  double elapsed[2];
  float got[2];             /* recv[0] after the call */
  int valid[2];             /* mpg_sync_grads_valid */
  double longest_test[2];   /* held, polled: the longest mpg_work_test call */
};

static mpg_status rank_main(const mpg_init_opts *o, void *arg) {
  world *w = arg;
  int rank = o->rank;
  mpg_ctx *ctx = NULL;
  w->create[rank] = mpg_ctx_create(w->mesh, o, &ctx);
  if (w->create[rank])
    snprintf(w->create_msg[rank], sizeof w->create_msg[rank], "%s", mpg_last_error());
  else
    w->fn(w, rank, ctx);
  /* The absent rank keeps its context until rank 0 is done with its
   * collectives, so that nothing but the scenario ends them. */
  pthread_barrier_wait(&w->done);
  mpg_ctx_destroy(ctx);
  return MPG_OK;
}

static world *world_run(rank_fn fn, double hold_s, double timeout_s, int during) {
  world *w = calloc(1, sizeof *w);
  cr_assert_not_null(w);
  *w = (world){.fn = fn, .during = during, .hold_s = hold_s, .timeout_s = timeout_s};
  w->mesh = mesh_of("dp=2", 2);
  cr_assert_eq(pthread_barrier_init(&w->done, NULL, 2), 0);
  nccl_thread_run(2, 60, rank_main, w);
  pthread_barrier_destroy(&w->done);
  mpg_mesh_destroy(w->mesh);
  for (int r = 0; r < 2; r++)
    cr_assert_eq(w->create[r], MPG_OK, "rank %d: mpg_ctx_create: %s", r, w->create_msg[r]);
  return w;
}

static void note(world *w, int rank, mpg_status st, double t0) {
  w->st[rank] = st;
  w->elapsed[rank] = now_s() - t0;
  snprintf(w->msg[rank], sizeof w->msg[rank], "%s", st ? mpg_last_error() : "");
}

/* N floats of `v` in device memory of the context. */
static float *dev_floats(mpg_ctx *ctx, float v) {
  void *p = NULL;
  if (mpg_ctx_mem_alloc(ctx, N * sizeof(float), 0, &p)) return NULL;
  float *h = malloc(N * sizeof(float));
  for (int i = 0; i < N; i++) h[i] = v;
  cudaMemcpy(p, h, N * sizeof(float), cudaMemcpyHostToDevice);
  free(h);
  return p;
}

static float first(const float *dev) {
  float x = -1;
  cudaDeviceSynchronize();
  cudaMemcpy(&x, dev, sizeof x, cudaMemcpyDeviceToHost);
  return x;
}

/* A watchdog thread: mpg_ctx_abort after a delay. */
typedef struct {
  mpg_ctx *ctx;
  double after_s;
} watchdog;

static void *watchdog_main(void *p) {
  watchdog *d = p;
  sleep_s(d->after_s);
  mpg_ctx_abort(d->ctx);
  return NULL;
}

/* ------------------------------------------------------------------------ */
/* An abort never completes an operation                                     */
/* ------------------------------------------------------------------------ */

/* Rank 0 all-reduces on dp while rank 1 never posts; a watchdog aborts
 * rank 0's context after 0.2 s, during the wait. */
static void abort_during_wait(world *w, int rank, mpg_ctx *ctx) {
  if (rank == 1) return;
  mpg_group *dp = NULL;
  mpg_ctx_group(ctx, "dp", &dp);
  float *buf = dev_floats(ctx, 1.0f);
  watchdog d = {ctx, 0.2};
  pthread_t t;
  pthread_create(&t, NULL, watchdog_main, &d);
  double t0 = now_s();
  note(w, 0, mpg_all_reduce(dp, buf, buf, N, MPG_F32, MPG_OP_SUM, NULL, NULL), t0);
  pthread_join(t, NULL);
  w->got[0] = first(buf);
  mpg_ctx_mem_free(ctx, buf);
}

Test(abort, watchdog_abort_during_a_wait_fails_it, .timeout = 120) {
  /* Several rounds: the abort may land before or after a poll of the
   * event; no round may return MPG_OK. */
  for (int round = 0; round < 4; round++) {
    world *w = world_run(abort_during_wait, 0, 0, 0);
    cr_expect_eq(w->st[0], MPG_ERR_ABORTED, "round %d: mpg_all_reduce -> %s (recv[0] = %g, "
                 "unreduced: rank 1 never posted): %s", round, mpg_status_name(w->st[0]),
                 (double)w->got[0], w->msg[0]);
    free(w);
  }
}

/* The abort lands while rank 0 holds a work handle and is not waiting;
 * the kernel is cut short and the event fires before the wait. */
static void abort_before_wait(world *w, int rank, mpg_ctx *ctx) {
  if (rank == 1) return;
  mpg_group *dp = NULL;
  mpg_ctx_group(ctx, "dp", &dp);
  float *buf = dev_floats(ctx, 1.0f);
  mpg_work *work = NULL;
  mpg_status st = mpg_all_reduce(dp, buf, buf, N, MPG_F32, MPG_OP_SUM, NULL, &work);
  if (st) {
    note(w, 0, st, now_s());
    return;
  }
  watchdog d = {ctx, 0.1};
  pthread_t t;
  pthread_create(&t, NULL, watchdog_main, &d);
  pthread_join(t, NULL);
  cudaDeviceSynchronize(); /* the kernel has returned, the event fired */
  double t0 = now_s();
  note(w, 0, mpg_work_wait(work), t0);
  w->got[0] = first(buf);
  mpg_ctx_mem_free(ctx, buf);
}

Test(abort, watchdog_abort_before_the_wait_fails_it, .timeout = 60) {
  world *w = world_run(abort_before_wait, 0, 0, 0);
  cr_assert_eq(w->st[0], MPG_ERR_ABORTED, "mpg_work_wait after mpg_ctx_abort -> %s (recv[0] = "
               "%g, unreduced: rank 1 never posted): %s", mpg_status_name(w->st[0]),
               (double)w->got[0], w->msg[0]);
  cr_assert(strstr(w->msg[0], "aborted"), "%s", w->msg[0]);
  free(w);
}

/* A sync step on dp: rank 0 marks every parameter ready (its buckets are
 * posted), rank 1 never begins the step; a watchdog aborts rank 0's
 * context, then mpg_sync_finish must fail and leave the gradients
 * invalid. */
static void abort_sync_step(world *w, int rank, mpg_ctx *ctx) {
  mpg_sync_opts so = MPG_SYNC_OPTS_INIT;
  so.sync.bucket_mb = 0.01;
  so.sync.first_bucket_mb = 0.001;
  mpg_sync *s = NULL;
  int ids[3];
  mpg_status st = mpg_sync_create(ctx, &so, &s);
  for (int p = 0; p < 3 && !st; p++) {
    char name[8];
    snprintf(name, sizeof name, "p%d", p);
    st = mpg_sync_add_param(s, name, 4096, MPG_F32, NULL, &ids[p]);
  }
  if (!st) st = mpg_sync_commit(s); /* collective */
  if (st || rank == 1) {
    if (st) note(w, rank, st, now_s());
    mpg_sync_destroy(s);
    return;
  }
  st = mpg_sync_begin(s, 1, 1, NULL);
  for (int p = 2; p >= 0 && !st; p--) st = mpg_sync_mark_ready(s, ids[p]);
  if (st) {
    note(w, 0, st, now_s());
    mpg_sync_destroy(s);
    return;
  }
  watchdog d = {ctx, 0.1};
  pthread_t t;
  pthread_create(&t, NULL, watchdog_main, &d);
  if (!w->during) pthread_join(t, NULL); /* abort before finish */
  double t0 = now_s();
  note(w, 0, mpg_sync_finish(s), t0);
  if (w->during) pthread_join(t, NULL);
  w->valid[0] = mpg_sync_grads_valid(s);
  mpg_sync_destroy(s);
}

Test(abort, sync_finish_after_an_abort_is_not_valid, .timeout = 60) {
  world *w = world_run(abort_sync_step, 0, 0, 0);
  cr_assert_eq(w->st[1], MPG_OK, "rank 1: %s", w->msg[1]);
  cr_assert_neq(w->st[0], MPG_OK, "mpg_sync_finish after mpg_ctx_abort returned MPG_OK "
                "(grads_valid %d) although rank 1 never began the step", w->valid[0]);
  cr_assert_eq(w->st[0], MPG_ERR_ABORTED, "%s: %s", mpg_status_name(w->st[0]), w->msg[0]);
  cr_assert_eq(w->valid[0], 0, "grads_valid is 1 after an aborted step");
  free(w);
}

Test(abort, sync_finish_during_an_abort_is_not_valid, .timeout = 60) {
  world *w = world_run(abort_sync_step, 0, 0, 1); /* abort during finish */
  cr_assert_eq(w->st[1], MPG_OK, "rank 1: %s", w->msg[1]);
  cr_assert_eq(w->st[0], MPG_ERR_ABORTED, "mpg_sync_finish -> %s (grads_valid %d): %s",
               mpg_status_name(w->st[0]), w->valid[0], w->msg[0]);
  cr_assert_eq(w->valid[0], 0, "grads_valid is 1 after an aborted step");
  free(w);
}

/* Rank 0 posts an all-reduce on "world" (group B, its own stream), then a
 * blocking all-reduce on "dp" (group A) that times out: rank 1 posts
 * neither.  The timeout aborts the context, B's kernel is cut short, and
 * the wait on B must fail with the abort's reason (MPG_ERR_TIMEOUT, as
 * every backend reports a wait on a context aborted after a timeout). */
static void cross_group(world *w, int rank, mpg_ctx *ctx) {
  if (rank == 1) return;
  mpg_group *a = NULL, *b = NULL;
  mpg_ctx_group(ctx, "dp", &a);
  mpg_ctx_group(ctx, "world", &b);
  mpg_ctx_set_timeout(ctx, w->timeout_s);
  cudaStream_t sb;
  cudaStreamCreateWithFlags(&sb, cudaStreamNonBlocking);
  float *bufa = dev_floats(ctx, 1.0f), *bufb = dev_floats(ctx, 1.0f);
  mpg_work *work = NULL;
  mpg_status st = mpg_all_reduce(b, bufb, bufb, N, MPG_F32, MPG_OP_SUM, sb, &work);
  if (st) {
    note(w, 0, st, now_s());
    return;
  }
  double t0 = now_s();
  note(w, 0, mpg_all_reduce(a, bufa, bufa, N, MPG_F32, MPG_OP_SUM, NULL, NULL), t0);
  cudaStreamSynchronize(sb); /* B's kernel was cut short; its event fired */
  st = mpg_work_wait(work);
  w->st2[0] = st;
  snprintf(w->msg2[0], sizeof w->msg2[0], "%s", st ? mpg_last_error() : "");
  w->got[0] = first(bufb);
  cudaStreamDestroy(sb);
  mpg_ctx_mem_free(ctx, bufa);
  mpg_ctx_mem_free(ctx, bufb);
}

Test(abort, timeout_on_one_group_fails_the_work_of_another, .timeout = 60) {
  world *w = world_run(cross_group, 0, 0.3, 0);
  cr_assert_eq(w->st[0], MPG_ERR_TIMEOUT, "group A: %s: %s", mpg_status_name(w->st[0]),
               w->msg[0]);
  cr_assert_neq(w->st2[0], MPG_OK, "group B's wait returned MPG_OK after the context was "
                "aborted by A's timeout (recv[0] = %g, unreduced: rank 1 never posted)",
                (double)w->got[0]);
  cr_assert_eq(w->st2[0], MPG_ERR_TIMEOUT, "group B: %s: %s", mpg_status_name(w->st2[0]),
               w->msg2[0]);
  free(w);
}

/* ------------------------------------------------------------------------ */
/* The timeout starts when the GPU reaches the operation                     */
/* ------------------------------------------------------------------------ */

/* Holds a stream for hold_s seconds, as a long backward would. */
static void CUDART_CB hold_stream(void *arg) { sleep_s(*(const double *)arg); }

/* Both ranks (or rank 0 only, when `alone`): timeout w->timeout_s, the
 * stream held w->hold_s, then a blocking all-reduce of (rank + 1). */
static void held(world *w, int rank, mpg_ctx *ctx, int alone) {
  if (alone && rank == 1) return;
  mpg_group *dp = NULL;
  mpg_ctx_group(ctx, "dp", &dp);
  mpg_ctx_set_timeout(ctx, w->timeout_s);
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  float *buf = dev_floats(ctx, (float)(rank + 1));
  double t0 = now_s();
  cudaLaunchHostFunc(s, hold_stream, &w->hold_s);
  if (!w->during) {
    note(w, rank, mpg_all_reduce(dp, buf, buf, N, MPG_F32, MPG_OP_SUM, s, NULL), t0);
  } else {
    /* Polled, as the sync polls its buckets: no call may block. */
    mpg_work *work = NULL;
    mpg_status st = mpg_all_reduce(dp, buf, buf, N, MPG_F32, MPG_OP_SUM, s, &work);
    int done = 0;
    while (!st && !done) {
      double a = now_s();
      st = mpg_work_test(work, &done);
      double took = now_s() - a;
      if (took > w->longest_test[rank]) w->longest_test[rank] = took;
      if (!st && !done) sleep_s(0.005);
    }
    mpg_status wst = mpg_work_wait(work);
    note(w, rank, st ? st : wst, t0);
  }
  cudaStreamSynchronize(s);
  w->got[rank] = first(buf);
  cudaStreamDestroy(s);
  mpg_ctx_mem_free(ctx, buf);
}

static void held_both(world *w, int rank, mpg_ctx *ctx) { held(w, rank, ctx, 0); }
static void held_alone(world *w, int rank, mpg_ctx *ctx) { held(w, rank, ctx, 1); }

/* Both ranks' streams held 1.5 s, three times the 0.5 s timeout (below the
 * start limit): the all-reduce completes.  `polled`: through mpg_work_test,
 * whose calls must not block (on nccl the backend's test keeps the GPU's
 * clock itself; a wait past the host's deadline would wait for it). */
static void expect_held_ok(int polled) {
  world *w = world_run(held_both, 1.5, 0.5, polled);
  for (int r = 0; r < 2; r++) {
    cr_assert_eq(w->st[r], MPG_OK, "rank %d: %s all-reduce after its stream was held %.1f s "
                 "(timeout %.1f s) -> %s after %.3f s: %s", r, polled ? "polled" : "blocking",
                 w->hold_s, w->timeout_s, mpg_status_name(w->st[r]), w->elapsed[r], w->msg[r]);
    cr_assert_eq(w->got[r], 3.0f, "rank %d: recv[0] = %g, want 3", r, (double)w->got[r]);
    cr_assert_geq(w->elapsed[r], w->hold_s - 0.05, "rank %d returned after %.3f s", r,
                  w->elapsed[r]);
    if (polled)
      cr_assert_lt(w->longest_test[r], tb_bound(0.1, 2),
                   "rank %d: one mpg_work_test call took %.3f s", r, w->longest_test[r]);
  }
  free(w);
}

/* Rank 0 alone, its stream held 1 s, timeout 0.5 s: a timeout at the hold
 * + the timeout, blocking or polled. */
static void expect_missing_peer_timeout(int polled) {
  world *w = world_run(held_alone, 1.0, 0.5, polled);
  double lo = w->hold_s + w->timeout_s, hi = tb_bound(lo, 2);
  cr_assert_eq(w->st[0], MPG_ERR_TIMEOUT, "%s after %.3f s: %s", mpg_status_name(w->st[0]),
               w->elapsed[0], w->msg[0]);
  cr_assert(w->elapsed[0] >= lo - 0.05 && w->elapsed[0] <= hi,
            "timed out after %.3f s; want the hold + the timeout, %.3f s (bound %.3f s): %s",
            w->elapsed[0], lo, hi, w->msg[0]);
  cr_assert(strstr(w->msg[0], "after the GPU reached it"), "%s", w->msg[0]);
  if (polled)
    cr_assert_lt(w->longest_test[0], tb_bound(0.1, 2), "one mpg_work_test call took %.3f s",
                 w->longest_test[0]);
  free(w);
}

Test(timeout, a_held_stream_is_not_a_missing_peer, .timeout = 60) { expect_held_ok(0); }
Test(timeout, polling_a_held_stream_never_blocks, .timeout = 60) { expect_held_ok(1); }
Test(timeout, a_missing_peer_times_out_after_the_start, .timeout = 60) {
  expect_missing_peer_timeout(0);
}
Test(timeout, polling_finds_a_missing_peer_after_the_start, .timeout = 60) {
  expect_missing_peer_timeout(1);
}

Test(timeout, a_stream_that_never_arrives_ends_at_the_start_limit, .timeout = 60) {
  /* Held 2.5 s; the start limit is 4 x 0.25 s = 1 s after the post.  The
   * context's abort after the timeout may wait for the held stream
   * (ncclCommAbort's cudaFree waits for every kernel of the device, unless
   * the abort runs on a thread of its own), so the call may return only
   * when the hold ends; the message says which limit ended it. */
  world *w = world_run(held_alone, 2.5, 0.25, 0);
  double lo = 4 * w->timeout_s, hi = tb_bound(w->hold_s, 2);
  cr_assert_eq(w->st[0], MPG_ERR_TIMEOUT, "%s after %.3f s: %s", mpg_status_name(w->st[0]),
               w->elapsed[0], w->msg[0]);
  cr_assert(w->elapsed[0] >= lo - 0.05 && w->elapsed[0] <= hi,
            "timed out after %.3f s; want the start limit, %.3f s, or the hold's end (bound "
            "%.3f s): %s",
            w->elapsed[0], lo, hi, w->msg[0]);
  cr_assert(strstr(w->msg[0], "did not reach the operation"), "%s", w->msg[0]);
  free(w);
}
