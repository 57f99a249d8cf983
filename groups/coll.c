/* The public collectives and work handles: argument checks, size-1 groups
 * as local copies, the context's timeout, and abort on a failure after
 * the arguments were accepted (on_failure).  See core.h.
 *
 * Threads.  A group is used by one thread at a time: every call that
 * issues on it (here, p2p.c's mpg_p2p_batch, alltoall.c's all-to-alls,
 * coll_f32.c's variants through mpg__group_run, the host collectives of
 * sync/ and shm/ setup) claims the group's busy flag for the duration of
 * the call (mpg__group_claim), so that a second thread's call fails with
 * MPG_ERR_STATE, posting nothing, instead of running beside the first:
 * the calls of two threads cannot be in one order on every rank, so they
 * would meet the peers' calls in whatever order they happened to start
 * (issue 29: wrong sums, all MPG_OK).  Only overlapping calls are caught,
 * not two threads' calls that happen to alternate (docs/groups.md,
 * "Threads").  The claim ends when the call
 * returns, not when its work completes: one thread may keep several
 * operations of a group in flight.  mpg_work_test / mpg_work_wait claim
 * nothing: they post nothing, and the backends lock what they share with
 * a post.  The internal steps of a claimed call (mpg__group_post_p2p,
 * mpg__group_ready) claim nothing, so no call trips on its own claim.
 * groups/shm/engine.c claims for its posts too (the sync's node-local
 * reductions, which never reach the group's communicator), and a refusal
 * there aborts the segment, since the peers may have posted.
 * On nccl a context has one issuing thread (mpg__ctx_check_issuer below):
 * a claim from any other thread fails with MPG_ERR_STATE, alternating or
 * not. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"



/* The in-place convention, NCCL's, on every backend: an all-reduce is in
 * place when send == recv; an all-gather when send is this member's slot
 * of recv (send == recv + position * count); a reduce-scatter when recv is
 * this member's slot of send (recv == send + position * count).  Any other
 * overlap of the two buffers is refused: NCCL leaves it undefined. */
static mpg_status check_overlap(const mpg_group *g, const mpg__coll *c) {
  if (c->count == 0 || !c->send || !c->recv) return MPG_OK;
  if (c->kind != MPG__ALL_REDUCE && c->kind != MPG__ALL_GATHER &&
      c->kind != MPG__REDUCE_SCATTER)
    return MPG_OK;
  size_t one = c->count * mpg__dtype_size(c->dtype);
  size_t all = one * (size_t)(g->size > 0 ? g->size : 1);
  uintptr_t s = (uintptr_t)c->send, r = (uintptr_t)c->recv;
  size_t slen = c->kind == MPG__REDUCE_SCATTER ? all : one;
  size_t rlen = c->kind == MPG__ALL_GATHER ? all : one;
  if (s + slen <= r || r + rlen <= s) return MPG_OK; /* disjoint */
  size_t slot = one * (size_t)(g->position > 0 ? g->position : 0);
  const char *fn = mpg__kind_name(c->kind);
  switch (c->kind) {
    case MPG__ALL_REDUCE:
      if (s == r) return MPG_OK;
      return mpg__fail(MPG_ERR_INVALID,
                       "mpg_all_reduce on %s: send and recv overlap without being "
                       "the same buffer (recv = send %+td bytes); in place means send == recv",
                       MPG__GROUP_LABEL(g), (ptrdiff_t)(r - s));
    case MPG__ALL_GATHER:
      if (s == r + slot) return MPG_OK;
      return mpg__fail(MPG_ERR_INVALID,
                       "mpg_%s on %s: send overlaps recv at byte offset %td, but in "
                       "place means send == recv + position * count (position %d: byte "
                       "offset %zu)",
                       fn, MPG__GROUP_LABEL(g), (ptrdiff_t)(s - r), g->position, slot);
    default:
      if (r == s + slot) return MPG_OK;
      return mpg__fail(MPG_ERR_INVALID,
                       "mpg_%s on %s: recv overlaps send at byte offset %td, but in "
                       "place means recv == send + position * count (position %d: byte "
                       "offset %zu)",
                       fn, MPG__GROUP_LABEL(g), (ptrdiff_t)(r - s), g->position, slot);
  }
}

