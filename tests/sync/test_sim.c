/* meshpg sim, run as a real program: simulated ranks (thread backend) train
 * a tp/cp/dp-parallel MLP with meshpg's gradient sync (replicated, or in
 * the shard mode: --shard, --hsdp, --fsdp, [sync] mode = "shard") and must
 * match single-process training.  Exit codes: 0 pass, 1 mismatch / failed rank /
 * invalid spec, 2 usage. */
#include <string.h>
#include <unistd.h>

#include "cli_check.h"

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

/* expect_pass, and (want not NULL) the output holds want. */
static void sim_pass(const char *args, int world, const char *want) {
  expect_pass(args, world);
  if (want) OUT_HOLDS(want);
}

/* A passing run per row: its arguments, its world. */
typedef struct pass_row {
  const char *args;
  int world;
} pass_row;

static void expect_passes(const pass_row *rows, int n) {
  for (int k = 0; k < n; k++) expect_pass(rows[k].args, rows[k].world);
}
#define EXPECT_PASSES(...)                                                   \
  expect_passes((const pass_row[]){__VA_ARGS__},                             \
                (int)(sizeof((const pass_row[]){__VA_ARGS__}) / sizeof(pass_row)))

/* Runs of "sim 'PATH' REST" on one spec file, each passing on `world`
 * ranks with an output that holds its texts (up to the first NULL). */
typedef struct spec_run {
  const char *rest;
  const char *want[3];
} spec_run;

static void spec_passes(const char *spec, int world, const spec_run *runs, int n) {
  char path[] = "/tmp/meshpg_test_sim_XXXXXX";
  temp_file(path, spec);
  for (int k = 0; k < n; k++) {
    char args[256];
    snprintf(args, sizeof args, "sim '%s' %s", path, runs[k].rest);
    expect_pass(args, world);
    for (int w = 0; w < 3 && runs[k].want[w]; w++) OUT_HOLDS(runs[k].want[w]);
  }
  remove(path);
}

Test(sim, seed_spec_passes_with_table_and_progress, .timeout = 120) {
  expect_pass("sim examples/seed.toml --steps 20", 8);
  /* progress every 10% of the steps, with the reference loss; the
   * per-rank table: rank 5 at (dp=1, tp=0, cp=1), its groups and the
   * library's reduce group */
  OUT_HOLDS("step 2/20 loss ", "step 20/20 loss ", "(reference ",
            "    5    1   0   1   [1,5] [5,7] [4,5] [0,1,4,5]  dp_cp(4)",
            "sync on rank 0: 4 params");
}

Test(sim, default_mesh_without_spec, .timeout = 120) {
  sim_pass("sim --steps 5", 8, "mesh dp=2 x tp=2 x cp=2 (world 8)");
}

Test(sim, dp1_corner, .timeout = 120) {
  sim_pass("sim --mesh dp=1,cp=4,tp=2 --steps 10", 8, NULL);
}

Test(sim, cp1_corner, .timeout = 120) {
  sim_pass("sim --mesh dp=4,cp=1,tp=2 --steps 10", 8, NULL);
}

Test(sim, tp1_with_microbatches, .timeout = 120) {
  sim_pass("sim --mesh dp=2,cp=2,tp=1 --microbatches 3 --steps 10", 4, "3 micro-batches");
}

Test(sim, single_rank, .timeout = 120) {
  sim_pass("sim --mesh dp=1,cp=1,tp=1 --steps 5", 1, NULL);
}

Test(sim, world_16_infers_dp, .timeout = 120) {
  sim_pass("sim --world 16 --steps 10", 16, "mesh dp=4 x tp=2 x cp=2 (world 16)");
}

Test(sim, world_64_cube, .timeout = 300) {
  sim_pass("sim --mesh dp=4,cp=4,tp=4 --steps 10 --quiet", 64, NULL);
}

Test(sim, llama64_spec_with_other_backend_and_flatten, .timeout = 300) {
  /* nccl in the spec: sim always runs the thread backend */
  sim_pass("sim examples/llama64.toml --world 64 --steps 5", 64,
           "sim always runs the thread backend");
}

