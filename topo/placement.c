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

/* Measured node ids remapped to 0..K-1 in ascending id order into node_of; K in *nnodes. */
static mpg_status dense_node_ids(const int *node_ids, int world, int *node_of, int *nnodes) {
  int max_id = -1;
  for (int r = 0; r < world; r++) {
    if (node_ids[r] < 0 || node_ids[r] >= world)
      return mpg__fail(MPG_ERR_RANGE,
                       "placement: node id %d of launcher rank %d is "
                       "outside 0..%d",
                       node_ids[r], r, world - 1);
    if (node_ids[r] > max_id) max_id = node_ids[r];
  }
  int *dense = malloc(sizeof(int) * (size_t)(max_id + 1));
  if (!dense) return mpg__fail(MPG_ERR_NOMEM, "placement: out of memory");
  for (int id = 0; id <= max_id; id++) dense[id] = -1;
  for (int r = 0; r < world; r++) dense[node_ids[r]] = 0;
  int ndense = 0;
  for (int id = 0; id <= max_id; id++)
    if (dense[id] == 0) dense[id] = ndense++;
  for (int r = 0; r < world; r++) node_of[r] = dense[node_ids[r]];
  *nnodes = ndense;
  free(dense);
  return MPG_OK;
}

/* Measured local ranks into local_of: each node's must be 0..count-1, each once. */
static mpg_status check_local_ranks(const int *local_rank, int world, const int *node_of,
                                    int nnodes, const int *count, int *local_of) {
  mpg_status st = MPG_OK;
  unsigned char *seen = calloc((size_t)world, 1);
  int *start = calloc((size_t)nnodes + 1, sizeof(int));
  if (!seen || !start) st = mpg__fail(MPG_ERR_NOMEM, "placement: out of memory");
  for (int i = 0; !st && i < nnodes; i++) start[i + 1] = start[i] + count[i];
  for (int r = 0; !st && r < world; r++) {
    int node = node_of[r], local = local_rank[r];
    if (local < 0 || local >= count[node])
      st = mpg__fail(MPG_ERR_RANGE,
                     "placement: local rank %d of launcher rank %d is "
                     "outside 0..%d (its node has %d ranks)",
                     local, r, count[node] - 1, count[node]);
    else if (seen[start[node] + local])
      st = mpg__fail(MPG_ERR_RANGE,
                     "placement: local rank %d appears twice on the node "
                     "of launcher rank %d",
                     local, r);
    else {
      seen[start[node] + local] = 1;
      local_of[r] = local;
    }
  }
  free(seen);
  free(start);
  return st;
}

/* node_of/local_of from the launcher's measured node ids (and local ranks, if given). */
static mpg_status layout_measured(const mpg_placement_opts *opts, int world, int *node_of,
                                  int *local_of, int *nnodes) {
  mpg_status st = dense_node_ids(opts->node_of, world, node_of, nnodes);
  if (st) return st;
  int *count = calloc((size_t)world, sizeof(int));
  if (!count) return mpg__fail(MPG_ERR_NOMEM, "placement: out of memory");
  if (opts->local_rank) {
    for (int r = 0; r < world; r++) count[node_of[r]]++;
    st = check_local_ranks(opts->local_rank, world, node_of, *nnodes, count, local_of);
  } else {
    for (int r = 0; r < world; r++) local_of[r] = count[node_of[r]]++;
  }
  free(count);
  return st;
}

/* Nodes and GPUs per node: as given, or inferred from the other, the topology or the world. */
static mpg_status node_shape(const mpg_placement_opts *opts, int world, const mpg_topo *topo,
                             int *nodes_out, int *gpus_out) {
  int nodes = opts->topology.nodes, gpus = opts->topology.gpus_per_node;
  if (nodes < 0 || gpus < 0)
    return mpg__fail(MPG_ERR_RANGE,
                     "placement: nodes (%d) and gpus_per_node (%d) must be >= 0",
                     nodes, gpus);
  if (nodes == 0 && gpus == 0) {
    int topo_gpus = mpg_topo_num_gpus(topo);
    nodes = 1;
    gpus = (topo_gpus > 0 && world % topo_gpus == 0) ? topo_gpus : world;
    if (gpus != world) nodes = world / gpus;
  } else if (nodes == 0) {
    if (world % gpus != 0)
      return mpg__fail(MPG_ERR_TOPO,
                       "placement: world size %d is not a multiple of "
                       "gpus_per_node %d",
                       world, gpus);
    nodes = world / gpus;
  } else if (gpus == 0) {
    if (world % nodes != 0)
      return mpg__fail(MPG_ERR_TOPO,
                       "placement: world size %d is not a multiple of nodes %d",
                       world, nodes);
    gpus = world / nodes;
  }
  if ((long long)nodes * gpus != world)
    return mpg__fail(MPG_ERR_TOPO,
                     "placement: world size %d does not equal nodes %d x "
                     "gpus_per_node %d = %lld",
                     world, nodes, gpus, (long long)nodes * gpus);
  *nodes_out = nodes;
  *gpus_out = gpus;
  return MPG_OK;
}

