/*
 * bench_groups - benchmarks of the groups module (issue 3).
 *
 * One source, two programs:
 *   bench_groups       the thread backend (simulated ranks, one process)
 *   bench_groups_mpi   the Open MPI backend (built with -DMPG_BENCH_MPI=1
 *                      when meson finds MPI; run it under mpirun)
 *
 * Mode "create": the cost of creating a mesh's process groups, two ways,
 * side by side, on the same backend, in the same run:
 *   ours      one split of the world per dim set (colour = group index,
 *             key = position), as mpg_ctx_create does: every rank enters
 *             one collective per dim set, whatever the world size.
 *   baseline  how torch `new_group` and Megatron `parallel_state` do it:
 *             every rank enters the creation of EVERY group of every dim
 *             set; for each dim set, for each group g, one world-collective
 *             split in which g's members pass colour 0 (key = position) and
 *             everybody else colour -1 (no group).
 *   Both run directly on the internal backend interface (groups/backend.h:
 *   world_init, split, destroy).  The dim sets are the mesh's dims and
 *   flattened sets (dp_cp = [dp, cp] is added whenever the mesh has dp and
 *   cp); "world" is the world communicator itself and needs no split.
 *   Each pass: a world barrier, then every rank times its own splits; the
 *   pass's time is the maximum over ranks.  One untimed validation pass
 *   first, then --repeat timed passes, alternating which method goes first;
 *   the median and the best (minimum) of the passes are reported.
 *   Checks (untimed, "check" column): in the validation pass the members of
 *   every group made either way, gathered in position order over the new
 *   communicator, equal mpg_mesh_group_members; the number of splits is the
 *   same on every rank; and the public mpg_ctx_create on the same mesh
 *   reports mpg__ctx_setup_collectives == 1 (world join) + ours' splits.
 *   bench_groups create runs the meshes 8: dp=2,cp=2,tp=2; 64: dp=4,cp=2,
 *   tp=8; 256: pp=4,dp=4,cp=2,tp=8; 1024: pp=4,dp=16,cp=2,tp=8 (all with
 *   dp_cp).  bench_groups_mpi create runs one mesh of the MPI world's size:
 *   4: dp=2,cp=2; 8: dp=2,cp=2,tp=2; 16: pp=2,dp=2,cp=2,tp=2 (with dp_cp).
 *
 * Mode "allreduce": all_reduce bandwidth against message size, in the style
 * of nccl-tests' all_reduce_perf: f32 sum over the "world" group through
 * the public API (mpg_ctx_create, mpg_all_reduce, blocking, out of place),
 * sizes from --min-bytes by x4 steps up to --max-bytes (which is added as
 * the last size when the x4 steps miss it).  Per size: --warmup calls, then
 * --repeat timed blocks of `iters` calls (iters = 256 MiB / size, clamped to
 * 2..--iters); a block's time per call is the maximum over ranks; the median
 * block is reported, and the best one as "best busbw".
 *   algbw = size / time, busbw = algbw * 2(n-1)/n (GB/s = 1e9 bytes/s).
 *   #wrong = elements (summed over ranks) of the last result that differ
 *   from n(n+1)/2 (rank r sends r+1 everywhere).
 *
 * Usage:
 *   bench_groups create    [--mesh SPEC]... [--repeat N] [--timeout S]
 *                          [--no-header]
 *   bench_groups allreduce [--ranks N] [--repeat N] [--iters N]
 *                          [--warmup N] [--min-bytes B] [--max-bytes B]
 *                          [--timeout S]
 *   mpirun -np P bench_groups_mpi create    [--mesh SPEC] [same flags]
 *   mpirun -np P bench_groups_mpi allreduce [same flags, no --ranks]
 *
 *   --mesh SPEC     a mesh such as "pp=4,dp=16,cp=2,tp=8" (dims outermost
 *                   first, as mpg_spec_set_mesh); may be repeated (thread);
 *                   replaces the default meshes.  For MPI the product must
 *                   equal the number of processes.
 *   --repeat N      timed passes / blocks, 1..1000 (default 5)
 *   --timeout S     collective timeout in seconds (default 300)
 *   --no-header     create: print the table rows only (to append the MPI
 *                   runs to the thread table)
 *   --ranks N       allreduce, thread backend: simulated ranks, 2..4096
 *                   (default 8)
 *   --iters N       allreduce: most calls per timed block (default 100)
 *   --warmup N      allreduce: untimed calls per size (default 5)
 *   --min-bytes B   allreduce: first size (default 8); a multiple of 4;
 *   --max-bytes B   last size (default 64M).  B takes a K, M or G suffix
 *                   (powers of 1024).
 *   --help, -h      print this usage and exit 0
 *
 * Exit status: 0 when every run and check passed, 1 when a meshpg call or a
 * check failed, 2 on a usage error.  Timings on a shared machine are noisy:
 * compare medians, and only within one run.
 */
