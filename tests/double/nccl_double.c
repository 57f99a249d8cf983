/* The NCCL half of the CUDA/NCCL test double (see double.h): every NCCL
 * function groups/nccl/ and its tests call, with the exact signatures of
 * NVIDIA's nccl.h (2.28), so that the real backend code runs multi-rank on
 * machines without a GPU: ranks as threads of one process, and ranks as
 * processes (fork, mpirun).  Never installed.
 *
 * Every rule enforced here cites the NCCL 2.28.9 source (github.com/NVIDIA/
 * nccl, tag v2.28.9-1, paths under src/) or the NCCL user guide page it
 * models.  Where NCCL returns an error the double returns NCCL's code with
 * NCCL's wording in ncclGetLastError; where NCCL would hang or corrupt
 * memory the double calls dbl_fatal() with a report instead.
 *
 * How it works
 *   Communicators.  A communicator's state lives in a POSIX shared-memory
 *   segment "/mpgdbl-<16 hex digits>" named from a hash of the unique id
 *   (init) or of (the parent segment's random nonce, split number, colour)
 *   (ncclCommSplit), so that ranks find each other whether they are threads
 *   or processes.  The first rank creates it (O_CREAT|O_EXCL), every rank
 *   maps it, registers (pid, device, bus id, host hash) and waits for the
 *   others (in a job thread, as NCCL's init job).  Once all
 *   have arrived the name is unlinked (the mappings stay), so the same id
 *   (NCCL_COMM_ID) can make a new communicator later; a segment that never
 *   completes is unlinked by the last member to leave.
 *   Collectives run as stream work (dbl_stream_submit, kernel = 1): the
 *   item publishes this rank's arrival at its k-th collective, blocks until
 *   every rank has arrived (as an NCCL kernel spins), checks that all made
 *   the same call, then moves the data in chunks through per-rank staging
 *   slots in the segment (two banks, one barrier per chunk), reducing in
 *   rank order with the arithmetic of meshpg's thread backend.  Sends and
 *   receives go through one byte ring per ordered pair of ranks; a send
 *   completes when its receiver has consumed it.  A communicator's kernels
 *   run one after the other in issue order, as NCCL's.  All waits poll the
 *   communicator's abort flag, dead peer processes, and a watchdog.
 *   Groups: ncclGroupStart/End are per thread; operations, inits, splits,
 *   finalizes, aborts and destroys inside a group run at the outermost
 *   ncclGroupEnd, so aborting every communicator in one group sets every
 *   abort flag before any device memory is freed (NCCL 2.28 does the same).
 *
 * Functions: ncclGetVersion, ncclGetUniqueId, ncclCommInitRank,
 * ncclCommInitRankConfig, ncclCommInitAll, ncclCommSplit,
 * ncclCommFinalize, ncclCommDestroy, ncclCommAbort, ncclCommRevoke,
 * ncclCommGetAsyncError, ncclCommCount, ncclCommCuDevice, ncclCommUserRank,
 * ncclGetErrorString, ncclGetLastError, ncclAllReduce, ncclBroadcast,
 * ncclBcast, ncclReduce, ncclAllGather, ncclReduceScatter, ncclSend,
 * ncclRecv, ncclGroupStart, ncclGroupEnd, ncclRedOpCreatePreMulSum,
 * ncclRedOpDestroy, ncclMemAlloc, ncclMemFree, ncclCommRegister,
 * ncclCommDeregister.  Datatypes: every ncclDataType_t; fp8 moves but does
 * not reduce (refused with NCCL's pre-sm90 message).
 *
 * Environment
 *   MESHPG_DOUBLE_HANG_S=S   watchdog: a kernel (collective, send,
 *                            receive) that makes no progress for S seconds
 *                            (default 20) is reported as a deadlock
 *                            (dbl_fatal naming the ranks, the operations
 *                            they are at, the last ones they issued, and an
 *                            ncclCommAbort / ncclCommDestroy waiting for
 *                            the device); an init or split still waiting
 *                            for ranks after S seconds prints a warning
 *                            (meshpg's own timeout then aborts it).
 *   MESHPG_DOUBLE_FAULT=F[,F...] fault injection, F one of
 *      hang:R:N   world rank R's N-th NCCL operation never arrives: its
 *                 kernel blocks without publishing its arrival until the
 *                 communicator is aborted;
 *      async:R:N  world rank R's N-th operation completes, then its
 *                 communicator reports ncclSystemError through
 *                 ncclCommGetAsyncError;
 *      kill:R:N   the process of world rank R raises SIGKILL when its N-th
 *                 operation starts on its stream (ranks as processes only:
 *                 with ranks as threads it kills every rank).
 *      "World rank" is the rank a thread had in the first communicator it
 *      initialised (ncclCommInitRank*); operations are counted per world
 *      rank, 1-based, each collective, send and receive once, in issue
 *      order.  The double passes the world rank to the CUDA half
 *      (dbl_set_world_rank) for its cudaMallocAsync OOM fault.
 *   NCCL_COMM_ID             as in NCCL: ncclGetUniqueId returns the same
 *                            id in every process (bootstrap.cc:414-431).
 *   NCCL_DEBUG=WARN|INFO     print each WARN on stderr, as NCCL does.
 *   NCCL_LAUNCH_ORDER_IMPLICIT, NCCL_LAUNCH_RACE_FATAL  as in NCCL: two
 *                            threads launching on one device at once fail
 *                            with ncclInvalidUsage (launch_race_enter).
 *
 * Deliberate differences from NCCL, each for the tests' sake:
 *   - f16/bf16 reductions accumulate in f32 and round once; every
 *     reduction runs in rank order; ncclAvg of f32/f64 is a sum divided by
 *     the rank count at the end.  Real NCCL reduces f16/bf16 in their own
 *     precision, in ring or tree order, and implements float ncclAvg as a
 *     pre-multiplication by float(1/nranks) (enqueue.cc:2285-2320), which
 *     for f32/f64 is exact at power-of-two rank counts (barring underflow)
 *     and otherwise rounds each addend once more in the element's own
 *     precision, an effect of the size of the summation order's.  The
 *     double reproduces meshpg's thread backend (groups/thread/coll.c
 *     reduce_all), bit for bit, except where NCCL's arithmetic loses more
 *     than that: ncclAvg of f16/bf16 and pre-multiplied f16/bf16 addends
 *     are rounded to the half before the sum, as NCCL does (see
 *     DEFINE_RED_FLOAT), so that a backend passing them to NCCL shows it.
 *   - pointers are always checked (as with NCCL_CHECK_POINTERS=1,
 *     init.cc:452 / misc/argcheck.cc:10-26), and a buffer running past the
 *     end of its allocation is reported (real NCCL would fault).
 *   - ncclGetLastError is per thread: NCCL keeps one process-wide buffer
 *     (debug.cc:32, written at debug.cc:287) that ranks as threads would
 *     overwrite under each other.  An asynchronous error's text is kept with
 *     its communicator and copied into the caller's buffer by
 *     ncclCommGetAsyncError.
 *   - a send completes only once its receiver has consumed it (NCCL may
 *     complete a small send early into the receiver's buffers), so that a
 *     send without its receive is caught by the watchdog.
 *   - launching a group on a non-blocking communicator is done in the
 *     calling thread; the call still answers ncclInProgress and the
 *     communicator reports ncclInProgress until the next
 *     ncclCommGetAsyncError (group.cc:705-738 launches in a thread).
 *   - a call on a destroyed or aborted communicator gets ncclInvalidArgument
 *     ("Error: corrupted comm object detected", the poisoned magic of
 *     init.cc:180-184 seen by misc/argcheck.cc:38-41) instead of reading
 *     freed memory; the handle is never freed (a tombstone).
 *   - ncclCommDestroy returning early (already destroyed, or not ready)
 *     leaves NCCL's group depth raised (init.cc:2372-2381); the double
 *     reports the thread's next group-using NCCL call with dbl_fatal.
 *
 * Thread safety: ranks as threads may all be inside the double at once.
 * Everything shared between threads or processes is a C11 atomic or is
 * handed over through one (release/acquire), so the double is TSan-clean;
 * futexes only wake sleepers. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime.h>
#include <nccl.h>

#include "double.h"

/* The reductions must round exactly like meshpg's thread backend: never
 * fuse a multiply and an add (clang contracts within expressions by
 * default, GCC in its GNU modes when the target has FMA). */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2 && ATOMIC_INT_LOCK_FREE == 2,
               "shared-memory atomics must be lock-free (address-free)");
_Static_assert(sizeof(ncclUniqueId) == NCCL_UNIQUE_ID_BYTES, "ncclUniqueId size");

#define COMM_LIVE 0x6d7067636f6d6d31ULL /* "mpgcomm1" */
#define COMM_DEAD 0x6465616463636f6dULL
#define SHM_MAGIC 0x6d70676462736d31ULL
#define MSG_MAGIC 0x6d7067646d736731ULL
#define ID_MARK "MPGDBLid"

/* ------------------------------------------------------------------ */
/* Small helpers: errors, environment                                 */
/* ------------------------------------------------------------------ */

/* ncclGetLastError's text, per thread (see the header comment). */
static _Thread_local char tl_last_error[1024];

/* The environment, read once by the first NCCL call of the process, as
 * NCCL caches its parameters (NCCL_PARAM).  meshpg never writes the
 * environment (tests/layout/check_layout.py checks it). */
static pthread_once_t env_once = PTHREAD_ONCE_INIT;
static int env_debug;     /* NCCL_DEBUG: 1 WARN, 2 INFO/TRACE */
static double env_hang_s; /* MESHPG_DOUBLE_HANG_S */
static void faults_parse(void);

static void env_read(void) {
  const char *v = getenv("NCCL_DEBUG");
  if (v && !strcasecmp(v, "WARN")) env_debug = 1;
  if (v && (!strcasecmp(v, "INFO") || !strcasecmp(v, "TRACE"))) env_debug = 2;
  v = getenv("MESHPG_DOUBLE_HANG_S");
  env_hang_s = v && v[0] ? strtod(v, NULL) : 20.0;
  if (!(env_hang_s > 0)) env_hang_s = 20.0;
  faults_parse();
}

static void env_init(void) { pthread_once(&env_once, env_read); }

static int debug_level(void) {
  env_init();
  return env_debug;
}

/* NCCL's WARN: record the text as the last error (debug.cc:281-289) and
 * print it when NCCL_DEBUG asks for warnings. */
static void warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void warn(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(tl_last_error, sizeof tl_last_error, fmt, ap);
  va_end(ap);
  if (debug_level() >= 1)
    fprintf(stderr, "\nmeshpg double (pid %d): NCCL WARN %s\n", (int)getpid(), tl_last_error);
}

static double hang_seconds(void) {
  env_init();
  return env_hang_s;
}

static void sleep_us(long us) {
  struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

static uint64_t fnv1a(uint64_t h, const void *p, size_t n) {
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++) {
    h ^= b[i];
    h *= 1099511628211ULL;
  }
  return h;
}
#define FNV_START 14695981039346656037ULL

/* ------------------------------------------------------------------ */
/* Data types and reduction operations                                */
/* ------------------------------------------------------------------ */

/* Operation classes.  Builtins keep NCCL's numbers (nccl.h ncclRedOp_t);
 * OPC_PREMUL is a user op from ncclRedOpCreatePreMulSum. */
enum { OPC_SUM = 0, OPC_PROD = 1, OPC_MAX = 2, OPC_MIN = 3, OPC_AVG = 4, OPC_PREMUL = 5 };

static size_t dt_size(int dt) {
  switch (dt) {
    case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
  }
  return 0;
}

/* NCCL's names (collectives.cc:41-56). */
static const char *dt_name(int dt) {
  static const char *const n[] = {"ncclInt8", "ncclUint8", "ncclInt32", "ncclUint32",
                                  "ncclInt64", "ncclUint64", "ncclFloat16", "ncclFloat32",
                                  "ncclFloat64", "ncclBfloat16", "ncclFloat8e4m3",
                                  "ncclFloat8e5m2"};
  return dt >= 0 && dt < ncclNumTypes ? n[dt] : "Unknown";
}

static const char *op_name(int opc) {
  static const char *const n[] = {"ncclSum", "ncclProd", "ncclMax", "ncclMin", "ncclAvg",
                                  "PreMulSum"};
  return opc >= 0 && opc <= OPC_PREMUL ? n[opc] : "?";
}

/* f16 / bf16 <-> f32, round to nearest even, NaNs made quiet: the
 * conventions of groups/reduce.c (mpg__half_to_f32, mpg__f32_to_half), so
 * that results equal the thread backend's bit for bit. */
static float bits_to_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static float f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0x1f) return bits_to_f32(sign | 0x7f800000u | (m << 13));
  if (e == 0) {
    float v = (float)m * 0x1p-24f; /* zero or subnormal, exact */
    return sign ? -v : v;
  }
  return bits_to_f32(sign | ((e + 112u) << 23) | (m << 13));
}

static float bf16_to_f32(uint16_t h) { return bits_to_f32((uint32_t)h << 16); }

/* Round q / 2^s to nearest even (s >= 1). */
static uint32_t rne_shift(uint32_t q, unsigned s) {
  if (s >= 32) return 0;
  uint32_t r = q >> s, rem = q & ((1u << s) - 1u), half = 1u << (s - 1);
  if (rem > half || (rem == half && (r & 1u))) r++;
  return r;
}

static uint16_t f32_to_f16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu, e = a >> 23, m = a & 0x7fffffu;
  if (a > 0x7f800000u) return sign | 0x7e00u;   /* NaN */
  if (a >= 0x477ff000u) return sign | 0x7c00u;  /* 65520 and up: infinity */
  if (e < 113) {                                /* below 2^-14: subnormal half */
    if (e == 0) return sign;                    /* f32 subnormal: rounds to 0 */
    /* value = (m | 2^23) * 2^(e-150) = q * 2^-24 with q = (m|2^23) >> (126-e) */
    return sign | (uint16_t)rne_shift(m | 0x800000u, 126u - e);
  }
  uint32_t h = ((e - 112u) << 10) | (m >> 13), rest = m & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++; /* may carry into the exponent */
  return sign | (uint16_t)h;
}

static uint16_t f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* Element-wise reduction of n sources (rank order) into dst.  Floating
 * types accumulate in A (f32 for f16/bf16/f32, f64 for f64), as
 * groups/thread/coll.c reduce_all: the first rank's value (times its
 * pre-multiplier) starts the accumulator, each next rank is combined with
 * `acc + x`, `x > acc ? x : acc` or `x < acc ? x : acc`, and f16/bf16 are
 * rounded once at the end.  `scal` holds each rank's pre-multiplier
 * (OPC_PREMUL only).
 *
 * A pre-multiplied addend is rounded to the element type before the sum, as
 * NCCL's preOp does: x * scalar in T (device/reduce_kernel.h:655-662 for
 * f32/f64; __hmul of two halves, 665-716, whose exact product the f32
 * multiply below holds, then rounds to the half).  ncclAvg of f16/bf16 is
 * NCCL's: a pre-multiplied sum with the scalar __float2half(float(1.0 /
 * nranks)) / __float2bfloat16(...) (enqueue.cc:2304-2312), so every addend
 * is rounded to the half once more, and an addend of 1e-7 in f16 at 8 ranks
 * becomes 0 (AVG_PREMUL = 1).  ncclAvg of f32/f64 divides the sum by n at
 * the end instead (AVG_PREMUL = 0: see "Deliberate differences" above). */
#define DEFINE_RED_FLOAT(NAME, T, A, LOAD, STORE, ROUND, AVG_PREMUL)                  \
  static void NAME(int opc, int n, const char *const *src, void *dstv, size_t len,   \
                   const A *scal, A *acc) {                                          \
    T *dst = dstv;                                                                   \
    int pre = opc == OPC_PREMUL || (AVG_PREMUL && opc == OPC_AVG);                   \
    A avg_s = (A)1;                                                                  \
    if (AVG_PREMUL && opc == OPC_AVG) avg_s = LOAD(STORE((float)(1.0 / n)));         \
    for (int p = 0; p < n; p++) {                                                    \
      const T *x = (const T *)src[p];                                                \
      A s = opc == OPC_PREMUL ? scal[p] : avg_s;                                     \
      if (p == 0) {                                                                  \
        for (size_t j = 0; j < len; j++) {                                           \
          A v = LOAD(x[j]);                                                          \
          if (pre) v = ROUND(v * s);                                                 \
          acc[j] = v;                                                                \
        }                                                                            \
      } else if (pre) {                                                              \
        for (size_t j = 0; j < len; j++) {                                           \
          A v = LOAD(x[j]);                                                          \
          v = ROUND(v * s);                                                          \
          acc[j] = acc[j] + v;                                                       \
        }                                                                            \
      } else if (opc == OPC_SUM || opc == OPC_AVG) {                                 \
        for (size_t j = 0; j < len; j++) acc[j] = acc[j] + LOAD(x[j]);               \
      } else if (opc == OPC_PROD) {                                                  \
        for (size_t j = 0; j < len; j++) acc[j] = acc[j] * LOAD(x[j]);               \
      } else if (opc == OPC_MAX) {                                                   \
        for (size_t j = 0; j < len; j++) {                                           \
          A v = LOAD(x[j]);                                                          \
          acc[j] = v > acc[j] ? v : acc[j];                                          \
        }                                                                            \
      } else {                                                                       \
        for (size_t j = 0; j < len; j++) {                                           \
          A v = LOAD(x[j]);                                                          \
          acc[j] = v < acc[j] ? v : acc[j];                                          \
        }                                                                            \
      }                                                                              \
    }                                                                                \
    if (opc == OPC_AVG && !pre)                                                      \
      for (size_t j = 0; j < len; j++) acc[j] = acc[j] / (A)n;                       \
    for (size_t j = 0; j < len; j++) dst[j] = STORE(acc[j]);                         \
  }

#define ID_LOAD(x) (x)
#define ROUND_F16(v) f16_to_f32(f32_to_f16(v))
#define ROUND_BF16(v) bf16_to_f32(f32_to_bf16(v))
DEFINE_RED_FLOAT(red_f32, float, float, ID_LOAD, ID_LOAD, ID_LOAD, 0)
DEFINE_RED_FLOAT(red_f64, double, double, ID_LOAD, ID_LOAD, ID_LOAD, 0)
DEFINE_RED_FLOAT(red_f16, uint16_t, float, f16_to_f32, f32_to_f16, ROUND_F16, 1)
DEFINE_RED_FLOAT(red_bf16, uint16_t, float, bf16_to_f32, f32_to_bf16, ROUND_BF16, 1)

