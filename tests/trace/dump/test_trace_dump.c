/* Writing the flight recorder's dumps (groups/trace_dump.c; issue 45,
 * items 12 and 13): two threads dumping one context at once while a
 * reader parses every file it sees, symlinks planted where the writer
 * makes its temporary file, a dump directory over the limit, and the
 * round trip of names at and over the limits that writer and reader share
 * (groups/trace_format.h).  Thread ranks; suites 'trace' and 'groups' (so
 * that the TSan build runs them). */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "meshpg.h"
#include "mesh_util.h"
#include "rank_check.h"
#include "../trace_rank.h"
#include "../trace_test_util.h"
#include "trace_read.h"

static mpg_mesh *mesh;
static char dir[256];

static void fresh_dir(const char *name) { tt_fresh_dir(dir, sizeof dir, "trace-dump", name); }

static void cleanup(void) {
  tt_cleanup("trace-dump");
  mpg_mesh_destroy(mesh);
  mesh = NULL;
}

/* Files in dir whose name starts with prefix. */
static int count_prefix(const char *prefix) {
  char cmd[400];
  snprintf(cmd, sizeof cmd, "ls -a %s | grep -c '^%s' || true", dir, prefix);
  FILE *p = popen(cmd, "r");
  cr_assert_not_null(p);
  int n = -1;
  if (fscanf(p, "%d", &n) != 1) n = -1;
  pclose(p);
  return n;
}

/* ---- item 12: two writers on one rank ---- */

typedef struct writers {
  mpg_ctx *ctx;
  atomic_int stop;
  atomic_int ok, failed, read_ok, read_bad;
  char first_err[1024];
  atomic_flag err_set;
} writers;

static void *write_loop(void *arg) {
  writers *w = arg;
  while (!atomic_load(&w->stop)) {
    if (mpg_ctx_trace_dump(w->ctx, dir) == MPG_OK) {
      atomic_fetch_add(&w->ok, 1);
    } else {
      atomic_fetch_add(&w->failed, 1);
      if (!atomic_flag_test_and_set(&w->err_set))
        snprintf(w->first_err, sizeof w->first_err, "%s", mpg_last_error());
    }
  }
  return NULL;
}

static void *read_loop(void *arg) {
  writers *w = arg;
  char path[400], err[600];
  snprintf(path, sizeof path, "%s/rank-%d.trace", dir, mpg_ctx_rank(w->ctx));
  while (!atomic_load(&w->stop)) {
    tr_rank t;
    if (access(path, F_OK)) continue; /* not written yet */
    if (tr_read_file(path, &t, err, sizeof err) == 0) {
      atomic_fetch_add(&w->read_ok, 1);
    } else {
      atomic_fetch_add(&w->read_bad, 1);
      if (!atomic_flag_test_and_set(&w->err_set))
        snprintf(w->first_err, sizeof w->first_err, "reader: %s", err);
    }
    tr_rank_free(&t);
  }
  return NULL;
}

static mpg_status two_writers(const mpg_init_opts *o, void *arg) {
  double seconds = *(const double *)arg;
  mpg_init_opts opts = *o;
  opts.trace_entries = 256;
  mpg_ctx *ctx;
  mpg_group *dp;
  float x[16] = {0};
  mpg_status st = tt_open_ops(&opts, mesh, &ctx, "dp", &dp, 300, x, 16);
  if (st) return st;
  writers w = {.ctx = ctx, .err_set = ATOMIC_FLAG_INIT};
  pthread_t th[3];
  for (int i = 0; i < 2; i++) RCHECK(!pthread_create(&th[i], NULL, write_loop, &w), "pthread_create");
  RCHECK(!pthread_create(&th[2], NULL, read_loop, &w), "pthread_create");
  double end = now_s() + seconds;
  /* This thread records meanwhile, as a training loop would; rank 0's
   * clock says when to stop (x[0], the maximum: every rank issues the same
   * number of all-reduces). */
  for (int done = 0; !done && !st;) {
    x[0] = mpg_ctx_rank(ctx) == 0 && now_s() >= end;
    st = mpg_all_reduce(dp, x, x, 16, MPG_F32, MPG_OP_MAX, NULL, NULL);
    done = x[0] > 0;
  }
  atomic_store(&w.stop, 1);
  for (int i = 0; i < 3; i++) pthread_join(th[i], NULL);
  RCALL(st);
  RCHECK(atomic_load(&w.failed) == 0 && atomic_load(&w.read_bad) == 0,
         "%d of %d dumps failed, %d of %d reads found a bad file; first: %s",
         atomic_load(&w.failed), atomic_load(&w.failed) + atomic_load(&w.ok),
         atomic_load(&w.read_bad), atomic_load(&w.read_bad) + atomic_load(&w.read_ok),
         w.first_err);
  RCHECK(atomic_load(&w.ok) >= 4 && atomic_load(&w.read_ok) >= 1, "%d dumps, %d reads",
         atomic_load(&w.ok), atomic_load(&w.read_ok));
  fprintf(stderr, "two_writers_on_one_rank: rank %d: %d dumps, %d whole reads\n",
          mpg_ctx_rank(ctx), atomic_load(&w.ok), atomic_load(&w.read_ok));
  return tt_close(ctx);
}

