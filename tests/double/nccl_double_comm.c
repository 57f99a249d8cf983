/* The NCCL half of the test double (nccl_double.c): communicators (their
 * lifetime, asynchronous errors and abort), fault injection, groups, and
 * the init and split jobs that join a communicator. */

#include "nccl_double_internal.h"

/* ------------------------------------------------------------------ */
/* Communicators                                                      */
/* ------------------------------------------------------------------ */

static pthread_mutex_t all_mu = PTHREAD_MUTEX_INITIALIZER;
static struct ncclComm *all_comms; /* tombstones stay reachable */

_Thread_local int tl_world_rank = -1;

/* The ncclCommAbort / ncclCommDestroy calls now waiting for their device
 * to drain (cudaFree's implicit synchronisation): named in the kernels'
 * deadlock reports, which then explain the hang of the abort. */

pthread_mutex_t drain_mu = PTHREAD_MUTEX_INITIALIZER;
char drain_what[MAX_DEV_TRACK][256];

void drain_device(int device, const char *call, struct ncclComm *c) {
  if (device >= 0 && device < MAX_DEV_TRACK) {
    pthread_mutex_lock(&drain_mu);
    snprintf(drain_what[device], sizeof drain_what[device],
             "%s of rank %d of communicator %s (since %.3f)", call, c->rank, c->name, dbl_now());
    pthread_mutex_unlock(&drain_mu);
  }
  char why[160];
  snprintf(why, sizeof why, "%s (cudaFree of the communicator's buffers)", call);
  dbl_device_wait(device, why);
  if (device >= 0 && device < MAX_DEV_TRACK) {
    pthread_mutex_lock(&drain_mu);
    drain_what[device][0] = '\0';
    pthread_mutex_unlock(&drain_mu);
  }
}

struct ncclComm *comm_new(void) {
  struct ncclComm *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  pthread_mutex_init(&c->mu, NULL);
  atomic_init(&c->refs, 1);
  atomic_init(&c->async, ncclInProgress);
  static _Atomic uint32_t salts;
  c->salt = (uint8_t)(atomic_fetch_add(&salts, 1) * 37u + 11u);
  c->world_rank = tl_world_rank;
  c->rank = c->nranks = c->device = -1;
  atomic_store(&c->magic, COMM_LIVE);
  pthread_mutex_lock(&all_mu);
  c->all_next = all_comms;
  all_comms = c;
  pthread_mutex_unlock(&all_mu);
  return c;
}

struct dbl_shared *shared_new(void) {
  struct dbl_shared *s = calloc(1, sizeof *s);
  if (!s) dbl_fatal("nccl double: out of memory");
  atomic_init(&s->refs, 1);
  return s;
}

static void shared_unref(struct dbl_shared *s) {
  if (s && atomic_fetch_sub(&s->refs, 1) == 1) free(s);
}

void comm_ref(struct ncclComm *c) { atomic_fetch_add(&c->refs, 1); }

/* Leave the segment: mark this rank gone, unlink a segment that never
 * completed once every member is gone, unmap. */
static void seg_leave(struct ncclComm *c, int how) {
  struct shm_hdr *h = c->shm;
  if (!h) return;
  c->shm = NULL;
  if (c->rank >= 0 && c->rank < h->nranks) {
    struct shm_rank *me = seg_rank(h, c->rank);
    int32_t st = atomic_load(&me->state);
    if (st == RS_JOINED || st == RS_CLAIMED) atomic_store(&me->state, how);
    net_pub(h, PUB_A32, -1, &me->state, 4);
  }
  ww_bump(&h->wake, 1);
  if (h->net) { /* a socket communicator's replica */
    net_leave(h);
    munmap(h, h->bytes);
    return;
  }
  if (atomic_load(&h->status) != SEG_COMPLETE) {
    int gone = 1;
    for (int i = 0; i < h->nranks && gone; i++) {
      struct shm_rank *r = seg_rank(h, i);
      int32_t st = atomic_load_explicit(&r->state, memory_order_acquire);
      if (st == RS_CLAIMED) gone = 0;
      if (st == RS_JOINED && !pid_dead(r->pid)) gone = 0;
    }
    if (gone) seg_unlink_once(h);
  }
  munmap(h, h->bytes);
}

