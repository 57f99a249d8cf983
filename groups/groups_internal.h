/* What the groups layer tells the modules above it (sync/) beyond the
 * public API. */
#ifndef MPG_GROUPS_INTERNAL_H
#define MPG_GROUPS_INTERNAL_H

#include "internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 1 when the context's backend can reduce f16/bf16 with f32 accumulation:
 * every backend now (thread, mpi: their plain collectives widen, reduce
 * and round once; nccl: through mpg__all_reduce_f32acc and
 * mpg__reduce_scatter_f32acc below); 0 only for a NULL context.  Kept as
 * the one place sync/ asks. */
int mpg__ctx_half_reduces_in_f32(const mpg_ctx *ctx);

/* mpg_all_reduce / mpg_reduce_scatter (same arguments, checks, in-place
 * conventions, size-1 groups, timeouts and work handles) where f16/bf16
 * data is reduced with f32 accumulation on every backend: the sum (or
 * max, min, average) is formed in f32 and rounded once, to nearest even,
 * into recv.  op may be MPG_OP_PREMUL_SUM: each addend is multiplied by
 * (float)scale in f32 first; scale is ignored for the other ops.  On nccl
 * (groups/nccl/widen.c) this widens into an f32 buffer on the stream, runs
 * the collective in ncclFloat32 (twice the bytes on the wire) and narrows
 * the result; on thread and mpi it is the plain call.  Other dtypes: the
 * plain call.  Collective over the group. */
mpg_status mpg__all_reduce_f32acc(mpg_group *group, const void *send, void *recv,
                                  size_t count, mpg_dtype dtype, mpg_op op, double scale,
                                  void *stream, mpg_work **work);
mpg_status mpg__reduce_scatter_f32acc(mpg_group *group, const void *send, void *recv,
                                      size_t count, mpg_dtype dtype, mpg_op op,
                                      double scale, void *stream, mpg_work **work);

/* 1 when the backend runs a context's collectives posted on one stream in
 * posting order, so a collective may be posted before the one it consumes
 * has completed (nccl: CUDA stream order); 0 when posting reads the input
 * at once (thread, mpi: the input must be complete). */
int mpg__ctx_stream_ordered(const mpg_ctx *ctx);

/* The context a group belongs to (NULL for NULL), so that a group of
 * another context can be refused. */
const mpg_ctx *mpg__group_ctx(const mpg_group *group);

/* Count the gradient synchronisers living on a context (+1 at
 * mpg_sync_create, -1 at mpg_sync_destroy): mpg_ctx_destroy refuses while
 * any remains, instead of leaving them with freed groups. */
void mpg__ctx_sync_count(mpg_ctx *ctx, int delta);

/* All-gather `count` elements of host memory from every member of the
 * group into host memory (recv holds size x count), blocking, within the
 * context's timeout: for the library's own checks (sync's layout
 * fingerprints), on any backend (NCCL gets them staged through device
 * memory).  Collective over the group; creates it if needed. */
mpg_status mpg__group_host_all_gather(mpg_group *group, const void *send,
                                      void *recv, size_t count, mpg_dtype dtype);

/* The same for an all-reduce (recv holds count elements): e.g. sync's
 * agreement on the union of the reduce groups, whose size does not grow
 * with the world. */
mpg_status mpg__group_host_all_reduce(mpg_group *group, const void *send,
                                      void *recv, size_t count, mpg_dtype dtype,
                                      mpg_op op);

/* The issue-order check (groups/order.c) at `where` ("mpg_sync_finish"):
 * collective over the world when the checker is on (MESHPG_CHECK_ORDER),
 * nothing when it is off or the context was aborted.  MPG_ERR_STATE, on
 * every rank alike, naming the first call that differs, when the ranks
 * issued different collectives or group creations since the last check. */
mpg_status mpg__ctx_check_order(mpg_ctx *ctx, const char *where);

#ifdef __cplusplus
}
#endif
#endif
