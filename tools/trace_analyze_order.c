/* The analyzer's verdicts from the order of operations within a step and
 * from the wait-for graph at the fault time (trace_analyze.h; the rules
 * at the top of trace_analyze.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trace_analyze_internal.h"

/* ------------------------------------------------------------------ */
/* 2. Order: the ranks that run one program, step by step              */
/* ------------------------------------------------------------------ */

/* An op as its program issues it: group name, kind, dtype, count,
 * bucket, and the peer's (root's) position in the group. */
static void prog_key(an *a, int i, const tr_op *o, char *buf, size_t cap) {
  const ta_group *G = &a->gi[inst_of(a, i, o)];
  int pos = -1;
  if (o->peer >= 0)
    for (int q = 0; q < G->size; q++)
      if (G->ranks[q] == o->peer) pos = q;
  snprintf(buf, cap, "%s|%s|%s|%llu|%d|%d", G->name, o->kind, o->dtype,
           strcmp(o->kind, "all_to_all_v") ? (unsigned long long)o->count : 0ull, o->bucket,
           pos);
}

/* Every rank's role (role[i], rank index i): its positions in the groups
 * whose dim sets carry point-to-point traffic in any dump ("pp=0;"), as
 * any dump shows them, so that a rank blocked before its first send still
 * has the role of its stage; ranks of one role run one program.  0, or -1
 * when out of memory. */
static int roles(an *a, char (*role)[512]) {
  char *mark = calloc((size_t)a->ngi + 1, 1);
  int *names = malloc(sizeof(int) * ((size_t)a->ngi + 1)), nn = 0;
  if (!mark || !names) {
    free(mark);
    free(names);
    return -1;
  }
  for (int i = 0; i < a->n; i++) {
    role[i][0] = '\0';
    for (int j = 0; j < a->R[i].nops; j++)
      if (is_p2p(&a->R[i].ops[j])) mark[inst_of(a, i, &a->R[i].ops[j])] = 1;
  }
  /* The dim sets' names (few), in one order for every rank. */
  for (int g = 0; g < a->ngi; g++) {
    int known = 0;
    for (int k = 0; k < nn && !known; k++) known = !strcmp(a->gi[names[k]].name, a->gi[g].name);
    if (mark[g] && !known) names[nn++] = g;
  }
  for (int k = 0; k < nn; k++)
    for (int g = 0; g < a->ngi; g++) {
      const ta_group *G = &a->gi[g];
      if (strcmp(G->name, a->gi[names[k]].name)) continue;
      for (int q = 0; q < G->size; q++) {
        int i = rank_index(a, G->ranks[q]);
        if (i < 0) continue;
        size_t n = strlen(role[i]);
        snprintf(role[i] + n, sizeof role[i] - n, "%s=%d;", G->name, q);
      }
    }
  free(mark);
  free(names);
  return 0;
}

static int shares_group(an *a, int w1, int w2) {
  for (int g = 0; g < a->ngi; g++) {
    int in1 = 0, in2 = 0;
    for (int q = 0; q < a->gi[g].size; q++) {
      in1 |= a->gi[g].ranks[q] == w1;
      in2 |= a->gi[g].ranks[q] == w2;
    }
    if (in1 && in2) return 1;
  }
  return 0;
}

/* The ops of rank i in step s issued by T (a step the ring holds whole):
 * *first (index into its ops) and the count. */
static int step_ops(an *a, int i, long s, int *first) {
  const tr_rank *r = &a->R[i];
  int n = 0;
  *first = -1;
  for (int j = 0; j < r->nops; j++) {
    const tr_op *o = &r->ops[j];
    if (o->step != s || !issued(a, o)) continue;
    if (lost(a, i) && o->step == r->ops[0].step) return 0; /* partly overwritten */
    if (*first < 0) *first = j;
    n++;
  }
  return n;
}

/* Op p (0-based) of rank i's step from first, or NULL. */
static const tr_op *nth(an *a, int i, int first, int len, int p) {
  if (p >= len) return NULL;
  const tr_rank *r = &a->R[i];
  int c = 0;
  for (int j = first; j < r->nops; j++) {
    const tr_op *o = &r->ops[j];
    if (o->step != r->ops[first].step || !issued(a, o)) continue;
    if (c++ == p) return o;
  }
  return NULL;
}

