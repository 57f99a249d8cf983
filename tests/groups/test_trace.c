/* The flight recorder's ring and its dumps (groups/trace.c, trace_dump.c;
 * issue 32), on the thread backend: what each operation records (group,
 * number on the group, per-peer numbers of sends and receives, kind,
 * dtype, count, peer, sync step and bucket with its params, times,
 * status), the automatic dump on a timeout (once, with the operation still
 * pending), the ring's wrap, the switches (opts, MESHPG_TRACE_*), and a
 * dump on request while the rank records (TSan).  The dumps are read back
 * with the reader of `meshpg trace` (tools/trace_read.c). */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "meshpg.h"
#include "mesh_util.h"
#include "rank_check.h"
#include "run_ranks.h"
#include "trace_read.h"

static mpg_mesh *mesh;
static char dir[256];

static void fresh_dir(const char *name) {
  snprintf(dir, sizeof dir, "/tmp/mpg-test-trace-%ld-%s", (long)getpid(), name);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  cr_assert_eq(system(cmd), 0);
}

static void cleanup(void) {
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  (void)system(cmd);
  mpg_mesh_destroy(mesh);
  mesh = NULL;
}

/* Rank r's dump, parsed (asserts). */
static void read_rank(int r, tr_rank *out) {
  char path[400], err[512];
  snprintf(path, sizeof path, "%s/rank-%d.trace", dir, r);
  int rc = tr_read_file(path, out, err, sizeof err);
  cr_assert_eq(rc, 0, "%s: %s", path, err);
  cr_assert_eq(out->rank, r);
}

static const tr_group *group_of(const tr_rank *t, const tr_op *op) {
  cr_assert(op->group >= 0 && op->group < t->ngroups);
  return &t->groups[op->group];
}

/* The start of a rank of these tests (run with no_ctx): its context from
 * run_ranks' options with trace_dir tdir and trace_entries *entries (NULL:
 * as they are), and the group `group` (NULL: none) in *g. */
static mpg_status open_traced(rr_rank *r, const char *tdir, const int *entries, const char *group,
                              mpg_group **g) {
  mpg_init_opts opts = *r->opts;
  if (tdir) opts.trace_dir = tdir;
  if (entries) opts.trace_entries = *entries;
  RCALL(mpg_ctx_create(r->mesh, &opts, &r->ctx));
  tl_ctx = r->ctx;
  if (group) RCALL(mpg_ctx_group(r->ctx, group, g));
  return MPG_OK;
}

/* fn on n thread ranks over dims, each opening its context (open_traced),
 * with collective timeout timeout_s; returns the run's status (asserted
 * when must_pass). */
static mpg_status run_traced(const char *dims, int n, double timeout_s, rr_fn fn, void *arg,
                             int must_pass) {
  const rr_opts o = {.timeout_s = timeout_s, .no_ctx = 1};
  if (must_pass) {
    run_ranks_ok(dims, n, fn, arg, &o);
    return MPG_OK;
  }
  return run_ranks_ex(dims, n, fn, arg, &o);
}

/* In a fresh directory `name`: fn on the 2 ranks of dims (run_traced, which
 * must pass), then rank `rank`'s dump read into *t. */
static void run_and_read(const char *name, const char *dims, double timeout_s, rr_fn fn, int rank,
                         tr_rank *t) {
  fresh_dir(name);
  run_traced(dims, 2, timeout_s, fn, NULL, 1);
  read_rank(rank, t);
}

/* ---- every kind of operation ---- */

static mpg_status every_kind(rr_rank *r) {
  mpg_group *dp, *tp;
  RCALL(open_traced(r, dir, NULL, "dp", &dp));
  mpg_ctx *ctx = r->ctx;
  RCALL(mpg_ctx_group(ctx, "tp", &tp));
  float x[64] = {0}, all[128];
  for (int i = 0; i < 3; i++) RCALL(mpg_all_reduce(tp, x, x, 16, MPG_F32, MPG_OP_SUM, NULL, NULL));
  RCALL(mpg_broadcast(dp, x, 8, MPG_F32, 1, NULL, NULL));
  RCALL(mpg_all_gather(dp, x, all, 32, MPG_F32, NULL, NULL));
  int pos = mpg_group_position(dp);
  for (int i = 0; i < 2; i++) {
    if (pos == 0) RCALL(mpg_send(dp, x, 4, MPG_F32, 1, NULL, NULL));
    else RCALL(mpg_recv(dp, x, 4, MPG_F32, 0, NULL, NULL));
  }
  RCALL(mpg_all_to_all(tp, x, all, 5, MPG_F32, NULL, NULL));
  mpg_p2p_op ops[2] = {{MPG_P2P_SEND, 1 - pos, x, 3, MPG_F32}, {MPG_P2P_RECV, 1 - pos, all, 3, MPG_F32}};
  mpg_work *w = NULL;
  RCALL(mpg_p2p_batch(dp, ops, 2, NULL, &w));
  RCALL(mpg_work_wait(w));
  RCALL(mpg_ctx_trace_dump(ctx, NULL));
  return MPG_OK;
}

