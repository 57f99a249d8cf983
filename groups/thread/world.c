/* The communicator lifecycle of the thread backend (layer: the top, above
 * req.c): joining the world (the k-th world_init of every rank joins
 * generation k of the thread world), split, abort and destroy; and the
 * backend's function table. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "thread_internal.h"

static mpg_status t_world_init(const mpg__world_args *a, mpg__comm **out) {
  if (out) *out = NULL;
  if (!a || !out) return mpg__fail(MPG_ERR_INVALID, "thread backend: world_init: NULL argument");
  mpg_thread_world *w = a->thread_world;
  if (!w)
    return mpg__fail(MPG_ERR_INVALID,
                     "thread backend: world rank %d has no thread world (start the ranks "
                     "with mpg_thread_run)", a->rank);
  if (a->world_size != w->nranks)
    return mpg__fail(MPG_ERR_INVALID,
                     "thread backend: world rank %d: world size %d, but the thread world "
                     "runs %d ranks", a->rank, a->world_size, w->nranks);
  if (a->rank < 0 || a->rank >= w->nranks)
    return mpg__fail(MPG_ERR_INVALID,
                     "thread backend: world rank %d is outside the thread world of %d ranks",
                     a->rank, w->nranks);
  double timeout = a->timeout_s > 0 ? a->timeout_s : 600.0;
  double deadline = mpg__now() + timeout;
  mpg__comm *cm = calloc(1, sizeof *cm);
  if (!cm) return mpg__fail(MPG_ERR_NOMEM, "thread backend: world rank %d: out of memory", a->rank);

  pthread_mutex_lock(&w->mu);
  long gen = w->joins[a->rank];
  tgroup *g = w->gens;
  while (g && g->gen != gen) g = g->gen_next;
  if (!g) {
    char name[MPG_THREAD_NAME_LEN] = "world";
    if (gen > 0) snprintf(name, sizeof name, "world#%ld", gen);
    g = mpg__thread_group_new(w->nranks, name);
    if (!g) {
      pthread_mutex_unlock(&w->mu);
      free(cm);
      return mpg__fail(MPG_ERR_NOMEM, "thread backend: world rank %d: out of memory for the world",
                       a->rank);
    }
    for (int r = 0; r < w->nranks; r++) g->ranks[r] = r;
    g->gen = gen;
    g->refs = 1; /* the world's list */
    g->gen_next = w->gens;
    w->gens = g;
  }
  w->joins[a->rank]++;
  pthread_mutex_lock(&g->mu);
  g->refs++;
  if (++g->joined == w->nranks) {
    /* Everyone is in: the world no longer needs to find it. */
    tgroup **pp = &w->gens;
    while (*pp != g) pp = &(*pp)->gen_next;
    *pp = g->gen_next;
    g->refs--;
    pthread_cond_broadcast(&g->cv);
  }
  pthread_mutex_unlock(&w->mu);

  while (g->joined < w->nranks && !g->aborted && mpg__now() < deadline)
    mpg__thread_timed_wait(&g->cv, &g->mu, deadline);
  if (g->joined < w->nranks || g->aborted) {
    mpg_status st = g->aborted ? g->aborted : MPG_ERR_TIMEOUT;
    int joined = g->joined;
    char am[sizeof g->abort_msg];
    snprintf(am, sizeof am, "%s", g->abort_msg);
    /* Fail the other ranks of this generation now rather than at their own
     * deadlines. */
    if (!g->aborted) mpg__thread_group_abort_locked(g, a->rank, MPG_ERR_TIMEOUT, "world");
    mpg__thread_group_unref_unlock(g);
    free(cm);
    if (joined == w->nranks)
      return mpg__fail(st, "thread backend: world rank %d joining the world: %s", a->rank, am);
    /* Name the ranks that never came (the world lock orders before g's). */
    char missing[200] = "";
    size_t len = 0;
    int shown = 0;
    pthread_mutex_lock(&w->mu);
    for (int r = 0; r < w->nranks && len < sizeof missing; r++) {
      if (w->joins[r] > gen) continue;
      if (shown == 8) {
        snprintf(missing + len, sizeof missing - len, " ...");
        break;
      }
      len += (size_t)snprintf(missing + len, sizeof missing - len, " %d", r);
      shown++;
    }
    pthread_mutex_unlock(&w->mu);
    return mpg__fail(st,
                     "thread backend: world rank %d gave up on the world after %.3g s: %d of "
                     "%d ranks joined; missing world ranks:%s",
                     a->rank, timeout, joined, w->nranks, shown ? missing : " (late)");
  }
  pthread_mutex_unlock(&g->mu);
  cm->g = g;
  cm->pos = a->rank;
  cm->rank = a->rank;
  snprintf(cm->label, sizeof cm->label, "world");
  cm->timeout_s = timeout;
  cm->inbox_msgs = a->settings ? a->settings->thread_inbox_msgs : 1024;
  cm->inbox_bytes = a->settings ? a->settings->thread_inbox_bytes : (size_t)256 << 20;
  mpg__log(2, "thread: rank %d joined %s of %d ranks", a->rank, g->name, w->nranks);
  *out = cm;
  return MPG_OK;
}

