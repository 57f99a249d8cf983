/* One MPI process of the issue-order tests, started by mpirun (-np 4) from
 * test_order.c: `order_mpi_worker MODE` runs one case of order_cases.h on
 * the MPI backend with MESHPG_CHECK_ORDER=1.  Prints "OK MODE rank R" when
 * this rank saw the expected outcome, "FAIL MODE rank R: ..." otherwise;
 * exit code 0 / 1 (worker_main.h). */
#include <stdlib.h>

#include "order_cases.h"
#include "worker_main.h"

static int run_case(worker *w) {
  setenv("MESHPG_CHECK_ORDER", "1", 1);
  char msg[2048];
  mpg_status st = oc_run(&w->opts, w->mode, msg, sizeof msg);
  if (st) fail("%s: %s", mpg_status_name(st), msg);
  return 0;
}

static const worker_case cases[] = {
    {NULL, "agree | swap | extra | sync | sync_extra", 1, 1, run_case, 0},
};
WORKER_MAIN(cases)
