/* Issue 35's rules of the NCCL backend (groups/nccl/), on the CUDA/NCCL
 * test double with ranks as threads (a caller-made unique id, device =
 * rank):
 *
 *  - mpg_ctx_abort never blocks: while NCCL's abort is stuck (its cudaFree
 *    waits for a host function that holds the device, the double's model
 *    of another library's kernel that never ends), the watchdog's call
 *    returns at once, the rank's waiting collective fails with
 *    MPG_ERR_ABORTED, later calls at once; mpg_ctx_destroy then waits for
 *    the abort (released: MPG_OK) or gives up after the timeout
 *    (MPG_ERR_TIMEOUT, the rest freed when the abort returns; ASan's leak
 *    check sees nothing left);
 *  - one issuing thread per context: the first thread that issues owns the
 *    context; another thread's collective, batch, all-to-all or order
 *    check fails with MPG_ERR_STATE and posts nothing (the next collective
 *    of the owner still matches its peers'); mpg_work_wait from another
 *    thread works;
 *  - all-to-all counts: with MESHPG_CHECK_ORDER=1 (tests/meson.build sets
 *    it) a pair whose counts disagree fails every member with
 *    MPG_ERR_INVALID naming the pair, before any data moves, and the next
 *    all-to-all is correct;
 *  - the double's model of NCCL's launch race (two threads launching on one
 *    device under NCCL_LAUNCH_ORDER_IMPLICIT: ncclInvalidUsage). */
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "meshpg.h"
#include "on_double.h"
#include "nccl/nccl_internal.h" /* mpg__nccl_aborts_running */

/* One rank of a thread world; `fail` keeps the first failed check. */
typedef struct rank {
  int rank, world;
  const ncclUniqueId *id;
  mpg_mesh *mesh;
  double timeout_s;
  pthread_barrier_t *bar;
  mpg_ctx *ctx;
  char fail[1024];
} rank;

#define CHECK(r, cond, ...) FIRST_FAIL((r)->fail, cond, __VA_ARGS__)

/* A call that must answer MPG_OK: its text, status and mpg_last_error()
 * when it does not. */
static void check_ok(rank *r, mpg_status st, const char *what) {
  CHECK(r, st == MPG_OK, "rank %d: %s: %s: %s", r->rank, what, mpg_status_name(st),
        mpg_last_error());
}
#define CHECK_OK(r, expr) check_ok((r), (expr), #expr)

static int create(rank *r) {
  mpg_init_opts o =
      nccl_thread_opts(r->rank, r->world, r->id, r->timeout_s > 0 ? r->timeout_s : 30);
  mpg_status st = mpg_ctx_create(r->mesh, &o, &r->ctx);
  CHECK(r, st == MPG_OK, "rank %d: mpg_ctx_create: %s: %s", r->rank, mpg_status_name(st),
        mpg_last_error());
  return st == MPG_OK;
}

static void run_world(int world, const char *dims, double timeout_s, void *(*fn)(void *),
                      rank *ranks, size_t stride) {
  ncclUniqueId id;
  cr_assert_eq(ncclGetUniqueId(&id), ncclSuccess);
  mpg_mesh *mesh = mesh_of(dims, world);
  pthread_barrier_t bar;
  pthread_barrier_init(&bar, NULL, (unsigned)world);
  pthread_t th[8];
  for (int i = 0; i < world; i++) {
    rank *r = (rank *)((char *)ranks + (size_t)i * stride);
    r->rank = i;
    r->world = world;
    r->id = &id;
    r->mesh = mesh;
    r->timeout_s = timeout_s;
    r->bar = &bar;
    cr_assert_eq(pthread_create(&th[i], NULL, fn, r), 0);
  }
  for (int i = 0; i < world; i++) pthread_join(th[i], NULL);
  pthread_barrier_destroy(&bar);
  mpg_mesh_destroy(mesh);
  for (int i = 0; i < world; i++) {
    rank *r = (rank *)((char *)ranks + (size_t)i * stride);
    cr_assert(r->fail[0] == '\0', "%s", r->fail);
  }
}

