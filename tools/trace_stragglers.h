/* Who slows a healthy job (docs/trace.md, "Stragglers"): from the
 * flight recorder's dumps, per group dim set (tp, dp, pp, dp_cp, ...) and
 * over the collectives every member's ring holds, how late each world
 * rank issues its collectives behind the first member of the group that
 * issued them, and which ranks are stragglers.  For `meshpg trace
 * --stragglers` (tools/cmd_trace.c prints it) and examples/gpt's --trace.
 *
 * A collective instance is one group instance (NAME[INDEX]) and one number
 * on it (GSEQ); it counts when every member that left a dump holds it in
 * its ring (two members at least).  A member's lateness there is its issue
 * time minus the earliest issue among the members.  Its own lateness is
 * the part it spent computing: the lateness, but at most the time since
 * its previous operation ended (or, when that operation was still in
 * flight, since it was issued), so that a rank that arrives late because
 * it waited for a straggler in its previous collective is not blamed.
 * A rank is a straggler of a dim set when it has at least TS_MIN_SAMPLES
 * collectives there and the median of its own lateness is at least
 * TS_FLOOR_NS and at least TS_FACTOR times the dim set's typical own
 * lateness (the median over its ranks of their medians).  Sends and
 * receives are not counted (a pipeline's stages wait for each other by
 * design).  Linear in the dumps' operations (two counting sorts). */
#ifndef TOOLS_TRACE_STRAGGLERS_H
#define TOOLS_TRACE_STRAGGLERS_H

#include <stdint.h>
#include <stddef.h>

#include "trace_read.h"

#define TS_FLOOR_NS INT64_C(500000) /* 0.5 ms */
#define TS_FACTOR 4
#define TS_MIN_SAMPLES 5

/* One rank on one dim set. */
typedef struct ts_stat {
  int rank;                     /* world rank */
  int samples;                  /* collectives counted */
  int64_t late_median, late_p95; /* lateness behind the first arrival, ns */
  int64_t own_median, own_p95;  /* the part of its own making, ns */
  int straggler;                /* 1: over the threshold */
} ts_stat;

/* One dim set: its ranks, the slowest first (own_median descending). */
typedef struct ts_dimset {
  char name[TR_NAME];
  int instances;         /* group instances with a counted collective */
  uint64_t collectives;  /* collective instances counted */
  int64_t typical;       /* the median of its ranks' own_median, ns */
  ts_stat *stats;
  int nstats;
} ts_dimset;

typedef struct ts_report {
  int world, ndumps;
  char backend[MPG__TRACE_BACKEND_MAX + 1], mesh[TR_MESH], job[17];
  ts_dimset *dimsets; /* by name */
  int ndimsets;
  int *stragglers;    /* world ranks, the slowest first */
  int nstragglers;
  char *verdict;      /* one line: "stragglers: world rank 3: ..." or "no straggler ..." */
} ts_report;

/* The report of ranks[0..n) (as tr_read_dir gives them: one job).  Fills
 * *out (free with ts_report_free, also after a failure).  Returns 0, or -1
 * with a message in err (no dumps, out of memory). */
int ts_analyze(const tr_rank *ranks, int n, ts_report *out, char *err, size_t errlen);
void ts_report_free(ts_report *r);

/* rank's worst dim set in r (the largest own median among those where it
 * is a straggler), or NULL; *stat its line there. */
const ts_dimset *ts_worst(const ts_report *r, int rank, const ts_stat **stat);

#endif
