/* Collectives of the thread backend: matching the members' calls into one
 * operation and performing it for everyone (layer: above group.c and
 * split.c, below req.c and world.c).
 *
 * Members number their collectives 0, 1, 2, ... on each communicator; the
 * n-th call of every member forms one operation (struct top), found by
 * sequence number in the group's list of operations in flight, so several
 * may be in flight at once.  Each member deposits its request (which holds
 * its buffers) and returns without waiting.  The member whose arrival
 * completes the operation checks that the calls match, performs the whole
 * operation for everyone under the group mutex (into temporaries first, so
 * in-place buffers are safe), marks every request done and wakes the
 * waiters.  Reductions run in position order, so results are deterministic;
 * f16/bf16 accumulate in f32 and round once at the end.  Memory per
 * operation is O(group size) plus the temporaries. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "thread_internal.h"

/* Back-pressure: a member that would open more than this many operations
 * in flight on one group waits (bounded) for the oldest to complete. */
#define MAX_INFLIGHT 1024

/* ------------------------------------------------------------------------ */
/* Performing an operation (caller holds g->mu; every request is present)   */
/* ------------------------------------------------------------------------ */

/* *out = op over members of their send buffers (total elements each), in
 * position order, through the library's one reduction kernel
 * (mpg__reduce_sources, groups/reduce.c: f16/bf16 in f32, rounded once;
 * AVG divided by n; each member's own scale for PREMUL_SUM).  The result
 * (dtype dt) lives in the group's scratch space 0; scratch 1 holds the
 * kernel's blocks and the sources and scales. */
static mpg_status reduce_all(tgroup *g, top *op, int n, size_t total,
                             mpg_dtype dt, mpg_op rop, void **out_acc) {
  size_t ptrs = sizeof(void *) * (size_t)n, scales = sizeof(double) * (size_t)n;
  void *out = mpg__thread_group_scratch(g, 0, total * mpg__dtype_size(dt));
  char *work = mpg__thread_group_scratch(g, 1, MPG__REDUCE_SCRATCH + ptrs + scales);
  if (!out || !work) return MPG_ERR_NOMEM;
  const void **src = (const void **)(void *)(work + MPG__REDUCE_SCRATCH);
  double *scale = (double *)(void *)(work + MPG__REDUCE_SCRATCH + ptrs);
  for (int p = 0; p < n; p++) {
    src[p] = op->reqs[p]->coll.send;
    scale[p] = op->reqs[p]->coll.scale;
  }
  mpg__reduce_job job = {dt, rop, 1.0, scale, n, src, n, &out, 1, NULL};
  mpg__reduce_sources(&job, 0, total, work);
  *out_acc = out;
  return MPG_OK;
}

static mpg_status perform(tgroup *g, top *op) {
  int n = g->size;
  const mpg__coll *c = &op->ref;
  size_t es = mpg__dtype_size(c->dtype);
  if (c->count == 0 && op->kind != MPG__BARRIER && op->kind != MPG_THREAD_KIND_SPLIT)
    return MPG_OK; /* nothing to move (buffers may be NULL) */
  switch (op->kind) {
    case MPG__ALL_REDUCE: {
      void *acc;
      if (reduce_all(g, op, n, c->count, c->dtype, c->op, &acc)) return MPG_ERR_NOMEM;
      for (int p = 0; p < n; p++) memcpy(op->reqs[p]->coll.recv, acc, c->count * es);
      return MPG_OK;
    }
    case MPG__REDUCE_SCATTER: {
      void *acc;
      if (reduce_all(g, op, n, c->count * (size_t)n, c->dtype, c->op, &acc))
        return MPG_ERR_NOMEM;
      for (int p = 0; p < n; p++)
        memcpy(op->reqs[p]->coll.recv, (char *)acc + (size_t)p * c->count * es,
               c->count * es);
      return MPG_OK;
    }
    case MPG__BROADCAST: {
      const void *src = op->reqs[c->root]->coll.recv;
      for (int p = 0; p < n; p++) {
        void *dst = op->reqs[p]->coll.recv;
        if (p != c->root && dst != src) memcpy(dst, src, c->count * es);
      }
      return MPG_OK;
    }
    case MPG__ALL_GATHER: {
      size_t blk = c->count * es;
      char *tmp = mpg__thread_group_scratch(g, 0, blk * (size_t)n);
      if (!tmp) return MPG_ERR_NOMEM;
      for (int p = 0; p < n; p++) memcpy(tmp + (size_t)p * blk, op->reqs[p]->coll.send, blk);
      for (int p = 0; p < n; p++) memcpy(op->reqs[p]->coll.recv, tmp, blk * (size_t)n);
      return MPG_OK;
    }
    case MPG__BARRIER:
      return MPG_OK;
    case MPG_THREAD_KIND_SPLIT:
      return mpg__thread_perform_split(g, op);
  }
  return MPG_ERR_INVALID;
}

static void unlink_op(tgroup *g, top *op) {
  top **pp = &g->ops, *prev = NULL;
  while (*pp && *pp != op) {
    prev = *pp;
    pp = &(*pp)->next;
  }
  if (!*pp) return;
  *pp = op->next;
  if (g->ops_tail == op) g->ops_tail = prev;
  g->nops--;
}

