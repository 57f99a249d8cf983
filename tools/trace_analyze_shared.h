/* What the analyzer's four files share: the merged view of the dumps and
 * the helpers between them.  trace_analyze.c (set-up, signatures) calls
 * down into trace_analyze_order.c (order within a step, the wait-for
 * graph), trace_analyze_seq.c (sequence evidence) and
 * trace_analyze_util.c (lookups, states, the report's lists); none calls
 * back up.  The header belongs to none of them, so it is named for none
 * (tests/layout/check_layout.py, rule 2b: a header named X_internal.h
 * would belong to X.c).  Internal to the analyzer. */
#ifndef TOOLS_TRACE_ANALYZE_SHARED_H
#define TOOLS_TRACE_ANALYZE_SHARED_H

#include <stdint.h>
#include <string.h>

#include "internal.h" /* mpg__strbuf: the texts of the report */
#include "trace_analyze_report.h"

/* One rank's operations on one group instance (indices into its ops, in
 * ring order). */
typedef struct cell {
  int *coll, ncoll;
  int *p2p, np2p;
  int *p2ps; /* p2p[] sorted by (kind, peer, gseq, index): ta__p2p_at's search */
} cell;

typedef struct an {
  const tr_rank *R;
  int n, world;
  int *at;           /* world rank -> index into R, -1: no dump */
  ta_group *gi;
  int ngi;
  int **gmap;        /* gmap[i][gid]: the instance of rank i's group gid */
  cell *cells;       /* unused (NULL): see icells, cellof */
  int64_t tf, long_ns; /* the fault time; the least age of a wait followed */
  int oom;
  ta_report *out;
  /* What makes the analysis linear in ranks x entries (issue 46, item 6):
   * per rank i, the instances it has ops or groups on (ascending, each
   * once: inst[i][0..ninst[i])) and their cells (icells[i][k]); */
  int **inst, *ninst;
  cell **icells;
  cell nocell;        /* an empty cell: a rank on an instance it is not on */
  int *last;          /* per rank: its last op issued by T, -1 */
  signed char *blk;   /* per rank: blocked_at(i, NULL, 0) memoized, -1 unknown */
  unsigned char *culprit_at; /* per world rank: named a culprit already */
  int mismatch_cap;   /* out->mismatches' capacity */
  int **dumped, *ndumped; /* per instance: the positions of its members with a dump */
  int *dimset;        /* per instance: its dim set's number (one per distinct name) */
  int **bypos;        /* per instance: (rank, position) pairs sorted by rank
                         (NULL until ta__pos_in needs them) */
  /* per instance and depth ([2 * g + deep]): the members that miss the
   * last collective asked about there (up to 2), for ta__blocked */
  struct ta_ucache {
    const tr_op *op;
    int nmiss, miss[2];
  } *ucache;
} an;

static inline int is_p2p(const tr_op *o) {
  return !strcmp(o->kind, "send") || !strcmp(o->kind, "recv");
}
/* The ring lost operations (overwritten or torn): the oldest are unknown. */
static inline int lost(const an *a, int i) { return a->R[i].total > (uint64_t)a->R[i].nops; }
static inline int issued(const an *a, const tr_op *o) { return o->issue_ns <= a->tf; }
static inline int pending_at(const an *a, const tr_op *o) {
  return issued(a, o) && (o->end_ns == 0 || o->end_ns >= a->tf);
}
/* Rank i's cell on instance g (an empty one when it has nothing there). */
static inline cell *cellof(an *a, int i, int g) {
  const int *v = a->inst[i];
  int lo = 0, hi = a->ninst[i] - 1;
  while (lo <= hi) {
    int mid = (lo + hi) / 2;
    if (v[mid] == g) return &a->icells[i][mid];
    if (v[mid] < g) lo = mid + 1;
    else hi = mid - 1;
  }
  a->nocell = (cell){0};
  return &a->nocell;
}
static inline int inst_of(const an *a, int i, const tr_op *o) { return a->gmap[i][o->group]; }
static inline double secs(int64_t ns) { return (double)ns * 1e-9; }
static inline int rank_index(const an *a, int w) { return w >= 0 && w < a->world ? a->at[w] : -1; }

/* Two issues of one collective: kind, dtype, count (not all_to_all_v's),
 * root and bucket. */
static inline int same_sig(const tr_op *x, const tr_op *y) {
  if (strcmp(x->kind, y->kind) || strcmp(x->dtype, y->dtype) || x->bucket != y->bucket) return 0;
  if (strcmp(x->kind, "all_to_all_v") && x->count != y->count) return 0;
  if (!strcmp(x->kind, "broadcast") && x->peer != y->peer) return 0;
  return 1;
}

/* trace_analyze_util.c */
int ta__coll_at(an *a, int i, int g, uint64_t k, int *unknown);
int ta__p2p_at(an *a, int i, int g, const char *kind, int peer, uint64_t k, int *unknown);
void ta__op_name(const an *a, int i, const tr_op *o, char *buf, size_t cap);
void ta__op_detail(const tr_op *o, char *buf, size_t cap);
void ta__op_state(const tr_op *o, int64_t t, char *buf, size_t cap);
/* Rank i's sends (send 1) or receives (0) with world rank peer on
 * instance g: cellof(a, i, g)->p2ps[start..*end), by number; returns start. */
int ta__p2p_run(an *a, int i, int g, int send, int peer, int *end);
/* The position of world rank w in instance g, or -1 (binary search). */
int ta__pos_in(an *a, int g, int w);
int ta__unmet(an *a, int i, const tr_op *o, int *w);
/* unmet for a collective, over the members at positions pos[0..npos) of
 * its group only (ascending: w then lists them in position order). */
int ta__unmet_among(an *a, int i, const tr_op *o, int *w, const int *pos, int npos);
int ta__blocked(an *a, int i, int *w);
void ta__last_op(an *a, int i, mpg__strbuf *b);
void ta__add_culprit(an *a, int rank, mpg__strbuf *b);
int ta__is_failure(const char *status);
int ta__push(int **v, int *n, int x);
void ta__add_item(an *a, ta_item **v, int *n, int rank, mpg__strbuf *b);

/* trace_analyze_seq.c: sequence evidence (issue 46, items 1-2): the
 * member of a group instance whose list of operations lacks one that its
 * peers hold, whatever the signatures. */
void ta__check_seq(an *a);
/* A culprit's evidence (ta_item: how, group, number, the peers' times),
 * set on world rank `rank`'s culprit item when no rule set it before:
 * op #k of `kind` on instance g (peer: for a send or receive, the other
 * side's world rank; -1 for a collective).  _order: the op like `ref`
 * (of rank index ri) that rank index xi would have issued before its op
 * `at`; _wait: the op that rank index wi waited for in o, owed by world
 * rank m (a root of the wait-for graph). */
void ta__evidence(an *a, int rank, ta_how how, int g, uint64_t k, const char *kind, int peer);
void ta__evidence_order(an *a, int xi, const tr_op *ref, int ri, const tr_op *at, ta_how how);
void ta__evidence_wait(an *a, int m, int wi, const tr_op *o);

/* trace_analyze_order.c */
void ta__check_order(an *a);
void ta__check_waits(an *a);

#endif
