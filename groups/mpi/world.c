/* MPI ownership and the communicator lifecycle of the MPI backend: who
 * initialises and finalises MPI, joining the world, split, abort and
 * destroy; and the backend's function table (layer: the top; no other
 * file of the backend calls it, the NCCL bootstrap does through
 * mpi_owner.h).
 *
 * Ownership.  This file is the one place that initialises and finalises
 * MPI for meshpg, the NCCL backend's MPI bootstrap included (through
 * mpg__mpi_acquire, mpi_owner.h, which states the rule).  If meshpg
 * initialised MPI, it finalises it exactly once per process: when the
 * last hold is released (the last world destroyed) after a clean run.  In
 * Open MPI MPI_Finalize is a job-wide rendezvous (a PMIx fence): it
 * returns only when every process has called it.  After an abort or a
 * timeout a peer may never get there, so destroy must not enter it; yet a
 * process that exits without MPI_Finalize makes mpirun declare the job
 * failed and kill the other processes.  So after a fault, finalisation is
 * deferred to an atexit handler, registered when we initialised MPI: the
 * process returns from destroy at once and leaves MPI properly when it
 * exits (waiting there for the other processes, which under mpirun either
 * exit too or are killed by the launcher).  The same handler finalises
 * when a program exits without destroying its context, or when the NCCL
 * bootstrap holds MPI.  MPI cannot be initialised twice, so after a clean
 * finalise a new world_init fails with MPG_ERR_STATE; a program that
 * creates contexts one after another should call MPI_Init itself.
 *
 * Creation under a timeout.  MPI has no nonblocking split
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
 * Errors return.  No MPI error of meshpg's own calls ends the job: every
 * communicator meshpg makes (the world's duplicate, every split) gets
 * MPI_ERRORS_RETURN before its first use (comm_wrap), and every call's
 * result is checked.  Open MPI 4.1 reports some errors elsewhere: a
 * nonblocking collective's (libnbc's: an all-reduce whose members gave
 * different counts fails with MPI_ERR_TRUNCATE) on MPI_COMM_WORLD when the
 * request completes, and a group's on MPI_COMM_WORLD too.  MPI_COMM_WORLD's
 * handler and the caller's opts.mpi_comm's are the application's (also
 * when meshpg initialised MPI: the application may call MPI on them
 * later), so meshpg never changes them for good: it completes a request
 * only once MPI_Request_get_status says it is done, and around that one
 * MPI_Test (and around its own calls on those communicators) it sets
 * MPI_ERRORS_RETURN and restores the handler after (mpg__mpi_ret_begin,
 * state.c).  The error then comes back as MPG_ERR_BACKEND naming the
 * operation, its group and MPI's error string; the groups layer aborts the
 * context.  (An application thread whose own MPI call fails on
 * MPI_COMM_WORLD in that instant gets the error returned rather than its
 * handler called.)  MPI_Init_thread's own errors cannot be bounded.
 *
 * Abort.  The abort op only sets a flag: it never calls MPI (and never
 * MPI_Abort, which would kill the job).  Waiters see the flag within one
 * poll; later posts fail with the reason (ops.c).
 *
 * Destroy.  MPI_Comm_free is skipped for a communicator that was aborted
 * or still has unfinished operations: its handle is left to
 * MPI_Finalize.  (Open MPI frees locally, but pending nonblocking
 * collectives hold on to the communicator, and the standard lets an
 * implementation synchronise in MPI_Comm_free.) */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <string.h>

#include "mpi_internal.h"

/* Ownership, guarded by mpg__mpi.lock. */
static int g_we_initialized; /* we called MPI_Init_thread */
static int g_holds;          /* live worlds + NCCL bootstraps (until exit) */
static int g_live_worlds;    /* the progress thread runs while one lives */

/* ------------------------------------------------------------------ */
/* Initialising and finalising MPI                                     */
/* ------------------------------------------------------------------ */

static void finalize_locked(void) {
  if (!g_we_initialized || mpg__mpi.we_finalized) return;
  int fin = 0;
  if (MPI_Finalized(&fin) != MPI_SUCCESS) fin = 0;
  if (!fin && MPI_Finalize() != MPI_SUCCESS)
    mpg__log(1, "mpi: MPI_Finalize failed");
  mpg__mpi.we_finalized = 1;
  mpg__mpi_free_orphans();
  mpg__log(1, "mpi: MPI finalized");
}

