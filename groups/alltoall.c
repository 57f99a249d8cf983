/* mpg_all_to_all and mpg_all_to_all_v: every member sends a block of its
 * send buffer to every member (itself included) and receives one block
 * from every member, on every backend, on top of the point-to-point
 * machinery of p2p.c.  Each member copies its own block locally (the
 * backend's `local` hook: a memcpy on the host backends, a
 * cudaMemcpyAsync on the caller's stream on nccl), then posts a receive
 * from every peer and a send to every peer as one list through
 * mpg__group_post_p2p: on nccl one ncclGroupStart .. ncclGroupEnd of
 * ncclRecv / ncclSend (NCCL's own all-to-all recipe), on thread the
 * receives, then the sends; a backend with its own all-to-all (mpi:
 * post_alltoallv, one MPI_Ialltoallv) runs it as one operation after the
 * members exchanged their counts (run_native).  Peers are visited in a
 * staggered order
 * (receive from position - k, send to position + k, k = 1 .. size - 1) so
 * that the members do not all start with the same peer.
 *
 * Everything is checked before anything is posted: the arguments, the
 * byte sizes (MPG_ERR_RANGE), the one count pair this member can check
 * alone (its own block: send_counts[position] == recv_counts[position]),
 * and the overlap of send and recv (refused: an all-to-all is never in
 * place).  Counts that disagree between two members are caught where the
 * backend sees them: the thread backend fails the receive with
 * MPG_ERR_INVALID (never truncating or overrunning), mpi fails both
 * members of the pair with MPG_ERR_INVALID after the exchange of counts
 * (run_native); nccl cannot see them (a receive longer than its send
 * waits, a shorter one leaves bytes on the pair's connection), so with the
 * issue-order checker on (MESHPG_CHECK_ORDER) every member exchanges the
 * counts first and all fail with MPG_ERR_INVALID before any data moves
 * (check_counts); with it off a mismatch on nccl is undefined.  Waiting,
 * timeouts (the
 * receive from a member that never arrived names it) and aborts are
 * p2p.c's and coll.c's.  The issue-order checker records each call as a
 * collective of the group (order.c).  See core.h. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"

typedef mpg__a2a_call a2a; /* core.h */

static size_t scount(const a2a *a, int p) { return mpg__a2a_scount(a, p); }
static size_t sdispl(const a2a *a, int p) { return mpg__a2a_sdispl(a, p); }
static size_t rcount(const a2a *a, int p) { return mpg__a2a_rcount(a, p); }
static size_t rdispl(const a2a *a, int p) { return mpg__a2a_rdispl(a, p); }

/* The extent of one side, in elements: [*lo, *hi) spans every block with
 * elements (*lo == *hi == 0 when none has).  Blocks are checked first:
 * displs[p] + counts[p] and its byte size must fit in size_t. */
static mpg_status extent(const mpg_group *g, const a2a *a, int recv_side, size_t *lo,
                         size_t *hi, size_t *total) {
  size_t es = mpg__dtype_size(a->dtype), max = SIZE_MAX / es;
  const char *side = recv_side ? "recv" : "send";
  *lo = *hi = *total = 0;
  int any = 0;
  for (int p = 0; p < g->size; p++) {
    size_t n = recv_side ? rcount(a, p) : scount(a, p);
    size_t d = recv_side ? rdispl(a, p) : sdispl(a, p);
    if (n > max || d > max - n)
      return mpg__fail(MPG_ERR_RANGE,
                       "%s on %s: %s_displs[%d] + %s_counts[%d] = %zu + %zu elements "
                       "of %s overflows size_t bytes",
                       a->fn, MPG__GROUP_LABEL(g), side, p, side, p, d, n, mpg_dtype_name(a->dtype));
    if (n == 0) continue;
    *total = n > SIZE_MAX - *total ? SIZE_MAX : *total + n; /* saturating */
    if (!any || d < *lo) *lo = d;
    if (!any || d + n > *hi) *hi = d + n;
    any = 1;
  }
  return MPG_OK;
}

