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
 * Lock order: the family's lock, then a member's lock. */
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
    if (!f || pthread_mutex_init(&f->lock, NULL) != 0) {
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
    pthread_mutex_destroy(&f->lock);
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
