/* The generic layer of the groups module: contexts, groups, the public
 * collectives and work handles.  It checks arguments, turns size-1 groups
 * into local copies, applies the context's timeout and aborts the whole
 * context when a peer never arrives.  Backends (backend.h) only move data. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "mpg_config.h"

#define MAX_SETS (MPG_MAX_DIMS + MPG_MAX_FLATTEN + 1)

#define MAX_SELECT 64

struct mpg_group {
  mpg_ctx *ctx;
  int dimset;       /* named dim set, or -1 for groups made by dims/select */
  const char *name; /* the mesh's name, or extra_name */
  unsigned mask;    /* mesh dims of the group */
  int index, position, size;
  int nselect;      /* > 0: only these positions of the mask group */
  int select[MAX_SELECT];
  int created;      /* communicator made (or not needed) */
  int member;       /* extra groups: this rank belongs to it */
  mpg__comm *comm;  /* NULL for size-1 groups; the world comm for "world" */
  char extra_name[128];
  struct mpg_group *next; /* extra groups of the context */
};

struct mpg_ctx {
  const mpg_mesh *mesh;
  const struct mpg__backend_ops *ops;
  mpg_backend_kind kind;
  int rank, world, local_rank;
  int launcher_rank, num_nodes;
  mpg_binding binding;
  mpg__comm *launch_comm; /* the launcher-ordered world, kept when placement
                             renumbered the ranks (freed last) */
  double timeout_s;
  int lazy;
  atomic_int aborted; /* MPG_OK while healthy, else the reason; atomic so
                        that a watchdog thread may call mpg_ctx_abort */
  mpg__comm *world_comm;
  long setup_collectives;
  int nsets;
  mpg_group groups[MAX_SETS];
  mpg_group *extra; /* groups made by mpg_ctx_group_dims / _select */
  int sizes[MPG_MAX_DIMS], strides[MPG_MAX_DIMS], coord[MPG_MAX_DIMS];
};

struct mpg_work {
  mpg_group *group;
  mpg__req *req;
  double deadline;
  mpg_status status; /* a failure seen by mpg_work_test */
};

static const struct mpg__backend_ops *backend_ops(mpg_backend_kind kind) {
  switch (kind) {
    case MPG_BACKEND_THREAD:
      return &mpg__backend_thread;
    case MPG_BACKEND_MPI:
#if MPG_HAVE_MPI
      return &mpg__backend_mpi;
#else
      return NULL;
#endif
    case MPG_BACKEND_NCCL:
#if MPG_HAVE_NCCL
      return &mpg__backend_nccl;
#else
      return NULL;
#endif
  }
  return NULL;
}

static const char *backend_name(mpg_backend_kind kind) {
  return kind == MPG_BACKEND_THREAD ? "thread"
       : kind == MPG_BACKEND_MPI    ? "mpi"
       : kind == MPG_BACKEND_NCCL   ? "nccl" : "?";
}

/* ------------------------------------------------------------------ */
/* Context                                                             */
/* ------------------------------------------------------------------ */

/* Fill rank / world / local values: explicit options first, then the
 * launch environment. */
static mpg_status resolve_launch(const mpg_init_opts *o, mpg__world_args *a,
                                 mpg_launch *env) {
  mpg_status st = mpg_launch_from_env(env);
  if (st) return st;
  a->rank = o->rank >= 0 ? o->rank : env->rank;
  a->world_size = o->world_size > 0 ? o->world_size : env->world_size;
  a->local_rank = o->local_rank >= 0 ? o->local_rank
                : env->local_rank >= 0 ? env->local_rank : 0;
  a->local_world_size = o->local_world_size > 0 ? o->local_world_size
                      : env->local_world_size > 0 ? env->local_world_size : 1;
  /* An MPI process started without a launcher is a singleton world. */
  if (o->backend == MPG_BACKEND_MPI && a->rank < 0 && a->world_size < 0 &&
      !env->source[0]) {
    a->rank = 0;
    a->world_size = 1;
  }
  if (a->world_size <= 0)
    return mpg__fail(MPG_ERR_ENV,
                     "world size unknown: set WORLD_SIZE (torchrun), launch "
                     "with mpirun or srun, or pass opts.world_size");
  if (a->rank < 0)
    return mpg__fail(MPG_ERR_ENV,
                     "rank unknown: set RANK (torchrun), launch with mpirun "
                     "or srun, or pass opts.rank");
  if (a->rank >= a->world_size)
    return mpg__fail(MPG_ERR_ENV, "rank %d is outside the world of %d ranks",
                     a->rank, a->world_size);
  return MPG_OK;
}

static mpg_status create_group(mpg_ctx *ctx, mpg_group *g) {
  if (g->created) return MPG_OK;
  mpg_status st = MPG_OK;
  if (g->size == 1 && g->dimset >= 0) {
    g->comm = NULL;
  } else if (g->size == ctx->world && strcmp(g->name, "world") == 0) {
    g->comm = ctx->world_comm;
  } else {
    if (atomic_load(&ctx->aborted))
      return mpg__fail((mpg_status)atomic_load(&ctx->aborted), "group \"%s\": the context was aborted",
                       g->name);
    ctx->setup_collectives++;
    st = ctx->ops->split(ctx->world_comm, g->index, g->position, &g->comm);
    if (st == MPG_OK && !g->comm)
      st = mpg__fail(MPG_ERR_BACKEND,
                     "group \"%s\": split gave rank %d no communicator",
                     g->name, ctx->rank);
    if (st) return st;
  }
  g->created = 1;
  mpg__log(2, "rank %d: group %s #%d, position %d of %d", ctx->rank, g->name,
           g->index, g->position, g->size);
  return MPG_OK;
}