static void *dev_floats(rank *r, size_t n, float v) {
  void *p = NULL;
  CHECK_OK(r, mpg_ctx_mem_alloc(r->ctx, n * sizeof(float), 0, &p));
  if (!p) return NULL;
  float *h = malloc(n * sizeof *h);
  for (size_t i = 0; i < n; i++) h[i] = v;
  cudaMemcpy(p, h, n * sizeof *h, cudaMemcpyHostToDevice);
  free(h);
  return p;
}

static float dev_first(void *p) {
  float f = 0;
  cudaDeviceSynchronize();
  cudaMemcpy(&f, p, sizeof f, cudaMemcpyDeviceToHost);
  return f;
}

/* ------------------------------------------------------------------------ */
/* 1. mpg_ctx_abort never blocks                                             */
/* ------------------------------------------------------------------------ */

typedef struct ab {
  rank r;
  int destroy_while_stuck; /* 1: destroy before the device is released */
  atomic_int *hold;        /* the host function holds device 0 while 1 */
  /* the watchdog */
  double abort_at, abort_call_s;
  mpg_status abort_st;
} ab;

static void CUDART_CB hold_device(void *arg) {
  atomic_int *hold = arg;
  while (atomic_load(hold)) sleep_s(0.001);
}

static void *watchdog(void *p) {
  ab *a = p;
  sleep_s(0.3);
  a->abort_at = now_s();
  a->abort_st = mpg_ctx_abort(a->r.ctx);
  a->abort_call_s = now_s() - a->abort_at;
  return NULL;
}

static void *abort_rank(void *p) {
  ab *a = p;
  rank *r = &a->r;
  int ok = create(r);
  pthread_barrier_wait(r->bar);
  if (!ok) {
    pthread_barrier_wait(r->bar);
    return NULL;
  }
  if (r->rank == 1) {
    /* Never issues the all-reduce: rank 0's waits for it until aborted. */
    pthread_barrier_wait(r->bar);
    CHECK_OK(r, mpg_ctx_destroy(r->ctx));
    return NULL;
  }
  mpg_group *dp = NULL;
  CHECK_OK(r, mpg_ctx_group(r->ctx, "dp", &dp));
  void *stream = NULL;
  CHECK_OK(r, mpg_ctx_stream_create(r->ctx, &stream));
  const size_t n = 1024;
  void *x = dev_floats(r, n, 1.0f);
  /* Device 0 busy with work that does not end: NCCL's abort, which frees
   * with cudaFree, waits for it. */
  cudaSetDevice(0);
  CHECK(r, cudaLaunchHostFunc((cudaStream_t)stream, hold_device, a->hold) == cudaSuccess,
        "cudaLaunchHostFunc failed");
  pthread_t wd;
  CHECK(r, pthread_create(&wd, NULL, watchdog, a) == 0, "pthread_create");
  mpg_status st = mpg_all_reduce(dp, x, x, n, MPG_F32, MPG_OP_SUM, NULL, NULL);
  double returned = now_s();
  pthread_join(wd, NULL);
  CHECK(r, a->abort_st == MPG_OK, "mpg_ctx_abort: %s", mpg_status_name(a->abort_st));
  CHECK(r, a->abort_call_s < 0.5,
        "mpg_ctx_abort took %.3f s while NCCL's abort is stuck (it must not block)",
        a->abort_call_s);
  CHECK(r, st == MPG_ERR_ABORTED, "the waiting all-reduce returned %s, want MPG_ERR_ABORTED: %s",
        mpg_status_name(st), mpg_last_error());
  CHECK(r, returned - a->abort_at < 0.5,
        "the waiting all-reduce returned %.3f s after the abort", returned - a->abort_at);
  CHECK(r, mpg__nccl_aborts_running() >= 1,
        "no aborter thread running while the device is held (%d)", mpg__nccl_aborts_running());
  double t0 = now_s();
  st = mpg_barrier(dp, NULL);
  CHECK(r, st == MPG_ERR_ABORTED && now_s() - t0 < 0.2,
        "a later barrier: %s after %.3f s, want MPG_ERR_ABORTED at once", mpg_status_name(st),
        now_s() - t0);
  CHECK(r, mpg_ctx_status(r->ctx) == MPG_ERR_ABORTED, "mpg_ctx_status: %s",
        mpg_status_name(mpg_ctx_status(r->ctx)));
  if (!a->destroy_while_stuck) {
    atomic_store(a->hold, 0);
    CHECK_OK(r, mpg_ctx_mem_free(r->ctx, x));
    CHECK_OK(r, mpg_ctx_stream_destroy(r->ctx, stream));
    CHECK_OK(r, mpg_ctx_destroy(r->ctx));
  } else {
    /* Bounded by the timeout from the abort's start. */
    st = mpg_ctx_destroy(r->ctx);
    double took = now_s() - a->abort_at;
    CHECK(r, st == MPG_ERR_TIMEOUT, "destroy while the abort is stuck: %s, want "
          "MPG_ERR_TIMEOUT: %s", mpg_status_name(st), mpg_last_error());
    CHECK(r, strstr(mpg_last_error(), "has not returned within the timeout") != NULL, "%s",
          mpg_last_error());
    CHECK(r, took < r->timeout_s + 1.0, "destroy returned %.3f s after the abort (timeout "
          "%.3g s)", took, r->timeout_s);
    CHECK(r, mpg__nccl_aborts_running() >= 1, "the aborter finished before the release");
    atomic_store(a->hold, 0);
    cudaSetDevice(0);
    cudaFree(x);
    cudaStreamDestroy((cudaStream_t)stream);
  }
  /* The aborter thread finishes and frees what it holds. */
  double t1 = now_s();
  while (mpg__nccl_aborts_running() > 0 && now_s() - t1 < 20) sleep_s(0.005);
  CHECK(r, mpg__nccl_aborts_running() == 0, "the aborter thread still runs 20 s after the "
        "device was released");
  pthread_barrier_wait(r->bar);
  return NULL;
}

