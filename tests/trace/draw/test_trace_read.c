/* The flight recorder's dump reader (tools/trace_read.c) against
 * docs/trace.md, "The dump format (version 1)": a valid dump read field by
 * field; every proper prefix of it refused as truncated; one broken line at
 * a time, each refused with a message naming the line, the field and the
 * value; unknown records skipped; and tr_read_dir's rules (rank-R.trace
 * only, sorted, the file's rank equal to its name's, one dump per rank). */
#define _XOPEN_SOURCE 700
#include <criterion/criterion.h>

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "trace_read.h"

/* Rank 1 of pp=2,dp=2: 2 groups, 5 operations, the last pending.  Line
 * numbers (1-based) are the index + 1. */
static const char *const base[] = {
    "meshpg-trace 1",
    "rank 1 4",
    "process node%2D7 4242",
    "backend thread",
    "mesh pp=2,dp=2",
    "job 0123456789abcdef",
    "clock 1700000000500000000",
    "reason request -",
    "ring 2048 5",
    "group 0 dp 1 0 2 1,3",
    "group 1 pp 0 1 2 0,1",
    "op 0 1 1 recv f32 1024 0 -1 -1 1700000000000000000 1700000000001000000 "
    "1700000000003000000 ok - -",
    "op 1 0 1 all_reduce f32 4096 -1 0 0 1700000000010000000 1700000000011000000 "
    "1700000000020000000 ok layers.1.w%20x layers.0.b",
    "op 2 0 2 broadcast bf16 16 3 0 -1 1700000000030000000 1700000000030000000 "
    "1700000000031000000 ok - -",
    "op 3 1 1 send f32 1024 0 0 -1 1700000000040000000 1700000000040000000 "
    "1700000000042000000 ok - -",
    "op 4 0 3 barrier - 0 -1 0 -1 1700000000050000000 1700000000050000000 0 pending - %2D",
    "end 5",
};
#define NBASE ((int)(sizeof base / sizeof base[0]))

/* The base dump with line `line` (1-based; 0: none) replaced by `with`
 * (NULL: deleted; it may hold several lines). */
static char *dump_with(int line, const char *with) {
  size_t cap = 4096 + (with ? strlen(with) : 0), n = 0;
  char *s = malloc(cap);
  cr_assert_not_null(s);
  for (int i = 0; i < NBASE; i++) {
    const char *l = i + 1 == line ? with : base[i];
    if (!l) continue;
    n += (size_t)snprintf(s + n, cap - n, "%s\n", l);
  }
  return s;
}

static int parse_str(const char *s, tr_rank *r, char *err, size_t n) {
  return tr_parse(s, strlen(s), r, err, n);
}

Test(trace_read, valid_dump_field_by_field) {
  char *s = dump_with(0, NULL), err[512] = "";
  tr_rank r;
  cr_assert_eq(parse_str(s, &r, err, sizeof err), 0, "%s", err);
  cr_expect_eq(r.rank, 1);
  cr_expect_eq(r.world, 4);
  cr_expect_str_eq(r.host, "node-7");
  cr_expect_eq(r.pid, 4242);
  cr_expect_str_eq(r.backend, "thread");
  cr_expect_str_eq(r.mesh, "pp=2,dp=2");
  cr_expect_str_eq(r.job, "0123456789abcdef");
  cr_expect_eq(r.dump_ns, 1700000000500000000LL);
  cr_expect_str_eq(r.reason, "request");
  cr_expect_str_eq(r.message, "");
  cr_expect_eq(r.capacity, 2048);
  cr_expect_eq(r.total, 5);
  cr_assert_eq(r.ngroups, 2);
  cr_expect_str_eq(r.groups[0].name, "dp");
  cr_expect_eq(r.groups[0].index, 1);
  cr_expect_eq(r.groups[0].position, 0);
  cr_expect_eq(r.groups[0].size, 2);
  cr_expect(r.groups[0].ranks[0] == 1 && r.groups[0].ranks[1] == 3);
  cr_expect(r.groups[1].position == 1 && r.groups[1].ranks[1] == 1);
  cr_assert_eq(r.nops, 5);
  const tr_op *o = &r.ops[1];
  cr_expect(o->seq == 1 && o->group == 0 && o->gseq == 1);
  cr_expect_str_eq(o->kind, "all_reduce");
  cr_expect_str_eq(o->dtype, "f32");
  cr_expect(o->count == 4096 && o->peer == -1 && o->step == 0 && o->bucket == 0);
  cr_expect(o->issue_ns == 1700000000010000000LL && o->start_ns == 1700000000011000000LL &&
            o->end_ns == 1700000000020000000LL);
  cr_expect_str_eq(o->status, "ok");
  cr_expect_str_eq(o->first, "layers.1.w x");
  cr_expect_str_eq(o->last, "layers.0.b");
  cr_expect_eq(r.ops[0].peer, 0);
  cr_expect_eq(r.ops[0].step, -1);
  cr_expect_str_eq(r.ops[0].first, "");
  cr_expect_str_eq(r.ops[4].dtype, "");
  cr_expect_str_eq(r.ops[4].status, "pending");
  cr_expect_eq(r.ops[4].end_ns, 0);
  cr_expect_str_eq(r.ops[4].last, "-");
  tr_rank_free(&r);
  cr_expect_null(r.ops);
  free(s);
}

