/* Runs of the meshpg program as rows of a table (tests/sync/cli_check.c),
 * for the suites that check its exit codes and output: test_sim and
 * test_ckpt_export.  A row is a command line, the exit code it must give
 * and texts its output must hold. */
#ifndef MPG_TESTS_SYNC_CLI_CHECK_H
#define MPG_TESTS_SYNC_CLI_CHECK_H

#include "../support/run_util.h"

#define CLI_WANTS 6

typedef struct cli_row {
  const char *args;            /* the program's arguments */
  int code;                    /* the exit code it must give */
  const char *want[CLI_WANTS]; /* texts the output must hold, up to the first NULL */
} cli_row;

/* How a row runs: `meshpg ARGS` (cli, from the source root) or a suite's
 * own runner; the output is left in `out`. */
typedef int (*cli_runner)(const char *args);

/* Runs every row with runner (NULL: cli) and checks its exit code and
 * texts: with fatal, Criterion asserts (the test stops at the first
 * miss), else expects (every row runs). */
void cli_rows(const cli_row *rows, int n, cli_runner runner, int fatal);
#define CLI_ROWS(rows, runner, fatal) \
  cli_rows(rows, (int)(sizeof(rows) / sizeof(rows)[0]), runner, fatal)

/* Asserts that `out` holds each of the NULL-ended texts. */
void out_holds(const char *const *texts);
#define OUT_HOLDS(...) out_holds((const char *const[]){__VA_ARGS__, NULL})

/* Makes a file from mkstemp(path) (path: a template ending in XXXXXX,
 * rewritten) holding text; asserted. */
void temp_file(char *path, const char *text);

#endif
