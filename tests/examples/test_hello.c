/* examples/hello, the README's first program (docs check 'hello' keeps the
 * two the same): under mpirun at worlds 2 and 4 every rank prints the sum of
 * its tp group's ranks; without a launcher it says how to start it and
 * exits with 2. */
#include <string.h>

#include "../support/mpirun_util.h"

Test(hello, no_launcher_says_how_to_start) {
  char cmd[4096];
  snprintf(cmd, sizeof cmd,
           "env -u OMPI_COMM_WORLD_RANK -u OMPI_COMM_WORLD_SIZE -u PMI_RANK -u PMI_SIZE "
           "-u SLURM_PROCID -u SLURM_NTASKS -u RANK -u WORLD_SIZE '%s'",
           env_program("MESHPG_HELLO"));
  int rc = run(cmd, NULL);
  cr_assert_eq(rc, 2, "exit %d:\n%s", rc, out);
  cr_assert(strstr(out, "no launcher found") && strstr(out, "mpirun --oversubscribe -np 4 ./hello"), "%s", out);
}

#if MESHPG_HAVE_MPI
static void world(int np) {
  char cmd[4096];
  snprintf(cmd, sizeof cmd, "timeout -k 5 120 " MPIRUN "-np %d '%s'", np,
           env_program("MESHPG_HELLO"));
  int rc = run(cmd, NULL);
  cr_assert_eq(rc, 0, "np %d: exit %d:\n%s", np, rc, out);
  for (int r = 0; r < np; r++) {
    /* tp pairs (0,1), (2,3): the sum of the pair holding r. */
    int base = r - r % 2;
    char want[128];
    snprintf(want, sizeof want, "rank %d of %d (openmpi): tp position %d of 2, sum %d\n", r, np,
             r % 2, 2 * base + 1);
    cr_assert(strstr(out, want), "np %d: no line \"%s\" in:\n%s", np, want, out);
  }
}

Test(hello, mpirun_world_2, .timeout = 180) { world(2); }
Test(hello, mpirun_world_4, .timeout = 180) { world(4); }
#endif
