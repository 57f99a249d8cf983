/* The analyzer of `meshpg trace` (tools/trace_analyze.h) on dumps of a
 * simulated job (trace_sim.h): one rank hangs, skips or swaps an
 * operation, or is killed; the `culprit:` lines must name exactly that
 * rank, never a rank that only waited for it, on groups of two members
 * (every group here), also when the rings overflowed; a healthy job names
 * nobody.  And the `meshpg trace` command on such a directory (text, JSON,
 * exit codes). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../../../tools/trace_analyze.h"
#include "../trace_test_util.h"
#include "trace_sim.h"

static const char *const fault_names[] = {"none", "hang", "skip", "swap", "kill"};

/* Run the job and analyze its dumps into *rep. */
static void analyze(sim_job *j, ta_report *rep) {
  char err[512];
  if (!j->timeout_s) j->timeout_s = 1.0;
  if (!j->hang_s) j->hang_s = 1.6;
  if (!j->steps) j->steps = 4;
  cr_assert_eq(sim_run(j, err, sizeof err), 0, "%s", err);
  cr_assert_eq(ta_analyze(j->ranks, j->nranks, SIM_WORLD, rep, err, sizeof err), 0, "%s", err);
}

/* The culprits, one per line, for messages. */
static void culprits_text(const ta_report *r, char *buf, size_t cap) {
  size_t n = 0;
  buf[0] = '\0';
  for (int k = 0; k < r->nculprits && n < cap; k++)
    n += (size_t)snprintf(buf + n, cap - n, "\n  %s", r->culprits[k].text);
  if (!r->nculprits) snprintf(buf, cap, " none");
}

/* Exactly one culprit, `rank`, its text holding `must`. */
static void expect_only(const ta_report *r, int rank, const char *must) {
  char got[8192];
  culprits_text(r, got, sizeof got);
  cr_expect_eq(r->nculprits, 1, "want only world rank %d; culprits:%s", rank, got);
  if (r->nculprits < 1) return;
  cr_expect_eq(r->culprits[0].rank, rank, "want world rank %d; culprits:%s", rank, got);
  char head[64];
  snprintf(head, sizeof head, "culprit: world rank %d: ", rank);
  cr_expect(!strncmp(r->culprits[0].text, head, strlen(head)), "culprits:%s", got);
  if (must) cr_expect(strstr(r->culprits[0].text, must), "want \"%s\"; culprits:%s", must, got);
}

/* A job whose rank `victim` has fault f at operation op of step `step`. */
#define JOB(f, victim_, step_, op_) \
  ((sim_job){.fault = f, .victim = victim_, .step = step_, .op = op_})

/* Job j (fault set) names exactly its victim, the culprit line holding must. */
static void named(sim_job j, const char *must) {
  ta_report rep;
  analyze(&j, &rep);
  expect_only(&rep, j.victim, must);
  ta_report_free(&rep);
  sim_free(&j);
}

Test(trace_analyze, hang_before_a_tp_all_reduce) {
  named(JOB(SIM_HANG, 1, 2, 2), "issued all_reduce #6 on tp[0] 0.");
}

Test(trace_analyze, hang_before_a_pipeline_send) {
  named(JOB(SIM_HANG, 2, 1, 1), "never issued all_reduce #3 on dp[0]");
}
Test(trace_analyze, hang_before_a_sync_bucket) {
  named(JOB(SIM_HANG, 5, 1, 4), "never issued send #3 to rank 1 on pp[1]");
}
Test(trace_analyze, hang_before_an_all_to_all) {
  named(JOB(SIM_HANG, 7, 3, 5), "all_to_all #8 on dp[3]");
}

Test(trace_analyze, skip_with_another_signature) {
  named(JOB(SIM_SKIP, 3, 1, 2), "skipped all_reduce #4 on tp[1]");
}

Test(trace_analyze, skip_with_the_same_signature) {
  named((sim_job){.fault = SIM_SKIP, .victim = 3, .step = 1, .op = 2, .same_counts = 1},
        "skipped all_reduce #4 on tp[1] in step 1");
}

