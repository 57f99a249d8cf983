/* The communicator lifecycle of the NCCL backend after the world: split,
 * abort and destroy; and the backend's function table.  See
 * nccl_internal.h.
 *
 * Every group after the world is made by ncclCommSplit of the world (no id).
 *
 * Children are split with splitShare = 0 unless MESHPG_NCCL_SPLIT_SHARE=1
 * (world.c explains the choice).
 *
 * Abort: ncclCommAbort.  With splitShare the communicators of one family
 * share NCCL's resources, and aborting one may leave the others unusable;
 * without it a peer stuck in another group's collective would still hang
 * that group: the generic layer (groups/setup.c, mpg__ctx_abort_all)
 * therefore always aborts the whole context, never one group.  Each communicator has
 * a mutex held around every NCCL call on it (released while polling), so
 * abort never runs while another of our threads is inside NCCL for that
 * communicator.
 *
 * The abort op never blocks (mpg_ctx_abort is a watchdog's call): it raises
 * every communicator's `aborted` flag, which each waiter of ours polls, and
 * hands the NCCL calls to a detached thread (abort_comms below), because
 * NCCL's abort frees device memory synchronously and cudaFree waits for
 * every kernel of the device.  destroy waits for that thread at most the
 * timeout from the abort's start; past it, destroy returns MPG_ERR_TIMEOUT
 * and the thread frees what is left when NCCL returns.
 *
 * The context's communicators are aborted together, inside one
 * ncclGroupStart/ncclGroupEnd (abort_comms).  Aborted one after another,
 * the first ncclCommAbort frees its device memory, and cudaFree waits for
 * every kernel of the device: a kernel of the second communicator still
 * spinning for a dead or hung peer then blocks the first abort forever
 * (meshpg's R8; NVIDIA/nccl issues 549 and 1013, pull request 564).  In
 * NCCL 2.28, ncclCommAbort raises the communicator's abort flags at once
 * (src/init.cc, setCommAbortFlags, called before anything is freed) and
 * hands the freeing to an async job (ncclAsyncLaunch, src/group.cc), which
 * inside a group runs only at the outermost ncclGroupEnd.  So within one
 * group every kernel of every communicator is told to quit before any
 * memory is freed. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include "nccl_internal.h"

/* ------------------------------------------------------------------ */
/* split                                                              */
/* ------------------------------------------------------------------ */

/* The new group's communicator (colour >= 0), its handle's cell, p's device made current. */
static mpg_status split_prepare(mpg__comm *p, int color, const char *what, mpg__comm **group_out,
                                ncclComm_t **cell_out, ncclConfig_t *cfg, int *prev_dev) {
  mpg__comm *group = NULL;
  if (color >= 0) {
    group = mpg__nccl_comm_new(p->device, p->timeout_s);
    if (!group) return mpg__fail(MPG_ERR_NOMEM, "%s: out of memory", what);
    group->split_share = p->split_share;
  }
  /* NCCL writes the new handle from its init thread when the job ends.
   * The cell is on the heap: after a timeout it is left to that thread
   * (a few bytes, once per aborted context) rather than freed under it. */
  ncclComm_t *cell = calloc(1, sizeof *cell);
  if (!cell) {
    if (group) mpg__nccl_comm_unref(group);
    return mpg__fail(MPG_ERR_NOMEM, "%s: out of memory", what);
  }
  *cfg = mpg__nccl_config(p->split_share);
  cudaError_t ce = mpg__nccl_dev_enter(p->device, prev_dev);
  if (ce != cudaSuccess) {
    free(cell);
    if (group) mpg__nccl_comm_unref(group);
    return mpg__nccl_fail_cuda(MPG_ERR_BACKEND, what, "cudaSetDevice", ce);
  }
  *group_out = group;
  *cell_out = cell;
  return MPG_OK;
}

/* ncclCommSplit of p's handle into *cell, settled; p marked aborted on a timeout (lock held). */
static mpg_status split_call_locked(mpg__comm *p, int color, int key, ncclComm_t *cell,
                                    ncclConfig_t *cfg, double deadline, ncclResult_t *res) {
  mpg_status st = MPG_OK;
  *res = ncclCommSplit(p->nccl, color >= 0 ? color : NCCL_SPLIT_NOCOLOR, key, cell, cfg);
  /* The split runs as a job of the parent: poll the parent.  NCCL 2.28
   * answers ncclSuccess here while the job still runs, so always poll. */
  if (*res == ncclSuccess || *res == ncclInProgress)
    st = mpg__nccl_settle_locked(p, p->nccl, deadline, res);
  if (st == MPG_ERR_TIMEOUT) mpg__nccl_abort_locked(p, MPG_ERR_TIMEOUT);
  return st;
}

