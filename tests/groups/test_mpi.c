/* The Open MPI backend, end to end: real processes started by mpirun run
 * tests/groups/mpi_worker.c, which checks every collective on every group
 * of the mesh, the timeout and abort path, and (under valgrind) that
 * meshpg leaks nothing.  MESHPG_MPI_WORKER is set by meson. */
#include <string.h>

#include "../support/mpirun_util.h"

static const char *worker(void) { return env_program("MESHPG_MPI_WORKER"); }

/* mpirun -np N [extra] worker mode; expect exit 0 and every rank's OK. */
static void run_worker(int np, const char *extra, const char *prefix,
                       const char *mode, double limit_s) {
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "timeout -k 5 %d " MPIRUN "%s -np %d %s '%s' %s",
           (int)limit_s, extra, np, prefix, worker(), mode);
  double secs = 0;
  int rc = run(cmd, &secs);
  cr_log_info("%s: exit %d after %.2f s", cmd, rc, secs);
  cr_assert_eq(rc, 0, "%s\nexit code %d after %.2f s; output:\n%s", cmd, rc, secs, out);
  for (int r = 0; r < np; r++) {
    char ok[64];
    snprintf(ok, sizeof ok, "OK %s rank %d", mode, r);
    cr_assert(strstr(out, ok), "%s\nno \"%s\" line; output:\n%s", cmd, ok, out);
  }
  cr_assert_null(strstr(out, "FAIL "), "%s\noutput:\n%s", cmd, out);
}

Test(mpi, collectives_4_ranks, .timeout = 300) {
  run_worker(4, "", "", "collectives", 280);
}

Test(mpi, collectives_8_ranks_design_mesh, .timeout = 300) {
  run_worker(8, "", "", "collectives", 280);
}

/* A chunk limit of 5 elements sends every operation through the paths
 * that split counts above INT_MAX (chunked all_reduce, broadcast, p2p;
 * all_gather by broadcasts; reduce_scatter by reduces). */
Test(mpi, collectives_chunked_large_count_paths, .timeout = 300) {
  run_worker(4, "-x MESHPG_MPI_MAX_COUNT=5", "", "collectives", 280);
}

/* Pipelined all-reduces (pieces of 64 bytes; two in flight per
 * communicator when 8 ranks outnumber the cores), with many async
 * operations outstanding at once. */
Test(mpi, collectives_pipelined_all_reduce, .timeout = 300) {
  run_worker(8, "-x MESHPG_MPI_PIECE_BYTES=64", "", "collectives", 280);
}

/* The widest window (8 pieces in flight, the default when every rank has
 * a core) and the narrowest (1), forced whatever the cores. */
Test(mpi, collectives_pipelined_window_8, .timeout = 300) {
  run_worker(4, "-x MESHPG_MPI_PIECE_BYTES=64 -x MESHPG_MPI_WINDOW=8", "", "collectives",
             280);
}

Test(mpi, collectives_pipelined_window_1, .timeout = 300) {
  run_worker(2, "-x MESHPG_MPI_PIECE_BYTES=64 -x MESHPG_MPI_WINDOW=1", "", "collectives",
             280);
}

/* The progress thread: pipelined async all-reduces finish while every
 * caller sleeps; with MESHPG_MPI_PROGRESS=off they cannot. */
Test(mpi, progress_thread_finishes_work_while_caller_sleeps, .timeout = 120) {
  run_worker(4, "", "", "progress", 100);
  cr_assert(strstr(out, "(progress thread on)"), "%s", out);
}

Test(mpi, progress_off_leaves_work_until_a_call, .timeout = 120) {
  run_worker(4, "-x MESHPG_MPI_PROGRESS=off", "", "progress", 100);
  cr_assert(strstr(out, "(progress thread off)"), "%s", out);
}

Test(mpi, waiting_for_a_late_peer_does_not_spin, .timeout = 120) {
  run_worker(4, "", "", "idle_cpu", 100);
}

/* opts.mpi_comm: two 2-rank meshes on the halves of a 4-process job. */
Test(mpi, sub_communicator_gives_rank_and_size, .timeout = 120) {
  run_worker(4, "", "", "sub_comm", 100);
}

Test(mpi, progress_env_is_validated, .timeout = 120) {
  run_worker(2, "-x MESHPG_MPI_PROGRESS=sometimes", "", "progress_env", 100);
}

