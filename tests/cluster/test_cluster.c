/* The library across the hosts of a cluster on this machine (cluster.sh:
 * each host has its own hostname, pid numbers, /dev/shm and network), under
 * mpirun through the nsenter agent (cluster_worker, examples/gpt).
 *
 * Every test makes its own cluster in a fresh directory and removes it
 * whatever happens (the fixture's `down`, and `up`'s sweep of clusters
 * whose maker is gone).  Without root (namespaces, veth links) every test
 * skips with one line. */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../support/clock.h"
#include "../support/run_util.h"
#include "../support/time_bound.h"

/* Open MPI across hosts: TCP between them, shared memory inside one. */
#define MPIRUN_ARGS "--oversubscribe --bind-to none --mca btl self,vader,tcp " \
                    "--mca btl_vader_single_copy_mechanism none"

static char dir[256];
static const char *sh;

static void cluster_down(void) {
  if (!dir[0]) return;
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "bash '%s' down '%s' >/dev/null 2>&1; rm -rf '%s'", sh, dir, dir);
  if (system(cmd) != 0) fprintf(stderr, "cluster down %s failed\n", dir);
  dir[0] = '\0';
}

/* Make N hosts (up's extra options in opts), or skip without root. */
static void cluster_up(int n, const char *opts) {
  sh = env_program("MESHPG_CLUSTER_SH");
  if (geteuid() != 0) cr_skip_test("the cluster tests need root (namespaces, veth links): skipped");
  snprintf(dir, sizeof dir, "/tmp/meshpg-cluster-XXXXXX");
  cr_assert_not_null(mkdtemp(dir));
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "MESHPG_CLUSTER_OWNER=%ld bash '%s' up '%s' %d %s", (long)getpid(),
           sh, dir, n, opts ? opts : "");
  int rc = run(cmd, NULL);
  if (rc != 0 && (strstr(out, "Operation not permitted") || strstr(out, "Permission denied"))) {
    cluster_down();
    cr_skip_test("namespaces are not permitted here: skipped (%s)", out);
  }
  cr_assert_eq(rc, 0, "%s\n%s", cmd, out);
}

static void fini(void) { cluster_down(); }

/* Lines of `out` that start with `prefix`. */
static int count_lines(const char *prefix) {
  int n = 0;
  size_t k = strlen(prefix);
  for (const char *p = out; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : p)
    if (strncmp(p, prefix, k) == 0) n++;
  return n;
}

/* mpirun on the head node: `mpirun MPIRUN_ARGS ARGS`; exit code, output in out. */
static int cluster_mpirun(const char *args, double *secs) {
  char cmd[4096];
  snprintf(cmd, sizeof cmd, "timeout -k 5 240 bash '%s' mpirun '%s' " MPIRUN_ARGS " %s", sh, dir,
           args);
  return run(cmd, secs);
}

/* Nothing of meshpg's (or anyone's) is left in HOST's /dev/shm (the
 * output of the last run is replaced). */
static void assert_shm_empty(const char *host) {
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "bash '%s' shm '%s' %s", sh, dir, host);
  int rc = run(cmd, NULL);
  cr_assert_eq(rc, 0, "%s: %s", cmd, out);
  cr_assert_eq(out[0], '\0', "%s's /dev/shm is not empty after the job:\n%s", host, out);
}

/* A worker job of NP ranks with `hosts` (mpirun --host) that must pass. */
static void worker_ok(const char *hosts, int np, const char *extra, const char *mode,
                      const char *mesh) {
  char args[2048], ok[64];
  snprintf(args, sizeof args, "--host %s -np %d %s '%s' %s %s", hosts, np, extra ? extra : "",
           env_program("MESHPG_CLUSTER_WORKER"), mode, mesh);
  double secs;
  int rc = cluster_mpirun(args, &secs);
  cr_assert_eq(rc, 0, "%s\nexit code %d after %.1f s:\n%s", args, rc, secs, out);
  snprintf(ok, sizeof ok, "OK %s rank ", mode);
  cr_assert_eq(count_lines(ok), np, "%s: %d of %d ranks OK:\n%s", args, count_lines(ok), np,
               out);
  cr_assert_eq(count_lines("FAIL"), 0, "%s", out);
}

