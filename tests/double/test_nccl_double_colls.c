/* The NCCL half of the test double (test_nccl_double.c): the reference
 * arithmetic, all-reduce of every dtype and op, the other collectives,
 * split, sends and receives. */

#include "test_nccl_double.h"

/* ------------------------------------------------------------------------ */
/* Reference arithmetic (independent of the double's code)                  */
/* ------------------------------------------------------------------------ */

/* f32 -> f16 / bf16, nearest even, by scaling in double (exact for f32). */
static uint16_t ref_to_half(int bf, float f) {
  uint16_t sign = signbit(f) ? 0x8000 : 0;
  double a = fabs((double)f);
  int mbits = bf ? 7 : 10, bias = bf ? 127 : 15, emax = bf ? 127 : 15;
  if (isnan(f)) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return bf ? (uint16_t)((u >> 16) | 0x40) : (uint16_t)(sign | 0x7e00);
  }
  if (isinf(f)) return (uint16_t)(sign | (bf ? 0x7f80 : 0x7c00));
  if (a == 0) return sign;
  int e;
  (void)frexp(a, &e);
  e -= 1; /* a = 1.x * 2^e */
  if (e < 1 - bias) {
    double q = nearbyint(ldexp(a, mbits + bias - 1)); /* subnormal units */
    return (uint16_t)(sign | (uint16_t)q);
  }
  double q = nearbyint((ldexp(a, -e) - 1.0) * (double)(1 << mbits));
  if (q == (double)(1 << mbits)) {
    q = 0;
    e++;
  }
  if (e > emax) return (uint16_t)(sign | (bf ? 0x7f80 : 0x7c00));
  return (uint16_t)(sign | (uint16_t)((e + bias) << mbits) | (uint16_t)q);
}

static float ref_from_half(int bf, uint16_t h) {
  if (bf) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
  }
  int e = (h >> 10) & 31, m = h & 1023;
  float v;
  if (e == 31) v = m ? NAN : INFINITY;
  else if (e == 0) v = ldexpf((float)m, -24);
  else v = ldexpf((float)(m + 1024), e - 25);
  return (h & 0x8000) ? -v : v;
}

static const ncclDataType_t all_types[] = {ncclInt8, ncclUint8, ncclInt32, ncclUint32,
                                           ncclInt64, ncclUint64, ncclFloat16, ncclFloat32,
                                           ncclFloat64, ncclBfloat16};
#define NTYPES 10

static size_t tsize(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    default: return 8;
  }
}

static int is_float(ncclDataType_t t) {
  return t == ncclFloat16 || t == ncclBfloat16 || t == ncclFloat32 || t == ncclFloat64;
}

/* Rank r's element i: fractional and mixed-sign for floats (rounding
 * depends on order), wrapping for small integers. */
static double value(ncclDataType_t t, int r, size_t i) {
  long k = (long)((i * 2654435761u + (size_t)r * 40503u) % 2001u) - 1000;
  if (is_float(t)) return (double)k / 7.25 + (double)r * 0.3125;
  return (double)(k % 90);
}

static void store(ncclDataType_t t, void *buf, size_t i, double v) {
  switch (t) {
    case ncclInt8: ((int8_t *)buf)[i] = (int8_t)v; break;
    case ncclUint8: ((uint8_t *)buf)[i] = (uint8_t)(int)v; break;
    case ncclInt32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case ncclUint32: ((uint32_t *)buf)[i] = (uint32_t)(int64_t)v; break;
    case ncclInt64: ((int64_t *)buf)[i] = (int64_t)v; break;
    case ncclUint64: ((uint64_t *)buf)[i] = (uint64_t)(int64_t)v; break;
    case ncclFloat16: ((uint16_t *)buf)[i] = ref_to_half(0, (float)v); break;
    case ncclBfloat16: ((uint16_t *)buf)[i] = ref_to_half(1, (float)v); break;
    case ncclFloat32: ((float *)buf)[i] = (float)v; break;
    case ncclFloat64: ((double *)buf)[i] = v; break;
    default: break;
  }
}

enum { OP_SUM, OP_PROD, OP_MAX, OP_MIN, OP_AVG, OP_PREMUL_HOST, OP_PREMUL_DEV, NOPS };
static const char *const opnames[] = {"sum", "prod", "max", "min", "avg", "premul(host)",
                                      "premul(device)"};

