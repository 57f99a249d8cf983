/* One MPI process of the Open MPI backend tests, started by mpirun from
 * test_mpi.c.  A plain program on the public API: the rank and world size
 * come from the Open MPI environment (mpg_launch_from_env), and the
 * library initialises MPI itself.
 *
 *   mpi_worker collectives   every collective x dtype x op on every group of
 *                            the mesh, checked exactly against local
 *                            references; group membership; the DESIGN
 *                            dp_cp check on (dp=2, tp=2, cp=2).
 *   mpi_worker timeout       the last rank skips one all_reduce: the others
 *                            must fail with MPG_ERR_TIMEOUT within the
 *                            timeout + 1 s, later calls with ABORTED, and
 *                            everybody must exit cleanly.
 *   mpi_worker split_timeout the last rank creates a (lazy) group late:
 *                            everybody, the late rank included, gets
 *                            MPG_ERR_TIMEOUT from the split, none hangs.
 *   mpi_worker progress      async all-reduces finish while the caller
 *                            sleeps (progress thread), or cannot with
 *                            MESHPG_MPI_PROGRESS=off.
 *   mpi_worker progress_env  MESHPG_MPI_PROGRESS=sometimes is refused.
 *   mpi_worker window_env    MESHPG_MPI_WINDOW=9 is refused.
 *   mpi_worker idle_cpu      waiting 3 s for a late peer costs < 1 s CPU.
 *   mpi_worker p2p_batch     mpg_p2p_batch: a ring of pipeline stages,
 *                            every rank sending 64 MiB to the next and to
 *                            the previous rank and receiving from both in
 *                            one batch (blocking, and 1 MiB through a work
 *                            handle); on the dp pairs several operations
 *                            to one peer in order, a mix of dtypes, a bad
 *                            batch refused before anything is posted.
 *   mpi_worker p2p_timeout   rank 0's batch with the last rank, which never
 *                            posts: MPG_ERR_TIMEOUT within the timeout
 *                            + 1 s, the context aborted, a clean exit.
 *   mpi_worker all_to_all    mpg_all_to_all / mpg_all_to_all_v on every
 *                            group of the mesh: uneven per-pair counts
 *                            with zeros, blocks out of order with gaps,
 *                            every dtype, blocking and async, malloc'ed
 *                            and mpg_ctx_mem_alloc (zero-copy) buffers,
 *                            every byte and gap checked; the issue-order
 *                            check.  With MESHPG_TEST_A2A_MISMATCH set,
 *                            then a count mismatch on the world:
 *                            both members of the pair get
 *                            MPG_ERR_INVALID naming it, every other
 *                            block arrives, the others succeed.
 *   mpi_worker a2a_timeout   an all-to-all on the world without the last
 *                            rank: MPG_ERR_TIMEOUT within the timeout
 *                            + 1 s, the context aborted, a clean exit
 *                            (the late rank's all-to-all finishes or
 *                            fails, never hangs).
 *   mpi_worker sub_comm      the program initialises MPI, splits
 *                            MPI_COMM_WORLD into two halves and builds a
 *                            mesh on each (opts.mpi_comm): rank and size
 *                            come from the half, not OMPI_COMM_WORLD_*,
 *                            and the halves reduce separately.
 *
 * Prints "OK <mode> rank R" on success, "FAIL <mode> rank R: ..." lines
 * otherwise; exit code 0 / 1 (worker_main.h).
 *
 * Meshes: 8 ranks (dp=2, tp=2, cp=2), 4 ranks (dp=2, tp=2, cp=1: cp groups
 * have size 1), 2 ranks (dp=2, tp=1, cp=1), else (dp=-1, tp=1, cp=1); the
 * flattened set dp_cp = [dp, cp] always. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include <mpi.h>

#include "internal.h" /* MPG__OP_PREMUL_SUM */
#include "../support/clock.h"
#include "../support/mesh_util.h"
#include "../support/time_bound.h"
#include "mpi_worker.h"

/* The timeout of the timeout modes: 1 s, or MESHPG_TEST_TIMEOUT_S (for
 * slow runs such as valgrind, whose start-up alone takes seconds). */
double test_timeout(void) {
  const char *e = getenv("MESHPG_TEST_TIMEOUT_S");
  double t = e ? atof(e) : 0;
  return t > 0 ? t : 1.0;
}

