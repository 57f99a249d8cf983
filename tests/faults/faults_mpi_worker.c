/* One MPI process of the fault tests, started by mpirun from test_faults.c.
 * The rank and world size come from the Open MPI environment.
 *
 *   faults_mpi_worker SCENARIO [VARIANT]   stop | kill | no_ctx | desync | abort
 *                                          (see fault_scenarios.h)
 *
 * Prints one line per rank:
 *   RESULT <scenario> rank R victim V stage S status NAME secs T valid G
 *   sync_destroy NAME ctx_destroy NAME msg: TEXT
 * and exits 0 (the test judges the lines).  The timeout is 1 s. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fault_scenarios.h"

int main(int argc, char **argv) {
  if (argc < 2) {
    printf("usage: faults_mpi_worker stop|kill|no_ctx|desync|abort [variant]\n");
    return 2;
  }
  fault_cfg c = {F_COUNT, argc > 2 ? atoi(argv[2]) : 0, 0, 1.0, 1};
  for (int k = 0; k < F_COUNT; k++)
    if (strcmp(argv[1], fault_names[k]) == 0) c.kind = (fault_kind)k;
  mpg_launch env = MPG_LAUNCH_INIT;
  if (c.kind == F_COUNT || mpg_launch_from_env(&env) != MPG_OK || env.world_size < 2) {
    printf("FAIL %s: unknown scenario or no MPI launch environment\n", argv[1]);
    return 1;
  }
  setvbuf(stdout, NULL, _IOLBF, 0);
  c.world = env.world_size;
  int rank = env.rank;
  int own_mpi = c.kind == F_NO_CTX && rank == fault_victim(&c);
  if (own_mpi) {
    /* In MPI, but never in meshpg. */
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
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
         argv[1], rank, res->victim, res->stage, mpg_status_name(res->status), res->secs,
         res->valid, mpg_status_name(res->sync_destroy), mpg_status_name(res->ctx_destroy),
         res->msg);
  fflush(stdout);
  free(res);
  if (own_mpi) MPI_Finalize();
  return 0;
}
