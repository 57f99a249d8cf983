/* The thread backend: simulated ranks are threads of one process, and every
 * collective runs through shared memory under a mutex.
 *
 * Shared state
 *  - A thread world (mpg_thread_run) holds the ranks' start gate, their exit
 *    statuses and the "generations" of the world communicator: the k-th
 *    world_init of every rank joins generation k, so a rank may create
 *    several contexts one after the other (or side by side).
 *  - A group (struct tgroup) is the state all members of one communicator
 *    share: a mutex, a condition variable on CLOCK_MONOTONIC, the members'
 *    world ranks, the collectives in flight, one inbox per member for
 *    send/recv, and the abort flag.  Each member holds its own handle
 *    (mpg__comm) with its position and its next sequence number.  The group
 *    is reference counted (handles and requests); the last release frees it.
 *
 * Collectives
 *  Members number their collectives 0, 1, 2, ... on each communicator; the
 *  n-th call of every member forms one operation (struct top), found by
 *  sequence number in the group's list of operations in flight, so several
 *  may be in flight at once.  Each member deposits its request (which holds
 *  its buffers) and returns without waiting.  The member whose arrival
 *  completes the operation checks that the calls match, performs the whole
 *  operation for everyone under the group mutex (into temporaries first, so
 *  in-place buffers are safe), marks every request done and wakes the
 *  waiters.  Reductions run in position order, so results are deterministic;
 *  f16/bf16 accumulate in f32 and round once at the end.  Memory per
 *  operation is O(group size) plus the temporaries.
 *
 *  Send copies into a message in the receiver's inbox (or straight into an
 *  already posted receive) and completes at once; receives match messages
 *  from the same peer in order.
 *
 * Failures
 *  Waits are bounded by their deadline (pthread_cond_timedwait).  the abort op
 *  marks the group aborted: every waiter wakes and fails with the reason,
 *  later calls fail with MPG_ERR_ABORTED.  A request freed while pending is
 *  detached from its operation, which can then only fail. */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"

#define MAX_RANKS 4096
#define STACK_SIZE (256u * 1024u)
/* Back-pressure: a member that would open more than this many operations
 * in flight on one group waits (bounded) for the oldest to complete. */
#define MAX_INFLIGHT 1024
#define KIND_SPLIT 100 /* internal kind next to mpg__coll_kind */
#define NAME_LEN 64
#define MSG_LEN 320

/* ------------------------------------------------------------------------ */
/* Types                                                                     */
/* ------------------------------------------------------------------------ */

typedef struct tmsg {
  struct tmsg *next;
  int src;           /* sender's position */
  size_t count;
  mpg_dtype dtype;
  size_t bytes;
  unsigned char data[];
} tmsg;

typedef struct tinbox {
  tmsg *head, *tail;           /* messages nobody has received yet */
  mpg__req *rhead, *rtail;     /* receives posted before their message */
} tinbox;

typedef struct top top;

typedef struct tgroup {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int refs;            /* handles + requests (+1 while a world lists it) */
  int size;
  int *ranks;          /* world rank of each position */
  char name[NAME_LEN]; /* "world", "world/s0c3", ... */
  mpg_status aborted;  /* MPG_OK while healthy, else the reason */
  char abort_msg[160];
  top *ops, *ops_tail; /* collectives in flight, oldest first */
  int nops;
  tinbox *inbox;       /* per position */
  unsigned nsplits;    /* splits completed, to name children */
  void *scratch[2];    /* reduction temporaries, kept for the next operation
                          (a fresh large malloc costs page faults each time) */
  size_t scratch_cap[2];
  /* world generations only */
  long gen;
  int joined;
  struct tgroup *gen_next;
} tgroup;

struct top {
  top *next;
  uint64_t seq;
  int kind;
  int arrived;
  int abandoned;       /* members whose request was freed before the end */
  int ref_pos;         /* the first arrival, which the others must match */
  mpg__coll ref;
  int bad;
  char bad_msg[MSG_LEN];
  mpg__req *reqs[];    /* per position; NULL before arrival or if freed */
};

struct mpg__comm {
  tgroup *g;
  int pos;
  int rank;            /* world rank */
  uint64_t seq;        /* next collective of this member */
  double timeout_s;
};

struct mpg__req {
  tgroup *g;
  int pos;
  int rank;
  int kind;
  uint64_t seq;
  mpg__coll coll;
  top *op;             /* the collective in flight, while pending */
  mpg__req *next;      /* inbox receive list */
  int done;
  mpg_status status;
  char msg[MSG_LEN];
  int owns_ref;        /* holds a reference on g (not the split's) */
  /* split */
  int color, key;
  tgroup *child;
  int child_pos;
};

typedef struct rank_slot {
  pthread_t thread;
  int started;
  int rank;
  mpg_thread_world *world;
  mpg_status status;
  char *msg;           /* the rank's mpg_last_error() when it failed */
} rank_slot;

struct mpg_thread_world {
  int nranks;
  double timeout_s;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int go, cancelled;
  int first_failed;    /* rank that failed first, or -1 */
  mpg_rank_main main;
  void *arg;
  long *joins;         /* per rank: world_init calls so far */
  tgroup *gens;        /* generations not all ranks have joined yet */
  rank_slot *slots;
};

/* ------------------------------------------------------------------------ */
/* Small helpers                                                             */
/* ------------------------------------------------------------------------ */

static const char *kind_name(int kind) {
  return kind == KIND_SPLIT ? "split" : mpg__kind_name((mpg__coll_kind)kind);
}

