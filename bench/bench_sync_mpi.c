/*
 * bench_sync_mpi - gradient synchronisation benchmark (issue 4), Open MPI.
 *
 * One MPI process per rank, started by mpirun (see bench/run_sync.sh, which
 * runs this program and bench/ddp_bench.py side by side and prints the
 * table).  The parameter list is a file of `name elements shape` lines
 * (`#` starts a comment), e.g. bench/gpt-small.params (bench/README.md).
 *
 * Every rank builds the mesh "dp=<world>,cp=1" with the flattened set
 * dp_cp = [dp, cp] on the MPI backend and registers every tensor of the
 * list (f32) with one mpg_sync (default options: bucket 25 MiB, first
 * bucket 1 MiB, op avg, reduce dtype f32, group dp_cp).  Modes:
 *
 *   a  meshpg sync: mpg_sync_begin + mpg_sync_mark_ready of every param in
 *      backward order (last registered first) + mpg_sync_finish.
 *   b  ceiling: one mpg_all_reduce(MPG_OP_AVG) over the world group on one
 *      contiguous buffer holding the same bytes (the sync's gradient
 *      buffer: one allocation, every view in it, 64-byte padding zeros).
 *   c  naive recipe: for every tensor (registration order) a blocking
 *      mpg_all_reduce(MPG_OP_SUM) over the world, then a loop dividing the
 *      tensor by the world size (what `dist.all_reduce(p.grad);
 *      p.grad /= world` does).  The tensors are the sync's views.
 *   r  reference below meshpg: MPI_Allreduce(MPI_IN_PLACE, SUM) on
 *      MPI_COMM_WORLD over the same contiguous buffer, then one divide
 *      loop; reports the allreduce part (allreduce_s) and the divide part
 *      (divide_s).
 *   i  as r with MPI_Iallreduce + MPI_Wait (the nonblocking collective
 *      meshpg's MPI backend posts; Open MPI runs those with libnbc).
 *   s  profile: a with op sum (no average division pass).
 *   1  profile: a with one bucket (bucket_mb = first_bucket_mb = 1e6).
 *   u  the flight recorder's cost (issue 32): a on a second context that
 *      records the opposite of a's context: off (opts.trace_entries = -1)
 *      while a's records (the default), on (2048) when
 *      MESHPG_TRACE_ENTRIES=0 turns a's off.  Interleaved with a; run it
 *      both ways, since two contexts differ by a few % even when neither
 *      records.
 *   o  overlap: a simulated backward.  T_comm = median of a (measured in
 *      this run first, or --t-comm).  The backward's compute takes T_comm
 *      and is spread over the params in proportion to their bytes, in
 *      backward order, on a wall-clock schedule: the gradient of param p
 *      is finished at t0 + T_comm * (bytes of the params up to and
 *      including p in backward order) / bytes; the rank busy-waits
 *      (spinning on CLOCK_MONOTONIC, no MPI call) until then and calls
 *      mpg_sync_mark_ready(p); after the last, mpg_sync_finish.
 *      compute = T_comm; exposed = step - compute, i.e. the time the step
 *      outlasts its compute (mark_ready work that runs past the schedule
 *      and the wait in finish); exposed % = exposed / T_comm.  A schedule
 *      (not one relative spin per param) keeps the ranks in step and
 *      stops preemption overshoot from piling up over 100+ spins when
 *      processes outnumber cores; mark_ready work done before the next
 *      deadline is hidden, as it is behind GPU compute.
 *   p  profile: o, but the busy-wait calls MPI_Iprobe every 100 us, which
 *      runs Open MPI's progress engine from the computing thread too.
 *   g  overlap with compute on a device: the same schedule, but the host
 *      thread sleeps until each deadline (clock_nanosleep), as a trainer's
 *      thread does while its GPU runs backward; the CPU is free for the
 *      MPI backend's progress thread.  This is the model the exposure goal
 *      is judged on: with o, 4 ranks busy-waiting on 2 cores leave the
 *      communication no CPU at all.
 *   n  no overlap: the same compute (spin until t0 + T_comm), then every
 *      mark_ready, then finish (the contrast).
 *
 * Timing: every iteration starts after MPI_Barrier(MPI_COMM_WORLD); each
 * rank times its own operation with clock_gettime(CLOCK_MONOTONIC) and the
 * iteration's time is the maximum over ranks.  Modes of one phase run
 * interleaved (iteration k of a, b, c, r, ... then iteration k + 1 in the
 * reverse order, so that no mode always follows the same one), so a
 * noisy neighbour hits every mode alike: phase 1 is a b c r i s 1, phase 2
 * (after T_comm is known) is o p n.  --warmup untimed iterations precede the
 * timed ones; the first warm-up iteration of a, b, c, r, i, s, 1 checks the
 * result (every rank writes rank + 1 into every element; the average must
 * be (world + 1) / 2, the sum world * (world + 1) / 2).
 *
 * Output (rank 0, stdout), one line per mode, for the driver:
 *   RESULT <mode> median_s=.. min_s=.. max_s=.. n=.. bytes=.. gbps=..
 *          faults=.. [more key=value fields]
 * (faults: median over iterations of the most minor page faults one rank
 * took inside the timed operation, from getrusage: fresh memory that MPI,
 * the backend's staging or malloc touched for the first time)
 * plus human-readable "#" lines.  Bytes are the parameters' bytes
 * (elements * 4); GB/s = bytes / median time / 1e9 (algorithm bandwidth;
 * the bus bandwidth of a ring all-reduce is that * 2 (n - 1) / n).
 *
 * --trace also prints one line per iteration (rank 0):
 *   ITER <mode> step=.. timed=0|1 time_s=.. faults=.. part1_s=.. part2_s=..
 *
 * Usage: mpirun -np N bench_sync_mpi PARAMS [--iters N] [--warmup N]
 *          [--modes a,b,c,r,i,s,1,u,o,p,g,n] [--t-comm SECONDS] [--bucket-mb X]
 *          [--first-bucket-mb X] [--trace]
 * Exit status 0; 1 when a meshpg or MPI call or a result check fails;
 * 2 on a usage error.
 */
