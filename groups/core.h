/* The groups core: the types every file of the groups layer shares
 * (struct mpg_ctx, mpg_group, mpg_work, ...) and the calls between its
 * files, each declared with the file that defines it.  A header of its
 * own, named for no file, so that including it ties a file to no
 * higher-level file (docs/groups.md, "Layers").  The layers, top down,
 * calls going one way:
 *  - context: ctx.c (launch, placement, binding, memory, teardown), with
 *    agree.c (the job agreement) and staging.c;
 *  - public calls above the group: alltoall.c (on p2p.c, coll.c and
 *    shm/a2a.c), p2p.c and coll_f32.c (on coll.c), shm_group.c (sync's
 *    segments: the group's setup callbacks handed to shm/);
 *  - transports over the group: groups/shm/ (the segment and the
 *    all-to-all channel), posting through coll.c like any collective;
 *  - group: coll.c (collectives, work handles, claiming, failures),
 *    group.c (making groups, labels), order.c and trace.c / trace_dump.c
 *    (the issue-order record and the flight recorder, called by both);
 *  - setup.c (the context's transports: attach, detach, abort, teardown;
 *    setup collectives) and issuer.c, which every layer may call;
 *  - transport table (transport.h) and backends (backend.h; thread/,
 *    mpi/, nccl/): they only move data.
 * This layer checks arguments, turns size-1 groups into local copies,
 * applies the context's timeout and aborts the whole context, every
 * transport of it, when a peer never arrives. */
#ifndef MPG_GROUPS_CORE_H
#define MPG_GROUPS_CORE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "backend.h"
#include "trace_types.h"
#include "groups_internal.h"
#include "mesh_internal.h"

#define MAX_SELECT 64

struct mpg_group {
  mpg_ctx *ctx;
  int dimset;       /* named dim set, or -1 for groups made by dims/select */
  const char *name; /* the mesh's name, or extra_name */
  unsigned mask;    /* mesh dims of the group */
  int index, position, size;
  int nselect;      /* > 0: only these positions of the mask group */
  int select[MAX_SELECT];
  int pstride;      /* > 0: a partial group (mpg_ctx_group_partial): its
                       position p is position pbase + p * pstride of the
                       mask group */
  int pbase;
  int created;      /* communicator made (or not needed) */
  int member;       /* extra groups: this rank belongs to it */
  mpg__comm *comm;  /* NULL for size-1 groups; the world comm for "world"
                       (its backend communicator, also in `transports`
                       through comm_link unless it is the world's) */
  mpg__transport *transports; /* every transport of the group, newest
                       first (transport.h): its backend communicator, its
                       all-to-all channel, sync's shared-memory segments;
                       under ctx->transport_lock (setup.c) */
  mpg__transport comm_link;   /* `comm` in that list */
  char extra_name[128];
  struct mpg_group *next; /* extra groups of the context */
  mpg__group_trace trace; /* the flight recorder's numbering of the
                       group (trace_types.h) */
  _Atomic(struct mpg__a2a *) a2a; /* shm/a2a.c: its all-to-alls'
                       shared-memory channel, made at the first one, a
                       transport in `transports` (this is the issuing
                       thread's way to it; the list aborts and destroys
                       it) */
  int a2a_off;      /* 1: its all-to-alls go through the backend */
  atomic_int busy;  /* 1 while a call issues on the group (coll.c's
                       mpg__group_claim): a second thread's call fails
                       with MPG_ERR_STATE instead of running beside it.
                       0 from calloc. */
};

