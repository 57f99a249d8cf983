/* The workers' report lines: see worker_report.h. */
#include "worker_report.h"

const char *g_mode = "?";
int g_rank = -1;
int failures;

void fail(const char *fmt, ...) {
  if (failures++ >= WR_MAX_LINES) return;
  va_list ap;
  va_start(ap, fmt);
  printf("FAIL %s rank %d: ", g_mode, g_rank);
  vprintf(fmt, ap);
  printf("\n");
  fflush(stdout);
  va_end(ap);
}
