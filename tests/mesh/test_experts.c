/* The expert (MoE) grid: [experts] / mpg_spec_set_experts, its dim sets
 * (etp, ep, edp, etp_ep, etp_ep_pp), validation as Megatron's
 * initialize_model_parallel does it, and groups made from it.
 *
 * The hand-checked groups below were worked out from Megatron's
 * RankGenerator rules (order innermost first, row-major groups); the
 * property test needs no Megatron; tests/mesh/megatron_oracle.py compares
 * with Megatron's own code when it is available. */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "meshpg.h"

#include "expect_err.h"
#include "rank_check.h"

static mpg_mesh *make(const char *dims, const char *order, int etp, int ep,
                      const char *eorder, int world) {
  mpg_spec sp = MPG_SPEC_INIT;
  cr_assert_eq(mpg_spec_set_mesh(&sp, dims), MPG_OK, "%s", mpg_last_error());
  if (order) cr_assert_eq(mpg_spec_apply_order(&sp, order), MPG_OK, "%s", mpg_last_error());
  cr_assert_eq(mpg_spec_set_experts(&sp, etp, ep, eorder), MPG_OK, "%s", mpg_last_error());
  mpg_mesh *m = NULL;
  cr_assert_eq(mpg_mesh_create(&sp, world, &m), MPG_OK, "%s", mpg_last_error());
  return m;
}

/* "[0,1] [2,3]": every group of dim set `name`. */
static void groups_str(const mpg_mesh *m, const char *name, char *buf, size_t cap) {
  int set, gs, ng, r[512];
  cr_assert_eq(mpg_mesh_dimset_find(m, name, &set), MPG_OK, "%s", mpg_last_error());
  mpg_mesh_dimset_info(m, set, NULL, &gs, &ng);
  size_t k = 0;
  buf[0] = '\0';
  for (int g = 0; g < ng; g++) {
    mpg_mesh_group_members(m, set, g, r);
    k += (size_t)snprintf(buf + k, cap - k, "%s[", g ? " " : "");
    for (int i = 0; i < gs; i++) k += (size_t)snprintf(buf + k, cap - k, "%s%d", i ? "," : "", r[i]);
    k += (size_t)snprintf(buf + k, cap - k, "]");
  }
}

#define EXPECT_GROUPS(m, name, want)                                            \
  do {                                                                          \
    char got_[4096];                                                            \
    groups_str(m, name, got_, sizeof got_);                                     \
    cr_expect_str_eq(got_, want, "groups of %s", name);                         \
  } while (0)

/* ------------------------------------------------------------------------ */
/* Hand-checked grids                                                        */
/* ------------------------------------------------------------------------ */

/* The hand-checked groups, one row a dim set: the Test that checks it, the
 * set, and every group of it as groups_str writes them.  In
 * megatron_default_order_16_ranks the dense dims tp and pp are untouched;
 * in ep_inside_tp etp_ep is row-major over the grid, outermost first: etp
 * then ep. */
