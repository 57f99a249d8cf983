/* Helpers of the Criterion suites that run real programs
 * (tests/support/run_util.c): a command line with its output captured,
 * and `meshpg ARGS` from the source root. */
#ifndef MPG_TESTS_RUN_UTIL_H
#define MPG_TESTS_RUN_UTIL_H

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>

#include "clock.h"

/* The output of the last run(). */
extern char out[1 << 20];

/* The program path meson put in environment variable `var`. */
const char *env_program(const char *var);

/* Run a shell command line with stderr joined; return its exit code and
 * keep the output in `out` (*seconds: its wall time, when not NULL). */
int run(const char *cmd, double *seconds);

/* Assert that the output of the last run() holds `text` / does not. */
void out_has(const char *text);
void out_lacks(const char *text);

/* Run `meshpg ARGS` (MESHPG_CLI) from the source root (the parent of
 * MESHPG_TEST_DATA); the output is in `out`.  Returns the exit code. */
int cli(const char *args);

#endif