/* Wait, bounded, until NCCL's init thread has stored the child's handle in *cell. */
static mpg_status split_wait_cell(mpg__comm *p, ncclComm_t *cell, double deadline) {
  mpg_status st = MPG_OK;
  unsigned spins = 0;
  while (!__atomic_load_n(cell, __ATOMIC_ACQUIRE) && st == MPG_OK) {
    if (mpg__now() > deadline) st = MPG_ERR_TIMEOUT;
    else if (atomic_load(&p->aborted) != MPG_OK) st = (mpg_status)atomic_load(&p->aborted);
    else mpg__nccl_backoff(&spins);
  }
  return st;
}

/* Wait, bounded, until the child's init leaves ncclInProgress; *res: its outcome. */
static mpg_status split_wait_init(ncclComm_t child, double deadline, ncclResult_t *res) {
  mpg_status st = MPG_OK;
  ncclResult_t state = ncclInProgress;
  unsigned spins = 0;
  while ((*res = ncclCommGetAsyncError(child, &state)) == ncclSuccess &&
         state == ncclInProgress && st == MPG_OK) {
    if (mpg__now() > deadline) st = MPG_ERR_TIMEOUT;
    else mpg__nccl_backoff(&spins);
  }
  if (*res == ncclSuccess) *res = state == ncclInProgress ? ncclSuccess : state;
  return st;
}

/* The error of a failed split (st, else NCCL's res), once it is cleaned up. */
static mpg_status split_failed(const mpg__comm *p, const char *what, mpg_status st,
                               ncclResult_t res) {
  if (st == MPG_ERR_TIMEOUT)
    return mpg__fail(MPG_ERR_TIMEOUT,
                     "%s: not every rank of the parent entered the split "
                     "within %.3g s (the context is being aborted)",
                     what, p->timeout_s);
  if (st != MPG_OK) return mpg__fail(st, "%s: aborted while splitting", what);
  return mpg__nccl_fail(MPG_ERR_BACKEND, what, "ncclCommSplit", res);
}

/* Give group the child's handle, rank, size and the context's buffers (dropped on failure). */
static mpg_status split_adopt(mpg__comm *group, const mpg__comm *p, ncclComm_t child,
                              const char *what) {
  group->nccl = child;
  int count = 0, rank = -1;
  ncclResult_t res = ncclCommCount(child, &count);
  if (res == ncclSuccess) res = ncclCommUserRank(child, &rank);
  if (res != ncclSuccess) {
    (void)ncclCommAbort(child);
    group->nccl = NULL;
    mpg__nccl_comm_unref(group);
    return mpg__nccl_fail(MPG_ERR_BACKEND, what, "ncclCommCount/ncclCommUserRank", res);
  }
  group->size = count;
  group->rank = rank;
  /* The context's registered buffers are registered with the new group too
   * (reg.c: NCCL's registrations are per communicator). */
  mpg_status joined = mpg__nccl_family_join(group, p);
  if (joined) {
    (void)ncclCommAbort(child);
    group->nccl = NULL;
    mpg__nccl_comm_unref(group);
    return joined;
  }
  return MPG_OK;
}

