/* What the flight recorder's drawing tests share (test_trace_draw.c and
 * tests/examples/test_gpt_trace.c): a fresh temporary directory per test
 * (Criterion .init / .fini) and the parse of an SVG or a Chrome trace by
 * check_draw.py (MESHPG_CHECK_DRAW, run by MESHPG_PYTHON), whose summary
 * lands in run_util's `out`.  Each includer defines `dir` (char[256]) and
 * DRAW_TMP_NAME, and includes run_util.h first. */
#ifndef MPG_TESTS_DRAW_CHECK_H
#define MPG_TESTS_DRAW_CHECK_H

#include <criterion/criterion.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

static void setup(void) {
  const char *tmp = getenv("TMPDIR");
  snprintf(dir, sizeof dir, "%s/" DRAW_TMP_NAME ".XXXXXX", tmp && *tmp ? tmp : "/tmp");
  cr_assert_not_null(mkdtemp(dir));
}

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *f) {
  (void)sb, (void)flag, (void)f;
  return remove(p);
}

static void teardown(void) { nftw(dir, rm_one, 8, FTW_DEPTH | FTW_PHYS); }

/* check_draw.py MODE FILE must pass; its summary is in out. */
static void check(const char *mode, const char *path) {
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "'%s' '%s' %s '%s'", env_program("MESHPG_PYTHON"),
           env_program("MESHPG_CHECK_DRAW"), mode, path);
  cr_assert_eq(run(cmd, NULL), 0, "check_draw.py %s %s failed:\n%s", mode, path, out);
}

#endif
