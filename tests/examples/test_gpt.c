/* Tests of the GPT example: a finite-difference gradient check of the
 * single-process model, and parallel runs on thread ranks (tp, tp + sp,
 * cp, dp, pp and their mixes; replicated and sharded data parallel, HSDP)
 * equal to the reference: the loss of every step, every gradient after
 * step 1's sync (in shard mode: each rank's owned ranges), every parameter
 * after the last step.  Tolerances as in gpt_main.c.  And one mpirun job
 * of the gpt program (--mpi) when the build has MPI. */
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train.h"
#include "gpt_data.h"


Test(gpt, finite_difference_gradients) {
  gpt_config c = {.n_layer = 2, .d_model = 16, .n_head = 4, .seq = 8, .batch = 2,
                  .micro = 1, .lr = 1e-3f, .seed = 3};
  size_t len;
  uint8_t *data = load_data(&len);
  gpt_model m;
  cr_assert_eq(gpt_model_init(&m, &c, NULL, 0, c.n_layer, 1, 1, c.batch, 1, NULL), 0);
  /* Move the zero biases and unit gains off their init so every path of
   * the backward is exercised. */
  for (int id = 0; id < m.nt; id++)
    for (size_t i = 0; i < m.n[id]; i++)
      m.p[id][i] += 0.05f * sinf((float)(7 * id + 3 * (int)i));
  uint8_t seqs[2 * 9];
  for (int b = 0; b < c.batch; b++) gpt_sequence(&c, data, len, 0, b, seqs + b * (c.seq + 1));
  const double ntok = (double)c.batch * c.seq;
  gpt_forward(&m, 0, seqs, NULL, NULL, (float)(1.0 / ntok));
  gpt_backward(&m, 0, NULL, NULL);
  int checked = 0;
  for (int id = 0; id < m.nt; id++) {
    /* the largest gradient element and 7 others spread over the tensor */
    size_t pick[8] = {0};
    for (size_t i = 0; i < m.n[id]; i++)
      if (fabsf(m.g[id][i]) > fabsf(m.g[id][pick[0]])) pick[0] = i;
    for (int k = 1; k < 8; k++) pick[k] = ((size_t)k * m.n[id] / 7 + (size_t)k) % m.n[id];
    for (int k = 0; k < 8; k++) {
      size_t i = pick[k];
      float keep = m.p[id][i];
      /* f32 loss: eps small enough for the curvature of LayerNorm and
       * softmax, large enough for rounding (~1e-7 of the loss / eps) */
      const float eps = 2e-3f;
      m.p[id][i] = keep + eps;
      double lp = gpt_forward(&m, 0, seqs, NULL, NULL, 1.0f) / ntok;
      m.p[id][i] = keep - eps;
      double lm = gpt_forward(&m, 0, seqs, NULL, NULL, 1.0f) / ntok;
      m.p[id][i] = keep;
      double fd = (lp - lm) / (2.0 * eps), an = m.g[id][i];
      char name[48];
      gpt_tensor_name(id, name, sizeof name);
      cr_expect_leq(fabs(fd - an), 2e-4 + 5e-3 * fmax(fabs(fd), fabs(an)),
                    "%s[%zu]: finite difference %.6g, backward %.6g", name, i, fd, an);
      checked++;
    }
  }
  cr_assert_eq(checked, 8 * m.nt);
  gpt_model_free(&m);
  free(data);
}

