/* Tests of the GPT example's mixture of experts (examples/gpt/moe.h).
 *
 * Thread ranks (test_gpt_moe): a finite-difference check of the MoE
 * model's gradients (router, experts, the load-balancing loss) in one
 * process; the aux loss's value where it is known exactly; parallel runs
 * on world 8 with the expert grid (ep, etp, edp) cut differently from the
 * dense one, equal to the single-process reference (the loss and aux loss
 * of every step, the tokens per expert, every gradient after step 1's sync
 * and every parameter after the last step, each rank's expert shards
 * against the matching slice of the reference's); deliberate bugs (a wrong
 * expert-gradient scale, another aux coefficient) that the comparison
 * catches; shard mode (expert params sharded over edp); the configurations
 * the example refuses; and one mpirun job of
 * the gpt program (--mpi) when the build has MPI.
 *
 * Built again on the CUDA/NCCL test double (GPT_MOE_ON_DOUBLE,
 * test_gpt_moe_on_double): one MoE mesh with --nccl, its all-to-alls
 * staged through device memory, against the reference and bit for bit
 * against the thread backend. */
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe.h"
#include "train.h"
#include "gpt_data.h"

#ifdef GPT_MOE_ON_DOUBLE
#include "double.h"
#endif


/* World 8: dp * micro divides the batch of 8 on every mesh below. */
static const gpt_config moe_cfg = {.n_layer = 2, .d_model = 32, .n_head = 4, .seq = 16,
                                   .batch = 8, .micro = 2, .lr = 3e-3f, .seed = 7,
                                   .moe = 4, .topk = 2, .dense_layers = 0,
                                   .aux_coef = 0.05f, .aux_seqs = 0, .ep = 1, .etp = 0};

static int mesh_dp(const char *mesh) {
  gpt_dims d;
  cr_assert_eq(gpt_parse_mesh(mesh, &d), 0, "bad mesh %s", mesh);
  return d.dp;
}

/* The errors of a parallel run against the reference; returns a summary
 * line's worth in *lmax (loss and aux), *gmax, *pmax. */
static void expect_equal(const char *what, const gpt_config *c, const gpt_model *ref,
                         const gpt_par_result *res, const double *rloss, const double *raux,
                         const double *rimb, int steps, double *lmax, double *gmax,
                         double *pmax) {
  *lmax = *gmax = *pmax = 0.0;
  for (int s = 0; s < steps; s++) {
    const double e = fabs(res->loss[s] - rloss[s]) / fabs(rloss[s]);
    const double ea = fabs(res->aux[s] - raux[s]) / fabs(raux[s]);
    *lmax = fmax(*lmax, fmax(e, ea));
    cr_expect_leq(e, 1e-4, "%s step %d: loss %.8f, reference %.8f", what, s + 1, res->loss[s],
                  rloss[s]);
    cr_expect_gt(raux[s], 0.0, "%s: no aux loss in the reference", what);
    cr_expect_leq(ea, 1e-4, "%s step %d: aux loss %.8f, reference %.8f", what, s + 1,
                  res->aux[s], raux[s]);
    /* tokens per expert summed over the batch: the same routing */
    cr_expect_leq(fabs(res->imbalance[s] - rimb[s]), 1e-9,
                  "%s step %d: tokens per expert max/mean %.6f, reference %.6f", what, s + 1,
                  res->imbalance[s], rimb[s]);
  }
  int experts = 0;
  for (int id = 0; id < res->nt; id++) {
    char name[48];
    gpt_tensor_name_cfg(c, id, name, sizeof name);
    if (!ref->p[id]) { /* a dense MLP id of an MoE layer: nobody holds it */
      cr_expect(res->grad_err[id] < 0 && res->param_err[id] < 0, "%s: %s is held", what, name);
      continue;
    }
    experts += gpt_tensor_expert(c, id);
    *gmax = fmax(*gmax, res->grad_err[id]);
    *pmax = fmax(*pmax, res->param_err[id]);
    cr_expect(res->grad_err[id] >= 0 && res->grad_err[id] <= 1e-4,
              "%s: gradient of %s after step 1: rel err %.3e", what, name, res->grad_err[id]);
    cr_expect(res->param_err[id] >= 0 && res->param_err[id] <= 1e-3,
              "%s: %s after step %d: rel err %.3e", what, name, steps, res->param_err[id]);
  }
  cr_expect_eq(experts, 4 * c->moe * gpt_moe_num_layers(c), "%s: %d expert tensors compared",
               what, experts);
  fprintf(stderr, "%s: max rel err loss/aux %.3e, step-1 grads %.3e, params %.3e\n", what,
          *lmax, *gmax, *pmax);
}

