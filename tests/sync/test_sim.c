/* meshpg sim, run as a real program: simulated ranks (thread backend) train
 * a tp/cp/dp-parallel MLP with meshpg's gradient sync (replicated, or in
 * the shard mode: --shard, --hsdp, --fsdp, [sync] mode = "shard") and must
 * match single-process training.  Exit codes: 0 pass, 1 mismatch / failed rank /
 * invalid spec, 2 usage. */
#include <string.h>
#include <unistd.h>

#include "../support/run_util.h"

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

/* --fsdp: the fsdp_owns_dp sync averages over cp, the shard-mode sync over
 * dp owns the params and the optimizer state. */
Test(sim, fsdp_flag, .timeout = 120) {
  expect_pass("sim examples/seed.toml --fsdp --steps 20", 8);
  cr_assert(strstr(out, "meshpg averages gradients over cp (2 ranks) (fsdp_owns_dp)"), "%s",
            out);
  cr_assert(strstr(out, "a second sync in shard mode reduce-scatters them over dp (2 ranks)"),
            "%s", out);
  cr_assert(strstr(out, "cp(2)+dp(2)"), "%s", out);
  cr_assert(strstr(out, "owned"), "%s", out);
  cr_assert(strstr(out, "20 Adam steps"), "%s", out);
}

Test(sim, fsdp_from_spec_with_microbatches, .timeout = 120) {
  expect_pass("sim examples/fsdp.toml --microbatches 2 --steps 10", 8);
  cr_assert(strstr(out, "a second sync in shard mode reduce-scatters them over dp"), "%s", out);
  cr_assert(strstr(out, "2 micro-batches"), "%s", out);
}

Test(sim, fsdp_with_padding, .timeout = 120) {
  /* tp=1: w2 (256) at 0, b1 (32) at 256, w1 (512) at 320 (params start on
   * 64 elements) = 832, padded to a multiple of lcm(3, 128) = 384: 1152,
   * 352 of padding, slices of 384; b2 replicated (8) */
  expect_pass("sim --mesh dp=3,cp=2,tp=1 --fsdp --steps 10", 6);
  cr_assert(strstr(out, "optimizer state of 392 elements (shard_elems), shard group of 3, "
                        "352 padding elements"),
            "%s", out);
}

Test(sim, fsdp_world_20_uneven, .timeout = 120) {
  expect_pass("sim --mesh dp=5,cp=1,tp=4 --batch 9 --fsdp --steps 10 --quiet", 20);
}

/* --shard: the library's shard mode over dp_cp, Adam state for the owned
 * elements only, params gathered at first use in forward. */
Test(sim, shard_seed_mesh, .timeout = 120) {
  expect_pass("sim examples/seed.toml --shard --steps 20", 8);
  cr_assert(strstr(out, "shard mode: meshpg reduce-scatters (averaging) every bucket over "
                        "dp_cp (4 ranks)"),
            "%s", out);
  cr_assert(strstr(out, "(state for the owned elements only)"), "%s", out);
  /* b2 takes the replicated path: 2 buffers */
  cr_assert(strstr(out, "sync on rank 0: 4 params, 2 buffers"), "%s", out);
  cr_assert(strstr(out, "shard on rank 0: updates 136 of its 408 param elements"), "%s", out);
  cr_assert(strstr(out, "shard group of 4, 112 padding elements"), "%s", out);
}

Test(sim, shard_dp1_and_cp1, .timeout = 120) {
  expect_pass("sim --shard --mesh dp=1,cp=4,tp=2 --steps 10 --quiet", 8);
  expect_pass("sim --shard --mesh dp=4,cp=1,tp=2 --steps 10 --quiet", 8);
  expect_pass("sim --shard --mesh dp=1,cp=1,tp=2 --steps 5", 2);
  cr_assert(strstr(out, "shard group of 1"), "%s", out);
}

