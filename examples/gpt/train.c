/* The parallel trainer: one thread per rank (mpg_thread_run), each with its
 * own meshpg context on the mesh "pp=P,dp=D,tp=T" (tp innermost).
 *
 *  - tp: Megatron tensor parallel inside gpt_forward / gpt_backward (model.c)
 *    over the "tp" group, optionally sequence parallel (--sp).
 *  - dp: each dp rank takes its slice of the global batch; gradients are
 *    averaged over "dp" by mpg_sync, written straight into its views and
 *    marked ready as each layer's backward ends.
 *  - pp: layers split over stages, 1F1B over the micro-batches, activations
 *    and their gradients moved with mpg_p2p_batch over "pp"; wte lives on
 *    the first stage (embedding) and the last (LM head), tied through
 *    mpg_ctx_group_select("pp", {0, P-1}) so the sync sums both gradients.
 */
#include "train.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int gpt_parse_mesh(const char *s, int *pp, int *dp, int *tp) {
  *pp = *dp = *tp = 1;
  char buf[256];
  snprintf(buf, sizeof buf, "%s", s);
  for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
       tok = strtok_r(NULL, ",", &save)) {
    char name[16];
    int v;
    if (sscanf(tok, " %15[a-z] = %d", name, &v) != 2 || v < 1) return -1;
    if (!strcmp(name, "pp")) *pp = v;
    else if (!strcmp(name, "dp")) *dp = v;
    else if (!strcmp(name, "tp")) *tp = v;
    else return -1;
  }
  return 0;
}

double gpt_shard_error(const gpt_config *c, int id, int tp, int r, const float *a,
                       size_t n, const float *ref_full, int skip_key_bias) {
  const size_t C = (size_t)c->d_model;
  const int kb = skip_key_bias && gpt_tensor_layer(id) >= 0 && gpt_tensor_kind(id) == L_QKVB;
  double e2 = 0.0, r2 = 0.0;
  for (size_t i = 0; i < n; i++) {
    size_t f = gpt_shard_to_full(c, id, tp, r, i);
    if (kb && f >= C && f < 2 * C) continue;
    double ref = ref_full[f], d = (double)a[i] - ref;
    e2 += d * d;
    r2 += ref * ref;
  }
  return r2 > 0 ? sqrt(e2 / r2) : sqrt(e2);
}

typedef struct job {
  gpt_config cfg;
  const uint8_t *data;
  size_t len;
  mpg_mesh *mesh;
  int P, D, T, sp, steps;
  const gpt_model *ref;
  float *const *ref_grads1;
  gpt_par_result *res;
  double *perr, *gerr; /* [world][nt] */
} job;

typedef struct rank_state {
  mpg_sync *sync;
  int *param_of;    /* tensor id -> sync param id */
  int *partial;     /* gradient is a partial sum over tp (sp): scale by tp */
  float **grad;
  size_t *count;
  int last_mb, T;
  mpg_status err;
} rank_state;

static void on_ready(void *arg, int id) {
  rank_state *rs = arg;
  if (rs->param_of[id] < 0) return;
  /* A sequence-parallel replicated parameter's gradient is a partial sum
   * over tp (each tp rank saw its chunk of the sequence) reduced with
   * reduce_dims "dp,tp"; the sync averages over dp x tp, so pre-multiply
   * by tp to get the sum over tp and the mean over dp.  (tp is a power of
   * two in practice, so this is exact.) */
  if (rs->last_mb && rs->partial[id])
    for (size_t i = 0; i < rs->count[id]; i++) rs->grad[id][i] *= (float)rs->T;
  mpg_status st = mpg_sync_mark_ready(rs->sync, rs->param_of[id]);
  if (st != MPG_OK && rs->err == MPG_OK) rs->err = st;
}

static mpg_status p2p(mpg_group *pp, mpg_p2p_kind kind, int peer, float *buf, size_t n) {
  mpg_p2p_op op = {kind, peer, buf, n, MPG_F32};
  return mpg_p2p_batch(pp, &op, 1, NULL, NULL);
}

