/* One MPI process of test_trace_messages.c's MPI case (issue 46, item 4),
 * under `mpirun -np 4`:  trace_messages_mpi_worker DIR TIMEOUT_S
 *
 * dp=2,tp=2 (tp[1] = world ranks 2 and 3); world rank 2 skips the 8th of
 * its 8 tp all-reduces, then every rank calls a world barrier.  Each rank
 * prints one line, "TMSG R STATUS|MESSAGE" (OK and nothing when all its
 * calls succeeded), and exits 0 (worker_main.h); the dumps go to DIR.  The issue-order
 * checker is off, so that MPI itself meets the skip. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "meshpg.h"
#include "mesh_util.h"
#include "worker_main.h"

static int run_job(worker *w) {
  setenv("MESHPG_CHECK_ORDER", "0", 1);
  mpg_mesh *mesh = NULL;
  mpg_ctx *ctx = NULL;
  mpg_group *tp = NULL, *world = NULL;
  mpg_init_opts opts = w->opts;
  opts.backend.timeout_s = atof(w->argv[1]);
  opts.trace_dir = w->argv[0];
  mpg_status st = mesh_build("dp=2,tp=2", NULL, 4, &mesh);
  if (st == MPG_OK) st = mpg_ctx_create(mesh, &opts, &ctx);
  if (st == MPG_OK) st = mpg_ctx_group(ctx, "tp", &tp);
  if (st == MPG_OK) st = mpg_ctx_group(ctx, "world", &world);
  int me = ctx ? mpg_ctx_rank(ctx) : -1;
  float v[4] = {1, 2, 3, 4};
  for (int k = 1; k <= 8 && st == MPG_OK; k++)
    if (!(me == 2 && k == 8)) st = mpg_all_reduce(tp, v, v, 4, MPG_F32, MPG_OP_SUM, NULL, NULL);
  if (st == MPG_OK) st = mpg_barrier(world, NULL);
  char text[2048] = "";
  if (st != MPG_OK) snprintf(text, sizeof text, "%s", mpg_last_error());
  for (char *c = strchr(text, '\n'); c; c = strchr(c, '\n')) *c = ' ';
  printf("TMSG %d %s|%s\n", me, st == MPG_OK ? "OK" : mpg_status_name(st), text);
  if (ctx) (void)mpg_ctx_destroy(ctx);
  mpg_mesh_destroy(mesh);
  return 0;
}

static const worker_case cases[] = {{NULL, "DIR TIMEOUT_S", 2, 2, run_job, WK_OWN_LINES}};
WORKER_MAIN(cases)
