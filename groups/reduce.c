/* Element arithmetic for the CPU backends: sizes, f16/bf16 conversion, and
 * elementwise reduction, scaling and averaging. */
#include <math.h>
#include <string.h>

#include "backend.h"

const char *mpg__kind_name(mpg__coll_kind kind) {
  static const char *const names[] = {"all_reduce", "broadcast", "all_gather",
                                      "reduce_scatter", "barrier", "send", "recv"};
  return (unsigned)kind < sizeof names / sizeof names[0] ? names[kind] : "?";
}

const char *mpg__op_name(mpg_op op) {
  static const char *const names[] = {"sum", "avg", "max", "min", "premul_sum"};
  return (unsigned)op < sizeof names / sizeof names[0] ? names[op] : "?";
}

size_t mpg__dtype_size(mpg_dtype dt) {
  switch (dt) {
    case MPG_F32: case MPG_I32: return 4;
    case MPG_F64: case MPG_I64: return 8;
    case MPG_F16: case MPG_BF16: return 2;
  }
  return 0;
}

size_t mpg_dtype_size(mpg_dtype dtype) { return mpg__dtype_size(dtype); }

const char *mpg_dtype_name(mpg_dtype dtype) {
  static const char *const names[MPG_DTYPE_COUNT] = {"f32", "f64", "f16",
                                                     "bf16", "i32", "i64"};
  return (unsigned)dtype < MPG_DTYPE_COUNT ? names[dtype] : "?";
}

int mpg__dtype_is_half(mpg_dtype dt) { return dt == MPG_F16 || dt == MPG_BF16; }
int mpg__dtype_is_float(mpg_dtype dt) {
  return dt == MPG_F32 || dt == MPG_F64 || mpg__dtype_is_half(dt);
}

static uint32_t f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
static float bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

float mpg__half_to_f32(mpg_dtype dt, uint16_t h) {
  if (dt == MPG_BF16) return bits_f32((uint32_t)h << 16);
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  if (exp == 0x1f) return bits_f32(sign | 0x7f800000u | (man << 13));
  if (exp == 0) {
    /* zero or subnormal: man * 2^-24 */
    float v = (float)man * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  return bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

uint16_t mpg__f32_to_half(mpg_dtype dt, float f) {
  uint32_t u = f32_bits(f);
  if (dt == MPG_BF16) {
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    uint32_t round = 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)((u + round) >> 16);
  }
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00u;          /* NaN */
  if (a >= 0x477ff000u) return sign | 0x7c00u;         /* overflow -> inf */
  if (a < 0x38800000u) {                               /* subnormal or zero */
    float v = bits_f32(a) * 16777216.0f;               /* in units of 2^-24 */
    return sign | (uint16_t)nearbyintf(v);             /* ties to even */
  }
  uint32_t man = a & 0x7fffffu, exp = (a >> 23) - 112u;
  uint32_t h = (exp << 10) | (man >> 13);
  uint32_t rest = man & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++;
  return sign | (uint16_t)h;
}

void mpg__half_widen(mpg_dtype dt, const void *src, float *dst, size_t n) {
  const uint16_t *s = src;
  for (size_t i = 0; i < n; i++) dst[i] = mpg__half_to_f32(dt, s[i]);
}

void mpg__half_narrow(mpg_dtype dt, const float *src, void *dst, size_t n) {
  uint16_t *d = dst;
  for (size_t i = 0; i < n; i++) d[i] = mpg__f32_to_half(dt, src[i]);
}

/* ------------------------------------------------------------------ */
/* The one reduction kernel (backend.h): its element step, and the     */
/* n-source reduction in blocks built on it.                          */
/* ------------------------------------------------------------------ */

typedef float v4f __attribute__((vector_size(16)));
typedef double v2d __attribute__((vector_size(16)));

/* f32: acc = (first ? x : acc + x), x times f first when premul, then
 * divided by div when div > 0 (a power of two multiplies by its exact
 * inverse: the same quotient), 8 floats at a time through the GCC/Clang
 * vector extension (memcpy: no alignment assumed), which -O2 does not do
 * by itself for a loop of unknown length.  The product is its own
 * operation, never contracted into a fused multiply-add (c_std=c11 keeps
 * -ffp-contract=off), so the roundings are those of a scale pass, an add
 * pass and a divide pass one after the other. */
static void step_f32(float *acc, const float *x, size_t n, int first, int premul, float f,
                     int div) {
  int pow2 = div > 0 && (div & (div - 1)) == 0;
  float dv = (float)div, inv = div > 0 ? 1.0f / dv : 1.0f;
  if (first && !premul && div <= 0) {
    if (acc != x) memcpy(acc, x, n * sizeof(float));
    return;
  }
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    v4f a0, a1, b0, b1;
    memcpy(&b0, x + i, 16);
    memcpy(&b1, x + i + 4, 16);
    if (premul) {
      b0 *= f;
      b1 *= f;
    }
    if (!first) {
      memcpy(&a0, acc + i, 16);
      memcpy(&a1, acc + i + 4, 16);
      b0 = a0 + b0;
      b1 = a1 + b1;
    }
    if (pow2) {
      b0 *= inv;
      b1 *= inv;
    } else if (div > 0) {
      b0 /= dv;
      b1 /= dv;
    }
    memcpy(acc + i, &b0, 16);
    memcpy(acc + i + 4, &b1, 16);
  }
  for (; i < n; i++) {
    float v = x[i];
    if (premul) v *= f;
    v = first ? v : acc[i] + v;
    acc[i] = pow2 ? v * inv : div > 0 ? v / dv : v;
  }
}

