/* The parallel GPT trainer on thread ranks (tp, sp, dp, pp through meshpg),
 * checked against the single-process reference.  See train.c. */
#ifndef GPT_TRAIN_H
#define GPT_TRAIN_H

#include "model.h"

typedef struct gpt_par_result {
  int steps, nt;
  double *loss;      /* [steps] global mean loss of each step */
  double *param_err; /* [nt] after the last step, max over ranks (-1: none) */
  double *grad_err;  /* [nt] after step 0's sync (-1: none) */
  int pp, dp, tp;
  char error[512];
} gpt_par_result;

/* Parse "pp=2,dp=2,tp=2" (any order, dims pp/dp/tp only, missing = 1). */
int gpt_parse_mesh(const char *s, int *pp, int *dp, int *tp);

/* Train `steps` steps on a mesh as threads.  ref / ref_grads1 (may be
 * NULL): the reference's final model and step-0 gradients to compare
 * against.  Returns 0, or -1 with res->error set. */
int gpt_parallel_train(const gpt_config *c, const uint8_t *data, size_t len,
                       const char *mesh, int sp, int steps, const gpt_model *ref,
                       float *const *ref_grads1, gpt_par_result *res);
void gpt_par_result_free(gpt_par_result *res);

/* Relative error of a shard in the 2-norm: ||a - ref|| / ||ref|| over the
 * shard's elements and the matching elements of the full reference tensor.
 * (An elementwise max would flag elements whose gradient is a cancellation
 * near zero.)  skip_key_bias leaves out the key part of qkv.b: its
 * gradient is exactly zero in exact arithmetic (softmax cancels a shift
 * common to every key: sum over keys of d score = 0), so what f32 computes
 * is rounding noise, which AdamW's m / sqrt(v) turns into updates of order
 * lr whatever its size; both runs' key biases are such random walks and
 * cannot be compared.  Used for parameters after training, not for the
 * gradients of step 1. */
double gpt_shard_error(const gpt_config *c, int id, int tp, int r, const float *a,
                       size_t n, const float *ref_full, int skip_key_bias);

#endif
