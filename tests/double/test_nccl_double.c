/* The NCCL half of the test double (tests/double/nccl_double.c), on its
 * own: NCCL's API as groups/nccl/ uses it, with ranks as threads (each on
 * its own simulated device, cudaSetDevice(rank)) and as forked processes.
 *
 *  - all-reduce of every dtype and op (sum, prod, max, min, avg, pre-
 *    multiplied sums with host and device scalars) on worlds of 2, 4 and 8
 *    equals a CPU reduction in rank order with the thread backend's
 *    arithmetic (f16/bf16 in f32, rounded once; f32/f64 avg = sum / n),
 *    except that f16/bf16 avg and pre-multiplied f16/bf16 addends are
 *    rounded to the half before the sum, as NCCL does, bit for bit; every
 *    f16 value through a pre-multiplied sum on one rank; f16 avg of tiny
 *    addends at 2, 4 and 8 ranks (1e-7 becomes 0: NCCL's ncclAvg);
 *  - broadcast, reduce, all-gather and reduce-scatter, in and out of place,
 *    over several staging chunks; a 64 MiB all-reduce;
 *  - ncclCommSplit with keys and NCCL_SPLIT_NOCOLOR, blocking and not;
 *  - a ring of sends and receives in one group (larger than the rings), two
 *    messages to one peer, a send to self;
 *  - one thread driving two devices (ncclCommInitAll, one group);
 *  - the non-blocking life cycle (ncclInProgress, ncclCommGetAsyncError,
 *    ncclCommFinalize, ncclCommDestroy) and calls after destroy;
 *  - a kernel stuck on another communicator: ncclCommRevoke first, or every
 *    ncclCommAbort in one group, never waits for it (R8);
 *  - NCCL's argument errors with NCCL's wording, and a non-blocking
 *    communicator keeping the error;
 *  - duplicate GPU refused; abort unblocking a stuck kernel; the hang and
 *    async faults; registration;
 *  - in a child process (the double reports by aborting the process): a
 *    collective order mismatch, a cross-communicator deadlock and a send
 *    without its receive caught by the watchdog, an ncclCommAbort waiting
 *    for another communicator's kernel (R8), a registration mismatch, a
 *    destroy that would leave NCCL's group depth raised, ncclRedOpDestroy
 *    after ncclCommAbort or while the enqueue is still in progress;
 *  - ranks as processes: a forked world all-reduces through the shared
 *    segment, and a child killed by MESHPG_DOUBLE_FAULT=kill gives its
 *    peers ncclRemoteError.
 *
 * Ranks are threads: Criterion's asserts do not run on them; a rank records
 * its first failure (RCHECK) and the test thread asserts.  Each Criterion
 * test is a process of its own, so environment variables set by a test
 * (faults, the watchdog) reach the double before its first use.  Child
 * processes are this program again (fork + exec, so that TSan builds work),
 * told what to run by MESHPG_NCCL_DOUBLE_CHILD (child_main, at the end).
 * Link: the double (cuda_double*.c, cuda_twins.c, nccl_double*.c),
 * Criterion, -lrt -pthread -lm. */

/* The files of this test (their shared helpers are in test_nccl_double.h):
 *   test_nccl_double.c            rank threads, reports that end the
 *                                 process (children), ranks as processes;
 *   test_nccl_double_colls.c      the reference arithmetic, all-reduce of
 *                                 every dtype and op, the other
 *                                 collectives, split, sends and receives;
 *   test_nccl_double_lifecycle.c  argument errors, life cycle, fault
 *                                 injection, registration. */

#include "test_nccl_double.h"

/* ------------------------------------------------------------------------ */
/* Rank threads                                                              */
/* ------------------------------------------------------------------------ */

static pthread_mutex_t fail_mu = PTHREAD_MUTEX_INITIALIZER;
static char fail_msg[4096];

