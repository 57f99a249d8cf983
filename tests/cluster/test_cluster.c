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

/* The MPI worker, or skip the test in a build without MPI. */
static const char *mpi_worker(void) {
  const char *w = getenv("MESHPG_CLUSTER_WORKER");
  if (!w || !*w) cr_skip_test("built without MPI (no mpirun jobs): skipped");
  return w;
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
           mpi_worker(), mode, mesh);
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
  mpi_worker();
  cluster_up(2, NULL);
  worker_ok("host1:2,host2:2", 4, "--map-by slot", "place", "tp=2,dp=2");
  cr_assert_eq(count_lines("PLACE rank "), 4, "%s", out);
  cr_assert(strstr(out, "nodes 2"), "%s", out);
  worker_ok("host1:2,host2:2", 4, "--map-by node", "place", "tp=2,dp=2");
  /* the cyclic numbering is renumbered: some launcher rank != mesh rank */
  cr_assert(strstr(out, "launcher 1 host host2") || strstr(out, "launcher 2 host host1"), "%s",
            out);
}

/* Worker jobs as rows: mpirun --host HOSTS -np NP EXTRA cluster_worker
 * MODE MESH must pass (worker_ok) with an output holding each text of
 * want (up to the first NULL). */
typedef struct worker_job {
  const char *hosts;
  int np;
  const char *extra, *mode, *mesh;
  const char *want[3];
} worker_job;

/* The jobs in turn on a fresh cluster of nhosts hosts; with shm_empty,
 * nothing is left in host1's and host2's /dev/shm after them. */
static void worker_jobs(int nhosts, const worker_job *jobs, int n, int shm_empty) {
  mpi_worker();
  cluster_up(nhosts, NULL);
  for (const worker_job *w = jobs; w < jobs + n; w++) {
    worker_ok(w->hosts, w->np, w->extra, w->mode, w->mesh);
    for (int k = 0; k < 3 && w->want[k]; k++)
      cr_assert(strstr(out, w->want[k]), "%s %s: no \"%s\" in:\n%s", w->mode, w->mesh,
                w->want[k], out);
  }
  if (shm_empty) {
    assert_shm_empty("host1");
    assert_shm_empty("host2");
  }
}
#define WORKER_JOBS(nhosts, jobs, shm_empty) \
  worker_jobs(nhosts, jobs, (int)(sizeof(jobs) / sizeof(jobs)[0]), shm_empty)

/* Two hosts of four ranks, numbered cyclically: tp and cp both inside a
 * host, dp across. */
static const worker_job tp_cp_cyclic[] = {
    {"host1:4,host2:4", 8, "--map-by node", "place", "tp=2,cp=2,dp=2", {"nodes 2"}},
};
Test(cluster, placement_tp_cp_cyclic) { WORKER_JOBS(2, tp_cp_cyclic, 0); }

/* Four hosts of two ranks: tp inside a host, dp across. */
static const worker_job four_hosts[] = {
    {"host1:2,host2:2,host3:2,host4:2", 8, "--map-by node", "place", "tp=2,dp=4", {"nodes 4"}},
};
Test(cluster, placement_four_hosts) { WORKER_JOBS(4, four_hosts, 0); }

/* The sync in every mode on two hosts of two ranks: dp_cp hierarchical
 * (a segment per host), shard and HSDP too, bit for bit as documented;
 * all but bdp (over dp: one member a host) in shared memory. */
static const worker_job sync_two[] = {
    {"host1:2,host2:2", 4, "-x MESHPG_SHM=1", "sync", "dp=2,cp=2",
     {"replicate: 4 buffers, 3 in shared memory (MESHPG_SHM=1)",
      "shard: 4 buffers, 3 in shared memory (MESHPG_SHM=1)",
      "hsdp: 2 buffers, 2 in shared memory (MESHPG_SHM=1)"}},
};
Test(cluster, sync_two_hosts) { WORKER_JOBS(2, sync_two, 1); }

/* All-to-alls on 2 hosts x 2: tp inside a host (its shared-memory
 * channel), dp and the world across (the backend's MPI_Ialltoallv), on
 * malloc'ed and mpg_ctx_mem_alloc buffers; then every rank claiming one
 * host id, so that a channel across the two /dev/shm turns itself off:
 * every byte right both times, both /dev/shm empty. */