/* "all_reduce(count 5, f32, sum)" */
static void describe(char *buf, size_t n, int kind, const mpg__coll *c) {
  const char *k = kind_name(kind);
  const char *dt = mpg_dtype_name(c->dtype);
  switch (kind) {
    case MPG__ALL_REDUCE:
    case MPG__REDUCE_SCATTER:
      snprintf(buf, n, "%s(count %zu, %s, %s)", k, c->count, dt, mpg__op_name(c->op));
      break;
    case MPG__BROADCAST:
      snprintf(buf, n, "%s(count %zu, %s, root %d)", k, c->count, dt, c->root);
      break;
    case MPG__ALL_GATHER:
      snprintf(buf, n, "%s(count %zu, %s)", k, c->count, dt);
      break;
    case MPG__SEND:
    case MPG__RECV:
      snprintf(buf, n, "%s(count %zu, %s, peer %d)", k, c->count, dt, c->peer);
      break;
    default:
      snprintf(buf, n, "%s", k);
  }
}

/* Wait on cv until signalled or until `deadline` (mpg__now() seconds). */
static void timed_wait(pthread_cond_t *cv, pthread_mutex_t *mu, double deadline) {
  double now = mpg__now();
  /* Far or NaN deadlines: wake up now and then and let the caller loop. */
  if (!(deadline <= now + 3600.0)) deadline = now + 3600.0;
  struct timespec ts;
  ts.tv_sec = (time_t)deadline;
  long ns = (long)((deadline - (double)ts.tv_sec) * 1e9);
  if (ns < 0) ns = 0;
  if (ns > 999999999L) ns = 999999999L;
  ts.tv_nsec = ns;
  (void)pthread_cond_timedwait(cv, mu, &ts);
}

static mpg_status fail_req(const mpg__req *r, mpg_status st, const char *what) {
  return mpg__fail(st, "thread backend: rank %d (position %d of group %s): %s",
                   r->rank, r->pos, r->g->name, what);
}

/* ------------------------------------------------------------------------ */
/* Groups                                                                    */
/* ------------------------------------------------------------------------ */

static tgroup *group_new(int size, const char *name) {
  tgroup *g = calloc(1, sizeof *g);
  if (!g) return NULL;
  g->ranks = malloc(sizeof(int) * (size_t)size);
  g->inbox = calloc((size_t)size, sizeof(tinbox));
  if (!g->ranks || !g->inbox) goto fail;
  g->size = size;
  snprintf(g->name, sizeof g->name, "%s", name);
  if (pthread_mutex_init(&g->mu, NULL)) goto fail;
  pthread_condattr_t ca;
  if (pthread_condattr_init(&ca)) goto fail_mu;
  int bad = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) ||
            pthread_cond_init(&g->cv, &ca);
  pthread_condattr_destroy(&ca);
  if (bad) goto fail_mu;
  return g;
fail_mu:
  pthread_mutex_destroy(&g->mu);
fail:
  free(g->ranks);
  free(g->inbox);
  free(g);
  return NULL;
}

/* Only when nobody references g any more. */
static void group_free(tgroup *g) {
  mpg__log(2, "thread: group %s (size %d) freed", g->name, g->size);
  for (top *op = g->ops, *next; op; op = next) {
    next = op->next;
    free(op);
  }
  for (int p = 0; p < g->size; p++)
    for (tmsg *m = g->inbox[p].head, *next; m; m = next) {
      next = m->next;
      free(m);
    }
  pthread_cond_destroy(&g->cv);
  pthread_mutex_destroy(&g->mu);
  free(g->scratch[0]);
  free(g->scratch[1]);
  free(g->ranks);
  free(g->inbox);
  free(g);
}

/* Drop one reference, with g->mu held; unlocks; frees g after the last. */
static void group_unref_unlock(tgroup *g) {
  int last = --g->refs == 0;
  pthread_mutex_unlock(&g->mu);
  if (last) group_free(g);
}

static void group_abort_locked(tgroup *g, int by_rank, mpg_status reason) {
  if (reason == MPG_OK) reason = MPG_ERR_ABORTED;
  if (!g->aborted) {
    g->aborted = reason;
    snprintf(g->abort_msg, sizeof g->abort_msg, "group %s was aborted by rank %d (%s)",
             g->name, by_rank, reason == MPG_ERR_TIMEOUT ? "timeout" : "abort");
    mpg__log(2, "thread: rank %d aborts group %s (%s)", by_rank, g->name,
             mpg_status_name(reason));
  }
  pthread_cond_broadcast(&g->cv);
}

/* ------------------------------------------------------------------------ */
/* Performing an operation (caller holds g->mu; every request is present)   */
/* ------------------------------------------------------------------------ */

static void *xmalloc(size_t n) { return malloc(n ? n : 1); }

/* Temporary `which` (0 or 1) of at least `bytes`, owned by the group and
 * reused by later operations (caller holds g->mu).  NULL when out of memory. */
static void *group_scratch(tgroup *g, int which, size_t bytes) {
  if (bytes == 0) bytes = 1;
  if (g->scratch_cap[which] < bytes) {
    free(g->scratch[which]);
    g->scratch[which] = malloc(bytes);
    g->scratch_cap[which] = g->scratch[which] ? bytes : 0;
  }
  return g->scratch[which];
}

/* *out = op over members of their send buffers (total elements each), in
 * position order, in dtype `at` (f32 for halves).  AVG divides at the end.
 * The result lives in the group's scratch space. */
