/* The NCCL half of the test double (tests/double/nccl_double.c), on its
 * own: NCCL's API as groups/nccl/ uses it, with ranks as threads (each on
 * its own simulated device, cudaSetDevice(rank)) and as forked processes.
 *
 *  - all-reduce of every dtype and op (sum, prod, max, min, avg, pre-
 *    multiplied sums with host and device scalars) on worlds of 2, 4 and 8
 *    equals a CPU reduction in rank order with the thread backend's
 *    arithmetic (f16/bf16 in f32, rounded once; f32/f64 avg = sum / n),
 *    except that f16/bf16 avg and pre-multiplied f16/bf16 addends are
 *    rounded to the half before the sum, as NCCL does, bit for bit; every
 *    f16 value through a pre-multiplied sum on one rank; f16 avg of tiny
 *    addends at 2, 4 and 8 ranks (1e-7 becomes 0: NCCL's ncclAvg);
 *  - broadcast, reduce, all-gather and reduce-scatter, in and out of place,
 *    over several staging chunks; a 64 MiB all-reduce;
 *  - ncclCommSplit with keys and NCCL_SPLIT_NOCOLOR, blocking and not;
 *  - a ring of sends and receives in one group (larger than the rings), two
 *    messages to one peer, a send to self;
 *  - one thread driving two devices (ncclCommInitAll, one group);
 *  - the non-blocking life cycle (ncclInProgress, ncclCommGetAsyncError,
 *    ncclCommFinalize, ncclCommDestroy) and calls after destroy;
 *  - a kernel stuck on another communicator: ncclCommRevoke first, or every
 *    ncclCommAbort in one group, never waits for it (R8);
 *  - NCCL's argument errors with NCCL's wording, and a non-blocking
 *    communicator keeping the error;
 *  - duplicate GPU refused; abort unblocking a stuck kernel; the hang and
 *    async faults; registration;
 *  - in a child process (the double reports by aborting the process): a
 *    collective order mismatch, a cross-communicator deadlock and a send
 *    without its receive caught by the watchdog, an ncclCommAbort waiting
 *    for another communicator's kernel (R8), a registration mismatch, a
 *    destroy that would leave NCCL's group depth raised, ncclRedOpDestroy
 *    after ncclCommAbort or while the enqueue is still in progress;
 *  - ranks as processes: a forked world all-reduces through the shared
 *    segment, and a child killed by MESHPG_DOUBLE_FAULT=kill gives its
 *    peers ncclRemoteError.
 *
 * Ranks are threads: Criterion's asserts do not run on them; a rank records
 * its first failure (RCHECK) and the test thread asserts.  Each Criterion
 * test is a process of its own, so environment variables set by a test
 * (faults, the watchdog) reach the double before its first use.  Child
 * processes are this program again (fork + exec, so that TSan builds work),
 * told what to run by MESHPG_NCCL_DOUBLE_CHILD (child_main, at the end).
 * Link: the double (cuda_double.c, cuda_twins.c, nccl_double.c), Criterion,
 * -lrt -pthread -lm. */
#include <criterion/criterion.h>

#include <cuda_runtime.h>
#include <nccl.h>

#include "../time_bound.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "double.h"

/* ------------------------------------------------------------------------ */
/* Rank threads                                                              */
/* ------------------------------------------------------------------------ */

static pthread_mutex_t fail_mu = PTHREAD_MUTEX_INITIALIZER;
static char fail_msg[4096];

