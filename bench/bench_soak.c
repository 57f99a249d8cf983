/*
 * bench_soak - does a long run leak?  (issue 10, "Soak")
 *
 *   bench_soak thread [--ranks N] [--steps S] [--every K] [--warmup W]
 *   mpirun -np 4 bench_soak mpi [--steps S] [--every K] [--warmup W]
 *
 * Runs S gradient-sync steps (default 10,000) of a small model on the
 * thread backend (N ranks as threads of this process, default 64, mesh
 * dp=N/8,cp=2,tp=4 with dp_cp) or on the MPI backend (one process per
 * rank, mesh dp=world/2,cp=2).  Each step: begin, write every gradient,
 * mark_ready in backward order, finish, check one value, zero_grads; every
 * 10th step also an all_reduce over tp and a barrier on the world, so the
 * plain collectives soak too.
 *
 * Every K steps (default 500) every process samples its resident set
 * (VmRSS), open file descriptors (/proc/self/fd) and threads (/proc/self
 * status); on MPI the samples are the maximum over the processes (an
 * all_reduce max).  After the run it prints one row per sample and the
 * growth from the sample at step W (default 1,000: warm-up, when pools,
 * arenas and Open MPI's free lists settle) to the last sample, judged
 * against the goal: RSS growth < 1 MiB and no new fd.  --svg FILE writes
 * the RSS curve as an SVG plot.  Exit status: 0 when the run completed
 * (a missed goal prints MISS), 1 on a failure, 2 on a usage error.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "meshpg.h"

#define NPARAMS 12
#define MAX_SAMPLES 512

typedef struct sample {
  long step;
  long rss_kib, fds, threads;
} sample;

typedef struct soak {
  int ranks;
  long steps, every, warmup;
  const mpg_mesh *mesh;
  sample samples[MAX_SAMPLES];
  int nsamples;
} soak;

static long status_field(const char *key) {
  FILE *f = fopen("/proc/self/status", "r");
  if (!f) return -1;
  char line[256];
  long v = -1;
  size_t n = strlen(key);
  while (fgets(line, sizeof line, f))
    if (strncmp(line, key, n) == 0) v = strtol(line + n, NULL, 10);
  fclose(f);
  return v;
}

static long open_fds(void) {
  DIR *d = opendir("/proc/self/fd");
  if (!d) return -1;
  long n = 0;
  struct dirent *e;
  while ((e = readdir(d)))
    if (e->d_name[0] != '.') n++;
  closedir(d);
  return n - 1; /* the directory stream itself */
}

#define TRY(call)                                                           \
  do {                                                                      \
    mpg_status st_ = (call);                                                \
    if (st_ != MPG_OK) {                                                    \
      fprintf(stderr, "bench_soak: %s: %s: %s\n", #call,                    \
              mpg_status_name(st_), mpg_last_error());                      \
      rc = st_;                                                             \
      goto out;                                                             \
    }                                                                       \
  } while (0)

