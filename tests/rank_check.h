/* Rank-side failure reporting of the thread-backend suites
 * (tests/groups/test_thread.c, test_p2p.c, test_inplace.c; test_order.c and
 * tests/sync/test_sync_order.c use rank_failures only).
 *
 * Ranks are threads (mpg_thread_run): Criterion's asserts must not run on
 * them.  So a rank records its first failure instead (RCHECK, RCALL, or
 * rank_fail directly) in fail_msg, the first one of the whole run, and
 * returns MPG_ERR_STATE, aborting its context so that its peers stop
 * waiting for it.  The test thread then asserts on what mpg_thread_run gave
 * back and shows fail_msg (EXPECT_RUN_OK).
 *
 * A rank function sets tl_rank (named in the message) and tl_ctx (the
 * context a failure aborts) once its context exists, itself or through
 * rank_open, and puts tl_ctx back to NULL before it destroys that context.
 * Each Criterion test is its own process; a test that makes several runs
 * clears fail_msg (fail_msg[0] = '\0') before each. */
#ifndef MPG_TESTS_RANK_CHECK_H
#define MPG_TESTS_RANK_CHECK_H

#include <criterion/criterion.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <time.h>

#include "meshpg.h"

#if defined(__GNUC__)
#define RANK_CHECK_UNUSED __attribute__((unused))
#else
#define RANK_CHECK_UNUSED
#endif

static RANK_CHECK_UNUSED pthread_mutex_t fail_mu = PTHREAD_MUTEX_INITIALIZER;
static RANK_CHECK_UNUSED char fail_msg[2048];
static RANK_CHECK_UNUSED _Thread_local int tl_rank = -1;
static RANK_CHECK_UNUSED _Thread_local mpg_ctx *tl_ctx;

/* Record the first failure of the run (on rank tl_rank, at file:line) and
 * abort tl_ctx; returns MPG_ERR_STATE for the rank function to return. */
static inline mpg_status rank_fail(const char *file, int line, const char *fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  pthread_mutex_lock(&fail_mu);
  if (!fail_msg[0])
    snprintf(fail_msg, sizeof fail_msg, "rank %d at %s:%d: %s", tl_rank, file, line, buf);
  pthread_mutex_unlock(&fail_mu);
  if (tl_ctx) mpg_ctx_abort(tl_ctx); /* peers stop waiting for us */
  return MPG_ERR_STATE;
}

/* In a rank function: fail (and return) unless cond holds. */
/* A mesh from "dp=2,tp=2" (sizes may be -1), over the world it implies. */
static inline mpg_mesh *make_dims_mesh(const char *dims) {
  mpg_spec spec = MPG_SPEC_INIT;
  cr_assert_eq(mpg_spec_init(&spec), MPG_OK);
  cr_assert_eq(mpg_spec_set_mesh(&spec, dims), MPG_OK, "%s", mpg_last_error());
  mpg_mesh *m = NULL;
  cr_assert_eq(mpg_mesh_create(&spec, 0, &m), MPG_OK, "mesh %s: %s", dims, mpg_last_error());
  return m;
}

#define RCHECK(cond, ...)                                            \
  do {                                                               \
    if (!(cond)) return rank_fail(__FILE__, __LINE__, __VA_ARGS__);  \
  } while (0)

/* In a rank function: fail (and return) unless the call gives MPG_OK. */
#define RCALL(expr)                                                  \
  do {                                                               \
    mpg_status st_ = (expr);                                         \
    RCHECK(st_ == MPG_OK, "%s: %s: %s", #expr, mpg_status_name(st_), \
           mpg_last_error());                                        \
  } while (0)

/* The start of a rank function: sets tl_rank, creates the rank's context
 * on `mesh` (*ctx, then tl_ctx) and, when group is not NULL, looks up that
 * group (*g).  MPG_OK, or rank_fail's status for the caller to return. */
static inline mpg_status rank_open(const mpg_init_opts *opts, const mpg_mesh *mesh,
                                   mpg_ctx **ctx, const char *group, mpg_group **g) {
  tl_rank = opts->rank;
  RCALL(mpg_ctx_create(mesh, opts, ctx));
  tl_ctx = *ctx;
  if (group) RCALL(mpg_ctx_group(*ctx, group, g));
  return MPG_OK;
}

/* On the test thread: assert that a thread run succeeded, showing the
 * first rank failure. */
#define EXPECT_RUN_OK(st)                                                      \
  cr_assert_eq((st), MPG_OK, "mpg_thread_run: %s: %s | first rank failure: %s", \
               mpg_status_name(st), mpg_last_error(), fail_msg)

/* On the test thread, for ranks that keep a message each instead of
 * fail_msg: one line "\n  rank R: STATUS: MESSAGE" per rank whose status
 * in st (mpg_thread_run's) is not MPG_OK, written to all (cap bytes, cut
 * short when full).  Rank r's message is the string at
 * (const char *)msgs + r * stride: msgs an array of char arrays (stride:
 * the size of one), or the member's place in an array of structs
 * ((const char *)arr + offsetof(type, msg), stride sizeof arr[0]).
 * Returns all. */
static inline const char *rank_failures(char *all, size_t cap, int world, const mpg_status *st,
                                        const void *msgs, size_t stride) {
  size_t n = 0;
  all[0] = '\0';
  for (int r = 0; r < world; r++)
    if (st[r] != MPG_OK && n < cap)
      n += (size_t)snprintf(all + n, cap - n, "\n  rank %d: %s: %s", r, mpg_status_name(st[r]),
                            (const char *)msgs + (size_t)r * stride);
  return all;
}

/* Seconds on the monotonic clock; a sleep of s seconds. */
static inline double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline void sleep_s(double s) {
  struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  nanosleep(&ts, NULL);
}

#endif