#include "meshpg.h"

#include <mpi.h>

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"

#define MAX_ITERS 10000

/* ------------------------------------------------------------------ */
/* Small helpers                                                       */
/* ------------------------------------------------------------------ */

static int g_rank = 0;

/* Busy-wait "compute" until CLOCK_MONOTONIC reaches `deadline` (no MPI
 * call inside). */
static void spin_until(double deadline) {
  while (now_s() < deadline) {
  }
}

/* "Compute" on a device: the host thread blocks until `deadline`, as a
 * trainer's thread does while the GPU runs backward (its CPU is free for
 * communication, e.g. the MPI backend's progress thread). */
static int sleep_until(double deadline) {
  if (now_s() >= deadline) return 0;
  struct timespec ts;
  ts.tv_sec = (time_t)deadline;
  ts.tv_nsec = (long)((deadline - (double)ts.tv_sec) * 1e9);
  if (ts.tv_nsec >= 1000000000L) ts.tv_nsec = 999999999L;
  while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
  }
  return 1;
}

/* As spin_until, but every 100 us one MPI_Iprobe, which runs Open MPI's
 * progress engine from the computing thread. */
static void spin_polling_until(double deadline) {
  double next = 0;
  for (double t = now_s(); t < deadline; t = now_s()) {
    if (t >= next) {
      int flag = 0;
      MPI_Iprobe(MPI_ANY_SOURCE, 32767, MPI_COMM_WORLD, &flag, MPI_STATUS_IGNORE);
      next = t + 100e-6;
    }
  }
}

typedef struct stats {
  double median, min, max;
  int n;
} stats;

static stats summarize(const double *v, int n) {
  stats s = {0, 0, 0, n};
  if (n <= 0) return s;
  double *w = malloc((size_t)n * sizeof *w);
  if (!w) return s;
  memcpy(w, v, (size_t)n * sizeof *w);
  s.median = median(w, n); /* sorts w */
  s.min = w[0];
  s.max = w[n - 1];
  free(w);
  return s;
}

#define CHECK(call)                                                        \
  do {                                                                     \
    mpg_status st_ = (call);                                               \
    if (st_ != MPG_OK) {                                                   \
      fprintf(stderr, "bench_sync_mpi: rank %d: %s:%d: %s -> %s: %s\n",     \
              g_rank, __FILE__, __LINE__, #call, mpg_status_name(st_),      \
              mpg_last_error());                                           \
      return 1;                                                            \
    }                                                                      \
  } while (0)