/* The same in f64, 4 doubles at a time. */
static void step_f64(double *acc, const double *x, size_t n, int first, int premul,
                     double f, int div) {
  int pow2 = div > 0 && (div & (div - 1)) == 0;
  double dv = (double)div, inv = div > 0 ? 1.0 / dv : 1.0;
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    v2d a0, a1, b0, b1;
    memcpy(&b0, x + i, 16);
    memcpy(&b1, x + i + 2, 16);
    if (premul) {
      b0 *= f;
      b1 *= f;
    }
    if (!first) {
      memcpy(&a0, acc + i, 16);
      memcpy(&a1, acc + i + 2, 16);
      b0 = a0 + b0;
      b1 = a1 + b1;
    }
    if (pow2) {
      b0 *= inv;
      b1 *= inv;
    } else if (div > 0) {
      b0 /= dv;
      b1 /= dv;
    }
    memcpy(acc + i, &b0, 16);
    memcpy(acc + i + 2, &b1, 16);
  }
  for (; i < n; i++) {
    double v = x[i];
    if (premul) v *= f;
    v = first ? v : acc[i] + v;
    acc[i] = pow2 ? v * inv : div > 0 ? v / dv : v;
  }
}

/* Integers (no pre-multiply: refused by the generic layer), and MAX / MIN
 * of every dtype: acc = first ? x : acc (op) x, then acc /= div (integers
 * truncate toward zero, floats divide). */
#define STEP_LOOP(T)                                                          \
  do {                                                                        \
    T *a = acc;                                                               \
    const T *b = x;                                                           \
    for (size_t i = 0; i < n; i++) {                                          \
      T v = b[i];                                                             \
      if (!first) v = op == MPG_OP_MAX   ? (v > a[i] ? v : a[i])              \
                      : op == MPG_OP_MIN ? (v < a[i] ? v : a[i])              \
                                         : (T)(a[i] + v);                     \
      a[i] = div > 0 ? (T)(v / (T)div) : v;                                   \
    }                                                                         \
  } while (0)

