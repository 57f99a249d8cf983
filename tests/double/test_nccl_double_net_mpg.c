/* meshpg's NCCL backend on the double's socket transport
 * (nccl_double_net.c), launched torchrun style: four processes with RANK,
 * WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT,
 * no MPI, no NCCL_COMM_ID (rank 0 makes the unique id; meshpg's rendezvous
 * hands it over; the id names rank 0's bootstrap root).
 *
 * "Hosts" are told apart by NCCL_HOSTID (NCCL's override of the host
 * hash): ranks 0, 1 on one host, 2, 3 on the other, each host with 2
 * simulated devices (MESHPG_DOUBLE_DEVICES=2, LOCAL_RANK picks one).  In
 * network namespaces with their own hostnames, leave NCCL_HOSTID unset: the
 * hostname differs, and so does the hash; set NCCL_SOCKET_IFNAME to the
 * bridge's interface when the first non-loopback one is not it.
 *
 *  - mesh dp=2 x tp=2 (tp inside a host, dp across): all-reduces on tp and
 *    dp, an all-gather on dp and a reduce-scatter on tp, bit for bit equal
 *    to the same job with every rank on one host;
 *  - mesh dp=4 across both hosts, all-reduces in a loop with a 2 s
 *    timeout; the test SIGKILLs rank 3 in the middle: every survivor's
 *    call returns MPG_ERR_TIMEOUT, MPG_ERR_ABORTED or MPG_ERR_BACKEND
 *    within the timeout + 1 s, and mpg_ctx_destroy returns within 3 s;
 *    the same with rank 3 stopped (SIGSTOP) instead: its sockets stay open,
 *    and meshpg's timeout and abort end every wait. */
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <criterion/criterion.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "meshpg.h"
#include "test_nccl_net.h"

#define NR 4
#define COUNT 70001

static int rank;

#define CK(cond, ...)                                                            \
  do {                                                                           \
    if (!(cond)) {                                                               \
      fprintf(stderr, "rank %d, line %d: ", rank, __LINE__);                      \
      fprintf(stderr, __VA_ARGS__);                                              \
      fprintf(stderr, " (%s)\n", mpg_last_error());                              \
      _exit(3);                                                                  \
    }                                                                            \
  } while (0)

static mpg_ctx *create(const char *dims, mpg_mesh **mesh, double timeout_s) {
  mpg_spec spec = MPG_SPEC_INIT;
  CK(mpg_spec_init(&spec) == MPG_OK, "spec");
  CK(mpg_spec_set_mesh(&spec, dims) == MPG_OK, "mesh %s", dims);
  CK(mpg_mesh_create(&spec, NR, mesh) == MPG_OK, "mesh");
  mpg_init_opts o = MPG_INIT_OPTS_INIT;
  o.backend.name = MPG_BACKEND_NCCL;
  o.backend.timeout_s = timeout_s;
  mpg_ctx *ctx = NULL;
  mpg_status st = mpg_ctx_create(*mesh, &o, &ctx);
  CK(st == MPG_OK, "mpg_ctx_create: %s", mpg_status_name(st));
  return ctx;
}

static float *dev_rand(mpg_ctx *ctx, size_t n, int salt) {
  void *p = NULL;
  CK(mpg_ctx_mem_alloc(ctx, n * sizeof(float), 0, &p) == MPG_OK, "alloc");
  float *h = malloc(n * sizeof *h);
  uint64_t s = 0x243f6a8885a308d3ULL ^ ((uint64_t)(rank + 1) << 24) ^ (uint64_t)salt;
  for (size_t i = 0; i < n; i++) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    h[i] = (float)((double)(s >> 11) / 9007199254740992.0 - 0.5) * 1000.0f;
  }
  cudaMemcpy(p, h, n * sizeof *h, cudaMemcpyHostToDevice);
  free(h);
  return p;
}

static void dump(FILE *out, const float *d, size_t n) {
  float *h = malloc(n * sizeof *h);
  CK(cudaDeviceSynchronize() == cudaSuccess, "sync");
  cudaMemcpy(h, d, n * sizeof *h, cudaMemcpyDeviceToHost);
  CK(fwrite(h, sizeof *h, n, out) == n, "write");
  free(h);
}

