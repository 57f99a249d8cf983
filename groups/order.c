/* The issue-order checker (issue 11).  NCCL needs the collectives of all
 * communicators issued in one order that every device follows, or it may
 * deadlock on the GPU; the thread and mpi backends often complete another
 * order anyway.  So each context records what it issues and, at check
 * points, the ranks compare their records over the world.
 *
 * What is recorded (core.h: mpg__order_note*), in issue order:
 *  - every collective that coll.c's run() posts (size-1 groups included):
 *    the group's name and dims (its mask), kind, count, dtype and op.  The
 *    name is the dim set's (or "dp+cp" for a mpg_ctx_group_dims group),
 *    never the group index: ranks of different tp groups issue on
 *    different communicators of the same dim set.  Barriers record no
 *    count, dtype or op; broadcasts and all-gathers no op.
 *  - every mpg_all_to_all / mpg_all_to_all_v (alltoall.c), as a
 *    collective of its group, of kind KIND_ALL_TO_ALL (with its count,
 *    equal on every member) or KIND_ALL_TO_ALL_V (no count: per-peer
 *    counts differ between members by nature), dtype, no op; size-1
 *    groups too.
 *  - every split that creates a group (group.c), as (name, "split"): a
 *    collective over the world.
 *  - nothing on groups made by mpg_ctx_group_select (their non-members
 *    legitimately do not issue on them: tied embeddings, first and last
 *    stage only), no point-to-point traffic (mpg_send, mpg_recv,
 *    mpg_p2p_batch pair ranks unevenly by nature: a batch on one side may
 *    meet single calls on the other, a pipeline's first stage never
 *    receives), and none of the library's own checks (this checker's
 *    collectives, sync's layout fingerprints); none of it counts in
 *    mpg__ctx_setup_collectives.
 *
 * The rule checked: the members of a group that carried a collective (or,
 * for the world, a split) since the last check issued the same sequence of
 * calls, on every dim set, in the same order: same group names, kinds,
 * dtypes and ops everywhere, and the same counts on the groups all of
 * them share (a group whose dims include the group's).  So a rank that
 * issues on "dp" where the others issue on "tp", an extra or a missing
 * call, or another count on a shared group is caught, while counts may
 * differ on groups the members do not share (uneven batches over dp give
 * each tp group its own count), and ranks that share no group used since
 * the last check may run different programs (pipeline stages with their
 * own layers, as long as no collective over "world" or "pp" falls between
 * two checks).  Within such a set of ranks every group's calls then line
 * up by position, so one order exists that every rank follows.
 *
 * The record: per rank a running 64-bit hash of the full calls and one
 * hash per mask of this context's groups (a call's count enters the
 * hash of mask m only when the call's mask includes m), the masks of the
 * groups used, a call counter and a log of the last ORDER_LOG calls.
 *
 * The check (collective over the world, on host buffers through
 * mpg__ctx_setup_coll: staged on NCCL): one all-reduce (max) of (calls,
 * hash, ~calls, ~hash): equal everywhere, done.  Otherwise every rank
 * holds the same gathered values from here on, so every rank takes the
 * same branches: an all-gather of (calls, first call kept, masks used), an
 * all-gather of the hashes of the masks anyone used, a comparison within
 * every used group; on a disagreement two broadcasts of the logs of the
 * first two members that differ, the first differing call, and
 * MPG_ERR_STATE on every rank with the same message.  Either way the
 * record starts afresh. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "mpg_config.h"

#define ORDER_LOG 1024   /* calls kept since the last check (a power of 2) */
#define ORDER_LOG_MIN 32 /* the log's first size */
#define ORDER_NAME 64    /* bytes of a group's name in a record */
#define REC_WORDS (3 + ORDER_NAME / 8)
#define MAX_SLOTS 64     /* distinct group masks followed per context */
#define MASK_WORDS ((MPG__MASK_SLOTS + 63) / 64) /* one bit per mask slot */

/* Kinds recorded next to mpg__coll_kind that no backend sees: a split,
 * and the all-to-alls (alltoall.c, made of point-to-point traffic but
 * collectives of the group). */
