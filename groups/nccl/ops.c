/* Operations of the NCCL backend: post (dtype and op mapping, a
 * pre-multiplied sum's scalar, f16/bf16 through widen.c's f32 path, the
 * enqueue on the caller's stream), a batch of sends and receives as one
 * NCCL group (post_batch), test, wait and free.  See nccl_internal.h.
 *
 * Completion.  A request records two events on the caller's stream: `start`
 * just before the operation's work and `event` after it.  It is done, with
 * MPG_OK, when `event` has fired and the communicator is neither aborted
 * nor holding an asynchronous error.  An event that fired proves only that
 * the stream went past the kernel, not that the data moved: ncclCommAbort
 * raises the communicator's abort flags (NCCL 2.28.9 src/init.cc:2515,
 * setCommAbortFlags 2394-2403), the kernels see them (checkAbort,
 * src/device/primitives.h:142-152), move no more data
 * (src/device/prims_simple.h:238-240) and return, and the stream goes on.
 * So once the communicator is aborted, for any reason and at any moment, a
 * request not yet reported done fails with the abort's reason
 * (MPG_ERR_ABORTED, or MPG_ERR_TIMEOUT when the context was aborted after
 * a timeout), as on the thread and mpi backends, even if its event has
 * fired: a kernel that finished just before the abort cannot be told from
 * one the abort cut short.  The abort flag is read after the event query,
 * and every abort publishes it (c->aborted) before calling ncclCommAbort
 * (lifecycle.c), so an event that fired because of an abort is always
 * seen with the flag.  An asynchronous error (ncclCommGetAsyncError) seen
 * when the event fires fails the request too (a send's kernel may finish
 * while NCCL's proxy still sends).
 *
 * Timeout.  The clock starts when the GPU reaches the operation, not at the
 * host's post: a sync stream that waits behind a long backward is not a
 * missing peer.  The caller's deadline is read as a timeout measured from
 * the post (T = deadline - posted); the request fails with MPG_ERR_TIMEOUT
 *   - T after `start` was first seen complete (test and wait poll it), or
 *   - START_LIMIT x T after the post while `start` is still pending: work
 *     queued before the operation on its stream never finished (a stuck
 *     kernel, or an earlier collective that waits for a dead peer and that
 *     nobody waits on yet).
 * So a call ends at most (START_LIMIT + 1) x T after its post.  The start
 * is seen by the host's polls, so the clock starts at most one poll after
 * the GPU got there, or at the first test/wait when nobody polled.  Ranks
 * whose streams reach a collective at times further apart than T still
 * time out: T bounds the skew between ranks, not the local delay. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "nccl_internal.h"

/* The start limit (see the top of this file): a stream that has not reached
 * the operation START_LIMIT x the timeout after the post fails it. */
#define START_LIMIT 4

/* ------------------------------------------------------------------ */
/* Small helpers                                                      */
/* ------------------------------------------------------------------ */

static int map_dtype(mpg_dtype dt, ncclDataType_t *out) {
  switch (dt) {
    case MPG_F32: *out = ncclFloat32; return 1;
    case MPG_F64: *out = ncclFloat64; return 1;
    case MPG_F16: *out = ncclFloat16; return 1;
    case MPG_BF16: *out = ncclBfloat16; return 1;
    case MPG_I32: *out = ncclInt32; return 1;
    case MPG_I64: *out = ncclInt64; return 1;
  }
  return 0;
}

/* Native ops; MPG__OP_PREMUL_SUM is created per call. */
static int map_op(mpg_op op, ncclRedOp_t *out) {
  switch (op) {
    case MPG_OP_SUM: *out = ncclSum; return 1;
    case MPG_OP_AVG: *out = ncclAvg; return 1;
    case MPG_OP_MAX: *out = ncclMax; return 1;
    case MPG_OP_MIN: *out = ncclMin; return 1;
  }
  return 0;
}

static int uses_op(mpg__coll_kind k) {
  return k == MPG__ALL_REDUCE || k == MPG__REDUCE_SCATTER;
}

