/* The placement part of `meshpg plan`: the flags --nodes, --gpus-per-node,
 * --xml, --rank-order, --strict, --svg, --svg-groups; the placement table
 * that marks every group crossing a node; the JSON "placement" field; the
 * SVG drawing of nodes x GPUs.
 *
 * Use from cmd_plan.c:
 *   plan_place_args pa;  plan_place_args_init(&pa);
 *   in the option loop:  int k = plan_place_parse(&pa, argc, argv, &i);
 *                        if (k < 0) return TOOL_EXIT_USAGE; if (k) continue;
 *   after the mesh is made:
 *     plan_placement *pp = NULL;
 *     int rc = plan_place_build(&pa, &spec, mesh, &pp);   (pp stays NULL
 *     if (rc) return rc;                                        when no flag
 *   text:  after the groups, plan_place_print(stdout, pp, mesh)    asks)
 *          (or, with --rank R, plan_place_print_rank(stdout, pp, R));
 *   JSON:  before the closing '}', if (pp) { printf(", ");
 *            plan_place_json(stdout, pp, mesh); }
 *   then:  rc = plan_place_svg(pp, mesh); plan_place_free(pp);
 */
#ifndef TOOLS_PLAN_PLACEMENT_H
#define TOOLS_PLAN_PLACEMENT_H

#include <stdio.h>

#include "meshpg.h"

typedef struct plan_place_args {
  int nodes;          /* --nodes N, -1 if not given */
  int gpus_per_node;  /* --gpus-per-node G, -1 if not given */
  int rank_order;     /* --rank-order block|cyclic, -1 if not given */
  int strict;         /* --strict: 1, -1 if not given */
  const char *xml;    /* --xml FILE: every node's topology */
  const char *svg;    /* --svg FILE */
  const char *svg_groups; /* --svg-groups NAME: the dim set coloured */
} plan_place_args;

/* The usage lines of the flags above, for plan's --help. */
extern const char plan_place_usage[];

void plan_place_args_init(plan_place_args *a);

/* If argv[*i] is one of the flags above, take it (and its value: *i then
 * points at the value) and return 1; return 0 if it is another argument; -1
 * on a usage error, already printed. */
int plan_place_parse(plan_place_args *a, int argc, char **argv, int *i);

/* Everything the printers need; opaque. */
typedef struct plan_placement plan_placement;

/* Place the mesh when a flag above was given or the spec's [topology] sets
 * nodes or gpus_per_node; otherwise set *out = NULL and return 0.  Returns
 * the exit code: 0, or 1 (message printed) for a topology file that does
 * not load, a layout that does not match the world size, a strict
 * placement with groups crossing nodes, or an unknown --svg-groups set. */
int plan_place_build(const plan_place_args *a, const mpg_spec *spec,
                     const mpg_mesh *mesh, plan_placement **out);

/* The placement as text: every mesh rank's launcher rank, node and GPU;
 * each node's GPUs; every group with its nodes, crossing groups marked.
 * NULL pp prints nothing. */
void plan_place_print(FILE *f, const plan_placement *pp,
                      const mpg_mesh *mesh);

/* With plan --rank R: one line, where mesh rank R runs.  NULL pp prints
 * nothing. */
void plan_place_print_rank(FILE *f, const plan_placement *pp, int rank);

/* The JSON member `"placement": {...}` (no separator before or after):
 * {"nodes": N, "gpus_per_node": G, "rank_order": "block"|"cyclic",
 *  "inner_dims": [...], "ranks": [{"rank": R, "launcher_rank": L,
 *  "node": N, "gpu": G}, ...] (by mesh rank), "crossing": {SET: [group
 *  indices spanning several nodes], ...} (every dim and flattened set),
 *  "misfits": M}. */
void plan_place_json(FILE *f, const plan_placement *pp,
                     const mpg_mesh *mesh);

/* Write the --svg file if one was asked for.  Returns the exit code (1 with
 * a message when the file cannot be written). */
int plan_place_svg(const plan_placement *pp, const mpg_mesh *mesh);

void plan_place_free(plan_placement *pp);

#endif