/* The number rank i would have given an operation like `ref` (an op of a
 * rank of its program) right before its op `at`, and its description. */
static void expected(an *a, int i, int ri, const tr_op *ref, const tr_op *at, char *buf,
                     size_t cap) {
  const ta_group *RG = &a->gi[inst_of(a, ri, ref)];
  const tr_rank *r = &a->R[i];
  int g = -1;
  for (int q = 0; q < r->ngroups && g < 0; q++)
    if (!strcmp(r->groups[q].name, RG->name)) g = a->gmap[i][q];
  if (g < 0) {
    snprintf(buf, cap, "%s on %s", ref->kind, RG->name);
    return;
  }
  const ta_group *G = &a->gi[g];
  int peer = -1;
  if (is_p2p(ref))
    for (int q = 0; q < RG->size; q++)
      if (RG->ranks[q] == ref->peer && q < G->size) peer = G->ranks[q];
  uint64_t k = 0;
  for (int j = 0; j < r->nops && r->ops[j].seq < at->seq; j++) {
    const tr_op *o = &r->ops[j];
    if (inst_of(a, i, o) != g) continue;
    if (is_p2p(ref) ? !strcmp(o->kind, ref->kind) && o->peer == peer : !is_p2p(o)) k = o->gseq;
  }
  if (!is_p2p(ref)) {
    /* collectives share one numbering on the group, whatever their kind */
    snprintf(buf, cap, "%s #%llu on %s[%d]", ref->kind, (unsigned long long)k + 1, G->name,
             G->index);
  } else {
    snprintf(buf, cap, "%s #%llu %s rank %d on %s[%d]", ref->kind, (unsigned long long)k + 1,
             !strcmp(ref->kind, "send") ? "to" : "from", peer, G->name, G->index);
  }
}

static void order_culprit(an *a, int xi, int yi, long s, int p, const int *win, int nwin,
                          const tr_op *x0, const tr_op *x1, const tr_op *y0, const tr_op *y1) {
  char kx0[512], kx1[512], ky0[512], ky1[512], n0[TR_NAME * 2], n1[TR_NAME * 2];
  prog_key(a, xi, x0, kx0, sizeof kx0);
  prog_key(a, yi, y0, ky0, sizeof ky0);
  kx1[0] = ky1[0] = '\0';
  if (x1) prog_key(a, xi, x1, kx1, sizeof kx1);
  if (y1) prog_key(a, yi, y1, ky1, sizeof ky1);
  op_name(a, xi, x0, n0, sizeof n0);
  sb b = {0};
  sb_add(&b, "culprit: world rank %d: ", a->R[xi].rank);
  if (x1 && y1 && !strcmp(kx0, ky1) && !strcmp(kx1, ky0)) {
    op_name(a, xi, x1, n1, sizeof n1);
    sb_add(&b, "swapped two operations of step %ld: issued %s before %s", s, n0, n1);
  } else if (y1 && !strcmp(kx0, ky1)) {
    expected(a, xi, yi, y0, x0, n1, sizeof n1);
    sb_add(&b, "skipped %s in step %ld: issued %s next", n1, s, n0);
  } else {
    expected(a, xi, yi, y0, x0, n1, sizeof n1);
    sb_add(&b, "issued %s as operation %d of step %ld where the ranks of its program issued "
           "%s", n0, p + 1, s, n1);
  }
  sb_add(&b, " (as world rank%s", nwin == 1 ? "" : "s");
  for (int k = 0; k < nwin && k < 6; k++) sb_add(&b, "%s %d", k ? "," : "", win[k]);
  sb_add(&b, "%s did otherwise)", nwin > 6 ? ", ..." : "");
  add_culprit(a, a->R[xi].rank, &b);
  ta__evidence_order(a, xi, y0, yi, x0, x1 && y1 && !strcmp(kx0, ky1) && !strcmp(kx1, ky0) ? TA_SWAPPED : y1 && !strcmp(kx0, ky1) ? TA_SKIPPED : TA_DIFFERS);
}

