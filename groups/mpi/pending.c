/* Pending work and those who wait for it, in the MPI backend (layer:
 * above state.c, below everything else): the pacing of polling loops,
 * the live communicators and their lists of pending requests (what the
 * progress thread drives; posting work wakes it), the sleep of a waiter
 * and its wake-up, and whether the progress thread runs or has backed
 * off.  The progress thread itself is progress.c; the state the two
 * files share is in mpg__mpi (mpi_internal.h). */
#include <sched.h>
#include <time.h>

#include "mpi_internal.h"

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
struct timespec mpg__mpi_time_after(double secs) {
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

/* Every communicator not destroyed (mpg__mpi.live), and how many requests
 * are pending on them in all (mpg__mpi.pending_total): what the progress
 * thread drives.  Lock held. */

void mpg__mpi_live_add(mpg__comm *m) {
  m->live_next = mpg__mpi.live;
  if (mpg__mpi.live) mpg__mpi.live->live_prev = m;
  mpg__mpi.live = m;
}

/* Take m off mpg__mpi.live (at destroy). */
void mpg__mpi_live_remove(mpg__comm *m) {
  mpg__mpi.pending_total -= m->npending;
  if (m->live_prev) m->live_prev->live_next = m->live_next;
  else if (mpg__mpi.live == m) mpg__mpi.live = m->live_next;
  if (m->live_next) m->live_next->live_prev = m->live_prev;
  m->live_prev = m->live_next = NULL;
}

/* Count one more (+1) or one fewer (-1) unfinished request on m; wakes
 * the progress thread when work appears.  Lock held. */
static void pending_add(mpg__comm *m, int d) {
  m->npending += d;
  if (m->destroyed) return; /* already off mpg__mpi.live */
  mpg__mpi.pending_total += d;
  if (d > 0 && mpg__mpi.pending_total == d)
    pthread_cond_signal(&mpg__mpi.prog_cond);
}

/* q becomes pending on m (m->pend, for the progress thread), or stops
 * being pending.  Lock held. */
void mpg__mpi_pend_link(mpg__comm *m, mpg__req *q) {
  q->pend_prev = NULL;
  q->pend_next = m->pend;
  if (m->pend) m->pend->pend_prev = q;
  m->pend = q;
  pending_add(m, 1);
  pthread_cond_signal(&mpg__mpi.prog_cond); /* new work for the progress thread */
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

/* Broadcast by the progress thread when a request's MPI part completes
 * (and on abort): waiters sleep on it instead of polling MPI. */
static pthread_cond_t g_done_cond = PTHREAD_COND_INITIALIZER;

void mpg__mpi_wake_waiters(void) { pthread_cond_broadcast(&g_done_cond); }

void mpg__mpi_nap_on_done(const mpg__req *q, double deadline) {
  lock_g();
  if (mpg__mpi.prog_running && !atomic_load(&q->mpi_done) &&
      !atomic_load(&q->comm->aborted)) {
    double left = deadline - mpg__now();
    if (left > MPG_MPI_WAIT_NAP_S) left = MPG_MPI_WAIT_NAP_S;
    if (left < 0) left = 0;
    struct timespec ts = mpg__mpi_time_after(left);
    pthread_cond_timedwait(&g_done_cond, &mpg__mpi.lock, &ts);
  }
  unlock_g();
}

/* ------------------------------------------------------------------ */
/* The progress thread, as its callers see it                          */
/* ------------------------------------------------------------------ */

int mpg__mpi_progress_running(void) { return atomic_load(&mpg__mpi.prog_running); }

int mpg__mpi_progress_idle(void) { return atomic_load(&mpg__mpi.prog_idle); }
