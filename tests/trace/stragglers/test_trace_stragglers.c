/* The straggler report (tools/trace_stragglers.c; docs/trace.md,
 * "Stragglers"; issue 46, "Beyond torch: who slows a healthy job"): a job
 * of 4 thread ranks (dp=2,tp=2) runs STEPS steps of a tp all-reduce and a
 * dp all-reduce, one rank sleeping SLEEP_MS before each tp all-reduce (or
 * none), every rank dumps its ring on request, and the report must name
 * exactly that rank (or nobody).  2 ms against a balanced job's
 * microseconds is a wide margin, and the verdict takes medians over the
 * steps, so a loaded 2-core machine (ranks preempted now and then) or ASan
 * does not change it. */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "meshpg.h"
#include "mesh_util.h"
#include "rank_check.h"
#include "../trace_rank.h"
#include "../trace_test_util.h"
#include "trace_read.h"
#include "trace_stragglers.h"

enum { WORLD = 4, STEPS = 30, SLOW = 3 };
#define SLEEP_MS 2

static mpg_mesh *mesh;
static char dir[256];

typedef struct job {
  int slow; /* the rank that sleeps, -1: none */
} job;

static mpg_status rank_main(const mpg_init_opts *o, void *arg) {
  const job *J = arg;
  mpg_init_opts opts = *o;
  opts.trace_dir = ""; /* no automatic dumps: one on request at the end */
  mpg_ctx *ctx;
  mpg_group *tp, *dp;
  float x[64] = {0};
  mpg_status st = tt_open_ops(&opts, mesh, &ctx, "tp", &tp, 0, x, 64);
  if (st) return st;
  RCALL(mpg_ctx_group(ctx, "dp", &dp));
  for (int s = 0; s < STEPS; s++) {
    if (mpg_ctx_rank(ctx) == J->slow) {
      struct timespec ts = {0, SLEEP_MS * 1000000L};
      nanosleep(&ts, NULL);
    }
    RCALL(mpg_all_reduce(tp, x, x, 64, MPG_F32, MPG_OP_SUM, NULL, NULL));
    RCALL(mpg_all_reduce(dp, x, x, 64, MPG_F32, MPG_OP_SUM, NULL, NULL));
  }
  RCALL(mpg_ctx_trace_dump(ctx, dir));
  return tt_close(ctx);
}

/* The job run into a fresh dir, its dumps analyzed into *rep. */
static void run_job(int slow, const char *name, ts_report *rep) {
  tt_fresh_dir(dir, sizeof dir, "stragglers", name);
  mesh = make_dims_mesh("dp=2,tp=2");
  job J = {slow};
  EXPECT_RUN_OK(mpg_thread_run(WORLD, 30.0, rank_main, &J, NULL));
  mpg_mesh_destroy(mesh);
  mesh = NULL;
  tr_rank *ranks = NULL;
  int n = 0;
  char err[1024];
  cr_assert_eq(tr_read_dir(dir, &ranks, &n, err, sizeof err), 0, "%s", err);
  cr_assert_eq(n, WORLD);
  cr_assert_eq(ts_analyze(ranks, n, rep, err, sizeof err), 0, "%s", err);
  tr_ranks_free(ranks, n);
}

/* The report in short, for the assertions' messages. */
static const char *text_of(const ts_report *rep) {
  static char buf[1 << 16];
  size_t n = 0;
  for (int d = 0; d < rep->ndimsets; d++)
    for (int j = 0; j < rep->dimsets[d].nstats && n < sizeof buf; j++) {
      const ts_stat *S = &rep->dimsets[d].stats[j];
      n += (size_t)snprintf(buf + n, sizeof buf - n,
                            "%s: rank %d: late %.3f ms (p95 %.3f), own %.3f ms, %d collectives%s\n",
                            rep->dimsets[d].name, S->rank, S->late_median / 1e6,
                            S->late_p95 / 1e6, S->own_median / 1e6, S->samples,
                            S->straggler ? " straggler" : "");
    }
  if (n < sizeof buf) snprintf(buf + n, sizeof buf - n, "%s", rep->verdict);
  return buf;
}