/* Rank r's pre-multiplier, exact in every floating type. */
static double scale_of(int r) { return 0.5 + 0.25 * r; }

/* The expected element i of a reduction over n ranks, as raw bytes. */
static void expect(ncclDataType_t t, int op, int n, size_t i, void *out) {
  if (is_float(t)) {
    int half = t == ncclFloat16 || t == ncclBfloat16, bf = t == ncclBfloat16;
    if (t == ncclFloat64) {
      double acc = 0;
      for (int p = 0; p < n; p++) {
        double x = value(t, p, i);
        if (op == OP_PREMUL_HOST || op == OP_PREMUL_DEV) {
          volatile double y = x * scale_of(p);
          x = y;
        }
        if (p == 0) acc = x;
        else if (op == OP_PROD) acc = acc * x;
        else if (op == OP_MAX) acc = x > acc ? x : acc;
        else if (op == OP_MIN) acc = x < acc ? x : acc;
        else acc = acc + x;
      }
      if (op == OP_AVG) acc = acc / (double)n;
      memcpy(out, &acc, 8);
      return;
    }
    /* NCCL's ncclAvg of a half is a pre-multiplied sum by half(1/n)
     * (src/enqueue.cc:2304-2312), and its preOp rounds every pre-multiplied
     * addend to the half (src/device/reduce_kernel.h:665-716). */
    float acc = 0;
    int pre = op == OP_PREMUL_HOST || op == OP_PREMUL_DEV || (half && op == OP_AVG);
    float avg_s = ref_from_half(bf, ref_to_half(bf, (float)(1.0 / n)));
    for (int p = 0; p < n; p++) {
      float x;
      if (half) x = ref_from_half(bf, ref_to_half(bf, (float)value(t, p, i)));
      else x = (float)value(t, p, i);
      if (pre) {
        volatile float y = x * (op == OP_AVG ? avg_s : (float)scale_of(p));
        x = y;
        if (half) x = ref_from_half(bf, ref_to_half(bf, x));
      }
      if (p == 0) acc = x;
      else if (op == OP_PROD) acc = acc * x;
      else if (op == OP_MAX) acc = x > acc ? x : acc;
      else if (op == OP_MIN) acc = x < acc ? x : acc;
      else acc = acc + x;
    }
    if (op == OP_AVG && !pre) acc = acc / (float)n;
    if (half) {
      uint16_t h = ref_to_half(bf, acc);
      memcpy(out, &h, 2);
    } else {
      memcpy(out, &acc, 4);
    }
    return;
  }
  /* integers: wrapping in the type, avg truncating towards zero */
  int64_t s = 0;
  uint64_t u = 0;
  int sgn = t == ncclInt8 || t == ncclInt32 || t == ncclInt64;
  int bits = (int)tsize(t) * 8;
  uint64_t mask = bits == 64 ? ~0ULL : ((1ULL << bits) - 1);
  for (int p = 0; p < n; p++) {
    int64_t x = (int64_t)value(t, p, i);
    uint64_t ux = (uint64_t)x & mask;
    if (p == 0) u = ux;
    else if (op == OP_PROD) u = (u * ux) & mask;
    else if (op == OP_SUM || op == OP_AVG) u = (u + ux) & mask;
    else {
      /* compare as the type */
      int64_t a = sgn ? (int64_t)(u << (64 - bits)) >> (64 - bits) : (int64_t)u;
      int64_t b = sgn ? (int64_t)(ux << (64 - bits)) >> (64 - bits) : (int64_t)ux;
      if (!sgn) {
        if (op == OP_MAX) u = ux > u ? ux : u;
        else u = ux < u ? ux : u;
      } else {
        if (op == OP_MAX) u = b > a ? ux : u;
        else u = b < a ? ux : u;
      }
    }
  }
  if (op == OP_AVG) {
    if (sgn) {
      s = (int64_t)(u << (64 - bits)) >> (64 - bits);
      u = (uint64_t)(s / n) & mask;
    } else {
      u = (u / (uint64_t)n) & mask;
    }
  }
  memcpy(out, &u, tsize(t)); /* little endian */
}

/* ------------------------------------------------------------------------ */
/* All-reduce of every dtype and op                                         */
/* ------------------------------------------------------------------------ */

