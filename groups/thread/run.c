/* mpg_thread_run for the thread backend: the thread world of N simulated
 * ranks, one thread each (their start gate, stack size and exit statuses),
 * and the world's release once every rank has returned (layer: above
 * group.c; only the application calls it). */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "thread_internal.h"

#define MAX_RANKS 4096
#define STACK_SIZE (256u * 1024u)

static void *rank_thread(void *p) {
  rank_slot *s = p;
  mpg_thread_world *w = s->world;
  pthread_mutex_lock(&w->mu);
  while (!w->go) pthread_cond_wait(&w->cv, &w->mu);
  int cancelled = w->cancelled;
  pthread_mutex_unlock(&w->mu);
  mpg_status st;
  if (cancelled) {
    st = mpg__fail(MPG_ERR_BACKEND,
                   "mpg_thread_run: rank %d did not run: not every rank's thread "
                   "could be started", s->rank);
  } else {
    mpg_init_opts opts = MPG_INIT_OPTS_INIT;
    opts.backend.name = MPG_BACKEND_THREAD;
    opts.rank = s->rank;
    opts.world_size = w->nranks;
    opts.local_rank = s->rank;
    opts.local_world_size = w->nranks;
    opts.backend.timeout_s = w->timeout_s;
    opts.thread_world = w;
    mpg__clear_error();
    st = w->main(&opts, w->arg);
  }
  s->status = st;
  if (st != MPG_OK) {
    /* The error buffer is thread-local: keep this thread's message. */
    const char *e = mpg_last_error();
    size_t n = strlen(e);
    s->msg = malloc(n + 1);
    if (s->msg) memcpy(s->msg, e, n + 1);
    pthread_mutex_lock(&w->mu);
    if (w->first_failed < 0) w->first_failed = s->rank;
    pthread_mutex_unlock(&w->mu);
  }
  return NULL;
}

static void world_free(mpg_thread_world *w) {
  /* Generations some rank never joined: drop the world's reference. */
  for (tgroup *g = w->gens, *next; g; g = next) {
    next = g->gen_next;
    pthread_mutex_lock(&g->mu);
    mpg__thread_group_unref_unlock(g);
  }
  if (w->slots)
    for (int r = 0; r < w->nranks; r++) free(w->slots[r].msg);
  pthread_cond_destroy(&w->cv);
  pthread_mutex_destroy(&w->mu);
  free(w->slots);
  free(w->joins);
  free(w);
}

mpg_status mpg_thread_run(int nranks, double timeout_s, mpg_rank_main main,
                          void *arg, mpg_status *statuses) {
  if (nranks < 1 || nranks > MAX_RANKS)
    return mpg__fail(MPG_ERR_INVALID, "mpg_thread_run: nranks is %d, expected 1..%d",
                     nranks, MAX_RANKS);
  if (!(timeout_s > 0))
    return mpg__fail(MPG_ERR_INVALID, "mpg_thread_run: timeout_s is %g, expected > 0",
                     timeout_s);
  if (!main) return mpg__fail(MPG_ERR_INVALID, "mpg_thread_run: main is NULL");

  mpg_thread_world *w = calloc(1, sizeof *w);
  if (!w) return mpg__fail(MPG_ERR_NOMEM, "mpg_thread_run: out of memory");
  w->nranks = nranks;
  w->timeout_s = timeout_s;
  w->main = main;
  w->arg = arg;
  w->first_failed = -1;
  w->joins = calloc((size_t)nranks, sizeof *w->joins);
  w->slots = calloc((size_t)nranks, sizeof *w->slots);
  if (!w->joins || !w->slots || pthread_mutex_init(&w->mu, NULL)) {
    free(w->joins);
    free(w->slots);
    free(w);
    return mpg__fail(MPG_ERR_NOMEM, "mpg_thread_run: out of memory for %d ranks", nranks);
  }
  if (pthread_cond_init(&w->cv, NULL)) {
    pthread_mutex_destroy(&w->mu);
    free(w->joins);
    free(w->slots);
    free(w);
    return mpg__fail(MPG_ERR_BACKEND, "mpg_thread_run: pthread_cond_init failed");
  }

  pthread_attr_t attr;
  int have_attr = pthread_attr_init(&attr) == 0;
  if (have_attr) {
    size_t stack = STACK_SIZE;
#ifdef PTHREAD_STACK_MIN
    if (stack < (size_t)PTHREAD_STACK_MIN) stack = (size_t)PTHREAD_STACK_MIN;
#endif
    (void)pthread_attr_setstacksize(&attr, stack);
  }
  for (int r = 0; r < nranks; r++) {
    w->slots[r].rank = r;
    w->slots[r].world = w;
    w->slots[r].status = MPG_ERR_BACKEND; /* until its thread says otherwise */
  }
  int started = 0, err = 0;
  for (int r = 0; r < nranks; r++) {
    rank_slot *s = &w->slots[r];
    err = pthread_create(&s->thread, have_attr ? &attr : NULL, rank_thread, s);
    if (err) break;
    s->started = 1;
    started++;
  }
  if (have_attr) pthread_attr_destroy(&attr);
  pthread_mutex_lock(&w->mu);
  w->cancelled = started < nranks;
  w->go = 1;
  pthread_cond_broadcast(&w->cv);
  pthread_mutex_unlock(&w->mu);
  for (int r = 0; r < started; r++) pthread_join(w->slots[r].thread, NULL);

  mpg_status result = MPG_OK;
  if (started < nranks) {
    result = mpg__fail(err == EAGAIN ? MPG_ERR_NOMEM : MPG_ERR_BACKEND,
                       "mpg_thread_run: could not start the thread of rank %d of %d: %s",
                       started, nranks, strerror(err));
  } else if (w->first_failed >= 0) {
    rank_slot *s = &w->slots[w->first_failed];
    result = s->msg ? mpg__fail(s->status, "%s", s->msg)
                    : mpg__fail(s->status, "rank %d failed (%s)", s->rank,
                                mpg_status_name(s->status));
  } else {
    mpg__clear_error();
  }
  if (statuses)
    for (int r = 0; r < nranks; r++) statuses[r] = w->slots[r].status;
  world_free(w);
  return result;
}
