/* The MPI workers' main: see worker_main.h. */
#include "worker_main.h"

#include <mpi.h>
#include <stdio.h>
#include <string.h>

static const worker_case *find(int argc, char **argv, const worker_case *cases, int ncases) {
  for (int k = 0; k < ncases; k++) {
    const worker_case *c = &cases[k];
    int any = c->mode == NULL;
    if (!any && (argc < 2 || strcmp(argv[1], c->mode))) continue;
    int nargs = argc - 2 + any;
    if (nargs >= c->min_args && (c->max_args < 0 || nargs <= c->max_args)) return c;
  }
  return NULL;
}

static void usage(const char *prog, const worker_case *cases, int ncases) {
  const char *slash = strrchr(prog, '/');
  printf("usage: %s", slash ? slash + 1 : prog);
  for (int k = 0; k < ncases; k++)
    printf("%s%s%s%s", k ? " | " : " ", cases[k].mode ? cases[k].mode : "",
           cases[k].mode && cases[k].usage[0] ? " " : "", cases[k].usage);
  printf("\n");
}

int worker_main(int argc, char **argv, const worker_case *cases, int ncases,
                int (*begin)(worker *w)) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  const worker_case *c = find(argc, argv, cases, ncases);
  if (!c) {
    usage(argv[0], cases, ncases);
    return 2;
  }
  worker w = {argc > 1 ? argv[1] : "", argc - 2 + (c->mode == NULL),
              argv + 2 - (c->mode == NULL), -1, -1, MPG_INIT_OPTS_INIT};
  g_mode = w.mode;
  int own_mpi = (c->flags & (WK_MPI | WK_MPI_SERIALIZED)) != 0;
  if (own_mpi) {
    int provided = 0;
    MPI_Init_thread(&argc, &argv, c->flags & WK_MPI ? MPI_THREAD_MULTIPLE : MPI_THREAD_SERIALIZED,
                    &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &w.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &w.world);
  } else {
    mpg_launch env = MPG_LAUNCH_INIT;
    if (mpg_launch_from_env(&env) != MPG_OK || env.rank < 0 || env.world_size < 1) {
      printf("FAIL %s rank ?: no MPI launch environment (run under mpirun): %s\n", w.mode,
             mpg_last_error());
      return 1;
    }
    w.rank = env.rank;
    w.world = env.world_size;
  }
  g_rank = w.rank;
  w.opts.backend.name = MPG_BACKEND_MPI;
  w.opts.backend.timeout_s = 60;
  w.opts.rank = w.rank;
  w.opts.world_size = w.world;
  int rc = begin ? begin(&w) : 0;
  if (!rc && !failures) rc = c->run(&w);
  if (own_mpi) MPI_Finalize();
  if (c->flags & WK_OWN_LINES) {
    fflush(stdout);
    return rc;
  }
  failures += rc;
  if (failures > WR_MAX_LINES)
    printf("FAIL %s rank %d: %d failures, the first %d shown\n", w.mode, w.rank, failures,
           WR_MAX_LINES);
  if (!failures) printf("OK %s rank %d\n", w.mode, w.rank);
  fflush(stdout);
  return failures ? 1 : 0;
}
