/* Merging the flight recorder's dumps (trace_analyze.h; docs/trace.md,
 * "Reading a dump: meshpg trace").
 *
 * The fault time T is the earliest failure: the earliest end of an
 * operation that failed (timeout, abort, desync, backend), else the
 * earliest dump written for a fault; with dumps on request only, the last
 * dump.  An operation "issued" means issued at or before T; one issued
 * after T is "late".  Three kinds of verdict:
 *  1. signatures: at the first collective number where the members of a
 *     group instance issued different operations (kind, dtype, count,
 *     root, bucket), the members against the majority (of the group when
 *     it has three or more issuers, else of every instance of the same dim
 *     set at that number); the same for a send and its receive;
 *  2. order: ranks that run one program (the same positions in the
 *     groups that carry point-to-point traffic) issue, in each sync step,
 *     the same list of operations; the first position where one rank
 *     differs from a strict majority of them, while a member of one of its
 *     groups agrees with it, names that rank (a skipped or swapped
 *     operation, also one whose signature equals its neighbour's);
 *  3. the wait-for graph at T: a rank pending at T in an operation waits
 *     for the members that had not issued its match (or have no dump).
 *     From every wait of at least half the failed operation's age (and
 *     0.1 s), follow blocked ranks to the ranks that were not blocked:
 *     those are the roots (computing, sleeping, or gone). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trace_analyze.h"
#include "trace_analyze_shared.h"


static int cmp_int(const void *x, const void *y) {
  int a = *(const int *)x, b = *(const int *)y;
  return (a > b) - (a < b);
}

static const ta_group *sort_gi; /* cmp_gname's instances */

/* By name, then by instance number. */
static int cmp_gname(const void *x, const void *y) {
  int g = *(const int *)x, h = *(const int *)y;
  int c = strcmp(sort_gi[g].name, sort_gi[h].name);
  return c ? c : (g > h) - (g < h);
}

static int cmp_pair(const void *x, const void *y) {
  const int *a = x, *b = y;
  if (a[0] != b[0]) return a[0] < b[0] ? -1 : 1;
  return (a[1] > b[1]) - (a[1] < b[1]);
}

static ta_mismatch *add_mismatch(an *a, int g, int p2p, int from, int to, uint64_t k) {
  ta_report *o = a->out;
  ta_mismatch *p = o->mismatches;
  if (o->nmismatches == a->mismatch_cap) {
    int cap = a->mismatch_cap ? 2 * a->mismatch_cap : 16;
    p = realloc(o->mismatches, sizeof(ta_mismatch) * (size_t)cap);
    if (!p) {
      a->oom = 1;
      return NULL;
    }
    a->mismatch_cap = cap;
  }
  o->mismatches = p;
  ta_mismatch *m = &p[o->nmismatches++];
  memset(m, 0, sizeof *m);
  const ta_group *G = &a->gi[g];
  snprintf(m->group, sizeof m->group, "%s[%d]", G->name, G->index);
  snprintf(m->name, sizeof m->name, "%s", G->name);
  m->index = G->index;
  m->p2p = p2p;
  m->from = from;
  m->to = to;
  m->gseq = k;
  a->gi[g].disagree = 1;
  return m;
}

/* ------------------------------------------------------------------ */
/* 1. Signatures: the first collective number where members disagree   */
/* ------------------------------------------------------------------ */

/* How an issued op ended, seen from its rank's dump. */
static void issuer_state(const an *a, int i, const tr_op *o, mpg__strbuf *b) {
  if (o->end_ns == 0)
    mpg__strbuf_add(b, "pending %.1f s at its dump", secs(a->R[i].dump_ns - o->issue_ns));
  else if (!strcmp(o->status, "ok"))
    mpg__strbuf_add(b, "ok");
  else
    mpg__strbuf_add(b, "%s after %.1f s", o->status, secs(o->end_ns - o->issue_ns));
}

/* A member that had not issued: its last op and how it stood at its dump. */
static void absent_state(an *a, int i, mpg__strbuf *b) {
  const tr_rank *r = &a->R[i];
  int last = -1;
  for (int j = 0; j < r->nops; j++)
    if (issued(a, &r->ops[j])) last = j;
  if (last < 0) {
    mpg__strbuf_add(b, "no operation before the failure");
    return;
  }
  char nm[TR_NAME * 2], st[64];
  ta__op_name(a, i, &r->ops[last], nm, sizeof nm);
  ta__op_state(&r->ops[last], r->dump_ns, st, sizeof st);
  const tr_op *o = &r->ops[last];
  mpg__strbuf_add(b, "last op %s, %s %s", nm, st,
                  o->end_ns == 0 || o->end_ns > r->dump_ns ? "at its dump" : "its dump");
}

/* The majority signature at number k of instance g among `cls` (ops of
 * the issuers, as (rank index, op index)), voting across the instances of
 * the dim set when the group has fewer than three issuers.  Returns the
 * winning class's index into cls, or -1. */
