/* Buffer registration of the NCCL backend.  NCCL's registrations are per
 * communicator (ncclCommRegister), and its rule is that when one rank of a
 * communicator passes registered buffers to an operation, every rank must:
 * mixing registered and unregistered buffers is undefined.  A buffer from
 * mem_alloc(registered = 1) is used by the dp group, the tp group, ... so
 * it is registered with every communicator of the context, now and later:
 *
 *   the family   the world communicator and every communicator split from
 *                it (placement's renumbered world, the groups) share one
 *                `struct nccl_family`: the registered buffers and the live
 *                communicators.
 *   register     a new buffer is registered with every live member; a new
 *                member (a split) registers every buffer.  Every rank
 *                allocates the same buffers and creates the same groups in
 *                the same order, so every rank of a communicator has the
 *                same buffers registered.
 *   deregister   mem_free deregisters the buffer from every member; a
 *                member leaving (destroy) deregisters everything from
 *                itself.  An aborted member has no NCCL handle left: its
 *                registrations went with it.
 *
 * The family also keeps the launch order of its communicators when NCCL
 * does not (mpg__nccl_family_order_*, at the end of this file).
 *
 * Lock order: the family's lock, then a member's lock, then order_lock. */
#include <pthread.h>
#include <stdlib.h>

#include <stdatomic.h>

#include "nccl_internal.h"

struct nccl_buf {
  void *ptr;
  size_t bytes;
  struct nccl_buf *next;
};

struct nccl_family {
  pthread_mutex_t lock;
  struct nccl_buf *bufs; /* registered buffers */
  mpg__comm *members;    /* live communicators, by family_next */
  int refs;              /* members; guarded by lock */
  /* The launch order (mpg__nccl_family_order_*), a leaf lock: taken with a
   * member's lock held, never the other way round. */
  pthread_mutex_t order_lock;
  int ordered;           /* 1: meshpg orders the launches */
  int have_last;         /* `last` was recorded */
  cudaEvent_t last;      /* recorded after the latest launch */
};

/* Register ptr with c (c->lock held).  A communicator without a handle
 * (aborted) is skipped. */
static ncclResult_t reg_one(mpg__comm *c, void *ptr, size_t bytes) {
  if (!c->nccl) return ncclSuccess;
  struct nccl_reg *r = calloc(1, sizeof *r);
  if (!r) return ncclSystemError;
  ncclResult_t nr = ncclCommRegister(c->nccl, ptr, bytes, &r->handle);
  if (nr != ncclSuccess) {
    free(r);
    return nr;
  }
  r->ptr = ptr;
  r->next = c->regs;
  c->regs = r;
  return ncclSuccess;
}

/* Deregister ptr from c (c->lock held); 1 if it was registered there. */
static int dereg_one(mpg__comm *c, void *ptr) {
  for (struct nccl_reg **pp = &c->regs; *pp; pp = &(*pp)->next)
    if ((*pp)->ptr == ptr) {
      struct nccl_reg *r = *pp;
      *pp = r->next;
      if (c->nccl) (void)ncclCommDeregister(c->nccl, r->handle);
      free(r);
      return 1;
    }
  return 0;
}

mpg_status mpg__nccl_family_join(mpg__comm *c, const mpg__comm *parent) {
  struct nccl_family *f = parent ? parent->family : NULL;
  if (!f) {
    f = calloc(1, sizeof *f);
    if (f && pthread_mutex_init(&f->order_lock, NULL) != 0) {
      free(f);
      f = NULL;
    }
    if (!f || pthread_mutex_init(&f->lock, NULL) != 0) {
      if (f) pthread_mutex_destroy(&f->order_lock);
      free(f);
      return mpg__fail(MPG_ERR_NOMEM, "nccl: out of memory for the buffer registry");
    }
  }
  mpg_status st = MPG_OK;
  pthread_mutex_lock(&f->lock);
  mpg__nccl_lock(c);
  for (struct nccl_buf *b = f->bufs; b && !st; b = b->next) {
    ncclResult_t nr = reg_one(c, b->ptr, b->bytes);
    if (nr != ncclSuccess)
      st = mpg__nccl_fail(MPG_ERR_BACKEND, "nccl split: registering the context's buffers "
                          "with the new communicator", "ncclCommRegister", nr);
  }
  if (st)
    while (c->regs) (void)dereg_one(c, c->regs->ptr);
  pthread_mutex_unlock(&c->lock);
  if (!st) {
    c->family = f;
    c->family_next = f->members;
    f->members = c;
    f->refs++;
  }
  int unused = f->refs == 0;
  pthread_mutex_unlock(&f->lock);
  if (unused) {
    pthread_mutex_destroy(&f->lock);
    pthread_mutex_destroy(&f->order_lock);
    free(f);
  }
  return st;
}

ncclResult_t mpg__nccl_family_poll(mpg__comm *c, int *rank, int *size) {
  struct nccl_family *f = c->family;
  ncclResult_t bad = ncclSuccess;
  if (!f) return bad;
  pthread_mutex_lock(&f->lock);
  for (mpg__comm *m = f->members; m && bad == ncclSuccess; m = m->family_next) {
    if (m == c || atomic_load(&m->aborted) != MPG_OK) continue;
    /* Never wait behind another thread's NCCL call: skip a busy member. */
    if (pthread_mutex_trylock(&m->lock) != 0) continue;
    ncclResult_t state = ncclSuccess;
    if (m->nccl && ncclCommGetAsyncError(m->nccl, &state) == ncclSuccess &&
        state != ncclSuccess && state != ncclInProgress) {
      bad = state;
      *rank = m->rank;
      *size = m->size;
      (void)mpg__nccl_abort_locked(m, MPG_ERR_ABORTED);
    }
    pthread_mutex_unlock(&m->lock);
  }
  pthread_mutex_unlock(&f->lock);
  return bad;
}