/* Integers: NCCL's arithmetic in the element type, wrapping (done in the
 * unsigned type); ncclAvg is the wrapped sum divided by n, rounding towards
 * zero (device/reduce_kernel.h:775-804, FuncSumPostDiv), like C division
 * (groups/reduce.c mpg__divide). */
#define DEFINE_RED_INT(NAME, T, U)                                                   \
  static void NAME(int opc, int n, const char *const *src, void *dstv, size_t len,   \
                   const uint64_t *scal) {                                           \
    T *a = dstv;                                                                     \
    for (int p = 0; p < n; p++) {                                                    \
      const T *x = (const T *)src[p];                                                \
      U s = opc == OPC_PREMUL ? (U)scal[p] : (U)1;                                   \
      for (size_t j = 0; j < len; j++) {                                             \
        T v = x[j];                                                                  \
        if (opc == OPC_PREMUL) v = (T)((U)v * s);                                    \
        if (p == 0) a[j] = v;                                                        \
        else if (opc == OPC_PROD) a[j] = (T)((U)a[j] * (U)v);                        \
        else if (opc == OPC_MAX) a[j] = v > a[j] ? v : a[j];                         \
        else if (opc == OPC_MIN) a[j] = v < a[j] ? v : a[j];                         \
        else a[j] = (T)((U)a[j] + (U)v);                                             \
      }                                                                              \
    }                                                                                \
    if (opc == OPC_AVG)                                                              \
      for (size_t j = 0; j < len; j++) a[j] = (T)(a[j] / (T)n);                      \
  }

DEFINE_RED_INT(red_i8, int8_t, uint8_t)
DEFINE_RED_INT(red_u8, uint8_t, uint8_t)
DEFINE_RED_INT(red_i32, int32_t, uint32_t)
DEFINE_RED_INT(red_u32, uint32_t, uint32_t)
DEFINE_RED_INT(red_i64, int64_t, uint64_t)
DEFINE_RED_INT(red_u64, uint64_t, uint64_t)

/* A pre-multiplier as stored by ncclRedOpCreatePreMulSum (the element's own
 * type, enqueue.cc:2690-2694), widened for the accumulator. */
static double scalar_as_float(int dt, uint64_t bits) {
  union {
    uint64_t u;
    uint16_t h;
    float f;
    double d;
  } v;
  v.u = bits;
  switch (dt) {
    case ncclFloat16: return f16_to_f32(v.h);
    case ncclBfloat16: return bf16_to_f32(v.h);
    case ncclFloat32: return v.f;
    case ncclFloat64: return v.d;
  }
  return 0;
}

static uint64_t scalar_as_int(int dt, uint64_t bits) {
  switch (dt_size(dt)) {
    case 1: return (uint8_t)bits;
    case 4: return (uint32_t)bits;
  }
  return bits;
}

/* Reduce n sources of len elements into dst; acc is scratch of len * 8
 * bytes. */
static void reduce_elems(int dt, int opc, int n, const char *const *src, void *dst, size_t len,
                         const uint64_t *scal_bits, void *acc) {
  float fs[64];
  double ds[64];
  float *fsp = fs;
  double *dsp = ds;
  uint64_t *us = NULL;
  if (opc == OPC_PREMUL && n > 64) {
    fsp = malloc(sizeof(float) * (size_t)n);
    dsp = malloc(sizeof(double) * (size_t)n);
    if (!fsp || !dsp) dbl_fatal("nccl double: out of memory for %d scalars", n);
  }
  if (opc == OPC_PREMUL)
    for (int p = 0; p < n; p++) {
      dsp[p] = scalar_as_float(dt, scal_bits[p]);
      fsp[p] = (float)dsp[p];
    }
  if (opc == OPC_PREMUL && (dt <= ncclUint64)) {
    us = malloc(sizeof(uint64_t) * (size_t)n);
    if (!us) dbl_fatal("nccl double: out of memory for %d scalars", n);
    for (int p = 0; p < n; p++) us[p] = scalar_as_int(dt, scal_bits[p]);
  }
  switch (dt) {
    case ncclFloat32: red_f32(opc, n, src, dst, len, fsp, acc); break;
    case ncclFloat64: red_f64(opc, n, src, dst, len, dsp, acc); break;
    case ncclFloat16: red_f16(opc, n, src, dst, len, fsp, acc); break;
    case ncclBfloat16: red_bf16(opc, n, src, dst, len, fsp, acc); break;
    case ncclInt8: red_i8(opc, n, src, dst, len, us); break;
    case ncclUint8: red_u8(opc, n, src, dst, len, us); break;
    case ncclInt32: red_i32(opc, n, src, dst, len, us); break;
    case ncclUint32: red_u32(opc, n, src, dst, len, us); break;
    case ncclInt64: red_i64(opc, n, src, dst, len, us); break;
    case ncclUint64: red_u64(opc, n, src, dst, len, us); break;
    default: dbl_fatal("nccl double: reduction of %s reached the kernel", dt_name(dt));
  }
  if (fsp != fs) free(fsp);
  if (dsp != ds) free(dsp);
  free(us);
}

/* ------------------------------------------------------------------ */
/* Futex wake words                                                   */
/* ------------------------------------------------------------------ */

/* A word that sleepers wait on and publishers bump; `shared` selects a
 * futex across processes (the word is in a MAP_SHARED segment). */
struct wakeword {
  _Atomic uint32_t seq;
  _Atomic uint32_t waiters;
};

static void ww_bump(struct wakeword *w, int shared) {
  atomic_fetch_add(&w->seq, 1);
  if (atomic_load(&w->waiters))
    syscall(SYS_futex, (uint32_t *)&w->seq, shared ? FUTEX_WAKE : FUTEX_WAKE_PRIVATE, INT_MAX,
            NULL, NULL, 0);
}

/* Sleep while w->seq == seen, at most ms milliseconds. */
static void ww_sleep(struct wakeword *w, uint32_t seen, int ms, int shared) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  atomic_fetch_add(&w->waiters, 1);
  if (atomic_load(&w->seq) == seen)
    syscall(SYS_futex, (uint32_t *)&w->seq, shared ? FUTEX_WAIT : FUTEX_WAIT_PRIVATE, seen, &ts,
            NULL, 0);
  atomic_fetch_sub(&w->waiters, 1);
}

/* ------------------------------------------------------------------ */
/* The shared segment of a communicator                               */
/* ------------------------------------------------------------------ */

/* Functions, as in the descriptors. */
enum { F_NONE = 0, F_AR, F_BC, F_RED, F_AG, F_RS, F_SEND, F_RECV };

static const char *func_name(int f) {
  static const char *const n[] = {"?", "ncclAllReduce", "ncclBroadcast", "ncclReduce",
                                  "ncclAllGather", "ncclReduceScatter", "ncclSend", "ncclRecv"};
  return f >= 0 && f <= F_RECV ? n[f] : "?";
}

/* An operation as a rank published it.  Every field is atomic: the owner
 * writes it while peers may read it for reports. */
struct shm_desc {
  _Atomic uint64_t seq, count, scalar;
  _Atomic int32_t func, dtype, op, root, reg, pad_;
};

/* Member states. */
enum { RS_EMPTY = 0, RS_CLAIMED, RS_JOINED, RS_LEFT, RS_ABORTED };

struct shm_rank {
  _Atomic int32_t state;
  /* Written once before state = RS_JOINED (release), read after it. */
  int32_t pid, device, world_rank;
  uint64_t host_hash;
  int64_t busid;
  /* Collective position: (collective number << 32) | chunks written. */
  _Atomic uint64_t pos;
  _Atomic uint64_t launches;   /* kernels started (reports) */
  struct shm_desc desc[2];     /* collective k's call, by k % 2 */
  struct shm_desc issued;      /* the last operation the host issued */
  _Atomic uint64_t colls_issued;
  _Atomic uint64_t split_seq;  /* splits published */
  _Atomic int32_t split_color[2], split_key[2];
  char pad_[64];
};

/* One direction of a pair of ranks: a byte ring written by the sender
 * (head) and consumed by the receiver (tail), cumulative counts. */
struct shm_chan {
  _Atomic uint64_t head, tail;
  _Atomic uint64_t sends_started, recvs_started;
  char pad_[32];
};

enum { SEG_JOINING = 0, SEG_COMPLETE = 1 };

struct shm_hdr {
  _Atomic uint64_t magic; /* set last by the creator (release) */
  int32_t nranks, version;
  uint64_t bytes, bank, ring;
  uint64_t off_ranks, off_slots, off_chans;
  uint64_t nonce; /* random, per segment: names the children */
  struct wakeword wake;
  _Atomic int32_t joined, status, unlinked, pad_;
  char name[48];
};

/* Message header in a ring (32 bytes: messages are padded to 32). */
struct msg_hdr {
  uint64_t magic, seq, bytes;
  int32_t dtype, reg;
};
_Static_assert(sizeof(struct msg_hdr) == 32, "message header");

struct layout {
  uint64_t bank, ring, off_ranks, off_slots, off_chans, chan_stride, bytes;
};

/* Staging: two banks per rank of `bank` bytes (1 MiB / n, 16..256 KiB)
 * and a ring of 256 KiB / n (4..64 KiB) per ordered pair. */
static void seg_layout(int n, struct layout *l) {
  uint64_t bank = ((1u << 20) / (uint64_t)n) & ~(uint64_t)4095;
  if (bank < 16384) bank = 16384;
  if (bank > 262144) bank = 262144;
  uint64_t ring = ((256u << 10) / (uint64_t)n) & ~(uint64_t)4095;
  if (ring < 4096) ring = 4096;
  if (ring > 65536) ring = 65536;
  l->bank = bank;
  l->ring = ring;
  l->off_ranks = 4096;
  l->off_slots = (l->off_ranks + sizeof(struct shm_rank) * (uint64_t)n + 4095) & ~(uint64_t)4095;
  l->off_chans = l->off_slots + 2 * bank * (uint64_t)n;
  l->chan_stride = sizeof(struct shm_chan) + ring;
  l->bytes = l->off_chans + l->chan_stride * (uint64_t)n * (uint64_t)n;
}

static struct shm_rank *seg_rank(struct shm_hdr *h, int r) {
  return (struct shm_rank *)((char *)h + h->off_ranks) + r;
}
static char *seg_slot(struct shm_hdr *h, int r, int bank) {
  return (char *)h + h->off_slots + ((uint64_t)r * 2 + (uint64_t)bank) * h->bank;
}
static struct shm_chan *seg_chan(struct shm_hdr *h, int src, int dst) {
  return (struct shm_chan *)((char *)h + h->off_chans +
                             ((uint64_t)src * (uint64_t)h->nranks + (uint64_t)dst) *
                                 (sizeof(struct shm_chan) + h->ring));
}
static char *chan_ring(struct shm_chan *c) { return (char *)(c + 1); }

/* Unlink the segment's name, once per segment whoever asks: the CAS makes
 * the winner the only one to unlink, so a newer segment that took the name
 * is never removed by mistake. */
static void seg_unlink_once(struct shm_hdr *h) {
  int32_t zero = 0;
  if (atomic_compare_exchange_strong(&h->unlinked, &zero, 1)) {
    if (shm_unlink(h->name) != 0 && errno != ENOENT)
      dbl_log("nccl double: shm_unlink(%s): %s", h->name, strerror(errno));
    else
      dbl_log("nccl double: unlinked %s", h->name);
  }
}

/* Has process pid exited?  A zombie counts: its parent (a launcher, a
 * test) may not have reaped it yet, but it will never run again. */
static int pid_dead(int32_t pid) {
  if (pid <= 0) return 0;
  if (kill(pid, 0) != 0) return errno == ESRCH;
  char path[64], buf[256];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return 0;
  buf[n] = '\0';
  const char *rp = strrchr(buf, ')'); /* "pid (comm) S ..." */
  return rp && rp[1] == ' ' && (rp[2] == 'Z' || rp[2] == 'X');
}

/* Open the segment `name` for a communicator of n ranks, creating it if
 * it does not exist.  A segment of an earlier communicator with the same
 * name that already completed (NCCL_COMM_ID reused) is waited out until its
 * name is unlinked.  Returns the mapping, or NULL with a warning. */
static struct shm_hdr *seg_open(const char *name, int n, volatile _Atomic int *abort_flag) {
  struct layout l;
  seg_layout(n, &l);
  double t0 = dbl_now();
  for (;;) {
    if (abort_flag && atomic_load(abort_flag)) {
      warn("meshpg double: communicator aborted while joining %s", name);
      return NULL;
    }
    int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd >= 0) {
      if (ftruncate(fd, (off_t)l.bytes) != 0) {
        warn("meshpg double: ftruncate(%s, %" PRIu64 "): %s", name, l.bytes, strerror(errno));
        close(fd);
        shm_unlink(name);
        return NULL;
      }
      /* Reserve the pages now when the segment is small, so that a full
       * /dev/shm fails here with a message rather than as SIGBUS later. */
      if (l.bytes <= (16u << 20)) {
        int e = posix_fallocate(fd, 0, (off_t)l.bytes);
        if (e != 0) {
          warn("meshpg double: posix_fallocate(%s, %" PRIu64 " bytes): %s (is /dev/shm full?)",
               name, l.bytes, strerror(e));
          close(fd);
          shm_unlink(name);
          return NULL;
        }
      }
      void *p = mmap(NULL, l.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      close(fd);
      if (p == MAP_FAILED) {
        warn("meshpg double: mmap(%s): %s", name, strerror(errno));
        shm_unlink(name);
        return NULL;
      }
      struct shm_hdr *h = p;
      h->nranks = n;
      h->version = 1;
      h->bytes = l.bytes;
      h->bank = l.bank;
      h->ring = l.ring;
      h->off_ranks = l.off_ranks;
      h->off_slots = l.off_slots;
      h->off_chans = l.off_chans;
      snprintf(h->name, sizeof h->name, "%s", name);
      if (getrandom(&h->nonce, sizeof h->nonce, 0) != (ssize_t)sizeof h->nonce)
        h->nonce = fnv1a(FNV_START, name, strlen(name)) ^ (uint64_t)getpid() ^
                   (uint64_t)(dbl_now() * 1e9);
      atomic_store_explicit(&h->magic, SHM_MAGIC, memory_order_release);
      dbl_log("nccl double: created %s (%d ranks, %" PRIu64 " bytes)", name, n, l.bytes);
      return h;
    }
    if (errno != EEXIST) {
      warn("meshpg double: shm_open(%s): %s", name, strerror(errno));
      return NULL;
    }
    fd = shm_open(name, O_RDWR, 0);
    if (fd < 0) {
      if (errno == ENOENT) continue; /* unlinked in between: create it */
      warn("meshpg double: shm_open(%s): %s", name, strerror(errno));
      return NULL;
    }
    struct stat st;
    int ok = 0;
    for (;;) {
      if (fstat(fd, &st) != 0) break;
      if ((uint64_t)st.st_size == l.bytes) {
        ok = 1;
        break;
      }
      if (st.st_size != 0) {
        close(fd);
        dbl_fatal("nccl double: communicator segment %s has %lld bytes but a communicator of "
                  "%d ranks needs %" PRIu64 ": ranks joining one unique id disagree on nranks "
                  "(real NCCL would hang or fail in bootstrap)",
                  name, (long long)st.st_size, n, l.bytes);
      }
      if (dbl_now() - t0 > 10) break; /* its creator died before sizing it */
      sleep_us(200);
    }
    if (!ok) {
      close(fd);
      warn("meshpg double: segment %s stays empty (its creator died?)", name);
      return NULL;
    }
    void *p = mmap(NULL, l.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
      warn("meshpg double: mmap(%s): %s", name, strerror(errno));
      return NULL;
    }
    struct shm_hdr *h = p;
    while (atomic_load_explicit(&h->magic, memory_order_acquire) != SHM_MAGIC) {
      if (dbl_now() - t0 > 10) {
        munmap(p, l.bytes);
        warn("meshpg double: segment %s never got initialised (its creator died?)", name);
        return NULL;
      }
      sleep_us(100);
    }
    if (h->nranks != n)
      dbl_fatal("nccl double: communicator %s was created for %d ranks, joined with nranks "
                "%d (real NCCL would hang in bootstrap)",
                name, h->nranks, n);
    if (atomic_load(&h->status) == SEG_COMPLETE) {
      /* An earlier communicator with the same name: its completer unlinks
       * it at once; if that one died in between, unlink it here. */
      if (dbl_now() - t0 > 2) seg_unlink_once(h);
      munmap(p, l.bytes);
      sleep_us(500);
      continue;
    }
    return h;
  }
}

/* ------------------------------------------------------------------ */
/* Communicators                                                      */
/* ------------------------------------------------------------------ */

/* What a splitShare family shares (NCCL's sharedRes and abort flag,
 * init.cc:2580-2590): the abort flag, and the serialisation of kernels
 * (tickets in host issue order, enqueue.cc:1495-1502 and 1716-1723: a
 * communicator's launch waits on its device stream, which then waits on
 * the launch). */
struct dbl_shared {
  _Atomic int abort;
  _Atomic uint64_t tickets, done;
  struct wakeword wake; /* private futex: `done` moved, or abort */
  _Atomic int refs;
};

struct reg {
  char *ptr;
  size_t bytes;
  int refs;
  struct reg *next;
};

struct user_op {
  int live, dtype, residence;
  uint64_t bits;      /* ncclScalarHostImmediate: the value */
  const void *ptr;    /* ncclScalarDevice: read by the kernel */
};

struct job;

struct ncclComm {
  _Atomic uint64_t magic;      /* COMM_LIVE, COMM_DEAD once destroyed or aborted */
  struct ncclComm *all_next;   /* every communicator ever made (never freed) */
  pthread_mutex_t mu;          /* host-side state below */
  _Atomic int refs;            /* the handle, live kernels, a running job */
  char name[40];
  int rank, nranks, device, world_rank, blocking, split_share;
  uint64_t host_hash;
  int64_t busid;
  uint8_t salt;
  struct shm_hdr *shm;
  struct dbl_shared *sh;
  _Atomic int async;           /* ncclResult_t */
  char async_msg[1024];        /* guarded by mu */
  _Atomic int launch_pending;  /* non-blocking launch not yet observed */
  _Atomic int finalize_pending;
  _Atomic int revoke_pending;
  int finalize_called, revoked;
  int destroy_flag;            /* ncclCommAbort/Destroy called, reclaim pending */
  struct job *job;             /* init or split running for this comm (mu) */
  uint64_t colls_issued;       /* host side, mu */
  uint64_t *sends_issued, *recvs_issued;
  _Atomic uint64_t own_issued, own_done; /* launches, for finalize and destroy */
  uint64_t split_count;
  struct user_op *uops;
  int nuops;
  struct reg *regs;
};

