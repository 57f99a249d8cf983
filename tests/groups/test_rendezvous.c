/* meshpg's own rendezvous (groups/rendezvous.h), which hands the NCCL unique
 * id from rank 0 to the other ranks at MASTER_ADDR so that the library
 * never writes NCCL_COMM_ID (issue 30).  Ranks are threads on loopback;
 * nothing here needs NCCL.
 *  - property: random world sizes, payloads and arrival orders; every rank
 *    gets rank 0's bytes exactly;
 *  - ranks that disagree on the world size, a rank that never comes, no
 *    rank 0, a port in use, an address that does not resolve, a stray
 *    connection: each a clear error (or no effect), never a hang;
 *  - the environment is left as it was. */
#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "../../groups/rendezvous.h"
#include "../support/clock.h"
#include "meshpg.h"

extern char **environ;
double mpg__now(void);

#define MAX_RANKS 12
#define MAX_BYTES 4096


/* A port for case i of this process, away from the ephemeral range. */
static int port_for(int i) { return 20000 + (int)((getpid() * 37 + i * 101) % 12000); }

typedef struct {
  const char *addr;
  int port, rank, size;
  double delay_s, timeout_s;
  size_t n;
  unsigned char buf[MAX_BYTES];
  mpg_status st;
  char msg[1024];
} job;

static void *run_job(void *p) {
  job *j = p;
  if (j->delay_s > 0) sleep_s(j->delay_s);
  j->st = mpg__rendezvous_bcast("test", j->addr, j->port, j->rank, j->size, j->buf, j->n,
                                mpg__now() + j->timeout_s);
  snprintf(j->msg, sizeof j->msg, "%s", j->st ? mpg_last_error() : "");
  return NULL;
}

static void run_jobs(job *jobs, int n) {
  pthread_t t[MAX_RANKS + 2];
  for (int i = 0; i < n; i++) cr_assert_eq(pthread_create(&t[i], NULL, run_job, &jobs[i]), 0);
  for (int i = 0; i < n; i++) pthread_join(t[i], NULL);
}

static job make_job(const char *addr, int port, int rank, int size, size_t n, double timeout) {
  job j;
  memset(&j, 0, sizeof j);
  j.addr = addr;
  j.port = port;
  j.rank = rank;
  j.size = size;
  j.n = n;
  j.timeout_s = timeout;
  return j;
}

static int count_environ(void) {
  int n = 0;
  while (environ[n]) n++;
  return n;
}

Test(rendezvous, random_worlds_get_rank0_bytes, .timeout = 120) {
  srand(12345);
  int env_before = count_environ();
  static job jobs[MAX_RANKS];
  for (int c = 0; c < 40; c++) {
    int size = 1 + rand() % MAX_RANKS;
    size_t n = 1 + (size_t)(rand() % MAX_BYTES);
    int port = port_for(c);
    for (int r = 0; r < size; r++) {
      jobs[r] = make_job(c % 2 ? "localhost" : "127.0.0.1", port, r, size, n, 30);
      jobs[r].delay_s = (rand() % 4 == 0) ? (rand() % 50) * 1e-3 : 0;
      for (size_t b = 0; b < n; b++)
        jobs[r].buf[b] = r == 0 ? (unsigned char)rand() : (unsigned char)0xEE;
    }
    run_jobs(jobs, size);
    for (int r = 0; r < size; r++) {
      cr_assert_eq(jobs[r].st, MPG_OK, "case %d (world %d, %zu bytes) rank %d: %s", c, size, n,
                   r, jobs[r].msg);
      cr_assert_eq(memcmp(jobs[r].buf, jobs[0].buf, n), 0,
                   "case %d: rank %d got other bytes than rank 0 sent", c, r);
    }
  }
  cr_assert_eq(count_environ(), env_before, "the environment changed");
  cr_assert_null(getenv("NCCL_COMM_ID"));
}

Test(rendezvous, ipv6_loopback, .timeout = 60) {
  int probe = socket(AF_INET6, SOCK_STREAM, 0);
  struct sockaddr_in6 a6;
  memset(&a6, 0, sizeof a6);
  a6.sin6_family = AF_INET6;
  a6.sin6_addr = in6addr_loopback;
  if (probe < 0 || bind(probe, (struct sockaddr *)&a6, sizeof a6) != 0) {
    if (probe >= 0) close(probe);
    cr_skip_test("no IPv6 loopback on this machine");
  }
  close(probe);
  job jobs[3];
  for (int r = 0; r < 3; r++) {
    jobs[r] = make_job("::1", port_for(50), r, 3, 128, 20);
    memset(jobs[r].buf, r == 0 ? 0x5A : 0, 128);
  }
  run_jobs(jobs, 3);
  for (int r = 0; r < 3; r++) {
    cr_assert_eq(jobs[r].st, MPG_OK, "rank %d: %s", r, jobs[r].msg);
    cr_assert_eq(jobs[r].buf[127], 0x5A);
  }
}

/* Rank 0 runs a world of 2; a rank started with a world of 3 is told so at
 * once, and the right rank 1 is still served. */
