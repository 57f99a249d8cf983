/* All-reduce and reduce-scatter of f16/bf16 with f32 accumulation, for the
 * gradient sync's reduce_dtype = f32 (groups_internal.h).  The request is
 * one flag on the collective (mpg__coll.acc_f32), run by coll.c like any
 * public call: the CPU backends always widen to f32, reduce and round once,
 * so they need no flag; the nccl backend widens into an f32 buffer on the
 * stream, runs the NCCL collective in ncclFloat32 and narrows the result
 * (groups/nccl/widen.c).  Other dtypes run exactly as the plain calls,
 * claims of the group included (one thread at a time: coll.c). */
#include "core.h"

static mpg_status run_f32acc(mpg_group *g, mpg__coll_kind kind, const void *send,
                             void *recv, size_t count, mpg_dtype dtype, mpg_op op,
                             double scale, void *stream, mpg_work **work) {
  mpg__coll c = {kind, send, recv, count, dtype, op,
                 op == MPG__OP_PREMUL_SUM ? scale : 1.0, 0, 0, stream,
                 mpg__dtype_is_half(dtype)};
  return mpg__group_run(g, &c, work);
}

mpg_status mpg__all_reduce_f32acc(mpg_group *group, const void *send, void *recv,
                                  size_t count, mpg_dtype dtype, mpg_op op, double scale,
                                  void *stream, mpg_work **work) {
  return run_f32acc(group, MPG__ALL_REDUCE, send, recv, count, dtype, op, scale, stream,
                    work);
}

mpg_status mpg__reduce_scatter_f32acc(mpg_group *group, const void *send, void *recv,
                                      size_t count, mpg_dtype dtype, mpg_op op,
                                      double scale, void *stream, mpg_work **work) {
  return run_f32acc(group, MPG__REDUCE_SCATTER, send, recv, count, dtype, op, scale,
                    stream, work);
}