static int sig_winner(an *a, int g, uint64_t k, const int *ci, const int *cj, int n) {
  int *votes = calloc((size_t)n, sizeof(int));
  if (!votes) {
    a->oom = 1;
    return -1;
  }
  for (int x = 0; x < n; x++)
    for (int y = 0; y < n; y++)
      if (same_sig(&a->R[ci[x]].ops[cj[x]], &a->R[ci[y]].ops[cj[y]])) votes[y]++;
  if (n < 3)
    for (int g2 = 0; g2 < a->ngi; g2++) {
      if (g2 == g || strcmp(a->gi[g2].name, a->gi[g].name)) continue;
      for (int q = 0; q < a->gi[g2].size; q++) {
        int m = a->gi[g2].ranks[q], mi = m >= 0 && m < a->world ? a->at[m] : -1, unk;
        int j = mi >= 0 ? ta__coll_at(a, mi, g2, k, &unk) : -1;
        /* Issued after the first failure or not: what another instance
         * issued at #k is what the program issues there (a member of
         * an instance the failure never reached goes on past it). */
        if (j < 0) continue;
        for (int y = 0; y < n; y++)
          if (same_sig(&a->R[mi].ops[j], &a->R[ci[y]].ops[cj[y]])) votes[y]++;
      }
    }
  int best = -1, total = 0;
  for (int y = 0; y < n; y++) {
    total = votes[y] > total ? votes[y] : total;
    if (best < 0 || votes[y] > votes[best]) best = y;
  }
  for (int y = 0; y < n && best >= 0; y++)
    if (votes[y] == votes[best] &&
        !same_sig(&a->R[ci[y]].ops[cj[y]], &a->R[ci[best]].ops[cj[best]]))
      best = -1; /* a tie */
  if (best >= 0 && votes[best] < 2) best = -1;
  free(votes);
  return best;
}

static void sig_culprit(an *a, int g, uint64_t k, int xi, const tr_op *x, int wi, const tr_op *w) {
  const ta_group *G = &a->gi[g];
  char dx[TR_NAME * 3], dw[TR_NAME * 3];
  ta__op_detail(x, dx, sizeof dx);
  ta__op_detail(w, dw, sizeof dw);
  int unk;
  int xn = ta__coll_at(a, xi, g, k + 1, &unk), wn = ta__coll_at(a, wi, g, k + 1, &unk);
  const tr_op *x1 = xn >= 0 ? &a->R[xi].ops[xn] : NULL, *w1 = wn >= 0 ? &a->R[wi].ops[wn] : NULL;
  /* The next number's op: from the reference rank, else from another
   * instance of the dim set that agrees at k. */
  for (int g2 = 0; g2 < a->ngi && !w1; g2++) {
    if (g2 == g || strcmp(a->gi[g2].name, G->name)) continue;
    for (int q = 0; q < a->gi[g2].size && !w1; q++) {
      int mi = rank_index(a, a->gi[g2].ranks[q]);
      int j0 = mi >= 0 ? ta__coll_at(a, mi, g2, k, &unk) : -1;
      int j1 = mi >= 0 ? ta__coll_at(a, mi, g2, k + 1, &unk) : -1;
      if (j0 >= 0 && j1 >= 0 && same_sig(&a->R[mi].ops[j0], w)) w1 = &a->R[mi].ops[j1];
    }
  }
  mpg__strbuf b = MPG__STRBUF_INIT;
  mpg__strbuf_add(&b, "culprit: world rank %d: ", a->R[xi].rank);
  if (w1 && same_sig(x, w1) && x1 && same_sig(x1, w))
    mpg__strbuf_add(&b, "swapped %s #%llu and %s #%llu on %s[%d]: ", w->kind, (unsigned long long)k,
                    w1->kind, (unsigned long long)k + 1, G->name, G->index);
  else if (w1 && same_sig(x, w1))
    mpg__strbuf_add(&b, "skipped %s #%llu on %s[%d]: ", w->kind, (unsigned long long)k, G->name,
                    G->index);
  mpg__strbuf_add(&b, "issued %s (%s) as #%llu on %s[%d] where world rank %d issued %s (%s)",
                  x->kind, dx, (unsigned long long)k, G->name, G->index, a->R[wi].rank, w->kind,
                  dw);
  ta__add_culprit(a, a->R[xi].rank, &b);
  ta__evidence(
      a, a->R[xi].rank,
      w1 && same_sig(x, w1) ? (x1 && same_sig(x1, w) ? TA_SWAPPED : TA_SKIPPED) : TA_DIFFERS, g, k,
      w->kind, -1);
}

static int cmp_u64(const void *x, const void *y) {
  uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
  return (a > b) - (a < b);
}

/* Append v to *ks (growing it); -1 when out of memory. */
static int push_u64(uint64_t **ks, size_t *n, uint64_t v) {
  if ((*n & (*n - 1)) == 0) {
    uint64_t *p = realloc(*ks, sizeof(uint64_t) * (*n ? 2 * *n : 1));
    if (!p) return -1;
    *ks = p;
  }
  (*ks)[(*n)++] = v;
  return 0;
}

