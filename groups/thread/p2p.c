/* Point-to-point in the thread backend: send and receive through one inbox
 * per member of the group.  Send copies into a message in the receiver's
 * inbox (or straight into an already posted receive) and completes at
 * once; receives match messages from the same peer in order (layer: above
 * group.c, below req.c).
 *
 * Back-pressure: an inbox holds at most inbox_msgs unreceived messages
 * and inbox_bytes bytes (an empty inbox takes one message of any size;
 * the communicator's limits, MESHPG_THREAD_INBOX_MSGS and
 * MESHPG_THREAD_INBOX_BYTES as mpg_ctx_create read them, 1024 and
 * 256 MiB by default).  A send to a full inbox waits, within the group's
 * timeout, until the receiver takes a message, then fails with
 * MPG_ERR_TIMEOUT. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "thread_internal.h"


/* Deliver message bytes to a posted receive; sets its status. */
static void deliver(mpg__req *r, const void *data, size_t bytes, size_t count,
                    mpg_dtype dtype, int src) {
  size_t want = r->coll.count * mpg__dtype_size(r->coll.dtype);
  r->done = 1;
  r->op = NULL;
  if (bytes != want) {
    r->status = MPG_ERR_INVALID;
    snprintf(r->msg, sizeof r->msg,
             "recv(count %zu, %s, peer %d) got a message of %zu bytes "
             "(count %zu, %s) from position %d: %zu bytes expected",
             r->coll.count, mpg_dtype_name(r->coll.dtype), r->coll.peer, bytes,
             count, mpg_dtype_name(dtype), src, want);
    return;
  }
  r->status = MPG_OK;
  if (bytes) memcpy(r->coll.recv, data, bytes);
}

void mpg__thread_unlink_recv(tgroup *g, mpg__req *req) {
  tinbox *box = &g->inbox[req->pos];
  mpg__req *prev = NULL, *r = box->rhead;
  while (r && r != req) {
    prev = r;
    r = r->next;
  }
  if (!r) return;
  if (prev)
    prev->next = r->next;
  else
    box->rhead = r->next;
  if (box->rtail == r) box->rtail = prev;
  r->next = NULL;
}

mpg_status mpg__thread_p2p_post(mpg__comm *cm, mpg__req *req) {
  tgroup *g = cm->g;
  const mpg__coll *c = &req->coll;
  size_t bytes = c->count * mpg__dtype_size(c->dtype);
  if (c->peer < 0 || c->peer >= g->size)
    return mpg__fail(MPG_ERR_INVALID,
                     "thread backend: rank %d (position %d of group %s): %s: peer %d "
                     "is outside 0..%d",
                     cm->rank, cm->pos, g->name, mpg__thread_kind_name(req->kind), c->peer,
                     g->size - 1);
  /* A send copies before taking the lock (the message is its own). */
  tmsg *m = NULL;
  if (req->kind == MPG__SEND) {
    m = bytes <= SIZE_MAX - sizeof *m ? malloc(sizeof *m + bytes) : NULL;
    if (!m)
      return mpg__fail(MPG_ERR_NOMEM,
                       "thread backend: rank %d: out of memory for a %zu-byte message "
                       "on group %s", cm->rank, bytes, g->name);
    m->next = NULL;
    m->src = cm->pos;
    m->count = c->count;
    m->dtype = c->dtype;
    m->bytes = bytes;
    if (bytes) memcpy(m->data, c->send, bytes);
  }
  pthread_mutex_lock(&g->mu);
  mpg__req *r = NULL;
  tinbox *box = req->kind == MPG__SEND ? &g->inbox[c->peer] : NULL;
  if (box && !g->aborted) {
    /* Back-pressure: a receive posted for this message takes it at once;
     * else wait (bounded by the timeout) for room in the peer's inbox. */
    size_t max_msgs = cm->inbox_msgs, max_bytes = cm->inbox_bytes;
    double deadline = 0;
    for (;;) {
      for (r = box->rhead; r && r->coll.peer != cm->pos; r = r->next) {
      }
      if (r || g->aborted) break;
      int full = box->nmsgs >= max_msgs ||
                 (box->nmsgs > 0 &&
                  bytes > max_bytes - (box->nbytes < max_bytes ? box->nbytes : max_bytes));
      if (!full) break;
      if (deadline == 0) deadline = mpg__now() + cm->timeout_s;
      if (mpg__now() >= deadline) {
        size_t nm = box->nmsgs, nb = box->nbytes;
        pthread_mutex_unlock(&g->mu);
        free(m);
        return mpg__fail(MPG_ERR_TIMEOUT,
                         "thread backend: rank %d (position %d of group %s): "
                         "send(count %zu, %s, peer %d): the peer's inbox is full "
                         "(%zu messages, %zu bytes not received; limits %zu "
                         "messages, %zu bytes) and it received nothing within "
                         "%.3g s",
                         cm->rank, cm->pos, g->name, c->count,
                         mpg_dtype_name(c->dtype), c->peer, nm, nb, max_msgs,
                         max_bytes, cm->timeout_s);
      }
      mpg__thread_timed_wait(&g->cv, &g->mu, deadline);
    }
  }
  if (g->aborted) {
    char am[sizeof g->abort_msg];
    snprintf(am, sizeof am, "%s", g->abort_msg);
    pthread_mutex_unlock(&g->mu);
    free(m);
    return mpg__thread_fail_aborted(cm, req->kind, c, am);
  }
  if (req->owns_ref) g->refs++;
  if (req->kind == MPG__SEND) {
    if (r) { /* a receive is waiting: hand the data over directly */
      mpg__thread_unlink_recv(g, r);
      deliver(r, m->data, bytes, c->count, c->dtype, cm->pos);
      free(m);
      pthread_cond_broadcast(&g->cv);
    } else {
      box->nmsgs++;
      box->nbytes += bytes;
      if (box->tail)
        box->tail->next = m;
      else
        box->head = m;
      box->tail = m;
    }
    req->done = 1;
    req->status = MPG_OK;
  } else {
    box = &g->inbox[cm->pos];
    tmsg *prev = NULL, *mm = box->head;
    while (mm && mm->src != c->peer) {
      prev = mm;
      mm = mm->next;
    }
    if (mm) {
      if (prev)
        prev->next = mm->next;
      else
        box->head = mm->next;
      if (box->tail == mm) box->tail = prev;
      box->nmsgs--;
      box->nbytes -= mm->bytes;
      deliver(req, mm->data, mm->bytes, mm->count, mm->dtype, mm->src);
      free(mm);
      pthread_cond_broadcast(&g->cv); /* a sender may wait for room */
    } else {
      req->next = NULL;
      if (box->rtail)
        box->rtail->next = req;
      else
        box->rhead = req;
      box->rtail = req;
      pthread_cond_broadcast(&g->cv); /* a sender may wait for this receive */
    }
  }
  pthread_mutex_unlock(&g->mu);
  return MPG_OK;
}
