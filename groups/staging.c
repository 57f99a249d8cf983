/* Host staging for checkpoints (groups_internal.h): what sync/ckpt*.c
 * asks of the backend to move registered buffers to and from host memory
 * without knowing whether they live on a device.
 *
 * On nccl the staging is pinned memory, and freeing pinned memory
 * (cudaFreeHost) synchronizes the devices, which would wait for NCCL
 * kernels that wait for this rank: a rank that frees its staging right
 * after a checkpoint's last collective deadlocks with peers that already
 * queued their next one ([API-SYNC]: cudaFreeHost is among the calls
 * with implicit synchronization; the CUDA/NCCL double models it).  So the
 * context keeps its pinned blocks for reuse and frees them only in
 * mpg_ctx_destroy, when no collective is pending. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "core.h"
#include "groups_internal.h"

typedef struct mpg__staging {
  void *ptr;
  size_t bytes;
  int busy;
  struct mpg__staging *next;
} mpg__staging;

static pthread_mutex_t staging_lock = PTHREAD_MUTEX_INITIALIZER;

int mpg__ctx_device_buffers(const mpg_ctx *ctx) {
  return ctx && ctx->ops->copy_async != NULL;
}

/* nccl: a free kept block big enough, else a new one (kept too). */
static mpg_status pinned_alloc(mpg_ctx *ctx, size_t bytes, void **ptr) {
  pthread_mutex_lock(&staging_lock);
  mpg__staging *best = NULL;
  for (mpg__staging *b = ctx->staging; b; b = b->next)
    if (!b->busy && b->bytes >= bytes && (!best || b->bytes < best->bytes)) best = b;
  if (best) best->busy = 1;
  pthread_mutex_unlock(&staging_lock);
  if (best) {
    *ptr = best->ptr;
    return MPG_OK;
  }
  mpg__staging *b = calloc(1, sizeof *b);
  if (!b) return mpg__fail(MPG_ERR_NOMEM, "host staging: out of memory");
  mpg_status st = ctx->ops->host_alloc(ctx->world_comm, bytes, &b->ptr);
  if (st) {
    free(b);
    return st;
  }
  b->bytes = bytes;
  b->busy = 1;
  pthread_mutex_lock(&staging_lock);
  b->next = ctx->staging;
  ctx->staging = b;
  pthread_mutex_unlock(&staging_lock);
  *ptr = b->ptr;
  return MPG_OK;
}

mpg_status mpg__ctx_host_alloc(mpg_ctx *ctx, size_t bytes, void **ptr) {
  *ptr = NULL;
  if (ctx->ops->host_alloc) return pinned_alloc(ctx, bytes, ptr);
  /* Page aligned: the files are written from it in large blocks. */
  if (posix_memalign(ptr, 4096, bytes ? bytes : 1)) {
    *ptr = NULL;
    return mpg__fail(MPG_ERR_NOMEM, "host staging of %zu bytes: out of memory", bytes);
  }
  return MPG_OK;
}

mpg_status mpg__ctx_host_free(mpg_ctx *ctx, void *ptr) {
  if (!ptr) return MPG_OK;
  if (!ctx->ops->host_alloc) {
    free(ptr);
    return MPG_OK;
  }
  pthread_mutex_lock(&staging_lock);
  for (mpg__staging *b = ctx->staging; b; b = b->next)
    if (b->ptr == ptr) b->busy = 0; /* kept for the next save or load */
  pthread_mutex_unlock(&staging_lock);
  return MPG_OK;
}

void mpg__ctx_staging_release(mpg_ctx *ctx) {
  mpg__staging *b = ctx->staging;
  ctx->staging = NULL;
  while (b) {
    mpg__staging *next = b->next;
    (void)ctx->ops->host_free(ctx->world_comm, b->ptr);
    free(b);
    b = next;
  }
}

mpg_status mpg__ctx_copy(mpg_ctx *ctx, void *dst, const void *src, size_t bytes,
                         void *stream) {
  if (ctx->ops->copy_async) return ctx->ops->copy_async(ctx->world_comm, dst, src, bytes, stream);
  if (bytes) memcpy(dst, src, bytes);
  return MPG_OK;
}

mpg_status mpg__ctx_stream_sync(mpg_ctx *ctx, void *stream) {
  return ctx->ops->stream_sync ? ctx->ops->stream_sync(ctx->world_comm, stream) : MPG_OK;
}
