/* meshpg plan, run as a real program: its JSON contract, its text output
 * and its exit codes (0 ok, 1 invalid spec, 2 usage). */
#include <string.h>

#include "../support/run_util.h"

Test(cli, plan_json_matches_the_design_example) {
  cr_assert_eq(cli("plan --mesh dp=2,tp=2,cp=2 --flatten dp_cp=dp,cp --json"), 0, "%s", out);
  cr_assert_str_eq(out,
                   "{\"world_size\": 8, \"dims\": [{\"name\": \"dp\", \"size\": 2}, "
                   "{\"name\": \"tp\", \"size\": 2}, {\"name\": \"cp\", \"size\": 2}], "
                   "\"groups\": {\"dp\": [[0, 4], [1, 5], [2, 6], [3, 7]], "
                   "\"tp\": [[0, 2], [1, 3], [4, 6], [5, 7]], "
                   "\"cp\": [[0, 1], [2, 3], [4, 5], [6, 7]], "
                   "\"dp_cp\": [[0, 1, 4, 5], [2, 3, 6, 7]]}}\n");
}

Test(cli, plan_example_spec_file) {
  cr_assert_eq(cli("plan examples/seed.toml"), 0, "%s", out);
  cr_assert(strstr(out, "dp_cp    2 groups of 4: [0,1,4,5] [2,3,6,7]"), "%s", out);
  cr_assert(strstr(out, "dp       4 groups of 2: [0,4] [1,5] [2,6] [3,7]"), "%s", out);
}

Test(cli, plan_infers_minus_one_from_world) {
  cr_assert_eq(cli("plan examples/llama64.toml --world 64 --json"), 0, "%s", out);
  cr_assert(strstr(out, "{\"name\": \"dp\", \"size\": 4}"), "%s", out);
}

Test(cli, plan_megatron_order) {
  cr_assert_eq(cli("plan --mesh tp=2,cp=2,dp=2,pp=2 --order tp-cp-dp-pp --json"), 0, "%s", out);
  cr_assert(strstr(out, "\"dims\": [{\"name\": \"pp\", \"size\": 2}, {\"name\": \"dp\", "
                        "\"size\": 2}, {\"name\": \"cp\", \"size\": 2}, {\"name\": "
                        "\"tp\", \"size\": 2}]"),
            "%s", out);
  cr_assert(strstr(out, "\"pp\": [[0, 8], [1, 9]"), "%s", out);
}

Test(cli, plan_rank_shows_only_its_groups) {
  cr_assert_eq(cli("plan examples/seed.toml --rank 5"), 0, "%s", out);
  cr_assert(strstr(out, "rank 5 at (dp=1, tp=0, cp=1)"), "%s", out);
  cr_assert(strstr(out, "dp_cp    group 0 of 2, position 3 of 4: [0,1,4,5]"), "%s", out);
  cr_assert_null(strstr(out, "ranks (rank -> coordinate)"), "%s", out);
}

Test(cli, plan_large_world_is_shortened) {
  cr_assert_eq(cli("plan --mesh pp=16,dp=128,cp=8,tp=8 --flatten dp_cp=dp,cp"), 0);
  cr_assert(strstr(out, "ranks not shown"));
  cr_assert(strstr(out, "groups not shown"));
  cr_assert_lt(strlen(out), 20000u);
}

Test(cli, invalid_spec_exits_1_with_the_library_message) {
  cr_assert_eq(cli("plan --mesh dp=-1,cp=2,tp=8 --world 60"), 1, "%s", out);
  cr_assert(strstr(out, "world size 60 is not divisible by 16"), "%s", out);
  cr_assert_eq(cli("plan --mesh dp=2,cp=2 --flatten x=cp,dp"), 1, "%s", out);
  cr_assert(strstr(out, "mesh order"), "%s", out);
  cr_assert_eq(cli("plan tests/no/such/file.toml"), 1, "%s", out);
  cr_assert(strstr(out, "cannot open spec file"), "%s", out);
  cr_assert_eq(cli("plan --mesh dp=2 --rank 2"), 1, "%s", out);
}

Test(cli, usage_errors_exit_2) {
  cr_assert_eq(cli("plan"), 2, "%s", out);
  cr_assert_eq(cli("plan --mesh"), 2, "%s", out);
  cr_assert(strstr(out, "--mesh needs a value"), "%s", out);
  cr_assert_eq(cli("plan --mesh dp=2 --world abc"), 2, "%s", out);
  cr_assert(strstr(out, "--world: expected an integer"), "%s", out);
  cr_assert_eq(cli("plan --mesh dp=2 --frobnicate"), 2, "%s", out);
  cr_assert_eq(cli("plan --mesh dp=2 --flatten nonsense"), 2, "%s", out);
  cr_assert_eq(cli("plan a.toml b.toml"), 2, "%s", out);
  cr_assert_eq(cli("nosuchcommand"), 2, "%s", out);
  cr_assert_eq(cli(""), 2, "%s", out);
}