static mpg_status reduce_all(tgroup *g, top *op, int n, size_t total,
                             mpg_dtype dt, mpg_op rop, void **out_acc) {
  int half = mpg__dtype_is_half(dt);
  mpg_dtype at = half ? MPG_F32 : dt;
  size_t asz = mpg__dtype_size(at);
  int premul = rop == MPG_OP_PREMUL_SUM;
  void *acc = group_scratch(g, 0, total * asz);
  void *tmp = (half || premul) ? group_scratch(g, 1, total * asz) : NULL;
  if (!acc || ((half || premul) && !tmp)) return MPG_ERR_NOMEM;
  for (int p = 0; p < n; p++) {
    const mpg__coll *c = &op->reqs[p]->coll;
    const void *x = c->send;
    void *dst = p == 0 ? acc : tmp;
    if (half) {
      mpg__half_widen(dt, x, dst, total);
      x = dst;
    } else if (premul || p == 0) {
      memcpy(dst, x, total * asz);
      x = dst;
    }
    if (premul) mpg__scale(at, dst, total, c->scale);
    if (p > 0) mpg__reduce_into(at, rop, acc, x, total);
  }
  if (rop == MPG_OP_AVG) mpg__divide(at, acc, total, n);
  if (half) {
    /* One rounding, into tmp (reused as the narrowed result). */
    mpg__half_narrow(dt, acc, tmp, total);
    acc = tmp;
  }
  *out_acc = acc;
  return MPG_OK;
}

static mpg_status perform_split(tgroup *g, top *op);

static mpg_status perform(tgroup *g, top *op) {
  int n = g->size;
  const mpg__coll *c = &op->ref;
  size_t es = mpg__dtype_size(c->dtype);
  if (c->count == 0 && op->kind != MPG__BARRIER && op->kind != KIND_SPLIT)
    return MPG_OK; /* nothing to move (buffers may be NULL) */
  switch (op->kind) {
    case MPG__ALL_REDUCE: {
      void *acc;
      if (reduce_all(g, op, n, c->count, c->dtype, c->op, &acc)) return MPG_ERR_NOMEM;
      for (int p = 0; p < n; p++) memcpy(op->reqs[p]->coll.recv, acc, c->count * es);
      return MPG_OK;
    }
    case MPG__REDUCE_SCATTER: {
      void *acc;
      if (reduce_all(g, op, n, c->count * (size_t)n, c->dtype, c->op, &acc))
        return MPG_ERR_NOMEM;
      for (int p = 0; p < n; p++)
        memcpy(op->reqs[p]->coll.recv, (char *)acc + (size_t)p * c->count * es,
               c->count * es);
      return MPG_OK;
    }
    case MPG__BROADCAST: {
      const void *src = op->reqs[c->root]->coll.recv;
      for (int p = 0; p < n; p++) {
        void *dst = op->reqs[p]->coll.recv;
        if (p != c->root && dst != src) memcpy(dst, src, c->count * es);
      }
      return MPG_OK;
    }
    case MPG__ALL_GATHER: {
      size_t blk = c->count * es;
      char *tmp = group_scratch(g, 0, blk * (size_t)n);
      if (!tmp) return MPG_ERR_NOMEM;
      for (int p = 0; p < n; p++) memcpy(tmp + (size_t)p * blk, op->reqs[p]->coll.send, blk);
      for (int p = 0; p < n; p++) memcpy(op->reqs[p]->coll.recv, tmp, blk * (size_t)n);
      return MPG_OK;
    }
    case MPG__BARRIER:
      return MPG_OK;
    case KIND_SPLIT:
      return perform_split(g, op);
  }
  return MPG_ERR_INVALID;
}

typedef struct skey {
  int color, key, pos;
} skey;

static int skey_cmp(const void *a, const void *b) {
  const skey *x = a, *y = b;
  if (x->color != y->color) return x->color < y->color ? -1 : 1;
  if (x->key != y->key) return x->key < y->key ? -1 : 1;
  return (x->pos > y->pos) - (x->pos < y->pos);
}

static mpg_status perform_split(tgroup *g, top *op) {
  int n = g->size, m = 0;
  skey *k = xmalloc(sizeof(skey) * (size_t)n);
  if (!k) return MPG_ERR_NOMEM;
  for (int p = 0; p < n; p++) {
    mpg__req *r = op->reqs[p];
    r->child = NULL;
    r->child_pos = -1;
    if (r->color >= 0) k[m++] = (skey){r->color, r->key, p};
  }
  qsort(k, (size_t)m, sizeof *k, skey_cmp);
  unsigned id = g->nsplits++;
  for (int i = 0; i < m;) {
    int j = i;
    while (j < m && k[j].color == k[i].color) j++;
    char name[NAME_LEN];
    if (snprintf(name, sizeof name, "%s/s%uc%d", g->name, id, k[i].color) >=
        (int)sizeof name)
      name[sizeof name - 1] = '\0'; /* a long chain of splits: truncated */
    tgroup *child = group_new(j - i, name);
    if (!child) {
      /* Undo the children made so far: nobody has seen them. */
      for (int q = 0; q < i; q++) {
        mpg__req *r = op->reqs[k[q].pos];
        if (r->child && r->child_pos == 0) group_free(r->child);
      }
      for (int q = 0; q < i; q++) op->reqs[k[q].pos]->child = NULL;
      free(k);
      return MPG_ERR_NOMEM;
    }
    child->refs = j - i;
    for (int q = i; q < j; q++) {
      child->ranks[q - i] = g->ranks[k[q].pos];
      op->reqs[k[q].pos]->child = child;
      op->reqs[k[q].pos]->child_pos = q - i;
    }
    mpg__log(2, "thread: split #%u of %s: colour %d -> group %s of %d ranks", id,
             g->name, k[i].color, child->name, j - i);
    i = j;
  }
  free(k);
  return MPG_OK;
}

static void unlink_op(tgroup *g, top *op) {
  top **pp = &g->ops, *prev = NULL;
  while (*pp && *pp != op) {
    prev = *pp;
    pp = &(*pp)->next;
  }
  if (!*pp) return;
  *pp = op->next;
  if (g->ops_tail == op) g->ops_tail = prev;
  g->nops--;
}

