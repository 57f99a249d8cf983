/* Ranks that disagree are told at once, on every rank (issue 29), on the
 * thread backend: mpg_ctx_create's job fingerprint (groups/agree.c), the
 * one rule for the MESHPG_* variables (groups/settings.c) and the bounds on
 * timeouts.  The same over real mpirun processes, where each rank has its
 * own environment: test_agree_mpi.c. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "meshpg.h"
#include "../time_bound.h"
#include "agree_cases.h"

/* Far beyond the promise: a rank that waited it out would show. */
#define TIMEOUT_S 60.0

static double clock_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef struct run_arg {
  const agree_case *c;
  mpg_status status[AGREE_MAX_WORLD];
  char msg[AGREE_MAX_WORLD][1024];
  double secs[AGREE_MAX_WORLD];
  double t0;
} run_arg;

static mpg_status case_main(const mpg_init_opts *opts, void *p) {
  run_arg *a = p;
  int r = opts->rank;
  mpg_mesh *mesh = NULL;
  mpg_status st = agree_build(&a->c->job[a->c->uses_b[r]], opts->world_size, &mesh);
  mpg_ctx *ctx = NULL;
  if (!st) st = mpg_ctx_create(mesh, opts, &ctx);
  a->secs[r] = clock_s() - a->t0;
  a->status[r] = st;
  snprintf(a->msg[r], sizeof a->msg[r], "%s", st ? mpg_last_error() : "");
  if (!st) {
    /* Must not happen; keep the buffers honest if it does: an all-gather
     * over the first dim set sized by this rank's mesh. */
    mpg_group *g = NULL;
    if (!mpg_ctx_group_at(ctx, 0, &g)) {
      int n = mpg_group_size(g);
      int32_t *recv = calloc((size_t)n, sizeof *recv), one = 1;
      (void)mpg_all_gather(g, &one, recv, 1, MPG_I32, NULL, NULL);
      free(recv);
    }
    mpg_ctx_destroy(ctx);
  }
  mpg_mesh_destroy(mesh);
  return st;
}

static void run_case(const agree_case *c, run_arg *a) {
  memset(a, 0, sizeof *a);
  a->c = c;
  a->t0 = clock_s();
  (void)mpg_thread_run(c->world, TIMEOUT_S, case_main, a, NULL);
}

static void describe_case(const agree_case *c, char *buf, size_t n) {
  size_t len = (size_t)snprintf(buf, n, "world %d: A \"%s\" X=%s Y=%s, B \"%s\" X=%s Y=%s, B on",
                                c->world, c->job[0].dims, c->job[0].flatten[0],
                                c->job[0].flatten[1], c->job[1].dims, c->job[1].flatten[0],
                                c->job[1].flatten[1]);
  for (int r = 0; r < c->world && len < n; r++)
    if (c->uses_b[r]) len += (size_t)snprintf(buf + len, n - len, " %d", r);
}

/* The first measurement: 8 thread ranks, dp=2,tp=4 on ranks 0-3
 * and dp=4,tp=2 on ranks 4-7.  Before: every create returned OK, an
 * all-gather over dp wrote 16 bytes past ranks 0 and 1's buffers and the
 * all-reduces summed 1 and 3 for 2 and 4. */
Test(agree, different_meshes_fail_every_rank_at_create) {
  agree_case c;
  memset(&c, 0, sizeof c);
  c.world = 8;
  snprintf(c.job[0].dims, sizeof c.job[0].dims, "dp=2,tp=4");
  snprintf(c.job[1].dims, sizeof c.job[1].dims, "dp=4,tp=2");
  for (int r = 4; r < 8; r++) c.uses_b[r] = 1;
  static run_arg a;
  run_case(&c, &a);
  double bound = tb_bound(1.0, 8);
  for (int r = 0; r < 8; r++) {
    cr_expect_eq(a.status[r], MPG_ERR_STATE, "rank %d: %s: %s", r,
                 mpg_status_name(a.status[r]), a.msg[r]);
    cr_expect(strstr(a.msg[r], "mesh: world ranks 0-3 have \"dp=2,tp=4\", world ranks 4-7 "
                                "have \"dp=4,tp=2\""),
              "rank %d: %s", r, a.msg[r]);
    cr_expect_lt(a.secs[r], bound, "rank %d: %.2f s (bound %.2f s)", r, a.secs[r], bound);
  }
}

