/* The double's socket transport (nccl_double_net.c): ranks as processes on
 * different "hosts", as NCCL tells hosts apart (host hashes).
 *
 * How a test makes hosts: every rank is a process of its own, and the
 * processes of one host get the same NCCL_HOSTID, the others another one
 * (NCCL's own override of the host hash, misc/utils.cc:69-113).  Without
 * NCCL_HOSTID the hash is the hostname and the boot id, so processes in
 * network namespaces with their own hostnames (UTS namespaces) are hosts
 * too, with nothing else to set.  The ranks find each other through the
 * unique id: it carries the address of the bootstrap root, a listener of
 * the process that called ncclGetUniqueId, on NCCL_SOCKET_IFNAME's
 * interface when set, else the first interface that is not docker, lo or
 * virbr, else loopback; each rank listens on that same choice of its own.
 *
 *  - 2 hosts x 2 ranks: all-reduce (f32 sum over several staging chunks,
 *    f16 sum, bf16 avg, f64 prod, i32 max, a pre-multiplied f32 sum),
 *    broadcast, reduce, all-gather, reduce-scatter, a ring of sends and
 *    receives larger than the rings in one group, and splits across the
 *    hosts (colour r % 2) and within each (colour r / 2): every output is
 *    bit for bit the one of the same job on one host (one NCCL_HOSTID),
 *    the communicators use the transports NCCL's rules pick (sockets
 *    across hosts, the segment within one), and nothing is left in
 *    /dev/shm;
 *  - a rank SIGKILLed in the middle of its third all-reduce
 *    (MESHPG_DOUBLE_FAULT=kill): the survivors, on both hosts, see
 *    ncclRemoteError from ncclCommGetAsyncError within 3 s (a 2 s timeout
 *    + 1 s), and ncclCommAbort returns within 1 s;
 *  - a rank whose second all-reduce never arrives (MESHPG_DOUBLE_FAULT=
 *    hang): the watchdog of every other rank reports the deadlock.
 *
 * Children are this program again (fork + exec), told what to run by
 * MESHPG_NCCL_NET_CHILD, before Criterion's main (child_main). */

#include <criterion/criterion.h>

#include <cuda_runtime.h>
#include <dirent.h>
#include <nccl.h>

#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "double.h"
#include "test_nccl_net.h"

#define NR 4

/* ------------------------------------------------------------------ */
/* The ranks (children)                                               */
/* ------------------------------------------------------------------ */

static int rank;

/* A failed check ends the rank with status 3 and a line on stderr. */
__attribute__((format(printf, 2, 3))) static void ck_fail(int line, const char *fmt, ...) {
  fprintf(stderr, "rank %d, line %d: ", rank, line);
  va_list ap;
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fprintf(stderr, "\n");
  _exit(3);
}

static void nccl_ck(ncclResult_t r, const char *what, int line) {
  if (r != ncclSuccess)
    ck_fail(line, "%s: %s (%s)", what, ncclGetErrorString(r), ncclGetLastError(NULL));
}

static void cuda_ck(cudaError_t e, const char *what, int line) {
  if (e != cudaSuccess) ck_fail(line, "%s: %s", what, cudaGetErrorString(e));
}

#define CK(cond, ...)                          \
  do {                                         \
    if (!(cond)) ck_fail(__LINE__, __VA_ARGS__); \
  } while (0)
#define NOK(expr) nccl_ck((expr), #expr, __LINE__)
#define COK(expr) cuda_ck((expr), #expr, __LINE__)

static FILE *out;
static cudaStream_t stream;

