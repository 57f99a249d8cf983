/* Checkpoint load (meshpg.h, mpg_ckpt_load): every rank reads the
 * metadata, plans, for each registered piece, which byte ranges of which
 * chunks hold its elements (whatever mesh saved them), reads the blocks
 * holding them into host staging and checks their checksums; only when
 * every rank has all of its pieces are the trainer's buffers written. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt_shared.h"
#include "groups_internal.h"

typedef struct seg { /* bytes of one chunk into the staging */
  uint32_t chunk;
  uint64_t src, bytes; /* in the chunk's data */
  unsigned char *dst;
} seg;

typedef struct loader {
  const char *dir;
  mpg__ckpt_reader r; /* the directory, its metadata and data files */
  mpg__ckpt_meta m;   /* r.m */
  seg *segs;
  size_t nsegs, cap;
  uint64_t *iv, *out; /* a row's uncovered intervals, and the next ones */
  size_t ivcap;
  unsigned char *block;  /* the cached block */
  int64_t cached_chunk;  /* -1: none */
  uint64_t cached_block;
  const char *tensor;    /* for messages */
} loader;

static mpg_status push_seg(loader *ld, uint32_t chunk, uint64_t src, uint64_t bytes,
                           unsigned char *dst) {
  if (ld->nsegs) { /* extend the last one when contiguous */
    seg *l = &ld->segs[ld->nsegs - 1];
    if (l->chunk == chunk && l->src + l->bytes == src && l->dst + l->bytes == dst) {
      l->bytes += bytes;
      return MPG_OK;
    }
  }
  if (ld->nsegs == ld->cap) {
    size_t cap = ld->cap ? 2 * ld->cap : 256;
    seg *ns = realloc(ld->segs, cap * sizeof *ns);
    if (!ns) return mpg__fail(MPG_ERR_NOMEM, "checkpoint load plan: out of memory");
    ld->segs = ns;
    ld->cap = cap;
  }
  ld->segs[ld->nsegs++] = (seg){chunk, src, bytes, dst};
  return MPG_OK;
}

typedef struct row { /* one row (last axis) of a piece to cover */
  uint64_t g[MPG_CKPT_MAX_NDIM]; /* global coordinates of its start */
  uint64_t len;
  unsigned char *dst;
  size_t niv; /* uncovered intervals of the last axis: ld->iv[0 .. 2 niv) */
} row;

/* Room for n intervals in ld->iv and ld->out. */
static mpg_status iv_room(loader *ld, size_t n) {
  if (n <= ld->ivcap) return MPG_OK;
  size_t cap = ld->ivcap ? 2 * ld->ivcap : 64;
  while (cap < n) cap *= 2;
  uint64_t *a = realloc(ld->iv, 2 * cap * sizeof *a);
  if (a) ld->iv = a;
  uint64_t *b = a ? realloc(ld->out, 2 * cap * sizeof *b) : NULL;
  if (b) ld->out = b;
  if (!a || !b) return mpg__fail(MPG_ERR_NOMEM, "checkpoint load plan: out of memory");
  ld->ivcap = cap;
  return MPG_OK;
}

/* Remove [p, q) from the row's uncovered intervals, emitting a segment for
 * each part that was uncovered (chunk element j_p at global p).  The
 * chunks may come in any order: each one splits an interval in at most
 * two, so the intervals grow by at most one per chunk. */
static mpg_status cover(loader *ld, row *w, uint32_t c, uint64_t p, uint64_t q, uint64_t src_p,
                        size_t esz) {
  mpg_status st = iv_room(ld, w->niv + 1);
  if (st) return st;
  size_t n = 0;
  uint64_t *iv = ld->iv, *out = ld->out;
  for (size_t i = 0; i < w->niv && !st; i++) {
    uint64_t s = iv[2 * i], t = iv[2 * i + 1];
    uint64_t x = s > p ? s : p, y = t < q ? t : q;
    if (x >= y) {
      out[2 * n] = s, out[2 * n + 1] = t, n++;
      continue;
    }
    st = push_seg(ld, c, src_p + (x - p) * esz, (y - x) * esz, w->dst + (x - w->g[0]) * esz);
    if (s < x) out[2 * n] = s, out[2 * n + 1] = x, n++;
    if (y < t) out[2 * n] = y, out[2 * n + 1] = t, n++;
  }
  ld->iv = out;
  ld->out = iv;
  w->niv = n;
  return st;
}