#include "backend.h"
#include "groups_internal.h" /* mpg__ctx_setup_collectives */

#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef MPG_BENCH_MPI
#include <mpi.h>
#define PROG "bench_groups_mpi"
#else
#define PROG "bench_groups"
#endif

#define MAX_REPEAT 1000
#define MAX_MESHES 16
#define MAX_SETS (MPG_MAX_DIMS + MPG_MAX_FLATTEN + 1)
#define BLOCK_BUDGET (256.0 * 1024 * 1024) /* bytes moved per timed block */
#define MAX_SIZES 64

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median_of(const double *v, int n) {
  double *t = malloc(sizeof *t * (size_t)n);
  if (!t) return v[0];
  memcpy(t, v, sizeof *t * (size_t)n);
  qsort(t, (size_t)n, sizeof *t, cmp_double);
  double m = n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
  free(t);
  return m;
}

static double min_of(const double *v, int n) {
  double m = v[0];
  for (int i = 1; i < n; i++)
    if (v[i] < m) m = v[i];
  return m;
}

/* ------------------------------------------------------------------------ */
/* Options                                                                   */
/* ------------------------------------------------------------------------ */

typedef struct options {
  int mode; /* 0 create, 1 allreduce */
  int nmeshes;
  const char *meshes[MAX_MESHES];
  int repeat;
  double timeout_s;
  int no_header;
  int ranks;
  int iters, warmup;
  long long min_bytes, max_bytes;
} options;

static void usage(FILE *f) {
  fprintf(f,
#ifdef MPG_BENCH_MPI
          "usage: mpirun -np P " PROG " create [--mesh SPEC] [--repeat N] "
          "[--timeout S] [--no-header]\n"
          "       mpirun -np P " PROG " allreduce [--repeat N] [--iters N] "
          "[--warmup N] [--min-bytes B] [--max-bytes B] [--timeout S]\n"
#else
          "usage: " PROG " create [--mesh SPEC]... [--repeat N] [--timeout S] "
          "[--no-header]\n"
          "       " PROG " allreduce [--ranks N] [--repeat N] [--iters N] "
          "[--warmup N] [--min-bytes B] [--max-bytes B] [--timeout S]\n"
#endif
          "  --mesh SPEC    mesh such as \"pp=4,dp=16,cp=2,tp=8\" (dp_cp is "
          "added when dp and cp exist)\n"
          "  --repeat N     timed passes / blocks, 1..%d (default 5)\n"
          "  --timeout S    collective timeout, seconds (default 300)\n"
          "  --no-header    create: table rows only\n"
#ifndef MPG_BENCH_MPI
          "  --ranks N      allreduce: simulated ranks, 2..4096 (default 8)\n"
#endif
          "  --iters N      allreduce: most calls per timed block (default "
          "100)\n"
          "  --warmup N     allreduce: untimed calls per size (default 5)\n"
          "  --min-bytes B  allreduce: first size (default 8; K/M/G suffix)\n"
          "  --max-bytes B  allreduce: last size (default 64M)\n"
          "  --help, -h     this help\n",
          MAX_REPEAT);
}

/* MPI: only rank 0 reports usage errors. */
static int g_quiet;
#define UERR(...) (g_quiet ? 0 : fprintf(stderr, __VA_ARGS__))

static int parse_long(const char *s, long long lo, long long hi,
                      long long *out) {
  if (!s || !*s) return -1;
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (errno || end == s) return -1;
  if (*end == 'K' || *end == 'k') v *= 1024LL, end++;
  else if (*end == 'M' || *end == 'm') v *= 1024LL * 1024, end++;
  else if (*end == 'G' || *end == 'g') v *= 1024LL * 1024 * 1024, end++;
  if (*end || v < lo || v > hi) return -1;
  *out = v;
  return 0;
}

static int parse_args(int argc, char **argv, options *o) {
  memset(o, 0, sizeof *o);
  o->repeat = 5;
  o->timeout_s = 300;
  o->ranks = 8;
  o->iters = 100;
  o->warmup = 5;
  o->min_bytes = 8;
  o->max_bytes = 64LL * 1024 * 1024;
  if (argc < 2) {
    UERR(PROG ": missing mode (create or allreduce)\n");
    return 2;
  }
  if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
    if (!g_quiet) usage(stdout);
    return 1;
  }
  if (strcmp(argv[1], "create") == 0)
    o->mode = 0;
  else if (strcmp(argv[1], "allreduce") == 0)
    o->mode = 1;
  else {
    UERR(PROG ": unknown mode \"%s\" (expected create or "
            "allreduce)\n", argv[1]);
    return 2;
  }
  for (int i = 2; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      if (!g_quiet) usage(stdout);
      return 1;
    }
    if (strcmp(a, "--no-header") == 0 && o->mode == 0) {
      o->no_header = 1;
      continue;
    }
    static const char *const valued[] = {"--mesh",   "--repeat",    "--timeout",
                                         "--ranks",  "--iters",     "--warmup",
                                         "--min-bytes", "--max-bytes"};
    int k = -1;
    for (int j = 0; j < (int)(sizeof valued / sizeof valued[0]); j++)
      if (strcmp(a, valued[j]) == 0) k = j;
