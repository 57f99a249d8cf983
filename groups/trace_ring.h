/* The flight recorder (issue 32): groups/trace.c keeps the ring,
 * groups/trace_dump.c writes it (docs/trace.md, "The dump format (version
 * 1)").  What the rest of the groups layer calls is in trace_types.h
 * (mpg__trace_begin ...), what sync/ calls in groups_internal.h
 * (mpg__trace_tag ...); this header is the two files' shared state, the
 * ring, named for neither file: trace.c calls trace_dump.c
 * (mpg__trace_write), never the other way. */
#ifndef MPG_GROUPS_TRACE_RING_H
#define MPG_GROUPS_TRACE_RING_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

#include "core.h"
#include "trace_format.h"

#define TRACE_DEFAULT_ENTRIES 2048
#define TRACE_MAX_ENTRIES MPG__TRACE_MAX_ENTRIES
#define TRACE_MAX_GROUPS MPG__TRACE_MAX_GROUPS

#define TRACE_PENDING (-1) /* status of an operation not yet ended */

/* One operation.  Every field is an atomic (release stores, acquire
 * loads: plain moves on x86-64), so that a dump on another thread reads a
 * slot being rewritten without a data race: `stamp` (SEQ + 1 once the
 * issue fields are written, 0 while they are being written) tells the
 * reader, read before and after, whether the slot held one operation
 * throughout. */
typedef struct trace_slot {
  _Atomic uint64_t stamp;
  _Atomic uint64_t gseq, count;
  _Atomic int64_t issue_ns, start_ns, end_ns, step;
  _Atomic int group, kind, dtype, peer, bucket, first, last, status;
} trace_slot;

struct mpg__trace {
  trace_slot *ring;
  uint64_t mask;            /* capacity - 1 (a power of two) */
  long capacity;
  _Atomic uint64_t head;    /* operations recorded: the next SEQ */
  _Atomic int64_t step;     /* mpg__trace_step: the sync step, -1 before */
  _Atomic int dumped;       /* the automatic dump was written */
  _Atomic uint64_t dir_head; /* 1 + the head of the last dump written to
                                `dir` (on request too): 0 none */
  char dir[MPG__TRACE_DIR_MAX + 1]; /* automatic dumps: "" none */
  uint64_t job;             /* equal on every rank (agree.c) */
  pthread_mutex_t lock;     /* groups and names (not the hot path) */
  pthread_mutex_t dump_lock; /* one dump of this context at a time (taken
                                before `lock`, never while holding it) */
  mpg_group *groups[TRACE_MAX_GROUPS];
  _Atomic int ngroups;
  char *names;              /* interned names, NUL-separated; id = offset + 1 */
  size_t names_len, names_cap;
};

/* trace_dump.c: write the ring to dir/rank-R.trace (through a temporary
 * file of a unique name, created with O_EXCL | O_NOFOLLOW, and a rename),
 * with `reason` (a status name or "request") and `message`.  Dumps of one
 * context are serialized (dump_lock).  MPG_OK; MPG_ERR_INVALID for a
 * directory longer than MPG__TRACE_DIR_MAX bytes; MPG_ERR_STATE when
 * called from inside a dump of the same thread; MPG_ERR_IO naming the file
 * and errno. */
mpg_status mpg__trace_write(mpg_ctx *ctx, const char *dir, const char *reason,
                            const char *message);

/* The wall clock, nanoseconds since the epoch (inline: both files). */
static inline int64_t mpg__trace_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

#endif