Test(trace_analyze, swap_across_groups) {
  named(JOB(SIM_SWAP, 1, 1, 2), "swapped two operations of step 1");
}
Test(trace_analyze, swap_on_one_group) {
  named(JOB(SIM_SWAP, 5, 2, 1), "all_reduce (f32 x 300) as #5 on tp[2]");
}

Test(trace_analyze, killed_rank_left_no_dump) {
  sim_job j = {.fault = SIM_KILL, .victim = 6, .step = 1, .op = 2};
  ta_report rep;
  analyze(&j, &rep);
  expect_only(&rep, 6, "left no dump");
  /* its evidence for the picture: no dump, the operation waited for */
  cr_expect_eq(rep.nculprits ? rep.culprits[0].how : TA_OTHER, TA_NODUMP);
  cr_expect(rep.nculprits && rep.culprits[0].group[0] && rep.culprits[0].gseq > 0);
  cr_expect_eq(rep.nmissing, 1);
  cr_expect_eq(rep.nmissing ? rep.missing[0].rank : -1, 6);
  cr_expect_eq(rep.ndumps, 7);
  ta_report_free(&rep);
  sim_free(&j);
}

Test(trace_analyze, ring_overflow_compares_what_all_hold) {
  sim_job j = {.fault = SIM_HANG, .victim = 4, .step = 7, .op = 1, .steps = 9, .capacity = 8};
  ta_report rep;
  analyze(&j, &rep);
  for (int i = 0; i < j.nranks; i++)
    cr_expect_gt(j.ranks[i].total, (uint64_t)j.ranks[i].nops, "rank %d's ring did not overflow",
                 j.ranks[i].rank);
  expect_only(&rep, 4, "never issued send #8 to rank 0 on pp[0]");
  ta_report_free(&rep);
  sim_free(&j);
}

Test(trace_analyze, healthy_job_names_nobody) {
  sim_job j = {0};
  ta_report rep;
  analyze(&j, &rep);
  cr_expect_eq(rep.fault, 0);
  cr_expect_eq(rep.nculprits, 0);
  cr_expect_eq(rep.nmismatches, 0);
  cr_expect_eq(rep.nvictims, 0);
  cr_expect_eq(rep.ndumps, 8);
  ta_report_free(&rep);
  sim_free(&j);
}

Test(trace_analyze, victims_are_blocked_not_named) {
  sim_job j = {.fault = SIM_HANG, .victim = 0, .step = 2, .op = 0};
  ta_report rep;
  analyze(&j, &rep);
  expect_only(&rep, 0, "issued all_reduce #5 on tp[0] 0.6 s after the others had failed");
  if (rep.nculprits) {
    const ta_item *it = &rep.culprits[0];
    cr_expect_eq(it->how, TA_LATE);
    cr_expect_str_eq(it->group, "tp[0]");
    cr_expect_eq(it->gseq, 5);
    cr_expect_str_eq(it->kind, "all_reduce");
    cr_expect(it->peers_issue_ns > 0 && it->peers_end_ns > it->peers_issue_ns);
  }
  cr_expect_geq(rep.nvictims, 3, "only %d ranks blocked", rep.nvictims);
  cr_expect_gt(rep.nmismatches, 0);
  ta_report_free(&rep);
  sim_free(&j);
}

/* Run job j (fault set) and say whether exactly its victim is named; a
 * miss is printed with `what`. */
static int exact(sim_job *j, const char *what) {
  ta_report rep;
  analyze(j, &rep);
  int ok = rep.nculprits == 1 && rep.culprits[0].rank == j->victim;
  if (!ok) {
    char got[8192];
    culprits_text(&rep, got, sizeof got);
    fprintf(stderr, "MISS %s rank %d step %d op %d%s: culprits:%s\n", fault_names[j->fault],
            j->victim, j->step, j->op, what, got);
  }
  ta_report_free(&rep);
  sim_free(j);
  return ok;
}