static uint64_t rng_next(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

/* count elements of es bytes: random, finite, rank-dependent. */
static void *fill(size_t count, ncclDataType_t dt, int salt) {
  size_t es = dt == ncclFloat64 ? 8 : dt == ncclFloat16 || dt == ncclBfloat16 ? 2 : 4;
  char *h = malloc(count * es);
  uint64_t s = 0x9e3779b97f4a7c15ULL ^ ((uint64_t)(rank + 1) << 20) ^ (uint64_t)salt;
  for (size_t i = 0; i < count; i++) {
    uint64_t v = rng_next(&s);
    if (dt == ncclFloat32) {
      float f = (float)((double)(v >> 11) / 9007199254740992.0 * 2 - 1) * 100.0f;
      memcpy(h + i * 4, &f, 4);
    } else if (dt == ncclFloat64) {
      double d = 1.0 + ((double)(v >> 11) / 9007199254740992.0 - 0.5) * 0.01;
      memcpy(h + i * 8, &d, 8);
    } else if (dt == ncclFloat16 || dt == ncclBfloat16) {
      uint16_t b = (uint16_t)(v & (dt == ncclFloat16 ? 0xbbffu : 0xbf7fu)); /* finite, < 2 */
      memcpy(h + i * 2, &b, 2);
    } else {
      int32_t x = (int32_t)(v >> 33) - (1 << 29);
      memcpy(h + i * 4, &x, 4);
    }
  }
  void *d = NULL;
  if (cudaMalloc(&d, count * es) != cudaSuccess) return NULL;
  cudaMemcpy(d, h, count * es, cudaMemcpyHostToDevice);
  free(h);
  return d;
}

/* Append a device buffer's bytes to the rank's output. */
static void dump(const void *d, size_t bytes) {
  COK(cudaStreamSynchronize(stream));
  char *h = malloc(bytes);
  COK(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost));
  CK(fwrite(h, 1, bytes, out) == bytes, "write: %s", strerror(errno));
  free(h);
}

static void all_reduce(ncclComm_t c, size_t count, ncclDataType_t dt, ncclRedOp_t op, int salt) {
  size_t es = dt == ncclFloat64 ? 8 : dt == ncclFloat16 || dt == ncclBfloat16 ? 2 : 4;
  void *s = fill(count, dt, salt), *r = NULL;
  COK(cudaMalloc(&r, count * es));
  NOK(ncclAllReduce(s, r, count, dt, op, c, stream));
  dump(r, count * es);
  cudaFree(s);
  cudaFree(r);
}

static void job(ncclComm_t c, int n, const char *want) {
  CK(!strcmp(dbl_nccl_transport(c), want), "transport %s, expected %s", dbl_nccl_transport(c),
     want);
  all_reduce(c, 100003, ncclFloat32, ncclSum, 1); /* 2 chunks of staging */
  all_reduce(c, 70001, ncclFloat16, ncclSum, 2);
  all_reduce(c, 5003, ncclBfloat16, ncclAvg, 3);
  all_reduce(c, 4099, ncclFloat64, ncclProd, 4);
  all_reduce(c, 777, ncclInt32, ncclMax, 5);
  ncclRedOp_t pm;
  float scal = 0.5f + (float)rank * 0.37f;
  NOK(ncclRedOpCreatePreMulSum(&pm, &scal, ncclFloat32, ncclScalarHostImmediate, c));
  all_reduce(c, 3001, ncclFloat32, pm, 6);
  NOK(ncclRedOpDestroy(pm, c));

  size_t cnt = 90001;
  float *s = fill(cnt * (size_t)n, ncclFloat32, 7), *r = NULL;
  COK(cudaMalloc((void **)&r, cnt * (size_t)n * 4));
  NOK(ncclBroadcast(s, r, cnt, ncclFloat32, 2 % n, c, stream));
  dump(r, cnt * 4);
  COK(cudaMemset(r, 0, cnt * 4));
  NOK(ncclReduce(s, r, cnt, ncclFloat32, ncclSum, 1 % n, c, stream));
  dump(r, cnt * 4);
  NOK(ncclAllGather(s, r, cnt, ncclFloat32, c, stream));
  dump(r, cnt * (size_t)n * 4);
  NOK(ncclReduceScatter(s, r, cnt, ncclFloat32, ncclSum, c, stream));
  dump(r, cnt * 4);
  /* A ring of sends and receives, larger than the rings, in one group. */
  size_t pc = 150001; /* within 2 ranks x cnt */
  int me = -1;
  NOK(ncclCommUserRank(c, &me));
  NOK(ncclGroupStart());
  NOK(ncclSend(s, pc, ncclFloat32, (me + 1) % n, c, stream));
  NOK(ncclRecv(r, pc, ncclFloat32, (me + n - 1) % n, c, stream));
  NOK(ncclGroupEnd());
  dump(r, pc * 4);
  cudaFree(s);
  cudaFree(r);
}

