/* Hostile dump files for `meshpg trace` (tools/trace_read.c,
 * tools/trace_analyze.c; issue 45, item 14): each is refused, or analyzed,
 * in under a second (the bound widened for a sanitizer), with memory that
 * grows with the files, not with the numbers in them; and a directory
 * reused by a second run reports the newest job and names the files it
 * ignored. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../trace_test_util.h"
#include "time_bound.h"
#include "trace_analyze.h"
#include "trace_read.h"

static char dir[256], path[400]; /* path: dir/rank-0.trace */

static void fresh_dir(const char *name) {
  tt_fresh_dir(dir, sizeof dir, "trace-hostile", name);
  snprintf(path, sizeof path, "%s/rank-0.trace", dir);
}

static void cleanup(void) { tt_cleanup("trace-hostile"); }

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The bound: 1 s, times the sanitizer's slowdown (time_bound.h). */
static double bound_s(void) { return 1.0 * tb_sanitizer_factor(); }

static void put(const char *name, const char *text) {
  char file[400];
  snprintf(file, sizeof file, "%s/%s", dir, name);
  FILE *f = fopen(file, "w");
  cr_assert_not_null(f, "%s: %s", file, strerror(errno));
  fputs(text, f);
  fclose(f);
}

/* A dump of rank r of a world of w ranks in group dp[0] (all ranks), job
 * `job`, dumped at `clock`, with one operation of number gseq: kind
 * ("all_reduce f32 4 -1", "send f32 4 1": KIND DTYPE COUNT PEER). */
static void dump_op(int r, int w, const char *job, long long clock, const char *gseq,
                    const char *kind) {
  char ranks[256] = "", name[32], text[1024];
  for (int k = 0; k < w; k++)
    snprintf(ranks + strlen(ranks), sizeof ranks - strlen(ranks), "%s%d", k ? "," : "", k);
  snprintf(text, sizeof text,
           "meshpg-trace 1\nrank %d %d\nprocess host %d\nbackend thread\nmesh dp=%d\n"
           "job %s\nclock %lld\nreason request -\nring 16 1\ngroup 0 dp 0 %d %d %s\n"
           "op 0 0 %s %s -1 -1 %lld %lld %lld ok - -\nend 1\n",
           r, w, 100 + r, w, job, clock, r, w, ranks, gseq, kind, clock - 300, clock - 200,
           clock - 100);
  snprintf(name, sizeof name, "rank-%d.trace", r);
  put(name, text);
}

static void dump(int r, int w, const char *job, long long clock, const char *gseq) {
  dump_op(r, w, job, clock, gseq, "all_reduce f32 4 -1");
}

/* tr_read_dir and, when it succeeds, ta_analyze, as `meshpg trace` runs
 * them: 0 when both succeed, the time taken in *secs, the error in err. */
static int read_and_analyze(double *secs, ta_report *rep, char *err, size_t cap) {
  double t0 = now_s();
  tr_rank *rs = NULL;
  int n = 0;
  int rc = tr_read_dir(dir, &rs, &n, err, cap);
  memset(rep, 0, sizeof *rep);
  if (!rc) rc = ta_analyze(rs, n, 0, rep, err, cap);
  tr_ranks_free(rs, n);
  *secs = now_s() - t0;
  fprintf(stderr, "hostile: %s: %s in %.3f s\n", strrchr(dir, '-') + 1, rc ? "refused" : "analyzed",
          *secs);
  return rc;
}

static int run_cli(const char *args, char *out, size_t cap, double *secs) {
  return tt_run_cli(args, out, cap, secs);
}

