/* The expert grid as a second grid over the same world (issue 30): meshes
 * of 6, 7 and 8 dims (MPG_MAX_DIMS) with [experts], every expert group
 * checked against a reference written here from Megatron's rules, not
 * from the mesh's own answers:
 *  - Megatron's RankGenerator(tp=etp, ep, dp=edp, pp, cp=1, order) and
 *    its generate_masked_orthogonal_rank_groups (parallel_state.py): the
 *    order string names the tokens innermost first; a group over tokens S
 *    lists ranks with S's innermost token fastest, and the groups come in
 *    the order of the other tokens' coordinates, innermost fastest;
 *  - which layouts mesh creation accepts (docs/pipeline-and-experts.md,
 *    "Checked when a mesh is built"): the same pipeline groups in both
 *    grids, and edp = the mesh's dp unless pp is 1 or outermost.
 * The named expert sets (etp, ep, edp, etp_ep, etp_ep_pp) through the
 * public API; every union a dim list may name ("etp,ep", "edp,pp", ...)
 * through mesh/'s parser and mask arithmetic, which mpg_ctx_group_dims and
 * reduce_dims use; and groups, a sync over "edp" and the issue-order
 * checker on an 8-dim mesh on the thread backend.
 * Links the static library: the mpg__ functions are not exported. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mesh_internal.h"

#define OK(call) cr_assert_eq((call), MPG_OK, "%s: %s", #call, mpg_last_error())

static unsigned rnd_state = 2024u;
static int rnd(int n) {
  rnd_state = rnd_state * 1103515245u + 12345u;
  return (int)((rnd_state >> 8) % (unsigned)n);
}

/* ------------------------------------------------------------------ */
/* The reference                                                       */
/* ------------------------------------------------------------------ */

/* Megatron's expert RankGenerator: tokens innermost first. */
typedef struct ref_grid {
  int n;
  char tok[5][4]; /* "tp", "cp", "ep", "dp", "pp" */
  int size[5];
} ref_grid;

/* generate_masked_orthogonal_rank_groups over the tokens in `in` (a
 * comma-separated list of token names): out[gi * gs + p] is member p of
 * group gi; returns the group size. */
static int ref_groups(const ref_grid *g, int world, const char *in, int *out) {
  int masked[5], unmasked[5], nm = 0, nu = 0, stride[5], s = 1;
  for (int i = 0; i < g->n; i++) {
    stride[i] = s;
    s *= g->size[i];
    char pat[8];
    snprintf(pat, sizeof pat, ",%s,", g->tok[i]);
    char list[64];
    snprintf(list, sizeof list, ",%s,", in);
    if (strstr(list, pat)) masked[nm++] = i;
    else unmasked[nu++] = i;
  }
  cr_assert_eq(s, world);
  int gs = 1;
  for (int k = 0; k < nm; k++) gs *= g->size[masked[k]];
  for (int gi = 0; gi < world / gs; gi++) {
    int base = 0, rest = gi;
    for (int k = 0; k < nu; k++) { /* decompose: the first token fastest */
      base += (rest % g->size[unmasked[k]]) * stride[unmasked[k]];
      rest /= g->size[unmasked[k]];
    }
    for (int p = 0; p < gs; p++) {
      int r = base, q = p;
      for (int k = 0; k < nm; k++) {
        r += (q % g->size[masked[k]]) * stride[masked[k]];
        q /= g->size[masked[k]];
      }
      out[gi * gs + p] = r;
    }
  }
  return gs;
}

/* A random mesh of `nd` dims: pp, dp, cp, tp and nd - 4 more (x0..x3),
 * in a random order or with pp outermost, at most 256 ranks. */
typedef struct layout {
  int nd, world;
  char names[MPG_MAX_DIMS][8];
  int sizes[MPG_MAX_DIMS];
  int etp, ep;
  char order[32]; /* "" = the default */
} layout;

static int mesh_size(const layout *l, const char *name) {
  for (int d = 0; d < l->nd; d++)
    if (!strcmp(l->names[d], name)) return l->sizes[d];
  return 1;
}

