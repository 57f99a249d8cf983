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
 * into recv.  op may be MPG__OP_PREMUL_SUM: each addend is multiplied by
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

/* Node-local shared memory for a group's in-place reductions
 * (groups/shm/, protocol in shm/shm_internal.h): the one-pass sync of the
 * CPU backends.  mpg__shm_create is collective over the group: when the
 * backend's table allows it (host_shm: thread, mpi; backend.h), dtype is f32, f64, f16 or bf16, the group has
 * two or more members, they are on one host (opts.host_id, else
 * mpg_topo_host_identity) or on several hosts with the same number >= 2
 * on each (hierarchical: shm_internal.h; scatter 1, a sharded buffer's
 * segment, reduce-scatters across hosts, 0 all-reduces), and MESHPG_SHM
 * is not 0 on any of
 * them, it makes one segment per host holding every local member's
 * `bytes`-byte buffer (threads of one process: an anonymous mapping;
 * processes: a file that never has a name, in /dev/shm or a memfd),
 * starts this member's worker
 * thread and returns *out with *data, this member's buffer (zeroed and
 * 64-byte aligned: page aligned only for the node's first member, since
 * the members' buffers are whole pages plus 5 cache lines apart, against
 * 4 KiB aliasing; it lives until mpg__shm_destroy).  Otherwise *out is NULL (one
 * log line says why) and the caller allocates as before.  The segment
 * is a transport of the group (groups/transport.h) until
 * mpg__shm_destroy: a context abort reaches it at once.  depth: how
 * many operations a member may post before the first is complete
 * everywhere (more wait, bounded by the timeout).  Errors, on every
 * member alike: MPG_ERR_ENV when /dev/shm lacks the space (the message
 * names the bytes needed and free) or MESHPG_SHM has another value than
 * 0 or 1; MPG_ERR_NOMEM. */
typedef struct mpg__shm mpg__shm;
mpg_status mpg__shm_create(mpg_group *group, size_t bytes, mpg_dtype dtype, int depth,
                           int scatter, mpg__shm **out, void **data);
/* Post, as the n-th operation of this member, the in-place all-reduce of
 * elements [offset, offset + count) of every member's buffer, or the
 * reduce-scatter of [offset, offset + count x size) (the member at group
 * position p gets slice p in place, the others keep their input there).  op: MPG_OP_SUM,
 * MPG_OP_AVG, or MPG__OP_PREMUL_SUM with scale.  Reduced in position order,
 * f16/bf16 in f32 and rounded once, by the library's one reduction kernel
 * (groups/reduce.c), the thread backend's: equal to it bit for bit by
 * construction.  The operation runs through the groups layer like any
 * collective (backend.h, "Shared memory behind this table").  The caller's elements must be written before the post; the
 * buffer's range must not be touched until the work completes
 * (mpg_work_test / mpg_work_wait as for any collective; the timeout and
 * abort are the context's).  Every member posts the same operations in
 * the same order (each is checked against the others': MPG_ERR_INVALID).
 * The post claims the group like the public calls (mpg__group_claim): a
 * second thread's call on it meanwhile fails with MPG_ERR_STATE.  Any
 * failure of a post (arguments, MPG_ERR_STATE, MPG_ERR_NOMEM, the
 * context aborted, a timeout waiting for a ring slot) has not posted the
 * operation, which the peers may have posted: it aborts the segment, so
 * that every later operation of every member fails (the others with
 * MPG_ERR_ABORTED naming this member and the reason), and a timeout or
 * abort also aborts the context (mpg__group_on_failure).  An operation
 * never completes with MPG_OK unless every member reduced it. */
mpg_status mpg__shm_all_reduce(mpg__shm *shm, size_t offset, size_t count, mpg_op op,
                               double scale, mpg_work **work);
mpg_status mpg__shm_reduce_scatter(mpg__shm *shm, size_t offset, size_t count, mpg_op op,
                                   double scale, mpg_work **work);
/* Post, like the two above (same numbering, checks, claim, timeouts,
 * failures and abort), the in-place all-gather of elements [offset,
 * offset + count x size) of every member's buffer: the member at group
 * position p supplies slice p (count elements at offset + p x count) in its
 * own buffer, and once the work completes every member's buffer holds
 * every slice, bit for bit what the backend's mpg_all_gather gives.  Each
 * member's worker copies the others' slices into its own buffer (one
 * pass); complete when every member's worker finished, so a member may
 * rewrite its slice only after its work completed.  On a segment across
 * hosts (mpg__shm_hosts > 1, hierarchical) the worker at local position r
 * all-gathers the slices of the members at local position r of every host
 * through the backend and copies them into every local member's buffer
 * (shm_internal.h); a failure of that step fails every member's work.  A
 * member that posts another kind of operation as its n-th fails every
 * member's n-th with MPG_ERR_INVALID. */
mpg_status mpg__shm_all_gather(mpg__shm *shm, size_t offset, size_t count, mpg_work **work);
/* The hosts the segment spans (1: one; more: hierarchical: its
 * all-reduce, reduce-scatter and all-gather cross hosts through the
 * backend); 0 for NULL. */
int mpg__shm_hosts(const mpg__shm *shm);
/* The bytes of its mapping (every member's buffer and the control area). */
size_t mpg__shm_mapped_bytes(const mpg__shm *shm);
/* Stop the worker and unmap (NULL: nothing).  Local; after the works
 * completed, or after a failure. */
mpg_status mpg__shm_destroy(mpg__shm *shm);

/* Host staging for checkpoints (groups/staging.c).  device_buffers: 1
 * when the context's buffers are device memory (nccl), so that save and
 * load stage them.  host_alloc: pinned host memory on nccl, page-aligned
 * malloc elsewhere; host_free frees it (NULL: nothing; on nccl the block is
 * kept for reuse until mpg_ctx_destroy, see staging.c).  copy: `bytes`
 * between host and the context's memory, either way, queued on `stream`
 * on nccl (complete only after stream_sync), a memcpy elsewhere.
 * stream_sync: wait for everything queued on `stream` (nothing off nccl).
 * Local; errors MPG_ERR_NOMEM, MPG_ERR_BACKEND. */
int mpg__ctx_device_buffers(const mpg_ctx *ctx);
mpg_status mpg__ctx_host_alloc(mpg_ctx *ctx, size_t bytes, void **ptr);
mpg_status mpg__ctx_host_free(mpg_ctx *ctx, void *ptr);
mpg_status mpg__ctx_copy(mpg_ctx *ctx, void *dst, const void *src, size_t bytes,
                         void *stream);
mpg_status mpg__ctx_stream_sync(mpg_ctx *ctx, void *stream);

/* The flight recorder's view of the sync (groups/trace.c; docs/trace.md):
 * _step: the step in progress (mpg_sync_begin), recorded with every later
 * operation of the context.  _intern: a parameter's name as a number for
 * _tag (0 for none or when recording is off; a mutex, once per name).
 * _tag: the operations this thread issues from now on reduce or gather
 * sync bucket `bucket`, whose first and last parameters are the interned
 * names first and last; bucket -1 ends the tag.  Lock-free. */
void mpg__trace_step(mpg_ctx *ctx, long step);
int mpg__trace_intern(mpg_ctx *ctx, const char *name);
void mpg__trace_tag(int bucket, int first, int last);

/* Number of collective operations this rank has entered to create groups
 * (splits and their set-up), for tests and benchmarks; the issue-order
 * checker's own are not counted.  0 for NULL.  Context thread. */
long mpg__ctx_setup_collectives(const mpg_ctx *ctx);

#ifdef __cplusplus
}
#endif
#endif
