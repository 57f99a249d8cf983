/* Mesh semantics, group by group, and the mesh API's error paths.
 *
 * The expected groups are written out by hand (from DESIGN.md "Mesh
 * semantics" and from Megatron's RankGenerator) rather than computed, so a
 * change to the layout rules makes these tests fail. */
#include <criterion/criterion.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "meshpg.h"

/* ------------------------------------------------------------------------ */
/* Helpers                                                                   */
/* ------------------------------------------------------------------------ */

/* Assert `expr` returns `want` and the last error contains `sub`. */
#include "expect_err.h"

/* Assert `expr` returns MPG_OK (the message, if any, shown). */
#define EXPECT_OK(expr) EXPECT_ERR(expr, MPG_OK, "")

/* A spec from a --mesh string plus "name=d1,d2" flatten items (NULL-ended). */
static void spec_from(mpg_spec *spec, const char *dims, const char *const *fl) {
  EXPECT_OK(mpg_spec_init(spec));
  EXPECT_OK(mpg_spec_set_mesh(spec, dims));
  for (; fl && *fl; fl++) {
    char name[64];
    const char *eq = strchr(*fl, '=');
    cr_assert_not_null(eq);
    snprintf(name, sizeof name, "%.*s", (int)(eq - *fl), *fl);
    EXPECT_OK(mpg_spec_add_flatten(spec, name, eq + 1));
  }
}

static mpg_mesh *mesh_from(const char *dims, int world, const char *const *fl) {
  mpg_spec spec = MPG_SPEC_INIT;
  spec_from(&spec, dims, fl);
  mpg_mesh *m = (mpg_mesh *)0x1;
  mpg_status st = mpg_mesh_create(&spec, world, &m);
  cr_assert_eq(st, MPG_OK, "mpg_mesh_create(\"%s\", %d): %s: %s", dims, world,
               mpg_status_name(st), mpg_last_error());
  cr_assert_not_null(m);
  return m;
}

/* Expect mpg_mesh_create to fail with `want` and `sub`, and set *out NULL. */
static void create_fails(const mpg_spec *spec, int world, mpg_status want,
                         const char *sub) {
  mpg_mesh *m = (mpg_mesh *)0x1;
  EXPECT_ERR(mpg_mesh_create(spec, world, &m), want, sub);
  cr_assert_null(m, "mpg_mesh_create must set *out = NULL on failure");
}

static void create_str_fails(const char *dims, int world, mpg_status want,
                             const char *sub) {
  mpg_spec spec = MPG_SPEC_INIT;
  spec_from(&spec, dims, NULL);
  create_fails(&spec, world, want, sub);
}

/* Check the dim set `name` against the hand-written groups `want`
 * (ngroups rows of gsize ranks, in group-index order): dimset_info,
 * group_members for every group, group_rank for every member, and
 * group_of (index, position, size) for every rank. */
static void check_set(const mpg_mesh *m, const char *name, int ngroups,
                      int gsize, const int *want) {
  int world = mpg_mesh_world_size(m);
  cr_assert_eq(ngroups * gsize, world, "%s: test table does not cover world",
               name);
  int set = -1;
  EXPECT_OK(mpg_mesh_dimset_find(m, name, &set));
  const char *got_name = NULL;
  int gs = -1, ng = -1;
  EXPECT_OK(mpg_mesh_dimset_info(m, set, &got_name, &gs, &ng));
  cr_assert_str_eq(got_name, name);
  cr_assert_eq(gs, gsize, "%s: group size %d, want %d", name, gs, gsize);
  cr_assert_eq(ng, ngroups, "%s: %d groups, want %d", name, ng, ngroups);

  int *got = malloc(sizeof(int) * (size_t)gsize);
  cr_assert_not_null(got);
  for (int g = 0; g < ngroups; g++) {
    for (int p = 0; p < gsize; p++) got[p] = -1;
    EXPECT_OK(mpg_mesh_group_members(m, set, g, got));
    for (int p = 0; p < gsize; p++) {
      cr_assert_eq(got[p], want[g * gsize + p],
                   "%s: group %d position %d is rank %d, want %d", name, g, p,
                   got[p], want[g * gsize + p]);
      int r = -1;
      EXPECT_OK(mpg_mesh_group_member(m, set, g, p, &r));
      cr_assert_eq(r, want[g * gsize + p], "%s: group_rank(%d, %d) = %d", name,
                   g, p, r);
    }
  }
  free(got);

  for (int rank = 0; rank < world; rank++) {
    int wg = -1, wp = -1;
    for (int i = 0; i < ngroups * gsize; i++)
      if (want[i] == rank) wg = i / gsize, wp = i % gsize;
    cr_assert_geq(wg, 0, "%s: rank %d missing from the test table", name, rank);
    int gi = -1, pos = -1, size = -1;
    EXPECT_OK(mpg_mesh_group_of(m, set, rank, &gi, &pos, &size));
    cr_assert_eq(gi, wg, "%s: rank %d: group index %d, want %d", name, rank,
                 gi, wg);
    cr_assert_eq(pos, wp, "%s: rank %d: position %d, want %d", name, rank, pos,
                 wp);
    cr_assert_eq(size, gsize, "%s: rank %d: group size %d, want %d", name,
                 rank, size, gsize);
    /* Out pointers may be NULL. */
    EXPECT_OK(mpg_mesh_group_of(m, set, rank, NULL, NULL, NULL));
  }
}

static void check_dims(const mpg_mesh *m, int ndims, const char *const *names,
                       const int *sizes) {
  cr_assert_eq(mpg_mesh_ndims(m), ndims);
  for (int d = 0; d < ndims; d++) {
    const char *n = NULL;
    int s = -1;
    EXPECT_OK(mpg_mesh_dim(m, d, &n, &s));
    cr_assert_str_eq(n, names[d], "dim %d is \"%s\", want \"%s\"", d, n,
                     names[d]);
    cr_assert_eq(s, sizes[d], "dim %d (%s) has size %d, want %d", d, n, s,
                 sizes[d]);
  }
}

