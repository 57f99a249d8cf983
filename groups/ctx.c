/* The context: joining the world (launch environment, backend), placement
 * and binding, the context's accessors, abort and teardown, and the
 * backend's memory and streams.  See core.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core.h"
#include "mpg_config.h"

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
static mpg_status resolve_launch(const struct mpg__backend_ops *ops,
                                 const mpg_init_opts *o, mpg__world_args *a,
                                 mpg_launch *env) {
  mpg_launch fresh = MPG_LAUNCH_INIT;
  *env = fresh;
  mpg_status st = mpg_launch_from_env(env);
  if (st) return st;
  a->rank = o->rank >= 0 ? o->rank : env->rank;
  a->world_size = o->world_size > 0 ? o->world_size : env->world_size;
  /* A caller's communicator (e.g. half of MPI_COMM_WORLD) is the world:
   * its rank and size replace the launcher's OMPI_COMM_WORLD_* values. */
  if (o->backend.name == MPG_BACKEND_MPI && o->mpi_comm && ops->comm_identity) {
    int rank = -1, size = -1;
    if ((st = ops->comm_identity(o->mpi_comm, &rank, &size))) return st;
    if (o->rank < 0) a->rank = rank;
    if (o->world_size <= 0) a->world_size = size;
    snprintf(env->source, sizeof env->source, "opts.mpi_comm");
  }
  a->local_rank = o->local_rank >= 0 ? o->local_rank
                : env->local_rank >= 0 ? env->local_rank : 0;
  a->local_world_size = o->local_world_size > 0 ? o->local_world_size
                      : env->local_world_size > 0 ? env->local_world_size : 1;
  /* An MPI process started without a launcher is a singleton world. */
  if (o->backend.name == MPG_BACKEND_MPI && a->rank < 0 && a->world_size < 0 &&
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

/* Put one of the world's communicators in the context's transport list. */
static void link_world(mpg_ctx *ctx, mpg__transport *t, mpg__comm *comm) {
  t->ops = &ctx->ops->transport;
  t->comm = comm;
  mpg__ctx_attach(ctx, t);
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
  } else if ((st = mpg_topo_host_identity((char *)mine, sizeof mine))) {
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
                      1.0, 0, 0, NULL, 0};
  ctx->setup_collectives++;
  if ((st = mpg__ctx_setup_coll(ctx, ctx->world_comm, world, &gather))) goto done;
  for (int r = 0; r < world; r++) {
    ids[r] = (const char *)(all + (size_t)r * ID_INTS);
    ((char *)(all + (size_t)(r + 1) * ID_INTS))[-1] = '\0';
  }
  if ((st = mpg_topo_node_ids(world, ids, node_of, local, &ctx->num_nodes))) goto done;
  mpg_placement_opts po = MPG_PLACEMENT_OPTS_INIT;
  po.node_of = node_of;
  po.local_rank = local;
  po.topology.strict = opts->topology.strict;
  if ((st = mpg_placement_create(ctx->mesh, &po, &pl))) goto done;
  int misfits = 0;
  if ((st = mpg_placement_check(pl, opts->topology.strict, &misfits))) goto done;
  int mesh_rank;
  if ((st = mpg_placement_mesh_rank(pl, a->rank, &mesh_rank))) goto done;
  mpg__log(1, "placement: launcher rank %d on node %d -> mesh rank %d (%d nodes, %d misfit groups)",
           a->rank, node_of[a->rank], mesh_rank, ctx->num_nodes, misfits);
  ctx->binding.local_rank = local[a->rank];
  /* The renumbering split is collective over the world, so whether it
   * happens is decided from the placement, which every rank computes
   * alike, never from this rank's own number. */
  int renumber = ctx->num_nodes > 1;
  for (int L = 0; L < world && !renumber; L++) {
    int m = L;
    if ((st = mpg_placement_mesh_rank(pl, L, &m))) goto done;
    renumber = m != L;
  }
  if (renumber) {
    mpg__comm *placed = NULL;
    ctx->setup_collectives++;
    st = ctx->ops->split(ctx->world_comm, 0, mesh_rank, &placed);
    if (st) goto done;
    /* The launcher-ordered world stays (freed last): both in the
     * context's transport list, the world first. */
    mpg__ctx_detach(ctx, &ctx->world_link);
    ctx->launch_comm = ctx->world_comm;
    ctx->world_comm = placed;
    link_world(ctx, &ctx->launch_link, ctx->launch_comm);
    link_world(ctx, &ctx->world_link, ctx->world_comm);
  }
  ctx->rank = mesh_rank;
done:
  (void)mpg_placement_destroy(pl);
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
  /* Near the GPU the backend runs on (nccl: groups/device.h), which may
   * not be GPU `local` (one GPU per process under Slurm); topo's GPU i is
   * CUDA device i, both honouring CUDA_VISIBLE_DEVICES.  topo's default
   * (-1: local rank i on GPU i) is kept where it gives that GPU. */
  int dev = ctx->ops->comm_device ? ctx->ops->comm_device(ctx->world_comm) : -1;
  if (dev >= 0 && (dev != local || a->local_world_size > mpg_topo_num_gpus(topo)))
    gpu = dev;
  if (ctx->kind == MPG_BACKEND_THREAD)
    st = mpg_topo_bind(topo, local, a->local_world_size, gpu, opts->topology.bind,
                              MPG_BIND_APPLY_THREAD,
                              &ctx->binding);
  else
    st = mpg_topo_bind(topo, local, a->local_world_size, gpu, opts->topology.bind,
                       MPG_BIND_APPLY_PROCESS,
                       &ctx->binding);
  (void)mpg_topo_destroy(topo);
  if (!st)
    mpg__log(1, "rank %d: bound to cpus %s (numa %d, gpu %d)", ctx->rank,
             ctx->binding.cpuset, ctx->binding.numa_node, ctx->binding.gpu);
  return st;
}

