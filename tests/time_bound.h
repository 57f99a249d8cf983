/* Moved to tests/support/time_bound.h; this name stays for the suites of
 * tests/double that still include it. */
#include "support/time_bound.h"
