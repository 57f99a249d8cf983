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
 * test thread then asserts. */
#include <criterion/criterion.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "meshpg.h"
#include "../rank_check.h"
#include "../time_bound.h"

/* ------------------------------------------------------------------------ */
/* Meshes                                                                    */
/* ------------------------------------------------------------------------ */

/* A mesh from "dp=2,cp=2" and flatten items "dp_cp=dp,cp" (NULL-ended). */
static mpg_mesh *make_mesh(const char *dims, const char *const *flat) {
  mpg_spec spec = MPG_SPEC_INIT;
  cr_assert_eq(mpg_spec_init(&spec), MPG_OK);
  cr_assert_eq(mpg_spec_set_mesh(&spec, dims), MPG_OK, "%s", mpg_last_error());
  for (; flat && *flat; flat++) {
    char name[64];
    const char *eq = strchr(*flat, '=');
    cr_assert_not_null(eq);
    snprintf(name, sizeof name, "%.*s", (int)(eq - *flat), *flat);
    cr_assert_eq(mpg_spec_add_flatten(&spec, name, eq + 1), MPG_OK, "%s",
                 mpg_last_error());
  }
  mpg_mesh *m = NULL;
  mpg_status st = mpg_mesh_create(&spec, 0, &m);
  cr_assert_eq(st, MPG_OK, "mesh %s: %s", dims, mpg_last_error());
  return m;
}

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
      c->a = malloc(cnt * es + 1);
      fill(c->dt, rank, cnt, c->salt, c->a);
      c->send = c->a;
      if (c->inplace) {
        c->recv = c->a;
      } else {
        c->b = malloc(cnt * es + 1);
        memset(c->b, 0xa5, cnt * es);
        c->recv = c->b;
      }
      break;
    case K_RS:
      c->a = malloc(n * cnt * es + 1);
      fill(c->dt, rank, n * cnt, c->salt, c->a);
      c->send = c->a;
      if (c->inplace) {
        c->recv = c->a + (size_t)G->pos * cnt * es;
      } else {
        c->b = malloc(cnt * es + 1);
        memset(c->b, 0xa5, cnt * es);
        c->recv = c->b;
      }
      break;
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

static mpg_status cross_main(const mpg_init_opts *opts, void *arg) {
  const mpg_mesh *mesh = arg;
  tl_rank = opts->rank;
  mpg_ctx *ctx = NULL;
  RCALL(mpg_ctx_create(mesh, opts, &ctx));
  tl_ctx = ctx;
  int nsets = mpg_mesh_num_dimsets(mesh);
  mpg_work *w[32][3];
  int64_t in[32], out[32], gathered[32][64];
  int32_t bc[32];
  mpg_group *g[32];
  mpg_status st = MPG_OK;
  /* Post on every group before waiting for any. */
  for (int s = 0; s < nsets && !st; s++) {
    const char *name;
    mpg_mesh_dimset_info(mesh, s, &name, NULL, NULL);
    st = mpg_ctx_group(ctx, name, &g[s]);
    in[s] = (int64_t)opts->rank * 1000 + s;
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
    mpg_mesh_group_of(mesh, s, opts->rank, &index, NULL, &size);
    mpg_mesh_group_members(mesh, s, index, members);
    int64_t sum = 0;
    for (int p = 0; p < size; p++) {
      sum += (int64_t)members[p] * 1000 + s;
      RCHECK(gathered[s][p] == (int64_t)members[p] * 1000 + s, "dim set %d: gather[%d]", s, p);
    }
    RCHECK(out[s] == sum, "dim set %d: sum %lld, expected %lld", s, (long long)out[s],
           (long long)sum);
    RCHECK(bc[s] == 777 + s, "dim set %d: broadcast gave %d", s, bc[s]);
  }
  tl_ctx = NULL;
  RCALL(mpg_ctx_destroy(ctx));
  return MPG_OK;
}

Test(thread_async, every_group_in_flight_at_once) {
  const char *const fl[] = {"dp_cp=dp,cp", "pp_tp=pp,tp", NULL};
  mpg_mesh *mesh = make_mesh("pp=2,dp=2,cp=2,tp=2", fl);
  EXPECT_RUN_OK(mpg_thread_run(16, 20.0, cross_main, mesh, NULL));
  mpg_mesh_destroy(mesh);
}

/* Polling with mpg_work_test alone reaches done = 1. */
static mpg_status poll_main(const mpg_init_opts *opts, void *arg) {
  const mpg_mesh *mesh = arg;
  tl_rank = opts->rank;
  mpg_ctx *ctx = NULL;
  RCALL(mpg_ctx_create(mesh, opts, &ctx));
  tl_ctx = ctx;
  mpg_group *g;
  RCALL(mpg_ctx_group(ctx, "world", &g));
  /* Stagger the ranks so some polls see the work unfinished. */
  sleep_s(0.01 * opts->rank);
  double x = opts->rank + 1, y = 0;
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
  RCHECK(y == opts->world_size, "max is %g", y);
  RCALL(mpg_work_wait(w));
  RCALL(mpg_work_wait(NULL));
  tl_ctx = NULL;
  RCALL(mpg_ctx_destroy(ctx));
  return MPG_OK;
}

Test(thread_async, test_polls_to_completion) {
  mpg_mesh *mesh = make_mesh("dp=2,tp=2", NULL);
  EXPECT_RUN_OK(mpg_thread_run(4, 20.0, poll_main, mesh, NULL));
  mpg_mesh_destroy(mesh);
}

/* A rank far ahead of its peer is held back (bounded), and nothing is lost. */
static mpg_status ahead_main(const mpg_init_opts *opts, void *arg) {
  const mpg_mesh *mesh = arg;
  tl_rank = opts->rank;
  enum { N = 1500 };
  mpg_ctx *ctx = NULL;
  RCALL(mpg_ctx_create(mesh, opts, &ctx));
  tl_ctx = ctx;
  mpg_group *g;
  RCALL(mpg_ctx_group(ctx, "world", &g));
  if (opts->rank == 1) sleep_s(0.2);
  mpg_work **w = calloc(N, sizeof *w);
  int32_t *in = malloc(sizeof(int32_t) * N), *out = malloc(sizeof(int32_t) * N);
  RCHECK(w && in && out, "out of memory");
  for (int i = 0; i < N; i++) {
    in[i] = i * (opts->rank + 1);
    RCALL(mpg_all_reduce(g, &in[i], &out[i], 1, MPG_I32, MPG_OP_SUM, NULL, &w[i]));
  }
  for (int i = 0; i < N; i++) RCALL(mpg_work_wait(w[i]));
  for (int i = 0; i < N; i++) RCHECK(out[i] == 3 * i, "op %d gave %d", i, out[i]);
  free(w);
  free(in);
  free(out);
  tl_ctx = NULL;
  RCALL(mpg_ctx_destroy(ctx));
  return MPG_OK;
}