enum { KIND_SPLIT = 100, KIND_ALL_TO_ALL = 101, KIND_ALL_TO_ALL_V = 102 };

static const char *kind_name(int kind) {
  switch (kind) {
    case KIND_SPLIT: return "split";
    case KIND_ALL_TO_ALL: return "all_to_all";
    case KIND_ALL_TO_ALL_V: return "all_to_all_v";
  }
  return mpg__kind_name((mpg__coll_kind)kind);
}

typedef struct entry {
  uint64_t count;
  unsigned mask;       /* dims of the group (all dims for a split) */
  int kind, dtype, op; /* dtype and op: -1 when they do not apply */
  char name[ORDER_NAME];
} entry;

struct mpg__order {
  uint64_t hash;  /* over the full calls since the last check */
  long n;         /* calls since the last check */
  entry *log;     /* call i is at log[i % cap] while i >= n - cap */
  long cap;
  int fixed;      /* the log cannot grow any more (out of memory) */
  unsigned world_mask;
  int nslots;
  unsigned slot_mask[MAX_SLOTS];
  uint64_t slot_hash[MAX_SLOTS];
  uint64_t used[MASK_WORDS]; /* slots of the masks of the groups that carried a
                                collective (mpg__mesh_mask_slot) */
  const mpg_mesh *mesh;
};

static const uint64_t SEED = 0x6f726465726d7067ull;   /* "ordermpg" */
static const uint64_t ABSENT = 0x6e6f736c6f74ull;     /* "noslot": a mask never made */

static uint64_t mix_str(uint64_t h, const char *s) {
  return mpg__hash_mix(h, mpg__hash_str(s));
}

static void add_slot(mpg__order *o, unsigned mask) {
  for (int k = 0; k < o->nslots; k++)
    if (o->slot_mask[k] == mask) return;
  if (o->nslots == MAX_SLOTS) return; /* not followed: never compared */
  o->slot_mask[o->nslots] = mask;
  o->slot_hash[o->nslots++] = SEED;
}

static void restart(mpg__order *o) {
  o->hash = SEED;
  o->n = 0;
  for (int k = 0; k < o->nslots; k++) o->slot_hash[k] = SEED;
  memset(o->used, 0, sizeof o->used);
}

mpg_status mpg__order_create(mpg_ctx *ctx) {
  ctx->order = NULL;
  if (!ctx->settings.check_order) return MPG_OK; /* MESHPG_CHECK_ORDER, read at create */
  mpg__order *o = calloc(1, sizeof *o);
  entry *log = malloc(sizeof *log * ORDER_LOG_MIN);
  if (!o || !log) {
    free(o);
    free(log);
    return mpg__fail(MPG_ERR_NOMEM, "mpg_ctx_create: out of memory for the issue-order "
                     "checker (MESHPG_CHECK_ORDER=0 turns it off)");
  }
  o->log = log;
  o->cap = ORDER_LOG_MIN;
  o->mesh = ctx->mesh;
  o->world_mask = (1u << mpg_mesh_ndims(ctx->mesh)) - 1u;
  for (int s = 0; s < ctx->nsets; s++) add_slot(o, mpg__mesh_dimset_mask(ctx->mesh, s));
  add_slot(o, o->world_mask);
  restart(o);
  ctx->order = o;
  mpg__log(2, "rank %d: issue-order checker on", ctx->rank);
  return MPG_OK;
}

