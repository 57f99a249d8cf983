/* The base module's string buffer and safe files (mesh/base/strbuf.c,
 * mesh/base/file.c; internal.h): growth, the bound and the sticky error
 * of mpg__strbuf; a whole-file replacement that is atomic and leaves no
 * temporary file behind when it fails; opens for reading of regular files
 * only (O_NOFOLLOW, S_ISREG) that give the size before a read, and whole
 * positioned reads and writes. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"

/* ---- the string buffer ---- */

Test(base_strbuf, grows_and_formats) {
  mpg__strbuf b = MPG__STRBUF_INIT;
  cr_expect_null(b.s);
  for (int i = 0; i < 10000; i++) mpg__strbuf_add(&b, "%d,", i % 10);
  cr_assert_eq(b.st, MPG_OK);
  cr_expect_eq(b.len, 20000);
  cr_expect_gt(b.cap, b.len);
  cr_expect_eq(strlen(b.s), 20000, "the text stays NUL-terminated");
  cr_expect_eq(strncmp(b.s, "0,1,2,3,", 8), 0, "%.8s", b.s);
  mpg__strbuf_add(&b, "|%s|%5.2f|%x", "x", 3.14159, 255u);
  char *s = mpg__strbuf_take(&b);
  cr_assert_not_null(s);
  cr_expect_str_eq(s + 20000, "|x| 3.14|ff");
  cr_expect_null(b.s, "take empties the buffer");
  cr_expect_eq(b.len, 0);
  free(s);
}

Test(base_strbuf, empty_take_is_an_empty_string) {
  mpg__strbuf b = MPG__STRBUF_INIT;
  char *s = mpg__strbuf_take(&b);
  cr_assert_not_null(s);
  cr_expect_str_eq(s, "");
  free(s);
  mpg__strbuf_add(&b, "%s", ""); /* an empty append still makes a string */
  cr_assert_not_null(b.s);
  cr_expect_str_eq(b.s, "");
  mpg__strbuf_free(&b);
  cr_expect_null(b.s);
  mpg__strbuf_free(&b); /* twice: harmless */
}

Test(base_strbuf, bound_is_sticky) {
  mpg__strbuf b = MPG__STRBUF_INIT;
  b.max = 10;
  mpg__strbuf_add(&b, "%s", "0123456789"); /* exactly the bound */
  cr_assert_eq(b.st, MPG_OK);
  cr_expect_eq(b.len, 10);
  mpg__strbuf_add(&b, "x"); /* one over */
  cr_expect_eq(b.st, MPG_ERR_RANGE);
  cr_expect_str_eq(b.s, "0123456789", "the text before the refused append stays");
  mpg__strbuf_add(&b, "%s", ""); /* sticky: nothing appends any more */
  cr_expect_eq(b.st, MPG_ERR_RANGE);
  cr_expect_eq(b.len, 10);
  cr_expect_null(mpg__strbuf_take(&b), "a failed buffer gives no text");
  cr_expect_null(b.s);

  mpg__strbuf big = MPG__STRBUF_INIT;
  big.max = 1000;
  mpg__strbuf_add(&big, "%5000d", 1); /* one append over the bound */
  cr_expect_eq(big.st, MPG_ERR_RANGE);
  cr_expect_lt(big.cap, 5000, "nothing allocated for what was refused");
  mpg__strbuf_free(&big);
}

/* ---- files ---- */

static char dir[256];

static void fresh_dir(void) {
  const char *tmp = getenv("TMPDIR");
  snprintf(dir, sizeof dir, "%s/mpg-base-io.XXXXXX", tmp && *tmp ? tmp : "/tmp");
  cr_assert_not_null(mkdtemp(dir), "%s", strerror(errno));
}

/* Remove dir and what is in it (one level; subdirectories emptied). */
static void rm_tree(const char *d) {
  DIR *h = opendir(d);
  if (!h) return;
  struct dirent *e;
  while ((e = readdir(h))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    char p[600];
    snprintf(p, sizeof p, "%s/%s", d, e->d_name);
    struct stat sb;
    if (!lstat(p, &sb) && S_ISDIR(sb.st_mode)) {
      chmod(p, 0700);
      rm_tree(p);
    } else {
      unlink(p);
    }
  }
  closedir(h);
  rmdir(d);
}

static void cleanup(void) {
  chmod(dir, 0700);
  rm_tree(dir);
}

/* The names in d other than . and .., counted; the first into first. */
static int entries(const char *d, char *first, size_t cap) {
  DIR *h = opendir(d);
  cr_assert_not_null(h, "%s: %s", d, strerror(errno));
  int n = 0;
  struct dirent *e;
  if (first) first[0] = '\0';
  while ((e = readdir(h))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    if (n++ == 0 && first) snprintf(first, cap, "%s", e->d_name);
  }
  closedir(h);
  return n;
}

/* A fixture file (written whole: write_whole_replaces_atomically checks
 * the writer itself). */