void comm_unref(struct ncclComm *c) {
  if (atomic_fetch_sub(&c->refs, 1) != 1) return;
  /* The last reference: no kernel, job or handle uses the comm any more.
   * The struct itself stays (a tombstone: calls on it are answered). */
  seg_leave(c, c->sh && atomic_load(&c->sh->abort) ? RS_ABORTED : RS_LEFT);
  pthread_mutex_lock(&c->mu);
  free(c->sends_issued);
  free(c->recvs_issued);
  c->sends_issued = c->recvs_issued = NULL;
  free(c->uops);
  c->uops = NULL;
  c->nuops = 0;
  while (c->regs) {
    struct reg *r = c->regs;
    c->regs = r->next;
    free(r);
  }
  struct dbl_shared *sh = c->sh;
  c->sh = NULL;
  pthread_mutex_unlock(&c->mu);
  shared_unref(sh);
}

/* Record a state (ncclCommSetAsyncError, init.cc:2129-2137) with its
 * text.  An error sticks: the first one is kept, and nothing but a revoke
 * (which stores its state directly) makes the communicator usable again. */
void set_async(struct ncclComm *c, ncclResult_t r, const char *msg) {
  pthread_mutex_lock(&c->mu);
  int cur = atomic_load(&c->async);
  if (cur == ncclSuccess || cur == ncclInProgress) {
    atomic_store(&c->async, r);
    if (msg) snprintf(c->async_msg, sizeof c->async_msg, "%s", msg);
  }
  pthread_mutex_unlock(&c->mu);
}

/* Copy the communicator's asynchronous error text into the caller's last
 * error. */
void show_async_msg(struct ncclComm *c) {
  pthread_mutex_lock(&c->mu);
  if (c->async_msg[0]) snprintf(tl_last_error, sizeof tl_last_error, "%s", c->async_msg);
  pthread_mutex_unlock(&c->mu);
}

int comm_aborted(struct ncclComm *c) { return c->sh && atomic_load(&c->sh->abort); }

/* After setting the abort flag: wake the kernels now rather than at their
 * next poll.  c->shm belongs to a running init job (which polls the flag
 * itself) until the job is joined. */
void wake_kernels(struct ncclComm *c) {
  ww_bump(&c->sh->wake, 0);
  pthread_mutex_lock(&c->mu);
  if (!c->job && c->shm) ww_bump(&c->shm->wake, 1);
  pthread_mutex_unlock(&c->mu);
}

/* ------------------------------------------------------------------ */
/* Fault injection                                                    */
/* ------------------------------------------------------------------ */

static struct fault faults[16];
static int nfaults;

void faults_parse(void) {
  const char *v = getenv("MESHPG_DOUBLE_FAULT");
  if (!v || !v[0]) return;
  char buf[512];
  snprintf(buf, sizeof buf, "%s", v);
  char *save = NULL;
  for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
    char kind[16];
    int r = -1;
    unsigned long long n = 0;
    if (sscanf(t, "%15[a-z]:%d:%llu", kind, &r, &n) != 3 || r < 0 || n < 1 || nfaults == 16)
      dbl_fatal("MESHPG_DOUBLE_FAULT=\"%s\": expected hang:R:N, async:R:N or kill:R:N "
                "(comma-separated, N >= 1)",
                v);
    int k = !strcmp(kind, "hang") ? FAULT_HANG : !strcmp(kind, "async") ? FAULT_ASYNC
          : !strcmp(kind, "kill") ? FAULT_KILL : 0;
    if (!k) dbl_fatal("MESHPG_DOUBLE_FAULT: unknown fault \"%s\" in \"%s\"", kind, v);
    faults[nfaults].kind = k;
    faults[nfaults].rank = r;
    faults[nfaults].nth = n;
    nfaults++;
  }
}

/* Operations issued so far per world rank (1-based counts). */

_Atomic uint64_t ops_issued_by[MAX_WORLD];

/* The fault of `kind` hitting world rank wr's operations [first, last]. */
const struct fault *fault_hit(int kind, int wr, uint64_t first, uint64_t last) {
  env_init();
  for (int i = 0; i < nfaults; i++)
    if (faults[i].kind == kind && faults[i].rank == wr && faults[i].nth >= first &&
        faults[i].nth <= last)
      return &faults[i];
  return NULL;
}

/* ------------------------------------------------------------------ */
/* Groups, tasks and jobs (thread-local, as group.cc:20-25)           */
/* ------------------------------------------------------------------ */

