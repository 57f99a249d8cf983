/* What the save's files share (ckpt_save.c: stage, exchange; ckpt_plan.c:
 * the plan and the metadata; ckpt_write.c: write, publish, finish;
 * ckpt_lock.c and ckpt_overlap.c).  ckpt_save.c calls down into the
 * others, so the header is named for none of them (check_layout.py, rule
 * 2b: a ckpt_save.h would belong to ckpt_save.c).
 *
 * Descriptors: each rank sends int64 words: a head of MPG__DESC_HEAD words
 * (status, save id (rank 0's counts), number of entries, the inode of
 * dir.partial (rank 0's counts), then the message of a failure,
 * MPG__CKPT_MSG bytes), then per entry: the name's length,
 * the name padded with NULs to whole words (at least one NUL), dtype,
 * kind, ndim, shape[8], box offset[8], box shape[8], range offset, range
 * count, hash of the block hashes, block count, the block hashes. */
#ifndef MPG_SYNC_CKPT_SAVE_SHARED_H
#define MPG_SYNC_CKPT_SAVE_SHARED_H

#include "ckpt_shared.h"

#define MPG__DESC_HEAD (4 + MPG__CKPT_MSG / 8)
#define MPG__DESC_MSG 4 /* the word where the message starts */
#define MPG__DESC_ENTRY 32 /* words of an entry besides its name and hashes */

typedef struct mpg__ckpt_piece { /* one of this rank's entries */
  const unsigned char *bytes;    /* staged, or the trainer's memory */
  uint64_t nbytes, nblocks, hash;
  uint64_t *hashes;
} mpg__ckpt_piece;

typedef struct mpg__ckpt_rec { /* an entry of any rank, decoded */
  int rank;
  const char *name; /* into the gathered words */
  int dtype, kind, ndim;
  uint64_t shape[MPG_CKPT_MAX_NDIM], box_off[MPG_CKPT_MAX_NDIM], box_shape[MPG_CKPT_MAX_NDIM];
  uint64_t range_off, range_count, hash, nblocks, nbytes;
  const int64_t *hashes;
  int lead;      /* index of the first record of its chunk (sorted order) */
  int writer;    /* on a chunk's lead: the writing rank */
  uint64_t file_off;
  int entry;     /* the entry index on its rank */
} mpg__ckpt_rec;

typedef struct mpg__ckpt_write { /* a chunk this rank writes */
  const unsigned char *bytes;
  uint64_t nbytes, off;
} mpg__ckpt_write;

struct mpg__ckpt_save {
  mpg_ckpt *ck;
  char dir[4096], partial[4112], lock[4112]; /* dir, dir.partial, dir.lock */
  char base[4096];   /* dir's last component, the others' is base.partial etc. */
  int parent_fd;     /* rank 0: dir's parent, opened once (-1: none) */
  int lock_fd;       /* rank 0: dir.lock, flock'ed (-1: not held) */
  int partial_fd;    /* every rank: dir.partial, opened once (-1: none) */
  int board_fd;      /* every rank: dir.lock for its status slot (-1) */
  uint64_t partial_ino; /* rank 0's dir.partial */
  int had_old;       /* rank 0: dir held a checkpoint at the start */
  int published;     /* rank 0: dir.partial became dir */
  long step;
  uint64_t save_id;
  int rank, world;
  double timeout;
  void *staging; /* the handle's (ck->stage), or NULL */
  mpg__ckpt_piece *pieces;
  int64_t *all;  /* world x stride gathered words */
  size_t stride;
  mpg__ckpt_rec *recs; /* sorted by chunk key */
  int nrecs;
  mpg__ckpt_write *writes;
  int nwrites;
  uint64_t file_bytes;
  unsigned char *meta; /* rank 0: the encoded metadata */
  size_t meta_len;
  pthread_t thread;
  int threaded;
  mpg_status result; /* of the write (and, on rank 0, the publish) */
  int relayed;       /* result repeats another rank's failure (1), or
                        this rank gave up waiting for rank 0's verdict
                        (2: it does not know the outcome) */
  char msg[MPG__CKPT_MSG];
};