Test(trace, every_kind_of_operation_recorded_with_its_numbers, .fini = cleanup) {
  fresh_dir("kinds");
  run_traced("dp=2,tp=2", 4, 30.0, every_kind, NULL, 1);
  for (int r = 0; r < 4; r++) {
    tr_rank t;
    read_rank(r, &t);
    cr_assert_eq(t.world, 4);
    cr_assert_str_eq(t.backend, "thread");
    cr_assert_str_eq(t.mesh, "dp=2,tp=2");
    cr_assert_str_eq(t.reason, "request");
    cr_assert_eq(t.nops, 10, "rank %d: %d ops", r, t.nops);
    cr_assert_eq(t.total, 10);
    static const char *const kinds[] = {"all_reduce", "all_reduce", "all_reduce", "broadcast",
                                        "all_gather"};
    int dp_pos = r / 2, tp_index = r / 2, dp_index = r % 2;
    for (int i = 0; i < t.nops; i++) {
      const tr_op *op = &t.ops[i];
      const tr_group *g = group_of(&t, op);
      cr_assert_eq(op->seq, (uint64_t)i);
      cr_assert_str_eq(op->status, "ok", "rank %d op %d: %s", r, i, op->status);
      cr_assert(op->issue_ns > 0 && op->end_ns >= op->issue_ns);
      cr_assert_eq(op->step, -1);
      cr_assert_eq(op->bucket, -1);
      const char *want = i < 5 ? kinds[i] : i < 7 ? (dp_pos == 0 ? "send" : "recv")
                         : i == 7 ? "all_to_all" : NULL; /* the batch: either order */
      if (want) cr_assert_str_eq(op->kind, want, "rank %d op %d", r, i);
      if (i < 3 || i == 7) {
        cr_assert_str_eq(g->name, "tp");
        cr_assert_eq(g->index, tp_index);
        cr_assert_eq(g->ranks[0], 2 * tp_index);
        cr_assert_eq(g->ranks[1], 2 * tp_index + 1);
        cr_assert_eq(op->gseq, (uint64_t)(i < 3 ? i + 1 : 4));
      } else {
        cr_assert_str_eq(g->name, "dp");
        cr_assert_eq(g->index, dp_index);
        cr_assert_eq(g->position, dp_pos);
      }
      if (i == 3) {
        cr_assert_eq(op->gseq, 1);
        cr_assert_eq(op->peer, 2 + dp_index, "the broadcast's root as a world rank");
        cr_assert_eq(op->count, 8);
      }
      if (i == 4) cr_assert_eq(op->gseq, 2);
      if (i == 5 || i == 6) {
        cr_assert_eq(op->gseq, (uint64_t)(i - 4), "send/recv number per peer");
        cr_assert_eq(op->peer, dp_pos == 0 ? 2 + dp_index : dp_index);
        cr_assert_str_eq(op->dtype, "f32");
        cr_assert_eq(op->count, 4);
      }
      if (i >= 8) {
        int send = !strcmp(op->kind, "send");
        cr_assert(send || !strcmp(op->kind, "recv"), "rank %d op %d: %s", r, i, op->kind);
        cr_assert_neq(send, !strcmp(t.ops[i == 8 ? 9 : 8].kind, "send"), "one of each");
        cr_assert_eq(op->gseq, (uint64_t)(send == (dp_pos == 0) ? 3 : 1),
                     "the batch's %s, numbered per peer", op->kind);
      }
    }
    tr_rank_free(&t);
  }
}

/* ---- a timeout dumps once, by itself ---- */

static mpg_status stall(rr_rank *r) {
  mpg_group *dp, *tp;
  RCALL(open_traced(r, r->arg, NULL, "dp", &dp));
  mpg_ctx *ctx = r->ctx;
  RCALL(mpg_ctx_group(ctx, "tp", &tp));
  mpg_status st = MPG_OK;
  float x[16] = {0};
  for (int i = 0; i < 4 && !st; i++) {
    if (mpg_all_reduce(tp, x, x, 16, MPG_F32, MPG_OP_SUM, NULL, NULL)) break;
    if (i == 2 && mpg_ctx_rank(ctx) == 3) sleep_s(1.5); /* past the 0.5 s timeout */
    st = mpg_all_reduce(dp, x, x, 16, MPG_F32, MPG_OP_SUM, NULL, NULL);
  }
  (void)mpg_all_reduce(dp, x, x, 16, MPG_F32, MPG_OP_SUM, NULL, NULL); /* no second dump */
  tl_ctx = NULL;
  (void)mpg_ctx_destroy(ctx); /* its status unchecked */
  r->ctx = NULL;
  return MPG_OK;
}

