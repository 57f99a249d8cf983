/* The library's monotonic clock (internal.h): every timeout, deadline and
 * duration of every module is measured with it. */
#include <time.h>

#include "internal.h"

double mpg__now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
