/* The CUDA half of the test double (test_cuda_double.c): ordering, the
 * rules of streams, events, frees and kernels. */

#include "test_cuda_double.h"

/* ------------------------------------------------------------------ */
/* Ordering                                                            */
/* ------------------------------------------------------------------ */

enum { TRIES = 200, BUF = 4096 };

/* The real GPU's finding: a buffer filled with cudaMemset, then read by a
 * collective on a non-blocking stream, may be read before the fill lands.
 * A blocking stream is ordered after the memset and never sees the old
 * value. */
Test(cuda_double, memset_races_a_non_blocking_stream_only, .timeout = 20) {
  settings(300);
  void *buf = dev_filled(BUF, 0x11), *probe = dev_filled(BUF, 0);
  cudaStream_t blocking, nonblocking;
  CUDA_OK(cudaStreamCreate(&blocking));
  CUDA_OK(cudaStreamCreateWithFlags(&nonblocking, cudaStreamNonBlocking));
  int stale = 0, tries = 0;
  for (; tries < 60; tries++) { /* a blocking stream waits for the memset */
    CUDA_OK(cudaMemset(buf, 0x22, BUF));
    cr_assert_eq(seen_by(blocking, buf, probe, BUF), 0x22, "try %d", tries);
    CUDA_OK(cudaMemset(buf, 0x11, BUF));
    CUDA_OK(cudaDeviceSynchronize());
  }
  if (UNDER_TSAN) cr_skip_test("the racing half races on purpose; TSan would report it");
  for (tries = 0; tries < TRIES && stale < 3; tries++) {
    CUDA_OK(cudaMemset(buf, 0x22, BUF));
    int v = seen_by(nonblocking, buf, probe, BUF);
    cr_assert(v == 0x11 || v == 0x22, "byte %#x", v);
    stale += v == 0x11;
    CUDA_OK(cudaMemset(buf, 0x11, BUF));
    CUDA_OK(cudaDeviceSynchronize());
  }
  cr_log_info("non-blocking stream saw the old value %d times in %d tries", stale, tries);
  cr_assert(stale > 0, "a non-blocking stream never ran before the memset in %d tries", tries);
  cudaStreamDestroy(blocking);
  cudaStreamDestroy(nonblocking);
}

/* cudaMemcpy from pageable memory returns once the source is staged: the
 * caller may overwrite it, and the device write lands later. */
Test(cuda_double, pageable_memcpy_returns_before_landing, .timeout = 20) {
  settings(300);
  void *buf = dev_filled(BUF, 0x11), *probe = dev_filled(BUF, 0);
  unsigned char host[BUF], back[BUF];
  cudaStream_t nonblocking;
  CUDA_OK(cudaStreamCreateWithFlags(&nonblocking, cudaStreamNonBlocking));
  for (int i = 0; i < 20; i++) { /* staged: overwriting the source at once is safe */
    memset(host, 0x33, sizeof host);
    CUDA_OK(cudaMemcpy(buf, host, BUF, cudaMemcpyHostToDevice));
    memset(host, 0x44, sizeof host);
    CUDA_OK(cudaMemcpy(back, buf, BUF, cudaMemcpyDeviceToHost));
    cr_assert_eq(back[0], 0x33);
    cr_assert_eq(back[BUF - 1], 0x33);
    CUDA_OK(cudaMemset(buf, 0x11, BUF));
  }
  static int ms = 50; /* cudaMemcpyAsync stages a pageable source too */
  CUDA_OK(cudaLaunchHostFunc(nonblocking, hold, &ms));
  memset(host, 0x55, sizeof host);
  CUDA_OK(cudaMemcpyAsync(buf, host, BUF, cudaMemcpyHostToDevice, nonblocking));
  memset(host, 0x66, sizeof host);
  CUDA_OK(cudaMemcpyAsync(back, buf, BUF, cudaMemcpyDeviceToHost, nonblocking));
  CUDA_OK(cudaStreamSynchronize(nonblocking));
  cr_assert_eq(back[0], 0x55, "cudaMemcpyAsync read its pageable source late");
  CUDA_OK(cudaMemset(buf, 0x11, BUF));
  CUDA_OK(cudaDeviceSynchronize());
  if (UNDER_TSAN) cr_skip_test("the racing half races on purpose; TSan would report it");
  int stale = 0, tries;
  memset(host, 0x33, sizeof host);
  for (tries = 0; tries < TRIES && stale < 3; tries++) {
    CUDA_OK(cudaMemcpy(buf, host, BUF, cudaMemcpyHostToDevice));
    stale += seen_by(nonblocking, buf, probe, BUF) == 0x11;
    CUDA_OK(cudaMemset(buf, 0x11, BUF));
    CUDA_OK(cudaDeviceSynchronize());
  }
  cr_log_info("the copy had not landed %d times in %d tries", stale, tries);
  cr_assert(stale > 0, "cudaMemcpy H2D always landed before returning (%d tries)", tries);
  cudaStreamDestroy(nonblocking);
}

