/* meshpg topo and the placement flags of meshpg plan, run as a real
 * program.  Each topology fixture is paired with the output `meshpg topo`
 * must produce for it (tests/topologies/NAME.topo.txt). */
#include <stdarg.h>
#include <string.h>
#include <unistd.h>

#include "../support/run_util.h"

/* `meshpg ARGS` (run_util.h's cli()), also checking that `topo` is
 * dispatched at all. */
static int meshpg(const char *args) {
  int rc = cli(args);
  cr_assert_null(strstr(out, "unknown command \"topo\""),
                 "meshpg does not dispatch `topo`: tools/meshpg.c needs "
                 "`if (strcmp(cmd, \"topo\") == 0) return cmd_topo(argc - 1, "
                 "argv + 1);` and tools/cmd.h `int cmd_topo(int argc, char **argv);`");
  return rc;
}

/* `meshpg ARGS` exits with `code` and its output contains every piece (a
 * NULL-ended list). */
static void meshpg_out(const char *args, int code, ...) {
  cr_assert_eq(meshpg(args), code, "meshpg %s: %s", args, out);
  va_list ap;
  va_start(ap, code);
  for (const char *piece; (piece = va_arg(ap, const char *));)
    cr_assert(strstr(out, piece), "meshpg %s: no \"%s\" in:\n%s", args, piece, out);
  va_end(ap);
}

static char want[1 << 16];

static const char *expected(const char *name) {
  char path[1024];
  snprintf(path, sizeof path, "%s/topologies/%s", getenv("MESHPG_TEST_DATA"), name);
  FILE *f = fopen(path, "r");
  cr_assert_not_null(f, "missing %s", path);
  size_t n = fread(want, 1, sizeof want - 1, f);
  want[n] = '\0';
  fclose(f);
  return want;
}

/* ------------------------------------------------------------------------ */
/* meshpg topo: fixtures paired with their output                            */
/* ------------------------------------------------------------------------ */

/* `meshpg topo --xml tests/topologies/STEM.xml FLAGS` prints exactly
 * tests/topologies/STEM.topo.txt. */
static void fixture_output(const char *stem, const char *flags) {
  char args[512], name[128];
  snprintf(args, sizeof args, "topo --xml tests/topologies/%s.xml %s", stem, flags);
  snprintf(name, sizeof name, "%s.topo.txt", stem);
  meshpg_out(args, 0, NULL);
  cr_assert_str_eq(out, expected(name), "meshpg %s", args);
}

Test(cli_topo, dgx_h100_core_binding) { fixture_output("dgx-h100", "--bind core"); }
Test(cli_topo, workstation_numa_binding_is_the_default) { fixture_output("workstation-4gpu", ""); }
Test(cli_topo, interleaved_cuda_order) { fixture_output("pcie-interleaved", "--bind core"); }
Test(cli_topo, cpu_only_local_ranks) { fixture_output("cpu-only", "--local-ranks 4 --bind core"); }

Test(cli_topo, synthetic_and_live) {
  meshpg_out("topo --synthetic 'pack:2 numa:2 core:8 pu:2' --local-ranks 4", 0,
             "2 packages, 4 NUMA nodes, 32 cores, 64 PUs",
             "local rank 3 -> no GPU, NUMA 3, CPUs 48-63 (8 cores, 16 PUs)", NULL);
  meshpg_out("topo --bind none", 0, "topology: this machine (", "not bound", NULL);
}

Test(cli_topo, errors_exit_1_with_a_clear_message) {
  meshpg_out("topo --xml tests/topologies/no-such.xml", 1,
             "meshpg: topology XML \"tests/topologies/no-such.xml\": cannot "
             "open: No such file or directory",
             NULL);
  meshpg_out("topo --xml tests/topologies/broken.xml", 1,
             "\"tests/topologies/broken.xml\": hwloc cannot load it", NULL);
  meshpg_out("topo --xml tests/topologies/workstation-4gpu.xml --local-ranks 5", 1,
             "5 local ranks but topology "
             "tests/topologies/workstation-4gpu.xml has 4 GPUs",
             NULL);
  cr_assert_null(strstr(out, "local rank 0 ->"), "no binding is printed on error");
  meshpg_out("topo --synthetic 'pack:2 bogus:1'", 1, "rejects the synthetic description", NULL);
}

