/* The NCCL half of the test double (nccl_double.c): the socket transport,
 * for ranks that cannot share memory (different hosts).
 *
 * NCCL's rules modelled here (NCCL 2.28.9, paths under src/):
 *   - the host hash is a hash of NCCL_HOSTID when set, else of the
 *     hostname followed by /proc/sys/kernel/random/boot_id
 *     (misc/utils.cc:69-113, getHostHashOnce): cuda_double.c's
 *     dbl_host_hash;
 *   - ncclGetUniqueId without NCCL_COMM_ID starts a bootstrap root in the
 *     calling process, listening on the bootstrap interface's address,
 *     and puts that address in the id (bootstrap.cc:414-431,
 *     bootstrapCreateRoot 389-412); every rank's init sends the root its
 *     own listening address and information and gets every rank's back
 *     (bootstrap.cc:282-360 bootstrapRoot, 614-690 sendToRoot);
 *   - the bootstrap interface: NCCL_SOCKET_IFNAME (a prefix list, "^" to
 *     exclude, "=" for exact names) when set, else the first interface not
 *     docker, lo or virbr, else loopback (misc/socket.cc:355-390,
 *     ncclFindInterfaces); IPv4 only here;
 *   - the intra-node transports connect two ranks only when their host
 *     hashes are equal (transport/shm.cc:86-87 canConnect, p2p.cc:143-147);
 *     every other pair goes over NET (transport/net.cc:154-161 canConnect
 *     answers 1), which is the socket plugin when there is no InfiniBand;
 *   - a closed connection is ncclRemoteError, "Connection closed by remote
 *     peer" (misc/socket.cc:63-75, socketProgress), NCCL's text for which is
 *     "remote process exited or there was a network error" (init.cc:2691).
 *
 * How the double does it.  A communicator whose ranks all have one host
 * hash uses the shared-memory segment exactly as before (the bootstrap
 * only exchanges the hashes first).  Otherwise every rank of it keeps a
 * private copy (a replica) of the same segment layout, and every write a
 * rank makes to its own part of the segment (its arrival, descriptors,
 * staging chunks, ring data and ring positions, split colours, state) is
 * sent over TCP, in program order, to the peers that read it; a receiver
 * thread per connection applies it to its replica (data first, then the
 * position words with release stores) and wakes the kernels.  The kernels,
 * checks and reductions are the segment path's own code on the replica,
 * so results are bit for bit those of one host.  Deliberate difference:
 * NCCL would still use P2P/SHM between two ranks of one host inside a
 * multi-host communicator; the double connects every pair of such a
 * communicator with a socket (as NCCL does with NCCL_P2P_DISABLE=1 and
 * NCCL_SHM_DISABLE=1).  ncclCommSplit's children of a socket communicator
 * open their own connections (NCCL would reuse the parent's bootstrap and
 * proxy connections); their membership, order and checks are unchanged.
 * A connection that ends without the peer's goodbye (its process died,
 * or the network failed) marks the peer dead: a kernel waiting for it
 * reports ncclRemoteError (check_dead_peers), and abort unblocks every
 * wait.  NCCL_COMM_ID ids carry no root in the double: communicators made
 * from them use the segment (one host) as before. */

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>

#include "nccl_double_internal.h"

#define NET_MAGIC 0x6d7067646e657431ULL /* "mpgdnet1" */
#define ID_NET_MARK "NET1"
#define ID_NET_OFF 48

enum { HELLO_ROOT = 1, HELLO_MESH = 2 };
enum { ROOT_OK = 0, ROOT_CLOSED = 1, ROOT_DUP = 2, ROOT_NRANKS = 3 };
enum { PEER_LIVE = 0, PEER_LEFT = 1, PEER_DEAD = 2 };

struct hello {
  uint64_t magic, key;
  int32_t kind, rank, nranks, pad_;
  struct net_peer who;
};

/* A hello of kind from rank of nranks; every byte is set (it goes over a
 * socket), who stays zero unless the caller fills it. */
static void hello_init(struct hello *he, int kind, uint64_t key, int rank, int nranks) {
  memset(he, 0, sizeof *he);
  he->magic = NET_MAGIC;
  he->key = key;
  he->kind = kind;
  he->rank = rank;
  he->nranks = nranks;
}

struct root_reply {
  uint64_t magic;
  int32_t status, bad_rank, nranks, bad_nranks;
  uint64_t key, nonce;
};

struct msg {
  uint32_t kind, n;
  uint64_t off;
};