static mpg_status check_coll(const mpg_group *g, const mpg__coll *c) {
  mpg_status st;
  const char *fn = mpg__kind_name(c->kind);
  if (!g) return mpg__fail(MPG_ERR_INVALID, "mpg_%s: group is NULL", fn);
  if (c->kind == MPG__BARRIER) return MPG_OK;
  if ((unsigned)c->dtype >= MPG_DTYPE_COUNT)
    return mpg__fail(MPG_ERR_INVALID, "mpg_%s on %s: unknown dtype %d", fn,
                     MPG__GROUP_LABEL(g), (int)c->dtype);
  /* count x element size (x group size for the gathered / scattered side)
   * must fit in size_t: refuse before any buffer is touched. */
  size_t members = c->kind == MPG__ALL_GATHER || c->kind == MPG__REDUCE_SCATTER
                       ? (size_t)(g->size > 0 ? g->size : 1) : 1;
  if (c->count > SIZE_MAX / mpg__dtype_size(c->dtype) / members)
    return mpg__fail(MPG_ERR_RANGE,
                     "mpg_%s on %s: count %zu of %s x %zu member%s overflows "
                     "size_t bytes",
                     fn, MPG__GROUP_LABEL(g), c->count, mpg_dtype_name(c->dtype), members,
                     members == 1 ? "" : "s");
  int needs_send = c->kind == MPG__ALL_REDUCE || c->kind == MPG__ALL_GATHER ||
                   c->kind == MPG__REDUCE_SCATTER || c->kind == MPG__SEND;
  int needs_recv = c->kind != MPG__SEND;
  if (c->count > 0 && ((needs_send && !c->send) || (needs_recv && !c->recv)))
    return mpg__fail(MPG_ERR_INVALID, "mpg_%s on %s: %s buffer is NULL for %zu elements",
                     fn, MPG__GROUP_LABEL(g), needs_send && !c->send ? "send" : "receive",
                     c->count);
  if ((st = check_overlap(g, c))) return st;
  if (c->kind == MPG__ALL_REDUCE || c->kind == MPG__REDUCE_SCATTER) {
    if ((unsigned)c->op > MPG__OP_PREMUL_SUM)
      return mpg__fail(MPG_ERR_INVALID, "mpg_%s on %s: unknown op %d", fn,
                       MPG__GROUP_LABEL(g), (int)c->op);
    if (c->op == MPG__OP_PREMUL_SUM && !mpg__dtype_is_float(c->dtype))
      return mpg__fail(MPG_ERR_INVALID,
                       "mpg_%s on %s: a scaled sum needs a floating dtype, "
                       "found %s",
                       fn, MPG__GROUP_LABEL(g), mpg_dtype_name(c->dtype));
  }
  if (c->kind == MPG__BROADCAST && (c->root < 0 || c->root >= g->size))
    return mpg__fail(MPG_ERR_INVALID,
                     "mpg_broadcast on %s: root %d is outside 0..%d", MPG__GROUP_LABEL(g),
                     c->root, g->size - 1);
  if (c->kind == MPG__SEND || c->kind == MPG__RECV) {
    if (c->peer < 0 || c->peer >= g->size || c->peer == g->position)
      return mpg__fail(MPG_ERR_INVALID,
                       "mpg_%s on %s: peer %d is not another member "
                       "(positions 0..%d, this rank is %d)",
                       fn, MPG__GROUP_LABEL(g), c->peer, g->size - 1, g->position);
  }
  return MPG_OK;
}

