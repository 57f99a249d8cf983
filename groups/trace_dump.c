/* The flight recorder's dump (issue 32): the ring of groups/trace.c as the
 * text of docs/trace.md, "The dump format (version 1)", built in a string
 * buffer and written whole (mpg__file_write_whole, base/file.c): to a
 * temporary file DIR/.rank-R.trace.PID.N.XXXXXXXX of a name no other
 * writer uses (a file or symlink planted there is never opened), renamed
 * to DIR/rank-R.trace, so that a reader never sees half a file.  Called
 * on a fault (mpg__trace_fault) and by mpg_ctx_trace_dump, possibly from
 * two threads at once: the dumps of one
 * context are serialized (dump_lock), the strings cut at the limits the
 * reader shares (trace_format.h; issue 45, items 12 and 13).  It reads the
 * ring while other threads may still write it (see trace.c). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "trace_ring.h"

#define RLX memory_order_relaxed
#define ACQ memory_order_acquire

/* s percent-encoded (docs/trace.md): "-" for an empty string; at most
 * `max` bytes of it (trace_format.h), cut before a UTF-8 continuation byte
 * so that a character is not split. */
static void put_str_max(mpg__strbuf *f, const char *s, size_t max) {
  size_t n = s ? strnlen(s, max + 1) : 0;
  if (n > max) {
    n = max;
    while (n > 0 && ((unsigned char)s[n] & 0xC0) == 0x80) n--;
  }
  if (n == 0) {
    mpg__strbuf_add(f, " -");
    return;
  }
  mpg__strbuf_add(f, " ");
  if (n == 1 && s[0] == '-') {
    mpg__strbuf_add(f, "%%2D");
    return;
  }
  for (const unsigned char *p = (const unsigned char *)s; p < (const unsigned char *)s + n; p++)
    if (*p <= 0x20 || *p == '%' || *p >= 0x7f)
      mpg__strbuf_add(f, "%%%02X", *p);
    else
      mpg__strbuf_add(f, "%c", *p);
}

static void put_str(mpg__strbuf *f, const char *s) { put_str_max(f, s, MPG__TRACE_NAME_MAX); }

static const char *kind_name(int kind) {
  if (kind == TRACE_ALL_TO_ALL) return "all_to_all";
  if (kind == TRACE_ALL_TO_ALL_V) return "all_to_all_v";
  return mpg__kind_name((mpg__coll_kind)kind);
}

static void put_status(mpg__strbuf *f, int st) {
  if (st == TRACE_PENDING)
    mpg__strbuf_add(f, " pending");
  else if (st == MPG_OK)
    mpg__strbuf_add(f, " ok");
  else
    mpg__strbuf_add(f, " MPG_%s", mpg_status_name((mpg_status)st));
}

/* The interned name `id` (0: none), read under the lock. */
static const char *name_of(const mpg__trace *t, int id) {
  return id > 0 && (size_t)id <= t->names_len ? t->names + id - 1 : "";
}

static void put_groups(mpg__strbuf *f, mpg__trace *t, int ngroups) {
  for (int i = 0; i < ngroups; i++) {
    const mpg_group *g = t->groups[i];
    mpg__strbuf_add(f, "group %d", i);
    put_str(f, g->name);
    mpg__strbuf_add(f, " %d %d %d ", g->index, g->position, g->size);
    for (int p = 0; p < g->size; p++)
      mpg__strbuf_add(f, "%s%d", p ? "," : "", mpg__group_world_rank(g, p));
    mpg__strbuf_add(f, "\n");
  }
}

/* One slot as an op line if it held operation `seq` throughout; 1 if
 * written. */
static int put_op(mpg__strbuf *f, mpg__trace *t, uint64_t seq, int ngroups) {
  const trace_slot *s = &t->ring[seq & t->mask];
  if (atomic_load_explicit(&s->stamp, memory_order_acquire) != seq + 1) return 0;
  /* Acquire loads (plain loads on x86-64): the stamp's second load below
   * cannot move before them. */
  uint64_t gseq = atomic_load_explicit(&s->gseq, ACQ);
  uint64_t count = atomic_load_explicit(&s->count, ACQ);
  int64_t issue = atomic_load_explicit(&s->issue_ns, ACQ);
  int64_t start = atomic_load_explicit(&s->start_ns, ACQ);
  int64_t end = atomic_load_explicit(&s->end_ns, ACQ);
  int64_t step = atomic_load_explicit(&s->step, ACQ);
  int group = atomic_load_explicit(&s->group, ACQ);
  int kind = atomic_load_explicit(&s->kind, ACQ);
  int dtype = atomic_load_explicit(&s->dtype, ACQ);
  int peer = atomic_load_explicit(&s->peer, ACQ);
  int bucket = atomic_load_explicit(&s->bucket, ACQ);
  int first = atomic_load_explicit(&s->first, ACQ);
  int last = atomic_load_explicit(&s->last, ACQ);
  int status = atomic_load_explicit(&s->status, ACQ);
  if (atomic_load_explicit(&s->stamp, RLX) != seq + 1) return 0; /* overwritten meanwhile */
  if (group < 0 || group >= ngroups) return 0; /* registered after the groups were listed */
  if (status != TRACE_PENDING && !end) status = TRACE_PENDING; /* ending meanwhile */
  mpg__strbuf_add(f, "op %llu %d %llu %s %s %llu %d %lld %d %lld %lld %lld",
                  (unsigned long long)seq, group, (unsigned long long)gseq, kind_name(kind),
                  dtype < 0 ? "-" : mpg_dtype_name((mpg_dtype)dtype), (unsigned long long)count,
                  peer, (long long)step, bucket, (long long)issue, (long long)start,
                  status == TRACE_PENDING ? 0LL : (long long)end);
  put_status(f, status);
  put_str(f, name_of(t, first));
  put_str(f, name_of(t, last));
  mpg__strbuf_add(f, "\n");
  return 1;
}