Test(trace_read, error_dump_with_message_and_unknown_records) {
  char *s = dump_with(8, "reason MPG_ERR_TIMEOUT all_reduce%20on%20dp%5B1%5D:%20timed%20out");
  /* A later version's records between ring and end are skipped: the dump
   * rebuilt as head, "future ...", the ring, "note ...", end, every piece
   * bounded by the room the buffer has. */
  char *ring = strstr(s, "ring 2048 5\n");
  cr_assert_not_null(ring);
  ring += strlen("ring 2048 5\n");
  char *end = strstr(ring, "end 5\n");
  cr_assert_not_null(end);
  size_t cap = strlen(s) + 64;
  char *t = malloc(cap);
  cr_assert_not_null(t);
  int n = snprintf(t, cap, "%.*sfuture 1 2 3 x%%zz\n%.*snote  -\t\n%s", (int)(ring - s), s,
                   (int)(end - ring), ring, end);
  cr_assert(n > 0 && (size_t)n < cap, "the rebuilt dump needs %d bytes of %zu", n, cap);
  char err[512] = "";
  tr_rank r;
  cr_assert_eq(parse_str(t, &r, err, sizeof err), 0, "%s", err);
  cr_expect_str_eq(r.reason, "MPG_ERR_TIMEOUT");
  cr_expect_str_eq(r.message, "all_reduce on dp[1]: timed out");
  cr_expect_eq(r.nops, 5);
  tr_rank_free(&r);
  free(s);
  free(t);
}

Test(trace_read, every_proper_prefix_is_refused) {
  char *s = dump_with(0, NULL), err[512];
  size_t len = strlen(s);
  for (size_t k = 0; k < len; k++) {
    tr_rank r;
    err[0] = '\0';
    int rc = tr_parse(s, k, &r, err, sizeof err);
    cr_expect_eq(rc, -1, "a prefix of %zu of %zu bytes was accepted", k, len);
    cr_expect(strncmp(err, "line ", 5) == 0, "prefix %zu: message '%s'", k, err);
    tr_rank_free(&r);
  }
  tr_rank r;
  cr_expect_eq(tr_parse(s, 0, &r, err, sizeof err), -1);
  cr_expect(strstr(err, "truncated"), "%s", err);
  tr_rank_free(&r);
  cr_expect_eq(tr_parse(s, len - 1, &r, err, sizeof err), -1);
  cr_expect(strstr(err, "line 17") && strstr(err, "truncated"), "%s", err);
  tr_rank_free(&r);
  cr_expect_eq(tr_parse(s, len - 6, &r, err, sizeof err), -1); /* no end line */
  cr_expect(strstr(err, "'end' line (truncated)"), "%s", err);
  tr_rank_free(&r);
  free(s);
}

/* One broken line: the message must hold `want`. */
typedef struct bad_case {
  int line;
  const char *with, *want;
} bad_case;