Test(mpi, window_env_is_validated, .timeout = 120) {
  run_worker(2, "-x MESHPG_MPI_WINDOW=9", "", "window_env", 100);
}

Test(mpi, timeout_aborts_and_exits_cleanly, .timeout = 120) {
  double t0 = now_s();
  run_worker(4, "", "", "timeout", 100);
  /* Each waiter checked its own timeout bound; the whole job, start-up
   * included, must not hang either. */
  cr_assert_lt(now_s() - t0, 60.0, "the timeout job took %.1f s\n%s", now_s() - t0, out);
  cr_assert(strstr(out, "ERR_TIMEOUT after"), "%s", out);
}

/* The same with the timed-out all-reduce running as ring pieces (8-byte
 * pieces): abandoned point-to-point steps must not hang MPI_Finalize. */
Test(mpi, timeout_during_a_ring_all_reduce_exits_cleanly, .timeout = 120) {
  double t0 = now_s();
  run_worker(4, "-x MESHPG_MPI_PIECE_BYTES=8", "", "timeout", 100);
  cr_assert_lt(now_s() - t0, 60.0, "the timeout job took %.1f s\n%s", now_s() - t0, out);
  cr_assert(strstr(out, "ERR_TIMEOUT after"), "%s", out);
}

/* mpg_p2p_batch: a 4-stage ring exchanging 64 MiB both ways in one batch
 * (and 1 MiB through a work handle), several operations to one peer in
 * order, a batch of every dtype, a refused batch that posts nothing. */
Test(mpi, p2p_batch_ring_order_and_dtypes, .timeout = 300) {
  run_worker(4, "", "", "p2p_batch", 280);
}

/* A batch whose peer never posts: MPG_ERR_TIMEOUT, the context aborted,
 * and everybody exits cleanly. */
Test(mpi, p2p_batch_absent_peer_times_out, .timeout = 120) {
  double t0 = now_s();
  run_worker(2, "", "", "p2p_timeout", 100);
  cr_assert_lt(now_s() - t0, 60.0, "the timeout job took %.1f s\n%s", now_s() - t0, out);
  cr_assert(strstr(out, "ERR_TIMEOUT after"), "%s", out);
}

/* mpg_all_to_all and mpg_all_to_all_v on every group of the 4- and 8-rank
 * meshes: random uneven counts (zeros included), every dtype, blocking and
 * async, checked byte for byte. */
Test(mpi, all_to_all_4_ranks, .timeout = 300) { run_worker(4, "", "", "all_to_all", 280); }

Test(mpi, all_to_all_8_ranks, .timeout = 300) { run_worker(8, "", "", "all_to_all", 280); }

/* The native all-to-all (one MPI_Ialltoallv) carries the pairs of at most
 * MESHPG_MPI_MAX_COUNT / size elements; larger blocks travel as their own
 * chunked messages in the same request.  40 / 4 = 10: most pairs of the
 * random cases (up to 300 elements) take that path, cut into 40s. */
Test(mpi, all_to_all_large_blocks_as_messages, .timeout = 300) {
  run_worker(4, "-x MESHPG_MPI_MAX_COUNT=40", "", "all_to_all", 280);
}

/* Then a count mismatch between positions 0 and 1 of the world: the
 * counts exchanged first catch it, both members fail with
 * MPG_ERR_INVALID, the others finish, nothing aborts (MPI_COMM_WORLD
 * keeps its fatal handler). */
Test(mpi, all_to_all_count_mismatch_fails_the_pair, .timeout = 300) {
  run_worker(4, "-x MESHPG_TEST_A2A_MISMATCH=1", "", "all_to_all", 280);
  cr_assert(strstr(out, "rank 0: mismatch -> ERR_INVALID") &&
                strstr(out, "rank 1: mismatch -> ERR_INVALID"), "%s", out);
}

/* A member that never arrives: MPG_ERR_TIMEOUT, abort, clean exit. */
Test(mpi, all_to_all_absent_member_times_out, .timeout = 120) {
  double t0 = now_s();
  run_worker(4, "", "", "a2a_timeout", 100);
  cr_assert_lt(now_s() - t0, 60.0, "the timeout job took %.1f s\n%s", now_s() - t0, out);
  cr_assert(strstr(out, "ERR_TIMEOUT after"), "%s", out);
}

/* The same after a first all-to-all, through the group's shared-memory
 * channel (one host): every waiter names the missing member. */
