/*
 * bench_raw_mpi - the raw-MPI references of the sync benchmark (issue 13),
 * each at its best: in a process of its own (no meshpg, no other mode
 * before it to leave glibc's heap in a state that faults), on one buffer
 * allocated and touched once, so that the steady state takes no page
 * faults (the RESULT line reports them per step).  Open MPI's blocking
 * all-reduce mallocs a message-sized temporary on every call; above
 * glibc's mmap threshold (32 MiB at most) that is a fresh mmap, faulted in
 * page by page, every step.  So that the reference runs at its best, glibc
 * is told first never to mmap and never to trim (mallopt M_MMAP_MAX = 0,
 * M_TRIM_THRESHOLD = INT_MAX): the temporary is then recycled from the
 * heap and the steady state takes no faults.
 *
 *   R  MPI_Allreduce(MPI_IN_PLACE, MPI_SUM) over the whole contiguous
 *      buffer (the parameters' bytes), then one loop multiplying by
 *      1 / world (allreduce_s and divide_s report the two parts).
 *   L  the naive recipe on raw MPI: for every tensor of the list, in
 *      registration order, MPI_Allreduce(MPI_IN_PLACE, MPI_SUM) on its
 *      view of the same buffer, then the divide loop of that tensor.
 *
 * Modes run interleaved (iteration k of R, then of L), each after an
 * MPI_Barrier; an iteration's time is the maximum over ranks.  The first
 * iteration of each mode checks the result (rank + 1 everywhere -> the
 * mean (world + 1) / 2) and is not timed.
 *
 * Usage: mpirun -np N bench_raw_mpi PARAMS [ITERS [WARMUP]]
 * PARAMS: the parameter list, read and checked as bench_sync_mpi reads it
 * (bench_load_params in bench_util.h; a malformed line is an error).
 * Output (rank 0): RESULT <mode> median_s=.. min_s=.. max_s=.. n=..
 *   bytes=.. gbps=.. faults=.. [allreduce_s=.. divide_s=..]
 * Exit status 0, 1 on a failure, 2 on a usage error.
 */
#include <mpi.h>

#include <malloc.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "bench_util.h"

static void scale(float *x, size_t n, float by) {
  for (size_t i = 0; i < n; i++) x[i] *= by;
}

enum { R, L, NMODES };

int main(int argc, char **argv) {
  mallopt(M_MMAP_MAX, 0);
  mallopt(M_TRIM_THRESHOLD, (int)(~0u >> 1));
  MPI_Init(&argc, &argv);
  int rank, world;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (argc < 2) {
    if (rank == 0) fprintf(stderr, "usage: bench_raw_mpi PARAMS [ITERS [WARMUP]]\n");
    MPI_Finalize();
    return 2;
  }
  int iters = argc > 2 ? atoi(argv[2]) : 20, warmup = argc > 3 ? atoi(argv[3]) : 3;
  if (iters < 1 || iters > 10000 || warmup < 1) {
    MPI_Finalize();
    return 2;
  }
  /* Every rank reads the list; rank 0 says what is wrong with it. */
  pdesc *par = NULL;
  int np = 0;
  if (bench_load_params(rank == 0 ? "bench_raw_mpi" : NULL, argv[1], &par, &np))
    MPI_Abort(MPI_COMM_WORLD, 1);
  size_t total = 0;
  for (int p = 0; p < np; p++) total += par[p].count;
  if (total > 2147483647u) { /* MPI counts are int */
    if (rank == 0)
      fprintf(stderr, "bench_raw_mpi: %s: too large (%zu elements, at most 2^31 - 1)\n",
              argv[1], total);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  float *buf = malloc(total * sizeof *buf); /* once; touched below */
  double *t[NMODES], *p1 = calloc((size_t)iters, sizeof *p1),
         *p2 = calloc((size_t)iters, sizeof *p2), *fl[NMODES];
  for (int m = 0; m < NMODES; m++) {
    t[m] = calloc((size_t)iters, sizeof(double));
    fl[m] = calloc((size_t)iters, sizeof(double));
  }
  const float inv = 1.0f / (float)world;
  int bad = 0;
  for (int it = 0; it < warmup + iters; it++) {
    for (int m = 0; m < NMODES; m++) {
      if (it == 0)
        for (size_t i = 0; i < total; i++) buf[i] = (float)(rank + 1);
      MPI_Barrier(MPI_COMM_WORLD);
      double f0 = minor_faults(), t0 = now_s(), t1;
      if (m == R) {
        MPI_Allreduce(MPI_IN_PLACE, buf, (int)total, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        t1 = now_s();
        scale(buf, total, inv);
      } else {
        size_t off = 0;
        for (int p = 0; p < np; p++) {
          MPI_Allreduce(MPI_IN_PLACE, buf + off, (int)par[p].count, MPI_FLOAT, MPI_SUM,
                        MPI_COMM_WORLD);
          scale(buf + off, par[p].count, inv);
          off += par[p].count;
        }
        t1 = now_s();
      }
      double mine[4] = {now_s() - t0, t1 - t0, now_s() - t1, minor_faults() - f0}, mx[4];
      MPI_Allreduce(mine, mx, 4, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      if (it == 0) {
        float want = (float)(world + 1) / 2;
        for (size_t i = 0; i < total; i++)
          if (fabsf(buf[i] - want) > 1e-5f * want) {
            bad = 1;
            break;
          }
      } else if (it >= warmup) {
        int k = it - warmup;
        t[m][k] = mx[0];
        fl[m][k] = mx[3];
        if (m == R) p1[k] = mx[1], p2[k] = mx[2];
      }
    }
  }
  int anybad = 0;
  MPI_Allreduce(&bad, &anybad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0 && anybad) fprintf(stderr, "bench_raw_mpi: FAIL: wrong result\n");
  if (rank == 0 && !anybad) {
    double bytes = (double)total * 4;
    for (int m = 0; m < NMODES; m++) {
      double mn = t[m][0], mxv = t[m][0];
      for (int k = 0; k < iters; k++) {
        if (t[m][k] < mn) mn = t[m][k];
        if (t[m][k] > mxv) mxv = t[m][k];
      }
      double md = median(t[m], iters), f = median(fl[m], iters);
      printf("RESULT %c median_s=%.6f min_s=%.6f max_s=%.6f n=%d bytes=%.0f gbps=%.4f "
             "faults=%.0f", m == R ? 'R' : 'L', md, mn, mxv, iters, bytes,
             bytes / md / 1e9, f);
      if (m == R) printf(" allreduce_s=%.6f divide_s=%.6f", median(p1, iters), median(p2, iters));
      if (m == L) printf(" calls=%d", np);
      printf("\n");
    }
    fflush(stdout);
  }
  for (int m = 0; m < NMODES; m++) {
    free(t[m]);
    free(fl[m]);
  }
  free(p1);
  free(p2);
  free(buf);
  free(par);
  MPI_Finalize();
  return anybad;
}