typedef struct run_ref {
  gpt_model model;
  double loss[4], aux[4], imb[4];
  float **g1;
} run_ref;

static void ref_train(const gpt_config *c, const uint8_t *data, size_t len, int steps,
                      run_ref *r) {
  memset(r, 0, sizeof *r);
  cr_assert_eq(gpt_reference_train_moe(c, data, len, steps, &r->model, r->loss, r->aux,
                                       r->imb, &r->g1), 0);
}

static void ref_free(run_ref *r) {
  for (int id = 0; id < r->model.nt; id++) free(r->g1[id]);
  free(r->g1);
  gpt_model_free(&r->model);
}

#ifndef GPT_MOE_ON_DOUBLE

/* ---- one process ---------------------------------------------------------- */

/* d loss / d parameter by central differences against the manual backward,
 * the loss being the mean token loss plus the aux loss (a large aux
 * coefficient, so the router's gradient is mostly the aux loss's), over
 * two load-balancing groups.  A perturbation that changes any token's
 * choice of experts crosses a discontinuity of the loss; such elements
 * are skipped (the routing fingerprint tells) and counted. */
Test(gpt_moe, finite_difference_gradients) {
  gpt_config c = {.n_layer = 2, .d_model = 16, .n_head = 4, .seq = 8, .batch = 4,
                  .micro = 1, .lr = 1e-3f, .seed = 3, .moe = 4, .topk = 2,
                  .dense_layers = 1, .aux_coef = 0.5f, .aux_seqs = 2};
  cr_assert_null(gpt_config_check(&c, 1, 1, 1, 1, 0));
  gpt_model m;
  cr_assert_eq(gpt_model_init(&m, &c, NULL, 0, c.n_layer, 1, 1, c.batch, 1, NULL), 0);
  /* Off the init: biases and gains non-trivial, router logits spread so
   * that routing has margins. */
  for (int id = 0; id < m.nt; id++) {
    const float amp = gpt_moe_decode(&c, id, &(int){0}, &(int){0}, &(int){0}) &&
                              !gpt_tensor_expert(&c, id) ? 0.4f : 0.05f;
    for (size_t i = 0; m.p[id] && i < m.n[id]; i++)
      m.p[id][i] += amp * sinf((float)(7 * id + 3 * (int)i));
  }
  /* Fixed tokens, not sequences drawn from the training text (the header,
   * which changes with every edit): the checks below need margins in the
   * routing, and these four sequences (once drawn from the header) have
   * them: no element's +-eps changes the routing. */
  static const char fixed[4][10] = {"         ", "PG_ERR_ST", "    share", "_BINDING_"};
  uint8_t seqs[4 * 9];
  for (int b = 0; b < c.batch; b++) memcpy(seqs + b * (c.seq + 1), fixed[b], (size_t)c.seq + 1);
  const double ntok = (double)c.batch * c.seq;
  const double aux_w = (double)c.aux_seqs / c.batch; /* the mean over the 2 groups */
  gpt_model_zero_stats(&m);
  double ce = gpt_forward(&m, 0, seqs, NULL, NULL, (float)(1.0 / ntok));
  const double aux0 = m.aux_sum * aux_w;
  cr_assert_gt(aux0, 0.1 * c.aux_coef, "aux loss %.6g", aux0);
  const uint64_t route = gpt_moe_routing_hash(&m, 0);
  gpt_backward(&m, 0, NULL, NULL);
  {
    /* the fingerprint sees a change of routing: one router column pushed
     * far up sends every token to that expert */
    const int rid = gpt_moe_tensor_id(&c, 1, 0, M_ROUTER);
    float *keep = malloc(m.n[rid] * sizeof(float));
    cr_assert_not_null(keep);
    memcpy(keep, m.p[rid], m.n[rid] * sizeof(float));
    for (int i = 0; i < c.d_model; i++) m.p[rid][i * c.moe + 3] = 50.0f * m.p[rid][i * c.moe];
    gpt_model_zero_stats(&m);
    gpt_forward(&m, 0, seqs, NULL, NULL, 1.0f);
    cr_expect_neq(gpt_moe_routing_hash(&m, 0), route, "a new routing, the same fingerprint");
    memcpy(m.p[rid], keep, m.n[rid] * sizeof(float));
    free(keep);
    gpt_model_zero_stats(&m);
    gpt_forward(&m, 0, seqs, NULL, NULL, 1.0f);
    cr_assert_eq(gpt_moe_routing_hash(&m, 0), route);
  }
  (void)ce;
  int checked = 0, skipped = 0, moe_checked = 0;
  for (int id = 0; id < m.nt; id++) {
    if (!m.p[id]) continue;
    const int is_moe = gpt_moe_decode(&c, id, &(int){0}, &(int){0}, &(int){0});
    /* every MoE tensor; of the dense ones the second layer's ln2 (its
     * gradient flows back through the router) and the embeddings */
    if (!is_moe && id != gpt_tensor_id(1, L_LN2G) && id != gpt_tensor_id(1, L_LN2B) &&
        id != GPT_WTE && id != gpt_tensor_id(0, L_FCW))
      continue;
    size_t pick[6] = {0};
    for (size_t i = 0; i < m.n[id]; i++)
      if (fabsf(m.g[id][i]) > fabsf(m.g[id][pick[0]])) pick[0] = i;
    for (int k = 1; k < 6; k++) pick[k] = ((size_t)k * m.n[id] / 5 + (size_t)k) % m.n[id];
    for (int k = 0; k < 6; k++) {
      const size_t i = pick[k];
      const float keep = m.p[id][i], eps = 2e-3f;
      double l[2];
      int same = 1;
      for (int sgn = 0; sgn < 2; sgn++) {
        m.p[id][i] = keep + (sgn ? -eps : eps);
        gpt_model_zero_stats(&m);
        l[sgn] = gpt_forward(&m, 0, seqs, NULL, NULL, 1.0f) / ntok + m.aux_sum * aux_w;
        same = same && gpt_moe_routing_hash(&m, 0) == route;
      }
      m.p[id][i] = keep;
      if (!same) {
        skipped++;
        continue;
      }
      const double fd = (l[0] - l[1]) / (2.0 * eps), an = m.g[id][i];
      char name[48];
      gpt_tensor_name_cfg(&c, id, name, sizeof name);
      cr_expect_leq(fabs(fd - an), 2e-4 + 5e-3 * fmax(fabs(fd), fabs(an)),
                    "%s[%zu]: finite difference %.6g, backward %.6g", name, i, fd, an);
      checked++;
      moe_checked += is_moe;
    }
  }
  /* 1 router + 16 expert tensors, 6 elements each, and 4 dense tensors */
  cr_expect_geq(moe_checked, 17 * 6 * 3 / 4, "only %d MoE elements checked (%d skipped)",
                moe_checked, skipped);
  cr_expect_geq(checked, moe_checked + 12);
  fprintf(stderr, "finite differences: %d elements checked (%d MoE), %d skipped (routing "
          "changed)\n", checked, moe_checked, skipped);
  gpt_model_free(&m);
}

