/* Drawing the flight recorder's dumps (tools/trace_draw.h): an SVG
 * timeline and a Chrome trace event file.  Both share one pass over the
 * dumps (struct view): the time origin and end, the group names (one
 * colour, or one Chrome thread family, each), the earliest failure, and
 * per operation its interval and lane (overlapping operations of one rank
 * go to separate lanes, so that nothing hides and Chrome's slices nest).
 * Decoded names may hold any byte: the writers escape them for XML and
 * JSON and replace bytes that are not UTF-8 with U+FFFD. */
#define _POSIX_C_SOURCE 200809L
#include "trace_draw.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_LANES 8 /* per rank (SVG) or per rank and group name (Chrome) */

typedef struct op_at {
  int64_t a, s, b; /* issue (or start), start (or issue), end (pending: dump) */
  int lane;        /* SVG: within its rank; Chrome: within its rank and name */
  int name;        /* index into view.names */
} op_at;

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
} view;

static void view_free(view *v) {
  if (v->at)
    for (int i = 0; i < v->n; i++) free(v->at[i]);
  free(v->at);
  free(v->by_rank);
  free(v->lanes);
  free(v->names);
}

static int name_index(view *v, const char *name) {
  for (int k = 0; k < v->nnames; k++)
    if (!strcmp(v->names[k], name)) return k;
  return -1;
}

static int cmp_name(const void *a, const void *b) { return strcmp(a, b); }

/* Greedy interval packing: the first lane free at a, else the one that
 * frees first. */
static int pick_lane(int64_t *ends, int *nl, int64_t a, int64_t b) {
  int best = 0;
  for (int l = 0; l < *nl; l++) {
    if (ends[l] <= a) {
      ends[l] = b;
      return l;
    }
    if (ends[l] < ends[best]) best = l;
  }
  if (*nl < MAX_LANES) best = (*nl)++;
  ends[best] = b > ends[best] ? b : ends[best];
  return best;
}

static int failed(const tr_op *o) {
  return strcmp(o->status, "ok") != 0 && strcmp(o->status, "pending") != 0;
}