static const bad_case cases[] = {
    {1, "meshpg-trace 2", "line 1: meshpg-trace: field version: value '2' is newer"},
    {1, "meshpg-trace 0", "line 1: meshpg-trace: field version: value '0' is out of range"},
    {1, "meshpg-trace x", "field version: value 'x' is not a decimal integer"},
    {1, "PK\x03\x04", "line 1: not a meshpg trace"},
    {1, "meshpg-trace 1 1", "line 1: meshpg-trace: 2 fields, expected 1"},
    {2, "rank 4 4", "line 2: rank: field R: value '4' is out of range [0, 3]"},
    {2, "rank 1 0", "line 2: rank: field WORLD: value '0'"},
    {2, "rank -1 4", "field R: value '-1' is out of range"},
    {2, "rank 1 99999999999999999999", "field WORLD: value '99999999999999999999'"},
    {2, "rank 1", "line 2: rank: 1 fields, expected 2"},
    {2, "rank  1 4", "line 2: field 1 is empty"},
    {2, "rank 1 4 ", "line 2: field 3 is empty"},
    {2, "rank 1 4\r", "field WORLD: value '4\\x0D' is not a decimal integer"},
    {2, "process node 1", "line 2: expected the 'rank' line, got 'process'"},
    {3, "process node%2 4242", "line 3: process: field HOST: value 'node%2' has a bad percent escape"},
    {3, "process node%zz 4242", "field HOST: value 'node%zz' has a bad percent escape"},
    {3, "process node%2d 4242", "field HOST: value 'node%2d' has a bad percent escape"},
    {3, "process node%00 4242", "field HOST: value 'node%00' encodes a NUL byte"},
    {3, "process n\x01 4242", "field HOST: value 'n\\x01' has a byte that must be percent-encoded"},
    {3, "process node -1", "line 3: process: field PID: value '-1'"},
    {4, "backend -", "line 4: backend: field NAME: value '-' is empty"},
    {4, "backend threadthreadthread", "field NAME: value 'threadthreadthread' is longer than 15"},
    {6, "job 0123", "line 6: job: field JOB: value '0123' is not 16 hex digits"},
    {6, "job 0123456789abcdeg", "field JOB: value '0123456789abcdeg' is not 16 hex digits"},
    {7, "clock -5", "line 7: clock: field DUMP_NS: value '-5' is out of range"},
    {8, "reason timeout -", "line 8: reason: field STATUS: value 'timeout' is not a status name"},
    {9, "ring 2048", "line 9: ring: 1 fields, expected 2"},
    {9, "ring 2048 18446744073709551616", "field TOTAL: value '18446744073709551616' is out of range"},
    {9, "ring 4 5", "line 16: op: more op lines than the ring's CAPACITY 4"},
    {9, "ring 2048 4", "line 16: op: field SEQ: value '4' is not below the ring's TOTAL"},
    {9, "mesh pp=2", "line 9: expected the 'ring' line, got 'mesh'"},
    {10, "group 1 dp 1 0 2 1,3", "line 10: group: field GID: value '1' is out of range [0, 0]"},
    {10, "group 0 dp 1 0 2 1,3,5", "line 10: group: field RANKS: value '1,3,5' lists 3 ranks, SIZE is 2"},
    {10, "group 0 dp 1 0 2 1,9", "field RANKS: value '9' is out of range [0, 3]"},
    {10, "group 0 dp 1 0 2 1,", "field RANKS: value '' is not a decimal integer"},
    {10, "group 0 dp 1 0 2 3,1", "field RANKS: value '3,1' has rank 3 at POSITION 0, not this rank 1"},
    {10, "group 0 dp 1 0 2 1,1", "field RANKS: value '1,1' lists a rank twice"},
    {10, "group 0 dp 1 2 2 1,3", "field POSITION: value '2' is out of range [0, 1]"},
    {10, "group 0 dp 1 0 5 1,3,0,2,1", "field SIZE: value '5' is out of range [1, 4]"},
    {10, "group 0 - 1 0 2 1,3", "line 10: group: field NAME: value '-' is empty"},
    {10, "group 0 dp -1 0 2 1,3", "field INDEX: value '-1' is out of range"},
    {11, NULL, "line 11: op: field GID: value '1' is out of range [0, 0]"},
    {12, "op 0 2 1 recv f32 1024 0 -1 -1 1 2 3 ok - -", "line 12: op: field GID: value '2' is out of range [0, 1]"},
    {12, "op 0 1 0 recv f32 1024 0 -1 -1 1 2 3 ok - -", "line 12: op: field GSEQ: value '0' is 0"},
    {12, "op 0 1 1 gather f32 1024 0 -1 -1 1 2 3 ok - -", "field KIND: value 'gather' is not an operation kind"},
    {12, "op 0 1 1 recv f8 1024 0 -1 -1 1 2 3 ok - -", "field DTYPE: value 'f8' is not a dtype"},
    {12, "op 0 1 1 recv f32 -1 0 -1 -1 1 2 3 ok - -", "field COUNT: value '-1' is not an unsigned"},
    {12, "op 0 1 1 recv f32 1024 -1 -1 -1 1 2 3 ok - -", "field PEER: value '-1' is out of range [0, 3]"},
    {12, "op 0 1 1 recv f32 1024 2 -1 -1 1 2 3 ok - -", "field PEER: value '2' is not a member"},
    {12, "op 0 1 1 all_reduce f32 1024 0 -1 -1 1 2 3 ok - -", "field PEER: value '0' is out of range [-1, -1]"},
    {12, "op 0 1 1 recv f32 1024 0 -2 -1 1 2 3 ok - -", "field STEP: value '-2' is out of range"},
    {12, "op 0 1 1 recv f32 1024 0 -1 -2 1 2 3 ok - -", "field BUCKET: value '-2' is out of range"},
    {12, "op 0 1 1 recv f32 1024 0 -1 -1 -1 2 3 ok - -", "field ISSUE_NS: value '-1'"},
    {12, "op 0 1 1 recv f32 1024 0 -1 -1 1 x 3 ok - -", "field START_NS: value 'x'"},
    {12, "op 0 1 1 recv f32 1024 0 -1 -1 1 2 3 pending - -", "field END_NS: value '3' is set on a pending op"},
    {12, "op 0 1 1 recv f32 1024 0 -1 -1 1 2 0 ok - -", "field END_NS: value '0' is 0 on an op with STATUS ok"},
    {12, "op 0 1 1 recv f32 1024 0 -1 -1 1 2 3 failed - -", "field STATUS: value 'failed' is not 'ok', 'pending'"},
    {12, "op 0 1 1 recv f32 1024 0 -1 -1 1 2 3 MPG_err - -", "field STATUS: value 'MPG_err' is not a status name"},
    {12, "op 0 1 1 recv f32 1024 0 -1 -1 1 2 3 ok a%4 -", "field FIRST: value 'a%4' has a bad percent escape"},
    {12, "op 0 1 1 recv f32 1024 0 -1 -1 1 2 3 ok - b%", "field LAST: value 'b%' has a bad percent escape"},
    {12, "op 0 1 1 recv f32 1024 0 -1 -1 1 2 3 ok -", "line 12: op: 14 fields, expected 15"},
    {12, "op 0 1 1 recv f32 1024 0 -1 -1 1 2 3 ok - - x", "line 12: op: 16 fields, expected 15"},
    {12, "op 0 1 1 recv f32 1024 0 -1 -1 1 2 3 ok - - 1 2 3", "line 12: more than 16 fields"},
    {14, "op 0 0 2 broadcast bf16 16 3 0 -1 1 1 2 ok - -", "line 14: op: field SEQ: value '0' is not above"},
    {14, "group 2 tp 0 0 2 1,2", "line 14: group: a group line after an op line"},
    {17, "end 4", "line 17: end: field NOPS: value '4' does not match the 5 op lines"},
    {17, "end 5\nend 5", "line 18: a line after 'end'"},
    {12, "", "line 12: an empty line"},
    {17, " end 5", "line 17: the line starts with a space"},
    {17, "End 5", "line 17: keyword 'End' is not [a-z0-9_-]+"},
};

