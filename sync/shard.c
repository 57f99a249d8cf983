/* Shard mode (opts.sync.mode = MPG_SYNC_SHARD): a distributed optimizer and
 * HSDP on top of the replicate layout (see include/meshpg.h, "Sharded data
 * parallel", and sync_core.h).
 *
 *  - Groups: the shard group (shard_dims, default the default reduce
 *    group's dims) and, with replicate_dims, the replicate group.  The
 *    default reduce group then spans both, so that params kept replicated
 *    (their own reduce_dims aside) reduce over the whole data-parallel
 *    group.
 *  - Expert domain: params whose reduce group is expert_shard_dims' (by
 *    default "edp" with an expert grid) shard over that group the same
 *    way, with their own pad and slices.  optimizer_instances N > 1 cuts
 *    each domain's group into Megatron's intra/inter partial groups
 *    (mpg_ctx_group_partial): shard over intra, replicate over inter.
 *  - Sharded buffers: the default group's buffers with no tied group.  In
 *    them params start on 64 elements and each bucket ends on a multiple of
 *    lcm(S, 128) (layout.c asks mpg__sync_shard_pad), so each bucket cuts
 *    into S equal slices; position r of the shard group owns slice r.
 *  - Step: a ready bucket is reduce-scattered in place (recv = slice r of
 *    send, NCCL's in-place rule), scaled like replicate mode; with a
 *    replicate group the slice is then all-reduced (sum) over it: at once
 *    on a backend that orders one stream (nccl), else in finish, in bucket
 *    order, after each reduce-scatter completed.  Either way every rank
 *    issues them in the same order.
 *  - State: slices in bucket order, then the replicated params whole, in
 *    id order, make up this rank's optimizer-state space (shard_elems).
 *  - Gather: the parameter buffers mirror the gradient buffers; buckets are
 *    all-gathered in place over the shard group in forward order (the
 *    reverse of launch order), one ahead of the trainer's first use; in
 *    the buffer's second shared-memory segment when its gradients are in
 *    shared memory (layout.c; across hosts hierarchically), else by the
 *    backend. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sync_core.h"

static size_t gcd_size(size_t a, size_t b) {
  while (b) {
    size_t t = a % b;
    a = b;
    b = t;
  }
  return a;
}

static size_t lcm_size(size_t a, size_t b) { return a / gcd_size(a, b) * b; }

size_t mpg__sync_shard_pad(const mpg_sync *s, int d) {
  size_t S = (size_t)mpg_group_size(s->shard.domains[d].shard);
  size_t pad = lcm_size(S, 128);
  return s->opts.sync.pad_for_nccl ? lcm_size(pad, 65536) : pad;
}

int mpg__sync_shard_domain(const mpg_sync *s, const mpg_group *g) {
  for (int d = 0; d < s->shard.ndomains; d++)
    if (s->shard.domains[d].reduce == g) return d;
  return -1;
}

/* optimizer_instances > 1: the domain's shard group becomes the intra
 * part of `names`' group and its replicate group the inter group. */
static mpg_status partial_domain(mpg_sync *s, struct sdomain *d, const char *names,
                                 const char *what) {
  int n = s->opts.sync.optimizer_instances;
  if (n == 1) return MPG_OK;
  mpg_status st = mpg_ctx_group_partial(s->ctx, names, n, MPG_PARTIAL_INTRA, &d->shard);
  if (!st) st = mpg_ctx_group_partial(s->ctx, names, n, MPG_PARTIAL_INTER, &d->replicate);
  if (st)
    return mpg__fail_wrap(st, "mpg_sync_create: opts.sync.optimizer_instances = %d over the %s "
                          "group \"%s\"", n, what, names);
  if (mpg_group_size(d->replicate) > 1) s->shard.any_replicate = 1;
  return MPG_OK;
}

/* The expert domain: expert_shard_dims, by default "edp" when the mesh has
 * an expert grid. */
