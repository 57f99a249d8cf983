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
 * Build it alone with the double (not with libmeshpg or nccl_double*.c:
 * it compiles groups/nccl/{comm,local,widen}.c itself and stubs the few
 * meshpg and NCCL functions those reach, below):
 *   cc -std=c11 -D_GNU_SOURCE -Iinclude -Imesh -Igroups -I/usr/local/cuda/include
 *      tests/double/test_cuda_double*.c tests/double/cuda_double*.c
 *      tests/double/cuda_twins.c -lcriterion -lpthread -lm
 * Under ThreadSanitizer the tests that race on purpose skip their racing
 * half: the race they show is the point, and TSan would report it. */

/* The files of this test (their shared helpers are in test_cuda_double.h):
 *   test_cuda_double.c         the stubs, helpers, child processes, and
 *                              devices and errors;
 *   test_cuda_double_order.c   ordering: streams, events, frees, kernels;
 *   test_cuda_double_twins.c   the PTX kernels' CPU twins;
 *   test_cuda_double_misuse.c  memory and loud failures, ranks as threads. */

#include "test_cuda_double.h"

/* ------------------------------------------------------------------ */
/* Stubs of what comm.c, local.c and widen.c reach outside them        */
/* ------------------------------------------------------------------ */

char last_fail[1024];

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

/* The double's settings for a test: read once, at the first call. */
void settings(int late_us) {
  char v[32];
  snprintf(v, sizeof v, "%d", late_us);
  setenv("MESHPG_DOUBLE_LATE_US", v, 1);
  setenv("MESHPG_DOUBLE_SEED", "7", 1);
  unsetenv("CUDA_VISIBLE_DEVICES");
  unsetenv("MESHPG_DOUBLE_DEVICES");
  unsetenv("NCCL_LAUNCH_ORDER_IMPLICIT");
  unsetenv("MESHPG_DOUBLE_OOM_RANK");
}

/* settings(late_us), then a new non-blocking stream. */
cudaStream_t settings_stream(int late_us) {
  settings(late_us);
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return s;
}

void sleep_ms(double ms) {
  struct timespec ts = {(time_t)(ms / 1000), (long)(fmod(ms, 1000.0) * 1e6)};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

/* A host function that holds its stream for *(int *)ms milliseconds. */
void CUDART_CB hold(void *ms) { sleep_ms(*(const int *)ms); }

atomic_int flag;
void CUDART_CB raise_flag(void *arg) {
  (void)arg;
  atomic_store(&flag, 1);
}

void *dev_filled(size_t n, int byte) {
  void *p = NULL;
  CUDA_OK(cudaMalloc(&p, n));
  CUDA_OK(cudaMemset(p, byte, n));
  CUDA_OK(cudaDeviceSynchronize());
  return p;
}

/* The first byte of device buffer `buf` as work of stream s sees it: a
 * copy on s into `probe`, then s synchronised and probe read back. */
int seen_by(cudaStream_t s, const void *buf, void *probe, size_t n) {
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

extern char **environ;

void run_child(void (*fn)(void), struct child *out) {
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

void expect_abort(void (*fn)(void), const char *text) {
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

void visible_empty(void) {
  setenv("CUDA_VISIBLE_DEVICES", "", 1);
  int n = -7;
  _exit(cudaGetDeviceCount(&n) == cudaErrorNoDevice && n == -7 &&
                cudaSetDevice(0) == cudaErrorNoDevice
            ? 0
            : 1);
}

void visible_two(void) {
  setenv("CUDA_VISIBLE_DEVICES", "5,1,9,2", 1); /* ends at 9 (past the 8) */
  int n = 0;
  char bus[32] = "";
  cudaGetDeviceCount(&n);
  cudaDeviceGetPCIBusId(bus, sizeof bus, 0);
  _exit(n == 2 && !strcmp(bus, "0000:15:00.0") ? 0 : 1);
}

void visible_repeated(void) {
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
