/* The CUDA half of the test double's tests (test_cuda_double.c, which
 * lists its files): what its files share. */
#ifndef MESHPG_TESTS_TEST_CUDA_DOUBLE_H
#define MESHPG_TESTS_TEST_CUDA_DOUBLE_H

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

/* Run fn in a child process with stderr captured: its exit status and
 * what it wrote. */
struct child {
  int status;
  char err[16384];
};

/* ------------------------------------------------------------------ */
/* Shared between the files of the test                             */
/* ------------------------------------------------------------------ */

/* test_cuda_double.c */
extern char last_fail[1024];
void settings(int late_us);
cudaStream_t settings_stream(int late_us);
void sleep_ms(double ms);
void CUDART_CB hold(void *ms);
extern atomic_int flag;
void CUDART_CB raise_flag(void *arg);
void *dev_filled(size_t n, int byte);
int seen_by(cudaStream_t s, const void *buf, void *probe, size_t n);
void run_child(void (*fn)(void), struct child *out);
void expect_abort(void (*fn)(void), const char *text);
void visible_empty(void);
void visible_two(void);
void visible_repeated(void);

/* test_cuda_double_misuse.c */
void memset_freed(void);
void memcpy_overrun(void);
void freed_before_the_copy_ran(void);
void kernel_overrun(void);
void hang_forever(void);
void cuda_from_host_function(void);
void kernel_without_twin(void);
void twin_of_other_ptx(void);

#endif