struct net_seg {
  int n, rank;
  uint64_t key;
  struct shm_hdr *h;
  volatile _Atomic int *abort;
  struct net_peer *peers;
  int *fd;
  pthread_mutex_t *smu;
  pthread_t *rx;
  int *rx_on;
  _Atomic int *state;
  _Atomic int *rx_done;
};

struct rx_arg {
  struct net_seg *ns;
  int peer;
};

/* ------------------------------------------------------------------ */
/* Sockets                                                             */
/* ------------------------------------------------------------------ */

/* Write all of buf, polling the abort flag and giving up on a closed
 * connection: 0, or -1 (peer gone), -2 (aborted). */
static int send_all(int fd, const void *buf, size_t n, volatile _Atomic int *abort_flag) {
  const char *p = buf;
  while (n) {
    ssize_t w = send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w > 0) {
      p += w;
      n -= (size_t)w;
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (abort_flag && atomic_load(abort_flag)) return -2;
      struct pollfd pf = {fd, POLLOUT, 0};
      (void)poll(&pf, 1, 50);
      continue;
    }
    return -1;
  }
  return 0;
}

/* Read exactly n bytes (blocking): 0, or -1 on EOF or error. */
static int recv_all(int fd, void *buf, size_t n) {
  char *p = buf;
  while (n) {
    ssize_t r = recv(fd, p, n, 0);
    if (r > 0) {
      p += r;
      n -= (size_t)r;
      continue;
    }
    if (r < 0 && errno == EINTR) continue;
    return -1;
  }
  return 0;
}

/* Read exactly n bytes, waiting at most ms in all: 0, -1 closed, -3 timeout. */
static int recv_wait(int fd, void *buf, size_t n, int ms) {
  char *p = buf;
  double end = dbl_now() + ms / 1000.0;
  while (n) {
    struct pollfd pf = {fd, POLLIN, 0};
    int left = (int)((end - dbl_now()) * 1000);
    if (left <= 0) return -3;
    if (poll(&pf, 1, left) <= 0) continue;
    ssize_t r = recv(fd, p, n, MSG_DONTWAIT);
    if (r > 0) {
      p += r;
      n -= (size_t)r;
    } else if (r == 0 || (errno != EINTR && errno != EAGAIN)) {
      return -1;
    }
  }
  return 0;
}

static void tune(int fd) {
  int one = 1;
  (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/* Connect to ip:port (network order), polling the abort flag; retries a
 * refused connection for 2 s.  The fd, or -1 with errno. */
static int connect_to(uint32_t ip, uint16_t port, volatile _Atomic int *abort_flag) {
  struct sockaddr_in sa;
  memset(&sa, 0, sizeof sa);
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = ip;
  sa.sin_port = port;
  double t0 = dbl_now();
  for (;;) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0) {
      tune(fd);
      return fd;
    }
    int e = errno;
    close(fd);
    if ((e != ECONNREFUSED && e != EINTR && e != EAGAIN) || dbl_now() - t0 > 2 ||
        (abort_flag && atomic_load(abort_flag))) {
      errno = e;
      return -1;
    }
    sleep_us(20000);
  }
}

static void addr_text(uint32_t ip, uint16_t port, char *b, size_t n) {
  char s[INET_ADDRSTRLEN] = "?";
  struct in_addr a = {ip};
  inet_ntop(AF_INET, &a, s, sizeof s);
  snprintf(b, n, "%s:%u", s, (unsigned)ntohs(port));
}

/* NCCL_SOCKET_IFNAME's syntax (misc/socket.cc findInterfaces, via
 * parseStringList/matchIfList in misc/utils.cc): "^" excludes, "=" asks
 * for exact names, otherwise prefixes, comma-separated. */
static int if_match(const char *list, const char *name) {
  int exclude = 0, exact = 0;
  if (*list == '^') exclude = 1, list++;
  if (*list == '=') exact = 1, list++;
  int hit = 0;
  char buf[256];
  snprintf(buf, sizeof buf, "%s", list);
  char *save = NULL;
  for (char *t = strtok_r(buf, ",", &save); t && !hit; t = strtok_r(NULL, ",", &save))
    hit = exact ? !strcmp(name, t) : !strncmp(name, t, strlen(t));
  return exclude ? !hit : hit;
}

