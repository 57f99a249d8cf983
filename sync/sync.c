/* The sync module's front: options, create and destroy, parameter
 * registration and the getters.  The design is described in
 * sync_core.h; commit lives in layout.c, the step in step.c. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sync_core.h"

/* ------------------------------------------------------------------ */
/* Helpers                                                             */
/* ------------------------------------------------------------------ */

static char *dup_str(const char *s) {
  size_t n = strlen(s) + 1;
  char *d = malloc(n);
  if (d) memcpy(d, s, n);
  return d;
}

static int dtype_is_float(mpg_dtype dt) {
  return dt == MPG_F32 || dt == MPG_F64 || dt == MPG_F16 || dt == MPG_BF16;
}

/* Names "dp_cp,tp" -> mask of mesh dims (mesh/'s one parser). */
static mpg_status dims_mask(const mpg_mesh *mesh, const char *names,
                            const char *what, unsigned *mask) {
  return mpg__mesh_parse_dims(mesh, names, 0, what, mask, NULL, NULL);
}

static int has_dimset(const mpg_mesh *mesh, const char *name) {
  int set;
  if (mpg_mesh_dimset_find(mesh, name, &set) == MPG_OK) return 1;
  mpg__clear_error();
  return 0;
}

/* A group holding only this rank: a selection of its own position along
 * the first dim.  One member means no communicator, so no rank waits on
 * another here (the groups layer splits only groups of two or more). */
static mpg_status solo_group(mpg_ctx *ctx, mpg_group **out) {
  const mpg_mesh *mesh = mpg_ctx_mesh(ctx);
  int coord[MPG_MAX_DIMS];
  const char *name;
  mpg_status st = mpg_mesh_coord_of(mesh, mpg_ctx_rank(ctx), coord);
  if (!st) st = mpg_mesh_dim(mesh, 0, &name, NULL);
  if (!st) st = mpg_ctx_group_select(ctx, name, &coord[0], 1, out);
  if (!st && !*out)
    st = mpg__fail(MPG_ERR_BACKEND, "sync: rank %d is not in its own one-rank group",
                   mpg_ctx_rank(ctx));
  return st;
}

/* ------------------------------------------------------------------ */
/* Options                                                             */
/* ------------------------------------------------------------------ */

