/* What every part of the groups layer may need of the whole context: its
 * transports (attaching and detaching them, aborting every one of them
 * the same way, tearing a group's or the context's down: transport.h's
 * rules), and running the library's own setup collectives (host buffers,
 * staged through the backend's memory when its collectives need it).
 * Calls nothing else of this layer but issuer.c, and the transports only
 * through their tables, so every part (ctx.c, group.c, coll.c, shm/) may
 * use it.  See core.h. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"

/* ------------------------------------------------------------------ */
/* Transports: attach, detach, abort, teardown (transport.h's rules)   */
/* ------------------------------------------------------------------ */

/* Put t (its ops and comm set) at the head of *list, under the context's
 * transport lock; a transport attached to an aborted context is aborted
 * at once (mpg__ctx_abort_all walked the lists before it came). */
static void attach(mpg_ctx *ctx, mpg__transport **list, mpg__transport *t) {
  pthread_mutex_lock(&ctx->transport_lock);
  t->next = *list;
  *list = t;
  int reason = atomic_load(&ctx->aborted);
  if (reason) t->ops->abort_comm(t->comm, (mpg_status)reason);
  pthread_mutex_unlock(&ctx->transport_lock);
}

/* Take t out of *list (nothing when it is not there). */
static void detach(mpg_ctx *ctx, mpg__transport **list, mpg__transport *t) {
  pthread_mutex_lock(&ctx->transport_lock);
  for (mpg__transport **at = list; *at; at = &(*at)->next)
    if (*at == t) {
      *at = t->next;
      break;
    }
  t->next = NULL;
  pthread_mutex_unlock(&ctx->transport_lock);
}

void mpg__group_attach(mpg_group *g, mpg__transport *t) {
  attach(g->ctx, &g->transports, t);
}

void mpg__group_detach(mpg_group *g, mpg__transport *t) {
  detach(g->ctx, &g->transports, t);
}

void mpg__ctx_attach(mpg_ctx *ctx, mpg__transport *t) { attach(ctx, &ctx->transports, t); }

void mpg__ctx_detach(mpg_ctx *ctx, mpg__transport *t) { detach(ctx, &ctx->transports, t); }

void mpg__ctx_add_group(mpg_ctx *ctx, mpg_group *g) {
  pthread_mutex_lock(&ctx->transport_lock);
  g->next = ctx->extra;
  ctx->extra = g;
  pthread_mutex_unlock(&ctx->transport_lock);
}

/* The tables with abort_comms seen so far (abort_lists), at most this many
 * distinct ones; more are aborted one by one. */
#define TABLES 8

/* Abort every transport of the lists with `reason`, the same way for
 * every kind: those of tables that abort one at a time first, in list
 * order (each list newest first: a group's channel and segments before
 * its communicator, peers may wait in them), then, for each table with
 * abort_comms, all of that table's transports of all the lists in one
 * call (nccl: every communicator of the context together).  The caller
 * holds the context's transport lock. */
static void abort_lists(mpg__transport *const *lists, int nlists, mpg_status reason) {
  int total = 0;
  for (int l = 0; l < nlists; l++)
    for (mpg__transport *t = lists[l]; t; t = t->next) {
      if (t->ops->abort_comms) total++;
      else t->ops->abort_comm(t->comm, reason);
    }
  if (!total) return;
  mpg__comm *stack[64], **comms = total <= 64 ? stack : malloc(sizeof *comms * (size_t)total);
  const struct mpg__transport_ops *done[TABLES];
  int ndone = 0;
  for (int l = 0; l < nlists; l++)
    for (mpg__transport *t = lists[l]; t; t = t->next) {
      const struct mpg__transport_ops *ops = t->ops;
      int seen = 0;
      for (int i = 0; i < ndone && !seen; i++) seen = done[i] == ops;
      if (!ops->abort_comms || seen) continue;
      if (!comms || ndone == TABLES) {
        /* Out of memory for the list (or of table slots): one by one. */
        ops->abort_comm(t->comm, reason);
        continue;
      }
      done[ndone++] = ops;
      int n = 0;
      for (int m = l; m < nlists; m++)
        for (mpg__transport *u = m == l ? t : lists[m]; u; u = u->next)
          if (u->ops == ops) comms[n++] = u->comm;
      ops->abort_comms(comms, n, reason);
    }
  if (comms != stack) free(comms);
}

void mpg__group_abort(mpg_group *g, mpg_status reason) {
  pthread_mutex_lock(&g->ctx->transport_lock);
  abort_lists(&g->transports, 1, reason);
  pthread_mutex_unlock(&g->ctx->transport_lock);
}

/* Detach and destroy every transport of *list, newest first, keeping the
 * first error (and its message). */
static mpg_status teardown(mpg_ctx *ctx, mpg__transport **list) {
  mpg_status first = MPG_OK;
  mpg__saved_error why;
  for (;;) {
    pthread_mutex_lock(&ctx->transport_lock);
    mpg__transport *t = *list;
    if (t) *list = t->next;
    pthread_mutex_unlock(&ctx->transport_lock);
    if (!t) break;
    t->next = NULL;
    mpg_status st = t->ops->destroy(t->comm); /* may free t */
    if (st && !first) {
      first = st;
      mpg__error_save(&why);
    }
  }
  return first ? mpg__error_restore(first, &why) : MPG_OK;
}

