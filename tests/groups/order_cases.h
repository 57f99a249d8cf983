/* Cases of the issue-order checker (groups/order.c), shared by
 * test_order.c and test_sync_order.c (thread backend, ranks are threads)
 * and order_mpi_worker.c (MPI backend, ranks are processes).
 *
 * Every case runs on the mesh pp=1,dp=2,tp=2 (4 ranks: dp groups {0,2}
 * {1,3}, tp groups {0,1} {2,3}, "pp" groups of one rank) with the checker
 * on, starts with a passing check (so that calls are numbered from the
 * first call of the case), and expects its outcome on every rank:
 *
 *   agree       the same collectives of every kind everywhere: the check
 *               passes and adds nothing to mpg__ctx_setup_collectives
 *   swap        rank 3 issues on "dp" first where the others issue on "tp"
 *               (both asynchronous, so that every backend completes them):
 *               MPG_ERR_STATE everywhere, naming call #1 of ranks 1 and 3
 *   count       rank 3 all-reduces 8 elements on "tp" where rank 2 gives 4
 *               (thread backend only: its matcher refuses the call first)
 *   extra       rank 3 issues one more all-reduce, on its one-rank "pp"
 *               group: rank 1 "issued nothing" at call #3
 *   wrap        a swap older than the 1024 calls the log keeps, then a
 *               difference inside the wrapped log (thread backend only)
 *   split       rank 3 creates groups "pp+tp" and "pp+dp" in the other
 *               order (thread backend only): the splits pair calls of
 *               different groups, whose members the split check finds
 *               wrong (MPG_ERR_STATE "do not agree on the mesh", the
 *               context aborted, so the others' next call gives
 *               MPG_ERR_ABORTED); the checker would name the calls
 *   sync        a correct gradient sync: commit and three steps pass
 *   sync_extra  rank 3 issues an extra all-reduce in step 1: every rank's
 *               mpg_sync_finish fails with MPG_ERR_STATE and invalid
 *               gradients; step 2 passes again
 *   off         MESHPG_CHECK_ORDER=0: "swap" passes (the checker is off)
 *
 * Nothing here uses Criterion: a case returns MPG_OK or a status with a
 * message in `msg`. */
#ifndef ORDER_CASES_H
#define ORDER_CASES_H

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "groups_internal.h" /* mpg__ctx_setup_collectives */

#if defined(__GNUC__)
#define OC_UNUSED __attribute__((unused))
#else
#define OC_UNUSED
#endif

#define OC_WORLD 4

static OC_UNUSED mpg_status oc_fail(char *msg, size_t cap, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, cap, fmt, ap);
  va_end(ap);
  return MPG_ERR_STATE;
}

