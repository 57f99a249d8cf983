/* Sequence evidence (issue 46, items 1-2; trace_analyze_shared.h): a
 * member of a group instance whose list of operations there lacks one
 * that its peers hold, whatever the signatures.  And the setters that
 * fill a culprit's evidence (ta_item: how, group, number, the peers'
 * times) for every verdict.
 *
 * The rule.  On a group instance G, member m "lacks" #x when a peer p
 * issued #x (by the fault time T) and m either never issued it (its list
 * on G ends before x) or issued its #x in a later sync step than p did
 * (the same signature shifted the numbers: m holds fewer in p's step).
 * That alone is what a rank waiting before #x shows too (a victim), so m
 * is named only when it went on past the place of #x:
 *  - its #x is in a later step (it left p's step S with fewer on G), or
 *  - its list ended and then it issued an operation of a later step, or
 *    more operations of another group name in S than any rank of G's dim
 *    set issued there before its own next collective on G (the
 *    issue-order check's all-reduce on world that ends the step, issued
 *    with 7 tp all-reduces where the program has 8 before it), or it
 *    ended its program (a dump with reason "end");
 * and when the ranks that run G's program agree that step S holds more
 * than m issued: on every instance of G's dim set (all tp[i] run one
 * program), at least two members other than m issued more than m in S
 * (p and one more), and no member that finished S (issued an operation
 * of a later step, or ended) issued as few as m.  A pair that alone
 * disagrees (m 7, p 8, nobody else to ask) names nobody: an extra
 * operation of p reads the same.
 *
 * Cost: per group instance, per member, one pass over its list on the
 * instance and one over its peer's, and for a candidate one pass over its
 * ring; the counts per (dim set, step) and the places per (dim set, step,
 * count) are made once each, over every rank's ring, for at most SEQ_KEYS
 * of each (candidates past those are left to the other rules), and the
 * counts sorted, so that a candidate is answered by binary search: n log n
 * in ranks x ring entries. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trace_analyze_shared.h"

/* How many (dim set, step) pairs are counted; candidates beyond are left
 * to the other rules (precision first). */
#define SEQ_KEYS 16

typedef struct seq_key {
  const char *name;
  long step;
  int *less;   /* sorted counts of the members (with a dump, the ring whole in S) */
  int nless;
  int *done;   /* sorted counts of those of them that finished S */
  int ndone;
  int *rank_count; /* [rank index]: its count, -1 unknown or not a member */
} seq_key;

#define SEQ_NAMES 32 /* group names told apart (more: not compared) */

typedef struct place place;

typedef struct seq {
  seq_key keys[SEQ_KEYS];
  int nkeys;
  int *nameid; /* per instance: its name's number, -1 past SEQ_NAMES */
  int nnames;
  struct place *places;
  int nplaces;
} seq;

static int cmp_int(const void *x, const void *y) {
  int a = *(const int *)x, b = *(const int *)y;
  return (a > b) - (a < b);
}

/* The last operation rank i issued by T (index), or -1. */
static int last_issued(const an *a, int i) {
  const tr_rank *r = &a->R[i];
  for (int j = r->nops - 1; j >= 0; j--)
    if (issued(a, &r->ops[j])) return j;
  return -1;
}

static int ended(const an *a, int i) { return !strcmp(a->R[i].reason, "end"); }

/* Rank i finished step s: it issued an operation of a later step by T,
 * or ended its program. */
static int finished(const an *a, int i, long s) {
  int j = last_issued(a, i);
  return ended(a, i) || (j >= 0 && a->R[i].ops[j].step > s);
}

/* Rank i's collectives on instance g in step s issued by T; -1 when the
 * ring may have lost some of them. */
static int count_in(an *a, int i, int g, long s) {
  const cell *c = cellof(a, i, g);
  if (lost(a, i) && (c->ncoll == 0 || a->R[i].ops[c->coll[0]].step >= s)) return -1;
  int n = 0;
  for (int x = 0; x < c->ncoll; x++) {
    const tr_op *o = &a->R[i].ops[c->coll[x]];
    if (o->step == s && issued(a, o)) n++;
  }
  return n;
}

