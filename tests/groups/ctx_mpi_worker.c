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
 * success (worker_main.h). */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "meshpg.h"
#include "../support/mesh_util.h"
#include "../support/worker_main.h"

/* An all-reduce of 1 over every dim set counts each group's members. */
static void count_members(mpg_ctx *ctx, const mpg_mesh *mesh) {
  for (int s = 0; s < mpg_mesh_num_dimsets(mesh); s++) {
    mpg_group *g = NULL;
    int32_t one = 1, n = 0;
    mpg_status st = mpg_ctx_group_at(ctx, s, &g);
    if (!st) st = mpg_all_reduce(g, &one, &n, 1, MPG_I32, MPG_OP_SUM, NULL, NULL);
    if (st) fail("dim set %d: %s: %s", s, mpg_status_name(st), mpg_last_error());
    else if (n != mpg_group_size(g))
      fail("group %s: %d members counted, size %d", mpg_group_name(g), n, mpg_group_size(g));
  }
}

/* The checks of mode place on a context made with opts.placement; 1 when
 * a call failed (the rest skipped). */
static int check_place(worker *w, mpg_ctx *ctx, int nodes, int node) {
  if (mpg_ctx_launcher_rank(ctx) != g_rank) fail("launcher rank %d", mpg_ctx_launcher_rank(ctx));
  if (mpg_ctx_num_nodes(ctx) != nodes) fail("%d nodes seen", mpg_ctx_num_nodes(ctx));
  char inner[64];
  snprintf(inner, sizeof inner, "%s", strcmp(w->argv[3], "-") ? w->argv[3] : "");
  char *save = NULL;
  for (char *name = strtok_r(inner, ",", &save); name; name = strtok_r(NULL, ",", &save)) {
    mpg_group *g = NULL;
    int32_t mine = node, got[64];
    TRY(mpg_ctx_group(ctx, name, &g));
    TRY(mpg_all_gather(g, &mine, got, 1, MPG_I32, NULL, NULL));
    for (int i = 0; i < mpg_group_size(g); i++)
      if (got[i] != node)
        fail("group %s: member %d is on node %d, I am on %d", name, i, got[i], node);
  }
  mpg_group *wg = NULL;
  TRY(mpg_ctx_group(ctx, "world", &wg));
  if (mpg_group_position(wg) != mpg_ctx_rank(ctx))
    fail("world position %d, mesh rank %d", mpg_group_position(wg), mpg_ctx_rank(ctx));
  /* The mesh ranks are a permutation of the world. */
  int32_t me = mpg_ctx_rank(ctx), all[256];
  TRY(mpg_all_gather(wg, &me, all, 1, MPG_I32, NULL, NULL));
  for (int i = 0; i < w->world; i++)
    if (all[i] != i) fail("world position %d holds mesh rank %d", i, all[i]);
  return 0;
done:
  return 1;
}

/* Both modes: argv[0] the mesh; place: NODES CYCLIC INNER. */
static int run_mode(worker *w) {
  int place = strcmp(w->mode, "place") == 0;
  mpg_mesh *mesh = NULL;
  mpg_ctx *ctx = NULL;
  char host[64];
  int nodes = place ? atoi(w->argv[1]) : 1, cyclic = place ? atoi(w->argv[2]) : 0;
  int node = cyclic ? g_rank % nodes : g_rank / (w->world / nodes);
  TRY(mesh_build(w->argv[0], NULL, w->world, &mesh));
  mpg_init_opts opts = w->opts;
  opts.backend.timeout_s = 30;
  if (place) {
    snprintf(host, sizeof host, "node%d:boot", node);
    opts.host_id = host;
    opts.placement = 1;
  } else {
    opts.backend.lazy_groups = 1;
  }
  TRY(mpg_ctx_create(mesh, &opts, &ctx));
  if (place) {
    if (check_place(w, ctx, nodes, node)) goto done;
  } else {
    mpg_group *g = NULL;
    TRY(mpg_ctx_group(ctx, g_rank % 2 ? "dp" : "tp", &g));
  }
  count_members(ctx, mesh);
done:
  if (ctx) {
    mpg_status st = mpg_ctx_destroy(ctx);
    if (st) fail("mpg_ctx_destroy: %s: %s", mpg_status_name(st), mpg_last_error());
  }
  mpg_mesh_destroy(mesh);
  return 0;
}

static const worker_case cases[] = {
    {"place", "MESH NODES CYCLIC INNER", 4, 4, run_mode, WK_MPI},
    {"lazy", "MESH", 1, 1, run_mode, WK_MPI},
};
WORKER_MAIN(cases)
