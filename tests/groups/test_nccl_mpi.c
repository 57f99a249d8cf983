/* The NCCL backend at worlds 2, 4 and 8 under real `mpirun` processes
 * (nccl_mpi_worker.c): the sync in replicate and shard mode, f32 and bf16,
 * exact averages; and a missing peer (hung or killed) with one, two and
 * three communicators in flight, every survivor failing within the timeout
 * + 1 s (R8).
 *
 * The same test is built twice:
 *  - with NVIDIA's NCCL and CUDA (suite "gpu"): without a GPU it skips with
 *    one line.  With fewer GPUs than ranks, every rank gets its own
 *    NCCL_HOSTID: NCCL's duplicate-GPU check compares host hashes, so each
 *    rank is then a host of its own, and NCCL joins them through its socket
 *    transport.  That is real NCCL (init, split, kernels, async errors), but
 *    not NVLink, P2P or SHM;
 *  - with the CUDA/NCCL test double (tests/double/), where each process
 *    simulates a node of 8 devices: it runs on every CI machine.
 * The sync and lazy groups also run under a torchrun-style launch (no
 * mpirun: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
 * MASTER_PORT per process), where the NCCL unique id travels through
 * meshpg's own rendezvous (groups/rendezvous.h) and NCCL_COMM_ID is never
 * set (issue 30).
 * MESHPG_NCCL_MPI_WORKER names the worker to start.  The jobs run one at a
 * time (Criterion --jobs 1, in meson.build). */
#include <cuda_runtime_api.h>

#include <string.h>

#include "../support/mpirun_util.h"

/* The timeout of the fault jobs: MESHPG_NCCL_MPI_TIMEOUT_S, default 10 s
 * (it also bounds context creation: CUDA's and NCCL's start on a GPU). */
static int fault_timeout(void) {
  const char *e = getenv("MESHPG_NCCL_MPI_TIMEOUT_S");
  int t = e ? atoi(e) : 0;
  return t > 0 ? t : 10;
}

static int devices(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
  (void)cudaGetLastError();
  return n;
}

static void require_devices(void) {
  if (devices() < 1)
    cr_skip_test("no CUDA GPU on this machine: the multi-rank NCCL tests are skipped (they "
                 "run on the CUDA/NCCL test double in tests/double/ instead)");
}

/* In a sanitizer build (MESHPG_SANITIZER) the 8-rank worlds repeat the
 * 2- and 4-rank worlds' code paths at twice their time, one job at a time
 * on the CI's 2 cores, and a bandwidth means nothing: the plain build runs
 * them. */
static void plain_build_only(int np, int any_np) {
  const char *san = getenv("MESHPG_SANITIZER");
  if (san && (any_np || np >= 8))
    cr_skip_test("a sanitizer build (%s): world %d runs in the plain build", san, np);
}

/* mpirun -np N WORKER ARGS; one NCCL_HOSTID per rank when the ranks
 * outnumber the devices.  `extra` is more mpirun arguments. */
/* Environment for the next job() (VAR=value ...), then reset. */
static char job_env[256];
/* The next job()'s time limit in seconds, then reset to 240. */
static int job_limit = 240;

static int job(int np, const char *args, const char *extra, double *secs) {
  const char *w = env_program("MESHPG_NCCL_MPI_WORKER");
  char cmd[4096];
  int shared = devices() < np;
  snprintf(cmd, sizeof cmd,
           "%s MESHPG_TEST_TIMEOUT_S=%d timeout -k 5 %d " MPIRUN "%s-np %d %s'%s' %s",
           job_env, fault_timeout(), job_limit, extra, np,
           shared ? "sh -c 'NCCL_HOSTID=meshpg-h$OMPI_COMM_WORLD_RANK exec \"$0\" \"$@\"' " : "",
           w, args);
  job_env[0] = '\0';
  job_limit = 240;
  int rc = run(cmd, secs);
  cr_log_info("%s: exit %d after %.2f s%s\n%s", cmd, rc, *secs,
              shared ? " (one NCCL_HOSTID per rank)" : "", out);
  return rc;
}

static int count(const char *needle) {
  int n = 0;
  for (const char *p = strstr(out, needle); p; p = strstr(p + 1, needle)) n++;
  return n;
}

/* `mode [k]` at world np (k < 0: none): the job exits 0 and every rank
 * says "OK mode". */
