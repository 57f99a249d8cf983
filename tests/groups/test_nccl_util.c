/* The helpers of test_nccl.h. */
#include "test_nccl.h"

/* ------------------------------------------------------------------------ */
/* Helpers                                                                   */
/* ------------------------------------------------------------------------ */

int gpu_count(cudaError_t *err) {
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
int require_gpu(void) {
  cudaError_t e;
  int n = gpu_count(&e);
  if (n < 1)
    cr_skip_test("no CUDA GPU on this machine: NCCL tests skipped "
                 "(cudaGetDeviceCount: %s)",
                 e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
  return n;
}

/* Element i of a host buffer of dtype dt, as a double (and back). */
double get(mpg_dtype dt, const void *buf, size_t i) {
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

void put(mpg_dtype dt, void *buf, size_t i, double v) {
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
double pattern(size_t i, int rank) { return (double)((int)(i % 7) - 3 + rank); }

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
void *dev_fill(mpg_dtype dt, size_t n, int rank) {
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

void *dev_zero(mpg_dtype dt, size_t n) {
  size_t bytes = n * mpg_dtype_size(dt);
  void *dev = NULL;
  CUDA_OK(cudaMalloc(&dev, bytes ? bytes : 1));
  CUDA_OK(cudaMemset(dev, 0, bytes ? bytes : 1));
  CUDA_OK(cudaDeviceSynchronize());
  return dev;
}

/* Copy n elements back (after the whole device finished) and compare each
 * with want(i); `what` names the case. */
void expect_dev(const char *what, mpg_dtype dt, const void *dev,
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

double want_reduce(size_t i, void *p) {
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

double want_pattern0(size_t i, void *p) {
  (void)p;
  return pattern(i, 0);
}

/* pattern(i, *(int *)p): what rank *p filled. */
double want_pattern_of(size_t i, void *p) { return pattern(i, *(const int *)p); }

/* The one-rank world communicator of the NCCL backend, made directly. */
mpg__comm *backend_world1(void) {
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
mpg_status backend_run(mpg__comm *c, const mpg__coll *k) {
  mpg__req *req = NULL;
  mpg_status st = mpg__backend_nccl.post(c, k, &req);
  if (st) return st;
  cr_assert_not_null(req);
  st = mpg__backend_nccl.wait(req, mpg__now() + 60);
  mpg__backend_nccl.req_free(req);
  return st;
}

mpg__coll coll_of(mpg__coll_kind kind, const void *send, void *recv,
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

void log_device(void) {
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

/* ------------------------------------------------------------------------ */
/* The public API on a world of one rank                                     */
/* ------------------------------------------------------------------------ */

world1 public_world1(void) { return public_world1_on(0); }

world1 public_world1_on(int device) {
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

void world1_free(world1 *w) {
  EXPECT_OK(mpg_ctx_destroy(w->ctx));
  mpg_mesh_destroy(w->mesh);
}