#ifdef MPG_BENCH_MPI
    if (k == 3) k = -1; /* --ranks: mpirun -np decides */
#endif
    /* Mode-specific flags. */
    if (k == 0 && o->mode != 0) k = -1;
    if (k >= 3 && o->mode != 1) k = -1;
    if (k < 0) {
      UERR(PROG ": unknown argument \"%s\" for mode %s\n", a,
              o->mode ? "allreduce" : "create");
      return 2;
    }
    if (i + 1 >= argc) {
      UERR(PROG ": %s needs a value\n", a);
      return 2;
    }
    const char *v = argv[++i];
    long long n = 0;
    int bad = 0;
    switch (k) {
      case 0:
#ifdef MPG_BENCH_MPI
        if (o->nmeshes == 1) {
          UERR(PROG ": --mesh: one mesh per MPI run\n");
          return 2;
        }
#endif
        if (o->nmeshes == MAX_MESHES) {
          UERR(PROG ": --mesh: at most %d meshes\n", MAX_MESHES);
          return 2;
        }
        o->meshes[o->nmeshes++] = v;
        break;
      case 1:
        bad = parse_long(v, 1, MAX_REPEAT, &n);
        o->repeat = (int)n;
        break;
      case 2: {
        char *end;
        errno = 0;
        o->timeout_s = strtod(v, &end);
        bad = errno || end == v || *end || !(o->timeout_s > 0);
        break;
      }
      case 3:
        bad = parse_long(v, 2, 4096, &n);
        o->ranks = (int)n;
        break;
      case 4:
        bad = parse_long(v, 1, 1000000, &n);
        o->iters = (int)n;
        break;
      case 5:
        bad = parse_long(v, 0, 1000000, &n);
        o->warmup = (int)n;
        break;
      case 6:
      case 7:
        bad = parse_long(v, 4, 1LL << 32, &n) || n % 4;
        if (k == 6) o->min_bytes = n;
        else o->max_bytes = n;
        break;
    }
    if (bad) {
      UERR(PROG ": %s: invalid value \"%s\"\n", a, v);
      return 2;
    }
  }
  if (o->min_bytes > o->max_bytes) {
    UERR(PROG ": --min-bytes %lld is above --max-bytes %lld\n",
            o->min_bytes, o->max_bytes);
    return 2;
  }
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Meshes                                                                    */
/* ------------------------------------------------------------------------ */

/* spec from "dp=2,cp=2,tp=2", plus dp_cp = [dp, cp] when both exist. */
static mpg_status make_mesh(const char *dims, int world, mpg_mesh **out) {
  *out = NULL;
  mpg_spec spec = MPG_SPEC_INIT;
  mpg_spec_init(&spec);
  mpg_status st = mpg_spec_set_mesh(&spec, dims);
  if (st) return st;
  int has_dp = 0, has_cp = 0;
  for (int d = 0; d < spec.ndims; d++) {
    has_dp |= strcmp(spec.dims[d].name, "dp") == 0;
    has_cp |= strcmp(spec.dims[d].name, "cp") == 0;
  }
  if (has_dp && has_cp && (st = mpg_spec_add_flatten(&spec, "dp_cp", "dp,cp")))
    return st;
  if ((st = mpg_spec_validate(&spec))) return st;
  return mpg_mesh_create(&spec, world, out);
}

/* The dim sets that need a communicator: every dim and flattened set whose
 * groups have more than one member ("world" is the world communicator). */
typedef struct plan {
  const mpg_mesh *mesh;
  const char *dims;
  int world;
  int nsets;
  int set[MAX_SETS];
  int group_size[MAX_SETS];
  int num_groups[MAX_SETS];
  long groups; /* sum of num_groups */
} plan;

static void make_plan(const mpg_mesh *m, const char *dims, plan *p) {
  memset(p, 0, sizeof *p);
  p->mesh = m;
  p->dims = dims;
  p->world = mpg_mesh_world_size(m);
  int n = mpg_mesh_num_dimsets(m);
  for (int s = 0; s < n; s++) {
    const char *name;
    int gs, ng;
    mpg_mesh_dimset_info(m, s, &name, &gs, &ng);
    if (strcmp(name, "world") == 0 || gs == 1) continue;
    p->set[p->nsets] = s;
    p->group_size[p->nsets] = gs;
    p->num_groups[p->nsets] = ng;
    p->groups += ng;
    p->nsets++;
  }
}

