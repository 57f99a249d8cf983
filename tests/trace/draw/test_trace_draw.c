/* The SVG and Chrome trace writers (tools/trace_draw.c) on synthetic dumps
 * read back by tools/trace_read.c.  Every output is parsed by
 * check_draw.py (XML / JSON, one row or process per world rank, slices
 * nested per Chrome thread) and its summary asserted here: rows and pids,
 * ranks without a dump, operations per group, the failure marker, the
 * escaping of names that are not XML or UTF-8 clean. */
#define _XOPEN_SOURCE 700
#include <criterion/criterion.h>

#include <ftw.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "trace_draw.h"
#include "trace_read.h"
#include "../../support/run_util.h"
#include "../trace_test_util.h"

enum { WORLD = 4, STEPS = 3, OPS_PER_STEP = 4 };
#define T0 INT64_C(1700000000000000000)
#define MS INT64_C(1000000)

typedef struct gen {
  int fail_rank;      /* its last op fails with MPG_ERR_TIMEOUT; the others pend; -1 */
  const char *tpname; /* the tp group's encoded name */
  int pend;           /* 1 + the rank whose last barrier is still pending at its
                         dump, written for MPG_ERR_STATE (no op failed); 0: none */
  int other;          /* 1 + the rank whose tp all-reduce of the last step has twice
                         the count and failed at once (MPG_ERR_STATE); 0: none */
} gen;

/* Rank r of dp=2,tp=2 (tp innermost) with a world group: per step a tp
 * all-reduce, two overlapping dp bucket all-reduces, a world barrier. */
static char *gen_dump(int r, const gen *g) {
  size_t cap = 1 << 16, n = 0;
  char *s = malloc(cap);
  cr_assert_not_null(s);
  int64_t t = T0 + r * 1000, end = T0 + STEPS * 10 * MS + 5 * MS;
  int failing = g->fail_rank >= 0, pend = g->pend == r + 1, other = g->other == r + 1;
  n += (size_t)snprintf(s + n, cap - n,
                        "meshpg-trace 1\nrank %d %d\nprocess host%d %d\nbackend thread\n"
                        "mesh dp=2,tp=2\njob 00000000000000aa\nclock %" PRId64 "\nreason %s\n"
                        "ring 2048 %d\n",
                        r, WORLD, r, 100 + r, end,
                        failing ? "MPG_ERR_TIMEOUT timed%20out"
                        : pend || other ? "MPG_ERR_STATE counts%20differ"
                                        : "request -",
                        STEPS * OPS_PER_STEP);
  n += (size_t)snprintf(s + n, cap - n, "group 0 %s %d %d 2 %d,%d\n", g->tpname, r / 2, r % 2,
                        r & ~1, r | 1);
  n += (size_t)snprintf(s + n, cap - n, "group 1 dp %d %d 2 %d,%d\n", r % 2, r / 2, r % 2,
                        r % 2 + 2);
  n += (size_t)snprintf(s + n, cap - n, "group 2 world 0 %d 4 0,1,2,3\n", r);
  int seq = 0;
  for (int st = 0; st < STEPS; st++) {
    int64_t b = t + st * 10 * MS;
    int last = st == STEPS - 1;
    const char *bar = !last || !failing ? "ok" : r == g->fail_rank ? "MPG_ERR_TIMEOUT" : "pending";
    int64_t bar_end = !last || !failing ? b + 8 * MS + MS / 2 : r == g->fail_rank ? b + 9 * MS : 0;
    if (last && pend) bar = "pending", bar_end = 0;
    int odd = last && other; /* twice the count, failed as it started */
    int64_t tp_end = odd ? b + MS / 10 : b + MS;
    n += (size_t)snprintf(
        s + n, cap - n,
        "op %d 0 %d all_reduce f32 %d -1 %d -1 %" PRId64 " %" PRId64 " %" PRId64 " %s - -\n"
        "op %d 1 %d all_reduce f32 1000 -1 %d 0 %" PRId64 " %" PRId64 " %" PRId64
        " ok l1.w l1.b\n"
        "op %d 1 %d all_reduce f32 2000 -1 %d 1 %" PRId64 " %" PRId64 " %" PRId64
        " ok l0.w l0.b\n"
        "op %d 2 %d barrier - 0 -1 %d -1 %" PRId64 " %" PRId64 " %" PRId64 " %s - -\n",
        seq, st + 1, odd ? 8192 : 4096, st, b, b + MS / 10, tp_end, odd ? "MPG_ERR_STATE" : "ok",
        seq + 1, 2 * st + 1, st, b + 2 * MS,
        b + 5 * MS / 2, b + 6 * MS, seq + 2, 2 * st + 2, st, b + 3 * MS, b + 3 * MS + MS / 5,
        b + 7 * MS, seq + 3, st + 1, st, b + 8 * MS, b + 8 * MS, bar_end, bar);
    seq += OPS_PER_STEP;
  }
  n += (size_t)snprintf(s + n, cap - n, "end %d\n", seq);
  return s;
}

