/* One rank of the multi-rank NCCL scenarios, started by `mpirun` (through
 * test_nccl_mpi.c or tests/double/).  The same source is linked twice: with
 * NVIDIA's libnccl and libcudart (real GPUs; on one GPU every rank gets its
 * own NCCL_HOSTID, see test_nccl_mpi.c) and with the CUDA/NCCL test double
 * (tests/double/), where each process simulates a node's devices.  Only the
 * public API and the CUDA runtime are used, as a trainer would.
 *
 *   nccl_mpi_worker sync             replicate and shard, f32 and bf16 (f32
 *                                    accumulation), 3 steps each, with a
 *                                    sequence-parallel norm reduced over
 *                                    dp_cp,tp: every owned gradient must be
 *                                    the exact average over its group
 *   nccl_mpi_worker hang K | kill K  step 1 has params on K reduce groups in
 *                                    flight (K = 1..3: dp_cp, then tp, then
 *                                    dp_cp,tp) when the last rank sleeps
 *                                    (hang) or dies (kill): every survivor
 *                                    must fail with TIMEOUT, ABORTED or
 *                                    BACKEND within the timeout + 1 s plus
 *                                    ../time_bound.h's allowance, and
 *                                    destroy cleanly (R8)
 *   nccl_mpi_worker oom K            (the test double only) bf16 params
 *                                    reduced in f32; the last rank's
 *                                    cudaMallocAsync fails in step 1: every
 *                                    rank fails within the same bound
 *   nccl_mpi_worker gather [armed]   shard mode: forward on the first
 *                                    gathered bucket runs while the next
 *                                    bucket's all-gather is in flight, or
 *                                    (armed, the test double only) held
 *                                    forever by a hang fault (L3)
 *   nccl_mpi_worker lazy             lazy groups whose first use differs by
 *                                    rank (even ranks tp first, odd dp), a
 *                                    sum on tp, dp, dp_cp and the world,
 *                                    a point-to-point ring in one batch,
 *                                    and the issue-order check
 *   nccl_mpi_worker bw MIB           the sync of one MIB MiB f32 param over
 *                                    the world next to nccl-tests' loop of
 *                                    ncclAllReduce over the same bytes, in
 *                                    the same run: time per step and bus
 *                                    bandwidth of each ("BW" lines)
 *   nccl_mpi_worker count K          (the test double only) a healthy step
 *                                    1; prints "OPS rank R N", the NCCL
 *                                    operations rank R issued before it
 *   nccl_mpi_worker async K          (the test double only) run with
 *                                    MESHPG_DOUBLE_FAULT=async:R:N+1: the
 *                                    last rank's first operation of step 1
 *                                    reports an asynchronous error; it
 *                                    fails with MPG_ERR_BACKEND naming it,
 *                                    every rank within the bound
 *   nccl_mpi_worker async_wait K     (the test double only, K >= 2) the
 *                                    same error, while the last rank waits
 *                                    on another communicator that the
 *                                    peers never reach: it must fail with
 *                                    MPG_ERR_BACKEND well before its
 *                                    timeout (R4)
 *
 * The mesh follows the world: 2 = dp2, 4 = dp2 x tp2, 8 = dp2 x cp2 x tp2
 * (dims of size 1 are kept, so dp_cp and tp always exist).  Prints one line
 * per rank, "OK ..." or "FAIL ...", and exits 0 unless it failed.
 * MESHPG_TEST_TIMEOUT_S sets the timeout of the fault modes (default 10:
 * it bounds context creation too, CUDA's and NCCL's start included). */
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "meshpg.h"
#include "../support/cuda_report.h" /* and worker_report.h */
#include "../support/time_bound.h"
#ifdef MPG_ON_DOUBLE
#include "../double/double.h"
#endif

static int g_world = 0;
static char g_mode_buf[32]; /* g_mode: "MODE" or "MODE ARG" */

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The end of a mode: destroy the context (a failure reported) and the
 * mesh, then "OK <mode> rank R" unless something failed; 1 after a
 * failure. */
static int finish(mpg_ctx *ctx, mpg_mesh *mesh) {
  ctx_close(ctx, mesh);
  if (!failures) printf("OK %s rank %d\n", g_mode, g_rank);
  return failures != 0;
}

static const char *mesh_of(int world) {
  switch (world) {
    case 2: return "dp=2,cp=1,tp=1";
    case 4: return "dp=2,cp=1,tp=2";
    case 8: return "dp=2,cp=2,tp=2";
  }
  return NULL;
}

static mpg_status make_ctx_lazy(double timeout_s, int lazy, mpg_mesh **mesh, mpg_ctx **ctx) {
  mpg_spec spec = MPG_SPEC_INIT;
  mpg_status st = mpg_spec_init(&spec);
  if (!st) st = mpg_spec_set_mesh(&spec, mesh_of(g_world));
  if (!st) st = mpg_spec_add_flatten(&spec, "dp_cp", "dp,cp");
  if (!st) st = mpg_spec_validate(&spec);
  if (!st) st = mpg_mesh_create(&spec, g_world, mesh);
  if (st) return st;
  mpg_init_opts o = MPG_INIT_OPTS_INIT;
  o.backend.name = MPG_BACKEND_NCCL;
  o.backend.timeout_s = timeout_s;
  o.backend.lazy_groups = lazy;
  return mpg_ctx_create(*mesh, &o, ctx); /* rank, device: from the launcher */
}

static mpg_status make_ctx(double timeout_s, mpg_mesh **mesh, mpg_ctx **ctx) {
  return make_ctx_lazy(timeout_s, 0, mesh, ctx);
}

