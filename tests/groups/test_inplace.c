/* The in-place convention of the collectives, NCCL's, on the thread
 * backend: all_gather in place when send == recv + position * count,
 * reduce_scatter in place when recv == send + position * count, all_reduce
 * when send == recv; any other overlap is refused before anything is
 * posted, and the context stays healthy.  Run over every group of several
 * meshes, every position, and a few counts and dtypes.  Ranks are threads:
 * they report failures through tests/rank_check.h (RCHECK, RCALL). */
#include <criterion/criterion.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "meshpg.h"
#include "../../groups/backend.h" /* mpg__f32_to_half */
#include "../support/rank_check.h"
#include "run_ranks.h"

/* A value every member can predict: member p's element i of block b. */
static int64_t val(int p, int b, size_t i) { return (int64_t)p * 1000003 + b * 1009 + (int64_t)i; }

static mpg_status one_group(mpg_ctx *ctx, mpg_group *g, size_t count) {
  int n = mpg_group_size(g), me = mpg_group_position(g);
  int64_t *buf = malloc(sizeof *buf * count * (size_t)n + 8);
  RCHECK(buf, "out of memory");
  /* all_gather in place: my block already sits in my slot. */
  for (size_t i = 0; i < count * (size_t)n; i++) buf[i] = -1;
  for (size_t i = 0; i < count; i++) buf[(size_t)me * count + i] = val(me, 0, i);
  mpg_status st = mpg_all_gather(g, buf + (size_t)me * count, buf, count, MPG_I64, NULL, NULL);
  if (st) {
    free(buf);
    RCALL(st);
  }
  for (int p = 0; p < n; p++)
    for (size_t i = 0; i < count; i++)
      if (buf[(size_t)p * count + i] != val(p, 0, i)) {
        int64_t got = buf[(size_t)p * count + i];
        free(buf);
        RCHECK(0, "all_gather in place on %s: block %d[%zu] = %lld, expected %lld",
               mpg_group_name(g), p, i, (long long)got, (long long)val(p, 0, i));
      }
  /* reduce_scatter in place: my result lands on my block of send. */
  for (int b = 0; b < n; b++)
    for (size_t i = 0; i < count; i++) buf[(size_t)b * count + i] = val(me, b, i);
  st = mpg_reduce_scatter(g, buf, buf + (size_t)me * count, count, MPG_I64, MPG_OP_SUM,
                          NULL, NULL);
  if (st) {
    free(buf);
    RCALL(st);
  }
  for (size_t i = 0; i < count; i++) {
    int64_t want = 0;
    for (int p = 0; p < n; p++) want += val(p, me, i);
    if (buf[(size_t)me * count + i] != want) {
      int64_t got = buf[(size_t)me * count + i];
      free(buf);
      RCHECK(0, "reduce_scatter in place on %s: [%zu] = %lld, expected %lld",
             mpg_group_name(g), i, (long long)got, (long long)want);
    }
  }
  /* Wrong overlaps, refused before anything is posted (every member makes
   * the same refused calls, so nothing is left half-issued). */
  if (count > 1 || n > 1) {
    const int64_t *wrong_send = me == 0 ? buf + 1 : buf; /* not my slot */
    st = mpg_all_gather(g, wrong_send, buf, count, MPG_I64, NULL, NULL);
    RCHECK(st == MPG_ERR_INVALID, "all_gather with send at the wrong slot: %s (%s)",
           mpg_status_name(st), mpg_last_error());
    RCHECK(strstr(mpg_last_error(), "position * count"), "message: %s", mpg_last_error());
    int64_t *wrong_recv = me == 0 ? buf + 1 : buf;
    st = mpg_reduce_scatter(g, buf, wrong_recv, count, MPG_I64, MPG_OP_SUM, NULL, NULL);
    RCHECK(st == MPG_ERR_INVALID, "reduce_scatter with recv at the wrong block: %s (%s)",
           mpg_status_name(st), mpg_last_error());
  }
  if (count > 1) {
    st = mpg_all_reduce(g, buf, buf + 1, count, MPG_I64, MPG_OP_SUM, NULL, NULL);
    RCHECK(st == MPG_ERR_INVALID, "all_reduce with shifted overlap: %s", mpg_status_name(st));
    RCHECK(strstr(mpg_last_error(), "send == recv"), "message: %s", mpg_last_error());
  }
  free(buf);
  RCHECK(mpg_ctx_status(ctx) == MPG_OK, "a refused call aborted the context");
  return MPG_OK;
}

