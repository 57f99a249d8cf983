/* The process-wide state of the MPI backend and its small helpers (layer:
 * the bottom; it calls no other file of the backend): the mpg__mpi
 * variable that the files share (the MPI lock, the tuning read at
 * world_init, the fault flag, the pending work the progress thread
 * drives), the error of a failed MPI call, a communicator's reference
 * count, and the note that a fault happened. */
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

void mpg__mpi_note_fault(void) { atomic_store(&mpg__mpi.faulted, 1); }

void mpg__mpi_comm_unref(mpg__comm *m) {
  if (--m->refs == 0) free(m);
}
