/* Merging the flight recorder's dumps into "who is stuck where" (docs/trace.md,
 * "Reading a dump: meshpg trace"): for `meshpg trace` (tools/cmd_trace.c)
 * and the fault-injection tests (tests/trace/faults/).
 *
 * Input: the ranks' dumps as tr_read_dir gives them and the world size (a
 * rank without a dump was killed or hung and left none).  Output: the
 * earliest failure, per group instance (NAME[INDEX]) the first sequence
 * number where its members disagree, the ranks without a dump, and one
 * verdict per suspect, each naming a world rank: a member that issued
 * another operation than its peers (or than the other instances of its
 * dim set), a rank whose order of operations in a step differs from the
 * ranks that run the same program, and the roots of the wait-for graph at
 * the earliest failure (a rank that the blocked ranks wait for, directly
 * or through other blocked ranks, and that was not blocked itself). */
#ifndef TOOLS_TRACE_ANALYZE_H
#define TOOLS_TRACE_ANALYZE_H

#include "trace_analyze_report.h" /* ta_report and its parts */

/* Analyze ranks[0..n) (sorted by rank, as tr_read_dir) of a world of
 * `world` ranks (world < 1: the dumps' WORLD).  Fills *out (free it with
 * ta_report_free, also after a failure).  Returns 0, or -1 with a message
 * in err (no dump, dumps of different jobs or worlds, out of memory). */
int ta_analyze(const tr_rank *ranks, int n, int world, ta_report *out, char *err,
               size_t errlen);
void ta_report_free(ta_report *r);

#endif
