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
 * otherwise; exit code 0 / 1.
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
#include "../support/time_bound.h"

static const char *g_mode = "?";
static int g_rank = -1;
static int g_failures;

#define FAIL(...)                                                     \
  do {                                                                \
    if (g_failures++ < 20) {                                          \
      printf("FAIL %s rank %d: ", g_mode, g_rank);                    \
      printf(__VA_ARGS__);                                            \
      printf("\n");                                                   \
      fflush(stdout);                                                 \
    }                                                                 \
  } while (0)

/* Check a status; on failure print where and the library's message. */
#define CHECK(call)                                                   \
  do {                                                                \
    mpg_status st_ = (call);                                          \
    if (st_ != MPG_OK)                                                \
      FAIL("%s:%d: %s -> %s: %s", __FILE__, __LINE__, #call,          \
           mpg_status_name(st_), mpg_last_error());                   \
  } while (0)

/* The timeout of the timeout modes: 1 s, or MESHPG_TEST_TIMEOUT_S (for
 * slow runs such as valgrind, whose start-up alone takes seconds). */
static double test_timeout(void) {
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

static const mpg_dtype all_dtypes[] = {MPG_F32, MPG_F64, MPG_F16,
                                       MPG_BF16, MPG_I32, MPG_I64};
enum { NDTYPES = 6 };

static int is_float(mpg_dtype dt) { return dt != MPG_I32 && dt != MPG_I64; }

static void put(mpg_dtype dt, void *buf, size_t i, double v) {
  switch (dt) {
    case MPG_F32: ((float *)buf)[i] = (float)v; break;
    case MPG_F64: ((double *)buf)[i] = v; break;
    case MPG_F16: ((uint16_t *)buf)[i] = to_f16((float)v); break;
    case MPG_BF16: ((uint16_t *)buf)[i] = (uint16_t)(fbits((float)v) >> 16); break;
    case MPG_I32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case MPG_I64: ((int64_t *)buf)[i] = (int64_t)v; break;
  }
}

static double get(mpg_dtype dt, const void *buf, size_t i) {
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
static double val(mpg_dtype dt, int r, size_t i) {
  int v = (int)((r * 13 + (int)i * 7 + 3) % 23) - 11;
  return is_float(dt) ? v * 0.5 : v;
}

static const char *op_name(mpg_op op) {
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
static double reduce_ref(mpg_dtype dt, mpg_op op, const int *members, int n,
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
/* Collectives on one group                                            */
/* ------------------------------------------------------------------ */

typedef struct {
  mpg_group *g;
  const char *name;
  int size, pos;
  int members[64];
} grp;

enum { COUNT = 37 };

static void check_buf(const grp *G, const char *what, mpg_dtype dt, const void *buf,
                      size_t n, const double *expect) {
  for (size_t i = 0; i < n; i++) {
    double got = get(dt, buf, i);
    if (got != expect[i]) {
      FAIL("group %s (size %d, position %d): %s dtype %s: element %zu is %.17g, "
           "expected %.17g",
           G->name, G->size, G->pos, what, mpg_dtype_name(dt), i, got, expect[i]);
      return;
    }
  }
}

static void test_all_reduce(const grp *G) {
  static const mpg_op ops[] = {MPG_OP_SUM, MPG_OP_AVG, MPG_OP_MAX, MPG_OP_MIN,
                               MPG__OP_PREMUL_SUM};
  unsigned char send[COUNT * 8], recv[COUNT * 8];
  double expect[COUNT];
  for (int d = 0; d < NDTYPES; d++) {
    mpg_dtype dt = all_dtypes[d];
    for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++) {
      mpg_op op = ops[o];
      if (op == MPG__OP_PREMUL_SUM && !is_float(dt)) continue;
      double scale = 0.25;
      for (size_t i = 0; i < COUNT; i++)
        expect[i] = reduce_ref(dt, op, G->members, G->size, i, scale);
      for (int inplace = 0; inplace < 2; inplace++) {
        void *s = inplace ? recv : send;
        for (size_t i = 0; i < COUNT; i++) put(dt, s, i, val(dt, g_rank, i));
        if (!inplace)
          for (size_t i = 0; i < COUNT; i++) put(dt, recv, i, 99);
        char what[96];
        snprintf(what, sizeof what, "all_reduce op %s%s", op_name(op),
                 inplace ? " in place" : "");
        mpg_status st = op == MPG__OP_PREMUL_SUM
            ? mpg_all_reduce_scaled(G->g, s, recv, COUNT, dt, scale, NULL, NULL)
            : mpg_all_reduce(G->g, s, recv, COUNT, dt, op, NULL, NULL);
        if (st) {
          FAIL("group %s: %s dtype %s -> %s: %s", G->name, what,
               mpg_dtype_name(dt), mpg_status_name(st), mpg_last_error());
          continue;
        }
        check_buf(G, what, dt, recv, COUNT, expect);
      }
    }
  }
  /* An empty all_reduce completes. */
  CHECK(mpg_all_reduce(G->g, send, recv, 0, MPG_F32, MPG_OP_SUM, NULL, NULL));
}

static void test_async(const grp *G) {
  /* Every dtype in flight at once, then waited in reverse order. */
  static unsigned char bufs[NDTYPES][COUNT * 8];
  mpg_work *w[NDTYPES];
  double expect[COUNT];
  for (int d = 0; d < NDTYPES; d++) {
    for (size_t i = 0; i < COUNT; i++) put(all_dtypes[d], bufs[d], i, val(all_dtypes[d], g_rank, i));
    mpg_status st = mpg_all_reduce(G->g, bufs[d], bufs[d], COUNT, all_dtypes[d],
                                   MPG_OP_SUM, NULL, &w[d]);
    if (st) {
      FAIL("group %s: async all_reduce %s -> %s: %s", G->name,
           mpg_dtype_name(all_dtypes[d]), mpg_status_name(st), mpg_last_error());
      w[d] = NULL;
    }
  }
  /* Poll the first with mpg_work_test until done. */
  int done = 0;
  double t0 = now_s();
  while (!done && now_s() - t0 < 30) {
    mpg_status st = mpg_work_test(w[0], &done);
    if (st) {
      FAIL("group %s: mpg_work_test -> %s: %s", G->name, mpg_status_name(st),
           mpg_last_error());
      break;
    }
  }
  if (!done) FAIL("group %s: mpg_work_test never reported completion", G->name);
  for (int d = NDTYPES - 1; d >= 0; d--) {
    mpg_status st = mpg_work_wait(w[d]);
    if (st) {
      FAIL("group %s: mpg_work_wait %s -> %s: %s", G->name,
           mpg_dtype_name(all_dtypes[d]), mpg_status_name(st), mpg_last_error());
      continue;
    }
    for (size_t i = 0; i < COUNT; i++)
      expect[i] = reduce_ref(all_dtypes[d], MPG_OP_SUM, G->members, G->size, i, 1);
    check_buf(G, "async all_reduce sum", all_dtypes[d], bufs[d], COUNT, expect);
  }
}

static void test_broadcast(const grp *G) {
  unsigned char buf[COUNT * 8];
  double expect[COUNT];
  for (int d = 0; d < NDTYPES; d++) {
    mpg_dtype dt = all_dtypes[d];
    for (int root = 0; root < G->size; root++) {
      int rr = G->members[root];
      for (size_t i = 0; i < COUNT; i++) {
        expect[i] = val(dt, rr + 5, i);
        put(dt, buf, i, G->pos == root ? expect[i] : 99);
      }
      char what[64];
      snprintf(what, sizeof what, "broadcast root %d", root);
      mpg_status st = mpg_broadcast(G->g, buf, COUNT, dt, root, NULL, NULL);
      if (st) {
        FAIL("group %s: %s dtype %s -> %s: %s", G->name, what, mpg_dtype_name(dt),
             mpg_status_name(st), mpg_last_error());
        continue;
      }
      check_buf(G, what, dt, buf, COUNT, expect);
    }
  }
}

static void test_all_gather(const grp *G) {
  size_t n = (size_t)G->size * COUNT;
  unsigned char send[COUNT * 8];
  unsigned char *recv = malloc(n * 8);
  double *expect = malloc(n * sizeof *expect);
  for (int d = 0; d < NDTYPES; d++) {
    mpg_dtype dt = all_dtypes[d];
    size_t es = mpg_dtype_size(dt);
    for (int p = 0; p < G->size; p++)
      for (size_t i = 0; i < COUNT; i++)
        expect[(size_t)p * COUNT + i] = val(dt, G->members[p], i);
    for (int mode = 0; mode < 3; mode++) {
      /* 0: separate buffers; 1: send is this rank's block of recv
       * (NCCL's in place); 2: send is another member's block of recv,
       * refused on every member before anything is posted. */
      if (mode == 2 && G->size == 1) continue;
      for (size_t i = 0; i < n; i++) put(dt, recv, i, 99);
      size_t other = (size_t)((G->pos + 1) % G->size);
      void *s = mode == 0 ? (void *)send
              : mode == 1 ? (void *)(recv + (size_t)G->pos * COUNT * es)
                          : (void *)(recv + other * COUNT * es);
      for (size_t i = 0; i < COUNT; i++) put(dt, s, i, val(dt, g_rank, i));
      char what[64];
      snprintf(what, sizeof what, "all_gather%s",
               mode == 1 ? " in place (own block)" : mode == 2 ? " send at another block" : "");
      mpg_status st = mpg_all_gather(G->g, s, recv, COUNT, dt, NULL, NULL);
      if (mode == 2) {
        if (st != MPG_ERR_INVALID || !strstr(mpg_last_error(), "position * count"))
          FAIL("group %s: %s dtype %s -> %s (expected ERR_INVALID): %s", G->name, what,
               mpg_dtype_name(dt), mpg_status_name(st), mpg_last_error());
        continue;
      }
      if (st) {
        FAIL("group %s: %s dtype %s -> %s: %s", G->name, what, mpg_dtype_name(dt),
             mpg_status_name(st), mpg_last_error());
        continue;
      }
      check_buf(G, what, dt, recv, n, expect);
    }
  }
  free(recv);
  free(expect);
}

static void test_reduce_scatter(const grp *G) {
  static const mpg_op ops[] = {MPG_OP_SUM, MPG_OP_AVG, MPG_OP_MAX, MPG_OP_MIN};
  size_t n = (size_t)G->size * COUNT;
  unsigned char *send = malloc(n * 8);
  unsigned char recv[COUNT * 8];
  double expect[COUNT];
  for (int d = 0; d < NDTYPES; d++) {
    mpg_dtype dt = all_dtypes[d];
    for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++) {
      mpg_op op = ops[o];
      for (size_t i = 0; i < COUNT; i++)
        expect[i] = reduce_ref(dt, op, G->members, G->size,
                               (size_t)G->pos * COUNT + i, 1);
      for (int inplace = 0; inplace < 2; inplace++) {
        for (size_t i = 0; i < n; i++) put(dt, send, i, val(dt, g_rank, i));
        /* In place: recv is this rank's block of send (NCCL's rule). */
        void *r = inplace ? (void *)(send + (size_t)G->pos * COUNT * mpg_dtype_size(dt))
                          : (void *)recv;
        if (!inplace)
          for (size_t i = 0; i < COUNT; i++) put(dt, recv, i, 99);
        char what[96];
        snprintf(what, sizeof what, "reduce_scatter op %s%s", op_name(op),
                 inplace ? " in place (own block)" : "");
        mpg_status st = mpg_reduce_scatter(G->g, send, r, COUNT, dt, op, NULL, NULL);
        if (st) {
          FAIL("group %s: %s dtype %s -> %s: %s", G->name, what,
               mpg_dtype_name(dt), mpg_status_name(st), mpg_last_error());
          continue;
        }
        check_buf(G, what, dt, r, COUNT, expect);
      }
    }
  }
  free(send);
}

static void test_send_recv(const grp *G) {
  if (G->size < 2) return;
  int to = (G->pos + 1) % G->size, from = (G->pos + G->size - 1) % G->size;
  unsigned char sbuf[COUNT * 8], rbuf[COUNT * 8];
  double expect[COUNT];
  for (int d = 0; d < NDTYPES; d++) {
    mpg_dtype dt = all_dtypes[d];
    for (size_t i = 0; i < COUNT; i++) {
      put(dt, sbuf, i, val(dt, g_rank + 3, i));
      put(dt, rbuf, i, 99);
      expect[i] = val(dt, G->members[from] + 3, i);
    }
    mpg_work *wr = NULL, *ws = NULL;
    CHECK(mpg_recv(G->g, rbuf, COUNT, dt, from, NULL, &wr));
    CHECK(mpg_send(G->g, sbuf, COUNT, dt, to, NULL, &ws));
    mpg_status a = mpg_work_wait(ws), b = mpg_work_wait(wr);
    if (a || b) {
      FAIL("group %s: send/recv dtype %s -> %s / %s: %s", G->name,
           mpg_dtype_name(dt), mpg_status_name(a), mpg_status_name(b),
           mpg_last_error());
      continue;
    }
    check_buf(G, "recv", dt, rbuf, COUNT, expect);
  }
}

/* The communicator really joins the mesh's members: gather world ranks. */
static void test_membership(const grp *G, const mpg_mesh *mesh, int s) {
  int index, pos, size;
  CHECK(mpg_mesh_group_of(mesh, s, g_rank, &index, &pos, &size));
  if (mpg_group_size(G->g) != size || mpg_group_position(G->g) != pos ||
      mpg_group_index(G->g) != index)
    FAIL("group %s: size/position/index %d/%d/%d, mesh says %d/%d/%d", G->name,
         mpg_group_size(G->g), mpg_group_position(G->g), mpg_group_index(G->g), size,
         pos, index);
  for (int p = 0; p < size; p++) {
    int r = -1;
    CHECK(mpg_group_member(G->g, p, &r));
    if (r != G->members[p])
      FAIL("group %s: member %d is %d, mesh says %d", G->name, p, r, G->members[p]);
  }
  int32_t me = g_rank, got[64];
  CHECK(mpg_all_gather(G->g, &me, got, 1, MPG_I32, NULL, NULL));
  for (int p = 0; p < size; p++)
    if (got[p] != G->members[p])
      FAIL("group %s: position %d holds world rank %d, mpg_mesh_group_members "
           "says %d", G->name, p, (int)got[p], G->members[p]);
  CHECK(mpg_barrier(G->g, NULL));
}

/* DESIGN: a dp_cp all_reduce on (dp=2, tp=2, cp=2) keeps tp-distinct
 * values apart. */
static void test_design(mpg_ctx *ctx, const mpg_mesh *mesh) {
  int world = mpg_ctx_world_size(ctx), coord[8];
  mpg_group *dpcp = NULL, *wg = NULL;
  CHECK(mpg_ctx_group(ctx, "dp_cp", &dpcp));
  CHECK(mpg_ctx_group(ctx, "world", &wg));
  if (!dpcp || !wg) return;
  CHECK(mpg_mesh_coord_of(mesh, g_rank, coord));
  int tp = coord[1];
  double v = (tp + 1) * 1000.0 + g_rank, r = 0;
  CHECK(mpg_all_reduce(dpcp, &v, &r, 1, MPG_F64, MPG_OP_SUM, NULL, NULL));
  int ds, members[8];
  CHECK(mpg_mesh_dimset_find(mesh, "dp_cp", &ds));
  CHECK(mpg_mesh_group_members(mesh, ds, mpg_group_index(dpcp), members));
  double expect = 0;
  for (int p = 0; p < 4; p++) expect += (tp + 1) * 1000.0 + members[p];
  if (r != expect) FAIL("design: dp_cp sum is %g, expected %g", r, expect);
  double all[8];
  CHECK(mpg_all_gather(wg, &r, all, 1, MPG_F64, NULL, NULL));
  for (int a = 0; a < world; a++)
    for (int b = 0; b < world; b++) {
      int ca[8], cb[8], ga, gb;
      mpg_mesh_coord_of(mesh, a, ca);
      mpg_mesh_coord_of(mesh, b, cb);
      mpg_mesh_group_of(mesh, ds, a, &ga, NULL, NULL);
      mpg_mesh_group_of(mesh, ds, b, &gb, NULL, NULL);
      if (ca[1] != cb[1] && all[a] == all[b])
        FAIL("design: ranks %d (tp %d) and %d (tp %d) both ended with %g", a,
             ca[1], b, cb[1], all[a]);
      if (ga == gb && all[a] != all[b])
        FAIL("design: ranks %d and %d share dp_cp group %d but ended with %g "
             "and %g", a, b, ga, all[a], all[b]);
    }
}

/* ------------------------------------------------------------------ */
/* Modes                                                               */
/* ------------------------------------------------------------------ */

static mpg_status make_ctx(int world, double timeout_s, int lazy,
                           mpg_mesh **mesh, mpg_ctx **ctx) {
  const char *dims = world == 8 ? "dp=2,tp=2,cp=2"
                   : world == 4 ? "dp=2,tp=2,cp=1"
                   : world == 2 ? "dp=2,tp=1,cp=1" : "dp=-1,tp=1,cp=1";
  mpg_spec spec = MPG_SPEC_INIT;
  mpg_status st;
  if ((st = mpg_spec_init(&spec)) || (st = mpg_spec_set_mesh(&spec, dims)) ||
      (st = mpg_spec_add_flatten(&spec, "dp_cp", "dp,cp")) ||
      (st = mpg_spec_validate(&spec)) || (st = mpg_mesh_create(&spec, world, mesh)))
    return st;
  mpg_init_opts opts = MPG_INIT_OPTS_INIT;
  opts.backend.name = MPG_BACKEND_MPI;
  opts.rank = -1;       /* from OMPI_COMM_WORLD_RANK */
  opts.world_size = -1; /* from OMPI_COMM_WORLD_SIZE */
  opts.backend.timeout_s = timeout_s;
  opts.backend.lazy_groups = lazy;
  return mpg_ctx_create(*mesh, &opts, ctx);
}

/* 1 (after a summary FAIL line) if any check of this mode failed. */
static int failed(void) {
  if (!g_failures) return 0;
  printf("FAIL %s rank %d: %d check(s) failed\n", g_mode, g_rank, g_failures);
  return 1;
}

/* make_ctx, or print why not (then 1, with nothing left to free). */
static int setup(int world, double timeout_s, int lazy, mpg_mesh **mesh,
                 mpg_ctx **ctx) {
  mpg_status st = make_ctx(world, timeout_s, lazy, mesh, ctx);
  if (!st) return 0;
  FAIL("setup -> %s: %s", mpg_status_name(st), mpg_last_error());
  mpg_mesh_destroy(*mesh);
  *mesh = NULL;
  return 1;
}

static int run_collectives(int world) {
  mpg_mesh *mesh = NULL;
  mpg_ctx *ctx = NULL;
  double t0 = now_s();
  mpg_status st = MPG_OK;
  if (setup(world, 60, 0, &mesh, &ctx)) return 1;
  if (mpg_ctx_rank(ctx) != g_rank || mpg_ctx_world_size(ctx) != world ||
      mpg_ctx_backend(ctx) != MPG_BACKEND_MPI)
    FAIL("context says rank %d of %d, backend %d", mpg_ctx_rank(ctx),
         mpg_ctx_world_size(ctx), (int)mpg_ctx_backend(ctx));
  int nsets = mpg_mesh_num_dimsets(mesh);
  for (int s = 0; s < nsets; s++) {
    grp G;
    memset(&G, 0, sizeof G);
    st = mpg_ctx_group_at(ctx, s, &G.g);
    if (st) {
      FAIL("mpg_ctx_group_at(%d) -> %s: %s", s, mpg_status_name(st), mpg_last_error());
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
  if (failed()) return 1;
  printf("OK %s rank %d (%d dim sets, %.2f s)\n", g_mode, g_rank, nsets, t1 - t0);
  return 0;
}

static int run_timeout(int world) {
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
  if (y != (float)world) FAIL("warm-up all_reduce gave %g, expected %d", y, world);
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
    if (st != MPG_ERR_TIMEOUT)
      FAIL("all_reduce without rank %d returned %s, expected ERR_TIMEOUT: %s",
           world - 1, mpg_status_name(st), mpg_last_error());
    else if (dt < timeout * 0.9 || dt > tb_bound(timeout + 1.0, world))
      FAIL("ERR_TIMEOUT after %.3f s, expected %.1f .. %.1f s", dt, timeout * 0.9,
           tb_bound(timeout + 1.0, world));
    else
      printf("rank %d: ERR_TIMEOUT after %.3f s: %s\n", g_rank, dt, mpg_last_error());
    /* The context is aborted now: every group refuses work at once. */
    t0 = now_s();
    st = mpg_all_reduce(dp, &x, &y, 1, MPG_F32, MPG_OP_SUM, NULL, NULL);
    if (st != MPG_ERR_ABORTED)
      FAIL("all_reduce on dp after the timeout returned %s, expected ERR_ABORTED",
           mpg_status_name(st));
    st = mpg_barrier(wg, NULL);
    if (st != MPG_ERR_ABORTED)
      FAIL("barrier on world after the timeout returned %s, expected ERR_ABORTED",
           mpg_status_name(st));
    if (now_s() - t0 > tb_bound(0.5, world))
      FAIL("calls after the abort took %.3f s", now_s() - t0);
    CHECK(mpg_ctx_mem_free(ctx, ob)); /* still in use by MPI: deferred */
  } else {
    /* Arrive long after the others gave up, then post the op they waited
     * for.  It may complete (their abandoned requests still progress
     * while they are inside MPI) or time out: both are fine, a hang is
     * not. */
    double until = now_s() + timeout + 1.5;
    while (now_s() < until) {
      struct timespec ts = {0, 50000000L};
      nanosleep(&ts, NULL);
    }
    double t0 = now_s();
    st = mpg_all_reduce(wg, ob, ob, NOB, MPG_F32, MPG_OP_SUM, NULL, NULL);
    double dt = now_s() - t0;
    CHECK(mpg_ctx_mem_free(ctx, ob));
    if (st != MPG_OK && st != MPG_ERR_TIMEOUT)
      FAIL("late all_reduce returned %s: %s", mpg_status_name(st), mpg_last_error());
    else if (dt > tb_bound(timeout + 1.0, world))
      FAIL("late all_reduce took %.3f s", dt);
    else
      printf("rank %d (late): all_reduce -> %s after %.3f s\n", g_rank,
             mpg_status_name(st), dt);
  }
  double t0 = now_s();
  st = mpg_ctx_destroy(ctx);
  double dt = now_s() - t0;
  if (st) FAIL("mpg_ctx_destroy -> %s: %s", mpg_status_name(st), mpg_last_error());
  if (!late && dt > tb_bound(0.5, world))
    FAIL("mpg_ctx_destroy after the abort took %.3f s", dt);
  mpg_mesh_destroy(mesh);
  if (failed()) return 1;
  printf("OK %s rank %d\n", g_mode, g_rank);
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
static int run_progress(int world) {
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
  double until = now_s() + 2.0;
  while (now_s() < until) {
    struct timespec ts = {0, 20000000L};
    nanosleep(&ts, NULL);
  }
  float avg = (float)(world + 1) / 2.0f;
  for (int b = 0; b < 2; b++) {
    if (!w[b]) continue;
    int done = -1;
    CHECK(mpg_work_test(w[b], &done));
    if (done != want_done)
      FAIL("%s: after 2 s without calls, mpg_work_test said done=%d, expected %d "
           "(progress thread %s)", names[b], done, want_done, want_done ? "on" : "off");
    CHECK(mpg_work_wait(w[b]));
    long bad = 0;
    for (size_t i = 0; i < N; i++)
      if (bufs[b][i] != avg * (float)(i % 7) && bad++ == 0)
        FAIL("%s: element %zu is %g, expected %g", names[b], i, (double)bufs[b][i],
             (double)(avg * (float)(i % 7)));
    if (bad) FAIL("%s: %ld wrong elements", names[b], bad);
  }
  free(bufs[1]);
  CHECK(mpg_ctx_mem_free(ctx, owned));
  /* A pointer that mpg_ctx_mem_alloc did not return is refused. */
  int local = 0;
  st = mpg_ctx_mem_free(ctx, &local);
  if (st != MPG_ERR_INVALID || !strstr(mpg_last_error(), "mpg_ctx_mem_alloc"))
    FAIL("mpg_ctx_mem_free of a stack pointer -> %s: %s", mpg_status_name(st),
         mpg_last_error());
  CHECK(mpg_ctx_destroy(ctx));
  mpg_mesh_destroy(mesh);
  if (failed()) return 1;
  printf("OK %s rank %d (progress thread %s)\n", g_mode, g_rank,
         want_done ? "on" : "off");
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
static int run_idle_cpu(int world) {
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
  if (y != (float)world) FAIL("all_reduce gave %g, expected %d", y, world);
  if (!late && dt < 2.5) FAIL("the wait took only %.2f s: the late rank was not late", dt);
  if (!late && cpu > 1.0)
    FAIL("waiting %.2f s for a late peer cost %.2f s of CPU (expected < 1 s)", dt, cpu);
  CHECK(mpg_ctx_destroy(ctx));
  mpg_mesh_destroy(mesh);
  if (g_failures) return 1;
  printf("OK %s rank %d (waited %.2f s, %.3f s CPU)\n", g_mode, g_rank, dt, cpu);
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
    FAIL("mpg_ctx_create with %s -> %s: %s", what, mpg_status_name(st), mpg_last_error());
  if (ctx) mpg_ctx_destroy(ctx);
  mpg_mesh_destroy(mesh);
  if (g_failures) return 1;
  printf("OK %s rank %d\n", g_mode, g_rank);
  return 0;
}

static int run_split_timeout(int world) {
  const double timeout = test_timeout();
  mpg_mesh *mesh = NULL;
  mpg_ctx *ctx = NULL;
  mpg_status st = MPG_OK;
  if (setup(world, timeout, 1, &mesh, &ctx)) return 1;
  int late = g_rank == world - 1;
  if (late) {
    double until = now_s() + timeout + 1.5;
    while (now_s() < until) {
      struct timespec ts = {0, 50000000L};
      nanosleep(&ts, NULL);
    }
  }
  mpg_group *dp = NULL;
  double t0 = now_s();
  st = mpg_ctx_group(ctx, "dp", &dp);
  double dt = now_s() - t0;
  if (st != MPG_ERR_TIMEOUT)
    FAIL("%screating the dp group returned %s, expected ERR_TIMEOUT: %s",
         late ? "late rank: " : "", mpg_status_name(st), mpg_last_error());
  else if (dt < timeout * 0.9 || dt > tb_bound(timeout + 1.0, world))
    FAIL("ERR_TIMEOUT after %.3f s, expected %.1f .. %.1f s", dt, timeout * 0.9,
         tb_bound(timeout + 1.0, world));
  else
    printf("rank %d%s: ERR_TIMEOUT after %.3f s: %s\n", g_rank,
           late ? " (late)" : "", dt, mpg_last_error());
  mpg_group *wg = NULL;
  float x = 1.0f, y = 0;
  st = mpg_ctx_group(ctx, "world", &wg);
  if (!st) st = mpg_all_reduce(wg, &x, &y, 1, MPG_F32, MPG_OP_SUM, NULL, NULL);
  if (st != MPG_ERR_ABORTED)
    FAIL("all_reduce on world after the timeout returned %s, expected ERR_ABORTED",
         mpg_status_name(st));
  t0 = now_s();
  st = mpg_ctx_destroy(ctx);
  dt = now_s() - t0;
  if (st) FAIL("mpg_ctx_destroy -> %s: %s", mpg_status_name(st), mpg_last_error());
  if (dt > tb_bound(0.5, world)) FAIL("mpg_ctx_destroy after the abort took %.3f s", dt);
  mpg_mesh_destroy(mesh);
  if (failed()) return 1;
  printf("OK %s rank %d\n", g_mode, g_rank);
  return 0;
}

static int run_sub_comm(int world) {
  int provided = 0;
  MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
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
      FAIL("ctx rank %d of %d, expected %d of %d (the half's, not the launcher's %d of %d)",
           mpg_ctx_rank(ctx), mpg_ctx_world_size(ctx), sub_rank, half, g_rank, world);
    mpg_group *dp = NULL;
    CHECK(mpg_ctx_group(ctx, "dp", &dp));
    int64_t v = g_rank, sum = -1, want = 0;
    for (int r = color * half; r < (color + 1) * half; r++) want += r;
    CHECK(mpg_all_reduce(dp, &v, &sum, 1, MPG_I64, MPG_OP_SUM, NULL, NULL));
    if (sum != want) FAIL("half %d summed %lld, expected %lld", color, (long long)sum,
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
    FAIL("a %d-rank mesh over a half gave %s: %s", world, mpg_status_name(st),
         mpg_last_error());
  /* MPI_COMM_NULL is refused, not handed to MPI. */
  MPI_Comm none = MPI_COMM_NULL;
  opts.mpi_comm = &none;
  st = mpg_ctx_create(mesh, &opts, &ctx);
  if (st != MPG_ERR_INVALID || !strstr(mpg_last_error(), "MPI_COMM_NULL"))
    FAIL("MPI_COMM_NULL gave %s: %s", mpg_status_name(st), mpg_last_error());
  mpg_mesh_destroy(big);
  mpg_mesh_destroy(mesh);
  MPI_Comm_free(&sub);
  MPI_Finalize();
  if (g_failures) return 1;
  printf("OK %s rank %d\n", g_mode, g_rank);
  return 0;
}

/* ------------------------------------------------------------------ */
/* Batched point to point (mpg_p2p_batch)                              */
/* ------------------------------------------------------------------ */

/* Element i of the message that world rank `src` sends in direction `dir`. */
static int32_t p2p_val(int src, int dir, size_t i) {
  return (int32_t)(((uint32_t)i * 2654435761u) ^ ((uint32_t)src << 24) ^
                   ((uint32_t)dir << 20));
}

static void p2p_fill(int32_t *b, size_t n, int src, int dir) {
  for (size_t i = 0; i < n; i++) b[i] = p2p_val(src, dir, i);
}

static void p2p_check(const char *what, const int32_t *b, size_t n, int src, int dir) {
  for (size_t i = 0; i < n; i++)
    if (b[i] != p2p_val(src, dir, i)) {
      FAIL("%s: element %zu is %d, expected %d (from rank %d)", what, i, b[i],
           p2p_val(src, dir, i), src);
      return;
    }
}

/* Every member sends n int32 to the next and to the previous position
 * and receives from both, in one batch whose sends are listed first. */
static void p2p_ring(mpg_group *g, const int *members, size_t n, int async) {
  int me = mpg_group_position(g), size = mpg_group_size(g);
  int next = (me + 1) % size, prev = (me + size - 1) % size;
  int32_t *tn = malloc(n * 4), *tp = malloc(n * 4), *fp = calloc(n, 4), *fn = calloc(n, 4);
  if (!tn || !tp || !fp || !fn) {
    FAIL("out of memory for the ring buffers");
    free(tn), free(tp), free(fp), free(fn);
    return;
  }
  p2p_fill(tn, n, g_rank, 0);
  p2p_fill(tp, n, g_rank, 1);
  mpg_p2p_op ops[4] = {{MPG_P2P_SEND, next, tn, n, MPG_I32},
                       {MPG_P2P_SEND, prev, tp, n, MPG_I32},
                       {MPG_P2P_RECV, prev, fp, n, MPG_I32},
                       {MPG_P2P_RECV, next, fn, n, MPG_I32}};
  double t0 = now_s();
  if (async) {
    mpg_work *w = NULL;
    CHECK(mpg_p2p_batch(g, ops, 4, NULL, &w));
    int done = 0;
    while (!done && !g_failures) CHECK(mpg_work_test(w, &done));
    CHECK(mpg_work_wait(w));
  } else {
    CHECK(mpg_p2p_batch(g, ops, 4, NULL, NULL));
  }
  double dt = now_s() - t0;
  char what[96];
  snprintf(what, sizeof what, "ring on %s (%zu bytes, %s): from the previous",
           mpg_group_name(g), n * 4, async ? "work" : "blocking");
  p2p_check(what, fp, n, members[prev], 0);
  snprintf(what, sizeof what, "ring on %s (%zu bytes, %s): from the next",
           mpg_group_name(g), n * 4, async ? "work" : "blocking");
  p2p_check(what, fn, n, members[next], 1);
  if (g_rank == 0)
    printf("rank 0: ring on %s, %zu bytes each way, %s: %.3f s\n", mpg_group_name(g),
           n * 4, async ? "work handle" : "blocking", dt);
  free(tn), free(tp), free(fp), free(fn);
}

/* Three messages each way to one peer, interleaved, then a mix of dtypes;
 * then a batch with a bad last operation, refused before its good first
 * send is posted. */
static void p2p_pair(mpg_group *g, int peer_rank) {
  int peer = 1 - mpg_group_position(g);
  int32_t s[3][300], r[3][300];
  const size_t len[3] = {7, 300, 1};
  for (int k = 0; k < 3; k++) p2p_fill(s[k], len[k], g_rank, 10 + k);
  memset(r, 0, sizeof r);
  mpg_p2p_op ops[6] = {
      {MPG_P2P_SEND, peer, s[0], 7, MPG_I32}, {MPG_P2P_RECV, peer, r[0], 7, MPG_I32},
      {MPG_P2P_RECV, peer, r[1], 300, MPG_I32}, {MPG_P2P_SEND, peer, s[1], 300, MPG_I32},
      {MPG_P2P_SEND, peer, s[2], 1, MPG_I32}, {MPG_P2P_RECV, peer, r[2], 1, MPG_I32}};
  CHECK(mpg_p2p_batch(g, ops, 6, NULL, NULL));
  for (int k = 0; k < 3; k++) {
    char what[64];
    snprintf(what, sizeof what, "message %d of three to one peer", k);
    p2p_check(what, r[k], len[k], peer_rank, 10 + k);
  }
  /* Every dtype in one batch, each message exact. */
  unsigned char sb[NDTYPES][COUNT * 8], rb[NDTYPES][COUNT * 8];
  mpg_p2p_op mix[2 * NDTYPES];
  for (int d = 0; d < NDTYPES; d++) {
    for (size_t i = 0; i < COUNT; i++) {
      put(all_dtypes[d], sb[d], i, val(all_dtypes[d], g_rank, i));
      put(all_dtypes[d], rb[d], i, 99);
    }
    mpg_p2p_op a = {MPG_P2P_SEND, peer, sb[d], COUNT, all_dtypes[d]};
    mpg_p2p_op b = {MPG_P2P_RECV, peer, rb[d], COUNT, all_dtypes[d]};
    mix[2 * d] = a;
    mix[2 * d + 1] = b;
  }
  CHECK(mpg_p2p_batch(g, mix, 2 * NDTYPES, NULL, NULL));
  for (int d = 0; d < NDTYPES; d++)
    for (size_t i = 0; i < COUNT; i++)
      if (get(all_dtypes[d], rb[d], i) != val(all_dtypes[d], peer_rank, i)) {
        FAIL("mixed batch: dtype %s element %zu is %g, expected %g",
             mpg_dtype_name(all_dtypes[d]), i, get(all_dtypes[d], rb[d], i),
             val(all_dtypes[d], peer_rank, i));
        break;
      }
  int32_t stale[2] = {-1, -1}, fresh[2] = {42, 43}, got[2] = {0, 0};
  mpg_p2p_op bad[2] = {{MPG_P2P_SEND, peer, stale, 2, MPG_I32},
                       {MPG_P2P_RECV, peer, NULL, 2, MPG_I32}};
  mpg_status st = mpg_p2p_batch(g, bad, 2, NULL, NULL);
  if (st != MPG_ERR_INVALID || !strstr(mpg_last_error(), "ops[1] (recv): buf is NULL"))
    FAIL("a batch with a NULL receive buffer gave %s: %s", mpg_status_name(st),
         mpg_last_error());
  mpg_p2p_op good[2] = {{MPG_P2P_RECV, peer, got, 2, MPG_I32},
                        {MPG_P2P_SEND, peer, fresh, 2, MPG_I32}};
  CHECK(mpg_p2p_batch(g, good, 2, NULL, NULL));
  if (got[0] != 42 || got[1] != 43)
    FAIL("received %d %d after a refused batch: its send was posted", got[0], got[1]);
}

static int run_p2p_batch(int world) {
  mpg_mesh *mesh = NULL;
  mpg_ctx *ctx = NULL;
  if (setup(world, 60, 0, &mesh, &ctx)) return 1;
  mpg_group *wg = NULL, *dp = NULL;
  CHECK(mpg_ctx_group(ctx, "world", &wg));
  CHECK(mpg_ctx_group(ctx, "dp", &dp));
  if (wg && dp) {
    int wm[64], dm[64];
    int s;
    for (int r = 0; r < world && r < 64; r++) wm[r] = r;
    CHECK(mpg_mesh_dimset_find(mesh, "dp", &s));
    CHECK(mpg_mesh_group_members(mesh, s, mpg_group_index(dp), dm));
    p2p_ring(wg, wm, (size_t)16 << 20, 0); /* 64 MiB each way */
    p2p_ring(wg, wm, (size_t)256 << 10, 1); /* 1 MiB, through a work handle */
    if (mpg_group_size(dp) == 2) {
      p2p_ring(dp, dm, 1000, 0); /* next == previous */
      p2p_pair(dp, dm[1 - mpg_group_position(dp)]);
    }
    mpg_work *w = NULL;
    CHECK(mpg_p2p_batch(wg, NULL, 0, NULL, &w));
    if (w) FAIL("n == 0 gave a work handle");
    CHECK(mpg_barrier(wg, NULL));
  }
  CHECK(mpg_ctx_destroy(ctx));
  mpg_mesh_destroy(mesh);
  if (failed()) return 1;
  printf("OK %s rank %d\n", g_mode, g_rank);
  return 0;
}

/* ------------------------------------------------------------------ */
/* All-to-all (mpg_all_to_all, mpg_all_to_all_v)                       */
/* ------------------------------------------------------------------ */

#define A2A_MAXG 64
#define A2A_MAXC 300 /* elements per block at most: some exceed the eager limit */

static uint64_t a2a_mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

static uint64_t a2a_h(uint64_t a, uint64_t b, uint64_t c, uint64_t d) {
  return a2a_mix(a2a_mix(a2a_mix(a2a_mix(a) ^ b) ^ c) ^ d);
}

/* Case `key`: the elements position s sends to position t (0 for about a
 * quarter of the pairs; one count for every pair in the equal form). */
static size_t a2a_count(uint64_t key, int v, int s, int t) {
  if (!v) return (size_t)(a2a_mix(key) % 40);
  uint64_t h = a2a_h(key, 1, (uint64_t)s, (uint64_t)t);
  return h % 4 == 0 ? 0 : (size_t)(h >> 8) % (A2A_MAXC + 1);
}

static unsigned char a2a_byte(uint64_t key, int s, int t, size_t k, size_t b) {
  return (unsigned char)(a2a_h(key, ((uint64_t)s << 32) | (uint64_t)t, k, 2) >> (8 * (b % 8)));
}

/* One side's layout on position me (side 0 send, 1 recv): the blocks in
 * reverse (send) or rotated (recv) order, with a gap of 0..2 elements
 * before each; returns the elements spanned. */
static size_t a2a_layout(uint64_t key, int v, int side, int me, int n, size_t *c, size_t *d) {
  for (int p = 0; p < n; p++)
    c[p] = side == 0 ? a2a_count(key, v, me, p) : a2a_count(key, v, p, me);
  if (!v) {
    for (int p = 0; p < n; p++) d[p] = (size_t)p * c[0];
    return (size_t)n * c[0];
  }
  size_t at = 0;
  for (int i = 0; i < n; i++) {
    int p = side == 0 ? n - 1 - i : (i + me) % n;
    at += a2a_h(key, 5 + (uint64_t)side, (uint64_t)me, (uint64_t)i) % 3;
    d[p] = at;
    at += c[p];
  }
  return at + 1;
}

/* Run case `key` on g and check every byte received and every gap. */
/* zc: 0 malloc'ed buffers, 1 both from mpg_ctx_mem_alloc (zero-copy on
 * mpi), 2 only send, 3 only recv. */
static void *a2a_alloc(mpg_ctx *ctx, int zc, size_t bytes) {
  void *p = NULL;
  if (!zc) return malloc(bytes);
  mpg_status st = mpg_ctx_mem_alloc(ctx, bytes, 0, &p);
  return st ? NULL : p;
}

static void a2a_free(mpg_ctx *ctx, int zc, void *p) {
  if (!p) return;
  if (!zc) free(p);
  else CHECK(mpg_ctx_mem_free(ctx, p));
}

static void a2a_case(mpg_ctx *ctx, mpg_group *g, uint64_t key, mpg_dtype dt, int v,
                     int async, int zc) {
  int me = mpg_group_position(g), n = mpg_group_size(g);
  if (n > A2A_MAXG) {
    FAIL("group \"%s\" has %d members, more than %d", mpg_group_name(g), n, A2A_MAXG);
    return;
  }
  size_t es = mpg_dtype_size(dt);
  size_t sc[A2A_MAXG], sd[A2A_MAXG], rc[A2A_MAXG], rd[A2A_MAXG];
  size_t sn = a2a_layout(key, v, 0, me, n, sc, sd), rn = a2a_layout(key, v, 1, me, n, rc, rd);
  int zs = zc == 1 || zc == 2, zr = zc == 1 || zc == 3;
  unsigned char *send = a2a_alloc(ctx, zs, sn * es + 1), *recv = a2a_alloc(ctx, zr, rn * es + 1);
  unsigned char *mark = calloc(rn * es + 1, 1);
  if (!send || !recv || !mark) {
    FAIL("out of memory");
    a2a_free(ctx, zs, send), a2a_free(ctx, zr, recv), free(mark);
    return;
  }
  memset(send, 0x5a, sn * es + 1);
  memset(recv, 0xa5, rn * es + 1);
  for (int t = 0; t < n; t++)
    for (size_t k = 0; k < sc[t]; k++)
      for (size_t b = 0; b < es; b++) send[(sd[t] + k) * es + b] = a2a_byte(key, me, t, k, b);
  mpg_work *w = NULL;
  mpg_status st = v ? mpg_all_to_all_v(g, send, sc, sd, recv, rc, rd, dt, NULL,
                                       async ? &w : NULL)
                    : mpg_all_to_all(g, send, recv, sc[0], dt, NULL, async ? &w : NULL);
  if (!st && async) st = mpg_work_wait(w);
  int bad = 0;
  if (st) {
    FAIL("%s(%s) on \"%s\": %s: %s", v ? "all_to_all_v" : "all_to_all", mpg_dtype_name(dt),
         mpg_group_name(g), mpg_status_name(st), mpg_last_error());
    bad = 1;
  }
  for (int s = 0; s < n && !bad; s++)
    for (size_t k = 0; k < rc[s] && !bad; k++)
      for (size_t b = 0; b < es && !bad; b++) {
        size_t at = (rd[s] + k) * es + b;
        mark[at] = 1;
        if (recv[at] != a2a_byte(key, s, me, k, b)) {
          FAIL("%s(%s) on \"%s\": element %zu from position %d, byte %zu: 0x%02x, "
               "expected 0x%02x", v ? "all_to_all_v" : "all_to_all", mpg_dtype_name(dt),
               mpg_group_name(g), k, s, b, recv[at], a2a_byte(key, s, me, k, b));
          bad = 1;
        }
      }
  for (size_t at = 0; at < rn * es + 1 && !bad; at++)
    if (!mark[at] && recv[at] != 0xa5) {
      FAIL("%s(%s) on \"%s\": byte %zu outside every block was written",
           v ? "all_to_all_v" : "all_to_all", mpg_dtype_name(dt), mpg_group_name(g), at);
      bad = 1;
    }
  a2a_free(ctx, zs, send);
  a2a_free(ctx, zr, recv);
  free(mark);
}

/* Random all-to-alls (mostly the v form) on every group of the mesh:
 * every dtype, blocking and through a work handle, uneven counts with
 * zeros; then the issue-order check. */
static int run_all_to_all(int world) {
  mpg_mesh *mesh = NULL;
  mpg_ctx *ctx = NULL;
  if (setup(world, 60, 0, &mesh, &ctx)) return 1;
  int nsets = mpg_mesh_num_dimsets(mesh), cases = 0;
  for (int s = 0; s < nsets; s++) {
    mpg_group *g = NULL;
    mpg_status st = mpg_ctx_group_at(ctx, s, &g);
    if (st) {
      FAIL("mpg_ctx_group_at(%d) -> %s: %s", s, mpg_status_name(st), mpg_last_error());
      continue;
    }
    for (int c = 0; c < 24; c++) {
      uint64_t key = a2a_h(0xa2a, (uint64_t)s, (uint64_t)mpg_group_index(g), (uint64_t)c);
      mpg_dtype dt = (mpg_dtype)(c % MPG_DTYPE_COUNT);
      int v = c < 12 || c >= 18, async = (c / MPG_DTYPE_COUNT + c) % 2;
      /* the last six on mpg_ctx_mem_alloc memory: both sides, send, recv */
      a2a_case(ctx, g, key, dt, v, async, c < 18 ? 0 : 1 + (c - 18) % 3);
      cases++;
    }
  }
  /* Counts that differ between two members (mpi: a block longer than its
   * receive is MPG_ERR_BACKEND on the receiving member once MPI_COMM_WORLD
   * returns errors, the context then aborted): position 0 of the world sends 8 elements to position 1,
   * which expects 4; every other pair exchanges 4 (the last thing done). */
  mpg_group *wg = NULL;
  CHECK(mpg_ctx_group(ctx, "world", &wg));
  CHECK(mpg_ctx_check_order(ctx));
  if (wg && world >= 2 && getenv("MESHPG_TEST_A2A_MISMATCH")) {
    int me = mpg_group_position(wg), n = mpg_group_size(wg);
    size_t sc[A2A_MAXG], sd[A2A_MAXG], rc[A2A_MAXG], rd[A2A_MAXG];
    int32_t sb[8 * A2A_MAXG] = {0}, rb[8 * A2A_MAXG];
    for (int p = 0; p < n && p < A2A_MAXG; p++) {
      sc[p] = rc[p] = 4;
      sd[p] = rd[p] = 8 * (size_t)p;
    }
    if (me == 0) sc[1] = 8;
    for (int p = 0; p < n && p < A2A_MAXG; p++)
      for (int k = 0; k < 8; k++) sb[8 * p + k] = me * 100 + p * 10 + k;
    for (int i = 0; i < 8 * A2A_MAXG; i++) rb[i] = -1;
    /* MPI_COMM_WORLD keeps its fatal error handler: the library must not
     * let MPI see a message longer than its receive. */
    mpg_status st = mpg_all_to_all_v(wg, sb, sc, sd, rb, rc, rd, MPG_I32, NULL, NULL);
    int pair = me == 0 || me == 1;
    if (pair && st != MPG_ERR_INVALID)
      FAIL("rank %d of the mismatched pair got %s, expected ERR_INVALID: %s", g_rank,
           mpg_status_name(st), mpg_last_error());
    else if (pair && !strstr(mpg_last_error(), "do not match"))
      FAIL("rank %d: the message does not name the mismatch: %s", g_rank, mpg_last_error());
    else if (!pair && st != MPG_OK)
      FAIL("rank %d (not in the pair) got %s: %s", g_rank, mpg_status_name(st),
           mpg_last_error());
    if (pair) printf("rank %d: mismatch -> %s: %s\n", g_rank, mpg_status_name(st),
                     mpg_last_error());
    /* Every block of an agreeing pair arrived. */
    for (int p = 0; p < n && p < A2A_MAXG && !failed(); p++) {
      if ((me == 1 && p == 0) || p == me) continue;
      for (int k = 0; k < 4; k++)
        if (rb[8 * p + k] != p * 100 + me * 10 + k) {
          FAIL("rank %d: element %d from position %d is %d, expected %d", g_rank, k, p,
               rb[8 * p + k], p * 100 + me * 10 + k);
          break;
        }
    }
    CHECK(mpg_ctx_destroy(ctx));
    mpg_mesh_destroy(mesh);
    if (failed()) return 1;
    printf("OK %s rank %d (%d all-to-alls)\n", g_mode, g_rank, cases);
    return 0;
  }
  CHECK(mpg_ctx_destroy(ctx));
  mpg_mesh_destroy(mesh);
  if (failed()) return 1;
  printf("OK %s rank %d (%d all-to-alls)\n", g_mode, g_rank, cases);
  return 0;
}

/* Rank 0 exchanges with the last rank, which never posts its side. */
static int run_p2p_timeout(int world) {
  const double timeout = test_timeout();
  mpg_mesh *mesh = NULL;
  mpg_ctx *ctx = NULL;
  if (setup(world, timeout, 0, &mesh, &ctx)) return 1;
  mpg_group *wg = NULL;
  CHECK(mpg_ctx_group(ctx, "world", &wg));
  CHECK(mpg_barrier(wg, NULL)); /* everybody is healthy first */
  if (g_rank == 0) {
    int32_t s[4] = {1, 2, 3, 4}, r[4];
    mpg_p2p_op ops[2] = {{MPG_P2P_SEND, world - 1, s, 4, MPG_I32},
                         {MPG_P2P_RECV, world - 1, r, 4, MPG_I32}};
    double t0 = now_s();
    mpg_status st = mpg_p2p_batch(wg, ops, 2, NULL, NULL);
    double dt = now_s() - t0;
    if (st != MPG_ERR_TIMEOUT)
      FAIL("a batch with an absent peer returned %s, expected ERR_TIMEOUT: %s",
           mpg_status_name(st), mpg_last_error());
    else if (dt < timeout * 0.9 || dt > tb_bound(timeout + 1.0, world))
      FAIL("ERR_TIMEOUT after %.3f s, expected %.1f .. %.1f s", dt, timeout * 0.9,
           tb_bound(timeout + 1.0, world));
    else if (!strstr(mpg_last_error(), "mpg_p2p_batch"))
      FAIL("the message does not name the call: %s", mpg_last_error());
    else
      printf("rank 0: ERR_TIMEOUT after %.3f s: %s\n", dt, mpg_last_error());
    if (mpg_ctx_status(ctx) != MPG_ERR_TIMEOUT)
      FAIL("the context status is %s, expected ERR_TIMEOUT",
           mpg_status_name(mpg_ctx_status(ctx)));
    st = mpg_p2p_batch(wg, ops, 2, NULL, NULL);
    if (st != MPG_ERR_ABORTED)
      FAIL("a batch after the timeout returned %s, expected ERR_ABORTED", mpg_status_name(st));
  } else if (g_rank == world - 1) {
    double until = now_s() + timeout + 1.5; /* never posts */
    while (now_s() < until) {
      struct timespec ts = {0, 50000000L};
      nanosleep(&ts, NULL);
    }
  }
  CHECK(mpg_ctx_destroy(ctx));
  mpg_mesh_destroy(mesh);
  if (failed()) return 1;
  printf("OK %s rank %d\n", g_mode, g_rank);
  return 0;
}

/* An all-to-all on the world without the last rank, which arrives only
 * after the others gave up.  Half of the buffers are malloc'ed and
 * scribbled over after the timeout (staged: MPI must never write them
 * late), the rest from mpg_ctx_mem_alloc (zero-copy: freed late). */
static int run_a2a_timeout(int world) {
  const double timeout = test_timeout();
  mpg_mesh *mesh = NULL;
  mpg_ctx *ctx = NULL;
  if (setup(world, timeout, 0, &mesh, &ctx)) return 1;
  mpg_group *wg = NULL;
  CHECK(mpg_ctx_group(ctx, "world", &wg));
  CHECK(mpg_barrier(wg, NULL)); /* everybody is healthy first */
  enum { N = 1000 };            /* per member: past the eager limit */
  size_t bytes = (size_t)world * N * sizeof(float);
  float *send = malloc(bytes), *recv = NULL;
  CHECK(mpg_ctx_mem_alloc(ctx, bytes, 0, (void **)&recv));
  if (!send || !recv) return 1;
  for (size_t i = 0; i < (size_t)world * N; i++) send[i] = (float)i;
  int late = g_rank == world - 1;
  if (late) {
    double until = now_s() + timeout + 1.5; /* the others gave up by then */
    while (now_s() < until) {
      struct timespec ts = {0, 50000000L};
      nanosleep(&ts, NULL);
    }
  }
  double t0 = now_s();
  mpg_status st = mpg_all_to_all(wg, send, recv, N, MPG_F32, NULL, NULL);
  double dt = now_s() - t0;
  memset(send, 0x77, bytes); /* the caller's memory is free again */
  if (!late) {
    if (st != MPG_ERR_TIMEOUT)
      FAIL("all_to_all without rank %d returned %s, expected ERR_TIMEOUT: %s", world - 1,
           mpg_status_name(st), mpg_last_error());
    else if (dt < timeout * 0.9 || dt > tb_bound(timeout + 1.0, world))
      FAIL("ERR_TIMEOUT after %.3f s, expected %.1f .. %.1f s", dt, timeout * 0.9,
           tb_bound(timeout + 1.0, world));
    else if (!strstr(mpg_last_error(), "mpg_all_to_all"))
      FAIL("the message does not name the call: %s", mpg_last_error());
    else if (mpg_group_size(wg) == world && g_rank < world - 1 &&
             !strstr(mpg_last_error(), "never sent") &&
             !strstr(mpg_last_error(), "aborted"))
      FAIL("the message does not name the member that never arrived: %s", mpg_last_error());
    else
      printf("rank %d: ERR_TIMEOUT after %.3f s: %s\n", g_rank, dt, mpg_last_error());
    if (mpg_ctx_status(ctx) != MPG_ERR_TIMEOUT)
      FAIL("the context status is %s, expected ERR_TIMEOUT",
           mpg_status_name(mpg_ctx_status(ctx)));
    st = mpg_all_to_all(wg, send, recv, N, MPG_F32, NULL, NULL);
    if (st != MPG_ERR_ABORTED)
      FAIL("an all_to_all after the timeout returned %s, expected ERR_ABORTED",
           mpg_status_name(st));
  } else if (st != MPG_OK && st != MPG_ERR_TIMEOUT && st != MPG_ERR_ABORTED) {
    FAIL("late all_to_all returned %s: %s", mpg_status_name(st), mpg_last_error());
  } else if (dt > tb_bound(timeout + 1.0, world)) {
    FAIL("late all_to_all took %.3f s", dt);
  } else {
    printf("rank %d (late): all_to_all -> %s after %.3f s\n", g_rank, mpg_status_name(st), dt);
  }
  free(send);
  CHECK(mpg_ctx_mem_free(ctx, recv)); /* maybe still MPI's: deferred */
  CHECK(mpg_ctx_destroy(ctx));
  mpg_mesh_destroy(mesh);
  if (failed()) return 1;
  printf("OK %s rank %d\n", g_mode, g_rank);
  return 0;
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  g_mode = argc > 1 ? argv[1] : "?";
  mpg_launch env = MPG_LAUNCH_INIT;
  mpg_status st = mpg_launch_from_env(&env);
  if (st || env.rank < 0 || env.world_size <= 0) {
    printf("FAIL %s rank -1: no launch environment (%s: %s); run under mpirun\n",
           g_mode, mpg_status_name(st), mpg_last_error());
    return 1;
  }
  g_rank = env.rank;
  if (strcmp(g_mode, "collectives") == 0) return run_collectives(env.world_size);
  if (strcmp(g_mode, "timeout") == 0) return run_timeout(env.world_size);
  if (strcmp(g_mode, "split_timeout") == 0) return run_split_timeout(env.world_size);
  if (strcmp(g_mode, "progress") == 0) return run_progress(env.world_size);
  if (strcmp(g_mode, "progress_env") == 0)
    return run_env_refused(env.world_size, "MESHPG_MPI_PROGRESS=\"sometimes\"", "");
  if (strcmp(g_mode, "window_env") == 0)
    return run_env_refused(env.world_size, "MESHPG_MPI_WINDOW=\"9\"", "from 1 to 8");
  if (strcmp(g_mode, "idle_cpu") == 0) return run_idle_cpu(env.world_size);
  if (strcmp(g_mode, "sub_comm") == 0) return run_sub_comm(env.world_size);
  if (strcmp(g_mode, "p2p_batch") == 0) return run_p2p_batch(env.world_size);
  if (strcmp(g_mode, "p2p_timeout") == 0) return run_p2p_timeout(env.world_size);
  if (strcmp(g_mode, "all_to_all") == 0) return run_all_to_all(env.world_size);
  if (strcmp(g_mode, "a2a_timeout") == 0) return run_a2a_timeout(env.world_size);
  printf("FAIL %s rank %d: unknown mode (collectives | timeout | split_timeout | "
         "progress | progress_env | window_env | idle_cpu | sub_comm | p2p_batch | p2p_timeout | "
         "all_to_all | a2a_timeout)\n",
         g_mode, g_rank);
  return 1;
}
