/* Node-local shared memory for a group's in-place reductions: the
 * one-pass all-reduce and reduce-scatter that sync/ runs on the CPU
 * backends when the members of a group share a node (docs/sync.md,
 * "Shared memory"), and the one-pass all-gather of a sharded buffer's
 * parameters (hierarchical across hosts too).  It is a transport of its
 * group (groups/transport.h; backend.h, "Shared memory behind this
 * table"): the segment is a communicator of its own transport table
 * (engine.c's mpg__shm_ops), held in the group's transport list so that
 * the context's abort and teardown reach it like any other, its setup
 * collectives come from the group as callbacks, its operations run
 * through the generic layer (mpg__group_run_on) and complete through
 * mpg_work like any other, and
 * its arithmetic is the library's one reduction kernel
 * (mpg__reduce_sources, groups/reduce.c), the thread backend's and the
 * MPI ring's, so equal results are equal by construction.  Two files,
 * calls going one way:
 *  - setup.c: mpg__shm_create (its body, mpg__shm_segment_create, given
 *    the group's setup callbacks by groups/shm_group.c: transport.h) and
 *    _destroy: who shares a node (one
 *    all-gather of host identity, process id and MESHPG_SHM), the
 *    segment (an anonymous
 *    mapping when every member is a thread of one process; else a file
 *    that never has a name: an O_TMPFILE in /dev/shm, or a memfd where
 *    /dev/shm cannot hold one, sized from the caller's bytes, checked
 *    against /dev/shm's free space less a slack for the MPI transport,
 *    reserved, and opened by the other members through
 *    /proc/<creator pid>/fd/<fd>; so no kill at any moment leaves
 *    anything in /dev/shm) and the worker thread;
 *  - engine.c: the segment's table (posting an operation, testing and
 *    waiting for it, with the timeouts), the worker that reduces this
 *    member's shards, and giving up on a dead peer; groups_internal.h
 *    has the contract.
 *
 * Across nodes (hierarchical): when the group's members are on several
 * hosts with the same number n >= 2 on each, each node has its own
 * segment, and the worker of local position r reduces over a
 * communicator split from the group's (`inter`: the members at local
 * position r of every node, ordered by node, so its rank is the node's
 * number).  All-reduce: it sums shard r of its node's buffers into a
 * staging array (f32 for f16/bf16, the pre-multiply applied; no average
 * yet), all-reduces that array (sum) over inter, then divides by the
 * group's size for an average, rounds once and writes the shard back to
 * every local buffer: Horovod's hierarchical all-reduce, with the
 * intra-node steps in shared memory.  Reduce-scatter (a sharded buffer):
 * for each node h in turn it sums, over its node's buffers, the slice
 * owned by the member at local position r of node h (across[h]) into
 * block h of the staging array, reduce-scatters the array (sum) over
 * inter, which leaves block `node` (its own slice's sums over every node)
 * in place, then divides, rounds once and writes that into its own slice
 * of its own buffer only.  Either way the order of every element is
 * position order inside a node, then the backend's order across nodes,
 * with the same arithmetic, so a slice reduce-scattered this way has the
 * bits the hierarchical all-reduce gives it wherever the backend adds the
 * nodes' sums in one order for both (two nodes: always; the thread
 * backend: position order, any number).  A reduce-scatter moves
 * (nodes - 1) / nodes of one slice per member across, less than the
 * all-reduce of the whole array.
 *
 * The all-gather (a sharded buffer's parameters, sync/shard.c) is the
 * same protocol with other work: the member at group position p owns
 * slice p of the operation's elements in its own region, and each
 * member's worker, once every local member posted it, pulls every other
 * local member's slice from that member's region into the same place of
 * its own: one read and one write of each slice per reader, each worker
 * writing only its own region (pushing each slice into the peers' regions
 * instead measured the same; large slices with non-temporal stores:
 * engine.c; bench/README.md, "bench_sync_gather").  Complete, as every
 * operation, when every member's worker finished, so that no member
 * rewrites its slice while a peer still reads it.  Copies only: the bits
 * equal the backend's all-gather's.  Hierarchical (across nodes): the
 * worker of local position r, once every local member posted it,
 * all-gathers over inter the slices of the members at local position r
 * of every node (across[h]: its own slice sent from its region) into
 * s->stage (block h: node h's), in chunks of what the stage holds (the
 * same on every node), and copies each block h into every local region at
 * slice across[h] (its own slice in its own region excepted: in place).
 * Every slice of the group belongs to one local position, so once every
 * local worker finished, every local region holds every slice; each
 * worker writes only its own local position's slices (in every region)
 * and reads only its own slice from its region, so no two workers touch
 * one byte in an operation and no barrier but completion is needed (no
 * second phase).  A failure of the step across nodes is reported as the
 * reductions' (peer -2, inter_err: "the all-gather across nodes").
 *
 * The segment.  A control area (struct shm_ctl, then one cache line per
 * member for `posted` and one for `finished`, then each member's ring of
 * `depth` operation descriptors), then one region per member: member p's
 * buffer, each a whole number of pages plus 5 cache lines, so that the
 * members' elements do not meet at one offset modulo 4 KiB (so position
 * 0's region is page aligned, the others only 64-byte aligned).  `depth`
 * is the caller's depth rounded up to a power of two (at most
 * SHM_MAX_DEPTH).  Member p posts its operations in order,
 * numbered q = q0, q0 + 1, ... (q0 is 0, or the test seam's first_q; each
 * member numbers alike: every member
 * posts the same operations in the same order): it writes descriptor q
 * into slot q & (depth - 1) of its ring, then stores posted[p] = q + 1
 * (release) and wakes the futex on that word.  Member p's worker thread, for each
 * q in turn, waits for posted[x] > q of every member x (acquire), checks
 * that x's descriptor equals its own (kind included), reduces (or, for an
 * all-gather, copies: above) its shard of operation q
 * from every region (in position order, in f32 for f16/bf16, the average
 * and the pre-multiply fused: mpg__reduce_sources), writes the result back (every region for
 * an all-reduce, its own for a reduce-scatter) and stores finished[p] =
 * q + 1 (release).  Operation q is complete for a member when
 * finished[x] > q for every x: every shard was read and written.  The
 * counters are 32-bit and compared by signed difference, so they may
 * wrap; since depth is a power of two (a divisor of 2^32), slot
 * q & (depth - 1) stays consecutive across the wrap.  A member does not
 * reuse a descriptor slot before operation q - depth is complete
 * everywhere; whether an earlier operation used the slot is decided by
 * the member's 64-bit count of its posts (nposts >= depth), never by q,
 * which may have wrapped.
 *
 * Faults.  Waits are futex waits of at most 100 ms (after a spin of a few
 * microseconds), each followed by a look at the shared abort word, the
 * context's abort flag and the
 * deadline (the post's time plus the context's timeout; the waiting main
 * thread allows itself 0.25 s more, so that the worker, which knows which
 * member never posted, reports first).  The first member to give up stores
 * its reason in the abort word and wakes every futex of the segment, so
 * that every member returns MPG_ERR_TIMEOUT or MPG_ERR_ABORTED within the
 * timeout plus a fraction of a second, even when a member died.  The
 * abort word is one 64-bit atomic holding all of the reason (status,
 * position that gave up, the peer it waited for, the operation), stored
 * by one compare-and-swap from 0: no reader can see an abort claimed but
 * not yet explained, and a status 0 is never stored (a reader that finds
 * one reports MPG_ERR_ABORTED).  Every path that reports an abort returns
 * an error, never MPG_OK.  The position and peer fields bound the members
 * of a segment to SHM_MAX_MEMBERS: a node with more keeps the shared path
 * off (one log line).
 *
 * A failed post.  Once the segment exists, any post that fails (bad
 * arguments, the group in use by another thread, the context aborted,
 * out of memory, the slot-reuse wait failing) has not published its
 * operation q, while the peers may have published theirs: a later post of
 * this member would reuse q and pair with the peers' operation of another
 * step (MPG_OK on wrong sums).  So every such failure aborts the segment
 * (status: the failure's, peer -1) before returning, and goes through
 * mpg__group_on_failure: every later operation of every member fails,
 * the peers with MPG_ERR_ABORTED naming this member and the reason.  The
 * handle is allocated before anything is written, so that nothing is
 * half published. */
