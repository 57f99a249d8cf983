/* The placement part of `meshpg plan` (see plan_placement.h). */
#include "plan_placement.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tool_util.h"

const char plan_place_usage[] =
    "placement across nodes (any of these turns it on):\n"
    "  --nodes N          nodes in the job (default: [topology] nodes)\n"
    "  --gpus-per-node G  ranks per node (default: [topology] gpus_per_node,\n"
    "                     else the GPU count of --xml, else world / nodes)\n"
    "  --xml FILE         hwloc XML topology of every node: orders GPUs by\n"
    "                     NUMA node and PCIe switch when there is no NVLink\n"
    "                     fabric\n"
    "  --rank-order ORDER how the launcher numbers ranks: block (node by\n"
    "                     node) or cyclic (round-robin, Slurm cyclic)\n"
    "  --strict           a tp/cp group crossing nodes is an error (exit 1)\n"
    "  --svg FILE         draw nodes x GPUs, coloured by the groups of\n"
    "  --svg-groups NAME  this dim set (default: tp, else the innermost dim)\n";

struct plan_placement {
  mpg_placement *pl;
  mpg_topo *topo;
  int nodes, gpn;
  mpg_rank_order order;
  int misfits;
  int strict;
  int svg_set;
  const char *svg;
};

#define SHOW_ALL_UP_TO 64
#define SHOW_EDGE 8

void plan_place_args_init(plan_place_args *a) {
  memset(a, 0, sizeof *a);
  a->nodes = a->gpus_per_node = a->rank_order = a->strict = -1;
}

int plan_place_parse(plan_place_args *a, int argc, char **argv, int *i) {
  const char *f = argv[*i];
  if (strcmp(f, "--strict") == 0) {
    a->strict = 1;
    return 1;
  }
  static const char *const with_value[] = {"--nodes", "--gpus-per-node", "--xml",
                                           "--rank-order", "--svg", "--svg-groups"};
  int known = 0;
  for (size_t k = 0; k < sizeof with_value / sizeof *with_value; k++)
    if (strcmp(f, with_value[k]) == 0) known = 1;
  if (!known) return 0;
  if (*i + 1 >= argc) {
    tool_error("%s needs a value", f);
    return -1;
  }
  const char *v = argv[++*i];
  if (strcmp(f, "--nodes") == 0) {
    if (!tool_parse_int("--nodes", v, 1, &a->nodes)) return -1;
  } else if (strcmp(f, "--gpus-per-node") == 0) {
    if (!tool_parse_int("--gpus-per-node", v, 1, &a->gpus_per_node)) return -1;
  } else if (strcmp(f, "--rank-order") == 0) {
    if (strcmp(v, "block") == 0) a->rank_order = MPG_RANK_ORDER_BLOCK;
    else if (strcmp(v, "cyclic") == 0) a->rank_order = MPG_RANK_ORDER_CYCLIC;
    else {
      tool_error("--rank-order: expected block or cyclic, found \"%s\"", v);
      return -1;
    }
  } else if (strcmp(f, "--xml") == 0) {
    a->xml = v;
  } else if (strcmp(f, "--svg") == 0) {
    a->svg = v;
  } else {
    a->svg_groups = v;
  }
  return 1;
}

void plan_place_free(plan_placement *pp) {
  if (!pp) return;
  mpg_placement_destroy(pp->pl);
  mpg_topo_destroy(pp->topo);
  free(pp);
}