static void put(const char *path, const char *text) {
  cr_assert_eq(mpg__file_write_whole(AT_FDCWD, path, path, NULL, text, strlen(text), 0600),
               MPG_OK, "%s", mpg_last_error());
}

/* Read through the base module: a regular file of exactly `text`. */
static void expect_text_at(int dfd, const char *path, const char *text) {
  int fd;
  uint64_t size;
  cr_assert_eq(mpg__file_open_regular(dfd, path, path, &fd, &size), MPG_OK, "%s",
               mpg_last_error());
  char buf[64] = "";
  cr_expect_eq(size, strlen(text), "%s", path);
  cr_assert_lt(size, sizeof buf);
  cr_expect_eq(mpg__file_pread_all(fd, buf, (size_t)size, 0, path), MPG_OK, "%s",
               mpg_last_error());
  cr_expect_str_eq(buf, text);
  close(fd);
}

static void expect_text(const char *path, const char *text) {
  expect_text_at(AT_FDCWD, path, text);
}

Test(base_file, write_whole_replaces_atomically, .fini = cleanup) {
  fresh_dir();
  char path[400];
  snprintf(path, sizeof path, "%s/out.txt", dir);
  cr_assert_eq(mpg__file_write_whole(AT_FDCWD, path, path, NULL, "first\n", 6, 0644), MPG_OK,
               "%s", mpg_last_error());
  expect_text(path, "first\n");
  struct stat a, b;
  cr_assert_eq(stat(path, &a), 0);
  cr_assert_eq(mpg__file_write_whole(AT_FDCWD, path, path, NULL, "second\n", 7, 0644), MPG_OK,
               "%s", mpg_last_error());
  expect_text(path, "second\n");
  cr_assert_eq(stat(path, &b), 0);
  cr_expect_neq(a.st_ino, b.st_ino, "replaced by a rename, not rewritten in place");
  char first[256];
  cr_expect_eq(entries(dir, first, sizeof first), 1, "a temporary file is left: %s", first);
  cr_expect_str_eq(first, "out.txt");

  /* Relative to a directory handle, with the caller's fixed temporary
   * name; an empty file. */
  int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  cr_assert_geq(dfd, 0);
  cr_assert_eq(mpg__file_write_whole(dfd, "meta", "shown/meta", "meta.tmp", "", 0, 0600),
               MPG_OK, "%s", mpg_last_error());
  cr_expect_eq(entries(dir, NULL, 0), 2);
  expect_text_at(dfd, "meta", ""); /* an empty file: size 0 */
  /* The fixed temporary name taken already: refused (O_EXCL), and the
   * file there is not the writer's to remove. */
  int fd = openat(dfd, "meta.tmp", O_WRONLY | O_CREAT | O_EXCL, 0600);
  cr_assert_geq(fd, 0);
  close(fd);
  cr_expect_eq(mpg__file_write_whole(dfd, "meta", "shown/meta", "meta.tmp", "x", 1, 0600),
               MPG_ERR_IO);
  cr_expect(strstr(mpg_last_error(), "cannot create a temporary file in shown: File exists"),
            "%s", mpg_last_error());
  cr_expect_eq(faccessat(dfd, "meta.tmp", F_OK, 0), 0, "a foreign file was removed");
  close(dfd);
}

Test(base_file, failed_write_leaves_no_temp_file, .fini = cleanup) {
  fresh_dir();
  /* A directory where the file should go: the rename fails, the
   * temporary file is removed. */
  char path[400];
  snprintf(path, sizeof path, "%s/target", dir);
  cr_assert_eq(mkdir(path, 0700), 0);
  char inner[450];
  snprintf(inner, sizeof inner, "%s/keep", path);
  put(inner, "x"); /* not empty: rename(2) cannot replace it */
  cr_expect_eq(mpg__file_write_whole(AT_FDCWD, path, path, NULL, "data", 4, 0644), MPG_ERR_IO);
  cr_expect(strstr(mpg_last_error(), "cannot rename ") && strstr(mpg_last_error(), path),
            "%s", mpg_last_error());
  char first[256];
  cr_expect_eq(entries(dir, first, sizeof first), 1, "left: %s", first);

  /* A read-only directory: no temporary file can be made (as root the
   * mode does not hold; then the write succeeds and is checked). */
  char ro[400], file[450];
  snprintf(ro, sizeof ro, "%s/ro", dir);
  cr_assert_eq(mkdir(ro, 0500), 0);
  snprintf(file, sizeof file, "%s/f", ro);
  mpg_status st = mpg__file_write_whole(AT_FDCWD, file, file, NULL, "data", 4, 0644);
  if (geteuid() != 0) {
    cr_expect_eq(st, MPG_ERR_IO);
    cr_expect(strstr(mpg_last_error(), "cannot create a temporary file in ") &&
                  strstr(mpg_last_error(), ro) && strstr(mpg_last_error(), "Permission denied"),
              "%s", mpg_last_error());
    cr_expect_eq(entries(ro, NULL, 0), 0);
  } else {
    cr_expect_eq(st, MPG_OK, "%s", mpg_last_error());
    cr_expect_eq(entries(ro, NULL, 0), 1);
  }

  /* A missing directory: named in the message. */
  snprintf(file, sizeof file, "%s/none/f", dir);
  cr_expect_eq(mpg__file_write_whole(AT_FDCWD, file, file, NULL, "d", 1, 0644), MPG_ERR_IO);
  cr_expect(strstr(mpg_last_error(), "none: No such file or directory"), "%s", mpg_last_error());

  /* An abandoned writer removes its file. */
  snprintf(file, sizeof file, "%s/abandoned", dir);
  mpg__file_out o;
  cr_assert_eq(mpg__file_out_open(&o, AT_FDCWD, file, NULL, NULL, 0644), MPG_OK, "%s",
               mpg_last_error());
  cr_expect_eq(o.tmp[0], '.', "%s", o.tmp);
  cr_expect(strstr(o.tmp, ".abandoned.") == o.tmp, "%s", o.tmp);
  cr_assert_eq(write(o.fd, "x", 1), 1);
  mpg__file_out_abandon(&o);
  cr_expect_eq(entries(dir, first, sizeof first), 2, "left: %s", first); /* target, ro */
  cr_expect_neq(access(file, F_OK), 0);
}

