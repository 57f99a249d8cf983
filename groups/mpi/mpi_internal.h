/* The Open MPI backend's internal header: the structs its files share and
 * their mpg__mpi_* functions.  The backend is one MPI communicator per
 * group and nonblocking MPI operations polled against the caller's
 * deadline; it fills `const struct mpg__backend_ops mpg__backend_mpi`
 * (groups/backend.h).  One job per file, lowest layer first; a file calls
 * only files listed above it (no two files call each other):
 *
 *   state.c     the process-wide state the files share (mpg__mpi below)
 *               and its small helpers: MPI error text, communicator
 *               reference counts, noting a fault.
 *   pending.c   pending work and its waiters: the pacing of polling
 *               loops, the live communicators and their pending requests,
 *               a waiter's sleep and wake-up, whether the progress thread
 *               runs.
 *   staging.c   memory MPI may write: staging buffers recycled per
 *               communicator, and the regions of mem_alloc (zero-copy).
 *   ring.c      meshpg's own pipelined ring all-reduce for large buffers.
 *   orphans.c   the end of a request: its release, or its deferred free
 *               (with memory) while an abandoned operation may use it.
 *   ops.c       operations: post, test, wait, free; data types, chunking
 *               of counts above INT_MAX, the completion step; the
 *               all-to-all (one MPI_Ialltoallv).
 *   progress.c  the progress thread, driving pending requests and pieces.
 *   world.c     MPI ownership (init, finalise, the no-finalise-after-fault
 *               rule; mpi_owner.h) and communicator lifecycle: world,
 *               split, abort, destroy; the function table.
 *
 * Threads.  Every MPI call of meshpg is serialised by one process-wide
 * lock, mpg__mpi.lock (never held while sleeping), which also guards the
 * state below unless it is atomic; so contexts may be used from several
 * threads.  "Lock held" in a comment means the caller holds it. */
#ifndef MPG_GROUPS_MPI_INTERNAL_H
#define MPG_GROUPS_MPI_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <time.h>

#include <mpi.h>

#include "backend.h"
#include "mpi_owner.h"

#define MPG_MPI_TAG 0x6d70 /* send/recv tag; below the guaranteed 32767 */
#define MPG_MPI_SPARES 4   /* staging buffers cached per communicator */
#define MPG_MPI_SPARE_MAX ((size_t)256 << 20) /* larger ones are not cached */
/* Large all-reduces are pipelined: cut into pieces of at most
 * mpg__mpi.piece bytes (1 MiB; MESHPG_MPI_PIECE_BYTES), each all-reduced
 * by our own ring (ring.c), with at most mpg__mpi.window pieces in flight
 * per communicator (MESHPG_MPI_WINDOW; by default MPG_MPI_WINDOW_WIDE when
 * this node's ranks have a core each, else MPG_MPI_WINDOW_NARROW, see
 * world.c).  Pieces are started from one FIFO per communicator, so every
 * member starts them in the same order whatever the timing. */
#define MPG_MPI_PIECE_DEFAULT ((size_t)1 << 20)
#define MPG_MPI_WINDOW_MAX 8
#define MPG_MPI_WINDOW_WIDE 8
#define MPG_MPI_WINDOW_NARROW 2

/* One piece of a pipelined all-reduce: elements [off, off + count) of its
 * request, all-reduced by our own ring over MPI point-to-point (ring.c).
 * Its input is staged (widened, pre-multiplied) when the piece starts and
 * its result divided and copied out when it completes, so that this work,
 * too, runs piece by piece behind the communication. */
struct piece {
  struct mpg__req *q;    /* the request the piece belongs to */
  int slot;              /* its MPI requests: q->reqs[slot] (receive) and
                            q->reqs[slot + 1] (send) */
  size_t off;
  int count;
  int step;              /* ring step in flight, 0 .. 2 (size - 1) - 1 */
  int tag;
  int scratch;           /* its slot in the communicator's scratch */
  int busy;              /* a pump works on it without the lock */
  int dropped;           /* purged meanwhile: that pump frees it */
  struct piece *next;
};

/* Memory from the mem_alloc op (mpg_ctx_mem_alloc).  An in-place
 * all-reduce on it skips staging: MPI works on it directly.  Its timeout
 * safety comes from ownership instead: a region that a pending (or
 * orphaned) operation uses is freed only when the last such operation is
 * released, so a late write from MPI lands in live memory. */