/* Abort the context when an operation of a group failed after its
 * arguments were accepted: it timed out, was aborted, failed in the
 * backend, or could not be posted (out of memory, ...); and keep the
 * message, with the group in front: which group (name, index in its dim
 * set) and this rank's place in it; the backend's part says who had not
 * arrived, as far as it knows.  Every such failure aborts, because the
 * peers may have posted the same collective: a rank that failed to post
 * operation k and went on would pair its operation k + 1 with their k and
 * give them a wrong sum with MPG_OK; and NCCL requires ncclCommAbort
 * after an asynchronous error (its communicator cannot be used again).
 * Argument errors (MPG_ERR_INVALID, _RANGE) are caught before anything is
 * posted, the same on every rank that passed the same arguments, and abort
 * nothing; so do refusals that post nothing (MPG_ERR_STATE), though their
 * message gets the same names.
 *
 * Every failure is named here as the flight recorder's report names it
 * (issue 46, item 4): the operation c with its number on the group (its
 * GSEQ) and the group's label, "mpg_all_reduce: all_reduce #8 on tp[1]
 * (position 1 of 2, world rank 3): ..." (c NULL: the call and the group's
 * label); the backend's text follows. */
static mpg_status on_failure_op(mpg_group *g, const char *fn, const mpg__op_id *c,
                                mpg_status st) {
  if (st == MPG_OK) return st;
  int aborts = st != MPG_ERR_INVALID && st != MPG_ERR_RANGE && st != MPG_ERR_STATE;
  if (aborts) {
    mpg__saved_error why;
    mpg__error_save(&why);
    mpg__ctx_abort_all(g->ctx, st == MPG_ERR_TIMEOUT ? st : MPG_ERR_ABORTED);
    (void)mpg__error_restore(st, &why);
  }
  char what[256];
  mpg__group_op_label(g, c, what, sizeof what);
  st = mpg__fail_wrap(st, "%s%s%s (position %d of %d, world rank %d)", fn,
                      c && c->kind >= 0 ? ": " : " on ", what, g->position, g->size,
                      g->ctx->rank);
  if (aborts) mpg__trace_fault(g->ctx, st); /* the flight recorder's dump, once */
  return st;
}

static mpg_status on_failure(mpg_group *g, const char *fn, mpg_status st) {
  return on_failure_op(g, fn, NULL, st);
}

mpg_status mpg__group_on_failure(mpg_group *g, const char *fn, mpg_status st) {
  return on_failure(g, fn, st);
}

/* The earliest start and latest end the backend saw on the device for
 * req, folded into *t0 and *t1 (nccl; 0 when not known). */
static void device_times(const struct mpg__transport_ops *ops, const mpg__req *req,
                         double *t0, double *t1) {
  if (!ops->req_times) return;
  double a = 0, b = 0;
  ops->req_times(req, &a, &b);
  if (a > 0 && (!(*t0 > 0) || a < *t0)) *t0 = a;
  if (b > *t1) *t1 = b;
}

/* mpg__group_finish, naming c (NULL: several operations) in the messages. */
static mpg_status finish_op(mpg_group *g, const struct mpg__transport_ops *ops, mpg__req **reqs,
                            int n, double deadline, const char *fn, const mpg__op_id *c,
                            mpg_status failed, int skip) {
  mpg_status first = failed;
  mpg__saved_error why;
  if (failed) mpg__error_save(&why);
  double t0 = 0, t1 = 0; /* the device's times for the flight recorder */
  for (int i = 0; i < n; i++) {
    if (failed && i == skip) continue;
    mpg_status st = ops->wait(reqs[i], deadline);
    if (!st) {
      device_times(ops, reqs[i], &t0, &t1);
      continue;
    }
    st = on_failure_op(g, fn, c, st); /* abort before freeing a pending request */
    mpg__trace_fault(g->ctx, st); /* also a mismatch the members found */
    if (!first) {
      first = st;
      mpg__error_save(&why);
    }
  }
  for (int i = 0; i < n; i++) ops->req_free(reqs[i]);
  mpg__trace_device_times(t0, t1);
  return first ? mpg__error_restore(first, &why) : MPG_OK;
}

mpg_status mpg__group_finish(mpg_group *g, const struct mpg__transport_ops *ops,
                             mpg__req **reqs, int n, double deadline, const char *fn,
                             mpg_status failed, int skip) {
  return finish_op(g, ops, reqs, n, deadline, fn, NULL, failed, skip);
}

