/* Device memory and streams of the NCCL backend (the hooks behind
 * mpg_ctx_mem_* and the context's streams): zeroed allocations, plain or
 * registered (with every communicator of the context: reg.c), and stream
 * create, destroy and ordering.  See nccl_internal.h. */
#include <pthread.h>
#include <stdlib.h>

#include "nccl_internal.h"

/* Zeroed device memory on the communicator's device.  registered = 1:
 * ncclMemAlloc, registered with every communicator of the context
 * (reg.c), which lets NCCL use zero-copy paths. */
mpg_status mpg__nccl_mem_alloc(mpg__comm *c, size_t bytes, int registered,
                               void **ptr) {
  int old;
  cudaError_t e = mpg__nccl_dev_enter(c->device, &old);
  if (e != cudaSuccess)
    return mpg__nccl_fail_cuda(MPG_ERR_BACKEND, "mem_alloc", "cudaSetDevice", e);
  mpg_status st = MPG_OK;
  *ptr = NULL;
  if (bytes == 0) bytes = 1;
  if (registered) {
    ncclResult_t nr = ncclMemAlloc(ptr, bytes);
    if (nr != ncclSuccess) {
      *ptr = NULL;
      st = mpg__nccl_fail(MPG_ERR_NOMEM, "mem_alloc", "ncclMemAlloc", nr);
    }
  } else {
    e = cudaMalloc(ptr, bytes);
    if (e != cudaSuccess) {
      *ptr = NULL;
      st = mpg__nccl_fail_cuda(MPG_ERR_NOMEM, "mem_alloc", "cudaMalloc", e);
    }
  }
  if (!st) {
    /* cudaMemset runs on the legacy default stream and may return before
     * the device ran it (CUDA Runtime API, "API synchronization
     * behavior"); the legacy stream does not order cudaStreamNonBlocking
     * streams, so a caller's write on one could land before the zeroing.
     * The memory is zero when this returns. */
    e = cudaMemset(*ptr, 0, bytes);
    if (e == cudaSuccess) e = cudaStreamSynchronize(0);
    if (e != cudaSuccess) st = mpg__nccl_fail_cuda(MPG_ERR_BACKEND, "mem_alloc", "cudaMemset", e);
  }
  if (!st && registered) st = mpg__nccl_family_register(c, *ptr, bytes);
  if (st && *ptr) {
    if (registered) (void)ncclMemFree(*ptr);
    else (void)cudaFree(*ptr);
    *ptr = NULL;
  }
  mpg__nccl_dev_leave(c->device, old);
  return st;
}

mpg_status mpg__nccl_mem_free(mpg__comm *c, void *ptr) {
  int old = -1;
  (void)mpg__nccl_dev_enter(c->device, &old);
  mpg_status st = MPG_OK;
  if (mpg__nccl_family_deregister(c, ptr)) {
    ncclResult_t nr = ncclMemFree(ptr);
    if (nr != ncclSuccess) st = mpg__nccl_fail(MPG_ERR_BACKEND, "mem_free", "ncclMemFree", nr);
  } else {
    cudaError_t e = cudaFree(ptr);
    if (e != cudaSuccess) st = mpg__nccl_fail_cuda(MPG_ERR_BACKEND, "mem_free", "cudaFree", e);
  }
  mpg__nccl_dev_leave(c->device, old);
  return st;
}

mpg_status mpg__nccl_mem_zero(mpg__comm *c, void *ptr, size_t bytes, void *stream) {
  int old;
  cudaError_t e = mpg__nccl_dev_enter(c->device, &old);
  if (e == cudaSuccess) {
    e = cudaMemsetAsync(ptr, 0, bytes, (cudaStream_t)stream);
    mpg__nccl_dev_leave(c->device, old);
  }
  return e == cudaSuccess ? MPG_OK
                          : mpg__nccl_fail_cuda(MPG_ERR_BACKEND, "mem_zero", "cudaMemsetAsync", e);
}

/* Synchronous: cudaMemcpy with cudaMemcpyDefault (unified addressing tells
 * host from device) returns once the copy is done. */
mpg_status mpg__nccl_mem_copy(mpg__comm *c, void *dst, const void *src, size_t bytes) {
  if (!bytes) return MPG_OK;
  int old;
  cudaError_t e = mpg__nccl_dev_enter(c->device, &old);
  if (e == cudaSuccess) {
    e = cudaMemcpy(dst, src, bytes, cudaMemcpyDefault);
    mpg__nccl_dev_leave(c->device, old);
  }
  return e == cudaSuccess ? MPG_OK
                          : mpg__nccl_fail_cuda(MPG_ERR_BACKEND, "mem_copy", "cudaMemcpy", e);
}

/* Streams are made on the communicator's device: a stream belongs to the
 * device current when it is created. */