/* ------------------------------------------------------------------------ */
/* The DESIGN.md example: mesh (dp=2, tp=2, cp=2), dp_cp = [dp, cp]          */
/* ------------------------------------------------------------------------ */

static const char *const design_flat[] = {"dp_cp=dp,cp", NULL};

/* A table of ranks written in place, for check_set. */
#define RANKS(...) ((const int[]){__VA_ARGS__})

/* check_set on the DESIGN.md example's mesh. */
static void design_set(const char *name, int ngroups, int gsize, const int *want) {
  mpg_mesh *m = mesh_from("dp=2,tp=2,cp=2", 8, design_flat);
  check_set(m, name, ngroups, gsize, want);
  mpg_mesh_destroy(m);
}

Test(mesh, design_example_layout) {
  mpg_mesh *m = mesh_from("dp=2,tp=2,cp=2", 8, design_flat);
  static const char *const names[] = {"dp", "tp", "cp"};
  static const int sizes[] = {2, 2, 2};
  check_dims(m, 3, names, sizes);
  cr_assert_eq(mpg_mesh_world_size(m), 8);
  /* dims, then flattened sets, then "world" */
  cr_assert_eq(mpg_mesh_num_dimsets(m), 5);
  static const char *const set_names[] = {"dp", "tp", "cp", "dp_cp", "world"};
  for (int i = 0; i < 5; i++) {
    int id = -1;
    EXPECT_OK(mpg_mesh_dimset_find(m, set_names[i], &id));
    cr_assert_eq(id, i, "dim set \"%s\" has id %d, want %d", set_names[i], id,
                 i);
  }
  int dims[MPG_MAX_DIMS], n = -1;
  EXPECT_OK(mpg_mesh_dimset_dims(m, 3, dims, &n));
  cr_assert_eq(n, 2);
  cr_assert_eq(dims[0], 0);
  cr_assert_eq(dims[1], 2);
  EXPECT_OK(mpg_mesh_dimset_dims(m, 4, dims, &n));
  cr_assert_eq(n, 3);
  for (int i = 0; i < 3; i++) cr_assert_eq(dims[i], i);
  EXPECT_OK(mpg_mesh_dimset_dims(m, 1, dims, &n));
  cr_assert_eq(n, 1);
  cr_assert_eq(dims[0], 1);
  /* Row-major: rank = dp*4 + tp*2 + cp. */
  for (int r = 0; r < 8; r++) {
    int c[3] = {-1, -1, -1}, back = -1;
    EXPECT_OK(mpg_mesh_coord_of(m, r, c));
    cr_assert_eq(c[0], r / 4);
    cr_assert_eq(c[1], (r / 2) % 2);
    cr_assert_eq(c[2], r % 2);
    EXPECT_OK(mpg_mesh_rank_of(m, c, &back));
    cr_assert_eq(back, r);
  }
  mpg_mesh_destroy(m);
}

Test(mesh, design_example_dp) { design_set("dp", 4, 2, RANKS(0, 4, 1, 5, 2, 6, 3, 7)); }
Test(mesh, design_example_tp) { design_set("tp", 4, 2, RANKS(0, 2, 1, 3, 4, 6, 5, 7)); }
Test(mesh, design_example_cp) { design_set("cp", 4, 2, RANKS(0, 1, 2, 3, 4, 5, 6, 7)); }
Test(mesh, design_example_dp_cp) { design_set("dp_cp", 2, 4, RANKS(0, 1, 4, 5, 2, 3, 6, 7)); }
Test(mesh, design_example_world) { design_set("world", 1, 8, RANKS(0, 1, 2, 3, 4, 5, 6, 7)); }
/* ------------------------------------------------------------------------ */
/* Megatron RankGenerator semantics                                          */
/* ------------------------------------------------------------------------ */

/* Megatron's generate_masked_orthogonal_rank_groups: parallel sizes are
 * listed in order-string order (innermost first) with prefix-product
 * strides, and both the rank-in-group and the group index decompose with
 * the first (innermost) dim fastest.  So "tp-cp-dp-pp" with all sizes 2 and
 * world 16 is the row-major mesh (pp, dp, cp, tp) with strides
 * pp=8, dp=4, cp=2, tp=1, and get_ranks("a-b") lists, for each combination
 * of the other dims (innermost fastest), the ranks row-major over a, b. */
static mpg_mesh *megatron_4d(void) {
  mpg_spec spec = MPG_SPEC_INIT;
  spec_from(&spec, "tp=2,cp=2,dp=2,pp=2", NULL);
  EXPECT_OK(mpg_spec_apply_order(&spec, "tp-cp-dp-pp"));
  cr_assert_eq(spec.ndims, 4);
  cr_assert_str_eq(spec.dims[0].name, "pp");
  cr_assert_str_eq(spec.dims[1].name, "dp");
  cr_assert_str_eq(spec.dims[2].name, "cp");
  cr_assert_str_eq(spec.dims[3].name, "tp");
  /* Megatron's "tp-cp" (flattened tensor+context group) and "dp-cp"
   * (data-parallel group with context parallelism), mesh order. */
  EXPECT_OK(mpg_spec_add_flatten(&spec, "tp_cp", "cp,tp"));
  EXPECT_OK(mpg_spec_add_flatten(&spec, "dp_cp", "dp,cp"));
  /* Megatron's model-parallel group "tp-pp". */
  EXPECT_OK(mpg_spec_add_flatten(&spec, "mp", "pp,tp"));
  mpg_mesh *m = NULL;
  EXPECT_OK(mpg_mesh_create(&spec, 16, &m));
  static const char *const names[] = {"pp", "dp", "cp", "tp"};
  static const int sizes[] = {2, 2, 2, 2};
  check_dims(m, 4, names, sizes);
  return m;
}