static int allreduce_all(struct rank *rk) {
  const size_t count = (size_t)(uintptr_t)rk->arg;
  for (int ti = 0; ti < NTYPES; ti++) {
    ncclDataType_t t = all_types[ti];
    size_t es = tsize(t), bytes = count * es;
    char *host = malloc(bytes), *want = malloc(bytes);
    void *send = NULL, *recv = NULL, *dscale = NULL;
    RCHECK(host && want, "malloc");
    for (size_t i = 0; i < count; i++) store(t, host, i, value(t, rk->rank, i));
    CUDA_OK(cudaMalloc(&send, bytes));
    CUDA_OK(cudaMalloc(&recv, bytes));
    CUDA_OK(cudaMalloc(&dscale, 8));
    CUDA_OK(cudaMemcpy(send, host, bytes, cudaMemcpyHostToDevice));
    for (int op = 0; op < NOPS; op++) {
      ncclRedOp_t nop = (ncclRedOp_t)op;
      int premul = op == OP_PREMUL_HOST || op == OP_PREMUL_DEV;
      if (premul && !is_float(t)) continue;
      if (premul) {
        char sc[8] = {0};
        store(t, sc, 0, scale_of(rk->rank));
        if (op == OP_PREMUL_HOST) {
          NCCL_OK(ncclRedOpCreatePreMulSum(&nop, sc, t, ncclScalarHostImmediate, rk->comm));
        } else {
          CUDA_OK(cudaMemcpy(dscale, sc, es, cudaMemcpyHostToDevice));
          NCCL_OK(ncclRedOpCreatePreMulSum(&nop, dscale, t, ncclScalarDevice, rk->comm));
        }
      }
      /* in place for the odd ops */
      void *dst = op & 1 ? send : recv;
      CUDA_OK(cudaMemcpy(send, host, bytes, cudaMemcpyHostToDevice));
      NCCL_OK(ncclAllReduce(send, dst, count, t, nop, rk->comm, 0));
      if (premul) NCCL_OK(ncclRedOpDestroy(nop, rk->comm)); /* allowed before it runs */
      CUDA_OK(cudaStreamSynchronize(0));
      char *got = malloc(bytes);
      RCHECK(got, "malloc");
      CUDA_OK(cudaMemcpy(got, dst, bytes, cudaMemcpyDeviceToHost));
      for (size_t i = 0; i < count; i++) expect(t, op, rk->n, i, want + i * es);
      for (size_t i = 0; i < count; i++)
        if (memcmp(got + i * es, want + i * es, es)) {
          uint64_t g = 0, w = 0;
          memcpy(&g, got + i * es, es);
          memcpy(&w, want + i * es, es);
          free(got);
          return rank_fail(rk->rank, __LINE__, "%s type %d op %s, %d ranks: element %zu is 0x%llx, "
                           "want 0x%llx", "all-reduce", (int)t, opnames[op], rk->n, i,
                           (unsigned long long)g, (unsigned long long)w);
        }
      free(got);
    }
    cudaFree(send);
    cudaFree(recv);
    cudaFree(dscale);
    free(host);
    free(want);
  }
  return 0;
}

Test(allreduce, every_dtype_and_op_2_ranks) { run_world(2, allreduce_all, (void *)(uintptr_t)70001); }
Test(allreduce, every_dtype_and_op_4_ranks) { run_world(4, allreduce_all, (void *)(uintptr_t)9001); }
Test(allreduce, every_dtype_and_op_8_ranks) { run_world(8, allreduce_all, (void *)(uintptr_t)3001); }

/* Every f16 and bf16 value times a scale on one rank: the f32 -> half
 * rounding of the double (subnormals, overflow, ties) against the reference. */
