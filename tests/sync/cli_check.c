/* Runs of the meshpg program as rows of a table (cli_check.h). */
#include "cli_check.h"

#include <string.h>
#include <unistd.h>

void cli_rows(const cli_row *rows, int n, cli_runner runner, int fatal) {
  for (const cli_row *r = rows; r < rows + n; r++) {
    int rc = (runner ? runner : cli)(r->args);
    if (fatal) cr_assert_eq(rc, r->code, "meshpg %s exited %d, expected %d:\n%s", r->args, rc,
                            r->code, out);
    else cr_expect_eq(rc, r->code, "meshpg %s exited %d, expected %d:\n%s", r->args, rc,
                      r->code, out);
    for (int k = 0; k < CLI_WANTS && r->want[k]; k++) {
      if (fatal) cr_assert(strstr(out, r->want[k]), "meshpg %s: no \"%s\" in:\n%s", r->args,
                           r->want[k], out);
      else cr_expect(strstr(out, r->want[k]), "meshpg %s: no \"%s\" in:\n%s", r->args,
                     r->want[k], out);
    }
  }
}

void out_holds(const char *const *texts) {
  for (; *texts; texts++) cr_assert(strstr(out, *texts), "no \"%s\" in:\n%s", *texts, out);
}

void temp_file(char *path, const char *text) {
  int fd = mkstemp(path);
  cr_assert_geq(fd, 0, "mkstemp %s", path);
  FILE *f = fdopen(fd, "w");
  cr_assert_not_null(f);
  fputs(text, f);
  cr_assert_eq(fclose(f), 0, "%s", path);
}