/* The expected groups of megatron_4d's sets, one row a set, each row's
 * test the Test that checks it:
 * - tp: contiguous pairs;
 * - cp: stride 2; groups over (pp, dp, tp) with tp fastest;
 * - dp: stride 4; groups over (pp, cp, tp);
 * - pp: stride 8 (world 16 / pp 2);
 * - tp_cp, get_ranks("tp-cp"): blocks of 4 consecutive ranks;
 * - dp_cp, get_ranks("dp-cp"): fix pp and tp; row-major over (dp, cp), i.e.
 *   dp*4 + cp*2: [0,2,4,6] [1,3,5,7] [8,10,12,14] [9,11,13,15];
 * - mp, get_ranks("tp-pp"): fix dp and cp; row-major over (pp, tp). */
static const struct megatron_row {
  const char *test, *set;
  int ngroups, gsize;
  int want[16];
} megatron_rows[] = {
    {"order_4d_tp", "tp", 8, 2, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}},
    {"order_4d_cp", "cp", 8, 2, {0, 2, 1, 3, 4, 6, 5, 7, 8, 10, 9, 11, 12, 14, 13, 15}},
    {"order_4d_dp", "dp", 8, 2, {0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15}},
    {"order_4d_pp", "pp", 8, 2, {0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15}},
    {"order_4d_flattened", "tp_cp", 4, 4, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}},
    {"order_4d_flattened", "dp_cp", 4, 4, {0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15}},
    {"order_4d_flattened", "mp", 4, 4, {0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15}},
};

/* check_set on megatron_4d's mesh for every row of the Test `test`. */
static void megatron_case(const char *test) {
  mpg_mesh *m = megatron_4d();
  int n = 0;
  for (size_t i = 0; i < sizeof megatron_rows / sizeof megatron_rows[0]; i++) {
    const struct megatron_row *r = &megatron_rows[i];
    if (strcmp(r->test, test) != 0) continue;
    check_set(m, r->set, r->ngroups, r->gsize, r->want);
    n++;
  }
  cr_assert_gt(n, 0, "no row for %s", test);
  mpg_mesh_destroy(m);
}

Test(megatron, order_4d_tp) { megatron_case("order_4d_tp"); }
Test(megatron, order_4d_cp) { megatron_case("order_4d_cp"); }
Test(megatron, order_4d_dp) { megatron_case("order_4d_dp"); }
Test(megatron, order_4d_pp) { megatron_case("order_4d_pp"); }
Test(megatron, order_4d_flattened) { megatron_case("order_4d_flattened"); }

/* The example in Megatron's initialize_model_parallel docstring: 16 GPUs,
 * tp=2, pp=4, dp=2: tensor groups [g0,g1] [g2,g3] ..., pipeline groups
 * [g0,g4,g8,g12] [g1,g5,g9,g13] [g2,g6,g10,g14] [g3,g7,g11,g15], data
 * groups [g0,g2] [g1,g3] [g4,g6] [g5,g7] ...  Order "tp-dp-pp" gives the
 * mesh (pp=4, dp=2, tp=2).  Distinct sizes catch a reorder that drops a
 * dim's size. */
Test(megatron, docstring_example) {
  mpg_spec spec = MPG_SPEC_INIT;
  spec_from(&spec, "tp=2,pp=4,dp=2", NULL);
  EXPECT_OK(mpg_spec_apply_order(&spec, "tp-dp-pp"));
  mpg_mesh *m = NULL;
  EXPECT_OK(mpg_mesh_create(&spec, 16, &m));
  static const char *const names[] = {"pp", "dp", "tp"};
  static const int sizes[] = {4, 2, 2};
  check_dims(m, 3, names, sizes);
  static const int tp[] = {0, 1, 2,  3,  4,  5,  6,  7,
                           8, 9, 10, 11, 12, 13, 14, 15};
  check_set(m, "tp", 8, 2, tp);
  static const int pp[] = {0, 4, 8, 12, 1, 5, 9,  13,
                           2, 6, 10, 14, 3, 7, 11, 15};
  check_set(m, "pp", 4, 4, pp);
  static const int dp[] = {0, 2, 1, 3, 4,  6,  5,  7,
                           8, 10, 9, 11, 12, 14, 13, 15};
  check_set(m, "dp", 8, 2, dp);
  mpg_mesh_destroy(m);
}

Test(megatron, order_errors) {
  mpg_spec spec = MPG_SPEC_INIT;
  spec_from(&spec, "tp=2,cp=2,dp=2,pp=2", NULL);
  EXPECT_ERR(mpg_spec_apply_order(&spec, "tp-cpp-dp-pp"), MPG_ERR_SPEC,
             "did you mean \"cp\"");
  EXPECT_ERR(mpg_spec_apply_order(&spec, "tp-cp-dp"), MPG_ERR_SPEC,
             "\"pp\" of the mesh is missing");
  EXPECT_ERR(mpg_spec_apply_order(&spec, "tp-cp-dp-pp-tp"), MPG_ERR_SPEC,
             "\"tp\" is named twice");
  EXPECT_ERR(mpg_spec_apply_order(&spec, NULL), MPG_ERR_INVALID, "NULL");
  EXPECT_ERR(mpg_spec_apply_order(NULL, "tp"), MPG_ERR_INVALID, "NULL");
  /* A failed order leaves the dims as they were. */
  cr_assert_str_eq(spec.dims[0].name, "tp");
  cr_assert_str_eq(spec.dims[3].name, "pp");
}

/* An order item too long to be a dim name must be reported, not skipped:
 * "tp-cp-dp-pp-<40 chars>" names an unknown dim. */