static void all_ranks_ok(int np, const char *mode, int k) {
  char args[32], ok[16];
  if (k >= 0) snprintf(args, sizeof args, "%s %d", mode, k);
  else snprintf(args, sizeof args, "%s", mode);
  snprintf(ok, sizeof ok, "OK %s", mode);
  double secs = 0;
  int rc = job(np, args, "", &secs);
  cr_expect_eq(rc, 0, "np %d, %s: exit %d\n%s", np, args, rc, out);
  cr_expect_eq(count(ok), np, "np %d, %s: %d of %d ranks OK\n%s", np, args, count(ok), np,
               out);
  cr_expect_eq(count("FAIL"), 0, "np %d, %s:\n%s", np, args, out);
}

/* The same worker started torchrun-style: np processes with the launcher
 * variables a torchrun agent sets, MASTER_ADDR=127.0.0.1 and a port of
 * this test's own; one NCCL_HOSTID per rank when the ranks outnumber the
 * devices.  Exits non-zero when any rank did. */
static int torchrun_job(int np, const char *args, double *secs) {
  static int serial;
  const char *w = env_program("MESHPG_NCCL_MPI_WORKER");
  int port = 30000 + (int)(getpid() % 15000) * 2 + 2 * (serial++ % 8);
  char cmd[4096];
  int shared = devices() < np;
  snprintf(cmd, sizeof cmd,
           "MESHPG_TEST_TIMEOUT_S=%d timeout -k 5 %d sh -c 'pids=; r=0; "
           "while [ $r -lt %d ]; do "
           "env -u OMPI_COMM_WORLD_SIZE -u OMPI_COMM_WORLD_RANK RANK=$r WORLD_SIZE=%d "
           "LOCAL_RANK=$r LOCAL_WORLD_SIZE=%d MASTER_ADDR=127.0.0.1 MASTER_PORT=%d %s"
           "\"$0\" %s & pids=\"$pids $!\"; r=$((r + 1)); done; "
           "rc=0; for p in $pids; do wait $p || rc=1; done; exit $rc' '%s' 2>&1",
           fault_timeout(), job_limit, np, np, np, port,
           shared ? "NCCL_HOSTID=meshpg-h$r " : "", args, w);
  int rc = run(cmd, secs);
  cr_log_info("%s: exit %d after %.2f s%s\n%s", cmd, rc, *secs,
              shared ? " (one NCCL_HOSTID per rank)" : "", out);
  return rc;
}

static void torchrun_ok(int np, const char *mode) {
  require_devices();
  char ok[16];
  snprintf(ok, sizeof ok, "OK %s", mode);
  double secs = 0;
  int rc = torchrun_job(np, mode, &secs);
  cr_expect_eq(rc, 0, "torchrun-style np %d, %s: exit %d\n%s", np, mode, rc, out);
  cr_expect_eq(count(ok), np, "torchrun-style np %d, %s: %d of %d ranks OK\n%s", np, mode,
               count(ok), np, out);
  cr_expect_eq(count("FAIL"), 0, "torchrun-style np %d, %s:\n%s", np, mode, out);
}

Test(nccl_torchrun, sync_world_2, .timeout = 300) { torchrun_ok(2, "sync"); }
Test(nccl_torchrun, sync_world_4, .timeout = 300) { torchrun_ok(4, "sync"); }
Test(nccl_torchrun, lazy_groups_and_p2p_world_4, .timeout = 300) { torchrun_ok(4, "lazy"); }
Test(nccl_torchrun, alltoall_world_8, .timeout = 300) { torchrun_ok(8, "alltoall"); }

/* mpirun -np np of the worker in `mode`, on a plain build with devices;
 * every rank must report OK:
 * - sync: the gradient sync;
 * - lazy: lazy groups first used in a different order by even and odd
 *   ranks, sums on every group, a point-to-point ring, and the issue-order
 *   check;
 * - alltoall: mpg_all_to_all and mpg_all_to_all_v (grouped
 *   ncclSend/ncclRecv) over the world and dp: equal splits, then per-peer
 *   counts with zeros and gaps, i32 and bf16, every element checked. */
static void mpi_mode(int np, const char *mode) {
  plain_build_only(np, 0);
  require_devices();
  all_ranks_ok(np, mode, -1);
}