/* ------------------------------------------------------------------ */
/* Element access (values are chosen to be exact in every dtype)       */
/* ------------------------------------------------------------------ */

static uint32_t fbits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
static float bitsf(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* f32 -> f16 for values that are exact in f16 (normal numbers and 0). */
static uint16_t to_f16(float f) {
  uint32_t u = fbits(f);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a == 0) return sign;
  uint32_t exp = (a >> 23) - 112u, man = a & 0x7fffffu;
  return (uint16_t)(sign | (exp << 10) | (man >> 13));
}
static float from_f16(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  if (exp == 0 && man == 0) return bitsf(sign);
  return bitsf(sign | ((exp + 112u) << 23) | (man << 13));
}

int is_float(mpg_dtype dt) { return dt != MPG_I32 && dt != MPG_I64; }

void put(mpg_dtype dt, void *buf, size_t i, double v) {
  switch (dt) {
    case MPG_F32: ((float *)buf)[i] = (float)v; break;
    case MPG_F64: ((double *)buf)[i] = v; break;
    case MPG_F16: ((uint16_t *)buf)[i] = to_f16((float)v); break;
    case MPG_BF16: ((uint16_t *)buf)[i] = (uint16_t)(fbits((float)v) >> 16); break;
    case MPG_I32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case MPG_I64: ((int64_t *)buf)[i] = (int64_t)v; break;
  }
}

double get(mpg_dtype dt, const void *buf, size_t i) {
  switch (dt) {
    case MPG_F32: return ((const float *)buf)[i];
    case MPG_F64: return ((const double *)buf)[i];
    case MPG_F16: return from_f16(((const uint16_t *)buf)[i]);
    case MPG_BF16: return bitsf((uint32_t)((const uint16_t *)buf)[i] << 16);
    case MPG_I32: return ((const int32_t *)buf)[i];
    case MPG_I64: return (double)((const int64_t *)buf)[i];
  }
  return NAN;
}

/* The value world rank r contributes at index i: integers in [-11, 11],
 * halves of them for floats.  Sums over 8 ranks stay exact in bf16. */
double val(mpg_dtype dt, int r, size_t i) {
  int v = (int)((r * 13 + (int)i * 7 + 3) % 23) - 11;
  return is_float(dt) ? v * 0.5 : v;
}

const char *op_name(mpg_op op) {
  switch ((int)op) {
    case MPG_OP_SUM: return "sum";
    case MPG_OP_AVG: return "avg";
    case MPG_OP_MAX: return "max";
    case MPG_OP_MIN: return "min";
    case MPG__OP_PREMUL_SUM: return "premul_sum";
  }
  return "?";
}

/* op over the members' values at index i; integer AVG truncates toward
 * zero like the library. */
double reduce_ref(mpg_dtype dt, mpg_op op, const int *members, int n,
                  size_t i, double scale) {
  double acc = 0;
  int64_t iacc = 0;
  for (int m = 0; m < n; m++) {
    double v = val(dt, members[m], i);
    if (op == MPG__OP_PREMUL_SUM) v *= scale;
    if (m == 0 && (op == MPG_OP_MAX || op == MPG_OP_MIN)) acc = v;
    else if (op == MPG_OP_MAX) acc = v > acc ? v : acc;
    else if (op == MPG_OP_MIN) acc = v < acc ? v : acc;
    else acc += v;
    iacc += (int64_t)v;
  }
  if (op == MPG_OP_AVG) return is_float(dt) ? acc / n : (double)(iacc / n);
  return acc;
}

/* ------------------------------------------------------------------ */
/* Modes                                                               */
/* ------------------------------------------------------------------ */

static mpg_status make_ctx(int world, double timeout_s, int lazy,
                           mpg_mesh **mesh, mpg_ctx **ctx) {
  const char *dims = world == 8 ? "dp=2,tp=2,cp=2"
                   : world == 4 ? "dp=2,tp=2,cp=1"
                   : world == 2 ? "dp=2,tp=1,cp=1" : "dp=-1,tp=1,cp=1";
  mpg_status st = mesh_build(dims, "dp_cp=dp,cp", world, mesh);
  if (st) return st;
  mpg_init_opts opts = MPG_INIT_OPTS_INIT;
  opts.backend.name = MPG_BACKEND_MPI;
  opts.rank = -1;       /* from OMPI_COMM_WORLD_RANK */
  opts.world_size = -1; /* from OMPI_COMM_WORLD_SIZE */
  opts.backend.timeout_s = timeout_s;
  opts.backend.lazy_groups = lazy;
  return mpg_ctx_create(*mesh, &opts, ctx);
}