Test(megatron, order_long_unknown_name) {
  mpg_spec spec = MPG_SPEC_INIT;
  spec_from(&spec, "tp=2,cp=2,dp=2,pp=2", NULL);
  const char *order =
      "tp-cp-dp-pp-abcdefghijabcdefghijabcdefghijabcdefghij";
  mpg_status st = mpg_spec_apply_order(&spec, order);
  cr_assert_eq(st, MPG_ERR_SPEC,
               "apply_order(\"%s\") returned %s; the long unknown dim was "
               "ignored",
               order, mpg_status_name(st));
  cr_assert(strstr(mpg_last_error(), "abcdefghij") != NULL, "message: %s",
            mpg_last_error());
}

/* ------------------------------------------------------------------------ */
/* Size inference and world size                                             */
/* ------------------------------------------------------------------------ */

static int dim_size(const mpg_mesh *m, const char *name) {
  for (int d = 0; d < mpg_mesh_ndims(m); d++) {
    const char *n;
    int s;
    EXPECT_OK(mpg_mesh_dim(m, d, &n, &s));
    if (strcmp(n, name) == 0) return s;
  }
  cr_assert_fail("no dim \"%s\"", name);
  return -1;
}

Test(mesh, infer_minus_one) {
  /* 64 / (cp 2 * tp 8) = 4. */
  mpg_mesh *m = mesh_from("dp=-1,cp=2,tp=8", 64, NULL);
  cr_assert_eq(dim_size(m, "dp"), 4);
  cr_assert_eq(dim_size(m, "cp"), 2);
  cr_assert_eq(dim_size(m, "tp"), 8);
  cr_assert_eq(mpg_mesh_world_size(m), 64);
  int set, gs, ng;
  EXPECT_OK(mpg_mesh_dimset_find(m, "dp", &set));
  EXPECT_OK(mpg_mesh_dimset_info(m, set, NULL, &gs, &ng));
  cr_assert_eq(gs, 4);
  cr_assert_eq(ng, 16);
  /* dp stride is cp*tp = 16: dp group 0 is [0,16,32,48]. */
  int ranks[4];
  EXPECT_OK(mpg_mesh_group_members(m, set, 0, ranks));
  cr_assert_eq(ranks[0], 0);
  cr_assert_eq(ranks[1], 16);
  cr_assert_eq(ranks[2], 32);
  cr_assert_eq(ranks[3], 48);
  mpg_mesh_destroy(m);

  /* 128 ranks give dp = 8. */
  m = mesh_from("dp=-1,cp=2,tp=8", 128, NULL);
  cr_assert_eq(dim_size(m, "dp"), 8);
  cr_assert_eq(mpg_mesh_world_size(m), 128);
  mpg_mesh_destroy(m);
}

Test(mesh, infer_auto_string) {
  mpg_mesh *m = mesh_from("dp=auto,cp=2,tp=8", 64, NULL);
  cr_assert_eq(dim_size(m, "dp"), 4);
  mpg_mesh_destroy(m);
  /* The inferred dim may be anywhere, and " auto " is trimmed. */
  m = mesh_from("dp=2, cp = auto ,tp=8", 64, NULL);
  cr_assert_eq(dim_size(m, "cp"), 4);
  cr_assert_eq(dim_size(m, "dp"), 2);
  mpg_mesh_destroy(m);
  /* Inferring 1 is fine. */
  m = mesh_from("dp=2,tp=auto", 2, NULL);
  cr_assert_eq(dim_size(m, "tp"), 1);
  mpg_mesh_destroy(m);
  /* The spec itself keeps -1. */
  mpg_spec spec = MPG_SPEC_INIT;
  spec_from(&spec, "dp=auto,tp=2", NULL);
  cr_assert_eq(spec.dims[0].size, -1);
}

Test(mesh, world_zero_is_product) {
  mpg_mesh *m = mesh_from("dp=2,tp=3,cp=5", 0, NULL);
  cr_assert_eq(mpg_mesh_world_size(m), 30);
  cr_assert_eq(dim_size(m, "tp"), 3);
  mpg_mesh_destroy(m);
  /* The same mesh with the world given explicitly. */
  m = mesh_from("dp=2,tp=3,cp=5", 30, NULL);
  cr_assert_eq(mpg_mesh_world_size(m), 30);
  mpg_mesh_destroy(m);
  /* A one-rank mesh. */
  m = mesh_from("x=1", 0, NULL);
  cr_assert_eq(mpg_mesh_world_size(m), 1);
  int r = -1, c[1] = {0};
  EXPECT_OK(mpg_mesh_rank_of(m, c, &r));
  cr_assert_eq(r, 0);
  mpg_mesh_destroy(m);
}

Test(mesh, set_mesh_keeps_flatten) {
  mpg_spec spec = MPG_SPEC_INIT;
  spec_from(&spec, "dp=2,tp=2,cp=2", design_flat);
  EXPECT_OK(mpg_spec_set_mesh(&spec, "dp=4,cp=2"));
  cr_assert_eq(spec.nflatten, 1);
  mpg_mesh *m = NULL;
  EXPECT_OK(mpg_mesh_create(&spec, 8, &m));
  static const int dp_cp[] = {0, 1, 2, 3, 4, 5, 6, 7};
  check_set(m, "dp_cp", 1, 8, dp_cp);
  mpg_mesh_destroy(m);
}

/* ------------------------------------------------------------------------ */
/* Spec and creation errors                                                  */
/* ------------------------------------------------------------------------ */

Test(errors, world_not_divisible) {
  /* The message names the world size and the product of the known sizes. */
  create_str_fails("dp=-1,cp=3,tp=2", 8, MPG_ERR_SPEC, "world size 8");
  cr_assert(strstr(mpg_last_error(), "divisible by 6") != NULL, "%s",
            mpg_last_error());
  cr_assert(strstr(mpg_last_error(), "cp=3") != NULL, "%s", mpg_last_error());
}