#define CHECK_MPI(call)                                                    \
  do {                                                                     \
    int rc_ = (call);                                                      \
    if (rc_ != MPI_SUCCESS) {                                              \
      fprintf(stderr, "bench_sync_mpi: rank %d: %s:%d: %s failed (%d)\n",   \
              g_rank, __FILE__, __LINE__, #call, rc_);                     \
      return 1;                                                            \
    }                                                                      \
  } while (0)

/* ------------------------------------------------------------------ */
/* Options                                                             */
/* ------------------------------------------------------------------ */

enum { M_A, M_B, M_C, M_R, M_I, M_S, M_1, M_U, M_O, M_P, M_G, M_N, M_COUNT };
static const char mode_chars[M_COUNT] = {'a', 'b', 'c', 'r', 'i', 's', '1', 'u',
                                         'o', 'p', 'g', 'n'};
static const char *const mode_desc[M_COUNT] = {
    "meshpg sync (begin + mark_ready x N in backward order + finish)",
    "flat mpg_all_reduce avg, world, one contiguous buffer",
    "naive: per-tensor mpg_all_reduce sum + divide loop",
    "raw MPI_Allreduce(IN_PLACE, sum) + divide loop",
    "raw MPI_Iallreduce + MPI_Wait + divide loop",
    "meshpg sync, op sum (no divide pass)",
    "meshpg sync, one bucket",
    "meshpg sync as a on a second context, flight recorder the opposite of a's",
    "overlap: compute spread over backward, mark_ready as grads finish",
    "overlap as o, compute polls MPI progress every 100 us",
    "overlap as o, compute on a device: the host thread sleeps (GPU-like)",
    "no overlap: all compute, then mark every param ready, finish"};

typedef struct options {
  const char *params;
  int iters, warmup;
  int trace;
  int modes[M_COUNT];
  double t_comm;
  double bucket_mb, first_bucket_mb;
} options;

static void usage(FILE *f) {
  fprintf(f,
          "usage: mpirun -np N bench_sync_mpi PARAMS [--iters N] [--warmup N]\n"
          "         [--modes a,b,c,r,i,s,1,u,o,p,g,n] [--t-comm SECONDS]\n"
          "         [--bucket-mb X] [--first-bucket-mb X] [--trace]\n"
          "  PARAMS          `name elements shape` lines (# comments)\n"
          "  --iters N       timed iterations per mode (default 20)\n"
          "  --warmup N      untimed iterations first (default 3, >= 1)\n"
          "  --trace         print every iteration (rank 0: ITER lines)\n"
          "  --modes LIST    default a,b,c,r,i,o,p,g,n:\n");
  for (int m = 0; m < M_COUNT; m++) fprintf(f, "                    %c  %s\n", mode_chars[m], mode_desc[m]);
  fprintf(f,
          "  --t-comm S      T_comm for o/p/n (default: median of a in this run)\n"
          "  --bucket-mb X, --first-bucket-mb X   sync options of a, s, o, p, n\n"
          "                  (default 25 and 1, the library defaults)\n");
}

static int parse_int(const char *s, int lo, int hi, int *out) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || *end || end == s || v < lo || v > hi) return 1;
  *out = (int)v;
  return 0;
}

static int parse_pos_double(const char *s, double *out) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || *end || end == s || !(v > 0) || !isfinite(v)) return 1;
  *out = v;
  return 0;
}

static int parse_args(int argc, char **argv, options *o) {
  memset(o, 0, sizeof *o);
  o->iters = 20;
  o->warmup = 3;
  o->bucket_mb = 25.0;
  o->first_bucket_mb = 1.0;
  const char *modes = "a,b,c,r,i,o,p,g,n";
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      usage(stdout);
      return -1;
    } else if (!strcmp(a, "--trace")) {
      o->trace = 1;
    } else if (a[0] == '-' && a[1] == '-' && !v) {
      fprintf(stderr, "bench_sync_mpi: %s needs a value\n", a);
      return 2;
    } else if (!strcmp(a, "--iters")) {
      if (parse_int(v, 1, MAX_ITERS, &o->iters)) goto bad;
      i++;
    } else if (!strcmp(a, "--warmup")) {
      if (parse_int(v, 1, MAX_ITERS, &o->warmup)) goto bad;
      i++;
    } else if (!strcmp(a, "--modes")) {
      modes = v;
      i++;
    } else if (!strcmp(a, "--t-comm")) {
      if (parse_pos_double(v, &o->t_comm)) goto bad;
      i++;
    } else if (!strcmp(a, "--bucket-mb")) {
      if (parse_pos_double(v, &o->bucket_mb)) goto bad;
      i++;
    } else if (!strcmp(a, "--first-bucket-mb")) {
      if (parse_pos_double(v, &o->first_bucket_mb)) goto bad;
      i++;
    } else if (a[0] == '-') {
      fprintf(stderr, "bench_sync_mpi: unknown option %s\n", a);
      return 2;
    } else if (!o->params) {
      o->params = a;
    } else {
      fprintf(stderr, "bench_sync_mpi: more than one PARAMS file (%s)\n", a);
      return 2;
    }
    continue;
  bad:
    fprintf(stderr, "bench_sync_mpi: %s: bad value \"%s\"\n", a, v);
    return 2;
  }
  if (!o->params) {
    fprintf(stderr, "bench_sync_mpi: no PARAMS file given\n");
    return 2;
  }
  for (const char *p = modes; *p; p++) {
    if (*p == ',' || *p == ' ') continue;
    const char *c = memchr(mode_chars, *p, M_COUNT);
    if (!c) {
      fprintf(stderr, "bench_sync_mpi: --modes: unknown mode '%c'\n", *p);
      return 2;
    }
    o->modes[c - mode_chars] = 1;
  }
  if ((o->modes[M_O] || o->modes[M_P] || o->modes[M_G] || o->modes[M_N]) && !o->modes[M_A] &&
      !(o->t_comm > 0)) {
    fprintf(stderr, "bench_sync_mpi: modes o/p/n need mode a or --t-comm\n");
    return 2;
  }
  return 0;
}

