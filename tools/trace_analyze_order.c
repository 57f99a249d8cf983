/* The analyzer's verdicts from the order of operations within a step and
 * from the wait-for graph at the fault time (trace_analyze.h; the rules
 * at the top of trace_analyze.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trace_analyze_shared.h"

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

/* The order check's indexes: per rank its ops issued by T sorted by
 * (step, index) (a step's ops are a run: found by binary search, not by a
 * scan of the ring per step); per world rank the instances whose member
 * lists hold it (rinst[rstart[w]..rstart[w + 1])); per rank index its place
 * in the role being checked (mpos) and in the step being voted (spos). */
typedef struct ord {
  int **sidx, *nsidx;
  int *rstart, *rinst;
  int *mpos, *spos;
} ord;

static const tr_op *sort_ops; /* cmp_step's rank's ops */

static int cmp_step(const void *x, const void *y) {
  int i = *(const int *)x, j = *(const int *)y;
  long s = sort_ops[i].step, t = sort_ops[j].step;
  if (s != t) return s < t ? -1 : 1;
  return (i > j) - (i < j);
}

static void ord_free(an *a, ord *O) {
  for (int i = 0; O->sidx && i < a->n; i++) free(O->sidx[i]);
  free(O->sidx);
  free(O->nsidx);
  free(O->rstart);
  free(O->rinst);
  free(O->mpos);
  free(O->spos);
}

static int ord_make(an *a, ord *O) {
  int n = a->n;
  O->sidx = calloc((size_t)n, sizeof(int *));
  O->nsidx = calloc((size_t)n, sizeof(int));
  O->mpos = malloc(sizeof(int) * (size_t)n);
  O->spos = malloc(sizeof(int) * (size_t)n);
  if (!O->sidx || !O->nsidx || !O->mpos || !O->spos) return -1;
  for (int i = 0; i < n; i++) {
    const tr_rank *r = &a->R[i];
    O->mpos[i] = O->spos[i] = -1;
    if (!(O->sidx[i] = malloc(sizeof(int) * (size_t)(r->nops > 0 ? r->nops : 1)))) return -1;
    for (int j = 0; j < r->nops; j++)
      if (issued(a, &r->ops[j])) O->sidx[i][O->nsidx[i]++] = j;
    sort_ops = r->ops;
    qsort(O->sidx[i], (size_t)O->nsidx[i], sizeof(int), cmp_step);
  }
  return 0;
}

/* O->rstart, O->rinst, built when a vote first has a dissenter. */
static int ord_rinst(an *a, ord *O) {
  int W = a->world;
  if (!(O->rstart = calloc((size_t)W + 1, sizeof(int)))) return -1;
  size_t tot = 0;
  for (int g = 0; g < a->ngi; g++)
    for (int q = 0; q < a->gi[g].size; q++) {
      int m = a->gi[g].ranks[q];
      if (m >= 0 && m < W) O->rstart[m + 1]++, tot++;
    }
  for (int w = 0; w < W; w++) O->rstart[w + 1] += O->rstart[w];
  int *fill = malloc(sizeof(int) * (size_t)(W > 0 ? W : 1));
  O->rinst = malloc(sizeof(int) * (tot > 0 ? tot : 1));
  if (!fill || !O->rinst) {
    free(fill);
    return -1;
  }
  memcpy(fill, O->rstart, sizeof(int) * (size_t)W);
  for (int g = 0; g < a->ngi; g++)
    for (int q = 0; q < a->gi[g].size; q++) {
      int m = a->gi[g].ranks[q];
      if (m >= 0 && m < W) O->rinst[fill[m]++] = g;
    }
  free(fill);
  return 0;
}

/* Every rank's role (role[i], rank index i): its positions in the groups
 * whose dim sets carry point-to-point traffic in any dump ("pp=0;"), as
 * any dump shows them, so that a rank blocked before its first send still
 * has the role of its stage; ranks of one role run one program.  The dim
 * sets in the order of their first instance, the instances of each in
 * order.  0, or -1 when out of memory. */