/* Registered when we initialise MPI: leaves MPI properly at exit after a
 * fault (see Ownership above), when a context was never destroyed,
 * or when the NCCL bootstrap holds MPI. */
static void finalize_at_exit(void) {
  mpg__mpi_progress_stop();
  lock_g();
  finalize_locked();
  unlock_g();
}

/* Initialise MPI at `level` unless it is.  Lock held; MPI is not
 * finalised.  Returns MPI_SUCCESS, with the level MPI runs at in
 * *provided and *here = 1 if this call initialised it, or
 * MPI_Init_thread's error. */
static int init_locked(int level, int *provided, int *here) {
  int init = 0;
  *provided = MPI_THREAD_SINGLE;
  *here = 0;
  int rc = MPI_Initialized(&init);
  if (rc != MPI_SUCCESS) return rc;
  if (init) return MPI_Query_thread(provided);
  rc = MPI_Init_thread(NULL, NULL, level, provided);
  if (rc != MPI_SUCCESS) return rc;
  g_we_initialized = 1;
  *here = 1;
  atexit(finalize_at_exit);
  return MPI_SUCCESS;
}

/* Release one hold: the last one finalises MPI now if we initialised it
 * and no fault happened; after a fault the atexit handler does.  Lock
 * held. */
static void release_locked(void) {
  if (--g_holds > 0 || !g_we_initialized) return;
  if (atomic_load(&mpg__mpi.faulted))
    mpg__log(1, "mpi: after an abort MPI_Finalize is deferred to exit");
  else
    finalize_locked();
}

int mpg__mpi_acquire(int level) {
  lock_g();
  int fin = 0, provided = 0, here = 0, rc = MPI_Finalized(&fin);
  if (rc == MPI_SUCCESS) rc = fin ? MPI_ERR_OTHER : init_locked(level, &provided, &here);
  if (rc == MPI_SUCCESS) g_holds++; /* never released: until exit */
  unlock_g();
  return rc;
}

/* ------------------------------------------------------------------ */
/* Communicators                                                       */
/* ------------------------------------------------------------------ */

/* Wrap c, a communicator meshpg made: its errors return (checked here,
 * so that no error of meshpg's calls on it ends the job).  Lock held. */
static mpg_status comm_wrap(MPI_Comm c, double timeout_s, int is_world,
                            mpg__comm **out) {
  int rc = MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN);
  if (rc != MPI_SUCCESS) return mpg__mpi_fail(rc, "MPI_Comm_set_errhandler", "a new group");
  mpg__comm *m = calloc(1, sizeof *m);
  if (!m) return mpg__fail(MPG_ERR_NOMEM, "mpi: out of memory for a communicator");
  m->comm = c;
  rc = MPI_Comm_rank(c, &m->rank);
  if (rc == MPI_SUCCESS) rc = MPI_Comm_size(c, &m->size);
  if (rc != MPI_SUCCESS) {
    free(m);
    return mpg__mpi_fail(rc, "MPI_Comm_rank/MPI_Comm_size", "a new group");
  }
  m->timeout_s = timeout_s;
  m->is_world = is_world;
  atomic_init(&m->aborted, MPG_OK);
  m->refs = 1;
  mpg__mpi_live_add(m);
  *out = m;
  return MPG_OK;
}

/* Poll one MPI request until done, `deadline`, or an abort of `m` (may be
 * NULL).  Takes the lock for each test.  Returns MPI_SUCCESS with *state
 * 0 (done), 1 (deadline), 2 (aborted), or an MPI error. */
static int poll_request(MPI_Request *r, double deadline, mpg__comm *m,
                        int *state) {
  mpg__mpi_poller pl;
  mpg__mpi_poller_init(&pl, 0);
  for (;;) {
    if (m && atomic_load(&m->aborted)) {
      *state = 2;
      return MPI_SUCCESS;
    }
    int flag = 0;
    lock_g();
    int rc = mpg__mpi_test_reqs(1, r, &flag);
    unlock_g();
    if (rc != MPI_SUCCESS) return rc;
    if (flag) {
      *state = 0;
      return MPI_SUCCESS;
    }
    if (mpg__now() >= deadline) {
      *state = 1;
      return MPI_SUCCESS;
    }
    mpg__mpi_poller_pause(&pl);
  }
}

