/*
 * bench_alltoall_mpi - all-to-all bus bandwidth: meshpg's mpg_all_to_all
 * and mpg_all_to_all_v on the MPI backend against raw MPI_Alltoall and
 * MPI_Alltoallv on the same bytes, side by side in one run (issue 21).
 * meshpg's two run on buffers from mpg_ctx_mem_alloc (on one host its
 * channel then copies each block once, issue 34); "all_to_all/malloc" is
 * mpg_all_to_all on malloc'ed buffers, as the MPI references use.
 * MESHPG_SHM=0 in the environment measures the backend's path.
 *
 *   mpirun -np P bench_alltoall_mpi [--min-bytes B] [--max-bytes B]
 *                                   [--repeat N] [--iters N] [--warmup N]
 *                                   [--loops NAME,...|all]
 *
 * Per size S (bytes each rank sends in all, S / P to every member, f32;
 * from --min-bytes by x4 up to --max-bytes): the five methods run in turn,
 * each on its own buffers, allocated and touched once before any timing
 * (the references run at their best: no page faults, warm buffers).  Each
 * timed block is `iters` back-to-back calls (256 MiB / S, clamped to
 * 2..--iters) after --warmup untimed ones; a block's time per call is the
 * maximum over ranks; the median of --repeat blocks is reported, and the
 * best as "best".  The order of the methods rotates from block to block.
 *   algbw = S / time; busbw = algbw * (P - 1) / P (nccl-tests' alltoall
 *   convention: the share of the bytes that crosses between ranks).
 *   The v forms use equal counts here (the same bytes as the plain forms),
 *   with displacements, as MoE dispatch would pass them.
 * Every result is checked after its block (rank r sends r * 1e6 + j * 1e3 +
 * i to member j, element i of the block): a wrong element fails the run.
 *
 * The floor (issue 34), in the same run: the P ranks each copy S bytes
 * (the bytes an all-to-all moves per rank) from a buffer of their own
 * into another of their own, all at once, timed as the methods are (a
 * block of `iters` copies after a barrier, the maximum over ranks), once
 * per copy loop of bench_copy.h (memcpy, vector, movsb, stream; --loops
 * picks some) in every one of the --repeat rounds.  The floor is the
 * fastest the machine did it: the best block of the fastest loop.  Each
 * method's row gives its median time over the floor, "/floor" (1.00 is
 * the floor; lower means the floor is wrong), before the last column, and
 * a "# floor" line per size gives the floor, its loop and every loop's
 * best.
 *
 * Output (rank 0): "#" header lines, then per size one row per method,
 *   bytes method time_us algbw busbw best /floor "vs best MPI"
 * (time_us: the median; best: the busbw of the best block; vs best MPI:
 * the faster raw MPI's median over this method's, e.g. 1.25x), then the
 * "# floor" line.
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_copy.h"
#include "bench_util.h"
#include "meshpg.h"

enum { M_OURS, M_OURS_V, M_OURS_MALLOC, M_MPI, M_MPI_V, M_COUNT };
static const char *const method_name[M_COUNT] = {"mpg_all_to_all", "mpg_all_to_all_v",
                                                 "all_to_all/malloc", "MPI_Alltoall",
                                                 "MPI_Alltoallv"};
/* mpg_all_to_all and _v run on buffers from mpg_ctx_mem_alloc (on mpi a
 * memfd the node's other ranks map: one copy per block); all_to_all/malloc
 * on malloc'ed ones, as the MPI references. */
static int from_mem_alloc(int m) { return m == M_OURS || m == M_OURS_V; }

static int g_rank, g_world;

#define CHECK(call)                                                                   \
  do {                                                                                \
    mpg_status st_ = (call);                                                          \
    if (st_ != MPG_OK) {                                                              \
      fprintf(stderr, "bench_alltoall_mpi: rank %d: %s: %s\n", g_rank, #call,         \
              mpg_last_error());                                                      \
      MPI_Abort(MPI_COMM_WORLD, 1);                                                   \
    }                                                                                 \
  } while (0)

typedef struct method_bufs {
  float *send, *recv;
} method_bufs;