/* A router of zeros: every probability 1/E, every token takes experts
 * 0 .. k-1 (ties go to the lower index), so f_e = 1/k for those, P_e =
 * 1/E, and aux = A * E * k * (1/k) * (1/E) = A per group and MoE layer;
 * tokens per expert max/mean = E / k. */
Test(gpt_moe, aux_loss_of_a_uniform_router) {
  gpt_config c = {.n_layer = 3, .d_model = 16, .n_head = 2, .seq = 8, .batch = 6,
                  .micro = 1, .lr = 1e-3f, .seed = 5, .moe = 6, .topk = 2,
                  .dense_layers = 1, .aux_coef = 0.25f, .aux_seqs = 2};
  size_t len;
  uint8_t *data = load_data(&len);
  gpt_model m;
  cr_assert_eq(gpt_model_init(&m, &c, NULL, 0, c.n_layer, 1, 1, c.batch, 1, NULL), 0);
  for (int l = c.dense_layers; l < c.n_layer; l++) {
    const int id = gpt_moe_tensor_id(&c, l, 0, M_ROUTER);
    memset(m.p[id], 0, m.n[id] * sizeof(float));
  }
  uint8_t seqs[6 * 9];
  for (int b = 0; b < c.batch; b++) gpt_sequence(&c, data, len, 0, b, seqs + b * (c.seq + 1));
  gpt_model_zero_stats(&m);
  gpt_forward(&m, 0, seqs, NULL, NULL, 1.0f);
  /* 3 groups x 2 MoE layers */
  cr_expect_float_eq(m.aux_sum, 6.0 * c.aux_coef, 1e-6, "aux sum %.9g", m.aux_sum);
  cr_expect_float_eq(gpt_moe_imbalance(&c, m.moe_tokens), 3.0, 1e-12);
  for (int l = 0; l < 2; l++)
    for (int e = 0; e < c.moe; e++)
      cr_expect_eq(m.moe_tokens[l * c.moe + e], e < 2 ? c.batch * c.seq : 0,
                   "layer %d expert %d: %g tokens", l, e, m.moe_tokens[l * c.moe + e]);
  gpt_model_free(&m);
  free(data);
}