int plan_place_build(const plan_place_args *a, const mpg_spec *spec,
                     const mpg_mesh *mesh, plan_placement **out) {
  *out = NULL;
  int wanted = a->nodes > 0 || a->gpus_per_node > 0 || a->rank_order >= 0 ||
               a->strict > 0 || a->xml || a->svg || a->svg_groups ||
               spec->topology.nodes > 0 || spec->topology.gpus_per_node > 0;
  if (!wanted) return TOOL_EXIT_OK;
  plan_placement *pp = calloc(1, sizeof *pp);
  if (!pp) {
    tool_error("out of memory");
    return TOOL_EXIT_FAIL;
  }
  mpg_placement_opts o = MPG_PLACEMENT_OPTS_INIT;
  o.topology = spec->topology;
  if (a->nodes > 0) o.topology.nodes = a->nodes;
  if (a->gpus_per_node > 0) o.topology.gpus_per_node = a->gpus_per_node;
  if (a->rank_order >= 0) o.topology.rank_order = (mpg_rank_order)a->rank_order;
  if (a->strict > 0) o.topology.strict = 1;
  mpg_status st = MPG_OK;
  if (a->xml) st = mpg_topo_load_xml(a->xml, &pp->topo);
  o.topo = pp->topo;
  if (!st) st = mpg_placement_create(mesh, &o, &pp->pl);
  if (!st) st = mpg_placement_check(pp->pl, 0, &pp->misfits);
  if (st) {
    tool_fail(st, NULL);
    plan_place_free(pp);
    return TOOL_EXIT_FAIL;
  }
  pp->nodes = mpg_placement_num_nodes(pp->pl);
  pp->gpn = mpg_mesh_world_size(mesh) / pp->nodes;
  pp->order = o.topology.rank_order;
  pp->strict = o.topology.strict;
  pp->svg = a->svg;
  pp->svg_set = -1;
  if (a->svg || a->svg_groups) {
    const char *name = a->svg_groups;
    if (!name) {
      int s;
      const char *inner;
      mpg_mesh_dim(mesh, mpg_mesh_ndims(mesh) - 1, &inner, NULL);
      name = mpg_mesh_dimset_find(mesh, "tp", &s) == MPG_OK ? "tp" : inner;
    }
    st = mpg_mesh_dimset_find(mesh, name, &pp->svg_set);
    if (st != MPG_OK) {
      tool_fail(st, "--svg-groups");
      plan_place_free(pp);
      return TOOL_EXIT_FAIL;
    }
  }
  *out = pp;
  return TOOL_EXIT_OK;
}

/* Scratch for group_nodes: members and nodes with room for a whole world,
 * and seen[] (a flag per node, all 0 between calls) so that finding a
 * group's distinct nodes is linear in the group size, not size x nodes. */
typedef struct group_scratch {
  int *members, *nodes;
  unsigned char *seen;
} group_scratch;

static int scratch_init(group_scratch *s, const plan_placement *pp, int world) {
  s->members = malloc(sizeof(int) * (size_t)world);
  s->nodes = malloc(sizeof(int) * (size_t)world);
  s->seen = calloc((size_t)pp->nodes, 1);
  return s->members && s->nodes && s->seen;
}

static void scratch_free(group_scratch *s) {
  free(s->members);
  free(s->nodes);
  free(s->seen);
}

static int cmp_int(const void *a, const void *b) {
  int x = *(const int *)a, y = *(const int *)b;
  return (x > y) - (x < y);
}

/* The distinct nodes of group g of a set: s->members gets the group,
 * s->nodes its nodes (ascending when sorted, else in first-seen order).
 * Returns the node count. */
static int group_nodes(const plan_placement *pp, const mpg_mesh *mesh, int set,
                       int g, group_scratch *s, int sorted) {
  int gsize;
  mpg_mesh_dimset_info(mesh, set, NULL, &gsize, NULL);
  mpg_mesh_group_members(mesh, set, g, s->members);
  int n = 0, ascending = 1;
  for (int i = 0; i < gsize; i++) {
    int node;
    mpg_placement_of(pp->pl, s->members[i], NULL, &node, NULL);
    if (s->seen[node]) continue;
    s->seen[node] = 1;
    if (n && node < s->nodes[n - 1]) ascending = 0;
    s->nodes[n++] = node;
  }
  for (int k = 0; k < n; k++) s->seen[s->nodes[k]] = 0;
  if (sorted && !ascending) qsort(s->nodes, (size_t)n, sizeof(int), cmp_int);
  return n;
}