static int child_job(const char *prefix) {
  char path[700];
  snprintf(path, sizeof path, "%s-%d.bin", prefix, rank);
  FILE *out = fopen(path, "wb");
  CK(out != NULL, "fopen %s", path);
  mpg_mesh *mesh = NULL;
  mpg_ctx *ctx = create("dp=2,tp=2", &mesh, 60);
  mpg_group *dp = NULL, *tp = NULL;
  CK(mpg_ctx_group(ctx, "dp", &dp) == MPG_OK, "dp");
  CK(mpg_ctx_group(ctx, "tp", &tp) == MPG_OK, "tp");
  float *x = dev_rand(ctx, 2 * COUNT, 1), *y = dev_rand(ctx, 2 * COUNT, 2);
  CK(mpg_all_reduce(tp, x, y, COUNT, MPG_F32, MPG_OP_SUM, NULL, NULL) == MPG_OK, "tp ar");
  dump(out, y, COUNT);
  CK(mpg_all_reduce(dp, y, x, 2 * COUNT, MPG_F32, MPG_OP_SUM, NULL, NULL) == MPG_OK, "dp ar");
  dump(out, x, 2 * COUNT);
  CK(mpg_all_gather(dp, x, y, COUNT, MPG_F32, NULL, NULL) == MPG_OK, "dp ag");
  dump(out, y, 2 * COUNT);
  CK(mpg_reduce_scatter(tp, y, x, COUNT, MPG_F32, MPG_OP_SUM, NULL, NULL) == MPG_OK, "tp rs");
  dump(out, x, COUNT);
  mpg_ctx_mem_free(ctx, x);
  mpg_ctx_mem_free(ctx, y);
  CK(mpg_ctx_destroy(ctx) == MPG_OK, "destroy");
  mpg_mesh_destroy(mesh);
  CK(fclose(out) == 0, "fclose");
  return 0;
}

/* All-reduces until one fails (rank 3 is killed meanwhile): it must fail
 * within the 2 s timeout + 1 s. */
static int child_kill(int ready_fd) {
  mpg_mesh *mesh = NULL;
  mpg_ctx *ctx = create("dp=4", &mesh, 2.0);
  mpg_group *dp = NULL;
  CK(mpg_ctx_group(ctx, "dp", &dp) == MPG_OK, "dp");
  float *x = dev_rand(ctx, COUNT, 3);
  double start = now_s();
  for (int it = 0;; it++) {
    double t0 = now_s();
    mpg_status st = mpg_all_reduce(dp, x, x, COUNT, MPG_F32, MPG_OP_SUM, NULL, NULL);
    if (st == MPG_OK) {
      CK(cudaDeviceSynchronize() == cudaSuccess, "sync");
      if (it == 0) CK(write(ready_fd, "r", 1) == 1, "ready");
      CK(now_s() - start < 30, "no failure after 30 s");
      continue;
    }
    double waited = now_s() - t0;
    CK(st == MPG_ERR_TIMEOUT || st == MPG_ERR_ABORTED || st == MPG_ERR_BACKEND,
       "all-reduce %d: %s", it, mpg_status_name(st));
    CK(waited < 3.0, "all-reduce %d failed after %.2f s, more than the timeout + 1 s", it,
       waited);
    fprintf(stderr, "rank %d: all-reduce %d: %s after %.2f s: %s\n", rank, it,
            mpg_status_name(st), waited, mpg_last_error());
    break;
  }
  double d0 = now_s();
  mpg_status st = mpg_ctx_destroy(ctx);
  fprintf(stderr, "rank %d: mpg_ctx_destroy: %s after %.2f s\n", rank, mpg_status_name(st),
          now_s() - d0);
  CK(now_s() - d0 < 3.0, "mpg_ctx_destroy took %.2f s", now_s() - d0);
  mpg_mesh_destroy(mesh);
  return 0;
}

__attribute__((constructor)) static void child_main(void) {
  const char *mode = getenv("MESHPG_NCCL_NET_MPG_CHILD");
  if (!mode) return;
  const char *r = getenv("RANK");
  rank = r ? atoi(r) : -1;
  int rc = !strncmp(mode, "job:", 4) ? child_job(mode + 4) : child_kill(atoi(mode + 5));
  fflush(stderr);
  _exit(rc);
}

/* ------------------------------------------------------------------ */

/* A free port below the usual ephemeral range (32768 and up), where the
 * double's own listeners and every connection take theirs. */