mpg_status mpg__nccl_stream_create(mpg__comm *c, void **stream) {
  int old;
  cudaStream_t s = NULL;
  cudaError_t e = mpg__nccl_dev_enter(c->device, &old);
  if (e == cudaSuccess) {
    e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    mpg__nccl_dev_leave(c->device, old);
  }
  if (e != cudaSuccess)
    return mpg__nccl_fail_cuda(MPG_ERR_BACKEND, "stream_create", "cudaStreamCreateWithFlags", e);
  *stream = s;
  return MPG_OK;
}

mpg_status mpg__nccl_stream_destroy(mpg__comm *c, void *stream) {
  int old;
  cudaError_t e = mpg__nccl_dev_enter(c->device, &old);
  if (e == cudaSuccess) {
    e = cudaStreamDestroy((cudaStream_t)stream);
    mpg__nccl_dev_leave(c->device, old);
  }
  return e == cudaSuccess ? MPG_OK
                          : mpg__nccl_fail_cuda(MPG_ERR_BACKEND, "stream_destroy",
                                                "cudaStreamDestroy", e);
}

/* waiter waits for what is queued on waitee so far: one event, created
 * and recorded on the communicator's device (an event must be recorded on
 * a stream of the device it was created on). */
mpg_status mpg__nccl_stream_order(mpg__comm *c, void *waiter, void *waitee) {
  if (waiter == waitee) return MPG_OK;
  int old;
  cudaError_t e = mpg__nccl_dev_enter(c->device, &old);
  if (e != cudaSuccess)
    return mpg__nccl_fail_cuda(MPG_ERR_BACKEND, "stream_order", "cudaSetDevice", e);
  cudaEvent_t ev;
  e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
  if (e != cudaSuccess) {
    mpg__nccl_dev_leave(c->device, old);
    return mpg__nccl_fail_cuda(MPG_ERR_BACKEND, "stream_order", "cudaEventCreate", e);
  }
  e = cudaEventRecord(ev, (cudaStream_t)waitee);
  if (e == cudaSuccess) e = cudaStreamWaitEvent((cudaStream_t)waiter, ev, 0);
  (void)cudaEventDestroy(ev); /* released once the wait has been satisfied */
  mpg__nccl_dev_leave(c->device, old);
  return e == cudaSuccess ? MPG_OK
                          : mpg__nccl_fail_cuda(MPG_ERR_BACKEND, "stream_order",
                                                "cudaStreamWaitEvent", e);
}

/* Checkpoint staging.  Pinned memory, so that cudaMemcpyAsync is truly
 * asynchronous with respect to the host ([API-SYNC], "Memcpy"); the copies
 * go on the caller's stream, after the work queued there (the optimizer
 * step), and the caller waits with mpg__nccl_stream_sync. */
mpg_status mpg__nccl_host_alloc(mpg__comm *c, size_t bytes, void **ptr) {
  int old;
  *ptr = NULL;
  cudaError_t e = mpg__nccl_dev_enter(c->device, &old);
  if (e == cudaSuccess) {
    e = cudaHostAlloc(ptr, bytes ? bytes : 1, cudaHostAllocPortable);
    mpg__nccl_dev_leave(c->device, old);
  }
  if (e == cudaErrorMemoryAllocation)
    return mpg__fail(MPG_ERR_NOMEM, "host_alloc: cudaHostAlloc of %zu bytes: out of memory",
                     bytes);
  return e == cudaSuccess ? MPG_OK
                          : mpg__nccl_fail_cuda(MPG_ERR_BACKEND, "host_alloc", "cudaHostAlloc", e);
}

mpg_status mpg__nccl_host_free(mpg__comm *c, void *ptr) {
  (void)c;
  if (!ptr) return MPG_OK;
  cudaError_t e = cudaFreeHost(ptr);
  return e == cudaSuccess ? MPG_OK
                          : mpg__nccl_fail_cuda(MPG_ERR_BACKEND, "host_free", "cudaFreeHost", e);
}

mpg_status mpg__nccl_copy_async(mpg__comm *c, void *dst, const void *src, size_t bytes,
                                void *stream) {
  if (!bytes) return MPG_OK;
  int old;
  cudaError_t e = mpg__nccl_dev_enter(c->device, &old);
  if (e == cudaSuccess) {
    e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, (cudaStream_t)stream);
    mpg__nccl_dev_leave(c->device, old);
  }
  return e == cudaSuccess
             ? MPG_OK
             : mpg__nccl_fail_cuda(MPG_ERR_BACKEND, "copy_async", "cudaMemcpyAsync", e);
}

mpg_status mpg__nccl_stream_sync(mpg__comm *c, void *stream) {
  int old;
  cudaError_t e = mpg__nccl_dev_enter(c->device, &old);
  if (e == cudaSuccess) {
    e = cudaStreamSynchronize((cudaStream_t)stream);
    mpg__nccl_dev_leave(c->device, old);
  }
  return e == cudaSuccess ? MPG_OK
                          : mpg__nccl_fail_cuda(MPG_ERR_BACKEND, "stream_sync",
                                                "cudaStreamSynchronize", e);
}