static void put_header(mpg__strbuf *f, mpg_ctx *ctx, const char *reason, const char *message,
                       uint64_t head) {
  mpg__trace *t = ctx->trace;
  char host[256] = "";
  if (gethostname(host, sizeof host - 1)) snprintf(host, sizeof host, "?");
  char mesh[MPG__TRACE_MESH_MAX + 2]; /* one byte more: a longer text is cut at a character */
  mpg__mesh_text(ctx->mesh, mesh, sizeof mesh);
  mpg__strbuf_add(f, "meshpg-trace 1\nrank %d %d\nprocess", ctx->rank, ctx->world);
  put_str(f, host);
  mpg__strbuf_add(f, " %ld\nbackend %s\nmesh", (long)getpid(), ctx->ops->name);
  put_str_max(f, mesh, MPG__TRACE_MESH_MAX);
  mpg__strbuf_add(f, "\njob %016llx\nclock %lld\nreason %s", (unsigned long long)ctx->job,
                  (long long)mpg__trace_now_ns(), reason);
  put_str_max(f, message, MPG__TRACE_MESSAGE_MAX);
  mpg__strbuf_add(f, "\nring %ld %llu\n", t->capacity, (unsigned long long)head);
}

static _Thread_local int in_dump; /* this thread is inside mpg__trace_write */

static mpg_status write_locked(mpg_ctx *ctx, const char *dir, const char *reason,
                               const char *message) {
  mpg__trace *t = ctx->trace;
  char path[MPG__TRACE_DIR_MAX + 64];
  snprintf(path, sizeof path, "%s/rank-%d.trace", dir, ctx->rank);
  if (mkdir(dir, 0777) && errno != EEXIST)
    return mpg__fail(MPG_ERR_IO, "flight recorder: cannot make the directory %s: %s", dir,
                     strerror(errno));
  mpg__strbuf buf = MPG__STRBUF_INIT, *f = &buf;
  pthread_mutex_lock(&t->lock); /* groups and names stay put */
  int ngroups = atomic_load(&t->ngroups);
  /* One head for TOTAL and the op lines: operations recorded meanwhile are
   * left out. */
  uint64_t head = atomic_load_explicit(&t->head, memory_order_acquire);
  put_header(f, ctx, reason, message, head);
  put_groups(f, t, ngroups);
  uint64_t from = head > (uint64_t)t->capacity ? head - (uint64_t)t->capacity : 0;
  long nops = 0;
  for (uint64_t seq = from; seq < head; seq++) nops += put_op(f, t, seq, ngroups);
  pthread_mutex_unlock(&t->lock);
  mpg__strbuf_add(f, "end %ld\n", nops);
  if (buf.st) {
    mpg__strbuf_free(&buf);
    return mpg__fail(MPG_ERR_NOMEM, "flight recorder: out of memory for the dump of %s", path);
  }
  mpg_status st = mpg__file_write_whole(AT_FDCWD, path, path, NULL, buf.s, buf.len, 0666);
  mpg__strbuf_free(&buf);
  if (st) return mpg__fail_wrap(st, "flight recorder");
  if (!strcmp(dir, t->dir)) atomic_store(&t->dir_head, head + 1); /* see mpg__trace_at_end */
  return MPG_OK;
}

mpg_status mpg__trace_write(mpg_ctx *ctx, const char *dir, const char *reason,
                            const char *message) {
  mpg__trace *t = ctx->trace;
  size_t dlen = strlen(dir);
  if (dlen > MPG__TRACE_DIR_MAX)
    return mpg__fail(MPG_ERR_INVALID,
                     "flight recorder (rank %d): the trace directory \"%.64s...\" is %zu bytes "
                     "long, the limit is %d bytes", ctx->rank, dir, dlen, MPG__TRACE_DIR_MAX);
  if (ctx->world > MPG__TRACE_MAX_WORLD)
    return mpg__fail(MPG_ERR_RANGE, "flight recorder (rank %d): a world of %d ranks is more "
                     "than a dump may describe (%d)", ctx->rank, ctx->world,
                     MPG__TRACE_MAX_WORLD);
  /* A dump triggered from inside a dump (a failure path reached while
   * writing) would wait for itself: refused instead. */
  if (in_dump)
    return mpg__fail(MPG_ERR_STATE, "flight recorder (rank %d): a dump was requested while "
                     "this thread writes one", ctx->rank);
  in_dump = 1;
  pthread_mutex_lock(&t->dump_lock);
  mpg_status st = write_locked(ctx, dir, reason, message);
  pthread_mutex_unlock(&t->dump_lock);
  in_dump = 0;
  return st;
}