/* ks[0..n) sorted, each value once; the new count.  The numbers compared
 * are the ones some ring holds, not every integer up to the largest: a
 * number no member holds has nothing to compare, and a hostile GSEQ of
 * 10^18 must not be counted up to (issue 45, item 14). */
static size_t sort_unique(uint64_t *ks, size_t n) {
  if (n == 0) return 0;
  qsort(ks, n, sizeof *ks, cmp_u64);
  size_t m = 1;
  for (size_t i = 1; i < n; i++)
    if (ks[i] != ks[m - 1]) ks[m++] = ks[i];
  return m;
}

static void check_group(an *a, int g) {
  ta_group *G = &a->gi[g];
  uint64_t lo = 1, hi = 0;
  /* The members with a dump only (a->dumped: positions, ascending). */
  const int *dq = a->dumped[g], nd = a->ndumped[g];
  int nodump = G->size - nd;
  for (int x = 0; x < nd; x++) {
    int mi = a->at[G->ranks[dq[x]]];
    cell *c = cellof(a, mi, g);
    if (c->ncoll == 0) continue;
    uint64_t first = a->R[mi].ops[c->coll[0]].gseq, last = a->R[mi].ops[c->coll[c->ncoll - 1]].gseq;
    if (lost(a, mi) && first > lo) lo = first;
    if (last > hi) hi = last;
  }
  if (hi < lo) return;
  G->first = lo;
  G->last = hi;
  uint64_t *ks = NULL;
  size_t nk = 0;
  for (int x = 0; x < nd && !a->oom; x++) {
    int mi = a->at[G->ranks[dq[x]]];
    const cell *c = cellof(a, mi, g);
    for (int j = 0; j < c->ncoll && !a->oom; j++) {
      uint64_t s = a->R[mi].ops[c->coll[j]].gseq;
      if (s >= lo && s <= hi && push_u64(&ks, &nk, s)) a->oom = 1;
    }
  }
  nk = sort_unique(ks, nk);
  int *ci = malloc(sizeof(int) * (size_t)G->size * 4), *cj = ci + G->size;
  int *absent = cj + G->size, *late = absent + G->size;
  if (!ci || a->oom) {
    free(ci);
    free(ks);
    a->oom = 1;
    return;
  }
  for (size_t kx = 0; kx < nk; kx++) {
    uint64_t k = ks[kx];
    int nis = 0, nabs = 0, nlate = 0, diff = 0, bad = 0, unk;
    for (int x = 0; x < nd; x++) {
      int mi = a->at[G->ranks[dq[x]]];
      int j = ta__coll_at(a, mi, g, k, &unk);
      if (j < 0) {
        if (!unk) absent[nabs++] = mi;
        continue;
      }
      const tr_op *o = &a->R[mi].ops[j];
      if (!issued(a, o)) {
        late[nlate++] = mi;
        continue;
      }
      if (nis && !same_sig(o, &a->R[ci[0]].ops[cj[0]])) diff = 1;
      if (strcmp(o->status, "ok")) bad = 1;
      ci[nis] = mi;
      cj[nis++] = j;
    }
    if (!diff && !(nis && (nabs || nlate)) && !(nlate && nabs) && !(nodump && bad)) continue;
    ta_mismatch *mm = add_mismatch(a, g, 0, -1, -1, k);
    if (!mm) break;
    mpg__strbuf b = MPG__STRBUF_INIT;
    mpg__strbuf_add(&b, "%s[%d] #%llu:", G->name, G->index, (unsigned long long)k);
    char done[64] = {0};
    for (int x = 0; x < nis && x < 64; x++) {
      if (done[x]) continue;
      const tr_op *o = &a->R[ci[x]].ops[cj[x]];
      char d[TR_NAME * 3];
      ta__op_detail(o, d, sizeof d);
      mpg__strbuf_add(&b, "\n  %s (%s) issued by", o->kind, d);
      for (int y = x; y < nis && y < 64; y++) {
        const tr_op *p = &a->R[ci[y]].ops[cj[y]];
        if (done[y] || !same_sig(o, p)) continue;
        done[y] = 1;
        mpg__strbuf_add(&b, "%s world rank %d (", y > x ? "," : "", a->R[ci[y]].rank);
        issuer_state(a, ci[y], p, &b);
        mpg__strbuf_add(&b, ")");
      }
    }
    for (int x = 0; x < nlate; x++) {
      int j = ta__coll_at(a, late[x], g, k, &unk);
      mpg__strbuf_add(&b, "\n  issued late by world rank %d: %.1f s after the first failure; ",
                      a->R[late[x]].rank, secs(a->R[late[x]].ops[j].issue_ns - a->tf));
      absent_state(a, late[x], &b);
    }
    for (int x = 0; x < nabs; x++) {
      mpg__strbuf_add(&b, "\n  never issued by world rank %d: ", a->R[absent[x]].rank);
      absent_state(a, absent[x], &b);
    }
    for (int q = 0; q < G->size; q++) {
      int m = G->ranks[q], e = q;
      if (m < 0 || m >= a->world || a->at[m] >= 0) continue;
      /* A run of members without a dump, of consecutive ranks: one line. */
      while (e + 1 < G->size && G->ranks[e + 1] == G->ranks[e] + 1 &&
             G->ranks[e + 1] < a->world && a->at[G->ranks[e + 1]] < 0)
        e++;
      if (e == q)
        mpg__strbuf_add(&b, "\n  no dump from world rank %d", m);
      else
        mpg__strbuf_add(&b, "\n  no dump from world ranks %d to %d", m, G->ranks[e]);
      q = e;
    }
    mm->text = mpg__strbuf_take(&b);
    if (!mm->text) a->oom = 1;
    if (diff) {
      int w = sig_winner(a, g, k, ci, cj, nis);
      for (int x = 0; x < nis && w >= 0; x++)
        if (!same_sig(&a->R[ci[x]].ops[cj[x]], &a->R[ci[w]].ops[cj[w]]))
          sig_culprit(a, g, k, ci[x], &a->R[ci[x]].ops[cj[x]], ci[w], &a->R[ci[w]].ops[cj[w]]);
    }
    break;
  }
  free(ci);
  free(ks);
}

