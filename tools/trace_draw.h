/* Drawing the flight recorder's dumps (docs/trace.md, "The picture"): an
 * SVG timeline and a Chrome trace event file (Perfetto, chrome://tracing).
 * For `meshpg trace --svg/--chrome` (tools/cmd_trace.c) and examples/gpt's
 * --trace. */
#ifndef TOOLS_TRACE_DRAW_H
#define TOOLS_TRACE_DRAW_H

#include <stddef.h>

#include "trace_analyze.h"
#include "trace_read.h"

/* A straggler to mark (tools/trace_stragglers.h): its world rank and a
 * note (its row's tooltip and the picture's heading). */
typedef struct tr_slow {
  int rank;
  const char *note;
} tr_slow;

/* What the picture marks beside the dumps (docs/trace.md, "The picture"):
 * the analyzer's culprits (ta_report.culprits): each culprit's row gets a
 * red band and label, and when the item names an operation (group, gseq)
 * that operation is drawn on the culprit's row where its peers have it
 * (peers_issue_ns..peers_end_ns; from the peers' dumps when 0): a hatched
 * box "missing: all_reduce #8 on tp[1]" for a skipped or never issued one,
 * and for one it issued differently (or swapped, or late) its own
 * rectangle at least 4 px wide with a purple outline, beside a box
 * "differs: ..." at the peers' time; and the stragglers (an orange band and
 * label, a note under the heading).  Everything may be NULL / 0. */
typedef struct tr_marks {
  const ta_item *culprits;
  int nculprits;
  const tr_slow *slow;
  int nslow;
} tr_marks;

/* An SVG timeline of ranks[0..n) (as tr_read_dir gives them) written to
 * path: one row per world rank 0..world-1 (a rank without a dump is an
 * empty row labelled "no dump"), each operation a rectangle from its start
 * (or issue) to its end (a pending one: to its rank's dump time), coloured
 * by group name, the wait from issue to start lighter, failed and pending
 * operations outlined in red and the earliest failure marked by a vertical
 * line labelled with its status, world rank and operation (a dump written
 * for a fault without a failed operation: its reason, the rank and its
 * pending, else last, operation).  world < 1: the largest WORLD of the dumps.  Returns 0, or
 * -1 with a message in err. */
int tr_write_svg(const tr_rank *ranks, int n, int world, const char *path, char *err,
                 size_t errlen);
/* The same with marks (NULL: none, as tr_write_svg). */
int tr_write_svg_marked(const tr_rank *ranks, int n, int world, const tr_marks *marks,
                        const char *path, char *err, size_t errlen);

/* The same operations as Chrome trace event JSON ({"traceEvents": [...]}):
 * one process per rank (pid = world rank, named "rank R"), one thread per
 * group name, a complete ("X") event per operation with its details in
 * args (ts and dur in microseconds from the earliest time of the dumps) and
 * an instant event at the earliest failure.  Returns 0, or -1 with err. */
int tr_write_chrome(const tr_rank *ranks, int n, int world, const char *path, char *err,
                    size_t errlen);
/* The same with marks: a culprit's or straggler's process is named "rank R
 * (culprit)" / "rank R (straggler)", and a culprit's missing or differing
 * operation is an instant event on its process at the peers' time. */
int tr_write_chrome_marked(const tr_rank *ranks, int n, int world, const tr_marks *marks,
                           const char *path, char *err, size_t errlen);

#endif
