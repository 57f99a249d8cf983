/* Helpers of the Criterion suites that start real mpirun jobs
 * (tests/groups/test_mpi.c, tests/sync/test_sync_mpi.c). */
#ifndef MPG_TESTS_MPIRUN_UTIL_H
#define MPG_TESTS_MPIRUN_UTIL_H

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>

/* Shared-memory transports only, no binding: the tests run on small,
 * shared machines without a network. */
#define MPIRUN "mpirun --oversubscribe --bind-to none --mca btl self,vader " \
               "--mca btl_vader_single_copy_mechanism none "

/* The output of the last run(). */
static char out[1 << 20];

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The program path meson put in environment variable `var`. */
static const char *env_program(const char *var) {
  const char *w = getenv(var);
  cr_assert_not_null(w, "%s is not set (run through meson test)", var);
  return w;
}

/* Run a shell command line with stderr joined; return its exit code and
 * keep the output in `out`. */
static int run(const char *cmd, double *seconds) {
  char full[4096];
  snprintf(full, sizeof full, "%s 2>&1", cmd);
  double t0 = now();
  FILE *p = popen(full, "r");
  cr_assert_not_null(p, "popen(%s) failed", cmd);
  size_t n = 0, k;
  while ((k = fread(out + n, 1, sizeof out - 1 - n, p)) > 0) n += k;
  out[n] = '\0';
  int st = pclose(p);
  if (seconds) *seconds = now() - t0;
  cr_assert(WIFEXITED(st), "%s: did not exit normally\n%s", cmd, out);
  return WEXITSTATUS(st);
}

#endif