/* A call of `what` that waited for an absent rank: MPG_ERR_TIMEOUT after
 * 0.9 x timeout .. tb_bound(timeout + 1 s), its message naming `call`
 * (NULL: not checked).  1 when so, else 0 (reported). */
int timed_out(const char *what, const char *call, mpg_status st, double dt, double timeout,
              int world) {
  double bound = tb_bound(timeout + 1.0, world);
  if (st != MPG_ERR_TIMEOUT)
    fail("%s returned %s, expected ERR_TIMEOUT: %s", what, mpg_status_name(st),
         mpg_last_error());
  else if (dt < timeout * 0.9 || dt > bound)
    fail("ERR_TIMEOUT after %.3f s, expected %.1f .. %.1f s", dt, timeout * 0.9, bound);
  else if (call && !strstr(mpg_last_error(), call))
    fail("the message does not name the call: %s", mpg_last_error());
  else
    return 1;
  return 0;
}

/* The start of the modes whose waiters time out: setup with `timeout`,
 * the world group (*wg), one healthy barrier on it.  1 when setup failed
 * (reported; nothing left to free). */
int healthy_world(int world, double timeout, mpg_mesh **mesh, mpg_ctx **ctx, mpg_group **wg) {
  if (setup(world, timeout, 0, mesh, ctx)) return 1;
  CHECK(mpg_ctx_group(*ctx, "world", wg));
  CHECK(mpg_barrier(*wg, NULL)); /* everybody is healthy first */
  return 0;
}

/* 1 if any check of this mode failed. */
int failed(void) { return failures != 0; }

/* make_ctx, or print why not (then 1, with nothing left to free). */
int setup(int world, double timeout_s, int lazy, mpg_mesh **mesh,
          mpg_ctx **ctx) {
  mpg_status st = make_ctx(world, timeout_s, lazy, mesh, ctx);
  if (!st) return 0;
  fail("setup -> %s: %s", mpg_status_name(st), mpg_last_error());
  mpg_mesh_destroy(*mesh);
  *mesh = NULL;
  return 1;
}

static int run_collectives(worker *wk) {
  int world = wk->world;
  mpg_mesh *mesh = NULL;
  mpg_ctx *ctx = NULL;
  double t0 = now_s();
  mpg_status st = MPG_OK;
  if (setup(world, 60, 0, &mesh, &ctx)) return 1;
  if (mpg_ctx_rank(ctx) != g_rank || mpg_ctx_world_size(ctx) != world ||
      mpg_ctx_backend(ctx) != MPG_BACKEND_MPI)
    fail("context says rank %d of %d, backend %d", mpg_ctx_rank(ctx),
         mpg_ctx_world_size(ctx), (int)mpg_ctx_backend(ctx));
  int nsets = mpg_mesh_num_dimsets(mesh);
  for (int s = 0; s < nsets; s++) {
    grp G;
    memset(&G, 0, sizeof G);
    st = mpg_ctx_group_at(ctx, s, &G.g);
    if (st) {
      fail("mpg_ctx_group_at(%d) -> %s: %s", s, mpg_status_name(st), mpg_last_error());
      continue;
    }
    G.name = mpg_group_name(G.g);
    G.size = mpg_group_size(G.g);
    G.pos = mpg_group_position(G.g);
    CHECK(mpg_mesh_group_members(mesh, s, mpg_group_index(G.g), G.members));
    test_membership(&G, mesh, s);
    test_all_reduce(&G);
    test_async(&G);
    test_broadcast(&G);
    test_all_gather(&G);
    test_reduce_scatter(&G);
    test_send_recv(&G);
    CHECK(mpg_barrier(G.g, NULL));
  }
  if (world == 8) test_design(ctx, mesh);
  double t1 = now_s();
  CHECK(mpg_ctx_destroy(ctx));
  mpg_mesh_destroy(mesh);
  printf("rank %d: %d dim sets, %.2f s\n", g_rank, nsets, t1 - t0);
  return 0;
}

