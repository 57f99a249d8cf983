/* Checkpoints: the handle and registration of the pieces
 * (ckpt_shared.h).  Save and load proper are ckpt_save.c and
 * ckpt_load.c; the agreement of every rank on a result is ckpt_common.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt_shared.h"
#include "groups_internal.h"
#include "sync_core.h"

mpg_status mpg_ckpt_create(mpg_ctx *ctx, const mpg_ckpt_opts *opts, mpg_ckpt **out) {
  if (out) *out = NULL;
  if (!ctx || !out) return mpg__fail(MPG_ERR_INVALID, "mpg_ckpt_create: NULL argument");
  mpg_ckpt_opts full = MPG_CKPT_OPTS_INIT;
  if (opts) {
    mpg_status bad = mpg__abi_in(&full, MPG__ABI_END(mpg_ckpt_opts), opts, MPG_CKPT_OPTS_MAGIC,
                                 "mpg_ckpt_create: opts", "MPG_CKPT_OPTS_INIT");
    if (bad) return bad;
  }
  if (!(full.timeout_s > 0) || full.timeout_s > 1e9)
    return mpg__fail(MPG_ERR_INVALID, "mpg_ckpt_create: opts.timeout_s is %g; expected > 0",
                     full.timeout_s);
  if (!full.block_bytes || full.block_bytes % 4096 || full.block_bytes > ((size_t)1 << 40))
    return mpg__fail(MPG_ERR_INVALID,
                     "mpg_ckpt_create: opts.block_bytes is %zu; expected a positive multiple "
                     "of 4096",
                     full.block_bytes);
  mpg_ckpt *ck = calloc(1, sizeof *ck);
  if (!ck) return mpg__fail(MPG_ERR_NOMEM, "mpg_ckpt_create: out of memory");
  ck->ctx = ctx;
  ck->opts = full;
  *out = ck;
  return MPG_OK;
}

/* The box of a split layout: axis split_axis cut in S parts over the
 * groups of dim set split_dims, part = this rank's position. */
static mpg_status split_box(const mpg_ckpt *ck, const mpg_tensor_layout *l, const char *what,
                            mpg__ckpt_entry *e) {
  const mpg_mesh *mesh = mpg_ctx_mesh(ck->ctx);
  int ds = -1, pos = 0, size = 1;
  mpg_status st = mpg_mesh_dimset_find(mesh, l->split_dims, &ds);
  if (st) return mpg__fail_wrap(st, "%s: layout.split_dims", what);
  st = mpg_mesh_group_of(mesh, ds, mpg_ctx_rank(ck->ctx), NULL, &pos, &size);
  if (st) return mpg__fail_wrap(st, "%s: layout.split_dims \"%s\"", what, l->split_dims);
  if (l->split_axis < 0 || l->split_axis >= l->ndim)
    return mpg__fail(MPG_ERR_INVALID, "%s: layout.split_axis is %d; expected 0..%d", what,
                     l->split_axis, l->ndim - 1);
  int a = l->split_axis;
  if (l->shape[a] % (size_t)size)
    return mpg__fail(MPG_ERR_RANGE,
                     "%s: layout.shape[%d] = %zu is not divisible by the size %d of the "
                     "\"%s\" groups",
                     what, a, l->shape[a], size, l->split_dims);
  e->box_shape[a] = l->shape[a] / (size_t)size;
  e->box_off[a] = e->box_shape[a] * (uint64_t)pos;
  return MPG_OK;
}

/* Fill an entry's shape, box and range from a layout (its name, dtype
 * and data are the caller's). */
