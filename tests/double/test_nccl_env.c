/* The NCCL backend leaves the environment alone (issue 30), on the CUDA/NCCL
 * test double with ranks as threads:
 *
 *  - torchrun-style bootstrap (MASTER_ADDR, MASTER_PORT, no id, no
 *    NCCL_COMM_ID): the world comes up through meshpg's own rendezvous,
 *    an all-reduce is right, and NCCL_COMM_ID and NCCL_LAUNCH_ORDER_IMPLICIT
 *    are never set (checked while the world runs and after);
 *  - without NCCL_LAUNCH_ORDER_IMPLICIT meshpg keeps the launch order of a
 *    context's groups itself: on a mesh dp=2 x tp=2, rank 0's stream of its
 *    tp all-reduce is held by a host function; its dp all-reduce, issued
 *    after it on another stream, must not run before the tp one (NCCL's
 *    rule for several communicators per device, docs/nccl.md point 1), so
 *    neither rank 0 nor its dp peer, rank 2, sees it complete while the
 *    hold lasts; once released, everything completes with the right sums.
 *    Without the order the dp all-reduce would complete at once. */
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "meshpg.h"
#include "on_double.h"

#define N 1024

typedef struct job {
  int rank, world;
  mpg_mesh *mesh;
  const ncclUniqueId *id; /* NULL: the MASTER_ADDR rendezvous */
  pthread_barrier_t *bar;
  _Atomic int *gate;      /* the order test: rank 0's held stream */
  char fail[1024];
  int early;              /* the order test: dp done while held */
} job;

#define CHECK(j, cond, ...) FIRST_FAIL((j)->fail, cond, __VA_ARGS__)

static mpg_ctx *create(job *j) {
  mpg_init_opts o = nccl_thread_opts(j->rank, j->world, j->id, 60);
  mpg_ctx *ctx = NULL;
  mpg_status st = mpg_ctx_create(j->mesh, &o, &ctx);
  CHECK(j, st == MPG_OK, "rank %d: mpg_ctx_create: %s: %s", j->rank, mpg_status_name(st),
        mpg_last_error());
  return st == MPG_OK ? ctx : NULL;
}

/* A rank's end: every rank is done with its collectives before any
 * context goes. */
static void *rank_done(job *j, mpg_ctx *ctx) {
  pthread_barrier_wait(j->bar);
  mpg_ctx_destroy(ctx);
  return NULL;
}

static float *dev_vec(mpg_ctx *ctx, float v) {
  void *p = NULL;
  if (mpg_ctx_mem_alloc(ctx, N * sizeof(float), 0, &p)) return NULL;
  float host[N];
  for (int i = 0; i < N; i++) host[i] = v + (float)i;
  cudaMemcpy(p, host, sizeof host, cudaMemcpyHostToDevice);
  return p;
}

/* recv[i] == want + k * i for every i (k: the group's size). */
static void check_sum(job *j, const char *what, const float *dev, float want, int k) {
  float host[N];
  cudaMemcpy(host, dev, sizeof host, cudaMemcpyDeviceToHost);
  for (int i = 0; i < N; i++)
    if (host[i] != want + (float)(k * i)) {
      CHECK(j, 0, "rank %d: %s[%d] = %g, want %g", j->rank, what, i, host[i],
            want + (float)(k * i));
      return;
    }
}

static void run(job *jobs, int world, void *(*fn)(void *), const char *dims, int with_id) {
  ncclUniqueId id;
  if (with_id) cr_assert_eq(ncclGetUniqueId(&id), ncclSuccess);
  mpg_mesh *mesh = mesh_of(dims, world);
  pthread_barrier_t bar;
  pthread_barrier_init(&bar, NULL, (unsigned)world);
  static _Atomic int gate;
  atomic_store(&gate, 1);
  pthread_t th[4];
  for (int r = 0; r < world; r++) {
    memset(&jobs[r], 0, sizeof jobs[r]);
    jobs[r] = (job){.rank = r, .world = world, .mesh = mesh, .id = with_id ? &id : NULL,
                    .bar = &bar, .gate = &gate};
    cr_assert_eq(pthread_create(&th[r], NULL, fn, &jobs[r]), 0);
  }
  for (int r = 0; r < world; r++) pthread_join(th[r], NULL);
  pthread_barrier_destroy(&bar);
  mpg_mesh_destroy(mesh);
  for (int r = 0; r < world; r++) cr_assert_eq(jobs[r].fail[0], 0, "%s", jobs[r].fail);
}

/* ------------------------------------------------------------------ */