static mpg_status expert_domain(mpg_sync *s) {
  const char *dims = s->shard.expert_dims;
  if (!dims) {
    if (mpg_mesh_expert_ndims(s->mesh) <= 0) return MPG_OK;
    dims = "edp";
  }
  if (!dims[0]) return MPG_OK; /* "": expert params stay replicated */
  unsigned mask;
  mpg_status st = mpg__mesh_parse_dims(s->mesh, dims, 0, "mpg_sync_create: opts.sync.expert_shard_dims",
                                       &mask, NULL, NULL);
  if (st) return st;
  if (mask == s->default_mask)
    return mpg__fail(MPG_ERR_INVALID,
                     "mpg_sync_create: opts.sync.expert_shard_dims \"%s\" is the data-parallel "
                     "group %s itself; name the expert group (\"edp\") or \"none\"", dims,
                     s->default_desc);
  char names[MPG_MAX_DIMS * MPG_NAME_MAX];
  mpg__mesh_mask_names(s->mesh, mask, ",", names, sizeof names);
  struct sdomain *d = &s->shard.domains[1];
  if ((st = mpg_ctx_group_dims(s->ctx, names, &d->reduce)))
    return mpg__fail_wrap(st, "mpg_sync_create: expert shard group \"%s\"", names);
  d->shard = d->reduce;
  d->replicate = NULL;
  s->shard.ndomains = 2;
  return partial_domain(s, d, names, "expert");
}

mpg_status mpg__sync_shard_groups(mpg_sync *s) {
  if (s->opts.sync.fsdp_owns_dp)
    return mpg__fail(MPG_ERR_INVALID,
                     "mpg_sync_create: opts.sync.mode = MPG_SYNC_SHARD with fsdp_owns_dp: the "
                     "shard mode owns dp itself (it reduce-scatters over dp_cp, or "
                     "shard_dims); leave fsdp_owns_dp at 0");
  const mpg_sync_settings *o = &s->opts.sync; /* the arrays live in s */
  s->shard.shard_dims = o->shard_dims[0] ? o->shard_dims : NULL;
  s->shard.replicate_dims = o->replicate_dims[0] ? o->replicate_dims : NULL;
  s->shard.expert_dims = !o->expert_shard_dims[0]                     ? NULL
                         : strcmp(o->expert_shard_dims, "none") == 0 ? ""
                                                                     : o->expert_shard_dims;
  if (o->optimizer_instances > 1 && s->shard.replicate_dims)
    return mpg__fail(MPG_ERR_INVALID,
                     "mpg_sync_create: opts.sync.optimizer_instances = %d and "
                     "opts.sync.replicate_dims = \"%s\" both say how to replicate the "
                     "shards; keep one",
                     o->optimizer_instances, s->shard.replicate_dims);
  unsigned smask = s->default_mask, rmask = 0;
  mpg_status st;
  if (s->shard.shard_dims &&
      (st = mpg__mesh_parse_dims(s->mesh, s->shard.shard_dims, 0,
                                 "mpg_sync_create: opts.sync.shard_dims", &smask, NULL, NULL)))
    return st;
  if (s->shard.replicate_dims &&
      (st = mpg__mesh_parse_dims(s->mesh, s->shard.replicate_dims, 0,
                                 "mpg_sync_create: opts.sync.replicate_dims", &rmask, NULL, NULL)))
    return st;
  if (smask & rmask) {
    char both[MPG_MAX_DIMS * MPG_NAME_MAX];
    mpg__mesh_mask_names(s->mesh, smask & rmask, ",", both, sizeof both);
    return mpg__fail(MPG_ERR_INVALID,
                     "mpg_sync_create: opts.sync.shard_dims \"%s\" and opts.sync.replicate_dims "
                     "\"%s\" share the dims %s",
                     s->shard.shard_dims ? s->shard.shard_dims : s->default_desc,
                     s->shard.replicate_dims, both);
  }
  /* Created in a fixed order on every rank: shard, replicate, their union
   * (the default group, for params kept replicated). */
  char names[MPG_MAX_DIMS * MPG_NAME_MAX];
  if (s->shard.shard_dims || rmask) {
    if (smask) {
      mpg__mesh_mask_names(s->mesh, smask, ",", names, sizeof names);
      if ((st = mpg_ctx_group_dims(s->ctx, names, &s->shard.shard_group)))
        return mpg__fail_wrap(st, "mpg_sync_create: shard group \"%s\"", names);
    } else {
      s->shard.shard_group = s->default_group; /* a one-rank group: nothing to shard */
    }
  } else {
    s->shard.shard_group = s->default_group;
  }
  if (rmask) {
    mpg__mesh_mask_names(s->mesh, rmask, ",", names, sizeof names);
    if ((st = mpg_ctx_group_dims(s->ctx, names, &s->shard.replicate_group)))
      return mpg__fail_wrap(st, "mpg_sync_create: replicate group \"%s\"", names);
  }
  if (smask | rmask) {
    mpg__mesh_mask_names(s->mesh, smask | rmask, ",", names, sizeof names);
    if ((st = mpg_ctx_group_dims(s->ctx, names, &s->default_group)))
      return mpg__fail_wrap(st, "mpg_sync_create: data-parallel group \"%s\"", names);
    s->default_mask = smask | rmask;
  }
  /* Created in a fixed order on every rank: the data-parallel domain's
   * partial groups, then the expert domain's. */
  s->shard.ndomains = 1;
  s->shard.domains[0] =
      (struct sdomain){s->default_group, s->shard.shard_group, s->shard.replicate_group};
  if (s->shard.replicate_group) s->shard.any_replicate = 1;
  if (s->default_mask) {
    mpg__mesh_mask_names(s->mesh, s->default_mask, ",", names, sizeof names);
    if ((st = partial_domain(s, &s->shard.domains[0], names, "data-parallel"))) return st;
    s->shard.shard_group = s->shard.domains[0].shard;
    s->shard.replicate_group = s->shard.domains[0].replicate;
  }
  if (smask | rmask || s->opts.sync.optimizer_instances > 1)
    snprintf(s->default_desc, sizeof s->default_desc, "%s (shard %s%s%s)",
             mpg_group_name(s->default_group), mpg_group_name(s->shard.shard_group),
             s->shard.replicate_group ? ", replicate " : "",
             s->shard.replicate_group ? mpg_group_name(s->shard.replicate_group) : "");
  return expert_domain(s);
}