static const struct groups_row {
  const char *test, *set, *groups;
} groups_rows[] = {
    {"megatron_default_order_16_ranks", "ep", "[0,1] [2,3] [4,5] [6,7] [8,9] [10,11] [12,13] [14,15]"},
    {"megatron_default_order_16_ranks", "etp", "[0] [1] [2] [3] [4] [5] [6] [7] [8] [9] [10] [11] [12] [13] [14] [15]"},
    {"megatron_default_order_16_ranks", "edp", "[0,2,4,6] [1,3,5,7] [8,10,12,14] [9,11,13,15]"},
    {"megatron_default_order_16_ranks", "etp_ep", "[0,1] [2,3] [4,5] [6,7] [8,9] [10,11] [12,13] [14,15]"},
    {"megatron_default_order_16_ranks", "etp_ep_pp", "[0,1,8,9] [2,3,10,11] [4,5,12,13] [6,7,14,15]"},
    {"megatron_default_order_16_ranks", "tp", "[0,1] [2,3] [4,5] [6,7] [8,9] [10,11] [12,13] [14,15]"},
    {"megatron_default_order_16_ranks", "pp", "[0,8] [1,9] [2,10] [3,11] [4,12] [5,13] [6,14] [7,15]"},
    {"etp_and_ep_fill_the_stage", "etp", "[0,1] [2,3] [4,5] [6,7] [8,9] [10,11] [12,13] [14,15]"},
    {"etp_and_ep_fill_the_stage", "ep", "[0,2,4,6] [1,3,5,7] [8,10,12,14] [9,11,13,15]"},
    {"etp_and_ep_fill_the_stage", "etp_ep", "[0,1,2,3,4,5,6,7] [8,9,10,11,12,13,14,15]"},
    {"etp_and_ep_fill_the_stage", "edp", "[0] [1] [2] [3] [4] [5] [6] [7] [8] [9] [10] [11] [12] [13] [14] [15]"},
    {"etp_and_ep_fill_the_stage", "etp_ep_pp", "[0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15]"},
    {"ep_inside_tp", "ep", "[0,1] [2,3] [4,5] [6,7]"},
    {"ep_inside_tp", "etp", "[0,2] [1,3] [4,6] [5,7]"},
    {"ep_inside_tp", "etp_ep", "[0,1,2,3] [4,5,6,7]"},
    {"ep_inside_tp", "edp", "[0,4] [1,5] [2,6] [3,7]"},
    {"toml_section", "ep", "[0,1,2,3] [4,5,6,7] [8,9,10,11] [12,13,14,15]"},
    {"toml_section", "edp", "[0,4] [1,5] [2,6] [3,7] [8,12] [9,13] [10,14] [11,15]"},
    {"dense_dims_named_ep_and_edp_keep_working", "ep", "[0,2] [1,3] [4,6] [5,7]"},
    {"dense_dims_named_ep_and_edp_keep_working", "edp", "[0,4] [1,5] [2,6] [3,7]"},
    {"pp_not_last_is_fine_when_edp_equals_dp", "ep", "[0,1] [2,3] [4,5] [6,7] [8,9] [10,11] [12,13] [14,15]"},
    {"pp_not_last_is_fine_when_edp_equals_dp", "edp", "[0,4,8,12] [1,5,9,13] [2,6,10,14] [3,7,11,15]"},
};

/* EXPECT_GROUPS for every row of the Test `test`, in table order. */
static void expect_rows(const mpg_mesh *m, const char *test) {
  int n = 0;
  for (size_t i = 0; i < sizeof groups_rows / sizeof groups_rows[0]; i++) {
    if (strcmp(groups_rows[i].test, test) != 0) continue;
    EXPECT_GROUPS(m, groups_rows[i].set, groups_rows[i].groups);
    n++;
  }
  cr_assert_gt(n, 0, "no row for %s", test);
}
#define expect_rows(m, test) expect_rows(m, test)

/* Megatron tp=2 cp=2 dp=2 pp=2, etp=1 ep=2, order tp-cp-ep-dp-pp: the
 * expert grid is pp=2 x edp=4 x ep=2 x etp=1. */
Test(experts, megatron_default_order_16_ranks) {
  mpg_mesh *m = make("pp=2,dp=2,cp=2,tp=2", NULL, 1, 2, NULL, 0);
  cr_assert_eq(mpg_mesh_expert_ndims(m), 4);
  const char *want_names[4] = {"pp", "edp", "ep", "etp"};
  int want_sizes[4] = {2, 4, 2, 1};
  for (int d = 0; d < 4; d++) {
    const char *name;
    int size;
    cr_assert_eq(mpg_mesh_expert_dim(m, d, &name, &size), MPG_OK);
    cr_expect_str_eq(name, want_names[d]);
    cr_expect_eq(size, want_sizes[d], "%s", want_names[d]);
  }
  expect_rows(m, "megatron_default_order_16_ranks");
  /* world stays the last dim set. */
  const char *last;
  mpg_mesh_dimset_info(m, mpg_mesh_num_dimsets(m) - 1, &last, NULL, NULL);
  cr_expect_str_eq(last, "world");
  cr_expect_eq(mpg_mesh_num_dimsets(m), 4 + 5 + 1);
  mpg_mesh_destroy(m);
}