/* Cover one row from the tensor's chunks.  Here w->g[0] holds the row's
 * first last-axis coordinate (g[nd - 1]) for cover()'s arithmetic. */
static mpg_status plan_row(loader *ld, const mpg__ckpt_tensor *t, row *w, const uint64_t *gc) {
  int nd = t->ndim, L = nd - 1;
  size_t esz = mpg__ckpt_dtype_size(t->dtype);
  uint64_t a = gc[L];
  mpg_status st0 = iv_room(ld, 1);
  if (st0) return st0;
  ld->iv[0] = a, ld->iv[1] = a + w->len, w->niv = 1;
  for (uint32_t ci = t->first_chunk; ci < t->first_chunk + t->nchunks && w->niv; ci++) {
    const mpg__ckpt_chunk *c = &ld->m.chunks[ci];
    int in = 1;
    uint64_t jrow = 0;
    for (int k = 0; k < L && in; k++) {
      in = gc[k] >= c->box_off[k] && gc[k] < c->box_off[k] + c->box_shape[k];
      jrow = jrow * c->box_shape[k] + (gc[k] - c->box_off[k]);
    }
    if (!in) continue;
    jrow *= c->box_shape[L];
    uint64_t lo = c->box_off[L], hi = lo + c->box_shape[L];
    uint64_t x = a > lo ? a : lo, y = a + w->len < hi ? a + w->len : hi;
    if (x >= y) continue;
    uint64_t u = jrow + (x - lo), v = jrow + (y - lo);
    if (u < c->range_off) u = c->range_off;
    if (v > c->range_off + c->range_count) v = c->range_off + c->range_count;
    if (u >= v) continue;
    uint64_t p = lo + (u - jrow), q = lo + (v - jrow);
    mpg_status st = cover(ld, w, ci, p, q, (u - c->range_off) * esz, esz);
    if (st) return st;
  }
  if (!w->niv) return MPG_OK;
  char at[200];
  size_t len = 0;
  for (int k = 0; k < nd && len < sizeof at; k++)
    len += (size_t)snprintf(at + len, sizeof at - len, "%s%llu", k ? ", " : "",
                            (unsigned long long)(k == L ? ld->iv[0] : gc[k]));
  return mpg__fail(MPG_ERR_NOT_FOUND,
                   "%s: tensor \"%s\": element [%s] is in no chunk of the checkpoint", ld->dir,
                   t->name, at);
}

/* Every row of an entry's range: the segments that fill `dst`. */
static mpg_status plan_entry(loader *ld, const mpg__ckpt_tensor *t, const mpg__ckpt_entry *e,
                             unsigned char *dst) {
  int nd = e->ndim, L = nd - 1;
  size_t esz = mpg__ckpt_esz(e);
  uint64_t c[MPG_CKPT_MAX_NDIM], rest = e->range_off;
  for (int k = L; k >= 0; k--) {
    c[k] = rest % e->box_shape[k];
    rest /= e->box_shape[k];
  }
  row *w = malloc(sizeof *w);
  if (!w) return mpg__fail(MPG_ERR_NOMEM, "checkpoint load plan: out of memory");
  mpg_status st = MPG_OK;
  for (uint64_t i = e->range_off, end = i + e->range_count; i < end && !st;) {
    uint64_t gc[MPG_CKPT_MAX_NDIM];
    for (int k = 0; k < nd; k++) gc[k] = e->box_off[k] + c[k];
    w->len = e->box_shape[L] - c[L];
    if (w->len > end - i) w->len = end - i;
    w->dst = dst + (i - e->range_off) * esz;
    w->g[0] = gc[L];
    st = plan_row(ld, t, w, gc);
    i += w->len;
    c[L] += w->len;
    for (int k = L; k > 0 && c[k] >= e->box_shape[k]; k--) c[k] = 0, c[k - 1]++;
  }
  free(w);
  return st;
}