Test(trace_dump, two_writers_on_one_rank, .fini = cleanup, .timeout = 120) {
  fresh_dir("writers");
  mesh = make_dims_mesh("dp=2");
  double seconds = 1.5;
  EXPECT_RUN_OK(mpg_thread_run(2, 60.0, two_writers, &seconds, NULL));
  /* Every temporary file was renamed or removed. */
  cr_expect_eq(count_prefix("\\.rank-"), 0, "temporary files left in %s", dir);
  for (int r = 0; r < 2; r++) {
    char path[400], err[600];
    snprintf(path, sizeof path, "%s/rank-%d.trace", dir, r);
    tr_rank t;
    cr_expect_eq(tr_read_file(path, &t, err, sizeof err), 0, "%s", err);
    tr_rank_free(&t);
  }
}

/* ---- item 12: a symlink at the temporary name ---- */

typedef struct dump_arg {
  const char *dir;
  mpg_status st;
  char msg[600];
} dump_arg;

static mpg_status dump_once(const mpg_init_opts *o, void *arg) {
  dump_arg *d = arg;
  mpg_ctx *ctx;
  mpg_group *dp;
  float x[4] = {0};
  mpg_status st = tt_open_ops(o, mesh, &ctx, "dp", &dp, 1, x, 4);
  if (st) return st;
  if (mpg_ctx_rank(ctx) == 0) {
    d->st = mpg_ctx_trace_dump(ctx, d->dir);
    snprintf(d->msg, sizeof d->msg, "%s", d->st ? mpg_last_error() : "");
  }
  return tt_close(ctx);
}

/* Writes put into path, or (put NULL) reads path into got[0..cap). */
static void file_io(const char *path, const char *put, char *got, size_t cap) {
  FILE *f = fopen(path, put ? "w" : "r");
  cr_assert_not_null(f, "%s: %s", path, strerror(errno));
  if (put) fputs(put, f);
  else got[fread(got, 1, cap - 1, f)] = '\0';
  fclose(f);
}

static void put_file(const char *path, const char *text) { file_io(path, text, NULL, 0); }

static void expect_file(const char *path, const char *text) {
  char buf[256] = "";
  file_io(path, NULL, buf, sizeof buf);
  cr_expect_str_eq(buf, text, "%s was written through a symlink", path);
}

Test(trace_dump, symlink_at_temp_name, .fini = cleanup, .timeout = 60) {
  fresh_dir("symlink");
  char victim[400], other[400], link[400];
  snprintf(victim, sizeof victim, "%s.victim", dir);
  snprintf(other, sizeof other, "%s.other", dir);
  put_file(victim, "precious\n");
  put_file(other, "also precious\n");
  /* The old temporary name, the final name, and names of the new temporary
   * files' pattern (this process's pid, the first counter values). */
  snprintf(link, sizeof link, "%s/.rank-0.trace.tmp", dir);
  cr_assert_eq(symlink(victim, link), 0);
  for (int n = 0; n < 8; n++) {
    snprintf(link, sizeof link, "%s/.rank-0.trace.%ld.%d.00000000", dir, (long)getpid(), n);
    cr_assert_eq(symlink(victim, link), 0);
  }
  snprintf(link, sizeof link, "%s/rank-0.trace", dir);
  cr_assert_eq(symlink(other, link), 0);
  mesh = make_dims_mesh("dp=2");
  dump_arg d = {dir, MPG_OK, ""};
  for (int i = 0; i < 3; i++) {
    EXPECT_RUN_OK(mpg_thread_run(2, 30.0, dump_once, &d, NULL));
    cr_assert_eq(d.st, MPG_OK, "%s", d.msg);
  }
  expect_file(victim, "precious\n");
  expect_file(other, "also precious\n");
  struct stat st;
  cr_assert_eq(lstat(link, &st), 0);
  cr_expect(S_ISREG(st.st_mode), "rank-0.trace is the dump, not the planted symlink");
  tr_rank t;
  char err[600];
  cr_expect_eq(tr_read_file(link, &t, err, sizeof err), 0, "%s", err);
  tr_rank_free(&t);
  unlink(victim);
  unlink(other);
}

