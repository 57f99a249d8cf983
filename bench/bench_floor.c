/* bench_floor - the physical floor of the gradient sync on this machine
 * (issue 23): N threads, each memcpy'ing its own S-byte buffer into another
 * S-byte buffer of its own, all at once.
 *
 *   bench_floor PARAMS [--threads N] [--iters K] [--warmup W]
 *   bench_floor --bytes S [--threads N] [--iters K] [--warmup W]
 *
 * Why: a sync over N ranks on one host moves every rank's S gradient bytes
 * through memory at least once (in and out of the shared-memory transport,
 * at least a copy); N threads each copying S bytes at the same time is
 * what the memory system gives for that, with no communication, no
 * reduction and no page faults.  bench/run_sync.sh runs this program every
 * round beside bench_sync_mpi with N = np and S = the same bytes, and
 * judges meshpg's sync time (a) against it: (a)/floor.
 *
 * S: the f32 bytes of the parameter list PARAMS (`name elements shape`
 * lines, `#` starts a comment; elements x 4 summed over the lines), read
 * and checked as bench_sync_mpi reads it, so S is the bytes that program
 * syncs; or S given directly with --bytes.
 *
 * How: every thread allocates its two buffers itself (first touch: the
 * pages come from its own node where it first runs) once, and writes both
 * fully before any timing (pre-faulted: no page fault in the timed loop;
 * the RESULT line reports the faults per iteration, 0 in steady state).
 * Then W untimed warm-up iterations and K timed ones.  In every iteration
 * the threads meet at a barrier, each reads the clock as it leaves it,
 * copies, and reads the clock again; the iteration's time runs from the
 * earliest start (the common start) to the latest end (the last thread to
 * finish).  The threads are not pinned (run_sync.sh starts the MPI ranks
 * with --bind-to none too); with more threads than cores they share them,
 * as the ranks do.  After the loop every thread checks its copy.
 *
 * Defaults: N = 2, K = 20, W = 3.  Memory: 2 x S x N bytes.
 *
 * Output: one line (plus a "#" comment line), in the format of
 * bench_sync_mpi's and bench_raw_mpi's RESULT lines:
 *   RESULT M median_s=.. min_s=.. max_s=.. n=K bytes=S gbps=.. faults=..
 *          threads=N gbps_per_thread=.. gbps_total=..
 *          thread_gbps_min=.. thread_gbps_max=..
 * gbps = gbps_per_thread = S / median / 1e9 (the copied bytes of one thread
 * over the iteration's time, comparable with the sync's GB/s, which is S
 * over its time); gbps_total = N x that; thread_gbps_min and _max: S over
 * the median of one thread's own copy time (its own start to its own end),
 * for the slowest and the fastest thread.
 * Exit status 0, 1 when a buffer cannot be allocated, a thread cannot start
 * or a copy is wrong, 2 on a usage error. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"

#define MAX_THREADS 1024
#define MAX_ITERS 10000

/* The f32 bytes of the parameter list at `path`, read and checked by
 * bench_load_params (as bench_sync_mpi reads it).  Returns 0, or 1 with a
 * message. */
static int params_bytes(const char *path, size_t *bytes) {
  pdesc *v = NULL;
  int n = 0;
  if (bench_load_params("bench_floor", path, &v, &n)) return 1;
  unsigned long long total = 0;
  for (int i = 0; i < n; i++) total += v[i].count;
  free(v);
  *bytes = (size_t)total * 4;
  return 0;
}

typedef struct shared {
  size_t bytes;
  int threads, iters, warmup;
  pthread_barrier_t bar;
  atomic_int failed;           /* a thread could not allocate */
  double fault0, fault1;       /* thread 0: faults around the timed loop */
} shared;

typedef struct thread {
  shared *sh;
  int id, bad;
  double *start, *end; /* per iteration, warm-up included */
  pthread_t th;
} thread;

static void *thread_main(void *arg) {
  thread *t = arg;
  shared *sh = t->sh;
  void *p = NULL, *q = NULL;
  unsigned char *src = posix_memalign(&p, 4096, sh->bytes) ? NULL : p;
  unsigned char *dst = posix_memalign(&q, 4096, sh->bytes) ? NULL : q;
  if (!src || !dst) {
    atomic_store(&sh->failed, 1);
  } else {
    memset(src, 1 + t->id % 255, sh->bytes); /* pre-fault both */
    memset(dst, 0, sh->bytes);
  }
  pthread_barrier_wait(&sh->bar);
  if (atomic_load(&sh->failed)) goto out;
  for (int it = 0; it < sh->warmup + sh->iters; it++) {
    pthread_barrier_wait(&sh->bar);
    if (t->id == 0 && it == sh->warmup) sh->fault0 = minor_faults();
    t->start[it] = now_s();
    memcpy(dst, src, sh->bytes);
    t->end[it] = now_s();
  }
  pthread_barrier_wait(&sh->bar);
  if (t->id == 0) sh->fault1 = minor_faults();
  t->bad = memcmp(dst, src, sh->bytes) != 0;
out:
  free(src);
  free(dst);
  return NULL;
}

static int usage(void) {
  fprintf(stderr, "usage: bench_floor PARAMS|--bytes S [--threads N] [--iters K] "
                  "[--warmup W]\n");
  return 2;
}

/* A whole number in [lo, hi], or -1. */
static long long number(const char *s, long long lo, long long hi) {
  if (!s) return -1;
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (errno || end == s || *end || v < lo || v > hi) return -1;
  return v;
}