/* The bootstrap interface's IPv4 address, network order. */
static uint32_t bootstrap_ip(void) {
  const char *env = getenv("NCCL_SOCKET_IFNAME");
  const char *tries[4] = {env && *env ? env : "^docker,lo,virbr", env && *env ? NULL : "docker",
                          env && *env ? NULL : "lo", NULL};
  struct ifaddrs *ifs = NULL;
  uint32_t ip = htonl(INADDR_LOOPBACK);
  if (getifaddrs(&ifs) != 0) return ip;
  int found = 0;
  for (int t = 0; t < 4 && tries[t] && !found; t++)
    for (struct ifaddrs *i = ifs; i && !found; i = i->ifa_next) {
      if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP)) continue;
      if (!if_match(tries[t], i->ifa_name)) continue;
      ip = ((struct sockaddr_in *)i->ifa_addr)->sin_addr.s_addr;
      found = 1;
    }
  freeifaddrs(ifs);
  return ip;
}

/* ------------------------------------------------------------------ */
/* The process's listener: NCCL's bootstrap root for the ids this      */
/* process made, and the peers' connections of socket communicators   */
/* ------------------------------------------------------------------ */

struct pend {
  uint64_t key;
  int rank, fd;
  double since;
  struct pend *next;
};

struct round {
  uint64_t key;
  int n, got;
  int *fd;
  struct hello *h;
  struct round *next;
};

static pthread_mutex_t lmu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t lcv = PTHREAD_COND_INITIALIZER;
static pid_t l_pid;
static int l_fd = -1;
static uint32_t l_ip;
static uint16_t l_port;
static struct pend *l_pend;
static struct round *l_rounds;

static void round_end(struct round **pp, int status, int bad, int bad_n) {
  struct round *r = *pp;
  *pp = r->next;
  struct root_reply rep = {NET_MAGIC, status, bad, r->n, bad_n, 0, 0};
  if (status == ROOT_OK) {
    if (getrandom(&rep.key, sizeof rep.key, 0) != (ssize_t)sizeof rep.key)
      rep.key = fnv1a(r->key, &r, sizeof r) ^ (uint64_t)(dbl_now() * 1e9);
    rep.nonce = fnv1a(rep.key, "nonce", 5);
  }
  for (int i = 0; i < r->n; i++) {
    if (r->fd[i] < 0) continue;
    if (send_all(r->fd[i], &rep, sizeof rep, NULL) == 0 && status == ROOT_OK) {
      for (int k = 0; k < r->n; k++) (void)send_all(r->fd[i], &r->h[k].who, sizeof r->h[k].who, NULL);
    }
    close(r->fd[i]);
  }
  free(r->fd);
  free(r->h);
  free(r);
}

/* A bootstrap hello: join its round (the id's), answer when complete. */
static void root_hello(int fd, const struct hello *he) {
  struct round **pp = &l_rounds;
  while (*pp && (*pp)->key != he->key) pp = &(*pp)->next;
  if (!*pp) {
    struct round *r = calloc(1, sizeof *r);
    if (!r || he->nranks < 1 || he->nranks > MAX_WORLD) {
      free(r);
      close(fd);
      return;
    }
    r->key = he->key;
    r->n = he->nranks;
    r->fd = malloc(sizeof(int) * (size_t)r->n);
    r->h = calloc((size_t)r->n, sizeof *r->h);
    if (!r->fd || !r->h) dbl_fatal("nccl double: out of memory");
    for (int i = 0; i < r->n; i++) r->fd[i] = -1;
    r->next = l_rounds;
    l_rounds = r;
    pp = &l_rounds;
  }
  struct round *r = *pp;
  struct root_reply rep = {NET_MAGIC, ROOT_OK, he->rank, r->n, he->nranks, 0, 0};
  if (he->nranks != r->n) rep.status = ROOT_NRANKS;
  else if (he->rank < 0 || he->rank >= r->n || r->fd[he->rank] >= 0) rep.status = ROOT_DUP;
  if (rep.status != ROOT_OK) {
    (void)send_all(fd, &rep, sizeof rep, NULL);
    close(fd);
    return;
  }
  r->fd[he->rank] = fd;
  r->h[he->rank] = *he;
  if (++r->got == r->n) round_end(pp, ROOT_OK, -1, 0);
}