static void step_other(mpg_dtype wdt, mpg_op op, void *acc, const void *x, size_t n,
                       int first, int div) {
  switch (wdt) {
    case MPG_F32: STEP_LOOP(float); break;
    case MPG_F64: STEP_LOOP(double); break;
    case MPG_I32: STEP_LOOP(int32_t); break;
    case MPG_I64: STEP_LOOP(int64_t); break;
    case MPG_F16:
    case MPG_BF16: break; /* never a work dtype */
  }
}

void mpg__reduce_step(mpg_dtype wdt, mpg_op op, void *acc, const void *x, size_t n,
                      int first, int premul, double scale, int div) {
  if (op == MPG_OP_MAX || op == MPG_OP_MIN || (wdt != MPG_F32 && wdt != MPG_F64))
    step_other(wdt, op, acc, x, n, first, div);
  else if (wdt == MPG_F32)
    step_f32(acc, x, n, first, premul, (float)scale, div);
  else
    step_f64(acc, x, n, first, premul, scale, div);
}

/* The work dtype of dt: f32 for f16/bf16, else dt itself. */
static mpg_dtype work_dtype(mpg_dtype dt) { return mpg__dtype_is_half(dt) ? MPG_F32 : dt; }

/* Ask for the next block of every source while this one is reduced, so
 * that the n streams overlap their memory latency (8 to 12 % faster on the
 * 2-core development machine than the same loop without it). */
static void prefetch_sources(const mpg__reduce_job *j, size_t at, size_t bytes) {
  for (int p = 0; p < j->nsrc; p++)
    for (size_t i = 0; i < bytes; i += 64) __builtin_prefetch((const char *)j->src[p] + at + i);
}

/* acc (the work dtype) = the reduction of elements [b, b + m) of the
 * sources, in source order, halves widened a block at a time into tmp;
 * div fused into the last source's step. */
static void sum_block(const mpg__reduce_job *j, size_t b, size_t m, void *acc, float *tmp,
                      int div) {
  size_t es = mpg__dtype_size(j->dtype);
  mpg_dtype wdt = work_dtype(j->dtype);
  int premul = j->op == MPG__OP_PREMUL_SUM;
  for (int p = 0; p < j->nsrc; p++) {
    const void *x = (const char *)j->src[p] + b * es;
    if (wdt != j->dtype) {
      mpg__half_widen(j->dtype, x, tmp, m);
      x = tmp;
    }
    double f = premul ? (j->scales ? j->scales[p] : j->scale) : 1.0;
    mpg__reduce_step(wdt, j->op, acc, x, m, p == 0, premul, f, p == j->nsrc - 1 ? div : 0);
  }
}

/* Write the block's result acc (the work dtype, final) to every
 * destination, rounded once to f16/bf16 through narrow. */
static void put_block(const mpg__reduce_job *j, size_t b, size_t m, const void *acc,
                      uint16_t *narrow) {
  size_t es = mpg__dtype_size(j->dtype);
  const void *out = acc;
  if (work_dtype(j->dtype) != j->dtype) {
    mpg__half_narrow(j->dtype, acc, narrow, m);
    out = narrow;
  }
  for (int k = 0; k < j->ndst; k++) memcpy((char *)j->dst[k] + b * es, out, m * es);
}