static const worker_job a2a_jobs[] = {
    {"host1:2,host2:2", 4, "--map-by slot", "a2a", "tp=2,dp=2", {"A2A 36 cases per rank"}},
    {"host1:2,host2:2", 4, "--map-by slot", "a2a-samehost", "tp=2,dp=2", {NULL}},
};
Test(cluster, all_to_all_inside_and_across_hosts) { WORKER_JOBS(2, a2a_jobs, 1); }

/* Uneven hosts (3 + 1): a group across them falls back to the backend's
 * collectives, equal to MESHPG_SHM=0 bit for bit. */
static const worker_job uneven[] = {
    {"host1:3,host2:1", 4, "-x MESHPG_SHM=1", "sync", "dp=4",
     {"equal to the MESHPG_SHM=0 run's"}},
};
Test(cluster, sync_uneven_hosts) { WORKER_JOBS(2, uneven, 0); }

/* Two /dev/shm under one host id (every rank claims "one-host", the ranks
 * are on two hosts with their own pid numbers): the members on host2
 * cannot open the creator's segment, the path turns off with a log line,
 * and the results equal MESHPG_SHM=0's. */
static const worker_job same_host[] = {
    {"host1:2,host2:2", 4, "-x MESHPG_LOG=info", "samehost", "dp=4",
     {"shared memory off for group \"dp\" index 0 (rank ", "another pid namespace?",
      "0 elements differ from the MESHPG_SHM=0 run"}},
};
Test(cluster, one_host_id_two_dev_shm) { WORKER_JOBS(2, same_host, 0); }

/* examples/gpt under mpirun across two hosts equals one process. */
Test(cluster, gpt_two_hosts) {
  mpi_worker();
  cluster_up(2, NULL);
  char args[2048];
  snprintf(args, sizeof args, "--host host1:4,host2:4 -np 8 '%s' --mpi --mesh tp=2,cp=2,dp=2 "
           "--sp --shard --steps 5", env_program("MESHPG_GPT_EXE"));
  double secs;
  int rc = cluster_mpirun(args, &secs);
  cr_assert_eq(rc, 0, "%s\nexit code %d after %.1f s:\n%s", args, rc, secs, out);
  cr_assert(strstr(out, "\nPASS\n"), "no PASS line:\n%s", out);
}

/* ------------------------------------------------------------------ */
/* Faults                                                              */
/* ------------------------------------------------------------------ */

/* The fault jobs' collective timeout (seconds). */
#define FAULT_TIMEOUT_S 2.0

/* A job started in the background, its output in DIR/job.out. */
static pid_t job_start(const char *cmd) {
  char full[4096];
  snprintf(full, sizeof full, "exec > '%s/job.out' 2>&1; %s", dir, cmd);
  pid_t pid = fork();
  cr_assert_neq(pid, -1);
  if (pid == 0) {
    setpgid(0, 0);
    execl("/bin/sh", "sh", "-c", full, (char *)NULL);
    _exit(127);
  }
  return pid;
}

/* Append file `path` to out at *n. */
static void append_file(const char *path, size_t *n) {
  FILE *f = fopen(path, "r");
  if (f) {
    *n += fread(out + *n, 1, sizeof out - 1 - *n, f);
    fclose(f);
  }
  out[*n] = '\0';
}

/* Read DIR/job.out, then the ranks' logs of a torchrun-style launch
 * (DIR/out/rank-R.log), into out. */
static void job_output(void) {
  char path[512];
  size_t n = 0;
  snprintf(path, sizeof path, "%s/job.out", dir);
  append_file(path, &n);
  for (int r = 0; r < 16; r++) {
    snprintf(path, sizeof path, "%s/out/rank-%d.log", dir, r);
    append_file(path, &n);
  }
}

/* Wait until `n` lines start with `prefix` (output in out); 0 after `secs`. */
static int job_wait_lines(const char *prefix, int n, double secs) {
  double t0 = now_s();
  for (;;) {
    job_output();
    if (count_lines(prefix) >= n) return 1;
    if (now_s() - t0 > secs) return 0;
    sleep_s(0.05);
  }
}

/* Wait for the job to exit (killing its process group after `secs`);
 * returns its exit code (-1: killed), output in out, *took its seconds. */
