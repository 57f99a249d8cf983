/* Running and checking mpirun jobs: see mpirun_util.h. */
#include "mpirun_util.h"

#include <string.h>

char mpirun_cmd[4096];

static const char *part(const char *s) { return s && s[0] ? s : ""; }
static const char *gap(const char *s) { return s && s[0] ? " " : ""; }

int mpirun_run(const mpirun_job *j, double *secs) {
  snprintf(mpirun_cmd, sizeof mpirun_cmd,
           "%.1000s%stimeout -k 5 %d " MPIRUN "%.1000s%s-np %d %.1000s%s'%.500s' %.1000s",
           part(j->env), gap(j->env), j->limit_s, part(j->opts), gap(j->opts), j->np,
           part(j->prefix), gap(j->prefix), j->worker, part(j->args));
  return run(mpirun_cmd, secs);
}

double mpirun_ok(const mpirun_job *j) {
  double secs = 0;
  int rc = mpirun_run(j, &secs);
  const char *cmd = mpirun_cmd;
  cr_log_info("%s: exit %d after %.2f s", cmd, rc, secs);
  cr_assert_eq(rc, 0, "%s\nexit code %d after %.2f s; output:\n%s", cmd, rc, secs, out);
  char mode[64] = "";
  sscanf(part(j->args), "%63s", mode);
  for (int r = 0; r < j->np; r++) {
    char ok[96];
    snprintf(ok, sizeof ok, "OK %s rank %d", mode, r);
    cr_assert(strstr(out, ok), "%s\nno \"%s\" line; output:\n%s", cmd, ok, out);
  }
  cr_assert_null(strstr(out, "FAIL "), "%s\noutput:\n%s", cmd, out);
  return secs;
}

const char *valgrind_prefix(void) {
  static char prefix[2048];
  if (getenv("MESHPG_SANITIZER"))
    cr_skip_test("a sanitizer build (-Db_sanitize=%s): valgrind cannot run it",
                 getenv("MESHPG_SANITIZER"));
  if (system("command -v valgrind >/dev/null 2>&1") != 0)
    cr_skip_test("valgrind is not installed");
  const char *data = env_program("MESHPG_TEST_DATA");
  const char *ompi_supp = "/usr/share/openmpi/openmpi-valgrind.supp";
  FILE *f = fopen(ompi_supp, "r");
  if (f) fclose(f);
  snprintf(prefix, sizeof prefix,
           "valgrind -q --error-exitcode=3 --leak-check=full "
           "--errors-for-leak-kinds=definite --show-leak-kinds=definite "
           "--num-callers=50 %s%s%s--suppressions='%s/groups/openmpi.supp'",
           f ? "--suppressions='" : "", f ? ompi_supp : "", f ? "' " : "", data);
  return prefix;
}