Test(thread_async, far_ahead_rank_is_throttled_not_lost) {
  mpg_mesh *mesh = make_mesh("dp=2", NULL);
  EXPECT_RUN_OK(mpg_thread_run(2, 20.0, ahead_main, mesh, NULL));
  mpg_mesh_destroy(mesh);
}

/* ------------------------------------------------------------------------ */
/* Point to point                                                            */
/* ------------------------------------------------------------------------ */

static mpg_status p2p_main(const mpg_init_opts *opts, void *arg) {
  const mpg_mesh *mesh = arg;
  tl_rank = opts->rank;
  mpg_ctx *ctx = NULL;
  RCALL(mpg_ctx_create(mesh, opts, &ctx));
  tl_ctx = ctx;
  mpg_group *g;
  RCALL(mpg_ctx_group(ctx, "world", &g));
  int me = mpg_group_position(g);
  if (me == 0) {
    /* Receives posted before the sends, from two peers, matched in order. */
    int64_t a[3][4];
    mpg_work *w[3];
    RCALL(mpg_recv(g, a[0], 4, MPG_I64, 1, NULL, &w[0]));
    RCALL(mpg_recv(g, a[1], 4, MPG_I64, 2, NULL, &w[1]));
    RCALL(mpg_recv(g, a[2], 4, MPG_I64, 1, NULL, &w[2]));
    RCALL(mpg_barrier(g, NULL));
    for (int k = 2; k >= 0; k--) RCALL(mpg_work_wait(w[k]));
    for (int i = 0; i < 4; i++) {
      RCHECK(a[0][i] == 100 + i, "first message from 1: [%d] = %lld", i, (long long)a[0][i]);
      RCHECK(a[1][i] == 200 + i, "message from 2: [%d] = %lld", i, (long long)a[1][i]);
      RCHECK(a[2][i] == 110 + i, "second message from 1: [%d] = %lld", i, (long long)a[2][i]);
    }
    /* Messages sent before the receive, received in order. */
    RCALL(mpg_barrier(g, NULL));
    for (int k = 0; k < 5; k++) {
      float f[2];
      RCALL(mpg_recv(g, f, 2, MPG_F32, 3, NULL, NULL));
      RCHECK(f[0] == (float)k && f[1] == -(float)k, "message %d from 3: %g %g", k, f[0], f[1]);
    }
    /* Size mismatch: the receive fails and says why. */
    int32_t small[2];
    mpg_status st = mpg_recv(g, small, 2, MPG_I32, 1, NULL, NULL);
    RCHECK(st == MPG_ERR_INVALID, "mismatched recv gave %s", mpg_status_name(st));
    RCHECK(strstr(mpg_last_error(), "bytes") != NULL, "message: %s", mpg_last_error());
  } else if (me == 1 || me == 2) {
    RCALL(mpg_barrier(g, NULL)); /* after rank 0 posted its receives */
    int64_t b[4];
    for (int i = 0; i < 4; i++) b[i] = me * 100 + i;
    RCALL(mpg_send(g, b, 4, MPG_I64, 0, NULL, NULL));
    if (me == 1) {
      for (int i = 0; i < 4; i++) b[i] = 110 + i;
      mpg_work *w = NULL;
      RCALL(mpg_send(g, b, 4, MPG_I64, 0, NULL, &w));
      RCALL(mpg_work_wait(w));
    }
    RCALL(mpg_barrier(g, NULL));
    if (me == 1) {
      int32_t big[3] = {1, 2, 3};
      RCALL(mpg_send(g, big, 3, MPG_I32, 0, NULL, NULL));
    }
  } else {
    RCALL(mpg_barrier(g, NULL));
    for (int k = 0; k < 5; k++) {
      float f[2] = {(float)k, -(float)k};
      RCALL(mpg_send(g, f, 2, MPG_F32, 0, NULL, NULL));
    }
    RCALL(mpg_barrier(g, NULL));
  }
  /* Bad peers are refused up front. */
  char buf[8];
  RCHECK(mpg_send(g, buf, 1, MPG_I32, me, NULL, NULL) == MPG_ERR_INVALID, "send to self");
  RCHECK(mpg_recv(g, buf, 1, MPG_I32, 99, NULL, NULL) == MPG_ERR_INVALID, "recv from 99");
  RCALL(mpg_barrier(g, NULL));
  tl_ctx = NULL;
  RCALL(mpg_ctx_destroy(ctx));
  return MPG_OK;
}

Test(thread_p2p, fifo_per_peer_and_errors) {
  mpg_mesh *mesh = make_mesh("dp=4", NULL);
  EXPECT_RUN_OK(mpg_thread_run(4, 20.0, p2p_main, mesh, NULL));
  mpg_mesh_destroy(mesh);
}

/* Bounded send buffering (back-pressure): with an inbox of 4 messages
 * (MESHPG_THREAD_INBOX_MSGS) or 64 bytes (MESHPG_THREAD_INBOX_BYTES), a
 * send to a full inbox waits until the receiver takes a message; if the
 * receiver takes none within the timeout it fails with MPG_ERR_TIMEOUT. */
typedef struct bp_arg {
  const mpg_mesh *mesh;
  int receive;        /* 0: rank 0 never receives (the timeout case) */
  size_t count;       /* int32 elements per message */
  int nsend;
  double blocked_s;   /* the longest of rank 1's sends */
} bp_arg;

static mpg_status bp_main(const mpg_init_opts *opts, void *arg) {
  bp_arg *a = arg;
  tl_rank = opts->rank;
  mpg_ctx *ctx = NULL;
  RCALL(mpg_ctx_create(a->mesh, opts, &ctx));
  mpg_group *g;
  RCALL(mpg_ctx_group(ctx, "world", &g));
  int32_t buf[32];
  if (opts->rank == 1) {
    for (int k = 0; k < a->nsend; k++) {
      for (size_t i = 0; i < a->count; i++) buf[i] = k * 100 + (int32_t)i;
      double t0 = now_s();
      mpg_status st = mpg_send(g, buf, a->count, MPG_I32, 0, NULL, NULL);
      if (now_s() - t0 > a->blocked_s) a->blocked_s = now_s() - t0;
      if (!a->receive && k == a->nsend - 1) {
        RCHECK(st == MPG_ERR_TIMEOUT, "send to a full inbox gave %s", mpg_status_name(st));
        RCHECK(strstr(mpg_last_error(), "inbox is full") &&
                   strstr(mpg_last_error(), "peer 0") && strstr(mpg_last_error(), "limits"),
               "message: %s", mpg_last_error());
        RCHECK(mpg_ctx_status(ctx) == MPG_ERR_TIMEOUT, "the context was not aborted");
      } else {
        RCHECK(st == MPG_OK, "send %d: %s: %s", k, mpg_status_name(st), mpg_last_error());
      }
    }
  } else if (a->receive) {
    sleep_s(0.3); /* rank 1 fills the inbox and blocks meanwhile */
    for (int k = 0; k < a->nsend; k++) {
      RCALL(mpg_recv(g, buf, a->count, MPG_I32, 1, NULL, NULL));
      for (size_t i = 0; i < a->count; i++)
        RCHECK(buf[i] == k * 100 + (int32_t)i, "message %d [%zu] = %d", k, i, buf[i]);
    }
  } else {
    /* Never receives (and makes no call that could time out first). */
    sleep_s(1.0);
  }
  RCALL(mpg_ctx_destroy(ctx));
  return MPG_OK;
}