Test(trace, a_timeout_dumps_every_rank_once_with_the_operation_pending, .fini = cleanup) {
  fresh_dir("stall");
  (void)run_traced("dp=2,tp=2", 4, 0.5, stall, dir, 0);
  tr_rank t1, t3;
  read_rank(1, &t1);
  read_rank(3, &t3);
  cr_assert_str_eq(t1.reason, "MPG_ERR_TIMEOUT", "%s: %s", t1.reason, t1.message);
  cr_assert(strstr(t1.message, "rank 3"), "the message names the missing rank: %s", t1.message);
  /* Rank 1's last operation: dp #3, never completed when it dumped. */
  const tr_op *last = &t1.ops[t1.nops - 1];
  cr_assert_str_eq(t1.groups[last->group].name, "dp");
  cr_assert_eq(last->gseq, 3);
  cr_assert_str_eq(last->status, "pending");
  cr_assert_eq(last->end_ns, 0);
  cr_assert(t1.dump_ns - last->issue_ns > 400000000LL, "dumped after the timeout");
  /* Rank 3 issued dp #3 after waking: late by the sleep. */
  const tr_op *late = NULL;
  for (int i = 0; i < t3.nops; i++)
    if (!strcmp(t3.groups[t3.ops[i].group].name, "dp") && t3.ops[i].gseq == 3) late = &t3.ops[i];
  cr_assert(late, "rank 3 recorded its dp #3");
  cr_assert_gt(late->issue_ns - last->issue_ns, 1000000000LL);
  cr_assert_str_eq(t3.reason, "MPG_ERR_ABORTED", "%s", t3.reason);
  /* Once: the extra call after the failure did not write again. */
  int count3 = 0;
  for (int i = 0; i < t3.nops; i++) count3 += !strcmp(t3.groups[t3.ops[i].group].name, "dp");
  cr_assert_eq(count3, 3, "rank 3's dump was written at its first failure");
  cr_assert_neq(t1.job[0], 0);
  cr_assert_str_eq(t1.job, t3.job, "one job id on every rank");
  tr_rank_free(&t1);
  tr_rank_free(&t3);
}

Test(trace, no_directory_no_automatic_dump, .fini = cleanup) {
  fresh_dir("nodir");
  unsetenv("MESHPG_TRACE_DIR");
  (void)run_traced("dp=2,tp=2", 4, 0.5, stall, "", 0);
  struct stat sb;
  cr_assert_neq(stat(dir, &sb), 0, "nothing was written");
}

/* ---- the ring wraps; the switches ---- */

static mpg_status many(rr_rank *r) {
  const int *entries = r->arg;
  mpg_group *dp;
  RCALL(open_traced(r, NULL, entries, "dp", &dp));
  float x[4] = {0};
  for (int i = 0; i < 20; i++) RCALL(mpg_all_reduce(dp, x, x, 4, MPG_F32, MPG_OP_SUM, NULL, NULL));
  mpg_status st = mpg_ctx_trace_dump(r->ctx, dir);
  if (*entries < 0 || getenv("MESHPG_TRACE_ENTRIES"))
    RCHECK(st == MPG_ERR_STATE, "recording off: %s", mpg_status_name(st));
  else
    RCALL(st);
  return MPG_OK;
}

Test(trace, the_ring_keeps_the_last_operations, .fini = cleanup) {
  fresh_dir("wrap");
  int entries = 6; /* rounded up to 8 */
  run_traced("dp=2", 2, 30.0, many, &entries, 1);
  tr_rank t;
  read_rank(0, &t);
  cr_assert_eq(t.capacity, 8);
  cr_assert_eq(t.total, 20);
  cr_assert_eq(t.nops, 8);
  for (int i = 0; i < 8; i++) {
    cr_assert_eq(t.ops[i].seq, (uint64_t)(12 + i));
    cr_assert_eq(t.ops[i].gseq, (uint64_t)(13 + i));
  }
  tr_rank_free(&t);
}

Test(trace, recording_off_by_opts, .fini = cleanup) {
  fresh_dir("off");
  int entries = -1;
  run_traced("dp=2", 2, 30.0, many, &entries, 1);
}

Test(trace, recording_off_by_the_variable, .fini = cleanup) {
  fresh_dir("off-env");
  setenv("MESHPG_TRACE_ENTRIES", "0", 1);
  int entries = 0;
  run_traced("dp=2", 2, 30.0, many, &entries, 1);
  unsetenv("MESHPG_TRACE_ENTRIES");
}

static mpg_status just_create(const mpg_init_opts *o, void *arg) {
  (void)arg;
  mpg_ctx *ctx = NULL;
  mpg_status st = mpg_ctx_create(mesh, o, &ctx);
  mpg_ctx_destroy(ctx);
  return st;
}

