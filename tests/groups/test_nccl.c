/* The NCCL backend (groups/nccl/) on a real CUDA device.
 *
 * Without a GPU every GPU test skips with one line ("no CUDA GPU on this
 * machine: NCCL tests skipped ..."); the two tests of the paths that need no
 * GPU (the "no CUDA device" error, and the missing-rendezvous error) run
 * everywhere.
 *
 * On a GPU:
 *  - the public API on a world of one rank (mesh "dp=1"): every collective
 *    of a size-1 group is the backend's `local` op (a copy on the stream, or
 *    the PTX scale kernel for a scaled sum);
 *  - the backend ops called directly on a one-rank NCCL world communicator,
 *    so that ncclAllReduce & co. really run: every dtype and op, broadcast,
 *    all_gather, reduce_scatter, barrier, async test/wait, an explicit
 *    stream, split, abort;
 *  - two ranks as two threads sharing a caller-made unique id (one per GPU
 *    when there are two; on one GPU NCCL refuses two ranks per device and
 *    the test skips saying so).
 *
 * Run on a GPU machine:
 *   meson setup build-nccl && ninja -C build-nccl &&
 *   meson test -C build-nccl test_nccl --print-errorlogs -v
 *   (or ./build-nccl/tests/groups/test_nccl --verbose to see each
 *   cr_log_info line of what ran on the GPU). */
#include <criterion/criterion.h>
#include <criterion/logging.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "meshpg.h"
/* The backend interface, to drive the NCCL backend itself on one rank. */
#include "../../groups/backend.h"

/* ------------------------------------------------------------------------ */
/* Helpers                                                                   */
/* ------------------------------------------------------------------------ */

static int gpu_count(cudaError_t *err) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (err) *err = e;
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

