/* mpi_worker's point-to-point and all-to-all modes (p2p_batch,
 * all_to_all, p2p_timeout, a2a_timeout). */
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
#include "mpi_worker.h"

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
      fail("%s: element %zu is %d, expected %d (from rank %d)", what, i, b[i],
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
    fail("out of memory for the ring buffers");
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
    while (!done && !failures) CHECK(mpg_work_test(w, &done));
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
        fail("mixed batch: dtype %s element %zu is %g, expected %g",
             mpg_dtype_name(all_dtypes[d]), i, get(all_dtypes[d], rb[d], i),
             val(all_dtypes[d], peer_rank, i));
        break;
      }
  int32_t stale[2] = {-1, -1}, fresh[2] = {42, 43}, got[2] = {0, 0};
  mpg_p2p_op bad[2] = {{MPG_P2P_SEND, peer, stale, 2, MPG_I32},
                       {MPG_P2P_RECV, peer, NULL, 2, MPG_I32}};
  mpg_status st = mpg_p2p_batch(g, bad, 2, NULL, NULL);
  if (st != MPG_ERR_INVALID || !strstr(mpg_last_error(), "ops[1] (recv): buf is NULL"))
    fail("a batch with a NULL receive buffer gave %s: %s", mpg_status_name(st),
         mpg_last_error());
  mpg_p2p_op good[2] = {{MPG_P2P_RECV, peer, got, 2, MPG_I32},
                        {MPG_P2P_SEND, peer, fresh, 2, MPG_I32}};
  CHECK(mpg_p2p_batch(g, good, 2, NULL, NULL));
  if (got[0] != 42 || got[1] != 43)
    fail("received %d %d after a refused batch: its send was posted", got[0], got[1]);
}

int run_p2p_batch(worker *wk) {
  int world = wk->world;
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
    if (w) fail("n == 0 gave a work handle");
    CHECK(mpg_barrier(wg, NULL));
  }
  CHECK(mpg_ctx_destroy(ctx));
  mpg_mesh_destroy(mesh);
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
static size_t g_a2a_scale = 1; /* counts x this: large blocks */