/* Dumps of the ranks in have[0..k). */
static tr_rank *make_ranks(const int *have, int k, const gen *g) {
  tr_rank *rs = calloc((size_t)k, sizeof *rs);
  cr_assert_not_null(rs);
  for (int i = 0; i < k; i++) {
    char *s = gen_dump(have[i], g), err[512] = "";
    cr_assert_eq(tr_parse(s, strlen(s), &rs[i], err, sizeof err), 0, "rank %d: %s\n%s",
                 have[i], err, s);
    free(s);
  }
  return rs;
}

static char dir[256];

#define DRAW_TMP_NAME "trace_draw"
#include "draw_check.h"

/* The value of "key=value" in out ("" when absent). */
static const char *kv(const char *key) {
  static char val[1024];
  char pat[64];
  snprintf(pat, sizeof pat, "%s=", key);
  size_t pl = strlen(pat);
  for (const char *l = out; *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : l + strlen(l)) {
    if (!strncmp(l, pat, pl)) {
      size_t n = strcspn(l + pl, "\n");
      snprintf(val, sizeof val, "%.*s", (int)(n < sizeof val ? n : sizeof val - 1), l + pl);
      return val;
    }
  }
  val[0] = '\0';
  return val;
}

static long kv_long(const char *key) {
  const char *v = kv(key);
  cr_assert(v[0], "no %s in:\n%s", key, out);
  return strtol(v, NULL, 10);
}

/* Both files of the ranks, checked; returns nothing, leaves dir/t.svg and
 * dir/t.json. */
static void write_both(const tr_rank *rs, int n, int world) {
  char svg[300], js[300], err[512] = "";
  snprintf(svg, sizeof svg, "%s/t.svg", dir);
  snprintf(js, sizeof js, "%s/t.json", dir);
  cr_assert_eq(tr_write_svg(rs, n, world, svg, err, sizeof err), 0, "%s", err);
  cr_assert_eq(tr_write_chrome(rs, n, world, js, err, sizeof err), 0, "%s", err);
}

/* The ranks of have[0..k) made (make_ranks) and written (write_both). */
static tr_rank *ranks_written(const gen *g, const int *have, int k, int world) {
  tr_rank *rs = make_ranks(have, k, g);
  write_both(rs, k, world);
  return rs;
}

/* check (draw_check.h) of dir/t.svg (mode "svg") or dir/t.json ("chrome"). */
static void check_written(const char *mode) {
  char p[300];
  snprintf(p, sizeof p, "%s/t.%s", dir, strcmp(mode, "svg") ? "json" : "svg");
  check(mode, p);
}

static char *slurp(const char *name) {
  char p[300];
  snprintf(p, sizeof p, "%s/%s", dir, name);
  FILE *f = fopen(p, "rb");
  cr_assert_not_null(f, "%s", p);
  static char buf[1 << 20];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  buf[n] = '\0';
  fclose(f);
  return buf;
}