mpg_status mpg__group_ready_op(mpg_group *g, const char *fn, const mpg__op_id *c) {
  int reason = atomic_load(&g->ctx->aborted);
  if (reason) {
    char what[256];
    mpg__group_op_label(g, c, what, sizeof what);
    mpg_status st = mpg__fail(MPG_ERR_ABORTED, "%s%s%s (position %d of %d, world rank %d): "
                              "the context was aborted (%s)", fn,
                              c && c->kind >= 0 ? ": " : " on ", what,
                              g->position, g->size, g->ctx->rank,
                              mpg_status_name((mpg_status)reason));
    mpg__trace_fault(g->ctx, st); /* a rank that comes back after the others failed */
    return st;
  }
  mpg_status st = mpg__group_create(g->ctx, g);
  return st ? on_failure_op(g, fn, c, st) : MPG_OK;
}

mpg_status mpg__group_ready(mpg_group *g, const char *fn) {
  return mpg__group_ready_op(g, fn, NULL);
}

/* mpg__group_claim and mpg__group_release (core.h): the group's
 * busy flag, see the top of this file; on nccl first the issuing thread. */
mpg_status mpg__group_claim(mpg_group *g, const char *fn) {
  mpg_status st = mpg__ctx_check_issuer(g->ctx, fn, g->name);
  if (st) return st;
  int idle = 0;
  if (atomic_compare_exchange_strong_explicit(&g->busy, &idle, 1, memory_order_acquire,
                                              memory_order_relaxed))
    return MPG_OK;
  return mpg__fail(MPG_ERR_STATE,
                   "%s on %s (position %d of %d, world rank %d): "
                   "another call on this group has not returned yet; a group must not be "
                   "used from two threads at once (serialise the calls on one group and "
                   "issue them in the same order on every rank); nothing was posted",
                   fn, MPG__GROUP_LABEL(g), g->position, g->size, g->ctx->rank);
}

/* The release pairs with the next claim's acquire: the next caller, on
 * any thread, sees everything this call wrote. */
void mpg__group_release(mpg_group *g) {
  atomic_store_explicit(&g->busy, 0, memory_order_release);
}

/* Post c through ops on comm (g ready, two or more members) and hand out
 * its work, or (work NULL) wait for it.  Everything that can fail comes
 * before anything is posted (the handle too), so that a failure never
 * leaves an operation half handed out.  A failed post aborts the context
 * (on_failure, and with it every transport of the context); a transport
 * of another table than the context's backend (shm's segment) is aborted
 * first, with the reason, by its own table, since on_failure leaves the
 * context as it is for an argument error or a refusal while the peers may
 * have posted theirs on the segment. */
static mpg_status post_on(mpg_group *g, const struct mpg__transport_ops *ops, mpg__comm *comm,
                          const mpg__coll *c, mpg_work **work, const char *fn,
                          const mpg__trace_mark *mark, const mpg__op_id *id) {
  double deadline = mpg__now() + g->ctx->timeout_s;
  mpg__req *req = NULL;
  mpg_work *w = NULL;
  mpg_status st = MPG_OK;
  if (work && !(w = calloc(1, sizeof *w)))
    st = mpg__fail(MPG_ERR_NOMEM, "%s: out of memory for the work handle (nothing was "
                   "posted)", fn);
  if (!st) st = ops->post(comm, c, &req);
  if (st) {
    free(w);
    if (ops != &g->ctx->ops->transport) ops->abort_comm(comm, st);
    return on_failure_op(g, fn, id, st);
  }
  mpg__trace_posted(mark);
  if (!w) return finish_op(g, ops, &req, 1, deadline, fn, id, MPG_OK, 0);
  w->group = g;
  w->op = *id;
  w->ops = ops;
  w->req = req;
  w->deadline = deadline;
  w->status = MPG_OK;
  *work = w;
  return MPG_OK;
}

/* The flight recorder's record of c on g (trace.c), issued now; *id: c as
 * messages name it, with its number. */
static mpg__trace_mark trace_begin(mpg_group *g, const mpg__coll *c, mpg__op_id *id) {
  int p2p = c->kind == MPG__SEND || c->kind == MPG__RECV;
  int peer = c->kind == MPG__BROADCAST ? c->root : p2p ? c->peer : -1;
  mpg__trace_mark m = mpg__trace_begin(g, (int)c->kind, c->dtype, c->count, peer);
  id->kind = (int)c->kind;
  id->peer = p2p ? c->peer : -1;
  id->gseq = m.gseq;
  return m;
}

