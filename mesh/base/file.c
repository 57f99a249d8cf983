/* Safe files (internal.h, "Files"): the rules for the files the library
 * and its CLI read from or write into directories others may share (a
 * checkpoint, the flight recorder's dumps, meshpg ckpt export), in one
 * place.
 *  - Reading: opened relative to a directory handle, O_NOFOLLOW (a
 *    symbolic link is refused, never followed), O_NONBLOCK (a FIFO does
 *    not block the open), then fstat: regular files only, a FIFO, a
 *    directory or a device refused naming the path; its size is known
 *    before a byte is read, for the caller's bound (a checkpoint's
 *    meta.mpgc: the bound its header's counts give, sync/ckpt_open.c).
 *  - Replacing: the data goes to a temporary file beside the target,
 *    created with O_CREAT | O_EXCL | O_NOFOLLOW (a file or a symbolic link
 *    planted at that name is never opened), fsync'ed, renamed over the
 *    target (rename replaces the name itself, a symbolic link there
 *    included, never what it points to), and the directory fsync'ed.  On
 *    every failure the temporary file is removed.  O_TMPFILE + linkat is
 *    not used: linkat cannot replace an existing name, so a replacement
 *    needs a named temporary file and a rename anyway.
 * Every message names the path and the system's error text.
 * The one reader that keeps its own open and whole read is meshpg
 * trace's (tools/trace_read.c, tr_read_file): the trace tools are also
 * linked into programs of the shared library, and these functions report
 * through mpg__fail, whose object would give such a program a second
 * thread's last error and a second mpg_last_error hiding the library's. */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

/* ------------------------------------------------------------------ */
/* Reading                                                              */
/* ------------------------------------------------------------------ */

static const char *kind_of(mode_t mode) {
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "not a plain file";
}

mpg_status mpg__file_open_regular(int dfd, const char *name, const char *shown, int *fd,
                                  uint64_t *size) {
  *fd = -1;
  int d = openat(dfd, name, O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_NOCTTY | O_CLOEXEC);
  if (d < 0) {
    int e = errno;
    if (e == ENOENT)
      return mpg__fail(MPG_ERR_NOT_FOUND, "cannot open %s: %s", shown, strerror(e));
    if (e == ELOOP)
      return mpg__fail(MPG_ERR_IO, "%s is a symbolic link (not followed): only regular files "
                       "are read", shown);
    return mpg__fail(MPG_ERR_IO, "cannot open %s: %s", shown, strerror(e));
  }
  struct stat sb;
  if (fstat(d, &sb) != 0) {
    int e = errno;
    close(d);
    return mpg__fail(MPG_ERR_IO, "cannot read %s: fstat: %s", shown, strerror(e));
  }
  if (!S_ISREG(sb.st_mode)) {
    close(d);
    return mpg__fail(MPG_ERR_IO, "cannot read %s: not a regular file (%s)", shown,
                     kind_of(sb.st_mode));
  }
  int fl = fcntl(d, F_GETFL);
  if (fl < 0 || fcntl(d, F_SETFL, fl & ~O_NONBLOCK) < 0) {
    int e = errno;
    close(d);
    return mpg__fail(MPG_ERR_IO, "cannot read %s: fcntl: %s", shown, strerror(e));
  }
  *fd = d;
  if (size) *size = (uint64_t)sb.st_size;
  return MPG_OK;
}

mpg_status mpg__file_pread_all(int fd, void *buf, size_t n, uint64_t off, const char *shown) {
  char *p = buf;
  uint64_t start = off;
  size_t want = n;
  while (n) {
    ssize_t r = pread(fd, p, n, (off_t)off);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0)
      return mpg__fail(MPG_ERR_IO, "%s: reading %zu bytes at offset %llu: %s", shown, n,
                       (unsigned long long)off, strerror(errno));
    if (r == 0)
      return mpg__fail(MPG_ERR_IO,
                       "%s: truncated: %zu bytes needed at offset %llu, the file ends at %llu",
                       shown, want, (unsigned long long)start, (unsigned long long)off);
    p += r;
    n -= (size_t)r;
    off += (uint64_t)r;
  }
  return MPG_OK;
}

/* ------------------------------------------------------------------ */
/* Writing                                                              */
/* ------------------------------------------------------------------ */

mpg_status mpg__file_pwrite_all(int fd, const void *buf, size_t n, uint64_t off,
                                const char *shown) {
  const char *p = buf;
  while (n) {
    size_t step = n < ((size_t)1 << 30) ? n : ((size_t)1 << 30);
    ssize_t w = pwrite(fd, p, step, (off_t)off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0)
      return mpg__fail(MPG_ERR_IO, "%s: writing %zu bytes at offset %llu: %s", shown, step,
                       (unsigned long long)off, w < 0 ? strerror(errno) : "wrote nothing");
    p += w;
    n -= (size_t)w;
    off += (uint64_t)w;
  }
  return MPG_OK;
}

/* The part of `shown` before its last '/' ("." when there is none) into
 * buf, and `base` after it: how a message names the directory and the
 * temporary file. */
static void shown_dir(const char *shown, char *buf, size_t cap) {
  const char *slash = strrchr(shown, '/');
  if (!slash)
    snprintf(buf, cap, ".");
  else
    snprintf(buf, cap, "%.*s", slash == shown ? 1 : (int)(slash - shown), shown);
}

static void shown_tmp(const mpg__file_out *o, char *buf, size_t cap) {
  const char *slash = strrchr(o->shown, '/');
  snprintf(buf, cap, "%.*s%s", slash ? (int)(slash - o->shown + 1) : 0, o->shown, o->tmp);
}