/* tp=2 dp=4 pp=2 (16 ranks), etp=2 ep=4: edp = 16 / (2*4*2) = 1, order
 * tp-ep-dp-pp: etp stride 1, ep stride 2, pp stride 8. */
Test(experts, etp_and_ep_fill_the_stage) {
  mpg_mesh *m = make("pp=2,dp=4,tp=2", NULL, 2, 4, "tp-ep-dp-pp", 0);
  expect_rows(m, "etp_and_ep_fill_the_stage");
  mpg_mesh_destroy(m);
}

/* Megatron order ep-tp-dp-pp (ep innermost): tp=2 dp=4 (8 ranks), etp=2,
 * ep=2, edp=2: ep stride 1, etp stride 2, edp stride 4. */
Test(experts, ep_inside_tp) {
  mpg_mesh *m = make("dp=4,tp=2", NULL, 2, 2, "ep-tp-dp-pp", 0);
  expect_rows(m, "ep_inside_tp");
  mpg_mesh_destroy(m);
}

/* ep = -1 is inferred (edp = 1); the expert tp defaults to the mesh's tp. */
Test(experts, inferred_ep_and_default_tp) {
  mpg_mesh *m = make("dp=-1,tp=2", NULL, 0, -1, NULL, 8);
  const char *name;
  int size, found = 0;
  for (int d = 0; d < mpg_mesh_expert_ndims(m); d++) {
    cr_assert_eq(mpg_mesh_expert_dim(m, d, &name, &size), MPG_OK);
    if (!strcmp(name, "ep")) {
      cr_expect_eq(size, 4);
      found++;
    }
    if (!strcmp(name, "etp")) {
      cr_expect_eq(size, 2);
      found++;
    }
    if (!strcmp(name, "edp")) {
      cr_expect_eq(size, 1);
      found++;
    }
  }
  cr_expect_eq(found, 3);
  mpg_mesh_destroy(m);
}

Test(experts, toml_section) {
  const char *toml =
      "[mesh]\n"
      "dims = [ { name = \"pp\", size = 2 }, { name = \"dp\", size = -1 }, { name = \"tp\", size = 2 } ]\n"
      "[experts]\n"
      "ep = 4\n"
      "tp = 1\n"
      "order = \"tp-cp-ep-dp-pp\"\n";
  mpg_spec sp = MPG_SPEC_INIT;
  cr_assert_eq(mpg_spec_load_string(toml, "moe.toml", &sp), MPG_OK, "%s", mpg_last_error());
  cr_expect_eq(sp.experts.ep, 4);
  cr_expect_eq(sp.experts.tp, 1);
  cr_expect_str_eq(sp.experts.order, "tp-cp-ep-dp-pp");
  cr_expect_eq(sp.experts.ep_pos.line, 4);
  mpg_mesh *m = NULL;
  cr_assert_eq(mpg_mesh_create(&sp, 16, &m), MPG_OK, "%s", mpg_last_error());
  expect_rows(m, "toml_section");
  mpg_mesh_destroy(m);
  /* An empty [experts] is ep = 1, etp = the mesh's tp. */
  cr_assert_eq(mpg_spec_load_string("[mesh]\ndims = [ { name = \"dp\", size = 2 } ]\n"
                                    "[experts]\n", "e.toml", &sp),
               MPG_OK, "%s", mpg_last_error());
  cr_expect_eq(sp.experts.ep, 1);
  cr_expect_eq(sp.experts.tp, 0);
}

/* Without [experts], a dense dim may be named ep or edp (tests and
 * examples do so) and nothing changes. */