/* "all_reduce(f32, sum, count 1024) at position 3 of a group of 8" (the
 * generic layer names the operation, its number and group, and world ranks) */
static void describe(char *buf, size_t n, const mpg__comm *c,
                     mpg__coll_kind kind, mpg_dtype dt, mpg_op op,
                     size_t count) {
  if (kind == MPG__BARRIER)
    snprintf(buf, n, "nccl barrier at position %d of a group of %d", c->rank,
             c->size);
  else if (uses_op(kind))
    snprintf(buf, n, "nccl %s(%s, %s, count %zu) at position %d of a group of %d",
             mpg__kind_name(kind), mpg_dtype_name(dt), mpg__op_name(op), count, c->rank,
             c->size);
  else
    snprintf(buf, n, "nccl %s(%s, count %zu) at position %d of a group of %d",
             mpg__kind_name(kind), mpg_dtype_name(dt), count, c->rank, c->size);
}

/* "nccl p2p_batch(3 sends/receives) at position 1 of a group of 4" for a batch
 * of nops operations (nops > 0); else describe's text. */
static void describe_ops(char *buf, size_t n, const mpg__comm *c, int nops,
                         mpg__coll_kind kind, mpg_dtype dt, mpg_op op, size_t count) {
  if (nops > 0)
    snprintf(buf, n, "nccl p2p_batch(%d sends/receives) at position %d of a group of %d",
             nops, c->rank, c->size);
  else
    describe(buf, n, c, kind, dt, op, count);
}

static void req_describe(char *buf, size_t n, const mpg__req *q) {
  describe_ops(buf, n, q->comm, q->nops, q->kind, q->dtype, q->op, q->count);
}


/* Host scalar of the collective's dtype for ncclRedOpCreatePreMulSum. */
typedef union {
  float f;
  double d;
  uint16_t h;
} scalar_t;

static int make_scalar(mpg_dtype dt, double scale, scalar_t *s) {
  switch (dt) {
    case MPG_F32: s->f = (float)scale; return 1;
    case MPG_F64: s->d = scale; return 1;
    case MPG_F16:
    case MPG_BF16: s->h = mpg__f32_to_half(dt, (float)scale); return 1;
    case MPG_I32:
    case MPG_I64: return 0;
  }
  return 0;
}

/* Enqueue the operation on c->nccl (lock held). */
static ncclResult_t enqueue(mpg__comm *c, const mpg__coll *k, ncclDataType_t dt,
                            ncclRedOp_t op, cudaStream_t s, const char **call) {
  switch (k->kind) {
    case MPG__ALL_REDUCE:
      *call = "ncclAllReduce";
      return ncclAllReduce(k->send, k->recv, k->count, dt, op, c->nccl, s);
    case MPG__BROADCAST:
      *call = "ncclBroadcast";
      return ncclBroadcast(k->send ? k->send : k->recv, k->recv, k->count, dt,
                           k->root, c->nccl, s);
    case MPG__ALL_GATHER:
      *call = "ncclAllGather";
      return ncclAllGather(k->send, k->recv, k->count, dt, c->nccl, s);
    case MPG__REDUCE_SCATTER:
      *call = "ncclReduceScatter";
      return ncclReduceScatter(k->send, k->recv, k->count, dt, op, c->nccl, s);
    case MPG__BARRIER:
      *call = "ncclAllReduce (barrier)";
      return ncclAllReduce(c->scratch, c->scratch, 1, ncclInt32, ncclMax,
                           c->nccl, s);
    case MPG__SEND:
    case MPG__RECV: {
      *call = k->kind == MPG__SEND ? "ncclSend" : "ncclRecv";
      ncclResult_t r = ncclGroupStart();
      if (r != ncclSuccess) {
        *call = "ncclGroupStart";
        return r;
      }
      if (k->kind == MPG__SEND)
        r = ncclSend(k->send, k->count, dt, k->peer, c->nccl, s);
      else
        r = ncclRecv(k->recv, k->count, dt, k->peer, c->nccl, s);
      ncclResult_t e = ncclGroupEnd(); /* always close the group */
      if (r != ncclSuccess) return r;
      if (e != ncclSuccess) *call = "ncclGroupEnd";
      return e;
    }
  }
  *call = "?";
  return ncclInvalidArgument;
}

