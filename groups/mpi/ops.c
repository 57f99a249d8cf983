/* Operations of the MPI backend: post, test, wait and free, over
 * nonblocking MPI calls polled against the caller's deadline (layer:
 * above orphans.c, ring.c, staging.c and pending.c; below progress.c,
 * which polls its requests, and world.c, whose table it fills).
 *
 * Data types.  f32, f64, i32 and i64 map to MPI types and reduce natively
 * (SUM, MAX, MIN).  f16/bf16 have no MPI reduction, so they are widened into
 * an f32 staging buffer, reduced in f32 and narrowed once when the operation
 * completes (f32 accumulation).  Broadcast, all_gather and send/recv move
 * 16-bit data untouched as MPI_UINT16_T.  AVG is a SUM divided by the group
 * size on completion (integers truncate); PREMUL_SUM multiplies a staged
 * copy of the input, then sums.  All post-processing (divide, narrow, copy
 * out) runs in test/wait when completion is first observed.  MPI never sees
 * a caller's buffer: see staging.c.  Large all-reduces run as meshpg's own
 * ring (ring.c).
 *
 * Large counts.  MPI counts are int.  An operation of more than INT_MAX
 * elements is cut into chunks of at most INT_MAX elements, each its own
 * nonblocking MPI call, all posted in the same order on every rank (so they
 * match).  all_gather and reduce_scatter chunk through one Ibcast / Ireduce
 * per member and chunk, which keeps every MPI buffer contiguous and every
 * reduction on a predefined type.
 *
 * Timeouts.  Every operation is nonblocking and wait polls MPI_Test until
 * the deadline: back to back (yielding the CPU) for a spin window, then
 * with sleeps growing to 1 ms (see mpg__mpi_poller_pause() in pending.c).
 * A request freed before it finished is orphaned (orphans.c); a
 * communicator that was aborted fails later posts with the reason. */
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpi_internal.h"

/* "all_reduce (op avg, dtype bf16, count 1024) on a group of size 4
 * (rank 2)" */
static void describe(char *buf, size_t n, mpg__coll_kind kind, mpg_dtype dt,
                     mpg_op op, size_t count, int peer, int size, int rank) {
  int k = 0;
  switch (kind) {
    case MPG__BARRIER:
      k = snprintf(buf, n, "barrier");
      break;
    case MPG__ALL_REDUCE:
    case MPG__REDUCE_SCATTER:
      k = snprintf(buf, n, "%s (op %s, dtype %s, count %zu)", mpg__kind_name(kind),
                   mpg__op_name(op), mpg_dtype_name(dt), count);
      break;
    case MPG__BROADCAST:
      k = snprintf(buf, n, "broadcast (root position %d, dtype %s, count %zu)", peer,
                   mpg_dtype_name(dt), count);
      break;
    case MPG__SEND:
    case MPG__RECV:
      k = snprintf(buf, n, "%s (peer position %d, dtype %s, count %zu)", mpg__kind_name(kind),
                   peer, mpg_dtype_name(dt), count);
      break;
    case MPG__ALL_GATHER:
      k = snprintf(buf, n, "all_gather (dtype %s, count %zu per member)",
                   mpg_dtype_name(dt), count);
      break;
  }
  if (k < 0 || (size_t)k >= n) return;
  snprintf(buf + k, n - (size_t)k, " on a group of size %d (this member: position %d)", size,
           rank);
}

static void a2a_describe(char *buf, size_t n, mpg_dtype dt, size_t out, size_t in,
                         int size, int rank) {
  snprintf(buf, n, "all_to_all (dtype %s, %zu elements to send, %zu to receive) on a "
           "group of size %d (this member: position %d)", mpg_dtype_name(dt), out, in, size,
           rank);
}

static void req_describe(const mpg__req *q, char *buf, size_t n) {
  if (q->a2a) {
    a2a_describe(buf, n, q->dtype, q->count, q->a2a_in, q->size, q->rank);
    return;
  }
  describe(buf, n, q->kind, q->dtype, q->op, q->count, q->peer, q->size,
           q->rank);
}

static MPI_Datatype mpi_type(mpg_dtype dt) {
  switch (dt) {
    case MPG_F32: return MPI_FLOAT;
    case MPG_F64: return MPI_DOUBLE;
    case MPG_I32: return MPI_INT32_T;
    case MPG_I64: return MPI_INT64_T;
    case MPG_F16:
    case MPG_BF16: return MPI_UINT16_T; /* raw bits; never reduced */
  }
  return MPI_DATATYPE_NULL;
}

static MPI_Op mpi_op(mpg_op op) {
  return op == MPG_OP_MAX ? MPI_MAX : op == MPG_OP_MIN ? MPI_MIN : MPI_SUM;
}

