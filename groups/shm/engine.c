/* The segment's table (posting a shared-memory operation, testing and
 * waiting for it, with the timeout and the abort that every member sees),
 * and the worker thread that reduces this member's shards through the
 * library's one reduction kernel, or copies its peers' slices of an
 * all-gather (protocol in shm_internal.h). */
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "shm_internal.h"
#include "channel.h" /* mpg__shm_copy */

#define POLL_S 0.1   /* longest futex sleep between looks at the abort word */
#define GRACE_S 0.25 /* the main thread's extra time over the worker's */

#define SPINS 256 /* about 10-30 us of looking before sleeping */

/* Shared futexes (no FUTEX_PRIVATE_FLAG): the words may live in a segment
 * that other processes map.  A short spin first: a peer's post or shard
 * is often microseconds away, and a futex sleep and wake-up costs more. */
void mpg__shm_futex_wait(_Atomic uint32_t *w, uint32_t val, double timeout_s) {
  if (timeout_s <= 0) return;
  for (int i = 0; i < SPINS; i++) {
    if (atomic_load_explicit(w, memory_order_relaxed) != val) return;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  }
  struct timespec ts;
  ts.tv_sec = (time_t)timeout_s;
  ts.tv_nsec = (long)((timeout_s - (double)ts.tv_sec) * 1e9);
  syscall(SYS_futex, (uint32_t *)w, FUTEX_WAIT, val, &ts, NULL, 0);
}

