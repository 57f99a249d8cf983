/* The thread backend, through the public API: mpg_thread_run, mpg_ctx_create,
 * mpg_ctx_group and the collectives.
 *
 * Every collective, dtype and op runs on every group of every dim set of
 * several meshes, blocking and asynchronous (many operations in flight at
 * once, mpg_work_test then mpg_work_wait in reverse order).  Results are
 * compared bit for bit against a reference computed here from the inputs:
 * the backend reduces in position order, so even floating sums are exact;
 * f16/bf16 are accumulated in f32 and rounded once, with a rounding written
 * independently of the library's.
 *
 * Ranks are threads: Criterion's asserts must not run on them, so a rank
 * records its first failure (RCHECK, tests/rank_check.h) and returns
 * MPG_ERR_STATE, aborting its context so that its peers stop waiting; the
 * test thread then asserts.
 *
 * Three files, by topic: here the reference and the collectives (suites
 * thread_reference, thread_matrix, thread_async); test_thread_p2p.c point to
 * point, mismatched calls, timeouts and abort; test_thread_ctx.c contexts,
 * scale, mpg_thread_run, init errors and partial groups. */
#include <criterion/criterion.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "meshpg.h"
#include "../support/rank_check.h"
#include "run_ranks.h"
#include "../support/time_bound.h"

/* ------------------------------------------------------------------------ */
/* Meshes                                                                    */
/* ------------------------------------------------------------------------ */

/* make_mesh: tests/support/mesh_util.h. */

/* ------------------------------------------------------------------------ */
/* Element values and the reference, written independently of the library   */
/* ------------------------------------------------------------------------ */

static const mpg_dtype all_dtypes[] = {MPG_F32, MPG_F64, MPG_F16,
                                       MPG_BF16, MPG_I32, MPG_I64};
static const char *const dt_names[] = {"f32", "f64", "f16", "bf16", "i32", "i64"};
static const char *const op_names[] = {"sum", "avg", "max", "min", "scaled"};

static size_t esize(mpg_dtype dt) {
  return dt == MPG_F64 || dt == MPG_I64 ? 8 : dt == MPG_F16 || dt == MPG_BF16 ? 2 : 4;
}
static int is_float(mpg_dtype dt) { return dt != MPG_I32 && dt != MPG_I64; }

/* Round x to `sig` significant bits, ties to even; quanta no smaller than
 * 2^min_exp (subnormals).  Exact in double for the ranges used here. */
static double round_sig(double x, int sig, int min_exp) {
  if (x == 0) return x;
  int e;
  frexp(x, &e);
  int q = e - sig;
  if (q < min_exp) q = min_exp;
  return ldexp(nearbyint(ldexp(x, -q)), q);
}

