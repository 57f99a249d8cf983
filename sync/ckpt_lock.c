/* Checkpoint save: the lock of a directory, the ranks' status board and
 * the directories a save may touch (ckpt_save_shared.h, "The save lock").
 *
 * Only names relative to a directory opened once are used (openat,
 * unlinkat, mkdirat), with O_NOFOLLOW: a symbolic link where the save
 * expects its own directory or file is refused, never followed, and a
 * directory is emptied only when every entry is a regular file of a name a
 * save writes. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ckpt_save_shared.h"

mpg_status (*mpg__ckpt_fault)(int rank, const char *where) = NULL;

static const char board_magic[8] = {'M', 'P', 'G', 'S', 'A', 'V', 'E', '\n'};

enum { B_ID = 8, B_WORLD = 16, B_VERDICT = 20, B_HOLDER = 64, B_HOLDER_LEN = 448 };

static void put_u64(unsigned char *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> 8 * i);
}

static uint64_t get_u64(const unsigned char *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
  return v;
}

static uint64_t slots_at(int world) {
  return MPG__BOARD_HEAD + (((uint64_t)world + 4095) & ~(uint64_t)4095);
}

/* --------------------------------------------------------------------- */
/* What a save writes                                                     */
/* --------------------------------------------------------------------- */

static int all_digits(const char *s, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (s[i] < '0' || s[i] > '9') return 0;
  return n > 0;
}

/* A name a save writes in its directory (older versions' markers too). */
static int our_name(const char *n) {
  size_t len = strlen(n);
  if (!strcmp(n, MPG__CKPT_META) || !strcmp(n, MPG__CKPT_META ".tmp") || !strcmp(n, ".abort"))
    return 1;
  if (len >= 14 && !strncmp(n, "data-", 5) && !strcmp(n + len - 4, ".bin"))
    return all_digits(n + 5, len - 9);
  if (len >= 11 && (!strncmp(n, ".done-", 6) || !strncmp(n, ".fail-", 6)))
    return all_digits(n + 6, len - 6);
  return 0;
}

/* 1 when the inode flags of fd forbid removing it (or what is in it). */
static int pinned(int fd) {
  int flags = 0;
  if (ioctl(fd, FS_IOC_GETFLAGS, &flags) != 0) return 0; /* no such flags here */
  return (flags & (FS_IMMUTABLE_FL | FS_APPEND_FL)) != 0;
}

