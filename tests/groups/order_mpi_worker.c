/* One MPI process of the issue-order tests, started by mpirun (-np 4) from
 * test_order.c: `order_mpi_worker MODE` runs one case of order_cases.h on
 * the MPI backend with MESHPG_CHECK_ORDER=1.  Prints "OK MODE rank R" when
 * this rank saw the expected outcome, "FAIL MODE rank R: ..." otherwise;
 * exit code 0 / 1. */
#include <stdio.h>
#include <stdlib.h>

#include "order_cases.h"

int main(int argc, char **argv) {
  if (argc != 2) {
    printf("usage: order_mpi_worker agree | swap | extra | sync | sync_extra\n");
    return 2;
  }
  setvbuf(stdout, NULL, _IOLBF, 0);
  setenv("MESHPG_CHECK_ORDER", "1", 1);
  mpg_init_opts opts = MPG_INIT_OPTS_INIT;
  opts.backend.name = MPG_BACKEND_MPI;
  opts.backend.timeout_s = 60;
  mpg_launch env = MPG_LAUNCH_INIT;
  if (mpg_launch_from_env(&env) != MPG_OK) {
    printf("FAIL %s rank ?: no MPI launch environment: %s\n", argv[1], mpg_last_error());
    return 1;
  }
  opts.rank = env.rank;
  char msg[2048];
  mpg_status st = oc_run(&opts, argv[1], msg, sizeof msg);
  if (st)
    printf("FAIL %s rank %d: %s: %s\n", argv[1], env.rank, mpg_status_name(st), msg);
  else
    printf("OK %s rank %d\n", argv[1], env.rank);
  fflush(stdout);
  return st ? 1 : 0;
}