static mpg_status nccl_split(mpg__comm *p, int color, int key,
                             mpg__comm **out) {
  *out = NULL;
  char what[160];
  snprintf(what, sizeof what, "nccl split (colour %d, key %d) of rank %d of a group of %d",
           color, key, p->rank, p->size);
  int parent_abort = atomic_load(&p->aborted);
  if (parent_abort != MPG_OK)
    return mpg__fail(MPG_ERR_ABORTED, "%s: the parent communicator was aborted (%s)",
                     what, mpg_status_name((mpg_status)parent_abort));
  double deadline = mpg__now() + p->timeout_s;
  mpg__comm *group = NULL; /* the new group's communicator; none for colour < 0 */
  ncclComm_t *cell = NULL;
  ncclConfig_t cfg;
  int prev_dev = -1;
  mpg_status st = split_prepare(p, color, what, &group, &cell, &cfg, &prev_dev);
  if (st != MPG_OK) return st;
  mpg__nccl_lock(p);
  if (!p->nccl) {
    pthread_mutex_unlock(&p->lock);
    mpg__nccl_dev_leave(p->device, prev_dev);
    free(cell);
    if (group) mpg__nccl_comm_unref(group);
    return mpg__fail(MPG_ERR_ABORTED, "%s: the parent communicator is gone", what);
  }
  ncclResult_t res = ncclSuccess;
  st = split_call_locked(p, color, key, cell, &cfg, deadline, &res);
  pthread_mutex_unlock(&p->lock);

  /* NCCL stores the child from its init thread as the job ends; once the
   * parent has settled it is there.  Both waits below are bounded and run
   * without the parent's lock, so the abort op is never held up. */
  if (st == MPG_OK && res == ncclSuccess && color >= 0) st = split_wait_cell(p, cell, deadline);
  ncclComm_t child = __atomic_load_n(cell, __ATOMIC_ACQUIRE);
  if (st == MPG_OK) free(cell); /* else NCCL may still write it */
  if (st == MPG_OK && res == ncclSuccess && child) st = split_wait_init(child, deadline, &res);
  if (st == MPG_ERR_TIMEOUT) {
    /* Marked only: the context aborts every handle together (R8). */
    pthread_mutex_lock(&p->lock);
    mpg__nccl_abort_locked(p, MPG_ERR_TIMEOUT);
    pthread_mutex_unlock(&p->lock);
  }

  if (st != MPG_OK || res != ncclSuccess) {
    if (child) (void)ncclCommAbort(child);
    mpg__nccl_dev_leave(p->device, prev_dev);
    if (group) mpg__nccl_comm_unref(group);
    return split_failed(p, what, st, res);
  }
  mpg__nccl_dev_leave(p->device, prev_dev);
  if (color < 0) {
    if (child) (void)ncclCommAbort(child); /* not expected with NOCOLOR */
    mpg__log(2, "nccl: rank %d joined no group in a split", p->rank);
    return MPG_OK;
  }
  if (!child) {
    mpg__nccl_comm_unref(group);
    return mpg__fail(MPG_ERR_BACKEND, "%s: ncclCommSplit gave no communicator",
                     what);
  }
  st = split_adopt(group, p, child, what);
  if (st != MPG_OK) return st;
  mpg__log(2, "nccl: split colour %d key %d -> rank %d of %d", color, key, group->rank,
           group->size);
  *out = group;
  return MPG_OK;
}

/* ------------------------------------------------------------------ */
/* abort / destroy                                                    */
/* ------------------------------------------------------------------ */

/* abort_state of a communicator (nccl_internal.h). */
enum { ABORT_NONE, ABORT_PENDING, ABORT_DONE, ABORT_ORPHANED };

static atomic_int aborts_running; /* aborter threads alive (tests wait for 0) */

int mpg__nccl_aborts_running(void) { return atomic_load(&aborts_running); }

/* One abort: the communicators whose abort_state this abort moved to
 * ABORT_PENDING, each with a reference held for the aborter. */
typedef struct abort_job {
  int n;
  mpg_status reason;
  mpg__comm *cs[];
} abort_job;

/* The NCCL part of an abort: every handle aborted inside one group (see the
 * top of this file), then each communicator handed back to destroy
 * (ABORT_DONE), or, when destroy stopped waiting (ABORT_ORPHANED), the
 * scratch word it left is freed here.  ncclGroupEnd may block for as long
 * as a kernel of the device runs (cudaFree), forever for a stuck one: it
 * runs on the aborter thread, never on the caller's. */
