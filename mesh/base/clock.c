/* The library's monotonic clock (internal.h): every timeout, deadline and
 * duration of every module is measured with it; and its nap. */
#include <errno.h>
#include <time.h>

#include "internal.h"

double mpg__now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void mpg__sleep_ms(double ms) {
  struct timespec ts = {(time_t)(ms / 1000), (long)((ms - 1000.0 * (time_t)(ms / 1000)) * 1e6)};
  while (nanosleep(&ts, &ts) && errno == EINTR) {
  }
}