/* The thread backend without a thread world: most often a spec without
 * [backend] under a launcher, so say which name to set. */
static mpg_status no_thread_world(void) {
  mpg_launch by = MPG_LAUNCH_INIT;
  if (mpg_launch_from_env(&by) == MPG_OK && by.world_size > 0 && by.source[0])
    return mpg__fail(MPG_ERR_INVALID,
                     "opts.backend is \"thread\" (the default, also of a spec without "
                     "[backend] name), but %s started this process as rank %d of %d: "
                     "for one process per rank set [backend] name = \"mpi\" (or \"nccl\" "
                     "on GPUs; opts.backend.name = MPG_BACKEND_MPI / MPG_BACKEND_NCCL); the "
                     "thread backend runs ranks started by mpg_thread_run "
                     "(opts.thread_world is NULL)",
                     by.source, by.rank, by.world_size);
  return mpg__fail(MPG_ERR_INVALID,
                   "the thread backend runs ranks started by mpg_thread_run "
                   "(opts.thread_world is NULL); under mpirun, srun or torchrun set "
                   "[backend] name = \"mpi\" or \"nccl\" (opts.backend)");
}

/* The caller's options, checked, and what world_init needs from them and
 * from the launcher (a, env). */
static mpg_status resolve_opts(const mpg_init_opts *opts, const struct mpg__backend_ops **ops,
                               mpg__world_args *a, mpg_launch *env) {
  *ops = backend_ops(opts->backend.name);
  if (!*ops)
    return mpg__fail(MPG_ERR_UNSUPPORTED,
                     "backend \"%s\" is not built into this meshpg (configure "
                     "with -D%s=enabled)",
                     backend_name(opts->backend.name), backend_name(opts->backend.name));
  if (opts->backend.name == MPG_BACKEND_THREAD && !opts->thread_world) return no_thread_world();
  memset(a, 0, sizeof *a);
  if (opts->backend.timeout_s > 0 ? !(opts->backend.timeout_s < MPG__TIMEOUT_MAX) : opts->backend.timeout_s != opts->backend.timeout_s)
    return mpg__fail(MPG_ERR_INVALID,
                     "mpg_ctx_create: opts.backend.timeout_s is %g: expected a number of seconds "
                     "> 0 and < " MPG__TIMEOUT_MAX_TEXT " (or <= 0 for the default, 600 s)",
                     opts->backend.timeout_s);
  mpg_status st = resolve_launch(*ops, opts, a, env);
  if (st) return st;
  a->timeout_s = opts->backend.timeout_s > 0 ? opts->backend.timeout_s : 600.0;
  a->device = opts->device;
  a->nccl_id = opts->nccl_id;
  a->master_addr = env->master_addr;
  a->master_port = env->master_port;
  a->mpi_comm = opts->mpi_comm;
  a->thread_world = opts->thread_world;
  return MPG_OK;
}

