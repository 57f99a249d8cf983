/* The report lines of the MPI and launcher workers (tests/support/
 * worker_report.c): "FAIL <mode> rank R: ..." lines counted in `failures`,
 * and TRY, which reports a failed meshpg call with its status and message
 * and jumps to the caller's `done` label.  worker_main (worker_main.h) sets
 * g_mode and g_rank and prints the closing "OK <mode> rank R" line when
 * `failures` stayed 0; a worker with its own main sets them itself. */
#ifndef MPG_TESTS_SUPPORT_WORKER_REPORT_H
#define MPG_TESTS_SUPPORT_WORKER_REPORT_H

#include <stdarg.h>
#include <stdio.h>

#include "meshpg.h"

/* The mode named in the report lines ("?" until set), this process's rank
 * (-1 until set), and the failures reported so far. */
extern const char *g_mode;
extern int g_rank;
extern int failures;

/* Print "FAIL <g_mode> rank <g_rank>: <message>" and count it; after
 * WR_MAX_LINES failures the lines stop (the count goes on). */
enum { WR_MAX_LINES = 20 };
void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Report a failed meshpg call and `goto done`. */
#define TRY(call)                                                                        \
  do {                                                                                   \
    mpg_status st_ = (call);                                                             \
    if (st_ != MPG_OK) {                                                                 \
      fail("line %d: %s -> %s: %s", __LINE__, #call, mpg_status_name(st_),              \
           mpg_last_error());                                                            \
      goto done;                                                                         \
    }                                                                                    \
  } while (0)

/* The closing lines of a steps mode (tests/cluster's workers): "END rank R
 * host H status S ms MS step K: MSG" (how the steps ended: S the failing
 * call's status, MS how long it took; OK, 0, the step count and "all
 * steps" when none failed), then steps_destroy's "DESTROYED rank R status
 * SYNC CTX" (the statuses of destroying the sync, NULL allowed, and the
 * context, NULL: nothing to destroy, both OK) before the mesh goes. */
void steps_end(int rank, const char *host, mpg_status st, double ms, int step, const char *msg);
void steps_destroy(int rank, mpg_sync *s, mpg_ctx *ctx, mpg_mesh *mesh);

/* Destroy ctx (when not NULL; a failure reported) and mesh. */
void ctx_close(mpg_ctx *ctx, mpg_mesh *mesh);

/* Report a failure and `goto done`. */
#define FAIL_DONE(...)      \
  do {                      \
    fail(__VA_ARGS__);      \
    goto done;              \
  } while (0)

/* Report a failed meshpg call (at file:line, with its status and message)
 * and go on. */
#define CHECK(call)                                                                      \
  do {                                                                                   \
    mpg_status st_ = (call);                                                             \
    if (st_ != MPG_OK)                                                                   \
      fail("%s:%d: %s -> %s: %s", __FILE__, __LINE__, #call, mpg_status_name(st_),      \
           mpg_last_error());                                                            \
  } while (0)

#endif