/* Fill node_of/local_of for every launcher rank.  Returns the node count in
 * *nnodes. */
static mpg_status layout_launcher(const mpg_placement_opts *opts, int world,
                                  const mpg_topo *topo, int *node_of,
                                  int *local_of, int *nnodes) {
  if (opts->node_of) return layout_measured(opts, world, node_of, local_of, nnodes);
  int nodes = 0, gpus = 0;
  mpg_status st = node_shape(opts, world, topo, &nodes, &gpus);
  if (st) return st;
  for (int r = 0; r < world; r++) {
    if (opts->topology.rank_order == MPG_RANK_ORDER_CYCLIC) {
      node_of[r] = r % nodes;
      local_of[r] = r / nodes;
    } else {
      node_of[r] = r / gpus;
      local_of[r] = r % gpus;
    }
  }
  *nnodes = nodes;
  return MPG_OK;
}

/* The caller's opts (or the defaults) into *full, with a known rank order. */
static mpg_status read_opts(const mpg_placement_opts *opts, mpg_placement_opts *full) {
  if (opts) {
    mpg_status st = mpg__abi_in(full, MPG__ABI_END(mpg_placement_opts), opts, MPG_PLACEMENT_MAGIC,
                                "mpg_placement_create: opts", "MPG_PLACEMENT_OPTS_INIT");
    if (st) return st;
  }
  if (full->topology.rank_order != MPG_RANK_ORDER_BLOCK && full->topology.rank_order != MPG_RANK_ORDER_CYCLIC)
    return mpg__fail(MPG_ERR_INVALID, "placement: unknown rank order %d",
                     (int)full->topology.rank_order);
  return MPG_OK;
}

/* The launcher rank of each slot, node by node in locality order; sets max_per_node. */
static mpg_status fill_slots(mpg_placement *pl, const mpg_topo *topo, int *by_local,
                             int *slots) {
  /* Slots: node 0's GPUs, then node 1's ...; inside a node the GPUs go in
   * locality order unless the node has an all-to-all fabric. */
  int world = pl->world;
  int *start = calloc((size_t)pl->nnodes + 1, sizeof(int));
  int *order = malloc(sizeof(int) * (size_t)world);
  if (!start || !order) {
    free(start);
    free(order);
    return mpg__fail(MPG_ERR_NOMEM, "placement: out of memory");
  }
  for (int r = 0; r < world; r++) start[pl->node_of[r] + 1]++;
  for (int node = 0; node < pl->nnodes; node++) {
    int node_size = start[node + 1];
    if (node_size > pl->max_per_node) pl->max_per_node = node_size;
    start[node + 1] += start[node];
  }
  for (int r = 0; r < world; r++)
    by_local[start[pl->node_of[r]] + pl->local_of[r]] = r;
  int use_locality = topo && !mpg_topo_has_gpu_fabric(topo);
  for (int node = 0; node < pl->nnodes; node++) {
    int node_size = start[node + 1] - start[node];
    if (use_locality && node_size <= mpg_topo_num_gpus(topo))
      mpg__topo_locality_order(topo, node_size, order);
    else
      for (int k = 0; k < node_size; k++) order[k] = k;
    for (int k = 0; k < node_size; k++)
      slots[start[node] + k] = by_local[start[node] + order[k]];
  }
  free(start);
  free(order);
  return MPG_OK;
}

