/* One MPI process of the shared-memory sync tests (test_sync_shm_mpi,
 * built from test_sync_shm.c), started by mpirun with MESHPG_SHM=1.
 *
 *   shm_mpi_worker values    mesh dp=2,cp=np/2 (np 2 or 4): random
 *                            non-integer f32 and bf16 gradients seeded by
 *                            rank, in replicate mode (avg) and in shard
 *                            mode (avg x 0.37, owned slices), some params
 *                            reduced over cp or dp alone; every result
 *                            must equal, bit for bit, the value computed
 *                            here as groups/reduce.c's kernel does: the f32 sum
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
 *                            the flat order ((x0 + x1) + x2) + x3.  Then
 *                            the same in shard mode: the buffers reduce-
 *                            scattered hierarchically too (shm_buffers
 *                            2), every owned element that sum and the
 *                            bits replicate mode gave it.
 *   shm_mpi_worker gather    (np 2 or 4, issue 34) six rounds of random
 *                            shard-mode cases (mesh dp=2,cp=np/2, shard
 *                            dims dp_cp, dp or cp, 2 to 6 params of every
 *                            dtype and random sizes, one with slices above
 *                            1 MiB, random bucket sizes): the same sync on
 *                            a context with the shared path and on one made
 *                            with MESHPG_SHM=0; each rank writes its owned
 *                            elements (a value of the param, element and
 *                            step only) and gathers; every rank's params
 *                            then equal that value everywhere and the other
 *                            context's params byte for byte; the first
 *                            sync has every buffer in shared memory, its
 *                            params in a second segment (stats.shm_bytes
 *                            >= shard size x total_bytes), the second none.
 *   shm_mpi_worker overflow  (np 2) one f32 param of free/4/2 + 2^20
 *                            elements, free being /dev/shm's free bytes
 *                            (rank 0's statvfs, broadcast): commit must fail
 *                            with MPG_ERR_ENV on both ranks, the message
 *                            naming the bytes needed (more than free) and
 *                            the bytes free.  Then (issue 29) a segment
 *                            that fits in the free space but not with the
 *                            slack left for Open MPI's own shared memory:
 *                            need = free - max(32 MiB, free/33), so that
 *                            need <= free < need + max(64 MiB, need/16):
 *                            commit must fail alike, naming the bytes
 *                            needed, the slack (that formula) and the
 *                            bytes free.  Prints "SKIP overflow: ..."
 *                            when /dev/shm is not a mounted tmpfs or the
 *                            size would not fit.
 *   shm_mpi_worker killed SIG
 *                            (np 2, issue 29) mesh dp=2, one f32 param of
 *                            8 MiB: rank 0, the segment's creator, raises
 *                            SIG (KILL or TERM) on itself in the middle of
 *                            mpg_sync_commit, right after the library's
 *                            posix_fallocate of the segment returns (this
 *                            worker interposes posix_fallocate; rank 1
 *                            then waits in commit's next all-gather).
 *                            Prints "rank 0 raises SIG..." first; the job
 *                            dies (mpirun kills rank 1), and the test
 *                            looks at /dev/shm afterwards.
 *   shm_mpi_worker existing  (np 2, issue 29) mesh dp=2: before commit,
 *                            rank 0 creates /dev/shm/meshpg-<its pid>-dp-
 *                            0-<k> (k = 0..3), the names an earlier job of
 *                            the same pid would have left (and which the
 *                            library used to pick): commit must succeed,
 *                            sync one step in shared memory and leave
 *                            those files alone; rank 0 then removes them.
 *
 * Every rank prints "pid of rank R: PID", then "OK <mode> rank R" on
 * success or "FAIL <mode> rank R: ..." lines; exit code 0 / 1
 * (worker_main.h). */
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <mpi.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "meshpg.h"
#include "../support/sync_util.h"
#include "../support/values.h"
#include "../support/worker_main.h"

#define TMPFS_MAGIC_ 0x01021994


/* ------------------------------------------------------------------ */
/* Values                                                              */
/* ------------------------------------------------------------------ */

/* Rank r's gradient element i of param p at step s (values.h's tv_grad
 * under this worker's seed), and as it writes it in dtype dt. */
#define GEN_SEED 0x5eedull
static float gen(int r, int p, int s, size_t i) { return tv_grad(GEN_SEED, r, p, s, i); }