static void *listener_main(void *arg) {
  (void)arg;
  struct pollfd *pf = NULL;
  int cap = 0;
  for (;;) {
    pthread_mutex_lock(&lmu);
    int np = 1;
    for (struct round *r = l_rounds; r; r = r->next) np += r->n;
    if (np > cap) {
      cap = np * 2;
      pf = realloc(pf, sizeof *pf * (size_t)cap);
      if (!pf) dbl_fatal("nccl double: out of memory");
    }
    pf[0] = (struct pollfd){l_fd, POLLIN, 0};
    np = 1;
    for (struct round *r = l_rounds; r; r = r->next)
      for (int i = 0; i < r->n; i++)
        if (r->fd[i] >= 0) pf[np++] = (struct pollfd){r->fd[i], POLLIN, 0};
    pthread_mutex_unlock(&lmu);
    if (poll(pf, (nfds_t)np, 100) <= 0) continue;
    pthread_mutex_lock(&lmu);
    /* A rank waiting for the root went away: every rank of its round gets
     * ncclRemoteError (the root's socket sees the close). */
    for (int i = 1; i < np; i++) {
      if (!pf[i].revents) continue;
      for (struct round **pp = &l_rounds; *pp; pp = &(*pp)->next) {
        struct round *r = *pp;
        int at = -1;
        for (int k = 0; k < r->n; k++)
          if (r->fd[k] == pf[i].fd) at = k;
        if (at < 0) continue;
        close(r->fd[at]);
        r->fd[at] = -1;
        round_end(pp, ROOT_CLOSED, at, 0);
        break;
      }
    }
    if (pf[0].revents & POLLIN) {
      int fd = accept4(l_fd, NULL, NULL, SOCK_CLOEXEC);
      if (fd >= 0) {
        tune(fd);
        struct hello he;
        pthread_mutex_unlock(&lmu);
        int ok = recv_wait(fd, &he, sizeof he, 5000) == 0 && he.magic == NET_MAGIC;
        pthread_mutex_lock(&lmu);
        if (!ok) {
          close(fd);
        } else if (he.kind == HELLO_ROOT) {
          root_hello(fd, &he);
        } else {
          struct pend *p = calloc(1, sizeof *p);
          if (!p) dbl_fatal("nccl double: out of memory");
          p->key = he.key;
          p->rank = he.rank;
          p->fd = fd;
          p->since = dbl_now();
          p->next = l_pend;
          l_pend = p;
          pthread_cond_broadcast(&lcv);
        }
      }
    }
    pthread_mutex_unlock(&lmu);
  }
  return NULL;
}

static void listener_atfork_child(void);
static void listener_register_atfork(void) {
  pthread_atfork(NULL, NULL, listener_atfork_child);
}

/* A child forked while the listener thread held the lock must not inherit
 * it locked. */
static void listener_atfork_child(void) {
  pthread_mutex_init(&lmu, NULL);
  pthread_cond_init(&lcv, NULL);
}

/* Start this process's listener once (again in a forked child).  0, or -1. */
static int listener_start(void) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, listener_register_atfork);
  pthread_mutex_lock(&lmu);
  if (l_pid == getpid() && l_fd >= 0) {
    pthread_mutex_unlock(&lmu);
    return 0;
  }
  /* A forked child inherits the parent's state but not its thread. */
  l_pend = NULL;
  l_rounds = NULL;
  if (l_fd >= 0) close(l_fd);
  l_fd = -1;
  uint32_t ip = bootstrap_ip();
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in sa;
  memset(&sa, 0, sizeof sa);
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = ip;
  socklen_t len = sizeof sa;
  if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(fd, 256) != 0 ||
      getsockname(fd, (struct sockaddr *)&sa, &len) != 0) {
    dbl_log("nccl double: no bootstrap listener (%s): communicators stay on one host",
            strerror(errno));
    if (fd >= 0) close(fd);
    pthread_mutex_unlock(&lmu);
    return -1;
  }
  l_fd = fd;
  l_ip = ip;
  l_port = sa.sin_port;
  l_pid = getpid();
  pthread_t th;
  pthread_attr_t at;
  pthread_attr_init(&at);
  pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
  if (pthread_create(&th, &at, listener_main, NULL) != 0)
    dbl_fatal("nccl double: pthread_create for the bootstrap listener: %s", strerror(errno));
  pthread_attr_destroy(&at);
  char a[64];
  addr_text(l_ip, l_port, a, sizeof a);
  dbl_log("nccl double: bootstrap listener of pid %d at %s", (int)getpid(), a);
  pthread_mutex_unlock(&lmu);
  return 0;
}

/* ------------------------------------------------------------------ */
/* Ids and the bootstrap                                               */
/* ------------------------------------------------------------------ */

/* ncclGetUniqueId without NCCL_COMM_ID: the root's address into the id. */
void net_id_fill(ncclUniqueId *id) {
  if (listener_start() != 0) return;
  char *p = id->internal + ID_NET_OFF;
  memcpy(p, ID_NET_MARK, 4);
  memcpy(p + 4, &l_ip, 4);
  memcpy(p + 8, &l_port, 2);
}