static void abort_all(mpg_ctx *ctx, mpg_status reason) {
  int healthy = MPG_OK;
  if (!atomic_compare_exchange_strong(&ctx->aborted, &healthy, (int)reason)) return;
  for (int s = 0; s < ctx->nsets; s++) {
    mpg_group *g = &ctx->groups[s];
    if (g->comm && g->comm != ctx->world_comm) ctx->ops->abort_comm(g->comm, reason);
  }
  for (mpg_group *g = ctx->extra; g; g = g->next)
    if (g->comm) ctx->ops->abort_comm(g->comm, reason);
  if (ctx->world_comm) ctx->ops->abort_comm(ctx->world_comm, reason);
  if (ctx->launch_comm) ctx->ops->abort_comm(ctx->launch_comm, reason);
  mpg__log(1, "rank %d: context aborted (%s)", ctx->rank, mpg_status_name(reason));
}

/* Run one operation on a communicator to completion within the timeout. */
static mpg_status run_on(mpg_ctx *ctx, mpg__comm *comm, const mpg__coll *c) {
  mpg__req *req = NULL;
  mpg_status st = ctx->ops->post(comm, c, &req);
  if (st) return st;
  st = ctx->ops->wait(req, mpg__now() + ctx->timeout_s);
  if (st) abort_all(ctx, st == MPG_ERR_TIMEOUT ? st : MPG_ERR_ABORTED);
  ctx->ops->req_free(req);
  return st;
}

/* Topology-aware placement: learn which ranks share a node from their host
 * identities, place the mesh so inner dims stay inside nodes, and renumber
 * the world by mesh rank (one split keyed by mesh rank). */
static mpg_status place(mpg_ctx *ctx, const mpg_init_opts *opts,
                        const mpg__world_args *a) {
  enum { ID_INTS = MPG_HOST_ID_MAX / 4 };
  int world = ctx->world;
  int32_t mine[ID_INTS];
  memset(mine, 0, sizeof mine);
  mpg_status st;
  if (opts->host_id) {
    if (strlen(opts->host_id) >= MPG_HOST_ID_MAX)
      return mpg__fail(MPG_ERR_INVALID, "opts.host_id is longer than %d chars",
                       MPG_HOST_ID_MAX - 1);
    memcpy(mine, opts->host_id, strlen(opts->host_id));
  } else if ((st = mpg_host_identity((char *)mine, sizeof mine))) {
    return st;
  }
  int32_t *all = malloc(sizeof(int32_t) * ID_INTS * (size_t)world);
  const char **ids = malloc(sizeof(char *) * (size_t)world);
  int *node_of = malloc(sizeof(int) * (size_t)world);
  int *local = malloc(sizeof(int) * (size_t)world);
  mpg_placement *pl = NULL;
  if (!all || !ids || !node_of || !local) {
    st = mpg__fail(MPG_ERR_NOMEM, "placement: out of memory for %d host ids", world);
    goto done;
  }
  mpg__coll gather = {MPG__ALL_GATHER, mine, all, ID_INTS, MPG_I32, MPG_OP_SUM,
                      1.0, 0, 0, NULL};
  ctx->setup_collectives++;
  if ((st = run_on(ctx, ctx->world_comm, &gather))) goto done;
  for (int r = 0; r < world; r++) {
    ids[r] = (const char *)(all + (size_t)r * ID_INTS);
    ((char *)(all + (size_t)(r + 1) * ID_INTS))[-1] = '\0';
  }
  if ((st = mpg_node_ids(world, ids, node_of, local, &ctx->num_nodes))) goto done;
  mpg_placement_opts po = MPG_PLACEMENT_OPTS_INIT;
  po.node_of = node_of;
  po.local_rank = local;
  po.strict = opts->strict_placement;
  if ((st = mpg_placement_create(ctx->mesh, &po, &pl))) goto done;
  int misfits = 0;
  if ((st = mpg_placement_check(pl, opts->strict_placement, &misfits))) goto done;
  int mesh_rank;
  if ((st = mpg_placement_mesh_rank(pl, a->rank, &mesh_rank))) goto done;
  mpg__log(1, "placement: launcher rank %d on node %d -> mesh rank %d (%d nodes, %d misfit groups)",
           a->rank, node_of[a->rank], mesh_rank, ctx->num_nodes, misfits);
  ctx->binding.local_rank = local[a->rank];
  if (mesh_rank != a->rank || ctx->num_nodes > 1) {
    mpg__comm *placed = NULL;
    ctx->setup_collectives++;
    st = ctx->ops->split(ctx->world_comm, 0, mesh_rank, &placed);
    if (st) goto done;
    ctx->launch_comm = ctx->world_comm;
    ctx->world_comm = placed;
  }
  ctx->rank = mesh_rank;
done:
  mpg_placement_destroy(pl);
  free(all);
  free(ids);
  free(node_of);
  free(local);
  return st;
}

