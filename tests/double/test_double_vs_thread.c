/* The NCCL backend on the CUDA/NCCL test double against the thread backend,
 * bit for bit: the same collectives on the same inputs, ranks as threads
 * (the NCCL ranks share a caller-made unique id and take device = rank).
 * Worlds 3 (a group size that is not a power of two: averages of f16/bf16
 * must not be pre-multiplied in the element's type) and 4, and every group
 * of dp2 x cp2 x tp2 at world 8 (tp, cp, dp, dp_cp, world) and pp of
 * pp2 x dp2 x tp2, every floating
 * dtype, sum, avg, max, min and a scaled sum, all_reduce (in place and
 * not), reduce_scatter, all_gather, broadcast, all_to_all and
 * all_to_all_v (uneven per-pair counts, zeros included, blocks in
 * reverse order on the send side and with gaps on the receive side: on
 * nccl one ncclGroupStart .. ncclGroupEnd of ncclSend / ncclRecv).  The
 * same again with tiny inputs on groups of 2, 4 and 8 (subnormal in f16,
 * bf16 or f32: NCCL's ncclAvg of a half pre-multiplies each addend by
 * half(1/n) in the half, where 1e-7 becomes 0 even at a power of two).
 * (This test found the scaled f16/bf16 sum rounding each addend before the
 * sum, up to 7 units in the last place off, and the f16/bf16 average
 * pre-multiplied in the half, over 3 ranks by a rounded 1/3 and, once the
 * double modelled ncclAvg's pre-multiply, over 2, 4 and 8 ranks for tiny
 * addends: groups/nccl/ops.c.) */
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h" /* MPG__OP_PREMUL_SUM */
#include "on_double.h"

#define MAXW 8
#define N 1031 /* elements per rank */

static const mpg_dtype dts[] = {MPG_F32, MPG_F64, MPG_F16, MPG_BF16};
static const mpg_op ops[] = {MPG_OP_SUM, MPG_OP_AVG, MPG_OP_MAX, MPG_OP_MIN,
                             MPG__OP_PREMUL_SUM};
#define NDT 4
#define NOP 5
/* Cases per dtype: 5 ops x {out of place, in place} all_reduce, then
 * reduce_scatter (sum, avg), all_gather, broadcast, all_to_all,
 * all_to_all_v. */
#define NCASE (NOP * 2 + 6)
#define A2A (NOP * 2 + 4) /* the all_to_all case; A2A + 1: all_to_all_v */

/* all_to_all_v: elements position s sends to position t (0 for some
 * pairs, at most 802 < N). */
static size_t a2a_count(int s, int t) {
  return (size_t)((s * 7 + t * 13) % 5) * 200 + (size_t)((s + t) % 3);
}

typedef struct job {
  int world;
  const char *group; /* the group the collectives run on */
  int gsize;         /* its size */
  mpg_mesh *mesh;
  int nodes;         /* > 0: placement on that many simulated nodes */
  int mesh_rank[2][MAXW]; /* each launcher rank's mesh rank, per backend */
  /* outputs[backend][rank][dtype][case]: N * world * 8 bytes each */
  unsigned char *out[2][MAXW][NDT][NCASE];
  mpg_status st[2][MAXW];
  char msg[2][MAXW][512];
} job;

/* Tiny inputs instead (the tiny_* tests set it before any rank starts). */
static int tiny;

/* Inputs with real rounding: a different irrational-ish value per element
 * and rank, some negative, some large; or tiny ones: 1e-7 is 2^-23 in f16
 * (two units of its smallest subnormal), 3e-39, 4.5e-39 and 1.2e-38 are
 * subnormal or nearly in bf16 and f32 (0 in f16). */
static double input(int rank, size_t i) {
  if (tiny) {
    static const double t[] = {1e-7, 3e-7, 6e-8, 2e-6, 3e-39, 4.5e-39, 1.2e-38, 5e-6};
    return t[(i + (size_t)rank) % 8] * (i % 3 == 2 ? -1.0 : 1.0);
  }
  return sin(0.37 * (double)i + 1.3 * rank) * (1.0 + (double)((i * 7 + rank) % 13)) * 3.1;
}

/* f32 -> f16, round to nearest even (finite inputs of modest size). */
static uint16_t to_f16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  uint32_t sign = (u >> 16) & 0x8000u;
  int e = (int)((u >> 23) & 0xff) - 127 + 15;
  uint32_t m = u & 0x7fffffu;
  if (e >= 31) return (uint16_t)(sign | 0x7c00u);
  if (e <= 0) { /* subnormal */
    if (e < -10) return (uint16_t)sign;
    m |= 0x800000u;
    int shift = 14 - e;
    uint32_t h = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1))) h++;
    return (uint16_t)(sign | h);
  }
  uint32_t h = ((uint32_t)e << 10) | (m >> 13), rem = m & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) h++;
  return (uint16_t)(sign | h);
}

