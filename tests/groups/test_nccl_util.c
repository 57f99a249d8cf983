/* The helpers of test_nccl.h. */
#include "test_nccl.h"

#include "mesh_util.h"

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
  const mpg__world_args a = {.rank = 0, .world_size = 1, .local_rank = 0,
                             .local_world_size = 1, .timeout_s = 60, .device = 0,
                             .nccl_id = NULL, .master_addr = "", .master_port = -1};
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
  return (mpg__coll){.kind = kind, .send = send, .recv = recv, .count = count, .dtype = dt,
                     .op = op, .scale = 1.0, .stream = stream};
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

mpg_init_opts nccl_opts(int rank, int world, int device, double timeout_s) {
  mpg_init_opts o = MPG_INIT_OPTS_INIT;
  o.backend.name = MPG_BACKEND_NCCL;
  o.rank = rank;
  o.world_size = world;
  o.device = device;
  if (timeout_s > 0) o.backend.timeout_s = timeout_s;
  return o;
}

mpg_init_opts nccl_job_opts(const nccl_job *j, double timeout_s) {
  mpg_init_opts o = nccl_opts(j->rank, j->world, j->rank % j->ndev, timeout_s);
  o.local_rank = j->rank;
  o.local_world_size = j->world;
  o.nccl_id = j->id;
  return o;
}

void run_nccl_threads(void *(*fn)(void *), void *jobs, size_t size, int world, int ndev,
                      const ncclUniqueId *id, mpg_mesh *mesh) {
  pthread_t th[64];
  cr_assert_leq(world, 64);
  for (int r = 0; r < world; r++) {
    char *job = (char *)jobs + (size_t)r * size;
    memset(job, 0, size);
    nccl_job h = {r, world, ndev, id, mesh};
    memcpy(job, &h, sizeof h);
    cr_assert_eq(pthread_create(&th[r], NULL, fn, job), 0);
  }
  for (int r = 0; r < world; r++) pthread_join(th[r], NULL);
}

cudaStream_t nonblocking_stream(void) {
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return s;
}

void destroy_keep_first(mpg_ctx *ctx, mpg_status *st, char *msg, size_t cap) {
  mpg_status ds = mpg_ctx_destroy(ctx);
  if (ds && !*st) {
    *st = ds;
    snprintf(msg, cap, "destroy: %s", mpg_last_error());
  }
}

world1 public_world1(void) { return public_world1_on(0); }

world1 public_world1_on(int device) {
  world1 w;
  memset(&w, 0, sizeof w);
  w.mesh = make_dims_mesh("dp=1");
  mpg_init_opts o = nccl_opts(0, 1, device, 60);
  o.local_rank = 0;
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