/* ------------------------------------------------------------------ */
/* Posting                                                             */
/* ------------------------------------------------------------------ */

/* Post chunked contiguous operations.  Lock held.  Each appends requests
 * to q->reqs[q->nreq++]. */
static int post_allreduce(mpg__req *q, MPI_Comm c, void *buf, size_t n,
                          size_t es, MPI_Datatype t, MPI_Op op) {
  size_t ck = (size_t)mpg__mpi.chunk;
  for (size_t off = 0; off < n || (n == 0 && off == 0); off += ck) {
    int k = (int)(n - off < ck ? n - off : ck);
    int rc = MPI_Iallreduce(MPI_IN_PLACE, (char *)buf + off * es, k, t, op, c,
                            &q->reqs[q->nreq]);
    if (rc != MPI_SUCCESS) return rc;
    q->nreq++;
    if (n == 0) break;
  }
  return MPI_SUCCESS;
}

static int post_bcast(mpg__req *q, MPI_Comm c, void *buf, size_t n, size_t es,
                      MPI_Datatype t, int root) {
  size_t ck = (size_t)mpg__mpi.chunk;
  for (size_t off = 0; off < n || (n == 0 && off == 0); off += ck) {
    int k = (int)(n - off < ck ? n - off : ck);
    int rc = MPI_Ibcast((char *)buf + off * es, k, t, root, c, &q->reqs[q->nreq]);
    if (rc != MPI_SUCCESS) return rc;
    q->nreq++;
    if (n == 0) break;
  }
  return MPI_SUCCESS;
}

static int post_p2p(mpg__req *q, MPI_Comm c, int is_send, const void *buf,
                    size_t n, size_t es, MPI_Datatype t, int peer) {
  size_t ck = (size_t)mpg__mpi.chunk;
  for (size_t off = 0; off < n || (n == 0 && off == 0); off += ck) {
    int k = (int)(n - off < ck ? n - off : ck);
    char *p = (char *)buf + off * es;
    int rc = is_send ? MPI_Isend(p, k, t, peer, MPG_MPI_TAG, c, &q->reqs[q->nreq])
                     : MPI_Irecv(p, k, t, peer, MPG_MPI_TAG, c, &q->reqs[q->nreq]);
    if (rc != MPI_SUCCESS) return rc;
    q->nreq++;
    if (n == 0) break;
  }
  return MPI_SUCCESS;
}

/* buf (size * n elements) gets every member's block; this rank's block is
 * already in place. */
static int post_allgather(mpg__req *q, mpg__comm *m, void *buf, size_t n,
                          size_t es, MPI_Datatype t) {
  if (n <= (size_t)mpg__mpi.chunk) {
    int rc = MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, (int)n, t,
                            m->comm, &q->reqs[q->nreq]);
    if (rc == MPI_SUCCESS) q->nreq++;
    return rc;
  }
  for (int p = 0; p < m->size; p++) {
    int rc = post_bcast(q, m->comm, (char *)buf + (size_t)p * n * es, n, es, t, p);
    if (rc != MPI_SUCCESS) return rc;
  }
  return MPI_SUCCESS;
}

/* out (n) = reduction of block `rank` of every member's in (size * n);
 * in and out do not overlap. */
static int post_reduce_scatter(mpg__req *q, mpg__comm *m, const void *in,
                               void *out, size_t n, size_t es, MPI_Datatype t,
                               MPI_Op op) {
  size_t ck = (size_t)mpg__mpi.chunk;
  if (n <= ck) {
    int rc = MPI_Ireduce_scatter_block(in, out, (int)n, t, op, m->comm,
                                       &q->reqs[q->nreq]);
    if (rc == MPI_SUCCESS) q->nreq++;
    return rc;
  }
  for (int p = 0; p < m->size; p++) {
    const char *blk = (const char *)in + (size_t)p * n * es;
    for (size_t off = 0; off < n; off += ck) {
      int k = (int)(n - off < ck ? n - off : ck);
      int rc = MPI_Ireduce(blk + off * es, (char *)out + off * es, k, t, op, p,
                           m->comm, &q->reqs[q->nreq]);
      if (rc != MPI_SUCCESS) return rc;
      q->nreq++;
    }
  }
  return MPI_SUCCESS;
}

static size_t nchunks(size_t n) {
  size_t ck = (size_t)mpg__mpi.chunk;
  return n <= ck ? 1 : (n + ck - 1) / ck;
}

/* Fail a post with "mpi: <the operation>: <why>". */
static mpg_status post_fail(mpg_status st, const mpg__coll *c,
                            const mpg__comm *m, const char *why) {
  char what[256];
  describe(what, sizeof what, c->kind, c->dtype, c->op, c->count,
           c->kind == MPG__BROADCAST ? c->root : c->peer, m->size, m->rank);
  return mpg__fail(st, "mpi: %s: %s", what, why);
}