static void put(mpg_dtype dt, void *buf, size_t i, double v) {
  switch (dt) {
    case MPG_F32: ((float *)buf)[i] = (float)v; break;
    case MPG_F64: ((double *)buf)[i] = v; break;
    default: {
      /* f16/bf16 via f32, round to nearest even (as meshpg does). */
      float f = (float)v;
      uint32_t u;
      memcpy(&u, &f, 4);
      if (dt == MPG_BF16) {
        ((uint16_t *)buf)[i] = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
      } else {
        ((uint16_t *)buf)[i] = to_f16(f);
      }
    }
  }
}

static size_t case_bytes(int world, mpg_dtype dt) {
  return (size_t)N * (size_t)world * mpg_dtype_size(dt);
}

/* Run every case on `ctx`; buffers come from mpg_ctx_mem_alloc (device
 * memory on nccl) and move through `to_dev` / `from_dev`. */
typedef struct io {
  int dev; /* 1: nccl (cudaMemcpy), 0: host (memcpy) */
} io;

static void copy_in(const io *x, void *dst, const void *src, size_t bytes) {
  if (x->dev) {
    cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice);
    cudaDeviceSynchronize();
  } else {
    memcpy(dst, src, bytes);
  }
}

static void copy_out(const io *x, void *dst, const void *src, size_t bytes) {
  if (x->dev) {
    cudaDeviceSynchronize();
    cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost);
  } else {
    memcpy(dst, src, bytes);
  }
}

static mpg_status run_cases(job *j, int backend, int rank, mpg_ctx *ctx) {
  io x = {backend == 1};
  int w = j->gsize;
  mpg_group *g = NULL;
  mpg_status st = mpg_ctx_group_dims(ctx, j->group, &g);
  if (!st && mpg_group_size(g) != w) st = MPG_ERR_STATE;
  if (st) return st;
  void *a = NULL, *b = NULL;
  size_t max_bytes = (size_t)N * w * 8;
  if ((st = mpg_ctx_mem_alloc(ctx, max_bytes, 0, &a))) return st;
  if ((st = mpg_ctx_mem_alloc(ctx, max_bytes, 0, &b))) return st;
  unsigned char *host = malloc(max_bytes);
  if (!host) return MPG_ERR_NOMEM;
  for (int d = 0; d < NDT && !st; d++) {
    mpg_dtype dt = dts[d];
    size_t es = mpg_dtype_size(dt);
    for (int c = 0; c < NCASE && !st; c++) {
      size_t nin = (size_t)N * (c == NOP * 2 || c == NOP * 2 + 1 || c >= A2A ? (size_t)w : 1);
      for (size_t i = 0; i < nin; i++) put(dt, host, i, input(rank, i));
      memset(host + nin * es, 0, max_bytes - nin * es);
      copy_in(&x, a, host, max_bytes);
      memset(host, 0, max_bytes);
      copy_in(&x, b, host, max_bytes);
      if (c < NOP * 2) {
        mpg_op op = ops[c % NOP];
        int inplace = c >= NOP;
        void *dst = inplace ? a : b;
        if (op == MPG__OP_PREMUL_SUM)
          st = mpg_all_reduce_scaled(g, a, dst, N, dt, 1.0 / 3.0, NULL, NULL);
        else
          st = mpg_all_reduce(g, a, dst, N, dt, op, NULL, NULL);
        if (!st) copy_out(&x, host, dst, (size_t)N * es);
      } else if (c < NOP * 2 + 2) {
        st = mpg_reduce_scatter(g, a, b, N, dt, c == NOP * 2 ? MPG_OP_SUM : MPG_OP_AVG, NULL,
                                NULL);
        if (!st) copy_out(&x, host, b, (size_t)N * es);
      } else if (c == NOP * 2 + 2) {
        st = mpg_all_gather(g, a, b, N, dt, NULL, NULL);
        if (!st) copy_out(&x, host, b, (size_t)N * w * es);
      } else if (c == NOP * 2 + 3) {
        st = mpg_broadcast(g, a, N, dt, w - 1, NULL, NULL);
        if (!st) copy_out(&x, host, a, (size_t)N * es);
      } else if (c == A2A) {
        st = mpg_all_to_all(g, a, b, N, dt, NULL, NULL);
        if (!st) copy_out(&x, host, b, (size_t)N * w * es);
      } else {
        /* Send blocks in reverse peer order, receive blocks with a gap of
         * one element after each. */
        size_t sc[MAXW], sd[MAXW], rc[MAXW], rd[MAXW], so = 0, ro = 0;
        int me = mpg_group_position(g);
        for (int t = w - 1; t >= 0; t--) {
          sc[t] = a2a_count(me, t);
          sd[t] = so;
          so += sc[t];
        }
        for (int s = 0; s < w; s++) {
          rc[s] = a2a_count(s, me);
          rd[s] = ro;
          ro += rc[s] + 1;
        }
        st = mpg_all_to_all_v(g, a, sc, sd, b, rc, rd, dt, NULL, NULL);
        if (!st) copy_out(&x, host, b, (size_t)N * w * es);
      }
      if (!st) memcpy(j->out[backend][rank][d][c], host, case_bytes(w, dt));
      if (!st) st = mpg_ctx_check_order(ctx); /* the order checker, every case */
    }
  }
  free(host);
  mpg_ctx_mem_free(ctx, a);
  mpg_ctx_mem_free(ctx, b);
  return st;
}

