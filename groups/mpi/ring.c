/* meshpg's own pipelined ring all-reduce, which the MPI backend runs for
 * all-reduces larger than one piece (mpg__mpi.piece bytes, 4 MiB by
 * default): the request is cut into pieces (struct piece), queued in one
 * FIFO per communicator and started in that order on every member, at
 * most mpg__mpi.window in flight; each piece is staged, all-reduced over
 * MPI point-to-point, divided and copied out on its own, behind the
 * communication of the others.  The pieces advance in mpg__mpi_pump(),
 * called from every test of a request and by the progress thread (layer:
 * above state.c and pending.c; below orphans.c, ops.c and progress.c).
 *
 * The ring.  A piece's count elements are cut into size chunks (chunk i
 * is [count * i / size, count * (i + 1) / size)).  Reduce-scatter: at step
 * s (0 .. size - 2) rank r sends chunk r - s to its right neighbour and
 * receives chunk r - s - 1 from its left one into scratch, then reduces it
 * into its own copy; after size - 1 steps it holds chunk r + 1 fully
 * reduced (an average is divided in that last step, fold_div(), so that
 * no divide pass follows).  All-gather: at step t it sends chunk r + 1 - t and receives
 * chunk r - t straight into place (indices mod size).  Every message is
 * an MPI_Isend / MPI_Irecv pair on the piece's tag (distinct for the
 * pieces in flight together; messages between two ranks on one tag
 * arrive in order, so consecutive steps cannot be confused).  Each rank
 * moves 2 (size - 1) / size of the piece each way, the bandwidth-optimal
 * all-reduce, and no memory is allocated per operation: Open MPI's own
 * nonblocking all-reduce allocates a message-sized temporary every call,
 * which with glibc's trim thresholds faults in fresh pages step after
 * step. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpi_internal.h"

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

/* Is q's average folded into the last reduce-scatter step?  Its chunk's
 * sum is final there, so the rank divides it once before the all-gather
 * hands it out, and no divide pass over the piece follows (f32 sums, the
 * sync's case; the quotient is the same as the divide pass's). */
static int fold_div(const mpg__comm *m, const mpg__req *q) {
  return q->piece_div && m->size >= 2 && q->work_dtype == MPG_F32 &&
         q->rop != MPG_OP_MAX && q->rop != MPG_OP_MIN;
}