static mpg_status check(const mpg_group *g, const a2a *a) {
  const char *fn = a->fn;
  if (!g) return mpg__fail(MPG_ERR_INVALID, "%s: group is NULL", fn);
  if ((unsigned)a->dtype >= MPG_DTYPE_COUNT)
    return mpg__fail(MPG_ERR_INVALID, "%s on %s: unknown dtype %d", fn, MPG__GROUP_LABEL(g),
                     (int)a->dtype);
  size_t members = (size_t)(g->size > 0 ? g->size : 1);
  if (a->v) {
    const char *null = !a->scounts ? "send_counts" : !a->sdispls ? "send_displs"
                       : !a->rcounts ? "recv_counts" : !a->rdispls ? "recv_displs" : NULL;
    if (null)
      return mpg__fail(MPG_ERR_INVALID, "%s on %s: %s is NULL (it needs one entry per "
                       "member: %zu)", fn, MPG__GROUP_LABEL(g), null, members);
  } else if (a->count > SIZE_MAX / mpg__dtype_size(a->dtype) / members) {
    return mpg__fail(MPG_ERR_RANGE,
                     "%s on %s: count %zu of %s x %zu member%s overflows size_t bytes",
                     fn, MPG__GROUP_LABEL(g), a->count, mpg_dtype_name(a->dtype), members,
                     members == 1 ? "" : "s");
  }
  size_t slo, shi, stot, rlo, rhi, rtot;
  mpg_status st = extent(g, a, 0, &slo, &shi, &stot);
  if (!st) st = extent(g, a, 1, &rlo, &rhi, &rtot);
  if (st) return st;
  if ((stot && !a->send) || (rtot && !a->recv))
    return mpg__fail(MPG_ERR_INVALID, "%s on %s: %s buffer is NULL for %zu elements", fn,
                     MPG__GROUP_LABEL(g), stot && !a->send ? "send" : "receive", stot && !a->send ? stot
                                                                                  : rtot);
  int me = g->position;
  if (scount(a, me) != rcount(a, me))
    return mpg__fail(MPG_ERR_INVALID,
                     "%s on %s: this member (position %d) sends itself %zu elements "
                     "(send_counts[%d]) but expects %zu (recv_counts[%d])",
                     fn, MPG__GROUP_LABEL(g), me, scount(a, me), me, rcount(a, me), me);
  if (stot && rtot) {
    size_t es = mpg__dtype_size(a->dtype);
    uintptr_t s0 = (uintptr_t)a->send + slo * es, s1 = (uintptr_t)a->send + shi * es;
    uintptr_t r0 = (uintptr_t)a->recv + rlo * es, r1 = (uintptr_t)a->recv + rhi * es;
    if (s0 < r1 && r0 < s1)
      return mpg__fail(MPG_ERR_INVALID,
                       "%s on %s: the send blocks (bytes %zu..%zu of send) overlap the "
                       "receive blocks (bytes %zu..%zu of recv, recv = send %+td bytes); an "
                       "all-to-all is never in place: use separate buffers",
                       fn, MPG__GROUP_LABEL(g), slo * es, shi * es, rlo * es, rhi * es,
                       (ptrdiff_t)((uintptr_t)a->recv - (uintptr_t)a->send));
  }
  return MPG_OK;
}

/* This member's own block, send to recv: a copy through the backend. */
static mpg_status copy_self(mpg_group *g, const a2a *a) {
  int me = g->position;
  size_t n = scount(a, me), es = mpg__dtype_size(a->dtype);
  if (n == 0) return MPG_OK;
  mpg__coll c = {MPG__ALL_GATHER, (const char *)a->send + sdispl(a, me) * es,
                 (char *)a->recv + rdispl(a, me) * es, n, a->dtype, MPG_OP_SUM, 1.0, 0, 0,
                 a->stream, 0};
  mpg_ctx *ctx = g->ctx;
  return ctx->ops->local ? ctx->ops->local(ctx->world_comm, &c) : mpg__local_host(&c);
}

/* One exchange with every peer as one point-to-point list: the receive
 * from position me - k and the send to me + k for k = 1 .. size - 1 (the
 * staggered order), every receive before any send (p2p.c posts the list in
 * order).  fill() sets the pair's receive and send. */
typedef void (*pair_fill)(const a2a *a, void *arg, int from, int to, mpg__coll *r,
                          mpg__coll *s);

