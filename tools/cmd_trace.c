/* meshpg trace: merge the flight recorder's dumps of a directory
 * (docs/trace.md) into "who is stuck where": the first failure, per group
 * instance the first number where its members disagree, the ranks without
 * a dump and one `culprit:` line per suspect (tools/trace_analyze.h), as
 * text or JSON; and draw them (tools/trace_draw.h), the culprits marked.
 * --stragglers: instead, who arrives last at the collectives of a healthy
 * run (tools/trace_stragglers.h), the stragglers marked in the drawing. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd.h"
#include "trace_analyze.h"
#include "trace_draw.h"
#include "trace_read.h"
#include "trace_stragglers.h"

static const char trace_usage[] =
    "usage: meshpg trace DIR [--stragglers] [--json] [--svg FILE] [--chrome FILE]\n"
    "\n"
    "Merge the flight recorder's dumps DIR/rank-R.trace (written on a timeout,\n"
    "an abort or a desync, or by mpg_ctx_trace_dump) and say who is stuck\n"
    "where: the first failure, per group the first operation its members\n"
    "disagree on, the ranks that left no dump, and one line per suspect\n"
    "starting with 'culprit:' and naming its world rank.\n"
    "\n"
    "  --stragglers   instead, per dim set the world ranks that issue their\n"
    "                 collectives last (median and p95 of the lateness behind\n"
    "                 each collective's first member) and a verdict line naming\n"
    "                 the stragglers, 'no straggler' when none (exit 0 either way)\n"
    "  --json         print the report as one JSON document instead of text\n"
    "  --svg FILE     also draw the timeline (one row per rank) as SVG, the\n"
    "                 culprits (or, with --stragglers, the stragglers) marked\n"
    "  --chrome FILE  also write a Chrome trace (Perfetto, chrome://tracing)\n";

static void json_str(FILE *f, const char *s) {
  fputc('"', f);
  for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++) {
    if (*p == '"' || *p == '\\') fprintf(f, "\\%c", *p);
    else if (*p == '\n') fputs("\\n", f);
    else if (*p < 0x20 || *p >= 0x7f) fprintf(f, "\\u%04x", *p);
    else fputc(*p, f);
  }
  fputc('"', f);
}

static void json_items(FILE *f, const char *key, const ta_item *v, int n) {
  fprintf(f, ",\n  ");
  json_str(f, key);
  fprintf(f, ": [");
  for (int k = 0; k < n; k++) {
    fprintf(f, "%s\n    {\"rank\": %d, \"text\": ", k ? "," : "", v[k].rank);
    json_str(f, v[k].text);
    fputc('}', f);
  }
  fprintf(f, "%s]", n ? "\n  " : "");
}

/* The lines of `ignored` (tr_read_dir_newest) as a JSON array of strings. */
static void json_lines(FILE *f, const char *ignored) {
  fprintf(f, "[");
  int k = 0;
  for (const char *p = ignored; p && *p; k++) {
    const char *nl = strchr(p, '\n');
    size_t n = nl ? (size_t)(nl - p) : strlen(p);
    char *line = strndup(p, n);
    fprintf(f, "%s\n    ", k ? "," : "");
    json_str(f, line ? line : "");
    free(line);
    p += n + (nl != NULL);
  }
  fprintf(f, "%s]", k ? "\n  " : "");
}

/* The JSON reports' first fields: dir, ignored, world, dumps, backend,
 * mesh, job (no comma after the last). */
static void json_head(FILE *f, const char *dir, const char *ignored, int world, int ndumps,
                      const char *backend, const char *mesh, const char *job) {
  fprintf(f, "{\n  \"dir\": ");
  json_str(f, dir);
  fprintf(f, ",\n  \"ignored\": ");
  json_lines(f, ignored);
  fprintf(f, ",\n  \"world\": %d,\n  \"dumps\": %d,\n  \"backend\": ", world, ndumps);
  json_str(f, backend);
  fprintf(f, ",\n  \"mesh\": ");
  json_str(f, mesh);
  fprintf(f, ",\n  \"job\": ");
  json_str(f, job);
}

