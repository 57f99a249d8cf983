/*
 * bench_util.h - what the sync benchmarks share (bench_sync_mpi,
 * bench_raw_mpi, bench_floor; bench_alltoall_mpi uses the clock and the
 * comparison): the reader of a parameter list and the timing helpers, so
 * that the programs read the same list the same way and time it with the
 * same clock.  The copy loops of the floors are in bench_copy.h.
 *
 * Header-only C11; every function is `static inline`, so a program that
 * uses only some of them compiles cleanly under -Wall -Wextra -Werror.
 * Needs POSIX (clock_gettime, getrusage): the project builds with
 * -D_GNU_SOURCE; a program built otherwise defines _POSIX_C_SOURCE
 * 200809L before its first #include.
 *
 *   pdesc, bench_load_params  a parameter list: `name elements shape`
 *                             lines, `#` starts a comment (bench/README.md)
 *   now_s                     CLOCK_MONOTONIC in seconds
 *   minor_faults              the process's minor page faults so far
 *   cmp_double, median        qsort's comparison; the median (sorts)
 */
#ifndef MESHPG_BENCH_UTIL_H
#define MESHPG_BENCH_UTIL_H

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

/* A parameter's name holds at most BENCH_NAME_LEN characters (a longer one
 * makes its line malformed); a shape at most BENCH_SHAPE_LEN.  The lengths
 * are literal numbers, since they also go into sscanf's field widths. */
#define BENCH_NAME_LEN 127
#define BENCH_NAME_CAP (BENCH_NAME_LEN + 1)
#define BENCH_SHAPE_LEN 255
#define BENCH_LINE_CAP 1024

#define BENCH_STR_(x) #x
#define BENCH_STR(x) BENCH_STR_(x)
/* name, elements, shape: " %127s %llu %255s" */
#define BENCH_PARAM_FORMAT \
  " %" BENCH_STR(BENCH_NAME_LEN) "s %llu %" BENCH_STR(BENCH_SHAPE_LEN) "s"

/* One line of a parameter list. */
typedef struct pdesc {
  char name[BENCH_NAME_CAP];
  size_t count; /* elements, > 0 */
} pdesc;

/* Read the parameter list at `path`: `name elements shape` lines, `#`
 * starts a comment, blank lines are skipped.  Every other line must hold a
 * name (at most BENCH_NAME_LEN characters) and elements > 0; the shape
 * (AxBx..., optional) must multiply to elements.  On success *out is a
 * malloc'd array of *n >= 1 entries in the list's order (the caller frees
 * it) and the return is 0.  Otherwise the return is 1, *out is NULL, *n is
 * 0, and a message "PROG: PATH:LINE: ..." (or "PROG: PATH: ...") went to
 * stderr; `prog` NULL: no message (e.g. on every MPI rank but one). */
static inline int bench_load_params(const char *prog, const char *path, pdesc **out,
                                    int *n) {
  *out = NULL;
  *n = 0;
  FILE *f = fopen(path, "r");
  if (!f) {
    if (prog) fprintf(stderr, "%s: %s: %s\n", prog, path, strerror(errno));
    return 1;
  }
  int got = 0, cap = 0, lineno = 0;
  pdesc *v = NULL;
  char line[BENCH_LINE_CAP];
  while (fgets(line, sizeof line, f)) {
    lineno++;
    char *hash = strchr(line, '#');
    if (hash) *hash = '\0';
    char name[BENCH_NAME_CAP], shape[BENCH_SHAPE_LEN + 1], first[8];
    unsigned long long count = 0, prod = 1;
    if (sscanf(line, " %7s", first) != 1) continue; /* blank / comment */
    int k = sscanf(line, BENCH_PARAM_FORMAT, name, &count, shape);
    if (k == 3) { /* the shape, "32000x256", must hold `elements` */
      char *q = shape;
      while (*q) {
        char *end;
        errno = 0;
        unsigned long long d = strtoull(q, &end, 10);
        if (errno || end == q || d == 0 || (*end && *end != 'x')) {
          prod = 0;
          break;
        }
        prod *= d;
        q = *end ? end + 1 : end;
      }
    }
    if (k < 2 || count == 0 || (k == 3 && prod != count)) {
      if (prog)
        fprintf(stderr,
                "%s: %s:%d: expected `name elements shape` with "
                "elements > 0 and a shape (AxBx...) of that many elements\n",
                prog, path, lineno);
      fclose(f);
      free(v);
      return 1;
    }
    if (got == cap) {
      cap = cap ? 2 * cap : 128;
      pdesc *w = realloc(v, (size_t)cap * sizeof *v);
      if (!w) {
        fclose(f);
        free(v);
        if (prog) fprintf(stderr, "%s: out of memory\n", prog);
        return 1;
      }
      v = w;
    }
    snprintf(v[got].name, sizeof v[got].name, "%s", name);
    v[got].count = (size_t)count;
    got++;
  }
  fclose(f);
  if (got == 0) {
    if (prog) fprintf(stderr, "%s: %s: no parameters\n", prog, path);
    free(v);
    return 1;
  }
  *out = v;
  *n = got;
  return 0;
}

/* CLOCK_MONOTONIC, in seconds. */
static inline double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Minor page faults of this process so far (RUSAGE_SELF: all its
 * threads); 0 when getrusage fails. */
static inline double minor_faults(void) {
  struct rusage ru;
  return getrusage(RUSAGE_SELF, &ru) == 0 ? (double)ru.ru_minflt : 0;
}

/* qsort's comparison of doubles, ascending. */
static inline int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Median of v[0..n), n >= 1 (sorts v). */
static inline double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

#endif /* MESHPG_BENCH_UTIL_H */