/* Every GPU test starts here: skip with one clear line without a GPU. */
static int require_gpu(void) {
  cudaError_t e;
  int n = gpu_count(&e);
  if (n < 1)
    cr_skip_test("no CUDA GPU on this machine: NCCL tests skipped "
                 "(cudaGetDeviceCount: %s)",
                 e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
  return n;
}

#define EXPECT_OK(expr)                                                        \
  do {                                                                         \
    mpg_status st_ = (expr);                                                   \
    cr_assert_eq(st_, MPG_OK, "%s: %s: %s", #expr, mpg_status_name(st_),       \
                 mpg_last_error());                                            \
  } while (0)

#define CUDA_OK(expr)                                                          \
  do {                                                                         \
    cudaError_t e_ = (expr);                                                   \
    cr_assert_eq(e_, cudaSuccess, "%s: %s", #expr, cudaGetErrorString(e_));    \
  } while (0)

static const mpg_dtype all_dtypes[] = {MPG_F32, MPG_F64, MPG_F16,
                                       MPG_BF16, MPG_I32, MPG_I64};
static const mpg_op all_ops[] = {MPG_OP_SUM, MPG_OP_AVG, MPG_OP_MAX,
                                 MPG_OP_MIN};
static const char *const op_names[] = {"sum", "avg", "max", "min",
                                       "premul_sum"};

/* Element i of a host buffer of dtype dt, as a double (and back). */
static double get(mpg_dtype dt, const void *buf, size_t i) {
  switch (dt) {
    case MPG_F32: return ((const float *)buf)[i];
    case MPG_F64: return ((const double *)buf)[i];
    case MPG_F16:
    case MPG_BF16: return mpg__half_to_f32(dt, ((const uint16_t *)buf)[i]);
    case MPG_I32: return ((const int32_t *)buf)[i];
    case MPG_I64: return (double)((const int64_t *)buf)[i];
  }
  return NAN;
}

static void put(mpg_dtype dt, void *buf, size_t i, double v) {
  switch (dt) {
    case MPG_F32: ((float *)buf)[i] = (float)v; break;
    case MPG_F64: ((double *)buf)[i] = v; break;
    case MPG_F16:
    case MPG_BF16: ((uint16_t *)buf)[i] = mpg__f32_to_half(dt, (float)v); break;
    case MPG_I32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case MPG_I64: ((int64_t *)buf)[i] = (int64_t)v; break;
  }
}

/* Small integers, exact in every dtype, negative ones included. */
static double pattern(size_t i, int rank) { return (double)((int)(i % 7) - 3 + rank); }

/* A device buffer of n elements filled with pattern(i, rank). */
static void *dev_fill(mpg_dtype dt, size_t n, int rank) {
  size_t bytes = n * mpg_dtype_size(dt);
  void *host = malloc(bytes ? bytes : 1);
  cr_assert_not_null(host);
  for (size_t i = 0; i < n; i++) put(dt, host, i, pattern(i, rank));
  void *dev = NULL;
  CUDA_OK(cudaMalloc(&dev, bytes ? bytes : 1));
  CUDA_OK(cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice));
  free(host);
  return dev;
}

static void *dev_zero(mpg_dtype dt, size_t n) {
  size_t bytes = n * mpg_dtype_size(dt);
  void *dev = NULL;
  CUDA_OK(cudaMalloc(&dev, bytes ? bytes : 1));
  CUDA_OK(cudaMemset(dev, 0, bytes ? bytes : 1));
  return dev;
}

/* Copy n elements back (after the whole device finished) and compare each
 * with want(i); `what` names the case. */
static void expect_dev(const char *what, mpg_dtype dt, const void *dev,
                       size_t n, double (*want)(size_t i, void *arg),
                       void *arg) {
  size_t bytes = n * mpg_dtype_size(dt);
  CUDA_OK(cudaDeviceSynchronize());
  void *host = malloc(bytes ? bytes : 1);
  cr_assert_not_null(host);
  CUDA_OK(cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < n; i++) {
    double got = get(dt, host, i), exp = want(i, arg);
    cr_assert(got == exp, "%s (%s): element %zu is %g, want %g", what,
              mpg_dtype_name(dt), i, got, exp);
  }
  free(host);
}

/* Expected values on a world of `nranks` ranks where rank r contributed
 * pattern(i, r). */
typedef struct {
  mpg_dtype dt;
  mpg_op op;
  int nranks;
  double scale;
  size_t offset; /* reduce_scatter: first element of this rank's block */
} expect_arg;

static double want_reduce(size_t i, void *p) {
  const expect_arg *a = p;
  size_t j = i + a->offset;
  double sum = 0, mx = -1e300, mn = 1e300;
  for (int r = 0; r < a->nranks; r++) {
    double v = pattern(j, r);
    sum += v;
    mx = v > mx ? v : mx;
    mn = v < mn ? v : mn;
  }
  switch (a->op) {
    case MPG_OP_SUM: return sum;
    case MPG_OP_MAX: return mx;
    case MPG_OP_MIN: return mn;
    case MPG_OP_AVG:
      if (a->dt == MPG_I32 || a->dt == MPG_I64) return (double)((long)sum / a->nranks);
      return sum / a->nranks;
    case MPG_OP_PREMUL_SUM: return sum * a->scale;
  }
  return NAN;
}

static double want_pattern0(size_t i, void *p) {
  (void)p;
  return pattern(i, 0);
}

/* The one-rank world communicator of the NCCL backend, made directly. */
static mpg__comm *backend_world1(void) {
  mpg__world_args a;
  memset(&a, 0, sizeof a);
  a.rank = 0;
  a.world_size = 1;
  a.local_rank = 0;
  a.local_world_size = 1;
  a.timeout_s = 60;
  a.device = 0;
  a.nccl_id = NULL;
  a.master_addr = "";
  a.master_port = -1;
  mpg__comm *world = NULL;
  EXPECT_OK(mpg__backend_nccl.world_init(&a, &world));
  cr_assert_not_null(world);
  return world;
}

/* post + wait + req_free through the backend ops. */
static mpg_status backend_run(mpg__comm *c, const mpg__coll *k) {
  mpg__req *req = NULL;
  mpg_status st = mpg__backend_nccl.post(c, k, &req);
  if (st) return st;
  cr_assert_not_null(req);
  st = mpg__backend_nccl.wait(req, mpg__now() + 60);
  mpg__backend_nccl.req_free(req);
  return st;
}

static mpg__coll coll_of(mpg__coll_kind kind, const void *send, void *recv,
                         size_t count, mpg_dtype dt, mpg_op op, void *stream) {
  mpg__coll k;
  memset(&k, 0, sizeof k);
  k.kind = kind;
  k.send = send;
  k.recv = recv;
  k.count = count;
  k.dtype = dt;
  k.op = op;
  k.scale = 1.0;
  k.stream = stream;
  return k;
}

static void log_device(void) {
  int dev = -1;
  struct cudaDeviceProp prop;
  int ver = 0;
  cudaGetDevice(&dev);
  ncclGetVersion(&ver);
  if (cudaGetDeviceProperties(&prop, dev) == cudaSuccess)
    cr_log_info("GPU %d: %s (sm_%d%d), NCCL %d", dev, prop.name, prop.major,
                prop.minor, ver);
}

/* ------------------------------------------------------------------------ */
/* Paths that need no GPU                                                    */
/* ------------------------------------------------------------------------ */

Test(nccl_nogpu, world_init_reports_missing_device) {
  if (gpu_count(NULL) > 0)
    cr_skip_test("a CUDA GPU is present: the no-device error path cannot be "
                 "shown here");
  mpg__world_args a;
  memset(&a, 0, sizeof a);
  a.world_size = 1;
  a.timeout_s = 5;
  a.device = -1;
  a.master_addr = "";
  a.master_port = -1;
  mpg__comm *w = (mpg__comm *)0x1;
  mpg_status st = mpg__backend_nccl.world_init(&a, &w);
  cr_assert_eq(st, MPG_ERR_UNSUPPORTED, "got %s: %s", mpg_status_name(st),
               mpg_last_error());
  cr_assert_null(w);
  cr_assert(strstr(mpg_last_error(), "no CUDA device"), "message: %s",
            mpg_last_error());
  cr_assert(strstr(mpg_last_error(), "cudaGetDeviceCount"), "message: %s",
            mpg_last_error());

  /* The same through the public API. */
  mpg_spec spec = MPG_SPEC_INIT;
  EXPECT_OK(mpg_spec_init(&spec));
  EXPECT_OK(mpg_spec_set_mesh(&spec, "dp=1"));
  mpg_mesh *mesh = NULL;
  EXPECT_OK(mpg_mesh_create(&spec, 1, &mesh));
  mpg_init_opts o = MPG_INIT_OPTS_INIT;
  o.backend = MPG_BACKEND_NCCL;
  o.rank = 0;
  o.world_size = 1;
  o.device = 0;
  mpg_ctx *ctx = (mpg_ctx *)0x1;
  st = mpg_ctx_create(mesh, &o, &ctx);
  cr_assert_eq(st, MPG_ERR_UNSUPPORTED, "got %s: %s", mpg_status_name(st),
               mpg_last_error());
  cr_assert_null(ctx);
  cr_assert(strstr(mpg_last_error(), "no CUDA device"), "message: %s",
            mpg_last_error());
  mpg_mesh_destroy(mesh);
}

Test(nccl_nogpu, missing_rendezvous_names_master_addr) {
  /* A world of two without an id, MPI or MASTER_ADDR: refused before any
   * CUDA or network call. */
  unsetenv("NCCL_COMM_ID");
  unsetenv("MASTER_ADDR");
  unsetenv("MASTER_PORT");
  unsetenv("OMPI_COMM_WORLD_SIZE");
  mpg__world_args a;
  memset(&a, 0, sizeof a);
  a.rank = 1;
  a.world_size = 2;
  a.local_rank = 1;
  a.local_world_size = 2;
  a.timeout_s = 5;
  a.device = -1;
  a.master_addr = "";
  a.master_port = -1;
  mpg__comm *w = (mpg__comm *)0x1;
  mpg_status st = mpg__backend_nccl.world_init(&a, &w);
  cr_assert_eq(st, MPG_ERR_ENV, "got %s: %s", mpg_status_name(st),
               mpg_last_error());
  cr_assert_null(w);
  cr_assert(strstr(mpg_last_error(), "MASTER_ADDR") &&
                strstr(mpg_last_error(), "MASTER_PORT"),
            "message: %s", mpg_last_error());
}

/* ------------------------------------------------------------------------ */
/* Public API, world of one rank                                             */
/* ------------------------------------------------------------------------ */

typedef struct {
  mpg_mesh *mesh;
  mpg_ctx *ctx;
  mpg_group *dp, *world;
} world1;

static world1 public_world1(void) {
  world1 w;
  memset(&w, 0, sizeof w);
  mpg_spec spec = MPG_SPEC_INIT;
  EXPECT_OK(mpg_spec_init(&spec));
  EXPECT_OK(mpg_spec_set_mesh(&spec, "dp=1"));
  EXPECT_OK(mpg_mesh_create(&spec, 1, &w.mesh));
  mpg_init_opts o = MPG_INIT_OPTS_INIT;
  o.backend = MPG_BACKEND_NCCL;
  o.rank = 0;
  o.world_size = 1;
  o.local_rank = 0;
  o.device = 0;
  o.timeout_s = 60;
  EXPECT_OK(mpg_ctx_create(w.mesh, &o, &w.ctx));
  cr_assert_eq(mpg_ctx_backend(w.ctx), MPG_BACKEND_NCCL);
  EXPECT_OK(mpg_ctx_group(w.ctx, "dp", &w.dp));
  EXPECT_OK(mpg_ctx_group(w.ctx, "world", &w.world));
  cr_assert_eq(mpg_group_size(w.dp), 1);
  return w;
}

static void world1_free(world1 *w) {
  EXPECT_OK(mpg_ctx_destroy(w->ctx));
  mpg_mesh_destroy(w->mesh);
}

Test(nccl_public, world1_all_reduce_every_dtype_and_op) {
  require_gpu();
  log_device();
  world1 w = public_world1();
  const size_t n = 1000;
  for (size_t d = 0; d < sizeof all_dtypes / sizeof *all_dtypes; d++) {
    mpg_dtype dt = all_dtypes[d];
    for (size_t o = 0; o < sizeof all_ops / sizeof *all_ops; o++) {
      void *send = dev_fill(dt, n, 0), *recv = dev_zero(dt, n);
      EXPECT_OK(mpg_all_reduce(w.dp, send, recv, n, dt, all_ops[o], NULL, NULL));
      expect_arg a = {dt, all_ops[o], 1, 1.0, 0};
      char what[64];
      snprintf(what, sizeof what, "public all_reduce %s", op_names[all_ops[o]]);
      expect_dev(what, dt, recv, n, want_reduce, &a);
      /* In place. */
      EXPECT_OK(mpg_all_reduce(w.world, send, send, n, dt, all_ops[o], NULL, NULL));
      expect_dev(what, dt, send, n, want_reduce, &a);
      cudaFree(send);
      cudaFree(recv);
    }
    if (dt == MPG_I32 || dt == MPG_I64) {
      void *buf = dev_fill(dt, n, 0);
      mpg_status st = mpg_all_reduce_scaled(w.dp, buf, buf, n, dt, 0.5, NULL, NULL);
      cr_assert_eq(st, MPG_ERR_INVALID, "scaled %s: %s", mpg_dtype_name(dt),
                   mpg_status_name(st));
      cudaFree(buf);
      continue;
    }
    /* The scaled sum runs the backend's PTX kernel on a size-1 group. */
    void *send = dev_fill(dt, n, 0), *recv = dev_zero(dt, n);
    EXPECT_OK(mpg_all_reduce_scaled(w.dp, send, recv, n, dt, 0.5, NULL, NULL));
    expect_arg a = {dt, MPG_OP_PREMUL_SUM, 1, 0.5, 0};
    expect_dev("public all_reduce_scaled 0.5", dt, recv, n, want_reduce, &a);
    EXPECT_OK(mpg_all_reduce_scaled(w.dp, send, send, n, dt, 0.5, NULL, NULL));
    expect_dev("public all_reduce_scaled 0.5 in place", dt, send, n, want_reduce, &a);
    cudaFree(send);
    cudaFree(recv);
  }
  cr_log_info("public API, world of 1: all_reduce sum/avg/max/min/scaled x "
              "f32/f64/f16/bf16/i32/i64 checked on the GPU");
  world1_free(&w);
}

Test(nccl_public, world1_other_collectives_async_and_stream) {
  require_gpu();
  world1 w = public_world1();
  const size_t n = 513;
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  for (size_t d = 0; d < sizeof all_dtypes / sizeof *all_dtypes; d++) {
    mpg_dtype dt = all_dtypes[d];
    void *a = dev_fill(dt, n, 0), *b = dev_zero(dt, n);
    EXPECT_OK(mpg_broadcast(w.dp, a, n, dt, 0, s, NULL));
    EXPECT_OK(mpg_all_gather(w.dp, a, b, n, dt, s, NULL));
    CUDA_OK(cudaStreamSynchronize(s));
    expect_dev("public all_gather", dt, b, n, want_pattern0, NULL);
    CUDA_OK(cudaMemset(b, 0, n * mpg_dtype_size(dt)));
    mpg_work *work = (mpg_work *)0x1;
    EXPECT_OK(mpg_reduce_scatter(w.dp, a, b, n, dt, MPG_OP_SUM, s, &work));
    int done = 0;
    EXPECT_OK(mpg_work_test(work, &done));
    cr_assert_eq(done, 1);
    EXPECT_OK(mpg_work_wait(work));
    CUDA_OK(cudaStreamSynchronize(s));
    expect_dev("public reduce_scatter", dt, b, n, want_pattern0, NULL);
    cudaFree(a);
    cudaFree(b);
  }
  EXPECT_OK(mpg_barrier(w.dp, NULL));
  EXPECT_OK(mpg_barrier(w.world, NULL));
  int peer_buf = 0;
  cr_assert_eq(mpg_send(w.dp, &peer_buf, 1, MPG_I32, 0, NULL, NULL), MPG_ERR_INVALID);
  cudaStreamDestroy(s);
  cr_log_info("public API, world of 1: broadcast, all_gather, reduce_scatter "
              "(async, explicit stream), barrier checked on the GPU");
  world1_free(&w);
}

/* ------------------------------------------------------------------------ */
/* The backend itself on a one-rank NCCL communicator                        */
/* ------------------------------------------------------------------------ */

Test(nccl_backend, world1_all_reduce_every_dtype_and_op) {
  require_gpu();
  log_device();
  mpg__comm *c = backend_world1();
  const size_t n = 4099;
  for (size_t d = 0; d < sizeof all_dtypes / sizeof *all_dtypes; d++) {
    mpg_dtype dt = all_dtypes[d];
    for (size_t o = 0; o < sizeof all_ops / sizeof *all_ops; o++) {
      void *send = dev_fill(dt, n, 0), *recv = dev_zero(dt, n);
      mpg__coll k = coll_of(MPG__ALL_REDUCE, send, recv, n, dt, all_ops[o], NULL);
      EXPECT_OK(backend_run(c, &k));
      expect_arg a = {dt, all_ops[o], 1, 1.0, 0};
      char what[64];
      snprintf(what, sizeof what, "ncclAllReduce %s", op_names[all_ops[o]]);
      expect_dev(what, dt, recv, n, want_reduce, &a);
      cudaFree(send);
      cudaFree(recv);
    }
    if (dt == MPG_I32 || dt == MPG_I64) continue;
    void *send = dev_fill(dt, n, 0), *recv = dev_zero(dt, n);
    mpg__coll k = coll_of(MPG__ALL_REDUCE, send, recv, n, dt, MPG_OP_PREMUL_SUM, NULL);
    k.scale = 0.25;
    EXPECT_OK(backend_run(c, &k));
    expect_arg a = {dt, MPG_OP_PREMUL_SUM, 1, 0.25, 0};
    expect_dev("ncclAllReduce premul_sum 0.25", dt, recv, n, want_reduce, &a);
    cudaFree(send);
    cudaFree(recv);
  }
  cr_log_info("backend direct, 1-rank NCCL comm: ncclAllReduce sum/avg/max/"
              "min/premul_sum x 6 dtypes checked");
  EXPECT_OK(mpg__backend_nccl.destroy(c));
}

Test(nccl_backend, world1_collectives_async_stream_split_abort) {
  require_gpu();
  mpg__comm *c = backend_world1();
  const size_t n = 1 << 16;
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  for (size_t d = 0; d < sizeof all_dtypes / sizeof *all_dtypes; d++) {
    mpg_dtype dt = all_dtypes[d];
    void *a = dev_fill(dt, n, 0), *b = dev_zero(dt, n);
    mpg__coll k = coll_of(MPG__BROADCAST, a, a, n, dt, MPG_OP_SUM, s);
    EXPECT_OK(backend_run(c, &k));
    k = coll_of(MPG__ALL_GATHER, a, b, n, dt, MPG_OP_SUM, s);
    EXPECT_OK(backend_run(c, &k));
    expect_dev("ncclAllGather", dt, b, n, want_pattern0, NULL);
    CUDA_OK(cudaMemset(b, 0, n * mpg_dtype_size(dt)));
    /* Async on an explicit stream: post, test until done, wait. */
    k = coll_of(MPG__REDUCE_SCATTER, a, b, n, dt, MPG_OP_MAX, s);
    mpg__req *req = NULL;
    EXPECT_OK(mpg__backend_nccl.post(c, &k, &req));
    int done = 0;
    double until = mpg__now() + 60;
    while (!done && mpg__now() < until) EXPECT_OK(mpg__backend_nccl.test(req, &done));
    cr_assert_eq(done, 1, "reduce_scatter never completed");
    EXPECT_OK(mpg__backend_nccl.wait(req, mpg__now() + 60));
    mpg__backend_nccl.req_free(req);
    expect_dev("ncclReduceScatter (async, stream)", dt, b, n, want_pattern0, NULL);
    cudaFree(a);
    cudaFree(b);
  }
  mpg__coll bar = coll_of(MPG__BARRIER, NULL, NULL, 0, MPG_I32, MPG_OP_SUM, NULL);
  EXPECT_OK(backend_run(c, &bar));
  EXPECT_OK(backend_run(c, &bar));
  cr_log_info("backend direct: ncclBroadcast, ncclAllGather, ncclReduceScatter "
              "(async on a stream), barrier checked");

  /* Split: colour 0 gives a one-rank child that works; NOCOLOR gives none. */
  mpg__comm *child = (mpg__comm *)0x1, *none = (mpg__comm *)0x1;
  EXPECT_OK(mpg__backend_nccl.split(c, 0, 0, &child));
  cr_assert_not_null(child);
  EXPECT_OK(mpg__backend_nccl.split(c, -1, 0, &none));
  cr_assert_null(none);
  void *x = dev_fill(MPG_F32, 100, 0), *y = dev_zero(MPG_F32, 100);
  mpg__coll k = coll_of(MPG__ALL_REDUCE, x, y, 100, MPG_F32, MPG_OP_SUM, NULL);
  EXPECT_OK(backend_run(child, &k));
  expect_dev("ncclAllReduce on a split child", MPG_F32, y, 100, want_pattern0, NULL);
  cr_log_info("backend direct: ncclCommSplit colour 0 -> working child, "
              "NCCL_SPLIT_NOCOLOR -> no communicator");

  /* Abort: every later post fails with MPG_ERR_ABORTED; destroy still works. */
  mpg__backend_nccl.abort_comm(child, MPG_ERR_ABORTED);
  mpg__backend_nccl.abort_comm(c, MPG_ERR_ABORTED);
  mpg__req *req = (mpg__req *)0x1;
  mpg_status st = mpg__backend_nccl.post(c, &k, &req);
  cr_assert_eq(st, MPG_ERR_ABORTED, "post after abort: %s", mpg_status_name(st));
  cr_assert_null(req);
  st = mpg__backend_nccl.post(child, &k, &req);
  cr_assert_eq(st, MPG_ERR_ABORTED, "post on child after abort: %s",
               mpg_status_name(st));
  EXPECT_OK(mpg__backend_nccl.destroy(child));
  EXPECT_OK(mpg__backend_nccl.destroy(c));
  cudaFree(x);
  cudaFree(y);
  cudaStreamDestroy(s);
  cr_log_info("backend direct: abort then post -> MPG_ERR_ABORTED; destroy ok");
}

Test(nccl_backend, request_outlives_destroy_and_finalize_is_clean) {
  require_gpu();
  mpg__comm *c = backend_world1();
  void *x = dev_fill(MPG_F64, 64, 0);
  mpg__coll k = coll_of(MPG__ALL_REDUCE, x, x, 64, MPG_F64, MPG_OP_SUM, NULL);
  mpg__req *req = NULL;
  EXPECT_OK(mpg__backend_nccl.post(c, &k, &req));
  EXPECT_OK(mpg__backend_nccl.wait(req, mpg__now() + 60));
  /* Destroy first, free the request after: the request keeps what it needs. */
  EXPECT_OK(mpg__backend_nccl.destroy(c));
  mpg__backend_nccl.req_free(req);
  cudaFree(x);
}

/* ------------------------------------------------------------------------ */
/* Two ranks as two threads with a caller-made unique id                     */
/* ------------------------------------------------------------------------ */

typedef struct {
  int rank, ndev;
  const ncclUniqueId *id;
  mpg_mesh *mesh;
  mpg_status create_st;
  char create_msg[1024];
  char fail[1024]; /* first failed check after create, "" if none */
} rank_job;

#define JOB_CHECK(job, cond, ...)                                              \
  do {                                                                         \
    if (!(cond) && !(job)->fail[0])                                            \
      snprintf((job)->fail, sizeof (job)->fail, __VA_ARGS__);                  \
  } while (0)

static void job_expect(rank_job *j, const char *what, mpg_dtype dt,
                       const void *dev, size_t n, double (*want)(size_t, void *),
                       void *arg) {
  size_t bytes = n * mpg_dtype_size(dt);
  void *host = malloc(bytes);
  if (!host || cudaDeviceSynchronize() != cudaSuccess ||
      cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost) != cudaSuccess) {
    JOB_CHECK(j, 0, "rank %d: %s: copy back failed", j->rank, what);
    free(host);
    return;
  }
  for (size_t i = 0; i < n; i++) {
    double got = get(dt, host, i), exp = want(i, arg);
    JOB_CHECK(j, got == exp, "rank %d: %s (%s): element %zu is %g, want %g",
              j->rank, what, mpg_dtype_name(dt), i, got, exp);
  }
  free(host);
}