static int view_make(view *v, const tr_rank *ranks, int n, int world, char *err, size_t errlen) {
  memset(v, 0, sizeof *v);
  v->ranks = ranks;
  v->n = n;
  v->fail_i = v->fail_op = -1;
  if (n < 0 || (n > 0 && !ranks)) {
    snprintf(err, errlen, "no dumps to draw");
    return -1;
  }
  int largest = world < 1;
  for (int i = 0; i < n; i++) {
    if (largest && world < ranks[i].world) world = ranks[i].world;
    if (world <= ranks[i].rank) world = ranks[i].rank + 1;
  }
  if (world < 1) world = 1;
  v->world = world;
  v->by_rank = calloc((size_t)world, sizeof *v->by_rank);
  v->at = calloc((size_t)n + 1, sizeof *v->at);
  v->lanes = calloc((size_t)n + 1, sizeof *v->lanes);
  size_t maxnames = 0;
  for (int i = 0; i < n; i++) maxnames += (size_t)ranks[i].ngroups;
  v->names = calloc(maxnames + 1, sizeof *v->names);
  if (!v->by_rank || !v->at || !v->lanes || !v->names) goto nomem;
  for (int i = 0; i < n; i++) {
    const tr_rank *r = &ranks[i];
    if (v->by_rank[r->rank]) {
      snprintf(err, errlen, "two dumps of rank %d", r->rank);
      return -1;
    }
    v->by_rank[r->rank] = r;
    for (int g = 0; g < r->ngroups; g++)
      if (name_index(v, r->groups[g].name) < 0) strcpy(v->names[v->nnames++], r->groups[g].name);
  }
  qsort(v->names, (size_t)v->nnames, sizeof *v->names, cmp_name);
  int64_t t0 = INT64_MAX, t1 = INT64_MIN;
  for (int i = 0; i < n; i++) {
    const tr_rank *r = &ranks[i];
    v->at[i] = calloc((size_t)r->nops + 1, sizeof(op_at));
    if (!v->at[i]) goto nomem;
    int64_t ends[MAX_LANES] = {0};
    int nl = 0;
    for (int k = 0; k < r->nops; k++) {
      const tr_op *o = &r->ops[k];
      op_at *p = &v->at[i][k];
      p->a = o->issue_ns ? o->issue_ns : o->start_ns;
      p->s = o->start_ns ? o->start_ns : p->a;
      p->b = o->end_ns ? o->end_ns : r->dump_ns;
      if (p->s < p->a) p->s = p->a;
      if (p->b < p->s) p->b = p->s;
      p->name = name_index(v, r->groups[o->group].name);
      p->lane = pick_lane(ends, &nl, p->a, p->b);
      if (p->a && p->a < t0) t0 = p->a;
      if (p->b > t1) t1 = p->b;
      if (failed(o) && o->end_ns && (!v->fail_ns || o->end_ns < v->fail_ns)) {
        v->fail_ns = o->end_ns;
        v->fail_i = i;
        v->fail_op = k;
        v->fail_rank = r->rank;
      }
    }
    v->lanes[i] = nl ? nl : 1;
  }
  /* No failed op: a dump written for an error still marks the hang. */
  for (int i = 0; i < n && v->fail_i < 0; i++)
    if (strcmp(ranks[i].reason, "request") && ranks[i].dump_ns &&
        (!v->fail_ns || ranks[i].dump_ns < v->fail_ns)) {
      v->fail_ns = ranks[i].dump_ns;
      v->fail_rank = ranks[i].rank;
    }
  if (v->fail_ns && v->fail_ns > t1) t1 = v->fail_ns;
  if (v->fail_ns && v->fail_ns < t0) t0 = v->fail_ns;
  if (t0 == INT64_MAX) {
    t0 = 0;
    for (int i = 0; i < n; i++)
      if (ranks[i].dump_ns && (!t0 || ranks[i].dump_ns < t0)) t0 = ranks[i].dump_ns;
    t1 = t0;
  }
  if (t1 <= t0) { /* one instant: a millisecond's picture */
    if (t0 > INT64_MAX - 1000000) t0 = t1 - 1000000;
    else t1 = t0 + 1000000;
  }
  v->t0 = t0;
  v->t1 = t1;
  return 0;
nomem:
  snprintf(err, errlen, "out of memory");
  return -1;
}

/* Length of the valid UTF-8 sequence at s (a scalar value, not a
 * surrogate, not U+FFFE/U+FFFF, shortest form), or 0. */
static int utf8_len(const unsigned char *s) {
  unsigned c = s[0], cp, n;
  if (c < 0x80) return 1;
  if (c >= 0xc2 && c <= 0xdf) n = 2, cp = c & 0x1f;
  else if (c >= 0xe0 && c <= 0xef) n = 3, cp = c & 0x0f;
  else if (c >= 0xf0 && c <= 0xf4) n = 4, cp = c & 0x07;
  else return 0;
  for (unsigned k = 1; k < n; k++) {
    if ((s[k] & 0xc0) != 0x80) return 0;
    cp = cp << 6 | (s[k] & 0x3f);
  }
  if ((n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10ffff))) return 0;
  if ((cp >= 0xd800 && cp <= 0xdfff) || cp == 0xfffe || cp == 0xffff) return 0;
  return (int)n;
}

/* s escaped for XML text and attributes. */
static void put_xml(FILE *f, const char *str) {
  const unsigned char *s = (const unsigned char *)str;
  while (*s) {
    int n = utf8_len(s);
    if (n == 0) {
      fputs("&#xFFFD;", f);
      s++;
      continue;
    }
    switch (*s) {
    case '&': fputs("&amp;", f); break;
    case '<': fputs("&lt;", f); break;
    case '>': fputs("&gt;", f); break;
    case '"': fputs("&quot;", f); break;
    case '\'': fputs("&apos;", f); break;
    case '\t': case '\n': fputc(*s, f); break;
    default:
      if (*s < 0x20) fputs("&#xFFFD;", f); /* not an XML 1.0 character */
      else fwrite(s, 1, (size_t)n, f);
    }
    s += n;
  }
}

