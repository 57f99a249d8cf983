/* The NCCL backend's communicator object and the helpers every file of
 * the backend uses: error text, the device switch, the pacing of polls;
 * the communicator's config, creation and references, polling its async
 * state against a deadline, and marking it aborted with its lock held.
 * See nccl_internal.h.
 *
 * Every communicator is non-blocking (config.blocking = 0), so that init,
 * split and enqueue can be bounded by the timeout and aborted; its children
 * share its resources (config.splitShare = 1) only with
 * MESHPG_NCCL_SPLIT_SHARE=1 (mpg__nccl_config below).  After each call
 * that may answer ncclInProgress we poll ncclCommGetAsyncError until the
 * state leaves ncclInProgress or the deadline passes; then the
 * communicator is marked aborted (the generic layer aborts the whole
 * context: lifecycle.c) and the call fails with MPG_ERR_TIMEOUT.  We poll
 * after ncclSuccess too: ncclCommSplit on a
 * non-blocking communicator answers ncclSuccess while its job still runs
 * (seen with NCCL 2.28.3 on an H100), and one ncclCommGetAsyncError costs
 * nothing when all is done. */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nccl_internal.h"

/* ------------------------------------------------------------------ */
/* Helpers every file uses                                            */
/* ------------------------------------------------------------------ */

/* NCCL's own detail for the last failure ("" when it has none). */
const char *mpg__nccl_detail(void) {
  const char *s = ncclGetLastError(NULL); /* comm is unused by NCCL */
  return s ? s : "";
}

mpg_status mpg__nccl_fail(mpg_status st, const char *what, const char *call,
                          ncclResult_t r) {
  const char *d = mpg__nccl_detail();
  return mpg__fail(st, "%s: %s: %s%s%s", what, call, ncclGetErrorString(r),
                   d[0] ? ": " : "", d);
}

mpg_status mpg__nccl_fail_cuda(mpg_status st, const char *what,
                               const char *call, cudaError_t e) {
  (void)cudaGetLastError(); /* clear a non-sticky error for the caller */
  return mpg__fail(st, "%s: %s: %s", what, call, cudaGetErrorString(e));
}

/* Yield for the first polls, then sleep 2 us doubling up to about 1 ms. */
void mpg__nccl_backoff(unsigned *spins) {
  if (*spins < 64) {
    sched_yield();
  } else {
    unsigned k = *spins - 64;
    long ns = 2000L << (k < 9 ? k : 9);
    struct timespec ts = {0, ns};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
  }
  (*spins)++;
}

/* Make `dev` current, remembering the caller's device in *old. */
cudaError_t mpg__nccl_dev_enter(int dev, int *old) {
  cudaError_t e = cudaGetDevice(old);
  if (e != cudaSuccess) return e;
  return *old == dev ? cudaSuccess : cudaSetDevice(dev);
}

void mpg__nccl_dev_leave(int dev, int old) {
  if (old != dev) (void)cudaSetDevice(old);
}

/* ------------------------------------------------------------------ */
/* Communicators: config, references, async state                     */
/* ------------------------------------------------------------------ */

/* splitShare: 0 unless MESHPG_NCCL_SPLIT_SHARE=1 (see world.c).  Sharing
 * saves the memory of each group's channels, but every communicator of
 * the family then runs its kernels through the parent's one device stream,
 * in host issue order: a dp bucket can no longer overlap a tp collective
 * issued on another stream. */
ncclConfig_t mpg__nccl_config(int split_share) {
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0; /* init, split and enqueue may answer ncclInProgress */
  cfg.splitShare = split_share ? 1 : 0;
  return cfg;
}

mpg__comm *mpg__nccl_comm_new(int device, double timeout_s) {
  mpg__comm *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  if (pthread_mutex_init(&c->lock, NULL) != 0) {
    free(c);
    return NULL;
  }
  atomic_init(&c->aborted, MPG_OK);
  atomic_init(&c->abort_state, 0); /* lifecycle.c: no abort started */
  atomic_init(&c->abort_deadline, 0.0);
  atomic_init(&c->refs, 1);
  c->device = device;
  c->timeout_s = timeout_s > 0 ? timeout_s : 600.0;
  return c;
}

void mpg__nccl_comm_unref(mpg__comm *c) {
  if (atomic_fetch_sub(&c->refs, 1) != 1) return;
  pthread_mutex_destroy(&c->lock);
  free(c);
}

/* Lock c for a new NCCL call: wait, with the lock released, while another
 * thread's call on c is settling, unless c was aborted (nccl_internal.h,
 * R2). */
void mpg__nccl_lock(mpg__comm *c) {
  pthread_mutex_lock(&c->lock);
  unsigned spins = 0;
  while (c->settling && atomic_load(&c->aborted) == MPG_OK) {
    pthread_mutex_unlock(&c->lock);
    mpg__nccl_backoff(&spins);
    pthread_mutex_lock(&c->lock);
  }
}

