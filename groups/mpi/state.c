/* The process-wide state of the MPI backend and its small helpers (layer:
 * the bottom; it calls no other file of the backend): the mpg__mpi
 * variable that the files share (the MPI lock, the tuning read at
 * world_init, the fault flag, the pending work the progress thread
 * drives), the error of a failed MPI call, errors that return on a
 * communicator meshpg did not make, testing requests, a communicator's
 * reference count, and the note that a fault happened. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>

#include "mpi_internal.h"

struct mpg__mpi_state mpg__mpi = {
    .lock = PTHREAD_MUTEX_INITIALIZER,
    .chunk = INT_MAX,
    .piece = MPG_MPI_PIECE_DEFAULT,
    .window = MPG_MPI_WINDOW_NARROW,
    .prog_cond = PTHREAD_COND_INITIALIZER,
};

mpg_status mpg__mpi_fail(int rc, const char *call, const char *what) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS)
    snprintf(text, sizeof text, "MPI error code %d", rc);
  return mpg__fail(MPG_ERR_BACKEND, "%s failed for %s: %s", call, what, text);
}

void mpg__mpi_ret_begin(mpg__mpi_ret *g, MPI_Comm c) {
  g->comm = c;
  g->saved = MPI_ERRHANDLER_NULL;
  g->swapped = 0;
  if (MPI_Comm_get_errhandler(c, &g->saved) != MPI_SUCCESS) {
    g->saved = MPI_ERRHANDLER_NULL;
    return;
  }
  if (g->saved != MPI_ERRORS_RETURN &&
      MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN) == MPI_SUCCESS) {
    g->swapped = 1;
    return;
  }
  MPI_Errhandler_free(&g->saved); /* the reference get_errhandler took */
}

void mpg__mpi_ret_end(mpg__mpi_ret *g) {
  if (!g->swapped) return;
  if (MPI_Comm_set_errhandler(g->comm, g->saved) != MPI_SUCCESS)
    mpg__log(1, "mpi: could not restore the error handler of a communicator");
  MPI_Errhandler_free(&g->saved);
  g->swapped = 0;
}

/* MPI_Request_get_status neither completes a request nor calls an error
 * handler, so a request is completed (MPI_Test) only once it is done, with
 * MPI_COMM_WORLD's errors returning for that one call. */
int mpg__mpi_test_reqs(int n, MPI_Request *reqs, int *flag) {
  *flag = 0;
  for (int i = 0; i < n; i++) {
    if (reqs[i] == MPI_REQUEST_NULL) continue;
    int done = 0;
    int rc = MPI_Request_get_status(reqs[i], &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) return rc;
    if (!done) return MPI_SUCCESS;
    mpg__mpi_ret g;
    mpg__mpi_ret_begin(&g, MPI_COMM_WORLD);
    rc = MPI_Test(&reqs[i], &done, MPI_STATUS_IGNORE);
    mpg__mpi_ret_end(&g);
    if (rc != MPI_SUCCESS) return rc;
    if (!done) return MPI_SUCCESS; /* cannot happen: it was done */
  }
  *flag = 1;
  return MPI_SUCCESS;
}

void mpg__mpi_note_fault(void) { atomic_store(&mpg__mpi.faulted, 1); }

void mpg__mpi_comm_unref(mpg__comm *m) {
  if (--m->refs == 0) free(m);
}