Test(nccl_mpi, sync_world_2, .timeout = 300) { mpi_mode(2, "sync"); }
Test(nccl_mpi, sync_world_4, .timeout = 300) { mpi_mode(4, "sync"); }
Test(nccl_mpi, sync_world_8, .timeout = 300) { mpi_mode(8, "sync"); }
Test(nccl_mpi, lazy_groups_and_p2p_world_4, .timeout = 300) { mpi_mode(4, "lazy"); }
Test(nccl_mpi, alltoall_world_2, .timeout = 300) { mpi_mode(2, "alltoall"); }
Test(nccl_mpi, alltoall_world_4, .timeout = 300) { mpi_mode(4, "alltoall"); }
Test(nccl_mpi, alltoall_world_8, .timeout = 300) { mpi_mode(8, "alltoall"); }
Test(nccl_mpi, lazy_groups_and_p2p_world_8, .timeout = 300) { mpi_mode(8, "lazy"); }

/* The sync's bus bandwidth next to NCCL's own all-reduce of the same bytes
 * (64 MiB), in the same run; printed, not asserted (bench/ has the
 * benchmarks).  On one GPU shared through NCCL_HOSTID it measures NCCL's
 * socket transport, not NVLink. */
static void bandwidth(int np) {
#ifdef MPG_ON_DOUBLE
  cr_skip_test("on the CUDA/NCCL test double a bandwidth is its memcpy's, not NCCL's: this "
               "prints a number on a GPU only (np %d)", np);
#endif
  plain_build_only(np, 1);
  require_devices();
  double secs = 0;
  int rc = job(np, "bw 64", "", &secs);
  cr_expect_eq(rc, 0, "np %d: exit %d\n%s", np, rc, out);
  cr_expect_eq(count("OK bw"), np, "np %d: %d of %d ranks OK\n%s", np, count("OK bw"), np, out);
  const char *line = strstr(out, "BW rank 0:");
  cr_expect(line, "no bandwidth line:\n%s", out);
  if (line) cr_log_info("%.*s", (int)strcspn(line, "\n"), line);
}

Test(nccl_mpi, bandwidth_world_2, .timeout = 300) { bandwidth(2); }
Test(nccl_mpi, bandwidth_world_8, .timeout = 300) { bandwidth(8); }

/* The last rank sleeps through step 1 with k groups in flight: every other
 * rank reports OK (its own bound checked in the worker), and so does the
 * sleeper once it wakes.  The worker expects every survivor to fail, also
 * those that share no group in flight with the sleeper (ranks 0 and 2 at
 * world 4 with one group): they meet it in the issue-order check, so the
 * job runs with MESHPG_CHECK_ORDER=1 whoever starts the test (meson's
 * test environment sets it too; an H200 run started by hand without it
 * saw those two ranks finish step 1 with MPG_OK, which is right without
 * the check). */
static void hung_peer(int np, int k) {
  plain_build_only(np, 0);
  require_devices();
  snprintf(job_env, sizeof job_env, "MESHPG_CHECK_ORDER=1");
  all_ranks_ok(np, "hang", k);
}

Test(nccl_mpi, hung_peer_2_one_group, .timeout = 300) { hung_peer(2, 1); }
Test(nccl_mpi, hung_peer_4_one_group, .timeout = 300) { hung_peer(4, 1); }
Test(nccl_mpi, hung_peer_4_two_groups, .timeout = 300) { hung_peer(4, 2); }
Test(nccl_mpi, hung_peer_8_two_groups, .timeout = 300) { hung_peer(8, 2); }
Test(nccl_mpi, hung_peer_8_three_groups, .timeout = 300) { hung_peer(8, 3); }

/* The last rank dies (SIGKILL) in step 1.  mpirun is told not to end the
 * job for it (--enable-recovery), so every survivor reports its own time. */
static void killed_peer(int np, int k) {
  plain_build_only(np, 0);
  require_devices();
  snprintf(job_env, sizeof job_env, "MESHPG_CHECK_ORDER=1"); /* as hung_peer */
  char args[32];
  snprintf(args, sizeof args, "kill %d", k);
  /* The survivors report before they exit; after a peer died, Open MPI
   * may keep them in MPI_Finalize (the exit handler of groups/mpi) until
   * killed, so the job gets a short limit. */
  job_limit = 60;
  double secs = 0;
  (void)job(np, args, "--enable-recovery ", &secs);
  cr_expect_eq(count("OK kill"), np - 1, "np %d, %d group(s): %d of %d survivors OK\n%s", np,
               k, count("OK kill"), np - 1, out);
  cr_expect_eq(count("FAIL"), 0, "%s", out);
}

Test(nccl_mpi, killed_peer_2_one_group, .timeout = 300) { killed_peer(2, 1); }
Test(nccl_mpi, killed_peer_4_two_groups, .timeout = 300) { killed_peer(4, 2); }
Test(nccl_mpi, killed_peer_8_three_groups, .timeout = 300) { killed_peer(8, 3); }

