/* The sync policy under real MPI processes: mpirun starts
 * sync_mpi_worker (MESHPG_SYNC_MPI_WORKER, set by meson), which runs the
 * scenarios of sync_scenarios.h and the shard cases of shard_check.h on the
 * MPI backend, the timeout path, and
 * (under valgrind) checks that the sync module leaks nothing. */
#include <string.h>

#include "../support/mpirun_util.h"

/* mpirun -np N [prefix] sync_mpi_worker ARGS; exit 0 and every rank's OK
 * (mpirun_ok).  The output is in `out`. */
static void run_worker(int np, const char *prefix, const char *args, int limit_s) {
  mpirun_ok(&(mpirun_job){.np = np, .worker = env_program("MESHPG_SYNC_MPI_WORKER"),
                          .args = args, .limit_s = limit_s, .prefix = prefix});
}

Test(sync_mpi, scenarios_4_ranks, .timeout = 400) { run_worker(4, "", "all", 380); }

Test(sync_mpi, scenarios_8_ranks, .timeout = 600) { run_worker(8, "", "all", 580); }

/* Pipeline stages with different params on random meshes (issue 20,
 * sync_scenarios.h: sc_build_random), as real processes. */
Test(sync_mpi, pipeline_stages_with_different_params_4_ranks, .timeout = 300) {
  run_worker(4, "", "pp_random:1 pp_random:2 pp_random:3 pp_random:4 pp_random:5 pp_random:6",
             280);
}
Test(sync_mpi, pipeline_stages_with_different_params_8_ranks, .timeout = 400) {
  run_worker(8, "", "pp_random:7 pp_random:8 pp_random:9 pp_random:10 pp_random:11", 380);
}

/* Shard mode on real processes: owned gradient values, owned ranges that
 * partition every param over each shard group, gathered params. */
Test(sync_mpi, shard_4_ranks, .timeout = 300) { run_worker(4, "", "shard", 280); }

Test(sync_mpi, shard_8_ranks, .timeout = 400) {
  run_worker(8, "", "shard", 380);
  out_has("shard case shard_hsdp");
}

Test(sync_mpi, timeout_invalidates_the_step, .timeout = 120) {
  double t0 = now_s();
  run_worker(4, "", "timeout", 100);
  cr_assert_lt(now_s() - t0, 60.0, "the timeout job took %.1f s\n%s", now_s() - t0, out);
  out_has("after");
}

Test(sync_mpi, valgrind_no_sync_leaks, .timeout = 600) {
  const char *prefix = valgrind_prefix(); /* mpirun_util.h */
  run_worker(4, prefix, "dp_cp_default sp_norm tied_pp2 dtypes", 580);
  out_lacks("definitely lost");
  run_worker(4, prefix, "shard", 300); /* the shard mode's buffers and gathers */
  out_lacks("definitely lost");
}