/* Every fault at every step and operation of a 4-step job. */
Test(trace_analyze, every_fault_everywhere, .timeout = 300) {
  int runs = 0, hits = 0;
  for (int f = SIM_HANG; f <= SIM_KILL; f++)
    for (int victim = 0; victim < SIM_WORLD; victim++)
      for (int op = 0; op < 6; op++) {
        if (f == SIM_SWAP && op == 5) continue;
        for (int same = 0; same < (f == SIM_SKIP ? 2 : 1); same++) {
          sim_job j = {.fault = (sim_fault)f, .victim = victim, .step = 1 + (victim + op) % 2,
                          .op = op, .same_counts = same};
          runs++;
          hits += exact(&j, same ? " (same counts)" : "");
        }
      }
  fprintf(stderr, "every_fault_everywhere: %d of %d exact\n", hits, runs);
  cr_expect_eq(hits, runs, "%d of %d runs named exactly the faulty rank", hits, runs);
}

/* ------------------------------------------------------------------ */
/* Sequence evidence (issue 46, items 1 and 2)                          */
/* ------------------------------------------------------------------ */

/* A skip of a tp all-reduce of the same count as its neighbour by
 * `victim` in `step` (op: its index in the step): exactly the victim named, "skipped
 * all_reduce #k on tp[victim / 2]", and its evidence for the picture.
 * Returns 1 when so (the misses are printed). */
static int skip_named(int victim, int step, int op, int check_order, int end_dumps, int *ended) {
  sim_job j = {.fault = SIM_SKIP, .victim = victim, .step = step, .op = op, .same_counts = 1,
                  .check_order = check_order, .end_dumps = end_dumps};
  ta_report rep;
  analyze(&j, &rep);
  char want[64], got[8192];
  snprintf(want, sizeof want, " on tp[%d]", victim / 2);
  int ok = rep.nculprits == 1 && rep.culprits[0].rank == victim;
  const ta_item *it = ok ? &rep.culprits[0] : NULL;
  ok = ok && strstr(it->text, "skipped all_reduce #") && strstr(it->text, want) &&
       !strstr(it->text, "left no dump");
  ok = ok && it->how == TA_SKIPPED && !strcmp(it->group, want + 4) &&
       !strcmp(it->kind, "all_reduce") && it->gseq > 0 && it->peers_issue_ns > 0;
  /* every rank dumped (with the checker all fail; without it the victim
   * ends its program, unless the pipeline blocks it behind its partner) */
  int dumps_ok = rep.ndumps == SIM_WORLD;
  for (int i = 0; i < j.nranks && ended; i++)
    if (j.ranks[i].rank == victim && !strcmp(j.ranks[i].reason, "end")) (*ended)++;
  if (!ok || !dumps_ok) {
    culprits_text(&rep, got, sizeof got);
    fprintf(stderr, "MISS skip rank %d step %d op %d%s%s (%d dumps): culprits:%s\n", victim, step,
            op, check_order ? " checker" : "", end_dumps ? " end dumps" : "", rep.ndumps, got);
  }
  ta_report_free(&rep);
  sim_free(&j);
  return ok && dumps_ok;
}

/* Issue 46's own job (sim_dp2tp2_skip): 4 ranks of dp=2,tp=2, world rank 2
 * skips tp all-reduce `skip` of step `step`; exactly world rank 2 named,
 * "skipped all_reduce #k on tp[1]". */