/* A post whose MPI call failed: parts already posted cannot be taken
 * back, so they are parked (orphaned) until MPI is done with them; with
 * nothing posted the request is released.  Lock held. */
static void park_failed(mpg__req *q, mpg__comm *m) {
  q->finished = 1;
  if (q->nreq > 0) {
    mpg__mpi_orphan(q);
  } else {
    mpg__mpi_comm_unref(m);
    mpg__mpi_req_release(q);
  }
}

/* Refuse a post on an aborted communicator or with arguments it cannot run. */
static mpg_status post_check(mpg__comm *m, const mpg__coll *coll, int peer) {
  mpg_status aborted = atomic_load(&m->aborted);
  if (aborted)
    return post_fail(aborted, coll, m, aborted == MPG_ERR_TIMEOUT
                     ? "the communicator was aborted after a timeout"
                     : "the communicator was aborted");
  if (coll->kind != MPG__BARRIER && mpg__dtype_size(coll->dtype) == 0)
    return post_fail(MPG_ERR_INVALID, coll, m, "unknown dtype");
  /* The largest staging buffer, (size + 1) * n elements of up to 8 bytes,
   * must fit in size_t. */
  if (coll->count > SIZE_MAX / 8 / ((size_t)m->size + 1))
    return post_fail(MPG_ERR_INVALID, coll, m, "count too large for memory");
  if ((coll->kind == MPG__SEND || coll->kind == MPG__RECV) &&
      (peer < 0 || peer >= m->size || peer == m->rank))
    return post_fail(MPG_ERR_INVALID, coll, m, "the peer is not another member");
  if (coll->kind == MPG__BROADCAST && (peer < 0 || peer >= m->size))
    return post_fail(MPG_ERR_INVALID, coll, m, "the root is not a member");
  return MPG_OK;
}

/* The staging elements (of the wire type) of an operation of kind on count n. */
static size_t stage_elems(mpg__coll_kind kind, int size, size_t n) {
  return kind == MPG__BARRIER ? 0 : kind == MPG__ALL_GATHER ? (size_t)size * n
         : kind == MPG__REDUCE_SCATTER ? ((size_t)size + 1) * n : n;
}

/* Copy the caller's data into `stage`, MPI's buffer, and describe q's completion step. */
static void stage_in(mpg__req *q, const mpg__coll *coll, char *stage, int widen, int zc,
                     int pipe) {
  size_t n = q->count, es = mpg__dtype_size(q->dtype), ws = widen ? sizeof(float) : es;
  mpg_dtype wdt = widen ? MPG_F32 : q->dtype;
  int premul = coll->op == MPG__OP_PREMUL_SUM, size = q->size, rank = q->rank;
  q->work_dtype = wdt;
  q->fin = zc ? FIN_NONE : widen ? FIN_NARROW : FIN_COPY;
  q->dst = coll->recv;
  q->nfin = n;
  q->out = stage;
  size_t in_elems = coll->kind == MPG__REDUCE_SCATTER ? (size_t)size * n : n;
  if (pipe) {
    /* Staged, divided and copied out piece by piece (struct piece). */
    q->src = coll->send;
    q->wire = stage;
    q->mtype = mpi_type(wdt);
    q->mop = mpi_op(coll->op);
    q->premul = premul ? coll->scale : 0;
    q->rop = coll->op;
    q->piece_div = coll->op == MPG_OP_AVG ? size : 0;
    q->piece_fin = q->fin;
    q->fin = FIN_NONE;
  }
  switch (pipe ? MPG__BARRIER : coll->kind) { /* pipe: nothing to do now */
    case MPG__ALL_REDUCE:
    case MPG__REDUCE_SCATTER:
      if (widen) mpg__half_widen(q->dtype, coll->send, (float *)stage, in_elems);
      else if (in_elems && !zc) memcpy(stage, coll->send, in_elems * es);
      if (premul) mpg__scale(wdt, stage, in_elems, coll->scale);
      if (coll->kind == MPG__REDUCE_SCATTER) q->out = stage + in_elems * ws;
      if (coll->op == MPG_OP_AVG) q->divisor = size;
      break;
    case MPG__ALL_GATHER:
      if (n) memcpy(stage + (size_t)rank * n * es, coll->send, n * es);
      q->nfin = (size_t)size * n;
      break;
    case MPG__BROADCAST:
      if (rank == q->peer) {
        if (n) memcpy(stage, coll->recv, n * es);
        q->fin = FIN_NONE; /* the root's buffer already holds the data */
      }
      break;
    case MPG__SEND:
      if (n) memcpy(stage, coll->send, n * es);
      q->fin = FIN_NONE;
      break;
    case MPG__RECV:
      break;
    case MPG__BARRIER:
      if (!pipe) q->fin = FIN_NONE;
      break;
  }
}

