/* Resharding checks of the checkpoints (sync/ckpt*.c), shared by
 * test_ckpt.c (thread ranks), ckpt_mpi_worker.c (mpirun) and
 * test_ckpt_kill.c (a SIGKILLed save); tests/ckpt/ckpt_check.c defines.
 *
 * A case is a list of global tensors (1-3 axes, every dtype, kind param or
 * optimizer state, plus the trainer's bytes) and two meshes: mesh[0] saves
 * it, mesh[1] loads it.  Each mesh is random: pp, dp (or dp_replicate x
 * dp_shard, HSDP), cp and tp dealt from the world's prime factors in a
 * random order, a sync in replicate or shard mode (shard / replicate dims
 * at random), and for each tensor how its ranks hold it:
 *   CK_WHOLE  every rank of its pipeline stage the whole box;
 *   CK_BOX    an explicit box: one axis cut unevenly over dp_cp positions;
 *   CK_RANGE  the box's elements cut unevenly over dp_cp positions
 *             (range_offset / range_count);
 *   CK_STATE  optimizer state of a real mpg_sync's parameter
 *             (mpg_ckpt_add_state): the owned range in shard mode (HSDP:
 *             the owned range in each replica), the whole box in replicate
 *             mode or for a parameter with reduce dims of its own;
 * the box being the whole tensor or, with split, the tensor cut over "tp"
 * on its split axis (split_dims).  Tensor t lives on pipeline stage
 * stage[t] only (the trainer's bytes on every rank).
 *
 * Every element's bits are a pure function of (tensor, global row-major
 * index, version): ck_bits.  Each registered buffer sits between guard
 * bytes (CK_GUARD), which a load must leave alone (a state array's guard
 * is everything outside the owned range).
 *
 * Nothing here uses Criterion: a rank reports through its message buffer
 * and status, and the caller asserts. */
#ifndef CKPT_CHECK_H
#define CKPT_CHECK_H

#include <stddef.h>
#include <stdint.h>

#include "meshpg.h"

#define CK_MAX_T 12      /* tensors of a case, the bytes included */
#define CK_MAX_RANKS 32
#define CK_MSG 1536
#define CK_GUARD 0xA5
#define CK_POISON 0x3C
#define CK_BY_STEP (-1000)
#define CK_GUARD_ELEMS 16 /* guard elements before and after a buffer */

typedef enum ck_mode { CK_WHOLE, CK_BOX, CK_RANGE, CK_STATE } ck_mode;

typedef struct ck_tensor {
  char name[48];
  mpg_dtype dtype;     /* bytes: unused (1-byte elements) */
  int bytes;           /* 1: mpg_ckpt_add_bytes, shape[0] bytes */
  mpg_ckpt_kind kind;
  int ndim;
  size_t shape[3];
  int split_axis;      /* -1, or an axis both meshes' tp sizes divide */
} ck_tensor;

typedef struct ck_mesh {
  char dims[96], flatten[96];
  int world, pp, tp;
  mpg_sync_mode sync_mode;
  char shard_dims[48], replicate_dims[48];
  double bucket_mb;
  size_t block_bytes;
  ck_mode mode[CK_MAX_T];
  int split[CK_MAX_T]; /* the box is the tensor cut over tp */
  int norm[CK_MAX_T];  /* CK_STATE: its param reduces over dp_cp,tp (replicated) */
  int axis[CK_MAX_T];  /* CK_BOX: the axis cut over dp_cp */
  int stage[CK_MAX_T]; /* the pipeline stage that holds it */
  int skip[CK_MAX_T];  /* 1: no rank registers it; 2: with CK_BOX or
                          CK_RANGE only dp_cp position 0 does, so part of
                          it is missing (tests) */
} ck_mesh;

typedef struct ck_case {
  unsigned seed;
  int ntensors;
  ck_tensor t[CK_MAX_T];
  ck_mesh mesh[2]; /* [0] saves, [1] loads */
} ck_case;

/* A random case: save over ws ranks, load over wl (<= CK_MAX_RANKS).
 * big: some tensors of 10^4..10^5 elements (several checksum blocks). */
void ck_case_make(ck_case *c, unsigned seed, int ws, int wl, int big);

/* A mesh for `world` ranks with every tensor whole on every rank, no pp:
 * the plainest registration (fixed cases). */