/* The aux loss's own backward: the gradient with coefficient A minus the
 * gradient with 0 is the aux loss's gradient alone (the routing does not
 * depend on A), checked by central differences of the aux loss value on
 * the router weights, where it is largest, and on the ln2 gain below. */
Test(gpt_moe, aux_loss_gradient) {
  gpt_config c = {.n_layer = 1, .d_model = 16, .n_head = 2, .seq = 8, .batch = 4,
                  .micro = 1, .lr = 1e-3f, .seed = 11, .moe = 4, .topk = 2,
                  .dense_layers = 0, .aux_coef = 1.0f, .aux_seqs = 1};
  gpt_model m;
  cr_assert_eq(gpt_model_init(&m, &c, NULL, 0, c.n_layer, 1, 1, c.batch, 1, NULL), 0);
  const int rid = gpt_moe_tensor_id(&c, 0, 0, M_ROUTER), gid = gpt_tensor_id(0, L_LN2G);
  for (size_t i = 0; i < m.n[rid]; i++) m.p[rid][i] += 0.3f * sinf((float)(5 * i + 1));
  /* Fixed tokens, as in finite_differences above: sequences drawn from the
   * header moved with every edit of it, and the routing margins with them
   * (21 of 40 elements checked after one edit).  These four (once drawn
   * from the header) leave the routing unchanged for most elements. */
  static const char fixed[4][10] = {"cumented ", "_rank;   ", "unt,\n    ", "GE for wo"};
  uint8_t seqs[4 * 9];
  for (int b = 0; b < c.batch; b++) memcpy(seqs + b * (c.seq + 1), fixed[b], (size_t)c.seq + 1);
  const double ntok = (double)c.batch * c.seq, aux_w = (double)c.aux_seqs / c.batch;
  float *gA[2];
  for (int k = 0; k < 2; k++) {
    m.cfg.aux_coef = k ? 1.0f : 0.0f;
    gpt_model_zero_grads(&m);
    gpt_model_zero_stats(&m);
    gpt_forward(&m, 0, seqs, NULL, NULL, (float)(1.0 / ntok));
    gpt_backward(&m, 0, NULL, NULL);
    gA[k] = malloc((m.n[rid] + m.n[gid]) * sizeof(float));
    cr_assert_not_null(gA[k]);
    memcpy(gA[k], m.g[rid], m.n[rid] * sizeof(float));
    memcpy(gA[k] + m.n[rid], m.g[gid], m.n[gid] * sizeof(float));
  }
  const uint64_t route = gpt_moe_routing_hash(&m, 0);
  int checked = 0, nonzero = 0;
  for (size_t j = 0; j < m.n[rid] + m.n[gid]; j += 2) {
    float *p = j < m.n[rid] ? &m.p[rid][j] : &m.p[gid][j - m.n[rid]];
    const float keep = *p, eps = 3e-3f;
    double a[2];
    int same = 1;
    for (int sgn = 0; sgn < 2; sgn++) {
      *p = keep + (sgn ? -eps : eps);
      gpt_model_zero_stats(&m);
      gpt_forward(&m, 0, seqs, NULL, NULL, 1.0f);
      a[sgn] = m.aux_sum * aux_w;
      same = same && gpt_moe_routing_hash(&m, 0) == route;
    }
    *p = keep;
    if (!same) continue;
    const double fd = (a[0] - a[1]) / (2.0 * eps), an = (double)gA[1][j] - gA[0][j];
    cr_expect_leq(fabs(fd - an), 3e-5 + 1e-2 * fmax(fabs(fd), fabs(an)),
                  "element %zu: aux finite difference %.6g, backward %.6g", j, fd, an);
    checked++;
    nonzero += fabs(an) > 1e-4;
  }
  cr_expect_geq(checked, 24, "only %d of 40 elements checked", checked);
  cr_expect_geq(nonzero, checked / 2, "the aux gradient is ~0 on %d of %d", checked - nonzero,
                checked);
  fprintf(stderr, "aux loss gradient: %d elements checked, %d of them non-zero\n", checked,
          nonzero);
  free(gA[0]);
  free(gA[1]);
  gpt_model_free(&m);
}