Test(trace_hostile, hostile_dump_files, .fini = cleanup, .timeout = 60) {
  char err[1024];
  double secs;
  ta_report rep;

  /* GSEQ 10^18 on both members (they agree), against a member at 1, and
   * as a send and its receive: analyzed, the numbers compared are the ones
   * the rings hold (the old analyzer counted from 1 to 10^18). */
  const char *big = "1000000000000000000";
  fresh_dir("gseq");
  dump(0, 2, "00000000000000aa", 5000000000LL, big);
  dump(1, 2, "00000000000000aa", 5000000000LL, big);
  cr_expect_eq(read_and_analyze(&secs, &rep, err, sizeof err), 0, "%s", err);
  cr_expect_lt(secs, bound_s(), "GSEQ 10^18: %.3f s", secs);
  cr_expect_eq(rep.nmismatches, 0, "the members agree");
  ta_report_free(&rep);
  dump(1, 2, "00000000000000aa", 5000000000LL, "1");
  cr_expect_eq(read_and_analyze(&secs, &rep, err, sizeof err), 0, "%s", err);
  cr_expect_lt(secs, bound_s(), "GSEQ 10^18 and 1: %.3f s", secs);
  cr_expect_geq(rep.nmismatches, 1, "the numbers differ: a disagreement");
  ta_report_free(&rep);
  dump_op(0, 2, "00000000000000aa", 5000000000LL, big, "send f32 4 1");
  dump_op(1, 2, "00000000000000aa", 5000000000LL, big, "recv f32 4 0");
  cr_expect_eq(read_and_analyze(&secs, &rep, err, sizeof err), 0, "%s", err);
  cr_expect_lt(secs, bound_s(), "send and recv #10^18: %.3f s", secs);
  cr_expect_eq(rep.nmismatches, 0, "the send and its receive agree");
  ta_report_free(&rep);

  /* A FIFO named rank-0.trace: refused without waiting for a writer. */
  fresh_dir("fifo");
  cr_assert_eq(mkfifo(path, 0666), 0, "%s", strerror(errno));
  cr_expect_eq(read_and_analyze(&secs, &rep, err, sizeof err), -1);
  cr_expect_lt(secs, bound_s(), "FIFO: %.3f s", secs);
  cr_expect(strstr(err, "rank-0.trace") && strstr(err, "FIFO"), "%s", err);
  ta_report_free(&rep);

  /* A symlink to /dev/zero, and one to a good dump: refused (regular
   * files only). */
  fresh_dir("zero");
  cr_assert_eq(symlink("/dev/zero", path), 0, "%s", strerror(errno));
  cr_expect_eq(read_and_analyze(&secs, &rep, err, sizeof err), -1);
  cr_expect_lt(secs, bound_s(), "/dev/zero: %.3f s", secs);
  cr_expect(strstr(err, "symbolic link"), "%s", err);
  ta_report_free(&rep);

  /* A directory of that name. */
  fresh_dir("subdir");
  cr_assert_eq(mkdir(path, 0777), 0);
  cr_expect_eq(read_and_analyze(&secs, &rep, err, sizeof err), -1);
  cr_expect(strstr(err, "directory"), "%s", err);
  ta_report_free(&rep);

  /* WORLD 10,000,000 in a 301-byte file: over the limit, refused. */
  fresh_dir("world");
  put("rank-0.trace",
      "meshpg-trace 1\nrank 0 10000000\nprocess host 1\nbackend thread\nmesh dp=2\n"
      "job 00000000000000aa\nclock 5000000000\nreason request -\nring 16 1\n"
      "group 0 dp 0 0 2 0,1\n"
      "op 0 0 1 all_reduce f32 4 -1 -1 -1 4000000000 4000000001 4000000002 ok - -\nend 1\n");
  cr_expect_eq(read_and_analyze(&secs, &rep, err, sizeof err), -1);
  cr_expect_lt(secs, bound_s(), "WORLD 10^7: %.3f s", secs);
  cr_expect(strstr(err, "WORLD") && strstr(err, "1048576"), "%s", err);
  ta_report_free(&rep);

  /* WORLD at the limit, one dump: the ranks without a dump are one item,
   * the report stays small, and the CLI answers in time. */
  fresh_dir("worldmax");
  char text[1024];
  snprintf(text, sizeof text,
           "meshpg-trace 1\nrank 0 %d\nprocess host 1\nbackend thread\nmesh dp=2\n"
           "job 00000000000000aa\nclock 5000000000\nreason request -\nring 16 1\n"
           "group 0 dp 0 0 2 0,%d\n"
           "op 0 0 1 all_reduce f32 4 -1 -1 -1 4000000000 4000000001 4000000002 ok - -\n"
           "end 1\n", MPG__TRACE_MAX_WORLD, MPG__TRACE_MAX_WORLD - 1);
  put("rank-0.trace", text);
  cr_expect_eq(read_and_analyze(&secs, &rep, err, sizeof err), 0, "%s", err);
  cr_expect_lt(secs, bound_s(), "WORLD %d: %.3f s", MPG__TRACE_MAX_WORLD, secs);
  cr_expect_eq(rep.nmissing, 1);
  cr_expect(rep.nmissing && strstr(rep.missing[0].text, "world ranks 1 to 1048575"), "%s",
            rep.nmissing ? rep.missing[0].text : "");
  ta_report_free(&rep);
  static char out[1 << 16];
  snprintf(text, sizeof text, "'%s' --svg '%s/t.svg' --chrome '%s/t.json'", dir, dir, dir);
  int code = run_cli(text, out, sizeof out, &secs);
  cr_expect_eq(code, 0, "%s", out);
  cr_expect_lt(secs, bound_s() + 0.5, "meshpg trace, WORLD %d: %.3f s", MPG__TRACE_MAX_WORLD,
               secs);
  cr_expect_lt(strlen(out), 4096, "a report of %zu bytes", strlen(out));
  const char *drawn[] = {"t.svg", "t.json"};
  for (int k = 0; k < 2; k++) { /* the drawings too: a row per run of ranks without a dump */
    struct stat st;
    char file[400];
    snprintf(file, sizeof file, "%s/%s", dir, drawn[k]);
    cr_assert_eq(stat(file, &st), 0, "%s", file);
    cr_expect_lt(st.st_size, 65536, "%s: %lld bytes", file, (long long)st.st_size);
  }

  /* One dump that lists a group of 2^20 members and 1,024 pending
   * all-reduces on it (a 7 MB file): analyzed in time, the report small
   * (the members without a dump are runs, the long member list cut). */
  fresh_dir("biggroup");
  FILE *bf = fopen(path, "w");
  cr_assert_not_null(bf);
  fprintf(bf, "meshpg-trace 1\nrank 0 %d\nprocess host 1\nbackend thread\nmesh dp=2\n"
              "job 00000000000000aa\nclock 5000000000\nreason MPG_ERR_TIMEOUT -\n"
              "ring 1024 1024\ngroup 0 dp 0 0 %d 0", MPG__TRACE_MAX_WORLD, MPG__TRACE_MAX_WORLD);
  for (int q = 1; q < MPG__TRACE_MAX_WORLD; q++) fprintf(bf, ",%d", q);
  fputc('\n', bf);
  for (int k = 0; k < 1024; k++)
    fprintf(bf, "op %d 0 %d all_reduce f32 4 -1 %d -1 4000000000 4000000001 0 pending - -\n",
            k, k + 1, k / 4);
  fputs("end 1024\n", bf);
  fclose(bf);
  cr_expect_eq(read_and_analyze(&secs, &rep, err, sizeof err), 0, "%s", err);
  cr_expect_lt(secs, bound_s(), "a group of 2^20 members: %.3f s", secs);
  cr_expect_eq(rep.nmissing, 1);
  cr_expect_leq(rep.nculprits, 40, "%d culprits", rep.nculprits);
  ta_report_free(&rep);
  snprintf(text, sizeof text, "'%s'", dir);
  code = run_cli(text, out, sizeof out, &secs);
  cr_expect_eq(code, 0, "%s", out);
  cr_expect_lt(strlen(out), 16384, "a report of %zu bytes", strlen(out));
  cr_expect(strstr(out, "no dump from world ranks 1 to 1048575") &&
                strstr(out, "and 1048543 more ranks without a dump"),
            "%.2000s", out);

  /* The CLI on the FIFO: an error naming it, exit 1, in time. */
  fresh_dir("clififo");
  cr_assert_eq(mkfifo(path, 0666), 0, "%s", strerror(errno));
  snprintf(text, sizeof text, "'%s'", dir);
  code = run_cli(text, out, sizeof out, &secs);
  cr_expect_eq(code, 1, "%s", out);
  cr_expect(strstr(out, "FIFO"), "%s", out);
  cr_expect_lt(secs, bound_s() + 0.5, "meshpg trace on a FIFO: %.3f s", secs);
}