Test(errors, world_not_equal) {
  create_str_fails("dp=2,tp=2,cp=2", 16, MPG_ERR_SPEC, "world size 16");
  cr_assert(strstr(mpg_last_error(), "does not equal 8") != NULL, "%s",
            mpg_last_error());
  create_str_fails("dp=2,tp=2,cp=2", 4, MPG_ERR_SPEC, "world size 4");
  create_str_fails("dp=2,tp=2", -4, MPG_ERR_SPEC, "-4");
}

Test(errors, product_overflows_int) {
  /* 65536 * 65536 ranks do not fit in an int. */
  create_str_fails("a=65536,b=65536", 0, MPG_ERR_SPEC, "exceeds");
  cr_assert(strstr(mpg_last_error(), "a=65536 x b=65536") != NULL, "%s",
            mpg_last_error());
  create_str_fails("a=-1,b=65536,c=65536", 64, MPG_ERR_SPEC, "exceeds");
  /* Just below the limit is fine with world 0 (no per-rank memory). */
  mpg_mesh *m = mesh_from("a=32768,b=65535", 0, NULL);
  cr_assert_eq(mpg_mesh_world_size(m), 32768 * 65535);
  int c[2] = {32767, 65534}, r = -1;
  EXPECT_OK(mpg_mesh_rank_of(m, c, &r));
  cr_assert_eq(r, 32768 * 65535 - 1);
  int set = -1, gi = -1, pos = -1;
  EXPECT_OK(mpg_mesh_dimset_find(m, "a", &set));
  EXPECT_OK(mpg_mesh_group_of(m, set, r, &gi, &pos, NULL));
  cr_assert_eq(gi, 65534);
  cr_assert_eq(pos, 32767);
  mpg_mesh_destroy(m);
}

Test(errors, minus_one_without_world) {
  create_str_fails("dp=2,cp=-1", 0, MPG_ERR_SPEC, "no world size was given");
  cr_assert(strstr(mpg_last_error(), "\"cp\"") != NULL, "%s",
            mpg_last_error());
}

Test(errors, zero_and_negative_size) {
  create_str_fails("dp=2,tp=0", 0, MPG_ERR_SPEC, "found 0");
  cr_assert(strstr(mpg_last_error(), "\"tp\"") != NULL, "%s",
            mpg_last_error());
  create_str_fails("dp=-2,tp=2", 8, MPG_ERR_SPEC, "found -2");
  mpg_spec spec = MPG_SPEC_INIT;
  spec_from(&spec, "dp=2,tp=0", NULL);
  EXPECT_ERR(mpg_spec_validate(&spec), MPG_ERR_SPEC, "mesh.dims[1].size");
}

Test(errors, two_inferred_dims) {
  create_str_fails("dp=-1,tp=2,cp=auto", 8, MPG_ERR_SPEC,
                   "only one dim may be -1");
}

Test(errors, duplicate_dim_names) {
  create_str_fails("dp=2,tp=2,dp=2", 8, MPG_ERR_SPEC,
                   "duplicate dim name \"dp\"");
}

Test(errors, bad_dim_names) {
  create_str_fails("1dp=2", 0, MPG_ERR_SPEC, "\"1dp\"");
  create_str_fails("d-p=2", 0, MPG_ERR_SPEC, "\"d-p\"");
  create_str_fails("=2", 0, MPG_ERR_SPEC, "mesh.dims[0].name");
  /* 31 chars is the limit; 32 is rejected by the string parser. */
  mpg_mesh *m = mesh_from("abcdefghijabcdefghijabcdefghij1=2", 0, NULL);
  mpg_mesh_destroy(m);
  mpg_spec spec = MPG_SPEC_INIT;
  EXPECT_OK(mpg_spec_init(&spec));
  EXPECT_ERR(mpg_spec_set_mesh(&spec, "abcdefghijabcdefghijabcdefghij12=2"),
             MPG_ERR_SPEC, "longer than 31 chars");
  cr_assert_eq(spec.ndims, 0, "a failed set_mesh must not change the dims");
}

Test(errors, world_as_dim_name) {
  create_str_fails("world=2,tp=2", 0, MPG_ERR_SPEC, "\"world\" is reserved");
}

Test(errors, malformed_mesh_strings) {
  mpg_spec spec = MPG_SPEC_INIT;
  EXPECT_OK(mpg_spec_init(&spec));
  EXPECT_ERR(mpg_spec_set_mesh(&spec, "dp2"), MPG_ERR_SPEC, "NAME=SIZE");
  EXPECT_ERR(mpg_spec_set_mesh(&spec, "dp=two"), MPG_ERR_SPEC, "\"two\"");
  EXPECT_ERR(mpg_spec_set_mesh(&spec, "dp=2,"), MPG_ERR_SPEC, "NAME=SIZE");
  EXPECT_ERR(mpg_spec_set_mesh(&spec, "dp="), MPG_ERR_SPEC, "\"dp\"");
  EXPECT_ERR(mpg_spec_set_mesh(&spec, ""), MPG_ERR_SPEC, "dp=2,cp=2,tp=2");
  EXPECT_ERR(mpg_spec_set_mesh(&spec, "dp=99999999999"), MPG_ERR_SPEC,
             "99999999999");
}

/* An item longer than the parser's buffer must be rejected, not cut short:
 * "dp=" + 123 zeros + "2junk" is not a size, but cutting it at 127 chars
 * leaves "dp=000...02", i.e. dp=2. */