/* The same for each direction between two members: send #k and its
 * receive. */
/* Send #k from si to ri on instance g against its receive: 0 when they
 * agree (go on), 1 when a mismatch was recorded (stop). */
static int pair_at(an *a, int g, int si, int ri, uint64_t k) {
  const ta_group *G = &a->gi[g];
  int s = a->R[si].rank, r = a->R[ri].rank;
  int us = 0, ur = 0;
  int js = ta__p2p_at(a, si, g, "send", r, k, &us), jr = ta__p2p_at(a, ri, g, "recv", s, k, &ur);
  if (us || ur) return 0;
  const tr_op *os = js >= 0 ? &a->R[si].ops[js] : NULL, *orr = jr >= 0 ? &a->R[ri].ops[jr] : NULL;
  int is = os && issued(a, os), ir = orr && issued(a, orr);
  int diff = is && ir && (os->count != orr->count || strcmp(os->dtype, orr->dtype));
  if (!diff && is == ir) return 0;
  ta_mismatch *mm = add_mismatch(a, g, 1, s, r, k);
  if (!mm) return 1;
  mpg__strbuf b = MPG__STRBUF_INIT;
  mpg__strbuf_add(&b, "%s[%d] send #%llu from world rank %d to world rank %d:", G->name, G->index,
                  (unsigned long long)k, s, r);
  const tr_op *ops[2] = {os, orr};
  int idx[2] = {si, ri};
  for (int x = 0; x < 2; x++) {
    const char *what = x ? "receive" : "send";
    if (ops[x] && issued(a, ops[x])) {
      mpg__strbuf_add(&b, "\n  %s (%s x %llu) issued by world rank %d (", what, ops[x]->dtype,
                      (unsigned long long)ops[x]->count, a->R[idx[x]].rank);
      issuer_state(a, idx[x], ops[x], &b);
      mpg__strbuf_add(&b, ")");
    } else if (ops[x]) {
      mpg__strbuf_add(&b, "\n  %s issued late by world rank %d: %.1f s after the first failure",
                      what, a->R[idx[x]].rank, secs(ops[x]->issue_ns - a->tf));
    } else {
      mpg__strbuf_add(&b, "\n  %s never issued by world rank %d: ", what, a->R[idx[x]].rank);
      absent_state(a, idx[x], &b);
    }
  }
  mm->text = mpg__strbuf_take(&b);
  if (!mm->text) a->oom = 1;
  if (!diff) return 1;
  /* Which side is odd: the count the other instances use at #k between
   * the same positions. */
  int ps = -1, pr = -1;
  for (int q = 0; q < G->size; q++) {
    if (G->ranks[q] == s) ps = q;
    if (G->ranks[q] == r) pr = q;
  }
  uint64_t cnt[2] = {os->count, orr->count};
  int votes[2] = {1, 1};
  for (int g2 = 0; g2 < a->ngi; g2++) {
    const ta_group *H = &a->gi[g2];
    if (g2 == g || strcmp(H->name, G->name) || H->size != G->size) continue;
    int hs = H->ranks[ps], hr = H->ranks[pr];
    int hsi = hs >= 0 && hs < a->world ? a->at[hs] : -1,
        hri = hr >= 0 && hr < a->world ? a->at[hr] : -1;
    int j1 = hsi >= 0 ? ta__p2p_at(a, hsi, g2, "send", hr, k, &us) : -1;
    int j2 = hri >= 0 ? ta__p2p_at(a, hri, g2, "recv", hs, k, &ur) : -1;
    for (int x = 0; x < 2; x++) {
      if (j1 >= 0 && a->R[hsi].ops[j1].count == cnt[x]) votes[x]++;
      if (j2 >= 0 && a->R[hri].ops[j2].count == cnt[x]) votes[x]++;
    }
  }
  if (votes[0] == votes[1]) return 1;
  int odd = votes[0] < votes[1] ? 0 : 1;
  mpg__strbuf c = MPG__STRBUF_INIT;
  mpg__strbuf_add(&c,
                  "culprit: world rank %d: issued %s #%llu %s rank %d on %s[%d] with %s x %llu "
                  "where the other instances of %s use %s x %llu",
                  a->R[idx[odd]].rank, odd ? "recv" : "send", (unsigned long long)k,
                  odd ? "from" : "to", odd ? s : r, G->name, G->index, ops[odd]->dtype,
                  (unsigned long long)cnt[odd], G->name, ops[odd]->dtype,
                  (unsigned long long)cnt[1 - odd]);
  ta__add_culprit(a, a->R[idx[odd]].rank, &c);
  ta__evidence(a, a->R[idx[odd]].rank, TA_DIFFERS, g, k, odd ? "recv" : "send", odd ? s : r);
  return 1;
}