/* Enqueue the sends and receives k[0..n) as one NCCL group (lock held):
 * NCCL starts them together, so none waits for another.  Operations of
 * zero elements are skipped (their peers skip them alike). */
static ncclResult_t enqueue_batch(mpg__comm *c, const mpg__coll *k, int n, cudaStream_t s,
                                  const char **call) {
  *call = "ncclGroupStart";
  ncclResult_t r = ncclGroupStart();
  if (r != ncclSuccess) return r;
  for (int i = 0; i < n && r == ncclSuccess; i++) {
    ncclDataType_t dt;
    if (k[i].count == 0) continue;
    if (!map_dtype(k[i].dtype, &dt)) {
      r = ncclInvalidArgument;
    } else if (k[i].kind == MPG__SEND) {
      *call = "ncclSend";
      r = ncclSend(k[i].send, k[i].count, dt, k[i].peer, c->nccl, s);
    } else {
      *call = "ncclRecv";
      r = ncclRecv(k[i].recv, k[i].count, dt, k[i].peer, c->nccl, s);
    }
  }
  /* Always close the group: after a failed call inside it, ncclGroupEnd
   * reports the error and launches nothing. */
  ncclResult_t e = ncclGroupEnd();
  if (r != ncclSuccess) return r;
  if (e != ncclSuccess) *call = "ncclGroupEnd";
  return e;
}

/* What post_ops checked and mapped before posting, carried through its steps. */
typedef struct post_plan {
  char what[200];    /* describe_ops's text, the head of every message */
  mpg_dtype dtype;   /* the operation's dtype (MPG_I32 for a barrier) */
  ncclDataType_t dt; /* NCCL's dtype of the enqueue */
  ncclRedOp_t op;    /* NCCL's op of the enqueue (ncclSum when it has none) */
  scalar_t scalar;   /* a pre-multiplied sum's scalar */
  int premul;        /* op is a pre-multiplied sum that this call creates */
  size_t moved;      /* zero: nothing to move */
} post_plan;

/* Check the operation (or batch) k and map its dtype and op into *plan. */
static mpg_status plan_post(mpg__comm *c, const mpg__coll *k, int nops, post_plan *plan) {
  plan->dtype = k->kind == MPG__BARRIER ? MPG_I32 : k->dtype;
  describe_ops(plan->what, sizeof plan->what, c, nops, k->kind, plan->dtype, k->op, k->count);
  const char *what = plan->what;
  plan->moved = nops ? 0 : k->count; /* zero: nothing to move */
  for (int i = 0; i < nops; i++) {
    ncclDataType_t batch_dt;
    if ((k[i].kind != MPG__SEND && k[i].kind != MPG__RECV) || !map_dtype(k[i].dtype, &batch_dt))
      return mpg__fail(MPG_ERR_INVALID, "%s: operation %d is not a send or receive of a "
                       "known dtype", what, i);
    plan->moved |= k[i].count;
  }
  int abort_reason = atomic_load(&c->aborted);
  if (abort_reason != MPG_OK)
    return mpg__fail(MPG_ERR_ABORTED, "%s: the communicator was aborted (%s)",
                     what, mpg_status_name((mpg_status)abort_reason));
  if (!map_dtype(plan->dtype, &plan->dt))
    return mpg__fail(MPG_ERR_INVALID, "%s: unknown dtype %d", what, (int)plan->dtype);
  plan->op = ncclSum;
  plan->premul = uses_op(k->kind) && k->op == MPG__OP_PREMUL_SUM;
  if (uses_op(k->kind) && !plan->premul && !map_op(k->op, &plan->op))
    return mpg__fail(MPG_ERR_INVALID, "%s: unknown op %d", what, (int)k->op);
  if (plan->premul && !make_scalar(plan->dtype, k->scale, &plan->scalar))
    return mpg__fail(MPG_ERR_INVALID, "%s: a scaled sum needs a floating dtype",
                     what);
  return MPG_OK;
}

