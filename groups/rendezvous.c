/* meshpg's own rendezvous: rank 0 hands a payload to every other rank over
 * TCP at MASTER_ADDR:port, to the ranks that prove they hold the job key
 * only.  The protocol is in rendezvous.h; the threat model in
 * docs/launchers.md.  The MACs are OpenSSL's HMAC-SHA256 (EVP_MAC),
 * compared with CRYPTO_memcmp; nonces come from RAND_bytes.  (getaddrinfo,
 * accept4 and MSG_NOSIGNAL need _GNU_SOURCE, which meson sets.) */
#include "rendezvous.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <openssl/rand.h>
#include <poll.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "backend.h"

#define MAGIC "MPGRDV02"
#define NONCE 16
#define MAC_BYTES 32
#define CHALLENGE_BYTES (8 + NONCE)                  /* magic, Ns */
#define HELLO_BYTES (8 + 12 + NONCE + MAC_BYTES)    /* magic, r, size, n, Nc, MAC */
#define REPLY_HEAD (12 + MAC_BYTES)                  /* verdict, size, len, MAC */
#define MAX_PAYLOAD 4096
#define ADDR_TEXT 64        /* "[v6 address]:port" */
#define RDV_HELLO_S 2.0     /* a connection's time to say hello, and to take its reply */
#define RDV_TRY_S 5.0       /* a rank's time for one try, connection to reply */
#define RDV_PENDING 64      /* connections rank 0 holds before they prove the key */
#define MIN_KEY_BYTES 16

enum verdict {
  SERVED = 0,
  SIZE_DIFFERS = 1,
  RANK_OUT_OF_RANGE = 2,
  LENGTH_DIFFERS = 3,
  ALREADY_SERVED = 4
};

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

/* ------------------------------------------------------------------ */
/* HMAC-SHA256 and the job key                                        */
/* ------------------------------------------------------------------ */

typedef struct {
  const void *p;
  size_t n;
} span;

/* out = HMAC-SHA256(key, the spans one after the other): 1, or 0 when
 * libcrypto fails. */
static int hmac(const unsigned char *key, size_t key_len, const span *parts, int count,
                unsigned char out[MAC_BYTES]) {
  EVP_MAC *mac = EVP_MAC_fetch(NULL, "HMAC", NULL);
  EVP_MAC_CTX *ctx = mac ? EVP_MAC_CTX_new(mac) : NULL;
  char digest[] = "SHA256";
  OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
                         OSSL_PARAM_construct_end()};
  size_t len = 0;
  int ok = ctx && EVP_MAC_init(ctx, key, key_len, params);
  for (int i = 0; ok && i < count; i++)
    if (parts[i].n) ok = EVP_MAC_update(ctx, parts[i].p, parts[i].n);
  ok = ok && EVP_MAC_final(ctx, out, &len, MAC_BYTES) && len == MAC_BYTES;
  EVP_MAC_CTX_free(ctx);
  EVP_MAC_free(mac);
  return ok;
}

static mpg_status crypto_fail(const char *what, const char *call) {
  return mpg__fail(MPG_ERR_BACKEND, "%s: libcrypto's %s failed", what, call);
}

/* The label under which a job identity becomes a key. */
static const unsigned char key_label[] = "meshpg-rdv-key-v2";

static mpg_status derive(const char *source, const char *value, const char *extra,
                         mpg__rdv_key *out) {
  span parts[] = {{source, strlen(source) + 1},
                  {value, strlen(value) + 1},
                  {extra ? extra : "", extra ? strlen(extra) + 1 : 1}};
  if (!hmac(key_label, sizeof key_label - 1, parts, 3, out->bytes))
    return crypto_fail("job key", "HMAC-SHA256");
  snprintf(out->source, sizeof out->source, "%s", source);
  return MPG_OK;
}