#ifdef MPG_ON_DOUBLE
/* The test double only (MESHPG_DOUBLE_OOM_RANK): the last rank's
 * cudaMallocAsync fails in step 1 (bf16 params reduced in f32): it fails at
 * once with MPG_ERR_BACKEND naming the allocation, and every peer fails
 * within the timeout + 1 s. */
static void oom_rank(int np, int k) {
  plain_build_only(np, 0);
  all_ranks_ok(np, "oom", k);
  cr_expect(strstr(out, "cudaMallocAsync") && strstr(out, "out of memory"),
            "no rank named the failed allocation:\n%s", out);
}

Test(nccl_mpi, oom_rank_2_one_group, .timeout = 300) { oom_rank(2, 1); }
Test(nccl_mpi, oom_rank_4_two_groups, .timeout = 300) { oom_rank(4, 2); }
Test(nccl_mpi, oom_rank_8_three_groups, .timeout = 300) { oom_rank(8, 3); }

/* The last rank's first NCCL operation of step 1 reports an asynchronous
 * error (MESHPG_DOUBLE_FAULT=async:R:N, N counted in a healthy run first):
 * it fails with MPG_ERR_BACKEND at its next operation on that
 * communicator, and every rank within the timeout + 1 s. */
/* Run `mode k` healthy; it prints the last rank's NCCL operations so far
 * ("OPS rank R N"); arm the next job's `fault` on its (N + ahead)-th. */
static void arm_fault(int np, const char *mode, int k, const char *fault, int ahead) {
  all_ranks_ok(np, mode, k);
  char want[32];
  snprintf(want, sizeof want, "OPS rank %d ", np - 1);
  const char *p = strstr(out, want);
  unsigned long long n = 0;
  cr_assert(p && sscanf(p + strlen(want), "%llu", &n) == 1, "no operation count:\n%s", out);
  snprintf(job_env, sizeof job_env, "MESHPG_DOUBLE_FAULT=%s:%d:%llu", fault, np - 1,
           n + (unsigned long long)ahead);
}

/* The asynchronous error on the last rank's first operation of step 1. */
static void arm_async_fault(int np, int k) { arm_fault(np, "count", k, "async", 1); }

static void async_error(int np, int k) {
  plain_build_only(np, 0);
  arm_async_fault(np, k);
  all_ranks_ok(np, "async", k);
  cr_expect(strstr(out, "ERR_BACKEND"), "no rank failed with MPG_ERR_BACKEND:\n%s", out);
}

Test(nccl_mpi, async_error_2_one_group, .timeout = 300) { async_error(2, 1); }
Test(nccl_mpi, async_error_4_two_groups, .timeout = 300) { async_error(4, 2); }
Test(nccl_mpi, async_error_8_three_groups, .timeout = 300) { async_error(8, 3); }

/* R4: the error is on one communicator while the rank waits on another,
 * whose peers never come: it fails within half the timeout (the wait
 * polls the context's other communicators), not at the timeout. */
static void async_elsewhere(int np, int k) {
  arm_async_fault(np, k);
  all_ranks_ok(np, "async_wait", k);
}

/* L3: the last rank's all-gather of the second bucket never arrives
 * (MESHPG_DOUBLE_FAULT=hang, counted in a healthy run): forward on the
 * first bucket must still run on every rank. */
static void gather_prefetch(int np) {
  /* +1: p0's all-gather (gather_begin); +2: p1's (started by gather_wait). */
  arm_fault(np, "gather", -1, "hang", 2);
  double secs = 0;
  int rc = job(np, "gather armed", "", &secs);
  cr_expect_eq(rc, 0, "np %d: exit %d\n%s", np, rc, out);
  cr_expect_eq(count("OK gather"), np, "np %d: %d of %d ranks OK\n%s", np, count("OK gather"),
               np, out);
  cr_expect_eq(count("FAIL"), 0, "%s", out);
}

Test(nccl_mpi, gather_prefetch_does_not_hold_forward_2, .timeout = 300) { gather_prefetch(2); }
Test(nccl_mpi, gather_prefetch_does_not_hold_forward_4, .timeout = 300) { gather_prefetch(4); }

Test(nccl_mpi, async_error_elsewhere_4, .timeout = 300) { async_elsewhere(4, 2); }
Test(nccl_mpi, async_error_elsewhere_8, .timeout = 300) { async_elsewhere(8, 3); }
#endif