mpg_status mpg__ckpt_check_ours(int fd, const char *shown) {
  if (pinned(fd))
    return mpg__fail(MPG_ERR_INVALID,
                     "%s is immutable or append-only (chattr): its files cannot be removed; "
                     "refusing to save",
                     shown);
  if (faccessat(fd, ".", W_OK | X_OK, AT_EACCESS) != 0)
    return mpg__fail(MPG_ERR_INVALID, "%s: no write permission (%s): refusing to save", shown,
                     strerror(errno));
  int dfd = dup(fd);
  DIR *d = dfd < 0 ? NULL : fdopendir(dfd);
  if (!d) {
    int err = errno;
    if (dfd >= 0) close(dfd);
    return mpg__fail(MPG_ERR_IO, "%s: opendir: %s", shown, strerror(err));
  }
  rewinddir(d);
  mpg_status st = MPG_OK;
  struct dirent *de;
  while (!st && (de = readdir(d))) {
    const char *n = de->d_name;
    if (!strcmp(n, ".") || !strcmp(n, "..")) continue;
    struct stat sb;
    if (fstatat(fd, n, &sb, AT_SYMLINK_NOFOLLOW) != 0) {
      if (errno == ENOENT) continue;
      st = mpg__fail(MPG_ERR_IO, "%s/%s: stat: %s", shown, n, strerror(errno));
      break;
    }
    const char *what = S_ISDIR(sb.st_mode)   ? "a directory"
                       : S_ISLNK(sb.st_mode) ? "a symbolic link"
                       : !S_ISREG(sb.st_mode) ? "not a regular file"
                       : !our_name(n)         ? "not a file a checkpoint save writes"
                                              : NULL;
    if (!what) {
      int f = openat(fd, n, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
      if (f >= 0) {
        if (pinned(f)) what = "immutable or append-only (chattr): it cannot be removed";
        close(f);
      }
    }
    if (what)
      st = mpg__fail(MPG_ERR_INVALID,
                     "%s/%s is %s: meshpg did not write it and does not remove it; refusing "
                     "to save (move it away)",
                     shown, n, what);
  }
  closedir(d);
  return st;
}

mpg_status mpg__ckpt_remove_ours(int dir_fd, const char *name, const char *shown) {
  int fd = openat(dir_fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return MPG_OK;
    struct stat sb;
    if (errno == ELOOP || errno == ENOTDIR)
      return mpg__fail(MPG_ERR_INVALID,
                       "%s is %s: meshpg did not make it and does not follow or remove it; "
                       "refusing to save",
                       shown,
                       errno == ELOOP || (!fstatat(dir_fd, name, &sb, AT_SYMLINK_NOFOLLOW) &&
                                          S_ISLNK(sb.st_mode))
                           ? "a symbolic link"
                           : "not a directory");
    return mpg__fail(MPG_ERR_IO, "%s: open: %s", shown, strerror(errno));
  }
  mpg_status st = mpg__ckpt_check_ours(fd, shown);
  int dfd = st ? -1 : dup(fd);
  DIR *d = dfd < 0 ? NULL : fdopendir(dfd);
  if (!st && !d) {
    st = mpg__fail(MPG_ERR_IO, "%s: opendir: %s", shown, strerror(errno));
    if (dfd >= 0) close(dfd);
  }
  if (d) rewinddir(d); /* the descriptor's offset is shared with check_ours' */
  struct dirent *de;
  while (!st && (de = readdir(d))) {
    if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
    if (unlinkat(fd, de->d_name, 0) && errno != ENOENT)
      st = mpg__fail(MPG_ERR_IO, "%s/%s: unlink: %s", shown, de->d_name, strerror(errno));
  }
  if (d) closedir(d);
  close(fd);
  if (!st && unlinkat(dir_fd, name, AT_REMOVEDIR) && errno != ENOENT)
    st = mpg__fail(MPG_ERR_IO, "%s: rmdir: %s%s", shown, strerror(errno),
                   errno == ENOTEMPTY ? " (something was added to it meanwhile)" : "");
  return st;
}

/* --------------------------------------------------------------------- */
/* The lock                                                               */
/* --------------------------------------------------------------------- */

static void holder_text(const mpg__ckpt_save *sv, char *buf, size_t cap) {
  char host[256] = "?";
  (void)gethostname(host, sizeof host - 1);
  host[sizeof host - 1] = 0;
  time_t now = time(NULL);
  struct tm tm;
  char when[64] = "";
  if (gmtime_r(&now, &tm)) strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
  snprintf(buf, cap, "pid %ld on host %s, save of step %ld started %s", (long)getpid(), host,
           sv->step, when);
}

/* Take dir.lock: open (never through a link), flock without waiting, and
 * make sure the file locked is still the one of that name (a holder that
 * finished removed it). */
static mpg_status take_lock(mpg__ckpt_save *sv, const char *name) {
  for (int tries = 0; tries < 16; tries++) {
    int fd = openat(sv->parent_fd, name, O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC,
                    0644);
    if (fd < 0) {
      if (errno == ELOOP)
        return mpg__fail(MPG_ERR_INVALID,
                         "%s is a symbolic link: meshpg did not make it and does not follow "
                         "it; refusing to save",
                         sv->lock);
      return mpg__fail(MPG_ERR_IO, "%s: create: %s", sv->lock, strerror(errno));
    }
    struct stat a, b;
    if (fstat(fd, &a) != 0 || !S_ISREG(a.st_mode)) {
      close(fd);
      return mpg__fail(MPG_ERR_INVALID, "%s is not a regular file: refusing to save", sv->lock);
    }
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
      int err = errno;
      unsigned char head[B_HOLDER + B_HOLDER_LEN];
      ssize_t n = 0;
      /* The holder writes who it is right after it locked: a moment. */
      for (int t = 0; t < 50 && err == EWOULDBLOCK; t++) {
        memset(head, 0, sizeof head);
        n = pread(fd, head, sizeof head - 1, 0);
        if (n > B_HOLDER && !memcmp(head, board_magic, 8) && head[B_HOLDER]) break;
        n = 0;
        mpg__sleep_ms(2);
      }
      close(fd);
      if (err != EWOULDBLOCK)
        return mpg__fail(MPG_ERR_IO, "%s: flock: %s", sv->lock, strerror(err));
      const char *who = n ? (const char *)head + B_HOLDER : "a save that has just started";
      return mpg__fail(MPG_ERR_STATE,
                       "another job is saving to %s (%s; it holds %s): one save at a time per "
                       "directory",
                       sv->dir, who, sv->lock);
    }
    if (fstatat(sv->parent_fd, name, &b, AT_SYMLINK_NOFOLLOW) == 0 && a.st_ino == b.st_ino &&
        a.st_dev == b.st_dev) {
      char magic[8];
      if (a.st_size > 0 && (pread(fd, magic, 8, 0) != 8 || memcmp(magic, board_magic, 8))) {
        close(fd);
        return mpg__fail(MPG_ERR_INVALID,
                         "%s exists and is not meshpg's save lock: meshpg did not write it and "
                         "does not overwrite it; refusing to save",
                         sv->lock);
      }
      /* Who holds it, for a second saver's message, before anything else. */
      unsigned char head[B_HOLDER + B_HOLDER_LEN];
      memset(head, 0, sizeof head);
      memcpy(head, board_magic, 8);
      put_u64(head + B_ID, sv->save_id);
      put_u64(head + B_WORLD, (uint64_t)sv->world);
      holder_text(sv, (char *)head + B_HOLDER, B_HOLDER_LEN);
      sv->lock_fd = fd;
      return mpg__file_pwrite_all(fd, head, sizeof head, 0, sv->lock);
    }
    close(fd); /* removed or replaced by its holder meanwhile: again */
  }
  return mpg__fail(MPG_ERR_STATE, "%s: the lock kept changing hands: another job is saving to %s",
                   sv->lock, sv->dir);
}