static int job_end(pid_t pid, double secs, double *took) {
  double t0 = now_s();
  int st = 0;
  while (waitpid(pid, &st, WNOHANG) == 0) {
    if (now_s() - t0 > secs) {
      kill(-pid, SIGKILL);
      waitpid(pid, &st, 0);
      st = -1;
      break;
    }
    sleep_s(0.05);
  }
  if (took) *took = now_s() - t0;
  job_output();
  return st == -1 ? -1 : WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* `cluster.sh VERB DIR ARGS` (kill-host, link, exec ...). */
static void cluster_do(const char *verb, const char *args) {
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "bash '%s' %s '%s' %s 2>&1", sh, verb, dir, args);
  cr_assert_eq(system(cmd), 0, "%s failed", cmd);
}

/* The worker's steps job over 2 hosts of 2 ranks, in the background;
 * `recovery`: mpirun --enable-recovery, so that a rank that exits after a
 * fault (without MPI_Finalize: its world may be cut) does not make mpirun
 * kill the others before they report. */
static pid_t steps_job(int steps, int recovery) {
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "exec timeout -k 5 120 bash '%s' mpirun '%s' " MPIRUN_ARGS
           "%s --host host1:2,host2:2 -np 4 '%s' steps dp=4 %d %g", sh, dir,
           recovery ? " --enable-recovery" : "", mpi_worker(), steps,
           FAULT_TIMEOUT_S);
  return job_start(cmd);
}

/* Rank r's END line: its status name into st, the failing call's ms. */
static int end_of(int r, char *st, size_t cap, double *ms, const char **msg) {
  char key[64];
  snprintf(key, sizeof key, "END rank %d host ", r);
  const char *p = strstr(out, key);
  if (!p) return 0;
  const char *s = strstr(p, " status ");
  char name[32] = "";
  if (!s || sscanf(s, " status %31s ms %lf", name, ms) != 2) return 0;
  snprintf(st, cap, "%s", name);
  if (msg) *msg = p;
  return 1;
}

/* Every listed rank ended with TIMEOUT, ABORTED (or ENV with env, or
 * BACKEND: NCCL's asynchronous error for a peer that is gone) within the
 * timeout + 1 s of its failing call, and destroyed cleanly. */
enum { OK_ENV = 1, OK_BACKEND = 2 };
static void assert_survivors(const int *ranks, int n, int env) {
  double bound = tb_bound(FAULT_TIMEOUT_S + 1.0, 4) * 1e3;
  for (int k = 0; k < n; k++) {
    char st[32], key[64];
    double ms;
    cr_assert(end_of(ranks[k], st, sizeof st, &ms, NULL), "rank %d did not end:\n%s", ranks[k],
              out);
    cr_assert(!strcmp(st, "ERR_TIMEOUT") || !strcmp(st, "ERR_ABORTED") ||
                  ((env & OK_ENV) && !strcmp(st, "ERR_ENV")) ||
                  ((env & OK_BACKEND) && !strcmp(st, "ERR_BACKEND")),
              "rank %d ended with %s:\n%s", ranks[k], st, out);
    cr_assert_leq(ms, bound, "rank %d's failing call took %.0f ms, above %.0f:\n%s", ranks[k], ms,
                  bound, out);
    snprintf(key, sizeof key, "DESTROYED rank %d status OK OK", ranks[k]);
    cr_assert(strstr(out, key), "rank %d did not destroy cleanly:\n%s", ranks[k], out);
  }
}

/* A host whose /dev/shm is too small for its segment (16 MiB, less than
 * the segment and the slack kept for Open MPI's own): every rank's commit
 * fails with MPG_ERR_ENV naming /dev/shm, at once, and nothing is left in
 * any /dev/shm. */
Test(cluster, fault_small_dev_shm) {
  mpi_worker();
  cluster_up(2, "--shm 256,16");
  pid_t pid = steps_job(5, 0);
  int rc = job_end(pid, 120, NULL);
  const int all[] = {0, 1, 2, 3};
  assert_survivors(all, 4, OK_ENV);
  /* host2's first rank (2) makes host2's segment: the message names it */
  cr_assert(strstr(out, "the segment of rank 2's host needs") &&
                strstr(out, "/dev/shm there has"),
            "exit %d:\n%s", rc, out);
  cr_assert_eq(count_lines("STEP "), 0, "%s", out);
  assert_shm_empty("host1");
  assert_shm_empty("host2");
}

/* host2's link goes down in the middle of the steps: every rank, on
 * both sides of the partition, returns TIMEOUT or ABORTED within the
 * timeout + 1 s and destroys cleanly; once the link is up again their
 * output reaches mpirun.  Nothing is left in /dev/shm. */
