/* Syncs from a list of params: see sync_util.h. */
#include "sync_util.h"

#include <stdio.h>

mpg_status sync_make_params(mpg_ctx *ctx, const mpg_sync_opts *so, const sync_param *ps, int n,
                            mpg_sync **s) {
  *s = NULL;
  mpg_status st = mpg_sync_create(ctx, so, s);
  for (int p = 0; p < n && !st; p++) {
    mpg_param_opts po = MPG_PARAM_OPTS_INIT;
    po.reduce_dims = ps[p].reduce_dims;
    int id;
    st = mpg_sync_add_param(*s, ps[p].name, ps[p].count, ps[p].dtype, &po, &id);
  }
  return st ? st : mpg_sync_commit(*s);
}

mpg_status sync_make(mpg_ctx *ctx, double bucket_mb, int n, size_t count, mpg_sync **s) {
  enum { MAXP = 64 };
  char names[MAXP][16];
  sync_param ps[MAXP];
  *s = NULL;
  if (n > MAXP) return MPG_ERR_INVALID;
  for (int p = 0; p < n; p++) {
    snprintf(names[p], sizeof names[p], "w%d", p);
    ps[p] = (sync_param){names[p], count, MPG_F32, NULL};
  }
  mpg_sync_opts so = MPG_SYNC_OPTS_INIT;
  so.sync.bucket_mb = bucket_mb;
  so.sync.first_bucket_mb = bucket_mb;
  return sync_make_params(ctx, &so, ps, n, s);
}
