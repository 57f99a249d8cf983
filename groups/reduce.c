/* Element arithmetic for the CPU backends: sizes, f16/bf16 conversion, and
 * elementwise reduction, scaling and averaging. */
#include <math.h>
#include <string.h>
#include <time.h>

#include "backend.h"

double mpg__now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

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

#define REDUCE_LOOP(T)                                              \
  do {                                                              \
    T *a = acc;                                                     \
    const T *b = x;                                                 \
    if (op == MPG_OP_MAX)                                           \
      for (size_t i = 0; i < n; i++) a[i] = b[i] > a[i] ? b[i] : a[i]; \
    else if (op == MPG_OP_MIN)                                      \
      for (size_t i = 0; i < n; i++) a[i] = b[i] < a[i] ? b[i] : a[i]; \
    else                                                            \
      for (size_t i = 0; i < n; i++) a[i] += b[i];                  \
  } while (0)

void mpg__reduce_into(mpg_dtype dt, mpg_op op, void *acc, const void *x,
                      size_t n) {
  switch (dt) {
    case MPG_F32: REDUCE_LOOP(float); break;
    case MPG_F64: REDUCE_LOOP(double); break;
    case MPG_I32: REDUCE_LOOP(int32_t); break;
    case MPG_I64: REDUCE_LOOP(int64_t); break;
    case MPG_F16:
    case MPG_BF16: {
      /* Unusual path (callers widen first): reduce through f32. */
      uint16_t *a = acc;
      const uint16_t *b = x;
      for (size_t i = 0; i < n; i++) {
        float fa = mpg__half_to_f32(dt, a[i]), fb = mpg__half_to_f32(dt, b[i]);
        float r = op == MPG_OP_MAX ? (fb > fa ? fb : fa)
                : op == MPG_OP_MIN ? (fb < fa ? fb : fa) : fa + fb;
        a[i] = mpg__f32_to_half(dt, r);
      }
      break;
    }
  }
}

/* acc[i] += x[i], divided by div when div > 0 (a power of two multiplies
 * by its exact inverse), 8 floats at a time through the GCC/Clang vector
 * extension (memcpy: no alignment assumed), which -O2 does not do by
 * itself for a loop of unknown length. */
typedef float mpg__v4f __attribute__((vector_size(16)));
void mpg__add_f32(float *acc, const float *x, size_t n, int div) {
  int pow2 = div > 0 && (div & (div - 1)) == 0;
  float d = (float)div, inv = div > 0 ? 1.0f / d : 1.0f;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    mpg__v4f a0, a1, b0, b1;
    memcpy(&a0, acc + i, 16);
    memcpy(&a1, acc + i + 4, 16);
    memcpy(&b0, x + i, 16);
    memcpy(&b1, x + i + 4, 16);
    a0 += b0;
    a1 += b1;
    if (pow2) {
      a0 *= inv;
      a1 *= inv;
    } else if (div > 0) {
      a0 /= d;
      a1 /= d;
    }
    memcpy(acc + i, &a0, 16);
    memcpy(acc + i + 4, &a1, 16);
  }
  for (; i < n; i++) {
    float v = acc[i] + x[i];
    acc[i] = pow2 ? v * inv : div > 0 ? v / d : v;
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
      if (coll->kind != MPG__ALL_GATHER && coll->op == MPG_OP_PREMUL_SUM)
        mpg__scale(coll->dtype, coll->recv, coll->count, coll->scale);
      return MPG_OK;
    case MPG__SEND:
    case MPG__RECV:
      break;
  }
  return mpg__fail(MPG_ERR_INVALID, "point-to-point in a group of one rank has no peer");
}