static void *master_rank(void *p) {
  job *j = p;
  mpg_ctx *ctx = create(j);
  CHECK(j, !getenv("NCCL_COMM_ID"), "rank %d: NCCL_COMM_ID=%s during the run", j->rank,
        getenv("NCCL_COMM_ID"));
  CHECK(j, !getenv("NCCL_LAUNCH_ORDER_IMPLICIT"), "rank %d: NCCL_LAUNCH_ORDER_IMPLICIT set",
        j->rank);
  if (ctx) {
    mpg_group *dp = NULL;
    float *x = dev_vec(ctx, (float)j->rank);
    mpg_status st = mpg_ctx_group(ctx, "dp", &dp);
    if (!st) st = mpg_all_reduce(dp, x, x, N, MPG_F32, MPG_OP_SUM, NULL, NULL);
    CHECK(j, st == MPG_OK, "rank %d: all_reduce: %s", j->rank, mpg_last_error());
    if (!st) check_sum(j, "x", x, 1.0f, 2);
    mpg_ctx_mem_free(ctx, x);
  }
  return rank_done(j, ctx);
}

Test(nccl_env, master_addr_bootstrap_writes_no_variable, .timeout = 120) {
  unsetenv("NCCL_COMM_ID");
  unsetenv("NCCL_LAUNCH_ORDER_IMPLICIT");
  unsetenv("OMPI_COMM_WORLD_SIZE");
  char port[16];
  snprintf(port, sizeof port, "%d", 21000 + (int)(getpid() % 20000));
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", port, 1);
  job jobs[2];
  run(jobs, 2, master_rank, "dp=2", 0);
  cr_assert_null(getenv("NCCL_COMM_ID"), "NCCL_COMM_ID was set to %s", getenv("NCCL_COMM_ID"));
  cr_assert_null(getenv("NCCL_LAUNCH_ORDER_IMPLICIT"), "NCCL_LAUNCH_ORDER_IMPLICIT was set");
}

/* ------------------------------------------------------------------ */

static void CUDART_CB hold(void *arg) {
  _Atomic int *gate = arg;
  while (atomic_load(gate)) sleep_s(0.002);
}

static void *order_rank(void *p) {
  job *j = p;
  mpg_ctx *ctx = create(j);
  mpg_group *tp = NULL, *dp = NULL;
  void *s1 = NULL, *s2 = NULL;
  int ok = ctx && !mpg_ctx_group(ctx, "tp", &tp) && !mpg_ctx_group(ctx, "dp", &dp) &&
           !mpg_ctx_stream_create(ctx, &s1) && !mpg_ctx_stream_create(ctx, &s2);
  CHECK(j, ok, "rank %d: setup: %s", j->rank, mpg_last_error());
  float *a = ok ? dev_vec(ctx, (float)j->rank) : NULL, *b = ok ? dev_vec(ctx, 10.0f) : NULL;
  pthread_barrier_wait(j->bar);
  mpg_work *wa = NULL, *wb = NULL;
  if (ok && a && b) {
    if (j->rank == 0) cudaLaunchHostFunc((cudaStream_t)s1, hold, (void *)j->gate);
    mpg_status st = mpg_all_reduce(tp, a, a, N, MPG_F32, MPG_OP_SUM, s1, &wa);
    if (!st) st = mpg_all_reduce(dp, b, b, N, MPG_F32, MPG_OP_SUM, s2, &wb);
    CHECK(j, st == MPG_OK, "rank %d: post: %s", j->rank, mpg_last_error());
    /* While rank 0's tp all-reduce is held, no dp all-reduce that includes
     * rank 0 may complete. */
    sleep_s(0.4);
    int done = 0;
    if (wb && !mpg_work_test(wb, &done) && done && (j->rank == 0 || j->rank == 2)) j->early = 1;
  }
  pthread_barrier_wait(j->bar);
  if (j->rank == 0) atomic_store(j->gate, 0);
  if (wa) CHECK(j, mpg_work_wait(wa) == MPG_OK, "rank %d: tp wait: %s", j->rank, mpg_last_error());
  if (wb) CHECK(j, mpg_work_wait(wb) == MPG_OK, "rank %d: dp wait: %s", j->rank, mpg_last_error());
  if (a && b) {
    /* tp = {0,1} / {2,3}; dp = {0,2} / {1,3} (row-major dp x tp). */
    check_sum(j, "tp", a, (float)(j->rank < 2 ? 0 + 1 : 2 + 3), 2);
    check_sum(j, "dp", b, 20.0f, 2);
  }
  if (ctx) {
    mpg_ctx_mem_free(ctx, a);
    mpg_ctx_mem_free(ctx, b);
    mpg_ctx_stream_destroy(ctx, s1);
    mpg_ctx_stream_destroy(ctx, s2);
  }
  return rank_done(j, ctx);
}

Test(nccl_env, meshpg_orders_groups_without_launch_order_variable, .timeout = 120) {
  unsetenv("NCCL_LAUNCH_ORDER_IMPLICIT");
  job jobs[4];
  run(jobs, 4, order_rank, "dp=2,tp=2", 1);
  for (int r = 0; r < 4; r += 2)
    cr_assert_eq(jobs[r].early, 0,
                 "rank %d: the dp all-reduce completed while rank 0's earlier tp all-reduce "
                 "was held: the groups' kernels ran out of launch order",
                 r);
  cr_assert_null(getenv("NCCL_LAUNCH_ORDER_IMPLICIT"));
}
