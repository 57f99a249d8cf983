/* The groups layer's f32-accumulating collectives (groups_internal.h:
 * mpg__all_reduce_f32acc, mpg__reduce_scatter_f32acc, used by the sync for
 * reduce_dtype = f32) on the thread backend, which always reduces f16/bf16
 * in f32: every result equals the plain call's bit for bit, and equals an
 * f32 reduction rounded once (mpg__f32_to_half).  f16, bf16 and f32; sum,
 * avg, max, min and a pre-multiplied sum; in place and not; groups of 1, 2,
 * 3 and 4 ranks.  The NCCL path of the same calls is checked on a GPU by
 * tests/groups/test_nccl.c (f32_accumulation_*).  Ranks are threads: they
 * report failures through tests/rank_check.h (RCHECK, RCALL). */
#include <criterion/criterion.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "meshpg.h"
#include "../../groups/backend.h"         /* mpg__f32_to_half */
#include "groups_internal.h" /* the f32acc calls */
#include "../support/rank_check.h"
#include "run_ranks.h"

static const mpg_dtype dtypes[] = {MPG_F16, MPG_BF16, MPG_F32};
static const mpg_op ops[] = {MPG_OP_SUM, MPG_OP_AVG, MPG_OP_MAX, MPG_OP_MIN,
                             MPG__OP_PREMUL_SUM};
static const char *const op_names[] = {"sum", "avg", "max", "min", "premul_sum"};
#define SCALE 0.3 /* not a power of two: the f32 products round */

/* Member p's element i: multiples of 2^-7 below 16 in magnitude, exact in
 * every dtype here, whose sums are exact in f32 (so any f32 order gives the
 * same sum) but often not in f16/bf16 (so rounding at each step differs). */
static float val(int p, size_t i) {
  int k = (int)((i * 7 + (size_t)p * 13) % 61);
  float v = 1.0f + (float)k / 64.0f;
  float mag = (float)(1 << (i % 3)) * 0.5f;
  float sign = ((i + (size_t)p) % 4 == 1) ? -1.0f : 1.0f;
  return sign * v * mag;
}

static void put(mpg_dtype dt, void *buf, size_t i, float v) {
  if (dt == MPG_F32)
    ((float *)buf)[i] = v;
  else
    ((uint16_t *)buf)[i] = mpg__f32_to_half(dt, v);
}

/* Element i of the result, as the thread backend defines it: the members'
 * values in f32, in position order (scaled by (float)SCALE first for a
 * pre-multiplied sum), divided once for avg, rounded once. */
static void want_elem(mpg_dtype dt, mpg_op op, int n, size_t i, void *out, size_t j) {
  float acc = 0;
  for (int p = 0; p < n; p++) {
    float x = val(p, i);
    if (op == MPG__OP_PREMUL_SUM) x *= (float)SCALE;
    if (p == 0)
      acc = x;
    else if (op == MPG_OP_MAX)
      acc = x > acc ? x : acc;
    else if (op == MPG_OP_MIN)
      acc = x < acc ? x : acc;
    else
      acc += x;
  }
  if (op == MPG_OP_AVG) acc /= (float)n;
  put(dt, out, j, acc);
}

/* One case on g: all_reduce (rs = 0) or reduce_scatter (rs = 1) of `count`
 * elements (per member for reduce_scatter), in place or not, through the
 * f32acc call and the plain call on the same input. */
