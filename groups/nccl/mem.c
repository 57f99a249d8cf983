/* Device memory and streams of the NCCL backend (the hooks behind
 * mpg_ctx_mem_* and the context's streams): zeroed allocations, plain or
 * registered with the world communicator, and stream create, destroy and
 * ordering.  See nccl_internal.h. */
#include <pthread.h>
#include <stdlib.h>

#include "nccl_internal.h"

/* Zeroed device memory on the communicator's device.  registered = 1:
 * ncclMemAlloc + ncclCommRegister with this (world) communicator, which
 * lets NCCL use zero-copy paths; every rank must then register too. */
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
    struct nccl_reg *r = calloc(1, sizeof *r);
    ncclResult_t nr = r ? ncclMemAlloc(ptr, bytes) : ncclSystemError;
    if (nr != ncclSuccess) {
      free(r);
      st = mpg__nccl_fail(MPG_ERR_NOMEM, "mem_alloc", "ncclMemAlloc", nr);
    } else {
      pthread_mutex_lock(&c->lock);
      nr = c->nccl ? ncclCommRegister(c->nccl, *ptr, bytes, &r->handle) : ncclInvalidUsage;
      if (nr == ncclSuccess) {
        r->ptr = *ptr;
        r->next = c->regs;
        c->regs = r;
      }
      pthread_mutex_unlock(&c->lock);
      if (nr != ncclSuccess) {
        st = mpg__nccl_fail(MPG_ERR_BACKEND, "mem_alloc", "ncclCommRegister", nr);
        (void)ncclMemFree(*ptr);
        *ptr = NULL;
        free(r);
      }
    }
  } else {
    e = cudaMalloc(ptr, bytes);
    if (e != cudaSuccess) {
      *ptr = NULL;
      st = mpg__nccl_fail_cuda(MPG_ERR_NOMEM, "mem_alloc", "cudaMalloc", e);
    }
  }
  if (!st) {
    e = cudaMemset(*ptr, 0, bytes);
    if (e != cudaSuccess) st = mpg__nccl_fail_cuda(MPG_ERR_BACKEND, "mem_alloc", "cudaMemset", e);
  }
  mpg__nccl_dev_leave(c->device, old);
  return st;
}

mpg_status mpg__nccl_mem_free(mpg__comm *c, void *ptr) {
  struct nccl_reg *r = NULL, **pp;
  pthread_mutex_lock(&c->lock);
  for (pp = &c->regs; *pp; pp = &(*pp)->next)
    if ((*pp)->ptr == ptr) {
      r = *pp;
      *pp = r->next;
      break;
    }
  if (r && c->nccl) (void)ncclCommDeregister(c->nccl, r->handle);
  pthread_mutex_unlock(&c->lock);
  if (r) {
    free(r);
    ncclResult_t nr = ncclMemFree(ptr);
    return nr == ncclSuccess ? MPG_OK
                             : mpg__nccl_fail(MPG_ERR_BACKEND, "mem_free", "ncclMemFree", nr);
  }
  cudaError_t e = cudaFree(ptr);
  return e == cudaSuccess ? MPG_OK
                          : mpg__nccl_fail_cuda(MPG_ERR_BACKEND, "mem_free", "cudaFree", e);
}

mpg_status mpg__nccl_mem_zero(void *ptr, size_t bytes, void *stream) {
  cudaError_t e = cudaMemsetAsync(ptr, 0, bytes, (cudaStream_t)stream);
  return e == cudaSuccess ? MPG_OK
                          : mpg__nccl_fail_cuda(MPG_ERR_BACKEND, "mem_zero", "cudaMemsetAsync", e);
}

mpg_status mpg__nccl_stream_create(void **stream) {
  cudaStream_t s;
  cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  if (e != cudaSuccess)
    return mpg__nccl_fail_cuda(MPG_ERR_BACKEND, "stream_create", "cudaStreamCreateWithFlags", e);
  *stream = s;
  return MPG_OK;
}

mpg_status mpg__nccl_stream_destroy(void *stream) {
  cudaError_t e = cudaStreamDestroy((cudaStream_t)stream);
  return e == cudaSuccess ? MPG_OK
                          : mpg__nccl_fail_cuda(MPG_ERR_BACKEND, "stream_destroy",
                                                "cudaStreamDestroy", e);
}

/* waiter waits for what is queued on waitee so far: one event. */
mpg_status mpg__nccl_stream_order(void *waiter, void *waitee) {
  if (waiter == waitee) return MPG_OK;
  cudaEvent_t ev;
  cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
  if (e != cudaSuccess)
    return mpg__nccl_fail_cuda(MPG_ERR_BACKEND, "stream_order", "cudaEventCreate", e);
  e = cudaEventRecord(ev, (cudaStream_t)waitee);
  if (e == cudaSuccess) e = cudaStreamWaitEvent((cudaStream_t)waiter, ev, 0);
  (void)cudaEventDestroy(ev); /* released once the wait has been satisfied */
  return e == cudaSuccess ? MPG_OK
                          : mpg__nccl_fail_cuda(MPG_ERR_BACKEND, "stream_order",
                                                "cudaStreamWaitEvent", e);
}
