/* Checkpoint save, step 3 (ckpt_shared.h): from every rank's
 * descriptors, the same plan on every rank: one chunk per distinct (name,
 * box, range), written by the holder with the fewest bytes so far, the
 * largest chunks first; then, on rank 0, the metadata. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt_save_shared.h"
#include "mesh_internal.h"

/* Decode rank r's entries from its words into recs[*n ...]. */
static mpg_status decode_rank(mpg__ckpt_save *sv, int r, mpg__ckpt_rec *recs, int *n) {
  const int64_t *w = sv->all + (size_t)r * sv->stride;
  size_t at = MPG__DESC_HEAD;
  for (int64_t i = 0; i < w[2]; i++) {
    mpg__ckpt_rec *c = &recs[(*n)++];
    memset(c, 0, sizeof *c);
    c->rank = r;
    c->entry = (int)i;
    size_t len = (size_t)w[at++];
    c->name = (const char *)&w[at];
    at += (len + 8) / 8;
    c->dtype = (int)w[at++];
    c->kind = (int)w[at++];
    c->ndim = (int)w[at++];
    for (int k = 0; k < MPG_CKPT_MAX_NDIM; k++) {
      c->shape[k] = (uint64_t)w[at + k];
      c->box_off[k] = (uint64_t)w[at + 8 + k];
      c->box_shape[k] = (uint64_t)w[at + 16 + k];
    }
    at += 24;
    c->range_off = (uint64_t)w[at++];
    c->range_count = (uint64_t)w[at++];
    c->hash = (uint64_t)w[at++];
    c->nblocks = (uint64_t)w[at++];
    c->hashes = &w[at];
    at += c->nblocks;
    c->nbytes = c->range_count * mpg__ckpt_dtype_size(c->dtype);
    if (at > sv->stride) return mpg__fail(MPG_ERR_STATE, "descriptor of world rank %d is cut", r);
  }
  return MPG_OK;
}

static int cmp_u64s(const uint64_t *a, const uint64_t *b, int n) {
  for (int k = 0; k < n; k++)
    if (a[k] != b[k]) return a[k] < b[k] ? -1 : 1;
  return 0;
}

/* The chunk key: name, box, range; then the rank. */
static int key_cmp(const mpg__ckpt_rec *a, const mpg__ckpt_rec *b) {
  int c = strcmp(a->name, b->name);
  if (!c) c = cmp_u64s(a->box_off, b->box_off, MPG_CKPT_MAX_NDIM);
  if (!c) c = cmp_u64s(a->box_shape, b->box_shape, MPG_CKPT_MAX_NDIM);
  if (!c && a->range_off != b->range_off) c = a->range_off < b->range_off ? -1 : 1;
  if (!c && a->range_count != b->range_count) c = a->range_count < b->range_count ? -1 : 1;
  return c;
}

static int rec_cmp(const void *pa, const void *pb) {
  const mpg__ckpt_rec *a = pa, *b = pb;
  int c = key_cmp(a, b);
  return c ? c : (a->rank > b->rank) - (a->rank < b->rank);
}

static void shape_text(const mpg__ckpt_rec *c, char *buf, size_t cap) {
  size_t len = (size_t)snprintf(buf, cap, "%s [", mpg__ckpt_dtype_name(c->dtype));
  for (int k = 0; k < c->ndim && len < cap; k++)
    len += (size_t)snprintf(buf + len, cap - len, "%s%llu", k ? ", " : "",
                            (unsigned long long)c->shape[k]);
  if (len < cap) snprintf(buf + len, cap - len, "] %s", mpg__ckpt_kind_name(c->kind));
}

/* Every record of one name agrees with the first; replicas hash alike. */
static mpg_status check_agreement(const mpg__ckpt_save *sv) {
  int first = 0;
  for (int i = 1; i < sv->nrecs; i++) {
    const mpg__ckpt_rec *a = &sv->recs[first], *b = &sv->recs[i];
    if (strcmp(a->name, b->name)) {
      first = i;
      continue;
    }
    if (a->dtype != b->dtype || a->kind != b->kind || a->ndim != b->ndim ||
        cmp_u64s(a->shape, b->shape, MPG_CKPT_MAX_NDIM)) {
      char ta[160], tb[160];
      shape_text(a, ta, sizeof ta);
      shape_text(b, tb, sizeof tb);
      return mpg__fail(MPG_ERR_INVALID,
                       "tensor \"%s\": world rank %d registers %s but world rank %d %s",
                       a->name, a->rank, ta, b->rank, tb);
    }
    const mpg__ckpt_rec *lead = &sv->recs[b->lead];
    if (lead != b && lead->hash != b->hash)
      return mpg__fail(MPG_ERR_INVALID,
                       "tensor \"%s\": world ranks %d and %d hold the same piece (elements "
                       "[%llu, %llu) of their box) with different values",
                       a->name, lead->rank, b->rank, (unsigned long long)b->range_off,
                       (unsigned long long)(b->range_off + b->range_count));
  }
  return MPG_OK;
}

