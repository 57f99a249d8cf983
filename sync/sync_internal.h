/* The sync module's internals, shared by sync.c (options, create, params,
 * getters), layout.c (commit) and step.c (begin .. finish).
 *
 * Gradient synchronisation over exactly the right groups.
 *
 * Layout (mpg_sync_commit)
 *  - Every parameter resolves to a reduce group (the sync's default, or the
 *    group of its own reduce_dims) and, optionally, a tied group.  Groups
 *    are created in a fixed order: the default at mpg_sync_create, then the
 *    distinct override dim sets at commit, sorted by their mesh-dim mask, so
 *    that every rank enters the world-collective creations alike.
 *  - One buffer per (dtype, reduce group, tied group), allocated with
 *    mpg_ctx_mem_alloc (host or device memory: the groups layer decides),
 *    or, on the CPU backends when every member of the group it reduces
 *    over (the shard group for a sharded buffer) is on one node, in a
 *    segment the members share (mpg__shm_create, groups/shm/): its
 *    buckets are then reduced in one pass, each member summing its shard
 *    of every member's bucket in place.  Those creations are collective
 *    over each group; they run in a rank-independent order (by group
 *    name, dtype and tied group name).
 *    Parameters are laid out in reverse registration order (backward
 *    order), each view starting on a 64-byte boundary; the padding is zero
 *    and stays zero.
 *  - Buckets are slices of one buffer (never two): walking a buffer in
 *    backward order, a parameter joins the open bucket while the slice
 *    stays within the cap (first_bucket_mb for the buffer's first bucket,
 *    bucket_mb after); otherwise it opens a new one, so a parameter larger
 *    than the cap has a bucket of its own.  Buckets are numbered in launch
 *    order: by the backward position of their last parameter, i.e. the
 *    order in which they complete when gradients arrive in backward order.
 *  - Before laying out, the ranks check that they agree (layout.c,
 *    check_layout; on every backend, nccl staging through device memory):
 *    per reduce group (the default, then the
 *    others by mask) and per tied group (by name), a chain of prefix hashes
 *    over the params of that group in registration order; one all-gather of
 *    (final hash, count); on a mismatch a binary search over the prefix
 *    (one all-gather per round) and one all-gather of the first differing
 *    entry, every member deciding from the same gathered values; then one
 *    all-gather over the world of a mismatch flag and the options that
 *    shape the collectives (mode, reduce_dtype, op, pad_for_nccl,
 *    grad_scale, bucket sizes), which must agree.  Any mismatch fails
 *    every rank's commit with MPG_ERR_STATE.
 *
 * Step (mpg_sync_begin .. mpg_sync_finish)
 *  - On the last micro-batch, mark_ready counts down its bucket and then
 *    launches, in bucket order, every bucket from the next unlaunched one
 *    that has all its gradients: a bucket that completes early waits for
 *    its predecessors, so every rank issues its collectives in one order.
 *  - finish launches the rest, waits for all, then sums the tied buffers
 *    over their tied groups (after the reduce-group average) and orders
 *    the caller's stream after the sync's own.  Last, on every rank
 *    whatever its step status, the issue-order check (groups/order.c,
 *    when MESHPG_CHECK_ORDER is on; also at commit after the layout
 *    check): a difference fails the step with MPG_ERR_STATE.
 *  - Any failure fails the whole step: nothing more is launched, finish
 *    still waits for (and releases) what was launched, the gradients are
 *    marked invalid and the first error is returned again by finish.  A
 *    timeout or abort is final for the context (the groups layer aborts
 *    it): the next begin says so.
 *
 * Nothing here knows which backend runs: only the public groups API. */
#ifndef MPG_SYNC_INTERNAL_H
#define MPG_SYNC_INTERNAL_H

#include <stddef.h>

#include "groups_internal.h"
#include "mesh_internal.h"

#define ALIGN_BYTES 64
#define MSG_MAX 1024
#define MIB 1048576.0

typedef struct sparam {
  char *name;
  size_t count;
  mpg_dtype dtype;
  char *dims;       /* the caller's reduce_dims, NULL: the default */
  unsigned mask;    /* mesh dims of `dims` */
  mpg_group *tied;  /* NULL: none */
  mpg_group *group; /* reduce group (commit) */
  int buffer;       /* (commit) */
  int bucket;       /* launch position of its bucket (commit) */
  size_t offset;    /* first element in its buffer (commit) */
  size_t state;     /* shard mode, replicated buffers: its optimizer-state
                       offset (commit) */
  int ready;        /* marked in this step */
} sparam;

typedef struct sbuffer {
  mpg_dtype dtype;
  mpg_group *group;
  mpg_group *tied;
  size_t count; /* elements, with padding */
  void *data;
  int nparams;
  int nbuckets;
  int open;            /* its bucket being filled at commit, -1: none */
  int sharded;         /* shard mode: reduce-scattered over its domain's
                          shard group */
  int domain;          /* sharded: index into mpg_sync.dom */
  void *params;        /* shard mode: the parameter buffer (same layout) */
  mpg__shm *shm;       /* data lives in node-local shared memory (the
                          one-pass path; NULL: mpg_ctx_mem_alloc) */
} sbuffer;