static void abort_case(int destroy_while_stuck, double timeout_s) {
  atomic_int hold = 1;
  ab a[2];
  memset(a, 0, sizeof a);
  for (int i = 0; i < 2; i++) {
    a[i].destroy_while_stuck = destroy_while_stuck;
    a[i].hold = &hold;
  }
  run_world(2, "dp=2", timeout_s, abort_rank, &a[0].r, sizeof a[0]);
  cr_log_info("mpg_ctx_abort returned in %.1f ms while NCCL's abort was stuck",
              1e3 * a[0].abort_call_s);
}

Test(nccl_rules, abort_returns_while_ncclCommAbort_is_stuck, .timeout = 120) {
  abort_case(0, 5.0);
}

Test(nccl_rules, destroy_waits_for_a_stuck_abort_at_most_the_timeout, .timeout = 120) {
  abort_case(1, 1.5);
}

/* ------------------------------------------------------------------------ */
/* 2. One issuing thread per context                                         */
/* ------------------------------------------------------------------------ */

typedef struct iss {
  rank r;
  mpg_group *dp;
  void *x;
  mpg_work *work;
  pthread_barrier_t inner; /* the rank's main thread and its worker */
} iss;

static void *issuer_worker(void *p) {
  iss *s = p;
  rank *r = &s->r;
  cudaSetDevice(r->rank);
  /* The first issuing call: this thread owns the context. */
  CHECK_OK(r, mpg_all_reduce(s->dp, s->x, s->x, 256, MPG_F32, MPG_OP_SUM, NULL, NULL));
  CHECK(r, dev_first(s->x) == 2.0f, "rank %d: first sum %g", r->rank, (double)dev_first(s->x));
  CHECK_OK(r, mpg_all_reduce(s->dp, s->x, s->x, 256, MPG_F32, MPG_OP_SUM, NULL, &s->work));
  pthread_barrier_wait(&s->inner); /* main waits for the work, then tries */
  pthread_barrier_wait(&s->inner);
  /* Nothing of main's refused calls was posted: this still pairs. */
  CHECK_OK(r, mpg_all_reduce(s->dp, s->x, s->x, 256, MPG_F32, MPG_OP_SUM, NULL, NULL));
  CHECK(r, dev_first(s->x) == 8.0f, "rank %d: third sum %g, want 8", r->rank,
        (double)dev_first(s->x));
  return NULL;
}

