/* Drawing the flight recorder's dumps (tools/trace_draw.h): the view both
 * writers share (trace_draw_internal.h) and the Chrome trace event file;
 * the SVG timeline is trace_draw_svg.c's.  Both share one pass over the
 * dumps (struct view): the time origin and end, the group names (one
 * colour, or one Chrome thread family, each), the earliest failure, and
 * per operation its interval and lane (overlapping operations of one rank
 * go to separate lanes, so that nothing hides and Chrome's slices nest).
 * Decoded names may hold any byte: the writers escape them for XML and
 * JSON and replace bytes that are not UTF-8 with U+FFFD. */
#define _POSIX_C_SOURCE 200809L
#include "trace_draw_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void view_free(view *v) {
  if (v->at)
    for (int i = 0; i < v->n; i++) free(v->at[i]);
  free(v->at);
  free(v->by_rank);
  free(v->lanes);
  free(v->names);
  free(v->row_mark);
  free(v->ev);
  free(v->extra);
}

static int name_index(view *v, const char *name) {
  for (int k = 0; k < v->nnames; k++)
    if (!strcmp(v->names[k], name)) return k;
  return -1;
}

static int cmp_name(const void *a, const void *b) { return strcmp(a, b); }

/* Greedy interval packing: the first lane free at a, else the one that
 * frees first. */
