/* bench_floor - the physical floor of the gradient sync on this machine
 * (issues 23, 34): N threads, each copying its own S-byte buffer into
 * another S-byte buffer of its own, all at once, as fast as this machine
 * does it.
 *
 *   bench_floor PARAMS [--threads N] [--iters K] [--warmup W] [--loops L]
 *   bench_floor --bytes S [--threads N] [--iters K] [--warmup W] [--loops L]
 *
 * Why: a sync over N ranks on one host moves every rank's S gradient bytes
 * through memory at least once (in and out of the shared-memory transport,
 * at least a copy); N threads each copying S bytes at the same time is
 * what the memory system gives for that, with no communication, no
 * reduction and no page faults.  bench/run_sync.sh runs this program every
 * round beside bench_sync_mpi with N = np and S = the same bytes, and
 * judges meshpg's sync time (a) against it: (a)/floor.
 *
 * A floor is the fastest the machine does the copy (issue 34): so the
 * floor is the BEST iteration, not the median, of the fastest copy loop.
 * The candidate loops (bench_copy.h): glibc's memcpy, a plain vector loop,
 * `rep movsb` and SSE2 non-temporal stores (the last two on x86-64 only);
 * --loops L (comma-separated names, or "all", the default) picks some.
 * Every iteration runs every selected loop in turn, each after its own
 * barrier, so a noisy neighbour hits them alike.
 *
 * S: the f32 bytes of the parameter list PARAMS (`name elements shape`
 * lines, `#` starts a comment; elements x 4 summed over the lines), read
 * and checked as bench_sync_mpi reads it, so S is the bytes that program
 * syncs; or S given directly with --bytes.
 *
 * How: every thread allocates its two buffers itself (first touch: the
 * pages come from its own node where it first runs) once, and writes both
 * fully before any timing (pre-faulted: no page fault in the timed loop;
 * the RESULT line reports the faults per copy, 0 in steady state).  Then
 * W untimed warm-up iterations and K timed ones.  In every iteration and
 * for every loop the threads meet at a barrier, each reads the clock as it
 * leaves it, copies, and reads the clock again; the copy's time runs from
 * the earliest start (the common start) to the latest end (the last
 * thread to finish).  The threads are not pinned (run_sync.sh starts the
 * MPI ranks with --bind-to none too); with more threads than cores they
 * share them, as the ranks do.  After the loop every thread checks its
 * copy.
 *
 * Defaults: N = 2, K = 20, W = 3, L = all.  Memory: 2 x S x N bytes.
 *
 * Output: one RESULT line (plus "#" comment lines: one per loop, then the
 * floor), in the format of bench_sync_mpi's and bench_raw_mpi's RESULT
 * lines:
 *   RESULT M floor_s=.. loop=NAME median_s=.. min_s=.. max_s=.. n=K
 *          bytes=S gbps=.. faults=.. threads=N gbps_per_thread=..
 *          gbps_total=.. thread_gbps_min=.. thread_gbps_max=..
 *          loops=NAME,.. best_s_NAME=.. median_s_NAME=.. (per loop)
 * floor_s: the floor, the best iteration of the fastest loop (= min_s);
 * loop: that loop; median_s, min_s, max_s: that loop's median, best and
 * worst iteration; gbps = gbps_per_thread = S / floor_s / 1e9 (one
 * thread's bytes over the floor, comparable with the sync's GB/s, which is
 * S over its time); gbps_total = N x that; thread_gbps_min and _max: S
 * over the best of one thread's own copy times (its own start to its own
 * end) with that loop, for the slowest and the fastest thread.
 * Exit status 0, 1 when a buffer cannot be allocated, a thread cannot start
 * or a copy is wrong, 2 on a usage error. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_copy.h"
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
  int nloops;                  /* the selected loops */
  bench_copy_loop loop[8];
  pthread_barrier_t bar;
  atomic_int failed;           /* a thread could not allocate */
  double fault0, fault1;       /* thread 0: faults around the timed loop */
} shared;

typedef struct thread {
  shared *sh;
  int id, bad;
  double *start, *end; /* [loop][iteration], warm-up included */
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
  const int total = sh->warmup + sh->iters;
  for (int it = 0; it < total; it++)
    for (int l = 0; l < sh->nloops; l++) {
      pthread_barrier_wait(&sh->bar);
      if (t->id == 0 && it == sh->warmup && l == 0) sh->fault0 = minor_faults();
      size_t k = (size_t)l * (size_t)total + (size_t)it;
      t->start[k] = now_s();
      sh->loop[l].copy(dst, src, sh->bytes);
      t->end[k] = now_s();
      if (it == total - 1 && memcmp(dst, src, sh->bytes)) t->bad = 1;
    }
  pthread_barrier_wait(&sh->bar);
  if (t->id == 0) sh->fault1 = minor_faults();
out:
  free(src);
  free(dst);
  return NULL;
}