/* A new context with everything but its communicators; NULL when out of
 * memory.  Reads every MESHPG_* variable, once (settings.c): a bad value
 * does not stop this rank here, it joins the world so that every rank
 * learns of it (agree.c) instead of waiting out the timeout for this one. */
static mpg_ctx *ctx_new(const mpg_mesh *mesh, const mpg_init_opts *opts,
                        const struct mpg__backend_ops *ops, mpg__world_args *a) {
  mpg_ctx *ctx = calloc(1, sizeof *ctx);
  if (!ctx) return NULL;
  if (pthread_mutex_init(&ctx->transport_lock, NULL)) {
    free(ctx);
    return NULL;
  }
  mpg__settings_read(&ctx->settings);
  mpg__log_set_level(ctx->settings.log);
  a->settings = &ctx->settings;
  ctx->mesh = mesh;
  ctx->ops = ops;
  ctx->kind = opts->backend.name;
  ctx->rank = a->rank;
  ctx->world = a->world_size;
  ctx->local_rank = a->local_rank;
  ctx->timeout_s = a->timeout_s;
  ctx->lazy = opts->backend.lazy_groups;
  ctx->nsets = mpg_mesh_num_dimsets(mesh);
  ctx->launcher_rank = a->rank;
  ctx->num_nodes = 1;
  if (opts->host_id) snprintf(ctx->host_id, sizeof ctx->host_id, "%s", opts->host_id);
  mpg_binding unbound = MPG_BINDING_INIT;
  ctx->binding = unbound;
  ctx->binding.local_rank = a->local_rank;
  ctx->setup_collectives = 1;
  /* Random per rank until agree.c makes it the ranks' maximum. */
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  ctx->job = mpg__hash_mix(mpg__hash_mix((uint64_t)ts.tv_nsec, (uint64_t)ts.tv_sec),
                           ((uint64_t)getpid() << 20) ^ (uint64_t)a->rank);
  return ctx;
}

static void ctx_free(mpg_ctx *ctx) {
  pthread_mutex_destroy(&ctx->transport_lock);
  free(ctx);
}

/* After world_init: every rank built the same job (agree.c), before
 * anything depends on the mesh; then what is wrong on every rank alike,
 * placement, binding and the order checker. */
static mpg_status join_checks(mpg_ctx *ctx, const mpg_init_opts *opts, mpg__world_args *a,
                              const mpg_launch *env) {
  mpg_status st = mpg__ctx_agree(ctx, opts, &ctx->settings);
  if (!st && ctx->settings.status)
    st = mpg__fail(MPG_ERR_ENV, "mpg_ctx_create (rank %d): %s", a->rank, ctx->settings.error);
  if (!st && a->world_size != mpg_mesh_world_size(ctx->mesh))
    st = mpg__fail(MPG_ERR_INVALID,
                   "the world has %d ranks (%s) but the mesh has %d",
                   a->world_size,
                   opts->world_size > 0 ? "from opts.world_size"
                   : env->source[0]     ? env->source : "from the environment",
                   mpg_mesh_world_size(ctx->mesh));
  if (!st && opts->placement) st = place(ctx, opts, a);
  if (!st && opts->topology.bind != MPG_BIND_NONE) st = bind_rank(ctx, opts, a);
  if (!st) st = mpg__order_create(ctx); /* MESHPG_CHECK_ORDER: records from here */
  return st;
}

/* The context's group of every dim set, and (unless lazy) their
 * communicators. */
static mpg_status make_groups(mpg_ctx *ctx) {
  for (int s = 0; s < ctx->nsets; s++) {
    mpg_group *g = &ctx->groups[s];
    g->ctx = ctx;
    g->dimset = s;
    mpg_mesh_dimset_info(ctx->mesh, s, &g->name, NULL, NULL);
    mpg_mesh_group_of(ctx->mesh, s, ctx->rank, &g->index, &g->position, &g->size);
    g->mask = mpg__mesh_dimset_mask(ctx->mesh, s);
  }
  mpg_status st = MPG_OK;
  if (!ctx->lazy)
    for (int s = 0; s < ctx->nsets && !st; s++) st = mpg__group_create(ctx, &ctx->groups[s]);
  if (st) mpg__ctx_abort_all(ctx, st == MPG_ERR_TIMEOUT ? MPG_ERR_TIMEOUT : MPG_ERR_ABORTED);
  return st;
}

