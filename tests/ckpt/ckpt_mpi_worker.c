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
 * otherwise; exit code 0 / 1 (worker_main.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt_check.h"
#include "worker_main.h"

static void run_seed(const worker *w, int ws, int wl, int version, unsigned seed) {
  static ck_case c;
  static ck_job j;
  char dir[4200];
  int which = strcmp(w->mode, "load") == 0;
  ck_case_make(&c, seed, ws, wl, 1);
  if (c.mesh[which].world != w->world) {
    fail("case %u wants %d ranks, this job has %d", seed, c.mesh[which].world, w->world);
    return;
  }
  snprintf(dir, sizeof dir, "%s/ck%u", w->argv[0], seed);
  memset(&j, 0, sizeof j);
  j.c = &c;
  j.which = which;
  j.dir = dir;
  j.version = version;
  j.step = (long)seed;
  j.async = strcmp(w->mode, "save-async") == 0;
  if (ck_job_rank(&w->opts, &j) != MPG_OK) {
    fail("case %u: %s", seed, j.msg[w->rank]);
    return;
  }
  if (w->rank == 0) {
    char desc[4096];
    ck_mesh_describe(&c, &c.mesh[which], desc, sizeof desc);
    printf("%s case %u, %.3f s: %s\n", w->mode, seed, j.secs[0], desc);
  }
}

/* One context per seed: MPI is initialised here (WK_MPI). */
static int run_seeds(worker *w) {
  if (w->world > CK_MAX_RANKS) {
    fail("at most %d ranks", CK_MAX_RANKS);
    return 0;
  }
  int ws = atoi(w->argv[1]), wl = atoi(w->argv[2]), version = atoi(w->argv[3]);
  for (int k = 4; k < w->argc; k++)
    run_seed(w, ws, wl, version, (unsigned)strtoul(w->argv[k], NULL, 10));
  return 0;
}

#define CK_ARGS "ROOT WSAVE WLOAD VERSION SEED..."
static const worker_case cases[] = {
    {"save", CK_ARGS, 5, -1, run_seeds, WK_MPI},
    {"save-async", CK_ARGS, 5, -1, run_seeds, WK_MPI},
    {"load", CK_ARGS, 5, -1, run_seeds, WK_MPI},
};
WORKER_MAIN(cases)