Test(thread_p2p, full_inbox_blocks_the_sender_until_received) {
  setenv("MESHPG_THREAD_INBOX_MSGS", "4", 1);
  mpg_mesh *mesh = make_mesh("dp=2", NULL);
  bp_arg a = {mesh, 1, 2, 6, 0};
  EXPECT_RUN_OK(mpg_thread_run(2, 20.0, bp_main, &a, NULL));
  cr_expect_gt(a.blocked_s, 0.1, "the longest send took %.3f s: the 5th should wait for room",
               a.blocked_s);
  mpg_mesh_destroy(mesh);
}

Test(thread_p2p, inbox_byte_limit_blocks_but_takes_one_large_message) {
  setenv("MESHPG_THREAD_INBOX_BYTES", "64", 1);
  mpg_mesh *mesh = make_mesh("dp=2", NULL);
  bp_arg a = {mesh, 1, 25, 2, 0}; /* 100-byte messages: one fits an empty inbox */
  EXPECT_RUN_OK(mpg_thread_run(2, 20.0, bp_main, &a, NULL));
  cr_expect_gt(a.blocked_s, 0.1, "the 2nd send took %.3f s", a.blocked_s);
  mpg_mesh_destroy(mesh);
}

Test(thread_p2p, full_inbox_times_out_with_a_precise_error) {
  setenv("MESHPG_THREAD_INBOX_MSGS", "4", 1);
  mpg_mesh *mesh = make_mesh("dp=2", NULL);
  bp_arg a = {mesh, 0, 2, 5, 0};
  EXPECT_RUN_OK(mpg_thread_run(2, 0.5, bp_main, &a, NULL));
  cr_expect_geq(a.blocked_s, 0.4, "the send gave up after %.3f s", a.blocked_s);
  mpg_mesh_destroy(mesh);
}

/* ------------------------------------------------------------------------ */
/* Mismatched calls                                                          */
/* ------------------------------------------------------------------------ */

static mpg_status mismatch_main(const mpg_init_opts *opts, void *arg) {
  const mpg_mesh *mesh = arg;
  tl_rank = opts->rank;
  mpg_ctx *ctx = NULL;
  RCALL(mpg_ctx_create(mesh, opts, &ctx));
  mpg_group *g;
  RCALL(mpg_ctx_group(ctx, "world", &g));
  float in[5] = {1, 2, 3, 4, 5}, out[5];
  size_t count = opts->rank == 2 ? 4 : 5;
  mpg_status st = mpg_all_reduce(g, in, out, count, MPG_F32, MPG_OP_SUM, NULL, NULL);
  RCHECK(st == MPG_ERR_INVALID, "mismatched all_reduce gave %s", mpg_status_name(st));
  RCHECK(strstr(mpg_last_error(), "does not match") && strstr(mpg_last_error(), "count 4") &&
             strstr(mpg_last_error(), "rank 2"),
         "message: %s", mpg_last_error());
  /* A kind mismatch too: the group still works afterwards. */
  if (opts->rank == 0)
    st = mpg_barrier(g, NULL);
  else
    st = mpg_broadcast(g, in, 5, MPG_F32, 0, NULL, NULL);
  RCHECK(st == MPG_ERR_INVALID, "barrier vs broadcast gave %s", mpg_status_name(st));
  RCHECK(strstr(mpg_last_error(), "barrier") && strstr(mpg_last_error(), "broadcast"),
         "message: %s", mpg_last_error());
  /* The issue-order checker sees them too, on every rank (between ranks 0
   * and 1: the barrier against the broadcast). */
  st = mpg_ctx_check_order(ctx);
  RCHECK(st == MPG_ERR_STATE && strstr(mpg_last_error(), "rank 0 issued barrier on") &&
             strstr(mpg_last_error(), "rank 1 issued broadcast(f32, count 5)"),
         "check_order gave %s: %s", mpg_status_name(st), mpg_last_error());
  RCALL(mpg_all_reduce(g, in, out, 5, MPG_F32, MPG_OP_SUM, NULL, NULL));
  RCHECK(out[4] == 5.0f * 4, "sum after the mismatch: %g", out[4]);
  RCALL(mpg_ctx_destroy(ctx));
  return MPG_OK;
}

Test(thread_errors, mismatched_collectives_fail_everywhere) {
  setenv("MESHPG_CHECK_ORDER", "1", 1);
  mpg_mesh *mesh = make_mesh("dp=4", NULL);
  EXPECT_RUN_OK(mpg_thread_run(4, 20.0, mismatch_main, mesh, NULL));
  mpg_mesh_destroy(mesh);
}

/* ------------------------------------------------------------------------ */
/* Timeouts and abort                                                        */
/* ------------------------------------------------------------------------ */

#define TIMEOUT_S 0.5

typedef struct timeout_arg {
  const mpg_mesh *mesh;
  int skipper;
  int async;
  const char *group;
  double elapsed[64];
  mpg_status got[64];
  mpg_status later[64];
  char msg[64][256];
} timeout_arg;

static mpg_status timeout_main(const mpg_init_opts *opts, void *arg) {
  timeout_arg *ta = arg;
  int r = opts->rank;
  tl_rank = r;
  mpg_ctx *ctx = NULL;
  RCALL(mpg_ctx_create(ta->mesh, opts, &ctx));
  mpg_group *g;
  RCALL(mpg_ctx_group(ctx, ta->group, &g));
  double x = 1, y = 0;
  if (r != ta->skipper) {
    double t0 = now_s();
    mpg_status st;
    if (ta->async) {
      mpg_work *w = NULL;
      st = mpg_all_reduce(g, &x, &y, 1, MPG_F64, MPG_OP_SUM, NULL, &w);
      if (!st) st = mpg_work_wait(w);
    } else {
      st = mpg_all_reduce(g, &x, &y, 1, MPG_F64, MPG_OP_SUM, NULL, NULL);
    }
    ta->elapsed[r] = now_s() - t0;
    ta->got[r] = st;
    snprintf(ta->msg[r], sizeof ta->msg[r], "%s", mpg_last_error());
    /* The context is aborted now: later calls fail at once. */
    ta->later[r] = mpg_barrier(g, NULL);
  }
  /* The skipper leaves without joining (destroy never blocks). */
  mpg_status st = mpg_ctx_destroy(ctx);
  (void)st;
  return MPG_OK;
}