struct region {
  char *base;
  size_t len;
  int fd;              /* a memfd the node's other processes may map
                          (groups/shm/a2a.c), or -1: posix_memalign */
  uint64_t ino;        /* its inode, told apart from a later memfd */
  int busy;            /* requests using it */
  int freed;           /* mem_free was called while busy */
  struct region *next;
};

struct mpg__comm {
  MPI_Comm comm;
  int rank, size;
  double timeout_s;
  int is_world;
  atomic_int aborted;  /* MPG_OK, or the reason given to the abort op */
  int refs;            /* 1 while not destroyed + one per live request */
  int npending;        /* posted requests not yet seen complete */
  int norphans;        /* requests abandoned unfinished */
  int destroyed;
  void *spare[MPG_MPI_SPARES]; /* staging buffers kept for reuse */
  size_t spare_len[MPG_MPI_SPARES];
  struct piece *queue, *queue_tail; /* pieces not posted yet, FIFO */
  struct piece *flight[MPG_MPI_WINDOW_MAX]; /* pieces posted, not seen done */
  int nflight;
  unsigned seq;        /* pieces started, for their tags */
  char *scratch;       /* MPG_MPI_WINDOW_MAX slots of scratch_slot bytes */
  size_t scratch_slot;
  int scratch_busy[MPG_MPI_WINDOW_MAX];
  struct mpg__comm *live_prev, *live_next; /* live list, for the progress thread */
  struct mpg__req *pend;  /* pending requests */
};

/* FIN_SCATTER: an all-to-all's received blocks, packed in `out`, go to
 * their places in dst (struct mpg__req's a2a). */
enum finish_kind { FIN_NONE, FIN_COPY, FIN_NARROW, FIN_SCATTER };

struct mpg__req {
  mpg__comm *comm;     /* NULL once orphaned */
  mpg__coll_kind kind;
  mpg_dtype dtype;
  mpg_op op;
  size_t count;
  int peer;            /* root or peer, for messages */
  int size, rank;      /* of the group, for messages */
  int nreq;
  MPI_Request *reqs;   /* &one, or a malloc'ed array */
  MPI_Request one;
  void *stage;         /* owned staging memory or NULL */
  size_t stage_cap;    /* its allocated size */
  /* Completion step: divide `out` (work_dtype, nfin elements) by divisor,
   * then copy or narrow it into dst. */
  enum finish_kind fin;
  void *out, *dst;
  size_t nfin;
  mpg_dtype work_dtype;
  int divisor;         /* 0: no division */
  int finished;
  mpg_status status;
  int dead;            /* orphan whose MPI test failed: never freed */
  int unposted;        /* pipelined pieces still in the comm's queue */
  int inflight;        /* ... posted and not yet retired by a pump */
  int busy_pieces;     /* its pieces a pump works on without the lock */
  atomic_int mpi_done; /* MPI finished it, or failed (pipe_rc): the
                          completion step may run */
  struct mpg__req *pend_prev, *pend_next; /* comm->pend while pending */
  int pipe_rc;         /* MPI error posting a piece */
  /* Pipelined all-reduce: per-piece staging and completion (see struct
   * piece).  wire is the buffer MPI reduces (staging, or dst itself when
   * zero-copy), of MPI type mtype with mop; src the caller's input. */
  const char *src;
  char *wire;
  MPI_Datatype mtype;
  MPI_Op mop;
  double premul;       /* 0: none */
  mpg_op rop;          /* the reduction: SUM (also for AVG, PREMUL_SUM), MAX, MIN */
  int piece_div;       /* 0: no division */
  enum finish_kind piece_fin;
  struct region *region; /* zero-copy: the mem_alloc region used (all-to-all:
                            the receive side's) */
  /* All-to-all (ops.c): a2a != NULL.  a2a holds 4 * size entries, per
   * member p: the receive count, its displacement in dst, its offset in
   * the packed receive staging, and the send block's offset in the packed
   * send staging (or in the caller's send when zero-copy); a2a_int the
   * four int arrays MPI_Ialltoallv reads until it completes. */
  size_t *a2a;
  int *a2a_int;
  size_t a2a_in;         /* elements received, for messages (count: sent) */
  struct region *region2; /* zero-copy: the send side's region */
  struct mpg__req *next; /* orphan list */
};

/* Process-wide state shared by the files (defined in state.c); each file
 * keeps the rest of its state to itself. */