int rank_fail(int rank, int line, const char *fmt, ...) {
  char buf[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  pthread_mutex_lock(&fail_mu);
  if (!fail_msg[0]) snprintf(fail_msg, sizeof fail_msg, "rank %d, line %d: %s", rank, line, buf);
  fprintf(stderr, "rank %d failed at line %d: %s\n", rank, line, buf); /* a crash loses fail_msg */
  pthread_mutex_unlock(&fail_mu);
  return -1;
}

static int rank_body(struct world *w, int r) {
  struct rank rk0 = {r, w->n, NULL, w->arg}, *rk = &rk0;
  CUDA_OK(cudaSetDevice(r));
  if (!w->no_comm) {
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = w->blocking;
    ncclResult_t res = ncclCommInitRankConfig(&rk->comm, w->n, w->id, r, &cfg);
    if (!w->blocking) {
      RCHECK(res == ncclInProgress || res == ncclSuccess, "init: %s", ncclGetErrorString(res));
      ncclResult_t st = ncclInProgress;
      while (st == ncclInProgress) NCCL_OK(ncclCommGetAsyncError(rk->comm, &st));
      res = st;
    }
    RCHECK(res == ncclSuccess, "init: %s (%s)", ncclGetErrorString(res), ncclGetLastError(NULL));
  }
  int ret = w->fn(rk);
  if (rk->comm) {
    if (ret == 0) {
      CUDA_OK(cudaDeviceSynchronize());
      NCCL_OK(ncclCommDestroy(rk->comm));
    } else {
      (void)ncclCommAbort(rk->comm);
    }
  }
  return ret;
}

static void *rank_thread(void *p) {
  struct thread_arg *a = p;
  rank_body(a->w, a->rank);
  return NULL;
}

/* Run fn on n rank threads (a communicator each, from a fresh unique id,
 * unless no_comm); 0, or -1 with fail_msg set.  No Criterion call: forked
 * children use it too. */
static int world_run(int n, int blocking, int no_comm, rank_fn fn, void *arg) {
  struct world w = {n, blocking, no_comm, {{0}}, fn, arg};
  pthread_t th[64];
  struct thread_arg ta[64];
  fail_msg[0] = '\0';
  if (!no_comm && ncclGetUniqueId(&w.id) != ncclSuccess) {
    snprintf(fail_msg, sizeof fail_msg, "ncclGetUniqueId failed");
    return -1;
  }
  for (int i = 0; i < n; i++) {
    ta[i].w = &w;
    ta[i].rank = i;
    if (pthread_create(&th[i], NULL, rank_thread, &ta[i]) != 0) {
      snprintf(fail_msg, sizeof fail_msg, "pthread_create failed");
      n = i;
      break;
    }
  }
  for (int i = 0; i < n; i++) pthread_join(th[i], NULL);
  return fail_msg[0] ? -1 : 0;
}

void run_world_cfg(int n, int blocking, rank_fn fn, void *arg) {
  world_run(n, blocking, 0, fn, arg);
  cr_assert(fail_msg[0] == '\0', "%s", fail_msg);
}

void run_world(int n, rank_fn fn, void *arg) { run_world_cfg(n, 1, fn, arg); }

/* Threads without a communicator made for them. */
void run_threads(int n, rank_fn fn, void *arg) {
  world_run(n, 1, 1, fn, arg);
  cr_assert(fail_msg[0] == '\0', "%s", fail_msg);
}

double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ------------------------------------------------------------------------ */
/* Reports that end the process (run in a forked child)                     */
/* ------------------------------------------------------------------------ */

/* Children are this program again (fork + exec, so that a child starts
 * single-threaded: TSan refuses threads after a fork of a threaded
 * process), told by MESHPG_NCCL_DOUBLE_CHILD which body to run; child_main
 * below runs it before Criterion's main.  Returns the child's wait status
 * and its stderr.  `env` is NAME=VALUE;... for the child. */
static int in_child(const char *mode, const char *env, char *err, size_t errlen) {
  int fds[2];
  cr_assert_eq(pipe(fds), 0);
  pid_t pid = fork();
  cr_assert_neq(pid, -1);
  if (pid == 0) {
    close(fds[0]);
    dup2(fds[1], 2);
    char buf[512];
    snprintf(buf, sizeof buf, "%s", env ? env : "");
    char *save = NULL;
    for (char *t = strtok_r(buf, ";", &save); t; t = strtok_r(NULL, ";", &save)) {
      char *eq = strchr(t, '=');
      if (eq) {
        *eq = '\0';
        setenv(t, eq + 1, 1);
      }
    }
    setenv("MESHPG_NCCL_DOUBLE_CHILD", mode, 1);
    char *argv[] = {"test_nccl_double", NULL};
    execv("/proc/self/exe", argv);
    _exit(127);
  }
  close(fds[1]);
  size_t len = 0;
  ssize_t got;
  while (len + 1 < errlen && (got = read(fds[0], err + len, errlen - 1 - len)) > 0)
    len += (size_t)got;
  err[len] = '\0';
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  return status;
}

/* in_child for a child that must end with SIGABRT (a report). */
static void abort_in_child(const char *mode, const char *env, char *err, size_t errlen) {
  int st = in_child(mode, env, err, errlen);
  cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT, "child status %d; stderr: %s", st, err);
}

