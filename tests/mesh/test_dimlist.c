/* mesh/'s one dim-list parser and its group arithmetic over any set of
 * dims (mesh/include/mesh_internal.h), which groups/, sync/ and topo/ use:
 *  - properties over random meshes: the mask arithmetic agrees with the
 *    public dim-set API and is a bijection rank <-> (index, position);
 *  - the parser's rules, and the same answer from every module that takes
 *    a dim list (mpg_ctx_group_dims, reduce_dims, inner_dims).
 * Links the static library: the mpg__ functions are not exported. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mesh_internal.h"

#define OK(call) cr_assert_eq((call), MPG_OK, "%s: %s", #call, mpg_last_error())

static unsigned rnd_state = 12345;
static unsigned rnd(unsigned n) {
  rnd_state = rnd_state * 1103515245u + 12345u;
  return (rnd_state >> 8) % n;
}

/* A random mesh of 1..6 dims d0..d5 of sizes 1..4, with up to 3 flattened
 * sets of random dims (in mesh order). */
static mpg_mesh *random_mesh(void) {
  mpg_spec s = MPG_SPEC_INIT;
  int nd = 1 + (int)rnd(6);
  char dims[128] = "";
  size_t n = 0;
  for (int d = 0; d < nd; d++)
    n += (size_t)snprintf(dims + n, sizeof dims - n, "%sd%d=%u", d ? "," : "", d,
                          1 + rnd(4));
  OK(mpg_spec_set_mesh(&s, dims));
  int nf = (int)rnd(4);
  for (int f = 0; f < nf; f++) {
    unsigned mask = 1 + rnd((1u << nd) - 1);
    char name[16], list[64] = "";
    size_t k = 0;
    snprintf(name, sizeof name, "f%d", f);
    for (int d = 0; d < nd; d++)
      if (mask & (1u << d)) k += (size_t)snprintf(list + k, sizeof list - k, "%sd%d", k ? "," : "", d);
    OK(mpg_spec_add_flatten(&s, name, list));
  }
  mpg_mesh *m = NULL;
  OK(mpg_mesh_create(&s, 0, &m));
  return m;
}

Test(dimlist, mask_arithmetic_matches_the_dimset_api) {
  for (int trial = 0; trial < 400; trial++) {
    mpg_mesh *m = random_mesh();
    int world = mpg_mesh_world_size(m);
    for (int s = 0; s < mpg_mesh_num_dimsets(m); s++) {
      unsigned mask = mpg__mesh_dimset_mask(m, s);
      for (int t = 0; t < 8; t++) {
        int r = (int)rnd((unsigned)world);
        int gi, pos, size, gi2, pos2, size2;
        OK(mpg_mesh_group_of(m, s, r, &gi, &pos, &size));
        mpg__mesh_mask_place(m, mask, r, &gi2, &pos2, &size2);
        cr_assert(gi == gi2 && pos == pos2 && size == size2, "trial %d set %d rank %d", trial,
                  s, r);
        int p = (int)rnd((unsigned)size), want;
        OK(mpg_mesh_group_member(m, s, gi, p, &want));
        cr_assert_eq(mpg__mesh_mask_member(m, mask, r, p), want);
      }
    }
    mpg_mesh_destroy(m);
  }
}

Test(dimlist, any_mask_partitions_the_world) {
  for (int trial = 0; trial < 300; trial++) {
    mpg_mesh *m = random_mesh();
    int world = mpg_mesh_world_size(m), nd = mpg_mesh_ndims(m);
    unsigned mask = rnd(1u << nd);
    int *seen = calloc((size_t)world, sizeof *seen);
    int groups = 0;
    for (int r = 0; r < world; r++) {
      int gi, pos, size;
      mpg__mesh_mask_place(m, mask, r, &gi, &pos, &size);
      cr_assert_eq(mpg__mesh_mask_member(m, mask, r, pos), r, "rank %d is not at its position", r);
      if (pos == 0) groups++;
      /* Every member names the same group and the positions 0..size-1. */
      for (int p = 0; p < size; p++) {
        int q = mpg__mesh_mask_member(m, mask, r, p), gq, pq, sq;
        mpg__mesh_mask_place(m, mask, q, &gq, &pq, &sq);
        cr_assert(gq == gi && pq == p && sq == size);
      }
      seen[r]++;
    }
    int size;
    mpg__mesh_mask_place(m, mask, 0, NULL, NULL, &size);
    cr_assert_eq(groups * size, world);
    free(seen);
    mpg_mesh_destroy(m);
  }
}

