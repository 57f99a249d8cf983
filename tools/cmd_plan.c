/* meshpg plan: show the dims, the rank -> coordinate table and every group
 * of a mesh, as text or as JSON. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd.h"
#include "plan_placement.h"

static const char plan_usage[] =
    "usage: meshpg plan [SPEC.toml] [--mesh dp=2,cp=2,tp=2] "
    "[--flatten NAME=d1,d2]...\n"
    "                   [--order tp-cp-dp-pp] [--experts ep=N,tp=N,order=O]\n"
    "                   [--world N] [--rank R] [--json]\n"
    "\n"
    "  SPEC.toml          read the mesh (and other sections) from a spec file\n"
    "  --mesh DIMS        the dims, outermost first; replaces the spec's dims\n"
    "  --flatten N=D,..   add a flattened dim set (repeatable)\n"
    "  --order ORDER      reorder the dims by a Megatron order string\n"
    "                     (innermost first: tp-cp-dp-pp is the mesh pp,dp,cp,tp)\n"
    "  --experts KEYS     an expert (MoE) grid: ep=N (or auto), tp=N (default: the\n"
    "                     mesh's tp), order=ORDER (Megatron's, e.g. tp-cp-ep-dp-pp)\n"
    "  --world N          world size; resolves a -1 dim (default: the product)\n"
    "  --rank R           show only rank R's coordinate and groups\n"
    "  --json             print JSON instead of text\n";

/* Short listings for large worlds: show the head and tail of long lists. */
#define SHOW_ALL_UP_TO 64
#define SHOW_EDGE 8

static void print_ranks(const int *r, int n) {
  putchar('[');
  for (int i = 0; i < n; i++) printf("%s%d", i ? "," : "", r[i]);
  putchar(']');
}

static void print_rank_table(const mpg_mesh *m) {
  int nd = mpg_mesh_ndims(m), world = mpg_mesh_world_size(m);
  int coord[MPG_MAX_DIMS];
  printf("ranks (rank -> coordinate):\n  %6s", "rank");
  for (int d = 0; d < nd; d++) {
    const char *name;
    mpg_mesh_dim(m, d, &name, NULL);
    printf(" %5s", name);
  }
  putchar('\n');
  for (int r = 0; r < world; r++) {
    if (world > SHOW_ALL_UP_TO && r == SHOW_EDGE * 2) {
      printf("  %6s (%d ranks not shown)\n", "...", world - SHOW_EDGE * 4);
      r = world - SHOW_EDGE * 2 - 1;
      continue;
    }
    mpg_mesh_coord_of(m, r, coord);
    printf("  %6d", r);
    for (int d = 0; d < nd; d++) printf(" %5d", coord[d]);
    putchar('\n');
  }
}

static void print_groups(const mpg_mesh *m, int *buf) {
  printf("groups (ranks in group-rank order):\n");
  int nsets = mpg_mesh_num_dimsets(m);
  for (int s = 0; s < nsets; s++) {
    const char *name;
    int gsize, ngroups;
    mpg_mesh_dimset_info(m, s, &name, &gsize, &ngroups);
    printf("  %-8s %d group%s of %d:", name, ngroups, ngroups == 1 ? "" : "s",
           gsize);
    int lines = 0;
    for (int g = 0; g < ngroups; g++) {
      if (ngroups > SHOW_ALL_UP_TO && g == SHOW_EDGE) {
        printf(" ... (%d groups not shown)", ngroups - 2 * SHOW_EDGE);
        g = ngroups - SHOW_EDGE - 1;
        continue;
      }
      mpg_mesh_group_members(m, s, g, buf);
      if (gsize > SHOW_ALL_UP_TO) {
        printf("%s[%d,%d,...,%d] (%d ranks)", lines++ ? "\n           " : " ",
               buf[0], buf[1], buf[gsize - 1], gsize);
        continue;
      }
      putchar(' ');
      print_ranks(buf, gsize);
    }
    putchar('\n');
  }
}

