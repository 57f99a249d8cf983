/*
 * bench_sync_gather - the sharded optimizer's parameter gather (issue 34):
 * shard mode's mpg_sync_gather_begin + mpg_sync_gather_all through node-
 * local shared memory, against the backend's gather, MPI_Allgather and
 * the floor, in one run.
 *
 *   mpirun -np P bench_sync_gather PARAMS [--iters N] [--warmup N]
 *          [--repeat N] [--methods LIST] [--loops NAME,...|all]
 *          [--bucket-mb X] [--first-bucket-mb X]
 *
 * Every rank builds the mesh "dp=<P>,cp=1" (dp_cp = [dp, cp], MPI backend)
 * and a shard-mode mpg_sync (opts.sync.mode = MPG_SYNC_SHARD; bucket_mb 25
 * and first_bucket_mb 1, the library defaults) holding every tensor of
 * PARAMS (`name elements shape` lines, as bench_sync_mpi reads them) in
 * f32: one sharded buffer of B bytes (the params, each bucket padded to
 * lcm(P, 128) elements), of which each rank owns 1/P.  Methods (--methods,
 * comma-separated; default all four):
 *   shm      the sync's gather on a context made with MESHPG_SHM as the
 *            environment has it (default on): each bucket all-gathered in
 *            the buffer's shared-memory segment (docs/sync.md);
 *   backend  the same sync on a second context made with MESHPG_SHM=0 (set
 *            by this program for that creation only): each bucket
 *            mpg_all_gather'ed by the MPI backend, today's path off one
 *            host;
 *   mpi      MPI_Allgather(MPI_IN_PLACE) of the same B bytes over
 *            MPI_COMM_WORLD, one call on one buffer;
 *   floor    the P ranks each copy the bytes a rank receives, (P - 1) / P
 *            x B, from a buffer of their own into another, all at once,
 *            once per copy loop of bench_copy.h (--loops); the floor is the
 *            best block of the fastest loop (as bench_floor and
 *            bench_alltoall_mpi time it).
 * Timing (as bench_alltoall_mpi): per round (--repeat), each method in
 * turn, the order rotating from round to round; a block is --warmup
 * untimed then --iters timed operations after a barrier; its time per
 * operation is the maximum over ranks; a method's time is the median of
 * its blocks.  Before every block the bytes the rank does not own are
 * overwritten (-1), outside the timing; after it every element is
 * checked (the owner's value; the floor: its copy): a wrong one fails the
 * run.  Both syncs must hold equal params (they do: every element is its
 * owner's value).
 *
 * Output (rank 0): "#" lines (the setup: buckets, B, whether the shm sync
 * took the shared path), then one row per method:
 *   np bytes method time_ms best_ms GB/s /floor "vs best MPI"
 * (bytes: B; GB/s: B / time; /floor: time / floor; vs best MPI: the mpi
 * method's time over this one's), a "# floor" line with every loop's best,
 * and one machine-readable line per method:
 *   RESULT G method=NAME np=P bytes=B median_s=.. best_s=.. floor_s=..
 *          ratio_floor=.. vs_mpi=.. shm_buffers=..
 * Memory per rank: B (gradients) + B (params) per sync, 2 (P - 1) / P x B
 * for mpi and the floor (one allocation); the shm segments are mapped by
 * every rank of the host but cost B each once.  bench/gpt-medium.params is
 * 2 GB: at np 2 with --methods shm,mpi,floor it needs about 12 GB.
 * Exit status 0; 1 when a call or a check fails; 2 on a usage error.
 */
#include <mpi.h>

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_copy.h"
#include "bench_util.h"
#include "meshpg.h"

enum { G_SHM, G_BACKEND, G_MPI, G_FLOOR, G_COUNT };
static const char *const method_name[G_COUNT] = {"shm", "backend", "mpi", "floor"};
static const char *const method_desc[G_COUNT] = {
    "shard gather, shared memory", "shard gather, backend (MESHPG_SHM=0)",
    "MPI_Allgather in place", "floor: copy (P-1)/P x B"};