static int rank_fail(int rank, int line, const char *fmt, ...) {
  char buf[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  pthread_mutex_lock(&fail_mu);
  if (!fail_msg[0]) snprintf(fail_msg, sizeof fail_msg, "rank %d, line %d: %s", rank, line, buf);
  fprintf(stderr, "rank %d failed at line %d: %s\n", rank, line, buf); /* a crash loses fail_msg */
  pthread_mutex_unlock(&fail_mu);
  return -1;
}

#define RCHECK(cond, ...)                                                  \
  do {                                                                     \
    if (!(cond)) return rank_fail(rk->rank, __LINE__, __VA_ARGS__);        \
  } while (0)

#define NCCL_OK(expr)                                                          \
  do {                                                                         \
    ncclResult_t r_ = (expr);                                                  \
    RCHECK(r_ == ncclSuccess, "%s: %s (%s)", #expr, ncclGetErrorString(r_),    \
           ncclGetLastError(NULL));                                            \
  } while (0)

#define CUDA_OK(expr)                                                          \
  do {                                                                         \
    cudaError_t e_ = (expr);                                                   \
    RCHECK(e_ == cudaSuccess, "%s: %s", #expr, cudaGetErrorString(e_));        \
  } while (0)

struct rank {
  int rank, n;
  ncclComm_t comm;
  void *arg;
};

typedef int (*rank_fn)(struct rank *);

struct world {
  int n, blocking, no_comm;
  ncclUniqueId id;
  rank_fn fn;
  void *arg;
};

struct thread_arg {
  struct world *w;
  int rank;
};

static int rank_body(struct world *w, int r) {
  struct rank rk0 = {r, w->n, NULL, w->arg}, *rk = &rk0;
  CUDA_OK(cudaSetDevice(r));
  if (!w->no_comm) {
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = w->blocking;
    ncclResult_t res = ncclCommInitRankConfig(&rk->comm, w->n, w->id, r, &cfg);
    if (!w->blocking) {
      RCHECK(res == ncclInProgress || res == ncclSuccess, "init: %s", ncclGetErrorString(res));
      ncclResult_t st = ncclInProgress;
      while (st == ncclInProgress) NCCL_OK(ncclCommGetAsyncError(rk->comm, &st));
      res = st;
    }
    RCHECK(res == ncclSuccess, "init: %s (%s)", ncclGetErrorString(res), ncclGetLastError(NULL));
  }
  int ret = w->fn(rk);
  if (rk->comm) {
    if (ret == 0) {
      CUDA_OK(cudaDeviceSynchronize());
      NCCL_OK(ncclCommDestroy(rk->comm));
    } else {
      (void)ncclCommAbort(rk->comm);
    }
  }
  return ret;
}

static void *rank_thread(void *p) {
  struct thread_arg *a = p;
  rank_body(a->w, a->rank);
  return NULL;
}

/* Run fn on n rank threads (a communicator each, from a fresh unique id,
 * unless no_comm); 0, or -1 with fail_msg set.  No Criterion call: forked
 * children use it too. */
static int world_run(int n, int blocking, int no_comm, rank_fn fn, void *arg) {
  struct world w = {n, blocking, no_comm, {{0}}, fn, arg};
  pthread_t th[64];
  struct thread_arg ta[64];
  fail_msg[0] = '\0';
  if (!no_comm && ncclGetUniqueId(&w.id) != ncclSuccess) {
    snprintf(fail_msg, sizeof fail_msg, "ncclGetUniqueId failed");
    return -1;
  }
  for (int i = 0; i < n; i++) {
    ta[i].w = &w;
    ta[i].rank = i;
    if (pthread_create(&th[i], NULL, rank_thread, &ta[i]) != 0) {
      snprintf(fail_msg, sizeof fail_msg, "pthread_create failed");
      n = i;
      break;
    }
  }
  for (int i = 0; i < n; i++) pthread_join(th[i], NULL);
  return fail_msg[0] ? -1 : 0;
}

static void run_world_cfg(int n, int blocking, rank_fn fn, void *arg) {
  world_run(n, blocking, 0, fn, arg);
  cr_assert(fail_msg[0] == '\0', "%s", fail_msg);
}

static void run_world(int n, rank_fn fn, void *arg) { run_world_cfg(n, 1, fn, arg); }

/* Threads without a communicator made for them. */
static void run_threads(int n, rank_fn fn, void *arg) {
  world_run(n, 1, 1, fn, arg);
  cr_assert(fail_msg[0] == '\0', "%s", fail_msg);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

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

/* ------------------------------------------------------------------------ */
/* Argument errors, with NCCL's wording                                     */
/* ------------------------------------------------------------------------ */

#define EXPECT_ERR(expr, code, text)                                                   \
  do {                                                                                 \
    ncclResult_t r_ = (expr);                                                          \
    RCHECK(r_ == (code) && strstr(ncclGetLastError(NULL), (text)),                    \
           "%s gave %s (\"%s\"), want %s with \"%s\"", #expr, ncclGetErrorString(r_),  \
           ncclGetLastError(NULL), ncclGetErrorString(code), text);                    \
  } while (0)

static int arg_errors(struct rank *rk) {
  float host[4] = {0};
  /* `other` is device 1's, allocated before the ranks started: a
   * cudaMalloc on device 1 now would wait for rank 1's kernel. */
  void *dev = NULL, *freed = NULL, *other = rk->arg;
  CUDA_OK(cudaMalloc(&dev, 64));
  CUDA_OK(cudaMalloc(&freed, 64)); /* freed last: no allocation reuses it */
  CUDA_OK(cudaFree(freed));
  char want[128];
  snprintf(want, sizeof want, "AllReduce : sendbuff %p is not a valid pointer", (void *)host);
  EXPECT_ERR(ncclAllReduce(host, dev, 4, ncclFloat32, ncclSum, rk->comm, 0), ncclInvalidArgument, want);
  snprintf(want, sizeof want, "AllReduce : recvbuff %p is not a valid pointer", freed);
  EXPECT_ERR(ncclAllReduce(dev, freed, 4, ncclFloat32, ncclSum, rk->comm, 0), ncclInvalidArgument, want);
  EXPECT_ERR(ncclAllReduce(other, dev, 4, ncclFloat32, ncclSum, rk->comm, 0), ncclInvalidArgument,
             "AllReduce : sendbuff allocated on device 1 mismatchs with NCCL device 0");
  EXPECT_ERR(ncclBroadcast(dev, dev, 4, ncclFloat32, 2, rk->comm, 0), ncclInvalidArgument,
             "Broadcast : invalid root 2 (root should be in the 0..2 range)");
  EXPECT_ERR(ncclSend(dev, 4, ncclFloat32, -1, rk->comm, 0), ncclInvalidArgument,
             "Send : invalid root -1");
  EXPECT_ERR(ncclAllReduce(dev, dev, 4, (ncclDataType_t)12, ncclSum, rk->comm, 0), ncclInvalidArgument,
             "AllReduce : invalid type 12");
  EXPECT_ERR(ncclAllReduce(dev, dev, 4, ncclFloat32, (ncclRedOp_t)-3, rk->comm, 0), ncclInvalidArgument,
             "AllReduce : invalid reduction operation -3");
  EXPECT_ERR(ncclAllReduce(dev, dev, 4, ncclFloat32, (ncclRedOp_t)77, rk->comm, 0), ncclInvalidArgument,
             "AllReduce : reduction operation 77 unknown to this communicator");
  EXPECT_ERR(ncclAllReduce(dev, dev, 4, ncclFloat8e4m3, ncclSum, rk->comm, 0), ncclInvalidArgument,
             "FP8 reduction support begins with sm90 capable devices.");
  float one = 1;
  ncclRedOp_t op;
  NCCL_OK(ncclRedOpCreatePreMulSum(&op, &one, ncclFloat32, ncclScalarHostImmediate, rk->comm));
  EXPECT_ERR(ncclAllReduce(dev, dev, 4, ncclFloat64, op, rk->comm, 0), ncclInvalidArgument,
             "Data type supplied to user-created ncclRedOp_t does not match type given to reduction operation");
  NCCL_OK(ncclRedOpDestroy(op, rk->comm));
  EXPECT_ERR(ncclRedOpDestroy(op, rk->comm), ncclInvalidArgument,
             "ncclRedOpDestroy : operator unknown to this communicator.");
  EXPECT_ERR(ncclRedOpDestroy(ncclSum, rk->comm), ncclInvalidArgument,
             "ncclRedOpDestroy : operator is a NCCL builtin.");
  EXPECT_ERR(ncclAllReduce(dev, dev, 4, ncclFloat32, ncclSum, NULL, 0), ncclInvalidArgument,
             "AllReduce : comm argument is NULL");
  /* fp8 moves without reducing; empty collectives are dropped */
  NCCL_OK(ncclAllGather((char *)dev + 4 * rk->rank, dev, 4, ncclFloat8e5m2, rk->comm, 0));
  NCCL_OK(ncclAllReduce(NULL, NULL, 0, ncclFloat32, ncclSum, rk->comm, 0));
  CUDA_OK(cudaStreamSynchronize(0));
  cudaFree(dev);
  return 0;
}

/* A world of 2 so that root 2 is out of range; rank 0 checks, rank 1 waits
 * for the two collectives that succeed. */
static int arg_errors_2(struct rank *rk) {
  if (rk->rank == 0) return arg_errors(rk);
  void *dev = NULL;
  CUDA_OK(cudaMalloc(&dev, 64));
  NCCL_OK(ncclAllGather((char *)dev + 4 * rk->rank, dev, 4, ncclFloat8e5m2, rk->comm, 0));
  CUDA_OK(cudaStreamSynchronize(0));
  cudaFree(dev);
  return 0;
}

Test(errors, nccl_argument_checks_and_wording) {
  void *other = NULL;
  cr_assert_eq(cudaSetDevice(1), cudaSuccess);
  cr_assert_eq(cudaMalloc(&other, 64), cudaSuccess);
  cr_assert_eq(cudaSetDevice(0), cudaSuccess);
  run_world(2, arg_errors_2, other);
  cr_assert_eq(cudaFree(other), cudaSuccess);
}

/* On a non-blocking communicator a failed enqueue becomes its error
 * (enqueue.cc:2660-2662): later calls report it. */
static int nonblocking_error_sticks(struct rank *rk) {
  float host[4] = {0};
  ncclResult_t r = ncclAllReduce(host, host, 4, ncclFloat32, ncclSum, rk->comm, 0);
  RCHECK(r == ncclInvalidArgument, "got %s", ncclGetErrorString(r));
  ncclResult_t st;
  NCCL_OK(ncclCommGetAsyncError(rk->comm, &st));
  RCHECK(st == ncclInvalidArgument && strstr(ncclGetLastError(NULL), "is not a valid pointer"),
         "async %s: %s", ncclGetErrorString(st), ncclGetLastError(NULL));
  int n = 0;
  RCHECK(ncclCommCount(rk->comm, &n) == ncclInvalidArgument, "count after the error");
  NCCL_OK(ncclCommAbort(rk->comm));
  rk->comm = NULL;
  return 0;
}

Test(errors, nonblocking_communicator_keeps_the_error) {
  run_world_cfg(1, 0, nonblocking_error_sticks, NULL);
}

/* ------------------------------------------------------------------------ */
/* Life cycle                                                                */
/* ------------------------------------------------------------------------ */

static int lifecycle(struct rank *rk) {
  int32_t *buf = NULL, v = rk->rank + 1;
  CUDA_OK(cudaMalloc((void **)&buf, 4));
  CUDA_OK(cudaMemcpy(buf, &v, 4, cudaMemcpyHostToDevice));
  ncclResult_t r = ncclAllReduce(buf, buf, 1, ncclInt32, ncclSum, rk->comm, 0);
  RCHECK(r == ncclInProgress, "non-blocking all-reduce answered %s", ncclGetErrorString(r));
  ncclResult_t st = ncclInProgress;
  while (st == ncclInProgress) NCCL_OK(ncclCommGetAsyncError(rk->comm, &st));
  RCHECK(st == ncclSuccess, "%s", ncclGetErrorString(st));
  r = ncclCommFinalize(rk->comm);
  RCHECK(r == ncclInProgress || r == ncclSuccess, "finalize: %s", ncclGetErrorString(r));
  st = ncclInProgress;
  while (st == ncclInProgress) NCCL_OK(ncclCommGetAsyncError(rk->comm, &st));
  RCHECK(st == ncclSuccess, "after finalize: %s", ncclGetErrorString(st));
  CUDA_OK(cudaMemcpy(&v, buf, 4, cudaMemcpyDeviceToHost));
  RCHECK(v == 3, "sum %d", v);
  EXPECT_ERR(ncclCommFinalize(rk->comm), ncclInvalidArgument, "called twice");
  /* the double finalize made the communicator's state an error: abort */
  NCCL_OK(ncclCommAbort(rk->comm));
  EXPECT_ERR(ncclCommGetAsyncError(rk->comm, &st), ncclInvalidArgument,
             "Error: corrupted comm object detected");
  EXPECT_ERR(ncclCommAbort(rk->comm), ncclInvalidArgument, "has already been destroyed");
  rk->comm = NULL;
  cudaFree(buf);
  return 0;
}

Test(lifecycle, nonblocking_finalize_destroy_and_use_after_abort) {
  run_world_cfg(2, 0, lifecycle, NULL);
}

static int dup_gpu(struct rank *rk) {
  CUDA_OK(cudaSetDevice(0));
  ncclComm_t c = NULL;
  ncclUniqueId *id = rk->arg;
  ncclResult_t r = ncclCommInitRank(&c, 2, *id, rk->rank);
  char want[128];
  snprintf(want, sizeof want, "Duplicate GPU detected : rank %d and rank %d both on CUDA device 10000",
           rk->rank, 1 - rk->rank);
  RCHECK(r == ncclInvalidUsage && !strcmp(ncclGetLastError(NULL), want), "got %s: \"%s\"",
         ncclGetErrorString(r), ncclGetLastError(NULL));
  RCHECK(c != NULL, "no handle to abort");
  NCCL_OK(ncclCommAbort(c));
  return 0;
}

Test(lifecycle, duplicate_gpu_refused) {
  ncclUniqueId id;
  cr_assert_eq(ncclGetUniqueId(&id), ncclSuccess);
  run_threads(2, dup_gpu, &id);
}

/* A kernel waiting for a peer that never issues its collective is freed by
 * ncclCommAbort, which then returns (no other kernel holds the device). */
static int abort_stuck(struct rank *rk) {
  void *b = NULL;
  CUDA_OK(cudaMalloc(&b, 64));
  if (rk->rank == 0) {
    NCCL_OK(ncclAllReduce(b, b, 16, ncclFloat32, ncclSum, rk->comm, 0));
    struct timespec ts = {0, 200 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  double t0 = now_s();
  NCCL_OK(ncclCommAbort(rk->comm));
  rk->comm = NULL;
  CUDA_OK(cudaStreamSynchronize(0));
  RCHECK(now_s() - t0 < 5, "abort took %.1f s", now_s() - t0);
  CUDA_OK(cudaFree(b));
  return 0;
}

Test(lifecycle, abort_unblocks_a_stuck_kernel) { run_world(2, abort_stuck, NULL); }

#ifdef NCCL_REVOKE_DEFAULT /* ncclCommRevoke: nccl.h of 2.28.9 and later */
/* Rank 0's kernel on B waits for rank 1, which never issues it.  Aborting
 * A first would wait for that kernel (cudaFree); revoking B first stops it,
 * so that A's abort and B's destroy return at once. */
static int revoke_first(struct rank *rk) {
  ncclUniqueId *ids = rk->arg;
  ncclComm_t a = NULL, b = NULL;
  NCCL_OK(ncclCommInitRank(&a, 2, ids[0], rk->rank));
  NCCL_OK(ncclCommInitRank(&b, 2, ids[1], rk->rank));
  void *x = NULL;
  CUDA_OK(cudaMalloc(&x, 64));
  if (rk->rank == 0) NCCL_OK(ncclAllReduce(x, x, 4, ncclFloat32, ncclSum, b, 0));
  double t0 = now_s();
  NCCL_OK(ncclCommRevoke(b, NCCL_REVOKE_DEFAULT));
  EXPECT_ERR(ncclAllReduce(x, x, 4, ncclFloat32, ncclSum, b, 0), ncclInvalidUsage,
             "AllReduce: communicator was revoked");
  NCCL_OK(ncclCommAbort(a));
  NCCL_OK(ncclCommDestroy(b));
  RCHECK(now_s() - t0 < 2, "revoke, abort and destroy took %.1f s", now_s() - t0);
  CUDA_OK(cudaFree(x));
  return 0;
}
#endif

/* The same with meshpg's other way out: every abort in one group.  NCCL
 * sets each abort flag at the call and frees at the outermost ncclGroupEnd. */
static int grouped_aborts(struct rank *rk) {
  ncclUniqueId *ids = rk->arg;
  ncclComm_t a = NULL, b = NULL;
  NCCL_OK(ncclCommInitRank(&a, 2, ids[0], rk->rank));
  NCCL_OK(ncclCommInitRank(&b, 2, ids[1], rk->rank));
  void *x = NULL;
  CUDA_OK(cudaMalloc(&x, 64));
  if (rk->rank == 0) NCCL_OK(ncclAllReduce(x, x, 4, ncclFloat32, ncclSum, b, 0));
  double t0 = now_s();
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclCommAbort(a));
  NCCL_OK(ncclCommAbort(b));
  NCCL_OK(ncclGroupEnd());
  RCHECK(now_s() - t0 < 2, "grouped aborts took %.1f s", now_s() - t0);
  EXPECT_ERR(ncclCommAbort(b), ncclInvalidArgument, "has already been destroyed");
  CUDA_OK(cudaFree(x));
  return 0;
}

Test(lifecycle, grouped_aborts_never_wait) {
  ncclUniqueId ids[2];
  cr_assert_eq(ncclGetUniqueId(&ids[0]), ncclSuccess);
  cr_assert_eq(ncclGetUniqueId(&ids[1]), ncclSuccess);
  run_threads(2, grouped_aborts, ids);
}

#ifdef NCCL_REVOKE_DEFAULT
Test(lifecycle, revoke_before_abort_never_waits) {
  ncclUniqueId ids[2];
  cr_assert_eq(ncclGetUniqueId(&ids[0]), ncclSuccess);
  cr_assert_eq(ncclGetUniqueId(&ids[1]), ncclSuccess);
  run_threads(2, revoke_first, ids);
}
#endif

/* ------------------------------------------------------------------------ */
/* Fault injection                                                           */
/* ------------------------------------------------------------------------ */

static int hang_fault(struct rank *rk) {
  void *b = NULL;
  CUDA_OK(cudaMalloc(&b, 64));
  NCCL_OK(ncclAllReduce(b, b, 16, ncclFloat32, ncclSum, rk->comm, 0)); /* op 1 */
  CUDA_OK(cudaStreamSynchronize(0));
  NCCL_OK(ncclAllReduce(b, b, 16, ncclFloat32, ncclSum, rk->comm, 0)); /* op 2: rank 1 hangs */
  struct timespec ts = {0, 300 * 1000 * 1000};
  nanosleep(&ts, NULL);
  dbl_stats_t s;
  dbl_stats(&s);
  RCHECK(s.collectives == 2, "%llu collectives ran, want 2 (op 2 must hang on both ranks)",
         (unsigned long long)s.collectives);
  NCCL_OK(ncclCommAbort(rk->comm));
  rk->comm = NULL;
  CUDA_OK(cudaStreamSynchronize(0));
  CUDA_OK(cudaFree(b));
  return 0;
}

Test(faults, hang_until_abort) {
  setenv("MESHPG_DOUBLE_FAULT", "hang:1:2", 1);
  run_world(2, hang_fault, NULL);
}

static int async_fault(struct rank *rk) {
  void *b = NULL;
  CUDA_OK(cudaMalloc(&b, 64));
  NCCL_OK(ncclAllReduce(b, b, 16, ncclFloat32, ncclSum, rk->comm, 0));
  CUDA_OK(cudaStreamSynchronize(0));
  ncclResult_t st;
  NCCL_OK(ncclCommGetAsyncError(rk->comm, &st));
  if (rk->rank == 0) {
    RCHECK(st == ncclSystemError && strstr(ncclGetLastError(NULL), "async:0:1"), "%s: %s",
           ncclGetErrorString(st), ncclGetLastError(NULL));
    NCCL_OK(ncclCommAbort(rk->comm));
    rk->comm = NULL;
  } else {
    RCHECK(st == ncclSuccess, "%s", ncclGetErrorString(st));
  }
  CUDA_OK(cudaFree(b));
  return 0;
}

Test(faults, async_error) {
  setenv("MESHPG_DOUBLE_FAULT", "async:0:1", 1);
  run_world(2, async_fault, NULL);
}

/* ------------------------------------------------------------------------ */
/* Registration                                                              */
/* ------------------------------------------------------------------------ */

static int registered(struct rank *rk) {
  int mismatch = rk->arg != NULL;
  void *b = NULL, *h = NULL;
  if (!mismatch || rk->rank == 0) {
    NCCL_OK(ncclMemAlloc(&b, 4096));
    NCCL_OK(ncclCommRegister(rk->comm, b, 4096, &h));
  } else {
    CUDA_OK(cudaMalloc(&b, 4096));
  }
  NCCL_OK(ncclAllReduce(b, (char *)b + 1024, 100, ncclFloat32, ncclSum, rk->comm, 0));
  CUDA_OK(cudaStreamSynchronize(0));
  if (h) {
    NCCL_OK(ncclCommDeregister(rk->comm, h));
    EXPECT_ERR(ncclCommDeregister(rk->comm, h), ncclInvalidUsage, "Deregister: Could not find handle");
    NCCL_OK(ncclMemFree(b));
  } else {
    CUDA_OK(cudaFree(b));
  }
  return 0;
}

Test(registration, every_rank_registered) { run_world(2, registered, NULL); }

/* ------------------------------------------------------------------------ */
/* Reports that end the process (run in a forked child)                     */
/* ------------------------------------------------------------------------ */

/* Children are this program again (fork + exec, so that a child starts
 * single-threaded: TSan refuses threads after a fork of a threaded
 * process), told by MESHPG_NCCL_DOUBLE_CHILD which body to run; child_main
 * below runs it before Criterion's main.  Returns the child's wait status
 * and its stderr.  `env` is NAME=VALUE;... for the child. */
static int in_child(const char *mode, const char *env, char *err, size_t errlen) {
  int fds[2];
  cr_assert_eq(pipe(fds), 0);
  pid_t pid = fork();
  cr_assert_neq(pid, -1);
  if (pid == 0) {
    close(fds[0]);
    dup2(fds[1], 2);
    char buf[512];
    snprintf(buf, sizeof buf, "%s", env ? env : "");
    char *save = NULL;
    for (char *t = strtok_r(buf, ";", &save); t; t = strtok_r(NULL, ";", &save)) {
      char *eq = strchr(t, '=');
      if (eq) {
        *eq = '\0';
        setenv(t, eq + 1, 1);
      }
    }
    setenv("MESHPG_NCCL_DOUBLE_CHILD", mode, 1);
    char *argv[] = {"test_nccl_double", NULL};
    execv("/proc/self/exe", argv);
    _exit(127);
  }
  close(fds[1]);
  size_t len = 0;
  ssize_t got;
  while (len + 1 < errlen && (got = read(fds[0], err + len, errlen - 1 - len)) > 0)
    len += (size_t)got;
  err[len] = '\0';
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  return status;
}

/* Aborting A alone while rank 0's kernel on B still waits: A's cudaFree
 * waits for that kernel (R8).  The kernel's watchdog names the abort. */
static int abort_one_by_one(struct rank *rk) {
  ncclUniqueId *ids = rk->arg;
  ncclComm_t a = NULL, b = NULL;
  NCCL_OK(ncclCommInitRank(&a, 2, ids[0], rk->rank));
  NCCL_OK(ncclCommInitRank(&b, 2, ids[1], rk->rank));
  void *x = NULL;
  CUDA_OK(cudaMalloc(&x, 64));
  if (rk->rank == 1) {
    struct timespec ts = {5, 0};
    nanosleep(&ts, NULL);
    return 0;
  }
  NCCL_OK(ncclAllReduce(x, x, 4, ncclFloat32, ncclSum, b, 0));
  NCCL_OK(ncclCommAbort(a)); /* hangs */
  return rank_fail(rk->rank, __LINE__, "the abort returned");
}

Test(reports, abort_waiting_for_another_communicators_kernel) {
  char err[32768];
  int st = in_child("abortonebyone", "MESHPG_DOUBLE_HANG_S=1", err, sizeof err);
  cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT, "child status %d; stderr: %s", st, err);
  /* Either watchdog may speak first: the CUDA half's, of the abort's wait
   * for the device, or the kernel's, which names the waiting abort. */
  cr_assert(strstr(err, "ncclCommAbort (cudaFree of the communicator's buffers)") ||
                (strstr(err, "ncclCommAbort of rank 0 of communicator") && strstr(err, "PR 564")),
            "stderr: %s", err);
  cr_assert(strstr(err, "ncclAllReduce(count 4, ncclFloat32, ncclSum) #1"), "stderr: %s", err);
}

static int mismatch(struct rank *rk) {
  void *b = NULL;
  CUDA_OK(cudaMalloc(&b, 64));
  if (rk->rank == 0) NCCL_OK(ncclAllReduce(b, b, 4, ncclFloat32, ncclSum, rk->comm, 0));
  else NCCL_OK(ncclAllGather(b, (char *)b + 16, 4, ncclFloat32, rk->comm, 0));
  CUDA_OK(cudaStreamSynchronize(0));
  return 0;
}


Test(reports, collective_order_mismatch_is_fatal) {
  char err[16384];
  int st = in_child("mismatch", NULL, err, sizeof err);
  cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT, "child status %d; stderr: %s", st, err);
  cr_assert(strstr(err, "does not match") && strstr(err, "ncclAllReduce(count 4, ncclFloat32, ncclSum)") &&
                strstr(err, "ncclAllGather(count 4, ncclFloat32)") && strstr(err, "rank 0") &&
                strstr(err, "rank 1"),
            "stderr: %s", err);
}

/* Two communicators, used in opposite orders on one stream by the two
 * ranks: each kernel waits for a peer that waits for the other. */
static int cross(struct rank *rk) {
  ncclUniqueId *ids = rk->arg;
  ncclComm_t a = NULL, b = NULL;
  NCCL_OK(ncclCommInitRank(&a, 2, ids[0], rk->rank));
  NCCL_OK(ncclCommInitRank(&b, 2, ids[1], rk->rank));
  void *x = NULL;
  CUDA_OK(cudaMalloc(&x, 64));
  ncclComm_t first = rk->rank == 0 ? a : b, second = rk->rank == 0 ? b : a;
  NCCL_OK(ncclAllReduce(x, x, 4, ncclFloat32, ncclSum, first, 0));
  NCCL_OK(ncclAllReduce(x, x, 4, ncclFloat32, ncclSum, second, 0));
  /* No host wait: the kernels' watchdog reports, not the CUDA half's. */
  struct timespec ts = {5, 0};
  nanosleep(&ts, NULL);
  return rank_fail(rk->rank, __LINE__, "the deadlock was not reported");
}


Test(reports, cross_communicator_deadlock_is_reported) {
  char err[32768];
  double t0 = now_s();
  int st = in_child("cross", "MESHPG_DOUBLE_HANG_S=1", err, sizeof err);
  cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT, "child status %d; stderr: %s", st, err);
  cr_assert(strstr(err, "deadlock") && strstr(err, "collective #1 ncclAllReduce(count 4, ncclFloat32, ncclSum)") &&
                strstr(err, "rank 0") && strstr(err, "rank 1") && strstr(err, "its kernel is at collective #0"),
            "stderr: %s", err);
  /* MESHPG_DOUBLE_HANG_S=1 plus 1 s for the child's start and report,
   * with the scheduler's allowance for its two rank threads. */
  cr_assert(now_s() - t0 < tb_bound(1.0 + 1.0, 2), "took %.1f s (bound %.1f s)", now_s() - t0,
            tb_bound(1.0 + 1.0, 2));
}


Test(reports, registration_mismatch_is_fatal) {
  char err[16384];
  int st = in_child("regmismatch", NULL, err, sizeof err);
  cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT, "child status %d; stderr: %s", st, err);
  cr_assert(strstr(err, "User Buffer Registration"), "stderr: %s", err);
}

