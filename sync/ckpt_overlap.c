/* Checkpoint save: overlapping parts of one tensor (ckpt_save_shared.h,
 * mpg__ckpt_check_overlaps).  Two chunks of a tensor that are not replicas
 * (another box, or another range of the same box) may hold some of the
 * same elements; they must hold the same bytes there, or the checkpoint
 * would answer one reader with one rank's values and another reader with
 * the other's.  Every rank finds the same pairs from the plan; the holder
 * of each side hashes its bytes of the common elements (row by row, in the
 * tensor's row-major order), one all-reduce compares them, and only when
 * a pair differs are its common elements exchanged, a window at a time, to
 * name the first element that differs. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt_save_shared.h"
#include "groups_internal.h"

typedef struct pair {
  int a, b; /* lead records */
} pair;

/* The common elements of records a and b, as segments of rows: for each
 * row of the boxes' intersection (all axes but the last), the elements
 * [tlo, thi) from the row's start, which is element ka0 of a's box and
 * kb0 of b's. */
typedef int (*seg_fn)(void *ctx, const uint64_t *idx, uint64_t tlo, uint64_t thi, uint64_t ka0,
                      uint64_t kb0);

static int box_meet(const mpg__ckpt_rec *a, const mpg__ckpt_rec *b, uint64_t *lo, uint64_t *hi) {
  for (int d = 0; d < a->ndim; d++) {
    lo[d] = a->box_off[d] > b->box_off[d] ? a->box_off[d] : b->box_off[d];
    uint64_t ea = a->box_off[d] + a->box_shape[d], eb = b->box_off[d] + b->box_shape[d];
    hi[d] = ea < eb ? ea : eb;
    if (lo[d] >= hi[d]) return 0;
  }
  return 1;
}

static uint64_t box_pos(const mpg__ckpt_rec *c, const uint64_t *idx) {
  uint64_t k = 0;
  for (int d = 0; d < c->ndim; d++) k = k * c->box_shape[d] + (idx[d] - c->box_off[d]);
  return k;
}

static void walk(const mpg__ckpt_rec *a, const mpg__ckpt_rec *b, seg_fn fn, void *ctx) {
  uint64_t lo[MPG_CKPT_MAX_NDIM], hi[MPG_CKPT_MAX_NDIM], idx[MPG_CKPT_MAX_NDIM];
  if (!box_meet(a, b, lo, hi)) return;
  int nd = a->ndim, last = nd - 1;
  memcpy(idx, lo, sizeof idx);
  uint64_t len = hi[last] - lo[last];
  uint64_t a_end = a->range_off + a->range_count, b_end = b->range_off + b->range_count;
  for (;;) {
    uint64_t ka0 = box_pos(a, idx), kb0 = box_pos(b, idx);
    uint64_t tlo = 0, thi = len;
    if (a->range_off > ka0 && a->range_off - ka0 > tlo) tlo = a->range_off - ka0;
    if (b->range_off > kb0 && b->range_off - kb0 > tlo) tlo = b->range_off - kb0;
    thi = a_end <= ka0 ? 0 : (a_end - ka0 < thi ? a_end - ka0 : thi);
    thi = b_end <= kb0 ? 0 : (b_end - kb0 < thi ? b_end - kb0 : thi);
    if (tlo < thi && fn(ctx, idx, tlo, thi, ka0, kb0)) return;
    int d = last - 1;
    while (d >= 0 && ++idx[d] == hi[d]) {
      idx[d] = lo[d];
      d--;
    }
    if (d < 0) return;
  }
}

/* The hash of one side's bytes of the common elements. */
typedef struct hash_ctx {
  const unsigned char *bytes;
  uint64_t range_off;
  size_t esz;
  int side;
  uint64_t h, n;
} hash_ctx;

static int hash_seg(void *p, const uint64_t *idx, uint64_t tlo, uint64_t thi, uint64_t ka0,
                    uint64_t kb0) {
  (void)idx;
  hash_ctx *c = p;
  uint64_t k = (c->side ? kb0 : ka0) + tlo - c->range_off;
  c->h = mpg__xxh64(c->bytes + k * c->esz, (size_t)((thi - tlo) * c->esz), c->h);
  c->n += thi - tlo;
  return 0;
}

/* A window of one side's common elements (each in a word), or, bytes
 * NULL, the index of common element `skip`. */
typedef struct win_ctx {
  const unsigned char *bytes;
  uint64_t range_off;
  size_t esz;
  int side, nd;
  uint64_t skip, want, got;
  int64_t *out;
  uint64_t at[MPG_CKPT_MAX_NDIM];
} win_ctx;

