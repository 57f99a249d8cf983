/* What the save's files share (ckpt_save.c: stage, exchange; ckpt_plan.c:
 * the plan and the metadata; ckpt_write.c: write, publish, finish).
 *
 * Descriptors: each rank sends int64 words: a head of MPG__DESC_HEAD words
 * (status, save id (rank 0's counts), number of entries, then the message
 * of a failure, MPG__CKPT_MSG bytes), then per entry: the name's length,
 * the name padded with NULs to whole words (at least one NUL), dtype,
 * kind, ndim, shape[8], box offset[8], box shape[8], range offset, range
 * count, hash of the block hashes, block count, the block hashes. */
#ifndef MPG_SYNC_CKPT_SAVE_H
#define MPG_SYNC_CKPT_SAVE_H

#include "ckpt_internal.h"

#define MPG__DESC_HEAD (3 + MPG__CKPT_MSG / 8)
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
  char dir[4096], partial[4112];
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
  int relayed;       /* result repeats another rank's failure */
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

/* Free a save's memory (staging included). */
void mpg__ckpt_save_free(mpg_ckpt *ck, mpg__ckpt_save *sv);

#endif
