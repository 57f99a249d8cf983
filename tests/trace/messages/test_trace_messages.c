/* Issue 46, item 4: one numbering and the mesh's names in every message.
 * A failing operation's message names it as the flight recorder's report
 * does: "all_reduce #8 on tp[1]" (#8: its GSEQ in the dump, collectives
 * numbered from 1 per group instance), never the backend's own split name
 * ("world/s1c1") or counter, and every world rank is labelled as one
 * ("world rank 3", "position 1 (world rank 3)").  Thread ranks, mesh
 * dp=2,tp=2 (tp[1] = world ranks 2 and 3): world rank 2 skips its 8th tp
 * all-reduce (its peer times out), or calls it with twice the count (the
 * thread backend finds the mismatch).  Built again as
 * test_trace_messages_on_double (TM_ON_DOUBLE): the nccl backend on the
 * CUDA/NCCL test double, ranks as threads, the skip only (NCCL does not
 * compare counts). */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "meshpg.h"
#include "mesh_util.h"
#include "mpirun_util.h"
#include "rank_check.h"
#include "time_bound.h"
#include "../trace_test_util.h"
#include "trace_read.h"

#ifdef TM_ON_DOUBLE
#include "../../double/on_double.h" /* nccl_thread_run */
#endif

#define NRANKS 4
#define NOPS 8    /* tp all-reduces each rank issues */
#define BAD_OP 8  /* the one rank 2 skips or changes (1-based) */
#define MSG 4096

enum { SKIP, COUNT };

typedef struct job {
  int mode;
  char dir[256];
  mpg_mesh *mesh;
  mpg_status st[NRANKS];
  char msg[NRANKS][MSG];
} job;

static mpg_status rank_main(const mpg_init_opts *in, void *arg) {
  job *J = arg;
  mpg_init_opts opts = *in;
  opts.trace_dir = J->dir;
  int rank = opts.rank;
  mpg_ctx *ctx = NULL;
  mpg_group *tp = NULL, *world = NULL;
  mpg_status st = mpg_ctx_create(J->mesh, &opts, &ctx);
  if (!st) st = mpg_ctx_group(ctx, "tp", &tp);
  if (!st) st = mpg_ctx_group(ctx, "world", &world);
  float host[8] = {0}, *buf = host;
  void *stream = NULL;
#ifdef TM_ON_DOUBLE
  void *dev = NULL;
  if (!st) st = mpg_ctx_stream_create(ctx, &stream);
  if (!st) st = mpg_ctx_mem_alloc(ctx, sizeof host, 0, &dev);
  if (!st) buf = dev;
#endif
  for (int i = 1; !st && i <= NOPS; i++) {
    size_t count = 4;
    if (rank == 2 && i == BAD_OP) {
      if (J->mode == SKIP) continue;
      count = 8;
    }
    st = mpg_all_reduce(tp, buf, buf, count, MPG_F32, MPG_OP_SUM, stream, NULL);
  }
  if (!st) st = mpg_barrier(world, NULL);
  J->st[rank] = st;
  snprintf(J->msg[rank], MSG, "%s", st ? mpg_last_error() : "");
#ifdef TM_ON_DOUBLE
  if (ctx) {
    (void)mpg_ctx_mem_free(ctx, dev);
    (void)mpg_ctx_stream_destroy(ctx, stream);
  }
#endif
  if (ctx) mpg_ctx_destroy(ctx);
  return MPG_OK;
}


/* The GSEQ of the failed all-reduce (status not ok) on tp in rank's dump. */
static uint64_t failed_gseq(const char *dir, int rank, char *group, size_t cap) {
  char path[400], err[600];
  snprintf(path, sizeof path, "%s/rank-%d.trace", dir, rank);
  tr_rank t;
  cr_assert_eq(tr_read_file(path, &t, err, sizeof err), 0, "%s", err);
  uint64_t gseq = 0;
  for (int i = 0; i < t.nops; i++) {
    const tr_op *op = &t.ops[i];
    if (strcmp(op->kind, "all_reduce") || !strcmp(op->status, "ok")) continue;
    const tr_group *g = &t.groups[op->group];
    snprintf(group, cap, "%s[%d]", g->name, g->index);
    gseq = op->gseq;
    break;
  }
  tr_rank_free(&t);
  return gseq;
}

static void run_job(job *J, const char *name) {
  setenv("MESHPG_CHECK_ORDER", "0", 1); /* the backend finds it, not the checker */
  tt_fresh_dir(J->dir, sizeof J->dir, "trace-msg", name);
  cr_assert_eq(mesh_build("dp=2,tp=2", NULL, NRANKS, &J->mesh), MPG_OK, "%s",
               mpg_last_error());
  double timeout = 0.5 * tb_sanitizer_factor();
#ifndef TM_ON_DOUBLE
  (void)mpg_thread_run(NRANKS, timeout, rank_main, J, NULL);
#else
  nccl_thread_run(NRANKS, timeout, rank_main, J); /* one process: a device each */
#endif
  mpg_mesh_destroy(J->mesh);
}

/* rank's message names the operation as its dump does, no split name, and
 * labels world ranks. */