static mpg_status post_staggered(mpg_group *g, const a2a *a, pair_fill fill, void *arg,
                                 mpg_work **work) {
  int size = g->size, me = g->position, n = 2 * (size - 1);
  /* A member that posts nothing (out of memory) while its peers posted
   * theirs aborts the context, as coll.c's collectives do: else its next
   * all-to-all would pair with their pending one (wrong blocks, MPG_OK;
   * issue 45, found by the fault property's all-to-all). */
  mpg__coll *list = malloc((size_t)n * sizeof *list);
  if (!list)
    return mpg__group_on_failure(g, a->fn, mpg__fail(MPG_ERR_NOMEM, "%s on %s: out of "
                                 "memory for %d operations", a->fn, MPG__GROUP_LABEL(g), n));
  for (int k = 1; k < size; k++)
    fill(a, arg, (me - k + size) % size, (me + k) % size, &list[k - 1],
         &list[size - 1 + k - 1]);
  mpg_status st = mpg__group_post_p2p(g, list, n, a->fn, work);
  free(list);
  if (st && st != MPG_ERR_INVALID && !atomic_load(&g->ctx->aborted))
    st = mpg__group_on_failure(g, a->fn, st); /* its own failures abort already */
  return st;
}

/* The counts' pair: two u64 each way (exchange_counts, which filled mine). */
static void count_pair(const a2a *a, void *arg, int from, int to, mpg__coll *r,
                       mpg__coll *s) {
  (void)a;
  uint64_t *mine = ((uint64_t **)arg)[0], *theirs = ((uint64_t **)arg)[1];
  *r = (mpg__coll){MPG__RECV, NULL, theirs + 2 * from, 2, MPG_I64, MPG_OP_SUM, 1.0, 0, from,
                   NULL, 0};
  *s = (mpg__coll){MPG__SEND, mine + 2 * to, NULL, 2, MPG_I64, MPG_OP_SUM, 1.0, 0, to, NULL,
                   0};
}

/* The data's pair: the blocks from `from` and to `to`. */
static void data_pair(const a2a *a, void *arg, int from, int to, mpg__coll *r, mpg__coll *s) {
  (void)arg;
  size_t es = mpg__dtype_size(a->dtype), rn = rcount(a, from), sn = scount(a, to);
  *r = (mpg__coll){MPG__RECV, NULL, rn ? (char *)a->recv + rdispl(a, from) * es : NULL, rn,
                   a->dtype, MPG_OP_SUM, 1.0, 0, from, a->stream, 0};
  *s = (mpg__coll){MPG__SEND, sn ? (const char *)a->send + sdispl(a, to) * es : NULL, NULL,
                   sn, a->dtype, MPG_OP_SUM, 1.0, 0, to, a->stream, 0};
}

/* Before the data, every member tells each peer what it sends it and what
 * it expects from it: one point-to-point round (mpg__group_post_p2p: a
 * member that never arrives is named by the timeout), on the default
 * stream through a buffer of the backend when its point to point needs its
 * own memory (nccl: device memory, as setup.c stages).  mine and theirs
 * have 2 x size entries: mine[2 p], mine[2 p + 1] = what this member sends
 * p and expects from p; theirs[2 p] is what peer p sends this member,
 * theirs[2 p + 1] what it expects from it.  Blocking, also for an async
 * call.  A failure other than the exchange's own has aborted the context
 * (mpg__group_on_failure) like the exchange's. */
static mpg_status exchange_counts(mpg_group *g, const a2a *a, uint64_t *mine,
                                  uint64_t *theirs) {
  mpg_ctx *ctx = g->ctx;
  size_t half = 2 * (size_t)g->size * sizeof *mine;
  for (int p = 0; p < g->size; p++) {
    mine[2 * p] = scount(a, p);
    mine[2 * p + 1] = rcount(a, p);
  }
  uint64_t *both[2] = {mine, theirs};
  void *dev = NULL;
  mpg_status st = MPG_OK;
  if (ctx->ops->mem_alloc && ctx->ops->mem_copy) {
    st = ctx->ops->mem_alloc(ctx->world_comm, 2 * half, 0, &dev);
    if (!st) st = ctx->ops->mem_copy(ctx->world_comm, dev, mine, half);
    if (st) st = mpg__group_on_failure(g, a->fn, st);
    both[0] = dev;
    both[1] = dev ? (uint64_t *)((char *)dev + half) : NULL;
  }
  if (!st) st = post_staggered(g, a, count_pair, both, NULL);
  if (!st && dev) {
    st = ctx->ops->mem_copy(ctx->world_comm, theirs, both[1], half);
    if (st) st = mpg__group_on_failure(g, a->fn, st);
  }
  if (dev) {
    mpg__saved_error why;
    mpg__error_save(&why);
    mpg_status fst = ctx->ops->mem_free(ctx->world_comm, dev);
    if (st) (void)mpg__error_restore(st, &why);
    else if (fst) st = mpg__group_on_failure(g, a->fn, fst);
  }
  if (st)
    return mpg__fail_wrap(st, "%s on %s (position %d): exchanging the counts before "
                          "the data", a->fn, MPG__GROUP_LABEL(g), g->position);
  return MPG_OK;
}

