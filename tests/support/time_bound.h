/* Time bounds in tests: the library's promise plus what the scheduler may
 * add, never one number widened until it passes.
 *
 * meshpg promises that a call which waits on an absent peer returns within
 * its timeout + 1 s (docs/failures.md).  That promise is about the
 * library.  A test that times the call with a wall clock also measures the
 * machine: with more runnable ranks than cores, a rank whose deadline has
 * passed waits for a core before it can see so, and a sanitizer slows every
 * instruction it runs.  Each timed assertion therefore allows
 *
 *   promise + TB_SCHED_S x (runnable ranks per online core, at least 1)
 *                        x (the sanitizer's slowdown: 1 plain, 2 ASan+UBSan,
 *                           4 TSan; MESHPG_SANITIZER, set by tests/meson.build
 *                           in the sanitizer builds and passed to mpirun's
 *                           ranks)
 *
 * TB_SCHED_S is the allowance for one rank per core in a plain build.  The
 * slowdowns are the sanitizers' documented orders of magnitude (ASan "about
 * 2x", TSan "5x-15x", of which the waits here, mostly sleeping, see the
 * low end).  Worked values on CI's 2 cores: 8 MPI ranks under ASan allow
 * 0.6 x 4 x 2 = 4.8 s beyond the promise; 4 ranks plain, 1.2 s; 8 threads
 * under TSan, 9.6 s.  On a machine with a core per rank and no sanitizer,
 * 0.6 s.
 *
 * Where a call includes work outside the promise (MPI_Init_thread inside
 * mpg_ctx_create), the test subtracts that part, as the library reports
 * it, instead of allowing more. */
#ifndef MESHPG_TESTS_TIME_BOUND_H
#define MESHPG_TESTS_TIME_BOUND_H

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define TB_SCHED_S 0.6

/* Runnable ranks per online core on this machine, at least 1. */
static inline double tb_oversubscription(int ranks) {
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  if (cores < 1) cores = 1;
  double r = (double)ranks / (double)cores;
  return r < 1.0 ? 1.0 : r;
}

/* The slowdown of the sanitizer this test runs under (1 without one). */
static inline double tb_sanitizer_factor(void) {
  const char *s = getenv("MESHPG_SANITIZER");
  if (!s || !*s || !strcmp(s, "none")) return 1.0;
  if (strstr(s, "thread")) return 4.0;
  return 2.0; /* address, undefined, or both */
}

/* The scheduler's allowance for `ranks` runnable ranks (threads or
 * processes) on this machine. */
static inline double tb_allowance(int ranks) {
  return TB_SCHED_S * tb_oversubscription(ranks) * tb_sanitizer_factor();
}

/* The bound for a call the library promises to end within `promise_s`. */
static inline double tb_bound(double promise_s, int ranks) {
  return promise_s + tb_allowance(ranks);
}

#endif