static void record(mpg__order *o, const char *name, unsigned mask, int kind, uint64_t count,
                   int dtype, int op) {
  uint64_t key = mpg__hash_mix(mix_str(SEED, name), (uint64_t)kind);
  key = mpg__hash_mix(mpg__hash_mix(key, (uint64_t)(dtype + 1)), (uint64_t)(op + 1));
  uint64_t full = mpg__hash_mix(key, count);
  o->hash = mpg__hash_mix(o->hash, full);
  for (int k = 0; k < o->nslots; k++)
    o->slot_hash[k] = mpg__hash_mix(o->slot_hash[k],
                                    (mask & o->slot_mask[k]) == o->slot_mask[k] ? full : key);
  unsigned slot = mpg__mesh_mask_slot(o->mesh, mask);
  o->used[slot / 64] |= 1ull << (slot % 64);
  if (o->n == o->cap && o->cap < ORDER_LOG && !o->fixed) {
    /* Not wrapped yet: calls 0..cap-1 sit at 0..cap-1 and stay there. */
    entry *log = realloc(o->log, sizeof *log * (size_t)(2 * o->cap));
    if (log) {
      o->log = log;
      o->cap *= 2;
    } else {
      o->fixed = 1; /* keep the last cap calls: the checker never fails a call */
    }
  }
  entry *e = &o->log[o->n % o->cap];
  e->count = count;
  e->mask = mask;
  e->kind = kind;
  e->dtype = dtype;
  e->op = op;
  memset(e->name, 0, sizeof e->name); /* compared whole (same_call) */
  snprintf(e->name, sizeof e->name, "%s", name);
  o->n++;
}

void mpg__order_note(mpg_group *g, const mpg__coll *c) {
  if (!g->ctx->order || g->nselect > 0 || g->pstride > 0) return;
  if (c->kind == MPG__SEND || c->kind == MPG__RECV) return;
  int reduces = c->kind == MPG__ALL_REDUCE || c->kind == MPG__REDUCE_SCATTER;
  int barrier = c->kind == MPG__BARRIER;
  record(g->ctx->order, g->name, g->mask, (int)c->kind, barrier ? 0 : (uint64_t)c->count,
         barrier ? -1 : (int)c->dtype, reduces ? (int)c->op : -1);
}

void mpg__order_note_all_to_all(mpg_group *g, int v, size_t count, mpg_dtype dtype) {
  if (!g->ctx->order || g->nselect > 0 || g->pstride > 0) return;
  /* The v form's counts differ per member and peer: none is recorded. */
  record(g->ctx->order, g->name, g->mask, v ? KIND_ALL_TO_ALL_V : KIND_ALL_TO_ALL,
         v ? 0 : (uint64_t)count, (int)dtype, -1);
}

void mpg__order_note_split(mpg_group *g) {
  mpg__order *o = g->ctx->order;
  if (!o || g->nselect > 0 || g->pstride > 0) return;
  record(o, g->name, o->world_mask, KIND_SPLIT, 0, -1, -1); /* over the world */
  add_slot(o, g->mask); /* a mpg_ctx_group_dims group: made here on every rank */
}

/* Point-to-point batches are not compared: a batch on one side may meet
 * single mpg_send / mpg_recv calls on the other (tests/groups/test_p2p.c),
 * and pipeline stages issue different numbers of batches, so a (group,
 * "p2p") record would fail correct programs at the first collective over
 * a group spanning them.  (mpg__order_note above skips send and recv.) */

/* ------------------------------------------------------------------ */
/* The check                                                           */
/* ------------------------------------------------------------------ */

static mpg_status run_check_coll(mpg_ctx *ctx, mpg__coll *c, const char *where,
                                 const char *what) {
  /* Recorded by the flight recorder on the "world" group (every rank
   * checks at the same points), so that a rank waiting in a check is not
   * taken for one that computes. */
  mpg_group *world = NULL;
  for (int s = 0; s < ctx->nsets && !world; s++)
    if (!strcmp(ctx->groups[s].name, "world")) world = &ctx->groups[s];
  mpg__trace_mark mark = {NULL, 0, 0, 0};
  if (world)
    mark = mpg__trace_begin(world, (int)c->kind, c->dtype, c->count,
                            c->kind == MPG__BROADCAST ? c->root : -1);
  mpg__trace_posted(&mark);
  mpg_status st = mpg__ctx_setup_coll(ctx, ctx->world_comm, ctx->world, c);
  mpg__trace_end(&mark, st);
  if (st)
    return mpg__fail_wrap(st, "%s: issue-order check (rank %d of %d), %s", where, ctx->rank,
                          ctx->world, what);
  return MPG_OK;
}

static mpg_status gather(mpg_ctx *ctx, const uint64_t *mine, uint64_t *all, size_t words,
                         const char *where, const char *what) {
  mpg__coll c = {MPG__ALL_GATHER, mine, all, words, MPG_I64, MPG_OP_SUM, 1.0, 0, 0, NULL, 0};
  return run_check_coll(ctx, &c, where, what);
}

