/* The sync module: gradient synchronisation over exactly the right groups.
 *
 * Layout (mpg_sync_commit)
 *  - Every parameter resolves to a reduce group (the sync's default, or the
 *    group of its own reduce_dims) and, optionally, a tied group.  Groups
 *    are created in a fixed order: the default at mpg_sync_create, then the
 *    distinct override dim sets at commit, sorted by their mesh-dim mask, so
 *    that every rank enters the world-collective creations alike.
 *  - One buffer per (dtype, reduce group, tied group), allocated with
 *    mpg_ctx_mem_alloc (host or device memory: the groups layer decides).
 *    Parameters are laid out in reverse registration order (backward
 *    order), each view starting on a 64-byte boundary; the padding is zero
 *    and stays zero.
 *  - Buckets are slices of one buffer (never two): walking a buffer in
 *    backward order, a parameter joins the open bucket while the slice
 *    stays within the cap (first_bucket_mb for the buffer's first bucket,
 *    bucket_mb after); otherwise it opens a new one, so a parameter larger
 *    than the cap has a bucket of its own.  Buckets are numbered in launch
 *    order: by the backward position of their last parameter, i.e. the
 *    order in which they complete when gradients arrive in backward order.
 *
 * Step (mpg_sync_begin .. mpg_sync_finish)
 *  - On the last micro-batch, mark_ready counts down its bucket and then
 *    launches, in bucket order, every bucket from the next unlaunched one
 *    that has all its gradients: a bucket that completes early waits for
 *    its predecessors, so every rank issues its collectives in one order.
 *  - finish launches the rest, waits for all, then sums the tied buffers
 *    over their tied groups (after the reduce-group average) and orders
 *    the caller's stream after the sync's own.
 *  - Any failure fails the whole step: nothing more is launched, finish
 *    still waits for (and releases) what was launched, the gradients are
 *    marked invalid and the first error is returned again by finish.  A
 *    timeout or abort is final for the context (the groups layer aborts
 *    it): the next begin says so.
 *
 * Nothing here knows which backend runs: only the public groups API. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define ALIGN_BYTES 64
#define MSG_MAX 1024
#define MIB 1048576.0

typedef struct sparam {
  char *name;
  size_t count;
  mpg_dtype dtype;
  char *dims;       /* the caller's reduce_dims, NULL: the default */
  unsigned mask;    /* mesh dims of `dims` */
  mpg_group *tied;  /* NULL: none */
  mpg_group *group; /* reduce group (commit) */
  int buffer;       /* (commit) */
  int bucket;       /* launch position of its bucket (commit) */
  size_t offset;    /* first element in its buffer (commit) */
  int ready;        /* marked in this step */
} sparam;

typedef struct sbuffer {
  mpg_dtype dtype;
  mpg_group *group;
  mpg_group *tied;
  size_t count; /* elements, with padding */
  void *data;
  int nparams;
  int nbuckets;
  int open;            /* its bucket being filled at commit, -1: none */
} sbuffer;

typedef struct sbucket {
  int buffer;
  size_t offset, count; /* elements of the buffer */
  int first, last;      /* param ids: first / last in backward order */
  int nparams;
  int key;              /* backward position of `last` (launch order) */
  int pending;          /* params not yet ready in this step */
  mpg_work *work;       /* in flight */
  int launched;         /* in this step */
} sbucket;

struct mpg_sync {
  mpg_ctx *ctx;
  const mpg_mesh *mesh;
  mpg_sync_opts opts;
  char *default_dims;  /* copy of opts.default_dims (or NULL) */
  char default_desc[320]; /* how the default group was chosen, for messages */
  mpg_group *default_group;
  unsigned default_mask; /* 0 when the default has no dims (size-1 group) */
  void *stream;          /* the sync's own stream (NULL off nccl) */
  int committed;

  sparam *params;
  int nparams, cap;
  int *hash;             /* open addressing over names: param id or -1 */
  int hash_cap;

  sbuffer *buffers;
  int nbuffers;
  sbucket *buckets;      /* in launch order */
  int nbuckets;
  int *tied;             /* buffers with a tied group, in a rank-independent order */
  mpg_work **tied_work;
  int ntied;
  size_t total_bytes;
  long launched_total;

  /* The step. */
  int in_step;
  long step;
  int last;
  void *caller;          /* the caller's stream */
  int ordered;           /* the sync's stream has work of this step */
  int next_launch;       /* first bucket not launched */
  int oldest;            /* first launched bucket not seen complete */
  int zero_pending;      /* zeroed on own stream since the last begin */
  mpg_status step_status;
  char step_msg[2 * MSG_MAX];
  int valid;
  mpg_status dead;       /* the context was aborted (TIMEOUT / ABORTED) */
  long dead_step;
  char dead_msg[2 * MSG_MAX];
};

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

/* The thread's last error, copied (the message buffer is reused by
 * mpg__fail, so it may not be passed to it directly). */
static void keep_error(char *buf, size_t n) {
  snprintf(buf, n, "%s", mpg_last_error());
}

static size_t mib_bytes(double mb) {
  double b = mb * MIB;
  if (b >= (double)(SIZE_MAX / 4)) return SIZE_MAX / 4;
  return b < 1.0 ? 1 : (size_t)b;
}

/* Names "dp_cp,tp" (dims, flattened sets, "world") -> mask of mesh dims.
 * `what` prefixes messages ("param \"ln\": reduce_dims"). */