#define OC_TRY(call)                                                              \
  do {                                                                            \
    mpg_status st_ = (call);                                                      \
    if (st_ != MPG_OK) {                                                          \
      rc = oc_fail(msg, cap, "rank %d: line %d: %s -> %s: %s", rank, __LINE__,    \
                   #call, mpg_status_name(st_), mpg_last_error());                \
      goto done;                                                                  \
    }                                                                             \
  } while (0)

#define OC_CHECK(cond, ...)                                                       \
  do {                                                                            \
    if (!(cond)) {                                                                \
      char m_[1400];                                                              \
      snprintf(m_, sizeof m_, __VA_ARGS__);                                       \
      rc = oc_fail(msg, cap, "rank %d: line %d: %s", rank, __LINE__, m_);         \
      goto done;                                                                  \
    }                                                                             \
  } while (0)

/* mpg_ctx_check_order(ctx) fails with a message holding every piece (the
 * case `what` named in the failure). */
#define OC_CHECK_ORDER_FAILS(what, ...)                                                    \
  do {                                                                                     \
    st = mpg_ctx_check_order(ctx);                                                         \
    OC_CHECK(oc_names(st, __VA_ARGS__, (const char *)NULL), "%s: check gave %s: %s", what, \
             mpg_status_name(st), mpg_last_error());                                       \
  } while (0)

/* st must be MPG_ERR_STATE with a message holding every one of the
 * strings (NULL-terminated list). */
static OC_UNUSED int oc_names(mpg_status st, ...) {
  if (st != MPG_ERR_STATE) return 0;
  va_list ap;
  va_start(ap, st);
  int ok = 1;
  for (const char *s = va_arg(ap, const char *); s; s = va_arg(ap, const char *))
    ok &= strstr(mpg_last_error(), s) != NULL;
  va_end(ap);
  return ok;
}

/* Two asynchronous all-reduces of 4 floats, on a then b. */
static OC_UNUSED mpg_status oc_two(mpg_group *a, mpg_group *b, float *x, float *y) {
  mpg_work *wa = NULL, *wb = NULL;
  mpg_status st = mpg_all_reduce(a, x, x, 4, MPG_F32, MPG_OP_SUM, NULL, &wa);
  if (!st) st = mpg_all_reduce(b, y, y, 4, MPG_F32, MPG_OP_SUM, NULL, &wb);
  mpg_status s1 = mpg_work_wait(wa), s2 = mpg_work_wait(wb);
  return st ? st : s1 ? s1 : s2;
}

static OC_UNUSED mpg_status oc_sync_case(mpg_ctx *ctx, int rank, int extra, char *msg,
                                         size_t cap) {
  mpg_status rc = MPG_OK;
  mpg_sync *s = NULL;
  mpg_group *pp = NULL;
  float f[4] = {1, 2, 3, 4};
  mpg_sync_opts so = MPG_SYNC_OPTS_INIT;
  so.sync.bucket_mb = 0.0005; /* about 500 bytes: several buckets */
  so.sync.first_bucket_mb = 0.0005;
  OC_TRY(mpg_ctx_group(ctx, "pp", &pp));
  OC_TRY(mpg_sync_create(ctx, &so, &s));
  for (int p = 0; p < 6; p++) {
    char name[16];
    int id;
    snprintf(name, sizeof name, "w%d", p);
    OC_TRY(mpg_sync_add_param(s, name, 100, MPG_F32, NULL, &id));
  }
  OC_TRY(mpg_sync_commit(s));
  for (int step = 0; step < 3; step++) {
    float *g0;
    OC_TRY(mpg_sync_grad(s, 0, (void **)&g0));
    g0[0] = (float)(rank + 1);
    if (extra && step == 1 && rank == 3)
      OC_TRY(mpg_all_reduce(pp, f, f, 4, MPG_F32, MPG_OP_SUM, NULL, NULL));
    mpg_status st = mpg_sync_all(s, step, NULL);
    if (extra && step == 1) {
      OC_CHECK(oc_names(st, "sync step 1", "mpg_sync_finish: issue order differs",
                        "call #1 since the last check", "rank 1 issued all_reduce(f32, avg",
                        "rank 3 issued all_reduce(f32, sum, count 4) on \"pp\"",
                        "group \"dp\" index 1", (const char *)NULL),
               "step 1 with an extra call gave %s: %s", mpg_status_name(st),
               mpg_last_error());
      OC_CHECK(mpg_sync_grads_valid(s) == 0, "grads valid after a failed check");
    } else {
      OC_TRY(st);
      OC_CHECK(mpg_sync_grads_valid(s) == 1, "grads invalid after step %d", step);
      float want = rank % 2 == 0 ? 2.0f : 3.0f; /* avg over dp {0,2} or {1,3} */
      OC_CHECK(g0[0] == want, "step %d: g0[0] = %g, expected %g", step, g0[0], want);
    }
    OC_TRY(mpg_sync_zero_grads(s));
  }
done:
  if (s) {
    mpg_status st = mpg_sync_destroy(s);
    if (st && !rc)
      rc = oc_fail(msg, cap, "rank %d: mpg_sync_destroy: %s", rank, mpg_last_error());
  }
  return rc;
}

/* Run `mode` as one rank with `opts` (from mpg_thread_run, or the MPI
 * backend's).  MPG_OK when the case went as expected on this rank. */
static OC_UNUSED mpg_status oc_run(const mpg_init_opts *opts, const char *mode, char *msg,
                                   size_t cap) {
  mpg_status rc = MPG_OK;
  int rank = opts->rank;
  msg[0] = '\0';
  mpg_spec *spec = malloc(sizeof *spec);
  mpg_mesh *mesh = NULL;
  mpg_ctx *ctx = NULL;
  OC_CHECK(spec, "out of memory");
  *spec = (mpg_spec)MPG_SPEC_INIT;
  OC_TRY(mpg_spec_init(spec));
  OC_TRY(mpg_spec_set_mesh(spec, "pp=1,dp=2,tp=2"));
  OC_TRY(mpg_mesh_create(spec, OC_WORLD, &mesh));
  OC_TRY(mpg_ctx_create(mesh, opts, &ctx));
  rank = mpg_ctx_rank(ctx);
  mpg_group *dp, *tp, *pp, *world;
  OC_TRY(mpg_ctx_group(ctx, "dp", &dp));
  OC_TRY(mpg_ctx_group(ctx, "tp", &tp));
  OC_TRY(mpg_ctx_group(ctx, "pp", &pp));
  OC_TRY(mpg_ctx_group(ctx, "world", &world));
  OC_TRY(mpg_ctx_check_order(ctx)); /* the creation splits agree */
  long setup = mpg__ctx_setup_collectives(ctx);
  float x[4] = {1, 2, 3, 4}, y[4] = {5, 6, 7, 8}, z[16];
  mpg_status st;
  if (strcmp(mode, "agree") == 0) {
    OC_TRY(oc_two(tp, dp, x, y));
    OC_TRY(mpg_all_reduce_scaled(world, x, x, 4, MPG_F32, 0.5, NULL, NULL));
    OC_TRY(mpg_broadcast(dp, y, 4, MPG_F32, 1, NULL, NULL));
    OC_TRY(mpg_all_gather(world, x, z, 4, MPG_F32, NULL, NULL));
    OC_TRY(mpg_reduce_scatter(tp, z, x, 4, MPG_F32, MPG_OP_MAX, NULL, NULL));
    OC_TRY(mpg_barrier(world, NULL));
    OC_TRY(mpg_all_reduce(pp, x, x, 4, MPG_F32, MPG_OP_SUM, NULL, NULL));
    OC_TRY(mpg_ctx_check_order(ctx));
    OC_TRY(mpg_ctx_check_order(ctx)); /* nothing since: passes too */
  } else if (strcmp(mode, "swap") == 0 || strcmp(mode, "off") == 0) {
    st = rank == 3 ? oc_two(dp, tp, y, x) : oc_two(tp, dp, x, y);
    OC_TRY(st);
    st = mpg_ctx_check_order(ctx);
    if (strcmp(mode, "off") == 0) {
      OC_TRY(st);
    } else {
      OC_CHECK(oc_names(st, "mpg_ctx_check_order: issue order differs: call #1 since the "
                        "last check: rank 1 issued all_reduce(f32, sum, count 4) on \"tp\", "
                        "rank 3 issued all_reduce(f32, sum, count 4) on \"dp\" (ranks 1 and "
                        "3 are members of group \"dp\" index 1; 2 groups disagree)",
                        (const char *)NULL),
               "swap: check gave %s: %s", mpg_status_name(st), mpg_last_error());
      OC_TRY(mpg_ctx_check_order(ctx)); /* the record started afresh */
    }
  } else if (strcmp(mode, "count") == 0) {
    st = mpg_all_reduce(tp, z, z, rank == 3 ? 8 : 4, MPG_F32, MPG_OP_SUM, NULL, NULL);
    if (rank >= 2)
      OC_CHECK(st == MPG_ERR_INVALID, "mismatched counts gave %s", mpg_status_name(st));
    else
      OC_TRY(st);
    OC_CHECK_ORDER_FAILS("count",
                         "call #1 since the last check: rank 2 issued all_reduce(f32, sum, "
                         "count 4) on \"tp\", rank 3 issued all_reduce(f32, sum, count 8) on "
                         "\"tp\"",
                         "1 group disagrees");
  } else if (strcmp(mode, "extra") == 0) {
    OC_TRY(oc_two(tp, dp, x, y));
    if (rank == 3) OC_TRY(mpg_all_reduce(pp, x, x, 4, MPG_F32, MPG_OP_SUM, NULL, NULL));
    OC_CHECK_ORDER_FAILS("extra", "call #3 since the last check: rank 1 issued nothing (2 "
                         "calls since the last check), rank 3 issued all_reduce(f32, sum, "
                         "count 4) on \"pp\"");
  } else if (strcmp(mode, "wrap") == 0) {
    /* The swap, then 1100 more calls: older than the 1024 calls kept. */
    OC_TRY(rank == 3 ? oc_two(dp, tp, y, x) : oc_two(tp, dp, x, y));
    for (int k = 0; k < 1100; k++)
      OC_TRY(mpg_all_reduce(pp, x, x, 1, MPG_F32, MPG_OP_MAX, NULL, NULL));
    OC_CHECK_ORDER_FAILS("wrap",
                         "ranks 1 and 3, members of group \"dp\" index 1, issued different "
                         "calls before the last 1024 calls kept");
    /* A difference inside the log after it wrapped: one more call at the end. */
    OC_TRY(mpg_all_reduce(dp, x, x, 1, MPG_F32, MPG_OP_MAX, NULL, NULL));
    for (int k = 0; k < 1100; k++)
      OC_TRY(mpg_all_reduce(pp, x, x, 1, MPG_F32, MPG_OP_MAX, NULL, NULL));
    if (rank == 3) OC_TRY(mpg_all_reduce(pp, x, x, 2, MPG_F32, MPG_OP_MAX, NULL, NULL));
    OC_CHECK_ORDER_FAILS("wrap, second check", "call #1102 since the last check: rank 1 issued "
                         "nothing (1101 calls since the last check), rank 3 issued "
                         "all_reduce(f32, max, count 2) on \"pp\"");
  } else if (strcmp(mode, "split") == 0) {
    mpg_group *a, *b;
    const char *first = rank == 3 ? "pp,tp" : "pp,dp", *second = rank == 3 ? "pp,dp" : "pp,tp";
    st = mpg_ctx_group_dims(ctx, first, &a);
    if (!st) st = mpg_ctx_group_dims(ctx, second, &b);
    if (!st) st = mpg_ctx_check_order(ctx);
    if (st == MPG_ERR_ABORTED || (st == MPG_ERR_STATE &&
                                  strstr(mpg_last_error(), "do not agree on the mesh"))) {
      /* Caught at a split (group.c's check of the members): no check
       * point is reached, and nothing more is asked of this rank. */
      goto done;
    }
    OC_CHECK(oc_names(st, "call #1 since the last check: rank 0 issued split (creation) of "
                      "group \"pp+dp\", rank 3 issued split (creation) of group \"pp+tp\"",
                      "group \"world\" index 0", (const char *)NULL),
             "split: check gave %s: %s", mpg_status_name(st), mpg_last_error());
    setup += 2; /* the two splits count, the check does not */
  } else if (strcmp(mode, "sync") == 0 || strcmp(mode, "sync_extra") == 0) {
    rc = oc_sync_case(ctx, rank, strcmp(mode, "sync_extra") == 0, msg, cap);
    if (rc) goto done;
    OC_TRY(mpg_ctx_check_order(ctx));
    setup = mpg__ctx_setup_collectives(ctx); /* the sync may create groups */
  } else {
    OC_CHECK(0, "unknown case \"%s\"", mode);
  }
  OC_CHECK(mpg__ctx_setup_collectives(ctx) == setup,
           "setup collectives went from %ld to %ld: the checker's were counted", setup,
           mpg__ctx_setup_collectives(ctx));
done:
  if (ctx) {
    st = mpg_ctx_destroy(ctx);
    if (st && !rc)
      rc = oc_fail(msg, cap, "rank %d: mpg_ctx_destroy: %s: %s", rank, mpg_status_name(st),
                   mpg_last_error());
  }
  mpg_mesh_destroy(mesh);
  free(spec);
  return rc;
}

#endif