/* s as a JSON string, quotes included. */
static void put_json(FILE *f, const char *str) {
  const unsigned char *s = (const unsigned char *)str;
  fputc('"', f);
  while (*s) {
    int n = utf8_len(s);
    if (n == 0) {
      fputs("\\ufffd", f);
      s++;
      continue;
    }
    if (*s == '"' || *s == '\\') fprintf(f, "\\%c", *s);
    else if (*s < 0x20) fprintf(f, "\\u%04x", *s);
    else fwrite(s, 1, (size_t)n, f);
    s += n;
  }
  fputc('"', f);
}

static double ms_of(const view *v, int64_t t) { return (double)(t - v->t0) / 1e6; }

/* "all_reduce #3 on dp[1]" */
static void op_label(const tr_rank *r, const tr_op *o, char *buf, size_t cap) {
  const tr_group *g = &r->groups[o->group];
  snprintf(buf, cap, "%s #%" PRIu64 " on %s[%d]", o->kind, o->gseq, g->name, g->index);
}

static FILE *open_out(const char *path, char *err, size_t errlen) {
  FILE *f = fopen(path, "w");
  if (!f) snprintf(err, errlen, "%s: %s", path, strerror(errno));
  return f;
}

static int close_out(FILE *f, const char *path, char *err, size_t errlen) {
  int bad = ferror(f);
  if (fclose(f) != 0) bad = 1;
  if (bad) snprintf(err, errlen, "%s: write error", path);
  return bad ? -1 : 0;
}

/* ---- SVG ---- */

static const char *const palette[] = {"#4e79a7", "#f28e2b", "#76b7b2", "#59a14f", "#edc948",
                                      "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac", "#8cd17d",
                                      "#86bcb6", "#d4a6c8", "#499894", "#f1ce63", "#a0cbe8"};
#define NPALETTE ((int)(sizeof palette / sizeof palette[0]))

enum { LEFT = 96, PLOT_W = 1100, RIGHT = 24, TOP = 46, LANE_H = 14, ROW_PAD = 4 };

/* A step of 1, 2 or 5 times a power of ten giving at most about 10 ticks. */
static double tick_step(double span_ms) {
  double raw = span_ms / 10, p = pow(10, floor(log10(raw)));
  double m = raw / p;
  return (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10) * p;
}

static void tick_label(double ms, double step, char *buf, size_t cap) {
  if (step >= 1000) snprintf(buf, cap, "%g s", ms / 1000);
  else snprintf(buf, cap, "%.*f ms", step >= 1 ? 0 : step >= 0.1 ? 1 : step >= 0.01 ? 2 : 3, ms);
}

static void svg_tooltip(FILE *f, const view *v, const tr_rank *r, const tr_op *o, const op_at *p) {
  char lab[TR_NAME + 64];
  op_label(r, o, lab, sizeof lab);
  fputs("<title>", f);
  fprintf(f, "rank %d: ", r->rank);
  put_xml(f, lab);
  fprintf(f, "\n%s x %" PRIu64, o->dtype[0] ? o->dtype : "-", o->count);
  if (o->peer >= 0) fprintf(f, ", peer %d", o->peer);
  fprintf(f, ", step %ld, bucket %d", o->step, o->bucket);
  if (o->first[0] || o->last[0]) {
    fputs("\nparams ", f);
    put_xml(f, o->first);
    fputs(" .. ", f);
    put_xml(f, o->last);
  }
  fprintf(f, "\nissued %.3f ms, started %.3f ms, ", ms_of(v, p->a), ms_of(v, p->s));
  if (o->end_ns) fprintf(f, "ended %.3f ms", ms_of(v, o->end_ns));
  else fprintf(f, "not ended at the dump (%.3f ms)", ms_of(v, r->dump_ns));
  fprintf(f, "\nwait %.3f ms, run %.3f ms, seq %" PRIu64 ", status ", (double)(p->s - p->a) / 1e6,
          (double)(p->b - p->s) / 1e6, o->seq);
  put_xml(f, o->status);
  fputs("</title>", f);
}

/* A writer's body: the picture of v (ranks[0..n)) into f; 0, or -1 with
 * err (f and v are closed and freed by write_out). */
