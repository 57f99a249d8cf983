/* Drawing the flight recorder's dumps (docs/trace.md, "The picture"): an
 * SVG timeline and a Chrome trace event file (Perfetto, chrome://tracing).
 * For `meshpg trace --svg/--chrome` (tools/cmd_trace.c) and examples/gpt's
 * --trace. */
#ifndef TOOLS_TRACE_DRAW_H
#define TOOLS_TRACE_DRAW_H

#include <stddef.h>

#include "trace_read.h"

/* An SVG timeline of ranks[0..n) (as tr_read_dir gives them) written to
 * path: one row per world rank 0..world-1 (a rank without a dump is an
 * empty row labelled "no dump"), each operation a rectangle from its start
 * (or issue) to its end (a pending one: to its rank's dump time), coloured
 * by group name, the wait from issue to start lighter, failed and pending
 * operations outlined in red and the earliest failure marked by a labelled
 * vertical line.  world < 1: the largest WORLD of the dumps.  Returns 0, or
 * -1 with a message in err. */
int tr_write_svg(const tr_rank *ranks, int n, int world, const char *path, char *err,
                 size_t errlen);

/* The same operations as Chrome trace event JSON ({"traceEvents": [...]}):
 * one process per rank (pid = world rank, named "rank R"), one thread per
 * group name, a complete ("X") event per operation with its details in
 * args (ts and dur in microseconds from the earliest time of the dumps) and
 * an instant event at the earliest failure.  Returns 0, or -1 with err. */
int tr_write_chrome(const tr_rank *ranks, int n, int world, const char *path, char *err,
                    size_t errlen);

#endif
