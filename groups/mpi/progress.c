/* Driving MPI forward for the MPI backend: the pacing of polling loops,
 * the lists of pending work, the sleep of a waiter, and the progress
 * thread that keeps nonblocking operations moving while the caller
 * computes.
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
#include <time.h>

#include "mpi_internal.h"

/* The progress thread (see progress_main()).  g_prog_mode is read from
 * MESHPG_MPI_PROGRESS at each world_init; the thread runs while a world
 * exists. */
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

/* ------------------------------------------------------------------ */
/* Polling                                                             */
/* ------------------------------------------------------------------ */

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

void mpg__mpi_poller_init(mpg__mpi_poller *p, size_t bytes) {
  p->start = mpg__now();
  p->spin_s = MPG_MPI_SPIN_S + (double)bytes * MPG_MPI_SPIN_S_PER_BYTE;
  p->sleeps = 0;
}

void mpg__mpi_poller_pause(mpg__mpi_poller *p) {
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

/* The CLOCK_REALTIME time `secs` from now, for pthread_cond_timedwait. */
static struct timespec time_after(double secs) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  long ns = ts.tv_nsec + (long)(secs * 1e9);
  ts.tv_sec += ns / 1000000000L;
  ts.tv_nsec = ns % 1000000000L;
  return ts;
}

/* ------------------------------------------------------------------ */
/* Pending work                                                        */
/* ------------------------------------------------------------------ */

/* Every communicator not destroyed, and how many requests are pending on
 * them in all: what the progress thread drives.  Lock held. */
static mpg__comm *g_live;
static long g_pending_total; /* sum of npending over g_live */

void mpg__mpi_live_add(mpg__comm *m) {
  m->live_next = g_live;
  if (g_live) g_live->live_prev = m;
  g_live = m;
}

/* Take m off g_live (at destroy). */
void mpg__mpi_live_remove(mpg__comm *m) {
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
void mpg__mpi_pend_link(mpg__comm *m, mpg__req *q) {
  q->pend_prev = NULL;
  q->pend_next = m->pend;
  if (m->pend) m->pend->pend_prev = q;
  m->pend = q;
  pending_add(m, 1);
  pthread_cond_signal(&g_prog_cond); /* new work for the progress thread */
}

void mpg__mpi_pend_unlink(mpg__comm *m, mpg__req *q) {
  if (q->pend_prev) q->pend_prev->pend_next = q->pend_next;
  else m->pend = q->pend_next;
  if (q->pend_next) q->pend_next->pend_prev = q->pend_prev;
  q->pend_prev = q->pend_next = NULL;
  pending_add(m, -1);
}

/* ------------------------------------------------------------------ */
/* Waiters                                                             */
/* ------------------------------------------------------------------ */

/* A waiter (ops.c) sleeps on g_done_cond, woken when the progress thread
 * sees an operation finish (or on abort), and at least every 10 ms to
 * check its deadline. */
#define MPG_MPI_WAIT_NAP_S 0.01

void mpg__mpi_wake_waiters(void) { pthread_cond_broadcast(&g_done_cond); }

void mpg__mpi_nap_on_done(const mpg__req *q, double deadline) {
  lock_g();
  if (g_prog_running && !atomic_load(&q->mpi_done) &&
      !atomic_load(&q->comm->aborted)) {
    double left = deadline - mpg__now();
    if (left > MPG_MPI_WAIT_NAP_S) left = MPG_MPI_WAIT_NAP_S;
    if (left < 0) left = 0;
    struct timespec ts = time_after(left);
    pthread_cond_timedwait(&g_done_cond, &mpg__mpi.lock, &ts);
  }
  unlock_g();
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
 * than poll MPI themselves, which would take CPU and the lock from the
 * thread.  Between rounds it yields the CPU and lets threads waiting for
 * the lock in.  With nothing to drive it sleeps on g_prog_cond, woken by
 * the next post.  It takes the lock like every other MPI call of this
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
  for (mpg__comm *m = g_live, *next = NULL; m; m = next) {
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

/* Wait on g_prog_cond for at most `secs`.  Lock held.  Returns 1 if
 * signalled (new work), 0 on timeout. */
static int prog_nap(double secs) {
  struct timespec ts = time_after(secs);
  return pthread_cond_timedwait(&g_prog_cond, &mpg__mpi.lock, &ts) == 0;
}

static void *progress_main(void *arg) {
  (void)arg;
  pthread_mutex_lock(&mpg__mpi.lock);
  double last_move = mpg__now();
  unsigned naps = 0;
  while (!g_prog_stop) {
    if (g_pending_total <= 0 || mpg__mpi.we_finalized) {
      pthread_cond_wait(&g_prog_cond, &mpg__mpi.lock);
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
      unlock_g();
      sched_yield();
      for (int i = 0; i < 64 && atomic_load(&mpg__mpi.want) > 0; i++) sched_yield();
      pthread_mutex_lock(&mpg__mpi.lock);
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
  unlock_g();
  return NULL;
}

mpg_status mpg__mpi_progress_configure(void) {
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
  return MPG_OK;
}

/* MPI sees calls from two threads only with the progress thread
 * (MPI_THREAD_SERIALIZED with MESHPG_MPI_PROGRESS=off). */
int mpg__mpi_progress_level(void) {
  return g_prog_mode == PROG_THREAD ? MPI_THREAD_MULTIPLE : MPI_THREAD_SERIALIZED;
}

int mpg__mpi_progress_running(void) { return atomic_load(&g_prog_running); }

int mpg__mpi_progress_idle(void) { return atomic_load(&g_prog_idle); }

/* Start the thread if enabled and MPI allows it.  Lock held. */
void mpg__mpi_progress_start(void) {
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
void mpg__mpi_progress_stop(void) {
  lock_g();
  int running = g_prog_running;
  g_prog_stop = 1;
  g_prog_running = 0;
  pthread_cond_broadcast(&g_prog_cond);
  unlock_g();
  if (running) pthread_join(g_prog_thread, NULL);
}