/* ---- item 12: a dump directory over the limit ---- */

Test(trace_dump, too_long_dump_path, .fini = cleanup, .timeout = 60) {
  fresh_dir("long");
  mesh = make_dims_mesh("dp=2");
  /* Exactly MPG__TRACE_DIR_MAX bytes: written, at that path. */
  char at[MPG__TRACE_DIR_MAX + 1], over[1414];
  size_t len = (size_t)snprintf(at, sizeof at, "%s", dir);
  while (MPG__TRACE_DIR_MAX - len > 250) { /* components of 200 bytes, made here */
    at[len++] = '/';
    memset(at + len, 'd', 200);
    len += 200;
    at[len] = '\0';
    cr_assert_eq(mkdir(at, 0777), 0, "%s", strerror(errno));
  }
  at[len++] = '/'; /* the last (50 to 250 bytes): the writer makes it */
  memset(at + len, 'e', MPG__TRACE_DIR_MAX - len);
  at[MPG__TRACE_DIR_MAX] = '\0';
  cr_assert_eq(strlen(at), MPG__TRACE_DIR_MAX);
  dump_arg d = {at, MPG_OK, ""};
  EXPECT_RUN_OK(mpg_thread_run(2, 30.0, dump_once, &d, NULL));
  cr_assert_eq(d.st, MPG_OK, "a directory of %d bytes: %s", MPG__TRACE_DIR_MAX, d.msg);
  char path[MPG__TRACE_DIR_MAX + 32];
  snprintf(path, sizeof path, "%s/rank-0.trace", at);
  cr_expect_eq(access(path, R_OK), 0, "the dump is at the full path");
  /* 1,413 bytes (the issue's): refused, naming the limit. */
  memset(over, 'o', sizeof over - 1);
  over[sizeof over - 1] = '\0';
  memcpy(over, dir, strlen(dir));
  over[strlen(dir)] = '/';
  d = (dump_arg){over, MPG_OK, ""};
  EXPECT_RUN_OK(mpg_thread_run(2, 30.0, dump_once, &d, NULL));
  cr_expect_eq(d.st, MPG_ERR_INVALID, "%s", mpg_status_name(d.st));
  cr_expect(strstr(d.msg, "1413 bytes") && strstr(d.msg, "1023"), "message: %s", d.msg);
  cr_expect_eq(count_prefix("o"), 0, "nothing written for the refused directory");
}

/* ---- item 13: writer and reader limits, round trip ---- */

#define NPARAMS 24

typedef struct names_arg {
  char names[NPARAMS][400];
} names_arg;

static mpg_status sync_names(const mpg_init_opts *o, void *arg) {
  names_arg *na = arg;
  mpg_init_opts opts = *o;
  opts.trace_dir = dir;
  mpg_ctx *ctx;
  mpg_status st = tt_open_ops(&opts, mesh, &ctx, NULL, NULL, 0, NULL, 0);
  if (st) return st;
  mpg_sync_opts so = MPG_SYNC_OPTS_INIT;
  so.sync.bucket_mb = 0.0005;
  so.sync.first_bucket_mb = 0.0005;
  mpg_sync *s;
  RCALL(mpg_sync_create(ctx, &so, &s));
  for (int p = 0; p < NPARAMS; p++) {
    int id;
    RCALL(mpg_sync_add_param(s, na->names[p], 200, MPG_F32, NULL, &id));
  }
  RCALL(mpg_sync_commit(s));
  RCALL(mpg_sync_begin(s, 1, 1, NULL));
  for (int p = NPARAMS - 1; p >= 0; p--) RCALL(mpg_sync_mark_ready(s, p));
  RCALL(mpg_sync_finish(s));
  RCALL(mpg_ctx_trace_dump(ctx, dir));
  RCALL(mpg_sync_destroy(s));
  return tt_close(ctx);
}

/* name cut as the writer cuts it: at most MPG__TRACE_NAME_MAX bytes, not
 * inside a UTF-8 character. */
static void cut(const char *name, char *out) {
  size_t n = strlen(name);
  if (n > MPG__TRACE_NAME_MAX) {
    n = MPG__TRACE_NAME_MAX;
    while (n > 0 && ((unsigned char)name[n] & 0xC0) == 0x80) n--;
  }
  memcpy(out, name, n);
  out[n] = '\0';
}

/* A header with MESH of mesh_len bytes, MESSAGE of msg_len and one group
 * and op whose names are name_len bytes: parsed or not. */