typedef int (*draw_body)(FILE *f, view *v, const tr_rank *ranks, int n, char *err,
                         size_t errlen);

/* The view of the dumps, path opened, body run, everything released. */
static int write_out(const tr_rank *ranks, int n, int world, const char *path, char *err,
                     size_t errlen, draw_body body) {
  view v;
  FILE *f = NULL;
  int rc = view_make(&v, ranks, n, world, err, errlen);
  if (!rc && !(f = open_out(path, err, errlen))) rc = -1;
  if (!rc && body(f, &v, ranks, n, err, errlen)) {
    fclose(f);
    f = NULL;
    rc = -1;
  }
  view_free(&v);
  return rc ? rc : close_out(f, path, err, errlen);
}

/* A run of more than RUN_ROWS consecutive ranks without a dump is drawn as
 * one row ("ranks A to B"), so that the drawing grows with the dumps, not
 * with WORLD (issue 45, item 14). */
#define RUN_ROWS 16

/* The last rank of the run of ranks without a dump that starts at w (w
 * itself when w has a dump or the run is short). */
static int run_end(const view *v, int w) {
  if (v->by_rank[w]) return w;
  int e = w;
  while (e + 1 < v->world && !v->by_rank[e + 1]) e++;
  return e - w + 1 > RUN_ROWS ? e : w;
}

