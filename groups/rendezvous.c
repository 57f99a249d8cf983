/* meshpg's own rendezvous: rank 0 hands a payload to every other rank over
 * TCP at MASTER_ADDR:port.  The protocol is in rendezvous.h.  (getaddrinfo,
 * accept4 and MSG_NOSIGNAL need _GNU_SOURCE, which meson sets.) */
#include "rendezvous.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "backend.h"

#define HELLO_BYTES 20
#define REPLY_HEAD 8
#define MAGIC "MPGRDV01"
#define MAX_PAYLOAD 4096

enum verdict { SERVED = 0, SIZE_DIFFERS = 1, RANK_OUT_OF_RANGE = 2, LENGTH_DIFFERS = 3 };

static void put_u32(unsigned char *p, uint32_t v) {
  p[0] = (unsigned char)(v >> 24);
  p[1] = (unsigned char)(v >> 16);
  p[2] = (unsigned char)(v >> 8);
  p[3] = (unsigned char)v;
}

static uint32_t get_u32(const unsigned char *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

static void pause_s(double s) {
  struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  nanosleep(&ts, NULL);
}

/* Milliseconds left until the deadline, at least 0, at most cap_ms. */
static int ms_left(double deadline, int cap_ms) {
  double left = (deadline - mpg__now()) * 1e3;
  if (left <= 0) return 0;
  return left > cap_ms ? cap_ms : (int)left + 1;
}

/* Move all n bytes through fd (non-blocking) by the deadline: 0, or -1
 * with errno (ETIMEDOUT when late, ECONNRESET when the peer closed). */
static int move_all(int fd, void *buf, size_t n, int sending, double deadline) {
  unsigned char *p = buf;
  size_t done = 0;
  while (done < n) {
    ssize_t k = sending ? send(fd, p + done, n - done, MSG_NOSIGNAL)
                        : recv(fd, p + done, n - done, 0);
    if (k > 0) {
      done += (size_t)k;
      continue;
    }
    if (k == 0) {
      errno = ECONNRESET;
      return -1;
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return -1;
    struct pollfd pf = {fd, (short)(sending ? POLLOUT : POLLIN), 0};
    int wait = ms_left(deadline, 1000);
    if (wait == 0) {
      errno = ETIMEDOUT;
      return -1;
    }
    if (poll(&pf, 1, wait) < 0 && errno != EINTR) return -1;
  }
  return 0;
}

static mpg_status resolve(const char *what, const char *addr, int port, int passive,
                          struct addrinfo **out) {
  char service[16];
  snprintf(service, sizeof service, "%d", port);
  struct addrinfo hints;
  memset(&hints, 0, sizeof hints);
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_family = AF_UNSPEC;
  int rc = getaddrinfo(addr, service, &hints, out);
  if (rc != 0)
    return mpg__fail(MPG_ERR_ENV, "%s: MASTER_ADDR=%s does not resolve (%s)", what, addr,
                     gai_strerror(rc));
  if (passive) {
    /* Listen on the wildcard address of MASTER_ADDR's family. */
    int family = (*out)->ai_family;
    freeaddrinfo(*out);
    hints.ai_family = family;
    hints.ai_flags = AI_PASSIVE;
    rc = getaddrinfo(NULL, service, &hints, out);
    if (rc != 0)
      return mpg__fail(MPG_ERR_ENV, "%s: no wildcard address for port %d (%s)", what, port,
                       gai_strerror(rc));
  }
  return MPG_OK;
}

/* ------------------------------------------------------------------ */
/* Rank 0                                                             */
/* ------------------------------------------------------------------ */

/* A listening socket on the wildcard address, retried while the port is
 * busy (a previous world's rank 0 still serving) until the deadline. */
static mpg_status listen_on(const char *what, const char *addr, int port, int size,
                            double deadline, int *fd_out) {
  struct addrinfo *ai = NULL;
  mpg_status st = resolve(what, addr, port, 1, &ai);
  if (st) return st;
  int err = 0;
  for (;;) {
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd >= 0) {
      int one = 1;
      (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
      if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, size) == 0) {
        freeaddrinfo(ai);
        *fd_out = fd;
        return MPG_OK;
      }
      err = errno;
      close(fd);
    } else {
      err = errno;
    }
    if (err != EADDRINUSE || mpg__now() >= deadline) break;
    pause_s(0.01);
  }
  freeaddrinfo(ai);
  return mpg__fail(MPG_ERR_ENV,
                   "%s: rank 0 cannot listen on port %d (%s); set MESHPG_NCCL_PORT to a "
                   "free port",
                   what, port, strerror(err));
}

