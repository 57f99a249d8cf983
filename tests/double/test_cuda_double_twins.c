/* The CUDA half of the test double (test_cuda_double.c): the PTX kernels'
 * CPU twins, against a careful reference and the H100's outputs. */

#include "test_cuda_double.h"
#include "../support/values.h" /* tv_mix64 */

/* ------------------------------------------------------------------ */
/* The PTX twins                                                       */
/* ------------------------------------------------------------------ */

/* A careful reference, independent of cuda_twins.c: values as doubles,
 * roundings by nearbyint (to nearest even) on exactly scaled values. */
static double ref_f16(uint16_t h) {
  int e = (h >> 10) & 31, m = h & 1023;
  double v = e == 31 ? (m ? NAN : INFINITY) : e ? ldexp(1024 + m, e - 25) : ldexp(m, -24);
  return h & 0x8000 ? -v : v;
}

static double ref_bf16(uint16_t h) {
  int e = (h >> 7) & 255, m = h & 127;
  double v = e == 255 ? (m ? NAN : INFINITY) : e ? ldexp(128 + m, e - 134) : ldexp(m, -133);
  return h & 0x8000 ? -v : v;
}

/* v (not NaN) to a format of `mbits` mantissa bits, exponent bias `bias`,
 * all-ones exponent `emax`: nearest, ties to even, overflow to infinity. */
static uint16_t ref_round(double v, int mbits, int bias, int emax) {
  uint16_t sign = signbit(v) ? 0x8000 : 0;
  double a = fabs(v);
  int emin = 1 - bias;
  if (isinf(a)) return sign | (uint16_t)(emax << mbits);
  if (a < ldexp(1, emin)) { /* subnormal range */
    double m = nearbyint(ldexp(a, mbits - emin));
    return sign | (uint16_t)m; /* m == 1 << mbits is the smallest normal */
  }
  int e = ilogb(a);
  double m = nearbyint(ldexp(a, mbits - e));
  if (m == ldexp(1, mbits + 1)) m /= 2, e++;
  if (e + bias >= emax) return sign | (uint16_t)(emax << mbits);
  return sign | (uint16_t)((e + bias) << mbits | ((uint16_t)m - (1 << mbits)));
}

static uint16_t ref_to_f16(double v) { return ref_round(v, 10, 15, 31); }
static uint16_t ref_to_bf16(double v) { return ref_round(v, 7, 127, 255); }

static uint32_t f32_bits(float f) {
  uint32_t b;
  memcpy(&b, &f, 4);
  return b;
}

/* The PTX's f32 product: x times the scale rounded to f32; the product of
 * two floats is exact in a double, so (float) rounds once.  A NaN is
 * 0x7fffffff (PTX arithmetic gives the canonical NaN). */
static uint32_t ref_mul(double x, double scale) {
  float r = (float)(x * (double)(float)scale);
  return isnan(r) ? 0x7fffffffu : f32_bits(r);
}

static float from_bits(uint32_t b) {
  float f;
  memcpy(&f, &b, 4);
  return f;
}

static const double scales[] = {1.0, 0.5, -3.0, 0.1, 1.0 / 3.0, 1e-8, 65504.0, 1e30, 0.0, INFINITY};

/* meshpg's scale kernels on every pattern: f16/bf16 products rounded once. */
Test(cuda_double, scale_twins_round_like_the_ptx, .timeout = 20) {
  cudaStream_t s = settings_stream(0);
  uint16_t *in = malloc(65536 * 2), *out = malloc(65536 * 2);
  for (int i = 0; i < 65536; i++) in[i] = (uint16_t)i;
  void *din = NULL, *dout = NULL;
  CUDA_OK(cudaMalloc(&din, 65536 * 2));
  CUDA_OK(cudaMalloc(&dout, 65536 * 2));
  CUDA_OK(cudaMemcpy(din, in, 65536 * 2, cudaMemcpyHostToDevice));
  CUDA_OK(cudaDeviceSynchronize()); /* s is not ordered after the legacy stream's copy */
  for (int bf = 0; bf < 2; bf++)
    for (size_t k = 0; k < sizeof scales / sizeof *scales; k++) {
      cr_assert_eq(mpg__nccl_scale(dout, din, 65536, bf ? MPG_BF16 : MPG_F16, scales[k], s, "t"),
                   MPG_OK, "%s", last_fail);
      CUDA_OK(cudaStreamSynchronize(s));
      CUDA_OK(cudaMemcpy(out, dout, 65536 * 2, cudaMemcpyDeviceToHost));
      int bad = 0, first = -1;
      uint16_t want0 = 0;
      for (int i = 0; i < 65536; i++) {
        double x = bf ? ref_bf16((uint16_t)i) : ref_f16((uint16_t)i);
        float p = from_bits(ref_mul(x, scales[k]));
        uint16_t want = isnan(p) ? (bf ? 0x7fc0 : 0x7fff) : bf ? ref_to_bf16(p) : ref_to_f16(p);
        if (out[i] != want && !bad++) first = i, want0 = want;
      }
      cr_assert_eq(bad, 0, "%s * %g: %d wrong, the first %#06x gave %#06x, expected %#06x",
                   bf ? "bf16" : "f16", scales[k], bad, first, out[first < 0 ? 0 : first],
                   want0);
    }
  free(in);
  free(out);
}