static void print_list(FILE *f, const int *v, int n) {
  fputc('[', f);
  if (n > 16) {
    fprintf(f, "%d,%d,...,%d] (%d ranks)", v[0], v[1], v[n - 1], n);
    return;
  }
  for (int i = 0; i < n; i++) fprintf(f, "%s%d", i ? "," : "", v[i]);
  fputc(']', f);
}

/* "0,1" / "0-3" style node lists: runs of 3 or more become ranges. */
static void print_nodes(FILE *f, const int *v, int n) {
  int shown = 0;
  for (int i = 0; i < n;) {
    int j = i;
    while (j + 1 < n && v[j + 1] == v[j] + 1) j++;
    if (shown++ == 8) {
      fprintf(f, ",... (%d nodes)", n);
      return;
    }
    if (i) fputc(',', f);
    if (j - i >= 2) fprintf(f, "%d-%d", v[i], v[j]);
    else if (j == i + 1) fprintf(f, "%d,%d", v[i], v[j]);
    else fprintf(f, "%d", v[i]);
    i = j + 1;
  }
}

static void print_inner(FILE *f, const plan_placement *pp, const mpg_mesh *mesh) {
  int any = 0;
  for (int d = 0; d < mpg_mesh_ndims(mesh); d++)
    if (mpg_placement_dimset_is_inner(pp->pl, d)) {
      const char *name;
      mpg_mesh_dim(mesh, d, &name, NULL);
      fprintf(f, "%s%s", any++ ? ", " : "", name);
    }
  if (!any) fprintf(f, "none");
}

void plan_place_print(FILE *f, const plan_placement *pp,
                      const mpg_mesh *mesh) {
  if (!pp) return;
  int world = mpg_mesh_world_size(mesh);
  fprintf(f, "placement (mesh rank -> launcher rank, node, GPU): %d node%s x %d GPU%s, %s launcher numbering%s%s; inner dims: ",
          pp->nodes, pp->nodes == 1 ? "" : "s", pp->gpn, pp->gpn == 1 ? "" : "s",
          pp->order == MPG_RANK_ORDER_CYCLIC ? "cyclic" : "block",
          pp->topo ? ", topology " : "", pp->topo ? mpg_topo_source(pp->topo) : "");
  print_inner(f, pp, mesh);
  fprintf(f, "\n  %6s %9s %5s %4s\n", "rank", "launcher", "node", "gpu");
  for (int r = 0; r < world; r++) {
    if (world > SHOW_ALL_UP_TO && r == SHOW_EDGE * 2) {
      fprintf(f, "  %6s (%d ranks not shown)\n", "...", world - SHOW_EDGE * 4);
      r = world - SHOW_EDGE * 2 - 1;
      continue;
    }
    int L, node, gpu;
    mpg_placement_of(pp->pl, r, &L, &node, &gpu);
    fprintf(f, "  %6d %9d %5d %4d\n", r, L, node, gpu);
  }
  int *grid = malloc(sizeof(int) * (size_t)world);
  group_scratch gs;
  if (!scratch_init(&gs, pp, world) || !grid) {
    free(grid);
    scratch_free(&gs);
    return;
  }
  for (int r = 0; r < world; r++) {
    int node, gpu;
    mpg_placement_of(pp->pl, r, NULL, &node, &gpu);
    grid[node * pp->gpn + gpu] = r;
  }
  fprintf(f, "nodes (mesh ranks on GPU 0..%d):\n", pp->gpn - 1);
  for (int n = 0; n < pp->nodes; n++) {
    if (pp->nodes > SHOW_ALL_UP_TO && n == SHOW_EDGE) {
      fprintf(f, "  ... (%d nodes not shown)\n", pp->nodes - 2 * SHOW_EDGE);
      n = pp->nodes - SHOW_EDGE - 1;
      continue;
    }
    fprintf(f, "  node %d: ", n);
    print_list(f, grid + n * pp->gpn, pp->gpn);
    fputc('\n', f);
  }
  fprintf(f, "groups by node (\"crosses\": the group spans several nodes; "
             "\"misfit\": an inner dim's group does):\n");
  int nsets = mpg_mesh_num_dimsets(mesh);
  for (int s = 0; s < nsets - 1; s++) { /* "world" (last) spans every node */
    const char *name;
    int gsize, ngroups, crossing = 0;
    mpg_mesh_dimset_info(mesh, s, &name, &gsize, &ngroups);
    for (int g = 0; g < ngroups; g++)
      if (group_nodes(pp, mesh, s, g, &gs, 0) > 1) crossing++;
    int inner = mpg_placement_dimset_is_inner(pp->pl, s);
    fprintf(f, "  %s: %d group%s of %d, %d crossing nodes%s\n", name, ngroups,
            ngroups == 1 ? "" : "s", gsize, crossing, inner ? " (inner dim)" : "");
    for (int g = 0; g < ngroups; g++) {
      if (ngroups > SHOW_ALL_UP_TO && g == SHOW_EDGE) {
        fprintf(f, "    ... (%d groups not shown)\n", ngroups - 2 * SHOW_EDGE);
        g = ngroups - SHOW_EDGE - 1;
        continue;
      }
      int nn = group_nodes(pp, mesh, s, g, &gs, 1);
      fprintf(f, "    %s ", name);
      print_list(f, gs.members, gsize);
      fprintf(f, " node%s ", nn == 1 ? "" : "s");
      print_nodes(f, gs.nodes, nn);
      if (nn > 1) fprintf(f, "  crosses%s", inner ? ", misfit" : "");
      fputc('\n', f);
    }
  }
  if (pp->misfits)
    fprintf(f, "misfits: %d group%s of inner dims cross nodes%s\n", pp->misfits,
            pp->misfits == 1 ? "" : "s",
            pp->strict ? "" : " (warning; strict = true or --strict makes it an error)");
  else
    fprintf(f, "misfits: none\n");
  free(grid);
  scratch_free(&gs);
}