static void note(job *j, int backend, int rank, mpg_status st) {
  j->st[backend][rank] = st;
  snprintf(j->msg[backend][rank], sizeof j->msg[backend][rank], "%s",
           st ? mpg_last_error() : "");
}

/* Placement (j->nodes > 0): launcher rank r runs on node r % nodes (a
 * cyclic launcher), so the context renumbers ranks to keep the inner dims
 * on a node; the NCCL world is then split into the mesh order. */
static char hosts[MAXW][32];

static void place(const job *j, mpg_init_opts *o) {
  if (j->nodes <= 0) return;
  snprintf(hosts[o->rank], sizeof hosts[o->rank], "node%d:boot", o->rank % j->nodes);
  o->host_id = hosts[o->rank];
  o->placement = 1;
}

/* Backend bk of a job: 0, the thread backend; 1, NCCL on the double. */
typedef struct backend_arg {
  job *j;
  int bk;
} backend_arg;

static mpg_status backend_rank(const mpg_init_opts *in, void *arg) {
  const backend_arg *b = arg;
  job *j = b->j;
  mpg_init_opts o = *in;
  place(j, &o);
  mpg_ctx *ctx = NULL;
  mpg_status st = mpg_ctx_create(j->mesh, &o, &ctx);
  if (!st) j->mesh_rank[b->bk][o.rank] = mpg_ctx_rank(ctx);
  if (!st) st = run_cases(j, b->bk, o.rank, ctx);
  note(j, b->bk, o.rank, st);
  mpg_ctx_destroy(ctx);
  return MPG_OK;
}

/* The collectives on `group` (gsize ranks) of mesh `dims` (world ranks,
 * dp_cp flattened when the mesh has cp). */