/* meshpg's widen (f16/bf16 -> f32 times the scale) and narrow (f32 ->
 * f16/bf16, NaN kept as a quiet NaN of its sign) kernels, through
 * mpg__nccl_widen / mpg__nccl_narrow. */
Test(cuda_double, widen_and_narrow_twins_round_like_the_ptx, .timeout = 20) {
  cudaStream_t s = settings_stream(0);
  enum { N = 65536 };
  uint16_t *in = malloc(N * 2), *out = malloc(N * 2);
  float *wide = malloc(N * 4);
  for (int i = 0; i < N; i++) in[i] = (uint16_t)i;
  void *send = NULL, *recv = NULL;
  CUDA_OK(cudaMalloc(&send, N * 2));
  CUDA_OK(cudaMalloc(&recv, N * 2));
  CUDA_OK(cudaMemcpy(send, in, N * 2, cudaMemcpyHostToDevice));
  CUDA_OK(cudaDeviceSynchronize()); /* s is not ordered after the legacy stream's copy */
  mpg__comm c;
  memset(&c, 0, sizeof c);
  c.size = 1;
  for (int bf = 0; bf < 2; bf++)
    for (size_t k = 0; k < sizeof scales / sizeof *scales; k++) {
      mpg__coll coll, w;
      memset(&coll, 0, sizeof coll);
      coll.kind = MPG__ALL_REDUCE;
      coll.send = send;
      coll.recv = recv;
      coll.count = N;
      coll.dtype = bf ? MPG_BF16 : MPG_F16;
      cr_assert_eq(mpg__nccl_widen(&c, &coll, scales[k], s, "t", &w), MPG_OK, "%s", last_fail);
      CUDA_OK(cudaMemcpyAsync(wide, w.recv, N * 4, cudaMemcpyDeviceToHost, s));
      cr_assert_eq(mpg__nccl_narrow(&coll, &w, 1, s, "t"), MPG_OK, "%s", last_fail);
      CUDA_OK(cudaMemcpyAsync(out, recv, N * 2, cudaMemcpyDeviceToHost, s));
      CUDA_OK(cudaStreamSynchronize(s));
      int wbad = 0, nbad = 0, wfirst = -1, nfirst = -1;
      for (int i = 0; i < N; i++) {
        double x = bf ? ref_bf16((uint16_t)i) : ref_f16((uint16_t)i);
        uint32_t want = ref_mul(x, scales[k]);
        if (f32_bits(wide[i]) != want && !wbad++) wfirst = i;
        float p = from_bits(want);
        uint16_t back = isnan(p) ? (uint16_t)(bf ? (want >> 16) | 0x40
                                                 : ((want >> 16) & 0x8000) | 0x7e00)
                        : bf     ? ref_to_bf16(p)
                                 : ref_to_f16(p);
        if (out[i] != back && !nbad++) nfirst = i;
      }
      cr_assert_eq(wbad, 0, "%s widen * %g: %d wrong, the first of input %#06x",
                   bf ? "bf16" : "f16", scales[k], wbad, wfirst);
      cr_assert_eq(nbad, 0, "%s narrow after * %g: %d wrong, the first of input %#06x",
                   bf ? "bf16" : "f16", scales[k], nbad, nfirst);
    }
  free(in);
  free(out);
  free(wide);
}

/* FNV-1a, as the hashes of the H100's outputs were taken. */
static uint64_t fnv(const void *p, size_t n, uint64_t h) {
  const unsigned char *c = p;
  for (size_t i = 0; i < n; i++) h = (h ^ c[i]) * 0x100000001b3ull;
  return h;
}