/* Give up on a pending request r (of communicator m, or NULL) and on the
 * memory it may still write: a fault; both are orphaned. */
static void abandon(MPI_Request r, void *mem, mpg__comm *m) {
  mpg__mpi_note_fault();
  lock_g();
  mpg__mpi_orphan_request(r, mem, 0);
  if (m) m->norphans++;
  unlock_g();
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
    mpg__mpi_ret g; /* c may be the caller's communicator */
    mpg__mpi_ret_begin(&g, c);
    int rc = MPI_Ibarrier(c, &r);
    mpg__mpi_ret_end(&g);
    unlock_g();
    if (rc != MPI_SUCCESS) return rc;
    if (phase == 1) deadline = mpg__now() + timeout;
    rc = poll_request(&r, deadline, m, state);
    if (rc != MPI_SUCCESS || *state != 0) {
      abandon(r, NULL, m);
      return rc;
    }
  }
  return MPI_SUCCESS;
}

enum mpg__mpi_bcast_result mpg__mpi_bcast_bytes(MPI_Comm comm, void *buf,
                                                int bytes, double deadline) {
  size_t len = bytes > 0 ? (size_t)bytes : 0;
  void *mem = malloc(len ? len : 1); /* what MPI writes, owned until done */
  if (!mem) return MPG__MPI_BCAST_POST_FAILED;
  memcpy(mem, buf, len);
  MPI_Request r = MPI_REQUEST_NULL;
  lock_g();
  mpg__mpi_ret g; /* the caller's communicator */
  mpg__mpi_ret_begin(&g, comm);
  int rc = MPI_Ibcast(mem, bytes, MPI_BYTE, 0, comm, &r);
  mpg__mpi_ret_end(&g);
  unlock_g();
  if (rc != MPI_SUCCESS) {
    free(mem);
    return MPG__MPI_BCAST_POST_FAILED;
  }
  int state = 0;
  rc = poll_request(&r, deadline, NULL, &state);
  if (rc == MPI_SUCCESS && state == 0) {
    memcpy(buf, mem, len);
    free(mem);
    return MPG__MPI_BCAST_DONE;
  }
  abandon(r, mem, NULL);
  return rc != MPI_SUCCESS ? MPG__MPI_BCAST_TEST_FAILED : MPG__MPI_BCAST_TIMEOUT;
}

/* The rank and size of the caller's communicator (opts.mpi_comm), which
 * the caller created, so MPI must be initialised already. */
static mpg_status comm_identity(void *mpi_comm, int *rank, int *size) {
  int init = 0, fin = 0;
  lock_g();
  if (MPI_Initialized(&init) != MPI_SUCCESS || MPI_Finalized(&fin) != MPI_SUCCESS)
    init = 0;
  if (!init || fin) {
    unlock_g();
    return mpg__fail(MPG_ERR_STATE,
                     "mpi: opts.mpi_comm is set but MPI is %s: initialise MPI and "
                     "create the communicator before mpg_ctx_create",
                     fin ? "already finalized" : "not initialised");
  }
  MPI_Comm c = *(MPI_Comm *)mpi_comm;
  if (c == MPI_COMM_NULL) {
    unlock_g();
    return mpg__fail(MPG_ERR_INVALID,
                     "mpi: opts.mpi_comm points to MPI_COMM_NULL (a process outside "
                     "the split cannot join a world)");
  }
  mpg__mpi_ret g; /* the caller's: its handler is theirs, errors return here */
  mpg__mpi_ret_begin(&g, c);
  int rc = MPI_Comm_rank(c, rank);
  if (rc == MPI_SUCCESS) rc = MPI_Comm_size(c, size);
  mpg__mpi_ret_end(&g);
  unlock_g();
  if (rc != MPI_SUCCESS)
    return mpg__mpi_fail(rc, "MPI_Comm_rank/MPI_Comm_size", "the communicator in opts.mpi_comm");
  return MPG_OK;
}