mpg_status mpg_ctx_create(const mpg_mesh *mesh, const mpg_init_opts *opts,
                          mpg_ctx **out) {
  if (!out) return mpg__fail(MPG_ERR_INVALID, "mpg_ctx_create: out is NULL");
  *out = NULL;
  if (!mesh) return mpg__fail(MPG_ERR_INVALID, "mpg_ctx_create: mesh is NULL");
  mpg_init_opts full = MPG_INIT_OPTS_INIT;
  if (opts) {
    mpg_status bad = mpg__abi_in(&full, MPG__ABI_END(mpg_init_opts), opts, MPG_INIT_OPTS_MAGIC,
                                 "mpg_ctx_create: opts", "MPG_INIT_OPTS_INIT");
    if (bad) return bad;
  }
  opts = &full;
  const struct mpg__backend_ops *ops = NULL;
  mpg__world_args a;
  mpg_launch env;
  mpg_status st = resolve_opts(opts, &ops, &a, &env);
  if (st) return st;
  mpg_ctx *ctx = ctx_new(mesh, opts, ops, &a);
  if (!ctx) return mpg__fail(MPG_ERR_NOMEM, "mpg_ctx_create: out of memory");
  if ((st = mpg__trace_create(ctx, opts))) {
    ctx_free(ctx);
    return st;
  }
  st = ops->world_init(&a, &ctx->world_comm);
  if (st) {
    /* A bad variable may be why (a port): say so first. */
    if (ctx->settings.status)
      st = mpg__fail_wrap(st, "mpg_ctx_create (rank %d): %s; joining the world then failed",
                          a.rank, ctx->settings.error);
    mpg__trace_destroy(ctx);
    ctx_free(ctx);
    return st;
  }
  link_world(ctx, &ctx->world_link, ctx->world_comm);
  mpg__log(1, "rank %d of %d: %s backend up", ctx->rank, ctx->world, ops->name);
  st = join_checks(ctx, opts, &a, &env);
  if (!st) st = make_groups(ctx);
  if (st) {
    mpg__saved_error why;
    mpg__error_save(&why);
    mpg_ctx_destroy(ctx);
    return mpg__error_restore(st, &why);
  }
  /* The creating thread issued the create's own collectives; the issuing
   * thread (nccl) is the first that issues after it, so that a context
   * made on one thread may be trained on another. */
  atomic_store(&ctx->issuer, 0);
  *out = ctx;
  return MPG_OK;
}

/* Keep the first error of a teardown (and its message). */
static void keep_first(mpg_status st, mpg_status *first, mpg__saved_error *why) {
  if (st && !*first) {
    *first = st;
    mpg__error_save(why);
  }
}

void mpg__ctx_sync_count(mpg_ctx *ctx, int delta) { ctx->syncs += delta; }

mpg_status mpg_ctx_destroy(mpg_ctx *ctx) {
  if (!ctx) return MPG_OK;
  if (ctx->syncs > 0)
    return mpg__fail(MPG_ERR_STATE,
                     "mpg_ctx_destroy (rank %d): %d gradient synchroniser%s still "
                     "use%s this context; call mpg_sync_destroy first (nothing was "
                     "freed)",
                     ctx->rank, ctx->syncs, ctx->syncs == 1 ? "" : "s",
                     ctx->syncs == 1 ? "s" : "");
  mpg_status first = MPG_OK;
  mpg__saved_error why;
  mpg__ctx_staging_release(ctx);
  mpg__order_destroy(ctx); /* frees the record; no check (see order.c) */
  mpg__trace_at_end(ctx);  /* reason "end" unless a fault's dump was written */
  mpg__trace_destroy(ctx);
  /* Every transport of every group, the same way (setup.c), then the
   * context's own: the world, the launcher-ordered world last. */
  for (int s = 0; s < ctx->nsets; s++)
    keep_first(mpg__group_teardown(&ctx->groups[s]), &first, &why);
  while (ctx->extra) {
    mpg_group *g = ctx->extra;
    ctx->extra = g->next;
    keep_first(mpg__group_teardown(g), &first, &why);
    free(g);
  }
  keep_first(mpg__ctx_teardown(ctx), &first, &why);
  ctx_free(ctx);
  return first ? mpg__error_restore(first, &why) : MPG_OK;
}