/* A new request with its two events, c's device made current (*prev_dev to give back). */
static mpg_status req_new(const mpg__comm *c, const char *what, mpg__req **out,
                          int *prev_dev) {
  mpg__req *req = calloc(1, sizeof *req);
  if (!req) return mpg__fail(MPG_ERR_NOMEM, "%s: out of memory", what);
  cudaError_t ce = mpg__nccl_dev_enter(c->device, prev_dev);
  if (ce != cudaSuccess) {
    free(req);
    return mpg__nccl_fail_cuda(MPG_ERR_BACKEND, what, "cudaSetDevice", ce);
  }
  ce = cudaEventCreateWithFlags(&req->start, cudaEventDisableTiming);
  if (ce == cudaSuccess) {
    ce = cudaEventCreateWithFlags(&req->event, cudaEventDisableTiming);
    if (ce != cudaSuccess) (void)cudaEventDestroy(req->start);
  }
  if (ce != cudaSuccess) {
    mpg__nccl_dev_leave(c->device, *prev_dev);
    free(req);
    return mpg__nccl_fail_cuda(MPG_ERR_BACKEND, what, "cudaEventCreateWithFlags", ce);
  }
  *out = req;
  return MPG_OK;
}

/* Undo req_new after a failed post: the events, the device, the request. */
static void req_discard(const mpg__comm *c, mpg__req *req, int prev_dev) {
  (void)cudaEventDestroy(req->start);
  (void)cudaEventDestroy(req->event);
  mpg__nccl_dev_leave(c->device, prev_dev);
  free(req);
}

/* The barrier's zeroed device word, made once per communicator (lock held). */
static mpg_status barrier_scratch_locked(mpg__comm *c, const char *what) {
  if (c->scratch) return MPG_OK;
  void *word = NULL;
  cudaError_t ce = cudaMalloc(&word, sizeof(int));
  if (ce == cudaSuccess) ce = cudaMemset(word, 0, sizeof(int));
  if (ce != cudaSuccess) {
    if (word) (void)cudaFree(word);
    return mpg__nccl_fail_cuda(MPG_ERR_BACKEND, what, "cudaMalloc (barrier scratch)", ce);
  }
  c->scratch = word;
  return MPG_OK;
}

/* Everything on the stream before the operation's work, start event last (lock held). */
static mpg_status start_locked(mpg__comm *c, const mpg__coll *k, cudaStream_t stream,
                               mpg__req *req, const char *what) {
  if (!c->nccl) return mpg__fail(MPG_ERR_ABORTED, "%s: the communicator is gone", what);
  if (k->kind == MPG__BARRIER) {
    mpg_status st = barrier_scratch_locked(c, what);
    if (st != MPG_OK) return st;
  }
  /* Behind the family's previous launch when meshpg keeps the order
   * (reg.c); before the start event, so that the wait is not counted. */
  cudaError_t ce = mpg__nccl_family_order_before(c, stream);
  if (ce != cudaSuccess)
    return mpg__nccl_fail_cuda(MPG_ERR_BACKEND, what, "cudaStreamWaitEvent (launch order)", ce);
  /* The timeout's clock starts when the stream gets here (see the top). */
  ce = cudaEventRecord(req->start, stream);
  if (ce != cudaSuccess)
    return mpg__nccl_fail_cuda(MPG_ERR_BACKEND, what, "cudaEventRecord (start)", ce);
  return MPG_OK;
}

/* Whether k reduces in f32 through widen.c (post_locked says why). */
static int goes_through_f32(const mpg__coll *k, const post_plan *plan) {
  return (k->acc_f32 || k->op == MPG_OP_AVG || plan->premul) && uses_op(k->kind) &&
         mpg__dtype_is_half(plan->dtype);
}