static mpg_status dims_mask(const mpg_mesh *mesh, const char *names,
                            const char *what, unsigned *mask) {
  *mask = 0;
  const char *p = names;
  for (;;) {
    const char *e = strchr(p, ',');
    size_t n = e ? (size_t)(e - p) : strlen(p);
    while (n && (*p == ' ' || *p == '\t')) p++, n--;
    while (n && (p[n - 1] == ' ' || p[n - 1] == '\t')) n--;
    char name[MPG_NAME_MAX];
    if (n == 0 || n >= sizeof name)
      return mpg__fail(MPG_ERR_INVALID,
                       "%s \"%s\": expected comma-separated dim or set names "
                       "such as \"dp_cp,tp\"",
                       what, names);
    memcpy(name, p, n);
    name[n] = '\0';
    int set, dims[MPG_MAX_DIMS], nd = 0;
    if (mpg_mesh_dimset_find(mesh, name, &set) != MPG_OK) {
      char msg[MSG_MAX];
      keep_error(msg, sizeof msg);
      return mpg__fail(MPG_ERR_NOT_FOUND, "%s \"%s\": %s", what, names, msg);
    }
    mpg_mesh_dimset_dims(mesh, set, dims, &nd);
    for (int i = 0; i < nd; i++) *mask |= 1u << dims[i];
    if (!e) break;
    p = e + 1;
  }
  return MPG_OK;
}

