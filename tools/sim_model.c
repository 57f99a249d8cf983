/* The MLP of `meshpg sim`: synthetic data and the single-process f64
 * reference.  See sim_model.h. */
#include "sim_model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Tags that keep the hash streams apart. */
enum { TAG_INPUT = 1, TAG_TEACHER = 2, TAG_PARAM = 3 };

static uint64_t mix(uint64_t z) { /* splitmix64's finaliser */
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static uint64_t hash5(uint64_t seed, uint64_t a, uint64_t b, uint64_t c,
                      uint64_t d) {
  uint64_t h = mix(seed);
  h = mix(h ^ a);
  h = mix(h ^ b);
  h = mix(h ^ c);
  return mix(h ^ d);
}

/* A uniform value in [-1, 1) with 24 significant bits: exact in f32. */
static double uniform(uint64_t h) {
  return (double)(h >> 40) * (1.0 / 8388608.0) - 1.0;
}

static double to_f32(double v) { return (double)(float)v; }

long sim_param_count(const sim_model *m, int which) {
  switch (which) {
  case SIM_W1: return (long)m->d_in * m->hidden;
  case SIM_B1: return m->hidden;
  case SIM_W2: return (long)m->hidden * m->d_out;
  default: return m->d_out;
  }
}

double sim_init_param(const sim_model *m, int which, int i, int j) {
  double u = uniform(hash5(m->seed, TAG_PARAM, (uint64_t)which, (uint64_t)i,
                           (uint64_t)j));
  double scale;
  switch (which) {
  case SIM_W1: scale = 1.0 / sqrt((double)m->d_in); break;
  case SIM_W2: scale = 1.0 / sqrt((double)m->hidden); break;
  default: scale = 0.1; break; /* biases: small, but not zero */
  }
  return to_f32(u * scale);
}

void sim_token(const sim_model *m, long step, int sample, int token,
               double *x, double *t) {
  for (int i = 0; i < m->d_in; i++)
    x[i] = uniform(hash5(m->seed, TAG_INPUT, (uint64_t)step,
                         ((uint64_t)(uint32_t)sample << 32) | (uint32_t)token,
                         (uint64_t)i));
  double norm = 2.0 / sqrt((double)m->d_in);
  for (int j = 0; j < m->d_out; j++) {
    double s = 0.0;
    for (int i = 0; i < m->d_in; i++)
      s += x[i] * uniform(hash5(m->seed, TAG_TEACHER, 0, (uint64_t)i,
                                (uint64_t)j));
    t[j] = to_f32(sin(s * norm));
  }
}

double sim_opt_delta(const sim_model *m, long t, double g, double *mom, double *var) {
  if (!m->adam) return m->lr * g;
  *mom = SIM_BETA1 * *mom + (1.0 - SIM_BETA1) * g;
  *var = SIM_BETA2 * *var + (1.0 - SIM_BETA2) * g * g;
  double mhat = *mom / (1.0 - pow(SIM_BETA1, (double)t));
  double vhat = *var / (1.0 - pow(SIM_BETA2, (double)t));
  return m->lr * mhat / (sqrt(vhat) + SIM_EPS);
}

void sim_split(int n, int parts, int p, int *lo, int *hi) {
  int q = n / parts, r = n % parts;
  *lo = p * q + (p < r ? p : r);
  *hi = *lo + q + (p < r ? 1 : 0);
}

void sim_reference_free(sim_reference *ref) {
  for (int k = 0; k < SIM_NPARAMS; k++) {
    free(ref->param[k]);
    ref->param[k] = NULL;
  }
  free(ref->loss);
  ref->loss = NULL;
  ref->steps = 0;
}

int sim_reference_train(const sim_model *m, int steps,
                            sim_reference *ref) {
  const int din = m->d_in, H = m->hidden, dout = m->d_out;
  memset(ref, 0, sizeof *ref);
  double *grad[SIM_NPARAMS] = {0}, *mom[SIM_NPARAMS] = {0}, *var[SIM_NPARAMS] = {0};
  double *x = malloc(sizeof(double) * (size_t)(din + dout + 2 * H + 2 * dout));
  ref->loss = calloc((size_t)(steps > 0 ? steps : 1), sizeof(double));
  int ok = x && ref->loss;
  for (int k = 0; k < SIM_NPARAMS; k++) {
    size_t n = (size_t)sim_param_count(m, k);
    ref->param[k] = malloc(sizeof(double) * n);
    grad[k] = malloc(sizeof(double) * n);
    mom[k] = calloc(n, sizeof(double));
    var[k] = calloc(n, sizeof(double));
    ok = ok && ref->param[k] && grad[k] && mom[k] && var[k];
  }
  if (!ok) {
    for (int k = 0; k < SIM_NPARAMS; k++) free(grad[k]), free(mom[k]), free(var[k]);
    free(x);
    sim_reference_free(ref);
    return -1;
  }
  ref->steps = steps;
  double *w1 = ref->param[SIM_W1], *b1 = ref->param[SIM_B1];
  double *w2 = ref->param[SIM_W2], *b2 = ref->param[SIM_B2];
  for (int i = 0; i < din; i++)
    for (int j = 0; j < H; j++)
      w1[(size_t)i * H + j] = sim_init_param(m, SIM_W1, i, j);
  for (int j = 0; j < H; j++) b1[j] = sim_init_param(m, SIM_B1, 0, j);
  for (int i = 0; i < H; i++)
    for (int j = 0; j < dout; j++)
      w2[(size_t)i * dout + j] = sim_init_param(m, SIM_W2, i, j);
  for (int j = 0; j < dout; j++) b2[j] = sim_init_param(m, SIM_B2, 0, j);

  double *t = x + din, *a = t + dout, *dh = a + H, *y = dh + H, *dy = y + dout;
  const double n_tok = (double)m->batch * m->seq;
  const double dscale = 2.0 / (n_tok * dout);
  for (int s = 0; s < steps; s++) {
    for (int k = 0; k < SIM_NPARAMS; k++)
      memset(grad[k], 0, sizeof(double) * (size_t)sim_param_count(m, k));
    double loss = 0.0;
    for (int b = 0; b < m->batch; b++) {
      for (int tok = 0; tok < m->seq; tok++) {
        sim_token(m, s, b, tok, x, t);
        for (int j = 0; j < H; j++) a[j] = b1[j];
        for (int i = 0; i < din; i++)
          for (int j = 0; j < H; j++) a[j] += x[i] * w1[(size_t)i * H + j];
        for (int j = 0; j < H; j++) a[j] = tanh(a[j]);
        for (int k = 0; k < dout; k++) y[k] = b2[k];
        for (int j = 0; j < H; j++)
          for (int k = 0; k < dout; k++) y[k] += a[j] * w2[(size_t)j * dout + k];
        for (int k = 0; k < dout; k++) {
          double e = y[k] - t[k];
          loss += e * e;
          dy[k] = dscale * e;
        }
        /* backward */
        for (int k = 0; k < dout; k++) grad[SIM_B2][k] += dy[k];
        for (int j = 0; j < H; j++) {
          double da = 0.0;
          for (int k = 0; k < dout; k++) {
            grad[SIM_W2][(size_t)j * dout + k] += a[j] * dy[k];
            da += w2[(size_t)j * dout + k] * dy[k];
          }
          dh[j] = da * (1.0 - a[j] * a[j]);
          grad[SIM_B1][j] += dh[j];
        }
        for (int i = 0; i < din; i++)
          for (int j = 0; j < H; j++)
            grad[SIM_W1][(size_t)i * H + j] += x[i] * dh[j];
      }
    }
    ref->loss[s] = loss / (n_tok * dout);
    for (int k = 0; k < SIM_NPARAMS; k++) {
      long n = sim_param_count(m, k);
      for (long e = 0; e < n; e++)
        ref->param[k][e] -= sim_opt_delta(m, s + 1, grad[k][e], &mom[k][e], &var[k][e]);
    }
  }
  for (int k = 0; k < SIM_NPARAMS; k++) free(grad[k]), free(mom[k]), free(var[k]);
  free(x);
  return 0;
}