static mpg_status check_opts(const mpg_sync_opts *o) {
  if (o->sync.op != MPG_OP_AVG && o->sync.op != MPG_OP_SUM)
    return mpg__fail(MPG_ERR_INVALID,
                     "mpg_sync_create: opts.sync.op is %d, expected MPG_OP_AVG (%d) or "
                     "MPG_OP_SUM (%d)",
                     (int)o->sync.op, (int)MPG_OP_AVG, (int)MPG_OP_SUM);
  if (o->sync.reduce_dtype != MPG_REDUCE_NATIVE && o->sync.reduce_dtype != MPG_REDUCE_F32)
    return mpg__fail(MPG_ERR_INVALID,
                     "mpg_sync_create: opts.sync.reduce_dtype is %d, expected "
                     "MPG_REDUCE_NATIVE (0) or MPG_REDUCE_F32 (1)",
                     (int)o->sync.reduce_dtype);
  if (!(o->sync.bucket_mb > 0) || !isfinite(o->sync.bucket_mb))
    return mpg__fail(MPG_ERR_INVALID,
                     "mpg_sync_create: opts.sync.bucket_mb is %g, expected a number > 0",
                     o->sync.bucket_mb);
  if (!(o->sync.first_bucket_mb > 0) || !isfinite(o->sync.first_bucket_mb))
    return mpg__fail(MPG_ERR_INVALID,
                     "mpg_sync_create: opts.sync.first_bucket_mb is %g, expected a number > 0",
                     o->sync.first_bucket_mb);
  if (!isfinite(o->grad_scale))
    return mpg__fail(MPG_ERR_INVALID,
                     "mpg_sync_create: opts.grad_scale is %g, expected a finite number",
                     o->grad_scale);
  if (o->sync.mode != MPG_SYNC_REPLICATE && o->sync.mode != MPG_SYNC_SHARD)
    return mpg__fail(MPG_ERR_INVALID,
                     "mpg_sync_create: opts.sync.mode is %d, expected MPG_SYNC_REPLICATE (0) "
                     "or MPG_SYNC_SHARD (1)",
                     (int)o->sync.mode);
  const char *dims[] = {o->sync.shard_dims, o->sync.replicate_dims, o->sync.expert_shard_dims};
  const char *key[] = {"shard_dims", "replicate_dims", "expert_shard_dims"};
  for (int i = 0; i < 3; i++) {
    if (!memchr(dims[i], '\0', MPG_DIMS_LEN))
      return mpg__fail(MPG_ERR_INVALID, "mpg_sync_create: opts.sync.%s is not "
                       "NUL-terminated within its %d bytes", key[i], MPG_DIMS_LEN);
    if (o->sync.mode != MPG_SYNC_SHARD && dims[i][0])
      return mpg__fail(MPG_ERR_INVALID, "mpg_sync_create: opts.sync.%s = \"%s\" needs "
                       "opts.sync.mode = MPG_SYNC_SHARD", key[i], dims[i]);
  }
  if (o->sync.mode != MPG_SYNC_SHARD && o->sync.optimizer_instances > 1)
    return mpg__fail(MPG_ERR_INVALID, "mpg_sync_create: opts.sync.optimizer_instances "
                     "needs opts.sync.mode = MPG_SYNC_SHARD");
  if (o->sync.optimizer_instances < 0)
    return mpg__fail(MPG_ERR_INVALID,
                     "mpg_sync_create: opts.sync.optimizer_instances is %d, expected 1 or more "
                     "(0: the default, 1)",
                     o->sync.optimizer_instances);
  if (o->default_dims && !o->default_dims[0])
    return mpg__fail(MPG_ERR_INVALID,
                     "mpg_sync_create: opts.default_dims is \"\"; use NULL for the "
                     "default (dp_cp, or cp with fsdp_owns_dp)");
  return MPG_OK;
}

/* ------------------------------------------------------------------ */
/* Create / destroy                                                    */
/* ------------------------------------------------------------------ */

/* The default reduce group: default_dims; else "cp" with fsdp_owns_dp (a
 * one-rank group when the mesh has no cp); else "dp_cp", or the union of
 * the dp and cp dims the mesh has. */
static mpg_status make_default_group(mpg_sync *s) {
  const mpg_mesh *mesh = s->mesh;
  char names[MPG_MAX_DIMS * MPG_NAME_MAX];
  mpg_status st;
  if (s->default_dims) {
    st = dims_mask(mesh, s->default_dims, "mpg_sync_create: opts.default_dims",
                   &s->default_mask);
    if (st) return st;
    snprintf(s->default_desc, sizeof s->default_desc, "%s", s->default_dims);
    mpg__mesh_mask_names(mesh, s->default_mask, ",", names, sizeof names);
  } else if (s->opts.sync.fsdp_owns_dp) {
    if (!has_dimset(mesh, "cp")) {
      snprintf(s->default_desc, sizeof s->default_desc,
               "cp (fsdp_owns_dp; the mesh has no cp: nothing to reduce)");
      s->default_mask = 0;
      mpg__log(1, "sync: rank %d: fsdp_owns_dp and no \"cp\" dim: gradients are "
               "not reduced (FSDP reduces over dp)", mpg_ctx_rank(s->ctx));
      return solo_group(s->ctx, &s->default_group);
    }
    snprintf(s->default_desc, sizeof s->default_desc, "cp (fsdp_owns_dp)");
    st = dims_mask(mesh, "cp", "mpg_sync_create: default reduce dims", &s->default_mask);
    if (st) return st;
    snprintf(names, sizeof names, "cp");
  } else if (has_dimset(mesh, "dp_cp")) {
    snprintf(s->default_desc, sizeof s->default_desc, "dp_cp");
    st = dims_mask(mesh, "dp_cp", "mpg_sync_create: default reduce dims", &s->default_mask);
    if (st) return st;
    snprintf(names, sizeof names, "dp_cp");
  } else {
    int dp = has_dimset(mesh, "dp"), cp = has_dimset(mesh, "cp");
    if (!dp && !cp) {
      char dims[MPG_MAX_DIMS * MPG_NAME_MAX];
      mpg__mesh_mask_names(mesh, (1u << mpg_mesh_ndims(mesh)) - 1u, ", ", dims, sizeof dims);
      return mpg__fail(MPG_ERR_NOT_FOUND,
                       "mpg_sync_create: the mesh has no \"dp_cp\" set and no \"dp\" "
                       "or \"cp\" dim to reduce gradients over (its dims: %s); set "
                       "opts.default_dims",
                       dims);
    }
    snprintf(names, sizeof names, "%s", dp && cp ? "dp,cp" : dp ? "dp" : "cp");
    snprintf(s->default_desc, sizeof s->default_desc, "%s (the mesh has no dp_cp set)",
             names);
    st = dims_mask(mesh, names, "mpg_sync_create: default reduce dims", &s->default_mask);
    if (st) return st;
  }
  st = mpg_ctx_group_dims(s->ctx, names, &s->default_group);
  if (st) return mpg__fail_wrap(st, "mpg_sync_create: default reduce group \"%s\"", names);
  return MPG_OK;
}