static void fill(float *send, size_t per) {
  for (int j = 0; j < g_world; j++)
    for (size_t i = 0; i < per; i++)
      send[(size_t)j * per + i] = (float)(g_rank * 1000000 + j * 1000) + (float)(i % 997);
}

/* recv block i comes from member i: i * 1e6 + me * 1e3 + (k % 997). */
static long check(const float *recv, size_t per) {
  long wrong = 0;
  for (int i = 0; i < g_world; i++)
    for (size_t k = 0; k < per; k++)
      if (recv[(size_t)i * per + k] !=
          (float)(i * 1000000 + g_rank * 1000) + (float)(k % 997))
        wrong++;
  return wrong;
}

static void run_once(int m, mpg_group *world, method_bufs *b, size_t per, const size_t *cnt,
                     const size_t *dsp, const int *icnt, const int *idsp) {
  switch (m) {
    case M_OURS:
    case M_OURS_MALLOC:
      CHECK(mpg_all_to_all(world, b->send, b->recv, per, MPG_F32, NULL, NULL));
      break;
    case M_OURS_V:
      CHECK(mpg_all_to_all_v(world, b->send, cnt, dsp, b->recv, cnt, dsp, MPG_F32, NULL,
                             NULL));
      break;
    case M_MPI:
      MPI_Alltoall(b->send, (int)per, MPI_FLOAT, b->recv, (int)per, MPI_FLOAT,
                   MPI_COMM_WORLD);
      break;
    default:
      MPI_Alltoallv(b->send, icnt, idsp, MPI_FLOAT, b->recv, icnt, idsp, MPI_FLOAT,
                    MPI_COMM_WORLD);
  }
}