/* The board's layout in the locked file, its blocks allocated. */
static mpg_status make_board(mpg__ckpt_save *sv) {
  uint64_t size = slots_at(sv->world) + (uint64_t)sv->world * MPG__CKPT_MSG;
  int fd = sv->lock_fd;
  if (ftruncate(fd, 0) || ftruncate(fd, (off_t)size))
    return mpg__fail(MPG_ERR_IO, "%s: ftruncate to %llu bytes: %s", sv->lock,
                     (unsigned long long)size, strerror(errno));
  if (fallocate(fd, 0, 0, (off_t)size) && errno != EOPNOTSUPP && errno != ENOSYS)
    return mpg__fail(MPG_ERR_IO, "%s: allocating %llu bytes: %s", sv->lock,
                     (unsigned long long)size, strerror(errno));
  unsigned char *head = calloc(1, (size_t)slots_at(sv->world)); /* the states written, not holes */
  if (!head) return mpg__fail(MPG_ERR_NOMEM, "%s: out of memory", sv->lock);
  memcpy(head, board_magic, 8);
  put_u64(head + B_ID, sv->save_id);
  put_u64(head + B_WORLD, (uint64_t)sv->world);
  holder_text(sv, (char *)head + B_HOLDER, B_HOLDER_LEN);
  mpg_status st = mpg__file_pwrite_all(fd, head, (size_t)slots_at(sv->world), 0, sv->lock);
  free(head);
  if (!st && fsync(fd)) st = mpg__fail(MPG_ERR_IO, "%s: fsync: %s", sv->lock, strerror(errno));
  return st;
}