mpg_status mpg_sync_create(mpg_ctx *ctx, const mpg_sync_opts *opts,
                           mpg_sync **out) {
  if (!out) return mpg__fail(MPG_ERR_INVALID, "mpg_sync_create: out is NULL");
  *out = NULL;
  if (!ctx) return mpg__fail(MPG_ERR_INVALID, "mpg_sync_create: ctx is NULL");
  mpg_sync_opts full = MPG_SYNC_OPTS_INIT;
  if (opts) {
    mpg_status bad = mpg__abi_in(&full, MPG__ABI_END(mpg_sync_opts), opts, MPG_SYNC_OPTS_MAGIC,
                                 "mpg_sync_create: opts", "MPG_SYNC_OPTS_INIT");
    if (bad) return bad;
  }
  opts = &full;
  mpg_status st = check_opts(opts);
  if (st) return st;

  mpg_sync *s = calloc(1, sizeof *s);
  if (!s) return mpg__fail(MPG_ERR_NOMEM, "mpg_sync_create: out of memory");
  s->ctx = ctx;
  s->mesh = mpg_ctx_mesh(ctx);
  s->opts = *opts;
  if (s->opts.sync.optimizer_instances == 0) s->opts.sync.optimizer_instances = 1;
  s->step.grads_valid = 1;
  if (opts->default_dims && !(s->default_dims = dup_str(opts->default_dims))) {
    free(s);
    return mpg__fail(MPG_ERR_NOMEM, "mpg_sync_create: out of memory");
  }
  s->opts.default_dims = s->default_dims;
  st = make_default_group(s);
  if (!st && opts->sync.mode == MPG_SYNC_SHARD) st = mpg__sync_shard_groups(s);
  if (!st) {
    st = mpg_ctx_stream_create(ctx, &s->stream);
    if (st) st = mpg__fail_wrap(st, "mpg_sync_create: its stream");
  }
  if (st) {
    free(s->default_dims);
    free(s);
    return st;
  }
  mpg__log(1, "sync: rank %d: default reduce group %s = \"%s\" of %d ranks",
           mpg_ctx_rank(ctx), s->default_desc, mpg_group_name(s->default_group),
           mpg_group_size(s->default_group));
  mpg__ctx_sync_count(ctx, +1);
  *out = s;
  return MPG_OK;
}

