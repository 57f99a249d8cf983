/* Staging between host arrays and the backend's memory (see stage.h). */
#include "stage.h"

#include <time.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef GPT_HAVE_CUDA
#include <cuda_runtime.h>
#include <nccl.h>

static mpg_status cuda_fail(cudaError_t e, const char *what) {
  fprintf(stderr, "gpt: %s failed: %s\n", what, cudaGetErrorString(e));
  return MPG_ERR_BACKEND;
}
#define CU(call)                                       \
  do {                                                 \
    cudaError_t e_ = (call);                           \
    if (e_ != cudaSuccess) return cuda_fail(e_, #call); \
  } while (0)

/* Queue a copy on the rank's stream (ordered after the stream's earlier
 * work, e.g. an NCCL collective); the caller synchronises. */
static mpg_status queue_copy(gpt_stage *s, void *dst, const void *src, size_t bytes,
                             enum cudaMemcpyKind kind) {
  if (bytes) CU(cudaMemcpyAsync(dst, src, bytes, kind, (cudaStream_t)s->stream));
  return MPG_OK;
}
static mpg_status sync_stream(gpt_stage *s) {
  CU(cudaStreamSynchronize((cudaStream_t)s->stream));
  return MPG_OK;
}
#endif

mpg_status gpt_stage_init(gpt_stage *s, mpg_ctx *ctx, size_t cap) {
  memset(s, 0, sizeof *s);
  s->ctx = ctx;
  s->nccl = mpg_ctx_backend(ctx) == MPG_BACKEND_NCCL;
  if (!s->nccl) return MPG_OK;
#ifndef GPT_HAVE_CUDA
  (void)cap;
  fprintf(stderr, "gpt: this build has no CUDA: the NCCL backend cannot be staged\n");
  return MPG_ERR_UNSUPPORTED;
#else
  s->cap = cap ? cap : 1;
  mpg_status st = mpg_ctx_stream_create(ctx, &s->stream);
  for (int i = 0; i < 2 && st == MPG_OK; i++) st = mpg_ctx_mem_alloc(ctx, s->cap, 0, &s->dev[i]);
  return st;
#endif
}

void gpt_stage_free(gpt_stage *s) {
  if (!s->ctx) return;
  for (int i = 0; i < 2; i++)
    if (s->dev[i]) mpg_ctx_mem_free(s->ctx, s->dev[i]);
  if (s->stream) mpg_ctx_stream_destroy(s->ctx, s->stream);
  memset(s, 0, sizeof *s);
}

mpg_status gpt_stage_alloc(gpt_stage *s, size_t bytes, void **ptr) {
  if (s->nccl) return mpg_ctx_mem_alloc(s->ctx, bytes ? bytes : 1, 0, ptr);
  *ptr = calloc(bytes ? bytes : 1, 1);
  return *ptr ? MPG_OK : MPG_ERR_NOMEM;
}

void gpt_stage_release(gpt_stage *s, void *ptr) {
  if (!ptr) return;
  if (s->nccl) mpg_ctx_mem_free(s->ctx, ptr);
  else free(ptr);
}

mpg_status gpt_stage_in(gpt_stage *s, void *dst, const void *host, size_t bytes) {
  if (!s->nccl) {
    if (dst != host && bytes) memcpy(dst, host, bytes);
    return MPG_OK;
  }
#ifdef GPT_HAVE_CUDA
  mpg_status st = queue_copy(s, dst, host, bytes, cudaMemcpyHostToDevice);
  return st ? st : sync_stream(s);
#else
  return MPG_ERR_UNSUPPORTED;
#endif
}

mpg_status gpt_stage_out(gpt_stage *s, void *host, const void *src, size_t bytes) {
  if (!s->nccl) {
    if (src != host && bytes) memcpy(host, src, bytes);
    return MPG_OK;
  }
#ifdef GPT_HAVE_CUDA
  mpg_status st = queue_copy(s, host, src, bytes, cudaMemcpyDeviceToHost);
  return st ? st : sync_stream(s);
#else
  return MPG_ERR_UNSUPPORTED;
#endif
}

#ifdef GPT_HAVE_CUDA
static mpg_status too_big(const gpt_stage *s, const char *what, size_t bytes) {
  fprintf(stderr, "gpt: %s of %zu bytes is larger than the staging buffers (%zu bytes)\n",
          what, bytes, s->cap);
  return MPG_ERR_RANGE;
}

/* The common shape: in_bytes of send into dev[0], the call from dev[0]
 * into dev[1] on the stream, out_bytes of dev[1] back into recv. */
enum coll { C_ALL_REDUCE, C_ALL_GATHER, C_REDUCE_SCATTER, C_ALL_TO_ALL };
static mpg_status staged(gpt_stage *s, enum coll k, mpg_group *g, const void *send, void *recv,
                         size_t count, mpg_dtype dt, mpg_op op) {
  const size_t es = mpg_dtype_size(dt), gs = (size_t)mpg_group_size(g);
  const size_t in_b = count * es * (k == C_REDUCE_SCATTER || k == C_ALL_TO_ALL ? gs : 1);
  const size_t out_b = count * es * (k == C_ALL_GATHER || k == C_ALL_TO_ALL ? gs : 1);
  static const char *names[] = {"all_reduce", "all_gather", "reduce_scatter", "all_to_all"};
  if (in_b > s->cap || out_b > s->cap) return too_big(s, names[k], in_b > out_b ? in_b : out_b);
  mpg_status st = queue_copy(s, s->dev[0], send, in_b, cudaMemcpyHostToDevice);
  if (st) return st;
  if (k == C_ALL_REDUCE)
    st = mpg_all_reduce(g, s->dev[0], s->dev[1], count, dt, op, s->stream, NULL);
  else if (k == C_ALL_GATHER)
    st = mpg_all_gather(g, s->dev[0], s->dev[1], count, dt, s->stream, NULL);
  else if (k == C_REDUCE_SCATTER)
    st = mpg_reduce_scatter(g, s->dev[0], s->dev[1], count, dt, op, s->stream, NULL);
  else
    st = mpg_all_to_all(g, s->dev[0], s->dev[1], count, dt, s->stream, NULL);
  if (st) return st;
  if ((st = queue_copy(s, recv, s->dev[1], out_b, cudaMemcpyDeviceToHost))) return st;
  return sync_stream(s);
}
#endif

static mpg_status stage_all_reduce_raw(gpt_stage *s, mpg_group *g, const void *send, void *recv,
                                size_t count, mpg_dtype dt, mpg_op op) {
#ifdef GPT_HAVE_CUDA
  if (s && s->nccl) return staged(s, C_ALL_REDUCE, g, send, recv, count, dt, op);
#endif
  (void)s;
  return mpg_all_reduce(g, send, recv, count, dt, op, NULL, NULL);
}

static mpg_status stage_all_gather_raw(gpt_stage *s, mpg_group *g, const void *send, void *recv,
                                size_t count, mpg_dtype dt) {
#ifdef GPT_HAVE_CUDA
  if (s && s->nccl) return staged(s, C_ALL_GATHER, g, send, recv, count, dt, MPG_OP_SUM);
#endif
  (void)s;
  return mpg_all_gather(g, send, recv, count, dt, NULL, NULL);
}

static mpg_status stage_reduce_scatter_raw(gpt_stage *s, mpg_group *g, const void *send, void *recv,
                                    size_t count, mpg_dtype dt, mpg_op op) {
#ifdef GPT_HAVE_CUDA
  if (s && s->nccl) return staged(s, C_REDUCE_SCATTER, g, send, recv, count, dt, op);
#endif
  (void)s;
  return mpg_reduce_scatter(g, send, recv, count, dt, op, NULL, NULL);
}

static mpg_status stage_all_to_all_v_raw(gpt_stage *s, mpg_group *g, const void *send,
                                         const size_t *sc, const size_t *sd, void *recv,
                                         const size_t *rc, const size_t *rd, mpg_dtype dt) {
#ifdef GPT_HAVE_CUDA
  if (s && s->nccl) {
    const size_t es = mpg_dtype_size(dt), n = (size_t)mpg_group_size(g);
    size_t in_b = 0, out_b = 0;
    for (size_t j = 0; j < n; j++) {
      if ((sd[j] + sc[j]) * es > in_b) in_b = (sd[j] + sc[j]) * es;
      if ((rd[j] + rc[j]) * es > out_b) out_b = (rd[j] + rc[j]) * es;
    }
    if (in_b > s->cap || out_b > s->cap)
      return too_big(s, "all_to_all_v", in_b > out_b ? in_b : out_b);
    mpg_status st = queue_copy(s, s->dev[0], send, in_b, cudaMemcpyHostToDevice);
    if (st) return st;
    if ((st = mpg_all_to_all_v(g, s->dev[0], sc, sd, s->dev[1], rc, rd, dt, s->stream, NULL)))
      return st;
    /* only the blocks: recv elements outside them are left as they were */
    for (size_t j = 0; j < n; j++)
      if ((st = queue_copy(s, (char *)recv + rd[j] * es, (char *)s->dev[1] + rd[j] * es,
                           rc[j] * es, cudaMemcpyDeviceToHost)))
        return st;
    return sync_stream(s);
  }
#endif
  (void)s;
  return mpg_all_to_all_v(g, send, sc, sd, recv, rc, rd, dt, NULL, NULL);
}

static mpg_status stage_p2p_raw(gpt_stage *s, mpg_group *g, const mpg_p2p_op *ops, int n) {
#ifdef GPT_HAVE_CUDA
  if (s && s->nccl && n > 0) {
    if (n > 2) {
      fprintf(stderr, "gpt: a staged p2p batch has at most 2 operations, not %d\n", n);
      return MPG_ERR_RANGE;
    }
    mpg_p2p_op dops[2];
    mpg_status st;
    for (int i = 0; i < n; i++) {
      const size_t b = ops[i].count * mpg_dtype_size(ops[i].dtype);
      if (b > s->cap) return too_big(s, "p2p operation", b);
      dops[i] = ops[i];
      dops[i].buf = s->dev[i];
      if (ops[i].kind == MPG_P2P_SEND &&
          (st = queue_copy(s, s->dev[i], ops[i].buf, b, cudaMemcpyHostToDevice)))
        return st;
    }
    if ((st = mpg_p2p_batch(g, dops, n, s->stream, NULL))) return st;
    for (int i = 0; i < n; i++)
      if (ops[i].kind == MPG_P2P_RECV &&
          (st = queue_copy(s, ops[i].buf, s->dev[i],
                           ops[i].count * mpg_dtype_size(ops[i].dtype),
                           cudaMemcpyDeviceToHost)))
        return st;
    return sync_stream(s);
  }
#endif
  (void)s;
  return mpg_p2p_batch(g, ops, n, NULL, NULL);
}

int gpt_stage_device_count(void) {
#ifdef GPT_HAVE_CUDA
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
#else
  return 0;
#endif
}

int gpt_stage_nccl_id(void *id128) {
#ifdef GPT_HAVE_CUDA
  ncclUniqueId id;
  _Static_assert(sizeof id == 128, "ncclUniqueId is 128 bytes");
  if (ncclGetUniqueId(&id) != ncclSuccess) return -1;
  memcpy(id128, &id, sizeof id);
  return 0;
#else
  (void)id128;
  return -1;
#endif
}

int gpt_stage_set_device(int device) {
#ifdef GPT_HAVE_CUDA
  return cudaSetDevice(device) == cudaSuccess ? 0 : -1;
#else
  (void)device;
  return -1;
#endif
}

/* ------------------------------------------------------------------ */
/* Timed entry points: every blocking communication of the model and the
 * trainer goes through these, so comm_s is the rank's exposed
 * communication (waiting for peers included: pipeline bubbles show here). */

double gpt_stage_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

mpg_status gpt_stage_all_reduce(gpt_stage *s, mpg_group *g, const void *send, void *recv,
                                size_t count, mpg_dtype dt, mpg_op op) {
  double t0 = gpt_stage_now();
  mpg_status st = stage_all_reduce_raw(s, g, send, recv, count, dt, op);
  if (s) s->comm_s += gpt_stage_now() - t0;
  return st;
}

mpg_status gpt_stage_all_gather(gpt_stage *s, mpg_group *g, const void *send, void *recv,
                                size_t count, mpg_dtype dt) {
  double t0 = gpt_stage_now();
  mpg_status st = stage_all_gather_raw(s, g, send, recv, count, dt);
  if (s) s->comm_s += gpt_stage_now() - t0;
  return st;
}

mpg_status gpt_stage_reduce_scatter(gpt_stage *s, mpg_group *g, const void *send, void *recv,
                                    size_t count, mpg_dtype dt, mpg_op op) {
  double t0 = gpt_stage_now();
  mpg_status st = stage_reduce_scatter_raw(s, g, send, recv, count, dt, op);
  if (s) s->comm_s += gpt_stage_now() - t0;
  return st;
}

mpg_status gpt_stage_p2p(gpt_stage *s, mpg_group *g, const mpg_p2p_op *ops, int n) {
  double t0 = gpt_stage_now();
  mpg_status st = stage_p2p_raw(s, g, ops, n);
  if (s) s->comm_s += gpt_stage_now() - t0;
  return st;
}

mpg_status gpt_stage_all_to_all_v(gpt_stage *s, mpg_group *g, const void *send,
                                  const size_t *send_counts, const size_t *send_displs,
                                  void *recv, const size_t *recv_counts,
                                  const size_t *recv_displs, mpg_dtype dt) {
  double t0 = gpt_stage_now();
  mpg_status st = stage_all_to_all_v_raw(s, g, send, send_counts, send_displs, recv,
                                         recv_counts, recv_displs, dt);
  if (s) s->comm_s += gpt_stage_now() - t0;
  return st;
}

mpg_status gpt_stage_all_to_all(gpt_stage *s, mpg_group *g, const void *send, void *recv,
                                size_t count, mpg_dtype dt) {
  double t0 = gpt_stage_now();
  mpg_status st;
#ifdef GPT_HAVE_CUDA
  if (s && s->nccl) st = staged(s, C_ALL_TO_ALL, g, send, recv, count, dt, MPG_OP_SUM);
  else
#endif
    st = mpg_all_to_all(g, send, recv, count, dt, NULL, NULL);
  if (s) s->comm_s += gpt_stage_now() - t0;
  return st;
}