#ifndef MPG_GROUPS_SHM_INTERNAL_H
#define MPG_GROUPS_SHM_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "core.h"

#define SHM_MAGIC 0x6d706773u /* "mpgs" */
#define SHM_LINE 64
#define SHM_PAGE 4096

/* The abort word: 0 while healthy, else, packed in one 64-bit atomic,
 * bits 0-6 the mpg_status that ended it (never 0), bits 7-18 the position
 * that gave up, bits 19-31 the member it waited for plus 2 (so -1: none,
 * -2: its reduction between hosts), bits 32-63 the operation. */
#define SHM_ABORT_STATUS_BITS 7
#define SHM_ABORT_BY_BITS 12
#define SHM_ABORT_PEER_BITS 13
#define SHM_MAX_MEMBERS (1 << SHM_ABORT_BY_BITS) /* members of one segment */
#define SHM_MAX_DEPTH (1 << 20)                  /* ring slots per member */

#if ATOMIC_LLONG_LOCK_FREE != 2
#error "the abort word needs a lock-free 64-bit atomic (it is shared between processes)"
#endif
_Static_assert(MPG_STATUS_COUNT <= (1 << SHM_ABORT_STATUS_BITS), "status field too narrow");
_Static_assert(SHM_MAX_MEMBERS + 2 <= (1 << SHM_ABORT_PEER_BITS), "peer field too narrow");
_Static_assert(SHM_ABORT_STATUS_BITS + SHM_ABORT_BY_BITS + SHM_ABORT_PEER_BITS == 32,
               "the abort word's low half");