/* One role's step s: vote position by position. */
static void vote_step(an *a, const int *mem, int nm, long s, char *flagged) {
  int *first = malloc(sizeof(int) * (size_t)nm * 3), *len = first + nm, *alive = len + nm;
  char (*key)[512] = malloc(sizeof *key * (size_t)nm);
  int *win = malloc(sizeof(int) * (size_t)nm);
  if (!first || !key || !win) {
    a->oom = 1;
    goto out;
  }
  for (int x = 0; x < nm; x++) {
    len[x] = flagged[x] ? 0 : step_ops(a, mem[x], s, &first[x]);
    alive[x] = len[x] > 0;
  }
  for (int p = 0;; p++) {
    int voters = 0;
    for (int x = 0; x < nm; x++) {
      if (!alive[x] || len[x] <= p) {
        alive[x] = 0;
        continue;
      }
      prog_key(a, mem[x], nth(a, mem[x], first[x], len[x], p), key[x], sizeof key[x]);
      voters++;
    }
    if (voters < 3) break;
    int best = -1, bestn = 0;
    for (int x = 0; x < nm; x++) {
      if (!alive[x]) continue;
      int c = 0;
      for (int y = 0; y < nm; y++) c += alive[y] && !strcmp(key[x], key[y]);
      if (c > bestn) {
        bestn = c;
        best = x;
      }
    }
    if (bestn * 2 <= voters || bestn < 2) break;
    int nwin = 0;
    for (int y = 0; y < nm; y++)
      if (alive[y] && !strcmp(key[y], key[best])) win[nwin++] = a->R[mem[y]].rank;
    for (int x = 0; x < nm; x++) {
      if (!alive[x] || !strcmp(key[x], key[best])) continue;
      alive[x] = 0;
      /* A member of one of its groups that follows the majority. */
      int y = -1;
      for (int z = 0; z < nm && y < 0; z++)
        if (alive[z] && !strcmp(key[z], key[best]) &&
            shares_group(a, a->R[mem[x]].rank, a->R[mem[z]].rank))
          y = z;
      if (y < 0) continue;
      flagged[x] = 1;
      order_culprit(a, mem[x], mem[y], s, p, win, nwin, nth(a, mem[x], first[x], len[x], p),
                    nth(a, mem[x], first[x], len[x], p + 1),
                    nth(a, mem[y], first[y], len[y], p), nth(a, mem[y], first[y], len[y], p + 1));
    }
  }
out:
  free(first);
  free(key);
  free(win);
}

static int cmp_long(const void *x, const void *y) {
  long a = *(const long *)x, b = *(const long *)y;
  return a < b ? -1 : a > b;
}

void ta__check_order(an *a) {
  int n = a->n;
  char (*role)[512] = malloc(sizeof *role * (size_t)n);
  int *mem = malloc(sizeof(int) * (size_t)n), *done = calloc((size_t)n, sizeof(int));
  char *flagged = calloc((size_t)n, 1);
  long *steps = NULL;
  size_t nsteps = 0, cap = 0;
  if (!role || !mem || !done || !flagged || roles(a, role)) goto oom;
  for (int i = 0; i < n; i++) {
    for (int j = 0; j < a->R[i].nops; j++) {
      long s = a->R[i].ops[j].step;
      if (nsteps && steps[nsteps - 1] == s) continue;
      if (nsteps == cap) {
        cap = cap ? 2 * cap : 64;
        long *p = realloc(steps, sizeof(long) * cap);
        if (!p) goto oom;
        steps = p;
      }
      steps[nsteps++] = s;
    }
  }
  if (nsteps) qsort(steps, nsteps, sizeof(long), cmp_long);
  for (int i = 0; i < n; i++) {
    if (done[i]) continue;
    int nm = 0;
    for (int k = i; k < n; k++)
      if (!done[k] && !strcmp(role[k], role[i])) {
        done[k] = 1;
        mem[nm++] = k;
      }
    if (nm < 3) continue;
    char *fl = calloc((size_t)nm, 1);
    if (!fl) goto oom;
    for (size_t s = 0; s < nsteps && !a->oom; s++) {
      if (s && steps[s] == steps[s - 1]) continue;
      vote_step(a, mem, nm, steps[s], fl);
    }
    free(fl);
  }
  goto out;
oom:
  a->oom = 1;
out:
  free(role);
  free(mem);
  free(done);
  free(flagged);
  free(steps);
}