static void random_layout(layout *l, int nd) {
  static const char *const base[4] = {"pp", "dp", "cp", "tp"};
  do {
    l->nd = nd;
    l->world = 1;
    for (int d = 0; d < nd; d++) {
      if (d < 4) snprintf(l->names[d], sizeof l->names[d], "%s", base[d]);
      else snprintf(l->names[d], sizeof l->names[d], "x%d", d - 4);
      l->sizes[d] = d == 0 ? 1 + rnd(4) : d < 4 ? 1 + rnd(3) : 1 + rnd(2);
      l->world *= l->sizes[d];
    }
  } while (l->world > 256);
  /* Shuffle; then pp outermost half of the time. */
  for (int i = nd - 1; i >= 0; i--) {
    int j = i > 0 ? rnd(i + 1) : (rnd(2) ? 0 : -1);
    if (j < 0) break;
    if (i == 0) /* move pp to the front */
      for (j = 0; strcmp(l->names[j], "pp"); j++) continue;
    char t[8];
    int ts = l->sizes[i];
    memcpy(t, l->names[i], 8);
    memcpy(l->names[i], l->names[j], 8);
    memcpy(l->names[j], t, 8);
    l->sizes[i] = l->sizes[j];
    l->sizes[j] = ts;
  }
  /* Megatron-valid sizes: etp x ep divides world / pp. */
  int stage = l->world / mesh_size(l, "pp");
  do l->etp = 1 + rnd(stage); while (stage % l->etp);
  do l->ep = 1 + rnd(stage / l->etp); while ((stage / l->etp) % l->ep);
  l->order[0] = '\0';
  if (rnd(3)) { /* an explicit order over all tokens, cp at times */
    const char *t[5] = {"tp", "ep", "dp", "pp", "cp"};
    int n = rnd(2) ? 5 : 4;
    for (int i = n - 1; i > 0; i--) {
      int j = rnd(i + 1);
      const char *x = t[i];
      t[i] = t[j];
      t[j] = x;
    }
    size_t k = 0;
    for (int i = 0; i < n; i++)
      k += (size_t)snprintf(l->order + k, sizeof l->order - k, "%s%s", i ? "-" : "", t[i]);
  }
}

/* The expert grid by the rules, and whether mesh creation accepts it. */
static int ref_expert_grid(const layout *l, ref_grid *g) {
  int pp = mesh_size(l, "pp");
  int edp = l->world / (l->etp * l->ep * pp);
  char order[64];
  if (l->order[0]) {
    snprintf(order, sizeof order, "%s", l->order);
  } else { /* the default: the mesh's tokens innermost first, ep inside dp */
    size_t k = 0;
    order[0] = '\0';
    for (int d = l->nd - 1; d >= 0; d--) {
      const char *nm = l->names[d];
      if (strcmp(nm, "tp") && strcmp(nm, "cp") && strcmp(nm, "dp") && strcmp(nm, "pp"))
        continue;
      k += (size_t)snprintf(order + k, sizeof order - k, "%s%s%s", k ? "-" : "",
                            strcmp(nm, "dp") ? "" : "ep-", nm);
    }
  }
  g->n = 0;
  char *save = NULL;
  for (char *t = strtok_r(order, "-", &save); t; t = strtok_r(NULL, "-", &save)) {
    snprintf(g->tok[g->n], sizeof g->tok[g->n], "%s", t);
    g->size[g->n++] = !strcmp(t, "tp")   ? l->etp
                      : !strcmp(t, "ep") ? l->ep
                      : !strcmp(t, "dp") ? edp
                      : !strcmp(t, "pp") ? pp
                                         : 1;
  }
  if (pp == 1) return 1;
  /* The same pipeline groups: the same pp stride in both grids. */
  int estride = 1, mstride = 1;
  for (int i = 0; i < g->n && strcmp(g->tok[i], "pp"); i++) estride *= g->size[i];
  for (int d = l->nd - 1; d >= 0 && strcmp(l->names[d], "pp"); d--) mstride *= l->sizes[d];
  if (estride != mstride) return 0;
  int pp_last = l->order[0] ? !strcmp(g->tok[g->n - 1], "pp") : !strcmp(l->names[0], "pp");
  int dp = l->world / (mesh_size(l, "tp") * mesh_size(l, "cp") * pp);
  return pp_last || edp == dp;
}