/* ------------------------------------------------------------------ */
/* The benchmark                                                       */
/* ------------------------------------------------------------------ */

typedef struct bench {
  options opt;
  int rank, world;
  pdesc *params;
  int np;
  size_t total_elems; /* parameters' elements */
  double bytes;       /* parameters' bytes */
  mpg_mesh *mesh;
  mpg_ctx *ctx;
  mpg_ctx *ctx_off;  /* u: a second context with the flight recorder off */
  mpg_group *world_group;
  mpg_sync *sync[M_COUNT]; /* a (also o, n, b, c, r, i), s, 1 */
  float **view[M_COUNT];   /* per param, for each sync */
  float *flat;             /* the contiguous buffer of sync a */
  size_t flat_count;       /* elements from the first view to the end of the last */
  double *budget;          /* o/n: spin seconds per param */
} bench;

/* Make a sync with the given bucket sizes and op; record its views. */
static int make_sync(bench *B, int m, double bucket_mb, double first_mb,
                     mpg_op op) {
  mpg_sync_opts so = MPG_SYNC_OPTS_INIT;
  so.sync.bucket_mb = bucket_mb;
  so.sync.first_bucket_mb = first_mb;
  so.sync.op = op;
  CHECK(mpg_sync_create(m == M_U ? B->ctx_off : B->ctx, &so, &B->sync[m]));
  for (int p = 0; p < B->np; p++) {
    int id = -1;
    CHECK(mpg_sync_add_param(B->sync[m], B->params[p].name, B->params[p].count,
                             MPG_F32, NULL, &id));
    if (id != p) {
      fprintf(stderr, "bench_sync_mpi: param %d got id %d\n", p, id);
      return 1;
    }
  }
  CHECK(mpg_sync_commit(B->sync[m]));
  B->view[m] = calloc((size_t)B->np, sizeof *B->view[m]);
  if (!B->view[m]) return 1;
  for (int p = 0; p < B->np; p++) {
    void *g = NULL;
    CHECK(mpg_sync_grad(B->sync[m], p, &g));
    B->view[m][p] = g;
  }
  return 0;
}

static void fill(bench *B, float **views, float value) {
  for (int p = 0; p < B->np; p++)
    for (size_t i = 0; i < B->params[p].count; i++) views[p][i] = value;
}