/* The legacy stream waits for blocking streams (a D2H cudaMemcpy sees the
 * work queued before it there) and not for non-blocking ones. */
Test(cuda_double, legacy_stream_waits_for_blocking_streams_only, .timeout = 10) {
  settings(300);
  unsigned char *buf = dev_filled(BUF, 0), host[16];
  static int ms = 150;
  cudaStream_t blocking, nonblocking;
  CUDA_OK(cudaStreamCreate(&blocking));
  CUDA_OK(cudaStreamCreateWithFlags(&nonblocking, cudaStreamNonBlocking));

  CUDA_OK(cudaLaunchHostFunc(blocking, hold, &ms));
  CUDA_OK(cudaMemsetAsync(buf, 7, BUF, blocking));
  double t0 = dbl_now();
  CUDA_OK(cudaMemcpy(host, buf, sizeof host, cudaMemcpyDeviceToHost));
  cr_assert_eq(host[0], 7, "the D2H copy ran before the blocking stream's memset");
  cr_assert_geq(dbl_now() - t0, 0.12);

  CUDA_OK(cudaLaunchHostFunc(nonblocking, hold, &ms));
  CUDA_OK(cudaMemsetAsync(buf, 8, BUF, nonblocking));
  t0 = dbl_now();
  CUDA_OK(cudaMemset(buf + 1, 9, 1));
  CUDA_OK(cudaMemcpy(host, buf, sizeof host, cudaMemcpyDeviceToHost));
  cr_assert_lt(dbl_now() - t0, 0.12, "the legacy stream waited for a non-blocking stream");
  cr_assert_eq(host[1], 9);
  CUDA_IS(cudaStreamQuery(nonblocking), cudaErrorNotReady);
  CUDA_OK(cudaStreamSynchronize(nonblocking));
  CUDA_OK(cudaStreamQuery(nonblocking));
  cudaStreamDestroy(blocking);
  cudaStreamDestroy(nonblocking);
}

/* The per-thread default stream is blocking: the legacy stream waits for
 * it.  Each thread has its own. */
Test(cuda_double, per_thread_stream_is_ordered_with_legacy, .timeout = 10) {
  settings(300);
  unsigned char *buf = dev_filled(BUF, 0), host[4];
  static int ms = 100;
  CUDA_OK(cudaLaunchHostFunc(cudaStreamPerThread, hold, &ms));
  CUDA_OK(cudaMemsetAsync(buf, 3, BUF, cudaStreamPerThread));
  CUDA_OK(cudaMemcpy(host, buf, sizeof host, cudaMemcpyDeviceToHost));
  cr_assert_eq(host[0], 3);
}

/* cudaStreamWaitEvent orders a stream after the point the event captured,
 * even when the event is destroyed at once; a never recorded event is
 * complete. */