/* ------------------------------------------------------------------ */
/* 3. The wait-for graph at T                                          */
/* ------------------------------------------------------------------ */

/* What rank m owed the waiter (rank index wi, op o), in words. */
static void owed(an *a, int wi, const tr_op *o, int m, sb *b) {
  const ta_group *G = &a->gi[inst_of(a, wi, o)];
  int mi = rank_index(a, m), w = a->R[wi].rank, unk = 0, j = -1;
  char what[TR_NAME * 2];
  if (is_p2p(o)) {
    int send = !strcmp(o->kind, "recv");
    snprintf(what, sizeof what, "%s #%llu %s rank %d on %s[%d]", send ? "send" : "recv",
             (unsigned long long)o->gseq, send ? "to" : "from", w, G->name, G->index);
    if (mi >= 0) j = p2p_at(a, mi, inst_of(a, wi, o), send ? "send" : "recv", w, o->gseq, &unk);
  } else {
    snprintf(what, sizeof what, "%s #%llu on %s[%d]", o->kind, (unsigned long long)o->gseq,
             G->name, G->index);
    if (mi >= 0) j = coll_at(a, mi, inst_of(a, wi, o), o->gseq, &unk);
  }
  const tr_op *p = j >= 0 ? &a->R[mi].ops[j] : NULL;
  if (p && !issued(a, p))
    sb_add(b, "issued %s %.1f s after the others had failed", what, secs(p->issue_ns - a->tf));
  else if (p) {
    char d1[TR_NAME * 3], d2[TR_NAME * 3];
    op_detail(p, d1, sizeof d1);
    op_detail(o, d2, sizeof d2);
    sb_add(b, "issued %s with %s where world rank %d has %s", what, d1, w, d2);
  } else {
    sb_add(b, "never issued %s", what);
  }
  sb_add(b, " (world rank %d waited %.1f s for it)", w, secs(a->tf - o->issue_ns));
}

/* Per group instance, the positions of the members with a dump
 * (dumped[g][0..ndumped[g])), and whether its members without one were
 * listed already (listed[g]). */
typedef struct members {
  int **dumped, *ndumped;
  char *listed;
  int *merge; /* a world's worth of scratch */
} members;

static void members_free(an *a, members *M) {
  if (M->dumped)
    for (int g = 0; g < a->ngi; g++) free(M->dumped[g]);
  free(M->dumped);
  free(M->ndumped);
  free(M->listed);
  free(M->merge);
}

static int members_make(an *a, members *M) {
  size_t ng = (size_t)(a->ngi > 0 ? a->ngi : 1);
  M->dumped = calloc(ng, sizeof(int *));
  M->ndumped = calloc(ng, sizeof(int));
  M->listed = calloc(ng, 1);
  M->merge = malloc(sizeof(int) * (size_t)a->world);
  if (!M->dumped || !M->ndumped || !M->listed || !M->merge) return -1;
  for (int g = 0; g < a->ngi; g++) {
    const ta_group *G = &a->gi[g];
    for (int q = 0; q < G->size; q++) {
      int m = G->ranks[q];
      if (m < 0 || m >= a->world || a->at[m] < 0) continue;
      if (!M->dumped[g] && !(M->dumped[g] = malloc(sizeof(int) * (size_t)G->size))) return -1;
      M->dumped[g][M->ndumped[g]++] = q;
    }
  }
  return 0;
}

/* unmet(a, i, o, w), the same list in the same (position) order, at a
 * cost that grows with the members that left a dump: those are compared
 * one by one, the members without a dump (each of which o waits for) are
 * listed the first time an operation of their group instance is seen only,
 * after which they are in `seen` anyway (a group of 2^20 members of which
 * one left a dump is not 2^20 steps per pending operation). */