void mpg__reduce_sources(const mpg__reduce_job *j, size_t lo, size_t hi, void *scratch) {
  mpg_dtype wdt = work_dtype(j->dtype);
  size_t es = mpg__dtype_size(j->dtype), ws = mpg__dtype_size(wdt);
  int div = j->op == MPG_OP_AVG ? j->divisor : 0;
  char *blk = scratch; /* MPG__REDUCE_BLOCK work elements (8 bytes each) */
  float *tmp = (float *)(blk + MPG__REDUCE_BLOCK * sizeof(double));
  uint16_t *narrow = (uint16_t *)(blk + MPG__REDUCE_BLOCK * (sizeof(double) + sizeof(float)));
  for (size_t b = lo; b < hi; b += MPG__REDUCE_BLOCK) {
    size_t m = hi - b < MPG__REDUCE_BLOCK ? hi - b : MPG__REDUCE_BLOCK;
    /* The sums: this block's of the caller's array (partial or finish), or the scratch. */
    char *acc = j->acc ? (char *)j->acc + (b - lo) * ws : blk;
    if (j->nsrc > 0) {
      if (b + m < hi) {
        size_t next = hi - (b + m) < MPG__REDUCE_BLOCK ? hi - (b + m) : MPG__REDUCE_BLOCK;
        prefetch_sources(j, (b + m) * es, next * es);
      }
      sum_block(j, b, m, acc, tmp, j->ndst > 0 ? div : 0);
    } else if (div > 0) {
      /* Finish: the sums came from elsewhere; divide them now. */
      mpg__reduce_step(wdt, MPG_OP_SUM, acc, acc, m, 1, 0, 1.0, div);
    }
    if (j->ndst > 0) put_block(j, b, m, acc, narrow);
  }
}

void mpg__scale(mpg_dtype dt, void *buf, size_t n, double factor) {
  switch (dt) {
    case MPG_F32: {
      float *b = buf, f = (float)factor;
      for (size_t i = 0; i < n; i++) b[i] *= f;
      break;
    }
    case MPG_F64: {
      double *b = buf;
      for (size_t i = 0; i < n; i++) b[i] *= factor;
      break;
    }
    case MPG_F16:
    case MPG_BF16: {
      uint16_t *b = buf;
      for (size_t i = 0; i < n; i++)
        b[i] = mpg__f32_to_half(dt, mpg__half_to_f32(dt, b[i]) * (float)factor);
      break;
    }
    case MPG_I32: {
      int32_t *b = buf;
      for (size_t i = 0; i < n; i++) b[i] = (int32_t)((double)b[i] * factor);
      break;
    }
    case MPG_I64: {
      int64_t *b = buf;
      for (size_t i = 0; i < n; i++) b[i] = (int64_t)((double)b[i] * factor);
      break;
    }
  }
}

void mpg__divide(mpg_dtype dt, void *buf, size_t n, int divisor) {
  switch (dt) {
    case MPG_F32: {
      float *b = buf, d = (float)divisor;
      for (size_t i = 0; i < n; i++) b[i] /= d;
      break;
    }
    case MPG_F64: {
      double *b = buf, d = (double)divisor;
      for (size_t i = 0; i < n; i++) b[i] /= d;
      break;
    }
    case MPG_F16:
    case MPG_BF16: {
      uint16_t *b = buf;
      for (size_t i = 0; i < n; i++)
        b[i] = mpg__f32_to_half(dt, mpg__half_to_f32(dt, b[i]) / (float)divisor);
      break;
    }
    case MPG_I32: {
      int32_t *b = buf;
      for (size_t i = 0; i < n; i++) b[i] /= divisor;
      break;
    }
    case MPG_I64: {
      int64_t *b = buf;
      for (size_t i = 0; i < n; i++) b[i] /= divisor;
      break;
    }
  }
}

mpg_status mpg__local_host(const mpg__coll *coll) {
  size_t bytes = coll->count * mpg__dtype_size(coll->dtype);
  switch (coll->kind) {
    case MPG__BARRIER:
    case MPG__BROADCAST:
      return MPG_OK;
    case MPG__ALL_REDUCE:
    case MPG__ALL_GATHER:
    case MPG__REDUCE_SCATTER:
      if (coll->recv != coll->send) memmove(coll->recv, coll->send, bytes);
      if (coll->kind != MPG__ALL_GATHER && coll->op == MPG__OP_PREMUL_SUM)
        mpg__scale(coll->dtype, coll->recv, coll->count, coll->scale);
      return MPG_OK;
    case MPG__SEND:
    case MPG__RECV:
      break;
  }
  return mpg__fail(MPG_ERR_INVALID, "point-to-point in a group of one rank has no peer");
}