/* Pin this rank near its GPU on the live machine. */
static mpg_status bind_rank(mpg_ctx *ctx, const mpg_init_opts *opts,
                            const mpg__world_args *a) {
  mpg_topo *topo = NULL;
  mpg_status st = mpg_topo_load_live(&topo);
  if (st) return st;
  int local = ctx->binding.local_rank, gpu = opts->device;
  if (ctx->kind == MPG_BACKEND_THREAD)
    st = mpg_topo_bind_thread(topo, local, a->local_world_size, gpu, opts->bind,
                              &ctx->binding);
  else
    st = mpg_topo_bind(topo, local, a->local_world_size, gpu, opts->bind,
                       &ctx->binding);
  mpg_topo_destroy(topo);
  if (!st)
    mpg__log(1, "rank %d: bound to cpus %s (numa %d, gpu %d)", ctx->rank,
             ctx->binding.cpuset, ctx->binding.numa_node, ctx->binding.gpu);
  return st;
}

mpg_status mpg_ctx_create(const mpg_mesh *mesh, const mpg_init_opts *opts,
                          mpg_ctx **out) {
  if (!out) return mpg__fail(MPG_ERR_INVALID, "mpg_ctx_create: out is NULL");
  *out = NULL;
  if (!mesh) return mpg__fail(MPG_ERR_INVALID, "mpg_ctx_create: mesh is NULL");
  mpg_init_opts defaults = MPG_INIT_OPTS_INIT;
  if (!opts) opts = &defaults;
  if (opts->magic != MPG_INIT_OPTS_MAGIC || opts->size < sizeof(mpg_init_opts))
    return mpg__fail(MPG_ERR_INVALID,
                     "mpg_ctx_create: opts was not initialised with "
                     "MPG_INIT_OPTS_INIT");
  const struct mpg__backend_ops *ops = backend_ops(opts->backend);
  if (!ops)
    return mpg__fail(MPG_ERR_UNSUPPORTED,
                     "backend \"%s\" is not built into this meshpg (configure "
                     "with -D%s=enabled)",
                     backend_name(opts->backend), backend_name(opts->backend));
  if (opts->backend == MPG_BACKEND_THREAD && !opts->thread_world)
    return mpg__fail(MPG_ERR_INVALID,
                     "the thread backend runs ranks started by mpg_thread_run "
                     "(opts.thread_world is NULL)");

  mpg__world_args a;
  memset(&a, 0, sizeof a);
  mpg_launch env;
  mpg_status st = resolve_launch(opts, &a, &env);
  if (st) return st;
  if (a.world_size != mpg_mesh_world_size(mesh))
    return mpg__fail(MPG_ERR_INVALID,
                     "the world has %d ranks (%s) but the mesh has %d",
                     a.world_size,
                     opts->world_size > 0 ? "from opts.world_size"
                     : env.source[0]      ? env.source : "from the environment",
                     mpg_mesh_world_size(mesh));
  a.timeout_s = opts->timeout_s > 0 ? opts->timeout_s : 600.0;
  a.device = opts->device;
  a.nccl_id = opts->nccl_id;
  a.master_addr = env.master_addr;
  a.master_port = env.master_port;
  a.mpi_comm = opts->mpi_comm;
  a.thread_world = opts->thread_world;

  mpg_ctx *ctx = calloc(1, sizeof *ctx);
  if (!ctx) return mpg__fail(MPG_ERR_NOMEM, "mpg_ctx_create: out of memory");
  ctx->mesh = mesh;
  ctx->ops = ops;
  ctx->kind = opts->backend;
  ctx->rank = a.rank;
  ctx->world = a.world_size;
  ctx->local_rank = a.local_rank;
  ctx->timeout_s = a.timeout_s;
  ctx->lazy = opts->lazy_groups;
  ctx->nsets = mpg_mesh_num_dimsets(mesh);
  ctx->launcher_rank = a.rank;
  ctx->num_nodes = 1;
  ctx->binding.local_rank = a.local_rank;
  ctx->binding.gpu = -1;
  ctx->binding.numa_node = -1;
  ctx->setup_collectives = 1;
  st = ops->world_init(&a, &ctx->world_comm);
  if (st) {
    free(ctx);
    return st;
  }
  mpg__log(1, "rank %d of %d: %s backend up", ctx->rank, ctx->world, ops->name);
  if (opts->placement) st = place(ctx, opts, &a);
  if (!st && opts->bind != MPG_BIND_NONE) st = bind_rank(ctx, opts, &a);
  if (st) {
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", mpg_last_error());
    mpg_ctx_destroy(ctx);
    return mpg__fail(st, "%s", msg);
  }
  int nd = mpg_mesh_ndims(mesh), stride = 1;
  for (int d = nd - 1; d >= 0; d--) {
    mpg_mesh_dim(mesh, d, NULL, &ctx->sizes[d]);
    ctx->strides[d] = stride;
    stride *= ctx->sizes[d];
  }
  mpg_mesh_coord_of(mesh, ctx->rank, ctx->coord);
  for (int s = 0; s < ctx->nsets; s++) {
    mpg_group *g = &ctx->groups[s];
    int dims[MPG_MAX_DIMS], n;
    g->ctx = ctx;
    g->dimset = s;
    mpg_mesh_dimset_info(mesh, s, &g->name, NULL, NULL);
    mpg_mesh_group_of(mesh, s, ctx->rank, &g->index, &g->position, &g->size);
    mpg_mesh_dimset_dims(mesh, s, dims, &n);
    for (int i = 0; i < n; i++) g->mask |= 1u << dims[i];
  }

  if (!ctx->lazy) {
    for (int s = 0; s < ctx->nsets && !st; s++) st = create_group(ctx, &ctx->groups[s]);
    if (st) {
      mpg_status keep = st;
      char msg[1024];
      snprintf(msg, sizeof msg, "%s", mpg_last_error());
      abort_all(ctx, st == MPG_ERR_TIMEOUT ? MPG_ERR_TIMEOUT : MPG_ERR_ABORTED);
      mpg_ctx_destroy(ctx);
      return mpg__fail(keep, "%s", msg);
    }
  }
  *out = ctx;
  return MPG_OK;
}

