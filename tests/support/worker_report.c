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

void steps_end(int rank, const char *host, mpg_status st, double ms, int step, const char *msg) {
  printf("END rank %d host %s status %s ms %.0f step %d: %s\n", rank, host, mpg_status_name(st),
         ms, step, msg);
  fflush(stdout);
}

void steps_destroy(int rank, mpg_sync *s, mpg_ctx *ctx, mpg_mesh *mesh) {
  mpg_status sst = s ? mpg_sync_destroy(s) : MPG_OK;
  mpg_status dst = ctx ? mpg_ctx_destroy(ctx) : MPG_OK;
  printf("DESTROYED rank %d status %s %s\n", rank, mpg_status_name(sst), mpg_status_name(dst));
  fflush(stdout);
  mpg_mesh_destroy(mesh);
}

void ctx_close(mpg_ctx *ctx, mpg_mesh *mesh) {
  mpg_status st = ctx ? mpg_ctx_destroy(ctx) : MPG_OK;
  if (st) fail("mpg_ctx_destroy -> %s: %s", mpg_status_name(st), mpg_last_error());
  mpg_mesh_destroy(mesh);
}