/* The rank's device and stream, and its communicator of n ranks from the
 * unique id the parent passed in MESHPG_NCCL_NET_ID (hex). */
static ncclComm_t child_comm(int n, int device) {
  COK(cudaSetDevice(device));
  COK(cudaStreamCreate(&stream));
  ncclUniqueId id;
  const char *hex = getenv("MESHPG_NCCL_NET_ID");
  CK(hex && strlen(hex) == 2 * NCCL_UNIQUE_ID_BYTES, "no id");
  for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; i++) {
    unsigned v;
    sscanf(hex + 2 * i, "%2x", &v);
    id.internal[i] = (char)v;
  }
  ncclComm_t c;
  NOK(ncclCommInitRank(&c, n, id, rank));
  return c;
}

/* 2 ranks per host when hosts = 2: hosts {0, 1} and {2, 3}. */
static int child_job(int n, int hosts, const char *path) {
  out = fopen(path, "wb");
  CK(out != NULL, "fopen %s: %s", path, strerror(errno));
  ncclComm_t c = child_comm(n, hosts == 2 ? rank % 2 : rank), across, within;
  job(c, n, hosts == 2 ? "net" : "shm");
  NOK(ncclCommSplit(c, rank % 2, -rank, &across, NULL));
  job(across, n / 2, hosts == 2 ? "net" : "shm");
  NOK(ncclCommSplit(c, rank / 2, rank, &within, NULL));
  job(within, n / 2, "shm"); /* one host: NCCL's intra-node rule */
  COK(cudaStreamSynchronize(stream));
  NOK(ncclCommDestroy(within));
  NOK(ncclCommDestroy(across));
  NOK(ncclCommDestroy(c));
  CK(fclose(out) == 0, "fclose");
  return 0;
}

/* Rank 3 raises SIGKILL at its third operation; the others must see
 * ncclRemoteError within 3 s of starting to wait, then abort in 1 s. */
static int child_kill(int n) {
  ncclComm_t c = child_comm(n, rank % 2);
  CK(!strcmp(dbl_nccl_transport(c), "net"), "transport %s", dbl_nccl_transport(c));
  float *b = fill(300000, ncclFloat32, 9);
  for (int it = 0; it < 5; it++) {
    NOK(ncclAllReduce(b, b, 300000, ncclFloat32, ncclSum, c, stream));
    double t0 = now_s();
    for (;;) {
      ncclResult_t st = ncclSuccess;
      NOK(ncclCommGetAsyncError(c, &st));
      if (st != ncclSuccess) {
        double waited = now_s() - t0;
        CK(st == ncclRemoteError, "all-reduce %d: %s, expected ncclRemoteError", it,
           ncclGetErrorString(st));
        CK(it == 2, "the error came at all-reduce %d, not 2", it);
        CK(waited < 3.0, "ncclRemoteError after %.2f s, more than the 2 s timeout + 1 s",
           waited);
        fprintf(stderr, "rank %d: ncclRemoteError after %.2f s: %s\n", rank, waited,
                ncclGetLastError(NULL));
        double a0 = now_s();
        NOK(ncclCommAbort(c));
        CK(now_s() - a0 < 1.0, "ncclCommAbort took %.2f s", now_s() - a0);
        return 0;
      }
      cudaError_t q = cudaStreamQuery(stream);
      if (q == cudaSuccess) break;
      CK(q == cudaErrorNotReady, "cudaStreamQuery: %s", cudaGetErrorString(q));
      CK(now_s() - t0 < 3.0, "all-reduce %d: no error and no completion after 3 s", it);
      usleep(2000);
    }
  }
  CK(0, "every all-reduce completed although rank 3 was killed");
  return 3;
}

