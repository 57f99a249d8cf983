/* mpg_sync_commit: resolve each parameter's reduce group, lay out one
 * buffer per (dtype, reduce group, tied group) in backward order, and cut
 * the buckets (see sync_core.h). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sync_core.h"

static size_t mib_bytes(double mb) {
  double b = mb * MIB;
  if (b >= (double)(SIZE_MAX / 4)) return SIZE_MAX / 4;
  return b < 1.0 ? 1 : (size_t)b;
}

void mpg__sync_free_layout(mpg_sync *s) {
  for (int i = 0; i < s->layout.nbuffers; i++) {
    sbuffer *f = &s->layout.buffers[i];
    if (f->shm) mpg__shm_destroy(f->shm); /* owns data */
    else if (f->data) mpg_ctx_mem_free(s->ctx, f->data);
    if (f->param_shm) mpg__shm_destroy(f->param_shm); /* owns param_data */
    else if (f->param_data) mpg_ctx_mem_free(s->ctx, f->param_data);
    f->shm = f->param_shm = NULL;
    f->data = f->param_data = NULL;
  }
  free(s->layout.buffers);
  free(s->shard.forward_buckets);
  s->shard.forward_buckets = NULL;
  s->shard.nforward = 0;
  free(s->layout.buckets);
  free(s->layout.tied_order);
  free(s->step.tied_works);
  s->layout.buffers = NULL;
  s->layout.buckets = NULL;
  s->layout.tied_order = NULL;
  s->step.tied_works = NULL;
  s->layout.nbuffers = s->layout.nbuckets = s->layout.ntied = 0;
  s->layout.total_bytes = 0;
}

/* ------------------------------------------------------------------ */
/* Commit: groups, buffers, buckets                                     */
/* ------------------------------------------------------------------ */

/* Resolve every parameter's reduce group.  The groups to create are the
 * union, over the world, of every rank's reduce_dims other than the
 * default: pipeline stages hold different parameters (a norm reduced over
 * "dp,tp" on one stage only), and creating a group is a split over the
 * whole world, so each rank first learns what any rank needs (one
 * all-reduce of a flag per mask slot: MPG__MASK_SLOTS int32, whatever the
 * world size) and then every rank creates the same groups in ascending
 * mask order, whatever its own parameters and their registration order. */
