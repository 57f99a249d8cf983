/* f32 accumulation of an f16/bf16 all-reduce or reduce-scatter on the NCCL
 * backend: asked for (mpg__coll.acc_f32, the sync's reduce_dtype = f32), and
 * always for an f16/bf16 average or scaled sum, whose pre-multiply NCCL
 * would round into the half (ops.c).  NCCL itself reduces in the element's
 * type and rounds at every step of its ring or tree, so ops.c runs such a
 * collective in three steps, all on the caller's stream and all enqueued
 * before the call returns:
 *
 *   1. mpg__nccl_widen: the input (count elements for an all-reduce, the
 *      whole size x count for a reduce-scatter) widened into an f32 buffer,
 *      each element times the pre-multiply scale in f32 (1 otherwise);
 *   2. ops.c: ncclAllReduce / ncclReduceScatter in ncclFloat32 on that
 *      buffer, in place (a reduce-scatter's result is the rank's block of
 *      it), with the op mapped as usual (sum for a pre-multiplied sum,
 *      whose scale step 1 applied: the same arithmetic as NCCL's own
 *      ncclRedOpCreatePreMulSum with an f32 scalar, without creating and
 *      destroying a reduction op per call; ncclAvg for an average, which
 *      NCCL runs as a pre-multiply by float(1/size) in f32);
 *   3. mpg__nccl_narrow: the f32 result rounded once, to nearest even, into
 *      recv, then the f32 buffer freed.
 * The result is the CPU backends' (widen, reduce in f32, round once) up to
 * the order of NCCL's f32 additions, and for an average over a group whose
 * size is not a power of two, NCCL's f32 pre-multiply by float(1/size)
 * (one f32 rounding per addend, where the CPU backends divide the sum;
 * exact at a power of two).  Cost: the wire carries f32, twice
 * the bytes of the halves, plus two elementwise passes and 4 bytes per
 * element of device memory (per member of the group for a reduce-scatter)
 * while the operation is in flight.
 *
 * The f32 buffer is stream-ordered: cudaMallocAsync before the widen
 * kernel and cudaFreeAsync after the narrow kernel, on the caller's stream,
 * from the memory pool current to the stream's device.  Chosen over a
 * cached per-communicator buffer because the sync posts several buckets
 * before the first completes: one cached buffer could only be reused after
 * the previous operation's event fired, which means a host wait (no more
 * overlap of buckets) or one buffer per operation in flight, i.e. a pool;
 * CUDA's pool already reuses memory on the same stream without any wait,
 * orders reuse across streams itself, needs no state in the communicator
 * (nothing to free at destroy or after an abort: a pending free completes
 * when the stream does), and works under CUDA graph capture, where
 * cudaMalloc would not.  The pool's release threshold (cudaMemPoolAttr-
 * ReleaseThreshold, 0 for the device's default pool) decides whether freed
 * memory is kept between steps; a caller who wants it kept raises it.
 *
 * The kernels are PTX, loaded once with cudaLibraryLoadData (no nvcc), like
 * local.c's scale kernel.  See nccl_internal.h. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "nccl_internal.h"

/* One grid-stride loop over i < n: dst and src element addresses %rd9 and
 * %rd8 (element sizes 1 << DSH and 1 << SSH bytes), the scale in %f1.
 * Target sm_52 / PTX 6.0 so any driver can JIT it. */
#define W_KERNEL(NAME, SSH, DSH, BODY)                                        \
  MPG__PTX_GRID_LOOP(NAME,                                                    \
                     "  shl.b64 %rd7, %rd4, " SSH ";\n  add.s64 %rd8, %rd2, %rd7;\n" \
                     "  shl.b64 %rd10, %rd4, " DSH ";\n"                    \
                     "  add.s64 %rd9, %rd1, %rd10;\n" BODY)

/* Narrowing rounds like mpg__f32_to_half (groups/reduce.c), NaN included,
 * so that results match the CPU backends bit for bit: f16 by cvt.rn (a
 * NaN becomes sign | 0x7e00); bf16 by adding 0x7fff + the lowest kept bit
 * and dropping 16 bits (a NaN keeps its top 16 bits, made quiet with
 * 0x0040). */
