/* meshpg sim: N simulated ranks (threads of this process, the thread
 * backend) train a Megatron-style MLP with tp, cp and dp (or an FSDP
 * stand-in over dp), synchronising gradients with mpg_sync exactly like a
 * real trainer; the result is checked against the same model trained in one
 * process.
 *
 * Each rank is a thread that receives its init options from mpg_thread_run
 * and only uses the public API.  The ranks share, read-only, the mesh, the
 * job description and the reference; each writes only its own result slot;
 * only rank 0 prints, and only while the main thread waits. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cmd.h"
#include "sim_model.h"

static const char sim_usage[] =
    "usage: meshpg sim [SPEC.toml] [--mesh dp=2,tp=2,cp=2] [--flatten NAME=d1,d2]...\n"
    "                  [--order tp-cp-dp] [--world N] [--steps K] [--fsdp]\n"
    "                  [--microbatches M] [--seed S] [--timeout SEC] [--quiet]\n"
    "                  [--batch B] [--seq T] [--hidden H] [--lr LR]\n"
    "                  [--bucket-mb MB] [--tol TOL] [--fail-rank R[:STEP]]\n"
    "\n"
    "Run one simulated rank per thread (thread backend): together they train\n"
    "a Megatron-style MLP (column-parallel W1, tanh, row-parallel W2 over tp;\n"
    "tokens split over cp; samples split over dp) with meshpg's gradient sync,\n"
    "then compare every rank's parameters with single-process training.\n"
    "\n"
    "  SPEC.toml          mesh and [sync] settings from a spec file\n"
    "  --mesh DIMS        the dims, outermost first; replaces the spec's dims\n"
    "                     (default without spec or --mesh: dp=2,tp=2,cp=2,\n"
    "                     or dp=auto,tp=2,cp=2 when --world is given)\n"
    "  --flatten N=D,..   add a flattened dim set (repeatable)\n"
    "  --order ORDER      reorder the dims by a Megatron order string\n"
    "  --world N          number of ranks; resolves a -1 dim\n"
    "                     (default: the product of the sizes)\n"
    "  --steps K          SGD steps (default 20)\n"
    "  --fsdp             an FSDP stand-in owns dp: meshpg reduces over cp only,\n"
    "                     the stand-in reduce-scatters over dp, updates its\n"
    "                     1/dp shard and all-gathers the parameters\n"
    "                     (also set by fsdp_owns_dp = true in the spec)\n"
    "  --microbatches M   gradient accumulation over M micro-batches (default 1)\n"
    "  --seed S           seed of the data and the initial weights (default 1)\n"
    "  --timeout SEC      collective timeout of every rank (default: the spec's\n"
    "                     [backend] timeout_s, 600)\n"
    "  --quiet            print only the verdict line (and errors)\n"
    "  --batch B          samples per step (default 2 * dp * M)\n"
    "  --seq T            tokens per sample (default 4 * cp)\n"
    "  --hidden H         hidden units, a multiple of tp (default: 32 rounded\n"
    "                     up to a multiple of tp)\n"
    "  --lr LR            SGD learning rate (default 0.5)\n"
    "  --bucket-mb MB     gradient bucket size in MiB, also caps the first\n"
    "                     bucket (default: the spec's bucket_mb, 25)\n"
    "  --tol TOL          largest relative error that passes (default 1e-5)\n"
    "  --fail-rank R[:S]  testing: rank R stops at step S (default 0) without\n"
    "                     a word to its peers, like a crashed process; they\n"
    "                     must fail with a timeout (see --timeout), not hang\n"
    "\n"
    "Exit status: 0 every rank matches the reference; 1 a rank differs or\n"
    "failed, or the spec is invalid; 2 usage error.\n";

#define D_IN 16
#define D_OUT 8
#define MAX_SETS (MPG_MAX_DIMS + MPG_MAX_FLATTEN)
#define GROUP_STR 48
#define MSG_MAX 400
#define TABLE_ALL_UP_TO 64
#define TABLE_EDGE 16

static const char *const param_names[SIM_NPARAMS] = {"w1", "b1", "w2", "b2"};

/* What one rank reports back; written only by that rank. */
typedef struct sim_result {
  mpg_status status;
  int done;                        /* reached the comparison */
  int injected;                    /* stopped by --fail-rank */
  int started;                     /* its thread ran */
  char msg[MSG_MAX];               /* first failure */
  int coord[MPG_MAX_DIMS];
  char group[MAX_SETS][GROUP_STR]; /* members of its group of each dim set */
  char reduce[GROUP_STR];          /* its sync reduce group, "dp_cp(4)" */
  long shard_lo, shard_hi;         /* FSDP: the flat range it owns */
  double err;                      /* max relative error over its params */
  int worst_param;
  mpg_sync_stats stats;
} sim_result;

/* The job: read-only while the ranks run (results aside). */
typedef struct sim_job {
  const mpg_mesh *mesh;
  sim_model model;
  int steps, microbatches, fsdp, quiet, lazy_groups;
  int fail_rank, fail_step;   /* --fail-rank; -1: none */
  mpg_sync_opts sync_opts;
  int dim_dp, dim_cp, dim_tp; /* mesh dim indices */
  int dp, cp, tp;
  int nsets;                  /* dim sets shown: every one but "world" */
  double grad_factor;         /* the library's (and FSDP's) divisor, undone */
  const sim_reference *ref;
  sim_result *results;
} sim_job;

/* One rank's state. */
typedef struct sim_rank {
  const sim_job *job;
  sim_result *res;
  mpg_init_opts opts;
  mpg_ctx *ctx;
  mpg_sync *sync;
  mpg_group *tp, *dp, *dp_cp;
  int rank, dp_pos, cp_pos, tp_pos, hl;
  long count[SIM_NPARAMS], off[SIM_NPARAMS], nparam;
  int pid[SIM_NPARAMS];
  float *grad[SIM_NPARAMS]; /* views into the sync's buffers */
  float *param;                 /* w1 | b1 | w2 | b2 of this tp rank */
  /* one micro-batch */
  int max_tok;
  float *x, *t, *a, *yp;
  double *dy, *dh, *gacc, *tok;
  /* FSDP */
  long chunk;
  float *shard, *gflat, *gshard;
  char where[96];
} sim_rank;