/* The scales the H100 ran each kernel with (NaN, infinities, f32
 * subnormals and f64 values that f32 rounds included). */
static const double gpu_scales[16] = {1.0, 0.5, 2.0, -3.0, 1.0 / 3.0, 0.1, 1e-8, 65504.0,
                                      1e30, 1e-40, 0.0, -0.0, INFINITY, NAN, 3.0e38, 7.0};

/* The inputs of the H100 run: every 16-bit pattern; for f32 each upper
 * half with the lower halves that decide rounding (0, all ones, 2^b and
 * its neighbours) or a pseudo-random one; for f64 each top 16 bits with
 * pseudo-random rest. */
static void *gpu_inputs(int which, size_t *n, size_t *isz) {
  if (which == 0) {
    uint16_t *h = malloc(65536 * 2);
    for (int i = 0; i < 65536; i++) h[i] = (uint16_t)i;
    *n = 65536, *isz = 2;
    return h;
  }
  if (which == 1) {
    uint32_t lows[50];
    int nl = 0;
    lows[nl++] = 0;
    lows[nl++] = 0xffff;
    for (int b = 0; b < 16; b++) {
      lows[nl++] = 1u << b;
      lows[nl++] = (1u << b) - 1;
      lows[nl++] = ((1u << b) + 1) & 0xffff;
    }
    uint32_t *x = malloc(65536 * 50 * 4);
    for (size_t hi = 0; hi < 65536; hi++)
      for (int l = 0; l < nl; l++) x[hi * nl + l] = (uint32_t)(hi << 16) | lows[l];
    *n = 65536 * 50, *isz = 4;
    return x;
  }
  if (which == 2) {
    uint32_t *y = malloc(131072 * 4);
    for (uint32_t hi = 0; hi < 65536; hi++) {
      y[2 * hi] = hi << 16;
      y[2 * hi + 1] = (hi << 16) | (uint32_t)(tv_mix64(hi) & 0xffff);
    }
    *n = 131072, *isz = 4;
    return y;
  }
  uint64_t *z = malloc(65536 * 8);
  for (uint64_t hi = 0; hi < 65536; hi++)
    z[hi] = (hi << 48) | (tv_mix64(hi + 7) & 0xffffffffffffull);
  *n = 65536, *isz = 8;
  return z;
}

/* One kernel through meshpg's launch code: scale (kind 0), widen (1) or
 * narrow (2) of n elements of din into dout, on s. */
static void meshpg_kernel(int kind, mpg_dtype dt, void *dout, void *din, size_t n, double scale,
                          cudaStream_t s) {
  if (kind == 0) {
    cr_assert_eq(mpg__nccl_scale(dout, din, n, dt, scale, s, "gt"), MPG_OK, "%s", last_fail);
    return;
  }
  mpg__comm c;
  memset(&c, 0, sizeof c);
  c.size = 1;
  mpg__coll k, w;
  memset(&k, 0, sizeof k);
  k.kind = MPG__ALL_REDUCE;
  k.count = n;
  k.dtype = dt;
  if (kind == 1) {
    k.send = din;
    cr_assert_eq(mpg__nccl_widen(&c, &k, scale, s, "gt", &w), MPG_OK, "%s", last_fail);
    CUDA_OK(cudaMemcpyAsync(dout, w.recv, n * 4, cudaMemcpyDeviceToDevice, s));
    cr_assert_eq(mpg__nccl_narrow(&k, &w, 0, s, "gt"), MPG_OK, "%s", last_fail);
  } else {
    void *dummy = NULL; /* the f32 buffer narrow frees */
    CUDA_OK(cudaMallocAsync(&dummy, 4, s));
    k.recv = dout;
    w = k;
    w.send = dummy;
    w.recv = din;
    cr_assert_eq(mpg__nccl_narrow(&k, &w, 1, s, "gt"), MPG_OK, "%s", last_fail);
  }
}

/* Bit for bit what the real kernels gave on an H100 (CUDA 13, the PTX of
 * groups/nccl/local.c and widen.c) over the inputs above: FNV-1a of each
 * kernel's outputs, scale after scale.  The NaN payloads are in these. */