/* Create a pre-multiplied sum's op if any, then enqueue k; both settled (lock held). */
static mpg_status enqueue_settled(mpg__comm *c, const mpg__coll *k, int nops,
                                  cudaStream_t stream, double deadline, post_plan *plan,
                                  ncclResult_t *res, const char **call) {
  mpg_status st = MPG_OK;
  if (plan->premul) {
    *call = "ncclRedOpCreatePreMulSum";
    *res = ncclRedOpCreatePreMulSum(&plan->op, &plan->scalar, plan->dt,
                                    ncclScalarHostImmediate, c->nccl);
    if (*res == ncclSuccess || *res == ncclInProgress)
      st = mpg__nccl_settle_locked(c, c->nccl, deadline, res);
    if (st != MPG_OK || *res != ncclSuccess) {
      plan->premul = 0; /* nothing to destroy */
      return st;
    }
  }
  *res = nops ? enqueue_batch(c, k, nops, stream, call)
              : enqueue(c, k, plan->dt, plan->op, stream, call);
  if (*res == ncclSuccess || *res == ncclInProgress)
    st = mpg__nccl_settle_locked(c, c->nccl, deadline, res);
  return st;
}

/* The enqueue's outcome as a status and message; on success the end event (lock held). */
static mpg_status report_locked(mpg__comm *c, mpg__req *req, cudaStream_t stream,
                                const char *what, mpg_status st, ncclResult_t res,
                                const char *call) {
  if (st == MPG_ERR_TIMEOUT) {
    mpg__nccl_abort_locked(c, MPG_ERR_TIMEOUT);
    return mpg__fail(MPG_ERR_TIMEOUT,
                     "%s: %s still in progress after %.3g s (the communicator "
                     "was aborted)",
                     what, call, c->timeout_s);
  }
  if (st != MPG_OK)
    return mpg__fail(MPG_ERR_ABORTED, "%s: aborted during %s (%s)", what, call,
                     mpg_status_name(st));
  if (res != ncclSuccess) return mpg__nccl_fail(MPG_ERR_BACKEND, what, call, res);
  cudaError_t ce = cudaEventRecord(req->event, stream);
  if (ce != cudaSuccess) return mpg__nccl_fail_cuda(MPG_ERR_BACKEND, what, "cudaEventRecord", ce);
  if ((ce = mpg__nccl_family_order_after(c, stream)) != cudaSuccess)
    return mpg__nccl_fail_cuda(MPG_ERR_BACKEND, what, "cudaEventRecord (launch order)", ce);
  return MPG_OK;
}