/* ------------------------------------------------------------------ */
/* Commit                                                              */
/* ------------------------------------------------------------------ */

/* The shard and replicate groups of bucket k's buffer. */
static mpg_group *shard_of(const mpg_sync *s, const sbucket *b) {
  return s->shard.domains[s->layout.buffers[b->buffer].domain].shard;
}
static mpg_group *replicate_of(const mpg_sync *s, const sbucket *b) {
  return s->shard.domains[s->layout.buffers[b->buffer].domain].replicate;
}

mpg_status mpg__sync_shard_commit(mpg_sync *s) {
  size_t state = 0;
  s->shard.nforward = 0;
  s->shard.forward_buckets = malloc(sizeof *s->shard.forward_buckets *
                                    (size_t)(s->layout.nbuckets ? s->layout.nbuckets : 1));
  if (!s->shard.forward_buckets) return mpg__fail(MPG_ERR_NOMEM, "mpg_sync_commit: out of memory");
  for (int k = 0; k < s->layout.nbuckets; k++) {
    sbucket *b = &s->layout.buckets[k];
    if (!s->layout.buffers[b->buffer].sharded) continue;
    b->slice = b->count / (size_t)mpg_group_size(shard_of(s, b));
    b->state_base = state;
    state += b->slice;
  }
  for (int k = s->layout.nbuckets - 1; k >= 0; k--)
    if (s->layout.buffers[s->layout.buckets[k].buffer].sharded)
      s->shard.forward_buckets[s->shard.nforward++] = k;
  for (int id = 0; id < s->layout.nparams; id++) {
    sparam *p = &s->layout.params[id];
    if (s->layout.buffers[p->buffer].sharded) continue;
    p->state_offset = state;
    state += p->count;
  }
  s->shard.state_elems = state;
  /* Padding of the sharded buffers: what no param covers. */
  s->shard.pad_elems = 0;
  for (int b = 0; b < s->layout.nbuffers; b++)
    if (s->layout.buffers[b].sharded) s->shard.pad_elems += s->layout.buffers[b].count;
  for (int id = 0; id < s->layout.nparams; id++)
    if (s->layout.buffers[s->layout.params[id].buffer].sharded)
      s->shard.pad_elems -= s->layout.params[id].count;
  /* The parameter buffers, zeroed like the gradients (in shared memory
   * already: made with the gradients' segment, layout.c). */
  for (int b = 0; b < s->layout.nbuffers; b++) {
    sbuffer *f = &s->layout.buffers[b];
    size_t bytes = f->count * mpg_dtype_size(f->dtype);
    if (f->param_shm) {
      s->layout.total_bytes += bytes;
      continue;
    }
    mpg_status st = mpg_ctx_mem_alloc(s->ctx, bytes, s->opts.register_buffers, &f->param_data);
    if (st)
      return mpg__fail_wrap(st, "mpg_sync_commit: parameter buffer %d (%s, %zu bytes)", b,
                            mpg_dtype_name(f->dtype), bytes);
    s->layout.total_bytes += bytes;
  }
  return MPG_OK;
}

