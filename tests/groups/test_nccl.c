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
 *    the PTX scale kernel for a scaled sum); mpg_p2p_batch's argument
 *    checks and n == 0 only, since a world of one has no peer;
 *  - the backend ops called directly on a one-rank NCCL world communicator,
 *    so that ncclAllReduce & co. really run: every dtype and op, broadcast,
 *    all_gather, reduce_scatter, barrier, async test/wait, an explicit
 *    stream, split, abort; post_batch as one NCCL group of sends to and
 *    receives from the rank itself;
 *  - two ranks as two threads sharing a caller-made unique id (one per GPU
 *    when there are two; on one GPU NCCL refuses two ranks per device and
 *    the test skips saying so), with a 64 MiB two-way mpg_p2p_batch.
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
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "meshpg.h"
/* The backend interface, to drive the NCCL backend itself on one rank. */
#include "../../groups/backend.h"
#include "../../groups/nccl/nccl_internal.h" /* registrations (reg.c) */
#include "groups_internal.h"     /* the f32acc collectives */

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

/* Every fill below ends with cudaDeviceSynchronize.  A cudaMemcpy from
 * pageable host memory may return once the source is staged, before the
 * device holds it, and cudaMemset may return before the memset ran (CUDA
 * Runtime API, "API synchronization behavior"); both run on the legacy
 * default stream, which does not order the cudaStreamNonBlocking streams
 * the collectives run on ("Stream synchronization behavior").  Without the
 * synchronisation a collective may read the buffer before the fill, or the
 * memset may land after the result: the failures the first H100 run
 * showed ("element 0 is 0, want -3"). */

/* A device buffer of n elements filled with pattern(i, rank). */
static void *dev_fill(mpg_dtype dt, size_t n, int rank) {
  size_t bytes = n * mpg_dtype_size(dt);
  void *host = malloc(bytes ? bytes : 1);
  cr_assert_not_null(host);
  for (size_t i = 0; i < n; i++) put(dt, host, i, pattern(i, rank));
  void *dev = NULL;
  CUDA_OK(cudaMalloc(&dev, bytes ? bytes : 1));
  CUDA_OK(cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice));
  CUDA_OK(cudaDeviceSynchronize());
  free(host);
  return dev;
}

static void *dev_zero(mpg_dtype dt, size_t n) {
  size_t bytes = n * mpg_dtype_size(dt);
  void *dev = NULL;
  CUDA_OK(cudaMalloc(&dev, bytes ? bytes : 1));
  CUDA_OK(cudaMemset(dev, 0, bytes ? bytes : 1));
  CUDA_OK(cudaDeviceSynchronize());
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
  switch ((int)a->op) {
    case MPG_OP_SUM: return sum;
    case MPG_OP_MAX: return mx;
    case MPG_OP_MIN: return mn;
    case MPG_OP_AVG:
      if (a->dt == MPG_I32 || a->dt == MPG_I64) return (double)((long)sum / a->nranks);
      return sum / a->nranks;
    case MPG__OP_PREMUL_SUM: return sum * a->scale;
  }
  return NAN;
}

static double want_pattern0(size_t i, void *p) {
  (void)p;
  return pattern(i, 0);
}

/* pattern(i, *(int *)p): what rank *p filled. */
static double want_pattern_of(size_t i, void *p) { return pattern(i, *(const int *)p); }

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

/* The backend's world_init as rank `rank` of `world` (local rank `rank` of
 * `local_world`, no device chosen, no NCCL id) with master_addr and
 * master_port, in a call that must fail before NCCL makes a communicator:
 * asserts that it leaves none and returns its status. */
static mpg_status nogpu_world_init(int rank, int world, int local_world,
                                   const char *master_addr, int master_port) {
  mpg__world_args a;
  memset(&a, 0, sizeof a);
  static mpg__settings set; /* the variables, as mpg_ctx_create reads them */
  mpg__settings_read(&set);
  a.settings = &set;
  a.rank = rank;
  a.world_size = world;
  a.local_rank = rank;
  a.local_world_size = local_world;
  a.timeout_s = 5;
  a.device = -1;
  a.master_addr = master_addr;
  a.master_port = master_port;
  mpg__comm *w = (mpg__comm *)0x1;
  mpg_status st = mpg__backend_nccl.world_init(&a, &w);
  cr_assert_null(w);
  return st;
}