static size_t a2a_count(uint64_t key, int v, int s, int t) {
  if (!v) return (size_t)(a2a_mix(key) % 40) * g_a2a_scale;
  uint64_t h = a2a_h(key, 1, (uint64_t)s, (uint64_t)t);
  return (h % 4 == 0 ? 0 : (size_t)(h >> 8) % (A2A_MAXC + 1)) * g_a2a_scale;
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
    fail("group \"%s\" has %d members, more than %d", mpg_group_name(g), n, A2A_MAXG);
    return;
  }
  size_t es = mpg_dtype_size(dt);
  size_t sc[A2A_MAXG], sd[A2A_MAXG], rc[A2A_MAXG], rd[A2A_MAXG];
  size_t sn = a2a_layout(key, v, 0, me, n, sc, sd), rn = a2a_layout(key, v, 1, me, n, rc, rd);
  int zs = zc == 1 || zc == 2, zr = zc == 1 || zc == 3;
  unsigned char *send = a2a_alloc(ctx, zs, sn * es + 1), *recv = a2a_alloc(ctx, zr, rn * es + 1);
  unsigned char *mark = calloc(rn * es + 1, 1);
  if (!send || !recv || !mark) {
    fail("out of memory");
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
    fail("%s(%s) on \"%s\": %s: %s", v ? "all_to_all_v" : "all_to_all", mpg_dtype_name(dt),
         mpg_group_name(g), mpg_status_name(st), mpg_last_error());
    bad = 1;
  }
  for (int s = 0; s < n && !bad; s++)
    for (size_t k = 0; k < rc[s] && !bad; k++)
      for (size_t b = 0; b < es && !bad; b++) {
        size_t at = (rd[s] + k) * es + b;
        mark[at] = 1;
        if (recv[at] != a2a_byte(key, s, me, k, b)) {
          fail("%s(%s) on \"%s\": element %zu from position %d, byte %zu: 0x%02x, "
               "expected 0x%02x", v ? "all_to_all_v" : "all_to_all", mpg_dtype_name(dt),
               mpg_group_name(g), k, s, b, recv[at], a2a_byte(key, s, me, k, b));
          bad = 1;
        }
      }
  for (size_t at = 0; at < rn * es + 1 && !bad; at++)
    if (!mark[at] && recv[at] != 0xa5) {
      fail("%s(%s) on \"%s\": byte %zu outside every block was written",
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
int run_all_to_all(worker *wk) {
  int world = wk->world;
  mpg_mesh *mesh = NULL;
  mpg_ctx *ctx = NULL;
  if (setup(world, 60, 0, &mesh, &ctx)) return 1;
  int nsets = mpg_mesh_num_dimsets(mesh), cases = 0;
  for (int s = 0; s < nsets; s++) {
    mpg_group *g = NULL;
    mpg_status st = mpg_ctx_group_at(ctx, s, &g);
    if (st) {
      fail("mpg_ctx_group_at(%d) -> %s: %s", s, mpg_status_name(st), mpg_last_error());
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
    /* Large blocks (x 3000: hundreds of KiB a member) on mpg_ctx_mem_alloc
     * memory, which on mpi is then a memfd the peers map (groups/shm/a2a.c
     * reads the blocks in place): both sides, send only, then malloc'ed
     * (through the sender's outbox). */
    g_a2a_scale = 3000;
    for (int c = 0; c < 3; c++, cases++)
      a2a_case(ctx, g, a2a_h(0xb16, (uint64_t)s, (uint64_t)mpg_group_index(g), (uint64_t)c),
               (mpg_dtype)((c + s) % MPG_DTYPE_COUNT), 1, c == 1, c == 0 ? 1 : c == 1 ? 2 : 0);
    g_a2a_scale = 1;
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
      fail("rank %d of the mismatched pair got %s, expected ERR_INVALID: %s", g_rank,
           mpg_status_name(st), mpg_last_error());
    else if (pair && !strstr(mpg_last_error(), "do not match"))
      fail("rank %d: the message does not name the mismatch: %s", g_rank, mpg_last_error());
    else if (!pair && st != MPG_OK)
      fail("rank %d (not in the pair) got %s: %s", g_rank, mpg_status_name(st),
           mpg_last_error());
    if (pair) printf("rank %d: mismatch -> %s: %s\n", g_rank, mpg_status_name(st),
                     mpg_last_error());
    /* Every block of an agreeing pair arrived. */
    for (int p = 0; p < n && p < A2A_MAXG && !failed(); p++) {
      if ((me == 1 && p == 0) || p == me) continue;
      for (int k = 0; k < 4; k++)
        if (rb[8 * p + k] != p * 100 + me * 10 + k) {
          fail("rank %d: element %d from position %d is %d, expected %d", g_rank, k, p,
               rb[8 * p + k], p * 100 + me * 10 + k);
          break;
        }
    }
    CHECK(mpg_ctx_destroy(ctx));
    mpg_mesh_destroy(mesh);
    printf("rank %d: %d all-to-alls\n", g_rank, cases);
    return 0;
  }
  CHECK(mpg_ctx_destroy(ctx));
  mpg_mesh_destroy(mesh);
  printf("rank %d: %d all-to-alls\n", g_rank, cases);
  return 0;
}

/* Rank 0 exchanges with the last rank, which never posts its side. */
int run_p2p_timeout(worker *wk) {
  const double timeout = test_timeout();
  int world = wk->world;
  mpg_mesh *mesh = NULL;
  mpg_ctx *ctx = NULL;
  mpg_group *wg = NULL;
  if (healthy_world(world, timeout, &mesh, &ctx, &wg)) return 1;
  if (g_rank == 0) {
    int32_t s[4] = {1, 2, 3, 4}, r[4];
    mpg_p2p_op ops[2] = {{MPG_P2P_SEND, world - 1, s, 4, MPG_I32},
                         {MPG_P2P_RECV, world - 1, r, 4, MPG_I32}};
    double t0 = now_s();
    mpg_status st = mpg_p2p_batch(wg, ops, 2, NULL, NULL);
    double dt = now_s() - t0;
    if (timed_out("a batch with an absent peer", "mpg_p2p_batch", st, dt, timeout, world))
      printf("rank 0: ERR_TIMEOUT after %.3f s: %s\n", dt, mpg_last_error());
    if (mpg_ctx_status(ctx) != MPG_ERR_TIMEOUT)
      fail("the context status is %s, expected ERR_TIMEOUT",
           mpg_status_name(mpg_ctx_status(ctx)));
    st = mpg_p2p_batch(wg, ops, 2, NULL, NULL);
    if (st != MPG_ERR_ABORTED)
      fail("a batch after the timeout returned %s, expected ERR_ABORTED", mpg_status_name(st));
  } else if (g_rank == world - 1) {
    sleep_s(timeout + 1.5); /* never posts */
  }
  ctx_close(ctx, mesh);
  return 0;
}

/* An all-to-all on the world without the last rank, which arrives only
 * after the others gave up.  Half of the buffers are malloc'ed and
 * scribbled over after the timeout (staged: MPI must never write them
 * late), the rest from mpg_ctx_mem_alloc (zero-copy: freed late). */
int run_a2a_timeout(worker *wk) {
  enum { N = 1000 }; /* per member: past the eager limit */
  int world = wk->world;
  const double timeout = test_timeout();
  mpg_mesh *mesh = NULL;
  mpg_ctx *ctx = NULL;
  mpg_group *wg = NULL;
  if (healthy_world(world, timeout, &mesh, &ctx, &wg)) return 1;
  size_t bytes = (size_t)world * N * sizeof(float);
  float *send = malloc(bytes), *recv = NULL;
  CHECK(mpg_ctx_mem_alloc(ctx, bytes, 0, (void **)&recv));
  if (!send || !recv) return 1;
  for (size_t i = 0; i < (size_t)world * N; i++) send[i] = (float)i;
  /* MESHPG_TEST_A2A_WARM: one all-to-all first, so that the late one
   * runs through the group's shared-memory channel (groups/shm/a2a.c),
   * whose timeout names the missing member on every waiter. */
  if (getenv("MESHPG_TEST_A2A_WARM")) CHECK(mpg_all_to_all(wg, send, recv, N, MPG_F32, NULL,
                                                          NULL));
  int late = g_rank == world - 1;
  if (late) {
    sleep_s(timeout + 1.5); /* the others gave up by then */
  }
  double t0 = now_s();
  mpg_status st = mpg_all_to_all(wg, send, recv, N, MPG_F32, NULL, NULL);
  double dt = now_s() - t0;
  memset(send, 0x77, bytes); /* the caller's memory is free again */
  if (!late) {
    if (!timed_out("all_to_all without the last rank", "mpg_all_to_all", st, dt, timeout, world)) {
      /* reported */
    } else if (mpg_group_size(wg) == world && g_rank < world - 1 &&
             !strstr(mpg_last_error(), "never sent") &&
             !strstr(mpg_last_error(), "aborted") &&
             !(getenv("MESHPG_TEST_A2A_WARM") &&
               strstr(mpg_last_error(), "missing position")))
      fail("the message does not name the member that never arrived: %s", mpg_last_error());
    else
      printf("rank %d: ERR_TIMEOUT after %.3f s: %s\n", g_rank, dt, mpg_last_error());
    if (mpg_ctx_status(ctx) != MPG_ERR_TIMEOUT)
      fail("the context status is %s, expected ERR_TIMEOUT",
           mpg_status_name(mpg_ctx_status(ctx)));
    st = mpg_all_to_all(wg, send, recv, N, MPG_F32, NULL, NULL);
    if (st != MPG_ERR_ABORTED)
      fail("an all_to_all after the timeout returned %s, expected ERR_ABORTED",
           mpg_status_name(st));
  } else if (st != MPG_OK && st != MPG_ERR_TIMEOUT && st != MPG_ERR_ABORTED) {
    fail("late all_to_all returned %s: %s", mpg_status_name(st), mpg_last_error());
  } else if (dt > tb_bound(timeout + 1.0, world)) {
    fail("late all_to_all took %.3f s", dt);
  } else {
    printf("rank %d (late): all_to_all -> %s after %.3f s\n", g_rank, mpg_status_name(st), dt);
  }
  free(send);
  CHECK(mpg_ctx_mem_free(ctx, recv)); /* maybe still MPI's: deferred */
  CHECK(mpg_ctx_destroy(ctx));
  mpg_mesh_destroy(mesh);
  return 0;
}