Test(rendezvous, world_sizes_that_differ, .timeout = 60) {
  job jobs[3];
  int port = port_for(51);
  jobs[0] = make_job("127.0.0.1", port, 0, 2, 128, 20);
  jobs[1] = make_job("127.0.0.1", port, 2, 3, 128, 20);
  jobs[2] = make_job("127.0.0.1", port, 1, 2, 128, 20);
  jobs[2].delay_s = 0.3; /* after the stray rank was answered */
  memset(jobs[0].buf, 7, 128);
  run_jobs(jobs, 3);
  cr_assert_eq(jobs[0].st, MPG_OK, "%s", jobs[0].msg);
  cr_assert_eq(jobs[2].st, MPG_OK, "%s", jobs[2].msg);
  cr_assert_eq(jobs[2].buf[0], 7);
  cr_assert_eq(jobs[1].st, MPG_ERR_ENV, "%s: %s", mpg_status_name(jobs[1].st), jobs[1].msg);
  cr_assert(strstr(jobs[1].msg, "world of 3") && strstr(jobs[1].msg, "rank 0 has 2"), "%s",
            jobs[1].msg);
  cr_assert_neq(jobs[1].buf[0], 7, "a rank of another world got the bytes");
}

/* Ranks 2 and 3 of a world of 4 never come: rank 0 names them. */
Test(rendezvous, rank0_names_missing_ranks, .timeout = 60) {
  job jobs[2];
  int port = port_for(52);
  jobs[0] = make_job("127.0.0.1", port, 0, 4, 128, 0.5);
  jobs[1] = make_job("127.0.0.1", port, 1, 4, 128, 20);
  run_jobs(jobs, 2);
  cr_assert_eq(jobs[1].st, MPG_OK, "%s", jobs[1].msg);
  cr_assert_eq(jobs[0].st, MPG_ERR_TIMEOUT, "%s: %s", mpg_status_name(jobs[0].st),
               jobs[0].msg);
  cr_assert(strstr(jobs[0].msg, "2 of the 3 other ranks") && strstr(jobs[0].msg, "ranks 2, 3"),
            "%s", jobs[0].msg);
}

Test(rendezvous, no_rank0_times_out, .timeout = 60) {
  job j = make_job("127.0.0.1", port_for(53), 1, 2, 128, 0.4);
  double t0 = mpg__now();
  run_jobs(&j, 1);
  cr_assert_eq(j.st, MPG_ERR_TIMEOUT, "%s: %s", mpg_status_name(j.st), j.msg);
  cr_assert(strstr(j.msg, "MASTER_ADDR=127.0.0.1") && strstr(j.msg, "did rank 0 start"), "%s",
            j.msg);
  cr_assert_lt(mpg__now() - t0, 30.0, "no hang");
}

Test(rendezvous, port_in_use, .timeout = 60) {
  int port = port_for(54);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_port = htons((uint16_t)port);
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
  cr_assert_eq(listen(fd, 1), 0);
  job j = make_job("127.0.0.1", port, 0, 2, 128, 0.3);
  run_jobs(&j, 1);
  close(fd);
  cr_assert_eq(j.st, MPG_ERR_ENV, "%s: %s", mpg_status_name(j.st), j.msg);
  cr_assert(strstr(j.msg, "MESHPG_NCCL_PORT"), "%s", j.msg);
}

Test(rendezvous, unknown_address_and_bad_arguments) {
  job j = make_job("no-such-host.invalid", port_for(55), 1, 2, 128, 5);
  run_jobs(&j, 1);
  cr_assert_eq(j.st, MPG_ERR_ENV, "%s: %s", mpg_status_name(j.st), j.msg);
  cr_assert(strstr(j.msg, "MASTER_ADDR=no-such-host.invalid"), "%s", j.msg);
  unsigned char b[8];
  cr_assert_eq(mpg__rendezvous_bcast("t", "127.0.0.1", 0, 0, 2, b, 8, mpg__now() + 1),
               MPG_ERR_INVALID);
  cr_assert_eq(mpg__rendezvous_bcast("t", "127.0.0.1", 20000, 2, 2, b, 8, mpg__now() + 1),
               MPG_ERR_INVALID);
  cr_assert_eq(mpg__rendezvous_bcast("t", "", 20000, 0, 2, b, 8, mpg__now() + 1),
               MPG_ERR_INVALID);
}

/* A stray connection that sends garbage, and one that closes at once, do
 * not stop rank 0 from serving the real rank. */
static void *stray(void *p) {
  int port = *(int *)p;
  for (int k = 0; k < 2; k++) {
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    for (int tries = 0; tries < 200; tries++) {
      int fd = socket(AF_INET, SOCK_STREAM, 0);
      if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0) {
        if (k == 0) (void)!write(fd, "GET / HTTP/1.0\r\n\r\n", 18);
        close(fd);
        break;
      }
      close(fd);
      sleep_s(0.01);
    }
  }
  return NULL;
}

Test(rendezvous, stray_connections, .timeout = 60) {
  int port = port_for(56);
  job jobs[2];
  jobs[0] = make_job("127.0.0.1", port, 0, 2, 64, 20);
  jobs[1] = make_job("127.0.0.1", port, 1, 2, 64, 20);
  jobs[1].delay_s = 0.3;
  memset(jobs[0].buf, 3, 64);
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, stray, &port), 0);
  run_jobs(jobs, 2);
  pthread_join(t, NULL);
  cr_assert_eq(jobs[0].st, MPG_OK, "%s", jobs[0].msg);
  cr_assert_eq(jobs[1].st, MPG_OK, "%s", jobs[1].msg);
  cr_assert_eq(jobs[1].buf[63], 3);
}
