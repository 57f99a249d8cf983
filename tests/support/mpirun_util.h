/* Helpers of the Criterion suites that start real mpirun jobs
 * (tests/support/mpirun_util.c): the command prefix, a job run and checked
 * in one call, and valgrind in front of every rank.  A worker built on
 * worker_main.h prints "OK <mode> rank R" per rank, and "FAIL ..." lines;
 * mpirun_ok checks both:
 *
 *   mpirun_ok(&(mpirun_job){.np = 4, .worker = env_program("MESHPG_MPI_WORKER"),
 *                           .args = "collectives", .limit_s = 280});
 */
#ifndef MPG_TESTS_MPIRUN_UTIL_H
#define MPG_TESTS_MPIRUN_UTIL_H

#include "run_util.h"

/* Shared-memory transports only, no binding: the tests run on small,
 * shared machines without a network. */
#define MPIRUN "mpirun --oversubscribe --bind-to none --mca btl self,vader " \
               "--mca btl_vader_single_copy_mechanism none "

/* One job: `ENV timeout -k 5 LIMIT_S mpirun OPTS -np NP PREFIX 'WORKER'
 * ARGS` (NULL for an empty part). */
typedef struct mpirun_job {
  int np;
  const char *worker; /* the program's path */
  const char *args;   /* its arguments; the first word is the mode */
  int limit_s;        /* the whole job's time limit (timeout -k 5) */
  const char *env;    /* "NAME=VALUE ..." for mpirun itself */
  const char *opts;   /* mpirun options, e.g. "-x MESHPG_SHM=0" */
  const char *prefix; /* what runs each rank, e.g. valgrind_prefix() */
} mpirun_job;

/* The command line of the last job. */
extern char mpirun_cmd[4096];

/* Run the job (output in `out`, *secs its wall time when not NULL);
 * returns its exit code.  Asserts only that it ran. */
int mpirun_run(const mpirun_job *j, double *secs);

/* Run the job and assert: exit code 0, an "OK <mode> rank R" line for
 * every rank (mode: the first word of args), no "FAIL " line.  Returns
 * the job's wall seconds. */
double mpirun_ok(const mpirun_job *j);

/* valgrind in front of every rank: definite leaks and memory errors fail
 * the rank with exit code 3.  Open MPI's own suppressions where Debian
 * installs them, then ours (tests/groups/openmpi.supp, Open MPI internals
 * only); deep stacks, so that the Open MPI frame every suppression keys
 * on is recorded.  Skips the test in a sanitizer build or without
 * valgrind. */
const char *valgrind_prefix(void);

#endif