int net_id_root(const char *id, uint32_t *ip, uint16_t *port) {
  const char *p = id + ID_NET_OFF;
  if (memcmp(id, ID_MARK, 8) != 0 || memcmp(p, ID_NET_MARK, 4) != 0) return 0;
  memcpy(ip, p + 4, 4);
  memcpy(port, p + 8, 2);
  return *port != 0;
}

static void self_info(struct ncclComm *c, struct net_peer *me) {
  memset(me, 0, sizeof *me);
  me->host_hash = c->host_hash;
  me->busid = c->busid;
  me->pid = (int32_t)getpid();
  me->device = c->device;
  me->world_rank = c->world_rank;
  me->ip = l_ip;
  me->port = l_port;
}

/* The bootstrap of an init: tell the id's root who this rank is, get every
 * rank's answer (*peers, n entries), the communicator's key and nonce. */
ncclResult_t net_bootstrap(struct ncclComm *c, const char *id, struct net_peer **peers,
                           uint64_t *key, uint64_t *nonce, char *msg, size_t msglen) {
  uint32_t ip;
  uint16_t port;
  *peers = NULL;
  if (!net_id_root(id, &ip, &port)) return ncclSuccess;
  char root[64];
  addr_text(ip, port, root, sizeof root);
  if (listener_start() != 0) {
    snprintf(msg, msglen, "meshpg double: rank %d of %s: no listening socket for the bootstrap",
             c->rank, c->name);
    return ncclSystemError;
  }
  volatile _Atomic int *abort_flag = &c->sh->abort;
  int fd = connect_to(ip, port, abort_flag);
  if (fd < 0) {
    snprintf(msg, msglen, "socketProgress: Connection closed by remote peer (meshpg double: "
             "rank %d of %s could not reach the bootstrap root at %s: %s)", c->rank, c->name,
             root, strerror(errno));
    return ncclRemoteError;
  }
  struct hello he;
  hello_init(&he, HELLO_ROOT, fnv1a(FNV_START, id, NCCL_UNIQUE_ID_BYTES), c->rank, c->nranks);
  self_info(c, &he.who);
  if (send_all(fd, &he, sizeof he, abort_flag) != 0) {
    close(fd);
    snprintf(msg, msglen, "socketProgress: Connection closed by remote peer (meshpg double: "
             "bootstrap root %s of %s)", root, c->name);
    return ncclRemoteError;
  }
  double since = dbl_now();
  for (;;) {
    if (atomic_load(abort_flag)) {
      close(fd);
      snprintf(msg, msglen, "meshpg double: communicator %s aborted while rank %d waited for "
               "its peers to join", c->name, c->rank);
      return ncclInternalError;
    }
    struct pollfd pf = {fd, POLLIN, 0};
    if (poll(&pf, 1, 20) > 0) break;
    if (since > 0 && dbl_now() - since > hang_seconds()) {
      fprintf(stderr, "meshpg double (pid %d): warning: rank %d of communicator %s (%d ranks, "
              "CUDA device %d) has waited %.1f s in ncclCommInitRank for the other ranks at the "
              "bootstrap root %s (same id and nranks everywhere?)\n",
              (int)getpid(), c->rank, c->name, c->nranks, c->device, dbl_now() - since, root);
      since = 0;
    }
  }
  struct root_reply rep;
  if (recv_all(fd, &rep, sizeof rep) != 0 || rep.magic != NET_MAGIC) {
    close(fd);
    snprintf(msg, msglen, "socketProgress: Connection closed by remote peer (meshpg double: "
             "the bootstrap root %s of %s went away while rank %d waited in ncclCommInitRank)",
             root, c->name, c->rank);
    return ncclRemoteError;
  }
  if (rep.status == ROOT_DUP)
    dbl_fatal("nccl double: rank %d joined communicator %s (%d ranks) twice: two callers "
              "passed the same rank with the same unique id (real NCCL would hang in "
              "bootstrap)", c->rank, c->name, c->nranks);
  if (rep.status == ROOT_NRANKS)
    dbl_fatal("nccl double: communicator %s was created for %d ranks, joined with nranks "
              "%d (real NCCL would hang in bootstrap)", c->name, rep.nranks, c->nranks);
  if (rep.status != ROOT_OK) {
    close(fd);
    snprintf(msg, msglen, "socketProgress: Connection closed by remote peer (meshpg double: "
             "rank %d of communicator %s exited or aborted while rank %d waited in "
             "ncclCommInitRank)", rep.bad_rank, c->name, c->rank);
    return ncclRemoteError;
  }
  struct net_peer *p = calloc((size_t)c->nranks, sizeof *p);
  if (!p) dbl_fatal("nccl double: out of memory");
  for (int i = 0; i < c->nranks; i++)
    if (recv_all(fd, &p[i], sizeof p[i]) != 0) {
      free(p);
      close(fd);
      snprintf(msg, msglen, "socketProgress: Connection closed by remote peer (meshpg double: "
               "bootstrap root %s of %s)", root, c->name);
      return ncclRemoteError;
    }
  close(fd);
  *peers = p;
  *key = rep.key;
  *nonce = rep.nonce;
  return ncclSuccess;
}