static double want_bcast1(size_t i, void *p) {
  (void)p;
  return pattern(i, 1);
}

static double want_gather2(size_t i, void *p) {
  size_t n = *(size_t *)p;
  return pattern(i % n, (int)(i / n));
}

#define JOB_OK(job, expr)                                                      \
  do {                                                                         \
    mpg_status st_ = (expr);                                                   \
    JOB_CHECK(job, st_ == MPG_OK, "rank %d: %s: %s: %s", (job)->rank, #expr,   \
              mpg_status_name(st_), mpg_last_error());                         \
  } while (0)

static void *rank_main(void *p) {
  rank_job *j = p;
  mpg_init_opts o = MPG_INIT_OPTS_INIT;
  o.backend = MPG_BACKEND_NCCL;
  o.rank = j->rank;
  o.world_size = 2;
  o.local_rank = j->rank;
  o.local_world_size = 2;
  o.device = j->rank % j->ndev;
  o.nccl_id = j->id;
  o.timeout_s = 60;
  mpg_ctx *ctx = NULL;
  j->create_st = mpg_ctx_create(j->mesh, &o, &ctx);
  if (j->create_st != MPG_OK) {
    snprintf(j->create_msg, sizeof j->create_msg, "%s", mpg_last_error());
    return NULL;
  }
  mpg_group *dp = NULL;
  JOB_OK(j, mpg_ctx_group(ctx, "dp", &dp));
  if (!dp) {
    mpg_ctx_destroy(ctx);
    return NULL;
  }
  const size_t n = 1 << 12;
  for (size_t d = 0; d < sizeof all_dtypes / sizeof *all_dtypes; d++) {
    mpg_dtype dt = all_dtypes[d];
    for (size_t q = 0; q < sizeof all_ops / sizeof *all_ops; q++) {
      void *send = dev_fill(dt, n, j->rank), *recv = dev_zero(dt, n);
      JOB_OK(j, mpg_all_reduce(dp, send, recv, n, dt, all_ops[q], NULL, NULL));
      expect_arg a = {dt, all_ops[q], 2, 1.0, 0};
      job_expect(j, op_names[all_ops[q]], dt, recv, n, want_reduce, &a);
      cudaFree(send);
      cudaFree(recv);
    }
    if (dt != MPG_I32 && dt != MPG_I64) {
      void *buf = dev_fill(dt, n, j->rank);
      mpg_work *w = NULL;
      JOB_OK(j, mpg_all_reduce_scaled(dp, buf, buf, n, dt, 0.5, NULL, &w));
      JOB_OK(j, mpg_work_wait(w));
      expect_arg a = {dt, MPG_OP_PREMUL_SUM, 2, 0.5, 0};
      job_expect(j, "scaled 0.5 (async)", dt, buf, n, want_reduce, &a);
      cudaFree(buf);
    }
  }
  /* broadcast from position 1, all_gather, reduce_scatter, send/recv. */
  void *b = dev_fill(MPG_F32, n, j->rank);
  JOB_OK(j, mpg_broadcast(dp, b, n, MPG_F32, 1, NULL, NULL));
  job_expect(j, "broadcast root 1", MPG_F32, b, n, want_bcast1, NULL);
  void *g = dev_zero(MPG_F32, 2 * n), *s = dev_fill(MPG_F32, n, j->rank);
  size_t nn = n;
  JOB_OK(j, mpg_all_gather(dp, s, g, n, MPG_F32, NULL, NULL));
  job_expect(j, "all_gather", MPG_F32, g, 2 * n, want_gather2, &nn);
  void *rs_in = dev_fill(MPG_F32, 2 * n, j->rank), *rs_out = dev_zero(MPG_F32, n);
  JOB_OK(j, mpg_reduce_scatter(dp, rs_in, rs_out, n, MPG_F32, MPG_OP_SUM, NULL, NULL));
  expect_arg ra = {MPG_F32, MPG_OP_SUM, 2, 1.0, (size_t)j->rank * n};
  job_expect(j, "reduce_scatter", MPG_F32, rs_out, n, want_reduce, &ra);
  JOB_OK(j, mpg_barrier(dp, NULL));
  void *p2p = j->rank == 0 ? dev_fill(MPG_I64, n, 0) : dev_zero(MPG_I64, n);
  if (j->rank == 0)
    JOB_OK(j, mpg_send(dp, p2p, n, MPG_I64, 1, NULL, NULL));
  else
    JOB_OK(j, mpg_recv(dp, p2p, n, MPG_I64, 0, NULL, NULL));
  job_expect(j, "send/recv", MPG_I64, p2p, n, want_pattern0, NULL);
  cudaFree(b);
  cudaFree(g);
  cudaFree(s);
  cudaFree(rs_in);
  cudaFree(rs_out);
  cudaFree(p2p);
  JOB_OK(j, mpg_ctx_destroy(ctx));
  return NULL;
}