/* Post q's MPI calls over `stage`, naming the call in *call.  Lock held. */
static int post_calls(mpg__req *q, mpg__comm *m, char *stage, size_t ws, int pipe,
                      const char **call) {
  size_t n = q->count, es = mpg__dtype_size(q->dtype);
  MPI_Datatype t = mpi_type(q->work_dtype); /* MPI_FLOAT when widened */
  MPI_Op op = mpi_op(q->op);
  int rc = MPI_SUCCESS;
  switch (q->kind) {
    case MPG__ALL_REDUCE:
      *call = "MPI_Iallreduce";
      rc = pipe ? mpg__mpi_queue_allreduce(q, m, ws)
                : post_allreduce(q, m->comm, stage, n, ws, t, op);
      break;
    case MPG__REDUCE_SCATTER:
      *call = n <= (size_t)mpg__mpi.chunk ? "MPI_Ireduce_scatter_block" : "MPI_Ireduce";
      rc = post_reduce_scatter(q, m, stage, q->out, n, ws, t, op);
      break;
    case MPG__ALL_GATHER:
      *call = n <= (size_t)mpg__mpi.chunk ? "MPI_Iallgather" : "MPI_Ibcast";
      rc = post_allgather(q, m, stage, n, es, t);
      break;
    case MPG__BROADCAST:
      *call = "MPI_Ibcast";
      rc = post_bcast(q, m->comm, stage, n, es, t, q->peer);
      break;
    case MPG__BARRIER:
      *call = "MPI_Ibarrier";
      rc = MPI_Ibarrier(m->comm, &q->reqs[0]);
      if (rc == MPI_SUCCESS) q->nreq = 1;
      break;
    case MPG__SEND:
      *call = "MPI_Isend";
      rc = post_p2p(q, m->comm, 1, stage, n, es, t, q->peer);
      break;
    case MPG__RECV:
      *call = "MPI_Irecv";
      rc = post_p2p(q, m->comm, 0, stage, n, es, t, q->peer);
      break;
  }
  return rc;
}

mpg_status mpg__mpi_post(mpg__comm *m, const mpg__coll *coll, mpg__req **out) {
  *out = NULL;
  int peer = coll->kind == MPG__BROADCAST ? coll->root : coll->peer;
  mpg_status st = post_check(m, coll, peer);
  if (st) return st;
  mpg_dtype dt = coll->dtype;
  size_t es = mpg__dtype_size(dt), n = coll->count;
  int half = mpg__dtype_is_half(dt), size = m->size, rank = m->rank;
  mpg__req *q = calloc(1, sizeof *q);
  if (!q) return post_fail(MPG_ERR_NOMEM, coll, m, "out of memory for a request");
  q->kind = coll->kind;
  q->dtype = dt;
  q->op = coll->op;
  q->count = n;
  q->peer = peer;
  q->size = size;
  q->rank = rank;
  q->work_dtype = dt;
  int gather_like = coll->kind == MPG__ALL_GATHER || coll->kind == MPG__REDUCE_SCATTER;
  size_t maxreq = gather_like && n > (size_t)mpg__mpi.chunk ? (size_t)size * nchunks(n)
                                                            : nchunks(n);
  size_t wire = half ? sizeof(float) : es; /* all-reduce element on the wire */
  if (coll->kind == MPG__ALL_REDUCE && mpg__mpi_pipelined(n, wire))
    maxreq = 2 * mpg__mpi_npieces(n, wire);
  q->reqs = &q->one;
  if (maxreq > 1 && !(q->reqs = malloc(maxreq * sizeof *q->reqs))) {
    free(q);
    return post_fail(MPG_ERR_NOMEM, coll, m, "out of memory for the chunk requests");
  }

  /* Every buffer MPI sees is staging memory owned by the request (see
   * staging.c), sized here in elements of the wire type. */
  int widen = half && (coll->kind == MPG__ALL_REDUCE || coll->kind == MPG__REDUCE_SCATTER);
  size_t ws = widen ? sizeof(float) : es; /* f16/bf16 reduce in f32 */
  size_t bytes = stage_elems(coll->kind, size, n) * ws;
  /* Zero-copy: an in-place all-reduce on memory from mem_alloc, which
   * this backend owns (see struct region). */
  int zc = 0;
  if (coll->kind == MPG__ALL_REDUCE && !widen && coll->send == coll->recv && n > 0) {
    lock_g();
    struct region *r = mpg__mpi.we_finalized ? NULL : mpg__mpi_region_find(coll->recv, n * es);
    if (r && !r->freed) {
      r->busy++;
      q->region = r;
      zc = 1;
    }
    unlock_g();
  }
  if (bytes && !zc) {
    lock_g();
    q->stage = mpg__mpi_stage_take(m, bytes, &q->stage_cap);
    unlock_g();
    if (!q->stage) {
      q->stage = malloc(bytes);
      q->stage_cap = bytes;
    }
    if (!q->stage) {
      mpg__mpi_req_release(q);
      char why_nomem[64];
      snprintf(why_nomem, sizeof why_nomem, "out of memory for %zu staging bytes", bytes);
      return post_fail(MPG_ERR_NOMEM, coll, m, why_nomem);
    }
  }

  /* Copy in; describe the completion step.  An empty operation still
   * hands MPI a valid (unused) pointer. */
  static char empty[8];
  char *stage = zc ? (char *)coll->recv : q->stage ? (char *)q->stage : empty;
  int pipe = coll->kind == MPG__ALL_REDUCE && mpg__mpi_pipelined(n, ws);
  stage_in(q, coll, stage, widen, zc, pipe);
  const char *call = "?";
  lock_g();
  int rc = post_calls(q, m, stage, ws, pipe, &call);
  q->comm = m;
  m->refs++;
  if (rc != MPI_SUCCESS) {
    park_failed(q, m);
    unlock_g();
    char what[256];
    describe(what, sizeof what, coll->kind, dt, coll->op, n, peer, size, rank);
    return mpg__mpi_fail(rc, call, what);
  }
  mpg__mpi_pend_link(m, q);
  unlock_g();
  *out = q;
  return MPG_OK;
}

