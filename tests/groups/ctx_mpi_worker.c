/* mpirun worker of tests/groups/test_ctx_placement.c: context creation on
 * the MPI backend with real processes.
 *
 *   ctx_mpi_worker place MESH NODES CYCLIC INNER
 *       opts.placement with simulated nodes (host id "nodeN": launcher
 *       ranks dealt in blocks, or round-robin when CYCLIC is 1; NODES = 1
 *       is one node); checks that every rank came up, that the groups of
 *       the dim sets in INNER (comma-separated, "-" for none) stay inside
 *       one node, that the world is ordered by mesh rank, and that an
 *       all-reduce over every dim set counts its members.
 *   ctx_mpi_worker lazy MESH
 *       lazy groups whose first use differs by rank: even ranks ask for
 *       "tp" first, odd ranks for "dp"; both are then used by every rank.
 *
 * Prints "OK <mode> rank R" per rank, or "FAIL ..." lines; exit 0 on
 * success. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "meshpg.h"

static int g_rank = -1, g_failed = 0;

#define FAIL(...)                                        \
  do {                                                   \
    printf("FAIL rank %d: ", g_rank);                    \
    printf(__VA_ARGS__);                                 \
    printf("\n");                                        \
    fflush(stdout);                                      \
    g_failed = 1;                                        \
  } while (0)

#define CALL(expr)                                                          \
  do {                                                                      \
    mpg_status st_ = (expr);                                                \
    if (st_) {                                                              \
      FAIL("%s: %s: %s", #expr, mpg_status_name(st_), mpg_last_error());    \
      goto out;                                                             \
    }                                                                       \
  } while (0)

/* An all-reduce of 1 over every dim set counts each group's members. */
static void count_members(mpg_ctx *ctx, const mpg_mesh *mesh) {
  for (int s = 0; s < mpg_mesh_num_dimsets(mesh); s++) {
    mpg_group *g = NULL;
    int32_t one = 1, n = 0;
    mpg_status st = mpg_ctx_group_at(ctx, s, &g);
    if (!st) st = mpg_all_reduce(g, &one, &n, 1, MPG_I32, MPG_OP_SUM, NULL, NULL);
    if (st) FAIL("dim set %d: %s: %s", s, mpg_status_name(st), mpg_last_error());
    else if (n != mpg_group_size(g))
      FAIL("group %s: %d members counted, size %d", mpg_group_name(g), n, mpg_group_size(g));
  }
}

int main(int argc, char **argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  int world = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const char *mode = argc > 1 ? argv[1] : "";
  int place = strcmp(mode, "place") == 0, lazy = strcmp(mode, "lazy") == 0;
  if ((!place || argc != 6) && (!lazy || argc != 3)) {
    FAIL("usage: ctx_mpi_worker place MESH NODES CYCLIC INNER | lazy MESH");
    MPI_Finalize();
    return 2;
  }
  mpg_spec spec = MPG_SPEC_INIT;
  mpg_mesh *mesh = NULL;
  mpg_ctx *ctx = NULL;
  char host[64];
  int nodes = place ? atoi(argv[3]) : 1, cyclic = place ? atoi(argv[4]) : 0;
  int node = cyclic ? g_rank % nodes : g_rank / (world / nodes);
  CALL(mpg_spec_init(&spec));
  CALL(mpg_spec_set_mesh(&spec, argv[2]));
  CALL(mpg_mesh_create(&spec, world, &mesh));
  mpg_init_opts opts = MPG_INIT_OPTS_INIT;
  opts.backend.name = MPG_BACKEND_MPI;
  opts.backend.timeout_s = 30;
  if (place) {
    snprintf(host, sizeof host, "node%d:boot", node);
    opts.host_id = host;
    opts.placement = 1;
  } else {
    opts.backend.lazy_groups = 1;
  }
  CALL(mpg_ctx_create(mesh, &opts, &ctx));
  if (place) {
    if (mpg_ctx_launcher_rank(ctx) != g_rank) FAIL("launcher rank %d", mpg_ctx_launcher_rank(ctx));
    if (mpg_ctx_num_nodes(ctx) != nodes) FAIL("%d nodes seen", mpg_ctx_num_nodes(ctx));
    char inner[64];
    snprintf(inner, sizeof inner, "%s", strcmp(argv[5], "-") ? argv[5] : "");
    char *save = NULL;
    for (char *name = strtok_r(inner, ",", &save); name; name = strtok_r(NULL, ",", &save)) {
      mpg_group *g = NULL;
      int32_t mine = node, got[64];
      CALL(mpg_ctx_group(ctx, name, &g));
      CALL(mpg_all_gather(g, &mine, got, 1, MPG_I32, NULL, NULL));
      for (int i = 0; i < mpg_group_size(g); i++)
        if (got[i] != node) FAIL("group %s: member %d is on node %d, I am on %d", name, i, got[i], node);
    }
    mpg_group *w = NULL;
    CALL(mpg_ctx_group(ctx, "world", &w));
    if (mpg_group_position(w) != mpg_ctx_rank(ctx))
      FAIL("world position %d, mesh rank %d", mpg_group_position(w), mpg_ctx_rank(ctx));
    /* The mesh ranks are a permutation of the world. */
    int32_t me = mpg_ctx_rank(ctx), all[256];
    CALL(mpg_all_gather(w, &me, all, 1, MPG_I32, NULL, NULL));
    for (int i = 0; i < world; i++)
      if (all[i] != i) FAIL("world position %d holds mesh rank %d", i, all[i]);
  } else {
    mpg_group *g = NULL;
    CALL(mpg_ctx_group(ctx, g_rank % 2 ? "dp" : "tp", &g));
  }
  count_members(ctx, mesh);
out:
  if (ctx) {
    mpg_status st = mpg_ctx_destroy(ctx);
    if (st) FAIL("mpg_ctx_destroy: %s: %s", mpg_status_name(st), mpg_last_error());
  }
  mpg_mesh_destroy(mesh);
  if (!g_failed) printf("OK %s rank %d\n", mode, g_rank);
  fflush(stdout);
  MPI_Finalize();
  return g_failed;
}