Test(cuda_double, events_order_streams, .timeout = 10) {
  settings(300);
  unsigned char *buf = dev_filled(BUF, 0), *probe = dev_filled(BUF, 0);
  static int ms = 50;
  cudaStream_t a, b;
  CUDA_OK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
  CUDA_OK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
  cudaEvent_t fresh;
  CUDA_OK(cudaEventCreateWithFlags(&fresh, cudaEventDisableTiming));
  CUDA_OK(cudaEventQuery(fresh));
  CUDA_OK(cudaEventSynchronize(fresh));
  CUDA_OK(cudaStreamWaitEvent(b, fresh, 0));
  CUDA_IS(cudaStreamWaitEvent(b, fresh, 5), cudaErrorInvalidValue);
  for (int i = 1; i <= 8; i++) {
    cudaEvent_t ev;
    CUDA_OK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    CUDA_OK(cudaLaunchHostFunc(a, hold, &ms));
    CUDA_OK(cudaMemsetAsync(buf, i, BUF, a));
    CUDA_OK(cudaEventRecord(ev, a));
    CUDA_IS(cudaEventQuery(ev), cudaErrorNotReady);
    CUDA_OK(cudaStreamWaitEvent(b, ev, 0));
    CUDA_OK(cudaEventDestroy(ev));
    cr_assert_eq(seen_by(b, buf, probe, BUF), i, "b ran before the event's point");
  }
  CUDA_OK(cudaEventRecord(fresh, a));
  CUDA_OK(cudaEventSynchronize(fresh));
  CUDA_OK(cudaEventQuery(fresh));
  CUDA_OK(cudaEventDestroy(fresh));
  CUDA_IS(cudaEventQuery(fresh), cudaErrorInvalidResourceHandle);
  CUDA_IS(cudaGetLastError(), cudaErrorInvalidResourceHandle);
  cudaStreamDestroy(a);
  cudaStreamDestroy(b);
}

/* cudaFree and cudaDeviceSynchronize wait for every stream of the device;
 * cudaMallocAsync and cudaFreeAsync are stream-ordered and do not; a
 * block freed with cudaFreeAsync is poisoned when its stream gets there. */
Test(cuda_double, free_waits_for_the_device_free_async_does_not, .timeout = 10) {
  settings(300);
  static int ms = 150;
  void *x = NULL, *y = NULL;
  CUDA_OK(cudaMalloc(&x, 64));
  cudaStream_t s, other;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CUDA_OK(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));

  CUDA_OK(cudaLaunchHostFunc(s, hold, &ms));
  CUDA_OK(cudaLaunchHostFunc(s, raise_flag, NULL));
  double t0 = dbl_now();
  CUDA_OK(cudaMallocAsync(&y, 4096, other));
  CUDA_OK(cudaMemsetAsync(y, 1, 4096, other));
  CUDA_OK(cudaFreeAsync(y, other));
  CUDA_OK(cudaStreamSynchronize(other));
  cr_assert_lt(dbl_now() - t0, 0.12, "stream-ordered allocation waited for the device");
  cr_assert_eq(atomic_load(&flag), 0);
  cr_assert_eq(dbl_mem_find(y, 1, NULL), DBL_MEM_FREED);
  cr_assert_eq(((unsigned char *)y)[0], 0xDB, "freed memory is poisoned");
  CUDA_OK(cudaFree(x));
  cr_assert_eq(atomic_load(&flag), 1, "cudaFree returned before another stream's work ended");
  cr_assert_geq(dbl_now() - t0, 0.12);

  atomic_store(&flag, 0);
  CUDA_OK(cudaLaunchHostFunc(s, hold, &ms));
  CUDA_OK(cudaLaunchHostFunc(s, raise_flag, NULL));
  CUDA_OK(cudaMallocAsync(&y, 64, other));
  CUDA_OK(cudaLaunchHostFunc(other, hold, &ms));
  CUDA_OK(cudaFreeAsync(y, other));
  cr_assert_eq(dbl_mem_find(y, 64, NULL), DBL_MEM_DEVICE, "freed before its stream got there");
  CUDA_OK(cudaDeviceSynchronize());
  cr_assert_eq(atomic_load(&flag), 1);
  cr_assert_eq(dbl_mem_find(y, 64, NULL), DBL_MEM_FREED);
  dbl_stats_t st;
  dbl_stats(&st);
  cr_assert_geq(st.device_waits, 2);
  cr_assert_gt(st.late_items, 0);
  cudaStreamDestroy(s);
  cudaStreamDestroy(other);
}

