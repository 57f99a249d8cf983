/* What the analysis of the flight recorder's dumps reports (ta_report and
 * its parts), apart from the functions that make it (trace_analyze.h): the
 * analyzer's helpers (trace_analyze_shared.h) fill it without depending
 * on trace_analyze.c (tests/layout/check_layout.py, rule 2b). */
#ifndef TOOLS_TRACE_ANALYZE_REPORT_H
#define TOOLS_TRACE_ANALYZE_REPORT_H

#include <stdint.h>

#include "trace_read.h"

/* How a culprit is named (ta_item.how). */
typedef enum ta_how {
  TA_OTHER = 0,   /* a missing-rank line or anything below */
  TA_SKIPPED,     /* its list on a group lacks an operation its peers have */
  TA_DIFFERS,     /* it issued another operation (kind, dtype, count, ...) */
  TA_SWAPPED,     /* it issued two operations in the other order */
  TA_LATE,        /* it issued the operation after the others had failed */
  TA_NODUMP,      /* it left no dump */
  TA_ROOT         /* the root of the wait-for graph (never issued it) */
} ta_how;

/* A rank and a sentence about it (text: malloc'ed, one line).  For a
 * culprit, the operation that names it when there is one (for the
 * picture: the culprit's row is marked and this operation is drawn where
 * its peers have it): group "" when none. */
typedef struct ta_item {
  int rank; /* world rank */
  char *text;
  ta_how how;
  char group[TR_NAME + 16]; /* "tp[1]": NAME[INDEX] */
  uint64_t gseq;            /* its number there, as in the text */
  char kind[16];            /* the operation its peers issued there */
  int64_t peers_issue_ns;   /* the earliest issue of it among its peers, 0: unknown */
  int64_t peers_end_ns;     /* the latest end among them (0: pending or unknown) */
} ta_item;

/* One group instance as the dumps describe it. */
typedef struct ta_group {
  char name[TR_NAME];
  int index, size;
  int *ranks;          /* size world ranks, position order */
  uint64_t first, last; /* the collective numbers compared (0, 0: none) */
  int disagree;        /* 1: a ta_mismatch names it */
} ta_group;

/* The first disagreement on a group instance (its collectives), or on one
 * direction between two members (send #k of A to B and B's receive #k). */
typedef struct ta_mismatch {
  char group[TR_NAME + 16]; /* "dp_cp[3]" */
  char name[TR_NAME];
  int index;
  int p2p;         /* 0: a collective; 1: send #gseq from rank `from` to `to` */
  int from, to;    /* world ranks (p2p), else -1 */
  uint64_t gseq;
  char *text;      /* lines, '\n'-separated, no trailing newline */
} ta_mismatch;

typedef struct ta_report {
  int world, ndumps;
  char backend[MPG__TRACE_BACKEND_MAX + 1], mesh[TR_MESH], job[17];
  int fault;             /* 1: a failure was found (else: dumps on request) */
  int fault_rank;        /* world rank of the earliest failure, -1 */
  char fault_status[32]; /* its status name */
  int64_t fault_ns;      /* its time (ns since the epoch; the last dump's
                            time when there was none) */
  char *fault_text;      /* one line */
  ta_group *groups;
  int ngroups;
  ta_mismatch *mismatches;
  int nmismatches;
  ta_item *missing;      /* ranks without a dump: one item per run of
                            consecutive ranks (rank: its first) */
  int nmissing;
  ta_item *culprits;     /* text starts "culprit: world rank R: " */
  int nculprits;
  int nvictims;          /* ranks blocked at the failure, waiting on others */
} ta_report;

#endif