/* run() with g claimed. */
static mpg_status run_claimed(mpg_group *g, const mpg__coll *c, mpg_work **work,
                              const char *fn) {
  mpg_ctx *ctx = g->ctx;
  mpg_status st = check_coll(g, c);
  if (st) return st;
  mpg__op_id id;
  mpg__trace_mark mark = trace_begin(g, c, &id); /* before a wait for an abort or a split */
  st = mpg__group_ready_op(g, fn, &id);
  if (!st) {
    mpg__order_note(g, c); /* issue order (order.c): as issued, size-1 groups too */
    if (g->size == 1)
      st = ctx->ops->local ? ctx->ops->local(ctx->world_comm, c) : mpg__local_host(c);
    else
      st = post_on(g, &ctx->ops->transport, g->comm, c, work, fn, &mark, &id);
  }
  mpg__trace_hand(&mark, st, work);
  return st;
}

mpg_status mpg__group_run_on(mpg_group *g, const struct mpg__transport_ops *ops,
                             mpg__comm *comm, const mpg__coll *c, mpg_work **work,
                             const char *fn) {
  if (work) *work = NULL;
  mpg_status st = mpg__group_claim(g, fn);
  if (st) return st;
  st = check_coll(g, c);
  if (!st) {
    mpg__op_id id;
    mpg__trace_mark mark = trace_begin(g, c, &id);
    st = mpg__group_ready_op(g, fn, &id);
    if (!st) {
      mpg__order_note(g, c);
      st = post_on(g, ops, comm, c, work, fn, &mark, &id);
    }
    mpg__trace_hand(&mark, st, work);
  }
  mpg__group_release(g);
  return st;
}

/* One collective on g, claimed for the call `name`, the name a refusal
 * gives (NULL: "mpg_<kind>", the name every other message gives). */
static mpg_status run(mpg_group *g, const mpg__coll *c, mpg_work **work, const char *name) {
  if (work) *work = NULL;
  if (!g) return check_coll(g, c); /* its message for a NULL group */
  char fn[32];
  snprintf(fn, sizeof fn, "mpg_%s", mpg__kind_name(c->kind));
  mpg_status st = mpg__group_claim(g, name ? name : fn);
  if (st) return st;
  st = run_claimed(g, c, work, fn);
  mpg__group_release(g);
  return st;
}

mpg_status mpg__group_run(mpg_group *g, const mpg__coll *c, mpg_work **work) {
  return run(g, c, work, NULL);
}

mpg_status mpg__group_split(mpg_group *g, int color, int key, mpg__comm **out) {
  static const char fn[] = "splitting the group";
  *out = NULL;
  mpg_status st = mpg__group_claim(g, fn);
  if (st) return st;
  st = mpg__group_ready(g, fn);
  if (!st) {
    st = g->ctx->ops->split(g->comm, color, key, out);
    if (!st && color >= 0 && !*out)
      st = mpg__fail(MPG_ERR_BACKEND, "%s: the split gave world rank %d no communicator",
                     fn, g->ctx->rank);
    if (st) st = on_failure(g, fn, st);
  }
  mpg__group_release(g);
  return st;
}

/* The requests of w: its array (a batch), or its one request. */
static mpg__req **work_reqs(mpg_work *w, int *n) {
  *n = w->reqs ? w->nreq : 1;
  return w->reqs ? w->reqs : &w->req;
}

mpg_status mpg_work_wait(mpg_work *w) {
  if (!w) return MPG_OK;
  int n;
  mpg__req **reqs = work_reqs(w, &n);
  /* A failure seen by mpg_work_test was of reqs[ndone]; the others are
   * still waited for, then everything is freed. */
  mpg_status st = finish_op(w->group, w->ops, reqs, n, w->deadline, "mpg_work_wait",
                            &w->op, w->status, w->ndone);
  mpg__trace_end(&w->trace, st);
  free(w->reqs);
  free(w);
  return st;
}

