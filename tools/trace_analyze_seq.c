/* Sequence evidence (issue 46, items 1-2; trace_analyze_internal.h): a
 * member of a group instance whose list of operations there lacks one
 * that its peers hold.  Being written (issue 46). */
#include "trace_analyze_internal.h"

void ta__check_seq(an *a) { (void)a; }