static int g_rank, g_world;

#define CHECK(call)                                                                   \
  do {                                                                                \
    mpg_status st_ = (call);                                                          \
    if (st_ != MPG_OK) {                                                              \
      fprintf(stderr, "bench_sync_gather: rank %d: %s:%d: %s -> %s: %s\n", g_rank,    \
              __FILE__, __LINE__, #call, mpg_status_name(st_), mpg_last_error());     \
      MPI_Abort(MPI_COMM_WORLD, 1);                                                   \
    }                                                                                 \
  } while (0)

typedef struct options {
  const char *params;
  int iters, warmup, repeat;
  int methods[G_COUNT];
  const char *loops;
  double bucket_mb, first_bucket_mb;
} options;

/* One shard-mode sync and its views. */
typedef struct gsync {
  mpg_ctx *ctx;
  mpg_sync *sync;
  float **param;          /* each param's view in the parameter buffer */
  mpg_shard_info *info;   /* each param's owned range */
  mpg_sync_stats stats;
} gsync;

static void usage(FILE *f) {
  fprintf(f,
          "usage: mpirun -np P bench_sync_gather PARAMS [--iters N] [--warmup N]\n"
          "         [--repeat N] [--methods shm,backend,mpi,floor] [--loops NAME,...|all]\n"
          "         [--bucket-mb X] [--first-bucket-mb X]\n"
          "  PARAMS             `name elements shape` lines (# comments)\n"
          "  --iters N          timed operations per block (default 10)\n"
          "  --warmup N         untimed operations before each block (default 2)\n"
          "  --repeat N         blocks per method, the methods rotating (default 5)\n"
          "  --methods LIST     default shm,backend,mpi,floor:\n");
  for (int m = 0; m < G_COUNT; m++)
    fprintf(f, "                       %-8s %s\n", method_name[m], method_desc[m]);
  fprintf(f,
          "  --loops L          the floor's copy loops (bench_copy.h; default all)\n"
          "  --bucket-mb X, --first-bucket-mb X   the syncs' buckets (default 25, 1)\n");
}

static int parse_int(const char *s, int lo, int hi, int *out) {
  char *end;
  errno = 0;
  long v = s ? strtol(s, &end, 10) : 0;
  if (!s || errno || *end || end == s || v < lo || v > hi) return 1;
  *out = (int)v;
  return 0;
}

static int parse_mb(const char *s, double *out) {
  char *end;
  errno = 0;
  double v = s ? strtod(s, &end) : 0;
  if (!s || errno || *end || end == s || !(v > 0) || !isfinite(v)) return 1;
  *out = v;
  return 0;
}

static int parse_methods(const char *list, int *on) {
  memset(on, 0, sizeof(int) * G_COUNT);
  for (const char *p = list; *p;) {
    size_t len = strcspn(p, ",");
    int found = -1;
    for (int m = 0; m < G_COUNT; m++)
      if (strlen(method_name[m]) == len && !strncmp(method_name[m], p, len)) found = m;
    if (found < 0) {
      fprintf(stderr, "bench_sync_gather: --methods: unknown method '%.*s'\n", (int)len, p);
      return 1;
    }
    on[found] = 1;
    p += len;
    if (*p == ',') p++;
  }
  int any = 0;
  for (int m = 0; m < G_COUNT; m++) any |= on[m];
  if (!any) fprintf(stderr, "bench_sync_gather: --methods: none named\n");
  return !any;
}

/* 0, -1 (help printed), or 2 (usage error, message printed). */
static int parse_args(int argc, char **argv, options *o) {
  memset(o, 0, sizeof *o);
  o->iters = 10;
  o->warmup = 2;
  o->repeat = 5;
  o->loops = "all";
  o->bucket_mb = 25.0;
  o->first_bucket_mb = 1.0;
  const char *methods = "shm,backend,mpi,floor";
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    int bad = 0;
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      usage(stdout);
      return -1;
    } else if (!strcmp(a, "--iters")) {
      bad = parse_int(v, 1, 100000, &o->iters), i++;
    } else if (!strcmp(a, "--warmup")) {
      bad = parse_int(v, 0, 100000, &o->warmup), i++;
    } else if (!strcmp(a, "--repeat")) {
      bad = parse_int(v, 1, 100000, &o->repeat), i++;
    } else if (!strcmp(a, "--methods")) {
      bad = !v, methods = v, i++;
    } else if (!strcmp(a, "--loops")) {
      bad = !v, o->loops = v, i++;
    } else if (!strcmp(a, "--bucket-mb")) {
      bad = parse_mb(v, &o->bucket_mb), i++;
    } else if (!strcmp(a, "--first-bucket-mb")) {
      bad = parse_mb(v, &o->first_bucket_mb), i++;
    } else if (a[0] == '-' || o->params) {
      fprintf(stderr, "bench_sync_gather: unexpected argument %s\n", a);
      return 2;
    } else {
      o->params = a;
    }
    if (bad) {
      fprintf(stderr, "bench_sync_gather: %s: bad or missing value\n", a);
      return 2;
    }
  }
  if (!o->params) {
    fprintf(stderr, "bench_sync_gather: no PARAMS file given\n");
    return 2;
  }
  return parse_methods(methods, o->methods) ? 2 : 0;
}

