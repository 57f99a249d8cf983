/* The flight recorder's side of the groups core (trace.c, trace_dump.c;
 * docs/trace.md): the types the rest of the groups layer holds (a group's
 * numbering, mpg__group_trace; an operation's mark and name) and the calls
 * it makes.  A header of its own, named for no file: core.h includes it,
 * and trace.c and trace_dump.c share their ring through trace_ring.h, so
 * that no include leads from the core back to the recorder's files. */
#ifndef MPG_GROUPS_TRACE_TYPES_H
#define MPG_GROUPS_TRACE_TYPES_H

#include <stdatomic.h>
#include <stdint.h>

#include "transport.h"

/* A group's numbering in the recorder (one member of struct mpg_group;
 * trace.c alone writes it).  id: 1 + the group's number in the
 * recorder's groups table, 0 until its first operation.  seq: the
 * collectives numbered on it (the recorder's GSEQ; counted recording or
 * not).  p2p: the sends to / receives from each position (2 x size),
 * from its first operation. */
typedef struct mpg__group_trace {
  int id;
  _Atomic uint64_t seq;
  _Atomic uint64_t *p2p;
} mpg__group_trace;

/* The flight recorder (trace.c, trace_dump.c; docs/trace.md).  A mark
 * names the slots of one call's operations (n of them from seq; t NULL:
 * not recorded).  _create: ctx->trace from opts.trace_entries / _dir and
 * MESHPG_TRACE_ENTRIES / _DIR (NULL when recording is off); _destroy
 * frees it.  _begin records one operation of g (kind: an mpg__coll_kind or
 * TRACE_ALL_TO_ALL[_V]; peer: the position of the peer or the broadcast's
 * root, else -1) as issued now, with the sync step and this thread's
 * bucket tag; groups of one member are not recorded.  Every collective
 * of a group of two or more members that is not muted is numbered
 * (mark.gseq), recording or not, with the counter the recorder writes as
 * GSEQ, so that messages and the report give one number (issue 46, item
 * 4); sends and receives are numbered per peer while recording.
 * _begin_batch: the sends and receives list[0..n).  _posted: the operations were handed to
 * the transport (their start off nccl).  _end: they ended with st (the
 * device times of mpg__trace_device_times, else now).  _hand: _end,
 * unless st is MPG_OK and *work was handed out (work may be NULL): then
 * the work carries the mark and mpg_work_test / _wait end it.
 * _device_times: the backend's times (mpg__now() seconds) at which the
 * GPU was seen to start and end the operations finished last on this
 * thread, for the next _end.  _fault: after a failure st of the context
 * (a timeout, an abort, a desync), write the automatic dump once when a
 * trace directory is set; keeps mpg_last_error().  Lock-free but for the
 * first operation of a group. */
typedef struct mpg__trace mpg__trace;
/* An operation as messages name it (issue 46, item 4): its kind (an
 * mpg__coll_kind; < 0: none), the peer's position (send, receive; else
 * -1) and its number on the group (mark.gseq; 0: not numbered). */
typedef struct mpg__op_id {
  int kind, peer;
  uint64_t gseq;
} mpg__op_id;
/* Kinds beyond mpg__coll_kind (the all-to-alls of alltoall.c). */
enum { TRACE_ALL_TO_ALL = 16, TRACE_ALL_TO_ALL_V = 17 };
typedef struct mpg__trace_mark {
  mpg__trace *t;
  uint64_t seq;
  int n;
  uint64_t gseq; /* _begin: the operation's number on its group (GSEQ),
                    recording or not; 0: not numbered (a muted operation, a
                    group of one member, a send / receive while recording
                    is off) */
} mpg__trace_mark;
mpg_status mpg__trace_create(mpg_ctx *ctx, const mpg_init_opts *opts);
void mpg__trace_destroy(mpg_ctx *ctx);
mpg__trace_mark mpg__trace_begin(mpg_group *g, int kind, mpg_dtype dtype, size_t count,
                                 int peer);
mpg__trace_mark mpg__trace_begin_batch(mpg_group *g, const mpg__coll *list, int n);
/* Operations this thread begins while muted (mpg__trace_mute(1) ..
 * mpg__trace_mute(-1)) are not recorded: the steps inside one recorded
 * operation (an all-to-all's first call, which makes its channel). */
void mpg__trace_mute(int delta);
void mpg__trace_posted(const mpg__trace_mark *m);
void mpg__trace_end(mpg__trace_mark *m, mpg_status st);
void mpg__trace_hand(mpg__trace_mark *m, mpg_status st, mpg_work **work);
void mpg__trace_device_times(double start, double end);
void mpg__trace_fault(mpg_ctx *ctx, mpg_status st);
/* At mpg_ctx_destroy: write the dump with reason "end" when a trace
 * directory is set and no automatic dump was written (a fault's is kept). */
void mpg__trace_at_end(mpg_ctx *ctx);

#endif