Test(trace_hostile, reused_directory_reports_newest_job, .fini = cleanup, .timeout = 60) {
  /* Run 1 (job ..aa): ranks 0..3 dumped.  Run 2 (job ..bb), in the same
   * directory: rank 3 killed, ranks 0..2 dumped later. */
  fresh_dir("reused");
  for (int r = 0; r < 4; r++) dump(r, 4, "00000000000000aa", 5000000000LL + r, "1");
  for (int r = 0; r < 3; r++) dump(r, 4, "00000000000000bb", 9000000000LL + r, "2");
  tr_rank *rs = NULL;
  int n = 0;
  char *ignored = NULL, err[1024];
  cr_assert_eq(tr_read_dir_newest(dir, &rs, &n, &ignored, err, sizeof err), 0, "%s", err);
  cr_expect_eq(n, 3);
  for (int i = 0; i < n; i++) cr_expect_str_eq(rs[i].job, "00000000000000bb");
  cr_assert_not_null(ignored);
  cr_expect(strstr(ignored, "rank-3.trace") && strstr(ignored, "00000000000000aa"), "%s",
            ignored);
  ta_report rep;
  cr_expect_eq(ta_analyze(rs, n, 0, &rep, err, sizeof err), 0, "%s", err);
  cr_expect_eq(rep.nmissing, 1);
  cr_expect_eq(rep.nmissing ? rep.missing[0].rank : -1, 3);
  ta_report_free(&rep);
  free(ignored);
  tr_ranks_free(rs, n);

  /* The CLI: the report of job bb, the ignored file named; --json too. */
  static char out[1 << 16];
  char args[400];
  double secs;
  snprintf(args, sizeof args, "'%s'", dir);
  cr_expect_eq(run_cli(args, out, sizeof out, &secs), 0, "%s", out);
  cr_expect(strstr(out, "3 of 4 ranks left a dump") && strstr(out, "job 00000000000000bb"),
            "%s", out);
  cr_expect(strstr(out, "ignored") && strstr(out, "rank-3.trace: job 00000000000000aa"), "%s",
            out);
  cr_expect(strstr(out, "world rank 3: no dump"), "%s", out);
  snprintf(args, sizeof args, "'%s' --json", dir);
  cr_expect_eq(run_cli(args, out, sizeof out, &secs), 0, "%s", out);
  cr_expect(strstr(out, "\"ignored\": [") && strstr(out, "rank-3.trace: job 00000000000000aa"),
            "%s", out);
}