mpg_status mpg__rendezvous_key_from_env(mpg__rdv_key *out) {
  memset(out, 0, sizeof *out);
  const char *secret = getenv("MESHPG_JOB_KEY");
  if (secret && *secret) {
    if (strlen(secret) < MIN_KEY_BYTES)
      return mpg__fail(MPG_ERR_ENV,
                       "MESHPG_JOB_KEY is %zu bytes long: a job key needs at least %d (for "
                       "example `openssl rand -hex 32`, the same on every rank)",
                       strlen(secret), MIN_KEY_BYTES);
    return derive("MESHPG_JOB_KEY", secret, NULL, out);
  }
  const char *v = getenv("TORCHELASTIC_RUN_ID");
  /* torchrun's default --rdzv-id is "none": the same for every job. */
  if (v && *v && strcmp(v, "none") != 0) return derive("TORCHELASTIC_RUN_ID", v, NULL, out);
  if ((v = getenv("SLURM_JOB_ID")) && *v)
    return derive("SLURM_JOB_ID", v, getenv("SLURM_STEP_ID"), out);
  if ((v = getenv("PMIX_NAMESPACE")) && *v) return derive("PMIX_NAMESPACE", v, NULL, out);
  if ((v = getenv("OMPI_MCA_ess_base_jobid")) && *v)
    return derive("OMPI_MCA_ess_base_jobid", v, NULL, out);
  mpg__log(1,
           "rendezvous: no MESHPG_JOB_KEY and no job id from the launcher "
           "(TORCHELASTIC_RUN_ID, SLURM_JOB_ID, PMIX_NAMESPACE): the ranks share the "
           "key of every job without one, which keeps other keyed jobs out but not a "
           "stranger or another such job on this port; set MESHPG_JOB_KEY "
           "(docs/launchers.md)");
  return derive("no job id", "", NULL, out);
}

/* ------------------------------------------------------------------ */
/* Sockets                                                            */
/* ------------------------------------------------------------------ */

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

