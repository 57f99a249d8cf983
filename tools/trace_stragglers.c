/* Who slows a healthy job (tools/trace_stragglers.h; docs/trace.md,
 * "Stragglers").  One pass over the dumps' collectives makes an entry per
 * (rank, operation); a counting sort by group instance, then one by
 * number within each instance (its numbers are a window of the ring, so
 * the range is small; a sparse one is sorted by qsort), lines up the
 * members of every collective instance; their lateness samples go, by a
 * counting sort on (dim set, rank), to per-rank lists whose medians and
 * 95th percentiles are read after sorting each short list. */
#define _POSIX_C_SOURCE 200809L
#include "trace_stragglers.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- interning group instances and dim sets ---- */

typedef struct key {
  const char *name;
  int index; /* -1: a dim set (name only) */
  int id;
} key;

typedef struct table {
  key *slots;
  size_t cap; /* a power of two, at least twice the keys */
  int n;
} table;

static uint64_t hash_of(const char *s, int index) {
  uint64_t h = 1469598103934665603ull;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  h = (h ^ (uint64_t)(uint32_t)index) * 1099511628211ull;
  return h ^ (h >> 29);
}

static int table_init(table *t, size_t keys) {
  t->cap = 16;
  while (t->cap < 2 * keys + 2) t->cap *= 2;
  t->slots = calloc(t->cap, sizeof *t->slots);
  t->n = 0;
  return t->slots ? 0 : -1;
}

/* The id of (name, index), a new one (t->n) when absent; *fresh says so. */
static int table_id(table *t, const char *name, int index, int *fresh) {
  size_t m = t->cap - 1, at = (size_t)hash_of(name, index) & m;
  for (;; at = (at + 1) & m) {
    key *k = &t->slots[at];
    if (!k->name) {
      k->name = name;
      k->index = index;
      k->id = t->n++;
      *fresh = 1;
      return k->id;
    }
    if (k->index == index && !strcmp(k->name, name)) {
      *fresh = 0;
      return k->id;
    }
  }
}

/* ---- the pass ---- */

typedef struct entry {
  uint64_t gseq;
  uint32_t inst, ri, k; /* instance, index into ranks, index into its ops */
} entry;

typedef struct inst_info {
  int dimset;
  int holders;  /* ranks with a dump that list the instance */
  int counted;  /* 1: a collective of it was counted */
} inst_info;

typedef struct sample {
  int64_t late, own;
} sample;

static int is_p2p(const char *kind) { return !strcmp(kind, "send") || !strcmp(kind, "recv"); }

/* The time since rank r's operation before k ended (issued, when it ended
 * after k's issue or not at all); INT64_MAX when the ring lost it. */
static int64_t gap_before(const tr_rank *r, int k) {
  const tr_op *o = &r->ops[k];
  if (k == 0 || r->ops[k - 1].seq + 1 != o->seq) return INT64_MAX;
  const tr_op *p = &r->ops[k - 1];
  int64_t ref = p->end_ns && p->end_ns <= o->issue_ns ? p->end_ns : p->issue_ns;
  return ref && ref <= o->issue_ns ? o->issue_ns - ref : 0;
}

static int cmp_gseq(const void *a, const void *b) {
  uint64_t x = ((const entry *)a)->gseq, y = ((const entry *)b)->gseq;
  return x < y ? -1 : x > y;
}

static int cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return x < y ? -1 : x > y;
}

/* The slowest first; ties by rank. */
static int cmp_stat(const void *a, const void *b) {
  const ts_stat *x = a, *y = b;
  if (x->own_median != y->own_median) return x->own_median > y->own_median ? -1 : 1;
  if (x->late_median != y->late_median) return x->late_median > y->late_median ? -1 : 1;
  return (x->rank > y->rank) - (x->rank < y->rank);
}

static int cmp_dimset(const void *a, const void *b) {
  return strcmp(((const ts_dimset *)a)->name, ((const ts_dimset *)b)->name);
}