TestSuite(trace_draw, .init = setup, .fini = teardown);

Test(trace_draw, healthy_run_with_a_rank_missing) {
  gen g = {.fail_rank = -1, .tpname = "tp"};
  int have[] = {3, 0, 1}; /* any order: the writers place rows by rank */
  tr_rank *rs = ranks_written(&g, have, 3, WORLD);
  check_written("svg");
  cr_expect_eq(kv_long("rows"), WORLD);
  cr_expect_str_eq(kv("nodump"), "2");
  cr_expect_eq(kv_long("ops"), 3 * STEPS * OPS_PER_STEP);
  cr_expect_eq(kv_long("bad"), 0);
  cr_expect_eq(kv_long("failure"), 0);
  cr_expect_str_eq(kv("groups"), "dp,tp,world");
  cr_expect_str_eq(kv("op_groups"), "dp,tp,world");
  char *svg = slurp("t.svg");
  cr_expect(strstr(svg, "bucket 1") && strstr(svg, "params l0.w .. l0.b"), "tooltips");
  cr_expect(strstr(svg, " ms</text>"), "a time axis in ms");
  check_written("chrome");
  cr_expect_str_eq(kv("pids"), "0,1,2,3");
  /* Each op, plus a wait slice for the three that started after issue. */
  cr_expect_eq(kv_long("complete"), 3 * STEPS * (OPS_PER_STEP + 3));
  cr_expect_eq(kv_long("instants"), 0);
  cr_expect_str_eq(kv("cats"), "dp,tp,world");
  char *js = slurp("t.json");
  cr_expect(strstr(js, "\"name\":\"rank 0\"") && strstr(js, "\"name\":\"rank 2 (no dump)\""));
  /* The two overlapping dp buckets went to two threads. */
  cr_expect(strstr(js, "\"name\":\"dp (2)\""), "no second dp lane");
  tr_ranks_free(rs, 3);
}

/* Dumps of ranks 0 and 1 only, drawn in a world of `world` ranks (0: the
 * world the dumps give); the SVG checked and its rows counted. */
static tr_rank *two_dumps(int world, long rows) {
  gen g = {.fail_rank = -1, .tpname = "tp"};
  int have[] = {0, 1};
  tr_rank *rs = ranks_written(&g, have, 2, world);
  check_written("svg");
  cr_expect_eq(kv_long("rows"), rows);
  return rs;
}

Test(trace_draw, world_from_the_dumps) {
  tr_rank *rs = two_dumps(0, WORLD);
  cr_expect_str_eq(kv("nodump"), "2,3");
  check_written("chrome");
  cr_expect_str_eq(kv("pids"), "0,1,2,3");
  tr_ranks_free(rs, 2);
}

/* A world far larger than its dumps (issue 45, item 14): a long run of
 * ranks without a dump is one row and one process, so that the drawing
 * grows with the dumps, not with WORLD; a short run keeps a row a rank. */
Test(trace_draw, long_run_without_dumps_is_one_row) {
  tr_rank *rs = two_dumps(40, 40);
  char *svg = slurp("t.svg");
  cr_expect(strstr(svg, ">ranks 2 to 39</text>") && strstr(svg, "data-last=\"39\""));
  cr_expect_eq(strstr(svg, "id=\"rank-3\""), NULL, "rank 3 is in the run's row");
  check_written("chrome");
  cr_expect_str_eq(kv("pids"), "0,1,2");
  char *js = slurp("t.json");
  cr_expect(strstr(js, "\"name\":\"ranks 2 to 39 (no dump)\""));
  tr_ranks_free(rs, 2);
}

