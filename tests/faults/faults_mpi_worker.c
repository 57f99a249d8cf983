/* One MPI process of the fault tests, started by mpirun from test_faults.c.
 * The rank and world size come from the Open MPI environment.
 *
 *   faults_mpi_worker SCENARIO [VARIANT]   stop | kill | no_ctx | desync | abort
 *                                          (see fault_scenarios.h)
 *
 * Prints one line per rank:
 *   RESULT <scenario> rank R victim V stage S status NAME secs T valid G
 *   sync_destroy NAME ctx_destroy NAME msg: TEXT
 * and exits 0 (the test judges the lines; worker_main.h).  The timeout is
 * 1 s. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fault_scenarios.h"
#include "../support/worker_main.h"

static int run_scenario(worker *w) {
  fault_cfg c = {F_COUNT, w->argc > 1 ? atoi(w->argv[1]) : 0, 0, 1.0, 1};
  for (int k = 0; k < F_COUNT; k++)
    if (strcmp(w->mode, fault_names[k]) == 0) c.kind = (fault_kind)k;
  if (c.kind == F_COUNT || w->world < 2) {
    printf("FAIL %s: unknown scenario or fewer than 2 ranks\n", w->mode);
    return 1;
  }
  c.world = w->world;
  int rank = w->rank;
  int own_mpi = c.kind == F_NO_CTX && rank == fault_victim(&c);
  if (own_mpi) {
    /* In MPI, but never in meshpg. */
    int provided;
    MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
  }
  mpg_init_opts opts = MPG_INIT_OPTS_INIT;
  opts.backend.name = MPG_BACKEND_MPI;
  fault_res *res = malloc(sizeof *res);
  if (!res) return 1;
  fault_rank(&opts, &c, rank, res);
  for (char *p = res->msg; *p; p++)
    if (*p == '\n') *p = ' ';
  printf("RESULT %s rank %d victim %d stage %s status %s secs %.3f valid %d "
         "sync_destroy %s ctx_destroy %s msg: %s\n",
         w->mode, rank, res->victim, res->stage, mpg_status_name(res->status), res->secs,
         res->valid, mpg_status_name(res->sync_destroy), mpg_status_name(res->ctx_destroy),
         res->msg);
  free(res);
  if (own_mpi) MPI_Finalize();
  return 0;
}

static const worker_case cases[] = {
    {NULL, "stop|kill|no_ctx|desync|abort [VARIANT]", 1, 2, run_scenario, WK_OWN_LINES},
};
WORKER_MAIN(cases)