struct mpg__mpi_state {
  pthread_mutex_t lock;  /* see Threads above */
  /* Threads other than the progress thread waiting for the lock: the
   * progress thread lets them in between its rounds (a mutex is not fair,
   * and a thread that unlocks and relocks at once would starve them). */
  atomic_int want;
  int we_finalized;      /* meshpg called MPI_Finalize */
  long chunk;            /* most elements per MPI call (MESHPG_MPI_MAX_COUNT) */
  size_t piece;          /* ring piece bytes (MESHPG_MPI_PIECE_BYTES) */
  int window;            /* ring pieces in flight per communicator
                            (MESHPG_MPI_WINDOW), 1 .. MPG_MPI_WINDOW_MAX */
  atomic_int faulted;    /* an abort or timeout happened here (world.c) */
  /* The work of the progress thread: pending.c keeps it, progress.c
   * drives it. */
  mpg__comm *live;       /* every communicator not destroyed */
  long pending_total;    /* sum of npending over live */
  pthread_cond_t prog_cond; /* wakes the progress thread: new work, stop */
  atomic_int prog_running; /* a thread was started and not joined */
  atomic_int prog_idle;  /* it has backed off: callers drive MPI */
};
extern struct mpg__mpi_state mpg__mpi;

static inline void lock_g(void) {
  atomic_fetch_add(&mpg__mpi.want, 1);
  pthread_mutex_lock(&mpg__mpi.lock);
  atomic_fetch_sub(&mpg__mpi.want, 1);
}

static inline void unlock_g(void) { pthread_mutex_unlock(&mpg__mpi.lock); }

/* state.c */
/* "<call> failed for <what>: <MPI's error string>" as MPG_ERR_BACKEND. */
mpg_status mpg__mpi_fail(int rc, const char *call, const char *what);
/* Errors that return.  meshpg sets MPI_ERRORS_RETURN on every communicator
 * it makes, but Open MPI (4.1) reports some errors on a communicator that
 * is not meshpg's: a nonblocking collective's error (libnbc: a truncated
 * all-reduce, say) on MPI_COMM_WORLD when the request completes, a call on
 * the caller's opts.mpi_comm on that one.  mpg__mpi_ret_begin(&g, c) makes
 * c's errors return for the calls up to mpg__mpi_ret_end(&g), which restores
 * c's handler (nothing is changed when c's errors already return).
 * Lock held, MPI initialised and not finalised. */
typedef struct mpg__mpi_ret {
  MPI_Comm comm;
  MPI_Errhandler saved;
  int swapped;
} mpg__mpi_ret;
void mpg__mpi_ret_begin(mpg__mpi_ret *g, MPI_Comm c);
void mpg__mpi_ret_end(mpg__mpi_ret *g);
/* Test n requests (MPI_REQUEST_NULL counts as done), completing those done
 * in order up to the first still pending, MPI_COMM_WORLD's errors
 * returning meanwhile (see mpg__mpi_ret_begin): *flag 1 when all are done.
 * Returns MPI_SUCCESS, or the first request's error (MPI_ERR_TRUNCATE, not
 * MPI_ERR_IN_STATUS).  Lock held. */
int mpg__mpi_test_reqs(int n, MPI_Request *reqs, int *flag);
/* Drop one reference to m; free the struct at zero.  Lock held. */
void mpg__mpi_comm_unref(mpg__comm *m);
/* An abort or a timeout happened: MPI is then finalised only at exit. */
void mpg__mpi_note_fault(void);

/* pending.c */
/* Pacing of a polling loop (see pending.c). */
typedef struct mpg__mpi_poller {
  double start, spin_s;
  unsigned sleeps;
} mpg__mpi_poller;
void mpg__mpi_poller_init(mpg__mpi_poller *p, size_t bytes);
void mpg__mpi_poller_pause(mpg__mpi_poller *p);
/* The CLOCK_REALTIME time `secs` from now, for pthread_cond_timedwait. */
struct timespec mpg__mpi_time_after(double secs);
/* m joins or leaves the live list (lock held). */
void mpg__mpi_live_add(mpg__comm *m);
void mpg__mpi_live_remove(mpg__comm *m);
/* q becomes pending on m, or stops being pending (lock held). */
void mpg__mpi_pend_link(mpg__comm *m, mpg__req *q);
void mpg__mpi_pend_unlink(mpg__comm *m, mpg__req *q);
/* Wake every waiter sleeping in mpg__mpi_nap_on_done. */
void mpg__mpi_wake_waiters(void);
/* Sleep until the progress thread sees an operation finish, an abort, or
 * at most a few ms (never past deadline).  Lock NOT held. */