/* ---- parallel, thread ranks ----------------------------------------------- */

static void check_moe_mode(const gpt_config *cfg, const char *mesh, int sp, int shard) {
  gpt_config c = *cfg;
  c.aux_seqs = c.batch / (mesh_dp(mesh) * c.micro);
  const int steps = 3;
  char what[200];
  snprintf(what, sizeof what, "%s%s%s moe=%d topk=%d ep=%d etp=%d dense=%d", mesh,
           sp ? " sp" : "", shard ? " shard" : "", c.moe, c.topk, c.ep, c.etp,
           c.dense_layers);
  size_t len;
  uint8_t *data = load_data(&len);
  run_ref r;
  ref_train(&c, data, len, steps, &r);
  gpt_par_result res;
  gpt_par_opts o = {.sp = sp, .shard = shard};
  int rc = gpt_parallel_train_opts(&c, data, len, mesh, &o, steps, &r.model, r.g1, &res);
  cr_assert_eq(rc, 0, "%s: %s", what, res.error);
  cr_assert_not_null(res.aux);
  double lmax, gmax, pmax;
  expect_equal(what, &c, &r.model, &res, r.loss, r.aux, r.imb, steps, &lmax, &gmax, &pmax);
  cr_log_info("%s: edp=%d", what, res.edp);
  gpt_par_result_free(&res);
  ref_free(&r);
  free(data);
}

/* One MoE mesh (a test): moe_cfg with the fields given here that are not
 * 0, on mesh (sp: sequence parallel; shard: sharded data parallel). */
typedef struct moe_row {
  const char *mesh;
  int sp, shard;
  int n_layer, moe, topk, ep, etp, dense_layers, micro;
} moe_row;

static void check_row(moe_row r) {
  gpt_config c = moe_cfg;
  if (r.n_layer) c.n_layer = r.n_layer;
  if (r.moe) c.moe = r.moe;
  if (r.topk) c.topk = r.topk;
  if (r.ep) c.ep = r.ep;
  if (r.etp) c.etp = r.etp;
  if (r.dense_layers) c.dense_layers = r.dense_layers;
  if (r.micro) c.micro = r.micro;
  check_moe_mode(&c, r.mesh, r.sp, r.shard);
}

/* etp (1) != tp (2); ep * edp = 4 * 2 = world; experts see rows of two
 * tp ranks' sequence chunks. */