static int every_half(struct rank *rk) {
  const float scales[] = {1.0f, 0.5f, 3.0f, 0.0009765625f, 1.0009765625f};
  uint16_t *host = malloc(65536 * 2), *got = malloc(65536 * 2);
  void *buf = NULL;
  RCHECK(host && got, "malloc");
  CUDA_OK(cudaMalloc(&buf, 65536 * 2));
  for (int bf = 0; bf < 2; bf++)
    for (int s = 0; s < 5; s++) {
      ncclDataType_t t = bf ? ncclBfloat16 : ncclFloat16;
      for (int i = 0; i < 65536; i++) host[i] = (uint16_t)i;
      CUDA_OK(cudaMemcpy(buf, host, 65536 * 2, cudaMemcpyHostToDevice));
      uint16_t sc = ref_to_half(bf, scales[s]);
      ncclRedOp_t op;
      NCCL_OK(ncclRedOpCreatePreMulSum(&op, &sc, t, ncclScalarHostImmediate, rk->comm));
      NCCL_OK(ncclAllReduce(buf, buf, 65536, t, op, rk->comm, 0));
      NCCL_OK(ncclRedOpDestroy(op, rk->comm));
      CUDA_OK(cudaStreamSynchronize(0));
      CUDA_OK(cudaMemcpy(got, buf, 65536 * 2, cudaMemcpyDeviceToHost));
      for (int i = 0; i < 65536; i++) {
        float x = ref_from_half(bf, (uint16_t)i);
        volatile float y = x * ref_from_half(bf, sc);
        uint16_t w = ref_to_half(bf, y);
        if (isnan(y)) continue; /* NaN payloads: both quiet */
        RCHECK(got[i] == w, "%s 0x%04x * %g: got 0x%04x want 0x%04x", bf ? "bf16" : "f16", i,
               (double)scales[s], got[i], w);
      }
    }
  cudaFree(buf);
  free(host);
  free(got);
  return 0;
}

Test(allreduce, every_half_value_rounds_like_the_thread_backend) { run_world(1, every_half, NULL); }

/* ncclAvg of f16/bf16 is NCCL's pre-multiplied sum by half(1/n)
 * (src/enqueue.cc:2304-2312): each addend is rounded to the half before the
 * sum, so tiny addends vanish where a sum divided by n keeps them (the
 * thread backend's arithmetic).  Every rank sends the same values. */
static int tiny_half_avg(struct rank *rk) {
  enum { C = 6 };
  /* f16: 1e-7 (0x0002 = 2^-23), the smallest subnormals, the smallest
   * normal, 1; bf16: subnormals (33 units ~ 3e-39), 2^-24, 1. */
  static const uint16_t vals[2][C] = {{0x0002, 0x0001, 0x0003, 0x0007, 0x0400, 0x3c00},
                                      {0x0021, 0x0001, 0x0003, 0x0080, 0x3380, 0x3f80}};
  int n = rk->n, vanished = 0;
  for (int bf = 0; bf < 2; bf++) {
    ncclDataType_t t = bf ? ncclBfloat16 : ncclFloat16;
    uint16_t got[C];
    void *buf = NULL;
    CUDA_OK(cudaMalloc(&buf, sizeof got));
    CUDA_OK(cudaMemcpy(buf, vals[bf], sizeof got, cudaMemcpyHostToDevice));
    NCCL_OK(ncclAllReduce(buf, buf, C, t, ncclAvg, rk->comm, 0));
    CUDA_OK(cudaStreamSynchronize(0));
    CUDA_OK(cudaMemcpy(got, buf, sizeof got, cudaMemcpyDeviceToHost));
    cudaFree(buf);
    float s = ref_from_half(bf, ref_to_half(bf, (float)(1.0 / n)));
    for (int j = 0; j < C; j++) {
      float x = ref_from_half(bf, vals[bf][j]);
      volatile float y = x * s;
      float addend = ref_from_half(bf, ref_to_half(bf, y)), acc = 0;
      for (int p = 0; p < n; p++) acc = acc + addend;
      uint16_t want = ref_to_half(bf, acc);
      /* the thread backend's: the f32 sum divided by n, rounded once */
      uint16_t divided = ref_to_half(bf, (x * (float)n) / (float)n);
      RCHECK(got[j] == want, "%s avg of 0x%04x over %d ranks: got 0x%04x, want 0x%04x (NCCL's "
             "pre-multiplied sum; a sum divided by n gives 0x%04x)", bf ? "bf16" : "f16",
             vals[bf][j], n, got[j], want, divided);
      vanished += got[j] != divided;
    }
  }
  /* 1e-7 in f16 is 2^-23: times half(1/4) it is half of the smallest
   * subnormal, rounded to even: 0. */
  RCHECK(n < 4 || vanished > 0, "no f16/bf16 average of %d ranks differed from a sum divided by "
         "the rank count", n);
  return 0;
}