static void expect_named(const job *J, int rank, mpg_status want) {
  const char *m = J->msg[rank];
  cr_expect_eq(J->st[rank], want, "rank %d: %s (%s)", rank, mpg_status_name(J->st[rank]), m);
  char group[300], label[400];
  uint64_t gseq = failed_gseq(J->dir, rank, group, sizeof group);
  cr_expect_eq(gseq, BAD_OP, "rank %d's dump: the failed all-reduce is #%" PRIu64, rank, gseq);
  snprintf(label, sizeof label, "all_reduce #%" PRIu64 " on %s", gseq, group);
  cr_expect_str_eq(group, "tp[1]");
  cr_expect(strstr(m, label) != NULL, "rank %d's message does not name \"%s\": %s", rank,
            label, m);
  cr_expect(strstr(m, "/s1c") == NULL && strstr(m, "/s0c") == NULL,
            "rank %d's message names a split: %s", rank, m);
  cr_expect(strstr(m, "world rank") != NULL, "rank %d's message labels no world rank: %s",
            rank, m);
  cr_expect(strstr(m, "(rank ") == NULL, "rank %d's message has an unlabelled rank: %s",
            rank, m);
}

static void log_job(const job *J, const char *what) {
  for (int r = 0; r < NRANKS; r++)
    cr_log_info("%s rank %d: %s: %s", what, r, mpg_status_name(J->st[r]), J->msg[r]);
}

#ifdef TM_ON_DOUBLE
/* nccl (the double): world rank 2 skips its 8th tp all-reduce; world rank
 * 3's times out, named as the report names it. */
Test(trace_messages_nccl, numbers_and_names_match_the_report, .timeout = 120) {
  job *J = calloc(1, sizeof *J);
  cr_assert_not_null(J);
  J->mode = SKIP;
  run_job(J, "nccl-skip");
  log_job(J, "nccl skip");
  expect_named(J, 3, MPG_ERR_TIMEOUT);
  cr_expect(strstr(J->msg[3], "position 0, the other member") != NULL,
            "the missing member of two is not named: %s", J->msg[3]);
  free(J);
  tt_cleanup("trace-msg");
}
#else
Test(trace_messages, numbers_and_names_match_the_report, .timeout = 120) {
  job *J = calloc(2, sizeof *J);
  cr_assert_not_null(J);
  /* World rank 2 skips its 8th tp all-reduce: world rank 3 times out. */
  J[0].mode = SKIP;
  run_job(&J[0], "skip");
  expect_named(&J[0], 3, MPG_ERR_TIMEOUT);
  cr_expect(strstr(J[0].msg[3], "position 0 (world rank 2)") != NULL,
            "the missing member is not named: %s", J[0].msg[3]);
  /* World rank 2 calls it with count 8: both members see the mismatch. */
  J[1].mode = COUNT;
  run_job(&J[1], "count");
  expect_named(&J[1], 2, MPG_ERR_INVALID);
  expect_named(&J[1], 3, MPG_ERR_INVALID);
  log_job(&J[0], "skip");
  log_job(&J[1], "count");
  free(J);
  tt_cleanup("trace-msg");
}

/* The same skip on real MPI processes (mpirun -np 4): world rank 3's
 * timeout in MPI's own all-reduce names all_reduce #8 on tp[1] and, the
 * group having two members, the other one as missing. */
Test(trace_messages_mpi, numbers_and_names_match_the_report, .timeout = 120) {
  const char *worker = getenv("MESHPG_TMSG_MPI_WORKER");
  if (!worker) cr_skip_test("built without MPI");
  job *J = calloc(1, sizeof *J);
  cr_assert_not_null(J);
  tt_fresh_dir(J->dir, sizeof J->dir, "trace-msg", "mpi-skip");
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "timeout -k 5 100 " MPIRUN "-np %d '%s' '%s' %g", NRANKS, worker,
           J->dir, 0.5 * tb_sanitizer_factor());
  cr_assert_eq(run(cmd, NULL), 0, "%s", out);
  for (int r = 0; r < NRANKS; r++) {
    char key[32], name[40];
    snprintf(key, sizeof key, "TMSG %d ", r);
    const char *line = strstr(out, key);
    cr_assert_not_null(line, "no line of rank %d:\n%s", r, out);
    line += strlen(key);
    const char *bar = strchr(line, '|'), *eol = strchr(line, '\n');
    cr_assert(bar && (!eol || bar < eol), "%s", out);
    snprintf(name, sizeof name, "%.*s", (int)(bar - line) < 39 ? (int)(bar - line) : 39, line);
    J->st[r] = strcmp(name, "OK") == 0 ? MPG_OK : MPG_ERR_BACKEND;
    if (!strcmp(name, "ERR_TIMEOUT")) J->st[r] = MPG_ERR_TIMEOUT;
    snprintf(J->msg[r], MSG, "%.*s", eol ? (int)(eol - bar - 1) : MSG - 1, bar + 1);
  }
  log_job(J, "mpi skip");
  expect_named(J, 3, MPG_ERR_TIMEOUT);
  cr_expect(strstr(J->msg[3], "did not arrive: position 0, the other member") != NULL,
            "the missing member of two is not named: %s", J->msg[3]);
  cr_expect(strstr(J->msg[3], "MPI does not say") == NULL, "%s", J->msg[3]);
  free(J);
  tt_cleanup("trace-msg");
}
#endif
