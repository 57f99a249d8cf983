/* The sync module's core (sync_core.h, named for no file: it is shared,
 * not sync.c's), included by sync.c (options, create, params,
 * getters), layout.c (commit), step.c (begin .. finish) and shard.c (shard
 * mode).  struct mpg_sync keeps its options and identity at the top and
 * the rest by phase: `layout` (the params, and what mpg_sync_commit lays
 * out: buffers, buckets, the tied order), `step` (one step's launch and
 * wait state, its works and status) and `shard` (shard mode's groups,
 * owned ranges and gather state).
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
 *    over (the shard group for a sharded buffer) is on one node, or the
 *    same number >= 2 on each of several (hierarchical), in a segment per
 *    node the members share (mpg__shm_create, groups/shm/): its buckets
 *    are then reduced in one pass, each member summing its shard (its
 *    slice, for a sharded buffer) of every member's bucket in place, then
 *    across nodes.  A sharded buffer's segment on one host gets a second
 *    one, created right after it, for its parameters, whose buckets are
 *    then all-gathered in one pass there (shard.c).  Those creations are
 *    collective
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
#ifndef MPG_SYNC_CORE_H
#define MPG_SYNC_CORE_H

#include <stddef.h>

#include "groups_internal.h"
#include "mesh_internal.h"

#define ALIGN_BYTES 64
#define MSG_MAX 1024
#define MIB 1048576.0

typedef struct sparam {
  char *name;          /* the caller's name, unique in the sync */
  size_t count;        /* elements */
  mpg_dtype dtype;     /* of the gradient */
  char *dims;          /* the caller's reduce_dims, NULL: the default */
  unsigned mask;       /* mesh dims of `dims` */
  mpg_group *tied;     /* tied group, NULL: none */
  mpg_group *group;    /* reduce group (commit) */
  int buffer;          /* index of its buffer (commit) */
  int bucket;          /* launch position of its bucket (commit) */
  size_t offset;       /* first element in its buffer (commit) */
  size_t state_offset; /* shard mode, replicated buffers: its optimizer-state
                          offset (commit) */
  int ready;           /* marked in this step */
} sparam;

typedef struct sbuffer {
  mpg_dtype dtype;  /* of every param in it */
  mpg_group *group; /* the reduce group of its params */
  mpg_group *tied;  /* the tied group of its params, NULL: none */
  size_t count;     /* elements, with padding */
  void *data;       /* the gradients */
  int nparams;      /* params laid out in it */
  int nbuckets;     /* buckets cut from it */
  int open_bucket;  /* its bucket being filled at commit, -1: none */
  int sharded;      /* shard mode: reduce-scattered over its domain's
                       shard group */
  int domain;       /* sharded: index into mpg_sync.shard.domains */
  void *param_data; /* shard mode: the parameter buffer (same layout) */
  mpg__shm *shm;    /* data lives in node-local shared memory (the
                       one-pass path; NULL: mpg_ctx_mem_alloc) */
  mpg__shm *param_shm; /* shard mode, shm (one host, or hierarchical
                          across hosts): param_data lives in
                          a second segment over the same shard group, and
                          its buckets are gathered there (NULL: in
                          mpg_ctx_mem_alloc's memory, gathered by the
                          backend) */
} sbuffer;

typedef struct sbucket {
  int buffer;               /* index of the buffer it is a slice of */
  size_t offset, count;     /* elements of the buffer */
  int first_param;          /* param id: first in backward order */
  int last_param;           /* param id: last in backward order */
  int nparams;              /* params in it */
  int launch_key;           /* backward position of `last_param` (launch order) */
  int pending;              /* params not yet ready in this step */
  mpg_work *work;           /* its reduction in flight */
  int launched;             /* in this step */
  /* Shard mode, sharded buffers only: */
  size_t slice;             /* elements of one slice: count / shard group size */
  size_t state_base;        /* this rank's slice in the optimizer-state arrays */
  mpg_work *replicate_work; /* the slice's all-reduce over the replicate group */
  mpg_work *gather_work;    /* the params' all-gather in flight */
  int trace_first, trace_last; /* its first and last params' names in the
                                  flight recorder (mpg__sync_trace_tag) */
} sbucket;

/* A sharded domain: 0, the data-parallel group (the default group's
 * params); 1 when there are 2, the expert group (expert_shard_dims). */
struct sdomain {
  mpg_group *reduce;    /* the params' reduce group: buffers of it shard */
  mpg_group *shard;     /* reduce-scatter and gather over it */
  mpg_group *replicate; /* NULL, or the slices' all-reduce (HSDP) */
};

/* What mpg_sync_add_param registers and mpg_sync_commit lays out (sync.c,
 * layout.c): the params, the buffers and buckets cut from them, and the
 * tied buffers' order. */