/* The operation on c, from the start event to the end event (lock held). */
static mpg_status post_locked(mpg__comm *c, const mpg__coll *k, int nops, cudaStream_t stream,
                              double deadline, post_plan *plan, mpg__req *req) {
  const char *what = plan->what;
  mpg_status st = start_locked(c, k, stream, req, what);
  if (st != MPG_OK) return st;
  if (k->kind != MPG__BARRIER && plan->moved == 0)
    /* Nothing to move; every member skips alike.  NCCL is not called, so
     * NULL buffers of zero elements are fine. */
    return report_locked(c, req, stream, what, MPG_OK, ncclSuccess, "?");
  /* An f16/bf16 average, at every group size: NCCL's ncclAvg of a half is
   * a pre-multiplied sum whose scalar is half(1/size) (src/enqueue.cc:
   * 2304-2312), and the pre-multiply rounds every addend to the half
   * (src/device/reduce_kernel.h:665-716) before the sum: 1/3 is inexact,
   * and even at a power of two the scaled addend is rounded once more than
   * on the CPU backends (which sum in f32 and divide once), so a small one
   * underflows: 1e-7 in f16 times half(1/8) is 0.  A scaled f16/bf16 sum
   * likewise: NCCL's pre-multiply scalar has the element's own type (a
   * small scale such as 1 / (dp * cp * microbatches) would be rounded, or
   * underflow in f16) and each scaled addend is rounded to the half.  Both
   * go through the f32 path (widen.c): each element widened (and scaled) in
   * f32, reduced by NCCL in ncclFloat32 (ncclAvg for an average: its
   * pre-multiply by float(1/size) in f32 is exact at a power of two), and
   * narrowed once into recv below; the wire then carries f32. */
  mpg__coll wide; /* f32 accumulation: the f32 stand-in for k (widen.c) */
  int widened = goes_through_f32(k, plan);
  if (widened) {
    st = mpg__nccl_widen(c, k, plan->premul ? k->scale : 1.0, stream, what, &wide);
    if (st) return st;
    plan->dt = ncclFloat32;
    if (plan->premul) plan->op = ncclSum;
    plan->premul = 0;
  }
  ncclResult_t res = ncclSuccess;
  const char *call = "?";
  st = enqueue_settled(c, widened ? &wide : k, nops, stream, deadline, plan, &res, &call);
  /* The op is destroyed only once the enqueue settled with ncclSuccess on
   * a communicator not aborted: after ncclInProgress NCCL allows only
   * ncclCommGetAsyncError and ncclCommAbort until the state settles (the
   * NCCL user guide, "Creating a communication with options", non-blocking
   * communicators), and ncclRedOpDestroy checks neither (src/enqueue.cc:
   * 2708-2736); a timeout or an error aborts the communicator, and the
   * abort frees the op with it (commFree, src/init.cc:264). */
  if (plan->premul && st == MPG_OK && res == ncclSuccess && c->nccl &&
      atomic_load(&c->aborted) == MPG_OK)
    (void)ncclRedOpDestroy(plan->op, c->nccl);
  if (widened) {
    /* Narrow only after a successful enqueue; free the f32 buffer always. */
    int enqueued = st == MPG_OK && res == ncclSuccess;
    mpg_status narrow_st = mpg__nccl_narrow(k, &wide, enqueued, stream, what);
    if (enqueued && narrow_st) return narrow_st;
  }
  return report_locked(c, req, stream, what, st, res, call);
}

/* Post one operation k (nops == 0) or the batch k[0..nops) of sends and
 * receives; one request and one event either way. */
static mpg_status post_ops(mpg__comm *c, const mpg__coll *k, int nops, mpg__req **out) {
  *out = NULL;
  double posted = mpg__now();
  post_plan plan;
  mpg_status st = plan_post(c, k, nops, &plan);
  if (st != MPG_OK) return st;
  mpg__req *req = NULL;
  int prev_dev = -1;
  st = req_new(c, plan.what, &req, &prev_dev);
  if (st != MPG_OK) return st;
  cudaStream_t stream = (cudaStream_t)k->stream;
  double deadline = mpg__now() + c->timeout_s;
  mpg__nccl_lock(c);
  st = post_locked(c, k, nops, stream, deadline, &plan, req);
  pthread_mutex_unlock(&c->lock);
  if (st != MPG_OK) {
    req_discard(c, req, prev_dev);
    return st;
  }
  mpg__nccl_dev_leave(c->device, prev_dev);
  atomic_fetch_add(&c->refs, 1);
  req->comm = c;
  req->posted = posted;
  req->timeout_s = c->timeout_s;
  req->kind = k->kind;
  req->dtype = plan.dtype;
  req->op = k->op;
  req->count = k->count;
  req->nops = nops;
  *out = req;
  return MPG_OK;
}

mpg_status mpg__nccl_post(mpg__comm *c, const mpg__coll *k, mpg__req **out) {
  return post_ops(c, k, 0, out);
}

mpg_status mpg__nccl_post_batch(mpg__comm *c, const mpg__coll *list, int n,
                                mpg__req **out) {
  if (n < 1) {
    *out = NULL;
    return mpg__fail(MPG_ERR_INVALID, "nccl p2p_batch: %d operations", n);
  }
  return post_ops(c, list, n, out);
}

static mpg_status req_fail(mpg__req *q, mpg_status st, const char *fmt,
                           const char *detail) {
  char what[200];
  req_describe(what, sizeof what, q);
  q->done = 1;
  q->status = st;
  return mpg__fail(st, fmt, what, detail);
}