/* ------------------------------------------------------------------ */
/* Socket communicators                                                */
/* ------------------------------------------------------------------ */

static void mark(struct net_seg *ns, int p, int st) {
  int cur = atomic_load(&ns->state[p]);
  while (cur == PEER_LIVE && !atomic_compare_exchange_weak(&ns->state[p], &cur, st)) {
  }
  ww_bump(&ns->h->wake, 1);
}

/* The receiver of one connection: apply the peer's writes to the replica. */
static void *rx_main(void *arg) {
  struct rx_arg *a = arg;
  struct net_seg *ns = a->ns;
  int p = a->peer, fd = ns->fd[p];
  struct shm_hdr *h = ns->h;
  free(a);
  uint64_t words[64];
  for (;;) {
    struct msg m;
    if (recv_all(fd, &m, sizeof m) != 0) break;
    if (m.kind == PUB_BYE) {
      mark(ns, p, PEER_LEFT);
      continue;
    }
    size_t bytes = m.kind == PUB_COPY ? m.n : (size_t)m.n * (m.kind == PUB_A64 ? 8 : 4);
    if (m.off > h->bytes || bytes > h->bytes - m.off || (m.kind != PUB_COPY && bytes > sizeof words))
      dbl_fatal("nccl double: rank %d of %s got a bad message from rank %d (kind %u, %zu bytes "
                "at %" PRIu64 "): a double bug", ns->rank, h->name, p, m.kind, bytes, m.off);
    char *at = (char *)h + m.off;
    if (m.kind == PUB_COPY) {
      if (recv_all(fd, at, bytes) != 0) break;
    } else {
      if (recv_all(fd, words, bytes) != 0) break;
      for (uint32_t i = 0; i < m.n; i++) {
        if (m.kind == PUB_A64)
          atomic_store_explicit((_Atomic uint64_t *)at + i, words[i], memory_order_release);
        else {
          int32_t v;
          memcpy(&v, (char *)words + 4 * i, 4);
          atomic_store_explicit((_Atomic int32_t *)at + i, v, memory_order_release);
        }
      }
    }
    ww_bump(&h->wake, 1);
  }
  /* The end without a goodbye: the process exited or the network failed. */
  mark(ns, p, PEER_DEAD);
  atomic_store(&ns->rx_done[p], 1);
  return NULL;
}

/* Publish the write of [p, p + n) of this rank's replica to peer `dest`
 * (-1: every peer).  A64/A32: n bytes of 8- or 4-byte atomic words. */
void net_pub(struct shm_hdr *h, int kind, int dest, const volatile void *p, size_t n) {
  if (!h || !h->net) return;
  struct net_seg *ns = h->net;
  struct msg m = {(uint32_t)kind, (uint32_t)(kind == PUB_COPY ? n : kind == PUB_A64 ? n / 8 : n / 4),
                  (uint64_t)((const volatile char *)p - (char *)h)};
  uint64_t words[64];
  const void *payload = (const void *)p;
  if (kind == PUB_A64 || kind == PUB_A32) {
    for (size_t i = 0; i < m.n; i++) {
      if (kind == PUB_A64)
        words[i] = atomic_load((const _Atomic uint64_t *)p + i);
      else {
        int32_t v = atomic_load((const _Atomic int32_t *)p + i);
        memcpy((char *)words + 4 * i, &v, 4);
      }
    }
    payload = words;
  }
  for (int q = 0; q < ns->n; q++) {
    if (q == ns->rank || (dest >= 0 && q != dest)) continue;
    if (atomic_load(&ns->state[q]) != PEER_LIVE) continue;
    pthread_mutex_lock(&ns->smu[q]);
    int e = send_all(ns->fd[q], &m, sizeof m, ns->abort);
    if (e == 0 && kind != PUB_BYE && n) e = send_all(ns->fd[q], payload, n, ns->abort);
    pthread_mutex_unlock(&ns->smu[q]);
    if (e == -1) mark(ns, q, PEER_DEAD);
  }
}