mpg_status mpg_ctx_destroy(mpg_ctx *ctx) {
  if (!ctx) return MPG_OK;
  mpg_status first = MPG_OK;
  char msg[1024] = "";
  for (int s = 0; s < ctx->nsets; s++) {
    mpg_group *g = &ctx->groups[s];
    if (g->comm && g->comm != ctx->world_comm) {
      mpg_status st = ctx->ops->destroy(g->comm);
      if (st && !first) {
        first = st;
        snprintf(msg, sizeof msg, "%s", mpg_last_error());
      }
    }
  }
  while (ctx->extra) {
    mpg_group *g = ctx->extra;
    ctx->extra = g->next;
    if (g->comm) {
      mpg_status st = ctx->ops->destroy(g->comm);
      if (st && !first) {
        first = st;
        snprintf(msg, sizeof msg, "%s", mpg_last_error());
      }
    }
    free(g);
  }
  mpg__comm *worlds[2] = {ctx->world_comm, ctx->launch_comm};
  for (int i = 0; i < 2; i++) {
    if (!worlds[i]) continue;
    mpg_status st = ctx->ops->destroy(worlds[i]);
    if (st && !first) {
      first = st;
      snprintf(msg, sizeof msg, "%s", mpg_last_error());
    }
  }
  free(ctx);
  return first ? mpg__fail(first, "%s", msg) : MPG_OK;
}

mpg_status mpg_ctx_abort(mpg_ctx *ctx) {
  if (!ctx) return mpg__fail(MPG_ERR_INVALID, "mpg_ctx_abort: ctx is NULL");
  abort_all(ctx, MPG_ERR_ABORTED);
  return MPG_OK;
}

int mpg_ctx_rank(const mpg_ctx *ctx) { return ctx ? ctx->rank : -1; }
int mpg_ctx_world_size(const mpg_ctx *ctx) { return ctx ? ctx->world : 0; }
mpg_status mpg_ctx_status(const mpg_ctx *ctx) {
  if (!ctx) return mpg__fail(MPG_ERR_INVALID, "mpg_ctx_status: ctx is NULL");
  return (mpg_status)atomic_load(&((mpg_ctx *)ctx)->aborted);
}
int mpg_ctx_launcher_rank(const mpg_ctx *ctx) { return ctx ? ctx->launcher_rank : -1; }
int mpg_ctx_num_nodes(const mpg_ctx *ctx) { return ctx ? ctx->num_nodes : 0; }
mpg_status mpg_ctx_binding(const mpg_ctx *ctx, mpg_binding *out) {
  if (!ctx || !out) return mpg__fail(MPG_ERR_INVALID, "mpg_ctx_binding: NULL argument");
  *out = ctx->binding;
  return MPG_OK;
}
int mpg_ctx_local_rank(const mpg_ctx *ctx) { return ctx ? ctx->local_rank : -1; }
mpg_backend_kind mpg_ctx_backend(const mpg_ctx *ctx) {
  return ctx ? ctx->kind : MPG_BACKEND_THREAD;
}
const mpg_mesh *mpg_ctx_mesh(const mpg_ctx *ctx) { return ctx ? ctx->mesh : NULL; }
long mpg_ctx_setup_collectives(const mpg_ctx *ctx) {
  return ctx ? ctx->setup_collectives : 0;
}

mpg_status mpg_ctx_group_at(mpg_ctx *ctx, int dimset, mpg_group **out) {
  if (!out) return mpg__fail(MPG_ERR_INVALID, "mpg_ctx_group_at: out is NULL");
  *out = NULL;
  if (!ctx) return mpg__fail(MPG_ERR_INVALID, "mpg_ctx_group_at: ctx is NULL");
  if (dimset < 0 || dimset >= ctx->nsets)
    return mpg__fail(MPG_ERR_RANGE, "mpg_ctx_group_at: dim set %d is outside 0..%d",
                     dimset, ctx->nsets - 1);
  mpg_group *g = &ctx->groups[dimset];
  mpg_status st = create_group(ctx, g);
  if (st) {
    if (st == MPG_ERR_TIMEOUT) abort_all(ctx, st);
    return st;
  }
  *out = g;
  return MPG_OK;
}