Test(nccl_two_ranks, threads_with_caller_unique_id, .timeout = 300) {
  int ndev = require_gpu();
  ncclUniqueId id;
  ncclResult_t r = ncclGetUniqueId(&id);
  cr_assert_eq(r, ncclSuccess, "ncclGetUniqueId: %s", ncclGetErrorString(r));
  mpg_spec spec = MPG_SPEC_INIT;
  EXPECT_OK(mpg_spec_init(&spec));
  EXPECT_OK(mpg_spec_set_mesh(&spec, "dp=2"));
  mpg_mesh *mesh = NULL;
  EXPECT_OK(mpg_mesh_create(&spec, 2, &mesh));
  rank_job jobs[2];
  pthread_t th[2];
  for (int i = 0; i < 2; i++) {
    memset(&jobs[i], 0, sizeof jobs[i]);
    jobs[i].rank = i;
    jobs[i].ndev = ndev;
    jobs[i].id = &id;
    jobs[i].mesh = mesh;
    cr_assert_eq(pthread_create(&th[i], NULL, rank_main, &jobs[i]), 0);
  }
  for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
  mpg_mesh_destroy(mesh);
  if (ndev == 1 && (jobs[0].create_st != MPG_OK || jobs[1].create_st != MPG_OK)) {
    const char *msg = jobs[0].create_st ? jobs[0].create_msg : jobs[1].create_msg;
    cr_skip_test("NCCL refused two ranks on one GPU (%s); the two-rank test "
                 "needs two GPUs: %s",
                 mpg_status_name(jobs[0].create_st ? jobs[0].create_st
                                                   : jobs[1].create_st),
                 msg);
  }
  for (int i = 0; i < 2; i++) {
    cr_assert_eq(jobs[i].create_st, MPG_OK, "rank %d: mpg_ctx_create: %s: %s", i,
                 mpg_status_name(jobs[i].create_st), jobs[i].create_msg);
    cr_assert(jobs[i].fail[0] == '\0', "%s", jobs[i].fail);
  }
  cr_log_info("two ranks (threads, %s): every dtype/op all_reduce, scaled, "
              "broadcast, all_gather, reduce_scatter, barrier, send/recv "
              "checked",
              ndev > 1 ? "GPUs 0 and 1" : "one GPU");
}