static void release(mpg__file_out *o, int remove_tmp) {
  if (o->fd >= 0) close(o->fd);
  o->fd = -1;
  if (remove_tmp && o->tmp[0]) (void)unlinkat(o->dirfd, o->tmp, 0);
  if (o->dirfd >= 0 && o->own_dir) close(o->dirfd);
  o->dirfd = -1;
}

/* The temporary file o->tmp in o->dirfd: `fixed`, or .NAME.PID.N.XXXXXXXX
 * of a name no other writer uses, a fresh one per try.  The fd, or -1
 * with errno. */
static int create_tmp(mpg__file_out *o, const char *fixed, unsigned mode) {
  if (fixed) {
    if (snprintf(o->tmp, sizeof o->tmp, "%s", fixed) >= (int)sizeof o->tmp) {
      errno = ENAMETOOLONG;
      return -1;
    }
    return openat(o->dirfd, o->tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                  (mode_t)mode);
  }
  static _Atomic unsigned long counter;
  for (int tries = 0; tries < 64; tries++) {
    unsigned long n = atomic_fetch_add(&counter, 1);
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    /* Not a secret: O_EXCL is what makes the name ours; the varying part
     * only makes a collision (a planted file, a racing writer) unlikely. */
    uint64_t mix = mpg__hash_mix(mpg__hash_mix((uint64_t)ts.tv_sec, (uint64_t)ts.tv_nsec),
                                 (uint64_t)tries ^ (uint64_t)(uintptr_t)o);
    if (snprintf(o->tmp, sizeof o->tmp, ".%s.%ld.%lu.%08lx", o->name, (long)getpid(), n,
                 (unsigned long)(mix & 0xffffffffu)) >= (int)sizeof o->tmp) {
      errno = ENAMETOOLONG;
      return -1;
    }
    int fd = openat(o->dirfd, o->tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                    (mode_t)mode);
    if (fd >= 0 || errno != EEXIST) return fd;
  }
  errno = EEXIST;
  return -1;
}

mpg_status mpg__file_out_open(mpg__file_out *o, int dfd, const char *path, const char *shown,
                              const char *tmp_name, unsigned mode) {
  memset(o, 0, sizeof *o);
  o->fd = o->dirfd = -1;
  o->shown = shown ? shown : path;
  char dshown[4200];
  shown_dir(o->shown, dshown, sizeof dshown);
  const char *slash = strrchr(path, '/');
  const char *base = slash ? slash + 1 : path;
  if (!*base || strlen(base) >= sizeof o->name)
    return mpg__fail(MPG_ERR_INVALID, "cannot write %s: not a file name", o->shown);
  memcpy(o->name, base, strlen(base) + 1);
  if (slash || dfd == AT_FDCWD) {
    char dir[4200];
    if (!slash)
      snprintf(dir, sizeof dir, ".");
    else if (snprintf(dir, sizeof dir, "%.*s", slash == path ? 1 : (int)(slash - path), path) >=
             (int)sizeof dir)
      return mpg__fail(MPG_ERR_INVALID, "cannot write %s: the path is too long", o->shown);
    o->dirfd = openat(dfd, dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (o->dirfd < 0)
      return mpg__fail(MPG_ERR_IO, "cannot open the directory %s: %s", dshown, strerror(errno));
    o->own_dir = 1;
  } else {
    o->dirfd = dfd;
  }
  o->fd = create_tmp(o, tmp_name, mode);
  if (o->fd < 0) {
    int e = errno;
    o->tmp[0] = '\0'; /* not ours: never removed */
    release(o, 0);
    return mpg__fail(MPG_ERR_IO, "cannot create a temporary file in %s: %s", dshown,
                     strerror(e));
  }
  return MPG_OK;
}

mpg_status mpg__file_out_commit(mpg__file_out *o) {
  char tshown[4400];
  shown_tmp(o, tshown, sizeof tshown);
  int e = fsync(o->fd) ? errno : 0;
  if (close(o->fd) && !e) e = errno;
  o->fd = -1;
  if (e) {
    release(o, 1);
    return mpg__fail(MPG_ERR_IO, "cannot write %s: %s", tshown, strerror(e));
  }
  if (renameat(o->dirfd, o->tmp, o->dirfd, o->name)) {
    e = errno;
    release(o, 1);
    return mpg__fail(MPG_ERR_IO, "cannot rename %s to %s: %s", tshown, o->shown, strerror(e));
  }
  o->tmp[0] = '\0'; /* renamed: the name is the target's now */
  /* A file system that cannot sync a directory says EINVAL (or EROFS). */
  mpg_status st = MPG_OK;
  if (fsync(o->dirfd) && errno != EINVAL && errno != EROFS) {
    char dshown[4200];
    shown_dir(o->shown, dshown, sizeof dshown);
    st = mpg__fail(MPG_ERR_IO, "%s is in place but the fsync of its directory %s failed: %s",
                   o->shown, dshown, strerror(errno));
  }
  release(o, 0);
  return st;
}

void mpg__file_out_abandon(mpg__file_out *o) { release(o, 1); }

mpg_status mpg__file_write_whole(int dfd, const char *path, const char *shown,
                                 const char *tmp_name, const void *buf, size_t len,
                                 unsigned mode) {
  mpg__file_out o;
  mpg_status st = mpg__file_out_open(&o, dfd, path, shown, tmp_name, mode);
  if (st) return st;
  char tshown[4400];
  shown_tmp(&o, tshown, sizeof tshown);
  st = mpg__file_pwrite_all(o.fd, buf, len, 0, tshown);
  if (st) {
    mpg__file_out_abandon(&o);
    return st;
  }
  return mpg__file_out_commit(&o);
}
