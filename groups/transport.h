/* The transport table: every way a group moves bytes, behind one small
 * table of operations (docs/groups.md, "Layers").  A transport is a
 * communicator (mpg__comm, defined by whoever serves it) and the table
 * that serves it:
 *  - a backend's communicators (thread, mpi, nccl: the table is the first
 *    part of struct mpg__backend_ops, backend.h, reached as
 *    &ops->transport);
 *  - a node's shared-memory reduction segment (groups/shm/engine.c);
 *  - a group's shared-memory all-to-all channel (groups/shm/a2a.c).
 * A group holds its transports in one list (struct mpg_group's
 * `transports`, groups/core.h); the context holds the world's (and the
 * launcher-ordered world's) in its own.  The context aborts and destroys
 * every transport of every list the same way (groups/setup.c:
 * mpg__transports_abort, mpg__group_abort, mpg__group_teardown), with no
 * case per kind.
 *
 * The rules:
 *  - post, test, wait, req_free: the thread that issues on the group (the
 *    group claimed, coll.c), and mpg_work_test / _wait through the table
 *    that posted the work's requests (mpg_work keeps it).
 *  - abort_comm, abort_comms: any thread, any state (a watchdog's
 *    mpg_ctx_abort), never blocking on peers; a transport may be aborted
 *    more than once, before, during or after any operation.  Every waiter
 *    of the communicator wakes and fails, and later calls fail with
 *    MPG_ERR_ABORTED (MPG_ERR_TIMEOUT when the reason says so).
 *  - destroy: once, after the transport left its list (detached), by its
 *    owner: never blocks on peers after an abort.
 *  - attach and detach (setup.c's mpg__group_attach / _detach) take the
 *    context's transport lock, which the abort of the context holds while
 *    it walks the lists: a transport attached to an aborted context is
 *    aborted at once, and a detached one is never reached again.
 *  - setup: a transport gets the collectives it needs to come up (an
 *    all-gather over the group, a split of the group's communicator) from
 *    the group through struct mpg__transport_setup, never by calling up
 *    into the group's code. */
#ifndef MPG_GROUPS_TRANSPORT_H
#define MPG_GROUPS_TRANSPORT_H

#include "internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A communicator (one per group this rank belongs to, or a segment, or a
 * channel) and one posted operation: each table defines both. */
typedef struct mpg__comm mpg__comm;
typedef struct mpg__req mpg__req;

typedef enum mpg__coll_kind {
  MPG__ALL_REDUCE,
  MPG__BROADCAST,
  MPG__ALL_GATHER,
  MPG__REDUCE_SCATTER,
  MPG__BARRIER,
  MPG__SEND,
  MPG__RECV
} mpg__coll_kind;

/* One collective call, already validated by the generic layer. */
typedef struct mpg__coll {
  mpg__coll_kind kind;
  const void *send; /* all_reduce, all_gather, reduce_scatter, send */
  void *recv;       /* all_reduce, all_gather, reduce_scatter, recv;
                       broadcast: the buffer (send == recv) */
  size_t count;     /* all_reduce/broadcast/send/recv: elements of the buffer;
                       all_gather: elements each member sends;
                       reduce_scatter: elements each member receives */
  mpg_dtype dtype;
  mpg_op op;        /* all_reduce, reduce_scatter; MPG__OP_PREMUL_SUM uses scale */
  double scale;
  int root;         /* broadcast: position of the root */
  int peer;         /* send/recv: position of the peer */
  void *stream;     /* nccl: cudaStream_t */
  int acc_f32;      /* all_reduce, reduce_scatter of f16/bf16: accumulate in
                       f32 (the nccl backend widens, reduces in f32 and
                       narrows; the CPU backends always do); 0 elsewhere */
} mpg__coll;