/* NCCL's own rendezvous: no id from the caller, MASTER_ADDR/MASTER_PORT in
 * the environment, so the backend sets NCCL_COMM_ID for the id and init
 * calls.  With two GPUs the world comes up; with one, NCCL's duplicate-GPU
 * check (which runs after every rank has met at the root) refuses it, which
 * still shows that the rendezvous itself worked. */
typedef struct {
  int rank, ndev;
  mpg_mesh *mesh;
  mpg_status st;
  char msg[1024];
} rdv_job;

static void *rdv_main(void *p) {
  rdv_job *j = p;
  mpg_init_opts o = MPG_INIT_OPTS_INIT;
  o.backend = MPG_BACKEND_NCCL;
  o.rank = j->rank;
  o.world_size = 2;
  o.local_rank = j->rank;
  o.local_world_size = 2;
  o.device = j->rank % j->ndev;
  o.timeout_s = 30;
  mpg_ctx *ctx = NULL;
  j->st = mpg_ctx_create(j->mesh, &o, &ctx);
  snprintf(j->msg, sizeof j->msg, "%s", j->st ? mpg_last_error() : "");
  if (ctx) {
    mpg_group *dp = NULL;
    if (mpg_ctx_group(ctx, "dp", &dp) == MPG_OK) {
      void *x = dev_fill(MPG_F32, 256, j->rank);
      mpg_status st = mpg_all_reduce(dp, x, x, 256, MPG_F32, MPG_OP_SUM, NULL, NULL);
      if (st && !j->st) {
        j->st = st;
        snprintf(j->msg, sizeof j->msg, "all_reduce: %s", mpg_last_error());
      }
      cudaFree(x);
    }
    mpg_status st = mpg_ctx_destroy(ctx);
    if (st && !j->st) {
      j->st = st;
      snprintf(j->msg, sizeof j->msg, "destroy: %s", mpg_last_error());
    }
  }
  return NULL;
}