/* The counts of dim set `name` in step s, made once. */
static seq_key *key_of(an *a, seq *q, const char *name, long s) {
  for (int k = 0; k < q->nkeys; k++)
    if (q->keys[k].step == s && !strcmp(q->keys[k].name, name)) return &q->keys[k];
  if (q->nkeys == SEQ_KEYS) return NULL;
  seq_key *K = &q->keys[q->nkeys];
  memset(K, 0, sizeof *K);
  K->name = name;
  K->step = s;
  K->rank_count = malloc(sizeof(int) * (size_t)a->n);
  K->less = malloc(sizeof(int) * (size_t)a->n * 2);
  if (!K->rank_count || !K->less) {
    free(K->rank_count);
    free(K->less);
    a->oom = 1;
    return NULL;
  }
  K->done = K->less + a->n;
  q->nkeys++;
  for (int i = 0; i < a->n; i++) K->rank_count[i] = -1;
  for (int i = 0; i < a->n; i++) {
    const tr_rank *r = &a->R[i];
    for (int x = 0; x < r->ngroups; x++) {
      if (strcmp(r->groups[x].name, name)) continue;
      int c = count_in(a, i, a->gmap[i][x], s);
      if (c < 0) break;
      K->rank_count[i] = c;
      K->less[K->nless++] = c;
      if (finished(a, i, s)) K->done[K->ndone++] = c;
      break;
    }
  }
  qsort(K->less, (size_t)K->nless, sizeof(int), cmp_int);
  qsort(K->done, (size_t)K->ndone, sizeof(int), cmp_int);
  return K;
}