static mpg_status one_case(mpg_group *g, int rs, int inplace, mpg_dtype dt, mpg_op op,
                           size_t count) {
  int n = mpg_group_size(g), me = mpg_group_position(g);
  size_t es = mpg_dtype_size(dt);
  size_t in_elems = rs ? count * (size_t)n : count;
  char *send[2], *recv[2], *want = malloc(count * es + 1);
  RCHECK(want, "out of memory");
  for (int v = 0; v < 2; v++) {
    send[v] = malloc(in_elems * es + 1);
    recv[v] = malloc(count * es + 1);
    RCHECK(send[v] && recv[v], "out of memory");
    for (size_t i = 0; i < in_elems; i++) put(dt, send[v], i, val(me, i));
    memset(recv[v], 0x5a, count * es);
  }
  size_t base = rs ? (size_t)me * count : 0; /* the block this member receives */
  for (size_t j = 0; j < count; j++) want_elem(dt, op, n, base + j, want, j);
  mpg_status st[2];
  for (int v = 0; v < 2; v++) {
    const void *s = send[v];
    void *r = inplace ? send[v] + base * es : recv[v];
    if (v == 0)
      st[v] = rs ? mpg__reduce_scatter_f32acc(g, s, r, count, dt, op, SCALE, NULL, NULL)
                 : mpg__all_reduce_f32acc(g, s, r, count, dt, op, SCALE, NULL, NULL);
    else if (op == MPG__OP_PREMUL_SUM)
      st[v] = rs ? mpg_reduce_scatter_scaled(g, s, r, count, dt, SCALE, NULL, NULL)
                 : mpg_all_reduce_scaled(g, s, r, count, dt, SCALE, NULL, NULL);
    else
      st[v] = rs ? mpg_reduce_scatter(g, s, r, count, dt, op, NULL, NULL)
                 : mpg_all_reduce(g, s, r, count, dt, op, NULL, NULL);
    if (st[v]) break;
  }
  const char *got[2] = {inplace ? send[0] + base * es : recv[0],
                        inplace ? send[1] + base * es : recv[1]};
  int same = !st[0] && !st[1] && memcmp(got[0], got[1], count * es) == 0;
  int right = !st[0] && (dt == MPG_F32 || memcmp(got[0], want, count * es) == 0);
  size_t bad = 0;
  while (!st[0] && !st[1] && bad < count && !memcmp(got[0] + bad * es, got[1] + bad * es, es) &&
         (dt == MPG_F32 || !memcmp(got[0] + bad * es, want + bad * es, es)))
    bad++;
  for (int v = 0; v < 2; v++) {
    free(send[v]);
    free(recv[v]);
  }
  free(want);
  char what[160];
  snprintf(what, sizeof what, "f32acc %s(%s, %s, count %zu)%s on \"%s\" (%d ranks)",
           rs ? "reduce_scatter" : "all_reduce", mpg_dtype_name(dt),
           op_names[op], count, inplace ? " in place" : "", mpg_group_name(g), n);
  RCHECK(!st[0], "%s: %s: %s", what, mpg_status_name(st[0]), mpg_last_error());
  RCHECK(!st[1], "%s: the plain call: %s: %s", what, mpg_status_name(st[1]),
         mpg_last_error());
  RCHECK(same, "%s: element %zu differs from the plain call's", what, bad);
  RCHECK(right, "%s: element %zu is not the f32 reduction rounded once", what, bad);
  return MPG_OK;
}

/* Every case on every group of the mesh; rank 0 counts them in *cases. */
static mpg_status rank_main(rr_rank *r) {
  int *cases = r->arg;
  const size_t counts[] = {1, 5, 1000};
  mpg_status st = MPG_OK;
  for (int s = 0; s < mpg_mesh_num_dimsets(r->mesh) && !st; s++) {
    mpg_group *g = NULL;
    if ((st = mpg_ctx_group_at(r->ctx, s, &g))) break;
    for (size_t d = 0; d < sizeof dtypes / sizeof *dtypes && !st; d++)
      for (size_t o = 0; o < sizeof ops / sizeof *ops && !st; o++)
        for (int c = 0; c < 3 && !st; c++)
          for (int k = 0; k < 4 && !st; k++) {
            st = one_case(g, k / 2, k % 2, dtypes[d], ops[o], counts[c]);
            if (!st && r->rank == 0) (*cases)++;
          }
  }
  return st;
}

/* rank_main over the mesh `text` with the flatten items `flatten` (NULL:
 * none), e.g. "all=dp,tp". */
static void run_mesh(const char *text, const char *flatten) {
  int cases = 0;
  run_ranks_ok(text, 0, rank_main, &cases, &(rr_opts){.flatten = flatten, .timeout_s = 60});
  cr_log_info("mesh %s: %d f32acc cases equal the plain calls", text, cases);
}

/* dp=4,tp=1 gives groups of 4 (dp) and of 1 (tp, a local copy or scale);
 * dp=2,tp=3 groups of 2 and 3 and the flattened 6-rank "all". */
Test(f32acc, thread_backend_equals_plain_calls_dp4) { run_mesh("dp=4,tp=1", NULL); }
Test(f32acc, thread_backend_equals_plain_calls_dp2_tp3) { run_mesh("dp=2,tp=3", "all=dp,tp"); }

/* The argument checks are the plain calls' (coll.c): a NULL group is
 * refused before anything runs. */
Test(f32acc, arguments_are_checked_like_the_plain_calls) {
  uint16_t buf[8] = {0};
  cr_assert_eq(mpg__all_reduce_f32acc(NULL, buf, buf, 8, MPG_BF16, MPG_OP_SUM, 1.0, NULL,
                                      NULL),
               MPG_ERR_INVALID);
  cr_assert_eq(mpg__reduce_scatter_f32acc(NULL, buf, buf, 4, MPG_F16, MPG_OP_SUM, 1.0,
                                          NULL, NULL),
               MPG_ERR_INVALID);
}