static mpg_status build(const layout *l, mpg_mesh **m) {
  char dims[256];
  size_t k = 0;
  for (int d = 0; d < l->nd; d++)
    k += (size_t)snprintf(dims + k, sizeof dims - k, "%s%s=%d", d ? "," : "", l->names[d],
                          l->sizes[d]);
  mpg_spec sp = MPG_SPEC_INIT;
  OK(mpg_spec_set_mesh(&sp, dims));
  OK(mpg_spec_set_experts(&sp, l->etp, l->ep, l->order));
  OK(mpg_spec_validate(&sp)); /* any dim count up to MPG_MAX_DIMS */
  return mpg_mesh_create(&sp, 0, m);
}

/* ------------------------------------------------------------------ */
/* The property                                                        */
/* ------------------------------------------------------------------ */

/* The named expert sets, and the reference's tokens of each. */
static const char *const NAMED[5][2] = {
    {"etp", "tp"}, {"ep", "ep"}, {"edp", "dp"}, {"etp_ep", "tp,ep"}, {"etp_ep_pp", "tp,ep,pp"}};

/* Dim lists over the expert grid (unions included), and their tokens. */
static const char *const LISTS[][2] = {
    {"etp", "tp"},          {"ep,etp", "tp,ep"},         {"etp, ep", "tp,ep"},
    {"ep,pp", "ep,pp"},     {"edp,pp", "dp,pp"},         {"etp,edp", "tp,dp"},
    {"ep,edp", "ep,dp"},    {"etp,ep,edp", "tp,ep,dp"},  {"etp_ep,pp", "tp,ep,pp"},
    {"pp,etp", "tp,pp"},    {"etp_ep_pp,edp", "tp,ep,dp,pp"},
    {"etp,ep,pp", "tp,ep,pp"}, {"pp", "pp"}};

static void check_named(const mpg_mesh *m, const ref_grid *g, int world, int *ref, int *got,
                        const char *what) {
  for (int k = 0; k < 5; k++) {
    int set, gs, ng;
    OK(mpg_mesh_dimset_find(m, NAMED[k][0], &set));
    OK(mpg_mesh_dimset_info(m, set, NULL, &gs, &ng));
    int want = ref_groups(g, world, NAMED[k][1], ref);
    cr_assert_eq(gs, want, "%s: %s size %d, Megatron %d", what, NAMED[k][0], gs, want);
    cr_assert_eq(ng * gs, world);
    for (int gi = 0; gi < ng; gi++) {
      OK(mpg_mesh_group_members(m, set, gi, got));
      for (int p = 0; p < gs; p++) {
        cr_assert_eq(got[p], ref[gi * gs + p], "%s: %s group %d position %d", what,
                     NAMED[k][0], gi, p);
        int idx, pos;
        OK(mpg_mesh_group_of(m, set, got[p], &idx, &pos, NULL));
        cr_assert(idx == gi && pos == p, "%s: %s rank %d", what, NAMED[k][0], got[p]);
      }
    }
  }
}

static void check_lists(const mpg_mesh *m, const ref_grid *g, int world, int *ref,
                        const char *what) {
  for (size_t k = 0; k < sizeof LISTS / sizeof LISTS[0]; k++) {
    unsigned mask;
    OK(mpg__mesh_parse_dims(m, LISTS[k][0], 0, "t", &mask, NULL, NULL));
    cr_assert_lt(mask, MPG__MASK_LIMIT);
    cr_assert_eq(mpg__mesh_slot_mask(m, mpg__mesh_mask_slot(m, mask)), mask);
    cr_assert_lt(mpg__mesh_mask_slot(m, mask), MPG__MASK_SLOTS);
    int gs = ref_groups(g, world, LISTS[k][1], ref);
    for (int gi = 0; gi < world / gs; gi++)
      for (int p = 0; p < gs; p++) {
        int r = ref[gi * gs + p], idx, pos, size;
        mpg__mesh_mask_place(m, mask, r, &idx, &pos, &size);
        cr_assert(idx == gi && pos == p && size == gs,
                  "%s: \"%s\": rank %d at (%d, %d) of %d, Megatron (%d, %d) of %d", what,
                  LISTS[k][0], r, idx, pos, size, gi, p, gs);
        cr_assert_eq(mpg__mesh_mask_member(m, mask, ref[gi * gs], p), r, "%s: \"%s\"", what,
                     LISTS[k][0]);
      }
  }
  /* A mesh dim other than pp never joins the expert grid's. */
  unsigned mask;
  cr_assert_eq(mpg__mesh_parse_dims(m, "dp,ep", 0, "t", &mask, NULL, NULL), MPG_ERR_INVALID);
}