static int usage(void) {
  fprintf(stderr, "usage: bench_floor PARAMS|--bytes S [--threads N] [--iters K] "
                  "[--warmup W] [--loops NAME,...|all]\n");
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

/* One loop's figures over the timed iterations. */
typedef struct loop_stats {
  double median, best, worst;
  double own_lo, own_hi; /* the fastest and slowest thread's own best copy */
} loop_stats;

int main(int argc, char **argv) {
  const char *params = NULL, *loops = "all";
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
    } else if (!strcmp(a, "--loops")) {
      if (!v) return usage();
      loops = v, i++;
    } else if (a[0] != '-' && !params) {
      params = a;
    } else {
      return usage();
    }
  }
  if (!params == !bytes) return usage(); /* exactly one of the two */
  unsigned mask = bench_copy_select("bench_floor", loops);
  if (!mask) return 2;
  shared sh = {.threads = threads, .iters = iters, .warmup = warmup};
  {
    int n;
    const bench_copy_loop *all = bench_copy_loops(&n);
    for (int i = 0; i < n; i++)
      if (mask & (1u << i)) sh.loop[sh.nloops++] = all[i];
  }
  if (params) {
    if (params_bytes(params, &sh.bytes)) return 2;
  } else {
    sh.bytes = (size_t)bytes;
  }
  atomic_init(&sh.failed, 0);
  const int total = warmup + iters, nl = sh.nloops;
  thread *t = calloc((size_t)threads, sizeof *t);
  double *it_t = calloc((size_t)iters, sizeof *it_t), *own = calloc((size_t)iters, sizeof *own);
  loop_stats *st = calloc((size_t)nl, sizeof *st);
  if (!t || !it_t || !own || !st || pthread_barrier_init(&sh.bar, NULL, (unsigned)threads)) {
    fprintf(stderr, "bench_floor: out of memory\n");
    return 1;
  }
  int rc = 0, started = 0;
  for (int i = 0; i < threads && !rc; i++) {
    t[i].sh = &sh;
    t[i].id = i;
    t[i].start = calloc((size_t)nl * (size_t)total + 1, sizeof(double));
    t[i].end = calloc((size_t)nl * (size_t)total + 1, sizeof(double));
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

  int win = 0;
  for (int l = 0; l < nl; l++) {
    size_t base = (size_t)l * (size_t)total + (size_t)warmup;
    /* Iteration k: from the earliest start to the latest end. */
    for (int k = 0; k < iters; k++) {
      double s = t[0].start[base + k], e = t[0].end[base + k];
      for (int i = 1; i < threads; i++) {
        if (t[i].start[base + k] < s) s = t[i].start[base + k];
        if (t[i].end[base + k] > e) e = t[i].end[base + k];
      }
      it_t[k] = e - s;
    }
    /* Each thread's own best copy time: the slowest and fastest thread. */
    for (int i = 0; i < threads; i++) {
      double b = 0;
      for (int k = 0; k < iters; k++) {
        own[k] = t[i].end[base + k] - t[i].start[base + k];
        if (k == 0 || own[k] < b) b = own[k];
      }
      if (i == 0 || b < st[l].own_lo) st[l].own_lo = b;
      if (i == 0 || b > st[l].own_hi) st[l].own_hi = b;
    }
    st[l].best = st[l].worst = it_t[0];
    for (int k = 1; k < iters; k++) {
      if (it_t[k] < st[l].best) st[l].best = it_t[k];
      if (it_t[k] > st[l].worst) st[l].worst = it_t[k];
    }
    st[l].median = median(it_t, iters);
    if (st[l].best < st[win].best) win = l;
  }
  const loop_stats *w = &st[win];
  double fl = w->best, b = (double)sh.bytes;
  double faults = (sh.fault1 - sh.fault0) / ((double)iters * nl);
  printf("RESULT M floor_s=%.6f loop=%s median_s=%.6f min_s=%.6f max_s=%.6f n=%d bytes=%.0f "
         "gbps=%.4f faults=%.0f threads=%d gbps_per_thread=%.4f gbps_total=%.4f "
         "thread_gbps_min=%.4f thread_gbps_max=%.4f loops=",
         fl, sh.loop[win].name, w->median, w->best, w->worst, iters, b, b / fl / 1e9, faults,
         threads, b / fl / 1e9, threads * b / fl / 1e9, b / w->own_hi / 1e9,
         b / w->own_lo / 1e9);
  for (int l = 0; l < nl; l++) printf("%s%s", l ? "," : "", sh.loop[l].name);
  for (int l = 0; l < nl; l++)
    printf(" best_s_%s=%.6f median_s_%s=%.6f", sh.loop[l].name, st[l].best, sh.loop[l].name,
           st[l].median);
  printf("\n");
  for (int l = 0; l < nl; l++)
    printf("#   M loop %-7s best %8.2f ms, median %8.2f ms, worst %8.2f ms: %.3f GB/s per "
           "thread at its best%s\n",
           sh.loop[l].name, st[l].best * 1e3, st[l].median * 1e3, st[l].worst * 1e3,
           b / st[l].best / 1e9, l == win ? "  <- fastest" : "");
  printf("#   M: floor, %d threads each copy %.2f MB into a buffer of its own, at once: "
         "best %.2f ms with %s (of %d iters x %d loops; its median %.2f ms), %.3f GB/s per "
         "thread, %.3f GB/s in all\n",
         threads, b / 1e6, fl * 1e3, sh.loop[win].name, iters, nl, w->median * 1e3,
         b / fl / 1e9, threads * b / fl / 1e9);
  fflush(stdout);
  for (int i = 0; i < threads; i++) {
    free(t[i].start);
    free(t[i].end);
  }
  pthread_barrier_destroy(&sh.bar);
  free(t);
  free(it_t);
  free(own);
  free(st);
  return 0;
}