static float input(mpg_dtype dt, int r, int p, int s, size_t i) {
  return tv_grad_in(GEN_SEED, dt == MPG_BF16, r, p, s, i);
}

typedef sync_param vparam; /* sync_util.h */

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
  if (dt == MPG_BF16) return tv_f32_to_bf16(acc);
  uint32_t u;
  memcpy(&u, &acc, 4);
  return u;
}

/* This rank's gradients of step `step` into gv (f32 or bf16 each). */
static void fill_grads(const vparam *ps, int np, void *const *gv, int step) {
  for (int p = 0; p < np; p++)
    for (size_t i = 0; i < ps[p].count; i++) {
      float x = gen(g_rank, p, step, i);
      if (ps[p].dtype == MPG_BF16) ((uint16_t *)gv[p])[i] = tv_f32_to_bf16(x);
      else ((float *)gv[p])[i] = x;
    }
}

/* A sync of the params ps[0 .. np-1] (buckets of 4 KB, the first 1 KB),
 * replicate or shard mode, gradients scaled by grad_scale, committed; *s
 * as soon as it exists. */
static mpg_status vsync_make(mpg_ctx *ctx, const vparam *ps, int np, double grad_scale,
                             int shard, mpg_sync **s) {
  mpg_sync_opts so = MPG_SYNC_OPTS_INIT;
  so.sync.bucket_mb = 0.004;
  so.sync.first_bucket_mb = 0.001;
  so.grad_scale = grad_scale;
  if (shard) so.sync.mode = MPG_SYNC_SHARD;
  return sync_make_params(ctx, &so, ps, np, s);
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
  TRY(vsync_make(ctx, ps, np, grad_scale, shard, &s));
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
    if (shard) TRY(mpg_sync_get_shard(s, p, &info[p]));
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
    fill_grads(ps, np, gv, step);
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
          got = tv_bf16_to_f32((uint16_t)got_bits);
        } else {
          memcpy(&got_bits, (float *)gv[p] + i, 4);
          got = ((float *)gv[p])[i];
        }
        if (got_bits != want_bits && bad++ < 5) {
          float w;
          if (ps[p].dtype == MPG_BF16) w = tv_bf16_to_f32((uint16_t)want_bits);
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
  if (dt == MPG_BF16) return tv_f32_to_bf16(acc);
  uint32_t u;
  memcpy(&u, &acc, 4);
  return u;
}

/* Replicate mode's results of run_hosts (the element bits), kept for the
 * shard-mode run of the same data: [grad_scale 1 or 0.37][step][param]. */
#define HOSTS_MAX 3001
static uint32_t g_replicated[2][2][4][HOSTS_MAX];

static void run_hosts(mpg_ctx *ctx, double grad_scale, int shard) {
  const vparam ps[] = {{"f0", 3001, MPG_F32, NULL}, {"b0", 1501, MPG_BF16, NULL},
                       {"f1", 129, MPG_F32, NULL},  {"b1", 7, MPG_BF16, NULL}};
  const int np = (int)(sizeof ps / sizeof ps[0]);
  const char *mode = shard ? "hosts shard" : "hosts";
  int which = grad_scale != 1.0;
  mpg_sync *s = NULL;
  void *gv[4];
  mpg_shard_info info[4];
  TRY(vsync_make(ctx, ps, np, grad_scale, shard, &s));
  mpg_sync_stats stats = MPG_SYNC_STATS_INIT;
  TRY(mpg_sync_get_stats(s, &stats));
  /* both buffers (f32, bf16) hierarchical: shard mode's reduce-scatter too */
  if (stats.shm_buffers != 2)
    fail("%s: shm_buffers %d of %d buffers, expected 2 (hierarchical)", mode,
         stats.shm_buffers, stats.num_buffers);
  for (int p = 0; p < np; p++) {
    TRY(mpg_sync_grad(s, p, &gv[p]));
    info[p] = (mpg_shard_info)MPG_SHARD_INFO_INIT;
    if (shard) TRY(mpg_sync_get_shard(s, p, &info[p]));
    else info[p].count = ps[p].count;
  }
  long bad = 0, owned = 0;
  for (int step = 0; step < 2; step++) {
    if (step && shard) TRY(mpg_sync_zero_grads(s));
    fill_grads(ps, np, gv, step);
    TRY(mpg_sync_all(s, step, NULL));
    int premul = grad_scale != 1.0;
    for (int p = 0; p < np; p++)
      for (size_t i = info[p].param_offset; i < info[p].param_offset + info[p].count; i++) {
        uint32_t want = expect_hier_bits(ps[p].dtype, p, step, i, premul, grad_scale / 4, !premul);
        uint32_t got = 0;
        if (ps[p].dtype == MPG_BF16) got = ((uint16_t *)gv[p])[i];
        else memcpy(&got, (float *)gv[p] + i, 4);
        if (got != want && bad++ < 5)
          fail("%s (grad_scale %g) step %d: %s element %zu: got 0x%x, expected 0x%x", mode,
               grad_scale, step, ps[p].name, i, got, want);
        /* shard mode: the owned slice is replicate mode's all-reduce of it */
        if (!shard) g_replicated[which][step][p][i] = got;
        else if (got != g_replicated[which][step][p][i] && bad++ < 5)
          fail("%s (grad_scale %g) step %d: %s element %zu: got 0x%x, replicate mode's "
               "hierarchical all-reduce 0x%x", mode, grad_scale, step, ps[p].name, i, got,
               g_replicated[which][step][p][i]);
        owned++;
      }
    if (shard) {
      TRY(mpg_sync_gather_begin(s, NULL));
      TRY(mpg_sync_gather_all(s));
    }
  }
  if (shard && owned == 0) fail("%s: this rank owns no element", mode);
  if (bad) fail("%s: %ld elements differ from (x0 + x1) + (x2 + x3)", mode, bad);
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
  opts.backend.name = MPG_BACKEND_MPI;
  opts.backend.timeout_s = 60;
  opts.host_id = host_id;
  TRY(mpg_ctx_create(*mesh, &opts, &ctx));
done:
  return ctx;
}