/* One rank's whole run.  Rank 0 (the sampler) records the samples. */
static mpg_status rank_main(const mpg_init_opts *opts, void *arg) {
  soak *s = arg;
  static const size_t counts[NPARAMS] = {4096, 64,   4096, 64,  16384, 256,
                                         4096, 4096, 64,   512, 8192,  32};
  mpg_status rc = MPG_OK;
  mpg_ctx *ctx = NULL;
  mpg_sync *sync = NULL;
  int ids[NPARAMS];
  TRY(mpg_ctx_create(s->mesh, opts, &ctx));
  int rank = mpg_ctx_rank(ctx);
  mpg_group *tp, *world;
  TRY(mpg_ctx_group(ctx, "tp", &tp));
  TRY(mpg_ctx_group(ctx, "world", &world));
  mpg_sync_opts so = MPG_SYNC_OPTS_INIT;
  so.sync.bucket_mb = 0.05;
  so.sync.first_bucket_mb = 0.01;
  TRY(mpg_sync_create(ctx, &so, &sync));
  for (int p = 0; p < NPARAMS; p++) {
    char name[16];
    snprintf(name, sizeof name, "p%d", p);
    TRY(mpg_sync_add_param(sync, name, counts[p], MPG_F32, NULL, &ids[p]));
  }
  TRY(mpg_sync_commit(sync));
  mpg_group *dp_cp;
  TRY(mpg_sync_param_group(sync, ids[0], &dp_cp));
  int gsize = mpg_group_size(dp_cp);
  for (long step = 1; step <= s->steps; step++) {
    TRY(mpg_sync_begin(sync, step, 1, NULL));
    for (int p = NPARAMS - 1; p >= 0; p--) {
      float *g;
      TRY(mpg_sync_grad(sync, ids[p], (void **)&g));
      for (size_t i = 0; i < counts[p]; i++) g[i] = (float)(mpg_group_position(dp_cp) + 1);
      TRY(mpg_sync_mark_ready(sync, ids[p]));
    }
    TRY(mpg_sync_finish(sync));
    float *g0;
    TRY(mpg_sync_grad(sync, ids[0], (void **)&g0));
    if (g0[0] != (float)(gsize + 1) / 2.0f) {
      fprintf(stderr, "bench_soak: step %ld: gradient %g, expected %g\n", step, g0[0],
              (gsize + 1) / 2.0);
      rc = MPG_ERR_STATE;
      goto out;
    }
    TRY(mpg_sync_zero_grads(sync));
    if (step % 10 == 0) {
      float v = 1.0f;
      TRY(mpg_all_reduce(tp, &v, &v, 1, MPG_F32, MPG_OP_SUM, NULL, NULL));
      TRY(mpg_barrier(world, NULL));
    }
    if (step % s->every == 0) {
      /* Every process samples itself (on threads only rank 0: the others
       * would count the sampler's own open files); on MPI the maximum
       * goes to rank 0. */
      int mpi = mpg_ctx_backend(ctx) == MPG_BACKEND_MPI;
      int64_t v[3] = {0, 0, 0};
      if (mpi || rank == 0) {
        v[0] = status_field("VmRSS:");
        v[1] = open_fds();
        v[2] = status_field("Threads:");
      }
      if (mpi) TRY(mpg_all_reduce(world, v, v, 3, MPG_I64, MPG_OP_MAX, NULL, NULL));
      if (rank == 0 && s->nsamples < MAX_SAMPLES)
        s->samples[s->nsamples++] = (sample){step, (long)v[0], (long)v[1], (long)v[2]};
      TRY(mpg_barrier(world, NULL));
    }
  }
out:
  mpg_sync_destroy(sync);
  mpg_ctx_destroy(ctx);
  return rc;
}

static void write_svg(const soak *s, const char *path) {
  FILE *f = fopen(path, "w");
  if (!f) {
    fprintf(stderr, "bench_soak: cannot write %s\n", path);
    return;
  }
  const int W = 640, H = 360, L = 80, R = 20, T = 40, B = 50;
  long lo = s->samples[0].rss_kib, hi = lo;
  for (int i = 0; i < s->nsamples; i++) {
    if (s->samples[i].rss_kib < lo) lo = s->samples[i].rss_kib;
    if (s->samples[i].rss_kib > hi) hi = s->samples[i].rss_kib;
  }
  lo -= 512;
  hi += 512; /* a 1 MiB window at least, so noise is not magnified */
  fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
             "font-family=\"sans-serif\" font-size=\"12\">\n", W, H);
  fprintf(f, "<rect width=\"%d\" height=\"%d\" fill=\"white\"/>\n", W, H);
  fprintf(f, "<text x=\"%d\" y=\"20\">resident set (KiB) every %ld steps, %d %s ranks</text>\n",
          L, s->every, s->ranks, s->ranks > 0 ? "thread" : "mpi");
  fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"black\"/>\n", L, H - B,
          W - R, H - B);
  fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"black\"/>\n", L, T, L,
          H - B);
  fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"end\">%ld</text>\n", L - 4, T + 4, hi);
  fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"end\">%ld</text>\n", L - 4, H - B, lo);
  fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">step (last %ld)</text>\n",
          (L + W - R) / 2, H - 15, s->samples[s->nsamples - 1].step);
  fprintf(f, "<polyline fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"2\" points=\"");
  long last = s->samples[s->nsamples - 1].step;
  for (int i = 0; i < s->nsamples; i++) {
    double x = L + (double)(W - L - R) * (double)s->samples[i].step / (double)last;
    double y = (H - B) - (double)(H - B - T) * (double)(s->samples[i].rss_kib - lo) /
                             (double)(hi - lo);
    fprintf(f, "%.1f,%.1f ", x, y);
  }
  fprintf(f, "\"/>\n</svg>\n");
  fclose(f);
}

