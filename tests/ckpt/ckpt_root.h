/* The directory a checkpoint test works in, and its tmpfs runs
 * (tests/ckpt/ckpt_root.c; Criterion, for test_ckpt and
 * test_ckpt_save_guard). */
#ifndef MPG_TESTS_CKPT_ROOT_H
#define MPG_TESTS_CKPT_ROOT_H

#include <stddef.h>

/* This test's directory (root_init), removed by root_fini (the tests'
 * .fini). */
extern char g_root[4096];
void root_init(const char *tag);
void root_fini(void);

/* g_root/name into buf. */
void path_in(char *buf, size_t cap, const char *name);

/* As root: runs child(mnt, msg, cap) through ckf_in_private_tmpfs on the
 * new directory g_root/mnt with mount options opts, and asserts that it
 * returned 0; 2 means files were left behind (left: what says so).  Skips
 * the test without root ("not root: no tmpfs can be mounted" and why) or
 * without a private tmpfs.  what: the log line's name for the run. */
void expect_tmpfs_child(const char *opts, int (*child)(const char *mnt, char *msg, size_t cap),
                        const char *why, const char *what, const char *left);

#endif
