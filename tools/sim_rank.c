/* The life of one simulated rank of `meshpg sim` once set up: the training
 * loop (forward, backward with the gradients marked ready as they are
 * made, the sync, the optimizer step on the owned elements, the gather of
 * the params in the shard modes), the comparison with the single-process
 * reference, and the thread's entry point.  See sim_rank_setup.h. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sim_rank_setup.h"

/* Shard modes: at the first use of a param in the step's forward, wait for
 * its bucket of the gather started after the last update (which starts the
 * next bucket's gather). */
static mpg_status rank_first_use(sim_rank *r, int k) {
  if (!r->gather_open || !r->sharded[k]) return MPG_OK; /* replicated: nothing to wait for */
  TRY(mpg_sync_gather_wait(r->ssync, r->pid[k]), "mpg_sync_gather_wait(%s)",
      sim_param_names[k]);
  /* The last sharded param in forward order sits in the last bucket, whose
   * wait ends the gather. */
  if (k == r->last_sharded) r->gather_open = 0;
  return MPG_OK;
}

#define FIRST_USE(k)                                                       \
  do {                                                                     \
    mpg_status fu_ = rank_first_use(r, (k));                               \
    if (fu_ != MPG_OK) return fu_;                                         \
  } while (0)

/* Forward and backward of micro-batch `mb` of step `step`: the sync's step
 * is begun between the two; gradients are added to the sync's views and
 * marked ready in backward order.  Adds the sum of squared errors to
 * *sse. */
static mpg_status rank_microbatch(sim_rank *r, long step, int mb, double *sse) {
  const sim_job *job = r->job;
  const sim_model *m = &job->model;
  const int din = m->d_in, dout = m->d_out, hl = r->hl;
  const float *w1 = r->pv[SIM_W1];
  const float *b1 = r->pv[SIM_B1];
  const float *w2 = r->pv[SIM_W2];
  const float *b2 = r->pv[SIM_B2];

  /* dp splits the samples, micro-batches split the rank's samples, cp
   * splits the tokens of every sample. */
  int s_lo, s_hi, m_lo, m_hi, t_lo, t_hi;
  sim_split(m->batch, job->dp, r->dp_pos, &s_lo, &s_hi);
  sim_split(s_hi - s_lo, job->microbatches, mb, &m_lo, &m_hi);
  sim_split(m->seq, job->cp, r->cp_pos, &t_lo, &t_hi);
  int ntok_s = t_hi - t_lo;
  int nt = (m_hi - m_lo) * ntok_s;

  /* Forward: column-parallel W1, tanh, row-parallel W2 (partial sums);
   * in the shard modes each param is waited for at its first use. */
  FIRST_USE(SIM_W1);
  FIRST_USE(SIM_B1);
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
  }
  FIRST_USE(SIM_W2);
  for (int n = 0; n < nt; n++) {
    const float *a = r->a + (size_t)n * hl;
    for (int k = 0; k < dout; k++) {
      double y = 0.0;
      for (int j = 0; j < hl; j++) y += (double)a[j] * w2[(size_t)j * dout + k];
      r->yp[(size_t)n * dout + k] = (float)y;
    }
  }
  /* g: all-reduce the partial outputs over tp (its conjugate f, on the
   * input, is the identity in forward and an all-reduce of the input's
   * gradient in backward, which this model does not need).  An empty
   * micro-batch (more micro-batches than samples) still issues it, on one
   * token of zeros: every rank issues the same collectives in the same
   * order (the issue-order rule), only the counts of separate tp groups
   * differ. */
  if (nt == 0)
    for (int k = 0; k < dout; k++) r->yp[k] = 0.0f;
  TRY(mpg_all_reduce(r->tp, r->yp, r->yp, (size_t)(nt > 0 ? nt : 1) * dout, MPG_F32,
                     MPG_OP_SUM, NULL, NULL),
      "tp all-reduce of the MLP output");

  /* Loss, and dL/dy scaled so that the library's average over dp_cp (or
   * over cp and then dp with --fsdp) yields the gradient of the global
   * mean. */
  FIRST_USE(SIM_B2);
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
  int last = mb == job->microbatches - 1;
  TRY(mpg_sync_begin(r->sync, step, last, NULL), "mpg_sync_begin");
  double *g = r->gacc;
  float *view;
  /* b2 (replicated over tp: the same on every tp rank; in the shard modes
   * registered with reduce dims that include tp, like a sequence-parallel
   * norm, so that it takes the replicated path) */
  view = r->grad[SIM_B2];
  for (int k = 0; k < dout; k++) g[k] = 0.0;
  for (int n = 0; n < nt; n++)
    for (int k = 0; k < dout; k++) g[k] += r->dy[(size_t)n * dout + k];
  for (int k = 0; k < dout; k++) view[k] += (float)(g[k] * job->b2_factor);
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

/* --fsdp: the gradients the first sync averaged over cp go through the
 * sharded sync, which reduce-scatters them over dp (each rank keeps the
 * averaged gradient of the elements it owns). */
