/* One MPI process of the shared-memory sync tests (test_sync_shm_mpi,
 * built from test_sync_shm.c), started by mpirun with MESHPG_SHM=1.
 *
 *   shm_mpi_worker values    mesh dp=2,cp=np/2 (np 2 or 4): random
 *                            non-integer f32 and bf16 gradients seeded by
 *                            rank, in replicate mode (avg) and in shard
 *                            mode (avg x 0.37, owned slices), some params
 *                            reduced over cp or dp alone; every result
 *                            must equal, bit for bit, the value computed
 *                            here as groups/shm/kernel.c does: the f32 sum
 *                            in group position order (bf16 widened, each
 *                            addend pre-multiplied first when scaled),
 *                            divided at the end for avg, rounded once to
 *                            bf16 (round to nearest even).  Also:
 *                            stats.shm_buffers is the number of buffers
 *                            whose group has 2+ members, and right after
 *                            commit no /dev/shm/meshpg-<this pid>-* entry
 *                            exists (unlinked once every member mapped it).
 *   shm_mpi_worker hosts     (np 4) mesh dp=4 with mpg_init_opts.host_id
 *                            "hostA" for ranks 0-1 and "hostB" for 2-3:
 *                            the one dp group takes the hierarchical form
 *                            (a segment per host, the hosts' partial sums
 *                            all-reduced over MPI by the workers), in
 *                            replicate mode, avg and avg x 0.37; results
 *                            must equal, bit for bit, (x0 + x1) + (x2 + x3)
 *                            in f32 (each host's members in position
 *                            order, then the two hosts' sums), divided at
 *                            the end for avg, rounded once for bf16: not
 *                            the flat order ((x0 + x1) + x2) + x3.
 *   shm_mpi_worker overflow  (np 2) one f32 param of free/4/2 + 2^20
 *                            elements, free being /dev/shm's free bytes
 *                            (rank 0's statvfs, broadcast): commit must fail
 *                            with MPG_ERR_ENV on both ranks, the message
 *                            naming the bytes needed (more than free) and
 *                            the bytes free.  Prints "SKIP overflow: ..."
 *                            when /dev/shm is not a mounted tmpfs or the
 *                            size would not fit.
 *
 * Every rank prints "pid of rank R: PID", then "OK <mode> rank R" on
 * success or "FAIL <mode> rank R: ..." lines; exit code 0 / 1. */
#include <dirent.h>
#include <mpi.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "meshpg.h"

#define TMPFS_MAGIC_ 0x01021994

static const char *g_mode = "?";
static int g_rank = -1;
static int failures;

__attribute__((format(printf, 1, 2))) static void fail(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  printf("FAIL %s rank %d: ", g_mode, g_rank);
  vprintf(fmt, ap);
  printf("\n");
  fflush(stdout);
  va_end(ap);
  failures++;
}

#define TRY(call)                                                                        \
  do {                                                                                   \
    mpg_status st_ = (call);                                                             \
    if (st_ != MPG_OK) {                                                                 \
      fail("line %d: %s -> %s: %s", __LINE__, #call, mpg_status_name(st_),              \
           mpg_last_error());                                                            \
      goto done;                                                                         \
    }                                                                                    \
  } while (0)

/* ------------------------------------------------------------------ */
/* Values                                                              */
/* ------------------------------------------------------------------ */

static uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/* Rank r's gradient element i of param p at step s: a non-integer in
 * [-3, 3) with a full f32 mantissa. */
static float gen(int r, int p, int s, size_t i) {
  uint64_t h = mix64(mix64(mix64(0x5eedull + (uint64_t)r) ^ ((uint64_t)p << 32 | (uint64_t)s)) ^
                     (uint64_t)i);
  return (float)(((double)(h >> 11) * 0x1p-53 - 0.5) * 6.0);
}