void plan_place_print_rank(FILE *f, const plan_placement *pp, int rank) {
  if (!pp) return;
  int L, node, gpu;
  if (mpg_placement_of(pp->pl, rank, &L, &node, &gpu) != MPG_OK) return;
  fprintf(f, "placement: rank %d runs as launcher rank %d on node %d, GPU %d "
             "(%d nodes x %d GPUs, %s numbering)\n",
          rank, L, node, gpu, pp->nodes, pp->gpn,
          pp->order == MPG_RANK_ORDER_CYCLIC ? "cyclic" : "block");
}

void plan_place_json(FILE *f, const plan_placement *pp,
                     const mpg_mesh *mesh) {
  if (!pp) return;
  int world = mpg_mesh_world_size(mesh);
  fprintf(f, "\"placement\": {\"nodes\": %d, \"gpus_per_node\": %d, "
             "\"rank_order\": \"%s\", \"inner_dims\": [",
          pp->nodes, pp->gpn, pp->order == MPG_RANK_ORDER_CYCLIC ? "cyclic" : "block");
  int k = 0;
  for (int d = 0; d < mpg_mesh_ndims(mesh); d++)
    if (mpg_placement_dimset_is_inner(pp->pl, d)) {
      const char *name;
      mpg_mesh_dim(mesh, d, &name, NULL);
      fprintf(f, "%s\"%s\"", k++ ? ", " : "", name);
    }
  fprintf(f, "], \"ranks\": [");
  for (int r = 0; r < world; r++) {
    int L, node, gpu;
    mpg_placement_of(pp->pl, r, &L, &node, &gpu);
    fprintf(f, "%s{\"rank\": %d, \"launcher_rank\": %d, \"node\": %d, \"gpu\": %d}",
            r ? ", " : "", r, L, node, gpu);
  }
  fprintf(f, "], \"crossing\": {");
  group_scratch gs;
  int ok = scratch_init(&gs, pp, world);
  int nsets = mpg_mesh_num_dimsets(mesh);
  for (int s = 0; ok && s < nsets - 1; s++) {
    const char *name;
    int ngroups, first = 1;
    mpg_mesh_dimset_info(mesh, s, &name, NULL, &ngroups);
    fprintf(f, "%s\"%s\": [", s ? ", " : "", name);
    for (int g = 0; g < ngroups; g++)
      if (group_nodes(pp, mesh, s, g, &gs, 0) > 1) {
        fprintf(f, "%s%d", first ? "" : ", ", g);
        first = 0;
      }
    fputc(']', f);
  }
  scratch_free(&gs);
  fprintf(f, "}, \"misfits\": %d}", pp->misfits);
}