static void check_pair(an *a, int g, int si, int ri) {
  int s = a->R[si].rank, r = a->R[ri].rank;
  cell *cs = cellof(a, si, g), *cr = cellof(a, ri, g);
  uint64_t *ks = NULL;
  size_t nk = 0;
  /* the runs of (send, r) and (recv, s) of the sorted cells */
  int e, j = ta__p2p_run(a, si, g, 1, r, &e);
  for (; j < e && !a->oom; j++)
    if (push_u64(&ks, &nk, a->R[si].ops[cs->p2ps[j]].gseq)) a->oom = 1;
  j = ta__p2p_run(a, ri, g, 0, s, &e);
  for (; j < e && !a->oom; j++)
    if (push_u64(&ks, &nk, a->R[ri].ops[cr->p2ps[j]].gseq)) a->oom = 1;
  nk = a->oom ? 0 : sort_unique(ks, nk);
  for (size_t kx = 0; kx < nk && !a->oom; kx++)
    if (ks[kx] >= 1 && pair_at(a, g, si, ri, ks[kx])) break;
  free(ks);
}

/* The pairs of members with a dump, in position order (sender, then
 * receiver), that some op on the instance names: a send's (its rank, its
 * peer), a receive's (its peer, its rank); a pair that no op names has
 * nothing to compare.  The cost is the ops', not the pairs of members (a
 * group of 4,096 ranks that all send is not 4,096^2 pairs). */
static void check_p2p(an *a, int g) {
  const ta_group *G = &a->gi[g];
  int *pr = NULL, np = 0, cap = 0;
  for (int x = 0; x < a->ndumped[g] && !a->oom; x++) {
    int q = a->dumped[g][x], mi = a->at[G->ranks[q]];
    const cell *c = cellof(a, mi, g);
    for (int j = 0; j < c->np2p; j++) {
      const tr_op *o = &a->R[mi].ops[c->p2p[j]];
      int pq = ta__pos_in(a, g, o->peer);
      if (pq < 0 || pq == q || a->at[o->peer] < 0) continue;
      if (np == cap) {
        cap = cap ? 2 * cap : 64;
        int *t = realloc(pr, sizeof(int) * 2 * (size_t)cap);
        if (!t) {
          a->oom = 1;
          break;
        }
        pr = t;
      }
      int send = o->kind[0] == 's';
      pr[2 * np] = send ? q : pq;
      pr[2 * np + 1] = send ? pq : q;
      np++;
    }
  }
  if (np) qsort(pr, (size_t)np, 2 * sizeof(int), cmp_pair);
  for (int x = 0; x < np && !a->oom; x++) {
    if (x && pr[2 * x] == pr[2 * x - 2] && pr[2 * x + 1] == pr[2 * x - 1]) continue;
    check_pair(a, g, a->at[G->ranks[pr[2 * x]]], a->at[G->ranks[pr[2 * x + 1]]]);
  }
  free(pr);
}

/* ------------------------------------------------------------------ */
/* Set-up                                                              */
/* ------------------------------------------------------------------ */

/* The instances by (name, index): an open-addressing hash of instance
 * numbers, so that 4,096 dumps of 3 groups each are not 4,096 x 3 scans
 * of every instance (issue 46, item 6). */
typedef struct inst_table {
  int *slot; /* nslot (a power of 2), -1: free */
  size_t nslot;
  int cap;   /* a->gi's capacity */
} inst_table;

static size_t inst_hash(const char *name, int index) {
  uint64_t h = 1469598103934665603ull ^ (uint64_t)(unsigned)index;
  for (; *name; name++) h = (h ^ (unsigned char)*name) * 1099511628211ull;
  return (size_t)(h ^ (h >> 29));
}