Test(experts, dense_dims_named_ep_and_edp_keep_working) {
  mpg_spec sp = MPG_SPEC_INIT;
  cr_assert_eq(mpg_spec_set_mesh(&sp, "edp=2,ep=2,tp=2"), MPG_OK);
  mpg_mesh *m = NULL;
  cr_assert_eq(mpg_mesh_create(&sp, 0, &m), MPG_OK, "%s", mpg_last_error());
  cr_expect_eq(mpg_mesh_expert_ndims(m), 0);
  cr_expect_eq(mpg_mesh_num_dimsets(m), 4);
  expect_rows(m, "dense_dims_named_ep_and_edp_keep_working");
  mpg_mesh_destroy(m);
  /* ep = 0 removes an expert grid again. */
  /* With an expert grid, the dense names clash. */
  cr_assert_eq(mpg_spec_set_experts(&sp, 0, 2, NULL), MPG_OK, "%s", mpg_last_error());
  EXPECT_ERR(mpg_spec_validate(&sp), MPG_ERR_SPEC,
             "mesh.dims[0].name: \"edp\" is a name of the expert grid");
  cr_assert_eq(mpg_spec_set_mesh(&sp, "dp=2,tp=2"), MPG_OK);
  cr_assert_eq(mpg_spec_set_experts(&sp, 0, 2, NULL), MPG_OK, "%s", mpg_last_error());
  cr_assert_eq(mpg_spec_set_experts(&sp, 0, 0, NULL), MPG_OK, "%s", mpg_last_error());
  cr_assert_eq(mpg_mesh_create(&sp, 0, &m), MPG_OK, "%s", mpg_last_error());
  cr_expect_eq(mpg_mesh_expert_ndims(m), 0);
  mpg_mesh_destroy(m);
}

/* ------------------------------------------------------------------------ */
/* Validation                                                                */
/* ------------------------------------------------------------------------ */

static mpg_status load(const char *toml, mpg_spec *sp) {
  return mpg_spec_load_string(toml, "moe.toml", sp);
}

#define MESH3 "[mesh]\ndims = [ { name = \"pp\", size = 2 }, { name = \"dp\", size = 2 }, { name = \"tp\", size = 2 } ]\n"

/* Specs that fail to load (MPG_ERR_SPEC), with a piece of the message. */
static const struct bad_spec {
  const char *toml, *err;
} bad_specs[] = {
    {MESH3 "[experts]\nep = 0\n", "moe.toml:4:6: experts.ep: expected a positive integer or -1"},
    {MESH3 "[experts]\ntp = -2\n", "moe.toml:4:6: experts.tp: expected a positive integer"},
    {MESH3 "[experts]\nep = 2.5\n", "moe.toml:4:6: experts.ep: expected an integer > 0, -1 or \"auto\", found float 2.5"},
    {MESH3 "[experts]\norder = \"tp-ep-xp-pp\"\n", "moe.toml:4:9: experts.order \"tp-ep-xp-pp\": unknown token \"xp\""},
    {MESH3 "[experts]\norder = \"tp-ep-ep-pp\"\n", "\"ep\" is named twice"},
    {MESH3 "[experts]\nepp = 2\n", "moe.toml:4:1: experts.epp: unknown key (did you mean \"ep\"?)"},
    {"[mesh]\ndims = [ { name = \"ep\", size = 2 } ]\n[experts]\nep = 2\n", "moe.toml:2:19: mesh.dims[0].name: \"ep\" is a name of the expert grid"},
};