Test(base_file, symlink_target_is_replaced_not_followed, .fini = cleanup) {
  fresh_dir();
  char victim[400], link[400];
  snprintf(victim, sizeof victim, "%s/victim", dir);
  snprintf(link, sizeof link, "%s/link", dir);
  put(victim, "precious");
  cr_assert_eq(symlink(victim, link), 0);
  /* Reading through the link: refused, naming it. */
  int fd;
  uint64_t size;
  cr_expect_eq(mpg__file_open_regular(AT_FDCWD, link, link, &fd, &size), MPG_ERR_IO);
  cr_expect_eq(fd, -1);
  cr_expect(strstr(mpg_last_error(), link) &&
                strstr(mpg_last_error(), "is a symbolic link (not followed)"),
            "%s", mpg_last_error());
  /* Writing it: the link itself is replaced, never what it points to. */
  cr_assert_eq(mpg__file_write_whole(AT_FDCWD, link, link, NULL, "new", 3, 0644), MPG_OK, "%s",
               mpg_last_error());
  expect_text(victim, "precious");
  struct stat sb;
  cr_assert_eq(lstat(link, &sb), 0);
  cr_expect(S_ISREG(sb.st_mode));
  expect_text(link, "new");
}

Test(base_file, reads_regular_files_only, .fini = cleanup) {
  fresh_dir();
  char fifo[400], sub[400], missing[400];
  snprintf(fifo, sizeof fifo, "%s/fifo", dir);
  snprintf(sub, sizeof sub, "%s/sub", dir);
  snprintf(missing, sizeof missing, "%s/missing", dir);
  cr_assert_eq(mkfifo(fifo, 0600), 0);
  cr_assert_eq(mkdir(sub, 0700), 0);
  int fd;
  uint64_t size;
  /* A FIFO with no writer: refused at once (O_NONBLOCK), not waited on. */
  cr_expect_eq(mpg__file_open_regular(AT_FDCWD, fifo, fifo, &fd, &size), MPG_ERR_IO);
  cr_expect(strstr(mpg_last_error(), fifo) &&
                strstr(mpg_last_error(), "not a regular file (a FIFO)"),
            "%s", mpg_last_error());
  cr_expect_eq(mpg__file_open_regular(AT_FDCWD, sub, sub, &fd, &size), MPG_ERR_IO);
  cr_expect(strstr(mpg_last_error(), "not a regular file (a directory)"), "%s",
            mpg_last_error());
  cr_expect_eq(mpg__file_open_regular(AT_FDCWD, missing, missing, &fd, &size),
               MPG_ERR_NOT_FOUND);
  cr_expect(strstr(mpg_last_error(), missing), "%s", mpg_last_error());
  cr_expect_eq(mpg__file_open_regular(AT_FDCWD, "/dev/null", "/dev/null", &fd, &size),
               MPG_ERR_IO);
  cr_expect(strstr(mpg_last_error(), "a character device"), "%s", mpg_last_error());
}

Test(base_file, pread_pwrite_all, .fini = cleanup) {
  fresh_dir();
  char path[400];
  snprintf(path, sizeof path, "%s/p", dir);
  int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  cr_assert_geq(fd, 0);
  cr_assert_eq(mpg__file_pwrite_all(fd, "abcdef", 6, 4, path), MPG_OK, "%s", mpg_last_error());
  char buf[8] = {0};
  cr_assert_eq(mpg__file_pread_all(fd, buf, 6, 4, path), MPG_OK, "%s", mpg_last_error());
  cr_expect_eq(memcmp(buf, "abcdef", 6), 0);
  cr_expect_eq(mpg__file_pread_all(fd, buf, 8, 4, path), MPG_ERR_IO);
  cr_expect(strstr(mpg_last_error(), "truncated: 8 bytes needed at offset 4, the file ends at 10"),
            "%s", mpg_last_error());
  close(fd);
}
