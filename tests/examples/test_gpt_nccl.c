/* The GPT example's NCCL path (gpt --nccl) on the CUDA/NCCL test double
 * (tests/double): thread ranks, each on its own simulated device, every
 * collective, p2p batch and the gradient sync staged through device memory
 * (examples/gpt/stage.c).  Each case checks, as test_gpt.c does for the
 * thread backend, the loss of every step, every gradient after step 1's
 * sync and every parameter after the last step against the single-process
 * reference; and then the strongest check: the NCCL run's per-step losses,
 * its step-1 gradient errors and every rank's final parameters equal the
 * thread backend's run of the same mesh bit for bit (the double's
 * reductions are specified to equal the thread backend's). */
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "double.h"
#include "train.h"
#include "gpt_data.h"


static const gpt_config base_cfg = {.n_layer = 2, .d_model = 32, .n_head = 4, .seq = 16,
                                    .batch = 4, .micro = 2, .lr = 3e-3f, .seed = 7};

/* Largest errors of a run against the reference. */
static void check_ref(const char *what, const gpt_par_result *res, const double *rloss,
                      int steps) {
  double lmax = 0, gmax = 0, pmax = 0;
  for (int s = 0; s < steps; s++) {
    double e = fabs(res->loss[s] - rloss[s]) / fabs(rloss[s]);
    lmax = fmax(lmax, e);
    cr_expect_leq(e, 1e-4, "%s step %d: loss %.8f, reference %.8f", what, s + 1,
                  res->loss[s], rloss[s]);
  }
  for (int id = 0; id < res->nt; id++) {
    char name[48];
    gpt_tensor_name(id, name, sizeof name);
    gmax = fmax(gmax, res->grad_err[id]);
    pmax = fmax(pmax, res->param_err[id]);
    cr_expect(res->grad_err[id] >= 0 && res->grad_err[id] <= 1e-4,
              "%s: gradient of %s after step 1: rel err %.3e", what, name, res->grad_err[id]);
    cr_expect(res->param_err[id] >= 0 && res->param_err[id] <= 1e-3,
              "%s: %s after step %d: rel err %.3e", what, name, steps, res->param_err[id]);
  }
  cr_log_info("%s: max rel err loss %.3e, step-1 grads %.3e, params %.3e", what, lmax, gmax,
              pmax);
  fprintf(stderr, "%s: max rel err loss %.3e, step-1 grads %.3e, params %.3e\n", what, lmax,
          gmax, pmax);
}