/* ------------------------------------------------------------------ */
/* The step                                                            */
/* ------------------------------------------------------------------ */

/* f16/bf16 with reduce_dtype f32: reduced with f32 accumulation on every
 * backend (groups_internal.h). */
static int f32acc(const mpg_sync *s, mpg_dtype dt) {
  return (dt == MPG_F16 || dt == MPG_BF16) && s->opts.sync.reduce_dtype == MPG_REDUCE_F32;
}

/* The slice's all-reduce over the replicate group (sum: the reduce-scatter
 * scaled for both levels). */
static mpg_status replicate_slice(mpg_sync *s, int k) {
  sbucket *b = &s->layout.buckets[k];
  const sbuffer *f = &s->layout.buffers[b->buffer];
  size_t es = mpg_dtype_size(f->dtype);
  mpg_group *rep = replicate_of(s, b);
  char *slice = (char *)f->data + (b->offset + (size_t)mpg_group_position(shard_of(s, b)) * b->slice) * es;
  if (f32acc(s, f->dtype))
    return mpg__all_reduce_f32acc(rep, slice, slice, b->slice, f->dtype, MPG_OP_SUM, 1.0,
                                  s->stream, &b->replicate_work);
  return mpg_all_reduce(rep, slice, slice, b->slice, f->dtype, MPG_OP_SUM, s->stream,
                        &b->replicate_work);
}

mpg_status mpg__sync_shard_launch(mpg_sync *s, int k) {
  sbucket *b = &s->layout.buckets[k];
  const sbuffer *f = &s->layout.buffers[b->buffer];
  size_t es = mpg_dtype_size(f->dtype);
  mpg_group *shard = shard_of(s, b);
  char *data = (char *)f->data + b->offset * es;
  char *mine = data + (size_t)mpg_group_position(shard) * b->slice * es;
  int levels = replicate_of(s, b) != NULL;
  double scale = s->opts.grad_scale;
  /* Averaged over the whole domain (shard x replicate = its reduce group). */
  if (s->opts.sync.op == MPG_OP_AVG) scale /= mpg_group_size(f->group);
  /* One level, no extra scale: the backend's own average (or sum);
   * otherwise a sum pre-multiplied by 1/(shard x replicate) x grad_scale. */
  mpg_status st;
  mpg_op op = s->opts.grad_scale == 1.0 && !levels
                  ? (s->opts.sync.op == MPG_OP_AVG ? MPG_OP_AVG : MPG_OP_SUM)
              : scale == 1.0 ? MPG_OP_SUM : MPG__OP_PREMUL_SUM;
  if (f->shm)
    /* The shard group shares a node, or has the same number >= 2 on each
     * of several: each member reduces its own slice (the one of its
     * position in the shard group, as below) of everyone's bucket,
     * hierarchically across nodes (groups/shm/). */
    st = mpg__shm_reduce_scatter(f->shm, b->offset, b->slice, op, scale, &b->work);
  else if (f32acc(s, f->dtype))
    st = mpg__reduce_scatter_f32acc(shard, data, mine, b->slice, f->dtype, op, scale,
                                    s->stream, &b->work);
  else if (op == MPG__OP_PREMUL_SUM)
    st = mpg_reduce_scatter_scaled(shard, data, mine, b->slice, f->dtype, scale, s->stream,
                                   &b->work);
  else
    st = mpg_reduce_scatter(shard, data, mine, b->slice, f->dtype, op, s->stream, &b->work);
  if (st || !levels || !mpg__ctx_stream_ordered(s->ctx)) return st;
  /* Ordered on the stream after the reduce-scatter: post it now. */
  return replicate_slice(s, k);
}

