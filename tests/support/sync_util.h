/* Syncs for the tests that need one built from a list of params
 * (tests/support/sync_util.c): the MPI and launcher workers, the flight
 * recorder's and the order checker's cases.  Asserts nothing: usable on
 * rank threads and in MPI workers. */
#ifndef MPG_TESTS_SUPPORT_SYNC_UTIL_H
#define MPG_TESTS_SUPPORT_SYNC_UTIL_H

#include <stddef.h>

#include "meshpg.h"

/* One param of a test sync: reduce_dims NULL for the sync's default. */
typedef struct sync_param {
  const char *name;
  size_t count;
  mpg_dtype dtype;
  const char *reduce_dims;
} sync_param;

/* A sync on ctx with options so (NULL: the defaults) holding ps[0 .. n-1]
 * in that order, committed.  *s is set as soon as the sync exists:
 * destroy it after a failure too.  MPG_OK, or the first failing call's
 * status. */
mpg_status sync_make_params(mpg_ctx *ctx, const mpg_sync_opts *so, const sync_param *ps, int n,
                            mpg_sync **s);

/* sync_make_params with buckets (the first one too) of bucket_mb and n
 * (at most 64) f32 params of `count` elements each, named "w0" .. "w<n-1>". */
mpg_status sync_make(mpg_ctx *ctx, double bucket_mb, int n, size_t count, mpg_sync **s);

#endif