static int unmatched_send(struct rank *rk) {
  void *b = NULL;
  CUDA_OK(cudaMalloc(&b, 64));
  if (rk->rank == 0) NCCL_OK(ncclSend(b, 16, ncclFloat32, 1, rk->comm, 0));
  struct timespec ts = {5, 0};
  nanosleep(&ts, NULL);
  return rank_fail(rk->rank, __LINE__, "the unmatched send was not reported");
}

Test(reports, send_without_receive_is_reported) {
  char err[16384];
  int st = in_child("unmatched", "MESHPG_DOUBLE_HANG_S=1", err, sizeof err);
  cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT, "child status %d; stderr: %s", st, err);
  cr_assert(strstr(err, "deadlock") && strstr(err, "it waits in send #1 ncclSend(count 16, ncclFloat32, peer 1)") &&
                strstr(err, "rank 1's kernels have started 0 receives from rank 0"),
            "stderr: %s", err);
}

static int destroy_twice(struct rank *rk) {
  NCCL_OK(ncclCommDestroy(rk->comm));
  EXPECT_ERR(ncclCommDestroy(rk->comm), ncclInvalidArgument, "has already been destroyed");
  rk->comm = NULL;
  (void)ncclGroupStart(); /* real NCCL's group depth is still raised: reported */
  return 0;
}