static mpg_status entry_layout(const mpg_ckpt *ck, const mpg_tensor_layout *l, const char *what,
                               mpg__ckpt_entry *e) {
  if (l->ndim < 1 || l->ndim > MPG_CKPT_MAX_NDIM)
    return mpg__fail(MPG_ERR_INVALID, "%s: layout.ndim is %d; expected 1..%d", what, l->ndim,
                     MPG_CKPT_MAX_NDIM);
  if ((int)l->kind < 0 || l->kind > MPG_CKPT_BYTES)
    return mpg__fail(MPG_ERR_INVALID, "%s: layout.kind is %d", what, (int)l->kind);
  e->ndim = l->ndim;
  e->kind = (int)l->kind;
  /* Every product the format and the staging rely on, checked here: the
   * tensor's bytes fit 64 bits (so do a box's and a range's). */
  uint64_t esz = mpg__ckpt_dtype_size(e->dtype), bytes = esz ? esz : 1;
  int boxed = 0;
  for (int k = 0; k < l->ndim; k++) {
    if (!l->shape[k])
      return mpg__fail(MPG_ERR_INVALID, "%s: layout.shape[%d] is 0", what, k);
    if (bytes > UINT64_MAX / l->shape[k])
      return mpg__fail(MPG_ERR_INVALID,
                       "%s: layout.shape[%d] = %zu: the tensor's %s overflows 64 bits",
                       what, k, l->shape[k], esz ? "size in bytes" : "element count");
    bytes *= l->shape[k];
    e->shape[k] = l->shape[k];
    e->box_off[k] = 0;
    e->box_shape[k] = l->shape[k];
    boxed |= l->box_shape[k] != 0 || l->box_offset[k] != 0;
  }
  if (l->split_dims) {
    mpg_status st = split_box(ck, l, what, e);
    if (st) return st;
  } else if (boxed) {
    /* One rule for zero extents: a box is given when any of its fields is
     * set, and then it has a positive extent on every axis; all of them 0
     * (MPG_TENSOR_LAYOUT_INIT) is the whole tensor.  An empty piece is not
     * registered at all. */
    for (int k = 0; k < l->ndim; k++) {
      if (!l->box_shape[k])
        return mpg__fail(MPG_ERR_INVALID,
                         "%s: layout.box_shape[%d] is 0: a box has a positive extent on every "
                         "axis (leave every box_offset and box_shape 0 for the whole tensor; "
                         "register nothing for an empty piece)",
                         what, k);
      if (l->box_offset[k] > l->shape[k] || l->box_shape[k] > l->shape[k] - l->box_offset[k])
        return mpg__fail(MPG_ERR_INVALID,
                         "%s: layout box on axis %d (offset %zu, extent %zu) is outside the "
                         "shape %zu",
                         what, k, l->box_offset[k], l->box_shape[k], l->shape[k]);
      e->box_off[k] = l->box_offset[k];
      e->box_shape[k] = l->box_shape[k];
    }
  }
  uint64_t n = mpg__ckpt_box_elems(e->box_shape, e->ndim);
  if (!l->range_count && l->range_offset)
    return mpg__fail(MPG_ERR_INVALID,
                     "%s: layout.range_offset is %zu but range_count is 0 (0 and 0: the whole "
                     "box)",
                     what, l->range_offset);
  if (l->range_count) {
    if (l->range_offset > n || l->range_count > n - l->range_offset)
      return mpg__fail(MPG_ERR_INVALID,
                       "%s: layout range [%zu, %zu) is outside the box's %llu elements", what,
                       l->range_offset, l->range_offset + l->range_count,
                       (unsigned long long)n);
    e->range_off = l->range_offset;
    e->range_count = l->range_count;
  } else {
    e->range_off = 0;
    e->range_count = n;
  }
  return MPG_OK;
}

/* The registered names' hash set: open addressing, slot = entry index + 1
 * (0: empty), at most half full. */
struct mpg__ckpt_names {
  int *slot;
  size_t mask;
};

static size_t name_hash(const char *name) {
  return (size_t)mpg__xxh64(name, strlen(name), 0);
}

/* The entry index of `name`, or -1. */
static int names_find(const mpg_ckpt *ck, const char *name) {
  const struct mpg__ckpt_names *h = ck->names;
  if (!h) return -1;
  for (size_t i = name_hash(name) & h->mask;; i = (i + 1) & h->mask) {
    int v = h->slot[i];
    if (!v) return -1;
    if (strcmp(ck->e[v - 1].name, name) == 0) return v - 1;
  }
}