static mpg_status settle_loop(mpg__comm *c, ncclComm_t h, double deadline,
                              ncclResult_t *res);

/* Poll the async state of `h` until it leaves ncclInProgress.  h is c->nccl
 * or a handle c's lock guards (a split parent).  Called and returns with
 * c->lock held; releases it while sleeping so the abort op can get in.
 * Returns MPG_OK with the final state in *res; MPG_ERR_TIMEOUT when still
 * in progress at `deadline`; or the abort reason when c was aborted in the
 * meantime (h is then NCCL's aborter's, or gone). */
mpg_status mpg__nccl_settle_locked(mpg__comm *c, ncclComm_t h,
                                   double deadline, ncclResult_t *res) {
  int outer = !c->settling; /* a split's child polls inside the parent's */
  c->settling = 1;
  mpg_status st = settle_loop(c, h, deadline, res);
  if (outer) c->settling = 0;
  return st;
}

static mpg_status settle_loop(mpg__comm *c, ncclComm_t h, double deadline,
                              ncclResult_t *res) {
  unsigned spins = 0;
  for (;;) {
    ncclResult_t state = ncclInProgress;
    ncclResult_t r = ncclCommGetAsyncError(h, &state);
    if (r != ncclSuccess) {
      *res = r;
      return MPG_OK;
    }
    if (state != ncclInProgress) {
      *res = state;
      return MPG_OK;
    }
    if (mpg__now() > deadline) {
      *res = ncclInProgress;
      return MPG_ERR_TIMEOUT;
    }
    pthread_mutex_unlock(&c->lock);
    mpg__nccl_backoff(&spins);
    pthread_mutex_lock(&c->lock);
    int why = atomic_load(&c->aborted);
    if (why != MPG_OK) {
      *res = ncclInProgress;
      return (mpg_status)why;
    }
  }
}

/* Mark c aborted, with c->lock held: its waiters let go and later calls
 * fail.  The NCCL handle is not aborted here (R8): ncclCommAbort frees
 * device memory, and cudaFree waits for every kernel of the device, those
 * of the context's other communicators included, which may still wait for
 * the same missing peer.  The generic layer follows every failure with
 * mpg__ctx_abort_all, whose abort_comms (lifecycle.c) aborts all of the
 * context's handles at once, on a thread of its own; destroy aborts a
 * handle still left (a backend caller without a context).  Returns 1 if
 * this call set the flag. */
int mpg__nccl_abort_locked(mpg__comm *c, mpg_status reason) {
  int expected = MPG_OK;
  if (reason == MPG_OK) reason = MPG_ERR_ABORTED;
  return atomic_compare_exchange_strong(&c->aborted, &expected, (int)reason);
}

/* Join PTX pieces, load them as one library (kept loaded for the life of
 * the process) and look up n kernels by name.  On failure *call names the
 * CUDA call that failed. */
cudaError_t mpg__nccl_load_ptx(const char *const *pieces, size_t npieces,
                               const char *const *names, int n, cudaKernel_t *out,
                               const char **call) {
  size_t len = 1;
  for (size_t i = 0; i < npieces; i++) len += strlen(pieces[i]);
  char *ptx = malloc(len);
  if (!ptx) {
    *call = "malloc (PTX kernels)";
    return cudaErrorMemoryAllocation;
  }
  ptx[0] = '\0';
  for (size_t i = 0; i < npieces; i++) strcat(ptx, pieces[i]);
  cudaLibrary_t lib;
  cudaError_t e = cudaLibraryLoadData(&lib, ptx, NULL, NULL, 0, NULL, NULL, 0);
  free(ptx);
  if (e != cudaSuccess) {
    *call = "cudaLibraryLoadData";
    return e;
  }
  for (int i = 0; i < n; i++)
    if ((e = cudaLibraryGetKernel(&out[i], lib, names[i])) != cudaSuccess) {
      *call = "cudaLibraryGetKernel";
      return e;
    }
  return cudaSuccess;
}

mpg_status mpg__nccl_launch_elementwise(cudaKernel_t kernel, void *dst, const void *src,
                                        size_t count, double scale, cudaStream_t s,
                                        const char *what, const char *call) {
  uint64_t n = count;
  void *args[4] = {&dst, &src, &n, &scale};
  uint64_t blocks = (n + 255) / 256;
  dim3 grid = {(unsigned)(blocks < 4096 ? blocks : 4096), 1, 1};
  dim3 block = {256, 1, 1};
  cudaError_t e = cudaLaunchKernel((const void *)kernel, grid, block, args, 0, s);
  return e == cudaSuccess ? MPG_OK : mpg__nccl_fail_cuda(MPG_ERR_BACKEND, what, call, e);
}
