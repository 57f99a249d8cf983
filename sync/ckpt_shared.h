/* Checkpoints (meshpg.h, "Checkpoints"; docs/checkpoints.md): what
 * sync/ckpt.c (registration, agreement), sync/ckpt_save.c (stage,
 * deduplicate, write, publish) and sync/ckpt_load.c (plan, read, verify)
 * share.  The format itself is sync/ckpt_format.h.  The header belongs to
 * none of them (ckpt.c calls down into save and load, never the reverse),
 * so it is named for none (tests/layout/check_layout.py, rule 2b: a
 * ckpt_internal.h would belong to ckpt.c).
 *
 * A save, on every rank:
 *  1. stage: each registered piece is copied to host staging (always on
 *     nccl and with async; a synchronous save on host memory reads the
 *     trainer's buffers in place) and hashed block by block;
 *  2. exchange: one all-gather over the world of every rank's chunk
 *     descriptors (name, dtype, kind, shape, box, range, block hashes) and
 *     its status so far; rank 0 has taken dir.lock, checked dir and made
 *     `dir`.partial before it;
 *  3. plan: every rank computes the same plan from the same descriptors:
 *     identical chunks (same tensor, box and range) are one chunk, written
 *     by the holder with the fewest bytes assigned so far (largest chunks
 *     first), replicas must hash alike, one name has one dtype, kind and
 *     shape;
 *  4. write (the rank's thread with async): its chunks into
 *     dir.partial/data-R.bin, fsync, then its state on the board in
 *     dir.lock ('D', or 'F' with the message; ckpt_save_shared.h); rank 0 waits
 *     for every state, writes meta.mpgc (fsync), renames dir.partial to
 *     dir (or swaps it with an existing checkpoint, RENAME_EXCHANGE, and
 *     removes the old one) and writes its verdict ('P' or 'A'); the other
 *     ranks wait for the verdict; a failure stops every rank's writing;
 *  5. wait: join the thread; every rank agrees on the first failure.
 * Rank 0 holds the flock of dir.lock from step 2 to the end of step 5, and
 * the ranks agree on the plan (rank 0's metadata included) and on the
 * overlaps of the boxes before any rank writes. */
#ifndef MPG_SYNC_CKPT_SHARED_H
#define MPG_SYNC_CKPT_SHARED_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "ckpt_format.h"
#include "internal.h"

#define MPG__CKPT_MSG 512 /* a rank's error message in the agreement */

typedef struct mpg__ckpt_entry {
  char *name;
  int dtype, kind, ndim;
  uint64_t shape[MPG_CKPT_MAX_NDIM], box_off[MPG_CKPT_MAX_NDIM],
      box_shape[MPG_CKPT_MAX_NDIM];
  uint64_t range_off, range_count; /* always set (count: the box's elements
                                      when the whole box is held) */
  void *data;                      /* the trainer's memory */
  int host;                        /* host memory even on nccl (bytes) */
} mpg__ckpt_entry;

typedef struct mpg__ckpt_save mpg__ckpt_save; /* a save in flight */

struct mpg_ckpt {
  mpg_ctx *ctx;
  mpg_ckpt_opts opts;
  mpg__ckpt_entry *e;
  int n, cap;
  char sync_note[64]; /* " sync=shard" etc. for the mesh text */
  void *stage;        /* host staging kept between saves and loads (a
                         second save does not page-fault it again) */
  size_t stage_bytes;
  mpg__ckpt_save *save;
  struct mpg__ckpt_names *names; /* ckpt.c: the registered names' hash set */
};

/* Element size of an entry, in bytes. */
static inline size_t mpg__ckpt_esz(const mpg__ckpt_entry *e) {
  return mpg__ckpt_dtype_size(e->dtype);
}

/* The agreement of every rank on the first failure (ckpt_common.c): `st`
 * and the thread's message (when st != MPG_OK) go in; out comes, on every rank,
 * the status of the lowest failing rank with its message recorded as this
 * thread's error ("world rank 3: ..."), or MPG_OK.  relayed: st only
 * repeats another rank's failure (read from the save's board), which then
 * comes after every rank's own failure; relayed 2: this rank does not know
 * the outcome (it gave up waiting for rank 0's verdict), which is no
 * failure when no rank failed otherwise.  A failure of the agreement
 * itself is returned as is.  Collective over the world. */
mpg_status mpg__ckpt_agree(mpg_ckpt *ck, mpg_status st, int relayed, const char *what);

/* The mesh text of the checkpoint ("pp=2,dp=2,tp=2 world=8 sync=shard");
 * ckpt_plan.c. */
void mpg__ckpt_mesh_text(const mpg_ckpt *ck, char *buf, size_t cap);

/* The handle's host staging of at least `bytes` (kept; grown by a new
 * allocation when too small).  ckpt_common.c. */
mpg_status mpg__ckpt_stage(mpg_ckpt *ck, size_t bytes, void **out);

/* Save: start (stage, exchange, plan, launch the write) and finish (join,
 * agree); ckpt_save.c. */
mpg_status mpg__ckpt_save_start(mpg_ckpt *ck, const char *dir, long step, void *stream);
mpg_status mpg__ckpt_save_finish(mpg_ckpt *ck);

/* Load; ckpt_load.c. */
mpg_status mpg__ckpt_load(mpg_ckpt *ck, const char *dir, long *step, void *stream);

#endif
