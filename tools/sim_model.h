/* The model of `meshpg sim`: a two-layer MLP (Megatron's MLP block) trained
 * with Adam (or SGD) on synthetic data, and its single-process reference.
 *
 *   h = x W1 + b1      W1: d_in x hidden     (column-parallel over tp)
 *   a = tanh(h)
 *   y = a W2 + b2      W2: hidden x d_out    (row-parallel over tp)
 *   L = 1/(N d_out) sum over the N tokens of the step of |y - t|^2
 *
 * Everything here is a pure function of the model description: the data
 * (inputs, targets, initial weights) come from a counter-based hash of the
 * seed, so any rank can produce any slice of them without shared state, and
 * every value is exactly representable in f32 (ranks train in f32, the
 * reference in f64, and both start from the same numbers). */
#ifndef TOOLS_SIM_MODEL_H
#define TOOLS_SIM_MODEL_H

#include <stdint.h>

typedef struct sim_model {
  uint64_t seed;
  int d_in, hidden, d_out;
  int batch; /* samples per optimizer step (the global batch) */
  int seq;   /* tokens per sample */
  double lr; /* learning rate */
  int adam;  /* 1: Adam (SIM_BETA1, SIM_BETA2, SIM_EPS); 0: plain SGD */
} sim_model;

/* Adam's constants: torch.optim.Adam's betas, and an epsilon well above
 * the f32 rounding error of a gradient element (about 1e-9 here).  Adam's
 * step lr * g / (|g| + eps) has slope lr / eps near g = 0, so with torch's
 * eps = 1e-8 an element whose gradient cancels to ~1e-8 may move by a
 * good part of lr on rounding alone, and f32 ranks could drift from the
 * f64 reference by chance; with 1e-4 that slope stays below 1e-7 per
 * rounding step, while gradients far above eps keep Adam's
 * per-element scaling. */
#define SIM_BETA1 0.9
#define SIM_BETA2 0.999
#define SIM_EPS 1e-4

/* One optimizer update of one element, shared by the ranks and the
 * reference: returns the amount to subtract from the parameter given its
 * gradient g at optimizer step `t` (1, 2, ...).  Adam updates its state
 * *m and *v (both start at 0); SGD ignores them. */
double sim_opt_delta(const sim_model *m, long t, double g, double *mom, double *var);

/* The parameters, in registration (forward) order. */
enum { SIM_W1, SIM_B1, SIM_W2, SIM_B2, SIM_NPARAMS };

/* Initial value of element (i, j) of parameter `which` of the full
 * (unsharded) model; biases use i = 0.  Rounded to f32. */
double sim_init_param(const sim_model *m, int which, int i, int j);

/* Token `token` of sample `sample` of optimizer step `step`: its input x[d_in] and
 * target t[d_out] (t = sin of a fixed random projection of x).  f32 values. */
void sim_token(const sim_model *m, long step, int sample, int token,
               double *x, double *t);

/* Block distribution (as torch.chunk / Megatron): part p of n items split
 * into `parts` nearly equal parts is [*lo, *hi); the first n % parts parts
 * have one item more. */
void sim_split(int n, int parts, int p, int *lo, int *hi);

/* The single-process reference: the unsharded model trained in f64 on the
 * full batch of every step. */
typedef struct sim_reference {
  double *param[SIM_NPARAMS]; /* final parameters, row-major */
  double *loss;                   /* loss[s]: the loss at step s (before its
                                     update), `steps` entries */
  int steps;
} sim_reference;

/* Train the reference for `steps` steps.  Returns 0, or -1 when out of
 * memory (*ref is then empty). */
int sim_reference_train(const sim_model *m, int steps,
                            sim_reference *ref);
void sim_reference_free(sim_reference *ref);

/* Element count of parameter `which` of the full model. */
long sim_param_count(const sim_model *m, int which);

#endif
