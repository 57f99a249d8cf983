/* Split in the thread backend: a collective over the parent group (kind
 * MPG_THREAD_KIND_SPLIT, matched like any other in coll.c) whose last
 * arrival sorts the members by (colour, key, position) and makes one child
 * group per colour; each member then waits for its own child. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "thread_internal.h"

static void *xmalloc(size_t n) { return malloc(n ? n : 1); }

typedef struct skey {
  int color, key, pos;
} skey;

static int skey_cmp(const void *a, const void *b) {
  const skey *x = a, *y = b;
  if (x->color != y->color) return x->color < y->color ? -1 : 1;
  if (x->key != y->key) return x->key < y->key ? -1 : 1;
  return (x->pos > y->pos) - (x->pos < y->pos);
}

mpg_status mpg__thread_perform_split(tgroup *g, top *op) {
  int n = g->size, m = 0;
  skey *k = xmalloc(sizeof(skey) * (size_t)n);
  if (!k) return MPG_ERR_NOMEM;
  for (int p = 0; p < n; p++) {
    mpg__req *r = op->reqs[p];
    r->child = NULL;
    r->child_pos = -1;
    if (r->color >= 0) k[m++] = (skey){r->color, r->key, p};
  }
  qsort(k, (size_t)m, sizeof *k, skey_cmp);
  unsigned id = g->nsplits++;
  for (int i = 0; i < m;) {
    int j = i;
    while (j < m && k[j].color == k[i].color) j++;
    char name[MPG_THREAD_NAME_LEN];
    if (snprintf(name, sizeof name, "%s/s%uc%d", g->name, id, k[i].color) >=
        (int)sizeof name)
      name[sizeof name - 1] = '\0'; /* a long chain of splits: truncated */
    tgroup *child = mpg__thread_group_new(j - i, name);
    if (!child) {
      /* Undo the children made so far: nobody has seen them. */
      for (int q = 0; q < i; q++) {
        mpg__req *r = op->reqs[k[q].pos];
        if (r->child && r->child_pos == 0) mpg__thread_group_free(r->child);
      }
      for (int q = 0; q < i; q++) op->reqs[k[q].pos]->child = NULL;
      free(k);
      return MPG_ERR_NOMEM;
    }
    child->refs = j - i;
    for (int q = i; q < j; q++) {
      child->ranks[q - i] = g->ranks[k[q].pos];
      op->reqs[k[q].pos]->child = child;
      op->reqs[k[q].pos]->child_pos = q - i;
    }
    mpg__log(2, "thread: split #%u of %s: colour %d -> group %s of %d ranks", id,
             g->name, k[i].color, child->name, j - i);
    i = j;
  }
  free(k);
  return MPG_OK;
}

mpg_status mpg__thread_split(mpg__comm *parent, int color, int key, mpg__comm **out) {
  if (out) *out = NULL;
  if (!parent || !out) return mpg__fail(MPG_ERR_INVALID, "thread backend: split: NULL argument");
  tgroup *g = parent->g;
  /* Allocated up front so that nothing can fail once the child exists. */
  mpg__comm *mine = color >= 0 ? calloc(1, sizeof *mine) : NULL;
  if (color >= 0 && !mine)
    return mpg__fail(MPG_ERR_NOMEM, "thread backend: rank %d: out of memory in split",
                     parent->rank);
  mpg__req req;
  memset(&req, 0, sizeof req);
  req.g = g;
  req.pos = parent->pos;
  req.rank = parent->rank;
  req.kind = MPG_THREAD_KIND_SPLIT;
  req.coll.kind = MPG__BARRIER;
  req.color = color;
  req.key = key;
  req.owns_ref = 0; /* the parent handle keeps g alive */
  mpg_status st = mpg__thread_coll_arrive(parent, &req);
  if (st) {
    free(mine);
    return st;
  }
  double deadline = mpg__now() + parent->timeout_s;
  char msg[MPG_THREAD_MSG_LEN + 128];
  pthread_mutex_lock(&g->mu);
  for (;;) {
    if (mpg__thread_outcome_locked(&req, &st, msg, sizeof msg) > 0) break;
    if (mpg__now() >= deadline) {
      st = MPG_ERR_TIMEOUT;
      mpg__thread_pending_detail(&req, msg, sizeof msg);
      /* The request lives on this stack: detach it, and fail the split for
       * everyone at once rather than let each peer run into the timeout. */
      mpg__thread_detach_locked(&req);
      mpg__thread_group_abort_locked(g, parent->rank, MPG_ERR_TIMEOUT);
      break;
    }
    mpg__thread_timed_wait(&g->cv, &g->mu, deadline);
  }
  /* Aborted before completion: detach the stack request. */
  if (!req.done && req.op) mpg__thread_detach_locked(&req);
  pthread_mutex_unlock(&g->mu);
  if (st) {
    free(mine);
    return mpg__thread_fail_req(&req, st, msg);
  }
  if (!req.child) {
    free(mine);
    mpg__log(2, "thread: rank %d: split #%llu of %s: colour %d, no group", parent->rank,
             (unsigned long long)req.seq, g->name, color);
    return MPG_OK;
  }
  mine->g = req.child;
  mine->pos = req.child_pos;
  mine->rank = parent->rank;
  mine->timeout_s = parent->timeout_s;
  *out = mine;
  return MPG_OK;
}
