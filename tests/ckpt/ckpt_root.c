/* The directory a checkpoint test works in, and its tmpfs runs
 * (ckpt_root.h). */
#include "ckpt_root.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt_fs.h"

char g_root[4096];

void root_fini(void) {
  if (g_root[0]) ckf_rm_rf(g_root);
}

void root_init(const char *tag) {
  cr_assert_eq(ckf_tmpdir(g_root, sizeof g_root, tag), 0, "mkdtemp: %s", strerror(errno));
}

void path_in(char *buf, size_t cap, const char *name) {
  snprintf(buf, cap, "%s/%s", g_root, name);
}

void expect_tmpfs_child(const char *opts, int (*child)(const char *mnt, char *msg, size_t cap),
                        const char *why, const char *what, const char *left) {
  if (geteuid() != 0) cr_skip_test("not root: no tmpfs can be mounted%s", why);
  char mnt[4200];
  path_in(mnt, sizeof mnt, "mnt");
  cr_assert_eq(mkdir(mnt, 0755), 0);
  static char msg[4096];
  int rc = ckf_in_private_tmpfs(mnt, opts, child, msg, sizeof msg);
  cr_assert_neq(rc, -1, "the child died: %s", msg);
  if (rc == 77) cr_skip_test("no private tmpfs: %s", msg);
  cr_log_info("%s: %s", what, msg);
  cr_assert_neq(rc, 2, "%s: %s", left, msg);
  cr_assert_eq(rc, 0, "%s", msg);
}