static void print_text(const mpg_mesh *m, const mpg_spec *spec, int rank,
                       int *buf) {
  int nd = mpg_mesh_ndims(m);
  printf("mesh:");
  for (int d = 0; d < nd; d++) {
    const char *name;
    int size;
    mpg_mesh_dim(m, d, &name, &size);
    printf("%s%s=%d", d ? " x " : " ", name, size);
  }
  printf("  (world %d%s%s)\n", mpg_mesh_world_size(m),
         spec->source[0] ? ", from " : "", spec->source);
  int ne = mpg_mesh_expert_ndims(m);
  if (ne > 0) {
    printf("experts:");
    for (int d = 0; d < ne; d++) {
      const char *name;
      int size;
      mpg_mesh_expert_dim(m, d, &name, &size);
      printf("%s%s=%d", d ? " x " : " ", name, size);
    }
    printf("  (groups etp, ep, edp, etp_ep, etp_ep_pp)\n");
  }
  if (rank >= 0) {
    int coord[MPG_MAX_DIMS];
    mpg_mesh_coord_of(m, rank, coord);
    printf("rank %d at (", rank);
    for (int d = 0; d < nd; d++) {
      const char *name;
      mpg_mesh_dim(m, d, &name, NULL);
      printf("%s%s=%d", d ? ", " : "", name, coord[d]);
    }
    printf(")\ngroups of rank %d:\n", rank);
    for (int s = 0; s < mpg_mesh_num_dimsets(m); s++) {
      const char *name;
      int gi, pos, gsize, ngroups;
      mpg_mesh_dimset_info(m, s, &name, NULL, &ngroups);
      mpg_mesh_group_of(m, s, rank, &gi, &pos, &gsize);
      mpg_mesh_group_members(m, s, gi, buf);
      printf("  %-8s group %d of %d, position %d of %d: ", name, gi, ngroups,
             pos, gsize);
      if (gsize > SHOW_ALL_UP_TO)
        printf("[%d,%d,...,%d]", buf[0], buf[1], buf[gsize - 1]);
      else
        print_ranks(buf, gsize);
      putchar('\n');
    }
    return;
  }
  print_rank_table(m);
  print_groups(m, buf);
}

static void json_string(const char *s) {
  /* Names are [A-Za-z0-9_] by validation: no escaping is needed. */
  printf("\"%s\"", s);
}

static void print_json(const mpg_mesh *m, int rank, int *buf,
                       const plan_placement *pp) {
  int nd = mpg_mesh_ndims(m), nsets = mpg_mesh_num_dimsets(m);
  printf("{\"world_size\": %d, \"dims\": [", mpg_mesh_world_size(m));
  for (int d = 0; d < nd; d++) {
    const char *name;
    int size;
    mpg_mesh_dim(m, d, &name, &size);
    printf("%s{\"name\": ", d ? ", " : "");
    json_string(name);
    printf(", \"size\": %d}", size);
  }
  printf("]");
  int ne = mpg_mesh_expert_ndims(m);
  if (ne > 0) {
    printf(", \"experts\": [");
    for (int d = 0; d < ne; d++) {
      const char *name;
      int size;
      mpg_mesh_expert_dim(m, d, &name, &size);
      printf("%s{\"name\": ", d ? ", " : "");
      json_string(name);
      printf(", \"size\": %d}", size);
    }
    printf("]");
  }
  printf(", \"groups\": {");
  /* One entry per dim, flattened set and expert set; "world" is left out. */
  for (int s = 0; s < nsets - 1; s++) {
    const char *name;
    int gsize, ngroups;
    mpg_mesh_dimset_info(m, s, &name, &gsize, &ngroups);
    printf("%s", s ? ", " : "");
    json_string(name);
    printf(": [");
    for (int g = 0; g < ngroups; g++) {
      mpg_mesh_group_members(m, s, g, buf);
      printf("%s[", g ? ", " : "");
      for (int i = 0; i < gsize; i++) printf("%s%d", i ? ", " : "", buf[i]);
      putchar(']');
    }
    putchar(']');
  }
  putchar('}');
  if (rank >= 0) {
    int coord[MPG_MAX_DIMS];
    mpg_mesh_coord_of(m, rank, coord);
    printf(", \"rank\": {\"rank\": %d, \"coord\": [", rank);
    for (int d = 0; d < nd; d++) printf("%s%d", d ? ", " : "", coord[d]);
    printf("], \"groups\": {");
    for (int s = 0; s < nsets - 1; s++) {
      const char *name;
      int gi, pos, gsize;
      mpg_mesh_dimset_info(m, s, &name, NULL, NULL);
      mpg_mesh_group_of(m, s, rank, &gi, &pos, &gsize);
      printf("%s", s ? ", " : "");
      json_string(name);
      printf(": {\"index\": %d, \"position\": %d}", gi, pos);
    }
    printf("}}");
  }
  if (pp) {
    printf(", ");
    plan_place_json(stdout, pp, m);
  }
  printf("}\n");
}