/* pc's current step completed: reduce what it received.  Lock held. */
static void ring_reduce(mpg__comm *m, struct piece *pc) {
  int p = m->size, r = m->rank, s = pc->step;
  if (s >= p - 1) return;
  mpg__req *q = pc->q;
  size_t ws = mpg__dtype_size(q->work_dtype);
  int recv_i = ((r - s - 1) % p + p) % p;
  size_t r0 = chunk_start(pc, p, recv_i), r1 = chunk_start(pc, p, recv_i + 1);
  char *acc = q->wire + (pc->off + r0) * ws;
  const char *x = m->scratch + (size_t)pc->scratch * m->scratch_slot;
  /* The library's one reduction step (groups/reduce.c); the piece was
   * pre-multiplied when it was staged, so no scale here. */
  mpg__reduce_step(q->work_dtype, q->rop, acc, x, r1 - r0, 0, 0, 1.0,
                   s == p - 2 && fold_div(m, q) ? q->piece_div : 0);
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

/* Piece pc completed: divide it (unless folded), then copy or narrow it
 * out.  Called without the lock (pc is busy, see mpg__mpi_pump()). */
static void piece_done(const mpg__comm *m, struct piece *pc) {
  mpg__req *q = pc->q;
  size_t es = mpg__dtype_size(q->dtype);
  size_t ws = mpg__dtype_size(q->work_dtype);
  char *w = q->wire + pc->off * ws;
  size_t n = (size_t)pc->count;
  char *dst = (char *)q->dst + pc->off * es;
  if (q->piece_div && !fold_div(m, q)) mpg__divide(q->work_dtype, w, n, q->piece_div);
  if (q->piece_fin == FIN_NARROW)
    mpg__half_narrow(q->dtype, (const float *)w, dst, n);
  else if (dst != w)
    memcpy(dst, w, n * es);
}

/* The scratch of m: MPG_MPI_WINDOW_MAX slots, each one chunk of the largest
 * piece.  Lock held. */
static int scratch_ready(mpg__comm *m) {
  if (m->scratch) return 1;
  size_t slot = (mpg__mpi.piece / (size_t)m->size + 64 + 63) & ~(size_t)63;
  m->scratch = malloc(slot * MPG_MPI_WINDOW_MAX);
  if (!m->scratch) return 0;
  m->scratch_slot = slot;
  return 1;
}

/* Advance every piece in flight by as many steps as have completed, and
 * start queued ones up to the window.  Lock held on entry and exit, but
 * released around the arithmetic of a completed step (the reduction of
 * a received chunk; the divide and copy-out of a finished piece), which
 * takes up to milliseconds per call: holding the lock meanwhile would
 * stall every other MPI call of the process, a trainer's mark_ready included.
 * The piece is marked busy meanwhile: other pumps skip it,
 * mpg__mpi_purge() leaves it to this pump (dropped), and mpg__mpi_orphan()
 * (orphans.c) waits for it, so the memory it works on stays valid.  Called from every test of a request of this
 * communicator and by the progress thread. */
int mpg__mpi_pump(mpg__comm *m) {
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
        unlock_g();
        ring_reduce(m, pc);
        if (final) piece_done(m, pc);
        pthread_mutex_lock(&mpg__mpi.lock);
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
  while (m->nflight < mpg__mpi.window && m->queue && !atomic_load(&m->aborted)) {
    struct piece *pc = m->queue;
    if (!scratch_ready(m)) {
      if (!pc->q->pipe_rc) pc->q->pipe_rc = MPI_ERR_NO_MEM;
      break;
    }
    int k = 0;
    while (k < MPG_MPI_WINDOW_MAX && m->scratch_busy[k]) k++;
    if (k == MPG_MPI_WINDOW_MAX) break; /* slots held by abandoned pieces */
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
void mpg__mpi_purge(mpg__comm *m, mpg__req *q) {
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
int mpg__mpi_queue_allreduce(mpg__req *q, mpg__comm *m, size_t ws) {
  size_t n = q->count;
  size_t per = mpg__mpi.piece / ws;
  if (per > (size_t)mpg__mpi.chunk) per = (size_t)mpg__mpi.chunk;
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
  if (!mpg__mpi_progress_running()) mpg__mpi_pump(m);
  return q->pipe_rc;
}

int mpg__mpi_pipelined(size_t n, size_t es) {
  return n * es > mpg__mpi.piece;
}

size_t mpg__mpi_npieces(size_t n, size_t es) {
  size_t per = mpg__mpi.piece / es;
  if (per > (size_t)mpg__mpi.chunk) per = (size_t)mpg__mpi.chunk;
  return (n + per - 1) / per;
}

/* Who q's ring waits for.  A piece in flight at step s waits for its left
 * neighbour's message of that step.  A member that never arrives stalls
 * the ring step by step: its right neighbour waits at step 0, the next one
 * at step 1, ..., so the member this rank's wait traces back to is
 * position (rank - 1 - s) mod size (exact when a single member is
 * missing).  Lock held. */
void mpg__mpi_ring_detail(mpg__comm *m, mpg__req *q, char *buf, size_t n) {
  int p = m->size, r = m->rank;
  buf[0] = '\0';
  if (n == 0) return;
  for (int i = 0; i < m->nflight; i++) {
    struct piece *pc = m->flight[i];
    if (pc->q != q || pc->busy) continue;
    int flag = 0;
    if (q->reqs[pc->slot] != MPI_REQUEST_NULL &&
        MPI_Test(&q->reqs[pc->slot], &flag, MPI_STATUS_IGNORE) == MPI_SUCCESS && flag)
      continue; /* received: it waits on its own send */
    int left = (r + p - 1) % p;
    int stalled = ((r - 1 - (pc->step < p - 1 ? pc->step : p - 2)) % p + p) % p;
    snprintf(buf, n,
             "; ring step %d of %d (piece at element %zu): position %d (left neighbour) "
             "never sent it; the ring stalls from position %d, which never arrived "
             "(if one member is missing)",
             pc->step, 2 * (p - 1), pc->off, left, stalled);
    return;
  }
  if (q->unposted)
    snprintf(buf, n, "; %d ring pieces not started (earlier ones of this communicator "
             "are stuck)", q->unposted);
}