Test(cli, help_exits_0) {
  cr_assert_eq(cli("plan --help"), 0, "%s", out);
  cr_assert(strstr(out, "--flatten"), "%s", out);
  cr_assert_eq(cli("--help"), 0, "%s", out);
}

Test(cli, plan_experts) {
  cr_assert_eq(cli("plan --mesh pp=2,dp=2,cp=2,tp=2 --experts ep=2,tp=1 --json"), 0, "%s", out);
  cr_expect(strstr(out, "\"experts\": [{\"name\": \"pp\", \"size\": 2}, {\"name\": \"edp\", "
                        "\"size\": 4}, {\"name\": \"ep\", \"size\": 2}, {\"name\": \"etp\", "
                        "\"size\": 1}]"), "%s", out);
  cr_expect(strstr(out, "\"edp\": [[0, 2, 4, 6], [1, 3, 5, 7], [8, 10, 12, 14], [9, 11, 13, 15]]"),
            "%s", out);
  cr_expect(strstr(out, "\"etp_ep_pp\": [[0, 1, 8, 9], [2, 3, 10, 11]"), "%s", out);
  cr_assert_eq(cli("plan --mesh pp=2,dp=2,tp=2 --experts ep=2 --rank 3"), 0, "%s", out);
  cr_expect(strstr(out, "experts: pp=2 x edp=1 x ep=2 x etp=2"), "%s", out);
  cr_expect(strstr(out, "edp"), "%s", out);
  cr_assert_eq(cli("plan --mesh pp=2,dp=2,tp=2 --experts ep=3"), 1, "%s", out);
  cr_expect(strstr(out, "experts: world size 8 is not divisible by etp x ep x pp = 2 x 3 x 2"),
            "%s", out);
  cr_assert_eq(cli("plan --mesh dp=2 --experts ep=2,xx=1"), 2, "%s", out);
  cr_expect(strstr(out, "--experts: expected ep=N, tp=N or order=ORDER"), "%s", out);
  /* A mesh of 8 dims (MPG_MAX_DIMS) may have an expert grid. */
  cr_assert_eq(cli("plan --mesh pp=2,a=1,dp=2,b=1,cp=1,c=1,d=1,tp=2 --experts ep=2,tp=1 "
                   "--json"), 0, "%s", out);
  cr_expect(strstr(out, "\"edp\": [[0, 2], [1, 3], [4, 6], [5, 7]]"), "%s", out);
  cr_expect(strstr(out, "\"etp_ep_pp\": [[0, 1, 4, 5], [2, 3, 6, 7]]"), "%s", out);
}

/* Issue 30's newcomer slips. */
static int lines_of(const char *s) {
  int n = 0;
  for (; *s; s++) n += *s == '\n';
  return n;
}

Test(cli, usage_error_is_one_line_and_a_hint) {
  cr_assert_eq(cli("plan --mesh dp=2 --frobnicate"), 2, "%s", out);
  cr_assert(strstr(out, "unknown option \"--frobnicate\""), "%s", out);
  cr_assert(strstr(out, "run 'meshpg plan --help' for the options"), "%s", out);
  cr_assert_leq(lines_of(out), 2, "a usage error printed %d lines:\n%s", lines_of(out), out);
  cr_assert_eq(cli("sim --frobnicate"), 2, "%s", out);
  cr_assert_leq(lines_of(out), 2, "%s", out);
  cr_assert(strstr(out, "meshpg sim --help"), "%s", out);
}

Test(cli, plan_checks_the_sync_dims) {
  cr_assert_eq(cli("plan tests/data/bad_shard_dims.toml"), 1, "%s", out);
  cr_assert(strstr(out, "sync.shard_dims = \"dpp\"") && strstr(out, "did you mean \"dp\""),
            "%s", out);
  cr_assert_eq(cli("plan examples/hsdp.toml --world 16"), 0, "%s", out);
}

Test(cli, plan_minus_one_without_world_suggests_world) {
  cr_assert_eq(cli("plan examples/llama64.toml"), 1, "%s", out);
  cr_assert(strstr(out, "no world size was given") && strstr(out, "--world N"), "%s", out);
}