/* ------------------------------------------------------------------------ */
/* Small helpers                                                             */
/* ------------------------------------------------------------------------ */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int parse_double(const char *flag, const char *s, double lo,
                        int lo_inclusive, double *out) {
  char *end;
  double v = strtod(s, &end);
  if (!*s || *end || !isfinite(v) || v < lo || (!lo_inclusive && v == lo)) {
    tool_error("%s: expected a number %s %g, found \"%s\"", flag,
               lo_inclusive ? ">=" : ">", lo, s);
    return 0;
  }
  *out = v;
  return 1;
}

static int parse_seed(const char *s, uint64_t *out) {
  char *end;
  if (!*s || *s == '-') goto bad;
  unsigned long long v = strtoull(s, &end, 0);
  if (*end) goto bad;
  *out = (uint64_t)v;
  return 1;
bad:
  tool_error("--seed: expected a non-negative integer, found \"%s\"", s);
  return 0;
}

/* "[0,1,4,5]", or "[0,1,...,15] (16)" for long lists. */
static void format_members(char *buf, size_t cap, const int *m, int n) {
  size_t len = 0;
  buf[0] = '\0';
#define APPEND(...)                                                        \
  do {                                                                     \
    int w_ = snprintf(buf + len, cap - len, __VA_ARGS__);                  \
    if (w_ < 0 || (size_t)w_ >= cap - len) return;                         \
    len += (size_t)w_;                                                     \
  } while (0)
  APPEND("[");
  if (n <= 8) {
    for (int i = 0; i < n; i++) APPEND("%s%d", i ? "," : "", m[i]);
    APPEND("]");
  } else {
    APPEND("%d,%d,...,%d] (%d)", m[0], m[1], m[n - 1], n);
  }
#undef APPEND
}

/* ------------------------------------------------------------------------ */
/* One rank                                                                  */
/* ------------------------------------------------------------------------ */