static void run_timeout(const char *dims, int world, const char *group, int skipper,
                        int async) {
  /* The skipper breaks the rule the issue-order checker checks: its
   * destroy would enter the check over the world while the others still
   * wait in their world all-reduce (same communicator). */
  setenv("MESHPG_CHECK_ORDER", "0", 1);
  mpg_mesh *mesh = make_mesh(dims, NULL);
  timeout_arg *ta = calloc(1, sizeof *ta);
  ta->mesh = mesh;
  ta->skipper = skipper;
  ta->async = async;
  ta->group = group;
  double t0 = now_s();
  EXPECT_RUN_OK(mpg_thread_run(world, TIMEOUT_S, timeout_main, ta, NULL));
  double total = now_s() - t0;
  int dimset, index, size;
  cr_assert_eq(mpg_mesh_dimset_find(mesh, group, &dimset), MPG_OK);
  cr_assert_eq(mpg_mesh_group_of(mesh, dimset, skipper, &index, NULL, &size), MPG_OK);
  int members[64];
  mpg_mesh_group_members(mesh, dimset, index, members);
  for (int p = 0; p < size; p++) {
    int r = members[p];
    if (r == skipper) continue;
    cr_assert_eq(ta->got[r], MPG_ERR_TIMEOUT, "rank %d got %s (%s)", r,
                 mpg_status_name(ta->got[r]), ta->msg[r]);
    cr_assert(ta->elapsed[r] < tb_bound(TIMEOUT_S + 1.0, world), "rank %d waited %.3f s", r,
              ta->elapsed[r]);
    cr_assert(ta->elapsed[r] > TIMEOUT_S * 0.5, "rank %d gave up after only %.3f s", r,
              ta->elapsed[r]);
    cr_assert(strstr(ta->msg[r], "time") != NULL, "rank %d message: %s", r, ta->msg[r]);
    cr_assert(ta->later[r] == MPG_ERR_ABORTED || ta->later[r] == MPG_ERR_TIMEOUT,
              "rank %d: a collective after the timeout gave %s", r,
              mpg_status_name(ta->later[r]));
  }
  cr_assert(total < tb_bound(TIMEOUT_S + 5.0, world), "the whole run took %.3f s", total);
  free(ta);
  mpg_mesh_destroy(mesh);
}

Test(thread_timeout, skipped_world_all_reduce) {
  run_timeout("dp=2,tp=2", 4, "world", 3, 0);
}

Test(thread_timeout, skipped_async_all_reduce) {
  run_timeout("dp=2,tp=2", 4, "world", 1, 1);
}

Test(thread_timeout, skipped_all_reduce_in_a_subgroup) {
  run_timeout("dp=4,tp=4", 16, "dp", 6, 0);
}

/* mpg_ctx_set_timeout: a context made with a long timeout (start-up) that
 * is then shortened for the steps gives up on a missing peer after the new
 * timeout, on a group created before the change and on one created after;
 * bad values are refused. */
typedef struct settime_arg {
  const mpg_mesh *mesh;
  double elapsed[2][8];
  mpg_status got[2][8], bad[8];
} settime_arg;

static mpg_status settime_main(const mpg_init_opts *opts, void *arg) {
  settime_arg *sa = arg;
  int r = opts->rank;
  mpg_init_opts o = *opts;
  o.backend.timeout_s = 120; /* start-up */
  o.backend.lazy_groups = 1;
  mpg_ctx *ctx = NULL;
  RCALL(mpg_ctx_create(sa->mesh, &o, &ctx));
  mpg_group *dp = NULL, *tp = NULL;
  RCALL(mpg_ctx_group(ctx, "dp", &dp)); /* created under 120 s */
  sa->bad[r] = mpg_ctx_set_timeout(ctx, 0);
  if (sa->bad[r] == MPG_ERR_INVALID) sa->bad[r] = mpg_ctx_set_timeout(ctx, -1);
  if (sa->bad[r] == MPG_ERR_INVALID) sa->bad[r] = mpg_ctx_set_timeout(NULL, 1);
  RCALL(mpg_ctx_set_timeout(ctx, TIMEOUT_S));
  RCALL(mpg_ctx_group(ctx, "tp", &tp)); /* created after the change */
  /* Rank 3 skips one all-reduce on each: its dp peer (rank 1) and its tp
   * peer (rank 2) give up after TIMEOUT_S, not 120 s. */
  mpg_group *gs[2] = {dp, tp};
  for (int k = 0; k < 2; k++) {
    if (r == 3) break;
    double x = 1, y = 0, t0 = now_s();
    sa->got[k][r] = mpg_all_reduce(gs[k], &x, &y, 1, MPG_F64, MPG_OP_SUM, NULL, NULL);
    sa->elapsed[k][r] = now_s() - t0;
    if (sa->got[k][r] != MPG_OK) break; /* the context is aborted now */
  }
  mpg_ctx_destroy(ctx);
  return MPG_OK;
}

Test(thread_timeout, set_timeout_shortens_later_operations) {
  setenv("MESHPG_CHECK_ORDER", "0", 1); /* see run_timeout */
  mpg_mesh *mesh = make_mesh("dp=2,tp=2", NULL);
  settime_arg *sa = calloc(1, sizeof *sa);
  sa->mesh = mesh;
  EXPECT_RUN_OK(mpg_thread_run(4, 120, settime_main, sa, NULL));
  for (int r = 0; r < 4; r++)
    cr_assert_eq(sa->bad[r], MPG_ERR_INVALID, "rank %d: a bad timeout gave %s", r,
                 mpg_status_name(sa->bad[r]));
  /* mesh dp=2,tp=2: rank 3's dp peer is rank 1, its tp peer rank 2.  Rank 1
   * times out on dp; rank 2 passes dp (with rank 0) and times out on tp. */
  cr_assert_eq(sa->got[0][1], MPG_ERR_TIMEOUT, "rank 1 on dp: %s",
               mpg_status_name(sa->got[0][1]));
  cr_assert_eq(sa->got[0][2], MPG_OK, "rank 2 on dp: %s", mpg_status_name(sa->got[0][2]));
  cr_assert_eq(sa->got[1][2], MPG_ERR_TIMEOUT, "rank 2 on tp: %s",
               mpg_status_name(sa->got[1][2]));
  double waited[2] = {sa->elapsed[0][1], sa->elapsed[1][2]};
  for (int k = 0; k < 2; k++) {
    cr_assert(waited[k] < tb_bound(TIMEOUT_S + 1.0, 4), "%s: gave up after %.3f s, not "
              "the new %.1f s", k ? "tp (created after)" : "dp (created before)", waited[k],
              TIMEOUT_S);
    cr_assert(waited[k] > TIMEOUT_S * 0.5, "gave up after only %.3f s", waited[k]);
  }
  free(sa);
  mpg_mesh_destroy(mesh);
}

/* The message of a rank that gave up on its own names the missing rank. */
Test(thread_timeout, message_names_the_missing_rank) {
  setenv("MESHPG_CHECK_ORDER", "0", 1); /* see run_timeout */
  mpg_mesh *mesh = make_mesh("dp=2", NULL);
  timeout_arg *ta = calloc(1, sizeof *ta);
  ta->mesh = mesh;
  ta->skipper = 1;
  ta->group = "world";
  EXPECT_RUN_OK(mpg_thread_run(2, TIMEOUT_S, timeout_main, ta, NULL));
  cr_assert_eq(ta->got[0], MPG_ERR_TIMEOUT);
  cr_assert(strstr(ta->msg[0], "rank 1") != NULL && strstr(ta->msg[0], "all_reduce") != NULL,
            "message: %s", ta->msg[0]);
  free(ta);
  mpg_mesh_destroy(mesh);
}

