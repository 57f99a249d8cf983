/* Fault injection for the flight recorder (fault_trace.h): one rank's
 * training loop and its fault. */
#include "fault_trace.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define TF_PARAMS 6
#define TF_A2A 16  /* elements per peer */
#define TF_P2P 32
#define TF_TPMAX 64

/* p0..p5: bucket 0 = p5 + p4 (256), 1 = p3 + p2 (320), 2 = p1 + p0 (384);
 * a cap of 384 floats. */
static const size_t param_count[TF_PARAMS] = {128, 256, 128, 192, 128, 128};
#define TF_BUCKET_MB (384.0 * 4.0 / 1048576.0)

typedef struct rk {
  const tf_case *c;
  int rank, stage, victim;
  mpg_ctx *ctx;
  mpg_sync *s;
  mpg_group *tp, *dp, *pp;
  void *stream;
  void *tpbuf, *a2s, *a2r, *p2p;
  int twice; /* TF_COUNT: this tp all-reduce with twice its count */
  double timeout_s, hang_s; /* from the warm-up step (tf_rank_run) */
  tf_outcome *out;
} rk;

static void sleep_s(double s) {
  struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  while (nanosleep(&ts, &ts) != 0) {
  }
}

static size_t tp_count(const rk *R, int which) {
  size_t n = which == 2 && R->c->backend == TF_THREAD ? 48 : TF_TPMAX;
  return R->twice ? 2 * n : n;
}

static double mono_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Has a rank other than `victim` dumped a failure into dir (a dump whose
 * reason is neither "request" nor "end")?  The header's reason line is
 * within its first kilobyte; a dump appears whole (renamed into place). */
static int failure_dumped(const char *dir, int victim) {
  for (int r = 0; r < TF_WORLD; r++) {
    if (r == victim) continue;
    char path[700], head[1024];
    snprintf(path, sizeof path, "%s/rank-%d.trace", dir, r);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    ssize_t n = read(fd, head, sizeof head - 1);
    close(fd);
    if (n <= 0) continue;
    head[n] = '\0';
    const char *why = strstr(head, "\nreason ");
    if (why && strncmp(why + 8, "request", 7) && strncmp(why + 8, "end", 3)) return 1;
  }
  return 0;
}

/* The hang: `s` seconds (past the timeout), then on until another rank's
 * failure dump is in the case's directory, so that the victim resumes
 * after the others failed however late a loaded machine let them time out
 * (issue 46, item 8: a fixed 0.6 s margin was luck); at most 10 timeouts
 * more (a hang no peer waits for). */
static void hang(const rk *R, double s) {
  sleep_s(s);
  double give_up = mono_s() + 10 * R->timeout_s;
  while (!failure_dumped(R->c->dir, R->rank) && mono_s() < give_up) sleep_s(0.005);
}

/* Keep the first error and where it happened. */
static mpg_status failed(rk *R, mpg_status st, int step, int slot, const char *what) {
  if (st == MPG_OK || R->out->status != MPG_OK) return st;
  R->out->status = st;
  R->out->step = step;
  R->out->slot = slot;
  snprintf(R->out->what, sizeof R->out->what, "%s", what);
  snprintf(R->out->message, sizeof R->out->message, "%s", mpg_last_error());
  return st;
}

/* Mark the params of bucket b ready: the first, then (after `pause`
 * seconds, the hang) the last, which launches it. */
static mpg_status bucket(rk *R, int b, double pause) {
  int first = 5 - 2 * b, last = 4 - 2 * b;
  mpg_status st = mpg_sync_mark_ready(R->s, first);
  if (pause > 0) {
    R->out->injected = 1;
    hang(R, pause);
  }
  if (!st) st = mpg_sync_mark_ready(R->s, last);
  return st;
}