Test(nccl_two_ranks, rendezvous_from_master_addr, .timeout = 120) {
  int ndev = require_gpu();
  char port[16];
  snprintf(port, sizeof port, "%d", 20000 + (int)(getpid() % 20000));
  unsetenv("NCCL_COMM_ID");
  unsetenv("OMPI_COMM_WORLD_SIZE");
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", port, 1);
  mpg_spec spec = MPG_SPEC_INIT;
  EXPECT_OK(mpg_spec_init(&spec));
  EXPECT_OK(mpg_spec_set_mesh(&spec, "dp=2"));
  mpg_mesh *mesh = NULL;
  EXPECT_OK(mpg_mesh_create(&spec, 2, &mesh));
  rdv_job jobs[2];
  pthread_t th[2];
  for (int i = 0; i < 2; i++) {
    memset(&jobs[i], 0, sizeof jobs[i]);
    jobs[i].rank = i;
    jobs[i].ndev = ndev;
    jobs[i].mesh = mesh;
    cr_assert_eq(pthread_create(&th[i], NULL, rdv_main, &jobs[i]), 0);
  }
  for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
  mpg_mesh_destroy(mesh);
  cr_assert_null(getenv("NCCL_COMM_ID"),
                 "NCCL_COMM_ID was left set to %s", getenv("NCCL_COMM_ID"));
  for (int i = 0; i < 2; i++) {
    cr_assert(strstr(jobs[i].msg, "MASTER_ADDR=127.0.0.1") || jobs[i].st == MPG_OK,
              "rank %d: %s: %s", i, mpg_status_name(jobs[i].st), jobs[i].msg);
    if (ndev == 1) {
      /* Refused after the rendezvous: invalid usage, not a timeout. */
      cr_assert_eq(jobs[i].st, MPG_ERR_BACKEND, "rank %d: %s: %s", i,
                   mpg_status_name(jobs[i].st), jobs[i].msg);
      cr_assert(strstr(jobs[i].msg, "invalid usage"), "rank %d: %s", i, jobs[i].msg);
    } else {
      cr_assert_eq(jobs[i].st, MPG_OK, "rank %d: %s: %s", i,
                   mpg_status_name(jobs[i].st), jobs[i].msg);
    }
  }
  cr_log_info("rendezvous via NCCL_COMM_ID=127.0.0.1:%s reached both ranks%s",
              port, ndev == 1 ? " (then NCCL refused two ranks on one GPU, as expected)"
                              : " and all_reduce ran");
}