static void check_nccl(const gpt_config *cfg, const char *mesh, int sp, int shard) {
  const gpt_config c = *cfg;
  const int steps = 3;
  char what[160];
  snprintf(what, sizeof what, "%s%s%s", mesh, sp ? " sp" : "", shard ? " shard" : "");
  size_t len;
  gpt_model ref;
  double rloss[3];
  float **g1 = NULL;
  uint8_t *data = reference_run(&c, steps, &len, &ref, rloss, &g1);

  gpt_par_result thr, nc;
  gpt_par_opts o = {sp, shard, 0, 0, 1};
  cr_assert_eq(gpt_parallel_train_opts(&c, data, len, mesh, &o, steps, &ref, g1, &thr), 0,
               "%s on thread ranks: %s", what, thr.error);
  o.nccl = 1;
  dbl_stats_t before, after;
  dbl_stats(&before);
  cr_assert_eq(gpt_parallel_train_opts(&c, data, len, mesh, &o, steps, &ref, g1, &nc), 0,
               "%s on NCCL: %s", what, nc.error);
  dbl_stats(&after);
  /* The run went through the double's NCCL: at least one operation per
   * rank and step. */
  cr_assert_geq(after.collectives - before.collectives, (uint64_t)(nc.world * steps),
                "%s: only %llu NCCL operations ran", what,
                (unsigned long long)(after.collectives - before.collectives));
  fprintf(stderr, "%s: %llu NCCL operations on the double\n", what,
          (unsigned long long)(after.collectives - before.collectives));

  char w[200];
  snprintf(w, sizeof w, "%s [nccl on the double]", what);
  check_ref(w, &nc, rloss, steps);
  snprintf(w, sizeof w, "%s [thread]", what);
  check_ref(w, &thr, rloss, steps);

  /* Bit for bit against the thread backend. */
  for (int s = 0; s < steps; s++)
    cr_expect(memcmp(&nc.loss[s], &thr.loss[s], sizeof(double)) == 0,
              "%s step %d: NCCL loss %.17g, thread loss %.17g", what, s + 1, nc.loss[s],
              thr.loss[s]);
  cr_assert_eq(nc.world, thr.world);
  int tensors = 0, differ = 0;
  for (int id = 0; id < nc.nt; id++) {
    char name[48];
    gpt_tensor_name(id, name, sizeof name);
    cr_expect(memcmp(&nc.grad_err[id], &thr.grad_err[id], sizeof(double)) == 0,
              "%s: step-1 gradient error of %s: NCCL %.17g, thread %.17g", what, name,
              nc.grad_err[id], thr.grad_err[id]);
    for (int r = 0; r < nc.world; r++) {
      const size_t i = (size_t)r * (size_t)nc.nt + (size_t)id;
      cr_assert_eq(nc.rank_count[i], thr.rank_count[i], "%s rank %d %s", what, r, name);
      cr_assert_eq(nc.rank_params[i] == NULL, thr.rank_params[i] == NULL);
      if (!nc.rank_params[i]) continue;
      tensors++;
      if (memcmp(nc.rank_params[i], thr.rank_params[i], nc.rank_count[i] * sizeof(float))) {
        differ++;
        size_t k = 0;
        while (nc.rank_params[i][k] == thr.rank_params[i][k]) k++;
        cr_expect_fail("%s rank %d: %s after step %d differs from the thread run at "
                       "element %zu: %.9g vs %.9g", what, r, name, steps, k,
                       (double)nc.rank_params[i][k], (double)thr.rank_params[i][k]);
      }
    }
  }
  cr_assert_gt(tensors, 0);
  fprintf(stderr, "%s: NCCL vs thread: %d of %d rank tensors differ, losses %s\n", what,
          differ, tensors,
          memcmp(nc.loss, thr.loss, (size_t)steps * sizeof(double)) ? "differ" : "equal");

  gpt_par_result_free(&thr);
  gpt_par_result_free(&nc);
  for (int id = 0; id < ref.nt; id++) free(g1[id]);
  free(g1);
  gpt_model_free(&ref);
  free(data);
}

/* tp + cp + dp: the tp and cp collectives and the replicate-mode sync. */
Test(gpt_nccl, dp2_cp2_tp2, .timeout = 600) { check_nccl(&base_cfg, "tp=2,cp=2,dp=2", 0, 0); }
/* The pipeline's p2p batches, the tied wte over pp {0, P-1}, sp's all-gather /
 * reduce-scatter and the "dp_cp,tp" reduce group. */
Test(gpt_nccl, pp2_dp2_tp2_sp, .timeout = 600) { check_nccl(&base_cfg, "pp=2,dp=2,tp=2", 1, 0); }
/* Shard mode: device parameter views, owned ranges staged up after AdamW,
 * gathered tensors staged down at their first use. */
Test(gpt_nccl, shard_dp2_cp2_tp2, .timeout = 600) {
  check_nccl(&base_cfg, "tp=2,cp=2,dp=2", 0, 1);
}
/* Shard mode with pp (the tied wte stays unsharded) and sp (the
 * tp-replicated tensors reduce over "dp_cp,tp" and stay unsharded). */
Test(gpt_nccl, shard_pp2_dp2_tp2_sp, .timeout = 600) {
  check_nccl(&base_cfg, "pp=2,dp=2,tp=2", 1, 1);
}
/* HSDP: reduce-scatter over dp_shard, all-reduce of the shards over
 * dp_replicate, gather over dp_shard. */
Test(gpt_nccl, shard_hsdp, .timeout = 600) {
  gpt_config c = base_cfg;
  c.batch = 8;
  check_nccl(&c, "dp_replicate=2,dp_shard=2,tp=2", 0, 1);
}
