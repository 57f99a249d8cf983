/* mpg_sync_commit: resolve each parameter's reduce group, lay out one
 * buffer per (dtype, reduce group, tied group) in backward order, and cut
 * the buckets (see sync_internal.h). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sync_internal.h"

static size_t mib_bytes(double mb) {
  double b = mb * MIB;
  if (b >= (double)(SIZE_MAX / 4)) return SIZE_MAX / 4;
  return b < 1.0 ? 1 : (size_t)b;
}

void mpg__sync_free_layout(mpg_sync *s) {
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
    mpg__mesh_mask_names(s->mesh, masks[j], ",", names, sizeof names);
    mpg_status st = mpg_ctx_group_dims(s->ctx, names, &groups[j]);
    if (st) {
      const char *who = "";
      for (int i = 0; i < s->nparams && !who[0]; i++)
        if (s->params[i].dims && s->params[i].mask == masks[j]) who = s->params[i].name;
      return mpg__fail_wrap(st, "mpg_sync_commit: reduce group \"%s\" (of param \"%s\")",
                            names, who);
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
    if (st)
      return mpg__fail_wrap(st,
                            "mpg_sync_commit: buffer %d (%s, group \"%s\"%s%s, %d params, "
                            "%zu bytes)",
                            b, mpg_dtype_name(buf->dtype), mpg_group_name(buf->group),
                            buf->tied ? ", tied " : "",
                            buf->tied ? mpg_group_name(buf->tied) : "", buf->nparams,
                            bytes);
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
    mpg__sync_free_layout(s);
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