Test(experts, spec_errors_name_the_key_and_position) {
  mpg_spec sp = MPG_SPEC_INIT;
  for (size_t i = 0; i < sizeof bad_specs / sizeof bad_specs[0]; i++)
    EXPECT_ERR(load(bad_specs[i].toml, &sp), MPG_ERR_SPEC, bad_specs[i].err);
  /* The expert grid has its own mask bits: a mesh of MPG_MAX_DIMS (8)
   * dims may have one (once limited to 5 dims). */
  cr_assert_eq(load("[mesh]\ndims = [ { name = \"a\", size = 1 }, { name = \"b\", size = 1 }, "
                    "{ name = \"c\", size = 1 }, { name = \"d\", size = 1 }, { name = \"e\", size = 1 }, "
                    "{ name = \"f\", size = 1 }, { name = \"g\", size = 1 }, { name = \"h\", size = 1 } ]"
                    "\n[experts]\nep = 1\n", &sp),
               MPG_OK, "%s", mpg_last_error());
  cr_expect_eq(sp.ndims, MPG_MAX_DIMS);
  /* What is left of the limit: the dim-set table, 5 of whose entries the
   * expert grid takes (at most 19 dims and flattened sets together). */
  cr_assert_eq(mpg_spec_set_mesh(&sp, "a=1,b=1,c=1,d=1,e=1,f=1,g=1,h=1"), MPG_OK);
  const char *const fl[12] = {"a,b", "a,c", "a,d", "a,e", "a,f", "a,g",
                              "a,h", "b,c", "b,d", "b,e", "b,f", "b,g"};
  for (int k = 0; k < 12; k++) {
    char name[8];
    snprintf(name, sizeof name, "s%d", k);
    cr_assert_eq(mpg_spec_add_flatten(&sp, name, fl[k]), MPG_OK, "%s", mpg_last_error());
  }
  cr_assert_eq(mpg_spec_set_experts(&sp, 1, 1, NULL), MPG_OK, "%s", mpg_last_error());
  EXPECT_ERR(mpg_spec_validate(&sp), MPG_ERR_SPEC,
             "experts: an expert grid adds 5 dim sets, so the mesh may have at most 19 "
             "dims and flattened sets together, but it has 8 dims and 12 sets");
}

static void create_err(const char *toml, int world, const char *sub) {
  mpg_spec sp = MPG_SPEC_INIT;
  cr_assert_eq(load(toml, &sp), MPG_OK, "%s", mpg_last_error());
  mpg_mesh *m = (mpg_mesh *)1;
  EXPECT_ERR(mpg_mesh_create(&sp, world, &m), MPG_ERR_SPEC, sub);
  cr_expect_null(m);
}

Test(experts, megatron_checks_at_mesh_create) {
  /* etp * ep * pp must divide the world. */
  create_err(MESH3 "[experts]\nep = 3\n", 0,
             "moe.toml:4:6: experts: world size 8 is not divisible by etp x ep x pp = 2 x 3 x 2 = 12");
  create_err(MESH3 "[experts]\nep = -1\ntp = 3\n", 0,
             "experts.ep: -1 (inferred), but world size 8 is not divisible by etp x pp = 3 x 2");
  /* A token of size > 1 left out of the order. */
  create_err(MESH3 "[experts]\nep = 2\norder = \"tp-dp-pp\"\n", 0,
             "moe.toml:5:9: experts.order \"tp-dp-pp\": \"ep\" is left out but experts.ep is 2");
  /* Different pipeline groups: pp inside the expert grid, outermost in the mesh. */
  create_err(MESH3 "[experts]\nep = 2\ntp = 1\norder = \"tp-pp-ep-dp\"\n", 0,
             "moe.toml:6:9: experts.order \"tp-pp-ep-dp\": the expert grid's pipeline "
             "groups differ from the mesh's (pp stride 1 in the expert grid, 4 in the mesh");
  /* An order not ending with pp: edp must equal dp (Megatron's rule), even
   * with equal pipeline groups: tp-dp-pp-ep with etp = ep = 1 gives edp =
   * 4 but dp = 2. */
  create_err(MESH3 "[experts]\nep = 1\ntp = 1\norder = \"tp-dp-pp-ep\"\n", 0,
             "moe.toml:6:9: experts.order \"tp-dp-pp-ep\": pp is not the outermost token, "
             "so the expert data parallel size (edp = 4) must equal the mesh's (dp = world / "
             "(tp x cp x pp) = 2)");
}

Test(experts, pp_not_last_is_fine_when_edp_equals_dp) {
  /* Megatron tp-pp-dp with ep replacing tp in experts: etp=1, ep=2. */
  mpg_mesh *m = make("dp=4,pp=2,tp=2", NULL, 1, 2, "tp-ep-pp-dp", 0);
  expect_rows(m, "pp_not_last_is_fine_when_edp_equals_dp");
  mpg_mesh_destroy(m);
}

/* ------------------------------------------------------------------------ */
/* Property: random layouts                                                  */
/* ------------------------------------------------------------------------ */