void mpg__mpi_nap_on_done(const mpg__req *q, double deadline);
/* The progress thread runs; it has backed off (callers drive MPI then). */
int mpg__mpi_progress_running(void);
int mpg__mpi_progress_idle(void);

/* staging.c */
/* A cached staging buffer of m with at least `bytes` (its size in *cap),
 * or NULL; give one back for reuse (or free it).  Lock held. */
void *mpg__mpi_stage_take(mpg__comm *m, size_t bytes, size_t *cap);
void mpg__mpi_stage_give(mpg__comm *m, void *p, size_t cap);
/* The mem_alloc region holding [p, p + bytes), or NULL; a request stops
 * using its region.  Lock held. */
struct region *mpg__mpi_region_find(const void *p, size_t bytes);
void mpg__mpi_region_unref(struct region *r);
mpg_status mpg__mpi_mem_alloc(mpg__comm *world, size_t bytes, int registered,
                              void **ptr);
mpg_status mpg__mpi_mem_free(mpg__comm *world, void *ptr);
/* mem_share (backend.h): a region of mem_alloc in a memfd. */
int mpg__mpi_mem_share(const void *ptr, size_t bytes, int *fd, uint64_t *offset,
                       uint64_t *len, uint64_t *id);

/* ring.c */
/* Would an all-reduce of n elements of es bytes run as ring pieces, and
 * into how many? */
int mpg__mpi_pipelined(size_t n, size_t es);
size_t mpg__mpi_npieces(size_t n, size_t es);
/* Queue q's all-reduce as pieces.  Lock held.  Returns an MPI code. */
int mpg__mpi_queue_allreduce(mpg__req *q, mpg__comm *m, size_t ws);
/* Advance m's pieces; returns how many moved.  Lock held (released
 * meanwhile; see ring.c). */
int mpg__mpi_pump(mpg__comm *m);
/* Forget every piece of q.  Lock held. */
void mpg__mpi_purge(mpg__comm *m, mpg__req *q);
/* "; ring step S ...: position L never sent it ..." for a timed-out q
 * (empty when q's ring waits for nobody).  Lock held. */
void mpg__mpi_ring_detail(mpg__comm *m, mpg__req *q, char *buf, size_t n);

/* orphans.c (all lock held) */
/* Free q and what it owns (it is finished, or MPI is done with it). */
void mpg__mpi_req_release(mpg__req *q);
/* Orphan a request that cannot be released yet. */
void mpg__mpi_orphan(mpg__req *q);
/* Park a bare pending MPI request and memory MPI may still write; with
 * until_finalize, just the memory, until MPI_Finalize. */
void mpg__mpi_orphan_request(MPI_Request r, void *mem, int until_finalize);
/* Test every orphan once and free those that completed. */
void mpg__mpi_sweep_orphans(void);
/* After MPI_Finalize: free them all. */
void mpg__mpi_free_orphans(void);

/* ops.c */
mpg_status mpg__mpi_post(mpg__comm *m, const mpg__coll *c, mpg__req **out);
mpg_status mpg__mpi_post_alltoallv(mpg__comm *m, const void *send, const size_t *sc,
                                   const size_t *sd, void *recv, const size_t *rc,
                                   const size_t *rd, mpg_dtype dt, mpg__req **out);
mpg_status mpg__mpi_test(mpg__req *q, int *done);
mpg_status mpg__mpi_wait(mpg__req *q, double deadline);
void mpg__mpi_req_free(mpg__req *q);
/* Has q's MPI part completed?  Lock held; see ops.c. */
int mpg__mpi_req_poll(mpg__req *q, int *flag);

/* progress.c */
/* MESHPG_MPI_PROGRESS as mpg_ctx_create parsed it (1: thread, 0: off);
 * then the thread level MPI should be initialised at for it. */
void mpg__mpi_progress_configure(int thread);
int mpg__mpi_progress_level(void);
/* Start the thread (lock held); stop and join it (lock NOT held). */
void mpg__mpi_progress_start(void);
void mpg__mpi_progress_stop(void);

/* world.c: the function table, and mpi_owner.h. */

#endif