Test(expert_grid, six_to_eight_dims_match_megatron) {
  int accepted[MPG_MAX_DIMS + 1] = {0}, tried = 0;
  int *ref = malloc(sizeof(int) * 256), *got = malloc(sizeof(int) * 256);
  for (int nd = 6; nd <= MPG_MAX_DIMS; nd++)
    for (int iter = 0; iter < 150; iter++) {
      layout l;
      random_layout(&l, nd);
      ref_grid g;
      int ok = ref_expert_grid(&l, &g);
      mpg_mesh *m = NULL;
      mpg_status st = build(&l, &m);
      char what[256];
      snprintf(what, sizeof what, "mesh of %d dims (world %d, %s=%d ...), etp %d, ep %d, "
               "order \"%s\"", nd, l.world, l.names[0], l.sizes[0], l.etp, l.ep, l.order);
      tried++;
      cr_assert_eq(st == MPG_OK, ok, "%s: meshpg %s, the rules %s (%s)", what,
                   st ? "refuses" : "accepts", ok ? "accept" : "refuse", mpg_last_error());
      if (st) {
        cr_assert_eq(st, MPG_ERR_SPEC);
        cr_assert(strstr(mpg_last_error(), "experts"), "%s", mpg_last_error());
        continue;
      }
      accepted[nd]++;
      cr_assert_eq(mpg_mesh_ndims(m), nd);
      check_named(m, &g, l.world, ref, got, what);
      check_lists(m, &g, l.world, ref, what);
      mpg_mesh_destroy(m);
    }
  free(ref);
  free(got);
  for (int nd = 6; nd <= MPG_MAX_DIMS; nd++)
    cr_expect_gt(accepted[nd], 40, "%d dims: only %d of 150 layouts accepted", nd,
                 accepted[nd]);
  cr_expect_eq(tried, 450);
}

/* The public numbering of an expert set's dims is unchanged: etp, ep, edp
 * are mpg_mesh_ndims + 0, 1, 2, also with 8 mesh dims. */
/* An 8-dim mesh of `dims` with dp_cp = dp,cp and experts etp = 1, ep = 2. */
static mpg_mesh *eight_dim_mesh(const char *dims) {
  mpg_spec sp = MPG_SPEC_INIT;
  OK(mpg_spec_set_mesh(&sp, dims));
  OK(mpg_spec_add_flatten(&sp, "dp_cp", "dp,cp"));
  OK(mpg_spec_set_experts(&sp, 1, 2, NULL));
  mpg_mesh *m = NULL;
  OK(mpg_mesh_create(&sp, 0, &m));
  return m;
}

Test(expert_grid, eight_dims_build_and_number_expert_dims) {
  mpg_mesh *m = eight_dim_mesh("pp=2,a=1,dp=2,b=1,cp=1,c=1,d=1,tp=2");
  cr_assert_eq(mpg_mesh_ndims(m), MPG_MAX_DIMS);
  cr_assert_eq(mpg_mesh_expert_ndims(m), 4);
  int set, dims[MPG_MAX_DIMS], n;
  OK(mpg_mesh_dimset_find(m, "etp_ep_pp", &set));
  OK(mpg_mesh_dimset_dims(m, set, dims, &n));
  cr_assert_eq(n, 3);
  cr_expect(dims[0] == 0 && dims[1] == MPG_MAX_DIMS && dims[2] == MPG_MAX_DIMS + 1);
  OK(mpg_mesh_dimset_find(m, "edp", &set));
  OK(mpg_mesh_dimset_dims(m, set, dims, &n));
  cr_expect(n == 1 && dims[0] == MPG_MAX_DIMS + 2);
  char names[128];
  unsigned mask;
  OK(mpg__mesh_parse_dims(m, "edp,pp,etp", 0, "t", &mask, NULL, NULL));
  mpg__mesh_mask_names(m, mask, ",", names, sizeof names);
  cr_expect_str_eq(names, "pp,etp,edp");
  mpg_mesh_destroy(m);
}

/* ------------------------------------------------------------------ */
/* Groups and sync on an 8-dim mesh (thread backend)                   */
/* ------------------------------------------------------------------ */

/* Each rank sums its rank over expert groups by name and by dim list,
 * then a sync reduces an expert param over "edp" and another over
 * "etp,ep" next to a dense one; every sum is checked against the mesh's
 * listing (itself checked against Megatron above).  The issue-order
 * checker (MESHPG_CHECK_ORDER=1 in the tests' environment) follows every
 * group, the expert ones included. */