static pthread_mutex_t all_mu = PTHREAD_MUTEX_INITIALIZER;
static struct ncclComm *all_comms; /* tombstones stay reachable */

static _Thread_local int tl_world_rank = -1;

/* The ncclCommAbort / ncclCommDestroy calls now waiting for their device
 * to drain (cudaFree's implicit synchronisation): named in the kernels'
 * deadlock reports, which then explain the hang of the abort. */
#define MAX_DEV_TRACK 64
static pthread_mutex_t drain_mu = PTHREAD_MUTEX_INITIALIZER;
static char drain_what[MAX_DEV_TRACK][256];

static void drain_device(int device, const char *call, struct ncclComm *c) {
  if (device >= 0 && device < MAX_DEV_TRACK) {
    pthread_mutex_lock(&drain_mu);
    snprintf(drain_what[device], sizeof drain_what[device],
             "%s of rank %d of communicator %s (since %.3f)", call, c->rank, c->name, dbl_now());
    pthread_mutex_unlock(&drain_mu);
  }
  char why[160];
  snprintf(why, sizeof why, "%s (cudaFree of the communicator's buffers)", call);
  dbl_device_wait(device, why);
  if (device >= 0 && device < MAX_DEV_TRACK) {
    pthread_mutex_lock(&drain_mu);
    drain_what[device][0] = '\0';
    pthread_mutex_unlock(&drain_mu);
  }
}

static struct ncclComm *comm_new(void) {
  struct ncclComm *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  pthread_mutex_init(&c->mu, NULL);
  atomic_init(&c->refs, 1);
  atomic_init(&c->async, ncclInProgress);
  static _Atomic uint32_t salts;
  c->salt = (uint8_t)(atomic_fetch_add(&salts, 1) * 37u + 11u);
  c->world_rank = tl_world_rank;
  c->rank = c->nranks = c->device = -1;
  atomic_store(&c->magic, COMM_LIVE);
  pthread_mutex_lock(&all_mu);
  c->all_next = all_comms;
  all_comms = c;
  pthread_mutex_unlock(&all_mu);
  return c;
}

static struct dbl_shared *shared_new(void) {
  struct dbl_shared *s = calloc(1, sizeof *s);
  if (!s) dbl_fatal("nccl double: out of memory");
  atomic_init(&s->refs, 1);
  return s;
}

static void shared_unref(struct dbl_shared *s) {
  if (s && atomic_fetch_sub(&s->refs, 1) == 1) free(s);
}

static void comm_ref(struct ncclComm *c) { atomic_fetch_add(&c->refs, 1); }

/* Leave the segment: mark this rank gone, unlink a segment that never
 * completed once every member is gone, unmap. */
static void seg_leave(struct ncclComm *c, int how) {
  struct shm_hdr *h = c->shm;
  if (!h) return;
  c->shm = NULL;
  if (c->rank >= 0 && c->rank < h->nranks) {
    struct shm_rank *me = seg_rank(h, c->rank);
    int32_t st = atomic_load(&me->state);
    if (st == RS_JOINED || st == RS_CLAIMED) atomic_store(&me->state, how);
  }
  ww_bump(&h->wake, 1);
  if (atomic_load(&h->status) != SEG_COMPLETE) {
    int gone = 1;
    for (int i = 0; i < h->nranks && gone; i++) {
      struct shm_rank *r = seg_rank(h, i);
      int32_t st = atomic_load_explicit(&r->state, memory_order_acquire);
      if (st == RS_CLAIMED) gone = 0;
      if (st == RS_JOINED && !pid_dead(r->pid)) gone = 0;
    }
    if (gone) seg_unlink_once(h);
  }
  munmap(h, h->bytes);
}

static void comm_unref(struct ncclComm *c) {
  if (atomic_fetch_sub(&c->refs, 1) != 1) return;
  /* The last reference: no kernel, job or handle uses the comm any more.
   * The struct itself stays (a tombstone: calls on it are answered). */
  seg_leave(c, c->sh && atomic_load(&c->sh->abort) ? RS_ABORTED : RS_LEFT);
  pthread_mutex_lock(&c->mu);
  free(c->sends_issued);
  free(c->recvs_issued);
  c->sends_issued = c->recvs_issued = NULL;
  free(c->uops);
  c->uops = NULL;
  c->nuops = 0;
  while (c->regs) {
    struct reg *r = c->regs;
    c->regs = r->next;
    free(r);
  }
  struct dbl_shared *sh = c->sh;
  c->sh = NULL;
  pthread_mutex_unlock(&c->mu);
  shared_unref(sh);
}

/* Record a state (ncclCommSetAsyncError, init.cc:2129-2137) with its
 * text.  An error sticks: the first one is kept, and nothing but a revoke
 * (which stores its state directly) makes the communicator usable again. */
static void set_async(struct ncclComm *c, ncclResult_t r, const char *msg) {
  pthread_mutex_lock(&c->mu);
  int cur = atomic_load(&c->async);
  if (cur == ncclSuccess || cur == ncclInProgress) {
    atomic_store(&c->async, r);
    if (msg) snprintf(c->async_msg, sizeof c->async_msg, "%s", msg);
  }
  pthread_mutex_unlock(&c->mu);
}

/* Copy the communicator's asynchronous error text into the caller's last
 * error. */
static void show_async_msg(struct ncclComm *c) {
  pthread_mutex_lock(&c->mu);
  if (c->async_msg[0]) snprintf(tl_last_error, sizeof tl_last_error, "%s", c->async_msg);
  pthread_mutex_unlock(&c->mu);
}

static int comm_aborted(struct ncclComm *c) { return c->sh && atomic_load(&c->sh->abort); }

/* After setting the abort flag: wake the kernels now rather than at their
 * next poll.  c->shm belongs to a running init job (which polls the flag
 * itself) until the job is joined. */
static void wake_kernels(struct ncclComm *c) {
  ww_bump(&c->sh->wake, 0);
  pthread_mutex_lock(&c->mu);
  if (!c->job && c->shm) ww_bump(&c->shm->wake, 1);
  pthread_mutex_unlock(&c->mu);
}

/* ------------------------------------------------------------------ */
/* Fault injection                                                    */
/* ------------------------------------------------------------------ */

enum { FAULT_HANG = 1, FAULT_ASYNC, FAULT_KILL };
struct fault {
  int kind, rank;
  uint64_t nth;
};
static struct fault faults[16];
static int nfaults;

static void faults_parse(void) {
  const char *v = getenv("MESHPG_DOUBLE_FAULT");
  if (!v || !v[0]) return;
  char buf[512];
  snprintf(buf, sizeof buf, "%s", v);
  char *save = NULL;
  for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
    char kind[16];
    int r = -1;
    unsigned long long n = 0;
    if (sscanf(t, "%15[a-z]:%d:%llu", kind, &r, &n) != 3 || r < 0 || n < 1 || nfaults == 16)
      dbl_fatal("MESHPG_DOUBLE_FAULT=\"%s\": expected hang:R:N, async:R:N or kill:R:N "
                "(comma-separated, N >= 1)",
                v);
    int k = !strcmp(kind, "hang") ? FAULT_HANG : !strcmp(kind, "async") ? FAULT_ASYNC
          : !strcmp(kind, "kill") ? FAULT_KILL : 0;
    if (!k) dbl_fatal("MESHPG_DOUBLE_FAULT: unknown fault \"%s\" in \"%s\"", kind, v);
    faults[nfaults].kind = k;
    faults[nfaults].rank = r;
    faults[nfaults].nth = n;
    nfaults++;
  }
}

/* Operations issued so far per world rank (1-based counts). */
#define MAX_WORLD 4096
static _Atomic uint64_t ops_issued_by[MAX_WORLD];

/* The fault of `kind` hitting world rank wr's operations [first, last]. */
static const struct fault *fault_hit(int kind, int wr, uint64_t first, uint64_t last) {
  env_init();
  for (int i = 0; i < nfaults; i++)
    if (faults[i].kind == kind && faults[i].rank == wr && faults[i].nth >= first &&
        faults[i].nth <= last)
      return &faults[i];
  return NULL;
}

/* ------------------------------------------------------------------ */
/* Groups, tasks and jobs (thread-local, as group.cc:20-25)           */
/* ------------------------------------------------------------------ */

struct task {
  int func;
  const void *send;
  void *recv;
  size_t count;
  int dtype, opc, root; /* root: also the peer of a send or receive */
  int scal_kind;        /* 0, or ncclScalarHostImmediate + 1 / ncclScalarDevice + 1 */
  uint64_t scal_bits;
  const void *scal_ptr;
  int reg;
  cudaStream_t stream;
  uint64_t seq; /* assigned at launch */
};

struct plan {
  struct ncclComm *comm;
  struct task *tasks;
  int n, cap;
  struct plan *next;
};

/* Jobs: init and split run in threads (NCCL's async jobs); finalize,
 * abort and destroy are reclaims run by the outermost ncclGroupEnd. */
enum { JOB_INIT = 1, JOB_SPLIT, JOB_FINALIZE, JOB_ABORT, JOB_DESTROY };
struct job {
  int kind;
  struct ncclComm *comm;   /* INIT: the new comm; SPLIT: the parent */
  struct ncclComm *child;  /* SPLIT, NULL for NCCL_SPLIT_NOCOLOR */
  ncclComm_t *newcomm;     /* SPLIT */
  int color, key;
  uint64_t split_seq;
  pthread_t thread;
  int started;
  _Atomic int done;
  _Atomic int joined;
  ncclResult_t result;
  char env_id[128];        /* INIT: the NCCL_COMM_ID text its id came from, or "" */
  struct job *next;        /* in the group */
};

static _Thread_local int g_depth;
static _Thread_local ncclResult_t g_error;
static _Thread_local int g_blocking = -1;
static _Thread_local struct plan *g_plans;
static _Thread_local struct job *g_jobs;
/* Set when ncclCommDestroy returned early in a way that leaves NCCL's
 * group depth raised (see ncclCommDestroy). */
static _Thread_local char g_poisoned[512];

static void check_poisoned(const char *call) {
  if (g_poisoned[0])
    dbl_fatal("%s called after %s: real NCCL 2.28 returned from there with this thread's "
              "group depth still raised (init.cc:2373-2381 return before ncclGroupEndInternal), "
              "so this call would be queued as if inside ncclGroupStart and never launched",
              call, g_poisoned);
}

/* ncclGroupErrCheck (include/group.h:89-94). */
static ncclResult_t group_err(ncclResult_t r) {
  if (g_depth > 0 && r != ncclSuccess && r != ncclInProgress) g_error = r;
  return r;
}

/* The blocking mode of a group: its first communicator's; mixing is
 * refused (group.cc:51-59). */
static ncclResult_t group_mode(int blocking) {
  if (g_blocking == -1) {
    g_blocking = blocking;
  } else if (g_blocking != blocking) {
    warn("Blocking and nonblocking communicators are not allowed in the same group.");
    return ncclInvalidArgument;
  }
  return ncclSuccess;
}

static struct plan *plan_for(struct ncclComm *c) {
  for (struct plan *p = g_plans; p; p = p->next)
    if (p->comm == c) return p;
  struct plan *p = calloc(1, sizeof *p);
  if (!p) return NULL;
  p->comm = c;
  comm_ref(c);
  /* keep issue order: append */
  struct plan **pp = &g_plans;
  while (*pp) pp = &(*pp)->next;
  *pp = p;
  return p;
}

static void plans_free(void) {
  while (g_plans) {
    struct plan *p = g_plans;
    g_plans = p->next;
    free(p->tasks);
    comm_unref(p->comm);
    free(p);
  }
}

/* ------------------------------------------------------------------ */
/* Joining a communicator (init and split jobs)                       */
/* ------------------------------------------------------------------ */

static void id_to_name(const ncclUniqueId *id, char *name, size_t n) {
  uint64_t h = fnv1a(FNV_START, id->internal, sizeof id->internal);
  snprintf(name, n, "/mpgdbl-%016" PRIx64, h);
}

/* A child's segment: from the parent segment's random nonce (the same
 * in every member, unique per communicator even when two share an id
 * through NCCL_COMM_ID), the split's number and the colour. */
static void child_name(uint64_t parent_nonce, uint64_t seq, int color, char *name, size_t n) {
  uint64_t h = fnv1a(FNV_START, &parent_nonce, sizeof parent_nonce);
  h = fnv1a(h, &seq, sizeof seq);
  h = fnv1a(h, &color, sizeof color);
  snprintf(name, n, "/mpgdbl-%016" PRIx64, h);
}

/* The bus id of a device as NCCL compares it: busIdToInt64 keeps the hex
 * digits of "0000:XX:00.0" (misc/utils.cc:30-45). */
