/* The report lines of the MPI and launcher workers that check values
 * (tests/sync/shm_mpi_worker.c, tests/cluster/): "FAIL <mode> rank R: ..."
 * lines counted in `failures`, and TRY, which reports a failed meshpg call
 * with its status and message and jumps to the caller's `done` label.
 * Header only; the including program sets g_mode and g_rank. */
#ifndef MPG_TESTS_SUPPORT_WORKER_REPORT_H
#define MPG_TESTS_SUPPORT_WORKER_REPORT_H

#include <stdarg.h>
#include <stdio.h>

#include "meshpg.h"

static const char *g_mode = "?";
static int g_rank = -1;
static int failures;

__attribute__((format(printf, 1, 2), unused)) static void fail(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  printf("FAIL %s rank %d: ", g_mode, g_rank);
  vprintf(fmt, ap);
  printf("\n");
  fflush(stdout);
  va_end(ap);
  failures++;
}

#define TRY(call)                                                                        \
  do {                                                                                   \
    mpg_status st_ = (call);                                                             \
    if (st_ != MPG_OK) {                                                                 \
      fail("line %d: %s -> %s: %s", __LINE__, #call, mpg_status_name(st_),              \
           mpg_last_error());                                                            \
      goto done;                                                                         \
    }                                                                                    \
  } while (0)

#endif
