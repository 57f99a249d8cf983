/* The flight recorder's ring (issue 32; docs/trace.md): every context
 * keeps its last N operations, each with its group and its number on the
 * group, what it was, the sync step and bucket it belonged to, and when it
 * was issued, started and ended.  trace_dump.c writes the ring to a file
 * on a fault, on request, and at mpg_ctx_destroy (reason "end") when no
 * fault's dump was written.
 *
 * The hot path takes no lock: an operation claims its slot with one
 * fetch-add on the head, zeroes its stamp and writes the fields as
 * release stores (plain stores on x86-64), the stamp last; a dump reads
 * the stamp, the fields with acquire loads, the stamp again, and drops a
 * slot that changed meanwhile.
 * An operation still in flight when the ring has wrapped past it (N newer
 * operations issued meanwhile) writes its end into the newer slot only if
 * the stamp still names it.  The groups table and the interned parameter
 * names take a mutex, once per group and once per name. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "trace_ring.h"

#define RLX memory_order_relaxed
#define REL memory_order_release

/* The bucket being launched on this thread (mpg__trace_tag). */
static _Thread_local struct {
  int bucket, first, last;
} tag = {-1, 0, 0};
/* When the backend saw the last finished operation start and end on the
 * device (nccl; mpg__trace_device_times): 0 when not known. */
static _Thread_local double dev_start, dev_end;

mpg_status mpg__trace_create(mpg_ctx *ctx, const mpg_init_opts *opts) {
  const mpg__settings *set = &ctx->settings;
  long n = opts->trace_entries > 0   ? (long)opts->trace_entries
           : opts->trace_entries < 0 ? 0
           : set->trace_entries >= 0 ? set->trace_entries
                                     : TRACE_DEFAULT_ENTRIES;
  const char *dir = opts->trace_dir ? opts->trace_dir : set->trace_dir;
  if (n > TRACE_MAX_ENTRIES)
    return mpg__fail(MPG_ERR_INVALID,
                     "mpg_ctx_create: opts.trace_entries is %ld, expected at most %ld", n,
                     TRACE_MAX_ENTRIES);
  if (strlen(dir) >= sizeof ctx->trace->dir)
    return mpg__fail(MPG_ERR_INVALID,
                     "mpg_ctx_create: the trace directory \"%.64s...\" is %zu bytes long, "
                     "expected fewer than %zu", dir, strlen(dir), sizeof ctx->trace->dir);
  if (n == 0) return MPG_OK; /* recording off */
  long cap = 1;
  while (cap < n) cap <<= 1;
  mpg__trace *t = calloc(1, sizeof *t);
  trace_slot *ring = t ? calloc((size_t)cap, sizeof *ring) : NULL;
  if (!ring) {
    free(t);
    return mpg__fail(MPG_ERR_NOMEM, "mpg_ctx_create: out of memory for a trace ring of %ld "
                     "operations (opts.trace_entries, MESHPG_TRACE_ENTRIES)", cap);
  }
  t->ring = ring;
  t->capacity = cap;
  t->mask = (uint64_t)cap - 1;
  atomic_init(&t->step, -1);
  snprintf(t->dir, sizeof t->dir, "%s", dir);
  pthread_mutex_init(&t->lock, NULL);
  pthread_mutex_init(&t->dump_lock, NULL);
  ctx->trace = t;
  return MPG_OK;
}

void mpg__trace_destroy(mpg_ctx *ctx) {
  mpg__trace *t = ctx->trace;
  if (!t) return;
  int n = atomic_load(&t->ngroups);
  for (int i = 0; i < n; i++) {
    free(t->groups[i]->trace.p2p);
    t->groups[i]->trace.p2p = NULL;
    t->groups[i]->trace.id = 0;
  }
  pthread_mutex_destroy(&t->lock);
  pthread_mutex_destroy(&t->dump_lock);
  free(t->names);
  free(t->ring);
  free(t);
  ctx->trace = NULL;
}

/* g's number in the groups table (registered on first use), or -1 when
 * the table is full (its operations are not recorded). */
