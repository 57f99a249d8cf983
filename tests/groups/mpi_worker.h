/* Private to mpi_worker (mpi_worker.c, mpi_worker_coll.c,
 * mpi_worker_p2p.c): element access, references, and the collectives and
 * modes each part defines; the report (fail, CHECK) is worker_report.h's. */
#ifndef MESHPG_TEST_MPI_WORKER_H
#define MESHPG_TEST_MPI_WORKER_H

#include <stddef.h>
#include <stdio.h>

#include "internal.h" /* MPG__OP_PREMUL_SUM */
#include "../support/worker_main.h" /* fail, CHECK, failures, g_mode, g_rank */

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

double test_timeout(void);
int is_float(mpg_dtype dt);
void put(mpg_dtype dt, void *buf, size_t i, double v);
double get(mpg_dtype dt, const void *buf, size_t i);
double val(mpg_dtype dt, int r, size_t i);
const char *op_name(mpg_op op);
double reduce_ref(mpg_dtype dt, mpg_op op, const int *members, int n, size_t i, double scale);
int failed(void);
int timed_out(const char *what, const char *call, mpg_status st, double dt, double timeout,
              int world);
int setup(int world, double timeout_s, int lazy, mpg_mesh **mesh, mpg_ctx **ctx);
int healthy_world(int world, double timeout, mpg_mesh **mesh, mpg_ctx **ctx, mpg_group **wg);
void test_all_reduce(const grp *G);
void test_async(const grp *G);
void test_broadcast(const grp *G);
void test_all_gather(const grp *G);
void test_reduce_scatter(const grp *G);
void test_send_recv(const grp *G);
void test_membership(const grp *G, const mpg_mesh *mesh, int s);
void test_design(mpg_ctx *ctx, const mpg_mesh *mesh);
int run_p2p_batch(worker *wk);
int run_all_to_all(worker *wk);
int run_p2p_timeout(worker *wk);
int run_a2a_timeout(worker *wk);

#endif