static int waits_for(an *a, members *M, int i, const tr_op *o, int *w) {
  if (is_p2p(o)) return unmet(a, i, o, w);
  int g = inst_of(a, i, o);
  int nw = ta__unmet_among(a, i, o, w, M->dumped[g], M->ndumped[g]);
  if (M->listed[g]) return nw;
  M->listed[g] = 1;
  const ta_group *G = &a->gi[g];
  int n = 0, k = 0;
  for (int q = 0; q < G->size; q++) {
    int m = G->ranks[q];
    if (m < 0 || m >= a->world) continue;
    if (a->at[m] < 0) M->merge[n++] = m;
    else if (k < nw && w[k] == m) M->merge[n++] = w[k++];
  }
  memcpy(w, M->merge, sizeof(int) * (size_t)n);
  return n;
}

/* Culprits named for ranks without a dump, one line each; more are summed
 * up in one line (the list "ranks without a dump" names them all). */
#define NODUMP_CULPRITS 32

void ta__check_waits(an *a) {
  int W = a->world;
  int *w = malloc(sizeof(int) * (size_t)W), *queue = malloc(sizeof(int) * (size_t)W);
  int *by_i = malloc(sizeof(int) * (size_t)W * 2), *by_j = by_i ? by_i + W : NULL;
  char *seen = calloc((size_t)W, 1);
  int *roots = malloc(sizeof(int) * (size_t)W), nroots = 0;
  members M = {0};
  if (!w || !queue || !by_i || !seen || !roots || members_make(a, &M)) {
    a->oom = 1;
    goto out;
  }
  int qn = 0;
  for (int i = 0; i < a->n; i++) {
    if (blocked(a, i, w)) a->out->nvictims++;
    for (int j = 0; j < a->R[i].nops; j++) {
      const tr_op *o = &a->R[i].ops[j];
      if (!pending_at(a, o) || a->tf - o->issue_ns < a->long_ns) continue;
      int nw = waits_for(a, &M, i, o, w);
      for (int k = 0; k < nw; k++)
        if (!seen[w[k]]) {
          seen[w[k]] = 1;
          by_i[w[k]] = i;
          by_j[w[k]] = j;
          queue[qn++] = w[k];
        }
    }
  }
  for (int h = 0; h < qn; h++) {
    int m = queue[h], mi = rank_index(a, m);
    if (mi >= 0 && blocked(a, mi, w)) {
      for (int j = 0; j < a->R[mi].nops; j++) {
        const tr_op *o = &a->R[mi].ops[j];
        if (!pending_at(a, o)) continue;
        int nw = waits_for(a, &M, mi, o, w);
        for (int k = 0; k < nw; k++)
          if (!seen[w[k]]) {
            seen[w[k]] = 1;
            by_i[w[k]] = mi;
            by_j[w[k]] = j;
            queue[qn++] = w[k];
          }
      }
      continue;
    }
    roots[nroots++] = m;
  }
  /* The roots: a rank without a dump always; the others when neither the
   * signatures nor the order named anyone (then they explain the hang). */
  int before = a->out->nculprits, nodump = 0, more = 0;
  for (int k = 0; k < nroots && !a->oom; k++) {
    int m = roots[k], mi = rank_index(a, m);
    if (mi >= 0 && before > 0) continue;
    if (mi < 0 && ++nodump > NODUMP_CULPRITS) {
      more++;
      continue;
    }
    const tr_op *o = &a->R[by_i[m]].ops[by_j[m]];
    sb b = {0};
    sb_add(&b, "culprit: world rank %d: ", m);
    if (mi < 0) {
      sb_add(&b, "left no dump (killed, or hung and never wrote one); ");
      owed(a, by_i[m], o, m, &b);
    } else {
      owed(a, by_i[m], o, m, &b);
      last_op(a, mi, &b);
    }
    add_culprit(a, m, &b);
    ta__evidence_wait(a, m, by_i[m], o);
  }
  if (more) {
    int first = -1;
    for (int k = 0, c = 0; k < nroots && first < 0; k++)
      if (rank_index(a, roots[k]) < 0 && ++c > NODUMP_CULPRITS) first = roots[k];
    sb b = {0};
    sb_add(&b, "culprit: world rank %d: and %d more ranks without a dump that blocked ranks "
           "waited for (see the ranks without a dump)", first, more);
    add_culprit(a, first, &b);
  }
out:
  members_free(a, &M);
  free(w);
  free(queue);
  free(by_i);
  free(seen);
  free(roots);
}