struct mpg_ctx {
  int syncs; /* live mpg_sync on this context (mpg__ctx_sync_count) */
  const mpg_mesh *mesh;
  const struct mpg__backend_ops *ops;
  mpg_backend_kind kind;
  int rank, world, local_rank;
  int launcher_rank, num_nodes;
  mpg_binding binding;
  mpg__comm *launch_comm; /* the launcher-ordered world, kept when placement
                             renumbered the ranks (freed last) */
  double timeout_s;
  int lazy;
  atomic_int aborted; /* MPG_OK while healthy, else the reason; atomic so
                        that a watchdog thread may call mpg_ctx_abort */
  atomic_long issuer; /* nccl: the OS thread id (gettid) of the thread that
                         issues (issuer.c's mpg__ctx_check_issuer); 0 until the
                         first issuing call; 0 from calloc */
  mpg__comm *world_comm;
  /* The context's transports (transport.h): the world's communicators
   * (world_link, launch_link), and the lock that guards every list of
   * transports of the context and the extra groups' list (setup.c). */
  pthread_mutex_t transport_lock;
  mpg__transport *transports;
  mpg__transport world_link, launch_link;
  char host_id[MPG_HOST_ID_MAX]; /* opts.host_id, "" when not given */
  long setup_collectives;
  int nsets;
  mpg_group groups[MPG__MAX_DIMSETS];
  mpg_group *extra; /* groups made by mpg_ctx_group_dims / _select */
  struct mpg__order *order; /* order.c: the issue-order record, NULL when off */
  mpg__settings settings;   /* the MESHPG_* variables, read once at create */
  struct mpg__staging *staging; /* staging.c: pinned host blocks, kept until
                                   mpg_ctx_destroy (nccl) */
  struct mpg__trace *trace; /* trace.c: the flight recorder, NULL when off */
  uint64_t job;             /* random, then equal on every rank (agree.c) */
};

/* The world rank at `position` (0 .. size-1) of g: mpg_group_member's
 * answer, inline so that trace.c need not call group.c. */
static inline int mpg__group_world_rank(const mpg_group *g, int position) {
  int base = g->nselect ? g->select[position]
             : g->pstride ? g->pbase + position * g->pstride
                          : position;
  return mpg__mesh_mask_member(g->ctx->mesh, g->mask, g->ctx->rank, base);
}

/* staging.c: free the context's pinned host blocks (mpg_ctx_destroy). */
void mpg__ctx_staging_release(mpg_ctx *ctx);

struct mpg_work {
  mpg_group *group;
  mpg__op_id op;      /* the operation, for the messages (kind < 0: several,
                         a batch or an all-to-all) */
  /* The table that posted the requests, whose test / wait / req_free
   * complete them: the context's backend, or the shared-memory table of
   * one of the group's segments (groups/shm/, posted through
   * mpg__group_run_on): one mechanism for both. */
  const struct mpg__transport_ops *ops;
  mpg__req *req;      /* the operation, when reqs is NULL */
  mpg__req **reqs;    /* or several (an mpg_p2p_batch posted one by one):
                         nreq requests, this array owned by the work */
  int nreq;
  int ndone;          /* requests mpg_work_test saw finish, in order */
  double deadline;
  mpg_status status; /* a failure seen by mpg_work_test */
  mpg__trace_mark trace; /* the operations' flight-recorder slots, ended
                            when the work completes */
};

/* coll.c: before an operation `fn` on g: MPG_ERR_ABORTED when the context
 * was aborted; else g's communicator, created now if lazy (a failure then
 * goes through mpg__group_on_failure). */
mpg_status mpg__group_ready(mpg_group *g, const char *fn);
/* The same, naming the operation op in a message. */
mpg_status mpg__group_ready_op(mpg_group *g, const char *fn, const mpg__op_id *op);

/* coll.c: claim g for the public call `fn` of this thread (one thread
 * uses a group at a time): MPG_OK, or MPG_ERR_STATE, nothing posted, while
 * another call holds it or (nccl) when this thread is not the context's
 * issuing thread (mpg__ctx_check_issuer); released by mpg__group_release
 * when the call returns.  coll.c, p2p.c and alltoall.c claim for their
 * public calls (mpg__group_run_on too). */
mpg_status mpg__group_claim(mpg_group *g, const char *fn);
void mpg__group_release(mpg_group *g);