Test(trace_draw, hang_is_marked) {
  gen g = {.fail_rank = 2, .tpname = "tp"};
  int have[] = {0, 1, 2, 3};
  tr_rank *rs = ranks_written(&g, have, 4, WORLD);
  check_written("svg");
  cr_expect_eq(kv_long("rows"), WORLD);
  cr_expect_str_eq(kv("nodump"), "");
  cr_expect_eq(kv_long("bad"), WORLD, "the failed op and the three pending ones");
  cr_expect_eq(kv_long("failure"), 1);
  char *svg = slurp("t.svg");
  cr_expect(strstr(svg, "first failure: MPG_ERR_TIMEOUT on world rank 2, barrier #3 on world[0]"),
            "no failure label");
  check_written("chrome");
  cr_expect_eq(kv_long("instants"), 1);
  char *js = slurp("t.json");
  cr_expect(strstr(js, "\"failure: MPG_ERR_TIMEOUT on world rank 2, barrier #3 on world[0]\""));
  cr_expect(strstr(js, "\"status\":\"pending\""));
  tr_ranks_free(rs, 4);
}

Test(trace_draw, error_dump_without_failed_op_marks_the_dump) {
  gen g = {.fail_rank = -1, .tpname = "tp"};
  int have[] = {1};
  tr_rank *rs = make_ranks(have, 1, &g);
  strcpy(rs[0].reason, "MPG_ERR_ABORTED");
  write_both(rs, 1, WORLD);
  check_written("svg");
  cr_expect_eq(kv_long("failure"), 1);
  cr_expect(strstr(slurp("t.svg"), "first failure: MPG_ERR_ABORTED dump of world rank 1, last "
                                   "operation barrier #3 on world[0] (ok)"));
  tr_ranks_free(rs, 1);
}

Test(trace_draw, names_are_escaped) {
  /* < & > " ' need no percent-encoding; %FF is not UTF-8, %01 not XML. */
  gen g = {.fail_rank = -1, .tpname = "t<&>\"'%FF%01%C3%A9p"};
  int have[] = {0, 1, 2, 3};
  tr_rank *rs = make_ranks(have, 4, &g);
  cr_assert_str_eq(rs[0].groups[0].name, "t<&>\"'\xff\x01\xc3\xa9p");
  write_both(rs, 4, WORLD);
  check_written("svg");
  cr_expect_eq(kv_long("rows"), WORLD);
  cr_expect(strstr(kv("groups"), "t<&>\"'\xef\xbf\xbd\xef\xbf\xbd\xc3\xa9p"), "legend: %s",
            kv("groups"));
  check_written("chrome");
  cr_expect(strstr(kv("cats"), "t<&>\"'\xef\xbf\xbd\x01\xc3\xa9p"), "cats: %s", kv("cats"));
  tr_ranks_free(rs, 4);
}

Test(trace_draw, no_dumps_and_bad_paths) {
  char p[300], err[512] = "";
  snprintf(p, sizeof p, "%s/empty.svg", dir);
  cr_assert_eq(tr_write_svg(NULL, 0, 2, p, err, sizeof err), 0, "%s", err);
  check("svg", p);
  cr_expect_eq(kv_long("rows"), 2);
  cr_expect_str_eq(kv("nodump"), "0,1");
  snprintf(p, sizeof p, "%s/empty.json", dir);
  cr_assert_eq(tr_write_chrome(NULL, 0, 2, p, err, sizeof err), 0, "%s", err);
  check("chrome", p);
  cr_expect_str_eq(kv("pids"), "0,1");
  snprintf(p, sizeof p, "%s/no/such/dir/t.svg", dir);
  cr_expect_eq(tr_write_svg(NULL, 0, 2, p, err, sizeof err), -1);
  cr_expect(strstr(err, p) && strstr(err, "No such file"), "%s", err);
  cr_expect_eq(tr_write_chrome(NULL, 0, 2, p, err, sizeof err), -1);
  cr_expect(strstr(err, p), "%s", err);
  /* Two dumps of one rank cannot be drawn. */
  gen g = {.fail_rank = -1, .tpname = "tp"};
  int have[] = {1, 1};
  tr_rank *rs = make_ranks(have, 2, &g);
  snprintf(p, sizeof p, "%s/dup.svg", dir);
  cr_expect_eq(tr_write_svg(rs, 2, WORLD, p, err, sizeof err), -1);
  cr_expect(strstr(err, "two dumps of rank 1"), "%s", err);
  tr_ranks_free(rs, 2);
}

