/* Rank placement across nodes: node identities, block and cyclic launcher
 * numbering on 2 to 16 simulated nodes and many mesh shapes.  tp (and cp
 * where it fits) groups never cross nodes when they fit in one; misfits are
 * counted, logged and, in strict mode, errors. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "meshpg.h"

static mpg_mesh *make_mesh(const char *dims, const char *flatten_name,
                           const char *flatten_dims) {
  mpg_spec spec = MPG_SPEC_INIT;
  mpg_spec_init(&spec);
  cr_assert_eq(mpg_spec_set_mesh(&spec, dims), MPG_OK, "%s", mpg_last_error());
  if (flatten_name)
    cr_assert_eq(mpg_spec_add_flatten(&spec, flatten_name, flatten_dims), MPG_OK);
  mpg_mesh *m = NULL;
  cr_assert_eq(mpg_mesh_create(&spec, 0, &m), MPG_OK, "%s: %s", dims,
               mpg_last_error());
  return m;
}

static int find_set(const mpg_mesh *m, const char *name) {
  int s = -1;
  if (mpg_mesh_dimset_find(m, name, &s) != MPG_OK) return -1;
  return s;
}

/* Max number of nodes any group of `set` spans. */
static int max_span(const mpg_placement *pl, const mpg_mesh *m, int set) {
  int ngroups, worst = 0;
  mpg_mesh_dimset_info(m, set, NULL, NULL, &ngroups);
  for (int g = 0; g < ngroups; g++) {
    int n;
    cr_assert_eq(mpg_placement_group_nodes(pl, set, g, &n), MPG_OK);
    if (n > worst) worst = n;
  }
  return worst;
}

/* The placement is a bijection consistent with the launcher's numbering. */
static void check_consistent(const mpg_placement *pl, int world, int nodes,
                             int gpn, mpg_rank_order order) {
  unsigned char *seen = calloc((size_t)world, 1);
  for (int m = 0; m < world; m++) {
    int L, node, gpu, back;
    cr_assert_eq(mpg_placement_of(pl, m, &L, &node, &gpu), MPG_OK);
    cr_assert(L >= 0 && L < world);
    cr_assert_eq(seen[L], 0, "launcher rank %d used twice", L);
    seen[L] = 1;
    cr_assert_eq(mpg_placement_mesh_rank(pl, L, &back), MPG_OK);
    cr_assert_eq(back, m);
    if (order == MPG_RANK_ORDER_BLOCK) {
      cr_assert_eq(node, L / gpn);
      cr_assert_eq(gpu, L % gpn);
    } else {
      cr_assert_eq(node, L % nodes);
      cr_assert_eq(gpu, L / nodes);
    }
  }
  free(seen);
}

static mpg_placement *place(const mpg_mesh *m, int nodes, int gpn,
                            mpg_rank_order order) {
  mpg_placement_opts o = MPG_PLACEMENT_OPTS_INIT;
  o.topology.nodes = nodes;
  o.topology.gpus_per_node = gpn;
  o.topology.rank_order = order;
  mpg_placement *pl = NULL;
  cr_assert_eq(mpg_placement_create(m, &o, &pl), MPG_OK, "%s", mpg_last_error());
  return pl;
}

/* Mesh rank r is launcher rank r, for every r < world. */
static void expect_identity(const mpg_placement *pl, int world) {
  for (int r = 0; r < world; r++) {
    int L;
    mpg_placement_of(pl, r, &L, NULL, NULL);
    cr_assert_eq(L, r);
  }
}

/* ------------------------------------------------------------------------ */
/* Node identity                                                             */
/* ------------------------------------------------------------------------ */