static int svg_body(FILE *f, view *v, const tr_rank *ranks, int n, char *err,
                    size_t errlen) {
  /* Row tops: a row is its rank's lanes high (a rank without a dump: one). */
  int *row_y = malloc(sizeof(int) * ((size_t)v->world + 1));
  int *row_i = malloc(sizeof(int) * ((size_t)v->world + 1));
  if (!row_y || !row_i) {
    free(row_y);
    free(row_i);
    snprintf(err, errlen, "out of memory");
    return -1;
  }
  for (int w = 0; w < v->world; w++) row_i[w] = -1;
  for (int i = 0; i < n; i++) row_i[ranks[i].rank] = i;
  int y = TOP;
  for (int w = 0; w < v->world; w++) {
    for (int e = run_end(v, w); w < e; w++) row_y[w] = y; /* a collapsed run: one row */
    row_y[w] = y;
    y += (row_i[w] >= 0 ? v->lanes[row_i[w]] : 1) * LANE_H + 2 * ROW_PAD;
  }
  row_y[v->world] = y;
  int axis_y = y, legend_y = y + 34, legend_rows = (v->nnames + 2 + 5) / 6;
  int width = LEFT + PLOT_W + RIGHT, height = legend_y + legend_rows * 18 + 10;
  double span = ms_of(v, v->t1), scale = PLOT_W / span;
#define X(t) (LEFT + ms_of(v, (t)) * scale)

  fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
             "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
             "viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" font-size=\"11\">\n",
          width, height, width, height);
  const tr_rank *any = n > 0 ? &ranks[0] : NULL;
  fputs("<title>meshpg flight recorder</title>\n", f);
  fprintf(f, "<rect width=\"%d\" height=\"%d\" fill=\"white\"/>\n", width, height);
  fprintf(f, "<text class=\"heading\" x=\"%d\" y=\"18\" font-size=\"13\">meshpg trace: world %d, "
             "%d dumps",
          LEFT, v->world, n);
  if (any) {
    fputs(", mesh ", f);
    put_xml(f, any->mesh);
    fputs(", backend ", f);
    put_xml(f, any->backend);
  }
  fprintf(f, ", %.3f ms</text>\n", span);

  /* The time axis: grid lines over the rows, labels below. */
  double step = tick_step(span);
  fprintf(f, "<g class=\"axis\" stroke=\"#ddd\">\n");
  for (int k = 0; k * step <= span * (1 + 1e-9); k++) {
    double x = LEFT + k * step * scale;
    fprintf(f, "<line x1=\"%.2f\" y1=\"%d\" x2=\"%.2f\" y2=\"%d\"/>\n", x, TOP - 4, x, axis_y + 4);
  }
  fprintf(f, "</g>\n<g class=\"axis-labels\" fill=\"#444\" text-anchor=\"middle\">\n");
  for (int k = 0; k * step <= span * (1 + 1e-9); k++) {
    char lab[48];
    tick_label(k * step, step, lab, sizeof lab);
    fprintf(f, "<text x=\"%.2f\" y=\"%d\">%s</text>\n", LEFT + k * step * scale, axis_y + 16, lab);
  }
  fprintf(f, "<text x=\"%d\" y=\"%d\">time since the first operation</text>\n</g>\n",
          LEFT + PLOT_W / 2, axis_y + 28);

  for (int w = 0; w < v->world; w++) {
    int i = row_i[w], e = run_end(v, w), h = row_y[e + 1] - row_y[w];
    fprintf(f, "<g class=\"rank%s\" id=\"rank-%d\" data-rank=\"%d\"", i < 0 ? " nodump" : "", w,
            w);
    if (e > w) fprintf(f, " data-last=\"%d\"", e);
    fputs(">\n", f);
    if (w % 2 == 0)
      fprintf(f, "<rect x=\"0\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"#f4f4f4\"/>\n",
              row_y[w], width, h);
    if (e > w)
      fprintf(f, "<text x=\"8\" y=\"%d\">ranks %d to %d</text>\n", row_y[w] + ROW_PAD + 11, w, e);
    else
      fprintf(f, "<text x=\"8\" y=\"%d\">rank %d</text>\n", row_y[w] + ROW_PAD + 11, w);
    if (i < 0) {
      fprintf(f, "<text class=\"nodump\" x=\"%d\" y=\"%d\" fill=\"#b00\">no dump</text>\n</g>\n",
              LEFT + 4, row_y[w] + ROW_PAD + 11);
      w = e;
      continue;
    }
    const tr_rank *r = &ranks[i];
    for (int k = 0; k < r->nops; k++) {
      const tr_op *o = &r->ops[k];
      const op_at *p = &v->at[i][k];
      if (!p->a) continue; /* never issued: no time to draw it at */
      const char *col = palette[p->name % NPALETTE];
      double ly = row_y[w] + ROW_PAD + p->lane * LANE_H + 1;
      if (p->s > p->a)
        fprintf(f, "<rect class=\"wait\" x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%d\" "
                   "fill=\"%s\" fill-opacity=\"0.3\"/>\n",
                X(p->a), ly, (double)(p->s - p->a) / 1e6 * scale, LANE_H - 2, col);
      double wd = (double)(p->b - p->s) / 1e6 * scale;
      int red = failed(o) || !strcmp(o->status, "pending");
      fprintf(f, "<rect class=\"op%s\" x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%d\" "
                 "fill=\"%s\"%s>",
              red ? " bad" : "", X(p->s), ly, wd < 0.5 ? 0.5 : wd, LANE_H - 2, col,
              red ? " stroke=\"#d00\" stroke-width=\"1.5\"" : "");
      svg_tooltip(f, v, r, o, p);
      fputs("</rect>\n", f);
    }
    fputs("</g>\n", f);
  }

  if (v->fail_ns) {
    double x = X(v->fail_ns);
    fprintf(f, "<g class=\"failure\">\n<line x1=\"%.2f\" y1=\"%d\" x2=\"%.2f\" y2=\"%d\" "
               "stroke=\"#d00\" stroke-width=\"2\" stroke-dasharray=\"5,3\"/>\n",
            x, TOP - 8, x, axis_y);
    fprintf(f, "<text x=\"%.2f\" y=\"%d\" fill=\"#d00\" text-anchor=\"%s\">", x, TOP - 10,
            x > LEFT + PLOT_W / 2 ? "end" : "start");
    if (v->fail_i >= 0) {
      const tr_rank *r = &ranks[v->fail_i];
      const tr_op *o = &r->ops[v->fail_op];
      char lab[TR_NAME + 64];
      op_label(r, o, lab, sizeof lab);
      fputs("first failure: ", f);
      put_xml(f, o->status);
      fprintf(f, " on rank %d, ", r->rank);
      put_xml(f, lab);
    } else {
      fprintf(f, "first error dump (rank %d)", v->fail_rank);
    }
    fprintf(f, " at %.3f ms</text>\n</g>\n", ms_of(v, v->fail_ns));
  }

  /* The legend: one swatch per group name, then the wait and the outline. */
  fputs("<g class=\"legend\">\n", f);
  for (int k = 0; k < v->nnames + 2; k++) {
    int lx = LEFT + (k % 6) * 180, ly = legend_y + (k / 6) * 18;
    if (k < v->nnames) {
      fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"14\" height=\"10\" fill=\"%s\"/>"
                 "<text x=\"%d\" y=\"%d\">",
              lx, ly, palette[k % NPALETTE], lx + 18, ly + 9);
      put_xml(f, v->names[k]);
      fputs("</text>\n", f);
    } else if (k == v->nnames) {
      fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"14\" height=\"10\" fill=\"#888\" "
                 "fill-opacity=\"0.3\"/><text x=\"%d\" y=\"%d\">issued, not started</text>\n",
              lx, ly, lx + 18, ly + 9);
    } else {
      fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"14\" height=\"10\" fill=\"#888\" stroke=\"#d00\" "
                 "stroke-width=\"1.5\"/><text x=\"%d\" y=\"%d\">failed or pending</text>\n",
              lx, ly, lx + 18, ly + 9);
    }
  }
  fputs("</g>\n</svg>\n", f);
