/* The reduction of one member's shard of a shared-memory operation (see
 * shm_internal.h): read the shard from every member's region in position
 * order, sum (f32 for f16/bf16; each addend pre-multiplied first for
 * MPG_OP_PREMUL_SUM; the average divided at the end), round once, and
 * write the result back, in blocks small enough that the n sources and
 * the result stay in the core's cache between the reads and the writes:
 * each element of the shard is read once from each region and written
 * once to each destination, the memory floor.  The arithmetic is the
 * thread backend's (groups/thread/coll.c, reduce_all), operation for
 * operation, so the results are equal bit for bit. */
#include <stdlib.h>
#include <string.h>

#include "shm_internal.h"

#define BLOCK 2048 /* elements: 8 KiB of f32 per source */

typedef float v4f __attribute__((vector_size(16)));
typedef double v2d __attribute__((vector_size(16)));

void *mpg__shm_scratch(void) {
  /* acc (f32/f64), tmp (f32), narrowed halves. */
  return aligned_alloc(64, BLOCK * (sizeof(double) + sizeof(float) + sizeof(uint16_t)));
}

/* acc = x (* f) for p == 0, else acc += x (* f); then, with div > 0 (the
 * last addend of an average), acc /= div in the same loop: the same two
 * roundings as a divide pass after the sum, one pass fewer (a power of two
 * multiplies by its exact inverse, the same quotient).  The product is its
 * own statement, so that no compiler contracts it into a fused
 * multiply-add (the thread backend scales in one pass and adds in
 * another). */