static void abort_run(abort_job *j) {
  ncclResult_t r = ncclGroupStart();
  for (int i = 0; i < j->n; i++) {
    mpg__comm *c = j->cs[i];
    pthread_mutex_lock(&c->lock);
    if (c->nccl) {
      int old = -1;
      (void)mpg__nccl_dev_enter(c->device, &old);
      (void)ncclCommAbort(c->nccl); /* flags raised now; freed at the group's end */
      c->nccl = NULL;
      mpg__nccl_dev_leave(c->device, old);
      mpg__log(1, "nccl: rank %d of a group of %d aborted (%s)", c->rank, c->size,
               mpg_status_name(j->reason));
    }
    pthread_mutex_unlock(&c->lock);
  }
  if (r == ncclSuccess) (void)ncclGroupEnd(); /* blocking: the abort's cudaFree */
  for (int i = 0; i < j->n; i++) {
    mpg__comm *c = j->cs[i];
    int pending = ABORT_PENDING;
    if (!atomic_compare_exchange_strong(&c->abort_state, &pending, ABORT_DONE)) {
      /* Orphaned: destroy has returned, and left the scratch word to us. */
      pthread_mutex_lock(&c->lock);
      if (c->scratch) {
        int old = -1;
        (void)mpg__nccl_dev_enter(c->device, &old);
        (void)cudaFree(c->scratch);
        c->scratch = NULL;
        mpg__nccl_dev_leave(c->device, old);
      }
      pthread_mutex_unlock(&c->lock);
      mpg__log(1, "nccl: rank %d of a group of %d: its abort returned after destroy "
               "stopped waiting; its memory is freed now", c->rank, c->size);
    }
    mpg__nccl_comm_unref(c);
  }
  free(j);
}

static void *aborter_main(void *arg) {
  abort_run(arg);
  atomic_fetch_sub(&aborts_running, 1); /* last: nothing of the job is left */
  return NULL;
}

/* Abort n communicators as one step (see the top of this file), without
 * blocking the caller (backend.h: "Never blocks"): the flags are raised
 * here, so that every waiter of ours fails with the reason within one poll
 * and every later call fails at once; NCCL's part (ncclCommAbort of each
 * handle in one group) runs on a detached thread of its own, because NCCL
 * runs an abort's cleanup synchronously: ncclCommAbort sets destroyFlag
 * (src/init.cc:2516) before its ncclAsyncLaunch (init.cc:2533), which
 * forces the group blocking (src/group.cc:52-53), so the outermost
 * ncclGroupEnd runs commReclaim -> commCleanup -> commFree in the calling
 * thread (group.cc:740-743), and commFree's cudaFree waits for every kernel
 * of the device (init.cc:296), another library's stuck kernel included.
 * destroy waits for that thread, bounded (nccl_destroy).  A communicator
 * whose abort already started is skipped.  Without memory or a thread the
 * abort runs here, blocking as before. */
static void nccl_abort_comms(mpg__comm *const *cs, int n, mpg_status reason) {
  if (reason == MPG_OK) reason = MPG_ERR_ABORTED;
  for (int i = 0; i < n; i++) {
    int expected = MPG_OK;
    if (cs[i]) atomic_compare_exchange_strong(&cs[i]->aborted, &expected, (int)reason);
  }
  abort_job *j = malloc(sizeof *j + (size_t)(n > 0 ? n : 1) * sizeof j->cs[0]);
  if (!j) {
    /* Out of memory: abort here (blocking), as one group still. */
    ncclResult_t r = ncclGroupStart();
    for (int i = 0; i < n; i++) {
      mpg__comm *c = cs[i];
      if (!c) continue;
      pthread_mutex_lock(&c->lock);
      if (c->nccl && atomic_load(&c->abort_state) == ABORT_NONE) {
        int old = -1;
        (void)mpg__nccl_dev_enter(c->device, &old);
        (void)ncclCommAbort(c->nccl);
        c->nccl = NULL;
        mpg__nccl_dev_leave(c->device, old);
      }
      pthread_mutex_unlock(&c->lock);
    }
    if (r == ncclSuccess) (void)ncclGroupEnd();
    return;
  }
  j->n = 0;
  j->reason = reason;
  double now = mpg__now();
  for (int i = 0; i < n; i++) {
    mpg__comm *c = cs[i];
    if (!c) continue;
    pthread_mutex_lock(&c->lock);
    double timeout = c->timeout_s;
    pthread_mutex_unlock(&c->lock);
    atomic_store(&c->abort_deadline, now + timeout);
    int none = ABORT_NONE;
    if (!atomic_compare_exchange_strong(&c->abort_state, &none, ABORT_PENDING)) continue;
    atomic_fetch_add(&c->refs, 1);
    j->cs[j->n++] = c;
  }
  if (j->n == 0) {
    free(j);
    return;
  }
  int count = j->n; /* j is the thread's once it starts */
  atomic_fetch_add(&aborts_running, 1);
  pthread_attr_t attr;
  pthread_t th;
  int started = pthread_attr_init(&attr) == 0;
  if (started) {
    started = pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED) == 0 &&
              pthread_create(&th, &attr, aborter_main, j) == 0;
    pthread_attr_destroy(&attr);
  }
  if (started) {
    mpg__log(1, "nccl: aborting %d communicator%s (%s) on a thread of its own", count,
             count == 1 ? "" : "s", mpg_status_name(reason));
    return;
  }
  mpg__log(1, "nccl: no thread for the abort: ncclCommAbort runs in the caller");
  aborter_main(j);
}

