/* Rank placement across nodes: which launcher process takes which mesh
 * coordinate, so that the inner dims' groups stay inside a node (and, on
 * nodes without an all-to-all GPU fabric, on one NUMA node / PCIe switch). */
#include "mesh_internal.h"
#include "topo_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct mpg_placement {
  const mpg_mesh *mesh;
  int world;
  int nnodes;
  int max_per_node;
  int *launcher_of; /* mesh rank -> launcher rank */
  int *mesh_of;     /* launcher rank -> mesh rank */
  int *node_of;     /* launcher rank -> node */
  int *local_of;    /* launcher rank -> local rank (GPU) */
  unsigned inner_mask;
};

mpg_status mpg_placement_destroy(mpg_placement *pl) {
  if (!pl) return MPG_OK;
  free(pl->launcher_of);
  free(pl->mesh_of);
  free(pl->node_of);
  free(pl->local_of);
  free(pl);
  return MPG_OK;
}

mpg_status mpg_placement_opts_from_spec(const mpg_spec *spec,
                                        mpg_placement_opts *opts) {
  /* The other fields are reset to their defaults, not read. */
  mpg_spec sp = MPG_SPEC_INIT;
  mpg_placement_opts o = MPG_PLACEMENT_OPTS_INIT, ignored = MPG_PLACEMENT_OPTS_INIT;
  mpg_status st = mpg__spec_opts_in(spec, &sp, opts, &ignored,
                                   MPG__ABI_END(mpg_placement_opts), MPG_PLACEMENT_MAGIC,
                                   "mpg_placement_opts_from_spec", "MPG_PLACEMENT_OPTS_INIT");
  if (st) return st;
  o.nodes = sp.nodes;
  o.gpus_per_node = sp.gpus_per_node;
  o.rank_order = sp.rank_order;
  o.strict = sp.strict_placement;
  mpg__abi_out(opts, &o, MPG__ABI_END(mpg_placement_opts));
  return MPG_OK;
}

/* Fill node_of/local_of for every launcher rank.  Returns the node count in
 * *nnodes. */
static mpg_status layout_launcher(const mpg_placement_opts *o, int world,
                                  const mpg_topo *topo, int *node_of,
                                  int *local_of, int *nnodes) {
  if (o->node_of) {
    /* Measured: remap the ids to 0..K-1 in ascending id order. */
    int maxid = -1;
    for (int r = 0; r < world; r++) {
      if (o->node_of[r] < 0 || o->node_of[r] >= world)
        return mpg__fail(MPG_ERR_RANGE,
                         "placement: node id %d of launcher rank %d is "
                         "outside 0..%d",
                         o->node_of[r], r, world - 1);
      if (o->node_of[r] > maxid) maxid = o->node_of[r];
    }
    int *dense = malloc(sizeof(int) * (size_t)(maxid + 1));
    int *count = calloc((size_t)world, sizeof(int));
    if (!dense || !count) {
      free(dense);
      free(count);
      return mpg__fail(MPG_ERR_NOMEM, "placement: out of memory");
    }
    for (int i = 0; i <= maxid; i++) dense[i] = -1;
    for (int r = 0; r < world; r++) dense[o->node_of[r]] = 0;
    int k = 0;
    for (int i = 0; i <= maxid; i++)
      if (dense[i] == 0) dense[i] = k++;
    for (int r = 0; r < world; r++) node_of[r] = dense[o->node_of[r]];
    *nnodes = k;
    mpg_status st = MPG_OK;
    if (o->local_rank) {
      /* Each node's local ranks must be 0..count-1, each once. */
      for (int r = 0; r < world; r++) count[node_of[r]]++;
      unsigned char *seen = calloc((size_t)world, 1);
      int *start = calloc((size_t)k + 1, sizeof(int));
      if (!seen || !start) st = mpg__fail(MPG_ERR_NOMEM, "placement: out of memory");
      for (int i = 0; !st && i < k; i++) start[i + 1] = start[i] + count[i];
      for (int r = 0; !st && r < world; r++) {
        int n = node_of[r], l = o->local_rank[r];
        if (l < 0 || l >= count[n])
          st = mpg__fail(MPG_ERR_RANGE,
                         "placement: local rank %d of launcher rank %d is "
                         "outside 0..%d (its node has %d ranks)",
                         l, r, count[n] - 1, count[n]);
        else if (seen[start[n] + l])
          st = mpg__fail(MPG_ERR_RANGE,
                         "placement: local rank %d appears twice on the node "
                         "of launcher rank %d",
                         l, r);
        else {
          seen[start[n] + l] = 1;
          local_of[r] = l;
        }
      }
      free(seen);
      free(start);
    } else {
      for (int r = 0; r < world; r++) local_of[r] = count[node_of[r]]++;
    }
    free(dense);
    free(count);
    return st;
  }
  int n = o->nodes, g = o->gpus_per_node;
  if (n < 0 || g < 0)
    return mpg__fail(MPG_ERR_RANGE,
                     "placement: nodes (%d) and gpus_per_node (%d) must be >= 0",
                     n, g);
  if (n == 0 && g == 0) {
    int tg = mpg_topo_num_gpus(topo);
    n = 1;
    g = (tg > 0 && world % tg == 0) ? tg : world;
    if (g != world) n = world / g;
  } else if (n == 0) {
    if (world % g != 0)
      return mpg__fail(MPG_ERR_TOPO,
                       "placement: world size %d is not a multiple of "
                       "gpus_per_node %d",
                       world, g);
    n = world / g;
  } else if (g == 0) {
    if (world % n != 0)
      return mpg__fail(MPG_ERR_TOPO,
                       "placement: world size %d is not a multiple of nodes %d",
                       world, n);
    g = world / n;
  }
  if ((long long)n * g != world)
    return mpg__fail(MPG_ERR_TOPO,
                     "placement: world size %d does not equal nodes %d x "
                     "gpus_per_node %d = %lld",
                     world, n, g, (long long)n * g);
  for (int r = 0; r < world; r++) {
    if (o->rank_order == MPG_RANK_ORDER_CYCLIC) {
      node_of[r] = r % n;
      local_of[r] = r / n;
    } else {
      node_of[r] = r / g;
      local_of[r] = r % g;
    }
  }
  *nnodes = n;
  return MPG_OK;
}

