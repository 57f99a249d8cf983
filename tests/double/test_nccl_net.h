/* What the tests of the double's socket transport (test_nccl_double_net.c
 * and test_nccl_double_net_mpg.c, two programs) share. */
#ifndef MESHPG_TESTS_TEST_NCCL_NET_H
#define MESHPG_TESTS_TEST_NCCL_NET_H

#include <criterion/criterion.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The whole file at path (a rank's output), NUL not appended; its length in *len. */
static inline char *slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  cr_assert_not_null(f, "%s: %s", path, strerror(errno));
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *b = malloc((size_t)n + 1);
  cr_assert_eq(fread(b, 1, (size_t)n, f), (size_t)n);
  fclose(f);
  *len = (size_t)n;
  return b;
}

/* Rank r's outputs on one host and on two hosts, dir/ONE-r.bin and
 * dir/TWO-r.bin, read and removed: their lengths are equal (checked), the
 * length comes back in *len, and the result is the offset of the first
 * byte where they differ (*len where none does). */
static inline size_t compare_outputs(const char *dir, const char *one, const char *two, int r,
                                     size_t *len) {
  char a[700], b[700];
  snprintf(a, sizeof a, "%s/%s-%d.bin", dir, one, r);
  snprintf(b, sizeof b, "%s/%s-%d.bin", dir, two, r);
  size_t la, lb;
  char *x = slurp(a, &la), *y = slurp(b, &lb);
  cr_assert_eq(la, lb, "rank %d: %zu bytes on one host, %zu on two", r, la, lb);
  size_t at = 0;
  while (at < la && x[at] == y[at]) at++;
  free(x);
  free(y);
  unlink(a);
  unlink(b);
  *len = la;
  return at;
}

#endif