/* Issue slot k of this rank's stage (pause: a hang before it). */
static mpg_status slot(rk *R, int step, int k, double pause) {
  tf_slot s = tf_slot_of(R->stage, k);
  char what[64];
  tf_slot_name(R->stage, k, what, sizeof what);
  int peer = 1 - mpg_group_position(R->pp);
  mpg_status st;
  if (s.op == TO_BUCKET) return failed(R, bucket(R, s.arg, pause), step, k, what);
  if (pause > 0) {
    R->out->injected = 1;
    hang(R, pause);
  }
  switch (s.op) {
    case TO_TP:
      st = mpg_all_reduce(R->tp, R->tpbuf, R->tpbuf, tp_count(R, s.arg), MPG_F32, MPG_OP_SUM,
                          R->stream, NULL);
      break;
    case TO_A2A:
      st = mpg_all_to_all(R->dp, R->a2s, R->a2r, TF_A2A, MPG_F32, R->stream, NULL);
      break;
    case TO_SEND:
      st = mpg_send(R->pp, R->p2p, TF_P2P, MPG_F32, peer, R->stream, NULL);
      break;
    default:
      st = mpg_recv(R->pp, R->p2p, TF_P2P, MPG_F32, peer, R->stream, NULL);
      break;
  }
  return failed(R, st, step, k, what);
}

/* One step; the first error stops it. */
static mpg_status step_run(rk *R, int step) {
  const tf_case *c = R->c;
  int here = R->victim && step == c->step;
  /* A loaded stage, in the warm-up and the step after it: slow_s before
   * each slot of its work between its receive and its send (1 to 6). */
  int slow_k0 = 1, slow_k1 = 6;
  mpg_status st = failed(R, mpg_sync_begin(R->s, step, 1, R->stream), step, -1, "mpg_sync_begin");
  for (int k = 0; k < TF_SLOTS && !st; k++) {
    double slow = step <= 1 && R->stage == 1 && k >= slow_k0 && k <= slow_k1 ? c->slow_s : 0;
    if (c->compute_s + slow > 0) sleep_s(c->compute_s + slow);
    if (here && k == c->slot) {
      if (c->kind == TF_SKIP) {
        R->out->injected = 1;
        continue;
      }
      if (c->kind == TF_SWAP) {
        R->out->injected = 1;
        st = slot(R, step, k + 1, 0);
        if (!st) st = slot(R, step, k, 0);
        k++;
        continue;
      }
      if (c->kind == TF_COUNT) {
        R->out->injected = 1;
        R->twice = 1;
        st = slot(R, step, k, 0);
        R->twice = 0;
        continue;
      }
      st = slot(R, step, k, R->hang_s);
      continue;
    }
    st = slot(R, step, k, 0);
  }
  if (st) return st;
  return failed(R, mpg_sync_finish(R->s), step, TF_SLOTS, "mpg_sync_finish");
}

static mpg_status setup(rk *R, mpg_mesh **mesh) {
  mpg_spec *spec = malloc(sizeof *spec);
  if (!spec) return MPG_ERR_NOMEM;
  *spec = (mpg_spec)MPG_SPEC_INIT;
  mpg_status st = mpg_spec_init(spec);
  if (!st) st = mpg_spec_set_mesh(spec, TF_MESH);
  if (!st) st = mpg_spec_validate(spec);
  if (!st) st = mpg_mesh_create(spec, TF_WORLD, mesh);
  free(spec);
  if (st) return failed(R, st, -1, -1, "the mesh");
  return MPG_OK;
}