static int64_t busid_of(int device) {
  char s[64] = "";
  dbl_device_busid(device, s, sizeof s);
  char hex[17];
  int k = 0;
  for (int i = 0; s[i] && k < 16; i++) {
    char ch = s[i];
    if (ch == ':' || ch == '.') continue;
    if ((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f') || (ch >= 'A' && ch <= 'F'))
      hex[k++] = ch;
    else
      break;
  }
  hex[k] = '\0';
  return (int64_t)strtoll(hex, NULL, 16);
}

/* Join c's segment as c->rank of c->nranks and wait for everybody: the
 * bootstrap all-gather of init.cc:886-908.  Returns ncclSuccess or an
 * error with its text in *msg. */
static ncclResult_t do_join(struct ncclComm *c, volatile _Atomic int *parent_abort, char *msg,
                           size_t msglen) {
  volatile _Atomic int *abort_flag = &c->sh->abort;
  struct shm_hdr *h = NULL;
  int n = c->nranks, r = c->rank;
  double t0 = dbl_now();
  for (;;) {
    h = seg_open(c->name, n, abort_flag);
    if (!h) {
      snprintf(msg, msglen, "%s", tl_last_error);
      return ncclSystemError;
    }
    struct shm_rank *me = seg_rank(h, r);
    int32_t empty = RS_EMPTY;
    if (atomic_compare_exchange_strong(&me->state, &empty, RS_CLAIMED)) break;
    int32_t st = atomic_load_explicit(&me->state, memory_order_acquire);
    if (atomic_load(&h->status) == SEG_COMPLETE || (st == RS_CLAIMED && dbl_now() - t0 < 5)) {
      /* completed meanwhile, or being claimed: look again */
      munmap(h, h->bytes);
      sleep_us(200);
      continue;
    }
    if (st == RS_CLAIMED || (st == RS_JOINED && pid_dead(me->pid))) {
      /* Left by a process that died while joining (NCCL_COMM_ID reused
       * after a crash): nobody will complete it. */
      dbl_log("nccl double: %s is stale (rank %d's process %d died): unlinking it", c->name,
              r, (int)me->pid);
      seg_unlink_once(h);
      munmap(h, h->bytes);
      continue;
    }
    dbl_fatal("nccl double: rank %d joined communicator %s (%d ranks) twice: two callers "
              "passed the same rank with the same unique id (real NCCL would hang in "
              "bootstrap)",
              r, c->name, n);
  }
  struct shm_rank *me = seg_rank(h, r);
  me->pid = (int32_t)getpid();
  me->device = c->device;
  me->world_rank = c->world_rank;
  me->host_hash = c->host_hash;
  me->busid = c->busid;
  atomic_store_explicit(&me->state, RS_JOINED, memory_order_release);
  atomic_fetch_add(&h->joined, 1);
  c->shm = h;
  ww_bump(&h->wake, 1);

  double since = dbl_now(), last_check = 0;
  for (;;) {
    uint32_t seen = atomic_load(&h->wake.seq);
    /* `joined` only grows (a member that already left still counts): the
     * acquire pairs with every member's increment, made after its fields. */
    if (atomic_load_explicit(&h->joined, memory_order_acquire) >= n) break;
    /* A split's child also stops when its parent is aborted (the
     * childAbortFlag of init.cc:2393-2399). */
    if (atomic_load(abort_flag) || (parent_abort && atomic_load(parent_abort))) {
      snprintf(msg, msglen, "meshpg double: communicator %s aborted while rank %d waited for "
               "its peers to join", c->name, r);
      return ncclInternalError;
    }
    double now = dbl_now();
    if (now - last_check > 0.05) {
      last_check = now;
      for (int i = 0; i < n; i++) {
        struct shm_rank *p = seg_rank(h, i);
        int32_t st = atomic_load_explicit(&p->state, memory_order_acquire);
        if (st == RS_JOINED && pid_dead(p->pid)) {
          /* bootstrap's socket sees the peer go: socketProgress's
           * "Connection closed by remote peer", ncclRemoteError
           * (misc/socket.cc:71-73). */
          snprintf(msg, msglen,
                   "socketProgress: Connection closed by remote peer (meshpg double: rank %d, "
                   "pid %d, of communicator %s exited while rank %d waited in "
                   "ncclCommInitRank / ncclCommSplit)",
                   i, (int)p->pid, c->name, r);
          return ncclRemoteError;
        }
        if ((st == RS_LEFT || st == RS_ABORTED) && i != r &&
            atomic_load(&h->joined) < n) {
          snprintf(msg, msglen, "socketProgress: Connection closed by remote peer (meshpg "
                   "double: rank %d of communicator %s %s it before every rank joined)",
                   i, c->name, st == RS_LEFT ? "destroyed" : "aborted");
          return ncclRemoteError;
        }
      }
      /* Real NCCL waits for ever in bootstrap; meshpg bounds the wait
       * with its own timeout and aborts, so this is only a warning. */
      if (now - since > hang_seconds() && since > 0) {
        char missing[1024] = "";
        size_t len = 0;
        for (int i = 0; i < n && len < sizeof missing - 16; i++)
          if (atomic_load(&seg_rank(h, i)->state) != RS_JOINED)
            len += (size_t)snprintf(missing + len, sizeof missing - len, " %d", i);
        fprintf(stderr, "meshpg double (pid %d): warning: rank %d of communicator %s (%d ranks, "
                "CUDA device %d) has waited %.1f s in ncclCommInitRank / ncclCommSplit for "
                "ranks%s to join (same id and nranks everywhere?)\n",
                (int)getpid(), r, c->name, n, c->device, now - since, missing);
        since = 0; /* once */
      }
    }
    ww_sleep(&h->wake, seen, 20, 1);
  }
  /* Complete: free the name for a later communicator with the same id. */
  int32_t joining = SEG_JOINING;
  if (atomic_compare_exchange_strong(&h->status, &joining, SEG_COMPLETE)) seg_unlink_once(h);

  /* The duplicate-GPU check of init.cc:902-906: same host and bus id. */
  for (int i = 0; i < n; i++) {
    struct shm_rank *p = seg_rank(h, i);
    if (i != r && p->host_hash == c->host_hash && p->busid == c->busid) {
      snprintf(msg, msglen, "Duplicate GPU detected : rank %d and rank %d both on CUDA device %lx",
               r, i, (unsigned long)c->busid);
      return ncclInvalidUsage;
    }
  }
  c->sends_issued = calloc((size_t)n, sizeof(uint64_t));
  c->recvs_issued = calloc((size_t)n, sizeof(uint64_t));
  if (!c->sends_issued || !c->recvs_issued) {
    snprintf(msg, msglen, "meshpg double: out of memory");
    return ncclSystemError;
  }
  return ncclSuccess;
}

/* The split all-gather and child membership of commGetSplitInfo
 * (init.cc:1455-1495): every parent rank publishes (colour, key), members
 * of a colour are ordered by key, ties by parent rank. */
static ncclResult_t do_split(struct job *j, char *msg, size_t msglen) {
  struct ncclComm *p = j->comm;
  struct shm_hdr *h = p->shm;
  int n = p->nranks, b = (int)(j->split_seq & 1);
  struct shm_rank *me = seg_rank(h, p->rank);
  atomic_store(&me->split_color[b], j->color);
  atomic_store(&me->split_key[b], j->key);
  atomic_store_explicit(&me->split_seq, j->split_seq, memory_order_release);
  ww_bump(&h->wake, 1);
  double since = dbl_now(), last_check = 0;
  for (;;) {
    uint32_t seen = atomic_load(&h->wake.seq);
    int all = 1;
    for (int i = 0; i < n && all; i++)
      if (atomic_load_explicit(&seg_rank(h, i)->split_seq, memory_order_acquire) < j->split_seq)
        all = 0;
    if (all) break;
    if (comm_aborted(p)) {
      snprintf(msg, msglen, "meshpg double: parent communicator %s aborted during "
               "ncclCommSplit", p->name);
      return ncclInternalError;
    }
    double now = dbl_now();
    if (now - last_check > 0.05) {
      last_check = now;
      for (int i = 0; i < n; i++) {
        struct shm_rank *q = seg_rank(h, i);
        if (atomic_load(&q->split_seq) < j->split_seq && pid_dead(q->pid)) {
          snprintf(msg, msglen,
                   "socketProgress: Connection closed by remote peer (meshpg double: rank %d, "
                   "pid %d, of communicator %s exited before ncclCommSplit #%" PRIu64 ")",
                   i, (int)q->pid, p->name, j->split_seq);
          return ncclRemoteError;
        }
      }
      if (now - since > hang_seconds() && since > 0) {
        char missing[1024] = "";
        size_t len = 0;
        for (int i = 0; i < n && len < sizeof missing - 64; i++) {
          uint64_t s = atomic_load(&seg_rank(h, i)->split_seq);
          if (s < j->split_seq)
            len += (size_t)snprintf(missing + len, sizeof missing - len,
                                    " rank %d (at split #%" PRIu64 ");", i, s);
        }
        fprintf(stderr, "meshpg double (pid %d): warning: ncclCommSplit #%" PRIu64 " of %s: "
                "rank %d has waited %.1f s for%s ncclCommSplit is collective over the parent\n",
                (int)getpid(), j->split_seq, p->name, p->rank, now - since, missing);
        since = 0; /* once; meshpg's timeout aborts the parent */
      }
    }
    ww_sleep(&h->wake, seen, 20, 1);
  }
  if (j->color == NCCL_SPLIT_NOCOLOR) return ncclSuccess;
  int *members = malloc(sizeof(int) * (size_t)n), nm = 0, myrank = -1;
  int *keys = malloc(sizeof(int) * (size_t)n);
  if (!members || !keys) {
    free(members);
    free(keys);
    snprintf(msg, msglen, "meshpg double: out of memory");
    return ncclSystemError;
  }
  for (int i = 0; i < n; i++) {
    struct shm_rank *q = seg_rank(h, i);
    if (atomic_load(&q->split_color[b]) != j->color) continue;
    int key = atomic_load(&q->split_key[b]), at = 0;
    while (at < nm && keys[at] <= key) at++;
    for (int k = nm; k > at; k--) {
      members[k] = members[k - 1];
      keys[k] = keys[k - 1];
    }
    members[at] = i;
    keys[at] = key;
    nm++;
  }
  for (int i = 0; i < nm; i++)
    if (members[i] == p->rank) myrank = i;
  free(members);
  free(keys);
  struct ncclComm *c = j->child;
  c->nranks = nm;
  c->rank = myrank;
  child_name(h->nonce, j->split_seq, j->color, c->name, sizeof c->name);
  return do_join(c, &p->sh->abort, msg, msglen);
}

/* An id made from NCCL_COMM_ID is read again by NCCL's init thread:
 * ncclCommInitRankFunc (init.cc:1512) calls commAlloc (init.cc:1572), whose
 * ncclNetInit (init.cc:421) runs the socket transport's ncclFindInterfaces,
 * which reads NCCL_COMM_ID to pick the interface on the root's subnet
 * (misc/socket.cc:374-380).  A caller that unsets or changes the variable
 * while that thread runs races getenv against unsetenv, and NCCL picks its
 * network interface by timing.  NCCL does this once per process (the
 * transport's init is once); the double checks every init, as the job
 * starts and as it ends (the latest moment NCCL's thread could read it),
 * so that no order of inits hides the bug. */
static void env_id_check(const struct job *j, const char *when) {
  if (!j->env_id[0]) return;
  const char *now = getenv("NCCL_COMM_ID");
  if (now && !strcmp(now, j->env_id)) return;
  dbl_fatal("nccl double: rank %d of communicator %s: its unique id came from "
            "NCCL_COMM_ID=%s, but %s the variable is %s%s%s: NCCL's init thread reads it "
            "there (ncclFindInterfaces, misc/socket.cc:374, from commAlloc's ncclNetInit, "
            "init.cc:421), so real NCCL would choose its network interface by timing; keep "
            "NCCL_COMM_ID set until ncclCommGetAsyncError reports the init done",
            j->comm->rank, j->comm->name, j->env_id, when, now ? "\"" : "unset",
            now ? now : "", now ? "\"" : "");
}

static void *job_main(void *arg) {
  struct job *j = arg;
  char msg[1024] = "";
  ncclResult_t r;
  if (j->kind == JOB_INIT) {
    env_id_check(j, "as NCCL's init thread starts");
    r = do_join(j->comm, NULL, msg, sizeof msg);
    env_id_check(j, "as NCCL's init thread ends");
    set_async(j->comm, r, msg);
    dbl_log("nccl double: init of rank %d/%d on %s: %s", j->comm->rank, j->comm->nranks,
            j->comm->name, ncclGetErrorString(r));
  } else {
    r = do_split(j, msg, sizeof msg);
    if (j->child) set_async(j->child, r, msg);
    /* The split job's result is the parent's (group.cc:610-611 and
     * 380-392 set the job's communicator's state), and the child is stored
     * into *newcomm when the job ends, even after a failure (init.cc:1611-1614). */
    __atomic_store_n(j->newcomm, j->child, __ATOMIC_RELEASE);
    if (r != ncclSuccess) {
      set_async(j->comm, r, msg);
    } else {
      int cur = ncclInProgress;
      atomic_compare_exchange_strong(&j->comm->async, &cur, ncclSuccess);
    }
    dbl_log("nccl double: split #%" PRIu64 " colour %d of %s: %s", j->split_seq, j->color,
            j->comm->name, ncclGetErrorString(r));
  }
  j->result = r;
  atomic_store_explicit(&j->done, 1, memory_order_release);
  return NULL;
}

/* Join a finished or aborting job's thread, once. */
static void job_join(struct job *j) {
  if (j->started && !atomic_exchange(&j->joined, 1)) pthread_join(j->thread, NULL);
}

static void job_free(struct job *j) {
  job_join(j);
  if (j->child) comm_unref(j->child);
  comm_unref(j->comm);
  free(j);
}

/* The communicator's state, resolving what has finished in the meantime
 * (ncclCommGetAsyncError, init.cc:2706-2720): a finished job is joined, a
 * non-blocking launch is observed done, a non-blocking finalize is done
 * once every kernel of the communicator has finished. */
static ncclResult_t comm_state(struct ncclComm *c) {
  pthread_mutex_lock(&c->mu);
  struct job *j = c->job;
  if (j && atomic_load_explicit(&j->done, memory_order_acquire))
    c->job = NULL;
  else
    j = NULL;
  pthread_mutex_unlock(&c->mu);
  if (j) job_free(j);
  int s = atomic_load(&c->async);
  if (s == ncclInProgress && atomic_exchange(&c->launch_pending, 0)) {
    int cur = ncclInProgress;
    atomic_compare_exchange_strong(&c->async, &cur, ncclSuccess);
  }
  if (s == ncclInProgress && atomic_load(&c->revoke_pending) &&
      atomic_load(&c->own_done) == atomic_load(&c->own_issued)) {
    /* Quiescent: the revoke job ends by clearing the abort flags
     * (init.cc:2439) and the state becomes ncclSuccess. */
    int cur = ncclInProgress;
    atomic_store(&c->revoke_pending, 0);
    if (c->sh) atomic_store(&c->sh->abort, 0);
    atomic_compare_exchange_strong(&c->async, &cur, ncclSuccess);
  }
  if (s == ncclInProgress && atomic_load(&c->finalize_pending) &&
      atomic_load(&c->own_done) == atomic_load(&c->own_issued)) {
    int cur = ncclInProgress;
    atomic_store(&c->finalize_pending, 0);
    atomic_compare_exchange_strong(&c->async, &cur, ncclSuccess);
  }
  return (ncclResult_t)atomic_load(&c->async);
}

/* ------------------------------------------------------------------ */
/* Kernels: one launch per communicator per group, on a user stream   */
/* ------------------------------------------------------------------ */

/* Collective states: arrive (publish the call), match (every rank has
 * arrived, calls compared), then per chunk write (own contribution into
 * the staging bank) and read (every rank wrote: combine). */
enum { CS_ARRIVE = 0, CS_MATCH, CS_WRITE, CS_READ, CS_DONE };
/* Send/receive states. */
enum { PS_START = 0, PS_HDR, PS_DATA, PS_ACK, PS_DONE };

struct ktask {
  struct task t;
  int st;
  uint64_t chunk, nchunks;
  size_t ch;          /* elements per chunk (per rank block for reduce-scatter) */
  uint64_t *scal;     /* every rank's pre-multiplier (PreMulSum) */
  uint64_t bytes, total, done, end;
  int prev;           /* send/receive: the previous one on the same ring, or -1 */
};

struct launch {
  struct ncclComm *comm;
  _Atomic uint64_t ticket;
  int n;
  struct ktask *k;
  int world_rank;
  uint64_t nth_first, nth_last;
  const char **srcs;  /* n ranks' staging pointers for a reduction */
  int dead_reported;
  void *acc;          /* f32/f64 accumulator, 2 banks' worth */
  char what[256];
};

static int is_coll(int f) { return f >= F_AR && f <= F_RS; }
static int is_reduction(int f) { return f == F_AR || f == F_RED || f == F_RS; }
static uint64_t posv(uint64_t seq, uint64_t w) { return (seq << 32) | w; }
static uint64_t round32(uint64_t x) { return (x + 31) & ~(uint64_t)31; }

struct dsc {
  uint64_t seq, count, scalar;
  int func, dtype, op, root, reg;
};

static void desc_store(struct shm_desc *d, const struct task *t, uint64_t scalar) {
  atomic_store_explicit(&d->func, t->func, memory_order_relaxed);
  atomic_store_explicit(&d->count, t->count, memory_order_relaxed);
  atomic_store_explicit(&d->dtype, t->dtype, memory_order_relaxed);
  atomic_store_explicit(&d->op, t->opc, memory_order_relaxed);
  atomic_store_explicit(&d->root, t->root, memory_order_relaxed);
  atomic_store_explicit(&d->reg, t->reg, memory_order_relaxed);
  atomic_store_explicit(&d->scalar, scalar, memory_order_relaxed);
  atomic_store_explicit(&d->seq, t->seq, memory_order_relaxed);
}

static void desc_load(struct shm_desc *d, struct dsc *o) {
  o->seq = atomic_load_explicit(&d->seq, memory_order_relaxed);
  o->count = atomic_load_explicit(&d->count, memory_order_relaxed);
  o->scalar = atomic_load_explicit(&d->scalar, memory_order_relaxed);
  o->func = atomic_load_explicit(&d->func, memory_order_relaxed);
  o->dtype = atomic_load_explicit(&d->dtype, memory_order_relaxed);
  o->op = atomic_load_explicit(&d->op, memory_order_relaxed);
  o->root = atomic_load_explicit(&d->root, memory_order_relaxed);
  o->reg = atomic_load_explicit(&d->reg, memory_order_relaxed);
}

/* "ncclAllReduce(count 1024, ncclFloat32, ncclSum)" */
static void dsc_text(const struct dsc *d, char *b, size_t n) {
  if (d->func == F_NONE) {
    snprintf(b, n, "nothing");
  } else if (is_reduction(d->func) && d->func != F_RED) {
    snprintf(b, n, "%s(count %" PRIu64 ", %s, %s)", func_name(d->func), d->count,
             dt_name(d->dtype), op_name(d->op));
  } else if (d->func == F_RED) {
    snprintf(b, n, "%s(count %" PRIu64 ", %s, %s, root %d)", func_name(d->func), d->count,
             dt_name(d->dtype), op_name(d->op), d->root);
  } else if (d->func == F_BC) {
    snprintf(b, n, "%s(count %" PRIu64 ", %s, root %d)", func_name(d->func), d->count,
             dt_name(d->dtype), d->root);
  } else if (d->func == F_SEND || d->func == F_RECV) {
    snprintf(b, n, "%s(count %" PRIu64 ", %s, peer %d)", func_name(d->func), d->count,
             dt_name(d->dtype), d->root);
  } else {
    snprintf(b, n, "%s(count %" PRIu64 ", %s)", func_name(d->func), d->count, dt_name(d->dtype));
  }
}

static void task_text(const struct task *t, char *b, size_t n) {
  struct dsc d = {t->seq, t->count, 0, t->func, t->dtype, t->opc, t->root, t->reg};
  dsc_text(&d, b, n);
}

static int all_at(struct shm_hdr *h, uint64_t want) {
  for (int i = 0; i < h->nranks; i++)
    if (atomic_load_explicit(&seg_rank(h, i)->pos, memory_order_acquire) < want) return 0;
  return 1;
}

/* The pre-multiplier this rank contributes: host immediate, or read from
 * device memory by the kernel (ncclScalarDevice). */
static uint64_t my_scalar(struct launch *L, struct ktask *k) {
  uint64_t bits = 0;
  if (k->t.scal_kind == ncclScalarHostImmediate + 1) return k->t.scal_bits;
  if (k->t.scal_kind == ncclScalarDevice + 1) {
    size_t es = dt_size(k->t.dtype);
    int dev = -1;
    if (dbl_mem_find(k->t.scal_ptr, es, &dev) != DBL_MEM_DEVICE)
      dbl_fatal("nccl double: %s: the scalar of ncclRedOpCreatePreMulSum(..., "
                "ncclScalarDevice) at %p is not live device memory when the kernel reads it "
                "(real NCCL would fault)",
                L->what, k->t.scal_ptr);
    memcpy(&bits, k->t.scal_ptr, es);
  }
  return bits;
}

static void match_fatal(struct launch *L, const struct dsc *mine, int p, const struct dsc *his,
                        const char *why) {
  struct ncclComm *c = L->comm;
  char a[160], b[160];
  dsc_text(mine, a, sizeof a);
  dsc_text(his, b, sizeof b);
  dbl_fatal("nccl double: collective #%" PRIu64 " of communicator %s (%d ranks) does not "
            "match: rank %d called %s but rank %d called %s%s.  Every rank must issue the "
            "same collectives, with the same count, datatype, op and root, in the same order "
            "(real NCCL would hang or corrupt memory)",
            mine->seq, c->name, c->nranks, c->rank, a, p, b, why);
}

/* Compare every rank's call (they have all arrived) and collect their
 * pre-multipliers. */
static void coll_match(struct launch *L, struct ktask *k) {
  struct ncclComm *c = L->comm;
  struct shm_hdr *h = c->shm;
  int b = (int)(k->t.seq & 1);
  struct dsc mine, his;
  desc_load(&seg_rank(h, c->rank)->desc[b], &mine);
  for (int p = 0; p < c->nranks; p++) {
    desc_load(&seg_rank(h, p)->desc[b], &his);
    if (his.seq != mine.seq || his.func != mine.func || his.count != mine.count ||
        his.dtype != mine.dtype ||
        (is_reduction(mine.func) && his.op != mine.op) ||
        ((mine.func == F_BC || mine.func == F_RED) && his.root != mine.root))
      match_fatal(L, &mine, p, &his, "");
    if (his.reg != mine.reg)
      match_fatal(L, &mine, p, &his,
                  mine.reg ? " (with registered buffers on the first rank only: the NCCL user "
                             "guide, \"User Buffer Registration\", requires all ranks or none "
                             "to pass registered buffers; real NCCL would hang)"
                           : " (with registered buffers on the second rank only: the NCCL user "
                             "guide, \"User Buffer Registration\", requires all ranks or none "
                             "to pass registered buffers; real NCCL would hang)");
    if (k->scal) k->scal[p] = his.scalar;
  }
}

static void coll_geometry(struct launch *L, struct ktask *k) {
  struct shm_hdr *h = L->comm->shm;
  size_t es = dt_size(k->t.dtype), n = (size_t)h->nranks;
  k->ch = k->t.func == F_RS ? h->bank / (n * es) : h->bank / es;
  k->nchunks = (k->t.count + k->ch - 1) / k->ch;
}

/* This rank's contribution to chunk k->chunk, into its staging bank. */
static void coll_write(struct launch *L, struct ktask *k) {
  struct ncclComm *c = L->comm;
  struct shm_hdr *h = c->shm;
  size_t es = dt_size(k->t.dtype), off = (size_t)k->chunk * k->ch;
  size_t len = k->t.count - off < k->ch ? k->t.count - off : k->ch;
  char *slot = seg_slot(h, c->rank, (int)(k->chunk & 1));
  const char *send = k->t.send;
  switch (k->t.func) {
    case F_AR: case F_RED: case F_AG:
      memcpy(slot, send + off * es, len * es);
      break;
    case F_BC:
      if (c->rank == k->t.root) memcpy(slot, send + off * es, len * es);
      break;
    case F_RS:
      for (int d = 0; d < c->nranks; d++)
        memcpy(slot + (size_t)d * len * es, send + ((size_t)d * k->t.count + off) * es, len * es);
      break;
  }
}

/* Every rank wrote chunk k->chunk: combine into this rank's result. */
static void coll_read(struct launch *L, struct ktask *k) {
  struct ncclComm *c = L->comm;
  struct shm_hdr *h = c->shm;
  int n = c->nranks, bank = (int)(k->chunk & 1);
  size_t es = dt_size(k->t.dtype), off = (size_t)k->chunk * k->ch;
  size_t len = k->t.count - off < k->ch ? k->t.count - off : k->ch;
  char *recv = k->t.recv;
  switch (k->t.func) {
    case F_AR: case F_RED: case F_RS:
      if (k->t.func == F_RED && c->rank != k->t.root) break;
      for (int p = 0; p < n; p++)
        L->srcs[p] = seg_slot(h, p, bank) + (k->t.func == F_RS ? (size_t)c->rank * len * es : 0);
      reduce_elems(k->t.dtype, k->t.opc, n, L->srcs, recv + off * es, len, k->scal, L->acc);
      break;
    case F_BC:
      if (!(c->rank == k->t.root && k->t.send == k->t.recv))
        memcpy(recv + off * es, seg_slot(h, k->t.root, bank), len * es);
      break;
    case F_AG:
      for (int p = 0; p < n; p++)
        memcpy(recv + ((size_t)p * k->t.count + off) * es, seg_slot(h, p, bank), len * es);
      break;
  }
}

/* One step of a collective: 1 progressed, 0 blocked, 2 done. */
static int coll_step(struct launch *L, struct ktask *k) {
  struct ncclComm *c = L->comm;
  struct shm_hdr *h = c->shm;
  struct shm_rank *me = seg_rank(h, c->rank);
  uint64_t seq = k->t.seq;
  switch (k->st) {
    case CS_ARRIVE:
      desc_store(&me->desc[seq & 1], &k->t, my_scalar(L, k));
      atomic_store_explicit(&me->pos, posv(seq, 0), memory_order_release);
      ww_bump(&h->wake, 1);
      k->st = CS_MATCH;
      return 1;
    case CS_MATCH:
      if (!all_at(h, posv(seq, 0))) return 0;
      coll_match(L, k);
      coll_geometry(L, k);
      k->chunk = 0;
      k->st = CS_WRITE;
      return 1;
    case CS_WRITE:
      coll_write(L, k);
      atomic_store_explicit(&me->pos, posv(seq, k->chunk + 1), memory_order_release);
      ww_bump(&h->wake, 1);
      k->st = CS_READ;
      return 1;
    case CS_READ:
      if (!all_at(h, posv(seq, k->chunk + 1))) return 0;
      coll_read(L, k);
      k->chunk++;
      k->st = k->chunk == k->nchunks ? CS_DONE : CS_WRITE;
      return k->st == CS_DONE ? 2 : 1;
  }
  return 2;
}

static void ring_put(char *ring, uint64_t R, uint64_t at, const char *src, uint64_t n) {
  uint64_t o = at % R, first = R - o < n ? R - o : n;
  memcpy(ring + o, src, first);
  if (n > first) memcpy(ring, src + first, n - first);
}

static void ring_get(const char *ring, uint64_t R, uint64_t at, char *dst, uint64_t n) {
  uint64_t o = at % R, first = R - o < n ? R - o : n;
  memcpy(dst, ring + o, first);
  if (n > first) memcpy(dst + first, ring, n - first);
}

/* One step of a send or receive: 1 progressed, 0 blocked, 2 done. */
static int p2p_step(struct launch *L, struct ktask *k) {
  struct ncclComm *c = L->comm;
  struct shm_hdr *h = c->shm;
  uint64_t R = h->ring;
  int send = k->t.func == F_SEND;
  struct shm_chan *ch = send ? seg_chan(h, c->rank, k->t.root) : seg_chan(h, k->t.root, c->rank);
  char *ring = chan_ring(ch);
  switch (k->st) {
    case PS_START:
      atomic_fetch_add(send ? &ch->sends_started : &ch->recvs_started, 1);
      k->bytes = (uint64_t)k->t.count * dt_size(k->t.dtype);
      k->total = round32(k->bytes);
      k->done = 0;
      k->st = PS_HDR;
      ww_bump(&h->wake, 1);
      return 1;
    case PS_HDR:
      if (send) {
        uint64_t head = atomic_load_explicit(&ch->head, memory_order_relaxed);
        uint64_t tail = atomic_load_explicit(&ch->tail, memory_order_acquire);
        if (R - (head - tail) < sizeof(struct msg_hdr)) return 0;
        struct msg_hdr m = {MSG_MAGIC, k->t.seq, k->bytes, k->t.dtype, k->t.reg};
        ring_put(ring, R, head, (const char *)&m, sizeof m);
        atomic_store_explicit(&ch->head, head + sizeof m, memory_order_release);
      } else {
        uint64_t tail = atomic_load_explicit(&ch->tail, memory_order_relaxed);
        uint64_t head = atomic_load_explicit(&ch->head, memory_order_acquire);
        if (head - tail < sizeof(struct msg_hdr)) return 0;
        struct msg_hdr m;
        ring_get(ring, R, tail, (char *)&m, sizeof m);
        if (m.magic != MSG_MAGIC || m.seq != k->t.seq)
          dbl_fatal("nccl double: ring from rank %d to rank %d of %s is out of step: receive "
                    "#%" PRIu64 " found message #%" PRIu64 " (a double bug)",
                    k->t.root, c->rank, c->name, k->t.seq, m.seq);
        if (m.bytes != k->bytes) {
          char mine[160];
          task_text(&k->t, mine, sizeof mine);
          dbl_fatal("nccl double: send/receive mismatch on communicator %s: rank %d's receive "
                    "#%" PRIu64 " from rank %d, %s, expects %" PRIu64 " bytes, but rank %d's "
                    "send #%" PRIu64 " to rank %d carries %" PRIu64 " bytes (%s); NCCL "
                    "requires matching sizes (real NCCL would hang or truncate)",
                    c->name, c->rank, k->t.seq, k->t.root, mine, k->bytes, k->t.root, m.seq,
                    c->rank, m.bytes, dt_name(m.dtype));
        }
        if (m.reg != k->t.reg)
          dbl_fatal("nccl double: registered-buffer mismatch on communicator %s: rank %d's "
                    "send #%" PRIu64 " to rank %d uses %s buffer but rank %d's receive uses %s "
                    "buffer; the NCCL user guide (\"User Buffer Registration\") requires all "
                    "ranks or none to pass registered buffers (real NCCL would hang)",
                    c->name, k->t.root, m.seq, c->rank, m.reg ? "a registered" : "an unregistered",
                    c->rank, k->t.reg ? "a registered" : "an unregistered");
        atomic_store_explicit(&ch->tail, tail + sizeof m, memory_order_release);
      }
      ww_bump(&h->wake, 1);
      k->st = PS_DATA;
      return 1;
    case PS_DATA: {
      if (k->done == k->total) {
        if (!send) return 2;
        k->end = atomic_load_explicit(&ch->head, memory_order_relaxed);
        k->st = PS_ACK;
        return 1;
      }
      uint64_t head, tail, room;
      if (send) {
        head = atomic_load_explicit(&ch->head, memory_order_relaxed);
        tail = atomic_load_explicit(&ch->tail, memory_order_acquire);
        room = R - (head - tail);
      } else {
        tail = atomic_load_explicit(&ch->tail, memory_order_relaxed);
        head = atomic_load_explicit(&ch->head, memory_order_acquire);
        room = head - tail;
      }
      if (room == 0) return 0;
      uint64_t n = k->total - k->done < room ? k->total - k->done : room;
      /* Only the first `bytes` of the padded message carry data. */
      uint64_t data = k->done < k->bytes ? (k->bytes - k->done < n ? k->bytes - k->done : n) : 0;
      if (send) {
        if (data) ring_put(ring, R, head, (const char *)k->t.send + k->done, data);
        atomic_store_explicit(&ch->head, head + n, memory_order_release);
      } else {
        if (data) ring_get(ring, R, tail, (char *)k->t.recv + k->done, data);
        atomic_store_explicit(&ch->tail, tail + n, memory_order_release);
      }
      k->done += n;
      ww_bump(&h->wake, 1);
      if (!send && k->done == k->total) return 2;
      return 1;
    }
    case PS_ACK:
      /* Rendezvous: the send is complete once its receiver consumed it. */
      if (atomic_load_explicit(&ch->tail, memory_order_acquire) < k->end) return 0;
      return 2;
  }
  return 2;
}

/* ---- reports ---- */

struct sbuf {
  char *b;
  size_t len, cap;
};

static void sb_add(struct sbuf *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_add(struct sbuf *s, const char *fmt, ...) {
  if (s->len + 1 >= s->cap) return;
  va_list ap;
  va_start(ap, fmt);
  int w = vsnprintf(s->b + s->len, s->cap - s->len, fmt, ap);
  va_end(ap);
  if (w > 0) s->len = s->len + (size_t)w < s->cap ? s->len + (size_t)w : s->cap - 1;
}

static void peer_text(struct sbuf *s, struct ncclComm *c, int p) {
  struct shm_hdr *h = c->shm;
  struct shm_rank *q = seg_rank(h, p);
  int32_t st = atomic_load_explicit(&q->state, memory_order_acquire);
  struct dsc is;
  desc_load(&q->issued, &is);
  char issued[160];
  dsc_text(&is, issued, sizeof issued);
  uint64_t pos = atomic_load(&q->pos);
  sb_add(s, "    rank %d (pid %d, CUDA device %d, world rank %d)%s%s: its kernel is at "
         "collective #%" PRIu64 " (chunks written %" PRIu64 "), %" PRIu64 " kernels started; "
         "the last operation it issued on this communicator is %s #%" PRIu64
         " (collectives issued: %" PRIu64 ")\n",
         p, (int)q->pid, (int)q->device, (int)q->world_rank,
         st == RS_LEFT ? " [destroyed this communicator]" : st == RS_ABORTED ? " [aborted it]" : "",
         pid_dead(q->pid) ? " [process exited]" : "", pos >> 32, pos & 0xffffffffu,
         (uint64_t)atomic_load(&q->launches), issued, is.seq,
         (uint64_t)atomic_load(&q->colls_issued));
  if (q->pid == getpid() && q->device != c->device) {
    char dev[2048] = "";
    dbl_device_describe(q->device, dev, sizeof dev);
    sb_add(s, "      its device %d runs: %s\n", (int)q->device, dev[0] ? dev : "nothing");
  }
}

static void report_hang(struct launch *L, double waited) {
  struct ncclComm *c = L->comm;
  struct shm_hdr *h = c->shm;
  struct sbuf s = {malloc(32768), 0, 32768};
  if (!s.b) dbl_fatal("nccl double: deadlock in %s (no memory for the report)", L->what);
  s.b[0] = '\0';
  sb_add(&s, "nccl double: deadlock: rank %d of communicator %s (%d ranks; pid %d, CUDA device "
         "%d, world rank %d) has made no progress for %.1f s in the kernel \"%s\":\n",
         c->rank, c->name, c->nranks, (int)getpid(), c->device, c->world_rank, waited, L->what);
  int coll_seen = 0;
  for (int i = 0; i < L->n; i++) {
    struct ktask *k = &L->k[i];
    char t[160];
    task_text(&k->t, t, sizeof t);
    if (is_coll(k->t.func)) {
      if (k->st == CS_DONE || coll_seen) continue;
      coll_seen = 1;
      uint64_t want = k->st <= CS_MATCH ? posv(k->t.seq, 0) : posv(k->t.seq, k->chunk + 1);
      sb_add(&s, "  it waits in collective #%" PRIu64 " %s (%s) for:\n", k->t.seq, t,
             k->st <= CS_MATCH ? "for every rank to arrive"
                               : "for every rank to write its next chunk");
      for (int p = 0; p < c->nranks; p++)
        if (atomic_load(&seg_rank(h, p)->pos) < want) peer_text(&s, c, p);
    } else if (k->st != PS_DONE && (k->prev < 0 || L->k[k->prev].st == PS_DONE)) {
      int send = k->t.func == F_SEND;
      struct shm_chan *ch = send ? seg_chan(h, c->rank, k->t.root) : seg_chan(h, k->t.root, c->rank);
      sb_add(&s, "  it waits in %s #%" PRIu64 " %s (%s); rank %d's kernels have started %" PRIu64
             " %s from rank %d:\n",
             send ? "send" : "receive", k->t.seq, t,
             send ? (k->st == PS_ACK ? "all data written, not yet received" : "the ring is full")
                  : "no data from the sender",
             k->t.root, (uint64_t)atomic_load(send ? &ch->recvs_started : &ch->sends_started),
             send ? "receives" : "sends", c->rank);
      peer_text(&s, c, k->t.root);
    }
  }
  char dev[2048] = "";
  dbl_device_describe(c->device, dev, sizeof dev);
  sb_add(&s, "  this rank's device %d runs: %s\n", c->device, dev[0] ? dev : "nothing");
  if (c->device >= 0 && c->device < MAX_DEV_TRACK) {
    pthread_mutex_lock(&drain_mu);
    if (drain_what[c->device][0])
      sb_add(&s, "  and %s waits for this kernel: it frees device memory, and cudaFree waits "
             "for every kernel of the device (NVIDIA/nccl PR 564, issues 829 and 1013): set "
             "every communicator's abort flag before freeing any\n", drain_what[c->device]);
    pthread_mutex_unlock(&drain_mu);
  }
  sb_add(&s, "Real NCCL would hang here: its kernels spin until the peers reach the same "
         "operation.  The ranks issued this communicator's operations in different orders, a "
         "peer never issued it, a send has no matching receive, or a peer's device is held by "
         "another communicator's kernel (NCCL user guide, \"Using multiple NCCL communicators "
         "concurrently\").");
  dbl_fatal("%s", s.b);
}

/* A peer process we wait for has exited: the kernel keeps waiting (as an
 * NCCL kernel does) but the communicator reports ncclRemoteError, the code
 * of a closed connection (misc/socket.cc:71-73), until someone aborts. */
static void check_dead_peers(struct launch *L) {
  struct ncclComm *c = L->comm;
  struct shm_hdr *h = c->shm;
  if (L->dead_reported) return;
  char who[512] = "";
  size_t len = 0;
  for (int p = 0; p < c->nranks && len < sizeof who - 64; p++) {
    struct shm_rank *q = seg_rank(h, p);
    if (q->pid == getpid() || !pid_dead(q->pid)) continue;
    len += (size_t)snprintf(who + len, sizeof who - len, "%srank %d (pid %d, CUDA device %d)",
                            len ? ", " : "", p, (int)q->pid, (int)q->device);
  }
  if (!len) return;
  char msg[1024];
  snprintf(msg, sizeof msg,
           "socketProgress: Connection closed by remote peer (meshpg double: %s of communicator "
           "%s exited while rank %d's kernel \"%s\" waited for it; the kernel waits until "
           "ncclCommAbort)",
           who, c->name, c->rank, L->what);
  set_async(c, ncclRemoteError, msg);
  dbl_log("%s", msg);
  L->dead_reported = 1;
}

static void launch_free(struct launch *L) {
  for (int i = 0; i < L->n; i++) free(L->k[i].scal);
  free(L->k);
  free(L->srcs);
  free(L->acc);
  free(L);
}

/* The kernel: runs on the stream's executor.
 *
 * An abort cuts it short, and the stream goes on: ncclCommAbort raises the
 * communicator's abort flags at once (setCommAbortFlags, init.cc:2394-2403,
 * called at init.cc:2515 before anything is freed); every wait of a device
 * primitive polls the flag (checkAbort, device/primitives.h:142-152, e.g.
 * waitPeer's loop, device/prims_simple.h:115-117), and once it is seen the
 * primitives move no more data ("if user abort the kernel, we don't need to
 * actually perform copy/reduce", prims_simple.h:238-240) and the kernel's
 * work loop ends (`while (ncclShmem.aborted == 0)`, device/common.h:385).
 * The kernel then returns like any other, so the stream's later work, an
 * event recorded after the collective included, completes: an event that
 * fired does not mean the data moved.  Here: an aborted kernel stops at its
 * next poll of sh->abort (or never starts), leaves the receive buffer as it
 * is, and finishes its stream item. */
static void launch_run(void *arg) {
  struct launch *L = arg;
  struct ncclComm *c = L->comm;
  struct dbl_shared *sh = c->sh;
  struct shm_hdr *h = c->shm;
  uint64_t t;
  while ((t = atomic_load(&L->ticket)) == 0) sleep_us(20); /* set right after the submit */
  int aborted = 0;

  /* A communicator's kernels run one after the other in issue order
   * (enqueue.cc:1495-1502 and 1716-1723), aborted or not: `done` counts
   * the family's finished kernels in ticket order. */
  double since = dbl_now();
  for (;;) {
    uint32_t seen = atomic_load(&sh->wake.seq);
    if (atomic_load(&sh->done) >= t - 1) break;
    ww_sleep(&sh->wake, seen, 20, 0);
    if (dbl_now() - since > hang_seconds())
      dbl_fatal("nccl double: deadlock: kernel \"%s\" (rank %d of %s) waited %.1f s for the "
                "communicator's previous kernel to finish (NCCL runs a communicator's kernels "
                "in issue order, enqueue.cc:1495-1502); this device runs: see the CUDA half's "
                "report",
                L->what, c->rank, c->name, dbl_now() - since);
  }

  aborted = atomic_load(&sh->abort);
  if (!aborted) {
    if (fault_hit(FAULT_KILL, L->world_rank, L->nth_first, L->nth_last)) {
      fprintf(stderr, "meshpg double: MESHPG_DOUBLE_FAULT kill: world rank %d (pid %d) raises "
              "SIGKILL at its operation #%" PRIu64 "..%" PRIu64 " (%s)\n",
              L->world_rank, (int)getpid(), L->nth_first, L->nth_last, L->what);
      fflush(stderr);
      raise(SIGKILL);
    }
    if (fault_hit(FAULT_HANG, L->world_rank, L->nth_first, L->nth_last)) {
      dbl_log("nccl double: MESHPG_DOUBLE_FAULT hang: \"%s\" (world rank %d) never arrives",
              L->what, L->world_rank);
      while (!atomic_load(&sh->abort)) {
        uint32_t seen = atomic_load(&h->wake.seq);
        if (atomic_load(&sh->abort)) break;
        ww_sleep(&h->wake, seen, 50, 1);
      }
      aborted = 1;
    }
  }

  if (!aborted) {
    atomic_fetch_add(&seg_rank(h, c->rank)->launches, 1);
    since = dbl_now();
    double last_dead = since;
    for (;;) {
      uint32_t seen = atomic_load(&h->wake.seq);
      if (atomic_load(&sh->abort)) {
        aborted = 1;
        break;
      }
      int pending = 0, progressed = 0, coll_busy = 0;
      for (int i = 0; i < L->n; i++) {
        struct ktask *k = &L->k[i];
        int r;
        if (is_coll(k->t.func)) {
          /* a launch's collectives run in order */
          if (k->st == CS_DONE) continue;
          pending = 1;
          if (coll_busy) continue;
          coll_busy = 1;
          while ((r = coll_step(L, k)) == 1) progressed = 1;
          if (r == 2) {
            progressed = 1;
            coll_busy = 0;
            k->st = CS_DONE;
          }
        } else {
          if (k->st == PS_DONE) continue;
          pending = 1;
          if (k->prev >= 0 && L->k[k->prev].st != PS_DONE) continue; /* ring order */
          while ((r = p2p_step(L, k)) == 1) progressed = 1;
          if (r == 2) {
            progressed = 1;
            k->st = PS_DONE;
          }
        }
      }
      if (!pending) break;
      double now = dbl_now();
      if (progressed) {
        since = now;
        dbl_note_progress(); /* the host's wait on this stream is not hung */
        continue;
      }
      ww_sleep(&h->wake, seen, 20, 1);
      now = dbl_now();
      if (now - last_dead > 0.1) {
        last_dead = now;
        check_dead_peers(L);
      }
      if (now - since > hang_seconds()) report_hang(L, now - since);
    }
  }

  if (!aborted) {
    for (int i = 0; i < L->n; i++) dbl_count_collective();
    const struct fault *f = fault_hit(FAULT_ASYNC, L->world_rank, L->nth_first, L->nth_last);
    if (f) {
      char msg[512];
      snprintf(msg, sizeof msg, "meshpg double: injected fault MESHPG_DOUBLE_FAULT=async:%d:%" PRIu64
               " in \"%s\" (rank %d of %s)", f->rank, f->nth, L->what, c->rank, c->name);
      set_async(c, ncclSystemError, msg);
    }
  }
  atomic_store(&sh->done, t); /* done was t - 1: nothing else moves it now */
  ww_bump(&sh->wake, 0);
  atomic_fetch_add(&c->own_done, 1);
  launch_free(L);
  comm_unref(c);
}

/* ------------------------------------------------------------------ */
/* Launching a group's operations on one communicator                 */
/* ------------------------------------------------------------------ */

static ncclResult_t cuda_fail(cudaError_t e) {
  /* CUDACHECK's wording (include/checks.h:13-19). */
  warn("Cuda failure '%s'", cudaGetErrorString(e));
  return ncclUnhandledCudaError;
}

static ncclResult_t launch_plan_on_device(struct plan *p);

/* Two host threads launching on one device (v2.28.9): with
 * NCCL_LAUNCH_ORDER_IMPLICIT set (and not capturing a graph, which the
 * double does not model), ncclLaunchPrepare acquires the device's
 * launchOrder strong stream as not concurrent (enqueue.cc:1510-1515, "non-
 * captured cannot be concurrent because that would violate deterministic
 * program order of launches"), which records the acquiring thread
 * (strongstream.cc:170-172), and ncclLaunchFinish releases it
 * (enqueue.cc:1738-1742), where ncclStrongStreamRelease returns
 * ncclInvalidUsage with "Fatal: host threads racing to launch NCCL on same
 * device." when another thread acquired it in between
 * (strongstream.cc:158-162, 282-285; NCCL_LAUNCH_RACE_FATAL, default 1).
 * The kernel was launched all the same.  Both variables are read at the
 * process's first launch (NCCL_PARAM caches them). */
static pthread_once_t race_once = PTHREAD_ONCE_INIT;
static int race_on;
static _Thread_local char race_marker;
static _Atomic(void *) race_owner[MAX_DEV_TRACK];

static void race_read(void) {
  const char *o = getenv("NCCL_LAUNCH_ORDER_IMPLICIT"), *f = getenv("NCCL_LAUNCH_RACE_FATAL");
  race_on = o && atoi(o) != 0 && !(f && f[0] && atoi(f) == 0);
}

/* Test knob (test_nccl_rules.c): hold every launch this long inside its
 * acquired window, so that a second thread's launch falls in it. */
static _Atomic double launch_pause_s;
void dbl_fault_launch_pause(double seconds);
void dbl_fault_launch_pause(double seconds) { atomic_store(&launch_pause_s, seconds); }

static int launch_race_enter(struct plan *p) {
  pthread_once(&race_once, race_read);
  int d = p->comm->device;
  int on = race_on && p->n > 0 && d >= 0 && d < MAX_DEV_TRACK;
  if (on) atomic_store(&race_owner[d], (void *)&race_marker);
  double pause = atomic_load(&launch_pause_s);
  if (pause > 0) {
    struct timespec ts = {(time_t)pause, (long)((pause - (double)(time_t)pause) * 1e9)};
    nanosleep(&ts, NULL);
  }
  return on;
}

static ncclResult_t launch_race_leave(struct plan *p) {
  if (atomic_load(&race_owner[p->comm->device]) == (void *)&race_marker) return ncclSuccess;
  warn("Fatal: host threads racing to launch NCCL on same device.");
  return ncclInvalidUsage;
}

/* groupLaunch makes each communicator's device current before launching
 * its plan (group.cc:597; the blocking group end restores the caller's device,
 * group.cc:741-745), which is where stream 0 then points. */
static ncclResult_t launch_plan(struct plan *p) {
  int old = dbl_device_current();
  cudaError_t e = old == p->comm->device ? cudaSuccess : cudaSetDevice(p->comm->device);
  if (e != cudaSuccess) return cuda_fail(e);
  int race = launch_race_enter(p);
  ncclResult_t r = launch_plan_on_device(p);
  if (race && r == ncclSuccess) r = launch_race_leave(p);
  if (old != p->comm->device) (void)cudaSetDevice(old);
  return r;
}

static ncclResult_t launch_plan_on_device(struct plan *p) {
  struct ncclComm *c = p->comm;
  int nself_send = 0, nself_recv = 0;
  for (int i = 0; i < p->n; i++) {
    if (p->tasks[i].func == F_SEND && p->tasks[i].root == c->rank) nself_send++;
    if (p->tasks[i].func == F_RECV && p->tasks[i].root == c->rank) nself_recv++;
  }
  /* enqueue.cc:1066-1076: a send to self needs its receive in the same
   * group, and the other way round. */
  if (nself_send > nself_recv) {
    warn("Trying to send to self without a matching recv");
    return ncclInvalidUsage;
  }
  if (nself_recv > nself_send) {
    warn("Trying to recv to self without a matching send");
    return ncclInvalidUsage;
  }
  if (p->n == 0) return ncclSuccess;
  /* Each stream must be one of the communicator's device: the kernel is
   * launched there (a stream of another device fails the launch). */
  cudaStream_t streams[64];
  int ns = 0;
  for (int i = 0; i < p->n; i++) {
    cudaStream_t s = p->tasks[i].stream;
    if (dbl_stream_device(s) != c->device) return cuda_fail(cudaErrorInvalidResourceHandle);
    int seen = 0;
    for (int j = 0; j < ns; j++) seen |= streams[j] == s;
    if (!seen && ns < 64) streams[ns++] = s;
  }

  struct launch *L = calloc(1, sizeof *L);
  if (!L) return ncclSystemError;
  L->n = p->n;
  L->k = calloc((size_t)p->n, sizeof *L->k);
  L->srcs = calloc((size_t)c->nranks, sizeof *L->srcs);
  L->acc = malloc(2 * c->shm->bank);
  if (!L->k || !L->srcs || !L->acc) {
    launch_free(L);
    return ncclSystemError;
  }
  pthread_mutex_lock(&c->mu);
  uint64_t colls0 = c->colls_issued;
  for (int i = 0; i < p->n; i++) {
    struct ktask *k = &L->k[i];
    k->t = p->tasks[i];
    k->prev = -1;
    if (is_coll(k->t.func)) {
      k->t.seq = ++c->colls_issued;
      if (k->t.opc == OPC_PREMUL) {
        k->scal = calloc((size_t)c->nranks, sizeof(uint64_t));
        if (!k->scal) dbl_fatal("nccl double: out of memory");
      }
    } else {
      uint64_t *ctr = k->t.func == F_SEND ? c->sends_issued : c->recvs_issued;
      k->t.seq = ++ctr[k->t.root];
      for (int j = i - 1; j >= 0; j--)
        if (L->k[j].t.func == k->t.func && L->k[j].t.root == k->t.root) {
          k->prev = j;
          break;
        }
    }
  }
  pthread_mutex_unlock(&c->mu);

  int wr = c->world_rank;
  L->world_rank = wr;
  if (wr >= 0 && wr < MAX_WORLD) {
    L->nth_last = atomic_fetch_add(&ops_issued_by[wr], (uint64_t)p->n) + (uint64_t)p->n;
    L->nth_first = L->nth_last - (uint64_t)p->n + 1;
  }
  char t0[160];
  task_text(&L->k[0].t, t0, sizeof t0);
  if (p->n == 1)
    snprintf(L->what, sizeof L->what, "%s #%" PRIu64 " [rank %d/%d of %s]", t0, L->k[0].t.seq,
             c->rank, c->nranks, c->name);
  else
    snprintf(L->what, sizeof L->what, "NCCL group of %d operations: %s #%" PRIu64 ", ... "
             "[rank %d/%d of %s]", p->n, t0, L->k[0].t.seq, c->rank, c->nranks, c->name);

  /* Several streams in one group: the first waits for the others, which
   * then wait for the kernel (enqueue.cc:1497-1502 and 1725-1729). */
  cudaError_t e = cudaSuccess;
  for (int i = 1; i < ns && e == cudaSuccess; i++) {
    cudaEvent_t ev;
    e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    if (e != cudaSuccess) break;
    e = cudaEventRecord(ev, streams[i]);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(streams[0], ev, 0);
    (void)cudaEventDestroy(ev);
  }
  if (e == cudaSuccess) {
    comm_ref(c);
    L->comm = c;
    e = dbl_stream_submit(streams[0], L->what, 1, launch_run, L);
    if (e != cudaSuccess) comm_unref(c);
  }
  if (e != cudaSuccess) {
    /* Nothing was published: give the sequence numbers back. */
    pthread_mutex_lock(&c->mu);
    c->colls_issued = colls0;
    for (int i = p->n - 1; i >= 0; i--)
      if (!is_coll(L->k[i].t.func))
        (L->k[i].t.func == F_SEND ? c->sends_issued : c->recvs_issued)[L->k[i].t.root]--;
    pthread_mutex_unlock(&c->mu);
    launch_free(L);
    return cuda_fail(e);
  }
  /* Published for the reports of the peers' watchdogs. */
  struct shm_rank *me = seg_rank(c->shm, c->rank);
  struct task last = p->tasks[p->n - 1];
  last.seq = L->k[p->n - 1].t.seq;
  desc_store(&me->issued, &last, 0);
  atomic_store(&me->colls_issued, c->colls_issued);
  atomic_fetch_add(&c->own_issued, 1);
  atomic_store(&L->ticket, atomic_fetch_add(&c->sh->tickets, 1) + 1);
  for (int i = 1; i < ns && e == cudaSuccess; i++) {
    cudaEvent_t ev;
    e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    if (e != cudaSuccess) break;
    e = cudaEventRecord(ev, streams[0]);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(streams[i], ev, 0);
    (void)cudaEventDestroy(ev);
  }
  return e == cudaSuccess ? ncclSuccess : cuda_fail(e);
}

static void run_reclaim(struct job *j);

/* ncclGroupEndInternal (group.cc:646-760). */
static ncclResult_t group_end_internal(void) {
  if (g_depth == 0) {
    warn("ncclGroupEnd: not in a group call.");
    return ncclInvalidUsage;
  }
  if (--g_depth > 0) return ncclSuccess;
  ncclResult_t ret = g_error;
  int nonblocking = g_blocking == 0;
  struct job *jobs = g_jobs;
  g_jobs = NULL;
  g_error = ncclSuccess;
  g_blocking = -1;
  if (ret != ncclSuccess) {
    /* groupCleanup: nothing is launched; non-blocking communicators take
     * the error (group.cc:380-392). */
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", tl_last_error);
    for (struct plan *p = g_plans; p; p = p->next)
      if (!p->comm->blocking) set_async(p->comm, ret, msg);
    plans_free();
    while (jobs) {
      struct job *j = jobs;
      jobs = j->next;
      set_async(j->kind == JOB_SPLIT && j->child ? j->child : j->comm, ret, msg);
      if (j->kind == JOB_SPLIT && !j->comm->blocking) set_async(j->comm, ret, msg);
      job_free(j);
    }
    return ret;
  }
  /* Finalize, abort and destroy run here, before any init or launch
   * (groupLaunch runs the async jobs first, group.cc:537): the abort flags
   * were all set at the calls, so a group of aborts frees nothing before
   * every kernel of those communicators has stopped. */
  for (struct job **pp = &jobs; *pp;) {
    struct job *j = *pp;
    if (j->kind < JOB_FINALIZE) {
      pp = &j->next;
      continue;
    }
    *pp = j->next;
    run_reclaim(j);
    job_free(j);
  }
  /* Init and split run in threads, as NCCL's async jobs. */
  for (struct job *j = jobs; j; j = j->next) {
    if (nonblocking) {
      atomic_store(&j->comm->async, ncclInProgress);
      pthread_mutex_lock(&j->comm->mu);
      /* A previous job of this communicator (its init, or an earlier
       * split of it) has published its result, which the caller saw, but
       * may not have been collected yet: job_main sets `done` just after
       * the result, so ncclCommGetAsyncError can report success first.
       * Collect it here rather than lose it (LSan found the leak). */
      struct job *old = j->comm->job;
      j->comm->job = j;
      pthread_mutex_unlock(&j->comm->mu);
      if (old) job_free(old);
    }
    if (pthread_create(&j->thread, NULL, job_main, j) != 0)
      dbl_fatal("nccl double: pthread_create for a communicator job: %s", strerror(errno));
    j->started = 1;
  }
  if (!nonblocking) {
    while (jobs) {
      struct job *j = jobs;
      jobs = j->next;
      job_join(j);
      if (ret == ncclSuccess && j->result != ncclSuccess) {
        ret = j->result;
        show_async_msg(j->kind == JOB_SPLIT && j->child ? j->child : j->comm);
        if (j->kind == JOB_SPLIT && !j->child) show_async_msg(j->comm);
      }
      job_free(j);
    }
  }
  for (struct plan *p = g_plans; p; p = p->next) {
    ncclResult_t r = launch_plan(p);
    if (r != ncclSuccess) {
      if (ret == ncclSuccess) ret = r;
      if (!p->comm->blocking) set_async(p->comm, r, tl_last_error);
    } else if (!p->comm->blocking) {
      int cur = ncclSuccess;
      if (atomic_compare_exchange_strong(&p->comm->async, &cur, ncclInProgress))
        atomic_store(&p->comm->launch_pending, 1);
    }
  }
  plans_free();
  if (nonblocking && ret == ncclSuccess) ret = ncclInProgress;
  return ret;
}

/* ------------------------------------------------------------------ */
/* Argument checks and enqueue (enqueue.cc:2620-2662)                 */
/* ------------------------------------------------------------------ */

/* CommCheck (misc/argcheck.cc:35-43).  A destroyed or aborted
 * communicator was poisoned by NCCL before being freed (init.cc:180-184,
 * 335), which CommCheck reports as corrupted. */
static ncclResult_t comm_check(struct ncclComm *c, const char *opname) {
  if (!c) {
    warn("%s : comm argument is NULL", opname);
    return ncclInvalidArgument;
  }
  if (atomic_load(&c->magic) != COMM_LIVE) {
    warn("Error: corrupted comm object detected");
    return ncclInvalidArgument;
  }
  return ncclSuccess;
}

/* ncclCommEnsureReady (init.cc:373-389). */
static ncclResult_t ensure_ready(struct ncclComm *c) {
  if (comm_aborted(c)) return ncclSuccess;
  ncclResult_t s = comm_state(c);
  if (s == ncclInProgress) {
    warn("Attempt to use communicator before the previous operation returned ncclSuccess");
    return ncclInvalidArgument;
  }
  if (s != ncclSuccess) show_async_msg(c);
  return s;
}

/* CudaPtrCheck (misc/argcheck.cc:10-26), on the double's memory registry. */
static ncclResult_t ptr_check(struct ncclComm *c, const void *p, size_t bytes, const char *name,
                              const char *opname) {
  int dev = -1;
  enum dbl_mem_kind k = dbl_mem_find(p, bytes, &dev);
  if (k == DBL_MEM_HOST || k == DBL_MEM_FREED) {
    warn("%s : %s %p is not a valid pointer", opname, name, p);
    dbl_log("nccl double: %s %p is %s", name, p, k == DBL_MEM_FREED ? "freed device memory"
                                                                     : "not device memory");
    return ncclInvalidArgument;
  }
  if (dev != c->device) {
    warn("%s : %s allocated on device %d mismatchs with NCCL device %d", opname, name, dev,
         c->device);
    return ncclInvalidArgument;
  }
  if (k == DBL_MEM_OVERRUN)
    dbl_fatal("nccl double: %s on rank %d of %s: %s %p + %zu bytes runs past the end of its "
              "device allocation (real NCCL would read or write out of bounds)",
              opname, c->rank, c->name, name, p, bytes);
  return ncclSuccess;
}

static int is_registered(struct ncclComm *c, const void *p, size_t bytes) {
  int yes = 0;
  pthread_mutex_lock(&c->mu);
  for (struct reg *r = c->regs; r && !yes; r = r->next)
    yes = (const char *)p >= r->ptr && (const char *)p + bytes <= r->ptr + r->bytes;
  pthread_mutex_unlock(&c->mu);
  return yes;
}

static int overlap(const void *a, size_t na, const void *b, size_t nb) {
  const char *x = a, *y = b;
  return na && nb && x < y + nb && y < x + na;
}

/* Enqueue one operation (ncclEnqueueCheck): comm check, readiness, the
 * checks of ArgsCheck (misc/argcheck.cc:45-83), then the task joins this
 * thread's group, launched at the outermost ncclGroupEnd. */
static ncclResult_t enqueue(const char *opname, const char *api, struct ncclComm *c,
                            struct task *t, ncclRedOp_t op) {
  check_poisoned(api);
  ncclResult_t ret = comm_check(c, opname);
  if (ret != ncclSuccess) return group_err(ret);
  if (c->revoked) { /* enqueue.cc:2624-2627 */
    warn("%s: communicator was revoked", opname);
    return group_err(ncclInvalidUsage);
  }
  g_depth++;
  ret = ensure_ready(c);
  int uop = -1;
  size_t es = dt_size(t->dtype), n = (size_t)c->nranks;
  if (ret == ncclSuccess && (t->root < 0 || t->root >= c->nranks)) {
    warn("%s : invalid root %d (root should be in the 0..%d range)", opname, t->root, c->nranks);
    ret = ncclInvalidArgument;
  }
  if (ret == ncclSuccess && (t->dtype < 0 || t->dtype >= ncclNumTypes)) {
    warn("%s : invalid type %d", opname, t->dtype);
    ret = ncclInvalidArgument;
  }
  if (ret == ncclSuccess) {
    int v = (int)op;
    t->opc = OPC_SUM;
    /* (op > ncclMaxRedOp cannot happen with a 32-bit enum; nccl.h:291-296) */
    if (v < 0) {
      warn("%s : invalid reduction operation %d", opname, v);
      ret = ncclInvalidArgument;
    } else if (v >= ncclNumOps) {
      unsigned u = (unsigned)(v - ncclNumOps);
      pthread_mutex_lock(&c->mu);
      int ix = (int)(u >> 8);
      if ((u & 255u) != c->salt || ix >= c->nuops || !c->uops[ix].live) {
        warn("%s : reduction operation %d unknown to this communicator", opname, v);
        ret = ncclInvalidArgument;
      } else {
        uop = ix;
        t->opc = OPC_PREMUL;
      }
      pthread_mutex_unlock(&c->mu);
    } else {
      t->opc = v;
    }
  }
  /* Pointers (misc/argcheck.cc:71-80), skipped for empty operations. */
  size_t sbytes = 0, rbytes = 0;
  if (ret == ncclSuccess) {
    switch (t->func) {
      case F_AR: case F_BC: case F_RED: sbytes = rbytes = t->count * es; break;
      case F_AG: sbytes = t->count * es; rbytes = n * t->count * es; break;
      case F_RS: sbytes = n * t->count * es; rbytes = t->count * es; break;
      case F_SEND: sbytes = t->count * es; break;
      case F_RECV: rbytes = t->count * es; break;
    }
    if (t->func == F_SEND || t->func == F_RECV) {
      if (t->count > 0)
        ret = ptr_check(c, t->func == F_SEND ? t->send : t->recv, t->count * es, "buff", opname);
    } else if (t->count > 0) {
      if (t->func != F_BC || c->rank == t->root)
        ret = ptr_check(c, t->send, sbytes, "sendbuff", opname);
      if (ret == ncclSuccess && (t->func != F_RED || c->rank == t->root))
        ret = ptr_check(c, t->recv, rbytes, "recvbuff", opname);
    }
  }
  /* taskAppend (enqueue.cc:2549-2576). */
  int discard = is_coll(t->func) && t->count == 0; /* enqueue.cc:2555-2556 */
  if (ret == ncclSuccess && !discard && is_reduction(t->func) &&
      (t->dtype == ncclFloat8e4m3 || t->dtype == ncclFloat8e5m2)) {
    /* enqueue.cc:2558-2561: the double's devices do not reduce fp8. */
    warn("FP8 reduction support begins with sm90 capable devices.");
    ret = ncclInvalidArgument;
  }
  if (ret == ncclSuccess && !discard && uop >= 0 && is_reduction(t->func)) {
    /* hostToDevRedOp copies the op's state now: it may be destroyed before
     * the group ends (enqueue.cc:2564-2566, 2325-2333). */
    pthread_mutex_lock(&c->mu);
    struct user_op u = c->uops[uop];
    pthread_mutex_unlock(&c->mu);
    if (u.dtype != t->dtype) {
      warn("Data type supplied to user-created ncclRedOp_t does not match type given to "
           "reduction operation");
      ret = ncclInvalidArgument;
    } else {
      t->scal_kind = u.residence + 1;
      t->scal_bits = u.bits;
      t->scal_ptr = u.ptr;
    }
  }
  if (!is_reduction(t->func)) t->opc = OPC_SUM;
  if (ret == ncclSuccess && !discard) {
    /* Partial overlaps are undefined (NCCL user guide, "In-place
     * Operations": all-gather is in place when sendbuff == recvbuff +
     * rank * sendcount, reduce-scatter when recvbuff == sendbuff + rank *
     * recvcount, the others when sendbuff == recvbuff). */
    int used_send = t->func != F_RECV && (t->func != F_BC || c->rank == t->root);
    int used_recv = t->func != F_SEND && (t->func != F_RED || c->rank == t->root);
    int inplace = t->send == t->recv;
    if (t->func == F_AG) inplace = (const char *)t->send == (char *)t->recv + (size_t)c->rank * sbytes;
    if (t->func == F_RS) inplace = (char *)t->recv == (const char *)t->send + (size_t)c->rank * rbytes;
    if (is_coll(t->func) && used_send && used_recv && !inplace &&
        overlap(t->send, sbytes, t->recv, rbytes))
      dbl_fatal("nccl double: %s on rank %d of %s: sendbuff %p (%zu bytes) and recvbuff %p (%zu "
                "bytes) overlap without being in place (NCCL user guide, \"In-place "
                "Operations\"): NCCL's result would be undefined",
                api, c->rank, c->name, t->send, sbytes, t->recv, rbytes);
    /* Registered buffers (NCCL user guide, "User Buffer Registration"). */
    t->reg = (!used_send || is_registered(c, t->send, sbytes)) &&
             (!used_recv || is_registered(c, t->recv, rbytes));
    ret = group_mode(c->blocking);
    if (ret == ncclSuccess) {
      struct plan *p = plan_for(c);
      if (!p) {
        ret = ncclSystemError;
      } else {
        if (p->n == p->cap) {
          int cap = p->cap ? 2 * p->cap : 8;
          struct task *nt = realloc(p->tasks, sizeof *nt * (size_t)cap);
          if (!nt) dbl_fatal("nccl double: out of memory");
          p->tasks = nt;
          p->cap = cap;
        }
        p->tasks[p->n++] = *t;
      }
    }
  }
  /* Non-blocking: a failed enqueue becomes the communicator's error
   * (enqueue.cc:2660-2662). */
  if (ret != ncclSuccess && !c->blocking) set_async(c, ret, tl_last_error);
  group_err(ret);
  ncclResult_t e = group_end_internal();
  if (e != ncclSuccess && e != ncclInProgress) return e;
  if (!c->blocking) ret = (ncclResult_t)atomic_load(&c->async); /* enqueue.cc:2658 */
  return ret;
}

/* ------------------------------------------------------------------ */
/* The NCCL API                                                       */
/* ------------------------------------------------------------------ */

ncclResult_t ncclGetVersion(int *version) {
  if (!version) return ncclInvalidArgument; /* init.cc:151-155 */
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

/* NCCL's texts (init.cc:2683-2696): callers match on them. */
const char *ncclGetErrorString(ncclResult_t code) {
  switch (code) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}

const char *ncclGetLastError(ncclComm_t comm) {
  (void)comm; /* unused by NCCL too (init.cc:2698-2703) */
  return tl_last_error;
}

/* An id: a marker, random bytes, the pid and a counter; with NCCL_COMM_ID
 * every caller gets the same id for the same address, as NCCL's
 * bootstrapGetUniqueId (bootstrap.cc:414-431). */
ncclResult_t ncclGetUniqueId(ncclUniqueId *out) {
  env_init();
  if (!out) {
    warn("GetUniqueId : out argument is NULL"); /* init.cc:161 */
    return ncclInvalidArgument;
  }
  memset(out, 0, sizeof *out);
  memcpy(out->internal, ID_MARK, 8);
  const char *env = getenv("NCCL_COMM_ID");
  if (env) {
    /* NCCL takes "<host>:<port>" with the port read by atoi (misc/utils.cc:149,
     * misc/socket.cc:275-290), so any host and port text goes; the double
     * resolves no host name. */
    const char *colon = strrchr(env, ':');
    if (strlen(env) < 2 || !colon || colon == env || !colon[1]) {
      warn("Invalid NCCL_COMM_ID, please use format: <ipv4>:<port> or [<ipv6>]:<port> or "
           "<hostname>:<port>");
      return ncclInvalidArgument;
    }
    out->internal[8] = 'E';
    snprintf(out->internal + 16, sizeof out->internal - 16, "%s", env);
    return ncclSuccess;
  }
  static _Atomic uint64_t counter;
  uint64_t nonce[2] = {0, 0};
  if (getrandom(nonce, sizeof nonce, 0) != (ssize_t)sizeof nonce) {
    nonce[0] = (uint64_t)dbl_now() * 1000003u ^ (uint64_t)getpid();
    nonce[1] = (uint64_t)(uintptr_t)&nonce;
  }
  uint64_t cnt = atomic_fetch_add(&counter, 1) + 1;
  int32_t pid = (int32_t)getpid();
  memcpy(out->internal + 16, nonce, sizeof nonce);
  memcpy(out->internal + 32, &pid, sizeof pid);
  memcpy(out->internal + 40, &cnt, sizeof cnt);
  return ncclSuccess;
}

/* parseCommConfig's checks that matter here (init.cc:1804-1860). */
static ncclResult_t parse_config(const ncclConfig_t *cfg, int *blocking, int *split_share) {
  if (!cfg) return ncclSuccess;
  if (cfg->magic != 0xcafebeef) {
    warn("ncclConfig_t argument not initialized via NCCL_CONFIG_INITIALIZER");
    return ncclInvalidArgument;
  }
  if (cfg->blocking != NCCL_CONFIG_UNDEF_INT && cfg->blocking != 0 && cfg->blocking != 1) {
    warn("Invalid config blocking attribute value %d", cfg->blocking);
    return ncclInvalidArgument;
  }
  if (cfg->splitShare != NCCL_CONFIG_UNDEF_INT && cfg->splitShare != 0 && cfg->splitShare != 1) {
    warn("Invalid config splitShare attribute value %d", cfg->splitShare);
    return ncclInvalidArgument;
  }
  if (cfg->blocking != NCCL_CONFIG_UNDEF_INT) *blocking = cfg->blocking;
  if (cfg->splitShare != NCCL_CONFIG_UNDEF_INT) *split_share = cfg->splitShare;
  return ncclSuccess;
}

static struct job *job_new(int kind, struct ncclComm *comm) {
  struct job *j = calloc(1, sizeof *j);
  if (!j) dbl_fatal("nccl double: out of memory");
  j->kind = kind;
  j->comm = comm;
  comm_ref(comm);
  return j;
}

static void job_queue(struct job *j) {
  struct job **pp = &g_jobs;
  while (*pp) pp = &(*pp)->next;
  *pp = j;
}

/* ncclCommInitRankConfig (init.cc:2140-2170) and ncclCommInitRankDev
 * (init.cc:1964-2040): the handle is returned at once, the bootstrap runs
 * as a job at the outermost ncclGroupEnd. */
ncclResult_t ncclCommInitRankConfig(ncclComm_t *newcomm, int nranks, ncclUniqueId commId,
                                    int myrank, ncclConfig_t *config) {
  env_init();
  check_poisoned("ncclCommInitRankConfig");
  g_depth++;
  ncclResult_t ret = ncclSuccess;
  int blocking = 1, share = 0;
  struct ncclComm *c = NULL;
  if (!newcomm) {
    warn("CommInitRank : newcomm argument is NULL");
    ret = ncclInvalidArgument;
  }
  if (ret == ncclSuccess) ret = parse_config(config, &blocking, &share);
  if (ret == ncclSuccess && (nranks < 1 || myrank < 0 || myrank >= nranks)) {
    warn("Invalid rank requested : %d/%d", myrank, nranks);
    ret = ncclInvalidArgument;
  }
  if (ret == ncclSuccess) {
    /* The world rank for fault injection: this thread's first communicator. */
    if (tl_world_rank < 0) {
      tl_world_rank = myrank;
      dbl_set_world_rank(myrank);
    }
    c = comm_new();
    if (!c) dbl_fatal("nccl double: out of memory");
    c->rank = myrank;
    c->nranks = nranks;
    c->device = dbl_device_current();
    c->blocking = blocking;
    c->split_share = share;
    c->host_hash = dbl_host_hash();
    c->busid = busid_of(c->device);
    c->sh = shared_new();
    id_to_name(&commId, c->name, sizeof c->name);
    dbl_log("nccl double: ncclCommInitRankConfig rank %d/%d on %s (CUDA device %d, %s)", myrank,
            nranks, c->name, c->device, blocking ? "blocking" : "non-blocking");
    *newcomm = c;
    ret = group_mode(blocking);
    if (ret == ncclSuccess) {
      struct job *j = job_new(JOB_INIT, c);
      if (commId.internal[8] == 'E')
        snprintf(j->env_id, sizeof j->env_id, "%s", commId.internal + 16);
      job_queue(j);
    } else {
      set_async(c, ret, tl_last_error);
    }
  } else if (newcomm) {
    *newcomm = NULL;
  }
  group_err(ret);
  ncclResult_t e = group_end_internal();
  if (e != ncclSuccess && e != ncclInProgress) return e;
  if (c && !blocking) ret = (ncclResult_t)atomic_load(&c->async);
  return ret;
}

ncclResult_t ncclCommInitRank(ncclComm_t *newcomm, int nranks, ncclUniqueId commId, int myrank) {
  return ncclCommInitRankConfig(newcomm, nranks, commId, myrank, NULL);
}

/* ncclCommInitAll (init.cc:2064-2125): one id, every device in a group. */
ncclResult_t ncclCommInitAll(ncclComm_t *comms, int ndev, const int *devlist) {
  if (!comms) {
    warn("CommInitAll : comms argument is NULL");
    return ncclInvalidArgument;
  }
  if (ndev < 0) {
    warn("Invalid device count requested : %d", ndev);
    return ncclInvalidArgument;
  }
  ncclUniqueId id;
  ncclResult_t r = ncclGetUniqueId(&id);
  if (r != ncclSuccess) return r;
  int old = dbl_device_current();
  ncclGroupStart();
  for (int i = 0; i < ndev; i++) {
    cudaError_t e = cudaSetDevice(devlist ? devlist[i] : i);
    if (e != cudaSuccess) {
      group_err(cuda_fail(e));
      break;
    }
    (void)ncclCommInitRankConfig(comms + i, ndev, id, i, NULL);
  }
  r = ncclGroupEnd();
  (void)cudaSetDevice(old);
  return r;
}

/* ncclCommSplit (init.cc:2666-2681, ncclCommInitChildComm 2546-2640).
 * Returns ncclSuccess even while the split still runs on a non-blocking
 * parent: the group end's ncclInProgress is passed over by NCCLCHECK
 * (include/checks.h:122-129); the parent reports the progress. */
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                           ncclConfig_t *config) {
  check_poisoned("ncclCommSplit");
  g_depth++;
  ncclResult_t ret = comm_check(comm, "ncclCommSplit");
  struct ncclComm *child = NULL;
  if (ret == ncclSuccess && !newcomm) {
    warn("ncclCommSplit : newcomm argument is NULL");
    ret = ncclInvalidArgument;
  }
  if (ret == ncclSuccess) ret = ensure_ready(comm);
  int blocking = ret == ncclSuccess ? comm->blocking : 1, share = 0;
  if (ret == ncclSuccess) {
    share = comm->split_share;
    if (config) ret = parse_config(config, &blocking, &share);
  }
  if (ret == ncclSuccess) {
    *newcomm = NULL;
    if (color != NCCL_SPLIT_NOCOLOR) {
      child = comm_new();
      if (!child) dbl_fatal("nccl double: out of memory");
      child->device = comm->device;
      child->blocking = blocking;
      child->split_share = share;
      child->host_hash = comm->host_hash;
      child->busid = comm->busid;
      child->world_rank = comm->world_rank;
      /* splitShare: the child shares the parent's abort flag and device
       * stream (init.cc:2580-2590). */
      if (comm->split_share) {
        child->sh = comm->sh;
        atomic_fetch_add(&comm->sh->refs, 1);
      } else {
        child->sh = shared_new();
      }
    }
    ret = group_mode(comm->blocking); /* the job is the parent's (init.cc:2626) */
    if (ret == ncclSuccess) {
      struct job *j = job_new(JOB_SPLIT, comm);
      j->child = child;
      if (child) comm_ref(child);
      j->newcomm = newcomm;
      j->color = color;
      j->key = key;
      pthread_mutex_lock(&comm->mu);
      j->split_seq = ++comm->split_count; /* init.cc:2620-2621 */
      pthread_mutex_unlock(&comm->mu);
      job_queue(j);
    } else if (child) {
      atomic_store(&child->magic, COMM_DEAD);
      comm_unref(child);
    }
  }
  group_err(ret);
  ncclResult_t e = group_end_internal();
  if (e != ncclSuccess && e != ncclInProgress) return e;
  return ret;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError) {
  ncclResult_t r = comm_check(comm, "ncclGetAsyncError");
  if (r != ncclSuccess) return r;
  if (!asyncError) {
    warn("ncclGetAsyncError : asyncError argument is NULL");
    return ncclInvalidArgument;
  }
  *asyncError = comm_state(comm);
  if (*asyncError != ncclSuccess && *asyncError != ncclInProgress) show_async_msg(comm);
  return ncclSuccess;
}

static ncclResult_t comm_attr(ncclComm_t comm, const void *out, const char *opname,
                              const char *outname) {
  ncclResult_t r = comm_check(comm, opname);
  if (r != ncclSuccess) return r;
  if (!out) {
    warn("%s : %s argument is NULL", opname, outname);
    return ncclInvalidArgument;
  }
  return ensure_ready(comm);
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int *count) {
  ncclResult_t r = comm_attr(comm, count, "CommCount", "count"); /* init.cc:2741-2752 */
  if (r == ncclSuccess) *count = comm->nranks;
  return r;
}

ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *devid) {
  ncclResult_t r = comm_attr(comm, devid, "CommCuDevice", "devid"); /* init.cc:2755-2765 */
  if (r == ncclSuccess) *devid = comm->device;
  return r;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank) {
  ncclResult_t r = comm_attr(comm, rank, "CommUserRank", "rank"); /* init.cc:2768-2778 */
  if (r == ncclSuccess) *rank = comm->rank;
  return r;
}

/* Wait until every kernel this communicator launched has finished (the
 * strong-stream synchronisation of commDestroySync, init.cc:2212-2230). */
static void wait_own_kernels(struct ncclComm *c) {
  while (atomic_load(&c->own_done) < atomic_load(&c->own_issued)) {
    uint32_t seen = atomic_load(&c->sh->wake.seq);
    if (atomic_load(&c->own_done) >= atomic_load(&c->own_issued)) break;
    ww_sleep(&c->sh->wake, seen, 20, 0);
  }
}

/* ncclCommFinalize (init.cc:2264-2300). */
ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  check_poisoned("ncclCommFinalize");
  g_depth++;
  ncclResult_t ret = ncclSuccess;
  if (comm) {
    ret = comm_check(comm, "ncclCommFinalize");
    if (ret == ncclSuccess) ret = ensure_ready(comm);
    if (ret == ncclSuccess && comm->finalize_called) {
      /* init.cc:2276-2280 refuses a second finalize without a WARN. */
      warn("meshpg double: ncclCommFinalize(%p) called twice (NCCL returns ncclInvalidArgument "
           "without a message)", (void *)comm);
      ret = ncclInvalidArgument;
    }
    if (ret == ncclSuccess) ret = group_mode(comm->blocking);
    if (ret == ncclSuccess) {
      comm->finalize_called = 1;
      if (comm->blocking) {
        job_queue(job_new(JOB_FINALIZE, comm)); /* waits at the group's end */
      } else {
        atomic_store(&comm->async, ncclInProgress);
        atomic_store(&comm->finalize_pending, 1);
      }
    } else if (atomic_load(&comm->magic) == COMM_LIVE && !comm->blocking) {
      set_async(comm, ret, tl_last_error);
    }
  }
  group_err(ret);
  ncclResult_t e = group_end_internal();
  if (e != ncclSuccess && e != ncclInProgress) return e;
  if (comm && atomic_load(&comm->magic) == COMM_LIVE && !comm->blocking)
    ret = (ncclResult_t)atomic_load(&comm->async);
  return ret;
}

/* Release the communicator after destroy or abort: wait for the job, then
 * poison the handle and drop its reference. */
static void comm_release(struct ncclComm *c) {
  pthread_mutex_lock(&c->mu);
  struct job *j = c->job;
  c->job = NULL;
  pthread_mutex_unlock(&c->mu);
  if (j) job_free(j);
  atomic_store(&c->magic, COMM_DEAD);
  comm_unref(c);
}

/* The reclaim jobs, at the outermost ncclGroupEnd: commDestroySync waits
 * for the communicator's own kernels (init.cc:2212-2230, not after an
 * abort: they stopped), then commFree frees its device memory, and
 * cudaFree waits for the whole device (init.cc:296, include/alloc.h:380-392). */
static void run_reclaim(struct job *j) {
  struct ncclComm *c = j->comm;
  switch (j->kind) {
    case JOB_FINALIZE:
      wait_own_kernels(c);
      break;
    case JOB_DESTROY:
      if (!c->finalize_called) wait_own_kernels(c);
      drain_device(c->device, "ncclCommDestroy", c);
      comm_release(c);
      break;
    case JOB_ABORT:
      drain_device(c->device, "ncclCommAbort", c);
      comm_release(c);
      break;
  }
}

/* ncclCommDestroy (init.cc:2358-2390): as a job of the group (forced
 * blocking, group.cc:52-54), run by the outermost ncclGroupEnd, which is
 * this call unless the caller opened a group. */
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (!comm) return ncclSuccess;
  check_poisoned("ncclCommDestroy");
  if (atomic_load(&comm->magic) != COMM_LIVE || comm->destroy_flag) {
    warn("comm %p has already been destroyed", (void *)comm);
    snprintf(g_poisoned, sizeof g_poisoned,
             "ncclCommDestroy(%p) of a communicator already destroyed or aborted", (void *)comm);
    return ncclInvalidArgument;
  }
  ncclResult_t r = ensure_ready(comm);
  if (r != ncclSuccess) {
    snprintf(g_poisoned, sizeof g_poisoned,
             "ncclCommDestroy(%p), which returned %s because the communicator was not ready "
             "(\"%.200s\"; abort a communicator with an error instead)",
             (void *)comm, ncclGetErrorString(r), tl_last_error);
    return r;
  }
  g_depth++;
  comm->destroy_flag = 1;
  job_queue(job_new(JOB_DESTROY, comm));
  g_blocking = 1;
  return group_end_internal();
}