mpg_status mpg_work_test(mpg_work *w, int *done) {
  if (!done) return mpg__fail(MPG_ERR_INVALID, "mpg_work_test: done is NULL");
  if (!w) {
    *done = 1;
    return MPG_OK;
  }
  if (w->status) {
    *done = 1;
    return w->status;
  }
  const struct mpg__transport_ops *ops = w->ops;
  int n;
  mpg__req **reqs = work_reqs(w, &n);
  mpg_status st = MPG_OK;
  *done = 1;
  while (w->ndone < n) { /* in order: done when the last one is */
    int d = 0;
    if ((st = ops->test(reqs[w->ndone], &d))) break;
    if (!d) {
      *done = 0;
      break;
    }
    w->ndone++;
  }
  if (st) {
    *done = 1;
    w->status = on_failure_op(w->group, "mpg_work_test", &w->op, st);
    mpg__trace_end(&w->trace, w->status);
    return w->status;
  }
  if (*done && w->trace.t) { /* ended now: its device times, then the record */
    double t0 = 0, t1 = 0;
    for (int i = 0; i < n; i++) device_times(ops, reqs[i], &t0, &t1);
    mpg__trace_device_times(t0, t1);
    mpg__trace_end(&w->trace, MPG_OK);
  }
  if (!*done && !ops->test_keeps_time && mpg__now() > w->deadline) {
    /* Past the deadline: the backend's wait returns at once, with what it
     * knows of the members that never arrived. */
    while (w->ndone < n && !(st = ops->wait(reqs[w->ndone], w->deadline))) w->ndone++;
    *done = 1;
    if (!st) { /* it finished just now */
      mpg__trace_end(&w->trace, MPG_OK);
      return MPG_OK;
    }
    w->status = on_failure_op(w->group, "mpg_work_test", &w->op, st);
    mpg__trace_end(&w->trace, w->status);
    return w->status;
  }
  return MPG_OK;
}

mpg_status mpg_all_reduce(mpg_group *group, const void *send, void *recv,
                          size_t count, mpg_dtype dtype, mpg_op op,
                          void *stream, mpg_work **work) {
  if (op == MPG__OP_PREMUL_SUM)
    return mpg__fail(MPG_ERR_INVALID,
                     "mpg_all_reduce: use mpg_all_reduce_scaled for a scaled sum");
  mpg__coll c = {MPG__ALL_REDUCE, send, recv, count, dtype, op, 1.0, 0, 0, stream, 0};
  return run(group, &c, work, NULL);
}

mpg_status mpg_all_reduce_scaled(mpg_group *group, const void *send,
                                 void *recv, size_t count, mpg_dtype dtype,
                                 double scale, void *stream, mpg_work **work) {
  mpg__coll c = {MPG__ALL_REDUCE, send, recv, count, dtype, MPG__OP_PREMUL_SUM,
                 scale, 0, 0, stream, 0};
  return run(group, &c, work, "mpg_all_reduce_scaled");
}

mpg_status mpg_broadcast(mpg_group *group, void *buf, size_t count,
                         mpg_dtype dtype, int root, void *stream,
                         mpg_work **work) {
  mpg__coll c = {MPG__BROADCAST, buf, buf, count, dtype, MPG_OP_SUM, 1.0, root, 0, stream, 0};
  return run(group, &c, work, NULL);
}

mpg_status mpg_all_gather(mpg_group *group, const void *send, void *recv,
                          size_t count, mpg_dtype dtype, void *stream,
                          mpg_work **work) {
  mpg__coll c = {MPG__ALL_GATHER, send, recv, count, dtype, MPG_OP_SUM, 1.0, 0, 0, stream, 0};
  return run(group, &c, work, NULL);
}

mpg_status mpg_reduce_scatter(mpg_group *group, const void *send, void *recv,
                              size_t count, mpg_dtype dtype, mpg_op op,
                              void *stream, mpg_work **work) {
  if (op == MPG__OP_PREMUL_SUM)
    return mpg__fail(MPG_ERR_INVALID,
                     "mpg_reduce_scatter: op %d is not an mpg_op; use "
                     "mpg_reduce_scatter_scaled for a pre-multiplied sum", (int)op);
  mpg__coll c = {MPG__REDUCE_SCATTER, send, recv, count, dtype, op, 1.0, 0, 0, stream, 0};
  return run(group, &c, work, NULL);
}