mpg_status mpg_sync_destroy(mpg_sync *s) {
  if (!s) return MPG_OK;
  mpg_status first = MPG_OK;
  mpg__saved_error why;
  /* Never free memory a collective may still write: release what a step
   * left in flight first (bounded by the context's timeout). */
  if (s->step.open) mpg__sync_wait_all(s);
  mpg__sync_gather_drop(s);
  mpg__ctx_sync_count(s->ctx, -1);
  for (int i = 0; i < s->layout.nbuffers; i++) {
    if (s->layout.buffers[i].param_data && !s->layout.buffers[i].param_shm) {
      /* (param_shm: freed with the layout) */
      mpg_status st = mpg_ctx_mem_free(s->ctx, s->layout.buffers[i].param_data);
      s->layout.buffers[i].param_data = NULL;
      if (st && !first) {
        first = mpg__fail_wrap(st, "mpg_sync_destroy: freeing parameter buffer %d", i);
        mpg__error_save(&why);
      }
    }
    if (!s->layout.buffers[i].data || s->layout.buffers[i].shm)
      continue; /* shm: freed with the layout */
    mpg_status st = mpg_ctx_mem_free(s->ctx, s->layout.buffers[i].data);
    s->layout.buffers[i].data = NULL;
    if (st && !first) {
      first = mpg__fail_wrap(st, "mpg_sync_destroy: freeing buffer %d", i);
      mpg__error_save(&why);
    }
  }
  if (s->stream) {
    mpg_status st = mpg_ctx_stream_destroy(s->ctx, s->stream);
    if (st && !first) {
      first = mpg__fail_wrap(st, "mpg_sync_destroy: its stream");
      mpg__error_save(&why);
    }
  }
  mpg__sync_free_layout(s);
  for (int i = 0; i < s->layout.nparams; i++) {
    free(s->layout.params[i].name);
    free(s->layout.params[i].dims);
  }
  free(s->layout.params);
  free(s->layout.name_index);
  free(s->default_dims);
  free(s);
  return first ? mpg__error_restore(first, &why) : MPG_OK;
}

/* ------------------------------------------------------------------ */
/* Parameters                                                          */
/* ------------------------------------------------------------------ */


/* The id of `name`, or -1; *slot gets where it would go. */
static int hash_find(const mpg_sync *s, const char *name, int *slot) {
  unsigned m = (unsigned)s->layout.name_index_cap - 1;
  unsigned i = (unsigned)mpg__hash_str(name) & m;
  while (s->layout.name_index[i] >= 0) {
    if (strcmp(s->layout.params[s->layout.name_index[i]].name, name) == 0)
      return s->layout.name_index[i];
    i = (i + 1) & m;
  }
  if (slot) *slot = (int)i;
  return -1;
}

static int hash_grow(mpg_sync *s) {
  int cap = s->layout.name_index_cap ? s->layout.name_index_cap * 2 : 64;
  int *h = malloc(sizeof *h * (size_t)cap);
  if (!h) return -1;
  for (int i = 0; i < cap; i++) h[i] = -1;
  free(s->layout.name_index);
  s->layout.name_index = h;
  s->layout.name_index_cap = cap;
  for (int id = 0; id < s->layout.nparams; id++) {
    int slot = 0;
    hash_find(s, s->layout.params[id].name, &slot);
    s->layout.name_index[slot] = id;
  }
  return 0;
}

