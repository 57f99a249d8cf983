/* The analyzer's shared helpers (trace_analyze_shared.h): the lookups
 * of operations by number, the states of ranks at the fault time, and the
 * report's lists (their texts built in an mpg__strbuf, base/strbuf.c);
 * trace_analyze.c (signatures, the driver) and trace_analyze_order.c
 * (order, the wait-for graph) both call them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trace_analyze_shared.h"

static const char *const failing[] = {"MPG_ERR_TIMEOUT", "MPG_ERR_ABORTED", "MPG_ERR_STATE",
                                      "MPG_ERR_BACKEND", NULL};

int ta__is_failure(const char *status) {
  for (int i = 0; failing[i]; i++)
    if (!strcmp(status, failing[i])) return 1;
  return 0;
}

int ta__push(int **v, int *n, int x) {
  if ((*n & (*n - 1)) == 0) {
    int *p = realloc(*v, sizeof(int) * (size_t)(*n ? 2 * *n : 1));
    if (!p) return -1;
    *v = p;
  }
  (*v)[(*n)++] = x;
  return 0;
}

/* The op of rank i with collective number k on instance g, or -1 (then
 * *unknown: the ring no longer holds it, so nothing is known). */
int ta__coll_at(an *a, int i, int g, uint64_t k, int *unknown) {
  cell *c = cellof(a, i, g);
  *unknown = 0;
  int lo = 0, hi = c->ncoll - 1;
  while (lo <= hi) {
    int mid = (lo + hi) / 2;
    uint64_t s = a->R[i].ops[c->coll[mid]].gseq;
    if (s == k) return c->coll[mid];
    if (s < k) lo = mid + 1;
    else hi = mid - 1;
  }
  *unknown = lost(a, i) && (c->ncoll == 0 || k < a->R[i].ops[c->coll[0]].gseq);
  return -1;
}

/* The first of c's p2p ops (sorted by (kind, peer, number, index)) not
 * below (send, peer, k). */