static void print_json(FILE *f, const char *dir, const ta_report *r, const char *ignored) {
  json_head(f, dir, ignored, r->world, r->ndumps, r->backend, r->mesh, r->job);
  fprintf(f, ",\n  \"fault\": {\"found\": %s, \"rank\": %d, \"status\": ",
          r->fault ? "true" : "false", r->fault_rank);
  json_str(f, r->fault_status);
  fprintf(f, ", \"time_ns\": %" PRId64 ", \"text\": ", r->fault_ns);
  json_str(f, r->fault_text);
  fprintf(f, "},\n  \"groups\": [");
  for (int k = 0; k < r->ngroups; k++) {
    const ta_group *g = &r->groups[k];
    fprintf(f, "%s\n    {\"name\": ", k ? "," : "");
    json_str(f, g->name);
    fprintf(f, ", \"index\": %d, \"size\": %d, \"ranks\": [", g->index, g->size);
    for (int q = 0; q < g->size; q++) fprintf(f, "%s%d", q ? ", " : "", g->ranks[q]);
    fprintf(f, "], \"first\": %" PRIu64 ", \"last\": %" PRIu64 ", \"disagree\": %s}", g->first,
            g->last, g->disagree ? "true" : "false");
  }
  fprintf(f, "%s],\n  \"mismatches\": [", r->ngroups ? "\n  " : "");
  for (int k = 0; k < r->nmismatches; k++) {
    const ta_mismatch *m = &r->mismatches[k];
    fprintf(f, "%s\n    {\"group\": ", k ? "," : "");
    json_str(f, m->group);
    fprintf(f, ", \"name\": ");
    json_str(f, m->name);
    fprintf(f, ", \"index\": %d, \"p2p\": %s, \"from\": %d, \"to\": %d, \"seq\": %" PRIu64
            ", \"text\": ", m->index, m->p2p ? "true" : "false", m->from, m->to, m->gseq);
    json_str(f, m->text);
    fputc('}', f);
  }
  fprintf(f, "%s]", r->nmismatches ? "\n  " : "");
  json_items(f, "missing", r->missing, r->nmissing);
  fprintf(f, ",\n  \"victims\": %d", r->nvictims);
  json_items(f, "culprits", r->culprits, r->nculprits);
  fprintf(f, "\n}\n");
}

/* The text reports' first lines: the dumps, and those of older jobs left
 * out. */
static void text_head(FILE *f, const char *dir, const char *ignored, int world, int ndumps,
                      const char *backend, const char *mesh, const char *job) {
  fprintf(f, "%s: %d of %d ranks left a dump (backend %s, mesh %s, job %s)\n", dir, ndumps,
          world, backend, mesh, job);
  if (ignored) {
    fprintf(f, "ignored, the dumps of an older job in the same directory:\n  ");
    for (const char *p = ignored; *p; p++) {
      fputc(*p, f);
      if (*p == '\n') fputs("  ", f);
    }
    fputc('\n', f);
  }
}

static void print_text(FILE *f, const char *dir, const ta_report *r, const char *ignored) {
  text_head(f, dir, ignored, r->world, r->ndumps, r->backend, r->mesh, r->job);
  fprintf(f, "first failure: %s\n", r->fault_text);
  fprintf(f, "\ngroups:\n");
  for (int k = 0; k < r->ngroups; k++) {
    const ta_group *g = &r->groups[k];
    fprintf(f, "  %s[%d] (world ranks", g->name, g->index);
    /* A long list: its head and tail (--json lists every member). */
    for (int q = 0; q < g->size; q++) {
      if (g->size > 32 && q == 8) {
        fprintf(f, ",...");
        q = g->size - 9;
        continue;
      }
      fprintf(f, "%s%d", q ? "," : " ", g->ranks[q]);
    }
    if (g->size > 32) fprintf(f, "; %d ranks", g->size);
    if (g->last)
      fprintf(f, "): collectives #%" PRIu64 "..#%" PRIu64 "%s\n", g->first, g->last,
              g->disagree ? ", disagree" : ", agree");
    else
      fprintf(f, "): no collective%s\n", g->disagree ? "; point to point disagrees" : "");
  }
  if (r->nmismatches) fprintf(f, "\nfirst disagreements:\n");
  for (int k = 0; k < r->nmismatches; k++) {
    fputs("  ", f);
    for (const char *p = r->mismatches[k].text; *p; p++) {
      fputc(*p, f);
      if (*p == '\n') fputs("  ", f);
    }
    fputc('\n', f);
  }
  if (r->nmissing) fprintf(f, "\nranks without a dump:\n");
  for (int k = 0; k < r->nmissing; k++) fprintf(f, "  %s\n", r->missing[k].text);
  fprintf(f, "\n%d rank%s blocked at the failure, waiting for others\n", r->nvictims,
          r->nvictims == 1 ? "" : "s");
  for (int k = 0; k < r->nculprits; k++) fprintf(f, "%s\n", r->culprits[k].text);
  if (!r->nculprits) fprintf(f, "no culprit found\n");
}