/* Work queued before cudaStreamDestroy still runs; the handle is dead at
 * once. */
Test(cuda_double, destroyed_stream_finishes_its_work, .timeout = 10) {
  static int ms = 50;
  cudaStream_t s = settings_stream(300);
  CUDA_OK(cudaLaunchHostFunc(s, hold, &ms));
  CUDA_OK(cudaLaunchHostFunc(s, raise_flag, NULL));
  double t0 = dbl_now();
  CUDA_OK(cudaStreamDestroy(s));
  cr_assert_lt(dbl_now() - t0, 0.04, "cudaStreamDestroy waited");
  CUDA_IS(cudaStreamDestroy(s), cudaErrorInvalidResourceHandle);
  CUDA_IS(cudaLaunchHostFunc(s, raise_flag, NULL), cudaErrorInvalidResourceHandle);
  CUDA_IS(cudaStreamQuery((cudaStream_t)(uintptr_t)0x1234), cudaErrorInvalidResourceHandle);
  CUDA_OK(cudaDeviceSynchronize());
  cr_assert_eq(atomic_load(&flag), 1);
}

/* Kernel items on two streams, each noting when it runs. */
static atomic_int running, most, order_at;
static int order[64];

static void kernel_item(void *arg) {
  int now = atomic_fetch_add(&running, 1) + 1;
  int m = atomic_load(&most);
  while (now > m && !atomic_compare_exchange_weak(&most, &m, now)) {
  }
  order[atomic_fetch_add(&order_at, 1)] = (int)(intptr_t)arg;
  sleep_ms(10);
  atomic_fetch_sub(&running, 1);
}

static void kernels_on_two_streams(int n) {
  cudaStream_t s[2];
  CUDA_OK(cudaStreamCreateWithFlags(&s[0], cudaStreamNonBlocking));
  CUDA_OK(cudaStreamCreateWithFlags(&s[1], cudaStreamNonBlocking));
  for (int i = 0; i < n; i++)
    CUDA_OK(dbl_stream_submit(s[i % 2], "test kernel", 1, kernel_item, (void *)(intptr_t)i));
  CUDA_OK(cudaDeviceSynchronize());
  cudaStreamDestroy(s[0]);
  cudaStreamDestroy(s[1]);
}

/* NCCL_LAUNCH_ORDER_IMPLICIT=1: kernels of one device run one at a time,
 * in host submission order across streams. */
Test(cuda_double, strict_mode_serialises_kernels, .timeout = 10) {
  settings(300);
  setenv("NCCL_LAUNCH_ORDER_IMPLICIT", "1", 1);
  kernels_on_two_streams(16);
  cr_assert_eq(atomic_load(&most), 1, "%d kernels ran at once", atomic_load(&most));
  for (int i = 0; i < 16; i++) cr_assert_eq(order[i], i, "kernel %d ran %dth", order[i], i);
  dbl_stats_t st;
  dbl_stats(&st);
  cr_assert_geq(st.kernels, 16);
}

/* Without it, kernels of two streams overlap. */
Test(cuda_double, kernels_overlap_without_strict_mode, .timeout = 10) {
  settings(300);
  kernels_on_two_streams(16);
  cr_assert_eq(atomic_load(&most), 2, "kernels of two streams never overlapped");
}