/* The ring's window: MESHPG_MPI_WINDOW, else MPG_MPI_WINDOW_WIDE when
 * this node's ranks (args->local_world_size) have an online core each and
 * MPG_MPI_WINDOW_NARROW when they outnumber the cores.  Measured on
 * gpt-small's sync (bench/run_sync.sh, docs/benchmarks.md): with a core
 * per rank, 8 one-MiB pieces in flight keep every rank busy reducing one
 * piece while the next arrives (11 % faster than 2 at np 2 on 2 cores);
 * with more ranks than cores, the extra pieces only compete for the same
 * cores and caches (2 is as fast or faster at np 4 on 2 cores).  The
 * window may differ between ranks: every piece has its own tag. */
static void window_configure(const mpg__world_args *args) {
  int w = args->settings ? args->settings->mpi_window : 0; /* 1..8, checked */
  if (w >= 1 && w <= MPG_MPI_WINDOW_MAX) {
    mpg__mpi.window = w;
    return;
  }
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  int local = args->local_world_size;
  mpg__mpi.window = local >= 1 && cores >= local ? MPG_MPI_WINDOW_WIDE
                                                 : MPG_MPI_WINDOW_NARROW;
  mpg__log(2, "mpi: ring window %d (%d local ranks, %ld online cores)",
           mpg__mpi.window, local, cores);
}

/* Initialise MPI for a world, warning of a low thread level; lock held, released on error. */
static mpg_status world_mpi_init(int *here, double *init_s) {
  int fin = 0;
  if (MPI_Finalized(&fin) != MPI_SUCCESS) fin = 0;
  if (fin) {
    unlock_g();
    return mpg__fail(MPG_ERR_STATE,
                     "mpi: MPI was already finalized%s and cannot be "
                     "initialised again in this process; to create several "
                     "contexts one after another, call MPI_Init yourself",
                     mpg__mpi.we_finalized ? " (by meshpg when the last context was "
                                             "destroyed)" : "");
  }
  /* The progress thread needs MPI_THREAD_MULTIPLE (see progress.c). */
  int provided = MPI_THREAD_SINGLE;
  double init_t0 = mpg__now();
  int rc = init_locked(mpg__mpi_progress_level(), &provided, here);
  *init_s = mpg__now() - init_t0;
  if (rc != MPI_SUCCESS) {
    unlock_g();
    return mpg__mpi_fail(rc, "MPI_Init_thread", "the world");
  }
  if (provided < MPI_THREAD_SERIALIZED) {
    if (*here)
      mpg__log(1, "mpi: MPI gave thread level %d, below MPI_THREAD_SERIALIZED; "
               "call meshpg from one thread only", provided);
    else
      mpg__log(1, "mpi: the application initialised MPI at thread level %d "
               "(below MPI_THREAD_SERIALIZED); call meshpg from the thread "
               "that calls MPI only", provided);
  }
  return MPG_OK;
}

/* Set the test hooks' chunk and piece sizes from the settings (may be NULL). */
static void hooks_configure(const mpg__settings *set) {
  /* Test hook: a small chunk size exercises the > INT_MAX paths. */
  long ck = set ? set->mpi_max_count : 0;
  mpg__mpi.chunk = ck > 0 && ck <= INT_MAX ? ck : INT_MAX;
  /* Test hook: a small piece size pipelines small all-reduces too. */
  size_t pb = set ? set->mpi_piece_bytes : 0;
  mpg__mpi.piece = pb >= 8 ? pb : MPG_MPI_PIECE_DEFAULT;
}

/* Check base's rank and size against what meshpg was told; lock held, released on error. */
static mpg_status world_identity(const mpg__world_args *args, MPI_Comm base, const char *which,
                                 int *rank, int *size) {
  mpg__mpi_ret g;
  mpg__mpi_ret_begin(&g, base);
  int rc = MPI_Comm_rank(base, rank);
  if (rc == MPI_SUCCESS) rc = MPI_Comm_size(base, size);
  mpg__mpi_ret_end(&g);
  if (rc != MPI_SUCCESS) {
    unlock_g();
    return mpg__mpi_fail(rc, "MPI_Comm_rank/MPI_Comm_size", "the world communicator");
  }
  if (*rank != args->rank || *size != args->world_size) {
    unlock_g();
    return mpg__fail(MPG_ERR_ENV,
                     "mpi: %s has rank %d of %d but meshpg was told rank %d of "
                     "%d (from opts or the launch environment); pass "
                     "opts.rank and opts.world_size to match MPI",
                     which, *rank, *size, args->rank, args->world_size);
  }
  return MPG_OK;
}