mpg_status mpg_placement_create(const mpg_mesh *mesh,
                                const mpg_placement_opts *opts,
                                mpg_placement **out) {
  if (!out) return mpg__fail(MPG_ERR_INVALID, "mpg_placement_create: out is NULL");
  *out = NULL;
  if (!mesh) return mpg__fail(MPG_ERR_INVALID, "mpg_placement_create: mesh is NULL");
  mpg_placement_opts full = MPG_PLACEMENT_OPTS_INIT;
  if (opts) {
    mpg_status bad = mpg__abi_in(&full, MPG__ABI_END(mpg_placement_opts), opts, MPG_PLACEMENT_MAGIC,
                                 "mpg_placement_create: opts", "MPG_PLACEMENT_OPTS_INIT");
    if (bad) return bad;
  }
  const mpg_placement_opts *o = &full;
  if (o->rank_order != MPG_RANK_ORDER_BLOCK && o->rank_order != MPG_RANK_ORDER_CYCLIC)
    return mpg__fail(MPG_ERR_INVALID, "placement: unknown rank order %d",
                     (int)o->rank_order);
  int ndims = mpg_mesh_ndims(mesh);
  int inner[MPG_MAX_DIMS], ninner = 0;
  unsigned inner_mask;
  /* The default names dims a mesh may lack; given names must exist. */
  mpg_status st = mpg__mesh_parse_dims(
      mesh, o->inner_dims ? o->inner_dims : "tp,cp",
      o->inner_dims ? MPG__DIMS_ALLOW_EMPTY : MPG__DIMS_SKIP_UNKNOWN,
      "placement: inner dims", &inner_mask, inner, &ninner);
  if (st) return st;

  int world = mpg_mesh_world_size(mesh);
  mpg_placement *pl = calloc(1, sizeof *pl);
  if (!pl) return mpg__fail(MPG_ERR_NOMEM, "placement: out of memory");
  pl->mesh = mesh;
  pl->world = world;
  size_t bytes = sizeof(int) * (size_t)world;
  pl->launcher_of = malloc(bytes);
  pl->mesh_of = malloc(bytes);
  pl->node_of = malloc(bytes);
  pl->local_of = malloc(bytes);
  int *slots = malloc(bytes), *byloc = malloc(bytes);
  int *start = NULL, *order = NULL;
  if (!pl->launcher_of || !pl->mesh_of || !pl->node_of || !pl->local_of ||
      !slots || !byloc) {
    st = mpg__fail(MPG_ERR_NOMEM, "placement: out of memory");
    goto fail;
  }
  st = layout_launcher(o, world, o->topo, pl->node_of, pl->local_of, &pl->nnodes);
  if (st) goto fail;

  /* Slots: node 0's GPUs, then node 1's ...; inside a node the GPUs go in
   * locality order unless the node has an all-to-all fabric. */
  start = calloc((size_t)pl->nnodes + 1, sizeof(int));
  order = malloc(bytes);
  if (!start || !order) {
    st = mpg__fail(MPG_ERR_NOMEM, "placement: out of memory");
    goto fail;
  }
  for (int r = 0; r < world; r++) start[pl->node_of[r] + 1]++;
  for (int n = 0; n < pl->nnodes; n++) {
    int c = start[n + 1];
    if (c > pl->max_per_node) pl->max_per_node = c;
    start[n + 1] += start[n];
  }
  for (int r = 0; r < world; r++)
    byloc[start[pl->node_of[r]] + pl->local_of[r]] = r;
  int use_locality = o->topo && !mpg_topo_has_gpu_fabric(o->topo);
  for (int n = 0; n < pl->nnodes; n++) {
    int c = start[n + 1] - start[n];
    if (use_locality && c <= mpg_topo_num_gpus(o->topo))
      mpg__topo_locality_order(o->topo, c, order);
    else
      for (int k = 0; k < c; k++) order[k] = k;
    for (int k = 0; k < c; k++) slots[start[n] + k] = byloc[start[n] + order[k]];
  }

  /* Physical dim order, outermost first: the other dims in mesh order, then
   * the inner dims with the first-named innermost. */
  int phys[MPG_MAX_DIMS], np = 0, size[MPG_MAX_DIMS];
  for (int d = 0; d < ndims; d++) {
    int is_inner = 0;
    for (int i = 0; i < ninner; i++)
      if (inner[i] == d) is_inner = 1;
    if (!is_inner) phys[np++] = d;
  }
  for (int i = ninner - 1; i >= 0; i--) phys[np++] = inner[i];
  pl->inner_mask = inner_mask;
  for (int d = 0; d < ndims; d++) mpg_mesh_dim(mesh, d, NULL, &size[d]);
  int coord[MPG_MAX_DIMS];
  for (int m = 0; m < world; m++) {
    mpg_mesh_coord_of(mesh, m, coord);
    int p = 0;
    for (int i = 0; i < np; i++) p = p * size[phys[i]] + coord[phys[i]];
    int L = slots[p];
    pl->launcher_of[m] = L;
    pl->mesh_of[L] = m;
  }
  free(slots);
  free(byloc);
  free(start);
  free(order);
  slots = byloc = start = order = NULL;
  mpg__log(1, "placement: %d ranks on %d nodes (up to %d per node)", world,
           pl->nnodes, pl->max_per_node);
  st = mpg_placement_check(pl, o->strict, NULL);
  if (st) goto fail;
  *out = pl;
  return MPG_OK;
fail:
  free(slots);
  free(byloc);
  free(start);
  free(order);
  mpg_placement_destroy(pl);
  return st;
}