/* Same dims, another flattened set: the MPI case on threads. */
Test(agree, different_flattened_sets_fail_every_rank) {
  agree_case c;
  memset(&c, 0, sizeof c);
  c.world = 4;
  snprintf(c.job[0].dims, sizeof c.job[0].dims, "dp=2,tp=2");
  c.job[1] = c.job[0];
  snprintf(c.job[0].flatten[0], sizeof c.job[0].flatten[0], "dp,tp");
  snprintf(c.job[1].flatten[0], sizeof c.job[1].flatten[0], "dp");
  c.uses_b[2] = c.uses_b[3] = 1;
  static run_arg a;
  run_case(&c, &a);
  for (int r = 0; r < 4; r++) {
    cr_expect_eq(a.status[r], MPG_ERR_STATE, "rank %d: %s", r, a.msg[r]);
    cr_expect(strstr(a.msg[r], "flattened dims: world ranks 0-1 have \"X=dp+tp\", world "
                                "ranks 2-3 have \"X=dp\""),
              "rank %d: %s", r, a.msg[r]);
  }
}

/* The property: 100 random pairs of different jobs, random ranks on each
 * side: MPG_ERR_STATE on every rank, 100 of 100, each within the promise
 * (the ASan build of this test shows that nothing is written outside a
 * buffer on the way). */
Test(agree, random_disagreeing_jobs_fail_every_rank, .timeout = 300) {
  static run_arg a;
  double bound = tb_bound(1.0, AGREE_MAX_WORLD);
  int caught = 0;
  for (int i = 0; i < 100; i++) {
    agree_case c;
    agree_make_case(29, i, &c);
    char what[512];
    describe_case(&c, what, sizeof what);
    run_case(&c, &a);
    int all = 1;
    for (int r = 0; r < c.world; r++) {
      all &= a.status[r] == MPG_ERR_STATE;
      cr_expect_eq(a.status[r], MPG_ERR_STATE, "case %d (%s), rank %d: %s: %s", i, what, r,
                   mpg_status_name(a.status[r]), a.msg[r]);
      cr_expect(strstr(a.msg[r], "did not build the same job"), "case %d, rank %d: %s", i, r,
                a.msg[r]);
      cr_expect_lt(a.secs[r], bound, "case %d, rank %d: %.2f s", i, r, a.secs[r]);
    }
    caught += all;
  }
  cr_assert_eq(caught, 100, "%d of 100 disagreeing jobs failed on every rank", caught);
}

/* Jobs that agree still come up (the check costs no false alarm). */
Test(agree, agreeing_jobs_come_up) {
  static run_arg a;
  for (int i = 0; i < 20; i++) {
    agree_case c;
    agree_make_case(7, i, &c);
    memset(c.uses_b, 0, sizeof c.uses_b);
    run_case(&c, &a);
    for (int r = 0; r < c.world; r++)
      cr_expect_eq(a.status[r], MPG_OK, "case %d rank %d: %s", i, r, a.msg[r]);
  }
}

/* ------------------------------------------------------------------ */
/* The variables: one rule, at mpg_ctx_create                          */
/* ------------------------------------------------------------------ */

static mpg_status plain_main(const mpg_init_opts *opts, void *p) {
  (void)p;
  mpg_spec spec = MPG_SPEC_INIT;
  mpg_mesh *mesh = NULL;
  mpg_status st = mpg_spec_init(&spec);
  if (!st) st = mpg_spec_set_mesh(&spec, "dp=-1");
  if (!st) st = mpg_mesh_create(&spec, opts->world_size, &mesh);
  mpg_ctx *ctx = NULL;
  if (!st) st = mpg_ctx_create(mesh, opts, &ctx);
  mpg_ctx_destroy(ctx);
  mpg_mesh_destroy(mesh);
  return st;
}

/* Every variable the library reads, with values outside its documented
 * set: blanks around a good value, words, signs, out of range. */