/* "10.0.0.2:4711", "[::1]:4711" */
static void addr_text(const struct sockaddr *sa, socklen_t len, char *text, size_t cap) {
  char host[NI_MAXHOST], serv[NI_MAXSERV];
  if (getnameinfo(sa, len, host, sizeof host, serv, sizeof serv,
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    snprintf(text, cap, "?");
    return;
  }
  snprintf(text, cap, sa->sa_family == AF_INET6 ? "[%s]:%s" : "%s:%s", host, serv);
}

static void local_text(int fd, char *text, size_t cap) {
  struct sockaddr_storage ss;
  socklen_t len = sizeof ss;
  if (getsockname(fd, (struct sockaddr *)&ss, &len) == 0)
    addr_text((struct sockaddr *)&ss, len, text, cap);
  else
    snprintf(text, cap, "?");
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

/* The MAC of a hello (client: "meshpg-rdv-c") over the fields as sent. */
static int hello_mac(const mpg__rdv_key *key, const unsigned char *ns, const unsigned char *nc,
                     const unsigned char *fields12, unsigned char out[MAC_BYTES]) {
  span parts[] = {{"meshpg-rdv-c", 12}, {ns, NONCE}, {nc, NONCE}, {fields12, 12}};
  return hmac(key->bytes, sizeof key->bytes, parts, 4, out);
}

/* The MAC of a reply (server: "meshpg-rdv-s"): the hello's fields, the
 * reply's head (verdict, size, len) and its body. */
static int reply_mac(const mpg__rdv_key *key, const unsigned char *ns, const unsigned char *nc,
                     const unsigned char *fields12, const unsigned char *head12,
                     const unsigned char *body, size_t len, unsigned char out[MAC_BYTES]) {
  span parts[] = {{"meshpg-rdv-s", 12}, {nc, NONCE},   {ns, NONCE},
                  {fields12, 12},       {head12, 12}, {body, len}};
  return hmac(key->bytes, sizeof key->bytes, parts, 6, out);
}

/* ------------------------------------------------------------------ */
/* Rank 0                                                             */
/* ------------------------------------------------------------------ */

/* A listening socket on the wildcard address, retried while the port is
 * busy (a previous world's rank 0 still serving) until the deadline. */
static mpg_status listen_on(const char *what, const char *addr, int port, double deadline,
                            int *fd_out) {
  struct addrinfo *ai = NULL;
  mpg_status st = resolve(what, addr, port, 1, &ai);
  if (st) return st;
  int err = 0;
  for (;;) {
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd >= 0) {
      int one = 1;
      (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
      /* A deep backlog: connections are accepted as fast as they come,
       * and a full queue would make a real rank's SYN wait a second. */
      if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, SOMAXCONN) == 0) {
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

/* One connection of rank 0. */
typedef struct {
  int fd;               /* -1: a free slot */
  int replying;         /* 0: sending the challenge, then reading the hello */
  double by;            /* this stage's deadline */
  double born;
  unsigned char ns[NONCE];
  unsigned char in[HELLO_BYTES];
  size_t got;
  unsigned char challenge[CHALLENGE_BYTES];
  unsigned char *out;   /* what is being sent: challenge, or the reply (owned) */
  size_t out_len, out_done;
  uint32_t rank;
  enum verdict verdict;
  char peer[ADDR_TEXT];
} conn;

typedef struct {
  const char *what;
  const mpg__rdv_key *key;
  int size;
  const void *buf;
  size_t n;
  conn conns[RDV_PENDING];
  unsigned char *claimed;      /* per rank: 1 once a verified hello claimed it */
  unsigned char *served;       /* per rank: 1 once its reply went out */
  char (*claimer)[ADDR_TEXT];  /* per rank: the peer it was claimed by */
  int left;                    /* ranks not served */
  int rejected;                /* hellos that did not prove the key, or not meshpg */
  char last_rejected[ADDR_TEXT];
  conn *dup;                   /* a second claim: rank 0 stops once it has its reply */
  char dup_msg[512];
  mpg_status st;               /* set: stop now (libcrypto, memory) */
} server;

static void drop(server *s, conn *c) {
  if (c->fd < 0) return;
  if (c->replying && c->verdict == SERVED && !s->served[c->rank]) s->claimed[c->rank] = 0;
  close(c->fd);
  if (c->out != c->challenge) free(c->out);
  memset(c, 0, sizeof *c);
  c->fd = -1;
}

static void reject(server *s, conn *c) {
  s->rejected++;
  snprintf(s->last_rejected, sizeof s->last_rejected, "%s", c->peer);
  mpg__log(2, "%s: rank 0 dropped the connection from %s: its hello did not prove the job key",
           s->what, c->peer);
  drop(s, c);
}

/* A verified or refused hello of c: the reply to send. */
static void answer(server *s, conn *c) {
  const unsigned char *f = c->in + 8;
  uint32_t r = get_u32(f), their_size = get_u32(f + 4), their_n = get_u32(f + 8);
  unsigned char mac[MAC_BYTES];
  if (memcmp(c->in, MAGIC, 8) != 0) {
    reject(s, c);
    return;
  }
  if (!hello_mac(s->key, c->ns, c->in + 20, f, mac)) {
    s->st = crypto_fail(s->what, "HMAC-SHA256");
    return;
  }
  if (CRYPTO_memcmp(mac, c->in + 20 + NONCE, MAC_BYTES) != 0) {
    reject(s, c);
    return;
  }
  enum verdict v = SERVED;
  const unsigned char *body = NULL;
  size_t len = 0;
  if (their_size != (uint32_t)s->size) v = SIZE_DIFFERS;
  else if (their_n != (uint32_t)s->n) v = LENGTH_DIFFERS;
  else if (r < 1 || r >= (uint32_t)s->size) v = RANK_OUT_OF_RANGE;
  else if (s->claimed[r]) v = ALREADY_SERVED;
  if (v == SERVED) {
    s->claimed[r] = 1;
    snprintf(s->claimer[r], ADDR_TEXT, "%s", c->peer);
    body = s->buf;
    len = s->n;
  } else if (v == ALREADY_SERVED) {
    body = (const unsigned char *)s->claimer[r];
    len = strlen(s->claimer[r]);
    snprintf(s->dup_msg, sizeof s->dup_msg,
             "%s: rank %u of %d was claimed twice with this job's key: first by %s, then by "
             "%s (two processes started as rank %u?); rank 0 stops",
             s->what, r, s->size, s->claimer[r], c->peer, r);
    s->dup = c;
  }
  unsigned char *reply = malloc(REPLY_HEAD + len);
  if (!reply) {
    s->st = mpg__fail(MPG_ERR_NOMEM, "%s: out of memory", s->what);
    return;
  }
  put_u32(reply, (uint32_t)v);
  put_u32(reply + 4, (uint32_t)s->size);
  put_u32(reply + 8, (uint32_t)len);
  if (len) memcpy(reply + REPLY_HEAD, body, len);
  if (!reply_mac(s->key, c->ns, c->in + 20, f, reply, reply + REPLY_HEAD, len, reply + 12)) {
    free(reply);
    s->st = crypto_fail(s->what, "HMAC-SHA256");
    return;
  }
  c->replying = 1;
  c->rank = r;
  c->verdict = v;
  c->out = reply;
  c->out_len = REPLY_HEAD + len;
  c->out_done = 0;
  c->by = mpg__now() + RDV_HELLO_S;
}

/* Move c along as far as its socket lets it. */
static void progress(server *s, conn *c) {
  while (c->fd >= 0 && c->out_done < c->out_len) {
    ssize_t k = send(c->fd, c->out + c->out_done, c->out_len - c->out_done, MSG_NOSIGNAL);
    if (k > 0) {
      c->out_done += (size_t)k;
      continue;
    }
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    drop(s, c);
    return;
  }
  if (c->fd < 0) return;
  if (c->replying) { /* the reply went out whole */
    if (c->verdict == SERVED && !s->served[c->rank]) {
      s->served[c->rank] = 1;
      s->left--;
      mpg__log(2, "%s: rank 0 served rank %u at %s", s->what, c->rank, c->peer);
    }
    drop(s, c);
    return;
  }
  while (c->got < HELLO_BYTES) {
    ssize_t k = recv(c->fd, c->in + c->got, HELLO_BYTES - c->got, 0);
    if (k > 0) {
      c->got += (size_t)k;
      continue;
    }
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (c->got > 0) reject(s, c); /* a short hello */
    else drop(s, c);
    return;
  }
  answer(s, c);
  if (!s->st && c->fd >= 0) progress(s, c);
}

/* Take every connection waiting in the listen queue. */
static void accept_all(server *s, int lfd) {
  for (int k = 0; k < 4 * RDV_PENDING; k++) {
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    int fd = accept4(lfd, (struct sockaddr *)&ss, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return; /* EAGAIN, or out of descriptors: later */
    conn *slot = NULL, *oldest = NULL;
    for (int i = 0; i < RDV_PENDING; i++) {
      conn *c = &s->conns[i];
      if (c->fd < 0) {
        slot = c;
        break;
      }
      if (!c->replying && (!oldest || c->born < oldest->born)) oldest = c;
    }
    if (!slot && oldest) { /* full: the oldest that has not proved the key goes */
      drop(s, oldest);
      slot = oldest;
    }
    if (!slot) {
      close(fd);
      continue;
    }
    memset(slot, 0, sizeof *slot);
    slot->fd = fd;
    slot->born = mpg__now();
    slot->by = slot->born + RDV_HELLO_S;
    addr_text((struct sockaddr *)&ss, len, slot->peer, sizeof slot->peer);
    if (RAND_bytes(slot->ns, NONCE) != 1) {
      s->st = crypto_fail(s->what, "RAND_bytes");
      return;
    }
    memcpy(slot->challenge, MAGIC, 8);
    memcpy(slot->challenge + 8, slot->ns, NONCE);
    slot->out = slot->challenge;
    slot->out_len = CHALLENGE_BYTES;
    progress(s, slot);
  }
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

static mpg_status serve(const char *what, const mpg__rdv_key *key, const char *addr, int port,
                        int size, const void *buf, size_t n, double deadline) {
  int lfd = -1;
  mpg_status st = listen_on(what, addr, port, deadline, &lfd);
  if (st) return st;
  server *s = calloc(1, sizeof *s);
  if (s) {
    s->claimed = calloc((size_t)size, 1);
    s->served = calloc((size_t)size, 1);
    s->claimer = calloc((size_t)size, ADDR_TEXT);
  }
  if (!s || !s->claimed || !s->served || !s->claimer) {
    if (s) {
      free(s->claimed);
      free(s->served);
      free(s->claimer);
    }
    free(s);
    close(lfd);
    return mpg__fail(MPG_ERR_NOMEM, "%s: out of memory", what);
  }
  s->what = what;
  s->key = key;
  s->size = size;
  s->buf = buf;
  s->n = n;
  s->left = size - 1;
  for (int i = 0; i < RDV_PENDING; i++) s->conns[i].fd = -1;
  struct pollfd pf[RDV_PENDING + 1];
  int at[RDV_PENDING + 1];
  while (!s->st && (s->dup ? s->dup->fd >= 0 : s->left > 0)) {
    double now = mpg__now();
    if (now >= deadline) break;
    int np = 1, wait = ms_left(deadline, 1000);
    pf[0] = (struct pollfd){lfd, POLLIN, 0};
    for (int i = 0; i < RDV_PENDING; i++) {
      conn *c = &s->conns[i];
      if (c->fd < 0) continue;
      if (now >= c->by) { /* silent or slow: its time is up */
        drop(s, c);
        continue;
      }
      int w = ms_left(c->by, 1000);
      if (w < wait) wait = w;
      pf[np] = (struct pollfd){c->fd, (short)(c->out_done < c->out_len ? POLLOUT : POLLIN), 0};
      at[np++] = i;
    }
    if (poll(pf, (nfds_t)np, wait) < 0) {
      if (errno == EINTR) continue;
      st = mpg__fail(MPG_ERR_BACKEND, "%s: rank 0's poll failed (%s)", what, strerror(errno));
      break;
    }
    for (int k = 1; k < np && !s->st; k++)
      if (pf[k].revents) progress(s, &s->conns[at[k]]);
    if (!s->st && !s->dup && (pf[0].revents & POLLIN)) accept_all(s, lfd);
  }
  for (int i = 0; i < RDV_PENDING; i++) drop(s, &s->conns[i]);
  close(lfd);
  if (!st && s->st) st = s->st;
  if (!st && s->dup) st = mpg__fail(MPG_ERR_ENV, "%s", s->dup_msg);
  if (!st && s->left > 0) {
    char missing[160], strangers[256] = "";
    list_missing(s->served, size, missing, sizeof missing);
    if (s->rejected)
      snprintf(strangers, sizeof strangers,
               "; %d connection%s did not prove the job key (the last from %s: another "
               "job, a stranger, or a rank whose key differs)",
               s->rejected, s->rejected > 1 ? "s" : "", s->last_rejected);
    st = mpg__fail(MPG_ERR_TIMEOUT,
                   "%s: rank 0 listened on port %d (MASTER_ADDR=%s, job key from %s) until "
                   "the timeout, and %d of the %d other ranks never asked for the unique id: "
                   "rank%s %s%s",
                   what, port, addr, key->source, s->left, size - 1, s->left > 1 ? "s" : "",
                   missing, strangers);
  }
  free(s->claimed);
  free(s->served);
  free(s->claimer);
  free(s);
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

/* Why the tries of a rank failed, for its timeout message: the most
 * telling reason seen (a forged reply beats a refused connection). */
typedef struct {
  char text[256];
  int weight;
} why;

static void say(why *w, int weight, const char *fmt, ...) MPG__PRINTF(3, 4);
static void say(why *w, int weight, const char *fmt, ...) {
  if (weight < w->weight) return;
  w->weight = weight;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(w->text, sizeof w->text, fmt, ap);
  va_end(ap);
}

/* One try: 1 served (buf filled), 0 retry (*w says why), or a status
 * other than MPG_OK through *st when rank 0 refused this rank. */
static int ask_once(const char *what, const mpg__rdv_key *key, const struct addrinfo *ai,
                    int rank, int size, void *buf, size_t n, double deadline, why *w,
                    mpg_status *st) {
  double by = mpg__now() + RDV_TRY_S < deadline ? mpg__now() + RDV_TRY_S : deadline;
  int fd = -1;
  for (const struct addrinfo *a = ai; a && fd < 0; a = a->ai_next) fd = connect_one(a, by);
  if (fd < 0) {
    say(w, 0, "%s", strerror(errno ? errno : ETIMEDOUT));
    return 0;
  }
  unsigned char challenge[CHALLENGE_BYTES], hello[HELLO_BYTES], head[REPLY_HEAD];
  unsigned char body[MAX_PAYLOAD > ADDR_TEXT ? MAX_PAYLOAD : ADDR_TEXT];
  unsigned char mac[MAC_BYTES];
  int got = 0;
  if (move_all(fd, challenge, sizeof challenge, 0, by) != 0) {
    say(w, 1, "no challenge from rank 0 (%s)", strerror(errno));
    goto out;
  }
  if (memcmp(challenge, MAGIC, 8) != 0) {
    say(w, 2,
             "what listens there is not a rank 0 of this meshpg version (another program, "
             "or another meshpg version, on the port?)");
    goto out;
  }
  memcpy(hello, MAGIC, 8);
  put_u32(hello + 8, (uint32_t)rank);
  put_u32(hello + 12, (uint32_t)size);
  put_u32(hello + 16, (uint32_t)n);
  if (RAND_bytes(hello + 20, NONCE) != 1) {
    *st = crypto_fail(what, "RAND_bytes");
    goto out;
  }
  if (!hello_mac(key, challenge + 8, hello + 20, hello + 8, hello + 20 + NONCE)) {
    *st = crypto_fail(what, "HMAC-SHA256");
    goto out;
  }
  if (move_all(fd, hello, sizeof hello, 1, by) != 0 ||
      move_all(fd, head, sizeof head, 0, by) != 0) {
    say(w, 1,
             "rank 0 closed the connection without a reply (%s): it holds another job key "
             "(this rank's comes from %s), or it is another job's",
             strerror(errno), key->source);
    goto out;
  }
  uint32_t v = get_u32(head), their_size = get_u32(head + 4), len = get_u32(head + 8);
  uint32_t want = v == SERVED ? (uint32_t)n : v == ALREADY_SERVED ? ADDR_TEXT - 1 : 0;
  if (v == SERVED ? len != want : len > want) {
    say(w, 3,
             "a reply of %u bytes for verdict %u: not this job's rank 0", len, v);
    goto out;
  }
  if (move_all(fd, body, len, 0, by) != 0) {
    say(w, 1, "rank 0's reply was cut short (%s)", strerror(errno));
    goto out;
  }
  if (!reply_mac(key, challenge + 8, hello + 20, hello + 8, head, body, len, mac)) {
    *st = crypto_fail(what, "HMAC-SHA256");
    goto out;
  }
  if (CRYPTO_memcmp(mac, head + 12, MAC_BYTES) != 0) {
    say(w, 3,
             "the reply did not prove the job key (this rank's from %s): another job, or a "
             "stranger, listens on the port; nothing of it was used",
             key->source);
    goto out;
  }
  if (v == SERVED) {
    memcpy(buf, body, n);
    got = 1;
  } else if (v == SIZE_DIFFERS) {
    *st = mpg__fail(MPG_ERR_ENV,
                    "%s: rank %d has a world of %d ranks, but rank 0 has %u: the ranks were "
                    "started with different world sizes (WORLD_SIZE or opts.world_size)",
                    what, rank, size, their_size);
  } else if (v == LENGTH_DIFFERS) {
    *st = mpg__fail(MPG_ERR_ENV,
                    "%s: rank 0 hands out a payload of another length than the %zu bytes "
                    "rank %d expects (a different meshpg build?)",
                    what, n, rank);
  } else if (v == ALREADY_SERVED) {
    char self[ADDR_TEXT];
    local_text(fd, self, sizeof self);
    *st = mpg__fail(MPG_ERR_ENV,
                    "%s: rank %d of %d was claimed twice with this job's key: rank 0 served "
                    "it to %.*s, and this process (%s) claims it too (two processes started "
                    "as rank %d?)",
                    what, rank, size, (int)len, (const char *)body, self, rank);
  } else {
    *st = mpg__fail(MPG_ERR_ENV, "%s: rank 0 refused rank %d of %d (verdict %u)", what, rank,
                    size, v);
  }
out:
  close(fd);
  return got;
}

static mpg_status ask(const char *what, const mpg__rdv_key *key, const char *addr, int port,
                      int rank, int size, void *buf, size_t n, double deadline) {
  struct addrinfo *ai = NULL;
  mpg_status st = resolve(what, addr, port, 0, &ai);
  if (st) return st;
  why w = {"timed out", 0};
  int got = 0;
  double backoff = 0.005;
  for (;;) {
    errno = 0;
    if ((got = ask_once(what, key, ai, rank, size, buf, n, deadline, &w, &st))) break;
    if (st || mpg__now() >= deadline) break;
    pause_s(backoff);
    if (backoff < 0.2) backoff *= 2;
  }
  freeaddrinfo(ai);
  if (st || got) return st;
  return mpg__fail(MPG_ERR_TIMEOUT,
                   "%s: rank %d of %d got nothing from rank 0 at MASTER_ADDR=%s port %d "
                   "within the timeout (%s); did rank 0 start?",
                   what, rank, size, addr, port, w.text);
}

mpg_status mpg__rendezvous_bcast_keyed(const char *what, const mpg__rdv_key *key,
                                       const char *addr, int port, int rank, int size,
                                       void *buf, size_t n, double deadline) {
  if (!key || !addr || !addr[0] || port < 1 || port > 65535 || size < 1 || rank < 0 ||
      rank >= size || !buf || n == 0 || n > MAX_PAYLOAD)
    return mpg__fail(MPG_ERR_INVALID,
                     "%s: rendezvous of rank %d of %d at \"%s\" port %d with %zu bytes", what,
                     rank, size, addr ? addr : "", port, n);
  if (size == 1) return MPG_OK;
  if (rank == 0) return serve(what, key, addr, port, size, buf, n, deadline);
  return ask(what, key, addr, port, rank, size, buf, n, deadline);
}

mpg_status mpg__rendezvous_bcast(const char *what, const char *addr, int port, int rank,
                                 int size, void *buf, size_t n, double deadline) {
  mpg__rdv_key key;
  mpg_status st = mpg__rendezvous_key_from_env(&key);
  if (st) return mpg__fail_wrap(st, "%s: rank %d of %d", what, rank, size);
  mpg__log(2, "%s: rank %d's rendezvous key comes from %s", what, rank, key.source);
  st = mpg__rendezvous_bcast_keyed(what, &key, addr, port, rank, size, buf, n, deadline);
  OPENSSL_cleanse(&key, sizeof key);
  return st;
}