/* How many of v[0..n) (sorted) are <= x. */
static int at_most(const int *v, int n, int x) {
  int lo = 0, hi = n;
  while (lo < hi) {
    int mid = (lo + hi) / 2;
    if (v[mid] <= x) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/* The ranks of G's program agree that step s holds more than rank mi's
 * count there: *cm its count, *more how many others issued more. */
static int program_agrees(an *a, seq *q, int g, int mi, long s, int *cm, int *more) {
  seq_key *K = key_of(a, q, a->gi[g].name, s);
  if (!K || K->rank_count[mi] < 0) return 0;
  int c = *cm = K->rank_count[mi];
  *more = K->nless - at_most(K->less, K->nless, c);
  int as_few = at_most(K->done, K->ndone, c) - (finished(a, mi, s) ? 1 : 0);
  return *more >= 2 && as_few == 0;
}

/* Where step s of the program of dim set `name` (number gn) puts its
 * (c+1)-th collective there: max[h], the most operations of the groups
 * of name h that a rank of the program issued in step s before it, over
 * the ranks that issued it (nref). */
typedef struct place {
  int gn, c, nref;
  long step;
  int max[SEQ_NAMES];
} place;

static place *place_of(an *a, seq *q, int gn, long s, int c) {
  for (int k = 0; k < q->nplaces; k++)
    if (q->places[k].gn == gn && q->places[k].step == s && q->places[k].c == c)
      return &q->places[k];
  if (q->nplaces == SEQ_KEYS) return NULL;
  place *P = &q->places[q->nplaces++];
  memset(P, 0, sizeof *P);
  P->gn = gn;
  P->step = s;
  P->c = c;
  for (int i = 0; i < a->n; i++) {
    const tr_rank *r = &a->R[i];
    int member = 0;
    for (int x = 0; x < r->ngroups && !member; x++)
      member = q->nameid[a->gmap[i][x]] == gn;
    if (!member || (lost(a, i) && (r->nops == 0 || r->ops[0].step >= s))) continue;
    int cnt[SEQ_NAMES] = {0}, gc = 0;
    for (int j = 0; j < r->nops; j++) {
      const tr_op *o = &r->ops[j];
      if (o->step != s || !issued(a, o)) continue;
      int h = q->nameid[inst_of(a, i, o)];
      if (h < 0) continue;
      if (h == gn && ++gc == c + 1) {
        for (int y = 0; y < q->nnames; y++)
          if (cnt[y] > P->max[y]) P->max[y] = cnt[y];
        P->nref++;
        break;
      }
      cnt[h]++;
    }
  }
  return P;
}

/* Rank mi, with c collectives on instance g in step s (its last there:
 * index jm, -1 none), went past the place of the next one: after jm it
 * issued an operation of a later step, or more operations of another
 * group in step s than the ranks of the program issue before it, or it
 * ended its program.  Writes what it went on to in `next`. */
static int went_on(an *a, seq *q, int mi, int jm, int g, long s, int c, char *next, size_t cap) {
  const tr_rank *m = &a->R[mi];
  int gn = q->nameid[g];
  if (gn < 0 || (lost(a, mi) && (m->nops == 0 || m->ops[0].step >= s))) return 0;
  place *P = place_of(a, q, gn, s, c);
  int cnt[SEQ_NAMES] = {0};
  for (int j = 0; j < m->nops; j++) {
    const tr_op *o = &m->ops[j];
    if (!issued(a, o)) continue;
    if (j > jm && s >= 0 && o->step > s) {
      ta__op_name(a, mi, o, next, cap);
      return 1;
    }
    int h = q->nameid[inst_of(a, mi, o)];
    if (o->step != s || h < 0 || h == gn) continue;
    cnt[h]++;
    if (j > jm && P && P->nref > 0 && cnt[h] > P->max[h]) {
      ta__op_name(a, mi, o, next, cap);
      return 1;
    }
  }
  if (ended(a, mi) && last_issued(a, mi) >= 0) {
    snprintf(next, cap, "the end of its program (a dump with reason end)");
    return 1;
  }
  return 0;
}

/* Member mi of instance g against the reference member pi: the first
 * number x that pi issued and mi lacks (never issued, or issued in a
 * later step); 0 when none.  *jm: mi's last op before x on g (-1: none),
 * *jp: pi's op #x. */
static uint64_t first_lack(an *a, int g, int mi, int pi, int *jm, int *jp, int *shifted) {
  const cell *cm = cellof(a, mi, g), *cp = cellof(a, pi, g);
  const tr_op *M = a->R[mi].ops, *Pp = a->R[pi].ops;
  int x = 0, y = 0;
  *jm = -1;
  /* both lists from the first number both hold */
  while (x < cm->ncoll && y < cp->ncoll) {
    const tr_op *o = &M[cm->coll[x]], *e = &Pp[cp->coll[y]];
    if (o->gseq < e->gseq) {
      if (issued(a, o)) *jm = cm->coll[x];
      x++;
    } else if (e->gseq < o->gseq) {
      if (x == 0 && lost(a, mi)) y++; /* mi's ring lost it */
      else break;                      /* mi lacks it */
    } else {
      if (!issued(a, e)) return 0;
      if (!issued(a, o)) return 0; /* late, not lacking */
      if (o->step > e->step && e->step >= 0) {
        *jp = cp->coll[y];
        *shifted = 1;
        return e->gseq;
      }
      *jm = cm->coll[x];
      x++;
      y++;
    }
  }
  if (y >= cp->ncoll) return 0;
  if (x == 0 && cm->ncoll == 0 && lost(a, mi)) return 0;
  if (x < cm->ncoll && issued(a, &M[cm->coll[x]])) {
    /* mi's list goes on past a number pi holds: a gap, not a tail */
    return 0;
  }
  const tr_op *e = &Pp[cp->coll[y]];
  if (!issued(a, e)) return 0;
  *jp = cp->coll[y];
  *shifted = 0;
  return e->gseq;
}

static void name_skip(an *a, seq *q, int g) {
  const ta_group *G = &a->gi[g];
  /* The reference: the member with a dump that issued the highest number. */
  int ref = -1;
  uint64_t best = 0;
  for (int x = 0; x < G->size; x++) {
    int i = rank_index(a, G->ranks[x]);
    if (i < 0) continue;
    const cell *c = cellof(a, i, g);
    for (int y = c->ncoll - 1; y >= 0; y--) {
      const tr_op *o = &a->R[i].ops[c->coll[y]];
      if (!issued(a, o)) continue;
      if (o->gseq > best) {
        best = o->gseq;
        ref = i;
      }
      break;
    }
  }
  if (ref < 0) return;
  for (int x = 0; x < G->size && !a->oom; x++) {
    int mi = rank_index(a, G->ranks[x]);
    if (mi < 0 || mi == ref) continue;
    int jm = -1, jp = -1, shifted = 0;
    uint64_t k = first_lack(a, g, mi, ref, &jm, &jp, &shifted);
    if (!k) continue;
    const tr_op *P = &a->R[ref].ops[jp];
    int cm = 0, more = 0;
    if (!program_agrees(a, q, g, mi, P->step, &cm, &more)) continue;
    char next[TR_NAME * 3];
    if (shifted) {
      int unk, j = ta__coll_at(a, mi, g, k, &unk);
      char nm[TR_NAME * 2];
      ta__op_name(a, mi, &a->R[mi].ops[j], nm, sizeof nm);
      snprintf(next, sizeof next, "step %ld (its %s)", a->R[mi].ops[j].step, nm);
    } else if (!went_on(a, q, mi, jm, g, P->step, cm, next, sizeof next)) {
      continue;
    }
    seq_key *K = key_of(a, q, G->name, P->step);
    int cp = K ? K->rank_count[ref] : -1;
    char in[48] = "";
    if (P->step >= 0) snprintf(in, sizeof in, " in step %ld", P->step);
    int before = a->out->nculprits;
    mpg__strbuf b = MPG__STRBUF_INIT;
    mpg__strbuf_add(
        &b,
        "culprit: world rank %d: skipped %s #%llu on %s[%d]%s: its peer world rank %d "
        "issued %d collective%s on %s[%d]%s, it issued %d and went on to %s (%d rank%s of "
        "the %s groups issued more than %d%s, none that finished %s as few)",
        a->R[mi].rank, P->kind, (unsigned long long)k, G->name, G->index, in, a->R[ref].rank, cp,
        cp == 1 ? "" : "s", G->name, G->index, in, cm, next, more, more == 1 ? "" : "s", G->name,
        cm, P->step >= 0 ? " in that step" : "", P->step >= 0 ? "the step" : "their program");
    ta__add_culprit(a, a->R[mi].rank, &b);
    if (a->out->nculprits > before)
      ta__evidence(a, a->R[mi].rank, TA_SKIPPED, g, k, P->kind, -1);
  }
}

void ta__check_seq(an *a) {
  seq q = {0};
  q.nameid = malloc(sizeof(int) * (size_t)(a->ngi > 0 ? a->ngi : 1));
  q.places = malloc(sizeof(place) * SEQ_KEYS);
  const char *names[SEQ_NAMES];
  if (!q.nameid || !q.places) {
    a->oom = 1;
    goto out;
  }
  /* the group names (few): a number each */
  for (int g = 0; g < a->ngi; g++) {
    int k = 0;
    while (k < q.nnames && strcmp(names[k], a->gi[g].name)) k++;
    if (k == q.nnames && q.nnames < SEQ_NAMES) names[q.nnames++] = a->gi[g].name;
    q.nameid[g] = k < q.nnames ? k : -1;
  }
  for (int g = 0; g < a->ngi && !a->oom; g++) name_skip(a, &q, g);
out:
  for (int k = 0; k < q.nkeys; k++) {
    free(q.keys[k].rank_count);
    free(q.keys[k].less);
  }
  free(q.nameid);
  free(q.places);
}

/* ------------------------------------------------------------------ */
/* A culprit's evidence (ta_item), for every rule                      */
/* ------------------------------------------------------------------ */

static ta_item *culprit_item(an *a, int rank) {
  for (int k = a->out->nculprits - 1; k >= 0; k--)
    if (a->out->culprits[k].rank == rank) return &a->out->culprits[k];
  return NULL;
}

/* The peers' times of op #k of `kind` on instance g, `rank` the culprit:
 * a collective: every member with a dump but rank that holds #k; a send
 * or receive (peer >= 0): world rank peer's opposite op with rank. */
static void peers_times(an *a, int rank, int g, uint64_t k, const char *kind, int peer,
                        ta_item *it) {
  const ta_group *G = &a->gi[g];
  int64_t first = 0, last = 0;
  int pending = 0, unk;
  for (int x = 0; x < G->size; x++) {
    int w = G->ranks[x], i = rank_index(a, w);
    if (i < 0 || w == rank || (peer >= 0 && w != peer)) continue;
    int j = peer >= 0 ? ta__p2p_at(a, i, g, !strcmp(kind, "send") ? "recv" : "send", rank, k, &unk)
                      : ta__coll_at(a, i, g, k, &unk);
    if (j < 0) continue;
    const tr_op *o = &a->R[i].ops[j];
    if (!first || o->issue_ns < first) first = o->issue_ns;
    if (o->end_ns == 0) pending = 1;
    else if (o->end_ns > last) last = o->end_ns;
  }
  it->peers_issue_ns = first;
  it->peers_end_ns = pending ? 0 : last;
}

void ta__evidence(an *a, int rank, ta_how how, int g, uint64_t k, const char *kind, int peer) {
  ta_item *it = culprit_item(a, rank);
  if (!it || it->how != TA_OTHER) return;
  it->how = how;
  if (g < 0 || g >= a->ngi) return; /* no operation names it (a rank without a dump) */
  snprintf(it->group, sizeof it->group, "%s[%d]", a->gi[g].name, a->gi[g].index);
  it->gseq = k;
  snprintf(it->kind, sizeof it->kind, "%s", kind);
  peers_times(a, rank, g, k, kind, peer, it);
}

void ta__evidence_order(an *a, int xi, const tr_op *ref, int ri, const tr_op *at, ta_how how) {
  const char *name = a->gi[inst_of(a, ri, ref)].name;
  const tr_rank *r = &a->R[xi];
  int g = -1;
  for (int q = 0; q < r->ngroups && g < 0; q++)
    if (!strcmp(r->groups[q].name, name)) g = a->gmap[xi][q];
  if (g < 0) return;
  int peer = -1;
  if (is_p2p(ref)) {
    /* the same position in the culprit's instance */
    const ta_group *RG = &a->gi[inst_of(a, ri, ref)], *G = &a->gi[g];
    for (int q = 0; q < RG->size && q < G->size; q++)
      if (RG->ranks[q] == ref->peer) peer = G->ranks[q];
  }
  uint64_t k = 0;
  for (int j = 0; j < r->nops && r->ops[j].seq < at->seq; j++) {
    const tr_op *o = &r->ops[j];
    if (inst_of(a, xi, o) != g) continue;
    if (is_p2p(ref) ? !strcmp(o->kind, ref->kind) && o->peer == peer : !is_p2p(o)) k = o->gseq;
  }
  ta__evidence(a, r->rank, how, g, k + 1, ref->kind, peer);
}

void ta__evidence_wait(an *a, int m, int wi, const tr_op *o) {
  int mi = rank_index(a, m), g = inst_of(a, wi, o), unk = 0, j = -1;
  int p2p = is_p2p(o);
  const char *kind = p2p ? (!strcmp(o->kind, "recv") ? "send" : "recv") : o->kind;
  ta_how how = mi < 0 ? TA_NODUMP : TA_ROOT;
  if (mi >= 0) {
    j = p2p ? ta__p2p_at(a, mi, g, kind, a->R[wi].rank, o->gseq, &unk)
            : ta__coll_at(a, mi, g, o->gseq, &unk);
    if (j >= 0 && !issued(a, &a->R[mi].ops[j])) how = TA_LATE;
    else if (j >= 0) how = TA_DIFFERS;
  }
  ta__evidence(a, m, how, g, o->gseq, kind, p2p ? a->R[wi].rank : -1);
}
