/* Host staging for checkpoints (groups_internal.h): what sync/ckpt*.c
 * asks of the backend to move registered buffers to and from host memory
 * without knowing whether they live on a device. */
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "ctx_internal.h"
#include "groups_internal.h"

int mpg__ctx_device_buffers(const mpg_ctx *ctx) {
  return ctx && ctx->ops->copy_async != NULL;
}

mpg_status mpg__ctx_host_alloc(mpg_ctx *ctx, size_t bytes, void **ptr) {
  *ptr = NULL;
  if (ctx->ops->host_alloc) return ctx->ops->host_alloc(ctx->world_comm, bytes, ptr);
  /* Page aligned: the files are written from it in large blocks. */
  if (posix_memalign(ptr, 4096, bytes ? bytes : 1)) {
    *ptr = NULL;
    return mpg__fail(MPG_ERR_NOMEM, "host staging of %zu bytes: out of memory", bytes);
  }
  return MPG_OK;
}

mpg_status mpg__ctx_host_free(mpg_ctx *ctx, void *ptr) {
  if (!ptr) return MPG_OK;
  if (ctx->ops->host_free) return ctx->ops->host_free(ctx->world_comm, ptr);
  free(ptr);
  return MPG_OK;
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