Test(dimlist, random_lists_parse_to_the_union_in_named_order) {
  static const char *blank[] = {"", " ", "\t", " \t "};
  for (int trial = 0; trial < 400; trial++) {
    mpg_mesh *m = random_mesh();
    int nsets = mpg_mesh_num_dimsets(m);
    char list[512] = "";
    size_t n = 0;
    unsigned want = 0;
    int order[MPG_MAX_DIMS], norder = 0;
    int items = 1 + (int)rnd(4);
    for (int i = 0; i < items; i++) {
      int s = (int)rnd((unsigned)nsets);
      const char *name;
      OK(mpg_mesh_dimset_info(m, s, &name, NULL, NULL));
      n += (size_t)snprintf(list + n, sizeof list - n, "%s%s%s%s", i ? "," : "",
                            blank[rnd(4)], name, blank[rnd(4)]);
      int dims[MPG_MAX_DIMS], nd;
      OK(mpg_mesh_dimset_dims(m, s, dims, &nd));
      for (int k = 0; k < nd; k++)
        if (!(want & (1u << dims[k]))) want |= 1u << dims[k], order[norder++] = dims[k];
    }
    unsigned mask = 0;
    int got[MPG_MAX_DIMS], ngot = -1;
    OK(mpg__mesh_parse_dims(m, list, 0, "test", &mask, got, &ngot));
    cr_assert_eq(mask, want, "\"%s\"", list);
    cr_assert_eq(ngot, norder, "\"%s\"", list);
    for (int k = 0; k < ngot; k++) cr_assert_eq(got[k], order[k], "\"%s\"", list);
    mpg_mesh_destroy(m);
  }
}

static mpg_mesh *mesh_of(const char *dims, const char *fname, const char *fdims, int world) {
  mpg_spec s = MPG_SPEC_INIT;
  OK(mpg_spec_set_mesh(&s, dims));
  if (fname) OK(mpg_spec_add_flatten(&s, fname, fdims));
  mpg_mesh *m = NULL;
  OK(mpg_mesh_create(&s, world, &m));
  return m;
}

Test(dimlist, rules) {
  mpg_mesh *m = mesh_of("pp=1,dp=1,cp=1,tp=1", "dp_cp", "dp,cp", 1);
  unsigned mask;
  int nd;
  OK(mpg__mesh_parse_dims(m, " dp_cp ,\ttp\t", 0, "x", &mask, NULL, &nd));
  cr_assert_eq(mask, 0xEu);
  cr_assert_eq(nd, 3);
  OK(mpg__mesh_parse_dims(m, "tp,tp,world", 0, "x", &mask, NULL, &nd));
  cr_assert_eq(mask, 0xFu);
  cr_assert_eq(nd, 4);
  const char *empty_items[] = {"dp,,tp", ",tp", "tp,", " ", "\t,"};
  for (int i = 0; i < 5; i++) {
    cr_assert_eq(mpg__mesh_parse_dims(m, empty_items[i], 0, "x", &mask, NULL, NULL),
                 MPG_ERR_INVALID, "\"%s\"", empty_items[i]);
    cr_assert(strstr(mpg_last_error(), "empty name"), "%s", mpg_last_error());
  }
  char longname[80];
  memset(longname, 'a', sizeof longname - 1);
  longname[sizeof longname - 1] = '\0';
  cr_assert_eq(mpg__mesh_parse_dims(m, longname, 0, "x", &mask, NULL, NULL), MPG_ERR_INVALID);
  cr_assert(strstr(mpg_last_error(), "longer than 31"), "%s", mpg_last_error());
  cr_assert_eq(mpg__mesh_parse_dims(m, "dp,tq", 0, "group dims", &mask, NULL, NULL),
               MPG_ERR_NOT_FOUND);
  cr_assert(strstr(mpg_last_error(), "group dims \"dp,tq\": no dim or flattened set named "
                                     "\"tq\" (did you mean \"tp\"?)"),
            "%s", mpg_last_error());
  cr_assert_eq(mpg__mesh_parse_dims(m, "", 0, "x", &mask, NULL, NULL), MPG_ERR_INVALID);
  OK(mpg__mesh_parse_dims(m, "", MPG__DIMS_ALLOW_EMPTY, "x", &mask, NULL, NULL));
  cr_assert_eq(mask, 0u);
  OK(mpg__mesh_parse_dims(m, "ep,tp,xx", MPG__DIMS_SKIP_UNKNOWN, "x", &mask, NULL, &nd));
  cr_assert_eq(mask, 0x8u);
  cr_assert_eq(nd, 1);
  mpg_mesh_destroy(m);
}

/* Every module that takes a dim list answers a list alike. */
typedef struct verdicts {
  const mpg_mesh *mesh;
  const char *list;
  mpg_status group, sync, placement;
} verdicts;

static mpg_status judge(const mpg_init_opts *lib, void *arg) {
  verdicts *v = arg;
  mpg_ctx *ctx = NULL;
  mpg_status st = mpg_ctx_create(v->mesh, lib, &ctx);
  if (st) return st;
  mpg_group *g = NULL;
  v->group = mpg_ctx_group_dims(ctx, v->list, &g);
  mpg_sync *sync = NULL;
  if ((st = mpg_sync_create(ctx, NULL, &sync)) == MPG_OK) {
    mpg_param_opts po = MPG_PARAM_OPTS_INIT;
    po.reduce_dims = v->list;
    int id;
    v->sync = mpg_sync_add_param(sync, "w", 4, MPG_F32, &po, &id);
    mpg_sync_destroy(sync);
  }
  mpg_placement_opts plo = MPG_PLACEMENT_OPTS_INIT;
  plo.inner_dims = v->list;
  mpg_placement *pl = NULL;
  v->placement = mpg_placement_create(v->mesh, &plo, &pl);
  mpg_placement_destroy(pl);
  mpg_ctx_destroy(ctx);
  return st;
}