Test(sim, shard_uneven_with_accumulation_and_buckets, .timeout = 120) {
  /* 13 hidden units: counts 208, 13, 104 (no multiple of anything); 7
   * samples over dp=3, 5 tokens over cp=2, 3 micro-batches, several
   * buckets of about 1 KiB */
  expect_pass("sim --shard --mesh dp=3,cp=2,tp=1 --hidden 13 --batch 7 --seq 5 "
              "--microbatches 3 --bucket-mb 0.001 --steps 10",
              6);
  cr_assert(strstr(out, "3 micro-batches"), "%s", out);
  cr_assert(strstr(out, "shard group of 6"), "%s", out);
  cr_assert_null(strstr(out, "in 2 buckets"), "expected several buckets:\n%s", out);
}

Test(sim, shard_world_16_and_64, .timeout = 300) {
  expect_pass("sim --shard --world 16 --steps 5", 16);
  cr_assert(strstr(out, "over dp_cp (8 ranks)"), "%s", out);
  expect_pass("sim --shard --mesh dp=4,cp=4,tp=4 --steps 5 --quiet", 64);
}

Test(sim, shard_sgd_and_sum_op_from_spec, .timeout = 120) {
  char path[] = "/tmp/meshpg_test_sim_shard_XXXXXX";
  int fd = mkstemp(path);
  cr_assert_geq(fd, 0);
  FILE *f = fdopen(fd, "w");
  cr_assert_not_null(f);
  fputs("[mesh]\n"
        "dims = [ { name = \"dp\", size = 2 }, { name = \"cp\", size = 2 },\n"
        "         { name = \"tp\", size = 2 } ]\n"
        "flatten = { dp_cp = [\"dp\", \"cp\"] }\n"
        "[sync]\nmode = \"shard\"\nop = \"sum\"\nbucket_mb = 0.001\n",
        f);
  fclose(f);
  char args[256];
  /* [sync] mode = "shard" alone selects the shard mode */
  snprintf(args, sizeof args, "sim '%s' --steps 10", path);
  expect_pass(args, 8);
  cr_assert(strstr(out, "shard mode: meshpg reduce-scatters (summing)"), "%s", out);
  snprintf(args, sizeof args, "sim '%s' --steps 10 --optim sgd --microbatches 2", path);
  expect_pass(args, 8);
  cr_assert(strstr(out, "10 SGD steps, lr 0.5"), "%s", out);
  remove(path);
}

/* --hsdp R: dp split into dp_replicate=R x dp_shard=dp/R; shard over
 * dp_shard,cp, the shard all-reduced over dp_replicate. */
Test(sim, hsdp_flag, .timeout = 120) {
  expect_pass("sim --hsdp 2 --mesh dp=4,cp=2,tp=2 --steps 10", 16);
  cr_assert(strstr(out, "dp=4 split into dp_replicate=2 x dp_shard=2 (--hsdp 2)"), "%s", out);
  cr_assert(strstr(out, "mesh dp_replicate=2 x dp_shard=2 x cp=2 x tp=2"), "%s", out);
  cr_assert(strstr(out, "over dp_shard,cp (4 ranks), then all-reduces the owned shard over "
                        "dp_replicate (2 ranks)"),
            "%s", out);
}

Test(sim, hsdp_corners, .timeout = 300) {
  /* shard groups of one rank (dp_shard=1, cp=1): all the work is the
   * replicate all-reduce */
  expect_pass("sim --hsdp 2 --mesh dp=2,cp=1,tp=2 --steps 10", 4);
  cr_assert(strstr(out, "shard group of 1"), "%s", out);
  /* dp_replicate=1: plain sharding over dp_shard x cp */
  expect_pass("sim --hsdp 1 --mesh dp=2,cp=2,tp=1 --microbatches 2 --steps 10 --quiet", 4);
  /* an inferred dp, 64 ranks, a Megatron order */
  expect_pass("sim --hsdp 4 --world 64 --mesh dp=-1,cp=2,tp=2 --steps 5 --quiet", 64);
  expect_pass("sim --hsdp 3 --mesh tp=2,cp=2,dp=3 --order dp-cp-tp --batch 7 --steps 5 --quiet",
              12);
}

