/* CUDA_TRY for the workers that copy to and from CUDA memory
 * (tests/groups/nccl_mpi_worker.c, tests/cluster/cluster_nccl_worker.c):
 * a failed CUDA runtime call is reported like a failed meshpg call
 * (worker_report.h's TRY) and jumps to the caller's `done` label.  Header
 * only. */
#ifndef MPG_TESTS_SUPPORT_CUDA_REPORT_H
#define MPG_TESTS_SUPPORT_CUDA_REPORT_H

#include <cuda_runtime_api.h>

#include "worker_report.h"

#define CUDA_TRY(call)                                                                   \
  do {                                                                                   \
    cudaError_t e_ = (call);                                                             \
    if (e_ != cudaSuccess) {                                                             \
      fail("line %d: %s -> %s", __LINE__, #call, cudaGetErrorString(e_));                \
      goto done;                                                                         \
    }                                                                                    \
  } while (0)

#endif