/* Duplicate base into the world's communicator and start the progress thread. */
static mpg_status world_dup(MPI_Comm base, const char *which, double timeout,
                            mpg__comm **world) {
  MPI_Comm comm = MPI_COMM_NULL;
  lock_g();
  mpg__mpi_ret g;
  mpg__mpi_ret_begin(&g, base);
  int rc = MPI_Comm_dup(base, &comm); /* inherits base's handler: comm_wrap sets ours */
  mpg__mpi_ret_end(&g);
  if (rc != MPI_SUCCESS) {
    unlock_g();
    return mpg__mpi_fail(rc, "MPI_Comm_dup", which);
  }
  mpg_status st = comm_wrap(comm, timeout, 1, world);
  if (st) {
    if (MPI_Comm_free(&comm) != MPI_SUCCESS)
      mpg__log(1, "mpi: MPI_Comm_free failed for the world's duplicate");
  } else {
    g_live_worlds++;
    g_holds++; /* released by its destroy */
    if (MPI_Comm_set_name(comm, "meshpg world") != MPI_SUCCESS)
      mpg__log(1, "mpi: MPI_Comm_set_name failed for the world");
    mpg__mpi_progress_start();
  }
  unlock_g();
  return st;
}

static mpg_status world_init(const mpg__world_args *args, mpg__comm **world) {
  *world = NULL;
  double timeout = args->timeout_s > 0 ? args->timeout_s : 600.0;

  /* The variables, as mpg_ctx_create parsed them (groups/settings.c). */
  const mpg__settings *set = args->settings;
  mpg__mpi_progress_configure(set ? set->mpi_progress : 1);
  window_configure(args);

  lock_g();
  int here = 0;
  double init_s = 0;
  mpg_status st = world_mpi_init(&here, &init_s);
  if (st) return st;
  hooks_configure(set);
  MPI_Comm base = args->mpi_comm ? *(MPI_Comm *)args->mpi_comm : MPI_COMM_WORLD;
  const char *which = args->mpi_comm ? "the communicator in opts.mpi_comm"
                                     : "MPI_COMM_WORLD";
  int rank = -1, size = -1;
  st = world_identity(args, base, which, &rank, &size);
  if (st) return st;
  unlock_g();

  /* Every rank must arrive within the timeout, counted from here: our
   * MPI_Init_thread may have taken long, and the peers' may take as long
   * again.  Then the dup cannot hang. */
  int state = 0;
  int rc = rendezvous(base, NULL, mpg__now() + timeout, timeout, &state);
  if (rc != MPI_SUCCESS) return mpg__mpi_fail(rc, "MPI_Ibarrier", which);
  /* The message says how long our MPI_Init_thread took: the timeout is
   * counted after it, so a caller who timed mpg_ctx_create can tell the
   * launcher's start-up from meshpg's wait. */
  if (state != 0) {
    char init_note[96] = "";
    if (here)
      snprintf(init_note, sizeof init_note,
               " (counted after MPI_Init_thread, which took %.3f s)", init_s);
    return mpg__fail(MPG_ERR_TIMEOUT,
                     "mpi: joining the world (rank %d of %d): not every rank "
                     "arrived within the %.3g s timeout%s",
                     rank, size, timeout, init_note);
  }
  st = world_dup(base, which, timeout, world);
  if (!st)
    mpg__log(2, "mpi: rank %d of %d joined (%s, at most %ld elements per MPI "
             "call)", rank, size, which, mpg__mpi.chunk);
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
    if (rc != MPI_SUCCESS)
      return mpg__mpi_fail(rc, "MPI_Ibarrier", "the split rendezvous");
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
    st = mpg__mpi_fail(rc, "MPI_Comm_split", what);
  } else if (c != MPI_COMM_NULL) {
    st = comm_wrap(c, parent->timeout_s, 0, out);
    if (st && MPI_Comm_free(&c) != MPI_SUCCESS)
      mpg__log(1, "mpi: MPI_Comm_free failed for a split");
  }
  unlock_g();
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
  mpg__mpi_note_fault();
  mpg__mpi_wake_waiters(); /* waiters look at the flag */
}