Test(errors, long_mesh_item_not_truncated) {
  char buf[256] = "dp=";
  for (int i = 0; i < 123; i++) strcat(buf, "0");
  strcat(buf, "2junk");
  mpg_spec spec = MPG_SPEC_INIT;
  EXPECT_OK(mpg_spec_init(&spec));
  mpg_status st = mpg_spec_set_mesh(&spec, buf);
  cr_assert_eq(st, MPG_ERR_SPEC,
               "set_mesh(\"dp=0...02junk\") returned %s with dp=%d: the "
               "item was silently truncated",
               mpg_status_name(st), spec.ndims ? spec.dims[0].size : 0);
  cr_assert(strstr(mpg_last_error(), "junk") != NULL, "%s", mpg_last_error());
}

Test(errors, too_many_dims) {
  mpg_spec spec = MPG_SPEC_INIT;
  EXPECT_OK(mpg_spec_init(&spec));
  EXPECT_OK(mpg_spec_set_mesh(&spec, "a=1,b=1,c=1,d=1,e=1,f=1,g=1,h=1"));
  cr_assert_eq(spec.ndims, 8);
  EXPECT_ERR(mpg_spec_set_mesh(&spec, "a=1,b=1,c=1,d=1,e=1,f=1,g=1,h=1,i=1"),
             MPG_ERR_SPEC, "at most 8 dims");
  cr_assert_eq(spec.ndims, 8, "a failed set_mesh must not change the dims");
  /* Zero dims: a fresh spec. */
  EXPECT_OK(mpg_spec_init(&spec));
  create_fails(&spec, 0, MPG_ERR_SPEC, "found 0");
}

/* The mesh dp=2,tp=2,cp=2 with the flatten item `item` fails to be created,
 * with `sub` in the message; *spec is left as it was read. */
static void flatten_fails(mpg_spec *spec, const char *item, const char *sub) {
  const char *const fl[] = {item, NULL};
  spec_from(spec, "dp=2,tp=2,cp=2", fl);
  create_fails(spec, 8, MPG_ERR_SPEC, sub);
}

Test(errors, flatten_unknown_dim) {
  mpg_spec spec = MPG_SPEC_INIT;
  flatten_fails(&spec, "x=dp,cpp", "unknown dim \"cpp\"");
  cr_assert(strstr(mpg_last_error(), "did you mean \"cp\"") != NULL, "%s",
            mpg_last_error());
  cr_assert(strstr(mpg_last_error(), "dp, tp, cp") != NULL, "%s",
            mpg_last_error());
  EXPECT_ERR(mpg_spec_validate(&spec), MPG_ERR_SPEC, "mesh.flatten.x[1]");
}

Test(errors, flatten_repeats_dim) {
  mpg_spec spec = MPG_SPEC_INIT;
  flatten_fails(&spec, "x=dp,dp", "\"dp\" is listed twice");
}

Test(errors, flatten_out_of_mesh_order) {
  mpg_spec spec = MPG_SPEC_INIT;
  flatten_fails(&spec, "cp_dp=cp,dp", "mesh order");
  cr_assert(strstr(mpg_last_error(), "\"dp\" comes after \"cp\"") != NULL,
            "%s", mpg_last_error());
}

Test(errors, flatten_name_clash) {
  mpg_spec spec = MPG_SPEC_INIT;
  flatten_fails(&spec, "tp=dp,cp", "clashes with a mesh dim");
  flatten_fails(&spec, "world=dp,cp", "reserved group \"world\"");
  /* A bad set name. */
  flatten_fails(&spec, "9x=dp,cp", "\"9x\"");
  /* The same name twice replaces, it does not add. */
  static const char *const fl4[] = {"x=dp", "x=dp,cp", NULL};
  spec_from(&spec, "dp=2,tp=2,cp=2", fl4);
  cr_assert_eq(spec.nflatten, 1);
  cr_assert_eq(spec.flatten[0].ndims, 2);
}

Test(errors, flatten_list_errors) {
  mpg_spec spec = MPG_SPEC_INIT;
  spec_from(&spec, "dp=2,tp=2,cp=2", NULL);
  EXPECT_ERR(mpg_spec_add_flatten(&spec, "x", "dp,,cp"), MPG_ERR_SPEC,
             "expected a dim name");
  EXPECT_ERR(mpg_spec_add_flatten(&spec, "abcdefghijabcdefghijabcdefghij12",
                                  "dp"),
             MPG_ERR_SPEC, "longer than 31 chars");
  EXPECT_ERR(mpg_spec_add_flatten(&spec, "x", ""), MPG_ERR_SPEC,
             "expected a dim name");
  cr_assert_eq(spec.nflatten, 0);
  char name[16];
  for (int i = 0; i < MPG_MAX_FLATTEN; i++) {
    snprintf(name, sizeof name, "f%d", i);
    EXPECT_OK(mpg_spec_add_flatten(&spec, name, "dp"));
  }
  EXPECT_ERR(mpg_spec_add_flatten(&spec, "one_more", "dp"), MPG_ERR_SPEC,
             "at most 16");
  EXPECT_OK(mpg_spec_validate(&spec));
}

/* ------------------------------------------------------------------------ */
/* Lookup errors on a mesh                                                   */
/* ------------------------------------------------------------------------ */

Test(errors, dimset_find_unknown) {
  mpg_mesh *m = mesh_from("dp=2,tp=2,cp=2", 8, design_flat);
  int set = 77;
  EXPECT_ERR(mpg_mesh_dimset_find(m, "pp", &set), MPG_ERR_NOT_FOUND,
             "\"pp\"");
  cr_assert(strstr(mpg_last_error(), "dp, tp, cp, dp_cp, world") != NULL,
            "the message lists the known sets: %s", mpg_last_error());
  EXPECT_ERR(mpg_mesh_dimset_find(m, "dp_cq", &set), MPG_ERR_NOT_FOUND,
             "did you mean \"dp_cp\"");
  cr_assert_eq(set, 77, "a failed find must not write *dimset");
  EXPECT_OK(mpg_mesh_dimset_find(m, "world", &set));
  cr_assert_eq(set, 4);
  mpg_mesh_destroy(m);
}