struct sync_layout {
  sparam *params;      /* registered params, by id */
  int nparams;         /* entries of `params` in use */
  int params_cap;      /* entries of `params` allocated */
  int *name_index;     /* open addressing over names: param id or -1 */
  int name_index_cap;  /* slots of `name_index` (a power of 2; 0: none yet) */
  sbuffer *buffers;    /* (commit) */
  int nbuffers;        /* entries of `buffers` */
  sbucket *buckets;    /* in launch order (commit) */
  int nbuckets;        /* entries of `buckets` */
  int *tied_order;     /* indices of the buffers with a tied group, in a
                          rank-independent order: the tied sums' order */
  int ntied;           /* entries of `tied_order` */
  size_t total_bytes;  /* gradient (and shard mode's parameter) buffer bytes */
};

/* One step, mpg_sync_begin .. mpg_sync_finish (step.c), and what outlives
 * it: the gradients' validity and a context lost in a step. */
struct sync_step {
  int open;               /* a step is open (begin called, finish not yet) */
  long number;            /* the step number given to the last begin */
  int last_microbatch;    /* this step's begin said is_last_microbatch */
  void *caller_stream;    /* the stream given to the last begin */
  int stream_used;        /* the sync's stream has work of this step */
  int next_launch;        /* first bucket not launched */
  int first_unfinished;   /* first launched bucket not seen complete */
  int zeroed_on_stream;   /* zero_grads queued work on the sync's stream
                             since the last begin */
  mpg_work **tied_works;  /* the tied sums in flight, by tied_order position */
  mpg_status status;      /* the step's first failure, MPG_OK: none */
  char msg[2 * MSG_MAX];  /* the step's first failure's message */
  int grads_valid;        /* the gradients are synced and usable */
  mpg_status aborted;     /* the context was aborted (TIMEOUT / ABORTED),
                             MPG_OK: not */
  long aborted_step;      /* the step in which it was */
  char aborted_msg[2 * MSG_MAX]; /* that step's failure message */
  long launched_buckets;  /* buckets launched over every step (stats) */
};

/* Shard mode (shard.c): the groups, this rank's owned ranges, and the
 * parameters' gather. */
struct sync_shard {
  /* Into opts.sync; NULL: not set; expert_dims "": "none" (replicated). */
  const char *shard_dims, *replicate_dims, *expert_dims;
  mpg_group *shard_group;     /* the data-parallel domain's (domains[0].shard) */
  mpg_group *replicate_group; /* NULL, or domains[0]'s (HSDP) */
  struct sdomain domains[2];  /* the sharded domains */
  int ndomains;               /* entries of `domains` in use */
  int any_replicate;          /* some domain has a replicate group */
  size_t state_elems;         /* this rank's optimizer-state elements */
  size_t pad_elems;           /* padding elements of the sharded buffers */
  int *forward_buckets;       /* the sharded buckets' launch positions, in
                                 forward order (the gathers' order) */
  int nforward;               /* entries of `forward_buckets` */
  int gather_open;            /* a gather is open */
  int gather_started;         /* gathers started: positions in forward_buckets */
  int gather_waited;          /* gathers waited for: positions in forward_buckets */
  void *gather_caller_stream; /* the caller's stream of the gather */
  int gather_due;             /* a step finished since the last gather_begin */
};

struct mpg_sync {
  mpg_ctx *ctx;                /* the context it syncs over */
  const mpg_mesh *mesh;        /* ctx's mesh */
  mpg_sync_opts opts;          /* the options; their strings point at the copies */
  char *default_dims;          /* copy of opts.default_dims (or NULL) */
  char default_desc[320];      /* how the default group was chosen, for messages */
  mpg_group *default_group;    /* the default reduce group */
  unsigned default_mask;       /* its mesh dims; 0 when it has none (size-1 group) */
  void *stream;                /* the sync's own stream (NULL off nccl) */
  int committed;               /* mpg_sync_commit succeeded */
  struct sync_layout layout;   /* params, buffers, buckets */
  struct sync_step step;       /* the step */
  struct sync_shard shard;     /* shard mode */
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

/* The flight recorder (groups/trace.c): the operations this thread issues
 * until mpg__trace_tag(-1, 0, 0) reduce or gather bucket k, named by its
 * first and last params (interned once per bucket).  Inline: step.c and
 * shard.c both tag. */
static inline void mpg__sync_trace_tag(mpg_sync *s, int k) {
  sbucket *b = &s->layout.buckets[k];
  if (!b->trace_first) {
    b->trace_first = mpg__trace_intern(s->ctx, s->layout.params[b->first_param].name);
    b->trace_last = mpg__trace_intern(s->ctx, s->layout.params[b->last_param].name);
  }
  mpg__trace_tag(k, b->trace_first, b->trace_last);
}

#endif