mpg_status mpg_reduce_scatter_scaled(mpg_group *group, const void *send, void *recv,
                                     size_t count, mpg_dtype dtype, double scale,
                                     void *stream, mpg_work **work) {
  mpg__coll c = {MPG__REDUCE_SCATTER, send, recv, count, dtype, MPG__OP_PREMUL_SUM,
                 scale, 0, 0, stream, 0};
  return run(group, &c, work, "mpg_reduce_scatter_scaled");
}

mpg_status mpg_barrier(mpg_group *group, mpg_work **work) {
  mpg__coll c = {MPG__BARRIER, NULL, NULL, 0, MPG_I32, MPG_OP_SUM, 1.0, 0, 0, NULL, 0};
  return run(group, &c, work, NULL);
}

mpg_status mpg_send(mpg_group *group, const void *buf, size_t count,
                    mpg_dtype dtype, int peer, void *stream, mpg_work **work) {
  mpg__coll c = {MPG__SEND, buf, NULL, count, dtype, MPG_OP_SUM, 1.0, 0, peer, stream, 0};
  return run(group, &c, work, NULL);
}

mpg_status mpg_recv(mpg_group *group, void *buf, size_t count,
                    mpg_dtype dtype, int peer, void *stream, mpg_work **work) {
  mpg__coll c = {MPG__RECV, NULL, buf, count, dtype, MPG_OP_SUM, 1.0, 0, peer, stream, 0};
  return run(group, &c, work, NULL);
}

/* A collective on host memory through the context's setup path (c->kind:
 * all-gather or all-reduce); a one-rank group copies. */
static mpg_status host_coll_claimed(mpg_group *g, mpg__coll *c, const char *what) {
  mpg_status st = check_coll(g, c);
  if (st) return st;
  mpg__op_id id;
  mpg__trace_mark mark = trace_begin(g, c, &id);
  st = mpg__group_ready_op(g, what, &id);
  if (!st && g->size == 1) {
    if (c->count) memmove(c->recv, c->send, c->count * mpg__dtype_size(c->dtype));
  } else if (!st) {
    mpg__trace_posted(&mark);
    st = mpg__ctx_setup_coll(g->ctx, g->comm, g->size, c);
    if (st) st = on_failure_op(g, what, &id, st);
  }
  mpg__trace_end(&mark, st);
  return st;
}

static mpg_status host_coll(mpg_group *g, mpg__coll *c, const char *what) {
  if (!g) return check_coll(g, c);
  mpg_status st = mpg__group_claim(g, what);
  if (st) return st;
  st = host_coll_claimed(g, c, what);
  mpg__group_release(g);
  return st;
}

mpg_status mpg__group_host_all_gather(mpg_group *g, const void *send, void *recv,
                                      size_t count, mpg_dtype dtype) {
  mpg__coll c = {MPG__ALL_GATHER, send, recv, count, dtype, MPG_OP_SUM, 1.0, 0, 0, NULL, 0};
  return host_coll(g, &c, "all_gather (host)");
}

mpg_status mpg__group_host_all_reduce(mpg_group *g, const void *send, void *recv,
                                      size_t count, mpg_dtype dtype, mpg_op op) {
  mpg__coll c = {MPG__ALL_REDUCE, send, recv, count, dtype, op, 1.0, 0, 0, NULL, 0};
  return host_coll(g, &c, "all_reduce (host)");
}

/* The setup callbacks of g's transports (transport.h): its host
 * all-gather and its split, so that groups/shm/ comes up without calling
 * up into this file. */
static mpg_status setup_all_gather(void *arg, const void *send, void *recv, size_t count,
                                   mpg_dtype dtype) {
  return mpg__group_host_all_gather(arg, send, recv, count, dtype);
}

static mpg_status setup_split(void *arg, int color, int key, mpg__comm **out) {
  return mpg__group_split(arg, color, key, out);
}

mpg__transport_setup mpg__group_transport_setup(mpg_group *g) {
  mpg__transport_setup su = {g, setup_all_gather, setup_split, &g->ctx->ops->transport};
  return su;
}