/* Every member has arrived: perform the operation and finish every request. */
static void complete(tgroup *g, top *op) {
  mpg_status st;
  char msg[MSG_LEN], what[96];
  describe(what, sizeof what, op->kind, &op->ref);
  msg[0] = '\0';
  if (op->abandoned) {
    st = MPG_ERR_ABORTED;
    snprintf(msg, sizeof msg, "%s #%llu: %d member(s) gave up on it before it completed",
             what, (unsigned long long)op->seq, op->abandoned);
  } else if (op->bad) {
    st = MPG_ERR_INVALID;
    snprintf(msg, sizeof msg, "%s", op->bad_msg);
  } else {
    st = perform(g, op);
    if (st)
      snprintf(msg, sizeof msg, "%s #%llu: out of memory for its temporaries", what,
               (unsigned long long)op->seq);
  }
  for (int p = 0; p < g->size; p++) {
    mpg__req *r = op->reqs[p];
    if (!r) continue;
    r->done = 1;
    r->status = st;
    r->op = NULL;
    if (st) snprintf(r->msg, sizeof r->msg, "%s", msg);
  }
  unlink_op(g, op);
  free(op);
  pthread_cond_broadcast(&g->cv);
}

/* Does member `c` (kind) make the same call as the first arrival? */
static void check_match(tgroup *g, top *op, int pos, int kind, const mpg__coll *c) {
  if (op->bad) return;
  const mpg__coll *r = &op->ref;
  int same = kind == op->kind;
  if (same) switch (kind) {
      case MPG__ALL_REDUCE:
      case MPG__REDUCE_SCATTER:
        same = c->count == r->count && c->dtype == r->dtype && c->op == r->op;
        break;
      case MPG__BROADCAST:
        same = c->count == r->count && c->dtype == r->dtype && c->root == r->root;
        break;
      case MPG__ALL_GATHER:
        same = c->count == r->count && c->dtype == r->dtype;
        break;
      default:
        break;
    }
  if (same) return;
  char a[96], b[96];
  describe(a, sizeof a, kind, c);
  describe(b, sizeof b, op->kind, r);
  op->bad = 1;
  snprintf(op->bad_msg, sizeof op->bad_msg,
           "collective #%llu does not match: position %d (rank %d) called %s "
           "but position %d (rank %d) called %s",
           (unsigned long long)op->seq, pos, g->ranks[pos], a, op->ref_pos,
           g->ranks[op->ref_pos], b);
}

/* Deposit `req` (already filled: kind, coll, split colour/key) as this
 * member's next collective.  Takes g->mu. */
static mpg_status coll_arrive(mpg__comm *cm, mpg__req *req) {
  tgroup *g = cm->g;
  char what[96];
  pthread_mutex_lock(&g->mu);
  if (g->aborted) {
    pthread_mutex_unlock(&g->mu);
    describe(what, sizeof what, req->kind, &req->coll);
    return mpg__fail(MPG_ERR_ABORTED,
                     "thread backend: rank %d (position %d of group %s): %s: %s",
                     cm->rank, cm->pos, g->name, what, g->abort_msg);
  }
  uint64_t seq = cm->seq;
  top *op = NULL;
  double deadline = 0;
  for (;;) {
    for (op = g->ops; op && op->seq != seq; op = op->next) {
    }
    if (op || g->nops < MAX_INFLIGHT || g->aborted) break;
    /* This member runs far ahead of a peer: wait for room (bounded). */
    if (deadline == 0) deadline = mpg__now() + cm->timeout_s;
    if (mpg__now() >= deadline) break;
    timed_wait(&g->cv, &g->mu, deadline);
  }
  if (g->aborted || (!op && g->nops >= MAX_INFLIGHT)) {
    mpg_status st = g->aborted ? MPG_ERR_ABORTED : MPG_ERR_TIMEOUT;
    int nops = g->nops;
    char am[sizeof g->abort_msg];
    snprintf(am, sizeof am, "%s", g->abort_msg);
    pthread_mutex_unlock(&g->mu);
    describe(what, sizeof what, req->kind, &req->coll);
    if (st == MPG_ERR_ABORTED)
      return mpg__fail(st, "thread backend: rank %d (position %d of group %s): %s: %s",
                       cm->rank, cm->pos, g->name, what, am);
    return mpg__fail(st,
                     "thread backend: rank %d (position %d of group %s): %s #%llu: "
                     "%d operations already in flight and no peer caught up "
                     "within %.3g s",
                     cm->rank, cm->pos, g->name, what, (unsigned long long)seq,
                     nops, cm->timeout_s);
  }
  if (!op) {
    op = calloc(1, sizeof *op + sizeof(mpg__req *) * (size_t)g->size);
    if (!op) {
      pthread_mutex_unlock(&g->mu);
      return mpg__fail(MPG_ERR_NOMEM, "thread backend: rank %d: out of memory posting %s on group %s",
                       cm->rank, kind_name(req->kind), g->name);
    }
    op->seq = seq;
    op->kind = req->kind;
    op->ref = req->coll;
    op->ref_pos = cm->pos;
    if (g->ops_tail)
      g->ops_tail->next = op;
    else
      g->ops = op;
    g->ops_tail = op;
    g->nops++;
  } else {
    check_match(g, op, cm->pos, req->kind, &req->coll);
  }
  cm->seq++;
  req->seq = seq;
  req->op = op;
  op->reqs[cm->pos] = req;
  if (req->owns_ref) g->refs++;
  if (++op->arrived == g->size) complete(g, op);
  pthread_mutex_unlock(&g->mu);
  return MPG_OK;
}

/* ------------------------------------------------------------------------ */
/* Point to point                                                            */
/* ------------------------------------------------------------------------ */