static void expect_refused(rank *r, const char *what, mpg_status st) {
  CHECK(r, st == MPG_ERR_STATE, "rank %d: %s from a second thread: %s, want MPG_ERR_STATE: %s",
        r->rank, what, mpg_status_name(st), mpg_last_error());
  if (st == MPG_ERR_STATE)
    CHECK(r, strstr(mpg_last_error(), "issues this context's calls") &&
          strstr(mpg_last_error(), "called from thread") &&
          strstr(mpg_last_error(), "nothing was posted"),
          "rank %d: %s: message: %s", r->rank, what, mpg_last_error());
}

static void *issuer_rank(void *p) {
  iss *s = p;
  rank *r = &s->r;
  if (!create(r)) return NULL;
  CHECK_OK(r, mpg_ctx_group(r->ctx, "dp", &s->dp));
  s->x = dev_floats(r, 256, 1.0f);
  pthread_barrier_init(&s->inner, NULL, 2);
  pthread_t w;
  CHECK(r, pthread_create(&w, NULL, issuer_worker, s) == 0, "pthread_create");
  pthread_barrier_wait(&s->inner);
  /* Waits may come from any thread. */
  CHECK_OK(r, mpg_work_wait(s->work));
  CHECK(r, dev_first(s->x) == 4.0f, "rank %d: second sum %g", r->rank,
        (double)dev_first(s->x));
  /* Issuing from this thread (the context's creator, not its issuer). */
  expect_refused(r, "mpg_all_reduce",
                 mpg_all_reduce(s->dp, s->x, s->x, 256, MPG_F32, MPG_OP_SUM, NULL, NULL));
  expect_refused(r, "mpg_barrier", mpg_barrier(s->dp, NULL));
  mpg_p2p_op op = {MPG_P2P_SEND, 1 - r->rank, s->x, 16, MPG_F32};
  expect_refused(r, "mpg_p2p_batch", mpg_p2p_batch(s->dp, &op, 1, NULL, NULL));
  expect_refused(r, "mpg_all_to_all",
                 mpg_all_to_all(s->dp, s->x, (char *)s->x + 512, 64, MPG_F32, NULL, NULL));
  expect_refused(r, "mpg_ctx_check_order", mpg_ctx_check_order(r->ctx));
  /* A new group is a split of the world: refused too, nothing made. */
  int both[2] = {0, 1};
  mpg_group *sel = NULL;
  expect_refused(r, "mpg_ctx_group_select",
                 mpg_ctx_group_select(r->ctx, "dp", both, 2, &sel));
  CHECK(r, mpg_ctx_status(r->ctx) == MPG_OK, "rank %d: the refusals aborted the context",
        r->rank);
  pthread_barrier_wait(&s->inner);
  pthread_join(w, NULL);
  pthread_barrier_destroy(&s->inner);
  CHECK_OK(r, mpg_ctx_mem_free(r->ctx, s->x));
  CHECK_OK(r, mpg_ctx_destroy(r->ctx));
  return NULL;
}

Test(nccl_rules, one_issuing_thread_per_context, .timeout = 120) {
  setenv("MESHPG_CHECK_ORDER", "1", 1); /* mpg_ctx_check_order communicates */
  iss s[2];
  memset(s, 0, sizeof s);
  run_world(2, "dp=2", 30, issuer_rank, &s[0].r, sizeof s[0]);
}

/* ------------------------------------------------------------------------ */
/* 3. All-to-all counts with the issue-order checker                         */
/* ------------------------------------------------------------------------ */

enum { A2A_W = 3, A2A_CAP = 64 };

/* Elements position i sends position j. */
static size_t a2a_c(int i, int j) { return (size_t)(1 + i + 2 * j); }