/* Insert entry `id` (its name not in the set), growing the table. */
static mpg_status names_insert(mpg_ckpt *ck, int id) {
  struct mpg__ckpt_names *h = ck->names;
  if (!h) {
    if (!(h = calloc(1, sizeof *h))) return mpg__fail(MPG_ERR_NOMEM, "mpg_ckpt_add: out of memory");
    ck->names = h;
  }
  if (!h->slot || (size_t)(id + 1) * 2 > h->mask + 1) {
    size_t cap = h->slot ? 2 * (h->mask + 1) : 64;
    int *ns = calloc(cap, sizeof *ns);
    if (!ns) return mpg__fail(MPG_ERR_NOMEM, "mpg_ckpt_add: out of memory");
    for (int j = 0; j < id; j++) {
      size_t i = name_hash(ck->e[j].name) & (cap - 1);
      while (ns[i]) i = (i + 1) & (cap - 1);
      ns[i] = j + 1;
    }
    free(h->slot);
    h->slot = ns;
    h->mask = cap - 1;
  }
  size_t i = name_hash(ck->e[id].name) & h->mask;
  while (h->slot[i]) i = (i + 1) & h->mask;
  h->slot[i] = id + 1;
  return MPG_OK;
}

/* A name shown in a message: at most 40 bytes, bytes outside printable
 * ASCII as \xNN. */
static void name_shown(const char *name, char *buf, size_t cap) {
  size_t n = 0;
  for (const unsigned char *p = (const unsigned char *)name; *p && n + 5 < cap && n < 40; p++)
    n += (size_t)snprintf(buf + n, cap - n, *p < 0x20 || *p >= 0x7F || *p == '\\' ? "\\x%02x"
                                                                                  : "%c", *p);
  buf[n < cap ? n : cap - 1] = '\0';
}

static mpg_status check_add(mpg_ckpt *ck, const char *name, const char *what) {
  if (!ck || !name) return mpg__fail(MPG_ERR_INVALID, "%s: NULL argument", what);
  if (ck->save)
    return mpg__fail(MPG_ERR_STATE, "%s: a save is in flight (call mpg_ckpt_wait first)", what);
  size_t len = strlen(name);
  char shown[200];
  name_shown(name, shown, sizeof shown);
  if (!len || len > MPG__CKPT_NAME_MAX)
    return mpg__fail(MPG_ERR_INVALID, "%s: name \"%s\" has %zu bytes; expected 1..%d", what,
                     shown, len, MPG__CKPT_NAME_MAX);
  const char *rule = mpg__ckpt_name_rule(name);
  if (rule)
    return mpg__fail(MPG_ERR_INVALID, "%s: name \"%s\" is refused: %s", what, shown, rule);
  int i = names_find(ck, name);
  if (i >= 0)
    return mpg__fail(MPG_ERR_INVALID, "%s: \"%s\" is registered already (as #%d)", what, name,
                     i);
  return MPG_OK;
}

/* Append *e (its name copied) and set *id. */
static mpg_status push(mpg_ckpt *ck, const char *name, mpg__ckpt_entry *e, int *id) {
  if (ck->n == ck->cap) {
    int cap = ck->cap ? 2 * ck->cap : 16;
    mpg__ckpt_entry *ne = realloc(ck->e, (size_t)cap * sizeof *ne);
    if (!ne) return mpg__fail(MPG_ERR_NOMEM, "mpg_ckpt_add: out of memory");
    ck->e = ne;
    ck->cap = cap;
  }
  e->name = strdup(name);
  if (!e->name) return mpg__fail(MPG_ERR_NOMEM, "mpg_ckpt_add: out of memory");
  ck->e[ck->n] = *e;
  mpg_status st = names_insert(ck, ck->n);
  if (st) {
    free(e->name);
    return st;
  }
  if (id) *id = ck->n;
  ck->n++;
  return MPG_OK;
}

