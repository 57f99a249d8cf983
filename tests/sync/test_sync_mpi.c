/* The sync policy under real MPI processes: mpirun starts
 * sync_mpi_worker (MESHPG_SYNC_MPI_WORKER, set by meson), which runs the
 * scenarios of sync_scenarios.h and the shard cases of shard_check.h on the
 * MPI backend, the timeout path, and
 * (under valgrind) checks that the sync module leaks nothing. */
#include <string.h>

#include "../support/mpirun_util.h"

static const char *worker(void) { return env_program("MESHPG_SYNC_MPI_WORKER"); }

/* mpirun -np N [prefix] worker ARGS; expect exit 0 and every rank's OK. */
static void run_worker(int np, const char *prefix, const char *args, double limit_s) {
  char cmd[2048], mode[64];
  snprintf(cmd, sizeof cmd, "timeout -k 5 %d " MPIRUN "-np %d %s '%s' %s", (int)limit_s, np,
           prefix, worker(), args);
  sscanf(args, "%63s", mode);
  double secs = 0;
  int rc = run(cmd, &secs);
  cr_log_info("%s: exit %d after %.2f s", cmd, rc, secs);
  cr_assert_eq(rc, 0, "%s\nexit code %d after %.2f s; output:\n%s", cmd, rc, secs, out);
  for (int r = 0; r < np; r++) {
    char ok[96];
    snprintf(ok, sizeof ok, "OK %s rank %d", mode, r);
    cr_assert(strstr(out, ok), "%s\nno \"%s\" line; output:\n%s", cmd, ok, out);
  }
  cr_assert_null(strstr(out, "FAIL "), "%s\noutput:\n%s", cmd, out);
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
  cr_assert(strstr(out, "shard case shard_hsdp"), "%s", out);
}

Test(sync_mpi, timeout_invalidates_the_step, .timeout = 120) {
  double t0 = now_s();
  run_worker(4, "", "timeout", 100);
  cr_assert_lt(now_s() - t0, 60.0, "the timeout job took %.1f s\n%s", now_s() - t0, out);
  cr_assert(strstr(out, "after"), "%s", out);
}

Test(sync_mpi, valgrind_no_sync_leaks, .timeout = 600) {
  if (getenv("MESHPG_SANITIZER"))
    cr_skip_test("a sanitizer build (-Db_sanitize=%s): valgrind cannot run it",
                 getenv("MESHPG_SANITIZER"));
  if (system("command -v valgrind >/dev/null 2>&1") != 0) cr_skip_test("valgrind is not installed");
  const char *data = getenv("MESHPG_TEST_DATA");
  cr_assert_not_null(data, "MESHPG_TEST_DATA is not set (run through meson test)");
  char prefix[1024];
  snprintf(prefix, sizeof prefix,
           "valgrind -q --error-exitcode=3 --leak-check=full --num-callers=50 "
           "--errors-for-leak-kinds=definite --show-leak-kinds=definite "
           "--suppressions=/usr/share/openmpi/openmpi-valgrind.supp "
           "--suppressions='%s/groups/openmpi.supp'",
           data);
  run_worker(4, prefix, "dp_cp_default sp_norm tied_pp2 dtypes", 580);
  cr_assert_null(strstr(out, "definitely lost"), "%s", out);
  run_worker(4, prefix, "shard", 300); /* the shard mode's buffers and gathers */
  cr_assert_null(strstr(out, "definitely lost"), "%s", out);
}
