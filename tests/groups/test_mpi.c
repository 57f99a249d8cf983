/* The Open MPI backend, end to end: real processes started by mpirun run
 * tests/groups/mpi_worker.c, which checks every collective on every group
 * of the mesh, the timeout and abort path, and (under valgrind) that
 * meshpg leaks nothing.  MESHPG_MPI_WORKER is set by meson. */
#include <string.h>

#include "../support/mpirun_util.h"

/* One job of mpi_worker and what its output must hold: mpirun -np NP
 * [opts] MODE, exit 0 and every rank's OK (mpirun_ok); then the checks. */
typedef struct mpi_job {
  int np;
  const char *opts; /* mpirun options, e.g. "-x MESHPG_SHM=0" */
  const char *mode;
  int limit_s;
  int times_out;        /* the waiters time out: the job ends within 60 s,
                           "ERR_TIMEOUT after" in the output */
  int valgrind;         /* valgrind_prefix() in front of every rank */
  const char *has[3];   /* pieces the output must hold */
  const char *lacks[3]; /* pieces it must not */
} mpi_job;

static void job(const mpi_job *j) {
  double t0 = now_s();
  mpirun_ok(&(mpirun_job){.np = j->np, .worker = env_program("MESHPG_MPI_WORKER"),
                          .args = j->mode, .limit_s = j->limit_s, .opts = j->opts,
                          .prefix = j->valgrind ? valgrind_prefix() : ""});
  if (j->times_out) {
    /* Each waiter checked its own timeout bound; the whole job, start-up
     * included, must not hang either. */
    cr_assert_lt(now_s() - t0, 60.0, "the timeout job took %.1f s\n%s", now_s() - t0, out);
    out_has("ERR_TIMEOUT after");
  }
  for (int k = 0; k < 3 && j->has[k]; k++) out_has(j->has[k]);
  for (int k = 0; k < 3 && j->lacks[k]; k++) out_lacks(j->lacks[k]);
}

/* JOB(np, opts, mode, limit_s[, .has = {...}]) */
#define JOB(np_, opts_, mode_, limit_s_, ...) \
  job(&(mpi_job){.np = np_, .opts = opts_, .mode = mode_, .limit_s = limit_s_, __VA_ARGS__})
/* A job whose waiters time out (limit 100 s); the output also holds the
 * pieces given. */
#define TIMEOUT_JOB(np, opts, mode, ...) \
  JOB(np, opts, mode, 100, .times_out = 1, .has = {__VA_ARGS__})
/* A 4-rank job under valgrind (limit 580 s) whose output lacks the pieces. */
#define VALGRIND_JOB(opts, mode, ...) JOB(4, opts, mode, 580, .valgrind = 1, .lacks = {__VA_ARGS__})

Test(mpi, collectives_4_ranks, .timeout = 300) { JOB(4, "", "collectives", 280); }

Test(mpi, collectives_8_ranks_design_mesh, .timeout = 300) { JOB(8, "", "collectives", 280); }

/* A chunk limit of 5 elements sends every operation through the paths
 * that split counts above INT_MAX (chunked all_reduce, broadcast, p2p;
 * all_gather by broadcasts; reduce_scatter by reduces). */
Test(mpi, collectives_chunked_large_count_paths, .timeout = 300) {
  JOB(4, "-x MESHPG_MPI_MAX_COUNT=5", "collectives", 280);
}

/* Pipelined all-reduces (pieces of 64 bytes; two in flight per
 * communicator when 8 ranks outnumber the cores), with many async
 * operations outstanding at once. */
Test(mpi, collectives_pipelined_all_reduce, .timeout = 300) {
  JOB(8, "-x MESHPG_MPI_PIECE_BYTES=64", "collectives", 280);
}

/* The widest window (8 pieces in flight, the default when every rank has
 * a core) and the narrowest (1), forced whatever the cores. */
Test(mpi, collectives_pipelined_window_8, .timeout = 300) {
  JOB(4, "-x MESHPG_MPI_PIECE_BYTES=64 -x MESHPG_MPI_WINDOW=8", "collectives", 280);
}

Test(mpi, collectives_pipelined_window_1, .timeout = 300) {
  JOB(2, "-x MESHPG_MPI_PIECE_BYTES=64 -x MESHPG_MPI_WINDOW=1", "collectives", 280);
}

/* The progress thread: pipelined async all-reduces finish while every
 * caller sleeps; with MESHPG_MPI_PROGRESS=off they cannot. */
Test(mpi, progress_thread_finishes_work_while_caller_sleeps, .timeout = 120) {
  JOB(4, "", "progress", 100, .has = {"(progress thread on)"});
}

Test(mpi, progress_off_leaves_work_until_a_call, .timeout = 120) {
  JOB(4, "-x MESHPG_MPI_PROGRESS=off", "progress", 100, .has = {"(progress thread off)"});
}

Test(mpi, waiting_for_a_late_peer_does_not_spin, .timeout = 120) { JOB(4, "", "idle_cpu", 100); }

/* opts.mpi_comm: two 2-rank meshes on the halves of a 4-process job. */
Test(mpi, sub_communicator_gives_rank_and_size, .timeout = 120) { JOB(4, "", "sub_comm", 100); }

Test(mpi, progress_env_is_validated, .timeout = 120) {
  JOB(2, "-x MESHPG_MPI_PROGRESS=sometimes", "progress_env", 100);
}