int mpg_placement_num_nodes(const mpg_placement *pl) { return pl ? pl->nnodes : 0; }

mpg_status mpg_placement_of(const mpg_placement *pl, int mesh_rank,
                            int *launcher_rank, int *node, int *gpu) {
  if (!pl) return mpg__fail(MPG_ERR_INVALID, "mpg_placement_of: placement is NULL");
  if (mesh_rank < 0 || mesh_rank >= pl->world)
    return mpg__fail(MPG_ERR_RANGE, "mpg_placement_of: mesh rank %d is outside 0..%d",
                     mesh_rank, pl->world - 1);
  int L = pl->launcher_of[mesh_rank];
  if (launcher_rank) *launcher_rank = L;
  if (node) *node = pl->node_of[L];
  if (gpu) *gpu = pl->local_of[L];
  return MPG_OK;
}

mpg_status mpg_placement_mesh_rank(const mpg_placement *pl, int launcher_rank,
                                   int *mesh_rank) {
  if (!pl || !mesh_rank)
    return mpg__fail(MPG_ERR_INVALID, "mpg_placement_mesh_rank: NULL argument");
  if (launcher_rank < 0 || launcher_rank >= pl->world)
    return mpg__fail(MPG_ERR_RANGE,
                     "mpg_placement_mesh_rank: launcher rank %d is outside 0..%d",
                     launcher_rank, pl->world - 1);
  *mesh_rank = pl->mesh_of[launcher_rank];
  return MPG_OK;
}

int mpg_placement_dimset_is_inner(const mpg_placement *pl, int dimset) {
  if (!pl) return 0;
  const char *name;
  if (mpg_mesh_dimset_info(pl->mesh, dimset, &name, NULL, NULL) != MPG_OK) return 0;
  if (strcmp(name, "world") == 0) return 0;
  unsigned mask = mpg__mesh_dimset_mask(pl->mesh, dimset);
  return mask && (mask & ~pl->inner_mask) == 0;
}

/* Distinct nodes of a group; nodes[] gets them in first-seen order if not
 * NULL (room for group size).  members: scratch of group size. */