static void cleanup(void) { tt_cleanup("stragglers"); }

TestSuite(trace_stragglers, .fini = cleanup, .timeout = 120);

Test(trace_stragglers, sleeping_rank_is_named) {
  ts_report rep;
  run_job(SLOW, "sleeping", &rep);
  const char *txt = text_of(&rep);
  cr_assert_eq(rep.nstragglers, 1, "%s", txt);
  cr_expect_eq(rep.stragglers[0], SLOW, "%s", txt);
  char want[64];
  snprintf(want, sizeof want, "stragglers: world rank %d:", SLOW);
  cr_expect(strstr(rep.verdict, want), "%s", rep.verdict);
  /* Its worst dim set: at least most of the sleep is its own lateness
   * there, and the tp dim set saw it every step. */
  const ts_stat *st;
  const ts_dimset *d = ts_worst(&rep, SLOW, &st);
  cr_assert_not_null(d);
  cr_expect_geq(st->own_median, SLEEP_MS * 1000000 * 3 / 4, "%s", txt);
  cr_expect_geq(st->samples, STEPS - 2, "%s", txt);
  int seen_tp = 0;
  for (int k = 0; k < rep.ndimsets; k++)
    if (!strcmp(rep.dimsets[k].name, "tp")) {
      seen_tp = 1;
      cr_expect_eq(rep.dimsets[k].instances, 2, "%s", txt);
      cr_expect_eq(rep.dimsets[k].collectives, 2 * STEPS, "%s", txt);
      cr_expect_eq(rep.dimsets[k].nstats, WORLD, "%s", txt);
    }
  cr_expect(seen_tp, "%s", txt);
  ts_report_free(&rep);
}

Test(trace_stragglers, balanced_job_names_nobody) {
  ts_report rep;
  run_job(-1, "balanced", &rep);
  const char *txt = text_of(&rep);
  cr_expect_eq(rep.nstragglers, 0, "%s", txt);
  cr_expect(!strncmp(rep.verdict, "no straggler", 12), "%s", rep.verdict);
  ts_report_free(&rep);
}

/* `meshpg trace --stragglers`: the text's verdict, the JSON's list and the
 * exit code 0, the picture's marked row; and a directory without dumps. */
Test(trace_stragglers, cli_names_the_straggler) {
  ts_report rep;
  run_job(SLOW, "cli", &rep);
  int named = rep.nstragglers == 1 && rep.stragglers[0] == SLOW;
  ts_report_free(&rep);
  cr_assert(named, "the analysis did not name rank %d (sleeping_rank_is_named says why)", SLOW);
  static char out[1 << 20];
  char args[800], want[64];
  snprintf(args, sizeof args, "'%s' --stragglers --svg '%s/s.svg'", dir, dir);
  cr_expect_eq(tt_run_cli(args, out, sizeof out, NULL), 0, "%s", out);
  snprintf(want, sizeof want, "\nstragglers: world rank %d:", SLOW);
  cr_expect(strstr(out, want), "%s", out);
  cr_expect(strstr(out, "tp: 2 group instances"), "%s", out);
  snprintf(args, sizeof args, "'%s' --stragglers --json", dir);
  cr_expect_eq(tt_run_cli(args, out, sizeof out, NULL), 0, "%s", out);
  snprintf(want, sizeof want, "\"stragglers\": [%d]", SLOW);
  cr_expect(strstr(out, want), "%s", out);
  cr_expect(strstr(out, "\"floor_ms\": 0.500"), "%s", out);
  char path[300];
  snprintf(path, sizeof path, "%s/s.svg", dir);
  FILE *f = fopen(path, "r");
  cr_assert_not_null(f, "no %s", path);
  size_t m = fread(out, 1, sizeof out - 1, f);
  out[m] = '\0';
  fclose(f);
  snprintf(want, sizeof want, "stragglers: world rank %d", SLOW);
  cr_expect(strstr(out, want) && strstr(out, "class=\"straggler-band\""),
            "the SVG marks no straggler");
  /* No dumps: an error, exit 1. */
  snprintf(args, sizeof args, "'%s/none' --stragglers", dir);
  cr_expect_eq(tt_run_cli(args, out, sizeof out, NULL), 1, "%s", out);
}