_Thread_local int g_depth;
_Thread_local ncclResult_t g_error;
_Thread_local int g_blocking = -1;
_Thread_local struct plan *g_plans;
_Thread_local struct job *g_jobs;
/* Set when ncclCommDestroy returned early in a way that leaves NCCL's
 * group depth raised (see ncclCommDestroy). */
_Thread_local char g_poisoned[512];

void check_poisoned(const char *call) {
  if (g_poisoned[0])
    dbl_fatal("%s called after %s: real NCCL 2.28 returned from there with this thread's "
              "group depth still raised (init.cc:2373-2381 return before ncclGroupEndInternal), "
              "so this call would be queued as if inside ncclGroupStart and never launched",
              call, g_poisoned);
}

/* ncclGroupErrCheck (include/group.h:89-94). */
ncclResult_t group_err(ncclResult_t r) {
  if (g_depth > 0 && r != ncclSuccess && r != ncclInProgress) g_error = r;
  return r;
}

/* The blocking mode of a group: its first communicator's; mixing is
 * refused (group.cc:51-59). */
ncclResult_t group_mode(int blocking) {
  if (g_blocking == -1) {
    g_blocking = blocking;
  } else if (g_blocking != blocking) {
    warn("Blocking and nonblocking communicators are not allowed in the same group.");
    return ncclInvalidArgument;
  }
  return ncclSuccess;
}

struct plan *plan_for(struct ncclComm *c) {
  for (struct plan *p = g_plans; p; p = p->next)
    if (p->comm == c) return p;
  struct plan *p = calloc(1, sizeof *p);
  if (!p) return NULL;
  p->comm = c;
  comm_ref(c);
  /* keep issue order: append */
  struct plan **pp = &g_plans;
  while (*pp) pp = &(*pp)->next;
  *pp = p;
  return p;
}

void plans_free(void) {
  while (g_plans) {
    struct plan *p = g_plans;
    g_plans = p->next;
    free(p->tasks);
    comm_unref(p->comm);
    free(p);
  }
}

/* ------------------------------------------------------------------ */
/* Joining a communicator (init and split jobs)                       */
/* ------------------------------------------------------------------ */

void id_to_name(const ncclUniqueId *id, char *name, size_t n) {
  uint64_t h = fnv1a(FNV_START, id->internal, sizeof id->internal);
  snprintf(name, n, "/mpgdbl-%016" PRIx64, h);
}

/* A child's segment: from the parent segment's random nonce (the same
 * in every member, unique per communicator even when two share an id
 * through NCCL_COMM_ID), the split's number and the colour. */
static void child_name(uint64_t parent_nonce, uint64_t seq, int color, char *name, size_t n) {
  uint64_t h = fnv1a(FNV_START, &parent_nonce, sizeof parent_nonce);
  h = fnv1a(h, &seq, sizeof seq);
  h = fnv1a(h, &color, sizeof color);
  snprintf(name, n, "/mpgdbl-%016" PRIx64, h);
}

/* The bus id of a device as NCCL compares it: busIdToInt64 keeps the hex
 * digits of "0000:XX:00.0" (misc/utils.cc:30-45). */