static void nccl_abort(mpg__comm *c, mpg_status reason) {
  if (c) nccl_abort_comms(&c, 1, reason);
}

/* Wait for c's pending abort, by its abort_state, at most until its deadline
 * (the abort's start + the timeout): 1 when destroy may go on, 0 when it
 * stopped waiting (c is then ABORT_ORPHANED: the aborter frees the rest). */
static int abort_settled(mpg__comm *c) {
  if (atomic_load(&c->abort_state) != ABORT_PENDING) return 1;
  double deadline = atomic_load(&c->abort_deadline);
  unsigned spins = 0;
  while (atomic_load(&c->abort_state) == ABORT_PENDING && mpg__now() < deadline)
    mpg__nccl_backoff(&spins);
  int pending = ABORT_PENDING;
  return !atomic_compare_exchange_strong(&c->abort_state, &pending, ABORT_ORPHANED);
}

static mpg_status nccl_destroy(mpg__comm *c) {
  if (!c) return MPG_OK;
  mpg_status st = MPG_OK;
  if (!abort_settled(c)) {
    /* NCCL's abort still runs (a kernel of the device never finishes):
     * leave the handle and the scratch word to the aborter thread, which
     * holds its own reference to c. */
    st = mpg__fail(MPG_ERR_TIMEOUT,
                   "nccl destroy (rank %d of a group of %d): its abort, ncclCommAbort "
                   "on a thread of its own, has not returned within the timeout (%.3g s): "
                   "NCCL frees the communicator's device memory with cudaFree, which "
                   "waits for every kernel of CUDA device %d, and one of them does not "
                   "finish (another library's, or another context's); what is left of "
                   "the communicator is freed when the abort returns",
                   c->rank, c->size, c->timeout_s, c->device);
    mpg__nccl_family_leave(c); /* no NCCL call: its handle is the aborter's */
    mpg__nccl_comm_unref(c);
    return st;
  }
  int old = -1;
  (void)mpg__nccl_dev_enter(c->device, &old);
  mpg__nccl_family_leave(c); /* deregisters its buffers first */
  mpg__nccl_lock(c);
  ncclResult_t async = ncclSuccess;
  if (c->nccl && atomic_load(&c->aborted) == MPG_OK &&
      ncclCommGetAsyncError(c->nccl, &async) == ncclSuccess && async != ncclSuccess &&
      async != ncclInProgress) {
    /* A communicator that holds an error (a failed enqueue sets it on a
     * non-blocking communicator: NCCL 2.28 src/enqueue.cc) cannot be
     * finalized, only aborted; the caller saw that error already. */
    mpg__log(1, "nccl: rank %d of a group of %d holds an error (%s): aborted, not finalized",
             c->rank, c->size, ncclGetErrorString(async));
    mpg__nccl_abort_locked(c, MPG_ERR_ABORTED);
  }
  if (c->nccl && atomic_load(&c->aborted) == MPG_OK) {
    char what[96];
    snprintf(what, sizeof what, "nccl destroy (rank %d of a group of %d)",
             c->rank, c->size);
    double deadline = mpg__now() + c->timeout_s;
    ncclResult_t r = ncclCommFinalize(c->nccl);
    if (r == ncclSuccess || r == ncclInProgress)
      st = mpg__nccl_settle_locked(c, c->nccl, deadline, &r);
    if (st == MPG_OK && r == ncclSuccess) {
      /* ncclCommDestroy is blocking whatever the config: it sets
       * destroyFlag (src/init.cc:2379) before its ncclAsyncLaunch
       * (init.cc:2384), which forces a blocking group (src/group.cc:52-53),
       * so commReclaim has run and freed the handle when it returns
       * ncclSuccess.  ncclInProgress (never returned by 2.18, 2.22 or 2.28)
       * would mean the reclaim still runs on NCCL's thread and frees the
       * handle when it ends: it is NCCL's either way, and never polled
       * (ncclCommGetAsyncError on it could read freed memory).  On an
       * error the handle is not freed but left in NCCL's open group
       * (init.cc:2372-2381 return between ncclGroupStartInternal and
       * ncclGroupEndInternal), so it is not touched again either. */
      ncclComm_t h = c->nccl;
      c->nccl = NULL;
      r = ncclCommDestroy(h);
      if (r == ncclInProgress)
        mpg__log(1, "nccl: rank %d of a group of %d: ncclCommDestroy answered "
                 "ncclInProgress; NCCL frees the handle when its job ends", c->rank, c->size);
      else if (r != ncclSuccess)
        st = mpg__nccl_fail(MPG_ERR_BACKEND, what, "ncclCommDestroy", r);
    } else if (st == MPG_ERR_TIMEOUT) {
      mpg__nccl_abort_locked(c, MPG_ERR_TIMEOUT);
      st = mpg__fail(MPG_ERR_TIMEOUT,
                     "%s: ncclCommFinalize did not finish within %.3g s (the "
                     "communicator was aborted)",
                     what, c->timeout_s);
    } else if (st != MPG_OK) {
      st = mpg__fail(st, "%s: aborted during ncclCommFinalize", what);
    } else {
      st = mpg__nccl_fail(MPG_ERR_BACKEND, what, "ncclCommFinalize", r);
      mpg__nccl_abort_locked(c, MPG_ERR_ABORTED);
    }
  }
  /* Marked aborted but never aborted in NCCL (a backend caller without a
   * context, or a finalize that failed above): abort the handle now. */
  if (c->nccl) (void)ncclCommAbort(c->nccl);
  c->nccl = NULL;
  if (c->scratch) {
    (void)cudaFree(c->scratch);
    c->scratch = NULL;
  }
  pthread_mutex_unlock(&c->lock);
  mpg__nccl_dev_leave(c->device, old);
  mpg__nccl_comm_unref(c);
  return st;
}