static int parse_at(size_t mesh_len, size_t msg_len, size_t name_len, char *err, size_t cap) {
  size_t big = 3 * (mesh_len + msg_len + 3 * name_len) + 1024;
  char *buf = malloc(big), *m = malloc(mesh_len + 1), *g = malloc(msg_len + 1),
       *nm = malloc(name_len + 1);
  cr_assert(buf && m && g && nm);
  memset(m, 'm', mesh_len);
  m[mesh_len] = '\0';
  for (size_t i = 0; i < msg_len; i++) g[i] = i % 7 == 3 ? 'x' : 'e';
  g[msg_len] = '\0';
  memset(nm, 'n', name_len);
  nm[name_len] = '\0';
  int n = snprintf(buf, big,
                   "meshpg-trace 1\nrank 0 2\nprocess %s 7\nbackend thread\nmesh %s\n"
                   "job 00000000000000aa\nclock 100\nreason MPG_ERR_TIMEOUT %s\nring 4 1\n"
                   "group 0 %s 0 0 2 0,1\n"
                   "op 0 0 1 all_reduce f32 4 -1 0 0 10 11 12 ok %s %s\nend 1\n",
                   nm, m, g, nm, nm, nm);
  tr_rank r;
  int rc = tr_parse(buf, (size_t)n, &r, err, cap);
  if (!rc) {
    cr_expect_eq(strlen(r.mesh), mesh_len);
    cr_expect_eq(strlen(r.message), msg_len);
    cr_expect_str_eq(r.groups[0].name, nm);
    cr_expect_str_eq(r.ops[0].first, nm);
    cr_expect_str_eq(r.host, nm);
  }
  tr_rank_free(&r);
  free(buf);
  free(m);
  free(g);
  free(nm);
  return rc;
}

Test(trace_dump, writer_and_reader_limits_round_trip, .fini = cleanup, .timeout = 120) {
  /* The reader: every field at its limit parses, one byte more is refused
   * with a message naming the limit. */
  char err[600];
  cr_expect_eq(parse_at(MPG__TRACE_MESH_MAX, MPG__TRACE_MESSAGE_MAX, MPG__TRACE_NAME_MAX, err,
                        sizeof err), 0, "at the limits: %s", err);
  cr_expect_eq(parse_at(271, 10, 133, err, sizeof err), 0, "the issue's 271 and 133: %s", err);
  cr_expect_eq(parse_at(MPG__TRACE_MESH_MAX + 1, 1, 1, err, sizeof err), -1);
  cr_expect(strstr(err, "MESH") && strstr(err, "longer than 1023"), "%s", err);
  cr_expect_eq(parse_at(1, MPG__TRACE_MESSAGE_MAX + 1, 1, err, sizeof err), -1);
  cr_expect(strstr(err, "MESSAGE") && strstr(err, "longer than 4095"), "%s", err);
  cr_expect_eq(parse_at(1, 1, MPG__TRACE_NAME_MAX + 1, err, sizeof err), -1);
  cr_expect(strstr(err, "longer than 255"), "%s", err);

  /* The writer: parameter names of random bytes and lengths around the
   * limit, through a real sync step, read back as written (cut at the
   * limit at a character boundary), over several seeds. */
  mesh = make_dims_mesh("dp=2");
  for (unsigned seed = 1; seed <= 3; seed++) {
    fresh_dir("limits");
    static names_arg na;
    srand(seed);
    for (int p = 0; p < NPARAMS; p++) {
      size_t len = p == 0   ? MPG__TRACE_NAME_MAX
                   : p == 1 ? MPG__TRACE_NAME_MAX + 2
                   : p == 2 ? 133
                   : p == 3 ? 1
                            : 1 + (size_t)rand() % (sizeof na.names[p] - 2);
      /* Random bytes 1..255 after a first byte that tells the names
       * apart; "-" (written %2D) for p 3. */
      na.names[p][0] = p == 3 ? '-' : (char)('A' + p);
      for (size_t i = 1; i < len; i++) na.names[p][i] = (char)(1 + rand() % 255);
      na.names[p][len] = '\0';
      /* A multi-byte character across the limit. */
      if (p == 1) memcpy(na.names[p] + MPG__TRACE_NAME_MAX - 1, "\xE2\x82\xAC", 3);
    }
    EXPECT_RUN_OK(mpg_thread_run(2, 30.0, sync_names, &na, NULL));
    for (int r = 0; r < 2; r++) {
      char path[400];
      snprintf(path, sizeof path, "%s/rank-%d.trace", dir, r);
      tr_rank t;
      cr_assert_eq(tr_read_file(path, &t, err, sizeof err), 0, "seed %u: %s", seed, err);
      int seen[NPARAMS] = {0}, tagged = 0;
      for (int k = 0; k < t.nops; k++) {
        const tr_op *op = &t.ops[k];
        if (op->bucket < 0) continue;
        tagged++;
        int found = 0;
        for (int p = 0; p < NPARAMS && !found; p++) {
          char want[TR_NAME];
          cut(na.names[p], want);
          if (!strcmp(op->first, want)) seen[p] = found = 1;
        }
        cr_expect(found, "seed %u: FIRST \"%.40s...\" (%zu bytes) is none of the names", seed,
                  op->first, strlen(op->first));
      }
      cr_expect_gt(tagged, 1);
      cr_expect(seen[0] && seen[1] && seen[2] && seen[3],
                "seed %u: the names at, over and under the limit were read back", seed);
      tr_rank_free(&t);
    }
  }
}