/* The value every rank's params hold at element i of param p once
 * gathered (its owner wrote it): exact in f32. */
static float value(int p, size_t i) { return (float)((size_t)p * 7919u % 4096u + i % 997u); }

/* A shard-mode sync of every param on a new context; MESHPG_SHM=0 for
 * this creation when `off`. */
static void make_sync(gsync *g, mpg_mesh *mesh, const options *o, const pdesc *params,
                      int np, int off) {
  mpg_init_opts io = MPG_INIT_OPTS_INIT;
  io.backend.name = MPG_BACKEND_MPI;
  io.rank = g_rank;
  io.world_size = g_world;
  io.backend.timeout_s = 600;
  char *saved = NULL;
  if (off) {
    const char *e = getenv("MESHPG_SHM");
    saved = e ? strdup(e) : NULL;
    setenv("MESHPG_SHM", "0", 1);
  }
  mpg_status st = mpg_ctx_create(mesh, &io, &g->ctx);
  if (off) {
    if (saved) setenv("MESHPG_SHM", saved, 1);
    else unsetenv("MESHPG_SHM");
    free(saved);
  }
  CHECK(st);
  mpg_sync_opts so = MPG_SYNC_OPTS_INIT;
  so.sync.mode = MPG_SYNC_SHARD;
  so.sync.bucket_mb = o->bucket_mb;
  so.sync.first_bucket_mb = o->first_bucket_mb;
  CHECK(mpg_sync_create(g->ctx, &so, &g->sync));
  for (int p = 0; p < np; p++) {
    int id = -1;
    CHECK(mpg_sync_add_param(g->sync, params[p].name, params[p].count, MPG_F32, NULL, &id));
  }
  CHECK(mpg_sync_commit(g->sync));
  g->param = calloc((size_t)np, sizeof *g->param);
  g->info = calloc((size_t)np, sizeof *g->info);
  if (!g->param || !g->info) MPI_Abort(MPI_COMM_WORLD, 1);
  for (int p = 0; p < np; p++) {
    void *v = NULL;
    CHECK(mpg_sync_param(g->sync, p, &v));
    g->param[p] = v;
    g->info[p] = (mpg_shard_info)MPG_SHARD_INFO_INIT;
    CHECK(mpg_sync_get_shard(g->sync, p, &g->info[p]));
    if (!g->info[p].sharded) {
      fprintf(stderr, "bench_sync_gather: param %s is not sharded\n", params[p].name);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
  }
  g->stats = (mpg_sync_stats)MPG_SYNC_STATS_INIT;
  CHECK(mpg_sync_get_stats(g->sync, &g->stats));
}

/* Owned elements: their value; the others -1 (what a gather must fix). */
static void poison(gsync *g, const pdesc *params, int np) {
  for (int p = 0; p < np; p++) {
    size_t lo = g->info[p].param_offset, hi = lo + g->info[p].count;
    for (size_t i = 0; i < params[p].count; i++)
      g->param[p][i] = i >= lo && i < hi ? value(p, i) : -1.0f;
  }
}

/* Wrong elements of this rank's params. */
static long check_sync(const gsync *g, const pdesc *params, int np, const char *what) {
  long wrong = 0;
  for (int p = 0; p < np; p++)
    for (size_t i = 0; i < params[p].count; i++)
      if (g->param[p][i] != value(p, i)) {
        if (!wrong)
          fprintf(stderr, "bench_sync_gather: rank %d: %s: %s[%zu] = %g, expected %g\n",
                  g_rank, what, params[p].name, i, (double)g->param[p][i],
                  (double)value(p, i));
        wrong++;
      }
  return wrong;
}

/* mpi: slice r of buf holds rank r's values. */
static void mpi_poison(float *buf, size_t per) {
  for (int r = 0; r < g_world; r++)
    for (size_t i = 0; i < per; i++)
      buf[(size_t)r * per + i] = r == g_rank ? (float)(r * 1000 + (int)(i % 997)) : -1.0f;
}

static long mpi_check(const float *buf, size_t per) {
  long wrong = 0;
  for (int r = 0; r < g_world; r++)
    for (size_t i = 0; i < per; i++)
      wrong += buf[(size_t)r * per + i] != (float)(r * 1000 + (int)(i % 997));
  return wrong;
}

static void gather(gsync *g) {
  CHECK(mpg_sync_gather_begin(g->sync, NULL));
  CHECK(mpg_sync_gather_all(g->sync));
}

/* One block: warm-up, barrier, `iters` timed operations; the time per
 * operation, the maximum over ranks. */
typedef struct block_ctx {
  const options *o;
  gsync *sync[2];
  float *mbuf;       /* mpi's buffer, also the floor's source and target */
  size_t per, elems; /* mpi: elements per rank, B / 4 */
  size_t fbytes;     /* the floor's bytes, (P - 1) / P x B */
  bench_copy_loop loop;
} block_ctx;

static void run_op(block_ctx *b, int m) {
  switch (m) {
    case G_SHM:
    case G_BACKEND:
      gather(b->sync[m]);
      break;
    case G_MPI:
      MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, b->mbuf, (int)b->per, MPI_FLOAT,
                    MPI_COMM_WORLD);
      break;
    default:
      b->loop.copy((char *)b->mbuf + b->fbytes, b->mbuf, b->fbytes);
  }
}