Test(reports, destroy_twice_then_use) {
  char err[16384];
  int st = in_child("destroytwice", NULL, err, sizeof err);
  cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT, "child status %d; stderr: %s", st, err);
  cr_assert(strstr(err, "ncclGroupStart called after ncclCommDestroy"), "stderr: %s", err);
}

/* ncclRedOpDestroy after ncclCommAbort (NCCL frees the operation with the
 * communicator: a write to freed memory), and on a non-blocking
 * communicator whose enqueue answered ncclInProgress, before
 * ncclCommGetAsyncError reported ncclSuccess (the user guide allows only
 * ncclCommGetAsyncError and ncclCommAbort then). */
static int redop_destroy_misuse(struct rank *rk) {
  int after_abort = rk->arg != NULL;
  float one = 1.0f;
  ncclRedOp_t op;
  void *b = NULL;
  CUDA_OK(cudaMalloc(&b, 64));
  NCCL_OK(ncclRedOpCreatePreMulSum(&op, &one, ncclFloat32, ncclScalarHostImmediate, rk->comm));
  if (after_abort) {
    NCCL_OK(ncclCommAbort(rk->comm));
    (void)ncclRedOpDestroy(op, rk->comm); /* reported */
    rk->comm = NULL;
    return rank_fail(rk->rank, __LINE__, "ncclRedOpDestroy after ncclCommAbort was not reported");
  }
  ncclResult_t r = ncclAllReduce(b, b, 4, ncclFloat32, op, rk->comm, 0);
  RCHECK(r == ncclInProgress, "non-blocking ncclAllReduce: %s", ncclGetErrorString(r));
  (void)ncclRedOpDestroy(op, rk->comm); /* reported */
  return rank_fail(rk->rank, __LINE__, "ncclRedOpDestroy while in progress was not reported");
}