static mpg_status check_tensor(const loader *ld, const mpg__ckpt_entry *e, int *ti) {
  *ti = mpg__ckpt_meta_find(&ld->m, e->name);
  if (*ti < 0)
    return mpg__fail(MPG_ERR_NOT_FOUND, "%s: no tensor \"%s\" in the checkpoint", ld->dir,
                     e->name);
  const mpg__ckpt_tensor *t = &ld->m.tensors[*ti];
  int same = t->dtype == e->dtype && t->kind == e->kind && t->ndim == e->ndim;
  for (int k = 0; k < e->ndim && same; k++) same = t->shape[k] == e->shape[k];
  if (same) return MPG_OK;
  char a[160], b[160];
  size_t la = (size_t)snprintf(a, sizeof a, "%s %s [", mpg__ckpt_dtype_name(t->dtype),
                               mpg__ckpt_kind_name(t->kind));
  size_t lb = (size_t)snprintf(b, sizeof b, "%s %s [", mpg__ckpt_dtype_name(e->dtype),
                               mpg__ckpt_kind_name(e->kind));
  for (int k = 0; k < t->ndim && la < sizeof a; k++)
    la += (size_t)snprintf(a + la, sizeof a - la, "%s%llu", k ? ", " : "",
                           (unsigned long long)t->shape[k]);
  for (int k = 0; k < e->ndim && lb < sizeof b; k++)
    lb += (size_t)snprintf(b + lb, sizeof b - lb, "%s%llu", k ? ", " : "",
                           (unsigned long long)e->shape[k]);
  return mpg__fail(MPG_ERR_INVALID,
                   "%s: tensor \"%s\" is %s] in the checkpoint but %s] as registered", ld->dir,
                   e->name, a, b);
}

static int seg_cmp(const void *pa, const void *pb) {
  const seg *a = pa, *b = pb;
  if (a->chunk != b->chunk) return a->chunk < b->chunk ? -1 : 1;
  return (a->src > b->src) - (a->src < b->src);
}

static mpg_status read_segs(loader *ld);

/* The bytes of the registered pieces (the staging), each checked. */
static mpg_status stage_bytes(const mpg_ckpt *ck, size_t *total) {
  *total = 0;
  for (int i = 0; i < ck->n; i++) {
    const mpg__ckpt_entry *e = &ck->e[i];
    size_t esz = mpg__ckpt_esz(e);
    if (e->range_count > SIZE_MAX / esz || e->range_count * esz > SIZE_MAX - *total)
      return mpg__fail(MPG_ERR_NOMEM, "the registered pieces' bytes overflow the address space "
                       "at \"%s\"", e->name);
    *total += (size_t)(e->range_count * esz);
  }
  return MPG_OK;
}

static void loader_free(loader *ld) {
  ld->r.m = ld->m;
  mpg__ckpt_reader_close(&ld->r);
  memset(&ld->m, 0, sizeof ld->m);
  free(ld->segs);
  free(ld->block);
  free(ld->iv);
  free(ld->out);
  ld->segs = NULL;
  ld->block = NULL;
  ld->iv = ld->out = NULL;
  ld->nsegs = ld->cap = ld->ivcap = 0;
  ld->cached_chunk = -1;
}

/* One try: open the directory (and its data files when there are few),
 * plan every piece, open every data file the plan needs, then read and
 * check the blocks into the staging. */
