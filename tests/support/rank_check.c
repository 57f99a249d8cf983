/* Rank-side failure reporting: see rank_check.h. */
#include "rank_check.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>

static pthread_mutex_t fail_mu = PTHREAD_MUTEX_INITIALIZER;
char fail_msg[2048];
_Thread_local int tl_rank = -1;
_Thread_local mpg_ctx *tl_ctx;
_Thread_local char tl_fail_msg[512];

mpg_status rank_fail(const char *file, int line, const char *fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  int k = snprintf(tl_fail_msg, sizeof tl_fail_msg, "%s:%d: ", file, line);
  if (k >= 0 && (size_t)k < sizeof tl_fail_msg)
    snprintf(tl_fail_msg + k, sizeof tl_fail_msg - (size_t)k, "%.400s", buf);
  pthread_mutex_lock(&fail_mu);
  if (!fail_msg[0])
    snprintf(fail_msg, sizeof fail_msg, "rank %d at %s:%d: %s", tl_rank, file, line, buf);
  pthread_mutex_unlock(&fail_mu);
  if (tl_ctx) mpg_ctx_abort(tl_ctx); /* peers stop waiting for us */
  return MPG_ERR_STATE;
}

int rank_failed(void) {
  pthread_mutex_lock(&fail_mu);
  int failed = fail_msg[0] != '\0';
  pthread_mutex_unlock(&fail_mu);
  return failed;
}

mpg_status rank_open(const mpg_init_opts *opts, const mpg_mesh *mesh, mpg_ctx **ctx,
                     const char *group, mpg_group **g) {
  tl_rank = opts->rank;
  RCALL(mpg_ctx_create(mesh, opts, ctx));
  tl_ctx = *ctx;
  if (group) RCALL(mpg_ctx_group(*ctx, group, g));
  return MPG_OK;
}

const char *rank_failures(char *all, size_t cap, int world, const mpg_status *st,
                          const void *msgs, size_t stride) {
  size_t n = 0;
  all[0] = '\0';
  for (int r = 0; r < world; r++)
    if (st[r] != MPG_OK && n < cap)
      n += (size_t)snprintf(all + n, cap - n, "\n  rank %d: %s: %s", r, mpg_status_name(st[r]),
                            (const char *)msgs + (size_t)r * stride);
  return all;
}