/* Deliver message bytes to a posted receive; sets its status. */
static void deliver(mpg__req *r, const void *data, size_t bytes, size_t count,
                    mpg_dtype dtype, int src) {
  size_t want = r->coll.count * mpg__dtype_size(r->coll.dtype);
  r->done = 1;
  r->op = NULL;
  if (bytes != want) {
    r->status = MPG_ERR_INVALID;
    snprintf(r->msg, sizeof r->msg,
             "recv(count %zu, %s, peer %d) got a message of %zu bytes "
             "(count %zu, %s) from position %d: %zu bytes expected",
             r->coll.count, mpg_dtype_name(r->coll.dtype), r->coll.peer, bytes,
             count, mpg_dtype_name(dtype), src, want);
    return;
  }
  r->status = MPG_OK;
  if (bytes) memcpy(r->coll.recv, data, bytes);
}

/* Remove a pending receive from its inbox (g->mu held). */
static void unlink_recv(tgroup *g, mpg__req *req) {
  tinbox *box = &g->inbox[req->pos];
  mpg__req *prev = NULL, *r = box->rhead;
  while (r && r != req) {
    prev = r;
    r = r->next;
  }
  if (!r) return;
  if (prev)
    prev->next = r->next;
  else
    box->rhead = r->next;
  if (box->rtail == r) box->rtail = prev;
  r->next = NULL;
}

static mpg_status p2p_post(mpg__comm *cm, mpg__req *req) {
  tgroup *g = cm->g;
  const mpg__coll *c = &req->coll;
  char what[96];
  size_t bytes = c->count * mpg__dtype_size(c->dtype);
  if (c->peer < 0 || c->peer >= g->size)
    return mpg__fail(MPG_ERR_INVALID,
                     "thread backend: rank %d (position %d of group %s): %s: peer %d "
                     "is outside 0..%d",
                     cm->rank, cm->pos, g->name, kind_name(req->kind), c->peer,
                     g->size - 1);
  /* A send copies before taking the lock (the message is its own). */
  tmsg *m = NULL;
  if (req->kind == MPG__SEND) {
    m = malloc(sizeof *m + bytes);
    if (!m)
      return mpg__fail(MPG_ERR_NOMEM,
                       "thread backend: rank %d: out of memory for a %zu-byte message "
                       "on group %s", cm->rank, bytes, g->name);
    m->next = NULL;
    m->src = cm->pos;
    m->count = c->count;
    m->dtype = c->dtype;
    m->bytes = bytes;
    if (bytes) memcpy(m->data, c->send, bytes);
  }
  pthread_mutex_lock(&g->mu);
  if (g->aborted) {
    pthread_mutex_unlock(&g->mu);
    free(m);
    describe(what, sizeof what, req->kind, c);
    return mpg__fail(MPG_ERR_ABORTED,
                     "thread backend: rank %d (position %d of group %s): %s: %s",
                     cm->rank, cm->pos, g->name, what, g->abort_msg);
  }
  if (req->owns_ref) g->refs++;
  if (req->kind == MPG__SEND) {
    tinbox *box = &g->inbox[c->peer];
    mpg__req *r = box->rhead;
    while (r && r->coll.peer != cm->pos) r = r->next;
    if (r) { /* a receive is waiting: hand the data over directly */
      unlink_recv(g, r);
      deliver(r, m->data, bytes, c->count, c->dtype, cm->pos);
      free(m);
      pthread_cond_broadcast(&g->cv);
    } else {
      if (box->tail)
        box->tail->next = m;
      else
        box->head = m;
      box->tail = m;
    }
    req->done = 1;
    req->status = MPG_OK;
  } else {
    tinbox *box = &g->inbox[cm->pos];
    tmsg *prev = NULL, *mm = box->head;
    while (mm && mm->src != c->peer) {
      prev = mm;
      mm = mm->next;
    }
    if (mm) {
      if (prev)
        prev->next = mm->next;
      else
        box->head = mm->next;
      if (box->tail == mm) box->tail = prev;
      deliver(req, mm->data, mm->bytes, mm->count, mm->dtype, mm->src);
      free(mm);
    } else {
      req->next = NULL;
      if (box->rtail)
        box->rtail->next = req;
      else
        box->rhead = req;
      box->rtail = req;
    }
  }
  pthread_mutex_unlock(&g->mu);
  return MPG_OK;
}

/* ------------------------------------------------------------------------ */
/* Requests                                                                  */
/* ------------------------------------------------------------------------ */

/* With g->mu held and the request pending and not done: what it lacks. */
static void pending_detail(const mpg__req *r, char *buf, size_t n) {
  tgroup *g = r->g;
  char what[96];
  describe(what, sizeof what, r->kind, &r->coll);
  if (r->kind == MPG__RECV) {
    snprintf(buf, n, "%s timed out: no message from position %d (rank %d) arrived",
             what, r->coll.peer, g->ranks[r->coll.peer]);
    return;
  }
  const top *op = r->op;
  if (!op) {
    snprintf(buf, n, "%s timed out", what);
    return;
  }
  size_t len = (size_t)snprintf(buf, n, "%s #%llu timed out: %d of %d members arrived; missing",
                                what, (unsigned long long)op->seq, op->arrived, g->size);
  int shown = 0;
  for (int p = 0; p < g->size && len < n; p++) {
    if (op->reqs[p]) continue;
    if (shown == 8) {
      snprintf(buf + len, n - len, " ...");
      break;
    }
    len += (size_t)snprintf(buf + len, n - len, " position %d (rank %d)", p, g->ranks[p]);
    shown++;
  }
}

/* The outcome of a finished (or aborted) request: its status and, when it
 * failed, the message to record.  g->mu held; returns -1 if still pending. */
static int outcome_locked(mpg__req *r, mpg_status *st, char *msg, size_t n) {
  if (r->done) {
    *st = r->status;
    if (r->status) snprintf(msg, n, "%s", r->msg);
    return 1;
  }
  if (r->g->aborted) {
    char what[96];
    describe(what, sizeof what, r->kind, &r->coll);
    *st = r->g->aborted;
    snprintf(msg, n, "%s: %s", what, r->g->abort_msg);
    return 1;
  }
  return -1;
}