static mpg_status load_once(mpg_ckpt *ck, loader *ld, unsigned char *stage) {
  mpg_status st = mpg__ckpt_reader_open(&ld->r, ld->dir);
  if (!st) mpg__ckpt_reader_open_all(&ld->r, MPG__CKPT_EAGER_FILES);
  ld->m = ld->r.m;
  size_t at = 0;
  for (int i = 0; i < ck->n && !st; i++) {
    const mpg__ckpt_entry *e = &ck->e[i];
    int ti;
    st = check_tensor(ld, e, &ti);
    if (!st) ld->tensor = e->name;
    if (!st) st = plan_entry(ld, &ld->m.tensors[ti], e, stage + at);
    at += (size_t)(e->range_count * mpg__ckpt_esz(e));
  }
  if (st) return st;
  qsort(ld->segs, ld->nsegs, sizeof *ld->segs, seg_cmp);
  /* Every file before the first read: the snapshot of this directory. */
  for (size_t i = 0; i < ld->nsegs && !st; i++) {
    const mpg__ckpt_chunk *c = &ld->m.chunks[ld->segs[i].chunk];
    int fd;
    st = mpg__ckpt_reader_file(&ld->r, c->file, &fd);
    if (st) st = mpg__fail_wrap(st, "tensor \"%s\"", ld->m.tensors[c->tensor].name);
  }
  return st ? st : read_segs(ld);
}

/* This rank's read of dir into the staging: when a save publishes a new
 * checkpoint as dir while this rank reads the old one, it reads the new
 * one, from the start. */
static mpg_status load_here(mpg_ckpt *ck, loader *ld, unsigned char *stage) {
  for (int tries = 1;; tries++) {
    mpg_status got = load_once(ck, ld, stage);
    if (!got || !mpg__ckpt_reader_moved(&ld->r)) return got;
    if (tries == MPG__CKPT_READ_TRIES)
      return mpg__fail_wrap(got, "%s was replaced by another save %d times while it was read",
                            ld->dir, tries);
    loader_free(ld);
  }
}

/* *same: 1 when every rank that read the metadata (st == MPG_OK) read the
 * same save id.  Collective over the world: the least and the greatest id
 * in one all-reduce (ids mapped to int64 in order; a rank that failed
 * sends the neutral INT64_MAX). */
static mpg_status same_save(mpg_ckpt *ck, mpg_status st, uint64_t id, int *same) {
  mpg_group *world = NULL;
  mpg_status cs = mpg_ctx_group(ck->ctx, "world", &world);
  if (cs) return mpg__fail_wrap(cs, "mpg_ckpt_load: the world group");
  int64_t s = (int64_t)(id ^ (UINT64_C(1) << 63));
  int64_t mine[2] = {st ? INT64_MAX : s, st ? INT64_MAX : ~s}, all[2];
  cs = mpg__group_host_all_reduce(world, mine, all, 2, MPG_I64, MPG_OP_MIN);
  if (cs) return mpg__fail_wrap(cs, "mpg_ckpt_load: comparing the saves the ranks read");
  *same = all[0] == INT64_MAX || all[0] == ~all[1];
  return MPG_OK;
}

mpg_status mpg__ckpt_load(mpg_ckpt *ck, const char *dir, long *step, void *stream) {
  loader ld;
  memset(&ld, 0, sizeof ld);
  ld.dir = dir;
  ld.cached_chunk = -1;
  ld.r.dfd = -1;
  size_t total = 0;
  unsigned char *stage = NULL;
  mpg_status staged = stage_bytes(ck, &total), st = MPG_OK;
  if (!staged) staged = mpg__ckpt_stage(ck, total, (void **)&stage);
  for (int round = 1;; round++) {
    st = staged ? staged : load_here(ck, &ld, stage);
    /* Every rank must have read the same save: one published between two
     * ranks' reads makes every rank read again. */
    int same = 1;
    mpg_status cs = same_save(ck, st, ld.m.save_id, &same);
    if (cs) {
      st = cs;
      break;
    }
    if (same) break;
    if (round == 4) {
      st = mpg__fail(MPG_ERR_IO, "%s: the ranks read different saves of it %d times (another "
                     "job saves to it while this one loads)", dir, round);
      break;
    }
    loader_free(&ld);
  }
  long saved_step = st ? 0 : (long)ld.m.step;
  st = mpg__ckpt_agree(ck, st, 0, "mpg_ckpt_load");
  int device = mpg__ctx_device_buffers(ck->ctx);
  size_t at = 0;
  for (int i = 0; i < ck->n && !st; i++) {
    const mpg__ckpt_entry *e = &ck->e[i];
    size_t n = (size_t)(e->range_count * mpg__ckpt_esz(e));
    if (e->host || !device) memcpy(e->data, stage + at, n);
    else st = mpg__ctx_copy(ck->ctx, e->data, stage + at, n, stream);
    at += n;
  }
  if (!st && device) st = mpg__ctx_stream_sync(ck->ctx, stream);
  if (!st && step) *step = saved_step;
  mpg__saved_error keep;
  mpg__error_save(&keep);
  loader_free(&ld);
  st = mpg__error_restore(st, &keep);
  return st ? mpg__fail_wrap(st, "mpg_ckpt_load(\"%s\")", dir) : MPG_OK;
}