Test(allreduce, half_avg_is_a_premultiplied_sum_2_ranks) { run_world(2, tiny_half_avg, NULL); }
Test(allreduce, half_avg_is_a_premultiplied_sum_4_ranks) { run_world(4, tiny_half_avg, NULL); }
Test(allreduce, half_avg_is_a_premultiplied_sum_8_ranks) { run_world(8, tiny_half_avg, NULL); }

/* 64 MiB of f32 on 2 ranks: many staging chunks (8 MiB under a
 * sanitizer, MESHPG_SANITIZER, where it would take 10 s). */
static int big_allreduce(struct rank *rk) {
  const size_t count = getenv("MESHPG_SANITIZER") ? 2u << 20 : 16u << 20;
  float *h = malloc(count * 4);
  void *buf = NULL;
  RCHECK(h, "malloc");
  for (size_t i = 0; i < count; i++) h[i] = (float)(i % 1000) + (float)rk->rank;
  CUDA_OK(cudaMalloc(&buf, count * 4));
  CUDA_OK(cudaMemcpy(buf, h, count * 4, cudaMemcpyHostToDevice));
  NCCL_OK(ncclAllReduce(buf, buf, count, ncclFloat32, ncclSum, rk->comm, 0));
  CUDA_OK(cudaStreamSynchronize(0));
  CUDA_OK(cudaMemcpy(h, buf, count * 4, cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < count; i++)
    RCHECK(h[i] == 2.0f * (float)(i % 1000) + 1.0f, "element %zu: %g", i, (double)h[i]);
  cudaFree(buf);
  free(h);
  return 0;
}

Test(allreduce, sixty_four_mib) { run_world(2, big_allreduce, NULL); }

/* ------------------------------------------------------------------------ */
/* The other collectives, in and out of place                               */
/* ------------------------------------------------------------------------ */

static int other_colls(struct rank *rk) {
  const int n = rk->n, r = rk->rank;
  const size_t count = 150000; /* several staging chunks at 4 ranks */
  const size_t bytes = count * 4;
  int32_t *h = malloc(bytes * (size_t)n), *got = malloc(bytes * (size_t)n);
  char *big = NULL, *small = NULL;
  RCHECK(h && got, "malloc");
  CUDA_OK(cudaMalloc((void **)&big, bytes * (size_t)n));
  CUDA_OK(cudaMalloc((void **)&small, bytes));

  /* broadcast from root 2, out of place then in place */
  for (size_t i = 0; i < count; i++) h[i] = (int32_t)(i * 3 + (size_t)r * 1000000);
  CUDA_OK(cudaMemcpy(small, h, bytes, cudaMemcpyHostToDevice));
  NCCL_OK(ncclBroadcast(small, big, count, ncclInt32, 2, rk->comm, 0));
  NCCL_OK(ncclBcast(small, count, ncclInt32, 1, rk->comm, 0));
  CUDA_OK(cudaStreamSynchronize(0));
  CUDA_OK(cudaMemcpy(got, big, bytes, cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < count; i++) RCHECK(got[i] == (int32_t)(i * 3 + 2000000), "bcast %zu", i);
  CUDA_OK(cudaMemcpy(got, small, bytes, cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < count; i++) RCHECK(got[i] == (int32_t)(i * 3 + 1000000), "bcast in place %zu", i);

  /* reduce (max) to root 3 */
  for (size_t i = 0; i < count; i++) h[i] = (int32_t)((i + (size_t)r * 7) % 11) - 5;
  CUDA_OK(cudaMemcpy(small, h, bytes, cudaMemcpyHostToDevice));
  NCCL_OK(ncclReduce(small, r == 3 ? big : NULL, count, ncclInt32, ncclMax, 3, rk->comm, 0));
  CUDA_OK(cudaStreamSynchronize(0));
  if (r == 3) {
    CUDA_OK(cudaMemcpy(got, big, bytes, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < count; i++) {
      int32_t m = -100;
      for (int p = 0; p < n; p++) {
        int32_t v = (int32_t)((i + (size_t)p * 7) % 11) - 5;
        m = v > m ? v : m;
      }
      RCHECK(got[i] == m, "reduce %zu: %d want %d", i, got[i], m);
    }
  }

  /* all-gather out of place, then in place (send = recv + rank * count) */
  for (size_t i = 0; i < count; i++) h[i] = (int32_t)(i + (size_t)r * 100000);
  CUDA_OK(cudaMemcpy(small, h, bytes, cudaMemcpyHostToDevice));
  NCCL_OK(ncclAllGather(small, big, count, ncclInt32, rk->comm, 0));
  CUDA_OK(cudaStreamSynchronize(0));
  CUDA_OK(cudaMemcpy(got, big, bytes * (size_t)n, cudaMemcpyDeviceToHost));
  for (int p = 0; p < n; p++)
    for (size_t i = 0; i < count; i++)
      RCHECK(got[(size_t)p * count + i] == (int32_t)(i + (size_t)p * 100000), "allgather %d %zu", p, i);
  CUDA_OK(cudaMemset(big, 0, bytes * (size_t)n));
  CUDA_OK(cudaMemcpy(big + (size_t)r * bytes, h, bytes, cudaMemcpyHostToDevice));
  NCCL_OK(ncclAllGather(big + (size_t)r * bytes, big, count, ncclInt32, rk->comm, 0));
  CUDA_OK(cudaStreamSynchronize(0));
  CUDA_OK(cudaMemcpy(got, big, bytes * (size_t)n, cudaMemcpyDeviceToHost));
  for (int p = 0; p < n; p++)
    for (size_t i = 0; i < count; i++)
      RCHECK(got[(size_t)p * count + i] == (int32_t)(i + (size_t)p * 100000),
             "allgather in place %d %zu", p, i);

  /* reduce-scatter (sum) out of place, then in place (recv = send + rank * count) */
  for (size_t i = 0; i < count * (size_t)n; i++) h[i] = (int32_t)(i % 1000) + r;
  CUDA_OK(cudaMemcpy(big, h, bytes * (size_t)n, cudaMemcpyHostToDevice));
  NCCL_OK(ncclReduceScatter(big, small, count, ncclInt32, ncclSum, rk->comm, 0));
  CUDA_OK(cudaStreamSynchronize(0));
  CUDA_OK(cudaMemcpy(got, small, bytes, cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < count; i++) {
    size_t j = (size_t)r * count + i;
    int32_t want = (int32_t)(n * (int)(j % 1000) + n * (n - 1) / 2);
    RCHECK(got[i] == want, "reducescatter %zu: %d want %d", i, got[i], want);
  }
  CUDA_OK(cudaMemcpy(big, h, bytes * (size_t)n, cudaMemcpyHostToDevice));
  NCCL_OK(ncclReduceScatter(big, big + (size_t)r * bytes, count, ncclInt32, ncclSum, rk->comm, 0));
  CUDA_OK(cudaStreamSynchronize(0));
  CUDA_OK(cudaMemcpy(got, big + (size_t)r * bytes, bytes, cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < count; i++) {
    size_t j = (size_t)r * count + i;
    int32_t want = (int32_t)(n * (int)(j % 1000) + n * (n - 1) / 2);
    RCHECK(got[i] == want, "reducescatter in place %zu: %d want %d", i, got[i], want);
  }
  cudaFree(big);
  cudaFree(small);
  free(h);
  free(got);
  return 0;
}

Test(collectives, broadcast_reduce_allgather_reducescatter_in_and_out_of_place) {
  run_world(4, other_colls, NULL);
}

/* ------------------------------------------------------------------------ */
/* Split                                                                     */
/* ------------------------------------------------------------------------ */

static int split_ranks(struct rank *rk) {
  int r = rk->rank;
  int nonblocking = rk->arg != NULL;
  /* colour 0: parent ranks 0 and 2 (key -rank: 2 first); colour 1: rank
   * 1; rank 3 takes no part. */
  int color = r == 3 ? NCCL_SPLIT_NOCOLOR : r == 1 ? 1 : 0;
  ncclComm_t child = (ncclComm_t)0x1;
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = nonblocking ? 0 : 1;
  ncclResult_t res = ncclCommSplit(rk->comm, color, -r, &child, &cfg);
  RCHECK(res == ncclSuccess, "split: %s (%s)", ncclGetErrorString(res), ncclGetLastError(NULL));
  ncclResult_t st = ncclInProgress;
  while (st == ncclInProgress) NCCL_OK(ncclCommGetAsyncError(rk->comm, &st));
  RCHECK(st == ncclSuccess, "parent after split: %s", ncclGetErrorString(st));
  if (r == 3) {
    RCHECK(child == NULL, "NCCL_SPLIT_NOCOLOR gave %p", (void *)child);
    return 0;
  }
  while (!__atomic_load_n(&child, __ATOMIC_ACQUIRE)) sched_yield();
  st = ncclInProgress;
  while (st == ncclInProgress) NCCL_OK(ncclCommGetAsyncError(child, &st));
  RCHECK(st == ncclSuccess, "child: %s", ncclGetErrorString(st));
  int cn = -1, cr = -1, dev = -1;
  NCCL_OK(ncclCommCount(child, &cn));
  NCCL_OK(ncclCommUserRank(child, &cr));
  NCCL_OK(ncclCommCuDevice(child, &dev));
  int want_n = r == 1 ? 1 : 2, want_r = r == 2 ? 0 : r == 0 ? 1 : 0;
  RCHECK(cn == want_n && cr == want_r && dev == r, "child of rank %d: rank %d of %d on %d", r,
         cr, cn, dev);
  int32_t *buf = NULL, v = r + 10;
  CUDA_OK(cudaMalloc((void **)&buf, 4));
  CUDA_OK(cudaMemcpy(buf, &v, 4, cudaMemcpyHostToDevice));
  res = ncclAllReduce(buf, buf, 1, ncclInt32, ncclSum, child, 0);
  RCHECK(res == ncclSuccess || (nonblocking && res == ncclInProgress), "child all-reduce: %s",
         ncclGetErrorString(res));
  CUDA_OK(cudaStreamSynchronize(0));
  CUDA_OK(cudaMemcpy(&v, buf, 4, cudaMemcpyDeviceToHost));
  RCHECK(v == (r == 1 ? 11 : 10 + 12), "child sum %d", v);
  cudaFree(buf);
  NCCL_OK(ncclCommDestroy(child));
  return 0;
}

Test(split, keys_and_nocolor) { run_world(4, split_ranks, NULL); }
Test(split, nonblocking) { run_world_cfg(4, 0, split_ranks, (void *)1); }

/* ------------------------------------------------------------------------ */
/* Sends and receives                                                        */
/* ------------------------------------------------------------------------ */

static int ring(struct rank *rk) {
  int n = rk->n, r = rk->rank, next = (r + 1) % n, prev = (r + n - 1) % n;
  const size_t count = (3u << 20) / 4; /* 3 MiB: many times the ring */
  int32_t *h = malloc(count * 4);
  char *s1, *s2, *d1, *d2, *self_s, *self_d;
  RCHECK(h, "malloc");
  CUDA_OK(cudaMalloc((void **)&s1, count * 4));
  CUDA_OK(cudaMalloc((void **)&s2, 64));
  CUDA_OK(cudaMalloc((void **)&d1, count * 4));
  CUDA_OK(cudaMalloc((void **)&d2, 64));
  CUDA_OK(cudaMalloc((void **)&self_s, 40));
  CUDA_OK(cudaMalloc((void **)&self_d, 40));
  for (size_t i = 0; i < count; i++) h[i] = (int32_t)(i ^ ((size_t)r << 24));
  CUDA_OK(cudaMemcpy(s1, h, count * 4, cudaMemcpyHostToDevice));
  int32_t small[16], mine[10];
  for (int i = 0; i < 16; i++) small[i] = r * 100 + i;
  for (int i = 0; i < 10; i++) mine[i] = -r - i;
  CUDA_OK(cudaMemcpy(s2, small, 64, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(self_s, mine, 40, cudaMemcpyHostToDevice));
  /* Two non-blocking streams in one group: NCCL joins them around its
   * kernel.  The copies above are ordered on the legacy stream only. */
  cudaStream_t st, st2;
  CUDA_OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  CUDA_OK(cudaStreamCreateWithFlags(&st2, cudaStreamNonBlocking));
  CUDA_OK(cudaDeviceSynchronize());
  /* receives first on purpose: all are posted together */
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclRecv(d1, count, ncclInt32, prev, rk->comm, st));
  NCCL_OK(ncclRecv(d2, 16, ncclInt32, prev, rk->comm, st));
  NCCL_OK(ncclSend(s1, count, ncclInt32, next, rk->comm, st2));
  NCCL_OK(ncclSend(s2, 16, ncclInt32, next, rk->comm, st2));
  NCCL_OK(ncclSend(self_s, 10, ncclInt32, r, rk->comm, st));
  NCCL_OK(ncclRecv(self_d, 10, ncclInt32, r, rk->comm, st2));
  NCCL_OK(ncclGroupEnd());
  CUDA_OK(cudaStreamSynchronize(st2)); /* waits for the kernel too */
  CUDA_OK(cudaMemcpy(h, d1, count * 4, cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < count; i++)
    RCHECK(h[i] == (int32_t)(i ^ ((size_t)prev << 24)), "big message %zu", i);
  CUDA_OK(cudaMemcpy(small, d2, 64, cudaMemcpyDeviceToHost));
  for (int i = 0; i < 16; i++) RCHECK(small[i] == prev * 100 + i, "second message %d", i);
  CUDA_OK(cudaMemcpy(mine, self_d, 40, cudaMemcpyDeviceToHost));
  for (int i = 0; i < 10; i++) RCHECK(mine[i] == -r - i, "self message %d", i);
  cudaFree(s1);
  cudaFree(s2);
  cudaFree(d1);
  cudaFree(d2);
  cudaFree(self_s);
  cudaFree(self_d);
  CUDA_OK(cudaStreamDestroy(st));
  CUDA_OK(cudaStreamDestroy(st2));
  free(h);
  return 0;
}

Test(p2p, ring_in_one_group) { run_world(4, ring, NULL); }

static int self_unmatched(struct rank *rk) {
  void *b = NULL;
  CUDA_OK(cudaMalloc(&b, 16));
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclSend(b, 4, ncclInt32, 0, rk->comm, 0));
  ncclResult_t r = ncclGroupEnd();
  RCHECK(r == ncclInvalidUsage && strstr(ncclGetLastError(NULL), "Trying to send to self without a matching recv"),
         "got %s: %s", ncclGetErrorString(r), ncclGetLastError(NULL));
  r = ncclGroupEnd();
  RCHECK(r == ncclInvalidUsage && !strcmp(ncclGetLastError(NULL), "ncclGroupEnd: not in a group call."),
         "got %s: %s", ncclGetErrorString(r), ncclGetLastError(NULL));
  cudaFree(b);
  return 0;
}

Test(p2p, send_to_self_without_receive_and_stray_group_end) { run_world(1, self_unmatched, NULL); }

/* One thread drives two devices: ncclCommInitAll, then one group with a
 * collective on each communicator, each on its own device's legacy stream
 * (NCCL makes each communicator's device current to launch it). */
Test(p2p, one_thread_two_devices_in_one_group) {
  ncclComm_t comms[2];
  cr_assert_eq(ncclCommInitAll(comms, 2, NULL), ncclSuccess, "%s", ncclGetLastError(NULL));
  int32_t *buf[2];
  for (int d = 0; d < 2; d++) {
    int32_t v[3] = {d + 1, 10 * (d + 1), 100 * (d + 1)};
    cr_assert_eq(cudaSetDevice(d), cudaSuccess);
    cr_assert_eq(cudaMalloc((void **)&buf[d], sizeof v), cudaSuccess);
    cr_assert_eq(cudaMemcpy(buf[d], v, sizeof v, cudaMemcpyHostToDevice), cudaSuccess);
    cr_assert_eq(cudaDeviceSynchronize(), cudaSuccess);
  }
  cr_assert_eq(cudaSetDevice(0), cudaSuccess);
  cr_assert_eq(ncclGroupStart(), ncclSuccess);
  for (int d = 0; d < 2; d++)
    cr_assert_eq(ncclAllReduce(buf[d], buf[d], 3, ncclInt32, ncclSum, comms[d], 0), ncclSuccess);
  cr_assert_eq(ncclGroupEnd(), ncclSuccess, "%s", ncclGetLastError(NULL));
  for (int d = 0; d < 2; d++) {
    int32_t v[3];
    cr_assert_eq(cudaSetDevice(d), cudaSuccess);
    cr_assert_eq(cudaDeviceSynchronize(), cudaSuccess);
    cr_assert_eq(cudaMemcpy(v, buf[d], sizeof v, cudaMemcpyDeviceToHost), cudaSuccess);
    cr_assert(v[0] == 3 && v[1] == 30 && v[2] == 300, "device %d: %d %d %d", d, v[0], v[1], v[2]);
    cr_assert_eq(cudaFree(buf[d]), cudaSuccess);
    cr_assert_eq(ncclCommDestroy(comms[d]), ncclSuccess);
  }
}
