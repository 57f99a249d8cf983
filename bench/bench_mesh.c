/*
 * bench_mesh - benchmark of the mesh module (mesh/mesh.c).
 *
 * Builds a 131,072-rank mesh (pp=16, dp=128, cp=8, tp=8) with the flattened
 * sets dp_cp = [dp, cp] and tp_cp = [cp, tp] (flattened sets list their dims
 * in mesh order, so "tp_cp" holds cp then tp), plus an 8-rank mesh of the
 * same shape (pp=1, dp=2, cp=2, tp=2) for comparison, and measures:
 *
 *   1. lookups: ns per mpg_mesh_group_of call for every dim set, over all
 *      ranks; ns per mpg_mesh_group_member call for every dim set, over every
 *      (group, position); ns per "full tp group of a rank" (group_of +
 *      group_members of its 8 members).  Goal: <= 1000 ns per lookup.
 *   2. enumeration: ms to list every group of every dim set (pp, dp, cp, tp,
 *      dp_cp, tp_cp, world) with mpg_mesh_group_members, and ranks/s.
 *      Goal: < 100 ms.  A checksum of the members is accumulated; each dim
 *      set's member sum must be 0 + 1 + ... + (world - 1).
 *   3. memory: VmRSS / VmHWM from /proc/self/status around mpg_mesh_create
 *      and around the whole run, and the heap bytes the mesh holds (glibc
 *      mallinfo2 delta around mpg_mesh_create), for both meshes: the mesh
 *      is O(ndims), so these do not grow with the world size.
 *
 * Sanity checks (untimed): for every dim set and every group, the members
 * cover every rank exactly once (partition), group_of(member) gives back
 * (group, position), and group_rank(group, position) gives back the member.
 *
 * Times are taken with clock_gettime(CLOCK_MONOTONIC).  Each measurement is
 * run once to warm up and then --repeat times; the median and the best
 * (minimum) of the repeats are reported.  On the 8-rank mesh each timed
 * block loops over the work enough times to do >= 131072 operations and
 * reports the time of one pass.
 *
 * Usage: bench_mesh [--repeat N] [--json] [--help]
 *   --repeat N, --repeat=N  timed repeats of every measurement, 1..1000
 *                           (default 5)
 *   --json                  print one JSON object with every figure on
 *                           stdout instead of the tables
 *   --help, -h              print this usage and exit 0
 *
 * Exit status: 0 when every sanity check passes (a missed time goal is
 * reported as MISS but does not fail the run, timings depend on the
 * machine); 1 when a meshpg call or a sanity check fails; 2 on a usage
 * error.
 */
#include "meshpg.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define GOAL_LOOKUP_NS 1000.0
#define GOAL_ENUM_MS 100.0
#define MIN_OPS 131072 /* operations per timed block, at least */
#define MAX_REPEAT 1000
#define NSETS_MAX (MPG_MAX_DIMS + MPG_MAX_FLATTEN + 1)

static const char *const expected_sets[] = {"pp",    "dp",    "cp",   "tp",
                                            "dp_cp", "tp_cp", "world"};
#define NEXPECTED ((int)(sizeof expected_sets / sizeof expected_sets[0]))

/* Consumed at the end so no timed loop's results are dead. */
static volatile uint64_t g_sink;

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

typedef struct stat2 {
  double median;
  double best;
} stat2;

static stat2 summarize(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  stat2 s;
  s.best = v[0];
  s.median = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  return s;
}

/* ------------------------------------------------------------------------ */
/* Memory                                                                    */
/* ------------------------------------------------------------------------ */

typedef struct memsnap {
  long rss_kib; /* VmRSS */
  long hwm_kib; /* VmHWM */
  long long heap_bytes; /* bytes in use by malloc */
} memsnap;

static long status_field_kib(const char *text, const char *key) {
  const char *p = strstr(text, key);
  if (!p) return -1;
  p += strlen(key);
  while (*p == ' ' || *p == '\t') p++;
  return strtol(p, NULL, 10);
}