static float bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* Round to nearest, ties to even (the library's rule); no NaNs here. */
static uint16_t f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

/* What rank r writes: f32 as generated, bf16 rounded from it. */
static float input(mpg_dtype dt, int r, int p, int s, size_t i) {
  float x = gen(r, p, s, i);
  return dt == MPG_BF16 ? bf16_to_f32(f32_to_bf16(x)) : x;
}

typedef struct vparam {
  const char *name;
  size_t count;
  mpg_dtype dtype;
  const char *reduce_dims;
} vparam;

/* The expected reduced value of element i of param p: the members of its
 * group (g, or the ranks listed in members[] for a sharded buffer) in
 * position order.  premul: each addend times f = (float)scale first (the
 * product stored before the add, as the library keeps it unfused); avg:
 * divided by n at the end.  Returned as the element's bits. */
static uint32_t expect_bits(mpg_dtype dt, const int *members, int n, int p, int step, size_t i,
                            int premul, double scale, int avg) {
  float f = (float)scale, acc = 0;
  for (int k = 0; k < n; k++) {
    volatile float x = input(dt, members[k], p, step, i);
    if (premul) x = x * f;
    acc = k == 0 ? x : acc + x;
  }
  if (avg) acc = acc / (float)n;
  if (dt == MPG_BF16) return f32_to_bf16(acc);
  uint32_t u;
  memcpy(&u, &acc, 4);
  return u;
}

static int no_segment_of_mine(void) {
  char prefix[64];
  snprintf(prefix, sizeof prefix, "meshpg-%ld-", (long)getpid());
  DIR *d = opendir("/dev/shm");
  if (!d) return 1;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)))
    if (strncmp(e->d_name, prefix, strlen(prefix)) == 0) n++;
  closedir(d);
  return n == 0;
}

/* One sync on the mesh: replicate (avg) or shard (avg x 0.37). */
static void run_values(mpg_ctx *ctx, int shard) {
  const vparam ps[] = {
      {"f0", 701, MPG_F32, NULL},   {"b0", 1501, MPG_BF16, NULL}, {"f1", 3001, MPG_F32, NULL},
      {"b1", 777, MPG_BF16, NULL},  {"f2", 129, MPG_F32, NULL},   {"b2", 2049, MPG_BF16, NULL},
      {"fcp", 37, MPG_F32, "cp"},   {"bdp", 5, MPG_BF16, "dp"},   {"f3", 1, MPG_F32, NULL},
  };
  const int np = (int)(sizeof ps / sizeof ps[0]);
  const double grad_scale = shard ? 0.37 : 1.0;
  mpg_sync *s = NULL;
  void *gv[16];
  mpg_shard_info info[16];
  mpg_sync_opts so = MPG_SYNC_OPTS_INIT;
  so.bucket_mb = 0.004;
  so.first_bucket_mb = 0.001;
  so.grad_scale = grad_scale;
  if (shard) so.mode = MPG_SYNC_SHARD;
  TRY(mpg_sync_create(ctx, &so, &s));
  for (int p = 0; p < np; p++) {
    mpg_param_opts po = MPG_PARAM_OPTS_INIT;
    po.reduce_dims = ps[p].reduce_dims;
    int id;
    TRY(mpg_sync_add_param(s, ps[p].name, ps[p].count, ps[p].dtype, &po, &id));
  }
  TRY(mpg_sync_commit(s));
  if (!no_segment_of_mine())
    fail("%s: a /dev/shm/meshpg-%ld-* entry still exists after commit", shard ? "shard" : "replicate",
         (long)getpid());

  /* The expected shared buffers: distinct (dtype, group, sharded) whose
   * group has 2+ members (one host). */
  mpg_group *gs[16];
  int want = 0, nkeys = 0;
  struct {
    mpg_dtype dt;
    mpg_group *g;
    int sharded;
  } keys[16];
  mpg_sync_stats stats = MPG_SYNC_STATS_INIT;
  TRY(mpg_sync_get_stats(s, &stats));
  for (int p = 0; p < np; p++) {
    TRY(mpg_sync_param_group(s, p, &gs[p]));
    TRY(mpg_sync_grad(s, p, &gv[p]));
    info[p] = (mpg_shard_info)MPG_SHARD_INFO_INIT;
    if (shard) TRY(mpg_sync_shard(s, p, &info[p]));
    else info[p].count = ps[p].count;
    int k = 0;
    while (k < nkeys && !(keys[k].dt == ps[p].dtype && keys[k].g == gs[p] &&
                          keys[k].sharded == info[p].sharded))
      k++;
    if (k < nkeys) continue;
    keys[nkeys].dt = ps[p].dtype;
    keys[nkeys].g = gs[p];
    keys[nkeys].sharded = info[p].sharded;
    nkeys++;
    /* shard groups here are the whole reduce group (no replicate dims) */
    want += mpg_group_size(gs[p]) >= 2;
  }
  if (stats.shm_buffers != want || want == 0 || stats.shm_bytes == 0)
    fail("%s: shm_buffers %d (shm_bytes %zu), expected %d of %d buffers",
         shard ? "shard" : "replicate", stats.shm_buffers, stats.shm_bytes, want,
         stats.num_buffers);
  if (g_rank == 0)
    printf("%s: %d buckets, %d shm buffers of %d, %zu shm bytes\n", shard ? "shard" : "replicate",
           stats.num_buckets, stats.shm_buffers, stats.num_buffers, stats.shm_bytes);

  long bad = 0;
  for (int step = 0; step < 2; step++) {
    if (step) TRY(mpg_sync_zero_grads(s));
    for (int p = 0; p < np; p++)
      for (size_t i = 0; i < ps[p].count; i++) {
        float x = gen(g_rank, p, step, i);
        if (ps[p].dtype == MPG_BF16) ((uint16_t *)gv[p])[i] = f32_to_bf16(x);
        else ((float *)gv[p])[i] = x;
      }
    TRY(mpg_sync_all(s, step, NULL));
    if (!mpg_sync_grads_valid(s)) fail("step %d: grads invalid", step);
    for (int p = 0; p < np; p++) {
      int n = mpg_group_size(gs[p]), members[64];
      for (int k = 0; k < n && k < 64; k++) TRY(mpg_group_member(gs[p], k, &members[k]));
      /* step.c / shard.c: avg without grad_scale is the backend's average;
       * with one it is a sum pre-multiplied by grad_scale / n. */
      int premul = grad_scale != 1.0, avg = !premul;
      double scale = grad_scale / n;
      for (size_t i = info[p].param_offset; i < info[p].param_offset + info[p].count; i++) {
        uint32_t want_bits = expect_bits(ps[p].dtype, members, n, p, step, i, premul, scale, avg);
        uint32_t got_bits;
        float got;
        if (ps[p].dtype == MPG_BF16) {
          got_bits = ((uint16_t *)gv[p])[i];
          got = bf16_to_f32((uint16_t)got_bits);
        } else {
          memcpy(&got_bits, (float *)gv[p] + i, 4);
          got = ((float *)gv[p])[i];
        }
        if (got_bits != want_bits && bad++ < 5) {
          float w;
          if (ps[p].dtype == MPG_BF16) w = bf16_to_f32((uint16_t)want_bits);
          else memcpy(&w, &want_bits, 4);
          fail("%s step %d: param %s (%zu x %s, group of %d) element %zu: got %.9g (0x%x), "
               "expected %.9g (0x%x)",
               shard ? "shard" : "replicate", step, ps[p].name, ps[p].count,
               mpg_dtype_name(ps[p].dtype), n, i, (double)got, got_bits, (double)w, want_bits);
        }
      }
    }
    if (shard) {
      /* Every member's params current again before the next step. */
      TRY(mpg_sync_gather_begin(s, NULL));
      TRY(mpg_sync_gather_all(s));
    }
  }
  if (bad) fail("%s: %ld elements differ from the position-order f32 sum", shard ? "shard" : "replicate", bad);
done:
  if (s) {
    mpg_status st = mpg_sync_destroy(s);
    if (st) fail("mpg_sync_destroy -> %s", mpg_status_name(st));
  }
}

