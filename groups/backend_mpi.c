/* The Open MPI backend: one MPI communicator per group, nonblocking MPI
 * collectives polled against the caller's deadline.
 *
 * Data types.  f32, f64, i32 and i64 map to MPI types and reduce natively
 * (SUM, MAX, MIN).  f16/bf16 have no MPI reduction, so they are widened into
 * an f32 staging buffer, reduced in f32 and narrowed once when the operation
 * completes (f32 accumulation).  Broadcast, all_gather and send/recv move
 * 16-bit data untouched as MPI_UINT16_T.  AVG is a SUM divided by the group
 * size on completion (integers truncate); PREMUL_SUM multiplies a staged
 * copy of the input, then sums.  All post-processing (divide, narrow, copy
 * out) runs in test/wait when completion is first observed.
 *
 * Staging.  MPI never sees a caller's buffer: every operation copies its
 * input into staging memory owned by the request and copies the result
 * out on completion (half types widen/narrow on the way, which they need
 * anyway).  This costs a copy in and out, but it is what makes a timeout
 * safe: an abandoned operation cannot be cancelled (MPI forbids it for
 * collectives), and if the late peer does arrive while this process is
 * still inside MPI (MPI_Finalize waits for every process, and progresses
 * everything meanwhile) MPI completes it and writes its result.  With
 * staging that write lands in memory the orphan list still owns, never
 * in a caller's buffer that was freed or reused after the timeout.
 * Staging buffers are recycled per communicator (a few, up to 256 MiB
 * each), so steady-state collectives do not allocate.  The exception is
 * memory this backend hands out itself (mem_alloc, i.e.
 * mpg_ctx_mem_alloc): an in-place all-reduce on it is zero-copy, and its
 * timeout safety comes from ownership instead (see struct region).
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
 * with sleeps growing to 1 ms (see poller_pause()).
 * Communicator creation is the exception: MPI has no nonblocking split
 * (MPI_Comm_isplit does not exist; Open MPI 4.1 is MPI-3.1), and an
 * abandoned MPI_Comm_idup crashes Open MPI's MPI_Finalize.  So
 * world_init (MPI_Comm_dup) and split (MPI_Comm_split) first run a
 * two-phase MPI_Ibarrier rendezvous polled against the timeout (see
 * rendezvous()): an absent peer gives MPG_ERR_TIMEOUT, and the blocking
 * call is entered only once every rank is known to be entering it too.
 * A split that times out marks its parent aborted (a barrier stays
 * pending on it).  MPI_Init_thread itself cannot be bounded: Open MPI's
 * start-up exchange runs inside it, under the launcher's control.
 *
 * Abort.  the abort op only sets a flag: it never calls MPI (and never
 * MPI_Abort, which would kill the job).  Waiters see the flag within one
 * poll; later posts fail with the reason.  A request freed before it
 * finished cannot be released: MPI forbids MPI_Request_free and MPI_Cancel
 * on nonblocking collectives, and MPI may still write its buffers.  Such a
 * request is parked on a process-wide orphan list (an Irecv is cancelled
 * first) with its staging memory; orphans are tested now and then and
 * freed once they complete or once MPI is finalised.  Their buffers are
 * therefore never freed under MPI's feet, and the caller's buffers are
 * free for reuse as soon as the call returns, whatever its status.
 *
 * Destroy.  MPI_Comm_free is skipped for a communicator that was aborted
 * or still has unfinished operations: its handle is left to
 * MPI_Finalize.  (Open MPI frees locally, but pending nonblocking
 * collectives hold on to the communicator, and the standard lets an
 * implementation synchronise in MPI_Comm_free.)
 *
 * Finalize.  If this backend initialised MPI, it finalises it exactly once
 * per process: when the last world communicator is destroyed after a clean
 * run.  In Open MPI MPI_Finalize is a job-wide rendezvous (a PMIx fence):
 * it returns only when every process has called it.  After an abort or a
 * timeout a peer may never get there, so destroy must not enter it; yet a
 * process that exits without MPI_Finalize makes mpirun declare the job
 * failed and kill the other processes.  So after a fault, finalisation is
 * deferred to an atexit handler, registered when we initialised MPI: the
 * process returns from destroy at once and leaves MPI properly when it
 * exits (waiting there for the other processes, which under mpirun either
 * exit too or are killed by the launcher).  The same handler finalises
 * when a program exits without destroying its context.  MPI cannot be
 * initialised twice, so after a clean finalise a new world_init fails with
 * MPG_ERR_STATE; a program that creates contexts one after another should
 * call MPI_Init itself.
 *
 * Threads.  We serialise our own MPI calls with one process-wide lock
 * (never held while sleeping), so contexts may be used from several
 * threads.  A progress thread (see progress_main()) drives pending
 * operations while the caller computes; because the application may call
 * MPI at the same time, it runs only at MPI_THREAD_MULTIPLE, which we ask
 * for when we initialise MPI (MPI_THREAD_SERIALIZED with
 * MESHPG_MPI_PROGRESS=off). */
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <mpi.h>

#include "backend.h"

#define MPG_MPI_TAG 0x6d70 /* send/recv tag; below the guaranteed 32767 */
#define MPG_MPI_SPARES 4   /* staging buffers cached per communicator */
#define MPG_MPI_SPARE_MAX ((size_t)256 << 20) /* larger ones are not cached */
/* Large all-reduces are pipelined: cut into pieces of at most g_piece
 * bytes (4 MiB; MESHPG_MPI_PIECE_BYTES in tests), each all-reduced by our
 * own ring (see ring_post()), with at most MPG_MPI_WINDOW pieces in flight
 * per communicator.  Pieces are started from one FIFO per communicator,
 * so every member starts them in the same order whatever the timing. */
#define MPG_MPI_PIECE_DEFAULT ((size_t)4 << 20)
#define MPG_MPI_WINDOW 2
static size_t g_piece = MPG_MPI_PIECE_DEFAULT; /* MESHPG_MPI_PIECE_BYTES */

/* One piece of a pipelined all-reduce: elements [off, off + count) of its
 * request, all-reduced by our own ring over MPI point-to-point (see
 * ring_post()).  Its input is staged (widened, pre-multiplied) when the
 * piece starts and its result divided and copied out when it completes,
 * so that this work, too, runs piece by piece behind the communication. */
struct piece {
  struct mpg__req *q;    /* the request the piece belongs to */
  int slot;              /* its MPI requests: q->reqs[slot] (receive) and
                            q->reqs[slot + 1] (send) */
  size_t off;
  int count;
  int step;              /* ring step in flight, 0 .. 2 (size - 1) - 1 */
  int tag;
  int scratch;           /* its slot in the communicator's scratch */
  int busy;              /* a pump works on it without g_lock */
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
  struct piece *flight[MPG_MPI_WINDOW]; /* pieces posted, not seen done */
  int nflight;
  unsigned seq;        /* pieces started, for their tags */
  char *scratch;       /* MPG_MPI_WINDOW slots of scratch_slot bytes */
  size_t scratch_slot;
  int scratch_busy[MPG_MPI_WINDOW];
  struct mpg__comm *live_prev, *live_next; /* g_live, for the progress thread */
  struct mpg__req *pend;  /* pending requests */
};

enum finish_kind { FIN_NONE, FIN_COPY, FIN_NARROW };

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
  int busy_pieces;     /* its pieces a pump works on without g_lock */
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
  struct region *region; /* zero-copy: the mem_alloc region used */
  struct mpg__req *next; /* orphan list */
};

/* Process-wide state, guarded by g_lock. */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_we_initialized; /* we called MPI_Init_thread */
static int g_we_finalized;   /* ... and MPI_Finalize */
static int g_live_worlds;
static atomic_int g_faulted; /* an abort or timeout happened here */
static mpg__req *g_orphans;
static long g_chunk = INT_MAX; /* most elements per MPI call */
static struct region *g_regions; /* mem_alloc'ed memory */
static mpg__comm *g_live;      /* every communicator not destroyed */
static long g_pending_total;   /* sum of npending over g_live */

/* The progress thread (see progress_main()).  g_prog_mode is read from
 * MESHPG_MPI_PROGRESS at the first world_init; the thread runs while a
 * world exists. */
enum { PROG_THREAD, PROG_OFF };
static int g_prog_mode = PROG_THREAD;
static atomic_int g_prog_running; /* a thread was started and not joined */
static atomic_int g_prog_idle;    /* it has backed off: callers drive MPI */
static int g_prog_stop;        /* asks it to exit */
static pthread_t g_prog_thread;
static pthread_cond_t g_prog_cond = PTHREAD_COND_INITIALIZER;
/* Broadcast by the progress thread when a request's MPI part completes
 * (and on abort): waiters sleep on it instead of polling MPI. */