static int find_inst(an *a, inst_table *t, const tr_group *g) {
  if (2 * ((size_t)a->ngi + 1) > t->nslot) {
    size_t ns = t->nslot ? 2 * t->nslot : 256;
    int *sl = malloc(sizeof(int) * ns);
    if (!sl) return -1;
    for (size_t k = 0; k < ns; k++) sl[k] = -1;
    for (int k = 0; k < a->ngi; k++) {
      size_t h = inst_hash(a->gi[k].name, a->gi[k].index) & (ns - 1);
      while (sl[h] >= 0) h = (h + 1) & (ns - 1);
      sl[h] = k;
    }
    free(t->slot);
    t->slot = sl;
    t->nslot = ns;
  }
  size_t h = inst_hash(g->name, g->index) & (t->nslot - 1);
  for (; t->slot[h] >= 0; h = (h + 1) & (t->nslot - 1)) {
    const ta_group *G = &a->gi[t->slot[h]];
    if (G->index == g->index && !strcmp(G->name, g->name)) return t->slot[h];
  }
  if (a->ngi == t->cap) {
    int cap = t->cap ? 2 * t->cap : 64;
    ta_group *p = realloc(a->gi, sizeof(ta_group) * (size_t)cap);
    if (!p) return -1;
    a->gi = p;
    t->cap = cap;
  }
  t->slot[h] = a->ngi;
  ta_group *p = a->gi;
  ta_group *G = &p[a->ngi];
  memset(G, 0, sizeof *G);
  snprintf(G->name, sizeof G->name, "%s", g->name);
  G->index = g->index;
  G->size = g->size;
  G->ranks = malloc(sizeof(int) * (size_t)(g->size > 0 ? g->size : 1));
  if (!G->ranks) return -1;
  memcpy(G->ranks, g->ranks, sizeof(int) * (size_t)g->size);
  return a->ngi++;
}

static const tr_op *sort_ops; /* cmp_p2p's rank's ops (qsort has no argument) */

/* (kind, peer, number, index): ta__p2p_at's order. */
static int cmp_p2p(const void *x, const void *y) {
  int i = *(const int *)x, j = *(const int *)y;
  const tr_op *o = &sort_ops[i], *p = &sort_ops[j];
  int os = o->kind[0] == 's', ps = p->kind[0] == 's';
  if (os != ps) return os - ps;
  if (o->peer != p->peer) return o->peer < p->peer ? -1 : 1;
  if (o->gseq != p->gseq) return o->gseq < p->gseq ? -1 : 1;
  return (i > j) - (i < j);
}

/* The indexes (trace_analyze_shared.h, "What makes the analysis
 * linear"): each rank's cells on the instances it is on, the members with
 * a dump and the positions by rank of each instance, the dim sets'
 * numbers, the per-rank and per-world-rank marks.  0 or -1 (oom). */
static int index_setup(an *a) {
  const tr_rank *R = a->R;
  size_t ng = (size_t)(a->ngi > 0 ? a->ngi : 1), n = (size_t)a->n;
  a->inst = calloc(n, sizeof(int *));
  a->ninst = calloc(n, sizeof(int));
  a->icells = calloc(n, sizeof(cell *));
  a->last = malloc(sizeof(int) * n);
  a->blk = malloc(n);
  a->culprit_at = calloc((size_t)a->world, 1);
  a->dumped = calloc(ng, sizeof(int *));
  a->ndumped = calloc(ng, sizeof(int));
  a->dimset = malloc(sizeof(int) * ng);
  a->bypos = calloc(ng, sizeof(int *));
  a->ucache = calloc(2 * ng, sizeof *a->ucache);
  if (!a->inst || !a->ninst || !a->icells || !a->last || !a->blk || !a->culprit_at ||
      !a->dumped || !a->ndumped || !a->dimset || !a->bypos || !a->ucache)
    return -1;
  memset(a->blk, -1, n);
  for (int i = 0; i < a->n; i++) {
    /* The instances of its groups, ascending, each once. */
    int k = R[i].ngroups, *v = malloc(sizeof(int) * (size_t)(k > 0 ? k : 1));
    if (!v) return -1;
    a->inst[i] = v;
    for (int g = 0; g < k; g++) v[g] = a->gmap[i][g];
    qsort(v, (size_t)k, sizeof(int), cmp_int);
    int u = 0;
    for (int g = 0; g < k; g++)
      if (!u || v[g] != v[u - 1]) v[u++] = v[g];
    a->ninst[i] = u;
    if (!(a->icells[i] = calloc((size_t)(u > 0 ? u : 1), sizeof(cell)))) return -1;
    for (int j = 0; j < R[i].nops; j++) {
      const tr_op *o = &R[i].ops[j];
      cell *c = cellof(a, i, inst_of(a, i, o));
      if (is_p2p(o) ? ta__push(&c->p2p, &c->np2p, j) : ta__push(&c->coll, &c->ncoll, j)) return -1;
    }
    sort_ops = R[i].ops;
    for (int x = 0; x < u; x++) {
      cell *c = &a->icells[i][x];
      if (!c->np2p) continue;
      if (!(c->p2ps = malloc(sizeof(int) * (size_t)c->np2p))) return -1;
      memcpy(c->p2ps, c->p2p, sizeof(int) * (size_t)c->np2p);
      qsort(c->p2ps, (size_t)c->np2p, sizeof(int), cmp_p2p);
    }
  }
  for (int g = 0; g < a->ngi; g++) {
    const ta_group *G = &a->gi[g];
    for (int q = 0; q < G->size; q++) {
      int m = G->ranks[q];
      if (m < 0 || m >= a->world || a->at[m] < 0) continue;
      if (!a->dumped[g] && !(a->dumped[g] = malloc(sizeof(int) * (size_t)G->size))) return -1;
      a->dumped[g][a->ndumped[g]++] = q;
    }
  }
  /* dim sets: the instances sorted by name; the first of each name (the
   * least instance number) gives its number */
  int *ord = malloc(sizeof(int) * ng);
  if (!ord) return -1;
  for (int g = 0; g < a->ngi; g++) ord[g] = g;
  sort_gi = a->gi;
  qsort(ord, (size_t)a->ngi, sizeof(int), cmp_gname);
  for (int x = 0; x < a->ngi; x++)
    a->dimset[ord[x]] = x && !strcmp(a->gi[ord[x]].name, a->gi[ord[x - 1]].name)
                            ? a->dimset[ord[x - 1]] : ord[x];
  free(ord);
  return 0;
}

