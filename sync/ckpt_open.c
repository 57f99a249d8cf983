/* Reading a checkpoint directory as one snapshot (ckpt_format.h,
 * "mpg__ckpt_reader"): the directory opened once, meta.mpgc and the data
 * files opened relative to it, regular files only, the metadata's header
 * checked before its body is read.  Shared by load (ckpt_load.c) and
 * meshpg ckpt info / export (tools/cmd_ckpt.c). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt_format.h"

static mpg_status read_meta(mpg__ckpt_reader *r) {
  char path[4200];
  snprintf(path, sizeof path, "%s/%s", r->dir, MPG__CKPT_META);
  int fd;
  uint64_t size;
  mpg_status st = mpg__file_open_regular(r->dfd, MPG__CKPT_META, path, &fd, &size);
  if (st == MPG_ERR_NOT_FOUND)
    return mpg__fail(MPG_ERR_NOT_FOUND, "%s is not a checkpoint: no %s", r->dir,
                     MPG__CKPT_META);
  if (st) return st;
  unsigned char hdr[MPG__CKPT_HEADER_BYTES];
  size_t hn = size < sizeof hdr ? (size_t)size : sizeof hdr;
  st = mpg__file_pread_all(fd, hdr, hn, 0, path);
  if (!st) st = mpg__ckpt_meta_precheck(hdr, size, path);
  if (!st && size > SIZE_MAX / 2)
    st = mpg__fail(MPG_ERR_NOMEM, "%s: %llu bytes do not fit in memory", path,
                   (unsigned long long)size);
  unsigned char *buf = NULL;
  if (!st && !(buf = malloc((size_t)size)))
    st = mpg__fail(MPG_ERR_NOMEM, "%s: out of memory (%llu bytes)", path,
                   (unsigned long long)size);
  if (!st) st = mpg__file_pread_all(fd, buf, (size_t)size, 0, path);
  close(fd);
  if (!st) st = mpg__ckpt_meta_decode(buf, (size_t)size, path, &r->m);
  free(buf);
  return st;
}

mpg_status mpg__ckpt_reader_open(mpg__ckpt_reader *r, const char *dir) {
  memset(r, 0, sizeof *r);
  r->dfd = -1;
  r->dir = dir;
  if (!dir || !*dir) return mpg__fail(MPG_ERR_INVALID, "checkpoint reader: no directory");
  if (strlen(dir) > 4000)
    return mpg__fail(MPG_ERR_INVALID, "checkpoint directory name too long (%zu bytes)",
                     strlen(dir));
  r->dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (r->dfd < 0) {
    int e = errno;
    if (e == ENOENT || e == ENOTDIR)
      return mpg__fail(MPG_ERR_NOT_FOUND, "%s is not a checkpoint: no %s", dir,
                       MPG__CKPT_META);
    return mpg__fail(MPG_ERR_IO, "cannot open the checkpoint directory %s: %s", dir,
                     strerror(e));
  }
  struct stat sb;
  if (fstat(r->dfd, &sb) != 0)
    return mpg__fail(MPG_ERR_IO, "%s: fstat: %s", dir, strerror(errno));
  r->dev = (uint64_t)sb.st_dev;
  r->ino = (uint64_t)sb.st_ino;
  mpg_status st = read_meta(r);
  if (st) return st;
  if (r->m.nfiles) {
    r->fds = malloc((size_t)r->m.nfiles * sizeof *r->fds);
    if (!r->fds) return mpg__fail(MPG_ERR_NOMEM, "%s: out of memory", dir);
    for (uint32_t i = 0; i < r->m.nfiles; i++) r->fds[i] = -1;
  }
  return MPG_OK;
}

mpg_status mpg__ckpt_reader_file(mpg__ckpt_reader *r, uint32_t file, int *fd) {
  *fd = -1;
  if (file >= r->m.nfiles || !r->fds)
    return mpg__fail(MPG_ERR_INVALID, "%s: file %u is not below nfiles %u", r->dir, file,
                     r->m.nfiles);
  if (r->fds[file] < 0) {
    const mpg__ckpt_file *f = &r->m.files[file];
    char path[4200], name[32];
    snprintf(name, sizeof name, "data-%05u.bin", (unsigned)f->rank);
    mpg__ckpt_data_path(r->dir, f->rank, path, sizeof path);
    uint64_t size;
    int d;
    mpg_status st = mpg__file_open_regular(r->dfd, name, path, &d, &size);
    if (st) return st;
    if (size < f->bytes) {
      close(d);
      return mpg__fail(MPG_ERR_IO, "%s is truncated: %llu bytes, the metadata says %llu", path,
                       (unsigned long long)size, (unsigned long long)f->bytes);
    }
    r->fds[file] = d;
  }
  *fd = r->fds[file];
  return MPG_OK;
}

void mpg__ckpt_reader_open_all(mpg__ckpt_reader *r, uint32_t most) {
  if (r->m.nfiles > most || !r->fds) return;
  mpg__saved_error keep;
  mpg__error_save(&keep);
  for (uint32_t f = 0; f < r->m.nfiles; f++) {
    int fd;
    (void)mpg__ckpt_reader_file(r, f, &fd);
  }
  (void)mpg__error_restore(MPG_OK, &keep);
}

/* The save id in dir/meta.mpgc now (0 when it cannot be read). */
static uint64_t save_id_now(const char *dir) {
  char path[4200];
  snprintf(path, sizeof path, "%s/%s", dir, MPG__CKPT_META);
  int fd;
  uint64_t size, id = 0;
  mpg__saved_error keep;
  mpg__error_save(&keep);
  if (mpg__file_open_regular(AT_FDCWD, path, path, &fd, &size) == MPG_OK) {
    unsigned char h[32];
    if (size >= sizeof h && pread(fd, h, sizeof h, 0) == (ssize_t)sizeof h &&
        memcmp(h, MPG__CKPT_MAGIC, 8) == 0)
      for (int i = 31; i >= 24; i--) id = id << 8 | h[i];
    close(fd);
  }
  (void)mpg__error_restore(MPG_OK, &keep);
  return id;
}