static pthread_cond_t g_done_cond = PTHREAD_COND_INITIALIZER;
/* Threads other than the progress thread waiting for g_lock: the progress
 * thread lets them in between its rounds (a mutex is not fair, and a
 * thread that unlocks and relocks at once would starve them). */
static atomic_int g_want;

static void lock_g(void) {
  atomic_fetch_add(&g_want, 1);
  pthread_mutex_lock(&g_lock);
  atomic_fetch_sub(&g_want, 1);
}

static int pump(mpg__comm *m);
static void progress_start(void);
static void progress_stop(void);

/* ------------------------------------------------------------------ */
/* Helpers                                                             */
/* ------------------------------------------------------------------ */

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
      k = snprintf(buf, n, "broadcast (root %d, dtype %s, count %zu)", peer,
                   mpg_dtype_name(dt), count);
      break;
    case MPG__SEND:
    case MPG__RECV:
      k = snprintf(buf, n, "%s (peer %d, dtype %s, count %zu)", mpg__kind_name(kind),
                   peer, mpg_dtype_name(dt), count);
      break;
    case MPG__ALL_GATHER:
      k = snprintf(buf, n, "all_gather (dtype %s, count %zu per member)",
                   mpg_dtype_name(dt), count);
      break;
  }
  if (k < 0 || (size_t)k >= n) return;
  snprintf(buf + k, n - (size_t)k, " on a group of size %d (rank %d)", size,
           rank);
}

static void req_describe(const mpg__req *q, char *buf, size_t n) {
  describe(buf, n, q->kind, q->dtype, q->op, q->count, q->peer, q->size,
           q->rank);
}

static mpg_status mpi_fail(int rc, const char *call, const char *what) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS)
    snprintf(text, sizeof text, "MPI error code %d", rc);
  return mpg__fail(MPG_ERR_BACKEND, "%s failed for %s: %s", call, what, text);
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

/* Pacing of a polling loop.  Open MPI moves data only while some thread
 * is inside MPI (a large message is a stream of small fragments, each
 * needing both sides to poll), so sleeping between polls throttles every
 * transfer: with 1 ms sleeps a 16 MiB all_reduce over shared memory runs
 * ten times slower than with back-to-back polls.  A waiter therefore
 * polls continuously (yielding the CPU each time) for a spin window that
 * grows with the operation's size, and only then, when a peer is
 * evidently late, backs off with sleeps growing from 1 us to 1 ms, to stop
 * burning a core while it waits out the timeout. */
#define MPG_MPI_SPIN_S 1.0            /* spin window of any wait ... */
#define MPG_MPI_SPIN_S_PER_BYTE 4e-9  /* ... plus 4 s per GB moved */

typedef struct poller {
  double start, spin_s;
  unsigned sleeps;
} poller;

static void poller_init(poller *p, size_t bytes) {
  p->start = mpg__now();
  p->spin_s = MPG_MPI_SPIN_S + (double)bytes * MPG_MPI_SPIN_S_PER_BYTE;
  p->sleeps = 0;
}

static void poller_pause(poller *p) {
  if (mpg__now() - p->start < p->spin_s) {
    sched_yield();
    return;
  }
  unsigned k = p->sleeps < 10 ? p->sleeps++ : 10;
  long ns = 1000L << k; /* 1 us, 2 us, ... 1 ms */
  if (ns > 1000000L) ns = 1000000L;
  struct timespec ts = {0, ns};
  nanosleep(&ts, NULL);
}

/* ------------------------------------------------------------------ */
/* Orphans and finalisation                                            */
/* ------------------------------------------------------------------ */

/* The region holding [p, p + bytes), or NULL.  Lock held. */
static struct region *region_find(const void *p, size_t bytes) {
  const char *c = p;
  for (struct region *r = g_regions; r; r = r->next)
    if (c >= r->base && (size_t)(c - r->base) <= r->len &&
        bytes <= r->len - (size_t)(c - r->base))
      return r;
  return NULL;
}

/* Unlink and free a region.  Lock held. */
static void region_drop(struct region *r) {
  for (struct region **pp = &g_regions; *pp; pp = &(*pp)->next)
    if (*pp == r) {
      *pp = r->next;
      break;
    }
  free(r->base);
  free(r);
}

/* A request stops using its region.  Lock held. */
static void region_unref(struct region *r) {
  if (--r->busy == 0 && r->freed) region_drop(r);
}

static void req_release(mpg__req *q) {
  if (q->region) region_unref(q->region);
  if (q->reqs != &q->one) free(q->reqs);
  free(q->stage);
  free(q);
}

/* Test every orphan once and free those that completed.  Lock held. */
static void sweep_orphans(void) {
  if (g_we_finalized) return;
  mpg__req **pp = &g_orphans;
  while (*pp) {
    mpg__req *q = *pp;
    int flag = 0;
    if (!q->dead) {
      int rc = MPI_Testall(q->nreq, q->reqs, &flag, MPI_STATUSES_IGNORE);
      if (rc != MPI_SUCCESS) q->dead = 1; /* keep its memory: MPI may own it */
    }
    if (flag) {
      *pp = q->next;
      req_release(q);
    } else {
      pp = &q->next;
    }
  }
}

/* After MPI_Finalize nothing can touch the orphans' memory.  Lock held. */
static void free_orphans(void) {
  while (g_orphans) {
    mpg__req *q = g_orphans;
    g_orphans = q->next;
    req_release(q);
  }
}

static void finalize_locked(void) {
  if (!g_we_initialized || g_we_finalized) return;
  int fin = 0;
  MPI_Finalized(&fin);
  if (!fin) MPI_Finalize();
  g_we_finalized = 1;
  free_orphans();
  mpg__log(1, "mpi: MPI finalized");
}

/* Registered when we initialise MPI: leaves MPI properly at exit after a
 * fault (see the top of the file) or when a context was never destroyed. */
static void finalize_at_exit(void) {
  progress_stop();
  lock_g();
  finalize_locked();
  pthread_mutex_unlock(&g_lock);
}

/* ------------------------------------------------------------------ */
/* Communicators                                                       */
/* ------------------------------------------------------------------ */

static mpg_status comm_wrap(MPI_Comm c, double timeout_s, int is_world,
                            mpg__comm **out) {
  mpg__comm *m = calloc(1, sizeof *m);
  if (!m) return mpg__fail(MPG_ERR_NOMEM, "mpi: out of memory for a communicator");
  m->comm = c;
  MPI_Comm_rank(c, &m->rank);
  MPI_Comm_size(c, &m->size);
  m->timeout_s = timeout_s;
  m->is_world = is_world;
  atomic_init(&m->aborted, MPG_OK);
  m->refs = 1;
  m->live_next = g_live;
  if (g_live) g_live->live_prev = m;
  g_live = m;
  *out = m;
  return MPG_OK;
}

/* Drop one reference; free the struct at zero.  Lock held. */
static void comm_unref(mpg__comm *m) {
  if (--m->refs == 0) free(m);
}

/* Take m off g_live (at destroy).  Lock held. */
static void comm_unlink(mpg__comm *m) {
  g_pending_total -= m->npending;
  if (m->live_prev) m->live_prev->live_next = m->live_next;
  else if (g_live == m) g_live = m->live_next;
  if (m->live_next) m->live_next->live_prev = m->live_prev;
  m->live_prev = m->live_next = NULL;
}

/* Count one more (+1) or one fewer (-1) unfinished request on m; wakes
 * the progress thread when work appears.  Lock held. */
static void pending_add(mpg__comm *m, int d) {
  m->npending += d;
  if (m->destroyed) return; /* already off g_live */
  g_pending_total += d;
  if (d > 0 && g_pending_total == d) pthread_cond_signal(&g_prog_cond);
}

/* q becomes pending on m (m->pend, for the progress thread), or stops
 * being pending.  Lock held. */
static void pend_link(mpg__comm *m, mpg__req *q) {
  q->pend_prev = NULL;
  q->pend_next = m->pend;
  if (m->pend) m->pend->pend_prev = q;
  m->pend = q;
  pending_add(m, 1);
  pthread_cond_signal(&g_prog_cond); /* new work for the progress thread */
}

static void pend_unlink(mpg__comm *m, mpg__req *q) {
  if (q->pend_prev) q->pend_prev->pend_next = q->pend_next;
  else m->pend = q->pend_next;
  if (q->pend_next) q->pend_next->pend_prev = q->pend_prev;
  q->pend_prev = q->pend_next = NULL;
  pending_add(m, -1);
}

/* Poll one MPI request until done, `deadline`, or an abort of `m` (may be
 * NULL).  Takes the lock for each test.  Returns MPI_SUCCESS with *state
 * 0 (done), 1 (deadline), 2 (aborted), or an MPI error. */