mpg_status mpg__sync_shard_finish(mpg_sync *s, int *failed_bucket) {
  mpg_status first = MPG_OK;
  *failed_bucket = -1;
  if (!s->shard.any_replicate) return MPG_OK;
  /* The reduce-scatters were waited for by the caller (finish). */
  for (int k = 0; k < s->layout.nbuckets; k++) {
    sbucket *b = &s->layout.buckets[k];
    if (!s->layout.buffers[b->buffer].sharded || !b->launched || b->replicate_work || first ||
        !replicate_of(s, b))
      continue;
    mpg__sync_trace_tag(s, k);
    mpg_status st = replicate_slice(s, k);
    mpg__trace_tag(-1, 0, 0);
    if (st) {
      first = st;
      *failed_bucket = k;
    }
  }
  for (int k = 0; k < s->layout.nbuckets; k++) {
    sbucket *b = &s->layout.buckets[k];
    if (!b->replicate_work) continue;
    mpg_status st = mpg_work_wait(b->replicate_work);
    b->replicate_work = NULL;
    if (st && !first) {
      first = st;
      *failed_bucket = k;
    }
  }
  return first;
}

/* ------------------------------------------------------------------ */
/* Public: ranges, parameter views, gathers                             */
/* ------------------------------------------------------------------ */

/* A gather wait with no gather open: fine when the params are current
 * (gathered, or never stepped); an error after a finished step whose
 * update was never gathered (the other ranks' slices would be stale). */
static mpg_status no_gather(const mpg_sync *s, const char *fn) {
  if (!s->shard.gather_due) return MPG_OK;
  return mpg__fail(MPG_ERR_STATE,
                   "%s: step %ld finished but no gather was started since: call "
                   "mpg_sync_gather_begin after the optimizer step (the other ranks' "
                   "slices of the params are stale until then)",
                   fn, s->step.number);
}

static mpg_status shard_ready(const mpg_sync *s, const char *fn) {
  if (!s) return mpg__fail(MPG_ERR_INVALID, "%s: sync is NULL", fn);
  if (s->opts.sync.mode != MPG_SYNC_SHARD)
    return mpg__fail(MPG_ERR_STATE, "%s: the sync is in replicate mode (opts.sync.mode = "
                     "MPG_SYNC_SHARD, or [sync] mode = \"shard\", makes shards)", fn);
  if (!s->committed) return mpg__fail(MPG_ERR_STATE, "%s: call mpg_sync_commit first", fn);
  return MPG_OK;
}

mpg_status mpg_sync_get_shard(const mpg_sync *s, int param, mpg_shard_info *info) {
  mpg_status st = shard_ready(s, "mpg_sync_get_shard");
  if (st) return st;
  st = mpg__abi_check(info, MPG_SHARD_INFO_MAGIC, "mpg_sync_get_shard: info", "MPG_SHARD_INFO_INIT");
  if (st) return st;
  if (param < 0 || param >= s->layout.nparams)
    return mpg__fail(MPG_ERR_RANGE, "mpg_sync_get_shard: param %d is outside 0..%d", param,
                     s->layout.nparams - 1);
  const sparam *p = &s->layout.params[param];
  mpg_shard_info out = MPG_SHARD_INFO_INIT;
  if (!s->layout.buffers[p->buffer].sharded) {
    out.sharded = 0;
    out.param_offset = 0;
    out.count = p->count;
    out.shard_offset = p->state_offset;
  } else {
    const sbucket *b = &s->layout.buckets[p->bucket];
    size_t lo = b->offset + (size_t)mpg_group_position(shard_of(s, b)) * b->slice;
    size_t hi = lo + b->slice;
    size_t a = p->offset > lo ? p->offset : lo;
    size_t e = p->offset + p->count < hi ? p->offset + p->count : hi;
    out.sharded = 1;
    out.count = e > a ? e - a : 0;
    out.param_offset = out.count ? a - p->offset : 0;
    out.shard_offset = b->state_base + (out.count ? a - lo : 0);
  }
  mpg__abi_out(info, &out, MPG__ABI_END(mpg_shard_info));
  return MPG_OK;
}