/* A comm_pair, A from the unique id rk->arg[0] and B from rk->arg[1]: 0,
 * or -1 after rank_fail. */
int comm_pair_open(struct rank *rk, struct comm_pair *p) {
  ncclUniqueId *ids = rk->arg;
  NCCL_OK(ncclCommInitRank(&p->a, 2, ids[0], rk->rank));
  NCCL_OK(ncclCommInitRank(&p->b, 2, ids[1], rk->rank));
  CUDA_OK(cudaMalloc(&p->x, 64));
  return 0;
}

/* Aborting A alone while rank 0's kernel on B still waits: A's cudaFree
 * waits for that kernel (R8).  The kernel's watchdog names the abort. */
static int abort_one_by_one(struct rank *rk) {
  struct comm_pair p = {0};
  if (comm_pair_open(rk, &p)) return -1;
  if (rk->rank == 1) {
    struct timespec ts = {5, 0};
    nanosleep(&ts, NULL);
    return 0;
  }
  NCCL_OK(ncclAllReduce(p.x, p.x, 4, ncclFloat32, ncclSum, p.b, 0));
  NCCL_OK(ncclCommAbort(p.a)); /* hangs */
  return rank_fail(rk->rank, __LINE__, "the abort returned");
}

Test(reports, abort_waiting_for_another_communicators_kernel) {
  char err[32768];
  abort_in_child("abortonebyone", "MESHPG_DOUBLE_HANG_S=1", err, sizeof err);
  /* Either watchdog may speak first: the CUDA half's, of the abort's wait
   * for the device, or the kernel's, which names the waiting abort. */
  cr_assert(strstr(err, "ncclCommAbort (cudaFree of the communicator's buffers)") ||
                (strstr(err, "ncclCommAbort of rank 0 of communicator") && strstr(err, "PR 564")),
            "stderr: %s", err);
  cr_assert(strstr(err, "ncclAllReduce(count 4, ncclFloat32, ncclSum) #1"), "stderr: %s", err);
}

static int mismatch(struct rank *rk) {
  void *b = NULL;
  CUDA_OK(cudaMalloc(&b, 64));
  if (rk->rank == 0) NCCL_OK(ncclAllReduce(b, b, 4, ncclFloat32, ncclSum, rk->comm, 0));
  else NCCL_OK(ncclAllGather(b, (char *)b + 16, 4, ncclFloat32, rk->comm, 0));
  CUDA_OK(cudaStreamSynchronize(0));
  return 0;
}


Test(reports, collective_order_mismatch_is_fatal) {
  char err[16384];
  abort_in_child("mismatch", NULL, err, sizeof err);
  cr_assert(strstr(err, "does not match") && strstr(err, "ncclAllReduce(count 4, ncclFloat32, ncclSum)") &&
                strstr(err, "ncclAllGather(count 4, ncclFloat32)") && strstr(err, "rank 0") &&
                strstr(err, "rank 1"),
            "stderr: %s", err);
}

/* Two communicators, used in opposite orders on one stream by the two
 * ranks: each kernel waits for a peer that waits for the other. */
static int cross(struct rank *rk) {
  struct comm_pair p = {0};
  if (comm_pair_open(rk, &p)) return -1;
  ncclComm_t first = rk->rank == 0 ? p.a : p.b, second = rk->rank == 0 ? p.b : p.a;
  NCCL_OK(ncclAllReduce(p.x, p.x, 4, ncclFloat32, ncclSum, first, 0));
  NCCL_OK(ncclAllReduce(p.x, p.x, 4, ncclFloat32, ncclSum, second, 0));
  /* No host wait: the kernels' watchdog reports, not the CUDA half's. */
  struct timespec ts = {5, 0};
  nanosleep(&ts, NULL);
  return rank_fail(rk->rank, __LINE__, "the deadlock was not reported");
}