#undef X
  free(row_y);
  free(row_i);
  return 0;
}

int tr_write_svg(const tr_rank *ranks, int n, int world, const char *path, char *err,
                 size_t errlen) {
  return write_out(ranks, n, world, path, err, errlen, svg_body);
}

/* ---- Chrome trace event format ---- */

static void json_args(FILE *f, const view *v, const tr_rank *r, const tr_op *o) {
  const tr_group *g = &r->groups[o->group];
  fputs("{\"group\":", f);
  put_json(f, g->name);
  fprintf(f, ",\"index\":%d,\"kind\":", g->index);
  put_json(f, o->kind);
  fprintf(f, ",\"gseq\":%" PRIu64 ",\"seq\":%" PRIu64 ",\"dtype\":", o->gseq, o->seq);
  put_json(f, o->dtype);
  fprintf(f, ",\"count\":%" PRIu64 ",\"peer\":%d,\"step\":%ld,\"bucket\":%d,\"first\":", o->count,
          o->peer, o->step, o->bucket);
  put_json(f, o->first);
  fputs(",\"last\":", f);
  put_json(f, o->last);
  fputs(",\"status\":", f);
  put_json(f, o->status);
  fprintf(f, ",\"issue_ms\":%.6f,\"start_ms\":%.6f,\"end_ms\":%.6f}",
          o->issue_ns ? ms_of(v, o->issue_ns) : -1.0, o->start_ns ? ms_of(v, o->start_ns) : -1.0,
          o->end_ns ? ms_of(v, o->end_ns) : -1.0);
}

/* Microseconds since the origin. */
static double us_of(const view *v, int64_t t) { return (double)(t - v->t0) / 1e3; }