static int group_id(mpg__trace *t, mpg_group *g) {
  if (g->trace.id > 0) return g->trace.id - 1;
  pthread_mutex_lock(&t->lock);
  int id = g->trace.id - 1;
  if (id < 0) {
    int n = atomic_load_explicit(&t->ngroups, RLX);
    _Atomic uint64_t *p2p = n < TRACE_MAX_GROUPS ? calloc(2 * (size_t)g->size, sizeof *p2p)
                                                 : NULL;
    if (p2p) {
      g->trace.p2p = p2p;
      t->groups[n] = g;
      atomic_store(&t->ngroups, n + 1);
      g->trace.id = n + 1;
      id = n;
    }
  }
  pthread_mutex_unlock(&t->lock);
  return id;
}

/* The world rank at `position` of g, -1 for none. */
static int world_rank(const mpg_group *g, int position) {
  return position >= 0 && position < g->size ? mpg__group_world_rank(g, position) : -1;
}

/* Record one operation in the slot of `seq`. */
static void put(mpg__trace *t, uint64_t seq, int gid, uint64_t gseq, int kind, int dtype,
                uint64_t count, int peer, int64_t now) {
  trace_slot *s = &t->ring[seq & t->mask];
  /* The stamp's 0 first; every field store is a release (a plain store on
   * x86-64), so that a reader who sees a field sees the 0 (no fence: gcc's
   * TSan refuses atomic_thread_fence). */
  atomic_store_explicit(&s->stamp, 0, RLX);
  atomic_store_explicit(&s->gseq, gseq, REL);
  atomic_store_explicit(&s->count, count, REL);
  atomic_store_explicit(&s->issue_ns, now, REL);
  atomic_store_explicit(&s->start_ns, 0, REL);
  atomic_store_explicit(&s->end_ns, 0, REL);
  atomic_store_explicit(&s->step, atomic_load_explicit(&t->step, RLX), REL);
  atomic_store_explicit(&s->group, gid, REL);
  atomic_store_explicit(&s->kind, kind, REL);
  atomic_store_explicit(&s->dtype, dtype, REL);
  atomic_store_explicit(&s->peer, peer, REL);
  atomic_store_explicit(&s->bucket, tag.bucket, REL);
  atomic_store_explicit(&s->first, tag.bucket >= 0 ? tag.first : 0, REL);
  atomic_store_explicit(&s->last, tag.bucket >= 0 ? tag.last : 0, REL);
  atomic_store_explicit(&s->status, TRACE_PENDING, REL);
  atomic_store_explicit(&s->stamp, seq + 1, memory_order_release);
}

/* The per-peer number of a send to (receive from) position peer of g. */
static uint64_t p2p_seq(mpg_group *g, int kind, int peer) {
  if (peer < 0 || peer >= g->size) return 0;
  _Atomic uint64_t *c = &g->trace.p2p[2 * peer + (kind == MPG__RECV)];
  return atomic_fetch_add_explicit(c, 1, RLX) + 1;
}

static _Thread_local int muted; /* mpg__trace_mute */

void mpg__trace_mute(int delta) { muted += delta; }

mpg__trace_mark mpg__trace_begin(mpg_group *g, int kind, mpg_dtype dtype, size_t count,
                                 int peer) {
  mpg__trace_mark m = {NULL, 0, 0, 0};
  if (g->size < 2 || muted) return m;
  int p2p = kind == MPG__SEND || kind == MPG__RECV;
  /* Collectives are numbered recording or not: the messages' numbers
   * (issue 46, item 4) are the dump's GSEQ. */
  if (!p2p) m.gseq = atomic_fetch_add_explicit(&g->trace.seq, 1, RLX) + 1;
  mpg__trace *t = g->ctx->trace;
  if (!t) return m;
  int gid = group_id(t, g);
  if (gid < 0) return m;
  if (p2p) m.gseq = p2p_seq(g, kind, peer);
  uint64_t gseq = m.gseq;
  int wpeer = kind == MPG__SEND || kind == MPG__RECV || kind == MPG__BROADCAST
                  ? world_rank(g, peer) : -1;
  m.seq = atomic_fetch_add_explicit(&t->head, 1, RLX);
  put(t, m.seq, gid, gseq, kind, kind == MPG__BARRIER ? -1 : (int)dtype, count, wpeer,
      mpg__trace_now_ns());
  m.t = t;
  m.n = 1;
  return m;
}