Test(cli_topo, usage_errors_exit_2) {
  meshpg_out("topo --bind sometimes", 2, "--bind: expected none, numa or core", NULL);
  meshpg_out("topo --local-ranks 0", 2, NULL);
  meshpg_out("topo --xml", 2, NULL);
  meshpg_out("topo --frobnicate", 2, NULL);
  meshpg_out("topo --xml a.xml --synthetic 'pack:1'", 2, NULL);
  meshpg_out("topo --help", 0, "usage: meshpg topo", NULL);
}

/* ------------------------------------------------------------------------ */
/* meshpg plan: placement across nodes                                       */
/* ------------------------------------------------------------------------ */

Test(cli_plan, cyclic_placement_text) {
  /* Mesh rank 1 runs as launcher rank 2 (Slurm cyclic puts it on node 0). */
  meshpg_out("plan --mesh dp=2,tp=4 --nodes 2 --gpus-per-node 4 --rank-order cyclic", 0,
             "2 nodes x 4 GPUs, cyclic launcher numbering; inner dims: tp",
             "       1         2     0    1\n",
             "  node 0: [0,1,2,3]\n  node 1: [4,5,6,7]\n",
             "    dp [0,4] nodes 0,1  crosses\n",
             "    tp [0,1,2,3] node 0\n",
             "misfits: none", NULL);
}

Test(cli_plan, misfits_marked_and_strict_fails) {
  meshpg_out("plan --mesh dp=8,tp=3 --nodes 3 --gpus-per-node 8", 0,
             "    tp [6,7,8] nodes 0,1  crosses, misfit\n",
             "misfits: 2 groups of inner dims cross nodes (warning", NULL);
  meshpg_out("plan --mesh dp=8,tp=3 --nodes 3 --strict", 1,
             "placement (strict): 2 of 8 \"tp\" groups (size 3)", NULL);
}

Test(cli_plan, json_placement_field) {
  meshpg_out("plan --mesh dp=2,tp=2 --nodes 2 --rank-order cyclic --json", 0,
             "\"groups\": {\"dp\": [[0, 2], [1, 3]], \"tp\": [[0, 1], [2, 3]]}, "
             "\"placement\": {\"nodes\": 2, \"gpus_per_node\": 2, "
             "\"rank_order\": \"cyclic\", \"inner_dims\": [\"tp\"], "
             "\"ranks\": [{\"rank\": 0, \"launcher_rank\": 0, \"node\": 0, "
             "\"gpu\": 0}, {\"rank\": 1, \"launcher_rank\": 2, \"node\": 0, "
             "\"gpu\": 1}, {\"rank\": 2, \"launcher_rank\": 1, \"node\": 1, "
             "\"gpu\": 0}, {\"rank\": 3, \"launcher_rank\": 3, \"node\": 1, "
             "\"gpu\": 1}], \"crossing\": {\"dp\": [0, 1], \"tp\": []}, "
             "\"misfits\": 0}}\n",
             NULL);
  /* Without placement flags the JSON keeps its plain form. */
  meshpg_out("plan --mesh dp=2,tp=2 --json", 0, NULL);
  cr_assert_null(strstr(out, "placement"), "%s", out);
}

Test(cli_plan, xml_orders_gpus_by_numa_node) {
  /* The interleaved workstation: tp pairs land on one NUMA node, i.e. on
   * GPUs {0,2} and {1,3}. */
  meshpg_out(
      "plan --mesh dp=2,tp=2 --xml tests/topologies/pcie-interleaved.xml "
      "--json",
      0,
      "{\"rank\": 0, \"launcher_rank\": 0, \"node\": 0, \"gpu\": 0}, "
      "{\"rank\": 1, \"launcher_rank\": 2, \"node\": 0, \"gpu\": 2}",
      NULL);
}

/* `meshpg plan ARGS --svg FILE`, which must succeed; returns the SVG (a
 * static buffer, overwritten by the next call). */
static const char *plan_svg(const char *args) {
  char path[] = "/tmp/mpg-svg-XXXXXX";
  int fd = mkstemp(path);
  cr_assert_geq(fd, 0);
  close(fd);
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "plan %s --svg %s", args, path);
  cr_assert_eq(meshpg(cmd), 0, "%s: %s", cmd, out);
  FILE *f = fopen(path, "r");
  cr_assert_not_null(f);
  static char svg[1 << 20];
  size_t len = fread(svg, 1, sizeof svg - 1, f);
  svg[len] = '\0';
  fclose(f);
  remove(path);
  cr_assert_lt(len, sizeof svg - 1, "%s: SVG too large for the test", args);
  return svg;
}