/* Two hosts of two ranks: (x0 + x1) + (x2 + x3), pre-multiplied addends,
 * the average at the end, one rounding. */
static uint32_t expect_hier_bits(mpg_dtype dt, int p, int step, size_t i, int premul,
                                 double scale, int avg) {
  float f = (float)scale, host[2];
  for (int h = 0; h < 2; h++) {
    volatile float a = input(dt, 2 * h, p, step, i), b = input(dt, 2 * h + 1, p, step, i);
    if (premul) {
      a = a * f;
      b = b * f;
    }
    host[h] = a + b;
  }
  float acc = host[0] + host[1];
  if (avg) acc = acc / 4.0f;
  if (dt == MPG_BF16) return f32_to_bf16(acc);
  uint32_t u;
  memcpy(&u, &acc, 4);
  return u;
}

static void run_hosts(mpg_ctx *ctx, double grad_scale) {
  const vparam ps[] = {{"f0", 3001, MPG_F32, NULL}, {"b0", 1501, MPG_BF16, NULL},
                       {"f1", 129, MPG_F32, NULL},  {"b1", 7, MPG_BF16, NULL}};
  const int np = (int)(sizeof ps / sizeof ps[0]);
  mpg_sync *s = NULL;
  void *gv[4];
  mpg_sync_opts so = MPG_SYNC_OPTS_INIT;
  so.bucket_mb = 0.004;
  so.first_bucket_mb = 0.001;
  so.grad_scale = grad_scale;
  TRY(mpg_sync_create(ctx, &so, &s));
  for (int p = 0; p < np; p++) {
    int id;
    TRY(mpg_sync_add_param(s, ps[p].name, ps[p].count, ps[p].dtype, NULL, &id));
  }
  TRY(mpg_sync_commit(s));
  mpg_sync_stats stats = MPG_SYNC_STATS_INIT;
  TRY(mpg_sync_get_stats(s, &stats));
  if (stats.shm_buffers != 2)
    fail("hosts: shm_buffers %d of %d buffers, expected 2 (hierarchical)", stats.shm_buffers,
         stats.num_buffers);
  for (int p = 0; p < np; p++) TRY(mpg_sync_grad(s, p, &gv[p]));
  long bad = 0;
  for (int step = 0; step < 2; step++) {
    for (int p = 0; p < np; p++)
      for (size_t i = 0; i < ps[p].count; i++) {
        float x = gen(g_rank, p, step, i);
        if (ps[p].dtype == MPG_BF16) ((uint16_t *)gv[p])[i] = f32_to_bf16(x);
        else ((float *)gv[p])[i] = x;
      }
    TRY(mpg_sync_all(s, step, NULL));
    int premul = grad_scale != 1.0;
    for (int p = 0; p < np; p++)
      for (size_t i = 0; i < ps[p].count; i++) {
        uint32_t want = expect_hier_bits(ps[p].dtype, p, step, i, premul, grad_scale / 4, !premul);
        uint32_t got = 0;
        if (ps[p].dtype == MPG_BF16) got = ((uint16_t *)gv[p])[i];
        else memcpy(&got, (float *)gv[p] + i, 4);
        if (got != want && bad++ < 5)
          fail("hosts (grad_scale %g) step %d: %s element %zu: got 0x%x, expected 0x%x",
               grad_scale, step, ps[p].name, i, got, want);
      }
  }
  if (bad) fail("hosts: %ld elements differ from (x0 + x1) + (x2 + x3)", bad);
done:
  if (s) {
    mpg_status st = mpg_sync_destroy(s);
    if (st) fail("mpg_sync_destroy -> %s", mpg_status_name(st));
  }
}

