/* The CUDA half of the test double (test_cuda_double.c): memory and loud
 * failures, and ranks as threads. */

#include "test_cuda_double.h"

/* ------------------------------------------------------------------ */
/* Memory and loud failures                                            */
/* ------------------------------------------------------------------ */

Test(cuda_double, memory_is_classified) {
  settings(0);
  char stack[16];
  unsigned char *p = NULL;
  void *pinned = NULL;
  int dev = 9;
  CUDA_OK(cudaSetDevice(1));
  CUDA_OK(cudaMalloc((void **)&p, 1000));
  cr_assert_eq(dbl_mem_find(p, 1000, &dev), DBL_MEM_DEVICE);
  cr_assert_eq(dev, 1);
  cr_assert_eq(dbl_mem_find(p + 999, 1, NULL), DBL_MEM_DEVICE);
  cr_assert_eq(dbl_mem_find(p, 1001, NULL), DBL_MEM_OVERRUN);
  cr_assert_eq(dbl_mem_find(p + 1000, 1, NULL), DBL_MEM_OVERRUN);
  cr_assert_eq(dbl_mem_find(stack, 1, &dev), DBL_MEM_HOST);
  cr_assert_eq(dev, -1);
  struct cudaPointerAttributes a;
  CUDA_OK(cudaPointerGetAttributes(&a, p + 10));
  cr_assert_eq(a.type, cudaMemoryTypeDevice);
  cr_assert_eq(a.device, 1);
  CUDA_OK(cudaPointerGetAttributes(&a, stack));
  cr_assert_eq(a.type, cudaMemoryTypeUnregistered);
  CUDA_OK(cudaMallocHost(&pinned, 64));
  CUDA_OK(cudaPointerGetAttributes(&a, pinned));
  cr_assert_eq(a.type, cudaMemoryTypeHost);
  cr_assert_eq(dbl_mem_find(pinned, 64, NULL), DBL_MEM_HOST);
  CUDA_OK(cudaMemset(pinned, 5, 64)); /* synchronous on pinned memory */
  cr_assert_eq(((unsigned char *)pinned)[63], 5);
  CUDA_IS(cudaMemset(stack, 0, sizeof stack), cudaErrorInvalidValue);
  CUDA_IS(cudaMemcpy(stack, stack, 4, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
  CUDA_IS(cudaMemcpy(p, stack, 4, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
  CUDA_IS(cudaMemcpy(p, stack, 4, (enum cudaMemcpyKind)7), cudaErrorInvalidMemcpyDirection);
  CUDA_OK(cudaMemcpy(p, stack, 4, cudaMemcpyDefault));
  CUDA_OK(cudaFree(p));
  cr_assert_eq(dbl_mem_find(p, 1, &dev), DBL_MEM_FREED);
  cr_assert_eq(p[0], 0xDB);
  cr_assert_eq(p[999], 0xDB);
  CUDA_IS(cudaFree(p), cudaErrorInvalidValue); /* as on an H100 */
  CUDA_OK(cudaFreeHost(pinned));
  CUDA_OK(cudaFree(NULL));
  void *z = (void *)1;
  CUDA_OK(cudaMalloc(&z, 0));
  cr_assert_null(z);
}

void memset_freed(void) {
  void *p = NULL;
  cudaMalloc(&p, 256);
  cudaFree(p);
  cudaMemset(p, 0, 16);
}

void memcpy_overrun(void) {
  void *p = NULL;
  char host[512] = {0};
  cudaMalloc(&p, 256);
  cudaMemcpy(p, host, 300, cudaMemcpyHostToDevice);
}

void freed_before_the_copy_ran(void) {
  static int ms = 100;
  void *p = NULL, *q = NULL;
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  cudaMalloc(&p, 256);
  cudaMallocAsync(&q, 256, s);
  cudaLaunchHostFunc(s, hold, &ms);
  cudaMemcpyAsync(p, q, 256, cudaMemcpyDeviceToDevice, s);
  cudaFreeAsync(q, cudaStreamLegacy); /* the legacy stream does not wait for s */
  cudaStreamSynchronize(s);
}

void kernel_overrun(void) {
  void *p = NULL;
  cudaMalloc(&p, 64);
  mpg__nccl_scale(p, p, 17, MPG_F32, 2.0, 0, "overrun");
}

Test(cuda_double, use_after_free_and_overruns_abort, .timeout = 10) {
  settings(300);
  expect_abort(memset_freed, "use after free");
  expect_abort(memcpy_overrun, "overruns device 0's block");
  expect_abort(freed_before_the_copy_ran, "freed");
  expect_abort(kernel_overrun, "kernel mpg_scale_f32 on device 0: its destination");
}

static void stuck(void *arg) {
  (void)arg;
  sleep_ms(30000);
}

void hang_forever(void) {
  setenv("MESHPG_DOUBLE_HANG_S", "1", 1);
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  dbl_stream_submit(s, "a collective whose peer never comes", 1, stuck, NULL);
  cudaDeviceSynchronize();
}

/* A device-wide wait on work that never ends is reported, naming it. */
Test(cuda_double, hang_is_reported, .timeout = 10) {
  settings(0);
  double t0 = dbl_now();
  struct child c;
  run_child(hang_forever, &c);
  cr_assert(WIFSIGNALED(c.status) && WTERMSIG(c.status) == SIGABRT, "status 0x%x: %s",
            c.status, c.err);
  cr_assert(strstr(c.err, "would hang forever on a real GPU"), "%s", c.err);
  cr_assert(strstr(c.err, "a collective whose peer never comes (running"), "%s", c.err);
  cr_assert(strstr(c.err, "cudaDeviceSynchronize waited 1 s"), "%s", c.err);
  cr_assert_lt(dbl_now() - t0, 8.0);
}

static void CUDART_CB calls_cuda(void *arg) {
  (void)arg;
  void *p;
  cudaMalloc(&p, 16);
}

void cuda_from_host_function(void) {
  cudaLaunchHostFunc(0, calls_cuda, NULL);
  cudaDeviceSynchronize();
}

void kernel_without_twin(void) {
  cudaLibrary_t lib;
  cudaKernel_t k;
  const char *ptx = ".version 6.0\n.target sm_52\n.address_size 64\n"
                    ".visible .entry my_kernel(.param .u64 p)\n{\n  ret;\n}\n";
  if (cudaLibraryLoadData(&lib, ptx, NULL, NULL, 0, NULL, NULL, 0)) _exit(3);
  if (cudaLibraryGetKernel(&k, lib, "not_there") != cudaErrorSymbolNotFound) _exit(4);
  cudaLibraryGetKernel(&k, lib, "my_kernel");
}

void twin_of_other_ptx(void) {
  cudaLibrary_t lib;
  cudaKernel_t k;
  const char *ptx = ".version 6.0\n.target sm_52\n.address_size 64\n"
                    ".visible .entry mpg_scale_f32(.param .u64 a, .param .u64 b, .param .u64 "
                    "n, .param .f64 s)\n{\n  ret;\n}\n";
  if (cudaLibraryLoadData(&lib, ptx, NULL, NULL, 0, NULL, NULL, 0)) _exit(3);
  cudaLibraryGetKernel(&k, lib, "mpg_scale_f32");
}

Test(cuda_double, misuse_is_loud, .timeout = 10) {
  settings(0);
  expect_abort(cuda_from_host_function, "cudaMalloc called from a stream's work");
  expect_abort(kernel_without_twin,
               "kernel my_kernel has no CPU twin; twins: mpg_scale_f32, mpg_scale_f64");
  expect_abort(twin_of_other_ptx, "kernel mpg_scale_f32's PTX is not the text");
}

/* ------------------------------------------------------------------ */
/* Ranks as threads                                                    */
/* ------------------------------------------------------------------ */

static void *oom_rank(void *arg) {
  int rank = (int)(intptr_t)arg;
  dbl_set_world_rank(rank);
  cudaSetDevice(rank);
  void *p = NULL;
  cudaError_t e = cudaMallocAsync(&p, 64, 0);
  if (!e) cudaFreeAsync(p, 0);
  return (void *)(intptr_t)e;
}

/* settings(late_us) and var=1, then n ranks as threads running fn(rank)
 * at once; what each returns, in out. */
static void rank_threads(int late_us, const char *var, int n, void *(*fn)(void *), void **out) {
  settings(late_us);
  setenv(var, "1", 1);
  pthread_t t[8];
  for (intptr_t r = 0; r < n; r++) pthread_create(&t[r], NULL, fn, (void *)r);
  for (int r = 0; r < n; r++) pthread_join(t[r], &out[r]);
}

/* MESHPG_DOUBLE_OOM_RANK fails that rank's cudaMallocAsync only. */
Test(cuda_double, oom_injection_hits_one_rank, .timeout = 10) {
  void *e[3];
  rank_threads(0, "MESHPG_DOUBLE_OOM_RANK", 3, oom_rank, e);
  for (int r = 0; r < 3; r++)
    cr_assert_eq((cudaError_t)(intptr_t)e[r], r == 1 ? cudaErrorMemoryAllocation : cudaSuccess,
                 "rank %d: %s", r, cudaGetErrorName((cudaError_t)(intptr_t)e[r]));
  cr_assert_eq(dbl_world_rank(), -1, "the test thread has no rank of its own");
}

/* Four ranks on four devices at once: streams, copies, kernels, events
 * and frees from every thread (for ThreadSanitizer). */
static void *busy_rank(void *arg) {
  int rank = (int)(intptr_t)arg, bad = 0;
  cudaSetDevice(rank);
  dbl_set_world_rank(rank);
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  enum { N = 4096 };
  static _Thread_local float host[N], back[N];
  for (int round = 0; round < 10; round++) {
    for (int i = 0; i < N; i++) host[i] = (float)(i + rank + round);
    void *d = NULL;
    cudaEvent_t ev;
    cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    cudaMalloc(&d, N * 4);
    cudaMemcpyAsync(d, host, N * 4, cudaMemcpyHostToDevice, s);
    mpg__nccl_scale(d, d, N, MPG_F32, 0.5, s, "busy");
    cudaEventRecord(ev, s);
    cudaStreamWaitEvent(cudaStreamPerThread, ev, 0);
    cudaMemcpyAsync(back, d, N * 4, cudaMemcpyDeviceToHost, cudaStreamPerThread);
    cudaStreamSynchronize(cudaStreamPerThread);
    for (int i = 0; i < N; i++) bad += back[i] != host[i] * 0.5f;
    cudaEventDestroy(ev);
    cudaFree(d);
  }
  cudaStreamDestroy(s);
  return (void *)(intptr_t)bad;
}

Test(cuda_double, ranks_as_threads, .timeout = 20) {
  void *bad[4];
  rank_threads(100, "NCCL_LAUNCH_ORDER_IMPLICIT", 4, busy_rank, bad);
  for (int r = 0; r < 4; r++)
    cr_assert_eq((intptr_t)bad[r], 0, "rank %d read %d wrong values", r, (int)(intptr_t)bad[r]);
}
