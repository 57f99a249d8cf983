/* Private helpers of test_nccl (test_nccl.c, test_nccl_ranks.c,
 * test_nccl_regs.c; defined in test_nccl_util.c): device buffers of a
 * pattern and their checks, the backend ops on a one-rank NCCL world, and
 * the public API on a world of one rank. */
#ifndef MESHPG_TEST_NCCL_H
#define MESHPG_TEST_NCCL_H

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

/* Expected values on a world of `nranks` ranks where rank r contributed
 * pattern(i, r). */
typedef struct {
  mpg_dtype dt;
  mpg_op op;
  int nranks;
  double scale;
  size_t offset; /* reduce_scatter: first element of this rank's block */
} expect_arg;

typedef struct {
  mpg_mesh *mesh;
  mpg_ctx *ctx;
  mpg_group *dp, *world;
} world1;

/* What every thread rank of run_nccl_threads starts from: the first member
 * of each test's job struct. */
typedef struct {
  int rank, world, ndev;
  const ncclUniqueId *id; /* the caller's unique id, or NULL */
  mpg_mesh *mesh;
} nccl_job;

int gpu_count(cudaError_t *err);
int require_gpu(void);
double get(mpg_dtype dt, const void *buf, size_t i);
void put(mpg_dtype dt, void *buf, size_t i, double v);
double pattern(size_t i, int rank);
void *dev_fill(mpg_dtype dt, size_t n, int rank);
void *dev_zero(mpg_dtype dt, size_t n);
void expect_dev(const char *what, mpg_dtype dt, const void *dev, size_t n,
                double (*want)(size_t i, void *arg), void *arg);
double want_reduce(size_t i, void *p);
double want_pattern0(size_t i, void *p);
double want_pattern_of(size_t i, void *p);
mpg__comm *backend_world1(void);
mpg_status backend_run(mpg__comm *c, const mpg__coll *k);
mpg__coll coll_of(mpg__coll_kind kind, const void *send, void *recv,
                  size_t count, mpg_dtype dt, mpg_op op, void *stream);
void log_device(void);
/* MPG_INIT_OPTS_INIT for rank `rank` of `world` on the nccl backend, on
 * CUDA device `device`, with a collective timeout of timeout_s (0: the
 * default). */
mpg_init_opts nccl_opts(int rank, int world, int device, double timeout_s);
/* nccl_opts for the job's rank: device rank % ndev, local rank = rank of a
 * local world = world, the job's unique id. */
mpg_init_opts nccl_job_opts(const nccl_job *j, double timeout_s);
/* Runs fn on `world` threads and joins them.  jobs: `world` structs of
 * `size` bytes, each starting with a nccl_job; they are zeroed and their
 * nccl_job set to (rank, world, ndev, id, mesh) first. */
void run_nccl_threads(void *(*fn)(void *), void *jobs, size_t size, int world, int ndev,
                      const ncclUniqueId *id, mpg_mesh *mesh);
/* A new CUDA stream that does not wait on the legacy default stream. */
cudaStream_t nonblocking_stream(void);
/* Destroys a job's context; its failure becomes *st, with msg "destroy:
 * ...", unless *st holds a failure already. */
void destroy_keep_first(mpg_ctx *ctx, mpg_status *st, char *msg, size_t cap);
world1 public_world1(void);
world1 public_world1_on(int device);
void world1_free(world1 *w);

#endif
