/* The NCCL half of the test double's tests (test_nccl_double.c, which
 * lists its files): what its files share. */
#ifndef MESHPG_TESTS_TEST_NCCL_DOUBLE_H
#define MESHPG_TESTS_TEST_NCCL_DOUBLE_H

#include <criterion/criterion.h>

#include <cuda_runtime.h>
#include <nccl.h>

#include "../support/time_bound.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "double.h"

#define RCHECK(cond, ...)                                                  \
  do {                                                                     \
    if (!(cond)) return rank_fail(rk->rank, __LINE__, __VA_ARGS__);        \
  } while (0)

#define NCCL_OK(expr)                                                          \
  do {                                                                         \
    ncclResult_t r_ = (expr);                                                  \
    RCHECK(r_ == ncclSuccess, "%s: %s (%s)", #expr, ncclGetErrorString(r_),    \
           ncclGetLastError(NULL));                                            \
  } while (0)

#define CUDA_OK(expr)                                                          \
  do {                                                                         \
    cudaError_t e_ = (expr);                                                   \
    RCHECK(e_ == cudaSuccess, "%s: %s", #expr, cudaGetErrorString(e_));        \
  } while (0)

struct rank {
  int rank, n;
  ncclComm_t comm;
  void *arg;
};

typedef int (*rank_fn)(struct rank *);

struct world {
  int n, blocking, no_comm;
  ncclUniqueId id;
  rank_fn fn;
  void *arg;
};

struct thread_arg {
  struct world *w;
  int rank;
};

#define EXPECT_ERR(expr, code, text)                                                   \
  do {                                                                                 \
    ncclResult_t r_ = (expr);                                                          \
    RCHECK(r_ == (code) && strstr(ncclGetLastError(NULL), (text)),                    \
           "%s gave %s (\"%s\"), want %s with \"%s\"", #expr, ncclGetErrorString(r_),  \
           ncclGetLastError(NULL), ncclGetErrorString(code), text);                    \
  } while (0)

/* ------------------------------------------------------------------ */
/* Shared between the files of the test                             */
/* ------------------------------------------------------------------ */

/* test_nccl_double.c */
int rank_fail(int rank, int line, const char *fmt, ...);
void run_world_cfg(int n, int blocking, rank_fn fn, void *arg);
void run_world(int n, rank_fn fn, void *arg);
void run_threads(int n, rank_fn fn, void *arg);
double now_s(void);

/* Two communicators of 2 ranks, A and B, and 64 bytes of device memory. */
struct comm_pair {
  ncclComm_t a, b;
  void *x;
};
int comm_pair_open(struct rank *rk, struct comm_pair *p);

/* test_nccl_double_lifecycle.c */
int registered(struct rank *rk);

#endif