static unsigned rnd_state = 12345u;
static int rnd(int n) {
  rnd_state = rnd_state * 1103515245u + 12345u;
  return (int)((rnd_state >> 16) % (unsigned)n);
}

/* Every group of `set` partitions the world, group_of agrees with the
 * members, and group_rank with group_members. */
static void check_partition(const mpg_mesh *m, int set, int *members, int *seen) {
  int world = mpg_mesh_world_size(m), gs, ng;
  const char *name;
  mpg_mesh_dimset_info(m, set, &name, &gs, &ng);
  cr_assert_eq(gs * ng, world, "%s: %d groups of %d", name, ng, gs);
  memset(seen, 0, sizeof(int) * (size_t)world);
  for (int g = 0; g < ng; g++) {
    cr_assert_eq(mpg_mesh_group_members(m, set, g, members), MPG_OK);
    for (int p = 0; p < gs; p++) {
      int r = members[p], gi, pos, size, r2;
      cr_assert(r >= 0 && r < world);
      cr_assert_eq(seen[r]++, 0, "%s: rank %d in two groups", name, r);
      cr_assert_eq(mpg_mesh_group_of(m, set, r, &gi, &pos, &size), MPG_OK);
      cr_assert(gi == g && pos == p && size == gs, "%s: rank %d", name, r);
      cr_assert_eq(mpg_mesh_group_member(m, set, g, p, &r2), MPG_OK);
      cr_assert_eq(r2, r);
    }
    if (g > 0) cr_assert(members[0] > 0); /* groups in the order of their first ranks */
  }
}