Test(cli_plan, svg_draws_nodes_by_gpus) {
  const char *svg =
      plan_svg("--mesh dp=2,cp=2,tp=4 --nodes 4 --rank-order cyclic --svg-groups cp");
  cr_assert(strstr(svg, "<svg "), "%s", svg);
  cr_assert(strstr(svg, "</svg>\n"));
  cr_assert(strstr(svg, "4 nodes x 4 GPUs (cyclic numbering), colour = \"cp\" group"));
  int cells = 0, crossing = 0;
  for (const char *p = svg; (p = strstr(p, "<title>mesh rank ")); p++) cells++;
  for (const char *p = svg; (p = strstr(p, "(crosses nodes)</title>")); p++) crossing++;
  cr_assert_eq(cells, 16);
  cr_assert_eq(crossing, 16, "tp=4 fills each node, so every cp group crosses");
  meshpg_out("plan --mesh dp=2,tp=4 --nodes 2 --svg /tmp/x.svg --svg-groups nope", 1,
             "no dim or flattened set named \"nope\"", NULL);
}

/* The value of attribute `name` in the element starting at `el` (up to its
 * '>'), or NULL. */
static const char *svg_attr(const char *el, const char *name, char *buf, size_t cap) {
  const char *end = strchr(el, '>');
  char key[64];
  snprintf(key, sizeof key, " %s=\"", name);
  const char *p = strstr(el, key);
  if (!p || (end && p > end)) return NULL;
  p += strlen(key);
  const char *q = strchr(p, '"');
  cr_assert_not_null(q, "unterminated attribute %s", name);
  size_t n = (size_t)(q - p) < cap - 1 ? (size_t)(q - p) : cap - 1;
  memcpy(buf, p, n);
  buf[n] = '\0';
  return buf;
}

static double svg_num(const char *el, const char *name) {
  char buf[64];
  cr_assert_not_null(svg_attr(el, name, buf, sizeof buf), "no %s in %.80s", name, el);
  char *end;
  double v = strtod(buf, &end);
  cr_assert(end != buf && *end == '\0', "%s=\"%s\" is not a number", name, buf);
  return v;
}

/* Characters of an element's text, an XML entity counting as one. */
static int svg_text_chars(const char *s, const char *end) {
  int n = 0;
  for (; s < end; n++) {
    if (*s == '&' && memchr(s, ';', (size_t)(end - s))) s = memchr(s, ';', (size_t)(end - s));
    s++;
  }
  return n;
}

/* Make the SVG of `meshpg plan ARGS --svg FILE` and check that every
 * <text> fits on the canvas, estimating its width as 0.65 em per character
 * (the bound tools/plan_placement.c sizes the canvas with: DejaVu Sans,
 * the widest common sans-serif, averages 0.52 em on these labels) and its
 * height as 1 em above the baseline, 0.25 em below.  Returns the count of
 * text elements. */