/* "dp,cp,tp": the dims of a mask in mesh order, for mpg_ctx_group_dims. */
static void mask_names(const mpg_mesh *mesh, unsigned mask, const char *sep,
                       char *buf, size_t n) {
  size_t k = 0;
  buf[0] = '\0';
  for (int d = 0; d < mpg_mesh_ndims(mesh); d++) {
    if (!(mask & (1u << d))) continue;
    const char *name;
    mpg_mesh_dim(mesh, d, &name, NULL);
    if (k < n) k += (size_t)snprintf(buf + k, n - k, "%s%s", k ? sep : "", name);
  }
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

mpg_status mpg_sync_opts_from_spec(const mpg_spec *spec, mpg_sync_opts *opts) {
  if (!spec || !opts)
    return mpg__fail(MPG_ERR_INVALID, "mpg_sync_opts_from_spec: %s is NULL",
                     !spec ? "spec" : "opts");
  if (spec->magic != MPG_SPEC_MAGIC || spec->size < sizeof(mpg_spec))
    return mpg__fail(MPG_ERR_INVALID,
                     "mpg_sync_opts_from_spec: spec was not set up with mpg_spec_init");
  if (opts->magic != MPG_SYNC_OPTS_MAGIC || opts->size < sizeof(mpg_sync_opts))
    return mpg__fail(MPG_ERR_INVALID,
                     "mpg_sync_opts_from_spec: opts was not initialised with "
                     "MPG_SYNC_OPTS_INIT");
  opts->fsdp_owns_dp = spec->fsdp_owns_dp;
  opts->op = spec->op;
  opts->bucket_mb = spec->bucket_mb;
  opts->first_bucket_mb = spec->first_bucket_mb;
  opts->reduce_dtype = spec->reduce_dtype;
  return MPG_OK;
}

static mpg_status check_opts(const mpg_sync_opts *o) {
  if (o->magic != MPG_SYNC_OPTS_MAGIC || o->size < sizeof(mpg_sync_opts))
    return mpg__fail(MPG_ERR_INVALID,
                     "mpg_sync_create: opts was not initialised with MPG_SYNC_OPTS_INIT");
  if (o->op != MPG_SYNC_AVG && o->op != MPG_SYNC_SUM)
    return mpg__fail(MPG_ERR_INVALID,
                     "mpg_sync_create: opts.op is %d, expected MPG_SYNC_AVG (0) or "
                     "MPG_SYNC_SUM (1)",
                     (int)o->op);
  if (o->reduce_dtype != MPG_REDUCE_NATIVE && o->reduce_dtype != MPG_REDUCE_F32)
    return mpg__fail(MPG_ERR_INVALID,
                     "mpg_sync_create: opts.reduce_dtype is %d, expected "
                     "MPG_REDUCE_NATIVE (0) or MPG_REDUCE_F32 (1)",
                     (int)o->reduce_dtype);
  if (!(o->bucket_mb > 0) || !isfinite(o->bucket_mb))
    return mpg__fail(MPG_ERR_INVALID,
                     "mpg_sync_create: opts.bucket_mb is %g, expected a number > 0",
                     o->bucket_mb);
  if (!(o->first_bucket_mb > 0) || !isfinite(o->first_bucket_mb))
    return mpg__fail(MPG_ERR_INVALID,
                     "mpg_sync_create: opts.first_bucket_mb is %g, expected a number > 0",
                     o->first_bucket_mb);
  if (!isfinite(o->grad_scale))
    return mpg__fail(MPG_ERR_INVALID,
                     "mpg_sync_create: opts.grad_scale is %g, expected a finite number",
                     o->grad_scale);
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
    mask_names(mesh, s->default_mask, ",", names, sizeof names);
  } else if (s->opts.fsdp_owns_dp) {
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
      mask_names(mesh, (1u << mpg_mesh_ndims(mesh)) - 1u, ", ", dims, sizeof dims);
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
  if (st) {
    char msg[MSG_MAX];
    keep_error(msg, sizeof msg);
    return mpg__fail(st, "mpg_sync_create: default reduce group \"%s\": %s", names, msg);
  }
  return MPG_OK;
}

mpg_status mpg_sync_create(mpg_ctx *ctx, const mpg_sync_opts *opts,
                           mpg_sync **out) {
  if (!out) return mpg__fail(MPG_ERR_INVALID, "mpg_sync_create: out is NULL");
  *out = NULL;
  if (!ctx) return mpg__fail(MPG_ERR_INVALID, "mpg_sync_create: ctx is NULL");
  mpg_sync_opts defaults = MPG_SYNC_OPTS_INIT;
  if (!opts) opts = &defaults;
  mpg_status st = check_opts(opts);
  if (st) return st;

  mpg_sync *s = calloc(1, sizeof *s);
  if (!s) return mpg__fail(MPG_ERR_NOMEM, "mpg_sync_create: out of memory");
  s->ctx = ctx;
  s->mesh = mpg_ctx_mesh(ctx);
  s->opts = *opts;
  s->valid = 1;
  if (opts->default_dims && !(s->default_dims = dup_str(opts->default_dims))) {
    free(s);
    return mpg__fail(MPG_ERR_NOMEM, "mpg_sync_create: out of memory");
  }
  s->opts.default_dims = s->default_dims;
  st = make_default_group(s);
  if (!st) {
    st = mpg_ctx_stream_create(ctx, &s->stream);
    if (st) {
      char msg[MSG_MAX];
      keep_error(msg, sizeof msg);
      st = mpg__fail(st, "mpg_sync_create: its stream: %s", msg);
    }
  }
  if (st) {
    free(s->default_dims);
    free(s);
    return st;
  }
  mpg__log(1, "sync: rank %d: default reduce group %s = \"%s\" of %d ranks",
           mpg_ctx_rank(ctx), s->default_desc, mpg_group_name(s->default_group),
           mpg_group_size(s->default_group));
  *out = s;
  return MPG_OK;
}

/* Wait for (and release) every bucket still in flight. */
static void wait_all(mpg_sync *s) {
  for (int k = 0; k < s->nbuckets; k++) {
    sbucket *b = &s->buckets[k];
    if (!b->launched || !b->work) continue;
    (void)mpg_work_wait(b->work);
    b->work = NULL;
  }
}

static void free_layout(mpg_sync *s) {
  for (int i = 0; i < s->nbuffers; i++)
    if (s->buffers[i].data) mpg_ctx_mem_free(s->ctx, s->buffers[i].data);
  free(s->buffers);
  free(s->buckets);
  free(s->tied);
  free(s->tied_work);
  s->buffers = NULL;
  s->buckets = NULL;
  s->tied = NULL;
  s->tied_work = NULL;
  s->nbuffers = s->nbuckets = s->ntied = 0;
  s->total_bytes = 0;
}

mpg_status mpg_sync_destroy(mpg_sync *s) {
  if (!s) return MPG_OK;
  mpg_status first = MPG_OK;
  char msg[MSG_MAX] = "";
  /* Never free memory a collective may still write: release what a step
   * left in flight first (bounded by the context's timeout). */
  if (s->in_step) wait_all(s);
  for (int i = 0; i < s->nbuffers; i++) {
    if (!s->buffers[i].data) continue;
    mpg_status st = mpg_ctx_mem_free(s->ctx, s->buffers[i].data);
    s->buffers[i].data = NULL;
    if (st && !first) {
      first = st;
      snprintf(msg, sizeof msg, "mpg_sync_destroy: freeing buffer %d: %s", i,
               mpg_last_error());
    }
  }
  if (s->stream) {
    mpg_status st = mpg_ctx_stream_destroy(s->ctx, s->stream);
    if (st && !first) {
      first = st;
      snprintf(msg, sizeof msg, "mpg_sync_destroy: its stream: %s", mpg_last_error());
    }
  }
  free_layout(s);
  for (int i = 0; i < s->nparams; i++) {
    free(s->params[i].name);
    free(s->params[i].dims);
  }
  free(s->params);
  free(s->hash);
  free(s->default_dims);
  free(s);
  return first ? mpg__fail(first, "%s", msg) : MPG_OK;
}

/* ------------------------------------------------------------------ */
/* Parameters                                                          */
/* ------------------------------------------------------------------ */

static uint64_t hash_name(const char *s) {
  uint64_t h = 1469598103934665603ull;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

/* The id of `name`, or -1; *slot gets where it would go. */
static int hash_find(const mpg_sync *s, const char *name, int *slot) {
  unsigned m = (unsigned)s->hash_cap - 1;
  unsigned i = (unsigned)hash_name(name) & m;
  while (s->hash[i] >= 0) {
    if (strcmp(s->params[s->hash[i]].name, name) == 0) return s->hash[i];
    i = (i + 1) & m;
  }
  if (slot) *slot = (int)i;
  return -1;
}

static int hash_grow(mpg_sync *s) {
  int cap = s->hash_cap ? s->hash_cap * 2 : 64;
  int *h = malloc(sizeof *h * (size_t)cap);
  if (!h) return -1;
  for (int i = 0; i < cap; i++) h[i] = -1;
  free(s->hash);
  s->hash = h;
  s->hash_cap = cap;
  for (int id = 0; id < s->nparams; id++) {
    int slot = 0;
    hash_find(s, s->params[id].name, &slot);
    s->hash[slot] = id;
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
  if (opts && (opts->magic != MPG_PARAM_OPTS_MAGIC || opts->size < sizeof(mpg_param_opts)))
    return mpg__fail(MPG_ERR_INVALID,
                     "param \"%s\": opts was not initialised with MPG_PARAM_OPTS_INIT",
                     name);
  if (s->opts.grad_scale != 1.0 && !dtype_is_float(dtype))
    return mpg__fail(MPG_ERR_INVALID,
                     "param \"%s\": dtype %s cannot take grad_scale %g (a scaled "
                     "sum needs a floating dtype)",
                     name, mpg_dtype_name(dtype), s->opts.grad_scale);
  if (s->nparams >= (1 << 28))
    return mpg__fail(MPG_ERR_RANGE, "param \"%s\": too many parameters (%d)", name,
                     s->nparams);
  if (s->hash_cap == 0 || (s->nparams + 1) * 2 > s->hash_cap) {
    if (hash_grow(s)) return mpg__fail(MPG_ERR_NOMEM, "param \"%s\": out of memory", name);
  }
  int slot = -1, dup = hash_find(s, name, &slot);
  if (dup >= 0)
    return mpg__fail(MPG_ERR_INVALID, "param \"%s\": the name is already registered (id %d)",
                     name, dup);

  unsigned mask = 0;
  const char *dims = opts ? opts->reduce_dims : NULL;
  if (dims) {
    char what[160];
    snprintf(what, sizeof what, "param \"%s\": reduce_dims", name);
    mpg_status st = dims_mask(s->mesh, dims, what, &mask);
    if (st) return st;
  }
  if (s->nparams == s->cap) {
    int cap = s->cap ? s->cap * 2 : 32;
    sparam *p = realloc(s->params, sizeof *p * (size_t)cap);
    if (!p) return mpg__fail(MPG_ERR_NOMEM, "param \"%s\": out of memory", name);
    s->params = p;
    s->cap = cap;
  }
  sparam *p = &s->params[s->nparams];
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
  p->tied = opts ? opts->tied_group : NULL;
  p->buffer = p->bucket = -1;
  s->hash[slot] = s->nparams;
  *param = s->nparams++;
  return MPG_OK;
}

/* ------------------------------------------------------------------ */
/* Commit: groups, buffers, buckets                                     */
/* ------------------------------------------------------------------ */

static int cmp_unsigned(const void *a, const void *b) {
  unsigned x = *(const unsigned *)a, y = *(const unsigned *)b;
  return x < y ? -1 : x > y;
}

/* Resolve every parameter's reduce group.  Override groups are created in
 * ascending mask order, whatever the registration order. */
static mpg_status resolve_groups(mpg_sync *s) {
  unsigned masks[256];
  mpg_group *groups[256];
  int n = 0;
  for (int i = 0; i < s->nparams; i++) {
    sparam *p = &s->params[i];
    if (!p->dims || (s->default_mask && p->mask == s->default_mask)) continue;
    int seen = 0;
    for (int j = 0; j < n && !seen; j++) seen = masks[j] == p->mask;
    if (!seen) masks[n++] = p->mask; /* masks < 2^MPG_MAX_DIMS = 256 */
  }
  qsort(masks, (size_t)n, sizeof masks[0], cmp_unsigned);
  for (int j = 0; j < n; j++) {
    char names[MPG_MAX_DIMS * MPG_NAME_MAX];
    mask_names(s->mesh, masks[j], ",", names, sizeof names);
    mpg_status st = mpg_ctx_group_dims(s->ctx, names, &groups[j]);
    if (st) {
      char msg[MSG_MAX];
      keep_error(msg, sizeof msg);
      const char *who = "";
      for (int i = 0; i < s->nparams && !who[0]; i++)
        if (s->params[i].dims && s->params[i].mask == masks[j]) who = s->params[i].name;
      return mpg__fail(st, "mpg_sync_commit: reduce group \"%s\" (of param \"%s\"): %s",
                       names, who, msg);
    }
  }
  for (int i = 0; i < s->nparams; i++) {
    sparam *p = &s->params[i];
    p->group = s->default_group;
    if (!p->dims) continue;
    for (int j = 0; j < n; j++)
      if (masks[j] == p->mask) p->group = groups[j];
  }
  return MPG_OK;
}

/* Tied buffers are summed in an order every member of a tied group
 * computes alike: by tied group name, reduce group name, dtype. */
typedef struct tied_ref {
  const char *tied, *group;
  int dtype, index;
} tied_ref;

static int cmp_tied(const void *a, const void *b) {
  const tied_ref *x = a, *y = b;
  int c = strcmp(x->tied, y->tied);
  if (!c) c = strcmp(x->group, y->group);
  if (!c) c = x->dtype - y->dtype;
  return c;
}

typedef struct bucket_ref {
  int key, index;
} bucket_ref;

static int cmp_bucket_ref(const void *a, const void *b) {
  const bucket_ref *x = a, *y = b;
  return x->key < y->key ? -1 : x->key > y->key;
}

static mpg_status layout(mpg_sync *s) {
  int n = s->nparams;
  /* Buffers, in order of first appearance in backward order. */
  s->buffers = calloc((size_t)(n ? n : 1), sizeof *s->buffers);
  s->buckets = calloc((size_t)(n ? n : 1), sizeof *s->buckets);
  if (!s->buffers || !s->buckets) return mpg__fail(MPG_ERR_NOMEM, "mpg_sync_commit: out of memory");
  for (int id = n - 1; id >= 0; id--) {
    sparam *p = &s->params[id];
    int b = 0;
    while (b < s->nbuffers && !(s->buffers[b].dtype == p->dtype &&
                                s->buffers[b].group == p->group &&
                                s->buffers[b].tied == p->tied))
      b++;
    sbuffer *buf = &s->buffers[b];
    if (b == s->nbuffers) {
      s->nbuffers++;
      buf->dtype = p->dtype;
      buf->group = p->group;
      buf->tied = p->tied;
      buf->open = -1;
    }
    size_t dsize = mpg_dtype_size(p->dtype), align = ALIGN_BYTES / dsize;
    size_t off = (buf->count + align - 1) / align * align;
    if (off > (SIZE_MAX / 4) / dsize - p->count)
      return mpg__fail(MPG_ERR_RANGE,
                       "mpg_sync_commit: param \"%s\": the %s gradient buffer of group "
                       "\"%s\" would exceed the address space",
                       p->name, mpg_dtype_name(p->dtype), mpg_group_name(p->group));
    p->buffer = b;
    p->offset = off;
    buf->count = off + p->count;
    buf->nparams++;

    /* Bucket: join the buffer's open bucket while the slice fits. */
    if (buf->open >= 0) {
      /* The open bucket is the buffer's latest: its first when it is its
       * only one. */
      size_t cap = mib_bytes(buf->nbuckets == 1 ? s->opts.first_bucket_mb
                                                : s->opts.bucket_mb);
      sbucket *k = &s->buckets[buf->open];
      size_t span = (p->offset + p->count - k->offset) * dsize;
      if (span <= cap) {
        k->count = p->offset + p->count - k->offset;
        k->last = id;
        k->nparams++;
        k->key = n - 1 - id;
        p->bucket = buf->open;
        continue;
      }
    }
    sbucket *k = &s->buckets[s->nbuckets];
    k->buffer = b;
    k->offset = p->offset;
    k->count = p->count;
    k->first = k->last = id;
    k->nparams = 1;
    k->key = n - 1 - id;
    p->bucket = s->nbuckets;
    buf->open = s->nbuckets++;
    buf->nbuckets++;
  }
  /* Launch order: by the backward position of each bucket's last param. */
  bucket_ref *refs = malloc(sizeof *refs * (size_t)(s->nbuckets ? s->nbuckets : 1));
  int *where = malloc(sizeof *where * (size_t)(s->nbuckets ? s->nbuckets : 1));
  sbucket *sorted = malloc(sizeof *sorted * (size_t)(s->nbuckets ? s->nbuckets : 1));
  if (!refs || !where || !sorted) {
    free(refs);
    free(where);
    free(sorted);
    return mpg__fail(MPG_ERR_NOMEM, "mpg_sync_commit: out of memory");
  }
  for (int k = 0; k < s->nbuckets; k++) refs[k] = (bucket_ref){s->buckets[k].key, k};
  qsort(refs, (size_t)s->nbuckets, sizeof *refs, cmp_bucket_ref);
  for (int k = 0; k < s->nbuckets; k++) {
    sorted[k] = s->buckets[refs[k].index];
    where[refs[k].index] = k;
  }
  for (int id = 0; id < n; id++) s->params[id].bucket = where[s->params[id].bucket];
  free(s->buckets);
  s->buckets = sorted;
  free(refs);
  free(where);

  /* Tied buffers, in an order every member of a tied group agrees on. */
  for (int b = 0; b < s->nbuffers; b++) s->ntied += s->buffers[b].tied != NULL;
  if (s->ntied) {
    s->tied = malloc(sizeof *s->tied * (size_t)s->ntied);
    s->tied_work = calloc((size_t)s->ntied, sizeof *s->tied_work);
    if (!s->tied || !s->tied_work) return mpg__fail(MPG_ERR_NOMEM, "mpg_sync_commit: out of memory");
    tied_ref *refs = malloc(sizeof *refs * (size_t)s->ntied);
    if (!refs) return mpg__fail(MPG_ERR_NOMEM, "mpg_sync_commit: out of memory");
    int t = 0;
    for (int b = 0; b < s->nbuffers; b++)
      if (s->buffers[b].tied)
        refs[t++] = (tied_ref){mpg_group_name(s->buffers[b].tied),
                               mpg_group_name(s->buffers[b].group),
                               (int)s->buffers[b].dtype, b};
    qsort(refs, (size_t)s->ntied, sizeof *refs, cmp_tied);
    for (t = 0; t < s->ntied; t++) s->tied[t] = refs[t].index;
    free(refs);
  }

  /* Memory: zeroed by the context. */
  for (int b = 0; b < s->nbuffers; b++) {
    sbuffer *buf = &s->buffers[b];
    size_t bytes = buf->count * mpg_dtype_size(buf->dtype);
    mpg_status st = mpg_ctx_mem_alloc(s->ctx, bytes, s->opts.register_buffers, &buf->data);
    if (st) {
      char msg[MSG_MAX];
      keep_error(msg, sizeof msg);
      return mpg__fail(st,
                       "mpg_sync_commit: buffer %d (%s, group \"%s\"%s%s, %d params, "
                       "%zu bytes): %s",
                       b, mpg_dtype_name(buf->dtype), mpg_group_name(buf->group),
                       buf->tied ? ", tied " : "", buf->tied ? mpg_group_name(buf->tied) : "",
                       buf->nparams, bytes, msg);
    }
    s->total_bytes += bytes;
  }
  return MPG_OK;
}

mpg_status mpg_sync_commit(mpg_sync *s) {
  if (!s) return mpg__fail(MPG_ERR_INVALID, "mpg_sync_commit: sync is NULL");
  if (s->committed)
    return mpg__fail(MPG_ERR_STATE, "mpg_sync_commit: the sync is already committed");
  mpg_status st = resolve_groups(s);
  if (!st) st = layout(s);
  if (st) {
    free_layout(s);
    return st;
  }
  s->committed = 1;
  if (mpg__log_level() >= 1) {
    mpg__log(1, "sync: rank %d: %d params in %d buffers, %d buckets, %zu bytes",
             mpg_ctx_rank(s->ctx), s->nparams, s->nbuffers, s->nbuckets, s->total_bytes);
    for (int k = 0; k < s->nbuckets && mpg__log_level() >= 2; k++) {
      const sbucket *b = &s->buckets[k];
      const sbuffer *buf = &s->buffers[b->buffer];
      mpg__log(2, "sync: rank %d: bucket %d: buffer %d (%s, \"%s\"), elements %zu..%zu, "
               "%d params \"%s\"..\"%s\"", mpg_ctx_rank(s->ctx), k, b->buffer,
               mpg_dtype_name(buf->dtype), mpg_group_name(buf->group), b->offset,
               b->offset + b->count, b->nparams, s->params[b->first].name,
               s->params[b->last].name);
    }
  }
  return MPG_OK;
}

mpg_status mpg_sync_grad(mpg_sync *s, int param, void **grad) {
  if (grad) *grad = NULL;
  if (!s || !grad)
    return mpg__fail(MPG_ERR_INVALID, "mpg_sync_grad: %s is NULL", !s ? "sync" : "grad");
  if (param < 0 || param >= s->nparams)
    return mpg__fail(MPG_ERR_RANGE, "mpg_sync_grad: param %d is outside 0..%d", param,
                     s->nparams - 1);
  if (!s->committed)
    return mpg__fail(MPG_ERR_STATE,
                     "mpg_sync_grad \"%s\": call mpg_sync_commit first (the buffers "
                     "are laid out there)",
                     s->params[param].name);
  const sparam *p = &s->params[param];
  *grad = (char *)s->buffers[p->buffer].data + p->offset * mpg_dtype_size(p->dtype);
  return MPG_OK;
}

mpg_status mpg_sync_param_group(const mpg_sync *s, int param, mpg_group **group) {
  if (group) *group = NULL;
  if (!s || !group)
    return mpg__fail(MPG_ERR_INVALID, "mpg_sync_param_group: %s is NULL",
                     !s ? "sync" : "group");
  if (param < 0 || param >= s->nparams)
    return mpg__fail(MPG_ERR_RANGE, "mpg_sync_param_group: param %d is outside 0..%d",
                     param, s->nparams - 1);
  if (!s->committed)
    return mpg__fail(MPG_ERR_STATE,
                     "mpg_sync_param_group \"%s\": call mpg_sync_commit first",
                     s->params[param].name);
  *group = s->params[param].group;
  return MPG_OK;
}

mpg_status mpg_sync_get_stats(const mpg_sync *s, mpg_sync_stats *stats) {
  if (!s || !stats)
    return mpg__fail(MPG_ERR_INVALID, "mpg_sync_get_stats: %s is NULL",
                     !s ? "sync" : "stats");
  memset(stats, 0, sizeof *stats);
  stats->num_params = s->nparams;
  stats->num_buffers = s->nbuffers;
  stats->num_buckets = s->nbuckets;
  stats->total_bytes = s->total_bytes;
  stats->launched_buckets = s->launched_total;
  return MPG_OK;
}

int mpg_sync_grads_valid(const mpg_sync *s) { return s ? s->valid : 0; }

/* ------------------------------------------------------------------ */
/* The step                                                            */
/* ------------------------------------------------------------------ */

/* Fail the step: keep the first error (with `what` in front of the groups
 * layer's message), mark the gradients invalid, and remember a timeout or
 * abort, after which the context is unusable. */
static mpg_status step_fail(mpg_sync *s, mpg_status st, const char *what) {
  if (!s->step_status) {
    char msg[MSG_MAX];
    keep_error(msg, sizeof msg);
    snprintf(s->step_msg, sizeof s->step_msg, "sync step %ld: %s: %s", s->step, what, msg);
    s->step_status = st;
    if ((st == MPG_ERR_TIMEOUT || st == MPG_ERR_ABORTED) && !s->dead) {
      s->dead = st;
      s->dead_step = s->step;
      snprintf(s->dead_msg, sizeof s->dead_msg, "%s", s->step_msg);
    }
    mpg__log(1, "rank %d: %s", mpg_ctx_rank(s->ctx), s->step_msg);
  }
  s->valid = 0;
  return mpg__fail(s->step_status, "%s", s->step_msg);
}

static void describe_bucket(const mpg_sync *s, int k, char *buf, size_t n) {
  const sbucket *b = &s->buckets[k];
  const sbuffer *f = &s->buffers[b->buffer];
  snprintf(buf, n,
           "bucket %d of %d (%s, group \"%s\" of %d ranks, %d params \"%s\"..\"%s\", "
           "%zu elements)",
           k, s->nbuckets, mpg_dtype_name(f->dtype), mpg_group_name(f->group),
           mpg_group_size(f->group), b->nparams, s->params[b->first].name,
           s->params[b->last].name, b->count);
}

static mpg_status launch(mpg_sync *s, int k) {
  sbucket *b = &s->buckets[k];
  const sbuffer *f = &s->buffers[b->buffer];
  char what[512];
  /* The bucket's gradients were produced on the caller's stream before
   * mark_ready: order the sync's stream after everything queued there so
   * far (a fresh event for every bucket; once per step would miss the
   * gradients queued after the first launch). */
  mpg_status st = mpg_ctx_stream_order(s->ctx, s->stream, s->caller);
  if (st) {
    describe_bucket(s, k, what, sizeof what);
    snprintf(what + strlen(what), sizeof what - strlen(what),
             ": ordering the sync's stream after the caller's");
    return step_fail(s, st, what);
  }
  s->ordered = 1;
  void *data = (char *)f->data + b->offset * mpg_dtype_size(f->dtype);
  double scale = s->opts.grad_scale;
  if (s->opts.op == MPG_SYNC_AVG) scale /= mpg_group_size(f->group);
  if (s->opts.grad_scale == 1.0)
    st = mpg_all_reduce(f->group, data, data, b->count, f->dtype,
                        s->opts.op == MPG_SYNC_AVG ? MPG_OP_AVG : MPG_OP_SUM,
                        s->stream, &b->work);
  else
    st = mpg_all_reduce_scaled(f->group, data, data, b->count, f->dtype, scale,
                               s->stream, &b->work);
  if (st) {
    describe_bucket(s, k, what, sizeof what);
    return step_fail(s, st, what);
  }
  b->launched = 1;
  s->launched_total++;
  mpg__log(2, "sync: rank %d: step %ld: launched bucket %d", mpg_ctx_rank(s->ctx), s->step, k);
  return MPG_OK;
}

/* Launch every bucket, in order, from the next one while all its params
 * are ready (all of them with `force`). */
static mpg_status launch_ready(mpg_sync *s, int force) {
  while (!s->step_status && s->next_launch < s->nbuckets &&
         (force || s->buckets[s->next_launch].pending == 0)) {
    mpg_status st = launch(s, s->next_launch);
    if (st) return st;
    s->next_launch++;
  }
  return s->step_status ? mpg__fail(s->step_status, "%s", s->step_msg) : MPG_OK;
}

/* Look at the buckets in flight, oldest first, so that backends which
 * progress only when called make headway, and failures show early. */
static mpg_status poll(mpg_sync *s) {
  while (!s->step_status && s->oldest < s->next_launch) {
    sbucket *b = &s->buckets[s->oldest];
    int done = 0;
    mpg_status st = mpg_work_test(b->work, &done);
    if (st) {
      char what[512];
      describe_bucket(s, s->oldest, what, sizeof what);
      return step_fail(s, st, what);
    }
    if (!done) break;
    s->oldest++;
  }
  return MPG_OK;
}

mpg_status mpg_sync_begin(mpg_sync *s, long step, int is_last_microbatch,
                          void *stream) {
  if (!s) return mpg__fail(MPG_ERR_INVALID, "mpg_sync_begin: sync is NULL");
  if (!s->committed)
    return mpg__fail(MPG_ERR_STATE, "mpg_sync_begin step %ld: call mpg_sync_commit first",
                     step);
  if (s->in_step)
    return mpg__fail(MPG_ERR_STATE,
                     "mpg_sync_begin step %ld: step %ld is still open; end it with "
                     "mpg_sync_finish",
                     step, s->step);
  if (s->dead)
    return mpg__fail(MPG_ERR_ABORTED,
                     "mpg_sync_begin step %ld: the context was aborted in step %ld "
                     "(%s); destroy the sync and the context and start again. "
                     "The failure was: %s",
                     step, s->dead_step, mpg_status_name(s->dead), s->dead_msg);
  if (s->zero_pending) {
    /* Gradients were zeroed on the sync's stream: the caller's writes come
     * after. */
    mpg_status st = mpg_ctx_stream_order(s->ctx, stream, s->stream);
    if (st) {
      char msg[MSG_MAX];
      keep_error(msg, sizeof msg);
      return mpg__fail(st, "mpg_sync_begin step %ld: ordering the caller's stream after "
                       "the zeroing: %s", step, msg);
    }
    s->zero_pending = 0;
  }
  s->in_step = 1;
  s->step = step;
  s->last = is_last_microbatch != 0;
  s->caller = stream;
  s->ordered = 0;
  s->next_launch = 0;
  s->oldest = 0;
  s->step_status = MPG_OK;
  s->step_msg[0] = '\0';
  for (int i = 0; i < s->nparams; i++) s->params[i].ready = 0;
  for (int k = 0; k < s->nbuckets; k++) {
    sbucket *b = &s->buckets[k];
    b->pending = b->nparams;
    b->launched = 0;
    b->work = NULL;
  }
  return MPG_OK;
}

mpg_status mpg_sync_mark_ready(mpg_sync *s, int param) {
  if (!s) return mpg__fail(MPG_ERR_INVALID, "mpg_sync_mark_ready: sync is NULL");
  if (param < 0 || param >= s->nparams)
    return mpg__fail(MPG_ERR_RANGE, "mpg_sync_mark_ready: param %d is outside 0..%d",
                     param, s->nparams - 1);
  sparam *p = &s->params[param];
  if (!s->in_step)
    return mpg__fail(MPG_ERR_STATE,
                     "mpg_sync_mark_ready \"%s\": no step is open; call mpg_sync_begin "
                     "first",
                     p->name);
  if (p->ready)
    return mpg__fail(MPG_ERR_STATE,
                     "mpg_sync_mark_ready \"%s\" (param %d): already marked ready in "
                     "step %ld",
                     p->name, param, s->step);
  p->ready = 1;
  if (!s->last) return MPG_OK; /* accumulation: communicate on the last only */
  if (s->step_status) return mpg__fail(s->step_status, "%s", s->step_msg);
  s->buckets[p->bucket].pending--;
  mpg_status st = launch_ready(s, 0);
  if (!st) st = poll(s);
  return st;
}

mpg_status mpg_sync_finish(mpg_sync *s) {
  if (!s) return mpg__fail(MPG_ERR_INVALID, "mpg_sync_finish: sync is NULL");
  if (!s->in_step)
    return mpg__fail(MPG_ERR_STATE, "mpg_sync_finish: no step is open; call "
                     "mpg_sync_begin first");
  if (!s->last) {
    s->in_step = 0;
    return MPG_OK;
  }
  /* Launch what is left (params never marked are taken as they are). */
  launch_ready(s, 1);
  /* Wait for everything launched, even after a failure: never leave a
   * collective writing into the buffers. */
  for (int k = 0; k < s->nbuckets; k++) {
    sbucket *b = &s->buckets[k];
    if (!b->launched || !b->work) continue;
    mpg_status st = mpg_work_wait(b->work);
    b->work = NULL;
    if (st && !s->step_status) {
      char what[512];
      describe_bucket(s, k, what, sizeof what);
      step_fail(s, st, what);
    }
  }
  /* Tied groups: sum the averaged gradients (e.g. first + last stage). */
  for (int t = 0; t < s->ntied && !s->step_status; t++) {
    const sbuffer *f = &s->buffers[s->tied[t]];
    if (t == 0) {
      mpg_status st = mpg_ctx_stream_order(s->ctx, s->stream, s->caller);
      if (st) {
        step_fail(s, st, "tied sums: ordering the sync's stream after the caller's");
        break;
      }
      s->ordered = 1;
    }
    mpg_status st = mpg_all_reduce(f->tied, f->data, f->data, f->count, f->dtype,
                                   MPG_OP_SUM, s->stream, &s->tied_work[t]);
    if (st) {
      char what[512];
      snprintf(what, sizeof what,
               "tied sum of buffer %d (%s, %zu elements, reduce group \"%s\") over "
               "tied group \"%s\" of %d ranks",
               s->tied[t], mpg_dtype_name(f->dtype), f->count, mpg_group_name(f->group),
               mpg_group_name(f->tied), mpg_group_size(f->tied));
      step_fail(s, st, what);
    }
  }
  for (int t = 0; t < s->ntied; t++) {
    if (!s->tied_work[t]) continue;
    mpg_status st = mpg_work_wait(s->tied_work[t]);
    s->tied_work[t] = NULL;
    if (st && !s->step_status) {
      const sbuffer *f = &s->buffers[s->tied[t]];
      char what[512];
      snprintf(what, sizeof what, "tied sum of buffer %d (%s) over tied group \"%s\"",
               s->tied[t], mpg_dtype_name(f->dtype), mpg_group_name(f->tied));
      step_fail(s, st, what);
    }
  }
  /* The caller's later work (the optimizer) comes after the reduction. */
  if (s->ordered) {
    mpg_status st = mpg_ctx_stream_order(s->ctx, s->caller, s->stream);
    if (st && !s->step_status) step_fail(s, st, "ordering the caller's stream after the sync's");
  }
  s->in_step = 0;
  if (s->step_status) {
    s->valid = 0;
    return mpg__fail(s->step_status, "%s", s->step_msg);
  }
  s->valid = 1;
  return MPG_OK;
}

mpg_status mpg_sync_all(mpg_sync *s, long step, void *stream) {
  mpg_status st = mpg_sync_begin(s, step, 1, stream);
  if (st) return st;
  /* Backward order: the buckets launch one after another as they fill. */
  for (int id = s->nparams - 1; id >= 0 && !s->step_status; id--) {
    st = mpg_sync_mark_ready(s, id);
    if (st) break;
  }
  return mpg_sync_finish(s);
}

mpg_status mpg_sync_zero_grads(mpg_sync *s) {
  if (!s) return mpg__fail(MPG_ERR_INVALID, "mpg_sync_zero_grads: sync is NULL");
  if (!s->committed)
    return mpg__fail(MPG_ERR_STATE, "mpg_sync_zero_grads: call mpg_sync_commit first");
  if (s->in_step && s->next_launch > 0)
    return mpg__fail(MPG_ERR_STATE,
                     "mpg_sync_zero_grads: step %ld has %d buckets in flight; zero "
                     "after mpg_sync_finish",
                     s->step, s->next_launch);
  for (int b = 0; b < s->nbuffers; b++) {
    const sbuffer *f = &s->buffers[b];
    mpg_status st = mpg_ctx_mem_zero(s->ctx, f->data, f->count * mpg_dtype_size(f->dtype),
                                     s->stream);
    if (st) {
      char msg[MSG_MAX];
      keep_error(msg, sizeof msg);
      return mpg__fail(st, "mpg_sync_zero_grads: buffer %d (%s, group \"%s\"): %s", b,
                       mpg_dtype_name(f->dtype), mpg_group_name(f->group), msg);
    }
  }
  s->zero_pending = 1;
  return MPG_OK;
}