static mpg_status rank_fsdp_reduce(sim_rank *r, long step) {
  TRY(mpg_sync_begin(r->ssync, step, 1, NULL), "mpg_sync_begin of the sharded sync");
  for (int k = SIM_NPARAMS - 1; k >= 0; k--) {
    memcpy(r->sgrad[k], r->grad[k], sizeof(float) * (size_t)r->count[k]);
    TRY(mpg_sync_mark_ready(r->ssync, r->pid[k]), "marking %s ready in the sharded sync",
        sim_param_names[k]);
  }
  TRY(mpg_sync_finish(r->ssync), "mpg_sync_finish of the sharded sync");
  if (!mpg_sync_grads_valid(r->ssync))
    return sim_rank_fail(r, MPG_ERR_STATE,
                         "mpg_sync_finish returned MPG_OK but the sharded gradients "
                         "are not valid");
  return MPG_OK;
}

/* The optimizer step on synchronised gradients: every param's range (all
 * of it when replicated, the owned part in the shard modes) from the
 * gradient at the same place, with the state of those elements; then, in
 * the shard modes, start gathering the updated params. */
static mpg_status rank_update(sim_rank *r, long step) {
  const sim_job *job = r->job;
  if (job->mode == SIM_FSDP) {
    mpg_status st = rank_fsdp_reduce(r, step);
    if (st != MPG_OK) return st;
  }
  double unused_m = 0.0, unused_v = 0.0;
  for (int k = 0; k < SIM_NPARAMS; k++) {
    float *p = r->pv[k] + r->lo[k];
    const float *g = r->sgrad[k] + r->lo[k];
    for (long e = 0; e < r->n[k]; e++) {
      double *mo = r->mom ? &r->mom[r->st[k] + e] : &unused_m;
      double *va = r->var ? &r->var[r->st[k] + e] : &unused_v;
      double d = sim_opt_delta(&job->model, step + 1, (double)g[e], mo, va);
      p[e] = (float)((double)p[e] - d);
    }
  }
  if (r->ssync) {
    TRY(mpg_sync_gather_begin(r->ssync, NULL), "mpg_sync_gather_begin");
    r->gather_open = 1;
  }
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
    double sse = 0.0;
    for (int mb = 0; mb < job->microbatches; mb++) {
      int last = mb == job->microbatches - 1;
      /* forward, mpg_sync_begin, backward */
      mpg_status st = rank_microbatch(r, s, mb, &sse);
      if (st != MPG_OK) return st;
      /* finish closes every micro-batch; it communicates (and waits) on
       * the last one only. */
      TRY(mpg_sync_finish(r->sync), "mpg_sync_finish");
      if (last) {
        if (!mpg_sync_grads_valid(r->sync))
          return sim_rank_fail(r, MPG_ERR_STATE,
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
    mpg_status st = rank_update(r, s);
    if (st != MPG_OK) return st;
    TRY(mpg_sync_zero_grads(r->sync), "mpg_sync_zero_grads");
    if (r->ssync && r->ssync != r->sync)
      TRY(mpg_sync_zero_grads(r->ssync), "mpg_sync_zero_grads of the sharded sync");
  }
  snprintf(r->where, sizeof r->where, "rank %d, after training", r->rank);
  if (r->gather_open) {
    /* the params of the last update, for the comparison */
    TRY(mpg_sync_gather_all(r->ssync), "mpg_sync_gather_all");
    r->gather_open = 0;
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
      sim_rank_global_index(r, k, e, &i, &j, &cols);
      double want = ref->param[k][(size_t)i * cols + j];
      double d = fabs((double)r->pv[k][e] - want);
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

mpg_status sim_rank_main(const mpg_init_opts *opts, void *arg) {
  const sim_job *job = arg;
  sim_rank *r = calloc(1, sizeof *r); /* rank threads have small stacks */
  if (!r) {
    job->results[opts->rank].started = 1;
    job->results[opts->rank].status = MPG_ERR_NOMEM;
    snprintf(job->results[opts->rank].msg, SIM_MSG_MAX, "rank %d: out of memory",
             opts->rank);
    return MPG_ERR_NOMEM;
  }
  r->job = job;
  r->res = &job->results[opts->rank];
  r->res->started = 1;
  r->opts = *opts; /* as received from mpg_thread_run ... */
  r->opts.backend.lazy_groups = job->lazy_groups; /* ... plus the spec's choice */
  r->rank = opts->rank;
  mpg_status st = sim_rank_setup(r);
  if (st == MPG_OK) st = rank_train(r);
  if (st == MPG_OK) {
    rank_compare(r);
    mpg_sync_stats stats = MPG_SYNC_STATS_INIT;
    mpg_sync_get_stats(r->sync, &stats);
    r->res->stats = stats;
    if (r->ssync) {
      mpg_sync_stats ss = MPG_SYNC_STATS_INIT;
      mpg_sync_get_stats(r->ssync, &ss);
      r->res->shard_stats = ss;
    }
    r->res->done = 1;
  } else if (r->ctx && !r->res->injected) {
    /* Wake the peers now instead of letting them reach their timeout.  (A
     * rank stopped by --fail-rank leaves without a word, as a crashed
     * process would: its peers must find out by their timeout.) */
    mpg_ctx_abort(r->ctx);
  }
  r->res->status = st;
  sim_rank_free(r);
  free(r);
  return st;
}