mpg_status mpg_ctx_set_timeout(mpg_ctx *ctx, double timeout_s) {
  if (!ctx) return mpg__fail(MPG_ERR_INVALID, "mpg_ctx_set_timeout: ctx is NULL");
  if (!(timeout_s > 0) || !(timeout_s < MPG__TIMEOUT_MAX))
    return mpg__fail(MPG_ERR_INVALID,
                     "mpg_ctx_set_timeout: timeout_s is %g, expected > 0 and < "
                     MPG__TIMEOUT_MAX_TEXT " seconds", timeout_s);
  ctx->timeout_s = timeout_s;
  if (!ctx->ops->set_timeout) return MPG_OK;
  if (ctx->world_comm) ctx->ops->set_timeout(ctx->world_comm, timeout_s);
  if (ctx->launch_comm) ctx->ops->set_timeout(ctx->launch_comm, timeout_s);
  for (int i = 0; i < ctx->nsets; i++) {
    mpg__comm *c = ctx->groups[i].comm;
    if (c && c != ctx->world_comm) ctx->ops->set_timeout(c, timeout_s);
  }
  for (mpg_group *g = ctx->extra; g; g = g->next)
    if (g->comm && g->comm != ctx->world_comm) ctx->ops->set_timeout(g->comm, timeout_s);
  mpg__log(1, "ctx: rank %d: timeout now %g s", ctx->rank, timeout_s);
  return MPG_OK;
}

mpg_status mpg_ctx_abort(mpg_ctx *ctx) {
  if (!ctx) return mpg__fail(MPG_ERR_INVALID, "mpg_ctx_abort: ctx is NULL");
  mpg__ctx_abort_all(ctx, MPG_ERR_ABORTED);
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
mpg_status mpg_ctx_get_binding(const mpg_ctx *ctx, mpg_binding *out) {
  if (!ctx) return mpg__fail(MPG_ERR_INVALID, "mpg_ctx_get_binding: ctx is NULL");
  mpg_status st = mpg__abi_check(out, MPG_BINDING_MAGIC, "mpg_ctx_get_binding: out",
                                 "MPG_BINDING_INIT");
  if (st) return st;
  mpg__abi_out(out, &ctx->binding, MPG__ABI_END(mpg_binding));
  return MPG_OK;
}
int mpg_ctx_local_rank(const mpg_ctx *ctx) { return ctx ? ctx->local_rank : -1; }
mpg_backend_kind mpg_ctx_backend(const mpg_ctx *ctx) {
  return ctx ? ctx->kind : MPG_BACKEND_THREAD;
}
const mpg_mesh *mpg_ctx_mesh(const mpg_ctx *ctx) { return ctx ? ctx->mesh : NULL; }
int mpg__ctx_half_reduces_in_f32(const mpg_ctx *ctx) {
  return ctx != NULL; /* every backend (nccl through groups/coll_f32.c) */
}

int mpg__ctx_stream_ordered(const mpg_ctx *ctx) {
  return ctx && ctx->kind == MPG_BACKEND_NCCL;
}

long mpg__ctx_setup_collectives(const mpg_ctx *ctx) {
  return ctx ? ctx->setup_collectives : 0;
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
  if (ctx->ops->mem_zero) return ctx->ops->mem_zero(ctx->world_comm, ptr, bytes, stream);
  if (bytes) memset(ptr, 0, bytes);
  return MPG_OK;
}

mpg_status mpg_ctx_stream_create(mpg_ctx *ctx, void **stream) {
  if (!ctx || !stream) return mpg__fail(MPG_ERR_INVALID, "mpg_ctx_stream_create: NULL argument");
  *stream = NULL;
  return ctx->ops->stream_create ? ctx->ops->stream_create(ctx->world_comm, stream) : MPG_OK;
}

mpg_status mpg_ctx_stream_destroy(mpg_ctx *ctx, void *stream) {
  if (!ctx) return mpg__fail(MPG_ERR_INVALID, "mpg_ctx_stream_destroy: ctx is NULL");
  return ctx->ops->stream_destroy && stream ? ctx->ops->stream_destroy(ctx->world_comm, stream)
                                            : MPG_OK;
}

mpg_status mpg_ctx_stream_order(mpg_ctx *ctx, void *waiter, void *waitee) {
  if (!ctx) return mpg__fail(MPG_ERR_INVALID, "mpg_ctx_stream_order: ctx is NULL");
  return ctx->ops->stream_order ? ctx->ops->stream_order(ctx->world_comm, waiter, waitee)
                                : MPG_OK;
}
