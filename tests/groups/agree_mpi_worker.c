/* mpirun worker of tests/groups/test_agree.c: ranks that disagree,
 * as real processes, each with its own environment (issue 29).
 *
 *   agree_mpi_worker split K DIMS_A X_A DIMS_B X_B
 *       world ranks below K build job A (mesh DIMS_A, flattened set X =
 *       X_A, "-" for none), the others job B; one mpg_ctx_create.
 *   agree_mpi_worker random N SEED
 *       N cases of tests/groups/agree_cases.h over this world, one
 *       mpg_ctx_create each, one after another in this process.
 *   agree_mpi_worker plain
 *       mesh dp=-1, one mpg_ctx_create (the environment is what differs:
 *       mpirun's MPMD form gives each rank its own -x variables).
 *
 * Every create runs after an MPI_Barrier, so that its time counts from
 * the last rank's arrival.  Rank 0 prints one line per rank and create:
 *   RESULT rank R case I status NAME secs S msg MESSAGE
 * and, for a create that succeeded, runs an all-gather over the first dim
 * set sized by this rank's own mesh (under ASan, a write past it would
 * show).  Exit 0 when it ran (the test judges the lines; worker_main.h). */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "meshpg.h"
#include "agree_cases.h"
#include "../support/clock.h"
#include "../support/worker_main.h"

#define LINE 1200

static int g_world;

static void one_create(int i, const agree_job *job) {
  mpg_mesh *mesh = NULL;
  mpg_status st = agree_build(job, g_world, &mesh);
  mpg_init_opts opts = MPG_INIT_OPTS_INIT;
  opts.backend.name = MPG_BACKEND_MPI;
  opts.backend.timeout_s = 60.0; /* far beyond the promise: waiting it out would show */
  mpg_ctx *ctx = NULL;
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = now_s();
  if (!st) st = mpg_ctx_create(mesh, &opts, &ctx);
  double secs = now_s() - t0;
  char msg[1024];
  snprintf(msg, sizeof msg, "%s", st ? mpg_last_error() : "");
  for (char *c = msg; *c; c++)
    if (*c == '\n') *c = ' ';
  if (!st) agree_probe(ctx);
  mpg_mesh_destroy(mesh);
  /* Rank 0 prints every rank's line (lines of several processes may be
   * cut and interleaved on mpirun's output). */
  char line[LINE], *all = g_rank == 0 ? malloc((size_t)g_world * LINE) : NULL;
  snprintf(line, sizeof line, "RESULT rank %d case %d status %s secs %.3f msg %s", g_rank, i,
           mpg_status_name(st), secs, msg);
  MPI_Gather(line, LINE, MPI_CHAR, all, LINE, MPI_CHAR, 0, MPI_COMM_WORLD);
  for (int r = 0; all && r < g_world; r++) printf("%s\n", all + (size_t)r * LINE);
  fflush(stdout);
  free(all);
}

static void job_from(const char *dims, const char *x, agree_job *j) {
  memset(j, 0, sizeof *j);
  snprintf(j->dims, sizeof j->dims, "%s", dims);
  if (strcmp(x, "-")) snprintf(j->flatten[0], sizeof j->flatten[0], "%s", x);
}

static int run_split(worker *w) {
  agree_job j;
  g_world = w->world;
  int b = w->rank >= atoi(w->argv[0]);
  job_from(w->argv[b ? 3 : 1], w->argv[b ? 4 : 2], &j);
  one_create(0, &j);
  return 0;
}

static int run_random(worker *w) {
  int n = atoi(w->argv[0]);
  uint64_t seed = strtoull(w->argv[1], NULL, 10);
  g_world = w->world;
  for (int i = 0; i < n; i++) {
    agree_case c;
    agree_make_case(seed, i, g_world, &c);
    one_create(i, &c.job[c.uses_b[g_rank]]);
  }
  return 0;
}

static int run_plain(worker *w) {
  agree_job j;
  g_world = w->world;
  job_from("dp=-1", "-", &j);
  one_create(0, &j);
  return 0;
}

static const worker_case cases[] = {
    {"split", "K DIMS_A X_A DIMS_B X_B", 5, 5, run_split, WK_MPI | WK_OWN_LINES},
    {"random", "N SEED", 2, 2, run_random, WK_MPI | WK_OWN_LINES},
    {"plain", "", 0, 0, run_plain, WK_MPI | WK_OWN_LINES},
};
WORKER_MAIN(cases)