static memsnap mem_snapshot(void) {
  memsnap m = {-1, -1, -1};
  FILE *f = fopen("/proc/self/status", "r");
  if (f) {
    char buf[8192];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    fclose(f);
    m.rss_kib = status_field_kib(buf, "VmRSS:");
    m.hwm_kib = status_field_kib(buf, "VmHWM:");
  }
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
  struct mallinfo2 mi = mallinfo2();
  m.heap_bytes = (long long)mi.uordblks + (long long)mi.hblkhd;
#endif
  return m;
}

/* ------------------------------------------------------------------------ */
/* Results                                                                   */
/* ------------------------------------------------------------------------ */

typedef struct set_result {
  char name[MPG_NAME_MAX]; /* copied: the mesh's string dies with the mesh */
  int group_size;
  int num_groups;
  stat2 group_of_ns;   /* per call */
  stat2 group_rank_ns; /* per call */
  stat2 enum_ms;       /* all groups of this set */
} set_result;

typedef struct mesh_result {
  const char *label;
  const char *dims;
  int world;
  int nsets;
  int inner; /* passes per timed block */
  set_result sets[NSETS_MAX];
  stat2 group_of_all_ns;  /* every set for every rank, mixed */
  stat2 tp_members_ns;    /* group_of(tp) + group_members(tp) per rank */
  int tp_group_size;
  stat2 enum_total_ms;    /* every group of every set */
  long long enum_members; /* ranks listed by one full enumeration */
  uint64_t checksum;
  int partition_ok;
  int consistency_ok;
  int sums_ok;
  memsnap before, after_create, after_run;
  long long mesh_heap_bytes;
} mesh_result;

static int fail_call(const char *what, mpg_status st) {
  fprintf(stderr, "bench_mesh: %s: %s (%s): %s\n", what, mpg_status_name(st),
          mpg_strerror(st), mpg_last_error());
  return 1;
}

/* ------------------------------------------------------------------------ */
/* Timed kernels: each returns nanoseconds for `inner` passes                */
/* ------------------------------------------------------------------------ */

static double time_group_of_set(const mpg_mesh *m, int set, int world,
                                int inner, uint64_t *chk) {
  uint64_t acc = 0;
  double t0 = now_ns();
  for (int k = 0; k < inner; k++)
    for (int r = 0; r < world; r++) {
      int gi, pos, gs;
      mpg_mesh_group_of(m, set, r, &gi, &pos, &gs);
      acc += (uint64_t)gi * 131u + (uint64_t)pos + (uint64_t)gs;
    }
  double t = now_ns() - t0;
  *chk += acc;
  return t;
}

static double time_group_of_all(const mpg_mesh *m, int nsets, int world,
                                int inner, uint64_t *chk) {
  uint64_t acc = 0;
  double t0 = now_ns();
  for (int k = 0; k < inner; k++)
    for (int r = 0; r < world; r++)
      for (int s = 0; s < nsets; s++) {
        int gi, pos;
        mpg_mesh_group_of(m, s, r, &gi, &pos, NULL);
        acc += (uint64_t)gi * 131u + (uint64_t)pos;
      }
  double t = now_ns() - t0;
  *chk += acc;
  return t;
}

static double time_group_rank_set(const mpg_mesh *m, int set, int ngroups,
                                  int gsize, int inner, uint64_t *chk) {
  uint64_t acc = 0;
  double t0 = now_ns();
  for (int k = 0; k < inner; k++)
    for (int g = 0; g < ngroups; g++)
      for (int p = 0; p < gsize; p++) {
        int r;
        mpg_mesh_group_member(m, set, g, p, &r);
        acc += (uint64_t)r;
      }
  double t = now_ns() - t0;
  *chk += acc;
  return t;
}

