/* What `meshpg trace`'s analysis costs (issue 46, items 6 and 7), on the
 * synthetic dumps of bench/trace_gen.h (the dumps bench_trace_analyze
 * measures), parsed with tr_parse and analyzed with ta_analyze:
 *  - item 6: 1,024 ranks of one dp group with rings of 512 ops, one rank
 *    hung computing and every other one blocked in the all-reduce it never
 *    issued.  The wait-for graph once walked every member for every
 *    waiter, and each member's own waits for each (0a19c36: minutes); now
 *    about 0.1 s of CPU;
 *  - item 7: a 2-rank pipeline after 640,000 send/receive pairs with rings
 *    of 2,048: the matching once walked every pair number from 1 (91403d6:
 *    21 s); now it costs what the rings hold.
 * The bounds are on the analysis' CPU time (the test machine is shared),
 * times the sanitizer's slowdown (tests/support/time_bound.h), and the
 * verdicts must be the hang's culprit. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../../../bench/trace_gen.h"
#include "../../../tools/trace_analyze.h"
#include "time_bound.h"

static double cpu_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Parse n dumps (gen(r) writes rank r's), analyze them into *rep; returns
 * the analysis' CPU seconds. */
static double analyze(int n, int (*gen)(int r, tg_buf *b, void *arg), void *arg,
                      tr_rank **rs, ta_report *rep) {
  char err[512];
  tg_buf b = {0};
  *rs = calloc((size_t)n, sizeof(tr_rank));
  cr_assert_not_null(*rs);
  for (int r = 0; r < n; r++) {
    cr_assert_eq(gen(r, &b, arg), 0, "generating rank %d", r);
    cr_assert_eq(tr_parse(b.s, b.n, &(*rs)[r], err, sizeof err), 0, "rank %d: %s", r, err);
  }
  free(b.s);
  double t0 = cpu_now();
  cr_assert_eq(ta_analyze(*rs, n, 0, rep, err, sizeof err), 0, "%s", err);
  return cpu_now() - t0;
}

static int hang_gen(int r, tg_buf *b, void *arg) { return tg_hang_dump(arg, r, b); }

Test(trace_scale, wait_for_graph_is_linear_in_ranks, .timeout = 300) {
  enum { N = 1024, CULPRIT = 1000 };
  tg_hang h;
  cr_assert_eq(tg_hang_plan(&h, 1, N, 1, 512, CULPRIT), 0);
  tr_rank *rs;
  ta_report rep;
  double t = analyze(N, hang_gen, &h, &rs, &rep);
  double bound = 1.5 * tb_sanitizer_factor();
  fprintf(stderr, "wait_for_graph_is_linear_in_ranks: %d ranks x 512 ops analyzed in %.3f s "
          "of CPU (bound %.1f s)\n", N, t, bound);
  cr_assert_eq(rep.nculprits, 1, "culprits: %d (%s)", rep.nculprits,
               rep.nculprits ? rep.culprits[0].text : "-");
  cr_expect_eq(rep.culprits[0].rank, CULPRIT, "%s", rep.culprits[0].text);
  cr_expect(strstr(rep.culprits[0].text, "never issued all_reduce #"), "%s",
            rep.culprits[0].text);
  cr_expect_eq(rep.nvictims, N - 1);
  cr_expect_lt(t, bound, "the analysis took %.2f s of CPU (bound %.1f s)", t, bound);
  ta_report_free(&rep);
  tr_ranks_free(rs, N);
  tg_hang_free(&h);
}

static int pipe_gen(int r, tg_buf *b, void *arg) {
  return tg_pipe_dump(*(const long *)arg, 2048, r, b);
}

Test(trace_scale, pipeline_lifetime_does_not_matter, .timeout = 120) {
  long pairs = 640000;
  tr_rank *rs;
  ta_report rep;
  double t = analyze(2, pipe_gen, &pairs, &rs, &rep);
  double bound = 1.0 * tb_sanitizer_factor();
  fprintf(stderr, "pipeline_lifetime_does_not_matter: %ld pairs, rings of 2048, analyzed in "
          "%.3f s of CPU (bound %.1f s)\n", pairs, t, bound);
  cr_assert_eq(rep.nculprits, 1);
  cr_expect_eq(rep.culprits[0].rank, 0, "%s", rep.culprits[0].text);
  cr_expect(strstr(rep.culprits[0].text, "never issued send #640001 to rank 1 on pp[0]"), "%s",
            rep.culprits[0].text);
  cr_expect_lt(t, bound, "the analysis took %.2f s of CPU (bound %.1f s)", t, bound);
  ta_report_free(&rep);
  tr_ranks_free(rs, 2);
}
