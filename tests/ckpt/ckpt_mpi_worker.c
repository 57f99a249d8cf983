/* One MPI process of the checkpoint tests, started by mpirun from
 * test_ckpt_mpi.c.  The rank and world size come from the Open MPI
 * environment.
 *
 *   ckpt_mpi_worker save|save-async|load ROOT WSAVE WLOAD VERSION SEED...
 *
 * For each SEED, the case ck_case_make(SEED, WSAVE, WLOAD, 1) of
 * ckpt_check.h: `save` writes it under its save mesh (WSAVE ranks) into
 * ROOT/ckSEED with values VERSION at step SEED; `load` reads ROOT/ckSEED
 * under its load mesh (WLOAD ranks) into zeroed buffers and checks every
 * element, the guards and the step.  `save-async` saves with opts.async
 * and changes every buffer as soon as save returns, before
 * mpg_ckpt_wait: the checkpoint must hold the values of the call.  One context per seed: MPI is
 * initialised here.
 *
 * Prints "OK <mode> rank R" on success, "FAIL <mode> rank R: ..." lines
 * otherwise; exit code 0 / 1. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt_check.h"

static int run_seed(const char *mode, const char *root, int ws, int wl, int version,
                    unsigned seed, int rank, int world) {
  static ck_case c;
  static ck_job j;
  char dir[4200];
  int which = strcmp(mode, "load") == 0;
  ck_case_make(&c, seed, ws, wl, 1);
  if (c.mesh[which].world != world) {
    printf("FAIL %s rank %d: case %u wants %d ranks, this job has %d\n", mode, rank, seed,
           c.mesh[which].world, world);
    return 1;
  }
  snprintf(dir, sizeof dir, "%s/ck%u", root, seed);
  memset(&j, 0, sizeof j);
  j.c = &c;
  j.which = which;
  j.dir = dir;
  j.version = version;
  j.step = (long)seed;
  j.async = strcmp(mode, "save-async") == 0;
  mpg_init_opts opts = MPG_INIT_OPTS_INIT;
  opts.backend.name = MPG_BACKEND_MPI;
  opts.backend.timeout_s = 60;
  opts.rank = rank;
  opts.world_size = world;
  if (ck_job_rank(&opts, &j) != MPG_OK) {
    printf("FAIL %s rank %d: case %u: %s\n", mode, rank, seed, j.msg[rank]);
    return 1;
  }
  if (rank == 0) {
    char desc[4096];
    ck_mesh_describe(&c, &c.mesh[which], desc, sizeof desc);
    printf("%s case %u, %.3f s: %s\n", mode, seed, j.secs[0], desc);
  }
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 7 ||
      (strcmp(argv[1], "save") && strcmp(argv[1], "save-async") && strcmp(argv[1], "load"))) {
    printf("usage: ckpt_mpi_worker save|save-async|load ROOT WSAVE WLOAD VERSION SEED...\n");
    return 2;
  }
  mpg_launch env = MPG_LAUNCH_INIT;
  if (mpg_launch_from_env(&env) != MPG_OK || env.world_size < 1) {
    printf("FAIL %s rank ?: no MPI launch environment: %s\n", argv[1], mpg_last_error());
    return 1;
  }
  if (env.world_size > CK_MAX_RANKS) {
    printf("FAIL %s rank %d: at most %d ranks\n", argv[1], env.rank, CK_MAX_RANKS);
    return 1;
  }
  setvbuf(stdout, NULL, _IOLBF, 0);
  int provided, failures = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int ws = atoi(argv[3]), wl = atoi(argv[4]), version = atoi(argv[5]);
  for (int k = 6; k < argc; k++)
    failures += run_seed(argv[1], argv[2], ws, wl, version, (unsigned)strtoul(argv[k], NULL, 10),
                         env.rank, env.world_size);
  MPI_Finalize();
  if (!failures) printf("OK %s rank %d\n", argv[1], env.rank);
  fflush(stdout);
  return failures ? 1 : 0;
}
