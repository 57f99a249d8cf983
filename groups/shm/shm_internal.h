/* Node-local shared memory for a group's in-place reductions: the
 * one-pass all-reduce and reduce-scatter that sync/ runs on the CPU
 * backends when the members of a group share a node (docs/sync.md,
 * "Shared memory").  Three files, calls going one way:
 *  - setup.c: mpg__shm_create / _destroy: who shares a node (one
 *    all-gather of host identity, process id and MESHPG_SHM), the
 *    segment (an anonymous
 *    mapping when every member is a thread of one process; else a file
 *    that never has a name: an O_TMPFILE in /dev/shm, or a memfd where
 *    /dev/shm cannot hold one, sized from the caller's bytes, checked
 *    against /dev/shm's free space less a slack for the MPI transport,
 *    reserved, and opened by the other members through
 *    /proc/<creator pid>/fd/<fd>; so no kill at any moment leaves
 *    anything in /dev/shm) and the worker thread;
 *  - engine.c: posting an operation, the worker, waiting, timeouts and
 *    giving up on a dead peer; groups_internal.h has the contract;
 *  - kernel.c: the reduction of one shard.
 *
 * Across nodes (hierarchical, all-reduce only): when the group's members
 * are on several hosts with the same number n >= 2 on each, each node has
 * its own segment, and the worker of local position r, after summing shard
 * r of its node's buffers into a staging array (f32 for f16/bf16, the
 * pre-multiply applied; no average yet), all-reduces that array (sum) over
 * a communicator split from the group's: the members at local position r
 * of every node, ordered by node.  Then it divides by the group's size for
 * an average, rounds once and writes the shard back to every local
 * buffer: Horovod's hierarchical all-reduce, with the intra-node steps in
 * shared memory.  The order is then: position order inside a node, the
 * backend's order across nodes.
 *
 * The segment.  A control area (struct shm_ctl, then one cache line per
 * member for `posted` and one for `finished`, then each member's ring of
 * `depth` operation descriptors), then one region per member: member p's
 * buffer, each a whole number of pages plus 5 cache lines, so that the
 * members' elements do not meet at one offset modulo 4 KiB.  Member p posts its operations in order,
 * numbered q = 0, 1, 2, ... (each member numbers alike: every member
 * posts the same operations in the same order): it writes descriptor q
 * into slot q % depth of its ring, then stores posted[p] = q + 1 (release)
 * and wakes the futex on that word.  Member p's worker thread, for each
 * q in turn, waits for posted[x] > q of every member x (acquire), checks
 * that x's descriptor equals its own, reduces its shard of operation q
 * from every region (in position order, in f32 for f16/bf16, the average
 * and the pre-multiply fused), writes the result back (every region for
 * an all-reduce, its own for a reduce-scatter) and stores finished[p] =
 * q + 1 (release).  Operation q is complete for a member when
 * finished[x] > q for every x: every shard was read and written.  The
 * counters are 32-bit and compared by signed difference, so they may
 * wrap.  A member does not reuse descriptor slot q % depth before
 * operation q - depth is complete everywhere.
 *
 * Faults.  Waits are futex waits of at most 100 ms (after a spin of a few
 * microseconds), each followed by a look at the shared abort word, the
 * context's abort flag and the
 * deadline (the post's time plus the context's timeout; the waiting main
 * thread allows itself 0.25 s more, so that the worker, which knows which
 * member never posted, reports first).  The first member to give up stores
 * its reason in the abort word and wakes every futex of the segment, so
 * that every member returns MPG_ERR_TIMEOUT or MPG_ERR_ABORTED within the
 * timeout plus a fraction of a second, even when a member died. */
#ifndef MPG_GROUPS_SHM_INTERNAL_H
#define MPG_GROUPS_SHM_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "ctx_internal.h"

#define SHM_MAGIC 0x6d706773u /* "mpgs" */
#define SHM_LINE 64
#define SHM_PAGE 4096

/* The shared header. */
typedef struct shm_ctl {
  uint32_t magic, n, depth;
  _Atomic uint32_t abort_status; /* 0, or the mpg_status that ended it */
  _Atomic int32_t abort_by;      /* position that gave up */
  _Atomic int32_t abort_peer;    /* the member it waited for, -1: none,
                                    -2: its all-reduce between hosts */
  _Atomic uint32_t abort_q;      /* the operation */
  _Atomic int32_t refs;          /* anonymous mode: members still attached */
} shm_ctl;

typedef struct shm_word {
  _Atomic uint32_t v;
  char pad[SHM_LINE - sizeof(uint32_t)];
} shm_word;

/* One operation as a member posted it (compared between members). */
typedef struct shm_desc {
  uint64_t offset, count; /* elements; reduce-scatter: count per member */
  int32_t dtype, op, scatter, pad;
  double scale;
} shm_desc;

struct mpg__shm {
  mpg_group *group;
  int n, pos;           /* members on this node (the segment's), this one's */
  int total;            /* members of the group (n x nodes) */
  int *members;         /* n: the group position of each local member */
  /* Hierarchical (the group spans nodes, n members on each): this
   * member's all-reduce of its node's partial sums with the members at
   * the same local position on the other nodes, run by the worker. */
  mpg__comm *inter;
  void *stage;          /* the shard's partial sums (f32, or f64) */
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
  uint32_t nposted;            /* operations this member posted */
  double *deadline;            /* depth: the worker's deadline of each */
  pthread_t worker;
  int worker_up;
  atomic_int stop;
  void *scratch;               /* the worker's blocks (kernel.c) */
  char gname[128];             /* "dp_cp" index 1: for messages */
};

/* engine.c: the worker thread's body. */
void *mpg__shm_worker(void *arg);
/* engine.c: give up (first caller wins): store the reason and wake every
 * futex of the segment. */
void mpg__shm_abort(mpg__shm *s, mpg_status why, int peer, uint32_t q);
/* engine.c: futex wait while *w == val, at most timeout_s; wake all. */
void mpg__shm_futex_wait(_Atomic uint32_t *w, uint32_t val, double timeout_s);
void mpg__shm_futex_wake(_Atomic uint32_t *w);

/* kernel.c: the worker's scratch (NULL: out of memory) and the reduction
 * of this member's shard of operation d: in one pass on one node; or
 * (hierarchical) _partial sums the node's into s->stage (returns its
 * element count) and _finish, once the
 * stage was all-reduced across nodes, averages, rounds and writes it back. */
void *mpg__shm_scratch(void);
void mpg__shm_reduce(mpg__shm *s, const shm_desc *d);
size_t mpg__shm_partial(mpg__shm *s, const shm_desc *d);
void mpg__shm_finish(mpg__shm *s, const shm_desc *d);
/* kernel.c: the largest shard of a buffer of `elems` elements (stage
 * size). */
size_t mpg__shm_max_shard(const mpg__shm *s, size_t elems);

#endif