static int win_seg(void *p, const uint64_t *idx, uint64_t tlo, uint64_t thi, uint64_t ka0,
                   uint64_t kb0) {
  win_ctx *c = p;
  uint64_t n = thi - tlo;
  if (c->skip >= n) {
    c->skip -= n;
    return 0;
  }
  tlo += c->skip;
  c->skip = 0;
  if (!c->bytes) {
    memcpy(c->at, idx, sizeof c->at);
    c->at[c->nd - 1] += tlo;
    return 1;
  }
  uint64_t k = (c->side ? kb0 : ka0) + tlo - c->range_off;
  for (; tlo < thi && c->got < c->want; tlo++, k++, c->got++)
    memcpy(&c->out[c->got], c->bytes + k * c->esz, c->esz);
  return c->got == c->want;
}

static size_t index_text(const uint64_t *idx, int nd, char *buf, size_t cap) {
  size_t len = (size_t)snprintf(buf, cap, "[");
  for (int d = 0; d < nd && len < cap; d++)
    len += (size_t)snprintf(buf + len, cap - len, "%s%llu", d ? ", " : "",
                            (unsigned long long)idx[d]);
  if (len < cap) len += (size_t)snprintf(buf + len, cap - len, "]");
  return len;
}

static void box_text(const mpg__ckpt_rec *c, char *buf, size_t cap) {
  size_t len = (size_t)snprintf(buf, cap, "box offset ");
  len += index_text(c->box_off, c->ndim, buf + len, cap - len);
  if (len < cap) len += (size_t)snprintf(buf + len, cap - len, " shape ");
  if (len < cap) len += index_text(c->box_shape, c->ndim, buf + len, cap - len);
  uint64_t all = 1;
  for (int d = 0; d < c->ndim; d++) all *= c->box_shape[d];
  if (len < cap && (c->range_off || c->range_count != all))
    snprintf(buf + len, cap - len, " elements [%llu, %llu)", (unsigned long long)c->range_off,
             (unsigned long long)(c->range_off + c->range_count));
}

/* Pair p differs: find its first element that differs (collective). */
static mpg_status name_element(mpg__ckpt_save *sv, mpg_group *world, const pair *p) {
  enum { W = 4096 };
  const mpg__ckpt_rec *ra = &sv->recs[p->a], *rb = &sv->recs[p->b];
  size_t esz = mpg__ckpt_dtype_size(ra->dtype);
  int64_t *mine = malloc((2 * W + 1) * 8), *all = malloc((2 * W + 1) * 8);
  mpg_status st = mine && all ? MPG_OK : mpg__fail(MPG_ERR_NOMEM, "checkpoint overlap check");
  /* every rank runs the loop: the all-reduced count ends it alike */
  int64_t found = -1, va = 0, vb = 0;
  for (uint64_t skip = 0; !st && found < 0; skip += W) {
    memset(mine, 0, (2 * W + 1) * 8);
    for (int side = 0; side < 2; side++) {
      const mpg__ckpt_rec *r = side ? rb : ra;
      if (r->rank != sv->rank) continue;
      win_ctx c = {sv->pieces[r->entry].bytes, r->range_off, esz, side, r->ndim, skip, W, 0,
                   mine + (size_t)side * W, {0}};
      walk(ra, rb, win_seg, &c);
      if (!side) mine[2 * W] = (int64_t)c.got;
    }
    st = mpg__group_host_all_reduce(world, mine, all, 2 * W + 1, MPG_I64, MPG_OP_SUM);
    if (st) break;
    for (int64_t i = 0; i < all[2 * W] && found < 0; i++)
      if (all[i] != all[W + i]) {
        found = (int64_t)skip + i;
        va = all[i];
        vb = all[W + i];
      }
    if (all[2 * W] < W) break;
  }
  free(mine);
  free(all);
  if (st) return mpg__fail_wrap(st, "comparing overlapping parts of \"%s\"", ra->name);
  char ta[300], tb[300], where[200] = "an element";
  box_text(ra, ta, sizeof ta);
  box_text(rb, tb, sizeof tb);
  if (found >= 0) {
    win_ctx c = {NULL, 0, esz, 0, ra->ndim, (uint64_t)found, 0, 0, NULL, {0}};
    walk(ra, rb, win_seg, &c);
    size_t len = (size_t)snprintf(where, sizeof where, "element ");
    index_text(c.at, ra->ndim, where + len, sizeof where - len);
  }
  return mpg__fail(MPG_ERR_INVALID,
                   "tensor \"%s\": world ranks %d and %d register overlapping parts (%s; %s) "
                   "with different values: %s is 0x%0*llx on world rank %d and 0x%0*llx on "
                   "world rank %d",
                   ra->name, ra->rank, rb->rank, ta, tb, where, (int)(2 * esz),
                   (unsigned long long)va, ra->rank, (int)(2 * esz), (unsigned long long)vb,
                   rb->rank);
}