static double time_tp_members(const mpg_mesh *m, int tp, int world,
                              int inner, int *buf, uint64_t *chk) {
  uint64_t acc = 0;
  double t0 = now_ns();
  for (int k = 0; k < inner; k++)
    for (int r = 0; r < world; r++) {
      int gi, pos, gs;
      mpg_mesh_group_of(m, tp, r, &gi, &pos, &gs);
      mpg_mesh_group_members(m, tp, gi, buf);
      acc += (uint64_t)buf[pos] + (uint64_t)buf[gs - 1];
    }
  double t = now_ns() - t0;
  *chk += acc;
  return t;
}

/* All groups of one set; adds the members (position-weighted) to *chk and
 * their plain sum to *sum. */
static double time_enum_set(const mpg_mesh *m, int set, int ngroups, int gsize,
                            int inner, int *buf, uint64_t *chk,
                            uint64_t *sum) {
  uint64_t acc = 0, plain = 0;
  double t0 = now_ns();
  for (int k = 0; k < inner; k++)
    for (int g = 0; g < ngroups; g++) {
      mpg_mesh_group_members(m, set, g, buf);
      for (int p = 0; p < gsize; p++) {
        plain += (uint64_t)buf[p];
        acc += (uint64_t)buf[p] * (uint64_t)(p + 1);
      }
    }
  double t = now_ns() - t0;
  *chk += acc;
  *sum = plain / (uint64_t)inner;
  return t;
}

/* ------------------------------------------------------------------------ */
/* Sanity checks (untimed)                                                   */
/* ------------------------------------------------------------------------ */

/* For every set: members of all groups cover every rank once; group_of and
 * group_rank agree with group_members. */
static void check_mesh(const mpg_mesh *m, mesh_result *res, int *buf,
                       unsigned char *seen) {
  res->partition_ok = 1;
  res->consistency_ok = 1;
  int world = res->world;
  for (int s = 0; s < res->nsets; s++) {
    const set_result *sr = &res->sets[s];
    memset(seen, 0, (size_t)world);
    for (int g = 0; g < sr->num_groups; g++) {
      if (mpg_mesh_group_members(m, s, g, buf) != MPG_OK) {
        res->consistency_ok = 0;
        return;
      }
      for (int p = 0; p < sr->group_size; p++) {
        int r = buf[p];
        if (r < 0 || r >= world || seen[r]) {
          if (res->partition_ok)
            fprintf(stderr,
                    "bench_mesh: %s: dim set %s group %d position %d: rank %d "
                    "%s\n",
                    res->label, sr->name, g, p, r,
                    (r < 0 || r >= world) ? "out of range" : "seen twice");
          res->partition_ok = 0;
          continue;
        }
        seen[r] = 1;
        int gi = -1, pos = -1, gs = -1, back = -1;
        mpg_mesh_group_of(m, s, r, &gi, &pos, &gs);
        mpg_mesh_group_member(m, s, g, p, &back);
        if (gi != g || pos != p || gs != sr->group_size || back != r) {
          if (res->consistency_ok)
            fprintf(stderr,
                    "bench_mesh: %s: dim set %s rank %d: members say (group "
                    "%d, position %d), group_of says (%d, %d, size %d), "
                    "group_rank says %d\n",
                    res->label, sr->name, r, g, p, gi, pos, gs, back);
          res->consistency_ok = 0;
        }
      }
    }
    for (int r = 0; r < world; r++)
      if (!seen[r]) {
        if (res->partition_ok)
          fprintf(stderr, "bench_mesh: %s: dim set %s: rank %d in no group\n",
                  res->label, sr->name, r);
        res->partition_ok = 0;
        break;
      }
  }
}

/* ------------------------------------------------------------------------ */
/* One mesh                                                                  */
/* ------------------------------------------------------------------------ */