/* One rank never creates its context: the others give up in time. */
static mpg_status absent_main(const mpg_init_opts *opts, void *arg) {
  timeout_arg *ta = arg;
  if (opts->rank == ta->skipper) return MPG_OK;
  mpg_ctx *ctx = NULL;
  double t0 = now_s();
  ta->got[opts->rank] = mpg_ctx_create(ta->mesh, opts, &ctx);
  ta->elapsed[opts->rank] = now_s() - t0;
  snprintf(ta->msg[opts->rank], sizeof ta->msg[0], "%s", mpg_last_error());
  mpg_ctx_destroy(ctx);
  return MPG_OK;
}

Test(thread_timeout, absent_rank_at_context_creation) {
  mpg_mesh *mesh = make_mesh("dp=2,tp=4", NULL);
  timeout_arg *ta = calloc(1, sizeof *ta);
  ta->mesh = mesh;
  ta->skipper = 5;
  EXPECT_RUN_OK(mpg_thread_run(8, TIMEOUT_S, absent_main, ta, NULL));
  for (int r = 0; r < 8; r++) {
    if (r == 5) continue;
    cr_assert_eq(ta->got[r], MPG_ERR_TIMEOUT, "rank %d: %s (%s)", r,
                 mpg_status_name(ta->got[r]), ta->msg[r]);
    cr_assert(ta->elapsed[r] < tb_bound(TIMEOUT_S + 1.0, 8), "rank %d waited %.3f s", r,
              ta->elapsed[r]);
    cr_assert(strstr(ta->msg[r], "world") != NULL, "rank %d: %s", r, ta->msg[r]);
  }
  free(ta);
  mpg_mesh_destroy(mesh);
}

/* mpg_ctx_abort wakes the waiting peers long before the timeout. */
static mpg_status abort_main(const mpg_init_opts *opts, void *arg) {
  timeout_arg *ta = arg;
  int r = opts->rank;
  mpg_ctx *ctx = NULL;
  tl_rank = r;
  RCALL(mpg_ctx_create(ta->mesh, opts, &ctx));
  mpg_group *g;
  RCALL(mpg_ctx_group(ctx, "world", &g));
  if (r == 0) {
    sleep_s(0.2);
    RCALL(mpg_ctx_abort(ctx));
    float x = 0;
    ta->later[r] = mpg_all_reduce(g, &x, &x, 1, MPG_F32, MPG_OP_SUM, NULL, NULL);
  } else {
    float x = 1, y = 0;
    double t0 = now_s();
    ta->got[r] = mpg_all_reduce(g, &x, &y, 1, MPG_F32, MPG_OP_SUM, NULL, NULL);
    ta->elapsed[r] = now_s() - t0;
    snprintf(ta->msg[r], sizeof ta->msg[0], "%s", mpg_last_error());
  }
  mpg_ctx_destroy(ctx);
  return MPG_OK;
}

Test(thread_timeout, abort_wakes_waiters) {
  mpg_mesh *mesh = make_mesh("dp=4", NULL);
  timeout_arg *ta = calloc(1, sizeof *ta);
  ta->mesh = mesh;
  EXPECT_RUN_OK(mpg_thread_run(4, 10.0, abort_main, ta, NULL));
  cr_assert_eq(ta->later[0], MPG_ERR_ABORTED, "after abort: %s", mpg_status_name(ta->later[0]));
  for (int r = 1; r < 4; r++) {
    cr_assert_eq(ta->got[r], MPG_ERR_ABORTED, "rank %d: %s (%s)", r,
                 mpg_status_name(ta->got[r]), ta->msg[r]);
    /* Woken by the abort at 0.2 s, not by the 10 s timeout: the abort's
     * time plus the promise's 1 s and the scheduler's allowance. */
    cr_assert(ta->elapsed[r] < tb_bound(0.2 + 1.0, 4), "rank %d waited %.3f s (bound %.3f s)",
              r, ta->elapsed[r], tb_bound(0.2 + 1.0, 4));
    cr_assert(strstr(ta->msg[r], "aborted by rank 0") != NULL, "rank %d: %s", r, ta->msg[r]);
  }
  free(ta);
  mpg_mesh_destroy(mesh);
}

/* ------------------------------------------------------------------------ */
/* Contexts one after the other and side by side                             */
/* ------------------------------------------------------------------------ */

static mpg_status two_ctx_main(const mpg_init_opts *opts, void *arg) {
  const mpg_mesh *mesh = arg;
  tl_rank = opts->rank;
  for (int round = 0; round < 2; round++) {
    mpg_ctx *a = NULL, *b = NULL;
    RCALL(mpg_ctx_create(mesh, opts, &a));
    RCALL(mpg_ctx_create(mesh, opts, &b));
    mpg_group *ga, *gb;
    RCALL(mpg_ctx_group(a, "tp", &ga));
    RCALL(mpg_ctx_group(b, "tp", &gb));
    int32_t x = opts->rank, sa = 0, sb = 0;
    mpg_work *wa, *wb;
    /* b first on purpose: each context matches its own calls. */
    RCALL(mpg_all_reduce(gb, &x, &sb, 1, MPG_I32, MPG_OP_MAX, NULL, &wb));
    RCALL(mpg_all_reduce(ga, &x, &sa, 1, MPG_I32, MPG_OP_MIN, NULL, &wa));
    RCALL(mpg_work_wait(wa));
    RCALL(mpg_work_wait(wb));
    int m0, m1;
    RCALL(mpg_group_member(ga, 0, &m0));
    RCALL(mpg_group_member(ga, 1, &m1));
    RCHECK(sa == m0 && sb == m1, "round %d: min %d max %d, members %d %d", round, sa, sb, m0, m1);
    RCALL(mpg_ctx_destroy(b));
    RCALL(mpg_ctx_destroy(a));
  }
  return MPG_OK;
}

Test(thread_ctx, contexts_in_sequence_and_side_by_side) {
  mpg_mesh *mesh = make_mesh("dp=2,tp=2", NULL);
  EXPECT_RUN_OK(mpg_thread_run(4, 20.0, two_ctx_main, mesh, NULL));
  mpg_mesh_destroy(mesh);
}

/* ------------------------------------------------------------------------ */
/* A 1024-rank world                                                         */
/* ------------------------------------------------------------------------ */

typedef struct big_arg {
  const mpg_mesh *mesh;
  double t_create[1024], t_reduce[1024];
} big_arg;

