/* The view of the dumps that the SVG writer (trace_draw_svg.c) and the
 * Chrome writer (trace_draw.c) share, made by trace_draw.c: the time
 * origin and end, the group names, the earliest failure and its label, per
 * operation its interval and lane, and the marks (tr_marks) resolved to
 * rows and operations. */
#ifndef TOOLS_TRACE_DRAW_INTERNAL_H
#define TOOLS_TRACE_DRAW_INTERNAL_H

#include <stdint.h>
#include <stdio.h>

#include "trace_draw.h"

#define MAX_LANES 8 /* per rank (SVG) or per rank and group name (Chrome) */

typedef struct op_at {
  int64_t a, s, b; /* issue (or start), start (or issue), end (pending: dump) */
  int lane;        /* SVG: within its rank; Chrome: within its rank and name */
  int name;        /* index into view.names */
} op_at;

/* A culprit's operation drawn on its row where its peers have it
 * (tr_marks): a missing one, or one it issued otherwise. */
typedef struct evid {
  int rank, i;  /* world rank; index into ranks (-1: no dump) */
  int k;        /* its own operation there, marked (-1: none, or missing) */
  int64_t a, b; /* the peers' issue .. end (b: the picture's end when pending) */
  char label[TR_NAME + 112];
  char peers_op[TR_NAME + 64]; /* "all_reduce #8 on tp[1]": the peers' operation */
  const char *text; /* the culprit's line (tooltip) */
} evid;

typedef struct view {
  const tr_rank *ranks;
  int n, world;
  const tr_rank **by_rank; /* world entries, NULL: no dump */
  op_at **at;              /* per ranks[i], nops entries */
  int *lanes;              /* per ranks[i]: SVG lanes used */
  char (*names)[TR_NAME];
  int nnames;
  int64_t t0, t1;
  int fail_i, fail_op; /* ranks[fail_i].ops[fail_op] failed first; -1: none */
  int64_t fail_ns;     /* when (0: no failure) */
  int fail_rank;       /* whose op or dump */
  int fail_dump_i;     /* no failed op: ranks[fail_dump_i] dumped first for a fault */
  char fail_label[TR_NAME + 160]; /* "MPG_ERR_TIMEOUT on world rank 2, all_reduce #3 on tp[1]" */
  const tr_marks *marks;
  unsigned char *row_mark; /* per world rank: ROW_* (NULL: no marks) */
  evid *ev;
  int nev;
  int *extra;              /* per ranks[i]: 1 when an evidence lane is added */
} view;

enum { ROW_PLAIN = 0, ROW_CULPRIT = 1, ROW_SLOW = 2 };

/* A run of more than RUN_ROWS consecutive ranks without a dump is drawn as
 * one row ("ranks A to B"), so that the drawing grows with the dumps, not
 * with WORLD (issue 45, item 14). */
#define RUN_ROWS 16

/* A writer's body: the picture of v (ranks[0..n)) into f; 0, or -1 with
 * err (f and v are closed and freed by write_out). */
typedef int (*draw_body)(FILE *f, view *v, const tr_rank *ranks, int n, char *err,
                         size_t errlen);

/* The view of the dumps, path opened, body run, everything released. */
int td__write_out(const tr_rank *ranks, int n, int world, const tr_marks *marks,
                  const char *path, char *err, size_t errlen, draw_body body);
/* The last rank of the run of ranks without a dump that starts at w (w
 * itself when w has a dump or the run is short). */
int td__run_end(const view *v, int w);
/* Greedy interval packing: the first lane free at a, else the one that
 * frees first. */
int td__pick_lane(int64_t *ends, int *nl, int64_t a, int64_t b);
/* The operation failed (not ok, not pending). */
int td__failed(const tr_op *o);
/* s escaped for XML text and attributes; as a JSON string, quotes
 * included (bytes that are not UTF-8: U+FFFD). */
void td__put_xml(FILE *f, const char *s);
void td__put_json(FILE *f, const char *s);
/* "all_reduce #3 on dp[1]" */
void td__op_label(const tr_rank *r, const tr_op *o, char *buf, size_t cap);

static inline double td__ms_of(const view *v, int64_t t) { return (double)(t - v->t0) / 1e6; }

#endif
