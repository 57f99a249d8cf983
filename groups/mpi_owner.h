/* MPI ownership: the only entry points into groups/mpi/ for code outside
 * it (the NCCL backend's MPI bootstrap).  Defined in groups/mpi/world.c.
 *
 * The rule, kept in that one file:
 *   - meshpg initialises MPI only when nobody has, at most once per
 *     process, and registers then one atexit handler that finalises it;
 *   - MPI that the application initialised is never finalised by meshpg;
 *   - MPI that meshpg initialised is finalised exactly once: early, when
 *     the last hold on it is released after a clean run, else at exit;
 *   - never before exit after a fault (a timeout or an abort anywhere in
 *     meshpg's use of MPI).  In Open MPI MPI_Finalize is a job-wide
 *     rendezvous that a faulted peer may never reach, so a destroy must
 *     not enter it; and a process that exits without it makes mpirun kill
 *     the job.  So after a fault only the atexit handler finalises.
 * Holds: each world of the MPI backend holds MPI until it is destroyed.
 * The NCCL bootstrap holds it until the process ends: it keeps no handle
 * to release, and a later context may bootstrap through MPI again.
 *
 * This header does not define the MPI backend's structs, so that a file
 * with a `struct mpg__comm` of its own (the NCCL backend) may include it.
 * Built only with MPI (MPG_HAVE_MPI). */
#ifndef MPG_GROUPS_MPI_OWNER_H
#define MPG_GROUPS_MPI_OWNER_H

#include <mpi.h>

/* Initialise MPI at thread level `level` unless it is initialised already
 * (by the application or by meshpg), and hold it until exit.  Takes the
 * MPI lock.  Returns MPI_SUCCESS, MPI_Init_thread's error code, or
 * MPI_ERR_OTHER when MPI was finalised already (it cannot be initialised
 * again). */
int mpg__mpi_acquire(int level);

/* Outcome of mpg__mpi_bcast_bytes. */
enum mpg__mpi_bcast_result {
  MPG__MPI_BCAST_DONE,
  MPG__MPI_BCAST_POST_FAILED, /* MPI_Ibcast failed */
  MPG__MPI_BCAST_TEST_FAILED, /* MPI_Test failed */
  MPG__MPI_BCAST_TIMEOUT      /* not done by the deadline */
};

/* Broadcast `bytes` bytes of buf from rank 0 of `comm` to every rank of
 * it: MPI_Ibcast on a staging copy, MPI_Test polled (under the MPI lock)
 * until done or `deadline` (mpg__now() seconds).  MPI must be held.  A
 * broadcast that fails a test or misses the deadline cannot be cancelled:
 * it and its staging copy are parked on the orphan list and a fault is
 * noted (see the rule above); buf is untouched then. */
enum mpg__mpi_bcast_result mpg__mpi_bcast_bytes(MPI_Comm comm, void *buf,
                                                int bytes, double deadline);

#endif
