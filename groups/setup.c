/* What every part of the groups layer may need of the whole context:
 * aborting it, and running the library's own setup collectives (host
 * buffers, staged through the backend's memory when its collectives need
 * it).  Calls nothing else of this layer, so ctx.c, group.c and coll.c may
 * all use it.  See ctx_internal.h. */
#include <stdlib.h>
#include <string.h>

#include "ctx_internal.h"

/* Give up g's all-to-all channel, if it has one (ctx_internal.h). */
static void abort_channel(mpg_group *g, mpg_status reason) {
  struct mpg__a2a *ch = g->a2a; /* then a2a_abort, set before it */
  if (ch) g->a2a_abort(ch, reason);
}

void mpg__ctx_abort_all(mpg_ctx *ctx, mpg_status reason) {
  int healthy = MPG_OK;
  if (!atomic_compare_exchange_strong(&ctx->aborted, &healthy, (int)reason)) return;
  /* Every communicator of the context, groups first, the world last. */
  int cap = ctx->nsets + 2, n = 0;
  for (mpg_group *g = ctx->extra; g; g = g->next) cap++;
  mpg__comm *stack[64], **comms = cap <= 64 ? stack : malloc(sizeof *comms * (size_t)cap);
  /* The groups' all-to-all channels first (peers may wait in them). */
  for (int s = 0; s < ctx->nsets; s++) abort_channel(&ctx->groups[s], reason);
  for (mpg_group *g = ctx->extra; g; g = g->next) abort_channel(g, reason);
  for (int s = 0; s < ctx->nsets; s++) {
    mpg_group *g = &ctx->groups[s];
    if (g->comm && g->comm != ctx->world_comm) {
      if (comms) comms[n++] = g->comm;
      else ctx->ops->abort_comm(g->comm, reason);
    }
  }
  for (mpg_group *g = ctx->extra; g; g = g->next)
    if (g->comm) {
      if (comms) comms[n++] = g->comm;
      else ctx->ops->abort_comm(g->comm, reason);
    }
  mpg__comm *last[2] = {ctx->world_comm, ctx->launch_comm};
  for (int i = 0; i < 2; i++)
    if (last[i]) {
      if (comms) comms[n++] = last[i];
      else ctx->ops->abort_comm(last[i], reason);
    }
  /* Out of memory for the list: each was aborted on its own above. */
  if (comms && ctx->ops->abort_comms) {
    ctx->ops->abort_comms(comms, n, reason);
  } else if (comms) {
    for (int i = 0; i < n; i++) ctx->ops->abort_comm(comms[i], reason);
  }
  if (comms != stack) free(comms);
  mpg__log(1, "rank %d: context aborted (%s)", ctx->rank, mpg_status_name(reason));
}

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