static double ms(int64_t ns) { return (double)ns / 1e6; }

/* --stragglers as text: per dim set its slowest ranks (at most 8 lines),
 * then the verdict. */
static void print_stragglers_text(FILE *f, const char *dir, const ts_report *r,
                                  const char *ignored) {
  text_head(f, dir, ignored, r->world, r->ndumps, r->backend, r->mesh, r->job);
  fprintf(f, "lateness: how long after a collective's first member each member issued it, over "
             "the collectives every member's ring holds; own: the part not spent waiting in "
             "the rank's previous operation\n");
  for (int d = 0; d < r->ndimsets; d++) {
    const ts_dimset *D = &r->dimsets[d];
    fprintf(f, "\n%s: %d group instance%s, %" PRIu64 " collectives, typical own lateness %.3f ms\n",
            D->name, D->instances, D->instances == 1 ? "" : "s", D->collectives, ms(D->typical));
    if (!D->nstats) continue;
    fprintf(f, "  world rank  median ms    p95 ms  own median ms  own p95 ms  collectives\n");
    for (int j = 0; j < D->nstats && j < 8; j++) {
      const ts_stat *S = &D->stats[j];
      fprintf(f, "  %10d %10.3f %9.3f %14.3f %11.3f %12d%s\n", S->rank, ms(S->late_median),
              ms(S->late_p95), ms(S->own_median), ms(S->own_p95), S->samples,
              S->straggler ? "  straggler" : "");
    }
    if (D->nstats > 8) fprintf(f, "  ... and %d more ranks (--json lists them)\n", D->nstats - 8);
  }
  fprintf(f, "\n%s\n", r->verdict);
}

/* --stragglers --json: every rank of every dim set. */
static void print_stragglers_json(FILE *f, const char *dir, const ts_report *r,
                                  const char *ignored) {
  json_head(f, dir, ignored, r->world, r->ndumps, r->backend, r->mesh, r->job);
  fprintf(f, ",\n  \"threshold\": {\"floor_ms\": %.3f, \"factor\": %d, \"min_collectives\": %d},"
             "\n  \"dimsets\": [",
          ms(TS_FLOOR_NS), TS_FACTOR, TS_MIN_SAMPLES);
  for (int d = 0; d < r->ndimsets; d++) {
    const ts_dimset *D = &r->dimsets[d];
    fprintf(f, "%s\n    {\"name\": ", d ? "," : "");
    json_str(f, D->name);
    fprintf(f, ", \"instances\": %d, \"collectives\": %" PRIu64 ", \"typical_ms\": %.6f, "
               "\"ranks\": [",
            D->instances, D->collectives, ms(D->typical));
    for (int j = 0; j < D->nstats; j++) {
      const ts_stat *S = &D->stats[j];
      fprintf(f, "%s\n      {\"rank\": %d, \"collectives\": %d, \"median_ms\": %.6f, "
                 "\"p95_ms\": %.6f, \"own_median_ms\": %.6f, \"own_p95_ms\": %.6f, "
                 "\"straggler\": %s}",
              j ? "," : "", S->rank, S->samples, ms(S->late_median), ms(S->late_p95),
              ms(S->own_median), ms(S->own_p95), S->straggler ? "true" : "false");
    }
    fprintf(f, "%s]}", D->nstats ? "\n    " : "");
  }
  fprintf(f, "%s],\n  \"stragglers\": [", r->ndimsets ? "\n  " : "");
  for (int j = 0; j < r->nstragglers; j++) fprintf(f, "%s%d", j ? ", " : "", r->stragglers[j]);
  fprintf(f, "],\n  \"verdict\": ");
  json_str(f, r->verdict);
  fprintf(f, "\n}\n");
}

/* --svg and --chrome with marks: TOOL_EXIT_OK or _FAIL (reported). */
static int draw(const tr_rank *ranks, int n, int world, const tr_marks *marks, const char *svg,
                const char *chrome) {
  char err[1024];
  int rc = TOOL_EXIT_OK;
  if (svg && tr_write_svg_marked(ranks, n, world, marks, svg, err, sizeof err)) {
    tool_error("trace: --svg %s: %s", svg, err);
    rc = TOOL_EXIT_FAIL;
  }
  if (chrome && tr_write_chrome_marked(ranks, n, world, marks, chrome, err, sizeof err)) {
    tool_error("trace: --chrome %s: %s", chrome, err);
    rc = TOOL_EXIT_FAIL;
  }
  return rc;
}

