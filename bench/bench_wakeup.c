/* bench_wakeup - what one wake-up of a sleeping thread costs the threads
 * that keep the cores busy, on this machine (issue 13).
 *
 *   bench_wakeup [--workers N] [--sleepers M] [--period-us P] [--seconds S]
 *                [--rounds K]
 *
 * Why: bench_sync_mpi's mode (g) models a trainer whose host thread sleeps
 * while a device computes, and wakes for every parameter to call
 * mpg_sync_mark_ready (about 110 times a step for gpt-small).  With as
 * many ranks as cores, the MPI backend's progress threads keep every core
 * busy moving the buckets, so each such wake-up lands on a core that is
 * communicating and takes the CPU time of the timer interrupt, two
 * context switches and the mark itself away from the communication.  On
 * a virtual machine an interrupt on a running virtual CPU is expensive.
 * This program measures that cost, so that run_sync.sh can say how much
 * of (g)'s exposure comes from the host's own wake-ups.
 *
 * How: N worker threads spin on fixed units of arithmetic for S seconds
 * (a baseline), then the same with M extra threads sleeping with
 * clock_nanosleep(TIMER_ABSTIME) to deadlines P us apart (as the (g)
 * schedule does).  The cost of one wake-up is the workers' lost core time
 * divided by the number of wake-ups:
 *   cost_us = (1 - units_with / units_base) * N * S / wakeups * 1e6.
 * The two phases alternate K times and the median cost is reported.
 * Defaults: N = M = online cores ("busy": every core also runs a worker,
 * as np = cores ranks do), P = 150 us, S = 0.5 s, K = 3.  When N + M
 * <= cores, the sleepers wake on spare cores and cost the workers little
 * (run --workers 1 --sleepers 1 on 2 cores to see it).
 *
 * Output: one line
 *   RESULT wakeup cost_us=C workers=N sleepers=M period_us=P wakeups_per_s=W
 *          loss_pct=L cores=K
 * and a comment line.  Exit status 0, or 2 on a usage error. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef struct phase {
  double seconds, period;
  atomic_int stop;
} phase;

typedef struct worker {
  phase *ph;
  long units;
  double sink; /* the workers' arithmetic, kept so it is not optimised out */
  pthread_t th;
} worker;

/* Spin on units of arithmetic until the phase's time is up. */
static void *work_main(void *arg) {
  worker *w = arg;
  volatile double x = 0;
  long n = 0;
  double end = now_s() + w->ph->seconds;
  while (now_s() < end) {
    for (int i = 0; i < 1000; i++) x += (double)i;
    n++;
  }
  w->units = n;
  w->sink = x;
  return NULL;
}

/* Sleep to deadlines `period` apart until stopped; count the sleeps. */
static void *sleep_main(void *arg) {
  worker *w = arg;
  double d = now_s();
  long n = 0;
  while (!atomic_load(&w->ph->stop)) {
    d += w->ph->period;
    struct timespec ts;
    ts.tv_sec = (time_t)d;
    ts.tv_nsec = (long)((d - (double)ts.tv_sec) * 1e9);
    if (ts.tv_nsec >= 1000000000L) ts.tv_nsec = 999999999L;
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
    }
    n++;
  }
  w->units = n;
  return NULL;
}

/* One phase: nw workers and ns sleepers; returns the workers' units and
 * sets *wakeups.  Returns -1 if a thread could not start. */
static long run_phase(int nw, int ns, double seconds, double period, long *wakeups) {
  phase ph = {seconds, period, 0};
  worker *w = calloc((size_t)(nw + ns), sizeof *w);
  if (!w) return -1;
  int started = 0, ok = 1;
  for (int i = 0; i < ns && ok; i++, started++) {
    w[i].ph = &ph;
    ok = pthread_create(&w[i].th, NULL, sleep_main, &w[i]) == 0;
  }
  for (int i = ns; i < ns + nw && ok; i++, started++) {
    w[i].ph = &ph;
    ok = pthread_create(&w[i].th, NULL, work_main, &w[i]) == 0;
  }
  if (!ok) started--;
  long units = 0;
  for (int i = ns; i < started; i++) {
    pthread_join(w[i].th, NULL);
    units += w[i].units;
  }
  atomic_store(&ph.stop, 1);
  *wakeups = 0;
  for (int i = 0; i < ns && i < started; i++) {
    pthread_join(w[i].th, NULL);
    *wakeups += w[i].units;
  }
  free(w);
  return ok ? units : -1;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static int usage(void) {
  fprintf(stderr, "usage: bench_wakeup [--workers N] [--sleepers M] [--period-us P] "
                  "[--seconds S] [--rounds K]\n");
  return 2;
}

int main(int argc, char **argv) {
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  if (cores < 1) cores = 1;
  int nw = (int)cores, ns = (int)cores, rounds = 3;
  double period_us = 150, seconds = 0.5;
  for (int i = 1; i < argc; i += 2) {
    if (i + 1 >= argc) return usage();
    char *end = NULL;
    double v = strtod(argv[i + 1], &end);
    if (!end || *end || v <= 0) return usage();
    if (strcmp(argv[i], "--workers") == 0) nw = (int)v;
    else if (strcmp(argv[i], "--sleepers") == 0) ns = (int)v;
    else if (strcmp(argv[i], "--period-us") == 0) period_us = v;
    else if (strcmp(argv[i], "--seconds") == 0) seconds = v;
    else if (strcmp(argv[i], "--rounds") == 0) rounds = (int)v;
    else return usage();
  }
  if (nw < 1 || ns < 1 || rounds < 1 || rounds > 99) return usage();
  double cost[99], loss[99], rate[99];
  for (int r = 0; r < rounds; r++) {
    long wk = 0, wk0 = 0;
    long base = run_phase(nw, 0, seconds, 1.0, &wk0);
    long with = run_phase(nw, ns, seconds, period_us * 1e-6, &wk);
    if (base <= 0 || with < 0 || wk <= 0) {
      fprintf(stderr, "bench_wakeup: could not start the threads\n");
      return 1;
    }
    double lost = 1.0 - (double)with / (double)base;
    loss[r] = 100.0 * lost;
    cost[r] = lost * nw * seconds / (double)wk * 1e6;
    rate[r] = (double)wk / seconds;
  }
  qsort(cost, (size_t)rounds, sizeof cost[0], cmp_double);
  qsort(loss, (size_t)rounds, sizeof loss[0], cmp_double);
  qsort(rate, (size_t)rounds, sizeof rate[0], cmp_double);
  printf("RESULT wakeup cost_us=%.2f workers=%d sleepers=%d period_us=%.0f "
         "wakeups_per_s=%.0f loss_pct=%.2f cores=%ld\n",
         cost[rounds / 2], nw, ns, period_us, rate[rounds / 2], loss[rounds / 2], cores);
  printf("# %d busy threads on %ld cores lose %.1f %% of their work to %d threads waking "
         "every %.0f us: %.1f us of core time per wake-up (median of %d rounds, "
         "%.1f..%.1f)\n",
         nw, cores, loss[rounds / 2], ns, period_us, cost[rounds / 2], rounds, cost[0],
         cost[rounds - 1]);
  return 0;
}
