/*
 * bench_copy.h - the copy loops a memory floor is timed with (issue 34),
 * shared by bench_floor (the sync's floor, np threads) and
 * bench_alltoall_mpi (the all-to-all's floor, np ranks), so that both
 * floors are "the fastest this machine does the copy", found the same way.
 *
 * Header-only C11 (GNU C's __attribute__ and __asm__ where the compiler
 * has them); every function is `static inline`.
 *
 *   bench_copy_loop          one candidate: a name and a copy function
 *   bench_copy_loops         the candidates this build has, in order:
 *     memcpy   glibc's memcpy (for large copies it may use non-temporal
 *              stores itself: that is glibc's choice, not always the best)
 *     vector   a plain loop over 16-byte vectors, unrolled 4 times (the
 *              compiler's vector code; its four stores a step keep it
 *              from being turned back into a memcpy call)
 *     movsb    `rep movsb` (x86-64 only: fast with ERMS/FSRM)
 *     stream   SSE2 loads and non-temporal stores, _mm_stream_si128, then
 *              an sfence (x86-64 only)
 *   bench_copy_select        parse a --loops list ("memcpy,stream", or
 *                            "all") into a mask of the candidates
 *   bench_copy_names         the names of a mask, comma-separated
 *
 * A benchmark times every selected loop on the same buffers, takes each
 * loop's best, and the fastest loop's best is the floor.
 */
#ifndef MESHPG_BENCH_COPY_H
#define MESHPG_BENCH_COPY_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

typedef void (*bench_copy_fn)(void *dst, const void *src, size_t n);

typedef struct bench_copy_loop {
  const char *name;
  bench_copy_fn copy;
} bench_copy_loop;

static inline void bench_copy_memcpy(void *dst, const void *src, size_t n) {
  memcpy(dst, src, n);
}

#if defined(__GNUC__) || defined(__clang__)
typedef uint64_t bench_v16 __attribute__((vector_size(16), may_alias, aligned(1)));
#endif

/* The compiler's own vector loop: 4 x 16 bytes a step, the tail by memcpy. */
static inline void bench_copy_vector(void *dst, const void *src, size_t n) {
  unsigned char *d = dst;
  const unsigned char *s = src;
  size_t i = 0;
#if defined(__GNUC__) || defined(__clang__)
  for (; i + 64 <= n; i += 64) {
    const bench_v16 *sv = (const bench_v16 *)(const void *)(s + i);
    bench_v16 *dv = (bench_v16 *)(void *)(d + i);
    bench_v16 a = sv[0], b = sv[1], c = sv[2], e = sv[3];
    dv[0] = a;
    dv[1] = b;
    dv[2] = c;
    dv[3] = e;
  }
#else
  for (; i + 16 <= n; i += 16) {
    uint64_t a[2];
    memcpy(a, s + i, sizeof a);
    memcpy(d + i, a, sizeof a);
  }
#endif
  if (i < n) memcpy(d + i, s + i, n - i);
}

#if defined(__x86_64__)
/* `rep movsb`: the microcoded string copy (fast strings, ERMS/FSRM). */
static inline void bench_copy_movsb(void *dst, const void *src, size_t n) {
  __asm__ volatile("rep movsb" : "+D"(dst), "+S"(src), "+c"(n) : : "memory");
}

/* Non-temporal stores: SSE2 unaligned loads, 16-byte streaming stores to
 * an aligned destination (the head up to 16 bytes and the tail by
 * memcpy), 64 bytes a step, then sfence. */
static inline void bench_copy_stream(void *dst, const void *src, size_t n) {
  unsigned char *d = dst;
  const unsigned char *s = src;
  size_t head = (16 - ((uintptr_t)d & 15)) & 15;
  if (head > n) head = n;
  if (head) memcpy(d, s, head);
  size_t i = head;
  for (; i + 64 <= n; i += 64) {
    __m128i a = _mm_loadu_si128((const __m128i *)(const void *)(s + i));
    __m128i b = _mm_loadu_si128((const __m128i *)(const void *)(s + i + 16));
    __m128i c = _mm_loadu_si128((const __m128i *)(const void *)(s + i + 32));
    __m128i e = _mm_loadu_si128((const __m128i *)(const void *)(s + i + 48));
    _mm_stream_si128((__m128i *)(void *)(d + i), a);
    _mm_stream_si128((__m128i *)(void *)(d + i + 16), b);
    _mm_stream_si128((__m128i *)(void *)(d + i + 32), c);
    _mm_stream_si128((__m128i *)(void *)(d + i + 48), e);
  }
  _mm_sfence();
  if (i < n) memcpy(d + i, s + i, n - i);
}
#endif

/* The candidates of this build, in order; *count gets their number (at
 * most 8, so a mask fits an unsigned). */
static inline const bench_copy_loop *bench_copy_loops(int *count) {
  static const bench_copy_loop loops[] = {
      {"memcpy", bench_copy_memcpy},
      {"vector", bench_copy_vector},
#if defined(__x86_64__)
      {"movsb", bench_copy_movsb},
      {"stream", bench_copy_stream},
#endif
  };
  *count = (int)(sizeof loops / sizeof loops[0]);
  return loops;
}

/* A --loops list: names of bench_copy_loops, comma-separated, or "all".
 * Returns the mask (bit i: candidate i), or 0 with a message "PROG: ..."
 * on stderr when a name is unknown or the list is empty. */
static inline unsigned bench_copy_select(const char *prog, const char *list) {
  int n;
  const bench_copy_loop *l = bench_copy_loops(&n);
  if (!strcmp(list, "all")) return (1u << n) - 1;
  unsigned mask = 0;
  const char *p = list;
  while (*p) {
    size_t len = strcspn(p, ",");
    int found = -1;
    for (int i = 0; i < n; i++)
      if (strlen(l[i].name) == len && !strncmp(l[i].name, p, len)) found = i;
    if (found < 0) {
      fprintf(stderr, "%s: --loops: unknown copy loop '%.*s' (this build has:", prog, (int)len,
              p);
      for (int i = 0; i < n; i++) fprintf(stderr, " %s", l[i].name);
      fprintf(stderr, ", or all)\n");
      return 0;
    }
    mask |= 1u << found;
    p += len;
    if (*p == ',') p++;
  }
  if (!mask) fprintf(stderr, "%s: --loops: no copy loop named\n", prog);
  return mask;
}

/* The names of the loops in `mask`, comma-separated, into buf. */
static inline const char *bench_copy_names(unsigned mask, char *buf, size_t cap) {
  int n;
  const bench_copy_loop *l = bench_copy_loops(&n);
  size_t at = 0;
  buf[0] = '\0';
  for (int i = 0; i < n; i++)
    if (mask & (1u << i)) {
      int k = snprintf(buf + at, cap - at, "%s%s", at ? "," : "", l[i].name);
      if (k < 0 || (size_t)k >= cap - at) break;
      at += (size_t)k;
    }
  return buf;
}

#endif /* MESHPG_BENCH_COPY_H */