static int span(const mpg_placement *pl, const int *members, int gsize,
                int *stamp, int tag, int *nodes) {
  int n = 0;
  for (int i = 0; i < gsize; i++) {
    int node = pl->node_of[pl->launcher_of[members[i]]];
    if (stamp[node] != tag) {
      stamp[node] = tag;
      if (nodes) nodes[n] = node;
      n++;
    }
  }
  return n;
}

mpg_status mpg_placement_group_nodes(const mpg_placement *pl, int dimset,
                                     int group_index, int *num_nodes) {
  if (!pl || !num_nodes)
    return mpg__fail(MPG_ERR_INVALID, "mpg_placement_group_nodes: NULL argument");
  int gsize, ngroups;
  mpg_status st = mpg_mesh_dimset_info(pl->mesh, dimset, NULL, &gsize, &ngroups);
  if (st) return st;
  int *members = malloc(sizeof(int) * (size_t)gsize);
  int *stamp = calloc((size_t)pl->nnodes, sizeof(int));
  if (!members || !stamp) {
    free(members);
    free(stamp);
    return mpg__fail(MPG_ERR_NOMEM, "mpg_placement_group_nodes: out of memory");
  }
  st = mpg_mesh_group_members(pl->mesh, dimset, group_index, members);
  if (!st) *num_nodes = span(pl, members, gsize, stamp, 1, NULL);
  free(members);
  free(stamp);
  return st;
}

static void list_ints(char *buf, size_t cap, const int *v, int n) {
  size_t len = 0;
  buf[0] = '\0';
  for (int i = 0; i < n && len < cap; i++) {
    int w = snprintf(buf + len, cap - len, "%s%d", i ? "," : "", v[i]);
    if (w < 0 || (size_t)w >= cap - len) {
      if (cap > 4) strcpy(buf + cap - 4, "...");
      return;
    }
    len += (size_t)w;
  }
}

mpg_status mpg_placement_check(const mpg_placement *pl, int strict,
                               int *misfits) {
  if (!pl) return mpg__fail(MPG_ERR_INVALID, "mpg_placement_check: placement is NULL");
  int total = 0;
  mpg_status st = MPG_OK;
  int *members = malloc(sizeof(int) * (size_t)pl->world);
  int *nodes = malloc(sizeof(int) * (size_t)pl->world);
  int *stamp = calloc((size_t)pl->nnodes, sizeof(int));
  if (!members || !nodes || !stamp) {
    st = mpg__fail(MPG_ERR_NOMEM, "mpg_placement_check: out of memory");
    goto out;
  }
  int tag = 0;
  int nsets = mpg_mesh_num_dimsets(pl->mesh);
  for (int s = 0; s < nsets; s++) {
    if (!mpg_placement_dimset_is_inner(pl, s)) continue;
    const char *name;
    int gsize, ngroups;
    mpg_mesh_dimset_info(pl->mesh, s, &name, &gsize, &ngroups);
    int bad = 0, first = -1, first_n = 0;
    char first_nodes[96] = "", first_ranks[96] = "";
    for (int g = 0; g < ngroups; g++) {
      mpg_mesh_group_members(pl->mesh, s, g, members);
      int n = span(pl, members, gsize, stamp, ++tag, nodes);
      if (n > 1) {
        if (first < 0) {
          first = g;
          first_n = n;
          list_ints(first_nodes, sizeof first_nodes, nodes, n);
          list_ints(first_ranks, sizeof first_ranks, members, gsize);
        }
        bad++;
      }
    }
    if (!bad) continue;
    total += bad;
    const char *why = pl->max_per_node % gsize != 0
                          ? "its size does not divide the ranks per node"
                          : "an inner dim nearer the fabric took the node";
    if (gsize > pl->max_per_node) why = "it is larger than a node";
    if (strict && !st)
      st = mpg__fail(MPG_ERR_TOPO,
                     "placement (strict): %d of %d \"%s\" groups (size %d) "
                     "cross nodes with %d ranks per node (%s); group %d "
                     "(mesh ranks %s) spans %d nodes: %s",
                     bad, ngroups, name, gsize, pl->max_per_node, why, first,
                     first_ranks, first_n, first_nodes);
    else
      mpg__log(1,
               "warning: placement: %d of %d \"%s\" groups (size %d) cross "
               "nodes with %d ranks per node (%s); group %d (mesh ranks %s) "
               "spans nodes %s",
               bad, ngroups, name, gsize, pl->max_per_node, why, first,
               first_ranks, first_nodes);
  }
out:
  free(members);
  free(nodes);
  free(stamp);
  if (misfits) *misfits = total;
  return st;
}
