/* test_nccl, part 3 (the helpers: test_nccl.h): issue 11 (the scale in
 * f32, f32 accumulation of halves, NCCL argument errors, the setup
 * collectives) and buffer registrations. */
#include "test_nccl.h"

#include "mesh_util.h"

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
  cudaStream_t s = nonblocking_stream();
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
  mpg_mesh *mesh = make_dims_mesh("dp=1,cp=1,tp=1");
  mpg_init_opts opts = nccl_opts(0, 1, 0, 60);
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
  nccl_job h;
  mpg_ctx *ctx;
  _Atomic int stop;
  long allocs;
  mpg_status st, helper_st;
  char msg[512], helper_msg[512];
} reg_race;

static void *reg_race_helper(void *p) {
  reg_race *j = p;
  cudaSetDevice(j->h.rank);
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
  cudaSetDevice(j->h.rank);
  mpg_init_opts o = nccl_job_opts(&j->h, 60); /* ndev >= world: device = rank */
  o.backend.lazy_groups = 1;
  j->st = mpg_ctx_create(j->h.mesh, &o, &j->ctx);
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
  destroy_keep_first(j->ctx, &j->st, j->msg, sizeof j->msg);
  return NULL;
}

Test(nccl_threads, registration_from_a_second_thread_while_groups_split, .timeout = 120) {
  int ndev = require_gpu();
  enum { W = 4 };
  if (ndev < W) cr_skip_test("needs %d GPUs for %d thread ranks, found %d", W, W, ndev);
  mpg_mesh *mesh = make_mesh("dp=2,cp=2", (const char *const[]){"dp_cp=dp,cp", NULL});
  ncclUniqueId id;
  cr_assert_eq(ncclGetUniqueId(&id), ncclSuccess);
  reg_race jobs[W];
  run_nccl_threads(reg_race_rank, jobs, sizeof jobs[0], W, ndev, &id, mesh);
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