static mpg_status add_common(mpg_ckpt *ck, const char *name, mpg_dtype dtype,
                             const mpg_tensor_layout *layout, void *data, int *id,
                             const char *what, mpg__ckpt_entry *e) {
  if (id) *id = -1;
  mpg_status st = check_add(ck, name, what);
  if (st) return st;
  if (!layout) return mpg__fail(MPG_ERR_INVALID, "%s: layout is NULL", what);
  mpg_tensor_layout l = MPG_TENSOR_LAYOUT_INIT;
  st = mpg__abi_in(&l, MPG__ABI_END(mpg_tensor_layout), layout, MPG_TENSOR_LAYOUT_MAGIC,
                   "layout", "MPG_TENSOR_LAYOUT_INIT");
  if (st) return mpg__fail_wrap(st, "%s(\"%s\")", what, name);
  if ((int)dtype < 0 || (int)dtype >= MPG_DTYPE_COUNT)
    return mpg__fail(MPG_ERR_INVALID, "%s(\"%s\"): dtype %d is not a mpg_dtype", what, name,
                     (int)dtype);
  e->dtype = (int)dtype;
  e->data = data;
  char where[300];
  snprintf(where, sizeof where, "%s(\"%s\")", what, name);
  if (e->kind == MPG_CKPT_STATE) { /* the owned range, not the layout's */
    l.kind = MPG_CKPT_STATE;
    l.range_offset = (size_t)e->range_off;
    l.range_count = (size_t)e->range_count;
  }
  int state_none = e->kind == MPG_CKPT_STATE && e->range_count == 0 && e->data == NULL;
  st = entry_layout(ck, &l, where, e);
  if (st) return st;
  if (state_none) return MPG_OK; /* owns nothing of it */
  if (!data) return mpg__fail(MPG_ERR_INVALID, "%s: data is NULL", where);
  return push(ck, name, e, id);
}

mpg_status mpg_ckpt_add(mpg_ckpt *ck, const char *name, mpg_dtype dtype,
                        const mpg_tensor_layout *layout, void *data, int *id) {
  mpg__ckpt_entry e;
  memset(&e, 0, sizeof e);
  e.kind = -1;
  return add_common(ck, name, dtype, layout, data, id, "mpg_ckpt_add", &e);
}

mpg_status mpg_ckpt_add_state(mpg_ckpt *ck, const char *name, mpg_dtype dtype,
                              const mpg_tensor_layout *layout, mpg_sync *sync, int param,
                              void *state) {
  const char *what = "mpg_ckpt_add_state";
  if (!ck || !sync || !layout || !state)
    return mpg__fail(MPG_ERR_INVALID, "%s: NULL argument", what);
  if (sync->ctx != ck->ctx)
    return mpg__fail(MPG_ERR_INVALID, "%s(\"%s\"): the sync belongs to another context", what,
                     name ? name : "");
  if (!sync->committed)
    return mpg__fail(MPG_ERR_STATE, "%s: the sync is not committed", what);
  mpg__ckpt_entry e;
  memset(&e, 0, sizeof e);
  e.kind = MPG_CKPT_STATE;
  mpg_shard_info si = MPG_SHARD_INFO_INIT;
  int shard = sync->opts.sync.mode == MPG_SYNC_SHARD;
  if (shard) {
    mpg_status st = mpg_sync_get_shard(sync, param, &si);
    if (st) return mpg__fail_wrap(st, "%s(\"%s\")", what, name ? name : "");
    snprintf(ck->sync_note, sizeof ck->sync_note, " sync=shard");
  } else {
    if (param < 0 || param >= sync->layout.nparams)
      return mpg__fail(MPG_ERR_RANGE, "%s: param %d is outside 0..%d", what, param,
                       sync->layout.nparams - 1);
    snprintf(ck->sync_note, sizeof ck->sync_note, " sync=replicate");
  }
  /* The box is the param: its count must match. */
  mpg__ckpt_entry probe;
  memset(&probe, 0, sizeof probe);
  mpg_tensor_layout whole = *layout;
  whole.range_offset = whole.range_count = 0;
  mpg_status st = entry_layout(ck, &whole, what, &probe);
  if (st) return st;
  size_t count = sync->layout.params[param].count;
  if (probe.range_count != count)
    return mpg__fail(MPG_ERR_INVALID,
                     "%s(\"%s\"): the layout's box has %llu elements but param %d has %zu",
                     what, name ? name : "", (unsigned long long)probe.range_count, param, count);
  void *data = state;
  if (shard) {
    if (!si.count) {
      e.data = NULL; /* nothing owned: checked, not registered */
      return add_common(ck, name, dtype, layout, NULL, NULL, what, &e);
    }
    e.range_off = si.param_offset;
    e.range_count = si.count;
    data = (char *)state + si.shard_offset * mpg__ckpt_dtype_size((int)dtype);
  }
  e.data = data;
  return add_common(ck, name, dtype, layout, data, NULL, what, &e);
}