static double block(block_ctx *b, int m, const pdesc *params, int np) {
  const options *o = b->o;
  if (m == G_SHM || m == G_BACKEND) poison(b->sync[m], params, np);
  else if (m == G_MPI) mpi_poison(b->mbuf, b->per);
  else memset((char *)b->mbuf + b->fbytes, 0, b->fbytes);
  for (int w = 0; w < o->warmup; w++) run_op(b, m);
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = now_s();
  for (int it = 0; it < o->iters; it++) run_op(b, m);
  double t = (now_s() - t0) / o->iters, tmax = 0;
  MPI_Allreduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  long wrong = m == G_SHM || m == G_BACKEND ? check_sync(b->sync[m], params, np, method_name[m])
               : m == G_MPI ? mpi_check(b->mbuf, b->per)
                            : memcmp((char *)b->mbuf + b->fbytes, b->mbuf, b->fbytes) != 0;
  long all = 0;
  MPI_Allreduce(&wrong, &all, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
  if (all) {
    if (g_rank == 0)
      fprintf(stderr, "bench_sync_gather: %s%s%s: %ld wrong elements\n", method_name[m],
              m == G_FLOOR ? " " : "", m == G_FLOOR ? b->loop.name : "", all);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  return tmax;
}

static double median_of(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return v[n / 2];
}

int main(int argc, char **argv) {
  options o;
  int pr = parse_args(argc, argv, &o);
  if (pr == -1) return 0;
  if (pr) {
    usage(stderr);
    return 2;
  }
  unsigned loop_mask = bench_copy_select("bench_sync_gather", o.loops);
  if (!loop_mask) return 2;
  int n_all = 0, nl = 0;
  const bench_copy_loop *all_loops = bench_copy_loops(&n_all);
  bench_copy_loop loop[8];
  for (int i = 0; i < n_all; i++)
    if (loop_mask & (1u << i)) loop[nl++] = all_loops[i];
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_world);
  pdesc *params = NULL;
  int np = 0;
  if (bench_load_params(g_rank == 0 ? "bench_sync_gather" : NULL, o.params, &params, &np))
    MPI_Abort(MPI_COMM_WORLD, 2);

  mpg_spec spec = MPG_SPEC_INIT;
  mpg_mesh *mesh = NULL;
  CHECK(mpg_spec_init(&spec));
  CHECK(mpg_spec_set_mesh(&spec, "dp=-1,cp=1"));
  CHECK(mpg_spec_add_flatten(&spec, "dp_cp", "dp,cp"));
  CHECK(mpg_spec_validate(&spec));
  CHECK(mpg_mesh_create(&spec, g_world, &mesh));
  gsync syncs[2];
  memset(syncs, 0, sizeof syncs);
  for (int m = G_SHM; m <= G_BACKEND; m++)
    if (o.methods[m]) make_sync(&syncs[m], mesh, &o, params, np, m == G_BACKEND);
  /* B: the parameter buffer's bytes (shard mode's total_bytes counts the
   * gradients' and the parameters' buffers alike). */
  const mpg_sync_stats *st = o.methods[G_SHM] ? &syncs[G_SHM].stats : &syncs[G_BACKEND].stats;
  size_t B = 0;
  if (o.methods[G_SHM] || o.methods[G_BACKEND]) {
    if (st->num_buffers != 1) {
      fprintf(stderr, "bench_sync_gather: expected one buffer, got %d\n", st->num_buffers);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    B = st->total_bytes / 2;
  } else {
    size_t e = 0, pad = 128 * (size_t)g_world; /* as the sync pads one bucket, roughly */
    for (int p = 0; p < np; p++) e += params[p].count;
    B = (e + pad - 1) / pad * pad * 4;
  }
  block_ctx bc = {&o, {&syncs[G_SHM], &syncs[G_BACKEND]}, NULL, 0, B / 4, 0, loop[0]};
  bc.per = bc.elems / (size_t)g_world;
  bc.fbytes = bc.per * (size_t)(g_world - 1) * 4;
  if (o.methods[G_MPI] || o.methods[G_FLOOR]) {
    if (bc.per > 2147483647u) {
      fprintf(stderr, "bench_sync_gather: more than INT_MAX elements per rank\n");
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    size_t cap = B > 2 * bc.fbytes ? B : 2 * bc.fbytes;
    bc.mbuf = malloc(cap);
    if (!bc.mbuf) MPI_Abort(MPI_COMM_WORLD, 1);
    memset(bc.mbuf, 0, cap); /* touched before any timing */
  }
  if (g_rank == 0) {
    printf("# bench_sync_gather: %s: %d tensors; np %d (mesh dp=%d,cp=1, backend mpi); shard "
           "mode, bucket %.3g MiB, first %.3g MiB: %d buckets, B = %zu bytes of params\n",
           o.params, np, g_world, g_world, o.bucket_mb, o.first_bucket_mb,
           o.methods[G_SHM] || o.methods[G_BACKEND] ? st->num_buckets : 0, B);
    if (o.methods[G_SHM])
      printf("# shm: %d buffer(s) in shared memory, %zu bytes mapped (0: MESHPG_SHM=0 or "
             "not one host; then it is the backend's gather too)\n",
             syncs[G_SHM].stats.shm_buffers, syncs[G_SHM].stats.shm_bytes);
    char names[64];
    printf("# %d rounds x (%d warm-up + %d timed operations a block), methods rotating; "
           "time = max over ranks, median of blocks; floor loops %s\n",
           o.repeat, o.warmup, o.iters, bench_copy_names(loop_mask, names, sizeof names));
    printf("# %3s %12s  %-8s %9s %9s %8s %7s  %s\n", "np", "bytes", "method", "time_ms",
           "best_ms", "GB/s", "/floor", "vs best MPI");
    fflush(stdout);
  }
  double *blk = calloc((size_t)o.repeat * (G_COUNT + (size_t)nl), sizeof *blk);
  if (!blk) MPI_Abort(MPI_COMM_WORLD, 1);
  for (int r = 0; r < o.repeat; r++)
    for (int k = 0; k < G_COUNT; k++) {
      int m = (k + r) % G_COUNT; /* rotate who goes first */
      if (!o.methods[m]) continue;
      if (m != G_FLOOR) {
        blk[(size_t)m * o.repeat + r] = block(&bc, m, params, np);
        continue;
      }
      for (int l = 0; l < nl; l++) {
        bc.loop = loop[l];
        blk[(size_t)(G_COUNT + l) * o.repeat + r] = block(&bc, m, params, np);
      }
    }
  double med[G_COUNT] = {0}, best[G_COUNT] = {0}, fbest[8] = {0}, floor_t = 0;
  int win = 0;
  for (int m = 0; m < G_COUNT + nl; m++) {
    double *v = blk + (size_t)m * o.repeat;
    if (m < G_FLOOR) {
      if (!o.methods[m]) continue;
      med[m] = median_of(v, o.repeat);
      best[m] = v[0];
    } else if (m > G_FLOOR && o.methods[G_FLOOR]) {
      int l = m - G_COUNT;
      median_of(v, o.repeat);
      fbest[l] = v[0];
      if (fbest[l] < fbest[win]) win = l;
    }
  }
  if (o.methods[G_FLOOR]) {
    floor_t = fbest[win];
    med[G_FLOOR] = best[G_FLOOR] = floor_t;
  }
  if (g_rank == 0) {
    for (int m = 0; m < G_COUNT; m++) {
      if (!o.methods[m]) continue;
      char rf[16] = "n/a", vm[16] = "n/a";
      if (floor_t > 0) snprintf(rf, sizeof rf, "%.2fx", med[m] / floor_t);
      if (o.methods[G_MPI]) snprintf(vm, sizeof vm, "%.2fx", med[G_MPI] / med[m]);
      printf("  %3d %12zu  %-8s %9.3f %9.3f %8.3f %7s  %s\n", g_world, B, method_name[m],
             med[m] * 1e3, best[m] * 1e3, (double)B / med[m] / 1e9, rf, vm);
    }
    if (o.methods[G_FLOOR]) {
      printf("# floor: %d ranks each copy %zu bytes ((P-1)/P x B) at once: best %.3f ms with "
             "%s; best per loop:", g_world, bc.fbytes, floor_t * 1e3, loop[win].name);
      for (int l = 0; l < nl; l++) printf(" %s %.3f ms", loop[l].name, fbest[l] * 1e3);
      printf("\n");
    }
    for (int m = 0; m < G_COUNT; m++)
      if (o.methods[m])
        printf("RESULT G method=%s np=%d bytes=%zu median_s=%.6f best_s=%.6f floor_s=%.6f "
               "ratio_floor=%.4f vs_mpi=%.4f shm_buffers=%d\n",
               method_name[m], g_world, B, med[m], best[m], floor_t,
               floor_t > 0 ? med[m] / floor_t : 0.0,
               o.methods[G_MPI] ? med[G_MPI] / med[m] : 0.0,
               m == G_SHM ? syncs[G_SHM].stats.shm_buffers : 0);
    fflush(stdout);
  }
  free(blk);
  free(bc.mbuf);
  for (int m = 0; m < 2; m++) {
    mpg_sync_destroy(syncs[m].sync);
    mpg_ctx_destroy(syncs[m].ctx);
    free(syncs[m].param);
    free(syncs[m].info);
  }
  mpg_mesh_destroy(mesh);
  free(params);
  MPI_Finalize();
  return 0;
}
