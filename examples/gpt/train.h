/* The parallel GPT trainer on thread ranks (tp, sp, cp, dp, pp through
 * meshpg; optionally sharded data parallel / HSDP, optionally real MPI
 * processes), checked against the single-process reference.  See train.c. */
#ifndef GPT_TRAIN_H
#define GPT_TRAIN_H

#include "model.h"

typedef struct gpt_par_result {
  int steps, nt;
  double *loss;      /* [steps] global mean loss of each step */
  double *param_err; /* [nt] after the last step, max over ranks (-1: none) */
  double *grad_err;  /* [nt] after step 0's sync (-1: none) */
  int pp, dp, cp, tp;
  int start;         /* the first step this run trained: 0, or with a
                        resume the checkpoint's step (loss[0 .. start) and
                        grad_err are then not computed) */
  int root;          /* 1 on the process that holds the results (rank 0 with
                        --mpi; always 1 on thread ranks) */
  double step_s;     /* mean wall time of a step after the first (rank 0) */
  double comm_frac;  /* exposed communication: the share of the steps after
                        the first that a rank spent waiting in blocking
                        communication (collectives, p2p, the sync's finish
                        and gather waits), the largest over the ranks; -1
                        with one step */
  char error[512];
  /* With opts->keep_params: every rank's final parameters (its tp shard of
   * each tensor it holds), rank_params[rank * nt + id] of rank_count[rank *
   * nt + id] floats, NULL where the rank does not hold the tensor (and for
   * ranks of other processes with --mpi); world = pp * dp * cp * tp. */
  int world;
  float **rank_params;
  size_t *rank_count;
  /* MoE (moe.h): the expert grid, and per step the aux loss (part of
   * loss[]) and gpt_moe_imbalance of the step's tokens per expert, summed
   * over every rank's rows; NULL / 0 without MoE. */
  int ep, etp, edp;
  double *aux;       /* [steps] */
  double *imbalance; /* [steps] */
} gpt_par_result;

/* A parsed mesh: dims pp, dp, cp, tp, or HSDP with dp split in
 * dp_replicate x dp_shard (then dp = dp_replicate * dp_shard).  Missing
 * dims are 1. */
typedef struct gpt_dims {
  int pp, dp, cp, tp;
  int hsdp, dp_rep, dp_shard;
} gpt_dims;

/* Parse "pp=2,dp=2,cp=2,tp=2" or "dp_replicate=2,dp_shard=2,tp=2" (any
 * order).  Returns 0 or -1. */
int gpt_parse_mesh(const char *s, gpt_dims *d);

typedef struct gpt_par_opts {
  int sp;    /* sequence parallel over tp */
  int shard; /* mpg_sync in MPG_SYNC_SHARD mode (distributed optimizer; HSDP
                when the mesh has dp_replicate / dp_shard) */
  int mpi;   /* this process is one rank of an mpirun job (MPI backend);
                otherwise every rank is a thread of this process */
  int nccl;  /* thread ranks on the NCCL backend, one CUDA device each
                (device = rank % device count; on real GPUs as many GPUs
                as ranks: NCCL refuses two ranks of one process on one
                GPU).  The math stays on the host: every communication is
                staged through device memory (stage.h).  Not with mpi. */
  int keep_params; /* fill res->rank_params */
  /* (MoE's expert parallel sizes are gpt_config.ep / etp: callers build
   * this struct with positional initializers, so it keeps its fields.) */
} gpt_par_opts;

/* The flight recorder (--trace, docs/trace.md) for the runs of this
 * process that start after the call: dir becomes every context's trace
 * directory (mpg_init_opts.trace_dir: a fault dumps there) with a ring of
 * GPT_TRACE_ENTRIES operations, and after a healthy run every rank writes
 * dir/rank-R.trace (mpg_ctx_trace_dump) and waits for the others at a
 * barrier.  NULL (the default): the library's defaults (MESHPG_TRACE_DIR),
 * no dump at the end.  dir must outlive the runs.  (Not a gpt_par_opts
 * field: callers build that struct with positional initializers.) */
void gpt_set_trace(const char *dir);
#define GPT_TRACE_ENTRIES 65536

/* Checkpoints of a run (ckpt.h), for gpt_parallel_train_ckpt; a zeroed
 * struct: none.  save_dir: after save_at steps are done (1 .. steps),
 * every rank saves its parameters, AdamW moments and the trainer's state
 * there (mpg_ckpt_save); async_save: in the background
 * (mpg_ckpt_opts.async), waited for before the run ends.  resume_dir:
 * load a checkpoint saved under any mesh before the first step and train
 * from its step up to `steps` (res->start). */
typedef struct gpt_ckpt_opts {
  const char *save_dir;
  int save_at, async_save;
  const char *resume_dir;
} gpt_ckpt_opts;

/* NULL when *o is usable for a run of `steps` steps (and a --resume
 * directory exists), else why not, in buf. */
const char *gpt_ckpt_check_opts(const gpt_ckpt_opts *o, int steps, char *buf, size_t n);

/* Train `steps` steps on a mesh.  ref / ref_grads1 (may be NULL): the
 * reference's final model and step-0 gradients to compare against.
 * Returns 0, or -1 with res->error set.  With opts->mpi, collective over
 * the mpirun job; the results are complete where res->root is 1. */
int gpt_parallel_train_opts(const gpt_config *c, const uint8_t *data, size_t len,
                            const char *mesh, const gpt_par_opts *opts, int steps,
                            const gpt_model *ref, float *const *ref_grads1,
                            gpt_par_result *res);
/* The same with checkpoints (ck may be NULL: none). */
int gpt_parallel_train_ckpt(const gpt_config *c, const uint8_t *data, size_t len,
                            const char *mesh, const gpt_par_opts *opts,
                            const gpt_ckpt_opts *ck, int steps, const gpt_model *ref,
                            float *const *ref_grads1, gpt_par_result *res);
/* The same on thread ranks, replicate mode. */
int gpt_parallel_train(const gpt_config *c, const uint8_t *data, size_t len,
                       const char *mesh, int sp, int steps, const gpt_model *ref,
                       float *const *ref_grads1, gpt_par_result *res);
void gpt_par_result_free(gpt_par_result *res);

/* Relative error of a shard (shard r of `parts`, as gpt_shard_to_full) in
 * the 2-norm: ||a - ref|| / ||ref|| over the
 * shard's elements and the matching elements of the full reference tensor.
 * (An elementwise max would flag elements whose gradient is a cancellation
 * near zero.)  skip_key_bias leaves out the key part of qkv.b: its
 * gradient is exactly zero in exact arithmetic (softmax cancels a shift
 * common to every key: sum over keys of d score = 0), so what f32 computes
 * is rounding noise, which AdamW's m / sqrt(v) turns into updates of order
 * lr whatever its size; both runs' key biases are such random walks and
 * cannot be compared.  Used for parameters after training, not for the
 * gradients of step 1. */
double gpt_shard_error(const gpt_config *c, int id, int parts, int r, const float *a,
                       size_t n, const float *ref_full, int skip_key_bias);
/* The same over elements [off, off + n) of the shard only (a rank's owned
 * range in shard mode); -1 when n is 0. */
double gpt_shard_error_at(const gpt_config *c, int id, int parts, int r, const float *a,
                          size_t off, size_t n, const float *ref_full, int skip_key_bias);

#endif
