/* One rank of the cluster tests' torchrun-style jobs (test_cluster.c):
 * the nccl backend on the CUDA/NCCL test double (tests/double/), started
 * on the hosts of a tests/cluster/cluster.sh cluster by
 * tests/cluster/cluster_launch.sh with RANK, WORLD_SIZE, LOCAL_RANK,
 * LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT, and no mpirun.  The
 * context joins through meshpg's rendezvous at MASTER_ADDR; the double
 * connects ranks on different hosts (another hostname, another /dev/shm)
 * through its socket transport, as NCCL's NET transport does.
 *
 *   cluster_nccl_worker sync MESH   replicate and shard syncs of f32 and
 *                                   bf16 params (bf16 reduced in f32),
 *                                   some over cp alone: every owned
 *                                   gradient equals the exact average over
 *                                   its group (integer inputs, so that any
 *                                   order gives the same bits)
 *   cluster_nccl_worker steps MESH N T
 *                                   N replicate steps of a 1 Mi f32 param
 *                                   with timeout T s once set up; prints
 *                                   "STEP s rank R" at each step, and on a
 *                                   failure "END rank R host H status NAME
 *                                   ms MS step S: MSG" (MS: how long the
 *                                   failing call took), then "DESTROYED
 *                                   rank R status SYNC CTX"
 *
 * Prints "OK <mode> rank R" or "FAIL <mode> rank R: ..."; exit 0 / 1. */
#include <cuda_runtime_api.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "meshpg.h"
#include "../support/sync_util.h"
#include "../support/values.h"
#include "../support/mesh_util.h"
#include "../support/cuda_report.h"

static char g_hostname[64];


static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

/* The status and time of the last failed mpg_ctx_create (for END lines). */
static mpg_status g_create_st;
static double g_create_ms;

static mpg_ctx *open_ctx(const char *dims, mpg_mesh **mesh) {
  mpg_ctx *ctx = NULL;
  mpg_launch L = MPG_LAUNCH_INIT;
  *mesh = NULL;
  TRY(mpg_launch_from_env(&L));
  TRY(mesh_build(dims, NULL, L.world_size, mesh));
  mpg_init_opts o = MPG_INIT_OPTS_INIT;
  o.backend.name = MPG_BACKEND_NCCL;
  o.backend.timeout_s = 120; /* start-up; the steps set their own */
  o.placement = 1;
  double t0 = now_ms();
  /* rank, device: from the launcher */
  if ((g_create_st = mpg_ctx_create(*mesh, &o, &ctx)) != MPG_OK) {
    g_create_ms = now_ms() - t0;
    fail("mpg_ctx_create -> %s: %s", mpg_status_name(g_create_st), mpg_last_error());
  }
done:
  return ctx;
}

/* Rank r's element i of param p: a small integer, exact in bf16. */
static float gen(int r, int p, size_t i) { return (float)((r * 7 + p * 3 + (int)(i % 13)) % 32); }

static void run_sync(mpg_ctx *ctx, int shard) {
  const char *mname = shard ? "shard" : "replicate";
  const sync_param ps[] = {
      {"f0", 3001, MPG_F32, NULL}, {"b0", 1501, MPG_BF16, NULL}, {"fcp", 37, MPG_F32, "cp"}};
  enum { NP = 3 };
  mpg_sync *s = NULL;
  void *host = malloc(3001 * 4);
  mpg_sync_opts so = MPG_SYNC_OPTS_INIT;
  so.sync.bucket_mb = 0.004;
  so.sync.first_bucket_mb = 0.001;
  if (shard) so.sync.mode = MPG_SYNC_SHARD;
  TRY(sync_make_params(ctx, &so, ps, NP, &s));
  const int me = mpg_ctx_rank(ctx);
  for (int p = 0; p < NP; p++) {
    void *g;
    size_t es = ps[p].dtype == MPG_BF16 ? 2 : 4;
    for (size_t i = 0; i < ps[p].count; i++) {
      if (ps[p].dtype == MPG_BF16) ((uint16_t *)host)[i] = tv_f32_to_bf16(gen(me, p, i));
      else ((float *)host)[i] = gen(me, p, i);
    }
    TRY(mpg_sync_grad(s, p, &g));
    CUDA_TRY(cudaMemcpy(g, host, ps[p].count * es, cudaMemcpyHostToDevice));
  }
  TRY(mpg_sync_all(s, 0, NULL));
  if (!mpg_sync_grads_valid(s)) fail("%s: grads invalid", mname);
  long bad = 0;
  for (int p = 0; p < NP; p++) {
    void *g;
    mpg_group *grp;
    mpg_shard_info info = MPG_SHARD_INFO_INIT;
    size_t es = ps[p].dtype == MPG_BF16 ? 2 : 4;
    TRY(mpg_sync_grad(s, p, &g));
    TRY(mpg_sync_param_group(s, p, &grp));
    if (shard) TRY(mpg_sync_get_shard(s, p, &info));
    else info.count = ps[p].count;
    CUDA_TRY(cudaMemcpy(host, g, ps[p].count * es, cudaMemcpyDeviceToHost));
    int n = mpg_group_size(grp), m[64];
    for (int k = 0; k < n && k < 64; k++) TRY(mpg_group_member(grp, k, &m[k]));
    for (size_t i = info.param_offset; i < info.param_offset + info.count; i++) {
      float sum = 0;
      for (int k = 0; k < n; k++) sum += gen(m[k], p, i);
      float want = sum / (float)n, got;
      got = ps[p].dtype == MPG_BF16 ? tv_bf16_to_f32(((uint16_t *)host)[i]) : ((float *)host)[i];
      if (ps[p].dtype == MPG_BF16) want = tv_bf16_to_f32(tv_f32_to_bf16(want));
      if (got != want && bad++ < 5)
        fail("%s: param %s element %zu: got %g, expected %g (group of %d)", mname, ps[p].name,
             i, (double)got, (double)want, n);
    }
  }
  if (me == 0) printf("%s: checked %d params\n", mname, NP);
done:
  if (s) mpg_sync_destroy(s);
  free(host);
}