/* Answer one connection: 1 when it served a new rank, else 0. */
static int serve_one(int fd, int size, const void *buf, size_t n, unsigned char *served,
                     double deadline) {
  unsigned char hello[HELLO_BYTES];
  /* A connection gets at most 10 s to say hello: one that never does
   * (a port scanner, a stray client) does not hold up the others long. */
  double by = mpg__now() + 10.0 < deadline ? mpg__now() + 10.0 : deadline;
  if (move_all(fd, hello, sizeof hello, 0, by) != 0 || memcmp(hello, MAGIC, 8) != 0) return 0;
  uint32_t r = get_u32(hello + 8), their_size = get_u32(hello + 12);
  enum verdict v = SERVED;
  if (their_size != (uint32_t)size) v = SIZE_DIFFERS;
  else if (get_u32(hello + 16) != (uint32_t)n) v = LENGTH_DIFFERS;
  else if (r < 1 || r >= (uint32_t)size) v = RANK_OUT_OF_RANGE;
  unsigned char *reply = calloc(1, REPLY_HEAD + n);
  if (!reply) return 0;
  put_u32(reply, (uint32_t)v);
  put_u32(reply + 4, (uint32_t)size);
  if (v == SERVED) memcpy(reply + REPLY_HEAD, buf, n);
  int fresh = 0;
  if (move_all(fd, reply, REPLY_HEAD + n, 1, by) == 0 && v == SERVED && !served[r]) {
    served[r] = 1;
    fresh = 1;
  }
  free(reply);
  return fresh;
}

/* "3, 5, 6 and 9 more" */
static void list_missing(const unsigned char *served, int size, char *text, size_t cap) {
  size_t used = 0;
  int shown = 0, more = 0;
  text[0] = 0;
  for (int r = 1; r < size; r++) {
    if (served[r]) continue;
    if (shown == 8) {
      more++;
      continue;
    }
    int k = snprintf(text + used, cap - used, "%s%d", shown ? ", " : "", r);
    if (k > 0 && (size_t)k < cap - used) used += (size_t)k;
    shown++;
  }
  if (more) snprintf(text + used, cap - used, " and %d more", more);
}

static mpg_status serve(const char *what, const char *addr, int port, int size,
                        const void *buf, size_t n, double deadline) {
  int lfd = -1;
  mpg_status st = listen_on(what, addr, port, size, deadline, &lfd);
  if (st) return st;
  unsigned char *served = calloc((size_t)size, 1);
  if (!served) {
    close(lfd);
    return mpg__fail(MPG_ERR_NOMEM, "%s: out of memory", what);
  }
  int left = size - 1;
  while (left > 0) {
    int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) {
      left -= serve_one(fd, size, buf, n, served, deadline);
      close(fd);
      continue;
    }
    int wait = ms_left(deadline, 1000);
    if (wait == 0) break;
    struct pollfd pf = {lfd, POLLIN, 0};
    (void)poll(&pf, 1, wait);
  }
  close(lfd);
  if (left > 0) {
    char missing[160];
    list_missing(served, size, missing, sizeof missing);
    st = mpg__fail(MPG_ERR_TIMEOUT,
                   "%s: rank 0 listened on port %d (MASTER_ADDR=%s) until the timeout, and "
                   "%d of the %d other ranks never asked for the unique id: rank%s %s",
                   what, port, addr, left, size - 1, left > 1 ? "s" : "", missing);
  }
  free(served);
  return st;
}

/* ------------------------------------------------------------------ */
/* Other ranks                                                        */
/* ------------------------------------------------------------------ */

/* Connect to one address by the deadline (at most 1 s per try): the fd,
 * or -1 with errno. */
