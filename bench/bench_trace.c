/*
 * bench_trace - the flight recorder's cost per operation (issue 32).
 *
 * Two thread-backend ranks each record ROUNDS x N operations on their "dp"
 * group through the recorder's own calls (groups/trace.c: mpg__trace_begin
 * then mpg__trace_end, with a sync bucket tag set, as a sync bucket is
 * recorded), no communication in between, and print the time per
 * recorded operation: the best round and the median of the rounds, per
 * rank.  Both ranks record at once, as the ranks of a job do.  Multiply by
 * the operations a step records (a gpt-small sync step at np 2: one per
 * bucket, 4) and compare with the step's time (bench_sync_mpi, mode a):
 * docs/trace.md, "Cost".  It links the static library for the internal
 * calls.
 *
 * Usage: bench_trace [--ops N] [--rounds R]   (defaults 1000000, 7)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "core.h"

static long nops = 1000000;
static int rounds = 7;
static double per_op[2][64];

static mpg_status rank_main(const mpg_init_opts *opts, void *arg) {
  const mpg_mesh *mesh = arg;
  mpg_ctx *ctx = NULL;
  mpg_group *dp = NULL;
  mpg_status st = mpg_ctx_create(mesh, opts, &ctx);
  if (!st) st = mpg_ctx_group(ctx, "dp", &dp);
  if (st) {
    fprintf(stderr, "bench_trace: %s\n", mpg_last_error());
    mpg_ctx_destroy(ctx);
    return st;
  }
  int rank = mpg_ctx_rank(ctx);
  int first = mpg__trace_intern(ctx, "layers.11.mlp.fc.weight");
  int last = mpg__trace_intern(ctx, "layers.0.attn.qkv.weight");
  mpg__trace_step(ctx, 1);
  for (int r = 0; r < rounds; r++) {
    double t0 = now_s();
    for (long i = 0; i < nops; i++) {
      mpg__trace_tag((int)(i & 3), first, last);
      mpg__trace_mark m = mpg__trace_begin(dp, MPG__ALL_REDUCE, MPG_F32, 1u << 20, -1);
      mpg__trace_posted(&m);
      mpg__trace_end(&m, MPG_OK);
    }
    per_op[rank][r] = (now_s() - t0) / (double)nops;
  }
  mpg__trace_tag(-1, 0, 0);
  return mpg_ctx_destroy(ctx);
}

int main(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--ops") && i + 1 < argc) {
      nops = atol(argv[++i]);
    } else if (!strcmp(argv[i], "--rounds") && i + 1 < argc) {
      rounds = atoi(argv[++i]);
    } else {
      fprintf(stderr, "usage: bench_trace [--ops N] [--rounds R (1..64)]\n");
      return 2;
    }
  }
  if (nops < 1 || rounds < 1 || rounds > 64) {
    fprintf(stderr, "bench_trace: --ops must be >= 1 and --rounds 1..64\n");
    return 2;
  }
  mpg_spec spec = MPG_SPEC_INIT;
  mpg_mesh *mesh = NULL;
  if (mpg_spec_init(&spec) || mpg_spec_set_mesh(&spec, "dp=2") ||
      mpg_mesh_create(&spec, 2, &mesh)) {
    fprintf(stderr, "bench_trace: %s\n", mpg_last_error());
    return 1;
  }
  mpg_status st = mpg_thread_run(2, 60.0, rank_main, mesh, NULL);
  mpg_mesh_destroy(mesh);
  if (st) return 1;
  printf("# bench_trace: %ld recorded operations x %d rounds per rank, 2 ranks at once\n",
         nops, rounds);
  for (int r = 0; r < 2; r++) {
    double best = per_op[r][0];
    for (int k = 1; k < rounds; k++)
      if (per_op[r][k] < best) best = per_op[r][k];
    printf("RESULT rank=%d best_ns=%.1f median_ns=%.1f\n", r, best * 1e9,
           median(per_op[r], rounds) * 1e9);
  }
  return 0;
}