Test(node_ids, host_identity_has_hostname_and_boot_id) {
  char id[MPG_HOST_ID_MAX];
  cr_assert_eq(mpg_topo_host_identity(id, sizeof id), MPG_OK, "%s", mpg_last_error());
  cr_assert_gt(strlen(id), 0);
  char again[MPG_HOST_ID_MAX];
  mpg_topo_host_identity(again, sizeof again);
  cr_assert_str_eq(id, again);
  char tiny[2];
  cr_assert_eq(mpg_topo_host_identity(tiny, sizeof tiny), MPG_ERR_RANGE);
  cr_assert_eq(mpg_topo_host_identity(NULL, 10), MPG_ERR_INVALID);
}

Test(node_ids, numbered_by_lowest_rank_with_local_ranks) {
  const char *ids[8] = {"b:1", "a:1", "b:1", "c:9", "a:1", "c:9", "b:1", "a:1"};
  int node[8], local[8], n = 0;
  cr_assert_eq(mpg_topo_node_ids(8, ids, node, local, &n), MPG_OK);
  cr_assert_eq(n, 3);
  int want_node[8] = {0, 1, 0, 2, 1, 2, 0, 1};
  int want_local[8] = {0, 0, 1, 0, 1, 1, 2, 2};
  for (int r = 0; r < 8; r++) {
    cr_assert_eq(node[r], want_node[r], "rank %d", r);
    cr_assert_eq(local[r], want_local[r], "rank %d", r);
  }
  /* Same host name, different boot ids: different nodes. */
  const char *boots[2] = {"gpu01:aaaa", "gpu01:bbbb"};
  cr_assert_eq(mpg_topo_node_ids(2, boots, node, NULL, &n), MPG_OK);
  cr_assert_eq(n, 2);
  cr_assert_eq(mpg_topo_node_ids(0, ids, node, local, &n), MPG_ERR_RANGE);
  const char *holes[2] = {"a", NULL};
  cr_assert_eq(mpg_topo_node_ids(2, holes, node, local, &n), MPG_ERR_INVALID);
}

Test(node_ids, large_world_is_fast) {
  enum { W = 65536, G = 8 };
  static char buf[W][16];
  static const char *ids[W];
  static int node[W], local[W];
  for (int r = 0; r < W; r++) {
    snprintf(buf[r], sizeof buf[r], "h%05d:x", r % (W / G)); /* cyclic */
    ids[r] = buf[r];
  }
  int n;
  cr_assert_eq(mpg_topo_node_ids(W, ids, node, local, &n), MPG_OK);
  cr_assert_eq(n, W / G);
  for (int r = 0; r < W; r++) {
    cr_assert_eq(node[r], r % (W / G));
    cr_assert_eq(local[r], r / (W / G));
  }
}

/* ------------------------------------------------------------------------ */
/* Simulated multi-node layouts                                              */
/* ------------------------------------------------------------------------ */

