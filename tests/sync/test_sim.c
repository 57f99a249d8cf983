/* meshpg sim, run as a real program: simulated ranks (thread backend) train
 * a tp/cp/dp-parallel MLP with meshpg's gradient sync and must match
 * single-process training.  Exit codes: 0 pass, 1 mismatch / failed rank /
 * invalid spec, 2 usage. */
#include <string.h>
#include <unistd.h>

#include "../run_util.h"

/* The run passes and says so for all `world` ranks. */
static void expect_pass(const char *args, int world) {
  char want[96];
  snprintf(want, sizeof want, "PASS: all %d rank%s match", world,
           world == 1 ? "" : "s");
  int rc = cli(args);
  cr_assert_eq(rc, 0, "meshpg %s exited %d:\n%s", args, rc, out);
  cr_assert(strstr(out, want), "meshpg %s: no \"%s\" in:\n%s", args, want, out);
  cr_assert_null(strstr(out, "FAIL"), "%s", out);
}

Test(sim, seed_spec_passes_with_table_and_progress, .timeout = 120) {
  expect_pass("sim examples/seed.toml --steps 20", 8);
  /* progress every 10% of the steps, with the reference loss */
  cr_assert(strstr(out, "step 2/20 loss "), "%s", out);
  cr_assert(strstr(out, "step 20/20 loss "), "%s", out);
  cr_assert(strstr(out, "(reference "), "%s", out);
  /* the per-rank table: rank 5 at (dp=1, tp=0, cp=1), its groups and the
   * library's reduce group */
  cr_assert(strstr(out, "    5    1   0   1   [1,5] [5,7] [4,5] [0,1,4,5]  dp_cp(4)"),
            "%s", out);
  cr_assert(strstr(out, "sync on rank 0: 4 params"), "%s", out);
}

Test(sim, default_mesh_without_spec, .timeout = 120) {
  expect_pass("sim --steps 5", 8);
  cr_assert(strstr(out, "mesh dp=2 x tp=2 x cp=2 (world 8)"), "%s", out);
}

Test(sim, dp1_corner, .timeout = 120) {
  expect_pass("sim --mesh dp=1,cp=4,tp=2 --steps 10", 8);
}

Test(sim, cp1_corner, .timeout = 120) {
  expect_pass("sim --mesh dp=4,cp=1,tp=2 --steps 10", 8);
}

Test(sim, tp1_with_microbatches, .timeout = 120) {
  expect_pass("sim --mesh dp=2,cp=2,tp=1 --microbatches 3 --steps 10", 4);
  cr_assert(strstr(out, "3 micro-batches"), "%s", out);
}

Test(sim, single_rank, .timeout = 120) {
  expect_pass("sim --mesh dp=1,cp=1,tp=1 --steps 5", 1);
}

Test(sim, world_16_infers_dp, .timeout = 120) {
  expect_pass("sim --world 16 --steps 10", 16);
  cr_assert(strstr(out, "mesh dp=4 x tp=2 x cp=2 (world 16)"), "%s", out);
}

Test(sim, world_64_cube, .timeout = 300) {
  expect_pass("sim --mesh dp=4,cp=4,tp=4 --steps 10 --quiet", 64);
}

Test(sim, llama64_spec_with_other_backend_and_flatten, .timeout = 300) {
  /* nccl in the spec: sim always runs the thread backend */
  expect_pass("sim examples/llama64.toml --world 64 --steps 5", 64);
  cr_assert(strstr(out, "sim always runs the thread backend"), "%s", out);
}

Test(sim, spec_with_lazy_groups_sum_op_and_size1_dim, .timeout = 120) {
  /* A size-1 pp dim, cp before tp, an extra flattened set, op = "sum" (the
   * ranks then scale by 1/N only) and lazy groups, from a spec file. */
  char path[] = "/tmp/meshpg_test_sim_XXXXXX";
  int fd = mkstemp(path);
  cr_assert_geq(fd, 0);
  FILE *f = fdopen(fd, "w");
  cr_assert_not_null(f);
  fputs("[mesh]\n"
        "dims = [ { name = \"pp\", size = 1 }, { name = \"dp\", size = 2 },\n"
        "         { name = \"cp\", size = 2 }, { name = \"tp\", size = 2 } ]\n"
        "flatten = { dp_cp = [\"dp\", \"cp\"], cp_tp = [\"cp\", \"tp\"] }\n"
        "[sync]\nop = \"sum\"\n"
        "[backend]\nlazy_groups = true\ntimeout_s = 60\n",
        f);
  fclose(f);
  char args[256];
  snprintf(args, sizeof args, "sim '%s' --steps 10", path);
  expect_pass(args, 8);
  cr_assert(strstr(out, "meshpg sums gradients over dp_cp"), "%s", out);
  cr_assert(strstr(out, "cp_tp"), "%s", out);
  snprintf(args, sizeof args, "sim '%s' --steps 10 --fsdp --quiet", path);
  expect_pass(args, 8);
  remove(path);
}

Test(sim, megatron_order_and_missing_dims, .timeout = 120) {
  /* tp=2,cp=2,dp=2 reordered by "dp-cp-tp" is the mesh tp, cp, dp */
  expect_pass("sim --mesh tp=2,cp=2,dp=2 --order dp-cp-tp --steps 10", 8);
  cr_assert(strstr(out, "mesh tp=2 x cp=2 x dp=2"), "%s", out);
  /* no cp and no dp_cp: both are added */
  expect_pass("sim --mesh dp=4,tp=2 --steps 10", 8);
  cr_assert(strstr(out, "added for the model: cp=1, dp_cp=[dp,cp]"), "%s", out);
}