void mpg__nccl_family_leave(mpg__comm *c) {
  struct nccl_family *f = c->family;
  if (!f) return;
  pthread_mutex_lock(&f->lock);
  mpg__nccl_lock(c);
  while (c->regs) (void)dereg_one(c, c->regs->ptr);
  pthread_mutex_unlock(&c->lock);
  for (mpg__comm **pp = &f->members; *pp; pp = &(*pp)->family_next)
    if (*pp == c) {
      *pp = c->family_next;
      break;
    }
  c->family = NULL;
  int last = --f->refs == 0;
  pthread_mutex_unlock(&f->lock);
  if (last) {
    while (f->bufs) { /* freed by nobody: forget them (the memory is the caller's) */
      struct nccl_buf *b = f->bufs;
      f->bufs = b->next;
      free(b);
    }
    if (f->last) (void)cudaEventDestroy(f->last);
    pthread_mutex_destroy(&f->lock);
    pthread_mutex_destroy(&f->order_lock);
    free(f);
  }
}

mpg_status mpg__nccl_family_register(mpg__comm *c, void *ptr, size_t bytes) {
  struct nccl_family *f = c->family;
  if (!f) return mpg__fail(MPG_ERR_STATE, "nccl mem_alloc: the communicator has no registry");
  struct nccl_buf *b = calloc(1, sizeof *b);
  if (!b) return mpg__fail(MPG_ERR_NOMEM, "nccl mem_alloc: out of memory");
  b->ptr = ptr;
  b->bytes = bytes;
  mpg_status st = MPG_OK;
  pthread_mutex_lock(&f->lock);
  for (mpg__comm *m = f->members; m && !st; m = m->family_next) {
    mpg__nccl_lock(m);
    ncclResult_t nr = reg_one(m, ptr, bytes);
    pthread_mutex_unlock(&m->lock);
    if (nr != ncclSuccess)
      st = mpg__nccl_fail(MPG_ERR_BACKEND, "nccl mem_alloc (registered)", "ncclCommRegister",
                          nr);
  }
  if (st) {
    for (mpg__comm *m = f->members; m; m = m->family_next) {
      mpg__nccl_lock(m);
      (void)dereg_one(m, ptr);
      pthread_mutex_unlock(&m->lock);
    }
    free(b);
  } else {
    b->next = f->bufs;
    f->bufs = b;
  }
  pthread_mutex_unlock(&f->lock);
  return st;
}

int mpg__nccl_family_deregister(mpg__comm *c, void *ptr) {
  struct nccl_family *f = c->family;
  if (!f) return 0;
  int found = 0;
  pthread_mutex_lock(&f->lock);
  for (struct nccl_buf **pp = &f->bufs; *pp; pp = &(*pp)->next)
    if ((*pp)->ptr == ptr) {
      struct nccl_buf *b = *pp;
      *pp = b->next;
      free(b);
      found = 1;
      break;
    }
  if (found)
    for (mpg__comm *m = f->members; m; m = m->family_next) {
      mpg__nccl_lock(m);
      (void)dereg_one(m, ptr);
      pthread_mutex_unlock(&m->lock);
    }
  pthread_mutex_unlock(&f->lock);
  return found;
}

/* ------------------------------------------------------------------ */
/* Launch order                                                       */
/* ------------------------------------------------------------------ */

/* Without NCCL_LAUNCH_ORDER_IMPLICIT, NCCL leaves the order of kernels of
 * different communicators of one device to the caller (the NCCL user
 * guide, "Using multiple NCCL communicators concurrently": before 2.26 one
 * "consistent total global order", or deadlocks can ensue).  meshpg's
 * launches already come in the same host order on every rank; these two
 * calls make the device follow it: each launch waits until the previous
 * one of the family has finished.  That is what NCCL itself does with the
 * variable set when CUDA lacks launch-completion events (v2.28.9
 * src/enqueue.cc:1938-1940: "If we don't have launch events (requires
 * CUDA 12.3) then just use completion event (serialize execution)"). */
void mpg__nccl_family_order(mpg__comm *c, int by_meshpg) {
  if (!c->family) return;
  pthread_mutex_lock(&c->family->order_lock);
  c->family->ordered = by_meshpg;
  pthread_mutex_unlock(&c->family->order_lock);
}

cudaError_t mpg__nccl_family_order_before(mpg__comm *c, cudaStream_t s) {
  struct nccl_family *f = c->family;
  if (!f) return cudaSuccess;
  cudaError_t e = cudaSuccess;
  pthread_mutex_lock(&f->order_lock);
  if (f->ordered && f->have_last) e = cudaStreamWaitEvent(s, f->last, 0);
  pthread_mutex_unlock(&f->order_lock);
  return e;
}

cudaError_t mpg__nccl_family_order_after(mpg__comm *c, cudaStream_t s) {
  struct nccl_family *f = c->family;
  if (!f) return cudaSuccess;
  cudaError_t e = cudaSuccess;
  pthread_mutex_lock(&f->order_lock);
  if (f->ordered) {
    if (!f->last) e = cudaEventCreateWithFlags(&f->last, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventRecord(f->last, s);
    f->have_last = e == cudaSuccess;
  }
  pthread_mutex_unlock(&f->order_lock);
  return e;
}