int mpg__ckpt_reader_moved(const mpg__ckpt_reader *r) {
  if (!r->dir || r->dfd < 0) return 0;
  struct stat sb, mine;
  /* Removed (its inode number may then name the new directory). */
  if (fstat(r->dfd, &mine) != 0 || mine.st_nlink == 0) return 1;
  if (stat(r->dir, &sb) != 0) return errno == ENOENT; /* between two renames */
  if ((uint64_t)sb.st_dev != r->dev || (uint64_t)sb.st_ino != r->ino) return 1;
  /* The same directory still: another save id is another checkpoint. */
  return r->m.version && save_id_now(r->dir) != r->m.save_id;
}

void mpg__ckpt_reader_close(mpg__ckpt_reader *r) {
  if (!r) return;
  for (uint32_t i = 0; r->fds && i < r->m.nfiles; i++)
    if (r->fds[i] >= 0) close(r->fds[i]);
  free(r->fds);
  r->fds = NULL;
  mpg__ckpt_meta_free(&r->m);
  if (r->dfd >= 0) close(r->dfd);
  r->dfd = -1;
}

mpg_status mpg__ckpt_meta_read(const char *dir, mpg__ckpt_meta *m) {
  if (!m) return mpg__fail(MPG_ERR_INVALID, "mpg__ckpt_meta_read: NULL meta");
  memset(m, 0, sizeof *m);
  if (!dir) return mpg__fail(MPG_ERR_INVALID, "mpg__ckpt_meta_read: NULL directory");
  mpg__ckpt_reader r;
  mpg_status st = mpg__ckpt_reader_open(&r, dir);
  /* A save replaced dir while it was opened (its old meta.mpgc removed):
   * read the new one. */
  for (int tries = 1; st && tries < MPG__CKPT_READ_TRIES && mpg__ckpt_reader_moved(&r);
       tries++) {
    mpg__ckpt_reader_close(&r);
    st = mpg__ckpt_reader_open(&r, dir);
  }
  if (st == MPG_OK) {
    *m = r.m;
    memset(&r.m, 0, sizeof r.m);
  }
  mpg__saved_error keep;
  mpg__error_save(&keep);
  mpg__ckpt_reader_close(&r);
  return mpg__error_restore(st, &keep);
}