typedef struct sbucket {
  int buffer;
  size_t offset, count; /* elements of the buffer */
  int first, last;      /* param ids: first / last in backward order */
  int nparams;
  int key;              /* backward position of `last` (launch order) */
  int pending;          /* params not yet ready in this step */
  mpg_work *work;       /* in flight */
  int launched;         /* in this step */
  /* Shard mode, sharded buffers only: */
  size_t slice;         /* count / shard group size */
  size_t state_base;    /* this rank's slice in the optimizer-state arrays */
  mpg_work *work2;      /* the slice's all-reduce over the replicate group */
  mpg_work *gather;     /* the params' all-gather in flight */
} sbucket;

struct mpg_sync {
  mpg_ctx *ctx;
  const mpg_mesh *mesh;
  mpg_sync_opts opts;
  char *default_dims;  /* copy of opts.default_dims (or NULL) */
  char default_desc[320]; /* how the default group was chosen, for messages */
  mpg_group *default_group;
  unsigned default_mask; /* 0 when the default has no dims (size-1 group) */
  void *stream;          /* the sync's own stream (NULL off nccl) */
  int committed;

  /* Shard mode (shard.c): */
  char *shard_dims, *replicate_dims, *expert_dims; /* copies of the options */
  mpg_group *shard_group;     /* the data-parallel domain's (dom[0].shard) */
  mpg_group *replicate_group; /* NULL, or dom[0]'s (HSDP) */
  /* Sharded domains: 0, the data-parallel group (the default group's
   * params); 1 when ndom is 2, the expert group (expert_shard_dims). */
  struct sdomain {
    mpg_group *reduce;    /* the params' reduce group: buffers of it shard */
    mpg_group *shard;     /* reduce-scatter and gather over it */
    mpg_group *replicate; /* NULL, or the slices' all-reduce (HSDP) */
  } dom[2];
  int ndom;
  int any_replicate;          /* some domain has a replicate group */
  size_t shard_elems, pad_elems;
  int *forward;               /* sharded buckets in forward order */
  int nforward;
  int gathering;              /* a gather is open */
  int gather_started, gather_waited; /* positions in `forward` */
  void *gather_caller;        /* the caller's stream of the gather */
  int gather_due;             /* a step finished since the last gather_begin */

  sparam *params;
  int nparams, cap;
  int *hash;             /* open addressing over names: param id or -1 */
  int hash_cap;

  sbuffer *buffers;
  int nbuffers;
  sbucket *buckets;      /* in launch order */
  int nbuckets;
  int *tied;             /* buffers with a tied group, in a rank-independent order */
  mpg_work **tied_work;
  int ntied;
  size_t total_bytes;
  long launched_total;

  /* The step. */
  int in_step;
  long step;
  int last;
  void *caller;          /* the caller's stream */
  int ordered;           /* the sync's stream has work of this step */
  int next_launch;       /* first bucket not launched */
  int oldest;            /* first launched bucket not seen complete */
  int zero_pending;      /* zeroed on own stream since the last begin */
  mpg_status step_status;
  char step_msg[2 * MSG_MAX];
  int valid;
  mpg_status dead;       /* the context was aborted (TIMEOUT / ABORTED) */
  long dead_step;
  char dead_msg[2 * MSG_MAX];
};

/* layout.c: free every buffer, bucket and tied table (after a failed
 * commit, and at destroy). */
void mpg__sync_free_layout(mpg_sync *s);

/* step.c: wait for (and release) every bucket still in flight. */
void mpg__sync_wait_all(mpg_sync *s);
/* After a failure `st` that leaves collectives of the step or gather
 * unposted on this rank (any status but the argument errors
 * MPG_ERR_INVALID and _RANGE), abort the context, so that the peers,
 * which may have posted them, fail instead of pairing this rank's next
 * collectives with theirs.  The last error is kept.  For step.c and
 * shard.c (inline, so that neither calls the other for it). */
static inline void mpg__sync_abort_after(mpg_sync *s, mpg_status st) {
  if (st == MPG_OK || st == MPG_ERR_INVALID || st == MPG_ERR_RANGE ||
      mpg_ctx_status(s->ctx) != MPG_OK)
    return;
  mpg__saved_error why;
  mpg__error_save(&why);
  (void)mpg_ctx_abort(s->ctx);
  (void)mpg__error_restore(st, &why);
}

/* shard.c: the shard and replicate groups at create (shard mode only;
 * collective: they may be created). */
mpg_status mpg__sync_shard_groups(mpg_sync *s);
/* shard.c: pad size of the end of a bucket of domain d: lcm(S, 128[,
 * 65536]). */
size_t mpg__sync_shard_pad(const mpg_sync *s, int d);
/* shard.c: the sharded domain of a buffer of reduce group g, -1: none. */
int mpg__sync_shard_domain(const mpg_sync *s, const mpg_group *g);
/* shard.c: at commit, after the buckets: slices, state offsets, forward
 * order and the parameter buffers. */
mpg_status mpg__sync_shard_commit(mpg_sync *s);
/* shard.c: release a gather still open (destroy). */
void mpg__sync_gather_drop(mpg_sync *s);
/* shard.c: launch bucket k of a sharded buffer: reduce-scatter (then, when
 * the backend orders work on one stream, the replicate all-reduce). */
mpg_status mpg__sync_shard_launch(mpg_sync *s, int k);
/* shard.c: finish's second level: the replicate all-reduces not yet
 * issued, in bucket order after each reduce-scatter completed, then wait
 * for them all.  Returns the first failure (the step is failed by the
 * caller). */
mpg_status mpg__sync_shard_finish(mpg_sync *s, int *failed_bucket);

#endif