mpg_status mpg__group_teardown(mpg_group *g) {
  if (!g->ctx) return MPG_OK; /* never made (a context that failed early) */
  mpg_status st = teardown(g->ctx, &g->transports);
  g->comm = NULL;
  return st;
}

mpg_status mpg__ctx_teardown(mpg_ctx *ctx) { return teardown(ctx, &ctx->transports); }

void mpg__ctx_abort_all(mpg_ctx *ctx, mpg_status reason) {
  pthread_mutex_lock(&ctx->transport_lock);
  int healthy = MPG_OK;
  if (!atomic_compare_exchange_strong(&ctx->aborted, &healthy, (int)reason)) {
    pthread_mutex_unlock(&ctx->transport_lock);
    return;
  }
  /* Every transport of the context: the groups' lists, the context's own
   * (the world's communicators) last. */
  int cap = ctx->nsets + 1;
  for (mpg_group *g = ctx->extra; g; g = g->next) cap++;
  mpg__transport *stack[64], **lists = cap <= 64 ? stack : malloc(sizeof *lists * (size_t)cap);
  if (lists) {
    int n = 0;
    for (int s = 0; s < ctx->nsets; s++) lists[n++] = ctx->groups[s].transports;
    for (mpg_group *g = ctx->extra; g; g = g->next) lists[n++] = g->transports;
    lists[n++] = ctx->transports;
    abort_lists(lists, n, reason);
  } else {
    /* Out of memory for the lists: each list on its own. */
    for (int s = 0; s < ctx->nsets; s++) abort_lists(&ctx->groups[s].transports, 1, reason);
    for (mpg_group *g = ctx->extra; g; g = g->next) abort_lists(&g->transports, 1, reason);
    abort_lists(&ctx->transports, 1, reason);
  }
  if (lists != stack) free(lists);
  pthread_mutex_unlock(&ctx->transport_lock);
  mpg__log(1, "rank %d: context aborted (%s)", ctx->rank, mpg_status_name(reason));
}

/* ------------------------------------------------------------------ */
/* Setup collectives                                                   */
/* ------------------------------------------------------------------ */

/* Run one operation on a communicator to completion within the timeout. */
static mpg_status run_on(mpg_ctx *ctx, mpg__comm *comm, const mpg__coll *c) {
  mpg__req *req = NULL;
  mpg_status st = ctx->ops->post(comm, c, &req);
  if (st) return st;
  st = ctx->ops->wait(req, mpg__now() + ctx->timeout_s);
  if (st) mpg__ctx_abort_all(ctx, st == MPG_ERR_TIMEOUT ? st : MPG_ERR_ABORTED);
  ctx->ops->req_free(req);
  return st;
}

static mpg_status setup_coll(mpg_ctx *ctx, mpg__comm *comm, int members,
                             const mpg__coll *c);

mpg_status mpg__ctx_setup_coll(mpg_ctx *ctx, mpg__comm *comm, int members,
                               const mpg__coll *c) {
  /* The library's own collectives (agreement, lazy groups, placement, the
   * sync's layout check, the issue-order check) issue too: nccl's issuing
   * thread only. */
  mpg_status st = mpg__ctx_check_issuer(ctx, "a setup collective", NULL);
  if (st) return st;
  /* Any failure aborts the context, a failed post or staging included: the
   * peers may have posted this collective, and this rank's next one would
   * meet theirs (a wrong result, MPI_ERR_TRUNCATE, or a hang on nccl). */
  st = setup_coll(ctx, comm, members, c);
  if (st && !atomic_load(&ctx->aborted)) {
    mpg__saved_error why;
    mpg__error_save(&why);
    mpg__ctx_abort_all(ctx, st == MPG_ERR_TIMEOUT ? st : MPG_ERR_ABORTED);
    (void)mpg__error_restore(st, &why);
  }
  return st;
}

static mpg_status setup_coll(mpg_ctx *ctx, mpg__comm *comm, int members,
                             const mpg__coll *c) {
  if (c->kind == MPG__BARRIER || !ctx->ops->mem_copy || !ctx->ops->mem_alloc)
    return run_on(ctx, comm, c);
  /* NCCL reads and writes device (or registered, or managed) memory only;
   * host buffers go through a buffer of the backend, in and out. */
  size_t es = mpg__dtype_size(c->dtype), one = c->count * es;
  size_t all = one * (size_t)(members > 0 ? members : 1);
  size_t in = one, out = one;
  if (c->kind == MPG__ALL_GATHER) out = all;
  if (c->kind == MPG__REDUCE_SCATTER) in = all;
  void *dev = NULL;
  mpg_status st = ctx->ops->mem_alloc(ctx->world_comm, in + out, 0, &dev);
  if (st) return st;
  mpg__coll k = *c;
  k.send = dev;
  k.recv = (char *)dev + in;
  if ((st = ctx->ops->mem_copy(ctx->world_comm, dev, c->send ? c->send : c->recv, in)) ||
      (st = run_on(ctx, comm, &k)) ||
      (st = ctx->ops->mem_copy(ctx->world_comm, c->recv, k.recv, out))) {
    mpg__saved_error why;
    mpg__error_save(&why);
    (void)ctx->ops->mem_free(ctx->world_comm, dev);
    return mpg__error_restore(st, &why);
  }
  return ctx->ops->mem_free(ctx->world_comm, dev);
}