/* Destroy an aborted context and its mesh; timed: within tb_bound(0.5 s). */
static void destroy_aborted(mpg_ctx *ctx, mpg_mesh *mesh, int world, int timed) {
  double t0 = now_s();
  mpg_status st = mpg_ctx_destroy(ctx);
  double dt = now_s() - t0;
  if (st) fail("mpg_ctx_destroy -> %s: %s", mpg_status_name(st), mpg_last_error());
  if (timed && dt > tb_bound(0.5, world)) fail("mpg_ctx_destroy after the abort took %.3f s", dt);
  mpg_mesh_destroy(mesh);
}

static int run_timeout(worker *wk) {
  int world = wk->world;
  const double timeout = test_timeout();
  mpg_mesh *mesh = NULL;
  mpg_ctx *ctx = NULL;
  mpg_status st = MPG_OK;
  if (setup(world, timeout, 0, &mesh, &ctx)) return 1;
  mpg_group *wg = NULL, *dp = NULL;
  CHECK(mpg_ctx_group(ctx, "world", &wg));
  CHECK(mpg_ctx_group(ctx, "dp", &dp));
  float x = 1.0f, y = 0;
  /* Everybody is healthy first. */
  CHECK(mpg_all_reduce(wg, &x, &y, 1, MPG_F32, MPG_OP_SUM, NULL, NULL));
  if (y != (float)world) fail("warm-up all_reduce gave %g, expected %d", y, world);
  /* The operation that times out runs in place on mpg_ctx_mem_alloc
   * memory (zero-copy on MPI): freeing it after the timeout must defer the
   * release, so that the late peer's completion inside MPI_Finalize lands
   * in live memory (valgrind checks this in the valgrind test). */
  enum { NOB = 4 }; /* with MESHPG_MPI_PIECE_BYTES=8: two ring pieces */
  float *ob = NULL;
  CHECK(mpg_ctx_mem_alloc(ctx, NOB * sizeof(float), 0, (void **)&ob));
  if (!ob) return 1;
  for (int i = 0; i < NOB; i++) ob[i] = 1.0f;
  int late = g_rank == world - 1;
  if (!late) {
    double t0 = now_s();
    st = mpg_all_reduce(wg, ob, ob, NOB, MPG_F32, MPG_OP_SUM, NULL, NULL);
    double dt = now_s() - t0;
    if (timed_out("all_reduce without the last rank", NULL, st, dt, timeout, world))
      printf("rank %d: ERR_TIMEOUT after %.3f s: %s\n", g_rank, dt, mpg_last_error());
    /* The context is aborted now: every group refuses work at once. */
    t0 = now_s();
    st = mpg_all_reduce(dp, &x, &y, 1, MPG_F32, MPG_OP_SUM, NULL, NULL);
    if (st != MPG_ERR_ABORTED)
      fail("all_reduce on dp after the timeout returned %s, expected ERR_ABORTED",
           mpg_status_name(st));
    st = mpg_barrier(wg, NULL);
    if (st != MPG_ERR_ABORTED)
      fail("barrier on world after the timeout returned %s, expected ERR_ABORTED",
           mpg_status_name(st));
    if (now_s() - t0 > tb_bound(0.5, world))
      fail("calls after the abort took %.3f s", now_s() - t0);
    CHECK(mpg_ctx_mem_free(ctx, ob)); /* still in use by MPI: deferred */
  } else {
    /* Arrive long after the others gave up, then post the op they waited
     * for.  It may complete (their abandoned requests still progress
     * while they are inside MPI) or time out: both are fine, a hang is
     * not. */
    sleep_s(timeout + 1.5);
    double t0 = now_s();
    st = mpg_all_reduce(wg, ob, ob, NOB, MPG_F32, MPG_OP_SUM, NULL, NULL);
    double dt = now_s() - t0;
    CHECK(mpg_ctx_mem_free(ctx, ob));
    if (st != MPG_OK && st != MPG_ERR_TIMEOUT)
      fail("late all_reduce returned %s: %s", mpg_status_name(st), mpg_last_error());
    else if (dt > tb_bound(timeout + 1.0, world))
      fail("late all_reduce took %.3f s", dt);
    else
      printf("rank %d (late): all_reduce -> %s after %.3f s\n", g_rank,
             mpg_status_name(st), dt);
  }
  destroy_aborted(ctx, mesh, world, !late);
  return 0;
}