static int p2p_lower(const cell *c, const tr_op *ops, int send, int peer, uint64_t k) {
  int lo = 0, hi = c->np2p;
  while (lo < hi) {
    int mid = (lo + hi) / 2;
    const tr_op *o = &ops[c->p2ps[mid]];
    int os = o->kind[0] == 's';
    if (os != send ? os < send : o->peer != peer ? o->peer < peer : o->gseq < k) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

int ta__p2p_run(an *a, int i, int g, int send, int peer, int *end) {
  const cell *c = cellof(a, i, g);
  *end = p2p_lower(c, a->R[i].ops, send, peer, UINT64_MAX);
  while (*end < c->np2p) { /* gseq UINT64_MAX itself (a hostile number) */
    const tr_op *o = &a->R[i].ops[c->p2ps[*end]];
    if ((o->kind[0] == 's') != send || o->peer != peer) break;
    ++*end;
  }
  return p2p_lower(c, a->R[i].ops, send, peer, 0);
}

/* Rank i's `kind` #k with world rank `peer` on instance g, or -1: a binary
 * search, which finds the first of equal numbers in ring order, as a scan
 * would (a cost of the ring's log, not of the pairs the job made). */
int ta__p2p_at(an *a, int i, int g, const char *kind, int peer, uint64_t k, int *unknown) {
  cell *c = cellof(a, i, g);
  const tr_op *ops = a->R[i].ops;
  int send = !strcmp(kind, "send");
  int x = p2p_lower(c, ops, send, peer, k);
  if (x < c->np2p) {
    const tr_op *o = &ops[c->p2ps[x]];
    if ((o->kind[0] == 's') == send && o->peer == peer && o->gseq == k) return c->p2ps[x];
  }
  /* the least number of (kind, peer): the first of its run */
  uint64_t least = 0;
  int f = p2p_lower(c, ops, send, peer, 0);
  if (f < c->np2p) {
    const tr_op *o = &ops[c->p2ps[f]];
    if ((o->kind[0] == 's') == send && o->peer == peer) least = o->gseq;
  }
  *unknown = lost(a, i) && (!least || k < least);
  return -1;
}

static int cmp_pair(const void *x, const void *y) {
  const int *a = x, *b = y;
  return (a[0] > b[0]) - (a[0] < b[0]);
}

/* (Built on first use: a group of 2^20 members that only all-reduces is
 * never sorted.) */
int ta__pos_in(an *a, int g, int w) {
  const ta_group *G = &a->gi[g];
  if (!a->bypos[g]) {
    int *bp = malloc(sizeof(int) * 2 * (size_t)(G->size > 0 ? G->size : 1));
    if (!bp) {
      a->oom = 1;
      return -1;
    }
    for (int q = 0; q < G->size; q++) {
      bp[2 * q] = G->ranks[q];
      bp[2 * q + 1] = q;
    }
    qsort(bp, (size_t)G->size, 2 * sizeof(int), cmp_pair);
    a->bypos[g] = bp;
  }
  const int *v = a->bypos[g];
  int lo = 0, hi = a->gi[g].size - 1;
  while (lo <= hi) {
    int mid = (lo + hi) / 2;
    if (v[2 * mid] == w) return v[2 * mid + 1];
    if (v[2 * mid] < w) lo = mid + 1;
    else hi = mid - 1;
  }
  return -1;
}

/* "all_reduce #812 on dp_cp[3]", "send #3 to rank 4 on pp[0]". */
void ta__op_name(const an *a, int i, const tr_op *o, char *buf, size_t cap) {
  const ta_group *G = &a->gi[inst_of(a, i, o)];
  if (is_p2p(o))
    snprintf(buf, cap, "%s #%llu %s rank %d on %s[%d]", o->kind, (unsigned long long)o->gseq,
             !strcmp(o->kind, "send") ? "to" : "from", o->peer, G->name, G->index);
  else
    snprintf(buf, cap, "%s #%llu on %s[%d]", o->kind, (unsigned long long)o->gseq, G->name,
             G->index);
}

/* "f32 x 1024, bucket 2 (p3..p7)". */
void ta__op_detail(const tr_op *o, char *buf, size_t cap) {
  int n = snprintf(buf, cap, "%s x %llu", o->dtype[0] ? o->dtype : "-",
                   (unsigned long long)o->count);
  if (!strcmp(o->kind, "broadcast") && n > 0 && (size_t)n < cap)
    n += snprintf(buf + n, cap - (size_t)n, ", root rank %d", o->peer);
  if (o->bucket >= 0 && n > 0 && (size_t)n < cap)
    snprintf(buf + n, cap - (size_t)n, ", bucket %d (%s..%s)", o->bucket,
             o->first[0] ? o->first : "-", o->last[0] ? o->last : "-");
}

/* How op o stood at time t: "pending 2.0 s", "ended ok 0.3 s before". */
void ta__op_state(const tr_op *o, int64_t t, char *buf, size_t cap) {
  if (o->end_ns == 0 || o->end_ns > t)
    snprintf(buf, cap, "pending %.1f s", secs(t - o->issue_ns));
  else
    snprintf(buf, cap, "ended %s %.1f s before", o->status, secs(t - o->end_ns));
}

static int blocked_at(an *a, int i, int *w, int deep);

/* Member mi issued p, the match of a waiting operation, but p had not
 * completed by T while mi was itself blocked, waiting for others: on nccl
 * a device runs its operations in issue order, so a send queued behind a
 * stuck all-reduce is stuck too, and the waiter waits for mi. */
static int stuck(an *a, int mi, const tr_op *p) {
  if (!pending_at(a, p)) return 0;
  if (a->blk[mi] < 0) a->blk[mi] = (signed char)blocked_at(a, mi, NULL, 0);
  return a->blk[mi];
}

/* Member m (a world rank) of instance g had not issued collective o's
 * match by T, or issued another one, or (deep) was stuck behind its own
 * wait. */
static int coll_misses(an *a, int g, const tr_op *o, int m, int deep) {
  int mi = a->at[m], unk = 0;
  if (mi < 0) return 1;
  int j = ta__coll_at(a, mi, g, o->gseq, &unk);
  const tr_op *p = j >= 0 ? &a->R[mi].ops[j] : NULL;
  return p ? !issued(a, p) || !same_sig(o, p) || (deep && stuck(a, mi, p)) : !unk;
}

/* ta__unmet (below); w NULL: only whether any (the first); deep: also the
 * members stuck behind their own earlier waits. */
static int unmet_at(an *a, int i, const tr_op *o, int *w, int deep, const int *pos,
                    int npos) {
  int g = inst_of(a, i, o), nw = 0, unk = 0, me = a->R[i].rank;
  const ta_group *G = &a->gi[g];
  if (is_p2p(o)) {
    int m = o->peer;
    if (m < 0 || m >= a->world || m == me) return 0;
    int mi = a->at[m], miss = mi < 0;
    if (!miss) {
      int j = ta__p2p_at(a, mi, g, !strcmp(o->kind, "send") ? "recv" : "send", me, o->gseq, &unk);
      const tr_op *p = j >= 0 ? &a->R[mi].ops[j] : NULL;
      miss = p ? !issued(a, p) || p->count != o->count || strcmp(p->dtype, o->dtype) ||
                     (deep && stuck(a, mi, p))
               : !unk;
    }
    if (miss && w) w[nw] = m;
    return nw + miss;
  }
  struct ta_ucache *u = &a->ucache[2 * g + !!deep];
  if (!w && !pos && u->op && u->op->gseq == o->gseq && same_sig(u->op, o))
    return u->nmiss > 1 || (u->nmiss == 1 && u->miss[0] != me);
  if (!w && !pos) {
    /* Whether any member but me misses it does not depend on me beyond
     * that: the first two members that miss it, whoever asks (me too),
     * answer every waiter with this number and signature at once
     * (4,096 ranks blocked in one all-reduce are not 4,096^2 checks). */
    u->op = NULL;
    u->nmiss = 0;
    for (int q = 0; q < G->size && u->nmiss < 2; q++) {
      int m = G->ranks[q];
      if (m < 0 || m >= a->world) continue;
      if (coll_misses(a, g, o, m, deep)) u->miss[u->nmiss++] = m;
    }
    u->op = o;
    return u->nmiss > 1 || (u->nmiss == 1 && u->miss[0] != me);
  }
  int nq = pos ? npos : G->size;
  for (int x = 0; x < nq; x++) {
    int m = G->ranks[pos ? pos[x] : x];
    if (m == me || m < 0 || m >= a->world) continue;
    if (!coll_misses(a, g, o, m, deep)) continue;
    if (!w) return 1;
    w[nw++] = m;
  }
  return nw;
}

/* The members op o of rank i waits for at T: no dump, not issued, issued
 * another operation, or issued it but were blocked themselves (stuck).
 * Returns how many (world ranks in w). */
int ta__unmet(an *a, int i, const tr_op *o, int *w) { return unmet_at(a, i, o, w, 1, NULL, 0); }

int ta__unmet_among(an *a, int i, const tr_op *o, int *w, const int *pos, int npos) {
  return unmet_at(a, i, o, w, 1, pos, npos);
}

/* Rank i was blocked at T: its last issued operation was still pending
 * and one of its pending operations waited for another rank. */
static int blocked_at(an *a, int i, int *w, int deep) {
  const tr_rank *r = &a->R[i];
  int last = a->last[i];
  if (last < 0 || !pending_at(a, &r->ops[last])) return 0;
  for (int j = 0; j <= last; j++)
    if (pending_at(a, &r->ops[j]) && unmet_at(a, i, &r->ops[j], w, deep, NULL, 0) > 0) return 1;
  return 0;
}

int ta__blocked(an *a, int i, int *w) { return blocked_at(a, i, w, 1); }

/* The last operation rank i issued by T, described ("; last op ..."). */
void ta__last_op(an *a, int i, mpg__strbuf *b) {
  const tr_rank *r = &a->R[i];
  int last = a->last[i];
  if (last < 0) {
    mpg__strbuf_add(b, "; no operation recorded before the failure");
    return;
  }
  char nm[TR_NAME * 2], st[64];
  ta__op_name(a, i, &r->ops[last], nm, sizeof nm);
  ta__op_state(&r->ops[last], a->tf, st, sizeof st);
  mpg__strbuf_add(b, "; last op %s, %s%s", nm, st,
                  r->ops[last].end_ns == 0 || r->ops[last].end_ns > a->tf ? "" : " the failure");
}

/* ------------------------------------------------------------------ */
/* The report's lists                                                  */
/* ------------------------------------------------------------------ */

/* Whether rank was named already: a mark per world rank (the culprits
 * are not searched, so naming n of them is not n^2). */
static int has_culprit(const an *a, int rank) {
  if (rank >= 0 && rank < a->world) return a->culprit_at[rank];
  for (int k = 0; k < a->out->nculprits; k++)
    if (a->out->culprits[k].rank == rank) return 1;
  return 0;
}

void ta__add_item(an *a, ta_item **v, int *n, int rank, mpg__strbuf *b) {
  char *t = mpg__strbuf_take(b);
  memset(b, 0, sizeof *b);
  ta_item *p = *v;
  /* capacity: the next power of 2 (the lists only grow here) */
  if (t && (*n & (*n - 1)) == 0)
    p = realloc(*v, sizeof(ta_item) * (size_t)(*n ? 2 * *n : 1));
  if (!t || !p) {
    free(t);
    a->oom = 1;
    return;
  }
  *v = p;
  memset(&p[*n], 0, sizeof p[*n]);
  p[*n].rank = rank;
  p[*n].text = t;
  (*n)++;
}

void ta__add_culprit(an *a, int rank, mpg__strbuf *b) {
  if (has_culprit(a, rank)) {
    mpg__strbuf_free(b);
    memset(b, 0, sizeof *b);
    return;
  }
  ta__add_item(a, &a->out->culprits, &a->out->nculprits, rank, b);
  if (rank >= 0 && rank < a->world && !a->oom) a->culprit_at[rank] = 1;
}