/* ------------------------------------------------------------------ */
/* All-to-all                                                          */
/* ------------------------------------------------------------------ */

/* One MPI_Ialltoallv carries every pair whose block has at most
 * chunk / size elements: then each side's blocks in it total at most
 * chunk <= INT_MAX elements, so its packed displacements fit an int.  A
 * larger block travels as its own Isend / Irecv (cut into chunks, as
 * post_p2p does) inside the same request.  Both members of a pair see
 * the same count (send_counts on one, recv_counts on the other), so they
 * always agree on how the pair travels, whatever the other pairs hold. */
static int a2a_in_call(size_t n, int size) {
  return n <= (size_t)mpg__mpi.chunk / (size_t)size;
}

/* Zero-copy for one side: every nonempty block lies in one mem_alloc
 * region and the displacements of the blocks in the MPI call fit an int;
 * the region is then marked busy.  Lock held. */
static struct region *a2a_region(const void *base, const size_t *c, const size_t *d,
                                 int size, size_t es) {
  size_t lo = SIZE_MAX, hi = 0;
  for (int p = 0; p < size; p++) {
    if (!c[p]) continue;
    if (a2a_in_call(c[p], size) && d[p] > (size_t)INT_MAX) return NULL;
    if (d[p] < lo) lo = d[p];
    if (d[p] + c[p] > hi) hi = d[p] + c[p];
  }
  if (hi == 0 || mpg__mpi.we_finalized) return NULL;
  struct region *r = mpg__mpi_region_find((const char *)base + lo * es, (hi - lo) * es);
  if (!r || r->freed) return NULL;
  r->busy++;
  return r;
}

/* Lay one side out: off[p] is block p's offset in the MPI buffer, ic /
 * id MPI's int counts and displacements (blocks outside the call get 0).
 * Staged: packed, the blocks of the call first.  Returns the elements. */
static size_t a2a_layout(const size_t *c, const size_t *d, int size, int zc, size_t *off,
                         int *ic, int *id) {
  size_t at = 0;
  for (int pass = 0; pass < 2; pass++)
    for (int p = 0; p < size; p++) {
      int in = a2a_in_call(c[p], size);
      if (pass == 0) ic[p] = id[p] = 0;
      if (!c[p] || in != (pass == 0)) continue;
      off[p] = zc ? d[p] : at;
      at += c[p];
      if (in) {
        ic[p] = (int)c[p];
        id[p] = (int)off[p];
      }
    }
  return at;
}

/* Sum the blocks to send and receive and the requests outside the call; 1 on overflow. */
static int a2a_totals(const size_t *scounts, const size_t *rcounts, int size, int rank,
                      size_t *stot, size_t *rtot, size_t *extra) {
  for (int p = 0; p < size; p++) {
    size_t nsend = p == rank ? 0 : scounts[p], nrecv = p == rank ? 0 : rcounts[p];
    if (nsend > SIZE_MAX / 16 - *stot || nrecv > SIZE_MAX / 16 - *rtot) return 1;
    *stot += nsend;
    *rtot += nrecv;
    *extra += (a2a_in_call(nsend, size) ? 0 : nchunks(nsend)) +
              (a2a_in_call(nrecv, size) ? 0 : nchunks(nrecv));
  }
  return 0;
}