static int cmp_dimset_g(const void *x, const void *y);
static const an *sort_an;

static int roles(an *a, char (*role)[512]) {
  char *mark = calloc((size_t)a->ngi + 1, 1);
  int *gs = malloc(sizeof(int) * ((size_t)a->ngi + 1)), ng = 0;
  if (!mark || !gs) {
    free(mark);
    free(gs);
    return -1;
  }
  for (int i = 0; i < a->n; i++) {
    role[i][0] = '\0';
    for (int j = 0; j < a->R[i].nops; j++)
      if (is_p2p(&a->R[i].ops[j])) mark[a->dimset[inst_of(a, i, &a->R[i].ops[j])]] = 1;
  }
  /* A dim set's number is its first instance's: (dim set, instance)
   * order is the order of the names' first instances. */
  for (int g = 0; g < a->ngi; g++)
    if (mark[a->dimset[g]]) gs[ng++] = g;
  sort_an = a;
  qsort(gs, (size_t)ng, sizeof(int), cmp_dimset_g);
  for (int k = 0; k < ng; k++) {
    const ta_group *G = &a->gi[gs[k]];
    for (int q = 0; q < G->size; q++) {
      int i = rank_index(a, G->ranks[q]);
      if (i < 0) continue;
      size_t n = strlen(role[i]);
      snprintf(role[i] + n, sizeof role[i] - n, "%s=%d;", G->name, q);
    }
  }
  free(mark);
  free(gs);
  return 0;
}

static int cmp_dimset_g(const void *x, const void *y) {
  int g = *(const int *)x, h = *(const int *)y;
  int dg = sort_an->dimset[g], dh = sort_an->dimset[h];
  if (dg != dh) return dg < dh ? -1 : 1;
  return (g > h) - (g < h);
}

/* The ops of rank i in step s issued by T (a step the ring holds whole):
 * *first (its place in O->sidx[i]) and the count. */
static int step_ops(an *a, ord *O, int i, long s, int *first) {
  const tr_rank *r = &a->R[i];
  const int *v = O->sidx[i];
  int lo = 0, hi = O->nsidx[i];
  while (lo < hi) {
    int mid = (lo + hi) / 2;
    if (r->ops[v[mid]].step < s) lo = mid + 1;
    else hi = mid;
  }
  int e = lo;
  while (e < O->nsidx[i] && r->ops[v[e]].step == s) e++;
  *first = e > lo ? lo : -1;
  if (e > lo && lost(a, i) && s == r->ops[0].step) return 0; /* partly overwritten */
  return e - lo;
}

/* Op p (0-based) of rank i's step from first, or NULL. */
static const tr_op *nth(an *a, ord *O, int i, int first, int len, int p) {
  if (p >= len || first < 0) return NULL;
  return &a->R[i].ops[O->sidx[i][first + p]];
}

/* An op as its program issues it, for the vote (prog_key's fields, the
 * dim set for its name): equal keys are equal bytes. */
typedef struct okey {
  int dimset, bucket, pos, pad;
  uint64_t count;
  char kind[16], dtype[8];
} okey;