/* The shared header. */
typedef struct shm_ctl {
  uint32_t magic, n, depth;
  _Atomic int32_t refs;       /* anonymous mode: members still attached */
  _Atomic uint64_t abort;     /* 0, or the packed reason (above) */
} shm_ctl;

typedef struct shm_abort {
  mpg_status status; /* never MPG_OK once aborted */
  int by, peer;
  uint32_t q;
} shm_abort;

typedef struct shm_word {
  _Atomic uint32_t v;
  char pad[SHM_LINE - sizeof(uint32_t)];
} shm_word;

/* The kinds of operation (shm_desc.kind). */
enum { SHM_ALL_REDUCE = 0, SHM_REDUCE_SCATTER = 1, SHM_ALL_GATHER = 2 };

/* One operation as a member posted it (compared between members, the kind
 * too: a gather paired with a reduction is MPG_ERR_INVALID). */
typedef struct shm_desc {
  uint64_t offset, count; /* elements; reduce-scatter, all-gather: per member */
  int32_t dtype, op, kind, pad; /* op 0 and scale 1 for an all-gather */
  double scale;
} shm_desc;

/* The segment as the communicator of shm's table (engine.c), and one
 * posted operation: its number and the deadline its post set (the
 * worker's; the waiting thread allows itself GRACE_S more).  Defined here
 * only: the backends' communicators are opaque to shm/. */
struct mpg__comm {
  mpg__shm *shm;
};
struct mpg__req {
  mpg__shm *shm;
  uint32_t q;
  double deadline;
};