static int chrome_body(FILE *f, view *v, const tr_rank *ranks, int n, char *err,
                       size_t errlen) {
  /* Lanes per rank and group name: thread id name * MAX_LANES + lane + 1. */
  size_t nl = (size_t)(v->nnames ? v->nnames : 1);
  int64_t *ends = calloc(nl * MAX_LANES, sizeof(int64_t));
  int *used = calloc(nl, sizeof(int));
  if (!ends || !used) {
    free(ends);
    free(used);
    snprintf(err, errlen, "out of memory");
    return -1;
  }
  fputs("{\"traceEvents\":[\n", f);
  int first = 1;
#define SEP() (first ? (void)(first = 0) : (void)fputs(",\n", f))
  for (int w = 0; w < v->world; w++) {
    SEP();
    int e = run_end(v, w);
    if (e > w) /* a long run without dumps: one process */
      fprintf(f, "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,"
                 "\"args\":{\"name\":\"ranks %d to %d (no dump)\"}},\n",
              w, w, e);
    else
      fprintf(f, "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,"
                 "\"args\":{\"name\":\"rank %d%s\"}},\n",
              w, w, v->by_rank[w] ? "" : " (no dump)");
    fprintf(f, "{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,"
               "\"args\":{\"sort_index\":%d}}",
            w, w);
    w = e;
  }
  for (int i = 0; i < n; i++) {
    const tr_rank *r = &ranks[i];
    memset(used, 0, nl * sizeof(int));
    for (int k = 0; k < r->nops; k++) {
      const tr_op *o = &r->ops[k];
      op_at *p = &v->at[i][k];
      if (!p->a) continue;
      int *u = &used[p->name];
      int before = *u;
      int lane = pick_lane(ends + (size_t)p->name * MAX_LANES, u, p->a, p->b);
      int tid = p->name * MAX_LANES + lane + 1;
      if (*u > before) {
        SEP();
        fprintf(f, "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"args\":"
                   "{\"name\":",
                r->rank, tid);
        char tn[TR_NAME + 16];
        if (lane) snprintf(tn, sizeof tn, "%s (%d)", v->names[p->name], lane + 1);
        else snprintf(tn, sizeof tn, "%s", v->names[p->name]);
        put_json(f, tn);
        fprintf(f, "}},\n{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,"
                   "\"args\":{\"sort_index\":%d}}",
                r->rank, tid, tid);
      }
      char lab[TR_NAME + 64];
      op_label(r, o, lab, sizeof lab);
      if (p->s > p->a) {
        SEP();
        fputs("{\"name\":", f);
        char wl[TR_NAME + 80];
        snprintf(wl, sizeof wl, "wait: %s", lab);
        put_json(f, wl);
        fprintf(f, ",\"cat\":\"wait\",\"ph\":\"X\",\"ts\":%.3f,\"dur\":%.3f,\"pid\":%d,\"tid\":%d,"
                   "\"args\":",
                us_of(v, p->a), (double)(p->s - p->a) / 1e3, r->rank, tid);
        json_args(f, v, r, o);
        fputc('}', f);
      }
      SEP();
      fputs("{\"name\":", f);
      put_json(f, lab);
      fputs(",\"cat\":", f);
      put_json(f, v->names[p->name]);
      fprintf(f, ",\"ph\":\"X\",\"ts\":%.3f,\"dur\":%.3f,\"pid\":%d,\"tid\":%d,\"args\":",
              us_of(v, p->s), (double)(p->b - p->s) / 1e3, r->rank, tid);
      json_args(f, v, r, o);
      if (failed(o) || !strcmp(o->status, "pending")) fputs(",\"cname\":\"terrible\"", f);
      fputc('}', f);
    }
  }
  if (v->fail_ns) {
    SEP();
    const tr_rank *r = v->fail_i >= 0 ? &ranks[v->fail_i] : NULL;
    fputs("{\"name\":", f);
    if (r) {
      char lab[TR_NAME + 96];
      op_label(r, &r->ops[v->fail_op], lab, sizeof lab);
      char fl[TR_NAME + 160];
      snprintf(fl, sizeof fl, "failure: %s on rank %d, %s", r->ops[v->fail_op].status, r->rank,
               lab);
      put_json(f, fl);
    } else {
      fprintf(f, "\"failure: first error dump (rank %d)\"", v->fail_rank);
    }
    fprintf(f, ",\"cat\":\"failure\",\"ph\":\"i\",\"s\":\"g\",\"ts\":%.3f,\"pid\":%d,\"tid\":0}",
            us_of(v, v->fail_ns), v->fail_rank);
  }
#undef SEP
  fprintf(f, "\n],\"displayTimeUnit\":\"ms\",\"otherData\":{\"tool\":\"meshpg trace\","
             "\"world\":%d,\"dumps\":%d,\"origin_ns\":%" PRId64 "}}\n",
          v->world, n, v->t0);
  free(ends);
  free(used);
  return 0;
}

int tr_write_chrome(const tr_rank *ranks, int n, int world, const char *path, char *err,
                    size_t errlen) {
  return write_out(ranks, n, world, path, err, errlen, chrome_body);
}