static void pack(const entry *e, uint64_t *rec) {
  memset(rec, 0, REC_WORDS * sizeof *rec);
  rec[0] = e->count;
  rec[1] = (uint64_t)(e->kind + 1) | (uint64_t)(e->dtype + 1) << 8 |
           (uint64_t)(e->op + 1) << 16;
  rec[2] = e->mask;
  memcpy(&rec[3], e->name, ORDER_NAME);
}

/* Call i of a rank as seen against mask m: 0 when it differs from b's. */
static int same_call(const uint64_t *a, const uint64_t *b, unsigned m) {
  if (a[1] != b[1] || a[2] != b[2] || memcmp(&a[3], &b[3], ORDER_NAME)) return 0;
  return ((unsigned)a[2] & m) != m || a[0] == b[0];
}

static void describe(const uint64_t *rec, long n, char *buf, size_t len) {
  if (!rec) {
    snprintf(buf, len, "nothing (%ld call%s since the last check)", n, n == 1 ? "" : "s");
    return;
  }
  int kind = (int)(rec[1] & 0xff) - 1, dtype = (int)((rec[1] >> 8) & 0xff) - 1;
  int op = (int)((rec[1] >> 16) & 0xff) - 1;
  char name[ORDER_NAME];
  memcpy(name, &rec[3], ORDER_NAME);
  name[ORDER_NAME - 1] = '\0';
  const char *k = kind_name(kind);
  unsigned long long count = (unsigned long long)rec[0];
  if (kind == KIND_SPLIT)
    snprintf(buf, len, "split (creation) of group \"%s\"", name);
  else if (kind == MPG__BARRIER)
    snprintf(buf, len, "barrier on \"%s\"", name);
  else if (kind == KIND_ALL_TO_ALL_V)
    snprintf(buf, len, "%s(%s) on \"%s\"", k, mpg_dtype_name((mpg_dtype)dtype), name);
  else if (op >= 0)
    snprintf(buf, len, "%s(%s, %s, count %llu) on \"%s\"", k,
             mpg_dtype_name((mpg_dtype)dtype), mpg__op_name((mpg_op)op), count, name);
  else
    snprintf(buf, len, "%s(%s, count %llu) on \"%s\"", k, mpg_dtype_name((mpg_dtype)dtype),
             count, name);
}

/* This rank's log window [lo, n) packed, broadcast from world rank `root`
 * whose window is [lo, lo + len): every rank gets root's. */
static mpg_status bcast_log(mpg_ctx *ctx, const mpg__order *o, int root, long lo, long len,
                            uint64_t *buf, const char *where) {
  if (len == 0) return MPG_OK;
  if (ctx->rank == root)
    for (long i = 0; i < len; i++) pack(&o->log[(lo + i) % o->cap], buf + i * REC_WORDS);
  mpg__coll c = {MPG__BROADCAST, buf, buf, (size_t)len * REC_WORDS, MPG_I64, MPG_OP_SUM,
                 1.0, root, 0, NULL, 0};
  return run_check_coll(ctx, &c, where, "broadcasting a log");
}

/* The name of the groups over mask m (the dim set's, else "dp+cp"). */
static void mask_name(const mpg_ctx *ctx, unsigned m, char *buf, size_t len) {
  for (int s = 0; s < ctx->nsets; s++)
    if (ctx->groups[s].mask == m && ctx->groups[s].name) {
      snprintf(buf, len, "%s", ctx->groups[s].name);
      return;
    }
  mpg__mesh_mask_names(ctx->mesh, m, "+", buf, len);
}

/* Ranks a and b (world ranks), members of the group over mask m with
 * index `index`, differ: name the first call that differs between them. */
