/* meshpg plan, run as a real program: its JSON contract, its text output
 * and its exit codes (0 ok, 1 invalid spec, 2 usage). */
#include <string.h>

#include "../support/run_util.h"

/* meshpg ARGS exits with `code`; its output (in out) contains `piece` when
 * that is not NULL. */
static void expect_cli(const char *args, int code, const char *piece) {
  cr_assert_eq(cli(args), code, "meshpg %s: %s", args, out);
  if (piece) cr_assert(strstr(out, piece), "meshpg %s: no \"%s\" in:\n%s", args, piece, out);
}

/* The output of the last cli() contains `piece`. */
static void expect_out(const char *piece) {
  cr_assert(strstr(out, piece), "no \"%s\" in:\n%s", piece, out);
}

Test(cli, plan_json_matches_the_design_example) {
  expect_cli("plan --mesh dp=2,tp=2,cp=2 --flatten dp_cp=dp,cp --json", 0, NULL);
  cr_assert_str_eq(out,
                   "{\"world_size\": 8, \"dims\": [{\"name\": \"dp\", \"size\": 2}, "
                   "{\"name\": \"tp\", \"size\": 2}, {\"name\": \"cp\", \"size\": 2}], "
                   "\"groups\": {\"dp\": [[0, 4], [1, 5], [2, 6], [3, 7]], "
                   "\"tp\": [[0, 2], [1, 3], [4, 6], [5, 7]], "
                   "\"cp\": [[0, 1], [2, 3], [4, 5], [6, 7]], "
                   "\"dp_cp\": [[0, 1, 4, 5], [2, 3, 6, 7]]}}\n");
}

Test(cli, plan_example_spec_file) {
  expect_cli("plan examples/seed.toml", 0, "dp_cp    2 groups of 4: [0,1,4,5] [2,3,6,7]");
  expect_out("dp       4 groups of 2: [0,4] [1,5] [2,6] [3,7]");
}

Test(cli, plan_infers_minus_one_from_world) {
  expect_cli("plan examples/llama64.toml --world 64 --json", 0, "{\"name\": \"dp\", \"size\": 4}");
}

Test(cli, plan_megatron_order) {
  expect_cli("plan --mesh tp=2,cp=2,dp=2,pp=2 --order tp-cp-dp-pp --json", 0,
             "\"dims\": [{\"name\": \"pp\", \"size\": 2}, {\"name\": \"dp\", "
             "\"size\": 2}, {\"name\": \"cp\", \"size\": 2}, {\"name\": "
             "\"tp\", \"size\": 2}]");
  expect_out("\"pp\": [[0, 8], [1, 9]");
}

Test(cli, plan_rank_shows_only_its_groups) {
  expect_cli("plan examples/seed.toml --rank 5", 0, "rank 5 at (dp=1, tp=0, cp=1)");
  expect_out("dp_cp    group 0 of 2, position 3 of 4: [0,1,4,5]");
  cr_assert_null(strstr(out, "ranks (rank -> coordinate)"), "%s", out);
}

Test(cli, plan_large_world_is_shortened) {
  expect_cli("plan --mesh pp=16,dp=128,cp=8,tp=8 --flatten dp_cp=dp,cp", 0, "ranks not shown");
  expect_out("groups not shown");
  cr_assert_lt(strlen(out), 20000u);
}

Test(cli, invalid_spec_exits_1_with_the_library_message) {
  expect_cli("plan --mesh dp=-1,cp=2,tp=8 --world 60", 1, "world size 60 is not divisible by 16");
  expect_cli("plan --mesh dp=2,cp=2 --flatten x=cp,dp", 1, "mesh order");
  expect_cli("plan tests/no/such/file.toml", 1, "cannot open spec file");
  expect_cli("plan --mesh dp=2 --rank 2", 1, NULL);
}

Test(cli, usage_errors_exit_2) {
  expect_cli("plan", 2, NULL);
  expect_cli("plan --mesh", 2, "--mesh needs a value");
  expect_cli("plan --mesh dp=2 --world abc", 2, "--world: expected an integer");
  expect_cli("plan --mesh dp=2 --frobnicate", 2, NULL);
  expect_cli("plan --mesh dp=2 --flatten nonsense", 2, NULL);
  expect_cli("plan a.toml b.toml", 2, NULL);
  expect_cli("nosuchcommand", 2, NULL);
  expect_cli("", 2, NULL);
}

Test(cli, help_exits_0) {
  expect_cli("plan --help", 0, "--flatten");
  expect_cli("--help", 0, NULL);
}

Test(cli, plan_experts) {
  expect_cli("plan --mesh pp=2,dp=2,cp=2,tp=2 --experts ep=2,tp=1 --json", 0,
             "\"experts\": [{\"name\": \"pp\", \"size\": 2}, {\"name\": \"edp\", "
             "\"size\": 4}, {\"name\": \"ep\", \"size\": 2}, {\"name\": \"etp\", "
             "\"size\": 1}]");
  expect_out("\"edp\": [[0, 2, 4, 6], [1, 3, 5, 7], [8, 10, 12, 14], [9, 11, 13, 15]]");
  expect_out("\"etp_ep_pp\": [[0, 1, 8, 9], [2, 3, 10, 11]");
  expect_cli("plan --mesh pp=2,dp=2,tp=2 --experts ep=2 --rank 3", 0,
             "experts: pp=2 x edp=1 x ep=2 x etp=2");
  expect_out("edp");
  expect_cli("plan --mesh pp=2,dp=2,tp=2 --experts ep=3", 1,
             "experts: world size 8 is not divisible by etp x ep x pp = 2 x 3 x 2");
  expect_cli("plan --mesh dp=2 --experts ep=2,xx=1", 2,
             "--experts: expected ep=N, tp=N or order=ORDER");
  /* A mesh of 8 dims (MPG_MAX_DIMS) may have an expert grid. */
  expect_cli("plan --mesh pp=2,a=1,dp=2,b=1,cp=1,c=1,d=1,tp=2 --experts ep=2,tp=1 --json", 0,
             "\"edp\": [[0, 2], [1, 3], [4, 6], [5, 7]]");
  expect_out("\"etp_ep_pp\": [[0, 1, 4, 5], [2, 3, 6, 7]]");
}

/* Issue 30's newcomer slips. */
static int lines_of(const char *s) {
  int n = 0;
  for (; *s; s++) n += *s == '\n';
  return n;
}

Test(cli, usage_error_is_one_line_and_a_hint) {
  expect_cli("plan --mesh dp=2 --frobnicate", 2, "unknown option \"--frobnicate\"");
  expect_out("run 'meshpg plan --help' for the options");
  cr_assert_leq(lines_of(out), 2, "a usage error printed %d lines:\n%s", lines_of(out), out);
  expect_cli("sim --frobnicate", 2, "meshpg sim --help");
  cr_assert_leq(lines_of(out), 2, "%s", out);
}

Test(cli, plan_checks_the_sync_dims) {
  expect_cli("plan tests/data/bad_shard_dims.toml", 1, "sync.shard_dims = \"dpp\"");
  expect_out("did you mean \"dp\"");
  expect_cli("plan examples/hsdp.toml --world 16", 0, NULL);
}

Test(cli, plan_minus_one_without_world_suggests_world) {
  expect_cli("plan examples/llama64.toml", 1, "no world size was given");
  expect_out("--world N");
}
