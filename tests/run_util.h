/* Helpers of the Criterion suites that run real programs: a command
 * line with its output captured, and `meshpg ARGS` from the source root. */
#ifndef MPG_TESTS_RUN_UTIL_H
#define MPG_TESTS_RUN_UTIL_H

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>

/* The output of the last run(). */
static char out[1 << 20];

static inline double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The program path meson put in environment variable `var`. */
static inline const char *env_program(const char *var) {
  const char *w = getenv(var);
  cr_assert_not_null(w, "%s is not set (run through meson test)", var);
  return w;
}

/* Run a shell command line with stderr joined; return its exit code and
 * keep the output in `out`. */
static inline int run(const char *cmd, double *seconds) {
  char full[4096 + 16]; /* cmd buffers are 4096 */
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

/* Run `meshpg ARGS` (MESHPG_CLI) from the source root (the parent of
 * MESHPG_TEST_DATA); the output is in `out`.  Returns the exit code. */
static inline int cli(const char *args) {
  char cmd[4096];
  snprintf(cmd, sizeof cmd, "cd '%s/..' && '%s' %s",
           env_program("MESHPG_TEST_DATA"), env_program("MESHPG_CLI"), args);
  return run(cmd, NULL);
}

#endif
