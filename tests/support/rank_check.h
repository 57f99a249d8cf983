/* Rank-side failure reporting (tests/support/rank_check.c) of the thread-backend suites
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

#include "clock.h"
#include "meshpg.h"
#include "mesh_util.h"

/* The first failure of the run ("" until one), and the rank function's
 * rank and context (see above). */
extern char fail_msg[2048];
extern _Thread_local int tl_rank;
extern _Thread_local mpg_ctx *tl_ctx;

/* This thread's last failure (rank_fail's message, "" until one): what
 * run_ranks keeps as the rank's message. */
extern _Thread_local char tl_fail_msg[512];

/* Record the first failure of the run (on rank tl_rank, at file:line) and
 * abort tl_ctx; returns MPG_ERR_STATE for the rank function to return. */
mpg_status rank_fail(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Some rank or thread recorded a failure already (fail_msg is set). */
int rank_failed(void);

/* In a rank function: fail (and return) unless cond holds. */
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
mpg_status rank_open(const mpg_init_opts *opts, const mpg_mesh *mesh, mpg_ctx **ctx,
                     const char *group, mpg_group **g);

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
const char *rank_failures(char *all, size_t cap, int world, const mpg_status *st,
                          const void *msgs, size_t stride);

#endif