mpg_status mpg_sync_add_param(mpg_sync *s, const char *name, size_t count,
                              mpg_dtype dtype, const mpg_param_opts *opts,
                              int *param) {
  if (param) *param = -1;
  if (!s || !name || !param)
    return mpg__fail(MPG_ERR_INVALID, "mpg_sync_add_param: %s is NULL",
                     !s ? "sync" : !name ? "name" : "param");
  if (s->committed)
    return mpg__fail(MPG_ERR_STATE,
                     "mpg_sync_add_param \"%s\": the sync is already committed "
                     "(register every parameter before mpg_sync_commit)",
                     name);
  if (!name[0])
    return mpg__fail(MPG_ERR_INVALID, "mpg_sync_add_param: the name is empty");
  if (count == 0)
    return mpg__fail(MPG_ERR_INVALID, "param \"%s\": count is 0, expected >= 1", name);
  if ((unsigned)dtype >= MPG_DTYPE_COUNT)
    return mpg__fail(MPG_ERR_INVALID, "param \"%s\": unknown dtype %d", name, (int)dtype);
  size_t dsize = mpg_dtype_size(dtype);
  if (count > (SIZE_MAX / 4) / dsize)
    return mpg__fail(MPG_ERR_RANGE, "param \"%s\": %zu elements of %s do not fit in memory",
                     name, count, mpg_dtype_name(dtype));
  mpg_param_opts po = MPG_PARAM_OPTS_INIT;
  if (opts) {
    char what[160];
    snprintf(what, sizeof what, "param \"%s\": opts", name);
    mpg_status bad = mpg__abi_in(&po, MPG__ABI_END(mpg_param_opts), opts, MPG_PARAM_OPTS_MAGIC, what,
                                 "MPG_PARAM_OPTS_INIT");
    if (bad) return bad;
  }
  if (po.tied_group && mpg__group_ctx(po.tied_group) != s->ctx)
    return mpg__fail(MPG_ERR_INVALID,
                     "param \"%s\": tied_group \"%s\" belongs to another context "
                     "than the sync's",
                     name, mpg_group_name(po.tied_group));
  /* Every backend reduces f16/bf16 in f32 when asked (nccl: step.c's
   * launch uses the groups layer's f32-accumulating calls); the check stays
   * for a backend that could not. */
  if ((dtype == MPG_F16 || dtype == MPG_BF16) && s->opts.sync.reduce_dtype == MPG_REDUCE_F32 &&
      !mpg__ctx_half_reduces_in_f32(s->ctx))
    return mpg__fail(MPG_ERR_UNSUPPORTED,
                     "param \"%s\": reduce_dtype f32 for a %s gradient is not "
                     "implemented on this backend (it would reduce in %s); set "
                     "[sync] reduce_dtype = \"native\" (opts.sync.reduce_dtype = "
                     "MPG_REDUCE_NATIVE) or register the gradient as f32",
                     name, mpg_dtype_name(dtype), mpg_dtype_name(dtype));
  if (s->opts.grad_scale != 1.0 && !dtype_is_float(dtype))
    return mpg__fail(MPG_ERR_INVALID,
                     "param \"%s\": dtype %s cannot take grad_scale %g (a scaled "
                     "sum needs a floating dtype)",
                     name, mpg_dtype_name(dtype), s->opts.grad_scale);
  if (s->layout.nparams >= (1 << 28))
    return mpg__fail(MPG_ERR_RANGE, "param \"%s\": too many parameters (%d)", name,
                     s->layout.nparams);
  if (s->layout.name_index_cap == 0 || (s->layout.nparams + 1) * 2 > s->layout.name_index_cap) {
    if (hash_grow(s)) return mpg__fail(MPG_ERR_NOMEM, "param \"%s\": out of memory", name);
  }
  int slot = -1, dup = hash_find(s, name, &slot);
  if (dup >= 0)
    return mpg__fail(MPG_ERR_INVALID, "param \"%s\": the name is already registered (id %d)",
                     name, dup);

  unsigned mask = 0;
  const char *dims = po.reduce_dims;
  if (dims) {
    char what[160];
    snprintf(what, sizeof what, "param \"%s\": reduce_dims", name);
    mpg_status st = dims_mask(s->mesh, dims, what, &mask);
    if (st) return st;
  }
  if (s->layout.nparams == s->layout.params_cap) {
    int cap = s->layout.params_cap ? s->layout.params_cap * 2 : 32;
    sparam *p = realloc(s->layout.params, sizeof *p * (size_t)cap);
    if (!p) return mpg__fail(MPG_ERR_NOMEM, "param \"%s\": out of memory", name);
    s->layout.params = p;
    s->layout.params_cap = cap;
  }
  sparam *p = &s->layout.params[s->layout.nparams];
  memset(p, 0, sizeof *p);
  p->name = dup_str(name);
  p->dims = dims ? dup_str(dims) : NULL;
  if (!p->name || (dims && !p->dims)) {
    free(p->name);
    free(p->dims);
    return mpg__fail(MPG_ERR_NOMEM, "param \"%s\": out of memory", name);
  }
  p->count = count;
  p->dtype = dtype;
  p->mask = mask;
  p->tied = po.tied_group;
  p->buffer = p->bucket = -1;
  s->layout.name_index[slot] = s->layout.nparams;
  *param = s->layout.nparams++;
  return MPG_OK;
}