/* Every member has arrived: perform the operation and finish every request. */
static void complete(tgroup *g, top *op) {
  mpg_status st;
  char msg[MPG_THREAD_MSG_LEN], what[96];
  mpg__thread_describe(what, sizeof what, op->kind, &op->ref);
  msg[0] = '\0';
  if (op->abandoned) {
    st = MPG_ERR_ABORTED;
    snprintf(msg, sizeof msg, "%s: %d member(s) gave up on it before it completed", what,
             op->abandoned);
  } else if (op->bad) {
    st = MPG_ERR_INVALID;
    snprintf(msg, sizeof msg, "%s", op->bad_msg);
  } else {
    st = perform(g, op);
    if (st)
      snprintf(msg, sizeof msg, "%s: out of memory for its temporaries", what);
  }
  for (int p = 0; p < g->size; p++) {
    mpg__req *r = op->reqs[p];
    if (!r) continue;
    r->done = 1;
    r->status = st;
    r->op = NULL;
    if (st) snprintf(r->msg, sizeof r->msg, "%s", msg);
  }
  unlink_op(g, op);
  free(op);
  pthread_cond_broadcast(&g->cv);
}

/* ------------------------------------------------------------------------ */
/* Arrival                                                                   */
/* ------------------------------------------------------------------------ */

/* Does member `c` (kind) make the same call as the first arrival? */
static void check_match(tgroup *g, top *op, int pos, int kind, const mpg__coll *c) {
  if (op->bad) return;
  const mpg__coll *r = &op->ref;
  int same = kind == op->kind;
  if (same) switch (kind) {
      case MPG__ALL_REDUCE:
      case MPG__REDUCE_SCATTER:
        same = c->count == r->count && c->dtype == r->dtype && c->op == r->op;
        break;
      case MPG__BROADCAST:
        same = c->count == r->count && c->dtype == r->dtype && c->root == r->root;
        break;
      case MPG__ALL_GATHER:
        same = c->count == r->count && c->dtype == r->dtype;
        break;
      default:
        break;
    }
  if (same) return;
  char a[96], b[96];
  mpg__thread_describe(a, sizeof a, kind, c);
  mpg__thread_describe(b, sizeof b, op->kind, r);
  op->bad = 1;
  snprintf(op->bad_msg, sizeof op->bad_msg,
           "%s does not match across the members: position %d (world rank %d) called "
           "%s but position %d (world rank %d) called %s",
           mpg__thread_kind_name(op->kind), pos, g->ranks[pos], a, op->ref_pos, g->ranks[op->ref_pos], b);
}

mpg_status mpg__thread_coll_arrive(mpg__comm *cm, mpg__req *req) {
  tgroup *g = cm->g;
  char what[96];
  pthread_mutex_lock(&g->mu);
  if (g->aborted) {
    pthread_mutex_unlock(&g->mu);
    return mpg__thread_fail_aborted(cm, req->kind, &req->coll, g->abort_msg);
  }
  uint64_t seq = cm->seq;
  top *op = NULL;
  double deadline = 0;
  for (;;) {
    for (op = g->ops; op && op->seq != seq; op = op->next) {
    }
    if (op || g->nops < MAX_INFLIGHT || g->aborted) break;
    /* This member runs far ahead of a peer: wait for room (bounded). */
    if (deadline == 0) deadline = mpg__now() + cm->timeout_s;
    if (mpg__now() >= deadline) break;
    mpg__thread_timed_wait(&g->cv, &g->mu, deadline);
  }
  if (g->aborted || (!op && g->nops >= MAX_INFLIGHT)) {
    mpg_status st = g->aborted ? MPG_ERR_ABORTED : MPG_ERR_TIMEOUT;
    int nops = g->nops;
    char am[sizeof g->abort_msg];
    snprintf(am, sizeof am, "%s", g->abort_msg);
    pthread_mutex_unlock(&g->mu);
    if (st == MPG_ERR_ABORTED) return mpg__thread_fail_aborted(cm, req->kind, &req->coll, am);
    mpg__thread_describe(what, sizeof what, req->kind, &req->coll);
    return mpg__fail(st,
                     "thread backend: %s: %d operations already in flight on %s and no "
                     "peer caught up within %.3g s",
                     what, nops, cm->label, cm->timeout_s);
  }
  if (!op) {
    op = calloc(1, sizeof *op + sizeof(mpg__req *) * (size_t)g->size);
    if (!op) {
      pthread_mutex_unlock(&g->mu);
      return mpg__fail(MPG_ERR_NOMEM, "thread backend: world rank %d: out of memory posting "
                       "%s on %s", cm->rank, mpg__thread_kind_name(req->kind), cm->label);
    }
    op->seq = seq;
    op->kind = req->kind;
    op->ref = req->coll;
    op->ref_pos = cm->pos;
    if (g->ops_tail)
      g->ops_tail->next = op;
    else
      g->ops = op;
    g->ops_tail = op;
    g->nops++;
  } else {
    check_match(g, op, cm->pos, req->kind, &req->coll);
  }
  cm->seq++;
  req->seq = seq;
  req->op = op;
  op->reqs[cm->pos] = req;
  if (req->owns_ref) g->refs++;
  if (++op->arrived == g->size) complete(g, op);
  pthread_mutex_unlock(&g->mu);
  return MPG_OK;
}