/* A write into a ring (wrapping), to its receiver. */
void net_pub_ring(struct shm_hdr *h, int dest, const char *ring, uint64_t R, uint64_t at,
                  uint64_t n) {
  if (!h->net || !n) return;
  uint64_t o = at % R, first = R - o < n ? R - o : n;
  net_pub(h, PUB_COPY, dest, ring + o, first);
  if (n > first) net_pub(h, PUB_COPY, dest, ring, n - first);
}

/* Is rank r of this segment gone?  Its process (one host), or its
 * connection closed without a goodbye (sockets). */
int rank_dead(struct shm_hdr *h, int r) {
  if (h->net) {
    struct net_seg *ns = h->net;
    return r != ns->rank && atomic_load(&ns->state[r]) == PEER_DEAD;
  }
  return pid_dead(seg_rank(h, r)->pid);
}

int net_peer_left(struct shm_hdr *h, int r) {
  struct net_seg *ns = h->net;
  return ns && r != ns->rank && atomic_load(&ns->state[r]) == PEER_LEFT;
}

/* Take the connection of (key, rank) from the listener, waiting. */
static int take_conn(uint64_t key, int rank, volatile _Atomic int *abort_flag,
                     volatile _Atomic int *parent_abort) {
  pthread_mutex_lock(&lmu);
  for (;;) {
    for (struct pend **pp = &l_pend; *pp; pp = &(*pp)->next) {
      struct pend *p = *pp;
      if (p->key == key && p->rank == rank) {
        *pp = p->next;
        int fd = p->fd;
        free(p);
        pthread_mutex_unlock(&lmu);
        return fd;
      }
    }
    if (atomic_load(abort_flag) || (parent_abort && atomic_load(parent_abort))) break;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 20000000;
    if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
    pthread_cond_timedwait(&lcv, &lmu, &ts);
  }
  pthread_mutex_unlock(&lmu);
  return -1;
}

static void ns_free(struct net_seg *ns) {
  for (int q = 0; q < ns->n; q++) {
    if (ns->fd[q] >= 0) shutdown(ns->fd[q], SHUT_RDWR);
    if (ns->rx_on[q]) pthread_join(ns->rx[q], NULL);
    if (ns->fd[q] >= 0) close(ns->fd[q]);
    pthread_mutex_destroy(&ns->smu[q]);
  }
  free(ns->peers);
  free(ns->fd);
  free(ns->smu);
  free(ns->rx);
  free(ns->rx_on);
  free((void *)ns->state);
  free((void *)ns->rx_done);
  free(ns);
}

/* Join a socket communicator: c->rank of c->nranks, with every rank's
 * information (peers, taken), the key every rank agreed on (the root's,
 * or the parent's for a split) and the segment nonce. */