static int connect_one(const struct addrinfo *a, double deadline) {
  int fd = socket(a->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) return fd;
  if (errno == EINPROGRESS) {
    struct pollfd pf = {fd, POLLOUT, 0};
    int err = 0;
    socklen_t len = sizeof err;
    if (poll(&pf, 1, ms_left(deadline, 1000)) == 1 &&
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0)
      return fd;
    errno = err ? err : ETIMEDOUT;
  }
  int keep = errno;
  close(fd);
  errno = keep;
  return -1;
}

/* One try: 1 served (buf filled), 0 retry (errno says why), or a status
 * other than MPG_OK through *st when rank 0 refused this rank. */
static int ask_once(const char *what, const struct addrinfo *ai, int rank, int size, void *buf,
                    size_t n, double deadline, mpg_status *st) {
  int fd = -1;
  for (const struct addrinfo *a = ai; a && fd < 0; a = a->ai_next) fd = connect_one(a, deadline);
  if (fd < 0) return 0;
  unsigned char hello[HELLO_BYTES], head[REPLY_HEAD];
  memcpy(hello, MAGIC, 8);
  put_u32(hello + 8, (uint32_t)rank);
  put_u32(hello + 12, (uint32_t)size);
  put_u32(hello + 16, (uint32_t)n);
  int ok = move_all(fd, hello, sizeof hello, 1, deadline) == 0 &&
           move_all(fd, head, sizeof head, 0, deadline) == 0;
  uint32_t v = ok ? get_u32(head) : 0, their_size = ok ? get_u32(head + 4) : 0;
  if (ok && v == SERVED) ok = move_all(fd, buf, n, 0, deadline) == 0;
  int keep = errno;
  close(fd);
  errno = keep;
  if (!ok) return 0;
  if (v == SERVED) return 1;
  if (v == SIZE_DIFFERS)
    *st = mpg__fail(MPG_ERR_ENV,
                    "%s: rank %d has a world of %d ranks, but rank 0 has %u: the ranks were "
                    "started with different world sizes (WORLD_SIZE or opts.world_size)",
                    what, rank, size, their_size);
  else if (v == LENGTH_DIFFERS)
    *st = mpg__fail(MPG_ERR_ENV,
                    "%s: rank 0 hands out a payload of another length than the %zu bytes "
                    "rank %d expects (a different meshpg build?)",
                    what, n, rank);
  else
    *st = mpg__fail(MPG_ERR_ENV, "%s: rank 0 refused rank %d of %d (verdict %u)", what, rank,
                    size, v);
  return 0;
}

static mpg_status ask(const char *what, const char *addr, int port, int rank, int size,
                      void *buf, size_t n, double deadline) {
  struct addrinfo *ai = NULL;
  mpg_status st = resolve(what, addr, port, 0, &ai);
  if (st) return st;
  int err = 0, got = 0;
  double backoff = 0.005;
  for (;;) {
    if ((got = ask_once(what, ai, rank, size, buf, n, deadline, &st))) break;
    err = errno;
    if (st || mpg__now() >= deadline) break;
    pause_s(backoff);
    if (backoff < 0.2) backoff *= 2;
  }
  freeaddrinfo(ai);
  if (st || got) return st;
  return mpg__fail(MPG_ERR_TIMEOUT,
                   "%s: rank %d of %d got nothing from rank 0 at MASTER_ADDR=%s port %d "
                   "within the timeout (last try: %s); did rank 0 start?",
                   what, rank, size, addr, port, strerror(err ? err : ETIMEDOUT));
}

mpg_status mpg__rendezvous_bcast(const char *what, const char *addr, int port, int rank,
                                 int size, void *buf, size_t n, double deadline) {
  if (!addr || !addr[0] || port < 1 || port > 65535 || size < 1 || rank < 0 ||
      rank >= size || !buf || n == 0 || n > MAX_PAYLOAD)
    return mpg__fail(MPG_ERR_INVALID,
                     "%s: rendezvous of rank %d of %d at \"%s\" port %d with %zu bytes", what,
                     rank, size, addr ? addr : "", port, n);
  if (size == 1) return MPG_OK;
  if (rank == 0) return serve(what, addr, port, size, buf, n, deadline);
  return ask(what, addr, port, rank, size, buf, n, deadline);
}