Test(trace_read, broken_lines_are_named) {
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    char *s = dump_with(cases[c].line, cases[c].with), err[512] = "";
    tr_rank r;
    int rc = tr_parse(s, strlen(s), &r, err, sizeof err);
    cr_expect_eq(rc, -1, "case %zu (line %d '%s') was accepted", c, cases[c].line,
                 cases[c].with ? cases[c].with : "(deleted)");
    cr_expect(strstr(err, cases[c].want) != NULL, "case %zu: got '%s', want '%s'", c, err,
              cases[c].want);
    tr_rank_free(&r);
    free(s);
  }
}

Test(trace_read, long_names_and_small_error_buffers) {
  /* The limit the writer shares (MPG__TRACE_NAME_MAX, 255 bytes). */
  char name[300], line[400];
  memset(name, 'a', MPG__TRACE_NAME_MAX);
  name[MPG__TRACE_NAME_MAX] = '\0';
  snprintf(line, sizeof line, "group 0 %s 1 0 2 1,3", name);
  char *s = dump_with(10, line), err[512] = "";
  tr_rank r;
  cr_assert_eq(parse_str(s, &r, err, sizeof err), 0, "%s", err);
  cr_expect_eq(strlen(r.groups[0].name), MPG__TRACE_NAME_MAX);
  tr_rank_free(&r);
  free(s);
  /* 256 bytes do not fit a name; a message is cut to the buffer given. */
  snprintf(line, sizeof line, "group 0 %sa 1 0 2 1,3", name);
  s = dump_with(10, line);
  cr_expect_eq(parse_str(s, &r, err, sizeof err), -1);
  cr_expect(strstr(err, "line 10: group: field NAME") && strstr(err, "...' is longer than 255"),
            "%s", err);
  tr_rank_free(&r);
  char tiny[8];
  cr_expect_eq(parse_str(s, &r, tiny, sizeof tiny), -1);
  cr_expect_str_eq(tiny, "line 10");
  tr_rank_free(&r);
  cr_expect_eq(parse_str(s, &r, NULL, 0), -1);
  tr_rank_free(&r);
  free(s);
}