static mpg_status t_test(mpg__req *req, int *done) {
  if (!req || !done) {
    if (done) *done = 1;
    return mpg__fail(MPG_ERR_INVALID, "thread backend: test: NULL argument");
  }
  mpg_status st = MPG_OK;
  char msg[MSG_LEN + 128];
  pthread_mutex_lock(&req->g->mu);
  int r = outcome_locked(req, &st, msg, sizeof msg);
  pthread_mutex_unlock(&req->g->mu);
  *done = r > 0;
  if (r > 0 && st) return fail_req(req, st, msg);
  return MPG_OK;
}

static mpg_status t_wait(mpg__req *req, double deadline) {
  if (!req) return mpg__fail(MPG_ERR_INVALID, "thread backend: wait: NULL request");
  tgroup *g = req->g;
  mpg_status st = MPG_OK;
  char msg[MSG_LEN + 128];
  pthread_mutex_lock(&g->mu);
  for (;;) {
    if (outcome_locked(req, &st, msg, sizeof msg) > 0) break;
    if (mpg__now() >= deadline) {
      st = MPG_ERR_TIMEOUT;
      pending_detail(req, msg, sizeof msg);
      break;
    }
    timed_wait(&g->cv, &g->mu, deadline);
  }
  pthread_mutex_unlock(&g->mu);
  return st ? fail_req(req, st, msg) : MPG_OK;
}

static void t_req_free(mpg__req *req) {
  if (!req) return;
  tgroup *g = req->g;
  pthread_mutex_lock(&g->mu);
  if (!req->done) {
    if (req->op) {
      req->op->reqs[req->pos] = NULL;
      req->op->abandoned++;
      req->op = NULL;
    } else if (req->kind == MPG__RECV) {
      unlink_recv(g, req);
    }
  }
  if (req->owns_ref)
    group_unref_unlock(g);
  else
    pthread_mutex_unlock(&g->mu);
  free(req);
}

static mpg_status t_post(mpg__comm *cm, const mpg__coll *coll, mpg__req **out) {
  if (out) *out = NULL;
  if (!cm || !coll || !out)
    return mpg__fail(MPG_ERR_INVALID, "thread backend: post: NULL argument");
  if ((unsigned)coll->kind > MPG__RECV)
    return mpg__fail(MPG_ERR_INVALID, "thread backend: post: unknown operation %d",
                     (int)coll->kind);
  mpg__req *req = calloc(1, sizeof *req);
  if (!req)
    return mpg__fail(MPG_ERR_NOMEM, "thread backend: rank %d: out of memory posting %s",
                     cm->rank, kind_name((int)coll->kind));
  req->g = cm->g;
  req->pos = cm->pos;
  req->rank = cm->rank;
  req->kind = (int)coll->kind;
  req->coll = *coll;
  req->owns_ref = 1;
  mpg_status st = (coll->kind == MPG__SEND || coll->kind == MPG__RECV)
                      ? p2p_post(cm, req)
                      : coll_arrive(cm, req);
  if (st) {
    free(req);
    return st;
  }
  *out = req;
  return MPG_OK;
}

/* ------------------------------------------------------------------------ */
/* Communicators                                                             */
/* ------------------------------------------------------------------------ */

static mpg_status t_split(mpg__comm *parent, int color, int key, mpg__comm **out) {
  if (out) *out = NULL;
  if (!parent || !out) return mpg__fail(MPG_ERR_INVALID, "thread backend: split: NULL argument");
  tgroup *g = parent->g;
  /* Allocated up front so that nothing can fail once the child exists. */
  mpg__comm *mine = color >= 0 ? calloc(1, sizeof *mine) : NULL;
  if (color >= 0 && !mine)
    return mpg__fail(MPG_ERR_NOMEM, "thread backend: rank %d: out of memory in split",
                     parent->rank);
  mpg__req req;
  memset(&req, 0, sizeof req);
  req.g = g;
  req.pos = parent->pos;
  req.rank = parent->rank;
  req.kind = KIND_SPLIT;
  req.coll.kind = MPG__BARRIER;
  req.color = color;
  req.key = key;
  req.owns_ref = 0; /* the parent handle keeps g alive */
  mpg_status st = coll_arrive(parent, &req);
  if (st) {
    free(mine);
    return st;
  }
  double deadline = mpg__now() + parent->timeout_s;
  char msg[MSG_LEN + 128];
  pthread_mutex_lock(&g->mu);
  for (;;) {
    if (outcome_locked(&req, &st, msg, sizeof msg) > 0) break;
    if (mpg__now() >= deadline) {
      st = MPG_ERR_TIMEOUT;
      pending_detail(&req, msg, sizeof msg);
      /* The request lives on this stack: detach it, and fail the split for
       * everyone at once rather than let each peer run into the timeout. */
      req.op->reqs[req.pos] = NULL;
      req.op->abandoned++;
      req.op = NULL;
      group_abort_locked(g, parent->rank, MPG_ERR_TIMEOUT);
      break;
    }
    timed_wait(&g->cv, &g->mu, deadline);
  }
  if (!req.done && req.op) {
    /* Aborted before completion: detach the stack request. */
    req.op->reqs[req.pos] = NULL;
    req.op->abandoned++;
    req.op = NULL;
  }
  pthread_mutex_unlock(&g->mu);
  if (st) {
    free(mine);
    return fail_req(&req, st, msg);
  }
  if (!req.child) {
    free(mine);
    mpg__log(2, "thread: rank %d: split #%llu of %s: colour %d, no group", parent->rank,
             (unsigned long long)req.seq, g->name, color);
    return MPG_OK;
  }
  mine->g = req.child;
  mine->pos = req.child_pos;
  mine->rank = parent->rank;
  mine->timeout_s = parent->timeout_s;
  *out = mine;
  return MPG_OK;
}