mpg_status mpg_sync_grad(mpg_sync *s, int param, void **grad) {
  if (grad) *grad = NULL;
  if (!s || !grad)
    return mpg__fail(MPG_ERR_INVALID, "mpg_sync_grad: %s is NULL", !s ? "sync" : "grad");
  if (param < 0 || param >= s->layout.nparams)
    return mpg__fail(MPG_ERR_RANGE, "mpg_sync_grad: param %d is outside 0..%d", param,
                     s->layout.nparams - 1);
  if (!s->committed)
    return mpg__fail(MPG_ERR_STATE,
                     "mpg_sync_grad \"%s\": call mpg_sync_commit first (the buffers "
                     "are laid out there)",
                     s->layout.params[param].name);
  const sparam *p = &s->layout.params[param];
  *grad = (char *)s->layout.buffers[p->buffer].data + p->offset * mpg_dtype_size(p->dtype);
  return MPG_OK;
}

mpg_status mpg_sync_param_group(const mpg_sync *s, int param, mpg_group **group) {
  if (group) *group = NULL;
  if (!s || !group)
    return mpg__fail(MPG_ERR_INVALID, "mpg_sync_param_group: %s is NULL",
                     !s ? "sync" : "group");
  if (param < 0 || param >= s->layout.nparams)
    return mpg__fail(MPG_ERR_RANGE, "mpg_sync_param_group: param %d is outside 0..%d",
                     param, s->layout.nparams - 1);
  if (!s->committed)
    return mpg__fail(MPG_ERR_STATE,
                     "mpg_sync_param_group \"%s\": call mpg_sync_commit first",
                     s->layout.params[param].name);
  *group = s->layout.params[param].group;
  return MPG_OK;
}

mpg_status mpg_sync_get_stats(const mpg_sync *s, mpg_sync_stats *stats) {
  if (!s) return mpg__fail(MPG_ERR_INVALID, "mpg_sync_get_stats: sync is NULL");
  mpg_status st = mpg__abi_check(stats, MPG_SYNC_STATS_MAGIC, "mpg_sync_get_stats: stats",
                                 "MPG_SYNC_STATS_INIT");
  if (st) return st;
  mpg_sync_stats full = MPG_SYNC_STATS_INIT;
  full.num_params = s->layout.nparams;
  full.num_buffers = s->layout.nbuffers;
  full.num_buckets = s->layout.nbuckets;
  full.total_bytes = s->layout.total_bytes;
  full.launched_buckets = s->step.launched_buckets;
  if (s->opts.sync.mode == MPG_SYNC_SHARD && s->committed) {
    full.shard_elems = s->shard.state_elems;
    full.pad_elems = s->shard.pad_elems;
    full.shard_size = mpg_group_size(s->shard.shard_group);
  }
  for (int b = 0; b < s->layout.nbuffers; b++)
    if (s->layout.buffers[b].shm) {
      /* A buffer counts once; its bytes are both segments' (gradients,
       * and in shard mode its parameters'). */
      full.shm_buffers++;
      full.shm_bytes += mpg__shm_mapped_bytes(s->layout.buffers[b].shm);
      if (s->layout.buffers[b].param_shm)
        full.shm_bytes += mpg__shm_mapped_bytes(s->layout.buffers[b].param_shm);
    }
  mpg__abi_out(stats, &full, MPG__ABI_END(mpg_sync_stats));
  return MPG_OK;
}

int mpg_sync_grads_valid(const mpg_sync *s) { return s ? s->step.grads_valid : 0; }