/* The checker's count check (run_claimed; nccl, whose point to point
 * cannot check a count at the receive: a mismatch there hangs until the
 * timeout, or leaves bytes on the pair's connection for a later receive):
 * the counts are exchanged (exchange_counts), each member takes the
 * mismatches where it sends (send_counts[j] on this member i against
 * recv_counts[i] on member j: every mismatched pair is seen by its
 * sender), and one all-gather of (mismatches, first receiver, sent,
 * expected) per member tells every member of the group the same verdict:
 * MPG_ERR_INVALID on every member, naming the first pair (lowest sender,
 * then receiver) and both counts, before any data moved (the member's own
 * block included).  The context is not aborted: nothing is pending.  Two
 * collectives more per call, every member alike (MESHPG_CHECK_ORDER is
 * the same on every rank: agree.c). */
static mpg_status check_counts(mpg_group *g, const a2a *a) {
  int size = g->size, me = g->position;
  uint64_t *mine = calloc(4 * (size_t)size + 4 * (size_t)size, sizeof *mine);
  if (!mine)
    return mpg__group_on_failure(g, a->fn, mpg__fail(MPG_ERR_NOMEM, "%s on %s: out of "
                                 "memory for the counts of %d members", a->fn, MPG__GROUP_LABEL(g),
                                 size));
  uint64_t *theirs = mine + 2 * size, *all = mine + 4 * size, v[4] = {0, 0, 0, 0};
  mpg_status st = exchange_counts(g, a, mine, theirs);
  for (int p = 0; !st && p < size; p++) {
    if (p == me || mine[2 * p] == theirs[2 * p + 1]) continue;
    if (v[0]++ == 0) v[1] = (uint64_t)p, v[2] = mine[2 * p], v[3] = theirs[2 * p + 1];
  }
  if (!st) {
    mpg__coll c = {MPG__ALL_GATHER, v, all, 4, MPG_I64, MPG_OP_SUM, 1.0, 0, 0, NULL, 0};
    st = mpg__ctx_setup_coll(g->ctx, g->comm, size, &c);
    if (st)
      st = mpg__fail_wrap(mpg__group_on_failure(g, a->fn, st), "%s on %s (position "
                          "%d): agreeing on the counts", a->fn, MPG__GROUP_LABEL(g), me);
  }
  uint64_t nbad = 0;
  int first = -1;
  for (int i = 0; !st && i < size; i++) {
    nbad += all[4 * i];
    if (first < 0 && all[4 * i]) first = i;
  }
  if (!st && first >= 0) {
    const uint64_t *f = all + 4 * first;
    st = mpg__fail(MPG_ERR_INVALID,
                   "%s on %s: the counts of %llu pair%s of members do not match "
                   "(recv_counts[i] on member j must equal send_counts[j] on member i): "
                   "position %d sends %llu elements to position %llu (send_counts[%llu]) "
                   "where position %llu expects %llu (recv_counts[%d]); checked on every "
                   "member because MESHPG_CHECK_ORDER is on; nothing was sent",
                   a->fn, MPG__GROUP_LABEL(g), (unsigned long long)nbad, nbad == 1 ? "" : "s", first,
                   (unsigned long long)f[2], (unsigned long long)f[1],
                   (unsigned long long)f[1], (unsigned long long)f[1],
                   (unsigned long long)f[3], first);
  }
  free(mine);
  return st;
}

