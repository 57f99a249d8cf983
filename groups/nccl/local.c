/* Size-1 groups on the NCCL backend (backend op `local`).  They have no
 * communicator: the copy is a cudaMemcpyAsync on the caller's stream, and a
 * scaled sum runs a small elementwise kernel written in PTX below, loaded
 * once with cudaLibraryLoadData (no nvcc needed).  Both return once
 * enqueued: the result is ordered on the stream like any other CUDA work.
 * See nccl_internal.h. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nccl_internal.h"

/* dst[i] = src[i] * s for i < n, one grid-stride loop per dtype.  Half
 * types compute in f32 and round to nearest even, like the CPU backends
 * (mpg__scale).  Target sm_52 / PTX 6.0 so any driver can JIT it. */
#define PTX_KERNEL(NAME, BODY) MPG__PTX_GRID_LOOP(NAME, BODY)

#define PTX_ADDR(SHIFT)                                                       \
  "  shl.b64 %rd7, %rd4, " SHIFT ";\n  add.s64 %rd8, %rd2, %rd7;\n"          \
  "  add.s64 %rd9, %rd1, %rd7;\n"

/* Pieces, each under C's 4095-character literal limit, joined at load. */
static const char *const scale_ptx[] = {
    ".version 6.0\n.target sm_52\n.address_size 64\n\n",
    PTX_KERNEL("mpg_scale_f32",
               PTX_ADDR("2")
               "  ld.global.f32 %f2, [%rd8];\n  mul.rn.f32 %f3, %f2, %f1;\n"
               "  st.global.f32 [%rd9], %f3;\n"),
    PTX_KERNEL("mpg_scale_f64",
               PTX_ADDR("3")
               "  ld.global.f64 %fd2, [%rd8];\n  mul.rn.f64 %fd3, %fd2, %fd1;\n"
               "  st.global.f64 [%rd9], %fd3;\n"),
    PTX_KERNEL("mpg_scale_f16",
               PTX_ADDR("1")
               "  ld.global.b16 %h1, [%rd8];\n  cvt.f32.f16 %f2, %h1;\n"
               "  mul.rn.f32 %f3, %f2, %f1;\n  cvt.rn.f16.f32 %h2, %f3;\n"
               "  st.global.b16 [%rd9], %h2;\n"),
    PTX_KERNEL("mpg_scale_bf16",
               PTX_ADDR("1")
               "  ld.global.b16 %h1, [%rd8];\n  cvt.u32.u16 %r5, %h1;\n"
               "  shl.b32 %r5, %r5, 16;\n  mov.b32 %f2, %r5;\n"
               "  mul.rn.f32 %f3, %f2, %f1;\n  mov.b32 %r6, %f3;\n"
               /* round to nearest even: r6 + 0x7fff + ((r6 >> 16) & 1) */
               "  shr.u32 %r7, %r6, 16;\n  and.b32 %r7, %r7, 1;\n"
               "  add.u32 %r7, %r7, 32767;\n  add.u32 %r8, %r6, %r7;\n"
               "  shr.u32 %r8, %r8, 16;\n"
               "  setp.nan.f32 %p2, %f3, %f3;\n  @%p2 mov.u32 %r8, 32704;\n"
               "  cvt.u16.u32 %h2, %r8;\n  st.global.b16 [%rd9], %h2;\n")};

static pthread_once_t scale_once = PTHREAD_ONCE_INIT;
static cudaError_t scale_load_error = cudaSuccess;
static const char *scale_load_call = "";
static cudaKernel_t scale_kernels[4]; /* f32, f64, f16, bf16 */

static void scale_load(void) {
  static const char *const names[4] = {"mpg_scale_f32", "mpg_scale_f64",
                                       "mpg_scale_f16", "mpg_scale_bf16"};
  scale_load_error = mpg__nccl_load_ptx(scale_ptx, sizeof scale_ptx / sizeof *scale_ptx,
                                        names, 4, scale_kernels, &scale_load_call);
}

cudaError_t mpg__nccl_scale_kernel_f32(cudaKernel_t *out) {
  pthread_once(&scale_once, scale_load);
  *out = scale_load_error == cudaSuccess ? scale_kernels[0] : NULL;
  return scale_load_error;
}

/* The copy or kernel of a size-1 group, on the context's device (R6: the
 * caller's current device may be another one; a stream of one device
 * cannot take work launched while another is current). */
static mpg_status local_on_device(const mpg__coll *k);

mpg_status mpg__nccl_local(mpg__comm *world, const mpg__coll *k) {
  if (!world) return local_on_device(k);
  int old = -1;
  cudaError_t e = mpg__nccl_dev_enter(world->device, &old);
  if (e != cudaSuccess)
    return mpg__nccl_fail_cuda(MPG_ERR_BACKEND, "nccl group of one rank", "cudaSetDevice", e);
  mpg_status st = local_on_device(k);
  mpg__nccl_dev_leave(world->device, old);
  return st;
}

static mpg_status local_on_device(const mpg__coll *k) {
  size_t bytes = k->count * mpg__dtype_size(k->dtype);
  cudaStream_t s = (cudaStream_t)k->stream;
  char what[160];
  snprintf(what, sizeof what, "nccl %s(%s, count %zu) in a group of one rank",
           mpg__kind_name(k->kind), mpg_dtype_name(k->dtype), k->count);
  switch (k->kind) {
    case MPG__BARRIER:
    case MPG__BROADCAST:
      return MPG_OK;
    case MPG__SEND:
    case MPG__RECV:
      return mpg__fail(MPG_ERR_INVALID, "%s: point-to-point needs a peer", what);
    case MPG__ALL_REDUCE:
    case MPG__ALL_GATHER:
    case MPG__REDUCE_SCATTER:
      break;
  }
  int scaled = k->kind != MPG__ALL_GATHER && k->op == MPG__OP_PREMUL_SUM &&
               k->scale != 1.0 && k->count > 0;
  if (!scaled) {
    if (bytes == 0 || k->recv == k->send) return MPG_OK;
    cudaError_t e = cudaMemcpyAsync(k->recv, k->send, bytes, cudaMemcpyDefault, s);
    return e == cudaSuccess ? MPG_OK
                            : mpg__nccl_fail_cuda(MPG_ERR_BACKEND, what, "cudaMemcpyAsync", e);
  }
  return mpg__nccl_scale(k->recv, k->send, k->count, k->dtype, k->scale, s, what);
}

mpg_status mpg__nccl_scale(void *dst, const void *src, size_t count, mpg_dtype dtype,
                           double scale, cudaStream_t s, const char *what) {
  int which;
  switch (dtype) {
    case MPG_F32: which = 0; break;
    case MPG_F64: which = 1; break;
    case MPG_F16: which = 2; break;
    case MPG_BF16: which = 3; break;
    default:
      return mpg__fail(MPG_ERR_INVALID, "%s: a scaled sum needs a floating dtype",
                       what);
  }
  if (count == 0) return MPG_OK;
  pthread_once(&scale_once, scale_load);
  if (scale_load_error != cudaSuccess)
    return mpg__fail(MPG_ERR_BACKEND, "%s: %s: %s", what, scale_load_call,
                     cudaGetErrorString(scale_load_error));
  return mpg__nccl_launch_elementwise(scale_kernels[which], dst, src, count, scale, s, what,
                                      "cudaLaunchKernel (scale)");
}