/* Issue 46, item 5: the dashed line's label says what docs/trace.md says:
 * the status, the world rank and the operation; for a dump written for a
 * fault without a failed operation (a desync found by the counts), the
 * dump's reason, the rank and the operation it was in. */
Test(trace_draw, fault_line_label_names_status_rank_and_operation) {
  char p[300];
  snprintf(p, sizeof p, "%s/t.svg", dir);
  /* A failed operation. */
  gen g = {.fail_rank = 2, .tpname = "tp"};
  int have[] = {0, 1, 2, 3};
  tr_rank *rs = ranks_written(&g, have, 4, WORLD);
  check("svg", p);
  cr_expect(!strncmp(kv("failure_label"), "first failure: MPG_ERR_TIMEOUT on world rank 2, "
                                          "barrier #3 on world[0] at ", 69),
            "%s", kv("failure_label"));
  tr_ranks_free(rs, 4);
  /* No failed operation: rank 1 dumped for MPG_ERR_STATE in its barrier. */
  gen h = {.fail_rank = -1, .tpname = "tp", .pend = 1 + 1};
  rs = make_ranks(have, 4, &h);
  write_both(rs, 4, WORLD);
  check("svg", p);
  cr_expect_eq(kv_long("failure"), 1);
  const char *want = "first failure: MPG_ERR_STATE dump of world rank 1, pending barrier #3 "
                     "on world[0] at ";
  cr_expect(!strncmp(kv("failure_label"), want, strlen(want)), "%s", kv("failure_label"));
  char *js = slurp("t.json");
  cr_expect(strstr(js, "\"failure: MPG_ERR_STATE dump of world rank 1, pending barrier #3 on "
                       "world[0]\""),
            "the Chrome trace's instant event");
  tr_ranks_free(rs, 4);
}

/* Issue 46, item 5: the culprit's row is marked and its missing operation
 * is drawn on its row where its peers have it (a skip: the analyzer's
 * item, filled here by hand, names tp[0] #2; the peers' times come from
 * their dumps), and an operation it issued differently (twice the count,
 * failed as it started: zero-width) is drawn at least 4 px wide with its
 * own mark, beside a box at its peers' time. */