static int poll_request(MPI_Request *r, double deadline, mpg__comm *m,
                        int *state) {
  poller pl;
  poller_init(&pl, 0);
  for (;;) {
    if (m && atomic_load(&m->aborted)) {
      *state = 2;
      return MPI_SUCCESS;
    }
    int flag = 0;
    lock_g();
    int rc = MPI_Test(r, &flag, MPI_STATUS_IGNORE);
    pthread_mutex_unlock(&g_lock);
    if (rc != MPI_SUCCESS) return rc;
    if (flag) {
      *state = 0;
      return MPI_SUCCESS;
    }
    if (mpg__now() >= deadline) {
      *state = 1;
      return MPI_SUCCESS;
    }
    poller_pause(&pl);
  }
}

/* Park a bare pending MPI request (and memory MPI may still write) on the
 * orphan list; with until_finalize, just the memory, until MPI_Finalize.
 * Lock held. */
static void orphan_request(MPI_Request r, void *mem, int until_finalize) {
  mpg__req *q = calloc(1, sizeof *q);
  if (!q) return; /* cannot track it: leak r and mem deliberately */
  q->one = r;
  q->reqs = &q->one;
  q->nreq = 1;
  q->stage = mem;
  q->dead = until_finalize; /* never tested: freed after MPI_Finalize */
  q->next = g_orphans;
  g_orphans = q;
}

/* Bounded rendezvous of every rank of `c` before a blocking MPI call that
 * creates a communicator (MPI_Comm_dup, MPI_Comm_split).
 *
 * Phase 1 is an MPI_Ibarrier polled until `deadline`.  It is not enough on
 * its own: a rank that gives up leaves its barrier posted, so a peer that
 * arrives later still completes phase 1 and would then block forever in
 * the creation call that the others never enter.  Phase 2 is a second
 * MPI_Ibarrier, entered only by ranks that completed phase 1 in time and
 * polled for a fresh `timeout`: a late rank whose peers gave up stalls
 * there and times out instead of hanging.  Passing phase 2 means every
 * rank completed phase 1 and is now (within one poll) in phase 2, so all
 * of them will enter the creation call.  (A peer could still give up in
 * phase 2 only if its poll were delayed by more than `timeout`.)
 *
 * Nonblocking creation (MPI_Comm_idup) would avoid the blocking call, but
 * Open MPI 4.1 crashes in MPI_Finalize when an abandoned idup is still
 * pending, whereas abandoned barriers are harmless there.
 *
 * Returns MPI_SUCCESS with *state 0 (every rank arrived), 1 (timeout) or
 * 2 (m was aborted), or an MPI error; a pending barrier is orphaned. */
static int rendezvous(MPI_Comm c, mpg__comm *m, double deadline,
                      double timeout, int *state) {
  for (int phase = 0; phase < 2; phase++) {
    MPI_Request r = MPI_REQUEST_NULL;
    lock_g();
    int rc = MPI_Ibarrier(c, &r);
    pthread_mutex_unlock(&g_lock);
    if (rc != MPI_SUCCESS) return rc;
    if (phase == 1) deadline = mpg__now() + timeout;
    rc = poll_request(&r, deadline, m, state);
    if (rc != MPI_SUCCESS || *state != 0) {
      atomic_store(&g_faulted, 1);
      lock_g();
      orphan_request(r, NULL, 0);
      if (m) m->norphans++;
      pthread_mutex_unlock(&g_lock);
      return rc;
    }
  }
  return MPI_SUCCESS;
}

static mpg_status world_init(const mpg__world_args *args, mpg__comm **world) {
  *world = NULL;
  double timeout = args->timeout_s > 0 ? args->timeout_s : 600.0;
  int init = 0, fin = 0;

  /* MESHPG_MPI_PROGRESS: thread (default) or off. */
  const char *prog = getenv("MESHPG_MPI_PROGRESS");
  if (prog && *prog) {
    if (strcmp(prog, "thread") == 0 || strcmp(prog, "on") == 0 ||
        strcmp(prog, "1") == 0)
      g_prog_mode = PROG_THREAD;
    else if (strcmp(prog, "off") == 0 || strcmp(prog, "0") == 0)
      g_prog_mode = PROG_OFF;
    else
      return mpg__fail(MPG_ERR_ENV, "MESHPG_MPI_PROGRESS=\"%s\": expected "
                       "\"thread\" or \"off\"", prog);
  }

  lock_g();
  MPI_Finalized(&fin);
  if (fin) {
    pthread_mutex_unlock(&g_lock);
    return mpg__fail(MPG_ERR_STATE,
                     "mpi: MPI was already finalized%s and cannot be "
                     "initialised again in this process; to create several "
                     "contexts one after another, call MPI_Init yourself",
                     g_we_finalized ? " (by meshpg when the last context was "
                                      "destroyed)" : "");
  }
  MPI_Initialized(&init);
  if (!init) {
    int provided = MPI_THREAD_SINGLE;
    /* The progress thread needs MPI_THREAD_MULTIPLE (see progress_main). */
    int want = g_prog_mode == PROG_THREAD ? MPI_THREAD_MULTIPLE
                                          : MPI_THREAD_SERIALIZED;
    int rc = MPI_Init_thread(NULL, NULL, want, &provided);
    if (rc != MPI_SUCCESS) {
      pthread_mutex_unlock(&g_lock);
      return mpi_fail(rc, "MPI_Init_thread", "the world");
    }
    g_we_initialized = 1;
    atexit(finalize_at_exit);
    if (provided < MPI_THREAD_SERIALIZED)
      mpg__log(1, "mpi: MPI gave thread level %d, below MPI_THREAD_SERIALIZED; "
               "call meshpg from one thread only", provided);
  } else {
    int provided = MPI_THREAD_SINGLE;
    MPI_Query_thread(&provided);
    if (provided < MPI_THREAD_SERIALIZED)
      mpg__log(1, "mpi: the application initialised MPI at thread level %d "
               "(below MPI_THREAD_SERIALIZED); call meshpg from the thread "
               "that calls MPI only", provided);
  }

  /* Test hook: a small chunk size exercises the > INT_MAX paths. */
  const char *chunk = getenv("MESHPG_MPI_MAX_COUNT");
  long ck = chunk ? atol(chunk) : 0;
  g_chunk = ck > 0 && ck <= INT_MAX ? ck : INT_MAX;
  /* Test hook: a small piece size pipelines small all-reduces too. */
  const char *piece = getenv("MESHPG_MPI_PIECE_BYTES");
  long pb = piece ? atol(piece) : 0;
  g_piece = pb >= 8 ? (size_t)pb : MPG_MPI_PIECE_DEFAULT;

  MPI_Comm base = args->mpi_comm ? *(MPI_Comm *)args->mpi_comm : MPI_COMM_WORLD;
  int rank = -1, size = -1;
  int rc = MPI_Comm_rank(base, &rank);
  if (rc == MPI_SUCCESS) rc = MPI_Comm_size(base, &size);
  if (rc != MPI_SUCCESS) {
    pthread_mutex_unlock(&g_lock);
    return mpi_fail(rc, "MPI_Comm_rank/MPI_Comm_size", "the world communicator");
  }
  const char *which = args->mpi_comm ? "the communicator in opts.mpi_comm"
                                     : "MPI_COMM_WORLD";
  if (rank != args->rank || size != args->world_size) {
    pthread_mutex_unlock(&g_lock);
    return mpg__fail(MPG_ERR_ENV,
                     "mpi: %s has rank %d of %d but meshpg was told rank %d of "
                     "%d (from opts or the launch environment); pass "
                     "opts.rank and opts.world_size to match MPI",
                     which, rank, size, args->rank, args->world_size);
  }
  pthread_mutex_unlock(&g_lock);

  /* Every rank must arrive within the timeout, counted from here: our
   * MPI_Init_thread may have taken long, and the peers' may take as long
   * again.  Then the dup cannot hang. */
  int state = 0;
  rc = rendezvous(base, NULL, mpg__now() + timeout, timeout, &state);
  if (rc != MPI_SUCCESS) return mpi_fail(rc, "MPI_Ibarrier", which);
  if (state != 0)
    return mpg__fail(MPG_ERR_TIMEOUT,
                     "mpi: joining the world (rank %d of %d): not every rank "
                     "arrived within the %.3g s timeout",
                     rank, size, timeout);
  MPI_Comm c = MPI_COMM_NULL;
  lock_g();
  rc = MPI_Comm_dup(base, &c);
  if (rc != MPI_SUCCESS) {
    pthread_mutex_unlock(&g_lock);
    return mpi_fail(rc, "MPI_Comm_dup", which);
  }
  MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN);
  mpg_status st = comm_wrap(c, timeout, 1, world);
  if (st) {
    MPI_Comm_free(&c);
  } else {
    g_live_worlds++;
    MPI_Comm_set_name(c, "meshpg world");
    progress_start();
  }
  pthread_mutex_unlock(&g_lock);
  if (!st)
    mpg__log(2, "mpi: rank %d of %d joined (%s, at most %ld elements per MPI "
             "call)", rank, size, which, g_chunk);
  return st;
}

