/* Checkpoint directories in the ckpt tests (tests/ckpt/ckpt_fs.c): fresh
 * directories, rm -rf, the on-disk checks of a saved case through the
 * format's own decoder (sync/ckpt_format.h: link meshpg_static_dep), and
 * the damage the bad-input tests do.  No Criterion: every check returns 0,
 * or -1 with a message. */
#ifndef CKPT_FS_H
#define CKPT_FS_H

#include <stddef.h>
#include <stdint.h>

#include "ckpt_check.h"

/* A fresh directory "BASE/mpg-ckpt-TAG-XXXXXX" into buf; BASE is
 * $MESHPG_CKPT_TEST_DIR (meson test sets it to the build's tests/ckpt),
 * else $TMPDIR, else /tmp.  0 or -1. */
int ckf_tmpdir(char *buf, size_t cap, const char *tag);

/* Remove path and everything under it (no error when absent). */
void ckf_rm_rf(const char *path);

/* 1 when path exists (any kind). */
int ckf_exists(const char *path);

/* Entries of directory `dir` (without . and ..), space-separated, sorted,
 * into buf; the count, or -1 when it cannot be read. */
int ckf_list(const char *dir, char *buf, size_t cap);

/* The checks of a checkpoint that mesh `which` of case c saved at `step`
 * with values `version`, read straight from the files:
 *  - the metadata decodes; step, world size and the tensor list (names,
 *    dtypes, kinds, shapes) are the case's (skipped tensors absent);
 *  - dedup: the chunks of each tensor cover every element exactly once,
 *    and the chunks' bytes add up to the tensors' bytes, as do the data
 *    files' sizes;
 *  - every block's XXH64 is the metadata's, and every stored element holds
 *    ck_bits(tensor, global index, version);
 *  - the directory holds meta.mpgc and the listed data files only, and no
 *    DIR.partial is left beside it (unless flags has CKF_ALLOW_PARTIAL).
 * *nfiles, *max_file (may be NULL): the data files and the largest's bytes. */
#define CKF_ALLOW_PARTIAL 1 /* flags: a DIR.partial beside it is fine (a kill) */
int ckf_meta_check(const ck_case *c, int which, const char *dir, long step, int version,
                   int flags, int *nfiles, uint64_t *max_file, char *msg, size_t cap);

/* Flip every bit of the byte at `off` of file `path`. */
int ckf_flip(const char *path, uint64_t off);

/* Set the metadata's version field and fix its trailer hash. */
int ckf_patch_version(const char *dir, uint32_t version);

/* The path of the data file holding chunk `k`-th of tensor `name` (its
 * first chunk: k = 0) and the chunk's file offset and bytes.  0 or -1. */
int ckf_chunk_of(const char *dir, const char *name, char *path, size_t cap, uint64_t *off,
                 uint64_t *bytes);

/* Run fn(mnt, msg, cap) in a child process, in a private mount namespace
 * with a fresh tmpfs of mount options `opts` ("size=1m", "nr_inodes=4")
 * on mnt (root only), and bring its message back into msg.  The child's
 * exit status (fn's return value; 77: no private tmpfs could be mounted),
 * or -1 when it died. */
int ckf_in_private_tmpfs(const char *mnt, const char *opts,
                         int (*fn)(const char *mnt, char *msg, size_t cap), char *msg,
                         size_t cap);

#endif