/* Synthetic dumps (tools/trace_read.c parses them): 2 ranks of tp=2, rank
 * 1 issuing each all-reduce 3 ms after rank 0 (computing: its previous
 * operation ended long before), at numbers far apart (1..5 and around
 * 10^18: the sort by number cannot count them), one all-reduce that only
 * rank 0's ring holds (rank 1's ring lost it: not counted) and sends (not
 * counted).  Rank 1 is named over 9 collectives. */
static char *synth_dump(int r) {
  static const uint64_t nums[] = {1, 2, 3, 4, 5, 1000000000000000000ull,
                                  1000000000000000001ull, 1000000000000000002ull,
                                  1000000000000000003ull, 1000000000000000004ull};
  size_t cap = 1 << 14, n = 0;
  char *s = malloc(cap);
  cr_assert_not_null(s);
  int64_t t0 = INT64_C(1700000000000000000), ms = 1000000;
  n += (size_t)snprintf(s + n, cap - n,
                        "meshpg-trace 1\nrank %d 2\nprocess h %d\nbackend thread\nmesh tp=2\n"
                        "job 00000000000000aa\nclock %" PRId64 "\nreason request -\n"
                        "ring 2048 40\ngroup 0 tp 0 %d 2 0,1\n",
                        r, 100 + r, t0 + 1000 * ms, r);
  int seq = 0;
  for (int k = 0; k < 10; k++) {
    if (r == 1 && k == 2) continue; /* lost from rank 1's ring */
    int64_t issue = t0 + k * 50 * ms + (r ? 3 * ms : 0), end = t0 + k * 50 * ms + 4 * ms;
    n += (size_t)snprintf(s + n, cap - n,
                          "op %d 0 %" PRIu64 " all_reduce f32 8 -1 -1 -1 %" PRId64 " %" PRId64
                          " %" PRId64 " ok - -\n",
                          seq++, nums[k], issue, issue, end);
    /* a send of rank 1 issued 40 ms late: not a collective */
    n += (size_t)snprintf(s + n, cap - n,
                          "op %d 0 %d %s f32 8 %d -1 -1 %" PRId64 " %" PRId64 " %" PRId64
                          " ok - -\n",
                          seq++, k + 1, r ? "recv" : "send", 1 - r, end + (r ? 40 : 1) * ms,
                          end + 41 * ms, end + 42 * ms);
  }
  n += (size_t)snprintf(s + n, cap - n, "end %d\n", seq);
  return s;
}

Test(trace_stragglers, sparse_numbers_and_lost_operations) {
  tr_rank rs[2];
  char err[512];
  for (int r = 0; r < 2; r++) {
    char *s = synth_dump(r);
    cr_assert_eq(tr_parse(s, strlen(s), &rs[r], err, sizeof err), 0, "%s\n%s", err, s);
    free(s);
  }
  ts_report rep;
  cr_assert_eq(ts_analyze(rs, 2, &rep, err, sizeof err), 0, "%s", err);
  const char *txt = text_of(&rep);
  cr_assert_eq(rep.ndimsets, 1, "%s", txt);
  cr_expect_eq(rep.dimsets[0].collectives, 9, "%s", txt);
  cr_assert_eq(rep.nstragglers, 1, "%s", txt);
  cr_expect_eq(rep.stragglers[0], 1, "%s", txt);
  const ts_stat *st = &rep.dimsets[0].stats[0];
  cr_expect_eq(st->rank, 1, "%s", txt);
  cr_expect_eq(st->samples, 9, "%s", txt);
  cr_expect_eq(st->late_median, 3000000, "%s", txt);
  cr_expect_eq(st->own_median, 3000000, "%s", txt);
  ts_report_free(&rep);
  for (int r = 0; r < 2; r++) tr_rank_free(&rs[r]);
  /* No dumps: an error. */
  cr_expect_eq(ts_analyze(NULL, 0, &rep, err, sizeof err), -1);
  cr_expect(strstr(err, "no dumps"), "%s", err);
  ts_report_free(&rep);
}