static void *a2a_rank(void *p) {
  rank *r = p;
  if (!create(r)) return NULL;
  mpg_group *g = NULL;
  CHECK_OK(r, mpg_ctx_group(r->ctx, "dp", &g));
  int me = r->rank;
  size_t sc[A2A_W], sd[A2A_W], rc[A2A_W], rd[A2A_W], so = 0, ro = 0;
  for (int j = 0; j < A2A_W; j++) {
    sc[j] = a2a_c(me, j);
    rc[j] = a2a_c(j, me);
    sd[j] = so;
    rd[j] = ro;
    so += sc[j] + 2; /* room for the mismatched counts below */
    ro += rc[j] + 2;
  }
  float *send = dev_floats(r, A2A_CAP, 0), *recv = dev_floats(r, A2A_CAP, -1.0f);
  float h[A2A_CAP];
  for (int i = 0; i < A2A_CAP; i++) h[i] = (float)(100 * me + i);
  cudaMemcpy(send, h, sizeof h, cudaMemcpyHostToDevice);
  /* Two pairs disagree: 0 sends 1 three more than 1 expects, and 2
   * expects one more from 1 than 1 sends. */
  size_t bad_sc[A2A_W], bad_rc[A2A_W];
  memcpy(bad_sc, sc, sizeof sc);
  memcpy(bad_rc, rc, sizeof rc);
  if (me == 0) bad_sc[1] += 2;
  if (me == 2) bad_rc[1] += 1;
  mpg_status st = mpg_all_to_all_v(g, send, bad_sc, sd, recv, bad_rc, rd, MPG_F32, NULL, NULL);
  CHECK(r, st == MPG_ERR_INVALID, "rank %d: mismatched all_to_all_v: %s, want "
        "MPG_ERR_INVALID: %s", me, mpg_status_name(st), mpg_last_error());
  CHECK(r, strstr(mpg_last_error(), "2 pairs") &&
        strstr(mpg_last_error(), "position 0 sends 5 elements to position 1 (send_counts[1]) "
                                 "where position 1 expects 3 (recv_counts[0])"),
        "rank %d: message: %s", me, mpg_last_error());
  cudaDeviceSynchronize();
  cudaMemcpy(h, recv, sizeof h, cudaMemcpyDeviceToHost);
  for (int i = 0; i < A2A_CAP; i++)
    CHECK(r, h[i] == -1.0f, "rank %d: recv[%d] = %g after the refused call (nothing may "
          "move)", me, i, (double)h[i]);
  CHECK(r, mpg_ctx_status(r->ctx) == MPG_OK, "rank %d: the mismatch aborted the context", me);
  /* The same call with matching counts: every block arrives. */
  CHECK_OK(r, mpg_all_to_all_v(g, send, sc, sd, recv, rc, rd, MPG_F32, NULL, NULL));
  cudaDeviceSynchronize();
  cudaMemcpy(h, recv, sizeof h, cudaMemcpyDeviceToHost);
  for (int j = 0; j < A2A_W; j++) {
    /* Block from j: elements sd_j[me] .. of j's send, values 100 j + k. */
    size_t off = 0;
    for (int q = 0; q < me; q++) off += a2a_c(j, q) + 2;
    for (size_t k = 0; k < rc[j]; k++)
      CHECK(r, h[rd[j] + k] == (float)(100 * j + (int)(off + k)),
            "rank %d: block from %d, element %zu is %g, want %d", me, j, k,
            (double)h[rd[j] + k], 100 * j + (int)(off + k));
  }
  /* mpg_all_to_all with another count on position 2. */
  st = mpg_all_to_all(g, send, recv, me == 2 ? 4 : 3, MPG_F32, NULL, NULL);
  CHECK(r, st == MPG_ERR_INVALID && strstr(mpg_last_error(), "do not match"),
        "rank %d: all_to_all with counts 3, 3, 4: %s: %s", me, mpg_status_name(st),
        mpg_last_error());
  CHECK_OK(r, mpg_all_to_all(g, send, recv, 3, MPG_F32, NULL, NULL));
  /* The refused calls were issued, so the checker sees the counts differ. */
  st = mpg_ctx_check_order(r->ctx);
  CHECK(r, st == MPG_ERR_STATE && strstr(mpg_last_error(), "all_to_all"),
        "rank %d: mpg_ctx_check_order: %s: %s", me, mpg_status_name(st), mpg_last_error());
  CHECK_OK(r, mpg_ctx_mem_free(r->ctx, send));
  CHECK_OK(r, mpg_ctx_mem_free(r->ctx, recv));
  CHECK_OK(r, mpg_ctx_destroy(r->ctx));
  return NULL;
}