static mpg_status check_dir(mpg__ckpt_save *sv) {
  struct stat sb;
  if (fstatat(sv->parent_fd, sv->base, &sb, AT_SYMLINK_NOFOLLOW) != 0) {
    if (errno == ENOENT) return MPG_OK;
    return mpg__fail(MPG_ERR_IO, "%s: stat: %s", sv->dir, strerror(errno));
  }
  if (S_ISLNK(sb.st_mode))
    return mpg__fail(MPG_ERR_INVALID,
                     "%s is a symbolic link: meshpg does not follow it; refusing to save "
                     "(save to the directory it names)",
                     sv->dir);
  if (!S_ISDIR(sb.st_mode))
    return mpg__fail(MPG_ERR_INVALID, "%s exists and is not a directory", sv->dir);
  int fd = openat(sv->parent_fd, sv->base, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return mpg__fail(MPG_ERR_IO, "%s: open: %s", sv->dir, strerror(errno));
  struct stat mb;
  mpg_status st = MPG_OK;
  if (fstatat(fd, MPG__CKPT_META, &mb, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(mb.st_mode))
    st = mpg__fail(MPG_ERR_INVALID,
                   "%s exists and is not a checkpoint (no %s): refusing to replace it", sv->dir,
                   MPG__CKPT_META);
  if (!st) st = mpg__ckpt_check_ours(fd, sv->dir);
  close(fd);
  if (st) return mpg__fail_wrap(st, "the checkpoint %s would be replaced", sv->dir);
  sv->had_old = 1;
  return MPG_OK;
}

mpg_status mpg__ckpt_lock(mpg__ckpt_save *sv) {
  char parent[4096], name[4200];
  snprintf(parent, sizeof parent, "%s", sv->dir);
  char *slash = strrchr(parent, '/');
  const char *base = slash ? slash + 1 : parent;
  if (!*base || !strcmp(base, ".") || !strcmp(base, ".."))
    return mpg__fail(MPG_ERR_INVALID, "mpg_ckpt_save: \"%s\" names no directory of its own",
                     sv->dir);
  snprintf(sv->base, sizeof sv->base, "%s", base);
  if (!slash) snprintf(parent, sizeof parent, ".");
  else if (slash == parent) parent[1] = 0;
  else *slash = 0;
  sv->parent_fd = open(parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (sv->parent_fd < 0)
    return mpg__fail(MPG_ERR_IO, "%s (the parent of %s): open: %s", parent, sv->dir,
                     strerror(errno));
  snprintf(name, sizeof name, "%s.lock", sv->base);
  mpg_status st = take_lock(sv, name);
  if (st) return st;
  st = check_dir(sv);
  snprintf(name, sizeof name, "%s.partial", sv->base);
  if (!st) {
    st = mpg__ckpt_remove_ours(sv->parent_fd, name, sv->partial);
    if (st) st = mpg__fail_wrap(st, "removing the remains of an earlier save");
  }
  if (!st && mkdirat(sv->parent_fd, name, 0755))
    st = mpg__fail(MPG_ERR_IO, "%s: mkdir: %s", sv->partial, strerror(errno));
  if (!st) {
    sv->partial_fd = openat(sv->parent_fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    struct stat sb;
    if (sv->partial_fd < 0 || fstat(sv->partial_fd, &sb))
      st = mpg__fail(MPG_ERR_IO, "%s: open: %s", sv->partial, strerror(errno));
    else sv->partial_ino = (uint64_t)sb.st_ino;
  }
  if (!st) st = make_board(sv);
  if (!st) {
    sv->board_fd = dup(sv->lock_fd);
    if (sv->board_fd < 0) st = mpg__fail(MPG_ERR_IO, "%s: dup: %s", sv->lock, strerror(errno));
  }
  return st;
}

void mpg__ckpt_unlock(mpg__ckpt_save *sv) {
  if (sv->lock_fd >= 0) {
    char name[4200];
    snprintf(name, sizeof name, "%s.lock", sv->base);
    (void)unlinkat(sv->parent_fd, name, 0); /* while held: no one locks it after */
    close(sv->lock_fd);
    sv->lock_fd = -1;
  }
}

/* --------------------------------------------------------------------- */
/* The board                                                              */
/* --------------------------------------------------------------------- */

mpg_status mpg__ckpt_board_open(mpg__ckpt_save *sv) {
  if (sv->rank == 0) return MPG_OK; /* made them */
  sv->partial_fd = open(sv->partial, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  struct stat sb;
  if (sv->partial_fd < 0 || fstat(sv->partial_fd, &sb))
    return mpg__fail(MPG_ERR_IO, "%s: open: %s", sv->partial, strerror(errno));
  if ((uint64_t)sb.st_ino != sv->partial_ino)
    return mpg__fail(MPG_ERR_STATE,
                     "%s is not the directory world rank 0 made for this save (inode %llu, "
                     "not %llu): another job replaced it",
                     sv->partial, (unsigned long long)sb.st_ino,
                     (unsigned long long)sv->partial_ino);
  sv->board_fd = open(sv->lock, O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  unsigned char head[24];
  if (sv->board_fd < 0 || pread(sv->board_fd, head, sizeof head, 0) != (ssize_t)sizeof head)
    return mpg__fail(MPG_ERR_IO, "%s: open and read: %s", sv->lock,
                     sv->board_fd < 0 ? strerror(errno) : "short");
  if (memcmp(head, board_magic, 8) || get_u64(head + B_ID) != sv->save_id ||
      get_u64(head + B_WORLD) != (uint64_t)sv->world)
    return mpg__fail(MPG_ERR_STATE, "%s is not this save's lock: another job replaced it",
                     sv->lock);
  return MPG_OK;
}

mpg_status mpg__ckpt_board_set(mpg__ckpt_save *sv, char state, mpg_status st, const char *msg) {
  int fd = sv->board_fd;
  if (fd < 0) return mpg__fail(MPG_ERR_STATE, "%s: not open", sv->lock);
  mpg_status ws = MPG_OK;
  if (state == 'F' || state == 'A') {
    char slot[MPG__CKPT_MSG];
    memset(slot, 0, sizeof slot);
    put_u64((unsigned char *)slot, (uint64_t)st);
    snprintf(slot + 8, sizeof slot - 8, "%s", msg ? msg : "");
    ws = mpg__file_pwrite_all(fd, slot, sizeof slot,
                             slots_at(sv->world) + (uint64_t)sv->rank * MPG__CKPT_MSG, sv->lock);
  }
  /* The state even when the message could not be written. */
  uint64_t at = state == 'P' || state == 'A' ? B_VERDICT : MPG__BOARD_HEAD + (uint64_t)sv->rank;
  unsigned char c = (unsigned char)state;
  mpg_status ss = mpg__file_pwrite_all(fd, &c, 1, at, sv->lock);
  if (!ss && fsync(fd)) ss = mpg__fail(MPG_ERR_IO, "%s: fsync: %s", sv->lock, strerror(errno));
  return ss ? ss : ws;
}

/* A fresh descriptor per read: another host's writes are seen at open
 * (close-to-open on NFS), and a replaced dir.lock is noticed. */
static int board_reopen(mpg__ckpt_save *sv) {
  int fd = open(sv->lock, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    (void)mpg__fail(MPG_ERR_IO, "%s: open: %s (the save lock is gone)", sv->lock,
                    strerror(errno));
    return -1;
  }
  unsigned char head[24];
  if (pread(fd, head, sizeof head, 0) != (ssize_t)sizeof head ||
      memcmp(head, board_magic, 8) || get_u64(head + B_ID) != sv->save_id) {
    close(fd);
    (void)mpg__fail(MPG_ERR_STATE, "%s is no longer this save's lock: another job took it over",
                    sv->lock);
    return -1;
  }
  return fd;
}

mpg_status mpg__ckpt_board_read(mpg__ckpt_save *sv, unsigned char *states, char *verdict) {
  int fd = board_reopen(sv);
  if (fd < 0) return MPG_ERR_STATE;
  mpg_status st;
  if (states) {
    st = mpg__file_pread_all(fd, states, (size_t)sv->world, MPG__BOARD_HEAD, sv->lock);
  } else {
    unsigned char c = 0;
    st = mpg__file_pread_all(fd, &c, 1, B_VERDICT, sv->lock);
    *verdict = (char)c;
  }
  close(fd);
  return st;
}

mpg_status mpg__ckpt_board_slot(mpg__ckpt_save *sv, int r, char *msg, size_t cap) {
  char slot[MPG__CKPT_MSG];
  memset(slot, 0, sizeof slot);
  int fd = board_reopen(sv);
  if (fd < 0) {
    snprintf(msg, cap, "%s", mpg_last_error());
    return MPG_ERR_IO;
  }
  mpg_status rs = mpg__file_pread_all(fd, slot, sizeof slot,
                                     slots_at(sv->world) + (uint64_t)r * MPG__CKPT_MSG, sv->lock);
  close(fd);
  slot[sizeof slot - 1] = 0;
  uint64_t v = get_u64((unsigned char *)slot);
  mpg_status st = rs || v <= MPG_OK || v >= MPG_STATUS_COUNT ? MPG_ERR_IO : (mpg_status)v;
  snprintf(msg, cap, "%s", slot[8] ? slot + 8 : "its message could not be read");
  return st;
}