int td__pick_lane(int64_t *ends, int *nl, int64_t a, int64_t b) {
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

int td__failed(const tr_op *o) {
  return strcmp(o->status, "ok") != 0 && strcmp(o->status, "pending") != 0;
}

static int view_marks(view *v);

static int view_make(view *v, const tr_rank *ranks, int n, int world, const tr_marks *marks,
                     char *err, size_t errlen) {
  memset(v, 0, sizeof *v);
  v->ranks = ranks;
  v->n = n;
  v->marks = marks;
  v->fail_i = v->fail_op = v->fail_dump_i = -1;
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
      p->lane = td__pick_lane(ends, &nl, p->a, p->b);
      if (p->a && p->a < t0) t0 = p->a;
      if (p->b > t1) t1 = p->b;
      if (td__failed(o) && o->end_ns && (!v->fail_ns || o->end_ns < v->fail_ns)) {
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
    if (strcmp(ranks[i].reason, "request") && strcmp(ranks[i].reason, "end") &&
        ranks[i].dump_ns &&
        (!v->fail_ns || ranks[i].dump_ns < v->fail_ns)) {
      v->fail_ns = ranks[i].dump_ns;
      v->fail_rank = ranks[i].rank;
      v->fail_dump_i = i;
    }
  /* Its label: status, world rank and operation (docs/trace.md). */
  if (v->fail_i >= 0) {
    const tr_rank *r = &ranks[v->fail_i];
    char lab[TR_NAME + 64];
    td__op_label(r, &r->ops[v->fail_op], lab, sizeof lab);
    snprintf(v->fail_label, sizeof v->fail_label, "%s on world rank %d, %s",
             r->ops[v->fail_op].status, r->rank, lab);
  } else if (v->fail_dump_i >= 0) {
    /* A dump without a failed operation: its reason, and the operation the
     * rank was in (its earliest pending one), else its last. */
    const tr_rank *r = &ranks[v->fail_dump_i];
    int k = -1;
    for (int q = 0; q < r->nops && k < 0; q++)
      if (!strcmp(r->ops[q].status, "pending")) k = q;
    int pending = k >= 0;
    if (!pending) k = r->nops - 1;
    char lab[TR_NAME + 64] = "";
    if (k >= 0) td__op_label(r, &r->ops[k], lab, sizeof lab);
    if (k < 0)
      snprintf(v->fail_label, sizeof v->fail_label, "%s dump of world rank %d, no operation "
               "recorded", r->reason, r->rank);
    else if (pending)
      snprintf(v->fail_label, sizeof v->fail_label, "%s dump of world rank %d, pending %s",
               r->reason, r->rank, lab);
    else
      snprintf(v->fail_label, sizeof v->fail_label, "%s dump of world rank %d, last operation "
               "%s (%s)", r->reason, r->rank, lab, r->ops[k].status);
  }
  if (marks && view_marks(v)) goto nomem;
  for (int e = 0; e < v->nev; e++) {
    if (v->ev[e].a && v->ev[e].a < t0) t0 = v->ev[e].a;
    if (v->ev[e].b > t1) t1 = v->ev[e].b;
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
  for (int e = 0; e < v->nev; e++)
    if (!v->ev[e].b) v->ev[e].b = t1; /* the peers' operation was still pending */
  return 0;
nomem:
  snprintf(err, errlen, "out of memory");
  return -1;
}

/* The index of the group of r named g ("tp[1]"), -1. */
static int group_named(const tr_rank *r, const char *g) {
  char lab[TR_NAME + 16];
  for (int q = 0; q < r->ngroups; q++) {
    snprintf(lab, sizeof lab, "%s[%d]", r->groups[q].name, r->groups[q].index);
    if (!strcmp(lab, g)) return q;
  }
  return -1;
}

/* The operation of r numbered gseq on its group gi, -1. */
static int op_numbered(const tr_rank *r, int gi, uint64_t gseq) {
  for (int k = 0; k < r->nops; k++)
    if (r->ops[k].group == gi && r->ops[k].gseq == gseq) return k;
  return -1;
}

/* How a culprit's operation is labelled; NULL: not drawn. */
static const char *how_word(ta_how how) {
  switch (how) {
  case TA_SKIPPED: return "missing";
  case TA_ROOT: return "never issued";
  case TA_DIFFERS: return "differs";
  case TA_SWAPPED: return "swapped";
  case TA_LATE: return "issued late";
  default: return NULL;
  }
}

/* The rows to mark and the culprits' operations (v->marks). */
static int view_marks(view *v) {
  const tr_marks *m = v->marks;
  v->row_mark = calloc((size_t)v->world, 1);
  v->extra = calloc((size_t)v->n + 1, sizeof *v->extra);
  v->ev = calloc((size_t)(m->nculprits > 0 ? m->nculprits : 0) + 1, sizeof *v->ev);
  if (!v->row_mark || !v->extra || !v->ev) return -1;
  for (int s = 0; s < m->nslow; s++)
    if (m->slow[s].rank >= 0 && m->slow[s].rank < v->world)
      v->row_mark[m->slow[s].rank] = ROW_SLOW;
  for (int c = 0; c < m->nculprits; c++) {
    const ta_item *it = &m->culprits[c];
    if (it->rank < 0 || it->rank >= v->world) continue;
    v->row_mark[it->rank] = ROW_CULPRIT;
    const tr_rank *r = v->by_rank[it->rank];
    const char *word = how_word(it->how);
    if (!r || !word || !it->group[0]) continue;
    int gi = group_named(r, it->group);
    evid *e = &v->ev[v->nev];
    e->rank = it->rank;
    e->i = (int)(r - v->ranks);
    e->text = it->text;
    int missing = it->how == TA_SKIPPED || it->how == TA_ROOT;
    e->k = !missing && gi >= 0 ? op_numbered(r, gi, it->gseq) : -1;
    e->a = it->peers_issue_ns;
    e->b = it->peers_end_ns;
    if (!e->a && gi >= 0) { /* from the peers' dumps: at most 64 of them */
      const tr_group *g = &r->groups[gi];
      int pending = 0;
      for (int q = 0, seen = 0; q < g->size && seen < 64; q++) {
        int w = g->ranks[q];
        const tr_rank *p = w >= 0 && w < v->world && w != r->rank ? v->by_rank[w] : NULL;
        int pg = p ? group_named(p, it->group) : -1;
        int k = pg >= 0 ? op_numbered(p, pg, it->gseq) : -1;
        if (k < 0) continue;
        seen++;
        const tr_op *o = &p->ops[k];
        int64_t a = o->issue_ns ? o->issue_ns : o->start_ns;
        if (a && (!e->a || a < e->a)) e->a = a;
        if (!o->end_ns) pending = 1;
        else if (o->end_ns > e->b) e->b = o->end_ns;
      }
      if (pending) e->b = 0;
    }
    if (!e->a && e->k >= 0) { /* no peer holds it: at its own time */
      const tr_op *o = &r->ops[e->k];
      e->a = o->issue_ns ? o->issue_ns : o->start_ns;
      e->b = o->end_ns;
    }
    if (!e->a) continue; /* nowhere to draw it */
    if (e->b && e->b < e->a) e->b = e->a;
    if (e->k >= 0) {
      char own[TR_NAME + 64];
      td__op_label(r, &r->ops[e->k], own, sizeof own);
      snprintf(e->label, sizeof e->label, "%s: %s (%s x %" PRIu64 ")", word, own,
               r->ops[e->k].dtype[0] ? r->ops[e->k].dtype : "-", r->ops[e->k].count);
    } else {
      snprintf(e->label, sizeof e->label, "%s: %s #%" PRIu64 " on %.*s", word,
               it->kind[0] ? it->kind : "operation", it->gseq, TR_NAME + 15, it->group);
    }
    snprintf(e->peers_op, sizeof e->peers_op, "%s #%" PRIu64 " on %s",
             it->kind[0] ? it->kind : "operation", it->gseq, it->group);
    v->extra[e->i] = 1;
    v->nev++;
  }
  return 0;
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
void td__put_xml(FILE *f, const char *str) {
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
void td__put_json(FILE *f, const char *str) {
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

/* "all_reduce #3 on dp[1]" */
void td__op_label(const tr_rank *r, const tr_op *o, char *buf, size_t cap) {
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

/* The view of the dumps, path opened, body run, everything released. */
int td__write_out(const tr_rank *ranks, int n, int world, const tr_marks *marks,
                     const char *path, char *err, size_t errlen, draw_body body) {
  view v;
  FILE *f = NULL;
  int rc = view_make(&v, ranks, n, world, marks, err, errlen);
  if (!rc && !(f = open_out(path, err, errlen))) rc = -1;
  if (!rc && body(f, &v, ranks, n, err, errlen)) {
    fclose(f);
    f = NULL;
    rc = -1;
  }
  view_free(&v);
  return rc ? rc : close_out(f, path, err, errlen);
}

/* The last rank of the run of ranks without a dump that starts at w (w
 * itself when w has a dump or the run is short). */
int td__run_end(const view *v, int w) {
  if (v->by_rank[w]) return w;
  int e = w;
  while (e + 1 < v->world && !v->by_rank[e + 1]) e++;
  return e - w + 1 > RUN_ROWS ? e : w;
}

/* ---- Chrome trace event format ---- */

static void json_args(FILE *f, const view *v, const tr_rank *r, const tr_op *o) {
  const tr_group *g = &r->groups[o->group];
  fputs("{\"group\":", f);
  td__put_json(f, g->name);
  fprintf(f, ",\"index\":%d,\"kind\":", g->index);
  td__put_json(f, o->kind);
  fprintf(f, ",\"gseq\":%" PRIu64 ",\"seq\":%" PRIu64 ",\"dtype\":", o->gseq, o->seq);
  td__put_json(f, o->dtype);
  fprintf(f, ",\"count\":%" PRIu64 ",\"peer\":%d,\"step\":%ld,\"bucket\":%d,\"first\":", o->count,
          o->peer, o->step, o->bucket);
  td__put_json(f, o->first);
  fputs(",\"last\":", f);
  td__put_json(f, o->last);
  fputs(",\"status\":", f);
  td__put_json(f, o->status);
  fprintf(f, ",\"issue_ms\":%.6f,\"start_ms\":%.6f,\"end_ms\":%.6f}",
          o->issue_ns ? td__ms_of(v, o->issue_ns) : -1.0,
          o->start_ns ? td__ms_of(v, o->start_ns) : -1.0,
          o->end_ns ? td__ms_of(v, o->end_ns) : -1.0);
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
    int e = td__run_end(v, w);
    if (e > w) /* a long run without dumps: one process */
      fprintf(f, "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,"
                 "\"args\":{\"name\":\"ranks %d to %d (no dump)\"}},\n",
              w, w, e);
    else
      fprintf(f, "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,"
                 "\"args\":{\"name\":\"rank %d%s%s\"}},\n",
              w, w, v->by_rank[w] ? "" : " (no dump)",
              !v->row_mark ? ""
              : v->row_mark[w] == ROW_CULPRIT ? " (culprit)"
              : v->row_mark[w] == ROW_SLOW    ? " (straggler)"
                                              : "");
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
      int lane = td__pick_lane(ends + (size_t)p->name * MAX_LANES, u, p->a, p->b);
      int tid = p->name * MAX_LANES + lane + 1;
      if (*u > before) {
        SEP();
        fprintf(f, "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"args\":"
                   "{\"name\":",
                r->rank, tid);
        char tn[TR_NAME + 16];
        if (lane) snprintf(tn, sizeof tn, "%s (%d)", v->names[p->name], lane + 1);
        else snprintf(tn, sizeof tn, "%s", v->names[p->name]);
        td__put_json(f, tn);
        fprintf(f, "}},\n{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,"
                   "\"args\":{\"sort_index\":%d}}",
                r->rank, tid, tid);
      }
      char lab[TR_NAME + 64];
      td__op_label(r, o, lab, sizeof lab);
      if (p->s > p->a) {
        SEP();
        fputs("{\"name\":", f);
        char wl[TR_NAME + 80];
        snprintf(wl, sizeof wl, "wait: %s", lab);
        td__put_json(f, wl);
        fprintf(f, ",\"cat\":\"wait\",\"ph\":\"X\",\"ts\":%.3f,\"dur\":%.3f,\"pid\":%d,\"tid\":%d,"
                   "\"args\":",
                us_of(v, p->a), (double)(p->s - p->a) / 1e3, r->rank, tid);
        json_args(f, v, r, o);
        fputc('}', f);
      }
      SEP();
      fputs("{\"name\":", f);
      td__put_json(f, lab);
      fputs(",\"cat\":", f);
      td__put_json(f, v->names[p->name]);
      fprintf(f, ",\"ph\":\"X\",\"ts\":%.3f,\"dur\":%.3f,\"pid\":%d,\"tid\":%d,\"args\":",
              us_of(v, p->s), (double)(p->b - p->s) / 1e3, r->rank, tid);
      json_args(f, v, r, o);
      if (td__failed(o) || !strcmp(o->status, "pending")) fputs(",\"cname\":\"terrible\"", f);
      fputc('}', f);
    }
  }
  if (v->fail_ns) {
    SEP();
    fputs("{\"name\":", f);
    char fl[sizeof v->fail_label + 16];
    snprintf(fl, sizeof fl, "failure: %s", v->fail_label);
    td__put_json(f, fl);
    fprintf(f, ",\"cat\":\"failure\",\"ph\":\"i\",\"s\":\"g\",\"ts\":%.3f,\"pid\":%d,\"tid\":0}",
            us_of(v, v->fail_ns), v->fail_rank);
  }
  for (int q = 0; q < v->nev; q++) { /* a culprit's missing or differing operation */
    const evid *ev = &v->ev[q];
    SEP();
    fputs("{\"name\":", f);
    td__put_json(f, ev->label);
    fprintf(f, ",\"cat\":\"culprit\",\"ph\":\"i\",\"s\":\"p\",\"ts\":%.3f,\"pid\":%d,\"tid\":0,"
               "\"args\":{\"peers_end_ms\":%.6f,\"text\":",
            us_of(v, ev->a), ev->rank, td__ms_of(v, ev->b));
    td__put_json(f, ev->text ? ev->text : "");
    fputs("}}", f);
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
  return td__write_out(ranks, n, world, NULL, path, err, errlen, chrome_body);
}

int tr_write_chrome_marked(const tr_rank *ranks, int n, int world, const tr_marks *marks,
                           const char *path, char *err, size_t errlen) {
  return td__write_out(ranks, n, world, marks, path, err, errlen, chrome_body);
}
