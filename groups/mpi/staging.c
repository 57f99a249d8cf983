/* Memory that MPI may write, for the MPI backend: staging buffers
 * recycled per communicator, and the regions handed out by mem_alloc
 * (layer: above state.c only; below ops.c, orphans.c and world.c).
 *
 * Staging.  MPI never sees a caller's buffer: every operation copies its
 * input into staging memory owned by the request and copies the result
 * out on completion (half types widen/narrow on the way, which they need
 * anyway).  This costs a copy in and out, but it is what makes a timeout
 * safe: an abandoned operation cannot be cancelled (MPI forbids it for
 * collectives), and if the late peer does arrive while this process is
 * still inside MPI (MPI_Finalize waits for every process, and progresses
 * everything meanwhile) MPI completes it and writes its result.  With
 * staging that write lands in memory the orphan list (orphans.c) still
 * owns, never in a caller's buffer that was freed or reused after the
 * timeout.  Staging buffers are recycled per communicator (a few, up to
 * 256 MiB each), so steady-state collectives do not allocate.  The
 * exception is memory this backend hands out itself (mem_alloc, i.e.
 * mpg_ctx_mem_alloc): an in-place all-reduce on it is zero-copy, and its
 * timeout safety comes from ownership instead (see struct region). */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mpi_internal.h"

static struct region *g_regions; /* mem_alloc'ed memory; guarded by the lock */
/* Regions in memfds: from SHARE_MIN bytes, at most SHARE_MAX at once (each
 * holds a descriptor open; small buffers cost little to copy twice). */
#define SHARE_MIN ((size_t)64 << 10)
#define SHARE_MAX 256
static int g_shared; /* regions in memfds now; guarded by the lock */

/* Staging memory, recycled per communicator.  Lock held. */
void *mpg__mpi_stage_take(mpg__comm *m, size_t bytes, size_t *cap) {
  int best = -1;
  for (int i = 0; i < MPG_MPI_SPARES; i++)
    if (m->spare[i] && m->spare_len[i] >= bytes &&
        (best < 0 || m->spare_len[i] < m->spare_len[best]))
      best = i;
  if (best < 0) return NULL;
  void *p = m->spare[best];
  *cap = m->spare_len[best];
  m->spare[best] = NULL;
  return p;
}

void mpg__mpi_stage_give(mpg__comm *m, void *p, size_t cap) {
  if (!p) return;
  if (m->destroyed || cap > MPG_MPI_SPARE_MAX) {
    free(p);
    return;
  }
  int slot = -1;
  for (int i = 0; i < MPG_MPI_SPARES && slot < 0; i++)
    if (!m->spare[i]) slot = i;
  if (slot < 0) { /* replace the smallest spare if this one is larger */
    slot = 0;
    for (int i = 1; i < MPG_MPI_SPARES; i++)
      if (m->spare_len[i] < m->spare_len[slot]) slot = i;
    if (m->spare_len[slot] >= cap) {
      free(p);
      return;
    }
    free(m->spare[slot]);
  }
  m->spare[slot] = p;
  m->spare_len[slot] = cap;
}

/* ------------------------------------------------------------------ */
/* mem_alloc regions                                                   */
/* ------------------------------------------------------------------ */

/* The region holding [p, p + bytes), or NULL.  Lock held. */
struct region *mpg__mpi_region_find(const void *p, size_t bytes) {
  const char *c = p;
  for (struct region *r = g_regions; r; r = r->next)
    if (c >= r->base && (size_t)(c - r->base) <= r->len &&
        bytes <= r->len - (size_t)(c - r->base))
      return r;
  return NULL;
}

