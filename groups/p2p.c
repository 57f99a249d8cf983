/* mpg_p2p_batch: a list of sends and receives issued as one batch, like
 * torch's batch_isend_irecv.  Every operation is checked before anything
 * is posted.  A backend with post_batch starts them all as one group with
 * one request (nccl: ncclGroupStart .. ncclGroupEnd); otherwise the
 * receives, then the sends, are posted one by one with post, which never
 * blocks a receive and blocks a send at most until its receiver has
 * posted the receive (backend.h), and the work handle keeps one request
 * per operation.  Matching order per (peer, direction) is kept: the list
 * is reordered only between the two directions.  Waiting, timeouts and
 * aborts go through coll.c (mpg__group_finish, mpg__group_on_failure).
 * The posting part, mpg__group_post_p2p, also carries alltoall.c's
 * all-to-alls.  See core.h. */
#include <stdint.h>
#include <stdlib.h>

#include "core.h"

#define FN "mpg_p2p_batch"

static mpg_status check_op(const mpg_group *g, const mpg_p2p_op *op, int i) {
  if (op->kind != MPG_P2P_SEND && op->kind != MPG_P2P_RECV)
    return mpg__fail(MPG_ERR_INVALID,
                     FN " on %s: ops[%d].kind is %d, expected MPG_P2P_SEND (0) or "
                     "MPG_P2P_RECV (1)",
                     MPG__GROUP_LABEL(g), i, (int)op->kind);
  const char *dir = op->kind == MPG_P2P_SEND ? "send" : "recv";
  if (op->peer < 0 || op->peer >= g->size || op->peer == g->position)
    return mpg__fail(MPG_ERR_INVALID,
                     FN " on %s: ops[%d] (%s): peer %d is not another member "
                     "(positions 0..%d, this rank is %d)",
                     MPG__GROUP_LABEL(g), i, dir, op->peer, g->size - 1, g->position);
  if ((unsigned)op->dtype >= MPG_DTYPE_COUNT)
    return mpg__fail(MPG_ERR_INVALID, FN " on %s: ops[%d] (%s): unknown dtype %d",
                     MPG__GROUP_LABEL(g), i, dir, (int)op->dtype);
  if (op->count > SIZE_MAX / mpg__dtype_size(op->dtype))
    return mpg__fail(MPG_ERR_RANGE,
                     FN " on %s: ops[%d] (%s): count %zu of %s overflows size_t bytes",
                     MPG__GROUP_LABEL(g), i, dir, op->count, mpg_dtype_name(op->dtype));
  if (op->count > 0 && !op->buf)
    return mpg__fail(MPG_ERR_INVALID, FN " on %s: ops[%d] (%s): buf is NULL for %zu "
                     "elements", MPG__GROUP_LABEL(g), i, dir, op->count);
  return MPG_OK;
}

/* The operations as backend calls: the receives first, then the sends,
 * each direction in the caller's order. */
static void to_list(const mpg_p2p_op *ops, int n, void *stream, mpg__coll *list) {
  int k = 0;
  for (int pass = 0; pass < 2; pass++) {
    mpg_p2p_kind want = pass == 0 ? MPG_P2P_RECV : MPG_P2P_SEND;
    for (int i = 0; i < n; i++) {
      const mpg_p2p_op *op = &ops[i];
      if (op->kind != want) continue;
      int send = op->kind == MPG_P2P_SEND;
      mpg__coll c = {send ? MPG__SEND : MPG__RECV, send ? op->buf : NULL,
                     send ? NULL : op->buf, op->count, op->dtype, MPG_OP_SUM, 1.0, 0,
                     op->peer, stream, 0};
      list[k++] = c;
    }
  }
}

/* Wait for the posted requests (reqs, or the single `one` when reqs is
 * NULL), or hand them out as one work handle.  Takes reqs. */
static mpg_status hand_out(mpg_group *g, mpg__req *one, mpg__req **reqs, int n,
                           double deadline, mpg_work **work, const char *fn) {
  mpg__req **list = reqs ? reqs : &one;
  mpg_work *w = work ? calloc(1, sizeof *w) : NULL;
  if (!w) {
    /* Blocking, or no memory for the handle: finish the batch here rather
     * than lose it. */
    mpg_status st =
        mpg__group_finish(g, &g->ctx->ops->transport, list, n, deadline, fn, MPG_OK, 0);
    free(reqs);
    if (st || !work) return st;
    return mpg__fail(MPG_ERR_NOMEM, "%s on %s: out of memory for the work handle "
                     "(the %d operations completed)", fn, MPG__GROUP_LABEL(g), n);
  }
  w->group = g;
  w->op.kind = -1; /* several operations: the messages name the group */
  w->ops = &g->ctx->ops->transport;
  w->req = one;
  w->reqs = reqs;
  w->nreq = n;
  w->deadline = deadline;
  *work = w;
  return MPG_OK;
}