Test(mpi, window_env_is_validated, .timeout = 120) {
  JOB(2, "-x MESHPG_MPI_WINDOW=9", "window_env", 100);
}

Test(mpi, timeout_aborts_and_exits_cleanly, .timeout = 120) { TIMEOUT_JOB(4, "", "timeout", NULL); }

/* The same with the timed-out all-reduce running as ring pieces (8-byte
 * pieces): abandoned point-to-point steps must not hang MPI_Finalize. */
Test(mpi, timeout_during_a_ring_all_reduce_exits_cleanly, .timeout = 120) {
  TIMEOUT_JOB(4, "-x MESHPG_MPI_PIECE_BYTES=8", "timeout", NULL);
}

/* mpg_p2p_batch: a 4-stage ring exchanging 64 MiB both ways in one batch
 * (and 1 MiB through a work handle), several operations to one peer in
 * order, a batch of every dtype, a refused batch that posts nothing. */
Test(mpi, p2p_batch_ring_order_and_dtypes, .timeout = 300) { JOB(4, "", "p2p_batch", 280); }

/* A batch whose peer never posts: MPG_ERR_TIMEOUT, the context aborted,
 * and everybody exits cleanly. */
Test(mpi, p2p_batch_absent_peer_times_out, .timeout = 120) {
  TIMEOUT_JOB(2, "", "p2p_timeout", NULL);
}

/* mpg_all_to_all and mpg_all_to_all_v on every group of the 4- and 8-rank
 * meshes: random uneven counts (zeros included), every dtype, blocking and
 * async, checked byte for byte. */
Test(mpi, all_to_all_4_ranks, .timeout = 300) { JOB(4, "", "all_to_all", 280); }

Test(mpi, all_to_all_8_ranks, .timeout = 300) { JOB(8, "", "all_to_all", 280); }

/* The native all-to-all (one MPI_Ialltoallv) carries the pairs of at most
 * MESHPG_MPI_MAX_COUNT / size elements; larger blocks travel as their own
 * chunked messages in the same request.  40 / 4 = 10: most pairs of the
 * random cases (up to 300 elements) take that path, cut into 40s. */
Test(mpi, all_to_all_large_blocks_as_messages, .timeout = 300) {
  JOB(4, "-x MESHPG_MPI_MAX_COUNT=40", "all_to_all", 280);
}

/* Then a count mismatch between positions 0 and 1 of the world: the
 * counts exchanged first catch it, both members fail with
 * MPG_ERR_INVALID, the others finish, nothing aborts (MPI_COMM_WORLD
 * keeps its fatal handler). */
Test(mpi, all_to_all_count_mismatch_fails_the_pair, .timeout = 300) {
  JOB(4, "-x MESHPG_TEST_A2A_MISMATCH=1", "all_to_all", 280,
      .has = {"rank 0: mismatch -> ERR_INVALID", "rank 1: mismatch -> ERR_INVALID"});
}

/* A member that never arrives: MPG_ERR_TIMEOUT, abort, clean exit. */
Test(mpi, all_to_all_absent_member_times_out, .timeout = 120) {
  TIMEOUT_JOB(4, "", "a2a_timeout", NULL);
}

/* The same after a first all-to-all, through the group's shared-memory
 * channel (one host): every waiter names the missing member. */
Test(mpi, all_to_all_absent_member_times_out_in_shared_memory, .timeout = 120) {
  TIMEOUT_JOB(4, "-x MESHPG_TEST_A2A_WARM=1", "a2a_timeout", "missing position 3 (world rank 3)");
}

/* MESHPG_SHM=0: the backend's all-to-all (counts exchanged, one
 * MPI_Ialltoallv), the same values. */
Test(mpi, all_to_all_4_ranks_without_shared_memory, .timeout = 300) {
  JOB(4, "-x MESHPG_SHM=0", "all_to_all", 280);
}

/* The split's two-phase rendezvous: a rank that arrives after its peers
 * gave up times out too, rather than hanging in MPI_Comm_split. */
Test(mpi, split_timeout_never_hangs, .timeout = 120) {
  JOB(4, "", "split_timeout", 100, .has = {"(late): ERR_TIMEOUT after"});
}

/* valgrind in front of every rank (valgrind_prefix, mpirun_util.h). */
Test(mpi, valgrind_no_meshpg_leaks, .timeout = 600) {
  VALGRIND_JOB("", "collectives", "definitely lost");
}

/* The ring pipeline (8-byte pieces: every all-reduce of the worker runs
 * as ring pieces, their arithmetic outside the lock) under valgrind. */
Test(mpi, valgrind_ring_pipeline_is_memory_safe, .timeout = 600) {
  VALGRIND_JOB("-x MESHPG_MPI_PIECE_BYTES=8", "collectives", "Invalid ", "definitely lost");
}

/* The abort path under valgrind: abandoned requests, the late peer's
 * completion of them inside MPI_Finalize (which must land in meshpg's
 * staging memory, not in the caller's long-gone buffers) and the deferred
 * finalize at exit.  valgrind starts slowly: a 15 s timeout. */
Test(mpi, valgrind_timeout_path_is_memory_safe, .timeout = 600) {
  VALGRIND_JOB("-x MESHPG_TEST_TIMEOUT_S=15", "timeout", "Invalid write", "definitely lost");
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
