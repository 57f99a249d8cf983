/* meshpg plan's placement at 262,144 nodes (issue 29): the groups-by-node
 * listing found each group's distinct nodes by insertion into a sorted
 * list, size x nodes per group, which took minutes here.  These runs check
 * the output at that scale; the time is measured in bench/README.md, not
 * asserted (a loaded machine or a sanitizer build would make it flaky).
 * Every expected line follows from the layout (block or cyclic launcher
 * numbering, inner dims innermost) and matched the quadratic version. */
#include <string.h>

#include "../support/run_util.h"

/* `meshpg plan ARGS`, which must succeed. */
static void plan(const char *args) {
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "plan %s", args);
  cr_assert_eq(cli(cmd), 0, "%s: %s", cmd, out);
}

/* `meshpg plan ARGS --json`, keeping the last `tail` bytes of its one line
 * (the ranks array alone is megabytes). */
static void plan_json_tail(const char *args, int tail) {
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "plan %s --json | tail -c %d", args, tail);
  cli(cmd);
}

static void has(const char *line) {
  cr_assert(strstr(out, line), "missing \"%s\" in:\n%s", line, out);
}

/* 262,144 nodes of 8 GPUs, block numbering: dp groups span every node,
 * tp groups one node each. */
Test(cli_plan_scale, block_262144_nodes) {
  plan("--mesh dp=262144,tp=8 --nodes 262144");
  has("placement (mesh rank -> launcher rank, node, GPU): 262144 nodes x 8 GPUs, "
      "block launcher numbering; inner dims: tp\n");
  has("  2097151   2097151 262143    7\n");
  has("  node 262143: [2097144,2097145,2097146,2097147,2097148,2097149,2097150,"
      "2097151]\n");
  has("  dp: 8 groups of 262144, 8 crossing nodes\n"
      "    dp [0,8,...,2097144] (262144 ranks) nodes 0-262143  crosses\n");
  has("    dp [7,15,...,2097151] (262144 ranks) nodes 0-262143  crosses\n"
      "  tp: 262144 groups of 8, 0 crossing nodes (inner dim)\n"
      "    tp [0,1,2,3,4,5,6,7] node 0\n");
  has("    tp [2097144,2097145,2097146,2097147,2097148,2097149,2097150,2097151] "
      "node 262143\nmisfits: none\n");
}

/* Cyclic numbering over 262,144 nodes: pp groups cross 4 nodes a quarter
 * of the machine apart, each dp group a quarter of the nodes. */
Test(cli_plan_scale, cyclic_262144_nodes) {
  plan("--mesh pp=4,dp=65536,cp=2,tp=4 --nodes 262144 --rank-order cyclic");
  has("262144 nodes x 8 GPUs, cyclic launcher numbering; inner dims: cp, tp\n");
  has("       1    262144     0    1\n");
  has("  pp: 524288 groups of 4, 524288 crossing nodes\n"
      "    pp [0,524288,1048576,1572864] nodes 0,65536,131072,196608  crosses\n");
  has("    pp [524287,1048575,1572863,2097151] nodes 65535,131071,196607,262143  "
      "crosses\n  dp: 32 groups of 65536, 32 crossing nodes\n"
      "    dp [0,8,...,524280] (65536 ranks) nodes 0-65535  crosses\n");
  has("    dp [1572871,1572879,...,2097151] (65536 ranks) nodes 196608-262143  "
      "crosses\n  cp: 1048576 groups of 2, 0 crossing nodes (inner dim)\n");
  has("  tp: 524288 groups of 4, 0 crossing nodes (inner dim)\n");
  has("misfits: none\n");
}

/* Groups whose members meet their nodes out of order, many nodes each:
 * with tp outside dp in the mesh but innermost on the node, the tp_dp
 * group visits nodes 0,2,4,... then 1,3,5,...; the list is ascending. */
Test(cli_plan_scale, nodes_sorted_when_met_out_of_order) {
  plan("--mesh pp=2,tp=4,dp=65536 --flatten tp_dp=tp,dp --gpus-per-node 2");
  has("262144 nodes x 2 GPUs, block launcher numbering; inner dims: tp\n");
  has("  tp: 131072 groups of 4, 131072 crossing nodes (inner dim)\n"
      "    tp [0,65536,131072,196608] nodes 0,1  crosses, misfit\n");
  has("  dp: 8 groups of 65536, 8 crossing nodes\n"
      "    dp [0,1,...,65535] (65536 ranks) nodes 0,2,4,6,8,10,12,14,... "
      "(65536 nodes)  crosses\n");
  has("    dp [131072,131073,...,196607] (65536 ranks) nodes 1,3,5,7,9,11,13,15,"
      "... (65536 nodes)  crosses\n");
  has("  tp_dp: 2 groups of 262144, 2 crossing nodes\n"
      "    tp_dp [0,1,...,262143] (262144 ranks) nodes 0-131071  crosses\n"
      "    tp_dp [262144,262145,...,524287] (262144 ranks) nodes 131072-262143  "
      "crosses\n");
  has("misfits: 131072 groups of inner dims cross nodes (warning; strict = true "
      "or --strict makes it an error)\n");

  /* Small groups met out of order: cp (size 8) steps over every other
   * node; tp_cp lists its 16 nodes as one range. */
  plan("--mesh dp=16384,tp=4,cp=8 --flatten tp_cp=tp,cp --gpus-per-node 2");
  has("    cp [16,17,18,19,20,21,22,23] nodes 1,3,5,7,9,11,13,15  crosses, misfit\n");
  has("  tp_cp: 16384 groups of 32, 16384 crossing nodes (inner dim)\n"
      "    tp_cp [0,1,...,31] (32 ranks) nodes 0-15  crosses, misfit\n");
  has("    tp_cp [524256,524257,...,524287] (32 ranks) nodes 262128-262143  "
      "crosses, misfit\n");
  has("misfits: 212992 groups of inner dims cross nodes");
}

/* The JSON "crossing" lists at 65,536 nodes: the group indices whose group
 * spans several nodes, per dim set. */
Test(cli_plan_scale, json_crossing_lists) {
  plan_json_tail("--mesh dp=65536,tp=4 --nodes 65536 --rank-order cyclic", 140);
  has("{\"rank\": 262143, \"launcher_rank\": 262143, \"node\": 65535, \"gpu\": 3}], "
      "\"crossing\": {\"dp\": [0, 1, 2, 3], \"tp\": []}, \"misfits\": 0}}\n");
  plan_json_tail("--mesh pp=2,tp=4,dp=16384 --flatten tp_dp=tp,dp --gpus-per-node 2",
                 120);
  has(", 32766, 32767], \"dp\": [0, 1, 2, 3, 4, 5, 6, 7], \"tp_dp\": [0, 1]}, "
      "\"misfits\": 32768}}\n");
}