mpg__trace_mark mpg__trace_begin_batch(mpg_group *g, const mpg__coll *list, int n) {
  mpg__trace_mark m = {NULL, 0, 0, 0};
  mpg__trace *t = g->ctx->trace;
  if (!t || g->size < 2 || n < 1 || muted) return m;
  int gid = group_id(t, g);
  if (gid < 0) return m;
  m.seq = atomic_fetch_add_explicit(&t->head, (uint64_t)n, RLX);
  int64_t now = mpg__trace_now_ns();
  for (int i = 0; i < n; i++) {
    const mpg__coll *c = &list[i];
    put(t, m.seq + (uint64_t)i, gid, p2p_seq(g, c->kind, c->peer), c->kind, (int)c->dtype,
        c->count, world_rank(g, c->peer), now);
  }
  m.t = t;
  m.n = n;
  return m;
}

void mpg__trace_device_times(double start, double end) {
  dev_start = start;
  dev_end = end;
}

/* mpg__now() seconds (CLOCK_MONOTONIC) as wall-clock nanoseconds. */
static int64_t wall_ns(double mono, int64_t now_ns) {
  return now_ns - (int64_t)((mpg__now() - mono) * 1e9);
}

void mpg__trace_end(mpg__trace_mark *m, mpg_status st) {
  if (!m->t) {
    dev_start = dev_end = 0;
    return;
  }
  int64_t now = mpg__trace_now_ns();
  int64_t start = dev_start > 0 ? wall_ns(dev_start, now) : 0;
  int64_t end = dev_end > 0 && !st ? wall_ns(dev_end, now) : now;
  dev_start = dev_end = 0;
  for (int i = 0; i < m->n; i++) {
    uint64_t seq = m->seq + (uint64_t)i;
    trace_slot *s = &m->t->ring[seq & m->t->mask];
    if (atomic_load_explicit(&s->stamp, memory_order_acquire) != seq + 1) continue;
    if (start) atomic_store_explicit(&s->start_ns, start, RLX);
    atomic_store_explicit(&s->end_ns, end, RLX);
    atomic_store_explicit(&s->status, (int)st, RLX);
  }
  m->t = NULL;
}

void mpg__trace_posted(const mpg__trace_mark *m) {
  if (!m->t) return;
  int64_t now = mpg__trace_now_ns();
  for (int i = 0; i < m->n; i++) {
    uint64_t seq = m->seq + (uint64_t)i;
    trace_slot *s = &m->t->ring[seq & m->t->mask];
    if (atomic_load_explicit(&s->stamp, memory_order_acquire) == seq + 1)
      atomic_store_explicit(&s->start_ns, now, RLX);
  }
}

void mpg__trace_hand(mpg__trace_mark *m, mpg_status st, mpg_work **work) {
  if (!st && work && *work) {
    (*work)->trace = *m; /* ended by mpg_work_test / mpg_work_wait */
    m->t = NULL;
    dev_start = dev_end = 0;
    return;
  }
  mpg__trace_end(m, st);
}

void mpg__trace_step(mpg_ctx *ctx, long step) {
  if (ctx && ctx->trace) atomic_store_explicit(&ctx->trace->step, step, RLX);
}

void mpg__trace_tag(int bucket, int first, int last) {
  tag.bucket = bucket;
  tag.first = first;
  tag.last = last;
}

