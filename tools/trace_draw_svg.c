/* The SVG timeline of the flight recorder's dumps (tools/trace_draw.h;
 * docs/trace.md, "The picture"): one row per world rank, operations
 * coloured by group name, the earliest failure a labelled dashed line, the
 * culprits' and stragglers' rows marked and a culprit's missing or
 * differing operation drawn where its peers have it.  The view it draws is
 * trace_draw.c's (trace_draw_internal.h). */
#define _POSIX_C_SOURCE 200809L
#include "trace_draw_internal.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
  td__op_label(r, o, lab, sizeof lab);
  fputs("<title>", f);
  fprintf(f, "rank %d: ", r->rank);
  td__put_xml(f, lab);
  fprintf(f, "\n%s x %" PRIu64, o->dtype[0] ? o->dtype : "-", o->count);
  if (o->peer >= 0) fprintf(f, ", peer %d", o->peer);
  fprintf(f, ", step %ld, bucket %d", o->step, o->bucket);
  if (o->first[0] || o->last[0]) {
    fputs("\nparams ", f);
    td__put_xml(f, o->first);
    fputs(" .. ", f);
    td__put_xml(f, o->last);
  }
  fprintf(f, "\nissued %.3f ms, started %.3f ms, ", td__ms_of(v, p->a), td__ms_of(v, p->s));
  if (o->end_ns) fprintf(f, "ended %.3f ms", td__ms_of(v, o->end_ns));
  else fprintf(f, "not ended at the dump (%.3f ms)", td__ms_of(v, r->dump_ns));
  fprintf(f, "\nwait %.3f ms, run %.3f ms, seq %" PRIu64 ", status ", (double)(p->s - p->a) / 1e6,
          (double)(p->b - p->s) / 1e6, o->seq);
  td__put_xml(f, o->status);
  fputs("</title>", f);
}

/* The tooltip of a marked row (world ranks w..e): the culprits' lines and
 * the stragglers' notes. */
