/* The README's first program: each rank of a dp=-1,tp=2 mesh sums the
 * ranks of its tp group.  Start it with a launcher, one process per rank:
 *   mpirun --oversubscribe -np 4 ./hello   (as root: add --allow-run-as-root;
 *   --oversubscribe: more ranks than cores) */
#include <meshpg.h>
#include <stdio.h>

int main(void) {
  mpg_launch launch = MPG_LAUNCH_INIT; /* OMPI_*, PMI_*, SLURM_*, RANK/WORLD_SIZE */
  if (mpg_launch_from_env(&launch) != MPG_OK) {
    fprintf(stderr, "hello: %s\n", mpg_last_error());
    return 2;
  }
  if (launch.world_size < 1) {
    fprintf(stderr, "hello: no launcher found: start me with mpirun --oversubscribe "
                    "-np 4 ./hello (or srun)\n");
    return 2;
  }
  mpg_spec spec = MPG_SPEC_INIT; /* tp=2 innermost, dp takes the rest */
  mpg_mesh *mesh = NULL;
  mpg_ctx *ctx = NULL;
  mpg_group *tp = NULL;
  mpg_init_opts opts = MPG_INIT_OPTS_INIT; /* rank, world: from the launcher */
  opts.backend.name = MPG_BACKEND_MPI;     /* one process per rank */
  if (mpg_spec_set_mesh(&spec, "dp=-1,tp=2") != MPG_OK ||
      mpg_mesh_create(&spec, launch.world_size, &mesh) != MPG_OK ||
      mpg_ctx_create(mesh, &opts, &ctx) != MPG_OK ||
      mpg_ctx_group(ctx, "tp", &tp) != MPG_OK) {
    fprintf(stderr, "hello: %s\n", mpg_last_error());
    mpg_mesh_destroy(mesh);
    return 1;
  }
  float mine = (float)launch.rank, sum = 0; /* sum the ranks of this tp group */
  mpg_status st = mpg_all_reduce(tp, &mine, &sum, 1, MPG_F32, MPG_OP_SUM, NULL, NULL);
  printf("rank %d of %d (%s): tp position %d of %d, sum %g\n", launch.rank,
         launch.world_size, launch.source, mpg_group_position(tp), mpg_group_size(tp), sum);
  mpg_ctx_destroy(ctx);
  mpg_mesh_destroy(mesh);
  return st == MPG_OK ? 0 : 1;
}
