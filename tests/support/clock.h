/* Seconds on the monotonic clock, and a sleep (tests/support/clock.c). */
#ifndef MPG_TESTS_SUPPORT_CLOCK_H
#define MPG_TESTS_SUPPORT_CLOCK_H

/* Seconds on the monotonic clock. */
double now_s(void);

/* Sleep s seconds (resumed after a signal). */
void sleep_s(double s);

#endif