/* The lower median and the 95th percentile (nearest rank) of v[0..m). */
static void order_stats(int64_t *v, int m, int64_t *median, int64_t *p95) {
  qsort(v, (size_t)m, sizeof *v, cmp_i64);
  *median = v[(m - 1) / 2];
  int at = (int)((95 * (int64_t)m + 99) / 100) - 1;
  *p95 = v[at < 0 ? 0 : at];
}

void ts_report_free(ts_report *r) {
  if (!r) return;
  for (int d = 0; d < r->ndimsets; d++) free(r->dimsets[d].stats);
  free(r->dimsets);
  free(r->stragglers);
  free(r->verdict);
  memset(r, 0, sizeof *r);
}

/* Lines up the collective instances and fills the samples (by dim set and
 * rank: key dimset * n + ri) and the dim sets' counts. */
typedef struct pass {
  const tr_rank *ranks;
  int n;
  table inst, dims;
  inst_info *info;
  uint32_t **inst_of; /* per rank, per local group */
  entry *e, *tmp;
  size_t ne;
  sample *s; /* samples, then bucketed */
  uint32_t *skey;
  size_t ns;
  size_t *start; /* per key: the first sample (ndims * n + 1) */
  uint64_t *colls;
  int *insts;
} pass;

static void pass_free(pass *p) {
  free(p->inst.slots);
  free(p->dims.slots);
  free(p->info);
  if (p->inst_of)
    for (int i = 0; i < p->n; i++) free(p->inst_of[i]);
  free(p->inst_of);
  free(p->e);
  free(p->tmp);
  free(p->s);
  free(p->skey);
  free(p->start);
  free(p->colls);
  free(p->insts);
}