static mpg_status rank_main(const mpg_init_opts *opts, void *arg) {
  const mpg_mesh *mesh = arg;
  mpg_ctx *ctx = NULL;
  mpg_status st = mpg_ctx_create(mesh, opts, &ctx);
  if (st) return st;
  const char *lists[6] = {"edp", "ep", "etp_ep", "etp,ep,pp", "edp,pp", "ep,etp"};
  const char *sets[6] = {"edp", "ep", "etp_ep", "etp_ep_pp", NULL, "etp_ep"};
  for (int k = 0; k < 6 && !st; k++) {
    mpg_group *g = NULL;
    st = k < 3 ? mpg_ctx_group(ctx, lists[k], &g) : mpg_ctx_group_dims(ctx, lists[k], &g);
    int64_t in = opts->rank, out = -1, want = 0;
    mpg_work *w = NULL;
    if (!st) st = mpg_all_reduce(g, &in, &out, 1, MPG_I64, MPG_OP_SUM, NULL, &w);
    if (!st) st = mpg_work_wait(w);
    unsigned mask;
    int gs = 0;
    if (!st) st = mpg__mesh_parse_dims(mesh, lists[k], 0, "t", &mask, NULL, NULL);
    if (!st) mpg__mesh_mask_place(mesh, mask, opts->rank, NULL, NULL, &gs);
    for (int p = 0; p < gs; p++) want += mpg__mesh_mask_member(mesh, mask, opts->rank, p);
    if (!st && (out != want || mpg_group_size(g) != gs)) st = MPG_ERR_STATE;
    if (!st && sets[k] && strcmp(mpg_group_name(g), sets[k])) st = MPG_ERR_STATE;
  }
  mpg_sync_opts so = MPG_SYNC_OPTS_INIT;
  so.sync.op = MPG_OP_SUM;
  mpg_sync *sync = NULL;
  mpg_param_opts pe = MPG_PARAM_OPTS_INIT, pu = MPG_PARAM_OPTS_INIT;
  pe.reduce_dims = "edp";
  pu.reduce_dims = "etp,ep";
  int id[3] = {-1, -1, -1};
  if (!st) st = mpg_sync_create(ctx, &so, &sync);
  if (!st) st = mpg_sync_add_param(sync, "expert.w", 3, MPG_F32, &pe, &id[0]);
  if (!st) st = mpg_sync_add_param(sync, "router.w", 3, MPG_F32, &pu, &id[1]);
  if (!st) st = mpg_sync_add_param(sync, "dense.w", 3, MPG_F32, NULL, &id[2]);
  if (!st) st = mpg_sync_commit(sync);
  float *grad[3] = {NULL, NULL, NULL};
  for (int k = 0; k < 3 && !st; k++) {
    st = mpg_sync_grad(sync, id[k], (void **)&grad[k]);
    for (int i = 0; !st && i < 3; i++) grad[k][i] = (float)(opts->rank + i);
  }
  if (!st) st = mpg_sync_all(sync, 0, NULL);
  const char *over[3] = {"edp", "etp,ep", "dp_cp"};
  for (int k = 0; k < 3 && !st; k++) {
    unsigned mask;
    int gs = 0;
    st = mpg__mesh_parse_dims(mesh, over[k], 0, "t", &mask, NULL, NULL);
    if (!st) mpg__mesh_mask_place(mesh, mask, opts->rank, NULL, NULL, &gs);
    for (int i = 0; i < 3 && !st; i++) {
      float want = 0;
      for (int p = 0; p < gs; p++)
        want += (float)(mpg__mesh_mask_member(mesh, mask, opts->rank, p) + i);
      if (grad[k][i] != want) st = MPG_ERR_STATE;
    }
  }
  mpg_sync_destroy(sync);
  mpg_ctx_destroy(ctx);
  return st;
}

Test(expert_grid, groups_and_sync_on_an_eight_dim_mesh) {
  mpg_mesh *m = eight_dim_mesh("pp=2,a=1,dp=2,b=1,cp=2,c=1,d=1,tp=2");
  mpg_status st = mpg_thread_run(16, 60.0, rank_main, m, NULL);
  cr_expect_eq(st, MPG_OK, "%s: %s", mpg_status_name(st), mpg_last_error());
  mpg_mesh_destroy(m);
}
