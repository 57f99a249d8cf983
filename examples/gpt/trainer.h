/* The parallel trainer's internals (train.c), shared with its checkpoint
 * code (ckpt.c): the job of a run, one rank's sync state and trainer, and
 * the error macros of their functions.  Not an API: train.h is. */
#ifndef GPT_TRAINER_H
#define GPT_TRAINER_H

#include <stdio.h>
#include <stdlib.h>

#include "stage.h"
#include "train.h"

/* The group size a tensor of split kind `split` (gpt_tensor_split) is cut
 * over, and this rank's shard index in it. */
static inline int split_parts(int split, int tp, int etp) {
  return split == GPT_SPLIT_TP ? tp : split == GPT_SPLIT_ETP ? etp : 1;
}
static inline int split_rank(int split, int tp_rank, int etp_rank) {
  return split == GPT_SPLIT_TP ? tp_rank : split == GPT_SPLIT_ETP ? etp_rank : 0;
}

typedef struct job {
  gpt_config cfg;
  const uint8_t *data;
  size_t len;
  mpg_mesh *mesh;
  gpt_dims d;
  gpt_par_opts o;
  gpt_ckpt_opts ck; /* --save, --resume */
  char ck_error[400]; /* why a resume failed (rank 0, or each MPI process) */
  int steps;
  const gpt_model *ref;
  float *const *ref_grads1;
  gpt_par_result *res;
} job;

typedef struct rank_state {
  mpg_sync *sync;
  int *param_of;    /* tensor id -> sync param id */
  float *premul;    /* multiplier of the summed gradient before its
                       reduction (1: none): tp for a partial sum over tp
                       (sp), the expert scale for expert tensors */
  /* grad / param: the host arrays the model computes with.  dgrad / dparam:
   * the sync's views (mpg_sync_grad, mpg_sync_param).  On thread and MPI
   * they are the same memory; on NCCL the views are device memory, and
   * the host arrays are staged in and out around the sync (stage.h). */
  float **grad, **param;
  float **dgrad, **dparam;
  int *up;   /* gradient staged into its view in this step's last micro-batch */
  int *down; /* gathered parameter staged out of its view in this step */
  gpt_stage *stage;
  size_t *count;
  /* shard mode: this rank's range of each tensor */
  int *sharded;
  size_t *own_off, *own_cnt, *own_state;
  int shard, last_mb, T;
  mpg_status err;
} rank_state;

/* One rank's trainer: the parts of rank_main (setup, the step's pipeline,
 * norm and optimizer, the results, teardown) share it. */
typedef struct trainer {
  job *J;
  const gpt_config *c;
  mpg_ctx *ctx;
  gpt_model m;
  rank_state rs;
  gpt_stage stage;
  mpg_group *g_tp, *g_cp, *g_pp, *g_world, *tied, *g_ep, *g_etp, *g_edp;
  /* the mesh's sizes; coordinates: pp, dp (or dp_replicate, dp_shard), cp, tp */
  int rank, nccl, P, D, K, T, sp, h, ps, dr, rep, cr, tr;
  int moe, EP, ETP, epr, etr, edr, EDP; /* the expert grid */
  int nt, lo, hi, first, last, nmoe, nred, M, nb, per_dp, npend;
  mpg_p2p_op pend; /* a send waiting to be batched with the next receive */
  size_t hsz;
  float scale;
  uint8_t *seqs;
  float *buf_in, *buf_out, *st_m, *st_v;
  double *errs, *red, t_first, comm_first;
  int start;          /* the first step: 0, or the resumed checkpoint's */
  struct gpt_ck *ck;  /* checkpoints (ckpt.c); NULL without --save / --resume */
} trainer;

#define CHECK(expr)                                                                         \
  do {                                                                                      \
    mpg_status st_ = (expr);                                                                \
    if (st_ != MPG_OK) {                                                                    \
      fprintf(stderr, "gpt rank %d: %s failed: %s\n", t->rank, #expr, mpg_last_error());   \
      return st_;                                                                           \
    }                                                                                       \
  } while (0)
/* the model's or a callback's error (reported where it happened) */
#define PASS(expr) do { mpg_status st_ = (expr); if (st_ != MPG_OK) return st_; } while (0)
#define MODEL_ERR(t) ((t)->m.comm.err != MPG_OK ? (t)->m.comm.err : (t)->rs.err)
#define TALLOC(p, n) ((int)(((p) = calloc((size_t)(n), sizeof *(p))) != NULL))

/* Checkpoints (ckpt.c), per rank after the model is built: gpt_ckpt_begin
 * registers everything (with --save or --resume) and with --resume loads,
 * setting t->start; gpt_ckpt_step_done(t, k) after the k-th step's optimizer
 * update saves when k is --save-at; gpt_ckpt_end waits for an async save
 * (before the final comparison); gpt_ckpt_free frees (before the sync). */
mpg_status gpt_ckpt_begin(trainer *t);
mpg_status gpt_ckpt_step_done(trainer *t, int done);
mpg_status gpt_ckpt_end(trainer *t);
void gpt_ckpt_free(trainer *t);

#endif