Test(sim, hsdp_spec_file, .timeout = 120) {
  expect_pass("sim examples/hsdp.toml --steps 10", 16);
  cr_assert(strstr(out, "mesh dp_replicate=2 x dp_shard=2 x cp=2 x tp=2 (world 16, from "
                        "examples/hsdp.toml)"),
            "%s", out);
  cr_assert(strstr(out, "then all-reduces the owned shard over dp_replicate (2 ranks)"), "%s",
            out);
  /* --hsdp on a mesh that already names both dims: the sizes must agree */
  expect_pass("sim examples/hsdp.toml --hsdp 2 --steps 5 --quiet", 16);
  cr_assert_eq(cli("sim examples/hsdp.toml --hsdp 4 --steps 5"), 1, "%s", out);
  cr_assert(strstr(out, "already has dp_replicate=2"), "%s", out);
}

Test(sim, shard_lost_rank_times_out, .timeout = 120) {
  cr_assert_eq(cli("sim --shard --fail-rank 3:2 --timeout 2 --steps 5"), 1, "%s", out);
  cr_assert(strstr(out, "FAIL: 8 of 8 ranks failed; rank 3"), "%s", out);
  cr_assert(strstr(out, "timed out"), "%s", out);
}

Test(sim, shard_mismatch_exits_1, .timeout = 120) {
  cr_assert_eq(cli("sim --shard --tol 0 --steps 5 --quiet"), 1, "%s", out);
  cr_assert(strstr(out, "FAIL: 8 of 8 ranks differ from the single-process reference"),
            "%s", out);
}

Test(sim, shard_invalid_input, .timeout = 60) {
  /* exclusive modes */
  cr_assert_eq(cli("sim --shard --fsdp"), 2, "%s", out);
  cr_assert(strstr(out, "--shard, --hsdp and --fsdp exclude each other"), "%s", out);
  cr_assert_eq(cli("sim --hsdp 2 --shard"), 2, "%s", out);
  cr_assert_eq(cli("sim --hsdp 0"), 2, "%s", out);
  cr_assert_eq(cli("sim --optim adagrad"), 2, "%s", out);
  cr_assert(strstr(out, "--optim: expected adam or sgd"), "%s", out);
  /* a dp that does not split, FSDP and shard from flag and spec */
  cr_assert_eq(cli("sim --hsdp 3 --mesh dp=4,cp=2"), 1, "%s", out);
  cr_assert(strstr(out, "dp=4 does not split into 3 replicas"), "%s", out);
  cr_assert_eq(cli("sim examples/fsdp.toml --shard"), 1, "%s", out);
  cr_assert(strstr(out, "fsdp_owns_dp = true"), "%s", out);
  cr_assert_eq(cli("sim examples/hsdp.toml --fsdp"), 1, "%s", out);
  cr_assert(strstr(out, "--fsdp: the spec sets [sync] mode = \"shard\""), "%s", out);
  /* HSDP dims that do not cover the data dims */
  cr_assert_eq(cli("sim --mesh dp_shard=2,cp=2"), 1, "%s", out);
  cr_assert(strstr(out, "dim dp_shard needs dim dp_replicate"), "%s", out);
  char path[] = "/tmp/meshpg_test_sim_bad_XXXXXX";
  int fd = mkstemp(path);
  cr_assert_geq(fd, 0);
  FILE *f = fdopen(fd, "w");
  cr_assert_not_null(f);
  fputs("[mesh]\n"
        "dims = [ { name = \"dp\", size = 2 }, { name = \"cp\", size = 2 } ]\n"
        "[sync]\nmode = \"shard\"\nshard_dims = \"dp\"\n",
        f);
  fclose(f);
  char args[256];
  snprintf(args, sizeof args, "sim '%s' --steps 2", path);
  cr_assert_eq(cli(args), 1, "%s", out);
  cr_assert(strstr(out, "must together name each data dim"), "%s", out);
  remove(path);
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
  cr_assert(strstr(out, "--shard"), "%s", out);
  cr_assert(strstr(out, "--hsdp R"), "%s", out);
  cr_assert(strstr(out, "--optim"), "%s", out);
  cr_assert(strstr(out, "--microbatches"), "%s", out);
  cr_assert_eq(cli("--help"), 0, "%s", out);
  cr_assert(strstr(out, "sim "), "%s", out);
}
