/* Test values shared by the workers that check reductions bit for bit
 * (tests/sync/shm_mpi_worker.c, tests/cluster/): a 64-bit mixer for
 * reproducible inputs and the library's bf16 conversions (round to
 * nearest even, no NaNs in the tests' values).  Header only. */
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

#endif