/* A new all-to-all request with its count arrays and room for 1 + extra MPI requests. */
static mpg__req *a2a_req_new(int size, size_t extra) {
  mpg__req *q = calloc(1, sizeof *q);
  if (q) {
    q->a2a = calloc(4 * (size_t)size, sizeof *q->a2a);
    q->a2a_int = calloc(4 * (size_t)size, sizeof *q->a2a_int);
    q->reqs = &q->one;
    if (extra && q->a2a && q->a2a_int)
      q->reqs = malloc((1 + extra) * sizeof *q->reqs);
  }
  if (q && q->a2a && q->a2a_int && q->reqs) return q;
  if (q) {
    if (!q->reqs) q->reqs = &q->one;
    mpg__mpi_req_release(q);
  }
  return NULL;
}

/* Post the MPI_Ialltoallv and the blocks too large for it, naming it in *call.  Lock held. */
static int a2a_post(mpg__req *q, mpg__comm *m, char *sbase, char *rbase, const size_t *scnt,
                    size_t es, const char **call) {
  int size = m->size;
  const size_t *rcnt = q->a2a, *roff = rcnt + 2 * size, *soff = rcnt + 3 * size;
  const int *isc = q->a2a_int, *isd = isc + size, *irc = isd + size, *ird = irc + size;
  MPI_Datatype t = mpi_type(q->dtype);
  int rcode = MPI_Ialltoallv(sbase, isc, isd, t, rbase, irc, ird, t, m->comm, &q->reqs[0]);
  if (rcode == MPI_SUCCESS) q->nreq = 1;
  /* The blocks too large for the call: receives, then sends. */
  for (int dir = 0; dir < 2 && rcode == MPI_SUCCESS; dir++)
    for (int p = 0; p < size && rcode == MPI_SUCCESS; p++) {
      size_t n = dir ? scnt[p] : rcnt[p];
      if (!n || a2a_in_call(n, size)) continue;
      *call = dir ? "MPI_Isend" : "MPI_Irecv";
      rcode = post_p2p(q, m->comm, dir, dir ? sbase + soff[p] * es : rbase + roff[p] * es, n,
                       es, t, p);
    }
  return rcode;
}

mpg_status mpg__mpi_post_alltoallv(mpg__comm *m, const void *send, const size_t *sc,
                                   const size_t *sd, void *recv, const size_t *rc,
                                   const size_t *rd, mpg_dtype dt, mpg__req **out) {
  *out = NULL;
  int size = m->size, rank = m->rank;
  size_t es = mpg__dtype_size(dt), stot = 0, rtot = 0, extra = 0;
  int big = a2a_totals(sc, rc, size, rank, &stot, &rtot, &extra);
  char what[256];
  a2a_describe(what, sizeof what, dt, stot, rtot, size, rank);
  mpg_status aborted = atomic_load(&m->aborted);
  if (aborted)
    return mpg__fail(aborted, "mpi: %s: %s", what, aborted == MPG_ERR_TIMEOUT
                     ? "the communicator was aborted after a timeout"
                     : "the communicator was aborted");
  if (es == 0 || big || stot + rtot > SIZE_MAX / es)
    return mpg__fail(MPG_ERR_INVALID, "mpi: %s: %s", what,
                     es == 0 ? "unknown dtype" : "counts too large for memory");
  mpg__req *q = a2a_req_new(size, extra);
  if (!q) return mpg__fail(MPG_ERR_NOMEM, "mpi: %s: out of memory for a request", what);
  q->kind = MPG__ALL_GATHER; /* a collective (never cancelled as a receive) */
  q->dtype = q->work_dtype = dt;
  q->op = MPG_OP_SUM;
  q->count = stot;
  q->a2a_in = rtot;
  q->peer = -1;
  q->size = size;
  q->rank = rank;
  size_t *rcnt = q->a2a, *rdst = rcnt + size, *roff = rdst + size, *soff = roff + size;
  int *isc = q->a2a_int, *isd = isc + size, *irc = isd + size, *ird = irc + size;
  size_t *scnt = calloc((size_t)size, sizeof *scnt);
  if (!scnt) {
    mpg__mpi_req_release(q);
    return mpg__fail(MPG_ERR_NOMEM, "mpi: %s: out of memory for a request", what);
  }
  for (int p = 0; p < size; p++)
    if (p != rank) {
      scnt[p] = sc[p];
      rcnt[p] = rc[p];
      rdst[p] = rd[p];
    }

  /* Every buffer MPI sees is staging memory owned by the request (see
   * staging.c), one buffer for both sides, unless that side lies in
   * memory from mem_alloc (zero-copy, see struct region). */
  lock_g();
  q->region2 = stot ? a2a_region(send, scnt, sd, size, es) : NULL;
  q->region = rtot ? a2a_region(recv, rcnt, rd, size, es) : NULL;
  size_t bytes = ((q->region2 ? 0 : stot) + (q->region ? 0 : rtot)) * es;
  if (bytes) q->stage = mpg__mpi_stage_take(m, bytes, &q->stage_cap);
  unlock_g();
  if (bytes && !q->stage) {
    q->stage = malloc(bytes);
    q->stage_cap = bytes;
    if (!q->stage) {
      free(scnt);
      lock_g();
      mpg__mpi_req_release(q);
      unlock_g();
      return mpg__fail(MPG_ERR_NOMEM, "mpi: %s: out of memory for %zu staging bytes", what,
                       bytes);
    }
  }
  static char empty[8];
  char *sbase = q->region2 ? (char *)send : stot ? (char *)q->stage : empty;
  char *rbase = q->region ? (char *)recv
                : rtot ? (char *)q->stage + (q->region2 ? 0 : stot) * es : empty;
  a2a_layout(scnt, sd, size, q->region2 != NULL, soff, isc, isd);
  a2a_layout(rcnt, rd, size, q->region != NULL, roff, irc, ird);
  if (!q->region2) /* copy in */
    for (int p = 0; p < size; p++)
      if (scnt[p]) memcpy(sbase + soff[p] * es, (const char *)send + sd[p] * es, scnt[p] * es);
  q->fin = q->region || !rtot ? FIN_NONE : FIN_SCATTER;
  q->dst = recv;
  q->out = rbase;
  q->nfin = rtot;
  const char *call = "MPI_Ialltoallv";
  lock_g();
  int rcode = a2a_post(q, m, sbase, rbase, scnt, es, &call);
  free(scnt);
  q->comm = m;
  m->refs++;
  if (rcode != MPI_SUCCESS) {
    park_failed(q, m);
    unlock_g();
    return mpg__mpi_fail(rcode, call, what);
  }
  mpg__mpi_pend_link(m, q);
  unlock_g();
  *out = q;
  return MPG_OK;
}