/* ---- files and directories ------------------------------------------------ */

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *f) {
  (void)sb, (void)flag, (void)f;
  return remove(p);
}

static void make_dir(char *dir, size_t n) {
  const char *tmp = getenv("TMPDIR");
  snprintf(dir, n, "%s/trace_read.XXXXXX", tmp && *tmp ? tmp : "/tmp");
  cr_assert_not_null(mkdtemp(dir));
}

static void put_file(const char *dir, const char *name, const char *text) {
  char p[512];
  snprintf(p, sizeof p, "%s/%s", dir, name);
  FILE *f = fopen(p, "w");
  cr_assert_not_null(f, "%s", p);
  fputs(text, f);
  cr_assert_eq(fclose(f), 0);
}

/* The base dump as rank r of world 4 (its groups rebuilt around r). */
static char *dump_of_rank(int r) {
  char l2[32], l10[64], l11[64];
  int dp_peer = r ^ 2, pp_peer = r ^ 1;
  snprintf(l2, sizeof l2, "rank %d 4", r);
  snprintf(l10, sizeof l10, "group 0 dp %d 0 2 %d,%d", r & 1, r, dp_peer);
  snprintf(l11, sizeof l11, "group 1 pp %d 0 2 %d,%d", r >> 1, r, pp_peer);
  size_t cap = 4096, n = 0;
  char *s = malloc(cap);
  cr_assert_not_null(s);
  for (int i = 0; i < 11; i++)
    n += (size_t)snprintf(s + n, cap - n, "%s\n", i == 1 ? l2 : i == 9 ? l10 : i == 10 ? l11 : base[i]);
  n += (size_t)snprintf(s + n, cap - n,
                        "op 0 0 1 all_reduce f32 8 -1 0 0 10 11 12 ok - -\n"
                        "op 1 1 1 send f32 8 %d 0 -1 20 20 25 ok - -\nend 2\n",
                        pp_peer);
  return s;
}

