/* Staging between the GPT example's host arrays and the memory that the
 * rank's backend communicates from.  The model computes with CPU loops on
 * host arrays; on the thread and MPI backends meshpg works on those arrays
 * directly, while on NCCL every collective, p2p batch and the gradient
 * sync work on device memory.  This layer hides the difference:
 *
 *  - gpt_stage_in / gpt_stage_out copy between host memory and "backend
 *    memory" (device memory on NCCL: cudaMemcpyAsync on the rank's stream,
 *    then cudaStreamSynchronize, so they return with the copy done and
 *    ordered after everything queued earlier on that stream, e.g. NCCL's
 *    reductions; memcpy elsewhere, a no-op when both pointers are one).
 *  - gpt_stage_all_reduce / all_gather / reduce_scatter / p2p take host
 *    buffers.  On thread and MPI they call meshpg on them directly.  On
 *    NCCL they copy the inputs into the rank's two device buffers
 *    (allocated once with mpg_ctx_mem_alloc, `cap` bytes each), run the
 *    meshpg call on the rank's stream, copy the outputs back on that
 *    stream and synchronise it before returning.
 *
 * The backend is chosen at run time (mpg_ctx_backend(ctx) ==
 * MPG_BACKEND_NCCL); the CUDA code is compiled only with GPT_HAVE_CUDA
 * (builds with NCCL).  A stage belongs to one rank (one thread). */
#ifndef GPT_STAGE_H
#define GPT_STAGE_H

#include <stddef.h>

#include "meshpg.h"

typedef struct gpt_stage {
  mpg_ctx *ctx;
  int nccl;     /* 1: device memory, the CUDA path */
  void *stream; /* nccl: the rank's cudaStream_t; NULL elsewhere */
  void *dev[2]; /* nccl: two device buffers of cap bytes each */
  size_t cap;
  double comm_s; /* wall time spent inside the blocking calls below (and
                    what the trainer adds: the sync's finish and gather
                    waits): communication the rank waited for, exposed */
} gpt_stage;

/* Seconds on a monotonic clock. */
double gpt_stage_now(void);

/* Set up the stage of a rank whose context is ctx: on NCCL create its
 * stream and its two device buffers of cap bytes (the largest message:
 * the largest buffer of any collective or p2p operation).  Returns
 * MPG_ERR_UNSUPPORTED for an NCCL context in a build without CUDA. */
mpg_status gpt_stage_init(gpt_stage *s, mpg_ctx *ctx, size_t cap);
void gpt_stage_free(gpt_stage *s);

/* Backend memory for the caller's own use (device memory on NCCL, zeroed
 * host memory elsewhere). */
mpg_status gpt_stage_alloc(gpt_stage *s, size_t bytes, void **ptr);
void gpt_stage_release(gpt_stage *s, void *ptr);

/* host -> backend memory, and back; done on return. */
mpg_status gpt_stage_in(gpt_stage *s, void *dst, const void *host, size_t bytes);
mpg_status gpt_stage_out(gpt_stage *s, void *host, const void *src, size_t bytes);

/* Blocking collectives on host buffers (meshpg's in-place conventions). */
mpg_status gpt_stage_all_reduce(gpt_stage *s, mpg_group *g, const void *send, void *recv,
                                size_t count, mpg_dtype dt, mpg_op op);
mpg_status gpt_stage_all_gather(gpt_stage *s, mpg_group *g, const void *send, void *recv,
                                size_t count, mpg_dtype dt);
mpg_status gpt_stage_reduce_scatter(gpt_stage *s, mpg_group *g, const void *send, void *recv,
                                    size_t count, mpg_dtype dt, mpg_op op);
/* mpg_all_to_all / mpg_all_to_all_v on host buffers (counts and
 * displacements in elements, as meshpg's).  On NCCL the span of the send
 * blocks is staged in, and each receive block staged out. */
mpg_status gpt_stage_all_to_all(gpt_stage *s, mpg_group *g, const void *send, void *recv,
                                size_t count, mpg_dtype dt);
mpg_status gpt_stage_all_to_all_v(gpt_stage *s, mpg_group *g, const void *send,
                                  const size_t *send_counts, const size_t *send_displs,
                                  void *recv, const size_t *recv_counts,
                                  const size_t *recv_displs, mpg_dtype dt);
/* mpg_p2p_batch on host buffers; at most 2 operations on NCCL. */
mpg_status gpt_stage_p2p(gpt_stage *s, mpg_group *g, const mpg_p2p_op *ops, int n);

/* NCCL set-up helpers for thread ranks (all fail without GPT_HAVE_CUDA):
 * the number of CUDA devices (0 when none, or without CUDA), a fresh
 * 128-byte ncclUniqueId, and the calling thread's current device. */
int gpt_stage_device_count(void);
int gpt_stage_nccl_id(void *id128);
int gpt_stage_set_device(int device);

#endif