/* World rank 1's second all-reduce never arrives (MESHPG_DOUBLE_FAULT=
 * hang:1:2) and nothing closes: the other ranks' watchdogs
 * (MESHPG_DOUBLE_HANG_S=1) report the deadlock from their replicas. */
static int child_hang(int n) {
  ncclComm_t c = child_comm(n, rank % 2);
  float *b = fill(1000, ncclFloat32, 9);
  for (int it = 0; it < 3; it++) {
    NOK(ncclAllReduce(b, b, 1000, ncclFloat32, ncclSum, c, stream));
    double t0 = now_s();
    while (cudaStreamQuery(stream) == cudaErrorNotReady) {
      CK(now_s() - t0 < 20, "no report after 20 s");
      usleep(2000);
    }
  }
  CK(0, "every all-reduce completed although rank 1 hung");
  return 3;
}

__attribute__((constructor)) static void child_main(void) {
  const char *mode = getenv("MESHPG_NCCL_NET_CHILD");
  if (!mode) return;
  char what[16], path[512] = "";
  int n = 0, hosts = 0;
  if (sscanf(mode, "%15[a-z]:%d:%d:%d:%511s", what, &rank, &n, &hosts, path) < 4) _exit(2);
  int rc = !strcmp(what, "job")    ? child_job(n, hosts, path)
           : !strcmp(what, "hang") ? child_hang(n)
                                   : child_kill(n);
  fflush(stderr);
  _exit(rc);
}

/* ------------------------------------------------------------------ */
/* The tests                                                          */
/* ------------------------------------------------------------------ */

static int shm_count(char names[][64], int max) {
  DIR *d = opendir("/dev/shm");
  int k = 0;
  if (!d) return 0;
  struct dirent *e;
  while ((e = readdir(d)))
    if (!strncmp(e->d_name, "mpgdbl-", 7) && k < max) snprintf(names[k++], 64, "%.60s", e->d_name);
  closedir(d);
  return k;
}

/* Run NR ranks as processes; rank r on host "meshpg-net-h<host>", 2 per
 * host when hosts is 2.  Each child's stderr goes to the test's. */
static void run(const char *what, int hosts, const char *dir, const char *fault, int *status) {
  ncclUniqueId id;
  cr_assert_eq(ncclGetUniqueId(&id), ncclSuccess);
  char hex[2 * NCCL_UNIQUE_ID_BYTES + 1];
  for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; i++)
    snprintf(hex + 2 * i, 3, "%02x", (unsigned char)id.internal[i]);
  pid_t pids[NR];
  for (int r = 0; r < NR; r++) {
    pids[r] = fork();
    cr_assert_neq(pids[r], -1);
    if (pids[r] == 0) {
      char v[700];
      snprintf(v, sizeof v, "meshpg-net-h%d", hosts == 2 ? r / 2 : 0);
      setenv("NCCL_HOSTID", v, 1);
      if (fault) setenv("MESHPG_DOUBLE_FAULT", fault, 1);
      snprintf(v, sizeof v, "%s:%d:%d:%d:%s/%s-%d.bin", what, r, NR, hosts, dir,
               hosts == 2 ? "hosts" : "one", r);
      setenv("MESHPG_NCCL_NET_CHILD", v, 1);
      setenv("MESHPG_NCCL_NET_ID", hex, 1);
      if (!strcmp(what, "hang")) {
        setenv("MESHPG_DOUBLE_HANG_S", "1", 1);
        snprintf(v, sizeof v, "%s/err-%d.txt", dir, r);
        if (!freopen(v, "w", stderr)) _exit(126);
      }
      char *argv[] = {"test_nccl_double_net", NULL};
      execv("/proc/self/exe", argv);
      _exit(127);
    }
  }
  for (int r = 0; r < NR; r++) {
    if (!strcmp(what, "hang") && r == 1) continue; /* it waits for an abort */
    waitpid(pids[r], &status[r], 0);
  }
  if (!strcmp(what, "hang")) {
    kill(pids[1], SIGKILL);
    waitpid(pids[1], &status[1], 0);
  }
}