/* An MPI context on mesh `dims` (with the flatten dp_cp = dp,cp when
 * `dp_cp`), this rank on host `host_id` (NULL: the real host); NULL after a
 * failure (reported). */
static mpg_ctx *open_ctx(const char *dims, int dp_cp, int world, const char *host_id,
                         mpg_mesh **mesh) {
  mpg_ctx *ctx = NULL;
  mpg_spec spec = MPG_SPEC_INIT;
  *mesh = NULL;
  TRY(mpg_spec_init(&spec));
  TRY(mpg_spec_set_mesh(&spec, dims));
  if (dp_cp) TRY(mpg_spec_add_flatten(&spec, "dp_cp", "dp,cp"));
  TRY(mpg_mesh_create(&spec, world, mesh));
  mpg_init_opts opts = MPG_INIT_OPTS_INIT;
  opts.backend = MPG_BACKEND_MPI;
  opts.timeout_s = 60;
  opts.host_id = host_id;
  TRY(mpg_ctx_create(*mesh, &opts, &ctx));
done:
  return ctx;
}

static void close_ctx(mpg_ctx *ctx, mpg_mesh *mesh) {
  if (ctx) {
    mpg_status st = mpg_ctx_destroy(ctx);
    if (st) fail("mpg_ctx_destroy -> %s", mpg_status_name(st));
  }
  mpg_mesh_destroy(mesh);
}

static void mode_hosts(int world) {
  if (world != 4) {
    fail("hosts needs 4 ranks, not %d", world);
    return;
  }
  mpg_mesh *mesh;
  mpg_ctx *ctx = open_ctx("dp=4", 0, world, g_rank < 2 ? "hostA" : "hostB", &mesh);
  if (ctx) {
    run_hosts(ctx, 1.0);
    run_hosts(ctx, 0.37);
    if (g_rank == 0) printf("checked the hierarchical shm buffers\n");
  }
  close_ctx(ctx, mesh);
}

static void mode_values(int world) {
  if (world != 2 && world != 4) {
    fail("values needs 2 or 4 ranks, not %d", world);
    return;
  }
  char dims[64];
  snprintf(dims, sizeof dims, "dp=2,cp=%d", world / 2);
  mpg_mesh *mesh;
  mpg_ctx *ctx = open_ctx(dims, 1, world, NULL, &mesh);
  if (ctx) {
    run_values(ctx, 0);
    run_values(ctx, 1);
    if (g_rank == 0) printf("checked the shm buffers\n");
  }
  close_ctx(ctx, mesh);
}

