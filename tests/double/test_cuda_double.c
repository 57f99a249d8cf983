/* The CUDA half of the test double (tests/double/cuda_double.c and
 * cuda_twins.c) against the rules it models; each test can fail.
 *
 *   - devices: count, per-thread current device, CUDA_VISIBLE_DEVICES,
 *     bus ids, errors and their texts, the last error per thread;
 *   - ordering: a cudaMemset or a pageable cudaMemcpy returns before it
 *     lands, and a non-blocking stream can run before it (the bug the real
 *     GPU found) while a blocking stream cannot; the legacy stream is not
 *     ordered with non-blocking streams; events order streams; cudaFree
 *     and cudaDeviceSynchronize wait for every stream, cudaMallocAsync does
 *     not; strict mode (NCCL_LAUNCH_ORDER_IMPLICIT=1) runs kernels one at a
 *     time in host order;
 *   - the PTX twins, through meshpg's own launch code (groups/nccl/comm.c,
 *     local.c and widen.c are compiled into this program): bit for bit
 *     like a careful C reference over every f16/bf16 pattern, and like the
 *     real kernels on an H100 (hashes of their outputs);
 *   - memory: classification, poison, use after free and overruns abort,
 *     a hang is reported, a CUDA call from a host function aborts, a
 *     kernel without a twin aborts (each in a forked child).
 *
 * Build it alone with the double (not with libmeshpg or nccl_double.c:
 * it compiles groups/nccl/{comm,local,widen}.c itself and stubs the few
 * meshpg and NCCL functions those reach, below):
 *   cc -std=c11 -D_GNU_SOURCE -Iinclude -Imesh -Igroups -I/usr/local/cuda/include
 *      tests/double/test_cuda_double.c tests/double/cuda_double.c
 *      tests/double/cuda_twins.c -lcriterion -lpthread -lm
 * Under ThreadSanitizer the tests that race on purpose skip their racing
 * half: the race they show is the point, and TSan would report it. */
#include <criterion/criterion.h>
#include <criterion/logging.h>

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "double.h"

/* meshpg's launch code for the PTX kernels: the library's objects of
 * groups/nccl/comm.c, local.c and widen.c are linked in (meson.build). */
#include "nccl/nccl_internal.h"

#if defined(__SANITIZE_THREAD__)
#define UNDER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define UNDER_TSAN 1
#endif
#endif
#ifndef UNDER_TSAN
#define UNDER_TSAN 0
#endif

/* ------------------------------------------------------------------ */
/* Stubs of what comm.c, local.c and widen.c reach outside them        */
/* ------------------------------------------------------------------ */

static char last_fail[1024];

mpg_status mpg__fail(mpg_status status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_fail, sizeof last_fail, fmt, ap);
  va_end(ap);
  return status;
}

const char *mpg__kind_name(mpg__coll_kind kind) { return kind == MPG__ALL_REDUCE ? "all_reduce" : "?"; }
const char *mpg_dtype_name(mpg_dtype dtype) { return dtype == MPG_F16 ? "f16" : "dtype"; }
double mpg__now(void) { return dbl_now(); }

size_t mpg__dtype_size(mpg_dtype dt) {
  switch (dt) {
    case MPG_F16:
    case MPG_BF16: return 2;
    case MPG_F32:
    case MPG_I32: return 4;
    default: return 8;
  }
}

int mpg__dtype_is_half(mpg_dtype dt) { return dt == MPG_F16 || dt == MPG_BF16; }

const char *ncclGetLastError(ncclComm_t comm) {
  (void)comm;
  return "";
}

const char *ncclGetErrorString(ncclResult_t result) {
  (void)result;
  return "nccl stub";
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError) {
  (void)comm;
  *asyncError = ncclSuccess;
  return ncclSuccess;
}

/* ------------------------------------------------------------------ */
/* Helpers                                                             */
/* ------------------------------------------------------------------ */