/* Physical dim order, outermost first: the others in mesh order, then inner, first-named last. */
static int physical_order(int ndims, const int *inner, int ninner, int *phys) {
  int nphys = 0;
  for (int d = 0; d < ndims; d++) {
    int is_inner = 0;
    for (int i = 0; i < ninner; i++)
      if (inner[i] == d) is_inner = 1;
    if (!is_inner) phys[nphys++] = d;
  }
  for (int i = ninner - 1; i >= 0; i--) phys[nphys++] = inner[i];
  return nphys;
}

/* launcher_of/mesh_of: each mesh rank takes the slot of its coordinate in physical order. */
static void map_ranks(mpg_placement *pl, const int *inner, int ninner, const int *slots) {
  int ndims = mpg_mesh_ndims(pl->mesh);
  int phys[MPG_MAX_DIMS], size[MPG_MAX_DIMS], coord[MPG_MAX_DIMS];
  int nphys = physical_order(ndims, inner, ninner, phys);
  for (int d = 0; d < ndims; d++) mpg_mesh_dim(pl->mesh, d, NULL, &size[d]);
  for (int mesh_rank = 0; mesh_rank < pl->world; mesh_rank++) {
    mpg_mesh_coord_of(pl->mesh, mesh_rank, coord);
    int slot = 0;
    for (int i = 0; i < nphys; i++) slot = slot * size[phys[i]] + coord[phys[i]];
    int launcher = slots[slot];
    pl->launcher_of[mesh_rank] = launcher;
    pl->mesh_of[launcher] = mesh_rank;
  }
}

/* A placement of a mesh with its four per-rank tables allocated, or NULL. */
static mpg_placement *placement_alloc(const mpg_mesh *mesh, int world) {
  mpg_placement *pl = calloc(1, sizeof *pl);
  if (!pl) return NULL;
  pl->mesh = mesh;
  pl->world = world;
  size_t bytes = sizeof(int) * (size_t)world;
  pl->launcher_of = malloc(bytes);
  pl->mesh_of = malloc(bytes);
  pl->node_of = malloc(bytes);
  pl->local_of = malloc(bytes);
  if (!pl->launcher_of || !pl->mesh_of || !pl->node_of || !pl->local_of) {
    mpg_placement_destroy(pl);
    return NULL;
  }
  return pl;
}

mpg_status mpg_placement_create(const mpg_mesh *mesh,
                                const mpg_placement_opts *opts,
                                mpg_placement **out) {
  if (!out) return mpg__fail(MPG_ERR_INVALID, "mpg_placement_create: out is NULL");
  *out = NULL;
  if (!mesh) return mpg__fail(MPG_ERR_INVALID, "mpg_placement_create: mesh is NULL");
  mpg_placement_opts full = MPG_PLACEMENT_OPTS_INIT;
  mpg_status st = read_opts(opts, &full);
  if (st) return st;
  int inner[MPG_MAX_DIMS], ninner = 0;
  unsigned inner_mask;
  /* The default names dims a mesh may lack; given names must exist. */
  st = mpg__mesh_parse_dims(
      mesh, full.inner_dims ? full.inner_dims : "tp,cp",
      full.inner_dims ? MPG__DIMS_ALLOW_EMPTY : MPG__DIMS_SKIP_UNKNOWN,
      "placement: inner dims", &inner_mask, inner, &ninner);
  if (st) return st;

  int world = mpg_mesh_world_size(mesh);
  mpg_placement *pl = placement_alloc(mesh, world);
  int *slots = malloc(sizeof(int) * (size_t)world);
  int *by_local = malloc(sizeof(int) * (size_t)world);
  if (!pl || !slots || !by_local) st = mpg__fail(MPG_ERR_NOMEM, "placement: out of memory");
  if (!st) st = layout_launcher(&full, world, full.topo, pl->node_of, pl->local_of, &pl->nnodes);
  if (!st) st = fill_slots(pl, full.topo, by_local, slots);
  if (!st) {
    pl->inner_mask = inner_mask;
    map_ranks(pl, inner, ninner, slots);
  }
  free(slots);
  free(by_local);
  if (!st) {
    mpg__log(1, "placement: %d ranks on %d nodes (up to %d per node)", world,
             pl->nnodes, pl->max_per_node);
    st = mpg_placement_check(pl, full.topology.strict, NULL);
  }
  if (st) {
    mpg_placement_destroy(pl);
    return st;
  }
  *out = pl;
  return MPG_OK;
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
