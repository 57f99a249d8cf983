/* File helpers of the checkpoints (ckpt_internal.h): whole reads and
 * writes with errors that name the file, fsync of directories, removal of
 * a checkpoint's directory. */
#include <dirent.h>
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

mpg_status mpg__ckpt_fsync_dir(const char *dir) {
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return mpg__fail(MPG_ERR_IO, "%s: open: %s", dir, strerror(errno));
  int r = fsync(fd), err = errno;
  close(fd);
  /* Some file systems refuse fsync on a directory; nothing to make durable. */
  if (r && err != EINVAL && err != EROFS)
    return mpg__fail(MPG_ERR_IO, "%s: fsync: %s", dir, strerror(err));
  return MPG_OK;
}

mpg_status mpg__ckpt_remove_tree(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) {
    if (errno == ENOENT) return MPG_OK;
    return mpg__fail(MPG_ERR_IO, "%s: opendir: %s", dir, strerror(errno));
  }
  struct dirent *de;
  char path[4096];
  mpg_status st = MPG_OK;
  while ((de = readdir(d))) {
    if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
    snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
    if (unlink(path) && errno != ENOENT && !st)
      st = mpg__fail(MPG_ERR_IO, "%s: unlink: %s", path, strerror(errno));
  }
  closedir(d);
  if (!st && rmdir(dir) && errno != ENOENT)
    st = mpg__fail(MPG_ERR_IO, "%s: rmdir: %s", dir, strerror(errno));
  return st;
}

int mpg__ckpt_is_checkpoint(const char *dir) {
  char path[4096];
  struct stat sb;
  snprintf(path, sizeof path, "%s/%s", dir, MPG__CKPT_META);
  return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

mpg_status mpg__ckpt_write_file(const char *path, const void *buf, size_t n) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return mpg__fail(MPG_ERR_IO, "%s: create: %s", path, strerror(errno));
  mpg_status st = mpg__ckpt_write_all(fd, buf, n, 0, path);
  if (!st && fsync(fd)) st = mpg__fail(MPG_ERR_IO, "%s: fsync: %s", path, strerror(errno));
  if (close(fd) && !st) st = mpg__fail(MPG_ERR_IO, "%s: close: %s", path, strerror(errno));
  return st;
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