Test(trace_draw, culprit_row_and_missing_operation_are_drawn) {
  gen g = {.fail_rank = -1, .tpname = "tp", .other = 3 + 1};
  int have[] = {0, 1, 2, 3};
  tr_rank *rs = make_ranks(have, 4, &g);
  ta_item items[2];
  memset(items, 0, sizeof items);
  items[0] = (ta_item){.rank = 1,
                       .text = "culprit: world rank 1: skipped all_reduce #2 on tp[0]",
                       .how = TA_SKIPPED,
                       .gseq = 2,
                       .kind = "all_reduce"};
  snprintf(items[0].group, sizeof items[0].group, "tp[0]");
  /* Rank 3's tp #3 against rank 2's: the peers' times given. */
  const tr_op *peer = NULL;
  for (int k = 0; k < rs[2].nops; k++)
    if (rs[2].ops[k].group == 0 && rs[2].ops[k].gseq == 3) peer = &rs[2].ops[k];
  cr_assert_not_null(peer);
  items[1] = (ta_item){.rank = 3,
                       .text = "culprit: world rank 3: all_reduce #3 on tp[1] with another count",
                       .how = TA_DIFFERS,
                       .gseq = 3,
                       .kind = "all_reduce",
                       .peers_issue_ns = peer->issue_ns,
                       .peers_end_ns = peer->end_ns};
  snprintf(items[1].group, sizeof items[1].group, "tp[1]");
  tr_marks marks = {.culprits = items, .nculprits = 2};
  char p[300], js[300], err[512] = "";
  snprintf(p, sizeof p, "%s/t.svg", dir);
  snprintf(js, sizeof js, "%s/t.json", dir);
  cr_assert_eq(tr_write_svg_marked(rs, 4, WORLD, &marks, p, err, sizeof err), 0, "%s", err);
  cr_assert_eq(tr_write_chrome_marked(rs, 4, WORLD, &marks, js, err, sizeof err), 0, "%s", err);
  check("svg", p);
  cr_expect_str_eq(kv("culprits"), "1,3");
  cr_expect_str_eq(kv("evidence"),
                   "1:missing:missing: all_reduce #2 on tp[0]:covers;"
                   "3:differs:differs: all_reduce #3 on tp[1] (f32 x 8192):covers");
  const char *d = kv("differs");
  cr_expect(!strncmp(d, "3:", 2) && strtod(d + 2, NULL) >= 4.0, "differs=%s", d);
  char *svg = slurp("t.svg");
  cr_expect(strstr(svg, "rank 1<tspan class=\"row-tag\" dx=\"4\" font-size=\"9\">culprit</tspan>"),
            "the culprit's row label");
  cr_expect(strstr(svg, "culprit: world rank 1: skipped all_reduce #2 on tp[0]</title>"),
            "the culprit's line as the band's tooltip");
  check("chrome", js);
  char *j = slurp("t.json");
  cr_expect(strstr(j, "\"name\":\"rank 1 (culprit)\"") &&
            strstr(j, "\"name\":\"rank 3 (culprit)\""));
  cr_expect(strstr(j, "\"name\":\"missing: all_reduce #2 on tp[0]\",\"cat\":\"culprit\""));
  /* The same dumps without marks: nothing marked, every row as before. */
  cr_assert_eq(tr_write_svg(rs, 4, WORLD, p, err, sizeof err), 0, "%s", err);
  check("svg", p);
  cr_expect_str_eq(kv("culprits"), "");
  cr_expect_str_eq(kv("evidence"), "");
  tr_ranks_free(rs, 4);
}

/* The same through `meshpg trace --svg` (the analyzer's own culprit, with
 * its evidence): rank 3's tp all-reduce #3 has twice the count of every
 * other tp all-reduce #3; its row is marked and the operation drawn. */
Test(trace_draw, cli_marks_the_analyzers_culprit) {
  gen g = {.fail_rank = -1, .tpname = "tp", .other = 3 + 1};
  char p[300], args[700];
  for (int r = 0; r < WORLD; r++) {
    snprintf(p, sizeof p, "%s/rank-%d.trace", dir, r);
    FILE *f = fopen(p, "w");
    cr_assert_not_null(f, "%s", p);
    char *s = gen_dump(r, &g);
    fputs(s, f);
    free(s);
    cr_assert_eq(fclose(f), 0);
  }
  static char rep[1 << 16];
  snprintf(args, sizeof args, "'%s' --svg '%s/c.svg'", dir, dir);
  cr_assert_eq(tt_run_cli(args, rep, sizeof rep, NULL), 0, "%s", rep);
  cr_expect(strstr(rep, "culprit: world rank 3: "), "%s", rep);
  snprintf(p, sizeof p, "%s/c.svg", dir);
  check("svg", p);
  cr_expect_str_eq(kv("culprits"), "3", "%s", rep);
  cr_expect_str_eq(kv("evidence"), "3:differs:differs: all_reduce #3 on tp[1] (f32 x 8192):covers",
                   "%s", rep);
  cr_expect(!strncmp(kv("differs"), "3:", 2), "differs=%s", kv("differs"));
}