static void mode_sync(const char *dims) {
  mpg_mesh *mesh;
  mpg_ctx *ctx = open_ctx(dims, &mesh);
  if (ctx) {
    run_sync(ctx, 0);
    run_sync(ctx, 1);
  }
  ctx_close(ctx, mesh);
}

static void mode_steps(const char *dims, int steps, double timeout_s) {
  mpg_mesh *mesh;
  mpg_ctx *ctx = open_ctx(dims, &mesh);
  mpg_sync *s = NULL;
  if (!ctx) {
    if (g_create_st) steps_end(g_rank, g_hostname, g_create_st, g_create_ms, -1,
                               "mpg_ctx_create failed");
    steps_destroy(g_rank, NULL, NULL, mesh); /* nothing to destroy: OK OK */
    return;
  }
  const int me = mpg_ctx_rank(ctx);
  const size_t count = (size_t)1 << 20;
  float *host = malloc(count * 4);
  mpg_sync_opts so = MPG_SYNC_OPTS_INIT;
  so.sync.bucket_mb = 1;
  double t0 = now_ms();
  int id, k = -1;
  mpg_status st = mpg_sync_create(ctx, &so, &s);
  if (!st) st = mpg_sync_add_param(s, "w", count, MPG_F32, NULL, &id);
  if (!st) st = mpg_sync_commit(s);
  if (!st) st = mpg_ctx_set_timeout(ctx, timeout_s);
  for (k = 0; k < steps && !st; k++) {
    void *g;
    printf("STEP %d rank %d\n", k, me);
    fflush(stdout);
    t0 = now_ms();
    for (size_t i = 0; i < count; i++) host[i] = (float)(me + k);
    st = mpg_sync_begin(s, k, 1, NULL);
    if (!st) st = mpg_sync_grad(s, 0, &g);
    if (!st && cudaMemcpy(g, host, count * 4, cudaMemcpyHostToDevice) != cudaSuccess)
      fail("cudaMemcpy failed");
    if (!st) st = mpg_sync_mark_ready(s, 0);
    if (!st) st = mpg_sync_finish(s);
    if (!st) usleep(100000);
  }
  if (st) steps_end(me, g_hostname, st, now_ms() - t0, k - 1, mpg_last_error());
  else steps_end(me, g_hostname, MPG_OK, 0, steps, "all steps");
  steps_destroy(me, s, ctx, mesh);
  free(host);
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc < 3) {
    printf("usage: cluster_nccl_worker sync MESH | steps MESH N TIMEOUT_S\n");
    return 2;
  }
  g_mode = argv[1];
  const char *r = getenv("RANK");
  g_rank = r ? atoi(r) : -1;
  gethostname(g_hostname, sizeof g_hostname - 1);
  printf("HOST rank %d host %s pid %ld\n", g_rank, g_hostname, (long)getpid());
  if (strcmp(g_mode, "sync") == 0) mode_sync(argv[2]);
  else if (strcmp(g_mode, "steps") == 0 && argc > 4)
    mode_steps(argv[2], atoi(argv[3]), atof(argv[4]));
  else fail("unknown mode");
  if (!failures) printf("OK %s rank %d\n", g_mode, g_rank);
  fflush(stdout);
  return failures ? 1 : 0;
}