/* ------------------------------------------------------------------------ */
/* Group creation on the backend interface                                   */
/* ------------------------------------------------------------------------ */

typedef const struct mpg__backend_ops bops;

static mpg_status run_coll(bops *ops, mpg__comm *c, const mpg__coll *k,
                           double timeout_s) {
  mpg__req *req = NULL;
  mpg_status st = ops->post(c, k, &req);
  if (st) return st;
  st = ops->wait(req, mpg__now() + timeout_s);
  ops->req_free(req);
  return st;
}

static mpg_status barrier(bops *ops, mpg__comm *c, double timeout_s) {
  mpg__coll k;
  memset(&k, 0, sizeof k);
  k.kind = MPG__BARRIER;
  return run_coll(ops, c, &k, timeout_s);
}

/* In-place all_reduce of n doubles. */
static mpg_status reduce_f64(bops *ops, mpg__comm *c, double *v, int n,
                             mpg_op op, double timeout_s) {
  mpg__coll k;
  memset(&k, 0, sizeof k);
  k.kind = MPG__ALL_REDUCE;
  k.send = v;
  k.recv = v;
  k.count = (size_t)n;
  k.dtype = MPG_F64;
  k.op = op;
  return run_coll(ops, c, &k, timeout_s);
}

/* ours: one split per dim set.  comms[i] gets this rank's group of set i. */
static mpg_status create_ours(bops *ops, mpg__comm *world, const plan *p,
                              int rank, mpg__comm **comms, long *ncoll) {
  for (int i = 0; i < p->nsets; i++) {
    int index, position;
    mpg_mesh_group_of(p->mesh, p->set[i], rank, &index, &position, NULL);
    (*ncoll)++;
    mpg_status st = ops->split(world, index, position, &comms[i]);
    if (st) return st;
  }
  return MPG_OK;
}

/* baseline: one world-collective split per group of every dim set; only
 * the members of group g join it (colour 0), the others pass -1. */
static mpg_status create_baseline(bops *ops, mpg__comm *world, const plan *p,
                                  int rank, mpg__comm **comms, long *ncoll) {
  for (int i = 0; i < p->nsets; i++) {
    int index, position;
    mpg_mesh_group_of(p->mesh, p->set[i], rank, &index, &position, NULL);
    for (int g = 0; g < p->num_groups[i]; g++) {
      mpg__comm *c = NULL;
      (*ncoll)++;
      mpg_status st = ops->split(world, g == index ? 0 : -1, position, &c);
      if (st) return st;
      if (c) {
        if (g != index || comms[i]) {
          ops->destroy(c);
          return mpg__fail(MPG_ERR_BACKEND,
                           "baseline: rank %d got a communicator for group %d "
                           "of set %d, its group is %d", rank, g, p->set[i],
                           index);
        }
        comms[i] = c;
      }
    }
  }
  return MPG_OK;
}

static mpg_status destroy_comms(bops *ops, mpg__comm **comms, int n) {
  mpg_status first = MPG_OK;
  for (int i = 0; i < n; i++) {
    mpg_status st = ops->destroy(comms[i]);
    if (st && !first) first = st;
    comms[i] = NULL;
  }
  return first;
}

/* Every group, gathered in position order over its new communicator,
 * holds exactly mpg_mesh_group_members.  *ok &= result. */
static mpg_status check_groups(bops *ops, const plan *p, int rank,
                               mpg__comm **comms, double timeout_s, int *ok) {
  int *got = malloc(sizeof(int) * (size_t)p->world);
  int *want = malloc(sizeof(int) * (size_t)p->world);
  if (!got || !want) {
    free(got);
    free(want);
    return mpg__fail(MPG_ERR_NOMEM, "check_groups: out of memory");
  }
  mpg_status st = MPG_OK;
  for (int i = 0; i < p->nsets && !st; i++) {
    int index;
    mpg_mesh_group_of(p->mesh, p->set[i], rank, &index, NULL, NULL);
    mpg_mesh_group_members(p->mesh, p->set[i], index, want);
    if (!comms[i]) {
      *ok = 0;
      continue;
    }
    mpg__coll k;
    memset(&k, 0, sizeof k);
    k.kind = MPG__ALL_GATHER;
    k.send = &rank;
    k.recv = got;
    k.count = 1;
    k.dtype = MPG_I32;
    st = run_coll(ops, comms[i], &k, timeout_s);
    if (!st &&
        memcmp(got, want, sizeof(int) * (size_t)p->group_size[i]) != 0)
      *ok = 0;
  }
  free(got);
  free(want);
  return st;
}