/* one_group on every group of the mesh, for counts 1, 3 and 1000. */
static mpg_status rank_main(rr_rank *r) {
  const size_t counts[] = {1, 3, 1000};
  mpg_status st = MPG_OK;
  for (int s = 0; s < mpg_mesh_num_dimsets(r->mesh) && !st; s++) {
    mpg_group *g = NULL;
    if ((st = mpg_ctx_group_at(r->ctx, s, &g))) break;
    for (int c = 0; c < 3 && !st; c++) st = one_group(r->ctx, g, counts[c]);
  }
  return st;
}

static void run_mesh(const char *text) {
  run_ranks_ok(text, 0, rank_main, NULL, &(rr_opts){.flatten = "dp_cp=dp,cp", .timeout_s = 30});
}

Test(inplace, every_position_of_every_group) {
  run_mesh("dp=2,cp=1,tp=2");
  run_mesh("dp=3,cp=2,tp=1");
  run_mesh("dp=1,cp=1,tp=5");
  run_mesh("dp=2,cp=2,tp=2");
}

/* A scaled sum of f16/bf16 keeps its scale in f32 on every backend, so the
 * average of identical gradients agrees across world sizes, even with a
 * scale below f16's range (1e-8 underflows to 0 in f16): world 1 scales
 * by s, a world of n by s / n, and the results are equal bit for bit. */
typedef struct {
  mpg_dtype dt;
  double scale;
  uint16_t out[64];
} scaled_job;

static mpg_status scaled_main(rr_rank *r) {
  scaled_job *j = r->arg;
  mpg_group *g = NULL;
  RCALL(mpg_ctx_group(r->ctx, "world", &g));
  uint16_t buf[64];
  for (int i = 0; i < 64; i++) buf[i] = mpg__f32_to_half(j->dt, 50.0f + 37.0f * (float)i);
  double s = j->scale / mpg_group_size(g);
  RCALL(mpg_all_reduce_scaled(g, buf, buf, 64, j->dt, s, NULL, NULL));
  if (r->rank == 0) memcpy(j->out, buf, sizeof buf);
  return MPG_OK;
}

Test(scaled_sum, half_results_agree_across_world_sizes) {
  const mpg_dtype dts[] = {MPG_F16, MPG_BF16};
  const double scales[] = {1e-8, 3e-5, 0.37};
  for (int d = 0; d < 2; d++)
    for (int k = 0; k < 3; k++) {
      uint16_t ref[64];
      const char *meshes[] = {"dp=1", "dp=2", "dp=4", "dp=8"};
      for (int w = 0; w < 4; w++) {
        scaled_job j = {.dt = dts[d], .scale = scales[k]};
        run_ranks_ok(meshes[w], 0, scaled_main, &j, &(rr_opts){.timeout_s = 30});
        if (w == 0) {
          memcpy(ref, j.out, sizeof ref);
          int nonzero = 0;
          for (int i = 0; i < 64; i++) nonzero += (ref[i] & 0x7fff) != 0;
          cr_assert_gt(nonzero, 0, "%s scale %g: world 1 gave all zeros",
                       mpg_dtype_name(dts[d]), scales[k]);
        } else {
          for (int i = 0; i < 64; i++)
            cr_assert_eq(j.out[i], ref[i], "%s scale %g, %s: [%d] = 0x%04x, world 1 0x%04x",
                         mpg_dtype_name(dts[d]), scales[k], meshes[w], i, j.out[i], ref[i]);
        }
      }
    }
}