/* Every element of every view equals `want`.  Collective (all ranks). */
static int verify(bench *B, float **views, float want, const char *what) {
  long bad = 0;
  size_t first_p = 0, first_i = 0;
  float got = 0;
  for (int p = 0; p < B->np; p++)
    for (size_t i = 0; i < B->params[p].count; i++)
      if (fabsf(views[p][i] - want) > 1e-5f * fabsf(want)) {
        if (!bad) first_p = (size_t)p, first_i = i, got = views[p][i];
        bad++;
      }
  if (bad)
    fprintf(stderr,
            "bench_sync_mpi: rank %d: %s: %ld wrong elements, first %s[%zu] = "
            "%g, expected %g\n",
            B->rank, what, bad, B->params[first_p].name, first_i, (double)got,
            (double)want);
  long all = 0;
  MPI_Allreduce(&bad, &all, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
  return all != 0;
}

static void divide(float *x, size_t n, float by) {
  const float inv = 1.0f / by;
  for (size_t i = 0; i < n; i++) x[i] *= inv;
}

/* Extra per-iteration figures some modes report (max over ranks). */
typedef struct extra {
  double part1, part2;   /* r/i: allreduce, divide; o/n: in mark_ready, in finish */
  double faults;         /* minor page faults during the operation */
  double compute;        /* o/n */
  double exposed;        /* o/n */
  double wakeups;        /* g: sleeps that blocked (the host thread woke) */
} extra;

static int sync_step(mpg_sync *s, int np, long step) {
  CHECK(mpg_sync_begin(s, step, 1, NULL));
  for (int p = np - 1; p >= 0; p--) CHECK(mpg_sync_mark_ready(s, p));
  CHECK(mpg_sync_finish(s));
  return 0;
}

/* Run mode m once on this rank; *dt its time; x its extra figures. */
static int run_once(bench *B, int m, long step, double *dt, extra *x) {
  memset(x, 0, sizeof *x);
  double f_start = minor_faults();
  double t0 = now_s();
  switch (m) {
    case M_A:
    case M_S:
    case M_1:
    case M_U:
      if (sync_step(B->sync[m], B->np, step)) return 1;
      break;
    case M_B:
      CHECK(mpg_all_reduce(B->world_group, B->flat, B->flat, B->flat_count, MPG_F32,
                           MPG_OP_AVG, NULL, NULL));
      break;
    case M_C:
      for (int p = 0; p < B->np; p++) {
        float *g = B->view[M_A][p];
        CHECK(mpg_all_reduce(B->world_group, g, g, B->params[p].count, MPG_F32,
                             MPG_OP_SUM, NULL, NULL));
        divide(g, B->params[p].count, (float)B->world);
      }
      break;
    case M_R:
    case M_I: {
      if (B->flat_count > (size_t)2147483647) {
        fprintf(stderr, "bench_sync_mpi: mode %c: more than INT_MAX elements\n",
                mode_chars[m]);
        return 1;
      }
      int n = (int)B->flat_count;
      if (m == M_R) {
        CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, B->flat, n, MPI_FLOAT, MPI_SUM,
                                MPI_COMM_WORLD));
      } else {
        MPI_Request r;
        CHECK_MPI(MPI_Iallreduce(MPI_IN_PLACE, B->flat, n, MPI_FLOAT, MPI_SUM,
                                 MPI_COMM_WORLD, &r));
        CHECK_MPI(MPI_Wait(&r, MPI_STATUS_IGNORE));
      }
      double t1 = now_s();
      divide(B->flat, B->flat_count, (float)B->world);
      x->part1 = t1 - t0;
      x->part2 = now_s() - t1;
      break;
    }
    case M_O:
    case M_P:
    case M_G:
    case M_N: {
      /* Compute on a wall-clock schedule: the gradient of param p is
       * finished at t0 + T_comm * (bytes of the params before it in
       * backward order, itself included) / bytes.  Busy-wait until then. */
      mpg_sync *s = B->sync[M_A];
      double in_mark = 0, deadline = t0;
      CHECK(mpg_sync_begin(s, step, 1, NULL));
      if (m == M_O || m == M_P || m == M_G) {
        for (int p = B->np - 1; p >= 0; p--) {
          deadline += B->budget[p];
          if (m == M_O)
            spin_until(deadline);
          else if (m == M_P)
            spin_polling_until(deadline);
          else
            x->wakeups += sleep_until(deadline);
          double a = now_s();
          CHECK(mpg_sync_mark_ready(s, p));
          in_mark += now_s() - a;
        }
      } else {
        for (int p = B->np - 1; p >= 0; p--) deadline += B->budget[p];
        spin_until(deadline);
        double a = now_s();
        for (int p = B->np - 1; p >= 0; p--) CHECK(mpg_sync_mark_ready(s, p));
        in_mark += now_s() - a;
      }
      double f0 = now_s();
      CHECK(mpg_sync_finish(s));
      double t1 = now_s();
      x->part1 = in_mark;
      x->part2 = t1 - f0;
      x->compute = deadline - t0;
      x->exposed = (t1 - t0) - (deadline - t0);
      break;
    }
    default:
      return 1;
  }
  *dt = now_s() - t0;
  x->faults = minor_faults() - f_start;
  return 0;
}

/* Results of one mode: per timed iteration, max over ranks. */
typedef struct series {
  double *t, *p1, *p2, *comp, *exp, *flt, *wk;
  int n;
} series;