Test(trace, a_bad_variable_is_refused, .fini = cleanup) {
  fresh_dir("bad");
  setenv("MESHPG_TRACE_ENTRIES", "many", 1);
  mesh = make_dims_mesh("dp=2");
  mpg_status st = mpg_thread_run(2, 30.0, just_create, NULL, NULL);
  cr_assert_eq(st, MPG_ERR_ENV);
  cr_assert(strstr(mpg_last_error(), "MESHPG_TRACE_ENTRIES"), "%s", mpg_last_error());
  unsetenv("MESHPG_TRACE_ENTRIES");
}

/* ---- the sync's buckets ---- */

/* Adds the params layer0.weight .. layer{n-1}.weight, count f32 each. */
static mpg_status add_layers(mpg_sync *s, int n, size_t count) {
  char name[32];
  for (int p = 0; p < n; p++) {
    int id;
    snprintf(name, sizeof name, "layer%d.weight", p);
    RCALL(mpg_sync_add_param(s, name, count, MPG_F32, NULL, &id));
  }
  return MPG_OK;
}

static mpg_status buckets(rr_rank *r) {
  RCALL(open_traced(r, NULL, NULL, NULL, NULL));
  mpg_ctx *ctx = r->ctx;
  mpg_sync_opts so = MPG_SYNC_OPTS_INIT;
  so.sync.bucket_mb = 0.001;
  so.sync.first_bucket_mb = 0.001;
  mpg_sync *s;
  RCALL(mpg_sync_create(ctx, &so, &s));
  RCALL(add_layers(s, 8, 300));
  RCALL(mpg_sync_commit(s));
  RCALL(mpg_sync_begin(s, 7, 1, NULL));
  for (int p = 7; p >= 0; p--) RCALL(mpg_sync_mark_ready(s, p));
  RCALL(mpg_sync_finish(s));
  RCALL(mpg_ctx_trace_dump(ctx, dir));
  RCALL(mpg_sync_destroy(s));
  return MPG_OK;
}

Test(trace, sync_buckets_carry_their_step_and_params, .fini = cleanup) {
  tr_rank t;
  run_and_read("sync", "dp=2", 30.0, buckets, 1, &t);
  int tagged = 0, seen[8] = {0};
  for (int i = 0; i < t.nops; i++) {
    const tr_op *op = &t.ops[i];
    if (op->bucket < 0) continue;
    tagged++;
    cr_assert_eq(op->step, 7);
    cr_assert(op->bucket < 8);
    seen[op->bucket]++;
    cr_assert(!strncmp(op->first, "layer", 5) && !strncmp(op->last, "layer", 5),
              "bucket %d: first \"%s\" last \"%s\"", op->bucket, op->first, op->last);
    cr_assert_str_eq(op->status, "ok");
  }
  cr_assert_geq(tagged, 2, "several buckets, each recorded (%d)", tagged);
  cr_assert_eq(seen[0], 1);
  tr_rank_free(&t);
}

/* ---- a dump while the rank records ---- */

typedef struct dumper {
  atomic_int stop;
  int dumps;
  mpg_ctx *ctx;
} dumper;

static void *dump_loop(void *arg) {
  dumper *d = arg;
  while (!atomic_load(&d->stop))
    if (mpg_ctx_trace_dump(d->ctx, dir) == MPG_OK) d->dumps++;
  return NULL;
}

static mpg_status busy(rr_rank *r) {
  static const int entries = 64;
  mpg_group *dp;
  RCALL(open_traced(r, NULL, &entries, "dp", &dp));
  mpg_ctx *ctx = r->ctx;
  mpg_status st = MPG_OK;
  dumper d = {.ctx = ctx};
  pthread_t th;
  int dumping = mpg_ctx_rank(ctx) == 0;
  if (dumping) RCHECK(!pthread_create(&th, NULL, dump_loop, &d), "pthread_create");
  float x[4] = {0};
  for (int i = 0; i < 3000 && !st; i++) st = mpg_all_reduce(dp, x, x, 4, MPG_F32, MPG_OP_SUM, NULL, NULL);
  if (dumping) {
    atomic_store(&d.stop, 1);
    pthread_join(th, NULL);
  }
  RCALL(st);
  RCHECK(!dumping || d.dumps > 0, "no dump while recording");
  return MPG_OK;
}

Test(trace, dumps_while_the_rank_records_are_whole, .fini = cleanup) {
  tr_rank t;
  run_and_read("busy", "dp=2", 60.0, busy, 0, &t);
  cr_assert_leq(t.nops, 64);
  for (int i = 1; i < t.nops; i++) cr_assert_eq(t.ops[i].seq, t.ops[i - 1].seq + 1);
  tr_rank_free(&t);
}