/* Fill the backend's four arrays (own entries 0); count the peers whose counts disagree. */
static size_t native_arrays(const mpg_group *g, const a2a *a, const uint64_t *theirs,
                            size_t *arrays, char *mismatch, size_t mismatch_size) {
  int size = g->size, me = g->position;
  size_t *send_counts = arrays, *send_displs = arrays + size;
  size_t *recv_counts = arrays + 2 * size, *recv_displs = arrays + 3 * size;
  size_t nbad = 0;
  for (int p = 0; p < size; p++) {
    send_counts[p] = p == me ? 0 : scount(a, p);
    send_displs[p] = p == me ? 0 : sdispl(a, p);
    recv_counts[p] = p == me ? 0 : rcount(a, p);
    recv_displs[p] = p == me ? 0 : rdispl(a, p);
    if (p == me) continue;
    uint64_t peer_sends = theirs[2 * p], peer_expects = theirs[2 * p + 1];
    if (peer_sends == recv_counts[p] && peer_expects == send_counts[p]) continue;
    if (nbad++ == 0)
      snprintf(mismatch, mismatch_size, "position %d sends %llu elements where this member "
               "(position %d) expects %zu (recv_counts[%d]), and expects %llu where it sends "
               "%zu (send_counts[%d])", p, (unsigned long long)peer_sends, me, recv_counts[p],
               p, (unsigned long long)peer_expects, send_counts[p], p);
  }
  return nbad;
}

/* Receive every block as its sender sends it, packed, into a new scratch buffer. */
static mpg_status native_scratch(const mpg_group *g, const a2a *a, const uint64_t *theirs,
                                 size_t *arrays, const char *mismatch, char **scratch_out) {
  int size = g->size, me = g->position;
  size_t es = mpg__dtype_size(a->dtype), scratch_elems = 0;
  size_t *recv_counts = arrays + 2 * size, *recv_displs = arrays + 3 * size;
  for (int p = 0; p < size; p++) {
    recv_counts[p] = p == me ? 0 : (size_t)theirs[2 * p];
    recv_displs[p] = scratch_elems;
    if (recv_counts[p] > (SIZE_MAX / 2) / es - scratch_elems)
      return mpg__fail(MPG_ERR_INVALID, "%s on %s: the counts of two members "
                       "do not match (%s), and position %d's are too large to "
                       "receive", a->fn, MPG__GROUP_LABEL(g), mismatch, p);
    scratch_elems += recv_counts[p];
  }
  char *scratch = malloc(scratch_elems ? scratch_elems * es : 1);
  if (!scratch)
    return mpg__fail(MPG_ERR_NOMEM, "%s on %s: out of memory receiving "
                     "mismatched counts (%s)", a->fn, MPG__GROUP_LABEL(g), mismatch);
  *scratch_out = scratch;
  return MPG_OK;
}

/* Finish the mismatched all-to-all and copy the blocks of the agreeing peers out of scratch. */
static mpg_status finish_agreeing(mpg_group *g, const a2a *a, mpg__req *req, double deadline,
                                  const uint64_t *theirs, const size_t *arrays,
                                  const char *scratch) {
  int size = g->size, me = g->position;
  size_t es = mpg__dtype_size(a->dtype);
  const size_t *recv_counts = arrays + 2 * size, *recv_displs = arrays + 3 * size;
  mpg_status st =
      mpg__group_finish(g, &g->ctx->ops->transport, &req, 1, deadline, a->fn, MPG_OK, 0);
  for (int p = 0; !st && p < size; p++)
    if (p != me && theirs[2 * p] == rcount(a, p) && rcount(a, p))
      memcpy((char *)a->recv + rdispl(a, p) * es, scratch + recv_displs[p] * es,
             recv_counts[p] * es);
  return st;
}

/* The posted request as the caller's work handle, else finished here. */
static mpg_status native_work(mpg_group *g, const a2a *a, mpg__req *req, double deadline,
                              mpg_work **work) {
  mpg_work *handle = work ? calloc(1, sizeof *handle) : NULL;
  if (handle) {
    handle->group = g;
    handle->op.kind = -1; /* messages name the group (and the call) */
    handle->ops = &g->ctx->ops->transport;
    handle->req = req;
    handle->deadline = deadline;
    handle->status = MPG_OK;
    *work = handle;
    return MPG_OK;
  }
  /* Blocking, or no memory for the handle: finish it here rather than
   * lose it (a failure aborts before the pending request is freed). */
  mpg_status st =
      mpg__group_finish(g, &g->ctx->ops->transport, &req, 1, deadline, a->fn, MPG_OK, 0);
  if (st || !work) return st;
  return mpg__fail(MPG_ERR_NOMEM, "%s on %s: out of memory for the work handle (the "
                   "operation completed)", a->fn, MPG__GROUP_LABEL(g));
}