Test(sim, spec_with_lazy_groups_sum_op_and_size1_dim, .timeout = 120) {
  /* A size-1 pp dim, cp before tp, an extra flattened set, op = "sum" (the
   * ranks then scale by 1/N only) and lazy groups, from a spec file. */
  static const spec_run runs[] = {
      {"--steps 10", {"meshpg sums gradients over dp_cp", "cp_tp"}},
      {"--steps 10 --fsdp --quiet", {NULL}},
  };
  spec_passes("[mesh]\n"
              "dims = [ { name = \"pp\", size = 1 }, { name = \"dp\", size = 2 },\n"
              "         { name = \"cp\", size = 2 }, { name = \"tp\", size = 2 } ]\n"
              "flatten = { dp_cp = [\"dp\", \"cp\"], cp_tp = [\"cp\", \"tp\"] }\n"
              "[sync]\nop = \"sum\"\n[backend]\nlazy_groups = true\ntimeout_s = 60\n",
              8, runs, 2);
}

Test(sim, megatron_order_and_missing_dims, .timeout = 120) {
  /* tp=2,cp=2,dp=2 reordered by "dp-cp-tp" is the mesh tp, cp, dp */
  expect_pass("sim --mesh tp=2,cp=2,dp=2 --order dp-cp-tp --steps 10", 8);
  OUT_HOLDS("mesh tp=2 x cp=2 x dp=2");
  /* no cp and no dp_cp: both are added */
  expect_pass("sim --mesh dp=4,tp=2 --steps 10", 8);
  OUT_HOLDS("added for the model: cp=1, dp_cp=[dp,cp]");
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
  OUT_HOLDS("meshpg averages gradients over cp (2 ranks) (fsdp_owns_dp)",
            "a second sync in shard mode reduce-scatters them over dp (2 ranks)", "cp(2)+dp(2)",
            "owned", "20 Adam steps");
}

Test(sim, fsdp_from_spec_with_microbatches, .timeout = 120) {
  expect_pass("sim examples/fsdp.toml --microbatches 2 --steps 10", 8);
  OUT_HOLDS("a second sync in shard mode reduce-scatters them over dp", "2 micro-batches");
}

Test(sim, fsdp_with_padding, .timeout = 120) {
  /* tp=1: w2 (256) at 0, b1 (32) at 256, w1 (512) at 320 (params start on
   * 64 elements) = 832, padded to a multiple of lcm(3, 128) = 384: 1152,
   * 352 of padding, slices of 384; b2 replicated (8) */
  expect_pass("sim --mesh dp=3,cp=2,tp=1 --fsdp --steps 10", 6);
  OUT_HOLDS("optimizer state of 392 elements (shard_elems), shard group of 3, "
            "352 padding elements");
}

Test(sim, fsdp_world_20_uneven, .timeout = 120) {
  sim_pass("sim --mesh dp=5,cp=1,tp=4 --batch 9 --fsdp --steps 10 --quiet", 20, NULL);
}

/* --shard: the library's shard mode over dp_cp, Adam state for the owned
 * elements only, params gathered at first use in forward. */
Test(sim, shard_seed_mesh, .timeout = 120) {
  expect_pass("sim examples/seed.toml --shard --steps 20", 8);
  /* b2 takes the replicated path: 2 buffers */
  OUT_HOLDS("shard mode: meshpg reduce-scatters (averaging) every bucket over "
            "dp_cp (4 ranks)",
            "(state for the owned elements only)", "sync on rank 0: 4 params, 2 buffers",
            "shard on rank 0: updates 136 of its 408 param elements",
            "shard group of 4, 112 padding elements");
}

Test(sim, shard_dp1_and_cp1, .timeout = 120) {
  EXPECT_PASSES({"sim --shard --mesh dp=1,cp=4,tp=2 --steps 10 --quiet", 8},
                {"sim --shard --mesh dp=4,cp=1,tp=2 --steps 10 --quiet", 8},
                {"sim --shard --mesh dp=1,cp=1,tp=2 --steps 5", 2});
  OUT_HOLDS("shard group of 1");
}

Test(sim, shard_uneven_with_accumulation_and_buckets, .timeout = 120) {
  /* 13 hidden units: counts 208, 13, 104 (no multiple of anything); 7
   * samples over dp=3, 5 tokens over cp=2, 3 micro-batches, several
   * buckets of about 1 KiB */
  expect_pass("sim --shard --mesh dp=3,cp=2,tp=1 --hidden 13 --batch 7 --seq 5 "
              "--microbatches 3 --bucket-mb 0.001 --steps 10",
              6);
  OUT_HOLDS("3 micro-batches", "shard group of 6");
  cr_assert_null(strstr(out, "in 2 buckets"), "expected several buckets:\n%s", out);
}