static int same_box(const mpg__ckpt_rec *a, const mpg__ckpt_rec *b) {
  return !memcmp(a->box_off, b->box_off, sizeof a->box_off) &&
         !memcmp(a->box_shape, b->box_shape, sizeof a->box_shape);
}

static mpg_status push(pair **v, size_t *n, size_t *cap, int a, int b) {
  if (*n == *cap) {
    size_t c = *cap ? 2 * *cap : 64;
    pair *nv = realloc(*v, c * sizeof *nv);
    if (!nv) return mpg__fail(MPG_ERR_NOMEM, "checkpoint overlap check: out of memory");
    *v = nv;
    *cap = c;
  }
  (*v)[(*n)++] = (pair){a, b};
  return MPG_OK;
}

/* The pairs of distinct chunks of one tensor that may share elements:
 * ranges of one box that overlap (sorted by their offset), and chunks of
 * boxes that intersect (box by box: few boxes per tensor). */
static mpg_status find_pairs(const mpg__ckpt_save *sv, pair **out, size_t *np) {
  size_t n = 0, cap = 0;
  pair *v = NULL;
  mpg_status st = MPG_OK;
  const mpg__ckpt_rec *r = sv->recs;
  int *run = malloc(((size_t)sv->nrecs + 1) * sizeof *run); /* starts of the box runs */
  if (!run) return mpg__fail(MPG_ERR_NOMEM, "checkpoint overlap check: out of memory");
  for (int first = 0, end; first < sv->nrecs && !st; first = end) {
    int nrun = 0;
    run[nrun++] = first;
    for (end = first + 1; end < sv->nrecs && !strcmp(r[end].name, r[first].name); end++)
      if (!same_box(&r[end], &r[end - 1])) run[nrun++] = end;
    run[nrun] = end;
    for (int b = 0; b < nrun && !st; b++)
      for (int i = run[b]; i < run[b + 1] && !st; i++) {
        if (r[i].lead != i) continue;
        for (int j = i + 1; j < run[b + 1] && !st; j++) {
          if (r[j].lead != j) continue;
          if (r[j].range_off >= r[i].range_off + r[i].range_count) break;
          st = push(&v, &n, &cap, i, j);
        }
      }
    for (int b = 0; b < nrun && !st; b++)
      for (int c = b + 1; c < nrun && !st; c++) {
        uint64_t lo[MPG_CKPT_MAX_NDIM], hi[MPG_CKPT_MAX_NDIM];
        if (!box_meet(&r[run[b]], &r[run[c]], lo, hi)) continue;
        for (int i = run[b]; i < run[b + 1] && !st; i++)
          for (int j = run[c]; j < run[c + 1] && !st; j++)
            if (r[i].lead == i && r[j].lead == j) st = push(&v, &n, &cap, i, j);
      }
  }
  free(run);
  *out = v;
  *np = n;
  return st;
}

mpg_status mpg__ckpt_check_overlaps(mpg_ckpt *ck, mpg__ckpt_save *sv) {
  pair *pairs = NULL;
  size_t np = 0;
  mpg_status st = find_pairs(sv, &pairs, &np);
  if (st || !np) { /* the same on every rank (but out of memory) */
    free(pairs);
    return st;
  }
  mpg_group *world = NULL;
  int64_t *mine = calloc(2 * np, 8), *all = calloc(2 * np, 8);
  if (!mine || !all) st = mpg__fail(MPG_ERR_NOMEM, "checkpoint overlap check: out of memory");
  if (!st) st = mpg_ctx_group(ck->ctx, "world", &world);
  for (size_t k = 0; k < np && !st; k++)
    for (int side = 0; side < 2; side++) {
      const mpg__ckpt_rec *r = &sv->recs[side ? pairs[k].b : pairs[k].a];
      if (r->rank != sv->rank) continue;
      hash_ctx c = {sv->pieces[r->entry].bytes, r->range_off, mpg__ckpt_dtype_size(r->dtype),
                    side, 0, 0};
      walk(&sv->recs[pairs[k].a], &sv->recs[pairs[k].b], hash_seg, &c);
      mine[2 * k + side] = (int64_t)(c.h ^ c.n);
    }
  if (!st) st = mpg__group_host_all_reduce(world, mine, all, 2 * np, MPG_I64, MPG_OP_SUM);
  for (size_t k = 0; k < np && !st; k++)
    if (all[2 * k] != all[2 * k + 1]) {
      st = name_element(sv, world, &pairs[k]);
      break;
    }
  free(mine);
  free(all);
  free(pairs);
  return st;
}