int main(int argc, char **argv) {
  const char *params = NULL;
  long long bytes = 0;
  int threads = 2, iters = 20, warmup = 3;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    long long x;
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      usage();
      return 0;
    } else if (!strcmp(a, "--threads")) {
      if ((x = number(v, 1, MAX_THREADS)) < 0) return usage();
      threads = (int)x, i++;
    } else if (!strcmp(a, "--iters")) {
      if ((x = number(v, 1, MAX_ITERS)) < 0) return usage();
      iters = (int)x, i++;
    } else if (!strcmp(a, "--warmup")) {
      if ((x = number(v, 0, MAX_ITERS)) < 0) return usage();
      warmup = (int)x, i++;
    } else if (!strcmp(a, "--bytes")) {
      if ((bytes = number(v, 1, (long long)1 << 46)) < 0) return usage();
      i++;
    } else if (a[0] != '-' && !params) {
      params = a;
    } else {
      return usage();
    }
  }
  if (!params == !bytes) return usage(); /* exactly one of the two */
  shared sh = {.threads = threads, .iters = iters, .warmup = warmup};
  if (params) {
    if (params_bytes(params, &sh.bytes)) return 2;
  } else {
    sh.bytes = (size_t)bytes;
  }
  atomic_init(&sh.failed, 0);
  const int total = warmup + iters;
  thread *t = calloc((size_t)threads, sizeof *t);
  double *it_t = calloc((size_t)iters, sizeof *it_t), *own = calloc((size_t)iters, sizeof *own);
  if (!t || !it_t || !own || pthread_barrier_init(&sh.bar, NULL, (unsigned)threads)) {
    fprintf(stderr, "bench_floor: out of memory\n");
    return 1;
  }
  int rc = 0, started = 0;
  for (int i = 0; i < threads && !rc; i++) {
    t[i].sh = &sh;
    t[i].id = i;
    t[i].start = calloc((size_t)total + 1, sizeof(double));
    t[i].end = calloc((size_t)total + 1, sizeof(double));
    if (!t[i].start || !t[i].end) rc = 1;
  }
  for (int i = 0; i < threads && !rc; i++) {
    if (pthread_create(&t[i].th, NULL, thread_main, &t[i])) rc = 1;
    else started++;
  }
  if (rc) {
    /* Nothing can be timed; threads already started wait at the barrier
     * for ever, so leave without joining them. */
    fprintf(stderr, "bench_floor: could not start %d threads\n", threads);
    return 1;
  }
  for (int i = 0; i < started; i++) pthread_join(t[i].th, NULL);
  if (atomic_load(&sh.failed)) {
    fprintf(stderr, "bench_floor: cannot allocate 2 x %zu bytes for each of %d threads\n",
            sh.bytes, threads);
    return 1;
  }
  for (int i = 0; i < threads; i++)
    if (t[i].bad) {
      fprintf(stderr, "bench_floor: FAIL: thread %d's copy differs from its source\n", i);
      rc = 1;
    }
  if (rc) return 1;

  /* Iteration k: from the earliest start to the latest end. */
  for (int k = 0; k < iters; k++) {
    double s = t[0].start[warmup + k], e = t[0].end[warmup + k];
    for (int i = 1; i < threads; i++) {
      if (t[i].start[warmup + k] < s) s = t[i].start[warmup + k];
      if (t[i].end[warmup + k] > e) e = t[i].end[warmup + k];
    }
    it_t[k] = e - s;
  }
  /* Each thread's own median copy time: the slowest and fastest thread. */
  double own_lo = 0, own_hi = 0;
  for (int i = 0; i < threads; i++) {
    for (int k = 0; k < iters; k++) own[k] = t[i].end[warmup + k] - t[i].start[warmup + k];
    double m = median(own, iters);
    if (i == 0 || m < own_lo) own_lo = m;
    if (i == 0 || m > own_hi) own_hi = m;
  }
  double mn = it_t[0], mx = it_t[0];
  for (int k = 1; k < iters; k++) {
    if (it_t[k] < mn) mn = it_t[k];
    if (it_t[k] > mx) mx = it_t[k];
  }
  double md = median(it_t, iters), b = (double)sh.bytes;
  double faults = (sh.fault1 - sh.fault0) / iters;
  printf("RESULT M median_s=%.6f min_s=%.6f max_s=%.6f n=%d bytes=%.0f gbps=%.4f "
         "faults=%.0f threads=%d gbps_per_thread=%.4f gbps_total=%.4f "
         "thread_gbps_min=%.4f thread_gbps_max=%.4f\n",
         md, mn, mx, iters, b, b / md / 1e9, faults, threads, b / md / 1e9,
         threads * b / md / 1e9, b / own_hi / 1e9, b / own_lo / 1e9);
  printf("#   M: floor, %d threads each memcpy %.2f MB into a buffer of its own, at once: "
         "median %.2f ms (min %.2f, max %.2f, %d iters), %.3f GB/s per thread, "
         "%.3f GB/s in all\n",
         threads, b / 1e6, md * 1e3, mn * 1e3, mx * 1e3, iters, b / md / 1e9,
         threads * b / md / 1e9);
  fflush(stdout);
  for (int i = 0; i < threads; i++) {
    free(t[i].start);
    free(t[i].end);
  }
  pthread_barrier_destroy(&sh.bar);
  free(t);
  free(it_t);
  free(own);
  return 0;
}