static mpg_status report(mpg_ctx *ctx, const mpg__order *o, const uint64_t *info, size_t iw,
                         unsigned m, int index, int a, int b, int bad, const char *where) {
  long na = (long)info[a * iw], loa = (long)info[a * iw + 1];
  long nb = (long)info[b * iw], lob = (long)info[b * iw + 1];
  uint64_t *la = calloc((size_t)((na - loa) + (nb - lob) + 1) * REC_WORDS, sizeof *la);
  if (!la) return mpg__fail(MPG_ERR_NOMEM, "%s: issue-order check: out of memory", where);
  uint64_t *lb = la + (size_t)(na - loa) * REC_WORDS;
  mpg_status st = bcast_log(ctx, o, a, loa, na - loa, la, where);
  if (!st) st = bcast_log(ctx, o, b, lob, nb - lob, lb, where);
  if (st) {
    free(la);
    return st;
  }
  long i = loa > lob ? loa : lob, end = na > nb ? na : nb;
  while (i < end && i < na && i < nb &&
         same_call(la + (i - loa) * REC_WORDS, lb + (i - lob) * REC_WORDS, m))
    i++;
  char group[96], da[200], db[200];
  mask_name(ctx, m, group, sizeof group);
  if (i >= end) {
    /* Both windows agree: the difference lies before the calls kept. */
    st = mpg__fail(MPG_ERR_STATE,
                   "%s: issue order differs: ranks %d and %d, members of group \"%s\" "
                   "index %d, issued different calls before the last %d calls kept, "
                   "which agree (%d group%s disagree%s)",
                   where, a, b, group, index, ORDER_LOG, bad, bad == 1 ? "" : "s",
                   bad == 1 ? "s" : "");
  } else {
    describe(i < na ? la + (i - loa) * REC_WORDS : NULL, na, da, sizeof da);
    describe(i < nb ? lb + (i - lob) * REC_WORDS : NULL, nb, db, sizeof db);
    st = mpg__fail(MPG_ERR_STATE,
                   "%s: issue order differs: call #%ld since the last check: rank %d issued "
                   "%s, rank %d issued %s (ranks %d and %d are members of group \"%s\" "
                   "index %d; %d group%s disagree%s). The members of a group must issue "
                   "the same collectives and group creations in the same order",
                   where, i + 1, a, da, b, db, a, b, group, index, bad, bad == 1 ? "" : "s",
                   bad == 1 ? "s" : "");
  }
  free(la);
  return st;
}

/* The full records differ somewhere: compare within every used group. */
static mpg_status compare_groups(mpg_ctx *ctx, const mpg__order *o, const char *where) {
  int world = ctx->world;
  enum { IW = 2 + MASK_WORDS };
  uint64_t mine[IW];
  mine[0] = (uint64_t)o->n;
  mine[1] = (uint64_t)(o->n > o->cap ? o->n - o->cap : 0);
  memcpy(&mine[2], o->used, sizeof o->used);
  unsigned masks[MPG__MASK_SLOTS], slots[MPG__MASK_SLOTS];
  int nm = 0;
  uint64_t *info = malloc(sizeof *info * IW * (size_t)world);
  uint64_t *hashes = NULL, *minh = NULL;
  int *first = malloc(sizeof *first * 4 * (size_t)world); /* and idx_of, other, used */
  mpg_status st = info && first ? MPG_OK
                  : mpg__fail(MPG_ERR_NOMEM, "%s: issue-order check: out of memory", where);
  if (!st) st = gather(ctx, mine, info, IW, where, "gathering the groups used");
  if (st) goto out;
  for (unsigned k = 0; k < MPG__MASK_SLOTS; k++) {
    int any = 0;
    for (int r = 0; r < world && !any; r++) any = (info[r * IW + 2 + k / 64] >> (k % 64)) & 1;
    if (any) slots[nm] = k, masks[nm++] = mpg__mesh_slot_mask(ctx->mesh, k);
  }
  hashes = malloc(sizeof *hashes * (size_t)nm * (size_t)world + 1);
  minh = malloc(sizeof *minh * (size_t)nm + 1);
  if (!hashes || !minh) {
    st = mpg__fail(MPG_ERR_NOMEM, "%s: issue-order check: out of memory", where);
    goto out;
  }
  for (int j = 0; j < nm; j++) {
    minh[j] = ABSENT;
    for (int k = 0; k < o->nslots; k++)
      if (o->slot_mask[k] == masks[j]) minh[j] = o->slot_hash[k];
  }
  if ((st = gather(ctx, minh, hashes, (size_t)nm, where, "gathering the groups' hashes")))
    goto out;
  int bad = 0, fa = -1, fb = -1, fidx = -1;
  unsigned fm = 0;
  int *idx_of = first + world, *other = first + 2 * world, *used = first + 3 * world;
  for (int j = 0; j < nm; j++) {
    unsigned m = masks[j], k = slots[j];
    for (int x = 0; x < world; x++) first[x] = other[x] = -1, used[x] = 0;
    for (int r = 0; r < world; r++) {
      int pos, size;
      mpg__mesh_mask_place(ctx->mesh, m, r, &idx_of[r], &pos, &size);
      int x = idx_of[r];
      if (first[x] < 0) first[x] = r;
      used[x] |= (int)((info[r * IW + 2 + k / 64] >> (k % 64)) & 1);
      if (other[x] < 0 && hashes[(size_t)r * nm + j] != hashes[(size_t)first[x] * nm + j])
        other[x] = r;
    }
    /* A group used by a member since the last check whose members differ. */
    for (int x = 0; x < world; x++) {
      if (first[x] < 0 || !used[x] || other[x] < 0) continue;
      if (!bad++) fa = first[x], fb = other[x], fm = m, fidx = x;
    }
  }
  if (bad)
    st = report(ctx, o, info, IW, fm, fidx, fa, fb, bad, where);
  else
    mpg__log(2, "rank %d: issue order at %s: the ranks differ, but within every group "
             "used the members agree", ctx->rank, where);
out:
  free(info);
  free(first);
  free(hashes);
  free(minh);
  return st;
}