/* The [sync] dims lists of the spec (shard_dims, replicate_dims,
 * expert_shard_dims) name dims or flattened sets of this mesh: a plan that
 * mpg_sync_create would refuse is refused here too, with the library's
 * "did you mean".  0, or TOOL_EXIT_FAIL after the message. */
static int check_sync_dims(const mpg_mesh *mesh, const mpg_spec *spec, const char *path) {
  const struct {
    const char *key, *value;
  } lists[] = {{"shard_dims", spec->sync.shard_dims},
               {"replicate_dims", spec->sync.replicate_dims},
               {"expert_shard_dims", spec->sync.expert_shard_dims}};
  for (size_t k = 0; k < sizeof lists / sizeof lists[0]; k++) {
    char what[320];
    unsigned mask;
    snprintf(what, sizeof what, "%s: sync.%s =", path ? path : "--mesh", lists[k].key);
    if (tool_dims_mask(mesh, lists[k].value, what, &mask) != 0) return TOOL_EXIT_FAIL;
  }
  return 0;
}

int cmd_plan(int argc, char **argv) {
  tool_spec args = {0};
  int rank = -1, json = 0;
  mpg_spec spec = MPG_SPEC_INIT;

  plan_place_args place_args;
  plan_place_args_init(&place_args);
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    int placed = plan_place_parse(&place_args, argc, argv, &i);
    if (placed < 0) return TOOL_EXIT_USAGE;
    if (placed) continue;
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      fputs(plan_usage, stdout);
      fputs(plan_place_usage, stdout);
      return TOOL_EXIT_OK;
    } else if (strcmp(a, "--json") == 0) {
      json = 1;
    } else if (strcmp(a, "--rank") == 0) {
      if (i + 1 >= argc) {
        tool_error("%s needs a value", a);
        tool_usage_hint(plan_usage);
        return TOOL_EXIT_USAGE;
      }
      if (!tool_parse_int("--rank", argv[++i], 0, &rank)) return TOOL_EXIT_USAGE;
    } else {
      int took = tool_spec_arg(&args, argc, argv, &i, plan_usage);
      if (took < 0) return TOOL_EXIT_USAGE;
      if (!took) {
        tool_error("unknown option \"%s\"", a);
        tool_usage_hint(plan_usage);
        return TOOL_EXIT_USAGE;
      }
    }
  }
  if (!args.path && !args.mesh) {
    tool_error("give a spec file or --mesh");
    tool_usage_hint(plan_usage);
    return TOOL_EXIT_USAGE;
  }
  int world = args.world;
  mpg_status st = tool_spec_load(&args, NULL, &spec);
  mpg_mesh *mesh = NULL;
  if (st) return tool_fail(st, NULL);
  st = mpg_mesh_create(&spec, world, &mesh);
  if (st) return tool_mesh_fail(st, &spec, world);
  if (check_sync_dims(mesh, &spec, args.path)) {
    mpg_mesh_destroy(mesh);
    return TOOL_EXIT_FAIL;
  }
  int world_size = mpg_mesh_world_size(mesh);
  if (rank >= world_size) {
    tool_error("--rank: rank %d is outside the world of %d ranks", rank,
               world_size);
    mpg_mesh_destroy(mesh);
    return TOOL_EXIT_FAIL;
  }
  int *buf = malloc(sizeof(int) * (size_t)world_size);
  if (!buf) {
    tool_error("out of memory for %d ranks", world_size);
    mpg_mesh_destroy(mesh);
    return TOOL_EXIT_FAIL;
  }
  plan_placement *pp = NULL;
  int rc = plan_place_build(&place_args, &spec, mesh, &pp);
  if (rc) {
    free(buf);
    mpg_mesh_destroy(mesh);
    return rc;
  }
  if (json) {
    print_json(mesh, rank, buf, pp);
  } else {
    print_text(mesh, &spec, rank, buf);
    if (rank >= 0)
      plan_place_print_rank(stdout, pp, rank);
    else
      plan_place_print(stdout, pp, mesh);
  }
  rc = plan_place_svg(pp, mesh);
  plan_place_free(pp);
  free(buf);
  mpg_mesh_destroy(mesh);
  return rc;
}