static int series_alloc(series *s, int n) {
  s->t = calloc((size_t)n, sizeof(double));
  s->p1 = calloc((size_t)n, sizeof(double));
  s->p2 = calloc((size_t)n, sizeof(double));
  s->comp = calloc((size_t)n, sizeof(double));
  s->exp = calloc((size_t)n, sizeof(double));
  s->flt = calloc((size_t)n, sizeof(double));
  s->wk = calloc((size_t)n, sizeof(double));
  s->n = 0;
  return !(s->t && s->p1 && s->p2 && s->comp && s->exp && s->flt && s->wk);
}

static void series_free(series *s) {
  free(s->t);
  free(s->p1);
  free(s->p2);
  free(s->comp);
  free(s->exp);
  free(s->flt);
  free(s->wk);
}

/* One iteration of mode m on every rank; timed ones are recorded. */
static int iteration(bench *B, int m, long step, int timed, series *s) {
  double dt = 0;
  extra x;
  CHECK_MPI(MPI_Barrier(MPI_COMM_WORLD));
  if (run_once(B, m, step, &dt, &x)) return 1;
  double mine[7] = {dt, x.part1, x.part2, x.compute, x.exposed, x.faults, x.wakeups};
  double mx[7];
  CHECK_MPI(MPI_Allreduce(mine, mx, 7, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
  if (timed) {
    s->t[s->n] = mx[0];
    s->p1[s->n] = mx[1];
    s->p2[s->n] = mx[2];
    s->comp[s->n] = mx[3];
    s->exp[s->n] = mx[4];
    s->flt[s->n] = mx[5];
    s->wk[s->n] = mx[6];
    s->n++;
  }
  if (B->opt.trace && B->rank == 0) {
    printf("ITER %c step=%ld timed=%d time_s=%.6f faults=%.0f part1_s=%.6f part2_s=%.6f\n",
           mode_chars[m], step, timed, mx[0], mx[5], mx[1], mx[2]);
    fflush(stdout);
  }
  return 0;
}

/* Checked first iteration: every rank writes rank + 1 everywhere. */
static int checked_iteration(bench *B, int m, long step, series *s) {
  const float w = (float)B->world;
  float **views = (m == M_S || m == M_1 || m == M_U) ? B->view[m] : B->view[M_A];
  fill(B, views, (float)(B->rank + 1));
  if (iteration(B, m, step, 0, s)) return 1;
  float want = m == M_S ? w * (w + 1) / 2 : (w + 1) / 2;
  char what[64];
  snprintf(what, sizeof what, "mode %c result", mode_chars[m]);
  if (verify(B, views, want, what)) return 1;
  /* Keep later iterations finite: the sum mode would grow by x world. */
  if (m == M_S) fill(B, views, 0.0f);
  return 0;
}

static void print_result(const bench *B, int m, const series *s, double t_comm) {
  stats t = summarize(s->t, s->n);
  stats fl = summarize(s->flt, s->n);
  printf("RESULT %c median_s=%.6f min_s=%.6f max_s=%.6f n=%d bytes=%.0f gbps=%.4f faults=%.0f",
         mode_chars[m], t.median, t.min, t.max, t.n, B->bytes, B->bytes / t.median / 1e9,
         fl.median);
  if (m == M_A || m == M_S || m == M_1 || m == M_U) {
    mpg_sync_stats st = MPG_SYNC_STATS_INIT;
    if (mpg_sync_get_stats(B->sync[m], &st) == MPG_OK)
      printf(" buckets=%d sync_bytes=%zu shm_buffers=%d", st.num_buckets, st.total_bytes,
             st.shm_buffers);
  }
  if (m == M_C) printf(" calls=%d", B->np);
  if (m == M_R || m == M_I) {
    stats a = summarize(s->p1, s->n), d = summarize(s->p2, s->n);
    printf(" allreduce_s=%.6f divide_s=%.6f", a.median, d.median);
  }
  if (m == M_O || m == M_P || m == M_G || m == M_N) {
    stats c = summarize(s->comp, s->n), e = summarize(s->exp, s->n);
    stats k = summarize(s->p1, s->n), f = summarize(s->p2, s->n);
    printf(" t_comm_s=%.6f compute_s=%.6f exposed_s=%.6f exposed_pct=%.2f "
           "in_mark_ready_s=%.6f in_finish_s=%.6f",
           t_comm, c.median, e.median, 100.0 * e.median / t_comm, k.median,
           f.median);
    if (m != M_N)
      printf(" bound_pct=%.2f", 100.0 * (double)B->params[0].count * 4.0 / B->bytes);
    if (m == M_G) printf(" wakeups=%.0f", summarize(s->wk, s->n).median);
  }
  printf("\n");
  printf("#   %c: %s: median %.2f ms (min %.2f, max %.2f, %d iters), %.3f GB/s\n",
         mode_chars[m], mode_desc[m], t.median * 1e3, t.min * 1e3, t.max * 1e3, t.n,
         B->bytes / t.median / 1e9);
  fflush(stdout);
}

static int run_phase(bench *B, const int *which, long *step, series *ser) {
  const options *o = &B->opt;
  for (int m = 0; m < M_COUNT; m++)
    if (which[m] && checked_iteration(B, m, (*step)++, &ser[m])) return 1;
  /* The order of the modes flips every iteration, so that no mode always
   * runs right after another (a mode's successor can find the caches and
   * the shared-memory pages warm: 3 % between two identical syncs here). */
  for (int it = 1; it < o->warmup + o->iters; it++)
    for (int k = 0; k < M_COUNT; k++) {
      int m = it % 2 ? M_COUNT - 1 - k : k;
      if (which[m] && iteration(B, m, (*step)++, it >= o->warmup, &ser[m])) return 1;
    }
  return 0;
}

static int bench_main(bench *B) {
  const options *o = &B->opt;
  /* Mesh dp=<world>, cp=1, dp_cp = [dp, cp]; MPI backend. */
  mpg_spec spec = MPG_SPEC_INIT;
  CHECK(mpg_spec_init(&spec));
  CHECK(mpg_spec_set_mesh(&spec, "dp=-1,cp=1"));
  CHECK(mpg_spec_add_flatten(&spec, "dp_cp", "dp,cp"));
  CHECK(mpg_spec_validate(&spec));
  CHECK(mpg_mesh_create(&spec, B->world, &B->mesh));
  mpg_init_opts io = MPG_INIT_OPTS_INIT;
  io.backend.name = MPG_BACKEND_MPI;
  io.rank = B->rank;
  io.world_size = B->world;
  io.backend.timeout_s = 600;
  CHECK(mpg_ctx_create(B->mesh, &io, &B->ctx));
  CHECK(mpg_ctx_group(B->ctx, "world", &B->world_group));

  /* Sync a always (its buffer serves b, c, r, i, o, n). */
  if (make_sync(B, M_A, o->bucket_mb, o->first_bucket_mb, MPG_OP_AVG)) return 1;
  if (o->modes[M_S] && make_sync(B, M_S, o->bucket_mb, o->first_bucket_mb, MPG_OP_SUM))
    return 1;
  if (o->modes[M_1] && make_sync(B, M_1, 1e6, 1e6, MPG_OP_AVG)) return 1;
  if (o->modes[M_U]) {
    /* The flight recorder's cost (issue 32): the same sync on a second
     * context that records the opposite of a's (a records unless
     * MESHPG_TRACE_ENTRIES=0), interleaved with a.  Run it both ways:
     * the two contexts differ by a few % even when neither records. */
    const char *e = getenv("MESHPG_TRACE_ENTRIES");
    io.trace_entries = e && !strcmp(e, "0") ? 2048 : -1;
    CHECK(mpg_ctx_create(B->mesh, &io, &B->ctx_off));
    if (make_sync(B, M_U, o->bucket_mb, o->first_bucket_mb, MPG_OP_AVG)) return 1;
  }
  mpg_sync_stats st = MPG_SYNC_STATS_INIT;
  CHECK(mpg_sync_get_stats(B->sync[M_A], &st));
  if (st.num_buffers != 1) {
    fprintf(stderr, "bench_sync_mpi: expected one gradient buffer, got %d\n",
            st.num_buffers);
    return 1;
  }
  /* The contiguous buffer: from the lowest view to the end of the highest. */
  char *lo = NULL, *hi = NULL;
  for (int p = 0; p < B->np; p++) {
    char *b = (char *)B->view[M_A][p], *e = b + B->params[p].count * 4;
    if (!lo || b < lo) lo = b;
    if (!hi || e > hi) hi = e;
  }
  if ((size_t)(hi - lo) > st.total_bytes) {
    fprintf(stderr, "bench_sync_mpi: views span %zu bytes, buffer has %zu\n",
            (size_t)(hi - lo), st.total_bytes);
    return 1;
  }
  B->flat = (float *)(void *)lo;
  B->flat_count = (size_t)(hi - lo) / 4;

  if (B->rank == 0) {
    printf("# bench_sync_mpi: %s: %d tensors, %zu elements, %.2f MB f32; world %d "
           "(mesh dp=%d,cp=1, dp_cp=[dp,cp], backend mpi)\n",
           o->params, B->np, B->total_elems, B->bytes / 1e6, B->world, B->world);
    printf("# sync a: bucket %.3g MiB, first bucket %.3g MiB, op avg, reduce f32: "
           "%d buckets, %zu buffer bytes; flat buffer %zu elements\n",
           o->bucket_mb, o->first_bucket_mb, st.num_buckets, st.total_bytes,
           B->flat_count);
    printf("# %d warm-up + %d timed iterations per mode, modes interleaved; "
           "time = max over ranks\n",
           o->warmup, o->iters);
    fflush(stdout);
  }

  series ser[M_COUNT];
  for (int m = 0; m < M_COUNT; m++)
    if (series_alloc(&ser[m], o->iters)) return 1;
  long step = 0;
  int rc = 0;

  /* Phase 1: a b c r i s 1. */
  int phase1[M_COUNT] = {0};
  for (int m = M_A; m <= M_U; m++) phase1[m] = o->modes[m];
  rc = run_phase(B, phase1, &step, ser);
  double t_comm = o->t_comm;
  if (!rc && B->rank == 0)
    for (int m = M_A; m <= M_U; m++)
      if (phase1[m]) print_result(B, m, &ser[m], 0);
  if (!rc && o->modes[M_A] && !(t_comm > 0)) t_comm = summarize(ser[M_A].t, ser[M_A].n).median;

  /* Phase 2: o p n, with T_comm known (rank 0's value, the same everywhere). */
  if (!rc && (o->modes[M_O] || o->modes[M_P] || o->modes[M_G] || o->modes[M_N])) {
    MPI_Bcast(&t_comm, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    B->budget = calloc((size_t)B->np, sizeof *B->budget);
    if (!B->budget) rc = 1;
    for (int p = 0; !rc && p < B->np; p++)
      B->budget[p] = t_comm * (double)B->params[p].count * 4.0 / B->bytes;
    if (!rc && B->rank == 0) {
      printf("# overlap: T_comm = %.2f ms spread over %d params as busy-wait compute\n",
             t_comm * 1e3, B->np);
      fflush(stdout);
    }
    int phase2[M_COUNT] = {0};
    phase2[M_O] = o->modes[M_O];
    phase2[M_P] = o->modes[M_P];
    phase2[M_G] = o->modes[M_G];
    phase2[M_N] = o->modes[M_N];
    if (!rc) {
      /* The gradients are whatever the last a left (every rank equal). */
      for (int it = 0; !rc && it < o->warmup + o->iters; it++)
        for (int m = M_O; !rc && m <= M_N; m++)
          if (phase2[m]) rc = iteration(B, m, step++, it >= o->warmup, &ser[m]);
    }
    if (!rc && B->rank == 0)
      for (int m = M_O; m <= M_N; m++)
        if (phase2[m]) print_result(B, m, &ser[m], t_comm);
  }
  for (int m = 0; m < M_COUNT; m++) series_free(&ser[m]);
  return rc;
}

int main(int argc, char **argv) {
  bench B;
  memset(&B, 0, sizeof B);
  int pr = parse_args(argc, argv, &B.opt);
  if (pr == -1) return 0;
  if (pr) {
    usage(stderr);
    return 2;
  }
  int provided = 0;
  if (MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) {
    fprintf(stderr, "bench_sync_mpi: MPI_Init_thread failed\n");
    return 1;
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &B.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &B.world);
  g_rank = B.rank;
  int rc = bench_load_params("bench_sync_mpi", B.opt.params, &B.params, &B.np);
  if (!rc) {
    for (int p = 0; p < B.np; p++) B.total_elems += B.params[p].count;
    B.bytes = (double)B.total_elems * 4.0;
    rc = bench_main(&B);
  }
  if (rc) {
    /* Peers may be waiting in a collective this rank will never enter. */
    fflush(stdout);
    MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
  }
  for (int m = 0; m < M_COUNT; m++) {
    mpg_sync_destroy(B.sync[m]);
    free(B.view[m]);
  }
  free(B.budget);
  free(B.params);
  mpg_ctx_destroy(B.ctx_off);
  mpg_ctx_destroy(B.ctx);
  mpg_mesh_destroy(B.mesh);
  MPI_Finalize();
  return 0;
}
