/* Fault scenarios shared by test_faults.c (thread backend: ranks are
 * threads) and faults_mpi_worker.c (MPI backend: ranks are processes).
 *
 * Every rank builds a mesh whose default reduce group (dp_cp) is the whole
 * world, registers six parameters of 300 f32 (one bucket each), runs one
 * healthy step, then opens step 1, marks w5..w1 ready (five buckets in
 * flight) and, unless it is the victim, marks w0 and calls finish.  The
 * victim (the last rank; rank 0 for F_ABORT) misbehaves:
 *
 *   F_STOP     stops in the middle of the step: SIGSTOP on MPI (a child
 *              process sends SIGCONT after timeout + 2 s), a sleep of
 *              timeout + 1.5 s on the thread backend and with variant 1;
 *              then it goes on.
 *   F_KILL     dies in the middle of the step: SIGKILL on MPI; on the thread
 *              backend it leaves (destroys its sync and context) at once.
 *   F_NO_CTX   never calls mpg_ctx_create (on MPI it initialises MPI itself,
 *              waits timeout + 1.5 s and finalises).
 *   F_DESYNC   registers w3 with 301 elements (variant 1: as f64; variant 2:
 *              w3 and w4 in swapped order): every rank's commit must fail
 *              with MPG_ERR_STATE naming w3.
 *   F_ABORT    rank 0 starts a watchdog thread that calls mpg_ctx_abort
 *              0.2 s into the step while its buckets are in flight, and
 *              marks w0 only after 0.5 s.
 *
 * Each rank fills a fault_res: the first call that failed, its status, how
 * long that call took, whether the gradients are still valid, and how the
 * sync and the context were destroyed.  Nothing here uses Criterion. */
#ifndef FAULT_SCENARIOS_H
#define FAULT_SCENARIOS_H

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "meshpg.h"

typedef enum fault_kind { F_STOP, F_KILL, F_NO_CTX, F_DESYNC, F_ABORT, F_COUNT } fault_kind;

static const char *const fault_names[F_COUNT] = {"stop", "kill", "no_ctx", "desync", "abort"};

typedef struct fault_cfg {
  fault_kind kind;
  int variant;       /* F_DESYNC: 0 count, 1 dtype, 2 order */
  int world;
  double timeout_s;
  int process;       /* 1: ranks are processes (signals allowed) */
} fault_cfg;

typedef struct fault_res {
  int rank;
  int victim;
  const char *stage; /* the first call that failed, or "none" */
  mpg_status status;
  double secs;       /* how long that call took */
  int valid;         /* mpg_sync_grads_valid after the step (-1: no sync) */
  mpg_status sync_destroy, ctx_destroy;
  char msg[1024];
} fault_res;

static inline double fault_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline void fault_sleep(double s) {
  struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  while (nanosleep(&ts, &ts) != 0) {
  }
}

static inline int fault_victim(const fault_cfg *c) {
  return c->kind == F_ABORT ? 0 : c->world - 1;
}

/* dp_cp = the world: dp = world / 2, cp = 2. */
static inline mpg_status fault_mesh(int world, mpg_mesh **mesh) {
  *mesh = NULL;
  mpg_spec *spec = malloc(sizeof *spec);
  if (!spec) return MPG_ERR_NOMEM;
  *spec = (mpg_spec)MPG_SPEC_INIT;
  char dims[64];
  snprintf(dims, sizeof dims, "dp=%d,cp=2", world / 2);
  mpg_status st = mpg_spec_init(spec);
  if (!st) st = mpg_spec_set_mesh(spec, dims);
  if (!st) st = mpg_spec_add_flatten(spec, "dp_cp", "dp,cp");
  if (!st) st = mpg_spec_validate(spec);
  if (!st) st = mpg_mesh_create(spec, 0, mesh);
  free(spec);
  return st;
}

typedef struct fault_watchdog {
  mpg_ctx *ctx;
  double delay;
  mpg_status st;
} fault_watchdog;

static inline void *fault_watchdog_main(void *arg) {
  fault_watchdog *w = arg;
  fault_sleep(w->delay);
  w->st = mpg_ctx_abort(w->ctx);
  return NULL;
}

/* Record the first failure: stage, status, the call's duration, message. */
static inline void fault_note(fault_res *r, const char *stage, mpg_status st, double t0) {
  if (r->stage && strcmp(r->stage, "none") != 0) return;
  r->stage = stage;
  r->status = st;
  r->secs = fault_now() - t0;
  snprintf(r->msg, sizeof r->msg, "%s", mpg_last_error());
}