static void t_abort(mpg__comm *cm, mpg_status reason) {
  if (!cm) return;
  pthread_mutex_lock(&cm->g->mu);
  group_abort_locked(cm->g, cm->rank, reason);
  pthread_mutex_unlock(&cm->g->mu);
}

static mpg_status t_destroy(mpg__comm *cm) {
  if (!cm) return MPG_OK;
  tgroup *g = cm->g;
  pthread_mutex_lock(&g->mu);
  group_unref_unlock(g);
  free(cm);
  return MPG_OK;
}

/* ------------------------------------------------------------------------ */
/* The world                                                                 */
/* ------------------------------------------------------------------------ */

static mpg_status t_world_init(const mpg__world_args *a, mpg__comm **out) {
  if (out) *out = NULL;
  if (!a || !out) return mpg__fail(MPG_ERR_INVALID, "thread backend: world_init: NULL argument");
  mpg_thread_world *w = a->thread_world;
  if (!w)
    return mpg__fail(MPG_ERR_INVALID,
                     "thread backend: rank %d has no thread world (start the ranks "
                     "with mpg_thread_run)", a->rank);
  if (a->world_size != w->nranks)
    return mpg__fail(MPG_ERR_INVALID,
                     "thread backend: rank %d: world size %d, but the thread world "
                     "runs %d ranks", a->rank, a->world_size, w->nranks);
  if (a->rank < 0 || a->rank >= w->nranks)
    return mpg__fail(MPG_ERR_INVALID,
                     "thread backend: rank %d is outside the thread world of %d ranks",
                     a->rank, w->nranks);
  double timeout = a->timeout_s > 0 ? a->timeout_s : 600.0;
  double deadline = mpg__now() + timeout;
  mpg__comm *cm = calloc(1, sizeof *cm);
  if (!cm) return mpg__fail(MPG_ERR_NOMEM, "thread backend: rank %d: out of memory", a->rank);

  pthread_mutex_lock(&w->mu);
  long gen = w->joins[a->rank];
  tgroup *g = w->gens;
  while (g && g->gen != gen) g = g->gen_next;
  if (!g) {
    char name[NAME_LEN] = "world";
    if (gen > 0) snprintf(name, sizeof name, "world#%ld", gen);
    g = group_new(w->nranks, name);
    if (!g) {
      pthread_mutex_unlock(&w->mu);
      free(cm);
      return mpg__fail(MPG_ERR_NOMEM, "thread backend: rank %d: out of memory for the world",
                       a->rank);
    }
    for (int r = 0; r < w->nranks; r++) g->ranks[r] = r;
    g->gen = gen;
    g->refs = 1; /* the world's list */
    g->gen_next = w->gens;
    w->gens = g;
  }
  w->joins[a->rank]++;
  pthread_mutex_lock(&g->mu);
  g->refs++;
  if (++g->joined == w->nranks) {
    /* Everyone is in: the world no longer needs to find it. */
    tgroup **pp = &w->gens;
    while (*pp != g) pp = &(*pp)->gen_next;
    *pp = g->gen_next;
    g->refs--;
    pthread_cond_broadcast(&g->cv);
  }
  pthread_mutex_unlock(&w->mu);

  while (g->joined < w->nranks && !g->aborted && mpg__now() < deadline)
    timed_wait(&g->cv, &g->mu, deadline);
  if (g->joined < w->nranks || g->aborted) {
    mpg_status st = g->aborted ? g->aborted : MPG_ERR_TIMEOUT;
    int joined = g->joined;
    char am[sizeof g->abort_msg];
    snprintf(am, sizeof am, "%s", g->abort_msg);
    /* Fail the other ranks of this generation now rather than at their own
     * deadlines. */
    if (!g->aborted) group_abort_locked(g, a->rank, MPG_ERR_TIMEOUT);
    group_unref_unlock(g);
    free(cm);
    if (joined == w->nranks)
      return mpg__fail(st, "thread backend: rank %d joining the world: %s", a->rank, am);
    /* Name the ranks that never came (the world lock orders before g's). */
    char missing[200] = "";
    size_t len = 0;
    int shown = 0;
    pthread_mutex_lock(&w->mu);
    for (int r = 0; r < w->nranks && len < sizeof missing; r++) {
      if (w->joins[r] > gen) continue;
      if (shown == 8) {
        snprintf(missing + len, sizeof missing - len, " ...");
        break;
      }
      len += (size_t)snprintf(missing + len, sizeof missing - len, " %d", r);
      shown++;
    }
    pthread_mutex_unlock(&w->mu);
    return mpg__fail(st,
                     "thread backend: rank %d gave up on the world after %.3g s: %d of "
                     "%d ranks joined; missing ranks:%s",
                     a->rank, timeout, joined, w->nranks, shown ? missing : " (late)");
  }
  pthread_mutex_unlock(&g->mu);
  cm->g = g;
  cm->pos = a->rank;
  cm->rank = a->rank;
  cm->timeout_s = timeout;
  mpg__log(2, "thread: rank %d joined %s of %d ranks", a->rank, g->name, w->nranks);
  *out = cm;
  return MPG_OK;
}

/* ------------------------------------------------------------------------ */
/* mpg_thread_run                                                            */
/* ------------------------------------------------------------------------ */