static mpg_status comm_destroy(mpg__comm *m) {
  if (!m) return MPG_OK;
  mpg_status st = MPG_OK;
  lock_g();
  int last = m->is_world && g_live_worlds == 1;
  unlock_g();
  if (last) mpg__mpi_progress_stop(); /* before MPI_Finalize, and not needed now */
  lock_g();
  mpg__mpi_live_remove(m);
  mpg__mpi_sweep_orphans();
  int fin = 0;
  if (MPI_Finalized(&fin) != MPI_SUCCESS) fin = 1; /* leave the handle alone */
  if (!fin && !atomic_load(&m->aborted) && m->npending == 0 &&
      m->norphans == 0) {
    int rc = MPI_Comm_free(&m->comm);
    if (rc != MPI_SUCCESS) st = mpg__mpi_fail(rc, "MPI_Comm_free", "a group");
  }
  /* else: leave the handle to MPI_Finalize (see Destroy above). */
  if (m->is_world) {
    g_live_worlds--;
    release_locked();
  }
  m->destroyed = 1;
  if (m->scratch) {
    /* An abandoned piece's receive may still land in it: then it lives
     * until MPI is finalised. */
    int safe = !atomic_load(&m->aborted) && m->npending == 0 && m->norphans == 0;
    if (safe || mpg__mpi.we_finalized)
      free(m->scratch);
    else
      mpg__mpi_orphan_request(MPI_REQUEST_NULL, m->scratch, 1);
    m->scratch = NULL;
  }
  for (int i = 0; i < MPG_MPI_SPARES; i++) {
    free(m->spare[i]);
    m->spare[i] = NULL;
  }
  mpg__mpi_comm_unref(m);
  unlock_g();
  return st;
}

static void comm_set_timeout(mpg__comm *m, double timeout_s) {
  lock_g();
  m->timeout_s = timeout_s;
  unlock_g();
}

/* rank and size are set when the communicator is made and never change. */
static void comm_shape(const mpg__comm *m, int *pos, int *size) {
  *pos = m->rank;
  *size = m->size;
}

/* MPI_Group_translate_ranks from comm's group to its parent's. */
static int comm_members(const mpg__comm *m, const mpg__comm *parent, int *pos) {
  int *in = malloc(sizeof *in * (size_t)m->size);
  if (!in) return -1;
  for (int i = 0; i < m->size; i++) in[i] = i;
  MPI_Group a = MPI_GROUP_NULL, b = MPI_GROUP_NULL;
  lock_g();
  mpg__mpi_ret g; /* a group's errors report on MPI_COMM_WORLD */
  mpg__mpi_ret_begin(&g, MPI_COMM_WORLD);
  int rc = MPI_Comm_group(m->comm, &a);
  if (rc == MPI_SUCCESS) rc = MPI_Comm_group(parent->comm, &b);
  if (rc == MPI_SUCCESS) rc = MPI_Group_translate_ranks(a, m->size, in, b, pos);
  if (a != MPI_GROUP_NULL && MPI_Group_free(&a) != MPI_SUCCESS) rc = MPI_ERR_GROUP;
  if (b != MPI_GROUP_NULL && MPI_Group_free(&b) != MPI_SUCCESS) rc = MPI_ERR_GROUP;
  mpg__mpi_ret_end(&g);
  unlock_g();
  free(in);
  return rc == MPI_SUCCESS ? 0 : -1;
}

const struct mpg__backend_ops mpg__backend_mpi = {
    .name = "mpi",
    .world_init = world_init,
    .split = split,
    .post = mpg__mpi_post,
    .post_alltoallv = mpg__mpi_post_alltoallv,
    .test = mpg__mpi_test,
    .wait = mpg__mpi_wait,
    .req_free = mpg__mpi_req_free,
    .abort_comm = comm_abort,
    .destroy = comm_destroy,
    .mem_alloc = mpg__mpi_mem_alloc,
    .mem_free = mpg__mpi_mem_free,
    .mem_share = mpg__mpi_mem_share,
    .comm_identity = comm_identity,
    .set_timeout = comm_set_timeout,
    .comm_shape = comm_shape,
    .comm_members = comm_members,
    .host_shm = 1,
};