/* A peer that never arrives: init gives MPG_ERR_TIMEOUT after the timeout
 * (the half-made communicator is aborted), never a hang. */
Test(nccl_timeout, world_init_peer_never_arrives, .timeout = 120) {
  require_gpu();
  ncclUniqueId id;
  ncclResult_t r = ncclGetUniqueId(&id);
  cr_assert_eq(r, ncclSuccess, "ncclGetUniqueId: %s", ncclGetErrorString(r));

  /* The backend alone, as rank 1 of 2. */
  mpg__world_args a;
  memset(&a, 0, sizeof a);
  a.rank = 1;
  a.world_size = 2;
  a.local_rank = 0;
  a.local_world_size = 1;
  a.timeout_s = 2;
  a.device = 0;
  a.nccl_id = &id;
  a.master_addr = "";
  a.master_port = -1;
  mpg__comm *w = (mpg__comm *)0x1;
  double t0 = mpg__now();
  mpg_status st = mpg__backend_nccl.world_init(&a, &w);
  double took = mpg__now() - t0;
  cr_assert_eq(st, MPG_ERR_TIMEOUT, "got %s: %s", mpg_status_name(st), mpg_last_error());
  cr_assert_null(w);
  cr_assert(strstr(mpg_last_error(), "not every rank connected"), "%s", mpg_last_error());
  cr_assert(took < 30, "world_init took %.1f s with a 2 s timeout", took);
  cr_log_info("backend world_init, rank 1 of 2 alone: MPG_ERR_TIMEOUT after %.2f s", took);

  /* The public API, as rank 0 of 2 with a fresh id. */
  cr_assert_eq(ncclGetUniqueId(&id), ncclSuccess);
  mpg_spec spec = MPG_SPEC_INIT;
  EXPECT_OK(mpg_spec_init(&spec));
  EXPECT_OK(mpg_spec_set_mesh(&spec, "dp=2"));
  mpg_mesh *mesh = NULL;
  EXPECT_OK(mpg_mesh_create(&spec, 2, &mesh));
  mpg_init_opts o = MPG_INIT_OPTS_INIT;
  o.backend = MPG_BACKEND_NCCL;
  o.rank = 0;
  o.world_size = 2;
  o.device = 0;
  o.nccl_id = &id;
  o.timeout_s = 2;
  mpg_ctx *ctx = (mpg_ctx *)0x1;
  t0 = mpg__now();
  st = mpg_ctx_create(mesh, &o, &ctx);
  took = mpg__now() - t0;
  cr_assert_eq(st, MPG_ERR_TIMEOUT, "got %s: %s", mpg_status_name(st), mpg_last_error());
  cr_assert_null(ctx);
  cr_assert(took < 30, "mpg_ctx_create took %.1f s with a 2 s timeout", took);
  mpg_mesh_destroy(mesh);
  cr_log_info("mpg_ctx_create, rank 0 of 2 alone: MPG_ERR_TIMEOUT after %.2f s (%s)",
              took, mpg_last_error());
}