/* Encode a value exactly representable in f16 / bf16. */
static uint16_t f16_encode(double h) {
  uint16_t sign = signbit(h) ? 0x8000u : 0;
  h = fabs(h);
  if (h == 0) return sign;
  int e;
  double m = frexp(h, &e); /* h = m * 2^e, m in [0.5, 1) */
  int E = e - 1;
  if (E < -14) return (uint16_t)(sign | (uint16_t)(h * 16777216.0));
  return (uint16_t)(sign | (uint16_t)((E + 15) << 10) | (uint16_t)((2 * m - 1) * 1024));
}
static double f16_decode(uint16_t b) {
  int e = (b >> 10) & 0x1f, m = b & 0x3ff;
  double v = e ? ldexp(1024 + m, e - 25) : ldexp(m, -24);
  return (b & 0x8000u) ? -v : v;
}
static uint16_t bf16_encode(double h) {
  float f = (float)h;
  uint32_t u;
  memcpy(&u, &f, 4);
  return (uint16_t)(u >> 16);
}
static double bf16_decode(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static uint16_t half_round(mpg_dtype dt, double x) {
  return dt == MPG_F16 ? f16_encode(round_sig(x, 11, -24))
                       : bf16_encode(round_sig(x, 8, -133));
}

/* A small integer in [-30, 30] for (rank, index, salt). */
static int base_val(int rank, size_t i, int salt) {
  return (int)(((unsigned)rank * 37u + (unsigned)i * 11u + (unsigned)salt * 101u) % 61u) - 30;
}

/* Input element i of `rank`. */
static void gen(mpg_dtype dt, int rank, size_t i, int salt, void *out) {
  int v = base_val(rank, i, salt);
  switch (dt) {
    case MPG_F32: { float f = (float)v / 7.0f; memcpy(out, &f, 4); break; }
    case MPG_F64: { double d = (double)v / 7.0; memcpy(out, &d, 8); break; }
    case MPG_F16:
    case MPG_BF16: { uint16_t h = half_round(dt, v * 1.37); memcpy(out, &h, 2); break; }
    case MPG_I32: { int32_t x = v * 12345; memcpy(out, &x, 4); break; }
    case MPG_I64: { int64_t x = (int64_t)v * 1000000007LL * 1000; memcpy(out, &x, 8); break; }
  }
}

/* The input as the f32 the backend accumulates in (f32 and halves). */
static float gen_f32(mpg_dtype dt, int rank, size_t i, int salt) {
  unsigned char b[8];
  gen(dt, rank, i, salt, b);
  uint16_t h;
  float f;
  switch (dt) {
    case MPG_F16: memcpy(&h, b, 2); return (float)f16_decode(h);
    case MPG_BF16: memcpy(&h, b, 2); return (float)bf16_decode(h);
    default: memcpy(&f, b, 4); return f;
  }
}

static void fill(mpg_dtype dt, int rank, size_t n, int salt, void *buf) {
  for (size_t i = 0; i < n; i++) gen(dt, rank, i, salt, (char *)buf + i * esize(dt));
}

/* Reference element idx of op over the members' inputs, in position order.
 * op 4 = scaled sum (each input times scale). */
static void ref_reduce(mpg_dtype dt, int op, double scale, const int *members, int n,
                       size_t idx, int salt, void *out) {
  if (dt == MPG_F32 || dt == MPG_F16 || dt == MPG_BF16) {
    float acc = 0;
    for (int p = 0; p < n; p++) {
      float x = gen_f32(dt, members[p], idx, salt);
      if (op == 4) x = x * (float)scale;
      if (p == 0) acc = x;
      else if (op == MPG_OP_MAX) acc = x > acc ? x : acc;
      else if (op == MPG_OP_MIN) acc = x < acc ? x : acc;
      else acc = acc + x;
    }
    if (op == MPG_OP_AVG) acc = acc / (float)n;
    if (dt == MPG_F32) {
      memcpy(out, &acc, 4);
    } else {
      uint16_t h = half_round(dt, acc);
      memcpy(out, &h, 2);
    }
  } else if (dt == MPG_F64) {
    double acc = 0, x;
    for (int p = 0; p < n; p++) {
      gen(dt, members[p], idx, salt, &x);
      if (op == 4) x = x * scale;
      if (p == 0) acc = x;
      else if (op == MPG_OP_MAX) acc = x > acc ? x : acc;
      else if (op == MPG_OP_MIN) acc = x < acc ? x : acc;
      else acc = acc + x;
    }
    if (op == MPG_OP_AVG) acc = acc / (double)n;
    memcpy(out, &acc, 8);
  } else {
    int64_t acc = 0;
    for (int p = 0; p < n; p++) {
      int64_t x;
      if (dt == MPG_I32) {
        int32_t y;
        gen(dt, members[p], idx, salt, &y);
        x = y;
      } else {
        gen(dt, members[p], idx, salt, &x);
      }
      if (p == 0) acc = x;
      else if (op == MPG_OP_MAX) acc = x > acc ? x : acc;
      else if (op == MPG_OP_MIN) acc = x < acc ? x : acc;
      else acc = acc + x;
    }
    if (op == MPG_OP_AVG) acc = acc / n; /* truncates toward zero */
    if (dt == MPG_I32) {
      int32_t y = (int32_t)acc;
      memcpy(out, &y, 4);
    } else {
      memcpy(out, &acc, 8);
    }
  }
}

static void fmt_elem(mpg_dtype dt, const void *p, char *buf, size_t n) {
  switch (dt) {
    case MPG_F32: { float f; memcpy(&f, p, 4); snprintf(buf, n, "%.9g", f); break; }
    case MPG_F64: { double d; memcpy(&d, p, 8); snprintf(buf, n, "%.17g", d); break; }
    case MPG_F16: { uint16_t h; memcpy(&h, p, 2); snprintf(buf, n, "%g (0x%04x)", f16_decode(h), h); break; }
    case MPG_BF16: { uint16_t h; memcpy(&h, p, 2); snprintf(buf, n, "%g (0x%04x)", bf16_decode(h), h); break; }
    case MPG_I32: { int32_t x; memcpy(&x, p, 4); snprintf(buf, n, "%d", x); break; }
    case MPG_I64: { int64_t x; memcpy(&x, p, 8); snprintf(buf, n, "%lld", (long long)x); break; }
  }
}

/* Self-check of the reference rounding against known values. */
Test(thread_reference, half_rounding_is_ties_to_even) {
  cr_assert_eq(half_round(MPG_F16, 2049.0), 0x6800); /* 2048: tie to even */
  cr_assert_eq(half_round(MPG_F16, 2051.0), 0x6802); /* 2052 */
  cr_assert_eq(half_round(MPG_F16, 1.0), 0x3c00);
  cr_assert_eq(half_round(MPG_F16, -0.5), 0xb800);
  cr_assert_eq(half_round(MPG_F16, ldexp(3, -24)), 0x0003); /* subnormal */
  cr_assert_eq(half_round(MPG_BF16, 1.0), 0x3f80);
  cr_assert_eq(half_round(MPG_BF16, 257.0), 0x4380); /* 256: tie to even */
  cr_assert_eq(half_round(MPG_BF16, 259.0), 0x4382); /* 260 */
  cr_assert(f16_decode(0x6802) == 2052.0);
  cr_assert(bf16_decode(0x4382) == 260.0);
}

/* ------------------------------------------------------------------------ */
/* One collective call, prepared, posted and checked                         */
/* ------------------------------------------------------------------------ */

enum { K_AR, K_ARS, K_BC, K_AG, K_RS, K_P2P, K_BAR };
static const char *const k_names[] = {"all_reduce", "all_reduce_scaled", "broadcast",
                                      "all_gather", "reduce_scatter", "send/recv",
                                      "barrier"};

typedef struct gctx {
  mpg_group *g;
  const char *name;
  int pos, n;
  int members[4096];
} gctx;

typedef struct ccase {
  int kind;
  mpg_dtype dt;
  int op;
  double scale;
  int inplace, root;
  size_t count;
  int salt;
  unsigned char *a, *b; /* a: allocation 1, b: allocation 2 (or NULL) */
  void *send, *recv;
  mpg_work *w, *w2;
} ccase;

static void describe_case(const gctx *G, const ccase *c, char *buf, size_t n) {
  snprintf(buf, n, "%s %s op=%s count=%zu root=%d inplace=%d on group %s (pos %d of %d)",
           k_names[c->kind], dt_names[c->dt], op_names[c->op], c->count, c->root,
           c->inplace, G->name, G->pos, G->n);
}

static void prepare(const gctx *G, int rank, ccase *c) {
  size_t es = esize(c->dt), n = (size_t)G->n, cnt = c->count;
  c->a = c->b = NULL;
  c->w = c->w2 = NULL;
  switch (c->kind) {
    case K_AR:
    case K_ARS:
    case K_RS: {
      /* The send buffer: cnt elements, n * cnt for a reduce-scatter, whose
       * in-place result is this position's block of it. */
      size_t in = c->kind == K_RS ? n * cnt : cnt;
      c->a = malloc(in * es + 1);
      fill(c->dt, rank, in, c->salt, c->a);
      c->send = c->a;
      if (c->inplace) {
        c->recv = c->a + (c->kind == K_RS ? (size_t)G->pos * cnt * es : 0);
      } else {
        c->b = malloc(cnt * es + 1);
        memset(c->b, 0xa5, cnt * es);
        c->recv = c->b;
      }
      break;
    }
    case K_AG:
      c->b = malloc(n * cnt * es + 1);
      memset(c->b, 0xa5, n * cnt * es);
      c->recv = c->b;
      if (c->inplace) {
        c->send = c->b + (size_t)G->pos * cnt * es;
        fill(c->dt, rank, cnt, c->salt, c->send);
      } else {
        c->a = malloc(cnt * es + 1);
        fill(c->dt, rank, cnt, c->salt, c->a);
        c->send = c->a;
      }
      break;
    case K_BC:
      c->a = malloc(cnt * es + 1);
      if (G->pos == c->root)
        fill(c->dt, rank, cnt, c->salt, c->a);
      else
        memset(c->a, 0xa5, cnt * es);
      c->send = c->recv = c->a;
      break;
    case K_P2P:
      c->a = malloc(cnt * es + 1);
      fill(c->dt, rank, cnt, c->salt, c->a);
      c->b = malloc(cnt * es + 1);
      memset(c->b, 0xa5, cnt * es);
      c->send = c->a;
      c->recv = c->b;
      break;
    default:
      break;
  }
}

static void release(ccase *c) {
  free(c->a);
  free(c->b);
  c->a = c->b = NULL;
}

static mpg_status post(const gctx *G, ccase *c, int async) {
  mpg_work **w = async ? &c->w : NULL, **w2 = async ? &c->w2 : NULL;
  switch (c->kind) {
    case K_AR:
      return mpg_all_reduce(G->g, c->send, c->recv, c->count, c->dt, (mpg_op)c->op, NULL, w);
    case K_ARS:
      return mpg_all_reduce_scaled(G->g, c->send, c->recv, c->count, c->dt, c->scale, NULL, w);
    case K_RS:
      return mpg_reduce_scatter(G->g, c->send, c->recv, c->count, c->dt, (mpg_op)c->op, NULL, w);
    case K_AG:
      return mpg_all_gather(G->g, c->send, c->recv, c->count, c->dt, NULL, w);
    case K_BC:
      return mpg_broadcast(G->g, c->recv, c->count, c->dt, c->root, NULL, w);
    case K_BAR:
      return mpg_barrier(G->g, w);
    case K_P2P: {
      int next = (G->pos + 1) % G->n, prev = (G->pos + G->n - 1) % G->n;
      mpg_status st = mpg_send(G->g, c->send, c->count, c->dt, next, NULL, w);
      if (st) return st;
      return mpg_recv(G->g, c->recv, c->count, c->dt, prev, NULL, w2);
    }
  }
  return MPG_ERR_INVALID;
}

/* Compare c's output with the reference; returns 0 or rank_fail's status. */
static mpg_status verify(const gctx *G, int rank, const ccase *c) {
  size_t es = esize(c->dt), n = (size_t)G->n;
  unsigned char want[8];
  char d[256], x[64], y[64];
  for (size_t i = 0; i < (c->kind == K_AG ? n * c->count : c->count); i++) {
    const unsigned char *got;
    switch (c->kind) {
      case K_AR:
        ref_reduce(c->dt, c->op, c->scale, G->members, G->n, i, c->salt, want);
        got = (const unsigned char *)c->recv + i * es;
        break;
      case K_ARS:
        ref_reduce(c->dt, 4, c->scale, G->members, G->n, i, c->salt, want);
        got = (const unsigned char *)c->recv + i * es;
        break;
      case K_RS:
        ref_reduce(c->dt, c->op, c->scale, G->members, G->n,
                   (size_t)G->pos * c->count + i, c->salt, want);
        got = (const unsigned char *)c->recv + i * es;
        break;
      case K_AG:
        gen(c->dt, G->members[i / c->count], i % c->count, c->salt, want);
        got = (const unsigned char *)c->recv + i * es;
        break;
      case K_BC:
        gen(c->dt, G->members[c->root], i, c->salt, want);
        got = (const unsigned char *)c->recv + i * es;
        break;
      case K_P2P:
        gen(c->dt, G->members[(G->pos + G->n - 1) % G->n], i, c->salt, want);
        got = (const unsigned char *)c->recv + i * es;
        break;
      default:
        return MPG_OK;
    }
    if (memcmp(got, want, es) != 0) {
      describe_case(G, c, d, sizeof d);
      fmt_elem(c->dt, got, x, sizeof x);
      fmt_elem(c->dt, want, y, sizeof y);
      return rank_fail(__FILE__, __LINE__, "%s: element %zu is %s, expected %s (rank %d)", d,
                       i, x, y, rank);
    }
  }
  return MPG_OK;
}

/* Every case for one dtype on group G. */
static int build_cases(const gctx *G, mpg_dtype dt, int salt0, ccase *out) {
  int k = 0;
  const int ops[] = {MPG_OP_SUM, MPG_OP_AVG, MPG_OP_MAX, MPG_OP_MIN};
  for (int o = 0; o < 4; o++)
    for (int ip = 0; ip < 2; ip++)
      out[k] = (ccase){.kind = K_AR, .dt = dt, .op = ops[o], .inplace = ip,
                         .count = (o == 0 && ip == 0) ? 129 : 7, .salt = salt0 + k}, k++;
  if (is_float(dt))
    for (int ip = 0; ip < 2; ip++)
      out[k] = (ccase){.kind = K_ARS, .dt = dt, .op = 4, .inplace = ip,
                         .scale = ip ? 1.0 / 3.0 : 0.375, .count = 9, .salt = salt0 + k}, k++;
  for (int o = 0; o < 4; o++)
    out[k] = (ccase){.kind = K_RS, .dt = dt, .op = ops[o], .inplace = o % 2,
                       .count = o == 0 ? 17 : 3, .salt = salt0 + k}, k++;
  for (int ip = 0; ip < 2; ip++)
    out[k] = (ccase){.kind = K_AG, .dt = dt, .inplace = ip, .count = ip ? 2 : 5,
                       .salt = salt0 + k}, k++;
  /* Broadcast from every root for i32, from one root otherwise. */
  if (dt == MPG_I32)
    for (int r = 0; r < G->n; r++)
      out[k] = (ccase){.kind = K_BC, .dt = dt, .root = r, .count = 6, .salt = salt0 + k}, k++;
  else
    out[k] = (ccase){.kind = K_BC, .dt = dt, .root = (salt0 / 7) % G->n, .count = 11,
                       .salt = salt0 + k}, k++;
  if (G->n > 1)
    out[k] = (ccase){.kind = K_P2P, .dt = dt, .count = 10, .salt = salt0 + k}, k++;
  out[k++] = (ccase){.kind = K_BAR, .dt = dt};
  return k;
}

#define MAX_CASES (40 + 4096)

/* Blocking: one call at a time, each checked at once. */
static mpg_status run_sync(const gctx *G, int rank, ccase *cs, int n) {
  char d[256];
  for (int i = 0; i < n; i++) {
    ccase *c = &cs[i];
    prepare(G, rank, c);
    mpg_status st = post(G, c, 0);
    if (st) {
      describe_case(G, c, d, sizeof d);
      release(c);
      return rank_fail(__FILE__, __LINE__, "%s: %s: %s", d, mpg_status_name(st),
                       mpg_last_error());
    }
    st = verify(G, rank, c);
    release(c);
    if (st) return st;
  }
  return MPG_OK;
}

/* Asynchronous: post everything, test each once, wait in reverse order. */
static mpg_status run_async(const gctx *G, int rank, ccase *cs, int n) {
  char d[256];
  mpg_status st = MPG_OK;
  int posted = 0;
  for (; posted < n && !st; posted++) {
    prepare(G, rank, &cs[posted]);
    st = post(G, &cs[posted], 1);
    if (st) describe_case(G, &cs[posted], d, sizeof d);
  }
  if (st) {
    for (int i = 0; i < posted; i++) {
      mpg_work_wait(cs[i].w);
      mpg_work_wait(cs[i].w2);
      release(&cs[i]);
    }
    return rank_fail(__FILE__, __LINE__, "posting %s: %s: %s", d, mpg_status_name(st),
                     mpg_last_error());
  }
  for (int i = 0; i < n && !st; i++) {
    int done = -1;
    st = mpg_work_test(cs[i].w, &done);
    if (!st && done != 0 && done != 1) st = MPG_ERR_STATE;
    if (st) describe_case(G, &cs[i], d, sizeof d);
  }
  for (int i = n - 1; i >= 0; i--) {
    mpg_status s1 = mpg_work_wait(cs[i].w2);
    mpg_status s2 = mpg_work_wait(cs[i].w);
    if (!st && (s1 || s2)) {
      st = s1 ? s1 : s2;
      describe_case(G, &cs[i], d, sizeof d);
    }
  }
  if (st) {
    for (int i = 0; i < n; i++) release(&cs[i]);
    return rank_fail(__FILE__, __LINE__, "%s: %s: %s", d, mpg_status_name(st),
                     mpg_last_error());
  }
  for (int i = 0; i < n && !st; i++) st = verify(G, rank, &cs[i]);
  for (int i = 0; i < n; i++) release(&cs[i]);
  return st;
}

/* Group handle, position and members against the mesh module. */
static mpg_status load_group(mpg_ctx *ctx, const mpg_mesh *mesh, int dimset, gctx *G) {
  int rank = mpg_ctx_rank(ctx), index, pos, size;
  const char *name;
  RCALL(mpg_mesh_dimset_info(mesh, dimset, &name, NULL, NULL));
  RCALL(mpg_ctx_group(ctx, name, &G->g));
  RCHECK(G->g != NULL, "group %s is NULL", name);
  RCALL(mpg_mesh_group_of(mesh, dimset, rank, &index, &pos, &size));
  RCHECK(strcmp(mpg_group_name(G->g), name) == 0, "group name %s, expected %s",
         mpg_group_name(G->g), name);
  RCHECK(mpg_group_size(G->g) == size && mpg_group_position(G->g) == pos &&
             mpg_group_index(G->g) == index,
         "group %s: size/position/index %d/%d/%d, mesh says %d/%d/%d", name,
         mpg_group_size(G->g), mpg_group_position(G->g), mpg_group_index(G->g), size, pos,
         index);
  RCALL(mpg_mesh_group_members(mesh, dimset, index, G->members));
  for (int p = 0; p < size; p++) {
    int r = -1;
    RCALL(mpg_group_member(G->g, p, &r));
    RCHECK(r == G->members[p], "group %s #%d: member %d is rank %d, mesh says %d", name,
           index, p, r, G->members[p]);
  }
  RCHECK(G->members[pos] == rank, "group %s: position %d is not rank %d", name, pos, rank);
  G->name = name;
  G->pos = pos;
  G->n = size;
  /* The data path agrees: gathering the world ranks gives the members. */
  int32_t me = rank, *all = malloc(sizeof(int32_t) * (size_t)size);
  RCHECK(all != NULL, "out of memory");
  mpg_status st = mpg_all_gather(G->g, &me, all, 1, MPG_I32, NULL, NULL);
  for (int p = 0; !st && p < size; p++)
    if (all[p] != G->members[p]) {
      int got = all[p];
      free(all);
      return rank_fail(__FILE__, __LINE__, "group %s: all_gather of ranks gives %d at %d, expected %d",
                       name, got, p, G->members[p]);
    }
  free(all);
  RCHECK(st == MPG_OK, "all_gather on %s: %s: %s", name, mpg_status_name(st), mpg_last_error());
  return MPG_OK;
}

/* ------------------------------------------------------------------------ */
/* The full matrix on one mesh                                               */
/* ------------------------------------------------------------------------ */

typedef struct matrix_arg {
  const mpg_mesh *mesh;
  long ncalls[4096]; /* per rank: collectives checked */
} matrix_arg;

static mpg_status matrix_body(mpg_ctx *ctx, matrix_arg *ma) {
  const mpg_mesh *mesh = ma->mesh;
  int rank = mpg_ctx_rank(ctx);
  gctx *G = malloc(sizeof *G);
  ccase *cs = malloc(sizeof(ccase) * MAX_CASES);
  RCHECK(G && cs, "out of memory");
  mpg_status st = MPG_OK;
  int nsets = mpg_mesh_num_dimsets(mesh);
  for (int s = 0; s < nsets && !st; s++) {
    st = load_group(ctx, mesh, s, G);
    for (int d = 0; d < 6 && !st; d++) {
      int n = build_cases(G, all_dtypes[d], s * 1000 + d * 100, cs);
      st = run_sync(G, rank, cs, n);
      if (!st) {
        n = build_cases(G, all_dtypes[d], s * 1000 + d * 100 + 50, cs);
        st = run_async(G, rank, cs, n);
      }
      ma->ncalls[rank] += 2 * n;
    }
  }
  /* Zero elements with NULL buffers is allowed. */
  if (!st) {
    mpg_group *w;
    st = mpg_ctx_group(ctx, "world", &w);
    if (!st) st = mpg_all_reduce(w, NULL, NULL, 0, MPG_F32, MPG_OP_SUM, NULL, NULL);
    if (st) st = rank_fail(__FILE__, __LINE__, "count-0 all_reduce: %s: %s",
                           mpg_status_name(st), mpg_last_error());
  }
  free(G);
  free(cs);
  return st;
}

static mpg_status matrix_main(const mpg_init_opts *opts, void *arg) {
  matrix_arg *ma = arg;
  tl_rank = opts->rank;
  mpg_ctx *ctx = NULL;
  RCALL(mpg_ctx_create(ma->mesh, opts, &ctx));
  RCHECK(mpg_ctx_rank(ctx) == opts->rank && mpg_ctx_world_size(ctx) == opts->world_size &&
             mpg_ctx_backend(ctx) == MPG_BACKEND_THREAD,
         "ctx says rank %d of %d", mpg_ctx_rank(ctx), mpg_ctx_world_size(ctx));
  tl_ctx = ctx;
  mpg_status st = matrix_body(ctx, ma);
  tl_ctx = NULL;
  mpg_status st2 = mpg_ctx_destroy(ctx);
  if (!st && st2) st = rank_fail(__FILE__, __LINE__, "destroy: %s", mpg_last_error());
  return st;
}

static void run_matrix(const char *dims, const char *const *flat, int expect_world) {
  mpg_mesh *mesh = make_mesh(dims, flat);
  int world = mpg_mesh_world_size(mesh);
  cr_assert_eq(world, expect_world);
  matrix_arg *ma = calloc(1, sizeof *ma);
  ma->mesh = mesh;
  mpg_status statuses[4096];
  double t0 = now_s();
  mpg_status st = mpg_thread_run(world, 30.0, matrix_main, ma, statuses);
  double t = now_s() - t0;
  EXPECT_RUN_OK(st);
  long total = 0;
  for (int r = 0; r < world; r++) {
    cr_assert_eq(statuses[r], MPG_OK, "rank %d: %s", r, mpg_status_name(statuses[r]));
    cr_assert_gt(ma->ncalls[r], 100, "rank %d ran only %ld collectives", r, ma->ncalls[r]);
    total += ma->ncalls[r];
  }
  fprintf(stderr, "thread matrix %s: %d ranks, %ld checked collective calls, %.2f s\n",
          dims, world, total, t);
  free(ma);
  mpg_mesh_destroy(mesh);
}

Test(thread_matrix, dp2_tp2_cp2_with_dp_cp) {
  const char *const fl[] = {"dp_cp=dp,cp", NULL};
  run_matrix("dp=2,tp=2,cp=2", fl, 8);
}

Test(thread_matrix, pp2_dp2_cp2_tp2, .timeout = 120) {
  const char *const fl[] = {"dp_cp=dp,cp", "cp_tp=cp,tp", NULL};
  run_matrix("pp=2,dp=2,cp=2,tp=2", fl, 16);
}

Test(thread_matrix, dp4_cp4_tp4_world64, .timeout = 300) {
  const char *const fl[] = {"dp_cp=dp,cp", NULL};
  run_matrix("dp=4,cp=4,tp=4", fl, 64);
}

Test(thread_matrix, size_one_dim) {
  const char *const fl[] = {"dp_ep=dp,ep", NULL};
  run_matrix("dp=3,ep=1,tp=2", fl, 6);
}

/* ------------------------------------------------------------------------ */
/* Several groups in flight at once                                          */
/* ------------------------------------------------------------------------ */

static mpg_status cross_main(rr_rank *r) {
  int nsets = mpg_mesh_num_dimsets(r->mesh);
  mpg_work *w[32][3];
  int64_t in[32], out[32], gathered[32][64];
  int32_t bc[32];
  mpg_group *g[32];
  mpg_status st = MPG_OK;
  /* Post on every group before waiting for any. */
  for (int s = 0; s < nsets && !st; s++) {
    const char *name;
    mpg_mesh_dimset_info(r->mesh, s, &name, NULL, NULL);
    st = mpg_ctx_group(r->ctx, name, &g[s]);
    in[s] = (int64_t)r->rank * 1000 + s;
    bc[s] = mpg_group_position(g[s]) == 0 ? 777 + s : -1;
    if (!st) st = mpg_all_reduce(g[s], &in[s], &out[s], 1, MPG_I64, MPG_OP_SUM, NULL, &w[s][0]);
    if (!st) st = mpg_all_gather(g[s], &in[s], gathered[s], 1, MPG_I64, NULL, &w[s][1]);
    if (!st) st = mpg_broadcast(g[s], &bc[s], 1, MPG_I32, 0, NULL, &w[s][2]);
  }
  RCHECK(st == MPG_OK, "post: %s: %s", mpg_status_name(st), mpg_last_error());
  for (int s = nsets - 1; s >= 0; s--)
    for (int k = 2; k >= 0; k--) RCALL(mpg_work_wait(w[s][k]));
  for (int s = 0; s < nsets; s++) {
    int members[64], index, size;
    mpg_mesh_group_of(r->mesh, s, r->rank, &index, NULL, &size);
    mpg_mesh_group_members(r->mesh, s, index, members);
    int64_t sum = 0;
    for (int p = 0; p < size; p++) {
      sum += (int64_t)members[p] * 1000 + s;
      RCHECK(gathered[s][p] == (int64_t)members[p] * 1000 + s, "dim set %d: gather[%d]", s, p);
    }
    RCHECK(out[s] == sum, "dim set %d: sum %lld, expected %lld", s, (long long)out[s],
           (long long)sum);
    RCHECK(bc[s] == 777 + s, "dim set %d: broadcast gave %d", s, bc[s]);
  }
  return MPG_OK;
}

Test(thread_async, every_group_in_flight_at_once) {
  run_ranks_ok("pp=2,dp=2,cp=2,tp=2", 16, cross_main, NULL,
               &(rr_opts){.flatten = "dp_cp=dp,cp;pp_tp=pp,tp"});
}

/* Polling with mpg_work_test alone reaches done = 1. */
static mpg_status poll_main(rr_rank *r) {
  mpg_group *g;
  RCALL(mpg_ctx_group(r->ctx, "world", &g));
  /* Stagger the ranks so some polls see the work unfinished. */
  sleep_s(0.01 * r->rank);
  double x = r->rank + 1, y = 0;
  mpg_work *w = NULL;
  RCALL(mpg_all_reduce(g, &x, &y, 1, MPG_F64, MPG_OP_MAX, NULL, &w));
  RCHECK(w != NULL, "no work handle for a group of %d", mpg_group_size(g));
  int done = 0, polls = 0;
  double t0 = now_s();
  while (!done && now_s() - t0 < 10) {
    RCALL(mpg_work_test(w, &done));
    polls++;
    if (!done) sleep_s(0.001);
  }
  RCHECK(done == 1, "not done after %d polls", polls);
  RCHECK(y == r->world, "max is %g", y);
  RCALL(mpg_work_wait(w));
  RCALL(mpg_work_wait(NULL));
  return MPG_OK;
}

Test(thread_async, test_polls_to_completion) { run_ranks("dp=2,tp=2", 4, poll_main, NULL); }

/* A rank far ahead of its peer is held back (bounded), and nothing is lost. */
static mpg_status ahead_main(rr_rank *r) {
  enum { N = 1500 };
  mpg_group *g;
  RCALL(mpg_ctx_group(r->ctx, "world", &g));
  if (r->rank == 1) sleep_s(0.2);
  mpg_work **w = calloc(N, sizeof *w);
  int32_t *in = malloc(sizeof(int32_t) * N), *out = malloc(sizeof(int32_t) * N);
  RCHECK(w && in && out, "out of memory");
  for (int i = 0; i < N; i++) {
    in[i] = i * (r->rank + 1);
    RCALL(mpg_all_reduce(g, &in[i], &out[i], 1, MPG_I32, MPG_OP_SUM, NULL, &w[i]));
  }
  for (int i = 0; i < N; i++) RCALL(mpg_work_wait(w[i]));
  for (int i = 0; i < N; i++) RCHECK(out[i] == 3 * i, "op %d gave %d", i, out[i]);
  free(w);
  free(in);
  free(out);
  return MPG_OK;
}

Test(thread_async, far_ahead_rank_is_throttled_not_lost) { run_ranks("dp=2", 2, ahead_main, NULL); }