static int dp2tp2_named(int step, int skip, int check_order, int tp1_count) {
  tr_rank R[4];
  char err[512], got[8192];
  cr_assert_eq(sim_dp2tp2_skip(3, step, skip, check_order, tp1_count, R, err, sizeof err), 0,
               "%s", err);
  ta_report rep;
  cr_assert_eq(ta_analyze(R, 4, 4, &rep, err, sizeof err), 0, "%s", err);
  int ok = rep.nculprits == 1 && rep.culprits[0].rank == 2 &&
           strstr(rep.culprits[0].text, "skipped all_reduce #") &&
           strstr(rep.culprits[0].text, " on tp[1]") && rep.culprits[0].how == TA_SKIPPED &&
           !strcmp(rep.culprits[0].group, "tp[1]");
  /* without the checker rank 2 ran to the end and said so */
  if (!check_order) ok = ok && !strcmp(R[2].reason, "end");
  if (!ok) {
    culprits_text(&rep, got, sizeof got);
    fprintf(stderr, "MISS dp=2,tp=2 skip %d of step %d%s, tp[1] count %d (rank 2: %s): "
            "culprits:%s\n", skip, step, check_order ? " checker" : "", tp1_count, R[2].reason,
            got);
  }
  ta_report_free(&rep);
  for (int r = 0; r < 4; r++) tr_rank_free(&R[r]);
  return ok;
}

/* The issue's job: 7 tp all-reduces against 8, every position, every
 * step, tp[0] with the same count or another (an uneven batch, where the
 * order of the ranks' steps has no majority to follow). */
static void every_dp2tp2_skip(int check_order) {
  int runs = 0, hits = 0;
  for (int step = 0; step < 3; step++)
    for (int skip = 0; skip < 8; skip++)
      for (int cnt = 100; cnt <= 120; cnt += 20) {
        runs++;
        hits += dp2tp2_named(step, skip, check_order, cnt);
      }
  cr_expect_eq(hits, runs, "dp=2,tp=2: %d of %d skips named world rank 2", hits, runs);
}

/* Item 1: with the issue-order check's world collective at each step's
 * end, the victim's partner waits in the tp all-reduce the victim lacks
 * while the victim waits in the check (a cycle, no root of the wait-for
 * graph); the victim went on to the check, so the sequences name it.
 * Every victim, every tp all-reduce of two steps. */
Test(trace_analyze, skipped_collective_same_size_with_checker) {
  int runs = 0, hits = 0;
  for (int victim = 0; victim < SIM_WORLD; victim++)
    for (int step = 1; step <= 2; step++)
      for (int op = victim < 4 ? 0 : 1; op <= 2; op += victim < 4 ? 2 : 1) {
        runs++; /* the tp all-reduces: ops 0 and 2 of stage 0, 1 and 2 of stage 1 */
        hits += skip_named(victim, step, op, 1, 0, NULL);
      }
  cr_expect_eq(hits, runs, "%d of %d skips named exactly the victim as having skipped", hits, runs);
  every_dp2tp2_skip(1);
}

/* Item 2: without the checker the victim runs to the end of its program
 * and dumps with reason "end" (mpg_ctx_destroy with a trace directory):
 * its list lacks the all-reduce its partner waits in, and the culprit
 * line names the skip, not a missing dump.  Every victim, every step
 * (the last one included), both tp all-reduces. */
Test(trace_analyze, skipped_collective_same_size_end_dumps) {
  int runs = 0, hits = 0, ended = 0;
  for (int victim = 0; victim < SIM_WORLD; victim++)
    for (int step = 1; step <= 3; step++)
      for (int op = victim < 4 ? 0 : 1; op <= 2; op += victim < 4 ? 2 : 1) {
        runs++;
        hits += skip_named(victim, step, op, 0, 1, &ended);
      }
  cr_expect_eq(hits, runs, "%d of %d skips named exactly the victim as having skipped", hits, runs);
  cr_expect_geq(ended, runs / 3, "the victim ended its program in only %d of %d runs", ended, runs);
  every_dp2tp2_skip(0);
}

/* No false positive: a healthy job names nobody with the checker and end
 * dumps (a dump with reason "end" is no failure), and every other fault
 * (hang, swap, kill, a skip of another count) still names exactly its
 * rank with them, never a rank that only waited. */