/* The backend's own all-to-all (post_alltoallv), one request: the four
 * arrays of the call with this member's own entries 0 (copy_self did that
 * block).  *taken = 0 when the backend declined it (*req NULL): the caller
 * goes on with point to point.  Waiting, the work handle and failures as
 * coll.c's run().
 *
 * The counts are exchanged first (exchange_counts).  A pair whose counts
 * disagree still takes part, so that every other member's all-to-all
 * completes: its receiver takes the sender's count into scratch memory
 * (MPI never sees a message longer than its receive: Open MPI would raise
 * that through MPI_COMM_WORLD's error handler, fatal by default), keeps
 * the blocks of the peers that agree, and both members of the pair fail
 * with MPG_ERR_INVALID once it finished. */
static mpg_status run_native(mpg_group *g, const a2a *a, mpg_work **work, int *taken) {
  mpg_ctx *ctx = g->ctx;
  int size = g->size;
  *taken = 1;
  /* send counts, send displs, recv counts, recv displs: size entries each */
  size_t *arrays = malloc(4 * (size_t)size * sizeof *arrays);
  uint64_t *mine = calloc(4 * (size_t)size, sizeof *mine), *theirs = mine ? mine + 2 * size
                                                                            : NULL;
  if (!arrays || !mine) {
    free(arrays);
    free(mine);
    return mpg__group_on_failure(g, a->fn, mpg__fail(MPG_ERR_NOMEM, "%s on %s: out of "
                                 "memory for the counts of %d members", a->fn, MPG__GROUP_LABEL(g), size));
  }
  double deadline = mpg__now() + ctx->timeout_s;
  mpg_status st = exchange_counts(g, a, mine, theirs);
  if (st) {
    free(arrays);
    free(mine);
    return st;
  }
  char mismatch[256] = ""; /* the first pair whose counts disagree */
  size_t nbad = native_arrays(g, a, theirs, arrays, mismatch, sizeof mismatch);
  void *recv = a->recv;
  char *scratch = NULL;
  if (nbad) {
    st = native_scratch(g, a, theirs, arrays, mismatch, &scratch);
    if (st) {
      free(arrays);
      free(mine);
      return mpg__group_on_failure(g, a->fn, st);
    }
    recv = scratch;
  }
  mpg__req *req = NULL;
  st = ctx->ops->post_alltoallv(g->comm, a->send, arrays, arrays + size, recv,
                                arrays + 2 * size, arrays + 3 * size, a->dtype, &req);
  if (st || !req || !nbad) free(arrays);
  if (st) {
    free(mine);
    free(scratch);
    return mpg__group_on_failure(g, a->fn, st);
  }
  if (!req) {
    /* Declined: the mpi backend never declines (backend.h). */
    free(mine);
    free(scratch);
    *taken = 0;
    return MPG_OK;
  }
  if (nbad) {
    /* Finish it here, keep the agreeing blocks, then fail. */
    st = finish_agreeing(g, a, req, deadline, theirs, arrays, scratch);
    free(arrays);
    free(mine);
    free(scratch);
    if (st) return st;
    return mpg__fail(MPG_ERR_INVALID,
                     "%s on %s: the counts of %zu pair%s of members do not match "
                     "(recv_counts[i] on member j must equal send_counts[j] on member i): %s; "
                     "the other blocks were received",
                     a->fn, MPG__GROUP_LABEL(g), nbad, nbad == 1 ? "" : "s", mismatch);
  }
  free(mine);
  return native_work(g, a, req, deadline, work);
}

/* The group's first all-to-all on a CPU backend (g claimed): its
 * shared-memory channel (mpg__a2a_shm_prepare), made through host
 * all-gathers that claim the group themselves.  A round of the counts
 * with every peer first (exchange_counts, point to point), so that a
 * member that never arrives is named by the timeout (an MPI all-gather
 * cannot say who is missing).  Returns with g claimed again (*claimed
 * 1), unless another thread took it meanwhile (MPG_ERR_STATE). */