/* Lazy groups: the last rank asks for its dp group (a split of the world)
 * long after the others.  They must get MPG_ERR_TIMEOUT within the
 * timeout + 1 s; the late rank then passes the first barrier of the
 * split's rendezvous (the others' abandoned barrier is still posted) and
 * must time out in the second instead of hanging in MPI_Comm_split. */
/* Background progress: two pipelined asynchronous all-reduces (8 MiB
 * each, so two ring pieces of 4 MiB whose steps are posted only as
 * earlier ones finish), one on memory from
 * mpg_ctx_mem_alloc (zero-copy) and one on malloc'ed memory (staged).
 * The caller then sleeps for 2 s without any meshpg or MPI call.  With
 * the progress thread both must be finished at the first test; with
 * MESHPG_MPI_PROGRESS=off neither can be (the contrast that shows the
 * check can fail).  Then both must hold the exact average. */
static int run_progress(worker *wk) {
  int world = wk->world;
  const char *env = getenv("MESHPG_MPI_PROGRESS");
  int want_done = !(env && strcmp(env, "off") == 0);
  mpg_mesh *mesh = NULL;
  mpg_ctx *ctx = NULL;
  mpg_status st = MPG_OK;
  if (setup(world, 60, 0, &mesh, &ctx)) return 1;
  enum { N = 2 << 20 }; /* floats: 8 MiB */
  mpg_group *wg = NULL;
  CHECK(mpg_ctx_group(ctx, "world", &wg));
  void *owned = NULL;
  CHECK(mpg_ctx_mem_alloc(ctx, N * sizeof(float), 0, &owned));
  float *bufs[2] = {owned, malloc(N * sizeof(float))};
  const char *names[2] = {"mpg_ctx_mem_alloc memory", "malloc memory"};
  mpg_work *w[2] = {NULL, NULL};
  for (int b = 0; b < 2 && wg && bufs[0] && bufs[1]; b++) {
    for (size_t i = 0; i < N; i++) bufs[b][i] = (float)(g_rank + 1) * (float)(i % 7);
    CHECK(mpg_all_reduce(wg, bufs[b], bufs[b], N, MPG_F32, MPG_OP_AVG, NULL, &w[b]));
  }
  sleep_s(2.0);
  float avg = (float)(world + 1) / 2.0f;
  for (int b = 0; b < 2; b++) {
    if (!w[b]) continue;
    int done = -1;
    CHECK(mpg_work_test(w[b], &done));
    if (done != want_done)
      fail("%s: after 2 s without calls, mpg_work_test said done=%d, expected %d "
           "(progress thread %s)", names[b], done, want_done, want_done ? "on" : "off");
    CHECK(mpg_work_wait(w[b]));
    long bad = 0;
    for (size_t i = 0; i < N; i++)
      if (bufs[b][i] != avg * (float)(i % 7) && bad++ == 0)
        fail("%s: element %zu is %g, expected %g", names[b], i, (double)bufs[b][i],
             (double)(avg * (float)(i % 7)));
    if (bad) fail("%s: %ld wrong elements", names[b], bad);
  }
  free(bufs[1]);
  CHECK(mpg_ctx_mem_free(ctx, owned));
  /* A pointer that mpg_ctx_mem_alloc did not return is refused. */
  int local = 0;
  st = mpg_ctx_mem_free(ctx, &local);
  if (st != MPG_ERR_INVALID || !strstr(mpg_last_error(), "mpg_ctx_mem_alloc"))
    fail("mpg_ctx_mem_free of a stack pointer -> %s: %s", mpg_status_name(st),
         mpg_last_error());
  CHECK(mpg_ctx_destroy(ctx));
  mpg_mesh_destroy(mesh);
  printf("rank %d (progress thread %s)\n", g_rank, want_done ? "on" : "off");
  return 0;
}

/* CPU time of this process (user + system), seconds. */
static double cpu_seconds(void) {
  struct rusage ru;
  if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
  return (double)ru.ru_utime.tv_sec + 1e-6 * (double)ru.ru_utime.tv_usec +
         (double)ru.ru_stime.tv_sec + 1e-6 * (double)ru.ru_stime.tv_usec;
}