Test(cluster, fault_link_down) {
  mpi_worker();
  cluster_up(2, NULL);
  pid_t pid = steps_job(200, 1);
  cr_assert(job_wait_lines("STEP 3 ", 4, 60), "the job did not reach step 3:\n%s", out);
  cluster_do("link", "host2 down");
  sleep_s(FAULT_TIMEOUT_S + 2.0);
  cluster_do("link", "host2 up");
  job_wait_lines("DESTROYED ", 4, 30);
  /* Not judged: whether mpirun (--enable-recovery) ends a job whose ranks
   * exited without MPI_Finalize; it is killed after 5 s. */
  job_end(pid, 5, NULL);
  const int all[] = {0, 1, 2, 3};
  assert_survivors(all, 4, 0);
  /* The ranks that timed out in the shared-memory path's step across
   * nodes name the rank across the cut they waited for: "position P (left
   * neighbour) never sent it" and "P is world rank R".  (A timeout in a
   * small all-reduce, e.g. the issue-order check's, says MPI cannot tell,
   * or in a group of two names the other member.) */
  for (int r = 0; r < 4; r++) {
    char st[32], key[32];
    double ms;
    const char *msg;
    cr_assert(end_of(r, st, sizeof st, &ms, &msg));
    if (strcmp(st, "ERR_TIMEOUT")) continue;
    const char *eol = strchr(msg, '\n'), *nv = strstr(msg, "(left neighbour) never sent it");
    if (!nv || (eol && nv > eol)) {
      const char *ns = strstr(msg, "MPI does not say which");
      if (!ns) ns = strstr(msg, "did not arrive: position");
      cr_assert(ns && (!eol || ns < eol), "rank %d names no missing peer:\n%s", r, out);
      continue;
    }
    int pos = -1, rank = -1;
    cr_assert_eq(sscanf(nv - 3, "%*[^0-9]%d", &pos), 1);
    snprintf(key, sizeof key, " %d is world rank ", pos);
    const char *k = strstr(nv, key);
    cr_assert(k && (!eol || k < eol) && sscanf(k + strlen(key), "%d", &rank) == 1,
              "rank %d: no rank for position %d:\n%s", r, pos, out);
    cr_assert((r < 2) != (rank < 2), "rank %d names rank %d, on its own side:\n%s", r, rank, out);
  }
  assert_shm_empty("host1");
  assert_shm_empty("host2");
}

/* Under mpirun, a lost peer ends the job by Open MPI's decision
 * (docs/failures.md, "Lost hosts"): its TCP transport aborts the
 * survivors, with the processes of one host SIGKILLed (their orted alive)
 * and with the whole host lost.  Judged: no rank of the job is left on
 * host1 within the bound below, nor anything in its /dev/shm.  Not judged:
 * when mpirun itself exits (after a lost host it sometimes waits about a
 * minute, "ORTE was unable to reliably start one or more daemons"); it is
 * killed after 10 s more. */
static void mpirun_lost(const char *verb, const char *args) {
  mpi_worker();
  cluster_up(2, NULL);
  pid_t pid = steps_job(200, 0);
  cr_assert(job_wait_lines("STEP 3 ", 4, 60), "the job did not reach step 3:\n%s", out);
  cluster_do(verb, args);
  double t0 = now_s(), bound = tb_bound(FAULT_TIMEOUT_S + 1.0, 4) + 5.0;
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "bash '%s' exec '%s' host1 pgrep -f cluster_worker", sh, dir);
  int left;
  while ((left = run(cmd, NULL) == 0) && now_s() - t0 < bound) sleep_s(0.1);
  double took = now_s() - t0;
  int rc = job_end(pid, 10, NULL);
  cr_assert(!left, "cluster_worker processes still on host1 %.1f s after the fault (mpirun exit "
            "%d):\n%s", took, rc, out);
  cr_assert(rc != 0, "mpirun: exit 0 after a lost peer:\n%s", out);
  assert_shm_empty("host1");
}

Test(cluster, mpirun_ends_the_job_on_killed_ranks) {
  mpirun_lost("exec", "host2 pkill -KILL -f cluster_worker");
}

Test(cluster, mpirun_ends_the_job_on_a_lost_host) { mpirun_lost("kill-host", "host2"); }

/* ------------------------------------------------------------------ */
/* The torchrun-style launch: no mpirun, the nccl backend on the double */
/* ------------------------------------------------------------------ */

/* cluster.sh launch: 2 ranks a host of cluster_nccl_worker ARGS, in the
 * background (the ranks' output in DIR/out/rank-R.log). */
