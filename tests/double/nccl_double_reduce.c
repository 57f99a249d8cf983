/* The NCCL half of the test double (nccl_double.c): small helpers (errors,
 * environment), data types and the reductions' arithmetic, futex wake
 * words. */

#include "nccl_double_internal.h"

/* ------------------------------------------------------------------ */
/* Small helpers: errors, environment                                 */
/* ------------------------------------------------------------------ */

/* ncclGetLastError's text, per thread (see the header comment). */
_Thread_local char tl_last_error[1024];

/* The environment, read once by the first NCCL call of the process, as
 * NCCL caches its parameters (NCCL_PARAM).  meshpg never writes the
 * environment (tests/layout/check_layout.py checks it). */
static pthread_once_t env_once = PTHREAD_ONCE_INIT;
static int env_debug;     /* NCCL_DEBUG: 1 WARN, 2 INFO/TRACE */
static double env_hang_s; /* MESHPG_DOUBLE_HANG_S */
void faults_parse(void);

static void env_read(void) {
  const char *v = getenv("NCCL_DEBUG");
  if (v && !strcasecmp(v, "WARN")) env_debug = 1;
  if (v && (!strcasecmp(v, "INFO") || !strcasecmp(v, "TRACE"))) env_debug = 2;
  v = getenv("MESHPG_DOUBLE_HANG_S");
  env_hang_s = v && v[0] ? strtod(v, NULL) : 20.0;
  if (!(env_hang_s > 0)) env_hang_s = 20.0;
  faults_parse();
}

void env_init(void) { pthread_once(&env_once, env_read); }

static int debug_level(void) {
  env_init();
  return env_debug;
}

/* NCCL's WARN: record the text as the last error (debug.cc:281-289) and
 * print it when NCCL_DEBUG asks for warnings. */
void warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void warn(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(tl_last_error, sizeof tl_last_error, fmt, ap);
  va_end(ap);
  if (debug_level() >= 1)
    fprintf(stderr, "\nmeshpg double (pid %d): NCCL WARN %s\n", (int)getpid(), tl_last_error);
}

double hang_seconds(void) {
  env_init();
  return env_hang_s;
}

void sleep_us(long us) {
  struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

uint64_t fnv1a(uint64_t h, const void *p, size_t n) {
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++) {
    h ^= b[i];
    h *= 1099511628211ULL;
  }
  return h;
}

/* ------------------------------------------------------------------ */
/* Data types and reduction operations                                */
/* ------------------------------------------------------------------ */

size_t dt_size(int dt) {
  switch (dt) {
    case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
  }
  return 0;
}

/* NCCL's names (collectives.cc:41-56). */
const char *dt_name(int dt) {
  static const char *const n[] = {"ncclInt8", "ncclUint8", "ncclInt32", "ncclUint32",
                                  "ncclInt64", "ncclUint64", "ncclFloat16", "ncclFloat32",
                                  "ncclFloat64", "ncclBfloat16", "ncclFloat8e4m3",
                                  "ncclFloat8e5m2"};
  return dt >= 0 && dt < ncclNumTypes ? n[dt] : "Unknown";
}

const char *op_name(int opc) {
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
void reduce_elems(int dt, int opc, int n, const char *const *src, void *dst, size_t len,
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

void ww_bump(struct wakeword *w, int shared) {
  atomic_fetch_add(&w->seq, 1);
  if (atomic_load(&w->waiters))
    syscall(SYS_futex, (uint32_t *)&w->seq, shared ? FUTEX_WAKE : FUTEX_WAKE_PRIVATE, INT_MAX,
            NULL, NULL, 0);
}

/* Sleep while w->seq == seen, at most ms milliseconds. */
void ww_sleep(struct wakeword *w, uint32_t seen, int ms, int shared) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  atomic_fetch_add(&w->waiters, 1);
  if (atomic_load(&w->seq) == seen)
    syscall(SYS_futex, (uint32_t *)&w->seq, shared ? FUTEX_WAIT : FUTEX_WAIT_PRIVATE, seen, &ts,
            NULL, 0);
  atomic_fetch_sub(&w->waiters, 1);
}