typedef struct create_result {
  long ours_coll_min, ours_coll_max, base_coll_min, base_coll_max;
  long api_setup;       /* mpg__ctx_setup_collectives, max over ranks */
  int ok;               /* every check passed on every rank */
  double ours_ms[MAX_REPEAT], base_ms[MAX_REPEAT];
} create_result;

/* The body every rank runs.  res is written by rank 0 only (every rank
 * holds the same reduced figures). */
static mpg_status create_body(bops *ops, const mpg__world_args *a,
                              const mpg_init_opts *api_opts, const plan *p,
                              int repeat, create_result *res) {
  mpg__comm *world = NULL;
  mpg__comm *ours[MAX_SETS] = {0}, *base[MAX_SETS] = {0};
  const double to = a->timeout_s;
  const int rank = a->rank;
  mpg_status st = ops->world_init(a, &world);
  if (st) return st;
  int ok = 1;
  long ours_n = 0, base_n = 0;

  /* Validation pass (untimed): both methods, checked. */
  st = create_ours(ops, world, p, rank, ours, &ours_n);
  if (!st) st = create_baseline(ops, world, p, rank, base, &base_n);
  if (!st) st = check_groups(ops, p, rank, ours, to, &ok);
  if (!st) st = check_groups(ops, p, rank, base, to, &ok);
  if (!st) st = destroy_comms(ops, ours, p->nsets);
  if (!st) st = destroy_comms(ops, base, p->nsets);

  for (int r = 0; r < repeat && !st; r++) {
    for (int half = 0; half < 2 && !st; half++) {
      /* Even passes: ours first; odd passes: baseline first. */
      int do_ours = (half == 0) == (r % 2 == 0);
      mpg__comm **comms = do_ours ? ours : base;
      long n = 0;
      st = barrier(ops, world, to);
      if (st) break;
      double t0 = mpg__now();
      st = do_ours ? create_ours(ops, world, p, rank, comms, &n)
                   : create_baseline(ops, world, p, rank, comms, &n);
      double t[1] = {(mpg__now() - t0) * 1e3};
      if (st) break;
      if (n != (do_ours ? ours_n : base_n)) ok = 0;
      st = destroy_comms(ops, comms, p->nsets);
      if (!st) st = reduce_f64(ops, world, t, 1, MPG_OP_MAX, to);
      if (!st && rank == 0) (do_ours ? res->ours_ms : res->base_ms)[r] = t[0];
    }
  }
  if (st) {
    destroy_comms(ops, ours, p->nsets);
    destroy_comms(ops, base, p->nsets);
    ops->destroy(world);
    return st;
  }

  /* The public path must agree with ours: 1 world join + one split per
   * dim set. */
  mpg_ctx *ctx = NULL;
  long api = -1;
  st = mpg_ctx_create(p->mesh, api_opts, &ctx);
  if (!st) {
    api = mpg__ctx_setup_collectives(ctx);
    st = mpg_ctx_destroy(ctx);
  }
  if (!st && api != 1 + ours_n) ok = 0;

  double mx[4] = {(double)ours_n, (double)base_n, (double)api, 0};
  double mn[4] = {(double)ours_n, (double)base_n, (double)ok, 0};
  if (!st) st = reduce_f64(ops, world, mx, 3, MPG_OP_MAX, to);
  if (!st) st = reduce_f64(ops, world, mn, 3, MPG_OP_MIN, to);
  mpg_status st2 = ops->destroy(world);
  if (!st) st = st2;
  if (!st && rank == 0) {
    res->ours_coll_max = (long)mx[0];
    res->base_coll_max = (long)mx[1];
    res->api_setup = (long)mx[2];
    res->ours_coll_min = (long)mn[0];
    res->base_coll_min = (long)mn[1];
    res->ok = mn[2] > 0.5 && res->ours_coll_min == res->ours_coll_max &&
              res->base_coll_min == res->base_coll_max;
  }
  return st;
}

static void create_header(void) {
  printf("group creation: ours = one world split per dim set; baseline = one "
         "world split per group of every dim set (torch new_group / "
         "Megatron).\n"
         "coll/rank = splits each rank entered; ms = wall time of the whole "
         "creation, max over ranks; median and best of the timed passes;\n"
         "ratio = baseline / ours (medians); sets = dim sets needing a "
         "communicator (world excluded); groups = their groups.\n");
  printf("%-7s %5s  %-22s %4s %6s | %-30s | %s\n", "", "", "", "", "",
         "ours (one split per dim set)", "baseline (one split per group)");
  printf("%-7s %5s  %-22s %4s %6s | %9s %10s %9s | %9s %10s %9s | %7s  %s\n",
         "backend", "world", "mesh (+ dp_cp)", "sets", "groups", "coll/rank",
         "ms median", "ms best", "coll/rank", "ms median", "ms best",
         "ratio", "check");
}

