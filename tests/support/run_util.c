/* Running real programs from the suites: see run_util.h. */
#include "run_util.h"

#include <string.h>
#include <sys/wait.h>

char out[1 << 20];

const char *env_program(const char *var) {
  const char *w = getenv(var);
  cr_assert_not_null(w, "%s is not set (run through meson test)", var);
  return w;
}

int run(const char *cmd, double *seconds) {
  char full[4096 + 16]; /* cmd buffers are 4096 */
  snprintf(full, sizeof full, "%s 2>&1", cmd);
  double t0 = now_s();
  FILE *p = popen(full, "r");
  cr_assert_not_null(p, "popen(%s) failed", cmd);
  size_t n = 0, k;
  while ((k = fread(out + n, 1, sizeof out - 1 - n, p)) > 0) n += k;
  out[n] = '\0';
  int st = pclose(p);
  if (seconds) *seconds = now_s() - t0;
  cr_assert(WIFEXITED(st), "%s: did not exit normally\n%s", cmd, out);
  return WEXITSTATUS(st);
}

int cli(const char *args) {
  char cmd[4096];
  snprintf(cmd, sizeof cmd, "cd '%s/..' && '%s' %s",
           env_program("MESHPG_TEST_DATA"), env_program("MESHPG_CLI"), args);
  return run(cmd, NULL);
}

void out_has(const char *text) { cr_assert(strstr(out, text), "no \"%s\" in:\n%s", text, out); }

void out_lacks(const char *text) {
  cr_assert_null(strstr(out, text), "\"%s\" in:\n%s", text, out);
}