/* ------------------------------------------------------------------ */
/* A segment larger than /dev/shm                                      */
/* ------------------------------------------------------------------ */

static void mode_overflow(int world) {
  mpg_mesh *mesh = NULL;
  mpg_ctx *ctx = NULL;
  mpg_sync *s = NULL;
  mpg_status st = MPG_OK;
  char msg[1024] = "";
  /* Rank 0 decides (so both register the same count): [skip, count, free]. */
  unsigned long long plan[3] = {0, 0, 0};
  if (g_rank == 0) {
    struct statfs fs;
    struct statvfs v;
    if (statfs("/dev/shm", &fs) != 0 || fs.f_type != TMPFS_MAGIC_) {
      plan[0] = 1;
    } else if (statvfs("/dev/shm", &v) != 0) {
      plan[0] = 2;
    } else {
      unsigned long long avail = (unsigned long long)v.f_bavail * v.f_frsize;
      plan[2] = avail;
      /* The library refuses a param of more than SIZE_MAX / 16 f32. */
      if (avail / 8 + (1ull << 20) > (unsigned long long)(SIZE_MAX / 4) / 4) plan[0] = 3;
      else plan[1] = avail / 4 / 2 + (1ull << 20);
    }
  }
  MPI_Bcast(plan, 3, MPI_UNSIGNED_LONG_LONG, 0, MPI_COMM_WORLD);
  if (plan[0]) {
    printf("SKIP overflow: %s\n",
           plan[0] == 1   ? "/dev/shm is not a mounted tmpfs"
           : plan[0] == 2 ? "statvfs(/dev/shm) failed"
                          : "/dev/shm is so large that the param would overflow");
    return;
  }
  if (world != 2) {
    fail("overflow needs 2 ranks, not %d", world);
    return;
  }
  size_t count = (size_t)plan[1];
  if (!(ctx = open_ctx("dp=2", 0, world, NULL, &mesh))) goto done;
  TRY(mpg_sync_create(ctx, NULL, &s));
  int id;
  TRY(mpg_sync_add_param(s, "huge", count, MPG_F32, NULL, &id));
  st = mpg_sync_commit(s);
  snprintf(msg, sizeof msg, "%s", mpg_last_error());
  printf("rank %d: %zu f32 (%zu bytes per rank, %llu bytes free): commit -> %s: %s\n", g_rank,
         count, count * 4, plan[2], mpg_status_name(st), msg);
  if (st != MPG_ERR_ENV) fail("commit -> %s, expected ERR_ENV: %s", mpg_status_name(st), msg);
  unsigned long long need = 0, free_b = 0;
  const char *n = strstr(msg, "needs ");
  const char *f = strstr(msg, " has ");
  if (!n || sscanf(n, "needs %llu bytes", &need) != 1)
    fail("the message does not name the bytes needed: %s", msg);
  if (!f || sscanf(f, " has %llu bytes free", &free_b) != 1 || !strstr(msg, "bytes free"))
    fail("the message does not name the bytes free: %s", msg);
  if (need < 2ull * count * 4 || need <= free_b)
    fail("needs %llu bytes (2 x %zu of gradients) but %llu free: inconsistent: %s", need,
         count * 4, free_b, msg);
  char per_rank[64];
  snprintf(per_rank, sizeof per_rank, "%zu bytes", count * 4);
  if (!strstr(msg, per_rank)) fail("the message does not name the %s per rank: %s", per_rank, msg);
  if (!strstr(msg, "MESHPG_SHM=0")) fail("the message does not suggest MESHPG_SHM=0: %s", msg);
  if (!no_segment_of_mine()) fail("a /dev/shm/meshpg-%ld-* entry exists", (long)getpid());
done:
  if (s && (st = mpg_sync_destroy(s)) != MPG_OK) fail("mpg_sync_destroy -> %s", mpg_status_name(st));
  close_ctx(ctx, mesh);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    printf("usage: shm_mpi_worker values | hosts | overflow\n");
    return 2;
  }
  setvbuf(stdout, NULL, _IOLBF, 0);
  g_mode = argv[1];
  int provided, world;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  printf("pid of rank %d: %ld\n", g_rank, (long)getpid());
  if (strcmp(g_mode, "values") == 0) mode_values(world);
  else if (strcmp(g_mode, "hosts") == 0) mode_hosts(world);
  else if (strcmp(g_mode, "overflow") == 0) mode_overflow(world);
  else fail("unknown mode");
  MPI_Finalize();
  if (!failures) printf("OK %s rank %d\n", g_mode, g_rank);
  fflush(stdout);
  return failures ? 1 : 0;
}