Test(experts, property_random_layouts) {
  static const char *const toks[4] = {"tp", "ep", "dp", "pp"};
  int checked = 0;
  for (int iter = 0; iter < 400; iter++) {
    int tp = 1 << rnd(3), cp = 1 << rnd(2), dp = 1 + rnd(4), pp = 1 << rnd(3);
    int world = tp * cp * dp * pp;
    /* Megatron-valid expert sizes: etp * ep divides world / pp. */
    int per_stage = world / pp, etp, ep;
    do etp = 1 + rnd(per_stage); while (per_stage % etp);
    do ep = 1 + rnd(per_stage / etp); while ((per_stage / etp) % ep);
    /* An order: the mesh's (pp outermost) or a random one, which mesh
     * creation may refuse (then the refusal must name experts). */
    char dims[128], order[64] = "";
    snprintf(dims, sizeof dims, "pp=%d,dp=%d,cp=%d,tp=%d", pp, dp, cp, tp);
    if (rnd(2)) {
      int perm[4] = {0, 1, 2, 3};
      for (int i = 3; i > 0; i--) {
        int j = rnd(i + 1), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
      }
      snprintf(order, sizeof order, "%s-%s-%s-%s", toks[perm[0]], toks[perm[1]],
               toks[perm[2]], toks[perm[3]]);
    }
    mpg_spec sp = MPG_SPEC_INIT;
    cr_assert_eq(mpg_spec_set_mesh(&sp, dims), MPG_OK);
    cr_assert_eq(mpg_spec_set_experts(&sp, etp, ep, order), MPG_OK, "%s", mpg_last_error());
    mpg_mesh *m = NULL;
    mpg_status st = mpg_mesh_create(&sp, 0, &m);
    if (st) {
      cr_assert_eq(st, MPG_ERR_SPEC);
      cr_assert(order[0] && strstr(mpg_last_error(), "experts"), "%s %s: %s", dims, order,
                mpg_last_error());
      continue;
    }
    checked++;
    int *members = malloc(sizeof(int) * (size_t)world), *seen = malloc(sizeof(int) * (size_t)world);
    int *pp_a = malloc(sizeof(int) * (size_t)world);
    /* Sizes: etp * ep * edp * pp = world. */
    int prod = 1, esize[4];
    const char *ename[4];
    for (int d = 0; d < 4; d++) {
      cr_assert_eq(mpg_mesh_expert_dim(m, d, &ename[d], &esize[d]), MPG_OK);
      prod *= esize[d];
    }
    cr_assert_eq(prod, world);
    for (int s = 0; s < mpg_mesh_num_dimsets(m); s++) check_partition(m, s, members, seen);
    /* The expert grid's pipeline groups are the mesh's: walk the expert
     * grid along pp by hand and compare with the mesh's pp groups. */
    int pps, stride = 1, estride = 0;
    for (int d = 3; d >= 0; d--) {
      if (!strcmp(ename[d], "pp")) estride = stride;
      stride *= esize[d];
    }
    cr_assert_eq(mpg_mesh_dimset_find(m, "pp", &pps), MPG_OK);
    for (int r = 0; r < world; r++) {
      int gi, pos;
      mpg_mesh_group_of(m, pps, r, &gi, &pos, NULL);
      mpg_mesh_group_members(m, pps, gi, pp_a);
      int base = r - pos * estride;
      for (int p = 0; p < pp; p++) cr_assert_eq(pp_a[p], base + p * estride, "rank %d", r);
    }
    /* etp and ep groups nest in etp_ep, which nests in etp_ep_pp. */
    int s_etp, s_ep, s_u, s_upp;
    mpg_mesh_dimset_find(m, "etp", &s_etp);
    mpg_mesh_dimset_find(m, "ep", &s_ep);
    mpg_mesh_dimset_find(m, "etp_ep", &s_u);
    mpg_mesh_dimset_find(m, "etp_ep_pp", &s_upp);
    for (int r = 0; r < world; r++) {
      int a, b, c, d, gs;
      mpg_mesh_group_of(m, s_u, r, &a, NULL, &gs);
      cr_assert_eq(gs, etp * ep);
      mpg_mesh_group_of(m, s_upp, r, &b, NULL, &gs);
      cr_assert_eq(gs, etp * ep * pp);
      mpg_mesh_group_members(m, s_etp, (mpg_mesh_group_of(m, s_etp, r, &c, NULL, NULL), c), members);
      for (int i = 0; i < etp; i++) {
        mpg_mesh_group_of(m, s_u, members[i], &d, NULL, NULL);
        cr_assert_eq(d, a);
      }
      mpg_mesh_group_members(m, s_ep, (mpg_mesh_group_of(m, s_ep, r, &c, NULL, NULL), c), members);
      for (int i = 0; i < ep; i++) {
        mpg_mesh_group_of(m, s_u, members[i], &d, NULL, NULL);
        cr_assert_eq(d, a);
        mpg_mesh_group_of(m, s_upp, members[i], &d, NULL, NULL);
        cr_assert_eq(d, b);
      }
    }
    free(members);
    free(seen);
    free(pp_a);
    mpg_mesh_destroy(m);
  }
  cr_expect_gt(checked, 200, "only %d layouts were accepted", checked);
}

/* ------------------------------------------------------------------------ */
/* Groups on the thread backend                                              */
/* ------------------------------------------------------------------------ */

/* The members of rank's group of the dim set `name` (into members, at
 * most 64); returns the group's size. */
static int my_group(const mpg_mesh *mesh, const char *name, int rank, int *members) {
  int set, gi, gs;
  mpg_mesh_dimset_find(mesh, name, &set);
  mpg_mesh_group_of(mesh, set, rank, &gi, NULL, &gs);
  mpg_mesh_group_members(mesh, set, gi, members);
  return gs;
}

/* Runs fn on n thread ranks of m (rank_open makes their contexts), expects
 * success, destroys m. */
static void run_and_destroy(mpg_mesh *m, int n, mpg_rank_main fn) {
  mpg_status st = mpg_thread_run(n, 60.0, fn, m, NULL);
  mpg_mesh_destroy(m);
  EXPECT_RUN_OK(st);
}

/* Each rank sums its rank over "edp", "ep", "etp_ep" (by name) and over
 * "etp,ep,pp" (a dim list); the sums must match the mesh's members. */