static void create_row(const char *backend, const plan *p,
                       const create_result *r, int repeat) {
  double om = median_of(r->ours_ms, repeat), ob = min_of(r->ours_ms, repeat);
  double bm = median_of(r->base_ms, repeat), bb = min_of(r->base_ms, repeat);
  printf("%-7s %5d  %-22s %4d %6ld | %9ld %10.3f %9.3f | %9ld %10.3f %9.3f | "
         "%6.1fx  %s\n",
         backend, p->world, p->dims, p->nsets, p->groups, r->ours_coll_max, om,
         ob, r->base_coll_max, bm, bb, om > 0 ? bm / om : 0.0,
         r->ok ? "ok" : "FAILED");
  fflush(stdout);
}

/* ------------------------------------------------------------------------ */
/* all_reduce bandwidth through the public API                               */
/* ------------------------------------------------------------------------ */

typedef struct ar_row {
  long long bytes;
  int iters;
  double us_med, us_best;
  long long wrong;
} ar_row;

typedef struct ar_result {
  int nsizes;
  ar_row rows[MAX_SIZES];
} ar_result;

static int make_sizes(const options *o, long long *sizes) {
  int n = 0;
  for (long long b = o->min_bytes; b <= o->max_bytes && n < MAX_SIZES - 1;
       b *= 4)
    sizes[n++] = b;
  if (sizes[n - 1] != o->max_bytes) sizes[n++] = o->max_bytes;
  return n;
}

static mpg_status allreduce_body(const mpg_init_opts *opts,
                                 const mpg_mesh *mesh, const options *o,
                                 ar_result *res) {
  mpg_ctx *ctx = NULL;
  mpg_group *world = NULL;
  float *send = NULL, *recv = NULL;
  mpg_status st = mpg_ctx_create(mesh, opts, &ctx);
  if (st) return st;
  int rank = mpg_ctx_rank(ctx), n = mpg_ctx_world_size(ctx);
  size_t maxb = (size_t)o->max_bytes;
  if (!(st = mpg_ctx_group(ctx, "world", &world)) &&
      !(st = mpg_ctx_mem_alloc(ctx, maxb, 0, (void **)&send)))
    st = mpg_ctx_mem_alloc(ctx, maxb, 0, (void **)&recv);
  if (st) goto out;
  for (size_t i = 0; i < maxb / 4; i++) send[i] = (float)(rank + 1);
  const float expect = (float)n * (float)(n + 1) / 2.0f;

  long long sizes[MAX_SIZES];
  int nsizes = make_sizes(o, sizes);
  double *blk = malloc(sizeof *blk * (size_t)o->repeat);
  if (!blk) {
    st = MPG_ERR_NOMEM;
    goto out;
  }
  for (int s = 0; s < nsizes && !st; s++) {
    size_t count = (size_t)sizes[s] / 4;
    /* About BLOCK_BUDGET bytes per block, 2..--iters calls. */
    double fit = BLOCK_BUDGET / (double)sizes[s];
    int iters = fit < 2 ? 2 : fit > o->iters ? o->iters : (int)fit;
    if (iters > o->iters) iters = o->iters;
    int warm = o->warmup < iters ? o->warmup : iters;
    for (int i = 0; i < warm && !st; i++)
      st = mpg_all_reduce(world, send, recv, count, MPG_F32, MPG_OP_SUM, NULL,
                          NULL);
    for (int r = 0; r < o->repeat && !st; r++) {
      st = mpg_barrier(world, NULL);
      double t0 = now_s();
      for (int i = 0; i < iters && !st; i++)
        st = mpg_all_reduce(world, send, recv, count, MPG_F32, MPG_OP_SUM,
                            NULL, NULL);
      double t = (now_s() - t0) / iters * 1e6;
      if (!st)
        st = mpg_all_reduce(world, &t, &t, 1, MPG_F64, MPG_OP_MAX, NULL, NULL);
      blk[r] = t;
    }
    if (st) break;
    int64_t wrong = 0;
    for (size_t i = 0; i < count; i++) wrong += recv[i] != expect;
    st = mpg_all_reduce(world, &wrong, &wrong, 1, MPG_I64, MPG_OP_SUM, NULL,
                        NULL);
    if (!st && rank == 0) {
      ar_row *row = &res->rows[s];
      row->bytes = sizes[s];
      row->iters = iters;
      row->us_med = median_of(blk, o->repeat);
      row->us_best = min_of(blk, o->repeat);
      row->wrong = wrong;
      res->nsizes = s + 1;
    }
  }
  free(blk);
out:
  if (recv) mpg_ctx_mem_free(ctx, recv);
  if (send) mpg_ctx_mem_free(ctx, send);
  mpg_status st2 = mpg_ctx_destroy(ctx);
  return st ? st : st2;
}