static int by_size(const void *pa, const void *pb, void *arg) {
  const mpg__ckpt_rec *r = arg;
  const mpg__ckpt_rec *a = &r[*(const int *)pa], *b = &r[*(const int *)pb];
  if (a->nbytes != b->nbytes) return a->nbytes > b->nbytes ? -1 : 1;
  return (*(const int *)pa > *(const int *)pb) - (*(const int *)pa < *(const int *)pb);
}

/* Choose the writers, largest chunks first, onto the least loaded holder;
 * then lay out each writer's file in chunk order. */
static mpg_status assign(mpg__ckpt_save *sv, uint64_t *load) {
  int nlead = 0, *leads = malloc(((size_t)sv->nrecs + 1) * sizeof *leads);
  if (!leads) return mpg__fail(MPG_ERR_NOMEM, "checkpoint plan: out of memory");
  for (int i = 0; i < sv->nrecs; i++)
    if (sv->recs[i].lead == i) leads[nlead++] = i;
  qsort_r(leads, (size_t)nlead, sizeof *leads, by_size, sv->recs);
  for (int j = 0; j < nlead; j++) {
    int l = leads[j], best = l;
    for (int i = l; i < sv->nrecs && sv->recs[i].lead == l; i++)
      if (load[sv->recs[i].rank] < load[sv->recs[best].rank]) best = i;
    sv->recs[l].writer = sv->recs[best].rank;
    load[sv->recs[best].rank] += sv->recs[l].nbytes;
  }
  free(leads);
  for (int r = 0; r < sv->world; r++) load[r] = 0;
  for (int i = 0; i < sv->nrecs; i++) {
    mpg__ckpt_rec *c = &sv->recs[i];
    if (c->lead != i) continue;
    c->file_off = load[c->writer];
    load[c->writer] += c->nbytes;
  }
  return MPG_OK;
}

/* This rank's writes: the chunks it was given, from its own pieces. */
static mpg_status own_writes(mpg__ckpt_save *sv) {
  sv->writes = calloc((size_t)sv->nrecs + 1, sizeof *sv->writes);
  if (!sv->writes) return mpg__fail(MPG_ERR_NOMEM, "checkpoint plan: out of memory");
  for (int i = 0; i < sv->nrecs; i++) {
    const mpg__ckpt_rec *l = &sv->recs[i];
    if (l->lead != i || l->writer != sv->rank) continue;
    const mpg__ckpt_rec *mine = l;
    for (int j = i; j < sv->nrecs && sv->recs[j].lead == i; j++)
      if (sv->recs[j].rank == sv->rank) mine = &sv->recs[j];
    const mpg__ckpt_piece *p = &sv->pieces[mine->entry];
    sv->writes[sv->nwrites++] = (mpg__ckpt_write){p->bytes, p->nbytes, l->file_off};
    sv->file_bytes = l->file_off + p->nbytes;
  }
  return MPG_OK;
}

mpg_status mpg__ckpt_build_meta(mpg_ckpt *ck, mpg__ckpt_save *sv, const uint64_t *file_bytes);

mpg_status mpg__ckpt_plan(mpg_ckpt *ck, mpg__ckpt_save *sv) {
  size_t total = 0;
  for (int r = 0; r < sv->world; r++) total += (size_t)sv->all[(size_t)r * sv->stride + 2];
  if (!total)
    return mpg__fail(MPG_ERR_STATE, "no rank registered anything to save (mpg_ckpt_add)");
  sv->recs = calloc(total, sizeof *sv->recs);
  uint64_t *load = calloc((size_t)sv->world, sizeof *load);
  mpg_status st = sv->recs && load ? MPG_OK : mpg__fail(MPG_ERR_NOMEM, "checkpoint plan");
  for (int r = 0; r < sv->world && !st; r++) st = decode_rank(sv, r, sv->recs, &sv->nrecs);
  if (!st) {
    qsort(sv->recs, (size_t)sv->nrecs, sizeof *sv->recs, rec_cmp);
    for (int i = 0; i < sv->nrecs; i++)
      sv->recs[i].lead = i && !key_cmp(&sv->recs[i - 1], &sv->recs[i]) ? sv->recs[i - 1].lead : i;
    st = check_agreement(sv);
  }
  if (!st) st = assign(sv, load);
  if (!st) st = own_writes(sv);
  if (!st && sv->rank == 0) {
    for (int r = 0; r < sv->world; r++) load[r] = 0;
    for (int i = 0; i < sv->nrecs; i++)
      if (sv->recs[i].lead == i) load[sv->recs[i].writer] += sv->recs[i].nbytes;
    st = mpg__ckpt_build_meta(ck, sv, load);
  }
  free(load);
  return st;
}

