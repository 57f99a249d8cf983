/* The flight recorder on real MPI processes (issue 46, item 3): a
 * collective of a different size.  Under Open MPI a tp all-reduce whose
 * members give different counts fails with MPI_ERR_TRUNCATE, which Open
 * MPI's nonblocking collectives report on MPI_COMM_WORLD: under its
 * default MPI_ERRORS_ARE_FATAL the whole job died and no rank dumped.  Now
 * the rank that meets the error gets MPG_ERR_BACKEND naming MPI's error,
 * its context aborts, every other rank fails within the timeout, every
 * rank leaves a dump, and the analyzer names world rank 1, the one that
 * gave twice the count.  Run twice: MPI initialised by the program (its
 * MPI_COMM_WORLD handler is the application's) and by meshpg.  Skips when
 * built without MPI. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../../tools/trace_analyze.h"
#include "../../support/mpirun_util.h"
#include "../../support/time_bound.h"
#include "../trace_test_util.h"

#define TM_WORLD 4

static void cleanup(void) { tt_cleanup("trace-mpi"); }

/* The report's lines, for a failure's message. */
static void report_text(const ta_report *r, char *buf, size_t cap) {
  size_t k = 0;
  buf[0] = '\0';
  for (int i = 0; i < r->nculprits && k < cap; i++)
    k += (size_t)snprintf(buf + k, cap - k, "\n  %s", r->culprits[i].text);
  for (int i = 0; i < r->nmismatches && k < cap; i++)
    k += (size_t)snprintf(buf + k, cap - k, "\n  %s", r->mismatches[i].text);
}

/* One job: MPI initialised by the program (own 1) or by meshpg (own 0). */
static void count_mismatch_job(int own) {
  const char *w = getenv("MESHPG_TM_MPI_WORKER");
  char dir[256];
  tt_fresh_dir(dir, sizeof dir, "trace-mpi", own ? "own" : "meshpg");
  double timeout = 1.0 * tb_sanitizer_factor();
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "timeout -k 5 %d " MPIRUN "-np %d '%s' '%s' %d %g",
           (int)(60 * tb_sanitizer_factor()), TM_WORLD, w, dir, own, timeout);
  double secs = 0;
  int rc = run(cmd, &secs);
  fprintf(stderr, "count mismatch (MPI initialised by %s): exit %d after %.2f s\n",
          own ? "the program" : "meshpg", rc, secs);
  /* No MPI abort: the job ends normally. */
  cr_assert_eq(rc, 0, "mpirun exited %d (an MPI abort kills the job):\n%.6000s", rc, out);
  cr_assert_null(strstr(out, "MPI_ERRORS_ARE_FATAL"), "an MPI error handler ended it:\n%.6000s",
                 out);
  cr_assert_null(strstr(out, "FAIL"), "%.6000s", out);
  /* Every rank got an error from meshpg; the one that met MPI's error has
   * it as MPG_ERR_BACKEND, naming its group and MPI's error string. */
  int seen[TM_WORLD] = {0}, backend = 0;
  for (char *line = strstr(out, "TM rank "); line; line = strstr(line + 1, "TM rank ")) {
    int r = -1;
    char status[64] = "";
    if (sscanf(line, "TM rank %d %63[^|]", &r, status) != 2 || r < 0 || r >= TM_WORLD) continue;
    seen[r]++;
    char *eol = strchr(line, '\n');
    int len = eol ? (int)(eol - line) : (int)strlen(line);
    cr_expect_str_neq(status, "OK", "world rank %d got no error: %.*s", r, len, line);
    if (!strcmp(status, "ERR_BACKEND")) {
      backend++;
      char *m = strstr(line, "MPI_ERR_"), *g = strstr(line, "all_reduce #3 on tp[0]");
      cr_expect(m && m - line < len && g && g - line < len,
                "the MPI error is not named with its operation and group: %.*s", len, line);
    } else {
      cr_expect(!strcmp(status, "ERR_TIMEOUT") || !strcmp(status, "ERR_ABORTED"),
                "world rank %d: %.*s", r, len, line);
    }
  }
  for (int r = 0; r < TM_WORLD; r++)
    cr_assert_eq(seen[r], 1, "world rank %d reported %d times:\n%.6000s", r, seen[r], out);
  cr_expect_geq(backend, 1, "no rank got MPI's error as MPG_ERR_BACKEND:\n%.6000s", out);
  /* Every rank dumped, and the analyzer names world rank 1 alone. */
  tr_rank *ranks = NULL;
  int n = 0;
  char err[1024];
  cr_assert_eq(tr_read_dir(dir, &ranks, &n, err, sizeof err), 0, "%s", err);
  cr_assert_eq(n, TM_WORLD, "%d of %d ranks dumped", n, TM_WORLD);
  ta_report rep;
  cr_assert_eq(ta_analyze(ranks, n, TM_WORLD, &rep, err, sizeof err), 0, "%s", err);
  char text[8192];
  report_text(&rep, text, sizeof text);
  cr_expect(rep.nculprits == 1 && rep.culprits[0].rank == 1,
            "%d culprits, the first world rank %d; want world rank 1 alone:%s", rep.nculprits,
            rep.nculprits ? rep.culprits[0].rank : -1, text);
  fprintf(stderr, "  the report:%s\n", text);
  ta_report_free(&rep);
  tr_ranks_free(ranks, n);
}

Test(trace_mpi, count_mismatch_returns_errors_and_names_the_rank, .fini = cleanup,
     .timeout = 300) {
  if (!getenv("MESHPG_TM_MPI_WORKER")) cr_skip_test("built without MPI");
  count_mismatch_job(1);
  count_mismatch_job(0);
}