Test(reports, cross_communicator_deadlock_is_reported) {
  char err[32768];
  double t0 = now_s();
  abort_in_child("cross", "MESHPG_DOUBLE_HANG_S=1", err, sizeof err);
  cr_assert(strstr(err, "deadlock") && strstr(err, "collective #1 ncclAllReduce(count 4, ncclFloat32, ncclSum)") &&
                strstr(err, "rank 0") && strstr(err, "rank 1") && strstr(err, "its kernel is at collective #0"),
            "stderr: %s", err);
  /* MESHPG_DOUBLE_HANG_S=1 plus 1 s for the child's start and report,
   * with the scheduler's allowance for its two rank threads. */
  cr_assert(now_s() - t0 < tb_bound(1.0 + 1.0, 2), "took %.1f s (bound %.1f s)", now_s() - t0,
            tb_bound(1.0 + 1.0, 2));
}


Test(reports, registration_mismatch_is_fatal) {
  char err[16384];
  abort_in_child("regmismatch", NULL, err, sizeof err);
  cr_assert(strstr(err, "User Buffer Registration"), "stderr: %s", err);
}

static int unmatched_send(struct rank *rk) {
  void *b = NULL;
  CUDA_OK(cudaMalloc(&b, 64));
  if (rk->rank == 0) NCCL_OK(ncclSend(b, 16, ncclFloat32, 1, rk->comm, 0));
  struct timespec ts = {5, 0};
  nanosleep(&ts, NULL);
  return rank_fail(rk->rank, __LINE__, "the unmatched send was not reported");
}

Test(reports, send_without_receive_is_reported) {
  char err[16384];
  abort_in_child("unmatched", "MESHPG_DOUBLE_HANG_S=1", err, sizeof err);
  cr_assert(strstr(err, "deadlock") && strstr(err, "it waits in send #1 ncclSend(count 16, ncclFloat32, peer 1)") &&
                strstr(err, "rank 1's kernels have started 0 receives from rank 0"),
            "stderr: %s", err);
}

static int destroy_twice(struct rank *rk) {
  NCCL_OK(ncclCommDestroy(rk->comm));
  EXPECT_ERR(ncclCommDestroy(rk->comm), ncclInvalidArgument, "has already been destroyed");
  rk->comm = NULL;
  (void)ncclGroupStart(); /* real NCCL's group depth is still raised: reported */
  return 0;
}


Test(reports, destroy_twice_then_use) {
  char err[16384];
  abort_in_child("destroytwice", NULL, err, sizeof err);
  cr_assert(strstr(err, "ncclGroupStart called after ncclCommDestroy"), "stderr: %s", err);
}

/* ncclRedOpDestroy after ncclCommAbort (NCCL frees the operation with the
 * communicator: a write to freed memory), and on a non-blocking
 * communicator whose enqueue answered ncclInProgress, before
 * ncclCommGetAsyncError reported ncclSuccess (the user guide allows only
 * ncclCommGetAsyncError and ncclCommAbort then). */
static int redop_destroy_misuse(struct rank *rk) {
  int after_abort = rk->arg != NULL;
  float one = 1.0f;
  ncclRedOp_t op;
  void *b = NULL;
  CUDA_OK(cudaMalloc(&b, 64));
  NCCL_OK(ncclRedOpCreatePreMulSum(&op, &one, ncclFloat32, ncclScalarHostImmediate, rk->comm));
  if (after_abort) {
    NCCL_OK(ncclCommAbort(rk->comm));
    (void)ncclRedOpDestroy(op, rk->comm); /* reported */
    rk->comm = NULL;
    return rank_fail(rk->rank, __LINE__, "ncclRedOpDestroy after ncclCommAbort was not reported");
  }
  ncclResult_t r = ncclAllReduce(b, b, 4, ncclFloat32, op, rk->comm, 0);
  RCHECK(r == ncclInProgress, "non-blocking ncclAllReduce: %s", ncclGetErrorString(r));
  (void)ncclRedOpDestroy(op, rk->comm); /* reported */
  return rank_fail(rk->rank, __LINE__, "ncclRedOpDestroy while in progress was not reported");
}