Test(trace_read, read_dir_sorted_ignoring_other_files) {
  char dir[256], err[512] = "";
  make_dir(dir, sizeof dir);
  int order[] = {3, 0, 2};
  for (int k = 0; k < 3; k++) {
    char name[32], *s = dump_of_rank(order[k]);
    snprintf(name, sizeof name, "rank-%d.trace", order[k]);
    put_file(dir, name, s);
    free(s);
  }
  put_file(dir, ".rank-1.trace.tmp", "meshpg-trace 1\nrank 1");
  put_file(dir, "rank-1.trace.bak", "junk");
  put_file(dir, "rank-x.trace", "junk");
  put_file(dir, "trace.svg", "<svg/>");
  tr_rank *rs = NULL;
  int n = -1;
  cr_assert_eq(tr_read_dir(dir, &rs, &n, err, sizeof err), 0, "%s", err);
  cr_assert_eq(n, 3);
  cr_expect(rs[0].rank == 0 && rs[1].rank == 2 && rs[2].rank == 3);
  cr_expect(rs[2].nops == 2 && rs[2].ops[1].peer == 2);
  tr_ranks_free(rs, n);
  /* A broken dump is an error naming its file and line. */
  put_file(dir, "rank-1.trace", "meshpg-trace 1\nrank 1 4\n");
  cr_expect_eq(tr_read_dir(dir, &rs, &n, err, sizeof err), -1);
  cr_expect(strstr(err, "/rank-1.trace: line 3: end of file before the 'process' line"), "%s",
            err);
  cr_expect(rs == NULL && n == 0);
  nftw(dir, rm_one, 8, FTW_DEPTH | FTW_PHYS);
}

Test(trace_read, read_dir_errors) {
  char dir[256], err[512] = "", *s = dump_of_rank(3);
  tr_rank *rs = NULL;
  int n = -1;
  make_dir(dir, sizeof dir);
  cr_expect_eq(tr_read_dir(dir, &rs, &n, err, sizeof err), -1);
  cr_expect(strstr(err, "no rank-R.trace file"), "%s", err);
  /* Two names of one rank. */
  put_file(dir, "rank-3.trace", s);
  put_file(dir, "rank-03.trace", s);
  cr_expect_eq(tr_read_dir(dir, &rs, &n, err, sizeof err), -1);
  cr_expect(strstr(err, "two dumps of rank 3"), "%s", err);
  cr_expect(rs == NULL && n == 0);
  char p[300];
  snprintf(p, sizeof p, "%s/rank-03.trace", dir);
  cr_assert_eq(remove(p), 0);
  /* A file named for another rank. */
  put_file(dir, "rank-2.trace", s);
  cr_expect_eq(tr_read_dir(dir, &rs, &n, err, sizeof err), -1);
  cr_expect(strstr(err, "rank-2.trace: holds the dump of rank 3, not of rank 2"), "%s", err);
  nftw(dir, rm_one, 8, FTW_DEPTH | FTW_PHYS);
  cr_expect_eq(tr_read_dir(dir, &rs, &n, err, sizeof err), -1);
  cr_expect(strstr(err, "No such file or directory"), "%s", err);
  tr_rank r;
  cr_expect_eq(tr_read_file("/nonexistent/rank-0.trace", &r, err, sizeof err), -1);
  cr_expect(strstr(err, "/nonexistent/rank-0.trace: No such file"), "%s", err);
  tr_rank_free(&r);
  free(s);
}

Test(trace_read, read_file_of_many_ops) {
  /* Larger than the reader's first buffer (64 KiB): 2048 ops, the ring
   * full after 10000. */
  size_t cap = 1 << 20, n = 0;
  char *s = malloc(cap), p[300], err[512] = "";
  cr_assert_not_null(s);
  for (int i = 0; i < 8; i++) n += (size_t)snprintf(s + n, cap - n, "%s\n", base[i]);
  n += (size_t)snprintf(s + n, cap - n, "ring 2048 10000\n%s\n%s\n", base[9], base[10]);
  for (int k = 0; k < 2048; k++)
    n += (size_t)snprintf(s + n, cap - n,
                          "op %d 0 %d all_reduce f32 1 -1 %d 0 %d %d %d ok p.%d.w p.%d.b\n",
                          7952 + k, 1 + k, k / 8, 100 + k, 101 + k, 102 + k, k, k);
  n += (size_t)snprintf(s + n, cap - n, "end 2048\n");
  char dir[256];
  make_dir(dir, sizeof dir);
  snprintf(p, sizeof p, "%s/rank-1.trace", dir);
  put_file(dir, "rank-1.trace", s);
  tr_rank r;
  cr_assert_eq(tr_read_file(p, &r, err, sizeof err), 0, "%s", err);
  cr_expect_eq(r.nops, 2048);
  cr_expect_eq(r.ops[2047].seq, 9999);
  cr_expect_str_eq(r.ops[2047].last, "p.2047.b");
  tr_rank_free(&r);
  free(s);
  nftw(dir, rm_one, 8, FTW_DEPTH | FTW_PHYS);
}