static mpg_status rank_fail(sim_rank *r, mpg_status st, const char *fmt, ...) {
  if (!r->res->msg[0]) {
    char what[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    const char *why = tool_why(st);
    snprintf(r->res->msg, sizeof r->res->msg, "%s%s%s: %s", r->where,
             r->where[0] ? ": " : "", what, why);
  }
  r->res->status = st != MPG_OK ? st : MPG_ERR_STATE;
  return r->res->status;
}

#define TRY(call, ...)                                                     \
  do {                                                                     \
    mpg_status st_ = (call);                                               \
    if (st_ != MPG_OK) return rank_fail(r, st_, __VA_ARGS__);              \
  } while (0)

/* Where element e of parameter k of this tp rank sits in the full model:
 * row i, column j of a matrix with `cols` columns. */
static void global_index(const sim_rank *r, int k, long e, int *i, int *j,
                         int *cols) {
  const sim_model *m = &r->job->model;
  int base = r->tp_pos * r->hl;
  switch (k) {
  case SIM_W1:
    *i = (int)(e / r->hl), *j = base + (int)(e % r->hl), *cols = m->hidden;
    break;
  case SIM_B1: *i = 0, *j = base + (int)e, *cols = m->hidden; break;
  case SIM_W2:
    *i = base + (int)(e / m->d_out), *j = (int)(e % m->d_out), *cols = m->d_out;
    break;
  default: *i = 0, *j = (int)e, *cols = m->d_out; break;
  }
}

/* The groups of this rank, as the context sees them, checked against the
 * mesh's arithmetic. */
static mpg_status rank_groups(sim_rank *r) {
  const sim_job *job = r->job;
  int world = mpg_mesh_world_size(job->mesh);
  int *mine = malloc(sizeof(int) * 2 * (size_t)world);
  if (!mine) return rank_fail(r, MPG_ERR_NOMEM, "group members");
  int *want = mine + world;
  mpg_status st = MPG_OK;
  for (int s = 0; s < job->nsets && st == MPG_OK; s++) {
    mpg_group *g;
    const char *name;
    int gi, pos, gsize;
    mpg_mesh_dimset_info(job->mesh, s, &name, NULL, NULL);
    st = mpg_ctx_group_at(r->ctx, s, &g);
    if (st != MPG_OK) {
      rank_fail(r, st, "group %s", name);
      break;
    }
    mpg_mesh_group_of(job->mesh, s, r->rank, &gi, &pos, &gsize);
    mpg_mesh_group_members(job->mesh, s, gi, want);
    int n = mpg_group_size(g);
    int same = n == gsize && mpg_group_rank(g) == pos && mpg_group_index(g) == gi;
    for (int p = 0; same && p < n; p++)
      same = mpg_group_member(g, p, &mine[p]) == MPG_OK && mine[p] == want[p];
    if (!same) {
      char a[GROUP_STR], b[GROUP_STR];
      format_members(a, sizeof a, mine, n < gsize ? n : gsize);
      format_members(b, sizeof b, want, gsize);
      st = rank_fail(r, MPG_ERR_STATE,
                     "group %s: the context gives index %d position %d of %d "
                     "%s, the mesh says index %d position %d of %d %s",
                     name, mpg_group_index(g), mpg_group_rank(g), n, a, gi, pos,
                     gsize, b);
      break;
    }
    format_members(r->res->group[s], GROUP_STR, mine, n);
  }
  free(mine);
  return st;
}

static mpg_status rank_setup(sim_rank *r) {
  const sim_job *job = r->job;
  const sim_model *m = &job->model;
  snprintf(r->where, sizeof r->where, "rank %d", r->opts.rank);
  TRY(mpg_ctx_create(job->mesh, &r->opts, &r->ctx), "joining the world");
  r->rank = mpg_ctx_rank(r->ctx);
  TRY(mpg_mesh_coord_of(job->mesh, r->rank, r->res->coord), "coordinates");
  r->dp_pos = r->res->coord[job->dim_dp];
  r->cp_pos = r->res->coord[job->dim_cp];
  r->tp_pos = r->res->coord[job->dim_tp];
  mpg_status st = rank_groups(r);
  if (st != MPG_OK) return st;
  TRY(mpg_ctx_group(r->ctx, "tp", &r->tp), "group tp");
  TRY(mpg_ctx_group(r->ctx, "dp", &r->dp), "group dp");
  TRY(mpg_ctx_group(r->ctx, "dp_cp", &r->dp_cp), "group dp_cp");

  /* Parameter shards of this tp rank. */
  r->hl = m->hidden / job->tp;
  r->count[SIM_W1] = (long)m->d_in * r->hl;
  r->count[SIM_B1] = r->hl;
  r->count[SIM_W2] = (long)r->hl * m->d_out;
  r->count[SIM_B2] = m->d_out;
  r->nparam = 0;
  for (int k = 0; k < SIM_NPARAMS; k++) {
    r->off[k] = r->nparam;
    r->nparam += r->count[k];
  }

  /* The synchroniser: registered in forward order, marked in backward. */
  TRY(mpg_sync_create(r->ctx, &job->sync_opts, &r->sync), "mpg_sync_create");
  for (int k = 0; k < SIM_NPARAMS; k++)
    TRY(mpg_sync_add_param(r->sync, param_names[k], (size_t)r->count[k],
                           MPG_F32, NULL, &r->pid[k]),
        "registering %s", param_names[k]);
  TRY(mpg_sync_commit(r->sync), "mpg_sync_commit");
  for (int k = 0; k < SIM_NPARAMS; k++) {
    void *v;
    TRY(mpg_sync_grad(r->sync, r->pid[k], &v), "gradient view of %s",
        param_names[k]);
    r->grad[k] = v;
  }
  mpg_group *rg;
  TRY(mpg_sync_param_group(r->sync, r->pid[SIM_W1], &rg), "reduce group");
  snprintf(r->res->reduce, GROUP_STR, "%s(%d)", mpg_group_name(rg),
           mpg_group_size(rg));

  /* Buffers of one micro-batch. */
  int lo, hi, tlo, thi;
  sim_split(m->batch, job->dp, 0, &lo, &hi); /* part 0 is the largest */
  int samples = hi - lo;
  sim_split(samples, job->microbatches, 0, &lo, &hi);
  sim_split(m->seq, job->cp, 0, &tlo, &thi);
  r->max_tok = (hi - lo) * (thi - tlo);
  size_t nt = (size_t)(r->max_tok > 0 ? r->max_tok : 1);
  r->x = malloc(sizeof(float) * nt * (size_t)m->d_in);
  r->t = malloc(sizeof(float) * nt * (size_t)m->d_out);
  r->a = malloc(sizeof(float) * nt * (size_t)r->hl);
  r->yp = malloc(sizeof(float) * nt * (size_t)m->d_out);
  r->dy = malloc(sizeof(double) * nt * (size_t)m->d_out);
  r->dh = malloc(sizeof(double) * nt * (size_t)r->hl);
  r->gacc = malloc(sizeof(double) * (size_t)r->nparam);
  r->tok = malloc(sizeof(double) * (size_t)(m->d_in + m->d_out));

  /* Parameters: every rank computes its own slice of the initial weights,
   * so no broadcast is needed.  FSDP keeps only a 1/dp shard of the flat
   * parameters between steps, padded to a multiple of dp. */
  long padded = r->nparam;
  if (job->fsdp) {
    r->chunk = (r->nparam + job->dp - 1) / job->dp;
    padded = r->chunk * job->dp;
    r->shard = calloc((size_t)r->chunk, sizeof(float));
    r->gshard = calloc((size_t)r->chunk, sizeof(float));
    r->gflat = calloc((size_t)padded, sizeof(float));
  }
  r->param = calloc((size_t)padded, sizeof(float));
  if (!r->x || !r->t || !r->a || !r->yp || !r->dy || !r->dh || !r->gacc ||
      !r->tok || !r->param ||
      (job->fsdp && (!r->shard || !r->gshard || !r->gflat)))
    return rank_fail(r, MPG_ERR_NOMEM, "buffers of %ld parameters", r->nparam);
  for (int k = 0; k < SIM_NPARAMS; k++)
    for (long e = 0; e < r->count[k]; e++) {
      int i, j, cols;
      global_index(r, k, e, &i, &j, &cols);
      r->param[r->off[k] + e] = (float)sim_init_param(m, k, i, j);
    }
  if (job->fsdp) {
    /* [lo, hi): the real parameters of its chunk (none when dp exceeds
     * the parameter count and the chunk is all padding) */
    long lo = r->dp_pos * r->chunk, hi = lo + r->chunk;
    r->res->shard_lo = lo < r->nparam ? lo : r->nparam;
    r->res->shard_hi = hi < r->nparam ? hi : r->nparam;
    for (long e = r->res->shard_lo; e < r->res->shard_hi; e++)
      r->shard[e - r->res->shard_lo] = r->param[e];
  }
  return MPG_OK;
}

/* Forward and backward of micro-batch `mb` of step `step`; gradients are
 * added to the sync's views and marked ready in backward order.  Adds the
 * sum of squared errors to *sse. */
static mpg_status rank_microbatch(sim_rank *r, long step, int mb, double *sse) {
  const sim_job *job = r->job;
  const sim_model *m = &job->model;
  const int din = m->d_in, dout = m->d_out, hl = r->hl;
  const float *w1 = r->param + r->off[SIM_W1];
  const float *b1 = r->param + r->off[SIM_B1];
  const float *w2 = r->param + r->off[SIM_W2];
  const float *b2 = r->param + r->off[SIM_B2];

  /* dp splits the samples, micro-batches split the rank's samples, cp
   * splits the tokens of every sample. */
  int s_lo, s_hi, m_lo, m_hi, t_lo, t_hi;
  sim_split(m->batch, job->dp, r->dp_pos, &s_lo, &s_hi);
  sim_split(s_hi - s_lo, job->microbatches, mb, &m_lo, &m_hi);
  sim_split(m->seq, job->cp, r->cp_pos, &t_lo, &t_hi);
  int ntok_s = t_hi - t_lo;
  int nt = (m_hi - m_lo) * ntok_s;

  /* Forward: column-parallel W1, tanh, row-parallel W2 (partial sums). */
  for (int n = 0; n < nt; n++) {
    int sample = s_lo + m_lo + n / ntok_s, token = t_lo + n % ntok_s;
    double *x = r->tok, *t = r->tok + din;
    sim_token(m, step, sample, token, x, t);
    for (int i = 0; i < din; i++) r->x[(size_t)n * din + i] = (float)x[i];
    for (int k = 0; k < dout; k++) r->t[(size_t)n * dout + k] = (float)t[k];
    float *a = r->a + (size_t)n * hl;
    for (int j = 0; j < hl; j++) {
      double h = b1[j];
      for (int i = 0; i < din; i++) h += x[i] * (double)w1[(size_t)i * hl + j];
      a[j] = (float)tanh(h);
    }
    for (int k = 0; k < dout; k++) {
      double y = 0.0;
      for (int j = 0; j < hl; j++) y += (double)a[j] * w2[(size_t)j * dout + k];
      r->yp[(size_t)n * dout + k] = (float)y;
    }
  }
  /* g: all-reduce the partial outputs over tp (its conjugate f, on the
   * input, is the identity in forward and an all-reduce of the input's
   * gradient in backward, which this model does not need).  Every member
   * of the tp group holds the same tokens, so all skip an empty batch. */
  if (nt > 0)
    TRY(mpg_all_reduce(r->tp, r->yp, r->yp, (size_t)nt * dout, MPG_F32,
                       MPG_OP_SUM, NULL, NULL),
        "tp all-reduce of the MLP output");

  /* Loss, and dL/dy scaled so that the library's average over dp_cp (or
   * cp, then FSDP's over dp) yields the gradient of the global mean. */
  const double dscale =
      2.0 * job->grad_factor / ((double)m->batch * m->seq * dout);
  for (size_t e = 0; e < (size_t)nt * dout; e++) {
    double y = (double)r->yp[e] + b2[e % (size_t)dout];
    double err = y - (double)r->t[e];
    *sse += err * err;
    r->dy[e] = dscale * err;
  }

  /* Backward, last layer first; each gradient goes straight into its view
   * and is marked ready at once, so its bucket can start reducing. */
  double *g = r->gacc;
  float *view;
  /* b2 (replicated over tp: the same on every tp rank, never reduced over
   * tp) */
  view = r->grad[SIM_B2];
  for (int k = 0; k < dout; k++) g[k] = 0.0;
  for (int n = 0; n < nt; n++)
    for (int k = 0; k < dout; k++) g[k] += r->dy[(size_t)n * dout + k];
  for (int k = 0; k < dout; k++) view[k] += (float)g[k];
  TRY(mpg_sync_mark_ready(r->sync, r->pid[SIM_B2]), "marking b2 ready");
  /* W2 (rows of this tp rank) */
  view = r->grad[SIM_W2];
  for (long e = 0; e < r->count[SIM_W2]; e++) g[e] = 0.0;
  for (int n = 0; n < nt; n++) {
    const float *a = r->a + (size_t)n * hl;
    const double *dy = r->dy + (size_t)n * dout;
    for (int j = 0; j < hl; j++)
      for (int k = 0; k < dout; k++) g[(size_t)j * dout + k] += a[j] * dy[k];
  }
  for (long e = 0; e < r->count[SIM_W2]; e++) view[e] += (float)g[e];
  TRY(mpg_sync_mark_ready(r->sync, r->pid[SIM_W2]), "marking w2 ready");
  /* through tanh to h */
  for (int n = 0; n < nt; n++) {
    const float *a = r->a + (size_t)n * hl;
    const double *dy = r->dy + (size_t)n * dout;
    for (int j = 0; j < hl; j++) {
      double da = 0.0;
      for (int k = 0; k < dout; k++) da += (double)w2[(size_t)j * dout + k] * dy[k];
      r->dh[(size_t)n * hl + j] = da * (1.0 - (double)a[j] * a[j]);
    }
  }
  /* b1 (columns of this tp rank) */
  view = r->grad[SIM_B1];
  for (int j = 0; j < hl; j++) g[j] = 0.0;
  for (int n = 0; n < nt; n++)
    for (int j = 0; j < hl; j++) g[j] += r->dh[(size_t)n * hl + j];
  for (int j = 0; j < hl; j++) view[j] += (float)g[j];
  TRY(mpg_sync_mark_ready(r->sync, r->pid[SIM_B1]), "marking b1 ready");
  /* W1 (columns of this tp rank) */
  view = r->grad[SIM_W1];
  for (long e = 0; e < r->count[SIM_W1]; e++) g[e] = 0.0;
  for (int n = 0; n < nt; n++) {
    const float *x = r->x + (size_t)n * din;
    const double *dh = r->dh + (size_t)n * hl;
    for (int i = 0; i < din; i++)
      for (int j = 0; j < hl; j++) g[(size_t)i * hl + j] += x[i] * dh[j];
  }
  for (long e = 0; e < r->count[SIM_W1]; e++) view[e] += (float)g[e];
  TRY(mpg_sync_mark_ready(r->sync, r->pid[SIM_W1]), "marking w1 ready");
  return MPG_OK;
}

/* The optimizer step on synchronised gradients. */
static mpg_status rank_update(sim_rank *r) {
  const sim_job *job = r->job;
  const double lr = job->model.lr;
  if (!job->fsdp) {
    for (int k = 0; k < SIM_NPARAMS; k++) {
      float *p = r->param + r->off[k];
      for (long e = 0; e < r->count[k]; e++)
        p[e] = (float)((double)p[e] - lr * (double)r->grad[k][e]);
    }
    return MPG_OK;
  }
  /* FSDP stand-in: gradients (already averaged over cp by meshpg) into
   * one flat padded buffer, averaged over dp and scattered: this rank gets
   * the gradient of its own shard, and updates only that. */
  for (int k = 0; k < SIM_NPARAMS; k++)
    memcpy(r->gflat + r->off[k], r->grad[k], sizeof(float) * (size_t)r->count[k]);
  TRY(mpg_reduce_scatter(r->dp, r->gflat, r->gshard, (size_t)r->chunk, MPG_F32,
                         MPG_OP_AVG, NULL, NULL),
      "FSDP reduce-scatter over dp");
  long own = r->res->shard_hi - r->res->shard_lo;
  for (long e = 0; e < own; e++)
    r->shard[e] = (float)((double)r->shard[e] - lr * (double)r->gshard[e]);
  return MPG_OK;
}

/* FSDP: every rank's shard, gathered into the full flat parameters. */
static mpg_status rank_gather(sim_rank *r) {
  TRY(mpg_all_gather(r->dp, r->shard, r->param, (size_t)r->chunk, MPG_F32,
                     NULL, NULL),
      "FSDP all-gather of the parameters over dp");
  return MPG_OK;
}

static mpg_status rank_train(sim_rank *r) {
  const sim_job *job = r->job;
  const sim_model *m = &job->model;
  int every = job->steps >= 10 ? job->steps / 10 : 1;
  for (long s = 0; s < job->steps; s++) {
    snprintf(r->where, sizeof r->where, "rank %d, step %ld", r->rank, s);
    if (r->rank == job->fail_rank && s == job->fail_step) {
      r->res->injected = 1;
      r->res->status = MPG_ERR_ABORTED;
      snprintf(r->res->msg, sizeof r->res->msg,
               "%s: stopped by --fail-rank without a word to its peers",
               r->where);
      return MPG_ERR_ABORTED;
    }
    if (job->fsdp) {
      mpg_status st = rank_gather(r);
      if (st != MPG_OK) return st;
    }
    double sse = 0.0;
    for (int mb = 0; mb < job->microbatches; mb++) {
      int last = mb == job->microbatches - 1;
      TRY(mpg_sync_begin(r->sync, s, last, NULL), "mpg_sync_begin");
      mpg_status st = rank_microbatch(r, s, mb, &sse);
      if (st != MPG_OK) return st;
      /* finish closes every micro-batch; it communicates (and waits) on
       * the last one only. */
      TRY(mpg_sync_finish(r->sync), "mpg_sync_finish");
      if (last) {
        if (!mpg_sync_grads_valid(r->sync))
          return rank_fail(r, MPG_ERR_STATE,
                           "mpg_sync_finish returned MPG_OK but the gradients "
                           "are not valid");
      }
    }
    if (!job->quiet && ((s + 1) % every == 0 || s + 1 == job->steps)) {
      /* The loss of the step: every dp_cp group covers every token once. */
      TRY(mpg_all_reduce(r->dp_cp, &sse, &sse, 1, MPG_F64, MPG_OP_SUM, NULL,
                         NULL),
          "loss all-reduce");
      if (r->rank == 0) {
        printf("step %ld/%d loss %.6g (reference %.6g)\n", s + 1, job->steps,
               sse / ((double)m->batch * m->seq * m->d_out), job->ref->loss[s]);
        fflush(stdout);
      }
    }
    mpg_status st = rank_update(r);
    if (st != MPG_OK) return st;
    TRY(mpg_sync_zero_grads(r->sync), "mpg_sync_zero_grads");
  }
  snprintf(r->where, sizeof r->where, "rank %d, after training", r->rank);
  if (job->fsdp) {
    mpg_status st = rank_gather(r);
    if (st != MPG_OK) return st;
  }
  return MPG_OK;
}

/* Compare with the matching slice of the reference. */
static void rank_compare(sim_rank *r) {
  const sim_reference *ref = r->job->ref;
  double worst = 0.0;
  int worst_k = 0;
  for (int k = 0; k < SIM_NPARAMS; k++) {
    double diff = 0.0, scale = 0.0;
    for (long e = 0; e < r->count[k]; e++) {
      int i, j, cols;
      global_index(r, k, e, &i, &j, &cols);
      double want = ref->param[k][(size_t)i * cols + j];
      double d = fabs((double)r->param[r->off[k] + e] - want);
      if (!(d <= diff)) diff = d; /* NaN sticks */
      if (fabs(want) > scale) scale = fabs(want);
    }
    double rel = diff / (scale > 1e-30 ? scale : 1e-30);
    if (!(rel <= worst)) {
      worst = rel;
      worst_k = k;
    }
  }
  r->res->err = worst;
  r->res->worst_param = worst_k;
}

static void rank_free(sim_rank *r) {
  mpg_sync_destroy(r->sync);
  mpg_ctx_destroy(r->ctx);
  free(r->x);
  free(r->t);
  free(r->a);
  free(r->yp);
  free(r->dy);
  free(r->dh);
  free(r->gacc);
  free(r->tok);
  free(r->param);
  free(r->shard);
  free(r->gflat);
  free(r->gshard);
}

static mpg_status rank_main(const mpg_init_opts *opts, void *arg) {
  const sim_job *job = arg;
  sim_rank *r = calloc(1, sizeof *r); /* rank threads have small stacks */
  if (!r) {
    job->results[opts->rank].started = 1;
    job->results[opts->rank].status = MPG_ERR_NOMEM;
    snprintf(job->results[opts->rank].msg, MSG_MAX, "rank %d: out of memory",
             opts->rank);
    return MPG_ERR_NOMEM;
  }
  r->job = job;
  r->res = &job->results[opts->rank];
  r->res->started = 1;
  r->opts = *opts; /* as received from mpg_thread_run ... */
  r->opts.lazy_groups = job->lazy_groups; /* ... plus the spec's choice */
  r->rank = opts->rank;
  mpg_status st = rank_setup(r);
  if (st == MPG_OK) st = rank_train(r);
  if (st == MPG_OK) {
    rank_compare(r);
    mpg_sync_stats stats = MPG_SYNC_STATS_INIT;
    mpg_sync_get_stats(r->sync, &stats);
    r->res->stats = stats;
    r->res->done = 1;
  } else if (r->ctx && !r->res->injected) {
    /* Wake the peers now instead of letting them reach their timeout.  (A
     * rank stopped by --fail-rank leaves without a word, as a crashed
     * process would: its peers must find out by their timeout.) */
    mpg_ctx_abort(r->ctx);
  }
  r->res->status = st;
  rank_free(r);
  free(r);
  return st;
}

/* ------------------------------------------------------------------------ */
/* The command                                                               */
/* ------------------------------------------------------------------------ */

static int find_dim(const mpg_spec *spec, const char *name) {
  for (int d = 0; d < spec->ndims; d++)
    if (strcmp(spec->dims[d].name, name) == 0) return d;
  return -1;
}

/* Give the spec what the model needs: dims dp, cp and tp (a missing one is
 * added with size 1, innermost) and the flattened set dp_cp. */
static int complete_spec(mpg_spec *spec, char *added, size_t cap) {
  static const char *const need[3] = {"dp", "cp", "tp"};
  added[0] = '\0';
  for (int k = 0; k < 3; k++) {
    if (find_dim(spec, need[k]) >= 0) continue;
    if (spec->ndims >= MPG_MAX_DIMS) {
      tool_error("the mesh has no dim \"%s\" and no room to add one "
                 "(at most %d dims)", need[k], MPG_MAX_DIMS);
      return 0;
    }
    mpg_dim *d = &spec->dims[spec->ndims++];
    memset(d, 0, sizeof *d);
    snprintf(d->name, sizeof d->name, "%s", need[k]);
    d->size = 1;
    size_t len = strlen(added);
    snprintf(added + len, cap - len, "%s%s=1", len ? ", " : "", need[k]);
  }
  int have = 0;
  for (int f = 0; f < spec->nflatten; f++)
    if (strcmp(spec->flatten[f].name, "dp_cp") == 0) have = 1;
  if (!have) {
    const char *dims =
        find_dim(spec, "dp") < find_dim(spec, "cp") ? "dp,cp" : "cp,dp";
    mpg_status st = mpg_spec_add_flatten(spec, "dp_cp", dims);
    if (st != MPG_OK) {
      tool_fail(st, NULL);
      return 0;
    }
    size_t len = strlen(added);
    snprintf(added + len, cap - len, "%sdp_cp=[%s]", len ? ", " : "", dims);
  }
  mpg_status st = mpg_spec_validate(spec);
  if (st != MPG_OK) {
    tool_fail(st, NULL);
    return 0;
  }
  return 1;
}

/* The mesh must be the model's: dims other than dp, cp, tp of size 1, and
 * dp_cp exactly the dims dp and cp. */
static int check_mesh(const mpg_mesh *mesh, sim_job *job) {
  int nd = mpg_mesh_ndims(mesh);
  job->dim_dp = job->dim_cp = job->dim_tp = -1;
  for (int d = 0; d < nd; d++) {
    const char *name;
    int size;
    mpg_mesh_dim(mesh, d, &name, &size);
    if (strcmp(name, "dp") == 0) job->dim_dp = d, job->dp = size;
    else if (strcmp(name, "cp") == 0) job->dim_cp = d, job->cp = size;
    else if (strcmp(name, "tp") == 0) job->dim_tp = d, job->tp = size;
    else if (size != 1) {
      tool_error("sim: the model is parallel over dp, cp and tp only; "
                 "dim \"%s\" must have size 1, found %d", name, size);
      return 0;
    }
  }
  int set, dims[MPG_MAX_DIMS], n;
  mpg_status st = mpg_mesh_dimset_find(mesh, "dp_cp", &set);
  if (st == MPG_OK) st = mpg_mesh_dimset_dims(mesh, set, dims, &n);
  if (st != MPG_OK) {
    tool_fail(st, NULL);
    return 0;
  }
  int ok = n == 2;
  for (int i = 0; ok && i < n; i++)
    ok = dims[i] == job->dim_dp || dims[i] == job->dim_cp;
  if (!ok) {
    tool_error("sim: the flattened set dp_cp must hold exactly the dims "
               "dp and cp (gradients are averaged over it)");
    return 0;
  }
  job->nsets = mpg_mesh_num_dimsets(mesh) - 1; /* all but "world" */
  return 1;
}

static void print_row_sep(int width) {
  for (int i = 0; i < width; i++) putchar('-');
  putchar('\n');
}

static void print_table(const sim_job *job, int world) {
  const mpg_mesh *mesh = job->mesh;
  int nd = mpg_mesh_ndims(mesh);
  int wset[MAX_SETS], wred = 6;
  for (int s = 0; s < job->nsets; s++) {
    const char *name;
    mpg_mesh_dimset_info(mesh, s, &name, NULL, NULL);
    wset[s] = (int)strlen(name);
    for (int r = 0; r < world; r++) {
      int l = (int)strlen(job->results[r].group[s]);
      if (l > wset[s]) wset[s] = l;
    }
  }
  for (int r = 0; r < world; r++) {
    int l = (int)strlen(job->results[r].reduce);
    if (l > wred) wred = l;
  }
  int width = printf("%5s ", "rank");
  for (int d = 0; d < nd; d++) {
    const char *name;
    mpg_mesh_dim(mesh, d, &name, NULL);
    width += printf(" %3s", name);
  }
  width += printf("  ");
  for (int s = 0; s < job->nsets; s++) {
    const char *name;
    mpg_mesh_dimset_info(mesh, s, &name, NULL, NULL);
    width += printf(" %-*s", wset[s], name);
  }
  width += printf("  %-*s", wred, "reduce");
  if (job->fsdp) width += printf("  %-13s", "fsdp shard");
  width += printf("  %s\n", "max rel err") - 1;
  print_row_sep(width);
  for (int r = 0; r < world; r++) {
    const sim_result *res = &job->results[r];
    int failed = res->status != MPG_OK || !res->done;
    if (world > TABLE_ALL_UP_TO && r >= TABLE_EDGE && r < world - TABLE_EDGE &&
        !failed) {
      if (r == TABLE_EDGE) printf("  ... (ranks %d..%d not shown)\n", TABLE_EDGE,
                                  world - TABLE_EDGE - 1);
      continue;
    }
    printf("%5d ", r);
    for (int d = 0; d < nd; d++) printf(" %3d", res->coord[d]);
    printf("  ");
    for (int s = 0; s < job->nsets; s++)
      printf(" %-*s", wset[s], res->group[s][0] ? res->group[s] : "?");
    printf("  %-*s", wred, res->reduce[0] ? res->reduce : "?");
    if (job->fsdp) {
      char sh[32];
      snprintf(sh, sizeof sh, "[%ld,%ld)", res->shard_lo, res->shard_hi);
      printf("  %-13s", res->done ? sh : "?");
    }
    if (res->done)
      printf("  %.1e\n", res->err);
    else
      printf("  failed: %s\n", mpg_status_name(res->status));
  }
}

int cmd_sim(int argc, char **argv) {
  tool_spec args = {0};
  int steps = 20, fsdp = 0, micro = 1, quiet = 0;
  int batch = 0, seq = 0, hidden = 0;
  double timeout = 0.0, lr = 0.5, bucket_mb = 0.0, tol = 1e-5;
  uint64_t seed = 1;
  int fail_rank = -1, fail_step = 0;

  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      fputs(sim_usage, stdout);
      return TOOL_EXIT_OK;
    } else if (strcmp(a, "--fsdp") == 0) {
      fsdp = 1;
    } else if (strcmp(a, "--quiet") == 0 || strcmp(a, "-q") == 0) {
      quiet = 1;
    } else if (strcmp(a, "--steps") == 0 || strcmp(a, "--microbatches") == 0 ||
               strcmp(a, "--seed") == 0 || strcmp(a, "--timeout") == 0 ||
               strcmp(a, "--batch") == 0 || strcmp(a, "--seq") == 0 ||
               strcmp(a, "--hidden") == 0 || strcmp(a, "--lr") == 0 ||
               strcmp(a, "--bucket-mb") == 0 || strcmp(a, "--tol") == 0 ||
               strcmp(a, "--fail-rank") == 0) {
      if (i + 1 >= argc) {
        tool_error("%s needs a value", a);
        fputs(sim_usage, stderr);
        return TOOL_EXIT_USAGE;
      }
      const char *v = argv[++i];
      int ok = 1;
      if (strcmp(a, "--steps") == 0) {
        ok = tool_parse_int(a, v, 1, &steps);
      } else if (strcmp(a, "--microbatches") == 0) {
        ok = tool_parse_int(a, v, 1, &micro);
      } else if (strcmp(a, "--batch") == 0) {
        ok = tool_parse_int(a, v, 1, &batch);
      } else if (strcmp(a, "--seq") == 0) {
        ok = tool_parse_int(a, v, 1, &seq);
      } else if (strcmp(a, "--hidden") == 0) {
        ok = tool_parse_int(a, v, 1, &hidden);
      } else if (strcmp(a, "--seed") == 0) {
        ok = parse_seed(v, &seed);
      } else if (strcmp(a, "--timeout") == 0) {
        ok = parse_double(a, v, 0.0, 0, &timeout);
      } else if (strcmp(a, "--lr") == 0) {
        ok = parse_double(a, v, 0.0, 0, &lr);
      } else if (strcmp(a, "--fail-rank") == 0) {
        char rbuf[32];
        const char *colon = strchr(v, ':');
        size_t n = colon ? (size_t)(colon - v) : strlen(v);
        if (n >= sizeof rbuf) n = sizeof rbuf - 1;
        memcpy(rbuf, v, n);
        rbuf[n] = '\0';
        ok = tool_parse_int("--fail-rank", rbuf, 0, &fail_rank) &&
             (!colon || tool_parse_int("--fail-rank step", colon + 1, 0,
                                       &fail_step));
      } else if (strcmp(a, "--bucket-mb") == 0) {
        ok = parse_double(a, v, 0.0, 0, &bucket_mb);
      } else {
        ok = parse_double(a, v, 0.0, 1, &tol);
      }
      if (!ok) return TOOL_EXIT_USAGE;
    } else {
      int took = tool_spec_arg(&args, argc, argv, &i, sim_usage);
      if (took < 0) return TOOL_EXIT_USAGE;
      if (!took) {
        tool_error("unknown option \"%s\"", a);
        fputs(sim_usage, stderr);
        return TOOL_EXIT_USAGE;
      }
    }
  }
  int world = args.world;

  /* The spec: a file, --mesh, or the seed mesh of DESIGN.md. */
  mpg_spec spec = MPG_SPEC_INIT;
  mpg_status st = tool_spec_load(
      &args, world ? "dp=-1,tp=2,cp=2" : "dp=2,tp=2,cp=2", &spec);
  if (st != MPG_OK) return tool_fail(st, NULL);
  char added[160];
  if (!complete_spec(&spec, added, sizeof added)) return TOOL_EXIT_FAIL;
  mpg_mesh *mesh = NULL;
  st = mpg_mesh_create(&spec, world, &mesh);
  if (st != MPG_OK) return tool_fail(st, NULL);
  int world_size = mpg_mesh_world_size(mesh);

  sim_job job;
  memset(&job, 0, sizeof job);
  job.mesh = mesh;
  int rc = TOOL_EXIT_FAIL;
  sim_reference ref;
  memset(&ref, 0, sizeof ref);
  if (!check_mesh(mesh, &job)) goto out;

  /* The model and its data. */
  if (hidden == 0) hidden = (32 + job.tp - 1) / job.tp * job.tp;
  if (hidden % job.tp != 0) {
    tool_error("--hidden: %d hidden units do not split over tp=%d "
               "(give a multiple of %d)", hidden, job.tp, job.tp);
    goto out;
  }
  job.model.seed = seed;
  job.model.d_in = D_IN;
  job.model.d_out = D_OUT;
  job.model.hidden = hidden;
  job.model.batch = batch ? batch : 2 * job.dp * micro;
  job.model.seq = seq ? seq : 4 * job.cp;
  job.model.lr = lr;
  job.steps = steps;
  job.microbatches = micro;
  job.quiet = quiet;
  job.lazy_groups = spec.lazy_groups;
  job.fsdp = fsdp || spec.fsdp_owns_dp;
  job.fail_rank = fail_rank;
  job.fail_step = fail_step;
  if (fail_rank >= world_size) {
    tool_error("--fail-rank: rank %d is outside the world of %d ranks",
               fail_rank, world_size);
    goto out;
  }

  mpg_sync_opts sopts = MPG_SYNC_OPTS_INIT;
  st = mpg_sync_opts_from_spec(&spec, &sopts);
  if (st != MPG_OK) {
    tool_fail(st, NULL);
    goto out;
  }
  sopts.fsdp_owns_dp = job.fsdp;
  sopts.default_dims = NULL;
  if (bucket_mb > 0) {
    sopts.bucket_mb = bucket_mb;
    if (sopts.first_bucket_mb > bucket_mb) sopts.first_bucket_mb = bucket_mb;
  }
  job.sync_opts = sopts;
  /* The divisor the reductions apply, which each rank's gradient carries
   * in advance: dp*cp (avg over dp_cp), or cp (meshpg) times dp (FSDP). */
  double lib_div = sopts.op == MPG_OP_AVG
                       ? (double)(job.fsdp ? job.cp : job.dp * job.cp)
                       : 1.0;
  job.grad_factor = lib_div * (job.fsdp ? job.dp : 1);
  if (timeout <= 0) timeout = spec.timeout_s > 0 ? spec.timeout_s : 600.0;

  if (!quiet) {
    int nd = mpg_mesh_ndims(mesh);
    printf("meshpg sim: mesh");
    for (int d = 0; d < nd; d++) {
      const char *name;
      int size;
      mpg_mesh_dim(mesh, d, &name, &size);
      printf("%s%s=%d", d ? " x " : " ", name, size);
    }
    printf(" (world %d%s%s), %d rank%s as threads\n", world_size,
           spec.source[0] ? ", from " : "", spec.source, world_size,
           world_size == 1 ? "" : "s");
    if (added[0]) printf("  added for the model: %s\n", added);
    if (spec.backend != MPG_BACKEND_THREAD)
      printf("  (the spec's backend is not used: sim always runs the thread "
             "backend)\n");
    printf("model: MLP %d -> %d (tanh) -> %d; W1, b1 column-parallel and W2 "
           "row-parallel over tp=%d (%d hidden units each), b2 replicated\n",
           D_IN, hidden, D_OUT, job.tp, hidden / job.tp);
    printf("data: %d samples x %d tokens per step (seed %llu): dp=%d splits "
           "the samples, cp=%d the tokens; %d micro-batch%s\n",
           job.model.batch, job.model.seq, (unsigned long long)seed, job.dp,
           job.cp, micro, micro == 1 ? "" : "es");
    const char *verb = sopts.op == MPG_OP_AVG ? "averages" : "sums";
    if (job.fsdp) {
      long per = (long)D_IN * (hidden / job.tp) + hidden / job.tp +
                 (long)(hidden / job.tp) * D_OUT + D_OUT;
      long chunk = (per + job.dp - 1) / job.dp;
      printf("sync: meshpg %s gradients over cp (%d ranks); the FSDP stand-in "
             "reduce-scatters them over dp (%d ranks): each rank owns %ld of "
             "the %ld parameters of its tp rank (%ld padding)\n",
             verb, job.cp, job.dp, chunk, per, chunk * job.dp - per);
    } else {
      printf("sync: meshpg %s gradients over dp_cp (%d ranks)\n", verb,
             job.dp * job.cp);
    }
    printf("training: %d SGD steps, lr %g, compared with single-process f64 "
           "training (tolerance %.0e)\n",
           steps, lr, tol);
    fflush(stdout);
  }

  double t0 = now_s();
  if (sim_reference_train(&job.model, steps, &ref) != 0) {
    tool_error("out of memory for the reference model");
    goto out;
  }
  double t_ref = now_s() - t0;
  job.ref = &ref;
  job.results = calloc((size_t)world_size, sizeof(sim_result));
  if (!job.results) {
    tool_error("out of memory for %d ranks", world_size);
    goto out;
  }
  t0 = now_s();
  st = mpg_thread_run(world_size, timeout, rank_main, &job, NULL);
  double t_run = now_s() - t0;
  /* A rank that never got to run leaves its slot empty. */
  int started = 0;
  for (int r = 0; r < world_size; r++) started += job.results[r].started;
  if (st != MPG_OK && started == 0) {
    /* mpg_thread_run refused the world (size, threads): no rank ran */
    tool_fail(st, NULL);
    goto out;
  }
  int failed = 0, first_failed = -1, bad = 0, worst_rank = 0;
  double worst = 0.0;
  for (int r = 0; r < world_size; r++) {
    sim_result *res = &job.results[r];
    if (res->status != MPG_OK || !res->done) {
      if (res->status == MPG_OK) res->status = st != MPG_OK ? st : MPG_ERR_STATE;
      if (first_failed < 0) first_failed = r;
      failed++;
      continue;
    }
    if (!(res->err <= tol)) bad++;
    if (!(res->err <= worst)) {
      worst = res->err;
      worst_rank = r;
    }
  }
  if (st != MPG_OK && failed == 0) {
    /* every rank finished, yet the run failed */
    tool_fail(st, NULL);
    goto out;
  }

  if (!quiet) {
    putchar('\n');
    print_table(&job, world_size);
    const sim_result *r0 = &job.results[0];
    if (r0->done)
      printf("\nsync on rank 0: %d params, %d buffer%s, %d bucket%s, %zu bytes "
             "of gradients, %ld bucket launches\n",
             r0->stats.num_params, r0->stats.num_buffers,
             r0->stats.num_buffers == 1 ? "" : "s", r0->stats.num_buckets,
             r0->stats.num_buckets == 1 ? "" : "s", r0->stats.total_bytes,
             r0->stats.launched_buckets);
    printf("time: %d ranks x %d steps %.3f s (%.2f ms/step), reference %.3f s\n",
           world_size, steps, t_run, 1e3 * t_run / steps, t_ref);
  }
  if (failed) {
    /* The root cause first: a rank stopped on purpose, then one that
     * failed by itself, then the first timeout, then an abort. */
    int root = first_failed, best = 4;
    for (int r = 0; r < world_size; r++) {
      const sim_result *x = &job.results[r];
      if (x->status == MPG_OK) continue;
      int prio = x->injected                          ? 0
                 : x->status == MPG_ERR_ABORTED       ? 3
                 : x->status == MPG_ERR_TIMEOUT       ? 2
                 : x->msg[0]                          ? 1
                                                      : 3;
      if (prio < best) {
        best = prio;
        root = r;
      }
    }
    const sim_result *res = &job.results[root];
    printf("FAIL: %d of %d ranks failed; rank %d: %s\n", failed, world_size,
           root, res->msg[0] ? res->msg : mpg_status_name(res->status));
    fflush(stdout); /* the verdict before the details on stderr */
    int shown = 0;
    for (int r = 0; r < world_size && shown < 4; r++) {
      if (r == root || job.results[r].status == MPG_OK) continue;
      if (job.results[r].msg[0]) {
        tool_error("%s", job.results[r].msg);
        shown++;
      }
    }
  } else if (bad) {
    printf("FAIL: %d of %d ranks differ from the single-process reference "
           "(max rel err %.1e > %.0e at rank %d, param %s)\n",
           bad, world_size, worst, tol, worst_rank,
           param_names[job.results[worst_rank].worst_param]);
  } else {
    printf("PASS: all %d rank%s match%s the single-process reference "
           "(max rel err %.1e <= %.0e)\n",
           world_size, world_size == 1 ? "" : "s", world_size == 1 ? "es" : "",
           worst, tol);
    rc = TOOL_EXIT_OK;
  }

out:
  fflush(stdout);
  free(job.results);
  sim_reference_free(&ref);
  mpg_mesh_destroy(mesh);
  return rc;
}