Test(placement, many_shapes_block_and_cyclic) {
  static const int node_counts[] = {2, 3, 4, 6, 8, 16};
  static const int gpn_counts[] = {1, 2, 4, 8};
  static const int tps[] = {1, 2, 3, 4, 8, 16};
  static const int cps[] = {1, 2, 4};
  static const int pps[] = {1, 2};
  int checked = 0, fits_checked = 0, misfit_cases = 0;
  for (size_t a = 0; a < sizeof node_counts / sizeof *node_counts; a++)
    for (size_t b = 0; b < sizeof gpn_counts / sizeof *gpn_counts; b++)
      for (size_t c = 0; c < sizeof tps / sizeof *tps; c++)
        for (size_t d = 0; d < sizeof cps / sizeof *cps; d++)
          for (size_t e = 0; e < sizeof pps / sizeof *pps; e++) {
            int N = node_counts[a], G = gpn_counts[b], tp = tps[c], cp = cps[d],
                pp = pps[e];
            int world = N * G;
            if (world % (tp * cp * pp) != 0) continue;
            int dp = world / (tp * cp * pp);
            char dims[128];
            snprintf(dims, sizeof dims, "pp=%d,dp=%d,cp=%d,tp=%d", pp, dp, cp, tp);
            mpg_mesh *m = make_mesh(dims, "cp_tp", "cp,tp");
            int s_tp = find_set(m, "tp"), s_cp = find_set(m, "cp"),
                s_cptp = find_set(m, "cp_tp");
            for (int ord = 0; ord < 2; ord++) {
              mpg_rank_order order = ord ? MPG_RANK_ORDER_CYCLIC : MPG_RANK_ORDER_BLOCK;
              mpg_placement *pl = place(m, N, G, order);
              check_consistent(pl, world, N, G, order);
              cr_assert_eq(mpg_placement_num_nodes(pl), N);
              int tp_span = max_span(pl, m, s_tp);
              int cp_span = max_span(pl, m, s_cp);
              if (G % tp == 0) {
                cr_assert_eq(tp_span, 1, "%s on %d x %d (%s): a tp group crosses nodes",
                             dims, N, G, ord ? "cyclic" : "block");
                fits_checked++;
              }
              if (tp % G == 0)
                cr_assert_eq(tp_span, tp / G, "%s on %d x %d: tp spans %d nodes", dims,
                             N, G, tp_span);
              if (G % (tp * cp) == 0) {
                cr_assert_eq(cp_span, 1, "%s on %d x %d (%s): a cp group crosses nodes",
                             dims, N, G, ord ? "cyclic" : "block");
                cr_assert_eq(max_span(pl, m, s_cptp), 1);
              }
              /* Misfits are exactly the crossing inner groups. */
              int misfits = -1;
              cr_assert_eq(mpg_placement_check(pl, 0, &misfits), MPG_OK);
              int expect_misfit = tp_span > 1 || cp_span > 1 ||
                                  max_span(pl, m, s_cptp) > 1;
              cr_assert_eq(misfits > 0, expect_misfit, "%s on %d x %d: %d misfits",
                           dims, N, G, misfits);
              if (expect_misfit) {
                misfit_cases++;
                cr_assert_eq(mpg_placement_check(pl, 1, NULL), MPG_ERR_TOPO);
              }
              mpg_placement_destroy(pl);
              checked++;
            }
            mpg_mesh_destroy(m);
          }
  cr_assert_gt(checked, 200, "only %d layouts checked", checked);
  cr_assert_gt(fits_checked, 100);
  cr_assert_gt(misfit_cases, 10);
}

Test(placement, block_numbering_keeps_the_identity) {
  /* With block numbering and tp innermost, mesh rank == launcher rank. */
  mpg_mesh *m = make_mesh("dp=4,cp=2,tp=4", NULL, NULL);
  mpg_placement *pl = place(m, 4, 8, MPG_RANK_ORDER_BLOCK);
  expect_identity(pl, 32);
  mpg_placement_destroy(pl);
  mpg_mesh_destroy(m);
}

Test(placement, slurm_cyclic_is_undone) {
  /* 2 nodes x 4 GPUs, Slurm cyclic: launcher ranks 0,2,4,6 on node 0.
   * tp=4 groups must be {launcher 0,2,4,6} and {1,3,5,7}. */
  mpg_mesh *m = make_mesh("dp=2,tp=4", NULL, NULL);
  mpg_placement *pl = place(m, 2, 4, MPG_RANK_ORDER_CYCLIC);
  int s_tp = find_set(m, "tp");
  for (int g = 0; g < 2; g++) {
    int members[4];
    mpg_mesh_group_members(m, s_tp, g, members);
    for (int i = 0; i < 4; i++) {
      int L, node, gpu;
      mpg_placement_of(pl, members[i], &L, &node, &gpu);
      cr_assert_eq(node, g);
      cr_assert_eq(gpu, i);
      cr_assert_eq(L, 2 * i + g);
    }
  }
  mpg_placement_destroy(pl);
  mpg_mesh_destroy(m);
}