static void fast_key(an *a, int i, const tr_op *o, okey *k) {
  memset(k, 0, sizeof *k);
  int g = inst_of(a, i, o);
  k->dimset = a->dimset[g];
  k->bucket = o->bucket;
  k->pos = o->peer >= 0 ? ta__pos_in(a, g, o->peer) : -1;
  k->count = strcmp(o->kind, "all_to_all_v") ? o->count : 0;
  memcpy(k->kind, o->kind, strnlen(o->kind, sizeof k->kind - 1));
  memcpy(k->dtype, o->dtype, strnlen(o->dtype, sizeof k->dtype - 1));
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
  ta__op_name(a, xi, x0, n0, sizeof n0);
  mpg__strbuf b = MPG__STRBUF_INIT;
  mpg__strbuf_add(&b, "culprit: world rank %d: ", a->R[xi].rank);
  if (x1 && y1 && !strcmp(kx0, ky1) && !strcmp(kx1, ky0)) {
    ta__op_name(a, xi, x1, n1, sizeof n1);
    mpg__strbuf_add(&b, "swapped two operations of step %ld: issued %s before %s", s, n0, n1);
  } else if (y1 && !strcmp(kx0, ky1)) {
    expected(a, xi, yi, y0, x0, n1, sizeof n1);
    mpg__strbuf_add(&b, "skipped %s in step %ld: issued %s next", n1, s, n0);
  } else {
    expected(a, xi, yi, y0, x0, n1, sizeof n1);
    mpg__strbuf_add(&b,
                    "issued %s as operation %d of step %ld where the ranks of its program issued "
                    "%s",
                    n0, p + 1, s, n1);
  }
  mpg__strbuf_add(&b, " (as world rank%s", nwin == 1 ? "" : "s");
  for (int k = 0; k < nwin && k < 6; k++) mpg__strbuf_add(&b, "%s %d", k ? "," : "", win[k]);
  mpg__strbuf_add(&b, "%s did otherwise)", nwin > 6 ? ", ..." : "");
  ta__add_culprit(a, a->R[xi].rank, &b);
  ta__evidence_order(a, xi, y0, yi, x0,
                     x1 && y1 && !strcmp(kx0, ky1) && !strcmp(kx1, ky0) ? TA_SWAPPED
                     : y1 && !strcmp(kx0, ky1)                          ? TA_SKIPPED
                                                                        : TA_DIFFERS);
}

static const okey *sort_keys; /* cmp_key's keys */

static int cmp_key(const void *x, const void *y) {
  int i = *(const int *)x, j = *(const int *)y;
  int c = memcmp(&sort_keys[i], &sort_keys[j], sizeof(okey));
  return c ? c : (i > j) - (i < j);
}

/* One role's step s: vote position by position.  sub[0..ns): the places
 * in mem (ascending) of the members with ops in step s; flagged: by place
 * in mem.  The majority by sorting the keys (not every pair of members). */
static void vote_step(an *a, ord *O, const int *mem, const int *sub, int ns, long s,
                      char *flagged) {
  int *first = malloc(sizeof(int) * (size_t)ns * 4), *len = first + ns, *alive = len + ns;
  int *srt = alive + ns;
  okey *key = malloc(sizeof *key * (size_t)ns);
  int *win = malloc(sizeof(int) * (size_t)ns);
  if (!first || !key || !win) {
    a->oom = 1;
    goto out;
  }
  for (int x = 0; x < ns; x++) {
    int i = mem[sub[x]];
    len[x] = flagged[sub[x]] ? 0 : step_ops(a, O, i, s, &first[x]);
    alive[x] = len[x] > 0;
    O->spos[i] = x;
  }
  for (int p = 0;; p++) {
    int voters = 0;
    for (int x = 0; x < ns; x++) {
      if (!alive[x] || len[x] <= p) {
        alive[x] = 0;
        continue;
      }
      fast_key(a, mem[sub[x]], nth(a, O, mem[sub[x]], first[x], len[x], p), &key[x]);
      srt[voters++] = x;
    }
    if (voters < 3) break;
    sort_keys = key;
    qsort(srt, (size_t)voters, sizeof(int), cmp_key);
    int best = -1, bestn = 0;
    for (int u = 0; u < voters;) {
      int v = u + 1;
      while (v < voters && !memcmp(&key[srt[v]], &key[srt[u]], sizeof(okey))) v++;
      if (v - u > bestn) bestn = v - u, best = srt[u];
      u = v;
    }
    /* a strict majority is unique: which of equal counts is best does not
     * matter past this test */
    if (bestn * 2 <= voters || bestn < 2) break;
    const okey *bk = &key[best];
    int nwin = 0;
    for (int y = 0; y < ns; y++)
      if (alive[y] && !memcmp(&key[y], bk, sizeof(okey))) win[nwin++] = a->R[mem[sub[y]]].rank;
    for (int x = 0; x < ns; x++) {
      if (!alive[x] || !memcmp(&key[x], bk, sizeof(okey))) continue;
      alive[x] = 0;
      if (!O->rinst && ord_rinst(a, O)) {
        a->oom = 1;
        goto out;
      }
      /* The first member (in mem's order) of one of its groups that
       * follows the majority: over the members of its groups. */
      int w = a->R[mem[sub[x]]].rank, y = -1;
      for (int h = O->rstart[w]; h < O->rstart[w + 1]; h++) {
        int g = O->rinst[h];
        for (int d = 0; d < a->ndumped[g]; d++) {
          int zi = a->at[a->gi[g].ranks[a->dumped[g][d]]], z = O->spos[zi];
          if (z < 0 || O->mpos[zi] < 0 || mem[sub[z]] != zi || z == x) continue;
          if (alive[z] && !memcmp(&key[z], bk, sizeof(okey)) && (y < 0 || z < y)) y = z;
        }
      }
      if (y < 0) continue;
      flagged[sub[x]] = 1;
      int ix = mem[sub[x]], iy = mem[sub[y]];
      order_culprit(a, ix, iy, s, p, win, nwin, nth(a, O, ix, first[x], len[x], p),
                    nth(a, O, ix, first[x], len[x], p + 1), nth(a, O, iy, first[y], len[y], p),
                    nth(a, O, iy, first[y], len[y], p + 1));
    }
  }
out:
  for (int x = 0; x < ns; x++) O->spos[mem[sub[x]]] = -1;
  free(first);
  free(key);
  free(win);
}