Test(nccl_rules, all_to_all_count_mismatch_fails_every_member_before_data, .timeout = 120) {
  setenv("MESHPG_CHECK_ORDER", "1", 1);
  rank r[A2A_W];
  memset(r, 0, sizeof r);
  run_world(A2A_W, "dp=3", 30, a2a_rank, r, sizeof r[0]);
}

/* ------------------------------------------------------------------------ */
/* 4. The double: two threads launching on one device                        */
/* ------------------------------------------------------------------------ */

/* The double's knob (nccl_double_launch.c): every launch holds its acquired
 * window this long. */
void dbl_fault_launch_pause(double seconds);

typedef struct racer {
  double delay_s; /* launch this long after both threads are ready */
  pthread_barrier_t *bar;
  ncclResult_t setup, r;
  char msg[256];
} racer;

/* One communicator of one rank on device 0 per thread, one all-reduce. */
static void *race_thread(void *p) {
  racer *x = p;
  cudaSetDevice(0);
  ncclUniqueId id;
  ncclComm_t comm = NULL;
  cudaStream_t s = NULL;
  void *buf = NULL;
  x->setup = ncclGetUniqueId(&id);
  if (x->setup == ncclSuccess) x->setup = ncclCommInitRank(&comm, 1, id, 0);
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  cudaMalloc(&buf, 64 * sizeof(float));
  pthread_barrier_wait(x->bar);
  if (x->setup == ncclSuccess) {
    sleep_s(x->delay_s);
    x->r = ncclAllReduce(buf, buf, 64, ncclFloat, ncclSum, comm, s);
    if (x->r != ncclSuccess) snprintf(x->msg, sizeof x->msg, "%s", ncclGetLastError(NULL));
    cudaStreamSynchronize(s);
  }
  pthread_barrier_wait(x->bar);
  cudaFree(buf);
  cudaStreamDestroy(s);
  if (comm) ncclCommDestroy(comm);
  return NULL;
}

/* Thread 0 launches and holds its window 0.4 s; thread 1 launches 0.1 s
 * later, inside it. */
static void race_case(int implicit) {
  if (implicit) setenv("NCCL_LAUNCH_ORDER_IMPLICIT", "1", 1);
  else unsetenv("NCCL_LAUNCH_ORDER_IMPLICIT");
  dbl_fault_launch_pause(0.4);
  pthread_barrier_t bar;
  pthread_barrier_init(&bar, NULL, 2);
  racer x[2];
  memset(x, 0, sizeof x);
  pthread_t t[2];
  for (int i = 0; i < 2; i++) {
    x[i].bar = &bar;
    x[i].delay_s = 0.1 * i;
    cr_assert_eq(pthread_create(&t[i], NULL, race_thread, &x[i]), 0);
  }
  for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
  pthread_barrier_destroy(&bar);
  dbl_fault_launch_pause(0);
  for (int i = 0; i < 2; i++)
    cr_assert_eq(x[i].setup, ncclSuccess, "thread %d: %s", i, ncclGetErrorString(x[i].setup));
  cr_assert_eq(x[1].r, ncclSuccess, "the later launch: %s: %s", ncclGetErrorString(x[1].r),
               x[1].msg);
  if (implicit) {
    cr_assert_eq(x[0].r, ncclInvalidUsage, "the raced launch: %s", ncclGetErrorString(x[0].r));
    cr_assert(strstr(x[0].msg, "host threads racing to launch NCCL on same device"), "%s",
              x[0].msg);
  } else {
    cr_assert_eq(x[0].r, ncclSuccess, "without NCCL_LAUNCH_ORDER_IMPLICIT: %s: %s",
                 ncclGetErrorString(x[0].r), x[0].msg);
  }
}

Test(nccl_rules, double_two_threads_launching_on_one_device_race, .timeout = 60) {
  race_case(1);
}

Test(nccl_rules, double_no_race_without_implicit_launch_order, .timeout = 60) {
  race_case(0);
}