Test(gpt_moe, dp4_tp2_sp_ep4_etp1) { check_row((moe_row){"dp=4,tp=2", 1, 0, .ep = 4, .etp = 1}); }
/* etp 2 (the all-gather / reduce-scatter over etp), cp 2 (the aux
 * statistics over tp then cp), ep * edp = dp * cp = 4. */
Test(gpt_moe, tp2_cp2_dp2_sp_ep2_etp2) {
  check_row((moe_row){"tp=2,cp=2,dp=2", 1, 0, .ep = 2, .etp = 2});
}
/* Stage 0 dense, stage 1 MoE. */
Test(gpt_moe, pp2_dp2_tp2_sp_dense1) {
  check_row((moe_row){"pp=2,dp=2,tp=2", 1, 0, .ep = 2, .etp = 1, .dense_layers = 1});
}
/* Four layers, two dense then two MoE, top-1, one sequence per group. */
Test(gpt_moe, pp2_dp4_dense2_top1) {
  check_row((moe_row){"pp=2,dp=4", 0, 0, .n_layer = 4, .dense_layers = 2, .ep = 4, .etp = 1,
                      .topk = 1});
}
/* Several experts per ep rank: 8 experts over ep 2 (4 each), etp 2. */
Test(gpt_moe, dp4_tp2_sp_e8_ep2_etp2) {
  check_row((moe_row){"dp=4,tp=2", 1, 0, .moe = 8, .ep = 2, .etp = 2});
}
/* 6 experts over ep 2 (3 each), top-3, tp 1: etp defaults to tp. */
Test(gpt_moe, dp8_e6_ep2_top3) {
  check_row((moe_row){"dp=8", 0, 0, .moe = 6, .topk = 3, .ep = 2, .micro = 1});
}

/* Sharded data parallel (a distributed optimizer): dense params shard over
 * dp_cp, expert params over edp (the sync's expert domain), and the grad
 * norm counts each rank's owned ranges of both. */
Test(gpt_moe, shard_dp4_tp2_sp_ep4_etp1) {
  check_row((moe_row){"dp=4,tp=2", 1, 1, .ep = 4, .etp = 1});
}
Test(gpt_moe, shard_tp2_cp2_dp2_sp_ep2_etp2) {
  check_row((moe_row){"tp=2,cp=2,dp=2", 1, 1, .ep = 2, .etp = 2});
}
/* Stage 0 dense (no expert params to shard), stage 1 MoE. */
Test(gpt_moe, shard_pp2_dp2_tp2_sp_dense1) {
  check_row((moe_row){"pp=2,dp=2,tp=2", 1, 1, .ep = 2, .etp = 1, .dense_layers = 1});
}

/* ---- the comparison catches mistakes -------------------------------------- */

/* Expert gradients pre-multiplied by twice the derived scale: every
 * expert tensor's step-1 gradient is off by a factor 2 (rel err 1), the
 * dense ones are not (before clipping). */
Test(gpt_moe, detects_wrong_expert_grad_scale) {
  gpt_config c = moe_cfg;
  c.ep = 4, c.etp = 1, c.aux_seqs = 1, c.expert_grad_bug = 2.0f;
  size_t len;
  uint8_t *data = load_data(&len);
  run_ref r;
  ref_train(&c, data, len, 2, &r);
  gpt_par_result res;
  gpt_par_opts o = {.sp = 1};
  cr_assert_eq(gpt_parallel_train_opts(&c, data, len, "dp=4,tp=2", &o, 2, &r.model, r.g1, &res),
               0, "%s", res.error);
  int bad = 0, experts = 0;
  for (int id = 0; id < res.nt; id++) {
    if (!r.model.p[id]) continue;
    if (gpt_tensor_expert(&c, id)) {
      experts++;
      /* an expert without tokens has a zero gradient either way */
      if (res.grad_err[id] > 0.5) bad++;
    } else {
      cr_expect_leq(res.grad_err[id], 1e-4, "dense tensor %d: %.3e", id, res.grad_err[id]);
    }
  }
  cr_expect_geq(bad, experts / 2, "only %d of %d expert gradients flagged", bad, experts);
  gpt_par_result_free(&res);
  ref_free(&r);
  free(data);
}