static mpg_status resolve_groups(mpg_sync *s) {
  enum { NMASK = MPG__MASK_SLOTS };
  int32_t mine[NMASK], all[NMASK];
  mpg_group *groups[NMASK];
  memset(mine, 0, sizeof mine);
  for (int i = 0; i < s->layout.nparams; i++) {
    const sparam *p = &s->layout.params[i];
    if (!p->dims || (s->default_mask && p->mask == s->default_mask)) continue;
    mine[mpg__mesh_mask_slot(s->mesh, p->mask)] = 1;
  }
  mpg_group *world = NULL;
  mpg_status st = mpg_ctx_group(s->ctx, "world", &world);
  if (!st) st = mpg__group_host_all_reduce(world, mine, all, NMASK, MPG_I32, MPG_OP_MAX);
  if (st)
    return mpg__fail_wrap(st, "mpg_sync_commit: agreeing over the world on the reduce "
                          "groups (does every rank call mpg_sync_commit?)");
  for (unsigned k = 0; k < NMASK; k++) {
    groups[k] = NULL;
    if (!all[k]) continue;
    unsigned m = mpg__mesh_slot_mask(s->mesh, k);
    char names[MPG__MASK_BITS * MPG_NAME_MAX];
    mpg__mesh_mask_names(s->mesh, m, ",", names, sizeof names);
    st = mpg_ctx_group_dims(s->ctx, names, &groups[k]);
    if (st) {
      const char *who = "";
      for (int i = 0; i < s->layout.nparams && !who[0]; i++)
        if (s->layout.params[i].dims && s->layout.params[i].mask == m)
          who = s->layout.params[i].name;
      if (who[0])
        return mpg__fail_wrap(st, "mpg_sync_commit: reduce group \"%s\" (of param \"%s\")",
                              names, who);
      return mpg__fail_wrap(st, "mpg_sync_commit: reduce group \"%s\" (of another rank's "
                            "params)", names);
    }
  }
  for (int i = 0; i < s->layout.nparams; i++) {
    sparam *p = &s->layout.params[i];
    p->group = s->default_group;
    if (p->dims && !(s->default_mask && p->mask == s->default_mask))
      p->group = groups[mpg__mesh_mask_slot(s->mesh, p->mask)];
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

/* Buffers by (reduce group name, dtype, tied group name, "" for none): the
 * same order on every rank for the groups it shares with another. */
static int cmp_buffer_ref(const void *a, const void *b) {
  const tied_ref *x = a, *y = b;
  int c = strcmp(x->group, y->group);
  if (!c) c = x->dtype - y->dtype;
  if (!c) c = strcmp(x->tied, y->tied);
  return c;
}

typedef struct bucket_ref {
  int key, index;
} bucket_ref;

static int cmp_bucket_ref(const void *a, const void *b) {
  const bucket_ref *x = a, *y = b;
  return x->key < y->key ? -1 : x->key > y->key;
}

/* Close a sharded buffer's open bucket: pad its end to a multiple of
 * lcm(S, 128) (the padding is zero and stays zero), so that it cuts into S
 * equal slices and the next bucket starts aligned. */
static void close_sharded(const mpg_sync *s, sbuffer *buf, sbucket *k) {
  size_t pad = mpg__sync_shard_pad(s, buf->domain);
  size_t end = (buf->count + pad - 1) / pad * pad;
  k->count = end - k->offset;
  buf->count = end;
  buf->open_bucket = -1;
}

/* The byte cap of a buffer's open bucket: its first when it is its only one. */
static size_t open_bucket_cap(const mpg_sync *s, const sbuffer *buf) {
  return mib_bytes(buf->nbuckets == 1 ? s->opts.sync.first_bucket_mb : s->opts.sync.bucket_mb);
}

/* The index of the buffer for a param's (dtype, reduce group, tied group), added if new. */
static int find_or_add_buffer(mpg_sync *s, const sparam *param) {
  int index = 0;
  while (index < s->layout.nbuffers && !(s->layout.buffers[index].dtype == param->dtype &&
                                  s->layout.buffers[index].group == param->group &&
                                  s->layout.buffers[index].tied == param->tied))
    index++;
  sbuffer *buf = &s->layout.buffers[index];
  if (index == s->layout.nbuffers) {
    s->layout.nbuffers++;
    buf->dtype = param->dtype;
    buf->group = param->group;
    buf->tied = param->tied;
    buf->open_bucket = -1;
    /* Integer buffers stay replicated: their average truncates, which
     * a scaled reduce-scatter cannot do. */
    buf->domain = s->opts.sync.mode == MPG_SYNC_SHARD ? mpg__sync_shard_domain(s, param->group) : -1;
    buf->sharded = buf->domain >= 0 && !param->tied && param->dtype != MPG_I32 &&
                   param->dtype != MPG_I64;
  }
  return index;
}

/* Place a param at the aligned end of its buffer, closing a sharded open bucket it overflows. */
static mpg_status place_param(mpg_sync *s, sparam *param, int buf_index) {
  sbuffer *buf = &s->layout.buffers[buf_index];
  /* Shard mode: a sharded buffer's params start on 64 elements (as in
   * Megatron's distributed optimizer), the others on 64 bytes. */
  size_t dsize = mpg_dtype_size(param->dtype);
  size_t align = buf->sharded ? 64 : ALIGN_BYTES / dsize;
  size_t offset = (buf->count + align - 1) / align * align;
  if (buf->sharded && buf->open_bucket >= 0) {
    /* A param that opens a new bucket: first pad the open one's end. */
    size_t cap = open_bucket_cap(s, buf);
    sbucket *open_bucket = &s->layout.buckets[buf->open_bucket];
    if (offset <= SIZE_MAX / 8 - param->count &&
        (offset + param->count - open_bucket->offset) * dsize > cap) {
      close_sharded(s, buf, open_bucket);
      offset = buf->count;
    }
  }
  if (offset > (SIZE_MAX / 4) / dsize - param->count)
    return mpg__fail(MPG_ERR_RANGE,
                     "mpg_sync_commit: param \"%s\": the %s gradient buffer of group "
                     "\"%s\" would exceed the address space",
                     param->name, mpg_dtype_name(param->dtype), mpg_group_name(param->group));
  param->buffer = buf_index;
  param->offset = offset;
  buf->count = offset + param->count;
  buf->nparams++;
  return MPG_OK;
}

/* Put param `id` in its buffer's open bucket while the slice fits, else open a new one. */
static void add_to_bucket(mpg_sync *s, sparam *param, int id) {
  sbuffer *buf = &s->layout.buffers[param->buffer];
  int key = s->layout.nparams - 1 - id;
  if (buf->open_bucket >= 0) {
    size_t cap = open_bucket_cap(s, buf);
    sbucket *open_bucket = &s->layout.buckets[buf->open_bucket];
    size_t dsize = mpg_dtype_size(param->dtype);
    size_t span = (param->offset + param->count - open_bucket->offset) * dsize;
    if (span <= cap) {
      open_bucket->count = param->offset + param->count - open_bucket->offset;
      open_bucket->last_param = id;
      open_bucket->nparams++;
      open_bucket->launch_key = key;
      param->bucket = buf->open_bucket;
      return;
    }
  }
  sbucket *new_bucket = &s->layout.buckets[s->layout.nbuckets];
  new_bucket->buffer = param->buffer;
  new_bucket->offset = param->offset;
  new_bucket->count = param->count;
  new_bucket->first_param = new_bucket->last_param = id;
  new_bucket->nparams = 1;
  new_bucket->launch_key = key;
  param->bucket = s->layout.nbuckets;
  buf->open_bucket = s->layout.nbuckets++;
  buf->nbuckets++;
}

/* Sort the buckets into launch order (by the backward position of each one's last param). */
static mpg_status sort_buckets(mpg_sync *s) {
  size_t cap = (size_t)(s->layout.nbuckets ? s->layout.nbuckets : 1);
  bucket_ref *refs = malloc(sizeof *refs * cap);
  int *where = malloc(sizeof *where * cap);
  sbucket *sorted = malloc(sizeof *sorted * cap);
  if (!refs || !where || !sorted) {
    free(refs);
    free(where);
    free(sorted);
    return mpg__fail(MPG_ERR_NOMEM, "mpg_sync_commit: out of memory");
  }
  for (int k = 0; k < s->layout.nbuckets; k++)
    refs[k] = (bucket_ref){s->layout.buckets[k].launch_key, k};
  qsort(refs, (size_t)s->layout.nbuckets, sizeof *refs, cmp_bucket_ref);
  for (int k = 0; k < s->layout.nbuckets; k++) {
    sorted[k] = s->layout.buckets[refs[k].index];
    where[refs[k].index] = k;
  }
  for (int id = 0; id < s->layout.nparams; id++)
    s->layout.params[id].bucket = where[s->layout.params[id].bucket];
  free(s->layout.buckets);
  s->layout.buckets = sorted;
  free(refs);
  free(where);
  return MPG_OK;
}

/* List the tied buffers in an order every member of a tied group agrees on. */
static mpg_status order_tied(mpg_sync *s) {
  for (int b = 0; b < s->layout.nbuffers; b++) s->layout.ntied += s->layout.buffers[b].tied != NULL;
  if (!s->layout.ntied) return MPG_OK;
  s->layout.tied_order = malloc(sizeof *s->layout.tied_order * (size_t)s->layout.ntied);
  s->step.tied_works = calloc((size_t)s->layout.ntied, sizeof *s->step.tied_works);
  if (!s->layout.tied_order || !s->step.tied_works)
    return mpg__fail(MPG_ERR_NOMEM, "mpg_sync_commit: out of memory");
  tied_ref *refs = malloc(sizeof *refs * (size_t)s->layout.ntied);
  if (!refs) return mpg__fail(MPG_ERR_NOMEM, "mpg_sync_commit: out of memory");
  int nrefs = 0;
  for (int b = 0; b < s->layout.nbuffers; b++)
    if (s->layout.buffers[b].tied)
      refs[nrefs++] = (tied_ref){mpg_group_name(s->layout.buffers[b].tied),
                                 mpg_group_name(s->layout.buffers[b].group),
                                 (int)s->layout.buffers[b].dtype, b};
  qsort(refs, (size_t)s->layout.ntied, sizeof *refs, cmp_tied);
  for (int i = 0; i < s->layout.ntied; i++) s->layout.tied_order[i] = refs[i].index;
  free(refs);
  return MPG_OK;
}

/* Buffer memory: zeroed by the context, or shared, created in an order all ranks agree on. */
static mpg_status alloc_buffers(mpg_sync *s) {
  /* Shared memory in a rank-independent order: each creation is collective over its group. */
  tied_ref *order = malloc(sizeof *order * (size_t)(s->layout.nbuffers ? s->layout.nbuffers : 1));
  if (!order) return mpg__fail(MPG_ERR_NOMEM, "mpg_sync_commit: out of memory");
  for (int b = 0; b < s->layout.nbuffers; b++) {
    const sbuffer *buf = &s->layout.buffers[b];
    order[b] = (tied_ref){buf->tied ? mpg_group_name(buf->tied) : "",
                          mpg_group_name(buf->group), (int)buf->dtype, b};
  }
  qsort(order, (size_t)s->layout.nbuffers, sizeof *order, cmp_buffer_ref);
  mpg_status st = MPG_OK;
  for (int i = 0; i < s->layout.nbuffers && !st; i++) {
    int buf_index = order[i].index;
    sbuffer *buf = &s->layout.buffers[buf_index];
    size_t bytes = buf->count * mpg_dtype_size(buf->dtype);
    mpg_group *shared_over = buf->sharded ? s->shard.domains[buf->domain].shard : buf->group;
    st = mpg__shm_create(shared_over, bytes, buf->dtype, buf->nbuckets, buf->sharded,
                         &buf->shm, &buf->data);
    /* Its parameters (shard mode) in a second segment over the same group
     * (one host, or hierarchical across hosts like the first: its gather
     * crosses hosts by the backend's all-gather, groups/shm/), decided
     * alike on every member from the first's outcome; depth: every bucket
     * in flight at once (mpg_sync_gather_all) without waiting for a slot. */
    const char *what = "buffer";
    if (!st && buf->shm && buf->sharded && mpg__shm_hosts(buf->shm) >= 1 &&
        (st = mpg__shm_create(shared_over, bytes, buf->dtype, buf->nbuckets, 1,
                              &buf->param_shm, &buf->param_data))) {
      if (st == MPG_ERR_ENV) {
        /* No room for it in /dev/shm (alike on every member): the
         * parameters gather through the backend, as before. */
        mpg__log(1, "mpg_sync_commit: buffer %d's parameters are gathered by the backend: "
                 "%s", buf_index, mpg_last_error());
        st = MPG_OK;
      } else {
        what = "the parameters' shared memory of buffer";
      }
    }
    if (!st && !buf->shm)
      st = mpg_ctx_mem_alloc(s->ctx, bytes, s->opts.register_buffers, &buf->data);
    if (st)
      st = mpg__fail_wrap(st,
                          "mpg_sync_commit: %s %d (%s, group \"%s\"%s%s, %d params, "
                          "%zu bytes)",
                          what, buf_index, mpg_dtype_name(buf->dtype), mpg_group_name(buf->group),
                          buf->tied ? ", tied " : "",
                          buf->tied ? mpg_group_name(buf->tied) : "", buf->nparams, bytes);
    else
      s->layout.total_bytes += bytes;
  }
  free(order);
  return st;
}

static mpg_status layout(mpg_sync *s) {
  int nparams = s->layout.nparams;
  /* Buffers, in order of first appearance in backward order. */
  s->layout.buffers = calloc((size_t)(nparams ? nparams : 1), sizeof *s->layout.buffers);
  s->layout.buckets = calloc((size_t)(nparams ? nparams : 1), sizeof *s->layout.buckets);
  if (!s->layout.buffers || !s->layout.buckets)
    return mpg__fail(MPG_ERR_NOMEM, "mpg_sync_commit: out of memory");
  mpg_status st;
  for (int id = nparams - 1; id >= 0; id--) {
    sparam *param = &s->layout.params[id];
    if ((st = place_param(s, param, find_or_add_buffer(s, param)))) return st;
    add_to_bucket(s, param, id);
  }
  for (int b = 0; b < s->layout.nbuffers; b++)
    if (s->layout.buffers[b].sharded && s->layout.buffers[b].open_bucket >= 0)
      close_sharded(s, &s->layout.buffers[b], &s->layout.buckets[s->layout.buffers[b].open_bucket]);
  if ((st = sort_buckets(s))) return st;
  if ((st = order_tied(s))) return st;
  return alloc_buffers(s);
}

/* ------------------------------------------------------------------ */
/* Layout fingerprint: every member of a group must lay out alike       */
/* ------------------------------------------------------------------ */

/* One check unit: the params this rank reduces over `group` (kind 0: its
 * reduce group) or sums over it (kind 1: its tied group), in registration
 * order.  Entry i's prefix hash chains entries 0..i; past the last entry it
 * is one end mark chained after it, so two ranks agree on index i exactly
 * when their lists agree up to i (and, if either list ended there, end
 * alike).  Agreement is monotone in i: a binary search over the prefix
 * finds the first entry that differs, every rank deciding from the same
 * gathered values, so all issue the same collectives. */
#define FP_NAME 64
#define FP_REC (3 + 2 * FP_NAME / 8) /* int64 words of one entry record */

typedef struct fp_unit {
  mpg_group *group;
  int kind;          /* 0: reduce group, 1: tied group */
  int *ids;          /* param ids in registration order */
  int n;
  uint64_t *prefix;  /* n + 1: prefix[i] for i < n, prefix[n] the end mark */
} fp_unit;

static uint64_t fp_str(uint64_t h, const char *str) {
  return mpg__hash_mix(h, mpg__hash_str(str));
}

/* What a unit compares of a param: the reduce group's members must agree
 * on name, count, dtype and tied group; a tied group's (whose stages may
 * name their copies differently) on count, dtype and reduce group. */
static const char *fp_tag(const fp_unit *u, const sparam *p) {
  if (u->kind == 0) return p->tied ? mpg_group_name(p->tied) : "";
  return mpg_group_name(p->group);
}

static uint64_t fp_at(const fp_unit *u, long i) {
  return u->prefix[i < u->n ? i : u->n];
}

static mpg_status fp_gather(const mpg_sync *s, const fp_unit *u, const void *send,
                            void *recv, size_t words, const char *what) {
  (void)s; /* host buffers: the check never touches the sync's stream */
  mpg_status st = mpg__group_host_all_gather(u->group, send, recv, words, MPG_I64);
  if (st)
    return mpg__fail_wrap(st, "mpg_sync_commit: layout check over %s group \"%s\" "
                          "(index %d, %d ranks), %s",
                          u->kind ? "tied" : "reduce", mpg_group_name(u->group),
                          mpg_group_index(u->group), mpg_group_size(u->group), what);
  return MPG_OK;
}

static int fp_all_equal(const uint64_t *v, int n) {
  for (int i = 1; i < n; i++)
    if (v[i] != v[0]) return 0;
  return 1;
}

static void fp_record(const mpg_sync *s, const fp_unit *u, long i, uint64_t *rec) {
  memset(rec, 0, FP_REC * sizeof *rec);
  rec[0] = fp_at(u, i);
  if (i >= u->n) return;
  const sparam *p = &s->layout.params[u->ids[i]];
  rec[1] = (uint64_t)p->count;
  rec[2] = (uint64_t)p->dtype + 1; /* 0: no such entry */
  char *text = (char *)&rec[3];
  snprintf(text, FP_NAME, "%s", p->name);
  snprintf(text + FP_NAME, FP_NAME, "%s", fp_tag(u, p));
}

static void fp_describe(const fp_unit *u, const uint64_t *rec, long i, int n, char *buf,
                        size_t len) {
  char name[FP_NAME], tag[FP_NAME];
  memcpy(name, (const char *)&rec[3], FP_NAME);
  memcpy(tag, (const char *)&rec[3] + FP_NAME, FP_NAME);
  name[FP_NAME - 1] = tag[FP_NAME - 1] = '\0';
  if (!rec[2]) { /* n < 0: another rank's, whose count is not known here */
    if (n >= 0)
      snprintf(buf, len, "no param #%ld (only %d registered for this group)", i, n);
    else
      snprintf(buf, len, "no param #%ld", i);
    return;
  }
  snprintf(buf, len, "\"%s\" (%llu x %s%s%s%s)", name, (unsigned long long)rec[1],
           mpg_dtype_name((mpg_dtype)(rec[2] - 1)),
           u->kind ? ", reduce group \"" : tag[0] ? ", tied group \"" : "",
           u->kind || tag[0] ? tag : "", u->kind || tag[0] ? "\"" : "");
}

/* Check one unit: one all-gather of (fingerprint, count); on a mismatch a
 * binary search over the prefix (one all-gather a round) and one gather of
 * the first differing entry, then MPG_ERR_STATE on every member. */
static mpg_status fp_check(mpg_sync *s, fp_unit *u) {
  int size = mpg_group_size(u->group), me = mpg_group_position(u->group);
  uint64_t *all = malloc(sizeof *all * (size_t)size * FP_REC);
  if (!all) return mpg__fail(MPG_ERR_NOMEM, "mpg_sync_commit: out of memory");
  uint64_t mine[FP_REC];
  mine[0] = fp_at(u, u->n);
  mine[1] = (uint64_t)u->n;
  mpg_status st = fp_gather(s, u, mine, all, 2, "fingerprints");
  if (st) goto out;
  int same = 1;
  long maxn = 0;
  for (int r = 0; r < size; r++) {
    same &= all[2 * r] == all[0] && all[2 * r + 1] == all[1];
    if ((long)all[2 * r + 1] > maxn) maxn = (long)all[2 * r + 1];
  }
  if (same) goto out;
  /* Every rank holds the same gathered values: the same rounds follow. */
  long lo = 0, hi = maxn; /* they disagree at hi; agree below lo */
  while (lo < hi) {
    long mid = lo + (hi - lo) / 2;
    mine[0] = fp_at(u, mid);
    st = fp_gather(s, u, mine, all, 1, "searching the first difference");
    if (st) goto out;
    if (fp_all_equal(all, size))
      lo = mid + 1;
    else
      hi = mid;
  }
  fp_record(s, u, lo, mine);
  st = fp_gather(s, u, mine, all, FP_REC, "gathering the first difference");
  if (st) goto out;
  int other = 0;
  while (other < size && all[(size_t)other * FP_REC] == mine[0]) other++;
  if (other == size) other = me; /* cannot happen: they disagree at lo */
  int differ = 0;
  for (int r = 0; r < size; r++) differ += all[(size_t)r * FP_REC] != mine[0];
  char here[256], there[256];
  int wother = -1;
  (void)mpg_group_member(u->group, other, &wother);
  fp_describe(u, mine, lo, u->n, here, sizeof here);
  fp_describe(u, &all[(size_t)other * FP_REC], lo, -1, there, sizeof there);
  st = mpg__fail(MPG_ERR_STATE,
                 "mpg_sync_commit: the ranks of %s group \"%s\" (index %d, %d ranks) "
                 "registered different parameters: the first difference is the group's "
                 "param #%ld (registration order): on this rank (world rank %d, position "
                 "%d) %s, on world rank %d (position %d) %s; %d of the group's ranks "
                 "differ from this one",
                 u->kind ? "tied" : "reduce", mpg_group_name(u->group),
                 mpg_group_index(u->group), size, lo, mpg_ctx_rank(s->ctx), me, here,
                 wother, other, there, differ);
out:
  free(all);
  return st;
}

/* Every rank commits: one all-gather over the world of "my groups
 * disagree" and of the options that shape the collectives (mode,
 * reduce_dtype, op, padding, buffer registration, scale, bucket sizes), so that a rank whose own
 * groups agree still fails when another group's do not (its later
 * collectives would wait for that group's members, e.g. a tied sum with the
 * other pipeline stage), and so that ranks created with different options
 * (different buckets, dtypes on the wire) fail here rather than hang. */
enum {
  FPW_FLAG, FPW_MODE, FPW_RDT, FPW_OP, FPW_PAD, FPW_REG, FPW_INST, FPW_EXPERT, FPW_SCALE,
  FPW_BUCKET, FPW_FIRST, FPW_N
};

static mpg_status fp_world(mpg_sync *s, int mismatch) {
  static const char *const field[FPW_N] = {
      "", "sync.mode", "sync.reduce_dtype", "sync.op", "sync.pad_for_nccl",
      "register_buffers", "sync.optimizer_instances",
      "expert shard domain (sync.expert_shard_dims)", "grad_scale", "sync.bucket_mb",
      "sync.first_bucket_mb"};
  mpg_group *world = NULL;
  mpg_status st = mpg_ctx_group(s->ctx, "world", &world);
  if (st) return mpg__fail_wrap(st, "mpg_sync_commit: layout check");
  int n = mpg_group_size(world);
  uint64_t mine[FPW_N] = {mismatch != 0, (uint64_t)s->opts.sync.mode,
                          (uint64_t)s->opts.sync.reduce_dtype, (uint64_t)s->opts.sync.op,
                          (uint64_t)s->opts.sync.pad_for_nccl,
                          /* NCCL: every rank registers its buffers, or none
                           * (User Buffer Registration); a mix hangs NCCL's
                           * launch (L4). */
                          (uint64_t)(s->opts.register_buffers != 0),
                          (uint64_t)s->opts.sync.optimizer_instances,
                          (uint64_t)(s->shard.ndomains > 1
                                         ? mpg__hash_str(mpg_group_name(s->shard.domains[1].reduce))
                                         : 0),
                          0, 0, 0};
  memcpy(&mine[FPW_SCALE], &s->opts.grad_scale, sizeof(double));
  memcpy(&mine[FPW_BUCKET], &s->opts.sync.bucket_mb, sizeof(double));
  memcpy(&mine[FPW_FIRST], &s->opts.sync.first_bucket_mb, sizeof(double));
  uint64_t *all = malloc(sizeof *all * FPW_N * (size_t)n);
  if (!all) return mpg__fail(MPG_ERR_NOMEM, "mpg_sync_commit: out of memory");
  st = mpg__group_host_all_gather(world, mine, all, FPW_N, MPG_I64);
  if (st) {
    free(all);
    return mpg__fail_wrap(st, "mpg_sync_commit: layout check over the world");
  }
  int bad = 0, first = -1;
  for (int r = 0; r < n; r++)
    if (all[(size_t)r * FPW_N + FPW_FLAG]) {
      if (first < 0) first = r;
      bad++;
    }
  /* Options: every rank compares every rank with rank 0 alike. */
  for (int r = 1; r < n && !st; r++)
    for (int f = FPW_MODE; f < FPW_N && !st; f++) {
      uint64_t a = all[f], b = all[(size_t)r * FPW_N + f];
      if (a == b) continue;
      int wr = -1;
      (void)mpg_group_member(world, r, &wr);
      char va[32], vb[32];
      if (f >= FPW_SCALE) {
        double da, db;
        memcpy(&da, &a, sizeof da);
        memcpy(&db, &b, sizeof db);
        snprintf(va, sizeof va, "%.17g", da);
        snprintf(vb, sizeof vb, "%.17g", db);
      } else {
        snprintf(va, sizeof va, "%llu", (unsigned long long)a);
        snprintf(vb, sizeof vb, "%llu", (unsigned long long)b);
      }
      st = mpg__fail(MPG_ERR_STATE,
                     "mpg_sync_commit: the ranks created their mpg_sync with different "
                     "options: opts.%s is %s on world rank 0 but %s on world rank %d; "
                     "every rank must pass the same (they shape the collectives)",
                     field[f], va, vb, wr);
    }
  free(all);
  if (st) return st;
  if (bad && !mismatch) {
    int wr = -1;
    (void)mpg_group_member(world, first, &wr);
    return mpg__fail(MPG_ERR_STATE,
                     "mpg_sync_commit: this rank's groups agree on their parameters, but "
                     "%d rank(s) found a group whose ranks registered different "
                     "parameters, the first world rank %d (its error names the "
                     "parameter)",
                     bad, wr);
  }
  return MPG_OK;
}

static int cmp_fp_unit(const void *a, const void *b) {
  const fp_unit *x = a, *y = b;
  if (x->kind != y->kind) return x->kind - y->kind;
  int c = strcmp(mpg_group_name(x->group), mpg_group_name(y->group));
  return c ? c : mpg_group_index(x->group) - mpg_group_index(y->group);
}

/* Units in an order every rank agrees on: the default reduce group first,
 * then the other reduce groups by mask (as resolve_groups created them),
 * then the tied groups by name. */
static mpg_status check_layout(mpg_sync *s) {
  int n = s->layout.nparams, nunits = 0;
  fp_unit *units = calloc((size_t)(2 * n + 1), sizeof *units);
  mpg_status st = units ? MPG_OK : MPG_ERR_NOMEM;
  unsigned *masks = calloc((size_t)(2 * n + 1), sizeof *masks);
  if (!masks) st = MPG_ERR_NOMEM;
  if (!st) {
    units[nunits++] = (fp_unit){s->default_group, 0, NULL, 0, NULL};
    for (int i = 0; i < n; i++) {
      const sparam *p = &s->layout.params[i];
      for (int kind = 0; kind < 2; kind++) {
        mpg_group *g = kind ? p->tied : p->group;
        if (!g) continue;
        int u = 0;
        while (u < nunits && !(units[u].kind == kind && units[u].group == g)) u++;
        if (u == nunits) {
          masks[nunits] = kind ? 0 : p->mask;
          units[nunits++] = (fp_unit){g, kind, NULL, 0, NULL};
        }
        units[u].n++;
      }
    }
    /* Reduce groups other than the default by mask (unique per group),
     * tied groups by name: insertion sort over units 1.. */
    for (int a = 1; a < nunits; a++)
      for (int b = a; b > 1; b--) {
        int c = units[b - 1].kind != units[b].kind
                    ? units[b - 1].kind - units[b].kind
                : units[b].kind == 0 ? (masks[b - 1] > masks[b]) - (masks[b - 1] < masks[b])
                                     : cmp_fp_unit(&units[b - 1], &units[b]);
        if (c <= 0) break;
        fp_unit t = units[b];
        units[b] = units[b - 1];
        units[b - 1] = t;
        unsigned m = masks[b];
        masks[b] = masks[b - 1];
        masks[b - 1] = m;
      }
    for (int u = 0; u < nunits && !st; u++) {
      units[u].ids = malloc(sizeof *units[u].ids * (size_t)(units[u].n + 1));
      units[u].prefix = malloc(sizeof *units[u].prefix * (size_t)(units[u].n + 1));
      if (!units[u].ids || !units[u].prefix) st = MPG_ERR_NOMEM;
      units[u].n = 0;
    }
  }
  if (st) {
    st = mpg__fail(MPG_ERR_NOMEM, "mpg_sync_commit: out of memory");
  } else {
    for (int i = 0; i < n; i++)
      for (int u = 0; u < nunits; u++)
        if ((units[u].kind ? s->layout.params[i].tied : s->layout.params[i].group) ==
            units[u].group)
          units[u].ids[units[u].n++] = i;
    for (int u = 0; u < nunits; u++) {
      fp_unit *f = &units[u];
      uint64_t h = mpg__hash_mix(0x6d7067666eull, (uint64_t)f->kind);
      for (int i = 0; i < f->n; i++) {
        const sparam *p = &s->layout.params[f->ids[i]];
        if (!f->kind) h = fp_str(h, p->name);
        h = mpg__hash_mix(h, (uint64_t)p->count);
        h = mpg__hash_mix(h, (uint64_t)p->dtype);
        h = fp_str(h, fp_tag(f, p));
        f->prefix[i] = h;
      }
      f->prefix[f->n] = mpg__hash_mix(h, 0x656e64ull); /* "end" */
    }
    /* A mismatch in one group does not stop the others' checks (their
     * members expect them); a failed collective does. */
    mpg__saved_error first;
    int mismatch = 0;
    for (int u = 0; u < nunits && !st; u++) {
      st = fp_check(s, &units[u]);
      if (st == MPG_ERR_STATE) {
        if (!mismatch++) mpg__error_save(&first);
        st = MPG_OK;
      }
    }
    if (!st) st = fp_world(s, mismatch);
    if (!st && mismatch) st = mpg__error_restore(MPG_ERR_STATE, &first);
  }
  for (int u = 0; units && u < nunits; u++) {
    free(units[u].ids);
    free(units[u].prefix);
  }
  free(units);
  free(masks);
  return st;
}

mpg_status mpg_sync_commit(mpg_sync *s) {
  if (!s) return mpg__fail(MPG_ERR_INVALID, "mpg_sync_commit: sync is NULL");
  if (s->committed)
    return mpg__fail(MPG_ERR_STATE, "mpg_sync_commit: the sync is already committed");
  mpg_status st = resolve_groups(s);
  if (!st) st = check_layout(s);
  if (!st) st = mpg__ctx_check_order(s->ctx, "mpg_sync_commit"); /* issue order */
  if (!st) st = layout(s);
  if (!st && s->opts.sync.mode == MPG_SYNC_SHARD) st = mpg__sync_shard_commit(s);
  if (st) {
    mpg__sync_free_layout(s);
    s->step.grads_valid = 0; /* no gradients to trust */
    return st;
  }
  s->committed = 1;
  s->step.grads_valid = 1;
  if (mpg__log_level() >= 1) {
    mpg__log(1, "sync: rank %d: %d params in %d buffers, %d buckets, %zu bytes",
             mpg_ctx_rank(s->ctx), s->layout.nparams, s->layout.nbuffers, s->layout.nbuckets,
             s->layout.total_bytes);
    for (int k = 0; k < s->layout.nbuckets && mpg__log_level() >= 2; k++) {
      const sbucket *b = &s->layout.buckets[k];
      const sbuffer *buf = &s->layout.buffers[b->buffer];
      mpg__log(2, "sync: rank %d: bucket %d: buffer %d (%s, \"%s\"), elements %zu..%zu, "
               "%d params \"%s\"..\"%s\"", mpg_ctx_rank(s->ctx), k, b->buffer,
               mpg_dtype_name(buf->dtype), mpg_group_name(buf->group), b->offset,
               b->offset + b->count, b->nparams, s->layout.params[b->first_param].name,
               s->layout.params[b->last_param].name);
    }
  }
  return MPG_OK;
}