/* Waiting for a late peer costs little CPU: the last rank joins an
 * all-reduce 3 s after the others, whose progress thread must back off
 * (it spins only while operations move, plus a 0.2 s window) and whose
 * waiting thread sleeps.  Spinning through the wait would cost about 2 s
 * of CPU per process here. */
static int run_idle_cpu(worker *wk) {
  int world = wk->world;
  mpg_mesh *mesh = NULL;
  mpg_ctx *ctx = NULL;
  if (setup(world, 30, 0, &mesh, &ctx)) return 1;
  mpg_group *wg = NULL;
  CHECK(mpg_ctx_group(ctx, "world", &wg));
  float x = 1.0f, y = 0;
  CHECK(mpg_all_reduce(wg, &x, &y, 1, MPG_F32, MPG_OP_SUM, NULL, NULL));
  int late = g_rank == world - 1;
  if (late) {
    struct timespec ts = {3, 0};
    nanosleep(&ts, NULL);
  }
  double t0 = now_s(), c0 = cpu_seconds();
  CHECK(mpg_all_reduce(wg, &x, &y, 1, MPG_F32, MPG_OP_SUM, NULL, NULL));
  double dt = now_s() - t0, cpu = cpu_seconds() - c0;
  if (y != (float)world) fail("all_reduce gave %g, expected %d", y, world);
  if (!late && dt < 2.5) fail("the wait took only %.2f s: the late rank was not late", dt);
  if (!late && cpu > 1.0)
    fail("waiting %.2f s for a late peer cost %.2f s of CPU (expected < 1 s)", dt, cpu);
  CHECK(mpg_ctx_destroy(ctx));
  mpg_mesh_destroy(mesh);
  printf("rank %d: waited %.2f s, %.3f s CPU\n", g_rank, dt, cpu);
  return 0;
}

/* A bad MESHPG_MPI_PROGRESS fails mpg_ctx_create with MPG_ERR_ENV naming
 * the variable and the value. */
/* mpg_ctx_create refuses a bad backend variable with MPG_ERR_ENV, and the
 * message names `what` (the variable and its value) and `also`. */
static int run_env_refused(int world, const char *what, const char *also) {
  mpg_mesh *mesh = NULL;
  mpg_ctx *ctx = NULL;
  mpg_status st = make_ctx(world, 60, 0, &mesh, &ctx);
  if (st != MPG_ERR_ENV || !strstr(mpg_last_error(), what) ||
      !strstr(mpg_last_error(), also))
    fail("mpg_ctx_create with %s -> %s: %s", what, mpg_status_name(st), mpg_last_error());
  if (ctx) mpg_ctx_destroy(ctx);
  mpg_mesh_destroy(mesh);
  return 0;
}

static int run_split_timeout(worker *wk) {
  int world = wk->world;
  const double timeout = test_timeout();
  int late = g_rank == world - 1;
  mpg_mesh *mesh = NULL;
  mpg_ctx *ctx = NULL;
  mpg_status st = MPG_OK;
  if (setup(world, timeout, 1, &mesh, &ctx)) return 1;
  if (late) {
    sleep_s(timeout + 1.5);
  }
  mpg_group *dp = NULL;
  double t0 = now_s();
  st = mpg_ctx_group(ctx, "dp", &dp);
  double dt = now_s() - t0;
  if (timed_out(late ? "late rank: creating the dp group" : "creating the dp group", NULL, st,
                dt, timeout, world))
    printf("rank %d%s: ERR_TIMEOUT after %.3f s: %s\n", g_rank,
           late ? " (late)" : "", dt, mpg_last_error());
  mpg_group *wg = NULL;
  float x = 1.0f, y = 0;
  st = mpg_ctx_group(ctx, "world", &wg);
  if (!st) st = mpg_all_reduce(wg, &x, &y, 1, MPG_F32, MPG_OP_SUM, NULL, NULL);
  if (st != MPG_ERR_ABORTED)
    fail("all_reduce on world after the timeout returned %s, expected ERR_ABORTED",
         mpg_status_name(st));
  destroy_aborted(ctx, mesh, world, 1);
  return 0;
}