/* A parallel run with another aux coefficient than the reference's: its
 * aux loss, its loss and its router gradients differ. */
Test(gpt_moe, detects_other_aux_coefficient) {
  gpt_config c = moe_cfg;
  c.ep = 2, c.etp = 2, c.aux_seqs = 2;
  size_t len;
  uint8_t *data = load_data(&len);
  run_ref r;
  ref_train(&c, data, len, 2, &r);
  c.aux_coef *= 2.0f;
  gpt_par_result res;
  gpt_par_opts o = {.sp = 1};
  cr_assert_eq(
      gpt_parallel_train_opts(&c, data, len, "tp=2,cp=2,dp=2", &o, 2, &r.model, r.g1, &res), 0,
      "%s", res.error);
  cr_expect_gt(fabs(res.aux[0] - r.aux[0]) / r.aux[0], 0.5, "aux %.6g vs %.6g", res.aux[0],
               r.aux[0]);
  cr_expect_gt(fabs(res.loss[0] - r.loss[0]) / r.loss[0], 1e-3);
  const int router = gpt_moe_tensor_id(&c, 0, 0, M_ROUTER);
  cr_expect_gt(res.grad_err[router], 1e-2, "router gradient rel err %.3e",
               res.grad_err[router]);
  gpt_par_result_free(&res);
  ref_free(&r);
  free(data);
}