static mpg_status sums_main(const mpg_init_opts *opts, void *arg) {
  const mpg_mesh *mesh = arg;
  mpg_ctx *ctx = NULL;
  mpg_status st = rank_open(opts, mesh, &ctx, NULL, NULL);
  if (st) return st;
  const char *names[4] = {"edp", "ep", "etp_ep", "etp,ep,pp"};
  const char *sets[4] = {"edp", "ep", "etp_ep", "etp_ep_pp"};
  for (int k = 0; k < 4 && !st; k++) {
    mpg_group *g = NULL;
    st = k < 3 ? mpg_ctx_group(ctx, names[k], &g) : mpg_ctx_group_dims(ctx, names[k], &g);
    if (st) break;
    int64_t in = opts->rank, out = -1;
    mpg_work *w = NULL;
    st = mpg_all_reduce(g, &in, &out, 1, MPG_I64, MPG_OP_SUM, NULL, &w);
    if (!st) st = mpg_work_wait(w);
    int members[64], gs = my_group(mesh, sets[k], opts->rank, members);
    int64_t want = 0;
    for (int i = 0; i < gs; i++) want += members[i];
    if (!st && (out != want || mpg_group_size(g) != gs)) st = MPG_ERR_STATE;
  }
  /* A mesh dim other than pp does not mix with expert dims. */
  mpg_group *bad = NULL;
  if (!st && mpg_ctx_group_dims(ctx, "tp,ep", &bad) != MPG_ERR_INVALID) st = MPG_ERR_STATE;
  tl_ctx = NULL;
  mpg_ctx_destroy(ctx);
  return st;
}

Test(experts, groups_on_the_thread_backend) {
  run_and_destroy(make("pp=2,dp=2,tp=2", NULL, 1, 2, NULL, 0), 8, sums_main);
}

/* Gradient sync: an expert parameter reduced over "edp", a dense one over
 * the default group (dp_cp, here dp), with op = sum. */
static mpg_status sync_main(const mpg_init_opts *opts, void *arg) {
  const mpg_mesh *mesh = arg;
  mpg_ctx *ctx = NULL;
  mpg_status st = rank_open(opts, mesh, &ctx, NULL, NULL);
  if (st) return st;
  mpg_sync_opts so = MPG_SYNC_OPTS_INIT;
  so.sync.op = MPG_OP_SUM;
  mpg_sync *sync = NULL;
  mpg_param_opts po = MPG_PARAM_OPTS_INIT;
  po.reduce_dims = "edp";
  int pe = -1, pd = -1;
  st = mpg_sync_create(ctx, &so, &sync);
  if (!st) st = mpg_sync_add_param(sync, "expert.w", 4, MPG_F32, &po, &pe);
  if (!st) st = mpg_sync_add_param(sync, "dense.w", 4, MPG_F32, NULL, &pd);
  if (!st) st = mpg_sync_commit(sync);
  float *ge = NULL, *gd = NULL;
  if (!st) st = mpg_sync_grad(sync, pe, (void **)&ge);
  if (!st) st = mpg_sync_grad(sync, pd, (void **)&gd);
  if (!st) {
    for (int i = 0; i < 4; i++) ge[i] = gd[i] = (float)(opts->rank + i);
    st = mpg_sync_all(sync, 0, NULL);
  }
  mpg_group *g = NULL;
  if (!st) st = mpg_sync_param_group(sync, pe, &g);
  if (!st && strcmp(mpg_group_name(g), "edp") != 0) st = MPG_ERR_STATE;
  const char *setname[2] = {"edp", "dp"};
  float *grad[2] = {ge, gd};
  for (int k = 0; k < 2 && !st; k++) {
    int members[64], gs = my_group(mesh, setname[k], opts->rank, members);
    for (int i = 0; i < 4; i++) {
      float want = 0;
      for (int p = 0; p < gs; p++) want += (float)(members[p] + i);
      if (grad[k][i] != want) st = MPG_ERR_STATE;
    }
  }
  mpg_sync_destroy(sync);
  tl_ctx = NULL;
  mpg_ctx_destroy(ctx);
  return st;
}

Test(experts, sync_reduces_expert_params_over_edp) {
  run_and_destroy(make("pp=2,dp=4,tp=1", NULL, 1, 2, NULL, 0), 8, sync_main);
}