Test(sim, shard_world_16_and_64, .timeout = 300) {
  expect_pass("sim --shard --world 16 --steps 5", 16);
  OUT_HOLDS("over dp_cp (8 ranks)");
  expect_pass("sim --shard --mesh dp=4,cp=4,tp=4 --steps 5 --quiet", 64);
}

Test(sim, shard_sgd_and_sum_op_from_spec, .timeout = 120) {
  /* [sync] mode = "shard" alone selects the shard mode */
  static const spec_run runs[] = {
      {"--steps 10", {"shard mode: meshpg reduce-scatters (summing)"}},
      {"--steps 10 --optim sgd --microbatches 2", {"10 SGD steps, lr 0.5"}},
  };
  spec_passes("[mesh]\ndims = [ { name = \"dp\", size = 2 }, { name = \"cp\", size = 2 },\n"
              "         { name = \"tp\", size = 2 } ]\nflatten = { dp_cp = [\"dp\", \"cp\"] }\n"
              "[sync]\nmode = \"shard\"\nop = \"sum\"\nbucket_mb = 0.001\n",
              8, runs, 2);
}

/* --hsdp R: dp split into dp_replicate=R x dp_shard=dp/R; shard over
 * dp_shard,cp, the shard all-reduced over dp_replicate. */
Test(sim, hsdp_flag, .timeout = 120) {
  expect_pass("sim --hsdp 2 --mesh dp=4,cp=2,tp=2 --steps 10", 16);
  OUT_HOLDS("dp=4 split into dp_replicate=2 x dp_shard=2 (--hsdp 2)",
            "mesh dp_replicate=2 x dp_shard=2 x cp=2 x tp=2",
            "over dp_shard,cp (4 ranks), then all-reduces the owned shard over "
            "dp_replicate (2 ranks)");
}

Test(sim, hsdp_corners, .timeout = 300) {
  /* shard groups of one rank (dp_shard=1, cp=1): all the work is the
   * replicate all-reduce */
  expect_pass("sim --hsdp 2 --mesh dp=2,cp=1,tp=2 --steps 10", 4);
  OUT_HOLDS("shard group of 1");
  /* dp_replicate=1: plain sharding over dp_shard x cp; an inferred dp, 64
   * ranks, a Megatron order */
  EXPECT_PASSES(
      {"sim --hsdp 1 --mesh dp=2,cp=2,tp=1 --microbatches 2 --steps 10 --quiet", 4},
      {"sim --hsdp 4 --world 64 --mesh dp=-1,cp=2,tp=2 --steps 5 --quiet", 64},
      {"sim --hsdp 3 --mesh tp=2,cp=2,dp=3 --order dp-cp-tp --batch 7 --steps 5 --quiet", 12});
}

Test(sim, hsdp_spec_file, .timeout = 120) {
  expect_pass("sim examples/hsdp.toml --steps 10", 16);
  OUT_HOLDS("mesh dp_replicate=2 x dp_shard=2 x cp=2 x tp=2 (world 16, from "
            "examples/hsdp.toml)",
            "then all-reduces the owned shard over dp_replicate (2 ranks)");
  /* --hsdp on a mesh that already names both dims: the sizes must agree */
  expect_pass("sim examples/hsdp.toml --hsdp 2 --steps 5 --quiet", 16);
  static const cli_row rows[] = {
      {"sim examples/hsdp.toml --hsdp 4 --steps 5", 1, {"already has dp_replicate=2"}},
  };
  CLI_ROWS(rows, NULL, 1);
}

/* The runs that fail: exit code 1 (a failed rank, a mismatch, a bad spec)
 * or 2 (usage), and what the output says. */
static const cli_row shard_lost_rows[] = {
    {"sim --shard --fail-rank 3:2 --timeout 2 --steps 5", 1,
     {"FAIL: 8 of 8 ranks failed; rank 3", "timed out"}},
};
Test(sim, shard_lost_rank_times_out, .timeout = 120) { CLI_ROWS(shard_lost_rows, NULL, 1); }

static const cli_row shard_mismatch_rows[] = {
    {"sim --shard --tol 0 --steps 5 --quiet", 1,
     {"FAIL: 8 of 8 ranks differ from the single-process reference"}},
};
Test(sim, shard_mismatch_exits_1, .timeout = 120) { CLI_ROWS(shard_mismatch_rows, NULL, 1); }