Test(mpi, all_to_all_absent_member_times_out_in_shared_memory, .timeout = 120) {
  double t0 = now_s();
  run_worker(4, "-x MESHPG_TEST_A2A_WARM=1", "", "a2a_timeout", 100);
  cr_assert_lt(now_s() - t0, 60.0, "the timeout job took %.1f s\n%s", now_s() - t0, out);
  cr_assert(strstr(out, "ERR_TIMEOUT after") && strstr(out, "missing position 3 (world rank 3)"),
            "%s", out);
}

/* MESHPG_SHM=0: the backend's all-to-all (counts exchanged, one
 * MPI_Ialltoallv), the same values. */
Test(mpi, all_to_all_4_ranks_without_shared_memory, .timeout = 300) {
  run_worker(4, "-x MESHPG_SHM=0", "", "all_to_all", 280);
}

/* The split's two-phase rendezvous: a rank that arrives after its peers
 * gave up times out too, rather than hanging in MPI_Comm_split. */
Test(mpi, split_timeout_never_hangs, .timeout = 120) {
  run_worker(4, "", "", "split_timeout", 100);
  cr_assert(strstr(out, "(late): ERR_TIMEOUT after"), "%s", out);
}

/* valgrind in front of every rank: definite leaks and memory errors fail
 * the rank with exit code 3.  Open MPI's own suppressions where Debian
 * installs them, then ours (Open MPI internals only: see the file); deep
 * stacks so that the Open MPI frame every suppression keys on is always
 * recorded. */
static const char *valgrind_prefix(void) {
  static char prefix[2048];
  if (getenv("MESHPG_SANITIZER"))
    cr_skip_test("a sanitizer build (-Db_sanitize=%s): valgrind cannot run it",
                 getenv("MESHPG_SANITIZER"));
  if (system("command -v valgrind >/dev/null 2>&1") != 0)
    cr_skip_test("valgrind is not installed");
  const char *data = getenv("MESHPG_TEST_DATA");
  cr_assert_not_null(data, "MESHPG_TEST_DATA is not set (run through meson test)");
  const char *ompi_supp = "/usr/share/openmpi/openmpi-valgrind.supp";
  FILE *f = fopen(ompi_supp, "r");
  if (f) fclose(f);
  snprintf(prefix, sizeof prefix,
           "valgrind -q --error-exitcode=3 --leak-check=full "
           "--errors-for-leak-kinds=definite --show-leak-kinds=definite "
           "--num-callers=50 %s%s%s--suppressions='%s/groups/openmpi.supp'",
           f ? "--suppressions='" : "", f ? ompi_supp : "", f ? "' " : "", data);
  return prefix;
}

Test(mpi, valgrind_no_meshpg_leaks, .timeout = 600) {
  run_worker(4, "", valgrind_prefix(), "collectives", 580);
  cr_assert_null(strstr(out, "definitely lost"), "%s", out);
}

/* The ring pipeline (8-byte pieces: every all-reduce of the worker runs
 * as ring pieces, their arithmetic outside the lock) under valgrind. */
Test(mpi, valgrind_ring_pipeline_is_memory_safe, .timeout = 600) {
  run_worker(4, "-x MESHPG_MPI_PIECE_BYTES=8", valgrind_prefix(), "collectives", 580);
  cr_assert_null(strstr(out, "Invalid "), "%s", out);
  cr_assert_null(strstr(out, "definitely lost"), "%s", out);
}

/* The abort path under valgrind: abandoned requests, the late peer's
 * completion of them inside MPI_Finalize (which must land in meshpg's
 * staging memory, not in the caller's long-gone buffers) and the deferred
 * finalize at exit.  valgrind starts slowly: a 15 s timeout. */
Test(mpi, valgrind_timeout_path_is_memory_safe, .timeout = 600) {
  run_worker(4, "-x MESHPG_TEST_TIMEOUT_S=15", valgrind_prefix(), "timeout", 580);
  cr_assert_null(strstr(out, "Invalid write"), "%s", out);
  cr_assert_null(strstr(out, "definitely lost"), "%s", out);
}

/* The jobs start up to 8 processes each on machines with few cores: run
 * one at a time so that the timing bounds of the timeout tests are not
 * judged under another job's load. */
int main(int argc, char *argv[]) {
  struct criterion_test_set *tests = criterion_initialize();
  criterion_options.jobs = 1;
  int result = 0;
  if (criterion_handle_args(argc, argv, true))
    result = !criterion_run_all_tests(tests);
  criterion_finalize(tests);
  return result;
}