mpg_status mpg_ctx_group(mpg_ctx *ctx, const char *name, mpg_group **out) {
  if (!out) return mpg__fail(MPG_ERR_INVALID, "mpg_ctx_group: out is NULL");
  *out = NULL;
  if (!ctx || !name) return mpg__fail(MPG_ERR_INVALID, "mpg_ctx_group: NULL argument");
  int s;
  mpg_status st = mpg_mesh_dimset_find(ctx->mesh, name, &s);
  if (st) return st;
  return mpg_ctx_group_at(ctx, s, out);
}

const char *mpg_group_name(const mpg_group *g) { return g ? g->name : ""; }
int mpg_group_rank(const mpg_group *g) { return g ? g->position : -1; }
int mpg_group_size(const mpg_group *g) { return g ? g->size : 0; }
int mpg_group_index(const mpg_group *g) { return g ? g->index : -1; }

/* World rank at `position` (row-major over mask dims) of the mask group
 * containing this rank. */
static int mask_member(const mpg_ctx *ctx, unsigned mask, int position) {
  int nd = mpg_mesh_ndims(ctx->mesh), r = 0;
  for (int d = nd - 1; d >= 0; d--) {
    int c = ctx->coord[d];
    if (mask & (1u << d)) {
      c = position % ctx->sizes[d];
      position /= ctx->sizes[d];
    }
    r += c * ctx->strides[d];
  }
  return r;
}

mpg_status mpg_group_member(const mpg_group *g, int position, int *rank) {
  if (!g || !rank) return mpg__fail(MPG_ERR_INVALID, "mpg_group_member: NULL argument");
  if (position < 0 || position >= g->size)
    return mpg__fail(MPG_ERR_RANGE, "mpg_group_member: position %d in \"%s\" is outside 0..%d",
                     position, g->name, g->size - 1);
  *rank = mask_member(g->ctx, g->mask, g->nselect ? g->select[position] : position);
  return MPG_OK;
}

/* Parse "dp_cp,tp" into a mask of mesh dims. */
static mpg_status parse_dims(mpg_ctx *ctx, const char *names, unsigned *mask) {
  *mask = 0;
  const char *p = names;
  while (*p) {
    const char *e = strchr(p, ',');
    size_t n = e ? (size_t)(e - p) : strlen(p);
    char name[MPG_NAME_MAX];
    while (n && *p == ' ') p++, n--;
    while (n && p[n - 1] == ' ') n--;
    if (n == 0 || n >= sizeof name)
      return mpg__fail(MPG_ERR_INVALID, "group dims \"%s\": expected names like \"dp_cp,tp\"",
                       names);
    memcpy(name, p, n);
    name[n] = '\0';
    int s;
    mpg_status st = mpg_mesh_dimset_find(ctx->mesh, name, &s);
    if (st) return st;
    *mask |= ctx->groups[s].mask;
    p = e ? e + 1 : p + n;
  }
  if (!*mask && mpg_mesh_ndims(ctx->mesh) > 0)
    return mpg__fail(MPG_ERR_INVALID, "group dims \"%s\": no dims named", names);
  return MPG_OK;
}

/* Index (row-major over the dims outside mask) and position (inside). */
static void mask_place(const mpg_ctx *ctx, unsigned mask, int *index,
                       int *position, int *size) {
  int nd = mpg_mesh_ndims(ctx->mesh);
  *index = *position = 0;
  *size = 1;
  for (int d = 0; d < nd; d++) {
    if (mask & (1u << d)) {
      *position = *position * ctx->sizes[d] + ctx->coord[d];
      *size *= ctx->sizes[d];
    } else {
      *index = *index * ctx->sizes[d] + ctx->coord[d];
    }
  }
}

static mpg_group *find_extra(mpg_ctx *ctx, const char *key) {
  for (mpg_group *g = ctx->extra; g; g = g->next)
    if (strcmp(g->extra_name, key) == 0) return g;
  return NULL;
}

/* Make (collectively) and remember an extra group.  member == 0: this
 * rank enters the split without joining. */
static mpg_status make_extra(mpg_ctx *ctx, const char *key, unsigned mask,
                             const int *select, int nselect, mpg_group **out) {
  mpg_group *g = calloc(1, sizeof *g);
  if (!g) return mpg__fail(MPG_ERR_NOMEM, "group \"%s\": out of memory", key);
  g->ctx = ctx;
  g->dimset = -1;
  g->mask = mask;
  snprintf(g->extra_name, sizeof g->extra_name, "%s", key);
  g->name = g->extra_name;
  int base_pos, base_size;
  mask_place(ctx, mask, &g->index, &base_pos, &base_size);
  int member = 1;
  g->position = base_pos;
  g->size = base_size;
  if (nselect > 0) {
    member = 0;
    g->nselect = nselect;
    memcpy(g->select, select, sizeof(int) * (size_t)nselect);
    for (int i = 0; i < nselect; i++)
      if (select[i] == base_pos) member = 1, g->position = i;
    g->size = nselect;
  }
  mpg_status st = MPG_OK;
  if (atomic_load(&ctx->aborted)) {
    free(g);
    return mpg__fail((mpg_status)atomic_load(&ctx->aborted),
                     "group \"%s\": the context was aborted", key);
  }
  g->member = member;
  if (g->size > 1) {
    /* Non-members enter the split too: it is collective over the world. */
    ctx->setup_collectives++;
    st = ctx->ops->split(ctx->world_comm, member ? g->index : -1, g->position,
                         &g->comm);
  }
  if (st) {
    free(g);
    if (st == MPG_ERR_TIMEOUT) abort_all(ctx, st);
    return st;
  }
  g->created = 1;
  g->next = ctx->extra;
  ctx->extra = g;
  mpg__log(2, "rank %d: extra group %s #%d, position %d of %d%s", ctx->rank, key,
           g->index, g->position, g->size, member ? "" : " (not a member)");
  *out = member ? g : NULL;
  return MPG_OK;
}