static char (*sort_role)[512]; /* cmp_role's roles */

static int cmp_role(const void *x, const void *y) {
  int i = *(const int *)x, j = *(const int *)y;
  int c = strcmp(sort_role[i], sort_role[j]);
  return c ? c : (i > j) - (i < j);
}

static int cmp_pair2(const void *x, const void *y) {
  const long *u = x, *v = y;
  if (u[0] != v[0]) return u[0] < v[0] ? -1 : 1;
  return (u[1] > v[1]) - (u[1] < v[1]);
}

/* One role (mem[0..nm), ascending rank indices): its steps in order, each
 * voted among the members that have ops in it. */
static void check_role(an *a, ord *O, const int *mem, int nm) {
  char *fl = calloc((size_t)nm, 1);
  long *sp = NULL; /* (step, place) pairs */
  int *sub = malloc(sizeof(int) * (size_t)nm);
  size_t np = 0, cap = 0;
  if (!fl || !sub) goto oom;
  for (int x = 0; x < nm; x++) {
    int i = mem[x];
    const tr_op *ops = a->R[i].ops;
    O->mpos[i] = x;
    for (int u = 0; u < O->nsidx[i]; u++) {
      long st = ops[O->sidx[i][u]].step;
      if (u && ops[O->sidx[i][u - 1]].step == st) continue;
      if (np == cap) {
        cap = cap ? 2 * cap : 256;
        long *t = realloc(sp, sizeof(long) * 2 * cap);
        if (!t) goto oom;
        sp = t;
      }
      sp[2 * np] = st;
      sp[2 * np + 1] = x;
      np++;
    }
  }
  if (np) qsort(sp, np, 2 * sizeof(long), cmp_pair2);
  for (size_t u = 0; u < np && !a->oom;) {
    size_t v = u;
    int ns = 0;
    while (v < np && sp[2 * v] == sp[2 * u]) sub[ns++] = (int)sp[2 * v++ + 1];
    if (ns >= 3) vote_step(a, O, mem, sub, ns, sp[2 * u], fl);
    u = v;
  }
  goto out;
oom:
  a->oom = 1;
out:
  for (int x = 0; x < nm; x++) O->mpos[mem[x]] = -1;
  free(fl);
  free(sp);
  free(sub);
}