Test(nccl_nogpu, world_init_reports_missing_device) {
  if (gpu_count(NULL) > 0)
    cr_skip_test("a CUDA GPU is present: the no-device error path cannot be "
                 "shown here");
  mpg_status st = nogpu_world_init(0, 1, 0, "", -1);
  cr_assert_eq(st, MPG_ERR_UNSUPPORTED, "got %s: %s", mpg_status_name(st),
               mpg_last_error());
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
  o.backend.name = MPG_BACKEND_NCCL;
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

Test(nccl_nogpu, empty_cuda_visible_devices_is_explained) {
  /* CUDA reads the variable at its first call, here in world_init (each
   * test is its own process), so this runs with or without a GPU. */
  setenv("CUDA_VISIBLE_DEVICES", "", 1);
  mpg_status st = nogpu_world_init(0, 1, 1, "", -1);
  cr_assert_eq(st, MPG_ERR_UNSUPPORTED, "got %s: %s", mpg_status_name(st),
               mpg_last_error());
  cr_assert(strstr(mpg_last_error(), "nccl: rank 0 of 1") &&
                strstr(mpg_last_error(), "CUDA_VISIBLE_DEVICES=\"\" hides every GPU"),
            "message: %s", mpg_last_error());
}

Test(nccl_nogpu, missing_rendezvous_names_master_addr) {
  /* A world of two without an id, MPI or MASTER_ADDR: refused before any
   * CUDA or network call. */
  unsetenv("NCCL_COMM_ID");
  unsetenv("MASTER_ADDR");
  unsetenv("MASTER_PORT");
  unsetenv("OMPI_COMM_WORLD_SIZE");
  mpg_status st = nogpu_world_init(1, 2, 2, "", -1);
  cr_assert_eq(st, MPG_ERR_ENV, "got %s: %s", mpg_status_name(st),
               mpg_last_error());
  cr_assert(strstr(mpg_last_error(), "MASTER_ADDR") &&
                strstr(mpg_last_error(), "MASTER_PORT"),
            "message: %s", mpg_last_error());
}

/* torchrun's store holds MASTER_PORT: NCCL's root goes to MESHPG_NCCL_PORT
 * or MASTER_PORT + 1, and a bad value of either is refused before any CUDA
 * or network call, naming the variable. */
static mpg_status master_boot(int port) {
  unsetenv("NCCL_COMM_ID");
  unsetenv("OMPI_COMM_WORLD_SIZE");
  return nogpu_world_init(1, 2, 2, "127.0.0.1", port);
}

Test(nccl_nogpu, master_port_fallback_never_takes_master_port) {
  setenv("MESHPG_NCCL_PORT", "70000", 1);
  cr_assert_eq(master_boot(29500), MPG_ERR_ENV);
  cr_assert(strstr(mpg_last_error(), "MESHPG_NCCL_PORT=\"70000\""), "%s", mpg_last_error());
  setenv("MESHPG_NCCL_PORT", "12x", 1);
  cr_assert_eq(master_boot(29500), MPG_ERR_ENV);
  unsetenv("MESHPG_NCCL_PORT");
  cr_assert_eq(master_boot(65535), MPG_ERR_ENV);
  cr_assert(strstr(mpg_last_error(), "MASTER_PORT=65535") &&
                strstr(mpg_last_error(), "MESHPG_NCCL_PORT"),
            "%s", mpg_last_error());
}

/* ------------------------------------------------------------------------ */
/* Public API, world of one rank                                             */
/* ------------------------------------------------------------------------ */

typedef struct {
  mpg_mesh *mesh;
  mpg_ctx *ctx;
  mpg_group *dp, *world;
} world1;

static world1 public_world1_on(int device);
static world1 public_world1(void) { return public_world1_on(0); }

static world1 public_world1_on(int device) {
  world1 w;
  memset(&w, 0, sizeof w);
  mpg_spec spec = MPG_SPEC_INIT;
  EXPECT_OK(mpg_spec_init(&spec));
  EXPECT_OK(mpg_spec_set_mesh(&spec, "dp=1"));
  EXPECT_OK(mpg_mesh_create(&spec, 1, &w.mesh));
  mpg_init_opts o = MPG_INIT_OPTS_INIT;
  o.backend.name = MPG_BACKEND_NCCL;
  o.rank = 0;
  o.world_size = 1;
  o.local_rank = 0;
  o.device = device;
  o.backend.timeout_s = 60;
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

/* R6: a group of one rank runs its copy or scale kernel on the context's
 * device, whatever device the caller has made current.  The context is on
 * device 1, the caller on device 0; the stream and buffers are device 1's.
 * (Needs two devices: the test double has 8.) */
Test(nccl_public, size1_group_runs_on_the_contexts_device) {
  require_gpu();
  int n = 0;
  CUDA_OK(cudaGetDeviceCount(&n));
  if (n < 2) cr_skip_test("one CUDA device: the device switch needs two");
  world1 w = public_world1_on(1);
  void *stream = NULL, *a = NULL, *b = NULL;
  const size_t count = 4096;
  EXPECT_OK(mpg_ctx_stream_create(w.ctx, &stream));
  EXPECT_OK(mpg_ctx_mem_alloc(w.ctx, count * 4, 0, &a));
  EXPECT_OK(mpg_ctx_mem_alloc(w.ctx, count * 4, 0, &b));
  float *host = malloc(count * 4);
  cr_assert_not_null(host);
  for (size_t i = 0; i < count; i++) host[i] = (float)i;
  CUDA_OK(cudaSetDevice(1));
  CUDA_OK(cudaMemcpy(a, host, count * 4, cudaMemcpyHostToDevice));
  CUDA_OK(cudaDeviceSynchronize());
  CUDA_OK(cudaSetDevice(0));
  EXPECT_OK(mpg_all_reduce_scaled(w.dp, a, b, count, MPG_F32, 0.5, stream, NULL));
  int cur = -1;
  CUDA_OK(cudaGetDevice(&cur));
  cr_assert_eq(cur, 0, "the caller's device became %d", cur);
  CUDA_OK(cudaSetDevice(1));
  CUDA_OK(cudaDeviceSynchronize());
  CUDA_OK(cudaMemcpy(host, b, count * 4, cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < count; i++)
    cr_assert_eq(host[i], (float)i * 0.5f, "element %zu is %g", i, (double)host[i]);
  CUDA_OK(cudaSetDevice(0));
  free(host);
  EXPECT_OK(mpg_ctx_mem_free(w.ctx, a));
  EXPECT_OK(mpg_ctx_mem_free(w.ctx, b));
  EXPECT_OK(mpg_ctx_stream_destroy(w.ctx, stream));
  world1_free(&w);
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
    expect_arg a = {dt, MPG__OP_PREMUL_SUM, 1, 0.5, 0};
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
    CUDA_OK(cudaDeviceSynchronize());
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
    mpg__coll k = coll_of(MPG__ALL_REDUCE, send, recv, n, dt, MPG__OP_PREMUL_SUM, NULL);
    k.scale = 0.25;
    EXPECT_OK(backend_run(c, &k));
    expect_arg a = {dt, MPG__OP_PREMUL_SUM, 1, 0.25, 0};
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
    CUDA_OK(cudaDeviceSynchronize());
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
/* mpg_p2p_batch on one rank                                                 */
/* ------------------------------------------------------------------------ */

/* A world of one rank has no peer: through the public API only the
 * argument checks and n == 0 can run (the batch itself runs in the two-rank
 * test, which needs two GPUs).  The backend's post_batch is driven directly
 * below with sends to and receives from itself. */
Test(nccl_public, world1_p2p_batch_arguments_and_empty_batch) {
  require_gpu();
  world1 w = public_world1();
  void *buf = dev_zero(MPG_F32, 16);
  mpg_p2p_op op = {MPG_P2P_SEND, 0, buf, 16, MPG_F32};
  mpg_status st = mpg_p2p_batch(w.dp, &op, 1, NULL, NULL);
  cr_assert_eq(st, MPG_ERR_INVALID, "a send to itself: %s", mpg_status_name(st));
  cr_assert(strstr(mpg_last_error(), "ops[0] (send): peer 0 is not another member"), "%s",
            mpg_last_error());
  op.kind = MPG_P2P_RECV;
  op.peer = 1;
  st = mpg_p2p_batch(w.world, &op, 1, NULL, NULL);
  cr_assert_eq(st, MPG_ERR_INVALID, "a receive from position 1: %s", mpg_status_name(st));
  st = mpg_p2p_batch(w.dp, NULL, -1, NULL, NULL);
  cr_assert_eq(st, MPG_ERR_INVALID, "n = -1: %s", mpg_status_name(st));
  mpg_work *work = (mpg_work *)&work;
  EXPECT_OK(mpg_p2p_batch(w.dp, NULL, 0, NULL, &work));
  cr_assert_null(work, "n == 0 gave a work handle");
  cr_assert_eq(mpg_ctx_status(w.ctx), MPG_OK);
  cudaFree(buf);
  world1_free(&w);
}

/* post_batch on a one-rank NCCL communicator, sending to and receiving
 * from itself (NCCL allows a rank its own peer): one ncclGroupStart,
 * ncclSend x 2, ncclRecv x 2, ncclGroupEnd, on a stream, messages matched
 * in order and of two dtypes; an empty batch member is skipped. */
Test(nccl_backend, world1_post_batch_to_itself) {
  require_gpu();
  mpg__comm *c = backend_world1();
  const size_t n = 1 << 20;
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  int r0 = 0, r5 = 5;
  void *a = dev_fill(MPG_F32, n, 0), *b = dev_fill(MPG_BF16, n, 5);
  void *ra = dev_zero(MPG_F32, n), *rb = dev_zero(MPG_BF16, n);
  mpg__coll list[5] = {
      coll_of(MPG__RECV, NULL, ra, n, MPG_F32, MPG_OP_SUM, s),
      coll_of(MPG__RECV, NULL, rb, n, MPG_BF16, MPG_OP_SUM, s),
      coll_of(MPG__RECV, NULL, NULL, 0, MPG_I64, MPG_OP_SUM, s),
      coll_of(MPG__SEND, a, NULL, n, MPG_F32, MPG_OP_SUM, s),
      coll_of(MPG__SEND, b, NULL, n, MPG_BF16, MPG_OP_SUM, s),
  };
  for (int i = 0; i < 5; i++) list[i].peer = 0;
  mpg__req *req = NULL;
  EXPECT_OK(mpg__backend_nccl.post_batch(c, list, 5, &req));
  cr_assert_not_null(req);
  EXPECT_OK(mpg__backend_nccl.wait(req, mpg__now() + 60));
  mpg__backend_nccl.req_free(req);
  expect_dev("post_batch f32 message", MPG_F32, ra, n, want_pattern_of, &r0);
  expect_dev("post_batch bf16 message", MPG_BF16, rb, n, want_pattern_of, &r5);
  /* Only empty operations: NCCL is not called, the request still completes. */
  req = NULL;
  EXPECT_OK(mpg__backend_nccl.post_batch(c, &list[2], 1, &req));
  EXPECT_OK(mpg__backend_nccl.wait(req, mpg__now() + 60));
  mpg__backend_nccl.req_free(req);
  cr_log_info("backend direct: ncclGroupStart / ncclSend x2 / ncclRecv x2 / ncclGroupEnd "
              "to itself checked");
  EXPECT_OK(mpg__backend_nccl.destroy(c));
  cudaFree(a);
  cudaFree(b);
  cudaFree(ra);
  cudaFree(rb);
  cudaStreamDestroy(s);
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
  o.backend.name = MPG_BACKEND_NCCL;
  o.rank = j->rank;
  o.world_size = 2;
  o.local_rank = j->rank;
  o.local_world_size = 2;
  o.device = j->rank % j->ndev;
  o.nccl_id = j->id;
  o.backend.timeout_s = 60;
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
      expect_arg a = {dt, MPG__OP_PREMUL_SUM, 2, 0.5, 0};
      job_expect(j, "scaled 0.5 (async)", dt, buf, n, want_reduce, &a);
      cudaFree(buf);
    }
  }
  /* f16/bf16 with f32 accumulation (widen.c) over two ranks: all_reduce
   * (sum, avg, scaled) and reduce_scatter in place, where each rank's f32
   * result is its block of the widened buffer. */
  for (int h = 0; h < 2; h++) {
    mpg_dtype dt = h ? MPG_BF16 : MPG_F16;
    for (int q = 0; q < 3; q++) {
      mpg_op op = q == 0 ? MPG_OP_SUM : q == 1 ? MPG_OP_AVG : MPG__OP_PREMUL_SUM;
      void *send = dev_fill(dt, n, j->rank), *recv = dev_zero(dt, n);
      JOB_OK(j, mpg__all_reduce_f32acc(dp, send, recv, n, dt, op, 0.5, NULL, NULL));
      expect_arg a = {dt, op, 2, 0.5, 0};
      job_expect(j, "f32acc all_reduce", dt, recv, n, want_reduce, &a);
      cudaFree(send);
      cudaFree(recv);
    }
    void *rs = dev_fill(dt, 2 * n, j->rank);
    char *mine = (char *)rs + (size_t)j->rank * n * 2;
    JOB_OK(j, mpg__reduce_scatter_f32acc(dp, rs, mine, n, dt, MPG_OP_SUM, 1.0, NULL, NULL));
    expect_arg a = {dt, MPG_OP_SUM, 2, 1.0, (size_t)j->rank * n};
    job_expect(j, "f32acc reduce_scatter in place", dt, mine, n, want_reduce, &a);
    cudaFree(rs);
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
  /* mpg_p2p_batch: both ranks send 64 MiB to each other and receive 64
   * MiB in one batch (sends listed first: as one NCCL group they cannot
   * wait for each other), plus a second, bf16 message to the same peer,
   * matched in order; then the same through a work handle. */
  {
    const size_t big = (size_t)16 << 20; /* int32: 64 MiB */
    int peer = 1 - j->rank, peer_b = peer + 10;
    void *sa = dev_fill(MPG_I32, big, j->rank), *ra = dev_zero(MPG_I32, big);
    void *sb = dev_fill(MPG_BF16, n, j->rank + 10), *rb = dev_zero(MPG_BF16, n);
    mpg_p2p_op ops[4] = {{MPG_P2P_SEND, peer, sa, big, MPG_I32},
                         {MPG_P2P_SEND, peer, sb, n, MPG_BF16},
                         {MPG_P2P_RECV, peer, ra, big, MPG_I32},
                         {MPG_P2P_RECV, peer, rb, n, MPG_BF16}};
    JOB_OK(j, mpg_p2p_batch(dp, ops, 4, NULL, NULL));
    job_expect(j, "p2p_batch 64 MiB", MPG_I32, ra, big, want_pattern_of, &peer);
    job_expect(j, "p2p_batch second message", MPG_BF16, rb, n, want_pattern_of, &peer_b);
    cudaMemset(ra, 0, big * 4);
    cudaDeviceSynchronize();
    mpg_work *w = NULL;
    JOB_OK(j, mpg_p2p_batch(dp, ops, 4, NULL, &w));
    JOB_OK(j, mpg_work_wait(w));
    job_expect(j, "p2p_batch (work)", MPG_I32, ra, big, want_pattern_of, &peer);
    cudaFree(sa);
    cudaFree(ra);
    cudaFree(sb);
    cudaFree(rb);
  }
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

/* The torchrun-style bootstrap: no id from the caller, MASTER_ADDR and
 * MASTER_PORT in the environment, so rank 0 hands its id to rank 1 through
 * meshpg's own rendezvous (groups/rendezvous.h), and NCCL_COMM_ID is never
 * set.  With two GPUs the world comes up; with one, NCCL's duplicate-GPU
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
  o.backend.name = MPG_BACKEND_NCCL;
  o.rank = j->rank;
  o.world_size = 2;
  o.local_rank = j->rank;
  o.local_world_size = 2;
  o.device = j->rank % j->ndev;
  o.backend.timeout_s = 30;
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
  cr_log_info("meshpg's rendezvous at 127.0.0.1, MASTER_PORT %s + 1, reached both ranks%s",
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
  o.backend.name = MPG_BACKEND_NCCL;
  o.rank = 0;
  o.world_size = 2;
  o.device = 0;
  o.nccl_id = &id;
  o.backend.timeout_s = 2;
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

/* ------------------------------------------------------------------------ */
/* Issue 11: scale in f32, asynchronous errors, setup collectives            */
/* ------------------------------------------------------------------------ */

/* A scaled f16/bf16 all-reduce keeps its scale in f32: with scale 1e-7 (an
 * f16 subnormal, which an f16 pre-multiply scalar would round to
 * 1.19e-7), every element equals half(f32(x) * 1e-7), the result of a
 * group of one rank and of the CPU backends. */
Test(nccl_backend, scaled_half_all_reduce_keeps_the_scale_in_f32) {
  require_gpu();
  mpg__comm *c = backend_world1();
  const size_t n = 2048;
  const mpg_dtype halves[] = {MPG_F16, MPG_BF16};
  for (int h = 0; h < 2; h++) {
    mpg_dtype dt = halves[h];
    uint16_t *host = malloc(n * 2), *back = malloc(n * 2);
    for (size_t i = 0; i < n; i++) host[i] = mpg__f32_to_half(dt, 100.0f + (float)i);
    void *send = NULL, *recv = NULL;
    cr_assert_eq(cudaMalloc(&send, n * 2), cudaSuccess);
    cr_assert_eq(cudaMalloc(&recv, n * 2), cudaSuccess);
    cr_assert_eq(cudaMemcpy(send, host, n * 2, cudaMemcpyHostToDevice), cudaSuccess);
    mpg__coll k = coll_of(MPG__ALL_REDUCE, send, recv, n, dt, MPG__OP_PREMUL_SUM, NULL);
    k.scale = 1e-7;
    EXPECT_OK(backend_run(c, &k));
    cr_assert_eq(cudaMemcpy(back, recv, n * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    for (size_t i = 0; i < n; i++) {
      uint16_t want = mpg__f32_to_half(dt, mpg__half_to_f32(dt, host[i]) * 1e-7f);
      cr_assert_eq(back[i], want, "%s [%zu]: 0x%04x, expected 0x%04x", mpg_dtype_name(dt),
                   i, back[i], want);
    }
    cudaFree(send);
    cudaFree(recv);
    free(host);
    free(back);
  }
  EXPECT_OK(mpg__backend_nccl.destroy(c));
}

/* ------------------------------------------------------------------------ */
/* Issue 12: f16/bf16 with f32 accumulation (widen.c)                         */
/* ------------------------------------------------------------------------ */

static int half_is_nan(mpg_dtype dt, uint16_t h) {
  return (h & 0x7fff) > (dt == MPG_BF16 ? 0x7f80 : 0x7c00);
}

/* The backend's post with acc_f32 on a one-rank NCCL communicator, so that
 * ncclAllReduce / ncclReduceScatter really run in ncclFloat32 between the
 * widen and narrow kernels: every non-NaN 16-bit pattern of f16 and bf16
 * (zeros, subnormals, infinities included), sum, avg, max, min and scaled
 * sums (0.3: products that round; 1e-7: f16 underflow), out of place and in
 * place.  Each result equals mpg__f32_to_half(f32(x) (* (float)scale)), the
 * f32 reduction of one member rounded once, bit for bit; NaN inputs give
 * NaN.  Then f32 data with acc_f32 set runs as a plain f32 collective. */
Test(nccl_backend, f32_accumulation_of_halves_rounds_once) {
  require_gpu();
  mpg__comm *c = backend_world1();
  const size_t n = 65536;
  const mpg_op ops[] = {MPG_OP_SUM, MPG_OP_AVG, MPG_OP_MAX, MPG_OP_MIN,
                        MPG__OP_PREMUL_SUM, MPG__OP_PREMUL_SUM};
  const double scales[] = {1, 1, 1, 1, 0.3, 1e-7};
  uint16_t *host = malloc(n * 2), *back = malloc(n * 2);
  cr_assert(host && back);
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  int cases = 0;
  for (int h = 0; h < 2; h++) {
    mpg_dtype dt = h ? MPG_BF16 : MPG_F16;
    for (size_t o = 0; o < sizeof ops / sizeof *ops; o++)
      for (int kind = 0; kind < 2; kind++)
        for (int inplace = 0; inplace < 2; inplace++) {
          int nans = o == 0 && inplace == 0; /* one case with NaN inputs */
          for (size_t i = 0; i < n; i++)
            host[i] = half_is_nan(dt, (uint16_t)i) && !nans ? 0 : (uint16_t)i;
          void *send = NULL, *recv = NULL;
          CUDA_OK(cudaMalloc(&send, n * 2));
          CUDA_OK(cudaMalloc(&recv, n * 2));
          CUDA_OK(cudaMemcpy(send, host, n * 2, cudaMemcpyHostToDevice));
          CUDA_OK(cudaMemset(recv, 0x5a, n * 2));
          CUDA_OK(cudaDeviceSynchronize());
          void *out = inplace ? send : recv; /* one rank: block 0 of send */
          mpg__coll k = coll_of(kind ? MPG__REDUCE_SCATTER : MPG__ALL_REDUCE, send, out, n,
                                dt, ops[o], s);
          k.scale = scales[o];
          k.acc_f32 = 1;
          EXPECT_OK(backend_run(c, &k));
          CUDA_OK(cudaStreamSynchronize(s));
          CUDA_OK(cudaMemcpy(back, out, n * 2, cudaMemcpyDeviceToHost));
          for (size_t i = 0; i < n; i++) {
            if (half_is_nan(dt, host[i])) {
              cr_assert(half_is_nan(dt, back[i]), "%s %s: NaN 0x%04x gave 0x%04x",
                        mpg__kind_name(k.kind), mpg_dtype_name(dt), host[i], back[i]);
              continue;
            }
            float f = mpg__half_to_f32(dt, host[i]);
            if (ops[o] == MPG__OP_PREMUL_SUM) f *= (float)scales[o];
            uint16_t want = mpg__f32_to_half(dt, f);
            cr_assert_eq(back[i], want,
                         "%s(%s, %s, scale %g)%s: input 0x%04x gave 0x%04x, expected 0x%04x",
                         mpg__kind_name(k.kind), mpg_dtype_name(dt), op_names[ops[o]],
                         scales[o], inplace ? " in place" : "", host[i], back[i], want);
          }
          cudaFree(send);
          cudaFree(recv);
          cases++;
        }
  }
  /* f32 data: the flag changes nothing. */
  void *x = dev_fill(MPG_F32, 1000, 0), *y = dev_zero(MPG_F32, 1000);
  mpg__coll k = coll_of(MPG__ALL_REDUCE, x, y, 1000, MPG_F32, MPG_OP_SUM, s);
  k.acc_f32 = 1;
  EXPECT_OK(backend_run(c, &k));
  expect_dev("f32 with acc_f32", MPG_F32, y, 1000, want_pattern0, NULL);
  cudaFree(x);
  cudaFree(y);
  cr_log_info("backend direct, 1-rank NCCL comm: %d f16/bf16 collectives with f32 "
              "accumulation, every 16-bit pattern, bit for bit", cases);
  CUDA_OK(cudaStreamDestroy(s));
  free(host);
  free(back);
  EXPECT_OK(mpg__backend_nccl.destroy(c));
}

/* An error NCCL defines, on purpose: with NCCL_CHECK_POINTERS=1 (NCCL's
 * environment variables: check the CUDA memory pointers on each collective
 * call) NCCL refuses a receive buffer in host memory with
 * ncclInvalidArgument before it launches anything.  (The test used to pass a
 * freed device address instead: undefined behaviour, which crashed inside
 * NCCL's one-rank copy on an H100.)  The post is MPG_ERR_BACKEND naming the
 * NCCL call and NCCL's own text.  A non-blocking communicator keeps the
 * error as its async state (NCCL 2.28, src/enqueue.cc: a failed enqueue
 * calls ncclCommSetAsyncError when config.blocking is 0), so a later valid
 * all-reduce fails too, as seen on an H100: the communicator must be
 * aborted, which the generic layer does for the whole context.  (At world 1
 * the public API never reaches NCCL: size-1 groups are local copies.) */
Test(nccl_backend, nccl_argument_error_is_reported) {
  require_gpu();
  setenv("NCCL_CHECK_POINTERS", "1", 1); /* read at NCCL's first use here */
  mpg__comm *c = backend_world1();
  const size_t n = 1 << 10;
  void *send = dev_fill(MPG_F32, n, 0), *recv = dev_zero(MPG_F32, n);
  float *host = calloc(n, sizeof *host);
  cr_assert_not_null(host);
  mpg__coll k = coll_of(MPG__ALL_REDUCE, send, host, n, MPG_F32, MPG_OP_SUM, NULL);
  mpg_status st = backend_run(c, &k);
  cr_log_info("all-reduce into host memory: %s: %s", mpg_status_name(st), mpg_last_error());
  cr_assert_eq(st, MPG_ERR_BACKEND, "%s: %s", mpg_status_name(st), mpg_last_error());
  cr_assert(strstr(mpg_last_error(), "ncclAllReduce"), "%s", mpg_last_error());
  cr_assert(strstr(mpg_last_error(), ncclGetErrorString(ncclInvalidArgument)), "%s",
            mpg_last_error());
  k = coll_of(MPG__ALL_REDUCE, send, recv, n, MPG_F32, MPG_OP_SUM, NULL);
  st = backend_run(c, &k);
  cr_log_info("a valid all-reduce after it: %s: %s", mpg_status_name(st), mpg_last_error());
  cr_assert_eq(st, MPG_ERR_BACKEND, "the communicator kept working after NCCL's error: %s",
               mpg_status_name(st));
  EXPECT_OK(mpg__backend_nccl.destroy(c));
  free(host);
  cudaFree(send);
  cudaFree(recv);
  unsetenv("NCCL_CHECK_POINTERS");
}

/* Through the public API, placement's host-identity all-gather and the
 * sync's layout checks run on the world communicator (one rank: NCCL is
 * still called) with the data staged through device memory. */
Test(nccl_public, setup_collectives_with_placement_and_layout_check) {
  require_gpu();
  mpg_spec spec = MPG_SPEC_INIT;
  EXPECT_OK(mpg_spec_init(&spec));
  EXPECT_OK(mpg_spec_set_mesh(&spec, "dp=1,cp=1,tp=1"));
  mpg_mesh *mesh = NULL;
  EXPECT_OK(mpg_mesh_create(&spec, 1, &mesh));
  mpg_init_opts opts = MPG_INIT_OPTS_INIT;
  opts.backend.name = MPG_BACKEND_NCCL;
  opts.rank = 0;
  opts.world_size = 1;
  opts.device = 0;
  opts.backend.timeout_s = 60;
  opts.placement = 1;
  opts.host_id = "gpu-host";
  mpg_ctx *ctx = NULL;
  EXPECT_OK(mpg_ctx_create(mesh, &opts, &ctx));
  cr_assert_geq(mpg__ctx_setup_collectives(ctx), 2);
  mpg_sync_opts so = MPG_SYNC_OPTS_INIT;
  mpg_sync *sync = NULL;
  EXPECT_OK(mpg_sync_create(ctx, &so, &sync));
  int id = -1;
  EXPECT_OK(mpg_sync_add_param(sync, "w", 100, MPG_F32, NULL, &id));
  EXPECT_OK(mpg_sync_commit(sync));
  EXPECT_OK(mpg_sync_destroy(sync));
  cr_assert_eq(mpg_ctx_status(ctx), MPG_OK);
  EXPECT_OK(mpg_ctx_destroy(ctx));
  mpg_mesh_destroy(mesh);
}

/* Registered buffers are registered with every communicator of the
 * context: one allocated before a split is registered with the child at
 * the split, one allocated after with both, and mem_free deregisters it
 * everywhere. */
static int count_regs(const mpg__comm *c, const void *ptr) {
  int n = 0;
  for (const struct nccl_reg *r = c->regs; r; r = r->next) n += r->ptr == ptr;
  return n;
}

Test(nccl_backend, registration_reaches_every_communicator) {
  require_gpu();
  mpg__comm *w = backend_world1();
  void *before = NULL, *after = NULL, *plain = NULL;
  EXPECT_OK(mpg__backend_nccl.mem_alloc(w, 1 << 20, 1, &before));
  EXPECT_OK(mpg__backend_nccl.mem_alloc(w, 4096, 0, &plain));
  cr_assert_eq(count_regs(w, before), 1);
  mpg__comm *child = NULL;
  EXPECT_OK(mpg__backend_nccl.split(w, 0, 0, &child));
  cr_assert_not_null(child);
  cr_assert_eq(count_regs(child, before), 1, "a buffer registered before the split is "
               "not registered with the new group");
  EXPECT_OK(mpg__backend_nccl.mem_alloc(w, 1 << 20, 1, &after));
  cr_assert_eq(count_regs(w, after), 1);
  cr_assert_eq(count_regs(child, after), 1, "a buffer registered after the split is not "
               "registered with the group");
  cr_assert_eq(count_regs(child, plain) + count_regs(w, plain), 0);
  /* An all-reduce on the child over the registered buffers. */
  mpg__coll k = coll_of(MPG__ALL_REDUCE, before, before, 1000, MPG_F32, MPG_OP_SUM, NULL);
  EXPECT_OK(backend_run(child, &k));
  EXPECT_OK(mpg__backend_nccl.mem_free(w, before));
  cr_assert_eq(count_regs(child, before) + count_regs(w, before), 0);
  EXPECT_OK(mpg__backend_nccl.destroy(child));
  cr_assert_eq(count_regs(w, after), 1);
  EXPECT_OK(mpg__backend_nccl.mem_free(w, after));
  EXPECT_OK(mpg__backend_nccl.mem_free(w, plain));
  EXPECT_OK(mpg__backend_nccl.destroy(w));
}

/* R2 (issue 19): a second thread of a rank reaches a communicator while the
 * first thread polls it.  Here each of 4 ranks creates its groups lazily
 * (every creation is an ncclCommSplit whose job runs while the caller polls
 * the parent, releasing its lock between polls) while a second thread of
 * the same rank allocates and frees registered memory, which registers the
 * buffer with every communicator of the context (ncclCommRegister).  NCCL
 * forbids any call on a non-blocking communicator between ncclInProgress
 * and ncclSuccess; the test double stops the process when that happens (it
 * did before mpg__nccl_lock waited for a settling call). */
typedef struct reg_race {
  int rank, world;
  ncclUniqueId *id;
  mpg_mesh *mesh;
  mpg_ctx *ctx;
  _Atomic int stop;
  long allocs;
  mpg_status st, helper_st;
  char msg[512], helper_msg[512];
} reg_race;

static void *reg_race_helper(void *p) {
  reg_race *j = p;
  cudaSetDevice(j->rank);
  while (!atomic_load(&j->stop) && !j->helper_st) {
    void *buf = NULL;
    mpg_status st = mpg_ctx_mem_alloc(j->ctx, 1 << 16, 1, &buf);
    if (!st) st = mpg_ctx_mem_free(j->ctx, buf);
    if (st) {
      j->helper_st = st;
      snprintf(j->helper_msg, sizeof j->helper_msg, "%s", mpg_last_error());
    }
    j->allocs++;
  }
  return NULL;
}

static void *reg_race_rank(void *p) {
  reg_race *j = p;
  cudaSetDevice(j->rank);
  mpg_init_opts o = MPG_INIT_OPTS_INIT;
  o.backend.name = MPG_BACKEND_NCCL;
  o.rank = j->rank;
  o.world_size = j->world;
  o.local_rank = j->rank;
  o.local_world_size = j->world;
  o.device = j->rank;
  o.nccl_id = j->id;
  o.backend.lazy_groups = 1;
  o.backend.timeout_s = 60;
  j->st = mpg_ctx_create(j->mesh, &o, &j->ctx);
  if (j->st) {
    snprintf(j->msg, sizeof j->msg, "ctx_create: %s", mpg_last_error());
    return NULL;
  }
  pthread_t helper;
  int started = pthread_create(&helper, NULL, reg_race_helper, j) == 0;
  static const char *const names[] = {"cp", "dp", "dp_cp", "world"};
  for (int i = 0; i < 4 && !j->st; i++) {
    mpg_group *g = NULL;
    j->st = mpg_ctx_group(j->ctx, names[i], &g);
    void *x = NULL;
    if (!j->st) j->st = mpg_ctx_mem_alloc(j->ctx, sizeof(int32_t), 0, &x);
    int32_t one = 1, n = 0;
    if (!j->st) {
      cudaMemcpy(x, &one, sizeof one, cudaMemcpyHostToDevice);
      j->st = mpg_all_reduce(g, x, x, 1, MPG_I32, MPG_OP_SUM, NULL, NULL);
    }
    if (!j->st) {
      cudaDeviceSynchronize();
      cudaMemcpy(&n, x, sizeof n, cudaMemcpyDeviceToHost);
      if (n != mpg_group_size(g)) {
        j->st = MPG_ERR_STATE;
        snprintf(j->msg, sizeof j->msg, "group %s: sum of ones is %d, want %d", names[i], n,
                 mpg_group_size(g));
      }
    } else {
      snprintf(j->msg, sizeof j->msg, "group %s: %s", names[i], mpg_last_error());
    }
    if (x) mpg_ctx_mem_free(j->ctx, x);
  }
  atomic_store(&j->stop, 1);
  if (started) pthread_join(helper, NULL);
  mpg_status st = mpg_ctx_destroy(j->ctx);
  if (st && !j->st) {
    j->st = st;
    snprintf(j->msg, sizeof j->msg, "destroy: %s", mpg_last_error());
  }
  return NULL;
}

Test(nccl_threads, registration_from_a_second_thread_while_groups_split, .timeout = 120) {
  int ndev = require_gpu();
  enum { W = 4 };
  if (ndev < W) cr_skip_test("needs %d GPUs for %d thread ranks, found %d", W, W, ndev);
  mpg_spec spec = MPG_SPEC_INIT;
  EXPECT_OK(mpg_spec_init(&spec));
  EXPECT_OK(mpg_spec_set_mesh(&spec, "dp=2,cp=2"));
  EXPECT_OK(mpg_spec_add_flatten(&spec, "dp_cp", "dp,cp"));
  mpg_mesh *mesh = NULL;
  EXPECT_OK(mpg_mesh_create(&spec, W, &mesh));
  ncclUniqueId id;
  cr_assert_eq(ncclGetUniqueId(&id), ncclSuccess);
  reg_race jobs[W];
  pthread_t th[W];
  for (int r = 0; r < W; r++) {
    memset(&jobs[r], 0, sizeof jobs[r]);
    jobs[r].rank = r;
    jobs[r].world = W;
    jobs[r].id = &id;
    jobs[r].mesh = mesh;
    cr_assert_eq(pthread_create(&th[r], NULL, reg_race_rank, &jobs[r]), 0);
  }
  for (int r = 0; r < W; r++) pthread_join(th[r], NULL);
  mpg_mesh_destroy(mesh);
  long allocs = 0;
  for (int r = 0; r < W; r++) {
    cr_assert_eq(jobs[r].st, MPG_OK, "rank %d: %s: %s", r, mpg_status_name(jobs[r].st),
                 jobs[r].msg);
    cr_assert_eq(jobs[r].helper_st, MPG_OK, "rank %d, second thread: %s: %s", r,
                 mpg_status_name(jobs[r].helper_st), jobs[r].helper_msg);
    allocs += jobs[r].allocs;
  }
  cr_assert_gt(allocs, 0, "the second threads never ran");
  cr_log_info("4 ranks created 4 groups lazily while their second threads made %ld "
              "registered allocations", allocs);
}