static mpg_status big_main(const mpg_init_opts *opts, void *arg) {
  big_arg *ba = arg;
  tl_rank = opts->rank;
  mpg_ctx *ctx = NULL;
  double t0 = now_s();
  RCALL(mpg_ctx_create(ba->mesh, opts, &ctx));
  tl_ctx = ctx;
  double t1 = now_s();
  mpg_group *world, *tp;
  RCALL(mpg_ctx_group(ctx, "world", &world));
  RCALL(mpg_ctx_group(ctx, "tp", &tp));
  int64_t x[2] = {opts->rank, 1}, s[2];
  RCALL(mpg_all_reduce(world, x, s, 2, MPG_I64, MPG_OP_SUM, NULL, NULL));
  double t2 = now_s();
  RCHECK(s[0] == 1023LL * 1024 / 2 && s[1] == 1024, "world sum %lld %lld", (long long)s[0],
         (long long)s[1]);
  float f = 1.0f, avg = 0;
  RCALL(mpg_all_reduce(tp, &f, &avg, 1, MPG_F32, MPG_OP_AVG, NULL, NULL));
  RCHECK(avg == 1.0f, "tp avg %g", avg);
  int32_t me = opts->rank, first = -1;
  RCALL(mpg_broadcast(tp, mpg_group_position(tp) == 0 ? &me : &first, 1, MPG_I32, 0, NULL, NULL));
  int m0;
  RCALL(mpg_group_member(tp, 0, &m0));
  RCHECK(mpg_group_position(tp) == 0 || first == m0, "tp broadcast gave %d, expected %d", first, m0);
  ba->t_create[opts->rank] = t1 - t0;
  ba->t_reduce[opts->rank] = t2 - t1;
  tl_ctx = NULL;
  RCALL(mpg_ctx_destroy(ctx));
  return MPG_OK;
}

Test(thread_scale, world_of_1024_ranks, .timeout = 120) {
  mpg_mesh *mesh = make_mesh("dp=32,tp=32", NULL);
  big_arg *ba = calloc(1, sizeof *ba);
  ba->mesh = mesh;
  double t0 = now_s();
  EXPECT_RUN_OK(mpg_thread_run(1024, 60.0, big_main, ba, NULL));
  double t = now_s() - t0;
  double cmax = 0, rmax = 0;
  for (int r = 0; r < 1024; r++) {
    if (ba->t_create[r] > cmax) cmax = ba->t_create[r];
    if (ba->t_reduce[r] > rmax) rmax = ba->t_reduce[r];
  }
  fprintf(stderr, "thread 1024 ranks: run %.2f s, ctx_create (world + 2 splits) max %.3f s, "
          "world all_reduce max %.3f s\n", t, cmax, rmax);
  cr_assert(t < 30.0, "1024 ranks took %.2f s", t);
  free(ba);
  mpg_mesh_destroy(mesh);
}

/* The largest world mpg_thread_run accepts. */
static mpg_status huge_main(const mpg_init_opts *opts, void *arg) {
  const mpg_mesh *mesh = arg;
  tl_rank = opts->rank;
  mpg_ctx *ctx = NULL;
  RCALL(mpg_ctx_create(mesh, opts, &ctx));
  tl_ctx = ctx;
  mpg_group *world, *dp;
  RCALL(mpg_ctx_group(ctx, "world", &world));
  RCALL(mpg_ctx_group(ctx, "dp", &dp));
  int64_t x = opts->rank, s = 0, mx = 0;
  RCALL(mpg_all_reduce(world, &x, &s, 1, MPG_I64, MPG_OP_SUM, NULL, NULL));
  RCHECK(s == 4095LL * 4096 / 2, "world sum %lld", (long long)s);
  RCALL(mpg_all_reduce(dp, &x, &mx, 1, MPG_I64, MPG_OP_MAX, NULL, NULL));
  int last;
  RCALL(mpg_group_member(dp, mpg_group_size(dp) - 1, &last));
  RCHECK(mx == last, "dp max %lld, expected %d", (long long)mx, last);
  tl_ctx = NULL;
  RCALL(mpg_ctx_destroy(ctx));
  return MPG_OK;
}

Test(thread_scale, world_of_4096_ranks, .timeout = 120) {
  mpg_mesh *mesh = make_mesh("dp=64,tp=64", NULL);
  double t0 = now_s();
  EXPECT_RUN_OK(mpg_thread_run(4096, 60.0, huge_main, mesh, NULL));
  double t = now_s() - t0;
  fprintf(stderr, "thread 4096 ranks: %.2f s\n", t);
  cr_assert(t < 30.0, "4096 ranks took %.2f s", t);
  mpg_mesh_destroy(mesh);
}

/* A world of one rank: every group has size 1. */
static mpg_status single_main(const mpg_init_opts *opts, void *arg) {
  const mpg_mesh *mesh = arg;
  tl_rank = opts->rank;
  mpg_ctx *ctx = NULL;
  RCALL(mpg_ctx_create(mesh, opts, &ctx));
  mpg_group *g;
  RCALL(mpg_ctx_group(ctx, "world", &g));
  RCHECK(mpg_group_size(g) == 1 && mpg_group_position(g) == 0, "world of one");
  double x[3] = {1, 2, 3}, y[3] = {0};
  RCALL(mpg_all_reduce_scaled(g, x, y, 3, MPG_F64, 0.5, NULL, NULL));
  RCHECK(y[0] == 0.5 && y[2] == 1.5, "scaled: %g %g", y[0], y[2]);
  RCALL(mpg_barrier(g, NULL));
  RCALL(mpg_ctx_destroy(ctx));
  return MPG_OK;
}

Test(thread_scale, world_of_one_rank) {
  mpg_mesh *mesh = make_mesh("dp=1,tp=1", NULL);
  EXPECT_RUN_OK(mpg_thread_run(1, 5.0, single_main, mesh, NULL));
  mpg_mesh_destroy(mesh);
}

/* Lazy groups: each is split off the world on first use. */
static mpg_status lazy_main(const mpg_init_opts *opts, void *arg) {
  const mpg_mesh *mesh = arg;
  tl_rank = opts->rank;
  mpg_init_opts o = *opts;
  o.backend.lazy_groups = 1;
  mpg_ctx *ctx = NULL;
  RCALL(mpg_ctx_create(mesh, &o, &ctx));
  tl_ctx = ctx;
  const char *names[] = {"tp", "dp_cp", "cp", "dp", "world"};
  for (int i = 0; i < 5; i++) {
    mpg_group *g;
    RCALL(mpg_ctx_group(ctx, names[i], &g));
    int32_t one = 1, n = 0;
    RCALL(mpg_all_reduce(g, &one, &n, 1, MPG_I32, MPG_OP_SUM, NULL, NULL));
    RCHECK(n == mpg_group_size(g), "%s: %d members counted, size %d", names[i], n,
           mpg_group_size(g));
  }
  tl_ctx = NULL;
  RCALL(mpg_ctx_destroy(ctx));
  return MPG_OK;
}

Test(thread_ctx, lazy_groups) {
  const char *const fl[] = {"dp_cp=dp,cp", NULL};
  mpg_mesh *mesh = make_mesh("dp=2,cp=2,tp=3", fl);
  EXPECT_RUN_OK(mpg_thread_run(12, 20.0, lazy_main, mesh, NULL));
  mpg_mesh_destroy(mesh);
}