static int free_port(void) {
  static unsigned seed;
  if (!seed) seed = (unsigned)getpid() * 2654435761u;
  for (int tries = 0; tries < 200; tries++) {
    int port = 20000 + (int)(rand_r(&seed) % 10000);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_ANY)};
    int ok = bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0;
    close(fd);
    if (ok) return port;
  }
  cr_assert_fail("no free port in 20000..29999");
  return -1;
}

/* Start the NR ranks: rank r on host r / 2 when hosts is 2. */
static void start(pid_t *pids, int hosts, const char *mode) {
  char port[16], nccl_port[16];
  snprintf(port, sizeof port, "%d", free_port());
  snprintf(nccl_port, sizeof nccl_port, "%d", free_port()); /* meshpg's id rendezvous */
  for (int r = 0; r < NR; r++) {
    pids[r] = fork();
    cr_assert_neq(pids[r], -1);
    if (pids[r] != 0) continue;
    char v[64];
    snprintf(v, sizeof v, "meshpg-net-h%d", hosts == 2 ? r / 2 : 0);
    setenv("NCCL_HOSTID", v, 1);
    snprintf(v, sizeof v, "%d", r);
    setenv("RANK", v, 1);
    setenv("WORLD_SIZE", "4", 1);
    snprintf(v, sizeof v, "%d", hosts == 2 ? r % 2 : r);
    setenv("LOCAL_RANK", v, 1);
    setenv("LOCAL_WORLD_SIZE", hosts == 2 ? "2" : "4", 1);
    setenv("MESHPG_DOUBLE_DEVICES", hosts == 2 ? "2" : "4", 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", port, 1);
    setenv("MESHPG_NCCL_PORT", nccl_port, 1);
    unsetenv("NCCL_COMM_ID");
    unsetenv("OMPI_COMM_WORLD_SIZE");
    setenv("MESHPG_NCCL_NET_MPG_CHILD", mode, 1);
    char *argv[] = {"test_nccl_double_net_mpg", NULL};
    execv("/proc/self/exe", argv);
    _exit(127);
  }
}

Test(net_mpg, torchrun_two_hosts_equal_one_host, .timeout = 120) {
  char dir[] = "/tmp/mpg-netmpg-XXXXXX";
  cr_assert_not_null(mkdtemp(dir));
  for (int hosts = 1; hosts <= 2; hosts++) {
    pid_t pids[NR];
    char mode[600];
    snprintf(mode, sizeof mode, "job:%s/h%d", dir, hosts);
    start(pids, hosts, mode);
    for (int r = 0; r < NR; r++) {
      int st = 0;
      waitpid(pids[r], &st, 0);
      cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%d host(s), rank %d: 0x%x", hosts, r,
                st);
    }
  }
  for (int r = 0; r < NR; r++) {
    size_t la, at = compare_outputs(dir, "h1", "h2", r, &la);
    cr_assert_eq(la, (size_t)6 * COUNT * sizeof(float));
    cr_assert_eq(at, la, "rank %d: 2 hosts differ from one host", r);
  }
  rmdir(dir);
}

static void lose_rank3(int sig) {
  int fds[2];
  cr_assert_eq(pipe(fds), 0);
  char mode[32];
  snprintf(mode, sizeof mode, "kill:%d", fds[1]);
  pid_t pids[NR];
  start(pids, 2, mode);
  close(fds[1]);
  char buf[NR];
  size_t got = 0;
  while (got < NR) {
    ssize_t n = read(fds[0], buf, NR - got);
    cr_assert_gt(n, 0, "a rank ended before its first all-reduce");
    got += (size_t)n;
  }
  usleep(200000);
  kill(pids[3], sig);
  for (int r = 0; r < NR - 1; r++) {
    int st = 0;
    waitpid(pids[r], &st, 0);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "rank %d: 0x%x", r, st);
  }
  kill(pids[3], SIGKILL);
  int st = 0;
  waitpid(pids[3], &st, 0);
  cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "rank 3: 0x%x", st);
  close(fds[0]);
}

Test(net_mpg, torchrun_killed_rank_fails_survivors_in_time, .timeout = 90) {
  lose_rank3(SIGKILL);
}

/* A stopped peer keeps its connections open: only meshpg's timeout (and
 * the abort it makes, which unblocks the double's socket waits) ends the
 * survivors' calls. */
Test(net_mpg, torchrun_stalled_rank_times_out_survivors, .timeout = 90) {
  lose_rank3(SIGSTOP);
}