/* issuer.c: on nccl, every call that issues on the context (collectives,
 * point to point, all-to-all, host collectives, mpg_ctx_check_order) comes
 * from one thread, the first that issued one: MPG_OK for that thread (and
 * on thread and mpi), else MPG_ERR_STATE, naming both threads, nothing
 * posted.  `fn` and the group's name (NULL: none) start the message.
 * mpg__group_claim checks it first. */
mpg_status mpg__ctx_check_issuer(mpg_ctx *ctx, const char *fn, const char *group);

/* coll.c: after a failure `st` of the call `fn` on g: any failure but an
 * argument error (MPG_ERR_INVALID, _RANGE) or a refusal (MPG_ERR_STATE)
 * aborts the whole context (the peers may have posted what this rank
 * could not) and names the group in the message;
 * returns st. */
mpg_status mpg__group_on_failure(mpg_group *g, const char *fn, mpg_status st);

/* The names a message gives (issue 46, item 4), those of the flight
 * recorder's report.  mpg__group_label: g's label, "tp[1]" (a mesh dim
 * set and the group's index), "world", or an extra group's given name
 * (inline, so that every layer may name a group without calling
 * group.c).  group.c's mpg__group_op_label: an operation's,
 * "all_reduce #8 on tp[1]", "send #3 to world rank 2 on pp[0]" (op->gseq
 * 0: no number), op NULL or op->kind < 0: the label.  Formatted only when
 * a message needs them. */
static inline void mpg__group_label(const mpg_group *g, char *buf, size_t n) {
  if (g->dimset < 0 || strcmp(g->name, "world") == 0)
    snprintf(buf, n, "%s", g->name);
  else
    snprintf(buf, n, "%s[%d]", g->name, g->index);
}
void mpg__group_op_label(const mpg_group *g, const mpg__op_id *op, char *buf, size_t n);
/* g's label in a buffer that lives to the end of the enclosing block, for
 * a message's arguments: mpg__fail(..., "%s on %s", fn, MPG__GROUP_LABEL(g)). */
static inline const char *mpg__group_label_in(const mpg_group *g, char *buf, size_t n) {
  mpg__group_label(g, buf, n);
  return buf;
}
#define MPG__GROUP_LABEL(g) mpg__group_label_in((g), (char[160]){0}, 160)

/* coll.c: run one collective on g as the public calls do (argument
 * checks, size-1 groups, the timeout, abort on failure); with `work`, an
 * asynchronous handle.  For internal variants of the public calls
 * (coll_f32.c: f32 accumulation of f16/bf16). */
mpg_status mpg__group_run(mpg_group *g, const mpg__coll *c, mpg_work **work);

/* coll.c: the same on another communicator of g's members that `ops`
 * serves (groups/shm/: a node's shared-memory segment, with its table):
 * claimed for `fn` (its name in every message), the arguments checked,
 * g ready, the issue order noted, posted with ops->post on comm, and
 * completed (here without work, or by mpg_work_test / mpg_work_wait
 * through ops, as for any collective); a failure goes through
 * mpg__group_on_failure.  g has two or more members. */
mpg_status mpg__group_run_on(mpg_group *g, const struct mpg__transport_ops *ops,
                             mpg__comm *comm, const mpg__coll *c, mpg_work **work,
                             const char *fn);

/* One all-to-all call (alltoall.c): equal blocks (v == 0: count each,
 * displacements j x count) or per peer (v == 1: the four arrays, in
 * elements). */
typedef struct mpg__a2a_call {
  const char *fn;
  int v;
  const void *send;
  void *recv;
  const size_t *scounts, *sdispls, *rcounts, *rdispls;
  size_t count;
  mpg_dtype dtype;
  void *stream;
} mpg__a2a_call;
static inline size_t mpg__a2a_scount(const mpg__a2a_call *a, int p) {
  return a->v ? a->scounts[p] : a->count;
}
static inline size_t mpg__a2a_sdispl(const mpg__a2a_call *a, int p) {
  return a->v ? a->sdispls[p] : (size_t)p * a->count;
}
static inline size_t mpg__a2a_rcount(const mpg__a2a_call *a, int p) {
  return a->v ? a->rcounts[p] : a->count;
}
static inline size_t mpg__a2a_rdispl(const mpg__a2a_call *a, int p) {
  return a->v ? a->rdispls[p] : (size_t)p * a->count;
}