/* Read block b of chunk ci into buf and check its checksum. */
static mpg_status read_block(loader *ld, uint32_t ci, uint64_t b, unsigned char *buf,
                             uint64_t *len) {
  const mpg__ckpt_chunk *c = &ld->m.chunks[ci];
  const mpg__ckpt_tensor *t = &ld->m.tensors[c->tensor];
  uint64_t bb = ld->m.block_bytes, nbytes = c->range_count * mpg__ckpt_dtype_size(t->dtype);
  uint64_t off = b * bb;
  *len = nbytes - off < bb ? nbytes - off : bb;
  char path[4200];
  mpg__ckpt_data_path(ld->dir, ld->m.files[c->file].rank, path, sizeof path);
  int fd = -1;
  mpg_status st = mpg__ckpt_reader_file(&ld->r, c->file, &fd);
  if (!st) st = mpg__file_pread_all(fd, buf, (size_t)*len, c->file_off + off, path);
  if (st) return mpg__fail_wrap(st, "tensor \"%s\"", t->name);
  uint64_t want = ld->m.hashes[c->first_hash + b], got = mpg__xxh64(buf, (size_t)*len, 0);
  if (want != got)
    return mpg__fail(MPG_ERR_INVALID,
                     "%s: tensor \"%s\": checksum mismatch at byte offset %llu of the file (%llu "
                     "bytes, block %llu of chunk %u): stored %016llx, computed %016llx",
                     path, t->name, (unsigned long long)(c->file_off + off),
                     (unsigned long long)*len, (unsigned long long)b,
                     (unsigned)(ci - t->first_chunk), (unsigned long long)want,
                     (unsigned long long)got);
  return MPG_OK;
}

/* Each segment from the blocks holding it: a block wholly inside a
 * segment is read straight into the staging, others through the cache. */
static mpg_status read_segs(loader *ld) {
  uint64_t bb = ld->m.block_bytes;
  if (ld->nsegs && !(ld->block = malloc((size_t)bb)))
    return mpg__fail(MPG_ERR_NOMEM, "checkpoint load: a block of %llu bytes",
                     (unsigned long long)bb);
  for (size_t i = 0; i < ld->nsegs; i++) {
    const seg *s = &ld->segs[i];
    for (uint64_t b = s->src / bb; b * bb < s->src + s->bytes; b++) {
      uint64_t lo = b * bb > s->src ? b * bb : s->src, len;
      uint64_t hi = (b + 1) * bb < s->src + s->bytes ? (b + 1) * bb : s->src + s->bytes;
      mpg_status st;
      if (lo == b * bb && hi == (b + 1) * bb) {
        st = read_block(ld, s->chunk, b, s->dst + (lo - s->src), &len);
        if (st) return st;
        continue;
      }
      if (ld->cached_chunk != (int64_t)s->chunk || ld->cached_block != b) {
        ld->cached_chunk = -1;
        st = read_block(ld, s->chunk, b, ld->block, &len);
        if (st) return st;
        ld->cached_chunk = s->chunk;
        ld->cached_block = b;
      }
      memcpy(s->dst + (lo - s->src), ld->block + (lo - b * bb), (size_t)(hi - lo));
    }
  }
  return MPG_OK;
}