static int build_spec(mpg_spec *spec, const char *dims) {
  mpg_status st;
  if ((st = mpg_spec_init(spec))) return fail_call("mpg_spec_init", st);
  if ((st = mpg_spec_set_mesh(spec, dims)))
    return fail_call("mpg_spec_set_mesh", st);
  if ((st = mpg_spec_add_flatten(spec, "dp_cp", "dp,cp")))
    return fail_call("mpg_spec_add_flatten(dp_cp)", st);
  /* Named tp_cp, but the dims must be listed in mesh order: cp, tp. */
  if ((st = mpg_spec_add_flatten(spec, "tp_cp", "cp,tp")))
    return fail_call("mpg_spec_add_flatten(tp_cp)", st);
  return 0;
}

static int run_mesh(const char *label, const char *dims, int world,
                    int repeat, mesh_result *res) {
  memset(res, 0, sizeof *res);
  res->label = label;
  res->dims = dims;
  res->world = world;

  mpg_spec spec = MPG_SPEC_INIT;
  if (build_spec(&spec, dims)) return 1;

  mpg_mesh *m = NULL;
  res->before = mem_snapshot();
  mpg_status st = mpg_mesh_create(&spec, world, &m);
  res->after_create = mem_snapshot();
  if (st) return fail_call("mpg_mesh_create", st);
  res->mesh_heap_bytes =
      (res->before.heap_bytes >= 0 && res->after_create.heap_bytes >= 0)
          ? res->after_create.heap_bytes - res->before.heap_bytes
          : -1;

  int rc = 1;
  int *buf = NULL;
  unsigned char *seen = NULL;
  double *samples = NULL;

  if (mpg_mesh_world_size(m) != world) {
    fprintf(stderr, "bench_mesh: %s: world size %d, expected %d\n", label,
            mpg_mesh_world_size(m), world);
    goto out;
  }
  res->nsets = mpg_mesh_num_dimsets(m);
  if (res->nsets != NEXPECTED) {
    fprintf(stderr, "bench_mesh: %s: %d dim sets, expected %d\n", label,
            res->nsets, NEXPECTED);
    goto out;
  }
  int max_group = 0;
  for (int s = 0; s < res->nsets; s++) {
    set_result *sr = &res->sets[s];
    const char *name = NULL;
    if ((st = mpg_mesh_dimset_info(m, s, &name, &sr->group_size,
                                   &sr->num_groups))) {
      fail_call("mpg_mesh_dimset_info", st);
      goto out;
    }
    snprintf(sr->name, sizeof sr->name, "%s", name);
    int found = -1;
    if ((st = mpg_mesh_dimset_find(m, expected_sets[s], &found)) ||
        found != s || strcmp(sr->name, expected_sets[s]) != 0) {
      fprintf(stderr, "bench_mesh: %s: dim set %d is \"%s\", expected \"%s\"\n",
              label, s, sr->name, expected_sets[s]);
      goto out;
    }
    if ((long long)sr->group_size * sr->num_groups != world) {
      fprintf(stderr, "bench_mesh: %s: dim set %s: %d groups of %d != %d\n",
              label, sr->name, sr->num_groups, sr->group_size, world);
      goto out;
    }
    if (sr->group_size > max_group) max_group = sr->group_size;
  }
  int tp = 3;
  res->tp_group_size = res->sets[tp].group_size;

  buf = malloc(sizeof *buf * (size_t)max_group);
  seen = malloc((size_t)world);
  samples = malloc(sizeof *samples * (size_t)repeat);
  if (!buf || !seen || !samples) {
    fprintf(stderr, "bench_mesh: out of memory\n");
    goto out;
  }

  check_mesh(m, res, buf, seen);

  res->inner = world >= MIN_OPS ? 1 : (MIN_OPS + world - 1) / world;
  const int inner = res->inner;
  uint64_t chk = 0;

/* Warm up once, then `repeat` timed runs of EXPR (ns for `inner` passes),
 * each divided by DIV; the summary goes to DST. */
#define MEASURE(DST, EXPR, DIV)                             \
  do {                                                      \
    (void)(EXPR);                                           \
    for (int i_ = 0; i_ < repeat; i_++)                     \
      samples[i_] = (EXPR) / (DIV);                         \
    (DST) = summarize(samples, repeat);                     \
  } while (0)

  /* 1. Lookups. */
  for (int s = 0; s < res->nsets; s++) {
    set_result *sr = &res->sets[s];
    MEASURE(sr->group_of_ns, time_group_of_set(m, s, world, inner, &chk),
            (double)inner * world);
    MEASURE(sr->group_rank_ns,
            time_group_rank_set(m, s, sr->num_groups, sr->group_size, inner,
                                &chk),
            (double)inner * world);
  }
  MEASURE(res->group_of_all_ns,
          time_group_of_all(m, res->nsets, world, inner, &chk),
          (double)inner * world * res->nsets);
  MEASURE(res->tp_members_ns, time_tp_members(m, tp, world, inner, buf, &chk),
          (double)inner * world);

  /* 2. Enumeration, per set and in total. */
  const uint64_t expect_sum = (uint64_t)world * (uint64_t)(world - 1) / 2;
  res->sums_ok = 1;
  for (int s = 0; s < res->nsets; s++) {
    set_result *sr = &res->sets[s];
    uint64_t sum = 0;
    MEASURE(sr->enum_ms,
            time_enum_set(m, s, sr->num_groups, sr->group_size, inner, buf,
                          &chk, &sum),
            (double)inner * 1e6);
    if (sum != expect_sum) {
      fprintf(stderr,
              "bench_mesh: %s: dim set %s: members sum to %" PRIu64
              ", expected %" PRIu64 "\n",
              label, sr->name, sum, expect_sum);
      res->sums_ok = 0;
    }
  }
  res->enum_members = (long long)world * res->nsets;
  uint64_t total_chk = 0;
  for (int i = -1; i < repeat; i++) { /* i == -1: warm-up */
    /* One clock pair around a whole sweep of every set. */
    uint64_t c = 0;
    double t0 = now_ns();
    for (int k = 0; k < inner; k++)
      for (int s = 0; s < res->nsets; s++) {
        const set_result *sr = &res->sets[s];
        for (int g = 0; g < sr->num_groups; g++) {
          mpg_mesh_group_members(m, s, g, buf);
          for (int p = 0; p < sr->group_size; p++)
            c += (uint64_t)buf[p] * (uint64_t)(p + 1);
        }
      }
    double t = now_ns() - t0;
    total_chk = c / (uint64_t)inner;
    if (i >= 0) samples[i] = t / ((double)inner * 1e6);
  }
  res->enum_total_ms = summarize(samples, repeat);
  res->checksum = total_chk;
  g_sink += chk;
#undef MEASURE

  rc = (res->partition_ok && res->consistency_ok && res->sums_ok) ? 0 : 1;

out:
  free(samples);
  free(seen);
  free(buf);
  res->after_run = mem_snapshot();
  mpg_mesh_destroy(m);
  return rc;
}