mpg_status mpg_sync_param(mpg_sync *s, int param, void **data) {
  mpg_status st = shard_ready(s, "mpg_sync_param");
  if (st) return st;
  if (!data) return mpg__fail(MPG_ERR_INVALID, "mpg_sync_param: data is NULL");
  if (param < 0 || param >= s->layout.nparams)
    return mpg__fail(MPG_ERR_RANGE, "mpg_sync_param: param %d is outside 0..%d", param,
                     s->layout.nparams - 1);
  const sparam *p = &s->layout.params[param];
  const sbuffer *f = &s->layout.buffers[p->buffer];
  *data = (char *)f->param_data + p->offset * mpg_dtype_size(f->dtype);
  return MPG_OK;
}

/* Start the gather of forward position i. */
static mpg_status gather_start(mpg_sync *s, int i) {
  sbucket *b = &s->layout.buckets[s->shard.forward_buckets[i]];
  const sbuffer *f = &s->layout.buffers[b->buffer];
  size_t es = mpg_dtype_size(f->dtype);
  mpg_group *shard = shard_of(s, b);
  char *all = (char *)f->param_data + b->offset * es;
  char *mine = all + (size_t)mpg_group_position(shard) * b->slice * es;
  mpg__sync_trace_tag(s, s->shard.forward_buckets[i]);
  mpg_status st;
  if (f->param_shm)
    /* In shared memory: on one host each member copies the others'
     * slices of the bucket from their buffers into its own, in one pass;
     * across hosts after an all-gather between them (groups/shm/). */
    st = mpg__shm_all_gather(f->param_shm, b->offset, b->slice, &b->gather_work);
  else
    st = mpg_all_gather(shard, mine, all, b->slice, f->dtype, s->stream, &b->gather_work);
  mpg__trace_tag(-1, 0, 0);
  mpg__sync_abort_after(s, st); /* the peers' gathers go on: never pair with them */
  if (st)
    return mpg__fail_wrap(st, "sync gather: bucket %d (%s, %zu elements over \"%s\")",
                          s->shard.forward_buckets[i], mpg_dtype_name(f->dtype), b->count,
                          mpg_group_name(shard));
  s->shard.gather_started = i + 1;
  return MPG_OK;
}

/* Wait for forward positions up to `upto` (exclusive), starting any not
 * started yet.  The first failure's message is the one kept (the later
 * waits, which fail too once the context is aborted, write their own). */
static mpg_status gather_upto(mpg_sync *s, int upto) {
  mpg_status first = MPG_OK;
  mpg__saved_error why;
  while (s->shard.gather_waited < upto) {
    int i = s->shard.gather_waited;
    if (s->shard.gather_started <= i && !first && (first = gather_start(s, i)))
      mpg__error_save(&why);
    sbucket *b = &s->layout.buckets[s->shard.forward_buckets[i]];
    if (b->gather_work) {
      mpg_status st = mpg_work_wait(b->gather_work);
      b->gather_work = NULL;
      if (st && !first) {
        first = mpg__fail_wrap(st, "sync gather: waiting for bucket %d",
                               s->shard.forward_buckets[i]);
        mpg__error_save(&why);
      }
    }
    s->shard.gather_waited++;
  }
  return first ? mpg__error_restore(first, &why) : MPG_OK;
}

/* The caller's stream reads the gathered params after the sync's. */
static mpg_status gather_end_wait(mpg_sync *s, mpg_status st) {
  mpg_status o = mpg_ctx_stream_order(s->ctx, s->shard.gather_caller_stream, s->stream);
  if (!st && o) st = mpg__fail_wrap(o, "sync gather: ordering the caller's stream");
  if (s->shard.gather_waited >= s->shard.nforward) s->shard.gather_open = 0;
  return st;
}