Test(cuda_double, twins_match_the_h100, .timeout = 30) {
  settings(0);
  static const struct {
    int kind, input, nscales;
    mpg_dtype dt;
    size_t osz;
    uint64_t hash;
  } k[] = {
      {0, 0, 16, MPG_F16, 2, 0xa2935927651c0b05ull},  /* mpg_scale_f16 */
      {0, 0, 16, MPG_BF16, 2, 0x2a346e6762691339ull}, /* mpg_scale_bf16 */
      {1, 0, 16, MPG_F16, 4, 0xf061c40e29c28199ull},  /* mpg_widen_f16 */
      {1, 0, 16, MPG_BF16, 4, 0xef2c9cb2b40573c5ull}, /* mpg_widen_bf16 */
      {2, 1, 1, MPG_F16, 2, 0xd0a34b6cfe6bc295ull},   /* mpg_narrow_f16 */
      {2, 1, 1, MPG_BF16, 2, 0x87b86eb83e7f0da5ull},  /* mpg_narrow_bf16 */
      {0, 2, 16, MPG_F32, 4, 0x548b6d597a0f399dull},  /* mpg_scale_f32 */
      {0, 3, 16, MPG_F64, 8, 0x75b97da6dfcc228aull},  /* mpg_scale_f64 */
  };
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  for (size_t i = 0; i < sizeof k / sizeof *k; i++) {
    size_t n, isz;
    void *in = gpu_inputs(k[i].input, &n, &isz), *din = NULL, *dout = NULL;
    char *out = malloc(n * k[i].osz);
    CUDA_OK(cudaMalloc(&din, n * isz));
    CUDA_OK(cudaMalloc(&dout, n * k[i].osz));
    CUDA_OK(cudaMemcpy(din, in, n * isz, cudaMemcpyHostToDevice));
    CUDA_OK(cudaDeviceSynchronize()); /* s is not ordered after the legacy stream's copy */
    uint64_t h = 0xcbf29ce484222325ull;
    for (int sc = 0; sc < k[i].nscales; sc++) {
      meshpg_kernel(k[i].kind, k[i].dt, dout, din, n, gpu_scales[sc], s);
      CUDA_OK(cudaMemcpyAsync(out, dout, n * k[i].osz, cudaMemcpyDeviceToHost, s));
      CUDA_OK(cudaStreamSynchronize(s));
      h = fnv(out, n * k[i].osz, h);
    }
    cr_assert_eq(h, k[i].hash, "kernel %zu: hash %#llx, the H100's %#llx", i,
                 (unsigned long long)h, (unsigned long long)k[i].hash);
    cudaFree(din);
    cudaFree(dout);
    free(in);
    free(out);
  }
}

/* A launch copies the argument values: changing them afterwards, before
 * the stream runs the kernel, changes nothing. */
Test(cuda_double, launch_copies_its_arguments, .timeout = 10) {
  static int ms = 50;
  cudaStream_t s = settings_stream(300);
  float host[4] = {1, 2, 3, 4}, back[4];
  void *buf = NULL;
  CUDA_OK(cudaMalloc(&buf, sizeof host));
  CUDA_OK(cudaMemcpy(buf, host, sizeof host, cudaMemcpyHostToDevice));
  CUDA_OK(cudaDeviceSynchronize()); /* s is not ordered after the legacy stream's copy */
  CUDA_OK(cudaLaunchHostFunc(s, hold, &ms));
  cudaKernel_t kern = NULL; /* local.c's f32 scale kernel */
  cr_assert_eq(mpg__nccl_scale_kernel_f32(&kern), cudaSuccess);
  void *dst = buf, *src = buf;
  uint64_t n = 4;
  double scale = 2.0;
  void *args[4] = {&dst, &src, &n, &scale};
  dim3 g = {1, 1, 1}, b = {256, 1, 1};
  CUDA_OK(cudaLaunchKernel((const void *)kern, g, b, args, 0, s));
  scale = 100.0;
  n = 1;
  CUDA_OK(cudaStreamSynchronize(s));
  CUDA_OK(cudaMemcpy(back, buf, sizeof back, cudaMemcpyDeviceToHost));
  for (int i = 0; i < 4; i++) cr_assert_eq(back[i], 2 * host[i]);
  dim3 zero = {0, 1, 1};
  CUDA_IS(cudaLaunchKernel((const void *)kern, zero, b, args, 0, s),
          cudaErrorInvalidConfiguration);
  CUDA_IS(cudaLaunchKernel((const void *)host, g, b, args, 0, s), cudaErrorInvalidDeviceFunction);
}