/* ncclCommAbort (init.cc:2503-2540): the abort flag, which the
 * communicator's kernels poll, is set at once and the init job joined;
 * freeing everything is a job of the group, run by the outermost
 * ncclGroupEnd.  Freeing device memory waits for the whole device
 * (cudaFree's implicit synchronisation, commFree init.cc:296), so an abort
 * outside a group hangs on any other communicator's kernel still stuck on
 * the device: NVIDIA/nccl PR 564 and issues 549, 829, 1013 (the deadlock
 * report of that kernel names the waiting abort).  Aborting every
 * communicator inside one ncclGroupStart/End sets every flag first. */
ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (!comm) return ncclSuccess;
  if (atomic_load(&comm->magic) != COMM_LIVE || comm->destroy_flag) {
    /* NCCL would read freed memory, or free twice; the double answers. */
    warn("comm %p has already been destroyed", (void *)comm);
    return ncclInvalidArgument;
  }
  g_depth++;
  atomic_store(&comm->sh->abort, 1);
  wake_kernels(comm);
  comm->destroy_flag = 1;
  dbl_log("nccl double: ncclCommAbort rank %d of %s", comm->rank, comm->name);
  pthread_mutex_lock(&comm->mu);
  struct job *j = comm->job;
  comm->job = NULL;
  pthread_mutex_unlock(&comm->mu);
  if (j) job_free(j); /* ncclCommEnsureReady joins the init job (init.cc:376-377) */
  job_queue(job_new(JOB_ABORT, comm));
  g_blocking = 1;
  return group_end_internal();
}

