/* The GPT example's flight recorder (gpt --trace DIR, docs/trace.md): a
 * healthy 8-rank run of pp=2,dp=2,tp=2 leaves one dump per rank, read
 * back with tools/trace_read.c, and DIR/trace.svg and DIR/trace.json,
 * parsed by tests/trace/draw/check_draw.py (XML, JSON): 8 rows and 8
 * processes, operations of the tp, pp and dp_cp groups (the sync's buckets
 * among them), and no failure marked. */
#define _XOPEN_SOURCE 700
#include <criterion/criterion.h>

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "trace_read.h"
#include "../support/run_util.h"

enum { WORLD = 8 };

static char dir[256];

#define DRAW_TMP_NAME "gpt_trace"
#include "../trace/draw/draw_check.h"

/* The value of the line "key=value" in out. */
static const char *kv(const char *key) {
  static char val[1024];
  size_t kl = strlen(key);
  for (const char *l = out; *l;) {
    size_t n = strcspn(l, "\n");
    if (n > kl && !strncmp(l, key, kl) && l[kl] == '=') {
      snprintf(val, sizeof val, "%.*s", (int)(n - kl - 1), l + kl + 1);
      return val;
    }
    l += n + (l[n] == '\n');
  }
  cr_assert_fail("no %s= in:\n%s", key, out);
  return NULL;
}

/* Is name one of the comma-separated list? */
static int in_list(const char *list, const char *name) {
  size_t n = strlen(name);
  for (const char *p = list; p && *p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL)
    if (!strncmp(p, name, n) && (p[n] == ',' || p[n] == '\0')) return 1;
  return 0;
}

TestSuite(gpt_trace, .init = setup, .fini = teardown);

Test(gpt_trace, healthy_run_draws_eight_rows, .timeout = 300) {
  char cmd[2048], tr[300], p[700];
  snprintf(tr, sizeof tr, "%s/tr", dir);
  snprintf(cmd, sizeof cmd, "'%s' --mesh pp=2,dp=2,tp=2 --steps 3 --trace '%s'",
           env_program("MESHPG_GPT_EXE"), tr);
  cr_assert_eq(run(cmd, NULL), 0, "%s\n%s", cmd, out);
  cr_expect(strstr(out, "\nPASS\n"), "%s", out);
  snprintf(p, sizeof p, "wrote %s/trace.svg (8 of 8 ranks) and %s/trace.json", tr, tr);
  cr_expect(strstr(out, p), "no '%s' in:\n%s", p, out);
  /* The straggler report's verdict (tools/trace_stragglers.c, issue 46). */
  cr_expect(strstr(out, "\ntrace: no straggler: ") ||
                strstr(out, "\ntrace: stragglers: world rank "),
            "no straggler verdict in:\n%s", out);

  /* The dumps: one per rank, of one job, every operation complete. */
  tr_rank *rs = NULL;
  int n = 0, buckets = 0;
  char err[600] = "";
  cr_assert_eq(tr_read_dir(tr, &rs, &n, err, sizeof err), 0, "%s", err);
  cr_assert_eq(n, WORLD);
  for (int i = 0; i < n; i++) {
    cr_expect_eq(rs[i].rank, i);
    cr_expect_eq(rs[i].world, WORLD);
    /* gpt dumps on request, then meets the others in a barrier: the dump
     * of mpg_ctx_destroy (reason end) replaces it (issue 46, item 2). */
    cr_expect_str_eq(rs[i].reason, "end");
    cr_expect_str_eq(rs[i].job, rs[0].job);
    cr_expect_str_eq(rs[i].backend, "thread");
    cr_expect_gt(rs[i].nops, 10, "rank %d recorded %d operations", i, rs[i].nops);
    cr_expect_eq(rs[i].total, (uint64_t)rs[i].nops, "rank %d: the ring overwrote", i);
    for (int k = 0; k < rs[i].nops; k++) {
      cr_expect_str_eq(rs[i].ops[k].status, "ok", "rank %d op %d", i, k);
      if (rs[i].ops[k].bucket >= 0 && rs[i].ops[k].first[0]) buckets++;
    }
  }
  cr_expect_gt(buckets, 0, "no sync bucket with its parameter names");
  tr_ranks_free(rs, n);

  snprintf(p, sizeof p, "%s/trace.svg", tr);
  check("svg", p);
  cr_expect_eq(atoi(kv("rows")), WORLD);
  cr_expect_str_eq(kv("nodump"), "");
  cr_expect_eq(atoi(kv("failure")), 0);
  cr_expect_eq(atoi(kv("bad")), 0);
  cr_expect_gt(atoi(kv("ops")), WORLD * 10);
  const char *g = kv("op_groups");
  cr_expect(in_list(g, "tp") && in_list(g, "pp") && in_list(g, "dp_cp"), "op groups: %s", g);

  snprintf(p, sizeof p, "%s/trace.json", tr);
  check("chrome", p);
  cr_expect_str_eq(kv("pids"), "0,1,2,3,4,5,6,7");
  cr_expect_eq(atoi(kv("instants")), 0);
  g = kv("cats");
  cr_expect(in_list(g, "tp") && in_list(g, "pp") && in_list(g, "dp_cp"), "categories: %s", g);
}

Test(gpt_trace, bad_directory_is_refused) {
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "'%s' --steps 1 --trace '%s/no/such/dir'",
           env_program("MESHPG_GPT_EXE"), dir);
  cr_expect_eq(run(cmd, NULL), 2, "%s", out);
  cr_expect(strstr(out, "gpt: --trace ") && strstr(out, "No such file or directory"), "%s", out);
}