static int mode_hosts(worker *w) {
  int world = w->world;
  if (world != 4) {
    fail("hosts needs 4 ranks, not %d", world);
    return 0;
  }
  mpg_mesh *mesh;
  mpg_ctx *ctx = open_ctx("dp=4", 0, world, g_rank < 2 ? "hostA" : "hostB", &mesh);
  if (ctx) {
    run_hosts(ctx, 1.0, 0);
    run_hosts(ctx, 0.37, 0);
    run_hosts(ctx, 1.0, 1);
    run_hosts(ctx, 0.37, 1);
    if (g_rank == 0 && !failures)
      printf("checked the hierarchical shm buffers, replicate and shard mode\n");
  }
  ctx_close(ctx, mesh);
  return 0;
}

static int mode_values(worker *w) {
  int world = w->world;
  if (world != 2 && world != 4) {
    fail("values needs 2 or 4 ranks, not %d", world);
    return 0;
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
  ctx_close(ctx, mesh);
  return 0;
}

/* ------------------------------------------------------------------ */
/* The parameter gather (issue 34)                                     */
/* ------------------------------------------------------------------ */

#define GATHER_ROUNDS 6
#define GATHER_MAX_PARAMS 6

/* The value every rank's element i of param p holds after the gather of
 * step `step` (its owner wrote it): finite, any bits. */
static void gather_value(mpg_dtype dt, int p, int step, size_t i, void *out) {
  float x = gen(1000 + p, p, step, i);
  uint64_t h = tv_mix64(((uint64_t)p << 40) ^ ((uint64_t)step << 32) ^ (uint64_t)i);
  if (dt == MPG_F32) memcpy(out, &x, 4);
  else if (dt == MPG_BF16) *(uint16_t *)out = tv_f32_to_bf16(x);
  else if (dt == MPG_F16) *(uint16_t *)out = (uint16_t)((h & 0x8000u) | (h >> 16) % 0x7c00u);
  else {
    double d = (double)x * (1.0 + (double)(h % 1000) * 1e-12);
    memcpy(out, &d, 8);
  }
}

/* A shard-mode sync of ps on ctx; NULL after a failure (reported). */
static mpg_sync *gather_sync(mpg_ctx *ctx, const vparam *ps, int np, double bucket_mb,
                             const char *shard_dims) {
  mpg_sync *s = NULL;
  mpg_sync_opts so = MPG_SYNC_OPTS_INIT;
  so.sync.mode = MPG_SYNC_SHARD;
  so.sync.bucket_mb = so.sync.first_bucket_mb = bucket_mb;
  snprintf(so.sync.shard_dims, sizeof so.sync.shard_dims, "%s", shard_dims);
  TRY(sync_make_params(ctx, &so, ps, np, &s)); /* reduce_dims all NULL */
  return s;
done:
  mpg_sync_destroy(s);
  return NULL;
}

/* Write the owned elements of step `step`, then gather. */
static int gather_step(mpg_sync *s, const vparam *ps, int np, int step) {
  for (int p = 0; p < np; p++) {
    mpg_shard_info info = MPG_SHARD_INFO_INIT;
    void *v = NULL;
    TRY(mpg_sync_get_shard(s, p, &info));
    TRY(mpg_sync_param(s, p, &v));
    size_t es = mpg_dtype_size(ps[p].dtype);
    for (size_t i = info.param_offset; i < info.param_offset + info.count; i++)
      gather_value(ps[p].dtype, p, step, i, (char *)v + i * es);
  }
  TRY(mpg_sync_gather_begin(s, NULL));
  TRY(mpg_sync_gather_all(s));
  return 0;
done:
  return 1;
}

static void gather_round(int world, int round) {
  static const mpg_dtype dts[] = {MPG_F32, MPG_BF16, MPG_F16, MPG_F64};
  static const char *const names[] = {"p0", "p1", "p2", "p3", "p4", "p5"};
  static const double buckets[] = {0.004, 0.3, 25.0};
  uint64_t h = tv_mix64(0x9a7e5ull + (uint64_t)round); /* alike on every rank */
  const char *shard_dims = round % 3 == 0 ? "" : round % 3 == 1 || world < 4 ? "dp" : "cp";
  vparam ps[GATHER_MAX_PARAMS];
  int np = 2 + (int)(h % 5);
  for (int p = 0; p < np; p++) {
    h = tv_mix64(h);
    ps[p] = (vparam){names[p], 1 + (size_t)(h >> 8) % 200000, dts[h % 4], NULL};
  }
  if (round % 2) ps[0] = (vparam){names[0], 700001, MPG_F32, NULL}; /* slices >= 1 MiB */
  double bucket_mb = buckets[(h >> 40) % 3];
  char dims[32];
  snprintf(dims, sizeof dims, "dp=2,cp=%d", world / 2);
  mpg_mesh *mesh_on = NULL, *mesh_off = NULL;
  mpg_ctx *on = open_ctx(dims, 1, world, NULL, &mesh_on);
  setenv("MESHPG_SHM", "0", 1); /* read by mpg_ctx_create */
  mpg_ctx *off = open_ctx(dims, 1, world, NULL, &mesh_off);
  setenv("MESHPG_SHM", "1", 1);
  mpg_sync *s_on = on ? gather_sync(on, ps, np, bucket_mb, shard_dims) : NULL;
  mpg_sync *s_off = off ? gather_sync(off, ps, np, bucket_mb, shard_dims) : NULL;
  long bad = 0, diff = 0;
  if (!s_on || !s_off) goto done;
  mpg_sync_stats a = MPG_SYNC_STATS_INIT, b = MPG_SYNC_STATS_INIT;
  TRY(mpg_sync_get_stats(s_on, &a));
  TRY(mpg_sync_get_stats(s_off, &b));
  if (a.shm_buffers != a.num_buffers || a.shard_size < 2 ||
      a.shm_bytes < (size_t)a.shard_size * a.total_bytes || b.shm_buffers || b.shm_bytes)
    fail("gather round %d: shm_buffers %d of %d, shm_bytes %zu, shard size %d, total_bytes "
         "%zu; MESHPG_SHM=0: shm_buffers %d, shm_bytes %zu", round, a.shm_buffers,
         a.num_buffers, a.shm_bytes, a.shard_size, a.total_bytes, b.shm_buffers, b.shm_bytes);
  for (int step = 0; step < 2; step++) {
    if (gather_step(s_on, ps, np, step) || gather_step(s_off, ps, np, step)) goto done;
    for (int p = 0; p < np; p++) {
      void *x = NULL, *y = NULL;
      TRY(mpg_sync_param(s_on, p, &x));
      TRY(mpg_sync_param(s_off, p, &y));
      size_t es = mpg_dtype_size(ps[p].dtype);
      for (size_t i = 0; i < ps[p].count; i++) {
        uint64_t want = 0;
        gather_value(ps[p].dtype, p, step, i, &want);
        if (memcmp((char *)x + i * es, &want, es) != 0 && bad++ < 3)
          fail("gather round %d step %d: %s (%zu x %s, shard dims \"%s\", bucket %g MiB) "
               "element %zu differs from its owner's value", round, step, ps[p].name,
               ps[p].count, mpg_dtype_name(ps[p].dtype), shard_dims, bucket_mb, i);
      }
      if (memcmp(x, y, ps[p].count * es) != 0 && diff++ < 3)
        fail("gather round %d step %d: %s differs between the shared path and "
             "MESHPG_SHM=0", round, step, ps[p].name);
    }
  }
  if (g_rank == 0 && !bad && !diff)
    printf("gather round %d: %d params, shard size %d, %d buckets, %zu shm bytes: equal\n",
           round, np, a.shard_size, a.num_buckets, a.shm_bytes);
done:
  if (s_on && mpg_sync_destroy(s_on)) fail("mpg_sync_destroy (shared path) failed");
  if (s_off && mpg_sync_destroy(s_off)) fail("mpg_sync_destroy (MESHPG_SHM=0) failed");
  ctx_close(on, mesh_on);
  ctx_close(off, mesh_off);
}

static int mode_gather(worker *w) {
  int world = w->world;
  if (world != 2 && world != 4) {
    fail("gather needs 2 or 4 ranks, not %d", world);
    return 0;
  }
  for (int round = 0; round < GATHER_ROUNDS && !failures; round++) gather_round(world, round);
  if (g_rank == 0 && !failures) printf("checked the shared-memory gather\n");
  return 0;
}

/* ------------------------------------------------------------------ */
/* A segment larger than /dev/shm                                      */
/* ------------------------------------------------------------------ */

/* A sync on ctx with one f32 param "w" of `count` elements (id 0); NULL
 * after a failure (reported). */
static mpg_sync *one_param_sync(mpg_ctx *ctx, size_t count) {
  mpg_sync *s = NULL;
  int id;
  TRY(mpg_sync_create(ctx, NULL, &s));
  TRY(mpg_sync_add_param(s, "w", count, MPG_F32, NULL, &id));
  return s;
done:
  if (s) mpg_sync_destroy(s);
  return NULL;
}

/* Whether the job has the `want` ranks that `mode` needs (else reported). */
static int ranks_are(int world, int want) {
  if (world != want) fail("%s needs %d ranks, not %d", g_mode, want, world);
  return world == want;
}

/* One f32 param of `count` elements on dp=2: commit must fail with
 * MPG_ERR_ENV, naming the bytes needed, the slack and the bytes free.
 * slack_case: the segment fits in the free space, only not with the
 * slack. */
static void overflow_case(mpg_ctx *ctx, size_t count, unsigned long long free_plan,
                          int slack_case) {
  const char *what = slack_case ? "slack" : "larger than free";
  mpg_status st = MPG_OK;
  char msg[1024] = "";
  mpg_sync *s = one_param_sync(ctx, count);
  if (!s) return;
  st = mpg_sync_commit(s);
  snprintf(msg, sizeof msg, "%s", mpg_last_error());
  printf("rank %d, %s: %zu f32 (%zu bytes per rank, %llu bytes free): commit -> %s: %s\n",
         g_rank, what, count, count * 4, free_plan, mpg_status_name(st), msg);
  if (st != MPG_ERR_ENV) {
    fail("%s: commit -> %s, expected ERR_ENV: %s", what, mpg_status_name(st), msg);
    goto done;
  }
  unsigned long long need = 0, free_b = 0, slack = 0;
  const char *n = strstr(msg, "needs ");
  const char *f = strstr(msg, " has ");
  const char *k = strstr(msg, "), plus ");
  if (!n || sscanf(n, "needs %llu bytes", &need) != 1)
    fail("%s: the message does not name the bytes needed: %s", what, msg);
  if (!f || sscanf(f, " has %llu bytes free", &free_b) != 1 || !strstr(msg, "bytes free"))
    fail("%s: the message does not name the bytes free: %s", what, msg);
  if (!k || sscanf(k, "), plus %llu bytes of slack", &slack) != 1)
    fail("%s: the message does not name the slack: %s", what, msg);
  /* docs/sync.md: the slack is max(64 MiB, 1/16 of the segment). */
  unsigned long long want_slack = need / 16 > (64ull << 20) ? need / 16 : 64ull << 20;
  if (slack != want_slack)
    fail("%s: slack %llu bytes, expected max(64 MiB, %llu / 16) = %llu: %s", what, slack, need,
         want_slack, msg);
  if (need < 2ull * count * 4 || need + slack <= free_b)
    fail("%s: needs %llu bytes (2 x %zu of gradients) + %llu of slack but %llu free: "
         "inconsistent: %s", what, need, count * 4, slack, free_b, msg);
  if (slack_case && need > free_b)
    fail("slack: needs %llu bytes, more than the %llu free: the case meant a segment that "
         "fits but for the slack (did /dev/shm shrink meanwhile?): %s", need, free_b, msg);
  char per_rank[64];
  snprintf(per_rank, sizeof per_rank, "%zu bytes", count * 4);
  if (!strstr(msg, per_rank))
    fail("%s: the message does not name the %s per rank: %s", what, per_rank, msg);
  if (!strstr(msg, "MESHPG_SHM=0"))
    fail("%s: the message does not suggest MESHPG_SHM=0: %s", what, msg);
  if (!no_segment_of_mine()) fail("a /dev/shm/meshpg-%ld-* entry exists", (long)getpid());
done:
  if ((st = mpg_sync_destroy(s)) != MPG_OK) fail("mpg_sync_destroy -> %s", mpg_status_name(st));
}

static int mode_overflow(worker *w) {
  int world = w->world;
  mpg_mesh *mesh = NULL;
  mpg_ctx *ctx = NULL;
  /* Rank 0 decides (so both register the same counts):
   * [skip, count over free, free, count over free - slack]. */
  unsigned long long plan[4] = {0, 0, 0, 0};
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
      /* need = 2 x count x 4 (+ 8 KiB of pages and control) = avail - d,
       * d = max(32 MiB, avail / 33): below the free space by d, and d is
       * at most half the slack max(64 MiB, need / 16). */
      unsigned long long d = avail / 33 > (32ull << 20) ? avail / 33 : 32ull << 20;
      if (!plan[0] && avail > d + (16ull << 20)) plan[3] = (avail - d) / 8;
    }
  }
  MPI_Bcast(plan, 4, MPI_UNSIGNED_LONG_LONG, 0, MPI_COMM_WORLD);
  if (plan[0]) {
    printf("SKIP overflow: %s\n",
           plan[0] == 1   ? "/dev/shm is not a mounted tmpfs"
           : plan[0] == 2 ? "statvfs(/dev/shm) failed"
                          : "/dev/shm is so large that the param would overflow");
    return 0;
  }
  if (!ranks_are(world, 2)) return 0;
  if (!(ctx = open_ctx("dp=2", 0, world, NULL, &mesh))) goto done;
  overflow_case(ctx, (size_t)plan[1], plan[2], 0);
  if (plan[3]) overflow_case(ctx, (size_t)plan[3], plan[2], 1);
  else printf("SKIP overflow (slack): /dev/shm has only %llu bytes free\n", plan[2]);