/* ------------------------------------------------------------------------ */
/* mpg_thread_run and initialisation errors                                  */
/* ------------------------------------------------------------------------ */

static mpg_status ok_main(const mpg_init_opts *opts, void *arg) {
  (void)arg;
  return opts->backend.name == MPG_BACKEND_THREAD && opts->thread_world ? MPG_OK : MPG_ERR_STATE;
}

Test(thread_run, bad_arguments) {
  cr_assert_eq(mpg_thread_run(0, 1.0, ok_main, NULL, NULL), MPG_ERR_INVALID);
  cr_assert(strstr(mpg_last_error(), "nranks") != NULL, "%s", mpg_last_error());
  cr_assert_eq(mpg_thread_run(4097, 1.0, ok_main, NULL, NULL), MPG_ERR_INVALID);
  cr_assert(strstr(mpg_last_error(), "4097") != NULL, "%s", mpg_last_error());
  cr_assert_eq(mpg_thread_run(2, 0.0, ok_main, NULL, NULL), MPG_ERR_INVALID);
  cr_assert(strstr(mpg_last_error(), "timeout") != NULL, "%s", mpg_last_error());
  cr_assert_eq(mpg_thread_run(2, 1.0, NULL, NULL, NULL), MPG_ERR_INVALID);
  cr_assert(strstr(mpg_last_error(), "main") != NULL, "%s", mpg_last_error());
}

typedef struct opts_arg {
  mpg_init_opts seen[8];
} opts_arg;

static mpg_status record_opts(const mpg_init_opts *opts, void *arg) {
  opts_arg *oa = arg;
  oa->seen[opts->rank] = *opts;
  return MPG_OK;
}

Test(thread_run, each_rank_gets_its_options) {
  opts_arg oa;
  memset(&oa, 0, sizeof oa);
  mpg_status st[8];
  cr_assert_eq(mpg_thread_run(8, 2.5, record_opts, &oa, st), MPG_OK, "%s", mpg_last_error());
  for (int r = 0; r < 8; r++) {
    const mpg_init_opts *o = &oa.seen[r];
    cr_assert_eq(st[r], MPG_OK);
    cr_assert_eq(o->magic, MPG_INIT_OPTS_MAGIC);
    cr_assert_eq(o->size, sizeof(mpg_init_opts));
    cr_assert_eq(o->backend.name, MPG_BACKEND_THREAD);
    cr_assert_eq(o->rank, r);
    cr_assert_eq(o->world_size, 8);
    cr_assert_eq(o->local_rank, r);
    cr_assert_eq(o->local_world_size, 8);
    cr_assert(o->backend.timeout_s == 2.5);
    cr_assert_not_null(o->thread_world);
    cr_assert_eq(o->thread_world, oa.seen[0].thread_world);
  }
}

static mpg_status fail_on_2(const mpg_init_opts *opts, void *arg) {
  const mpg_mesh *mesh = arg;
  if (opts->rank != 2) return MPG_OK;
  int s;
  return mpg_mesh_dimset_find(mesh, "nosuchdim", &s);
}

Test(thread_run, first_failure_and_its_message_reach_the_caller) {
  mpg_mesh *mesh = make_mesh("dp=4", NULL);
  mpg_status st[4];
  mpg_status got = mpg_thread_run(4, 1.0, fail_on_2, mesh, st);
  cr_assert_eq(got, MPG_ERR_NOT_FOUND, "%s", mpg_status_name(got));
  cr_assert(strstr(mpg_last_error(), "nosuchdim") != NULL, "message: %s", mpg_last_error());
  for (int r = 0; r < 4; r++)
    cr_assert_eq(st[r], r == 2 ? MPG_ERR_NOT_FOUND : MPG_OK, "rank %d", r);
  mpg_mesh_destroy(mesh);
}

typedef struct init_arg {
  const mpg_mesh *mesh;
  int mode;
  mpg_status got[8];
  char msg[8][256];
} init_arg;

static mpg_status init_err_main(const mpg_init_opts *opts, void *arg) {
  init_arg *ia = arg;
  mpg_init_opts o = *opts;
  if (ia->mode == 1) o.world_size = 8; /* claims the mesh's size, not the world's */
  if (ia->mode == 2) o.thread_world = NULL;
  mpg_ctx *const sentinel = (mpg_ctx *)(uintptr_t)0x10;
  mpg_ctx *ctx = sentinel; /* must be reset to NULL */
  ia->got[opts->rank] = mpg_ctx_create(ia->mesh, &o, &ctx);
  snprintf(ia->msg[opts->rank], sizeof ia->msg[0], "%s", mpg_last_error());
  if (ctx == sentinel) return MPG_ERR_STATE;
  if (ctx) {
    mpg_ctx_destroy(ctx);
    return MPG_ERR_STATE;
  }
  return MPG_OK;
}

static void run_init_err(int mode, int nranks, const char *want_sub) {
  mpg_mesh *mesh = make_mesh("dp=2,tp=4", NULL); /* 8 ranks */
  init_arg *ia = calloc(1, sizeof *ia);
  ia->mesh = mesh;
  ia->mode = mode;
  EXPECT_RUN_OK(mpg_thread_run(nranks, 1.0, init_err_main, ia, NULL));
  for (int r = 0; r < nranks; r++) {
    cr_assert(ia->got[r] == MPG_ERR_INVALID || ia->got[r] == MPG_ERR_ENV,
              "mode %d rank %d: %s (%s)", mode, r, mpg_status_name(ia->got[r]), ia->msg[r]);
    cr_assert(strstr(ia->msg[r], want_sub) != NULL, "mode %d rank %d: message \"%s\" lacks \"%s\"",
              mode, r, ia->msg[r], want_sub);
  }
  free(ia);
  mpg_mesh_destroy(mesh);
}

Test(thread_init, world_smaller_than_the_mesh) { run_init_err(0, 4, "8"); }
Test(thread_init, options_disagree_with_the_thread_world) { run_init_err(1, 4, "4"); }
Test(thread_init, no_thread_world) { run_init_err(2, 8, "thread"); }

/* mpg_ctx_status: healthy until an abort, then the reason, and collectives
 * fail at once with MPG_ERR_ABORTED. */
static mpg_status status_main(const mpg_init_opts *opts, void *arg) {
  (void)arg;
  mpg_spec spec = MPG_SPEC_INIT;
  mpg_spec_init(&spec);
  mpg_spec_set_mesh(&spec, "dp=2");
  mpg_mesh *mesh = NULL;
  mpg_status st = mpg_mesh_create(&spec, 2, &mesh);
  mpg_ctx *ctx = NULL;
  if (!st) st = mpg_ctx_create(mesh, opts, &ctx);
  if (!st && mpg_ctx_status(ctx) != MPG_OK) st = MPG_ERR_STATE;
  if (!st && mpg_ctx_abort(ctx) != MPG_OK) st = MPG_ERR_STATE;
  if (!st && mpg_ctx_status(ctx) != MPG_ERR_ABORTED) st = MPG_ERR_STATE;
  mpg_group *g = NULL;
  int x = 1;
  if (!st) st = mpg_ctx_group(ctx, "dp", &g);
  if (!st && mpg_all_reduce(g, &x, &x, 1, MPG_I32, MPG_OP_SUM, NULL, NULL) != MPG_ERR_ABORTED)
    st = MPG_ERR_STATE;
  mpg_ctx_destroy(ctx);
  mpg_mesh_destroy(mesh);
  return st;
}