static mpg_status split(mpg__comm *parent, int color, int key,
                        mpg__comm **out) {
  *out = NULL;
  mpg_status why = atomic_load(&parent->aborted);
  if (why)
    return mpg__fail(why, "mpi: split of a group of size %d (rank %d): the "
                     "communicator was aborted", parent->size, parent->rank);
  double deadline = mpg__now() + parent->timeout_s;

  /* 1. Bounded rendezvous: every parent rank must reach the split. */
  int state = 0;
  int rc = rendezvous(parent->comm, parent, deadline, parent->timeout_s, &state);
  if (rc != MPI_SUCCESS || state != 0) {
    /* A barrier stays pending on the parent, which can no longer match
     * its peers' calls: mark it aborted. */
    mpg_status reason = state == 2 ? (mpg_status)atomic_load(&parent->aborted)
                                   : MPG_ERR_TIMEOUT;
    int expected = MPG_OK;
    atomic_compare_exchange_strong(&parent->aborted, &expected, (int)reason);
    if (rc != MPI_SUCCESS) return mpi_fail(rc, "MPI_Ibarrier", "the split rendezvous");
    if (state == 2)
      return mpg__fail(reason, "mpi: split of a group of size %d (rank %d) into "
                       "colour %d: aborted while waiting for peers",
                       parent->size, parent->rank, color);
    return mpg__fail(MPG_ERR_TIMEOUT,
                     "mpi: split of a group of size %d (rank %d) into colour "
                     "%d: not every rank arrived within the %.3g s timeout",
                     parent->size, parent->rank, color, parent->timeout_s);
  }

  /* 2. Every rank has arrived; the blocking split completes promptly. */
  MPI_Comm c = MPI_COMM_NULL;
  lock_g();
  rc = MPI_Comm_split(parent->comm, color < 0 ? MPI_UNDEFINED : color, key, &c);
  mpg_status st = MPG_OK;
  if (rc != MPI_SUCCESS) {
    char what[128];
    snprintf(what, sizeof what, "colour %d, key %d of a group of size %d (rank %d)",
             color, key, parent->size, parent->rank);
    st = mpi_fail(rc, "MPI_Comm_split", what);
  } else if (c != MPI_COMM_NULL) {
    MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN);
    st = comm_wrap(c, parent->timeout_s, 0, out);
    if (st) MPI_Comm_free(&c);
  }
  pthread_mutex_unlock(&g_lock);
  if (!st && *out)
    mpg__log(2, "mpi: split colour %d key %d -> rank %d of %d", color, key,
             (*out)->rank, (*out)->size);
  return st;
}

static void comm_abort(mpg__comm *m, mpg_status reason) {
  if (!m) return;
  int expected = MPG_OK;
  int why = reason == MPG_ERR_TIMEOUT ? MPG_ERR_TIMEOUT : MPG_ERR_ABORTED;
  atomic_compare_exchange_strong(&m->aborted, &expected, why);
  atomic_store(&g_faulted, 1);
  pthread_cond_broadcast(&g_done_cond); /* waiters look at the flag */
}

static mpg_status comm_destroy(mpg__comm *m) {
  if (!m) return MPG_OK;
  mpg_status st = MPG_OK;
  lock_g();
  int last = m->is_world && g_live_worlds == 1;
  pthread_mutex_unlock(&g_lock);
  if (last) progress_stop(); /* before MPI_Finalize, and not needed now */
  lock_g();
  comm_unlink(m);
  sweep_orphans();
  int fin = 0;
  MPI_Finalized(&fin);
  if (!fin && !atomic_load(&m->aborted) && m->npending == 0 &&
      m->norphans == 0) {
    int rc = MPI_Comm_free(&m->comm);
    if (rc != MPI_SUCCESS) st = mpi_fail(rc, "MPI_Comm_free", "a group");
  }
  /* else: leave the handle to MPI_Finalize (see the top of the file). */
  if (m->is_world && --g_live_worlds == 0 && g_we_initialized) {
    if (atomic_load(&g_faulted))
      mpg__log(1, "mpi: after an abort MPI_Finalize is deferred to exit");
    else
      finalize_locked();
  }
  m->destroyed = 1;
  if (m->scratch) {
    /* An abandoned piece's receive may still land in it: then it lives
     * until MPI is finalised. */
    int safe = !atomic_load(&m->aborted) && m->npending == 0 && m->norphans == 0;
    if (safe || g_we_finalized)
      free(m->scratch);
    else
      orphan_request(MPI_REQUEST_NULL, m->scratch, 1);
    m->scratch = NULL;
  }
  for (int i = 0; i < MPG_MPI_SPARES; i++) {
    free(m->spare[i]);
    m->spare[i] = NULL;
  }
  comm_unref(m);
  pthread_mutex_unlock(&g_lock);
  return st;
}

/* ------------------------------------------------------------------ */
/* Operations                                                          */
/* ------------------------------------------------------------------ */

/* Post chunked contiguous operations.  Lock held.  Each appends requests
 * to q->reqs[q->nreq++]. */