static int usage(void) {
  fprintf(stderr, "usage: bench_soak thread|mpi [--ranks N] [--steps S] [--every K] "
                  "[--warmup W] [--svg FILE]\n");
  return 2;
}

int main(int argc, char **argv) {
  if (argc < 2) return usage();
  int thread = strcmp(argv[1], "thread") == 0;
  if (!thread && strcmp(argv[1], "mpi") != 0) return usage();
  soak *s = calloc(1, sizeof *s);
  s->ranks = thread ? 64 : 0;
  s->steps = 10000;
  s->every = 500;
  s->warmup = 1000;
  const char *svg = NULL;
  for (int i = 2; i < argc; i++) {
    if (i + 1 >= argc) return usage();
    if (strcmp(argv[i], "--ranks") == 0 && thread) s->ranks = atoi(argv[++i]);
    else if (strcmp(argv[i], "--steps") == 0) s->steps = atol(argv[++i]);
    else if (strcmp(argv[i], "--every") == 0) s->every = atol(argv[++i]);
    else if (strcmp(argv[i], "--warmup") == 0) s->warmup = atol(argv[++i]);
    else if (strcmp(argv[i], "--svg") == 0) svg = argv[++i];
    else return usage();
  }
  if ((thread && (s->ranks < 16 || s->ranks % 8)) || s->steps < 1 || s->every < 1 ||
      s->steps / s->every > MAX_SAMPLES)
    return usage();

  mpg_spec spec = MPG_SPEC_INIT;
  char dims[64];
  if (thread)
    snprintf(dims, sizeof dims, "dp=%d,cp=2,tp=4", s->ranks / 8);
  else
    snprintf(dims, sizeof dims, "dp=-1,cp=2,tp=1");
  mpg_mesh *mesh = NULL;
  mpg_launch env = MPG_LAUNCH_INIT;
  int world = s->ranks;
  if (!thread) {
    if (mpg_launch_from_env(&env) != MPG_OK || env.world_size < 2) {
      fprintf(stderr, "bench_soak mpi: run under mpirun with an even number of ranks (%s)\n",
              mpg_last_error());
      return 1;
    }
    world = env.world_size;
  }
  if (mpg_spec_set_mesh(&spec, dims) || mpg_spec_add_flatten(&spec, "dp_cp", "dp,cp") ||
      mpg_mesh_create(&spec, world, &mesh)) {
    fprintf(stderr, "bench_soak: mesh %s on %d ranks: %s\n", dims, world, mpg_last_error());
    return 1;
  }
  s->mesh = mesh;
  mpg_status st;
  if (thread) {
    st = mpg_thread_run(s->ranks, 60.0, rank_main, s, NULL);
  } else {
    mpg_init_opts o = MPG_INIT_OPTS_INIT;
    o.backend.name = MPG_BACKEND_MPI;
    o.backend.timeout_s = 60.0;
    st = rank_main(&o, s);
  }
  if (st != MPG_OK) {
    fprintf(stderr, "bench_soak: failed: %s: %s\n", mpg_status_name(st), mpg_last_error());
    return 1;
  }
  if (!thread && env.rank != 0) return 0;
  printf("# bench_soak %s: %ld steps, mesh %s on %d ranks, a sample every %ld steps\n",
         thread ? "thread" : "mpi (max over processes)", s->steps, dims, world, s->every);
  printf("%8s %10s %6s %8s\n", "step", "rss_kib", "fds", "threads");
  const sample *base = NULL, *last = &s->samples[s->nsamples - 1];
  for (int i = 0; i < s->nsamples; i++) {
    printf("%8ld %10ld %6ld %8ld\n", s->samples[i].step, s->samples[i].rss_kib,
           s->samples[i].fds, s->samples[i].threads);
    if (!base && s->samples[i].step >= s->warmup) base = &s->samples[i];
  }
  if (!base) base = &s->samples[0];
  long drss = last->rss_kib - base->rss_kib, dfd = last->fds - base->fds;
  int ok = drss < 1024 && dfd <= 0;
  printf("RESULT soak backend=%s steps=%ld base_step=%ld rss_growth_kib=%ld fd_growth=%ld "
         "thread_growth=%ld %s\n",
         thread ? "thread" : "mpi", s->steps, base->step, drss, dfd,
         last->threads - base->threads, ok ? "PASS" : "MISS");
  if (svg) write_svg(s, svg);
  mpg_mesh_destroy(mesh);
  free(s);
  return 0;
}