/* ------------------------------------------------------------------------ */
/* Output                                                                    */
/* ------------------------------------------------------------------------ */

static const char *verdict(int ok) { return ok ? "PASS" : "MISS"; }

static int lookup_pass(const mesh_result *r) {
  double worst = r->group_of_all_ns.median;
  for (int s = 0; s < r->nsets; s++) {
    if (r->sets[s].group_of_ns.median > worst)
      worst = r->sets[s].group_of_ns.median;
    if (r->sets[s].group_rank_ns.median > worst)
      worst = r->sets[s].group_rank_ns.median;
  }
  if (r->tp_members_ns.median > worst) worst = r->tp_members_ns.median;
  return worst <= GOAL_LOOKUP_NS;
}

static int enum_pass(const mesh_result *r) {
  return r->enum_total_ms.median < GOAL_ENUM_MS;
}

static void print_text(const mesh_result *res, int nres, int repeat) {
  printf("bench_mesh: mesh module benchmark (median / best of %d repeats, "
         "CLOCK_MONOTONIC)\n",
         repeat);
  for (int i = 0; i < nres; i++) {
    const mesh_result *r = &res[i];
    printf("\n== %s mesh: %s, flatten dp_cp=[dp,cp] tp_cp=[cp,tp]: %d ranks, "
           "%d dim sets ==\n",
           r->label, r->dims, r->world, r->nsets);
    if (r->inner > 1)
      printf("(tiny mesh: each timed block runs %d passes; figures are per "
             "pass)\n",
             r->inner);
    printf("\n1. Lookups, ns per call (goal <= %.0f ns)\n", GOAL_LOOKUP_NS);
    printf("  %-7s %10s %10s | %21s | %21s\n", "dimset", "group_size",
           "num_groups", "group_of med / best", "group_rank med / best");
    for (int s = 0; s < r->nsets; s++) {
      const set_result *sr = &r->sets[s];
      printf("  %-7s %10d %10d | %9.1f / %9.1f | %9.1f / %9.1f\n", sr->name,
             sr->group_size, sr->num_groups, sr->group_of_ns.median,
             sr->group_of_ns.best, sr->group_rank_ns.median,
             sr->group_rank_ns.best);
    }
    printf("  %-29s | %9.1f / %9.1f |   (all %d sets x %d ranks)\n",
           "group_of, every set mixed", r->group_of_all_ns.median,
           r->group_of_all_ns.best, r->nsets, r->world);
    printf("  %-29s | %9.1f / %9.1f |   (group_of + group_members, %d "
           "members)\n",
           "tp group of a rank", r->tp_members_ns.median,
           r->tp_members_ns.best, r->tp_group_size);
    printf("  lookup goal <= %.0f ns (worst median above): %s\n",
           GOAL_LOOKUP_NS, verdict(lookup_pass(r)));

    printf("\n2. Enumerate every group of every dim set with "
           "mpg_mesh_group_members (goal < %.0f ms)\n",
           GOAL_ENUM_MS);
    printf("  %-7s %10s %10s | %21s\n", "dimset", "group_size", "num_groups",
           "us med / best");
    for (int s = 0; s < r->nsets; s++) {
      const set_result *sr = &r->sets[s];
      printf("  %-7s %10d %10d | %9.2f / %9.2f\n", sr->name, sr->group_size,
             sr->num_groups, sr->enum_ms.median * 1e3, sr->enum_ms.best * 1e3);
    }
    double secs = r->enum_total_ms.median / 1e3;
    printf("  %-29s | %9.4f / %9.4f ms, %lld ranks listed, %.3g ranks/s\n",
           "all sets, one sweep", r->enum_total_ms.median,
           r->enum_total_ms.best, r->enum_members,
           secs > 0 ? (double)r->enum_members / secs : 0.0);
    printf("  checksum 0x%016" PRIx64 "; member sums %s; partition (every "
           "rank once, every set) %s; group_of/group_rank agree %s\n",
           r->checksum, r->sums_ok ? "ok" : "WRONG",
           r->partition_ok ? "ok" : "FAILED",
           r->consistency_ok ? "ok" : "FAILED");
    printf("  enumerate goal < %.0f ms: %s\n", GOAL_ENUM_MS,
           verdict(enum_pass(r)));

    printf("\n3. Memory (KiB unless noted)\n");
    printf("  %-28s %10s %10s\n", "", "VmRSS", "VmHWM");
    printf("  %-28s %10ld %10ld\n", "before mpg_mesh_create",
           r->before.rss_kib, r->before.hwm_kib);
    printf("  %-28s %10ld %10ld\n", "after mpg_mesh_create",
           r->after_create.rss_kib, r->after_create.hwm_kib);
    printf("  %-28s %10ld %10ld\n", "after the run (mesh freed)",
           r->after_run.rss_kib, r->after_run.hwm_kib);
    printf("  RSS growth from mpg_mesh_create: %ld KiB (page granularity); "
           "mesh heap: %lld bytes (mallinfo2)\n",
           r->after_create.rss_kib - r->before.rss_kib, r->mesh_heap_bytes);
    printf("  HWM growth over the run: %ld KiB (includes the caller's member "
           "buffer, %zu KiB, and the check bitmap, %d KiB)\n",
           r->after_run.hwm_kib - r->before.hwm_kib,
           (size_t)r->world * sizeof(int) / 1024, r->world / 1024);
  }
  if (nres == 2) {
    printf("\n== Memory vs world size ==\n");
    printf("  %-8s %10s %16s %20s\n", "mesh", "ranks", "mesh heap (B)",
           "RSS growth (KiB)");
    for (int i = 0; i < nres; i++)
      printf("  %-8s %10d %16lld %20ld\n", res[i].label, res[i].world,
             res[i].mesh_heap_bytes,
             res[i].after_create.rss_kib - res[i].before.rss_kib);
    printf("  mesh memory independent of world size: %s\n",
           res[0].mesh_heap_bytes == res[1].mesh_heap_bytes ? "yes" : "NO");
  }
}