static const char *const widen_ptx[] = {
    ".version 6.0\n.target sm_52\n.address_size 64\n\n",
    W_KERNEL("mpg_widen_f16", "1", "2",
             "  ld.global.b16 %h1, [%rd8];\n  cvt.f32.f16 %f2, %h1;\n"
             "  mul.rn.f32 %f3, %f2, %f1;\n  st.global.f32 [%rd9], %f3;\n"),
    W_KERNEL("mpg_widen_bf16", "1", "2",
             "  ld.global.b16 %h1, [%rd8];\n  cvt.u32.u16 %r5, %h1;\n"
             "  shl.b32 %r5, %r5, 16;\n  mov.b32 %f2, %r5;\n"
             "  mul.rn.f32 %f3, %f2, %f1;\n  st.global.f32 [%rd9], %f3;\n"),
    W_KERNEL("mpg_narrow_f16", "2", "1",
             "  ld.global.f32 %f2, [%rd8];\n  cvt.rn.f16.f32 %h1, %f2;\n"
             "  cvt.u32.u16 %r5, %h1;\n  mov.b32 %r6, %f2;\n"
             "  shr.u32 %r7, %r6, 16;\n  and.b32 %r7, %r7, 32768;\n"
             "  or.b32 %r7, %r7, 32256;\n"
             "  setp.nan.f32 %p2, %f2, %f2;\n  selp.b32 %r8, %r7, %r5, %p2;\n"
             "  cvt.u16.u32 %h2, %r8;\n  st.global.b16 [%rd9], %h2;\n"),
    W_KERNEL("mpg_narrow_bf16", "2", "1",
             "  ld.global.f32 %f2, [%rd8];\n  mov.b32 %r6, %f2;\n"
             /* round to nearest even: (r6 + 0x7fff + ((r6 >> 16) & 1)) >> 16 */
             "  shr.u32 %r7, %r6, 16;\n  and.b32 %r7, %r7, 1;\n"
             "  add.u32 %r7, %r7, 32767;\n  add.u32 %r8, %r6, %r7;\n"
             "  shr.u32 %r8, %r8, 16;\n"
             "  shr.u32 %r9, %r6, 16;\n  or.b32 %r9, %r9, 64;\n"
             "  setp.nan.f32 %p2, %f2, %f2;\n  selp.b32 %r8, %r9, %r8, %p2;\n"
             "  cvt.u16.u32 %h2, %r8;\n  st.global.b16 [%rd9], %h2;\n")};

enum { WIDEN_F16, WIDEN_BF16, NARROW_F16, NARROW_BF16, NKERNELS };

static pthread_once_t widen_once = PTHREAD_ONCE_INIT;
static cudaError_t widen_load_error = cudaSuccess;
static const char *widen_load_call = "";
static cudaKernel_t widen_kernels[NKERNELS];

static void widen_load(void) {
  static const char *const names[NKERNELS] = {"mpg_widen_f16", "mpg_widen_bf16",
                                              "mpg_narrow_f16", "mpg_narrow_bf16"};
  widen_load_error = mpg__nccl_load_ptx(widen_ptx, sizeof widen_ptx / sizeof *widen_ptx,
                                        names, NKERNELS, widen_kernels, &widen_load_call);
}

/* Run kernel `which` over n elements on stream s. */
static mpg_status launch(int which, void *dst, const void *src, size_t count, double scale,
                         cudaStream_t s, const char *what, const char *call) {
  return mpg__nccl_launch_elementwise(widen_kernels[which], dst, src, count, scale, s, what,
                                      call);
}

mpg_status mpg__nccl_widen(const mpg__comm *c, const mpg__coll *k, double scale,
                           cudaStream_t s, const char *what, mpg__coll *wide) {
  int bf16 = k->dtype == MPG_BF16;
  if (!mpg__dtype_is_half(k->dtype) ||
      (k->kind != MPG__ALL_REDUCE && k->kind != MPG__REDUCE_SCATTER))
    return mpg__fail(MPG_ERR_INVALID, "%s: f32 accumulation is for an f16/bf16 "
                     "all_reduce or reduce_scatter", what);
  size_t members = k->kind == MPG__REDUCE_SCATTER ? (size_t)c->size : 1;
  if (k->count > SIZE_MAX / sizeof(float) / members)
    return mpg__fail(MPG_ERR_RANGE, "%s: the f32 buffer of %zu x %zu elements overflows "
                     "size_t bytes", what, members, k->count);
  size_t n = k->count * members;
  pthread_once(&widen_once, widen_load);
  if (widen_load_error != cudaSuccess)
    return mpg__fail(MPG_ERR_BACKEND, "%s: %s: %s", what, widen_load_call,
                     cudaGetErrorString(widen_load_error));
  void *buf = NULL;
  cudaError_t e = cudaMallocAsync(&buf, n * sizeof(float), s);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return mpg__fail(MPG_ERR_BACKEND, "%s: cudaMallocAsync (f32 accumulation buffer, "
                     "%zu bytes): %s", what, n * sizeof(float), cudaGetErrorString(e));
  }
  mpg_status st = launch(bf16 ? WIDEN_BF16 : WIDEN_F16, buf, k->send, n, scale, s, what,
                         "cudaLaunchKernel (widen to f32)");
  if (st) {
    (void)cudaFreeAsync(buf, s);
    return st;
  }
  *wide = *k;
  wide->dtype = MPG_F32;
  wide->send = buf;
  wide->recv = k->kind == MPG__REDUCE_SCATTER
                   ? (float *)buf + (size_t)c->rank * k->count /* in place */
                   : buf;
  wide->scale = 1.0; /* applied above; op is kept for the request's text (ops.c
                       maps a pre-multiplied sum to ncclSum) */
  wide->acc_f32 = 0;
  return MPG_OK;
}

mpg_status mpg__nccl_narrow(const mpg__coll *k, const mpg__coll *wide, int narrow,
                            cudaStream_t s, const char *what) {
  mpg_status st = MPG_OK;
  if (narrow)
    st = launch(k->dtype == MPG_BF16 ? NARROW_BF16 : NARROW_F16, k->recv, wide->recv,
                k->count, 1.0, s, what, "cudaLaunchKernel (narrow from f32)");
  cudaError_t e = cudaFreeAsync((void *)wide->send, s);
  if (e != cudaSuccess && !st)
    st = mpg__nccl_fail_cuda(MPG_ERR_BACKEND, what, "cudaFreeAsync (f32 accumulation "
                             "buffer)", e);
  return st;
}