Test(errors, out_of_range) {
  mpg_mesh *m = mesh_from("dp=2,tp=2,cp=2", 8, design_flat);
  int c[3], r = -5, ranks[8];
  EXPECT_ERR(mpg_mesh_coord_of(m, 8, c), MPG_ERR_RANGE, "rank 8");
  cr_assert(strstr(mpg_last_error(), "0..7") != NULL, "%s", mpg_last_error());
  EXPECT_ERR(mpg_mesh_coord_of(m, -1, c), MPG_ERR_RANGE, "rank -1");

  int bad[3] = {1, 2, 0};
  EXPECT_ERR(mpg_mesh_rank_of(m, bad, &r), MPG_ERR_RANGE,
             "coordinate 2 of dim \"tp\"");
  int neg[3] = {0, 0, -1};
  EXPECT_ERR(mpg_mesh_rank_of(m, neg, &r), MPG_ERR_RANGE,
             "coordinate -1 of dim \"cp\"");
  cr_assert_eq(r, -5, "a failed rank_of must not write *rank");

  /* dp: 4 groups of 2. */
  EXPECT_ERR(mpg_mesh_group_member(m, 0, 4, 0, &r), MPG_ERR_RANGE,
             "group 4 of \"dp\" is outside 0..3");
  EXPECT_ERR(mpg_mesh_group_member(m, 0, -1, 0, &r), MPG_ERR_RANGE, "group -1");
  EXPECT_ERR(mpg_mesh_group_member(m, 0, 0, 2, &r), MPG_ERR_RANGE,
             "position 2 in \"dp\" is outside 0..1");
  EXPECT_ERR(mpg_mesh_group_member(m, 0, 0, -1, &r), MPG_ERR_RANGE,
             "position -1");
  EXPECT_ERR(mpg_mesh_group_member(m, 5, 0, 0, &r), MPG_ERR_RANGE,
             "dim set 5 is outside 0..4");

  EXPECT_ERR(mpg_mesh_group_members(m, 3, 2, ranks), MPG_ERR_RANGE,
             "group 2 of \"dp_cp\" is outside 0..1");
  EXPECT_ERR(mpg_mesh_group_members(m, -1, 0, ranks), MPG_ERR_RANGE,
             "dim set -1");

  EXPECT_ERR(mpg_mesh_group_of(m, 0, 8, NULL, NULL, NULL), MPG_ERR_RANGE,
             "rank 8");
  EXPECT_ERR(mpg_mesh_group_of(m, 9, 0, NULL, NULL, NULL), MPG_ERR_RANGE,
             "dim set 9");

  EXPECT_ERR(mpg_mesh_dim(m, 3, NULL, NULL), MPG_ERR_RANGE, "dim 3");
  EXPECT_ERR(mpg_mesh_dim(m, -1, NULL, NULL), MPG_ERR_RANGE, "dim -1");
  EXPECT_ERR(mpg_mesh_dimset_info(m, 5, NULL, NULL, NULL), MPG_ERR_RANGE,
             "dim set 5");
  int dims[MPG_MAX_DIMS], n;
  EXPECT_ERR(mpg_mesh_dimset_dims(m, 5, dims, &n), MPG_ERR_RANGE, "dim set 5");
  mpg_mesh_destroy(m);
}

Test(errors, null_arguments) {
  mpg_spec spec = MPG_SPEC_INIT;
  EXPECT_ERR(mpg_spec_init(NULL), MPG_ERR_INVALID, "NULL");
  EXPECT_ERR(mpg_spec_set_mesh(NULL, "dp=2"), MPG_ERR_INVALID, "NULL");
  EXPECT_ERR(mpg_spec_add_flatten(NULL, "x", "dp"), MPG_ERR_INVALID, "NULL");
  EXPECT_ERR(mpg_spec_validate(NULL), MPG_ERR_INVALID, "NULL");
  EXPECT_OK(mpg_spec_init(&spec));
  EXPECT_ERR(mpg_spec_add_flatten(&spec, NULL, "dp"), MPG_ERR_INVALID, "NULL");
  EXPECT_ERR(mpg_spec_add_flatten(&spec, "x", NULL), MPG_ERR_INVALID, "NULL");
  /* A NULL mesh string is rejected (the header promises only "not OK"). */
  cr_assert_neq(mpg_spec_set_mesh(&spec, NULL), MPG_OK);
  cr_assert_neq(mpg_last_error()[0], '\0');

  /* A spec that never saw MPG_SPEC_INIT. */
  mpg_spec junk = MPG_SPEC_INIT;
  memset(&junk, 0, sizeof junk);
  EXPECT_ERR(mpg_spec_validate(&junk), MPG_ERR_INVALID, "MPG_SPEC_INIT");
  EXPECT_ERR(mpg_spec_set_mesh(&junk, "dp=2"), MPG_ERR_INVALID,
             "MPG_SPEC_INIT");

  EXPECT_OK(mpg_spec_set_mesh(&spec, "dp=2,tp=2"));
  EXPECT_ERR(mpg_mesh_create(&spec, 4, NULL), MPG_ERR_INVALID, "NULL");
  create_fails(NULL, 4, MPG_ERR_INVALID, "NULL");

  mpg_mesh *m = mesh_from("dp=2,tp=2", 4, NULL);
  int set = -1, r = -1, c[2] = {0, 0}, dims[MPG_MAX_DIMS], n;
  EXPECT_ERR(mpg_mesh_dimset_find(m, NULL, &set), MPG_ERR_INVALID, "NULL");
  EXPECT_ERR(mpg_mesh_dimset_find(m, "dp", NULL), MPG_ERR_INVALID, "NULL");
  EXPECT_ERR(mpg_mesh_dimset_find(NULL, "dp", &set), MPG_ERR_INVALID, "NULL");
  EXPECT_ERR(mpg_mesh_dim(NULL, 0, NULL, NULL), MPG_ERR_INVALID, "NULL");
  EXPECT_ERR(mpg_mesh_dimset_info(NULL, 0, NULL, NULL, NULL), MPG_ERR_INVALID,
             "NULL");
  EXPECT_ERR(mpg_mesh_dimset_dims(NULL, 0, dims, &n), MPG_ERR_INVALID, "NULL");
  EXPECT_ERR(mpg_mesh_dimset_dims(m, 0, NULL, &n), MPG_ERR_INVALID, "NULL");
  EXPECT_ERR(mpg_mesh_dimset_dims(m, 0, dims, NULL), MPG_ERR_INVALID, "NULL");
  EXPECT_ERR(mpg_mesh_coord_of(NULL, 0, c), MPG_ERR_INVALID, "NULL");
  EXPECT_ERR(mpg_mesh_coord_of(m, 0, NULL), MPG_ERR_INVALID, "NULL");
  EXPECT_ERR(mpg_mesh_rank_of(NULL, c, &r), MPG_ERR_INVALID, "NULL");
  EXPECT_ERR(mpg_mesh_rank_of(m, NULL, &r), MPG_ERR_INVALID, "NULL");
  EXPECT_ERR(mpg_mesh_rank_of(m, c, NULL), MPG_ERR_INVALID, "NULL");
  EXPECT_ERR(mpg_mesh_group_of(NULL, 0, 0, NULL, NULL, NULL), MPG_ERR_INVALID,
             "NULL");
  EXPECT_ERR(mpg_mesh_group_member(NULL, 0, 0, 0, &r), MPG_ERR_INVALID, "NULL");
  EXPECT_ERR(mpg_mesh_group_member(m, 0, 0, 0, NULL), MPG_ERR_INVALID, "NULL");
  EXPECT_ERR(mpg_mesh_group_members(NULL, 0, 0, c), MPG_ERR_INVALID, "NULL");
  EXPECT_ERR(mpg_mesh_group_members(m, 0, 0, NULL), MPG_ERR_INVALID, "NULL");
  /* The size getters answer 0 for NULL. */
  cr_assert_eq(mpg_mesh_world_size(NULL), 0);
  cr_assert_eq(mpg_mesh_ndims(NULL), 0);
  cr_assert_eq(mpg_mesh_num_dimsets(NULL), 0);
  mpg_mesh_destroy(m);
}