/* Unlink and free a region.  Lock held. */
static void region_drop(struct region *r) {
  for (struct region **pp = &g_regions; *pp; pp = &(*pp)->next)
    if (*pp == r) {
      *pp = r->next;
      break;
    }
  if (r->fd >= 0) {
    /* The node's other processes may keep this memfd mapped (the
     * all-to-all channel's peers cache their mappings, groups/shm/a2a.c):
     * its pages are given back now, whatever they map (a peer that still
     * reads it after an operation was given up reads zeros, and fails). */
    (void)fallocate(r->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, (off_t)r->len);
    munmap(r->base, r->len);
    close(r->fd);
    g_shared--;
  } else {
    free(r->base);
  }
  free(r);
}

/* A request stops using its region.  Lock held. */
void mpg__mpi_region_unref(struct region *r) {
  if (--r->busy == 0 && r->freed) region_drop(r);
}

/* A memfd of len bytes mapped shared into r (fd, base, ino): 1, or 0
 * (nothing left open). */
static int shared_region(struct region *r, size_t len) {
  lock_g();
  int room = len >= SHARE_MIN && g_shared < SHARE_MAX;
  if (room) g_shared++;
  unlock_g();
  if (!room) return 0;
  int fd = memfd_create("meshpg-mem", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) {
    lock_g();
    g_shared--;
    unlock_g();
    return 0;
  }
  struct stat st;
  void *p = MAP_FAILED;
  /* Sealed against shrinking: a process that maps it never reads past
   * its end (the peers check the seal). */
  if (ftruncate(fd, (off_t)len) == 0 && fstat(fd, &st) == 0 &&
      fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) == 0)
    p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    close(fd);
    lock_g();
    g_shared--;
    unlock_g();
    return 0;
  }
  r->fd = fd;
  r->ino = (uint64_t)st.st_ino;
  r->base = p;
  return 1;
}

int mpg__mpi_mem_share(const void *ptr, size_t bytes, int *fd, uint64_t *offset,
                       uint64_t *len, uint64_t *id) {
  lock_g();
  const struct region *r = mpg__mpi_region_find(ptr, bytes);
  int ok = r && r->fd >= 0 && !r->freed;
  if (ok) {
    *fd = r->fd;
    *offset = (uint64_t)((const char *)ptr - r->base);
    *len = r->len;
    *id = r->ino;
  }
  unlock_g();
  return ok;
}

mpg_status mpg__mpi_mem_alloc(mpg__comm *world, size_t bytes, int registered,
                              void **ptr) {
  (void)world;
  (void)registered; /* nothing to register with MPI */
  *ptr = NULL;
  struct region *r = calloc(1, sizeof *r);
  void *p = NULL;
  size_t len = bytes ? bytes : 1;
  if (!r)
    return mpg__fail(MPG_ERR_NOMEM, "mpg_ctx_mem_alloc: out of memory for %zu bytes", bytes);
  r->fd = -1;
  /* Shared memory where the kernel gives it (zeroed): the node's other
   * processes map it to read an all-to-all's blocks in place
   * (groups/shm/a2a.c); else private memory, which they read with
   * process_vm_readv. */
  if (shared_region(r, len)) {
    p = r->base;
  } else if (posix_memalign(&p, 4096, len) != 0) {
    free(r);
    return mpg__fail(MPG_ERR_NOMEM,
                     "mpg_ctx_mem_alloc: out of memory for %zu bytes", bytes);
  } else {
    memset(p, 0, len);
  }
  r->base = p;
  r->len = len;
  lock_g();
  r->next = g_regions;
  g_regions = r;
  unlock_g();
  *ptr = p;
  return MPG_OK;
}

mpg_status mpg__mpi_mem_free(mpg__comm *world, void *ptr) {
  (void)world;
  lock_g();
  struct region *r = g_regions;
  while (r && r->base != ptr) r = r->next;
  if (!r || r->freed) {
    unlock_g();
    return mpg__fail(MPG_ERR_INVALID, "mpg_ctx_mem_free: %p was not returned by "
                     "mpg_ctx_mem_alloc of this backend (or was freed already)",
                     ptr);
  }
  if (r->busy)
    r->freed = 1; /* an unfinished operation still uses it: free it last */
  else
    region_drop(r);
  unlock_g();
  return MPG_OK;
}