Test(reports, redop_destroy_after_abort) {
  char err[16384];
  int st = in_child("redopabort", NULL, err, sizeof err);
  cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT, "child status %d; stderr: %s", st, err);
  cr_assert(strstr(err, "ncclRedOpDestroy") && strstr(err, "after ncclCommAbort") &&
                strstr(err, "init.cc:264"),
            "stderr: %s", err);
}

Test(reports, redop_destroy_while_in_progress) {
  char err[16384];
  int st = in_child("redopinprogress", NULL, err, sizeof err);
  cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT, "child status %d; stderr: %s", st, err);
  cr_assert(strstr(err, "ncclRedOpDestroy") && strstr(err, "still in progress"), "stderr: %s",
            err);
}

/* ------------------------------------------------------------------------ */
/* Ranks as processes                                                        */
/* ------------------------------------------------------------------------ */

/* Child rank r of n: init on device r, two all-reduces (the second is
 * where MESHPG_DOUBLE_FAULT=kill:2:2 strikes), then either check the sums
 * or, when `expect_death`, wait for the asynchronous error of the dead
 * peer and abort.  Exit status 0 on success. */
static int proc_rank(const ncclUniqueId *id, int r, int n, int expect_death) {
  if (cudaSetDevice(r) != cudaSuccess) return 10;
  ncclComm_t c = NULL;
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  ncclResult_t res = ncclCommInitRankConfig(&c, n, *id, r, &cfg);
  ncclResult_t st = res;
  while (st == ncclInProgress) ncclCommGetAsyncError(c, &st);
  if (st != ncclSuccess) {
    fprintf(stderr, "rank %d init: %s %s\n", r, ncclGetErrorString(st), ncclGetLastError(NULL));
    return 11;
  }
  const size_t count = 300000;
  float *h = malloc(count * 4);
  void *b = NULL;
  for (size_t i = 0; i < count; i++) h[i] = (float)(i % 100) * (float)(r + 1);
  cudaMalloc(&b, count * 4);
  cudaMemcpy(b, h, count * 4, cudaMemcpyHostToDevice);
  for (int k = 0; k < 2; k++) {
    res = ncclAllReduce(b, b, count, ncclFloat32, ncclSum, c, 0);
    if (res != ncclSuccess && res != ncclInProgress) return 12;
    st = ncclInProgress;
    while (st == ncclInProgress) ncclCommGetAsyncError(c, &st);
  }
  if (expect_death) {
    double t0 = now_s();
    st = ncclSuccess;
    while (st == ncclSuccess && now_s() - t0 < 10) {
      ncclCommGetAsyncError(c, &st);
      usleep(1000);
    }
    if (st != ncclRemoteError) {
      fprintf(stderr, "rank %d: async state %s\n", r, ncclGetErrorString(st));
      return 13;
    }
    if (!strstr(ncclGetLastError(NULL), "Connection closed by remote peer") ||
        !strstr(ncclGetLastError(NULL), "rank 2")) {
      fprintf(stderr, "rank %d: message %s\n", r, ncclGetLastError(NULL));
      return 14;
    }
    if (ncclCommAbort(c) != ncclSuccess) return 15;
    return 0;
  }
  cudaStreamSynchronize(0);
  cudaMemcpy(h, b, count * 4, cudaMemcpyDeviceToHost);
  /* first sum: (i % 100) * n(n+1)/2 everywhere; the second multiplies by n */
  float f = (float)(n * (n + 1) / 2) * (float)n;
  for (size_t i = 0; i < count; i++)
    if (h[i] != (float)(i % 100) * f) {
      fprintf(stderr, "rank %d element %zu: %g\n", r, i, (double)h[i]);
      return 16;
    }
  if (ncclCommFinalize(c) != ncclInProgress) return 17;
  st = ncclInProgress;
  while (st == ncclInProgress) ncclCommGetAsyncError(c, &st);
  if (st != ncclSuccess || ncclCommDestroy(c) != ncclSuccess) return 18;
  cudaFree(b);
  free(h);
  return 0;
}