static void *rank_thread(void *p) {
  rank_slot *s = p;
  mpg_thread_world *w = s->world;
  pthread_mutex_lock(&w->mu);
  while (!w->go) pthread_cond_wait(&w->cv, &w->mu);
  int cancelled = w->cancelled;
  pthread_mutex_unlock(&w->mu);
  mpg_status st;
  if (cancelled) {
    st = mpg__fail(MPG_ERR_BACKEND,
                   "mpg_thread_run: rank %d did not run: not every rank's thread "
                   "could be started", s->rank);
  } else {
    mpg_init_opts opts = MPG_INIT_OPTS_INIT;
    opts.backend = MPG_BACKEND_THREAD;
    opts.rank = s->rank;
    opts.world_size = w->nranks;
    opts.local_rank = s->rank;
    opts.local_world_size = w->nranks;
    opts.timeout_s = w->timeout_s;
    opts.thread_world = w;
    mpg__clear_error();
    st = w->main(&opts, w->arg);
  }
  s->status = st;
  if (st != MPG_OK) {
    /* The error buffer is thread-local: keep this thread's message. */
    const char *e = mpg_last_error();
    size_t n = strlen(e);
    s->msg = malloc(n + 1);
    if (s->msg) memcpy(s->msg, e, n + 1);
    pthread_mutex_lock(&w->mu);
    if (w->first_failed < 0) w->first_failed = s->rank;
    pthread_mutex_unlock(&w->mu);
  }
  return NULL;
}

static void world_free(mpg_thread_world *w) {
  /* Generations some rank never joined: drop the world's reference. */
  for (tgroup *g = w->gens, *next; g; g = next) {
    next = g->gen_next;
    pthread_mutex_lock(&g->mu);
    group_unref_unlock(g);
  }
  if (w->slots)
    for (int r = 0; r < w->nranks; r++) free(w->slots[r].msg);
  pthread_cond_destroy(&w->cv);
  pthread_mutex_destroy(&w->mu);
  free(w->slots);
  free(w->joins);
  free(w);
}

mpg_status mpg_thread_run(int nranks, double timeout_s, mpg_rank_main main,
                          void *arg, mpg_status *statuses) {
  if (nranks < 1 || nranks > MAX_RANKS)
    return mpg__fail(MPG_ERR_INVALID, "mpg_thread_run: nranks is %d, expected 1..%d",
                     nranks, MAX_RANKS);
  if (!(timeout_s > 0))
    return mpg__fail(MPG_ERR_INVALID, "mpg_thread_run: timeout_s is %g, expected > 0",
                     timeout_s);
  if (!main) return mpg__fail(MPG_ERR_INVALID, "mpg_thread_run: main is NULL");

  mpg_thread_world *w = calloc(1, sizeof *w);
  if (!w) return mpg__fail(MPG_ERR_NOMEM, "mpg_thread_run: out of memory");
  w->nranks = nranks;
  w->timeout_s = timeout_s;
  w->main = main;
  w->arg = arg;
  w->first_failed = -1;
  w->joins = calloc((size_t)nranks, sizeof *w->joins);
  w->slots = calloc((size_t)nranks, sizeof *w->slots);
  if (!w->joins || !w->slots || pthread_mutex_init(&w->mu, NULL)) {
    free(w->joins);
    free(w->slots);
    free(w);
    return mpg__fail(MPG_ERR_NOMEM, "mpg_thread_run: out of memory for %d ranks", nranks);
  }
  if (pthread_cond_init(&w->cv, NULL)) {
    pthread_mutex_destroy(&w->mu);
    free(w->joins);
    free(w->slots);
    free(w);
    return mpg__fail(MPG_ERR_BACKEND, "mpg_thread_run: pthread_cond_init failed");
  }

  pthread_attr_t attr;
  int have_attr = pthread_attr_init(&attr) == 0;
  if (have_attr) {
    size_t stack = STACK_SIZE;
#ifdef PTHREAD_STACK_MIN
    if (stack < (size_t)PTHREAD_STACK_MIN) stack = (size_t)PTHREAD_STACK_MIN;
#endif
    (void)pthread_attr_setstacksize(&attr, stack);
  }
  for (int r = 0; r < nranks; r++) {
    w->slots[r].rank = r;
    w->slots[r].world = w;
    w->slots[r].status = MPG_ERR_BACKEND; /* until its thread says otherwise */
  }
  int started = 0, err = 0;
  for (int r = 0; r < nranks; r++) {
    rank_slot *s = &w->slots[r];
    err = pthread_create(&s->thread, have_attr ? &attr : NULL, rank_thread, s);
    if (err) break;
    s->started = 1;
    started++;
  }
  if (have_attr) pthread_attr_destroy(&attr);
  pthread_mutex_lock(&w->mu);
  w->cancelled = started < nranks;
  w->go = 1;
  pthread_cond_broadcast(&w->cv);
  pthread_mutex_unlock(&w->mu);
  for (int r = 0; r < started; r++) pthread_join(w->slots[r].thread, NULL);

  mpg_status result = MPG_OK;
  if (started < nranks) {
    result = mpg__fail(err == EAGAIN ? MPG_ERR_NOMEM : MPG_ERR_BACKEND,
                       "mpg_thread_run: could not start the thread of rank %d of %d: %s",
                       started, nranks, strerror(err));
  } else if (w->first_failed >= 0) {
    rank_slot *s = &w->slots[w->first_failed];
    result = s->msg ? mpg__fail(s->status, "%s", s->msg)
                    : mpg__fail(s->status, "rank %d failed (%s)", s->rank,
                                mpg_status_name(s->status));
  } else {
    mpg__clear_error();
  }
  if (statuses)
    for (int r = 0; r < nranks; r++) statuses[r] = w->slots[r].status;
  world_free(w);
  return result;
}

const struct mpg__backend_ops mpg__backend_thread = {
    .name = "thread",
    .world_init = t_world_init,
    .split = t_split,
    .post = t_post,
    .test = t_test,
    .wait = t_wait,
    .req_free = t_req_free,
    .abort_comm = t_abort,
    .destroy = t_destroy,
    .local = NULL,
};
