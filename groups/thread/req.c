/* Requests of the thread backend: post (to a collective or to the
 * mailboxes), test, wait with its deadline, and free; the outcome of a
 * request and the detail of what a timed-out one still lacks (layer: above
 * coll.c and p2p.c, below world.c). */
#include <stdio.h>
#include <stdlib.h>

#include "thread_internal.h"

void mpg__thread_pending_detail(const mpg__req *r, char *buf, size_t n) {
  tgroup *g = r->g;
  char what[96];
  mpg__thread_describe(what, sizeof what, r->kind, &r->coll);
  if (r->kind == MPG__RECV) {
    snprintf(buf, n, "%s timed out: no message from position %d (world rank %d) arrived",
             what, r->coll.peer, g->ranks[r->coll.peer]);
    return;
  }
  const top *op = r->op;
  if (!op) {
    snprintf(buf, n, "%s timed out", what);
    return;
  }
  size_t len = (size_t)snprintf(buf, n, "%s timed out: %d of %d members arrived; missing",
                                what, op->arrived, g->size);
  int shown = 0;
  for (int p = 0; p < g->size && len < n; p++) {
    if (op->reqs[p]) continue;
    if (shown == 8) {
      snprintf(buf + len, n - len, " ...");
      break;
    }
    len += (size_t)snprintf(buf + len, n - len, " position %d (world rank %d)", p,
                            g->ranks[p]);
    shown++;
  }
}

int mpg__thread_outcome_locked(mpg__req *r, mpg_status *st, char *msg, size_t n) {
  if (r->done) {
    *st = r->status;
    if (r->status) snprintf(msg, n, "%s", r->msg);
    return 1;
  }
  if (r->g->aborted) {
    char what[96];
    mpg__thread_describe(what, sizeof what, r->kind, &r->coll);
    *st = r->g->aborted;
    snprintf(msg, n, "%s: %s", what, r->g->abort_msg);
    return 1;
  }
  return -1;
}

void mpg__thread_detach_locked(mpg__req *r) {
  r->op->reqs[r->pos] = NULL;
  r->op->abandoned++;
  r->op = NULL;
}

mpg_status mpg__thread_test(mpg__req *req, int *done) {
  if (!req || !done) {
    if (done) *done = 1;
    return mpg__fail(MPG_ERR_INVALID, "thread backend: test: NULL argument");
  }
  mpg_status st = MPG_OK;
  char msg[MPG_THREAD_MSG_LEN + 128];
  pthread_mutex_lock(&req->g->mu);
  int r = mpg__thread_outcome_locked(req, &st, msg, sizeof msg);
  pthread_mutex_unlock(&req->g->mu);
  *done = r > 0;
  if (r > 0 && st) return mpg__thread_fail_req(req, st, msg);
  return MPG_OK;
}

mpg_status mpg__thread_wait(mpg__req *req, double deadline) {
  if (!req) return mpg__fail(MPG_ERR_INVALID, "thread backend: wait: NULL request");
  tgroup *g = req->g;
  mpg_status st = MPG_OK;
  char msg[MPG_THREAD_MSG_LEN + 128];
  pthread_mutex_lock(&g->mu);
  for (;;) {
    if (mpg__thread_outcome_locked(req, &st, msg, sizeof msg) > 0) break;
    if (mpg__now() >= deadline) {
      st = MPG_ERR_TIMEOUT;
      mpg__thread_pending_detail(req, msg, sizeof msg);
      break;
    }
    mpg__thread_timed_wait(&g->cv, &g->mu, deadline);
  }
  pthread_mutex_unlock(&g->mu);
  return st ? mpg__thread_fail_req(req, st, msg) : MPG_OK;
}

void mpg__thread_req_free(mpg__req *req) {
  if (!req) return;
  tgroup *g = req->g;
  pthread_mutex_lock(&g->mu);
  if (!req->done) {
    if (req->op)
      mpg__thread_detach_locked(req);
    else if (req->kind == MPG__RECV)
      mpg__thread_unlink_recv(g, req);
  }
  if (req->owns_ref)
    mpg__thread_group_unref_unlock(g);
  else
    pthread_mutex_unlock(&g->mu);
  free(req);
}

mpg_status mpg__thread_post(mpg__comm *cm, const mpg__coll *coll, mpg__req **out) {
  if (out) *out = NULL;
  if (!cm || !coll || !out)
    return mpg__fail(MPG_ERR_INVALID, "thread backend: post: NULL argument");
  if ((unsigned)coll->kind > MPG__RECV)
    return mpg__fail(MPG_ERR_INVALID, "thread backend: post: unknown operation %d",
                     (int)coll->kind);
  mpg__req *req = calloc(1, sizeof *req);
  if (!req)
    return mpg__fail(MPG_ERR_NOMEM, "thread backend: world rank %d: out of memory posting %s",
                     cm->rank, mpg__thread_kind_name((int)coll->kind));
  req->g = cm->g;
  req->pos = cm->pos;
  req->rank = cm->rank;
  req->kind = (int)coll->kind;
  req->coll = *coll;
  req->owns_ref = 1;
  mpg_status st = (coll->kind == MPG__SEND || coll->kind == MPG__RECV)
                      ? mpg__thread_p2p_post(cm, req)
                      : mpg__thread_coll_arrive(cm, req);
  if (st) {
    free(req);
    return st;
  }
  *out = req;
  return MPG_OK;
}
