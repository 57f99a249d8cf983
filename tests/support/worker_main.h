/* The one `main` of the MPI workers (tests/support/worker_main.c; built
 * only with MPI).  A worker is a table of modes and one line:
 *
 *   static int run_values(worker *w) { ... fail("..."); ... return 0; }
 *   static const worker_case cases[] = {
 *       {"values", "", 0, 0, run_values, WK_MPI},
 *       {"killed", "KILL|TERM", 1, 1, run_killed, WK_MPI},
 *   };
 *   WORKER_MAIN(cases)
 *
 * `worker MODE ARGS...` runs the case named MODE (a case whose mode is NULL
 * takes any MODE, the first of its arguments) with line-buffered stdout:
 * rank and world come from MPI_COMM_WORLD when the case initialises MPI
 * (WK_MPI, WK_MPI_SERIALIZED: MPI_Init_thread before, MPI_Finalize after),
 * else from the launcher's environment (mpg_launch_from_env; meshpg
 * initialises MPI in mpg_ctx_create).  w->opts is ready for
 * mpg_ctx_create: the MPI backend, this rank and world, a 60 s timeout.
 * The case reports failures with fail() of worker_report.h ("FAIL <mode>
 * rank R: ...") and returns how many more it counted itself; the worker
 * then prints "OK <mode> rank R" when there were none, and exits 0, or 1
 * after a failure.  A WK_OWN_LINES case prints its own result lines and
 * its return value is the exit code.  Bad usage: a usage line, exit 2; no
 * launch environment: "FAIL <mode> rank ?: ...", exit 1. */
#ifndef MPG_TESTS_SUPPORT_WORKER_MAIN_H
#define MPG_TESTS_SUPPORT_WORKER_MAIN_H

#include "meshpg.h"
#include "worker_report.h"

enum {
  WK_MPI = 1,            /* MPI_Init_thread(MPI_THREAD_MULTIPLE) here */
  WK_MPI_SERIALIZED = 2, /* MPI_Init_thread(MPI_THREAD_SERIALIZED) here */
  WK_OWN_LINES = 4,      /* no OK line; the case's return is the exit code */
};

typedef struct worker {
  const char *mode; /* argv[1] */
  int argc;         /* the mode's arguments: argv[0 .. argc - 1] */
  char **argv;
  int rank, world;
  mpg_init_opts opts; /* MPI backend, rank, world_size, timeout_s 60 */
} worker;

typedef struct worker_case {
  const char *mode;          /* NULL: any mode (it is then argv[0]) */
  const char *usage;         /* the arguments, for the usage line */
  int min_args, max_args;    /* after the mode; max -1: any number */
  int (*run)(worker *w);     /* failures not reported through fail() */
  unsigned flags;            /* WK_... */
} worker_case;

/* Run the case argv[1] names; returns the exit code (see above).  begin
 * (NULL for none) runs first, once rank and world are known, for what
 * every mode of the worker prints or checks; when it returns non-zero
 * (failures it did not report through fail()) or reports a failure, the
 * case does not run. */
int worker_main(int argc, char **argv, const worker_case *cases, int ncases,
                int (*begin)(worker *w));

/* main() for a worker whose modes are the array `cases`. */
#define WORKER_MAIN(cases) WORKER_MAIN_WITH(cases, NULL)

/* The same with a begin function. */
#define WORKER_MAIN_WITH(cases, begin)                                                    \
  int main(int argc, char **argv) {                                                       \
    return worker_main(argc, argv, cases, (int)(sizeof cases / sizeof *cases), begin);     \
  }

#endif