static void no_new_segments(char before[][64], int nb) {
  char after[256][64];
  for (int tries = 0; tries < 20; tries++) {
    int na = shm_count(after, 256), fresh = 0;
    for (int i = 0; i < na; i++) {
      int old = 0;
      for (int j = 0; j < nb; j++) old |= !strcmp(after[i], before[j]);
      if (!old) fresh++;
    }
    if (!fresh) return;
    usleep(100000); /* another suite's segment in passing? */
    if (tries == 19) cr_assert_fail("/dev/shm/%s (and %d more) left behind", after[0], fresh - 1);
  }
}

Test(net, two_hosts_equal_one_host_bit_for_bit, .timeout = 120) {
  char dir[] = "/tmp/mpg-net-XXXXXX";
  cr_assert_not_null(mkdtemp(dir));
  char before[256][64];
  int nb = shm_count(before, 256);
  int st[NR];
  run("job", 1, dir, NULL, st);
  for (int r = 0; r < NR; r++)
    cr_assert(WIFEXITED(st[r]) && WEXITSTATUS(st[r]) == 0, "one host, rank %d: 0x%x", r, st[r]);
  double t0 = now_s();
  run("job", 2, dir, NULL, st);
  cr_log_info("2 hosts x 2 ranks: %.2f s", now_s() - t0);
  for (int r = 0; r < NR; r++)
    cr_assert(WIFEXITED(st[r]) && WEXITSTATUS(st[r]) == 0, "2 hosts, rank %d: 0x%x", r, st[r]);
  for (int r = 0; r < NR; r++) {
    size_t la, at = compare_outputs(dir, "one", "hosts", r, &la);
    cr_assert_gt(la, (size_t)1000000);
    cr_assert_eq(at, la, "rank %d: outputs differ at byte %zu of %zu", r, at, la);
  }
  rmdir(dir);
  no_new_segments(before, nb);
}

Test(net, killed_peer_gives_remote_error_on_both_hosts, .timeout = 60) {
  char before[256][64];
  int nb = shm_count(before, 256);
  int st[NR];
  run("kill", 2, "/tmp", "kill:3:3", st);
  cr_assert(WIFSIGNALED(st[3]) && WTERMSIG(st[3]) == SIGKILL, "rank 3: 0x%x", st[3]);
  for (int r = 0; r < 3; r++)
    cr_assert(WIFEXITED(st[r]) && WEXITSTATUS(st[r]) == 0, "rank %d: 0x%x", r, st[r]);
  no_new_segments(before, nb);
}

Test(net, hung_peer_caught_by_the_watchdog, .timeout = 60) {
  char dir[] = "/tmp/mpg-net-XXXXXX";
  cr_assert_not_null(mkdtemp(dir));
  int st[NR];
  run("hang", 2, dir, "hang:1:2", st);
  int reports = 0;
  for (int r = 0; r < NR; r++) {
    char p[600];
    snprintf(p, sizeof p, "%s/err-%d.txt", dir, r);
    size_t len;
    char *e = slurp(p, &len);
    e[len] = '\0';
    if (r != 1) {
      cr_assert(WIFSIGNALED(st[r]) && WTERMSIG(st[r]) == SIGABRT, "rank %d: 0x%x\n%s", r,
                st[r], e);
      /* The first report ends its process; the others may see that close
       * first, and report the deadlock all the same. */
      if (strstr(e, "deadlock") && strstr(e, "ncclAllReduce(count 1000, ncclFloat32, ncclSum) #2"))
        reports++;
    }
    free(e);
    unlink(p);
  }
  rmdir(dir);
  cr_assert_eq(reports, NR - 1, "%d of %d survivors reported the deadlock", reports, NR - 1);
}