#define CHECK(expr)                                                              \
  do {                                                                           \
    st = (expr);                                                                 \
    if (st != MPG_OK) {                                                          \
      fprintf(stderr, "gpt rank %d: %s failed: %s\n", rank, #expr, mpg_last_error()); \
      goto out;                                                                  \
    }                                                                            \
  } while (0)

static mpg_status rank_main(const mpg_init_opts *opts, void *arg) {
  job *J = arg;
  const gpt_config *c = &J->cfg;
  mpg_ctx *ctx = NULL;
  mpg_sync *sync = NULL;
  gpt_model m;
  memset(&m, 0, sizeof m);
  rank_state rs;
  memset(&rs, 0, sizeof rs);
  uint8_t *seqs = NULL;
  float *buf_in = NULL, *buf_out = NULL;
  int rank = opts->rank;
  mpg_status st = mpg_ctx_create(J->mesh, opts, &ctx);
  if (st != MPG_OK) return st;
  rank = mpg_ctx_rank(ctx);
  int coord[3];
  CHECK(mpg_mesh_coord_of(J->mesh, rank, coord));
  const int P = J->P, D = J->D, T = J->T, sp = J->sp;
  const int ps = coord[0], dr = coord[1], tr = coord[2];
  mpg_group *g_tp, *g_pp, *g_world, *tied = NULL;
  CHECK(mpg_ctx_group(ctx, "tp", &g_tp));
  CHECK(mpg_ctx_group(ctx, "pp", &g_pp));
  CHECK(mpg_ctx_group(ctx, "world", &g_world));
  if (P > 1) {
    int pos[2] = {0, P - 1};
    CHECK(mpg_ctx_group_select(ctx, "pp", pos, 2, &tied));
  }
  CHECK(mpg_sync_create(ctx, NULL, &sync)); /* default: average over dp */
  const int nt = gpt_num_tensors(c);
  const int lo = ps * (c->n_layer / P), hi = lo + c->n_layer / P;
  const int first = ps == 0, last = ps == P - 1;
  rs.sync = sync;
  rs.T = T;
  rs.param_of = malloc(sizeof(int) * (size_t)nt);
  rs.partial = calloc((size_t)nt, sizeof(int));
  rs.grad = calloc((size_t)nt, sizeof(float *));
  rs.count = calloc((size_t)nt, sizeof(size_t));
  if (!rs.param_of || !rs.partial || !rs.grad || !rs.count) { st = MPG_ERR_NOMEM; goto out; }
  /* Register in forward order, with each rank's local shard size.
   * Embeddings, LayerNorms, row-parallel biases and the LM head are
   * replicated over tp (the simplest correct choice): without sp every tp
   * rank computes the same gradient for them, so they are reduced over dp
   * only; with sp each tp rank sees only its chunk of the sequence, so
   * they are reduced over "dp,tp". */
  for (int id = 0; id < nt; id++) {
    rs.param_of[id] = -1;
    if (!gpt_tensor_held(id, lo, hi, first, last)) continue;
    mpg_param_opts po = MPG_PARAM_OPTS_INIT;
    if (sp && T > 1 && !gpt_tensor_sharded(id)) {
      po.reduce_dims = "dp,tp";
      rs.partial[id] = 1;
    }
    if (id == GPT_WTE && P > 1) po.tied_group = tied;
    char name[48];
    gpt_tensor_name(id, name, sizeof name);
    rs.count[id] = gpt_tensor_count(c, id, T);
    CHECK(mpg_sync_add_param(sync, name, rs.count[id], MPG_F32, &po, &rs.param_of[id]));
  }
  CHECK(mpg_sync_commit(sync));
  for (int id = 0; id < nt; id++)
    if (rs.param_of[id] >= 0) {
      void *v;
      CHECK(mpg_sync_grad(sync, rs.param_of[id], &v));
      rs.grad[id] = v;
    }
  const int M = c->micro, nb = c->batch / (D * M);
  gpt_comm comm = {g_tp, T, tr, sp, MPG_OK};
  if (gpt_model_init(&m, c, &comm, lo, hi, first, last, nb, M, rs.grad)) {
    st = MPG_ERR_NOMEM;
    goto out;
  }
  m.ready = on_ready;
  m.ready_arg = &rs;
  const size_t hsz = (size_t)m.rows_local * c->d_model;
  seqs = malloc((size_t)nb * (c->seq + 1));
  buf_in = malloc(hsz * sizeof(float));
  buf_out = malloc(hsz * sizeof(float));
  if (!seqs || !buf_in || !buf_out) { st = MPG_ERR_NOMEM; goto out; }
  const int per_dp = c->batch / D;
  const float scale = (float)(1.0 / ((double)per_dp * c->seq));
  for (int step = 0; step < J->steps; step++) {
    double loss = 0.0;
    int fi = 0, bi = 0;
    const int warm = P - ps - 1 < M ? P - ps - 1 : M;
    /* 1F1B: warm-up forwards, then one forward one backward, then the
     * remaining backwards (op k of 2M is a forward when it is one of the
     * warm-up ones or falls on the F of an (F, B) pair). */
    for (int k = 0; k < 2 * M; k++) {
      const int do_fwd = k < warm || (k < 2 * M - warm && (k - warm) % 2 == 0);
      if (do_fwd) {
        for (int b = 0; b < nb; b++)
          gpt_sequence(c, J->data, J->len, step, (long)dr * per_dp + (long)fi * nb + b,
                       seqs + (size_t)b * (c->seq + 1));
        if (!first) CHECK(p2p(g_pp, MPG_P2P_RECV, ps - 1, buf_in, hsz));
        double l = gpt_forward(&m, fi, seqs, buf_in, buf_out, scale);
        if (m.comm.err != MPG_OK) { st = m.comm.err; goto out; }
        if (sp || tr == 0) loss += l; /* without sp tp ranks repeat the loss */
        if (!last) CHECK(p2p(g_pp, MPG_P2P_SEND, ps + 1, buf_out, hsz));
        fi++;
      } else {
        rs.last_mb = bi == M - 1;
        CHECK(mpg_sync_begin(sync, step, rs.last_mb, NULL));
        if (!last) CHECK(p2p(g_pp, MPG_P2P_RECV, ps + 1, buf_in, hsz));
        gpt_backward(&m, bi, buf_in, buf_out);
        if (m.comm.err != MPG_OK) { st = m.comm.err; goto out; }
        if (rs.err != MPG_OK) { st = rs.err; goto out; }
        if (!first) CHECK(p2p(g_pp, MPG_P2P_SEND, ps - 1, buf_out, hsz));
        CHECK(mpg_sync_finish(sync));
        bi++;
      }
    }
    if (step == 0 && J->ref_grads1)
      for (int id = 0; id < nt; id++)
        if (rs.grad[id])
          J->gerr[(size_t)rank * nt + id] = gpt_shard_error(
              c, id, gpt_tensor_sharded(id) ? T : 1, tr, rs.grad[id], rs.count[id],
              J->ref_grads1[id], 0);
    /* Global grad norm: after the sync the dp ranks hold equal gradients,
     * so count dp rank 0 only; tp shards each once, replicated tensors on
     * tp rank 0 only, the tied wte on the first stage only. */
    double red[2] = {loss, 0.0};
    if (dr == 0)
      for (int id = 0; id < nt; id++) {
        if (!rs.grad[id]) continue;
        if (!gpt_tensor_sharded(id) && tr != 0) continue;
        if (id == GPT_WTE && !first) continue;
        red[1] += gpt_grad_sumsq(&m, id);
      }
    CHECK(mpg_all_reduce(g_world, red, red, 2, MPG_F64, MPG_OP_SUM, NULL, NULL));
    /* With the issue-order checker on (MESHPG_CHECK_ORDER=1), close the
     * checked interval here, so that this world collective (the same call
     * on every rank) never shares an interval with the stages' differing
     * programs: only the end stages have the wte gradient to reduce.  A
     * no-op when the checker is off. */
    CHECK(mpg_ctx_check_order(ctx));
    double norm = sqrt(red[1]);
    gpt_adamw(&m, norm > GPT_CLIP ? (float)(GPT_CLIP / norm) : 1.0f);
    CHECK(mpg_sync_zero_grads(sync));
    if (rank == 0) J->res->loss[step] = red[0] / ((double)c->batch * c->seq);
  }
  if (J->ref)
    for (int id = 0; id < nt; id++)
      if (m.p[id])
        J->perr[(size_t)rank * nt + id] =
            gpt_shard_error(c, id, gpt_tensor_sharded(id) ? T : 1, tr, m.p[id],
                            m.n[id], J->ref->p[id], 1);
out:
  free(seqs);
  free(buf_in);
  free(buf_out);
  gpt_model_free(&m);
  free(rs.param_of);
  free(rs.partial);
  free(rs.grad);
  free(rs.count);
  if (sync) mpg_sync_destroy(sync);
  if (st != MPG_OK) mpg_ctx_abort(ctx);
  mpg_ctx_destroy(ctx);
  return st;
}

int gpt_parallel_train(const gpt_config *c, const uint8_t *data, size_t len,
                       const char *mesh_str, int sp, int steps, const gpt_model *ref,
                       float *const *ref_grads1, gpt_par_result *res) {
  memset(res, 0, sizeof *res);
  job J;
  memset(&J, 0, sizeof J);
  J.cfg = *c, J.data = data, J.len = len, J.sp = sp, J.steps = steps;
  J.ref = ref, J.ref_grads1 = ref_grads1, J.res = res;
  if (gpt_parse_mesh(mesh_str, &J.P, &J.D, &J.T)) {
    snprintf(res->error, sizeof res->error, "bad mesh \"%s\" (want e.g. pp=2,dp=2,tp=2)",
             mesh_str);
    return -1;
  }
  const char *why = gpt_config_check(c, J.T, J.P, J.D, sp);
  if (why) {
    snprintf(res->error, sizeof res->error, "%s", why);
    return -1;
  }
  if (len < (size_t)c->seq + 2) {
    snprintf(res->error, sizeof res->error, "data shorter than seq + 2 bytes");
    return -1;
  }
  res->pp = J.P, res->dp = J.D, res->tp = J.T;
  const int nt = gpt_num_tensors(c), world = J.P * J.D * J.T;
  res->steps = steps, res->nt = nt;
  res->loss = calloc((size_t)steps + 1, sizeof(double));
  res->param_err = malloc(sizeof(double) * (size_t)nt);
  res->grad_err = malloc(sizeof(double) * (size_t)nt);
  J.perr = malloc(sizeof(double) * (size_t)nt * world);
  J.gerr = malloc(sizeof(double) * (size_t)nt * world);
  if (!res->loss || !res->param_err || !res->grad_err || !J.perr || !J.gerr) {
    snprintf(res->error, sizeof res->error, "out of memory");
    return -1;
  }
  for (size_t i = 0; i < (size_t)nt * world; i++) J.perr[i] = J.gerr[i] = -1.0;
  char canon[96];
  snprintf(canon, sizeof canon, "pp=%d,dp=%d,tp=%d", J.P, J.D, J.T);
  mpg_spec spec = MPG_SPEC_INIT;
  int rc = -1;
  if (mpg_spec_set_mesh(&spec, canon) != MPG_OK || mpg_spec_validate(&spec) != MPG_OK ||
      mpg_mesh_create(&spec, world, &J.mesh) != MPG_OK) {
    snprintf(res->error, sizeof res->error, "mesh %s: %s", canon, mpg_last_error());
    goto done;
  }
  mpg_status st = mpg_thread_run(world, 120.0, rank_main, &J, NULL);
  if (st != MPG_OK) {
    snprintf(res->error, sizeof res->error, "parallel run failed: %s", mpg_last_error());
    goto done;
  }
  for (int id = 0; id < nt; id++) {
    res->param_err[id] = res->grad_err[id] = -1.0;
    for (int r = 0; r < world; r++) {
      res->param_err[id] = fmax(res->param_err[id], J.perr[(size_t)r * nt + id]);
      res->grad_err[id] = fmax(res->grad_err[id], J.gerr[(size_t)r * nt + id]);
    }
  }
  rc = 0;
done:
  mpg_mesh_destroy(J.mesh);
  free(J.perr);
  free(J.gerr);
  return rc;
}

void gpt_par_result_free(gpt_par_result *res) {
  free(res->loss);
  free(res->param_err);
  free(res->grad_err);
  memset(res, 0, sizeof *res);
}