/* Post list[0..n) one by one.  After a failed post the requests already
 * posted are waited for (they need only the peers' operations, not the
 * missing one) or, after a timeout or abort, fail at once; then they are
 * freed and the failure is returned. */
static mpg_status post_each(mpg_group *g, const mpg__coll *list, int n, double deadline,
                            mpg__req **reqs, const char *fn) {
  const struct mpg__backend_ops *ops = g->ctx->ops;
  int posted = 0;
  mpg_status st = MPG_OK;
  while (posted < n && !(st = ops->post(g->comm, &list[posted], &reqs[posted]))) posted++;
  if (!st) return MPG_OK;
  st = mpg__group_on_failure(g, fn, st);
  mpg__saved_error why;
  mpg__error_save(&why);
  (void)mpg__group_finish(g, &g->ctx->ops->transport, reqs, posted, deadline, fn, MPG_OK, 0);
  return mpg__error_restore(st, &why);
}

/* mpg_p2p_batch with g claimed. */
static mpg_status p2p_batch(mpg_group *g, const mpg_p2p_op *ops, int n, void *stream,
                            mpg_work **work) {
  if (n < 0)
    return mpg__fail(MPG_ERR_INVALID, FN " on %s: n is %d, expected 0 or more", MPG__GROUP_LABEL(g),
                     n);
  if (n > 0 && !ops)
    return mpg__fail(MPG_ERR_INVALID, FN " on %s: ops is NULL for n = %d operations",
                     MPG__GROUP_LABEL(g), n);
  mpg_status st;
  for (int i = 0; i < n; i++)
    if ((st = check_op(g, &ops[i], i))) return st;
  if (n == 0) return MPG_OK;
  /* A size-1 group has no peer: check_op refused every operation. */
  mpg__coll *list = malloc((size_t)n * sizeof *list);
  if (!list)
    return mpg__fail(MPG_ERR_NOMEM, FN " on %s: out of memory for %d operations",
                     MPG__GROUP_LABEL(g), n);
  to_list(ops, n, stream, list);
  mpg__trace_mark mark = mpg__trace_begin_batch(g, list, n); /* the flight recorder */
  st = mpg__group_ready(g, FN);
  if (!st && !work) mpg__trace_posted(&mark); /* blocking: it starts now */
  if (!st) st = mpg__group_post_p2p(g, list, n, FN, work);
  if (!st && work && *work) mpg__trace_posted(&mark);
  mpg__trace_hand(&mark, st, work);
  free(list);
  return st;
}

mpg_status mpg_p2p_batch(mpg_group *group, const mpg_p2p_op *ops, int n, void *stream,
                         mpg_work **work) {
  if (work) *work = NULL;
  if (!group) return mpg__fail(MPG_ERR_INVALID, FN ": group is NULL");
  mpg_status st = mpg__group_claim(group, FN);
  if (st) return st;
  st = p2p_batch(group, ops, n, stream, work);
  mpg__group_release(group);
  return st;
}

mpg_status mpg__group_post_p2p(mpg_group *g, const mpg__coll *list, int n, const char *fn,
                               mpg_work **work) {
  mpg_ctx *ctx = g->ctx;
  mpg__req **reqs = ctx->ops->post_batch ? NULL : calloc((size_t)n, sizeof *reqs);
  if (!ctx->ops->post_batch && !reqs)
    return mpg__fail(MPG_ERR_NOMEM, "%s on %s: out of memory for %d operations", fn,
                     MPG__GROUP_LABEL(g), n);
  double deadline = mpg__now() + ctx->timeout_s;
  mpg__req *one = NULL;
  mpg_status st = ctx->ops->post_batch ? ctx->ops->post_batch(g->comm, list, n, &one)
                                       : post_each(g, list, n, deadline, reqs, fn);
  if (st) {
    free(reqs);
    return ctx->ops->post_batch ? mpg__group_on_failure(g, fn, st) : st;
  }
  return hand_out(g, one, reqs, reqs ? n : 1, deadline, work, fn);
}