done:
  ctx_close(ctx, mesh);
  return 0;
}

/* ------------------------------------------------------------------ */
/* The creator killed in the middle of commit                          */
/* ------------------------------------------------------------------ */

#define KILLED_COUNT ((size_t)2 << 20) /* f32: 8 MiB per rank */

/* Armed by mode_killed on rank 0: the signal to raise once the library's
 * posix_fallocate of a segment (at least KILLED_COUNT x 4 bytes per rank:
 * not Open MPI's own files) has returned. */
static volatile sig_atomic_t g_kill_sig;

/* Interposes the C library's posix_fallocate (under -D_FILE_OFFSET_BITS=64
 * <fcntl.h> names this definition posix_fallocate64, as it does the
 * library's call): the real one, then the armed signal. */
int posix_fallocate(int fd, off_t offset, off_t len) {
  typedef int (*fn)(int, off_t, off_t);
  static fn real;
  if (!real) {
#if defined(_FILE_OFFSET_BITS) && _FILE_OFFSET_BITS == 64
    *(void **)&real = dlsym(RTLD_NEXT, "posix_fallocate64");
#else
    *(void **)&real = dlsym(RTLD_NEXT, "posix_fallocate");
#endif
    if (!real) return ENOSYS;
  }
  int rc = real(fd, offset, len);
  if (g_kill_sig && (unsigned long long)len >= 2ull * KILLED_COUNT * 4) {
    int sig = g_kill_sig;
    printf("rank %d raises %s in mpg_sync_commit after posix_fallocate(%lld bytes) -> %d\n",
           g_rank, sig == SIGKILL ? "SIGKILL" : "SIGTERM", (long long)len, rc);
    fflush(stdout);
    raise(sig);
    for (;;) pause(); /* SIGTERM handled by someone: wait for mpirun's kill */
  }
  return rc;
}