/* The table's fields, written once: struct mpg__transport_ops holds them,
 * and struct mpg__backend_ops begins with them (backend.h), so that a
 * backend's table is a transport table too.
 *
 * name: for messages.
 * post: start one operation.  Never blocks past the timeout.  A receive's
 *   post never waits for its peer; a send's post may wait (bounded by the
 *   timeout) only until the receiver has posted the matching receive.
 * test: *done = 1 when finished; returns the operation's error, if any.
 * test_keeps_time: 1: test itself returns MPG_ERR_TIMEOUT once a pending
 *   operation is past its timeout, counted by the transport's own clock
 *   (nccl: from when the GPU reaches the operation, groups/nccl/ops.c),
 *   and wait may run past the host's deadline; mpg_work_test then never
 *   calls wait.  0: mpg_work_test, past the host's deadline, calls wait,
 *   which returns at once with what the transport knows of the missing
 *   members.
 * wait: until finished or until `deadline` (mpg__now() seconds):
 *   MPG_ERR_TIMEOUT then, leaving the request pending (the caller aborts
 *   the communicator and frees the request).  nccl reads `deadline` as a
 *   timeout (deadline - the post) counted from when the GPU reaches the
 *   operation (groups/nccl/ops.c), so its wait may run past `deadline`.
 * req_free: release a request (finished, failed or abandoned).
 * req_times: optional (NULL: not known).  When the operation of a finished
 *   request was seen to start and end on the device, in mpg__now()
 *   seconds (0: not seen), for the flight recorder (nccl: its start and
 *   end events, groups/nccl/ops.c).
 * abort_comm: wake every waiter of this communicator and fail later calls
 *   with MPG_ERR_ABORTED (or MPG_ERR_TIMEOUT if reason says so).  Never
 *   blocks; any thread, any state.
 * abort_comms: optional (NULL: abort_comm on each).  Abort n
 *   communicators of this table together, as one step: on nccl, aborting
 *   them one after another could block the first abort on a kernel of the
 *   second (see groups/nccl/lifecycle.c).
 * destroy: release the communicator.  Must not block on peers after an
 *   abort. */
#define MPG__TRANSPORT_OPS_FIELDS                                               \
  const char *name;                                                            \
  mpg_status (*post)(mpg__comm * comm, const mpg__coll *coll, mpg__req **req); \
  mpg_status (*test)(mpg__req * req, int *done);                               \
  int test_keeps_time;                                                         \
  mpg_status (*wait)(mpg__req * req, double deadline);                         \
  void (*req_free)(mpg__req * req);                                            \
  void (*req_times)(const mpg__req *req, double *start, double *end);          \
  void (*abort_comm)(mpg__comm * comm, mpg_status reason);                     \
  void (*abort_comms)(mpg__comm *const *comms, int n, mpg_status reason);      \
  mpg_status (*destroy)(mpg__comm * comm);

struct mpg__transport_ops {
  MPG__TRANSPORT_OPS_FIELDS
};

/* One transport in a list: its table and its communicator.  The node
 * lives in its owner (the group for its backend communicator, the
 * context for the world's, the segment, the channel); ops->destroy(comm)
 * may free it. */
typedef struct mpg__transport {
  const struct mpg__transport_ops *ops;
  mpg__comm *comm;
  struct mpg__transport *next;
} mpg__transport;

/* What a transport's setup needs of its group, filled by the group level
 * (coll.c's mpg__group_transport_setup) and passed down: an all-gather of
 * host memory over the group (count elements each, recv holds size x
 * count; blocking, within the timeout; collective over the group), and a
 * split of the group's communicator (color >= 0 joins that colour's
 * communicator, ordered by key, ties by position; color < 0: *out NULL),
 * whose result the caller owns and frees through `split_ops`. */
typedef struct mpg__transport_setup {
  void *arg;
  mpg_status (*all_gather)(void *arg, const void *send, void *recv, size_t count,
                           mpg_dtype dtype);
  mpg_status (*split)(void *arg, int color, int key, mpg__comm **out);
  const struct mpg__transport_ops *split_ops;
} mpg__transport_setup;

#ifdef __cplusplus
}
#endif
#endif
