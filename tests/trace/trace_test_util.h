/* Helpers of the trace tests (tests/trace/): a fresh scratch directory per
 * test and `meshpg trace` run as a program (MESHPG_CLI, set by
 * tests/meson.build). */
#ifndef MESHPG_TESTS_TRACE_TEST_UTIL_H
#define MESHPG_TESTS_TRACE_TEST_UTIL_H

#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* dir = /tmp/mpg-test-<tag>-<pid>-<name>, emptied and made (asserts). */
static inline void tt_fresh_dir(char *dir, size_t cap, const char *tag, const char *name) {
  snprintf(dir, cap, "/tmp/mpg-test-%s-%ld-%s", tag, (long)getpid(), name);
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  cr_assert_eq(system(cmd), 0);
  cr_assert_eq(mkdir(dir, 0777), 0, "%s: %s", dir, strerror(errno));
}

/* Removes every directory tt_fresh_dir made with `tag` in this process. */
static inline void tt_cleanup(const char *tag) {
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf /tmp/mpg-test-%s-%ld-*", tag, (long)getpid());
  (void)system(cmd);
}

/* `meshpg trace ARGS` (stdout and stderr into out[0..cap)): its exit
 * status, -1 when it did not exit; the wall time in *secs when not NULL. */
static inline int tt_run_cli(const char *args, char *out, size_t cap, double *secs) {
  const char *cli = getenv("MESHPG_CLI");
  cr_assert_not_null(cli, "MESHPG_CLI is not set");
  char cmd[8192];
  snprintf(cmd, sizeof cmd, "'%s' trace %s 2>&1", cli, args);
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  FILE *p = popen(cmd, "r");
  cr_assert_not_null(p);
  size_t n = fread(out, 1, cap - 1, p);
  out[n] = '\0';
  int st = pclose(p);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  if (secs) *secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

#endif