Test(agree, bad_values_of_every_variable_fail_create) {
  static const struct {
    const char *var, *value;
  } bad[] = {
      {"MESHPG_LOG", "verbose"},           {"MESHPG_LOG", " info"},
      {"MESHPG_LOG", "INFO"},              {"MESHPG_CHECK_ORDER", "yes"},
      {"MESHPG_CHECK_ORDER", "1 "},        {"MESHPG_SHM", " 1"},
      {"MESHPG_SHM", "2"},                 {"MESHPG_THREAD_INBOX_MSGS", "-1"},
      {"MESHPG_THREAD_INBOX_MSGS", "0"},   {"MESHPG_THREAD_INBOX_MSGS", "12k"},
      {"MESHPG_THREAD_INBOX_BYTES", "abc"}, {"MESHPG_THREAD_INBOX_BYTES", "0x10"},
      {"MESHPG_MPI_PROGRESS", "maybe"},    {"MESHPG_MPI_WINDOW", " 2"},
      {"MESHPG_MPI_WINDOW", "9"},          {"MESHPG_MPI_MAX_COUNT", "0"},
      {"MESHPG_MPI_MAX_COUNT", "3000000000"}, {"MESHPG_MPI_PIECE_BYTES", "abc"},
      {"MESHPG_MPI_PIECE_BYTES", "4"},     {"MESHPG_NCCL_PORT", "70000"},
      {"MESHPG_NCCL_PORT", "+80"},         {"MESHPG_NCCL_SPLIT_SHARE", "true"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    const char *old = getenv(bad[i].var);
    char *saved = old ? strdup(old) : NULL;
    setenv(bad[i].var, bad[i].value, 1);
    mpg_status st[2];
    double t0 = clock_s();
    mpg_status all = mpg_thread_run(2, TIMEOUT_S, plain_main, NULL, st);
    double secs = clock_s() - t0;
    const char *msg = mpg_last_error();
    char want[128];
    snprintf(want, sizeof want, "%s=\"%s\": expected", bad[i].var, bad[i].value);
    cr_expect_eq(all, MPG_ERR_ENV, "%s=\"%s\": %s: %s", bad[i].var, bad[i].value,
                 mpg_status_name(all), msg);
    cr_expect_eq(st[0], MPG_ERR_ENV, "%s: rank 0: %s", bad[i].var, mpg_status_name(st[0]));
    cr_expect_eq(st[1], MPG_ERR_ENV, "%s: rank 1: %s", bad[i].var, mpg_status_name(st[1]));
    cr_expect(strstr(msg, want) && strstr(msg, "rank "), "%s: message: %s", bad[i].var, msg);
    cr_expect_lt(secs, tb_bound(1.0, 2), "%s: %.2f s", bad[i].var, secs);
    if (saved) {
      setenv(bad[i].var, saved, 1);
      free(saved);
    } else {
      unsetenv(bad[i].var);
    }
  }
}

/* Good values still pass: each variable at a documented value. */
Test(agree, documented_values_pass) {
  static const char *const good[][2] = {
      {"MESHPG_LOG", "off"},           {"MESHPG_LOG", ""},
      {"MESHPG_SHM", "0"},             {"MESHPG_THREAD_INBOX_MSGS", "16"},
      {"MESHPG_MPI_PROGRESS", "off"},  {"MESHPG_MPI_WINDOW", "2"},
      {"MESHPG_MPI_MAX_COUNT", "1"},   {"MESHPG_MPI_PIECE_BYTES", "65536"},
      {"MESHPG_NCCL_PORT", "29501"},   {"MESHPG_NCCL_SPLIT_SHARE", "1"},
  };
  for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
    setenv(good[i][0], good[i][1], 1);
    mpg_status st = mpg_thread_run(2, TIMEOUT_S, plain_main, NULL, NULL);
    cr_expect_eq(st, MPG_OK, "%s=\"%s\": %s", good[i][0], good[i][1], mpg_last_error());
    unsetenv(good[i][0]);
  }
}

/* ------------------------------------------------------------------ */
/* Timeouts: finite and below the bound everywhere                     */
/* ------------------------------------------------------------------ */

static mpg_status timeout_main(const mpg_init_opts *in, void *p) {
  mpg_init_opts opts = *in;
  opts.timeout_s = *(const double *)p;
  return plain_main(&opts, NULL);
}

Test(agree, endless_timeouts_are_refused) {
  const double bad[] = {NAN, INFINITY, 1e300, 1e9};
  for (int i = 0; i < 4; i++) {
    mpg_status st = mpg_thread_run(2, TIMEOUT_S, timeout_main, (void *)&bad[i], NULL);
    cr_expect_eq(st, MPG_ERR_INVALID, "opts.timeout_s = %g: %s", bad[i], mpg_last_error());
    cr_expect(strstr(mpg_last_error(), "opts.timeout_s"), "%s", mpg_last_error());
  }
  const double fine[] = {0.0, 5.0};
  for (int i = 0; i < 2; i++)
    cr_expect_eq(mpg_thread_run(2, TIMEOUT_S, timeout_main, (void *)&fine[i], NULL), MPG_OK,
                 "opts.timeout_s = %g: %s", fine[i], mpg_last_error());
}

Test(agree, spec_timeout_must_be_finite) {
  const char *bad[] = {"inf", "nan", "1e300"};
  for (int i = 0; i < 3; i++) {
    char toml[256];
    snprintf(toml, sizeof toml,
             "[mesh]\ndims = [{ name = \"dp\", size = 2 }]\n[backend]\ntimeout_s = %s\n",
             bad[i]);
    mpg_spec spec = MPG_SPEC_INIT;
    mpg_status st = mpg_spec_load_string(toml, "t.toml", &spec);
    cr_expect_eq(st, MPG_ERR_SPEC, "timeout_s = %s: %s", bad[i], mpg_last_error());
    cr_expect(strstr(mpg_last_error(), "backend.timeout_s") &&
                  strstr(mpg_last_error(), ":4:"),
              "timeout_s = %s: %s", bad[i], mpg_last_error());
  }
}
