/* The start and end of a rank function of the trace tests' thread jobs
 * (dump/, stragglers/), around rank_check.h's rank_open. */
#ifndef MESHPG_TESTS_TRACE_RANK_H
#define MESHPG_TESTS_TRACE_RANK_H

#include "meshpg.h"
#include "rank_check.h"

/* rank_open with group `name` (*g), then `ops` sum all-reduces of
 * x[0..count) on it: MPG_OK, or rank_fail's status to return. */
static inline mpg_status tt_open_ops(const mpg_init_opts *opts, const mpg_mesh *mesh,
                                     mpg_ctx **ctx, const char *name, mpg_group **g, int ops,
                                     float *x, size_t count) {
  mpg_status st = rank_open(opts, mesh, ctx, name, g);
  if (st) return st;
  for (int i = 0; i < ops; i++)
    RCALL(mpg_all_reduce(*g, x, x, count, MPG_F32, MPG_OP_SUM, NULL, NULL));
  return MPG_OK;
}

/* The end: tl_ctx back to NULL, then the context destroyed (RCALL). */
static inline mpg_status tt_close(mpg_ctx *ctx) {
  tl_ctx = NULL;
  RCALL(mpg_ctx_destroy(ctx));
  return MPG_OK;
}

#endif