int mpg__trace_intern(mpg_ctx *ctx, const char *name) {
  mpg__trace *t = ctx ? ctx->trace : NULL;
  if (!t || !name) return 0;
  size_t len = strlen(name) + 1;
  int id = 0;
  pthread_mutex_lock(&t->lock);
  for (size_t off = 0; off < t->names_len; off += strlen(t->names + off) + 1)
    if (!strcmp(t->names + off, name)) {
      id = (int)off + 1;
      break;
    }
  if (!id && t->names_len + len < (size_t)1 << 30) {
    if (t->names_len + len > t->names_cap) {
      size_t cap = t->names_cap ? 2 * t->names_cap : 4096;
      while (cap < t->names_len + len) cap *= 2;
      char *p = realloc(t->names, cap);
      if (p) {
        t->names = p;
        t->names_cap = cap;
      }
    }
    if (t->names_len + len <= t->names_cap) {
      memcpy(t->names + t->names_len, name, len);
      id = (int)t->names_len + 1;
      t->names_len += len;
    }
  }
  pthread_mutex_unlock(&t->lock);
  return id;
}

void mpg__trace_fault(mpg_ctx *ctx, mpg_status st) {
  mpg__trace *t = ctx ? ctx->trace : NULL;
  if (!t || !t->dir[0] || st == MPG_OK || atomic_exchange(&t->dumped, 1)) return;
  mpg__saved_error why;
  mpg__error_save(&why);
  char *msg = strdup(mpg_last_error()), reason[48];
  snprintf(reason, sizeof reason, "MPG_%s", mpg_status_name(st));
  if (mpg__trace_write(ctx, t->dir, reason, msg ? msg : "") == MPG_OK)
    mpg__log(1, "rank %d: flight recorder written to %s/rank-%d.trace (%s)", ctx->rank, t->dir,
             ctx->rank, mpg_status_name(st));
  else
    mpg__log(1, "rank %d: the flight recorder could not be written: %s", ctx->rank,
             mpg_last_error());
  free(msg);
  (void)mpg__error_restore(st, &why);
}

/* A rank that ends normally leaves its operations too (issue 46, item 2):
 * a rank that skipped a collective and ran on to the end is then seen
 * doing so, not only as a missing file.  The automatic dump of a fault
 * stays: `dumped` is taken once, by whichever comes first.  So does a dump
 * on request into the trace directory that holds every operation recorded
 * (none since: a program that dumps as its last act).  A context aborted
 * without a dump (none of its calls saw the abort) is written with the
 * abort's status instead of "end". */
void mpg__trace_at_end(mpg_ctx *ctx) {
  mpg__trace *t = ctx ? ctx->trace : NULL;
  if (!t || !t->dir[0] || atomic_exchange(&t->dumped, 1)) return;
  if (atomic_load(&t->dir_head) == atomic_load(&t->head) + 1) return;
  mpg__saved_error why;
  mpg__error_save(&why);
  mpg_status aborted = (mpg_status)atomic_load(&ctx->aborted);
  char reason[48] = "end";
  if (aborted) snprintf(reason, sizeof reason, "MPG_%s", mpg_status_name(aborted));
  if (mpg__trace_write(ctx, t->dir, reason, aborted ? "the context was aborted; written at "
                                                      "mpg_ctx_destroy" : "") == MPG_OK)
    mpg__log(2, "rank %d: flight recorder written to %s/rank-%d.trace (end)", ctx->rank,
             t->dir, ctx->rank);
  else
    mpg__log(1, "rank %d: the flight recorder could not be written at the end: %s", ctx->rank,
             mpg_last_error());
  (void)mpg__error_restore(MPG_OK, &why);
}

mpg_status mpg_ctx_trace_dump(mpg_ctx *ctx, const char *dir) {
  if (!ctx) return mpg__fail(MPG_ERR_INVALID, "mpg_ctx_trace_dump: ctx is NULL");
  mpg__trace *t = ctx->trace;
  if (!t)
    return mpg__fail(MPG_ERR_STATE, "mpg_ctx_trace_dump (rank %d): recording is off "
                     "(opts.trace_entries < 0 or MESHPG_TRACE_ENTRIES=0)", ctx->rank);
  if (!dir || !dir[0]) dir = t->dir;
  if (!dir[0])
    return mpg__fail(MPG_ERR_INVALID, "mpg_ctx_trace_dump (rank %d): dir is NULL and the "
                     "context has no trace directory (opts.trace_dir, MESHPG_TRACE_DIR)",
                     ctx->rank);
  return mpg__trace_write(ctx, dir, "request", "");
}