Test(placement, tp_by_name_even_when_not_innermost) {
  /* Mesh (tp, dp): tp is the outer dim, its groups have stride 4 in mesh
   * ranks.  Placement still keeps them on one node. */
  mpg_mesh *m = make_mesh("tp=4,dp=2", NULL, NULL);
  int s_tp = find_set(m, "tp"), s_dp = find_set(m, "dp");
  for (int ord = 0; ord < 2; ord++) {
    mpg_placement *pl = place(m, 2, 4, ord ? MPG_RANK_ORDER_CYCLIC : MPG_RANK_ORDER_BLOCK);
    cr_assert_eq(max_span(pl, m, s_tp), 1);
    cr_assert_eq(max_span(pl, m, s_dp), 2);
    cr_assert_eq(mpg_placement_dimset_is_inner(pl, s_tp), 1);
    cr_assert_eq(mpg_placement_dimset_is_inner(pl, s_dp), 0);
    mpg_placement_destroy(pl);
  }
  /* With no inner dims, the plain mesh order: tp groups cross. */
  mpg_placement_opts o = MPG_PLACEMENT_OPTS_INIT;
  o.topology.nodes = 2;
  o.inner_dims = "";
  mpg_placement *pl = NULL;
  cr_assert_eq(mpg_placement_create(m, &o, &pl), MPG_OK);
  cr_assert_eq(max_span(pl, m, s_tp), 2);
  int misfits = -1;
  cr_assert_eq(mpg_placement_check(pl, 1, &misfits), MPG_OK);
  cr_assert_eq(misfits, 0);
  mpg_placement_destroy(pl);
  /* Unknown names in an explicit list are errors. */
  o.inner_dims = "tp,ep";
  cr_assert_eq(mpg_placement_create(m, &o, &pl), MPG_ERR_NOT_FOUND);
  cr_assert_null(pl);
  cr_assert(strstr(mpg_last_error(), "\"ep\""), "%s", mpg_last_error());
  mpg_mesh_destroy(m);
}

Test(placement, misfit_reported_and_strict_fails) {
  /* tp=3 on nodes of 8: 8 tp groups, 2 of them must straddle nodes. */
  mpg_mesh *m = make_mesh("dp=8,tp=3", NULL, NULL);
  mpg_placement *pl = place(m, 3, 8, MPG_RANK_ORDER_BLOCK);
  int misfits = 0;
  cr_assert_eq(mpg_placement_check(pl, 0, &misfits), MPG_OK);
  cr_assert_eq(misfits, 2);
  cr_assert_eq(mpg_placement_check(pl, 1, &misfits), MPG_ERR_TOPO);
  cr_assert_eq(misfits, 2);
  const char *e = mpg_last_error();
  cr_assert(strstr(e, "2 of 8 \"tp\" groups (size 3)"), "%s", e);
  cr_assert(strstr(e, "8 ranks per node"), "%s", e);
  cr_assert(strstr(e, "group 2 (mesh ranks 6,7,8) spans 2 nodes: 0,1"), "%s", e);
  mpg_placement_destroy(pl);

  mpg_placement_opts o = MPG_PLACEMENT_OPTS_INIT;
  o.topology.nodes = 3;
  o.topology.gpus_per_node = 8;
  o.topology.strict = 1;
  pl = (mpg_placement *)1;
  cr_assert_eq(mpg_placement_create(m, &o, &pl), MPG_ERR_TOPO);
  cr_assert_null(pl);
  mpg_mesh_destroy(m);

  /* tp larger than a node: every group crosses. */
  m = make_mesh("dp=2,tp=16", NULL, NULL);
  pl = place(m, 4, 8, MPG_RANK_ORDER_CYCLIC);
  cr_assert_eq(mpg_placement_check(pl, 0, &misfits), MPG_OK);
  cr_assert_eq(misfits, 2);
  cr_assert_eq(mpg_placement_check(pl, 1, NULL), MPG_ERR_TOPO);
  cr_assert(strstr(mpg_last_error(), "larger than a node"), "%s", mpg_last_error());
  mpg_placement_destroy(pl);
  mpg_mesh_destroy(m);
}