mpg_status mpg_sync_gather_begin(mpg_sync *s, void *stream) {
  mpg_status st = shard_ready(s, "mpg_sync_gather_begin");
  if (st) return st;
  if (s->step.open)
    return mpg__fail(MPG_ERR_STATE, "mpg_sync_gather_begin: step %ld is open; gather "
                     "after mpg_sync_finish and the optimizer step", s->step.number);
  if (s->shard.gather_open)
    return mpg__fail(MPG_ERR_STATE, "mpg_sync_gather_begin: the previous gather is still "
                     "open (%d of %d buckets waited); end it with mpg_sync_gather_all",
                     s->shard.gather_waited, s->shard.nforward);
  if (s->step.aborted)
    return mpg__fail(MPG_ERR_ABORTED, "mpg_sync_gather_begin: the context was aborted in "
                     "step %ld: %s", s->step.aborted_step, s->step.aborted_msg);
  /* The optimizer wrote the params on the caller's stream. */
  if ((st = mpg_ctx_stream_order(s->ctx, s->stream, stream))) {
    mpg__sync_abort_after(s, st); /* no gather posted here: the peers' go on */
    return mpg__fail_wrap(st, "mpg_sync_gather_begin: ordering the sync's stream");
  }
  s->shard.gather_caller_stream = stream;
  s->shard.gather_due = 0;
  s->shard.gather_open = 1;
  s->shard.gather_started = s->shard.gather_waited = 0;
  if (s->shard.nforward == 0) {
    s->shard.gather_open = 0;
    return MPG_OK;
  }
  return gather_start(s, 0);
}

mpg_status mpg_sync_gather_wait(mpg_sync *s, int param) {
  mpg_status st = shard_ready(s, "mpg_sync_gather_wait");
  if (st) return st;
  if (param < 0 || param >= s->layout.nparams)
    return mpg__fail(MPG_ERR_RANGE, "mpg_sync_gather_wait: param %d is outside 0..%d", param,
                     s->layout.nparams - 1);
  const sparam *p = &s->layout.params[param];
  if (!s->layout.buffers[p->buffer].sharded) return MPG_OK;
  if (!s->shard.gather_open) return no_gather(s, "mpg_sync_gather_wait");
  int pos = 0;
  while (pos < s->shard.nforward && s->shard.forward_buckets[pos] != p->bucket) pos++;
  if (pos < s->shard.gather_waited) return MPG_OK;
  st = gather_upto(s, pos + 1);
  /* Order the caller's stream first, then start the next bucket: the other
   * way round, the caller's forward on this bucket would also wait for the
   * next bucket's all-gather, which defeats the prefetch (L3). */
  st = gather_end_wait(s, st);
  if (!st && s->shard.gather_started == s->shard.gather_waited &&
      s->shard.gather_started < s->shard.nforward)
    st = gather_start(s, s->shard.gather_started); /* one ahead of forward */
  return st;
}

mpg_status mpg_sync_gather_all(mpg_sync *s) {
  mpg_status st = shard_ready(s, "mpg_sync_gather_all");
  if (st) return st;
  if (!s->shard.gather_open) return no_gather(s, "mpg_sync_gather_all");
  for (int i = s->shard.gather_started; i < s->shard.nforward && !st; i++) st = gather_start(s, i);
  mpg__saved_error why;
  if (st) mpg__error_save(&why);
  mpg_status w = gather_upto(s, s->shard.nforward);
  st = st ? mpg__error_restore(st, &why) : w; /* the first failure's message */
  return gather_end_wait(s, st);
}

void mpg__sync_gather_drop(mpg_sync *s) {
  if (!s->shard.forward_buckets) return;
  for (int i = 0; i < s->shard.nforward; i++) {
    sbucket *b = &s->layout.buckets[s->shard.forward_buckets[i]];
    if (b->gather_work) (void)mpg_work_wait(b->gather_work);
    b->gather_work = NULL;
    if (b->replicate_work) (void)mpg_work_wait(b->replicate_work);
    b->replicate_work = NULL;
  }
  s->shard.gather_open = 0;
}