/* Every counted collective's samples (p->s, p->skey). */
static int line_up(pass *p) {
  const tr_rank *ranks = p->ranks;
  int n = p->n;
  size_t ngroups = 0, nops = 0;
  for (int i = 0; i < n; i++) ngroups += (size_t)ranks[i].ngroups, nops += (size_t)ranks[i].nops;
  if (table_init(&p->inst, ngroups) || table_init(&p->dims, ngroups)) return -1;
  p->info = calloc(ngroups + 1, sizeof *p->info);
  p->inst_of = calloc((size_t)n, sizeof *p->inst_of);
  if (!p->info || !p->inst_of) return -1;
  for (int i = 0; i < n; i++) {
    const tr_rank *r = &ranks[i];
    p->inst_of[i] = malloc(sizeof(uint32_t) * ((size_t)r->ngroups + 1));
    if (!p->inst_of[i]) return -1;
    for (int g = 0; g < r->ngroups; g++) {
      int fresh, id = table_id(&p->inst, r->groups[g].name, r->groups[g].index, &fresh);
      if (fresh) p->info[id].dimset = table_id(&p->dims, r->groups[g].name, -1, &fresh);
      p->info[id].holders++;
      p->inst_of[i][g] = (uint32_t)id;
    }
  }
  int ninst = p->inst.n;
  /* Entries, counted per instance, then placed by instance. */
  size_t *at = calloc((size_t)ninst + 1, sizeof *at);
  p->e = malloc(sizeof(entry) * (nops + 1));
  if (!at || !p->e) {
    free(at);
    return -1;
  }
  for (int pass2 = 0; pass2 < 2; pass2++) {
    if (pass2) {
      size_t sum = 0;
      for (int q = 0; q <= ninst; q++) {
        size_t c = at[q];
        at[q] = sum;
        sum += c;
      }
      p->ne = sum;
    }
    for (int i = 0; i < n; i++) {
      const tr_rank *r = &ranks[i];
      for (int k = 0; k < r->nops; k++) {
        const tr_op *o = &r->ops[k];
        if (!o->issue_ns || is_p2p(o->kind) || o->group < 0 || o->group >= r->ngroups) continue;
        uint32_t id = p->inst_of[i][o->group];
        if (!pass2) at[id]++;
        else p->e[at[id]++] = (entry){o->gseq, id, (uint32_t)i, (uint32_t)k};
      }
    }
  }
  /* at[q] is now the end of instance q's entries; tmp holds the largest. */
  size_t most = 0;
  for (int q = 0; q < ninst; q++)
    if (at[q] - (q ? at[q - 1] : 0) > most) most = at[q] - (q ? at[q - 1] : 0);
  if (!(p->tmp = malloc(sizeof(entry) * (most + 1)))) {
    free(at);
    return -1;
  }
  p->s = malloc(sizeof(sample) * (p->ne + 1));
  p->skey = malloc(sizeof(uint32_t) * (p->ne + 1));
  p->colls = calloc((size_t)p->dims.n + 1, sizeof *p->colls);
  p->insts = calloc((size_t)p->dims.n + 1, sizeof *p->insts);
  size_t cap_cnt = 0;
  uint32_t *cnt = NULL;
  int rc = -1;
  if (!p->s || !p->skey || !p->colls || !p->insts) goto out;
  for (int q = 0; q < ninst; q++) {
    size_t lo = q ? at[q - 1] : 0, hi = at[q], m = hi - lo;
    if (m < 2) continue;
    entry *v = p->e + lo;
    uint64_t gmin = UINT64_MAX, gmax = 0;
    for (size_t j = 0; j < m; j++) {
      if (v[j].gseq < gmin) gmin = v[j].gseq;
      if (v[j].gseq > gmax) gmax = v[j].gseq;
    }
    if (gmax - gmin < 4 * (uint64_t)m + 64) { /* a counting sort by number */
      uint64_t range = gmax - gmin + 1;
      if (range + 1 > cap_cnt) {
        free(cnt);
        cap_cnt = (size_t)range + 1;
        if (!(cnt = malloc(sizeof *cnt * cap_cnt))) goto out;
      }
      memset(cnt, 0, sizeof *cnt * ((size_t)range + 1));
      for (size_t j = 0; j < m; j++) cnt[v[j].gseq - gmin + 1]++;
      for (uint64_t g = 1; g <= range; g++) cnt[g] += cnt[g - 1];
      for (size_t j = 0; j < m; j++) p->tmp[cnt[v[j].gseq - gmin]++] = v[j];
      memcpy(v, p->tmp, sizeof *v * m);
    } else {
      qsort(v, m, sizeof *v, cmp_gseq);
    }
    int dimset = p->info[q].dimset, need = p->info[q].holders;
    for (size_t a = 0, b; a < m; a = b) {
      int64_t first = INT64_MAX;
      for (b = a; b < m && v[b].gseq == v[a].gseq; b++) {
        int64_t t = ranks[v[b].ri].ops[v[b].k].issue_ns;
        if (t < first) first = t;
      }
      if ((int)(b - a) != need || need < 2) continue; /* a ring lost it, or it is pending */
      for (size_t j = a; j < b; j++) {
        const tr_rank *r = &ranks[v[j].ri];
        int64_t late = r->ops[v[j].k].issue_ns - first, gap = gap_before(r, (int)v[j].k);
        p->s[p->ns] = (sample){late, gap < late ? gap : late};
        p->skey[p->ns++] = (uint32_t)dimset * (uint32_t)p->n + v[j].ri;
      }
      p->colls[dimset]++;
      if (!p->info[q].counted) p->info[q].counted = 1, p->insts[dimset]++;
    }
  }
  rc = 0;
out:
  free(cnt);
  free(at);
  return rc;
}