/* ---- issue 46, item 2: a rank that ends normally writes its record ---- */

#define END_RANKS 4
#define END_OPS 5

/* Each rank: END_OPS all-reduces on dp (rank `skipper` skips the last
 * one, so that its peer times out), then mpg_ctx_destroy, with a trace
 * directory set and no dump requested. */
static mpg_status ops_then_end(const mpg_init_opts *o, void *arg) {
  int skipper = *(const int *)arg;
  mpg_init_opts opts = *o;
  opts.trace_dir = dir;
  mpg_ctx *ctx;
  mpg_group *dp;
  mpg_status st = rank_open(&opts, mesh, &ctx, "dp", &dp);
  if (st) return st;
  int me = mpg_ctx_rank(ctx);
  float x[8] = {0};
  for (int i = 0; i < END_OPS && !st; i++) {
    if (me == skipper && i == END_OPS - 1) break;
    st = mpg_all_reduce(dp, x, x, 8, MPG_F32, MPG_OP_SUM, NULL, NULL);
  }
  if (skipper < 0) RCALL(st);
  return tt_close(ctx);
}

/* rank-R.trace of dir, parsed (asserts). */
static void read_rank(int r, tr_rank *t) {
  char path[400], err[600];
  snprintf(path, sizeof path, "%s/rank-%d.trace", dir, r);
  cr_assert_eq(access(path, F_OK), 0, "rank %d left no file at %s", r, path);
  cr_assert_eq(tr_read_file(path, t, err, sizeof err), 0, "%s", err);
}

Test(trace_dump, rank_that_ends_normally_writes_its_record, .fini = cleanup, .timeout = 60) {
  fresh_dir("end");
  mesh = make_dims_mesh("dp=2,tp=2");
  int skipper = -1;
  EXPECT_RUN_OK(mpg_thread_run(END_RANKS, 30.0, ops_then_end, &skipper, NULL));
  for (int r = 0; r < END_RANKS; r++) {
    tr_rank t;
    read_rank(r, &t);
    cr_expect_str_eq(t.reason, "end", "rank %d", r);
    cr_expect_str_eq(t.message, "", "rank %d", r);
    int dp_ops = 0;
    for (int k = 0; k < t.nops; k++) {
      const tr_op *op = &t.ops[k];
      const tr_group *g = &t.groups[op->group];
      if (strcmp(g->name, "dp") || strcmp(op->kind, "all_reduce")) continue;
      dp_ops++;
      cr_expect_str_eq(op->status, "ok", "rank %d: dp all_reduce #%llu", r,
                       (unsigned long long)op->gseq);
    }
    cr_expect_eq(dp_ops, END_OPS, "rank %d recorded %d dp all-reduces", r, dp_ops);
    tr_rank_free(&t);
  }
}

/* A rank that dumped for a fault keeps that dump: destroy does not replace
 * it with "end". */
Test(trace_dump, fault_dump_is_kept_at_the_end, .fini = cleanup, .timeout = 60) {
  fresh_dir("keep");
  mesh = make_dims_mesh("dp=2");
  int skipper = 1;
  mpg_status st[2];
  mpg_thread_run(2, 0.3, ops_then_end, &skipper, st);
  tr_rank t;
  read_rank(0, &t);
  cr_expect_str_eq(t.reason, "MPG_ERR_TIMEOUT", "rank 0's fault dump was replaced: %s %s",
                   t.reason, t.message);
  tr_rank_free(&t);
  read_rank(1, &t);
  int dp_ops = 0;
  for (int k = 0; k < t.nops; k++) dp_ops += !strcmp(t.ops[k].kind, "all_reduce");
  cr_expect_eq(dp_ops, END_OPS - 1, "rank 1 (the skipper) recorded %d all-reduces", dp_ops);
  tr_rank_free(&t);
}