ncclResult_t net_join(struct ncclComm *c, struct net_peer *peers, uint64_t key,
                      uint64_t nonce, volatile _Atomic int *parent_abort, char *msg,
                      size_t msglen) {
  int n = c->nranks, r = c->rank;
  /* The duplicate-GPU check of init.cc:902-906: same host and bus id. */
  for (int i = 0; i < n; i++)
    if (i != r && peers[i].host_hash == c->host_hash && peers[i].busid == c->busid) {
      free(peers);
      snprintf(msg, msglen, "Duplicate GPU detected : rank %d and rank %d both on CUDA device %lx",
               r, i, (unsigned long)c->busid);
      return ncclInvalidUsage;
    }
  struct shm_hdr *h = seg_private(c->name, n);
  struct net_seg *ns = calloc(1, sizeof *ns);
  if (!h || !ns) dbl_fatal("nccl double: out of memory");
  ns->n = n;
  ns->rank = r;
  ns->key = key;
  ns->h = h;
  ns->abort = &c->sh->abort;
  ns->peers = peers;
  ns->fd = malloc(sizeof(int) * (size_t)n);
  ns->smu = calloc((size_t)n, sizeof *ns->smu);
  ns->rx = calloc((size_t)n, sizeof *ns->rx);
  ns->rx_on = calloc((size_t)n, sizeof(int));
  ns->state = calloc((size_t)n, sizeof *ns->state);
  ns->rx_done = calloc((size_t)n, sizeof *ns->rx_done);
  if (!ns->fd || !ns->smu || !ns->rx || !ns->rx_on || !ns->state || !ns->rx_done)
    dbl_fatal("nccl double: out of memory");
  h->nonce = nonce;
  for (int i = 0; i < n; i++) {
    ns->fd[i] = -1;
    pthread_mutex_init(&ns->smu[i], NULL);
    struct shm_rank *q = seg_rank(h, i);
    q->pid = peers[i].pid;
    q->device = peers[i].device;
    q->world_rank = peers[i].world_rank;
    q->host_hash = peers[i].host_hash;
    q->busid = peers[i].busid;
    atomic_store(&q->state, RS_JOINED);
  }
  atomic_store(&h->joined, n);
  atomic_store(&h->status, SEG_COMPLETE);
  atomic_store(&h->unlinked, 1);
  ncclResult_t ret = ncclSuccess;
  double since = dbl_now();
  /* Rank j connects to every rank below it and says who it is; it takes
   * the connections of the ranks above it from its listener. */
  for (int i = 0; i < r && ret == ncclSuccess; i++) {
    int fd = connect_to(peers[i].ip, peers[i].port, &c->sh->abort);
    struct hello he;
    hello_init(&he, HELLO_MESH, key, r, n);
    if (fd < 0 || send_all(fd, &he, sizeof he, &c->sh->abort) != 0) {
      char a[64];
      addr_text(peers[i].ip, peers[i].port, a, sizeof a);
      snprintf(msg, msglen, "socketProgress: Connection closed by remote peer (meshpg double: "
               "rank %d of %s could not connect to rank %d at %s: %s)", r, c->name, i, a,
               strerror(errno));
      if (fd >= 0) close(fd);
      ret = ncclRemoteError;
      break;
    }
    ns->fd[i] = fd;
  }
  for (int j = r + 1; j < n && ret == ncclSuccess; j++) {
    ns->fd[j] = take_conn(key, j, &c->sh->abort, parent_abort);
    if (ns->fd[j] < 0) {
      snprintf(msg, msglen, "meshpg double: communicator %s aborted while rank %d waited for "
               "rank %d to connect (%.1f s)", c->name, r, j, dbl_now() - since);
      ret = ncclInternalError;
    }
  }
  for (int q = 0; q < n && ret == ncclSuccess; q++) {
    if (q == r) continue;
    struct rx_arg *a = malloc(sizeof *a);
    if (!a) dbl_fatal("nccl double: out of memory");
    a->ns = ns;
    a->peer = q;
    h->net = ns;
    if (pthread_create(&ns->rx[q], NULL, rx_main, a) != 0)
      dbl_fatal("nccl double: pthread_create for a socket receiver: %s", strerror(errno));
    ns->rx_on[q] = 1;
  }
  if (ret != ncclSuccess) {
    h->net = NULL;
    ns_free(ns);
    munmap(h, h->bytes);
    return ret;
  }
  h->net = ns;
  c->shm = h;
  dbl_log("nccl double: rank %d/%d of %s joined over sockets (NET: host hashes differ)", r, n,
          c->name);
  return comm_count_issued(c, n, msg, msglen);
}

/* The information of parent rank i, for a child's net_join. */
struct net_peer net_peer_of(struct shm_hdr *h, int i) { return ((struct net_seg *)h->net)->peers[i]; }
uint64_t net_key_of(struct shm_hdr *h) { return ((struct net_seg *)h->net)->key; }

/* Leave a socket communicator: say goodbye, let the peers' goodbyes and
 * closes arrive for a moment, then close everything. */
void net_leave(struct shm_hdr *h) {
  struct net_seg *ns = h->net;
  if (!ns) return;
  net_pub(h, PUB_BYE, -1, h, 0);
  for (int q = 0; q < ns->n; q++)
    if (ns->fd[q] >= 0) shutdown(ns->fd[q], SHUT_WR);
  double t0 = dbl_now();
  for (int q = 0; q < ns->n; q++)
    while (q != ns->rank && ns->rx_on[q] && !atomic_load(&ns->rx_done[q]) &&
           dbl_now() - t0 < 0.3)
      sleep_us(2000);
  h->net = NULL;
  ns_free(ns);
}

/* For tests (double.h): "shm" (one host: the shared segment), "net"
 * (sockets), or "none" (not joined yet, or gone). */
const char *dbl_nccl_transport(ncclComm_t comm) {
  if (!comm || atomic_load(&comm->magic) != COMM_LIVE || !comm->shm) return "none";
  return comm->shm->net ? "net" : "shm";
}