mpg_status mpg__ctx_check_order(mpg_ctx *ctx, const char *where) {
  mpg__order *o = ctx->order;
  if (!o || atomic_load(&ctx->aborted)) return MPG_OK;
  mpg_status st = MPG_OK;
  if (ctx->world > 1) {
    /* max of (x, ~x) over the world: equal everywhere iff max == ~max(~x). */
    uint64_t mine[4] = {(uint64_t)o->n, o->hash, ~(uint64_t)o->n, ~o->hash}, max[4];
    mpg__coll c = {MPG__ALL_REDUCE, mine, max, 4, MPG_I64, MPG_OP_MAX, 1.0, 0, 0, NULL, 0};
    st = run_check_coll(ctx, &c, where, "comparing (calls, hash)");
    if (!st && (max[0] != ~max[2] || max[1] != ~max[3])) st = compare_groups(ctx, o, where);
    if (!st)
      mpg__log(2, "rank %d: issue order checked at %s (%ld calls)", ctx->rank, where, o->n);
  }
  restart(o);
  if (st) mpg__trace_fault(ctx, st); /* a desync: the flight recorder's dump */
  return st;
}

/* No check at destroy: destroy is where ranks part ways, often on an error
 * path while peers are still inside a step; a collective there would make
 * a rank that leaves wait for them, and its timeout would then abort them
 * with its reason instead of their own.  Commit, every finish and
 * mpg_ctx_check_order cover the steps. */
void mpg__order_destroy(mpg_ctx *ctx) {
  if (!ctx->order) return;
  free(ctx->order->log);
  free(ctx->order);
  ctx->order = NULL;
}

mpg_status mpg_ctx_check_order(mpg_ctx *ctx) {
  if (!ctx) return mpg__fail(MPG_ERR_INVALID, "mpg_ctx_check_order: ctx is NULL");
  int reason = atomic_load(&ctx->aborted);
  if (reason)
    return mpg__fail(MPG_ERR_ABORTED, "mpg_ctx_check_order (rank %d): the context was "
                     "aborted (%s)", ctx->rank, mpg_status_name((mpg_status)reason));
  /* Collectives over the world: from the context's issuing thread (nccl). */
  mpg_status st = ctx->order ? mpg__ctx_check_issuer(ctx, "mpg_ctx_check_order", NULL) : MPG_OK;
  return st ? st : mpg__ctx_check_order(ctx, "mpg_ctx_check_order");
}