static void run_procs(int n, int kill_rank, int *status) {
  ncclUniqueId id;
  cr_assert_eq(ncclGetUniqueId(&id), ncclSuccess);
  char hex[2 * NCCL_UNIQUE_ID_BYTES + 1];
  for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; i++)
    snprintf(hex + 2 * i, 3, "%02x", (unsigned char)id.internal[i]);
  pid_t pids[8];
  for (int r = 0; r < n; r++) {
    pids[r] = fork();
    cr_assert_neq(pids[r], -1);
    if (pids[r] == 0) {
      char v[64];
      if (kill_rank >= 0) {
        snprintf(v, sizeof v, "kill:%d:2", kill_rank);
        setenv("MESHPG_DOUBLE_FAULT", v, 1);
      }
      snprintf(v, sizeof v, "proc:%d:%d:%d", r, n, kill_rank >= 0);
      setenv("MESHPG_NCCL_DOUBLE_CHILD", v, 1);
      setenv("MESHPG_NCCL_DOUBLE_ID", hex, 1);
      char *argv[] = {"test_nccl_double", NULL};
      execv("/proc/self/exe", argv);
      _exit(127);
    }
  }
  for (int r = 0; r < n; r++) waitpid(pids[r], &status[r], 0);
}

Test(processes, forked_ranks_all_reduce) {
  int status[3];
  run_procs(3, -1, status);
  for (int r = 0; r < 3; r++)
    cr_assert(WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 0, "rank %d: status 0x%x", r,
              status[r]);
}