void ck_mesh_plain(ck_mesh *m, const char *dims, const char *flatten, int world,
                   int ntensors);

/* One line describing mesh m of case c ("dp=2,tp=2 shard(dp_cp) t0:box ..."). */
void ck_mesh_describe(const ck_case *c, const ck_mesh *m, char *buf, size_t cap);

/* Total bytes of the case's global tensors. */
size_t ck_case_bytes(const ck_case *c);

/* Element size of tensor t (1 for bytes). */
size_t ck_esize(const ck_tensor *t);

/* The bits of global element g of tensor t at `version` (the low
 * element-size bytes are the value, stored little-endian). */
uint64_t ck_bits(int t, size_t g, int version);

/* One registration of a rank. */
typedef struct ck_reg {
  int t;                 /* tensor index; -1: an extra tensor (tests) */
  size_t esize;
  size_t box_off[3], box_shape[3];
  size_t range_off, n;   /* the piece: n elements of the box from range_off */
  unsigned char *alloc;  /* guard, buffer, guard */
  size_t alloc_elems, piece_at; /* the piece starts at element piece_at */
} ck_reg;

/* A rank's side of a case under one of its meshes. */
typedef struct ck_rank {
  const ck_case *c;
  const ck_mesh *m;
  int rank, world;
  mpg_mesh *mesh;
  mpg_ctx *ctx;
  mpg_sync *sync;
  mpg_ckpt *ck;
  int nreg;
  ck_reg reg[CK_MAX_T + 2];
  char msg[CK_MSG];
} ck_rank;

/* Build mesh m of case c, the context (opts), the sync, the checkpoint
 * handle (co; NULL: defaults with m->block_bytes) and register this rank's
 * pieces, guards set, pieces zero.  MPG_OK, or the failing call's status
 * with s->msg.  ck_close frees everything (also after a failure). */
mpg_status ck_open(ck_rank *s, const mpg_init_opts *opts, const ck_case *c, const ck_mesh *m,
                   const mpg_ckpt_opts *co);
void ck_close(ck_rank *s);

/* Write every piece's values at `version`. */
void ck_fill(ck_rank *s, int version);
/* Set every piece's bytes to `byte`. */
void ck_set_bytes(ck_rank *s, unsigned char byte);
/* 0 when every piece holds its values at `version` (version < 0: every
 * byte equals -version - 1, e.g. -1 for zero) and every guard is intact;
 * else -1 with s->msg naming the tensor, the element and both values. */
int ck_check(ck_rank *s, int version);

/* A whole save or load of a case by one rank (the thread ranks' and the
 * MPI worker's body). */
typedef struct ck_job {
  const ck_case *c;
  int which;               /* 0: save with mesh[0]; 1: load with mesh[1] */
  const char *dir;
  int version;             /* values written (save) or expected (load);
                              CK_BY_STEP (load): the step's, whichever
                              step the checkpoint has */
  long step;
  int async;               /* save: opts.async, then the buffers change
                              before mpg_ckpt_wait */
  void (*before)(ck_rank *s, struct ck_job *j); /* NULL, or called right
                              before the save (after the fill) or the load */
  mpg_status expect;       /* the status every rank must get; a load
                              that must fail starts from pieces of
                              CK_POISON bytes and must leave them so */
  mpg_status st[CK_MAX_RANKS];
  char msg[CK_MAX_RANKS][CK_MSG];   /* a failure's description */
  char err[CK_MAX_RANKS][CK_MSG];   /* mpg_last_error() after save / load */
  double secs[CK_MAX_RANKS];        /* the save (with wait) or load call */
  long got_step[CK_MAX_RANKS];      /* a load's step */
} ck_job;

/* Run rank `opts->rank`'s side of job j: MPG_OK when it got j->expect (and,
 * for a load, the right values, or untouched buffers after an error). */
mpg_status ck_job_rank(const mpg_init_opts *opts, ck_job *j);

/* mpg_thread_run body: arg is a ck_job. */
mpg_status ck_job_thread(const mpg_init_opts *opts, void *arg);

/* "rank R: ..." lines of the ranks whose st is not MPG_OK into buf. */
const char *ck_job_failures(const ck_job *j, int world, char *buf, size_t cap);

#endif