/* Run the completion step once: divide, then copy or narrow the staged
 * result into the caller's buffer.  Called without the lock. */
static void finish(mpg__req *q) {
  if (q->divisor) mpg__divide(q->work_dtype, q->out, q->nfin, q->divisor);
  if (!q->nfin) return;
  if (q->fin == FIN_NARROW)
    mpg__half_narrow(q->dtype, q->out, q->dst, q->nfin);
  else if (q->fin == FIN_COPY)
    memcpy(q->dst, q->out, q->nfin * mpg__dtype_size(q->dtype));
  else if (q->fin == FIN_SCATTER) {
    size_t es = mpg__dtype_size(q->dtype);
    const size_t *a = q->a2a;
    for (int p = 0; p < q->size; p++)
      if (a[p]) /* count a[p], at a[size + p] in dst, a[2 size + p] in out */
        memcpy((char *)q->dst + a[q->size + p] * es,
               (char *)q->out + a[2 * q->size + p] * es, a[p] * es);
  }
}

/* Has q's MPI part completed?  Sets q->mpi_done.  Lock held; the caller
 * pumps q's communicator first.  Also used by the progress thread, which
 * then keeps an error in q->pipe_rc for the caller to report. */
int mpg__mpi_req_poll(mpg__req *q, int *flag) {
  int rc = MPI_SUCCESS;
  *flag = 0;
  if (q->pipe_rc)
    rc = q->pipe_rc;
  else if (atomic_load(&q->mpi_done))
    *flag = 1;
  else if (q->wire) /* pipelined: done when every piece was retired */
    *flag = q->unposted == 0 && q->inflight == 0;
  else if (q->unposted == 0) /* a collective's error reports on MPI_COMM_WORLD */
    rc = mpg__mpi_test_reqs(q->nreq, q->reqs, flag);
  if ((rc != MPI_SUCCESS || *flag) && !atomic_exchange(&q->mpi_done, 1))
    mpg__mpi_wake_waiters(); /* a waiter in another thread */
  return rc;
}

/* Test once.  Returns MPG_OK with *done, or the operation's error. */
static mpg_status progress(mpg__req *q, int *done) {
  *done = 0;
  if (q->finished) {
    *done = 1;
    return q->status;
  }
  mpg__comm *m = q->comm;
  mpg_status why = atomic_load(&m->aborted);
  if (why) {
    char what[256];
    req_describe(q, what, sizeof what);
    *done = 1;
    return mpg__fail(why, "mpi: %s: %s", what, why == MPG_ERR_TIMEOUT
                     ? "the communicator was aborted after a timeout"
                     : "the communicator was aborted");
  }
  int flag = 0, rc = MPI_SUCCESS;
  lock_g();
  if (m->queue || m->nflight) mpg__mpi_pump(m);
  rc = mpg__mpi_req_poll(q, &flag);
  if (rc != MPI_SUCCESS || flag) {
    mpg__mpi_purge(m, q);
    q->finished = 1;
    mpg__mpi_pend_unlink(m, q);
  }
  unlock_g();
  if (rc != MPI_SUCCESS) {
    char what[256];
    req_describe(q, what, sizeof what);
    q->status = mpg__mpi_fail(rc, "MPI_Test", what);
    *done = 1;
    return q->status;
  }
  if (flag) {
    finish(q);
    *done = 1;
  }
  return MPG_OK;
}

