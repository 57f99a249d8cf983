/* The end of a request in the MPI backend: releasing it and what it owns,
 * at once or, when an operation abandoned unfinished may still use it,
 * later as an orphan (layer: above ring.c, staging.c and pending.c; below
 * ops.c and world.c).
 *
 * A request freed before it finished cannot be released: MPI forbids
 * MPI_Request_free and MPI_Cancel on nonblocking collectives, and MPI may
 * still write its buffers.  Such a request is parked on a process-wide
 * orphan list (an Irecv is cancelled first) with its staging memory;
 * orphans are tested now and then and freed once they complete or once
 * MPI is finalised.  Their buffers are therefore never freed under MPI's
 * feet, and the caller's buffers are free for reuse as soon as the call
 * returns, whatever its status (MPI only ever sees staging memory, see
 * staging.c).  The same list keeps the pending barriers of a rendezvous
 * that timed out, the broadcast of an NCCL bootstrap that did, and the
 * ring scratch of a communicator destroyed once aborted (see world.c). */
#include <sched.h>
#include <stdlib.h>

#include "mpi_internal.h"

static mpg__req *g_orphans; /* guarded by mpg__mpi.lock */

/* Free q and what it owns: it is finished, or MPI is done with it. */
void mpg__mpi_req_release(mpg__req *q) {
  if (q->region) mpg__mpi_region_unref(q->region);
  if (q->region2) mpg__mpi_region_unref(q->region2);
  free(q->a2a);
  free(q->a2a_int);
  if (q->reqs != &q->one) free(q->reqs);
  free(q->stage);
  free(q);
}

/* Orphan a request that cannot be released yet.  Lock held. */
void mpg__mpi_orphan(mpg__req *q) {
  /* A pump may be writing q's buffers without the lock (see
   * mpg__mpi_pump()); the caller may free them as soon as we return: wait
   * for it. */
  while (q->busy_pieces > 0) {
    unlock_g();
    sched_yield();
    pthread_mutex_lock(&mpg__mpi.lock);
  }
  mpg__mpi_purge(q->comm, q);
  for (int i = 0; i < q->nreq; i++) {
    if (q->kind == MPG__RECV && q->reqs[i] != MPI_REQUEST_NULL &&
        MPI_Cancel(&q->reqs[i]) != MPI_SUCCESS) /* legal for point-to-point only */
      mpg__log(1, "mpi: MPI_Cancel failed for an abandoned receive; it stays "
               "until it completes");
  }
  if (q->comm) {
    q->comm->norphans++;
    if (!q->finished) mpg__mpi_pend_unlink(q->comm, q);
    mpg__mpi_comm_unref(q->comm);
    q->comm = NULL;
  }
  q->next = g_orphans;
  g_orphans = q;
}

/* Park a bare pending MPI request (and memory MPI may still write) on the
 * orphan list; with until_finalize, just the memory, until MPI_Finalize.
 * Lock held. */
void mpg__mpi_orphan_request(MPI_Request r, void *mem, int until_finalize) {
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

/* Test every orphan once and free those that completed.  Lock held. */
void mpg__mpi_sweep_orphans(void) {
  if (mpg__mpi.we_finalized) return;
  mpg__req **pp = &g_orphans;
  while (*pp) {
    mpg__req *q = *pp;
    int flag = 0;
    if (!q->dead) {
      int rc = mpg__mpi_test_reqs(q->nreq, q->reqs, &flag);
      if (rc != MPI_SUCCESS) q->dead = 1; /* keep its memory: MPI may own it */
    }
    if (flag) {
      *pp = q->next;
      mpg__mpi_req_release(q);
    } else {
      pp = &q->next;
    }
  }
}

/* After MPI_Finalize nothing can touch the orphans' memory.  Lock held. */
void mpg__mpi_free_orphans(void) {
  while (g_orphans) {
    mpg__req *q = g_orphans;
    g_orphans = q->next;
    mpg__mpi_req_release(q);
  }
}