static mpg_status make_ctx(rk *R, const mpg_mesh *mesh, const mpg_init_opts *base) {
  const tf_case *c = R->c;
  mpg_init_opts o = *base;
  o.backend.timeout_s = TF_SETUP_TIMEOUT_S;
  /* A victim that never dumps: no automatic dump either. */
  o.trace_dir = R->victim && c->nodump ? "" : c->dir;
  mpg_status st = mpg_ctx_create(mesh, &o, &R->ctx);
  if (!st) st = mpg_ctx_group(R->ctx, "tp", &R->tp);
  if (!st) st = mpg_ctx_group(R->ctx, "dp", &R->dp);
  if (!st) st = mpg_ctx_group(R->ctx, "pp", &R->pp);
  if (!st) st = mpg_ctx_stream_create(R->ctx, &R->stream);
  void **bufs[4] = {&R->tpbuf, &R->a2s, &R->a2r, &R->p2p};
  size_t bytes[4] = {2 * TF_TPMAX * 4, 2 * TF_A2A * 4, 2 * TF_A2A * 4, TF_P2P * 4};
  for (int i = 0; i < 4 && !st; i++) st = mpg_ctx_mem_alloc(R->ctx, bytes[i], 0, bufs[i]);
  if (st) return failed(R, st, -1, -1, "mpg_ctx_create");
  mpg_sync_opts so = MPG_SYNC_OPTS_INIT;
  so.sync.op = MPG_OP_SUM;
  so.sync.bucket_mb = TF_BUCKET_MB;
  so.sync.first_bucket_mb = TF_BUCKET_MB;
  so.default_dims = "dp";
  st = mpg_sync_create(R->ctx, &so, &R->s);
  for (int p = 0; p < TF_PARAMS && !st; p++) {
    char name[16];
    int id;
    snprintf(name, sizeof name, "p%d", p);
    st = mpg_sync_add_param(R->s, name, param_count[p], MPG_F32, NULL, &id);
  }
  if (!st) st = mpg_sync_commit(R->s);
  return failed(R, st, -1, -1, "the sync's set-up");
}

void tf_rank_run(const tf_case *c, const mpg_init_opts *base, tf_outcome *out) {
  memset(out, 0, sizeof *out);
  out->step = -1;
  rk R = {0};
  R.c = c;
  R.rank = base->rank;
  R.stage = base->rank / 4;
  R.victim = base->rank == c->victim;
  R.out = out;
  mpg_mesh *mesh = NULL;
  mpg_status st = setup(&R, &mesh);
  if (!st) st = make_ctx(&R, mesh, base);
  /* Step 0, the warm-up, under the set-up's timeout: no wait of a healthy
   * step is longer than the step, so the case's timeout is at least 2 of
   * them (issue 46, item 8: on a loaded machine a fixed 1 s timed out
   * healthy waits, and the slow ranks were named instead of the fault). */
  double t0 = mono_s();
  if (!st) st = step_run(&R, 0);
  R.timeout_s = 2 * (mono_s() - t0);
  if (R.timeout_s < c->timeout_s) R.timeout_s = c->timeout_s;
  R.hang_s = R.timeout_s + (c->hang_s - c->timeout_s);
  out->timeout_s = R.timeout_s;
  if (!st) st = failed(&R, mpg_ctx_set_timeout(R.ctx, R.timeout_s), -1, -1, "the timeout");
  for (int step = 1; step <= TF_STEPS && !st; step++) st = step_run(&R, step);
  /* A rank without a dump (every call OK, or it finished before the
   * others failed) writes one on request; a victim that never dumps
   * does not, nor a `noreq` victim: its record is the one mpg_ctx_destroy
   * writes (reason "end"). */
  if (R.ctx && !(R.victim && (c->nodump || c->noreq))) {
    char path[700];
    snprintf(path, sizeof path, "%s/rank-%d.trace", c->dir, R.rank);
    if (access(path, F_OK) != 0) {
      mpg_status d = mpg_ctx_trace_dump(R.ctx, NULL);
      out->requested = d == MPG_OK;
      if (d && !out->status) failed(&R, d, -1, -1, "mpg_ctx_trace_dump");
    }
  }
  mpg_sync_destroy(R.s);
  if (R.ctx) {
    void *bufs[4] = {R.tpbuf, R.a2s, R.a2r, R.p2p};
    for (int i = 0; i < 4; i++) mpg_ctx_mem_free(R.ctx, bufs[i]);
    mpg_ctx_stream_destroy(R.ctx, R.stream);
  }
  mpg_ctx_destroy(R.ctx);
  mpg_mesh_destroy(mesh);
}