Test(thread_misc, ctx_status_after_abort) {
  mpg_status st = mpg_thread_run(2, 5.0, status_main, NULL, NULL);
  cr_assert_eq(st, MPG_OK, "%s: %s", mpg_status_name(st), mpg_last_error());
}

/* ------------------------------------------------------------------------ */
/* Partial data-parallel groups (mpg_ctx_group_partial)                      */
/* ------------------------------------------------------------------------ */

/* The members of this rank's intra and inter groups, as Megatron's
 * create_hierarchical_groups lays them out over the members of the group of
 * `set` (written here from its einops pattern "(l s u) -> (l u) s": level 0
 * takes s = c consecutive members, level 1 takes every c-th), checked
 * against the library's groups, and an all-reduce over each. */
typedef struct partial_arg {
  const mpg_mesh *mesh;
  const char *set;
  int instances;
} partial_arg;

static mpg_status partial_main(const mpg_init_opts *opts, void *arg) {
  partial_arg *pa = arg;
  int r = opts->rank;
  tl_rank = r;
  mpg_ctx *ctx = NULL;
  RCALL(mpg_ctx_create(pa->mesh, opts, &ctx));
  tl_ctx = ctx;
  int ds, gi, pos, size;
  RCALL(mpg_mesh_dimset_find(pa->mesh, pa->set, &ds));
  RCALL(mpg_mesh_group_of(pa->mesh, ds, r, &gi, &pos, &size));
  int *all = malloc(sizeof(int) * (size_t)size);
  RCHECK(all != NULL, "out of memory");
  RCALL(mpg_mesh_group_members(pa->mesh, ds, gi, all));
  int n = pa->instances, c = size / n;
  mpg_group *intra = NULL, *inter = NULL, *again = NULL;
  RCALL(mpg_ctx_group_partial(ctx, pa->set, n, MPG_PARTIAL_INTRA, &intra));
  RCALL(mpg_ctx_group_partial(ctx, pa->set, n, MPG_PARTIAL_INTER, &inter));
  RCALL(mpg_ctx_group_partial(ctx, pa->set, n, MPG_PARTIAL_INTRA, &again));
  RCHECK(again == intra, "the intra group was not cached");
  RCHECK(mpg_group_size(intra) == c && mpg_group_size(inter) == n,
         "sizes %d and %d, expected %d and %d", mpg_group_size(intra),
         mpg_group_size(inter), c, n);
  RCHECK(mpg_group_position(intra) == pos % c && mpg_group_position(inter) == pos / c,
         "positions %d and %d in %s (position %d, c %d)", mpg_group_position(intra),
         mpg_group_position(inter), pa->set, pos, c);
  long want_intra = 0, want_inter = 0;
  for (int p = 0; p < c; p++) {
    int m;
    RCALL(mpg_group_member(intra, p, &m));
    RCHECK(m == all[pos / c * c + p], "intra member %d is rank %d, expected %d", p, m,
           all[pos / c * c + p]);
    want_intra += m;
  }
  for (int p = 0; p < n; p++) {
    int m;
    RCALL(mpg_group_member(inter, p, &m));
    RCHECK(m == all[pos % c + p * c], "inter member %d is rank %d, expected %d", p, m,
           all[pos % c + p * c]);
    want_inter += m;
  }
  /* The communicators hold exactly those members. */
  int64_t x = r, s1 = 0, s2 = 0;
  RCALL(mpg_all_reduce(intra, &x, &s1, 1, MPG_I64, MPG_OP_SUM, NULL, NULL));
  RCALL(mpg_all_reduce(inter, &x, &s2, 1, MPG_I64, MPG_OP_SUM, NULL, NULL));
  RCHECK(s1 == want_intra && s2 == want_inter, "sums %lld and %lld, expected %ld and %ld",
         (long long)s1, (long long)s2, want_intra, want_inter);
  free(all);
  tl_ctx = NULL;
  RCALL(mpg_ctx_destroy(ctx));
  return MPG_OK;
}

/* Random meshes with an expert grid; a random dim set among dp_cp, edp,
 * dp and world, and a random divisor of its size as instances. */
Test(thread_partial, megatron_partial_groups_on_random_meshes, .timeout = 300) {
  uint64_t seed = 0x5eed2026u;
  const char *sets[] = {"edp", "dp_cp", "dp", "world"};
  int cases = 0;
  for (int t = 0; t < 40; t++) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    int tp = 1 << (int)((seed >> 33) % 2), cp = 1 << (int)((seed >> 35) % 2),
        dp = 1 << (int)((seed >> 37) % 3), pp = 1 << (int)((seed >> 40) % 2);
    char dims[96];
    snprintf(dims, sizeof dims, "pp=%d,dp=%d,cp=%d,tp=%d", pp, dp, cp, tp);
    mpg_spec spec = MPG_SPEC_INIT;
    cr_assert_eq(mpg_spec_init(&spec), MPG_OK);
    cr_assert_eq(mpg_spec_set_mesh(&spec, dims), MPG_OK, "%s", mpg_last_error());
    cr_assert_eq(mpg_spec_add_flatten(&spec, "dp_cp", "dp,cp"), MPG_OK, "%s", mpg_last_error());
    int stage = tp * cp * dp, ep = 1 << (int)((seed >> 43) % 3);
    if (stage % ep) ep = 1;
    cr_assert_eq(mpg_spec_set_experts(&spec, 1, ep, NULL), MPG_OK, "%s", mpg_last_error());
    mpg_mesh *m = NULL;
    cr_assert_eq(mpg_mesh_create(&spec, 0, &m), MPG_OK, "%s (ep %d): %s", dims, ep,
                 mpg_last_error());
    partial_arg *pa = calloc(1, sizeof *pa);
    pa->mesh = m;
    pa->set = sets[(seed >> 47) % 4];
    int ds, size;
    cr_assert_eq(mpg_mesh_dimset_find(m, pa->set, &ds), MPG_OK);
    cr_assert_eq(mpg_mesh_group_of(m, ds, 0, NULL, NULL, &size), MPG_OK);
    int divs[16], nd = 0;
    for (int d = 1; d <= size; d++)
      if (size % d == 0) divs[nd++] = d;
    pa->instances = divs[(seed >> 51) % (uint64_t)nd];
    EXPECT_RUN_OK(mpg_thread_run(pp * stage, 30.0, partial_main, pa, NULL));
    cases++;
    free(pa);
    mpg_mesh_destroy(m);
  }
  cr_assert_eq(cases, 40);
}