/* Step 3 (ckpt_plan.c): decode the gathered words, check that the ranks
 * agree, choose a writer per chunk, fill sv->writes and, on rank 0,
 * sv->meta.  The same result on every rank. */
mpg_status mpg__ckpt_plan(mpg_ckpt *ck, mpg__ckpt_save *sv);

/* Step 4 (ckpt_write.c): write this rank's file and marker, then (rank 0)
 * publish or (others) wait for the publish: inline, or in a thread with
 * opts.async. */
mpg_status mpg__ckpt_write_start(mpg_ckpt *ck, mpg__ckpt_save *sv);

/* The save lock, the status board and the directories (ckpt_lock.c).
 *
 * dir.lock, beside dir, is rank 0's flock for the whole save (one saver per
 * dir; the kernel drops it with its holder) and the ranks' status board:
 * a header (MPG__BOARD_HEAD bytes: magic, save id, world, rank 0's verdict
 * 'P' published or 'A' aborted, the holder's host and pid), one state byte
 * per rank ('D' its files are durable, 'F' it failed), then a slot of
 * MPG__CKPT_MSG bytes per rank (status, message).  Rank 0 sizes it (blocks
 * allocated) before the exchange, so a rank reports a failure by
 * overwriting bytes that exist, also when the file system is full.
 *
 * mpg__ckpt_lock (rank 0, before the exchange): take the lock (refused at
 * once, naming the holder, when another save holds it), check dir and an
 * old dir.partial (no symbolic link, only the files a save writes: else
 * refused before any write, naming the entry), remove the old dir.partial,
 * make a fresh one and the board.  mpg__ckpt_unlock: remove dir.lock and
 * release it (rank 0; nothing when not held). */
#define MPG__BOARD_HEAD 4096
mpg_status mpg__ckpt_lock(mpg__ckpt_save *sv);
void mpg__ckpt_unlock(mpg__ckpt_save *sv);
/* Every rank after the plan: open dir.partial (the directory rank 0 made:
 * its inode) and the board (this save's id). */
mpg_status mpg__ckpt_board_open(mpg__ckpt_save *sv);
/* Write this rank's state ('D', 'F' with st and msg), or rank 0's verdict
 * ('P', 'A' with st and msg), and fsync. */
mpg_status mpg__ckpt_board_set(mpg__ckpt_save *sv, char state, mpg_status st, const char *msg);
/* Read the board: the states of every rank into states (world bytes) or,
 * states NULL, rank 0's verdict into *verdict; a slot's status and message
 * with board_slot.  MPG_ERR_IO when dir.lock is gone or another save's. */
mpg_status mpg__ckpt_board_read(mpg__ckpt_save *sv, unsigned char *states, char *verdict);
mpg_status mpg__ckpt_board_slot(mpg__ckpt_save *sv, int r, char *msg, size_t cap);
/* Remove directory `name` of dir_fd and the files a save writes in it;
 * refused (MPG_ERR_INVALID, naming it, nothing removed) when it holds
 * anything else (shown: its path in messages). */
mpg_status mpg__ckpt_remove_ours(int dir_fd, const char *name, const char *shown);
/* MPG_OK when directory fd holds only files a save writes, else
 * MPG_ERR_INVALID naming the first other entry (shown: its path). */
mpg_status mpg__ckpt_check_ours(int fd, const char *shown);

/* Item of the save (ckpt_overlap.c), collective over the world after the
 * agreement on the plan: chunks of one tensor whose boxes overlap (other
 * than replicas) must hold the same bytes where they overlap; else
 * MPG_ERR_INVALID on every rank naming both ranks and the first element
 * that differs. */
mpg_status mpg__ckpt_check_overlaps(mpg_ckpt *ck, mpg__ckpt_save *sv);

/* Tests only (tests/ckpt/test_ckpt_save_guard.c): NULL in use; when set,
 * called on every rank once its plan is made, and a status other than
 * MPG_OK becomes that rank's failure there (as rank 0's metadata or a
 * rank's memory can fail). */
extern mpg_status (*mpg__ckpt_fault)(int rank, const char *where);

/* Free a save's memory (staging included). */
void mpg__ckpt_save_free(mpg_ckpt *ck, mpg__ckpt_save *sv);

#endif