static void row_note(FILE *f, const view *v, int w, int e, int mark) {
  const tr_marks *m = v->marks;
  int any = 0;
  fputs("<title>", f);
  for (int c = 0; mark == ROW_CULPRIT && c < m->nculprits && any < 8; c++)
    if (m->culprits[c].rank >= w && m->culprits[c].rank <= e && m->culprits[c].text) {
      if (any++) fputc('\n', f);
      td__put_xml(f, m->culprits[c].text);
    }
  for (int s = 0; s < m->nslow && any < 8; s++)
    if (m->slow[s].rank >= w && m->slow[s].rank <= e) {
      if (any++) fputc('\n', f);
      fprintf(f, "straggler: world rank %d", m->slow[s].rank);
      if (m->slow[s].note && m->slow[s].note[0]) {
        fputs(": ", f);
        td__put_xml(f, m->slow[s].note);
      }
    }
  if (!any) fputs(mark == ROW_CULPRIT ? "culprit" : "straggler", f);
  fputs("</title>", f);
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
  /* The stragglers' note takes a line under the heading. */
  int top = TOP + (v->marks && v->marks->nslow > 0 ? 14 : 0);
  int y = top;
  for (int w = 0; w < v->world; w++) {
    for (int e = td__run_end(v, w); w < e; w++) row_y[w] = y; /* a collapsed run: one row */
    row_y[w] = y;
    int i = row_i[w];
    y += (i >= 0 ? v->lanes[i] + (v->extra ? v->extra[i] : 0) : 1) * LANE_H + 2 * ROW_PAD;
  }
  row_y[v->world] = y;
  int axis_y = y, legend_y = y + 34, legend_rows = (v->nnames + 2 + 5) / 6;
  int width = LEFT + PLOT_W + RIGHT, height = legend_y + legend_rows * 18 + 10;
  double span = td__ms_of(v, v->t1), scale = PLOT_W / span;
#define X(t) (LEFT + td__ms_of(v, (t)) * scale)

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
    td__put_xml(f, any->mesh);
    fputs(", backend ", f);
    td__put_xml(f, any->backend);
  }
  fprintf(f, ", %.3f ms</text>\n", span);
  if (top > TOP) { /* the stragglers */
    const tr_marks *m = v->marks;
    fprintf(f, "<text class=\"stragglers\" x=\"%d\" y=\"32\" fill=\"#b35900\">stragglers: ", LEFT);
    for (int s = 0; s < m->nslow && s < 8; s++) {
      fprintf(f, "%sworld rank %d", s ? "; " : "", m->slow[s].rank);
      if (m->slow[s].note && m->slow[s].note[0]) {
        fputs(" (", f);
        td__put_xml(f, m->slow[s].note);
        fputc(')', f);
      }
    }
    if (m->nslow > 8) fprintf(f, "; and %d more", m->nslow - 8);
    fputs("</text>\n", f);
  }
  /* The hatching of a culprit's missing operation. */
  fputs("<defs><pattern id=\"missing-hatch\" width=\"6\" height=\"6\" "
        "patternUnits=\"userSpaceOnUse\" patternTransform=\"rotate(45)\">"
        "<rect width=\"6\" height=\"6\" fill=\"#fff\"/>"
        "<line x1=\"0\" y1=\"0\" x2=\"0\" y2=\"6\" stroke=\"#d00\" stroke-width=\"2\"/>"
        "</pattern></defs>\n", f);

  /* The time axis: grid lines over the rows, labels below. */
  double step = tick_step(span);
  fprintf(f, "<g class=\"axis\" stroke=\"#ddd\">\n");
  for (int k = 0; k * step <= span * (1 + 1e-9); k++) {
    double x = LEFT + k * step * scale;
    fprintf(f, "<line x1=\"%.2f\" y1=\"%d\" x2=\"%.2f\" y2=\"%d\"/>\n", x, top - 4, x, axis_y + 4);
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
    int i = row_i[w], e = td__run_end(v, w), h = row_y[e + 1] - row_y[w];
    fprintf(f, "<g class=\"rank%s\" id=\"rank-%d\" data-rank=\"%d\"", i < 0 ? " nodump" : "", w,
            w);
    if (e > w) fprintf(f, " data-last=\"%d\"", e);
    fputs(">\n", f);
    int mark = ROW_PLAIN;
    for (int q = w; v->row_mark && q <= e; q++)
      if (v->row_mark[q] && (!mark || v->row_mark[q] == ROW_CULPRIT)) mark = v->row_mark[q];
    if (mark) { /* a culprit's or straggler's row: a band, a bar, a label */
      const char *band = mark == ROW_CULPRIT ? "#fde0e0" : "#fff0d9";
      const char *ink = mark == ROW_CULPRIT ? "#d00" : "#d97000";
      fprintf(f, "<rect class=\"%s-band\" x=\"0\" y=\"%d\" width=\"%d\" height=\"%d\" "
                 "fill=\"%s\">", mark == ROW_CULPRIT ? "culprit" : "straggler", row_y[w], width,
              h, band);
      row_note(f, v, w, e, mark);
      fprintf(f, "</rect>\n<rect x=\"0\" y=\"%d\" width=\"4\" height=\"%d\" fill=\"%s\"/>\n",
              row_y[w], h, ink);
    } else if (w % 2 == 0) {
      fprintf(f, "<rect x=\"0\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"#f4f4f4\"/>\n",
              row_y[w], width, h);
    }
    const char *tag = mark == ROW_CULPRIT ? "culprit" : mark == ROW_SLOW ? "slow" : NULL;
    fprintf(f, "<text x=\"8\" y=\"%d\"%s>", row_y[w] + ROW_PAD + 11,
            tag ? (mark == ROW_CULPRIT ? " fill=\"#d00\" font-weight=\"bold\""
                                       : " fill=\"#b35900\" font-weight=\"bold\"")
                : "");
    if (e > w) fprintf(f, "ranks %d to %d", w, e);
    else fprintf(f, "rank %d", w);
    if (tag) fprintf(f, "<tspan class=\"row-tag\" dx=\"4\" font-size=\"9\">%s</tspan>", tag);
    fputs("</text>\n", f);
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
      int red = td__failed(o) || !strcmp(o->status, "pending");
      int differs = 0; /* a culprit's own operation that differs from its peers' */
      for (int q = 0; v->extra && v->extra[i] && q < v->nev && !differs; q++)
        differs = v->ev[q].i == i && v->ev[q].k == k;
      double minw = differs ? 4 : 0.5;
      fprintf(f, "<rect class=\"op%s%s\" x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%d\" "
                 "fill=\"%s\"%s>",
              red ? " bad" : "", differs ? " differs" : "", X(p->s), ly, wd < minw ? minw : wd,
              LANE_H - 2, col,
              differs ? " stroke=\"#90c\" stroke-width=\"2.5\""
              : red   ? " stroke=\"#d00\" stroke-width=\"1.5\""
                      : "");
      svg_tooltip(f, v, r, o, p);
      fputs("</rect>\n", f);
    }
    /* The culprit's operation where its peers have it, in the row's last
     * lane: hatched when missing, dashed purple when it differs. */
    for (int q = 0; q < v->nev; q++) {
      const evid *ev = &v->ev[q];
      if (ev->i != i) continue;
      double ly = row_y[w] + ROW_PAD + v->lanes[i] * LANE_H + 1;
      double x0 = X(ev->a), wd = (double)(ev->b - ev->a) / 1e6 * scale;
      int missing = ev->k < 0;
      if (wd < 4) wd = 4;
      fprintf(f, "<g class=\"evidence %s\" data-op=\"", missing ? "missing" : "differs");
      td__put_xml(f, ev->peers_op);
      fprintf(f, "\">\n<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" "
                 "height=\"%d\" fill=\"%s\" stroke=\"%s\" stroke-width=\"1.5\" "
                 "stroke-dasharray=\"4,2\"><title>",
              x0, ly, wd, LANE_H - 2,
              missing ? "url(#missing-hatch)" : "#f3e0fa", missing ? "#d00" : "#90c");
      td__put_xml(f, ev->label);
      fprintf(f, "\nwhere its peers have it: %.3f to %.3f ms", td__ms_of(v, ev->a),
              td__ms_of(v, ev->b));
      if (ev->text) {
        fputc('\n', f);
        td__put_xml(f, ev->text);
      }
      int right = x0 + wd + 4 < LEFT + PLOT_W - 200;
      fprintf(f, "</title></rect>\n<text x=\"%.2f\" y=\"%.1f\" font-size=\"10\" fill=\"%s\" "
                 "text-anchor=\"%s\">",
              right ? x0 + wd + 4 : x0 - 4, ly + LANE_H - 4, missing ? "#d00" : "#90c",
              right ? "start" : "end");
      td__put_xml(f, ev->label);
      fputs("</text>\n</g>\n", f);
    }
    fputs("</g>\n", f);
  }

  if (v->fail_ns) {
    double x = X(v->fail_ns);
    fprintf(f, "<g class=\"failure\">\n<line x1=\"%.2f\" y1=\"%d\" x2=\"%.2f\" y2=\"%d\" "
               "stroke=\"#d00\" stroke-width=\"2\" stroke-dasharray=\"5,3\"/>\n",
            x, top - 8, x, axis_y);
    fprintf(f, "<text x=\"%.2f\" y=\"%d\" fill=\"#d00\" text-anchor=\"%s\">", x, top - 10,
            x > LEFT + PLOT_W / 2 ? "end" : "start");
    fputs("first failure: ", f);
    td__put_xml(f, v->fail_label);
    fprintf(f, " at %.3f ms</text>\n</g>\n", td__ms_of(v, v->fail_ns));
  }

  /* The legend: one swatch per group name, then the wait and the outline. */
  fputs("<g class=\"legend\">\n", f);
  for (int k = 0; k < v->nnames + 2; k++) {
    int lx = LEFT + (k % 6) * 180, ly = legend_y + (k / 6) * 18;
    if (k < v->nnames) {
      fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"14\" height=\"10\" fill=\"%s\"/>"
                 "<text x=\"%d\" y=\"%d\">",
              lx, ly, palette[k % NPALETTE], lx + 18, ly + 9);
      td__put_xml(f, v->names[k]);
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
  return td__write_out(ranks, n, world, NULL, path, err, errlen, svg_body);
}

int tr_write_svg_marked(const tr_rank *ranks, int n, int world, const tr_marks *marks,
                        const char *path, char *err, size_t errlen) {
  return td__write_out(ranks, n, world, marks, path, err, errlen, svg_body);
}