Test(processes, killed_rank_gives_remote_error) {
  int status[3];
  run_procs(3, 2, status);
  cr_assert(WIFSIGNALED(status[2]) && WTERMSIG(status[2]) == SIGKILL, "rank 2: status 0x%x",
            status[2]);
  for (int r = 0; r < 2; r++)
    cr_assert(WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 0, "rank %d: status 0x%x", r,
              status[r]);
}

/* The bodies of the children (see in_child and run_procs), run before
 * Criterion's main when MESHPG_NCCL_DOUBLE_CHILD is set. */
__attribute__((constructor)) static void child_main(void) {
  const char *mode = getenv("MESHPG_NCCL_DOUBLE_CHILD");
  if (!mode) return;
  int r = -1, n = 0, death = 0;
  if (!strcmp(mode, "mismatch")) {
    world_run(2, 1, 0, mismatch, NULL);
  } else if (!strcmp(mode, "cross")) {
    ncclUniqueId ids[2];
    ncclGetUniqueId(&ids[0]);
    ncclGetUniqueId(&ids[1]);
    world_run(2, 1, 1, cross, ids);
  } else if (!strcmp(mode, "regmismatch")) {
    world_run(2, 1, 0, registered, (void *)1);
  } else if (!strcmp(mode, "abortonebyone")) {
    ncclUniqueId ids[2];
    ncclGetUniqueId(&ids[0]);
    ncclGetUniqueId(&ids[1]);
    world_run(2, 1, 1, abort_one_by_one, ids);
  } else if (!strcmp(mode, "unmatched")) {
    world_run(2, 1, 0, unmatched_send, NULL);
  } else if (!strcmp(mode, "destroytwice")) {
    world_run(1, 1, 0, destroy_twice, NULL);
  } else if (!strcmp(mode, "redopabort")) {
    world_run(1, 1, 0, redop_destroy_misuse, (void *)1);
  } else if (!strcmp(mode, "redopinprogress")) {
    world_run(1, 0, 0, redop_destroy_misuse, NULL);
  } else if (sscanf(mode, "proc:%d:%d:%d", &r, &n, &death) == 3) {
    const char *hex = getenv("MESHPG_NCCL_DOUBLE_ID");
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    for (int i = 0; hex && i < NCCL_UNIQUE_ID_BYTES && hex[2 * i] && hex[2 * i + 1]; i++) {
      unsigned v = 0;
      sscanf(hex + 2 * i, "%2x", &v);
      id.internal[i] = (char)v;
    }
    _exit(proc_rank(&id, r, n, death));
  } else {
    fprintf(stderr, "unknown MESHPG_NCCL_DOUBLE_CHILD=%s\n", mode);
    _exit(126);
  }
  if (fail_msg[0]) fprintf(stderr, "child %s: %s\n", mode, fail_msg);
  _exit(fail_msg[0] ? 1 : 0);
}
