/* The state that all members of one communicator share in the thread
 * backend (struct tgroup): creation, reference counts, abort and the
 * reduction temporaries; and the small helpers every file of the backend
 * uses: bounded waits on the group's condition variable and the text of
 * its errors (layer: the bottom; it calls no other file of the backend). */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "thread_internal.h"

/* ------------------------------------------------------------------------ */
/* Groups                                                                    */
/* ------------------------------------------------------------------------ */

tgroup *mpg__thread_group_new(int size, const char *name) {
  tgroup *g = calloc(1, sizeof *g);
  if (!g) return NULL;
  g->ranks = malloc(sizeof(int) * (size_t)size);
  g->inbox = calloc((size_t)size, sizeof(tinbox));
  if (!g->ranks || !g->inbox) goto fail;
  g->size = size;
  snprintf(g->name, sizeof g->name, "%s", name);
  if (pthread_mutex_init(&g->mu, NULL)) goto fail;
  pthread_condattr_t ca;
  if (pthread_condattr_init(&ca)) goto fail_mu;
  int bad = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) ||
            pthread_cond_init(&g->cv, &ca);
  pthread_condattr_destroy(&ca);
  if (bad) goto fail_mu;
  return g;
fail_mu:
  pthread_mutex_destroy(&g->mu);
fail:
  free(g->ranks);
  free(g->inbox);
  free(g);
  return NULL;
}

void mpg__thread_group_free(tgroup *g) {
  mpg__log(2, "thread: group %s (size %d) freed", g->name, g->size);
  for (top *op = g->ops, *next; op; op = next) {
    next = op->next;
    free(op);
  }
  for (int p = 0; p < g->size; p++)
    for (tmsg *m = g->inbox[p].head, *next; m; m = next) {
      next = m->next;
      free(m);
    }
  pthread_cond_destroy(&g->cv);
  pthread_mutex_destroy(&g->mu);
  free(g->scratch[0]);
  free(g->scratch[1]);
  free(g->ranks);
  free(g->inbox);
  free(g);
}

void mpg__thread_group_unref_unlock(tgroup *g) {
  int last = --g->refs == 0;
  pthread_mutex_unlock(&g->mu);
  if (last) mpg__thread_group_free(g);
}

void mpg__thread_group_abort_locked(tgroup *g, int by_rank, mpg_status reason,
                                    const char *label) {
  if (reason == MPG_OK) reason = MPG_ERR_ABORTED;
  if (!g->aborted) {
    g->aborted = reason;
    size_t len = (size_t)snprintf(g->abort_msg, sizeof g->abort_msg,
                                  "%s was aborted by world rank %d (%s)", label, by_rank,
                                  reason == MPG_ERR_TIMEOUT ? "timeout" : "abort");
    /* Who had not arrived at the oldest collective in flight: the desync
     * report every waiter of this group then shares. */
    const top *op = g->ops;
    if (op && op->arrived < g->size && len < sizeof g->abort_msg) {
      len += (size_t)snprintf(g->abort_msg + len, sizeof g->abort_msg - len,
                              "; its oldest %s in flight had %d of %d members, missing",
                              mpg__thread_kind_name(op->kind), op->arrived, g->size);
      int shown = 0;
      for (int p = 0; p < g->size && len < sizeof g->abort_msg; p++) {
        if (op->reqs[p]) continue;
        if (shown++ == 8) {
          snprintf(g->abort_msg + len, sizeof g->abort_msg - len, " ...");
          break;
        }
        len += (size_t)snprintf(g->abort_msg + len, sizeof g->abort_msg - len,
                                " position %d (world rank %d)", p, g->ranks[p]);
      }
    }
    mpg__log(2, "thread: rank %d aborts group %s (%s)", by_rank, g->name,
             mpg_status_name(reason));
  }
  pthread_cond_broadcast(&g->cv);
}

void *mpg__thread_group_scratch(tgroup *g, int which, size_t bytes) {
  if (bytes == 0) bytes = 1;
  if (g->scratch_cap[which] < bytes) {
    free(g->scratch[which]);
    g->scratch[which] = malloc(bytes);
    g->scratch_cap[which] = g->scratch[which] ? bytes : 0;
  }
  return g->scratch[which];
}

/* ------------------------------------------------------------------------ */
/* Waits and error text                                                      */
/* ------------------------------------------------------------------------ */

const char *mpg__thread_kind_name(int kind) {
  return kind == MPG_THREAD_KIND_SPLIT ? "split" : mpg__kind_name((mpg__coll_kind)kind);
}

void mpg__thread_describe(char *buf, size_t n, int kind, const mpg__coll *c) {
  const char *k = mpg__thread_kind_name(kind);
  const char *dt = mpg_dtype_name(c->dtype);
  switch (kind) {
    case MPG__ALL_REDUCE:
    case MPG__REDUCE_SCATTER:
      snprintf(buf, n, "%s (count %zu, %s, %s)", k, c->count, dt, mpg__op_name(c->op));
      break;
    case MPG__BROADCAST:
      snprintf(buf, n, "%s (count %zu, %s, root position %d)", k, c->count, dt, c->root);
      break;
    case MPG__ALL_GATHER:
      snprintf(buf, n, "%s (count %zu, %s)", k, c->count, dt);
      break;
    case MPG__SEND:
    case MPG__RECV:
      snprintf(buf, n, "%s (count %zu, %s, peer position %d)", k, c->count, dt, c->peer);
      break;
    default:
      snprintf(buf, n, "%s", k);
  }
}

void mpg__thread_timed_wait(pthread_cond_t *cv, pthread_mutex_t *mu, double deadline) {
  double now = mpg__now();
  /* Far or NaN deadlines: wake up now and then and let the caller loop. */
  if (!(deadline <= now + 3600.0)) deadline = now + 3600.0;
  struct timespec ts;
  ts.tv_sec = (time_t)deadline;
  long ns = (long)((deadline - (double)ts.tv_sec) * 1e9);
  if (ns < 0) ns = 0;
  if (ns > 999999999L) ns = 999999999L;
  ts.tv_nsec = ns;
  (void)pthread_cond_timedwait(cv, mu, &ts);
}

mpg_status mpg__thread_fail_req(const mpg__req *r, mpg_status st, const char *what) {
  (void)r;
  return mpg__fail(st, "thread backend: %s", what);
}

mpg_status mpg__thread_fail_aborted(const mpg__comm *cm, int kind, const mpg__coll *c,
                                    const char *abort_msg) {
  char what[96];
  mpg__thread_describe(what, sizeof what, kind, c);
  (void)cm;
  return mpg__fail(MPG_ERR_ABORTED, "thread backend: %s: %s", what, abort_msg);
}
