/* The progress thread of the MPI backend, which keeps nonblocking
 * operations moving while the caller computes (layer: above ops.c and
 * ring.c, whose requests and pieces it drives; below world.c, which starts
 * and stops it).  The lists of pending work it drives, the waiters it
 * wakes and the flags its callers read are pending.c's.
 *
 * Threads.  Our own MPI calls are serialised with one process-wide lock
 * (mpg__mpi.lock, never held while sleeping), so contexts may be used
 * from several threads.  The progress thread (see progress_main()) calls
 * MPI while the application may call it too, so it runs only at
 * MPI_THREAD_MULTIPLE, which world.c asks for when it initialises MPI
 * (MPI_THREAD_SERIALIZED with MESHPG_MPI_PROGRESS=off). */
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "mpi_internal.h"

/* The progress thread (see progress_main()).  g_prog_mode is read from
 * MESHPG_MPI_PROGRESS at each world_init; the thread runs while a world
 * exists. */
enum { PROG_THREAD, PROG_OFF };
static int g_prog_mode = PROG_THREAD;
static int g_prog_stop;        /* asks it to exit */
static pthread_t g_prog_thread;

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
 * wakes the waiters when one finishes (mpg__mpi_wake_waiters(),
 * pending.c): waiters sleep rather than poll MPI themselves, which would
 * take CPU and the lock from the thread.  Between rounds it yields the
 * CPU and lets threads waiting for the lock in.  With nothing to drive it
 * sleeps on mpg__mpi.prog_cond, woken by the next post.  It takes the lock like every other MPI call of this
 * backend; MPI sees calls from two threads, so the thread runs only when MPI
 * provides MPI_THREAD_MULTIPLE (the application may call MPI itself
 * meanwhile).  MESHPG_MPI_PROGRESS=off turns it off. */

/* One round: pump every communicator with pieces and test every pending
 * request whose MPI part has not finished; wake the waiters when one
 * has.  Lock held.  Returns 1 if there was anything to drive. */
static int progress_round(int *moved, size_t *bytes) {
  int driven = 0, completed = 0;
  *moved = 0;
  *bytes = 0;
  for (mpg__comm *m = mpg__mpi.live, *next = NULL; m; m = next) {
    next = m->live_next;
    if (m->npending == 0 || atomic_load(&m->aborted)) continue;
    /* mpg__mpi_pump() may release the lock: hold m meanwhile (a request
     * released then could drop its last reference). */
    m->refs++;
    if (m->queue || m->nflight) *moved += mpg__mpi_pump(m);
    for (mpg__req *q = m->pend; q; q = q->pend_next) {
      if (atomic_load(&q->mpi_done)) continue;
      int flag = 0;
      int rc = mpg__mpi_req_poll(q, &flag); /* wakes the waiters if finished */
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
    mpg__mpi_comm_unref(m);
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

/* Wait on mpg__mpi.prog_cond for at most `secs`.  Lock held.  Returns 1 if
 * signalled (new work), 0 on timeout. */
static int prog_nap(double secs) {
  struct timespec ts = mpg__mpi_time_after(secs);
  return pthread_cond_timedwait(&mpg__mpi.prog_cond, &mpg__mpi.lock, &ts) == 0;
}

static void *progress_main(void *arg) {
  (void)arg;
  pthread_mutex_lock(&mpg__mpi.lock);
  double last_move = mpg__now();
  unsigned naps = 0;
  while (!g_prog_stop) {
    if (mpg__mpi.pending_total <= 0 || mpg__mpi.we_finalized) {
      pthread_cond_wait(&mpg__mpi.prog_cond, &mpg__mpi.lock);
      last_move = mpg__now();
      naps = 0;
      atomic_store(&mpg__mpi.prog_idle, 0);
      continue;
    }
    int moved = 0;
    size_t bytes = 0;
    int drive = progress_round(&moved, &bytes);
    double t = mpg__now();
    if (moved) {
      last_move = t;
      naps = 0;
      atomic_store(&mpg__mpi.prog_idle, 0);
    }
    if (!drive) {
      /* Pending work only on aborted communicators: wait for it to be
       * freed, checking now and then. */
      prog_nap(1e-3);
    } else if (t - last_move <
               MPG_MPI_PROG_SPIN_S + (double)bytes * MPG_MPI_PROG_SPIN_S_PER_BYTE) {
      unlock_g();
      sched_yield();
      for (int i = 0; i < 64 && atomic_load(&mpg__mpi.want) > 0; i++) sched_yield();
      pthread_mutex_lock(&mpg__mpi.lock);
    } else {
      atomic_store(&mpg__mpi.prog_idle, 1);
      double secs = 1e-6 * (double)(1u << (naps < 10 ? naps++ : 10));
      if (prog_nap(secs > 1e-3 ? 1e-3 : secs)) {
        last_move = mpg__now();
        naps = 0;
        atomic_store(&mpg__mpi.prog_idle, 0);
      }
    }
  }
  unlock_g();
  return NULL;
}

void mpg__mpi_progress_configure(int thread) {
  g_prog_mode = thread ? PROG_THREAD : PROG_OFF;
}

/* MPI sees calls from two threads only with the progress thread
 * (MPI_THREAD_SERIALIZED with MESHPG_MPI_PROGRESS=off). */
int mpg__mpi_progress_level(void) {
  return g_prog_mode == PROG_THREAD ? MPI_THREAD_MULTIPLE : MPI_THREAD_SERIALIZED;
}

/* Start the thread if enabled and MPI allows it.  Lock held. */
void mpg__mpi_progress_start(void) {
  if (mpg__mpi.prog_running || g_prog_mode == PROG_OFF) return;
  int provided = MPI_THREAD_SINGLE;
  if (MPI_Query_thread(&provided) != MPI_SUCCESS) provided = MPI_THREAD_SINGLE;
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
  mpg__mpi.prog_running = 1;
  mpg__log(2, "mpi: progress thread started");
}

/* Stop and join the thread.  Lock NOT held. */
void mpg__mpi_progress_stop(void) {
  lock_g();
  int running = mpg__mpi.prog_running;
  g_prog_stop = 1;
  mpg__mpi.prog_running = 0;
  pthread_cond_broadcast(&mpg__mpi.prog_cond);
  unlock_g();
  if (running) pthread_join(g_prog_thread, NULL);
}