/* --stragglers: the report of ranks[0..n) and its drawings. */
static int trace_stragglers(const char *dir, const tr_rank *ranks, int n, const char *ignored,
                            int json, const char *svg, const char *chrome) {
  char err[1024];
  ts_report rep;
  int rc = TOOL_EXIT_OK;
  if (ts_analyze(ranks, n, &rep, err, sizeof err)) {
    tool_error("trace: %s: %s", dir, err);
    ts_report_free(&rep);
    return TOOL_EXIT_FAIL;
  }
  if (json) print_stragglers_json(stdout, dir, &rep, ignored);
  else print_stragglers_text(stdout, dir, &rep, ignored);
  tr_slow *slow = calloc((size_t)rep.nstragglers + 1, sizeof *slow);
  char (*notes)[TR_NAME + 96] = calloc((size_t)rep.nstragglers + 1, sizeof *notes);
  if (!slow || !notes) {
    tool_error("trace: out of memory");
    rc = TOOL_EXIT_FAIL;
  } else {
    for (int k = 0; k < rep.nstragglers; k++) {
      const ts_stat *st;
      const ts_dimset *d = ts_worst(&rep, rep.stragglers[k], &st);
      slow[k].rank = rep.stragglers[k];
      if (d)
        snprintf(notes[k], sizeof notes[k], "%.3f ms behind on %s, %.3f ms its own",
                 (double)st->late_median / 1e6, d->name, (double)st->own_median / 1e6);
      slow[k].note = notes[k];
    }
    tr_marks marks = {.slow = slow, .nslow = rep.nstragglers};
    rc = draw(ranks, n, rep.world, &marks, svg, chrome);
  }
  fflush(stdout);
  free(slow);
  free(notes);
  ts_report_free(&rep);
  return rc;
}

int cmd_trace(int argc, char **argv) {
  const char *dir = NULL, *svg = NULL, *chrome = NULL;
  int json = 0, stragglers = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      fputs(trace_usage, stdout);
      return TOOL_EXIT_OK;
    } else if (!strcmp(a, "--json")) {
      json = 1;
    } else if (!strcmp(a, "--stragglers")) {
      stragglers = 1;
    } else if (!strcmp(a, "--svg") || !strcmp(a, "--chrome")) {
      if (i + 1 >= argc) {
        tool_error("trace: %s needs a file name", a);
        tool_usage_hint(trace_usage);
        return TOOL_EXIT_USAGE;
      }
      if (!strcmp(a, "--svg")) svg = argv[++i];
      else chrome = argv[++i];
    } else if (a[0] == '-' && a[1]) {
      tool_error("trace: unknown option \"%s\"", a);
      tool_usage_hint(trace_usage);
      return TOOL_EXIT_USAGE;
    } else if (dir) {
      tool_error("trace: one directory only (\"%s\" and \"%s\")", dir, a);
      tool_usage_hint(trace_usage);
      return TOOL_EXIT_USAGE;
    } else {
      dir = a;
    }
  }
  if (!dir) {
    tool_error("trace: give the directory of the dumps");
    tool_usage_hint(trace_usage);
    return TOOL_EXIT_USAGE;
  }
  char err[1024];
  tr_rank *ranks = NULL;
  int n = 0;
  char *ignored = NULL;
  if (tr_read_dir_newest(dir, &ranks, &n, &ignored, err, sizeof err)) {
    tool_error("trace: %s", err);
    return TOOL_EXIT_FAIL;
  }
  if (stragglers) {
    int rc = trace_stragglers(dir, ranks, n, ignored, json, svg, chrome);
    tr_ranks_free(ranks, n);
    free(ignored);
    return rc;
  }
  ta_report rep;
  int rc = TOOL_EXIT_OK;
  if (ta_analyze(ranks, n, 0, &rep, err, sizeof err)) {
    tool_error("trace: %s: %s", dir, err);
    rc = TOOL_EXIT_FAIL;
  } else {
    if (json) print_json(stdout, dir, &rep, ignored);
    else print_text(stdout, dir, &rep, ignored);
    tr_marks marks = {.culprits = rep.culprits, .nculprits = rep.nculprits};
    rc = draw(ranks, n, rep.world, &marks, svg, chrome);
  }
  fflush(stdout);
  ta_report_free(&rep);
  tr_ranks_free(ranks, n);
  free(ignored);
  return rc;
}