/* A light colour of hue h (saturation 65%, lightness 72%) as "#rrggbb":
 * plain hex, which every SVG renderer reads. */
static void hsl_hex(char out[8], int h) {
  const double s = 0.65, l = 0.72;
  double c = (1 - fabs(2 * l - 1)) * s;
  double hp = h / 60.0;
  double x = c * (1 - fabs(fmod(hp, 2) - 1));
  double r = 0, g = 0, b = 0;
  if (hp < 1) r = c, g = x;
  else if (hp < 2) r = x, g = c;
  else if (hp < 3) g = c, b = x;
  else if (hp < 4) g = x, b = c;
  else if (hp < 5) r = x, b = c;
  else r = c, b = x;
  double m = l - c / 2;
  snprintf(out, 8, "#%02x%02x%02x", (int)((r + m) * 255 + 0.5),
           (int)((g + m) * 255 + 0.5), (int)((b + m) * 255 + 0.5));
}

/* The SVG's text is drawn in the viewer's sans-serif font, whose glyph
 * widths the tool cannot know.  0.65 em per character bounds it: in DejaVu
 * Sans, the widest common sans-serif, the labels drawn here average 0.52 em
 * per character and a digit is 0.64 em (Liberation Sans / Arial / Helvetica
 * are narrower).  The canvas and the cells are sized with this estimate so
 * no text runs past them.  tests/topo/test_cli_topo.c checks with the same
 * factor. */
#define SVG_EM_PER_CHAR 0.65

/* Width in pixels of n characters at font size px, rounded up. */
static int svg_text_px(int n, int px) {
  return (int)ceil(n * px * SVG_EM_PER_CHAR);
}

static int imax(int a, int b) { return a > b ? a : b; }