static const cli_row shard_invalid_rows[] = {
    /* exclusive modes */
    {"sim --shard --fsdp", 2, {"--shard, --hsdp and --fsdp exclude each other"}},
    {"sim --hsdp 2 --shard", 2, {NULL}},
    {"sim --hsdp 0", 2, {NULL}},
    {"sim --optim adagrad", 2, {"--optim: expected adam or sgd"}},
    /* a dp that does not split, FSDP and shard from flag and spec */
    {"sim --hsdp 3 --mesh dp=4,cp=2", 1, {"dp=4 does not split into 3 replicas"}},
    {"sim examples/fsdp.toml --shard", 1, {"fsdp_owns_dp = true"}},
    {"sim examples/hsdp.toml --fsdp", 1, {"--fsdp: the spec sets [sync] mode = \"shard\""}},
    /* HSDP dims that do not cover the data dims */
    {"sim --mesh dp_shard=2,cp=2", 1, {"dim dp_shard needs dim dp_replicate"}},
};
Test(sim, shard_invalid_input, .timeout = 60) {
  CLI_ROWS(shard_invalid_rows, NULL, 1);
  char path[] = "/tmp/meshpg_test_sim_bad_XXXXXX";
  temp_file(path, "[mesh]\n"
                  "dims = [ { name = \"dp\", size = 2 }, { name = \"cp\", size = 2 } ]\n"
                  "[sync]\nmode = \"shard\"\nshard_dims = \"dp\"\n");
  char args[256];
  snprintf(args, sizeof args, "sim '%s' --steps 2", path);
  cli_row bad = {args, 1, {"must together name each data dim"}};
  cli_rows(&bad, 1, NULL, 1);
  remove(path);
}

Test(sim, quiet_prints_only_the_verdict, .timeout = 120) {
  expect_pass("sim --quiet --steps 5", 8);
  cr_assert_null(strstr(out, "step "), "%s", out);
  cr_assert_null(strstr(out, "rank "), "%s", out);
}

/* A tolerance nothing in f32 can meet: the check must fail. */
static const cli_row mismatch_rows[] = {
    {"sim --tol 0 --steps 5 --quiet", 1,
     {"FAIL: 8 of 8 ranks differ from the single-process reference"}},
};
Test(sim, mismatch_exits_1, .timeout = 120) { CLI_ROWS(mismatch_rows, NULL, 1); }

static const cli_row lost_rank_rows[] = {
    {"sim --fail-rank 3:2 --timeout 2 --steps 5", 1,
     {"FAIL: 8 of 8 ranks failed; rank 3", "timed out"}},
};
Test(sim, a_lost_rank_times_out_instead_of_hanging, .timeout = 120) {
  CLI_ROWS(lost_rank_rows, NULL, 1);
}

static const cli_row invalid_rows[] = {
    {"sim --mesh dp=2,pp=2,tp=2", 1, {"dim \"pp\" must have size 1"}},
    {"sim --mesh dp=-1,cp=2,tp=2 --world 6", 1, {"world size 6"}},
    {"sim tests/no/such/file.toml", 1, {"cannot open spec file"}},
    {"sim --mesh dp=2,tp=4 --hidden 30", 1, {"do not split over tp=4"}},
    {"sim --mesh dp=2,cp=2 --flatten dp_cp=dp", 1, {"dp_cp must hold exactly the dims dp and cp"}},
    {"sim --fail-rank 8", 1, {NULL}},
};
Test(sim, invalid_input_exits_1, .timeout = 120) { CLI_ROWS(invalid_rows, NULL, 1); }

static const cli_row usage_rows[] = {
    {"sim --steps", 2, {"--steps needs a value"}},
    {"sim --steps 0", 2, {"--steps: expected an integer >= 1"}},
    {"sim --lr abc", 2, {NULL}},
    {"sim --timeout -1", 2, {NULL}},
    {"sim --seed -3", 2, {NULL}},
    {"sim --frobnicate", 2, {"unknown option \"--frobnicate\""}},
    {"sim a.toml b.toml", 2, {NULL}},
    {"sim --flatten nonsense", 2, {NULL}},
};
Test(sim, usage_errors_exit_2, .timeout = 60) { CLI_ROWS(usage_rows, NULL, 1); }

static const cli_row help_rows[] = {
    {"sim --help", 0, {"--fsdp", "--shard", "--hsdp R", "--optim", "--microbatches"}},
    {"--help", 0, {"sim "}},
};
Test(sim, help_exits_0, .timeout = 60) { CLI_ROWS(help_rows, NULL, 1); }