static void check_cfg(const gpt_config *cfg, const char *mesh, int sp, int shard) {
  const gpt_config c = *cfg;
  const int steps = 3;
  const char *what = shard ? (sp ? " sp shard" : " shard") : (sp ? " sp" : "");
  size_t len;
  gpt_model ref;
  double rloss[3];
  float **g1 = NULL;
  uint8_t *data = reference_run(&c, steps, &len, &ref, rloss, &g1);
  gpt_par_result res;
  gpt_par_opts o = {sp, shard, 0, 0, 0};
  int rc = gpt_parallel_train_opts(&c, data, len, mesh, &o, steps, &ref, g1, &res);
  cr_assert_eq(rc, 0, "%s%s: %s", mesh, what, res.error);
  for (int s = 0; s < steps; s++)
    cr_expect_leq(fabs(res.loss[s] - rloss[s]), 1e-4 * fabs(rloss[s]),
                  "%s%s step %d: loss %.8f, reference %.8f", mesh, what, s + 1,
                  res.loss[s], rloss[s]);
  for (int id = 0; id < res.nt; id++) {
    char name[48];
    gpt_tensor_name(id, name, sizeof name);
    cr_expect(res.grad_err[id] >= 0 && res.grad_err[id] <= 1e-4,
              "%s%s: gradient of %s after step 1: rel err %.3e", mesh, what, name,
              res.grad_err[id]);
    cr_expect(res.param_err[id] >= 0 && res.param_err[id] <= 1e-3,
              "%s%s: %s after step %d: rel err %.3e", mesh, what, name, steps,
              res.param_err[id]);
  }
  gpt_par_result_free(&res);
  for (int id = 0; id < ref.nt; id++) free(g1[id]);
  free(g1);
  gpt_model_free(&ref);
  free(data);
}

static const gpt_config base_cfg = {.n_layer = 2, .d_model = 32, .n_head = 4, .seq = 16,
                                    .batch = 4, .micro = 2, .lr = 3e-3f, .seed = 7};

static void check_mesh_layers(const char *mesh, int sp, int layers) {
  gpt_config c = base_cfg;
  c.n_layer = layers;
  check_cfg(&c, mesh, sp, 0);
}

static void check_mesh(const char *mesh, int sp) { check_mesh_layers(mesh, sp, 2); }

Test(gpt, dp2_tp2) { check_mesh("dp=2,tp=2", 0); }
Test(gpt, dp2_tp2_sp) { check_mesh("dp=2,tp=2", 1); }
Test(gpt, pp2_dp2) { check_mesh("pp=2,dp=2", 0); }
Test(gpt, pp2_tp2) { check_mesh("pp=2,tp=2", 0); }
Test(gpt, pp2_tp2_sp) { check_mesh("pp=2,tp=2", 1); }
Test(gpt, pp2_dp2_tp2_sp) { check_mesh("pp=2,dp=2,tp=2", 1); }
Test(gpt, tp4_sp) { check_mesh("tp=4", 1); }
/* four stages: the middle ones hold neither wte copy */
Test(gpt, pp4_tp2_sp) { check_mesh_layers("pp=4,tp=2", 1, 4); }
Test(gpt, pp4_dp2) { check_mesh_layers("pp=4,dp=2", 0, 4); }

/* Context parallel: each cp rank holds a contiguous chunk of every
 * sequence; K and V all-gathered over cp. */
Test(gpt, cp2_dp2) { check_mesh("cp=2,dp=2", 0); }
Test(gpt, dp2_cp2_tp2) { check_mesh("tp=2,cp=2,dp=2", 0); }
Test(gpt, dp2_cp2_tp2_sp) { check_mesh("tp=2,cp=2,dp=2", 1); }
Test(gpt, pp2_cp2_tp2) { check_mesh("pp=2,cp=2,tp=2", 0); }
Test(gpt, cp4) { check_mesh("cp=4", 0); }

/* Sharded data parallel (mpg_sync MPG_SYNC_SHARD): gradients and AdamW
 * state of the owned ranges only, parameters all-gathered after the step. */
Test(gpt, shard_dp2_cp2_tp2) { check_cfg(&base_cfg, "tp=2,cp=2,dp=2", 0, 1); }
/* sp: the tp-replicated tensors reduce over "dp_cp,tp" and stay unsharded;
 * pp: the tied wte stays unsharded */