/* MPG_ERR_TIMEOUT when the pending request q is past its clock (see the top
 * of this file) for a timeout of `budget` seconds; the request stays
 * pending (the caller aborts the communicator). */
static mpg_status past_clock(const mpg__req *q, double budget) {
  double now = mpg__now();
  char what[200];
  if (q->started > 0 && now > q->started + budget) {
    req_describe(what, sizeof what, q);
    if (q->comm && q->comm->size == 2) /* two members: the missing one is the other */
      return mpg__fail(MPG_ERR_TIMEOUT,
                       "%s: not complete %.3g s (the timeout) after the GPU reached it, "
                       "%.3g s after the post (position %d, the other member, did not "
                       "arrive?  its kernel is still waiting on the stream)",
                       what, budget, now - q->posted, 1 - q->comm->rank);
    return mpg__fail(MPG_ERR_TIMEOUT,
                     "%s: not complete %.3g s (the timeout) after the GPU reached it, "
                     "%.3g s after the post (a peer did not arrive?  NCCL does not say "
                     "which member is missing: its kernel is still waiting on the stream)",
                     what, budget, now - q->posted);
  }
  if (!(q->started > 0) && now > q->posted + START_LIMIT * budget) {
    req_describe(what, sizeof what, q);
    return mpg__fail(MPG_ERR_TIMEOUT,
                     "%s: the stream did not reach the operation within %.3g s of the "
                     "post (%d x the %.3g s timeout): work queued before it on the stream "
                     "never finished (a kernel that does not end, or an earlier "
                     "collective still waiting for a peer)",
                     what, now - q->posted, START_LIMIT, budget);
  }
  return MPG_OK;
}

/* One look; past the request's own clock (the communicator's timeout at
 * the post) a pending request is MPG_ERR_TIMEOUT, so that mpg_work_test
 * needs no blocking wait to find a timeout (backend.h test_keeps_time). */
static mpg_status test_once(mpg__req *q, int *done);

mpg_status mpg__nccl_test(mpg__req *q, int *done) {
  mpg_status st = test_once(q, done);
  if (st || *done) return st;
  return q->timeout_s > 0 ? past_clock(q, q->timeout_s) : MPG_OK;
}