Test(reports, redop_destroy_after_abort) {
  char err[16384];
  abort_in_child("redopabort", NULL, err, sizeof err);
  cr_assert(strstr(err, "ncclRedOpDestroy") && strstr(err, "after ncclCommAbort") &&
                strstr(err, "init.cc:264"),
            "stderr: %s", err);
}

Test(reports, redop_destroy_while_in_progress) {
  char err[16384];
  abort_in_child("redopinprogress", NULL, err, sizeof err);
  cr_assert(strstr(err, "ncclRedOpDestroy") && strstr(err, "still in progress"), "stderr: %s",
            err);
}

/* ------------------------------------------------------------------------ */
/* Ranks as processes                                                        */
/* ------------------------------------------------------------------------ */

/* Child rank r of n: init on device r, two all-reduces (the second is
 * where MESHPG_DOUBLE_FAULT=kill:2:2 strikes), then either check the sums
 * or, when `expect_death`, wait for the asynchronous error of the dead
 * peer and abort.  Exit status 0 on success. */
static int proc_rank(const ncclUniqueId *id, int r, int n, int expect_death) {
  if (cudaSetDevice(r) != cudaSuccess) return 10;
  ncclComm_t c = NULL;
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  ncclResult_t res = ncclCommInitRankConfig(&c, n, *id, r, &cfg);
  ncclResult_t st = res;
  while (st == ncclInProgress) ncclCommGetAsyncError(c, &st);
  if (st != ncclSuccess) {
    fprintf(stderr, "rank %d init: %s %s\n", r, ncclGetErrorString(st), ncclGetLastError(NULL));
    return 11;
  }
  const size_t count = 300000;
  float *h = malloc(count * 4);
  void *b = NULL;
  for (size_t i = 0; i < count; i++) h[i] = (float)(i % 100) * (float)(r + 1);
  cudaMalloc(&b, count * 4);
  cudaMemcpy(b, h, count * 4, cudaMemcpyHostToDevice);
  for (int k = 0; k < 2; k++) {
    res = ncclAllReduce(b, b, count, ncclFloat32, ncclSum, c, 0);
    if (res != ncclSuccess && res != ncclInProgress) return 12;
    st = ncclInProgress;
    while (st == ncclInProgress) ncclCommGetAsyncError(c, &st);
  }
  if (expect_death) {
    double t0 = now_s();
    st = ncclSuccess;
    while (st == ncclSuccess && now_s() - t0 < 10) {
      ncclCommGetAsyncError(c, &st);
      usleep(1000);
    }
    if (st != ncclRemoteError) {
      fprintf(stderr, "rank %d: async state %s\n", r, ncclGetErrorString(st));
      return 13;
    }
    if (!strstr(ncclGetLastError(NULL), "Connection closed by remote peer") ||
        !strstr(ncclGetLastError(NULL), "rank 2")) {
      fprintf(stderr, "rank %d: message %s\n", r, ncclGetLastError(NULL));
      return 14;
    }
    if (ncclCommAbort(c) != ncclSuccess) return 15;
    return 0;
  }
  cudaStreamSynchronize(0);
  cudaMemcpy(h, b, count * 4, cudaMemcpyDeviceToHost);
  /* first sum: (i % 100) * n(n+1)/2 everywhere; the second multiplies by n */
  float f = (float)(n * (n + 1) / 2) * (float)n;
  for (size_t i = 0; i < count; i++)
    if (h[i] != (float)(i % 100) * f) {
      fprintf(stderr, "rank %d element %zu: %g\n", r, i, (double)h[i]);
      return 16;
    }
  if (ncclCommFinalize(c) != ncclInProgress) return 17;
  st = ncclInProgress;
  while (st == ncclInProgress) ncclCommGetAsyncError(c, &st);
  if (st != ncclSuccess || ncclCommDestroy(c) != ncclSuccess) return 18;
  cudaFree(b);
  free(h);
  return 0;
}