static const char *nccl_worker(void) {
  const char *w = getenv("MESHPG_CLUSTER_NCCL_WORKER");
  if (!w || !*w) cr_skip_test("built without NCCL (the CUDA/NCCL test double): skipped");
  return w;
}

static pid_t launch_job(const char *args) {
  const char *w = nccl_worker();
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "exec timeout -k 5 120 bash '%s' launch '%s' 2 29500 '%s' %s", sh,
           dir, w, args);
  return job_start(cmd);
}

/* Two hosts of two ranks, each host's launcher starting its ranks with
 * torchrun's variables: replicate and shard on dp=2,cp=2 give the exact
 * averages; the double joins the hosts through its socket transport. */
Test(cluster, torchrun_style_sync) {
  nccl_worker();
  cluster_up(2, NULL);
  pid_t pid = launch_job("sync dp=2,cp=2");
  int rc = job_end(pid, 120, NULL);
  cr_assert_eq(rc, 0, "launch: exit %d:\n%s", rc, out);
  cr_assert_eq(count_lines("OK sync rank "), 4, "%s", out);
  cr_assert_eq(count_lines("FAIL"), 0, "%s", out);
  assert_shm_empty("host1");
  assert_shm_empty("host2");
}

/* A fault in the middle of a torchrun-style job's steps: the survivors
 * return within the timeout + 1 s, destroy cleanly, and nothing is left in
 * their host's /dev/shm; with a peer gone (not a partition), their
 * message names host2's ranks. */
static void torchrun_fault(const char *verb, const char *args, int partition) {
  nccl_worker();
  cluster_up(2, NULL);
  pid_t pid = launch_job("steps dp=2,cp=2 200 2");
  cr_assert(job_wait_lines("STEP 3 ", 4, 60), "the job did not reach step 3:\n%s", out);
  cluster_do(verb, args);
  if (partition) {
    sleep_s(FAULT_TIMEOUT_S + 2.0);
    cluster_do("link", "host2 up");
  }
  job_wait_lines("DESTROYED ", partition ? 4 : 2, 30);
  job_end(pid, 60, NULL);
  const int all[] = {0, 1, 2, 3};
  assert_survivors(all, partition ? 4 : 2, OK_BACKEND);
  if (!partition)
    for (int r = 0; r < 2; r++) {
      char st[32];
      double ms;
      const char *msg;
      cr_assert(end_of(r, st, sizeof st, &ms, &msg));
      const char *eol = strchr(msg, '\n'), *k = strstr(msg, "rank 2 (");
      if (!k || (eol && k > eol)) k = strstr(msg, "rank 3 (");
      cr_assert(k && (!eol || k < eol), "rank %d does not name host2's ranks:\n%s", r, out);
    }
  assert_shm_empty("host1");
  if (partition) assert_shm_empty("host2");
}

/* host2's /dev/shm too small (1 MiB) for the double's segment of its own
 * ranks' communicator: host2's ranks fail mpg_ctx_create with NCCL's system
 * error, and host1's, which got further, fail at once with the closed
 * connections of host2's ranks, naming them; every rank ends cleanly. */
Test(cluster, torchrun_style_small_dev_shm) {
  nccl_worker();
  cluster_up(2, "--shm 256,1");
  pid_t pid = launch_job("steps dp=2,cp=2 5 2");
  job_end(pid, 120, NULL);
  const int all[] = {0, 1, 2, 3};
  assert_survivors(all, 4, OK_ENV | OK_BACKEND);
  cr_assert(strstr(out, "No space left on device (is /dev/shm full?)"), "%s", out);
  cr_assert(strstr(out, "Connection closed by remote peer (meshpg double: rank "), "%s", out);
  assert_shm_empty("host1");
  assert_shm_empty("host2");
}

/* host2's ranks SIGKILLed, its launcher alive (it reports them dead). */
Test(cluster, torchrun_style_killed_ranks) {
  torchrun_fault("exec", "host2 pkill -KILL -f cluster_nccl_worker", 0);
}

/* host2 lost whole: its launcher, ranks, network and /dev/shm at once. */
Test(cluster, torchrun_style_lost_host) { torchrun_fault("kill-host", "host2", 0); }

/* host2's link down mid-step, up again after the timeout: every rank on
 * both sides times out (NCCL cannot say who is missing) and destroys. */
Test(cluster, torchrun_style_link_down) { torchrun_fault("link", "host2 down", 1); }