int ts_analyze(const tr_rank *ranks, int n, ts_report *out, char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  if (n < 1 || !ranks) {
    snprintf(err, errlen, "no dumps");
    return -1;
  }
  out->ndumps = n;
  out->world = ranks[0].world;
  snprintf(out->backend, sizeof out->backend, "%s", ranks[0].backend);
  snprintf(out->mesh, sizeof out->mesh, "%s", ranks[0].mesh);
  snprintf(out->job, sizeof out->job, "%s", ranks[0].job);
  pass p = {.ranks = ranks, .n = n};
  int64_t *lv = NULL, *ov = NULL;
  if (line_up(&p)) goto nomem;
  int nd = p.dims.n;
  if ((uint64_t)nd * (uint64_t)n >= UINT32_MAX) {
    snprintf(err, errlen, "%d dim sets of %d dumps: too many to count", nd, n);
    pass_free(&p);
    return -1;
  }
  /* Samples by key (dim set, rank): a counting sort into start[]. */
  size_t nkeys = (size_t)nd * (size_t)n;
  p.start = calloc(nkeys + 2, sizeof *p.start);
  sample *by = malloc(sizeof *by * (p.ns + 1));
  size_t maxrun = 0;
  if (!p.start || !by) {
    free(by);
    goto nomem;
  }
  for (size_t j = 0; j < p.ns; j++) p.start[p.skey[j] + 1]++;
  for (size_t q = 0; q < nkeys; q++) {
    if (p.start[q + 1] > maxrun) maxrun = p.start[q + 1];
    p.start[q + 1] += p.start[q];
  }
  {
    size_t *fill = malloc(sizeof *fill * (nkeys + 1));
    if (!fill) {
      free(by);
      goto nomem;
    }
    memcpy(fill, p.start, sizeof *fill * (nkeys + 1));
    for (size_t j = 0; j < p.ns; j++) by[fill[p.skey[j]]++] = p.s[j];
    free(fill);
  }
  free(p.s);
  p.s = by;
  lv = malloc(sizeof *lv * (maxrun + 1));
  ov = malloc(sizeof *ov * ((maxrun > (size_t)n ? maxrun : (size_t)n) + 1));
  out->dimsets = calloc((size_t)nd + 1, sizeof *out->dimsets);
  if (!lv || !ov || !out->dimsets) goto nomem;
  out->ndimsets = nd;
  for (size_t t = 0; t < p.dims.cap; t++) {
    const key *k = &p.dims.slots[t];
    if (!k->name) continue;
    ts_dimset *D = &out->dimsets[k->id];
    snprintf(D->name, sizeof D->name, "%s", k->name);
    D->instances = p.insts[k->id];
    D->collectives = p.colls[k->id];
    int cnt = 0;
    const size_t *st = p.start + (size_t)k->id * (size_t)n;
    for (int i = 0; i < n; i++) cnt += st[i + 1] > st[i];
    D->stats = calloc((size_t)cnt + 1, sizeof *D->stats);
    if (!D->stats) goto nomem;
    for (int i = 0; i < n; i++) {
      size_t lo = st[i], hi = st[i + 1];
      if (hi == lo) continue;
      int m = (int)(hi - lo);
      for (int j = 0; j < m; j++) lv[j] = p.s[lo + j].late, ov[j] = p.s[lo + j].own;
      ts_stat *S = &D->stats[D->nstats++];
      S->rank = ranks[i].rank;
      S->samples = m;
      order_stats(lv, m, &S->late_median, &S->late_p95);
      order_stats(ov, m, &S->own_median, &S->own_p95);
    }
    /* The typical own lateness: the (lower) median of the ranks' medians. */
    for (int j = 0; j < D->nstats; j++) ov[j] = D->stats[j].own_median;
    if (D->nstats) {
      int64_t dummy;
      order_stats(ov, D->nstats, &D->typical, &dummy);
    }
    for (int j = 0; j < D->nstats; j++) {
      ts_stat *S = &D->stats[j];
      /* own >= FACTOR * typical, without the product (a hostile dump's
       * times may be near INT64_MAX). */
      S->straggler = S->samples >= TS_MIN_SAMPLES && S->own_median >= TS_FLOOR_NS &&
                     S->own_median / TS_FACTOR >= D->typical;
    }
    qsort(D->stats, (size_t)D->nstats, sizeof *D->stats, cmp_stat);
  }
  qsort(out->dimsets, (size_t)nd, sizeof *out->dimsets, cmp_dimset);
  free(lv);
  free(ov);
  lv = ov = NULL;
  pass_free(&p);
  memset(&p, 0, sizeof p);

  /* The stragglers, the slowest first (by their worst dim set). */
  int cap = 0;
  for (int d = 0; d < nd; d++)
    for (int j = 0; j < out->dimsets[d].nstats; j++) cap += out->dimsets[d].stats[j].straggler;
  out->stragglers = malloc(sizeof(int) * ((size_t)cap + 1));
  ts_stat *worst = malloc(sizeof *worst * ((size_t)cap + 1));
  if (!out->stragglers || !worst) {
    free(worst);
    goto nomem;
  }
  for (int d = 0; d < nd; d++)
    for (int j = 0; j < out->dimsets[d].nstats; j++) {
      const ts_stat *S = &out->dimsets[d].stats[j];
      if (!S->straggler) continue;
      const ts_stat *w = NULL;
      ts_worst(out, S->rank, &w);
      if (w == S) worst[out->nstragglers++] = *S; /* once per rank: its worst line */
    }
  qsort(worst, (size_t)out->nstragglers, sizeof *worst, cmp_stat);
  for (int j = 0; j < out->nstragglers; j++) out->stragglers[j] = worst[j].rank;
  free(worst);

  /* The verdict. */
  size_t vcap = 256 + (256 + TR_NAME) * (size_t)(out->nstragglers < 8 ? out->nstragglers : 8);
  char *vb = malloc(vcap);
  if (!vb) goto nomem;
  size_t vn = 0;
  if (!out->nstragglers) {
    vn += (size_t)snprintf(vb, vcap,
                           "no straggler: no rank's own lateness has a median of %.1f ms and "
                           "%d times its dim set's typical",
                           (double)TS_FLOOR_NS / 1e6, TS_FACTOR);
  } else {
    vn += (size_t)snprintf(vb, vcap, "stragglers:");
    for (int j = 0; j < out->nstragglers && j < 8 && vn < vcap; j++) {
      const ts_stat *S;
      const ts_dimset *D = ts_worst(out, out->stragglers[j], &S);
      vn += (size_t)snprintf(vb + vn, vcap - vn,
                             "%s world rank %d: %.3f ms (p95 %.3f ms) behind the first arrival on "
                             "%s, %.3f ms of it its own (typical %.3f ms)",
                             j ? ";" : "", S->rank, (double)S->late_median / 1e6,
                             (double)S->late_p95 / 1e6, D->name, (double)S->own_median / 1e6,
                             (double)D->typical / 1e6);
    }
    if (out->nstragglers > 8 && vn < vcap)
      snprintf(vb + vn, vcap - vn, "; and %d more ranks", out->nstragglers - 8);
  }
  out->verdict = vb;
  return 0;
nomem:
  free(lv);
  free(ov);
  pass_free(&p);
  snprintf(err, errlen, "out of memory");
  return -1;
}

const ts_dimset *ts_worst(const ts_report *r, int rank, const ts_stat **stat) {
  const ts_dimset *best = NULL;
  const ts_stat *bs = NULL;
  for (int d = 0; d < r->ndimsets; d++)
    for (int j = 0; j < r->dimsets[d].nstats; j++) {
      const ts_stat *S = &r->dimsets[d].stats[j];
      if (S->rank != rank || !S->straggler) continue;
      if (!bs || S->own_median > bs->own_median) best = &r->dimsets[d], bs = S;
    }
  if (stat) *stat = bs;
  return best;
}