static int mode_killed(worker *w) {
  int world = w->world;
  const char *sig = w->argc > 0 ? w->argv[0] : NULL;
  int signo = !sig ? 0 : !strcmp(sig, "TERM") ? SIGTERM : !strcmp(sig, "KILL") ? SIGKILL : 0;
  if (!signo) {
    fail("killed needs KILL or TERM, not %s", sig ? sig : "nothing");
    return 0;
  }
  if (!ranks_are(world, 2)) return 0;
  mpg_mesh *mesh;
  mpg_ctx *ctx = open_ctx("dp=2", 0, world, NULL, &mesh);
  mpg_sync *s = ctx ? one_param_sync(ctx, KILLED_COUNT) : NULL;
  if (s) {
    if (g_rank == 0) g_kill_sig = signo;
    mpg_status st = mpg_sync_commit(s);
    g_kill_sig = 0;
    /* Rank 0 never gets here; rank 1 only if the job outlived its death. */
    fail("commit returned %s (%s) although rank 0 should have died in it",
         mpg_status_name(st), st ? mpg_last_error() : "");
    mpg_sync_destroy(s);
  }
  ctx_close(ctx, mesh);
  return 0;
}

/* ------------------------------------------------------------------ */
/* Names that exist already                                            */
/* ------------------------------------------------------------------ */