static int setup(an *a, char *err, size_t errlen) {
  const tr_rank *R = a->R;
  inst_table it = {0};
  a->at = malloc(sizeof(int) * (size_t)a->world);
  a->gmap = calloc((size_t)a->n, sizeof(int *));
  if (!a->at || !a->gmap) goto oom;
  for (int w = 0; w < a->world; w++) a->at[w] = -1;
  for (int i = 0; i < a->n; i++) {
    if (R[i].rank < 0 || R[i].rank >= a->world) {
      snprintf(err, errlen, "the dump of rank %d is outside the world of %d ranks", R[i].rank,
               a->world);
      return -1;
    }
    if (strcmp(R[i].job, R[0].job)) {
      snprintf(err, errlen, "the dumps of rank %d (job %s) and rank %d (job %s) are of "
               "different jobs", R[0].rank, R[0].job, R[i].rank, R[i].job);
      return -1;
    }
    a->at[R[i].rank] = i;
    a->gmap[i] = malloc(sizeof(int) * (size_t)(R[i].ngroups > 0 ? R[i].ngroups : 1));
    if (!a->gmap[i]) goto oom;
    for (int g = 0; g < R[i].ngroups; g++)
      if ((a->gmap[i][g] = find_inst(a, &it, &R[i].groups[g])) < 0) goto oom;
  }
  free(it.slot);
  it.slot = NULL;
  if (index_setup(a)) goto oom;
  /* The fault time. */
  ta_report *out = a->out;
  int64_t tf = INT64_MAX, fail_issue = 0;
  for (int i = 0; i < a->n; i++) {
    for (int j = 0; j < R[i].nops; j++) {
      const tr_op *o = &R[i].ops[j];
      if (!ta__is_failure(o->status) || o->end_ns <= 0 || o->end_ns >= tf) continue;
      tf = o->end_ns;
      fail_issue = o->issue_ns;
      out->fault_rank = R[i].rank;
      snprintf(out->fault_status, sizeof out->fault_status, "%s", o->status);
      char nm[TR_NAME * 2];
      ta__op_name(a, i, o, nm, sizeof nm);
      free(out->fault_text);
      mpg__strbuf b = MPG__STRBUF_INIT;
      mpg__strbuf_add(&b, "world rank %d: %s failed with %s after %.1f s", R[i].rank, nm, o->status,
                      secs(o->end_ns - o->issue_ns));
      out->fault_text = mpg__strbuf_take(&b);
    }
  }
  for (int i = 0; i < a->n; i++) {
    if (!strcmp(R[i].reason, "request") || !strcmp(R[i].reason, "end") || R[i].dump_ns >= tf)
      continue;
    tf = R[i].dump_ns;
    fail_issue = tf;
    out->fault_rank = R[i].rank;
    snprintf(out->fault_status, sizeof out->fault_status, "%s", R[i].reason);
    free(out->fault_text);
    mpg__strbuf b = MPG__STRBUF_INIT;
    mpg__strbuf_add(&b, "world rank %d: %s: %s", R[i].rank, R[i].reason, R[i].message);
    out->fault_text = mpg__strbuf_take(&b);
  }
  out->fault = tf != INT64_MAX;
  if (!out->fault) {
    tf = 0;
    for (int i = 0; i < a->n; i++)
      if (R[i].dump_ns > tf) tf = R[i].dump_ns;
    free(out->fault_text);
    out->fault_text = strdup("no failure: every dump was written on request");
  }
  a->tf = out->fault_ns = tf;
  a->long_ns = (tf - fail_issue) / 2;
  if (a->long_ns < 100000000) a->long_ns = 100000000;
  if (!out->fault_text) goto oom;
  for (int i = 0; i < a->n; i++) {
    a->last[i] = -1;
    for (int j = 0; j < R[i].nops; j++)
      if (issued(a, &R[i].ops[j])) a->last[i] = j;
  }
  return 0;
oom:
  free(it.slot);
  snprintf(err, errlen, "out of memory");
  return -1;
}