Test(dimlist, groups_sync_and_placement_agree) {
  mpg_mesh *m = mesh_of("dp=1,cp=1,tp=1", "dp_cp", "dp,cp", 1);
  const char *lists[] = {"dp_cp,tp", " tp\t", "dp,,tp", "tp,", "tpp", "dp_cp, world",
                         "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "cp ,dp"};
  for (size_t i = 0; i < sizeof lists / sizeof lists[0]; i++) {
    verdicts v = {m, lists[i], -1, -1, -1};
    OK(mpg_thread_run(1, 10.0, judge, &v, NULL));
    cr_assert(v.group == v.sync && v.sync == v.placement,
              "\"%s\": group_dims %s, reduce_dims %s, inner_dims %s", lists[i],
              mpg_status_name(v.group), mpg_status_name(v.sync),
              mpg_status_name(v.placement));
  }
  mpg_mesh_destroy(m);
}

/* ------------------------------------------------------------------ */
/* The expert grid's names in dim lists                                */
/* ------------------------------------------------------------------ */

Test(dimlist, expert_names_join_dim_lists) {
  mpg_spec s = MPG_SPEC_INIT;
  OK(mpg_spec_set_mesh(&s, "pp=2,dp=2,cp=2,tp=2"));
  OK(mpg_spec_set_experts(&s, 1, 2, NULL));
  mpg_mesh *m = NULL;
  OK(mpg_mesh_create(&s, 0, &m));
  unsigned mask, mu, mpp;
  int set;
  /* etp, ep, edp are the expert grid's own bits (MPG__MASK_ETP + 0, 1, 2:
   * above every mesh dim's, whatever the mesh's dim count); pp is the
   * mesh's bit 0. */
  OK(mpg__mesh_parse_dims(m, "ep", 0, "t", &mask, NULL, NULL));
  cr_expect_eq(mask, 1u << (MPG__MASK_ETP + 1));
  OK(mpg__mesh_parse_dims(m, "etp, ep", 0, "t", &mu, NULL, NULL));
  OK(mpg_mesh_dimset_find(m, "etp_ep", &set));
  cr_expect_eq(mu, mpg__mesh_dimset_mask(m, set));
  OK(mpg__mesh_parse_dims(m, "etp,ep,pp", 0, "t", &mpp, NULL, NULL));
  OK(mpg_mesh_dimset_find(m, "etp_ep_pp", &set));
  cr_expect_eq(mpp, mpg__mesh_dimset_mask(m, set));
  cr_expect_eq(mpp, (1u << MPG__MASK_ETP) | (1u << (MPG__MASK_ETP + 1)) | 1u);
  cr_expect_lt(mpp, MPG__MASK_LIMIT);
  /* Names back and forth. */
  char names[128];
  mpg__mesh_mask_names(m, mpp, ",", names, sizeof names);
  cr_expect_str_eq(names, "pp,etp,ep");
  /* mpg_mesh_dimset_dims numbers the expert dims after the mesh's (its
   * public rule, unchanged). */
  int dims[MPG_MAX_DIMS], nd;
  OK(mpg_mesh_dimset_dims(m, set, dims, &nd));
  cr_assert_eq(nd, 3);
  cr_expect(dims[0] == 0 && dims[1] == 4 && dims[2] == 5);
  /* Each rank's group over the mask equals the dim set's. */
  for (int r = 0; r < 16; r++) {
    int a, b, c, d;
    mpg__mesh_mask_place(m, mpp, r, &a, &b, NULL);
    OK(mpg_mesh_group_of(m, set, r, &c, &d, NULL));
    cr_expect(a == c && b == d, "rank %d", r);
    cr_expect_eq(mpg__mesh_mask_member(m, mpp, r, b), r);
  }
  /* A mesh dim other than pp does not mix with the expert grid. */
  cr_expect_eq(mpg__mesh_parse_dims(m, "tp,ep", 0, "group dims", &mask, NULL, NULL),
               MPG_ERR_INVALID);
  cr_expect(strstr(mpg_last_error(), "group dims \"tp,ep\": names dims of the mesh (tp) "
                                     "and of the expert grid (ep)"),
            "%s", mpg_last_error());
  /* Callers that want mesh dim indices (placement) get no expert dims. */
  cr_expect_eq(mpg__mesh_parse_dims(m, "ep", 0, "inner", &mask, dims, &nd), MPG_ERR_INVALID);
  OK(mpg__mesh_parse_dims(m, "tp,ep", MPG__DIMS_SKIP_UNKNOWN, "inner", &mask, dims, &nd));
  cr_expect_eq(nd, 1);
  cr_expect_eq(mask, 1u << 3);
  mpg_mesh_destroy(m);
}