static void json_stat(const char *key, stat2 s, const char *tail) {
  printf("\"%s\":{\"median\":%.6g,\"best\":%.6g}%s", key, s.median, s.best,
         tail);
}

static void print_json(const mesh_result *res, int nres, int repeat) {
  printf("{\"benchmark\":\"bench_mesh\",\"repeat\":%d,\"clock\":"
         "\"CLOCK_MONOTONIC\",\"goal_lookup_ns\":%.0f,\"goal_enumerate_ms\":"
         "%.0f,\"meshes\":[",
         repeat, GOAL_LOOKUP_NS, GOAL_ENUM_MS);
  for (int i = 0; i < nres; i++) {
    const mesh_result *r = &res[i];
    double secs = r->enum_total_ms.median / 1e3;
    printf("%s{\"label\":\"%s\",\"dims\":\"%s\",\"flatten\":{\"dp_cp\":"
           "[\"dp\",\"cp\"],\"tp_cp\":[\"cp\",\"tp\"]},\"world\":%d,"
           "\"passes_per_block\":%d,\"dimsets\":[",
           i ? "," : "", r->label, r->dims, r->world, r->inner);
    for (int s = 0; s < r->nsets; s++) {
      const set_result *sr = &r->sets[s];
      printf("%s{\"name\":\"%s\",\"group_size\":%d,\"num_groups\":%d,",
             s ? "," : "", sr->name, sr->group_size, sr->num_groups);
      json_stat("group_of_ns", sr->group_of_ns, ",");
      json_stat("group_rank_ns", sr->group_rank_ns, ",");
      json_stat("enumerate_ms", sr->enum_ms, "}");
    }
    printf("],\"lookup\":{");
    json_stat("group_of_all_ns", r->group_of_all_ns, ",");
    json_stat("tp_members_ns", r->tp_members_ns, ",");
    printf("\"tp_group_size\":%d,\"pass\":%s},", r->tp_group_size,
           lookup_pass(r) ? "true" : "false");
    printf("\"enumerate\":{");
    json_stat("total_ms", r->enum_total_ms, ",");
    printf("\"ranks_listed\":%lld,\"ranks_per_s\":%.6g,\"checksum\":\"0x%016"
           PRIx64 "\",\"sums_ok\":%s,\"partition_ok\":%s,\"consistency_ok\":"
           "%s,\"pass\":%s},",
           r->enum_members, secs > 0 ? (double)r->enum_members / secs : 0.0,
           r->checksum, r->sums_ok ? "true" : "false",
           r->partition_ok ? "true" : "false",
           r->consistency_ok ? "true" : "false",
           enum_pass(r) ? "true" : "false");
    printf("\"memory\":{\"rss_before_kib\":%ld,\"hwm_before_kib\":%ld,"
           "\"rss_after_create_kib\":%ld,\"hwm_after_create_kib\":%ld,"
           "\"rss_after_run_kib\":%ld,\"hwm_after_run_kib\":%ld,"
           "\"rss_growth_create_kib\":%ld,\"hwm_growth_run_kib\":%ld,"
           "\"mesh_heap_bytes\":%lld}}",
           r->before.rss_kib, r->before.hwm_kib, r->after_create.rss_kib,
           r->after_create.hwm_kib, r->after_run.rss_kib,
           r->after_run.hwm_kib, r->after_create.rss_kib - r->before.rss_kib,
           r->after_run.hwm_kib - r->before.hwm_kib, r->mesh_heap_bytes);
  }
  printf("],\"mesh_memory_independent_of_world\":%s}\n",
         nres == 2 && res[0].mesh_heap_bytes == res[1].mesh_heap_bytes
             ? "true"
             : "false");
}