struct mpg__shm {
  mpg__comm self;       /* this segment as a communicator of shm's table */
  mpg__transport link;  /* in its group's transport list (mpg__shm_create's
                           segments; a channel's belongs to its channel) */
  mpg_group *group;
  int n, pos;           /* members on this node (the segment's), this one's */
  int total;            /* members of the group (n x nodes) */
  int *members;         /* n: the group position of each local member */
  /* Hierarchical (the group spans nodes, n members on each): this
   * member's all-reduce (or reduce-scatter) of its node's partial sums
   * with the members at the same local position on the other nodes, run
   * by the worker over inter, whose rank is this node's number. */
  mpg__comm *inter;
  const struct mpg__transport_ops *inter_ops; /* inter's table (the setup's
                           split_ops: the backend's) */
  int nodes, node;      /* the group's nodes (1: one), this member's */
  int scatter;          /* made for a sharded buffer (its reductions
                           across nodes are reduce-scatters; messages) */
  int *across;          /* nodes: the group position of the member at
                           this local position on each node (inter's
                           members in rank order) */
  void *stage;          /* the partial sums (f32, or f64): the shard's
                           (all-reduce), or one slice per node (scatter);
                           an all-gather's chunk of each node's slice */
  size_t stage_elems;
  int anon;             /* one mapping shared by the threads of a process */
  char *base;           /* the mapping */
  size_t map_bytes, region_bytes;
  shm_ctl *ctl;
  shm_word *posted, *finished; /* n each */
  shm_desc *desc;              /* n x depth */
  int depth;
  char **region;               /* n: each member's buffer in this mapping */
  mpg_dtype dtype;
  _Atomic uint32_t nposted;    /* the number of this member's next operation
                                  (q0 + posts, wrapping); atomic (relaxed)
                                  only so that a refused second thread may
                                  name it in its abort */
  uint64_t nposts;             /* operations this member posted (no wrap) */
  atomic_int posting;          /* the kind (SHM_*) of this member's latest
                                  post, made or refused: for messages
                                  (relaxed: a refused second thread too) */
  double *deadline;            /* depth: the worker's deadline of each */
  pthread_t worker;
  int worker_up;
  atomic_int stop;
  void *scratch;               /* the kernel's blocks (MPG__REDUCE_SCRATCH) */
  const void **src;            /* n: the kernel's sources, for one shard */
  void **dst;                  /* n: and its destinations */
  char gname[128];             /* "dp_cp" index 1: for messages */
  char inter_err[512];         /* why this member's step across nodes
                                  failed (the backend's message, naming the
                                  missing member); written by the worker
                                  before it publishes the abort */
};

/* engine.c: the segment's transport table (transport.h), and freeing a
 * segment (NULL: nothing) that is out of its group's list: the worker
 * stopped, the mapping unmapped. */
extern const struct mpg__transport_ops mpg__shm_ops;
void mpg__shm_release(mpg__shm *s);
/* engine.c: the worker thread's body. */
void *mpg__shm_worker(void *arg);
/* engine.c: give up (first caller wins): store the whole reason in the
 * abort word at once (why MPG_OK is stored as MPG_ERR_ABORTED) and wake
 * every futex of the segment. */
void mpg__shm_abort(mpg__shm *s, mpg_status why, int peer, uint32_t q);
/* engine.c: the abort word of the segment: 0 while healthy, else *out
 * holds the reason (out may be NULL). */
int mpg__shm_aborted(const mpg__shm *s, shm_abort *out);

/* Test seams (tests/groups/test_shm_faults.c), zero by default, set only
 * by a test before it creates its contexts; never read from the
 * environment.  first_q: the number of every segment's first operation
 * (setup.c, read at creation), so that a test can start the counters
 * near their wrap.  abort_claimed: called by mpg__shm_abort right after
 * this member's compare-and-swap won the abort word, before the futexes
 * are woken, so that a test can stall a winner there.  Off the hot path:
 * read once per segment and once per abort. */
typedef struct mpg__shm_seam_set {
  uint32_t first_q;
  void (*abort_claimed)(int pos, mpg_status why, int peer, uint32_t q);
} mpg__shm_seam_set;
extern mpg__shm_seam_set mpg__shm_seams;
/* engine.c: futex wait while *w == val, at most timeout_s; wake all. */
void mpg__shm_futex_wait(_Atomic uint32_t *w, uint32_t val, double timeout_s);
void mpg__shm_futex_wake(_Atomic uint32_t *w);

/* engine.c: the largest shard of a buffer of `elems` elements (the
 * stage's size; it also holds a reduce-scatter's one slice per node,
 * nodes x elems / (n x nodes) elements at most). */
size_t mpg__shm_max_shard(const mpg__shm *s, size_t elems);

#endif