/* A test while the progress thread is driving only looks at the flag the
 * thread sets: no MPI call and no lock, so that a trainer testing work
 * between layers (mpg_sync_mark_ready does) never queues behind the
 * thread.  While the thread has backed off (nothing moved for a while,
 * see progress.c), a caller that polls drives MPI itself. */
mpg_status mpg__mpi_test(mpg__req *q, int *done) {
  if (!q->finished && mpg__mpi_progress_running() && !atomic_load(&q->mpi_done) &&
      !atomic_load(&q->comm->aborted)) {
    if (!mpg__mpi_progress_idle()) {
      *done = 0;
      return MPG_OK;
    }
  }
  return progress(q, done);
}

/* Waiting.  With a progress thread the waiter polls MPI itself only for
 * a short spin (a small operation finishes in that time, without the
 * thread hand-off), then sleeps until the thread sees an operation finish
 * (mpg__mpi_nap_on_done()).  Without one it polls
 * (mpg__mpi_poller_pause()). */
#define MPG_MPI_WAIT_SPIN_S 50e-6

mpg_status mpg__mpi_wait(mpg__req *q, double deadline) {
  mpg__mpi_poller pl;
  mpg__mpi_poller_init(&pl, q->stage_cap);
  double spin_end = mpg__now() + MPG_MPI_WAIT_SPIN_S;
  for (;;) {
    int done = 0;
    mpg_status st = progress(q, &done);
    if (done || st) return st;
    if (mpg__now() >= deadline) {
      char what[256], who[320];
      req_describe(q, what, sizeof what);
      /* Who never arrived: our ring knows its left neighbour's silence;
       * MPI's own collectives do not say. */
      if (q->wire) {
        lock_g();
        mpg__mpi_ring_detail(q->comm, q, who, sizeof who);
        unlock_g();
      } else if (!q->a2a && q->kind == MPG__RECV && q->peer >= 0) {
        snprintf(who, sizeof who, "; position %d never sent its message", q->peer);
      } else if (!q->a2a && q->kind == MPG__SEND && q->peer >= 0) {
        snprintf(who, sizeof who, "; position %d never received this message", q->peer);
      } else if (q->size == 2) {
        /* Two members: the missing one is the other. */
        snprintf(who, sizeof who, ": position %d, the other member, or it failed or "
                 "called with other arguments", 1 - q->rank);
      } else {
        snprintf(who, sizeof who, "; MPI does not say which of the %d other members did "
                 "not arrive", q->size - 1);
      }
      /* MESHPG_MPI_MAX_COUNT (testing) cuts every MPI call: a large
       * operation then needs count / max_count messages per step and may
       * simply outlast the timeout with every peer present. */
      char slow[200] = "";
      if (mpg__mpi.chunk < INT_MAX)
        snprintf(slow, sizeof slow, "; or too slow: MESHPG_MPI_MAX_COUNT=%ld sends at most "
                 "that many elements per MPI call", (long)mpg__mpi.chunk);
      return mpg__fail(MPG_ERR_TIMEOUT,
                       "mpi: %s: not finished within the %.3g s timeout (a peer "
                       "did not arrive%s%s)",
                       what, q->comm->timeout_s, who, slow);
    }
    if (mpg__mpi_progress_running() && mpg__now() >= spin_end)
      mpg__mpi_nap_on_done(q, deadline); /* rechecks under the lock */
    else
      mpg__mpi_poller_pause(&pl);
  }
}

void mpg__mpi_req_free(mpg__req *q) {
  if (!q) return;
  lock_g();
  int pending = !q->finished;
  for (int i = 0; i < q->nreq; i++)
    if (q->reqs[i] != MPI_REQUEST_NULL) pending = 1; /* or failed mid-way */
  if (pending) {
    /* MPI may still use the staging memory: park it (orphans.c). */
    mpg__mpi_note_fault();
    mpg__mpi_orphan(q);
    mpg__mpi_sweep_orphans();
  } else {
    mpg__comm *m = q->comm;
    mpg__mpi_stage_give(m, q->stage, q->stage_cap);
    q->stage = NULL;
    mpg__mpi_comm_unref(m);
    mpg__mpi_req_release(q);
  }
  unlock_g();
}