/* Returns 1 if a result was wrong. */
static int print_allreduce(const char *backend, int n, const options *o,
                           const ar_result *r) {
  double bus = 2.0 * (n - 1) / n, sum_bus = 0;
  long long wrong = 0;
  printf("# all_reduce_perf-style: %s backend, %d ranks, f32 sum over "
         "\"world\" (mpg_all_reduce, blocking, out of place)\n"
         "# time = per call, max over ranks, median of %d timed blocks "
         "(best busbw: the fastest block); busbw = algbw * 2(n-1)/n = algbw "
         "* %.4g\n#\n",
         backend, n, o->repeat, bus);
  printf("# %12s %12s %6s %6s %6s %12s %11s %11s %11s %8s\n", "size(B)",
         "count", "type", "redop", "iters", "time(us)", "algbw(GB/s)",
         "busbw(GB/s)", "best busbw", "#wrong");
  for (int i = 0; i < r->nsizes; i++) {
    const ar_row *w = &r->rows[i];
    double alg = (double)w->bytes / (w->us_med * 1e-6) / 1e9;
    double best = (double)w->bytes / (w->us_best * 1e-6) / 1e9 * bus;
    printf("  %12lld %12lld %6s %6s %6d %12.2f %11.4f %11.4f %11.4f %8lld\n",
           w->bytes, w->bytes / 4, "float", "sum", w->iters, w->us_med, alg,
           alg * bus, best, w->wrong);
    sum_bus += alg * bus;
    wrong += w->wrong;
  }
  printf("# Out of bounds values : %lld %s\n", wrong, wrong ? "FAILED" : "OK");
  printf("# Avg bus bandwidth    : %.4f GB/s\n#\n",
         r->nsizes ? sum_bus / r->nsizes : 0.0);
  fflush(stdout);
  return wrong != 0;
}

/* ------------------------------------------------------------------------ */
/* Thread backend driver                                                     */
/* ------------------------------------------------------------------------ */

#ifndef MPG_BENCH_MPI

typedef struct thread_arg {
  const plan *p;
  const mpg_mesh *mesh;
  const options *o;
  create_result *cres;
  ar_result *ares;
} thread_arg;

static mpg_status thread_create_main(const mpg_init_opts *opts, void *arg) {
  thread_arg *t = arg;
  mpg__world_args a;
  memset(&a, 0, sizeof a);
  a.rank = opts->rank;
  a.world_size = opts->world_size;
  a.local_rank = opts->local_rank >= 0 ? opts->local_rank : opts->rank;
  a.local_world_size =
      opts->local_world_size > 0 ? opts->local_world_size : opts->world_size;
  a.timeout_s = opts->backend.timeout_s;
  a.device = -1;
  a.master_addr = "";
  a.master_port = -1;
  a.thread_world = opts->thread_world;
  return create_body(&mpg__backend_thread, &a, opts, t->p, t->o->repeat,
                     t->cres);
}

static mpg_status thread_allreduce_main(const mpg_init_opts *opts, void *arg) {
  thread_arg *t = arg;
  return allreduce_body(opts, t->mesh, t->o, t->ares);
}

static int fail(const char *what, mpg_status st) {
  fprintf(stderr, PROG ": %s: %s: %s\n", what, mpg_status_name(st),
          mpg_last_error());
  return 1;
}

int main(int argc, char **argv) {
  options o;
  int rc = parse_args(argc, argv, &o);
  if (rc) {
    if (rc == 2) usage(stderr);
    return rc == 1 ? 0 : 2;
  }
  static const char *const defaults[] = {
      "dp=2,cp=2,tp=2", "dp=4,cp=2,tp=8", "pp=4,dp=4,cp=2,tp=8",
      "pp=4,dp=16,cp=2,tp=8"};
  if (o.mode == 0) {
    if (o.nmeshes == 0) {
      o.nmeshes = 4;
      for (int i = 0; i < 4; i++) o.meshes[i] = defaults[i];
    }
    static mpg_mesh *meshes[MAX_MESHES];
    static plan plans[MAX_MESHES];
    for (int i = 0; i < o.nmeshes; i++) { /* every mesh checked up front */
      mpg_status st = make_mesh(o.meshes[i], 0, &meshes[i]);
      if (!st) make_plan(meshes[i], o.meshes[i], &plans[i]);
      if (st || plans[i].world < 2 || plans[i].world > 4096) {
        if (st)
          fprintf(stderr, PROG ": --mesh \"%s\": %s\n", o.meshes[i],
                  mpg_last_error());
        else
          fprintf(stderr, PROG ": mesh \"%s\" has %d ranks, expected "
                  "2..4096\n", o.meshes[i], plans[i].world);
        for (int j = 0; j <= i; j++) mpg_mesh_destroy(meshes[j]);
        return 2;
      }
    }
    if (!o.no_header) create_header();
    static create_result res;
    for (int i = 0; i < o.nmeshes; i++) {
      mpg_mesh *m = meshes[i];
      plan p = plans[i];
      memset(&res, 0, sizeof res);
      thread_arg t = {&p, m, &o, &res, NULL};
      mpg_status st = mpg_thread_run(p.world, o.timeout_s, thread_create_main, &t, NULL);
      if (st) {
        rc = fail(o.meshes[i], st);
        break;
      }
      create_row("thread", &p, &res, o.repeat);
      rc |= !res.ok;
    }
    for (int i = 0; i < o.nmeshes; i++) mpg_mesh_destroy(meshes[i]);
    return rc ? 1 : 0;
  }

  char dims[32];
  snprintf(dims, sizeof dims, "dp=%d", o.ranks);
  mpg_mesh *m = NULL;
  mpg_status st = make_mesh(dims, 0, &m);
  if (st) return fail(dims, st);
  static ar_result res;
  thread_arg t = {NULL, m, &o, NULL, &res};
  st = mpg_thread_run(o.ranks, o.timeout_s, thread_allreduce_main, &t, NULL);
  mpg_mesh_destroy(m);
  if (st) return fail("allreduce", st);
  return print_allreduce("thread", o.ranks, &o, &res);
}