static void compare_on(const char *dims, int world, const char *group, int gsize, int nodes) {
  job *j = calloc(1, sizeof *j);
  cr_assert_not_null(j);
  *j = (job){.world = world, .nodes = nodes, .group = group, .gsize = gsize};
  for (int bk = 0; bk < 2; bk++)
    for (int r = 0; r < world; r++)
      for (int d = 0; d < NDT; d++)
        for (int c = 0; c < NCASE; c++) {
          j->out[bk][r][d][c] = calloc(1, case_bytes(gsize, dts[d]));
          cr_assert_not_null(j->out[bk][r][d][c]);
        }
  cr_assert_eq(mesh_build(dims, strstr(dims, "cp=") ? "dp_cp=dp,cp" : NULL, world, &j->mesh),
               MPG_OK, "%s", mpg_last_error());
  backend_arg thread = {j, 0}, nccl = {j, 1};
  cr_assert_eq(mpg_thread_run(world, 60, backend_rank, &thread, NULL), MPG_OK, "%s",
               mpg_last_error());
  nccl_thread_run(world, 60, backend_rank, &nccl);
  for (int bk = 0; bk < 2; bk++)
    for (int r = 0; r < world; r++)
      cr_assert_eq(j->st[bk][r], MPG_OK, "%s rank %d: %s: %s", bk ? "nccl" : "thread", r,
                   mpg_status_name(j->st[bk][r]), j->msg[bk][r]);
  int renumbered = 0;
  for (int r = 0; r < world; r++) {
    cr_assert_eq(j->mesh_rank[0][r], j->mesh_rank[1][r], "%s on %d nodes: launcher rank %d is "
                 "mesh rank %d on threads, %d on nccl", dims, nodes, r, j->mesh_rank[0][r],
                 j->mesh_rank[1][r]);
    renumbered += j->mesh_rank[1][r] != r;
  }
  if (nodes > 0) {
    cr_assert_gt(renumbered, 0, "%s on %d nodes (cyclic launcher): placement renumbered no "
                 "rank", dims, nodes);
    cr_log_info("%s on %d simulated nodes: placement renumbered %d of %d ranks on both "
                "backends", dims, nodes, renumbered, world);
  }
  static const char *const cname[NCASE] = {
      "all_reduce sum", "all_reduce avg", "all_reduce max", "all_reduce min",
      "all_reduce scaled", "all_reduce sum in place", "all_reduce avg in place",
      "all_reduce max in place", "all_reduce min in place", "all_reduce scaled in place",
      "reduce_scatter sum", "reduce_scatter avg", "all_gather", "broadcast", "all_to_all",
      "all_to_all_v"};
  int cases = 0;
  for (int r = 0; r < world; r++)
    for (int d = 0; d < NDT; d++)
      for (int c = 0; c < NCASE; c++) {
        size_t bytes = case_bytes(gsize, dts[d]);
        const unsigned char *x = j->out[0][r][d][c], *y = j->out[1][r][d][c];
        size_t at = 0;
        while (at < bytes && x[at] == y[at]) at++;
        cr_expect_eq(at, bytes, "%s, group %s, rank %d %s %s: byte %zu differs (thread "
                     "0x%02x, nccl on the double 0x%02x)", dims, group, r,
                     mpg_dtype_name(dts[d]), cname[c], at, at < bytes ? x[at] : 0,
                     at < bytes ? y[at] : 0);
        cases++;
      }
  cr_log_info("%s, group %s: %d rank x dtype x collective results equal bit for bit", dims,
              group, cases);
  for (int bk = 0; bk < 2; bk++)
    for (int r = 0; r < world; r++)
      for (int d = 0; d < NDT; d++)
        for (int c = 0; c < NCASE; c++) free(j->out[bk][r][d][c]);
  mpg_mesh_destroy(j->mesh);
  free(j);
}

static void compare(const char *dims, int world, const char *group, int gsize) {
  compare_on(dims, world, group, gsize, 0);
}

Test(double_vs_thread, world_3_bit_for_bit, .timeout = 120) { compare("dp=3", 3, "dp", 3); }
Test(double_vs_thread, world_4_bit_for_bit, .timeout = 120) { compare("dp=4", 4, "dp", 4); }
/* Megatron's shape: every group of dp2 x cp2 x tp2. */
#define MESH8 "dp=2,cp=2,tp=2"
Test(double_vs_thread, world_8_tp, .timeout = 120) { compare(MESH8, 8, "tp", 2); }
Test(double_vs_thread, world_8_cp, .timeout = 120) { compare(MESH8, 8, "cp", 2); }
Test(double_vs_thread, world_8_dp, .timeout = 120) { compare(MESH8, 8, "dp", 2); }
Test(double_vs_thread, world_8_dp_cp, .timeout = 120) { compare(MESH8, 8, "dp_cp", 4); }
Test(double_vs_thread, world_8_world, .timeout = 120) { compare(MESH8, 8, "world", 8); }
/* Pipeline stages: the pp group (first and last stage, as a tied
 * embedding's) of pp2 x dp2 x tp2. */
Test(double_vs_thread, world_8_pp, .timeout = 120) { compare("pp=2,dp=2,tp=2", 8, "pp", 2); }
/* Placement renumbering on NCCL: two simulated nodes, the launcher dealing
 * ranks round-robin, so the context renumbers ranks to keep tp and cp on a
 * node (the NCCL world is split into mesh order); every group's results
 * still equal the thread backend's under the same placement. */
Test(double_vs_thread, world_8_placed_on_2_nodes_tp, .timeout = 120) {
  compare_on(MESH8, 8, "tp", 2, 2);
}
Test(double_vs_thread, world_8_placed_on_2_nodes_dp_cp, .timeout = 120) {
  compare_on(MESH8, 8, "dp_cp", 4, 2);
}
/* Tiny inputs: f16/bf16 averages at group sizes 2, 4 and 8 must not take
 * NCCL's ncclAvg in the half (ops.c widens them to f32). */
Test(double_vs_thread, tiny_inputs_world_8_tp, .timeout = 120) {
  tiny = 1;
  compare(MESH8, 8, "tp", 2);
}
Test(double_vs_thread, tiny_inputs_world_8_dp_cp, .timeout = 120) {
  tiny = 1;
  compare(MESH8, 8, "dp_cp", 4);
}
Test(double_vs_thread, tiny_inputs_world_8_world, .timeout = 120) {
  tiny = 1;
  compare(MESH8, 8, "world", 8);
}