/* shm/a2a.c: run the checked call a (this member's own block too) on g,
 * ready, two or more members, through the group's
 * shared-memory channel (made collectively at the group's first
 * all-to-all: one host, a CPU backend, MESHPG_SHM not 0, and for
 * processes cross memory attach allowed; see a2a.c): one copy per block,
 * the counts through the segment.  *taken 0 when the group's all-to-alls
 * go through the backend (decided alike on every member).  With work, an
 * asynchronous handle; failures as the collectives' (a pair whose counts
 * disagree: MPG_ERR_INVALID on both, the other blocks received). */
typedef struct mpg__a2a mpg__a2a;
/* Decide, at the group's first all-to-all (fn), whether it gets a
 * channel, and make it: collective over the group (setup's all-gathers,
 * g's host all-gathers: g must not be claimed).  Nothing when decided
 * before, for one member, or off the CPU backends.  Errors: the creation's, alike on every member
 * (MPG_ERR_ENV from the segment turns the channel off instead, with a log
 * line). */
mpg_status mpg__a2a_shm_prepare(mpg_group *g, const mpg__transport_setup *setup,
                                 const char *fn);
mpg_status mpg__a2a_shm_run(mpg_group *g, const mpg__a2a_call *a, mpg_work **work,
                            int *taken);
/* coll.c: split g's communicator (collective over g's members, bounded by
 * the timeout): color >= 0 joins that colour's communicator, ordered by
 * key (ties by position in g); color < 0 joins none (*out NULL).  The
 * communicator belongs to the caller (ctx->ops->destroy), which must make
 * it on every member at the same point of g's operations.  For groups/shm/
 * (the members at one local position of every node). */
mpg_status mpg__group_split(mpg_group *g, int color, int key, mpg__comm **out);

/* coll.c: the setup callbacks a transport of g gets (transport.h): g's
 * host all-gather (mpg__group_host_all_gather) and its split
 * (mpg__group_split, the result a communicator of the backend's table,
 * split_ops), with g as their arg.  For groups/shm/, through
 * shm_group.c and alltoall.c. */
mpg__transport_setup mpg__group_transport_setup(mpg_group *g);

/* coll.c: wait for reqs[0..n) (posted through ops) until `deadline`, then free them all.  The
 * first failure is returned (with its message); a timeout or abort of any
 * aborts the context (mpg__group_on_failure) before a pending request is
 * freed.  `failed` is a failure seen before (by mpg_work_test, of
 * reqs[skip]): it is returned and reqs[skip] is not waited for again. */
mpg_status mpg__group_finish(mpg_group *g, const struct mpg__transport_ops *ops,
                             mpg__req **reqs, int n, double deadline, const char *fn,
                             mpg_status failed, int skip);

/* p2p.c: post the sends and receives list[0..n) (kinds MPG__SEND and
 * MPG__RECV, already checked; one stream) on g, which is ready
 * (mpg__group_ready) and has two or more members, as mpg_p2p_batch does:
 * through the backend's post_batch as one group, or the receives then the
 * sends with post (the list is posted in its order: put the receives
 * first).  With work NULL, waits for all of them; otherwise hands out one
 * work handle.  Timeouts and aborts go through mpg__group_on_failure, with
 * `fn` ("mpg_all_to_all") in the messages.  For alltoall.c. */
mpg_status mpg__group_post_p2p(mpg_group *g, const mpg__coll *list, int n, const char *fn,
                               mpg_work **work);

/* setup.c: run a setup collective on host buffers over `comm` (of
 * `members` ranks) to completion within the timeout (the caller counts it
 * in setup_collectives if it is one).  A backend whose collectives need its own memory
 * (NCCL: device memory) gets the data staged through mem_alloc'ed
 * buffers.  A failure of the operation aborts the context. */