static int svg_text_fits(const char *args) {
  const char *svg = plan_svg(args);
  const char *root = strstr(svg, "<svg ");
  cr_assert_not_null(root, "%s", svg);
  double width = svg_num(root, "width"), height = svg_num(root, "height");
  double vx = 0, vy = 0, vw = width, vh = height;
  char vb[128];
  if (svg_attr(root, "viewBox", vb, sizeof vb))
    cr_assert_eq(sscanf(vb, "%lf %lf %lf %lf", &vx, &vy, &vw, &vh), 4, "viewBox=\"%s\"", vb);
  /* The user space drawn: the viewBox when there is one, mapped onto the
   * width x height canvas; a text must lie inside both. */
  double lo_x = vx > 0 ? vx : 0, lo_y = vy > 0 ? vy : 0;
  double hi_x = vx + vw < width ? vx + vw : width, hi_y = vy + vh < height ? vy + vh : height;

  int texts = 0;
  for (const char *el = svg; (el = strstr(el, "<text ")); el++) {
    const char *gt = strchr(el, '>'), *close_tag = strstr(el, "</text>");
    cr_assert(gt && close_tag && gt < close_tag, "%s: malformed <text>", args);
    double x = svg_num(el, "x"), y = svg_num(el, "y"), fs = svg_num(el, "font-size");
    char anchor[32] = "start";
    svg_attr(el, "text-anchor", anchor, sizeof anchor);
    int nch = svg_text_chars(gt + 1, close_tag);
    double w = nch * fs * 0.65;
    double x0 = strcmp(anchor, "middle") == 0 ? x - w / 2
                : strcmp(anchor, "end") == 0  ? x - w
                                              : x;
    cr_assert(strcmp(anchor, "start") == 0 || strcmp(anchor, "middle") == 0 ||
                  strcmp(anchor, "end") == 0,
              "text-anchor=\"%s\"", anchor);
    cr_assert(x0 >= lo_x && x0 + w <= hi_x,
              "%s: text \"%.*s\" (%d chars at %g px, anchor %s, x=%g) spans x %.1f..%.1f, "
              "outside the canvas %g..%g",
              args, (int)(close_tag - gt - 1), gt + 1, nch, fs, anchor, x, x0, x0 + w,
              lo_x, hi_x);
    cr_assert(y - fs >= lo_y && y + 0.25 * fs <= hi_y,
              "%s: text \"%.*s\" at y=%g (%g px) leaves the canvas height %g..%g", args,
              (int)(close_tag - gt - 1), gt + 1, y, fs, lo_y, hi_y);
    texts++;
  }
  return texts;
}

Test(cli_plan, svg_text_stays_on_the_canvas) {
  /* Title, legend, one header per GPU, one label per node, two per cell. */
  cr_assert_eq(svg_text_fits("examples/llama64.toml --world 64 --nodes 8 "
                             "--gpus-per-node 8 --rank-order cyclic"),
               2 + 8 + 8 + 2 * 64);
  cr_assert_eq(svg_text_fits("--mesh tp=2 --nodes 1"), 2 + 2 + 1 + 2 * 2);
  cr_assert_eq(svg_text_fits("--mesh tp=1 --nodes 1"), 2 + 1 + 1 + 2);
  cr_assert_eq(svg_text_fits("--mesh dp=2,cp=2,tp=4 --nodes 4 --rank-order cyclic "
                             "--svg-groups cp"),
               2 + 4 + 4 + 2 * 16);
  /* Long names widen the cells' labels; many nodes lengthen the node labels. */
  cr_assert_eq(svg_text_fits("--mesh data_parallel=4,tensor_parallel_group=2 --nodes 2 "
                             "--svg-groups tensor_parallel_group"),
               2 + 4 + 2 + 2 * 8);
  cr_assert_eq(svg_text_fits("--mesh dp=-1,tp=2 --world 256 --nodes 128 "
                             "--flatten a_rather_long_flattened_set=dp,tp "
                             "--svg-groups a_rather_long_flattened_set"),
               2 + 2 + 128 + 2 * 256);
}

Test(cli_plan, spec_topology_section_and_errors) {
  char path[] = "/tmp/mpg-spec-XXXXXX";
  int fd = mkstemp(path);
  cr_assert_geq(fd, 0);
  FILE *f = fdopen(fd, "w");
  fputs("[mesh]\n"
        "dims = [ { name = \"dp\", size = -1 }, { name = \"tp\", size = 4 } ]\n"
        "[topology]\n"
        "nodes = 2\n"
        "gpus_per_node = 4\n"
        "rank_order = \"cyclic\"\n",
        f);
  fclose(f);
  char args[512];
  snprintf(args, sizeof args, "plan %s --world 8 --json", path);
  meshpg_out(args, 0, "\"rank_order\": \"cyclic\"",
             "{\"rank\": 1, \"launcher_rank\": 2, \"node\": 0, \"gpu\": 1}", NULL);
  remove(path);
  meshpg_out("plan --mesh dp=2,tp=4 --nodes 3", 1, "world size 8 is not a multiple of nodes 3",
             NULL);
  meshpg_out("plan --mesh dp=2,tp=4 --nodes 2 --gpus-per-node 8", 1,
             "world size 8 does not equal nodes 2 x gpus_per_node 8 = 16", NULL);
  meshpg_out("plan --mesh dp=2,tp=4 --rank-order zigzag", 2, NULL);
  meshpg_out("plan --mesh dp=2,tp=4 --nodes 0", 2, NULL);
  meshpg_out("plan --mesh dp=2,tp=4 --xml tests/topologies/no-such.xml", 1, "cannot open", NULL);
}
