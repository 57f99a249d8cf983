/* Helpers of the Criterion suites that start real mpirun jobs
 * (tests/groups/test_mpi.c, tests/sync/test_sync_mpi.c and the other
 * suites with an MPI worker).  Header only: the command prefix. */
#ifndef MPG_TESTS_MPIRUN_UTIL_H
#define MPG_TESTS_MPIRUN_UTIL_H

#include "run_util.h"

/* Shared-memory transports only, no binding: the tests run on small,
 * shared machines without a network. */
#define MPIRUN "mpirun --oversubscribe --bind-to none --mca btl self,vader " \
               "--mca btl_vader_single_copy_mechanism none "

#endif