static mpg_status first_call(mpg_group *g, const a2a *a, int *claimed) {
  mpg_status st = mpg__group_ready(g, a->fn);
  uint64_t *mine = st ? NULL : calloc(4 * (size_t)g->size, sizeof *mine);
  if (!st && !mine)
    st = mpg__group_on_failure(g, a->fn, mpg__fail(MPG_ERR_NOMEM, "%s on %s: out of "
                               "memory for the counts", a->fn, MPG__GROUP_LABEL(g)));
  if (!st) st = exchange_counts(g, a, mine, mine + 2 * g->size);
  free(mine);
  if (st) return st;
  mpg__group_release(g);
  mpg__transport_setup setup = mpg__group_transport_setup(g);
  st = mpg__a2a_shm_prepare(g, &setup, a->fn);
  mpg_status claim = mpg__group_claim(g, a->fn);
  *claimed = claim == MPG_OK;
  return st ? st : claim;
}

/* run_a2a with g claimed and the arguments checked. */
static mpg_status run_claimed(mpg_group *g, const a2a *a, mpg_work **work) {
  mpg_status st;
  if ((st = mpg__group_ready(g, a->fn))) return st;
  mpg__order_note_all_to_all(g, a->v, a->count, a->dtype); /* as issued, size 1 too */
  if (g->size > 1 && g->ctx->order && g->ctx->kind == MPG_BACKEND_NCCL &&
      (st = check_counts(g, a)))
    return st;
  if (g->a2a && g->size > 1) {
    /* The channel copies this member's own block itself, once its
     * descriptor is out (the peers read meanwhile). */
    int taken = 0;
    st = mpg__a2a_shm_run(g, a, work, &taken);
    if (taken || st) return st;
  }
  st = copy_self(g, a);
  if (g->size == 1) return st; /* as coll.c's run(): the local result as it is */
  if (st) return mpg__group_on_failure(g, a->fn, st);

  if (g->ctx->ops->post_alltoallv) {
    int taken = 0;
    st = run_native(g, a, work, &taken);
    if (taken) return st;
  }

  st = post_staggered(g, a, data_pair, NULL, work);
  if (st == MPG_ERR_INVALID)
    /* Posted and refused by the backend: the counts of two members
     * disagree (the thread backend's receive names the pair). */
    return mpg__fail_wrap(st, "%s on %s (position %d): the counts of two members do "
                          "not match (recv_counts[i] on member j must equal send_counts[j] "
                          "on member i)", a->fn, MPG__GROUP_LABEL(g), g->position);
  return st;
}

static mpg_status run_a2a(mpg_group *g, const a2a *a, mpg_work **work) {
  if (work) *work = NULL;
  if (!g) return check(g, a); /* its message for a NULL group */
  mpg_status st = mpg__group_claim(g, a->fn);
  if (st) return st;
  st = check(g, a);
  int claimed = 1;
  if (!st) {
    /* The flight recorder: one operation, its first call's channel
     * included (a member stuck there shows this all-to-all pending); the
     * v form's count is what this member sends in all. */
    size_t count = a->v ? 0 : a->count;
    for (int p = 0; a->v && p < g->size; p++) count += a->scounts[p];
    mpg__trace_mark mark = mpg__trace_begin(
        g, a->v ? TRACE_ALL_TO_ALL_V : TRACE_ALL_TO_ALL, a->dtype, count, -1);
    if (!work) mpg__trace_posted(&mark); /* blocking: it starts now */
    if (!g->a2a && !g->a2a_off && g->size > 1 && g->ctx->ops->host_shm) {
      mpg__trace_mute(1);
      st = first_call(g, a, &claimed);
      mpg__trace_mute(-1);
    }
    if (!st) st = run_claimed(g, a, work);
    if (!st && work && *work) mpg__trace_posted(&mark);
    mpg__trace_hand(&mark, st, work);
  }
  if (claimed) mpg__group_release(g);
  return st;
}

mpg_status mpg_all_to_all(mpg_group *group, const void *send, void *recv, size_t count,
                          mpg_dtype dtype, void *stream, mpg_work **work) {
  a2a a = {"mpg_all_to_all", 0, send, recv, NULL, NULL, NULL, NULL, count, dtype, stream};
  return run_a2a(group, &a, work);
}

mpg_status mpg_all_to_all_v(mpg_group *group, const void *send, const size_t *send_counts,
                            const size_t *send_displs, void *recv, const size_t *recv_counts,
                            const size_t *recv_displs, mpg_dtype dtype, void *stream,
                            mpg_work **work) {
  a2a a = {"mpg_all_to_all_v", 1, send, recv, send_counts, send_displs, recv_counts,
           recv_displs, 0, dtype, stream};
  return run_a2a(group, &a, work);
}