#ifdef NCCL_REVOKE_DEFAULT /* nccl.h of 2.28.9 and later */
/* ncclCommRevoke (init.cc:2446-2500): not called by groups/nccl today,
 * but the NCCL 2.28 primitive that avoids the hang of ncclCommAbort above:
 * it sets the abort flag (every kernel of the communicator stops) and
 * frees nothing; once the communicator is quiescent its state is
 * ncclSuccess again.  Revoking every communicator of a device first, then
 * destroying them, never leaves a kernel for cudaFree to wait for. */
ncclResult_t ncclCommRevoke(ncclComm_t comm, int revokeFlags) {
  if (!comm) return ncclSuccess;
  check_poisoned("ncclCommRevoke");
  ncclResult_t r = comm_check(comm, "ncclCommRevoke");
  if (r != ncclSuccess) return r;
  /* init.cc:2452-2464: only NCCL_REVOKE_DEFAULT; not after finalize or
   * destroy; not twice (no WARN in NCCL). */
  if (revokeFlags != NCCL_REVOKE_DEFAULT || comm->finalize_called || comm->revoked ||
      comm->destroy_flag) {
    warn("meshpg double: ncclCommRevoke(%p, %d) refused: %s (NCCL returns "
         "ncclInvalidArgument without a message)", (void *)comm, revokeFlags,
         revokeFlags != NCCL_REVOKE_DEFAULT ? "flags must be NCCL_REVOKE_DEFAULT"
         : comm->revoked ? "already revoked" : "after ncclCommFinalize");
    return ncclInvalidArgument;
  }
  atomic_store(&comm->sh->abort, 1);
  wake_kernels(comm);
  comm->revoked = 1;
  comm->finalize_called = 1; /* init.cc:2469-2471 */
  (void)comm_state(comm);   /* ncclCommEnsureReady, its result ignored */
  /* The revoke job's result becomes the state, whatever it was
   * (init.cc:2439-2441). */
  pthread_mutex_lock(&comm->mu);
  comm->async_msg[0] = '\0';
  pthread_mutex_unlock(&comm->mu);
  if (comm->blocking) {
    wait_own_kernels(comm);
    atomic_store(&comm->sh->abort, 0);
    atomic_store(&comm->async, ncclSuccess);
    return ncclSuccess;
  }
  atomic_store(&comm->async, ncclInProgress);
  atomic_store(&comm->revoke_pending, 1);
  return (ncclResult_t)atomic_load(&comm->async);
}
#endif

