/* One MPI process of test_trace_mpi.c (issue 46, item 3), started under
 * `mpirun -np 4`:
 *
 *   trace_mpi_worker DIR OWN TIMEOUT_S
 *
 * A dp=2,tp=2 job whose world rank 1 gives its third tp all-reduce twice
 * the count of its partner's (512 against 256 f32); then one all-reduce
 * over the world, which the ranks of the other tp group reach.  OWN 1: the
 * program initialises MPI itself (MPI_COMM_WORLD's error handler is then
 * the application's, MPI_ERRORS_ARE_FATAL); 0: meshpg does.  The
 * issue-order checker is off (MESHPG_CHECK_ORDER=0), so that MPI meets the
 * mismatch.  Every rank prints
 *
 *   TM rank R STATUS|MESSAGE
 *
 * (STATUS: the first failing call's status name, OK when none failed),
 * destroys its context and exits 0 (worker_main.h); the flight recorder
 * dumps go to DIR. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "meshpg.h"
#include "mesh_util.h"
#include "worker_main.h"

#define TM_WORLD 4
#define TM_OPS 4

static int run_job(worker *w) {
  int own = atoi(w->argv[1]), provided = 0;
  setenv("MESHPG_CHECK_ORDER", "0", 1);
  if (own) MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
  mpg_mesh *mesh = NULL;
  mpg_status st = mesh_build("dp=2,tp=2", NULL, TM_WORLD, &mesh);
  mpg_init_opts o = w->opts; /* rank and world from mpirun's environment */
  o.backend.timeout_s = atof(w->argv[2]);
  o.trace_dir = w->argv[0];
  mpg_ctx *ctx = NULL;
  mpg_group *tp = NULL, *world = NULL;
  if (!st) st = mpg_ctx_create(mesh, &o, &ctx);
  if (!st) st = mpg_ctx_group(ctx, "tp", &tp);
  if (!st) st = mpg_ctx_group(ctx, "world", &world);
  int rank = ctx ? mpg_ctx_rank(ctx) : -1;
  static float x[512];
  for (int i = 0; i < TM_OPS && !st; i++) {
    size_t n = i == 2 && rank == 1 ? 512 : 256; /* the fault */
    st = mpg_all_reduce(tp, x, x, n, MPG_F32, MPG_OP_SUM, NULL, NULL);
  }
  if (!st) st = mpg_all_reduce(world, x, x, 1, MPG_F32, MPG_OP_SUM, NULL, NULL);
  char msg[2048];
  snprintf(msg, sizeof msg, "%s", st ? mpg_last_error() : "");
  for (char *p = msg; *p; p++)
    if (*p == '\n') *p = ' ';
  printf("TM rank %d %s|%s\n", rank, st ? mpg_status_name(st) : "OK", msg);
  mpg_status d = ctx ? mpg_ctx_destroy(ctx) : MPG_OK;
  if (d) printf("FAIL rank %d: mpg_ctx_destroy: %s\n", rank, mpg_last_error());
  mpg_mesh_destroy(mesh);
  if (own) MPI_Finalize();
  return 0;
}

static const worker_case cases[] = {{NULL, "DIR OWN TIMEOUT_S", 3, 3, run_job, WK_OWN_LINES}};
WORKER_MAIN(cases)