void ta__check_order(an *a) {
  int n = a->n;
  char (*role)[512] = malloc(sizeof *role * (size_t)n);
  int *ordr = malloc(sizeof(int) * (size_t)n), *grp = malloc(sizeof(int) * (size_t)n);
  int *mem = malloc(sizeof(int) * (size_t)n);
  ord O = {0};
  if (!role || !ordr || !grp || !mem || ord_make(a, &O) || roles(a, role)) goto oom;
  /* The ranks of one role: sorted by (role, index); the roles in the
   * order of their first rank. */
  for (int i = 0; i < n; i++) ordr[i] = i;
  sort_role = role;
  qsort(ordr, (size_t)n, sizeof(int), cmp_role);
  for (int u = 0; u < n;) {
    int v = u;
    while (v < n && !strcmp(role[ordr[v]], role[ordr[u]])) grp[ordr[v++]] = u;
    u = v;
  }
  for (int i = 0; i < n && !a->oom; i++) {
    int u = grp[i];
    if (ordr[u] != i) continue; /* not the role's first rank */
    int nm = 0;
    while (u + nm < n && grp[ordr[u + nm]] == u) {
      mem[nm] = ordr[u + nm];
      nm++;
    }
    if (nm >= 3) check_role(a, &O, mem, nm);
  }
  goto out;
oom:
  a->oom = 1;
out:
  ord_free(a, &O);
  free(role);
  free(ordr);
  free(grp);
  free(mem);
}

/* ------------------------------------------------------------------ */
/* 3. The wait-for graph at T                                          */
/* ------------------------------------------------------------------ */

/* What rank m owed the waiter (rank index wi, op o), in words. */
static void owed(an *a, int wi, const tr_op *o, int m, mpg__strbuf *b) {
  const ta_group *G = &a->gi[inst_of(a, wi, o)];
  int mi = rank_index(a, m), w = a->R[wi].rank, unk = 0, j = -1;
  char what[TR_NAME * 2];
  if (is_p2p(o)) {
    int send = !strcmp(o->kind, "recv");
    snprintf(what, sizeof what, "%s #%llu %s rank %d on %s[%d]", send ? "send" : "recv",
             (unsigned long long)o->gseq, send ? "to" : "from", w, G->name, G->index);
    if (mi >= 0) j = ta__p2p_at(a, mi, inst_of(a, wi, o), send ? "send" : "recv", w, o->gseq, &unk);
  } else {
    snprintf(what, sizeof what, "%s #%llu on %s[%d]", o->kind, (unsigned long long)o->gseq,
             G->name, G->index);
    if (mi >= 0) j = ta__coll_at(a, mi, inst_of(a, wi, o), o->gseq, &unk);
  }
  const tr_op *p = j >= 0 ? &a->R[mi].ops[j] : NULL;
  if (p && !issued(a, p))
    mpg__strbuf_add(b, "issued %s %.1f s after the others had failed", what,
                    secs(p->issue_ns - a->tf));
  else if (p) {
    char d1[TR_NAME * 3], d2[TR_NAME * 3];
    ta__op_detail(p, d1, sizeof d1);
    ta__op_detail(o, d2, sizeof d2);
    mpg__strbuf_add(b, "issued %s with %s where world rank %d has %s", what, d1, w, d2);
  } else {
    mpg__strbuf_add(b, "never issued %s", what);
  }
  mpg__strbuf_add(b, " (world rank %d waited %.1f s for it)", w, secs(a->tf - o->issue_ns));
}

/* Per group instance, whether its members without a dump were listed
 * already (listed[g]); the members with one are a->dumped[g].  cache[g]:
 * the last collective waits_for listed on g (its number, op and rank). */
typedef struct wcache {
  const tr_op *op;
  int rank;
} wcache;

typedef struct members {
  char *listed;
  int *merge; /* a world's worth of scratch */
  wcache *cache;
} members;