Test(placement, cp_crosses_when_tp_takes_the_node) {
  /* tp=8 fills each node of 8, so cp=2 must cross: a misfit of cp only. */
  mpg_mesh *m = make_mesh("dp=2,cp=2,tp=8", NULL, NULL);
  mpg_placement *pl = place(m, 4, 8, MPG_RANK_ORDER_CYCLIC);
  cr_assert_eq(max_span(pl, m, find_set(m, "tp")), 1);
  cr_assert_eq(max_span(pl, m, find_set(m, "cp")), 2);
  int misfits;
  cr_assert_eq(mpg_placement_check(pl, 1, &misfits), MPG_ERR_TOPO);
  cr_assert_eq(misfits, 16);
  cr_assert(strstr(mpg_last_error(), "\"cp\""), "%s", mpg_last_error());
  mpg_placement_destroy(pl);
  mpg_mesh_destroy(m);
}

Test(placement, measured_host_ids_any_numbering) {
  /* 4 nodes x 4 ranks whose launcher numbering is a scramble. */
  enum { W = 16 };
  const char *hosts[4] = {"n0:b", "n1:b", "n2:b", "n3:b"};
  const char *ids[W];
  int perm[W];
  for (int i = 0; i < W; i++) perm[i] = i;
  unsigned x = 12345;
  for (int i = W - 1; i > 0; i--) {
    x = x * 1103515245u + 12345u;
    int j = (int)((x >> 8) % (unsigned)(i + 1));
    int t = perm[i];
    perm[i] = perm[j];
    perm[j] = t;
  }
  for (int r = 0; r < W; r++) ids[r] = hosts[perm[r] / 4];
  int node_of[W], local[W], n;
  cr_assert_eq(mpg_topo_node_ids(W, ids, node_of, local, &n), MPG_OK);
  cr_assert_eq(n, 4);
  mpg_mesh *m = make_mesh("dp=2,cp=2,tp=4", "cp_tp", "cp,tp");
  mpg_placement_opts o = MPG_PLACEMENT_OPTS_INIT;
  o.node_of = node_of;
  o.local_rank = local;
  mpg_placement *pl = NULL;
  cr_assert_eq(mpg_placement_create(m, &o, &pl), MPG_OK, "%s", mpg_last_error());
  cr_assert_eq(mpg_placement_num_nodes(pl), 4);
  cr_assert_eq(max_span(pl, m, find_set(m, "tp")), 1);
  cr_assert_eq(max_span(pl, m, find_set(m, "cp")), 2);
  for (int mr = 0; mr < W; mr++) {
    int L, node, gpu;
    mpg_placement_of(pl, mr, &L, &node, &gpu);
    cr_assert_eq(node, node_of[L]);
    cr_assert_eq(gpu, local[L]);
  }
  mpg_placement_destroy(pl);
  /* Without local ranks: the order of the ranks on their node. */
  o.local_rank = NULL;
  cr_assert_eq(mpg_placement_create(m, &o, &pl), MPG_OK);
  cr_assert_eq(max_span(pl, m, find_set(m, "tp")), 1);
  mpg_placement_destroy(pl);
  /* Bad local ranks. */
  local[3] = local[3] == 0 ? 1 : 0; /* now repeated on its node */
  o.local_rank = local;
  cr_assert_eq(mpg_placement_create(m, &o, &pl), MPG_ERR_RANGE);
  cr_assert(strstr(mpg_last_error(), "appears twice"), "%s", mpg_last_error());
  local[3] = 9;
  cr_assert_eq(mpg_placement_create(m, &o, &pl), MPG_ERR_RANGE);
  mpg_mesh_destroy(m);
}