#define FAULT_CALL(stage_, call)                \
  do {                                          \
    double t0_ = fault_now();                   \
    mpg_status st_ = (call);                    \
    if (st_) {                                  \
      fault_note(res, stage_, st_, t0_);        \
      goto done;                                \
    }                                           \
  } while (0)

/* One rank of scenario c.  `opts` is filled for the backend (and, on the
 * thread backend, for this rank).  Returns MPG_OK; the outcome is in res. */
static inline mpg_status fault_rank(const mpg_init_opts *opts, const fault_cfg *c, int rank,
                                    fault_res *res) {
  memset(res, 0, sizeof *res);
  res->rank = rank;
  res->stage = "none";
  res->valid = -1;
  res->victim = rank == fault_victim(c);
  mpg_mesh *mesh = NULL;
  mpg_ctx *ctx = NULL;
  mpg_sync *s = NULL;
  pthread_t dog;
  int dog_started = 0;
  fault_watchdog wd = {NULL, 0.2, MPG_OK};
  mpg_status st = fault_mesh(c->world, &mesh);
  if (st) {
    fault_note(res, "mesh", st, fault_now());
    goto done;
  }
  if (c->kind == F_NO_CTX && res->victim) {
    if (c->process) fault_sleep(c->timeout_s + 1.5);
    goto done;
  }
  mpg_init_opts o = *opts;
  o.backend.timeout_s = c->timeout_s;
  FAULT_CALL("ctx_create", mpg_ctx_create(mesh, &o, &ctx));
  mpg_sync_opts so = MPG_SYNC_OPTS_INIT;
  so.sync.bucket_mb = 0.001;
  so.sync.first_bucket_mb = 0.001;
  FAULT_CALL("sync_create", mpg_sync_create(ctx, &so, &s));
  for (int p = 0; p < 6; p++) {
    int q = p;
    size_t count = 300;
    mpg_dtype dt = MPG_F32;
    if (c->kind == F_DESYNC && res->victim) {
      if (c->variant == 0 && p == 3) count = 301;
      if (c->variant == 1 && p == 3) dt = MPG_F64;
      if (c->variant == 2 && (p == 3 || p == 4)) q = 7 - p;
    }
    char name[16];
    int id;
    snprintf(name, sizeof name, "w%d", q);
    FAULT_CALL("add_param", mpg_sync_add_param(s, name, count, dt, NULL, &id));
  }
  FAULT_CALL("commit", mpg_sync_commit(s));
  FAULT_CALL("step0", mpg_sync_all(s, 0, NULL));
  FAULT_CALL("begin", mpg_sync_begin(s, 1, 1, NULL));
  if (c->kind == F_ABORT && res->victim) {
    wd.ctx = ctx;
    if (pthread_create(&dog, NULL, fault_watchdog_main, &wd) == 0) dog_started = 1;
  }
  for (int p = 5; p >= 1; p--) FAULT_CALL("mark_ready", mpg_sync_mark_ready(s, p));
  if (res->victim) {
    if (c->kind == F_STOP && c->process && c->variant == 0) {
      pid_t parent = getpid(), child = fork();
      if (child == 0) {
        fault_sleep(c->timeout_s + 2.0);
        kill(parent, SIGCONT);
        _exit(0);
      }
      raise(SIGSTOP);
    } else if (c->kind == F_STOP) {
      fault_sleep(c->timeout_s + 1.5);
    } else if (c->kind == F_KILL && c->process) {
      fflush(stdout);
      raise(SIGKILL);
    } else if (c->kind == F_KILL) {
      goto done; /* leaves: destroys its sync and context at once */
    } else if (c->kind == F_ABORT) {
      fault_sleep(0.5);
    }
  }
  FAULT_CALL("mark_ready", mpg_sync_mark_ready(s, 0));
  FAULT_CALL("finish", mpg_sync_finish(s));
done:
  if (dog_started) pthread_join(dog, NULL);
  if (s) res->valid = mpg_sync_grads_valid(s);
  res->sync_destroy = mpg_sync_destroy(s);
  res->ctx_destroy = mpg_ctx_destroy(ctx);
  mpg_mesh_destroy(mesh);
  return MPG_OK;
}

#endif