/* ------------------------------------------------------------------------ */
/* Status tables, last error, destroy(NULL)                                  */
/* ------------------------------------------------------------------------ */

Test(status, names_and_texts) {
  for (int i = 0; i < MPG_STATUS_COUNT; i++) {
    const char *name = mpg_status_name((mpg_status)i);
    const char *text = mpg_strerror((mpg_status)i);
    cr_assert_not_null(name, "status %d has no name", i);
    cr_assert_not_null(text, "status %d has no text", i);
    cr_assert_neq(name[0], '\0', "status %d has an empty name", i);
    cr_assert_neq(text[0], '\0', "status %d has an empty text", i);
    cr_assert_str_neq(name, "UNKNOWN", "status %d is unnamed", i);
    cr_assert_str_neq(text, "unknown status", "status %d has no text", i);
    cr_assert(strncmp(name, "MPG_", 4) != 0, "names lack the prefix: %s",
              name);
    for (int j = 0; j < i; j++) {
      cr_assert_str_neq(name, mpg_status_name((mpg_status)j),
                        "statuses %d and %d share the name %s", i, j, name);
      cr_assert_str_neq(text, mpg_strerror((mpg_status)j),
                        "statuses %d and %d share the text %s", i, j, text);
    }
  }
  cr_assert_eq(MPG_OK, 0);
  cr_assert_str_eq(mpg_status_name(MPG_OK), "OK");
  cr_assert_str_eq(mpg_status_name(MPG_ERR_TIMEOUT), "ERR_TIMEOUT");
  cr_assert_str_eq(mpg_strerror(MPG_ERR_TIMEOUT), "timed out waiting for peers");
  cr_assert_str_eq(mpg_status_name(MPG_ERR_SPEC), "ERR_SPEC");
  cr_assert_str_eq(mpg_status_name(MPG_STATUS_COUNT), "UNKNOWN");
  cr_assert_str_eq(mpg_strerror(MPG_STATUS_COUNT), "unknown status");
  cr_assert_str_eq(mpg_status_name((mpg_status)-1), "UNKNOWN");
  cr_assert_str_eq(mpg_strerror((mpg_status)12345), "unknown status");
}

static void *fresh_thread_error(void *arg) {
  const char **out = arg;
  *out = mpg_last_error();
  /* Copy now: the string belongs to this thread. */
  static char copy[64];
  snprintf(copy, sizeof copy, "%s", *out ? *out : "(null)");
  *out = copy;
  return NULL;
}

Test(status, last_error_is_per_thread) {
  cr_assert_neq(mpg_spec_init(NULL), MPG_OK);
  cr_assert_neq(mpg_last_error()[0], '\0');
  const char *seen = NULL;
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, fresh_thread_error, &seen), 0);
  cr_assert_eq(pthread_join(t, NULL), 0);
  cr_assert_str_eq(seen, "", "a new thread has no last error, found \"%s\"",
                   seen);
  /* This thread still has its own. */
  cr_assert(strstr(mpg_last_error(), "NULL") != NULL, "%s", mpg_last_error());
}

Test(status, destroy_null_is_harmless) {
  mpg_mesh_destroy(NULL);
  mpg_mesh_destroy(NULL);
  /* And the library still works afterwards. */
  mpg_mesh *m = mesh_from("dp=2", 2, NULL);
  cr_assert_eq(mpg_mesh_world_size(m), 2);
  mpg_mesh_destroy(m);
}