mpg_status mpg_ctx_group_dims(mpg_ctx *ctx, const char *dims, mpg_group **out) {
  if (!out) return mpg__fail(MPG_ERR_INVALID, "mpg_ctx_group_dims: out is NULL");
  *out = NULL;
  if (!ctx || !dims) return mpg__fail(MPG_ERR_INVALID, "mpg_ctx_group_dims: NULL argument");
  unsigned mask;
  mpg_status st = parse_dims(ctx, dims, &mask);
  if (st) return st;
  /* A named dim set with the same dims is the same group. */
  for (int s = 0; s < ctx->nsets; s++)
    if (ctx->groups[s].mask == mask) return mpg_ctx_group_at(ctx, s, out);
  char key[128];
  size_t n = 0;
  key[0] = '\0';
  for (int d = 0; d < mpg_mesh_ndims(ctx->mesh); d++)
    if (mask & (1u << d)) {
      const char *dn;
      mpg_mesh_dim(ctx->mesh, d, &dn, NULL);
      if (n < sizeof key) n += (size_t)snprintf(key + n, sizeof key - n, "%s%s", n ? "+" : "", dn);
    }
  mpg_group *g = find_extra(ctx, key);
  if (g) {
    *out = g;
    return MPG_OK;
  }
  return make_extra(ctx, key, mask, NULL, 0, out);
}

mpg_status mpg_ctx_group_select(mpg_ctx *ctx, const char *name,
                                const int *positions, int npositions,
                                mpg_group **out) {
  if (!out) return mpg__fail(MPG_ERR_INVALID, "mpg_ctx_group_select: out is NULL");
  *out = NULL;
  if (!ctx || !name || !positions)
    return mpg__fail(MPG_ERR_INVALID, "mpg_ctx_group_select: NULL argument");
  unsigned mask;
  mpg_status st = parse_dims(ctx, name, &mask);
  if (st) return st;
  int idx, pos, size;
  mask_place(ctx, mask, &idx, &pos, &size);
  if (npositions < 1 || npositions > MAX_SELECT || npositions > size)
    return mpg__fail(MPG_ERR_RANGE,
                     "mpg_ctx_group_select \"%s\": expected 1 to %d positions, found %d",
                     name, size < MAX_SELECT ? size : MAX_SELECT, npositions);
  char key[128];
  size_t n = (size_t)snprintf(key, sizeof key, "%s[", name);
  for (int i = 0; i < npositions; i++) {
    if (positions[i] < 0 || positions[i] >= size)
      return mpg__fail(MPG_ERR_RANGE,
                       "mpg_ctx_group_select \"%s\": position %d is outside 0..%d",
                       name, positions[i], size - 1);
    for (int j = 0; j < i; j++)
      if (positions[j] >= positions[i])
        return mpg__fail(MPG_ERR_INVALID,
                         "mpg_ctx_group_select \"%s\": positions must be increasing, "
                         "found %d after %d", name, positions[i], positions[j]);
    if (n < sizeof key)
      n += (size_t)snprintf(key + n, sizeof key - n, "%s%d", i ? "," : "", positions[i]);
  }
  if (n < sizeof key) snprintf(key + n, sizeof key - n, "]");
  mpg_group *g = find_extra(ctx, key);
  if (g) {
    *out = g->member ? g : NULL;
    return MPG_OK;
  }
  return make_extra(ctx, key, mask, positions, npositions, out);
}

/* ------------------------------------------------------------------ */
/* Memory and streams                                                  */
/* ------------------------------------------------------------------ */

mpg_status mpg_ctx_mem_alloc(mpg_ctx *ctx, size_t bytes, int registered,
                             void **ptr) {
  if (!ctx || !ptr) return mpg__fail(MPG_ERR_INVALID, "mpg_ctx_mem_alloc: NULL argument");
  *ptr = NULL;
  if (ctx->ops->mem_alloc)
    return ctx->ops->mem_alloc(ctx->world_comm, bytes, registered, ptr);
  *ptr = calloc(1, bytes ? bytes : 1);
  if (!*ptr) return mpg__fail(MPG_ERR_NOMEM, "mpg_ctx_mem_alloc: %zu bytes", bytes);
  return MPG_OK;
}

mpg_status mpg_ctx_mem_free(mpg_ctx *ctx, void *ptr) {
  if (!ctx) return mpg__fail(MPG_ERR_INVALID, "mpg_ctx_mem_free: ctx is NULL");
  if (!ptr) return MPG_OK;
  if (ctx->ops->mem_free) return ctx->ops->mem_free(ctx->world_comm, ptr);
  free(ptr);
  return MPG_OK;
}

mpg_status mpg_ctx_mem_zero(mpg_ctx *ctx, void *ptr, size_t bytes, void *stream) {
  if (!ctx || (!ptr && bytes))
    return mpg__fail(MPG_ERR_INVALID, "mpg_ctx_mem_zero: NULL argument");
  if (ctx->ops->mem_zero) return ctx->ops->mem_zero(ptr, bytes, stream);
  if (bytes) memset(ptr, 0, bytes);
  return MPG_OK;
}