/* ---- collectives ---- */

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream) {
  struct task t = {.func = F_AR, .send = sendbuff, .recv = recvbuff, .count = count,
                   .dtype = datatype, .stream = stream};
  return enqueue("AllReduce", "ncclAllReduce", comm, &t, op);
}

ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm,
                           cudaStream_t stream) {
  struct task t = {.func = F_BC, .send = sendbuff, .recv = recvbuff, .count = count,
                   .dtype = datatype, .root = root, .stream = stream};
  return enqueue("Broadcast", "ncclBroadcast", comm, &t, ncclSum);
}

ncclResult_t ncclBcast(void *buff, size_t count, ncclDataType_t datatype, int root,
                       ncclComm_t comm, cudaStream_t stream) {
  return ncclBroadcast(buff, buff, count, datatype, root, comm, stream);
}

ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count,
                        ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
                        cudaStream_t stream) {
  struct task t = {.func = F_RED, .send = sendbuff, .recv = recvbuff, .count = count,
                   .dtype = datatype, .root = root, .stream = stream};
  return enqueue("Reduce", "ncclReduce", comm, &t, op);
}

ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  struct task t = {.func = F_AG, .send = sendbuff, .recv = recvbuff, .count = sendcount,
                   .dtype = datatype, .stream = stream};
  return enqueue("AllGather", "ncclAllGather", comm, &t, ncclSum);
}

ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream) {
  struct task t = {.func = F_RS, .send = sendbuff, .recv = recvbuff, .count = recvcount,
                   .dtype = datatype, .stream = stream};
  return enqueue("ReduceScatter", "ncclReduceScatter", comm, &t, op);
}

ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  struct task t = {.func = F_SEND, .send = sendbuff, .count = count, .dtype = datatype,
                   .root = peer, .stream = stream};
  return enqueue("Send", "ncclSend", comm, &t, ncclSum);
}

ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  struct task t = {.func = F_RECV, .recv = recvbuff, .count = count, .dtype = datatype,
                   .root = peer, .stream = stream};
  return enqueue("Recv", "ncclRecv", comm, &t, ncclSum);
}

