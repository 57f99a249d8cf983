/* Linked into the Criterion test programs of the TSan build only
 * (tests/meson.build).  Criterion's process runner (BoxFort) maps its
 * shared arena with MAP_FIXED at a random 16 MiB slot of
 * 0x200000000000..0x600000000000 (BoxFort src/arena.c: base + (rand_r() &
 * 0x3fffff) << 24, 10 tries, msync() to skip used pages).  Under TSan
 * almost all of that range is TSan's shadow or a protected gap, so
 * Criterion aborts with "Could not initialize inheritable arena" (Criterion
 * issue #274).  meshpg's tests do not call rand_r(); this definition, which
 * takes precedence over libc's for libcriterion.so, makes the slots fall
 * in TSan's application range 0x550000000000..0x568000000000, where a free
 * one is found at once. */
#include <stdint.h>

int rand_r(unsigned int *seed);

int rand_r(unsigned int *seed) {
  /* A 16 MiB slot between 0x560000000000 and 0x568000000000: slot
   * (0x560000000000 - 0x200000000000) >> 24 = 0x360000, 0x8000 of them. */
  *seed = *seed * 1103515245u + 12345u;
  return (int)(0x360000u + ((*seed >> 8) & 0x7fffu));
}