static void step_f32(float *acc, const float *x, size_t n, int first, int premul, float f,
                     int div) {
  int pow2 = div > 0 && (div & (div - 1)) == 0;
  float dv = (float)div, inv = div > 0 ? 1.0f / dv : 1.0f;
  if (first && !premul && div == 0) {
    memcpy(acc, x, n * sizeof(float));
    return;
  }
  if (!first && !premul) {
    mpg__add_f32(acc, x, n, div); /* the common case */
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

static void step_f64(double *acc, const double *x, size_t n, int first, int premul, double f) {
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
    memcpy(acc + i, &b0, 16);
    memcpy(acc + i + 2, &b1, 16);
  }
  for (; i < n; i++) {
    double v = x[i];
    if (premul) v *= f;
    acc[i] = first ? v : acc[i] + v;
  }
}

/* acc /= d (a power of two: times its exact inverse, the same quotient). */
static void avg_f32(float *acc, size_t n, int d) {
  float fd = (float)d, inv = 1.0f / fd;
  if ((d & (d - 1)) == 0) {
    for (size_t i = 0; i < n; i++) acc[i] *= inv;
  } else {
    for (size_t i = 0; i < n; i++) acc[i] /= fd;
  }
}

static void avg_f64(double *acc, size_t n, int d) {
  double fd = (double)d, inv = 1.0 / fd;
  if ((d & (d - 1)) == 0) {
    for (size_t i = 0; i < n; i++) acc[i] *= inv;
  } else {
    for (size_t i = 0; i < n; i++) acc[i] /= fd;
  }
}

/* This member's part [*lo, *hi) of an operation's count elements: an
 * all-reduce splits them into n parts on 64-byte boundaries, so that no
 * two owners write one cache line; a reduce-scatter's part is its slice. */
static void shard(const mpg__shm *s, const shm_desc *d, size_t es, size_t *lo, size_t *hi) {
  if (d->scatter) {
    *lo = (size_t)s->pos * d->count;
    *hi = *lo + d->count;
    return;
  }
  size_t align = SHM_LINE / es, c = d->count, n = (size_t)s->n, p = (size_t)s->pos;
  *lo = c * p / n / align * align;
  *hi = p + 1 == n ? c : c * (p + 1) / n / align * align;
}

/* acc (f64 for f64, else f32) = the pre-multiplied sum of elements
 * [at, at + m) (byte offset at) of the node's regions, in position order;
 * with fuse, an average's divide too (f32). */
static void sum_block(const mpg__shm *s, const shm_desc *d, size_t at, size_t m, void *acc,
                      float *tmp, int fuse) {
  mpg_dtype dt = (mpg_dtype)d->dtype;
  int premul = d->op == MPG_OP_PREMUL_SUM;
  if (dt == MPG_F64) {
    for (int p = 0; p < s->n; p++)
      step_f64(acc, (const double *)(s->region[p] + at), m, p == 0, premul, d->scale);
    return;
  }
  for (int p = 0; p < s->n; p++) {
    const float *x = (const float *)(s->region[p] + at);
    if (mpg__dtype_is_half(dt)) {
      mpg__half_widen(dt, s->region[p] + at, tmp, m);
      x = tmp;
    }
    step_f32(acc, x, m, p == 0, premul, (float)d->scale, fuse && p == s->n - 1 ? s->total : 0);
  }
}

/* The group's sum in acc: divide for an average (by every member of the
 * group), round f16/bf16 once, and write the result to the destinations:
 * every local region for an all-reduce, this member's for a
 * reduce-scatter. */
static void finish_block(const mpg__shm *s, const shm_desc *d, size_t at, size_t m, void *acc,
                         uint16_t *narrow, int fused) {
  mpg_dtype dt = (mpg_dtype)d->dtype;
  size_t es = mpg__dtype_size(dt);
  const void *out = acc;
  if (dt == MPG_F64) {
    if (d->op == MPG_OP_AVG) avg_f64(acc, m, s->total);
  } else {
    if (d->op == MPG_OP_AVG && !fused) avg_f32(acc, m, s->total);
    if (mpg__dtype_is_half(dt)) {
      mpg__half_narrow(dt, acc, narrow, m);
      out = narrow;
    }
  }
  int first = d->scatter ? s->pos : 0, last = d->scatter ? s->pos : s->n - 1;
  for (int p = first; p <= last; p++) memcpy(s->region[p] + at, out, m * es);
}

static size_t acc_size(const shm_desc *d) {
  return d->dtype == MPG_F64 ? sizeof(double) : sizeof(float);
}

/* Ask for the next block of every region while this one is summed, so
 * that the n streams overlap their memory latency (8 to 12 % faster on the
 * 2-core development machine than the same loop without it). */
static void prefetch_block(const mpg__shm *s, size_t at, size_t bytes) {
  for (int p = 0; p < s->n; p++)
    for (size_t i = 0; i < bytes; i += SHM_LINE) __builtin_prefetch(s->region[p] + at + i);
}

void mpg__shm_reduce(mpg__shm *s, const shm_desc *d) {
  size_t es = mpg__dtype_size((mpg_dtype)d->dtype), lo, hi;
  shard(s, d, es, &lo, &hi);
  char *scr = s->scratch;
  float *tmp = (float *)(scr + BLOCK * sizeof(double));
  uint16_t *narrow = (uint16_t *)(scr + BLOCK * (sizeof(double) + sizeof(float)));
  for (size_t b = lo; b < hi; b += BLOCK) {
    size_t m = hi - b < BLOCK ? hi - b : BLOCK, at = (d->offset + b) * es;
    if (b + m < hi) {
      size_t next = hi - (b + m) < BLOCK ? hi - (b + m) : BLOCK;
      prefetch_block(s, at + m * es, next * es);
    }
    int fuse = d->dtype != MPG_F64 && d->op == MPG_OP_AVG;
    sum_block(s, d, at, m, scr, tmp, fuse);
    finish_block(s, d, at, m, scr, narrow, fuse);
  }
}

size_t mpg__shm_partial(mpg__shm *s, const shm_desc *d) {
  size_t es = mpg__dtype_size((mpg_dtype)d->dtype), lo, hi, as = acc_size(d);
  shard(s, d, es, &lo, &hi);
  float *tmp = (float *)((char *)s->scratch + BLOCK * sizeof(double));
  for (size_t b = lo; b < hi; b += BLOCK) {
    size_t m = hi - b < BLOCK ? hi - b : BLOCK;
    sum_block(s, d, (d->offset + b) * es, m, (char *)s->stage + (b - lo) * as, tmp, 0);
  }
  return hi - lo;
}

void mpg__shm_finish(mpg__shm *s, const shm_desc *d) {
  size_t es = mpg__dtype_size((mpg_dtype)d->dtype), lo, hi, as = acc_size(d);
  shard(s, d, es, &lo, &hi);
  uint16_t *narrow = (uint16_t *)((char *)s->scratch + BLOCK * (sizeof(double) + sizeof(float)));
  for (size_t b = lo; b < hi; b += BLOCK) {
    size_t m = hi - b < BLOCK ? hi - b : BLOCK;
    finish_block(s, d, (d->offset + b) * es, m, (char *)s->stage + (b - lo) * as, narrow, 0);
  }
}

size_t mpg__shm_max_shard(const mpg__shm *s, size_t elems) {
  return elems / (size_t)s->n + 2 * SHM_LINE;
}