void ta_report_free(ta_report *r) {
  if (!r) return;
  for (int k = 0; k < r->ngroups; k++) free(r->groups[k].ranks);
  free(r->groups);
  for (int k = 0; k < r->nmismatches; k++) free(r->mismatches[k].text);
  free(r->mismatches);
  for (int k = 0; k < r->nmissing; k++) free(r->missing[k].text);
  free(r->missing);
  for (int k = 0; k < r->nculprits; k++) free(r->culprits[k].text);
  free(r->culprits);
  free(r->fault_text);
  memset(r, 0, sizeof *r);
}

int ta_analyze(const tr_rank *ranks, int n, int world, ta_report *out, char *err,
               size_t errlen) {
  memset(out, 0, sizeof *out);
  out->fault_rank = -1;
  if (n < 1 || !ranks) {
    snprintf(err, errlen, "no dump to analyze");
    return -1;
  }
  if (world < 1) world = ranks[0].world;
  for (int i = 0; i < n; i++)
    if (ranks[i].world > world) world = ranks[i].world;
  an a = {0};
  a.R = ranks;
  a.n = n;
  a.world = world;
  a.out = out;
  out->world = world;
  out->ndumps = n;
  snprintf(out->backend, sizeof out->backend, "%s", ranks[0].backend);
  snprintf(out->mesh, sizeof out->mesh, "%s", ranks[0].mesh);
  snprintf(out->job, sizeof out->job, "%s", ranks[0].job);
  int rc = setup(&a, err, errlen);
  if (!rc) {
    for (int g = 0; g < a.ngi && !a.oom; g++) check_group(&a, g);
    for (int g = 0; g < a.ngi && !a.oom; g++) check_p2p(&a, g);
    if (!a.oom) ta__check_seq(&a);
    if (!a.oom) ta__check_order(&a);
    if (!a.oom) ta__check_waits(&a);
    /* One item per run of consecutive ranks without a dump: the report
     * grows with the dumps, not with WORLD (issue 45, item 14). */
    for (int w = 0; w < world && !a.oom; w++) {
      if (a.at[w] >= 0) continue;
      int e = w;
      while (e + 1 < world && a.at[e + 1] < 0) e++;
      mpg__strbuf b = MPG__STRBUF_INIT;
      if (e == w)
        mpg__strbuf_add(&b, "world rank %d: no dump (killed, or hung and never wrote one)", w);
      else
        mpg__strbuf_add(&b,
                        "world ranks %d to %d (%d ranks): no dump (killed, or hung and never wrote "
                        "one)",
                        w, e, e - w + 1);
      ta__add_item(&a, &out->missing, &out->nmissing, w, &b);
      w = e;
    }
    /* Nothing else explains the failure: the ranks without a dump. */
    for (int k = 0; k < out->nmissing && out->nculprits == 0 && !a.oom; k++) {
      mpg__strbuf b = MPG__STRBUF_INIT;
      mpg__strbuf_add(&b,
                      "culprit: world rank %d: left no dump (killed, or hung and never wrote one)",
                      out->missing[k].rank);
      ta__add_culprit(&a, out->missing[k].rank, &b);
      ta__evidence(&a, out->missing[k].rank, TA_NODUMP, -1, 0, "", -1);
    }
    if (a.oom) {
      snprintf(err, errlen, "out of memory");
      rc = -1;
    }
  }
  out->groups = a.gi;
  out->ngroups = a.ngi;
  a.gi = NULL;
  for (int i = 0; a.icells && a.ninst && a.inst && i < n; i++) {
    for (int k = 0; a.icells[i] && k < a.ninst[i]; k++) {
      free(a.icells[i][k].coll);
      free(a.icells[i][k].p2p);
      free(a.icells[i][k].p2ps);
    }
    free(a.icells[i]);
    free(a.inst[i]);
  }
  free(a.icells);
  free(a.inst);
  free(a.ninst);
  for (int g = 0; g < a.ngi; g++) {
    if (a.dumped) free(a.dumped[g]);
    if (a.bypos) free(a.bypos[g]);
  }
  free(a.dumped);
  free(a.ndumped);
  free(a.bypos);
  free(a.dimset);
  free(a.ucache);
  free(a.last);
  free(a.blk);
  free(a.culprit_at);
  if (a.gmap)
    for (int i = 0; i < n; i++) free(a.gmap[i]);
  free(a.gmap);
  free(a.at);
  return rc;
}