static int post_allreduce(mpg__req *q, MPI_Comm c, void *buf, size_t n,
                          size_t es, MPI_Datatype t, MPI_Op op) {
  for (size_t off = 0; off < n || (n == 0 && off == 0); off += (size_t)g_chunk) {
    int k = (int)(n - off < (size_t)g_chunk ? n - off : (size_t)g_chunk);
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
  for (size_t off = 0; off < n || (n == 0 && off == 0); off += (size_t)g_chunk) {
    int k = (int)(n - off < (size_t)g_chunk ? n - off : (size_t)g_chunk);
    int rc = MPI_Ibcast((char *)buf + off * es, k, t, root, c, &q->reqs[q->nreq]);
    if (rc != MPI_SUCCESS) return rc;
    q->nreq++;
    if (n == 0) break;
  }
  return MPI_SUCCESS;
}

static int post_p2p(mpg__req *q, MPI_Comm c, int is_send, const void *buf,
                    size_t n, size_t es, MPI_Datatype t, int peer) {
  for (size_t off = 0; off < n || (n == 0 && off == 0); off += (size_t)g_chunk) {
    int k = (int)(n - off < (size_t)g_chunk ? n - off : (size_t)g_chunk);
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
  if (n <= (size_t)g_chunk) {
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
  if (n <= (size_t)g_chunk) {
    int rc = MPI_Ireduce_scatter_block(in, out, (int)n, t, op, m->comm,
                                       &q->reqs[q->nreq]);
    if (rc == MPI_SUCCESS) q->nreq++;
    return rc;
  }
  for (int p = 0; p < m->size; p++) {
    const char *blk = (const char *)in + (size_t)p * n * es;
    for (size_t off = 0; off < n; off += (size_t)g_chunk) {
      int k = (int)(n - off < (size_t)g_chunk ? n - off : (size_t)g_chunk);
      int rc = MPI_Ireduce(blk + off * es, (char *)out + off * es, k, t, op, p,
                           m->comm, &q->reqs[q->nreq]);
      if (rc != MPI_SUCCESS) return rc;
      q->nreq++;
    }
  }
  return MPI_SUCCESS;
}

static size_t nchunks(size_t n) {
  return n <= (size_t)g_chunk ? 1 : (n + (size_t)g_chunk - 1) / (size_t)g_chunk;
}

/* The ring.  A piece's count elements are cut into size chunks (chunk i
 * is [count * i / size, count * (i + 1) / size)).  Reduce-scatter: at step
 * s (0 .. size - 2) rank r sends chunk r - s to its right neighbour and
 * receives chunk r - s - 1 from its left one into scratch, then reduces it
 * into its own copy; after size - 1 steps it holds chunk r + 1 fully
 * reduced.  All-gather: at step t it sends chunk r + 1 - t and receives
 * chunk r - t straight into place (indices mod size).  Every message is
 * an MPI_Isend / MPI_Irecv pair on the piece's tag (distinct for the
 * pieces in flight together; messages between two ranks on one tag
 * arrive in order, so consecutive steps cannot be confused).  Each rank
 * moves 2 (size - 1) / size of the piece each way, the bandwidth-optimal
 * all-reduce, and no memory is allocated per operation: Open MPI's own
 * nonblocking all-reduce allocates a message-sized temporary every call,
 * which with glibc's trim thresholds faults in fresh pages step after
 * step. */
#define MPG_MPI_RING_TAG 1024 /* .. + 63; below the guaranteed 32767 */

static size_t chunk_start(const struct piece *pc, int size, int i) {
  return (size_t)pc->count * (size_t)i / (size_t)size;
}

/* Post the MPI calls of pc's current step.  Lock held. */
static int ring_post(mpg__comm *m, struct piece *pc) {
  mpg__req *q = pc->q;
  int p = m->size, r = m->rank;
  int right = (r + 1) % p, left = (r + p - 1) % p;
  size_t ws = mpg__dtype_size(q->work_dtype);
  char *w = q->wire + pc->off * ws;
  int s = pc->step, send_i, recv_i;
  char *into;
  if (s < p - 1) { /* reduce-scatter */
    send_i = ((r - s) % p + p) % p;
    recv_i = ((r - s - 1) % p + p) % p;
    into = m->scratch + (size_t)pc->scratch * m->scratch_slot;
  } else {         /* all-gather */
    int t = s - (p - 1);
    send_i = ((r + 1 - t) % p + p) % p;
    recv_i = ((r - t) % p + p) % p;
    into = w + chunk_start(pc, p, recv_i) * ws;
  }
  size_t s0 = chunk_start(pc, p, send_i), s1 = chunk_start(pc, p, send_i + 1);
  size_t r0 = chunk_start(pc, p, recv_i), r1 = chunk_start(pc, p, recv_i + 1);
  int rc = MPI_Irecv(into, (int)(r1 - r0), q->mtype, left, pc->tag, m->comm,
                     &q->reqs[pc->slot]);
  if (rc == MPI_SUCCESS)
    rc = MPI_Isend(w + s0 * ws, (int)(s1 - s0), q->mtype, right, pc->tag,
                   m->comm, &q->reqs[pc->slot + 1]);
  return rc;
}

/* pc's current step completed: reduce what it received.  Lock held. */
static void ring_reduce(mpg__comm *m, struct piece *pc) {
  int p = m->size, r = m->rank, s = pc->step;
  if (s >= p - 1) return;
  mpg__req *q = pc->q;
  size_t ws = mpg__dtype_size(q->work_dtype);
  int recv_i = ((r - s - 1) % p + p) % p;
  size_t r0 = chunk_start(pc, p, recv_i), r1 = chunk_start(pc, p, recv_i + 1);
  mpg__reduce_into(q->work_dtype, q->rop, q->wire + (pc->off + r0) * ws,
                   m->scratch + (size_t)pc->scratch * m->scratch_slot, r1 - r0);
}

/* Stage piece pc's input and post its first step.  Lock held. */
static int piece_start(mpg__comm *m, struct piece *pc) {
  mpg__req *q = pc->q;
  size_t es = mpg__dtype_size(q->dtype);
  size_t ws = mpg__dtype_size(q->work_dtype);
  char *w = q->wire + pc->off * ws;
  size_t n = (size_t)pc->count;
  if (q->piece_fin == FIN_NARROW)
    mpg__half_widen(q->dtype, q->src + pc->off * es, (float *)w, n);
  else if (q->src != q->wire)
    memcpy(w, q->src + pc->off * es, n * es);
  if (q->premul != 0) mpg__scale(q->work_dtype, w, n, q->premul);
  pc->step = 0;
  pc->tag = MPG_MPI_RING_TAG + (int)(m->seq++ & 63u);
  return ring_post(m, pc);
}

/* Piece pc completed: divide it, then copy or narrow it out.  Lock held. */
static void piece_done(struct piece *pc) {
  mpg__req *q = pc->q;
  size_t es = mpg__dtype_size(q->dtype);
  size_t ws = mpg__dtype_size(q->work_dtype);
  char *w = q->wire + pc->off * ws;
  size_t n = (size_t)pc->count;
  char *dst = (char *)q->dst + pc->off * es;
  if (q->piece_div) mpg__divide(q->work_dtype, w, n, q->piece_div);
  if (q->piece_fin == FIN_NARROW)
    mpg__half_narrow(q->dtype, (const float *)w, dst, n);
  else if (dst != w)
    memcpy(dst, w, n * es);
}

/* The scratch of m: MPG_MPI_WINDOW slots, each one chunk of the largest
 * piece.  Lock held. */
static int scratch_ready(mpg__comm *m) {
  if (m->scratch) return 1;
  size_t slot = (g_piece / (size_t)m->size + 64 + 63) & ~(size_t)63;
  m->scratch = malloc(slot * MPG_MPI_WINDOW);
  if (!m->scratch) return 0;
  m->scratch_slot = slot;
  return 1;
}

/* Advance every piece in flight by as many steps as have completed, and
 * start queued ones up to the window.  Lock held on entry and exit, but
 * released around the arithmetic of a completed step (the reduction of
 * a received chunk; the divide and copy-out of a finished piece), which
 * takes up to milliseconds per call: holding g_lock meanwhile would stall
 * every other MPI call of the process, a trainer's mark_ready included.
 * The piece is marked busy meanwhile: other pumps skip it, purge() leaves
 * it to this pump (dropped), and orphan() waits for it, so the memory it
 * works on stays valid.  Called from every test of a request of this
 * communicator and by the progress thread. */
static int pump(mpg__comm *m) {
  int moved = 0;
  int last = 2 * (m->size - 1);
  for (int i = 0; i < m->nflight;) {
    struct piece *pc = m->flight[i];
    mpg__req *q = pc->q;
    if (pc->busy) {
      i++;
      continue;
    }
    int flag = 0, gone = 0;
    int rc = MPI_Testall(2, &q->reqs[pc->slot], &flag, MPI_STATUSES_IGNORE);
    if (rc == MPI_SUCCESS && !flag) {
      i++;
      continue;
    }
    if (rc == MPI_SUCCESS) {
      moved++;
      if (atomic_load(&m->aborted)) {
        gone = 1;
      } else {
        int final = pc->step + 1 == last;
        pc->busy = 1;
        q->busy_pieces++;
        pthread_mutex_unlock(&g_lock);
        ring_reduce(m, pc);
        if (final) piece_done(pc);
        pthread_mutex_lock(&g_lock);
        pc->busy = 0;
        q->busy_pieces--;
        if (pc->dropped) { /* purged meanwhile: no longer in flight */
          free(pc);
          i = 0; /* the array may have changed: scan again */
          continue;
        }
        pc->step++;
        if (final)
          gone = 1;
        else
          rc = ring_post(m, pc);
        for (i = 0; m->flight[i] != pc; i++) {
        } /* it is still in flight: find it again */
      }
    }
    if (rc != MPI_SUCCESS && !q->pipe_rc) q->pipe_rc = rc;
    if (gone || rc != MPI_SUCCESS) {
      q->inflight--;
      m->scratch_busy[pc->scratch] = 0;
      m->flight[i] = m->flight[--m->nflight];
      free(pc);
    } else {
      i++;
    }
  }
  while (m->nflight < MPG_MPI_WINDOW && m->queue && !atomic_load(&m->aborted)) {
    struct piece *pc = m->queue;
    if (!scratch_ready(m)) {
      if (!pc->q->pipe_rc) pc->q->pipe_rc = MPI_ERR_NO_MEM;
      break;
    }
    int k = 0;
    while (k < MPG_MPI_WINDOW && m->scratch_busy[k]) k++;
    if (k == MPG_MPI_WINDOW) break; /* slots held by abandoned pieces */
    m->queue = pc->next;
    if (!m->queue) m->queue_tail = NULL;
    pc->q->unposted--;
    moved++;
    pc->scratch = k;
    int rc = piece_start(m, pc);
    if (rc != MPI_SUCCESS) {
      if (!pc->q->pipe_rc) pc->q->pipe_rc = rc;
      free(pc);
      continue;
    }
    m->scratch_busy[k] = 1;
    pc->q->inflight++;
    m->flight[m->nflight++] = pc;
  }
  return moved;
}

/* Forget every piece of q (queued or in flight; MPI keeps running the
 * posted ones, tracked by q->reqs).  Lock held. */
static void purge(mpg__comm *m, mpg__req *q) {
  if (!m) return;
  for (int i = 0; i < m->nflight;) {
    if (m->flight[i]->q == q) {
      q->inflight--;
      /* Its MPI requests live on in q->reqs; a receive may still land in
       * the scratch slot, which is therefore never reused.  A busy piece
       * is freed by the pump working on it. */
      if (m->flight[i]->busy)
        m->flight[i]->dropped = 1;
      else
        free(m->flight[i]);
      m->flight[i] = m->flight[--m->nflight];
    } else {
      i++;
    }
  }
  struct piece **pp = &m->queue;
  m->queue_tail = NULL;
  while (*pp) {
    if ((*pp)->q == q) {
      struct piece *dead = *pp;
      *pp = dead->next;
      free(dead);
      q->unposted--;
    } else {
      m->queue_tail = *pp;
      pp = &(*pp)->next;
    }
  }
}

/* Queue q's all-reduce (q->count elements; wire element size ws) as
 * pieces.  Lock held. */
static int queue_allreduce(mpg__req *q, mpg__comm *m, size_t ws) {
  size_t n = q->count;
  size_t per = g_piece / ws;
  if (per > (size_t)g_chunk) per = (size_t)g_chunk;
  for (size_t off = 0; off < n; off += per) {
    struct piece *pc = calloc(1, sizeof *pc);
    if (!pc) return MPI_ERR_NO_MEM;
    pc->q = q;
    pc->slot = q->nreq;
    pc->off = off;
    pc->count = (int)(n - off < per ? n - off : per);
    q->reqs[q->nreq++] = MPI_REQUEST_NULL;
    q->reqs[q->nreq++] = MPI_REQUEST_NULL;
    q->unposted++;
    if (m->queue_tail)
      m->queue_tail->next = pc;
    else
      m->queue = pc;
    m->queue_tail = pc;
  }
  /* The progress thread starts the pieces (it was signalled); without
   * one, start them now. */
  if (!atomic_load(&g_prog_running)) pump(m);
  return q->pipe_rc;
}

static int pipelined(size_t n, size_t es) { return n * es > g_piece; }

static size_t npieces(size_t n, size_t es) {
  size_t per = g_piece / es;
  if (per > (size_t)g_chunk) per = (size_t)g_chunk;
  return (n + per - 1) / per;
}

/* Orphan a request that cannot be released yet.  Lock held. */
static void orphan(mpg__req *q) {
  /* A pump may be writing q's buffers without the lock (see pump()); the
   * caller may free them as soon as we return: wait for it. */
  while (q->busy_pieces > 0) {
    pthread_mutex_unlock(&g_lock);
    sched_yield();
    pthread_mutex_lock(&g_lock);
  }
  purge(q->comm, q);
  for (int i = 0; i < q->nreq; i++) {
    if (q->kind == MPG__RECV && q->reqs[i] != MPI_REQUEST_NULL)
      MPI_Cancel(&q->reqs[i]); /* legal for point-to-point only */
  }
  if (q->comm) {
    q->comm->norphans++;
    if (!q->finished) pend_unlink(q->comm, q);
    comm_unref(q->comm);
    q->comm = NULL;
  }
  q->next = g_orphans;
  g_orphans = q;
}

/* Staging memory, recycled per communicator.  Lock held. */
static void *stage_take(mpg__comm *m, size_t bytes, size_t *cap) {
  int best = -1;
  for (int i = 0; i < MPG_MPI_SPARES; i++)
    if (m->spare[i] && m->spare_len[i] >= bytes &&
        (best < 0 || m->spare_len[i] < m->spare_len[best]))
      best = i;
  if (best < 0) return NULL;
  void *p = m->spare[best];
  *cap = m->spare_len[best];
  m->spare[best] = NULL;
  return p;
}

static void stage_give(mpg__comm *m, void *p, size_t cap) {
  if (!p) return;
  if (m->destroyed || cap > MPG_MPI_SPARE_MAX) {
    free(p);
    return;
  }
  int slot = -1;
  for (int i = 0; i < MPG_MPI_SPARES && slot < 0; i++)
    if (!m->spare[i]) slot = i;
  if (slot < 0) { /* replace the smallest spare if this one is larger */
    slot = 0;
    for (int i = 1; i < MPG_MPI_SPARES; i++)
      if (m->spare_len[i] < m->spare_len[slot]) slot = i;
    if (m->spare_len[slot] >= cap) {
      free(p);
      return;
    }
    free(m->spare[slot]);
  }
  m->spare[slot] = p;
  m->spare_len[slot] = cap;
}

/* Fail a post with "mpi: <the operation>: <why>". */
static mpg_status post_fail(mpg_status st, const mpg__coll *c,
                            const mpg__comm *m, const char *why) {
  char what[256];
  describe(what, sizeof what, c->kind, c->dtype, c->op, c->count,
           c->kind == MPG__BROADCAST ? c->root : c->peer, m->size, m->rank);
  return mpg__fail(st, "mpi: %s: %s", what, why);
}

static mpg_status post(mpg__comm *m, const mpg__coll *c, mpg__req **out) {
  *out = NULL;
  int peer = c->kind == MPG__BROADCAST ? c->root : c->peer;
  mpg_status why = atomic_load(&m->aborted);
  if (why)
    return post_fail(why, c, m, why == MPG_ERR_TIMEOUT
                     ? "the communicator was aborted after a timeout"
                     : "the communicator was aborted");
  mpg_dtype dt = c->dtype;
  size_t es = mpg__dtype_size(dt);
  size_t n = c->count;
  int half = mpg__dtype_is_half(dt);
  int size = m->size, rank = m->rank;
  if (c->kind != MPG__BARRIER && es == 0)
    return post_fail(MPG_ERR_INVALID, c, m, "unknown dtype");
  /* The largest staging buffer, (size + 1) * n elements of up to 8 bytes,
   * must fit in size_t. */
  if (n > SIZE_MAX / 8 / ((size_t)size + 1))
    return post_fail(MPG_ERR_INVALID, c, m, "count too large for memory");
  if ((c->kind == MPG__SEND || c->kind == MPG__RECV) &&
      (peer < 0 || peer >= size || peer == rank))
    return post_fail(MPG_ERR_INVALID, c, m, "the peer is not another member");
  if (c->kind == MPG__BROADCAST && (peer < 0 || peer >= size))
    return post_fail(MPG_ERR_INVALID, c, m, "the root is not a member");

  mpg__req *q = calloc(1, sizeof *q);
  if (!q) return post_fail(MPG_ERR_NOMEM, c, m, "out of memory for a request");
  q->kind = c->kind;
  q->dtype = dt;
  q->op = c->op;
  q->count = n;
  q->peer = peer;
  q->size = size;
  q->rank = rank;
  q->work_dtype = dt;
  int gather_like = c->kind == MPG__ALL_GATHER || c->kind == MPG__REDUCE_SCATTER;
  size_t maxreq = gather_like && n > (size_t)g_chunk ? (size_t)size * nchunks(n)
                                                     : nchunks(n);
  size_t wire = half ? sizeof(float) : es; /* all-reduce element on the wire */
  if (c->kind == MPG__ALL_REDUCE && pipelined(n, wire)) maxreq = 2 * npieces(n, wire);
  q->reqs = &q->one;
  if (maxreq > 1 && !(q->reqs = malloc(maxreq * sizeof *q->reqs))) {
    free(q);
    return post_fail(MPG_ERR_NOMEM, c, m, "out of memory for the chunk requests");
  }

  /* Every buffer MPI sees is staging memory owned by the request (see the
   * top of the file), sized here in elements of the wire type. */
  int widen = half && (c->kind == MPG__ALL_REDUCE || c->kind == MPG__REDUCE_SCATTER);
  size_t ws = widen ? sizeof(float) : es; /* f16/bf16 reduce in f32 */
  size_t elems = 0;
  switch (c->kind) {
    case MPG__ALL_REDUCE: case MPG__BROADCAST: case MPG__SEND: case MPG__RECV:
      elems = n;
      break;
    case MPG__ALL_GATHER:
      elems = (size_t)size * n;
      break;
    case MPG__REDUCE_SCATTER:
      elems = ((size_t)size + 1) * n;
      break;
    case MPG__BARRIER:
      break;
  }
  size_t bytes = elems * ws;
  /* Zero-copy: an in-place all-reduce on memory from mem_alloc, which
   * this backend owns (see struct region). */
  int zc = 0;
  if (c->kind == MPG__ALL_REDUCE && !widen && c->send == c->recv && n > 0) {
    lock_g();
    struct region *r = g_we_finalized ? NULL : region_find(c->recv, n * es);
    if (r && !r->freed) {
      r->busy++;
      q->region = r;
      zc = 1;
    }
    pthread_mutex_unlock(&g_lock);
  }
  if (bytes && !zc) {
    lock_g();
    q->stage = stage_take(m, bytes, &q->stage_cap);
    pthread_mutex_unlock(&g_lock);
    if (!q->stage) {
      q->stage = malloc(bytes);
      q->stage_cap = bytes;
    }
    if (!q->stage) {
      req_release(q);
      char why_nomem[64];
      snprintf(why_nomem, sizeof why_nomem, "out of memory for %zu staging bytes",
               bytes);
      return post_fail(MPG_ERR_NOMEM, c, m, why_nomem);
    }
  }

  /* Copy in; describe the completion step.  An empty operation still
   * hands MPI a valid (unused) pointer. */
  static char empty[8];
  char *st = zc ? (char *)c->recv : q->stage ? (char *)q->stage : empty;
  MPI_Datatype t = widen ? MPI_FLOAT : mpi_type(dt);
  MPI_Op op = mpi_op(c->op);
  mpg_dtype wdt = widen ? MPG_F32 : dt;
  int premul = c->op == MPG_OP_PREMUL_SUM;
  int pipe = c->kind == MPG__ALL_REDUCE && pipelined(n, ws);
  q->work_dtype = wdt;
  q->fin = zc ? FIN_NONE : widen ? FIN_NARROW : FIN_COPY;
  q->dst = c->recv;
  q->nfin = n;
  q->out = st;
  size_t in_elems = c->kind == MPG__REDUCE_SCATTER ? (size_t)size * n : n;
  if (pipe) {
    /* Staged, divided and copied out piece by piece (struct piece). */
    q->src = c->send;
    q->wire = st;
    q->mtype = t;
    q->mop = op;
    q->premul = premul ? c->scale : 0;
    q->rop = c->op;
    q->piece_div = c->op == MPG_OP_AVG ? size : 0;
    q->piece_fin = q->fin;
    q->fin = FIN_NONE;
  }
  switch (pipe ? MPG__BARRIER : c->kind) { /* pipe: nothing to do now */
    case MPG__ALL_REDUCE:
    case MPG__REDUCE_SCATTER:
      if (widen) mpg__half_widen(dt, c->send, (float *)st, in_elems);
      else if (in_elems && !zc) memcpy(st, c->send, in_elems * es);
      if (premul) mpg__scale(wdt, st, in_elems, c->scale);
      if (c->kind == MPG__REDUCE_SCATTER) q->out = st + in_elems * ws;
      if (c->op == MPG_OP_AVG) q->divisor = size;
      break;
    case MPG__ALL_GATHER:
      if (n) memcpy(st + (size_t)rank * n * es, c->send, n * es);
      q->nfin = (size_t)size * n;
      break;
    case MPG__BROADCAST:
      if (rank == peer) {
        if (n) memcpy(st, c->recv, n * es);
        q->fin = FIN_NONE; /* the root's buffer already holds the data */
      }
      break;
    case MPG__SEND:
      if (n) memcpy(st, c->send, n * es);
      q->fin = FIN_NONE;
      break;
    case MPG__RECV:
      break;
    case MPG__BARRIER:
      if (!pipe) q->fin = FIN_NONE;
      break;
  }

  const char *call = "?";
  int rc = MPI_SUCCESS;
  lock_g();
  switch (c->kind) {
    case MPG__ALL_REDUCE:
      call = "MPI_Iallreduce";
      rc = pipe ? queue_allreduce(q, m, ws)
                : post_allreduce(q, m->comm, st, n, ws, t, op);
      break;
    case MPG__REDUCE_SCATTER:
      call = n <= (size_t)g_chunk ? "MPI_Ireduce_scatter_block" : "MPI_Ireduce";
      rc = post_reduce_scatter(q, m, st, q->out, n, ws, t, op);
      break;
    case MPG__ALL_GATHER:
      call = n <= (size_t)g_chunk ? "MPI_Iallgather" : "MPI_Ibcast";
      rc = post_allgather(q, m, st, n, es, t);
      break;
    case MPG__BROADCAST:
      call = "MPI_Ibcast";
      rc = post_bcast(q, m->comm, st, n, es, t, peer);
      break;
    case MPG__BARRIER:
      call = "MPI_Ibarrier";
      rc = MPI_Ibarrier(m->comm, &q->reqs[0]);
      if (rc == MPI_SUCCESS) q->nreq = 1;
      break;
    case MPG__SEND:
      call = "MPI_Isend";
      rc = post_p2p(q, m->comm, 1, st, n, es, t, peer);
      break;
    case MPG__RECV:
      call = "MPI_Irecv";
      rc = post_p2p(q, m->comm, 0, st, n, es, t, peer);
      break;
  }
  q->comm = m;
  m->refs++;
  if (rc != MPI_SUCCESS) {
    /* Chunks already posted cannot be taken back: park them. */
    q->finished = 1;
    if (q->nreq > 0) {
      orphan(q);
    } else {
      comm_unref(m);
      req_release(q);
    }
    pthread_mutex_unlock(&g_lock);
    char what[256];
    describe(what, sizeof what, c->kind, dt, c->op, n, peer, size, rank);
    return mpi_fail(rc, call, what);
  }
  pend_link(m, q);
  pthread_mutex_unlock(&g_lock);
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
}

/* Has q's MPI part completed?  Sets q->mpi_done.  Lock held; the caller
 * pumps q's communicator first.  Also used by the progress thread, which
 * then keeps an error in q->pipe_rc for the caller to report. */
static int req_poll(mpg__req *q, int *flag) {
  int rc = MPI_SUCCESS;
  *flag = 0;
  if (q->pipe_rc)
    rc = q->pipe_rc;
  else if (atomic_load(&q->mpi_done))
    *flag = 1;
  else if (q->wire) /* pipelined: done when every piece was retired */
    *flag = q->unposted == 0 && q->inflight == 0;
  else if (q->unposted == 0)
    rc = q->nreq == 1 ? MPI_Test(q->reqs, flag, MPI_STATUS_IGNORE)
                      : MPI_Testall(q->nreq, q->reqs, flag, MPI_STATUSES_IGNORE);
  if ((rc != MPI_SUCCESS || *flag) && !atomic_exchange(&q->mpi_done, 1))
    pthread_cond_broadcast(&g_done_cond); /* a waiter in another thread */
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
  if (m->queue || m->nflight) pump(m);
  rc = req_poll(q, &flag);
  if (rc != MPI_SUCCESS || flag) {
    purge(m, q);
    q->finished = 1;
    pend_unlink(m, q);
  }
  pthread_mutex_unlock(&g_lock);
  if (rc != MPI_SUCCESS) {
    char what[256];
    req_describe(q, what, sizeof what);
    q->status = mpi_fail(rc, q->nreq == 1 ? "MPI_Test" : "MPI_Testall", what);
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
 * thread sets: no MPI call and no g_lock, so that a trainer testing work
 * between layers (mpg_sync_mark_ready does) never queues behind the
 * thread.  While the thread has backed off (nothing moved for a while,
 * see progress_main()), a caller that polls drives MPI itself. */
static mpg_status req_test(mpg__req *q, int *done) {
  if (!q->finished && atomic_load(&g_prog_running) && !atomic_load(&q->mpi_done) &&
      !atomic_load(&q->comm->aborted)) {
    if (!atomic_load(&g_prog_idle)) {
      *done = 0;
      return MPG_OK;
    }
  }
  return progress(q, done);
}

/* Waiting.  With a progress thread the waiter polls MPI itself only for
 * a short spin (a small operation finishes in that time, without the
 * thread hand-off), then sleeps on g_done_cond, woken when the thread sees
 * an operation finish (or on abort), and at least every 10 ms to check
 * the deadline.  Without one it polls (poller_pause()). */
#define MPG_MPI_WAIT_SPIN_S 50e-6
#define MPG_MPI_WAIT_NAP_S 0.01

static void nap_on_done(const mpg__req *q, double deadline) {
  lock_g();
  if (g_prog_running && !atomic_load(&q->mpi_done) &&
      !atomic_load(&q->comm->aborted)) {
    double left = deadline - mpg__now();
    if (left > MPG_MPI_WAIT_NAP_S) left = MPG_MPI_WAIT_NAP_S;
    if (left < 0) left = 0;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    long ns = ts.tv_nsec + (long)(left * 1e9);
    ts.tv_sec += ns / 1000000000L;
    ts.tv_nsec = ns % 1000000000L;
    pthread_cond_timedwait(&g_done_cond, &g_lock, &ts);
  }
  pthread_mutex_unlock(&g_lock);
}

static mpg_status req_wait(mpg__req *q, double deadline) {
  poller pl;
  poller_init(&pl, q->stage_cap);
  double spin_end = mpg__now() + MPG_MPI_WAIT_SPIN_S;
  for (;;) {
    int done = 0;
    mpg_status st = progress(q, &done);
    if (done || st) return st;
    if (mpg__now() >= deadline) {
      char what[256];
      req_describe(q, what, sizeof what);
      return mpg__fail(MPG_ERR_TIMEOUT,
                       "mpi: %s: not finished within the %.3g s timeout (a peer "
                       "did not arrive)",
                       what, q->comm->timeout_s);
    }
    if (g_prog_running && mpg__now() >= spin_end)
      nap_on_done(q, deadline); /* rechecks g_prog_running under the lock */
    else
      poller_pause(&pl);
  }
}

static void req_free(mpg__req *q) {
  if (!q) return;
  lock_g();
  int pending = !q->finished;
  for (int i = 0; i < q->nreq; i++)
    if (q->reqs[i] != MPI_REQUEST_NULL) pending = 1; /* or failed mid-way */
  if (pending) {
    /* MPI may still use the staging memory: park it (top of the file). */
    atomic_store(&g_faulted, 1);
    orphan(q);
    sweep_orphans();
  } else {
    mpg__comm *m = q->comm;
    stage_give(m, q->stage, q->stage_cap);
    q->stage = NULL;
    comm_unref(m);
    req_release(q);
  }
  pthread_mutex_unlock(&g_lock);
}

/* ------------------------------------------------------------------ */
/* The progress thread                                                 */
/* ------------------------------------------------------------------ */

/* Open MPI's nonblocking operations (point-to-point, and libnbc's
 * collectives) advance only while some thread is inside MPI, and the next
 * ring step of a pipelined all-reduce is posted only when a pump sees the
 * previous one finish.  Without help, an operation started by
 * mpg_all_reduce(..., &work) or by mpg_sync_mark_ready
 * would sit still while the caller computes, and all of it would run in
 * the final wait.  The progress thread keeps it moving: while any request
 * is pending it pumps every communicator with pieces (which stages,
 * posts, divides and copies out, see struct piece) and tests every
 * pending request (each test runs Open MPI's progress engine), and
 * broadcasts g_done_cond when one finishes: waiters sleep on it rather
 * than poll MPI themselves, which would take CPU and g_lock from the
 * thread.  Between rounds it yields the CPU and lets threads waiting for
 * g_lock in.  With nothing to drive it sleeps on g_prog_cond, woken by
 * the next post.  It takes g_lock like every other MPI call of this
 * file; MPI sees calls from two threads, so the thread runs only when MPI
 * provides MPI_THREAD_MULTIPLE (the application may call MPI itself
 * meanwhile).  MESHPG_MPI_PROGRESS=off turns it off. */

/* One round: pump every communicator with pieces and test every pending
 * request whose MPI part has not finished; wake the waiters when one
 * has.  Lock held.  Returns 1 if there was anything to drive. */
static int progress_round(int *moved, size_t *bytes) {
  int driven = 0, completed = 0;
  *moved = 0;
  *bytes = 0;
  for (mpg__comm *m = g_live, *next = NULL; m; m = next) {
    next = m->live_next;
    if (m->npending == 0 || atomic_load(&m->aborted)) continue;
    /* pump() may release g_lock: hold m meanwhile (a request released
     * then could drop its last reference). */
    m->refs++;
    if (m->queue || m->nflight) *moved += pump(m);
    for (mpg__req *q = m->pend; q; q = q->pend_next) {
      if (atomic_load(&q->mpi_done)) continue;
      int flag = 0;
      int rc = req_poll(q, &flag); /* wakes the waiters when it finished */
      if (rc != MPI_SUCCESS && !q->pipe_rc) q->pipe_rc = rc; /* for the waiter */
      if (rc != MPI_SUCCESS || flag) {
        completed = 1;
        ++*moved;
      } else {
        driven = 1;
        *bytes += q->count * mpg__dtype_size(q->dtype);
      }
    }
    next = m->live_next; /* NULL if m was destroyed meanwhile */
    comm_unref(m);
  }
  return driven || completed;
}

/* Pacing.  While operations move (a ring step or a request completed
 * within the spin window) the thread polls back to back, yielding the CPU
 * between rounds.  When nothing has moved for the window (a late or dead
 * peer), it backs off to sleeps growing from 1 us to 1 ms, so that a wait
 * for a peer does not burn a core until the timeout; a new post wakes it
 * at once.  The window grows with the bytes pending, as the waiters' did
 * (an operation run by Open MPI, not by our ring, shows no step until it
 * completes). */
#define MPG_MPI_PROG_SPIN_S 0.2
#define MPG_MPI_PROG_SPIN_S_PER_BYTE 4e-9

/* Wait on g_prog_cond for at most `secs`.  Lock held.  Returns 1 if
 * signalled (new work), 0 on timeout. */
static int prog_nap(double secs) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  long ns = ts.tv_nsec + (long)(secs * 1e9);
  ts.tv_sec += ns / 1000000000L;
  ts.tv_nsec = ns % 1000000000L;
  return pthread_cond_timedwait(&g_prog_cond, &g_lock, &ts) == 0;
}

static void *progress_main(void *arg) {
  (void)arg;
  pthread_mutex_lock(&g_lock);
  double last_move = mpg__now();
  unsigned naps = 0;
  while (!g_prog_stop) {
    if (g_pending_total <= 0 || g_we_finalized) {
      pthread_cond_wait(&g_prog_cond, &g_lock);
      last_move = mpg__now();
      naps = 0;
      atomic_store(&g_prog_idle, 0);
      continue;
    }
    int moved = 0;
    size_t bytes = 0;
    int drive = progress_round(&moved, &bytes);
    double t = mpg__now();
    if (moved) {
      last_move = t;
      naps = 0;
      atomic_store(&g_prog_idle, 0);
    }
    if (!drive) {
      /* Pending work only on aborted communicators: wait for it to be
       * freed, checking now and then. */
      prog_nap(1e-3);
    } else if (t - last_move <
               MPG_MPI_PROG_SPIN_S + (double)bytes * MPG_MPI_PROG_SPIN_S_PER_BYTE) {
      pthread_mutex_unlock(&g_lock);
      sched_yield();
      for (int i = 0; i < 64 && atomic_load(&g_want) > 0; i++) sched_yield();
      pthread_mutex_lock(&g_lock);
    } else {
      atomic_store(&g_prog_idle, 1);
      double secs = 1e-6 * (double)(1u << (naps < 10 ? naps++ : 10));
      if (prog_nap(secs > 1e-3 ? 1e-3 : secs)) {
        last_move = mpg__now();
        naps = 0;
        atomic_store(&g_prog_idle, 0);
      }
    }
  }
  pthread_mutex_unlock(&g_lock);
  return NULL;
}

/* Start the thread if enabled and MPI allows it.  Lock held. */
static void progress_start(void) {
  if (g_prog_running || g_prog_mode == PROG_OFF) return;
  int provided = MPI_THREAD_SINGLE;
  MPI_Query_thread(&provided);
  if (provided < MPI_THREAD_MULTIPLE) {
    mpg__log(1, "mpi: no progress thread: MPI runs at thread level %d, below "
             "MPI_THREAD_MULTIPLE (initialise MPI with MPI_Init_thread("
             "MPI_THREAD_MULTIPLE) to have one); nonblocking operations "
             "advance only inside meshpg calls", provided);
    return;
  }
  g_prog_stop = 0;
  if (pthread_create(&g_prog_thread, NULL, progress_main, NULL) != 0) {
    mpg__log(1, "mpi: no progress thread: pthread_create failed");
    return;
  }
  g_prog_running = 1;
  mpg__log(2, "mpi: progress thread started");
}

/* Stop and join the thread.  Lock NOT held. */
static void progress_stop(void) {
  lock_g();
  int running = g_prog_running;
  g_prog_stop = 1;
  g_prog_running = 0;
  pthread_cond_broadcast(&g_prog_cond);
  pthread_mutex_unlock(&g_lock);
  if (running) pthread_join(g_prog_thread, NULL);
}

/* ------------------------------------------------------------------ */
/* Memory                                                              */
/* ------------------------------------------------------------------ */

static mpg_status mem_alloc(mpg__comm *world, size_t bytes, int registered,
                            void **ptr) {
  (void)world;
  (void)registered; /* nothing to register with MPI */
  *ptr = NULL;
  struct region *r = calloc(1, sizeof *r);
  void *p = NULL;
  size_t len = bytes ? bytes : 1;
  if (!r || posix_memalign(&p, 4096, len) != 0) {
    free(r);
    return mpg__fail(MPG_ERR_NOMEM, "mpg_ctx_mem_alloc: out of memory for %zu bytes",
                     bytes);
  }
  memset(p, 0, len);
  r->base = p;
  r->len = len;
  lock_g();
  r->next = g_regions;
  g_regions = r;
  pthread_mutex_unlock(&g_lock);
  *ptr = p;
  return MPG_OK;
}

static mpg_status mem_free(mpg__comm *world, void *ptr) {
  (void)world;
  lock_g();
  struct region *r = g_regions;
  while (r && r->base != ptr) r = r->next;
  if (!r || r->freed) {
    pthread_mutex_unlock(&g_lock);
    return mpg__fail(MPG_ERR_INVALID, "mpg_ctx_mem_free: %p was not returned by "
                     "mpg_ctx_mem_alloc of this backend (or was freed already)",
                     ptr);
  }
  if (r->busy)
    r->freed = 1; /* an unfinished operation still uses it: free it last */
  else
    region_drop(r);
  pthread_mutex_unlock(&g_lock);
  return MPG_OK;
}

const struct mpg__backend_ops mpg__backend_mpi = {
    .name = "mpi",
    .world_init = world_init,
    .split = split,
    .post = post,
    .test = req_test,
    .wait = req_wait,
    .req_free = req_free,
    .abort_comm = comm_abort,
    .destroy = comm_destroy,
    .mem_alloc = mem_alloc,
    .mem_free = mem_free,
};
