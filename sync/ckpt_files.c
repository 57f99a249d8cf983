/* File helpers of the checkpoints (ckpt_internal.h): whole reads and
 * writes with errors that name the file, a nap and a clock.  What a save
 * does to directories is ckpt_lock.c (relative to a directory it opened,
 * never through a link). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ckpt_internal.h"

mpg_status mpg__ckpt_write_all(int fd, const void *buf, size_t n, uint64_t off,
                               const char *path) {
  const char *p = buf;
  while (n) {
    size_t step = n < ((size_t)1 << 30) ? n : ((size_t)1 << 30);
    ssize_t w = pwrite(fd, p, step, (off_t)off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0)
      return mpg__fail(MPG_ERR_IO, "%s: writing %zu bytes at offset %llu: %s", path, step,
                       (unsigned long long)off, w < 0 ? strerror(errno) : "wrote nothing");
    p += w;
    n -= (size_t)w;
    off += (uint64_t)w;
  }
  return MPG_OK;
}

mpg_status mpg__ckpt_read_all(int fd, void *buf, size_t n, uint64_t off, const char *path) {
  char *p = buf;
  uint64_t start = off;
  size_t want = n;
  while (n) {
    ssize_t r = pread(fd, p, n, (off_t)off);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0)
      return mpg__fail(MPG_ERR_IO, "%s: reading %zu bytes at offset %llu: %s", path, n,
                       (unsigned long long)off, strerror(errno));
    if (r == 0)
      return mpg__fail(MPG_ERR_IO,
                       "%s: truncated: %zu bytes needed at offset %llu, the file ends at %llu",
                       path, want, (unsigned long long)start, (unsigned long long)off);
    p += r;
    n -= (size_t)r;
    off += (uint64_t)r;
  }
  return MPG_OK;
}

void mpg__ckpt_sleep_ms(double ms) {
  struct timespec ts = {(time_t)(ms / 1000), (long)((ms - 1000.0 * (time_t)(ms / 1000)) * 1e6)};
  while (nanosleep(&ts, &ts) && errno == EINTR) {
  }
}

double mpg__ckpt_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
