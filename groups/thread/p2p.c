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

/* A send's own copy of its bytes as a message from cm, made before taking the lock. */
static mpg_status msg_new(const mpg__comm *cm, const mpg__coll *coll, size_t bytes,
                          tmsg **out) {
  tmsg *msg = bytes <= SIZE_MAX - sizeof *msg ? malloc(sizeof *msg + bytes) : NULL;
  if (!msg)
    return mpg__fail(MPG_ERR_NOMEM,
                     "thread backend: world rank %d: out of memory for a %zu-byte message "
                     "on %s", cm->rank, bytes, cm->label);
  msg->next = NULL;
  msg->src = cm->pos;
  msg->count = coll->count;
  msg->dtype = coll->dtype;
  msg->bytes = bytes;
  if (bytes) memcpy(msg->data, coll->send, bytes);
  *out = msg;
  return MPG_OK;
}

/* The first receive posted in box for a message from position src, or NULL (g->mu held). */
static mpg__req *posted_recv(const tinbox *box, int src) {
  mpg__req *recv = box->rhead;
  while (recv && recv->coll.peer != src) recv = recv->next;
  return recv;
}

/* Whether box has no room for one more message of `bytes` under cm's limits (g->mu held). */
static int inbox_full(const mpg__comm *cm, const tinbox *box, size_t bytes) {
  size_t max_msgs = cm->inbox_msgs, max_bytes = cm->inbox_bytes;
  return box->nmsgs >= max_msgs ||
         (box->nmsgs > 0 &&
          bytes > max_bytes - (box->nbytes < max_bytes ? box->nbytes : max_bytes));
}

/* Wait for a receive posted in box, room in it or an abort; 0 at the timeout (g->mu held). */
static int wait_for_room_locked(const mpg__comm *cm, tinbox *box, size_t bytes,
                                mpg__req **waiting, size_t *queued_msgs,
                                size_t *queued_bytes) {
  tgroup *g = cm->g;
  double deadline = 0;
  for (;;) {
    *waiting = posted_recv(box, cm->pos);
    if (*waiting || g->aborted) return 1;
    if (!inbox_full(cm, box, bytes)) return 1;
    if (deadline == 0) deadline = mpg__now() + cm->timeout_s;
    if (mpg__now() >= deadline) {
      *queued_msgs = box->nmsgs;
      *queued_bytes = box->nbytes;
      return 0;
    }
    mpg__thread_timed_wait(&g->cv, &g->mu, deadline);
  }
}

/* The error of a send whose peer's inbox stayed full until the timeout. */
static mpg_status send_timeout(const mpg__comm *cm, const mpg__coll *coll, size_t queued_msgs,
                               size_t queued_bytes) {
  char what[96];
  mpg__thread_describe(what, sizeof what, MPG__SEND, coll);
  return mpg__fail(MPG_ERR_TIMEOUT,
                   "thread backend: %s: the inbox of position %d (world rank %d) is full "
                   "(%zu messages, %zu bytes not received; limits %zu "
                   "messages, %zu bytes) and it received nothing within "
                   "%.3g s",
                   what, coll->peer, cm->g->ranks[coll->peer], queued_msgs, queued_bytes,
                   cm->inbox_msgs, cm->inbox_bytes, cm->timeout_s);
}

/* Hand msg to the receive waiting for it, else queue it in box (g->mu held). */
static void send_locked(tgroup *g, tinbox *box, mpg__req *waiting, tmsg *msg) {
  if (waiting) { /* a receive is waiting: hand the data over directly */
    mpg__thread_unlink_recv(g, waiting);
    deliver(waiting, msg->data, msg->bytes, msg->count, msg->dtype, msg->src);
    free(msg);
    pthread_cond_broadcast(&g->cv);
    return;
  }
  box->nmsgs++;
  box->nbytes += msg->bytes;
  if (box->tail)
    box->tail->next = msg;
  else
    box->head = msg;
  box->tail = msg;
}

/* Complete req with the first message from its peer in box, else post it there (g->mu held). */
static void recv_locked(tgroup *g, tinbox *box, mpg__req *req) {
  tmsg *prev = NULL, *found = box->head;
  while (found && found->src != req->coll.peer) {
    prev = found;
    found = found->next;
  }
  if (found) {
    if (prev)
      prev->next = found->next;
    else
      box->head = found->next;
    if (box->tail == found) box->tail = prev;
    box->nmsgs--;
    box->nbytes -= found->bytes;
    deliver(req, found->data, found->bytes, found->count, found->dtype, found->src);
    free(found);
    pthread_cond_broadcast(&g->cv); /* a sender may wait for room */
    return;
  }
  req->next = NULL;
  if (box->rtail)
    box->rtail->next = req;
  else
    box->rhead = req;
  box->rtail = req;
  pthread_cond_broadcast(&g->cv); /* a sender may wait for this receive */
}

mpg_status mpg__thread_p2p_post(mpg__comm *cm, mpg__req *req) {
  tgroup *g = cm->g;
  const mpg__coll *coll = &req->coll;
  size_t bytes = coll->count * mpg__dtype_size(coll->dtype);
  if (coll->peer < 0 || coll->peer >= g->size)
    return mpg__fail(MPG_ERR_INVALID,
                     "thread backend: %s on %s: peer position %d is outside 0..%d",
                     mpg__thread_kind_name(req->kind), cm->label, coll->peer, g->size - 1);
  /* A send copies before taking the lock (the message is its own). */
  tmsg *msg = NULL;
  if (req->kind == MPG__SEND) {
    mpg_status st = msg_new(cm, coll, bytes, &msg);
    if (st != MPG_OK) return st;
  }
  pthread_mutex_lock(&g->mu);
  mpg__req *waiting = NULL; /* a receive posted for this send's message */
  tinbox *box = req->kind == MPG__SEND ? &g->inbox[coll->peer] : NULL;
  if (box && !g->aborted) {
    /* Back-pressure: a receive posted for this message takes it at once;
     * else wait (bounded by the timeout) for room in the peer's inbox. */
    size_t queued_msgs = 0, queued_bytes = 0;
    if (!wait_for_room_locked(cm, box, bytes, &waiting, &queued_msgs, &queued_bytes)) {
      pthread_mutex_unlock(&g->mu);
      free(msg);
      return send_timeout(cm, coll, queued_msgs, queued_bytes);
    }
  }
  if (g->aborted) {
    char abort_msg[sizeof g->abort_msg];
    snprintf(abort_msg, sizeof abort_msg, "%s", g->abort_msg);
    pthread_mutex_unlock(&g->mu);
    free(msg);
    return mpg__thread_fail_aborted(cm, req->kind, coll, abort_msg);
  }
  if (req->owns_ref) g->refs++;
  if (req->kind == MPG__SEND) {
    send_locked(g, box, waiting, msg);
    req->done = 1;
    req->status = MPG_OK;
  } else {
    recv_locked(g, &g->inbox[cm->pos], req);
  }
  pthread_mutex_unlock(&g->mu);
  return MPG_OK;
}