Test(placement, uneven_measured_nodes) {
  /* 12 ranks on nodes of 8 and 4: tp=4 still fits everywhere. */
  int node_of[12];
  for (int r = 0; r < 12; r++) node_of[r] = r < 8 ? 0 : 1;
  mpg_mesh *m = make_mesh("dp=3,tp=4", NULL, NULL);
  mpg_placement_opts o = MPG_PLACEMENT_OPTS_INIT;
  o.node_of = node_of;
  mpg_placement *pl = NULL;
  cr_assert_eq(mpg_placement_create(m, &o, &pl), MPG_OK, "%s", mpg_last_error());
  cr_assert_eq(max_span(pl, m, find_set(m, "tp")), 1);
  mpg_placement_destroy(pl);
  mpg_mesh_destroy(m);
}

Test(placement, gpu_locality_inside_a_node_without_fabric) {
  const char *data = getenv("MESHPG_TEST_DATA");
  char path[1024];
  snprintf(path, sizeof path, "%s/topologies/pcie-interleaved.xml", data);
  mpg_topo *t = NULL;
  cr_assert_eq(mpg_topo_load_xml(path, &t), MPG_OK, "%s", mpg_last_error());
  /* CUDA numbers the GPUs NUMA 0,1,0,1: tp=2 must take GPUs {0,2} and
   * {1,3}, each pair on one NUMA node. */
  mpg_mesh *m = make_mesh("dp=4,tp=2", NULL, NULL);
  mpg_placement_opts o = MPG_PLACEMENT_OPTS_INIT;
  o.topo = t;
  mpg_placement *pl = NULL;
  cr_assert_eq(mpg_placement_create(m, &o, &pl), MPG_OK, "%s", mpg_last_error());
  cr_assert_eq(mpg_placement_num_nodes(pl), 2, "8 ranks / 4 GPUs per node");
  int s_tp = find_set(m, "tp");
  for (int g = 0; g < 4; g++) {
    int members[2], numa[2], node[2];
    mpg_mesh_group_members(m, s_tp, g, members);
    for (int i = 0; i < 2; i++) {
      int gpu;
      mpg_placement_of(pl, members[i], NULL, &node[i], &gpu);
      mpg_gpu_info gi = MPG_GPU_INFO_INIT;
      mpg_topo_get_gpu(t, gpu, &gi);
      numa[i] = gi.numa_node;
    }
    cr_assert_eq(node[0], node[1]);
    cr_assert_eq(numa[0], numa[1], "tp group %d spans NUMA nodes", g);
  }
  mpg_placement_destroy(pl);
  /* The DGX has an all-to-all fabric: GPUs keep their plain order. */
  snprintf(path, sizeof path, "%s/topologies/dgx-h100.xml", data);
  mpg_topo *dgx = NULL;
  cr_assert_eq(mpg_topo_load_xml(path, &dgx), MPG_OK);
  mpg_mesh *m8 = make_mesh("dp=2,tp=8", NULL, NULL);
  o.topo = dgx;
  cr_assert_eq(mpg_placement_create(m8, &o, &pl), MPG_OK);
  expect_identity(pl, 16);
  mpg_placement_destroy(pl);
  mpg_mesh_destroy(m8);
  mpg_mesh_destroy(m);
  mpg_topo_destroy(dgx);
  mpg_topo_destroy(t);
}