Test(trace_analyze, sequence_evidence_names_no_victim) {
  for (int opt = 0; opt < 4; opt++) {
    sim_job j = {.check_order = opt & 1, .end_dumps = opt >> 1};
    ta_report rep;
    analyze(&j, &rep);
    cr_expect_eq(rep.fault, 0, "options %d", opt);
    cr_expect_eq(rep.nculprits, 0, "options %d: %s", opt,
                 rep.nculprits ? rep.culprits[0].text : "");
    cr_expect_eq(rep.ndumps, SIM_WORLD);
    ta_report_free(&rep);
    sim_free(&j);
  }
  int runs = 0, hits = 0;
  for (int opt = 1; opt < 4; opt++)
    for (int f = SIM_HANG; f <= SIM_KILL; f++)
      for (int victim = 0; victim < SIM_WORLD; victim++)
        for (int op = 0; op < 6; op++) {
          if (f == SIM_SWAP && op == 5) continue;
          sim_job j = {.fault = (sim_fault)f, .victim = victim, .step = 1 + (victim + op) % 2,
                          .op = op, .check_order = opt & 1, .end_dumps = opt >> 1};
          runs++;
          hits += exact(&j, opt == 1 ? " checker" : opt == 2 ? " end dumps" : " both");
        }
  cr_expect_eq(hits, runs, "%d of %d runs named exactly the faulty rank", hits, runs);
}

/* ------------------------------------------------------------------ */
/* meshpg trace                                                        */
/* ------------------------------------------------------------------ */

static int run_cli(const char *args, char *out, size_t cap) {
  return tt_run_cli(args, out, cap, NULL);
}

Test(trace_cli, report_json_and_exit_codes) {
  char dir[] = "/tmp/meshpg-trace-cli-XXXXXX";
  cr_assert_not_null(mkdtemp(dir));
  sim_job j = {.fault = SIM_HANG, .victim = 2, .step = 1, .op = 4};
  ta_report rep;
  analyze(&j, &rep);
  ta_report_free(&rep);
  cr_assert_eq(sim_write(&j, dir), 0);
  sim_free(&j);
  static char out[1 << 20];
  cr_expect_eq(run_cli(dir, out, sizeof out), 0, "%s", out);
  cr_expect(strstr(out, "\nculprit: world rank 2: "), "%s", out);
  cr_expect(strstr(out, "first failure: world rank 0: all_reduce #3 on dp[0] failed with "
                        "MPG_ERR_TIMEOUT"), "%s", out);
  cr_expect(strstr(out, "\n  dp[0] #3:\n    all_reduce (f32 x 200, bucket 0 (p0..p3)) issued by world "
                        "rank 0 (MPG_ERR_TIMEOUT after 1.0 s)\n    issued late by world rank 2"),
            "%s", out);
  cr_expect_null(strstr(out, "culprit: world rank 0"), "%s", out);
  char args[256];
  snprintf(args, sizeof args, "%s --json", dir);
  cr_expect_eq(run_cli(args, out, sizeof out), 0, "%s", out);
  cr_expect(strstr(out, "\"culprits\": [\n    {\"rank\": 2, \"text\": \"culprit: world rank 2: "),
            "%s", out);
  cr_expect(strstr(out, "\"fault\": {\"found\": true, \"rank\": 0, \"status\": \"MPG_ERR_TIMEOUT\""),
            "%s", out);
  cr_expect(strstr(out, "\"mismatches\": [") && strstr(out, "\"groups\": ["), "%s", out);
  cr_expect_eq(run_cli("", out, sizeof out), 2, "%s", out);
  cr_expect_eq(run_cli("--bogus x", out, sizeof out), 2, "%s", out);
  cr_expect_eq(run_cli("/nonexistent-meshpg-trace-dir", out, sizeof out), 1, "%s", out);
  snprintf(args, sizeof args, "%s --svg", dir);
  cr_expect_eq(run_cli(args, out, sizeof out), 2, "%s", out);
  char cmd[512];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  cr_expect_eq(system(cmd), 0);
}