static mpg_status test_once(mpg__req *q, int *done) {
  *done = 0;
  if (q->done) {
    *done = 1;
    if (q->status == MPG_OK) return MPG_OK;
    char what[200];
    req_describe(what, sizeof what, q);
    return mpg__fail(q->status, "%s: failed earlier (%s)", what,
                     mpg_status_name(q->status));
  }
  mpg__comm *c = q->comm;
  cudaError_t ce = cudaEventQuery(q->event);
  const char *call = "cudaEventQuery";
  if (ce == cudaSuccess || ce == cudaErrorNotReady) {
    /* The timeout's clock (see the top of this file). */
    cudaError_t se = q->started > 0 || ce == cudaSuccess ? cudaSuccess : cudaEventQuery(q->start);
    if (se == cudaSuccess && !(q->started > 0)) q->started = mpg__now();
    if (se != cudaSuccess && se != cudaErrorNotReady) {
      ce = se;
      call = "cudaEventQuery (start)";
    }
  }
  if (ce != cudaSuccess && ce != cudaErrorNotReady) {
    (void)cudaGetLastError();
    *done = 1;
    char detail[160];
    snprintf(detail, sizeof detail, "%s: %s", call, cudaGetErrorString(ce));
    return req_fail(q, MPG_ERR_BACKEND, "%s: %s", detail);
  }
  /* Read after the event: an abort is published before ncclCommAbort, so
   * an event that fired because the abort cut the kernel short is seen
   * here with the flag set (see the top of this file). */
  int why = atomic_load(&c->aborted);
  if (why != MPG_OK) {
    *done = 1;
    return req_fail(q, (mpg_status)why,
                    ce == cudaSuccess
                        ? "%s: the communicator was aborted (%s) before the operation was seen "
                          "complete: its kernel may have been cut short by the abort, after "
                          "which the stream goes on and its event fires, so its result is not trusted"
                        : "%s: the communicator was aborted (%s)",
                    mpg_status_name((mpg_status)why));
  }
  ncclResult_t state = ncclSuccess, r = ncclSuccess;
  pthread_mutex_lock(&c->lock);
  if (c->nccl) r = ncclCommGetAsyncError(c->nccl, &state);
  pthread_mutex_unlock(&c->lock);
  if (r == ncclSuccess && (state == ncclSuccess || state == ncclInProgress)) {
    if (ce == cudaSuccess) {
      q->done = 1;
      q->status = MPG_OK;
      q->ended = mpg__now(); /* for the flight recorder (req_times) */
      *done = 1;
    }
    return MPG_OK;
  }
  ncclResult_t bad = r != ncclSuccess ? r : state;
  char detail[1024];
  const char *d = mpg__nccl_detail();
  snprintf(detail, sizeof detail, "%s%s%s", ncclGetErrorString(bad),
           d[0] ? ": " : "", d);
  /* NCCL's rule: after an asynchronous error the communicator cannot be
   * used again and must be aborted (ncclCommAbort), which also frees
   * kernels of it still waiting on the device.  It is marked here; the
   * generic layer then aborts it with every other communicator of the
   * context, in one NCCL group (lifecycle.c, R8).  Also when the event has
   * fired: the error may be this operation's (a send's kernel can finish
   * while NCCL's proxy still sends), and the step is not trusted. */
  pthread_mutex_lock(&c->lock);
  (void)mpg__nccl_abort_locked(c, MPG_ERR_ABORTED);
  pthread_mutex_unlock(&c->lock);
  *done = 1;
  return req_fail(q, MPG_ERR_BACKEND,
                  "%s: the communicator reported an asynchronous error "
                  "(ncclCommGetAsyncError): %s; it is aborted (ncclCommAbort, "
                  "together with the context's other communicators), as NCCL requires",
                  detail);
}

mpg_status mpg__nccl_wait(mpg__req *q, double deadline) {
  unsigned spins = 0;
  /* The caller's timeout, measured from the post (see the top of this
   * file). */
  double budget = deadline - q->posted;
  if (!(budget > 0)) budget = 0;
  double next_poll = mpg__now() + 0.01;
  for (;;) {
    int done = 0;
    mpg_status st = test_once(q, &done);
    if (st != MPG_OK || done) return st;
    /* R4: the peer this operation waits for may have failed on another
     * communicator of the context (a closed connection, a local out of
     * memory aborted there): check the others every 10 ms, so that the
     * context is aborted now rather than at the timeout. */
    if (mpg__now() >= next_poll) {
      next_poll = mpg__now() + 0.01;
      int orank = -1, osize = 0;
      ncclResult_t bad = mpg__nccl_family_poll(q->comm, &orank, &osize);
      if (bad != ncclSuccess) {
        char detail[1024];
        const char *d = mpg__nccl_detail();
        snprintf(detail, sizeof detail, "rank %d of a group of %d: %s%s%s", orank, osize,
                 ncclGetErrorString(bad), d[0] ? ": " : "", d);
        return req_fail(q, MPG_ERR_BACKEND,
                        "%s: another communicator of the context reported an asynchronous "
                        "error (%s); the context is aborted",
                        detail);
      }
    }
    if ((st = past_clock(q, budget))) return st;
    mpg__nccl_backoff(&spins);
  }
}

void mpg__nccl_req_free(mpg__req *q) {
  if (!q) return;
  /* Destroying an event still pending is allowed: CUDA frees it once it
   * completes. */
  (void)cudaEventDestroy(q->start);
  (void)cudaEventDestroy(q->event);
  mpg__nccl_comm_unref(q->comm);
  free(q);
}

/* backend.h req_times: when the start and end events were first seen
 * complete (the flight recorder's device-side times). */
void mpg__nccl_req_times(const mpg__req *q, double *start, double *end) {
  *start = q->started;
  *end = q->ended;
}