/* ------------------------------------------------------------------------ */
/* Main                                                                      */
/* ------------------------------------------------------------------------ */

static void usage(FILE *f) {
  fprintf(f,
          "usage: bench_mesh [--repeat N] [--json] [--help]\n"
          "  --repeat N   timed repeats of every measurement, 1..%d "
          "(default 5)\n"
          "  --json       print one JSON object with every figure\n"
          "  --help, -h   print this help\n",
          MAX_REPEAT);
}

static int parse_repeat(const char *s, int *out) {
  if (!s || !*s) return -1;
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || *end || end == s || v < 1 || v > MAX_REPEAT) return -1;
  *out = (int)v;
  return 0;
}

int main(int argc, char **argv) {
  int repeat = 5, json = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--json") == 0) {
      json = 1;
    } else if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      usage(stdout);
      return 0;
    } else if (strcmp(a, "--repeat") == 0 || strncmp(a, "--repeat=", 9) == 0) {
      const char *v = a[8] == '=' ? a + 9 : (i + 1 < argc ? argv[++i] : NULL);
      if (!v) {
        fprintf(stderr, "bench_mesh: --repeat needs a value\n");
        usage(stderr);
        return 2;
      }
      if (parse_repeat(v, &repeat)) {
        fprintf(stderr,
                "bench_mesh: --repeat: expected an integer in 1..%d, found "
                "\"%s\"\n",
                MAX_REPEAT, v);
        usage(stderr);
        return 2;
      }
    } else {
      fprintf(stderr, "bench_mesh: unknown argument \"%s\"\n", a);
      usage(stderr);
      return 2;
    }
  }

  /* Warm up malloc and the library (first-touch pages, arena set-up) so the
   * memory figures below show the mesh alone. */
  {
    mpg_spec spec = MPG_SPEC_INIT;
    mpg_mesh *m = NULL;
    if (build_spec(&spec, "pp=1,dp=2,cp=2,tp=2")) return 1;
    mpg_status st = mpg_mesh_create(&spec, 8, &m);
    if (st) return fail_call("mpg_mesh_create (warm-up)", st);
    mpg_mesh_destroy(m);
  }

  static mesh_result res[2];
  int rc = 0;
  /* The tiny mesh first, so the big one cannot lower its figures. */
  rc |= run_mesh("tiny", "pp=1,dp=2,cp=2,tp=2", 8, repeat, &res[0]);
  rc |= run_mesh("large", "pp=16,dp=128,cp=8,tp=8", 131072, repeat, &res[1]);

  if (json)
    print_json(res, 2, repeat);
  else
    print_text(res, 2, repeat);
  (void)g_sink;
  return rc ? 1 : 0;
}
