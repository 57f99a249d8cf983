/* One MPI process of the flight recorder's fault injections
 * (fault_trace.h), started by test_trace_faults.c under `mpirun -np 8`:
 *
 *   trace_fault_worker SEED FIRST COUNT BASE [DRAW]
 *
 * runs cases FIRST .. FIRST + COUNT - 1 of the mpi backend (of draw DRAW,
 * a tf_draw number, 0 when left out) one after another, each with a fresh
 * mesh, context and sync (MESHPG_SHM and MESHPG_CHECK_ORDER as the case
 * says) dumping into BASE/case-K, the ranks meeting in an
 * MPI_Barrier between cases.  After each case every rank prints
 *
 *   TF case K rank R STATUS STEP SLOT INJECTED REQUESTED WHAT|MESSAGE
 *
 * (STATUS: the first error's mpg_status number, 0 when every call was
 * OK); the test judges the dumps (worker_main.h). */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fault_trace.h"
#include "worker_main.h"

static int run_cases(worker *w) {
  unsigned seed = (unsigned)strtoul(w->argv[0], NULL, 10);
  int first = atoi(w->argv[1]), count = atoi(w->argv[2]);
  const char *base = w->argv[3];
  int draw = w->argc > 4 ? atoi(w->argv[4]) : TF_DRAW_ANY;
  int provided = 0, rank = w->rank, world = w->world;
  MPI_Query_thread(&provided);
  if (draw < 0 || draw >= TF_NDRAWS || world != TF_WORLD || provided < MPI_THREAD_MULTIPLE) {
    printf("FAIL draw %d (0 to %d), world %d (want %d), thread level %d\n", draw,
           TF_NDRAWS - 1, world, TF_WORLD, provided);
    return 1;
  }
  for (int k = first; k < first + count; k++) {
    tf_case c;
    tf_case_make(seed, TF_MPI, k, (tf_draw)draw, base, &c);
    /* Read at mpg_ctx_create; the last case's context is gone. */
    tf_case_env(&c);
    if (rank == 0) mkdir(c.dir, 0700);
    MPI_Barrier(MPI_COMM_WORLD);
    mpg_init_opts o = MPG_INIT_OPTS_INIT; /* the case's timeout, not worker_main's */
    o.backend.name = MPG_BACKEND_MPI;
    o.rank = rank;
    o.world_size = world;
    tf_outcome res;
    tf_rank_run(&c, &o, &res);
    for (char *p = res.message; *p; p++)
      if (*p == '\n') *p = ' ';
    printf("TF case %d rank %d %d %d %d %d %d %s|%s\n", k, rank, (int)res.status, res.step,
           res.slot, res.injected, res.requested, res.what, res.message);
    MPI_Barrier(MPI_COMM_WORLD);
  }
  return 0;
}

static const worker_case cases[] = {
    {NULL, "SEED FIRST COUNT BASE [DRAW]", 4, 5, run_cases, WK_MPI | WK_OWN_LINES},
};
WORKER_MAIN(cases)