/* The gradient rank r writes at element i: small integers, so every
 * average over 2, 4 or 8 ranks is exact in f32 and bf16. */
static float grad_value(int r, size_t i, long step) {
  return (float)(i % 8) + 4.0f * (float)r + (float)step;
}

static uint16_t to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static float from_bf16(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

typedef struct param {
  const char *name, *dims;
  size_t count;
  int id;
  mpg_group *group; /* its reduce group */
} param;

/* ------------------------------------------------------------------ */
/* sync: every mode and dtype, exact averages                          */
/* ------------------------------------------------------------------ */

/* One sync configuration. */
typedef struct sync_case {
  const char *name;
  mpg_sync_mode mode;
  mpg_dtype dt;
  mpg_reduce_dtype rdt;
  int fsdp_owns_dp;         /* default reduce group "cp" */
  const char *shard_dims, *replicate_dims; /* HSDP */
  int registered;           /* ncclMemAlloc + ncclCommRegister */
  int backward;             /* gradients written on a stream of their own,
                               with no host synchronisation */
} sync_case;

/* f16 of a value that f16 holds exactly (the gradients here: small
 * integers and their quarters); f16 -> float for the check. */
static uint16_t to_f16_exact(float f) {
  if (f == 0) return 0;
  uint32_t u;
  memcpy(&u, &f, 4);
  int e = (int)((u >> 23) & 0xff) - 127 + 15;
  return (uint16_t)(((u >> 16) & 0x8000u) | ((uint32_t)e << 10) | ((u & 0x7fffffu) >> 13));
}

static float from_f16(uint16_t h) {
  int e = (h >> 10) & 0x1f;
  float m = (float)(h & 0x3ff);
  float v = e ? ldexpf(1.0f + m / 1024.0f, e - 15) : ldexpf(m / 1024.0f, -14);
  return (h & 0x8000u) ? -v : v;
}

static int run_sync_case(mpg_ctx *ctx, const sync_case *sc) {
  int ok = 0;
  mpg_sync_mode mode = sc->mode;
  mpg_dtype dt = sc->dt;
  const char *dflt = sc->fsdp_owns_dp ? "cp" : "dp_cp";
  mpg_sync *s = NULL;
  param ps[3] = {{"w0", NULL, 1000, -1, NULL},
                 {"norm", "dp_cp,tp", 64, -1, NULL},
                 {"w1", NULL, 4099, -1, NULL}};
  size_t esz = mpg_dtype_size(dt);
  void *host = malloc(4099 * 8);
  if (!host) return 1;
  mpg_sync_opts so = MPG_SYNC_OPTS_INIT;
  so.sync.mode = mode;
  so.sync.reduce_dtype = sc->rdt;
  so.sync.fsdp_owns_dp = sc->fsdp_owns_dp;
  snprintf(so.sync.shard_dims, sizeof so.sync.shard_dims, "%s", sc->shard_dims ? sc->shard_dims : "");
  snprintf(so.sync.replicate_dims, sizeof so.sync.replicate_dims, "%s", sc->replicate_dims ? sc->replicate_dims : "");
  so.register_buffers = sc->registered;
  cudaStream_t bwd = NULL;
  if (sc->backward) CUDA_TRY(cudaStreamCreateWithFlags(&bwd, cudaStreamNonBlocking));
  so.sync.bucket_mb = 0.004; /* several buckets in flight */
  so.sync.first_bucket_mb = 0.002;
  TRY(mpg_sync_create(ctx, &so, &s));
  for (int p = 0; p < 3; p++) {
    mpg_param_opts po = MPG_PARAM_OPTS_INIT;
    po.reduce_dims = ps[p].dims;
    TRY(mpg_sync_add_param(s, ps[p].name, ps[p].count, dt, &po, &ps[p].id));
    TRY(mpg_ctx_group_dims(ctx, ps[p].dims ? ps[p].dims : dflt, &ps[p].group));
  }
  TRY(mpg_sync_commit(s));
  for (long step = 0; step < 3; step++) {
    TRY(mpg_sync_begin(s, step, 1, bwd));
    for (int p = 2; p >= 0; p--) {
      void *g = NULL;
      TRY(mpg_sync_grad(s, ps[p].id, &g));
      for (size_t i = 0; i < ps[p].count; i++) {
        float v = grad_value(g_rank, i, step);
        if (dt == MPG_BF16) ((uint16_t *)host)[i] = to_bf16(v);
        else if (dt == MPG_F16) ((uint16_t *)host)[i] = to_f16_exact(v);
        else ((float *)host)[i] = v;
      }
      if (bwd) {
        /* A "backward" on its own non-blocking stream, overlapping the
         * sync: mark_ready must order the sync's stream after it (the
         * copy from pageable memory is staged before it returns). */
        CUDA_TRY(cudaMemcpyAsync(g, host, ps[p].count * esz, cudaMemcpyHostToDevice, bwd));
      } else {
        /* The legacy default stream, synchronised: the sync's stream is
         * not ordered after it. */
        CUDA_TRY(cudaMemcpy(g, host, ps[p].count * esz, cudaMemcpyHostToDevice));
        CUDA_TRY(cudaDeviceSynchronize());
      }
      TRY(mpg_sync_mark_ready(s, ps[p].id));
    }
    TRY(mpg_sync_finish(s));
    CUDA_TRY(cudaDeviceSynchronize());
    for (int p = 0; p < 3; p++) {
      /* Shard mode: the owned slice; replicate mode: all of it. */
      size_t lo = 0, n = ps[p].count;
      if (mode == MPG_SYNC_SHARD) {
        mpg_shard_info si = MPG_SHARD_INFO_INIT;
        TRY(mpg_sync_get_shard(s, ps[p].id, &si));
        lo = si.param_offset;
        n = si.count;
      }
      void *g = NULL;
      TRY(mpg_sync_grad(s, ps[p].id, &g));
      CUDA_TRY(cudaMemcpy(host, g, ps[p].count * esz, cudaMemcpyDeviceToHost));
      int size = mpg_group_size(ps[p].group);
      for (size_t i = lo; i < lo + n; i++) {
        double want = 0;
        for (int q = 0; q < size; q++) {
          int r = -1;
          TRY(mpg_group_member(ps[p].group, q, &r));
          want += grad_value(r, i, step);
        }
        want /= size;
        float got = dt == MPG_BF16  ? from_bf16(((uint16_t *)host)[i])
                    : dt == MPG_F16 ? from_f16(((uint16_t *)host)[i])
                                    : ((float *)host)[i];
        if ((double)got != want) {
          fail("%s step %ld: %s[%zu] = %g, want %g (average over %d ranks)", sc->name, step,
               ps[p].name, i, (double)got, want, size);
          goto done;
        }
      }
    }
  }
  ok = 1;
done:
  if (s) {
    mpg_status d = mpg_sync_destroy(s);
    if (d) fail("mpg_sync_destroy -> %s: %s", mpg_status_name(d), mpg_last_error());
  }
  if (bwd) cudaStreamDestroy(bwd);
  free(host);
  return ok ? 0 : 1;
}

static int run_sync(void) {
  mpg_mesh *mesh = NULL;
  mpg_ctx *ctx = NULL;
  static const sync_case cases[] = {
      {"replicate f32", MPG_SYNC_REPLICATE, MPG_F32, MPG_REDUCE_F32, 0, NULL, NULL, 0, 0},
      {"replicate bf16 (f32 accumulation)", MPG_SYNC_REPLICATE, MPG_BF16, MPG_REDUCE_F32, 0,
       NULL, NULL, 0, 0},
      {"replicate f16 native", MPG_SYNC_REPLICATE, MPG_F16, MPG_REDUCE_NATIVE, 0, NULL, NULL, 0, 0},
      {"replicate bf16, fsdp_owns_dp", MPG_SYNC_REPLICATE, MPG_BF16, MPG_REDUCE_F32, 1, NULL,
       NULL, 0, 0},
      {"shard f32", MPG_SYNC_SHARD, MPG_F32, MPG_REDUCE_F32, 0, NULL, NULL, 0, 0},
      {"shard bf16 (f32 accumulation)", MPG_SYNC_SHARD, MPG_BF16, MPG_REDUCE_F32, 0, NULL,
       NULL, 0, 0},
      {"shard f16 native", MPG_SYNC_SHARD, MPG_F16, MPG_REDUCE_NATIVE, 0, NULL, NULL, 0, 0},
      {"HSDP bf16 (shard dp, replicate cp)", MPG_SYNC_SHARD, MPG_BF16, MPG_REDUCE_F32, 0, "dp",
       "cp", 0, 0},
      {"replicate f32, registered buffers", MPG_SYNC_REPLICATE, MPG_F32, MPG_REDUCE_F32, 0,
       NULL, NULL, 1, 0},
      {"replicate bf16, backward on its own stream", MPG_SYNC_REPLICATE, MPG_BF16,
       MPG_REDUCE_F32, 0, NULL, NULL, 0, 1},
      {"shard f32, backward on its own stream", MPG_SYNC_SHARD, MPG_F32, MPG_REDUCE_F32, 0,
       NULL, NULL, 0, 1},
  };
  int n = (int)(sizeof cases / sizeof cases[0]);
  TRY(make_ctx(120, &mesh, &ctx));
  for (int c = 0; c < n; c++)
    if (run_sync_case(ctx, &cases[c])) goto done;
done:
  if (ctx) {
    mpg_status d = mpg_ctx_destroy(ctx);
    if (d) fail("mpg_ctx_destroy -> %s: %s", mpg_status_name(d), mpg_last_error());
  }
  mpg_mesh_destroy(mesh);
  if (!failures)
    printf("OK %s rank %d: %d configurations (replicate, shard, HSDP, fsdp_owns_dp, "
           "registered, overlapping backward; f32, bf16, f16 native), 3 steps each\n", g_mode,
           g_rank, n);
  return failures != 0;
}

/* ------------------------------------------------------------------ */
/* hang / kill: a missing peer with K communicators in flight (R8)      */
/* ------------------------------------------------------------------ */

enum fault_kind { FAULT_HANG, FAULT_KILL, FAULT_OOM, FAULT_ASYNC, FAULT_COUNT, FAULT_ASYNC_WAIT };

/* Sleep until the others gave up (2 timeouts + 2 s), then leave without
 * finishing the step. */
static int stay_away(double timeout, mpg_sync *s, mpg_ctx *ctx, mpg_mesh *mesh,
                     const char *who) {
  struct timespec ts = {(time_t)(2 * timeout + 2), 0};
  nanosleep(&ts, NULL);
  mpg_sync_destroy(s);
  mpg_ctx_destroy(ctx);
  mpg_mesh_destroy(mesh);
  printf("OK %s rank %d (%s)\n", g_mode, g_rank, who);
  return 0;
}

static int run_fault(enum fault_kind kind, int k) {
  int kill_it = kind == FAULT_KILL;
  const char *env = getenv("MESHPG_TEST_TIMEOUT_S");
  double timeout = env ? atof(env) : 10.0;
  mpg_mesh *mesh = NULL;
  mpg_ctx *ctx = NULL;
  mpg_sync *s = NULL;
  int victim = g_rank == g_world - 1;
  static const char *const dims[3] = {"dp_cp", "tp", "dp_cp,tp"};
  int ids[3] = {-1, -1, -1};
  /* Start-up (launch, NCCL's connections, the splits of commit, a healthy
   * step) under a generous timeout: 8 ranks under ASan on 2 cores took more
   * than 3 s to connect (CI).  The fault is then met under `timeout`
   * (mpg_ctx_set_timeout), which is what the bounds below measure. */
  TRY(make_ctx(timeout > 120 ? timeout : 120, &mesh, &ctx));
  mpg_sync_opts so = MPG_SYNC_OPTS_INIT;
  TRY(mpg_sync_create(ctx, &so, &s));
  for (int p = 0; p < k; p++) {
    mpg_param_opts po = MPG_PARAM_OPTS_INIT;
    po.reduce_dims = dims[p];
    char name[16];
    snprintf(name, sizeof name, "p%d", p);
    /* oom: bf16, reduced in f32 through a cudaMallocAsync'd buffer. */
    TRY(mpg_sync_add_param(s, name, 1 << 16, kind == FAULT_OOM ? MPG_BF16 : MPG_F32, &po,
                           &ids[p]));
  }
  TRY(mpg_sync_commit(s));
  TRY(mpg_sync_all(s, 0, NULL)); /* one healthy step */
  TRY(mpg_ctx_set_timeout(ctx, timeout));
  TRY(mpg_sync_begin(s, 1, 1, NULL));
#ifdef MPG_ON_DOUBLE
  {
    /* How many NCCL operations this rank issued before step 1: the number
     * an injected fault on step 1's first one needs (MESHPG_DOUBLE_FAULT,
     * counted per rank; the sequence is the same on every run). */
    dbl_stats_t ds;
    dbl_stats(&ds);
    printf("OPS rank %d %llu\n", g_rank, (unsigned long long)ds.collectives);
  }
#endif
  if (victim && kind == FAULT_OOM) {
    /* The test double's injection (tests/double/cuda_double_mem.c, read at
     * every cudaMallocAsync): this rank runs out of device memory now. */
    char r[16];
    snprintf(r, sizeof r, "%d", g_rank);
    setenv("MESHPG_DOUBLE_OOM_RANK", r, 1);
    printf("rank %d: runs out of memory now, with %d reduce group(s) about to be in flight\n",
           g_rank, k);
  } else if (!victim && kind == FAULT_ASYNC_WAIT) {
    /* R4: the peers post step 1's first bucket only, then stay away: the
     * victim's second bucket (another communicator) can never complete,
     * while its first reports the injected asynchronous error. */
    TRY(mpg_sync_mark_ready(s, ids[k - 1]));
    return stay_away(timeout, s, ctx, mesh, "a peer that stays away");
  } else if (victim && (kind == FAULT_HANG || kind == FAULT_KILL)) {
    printf("rank %d: %s now, with %d reduce group(s) about to be in flight\n", g_rank,
           kill_it ? "dies" : "sleeps", k);
    fflush(stdout);
    if (kill_it) raise(SIGKILL);
    return stay_away(timeout, s, ctx, mesh, "the victim");
  }
  /* The failure may surface at a post (a killed peer's closed socket is
   * an error NCCL may report at the next enqueue) or in finish. */
  double t0 = now();
  mpg_status st = MPG_OK;
  const char *stage = "finish";
  /* async: the error is reported after its operation completed, so a step
   * may pass; the next operation on that communicator fails (step 2). */
  for (long step = 1; step <= (kind == FAULT_ASYNC ? 2 : 1) && !st; step++) {
    if (step > 1) {
      st = mpg_sync_begin(s, step, 1, NULL);
      if (st) stage = "begin";
    }
    for (int p = k - 1; p >= 0 && !st; p--) {
      st = mpg_sync_mark_ready(s, ids[p]);
      if (st) stage = "mark_ready";
    }
    if (!st) st = mpg_sync_finish(s);
  }
  double dt = now() - t0;
  double bound = tb_bound(timeout + 1.0, g_world);
  /* count: a healthy step.  async: the victim's first operation of the step
   * reported an asynchronous error; a peer whose buckets all completed
   * before the victim's context was aborted may still finish. */
  int may_pass = kind == FAULT_COUNT || (kind == FAULT_ASYNC && !victim);
  if (may_pass && st == MPG_OK) {
    printf("rank %d: finish -> OK after %.3f s\n", g_rank, dt);
    goto destroy;
  }
  if (kind == FAULT_COUNT)
    fail("%s -> %s in a healthy step: %s", stage, mpg_status_name(st), mpg_last_error());
  else if ((kind == FAULT_ASYNC || kind == FAULT_ASYNC_WAIT) && victim &&
           st != MPG_ERR_BACKEND)
    fail("%s -> %s, expected the injected error (MPG_ERR_BACKEND): %s", stage,
         mpg_status_name(st), mpg_last_error());
  else if (kind == FAULT_ASYNC_WAIT && dt > timeout / 2)
    fail("%s failed after %.3f s: the error on another communicator was not seen before "
         "the %.1f s timeout (R4): %s", stage, dt, timeout, mpg_last_error());
  else if (st != MPG_ERR_TIMEOUT && st != MPG_ERR_ABORTED && st != MPG_ERR_BACKEND)
    fail("%s -> %s, expected a timeout or abort: %s", stage, mpg_status_name(st),
         mpg_last_error());
  else if (dt > bound)
    fail("%s failed after %.3f s, bound %.3f s: %s", stage, dt, bound, mpg_last_error());
  else
    printf("rank %d: %s -> %s after %.3f s (timeout %.1f s, %d group(s)): %s\n", g_rank,
           stage, mpg_status_name(st), dt, timeout, k, mpg_last_error());
  if (mpg_sync_grads_valid(s) != 0) fail("grads_valid is 1 after a failed step");
destroy:
  t0 = now();
  mpg_status d = mpg_sync_destroy(s);
  s = NULL;
  if (d) fail("mpg_sync_destroy -> %s: %s", mpg_status_name(d), mpg_last_error());
  d = mpg_ctx_destroy(ctx);
  ctx = NULL;
  if (d) fail("mpg_ctx_destroy -> %s: %s", mpg_status_name(d), mpg_last_error());
  if (now() - t0 > tb_bound(1.0, g_world))
    fail("the destroys after the failure took %.3f s", now() - t0);
done:
  if (s) mpg_sync_destroy(s);
  if (ctx) mpg_ctx_destroy(ctx);
  mpg_mesh_destroy(mesh);
  if (!failures) printf("OK %s rank %d\n", g_mode, g_rank);
  fflush(stdout);
  return failures != 0;
}

/* ------------------------------------------------------------------ */
/* bw: the sync's bus bandwidth next to NCCL's own all-reduce          */
/* ------------------------------------------------------------------ */

/* Bus bandwidth as nccl-tests defines it for an all-reduce: the bytes
 * times 2 (n - 1) / n, per second. */
static double busbw(size_t bytes, int n, double secs) {
  return secs > 0 ? (double)bytes * 2.0 * (n - 1) / n / secs / 1e9 : 0;
}

static int run_bw(size_t mib) {
  mpg_mesh *mesh = NULL;
  mpg_ctx *ctx = NULL;
  mpg_sync *s = NULL;
  ncclComm_t raw = NULL;
  void *idbuf = NULL, *x = NULL;
  cudaStream_t st = NULL;
  const int iters = 5;
  size_t count = mib * (1u << 20) / 4, bytes = count * 4;
  int id = -1;
  double t_sync = 0, t_raw = 0;
  TRY(make_ctx(120, &mesh, &ctx));
  mpg_group *world = NULL;
  TRY(mpg_ctx_group(ctx, "world", &world));
  /* The sync: one f32 parameter over the world, 5 steps after a warm-up. */
  mpg_sync_opts so = MPG_SYNC_OPTS_INIT;
  so.default_dims = "world";
  TRY(mpg_sync_create(ctx, &so, &s));
  TRY(mpg_sync_add_param(s, "w", count, MPG_F32, NULL, &id));
  TRY(mpg_sync_commit(s));
  for (int i = 0; i <= iters; i++) {
    if (i == 1) {
      CUDA_TRY(cudaDeviceSynchronize());
      TRY(mpg_barrier(world, NULL));
      t_sync = now();
    }
    TRY(mpg_sync_all(s, i, NULL));
  }
  CUDA_TRY(cudaDeviceSynchronize());
  t_sync = (now() - t_sync) / iters;
  /* nccl-tests' loop: ncclAllReduce in place over the same bytes, on a
   * communicator of its own (the id travels by meshpg's broadcast). */
  ncclUniqueId nid;
  if (g_rank == 0 && ncclGetUniqueId(&nid) != ncclSuccess) {
    fail("ncclGetUniqueId failed");
    goto done;
  }
  TRY(mpg_ctx_mem_alloc(ctx, sizeof nid, 0, &idbuf));
  CUDA_TRY(cudaMemcpy(idbuf, &nid, sizeof nid, cudaMemcpyHostToDevice));
  CUDA_TRY(cudaDeviceSynchronize());
  TRY(mpg_broadcast(world, idbuf, sizeof nid / 4, MPG_I32, 0, NULL, NULL));
  CUDA_TRY(cudaDeviceSynchronize());
  CUDA_TRY(cudaMemcpy(&nid, idbuf, sizeof nid, cudaMemcpyDeviceToHost));
  if (ncclCommInitRank(&raw, g_world, nid, g_rank) != ncclSuccess) {
    fail("ncclCommInitRank failed: %s", ncclGetLastError(NULL));
    goto done;
  }
  CUDA_TRY(cudaMalloc(&x, bytes));
  CUDA_TRY(cudaMemset(x, 0, bytes));
  CUDA_TRY(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  CUDA_TRY(cudaDeviceSynchronize());
  for (int i = 0; i <= iters; i++) {
    if (i == 1) {
      CUDA_TRY(cudaStreamSynchronize(st));
      TRY(mpg_barrier(world, NULL));
      t_raw = now();
    }
    if (ncclAllReduce(x, x, count, ncclFloat32, ncclSum, raw, st) != ncclSuccess) {
      fail("ncclAllReduce failed: %s", ncclGetLastError(NULL));
      goto done;
    }
  }
  CUDA_TRY(cudaStreamSynchronize(st));
  t_raw = (now() - t_raw) / iters;
  printf("BW rank %d: %zu MiB over %d ranks: sync %.3f ms (busbw %.2f GB/s), ncclAllReduce "
         "%.3f ms (busbw %.2f GB/s), sync/nccl time %.2f\n",
         g_rank, mib, g_world, t_sync * 1e3, busbw(bytes, g_world, t_sync), t_raw * 1e3,
         busbw(bytes, g_world, t_raw), t_raw > 0 ? t_sync / t_raw : 0);
done:
  if (st) cudaStreamDestroy(st);
  if (x) cudaFree(x);
  if (raw) ncclCommDestroy(raw);
  if (idbuf) mpg_ctx_mem_free(ctx, idbuf);
  if (s) mpg_sync_destroy(s);
  if (ctx) mpg_ctx_destroy(ctx);
  mpg_mesh_destroy(mesh);
  if (!failures) printf("OK %s rank %d\n", g_mode, g_rank);
  return failures != 0;
}

/* ------------------------------------------------------------------ */
/* lazy: groups created at first use, in a different order by rank     */
/* ------------------------------------------------------------------ */

/* Sum of the world ranks of g's members, all-reduced on g in device
 * memory, must equal what the mesh says. */
static int check_group_sum(mpg_ctx *ctx, mpg_group *g, int32_t *dev) {
  int32_t v = g_rank, got = -1, want = 0;
  for (int q = 0; q < mpg_group_size(g); q++) {
    int r = -1;
    TRY(mpg_group_member(g, q, &r));
    want += r;
  }
  CUDA_TRY(cudaMemcpy(dev, &v, 4, cudaMemcpyHostToDevice));
  CUDA_TRY(cudaDeviceSynchronize());
  TRY(mpg_all_reduce(g, dev, dev, 1, MPG_I32, MPG_OP_SUM, NULL, NULL));
  CUDA_TRY(cudaDeviceSynchronize());
  CUDA_TRY(cudaMemcpy(&got, dev, 4, cudaMemcpyDeviceToHost));
  if (got != want) fail("group %s: sum %d, want %d", mpg_group_name(g), got, want);
  (void)ctx;
done:
  return failures != 0;
}

static int run_lazy(void) {
  mpg_mesh *mesh = NULL;
  mpg_ctx *ctx = NULL;
  void *dev = NULL, *ring = NULL;
  TRY(make_ctx_lazy(60, 1, &mesh, &ctx));
  TRY(mpg_ctx_mem_alloc(ctx, 4, 0, &dev));
  /* Even ranks want tp first, odd ranks dp: the library agrees on the
   * union before it splits (every rank enters the same splits). */
  static const char *const even[] = {"tp", "dp", "dp_cp", "world"};
  static const char *const odd[] = {"dp", "tp", "world", "dp_cp"};
  for (int i = 0; i < 4; i++) {
    mpg_group *g = NULL;
    TRY(mpg_ctx_group_dims(ctx, (g_rank % 2 ? odd : even)[i], &g));
    /* Sums in one order on every rank. */
    (void)g;
  }
  static const char *const all[] = {"tp", "dp", "dp_cp", "world"};
  for (int i = 0; i < 4; i++) {
    mpg_group *g = NULL;
    TRY(mpg_ctx_group_dims(ctx, all[i], &g));
    if (check_group_sum(ctx, g, dev)) goto done;
  }
  /* A ring of point-to-point sends over the world in one batch. */
  {
    mpg_group *w = NULL;
    TRY(mpg_ctx_group(ctx, "world", &w));
    int n = g_world, right = (g_rank + 1) % n, left = (g_rank + n - 1) % n;
    int32_t mine[256], got[256];
    for (int i = 0; i < 256; i++) mine[i] = g_rank * 1000 + i;
    TRY(mpg_ctx_mem_alloc(ctx, sizeof mine * 2, 0, &ring));
    int32_t *send = ring, *recv = (int32_t *)ring + 256;
    CUDA_TRY(cudaMemcpy(send, mine, sizeof mine, cudaMemcpyHostToDevice));
    CUDA_TRY(cudaDeviceSynchronize());
    mpg_p2p_op ops[2] = {{MPG_P2P_SEND, right, send, 256, MPG_I32},
                         {MPG_P2P_RECV, left, recv, 256, MPG_I32}};
    TRY(mpg_p2p_batch(w, ops, 2, NULL, NULL));
    CUDA_TRY(cudaDeviceSynchronize());
    CUDA_TRY(cudaMemcpy(got, recv, sizeof got, cudaMemcpyDeviceToHost));
    for (int i = 0; i < 256; i++)
      if (got[i] != left * 1000 + i) {
        fail("p2p ring: element %d is %d, want %d", i, got[i], left * 1000 + i);
        break;
      }
  }
  TRY(mpg_ctx_check_order(ctx));
done:
  if (ring) mpg_ctx_mem_free(ctx, ring);
  if (dev) mpg_ctx_mem_free(ctx, dev);
  return finish(ctx, mesh);
}

/* ------------------------------------------------------------------ */
/* alltoall: mpg_all_to_all and _v on NCCL (grouped ncclSend/ncclRecv)  */
/* ------------------------------------------------------------------ */

/* Counts from rank a to rank b in round `round`: 0..37 elements, zero for
 * some pairs (a token-dispatch pattern), the same formula on every rank. */
static size_t a2a_count(int a, int b, int round) {
  unsigned h = (unsigned)(a * 131 + b * 71 + round * 29 + 7);
  h ^= h >> 3;
  return (h % 5 == 0) ? 0 : h % 38;
}

/* Over "world" and "dp": equal splits (f32), then per-peer counts (bf16
 * and i32) with displacements that leave gaps; every received element is
 * sender * 4096 + receiver * 64 + index (exact in bf16 only for small
 * values: the bf16 case sends index % 128 + 1). */
static int run_alltoall(void) {
  mpg_mesh *mesh = NULL;
  mpg_ctx *ctx = NULL;
  void *send = NULL, *recv = NULL;
  float *hs = NULL, *hr = NULL;
  TRY(make_ctx(60, &mesh, &ctx));
  const size_t cap = 8 * 64 * 4; /* elements per buffer: 8 peers x 64, 4 B each */
  TRY(mpg_ctx_mem_alloc(ctx, cap * 4, 0, &send));
  TRY(mpg_ctx_mem_alloc(ctx, cap * 4, 0, &recv));
  hs = calloc(cap, 4);
  hr = calloc(cap, 4);
  if (!hs || !hr) {
    fail("out of memory");
    goto done;
  }
  static const char *const names[] = {"world", "dp"};
  for (int gi = 0; gi < 2; gi++) {
    mpg_group *g = NULL;
    TRY(mpg_ctx_group(ctx, names[gi], &g));
    int n = mpg_group_size(g), me = mpg_group_position(g);
    /* Equal splits: 16 floats to each peer. */
    for (int q = 0; q < n; q++)
      for (int i = 0; i < 16; i++) hs[q * 16 + i] = (float)(me * 4096 + q * 64 + i);
    CUDA_TRY(cudaMemcpy(send, hs, (size_t)n * 16 * 4, cudaMemcpyHostToDevice));
    CUDA_TRY(cudaMemset(recv, 0xff, (size_t)n * 16 * 4));
    CUDA_TRY(cudaDeviceSynchronize());
    TRY(mpg_all_to_all(g, send, recv, 16, MPG_F32, NULL, NULL));
    CUDA_TRY(cudaDeviceSynchronize());
    CUDA_TRY(cudaMemcpy(hr, recv, (size_t)n * 16 * 4, cudaMemcpyDeviceToHost));
    for (int q = 0; q < n && !failures; q++)
      for (int i = 0; i < 16; i++)
        if (hr[q * 16 + i] != (float)(q * 4096 + me * 64 + i)) {
          fail("%s all_to_all: from position %d element %d is %g, want %d", names[gi], q, i,
               (double)hr[q * 16 + i], q * 4096 + me * 64 + i);
          break;
        }
    /* Per-peer counts, 3 rounds, i32 then bf16. */
    for (int round = 0; round < 3 && !failures; round++) {
      int bf = round == 1;
      size_t sc[8], sd[8], rc[8], rd[8], off = 0, roff = 0;
      for (int q = 0; q < n; q++) {
        sc[q] = a2a_count(me, q, round);
        sd[q] = off;
        off += sc[q] + 3; /* a gap of 3 after each block */
        rc[q] = a2a_count(q, me, round);
        rd[q] = roff;
        roff += rc[q] + 1;
      }
      unsigned char *hb = (unsigned char *)hs;
      memset(hb, 0, cap * 4);
      for (int q = 0; q < n; q++)
        for (size_t i = 0; i < sc[q]; i++) {
          if (bf) {
            float v = (float)(i % 128 + 1);
            uint32_t u;
            memcpy(&u, &v, 4);
            uint16_t b16 = (uint16_t)(u >> 16);
            memcpy(hb + (sd[q] + i) * 2, &b16, 2);
          } else {
            int32_t v = me * 4096 + q * 64 + (int32_t)i;
            memcpy(hb + (sd[q] + i) * 4, &v, 4);
          }
        }
      CUDA_TRY(cudaMemcpy(send, hs, cap * 4, cudaMemcpyHostToDevice));
      CUDA_TRY(cudaMemset(recv, 0, cap * 4));
      CUDA_TRY(cudaDeviceSynchronize());
      TRY(mpg_all_to_all_v(g, send, sc, sd, recv, rc, rd, bf ? MPG_BF16 : MPG_I32, NULL, NULL));
      CUDA_TRY(cudaDeviceSynchronize());
      CUDA_TRY(cudaMemcpy(hr, recv, cap * 4, cudaMemcpyDeviceToHost));
      unsigned char *rb = (unsigned char *)hr;
      for (int q = 0; q < n && !failures; q++)
        for (size_t i = 0; i < rc[q]; i++) {
          long got, want;
          if (bf) {
            uint16_t b16;
            memcpy(&b16, rb + (rd[q] + i) * 2, 2);
            uint32_t u = (uint32_t)b16 << 16;
            float f;
            memcpy(&f, &u, 4);
            got = (long)f;
            want = (long)(i % 128 + 1);
          } else {
            int32_t v;
            memcpy(&v, rb + (rd[q] + i) * 4, 4);
            got = v;
            want = q * 4096 + me * 64 + (long)i;
          }
          if (got != want) {
            fail("%s all_to_all_v round %d (%s): from position %d element %zu of %zu is %ld, "
                 "want %ld", names[gi], round, bf ? "bf16" : "i32", q, i, rc[q], got, want);
            break;
          }
        }
    }
  }
  TRY(mpg_ctx_check_order(ctx));
done:
  free(hs);
  free(hr);
  if (send) mpg_ctx_mem_free(ctx, send);
  if (recv) mpg_ctx_mem_free(ctx, recv);
  return finish(ctx, mesh);
}

/* ------------------------------------------------------------------ */
/* gather: the prefetch of the next bucket does not hold up forward     */
/* ------------------------------------------------------------------ */

/* Shard mode, two params in two buckets.  After a healthy step 0,
 * gather_begin, gather_wait(p0) (which starts p1's all-gather, one ahead),
 * then an event on the caller's stream: forward on p0 must be able to run
 * while p1's all-gather is still in flight (L3).  With
 * MESHPG_DOUBLE_FAULT=hang on the last rank's all-gather of p1 (the test
 * double only), p1's gather never completes: the event must complete all
 * the same, within 2 s.  "count" mode prints the operations before
 * gather_begin (OPS). */
static int run_gather(int armed) {
  mpg_mesh *mesh = NULL;
  mpg_ctx *ctx = NULL;
  mpg_sync *s = NULL;
  cudaStream_t fwd = NULL;
  cudaEvent_t ev = NULL;
  int ids[2] = {-1, -1};
  TRY(make_ctx(120, &mesh, &ctx)); /* start-up; then 3 s for the held gather */
  mpg_sync_opts so = MPG_SYNC_OPTS_INIT;
  so.sync.mode = MPG_SYNC_SHARD;
  so.sync.bucket_mb = 0.25;
  so.sync.first_bucket_mb = 0.25;
  TRY(mpg_sync_create(ctx, &so, &s));
  TRY(mpg_sync_add_param(s, "p0", 1 << 16, MPG_F32, NULL, &ids[0]));
  TRY(mpg_sync_add_param(s, "p1", 1 << 16, MPG_F32, NULL, &ids[1]));
  TRY(mpg_sync_commit(s));
  TRY(mpg_sync_all(s, 0, NULL));
  TRY(mpg_ctx_set_timeout(ctx, 3));
  CUDA_TRY(cudaStreamCreateWithFlags(&fwd, cudaStreamNonBlocking));
  CUDA_TRY(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  CUDA_TRY(cudaDeviceSynchronize());
#ifdef MPG_ON_DOUBLE
  {
    dbl_stats_t ds;
    dbl_stats(&ds);
    printf("OPS rank %d %llu\n", g_rank, (unsigned long long)ds.collectives);
  }
#endif
  TRY(mpg_sync_gather_begin(s, fwd));
  TRY(mpg_sync_gather_wait(s, ids[0]));
  CUDA_TRY(cudaEventRecord(ev, fwd)); /* "forward on p0" */
  double t0 = now();
  cudaError_t q;
  while ((q = cudaEventQuery(ev)) == cudaErrorNotReady && now() - t0 < 2.0) {
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
  }
  if (q != cudaSuccess)
    fail("forward on p0 did not run within 2 s (%s): the caller's stream waits for p1's "
         "all-gather (L3)", cudaGetErrorString(q));
  else
    printf("rank %d: forward on p0 ran after %.3f s%s\n", g_rank, now() - t0,
           armed ? " while p1's all-gather is held" : "");
  /* Armed, the gather fails where the held rank is a member of the shard
   * group (its timeout); the other shard groups finish it. */
  mpg_status st = mpg_sync_gather_all(s);
  if (!armed && st != MPG_OK)
    fail("gather_all -> %s: %s", mpg_status_name(st), mpg_last_error());
  else if (armed)
    printf("rank %d: gather_all -> %s\n", g_rank, mpg_status_name(st));
done:
  if (ev) cudaEventDestroy(ev);
  if (s) mpg_sync_destroy(s);
  if (fwd) cudaStreamDestroy(fwd);
  if (ctx) mpg_ctx_destroy(ctx);
  mpg_mesh_destroy(mesh);
  if (!failures) printf("OK %s rank %d\n", g_mode, g_rank);
  return failures != 0;
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc < 2) {
    printf("usage: nccl_mpi_worker sync | lazy | alltoall | gather [armed] | hang K | kill K | oom K | "
           "count K | async K | async_wait K | bw MIB\n");
    return 2;
  }
  snprintf(g_mode_buf, sizeof g_mode_buf, "%s%s%s", argv[1], argc > 2 ? " " : "",
           argc > 2 ? argv[2] : "");
  g_mode = g_mode_buf;
  mpg_launch env = MPG_LAUNCH_INIT;
  if (mpg_launch_from_env(&env) != MPG_OK || env.world_size < 2) {
    printf("FAIL %s: no launch environment (run under mpirun): %s\n", g_mode, mpg_last_error());
    return 1;
  }
  g_rank = env.rank;
  g_world = env.world_size;
  if (!mesh_of(g_world)) {
    printf("FAIL %s: world %d (2, 4 or 8 ranks)\n", g_mode, g_world);
    return 1;
  }
  int rc;
  if (!strcmp(argv[1], "sync")) {
    rc = run_sync();
  } else if (!strcmp(argv[1], "gather")) {
    rc = run_gather(argc > 2 && !strcmp(argv[2], "armed"));
  } else if (!strcmp(argv[1], "lazy")) {
    rc = run_lazy();
  } else if (!strcmp(argv[1], "alltoall")) {
    rc = run_alltoall();
  } else if (!strcmp(argv[1], "bw") && argc > 2 && atoi(argv[2]) > 0) {
    rc = run_bw((size_t)atoi(argv[2]));
  } else if ((!strcmp(argv[1], "hang") || !strcmp(argv[1], "kill") ||
              !strcmp(argv[1], "oom") || !strcmp(argv[1], "async") ||
              !strcmp(argv[1], "async_wait") ||
              !strcmp(argv[1], "count")) && argc > 2) {
    int k = atoi(argv[2]);
    if (k < 1 || k > 3) {
      printf("FAIL %s: K must be 1, 2 or 3\n", g_mode);
      return 1;
    }
    enum fault_kind kind = !strcmp(argv[1], "kill")    ? FAULT_KILL
                           : !strcmp(argv[1], "oom")   ? FAULT_OOM
                           : !strcmp(argv[1], "async") ? FAULT_ASYNC
                           : !strcmp(argv[1], "count") ? FAULT_COUNT
                           : !strcmp(argv[1], "async_wait") ? FAULT_ASYNC_WAIT
                                                       : FAULT_HANG;
    rc = run_fault(kind, k);
  } else {
    printf("FAIL %s: unknown mode\n", g_mode);
    return 2;
  }
  return rc;
}