static int mode_existing(worker *w) {
  int world = w->world;
  if (!ranks_are(world, 2)) return 0;
  char names[4][96];
  int made = 0;
  if (g_rank == 0)
    for (; made < 4; made++) {
      snprintf(names[made], sizeof names[made], "/dev/shm/meshpg-%ld-dp-0-%d", (long)getpid(),
               made);
      int fd = open(names[made], O_CREAT | O_EXCL | O_RDWR, 0600);
      if (fd < 0) {
        fail("cannot create %s: %s", names[made], strerror(errno));
        break;
      }
      close(fd);
    }
  mpg_mesh *mesh;
  mpg_ctx *ctx = open_ctx("dp=2", 0, world, NULL, &mesh);
  mpg_sync *s = ctx ? one_param_sync(ctx, 1000) : NULL;
  if (!s) goto done;
  TRY(mpg_sync_commit(s));
  mpg_sync_stats stats = MPG_SYNC_STATS_INIT;
  TRY(mpg_sync_get_stats(s, &stats));
  if (stats.shm_buffers != 1) fail("shm_buffers %d, expected 1", stats.shm_buffers);
  float *g;
  TRY(mpg_sync_grad(s, 0, (void **)&g));
  for (int i = 0; i < 1000; i++) g[i] = (float)(g_rank + 1) * (float)i;
  TRY(mpg_sync_all(s, 0, NULL));
  for (int i = 0; i < 1000; i++)
    if (g[i] != 1.5f * (float)i) {
      fail("element %d: %g, expected %g", i, (double)g[i], 1.5 * i);
      break;
    }
  if (g_rank == 0) printf("committed and synced next to %d existing names\n", made);
done:
  if (s) {
    mpg_status st = mpg_sync_destroy(s);
    if (st) fail("mpg_sync_destroy -> %s", mpg_status_name(st));
  }
  ctx_close(ctx, mesh);
  for (int k = 0; k < made; k++)
    if (unlink(names[k]) != 0)
      fail("%s: %s (did the library remove a file it did not make?)", names[k], strerror(errno));
  return 0;
}

/* Every rank's pid first (the test looks for what a killed job left). */
static int print_pid(worker *w) {
  printf("pid of rank %d: %ld\n", w->rank, (long)getpid());
  return 0;
}

/* Mode NAME runs mode_NAME; this program initialises MPI (serialized). */
#define MODE(name, args, max_args) {#name, args, 0, max_args, mode_##name, WK_MPI_SERIALIZED}
static const worker_case cases[] = {
    MODE(values, "", 0), MODE(hosts, "", 0), MODE(gather, "", 0),
    MODE(overflow, "", 0), MODE(killed, "KILL|TERM", 1), MODE(existing, "", 0),
};
WORKER_MAIN_WITH(cases, print_pid)
