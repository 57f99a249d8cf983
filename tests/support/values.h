/* Test values shared by the workers that check reductions bit for bit
 * (tests/sync/shm_mpi_worker.c, tests/cluster/): a 64-bit mixer for
 * reproducible inputs, the library's bf16 conversions (round to nearest
 * even, no NaNs in the tests' values) and the gradients drawn from them.
 * Header only. */
#ifndef MPG_TESTS_SUPPORT_VALUES_H
#define MPG_TESTS_SUPPORT_VALUES_H

#include <stdint.h>
#include <string.h>

/* splitmix64's finaliser. */
static inline uint64_t tv_mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

static inline float tv_bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* Round to nearest, ties to even (the library's rule). */
static inline uint16_t tv_f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

/* Rank r's gradient element i of param p at step s, drawn under `seed`
 * (each worker its own): a non-integer in [-3, 3) with a full f32
 * mantissa. */
static inline float tv_grad(uint64_t seed, int r, int p, int s, size_t i) {
  uint64_t h = tv_mix64(tv_mix64(tv_mix64(seed + (uint64_t)r) ^
                                 ((uint64_t)p << 32 | (uint64_t)s)) ^
                        (uint64_t)i);
  return (float)(((double)(h >> 11) * 0x1p-53 - 0.5) * 6.0);
}

/* The same as the rank writes it: bf16 (rounded from it) or f32. */
static inline float tv_grad_in(uint64_t seed, int bf16, int r, int p, int s, size_t i) {
  float x = tv_grad(seed, r, p, s, i);
  return bf16 ? tv_bf16_to_f32(tv_f32_to_bf16(x)) : x;
}

#endif