#define CUDA_OK(expr)                                                          \
  do {                                                                         \
    cudaError_t e_ = (expr);                                                   \
    cr_assert_eq(e_, cudaSuccess, "%s: %s", #expr, cudaGetErrorName(e_));      \
  } while (0)

#define CUDA_IS(expr, want)                                                    \
  do {                                                                         \
    cudaError_t e_ = (expr);                                                   \
    cr_assert_eq(e_, (want), "%s: %s, expected %s", #expr, cudaGetErrorName(e_), \
                 cudaGetErrorName(want));                                      \
  } while (0)

/* The double's settings for a test: read once, at the first call. */
static void settings(int late_us) {
  char v[32];
  snprintf(v, sizeof v, "%d", late_us);
  setenv("MESHPG_DOUBLE_LATE_US", v, 1);
  setenv("MESHPG_DOUBLE_SEED", "7", 1);
  unsetenv("CUDA_VISIBLE_DEVICES");
  unsetenv("MESHPG_DOUBLE_DEVICES");
  unsetenv("NCCL_LAUNCH_ORDER_IMPLICIT");
  unsetenv("MESHPG_DOUBLE_OOM_RANK");
}

static void sleep_ms(double ms) {
  struct timespec ts = {(time_t)(ms / 1000), (long)(fmod(ms, 1000.0) * 1e6)};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

/* A host function that holds its stream for *(int *)ms milliseconds. */
static void CUDART_CB hold(void *ms) { sleep_ms(*(const int *)ms); }

static atomic_int flag;
static void CUDART_CB raise_flag(void *arg) {
  (void)arg;
  atomic_store(&flag, 1);
}

static void *dev_filled(size_t n, int byte) {
  void *p = NULL;
  CUDA_OK(cudaMalloc(&p, n));
  CUDA_OK(cudaMemset(p, byte, n));
  CUDA_OK(cudaDeviceSynchronize());
  return p;
}

/* The first byte of device buffer `buf` as work of stream s sees it: a
 * copy on s into `probe`, then s synchronised and probe read back. */
static int seen_by(cudaStream_t s, const void *buf, void *probe, size_t n) {
  unsigned char host[64];
  CUDA_OK(cudaMemcpyAsync(probe, buf, n, cudaMemcpyDeviceToDevice, s));
  CUDA_OK(cudaStreamSynchronize(s));
  CUDA_OK(cudaMemcpy(host, probe, n < sizeof host ? n : sizeof host, cudaMemcpyDeviceToHost));
  return host[0];
}

/* The functions that run in a child process of their own (they abort,
 * or need the double's settings read afresh): this program re-executed
 * with TEST_CUDA_DOUBLE_CHILD=<index in `children`>, which child_main()
 * runs before Criterion starts.  A fresh exec, not a bare fork, because
 * ThreadSanitizer cannot start threads in the fork of a threaded process. */
static void visible_empty(void), visible_two(void), visible_repeated(void);
static void memset_freed(void), memcpy_overrun(void), freed_before_the_copy_ran(void);
static void kernel_overrun(void), hang_forever(void), cuda_from_host_function(void);
static void kernel_without_twin(void), twin_of_other_ptx(void);
static void (*const children[])(void) = {
    visible_empty,  visible_two,  visible_repeated,        memset_freed,
    memcpy_overrun, freed_before_the_copy_ran, kernel_overrun, hang_forever,
    cuda_from_host_function, kernel_without_twin, twin_of_other_ptx};
enum { NCHILDREN = sizeof children / sizeof *children };

__attribute__((constructor)) static void child_main(void) {
  const char *v = getenv("TEST_CUDA_DOUBLE_CHILD");
  if (!v) return;
  int i = atoi(v);
  if (i >= 0 && i < NCHILDREN) children[i]();
  _exit(0);
}

/* Run fn in a child process with stderr captured: its exit status and
 * what it wrote. */
struct child {
  int status;
  char err[16384];
};

extern char **environ;

static void run_child(void (*fn)(void), struct child *out) {
  int which = -1;
  for (int i = 0; i < NCHILDREN; i++)
    if (children[i] == fn) which = i;
  cr_assert_geq(which, 0, "not a child function");
  size_t n = 0;
  while (environ[n]) n++;
  char **env = calloc(n + 2, sizeof *env), var[64];
  snprintf(var, sizeof var, "TEST_CUDA_DOUBLE_CHILD=%d", which);
  memcpy(env, environ, n * sizeof *env);
  env[n] = var;
  char *argv[] = {"test_cuda_double (child)", NULL};
  int fd[2];
  cr_assert_eq(pipe(fd), 0);
  fflush(NULL);
  pid_t pid = fork();
  cr_assert_neq(pid, -1);
  if (pid == 0) {
    close(fd[0]);
    dup2(fd[1], 2);
    execve("/proc/self/exe", argv, env);
    _exit(127);
  }
  free(env);
  close(fd[1]);
  size_t at = 0;
  ssize_t r;
  while ((r = read(fd[0], out->err + at, sizeof out->err - 1 - at)) > 0) at += (size_t)r;
  out->err[at] = '\0';
  close(fd[0]);
  cr_assert_eq(waitpid(pid, &out->status, 0), pid);
}

static void expect_abort(void (*fn)(void), const char *text) {
  struct child c;
  run_child(fn, &c);
  cr_assert(WIFSIGNALED(c.status) && WTERMSIG(c.status) == SIGABRT,
            "the child did not abort (status 0x%x); it wrote: %s", c.status, c.err);
  cr_assert(strstr(c.err, "meshpg double: ") && strstr(c.err, text),
            "the report lacks \"%s\": %s", text, c.err);
  cr_log_info("child aborted as expected: %s", c.err);
}

/* ------------------------------------------------------------------ */
/* Devices and errors                                                  */
/* ------------------------------------------------------------------ */

static void *set_device_2(void *arg) {
  int *seen = arg;
  if (cudaSetDevice(2) != cudaSuccess) return NULL;
  cudaGetDevice(seen);
  return NULL;
}

Test(cuda_double, devices_are_per_thread_and_errors_are_cudas) {
  settings(0);
  setenv("MESHPG_DOUBLE_DEVICES", "3", 1);
  int n = 0, d = -1;
  CUDA_OK(cudaGetDeviceCount(&n));
  cr_assert_eq(n, 3);
  cr_assert_eq(dbl_device_count(), 3);
  CUDA_OK(cudaGetDevice(&d));
  cr_assert_eq(d, 0);
  pthread_t t;
  int other = -1;
  pthread_create(&t, NULL, set_device_2, &other);
  pthread_join(t, NULL);
  cr_assert_eq(other, 2, "the other thread's device");
  CUDA_OK(cudaGetDevice(&d));
  cr_assert_eq(d, 0, "cudaSetDevice is per host thread");
  CUDA_IS(cudaSetDevice(3), cudaErrorInvalidDevice);
  CUDA_IS(cudaPeekAtLastError(), cudaErrorInvalidDevice);
  CUDA_IS(cudaGetLastError(), cudaErrorInvalidDevice);
  CUDA_IS(cudaGetLastError(), cudaSuccess);
  cr_assert_str_eq(cudaGetErrorString(cudaErrorMemoryAllocation), "out of memory");
  cr_assert_str_eq(cudaGetErrorString(cudaErrorInvalidValue), "invalid argument");
  cr_assert_str_eq(cudaGetErrorName(cudaErrorInvalidResourceHandle),
                   "cudaErrorInvalidResourceHandle");
  cr_assert_str_eq(cudaGetErrorString((cudaError_t)12345), "unrecognized error code");
  char bus[32];
  CUDA_OK(cudaDeviceGetPCIBusId(bus, sizeof bus, 2));
  cr_assert_str_eq(bus, "0000:12:00.0");
  CUDA_IS(cudaDeviceGetPCIBusId(bus, 8, 0), cudaErrorInvalidValue);
  struct cudaDeviceProp prop;
  CUDA_OK(cudaGetDeviceProperties(&prop, 1));
  cr_assert_eq(prop.pciBusID, 0x11);
}

static void visible_empty(void) {
  setenv("CUDA_VISIBLE_DEVICES", "", 1);
  int n = -7;
  _exit(cudaGetDeviceCount(&n) == cudaErrorNoDevice && n == -7 &&
                cudaSetDevice(0) == cudaErrorNoDevice
            ? 0
            : 1);
}

static void visible_two(void) {
  setenv("CUDA_VISIBLE_DEVICES", "5,1,9,2", 1); /* ends at 9 (past the 8) */
  int n = 0;
  char bus[32] = "";
  cudaGetDeviceCount(&n);
  cudaDeviceGetPCIBusId(bus, sizeof bus, 0);
  _exit(n == 2 && !strcmp(bus, "0000:15:00.0") ? 0 : 1);
}

static void visible_repeated(void) {
  setenv("CUDA_VISIBLE_DEVICES", "0,0", 1);
  int n = 0;
  _exit(cudaGetDeviceCount(&n) == cudaErrorInvalidDevice ? 0 : 1);
}

/* The runtime's reading of CUDA_VISIBLE_DEVICES, as seen on an H100. */
Test(cuda_double, cuda_visible_devices) {
  settings(0);
  void (*fns[])(void) = {visible_empty, visible_two, visible_repeated};
  for (size_t i = 0; i < sizeof fns / sizeof *fns; i++) {
    struct child c;
    run_child(fns[i], &c);
    cr_assert(WIFEXITED(c.status) && WEXITSTATUS(c.status) == 0, "case %zu: %s", i, c.err);
  }
}

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
  settings(300);
  static int ms = 50;
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
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

/* ------------------------------------------------------------------ */
/* The PTX twins                                                       */
/* ------------------------------------------------------------------ */

/* A careful reference, independent of cuda_twins.c: values as doubles,
 * roundings by nearbyint (to nearest even) on exactly scaled values. */
static double ref_f16(uint16_t h) {
  int e = (h >> 10) & 31, m = h & 1023;
  double v = e == 31 ? (m ? NAN : INFINITY) : e ? ldexp(1024 + m, e - 25) : ldexp(m, -24);
  return h & 0x8000 ? -v : v;
}

static double ref_bf16(uint16_t h) {
  int e = (h >> 7) & 255, m = h & 127;
  double v = e == 255 ? (m ? NAN : INFINITY) : e ? ldexp(128 + m, e - 134) : ldexp(m, -133);
  return h & 0x8000 ? -v : v;
}

/* v (not NaN) to a format of `mbits` mantissa bits, exponent bias `bias`,
 * all-ones exponent `emax`: nearest, ties to even, overflow to infinity. */
static uint16_t ref_round(double v, int mbits, int bias, int emax) {
  uint16_t sign = signbit(v) ? 0x8000 : 0;
  double a = fabs(v);
  int emin = 1 - bias;
  if (isinf(a)) return sign | (uint16_t)(emax << mbits);
  if (a < ldexp(1, emin)) { /* subnormal range */
    double m = nearbyint(ldexp(a, mbits - emin));
    return sign | (uint16_t)m; /* m == 1 << mbits is the smallest normal */
  }
  int e = ilogb(a);
  double m = nearbyint(ldexp(a, mbits - e));
  if (m == ldexp(1, mbits + 1)) m /= 2, e++;
  if (e + bias >= emax) return sign | (uint16_t)(emax << mbits);
  return sign | (uint16_t)((e + bias) << mbits | ((uint16_t)m - (1 << mbits)));
}

static uint16_t ref_to_f16(double v) { return ref_round(v, 10, 15, 31); }
static uint16_t ref_to_bf16(double v) { return ref_round(v, 7, 127, 255); }

static uint32_t f32_bits(float f) {
  uint32_t b;
  memcpy(&b, &f, 4);
  return b;
}

/* The PTX's f32 product: x times the scale rounded to f32; the product of
 * two floats is exact in a double, so (float) rounds once.  A NaN is
 * 0x7fffffff (PTX arithmetic gives the canonical NaN). */
static uint32_t ref_mul(double x, double scale) {
  float r = (float)(x * (double)(float)scale);
  return isnan(r) ? 0x7fffffffu : f32_bits(r);
}

static float from_bits(uint32_t b) {
  float f;
  memcpy(&f, &b, 4);
  return f;
}

static const double scales[] = {1.0, 0.5, -3.0, 0.1, 1.0 / 3.0, 1e-8, 65504.0, 1e30, 0.0, INFINITY};

/* meshpg's scale kernels on every pattern: f16/bf16 products rounded once. */
Test(cuda_double, scale_twins_round_like_the_ptx, .timeout = 20) {
  settings(0);
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  uint16_t *in = malloc(65536 * 2), *out = malloc(65536 * 2);
  for (int i = 0; i < 65536; i++) in[i] = (uint16_t)i;
  void *din = NULL, *dout = NULL;
  CUDA_OK(cudaMalloc(&din, 65536 * 2));
  CUDA_OK(cudaMalloc(&dout, 65536 * 2));
  CUDA_OK(cudaMemcpy(din, in, 65536 * 2, cudaMemcpyHostToDevice));
  CUDA_OK(cudaDeviceSynchronize()); /* s is not ordered after the legacy stream's copy */
  for (int bf = 0; bf < 2; bf++)
    for (size_t k = 0; k < sizeof scales / sizeof *scales; k++) {
      cr_assert_eq(mpg__nccl_scale(dout, din, 65536, bf ? MPG_BF16 : MPG_F16, scales[k], s, "t"),
                   MPG_OK, "%s", last_fail);
      CUDA_OK(cudaStreamSynchronize(s));
      CUDA_OK(cudaMemcpy(out, dout, 65536 * 2, cudaMemcpyDeviceToHost));
      int bad = 0, first = -1;
      uint16_t want0 = 0;
      for (int i = 0; i < 65536; i++) {
        double x = bf ? ref_bf16((uint16_t)i) : ref_f16((uint16_t)i);
        float p = from_bits(ref_mul(x, scales[k]));
        uint16_t want = isnan(p) ? (bf ? 0x7fc0 : 0x7fff) : bf ? ref_to_bf16(p) : ref_to_f16(p);
        if (out[i] != want && !bad++) first = i, want0 = want;
      }
      cr_assert_eq(bad, 0, "%s * %g: %d wrong, the first %#06x gave %#06x, expected %#06x",
                   bf ? "bf16" : "f16", scales[k], bad, first, out[first < 0 ? 0 : first],
                   want0);
    }
  free(in);
  free(out);
}

/* meshpg's widen (f16/bf16 -> f32 times the scale) and narrow (f32 ->
 * f16/bf16, NaN kept as a quiet NaN of its sign) kernels, through
 * mpg__nccl_widen / mpg__nccl_narrow. */
Test(cuda_double, widen_and_narrow_twins_round_like_the_ptx, .timeout = 20) {
  settings(0);
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  enum { N = 65536 };
  uint16_t *in = malloc(N * 2), *out = malloc(N * 2);
  float *wide = malloc(N * 4);
  for (int i = 0; i < N; i++) in[i] = (uint16_t)i;
  void *send = NULL, *recv = NULL;
  CUDA_OK(cudaMalloc(&send, N * 2));
  CUDA_OK(cudaMalloc(&recv, N * 2));
  CUDA_OK(cudaMemcpy(send, in, N * 2, cudaMemcpyHostToDevice));
  CUDA_OK(cudaDeviceSynchronize()); /* s is not ordered after the legacy stream's copy */
  mpg__comm c;
  memset(&c, 0, sizeof c);
  c.size = 1;
  for (int bf = 0; bf < 2; bf++)
    for (size_t k = 0; k < sizeof scales / sizeof *scales; k++) {
      mpg__coll coll, w;
      memset(&coll, 0, sizeof coll);
      coll.kind = MPG__ALL_REDUCE;
      coll.send = send;
      coll.recv = recv;
      coll.count = N;
      coll.dtype = bf ? MPG_BF16 : MPG_F16;
      cr_assert_eq(mpg__nccl_widen(&c, &coll, scales[k], s, "t", &w), MPG_OK, "%s", last_fail);
      CUDA_OK(cudaMemcpyAsync(wide, w.recv, N * 4, cudaMemcpyDeviceToHost, s));
      cr_assert_eq(mpg__nccl_narrow(&coll, &w, 1, s, "t"), MPG_OK, "%s", last_fail);
      CUDA_OK(cudaMemcpyAsync(out, recv, N * 2, cudaMemcpyDeviceToHost, s));
      CUDA_OK(cudaStreamSynchronize(s));
      int wbad = 0, nbad = 0, wfirst = -1, nfirst = -1;
      for (int i = 0; i < N; i++) {
        double x = bf ? ref_bf16((uint16_t)i) : ref_f16((uint16_t)i);
        uint32_t want = ref_mul(x, scales[k]);
        if (f32_bits(wide[i]) != want && !wbad++) wfirst = i;
        float p = from_bits(want);
        uint16_t back = isnan(p) ? (uint16_t)(bf ? (want >> 16) | 0x40
                                                 : ((want >> 16) & 0x8000) | 0x7e00)
                        : bf     ? ref_to_bf16(p)
                                 : ref_to_f16(p);
        if (out[i] != back && !nbad++) nfirst = i;
      }
      cr_assert_eq(wbad, 0, "%s widen * %g: %d wrong, the first of input %#06x",
                   bf ? "bf16" : "f16", scales[k], wbad, wfirst);
      cr_assert_eq(nbad, 0, "%s narrow after * %g: %d wrong, the first of input %#06x",
                   bf ? "bf16" : "f16", scales[k], nbad, nfirst);
    }
  free(in);
  free(out);
  free(wide);
}

/* FNV-1a, as the hashes of the H100's outputs were taken. */
static uint64_t fnv(const void *p, size_t n, uint64_t h) {
  const unsigned char *c = p;
  for (size_t i = 0; i < n; i++) h = (h ^ c[i]) * 0x100000001b3ull;
  return h;
}

static uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/* The scales the H100 ran each kernel with (NaN, infinities, f32
 * subnormals and f64 values that f32 rounds included). */
static const double gpu_scales[16] = {1.0, 0.5, 2.0, -3.0, 1.0 / 3.0, 0.1, 1e-8, 65504.0,
                                      1e30, 1e-40, 0.0, -0.0, INFINITY, NAN, 3.0e38, 7.0};

/* The inputs of the H100 run: every 16-bit pattern; for f32 each upper
 * half with the lower halves that decide rounding (0, all ones, 2^b and
 * its neighbours) or a pseudo-random one; for f64 each top 16 bits with
 * pseudo-random rest. */
static void *gpu_inputs(int which, size_t *n, size_t *isz) {
  if (which == 0) {
    uint16_t *h = malloc(65536 * 2);
    for (int i = 0; i < 65536; i++) h[i] = (uint16_t)i;
    *n = 65536, *isz = 2;
    return h;
  }
  if (which == 1) {
    uint32_t lows[50];
    int nl = 0;
    lows[nl++] = 0;
    lows[nl++] = 0xffff;
    for (int b = 0; b < 16; b++) {
      lows[nl++] = 1u << b;
      lows[nl++] = (1u << b) - 1;
      lows[nl++] = ((1u << b) + 1) & 0xffff;
    }
    uint32_t *x = malloc(65536 * 50 * 4);
    for (size_t hi = 0; hi < 65536; hi++)
      for (int l = 0; l < nl; l++) x[hi * nl + l] = (uint32_t)(hi << 16) | lows[l];
    *n = 65536 * 50, *isz = 4;
    return x;
  }
  if (which == 2) {
    uint32_t *y = malloc(131072 * 4);
    for (uint32_t hi = 0; hi < 65536; hi++) {
      y[2 * hi] = hi << 16;
      y[2 * hi + 1] = (hi << 16) | (uint32_t)(mix(hi) & 0xffff);
    }
    *n = 131072, *isz = 4;
    return y;
  }
  uint64_t *z = malloc(65536 * 8);
  for (uint64_t hi = 0; hi < 65536; hi++) z[hi] = (hi << 48) | (mix(hi + 7) & 0xffffffffffffull);
  *n = 65536, *isz = 8;
  return z;
}

/* One kernel through meshpg's launch code: scale (kind 0), widen (1) or
 * narrow (2) of n elements of din into dout, on s. */
static void meshpg_kernel(int kind, mpg_dtype dt, void *dout, void *din, size_t n, double scale,
                          cudaStream_t s) {
  if (kind == 0) {
    cr_assert_eq(mpg__nccl_scale(dout, din, n, dt, scale, s, "gt"), MPG_OK, "%s", last_fail);
    return;
  }
  mpg__comm c;
  memset(&c, 0, sizeof c);
  c.size = 1;
  mpg__coll k, w;
  memset(&k, 0, sizeof k);
  k.kind = MPG__ALL_REDUCE;
  k.count = n;
  k.dtype = dt;
  if (kind == 1) {
    k.send = din;
    cr_assert_eq(mpg__nccl_widen(&c, &k, scale, s, "gt", &w), MPG_OK, "%s", last_fail);
    CUDA_OK(cudaMemcpyAsync(dout, w.recv, n * 4, cudaMemcpyDeviceToDevice, s));
    cr_assert_eq(mpg__nccl_narrow(&k, &w, 0, s, "gt"), MPG_OK, "%s", last_fail);
  } else {
    void *dummy = NULL; /* the f32 buffer narrow frees */
    CUDA_OK(cudaMallocAsync(&dummy, 4, s));
    k.recv = dout;
    w = k;
    w.send = dummy;
    w.recv = din;
    cr_assert_eq(mpg__nccl_narrow(&k, &w, 1, s, "gt"), MPG_OK, "%s", last_fail);
  }
}

/* Bit for bit what the real kernels gave on an H100 (CUDA 13, the PTX of
 * groups/nccl/local.c and widen.c) over the inputs above: FNV-1a of each
 * kernel's outputs, scale after scale.  The NaN payloads are in these. */
Test(cuda_double, twins_match_the_h100, .timeout = 30) {
  settings(0);
  static const struct {
    int kind, input, nscales;
    mpg_dtype dt;
    size_t osz;
    uint64_t hash;
  } k[] = {
      {0, 0, 16, MPG_F16, 2, 0xa2935927651c0b05ull},  /* mpg_scale_f16 */
      {0, 0, 16, MPG_BF16, 2, 0x2a346e6762691339ull}, /* mpg_scale_bf16 */
      {1, 0, 16, MPG_F16, 4, 0xf061c40e29c28199ull},  /* mpg_widen_f16 */
      {1, 0, 16, MPG_BF16, 4, 0xef2c9cb2b40573c5ull}, /* mpg_widen_bf16 */
      {2, 1, 1, MPG_F16, 2, 0xd0a34b6cfe6bc295ull},   /* mpg_narrow_f16 */
      {2, 1, 1, MPG_BF16, 2, 0x87b86eb83e7f0da5ull},  /* mpg_narrow_bf16 */
      {0, 2, 16, MPG_F32, 4, 0x548b6d597a0f399dull},  /* mpg_scale_f32 */
      {0, 3, 16, MPG_F64, 8, 0x75b97da6dfcc228aull},  /* mpg_scale_f64 */
  };
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  for (size_t i = 0; i < sizeof k / sizeof *k; i++) {
    size_t n, isz;
    void *in = gpu_inputs(k[i].input, &n, &isz), *din = NULL, *dout = NULL;
    char *out = malloc(n * k[i].osz);
    CUDA_OK(cudaMalloc(&din, n * isz));
    CUDA_OK(cudaMalloc(&dout, n * k[i].osz));
    CUDA_OK(cudaMemcpy(din, in, n * isz, cudaMemcpyHostToDevice));
    CUDA_OK(cudaDeviceSynchronize()); /* s is not ordered after the legacy stream's copy */
    uint64_t h = 0xcbf29ce484222325ull;
    for (int sc = 0; sc < k[i].nscales; sc++) {
      meshpg_kernel(k[i].kind, k[i].dt, dout, din, n, gpu_scales[sc], s);
      CUDA_OK(cudaMemcpyAsync(out, dout, n * k[i].osz, cudaMemcpyDeviceToHost, s));
      CUDA_OK(cudaStreamSynchronize(s));
      h = fnv(out, n * k[i].osz, h);
    }
    cr_assert_eq(h, k[i].hash, "kernel %zu: hash %#llx, the H100's %#llx", i,
                 (unsigned long long)h, (unsigned long long)k[i].hash);
    cudaFree(din);
    cudaFree(dout);
    free(in);
    free(out);
  }
}

/* A launch copies the argument values: changing them afterwards, before
 * the stream runs the kernel, changes nothing. */
Test(cuda_double, launch_copies_its_arguments, .timeout = 10) {
  settings(300);
  static int ms = 50;
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  float host[4] = {1, 2, 3, 4}, back[4];
  void *buf = NULL;
  CUDA_OK(cudaMalloc(&buf, sizeof host));
  CUDA_OK(cudaMemcpy(buf, host, sizeof host, cudaMemcpyHostToDevice));
  CUDA_OK(cudaDeviceSynchronize()); /* s is not ordered after the legacy stream's copy */
  CUDA_OK(cudaLaunchHostFunc(s, hold, &ms));
  cudaKernel_t kern = NULL; /* local.c's f32 scale kernel */
  cr_assert_eq(mpg__nccl_scale_kernel_f32(&kern), cudaSuccess);
  void *dst = buf, *src = buf;
  uint64_t n = 4;
  double scale = 2.0;
  void *args[4] = {&dst, &src, &n, &scale};
  dim3 g = {1, 1, 1}, b = {256, 1, 1};
  CUDA_OK(cudaLaunchKernel((const void *)kern, g, b, args, 0, s));
  scale = 100.0;
  n = 1;
  CUDA_OK(cudaStreamSynchronize(s));
  CUDA_OK(cudaMemcpy(back, buf, sizeof back, cudaMemcpyDeviceToHost));
  for (int i = 0; i < 4; i++) cr_assert_eq(back[i], 2 * host[i]);
  dim3 zero = {0, 1, 1};
  CUDA_IS(cudaLaunchKernel((const void *)kern, zero, b, args, 0, s),
          cudaErrorInvalidConfiguration);
  CUDA_IS(cudaLaunchKernel((const void *)host, g, b, args, 0, s), cudaErrorInvalidDeviceFunction);
}

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

static void memset_freed(void) {
  void *p = NULL;
  cudaMalloc(&p, 256);
  cudaFree(p);
  cudaMemset(p, 0, 16);
}

static void memcpy_overrun(void) {
  void *p = NULL;
  char host[512] = {0};
  cudaMalloc(&p, 256);
  cudaMemcpy(p, host, 300, cudaMemcpyHostToDevice);
}

static void freed_before_the_copy_ran(void) {
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

static void kernel_overrun(void) {
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

static void hang_forever(void) {
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

static void cuda_from_host_function(void) {
  cudaLaunchHostFunc(0, calls_cuda, NULL);
  cudaDeviceSynchronize();
}

static void kernel_without_twin(void) {
  cudaLibrary_t lib;
  cudaKernel_t k;
  const char *ptx = ".version 6.0\n.target sm_52\n.address_size 64\n"
                    ".visible .entry my_kernel(.param .u64 p)\n{\n  ret;\n}\n";
  if (cudaLibraryLoadData(&lib, ptx, NULL, NULL, 0, NULL, NULL, 0)) _exit(3);
  if (cudaLibraryGetKernel(&k, lib, "not_there") != cudaErrorSymbolNotFound) _exit(4);
  cudaLibraryGetKernel(&k, lib, "my_kernel");
}

static void twin_of_other_ptx(void) {
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

/* MESHPG_DOUBLE_OOM_RANK fails that rank's cudaMallocAsync only. */
Test(cuda_double, oom_injection_hits_one_rank, .timeout = 10) {
  settings(0);
  setenv("MESHPG_DOUBLE_OOM_RANK", "1", 1);
  pthread_t t[3];
  for (intptr_t r = 0; r < 3; r++) pthread_create(&t[r], NULL, oom_rank, (void *)r);
  for (int r = 0; r < 3; r++) {
    void *e;
    pthread_join(t[r], &e);
    cr_assert_eq((cudaError_t)(intptr_t)e, r == 1 ? cudaErrorMemoryAllocation : cudaSuccess,
                 "rank %d: %s", r, cudaGetErrorName((cudaError_t)(intptr_t)e));
  }
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
  settings(100);
  setenv("NCCL_LAUNCH_ORDER_IMPLICIT", "1", 1);
  pthread_t t[4];
  for (intptr_t r = 0; r < 4; r++) pthread_create(&t[r], NULL, busy_rank, (void *)r);
  for (int r = 0; r < 4; r++) {
    void *bad;
    pthread_join(t[r], &bad);
    cr_assert_eq((intptr_t)bad, 0, "rank %d read %d wrong values", r, (int)(intptr_t)bad);
  }
}