mpg_status mpg_ckpt_add_bytes(mpg_ckpt *ck, const char *name, void *data, size_t len) {
  const char *what = "mpg_ckpt_add_bytes";
  mpg_status st = check_add(ck, name, what);
  if (st) return st;
  if (!data || !len)
    return mpg__fail(MPG_ERR_INVALID, "%s(\"%s\"): %s", what, name,
                     data ? "len is 0" : "data is NULL");
  mpg__ckpt_entry e;
  memset(&e, 0, sizeof e);
  e.dtype = MPG__CKPT_DT_U8;
  e.kind = MPG_CKPT_BYTES;
  e.ndim = 1;
  e.shape[0] = e.box_shape[0] = e.range_count = len;
  e.data = data;
  e.host = 1;
  return push(ck, name, &e, NULL);
}

mpg_status mpg_ckpt_save(mpg_ckpt *ck, const char *dir, long step, void *stream) {
  if (!ck || !dir || !*dir) return mpg__fail(MPG_ERR_INVALID, "mpg_ckpt_save: NULL argument");
  if (ck->save) {
    mpg_status st = mpg__ckpt_save_finish(ck);
    if (st) return mpg__fail_wrap(st, "mpg_ckpt_save: the save before this one failed");
  }
  mpg_status st = mpg__ckpt_save_start(ck, dir, step, stream);
  if (st || ck->opts.async) return st;
  return mpg__ckpt_save_finish(ck);
}

mpg_status mpg_ckpt_wait(mpg_ckpt *ck) {
  if (!ck) return mpg__fail(MPG_ERR_INVALID, "mpg_ckpt_wait: ck is NULL");
  return ck->save ? mpg__ckpt_save_finish(ck) : MPG_OK;
}

mpg_status mpg_ckpt_load(mpg_ckpt *ck, const char *dir, long *step, void *stream) {
  if (!ck || !dir || !*dir) return mpg__fail(MPG_ERR_INVALID, "mpg_ckpt_load: NULL argument");
  if (ck->save) {
    mpg_status st = mpg__ckpt_save_finish(ck);
    if (st) return mpg__fail_wrap(st, "mpg_ckpt_load: the save in flight failed");
  }
  return mpg__ckpt_load(ck, dir, step, stream);
}

mpg_status mpg_ckpt_destroy(mpg_ckpt *ck) {
  if (!ck) return MPG_OK;
  if (ck->save) (void)mpg__ckpt_save_finish(ck);
  for (int i = 0; i < ck->n; i++) free(ck->e[i].name);
  if (ck->stage) (void)mpg__ctx_host_free(ck->ctx, ck->stage);
  free(ck->e);
  if (ck->names) free(ck->names->slot);
  free(ck->names);
  free(ck);
  return MPG_OK;
}