static void run_procs(int n, int kill_rank, int *status) {
  ncclUniqueId id;
  cr_assert_eq(ncclGetUniqueId(&id), ncclSuccess);
  char hex[2 * NCCL_UNIQUE_ID_BYTES + 1];
  for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; i++)
    snprintf(hex + 2 * i, 3, "%02x", (unsigned char)id.internal[i]);
  pid_t pids[8];
  for (int r = 0; r < n; r++) {
    pids[r] = fork();
    cr_assert_neq(pids[r], -1);
    if (pids[r] == 0) {
      char v[64];
      if (kill_rank >= 0) {
        snprintf(v, sizeof v, "kill:%d:2", kill_rank);
        setenv("MESHPG_DOUBLE_FAULT", v, 1);
      }
      snprintf(v, sizeof v, "proc:%d:%d:%d", r, n, kill_rank >= 0);
      setenv("MESHPG_NCCL_DOUBLE_CHILD", v, 1);
      setenv("MESHPG_NCCL_DOUBLE_ID", hex, 1);
      char *argv[] = {"test_nccl_double", NULL};
      execv("/proc/self/exe", argv);
      _exit(127);
    }
  }
  for (int r = 0; r < n; r++) waitpid(pids[r], &status[r], 0);
}

Test(processes, forked_ranks_all_reduce) {
  int status[3];
  run_procs(3, -1, status);
  for (int r = 0; r < 3; r++)
    cr_assert(WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 0, "rank %d: status 0x%x", r,
              status[r]);
}

Test(processes, killed_rank_gives_remote_error) {
  int status[3];
  run_procs(3, 2, status);
  cr_assert(WIFSIGNALED(status[2]) && WTERMSIG(status[2]) == SIGKILL, "rank 2: status 0x%x",
            status[2]);
  for (int r = 0; r < 2; r++)
    cr_assert(WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 0, "rank %d: status 0x%x", r,
              status[r]);
}

/* Two threads that open a comm_pair with fn. */
static void child_pair(rank_fn fn) {
  ncclUniqueId ids[2];
  ncclGetUniqueId(&ids[0]);
  ncclGetUniqueId(&ids[1]);
  world_run(2, 1, 1, fn, ids);
}

/* The bodies of the children (see in_child and run_procs), run before
 * Criterion's main when MESHPG_NCCL_DOUBLE_CHILD is set. */
__attribute__((constructor)) static void child_main(void) {
  const char *mode = getenv("MESHPG_NCCL_DOUBLE_CHILD");
  if (!mode) return;
  int r = -1, n = 0, death = 0;
  if (!strcmp(mode, "mismatch")) {
    world_run(2, 1, 0, mismatch, NULL);
  } else if (!strcmp(mode, "cross")) {
    child_pair(cross);
  } else if (!strcmp(mode, "regmismatch")) {
    world_run(2, 1, 0, registered, (void *)1);
  } else if (!strcmp(mode, "abortonebyone")) {
    child_pair(abort_one_by_one);
  } else if (!strcmp(mode, "unmatched")) {
    world_run(2, 1, 0, unmatched_send, NULL);
  } else if (!strcmp(mode, "destroytwice")) {
    world_run(1, 1, 0, destroy_twice, NULL);
  } else if (!strcmp(mode, "redopabort")) {
    world_run(1, 1, 0, redop_destroy_misuse, (void *)1);
  } else if (!strcmp(mode, "redopinprogress")) {
    world_run(1, 0, 0, redop_destroy_misuse, NULL);
  } else if (sscanf(mode, "proc:%d:%d:%d", &r, &n, &death) == 3) {
    const char *hex = getenv("MESHPG_NCCL_DOUBLE_ID");
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    for (int i = 0; hex && i < NCCL_UNIQUE_ID_BYTES && hex[2 * i] && hex[2 * i + 1]; i++) {
      unsigned v = 0;
      sscanf(hex + 2 * i, "%2x", &v);
      id.internal[i] = (char)v;
    }
    _exit(proc_rank(&id, r, n, death));
  } else {
    fprintf(stderr, "unknown MESHPG_NCCL_DOUBLE_CHILD=%s\n", mode);
    _exit(126);
  }
  if (fail_msg[0]) fprintf(stderr, "child %s: %s\n", mode, fail_msg);
  _exit(fail_msg[0] ? 1 : 0);
}