/* ------------------------------------------------------------------ */
/* The function table                                                 */
/* ------------------------------------------------------------------ */

static void nccl_set_timeout(mpg__comm *c, double timeout_s) {
  pthread_mutex_lock(&c->lock);
  c->timeout_s = timeout_s;
  pthread_mutex_unlock(&c->lock);
}

/* rank and size are set when the communicator is made and never change. */
static void nccl_shape(const mpg__comm *c, int *pos, int *size) {
  *pos = c->rank;
  *size = c->size;
}

const struct mpg__backend_ops mpg__backend_nccl = {
    .name = "nccl",
    .world_init = mpg__nccl_world_init,
    .split = nccl_split,
    .post = mpg__nccl_post,
    .post_batch = mpg__nccl_post_batch,
    .test = mpg__nccl_test,
    .test_keeps_time = 1,
    .wait = mpg__nccl_wait,
    .req_free = mpg__nccl_req_free,
    .req_times = mpg__nccl_req_times,
    .abort_comm = nccl_abort,
    .abort_comms = nccl_abort_comms,
    .destroy = nccl_destroy,
    .local = mpg__nccl_local,
    .mem_alloc = mpg__nccl_mem_alloc,
    .mem_free = mpg__nccl_mem_free,
    .mem_zero = mpg__nccl_mem_zero,
    .mem_copy = mpg__nccl_mem_copy,
    .host_alloc = mpg__nccl_host_alloc,
    .host_free = mpg__nccl_host_free,
    .copy_async = mpg__nccl_copy_async,
    .stream_sync = mpg__nccl_stream_sync,
    .stream_create = mpg__nccl_stream_create,
    .stream_destroy = mpg__nccl_stream_destroy,
    .stream_order = mpg__nccl_stream_order,
    .comm_device = mpg__nccl_comm_device,
    .set_timeout = nccl_set_timeout,
    .comm_shape = nccl_shape,
};