mpg_status mpg_ctx_stream_create(mpg_ctx *ctx, void **stream) {
  if (!ctx || !stream) return mpg__fail(MPG_ERR_INVALID, "mpg_ctx_stream_create: NULL argument");
  *stream = NULL;
  return ctx->ops->stream_create ? ctx->ops->stream_create(stream) : MPG_OK;
}

mpg_status mpg_ctx_stream_destroy(mpg_ctx *ctx, void *stream) {
  if (!ctx) return mpg__fail(MPG_ERR_INVALID, "mpg_ctx_stream_destroy: ctx is NULL");
  return ctx->ops->stream_destroy && stream ? ctx->ops->stream_destroy(stream) : MPG_OK;
}

mpg_status mpg_ctx_stream_order(mpg_ctx *ctx, void *waiter, void *waitee) {
  if (!ctx) return mpg__fail(MPG_ERR_INVALID, "mpg_ctx_stream_order: ctx is NULL");
  return ctx->ops->stream_order ? ctx->ops->stream_order(waiter, waitee) : MPG_OK;
}

/* ------------------------------------------------------------------ */
/* Collectives                                                         */
/* ------------------------------------------------------------------ */


static mpg_status check_coll(const mpg_group *g, const mpg__coll *c) {
  const char *fn = mpg__kind_name(c->kind);
  if (!g) return mpg__fail(MPG_ERR_INVALID, "mpg_%s: group is NULL", fn);
  if (c->kind == MPG__BARRIER) return MPG_OK;
  if ((unsigned)c->dtype >= MPG_DTYPE_COUNT)
    return mpg__fail(MPG_ERR_INVALID, "mpg_%s on \"%s\": unknown dtype %d", fn,
                     g->name, (int)c->dtype);
  int needs_send = c->kind == MPG__ALL_REDUCE || c->kind == MPG__ALL_GATHER ||
                   c->kind == MPG__REDUCE_SCATTER || c->kind == MPG__SEND;
  int needs_recv = c->kind != MPG__SEND;
  if (c->count > 0 && ((needs_send && !c->send) || (needs_recv && !c->recv)))
    return mpg__fail(MPG_ERR_INVALID, "mpg_%s on \"%s\": %s buffer is NULL for %zu elements",
                     fn, g->name, needs_send && !c->send ? "send" : "receive",
                     c->count);
  if (c->kind == MPG__ALL_REDUCE || c->kind == MPG__REDUCE_SCATTER) {
    if ((unsigned)c->op > MPG_OP_PREMUL_SUM)
      return mpg__fail(MPG_ERR_INVALID, "mpg_%s on \"%s\": unknown op %d", fn,
                       g->name, (int)c->op);
    if (c->op == MPG_OP_PREMUL_SUM && !mpg__dtype_is_float(c->dtype))
      return mpg__fail(MPG_ERR_INVALID,
                       "mpg_%s on \"%s\": a scaled sum needs a floating dtype, "
                       "found %s",
                       fn, g->name, mpg_dtype_name(c->dtype));
  }
  if (c->kind == MPG__BROADCAST && (c->root < 0 || c->root >= g->size))
    return mpg__fail(MPG_ERR_INVALID,
                     "mpg_broadcast on \"%s\": root %d is outside 0..%d", g->name,
                     c->root, g->size - 1);
  if (c->kind == MPG__SEND || c->kind == MPG__RECV) {
    if (c->peer < 0 || c->peer >= g->size || c->peer == g->position)
      return mpg__fail(MPG_ERR_INVALID,
                       "mpg_%s on \"%s\": peer %d is not another member "
                       "(positions 0..%d, this rank is %d)",
                       fn, g->name, c->peer, g->size - 1, g->position);
  }
  return MPG_OK;
}

/* Abort the context on a timeout and keep the message. */
static mpg_status on_failure(mpg_ctx *ctx, mpg_status st) {
  if (st == MPG_ERR_TIMEOUT || st == MPG_ERR_ABORTED) {
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", mpg_last_error());
    abort_all(ctx, st);
    return mpg__fail(st, "%s", msg);
  }
  return st;
}

static mpg_status run(mpg_group *g, const mpg__coll *c, mpg_work **work) {
  if (work) *work = NULL;
  mpg_status st = check_coll(g, c);
  if (st) return st;
  mpg_ctx *ctx = g->ctx;
  int reason = atomic_load(&ctx->aborted);
  if (reason)
    return mpg__fail(MPG_ERR_ABORTED, "mpg_%s on \"%s\": the context was aborted (%s)",
                     mpg__kind_name(c->kind), g->name, mpg_status_name((mpg_status)reason));
  if ((st = create_group(ctx, g))) return on_failure(ctx, st);
  if (g->size == 1) return ctx->ops->local ? ctx->ops->local(c) : mpg__local_host(c);

  double deadline = mpg__now() + ctx->timeout_s;
  mpg__req *req = NULL;
  st = ctx->ops->post(g->comm, c, &req);
  if (st) return on_failure(ctx, st);
  if (work) {
    mpg_work *w = malloc(sizeof *w);
    if (!w) {
      /* Cannot hand it out: finish it here rather than lose it. */
      st = ctx->ops->wait(req, deadline);
      if (st) st = on_failure(ctx, st);
      ctx->ops->req_free(req);
      return st ? st
                : mpg__fail(MPG_ERR_NOMEM, "mpg_%s: out of memory for the work "
                            "handle (the operation completed)", mpg__kind_name(c->kind));
    }
    w->group = g;
    w->req = req;
    w->deadline = deadline;
    w->status = MPG_OK;
    *work = w;
    return MPG_OK;
  }
  st = ctx->ops->wait(req, deadline);
  if (st) st = on_failure(ctx, st); /* abort before freeing a pending request */
  ctx->ops->req_free(req);
  return st;
}