int main(int argc, char **argv) {
  size_t min_bytes = 1 << 16, max_bytes = 64u << 20;
  int repeat = 5, max_iters = 50, warmup = 2;
  const char *loops = "all";
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!v) {
      fprintf(stderr, "usage: bench_alltoall_mpi [--min-bytes B] [--max-bytes B] "
                      "[--repeat N] [--iters N] [--warmup N] [--loops NAME,...|all]\n");
      return 2;
    }
    i++;
    if (!strcmp(a, "--min-bytes")) min_bytes = strtoull(v, NULL, 10);
    else if (!strcmp(a, "--max-bytes")) max_bytes = strtoull(v, NULL, 10);
    else if (!strcmp(a, "--repeat")) repeat = atoi(v);
    else if (!strcmp(a, "--iters")) max_iters = atoi(v);
    else if (!strcmp(a, "--warmup")) warmup = atoi(v);
    else if (!strcmp(a, "--loops")) loops = v;
    else {
      fprintf(stderr, "bench_alltoall_mpi: unknown option %s\n", a);
      return 2;
    }
  }
  if (repeat < 1 || max_iters < 2 || warmup < 0 || min_bytes < 4 || max_bytes < min_bytes) {
    fprintf(stderr, "bench_alltoall_mpi: bad option values\n");
    return 2;
  }
  unsigned loop_mask = bench_copy_select("bench_alltoall_mpi", loops);
  if (!loop_mask) return 2;
  int n_all = 0, nl = 0;
  const bench_copy_loop *all_loops = bench_copy_loops(&n_all);
  bench_copy_loop loop[8];
  for (int i = 0; i < n_all; i++)
    if (loop_mask & (1u << i)) loop[nl++] = all_loops[i];
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_world);

  mpg_spec spec = MPG_SPEC_INIT;
  CHECK(mpg_spec_init(&spec));
  CHECK(mpg_spec_set_mesh(&spec, "dp=-1"));
  CHECK(mpg_spec_validate(&spec));
  mpg_mesh *mesh = NULL;
  CHECK(mpg_mesh_create(&spec, g_world, &mesh));
  mpg_init_opts io = MPG_INIT_OPTS_INIT;
  io.backend.name = MPG_BACKEND_MPI;
  io.rank = g_rank;
  io.world_size = g_world;
  io.backend.timeout_s = 600;
  mpg_ctx *ctx = NULL;
  CHECK(mpg_ctx_create(mesh, &io, &ctx));
  mpg_group *world = NULL;
  CHECK(mpg_ctx_group(ctx, "world", &world));

  /* Buffers for the largest size, one pair per method, touched once. */
  size_t per_max = max_bytes / 4 / (size_t)g_world;
  if (per_max == 0) per_max = 1;
  method_bufs bufs[M_COUNT];
  for (int m = 0; m < M_COUNT; m++) {
    size_t nb = per_max * (size_t)g_world * sizeof(float);
    if (from_mem_alloc(m)) {
      CHECK(mpg_ctx_mem_alloc(ctx, nb, 0, (void **)&bufs[m].send));
      CHECK(mpg_ctx_mem_alloc(ctx, nb, 0, (void **)&bufs[m].recv));
    } else {
      bufs[m].send = malloc(nb);
      bufs[m].recv = malloc(nb);
    }
    if (!bufs[m].send || !bufs[m].recv) {
      fprintf(stderr, "bench_alltoall_mpi: out of memory\n");
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    memset(bufs[m].recv, 0, per_max * (size_t)g_world * sizeof(float));
  }
  /* The floor's two buffers, written before any timing. */
  unsigned char *fsrc = malloc(per_max * (size_t)g_world * sizeof(float));
  unsigned char *fdst = malloc(per_max * (size_t)g_world * sizeof(float));
  if (!fsrc || !fdst) {
    fprintf(stderr, "bench_alltoall_mpi: out of memory\n");
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  for (size_t i = 0; i < per_max * (size_t)g_world * sizeof(float); i++)
    fsrc[i] = (unsigned char)(g_rank * 31 + i % 251);
  memset(fdst, 0, per_max * (size_t)g_world * sizeof(float));
  size_t *cnt = malloc(sizeof(size_t) * (size_t)g_world);
  size_t *dsp = malloc(sizeof(size_t) * (size_t)g_world);
  int *icnt = malloc(sizeof(int) * (size_t)g_world), *idsp = malloc(sizeof(int) * (size_t)g_world);
  double *blk = malloc(sizeof(double) * (size_t)repeat * M_COUNT);
  double *fblk = malloc(sizeof(double) * (size_t)repeat * (size_t)nl);
  if (!cnt || !dsp || !icnt || !idsp || !blk || !fblk) MPI_Abort(MPI_COMM_WORLD, 1);

  if (g_rank == 0) {
    printf("# all-to-all, %d MPI processes (MPI backend), f32; busbw = S/t * (P-1)/P, GB/s\n",
           g_world);
    char names[64];
    printf("# floor: %d ranks each copy S bytes (what an all-to-all moves per rank) at once, "
           "best of %d rounds x loops %s; /floor = time / floor\n",
           g_world, repeat, bench_copy_names(loop_mask, names, sizeof names));
    printf("# %10s  %-18s %10s %9s %9s %9s %7s  %s\n", "bytes", "method", "time_us", "algbw",
           "busbw", "best", "/floor", "vs best MPI");
  }
  for (size_t bytes = min_bytes;; bytes = bytes * 4 > max_bytes && bytes < max_bytes
                                              ? max_bytes : bytes * 4) {
    size_t per = bytes / 4 / (size_t)g_world;
    if (per == 0) per = 1;
    size_t S = per * (size_t)g_world * 4;
    for (int j = 0; j < g_world; j++) {
      cnt[j] = per;
      dsp[j] = (size_t)j * per;
      icnt[j] = (int)per;
      idsp[j] = (int)((size_t)j * per);
    }
    for (int m = 0; m < M_COUNT; m++) fill(bufs[m].send, per);
    int iters = (int)((256u << 20) / S);
    if (iters < 2) iters = 2;
    if (iters > max_iters) iters = max_iters;
    for (int r = 0; r < repeat; r++)
      for (int k = 0; k < M_COUNT; k++) {
        int m = (k + r) % M_COUNT; /* rotate who goes first */
        for (int w = 0; w < warmup; w++)
          run_once(m, world, &bufs[m], per, cnt, dsp, icnt, idsp);
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = now_s();
        for (int it = 0; it < iters; it++)
          run_once(m, world, &bufs[m], per, cnt, dsp, icnt, idsp);
        double t = (now_s() - t0) / iters, tmax = 0;
        MPI_Allreduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        blk[(size_t)m * repeat + r] = tmax;
        long wrong = check(bufs[m].recv, per), all_wrong = 0;
        MPI_Allreduce(&wrong, &all_wrong, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
        if (all_wrong) {
          if (g_rank == 0)
            fprintf(stderr, "bench_alltoall_mpi: %s at %zu bytes: %ld wrong elements\n",
                    method_name[m], S, all_wrong);
          MPI_Abort(MPI_COMM_WORLD, 1);
        }
        memset(bufs[m].recv, 0, S);
        if (k == M_COUNT - 1) /* the floor: every copy loop, once a round */
          for (int l = 0; l < nl; l++) {
            for (int w = 0; w < warmup; w++) loop[l].copy(fdst, fsrc, S);
            MPI_Barrier(MPI_COMM_WORLD);
            double f0 = now_s();
            for (int it = 0; it < iters; it++) loop[l].copy(fdst, fsrc, S);
            double ft = (now_s() - f0) / iters, fmax = 0;
            MPI_Allreduce(&ft, &fmax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
            fblk[(size_t)l * repeat + r] = fmax;
            if (memcmp(fdst, fsrc, S)) {
              fprintf(stderr, "bench_alltoall_mpi: rank %d: the floor's %s copy of %zu bytes "
                              "is wrong\n", g_rank, loop[l].name, S);
              MPI_Abort(MPI_COMM_WORLD, 1);
            }
            memset(fdst, 0, S);
          }
      }
    double med[M_COUNT], best[M_COUNT];
    for (int m = 0; m < M_COUNT; m++) {
      qsort(blk + (size_t)m * repeat, (size_t)repeat, sizeof(double), cmp_double);
      med[m] = blk[(size_t)m * repeat + repeat / 2];
      best[m] = blk[(size_t)m * repeat];
    }
    double best_mpi = med[M_MPI] < med[M_MPI_V] ? med[M_MPI] : med[M_MPI_V];
    double share = g_world > 1 ? (double)(g_world - 1) / g_world : 1.0;
    /* The floor: the best block of the fastest loop. */
    int win = 0;
    double fbest[8], fmed[8];
    for (int l = 0; l < nl; l++) {
      qsort(fblk + (size_t)l * repeat, (size_t)repeat, sizeof(double), cmp_double);
      fbest[l] = fblk[(size_t)l * repeat];
      fmed[l] = fblk[(size_t)l * repeat + repeat / 2];
      if (fbest[l] < fbest[win]) win = l;
    }
    double floor_t = fbest[win];
    if (g_rank == 0) {
      for (int m = 0; m < M_COUNT; m++) {
        double alg = (double)S / med[m] / 1e9;
        printf("  %10zu  %-18s %10.1f %9.3f %9.3f %9.3f %6.2fx  %.2fx\n", S, method_name[m],
               med[m] * 1e6, alg, alg * share, (double)S / best[m] / 1e9 * share,
               med[m] / floor_t, best_mpi / med[m]);
      }
      printf("# floor %10zu: %d ranks each copy %zu bytes at once: best %.1f us with %s "
             "(its median %.1f us), %.3f GB/s per rank; best per loop:",
             S, g_world, S, floor_t * 1e6, loop[win].name, fmed[win] * 1e6,
             (double)S / floor_t / 1e9);
      for (int l = 0; l < nl; l++) printf(" %s %.1f us", loop[l].name, fbest[l] * 1e6);
      printf("\n");
      fflush(stdout);
    }
    if (bytes >= max_bytes) break;
  }
  for (int m = 0; m < M_COUNT; m++) {
    if (from_mem_alloc(m)) {
      CHECK(mpg_ctx_mem_free(ctx, bufs[m].send));
      CHECK(mpg_ctx_mem_free(ctx, bufs[m].recv));
    } else {
      free(bufs[m].send);
      free(bufs[m].recv);
    }
  }
  free(cnt);
  free(dsp);
  free(icnt);
  free(idsp);
  free(blk);
  free(fblk);
  free(fsrc);
  free(fdst);
  mpg_ctx_destroy(ctx);
  mpg_mesh_destroy(mesh);
  MPI_Finalize();
  return 0;
}