/* MPI is the program's (WK_MPI): worker_main initialises and finalises it. */
static int run_sub_comm(worker *wk) {
  int world = wk->world;
  int half = world / 2, color = g_rank < half ? 0 : 1;
  MPI_Comm sub = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, color, g_rank, &sub);
  int sub_rank = -1, sub_size = -1;
  MPI_Comm_rank(sub, &sub_rank);
  MPI_Comm_size(sub, &sub_size);
  mpg_spec spec = MPG_SPEC_INIT;
  char dims[32];
  snprintf(dims, sizeof dims, "dp=%d", half);
  CHECK(mpg_spec_set_mesh(&spec, dims));
  mpg_mesh *mesh = NULL;
  CHECK(mpg_mesh_create(&spec, 0, &mesh));
  mpg_init_opts opts = MPG_INIT_OPTS_INIT;
  opts.backend.name = MPG_BACKEND_MPI;
  opts.backend.timeout_s = 60;
  opts.mpi_comm = &sub;
  mpg_ctx *ctx = NULL;
  CHECK(mpg_ctx_create(mesh, &opts, &ctx));
  if (ctx) {
    if (mpg_ctx_rank(ctx) != sub_rank || mpg_ctx_world_size(ctx) != half)
      fail("ctx rank %d of %d, expected %d of %d (the half's, not the launcher's %d of %d)",
           mpg_ctx_rank(ctx), mpg_ctx_world_size(ctx), sub_rank, half, g_rank, world);
    mpg_group *dp = NULL;
    CHECK(mpg_ctx_group(ctx, "dp", &dp));
    int64_t v = g_rank, sum = -1, want = 0;
    for (int r = color * half; r < (color + 1) * half; r++) want += r;
    CHECK(mpg_all_reduce(dp, &v, &sum, 1, MPG_I64, MPG_OP_SUM, NULL, NULL));
    if (sum != want) fail("half %d summed %lld, expected %lld", color, (long long)sum,
                          (long long)want);
    CHECK(mpg_ctx_destroy(ctx));
  }
  /* A mesh of the whole world over a half is refused, naming the source. */
  mpg_mesh *big = NULL;
  snprintf(dims, sizeof dims, "dp=%d", world);
  CHECK(mpg_spec_set_mesh(&spec, dims));
  CHECK(mpg_mesh_create(&spec, 0, &big));
  mpg_status st = mpg_ctx_create(big, &opts, &ctx);
  if (st != MPG_ERR_INVALID || !strstr(mpg_last_error(), "opts.mpi_comm"))
    fail("a %d-rank mesh over a half gave %s: %s", world, mpg_status_name(st),
         mpg_last_error());
  /* MPI_COMM_NULL is refused, not handed to MPI. */
  MPI_Comm none = MPI_COMM_NULL;
  opts.mpi_comm = &none;
  st = mpg_ctx_create(mesh, &opts, &ctx);
  if (st != MPG_ERR_INVALID || !strstr(mpg_last_error(), "MPI_COMM_NULL"))
    fail("MPI_COMM_NULL gave %s: %s", mpg_status_name(st), mpg_last_error());
  mpg_mesh_destroy(big);
  mpg_mesh_destroy(mesh);
  MPI_Comm_free(&sub);
  return 0;
}

static int run_progress_env(worker *wk) {
  return run_env_refused(wk->world, "MESHPG_MPI_PROGRESS=\"sometimes\"", "");
}

static int run_window_env(worker *wk) {
  return run_env_refused(wk->world, "MESHPG_MPI_WINDOW=\"9\"", "from 1 to 8");
}

static const worker_case cases[] = {
    {"collectives", "", 0, 0, run_collectives, 0},
    {"timeout", "", 0, 0, run_timeout, 0},
    {"split_timeout", "", 0, 0, run_split_timeout, 0},
    {"progress", "", 0, 0, run_progress, 0},
    {"progress_env", "", 0, 0, run_progress_env, 0},
    {"window_env", "", 0, 0, run_window_env, 0},
    {"idle_cpu", "", 0, 0, run_idle_cpu, 0},
    {"sub_comm", "", 0, 0, run_sub_comm, WK_MPI},
    {"p2p_batch", "", 0, 0, run_p2p_batch, 0},
    {"p2p_timeout", "", 0, 0, run_p2p_timeout, 0},
    {"all_to_all", "", 0, 0, run_all_to_all, 0},
    {"a2a_timeout", "", 0, 0, run_a2a_timeout, 0},
};
WORKER_MAIN(cases)
