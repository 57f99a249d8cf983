/* The thread backend's internal header: the structs its files share and
 * their mpg__thread_* functions.  Simulated ranks are threads of one
 * process, and every collective runs through shared memory under a mutex;
 * the backend fills `const struct mpg__backend_ops mpg__backend_thread`
 * (groups/backend.h).  One job per file, lowest layer first; a file calls
 * only files listed above it (no two files call each other):
 *
 *   group.c   the state one communicator's members share (struct tgroup):
 *             creation, reference counts, abort, reduction temporaries;
 *             and the helpers every file uses (waits, error text).
 *   split.c   the body of a split: the child groups its last arrival makes.
 *   coll.c    collectives: matching the members' calls into one operation
 *             and performing it (a split's through split.c).
 *   p2p.c     send/recv through per-member mailboxes.
 *   req.c     requests: post, test, wait, free; timeouts and their detail.
 *   world.c   communicator lifecycle: joining the world (its generations),
 *             split (a collective, waited for like a request), abort,
 *             destroy; the function table.
 *   run.c     mpg_thread_run: the thread world, its ranks' threads, their
 *             start gate and exit statuses.
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
 * Failures
 *  Waits are bounded by their deadline (pthread_cond_timedwait).  the abort op
 *  marks the group aborted: every waiter wakes and fails with the reason,
 *  later calls fail with MPG_ERR_ABORTED.  A request freed while pending is
 *  detached from its operation, which can then only fail.
 *
 * "g->mu held" in a comment means the caller holds the group's mutex. */
#ifndef MPG_GROUPS_THREAD_INTERNAL_H
#define MPG_GROUPS_THREAD_INTERNAL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "backend.h"

#define MPG_THREAD_KIND_SPLIT 100 /* internal kind next to mpg__coll_kind */
#define MPG_THREAD_NAME_LEN 64
#define MPG_THREAD_MSG_LEN 320

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
  size_t nmsgs, nbytes;        /* what waits in head..tail (back-pressure) */
} tinbox;

typedef struct top top;

typedef struct tgroup {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int refs;            /* handles + requests (+1 while a world lists it) */
  int size;
  int *ranks;          /* world rank of each position */
  char name[MPG_THREAD_NAME_LEN]; /* "world", "world/s0c3", ... (logs only;
                                     messages give the handle's label) */
  mpg_status aborted;  /* MPG_OK while healthy, else the reason */
  char abort_msg[MPG_THREAD_MSG_LEN]; /* who aborted, and who had not arrived */
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

/* One collective in flight: the n-th call of every member (coll.c). */
struct top {
  top *next;
  uint64_t seq;
  int kind;
  int arrived;
  int abandoned;       /* members whose request was freed before the end */
  int ref_pos;         /* the first arrival, which the others must match */
  mpg__coll ref;
  int bad;
  char bad_msg[MPG_THREAD_MSG_LEN];
  mpg__req *reqs[];    /* per position; NULL before arrival or if freed */
};

struct mpg__comm {
  tgroup *g;
  int pos;
  int rank;            /* world rank */
  char label[MPG_THREAD_NAME_LEN]; /* the mesh's name of the group ("tp[1]",
                          set_label), for messages; "world" for the world */
  uint64_t seq;        /* next collective of this member */
  double timeout_s;
  size_t inbox_msgs, inbox_bytes; /* MESHPG_THREAD_INBOX_* (p2p.c), from
                                     world_init's settings; splits inherit */
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
  char msg[MPG_THREAD_MSG_LEN];
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

/* group.c: groups.  A new group has no references; NULL when out of
 * memory.  Free only when nobody references it any more. */
tgroup *mpg__thread_group_new(int size, const char *name);
void mpg__thread_group_free(tgroup *g);
/* Drop one reference, with g->mu held; unlocks; frees g after the last. */
void mpg__thread_group_unref_unlock(tgroup *g);
/* Mark g aborted (once, by `by_rank`, whose handle calls g `label`) and
 * wake every waiter; g->mu held. */
void mpg__thread_group_abort_locked(tgroup *g, int by_rank, mpg_status reason,
                                    const char *label);
/* Temporary `which` (0 or 1) of at least `bytes`, owned by the group and
 * reused by later operations (g->mu held).  NULL when out of memory. */
void *mpg__thread_group_scratch(tgroup *g, int which, size_t bytes);

/* group.c: helpers.  "split" or mpg__kind_name. */
const char *mpg__thread_kind_name(int kind);
/* "all_reduce (count 5, f32, sum)" (no number: the generic layer numbers
 * the operations, as the flight recorder does). */
void mpg__thread_describe(char *buf, size_t n, int kind, const mpg__coll *c);
/* Wait on cv until signalled or until `deadline` (mpg__now() seconds). */
void mpg__thread_timed_wait(pthread_cond_t *cv, pthread_mutex_t *mu, double deadline);
/* Record "thread backend: what" for r (the generic layer names the
 * operation, its group and this member's position and world rank). */
mpg_status mpg__thread_fail_req(const mpg__req *r, mpg_status st, const char *what);
/* The failure of a call `kind` (coll) by cm on an aborted group. */
mpg_status mpg__thread_fail_aborted(const mpg__comm *cm, int kind, const mpg__coll *c,
                                    const char *abort_msg);

/* split.c: the last arrival of a split makes the child groups and sets
 * every request's child and child_pos (g->mu held). */
mpg_status mpg__thread_perform_split(tgroup *g, top *op);

/* coll.c: deposit `req` (already filled: kind, coll, split colour/key) as
 * this member's next collective; the last arrival performs it.  Takes
 * g->mu. */
mpg_status mpg__thread_coll_arrive(mpg__comm *cm, mpg__req *req);

/* p2p.c: start a send or a receive.  Takes g->mu. */
mpg_status mpg__thread_p2p_post(mpg__comm *cm, mpg__req *req);
/* Remove a pending receive from its inbox (g->mu held). */
void mpg__thread_unlink_recv(tgroup *g, mpg__req *req);

/* req.c */
/* With g->mu held and the request pending and not done: what it lacks. */
void mpg__thread_pending_detail(const mpg__req *r, char *buf, size_t n);
/* The outcome of a finished (or aborted) request: its status and, when it
 * failed, the message to record.  g->mu held; returns -1 if still pending. */
int mpg__thread_outcome_locked(mpg__req *r, mpg_status *st, char *msg, size_t n);
/* Detach a pending request from its collective, which can then only fail
 * (g->mu held). */
void mpg__thread_detach_locked(mpg__req *r);
mpg_status mpg__thread_post(mpg__comm *cm, const mpg__coll *coll, mpg__req **out);
mpg_status mpg__thread_test(mpg__req *req, int *done);
mpg_status mpg__thread_wait(mpg__req *req, double deadline);
void mpg__thread_req_free(mpg__req *req);

#endif
