/* Private to mpi_worker (mpi_worker.c, mpi_worker_coll.c,
 * mpi_worker_p2p.c): the mode's failure count and report, element access,
 * references, and the collectives and modes each part defines. */
#ifndef MESHPG_TEST_MPI_WORKER_H
#define MESHPG_TEST_MPI_WORKER_H

#include <stddef.h>
#include <stdio.h>

#include "internal.h" /* MPG__OP_PREMUL_SUM */

#define FAIL(...)                                                     \
  do {                                                                \
    if (g_failures++ < 20) {                                          \
      printf("FAIL %s rank %d: ", g_mode, g_rank);                    \
      printf(__VA_ARGS__);                                            \
      printf("\n");                                                   \
      fflush(stdout);                                                 \
    }                                                                 \
  } while (0)

/* Check a status; on failure print where and the library's message. */
#define CHECK(call)                                                   \
  do {                                                                \
    mpg_status st_ = (call);                                          \
    if (st_ != MPG_OK)                                                \
      FAIL("%s:%d: %s -> %s: %s", __FILE__, __LINE__, #call,          \
           mpg_status_name(st_), mpg_last_error());                   \
  } while (0)

static const mpg_dtype all_dtypes[] = {MPG_F32, MPG_F64, MPG_F16,
                                       MPG_BF16, MPG_I32, MPG_I64};
enum { NDTYPES = 6 };

typedef struct {
  mpg_group *g;
  const char *name;
  int size, pos;
  int members[64];
} grp;

enum { COUNT = 37 };

extern const char *g_mode;
extern int g_rank;
extern int g_failures;
double test_timeout(void);
int is_float(mpg_dtype dt);
void put(mpg_dtype dt, void *buf, size_t i, double v);
double get(mpg_dtype dt, const void *buf, size_t i);
double val(mpg_dtype dt, int r, size_t i);
const char *op_name(mpg_op op);
double reduce_ref(mpg_dtype dt, mpg_op op, const int *members, int n, size_t i, double scale);
int failed(void);
int setup(int world, double timeout_s, int lazy, mpg_mesh **mesh, mpg_ctx **ctx);
void test_all_reduce(const grp *G);
void test_async(const grp *G);
void test_broadcast(const grp *G);
void test_all_gather(const grp *G);
void test_reduce_scatter(const grp *G);
void test_send_recv(const grp *G);
void test_membership(const grp *G, const mpg_mesh *mesh, int s);
void test_design(mpg_ctx *ctx, const mpg_mesh *mesh);
int run_p2p_batch(int world);
int run_all_to_all(int world);
int run_p2p_timeout(int world);
int run_a2a_timeout(int world);

#endif