/* ---- groups (group.cc:93-110) ---- */

ncclResult_t ncclGroupStart(void) {
  env_init();
  check_poisoned("ncclGroupStart");
  g_depth++;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void) {
  check_poisoned("ncclGroupEnd");
  return group_end_internal();
}

/* ---- pre-multiplied sums (enqueue.cc:2664-2732) ---- */

ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t *op, void *scalar, ncclDataType_t datatype,
                                      ncclScalarResidence_t residence, ncclComm_t comm) {
  ncclResult_t r = comm_check(comm, "ncclRedOpCreatePreMulSum");
  if (r == ncclSuccess) r = ensure_ready(comm);
  if (r != ncclSuccess) return r;
  if (!op) {
    warn("ncclRedOpCreatePreMulSum : op argument is NULL");
    return ncclInvalidArgument;
  }
  size_t es = dt_size(datatype);
  if (residence == ncclScalarHostImmediate && es < 1) return ncclInternalError;
  pthread_mutex_lock(&comm->mu);
  int ix = 0;
  while (ix < comm->nuops && comm->uops[ix].live) ix++;
  if (ix == comm->nuops) {
    struct user_op *n = realloc(comm->uops, sizeof *n * (size_t)(comm->nuops + 4));
    if (!n) dbl_fatal("nccl double: out of memory");
    memset(n + comm->nuops, 0, sizeof *n * 4);
    comm->uops = n;
    comm->nuops += 4;
  }
  struct user_op *u = &comm->uops[ix];
  u->live = 1;
  u->dtype = datatype;
  u->residence = residence;
  u->bits = 0;
  u->ptr = NULL;
  if (residence == ncclScalarHostImmediate)
    memcpy(&u->bits, scalar, es);
  else
    u->ptr = scalar;
  *op = (ncclRedOp_t)(ncclNumOps + ((unsigned)ix << 8) + comm->salt);
  pthread_mutex_unlock(&comm->mu);
  return ncclSuccess;
}

ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm) {
  int v = (int)op;
  if (0 <= v && v < (int)ncclNumOps) {
    warn("ncclRedOpDestroy : operator is a NCCL builtin.");
    return ncclInvalidArgument;
  }
  if (v < 0) {
    warn("ncclRedOpDestroy :  operator is garbage.");
    return ncclInvalidArgument;
  }
  if (!comm) {
    warn("ncclRedOpDestroy : invalid communicator passed.");
    return ncclInvalidArgument;
  }
  /* ncclRedOpDestroy checks neither the handle nor the communicator's state
   * (enqueue.cc:2708-2736): it reads and writes comm->userRedOps, which
   * ncclCommAbort and ncclCommDestroy free with the communicator (commFree,
   * init.cc:264).  And after a call on a non-blocking communicator answered
   * ncclInProgress, the NCCL user guide ("Creating a communication with
   * options", non-blocking communicators) allows only ncclCommGetAsyncError
   * and ncclCommAbort until ncclCommGetAsyncError reports ncclSuccess.  The
   * double stops loudly in both cases. */
  if (atomic_load(&comm->magic) != COMM_LIVE || comm->destroy_flag)
    dbl_fatal("nccl double: ncclRedOpDestroy(%d) on rank %d of communicator %s after "
              "ncclCommAbort or ncclCommDestroy: NCCL frees the communicator's reduction "
              "operations with it (commFree, init.cc:264) and ncclRedOpDestroy checks "
              "neither the handle nor its state (enqueue.cc:2708-2736), so real NCCL would "
              "write freed memory; the abort already freed the operation",
              v, comm->rank, comm->name);
  if (!comm->blocking && atomic_load(&comm->async) == ncclInProgress)
    dbl_fatal("nccl double: ncclRedOpDestroy(%d) on rank %d of communicator %s while a "
              "call on it is still in progress (it answered ncclInProgress and "
              "ncclCommGetAsyncError has not reported ncclSuccess since): the NCCL user "
              "guide allows only ncclCommGetAsyncError and ncclCommAbort on a non-blocking "
              "communicator until then (an enqueue that timed out is aborted, and the "
              "abort frees the operation)",
              v, comm->rank, comm->name);
  unsigned u = (unsigned)(v - ncclNumOps);
  int ix = (int)(u >> 8);
  pthread_mutex_lock(&comm->mu);
  int known = (u & 255u) == comm->salt && ix < comm->nuops && comm->uops[ix].live;
  if (known) comm->uops[ix].live = 0;
  pthread_mutex_unlock(&comm->mu);
  if (!known) {
    warn("ncclRedOpDestroy : operator unknown to this communicator.");
    return ncclInvalidArgument;
  }
  return ncclSuccess;
}

/* ---- memory and registration (allocator.cc, register/register.cc) ---- */

ncclResult_t ncclMemAlloc(void **ptr, size_t size) {
  if (!ptr) return cuda_fail(cudaErrorInvalidValue); /* falls back to cudaMalloc(NULL, ...) */
  if (size == 0) {
    *ptr = NULL;
    return ncclSuccess;
  }
  cudaError_t e = dbl_mem_alloc(dbl_device_current(), size, ptr);
  return e == cudaSuccess ? ncclSuccess : cuda_fail(e);
}

ncclResult_t ncclMemFree(void *ptr) {
  if (!ptr) return ncclSuccess;
  cudaError_t e = dbl_mem_free(ptr);
  return e == cudaSuccess ? ncclSuccess : cuda_fail(e);
}

/* ncclCommRegister / ncclRegister (register/register.cc:27-64, 116-126):
 * a registration covers [buff, buff + size), counted per communicator. */
/* NCCL's user guide, "Creating a communication with options"
 * (usage/communicators.html, non-blocking communicators): once a call on a
 * non-blocking communicator returned ncclInProgress, the application polls
 * ncclCommGetAsyncError and issues no other NCCL call on it until the state
 * is ncclSuccess.  The collectives and ncclCommSplit check this
 * (ncclCommEnsureReady, init.cc:373-389); ncclCommRegister and
 * ncclCommDeregister do not (register/register.cc:117-140) and would touch
 * the communicator's registration cache while its init or split job fills
 * it in NCCL's thread.  The double stops loudly instead (meshpg issue 19,
 * R2: a second thread that reached a communicator while the first one was
 * polling it). */
static void reg_ready_check(struct ncclComm *c, const char *opname) {
  if (comm_aborted(c)) return;
  if (comm_state(c) == ncclInProgress)
    dbl_fatal("nccl double: %s on rank %d of communicator %s while a previous call on it is "
              "still in progress (ncclInProgress): NCCL's user guide forbids any other call on "
              "a non-blocking communicator until ncclCommGetAsyncError reports ncclSuccess, "
              "and registration is not checked, so real NCCL would race the communicator's job",
              opname, c->rank, c->name);
}

ncclResult_t ncclCommRegister(const ncclComm_t comm, void *buff, size_t size, void **handle) {
  ncclResult_t r = comm_check(comm, "ncclCommRegister");
  if (r != ncclSuccess) return r;
  reg_ready_check(comm, "ncclCommRegister");
  if (!handle) {
    warn("ncclCommRegister : handle argument is NULL");
    return ncclInvalidArgument;
  }
  int dev = -1;
  enum dbl_mem_kind k = dbl_mem_find(buff, 1, &dev);
  if (k != DBL_MEM_DEVICE) {
    warn("ncclCommRegister : buff %p is not a valid pointer", buff);
    return ncclInvalidArgument;
  }
  if (dev != comm->device) {
    warn("ncclCommRegister : buff allocated on device %d mismatchs with NCCL device %d", dev,
         comm->device);
    return ncclInvalidArgument;
  }
  pthread_mutex_lock(&comm->mu);
  struct reg *g = comm->regs;
  while (g && !((char *)buff >= g->ptr && (char *)buff + size <= g->ptr + g->bytes)) g = g->next;
  if (g) {
    g->refs++;
  } else {
    g = calloc(1, sizeof *g);
    if (!g) dbl_fatal("nccl double: out of memory");
    g->ptr = buff;
    g->bytes = size;
    g->refs = 1;
    g->next = comm->regs;
    comm->regs = g;
  }
  pthread_mutex_unlock(&comm->mu);
  *handle = g;
  return ncclSuccess;
}

ncclResult_t ncclCommDeregister(const ncclComm_t comm, void *handle) {
  ncclResult_t r = comm_check(comm, "ncclCommRegister"); /* NCCL's opname, register.cc:140 */
  if (r != ncclSuccess || !handle) return r;
  reg_ready_check(comm, "ncclCommDeregister");
  pthread_mutex_lock(&comm->mu);
  struct reg **pp = &comm->regs;
  while (*pp && *pp != handle) pp = &(*pp)->next;
  int found = *pp != NULL;
  if (found && --(*pp)->refs == 0) {
    struct reg *g = *pp;
    *pp = g->next;
    free(g);
  }
  pthread_mutex_unlock(&comm->mu);
  if (!found) {
    warn("Deregister: Could not find handle"); /* register.cc:148-150 */
    return ncclInvalidUsage;
  }
  return ncclSuccess;
}