mpg_status mpg__ctx_setup_coll(mpg_ctx *ctx, mpg__comm *comm, int members,
                               const mpg__coll *c);

/* agree.c: check, collectively over the world, that every rank built the
 * same job: mesh, flattened dims, expert grid, backend, library, the
 * options and variables that must match, and that no rank's variables
 * broke the rule (set->status).  MPG_ERR_STATE (MPG_ERR_ENV for a
 * variable) on every rank, with the same message, when they differ. */
mpg_status mpg__ctx_agree(mpg_ctx *ctx, const mpg_init_opts *opts, const mpg__settings *set);

/* setup.c: the transports of the context (transport.h's rules).
 * _attach: put t (ops and comm set) in g's list (mpg__ctx_attach: the
 * context's own, the world's communicators); aborted at once when the
 * context was aborted.  _detach: take it out (its owner then destroys
 * it).  mpg__ctx_add_group: put an extra group in ctx->extra.
 * All under the context's transport lock; any thread. */
void mpg__group_attach(mpg_group *g, mpg__transport *t);
void mpg__group_detach(mpg_group *g, mpg__transport *t);
void mpg__ctx_attach(mpg_ctx *ctx, mpg__transport *t);
void mpg__ctx_detach(mpg_ctx *ctx, mpg__transport *t);
void mpg__ctx_add_group(mpg_ctx *ctx, mpg_group *g);
/* setup.c: abort every transport of g with `reason` (any thread, any
 * state; the context itself stays as it is), for a group that is rebuilt
 * or torn down alone.  mpg__group_teardown: detach and destroy each of
 * its transports, newest first (after an abort, or when no operation is
 * in flight); the first error is returned.  mpg__ctx_teardown: the same
 * for the context's own list. */
void mpg__group_abort(mpg_group *g, mpg_status reason);
mpg_status mpg__group_teardown(mpg_group *g);
mpg_status mpg__ctx_teardown(mpg_ctx *ctx);
/* setup.c: abort the context (once; later calls do nothing) with
 * `reason`, MPG_ERR_TIMEOUT or MPG_ERR_ABORTED: every transport of every
 * group and of the context, the same way for every kind (setup.c's
 * abort_lists: tables that abort one at a time first, then each table's
 * abort_comms over all of its transports at once).  Any thread. */
void mpg__ctx_abort_all(mpg_ctx *ctx, mpg_status reason);

/* group.c: create g's communicator if it has none yet (collective over the
 * world for groups of two or more). */
mpg_status mpg__group_create(mpg_ctx *ctx, mpg_group *g);

/* order.c: the issue-order checker (MESHPG_CHECK_ORDER; see order.c for
 * what is recorded and how the ranks compare).  Calls nothing of this
 * layer but setup.c and reduce.c's helpers, so every part may use it.
 * _create sets ctx->order (NULL when the checker is off; MPG_ERR_ENV for a
 * bad value).  Each _note records one call, issued on g, as it is issued:
 * every collective run() posts (not send / recv) and every split that
 * creates a group; groups of mpg_ctx_group_select are never recorded.
 * Point to point (send, recv, mpg_p2p_batch) is not recorded (see
 * order.c).  _destroy frees the record without a check (see order.c). */
typedef struct mpg__order mpg__order;
mpg_status mpg__order_create(mpg_ctx *ctx);
void mpg__order_note(mpg_group *g, const mpg__coll *c);
void mpg__order_note_split(mpg_group *g);
/* An all-to-all on g (alltoall.c), as a collective of the group: kind
 * "all_to_all" with its count, or "all_to_all_v" (v = 1) with dtype only,
 * since its counts differ between members by nature. */
void mpg__order_note_all_to_all(mpg_group *g, int v, size_t count, mpg_dtype dtype);
void mpg__order_destroy(mpg_ctx *ctx);

#endif