/* What the example refuses, with a message. */
Test(gpt_moe, refused_configurations) {
  size_t len;
  uint8_t *data = load_data(&len);
  static const struct {
    const char *mesh;
    int sp, shard, moe, ep, etp, aux_seqs;
    const char *msg;
  } bad[] = {
      {"dp=4,tp=2", 0, 0, 4, 4, 1, 2, "needs --sp"},
      {"dp_replicate=2,dp_shard=2,tp=2", 1, 1, 4, 4, 1, 2, "dp_replicate / dp_shard"},
      {"dp=8", 0, 0, 6, 4, 1, 1, "multiple of ep"},
      {"dp=8", 0, 0, 4, 4, 3, 1, "multiple of etp"},
      {"dp=4,tp=2", 1, 0, 4, 4, 1, 1, "aux_seqs"},
      {"dp=2", 0, 0, 0, 2, 1, 4, "need --moe"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    gpt_config c = moe_cfg;
    c.micro = 1; /* aux_seqs = 8 / dp is right */
    c.moe = bad[i].moe, c.ep = bad[i].ep, c.etp = bad[i].etp, c.aux_seqs = bad[i].aux_seqs;
    gpt_par_result res;
    gpt_par_opts o = {.sp = bad[i].sp, .shard = bad[i].shard};
    int rc = gpt_parallel_train_opts(&c, data, len, bad[i].mesh, &o, 1, NULL, NULL, &res);
    cr_expect_eq(rc, -1, "case %zu (%s) ran", i, bad[i].msg);
    cr_expect(strstr(res.error, bad[i].msg), "case %zu: \"%s\" lacks \"%s\"", i, res.error,
              bad[i].msg);
    gpt_par_result_free(&res);
  }
  free(data);
}

/* ---- real processes ------------------------------------------------------- */
#include "../support/mpirun_util.h"

/* mpirun -np 8 gpt --mpi ARGS --steps 4: exit 0, 8 processes, PASS, the
 * MoE lines. */
Test(gpt_moe, mpirun_tp2_cp2_dp2_sp_ep2_etp2, .timeout = 300) {
#ifndef GPT_TEST_MPI
  cr_skip_test("built without MPI");
#else
  if (system("command -v mpirun >/dev/null 2>&1") != 0) cr_skip_test("mpirun is not installed");
  char cmd[4096];
  snprintf(cmd, sizeof cmd,
           "timeout -k 5 240 " MPIRUN "-np 8 '%s' --mpi --mesh tp=2,cp=2,dp=2 --sp --moe 4 "
           "--ep 2 --etp 2 --dense-layers 1 --layers 2 --steps 4",
           env_program("MESHPG_GPT_EXE"));
  double secs = 0;
  int rc = run(cmd, &secs);
  cr_log_info("%s: exit %d after %.2f s", cmd, rc, secs);
  fprintf(stderr, "mpirun MoE job: exit %d after %.2f s\n", rc, secs);
  cr_assert_eq(rc, 0, "%s\nexit code %d after %.2f s; output:\n%s", cmd, rc, secs, out);
  cr_assert(strstr(out, "8 MPI processes"), "%s", out);
  cr_assert(strstr(out, "expert grid ep=2, etp=2, edp=2"), "%s", out);
  cr_assert(strstr(out, "moe: aux loss max rel err"), "%s", out);
  cr_assert(strstr(out, "\nPASS\n"), "%s\nno PASS line; output:\n%s", cmd, out);
#endif
}

#else /* GPT_MOE_ON_DOUBLE */

/* ---- NCCL on the test double ---------------------------------------------- */

/* The all-to-alls (counts and token rows, both ways), the etp all-gather
 * and reduce-scatter and the edp sync staged through device memory: equal
 * to the reference, and to the thread backend's run bit for bit. */
static void check_nccl_moe(const gpt_config *cfg, const char *mesh, int sp) {
  gpt_config c = *cfg;
  c.aux_seqs = c.batch / (mesh_dp(mesh) * c.micro);
  const int steps = 3;
  char what[160];
  snprintf(what, sizeof what, "%s%s moe=%d ep=%d etp=%d", mesh, sp ? " sp" : "", c.moe, c.ep,
           c.etp);
  size_t len;
  uint8_t *data = load_data(&len);
  run_ref r;
  ref_train(&c, data, len, steps, &r);
  gpt_par_result thr, nc;
  gpt_par_opts o = {.sp = sp, .keep_params = 1};
  cr_assert_eq(gpt_parallel_train_opts(&c, data, len, mesh, &o, steps, &r.model, r.g1, &thr), 0,
               "%s on thread ranks: %s", what, thr.error);
  o.nccl = 1;
  dbl_stats_t before, after;
  dbl_stats(&before);
  cr_assert_eq(gpt_parallel_train_opts(&c, data, len, mesh, &o, steps, &r.model, r.g1, &nc), 0,
               "%s on NCCL: %s", what, nc.error);
  dbl_stats(&after);
  cr_assert_geq(after.collectives - before.collectives, (uint64_t)(nc.world * steps));
  double lmax, gmax, pmax;
  char w[200];
  snprintf(w, sizeof w, "%s [nccl on the double]", what);
  expect_equal(w, &c, &r.model, &nc, r.loss, r.aux, r.imb, steps, &lmax, &gmax, &pmax);
  for (int s = 0; s < steps; s++) {
    cr_expect(memcmp(&nc.loss[s], &thr.loss[s], sizeof(double)) == 0,
              "%s step %d: NCCL loss %.17g, thread %.17g", what, s + 1, nc.loss[s], thr.loss[s]);
    cr_expect(memcmp(&nc.aux[s], &thr.aux[s], sizeof(double)) == 0,
              "%s step %d: NCCL aux %.17g, thread %.17g", what, s + 1, nc.aux[s], thr.aux[s]);
  }
  int tensors = 0;
  for (int i = 0; i < nc.world * nc.nt; i++) {
    cr_assert_eq(nc.rank_count[i], thr.rank_count[i]);
    if (!nc.rank_params[i]) continue;
    tensors++;
    cr_expect(memcmp(nc.rank_params[i], thr.rank_params[i],
                     nc.rank_count[i] * sizeof(float)) == 0,
              "%s: rank %d tensor %d differs from the thread run", what, i / nc.nt, i % nc.nt);
  }
  cr_assert_gt(tensors, 0);
  gpt_par_result_free(&thr);
  gpt_par_result_free(&nc);
  ref_free(&r);
  free(data);
}

Test(gpt_moe_nccl, tp2_cp2_dp2_sp_ep2_etp2, .timeout = 600) {
  gpt_config c = moe_cfg;
  c.ep = 2, c.etp = 2;
  check_nccl_moe(&c, "tp=2,cp=2,dp=2", 1);
}

#endif