/* Split: deposit a split request (on this stack) as the parent's next
 * collective, then wait for its outcome and the child group made for this
 * member (split.c). */
static mpg_status t_split(mpg__comm *parent, int color, int key, mpg__comm **out) {
  if (out) *out = NULL;
  if (!parent || !out) return mpg__fail(MPG_ERR_INVALID, "thread backend: split: NULL argument");
  tgroup *g = parent->g;
  /* Allocated up front so that nothing can fail once the child exists. */
  mpg__comm *mine = color >= 0 ? calloc(1, sizeof *mine) : NULL;
  if (color >= 0 && !mine)
    return mpg__fail(MPG_ERR_NOMEM, "thread backend: world rank %d: out of memory in split",
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
      mpg__thread_group_abort_locked(g, parent->rank, MPG_ERR_TIMEOUT, parent->label);
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
  snprintf(mine->label, sizeof mine->label, "%s", req.child->name); /* until set_label */
  mine->timeout_s = parent->timeout_s;
  mine->inbox_msgs = parent->inbox_msgs;
  mine->inbox_bytes = parent->inbox_bytes;
  *out = mine;
  return MPG_OK;
}

static void t_abort(mpg__comm *cm, mpg_status reason) {
  if (!cm) return;
  pthread_mutex_lock(&cm->g->mu);
  mpg__thread_group_abort_locked(cm->g, cm->rank, reason, cm->label);
  pthread_mutex_unlock(&cm->g->mu);
}

static mpg_status t_destroy(mpg__comm *cm) {
  if (!cm) return MPG_OK;
  tgroup *g = cm->g;
  pthread_mutex_lock(&g->mu);
  mpg__thread_group_unref_unlock(g);
  free(cm);
  return MPG_OK;
}

/* The member's own view: only its rank's thread reads it. */
static void t_set_timeout(mpg__comm *cm, double timeout_s) { cm->timeout_s = timeout_s; }
static void t_set_label(mpg__comm *cm, const char *label) {
  snprintf(cm->label, sizeof cm->label, "%s", label);
}
static void t_shape(const mpg__comm *cm, int *pos, int *size) {
  *pos = cm->pos;
  *size = cm->g->size;
}

/* The groups' ranks[] are thread-world ranks; the parent's give their
 * positions there.  Both groups' member lists are fixed at creation. */
static int t_members(const mpg__comm *cm, const mpg__comm *parent, int *pos) {
  const tgroup *g = cm->g, *p = parent->g;
  int top = 0;
  for (int i = 0; i < p->size; i++)
    if (p->ranks[i] >= top) top = p->ranks[i] + 1;
  int *at = malloc(sizeof *at * (size_t)(top ? top : 1));
  if (!at) return -1;
  for (int r = 0; r < top; r++) at[r] = -1;
  for (int i = 0; i < p->size; i++) at[p->ranks[i]] = i;
  for (int i = 0; i < g->size; i++)
    pos[i] = g->ranks[i] >= 0 && g->ranks[i] < top ? at[g->ranks[i]] : -1;
  free(at);
  return 0;
}

const struct mpg__backend_ops mpg__backend_thread = {
    .name = "thread",
    .world_init = t_world_init,
    .split = t_split,
    .post = mpg__thread_post,
    .test = mpg__thread_test,
    .wait = mpg__thread_wait,
    .req_free = mpg__thread_req_free,
    .abort_comm = t_abort,
    .destroy = t_destroy,
    .local = NULL,
    .set_timeout = t_set_timeout,
    .set_label = t_set_label,
    .comm_shape = t_shape,
    .comm_members = t_members,
    .host_shm = 1,
};