#else /* MPG_BENCH_MPI */

/* ------------------------------------------------------------------------ */
/* MPI backend driver                                                        */
/* ------------------------------------------------------------------------ */

/* A failed rank cannot be left to hang its peers until the timeout. */
static int fail_abort(int rank, const char *what, mpg_status st) {
  fprintf(stderr, PROG ": rank %d: %s: %s: %s\n", rank, what,
          mpg_status_name(st), mpg_last_error());
  fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
  return 1;
}

int main(int argc, char **argv) {
  /* MPI is ours to initialise: the backend then leaves it alone, and several
   * worlds can be made one after another. */
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  g_quiet = rank != 0;
  options o;
  int prc = parse_args(argc, argv, &o);
  if (prc) {
    if (prc == 2 && rank == 0) usage(stderr);
    MPI_Finalize();
    return prc == 1 ? 0 : 2;
  }
  mpg_init_opts opts = MPG_INIT_OPTS_INIT;
  opts.backend.name = MPG_BACKEND_MPI;
  opts.rank = rank;
  opts.world_size = size;
  opts.local_rank = rank;
  opts.local_world_size = size;
  opts.backend.timeout_s = o.timeout_s;
  int rc = 0;

  if (o.mode == 0) {
    const char *dims = o.nmeshes ? o.meshes[0]
                     : size == 4  ? "dp=2,cp=2"
                     : size == 8  ? "dp=2,cp=2,tp=2"
                     : size == 16 ? "pp=2,dp=2,cp=2,tp=2" : NULL;
    if (!dims) {
      if (rank == 0)
        fprintf(stderr, PROG ": no default mesh for %d processes: pass "
                "--mesh\n", size);
      MPI_Finalize();
      return 2;
    }
    mpg_mesh *m = NULL;
    mpg_status st = make_mesh(dims, size, &m);
    if (st) {
      if (rank == 0)
        fprintf(stderr, PROG ": mesh \"%s\" on %d processes: %s\n", dims,
                size, mpg_last_error());
      MPI_Finalize();
      return 2;
    }
    plan p;
    make_plan(m, dims, &p);
    mpg__world_args a;
    memset(&a, 0, sizeof a);
    a.rank = rank;
    a.world_size = size;
    a.local_rank = rank;
    a.local_world_size = size;
    a.timeout_s = o.timeout_s;
    a.device = -1;
    a.master_addr = "";
    a.master_port = -1;
    a.mpi_comm = NULL; /* MPI_COMM_WORLD */
    static create_result res;
    st = create_body(&mpg__backend_mpi, &a, &opts, &p, o.repeat, &res);
    if (st) return fail_abort(rank, "create", st);
    if (rank == 0) {
      if (!o.no_header) create_header();
      create_row("mpi", &p, &res, o.repeat);
      rc = !res.ok;
    }
    mpg_mesh_destroy(m);
  } else {
    char dims[32];
    snprintf(dims, sizeof dims, "dp=%d", size);
    mpg_mesh *m = NULL;
    mpg_status st = make_mesh(dims, size, &m);
    if (st) return fail_abort(rank, dims, st);
    static ar_result res;
    st = allreduce_body(&opts, m, &o, &res);
    mpg_mesh_destroy(m);
    if (st) return fail_abort(rank, "allreduce", st);
    if (rank == 0) rc = print_allreduce("mpi", size, &o, &res);
  }
  MPI_Bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD);
  MPI_Finalize();
  return rc;
}

#endif /* MPG_BENCH_MPI */