Test(sim, uneven_splits_and_small_buckets, .timeout = 120) {
  /* 7 samples over dp=3, 5 tokens over cp=2, 2 micro-batches, buckets of
   * about 1 KiB (several per step) */
  expect_pass("sim --mesh dp=3,cp=2,tp=2 --batch 7 --seq 5 --microbatches 2 "
              "--bucket-mb 0.001 --steps 10",
              12);
  cr_assert(strstr(out, " buckets, "), "expected several buckets:\n%s", out);
}

Test(sim, fsdp_flag, .timeout = 120) {
  expect_pass("sim examples/seed.toml --fsdp --steps 20", 8);
  cr_assert(strstr(out, "meshpg averages gradients over cp (2 ranks)"), "%s", out);
  cr_assert(strstr(out, "cp(2)"), "%s", out);
  cr_assert(strstr(out, "fsdp shard"), "%s", out);
}

Test(sim, fsdp_from_spec_with_microbatches, .timeout = 120) {
  expect_pass("sim examples/fsdp.toml --microbatches 2 --steps 10", 8);
  cr_assert(strstr(out, "FSDP stand-in reduce-scatters"), "%s", out);
}

Test(sim, fsdp_with_padding, .timeout = 120) {
  /* tp=1: 16*32 + 32 + 32*8 + 8 = 808 parameters over dp=3: 2 of padding */
  expect_pass("sim --mesh dp=3,cp=2,tp=1 --fsdp --steps 10", 6);
  cr_assert(strstr(out, "(2 padding)"), "%s", out);
  cr_assert(strstr(out, "[540,808)"), "%s", out);
}

Test(sim, fsdp_world_16_uneven, .timeout = 120) {
  expect_pass("sim --mesh dp=5,cp=1,tp=4 --batch 9 --fsdp --steps 10 --quiet", 20);
}

Test(sim, quiet_prints_only_the_verdict, .timeout = 120) {
  expect_pass("sim --quiet --steps 5", 8);
  cr_assert_null(strstr(out, "step "), "%s", out);
  cr_assert_null(strstr(out, "rank "), "%s", out);
}

Test(sim, mismatch_exits_1, .timeout = 120) {
  /* A tolerance nothing in f32 can meet: the check must fail. */
  cr_assert_eq(cli("sim --tol 0 --steps 5 --quiet"), 1, "%s", out);
  cr_assert(strstr(out, "FAIL: 8 of 8 ranks differ from the single-process reference"),
            "%s", out);
}

Test(sim, a_lost_rank_times_out_instead_of_hanging, .timeout = 120) {
  cr_assert_eq(cli("sim --fail-rank 3:2 --timeout 2 --steps 5"), 1, "%s", out);
  cr_assert(strstr(out, "FAIL: 8 of 8 ranks failed; rank 3"), "%s", out);
  cr_assert(strstr(out, "timed out"), "%s", out);
}

Test(sim, invalid_input_exits_1, .timeout = 120) {
  cr_assert_eq(cli("sim --mesh dp=2,pp=2,tp=2"), 1, "%s", out);
  cr_assert(strstr(out, "dim \"pp\" must have size 1"), "%s", out);
  cr_assert_eq(cli("sim --mesh dp=-1,cp=2,tp=2 --world 6"), 1, "%s", out);
  cr_assert(strstr(out, "world size 6"), "%s", out);
  cr_assert_eq(cli("sim tests/no/such/file.toml"), 1, "%s", out);
  cr_assert(strstr(out, "cannot open spec file"), "%s", out);
  cr_assert_eq(cli("sim --mesh dp=2,tp=4 --hidden 30"), 1, "%s", out);
  cr_assert(strstr(out, "do not split over tp=4"), "%s", out);
  cr_assert_eq(cli("sim --mesh dp=2,cp=2 --flatten dp_cp=dp"), 1, "%s", out);
  cr_assert(strstr(out, "dp_cp must hold exactly the dims dp and cp"), "%s", out);
  cr_assert_eq(cli("sim --fail-rank 8"), 1, "%s", out);
}

Test(sim, usage_errors_exit_2, .timeout = 60) {
  cr_assert_eq(cli("sim --steps"), 2, "%s", out);
  cr_assert(strstr(out, "--steps needs a value"), "%s", out);
  cr_assert_eq(cli("sim --steps 0"), 2, "%s", out);
  cr_assert(strstr(out, "--steps: expected an integer >= 1"), "%s", out);
  cr_assert_eq(cli("sim --lr abc"), 2, "%s", out);
  cr_assert_eq(cli("sim --timeout -1"), 2, "%s", out);
  cr_assert_eq(cli("sim --seed -3"), 2, "%s", out);
  cr_assert_eq(cli("sim --frobnicate"), 2, "%s", out);
  cr_assert(strstr(out, "unknown option \"--frobnicate\""), "%s", out);
  cr_assert_eq(cli("sim a.toml b.toml"), 2, "%s", out);
  cr_assert_eq(cli("sim --flatten nonsense"), 2, "%s", out);
}

Test(sim, help_exits_0, .timeout = 60) {
  cr_assert_eq(cli("sim --help"), 0, "%s", out);
  cr_assert(strstr(out, "--fsdp"), "%s", out);
  cr_assert(strstr(out, "--microbatches"), "%s", out);
  cr_assert_eq(cli("--help"), 0, "%s", out);
  cr_assert(strstr(out, "sim "), "%s", out);
}