int plan_place_svg(const plan_placement *pp, const mpg_mesh *mesh) {
  if (!pp || !pp->svg) return TOOL_EXIT_OK;
  FILE *f = fopen(pp->svg, "w");
  if (!f) {
    tool_error("--svg: cannot write \"%s\": %s", pp->svg, strerror(errno));
    return TOOL_EXIT_FAIL;
  }
  int world = mpg_mesh_world_size(mesh);
  const char *set_name;
  int gsize, ngroups;
  mpg_mesh_dimset_info(mesh, pp->svg_set, &set_name, &gsize, &ngroups);
  group_scratch gs;
  int ok = scratch_init(&gs, pp, world);
  unsigned char *crosses = calloc((size_t)ngroups, 1);
  int *grid = malloc(sizeof(int) * (size_t)world);
  if (!ok || !crosses || !grid) {
    scratch_free(&gs);
    free(crosses);
    free(grid);
    fclose(f);
    tool_error("out of memory");
    return TOOL_EXIT_FAIL;
  }
  for (int g = 0; g < ngroups; g++)
    crosses[g] = group_nodes(pp, mesh, pp->svg_set, g, &gs, 0) > 1;
  for (int r = 0; r < world; r++) {
    int node, gpu;
    mpg_placement_of(pp->pl, r, NULL, &node, &gpu);
    grid[node * pp->gpn + gpu] = r;
  }
  /* The text first, then a canvas that holds it: the node labels set the
   * left margin, the widest cell label the cell width, the title the
   * width when it is wider than the grid. */
  char title[256];
  static const char legend[] =
      "cell: mesh rank r, launcher rank L; red dashed border = group spans "
      "several nodes";
  int title_len = snprintf(
      title, sizeof title,
      "meshpg placement: %d nodes x %d GPUs (%s numbering), colour = \"%s\" "
      "group (%d groups of %d)",
      pp->nodes, pp->gpn,
      pp->order == MPG_RANK_ORDER_CYCLIC ? "cyclic" : "block", set_name,
      ngroups, gsize);
  int label = svg_text_px(snprintf(NULL, 0, "GPU %d", pp->gpn - 1), 12);
  for (int r = 0; r < world; r++) {
    int gi, L;
    mpg_mesh_group_of(mesh, pp->svg_set, r, &gi, NULL, NULL);
    mpg_placement_of(pp->pl, r, &L, NULL, NULL);
    label = imax(label, svg_text_px(snprintf(NULL, 0, "r%d", r), 13));
    label = imax(label,
                 svg_text_px(snprintf(NULL, 0, "L%d %s%d", L, set_name, gi), 10));
  }
  const int ch = 44, top = 70;
  const int cw = imax(64, label + 8);
  const int left =
      imax(84, 10 + svg_text_px(snprintf(NULL, 0, "node %d", pp->nodes - 1), 12) + 10);
  int width = left + pp->gpn * cw + 20, height = top + pp->nodes * ch + 40;
  width = imax(width, 10 + svg_text_px(title_len, 15) + 10);
  width = imax(width, 10 + svg_text_px((int)strlen(legend), 12) + 10);
  fprintf(f,
          "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
          "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
          "viewBox=\"0 0 %d %d\" font-family=\"sans-serif\">\n"
          "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
          "<text x=\"10\" y=\"22\" font-size=\"15\">%s</text>\n"
          "<text x=\"10\" y=\"42\" font-size=\"12\">%s</text>\n",
          width, height, width, height, title, legend);
  for (int g = 0; g < pp->gpn; g++)
    fprintf(f, "<text x=\"%d\" y=\"%d\" font-size=\"12\" text-anchor=\"middle\">GPU %d</text>\n",
            left + g * cw + cw / 2, top - 6, g);
  for (int n = 0; n < pp->nodes; n++) {
    fprintf(f, "<text x=\"10\" y=\"%d\" font-size=\"12\">node %d</text>\n",
            top + n * ch + ch / 2 + 4, n);
    for (int g = 0; g < pp->gpn; g++) {
      int r = grid[n * pp->gpn + g], gi, L;
      mpg_mesh_group_of(mesh, pp->svg_set, r, &gi, NULL, NULL);
      mpg_placement_of(pp->pl, r, &L, NULL, NULL);
      char fill[8];
      hsl_hex(fill, (int)((gi * 137L) % 360));
      int x = left + g * cw, y = top + n * ch;
      fprintf(f,
              "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" "
              "fill=\"%s\" stroke=\"%s\" stroke-width=\"%d\"%s>"
              "<title>mesh rank %d, launcher rank %d, node %d, GPU %d, %s group %d%s</title>"
              "</rect>\n",
              x + 2, y + 2, cw - 4, ch - 4, fill, crosses[gi] ? "#d00000" : "#444444",
              crosses[gi] ? 3 : 1, crosses[gi] ? " stroke-dasharray=\"5,3\"" : "", r,
              L, n, g, set_name, gi, crosses[gi] ? " (crosses nodes)" : "");
      fprintf(f,
              "<text x=\"%d\" y=\"%d\" font-size=\"13\" text-anchor=\"middle\">r%d</text>\n"
              "<text x=\"%d\" y=\"%d\" font-size=\"10\" text-anchor=\"middle\">L%d %s%d</text>\n",
              x + cw / 2, y + 19, r, x + cw / 2, y + 34, L, set_name, gi);
    }
  }
  fprintf(f, "</svg>\n");
  int bad = ferror(f);
  if (fclose(f) != 0) bad = 1;
  scratch_free(&gs);
  free(crosses);
  free(grid);
  if (bad) {
    tool_error("--svg: error writing \"%s\"", pp->svg);
    return TOOL_EXIT_FAIL;
  }
  return TOOL_EXIT_OK;
}