void mpg__shm_futex_wake(_Atomic uint32_t *w) {
  syscall(SYS_futex, (uint32_t *)w, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

static int after(uint32_t a, uint32_t b) { return (int32_t)(a - b) > 0; }

mpg__shm_seam_set mpg__shm_seams;

static uint64_t abort_pack(mpg_status why, int by, int peer, uint32_t q) {
  return (uint64_t)(uint32_t)why |
         (uint64_t)(uint32_t)by << SHM_ABORT_STATUS_BITS |
         (uint64_t)(uint32_t)(peer + 2) << (SHM_ABORT_STATUS_BITS + SHM_ABORT_BY_BITS) |
         (uint64_t)q << 32;
}

int mpg__shm_aborted(const mpg__shm *s, shm_abort *out) {
  uint64_t w = atomic_load(&s->ctl->abort);
  if (!w) return 0;
  if (out) {
    uint32_t st = (uint32_t)w & ((1u << SHM_ABORT_STATUS_BITS) - 1);
    out->status = st ? (mpg_status)st : MPG_ERR_ABORTED; /* never MPG_OK */
    out->by = (int)((uint32_t)w >> SHM_ABORT_STATUS_BITS & ((1u << SHM_ABORT_BY_BITS) - 1));
    out->peer = (int)((uint32_t)w >> (SHM_ABORT_STATUS_BITS + SHM_ABORT_BY_BITS)) - 2;
    out->q = (uint32_t)(w >> 32);
  }
  return 1;
}

void mpg__shm_abort(mpg__shm *s, mpg_status why, int peer, uint32_t q) {
  /* The whole reason in one store: a reader never sees an abort claimed
   * but not yet explained, and never a status of 0. */
  uint64_t none = 0;
  if (!why) why = MPG_ERR_ABORTED;
  if (peer < -2 || peer >= s->n) peer = -1;
  if (!atomic_compare_exchange_strong(&s->ctl->abort, &none, abort_pack(why, s->pos, peer, q)))
    return;
  if (mpg__shm_seams.abort_claimed) mpg__shm_seams.abort_claimed(s->pos, why, peer, q);
  for (int p = 0; p < s->n; p++) {
    mpg__shm_futex_wake(&s->posted[p].v);
    mpg__shm_futex_wake(&s->finished[p].v);
  }
}

/* What operation q of this member is, for messages: "reduction" or
 * "all-gather", from its descriptor while its slot still holds it, else
 * from the kind of this member's latest post. */
static int op_kind(const mpg__shm *s, uint32_t q) {
  uint32_t next = atomic_load_explicit(&s->nposted, memory_order_relaxed);
  int kind = atomic_load_explicit(&s->posting, memory_order_relaxed);
  if (after(next, q) && next - q <= (uint32_t)s->depth)
    kind = s->desc[(size_t)s->pos * (size_t)s->depth + (q & (uint32_t)(s->depth - 1))].kind;
  return kind;
}
static const char *op_noun(const mpg__shm *s, uint32_t q) {
  return op_kind(s, q) == SHM_ALL_GATHER ? "all-gather" : "reduction";
}

/* The member at position p, for messages: "position 2 (world rank 5)". */
static void who(const mpg__shm *s, int p, char *buf, size_t n) {
  int rank = -1, gp = p >= 0 && p < s->n ? s->members[p] : -1;
  if (gp < 0) {
    snprintf(buf, n, "a member");
    return;
  }
  mpg_group_member(s->group, gp, &rank);
  snprintf(buf, n, "position %d (world rank %d)", gp, rank);
}

/* Operation aq of the segment as seen from operation q, for messages:
 * the segment's own count is not the flight recorder's number, which the
 * generic layer gives (issue 46, item 4), so only "this operation" or how
 * far before or after it. */
static void which_op(uint32_t aq, uint32_t q, char *buf, size_t n) {
  if (aq == q)
    snprintf(buf, n, "this operation");
  else if ((int32_t)(q - aq) > 0)
    snprintf(buf, n, "the operation %u before this one", (unsigned)(q - aq));
  else
    snprintf(buf, n, "the operation %u after this one", (unsigned)(aq - q));
}

/* The error every member reports once the segment was aborted: never
 * MPG_OK (the caller saw the abort word set).  The member that gave up
 * gets its own reason; the others MPG_ERR_ABORTED naming it and the
 * reason, except for two members' different operations (MPG_ERR_INVALID
 * on every member). */
static mpg_status aborted(const mpg__shm *s, uint32_t q) {
  shm_abort ab = {MPG_ERR_ABORTED, -1, -1, q};
  (void)mpg__shm_aborted(s, &ab);
  mpg_status st = ab.status;
  int by = ab.by, peer = ab.peer, mine = by == s->pos;
  uint32_t aq = ab.q;
  char a[64], b[64], head[320], label[160], op[64];
  who(s, by, a, sizeof a);
  if (peer >= 0) who(s, peer, b, sizeof b);
  mpg__group_label(s->group, label, sizeof label);
  which_op(aq, q, op, sizeof op);
  snprintf(head, sizeof head, "shared-memory %s on %s (%d ranks on this node)",
           op_noun(s, q), label, s->n);
  if (st == MPG_ERR_INVALID && peer >= 0)
    return mpg__fail(st, "%s: %s and %s posted different operations as %s (kind, offset, "
                     "count, dtype or op differ)", head, a, b, op);
  if (peer == -2) /* this member's own worker says why: the backend's words */
    return mpg__fail(st == MPG_ERR_TIMEOUT && mine ? st : MPG_ERR_ABORTED,
                     "%s: the %s across nodes of %s failed (%s) in %s%s%s", head,
                     op_kind(s, aq) == SHM_ALL_GATHER ? "all-gather"
                     : s->scatter                     ? "reduce-scatter"
                                                      : "all-reduce",
                     a, mpg_status_name(st),
                     op, mine && s->inter_err[0] ? ": " : "", mine ? s->inter_err : "");
  if (st == MPG_ERR_TIMEOUT && mine)
    return mpg__fail(st, "%s timed out after %.3g s: missing %s, which did not post "
                     "%s", head, s->group->ctx->timeout_s, peer >= 0 ? b : "a member", op);
  if (st == MPG_ERR_TIMEOUT)
    return mpg__fail(MPG_ERR_ABORTED, "%s: aborted by %s, which timed out in %s: "
                     "missing %s", head, a, op, peer >= 0 ? b : "a member");
  if (mine)
    return mpg__fail(st, "%s: this member (%s) gave up in %s (%s); the segment "
                     "stays aborted", head, a, op, mpg_status_name(st));
  return mpg__fail(MPG_ERR_ABORTED, "%s: aborted by %s (%s) in %s", head, a,
                   mpg_status_name(st), op);
}

/* ------------------------------------------------------------------ */
/* The worker                                                          */
/* ------------------------------------------------------------------ */

static int same_desc(const shm_desc *a, const shm_desc *b) {
  return a->offset == b->offset && a->count == b->count && a->dtype == b->dtype &&
         a->op == b->op && a->kind == b->kind && a->scale == b->scale;
}


/* Should the worker stop: destroy, the segment aborted, or this member's
 * context aborted (a watchdog's mpg_ctx_abort: passed on to the other
 * members at once, without waiting for this member's next wait)?  The
 * context first: a member that destroys its segment right after its
 * context was aborted still tells the others, who would otherwise wait
 * for its operation until their timeout. */
static int gave_up(mpg__shm *s, uint32_t q) {
  int reason = atomic_load(&s->group->ctx->aborted);
  if (reason) {
    mpg__shm_abort(s, (mpg_status)reason, -1, q);
    return 1;
  }
  return atomic_load(&s->stop) || mpg__shm_aborted(s, NULL);
}

/* This member's part [*lo, *hi) of an operation's count elements: an
 * all-reduce splits them into n parts on 64-byte boundaries, so that no
 * two owners write one cache line; a reduce-scatter's part is its slice,
 * the one of its position in the group. */
static void shard(const mpg__shm *s, const shm_desc *d, size_t es, size_t *lo, size_t *hi) {
  if (d->kind == SHM_REDUCE_SCATTER) {
    *lo = (size_t)s->members[s->pos] * d->count;
    *hi = *lo + d->count;
    return;
  }
  size_t align = SHM_LINE / es, c = d->count, n = (size_t)s->n, p = (size_t)s->pos;
  *lo = c * p / n / align * align;
  *hi = p + 1 == n ? c : c * (p + 1) / n / align * align;
}

size_t mpg__shm_max_shard(const mpg__shm *s, size_t elems) {
  return elems / (size_t)s->n + 2 * SHM_LINE;
}

/* The worker's reduction of its shard of operation d: the node's regions
 * in position order, pre-multiplied, averaged by the group's size, f16 /
 * bf16 in f32 rounded once, written back to every region (all-reduce) or
 * to this member's (reduce-scatter): the library's one kernel
 * (mpg__reduce_sources, groups/reduce.c), the thread backend's.  ONE_PASS
 * on one node; hierarchical: PARTIAL leaves the node's sums (not divided)
 * in s->stage, FINISH, once the stage was reduced across nodes, divides,
 * rounds and writes them back.  Returns the shard's elements. */
enum { ONE_PASS, PARTIAL, FINISH };
static size_t reduce_shard(mpg__shm *s, const shm_desc *d, int part) {
  mpg_dtype dt = (mpg_dtype)d->dtype;
  size_t es = mpg__dtype_size(dt), at = (size_t)d->offset * es, lo, hi;
  shard(s, d, es, &lo, &hi);
  int scatter = d->kind == SHM_REDUCE_SCATTER;
  int first = scatter ? s->pos : 0, ndst = scatter ? 1 : s->n;
  for (int p = 0; p < s->n; p++) s->src[p] = s->region[p] + at;
  for (int k = 0; k < ndst; k++) s->dst[k] = s->region[first + k] + at;
  mpg__reduce_job job = {dt, (mpg_op)d->op, d->scale, NULL, s->total,
                         s->src, part == FINISH ? 0 : s->n,
                         s->dst, part == PARTIAL ? 0 : ndst,
                         part == ONE_PASS ? NULL : s->stage};
  mpg__reduce_sources(&job, lo, hi, s->scratch);
  return hi - lo;
}

/* The staging array's element size: f64 for f64, else f32. */
static size_t stage_size(const shm_desc *d) { return d->dtype == MPG_F64 ? 8 : 4; }

/* A hierarchical reduce-scatter's steps (the all-reduce's are
 * reduce_shard's PARTIAL and FINISH).  PARTIAL: block h of s->stage = the
 * node's sums (position order, pre-multiplied, not divided) of the slice
 * of the member at this local position on node h, for every node.
 * FINISH: block s->node, reduced across nodes, divided, rounded once and
 * written to this member's own slice of its own region.  Returns the
 * elements of one block (the slice). */
static size_t scatter_blocks(mpg__shm *s, const shm_desc *d, int part) {
  mpg_dtype dt = (mpg_dtype)d->dtype;
  size_t es = mpg__dtype_size(dt), ws = stage_size(d), m = (size_t)d->count;
  mpg__reduce_job job = {dt, (mpg_op)d->op, d->scale, NULL, s->total, s->src, 0, s->dst, 0,
                         NULL};
  if (part == FINISH) {
    s->dst[0] = s->region[s->pos] + ((size_t)d->offset + (size_t)s->members[s->pos] * m) * es;
    job.ndst = 1;
    job.acc = (char *)s->stage + (size_t)s->node * m * ws;
    mpg__reduce_sources(&job, 0, m, s->scratch);
    return m;
  }
  job.nsrc = s->n;
  for (int h = 0; h < s->nodes; h++) {
    size_t from = ((size_t)d->offset + (size_t)s->across[h] * m) * es;
    for (int p = 0; p < s->n; p++) s->src[p] = s->region[p] + from;
    job.acc = (char *)s->stage + (size_t)h * m * ws;
    mpg__reduce_sources(&job, 0, m, s->scratch);
  }
  return m;
}

/* A slice's copy.  From STREAM_MIN bytes on (x86-64) with non-temporal
 * stores: a gathered bucket is far larger than the caches, and stores
 * that skip them (no read for ownership of the target lines) took about
 * 0.6 of memcpy's time in bench_sync_gather (bench/README.md,
 * "bench_sync_gather");
 * mpg__shm_copy's sfence orders them before the worker's release of
 * `finished`.  Smaller slices stay in the caches (memcpy), for
 * the forward pass that reads them next. */
#define STREAM_MIN ((size_t)1 << 20)
static void copy_slice(char *dst, const char *src, size_t n) {
  mpg__shm_copy(dst, src, n, n >= STREAM_MIN); /* copy.c: the all-to-all's loop */
}

/* An all-gather's work for this member: every other local member's slice
 * (count elements at offset + its group position x count), pulled from
 * that member's region into the same place of this member's; this
 * member's own slice is in place.  The peers in turn from the next
 * position on, so that the members do not all read one region at once.
 * (Pulling, so that each member writes only its own region; pushing each
 * member's slice into the peers' regions measured the same,
 * bench/README.md.) */
static void gather_slices(mpg__shm *s, const shm_desc *d) {
  size_t es = mpg__dtype_size((mpg_dtype)d->dtype), bytes = (size_t)d->count * es;
  for (int k = 1; k < s->n; k++) {
    int p = (s->pos + k) % s->n;
    size_t at = ((size_t)d->offset + (size_t)s->members[p] * (size_t)d->count) * es;
    copy_slice(s->region[s->pos] + at, s->region[p] + at, bytes);
  }
}

/* One collective of this member over inter (its members at this local
 * position on every node), waited for in slices of POLL_S so that a
 * segment or context that gave up, or a destroy, ends it at once, not at
 * the deadline. */
static mpg_status inter_run(mpg__shm *s, const mpg__coll *c, double deadline, uint32_t q) {
  const struct mpg__transport_ops *ops = s->inter_ops;
  mpg__req *r = NULL;
  mpg_status st = ops->post(s->inter, c, &r);
  while (!st) {
    double now = mpg__now(), until = now + POLL_S < deadline ? now + POLL_S : deadline;
    st = ops->wait(r, until);
    if (st != MPG_ERR_TIMEOUT || until >= deadline) break;
    st = gave_up(s, q) ? MPG_ERR_ABORTED : MPG_OK; /* else the next slice */
  }
  if (st && r) ops->abort_comm(s->inter, st == MPG_ERR_TIMEOUT ? st : MPG_ERR_ABORTED);
  if (r) ops->req_free(r);
  return st;
}

/* The sum of this member's staged partial sums with the members at its
 * local position on the other nodes: an all-reduce of the shard's m
 * elements, or a reduce-scatter of the nodes' blocks of m elements that
 * leaves block s->node in place. */
static mpg_status across_nodes(mpg__shm *s, const shm_desc *d, size_t m, double deadline,
                               uint32_t q) {
  int scatter = d->kind == SHM_REDUCE_SCATTER;
  void *recv = scatter ? (char *)s->stage + (size_t)s->node * m * stage_size(d) : s->stage;
  mpg__coll c = {scatter ? MPG__REDUCE_SCATTER : MPG__ALL_REDUCE, s->stage, recv, m,
                 d->dtype == MPG_F64 ? MPG_F64 : MPG_F32, MPG_OP_SUM, 1.0, 0, 0, NULL, 0};
  return inter_run(s, &c, deadline, q);
}

/* A hierarchical all-gather's work for this member (local position r):
 * the backend's all-gather over inter of the slices of the members at
 * local position r of every node (this member's own slice, in its
 * region, sent), received in s->stage (block h: node h's, the slice of
 * group position across[h]), then pushed from there into every local
 * member's region at their places (this member's own slice excepted in
 * its own region, where it is).  Every slice of the group has one member
 * at its local position on this node, so once every local worker finished
 * every local region holds every slice.  Each worker writes the slices of
 * its own local position only (across[]), in every region; no other worker
 * reads or writes those bytes in operation q, so there is no second
 * barrier: completion (finished, every member) is the only one.  In
 * chunks of what the stage holds (the same on every node: the segment's
 * size, n and dtype are), each chunk one all-gather across nodes.  Copies
 * only: the bits are the backend's. */
static mpg_status gather_across(mpg__shm *s, const shm_desc *d, double deadline, uint32_t q) {
  size_t es = mpg__dtype_size((mpg_dtype)d->dtype), m = (size_t)d->count;
  size_t nodes = (size_t)s->nodes, off = (size_t)d->offset;
  size_t cap = s->stage_elems * stage_size(d) / es / nodes; /* elements of a chunk per node */
  if (m && !cap)
    return mpg__fail(MPG_ERR_RANGE, "the stage (%zu bytes) holds no element of %zu nodes",
                     s->stage_elems * stage_size(d), nodes);
  char *mine = s->region[s->pos] + (off + (size_t)s->members[s->pos] * m) * es;
  for (size_t c0 = 0; c0 < m; c0 += cap) {
    size_t c = m - c0 < cap ? m - c0 : cap, bytes = c * es;
    mpg__coll coll = {MPG__ALL_GATHER, mine + c0 * es, s->stage, c, (mpg_dtype)d->dtype,
                      MPG_OP_SUM, 1.0, 0, 0, NULL, 0};
    mpg_status st = inter_run(s, &coll, deadline, q);
    if (st) return st;
    for (int k = 0; k < s->n; k++) {
      int x = (s->pos + k) % s->n; /* its own region first, then the next positions' */
      for (size_t h = 0; h < nodes; h++) {
        if (x == s->pos && (int)h == s->node) continue;
        size_t at = (off + (size_t)s->across[h] * m + c0) * es;
        copy_slice(s->region[x] + at, (const char *)s->stage + h * bytes, bytes);
      }
    }
  }
  return MPG_OK;
}

/* Keep the backend's message of a failed step across nodes, with the
 * world ranks of its communicator's positions (its message numbers them
 * by position among the nodes). */
static void inter_error(mpg__shm *s) {
  size_t cap = sizeof s->inter_err;
  int n = snprintf(s->inter_err, cap, "%s (across nodes, position", mpg_last_error());
  for (int h = 0; h < s->nodes && n > 0 && (size_t)n < cap; h++) {
    int rank = -1;
    mpg_group_member(s->group, s->across[h], &rank);
    n += snprintf(s->inter_err + n, cap - (size_t)n, "%s %d is world rank %d", h ? "," : "", h,
                  rank);
  }
  if (n > 0 && (size_t)n < cap) snprintf(s->inter_err + n, cap - (size_t)n, ")");
}

void *mpg__shm_worker(void *arg) {
  mpg__shm *s = arg;
  shm_word *mine = &s->posted[s->pos];
  for (uint32_t q = atomic_load_explicit(&s->finished[s->pos].v, memory_order_relaxed);;
       q++) {
    /* This member's own post of q (no deadline: the trainer may take its
     * time between steps). */
    for (;;) {
      uint32_t v = atomic_load_explicit(&mine->v, memory_order_acquire);
      if (gave_up(s, q)) return NULL;
      if (after(v, q)) break;
      mpg__shm_futex_wait(&mine->v, v, POLL_S);
    }
    uint32_t slot = q & (uint32_t)(s->depth - 1); /* a power of two: across the wrap */
    double deadline = s->deadline[slot];
    const shm_desc *d = &s->desc[(size_t)s->pos * (size_t)s->depth + slot];
    for (int p = 0; p < s->n; p++) {
      for (;;) {
        uint32_t v = atomic_load_explicit(&s->posted[p].v, memory_order_acquire);
        if (gave_up(s, q)) return NULL;
        if (after(v, q)) break;
        double left = deadline - mpg__now();
        if (left <= 0) {
          mpg__shm_abort(s, MPG_ERR_TIMEOUT, p, q);
          return NULL;
        }
        mpg__shm_futex_wait(&s->posted[p].v, v, left < POLL_S ? left : POLL_S);
      }
      if (!same_desc(d, &s->desc[(size_t)p * (size_t)s->depth + slot])) {
        mpg__shm_abort(s, MPG_ERR_INVALID, p, q);
        return NULL;
      }
    }
    if (d->kind == SHM_ALL_GATHER && !s->inter) {
      gather_slices(s, d);
    } else if (d->kind == SHM_ALL_GATHER) {
      mpg_status st = gather_across(s, d, deadline, q);
      if (st) {
        inter_error(s);
        mpg__shm_abort(s, st, -2, q);
        return NULL;
      }
    } else if (s->inter) {
      /* Hierarchical: the node's partial sums, then across nodes. */
      int scatter = d->kind == SHM_REDUCE_SCATTER;
      size_t m = scatter ? scatter_blocks(s, d, PARTIAL) : reduce_shard(s, d, PARTIAL);
      mpg_status st = m ? across_nodes(s, d, m, deadline, q) : MPG_OK;
      if (st) {
        inter_error(s);
        mpg__shm_abort(s, st, -2, q);
        return NULL;
      }
      if (scatter) scatter_blocks(s, d, FINISH);
      else reduce_shard(s, d, FINISH);
    } else {
      reduce_shard(s, d, ONE_PASS);
    }
    atomic_store_explicit(&s->finished[s->pos].v, q + 1, memory_order_release);
    mpg__shm_futex_wake(&s->finished[s->pos].v);
  }
}

/* ------------------------------------------------------------------ */
/* Waiting                                                             */
/* ------------------------------------------------------------------ */

/* The first member whose shard of q is not finished, -1: none. */
static int lagging(const mpg__shm *s, uint32_t q, uint32_t *val) {
  for (int p = 0; p < s->n; p++) {
    uint32_t v = atomic_load_explicit(&s->finished[p].v, memory_order_acquire);
    if (!after(v, q)) {
      *val = v;
      return p;
    }
  }
  return -1;
}

/* Wait until q is complete (block: 0 looks once) or the segment, or the
 * context, gives up.  Complete first: an operation every member finished
 * is reduced, even when the segment was aborted after it (by a later
 * operation's failure). */
static mpg_status wait_q(mpg__shm *s, uint32_t q, double deadline, int block, int *done) {
  mpg_ctx *ctx = s->group->ctx;
  *done = 0;
  for (;;) {
    uint32_t v = 0;
    int p = lagging(s, q, &v);
    if (p < 0) {
      *done = 1;
      return MPG_OK;
    }
    if (mpg__shm_aborted(s, NULL)) return aborted(s, q);
    int reason = atomic_load(&ctx->aborted);
    if (reason) {
      mpg__shm_abort(s, (mpg_status)reason, -1, q);
      return aborted(s, q);
    }
    double left = deadline + GRACE_S - mpg__now();
    if (left <= 0) {
      mpg__shm_abort(s, MPG_ERR_TIMEOUT, -1, q);
      shm_abort ab;
      if (mpg__shm_aborted(s, &ab) && ab.status == MPG_ERR_TIMEOUT && ab.by == s->pos &&
          ab.peer == -1) {
        char b[64], label[160];
        who(s, p, b, sizeof b);
        mpg__group_label(s->group, label, sizeof label);
        return mpg__fail(MPG_ERR_TIMEOUT,
                         "shared-memory %s on %s (%d ranks on this node) timed "
                         "out after %.3g s: missing %s, which did not finish its shard",
                         op_noun(s, q), label, s->n, ctx->timeout_s, b);
      }
      return aborted(s, q);
    }
    if (!block) return MPG_OK;
    mpg__shm_futex_wait(&s->finished[p].v, v, left < POLL_S ? left : POLL_S);
  }
}

/* The table's test and wait: q's completion, by the deadline its post
 * set (the worker's; this thread allows itself GRACE_S more, so that the
 * worker, which knows which member never posted, reports first: the
 * generic layer's deadline, which is a moment earlier, is not used). */
static mpg_status shm_test(mpg__req *r, int *done) {
  return wait_q(r->shm, r->q, r->deadline, 0, done);
}

static mpg_status shm_wait(mpg__req *r, double deadline) {
  (void)deadline;
  int done;
  return wait_q(r->shm, r->q, r->deadline, 1, &done);
}

static void shm_req_free(mpg__req *r) { free(r); }

/* ------------------------------------------------------------------ */
/* Posting                                                             */
/* ------------------------------------------------------------------ */

/* The table's post: publish operation q, the in-place all-reduce (or
 * reduce-scatter, or all-gather) of c's elements of every member's
 * region, which the generic layer checked (mpg__group_run_on; the range in
 * the region was checked before: post()).  Everything that can fail comes
 * before anything is written. */
static mpg_status shm_post(mpg__comm *comm, const mpg__coll *c, mpg__req **out) {
  mpg__shm *s = comm->shm;
  int gather = c->kind == MPG__ALL_GATHER;
  uint32_t q = atomic_load_explicit(&s->nposted, memory_order_relaxed);
  if (mpg__shm_aborted(s, NULL)) return aborted(s, q);
  mpg__req *r = malloc(sizeof *r);
  if (!r) return mpg__fail(MPG_ERR_NOMEM, "shared-memory reduction of group %s: out of "
                           "memory", s->gname);
  double deadline = mpg__now() + s->group->ctx->timeout_s;
  uint32_t slot = q & (uint32_t)(s->depth - 1);
  /* The slot held operation q - depth when this member posted depth
   * operations before (counted in 64 bits: q may have wrapped): complete
   * everywhere first. */
  if (s->nposts >= (uint64_t)s->depth) {
    int done;
    mpg_status st = wait_q(s, q - (uint32_t)s->depth, deadline, 1, &done);
    if (st) {
      free(r);
      return st;
    }
  }
  shm_desc *d = &s->desc[(size_t)s->pos * (size_t)s->depth + slot];
  /* In place: the whole range starts at send (all-gather: at recv). */
  const char *at = gather ? (const char *)c->recv : (const char *)c->send;
  d->offset = (uint64_t)(at - s->region[s->pos]) / mpg__dtype_size(s->dtype);
  d->count = c->count;
  d->dtype = (int32_t)s->dtype;
  d->op = gather ? 0 : (int32_t)c->op;
  d->kind = gather ? SHM_ALL_GATHER
            : c->kind == MPG__REDUCE_SCATTER ? SHM_REDUCE_SCATTER : SHM_ALL_REDUCE;
  d->pad = 0;
  d->scale = !gather && c->op == MPG__OP_PREMUL_SUM ? c->scale : 1.0;
  s->deadline[slot] = deadline;
  atomic_store_explicit(&s->nposted, q + 1, memory_order_relaxed);
  s->nposts++;
  atomic_store_explicit(&s->posted[s->pos].v, q + 1, memory_order_release);
  mpg__shm_futex_wake(&s->posted[s->pos].v);
  r->shm = s;
  r->q = q;
  r->deadline = deadline;
  *out = r;
  return MPG_OK;
}

/* A member gives up on a segment only through its abort word (every
 * member sees it): a failed post, and the context's abort, which reaches
 * the segment through its group's transport list (the worker also sees
 * the context's flag in gave_up).  Any thread, any state. */
static void shm_abort_comm(mpg__comm *comm, mpg_status reason) {
  mpg__shm *s = comm->shm;
  mpg__shm_abort(s, reason, -1, atomic_load_explicit(&s->nposted, memory_order_relaxed));
}

/* Stop the worker and unmap: the segment out of its group's list. */
void mpg__shm_release(mpg__shm *s) {
  if (!s) return;
  const struct mpg__transport_ops *ops = s->inter_ops;
  /* A worker blocked in the all-reduce across nodes of a failed step
   * returns now. */
  if (s->inter && s->ctl && mpg__shm_aborted(s, NULL))
    ops->abort_comm(s->inter, MPG_ERR_ABORTED);
  if (s->worker_up) {
    atomic_store(&s->stop, 1);
    mpg__shm_futex_wake(&s->posted[s->pos].v);
    pthread_join(s->worker, NULL);
  }
  if (s->base) {
    /* Anonymous: the threads share one mapping, freed by the last. */
    if (!s->anon || atomic_fetch_sub(&s->ctl->refs, 1) == 1) munmap(s->base, s->map_bytes);
  }
  if (s->inter) ops->destroy(s->inter);
  free(s->stage);
  free(s->across);
  free(s->members);
  free(s->scratch);
  free(s->src);
  free(s->dst);
  free(s->region);
  free(s->deadline);
  free(s);
}

static mpg_status shm_destroy_comm(mpg__comm *comm) {
  mpg__shm_release(comm->shm);
  return MPG_OK;
}

/* The segment's transport table (transport.h): what the generic layer
 * calls to post and complete its operations (backend.h, "Shared memory
 * behind this table"), and what the context's abort and teardown call
 * through the group's transport list. */
const struct mpg__transport_ops mpg__shm_ops = {
    .name = "shm",
    .post = shm_post,
    .test = shm_test,
    .test_keeps_time = 1,
    .wait = shm_wait,
    .req_free = shm_req_free,
    .abort_comm = shm_abort_comm,
    .destroy = shm_destroy_comm,
};

/* A post that fails (shm_internal.h, "A failed post") before it published
 * its operation: abort the segment with the reason, so that no member
 * pairs a later operation of this one with another of its own.  (The
 * generic layer already took the groups layer's steps: a timeout or abort
 * aborts the context.)  The message of `st` is kept. */
static mpg_status refuse(mpg__shm *s, uint32_t q, mpg_status st) {
  mpg__saved_error why;
  mpg__error_save(&why);
  mpg__shm_abort(s, st, -1, q);
  return mpg__error_restore(st, &why);
}

/* An operation of kind `kind` (SHM_*) on the segment, through the
 * generic layer like any collective (mpg__group_run_on: claimed, so that
 * a second thread's post on this group fails with MPG_ERR_STATE, posting
 * nothing). */
static mpg_status post(mpg__shm *s, int kind, size_t offset, size_t count, mpg_op op,
                       double scale, mpg_work **work) {
  const char *fn = kind == SHM_REDUCE_SCATTER ? "mpg_reduce_scatter (shared memory)"
                   : kind == SHM_ALL_GATHER   ? "mpg_all_gather (shared memory)"
                                              : "mpg_all_reduce (shared memory)";
  int sliced = kind != SHM_ALL_REDUCE; /* count is per member */
  uint32_t q = atomic_load_explicit(&s->nposted, memory_order_relaxed);
  atomic_store_explicit(&s->posting, kind, memory_order_relaxed);
  if (work) *work = NULL;
  if (!work) return refuse(s, q, mpg__fail(MPG_ERR_INVALID, "%s: work is NULL", fn));
  size_t elems = s->region_bytes / mpg__dtype_size(s->dtype);
  size_t span = sliced ? count * (size_t)s->total : count;
  if (offset > elems || (sliced && count > elems) || span > elems - offset)
    return refuse(s, q, mpg__fail(MPG_ERR_RANGE, "%s: elements %zu..%zu are outside the "
                                  "%zu-byte buffer", fn, offset, offset + span,
                                  s->region_bytes));
  char *at = s->region[s->pos] + offset * mpg__dtype_size(s->dtype);
  /* In place: a reduce-scatter's slice (recv), or an all-gather's (send),
   * is the one of this member's position in the group (its position on
   * the node only on one node). */
  char *mine = at + (size_t)s->members[s->pos] * count * mpg__dtype_size(s->dtype);
  mpg__coll c = {kind == SHM_REDUCE_SCATTER ? MPG__REDUCE_SCATTER
                 : kind == SHM_ALL_GATHER   ? MPG__ALL_GATHER
                                            : MPG__ALL_REDUCE,
                 kind == SHM_ALL_GATHER ? mine : at, kind == SHM_REDUCE_SCATTER ? mine : at,
                 count, s->dtype, kind == SHM_ALL_GATHER ? MPG_OP_SUM : op, scale, 0, 0, NULL, 0};
  mpg_status st = mpg__group_run_on(s->group, &mpg__shm_ops, &s->self, &c, work, fn);
  if (st && atomic_load_explicit(&s->nposted, memory_order_relaxed) == q)
    return refuse(s, q, st);
  return st;
}
mpg_status mpg__shm_all_reduce(mpg__shm *s, size_t offset, size_t count, mpg_op op,
                               double scale, mpg_work **work) {
  return post(s, SHM_ALL_REDUCE, offset, count, op, scale, work);
}

mpg_status mpg__shm_reduce_scatter(mpg__shm *s, size_t offset, size_t count, mpg_op op,
                                   double scale, mpg_work **work) {
  return post(s, SHM_REDUCE_SCATTER, offset, count, op, scale, work);
}

mpg_status mpg__shm_all_gather(mpg__shm *s, size_t offset, size_t count, mpg_work **work) {
  return post(s, SHM_ALL_GATHER, offset, count, MPG_OP_SUM, 1.0, work);
}

int mpg__shm_hosts(const mpg__shm *s) { return s ? s->nodes : 0; }