void mpg__ckpt_mesh_text(const mpg_ckpt *ck, char *buf, size_t cap) {
  mpg__mesh_text(mpg_ctx_mesh(ck->ctx), buf, cap);
  size_t len = strlen(buf);
  if (len < cap)
    snprintf(buf + len, cap - len, " world=%d%s", mpg_ctx_world_size(ck->ctx), ck->sync_note);
}

/* Rank 0: the metadata of the plan (ckpt_format.h). */
mpg_status mpg__ckpt_build_meta(mpg_ckpt *ck, mpg__ckpt_save *sv, const uint64_t *file_bytes) {
  mpg__ckpt_meta m;
  memset(&m, 0, sizeof m);
  char mesh[512];
  mpg__ckpt_mesh_text(ck, mesh, sizeof mesh);
  m.version = MPG__CKPT_VERSION;
  m.save_id = sv->save_id;
  m.step = sv->step;
  m.world = (uint32_t)sv->world;
  m.block_bytes = ck->opts.block_bytes;
  m.mesh = mesh;
  int *file_of = calloc((size_t)sv->world, sizeof *file_of);
  m.files = calloc((size_t)sv->world, sizeof *m.files);
  m.tensors = calloc((size_t)sv->nrecs, sizeof *m.tensors);
  m.chunks = calloc((size_t)sv->nrecs, sizeof *m.chunks);
  uint64_t nh = 0;
  for (int i = 0; i < sv->nrecs; i++)
    if (sv->recs[i].lead == i) nh += sv->recs[i].nblocks;
  m.hashes = malloc((size_t)nh * 8 + 8);
  mpg_status st = MPG_OK;
  if (!file_of || !m.files || !m.tensors || !m.chunks || !m.hashes)
    st = mpg__fail(MPG_ERR_NOMEM, "checkpoint metadata: out of memory");
  for (int r = 0; r < sv->world && !st; r++) {
    if (!file_bytes[r]) continue;
    file_of[r] = (int)m.nfiles;
    m.files[m.nfiles++] = (mpg__ckpt_file){(uint32_t)r, file_bytes[r]};
  }
  for (int i = 0; i < sv->nrecs && !st; i++) {
    const mpg__ckpt_rec *c = &sv->recs[i];
    if (c->lead != i) continue;
    if (!m.ntensors || strcmp(m.tensors[m.ntensors - 1].name, c->name)) {
      mpg__ckpt_tensor *t = &m.tensors[m.ntensors++];
      t->name = (char *)c->name;
      t->dtype = c->dtype;
      t->kind = c->kind;
      t->ndim = c->ndim;
      memcpy(t->shape, c->shape, sizeof t->shape);
      t->first_chunk = m.nchunks;
    }
    m.tensors[m.ntensors - 1].nchunks++;
    mpg__ckpt_chunk *k = &m.chunks[m.nchunks++];
    k->tensor = m.ntensors - 1;
    k->file = (uint32_t)file_of[c->writer];
    memcpy(k->box_off, c->box_off, sizeof k->box_off);
    memcpy(k->box_shape, c->box_shape, sizeof k->box_shape);
    k->range_off = c->range_off;
    k->range_count = c->range_count;
    k->file_off = c->file_off;
    k->first_hash = m.nhashes;
    memcpy(&m.hashes[m.nhashes], c->hashes, (size_t)c->nblocks * 8);
    m.nhashes += c->nblocks;
  }
  if (!st) st = mpg__ckpt_meta_encode(&m, &sv->meta, &sv->meta_len);
  if (st) st = mpg__fail_wrap(st, "encoding the metadata");
  free(file_of);
  free(m.files);
  free(m.tensors);
  free(m.chunks);
  free(m.hashes);
  return st;
}