mpg_status mpg_work_wait(mpg_work *w) {
  if (!w) return MPG_OK;
  mpg_ctx *ctx = w->group->ctx;
  mpg_status st = w->status;
  if (!st) {
    st = ctx->ops->wait(w->req, w->deadline);
    if (st) st = on_failure(ctx, st); /* abort before freeing the request */
  }
  ctx->ops->req_free(w->req);
  free(w);
  return st;
}

mpg_status mpg_work_test(mpg_work *w, int *done) {
  if (!done) return mpg__fail(MPG_ERR_INVALID, "mpg_work_test: done is NULL");
  if (!w) {
    *done = 1;
    return MPG_OK;
  }
  if (w->status) {
    *done = 1;
    return w->status;
  }
  mpg_status st = w->group->ctx->ops->test(w->req, done);
  if (st) {
    *done = 1;
    w->status = st;
    return st;
  }
  if (!*done && mpg__now() > w->deadline) {
    *done = 1;
    w->status = on_failure(w->group->ctx,
                           mpg__fail(MPG_ERR_TIMEOUT,
                                     "mpg_work_test on \"%s\": no completion "
                                     "within the %.3g s timeout",
                                     w->group->name, w->group->ctx->timeout_s));
    return w->status;
  }
  return MPG_OK;
}

mpg_status mpg_all_reduce(mpg_group *group, const void *send, void *recv,
                          size_t count, mpg_dtype dtype, mpg_op op,
                          void *stream, mpg_work **work) {
  if (op == MPG_OP_PREMUL_SUM)
    return mpg__fail(MPG_ERR_INVALID,
                     "mpg_all_reduce: use mpg_all_reduce_scaled for a scaled sum");
  mpg__coll c = {MPG__ALL_REDUCE, send, recv, count, dtype, op, 1.0, 0, 0, stream};
  return run(group, &c, work);
}

mpg_status mpg_all_reduce_scaled(mpg_group *group, const void *send,
                                 void *recv, size_t count, mpg_dtype dtype,
                                 double scale, void *stream, mpg_work **work) {
  mpg__coll c = {MPG__ALL_REDUCE, send, recv, count, dtype, MPG_OP_PREMUL_SUM,
                 scale, 0, 0, stream};
  return run(group, &c, work);
}

mpg_status mpg_broadcast(mpg_group *group, void *buf, size_t count,
                         mpg_dtype dtype, int root, void *stream,
                         mpg_work **work) {
  mpg__coll c = {MPG__BROADCAST, buf, buf, count, dtype, MPG_OP_SUM, 1.0, root, 0, stream};
  return run(group, &c, work);
}

mpg_status mpg_all_gather(mpg_group *group, const void *send, void *recv,
                          size_t count, mpg_dtype dtype, void *stream,
                          mpg_work **work) {
  mpg__coll c = {MPG__ALL_GATHER, send, recv, count, dtype, MPG_OP_SUM, 1.0, 0, 0, stream};
  return run(group, &c, work);
}

mpg_status mpg_reduce_scatter(mpg_group *group, const void *send, void *recv,
                              size_t count, mpg_dtype dtype, mpg_op op,
                              void *stream, mpg_work **work) {
  if (op == MPG_OP_PREMUL_SUM)
    return mpg__fail(MPG_ERR_INVALID,
                     "mpg_reduce_scatter: MPG_OP_PREMUL_SUM needs a scale; "
                     "it is only reached through mpg_all_reduce_scaled");
  mpg__coll c = {MPG__REDUCE_SCATTER, send, recv, count, dtype, op, 1.0, 0, 0, stream};
  return run(group, &c, work);
}

mpg_status mpg_barrier(mpg_group *group, mpg_work **work) {
  mpg__coll c = {MPG__BARRIER, NULL, NULL, 0, MPG_I32, MPG_OP_SUM, 1.0, 0, 0, NULL};
  return run(group, &c, work);
}

mpg_status mpg_send(mpg_group *group, const void *buf, size_t count,
                    mpg_dtype dtype, int peer, void *stream, mpg_work **work) {
  mpg__coll c = {MPG__SEND, buf, NULL, count, dtype, MPG_OP_SUM, 1.0, 0, peer, stream};
  return run(group, &c, work);
}

mpg_status mpg_recv(mpg_group *group, void *buf, size_t count,
                    mpg_dtype dtype, int peer, void *stream, mpg_work **work) {
  mpg__coll c = {MPG__RECV, NULL, buf, count, dtype, MPG_OP_SUM, 1.0, 0, peer, stream};
  return run(group, &c, work);
}