int64_t busid_of(int device) {
  char s[64] = "";
  dbl_device_busid(device, s, sizeof s);
  char hex[17];
  int k = 0;
  for (int i = 0; s[i] && k < 16; i++) {
    char ch = s[i];
    if (ch == ':' || ch == '.') continue;
    if ((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f') || (ch >= 'A' && ch <= 'F'))
      hex[k++] = ch;
    else
      break;
  }
  hex[k] = '\0';
  return (int64_t)strtoll(hex, NULL, 16);
}

/* A joined member's per-peer counts of the sends and receives it issued
 * (both join paths, shared memory and sockets, end here). */
ncclResult_t comm_count_issued(struct ncclComm *c, int n, char *msg, size_t msglen) {
  c->sends_issued = calloc((size_t)n, sizeof(uint64_t));
  c->recvs_issued = calloc((size_t)n, sizeof(uint64_t));
  if (c->sends_issued && c->recvs_issued) return ncclSuccess;
  snprintf(msg, msglen, "meshpg double: out of memory");
  return ncclSystemError;
}

/* A wait loop looks at its peers every 50 ms: whether that is due at *now,
 * read here (and then it counts as done). */
static int peer_check_due(double *last_check, double *now) {
  *now = dbl_now();
  if (*now - *last_check <= 0.05) return 0;
  *last_check = *now;
  return 1;
}

/* Join c's segment as c->rank of c->nranks and wait for everybody: the
 * bootstrap all-gather of init.cc:886-908.  Returns ncclSuccess or an
 * error with its text in *msg. */
static ncclResult_t do_join(struct ncclComm *c, volatile _Atomic int *parent_abort, char *msg,
                           size_t msglen) {
  volatile _Atomic int *abort_flag = &c->sh->abort;
  struct shm_hdr *h = NULL;
  int n = c->nranks, r = c->rank;
  double t0 = dbl_now();
  for (;;) {
    h = seg_open(c->name, n, abort_flag);
    if (!h) {
      snprintf(msg, msglen, "%s", tl_last_error);
      return ncclSystemError;
    }
    struct shm_rank *me = seg_rank(h, r);
    int32_t empty = RS_EMPTY;
    if (atomic_compare_exchange_strong(&me->state, &empty, RS_CLAIMED)) break;
    int32_t st = atomic_load_explicit(&me->state, memory_order_acquire);
    if (atomic_load(&h->status) == SEG_COMPLETE || (st == RS_CLAIMED && dbl_now() - t0 < 5)) {
      /* completed meanwhile, or being claimed: look again */
      munmap(h, h->bytes);
      sleep_us(200);
      continue;
    }
    if (st == RS_CLAIMED || (st == RS_JOINED && pid_dead(me->pid))) {
      /* Left by a process that died while joining (NCCL_COMM_ID reused
       * after a crash): nobody will complete it. */
      dbl_log("nccl double: %s is stale (rank %d's process %d died): unlinking it", c->name,
              r, (int)me->pid);
      seg_unlink_once(h);
      munmap(h, h->bytes);
      continue;
    }
    dbl_fatal("nccl double: rank %d joined communicator %s (%d ranks) twice: two callers "
              "passed the same rank with the same unique id (real NCCL would hang in "
              "bootstrap)",
              r, c->name, n);
  }
  struct shm_rank *me = seg_rank(h, r);
  me->pid = (int32_t)getpid();
  me->device = c->device;
  me->world_rank = c->world_rank;
  me->host_hash = c->host_hash;
  me->busid = c->busid;
  atomic_store_explicit(&me->state, RS_JOINED, memory_order_release);
  atomic_fetch_add(&h->joined, 1);
  c->shm = h;
  ww_bump(&h->wake, 1);

  double since = dbl_now(), last_check = 0;
  for (;;) {
    uint32_t seen = atomic_load(&h->wake.seq);
    /* `joined` only grows (a member that already left still counts): the
     * acquire pairs with every member's increment, made after its fields. */
    if (atomic_load_explicit(&h->joined, memory_order_acquire) >= n) break;
    /* A split's child also stops when its parent is aborted (the
     * childAbortFlag of init.cc:2393-2399). */
    if (atomic_load(abort_flag) || (parent_abort && atomic_load(parent_abort))) {
      snprintf(msg, msglen, "meshpg double: communicator %s aborted while rank %d waited for "
               "its peers to join", c->name, r);
      return ncclInternalError;
    }
    double now;
    if (peer_check_due(&last_check, &now)) {
      for (int i = 0; i < n; i++) {
        struct shm_rank *p = seg_rank(h, i);
        int32_t st = atomic_load_explicit(&p->state, memory_order_acquire);
        if (st == RS_JOINED && pid_dead(p->pid)) {
          /* bootstrap's socket sees the peer go: socketProgress's
           * "Connection closed by remote peer", ncclRemoteError
           * (misc/socket.cc:71-73). */
          snprintf(msg, msglen,
                   "socketProgress: Connection closed by remote peer (meshpg double: rank %d, "
                   "pid %d, of communicator %s exited while rank %d waited in "
                   "ncclCommInitRank / ncclCommSplit)",
                   i, (int)p->pid, c->name, r);
          return ncclRemoteError;
        }
        if ((st == RS_LEFT || st == RS_ABORTED) && i != r &&
            atomic_load(&h->joined) < n) {
          snprintf(msg, msglen, "socketProgress: Connection closed by remote peer (meshpg "
                   "double: rank %d of communicator %s %s it before every rank joined)",
                   i, c->name, st == RS_LEFT ? "destroyed" : "aborted");
          return ncclRemoteError;
        }
      }
      /* Real NCCL waits for ever in bootstrap; meshpg bounds the wait
       * with its own timeout and aborts, so this is only a warning. */
      if (now - since > hang_seconds() && since > 0) {
        char missing[1024] = "";
        size_t len = 0;
        for (int i = 0; i < n && len < sizeof missing - 16; i++)
          if (atomic_load(&seg_rank(h, i)->state) != RS_JOINED)
            len += (size_t)snprintf(missing + len, sizeof missing - len, " %d", i);
        fprintf(stderr, "meshpg double (pid %d): warning: rank %d of communicator %s (%d ranks, "
                "CUDA device %d) has waited %.1f s in ncclCommInitRank / ncclCommSplit for "
                "ranks%s to join (same id and nranks everywhere?)\n",
                (int)getpid(), r, c->name, n, c->device, now - since, missing);
        since = 0; /* once */
      }
    }
    ww_sleep(&h->wake, seen, 20, 1);
  }
  /* Complete: free the name for a later communicator with the same id. */
  int32_t joining = SEG_JOINING;
  if (atomic_compare_exchange_strong(&h->status, &joining, SEG_COMPLETE)) seg_unlink_once(h);

  /* The duplicate-GPU check of init.cc:902-906: same host and bus id. */
  for (int i = 0; i < n; i++) {
    struct shm_rank *p = seg_rank(h, i);
    if (i != r && p->host_hash == c->host_hash && p->busid == c->busid) {
      snprintf(msg, msglen, "Duplicate GPU detected : rank %d and rank %d both on CUDA device %lx",
               r, i, (unsigned long)c->busid);
      return ncclInvalidUsage;
    }
  }
  return comm_count_issued(c, n, msg, msglen);
}

/* The split all-gather and child membership of commGetSplitInfo
 * (init.cc:1455-1495): every parent rank publishes (colour, key), members
 * of a colour are ordered by key, ties by parent rank. */
static ncclResult_t do_split(struct job *j, char *msg, size_t msglen) {
  struct ncclComm *p = j->comm;
  struct shm_hdr *h = p->shm;
  int n = p->nranks, b = (int)(j->split_seq & 1);
  struct shm_rank *me = seg_rank(h, p->rank);
  atomic_store(&me->split_color[b], j->color);
  atomic_store(&me->split_key[b], j->key);
  atomic_store_explicit(&me->split_seq, j->split_seq, memory_order_release);
  net_pub(h, PUB_A32, -1, &me->split_color[b], 4);
  net_pub(h, PUB_A32, -1, &me->split_key[b], 4);
  net_pub(h, PUB_A64, -1, &me->split_seq, 8);
  ww_bump(&h->wake, 1);
  double since = dbl_now(), last_check = 0;
  for (;;) {
    uint32_t seen = atomic_load(&h->wake.seq);
    int all = 1;
    for (int i = 0; i < n && all; i++)
      if (atomic_load_explicit(&seg_rank(h, i)->split_seq, memory_order_acquire) < j->split_seq)
        all = 0;
    if (all) break;
    if (comm_aborted(p)) {
      snprintf(msg, msglen, "meshpg double: parent communicator %s aborted during "
               "ncclCommSplit", p->name);
      return ncclInternalError;
    }
    double now;
    if (peer_check_due(&last_check, &now)) {
      for (int i = 0; i < n; i++) {
        struct shm_rank *q = seg_rank(h, i);
        if (atomic_load(&q->split_seq) < j->split_seq && rank_dead(h, i)) {
          snprintf(msg, msglen,
                   "socketProgress: Connection closed by remote peer (meshpg double: rank %d, "
                   "pid %d, of communicator %s exited before ncclCommSplit #%" PRIu64 ")",
                   i, (int)q->pid, p->name, j->split_seq);
          return ncclRemoteError;
        }
      }
      if (now - since > hang_seconds() && since > 0) {
        char missing[1024] = "";
        size_t len = 0;
        for (int i = 0; i < n && len < sizeof missing - 64; i++) {
          uint64_t s = atomic_load(&seg_rank(h, i)->split_seq);
          if (s < j->split_seq)
            len += (size_t)snprintf(missing + len, sizeof missing - len,
                                    " rank %d (at split #%" PRIu64 ");", i, s);
        }
        fprintf(stderr, "meshpg double (pid %d): warning: ncclCommSplit #%" PRIu64 " of %s: "
                "rank %d has waited %.1f s for%s ncclCommSplit is collective over the parent\n",
                (int)getpid(), j->split_seq, p->name, p->rank, now - since, missing);
        since = 0; /* once; meshpg's timeout aborts the parent */
      }
    }
    ww_sleep(&h->wake, seen, 20, 1);
  }
  if (j->color == NCCL_SPLIT_NOCOLOR) return ncclSuccess;
  int *members = malloc(sizeof(int) * (size_t)n), nm = 0, myrank = -1;
  int *keys = malloc(sizeof(int) * (size_t)n);
  if (!members || !keys) {
    free(members);
    free(keys);
    snprintf(msg, msglen, "meshpg double: out of memory");
    return ncclSystemError;
  }
  for (int i = 0; i < n; i++) {
    struct shm_rank *q = seg_rank(h, i);
    if (atomic_load(&q->split_color[b]) != j->color) continue;
    int key = atomic_load(&q->split_key[b]), at = 0;
    while (at < nm && keys[at] <= key) at++;
    for (int k = nm; k > at; k--) {
      members[k] = members[k - 1];
      keys[k] = keys[k - 1];
    }
    members[at] = i;
    keys[at] = key;
    nm++;
  }
  for (int i = 0; i < nm; i++)
    if (members[i] == p->rank) myrank = i;
  struct ncclComm *c = j->child;
  c->nranks = nm;
  c->rank = myrank;
  child_name(h->nonce, j->split_seq, j->color, c->name, sizeof c->name);
  int one_host = 1;
  for (int i = 0; h->net && i < nm; i++)
    one_host &= net_peer_of(h, members[i]).host_hash == c->host_hash;
  if (h->net && !one_host) {
    /* A socket parent: the child connects its members over sockets too,
     * with a key every member derives alike (the parent's, the split's
     * number and the colour). */
    struct net_peer *peers = calloc((size_t)nm, sizeof *peers);
    if (!peers) dbl_fatal("nccl double: out of memory");
    for (int i = 0; i < nm; i++) peers[i] = net_peer_of(h, members[i]);
    uint64_t key = net_key_of(h);
    key = fnv1a(key, &j->split_seq, sizeof j->split_seq);
    key = fnv1a(key, &j->color, sizeof j->color);
    free(members);
    free(keys);
    return net_join(c, peers, key, fnv1a(key, "nonce", 5), &p->sh->abort, msg, msglen);
  }
  free(members);
  free(keys);
  /* Members on one host (a shared segment, or one host of a socket
   * parent: the intra-node rule, transport/shm.cc:86-87): the segment,
   * named alike by every member from the parent's nonce. */
  return do_join(c, &p->sh->abort, msg, msglen);
}

/* An id made from NCCL_COMM_ID is read again by NCCL's init thread:
 * ncclCommInitRankFunc (init.cc:1512) calls commAlloc (init.cc:1572), whose
 * ncclNetInit (init.cc:421) runs the socket transport's ncclFindInterfaces,
 * which reads NCCL_COMM_ID to pick the interface on the root's subnet
 * (misc/socket.cc:374-380).  A caller that unsets or changes the variable
 * while that thread runs races getenv against unsetenv, and NCCL picks its
 * network interface by timing.  NCCL does this once per process (the
 * transport's init is once); the double checks every init, as the job
 * starts and as it ends (the latest moment NCCL's thread could read it),
 * so that no order of inits hides the bug. */
static void env_id_check(const struct job *j, const char *when) {
  if (!j->env_id[0]) return;
  const char *now = getenv("NCCL_COMM_ID");
  if (now && !strcmp(now, j->env_id)) return;
  dbl_fatal("nccl double: rank %d of communicator %s: its unique id came from "
            "NCCL_COMM_ID=%s, but %s the variable is %s%s%s: NCCL's init thread reads it "
            "there (ncclFindInterfaces, misc/socket.cc:374, from commAlloc's ncclNetInit, "
            "init.cc:421), so real NCCL would choose its network interface by timing; keep "
            "NCCL_COMM_ID set until ncclCommGetAsyncError reports the init done",
            j->comm->rank, j->comm->name, j->env_id, when, now ? "\"" : "unset",
            now ? now : "", now ? "\"" : "");
}

/* An init: the bootstrap exchange with the id's root (every rank's host
 * hash and address, bootstrap.cc:282-360), then the shared segment when
 * every host hash is equal (the SHM/P2P rule, transport/shm.cc:86-87), else
 * sockets (NET, transport/net.cc:154-161).  An id without a root (made
 * from NCCL_COMM_ID) and a communicator of one rank use the segment. */
static ncclResult_t init_join(struct job *j, char *msg, size_t msglen) {
  struct ncclComm *c = j->comm;
  struct net_peer *peers = NULL;
  uint64_t key = 0, nonce = 0;
  if (c->nranks > 1) {
    ncclResult_t r = net_bootstrap(c, j->id, &peers, &key, &nonce, msg, msglen);
    if (r != ncclSuccess) return r;
  }
  int one_host = 1;
  for (int i = 0; peers && i < c->nranks; i++) one_host &= peers[i].host_hash == c->host_hash;
  if (one_host) {
    free(peers);
    return do_join(c, NULL, msg, msglen);
  }
  return net_join(c, peers, key, nonce, NULL, msg, msglen);
}

void *job_main(void *arg) {
  struct job *j = arg;
  char msg[1024] = "";
  ncclResult_t r;
  if (j->kind == JOB_INIT) {
    env_id_check(j, "as NCCL's init thread starts");
    r = init_join(j, msg, sizeof msg);
    env_id_check(j, "as NCCL's init thread ends");
    set_async(j->comm, r, msg);
    dbl_log("nccl double: init of rank %d/%d on %s: %s", j->comm->rank, j->comm->nranks,
            j->comm->name, ncclGetErrorString(r));
  } else {
    r = do_split(j, msg, sizeof msg);
    if (j->child) set_async(j->child, r, msg);
    /* The split job's result is the parent's (group.cc:610-611 and
     * 380-392 set the job's communicator's state), and the child is stored
     * into *newcomm when the job ends, even after a failure (init.cc:1611-1614). */
    __atomic_store_n(j->newcomm, j->child, __ATOMIC_RELEASE);
    if (r != ncclSuccess) {
      set_async(j->comm, r, msg);
    } else {
      int cur = ncclInProgress;
      atomic_compare_exchange_strong(&j->comm->async, &cur, ncclSuccess);
    }
    dbl_log("nccl double: split #%" PRIu64 " colour %d of %s: %s", j->split_seq, j->color,
            j->comm->name, ncclGetErrorString(r));
  }
  j->result = r;
  atomic_store_explicit(&j->done, 1, memory_order_release);
  return NULL;
}

/* Join a finished or aborting job's thread, once. */
void job_join(struct job *j) {
  if (j->started && !atomic_exchange(&j->joined, 1)) pthread_join(j->thread, NULL);
}

void job_free(struct job *j) {
  job_join(j);
  if (j->child) comm_unref(j->child);
  comm_unref(j->comm);
  free(j);
}

/* The communicator's state, resolving what has finished in the meantime
 * (ncclCommGetAsyncError, init.cc:2706-2720): a finished job is joined, a
 * non-blocking launch is observed done, a non-blocking finalize is done
 * once every kernel of the communicator has finished. */
ncclResult_t comm_state(struct ncclComm *c) {
  pthread_mutex_lock(&c->mu);
  struct job *j = c->job;
  if (j && atomic_load_explicit(&j->done, memory_order_acquire))
    c->job = NULL;
  else
    j = NULL;
  pthread_mutex_unlock(&c->mu);
  if (j) job_free(j);
  int s = atomic_load(&c->async);
  if (s == ncclInProgress && atomic_exchange(&c->launch_pending, 0)) {
    int cur = ncclInProgress;
    atomic_compare_exchange_strong(&c->async, &cur, ncclSuccess);
  }
  if (s == ncclInProgress && atomic_load(&c->revoke_pending) &&
      atomic_load(&c->own_done) == atomic_load(&c->own_issued)) {
    /* Quiescent: the revoke job ends by clearing the abort flags
     * (init.cc:2439) and the state becomes ncclSuccess. */
    int cur = ncclInProgress;
    atomic_store(&c->revoke_pending, 0);
    if (c->sh) atomic_store(&c->sh->abort, 0);
    atomic_compare_exchange_strong(&c->async, &cur, ncclSuccess);
  }
  if (s == ncclInProgress && atomic_load(&c->finalize_pending) &&
      atomic_load(&c->own_done) == atomic_load(&c->own_issued)) {
    int cur = ncclInProgress;
    atomic_store(&c->finalize_pending, 0);
    atomic_compare_exchange_strong(&c->async, &cur, ncclSuccess);
  }
  return (ncclResult_t)atomic_load(&c->async);
}