TestSuite(cluster, .fini = fini, .timeout = 300);

/* Placement by the real hostnames: tp (and cp) inside a host, under the
 * launcher's block numbering (--map-by slot: ranks 0,1 on host1) and its
 * cyclic one (--map-by node: 0,2 on host1). */
Test(cluster, placement_block_and_cyclic) {
  cluster_up(2, NULL);
  worker_ok("host1:2,host2:2", 4, "--map-by slot", "place", "tp=2,dp=2");
  cr_assert_eq(count_lines("PLACE rank "), 4, "%s", out);
  cr_assert(strstr(out, "nodes 2"), "%s", out);
  worker_ok("host1:2,host2:2", 4, "--map-by node", "place", "tp=2,dp=2");
  /* the cyclic numbering is renumbered: some launcher rank != mesh rank */
  cr_assert(strstr(out, "launcher 1 host host2") || strstr(out, "launcher 2 host host1"), "%s",
            out);
}

/* Four hosts of two ranks: tp and cp inside a host, dp across. */
Test(cluster, placement_four_hosts) {
  cluster_up(4, NULL);
  worker_ok("host1:2,host2:2,host3:2,host4:2", 8, "--map-by node", "place", "tp=2,dp=4");
  cr_assert(strstr(out, "nodes 4"), "%s", out);
}

/* The sync in every mode on two hosts of two ranks: dp_cp hierarchical
 * (a segment per host), shard and HSDP too, bit for bit as documented. */
Test(cluster, sync_two_hosts) {
  cluster_up(2, NULL);
  worker_ok("host1:2,host2:2", 4, "-x MESHPG_SHM=1", "sync", "dp=2,cp=2");
  /* all but bdp (over dp: one member a host) in shared memory */
  cr_assert(strstr(out, "replicate: 4 buffers, 3 in shared memory (MESHPG_SHM=1)"), "%s", out);
  cr_assert(strstr(out, "shard: 4 buffers, 3 in shared memory (MESHPG_SHM=1)"), "%s", out);
  cr_assert(strstr(out, "hsdp: 2 buffers, 2 in shared memory (MESHPG_SHM=1)"), "%s", out);
  assert_shm_empty("host1");
  assert_shm_empty("host2");
}

/* Uneven hosts (3 + 1): a group across them falls back to the backend's
 * collectives, equal to MESHPG_SHM=0 bit for bit. */
Test(cluster, sync_uneven_hosts) {
  cluster_up(2, NULL);
  worker_ok("host1:3,host2:1", 4, "-x MESHPG_SHM=1", "sync", "dp=4");
  cr_assert(strstr(out, "equal to the MESHPG_SHM=0 run's"), "%s", out);
}

/* Two /dev/shm under one host id (every rank claims "one-host", the ranks
 * are on two hosts with their own pid numbers): the members on host2
 * cannot open the creator's segment, the path turns off with a log line,
 * and the results equal MESHPG_SHM=0's. */
Test(cluster, one_host_id_two_dev_shm) {
  cluster_up(2, NULL);
  worker_ok("host1:2,host2:2", 4, "-x MESHPG_LOG=info", "samehost", "dp=4");
  cr_assert(strstr(out, "shared memory off for group \"dp\" index 0 (rank "), "%s", out);
  cr_assert(strstr(out, "another pid namespace?"), "%s", out);
  cr_assert(strstr(out, "0 elements differ from the MESHPG_SHM=0 run"), "%s", out);
}

/* examples/gpt under mpirun across two hosts equals one process. */
Test(cluster, gpt_two_hosts) {
  cluster_up(2, NULL);
  char args[2048];
  snprintf(args, sizeof args, "--host host1:4,host2:4 -np 8 '%s' --mpi --mesh tp=2,cp=2,dp=2 "
           "--sp --shard --steps 5", env_program("MESHPG_GPT_EXE"));
  double secs;
  int rc = cluster_mpirun(args, &secs);
  cr_assert_eq(rc, 0, "%s\nexit code %d after %.1f s:\n%s", args, rc, secs, out);
  cr_assert(strstr(out, "\nPASS\n"), "no PASS line:\n%s", out);
}