static void members_free(members *M) {
  free(M->listed);
  free(M->merge);
  free(M->cache);
}

static int members_make(an *a, members *M) {
  size_t ng = (size_t)(a->ngi > 0 ? a->ngi : 1);
  M->listed = calloc(ng, 1);
  M->merge = malloc(sizeof(int) * (size_t)a->world);
  M->cache = calloc(ng, sizeof(wcache));
  return M->listed && M->merge && M->cache ? 0 : -1;
}

/* ta__unmet(a, i, o, w), the same list in the same (position) order, at a
 * cost that grows with the members that left a dump: those are compared
 * one by one, the members without a dump (each of which o waits for) are
 * listed the first time an operation of their group instance is seen only,
 * after which they are in `seen` anyway (a group of 2^20 members of which
 * one left a dump is not 2^20 steps per pending operation).
 *
 * And not once per waiter: when rank A's collective o_A (number k on g)
 * was listed last on g and every rank listed then is in `seen`, a waiter B
 * with the same number and signature waits for the same members (whether
 * a member issued it, with which signature, stuck or not, does not depend
 * on the waiter) plus maybe A itself: only A is checked.  So 4,096 ranks
 * blocked in one all-reduce are 2 x 4,096 member checks, not 4,096^2. */
static int waits_for(an *a, members *M, const char *seen, int i, const tr_op *o, int *w) {
  if (is_p2p(o)) return ta__unmet(a, i, o, w);
  int g = inst_of(a, i, o);
  wcache *c = &M->cache[g];
  if (c->op && c->op->gseq == o->gseq && same_sig(c->op, o)) {
    int pa = c->rank == a->R[i].rank ? -1 : ta__pos_in(a, g, c->rank);
    return pa < 0 || seen[c->rank] ? 0 : ta__unmet_among(a, i, o, w, &pa, 1);
  }
  c->op = o;
  c->rank = a->R[i].rank;
  int nw = ta__unmet_among(a, i, o, w, a->dumped[g], a->ndumped[g]);
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
    if (ta__blocked(a, i, NULL)) a->out->nvictims++;
    for (int j = 0; j < a->R[i].nops; j++) {
      const tr_op *o = &a->R[i].ops[j];
      if (!pending_at(a, o) || a->tf - o->issue_ns < a->long_ns) continue;
      int nw = waits_for(a, &M, seen, i, o, w);
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
    if (mi >= 0 && ta__blocked(a, mi, NULL)) {
      for (int j = 0; j < a->R[mi].nops; j++) {
        const tr_op *o = &a->R[mi].ops[j];
        if (!pending_at(a, o)) continue;
        int nw = waits_for(a, &M, seen, mi, o, w);
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
    mpg__strbuf b = MPG__STRBUF_INIT;
    mpg__strbuf_add(&b, "culprit: world rank %d: ", m);
    if (mi < 0) {
      mpg__strbuf_add(&b, "left no dump (killed, or hung and never wrote one); ");
      owed(a, by_i[m], o, m, &b);
    } else {
      owed(a, by_i[m], o, m, &b);
      ta__last_op(a, mi, &b);
    }
    ta__add_culprit(a, m, &b);
    ta__evidence_wait(a, m, by_i[m], o);
  }
  if (more) {
    int first = -1;
    for (int k = 0, c = 0; k < nroots && first < 0; k++)
      if (rank_index(a, roots[k]) < 0 && ++c > NODUMP_CULPRITS) first = roots[k];
    mpg__strbuf b = MPG__STRBUF_INIT;
    mpg__strbuf_add(&b,
                    "culprit: world rank %d: and %d more ranks without a dump that blocked ranks "
                    "waited for (see the ranks without a dump)",
                    first, more);
    ta__add_culprit(a, first, &b);
  }
out:
  members_free(&M);
  free(w);
  free(queue);
  free(by_i);
  free(seen);
  free(roots);
}