Test(gpt, shard_pp2_dp2_tp2_sp) { check_cfg(&base_cfg, "pp=2,dp=2,tp=2", 1, 1); }
/* HSDP: shard over dp_shard, all-reduce the shards over dp_replicate */
Test(gpt, shard_hsdp) {
  gpt_config c = base_cfg;
  c.batch = 8;
  check_cfg(&c, "dp_replicate=2,dp_shard=2,tp=2", 0, 1);
}
/* Three shards of tensors whose sizes do not divide by 3 (d_model 20,
 * wte 5120, wpe 320, qkv.w 1200...). */
Test(gpt, shard_dp3_uneven) {
  gpt_config c = base_cfg;
  c.d_model = 20;
  c.batch = 6;
  check_cfg(&c, "dp=3", 0, 1);
}

/* The comparison catches a real mistake: a run with another seed differs. */
Test(gpt, detects_difference) {
  gpt_config c = {.n_layer = 2, .d_model = 32, .n_head = 4, .seq = 16, .batch = 4,
                  .micro = 1, .lr = 3e-3f, .seed = 7};
  size_t len;
  gpt_model ref;
  double rloss[2];
  uint8_t *data = reference_run(&c, 2, &len, &ref, rloss, NULL);
  c.seed = 8;
  gpt_par_result res;
  cr_assert_eq(gpt_parallel_train(&c, data, len, "dp=2", 0, 2, &ref, NULL, &res), 0);
  double worst = 0;
  for (int id = 0; id < res.nt; id++) worst = fmax(worst, res.param_err[id]);
  cr_expect_gt(worst, 1e-2);
  gpt_par_result_free(&res);
  gpt_model_free(&ref);
  free(data);
}

/* Real processes: `mpirun -np 8 gpt --mpi --mesh pp=2,dp=2,tp=2`, one
 * process per rank (MPI backend, rank and world size from the launcher),
 * every process running the reference, rank 0 printing the comparison
 * and PASS.  The pipeline's sends are batched with the next receive, so
 * MPI's blocking sends cannot deadlock. */
#include "../support/mpirun_util.h"

/* mpirun -np NP gpt --mpi ARGS --steps 5: exit 0, NP processes, PASS. */
static void mpirun_case(int np, const char *args) {
#ifndef GPT_TEST_MPI
  (void)np;
  (void)args;
  cr_skip_test("built without MPI");
#else
  if (system("command -v mpirun >/dev/null 2>&1") != 0) cr_skip_test("mpirun is not installed");
  char cmd[4096], procs[32];
  snprintf(cmd, sizeof cmd, "timeout -k 5 240 " MPIRUN "-np %d '%s' --mpi %s --steps 5", np,
           env_program("MESHPG_GPT_EXE"), args);
  double secs = 0;
  int rc = run(cmd, &secs);
  cr_log_info("%s: exit %d after %.2f s", cmd, rc, secs);
  cr_assert_eq(rc, 0, "%s\nexit code %d after %.2f s; output:\n%s", cmd, rc, secs, out);
  snprintf(procs, sizeof procs, "%d MPI processes", np);
  cr_assert(strstr(out, procs), "%s", out);
  cr_assert(strstr(out, "\nPASS\n"), "%s\nno PASS line; output:\n%s", cmd, out);
#endif
}

Test(gpt, mpirun_pp2_dp2_tp2, .timeout = 300) { mpirun_case(8, "--mesh pp=2,dp=2,tp=2"); }
/* Context parallel with the sharded optimizer, and uneven shards, as processes. */
Test(gpt, mpirun_tp2_cp2_dp2_sp_shard, .timeout = 300) {
  mpirun_case(8, "--mesh tp=2,cp=2,dp=2 --sp --shard");
}
Test(gpt, mpirun_dp3_uneven_shard, .timeout = 300) {
  mpirun_case(3, "--mesh dp=3 --shard --dmodel 20 --batch 6");
}