Test(placement, layout_errors) {
  mpg_mesh *m = make_mesh("dp=4,tp=6", NULL, NULL);
  mpg_placement_opts o = MPG_PLACEMENT_OPTS_INIT;
  mpg_placement *pl = NULL;
  o.topology.nodes = 4;
  o.topology.gpus_per_node = 8;
  cr_assert_eq(mpg_placement_create(m, &o, &pl), MPG_ERR_TOPO);
  cr_assert(strstr(mpg_last_error(), "world size 24 does not equal nodes 4 x "
                                     "gpus_per_node 8 = 32"),
            "%s", mpg_last_error());
  o.topology.nodes = 0;
  o.topology.gpus_per_node = 5;
  cr_assert_eq(mpg_placement_create(m, &o, &pl), MPG_ERR_TOPO);
  cr_assert(strstr(mpg_last_error(), "not a multiple of gpus_per_node 5"), "%s",
            mpg_last_error());
  o.topology.gpus_per_node = 0;
  o.topology.nodes = 5;
  cr_assert_eq(mpg_placement_create(m, &o, &pl), MPG_ERR_TOPO);
  o.topology.nodes = -1;
  cr_assert_eq(mpg_placement_create(m, &o, &pl), MPG_ERR_RANGE);
  o.topology.nodes = 3; /* 3 x 8 */
  cr_assert_eq(mpg_placement_create(m, &o, &pl), MPG_OK);
  mpg_placement_destroy(pl);
  mpg_placement_opts junk;
  memset(&junk, 0, sizeof junk);
  cr_assert_eq(mpg_placement_create(m, &junk, &pl), MPG_ERR_INVALID);
  cr_assert_eq(mpg_placement_create(NULL, &o, &pl), MPG_ERR_INVALID);
  cr_assert_eq(mpg_placement_create(m, &o, NULL), MPG_ERR_INVALID);
  /* NULL opts: one node holding the world. */
  cr_assert_eq(mpg_placement_create(m, NULL, &pl), MPG_OK);
  cr_assert_eq(mpg_placement_num_nodes(pl), 1);
  int L;
  cr_assert_eq(mpg_placement_of(pl, 24, &L, NULL, NULL), MPG_ERR_RANGE);
  cr_assert_eq(mpg_placement_mesh_rank(pl, -1, &L), MPG_ERR_RANGE);
  int n;
  cr_assert_eq(mpg_placement_group_nodes(pl, 99, 0, &n), MPG_ERR_RANGE);
  cr_assert_eq(mpg_placement_group_nodes(pl, 0, 99, &n), MPG_ERR_RANGE);
  mpg_placement_destroy(pl);
  mpg_placement_destroy(NULL);
  int bad_nodes[24] = {0};
  bad_nodes[5] = -2;
  o = (mpg_placement_opts)MPG_PLACEMENT_OPTS_INIT;
  o.node_of = bad_nodes;
  cr_assert_eq(mpg_placement_create(m, &o, &pl), MPG_ERR_RANGE);
  cr_assert(strstr(mpg_last_error(), "launcher rank 5"), "%s", mpg_last_error());
  mpg_mesh_destroy(m);
}

Test(placement, opts_hold_the_specs_topology) {
  mpg_spec spec = MPG_SPEC_INIT;
  mpg_spec_init(&spec);
  cr_assert_eq(mpg_spec_load_string("[mesh]\n"
                                    "dims = [ { name = \"dp\", size = -1 }, "
                                    "{ name = \"tp\", size = 4 } ]\n"
                                    "[topology]\n"
                                    "nodes = 2\n"
                                    "gpus_per_node = 4\n"
                                    "rank_order = \"cyclic\"\n"
                                    "strict = true\n",
                                    "t.toml", &spec),
               MPG_OK, "%s", mpg_last_error());
  mpg_placement_opts o = MPG_PLACEMENT_OPTS_INIT;
  o.topology = spec.topology;
  cr_assert_eq(o.topology.nodes, 2);
  cr_assert_eq(o.topology.gpus_per_node, 4);
  cr_assert_eq(o.topology.rank_order, MPG_RANK_ORDER_CYCLIC);
  cr_assert_eq(o.topology.strict, 1);
  cr_assert_eq(o.magic, MPG_PLACEMENT_MAGIC);
  mpg_mesh *m = NULL;
  cr_assert_eq(mpg_mesh_create(&spec, 8, &m), MPG_OK);
  mpg_placement *pl = NULL;
  cr_assert_eq(mpg_placement_create(m, &o, &pl), MPG_OK, "%s", mpg_last_error());
  check_consistent(pl, 8, 2, 4, MPG_RANK_ORDER_CYCLIC);
  mpg_placement_destroy(pl);
  mpg_mesh_destroy(m);
}
