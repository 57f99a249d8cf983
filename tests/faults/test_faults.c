/* Faults: every survivor of a stalled, killed, absent or desynchronised
 * rank, or of a watchdog's abort, fails with MPG_ERR_TIMEOUT or
 * MPG_ERR_ABORTED (MPG_ERR_STATE for a desync, on every rank) within the
 * timeout + 1 s, with its gradients marked invalid and a context that
 * destroys cleanly: on the thread backend (8 ranks as threads) and under
 * real `mpirun -np 4 / -np 8` processes (faults_mpi_worker, only with MPI).
 * The scenarios are in fault_scenarios.h; every survivor's time and status
 * is logged (cr_log_info).  The timeout is 1 s; the assertions allow the
 * promise (timeout + 1 s) plus the scheduler's allowance for the ranks in
 * play, scaled by oversubscription and sanitizer (../time_bound.h).  The
 * MPI_Init_thread that meshpg runs inside mpg_ctx_create is outside the
 * promise: the library's message reports its duration and it is
 * subtracted. */
#include <string.h>

#include "../support/mpirun_util.h"
#include "../support/time_bound.h"
#include "fault_scenarios.h"

#define TIMEOUT_S 1.0
#define MAX_RANKS 8

/* The part of a failed call that the promise covers: its time less the
 * MPI_Init_thread it ran, which the library's timeout message reports
 * ("counted after MPI_Init_thread, which took X s"). */
static double promised_part(const fault_res *r) {
  const char *m = strstr(r->msg, "MPI_Init_thread, which took ");
  double init = 0;
  if (m && sscanf(m, "MPI_Init_thread, which took %lf s", &init) == 1 && init > 0 &&
      init < r->secs)
    return r->secs - init;
  return r->secs;
}

/* Asserted for every survivor: the promise plus the allowance for `ranks`
 * ranks on this machine. */
static void expect_in_time(const char *what, const fault_res *r, int ranks) {
  double t = promised_part(r), bound = tb_bound(TIMEOUT_S + 1.0, ranks);
  cr_expect_leq(t, bound,
                "%s: rank %d: %s took %.3f s (%.3f s after MPI_Init_thread), bound %.3f s = "
                "timeout %.1f s + 1 s + allowance %.3f s (%d ranks, %.1f per core, "
                "sanitizer x%.0f)",
                what, r->rank, r->stage, r->secs, t, bound, TIMEOUT_S, tb_allowance(ranks),
                ranks, tb_oversubscription(ranks), tb_sanitizer_factor());
}

/* ------------------------------------------------------------------ */
/* Checks shared by both backends                                       */
/* ------------------------------------------------------------------ */

static void log_res(const char *what, const fault_res *r) {
  cr_log_info("%s: rank %d%s: %s -> %s after %.3f s, grads_valid %d, sync_destroy %s, "
              "ctx_destroy %s: %s",
              what, r->rank, r->victim ? " (victim)" : "", r->stage,
              mpg_status_name(r->status), r->secs, r->valid,
              mpg_status_name(r->sync_destroy), mpg_status_name(r->ctx_destroy), r->msg);
}

/* Every survivor failed in `stage` with TIMEOUT or ABORTED (or `want`
 * when not MPG_OK), fast enough, with invalid gradients and clean
 * destroys.  Returns the slowest survivor's time. */
static double check_survivors(const char *what, const fault_res *res, int n, const char *stage,
                              mpg_status want, int with_victim) {
  double slowest = 0;
  int seen = 0;
  for (int i = 0; i < n; i++) {
    const fault_res *r = &res[i];
    log_res(what, r);
    if (r->victim && !with_victim) continue;
    seen++;
    if (want)
      cr_expect_eq(r->status, want, "%s: rank %d: %s -> %s, expected %s: %s", what, r->rank,
                   r->stage, mpg_status_name(r->status), mpg_status_name(want), r->msg);
    else
      cr_expect(r->status == MPG_ERR_TIMEOUT || r->status == MPG_ERR_ABORTED,
                "%s: rank %d: %s -> %s, expected a timeout or abort: %s", what, r->rank,
                r->stage, mpg_status_name(r->status), r->msg);
    /* The aborting rank may fail launching its last bucket. */
    if (!r->victim || strcmp(r->stage, "mark_ready") != 0)
      cr_expect_str_eq(r->stage, stage, "%s: rank %d failed in %s, expected %s: %s", what,
                       r->rank, r->stage, stage, r->msg);
    expect_in_time(what, r, n);
    if (r->valid >= 0)
      cr_expect_eq(r->valid, 0, "%s: rank %d: grads_valid is %d after the failure", what,
                   r->rank, r->valid);
    cr_expect_eq(r->sync_destroy, MPG_OK, "%s: rank %d: mpg_sync_destroy -> %s", what,
                 r->rank, mpg_status_name(r->sync_destroy));
    cr_expect_eq(r->ctx_destroy, MPG_OK, "%s: rank %d: mpg_ctx_destroy -> %s", what, r->rank,
                 mpg_status_name(r->ctx_destroy));
    if (promised_part(r) > slowest) slowest = promised_part(r);
  }
  cr_expect_gt(seen, 0, "%s: no survivor reported", what);
  cr_log_info("%s: %d ranks checked, the slowest failed after %.3f s (bound %.3f s)", what,
              seen, slowest, tb_bound(TIMEOUT_S + 1.0, n));
  return slowest;
}

/* ------------------------------------------------------------------ */
/* Thread backend                                                       */
/* ------------------------------------------------------------------ */

typedef struct thread_job {
  fault_cfg cfg;
  fault_res res[MAX_RANKS];
} thread_job;

static mpg_status thread_main(const mpg_init_opts *opts, void *arg) {
  thread_job *job = arg;
  return fault_rank(opts, &job->cfg, opts->rank, &job->res[opts->rank]);
}

static thread_job *thread_run(fault_kind kind, int variant) {
  thread_job *job = calloc(1, sizeof *job);
  cr_assert_not_null(job);
  job->cfg = (fault_cfg){kind, variant, MAX_RANKS, TIMEOUT_S, 0};
  double t0 = now_s();
  mpg_status st = mpg_thread_run(MAX_RANKS, TIMEOUT_S, thread_main, job, NULL);
  cr_assert_eq(st, MPG_OK, "mpg_thread_run -> %s: %s", mpg_status_name(st), mpg_last_error());
  cr_log_info("thread %s: all ranks done after %.3f s", fault_names[kind], now_s() - t0);
  return job;
}

/* The missing member is named: "position P (world rank V)" after "missing". */
static void expect_names_missing(const char *what, const fault_res *r, int victim) {
  char want[64];
  snprintf(want, sizeof want, "(world rank %d)", victim);
  const char *m = strstr(r->msg, "missing");
  cr_expect(m && strstr(m, want), "%s: rank %d's message does not name rank %d as missing: %s",
            what, r->rank, victim, r->msg);
  cr_expect(strstr(r->msg, "sync step 1: bucket"),
            "%s: rank %d's message does not name the step and bucket: %s", what, r->rank,
            r->msg);
  cr_expect(strstr(r->msg, "on dp_cp[0] (position"),
            "%s: rank %d's message does not name the group and its index: %s", what, r->rank,
            r->msg);
}

/* The last rank stalls (F_STOP) or leaves (F_KILL) mid-step: the others
 * fail in finish, naming it. */
static void thread_missing_rank(fault_kind kind, const char *what) {
  thread_job *job = thread_run(kind, 0);
  check_survivors(what, job->res, MAX_RANKS, "finish", MPG_OK, 0);
  for (int i = 0; i < MAX_RANKS - 1; i++) expect_names_missing(what, &job->res[i], MAX_RANKS - 1);
  free(job);
}

Test(faults_thread, stalled_rank_mid_bucket, .timeout = 60) {
  thread_missing_rank(F_STOP, "thread stop");
}

Test(faults_thread, rank_leaves_mid_bucket, .timeout = 60) {
  thread_missing_rank(F_KILL, "thread kill");
}

Test(faults_thread, rank_never_creates_its_context, .timeout = 60) {
  thread_job *job = thread_run(F_NO_CTX, 0);
  check_survivors("thread no_ctx", job->res, MAX_RANKS, "ctx_create", MPG_OK, 0);
  free(job);
}

static void check_desync(const char *what, const fault_res *res, int n, const char *here,
                         const char *there) {
  check_survivors(what, res, n, "commit", MPG_ERR_STATE, 1);
  for (int i = 0; i < n; i++) {
    const fault_res *r = &res[i];
    const char *mine = r->victim ? here : there, *theirs = r->victim ? there : here;
    cr_expect(strstr(r->msg, "param #3"), "%s: rank %d: no index: %s", what, r->rank, r->msg);
    cr_expect(strstr(r->msg, "reduce group \"dp_cp\" (index 0"),
              "%s: rank %d: no group: %s", what, r->rank, r->msg);
    const char *on_me = strstr(r->msg, "on this rank");
    const char *on_other = on_me ? strstr(on_me, ", on world rank") : NULL;
    cr_expect(on_me && on_other, "%s: rank %d: %s", what, r->rank, r->msg);
    if (!on_me || !on_other) continue;
    char a[512], b[512];
    snprintf(a, sizeof a, "%.*s", (int)(on_other - on_me), on_me);
    snprintf(b, sizeof b, "%s", on_other);
    cr_expect(strstr(a, mine), "%s: rank %d: this rank's side lacks %s: %s", what, r->rank,
              mine, r->msg);
    cr_expect(strstr(b, theirs), "%s: rank %d: the other side lacks %s: %s", what, r->rank,
              theirs, r->msg);
    char vict[32];
    snprintf(vict, sizeof vict, "on world rank %d ", n - 1);
    if (!r->victim)
      cr_expect(strstr(r->msg, vict), "%s: rank %d does not name rank %d: %s", what, r->rank,
                n - 1, r->msg);
  }
}

/* The last rank registers w3 differently (variant, see fault_scenarios.h):
 * `here` is how it describes its param #3, `there` how the others do. */
static void thread_desync(int variant, const char *what, const char *here, const char *there) {
  thread_job *job = thread_run(F_DESYNC, variant);
  check_desync(what, job->res, MAX_RANKS, here, there);
  free(job);
}

Test(faults_thread, desync_count, .timeout = 60) {
  thread_desync(0, "thread desync count", "\"w3\" (301 x f32)", "\"w3\" (300 x f32)");
}

Test(faults_thread, desync_dtype, .timeout = 60) {
  thread_desync(1, "thread desync dtype", "\"w3\" (300 x f64)", "\"w3\" (300 x f32)");
}

Test(faults_thread, desync_order, .timeout = 60) {
  thread_desync(2, "thread desync order", "\"w4\" (300 x f32)", "\"w3\" (300 x f32)");
}

Test(faults_thread, watchdog_abort_mid_bucket, .timeout = 60) {
  thread_job *job = thread_run(F_ABORT, 0);
  check_survivors("thread abort", job->res, MAX_RANKS, "finish", MPG_OK, 1);
  cr_expect_eq(job->res[0].status, MPG_ERR_ABORTED, "the aborting rank: %s",
               mpg_status_name(job->res[0].status));
  /* In shared memory the abort reaches the others through the segment
   * (the aborting rank's worker looks every 100 ms), not by a timeout:
   * their messages name rank 0 as the one that aborted. */
  const char *shm = getenv("MESHPG_SHM");
  for (int r = 1; r < MAX_RANKS && !(shm && strcmp(shm, "0") == 0); r++)
    cr_expect(strstr(job->res[r].msg, "aborted by position 0 (world rank 0)"),
              "thread abort: rank %d did not learn of rank 0's abort through the "
              "segment (%.3f s): %s", r, job->res[r].secs, job->res[r].msg);
  free(job);
}

/* Tied groups (first + last pp stage): the stages may name their copies
 * differently ("emb" / "head"), but the counts must agree.  `head_count`
 * is what every last-stage rank registers; the last rank registers
 * `last_extra` more reduce-group params than its stage. */
typedef struct tied_job {
  size_t head_count;
  int last_extra;
  mpg_status st[MAX_RANKS];
  char msg[MAX_RANKS][1024];
} tied_job;

static mpg_status tied_main(const mpg_init_opts *opts, void *arg) {
  tied_job *job = arg;
  mpg_spec *spec = malloc(sizeof *spec);
  mpg_mesh *mesh = NULL;
  mpg_ctx *ctx = NULL;
  mpg_sync *s = NULL;
  mpg_group *tied = NULL;
  if (!spec) return MPG_ERR_NOMEM;
  *spec = (mpg_spec)MPG_SPEC_INIT;
  mpg_status st = mpg_spec_init(spec);
  if (!st) st = mpg_spec_set_mesh(spec, "pp=2,dp=2,cp=2");
  if (!st) st = mpg_spec_add_flatten(spec, "dp_cp", "dp,cp");
  if (!st) st = mpg_spec_validate(spec);
  if (!st) st = mpg_mesh_create(spec, 0, &mesh);
  if (!st) st = mpg_ctx_create(mesh, opts, &ctx);
  int pos[2] = {0, 1}, id, rank = opts->rank, last = rank >= MAX_RANKS / 2;
  if (!st) st = mpg_ctx_group_select(ctx, "pp", pos, 2, &tied);
  if (!st) st = mpg_sync_create(ctx, NULL, &s);
  mpg_param_opts po = MPG_PARAM_OPTS_INIT;
  po.tied_group = tied;
  if (!st) st = mpg_sync_add_param(s, last ? "head" : "emb", last ? job->head_count : 100,
                                   MPG_F32, &po, &id);
  if (!st) st = mpg_sync_add_param(s, "w", 50, MPG_F32, NULL, &id);
  if (!st && rank == MAX_RANKS - 1 && job->last_extra)
    st = mpg_sync_add_param(s, "extra", 50, MPG_F32, NULL, &id);
  if (!st) st = mpg_sync_commit(s);
  if (!st) st = mpg_sync_all(s, 0, NULL);
  job->st[rank] = st;
  snprintf(job->msg[rank], sizeof job->msg[rank], "%s", st ? mpg_last_error() : "");
  mpg_sync_destroy(s);
  mpg_ctx_destroy(ctx);
  mpg_mesh_destroy(mesh);
  free(spec);
  return MPG_OK;
}

static tied_job *tied_run(size_t head_count, int last_extra) {
  tied_job *job = calloc(1, sizeof *job);
  cr_assert_not_null(job);
  job->head_count = head_count;
  job->last_extra = last_extra;
  mpg_status st = mpg_thread_run(MAX_RANKS, TIMEOUT_S, tied_main, job, NULL);
  cr_assert_eq(st, MPG_OK, "mpg_thread_run -> %s", mpg_status_name(st));
  for (int r = 0; r < MAX_RANKS; r++)
    cr_log_info("tied %zu/%d: rank %d: %s %s", head_count, last_extra, r,
                mpg_status_name(job->st[r]), job->msg[r]);
  return job;
}

Test(faults_thread, tied_copies_may_differ_in_name, .timeout = 60) {
  tied_job *job = tied_run(100, 0);
  for (int r = 0; r < MAX_RANKS; r++)
    cr_expect_eq(job->st[r], MPG_OK, "rank %d: %s", r, job->msg[r]);
  free(job);
}

Test(faults_thread, desync_tied_count, .timeout = 60) {
  tied_job *job = tied_run(101, 0);
  for (int r = 0; r < MAX_RANKS; r++) {
    cr_expect_eq(job->st[r], MPG_ERR_STATE, "rank %d: %s", r, job->msg[r]);
    cr_expect(strstr(job->msg[r], "tied group"), "rank %d: %s", r, job->msg[r]);
    const char *mine = r < MAX_RANKS / 2 ? "\"emb\" (100 x f32" : "\"head\" (101 x f32";
    const char *theirs = r < MAX_RANKS / 2 ? "\"head\" (101 x f32" : "\"emb\" (100 x f32";
    const char *other = strstr(job->msg[r], ", on world rank");
    cr_expect(other && strstr(job->msg[r], mine) < other && strstr(other, theirs),
              "rank %d: %s", r, job->msg[r]);
  }
  free(job);
}

Test(faults_thread, desync_missing_param, .timeout = 60) {
  tied_job *job = tied_run(100, 1);
  /* Only the last stage's reduce group (ranks 4..7) disagrees. */
  for (int r = 0; r < MAX_RANKS; r++) {
    if (r < MAX_RANKS / 2) {
      /* The first stage's groups agree, but the world check fails it too
       * (its tied sums would wait for the last stage). */
      cr_expect_eq(job->st[r], MPG_ERR_STATE, "rank %d: %s", r, job->msg[r]);
      cr_expect(strstr(job->msg[r], "the first world rank 4"), "rank %d: %s", r, job->msg[r]);
      continue;
    }
    cr_expect_eq(job->st[r], MPG_ERR_STATE, "rank %d: %s", r, job->msg[r]);
    cr_expect(strstr(job->msg[r], "param #2"), "rank %d: %s", r, job->msg[r]);
    cr_expect(strstr(job->msg[r], r == MAX_RANKS - 1 ? "\"extra\" (50 x f32)" : "no param #2"),
              "rank %d: %s", r, job->msg[r]);
  }
  free(job);
}

/* ------------------------------------------------------------------ */
/* MPI processes                                                        */
/* ------------------------------------------------------------------ */

static const char *mpi_worker(void) {
  const char *w = getenv("MESHPG_FAULTS_MPI_WORKER");
  if (!w) cr_skip_test("built without MPI");
  return w;
}

/* mpirun -np N worker ARGS; parse every rank's RESULT line into res
 * (indexed by rank; rank -1 where none came).  Returns the exit code. */
static const char *mpirun_extra = ""; /* more mpirun flags (mpi_kill_survivors) */
static int mpi_limit = 120;            /* seconds before `timeout` ends the job */

static int mpi_job(int np, const char *env, const char *args, fault_res *res, int *nres,
                   double *secs) {
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "%s timeout -k 5 %d " MPIRUN "%s -np %d '%s' %s", env,
           mpi_limit, mpirun_extra, np, mpi_worker(), args);
  int rc = run(cmd, secs);
  cr_log_info("%s: exit %d after %.2f s", cmd, rc, *secs);
  *nres = 0;
  for (int i = 0; i < np; i++) res[i].rank = -1;
  for (const char *p = strstr(out, "RESULT "); p; p = strstr(p + 1, "RESULT ")) {
    char scen[32], stage[32], stname[32], sd[32], cd[32];
    int rank, victim, valid;
    double t;
    if (sscanf(p, "RESULT %31s rank %d victim %d stage %31s status %31s secs %lf valid %d "
                  "sync_destroy %31s ctx_destroy %31s",
               scen, &rank, &victim, stage, stname, &t, &valid, sd, cd) != 9 ||
        rank < 0 || rank >= np)
      continue;
    fault_res *r = &res[rank];
    static char stages[MAX_RANKS][32];
    snprintf(stages[rank], sizeof stages[rank], "%s", stage);
    r->rank = rank;
    r->victim = victim;
    r->stage = stages[rank];
    r->secs = t;
    r->valid = valid;
    r->status = r->sync_destroy = r->ctx_destroy = MPG_STATUS_COUNT;
    for (int s = 0; s < MPG_STATUS_COUNT; s++) {
      if (!strcmp(stname, mpg_status_name((mpg_status)s))) r->status = (mpg_status)s;
      if (!strcmp(sd, mpg_status_name((mpg_status)s))) r->sync_destroy = (mpg_status)s;
      if (!strcmp(cd, mpg_status_name((mpg_status)s))) r->ctx_destroy = (mpg_status)s;
    }
    const char *m = strstr(p, "msg: ");
    const char *e = m ? strchr(m, '\n') : NULL;
    snprintf(r->msg, sizeof r->msg, "%.*s", m ? (int)(e ? e - m - 5 : (long)strlen(m + 5)) : 0,
             m ? m + 5 : "");
    (*nres)++;
  }
  cr_expect_null(strstr(out, "core dumped"), "%s\n%s", cmd, out);
  return rc;
}

static void mpi_scenario(int np, const char *args, const char *stage, mpg_status want,
                         int with_victim) {
  fault_res res[MAX_RANKS];
  int nres = 0;
  double secs = 0;
  int rc = mpi_job(np, "", args, res, &nres, &secs);
  cr_assert_eq(rc, 0, "exit %d; output:\n%s", rc, out);
  cr_assert_eq(nres, np, "%d of %d ranks reported; output:\n%s", nres, np, out);
  char what[64];
  snprintf(what, sizeof what, "mpi -np %d %s", np, args);
  check_survivors(what, res, np, stage, want, with_victim);
}

Test(faults_mpi, stopped_rank_4, .timeout = 150) { mpi_scenario(4, "stop", "finish", MPG_OK, 0); }
Test(faults_mpi, stopped_rank_8, .timeout = 150) { mpi_scenario(8, "stop", "finish", MPG_OK, 0); }
Test(faults_mpi, no_ctx_4, .timeout = 150) { mpi_scenario(4, "no_ctx", "ctx_create", MPG_OK, 0); }
Test(faults_mpi, no_ctx_8, .timeout = 150) { mpi_scenario(8, "no_ctx", "ctx_create", MPG_OK, 0); }
Test(faults_mpi, desync_4, .timeout = 150) {
  mpi_scenario(4, "desync 0", "commit", MPG_ERR_STATE, 1);
}
Test(faults_mpi, desync_8, .timeout = 150) {
  mpi_scenario(8, "desync 0", "commit", MPG_ERR_STATE, 1);
}
Test(faults_mpi, watchdog_abort_4, .timeout = 150) {
  mpi_scenario(4, "abort", "finish", MPG_OK, 1);
}
Test(faults_mpi, watchdog_abort_8, .timeout = 150) {
  mpi_scenario(8, "abort", "finish", MPG_OK, 1);
}

/* The sleeping rank is named: with tiny ring pieces the bucket runs on
 * meshpg's ring, whose waits know their left neighbour (the shared-memory
 * path, which would otherwise take this single-node job, is off). */
Test(faults_mpi, timeout_names_the_sleeping_rank, .timeout = 150) {
  fault_res res[MAX_RANKS];
  int nres = 0, np = 4;
  double secs = 0;
  int rc = mpi_job(np, "MESHPG_SHM=0 MESHPG_MPI_PIECE_BYTES=256", "stop 1", res, &nres, &secs);
  cr_assert_eq(rc, 0, "exit %d; output:\n%s", rc, out);
  cr_assert_eq(nres, np, "%d of %d ranks reported; output:\n%s", nres, np, out);
  check_survivors("mpi -np 4 sleep", res, np, "finish", MPG_OK, 0);
  for (int i = 0; i < np - 1; i++) {
    cr_expect(strstr(res[i].msg, "ring stalls from position 3"),
              "rank %d does not trace the stall to position 3: %s", i, res[i].msg);
    cr_expect(strstr(res[i].msg, "sync step 1: bucket"), "rank %d: %s", i, res[i].msg);
    cr_expect(strstr(res[i].msg, "on dp_cp[0] (position"), "rank %d: %s", i, res[i].msg);
  }
  cr_expect(strstr(res[0].msg, "position 3 (left neighbour)"),
            "rank 0 does not name its left neighbour 3: %s", res[0].msg);
}

/* A killed rank: Open MPI's mpirun kills the whole job.  Survivors must
 * not hang before that: the job ends well within the limit. */
static void mpi_kill(int np) {
  fault_res res[MAX_RANKS];
  int nres = 0;
  double secs = 0;
  int rc = mpi_job(np, "", "kill", res, &nres, &secs);
  cr_log_info("mpi -np %d kill: mpirun exit %d after %.2f s, %d rank(s) reported", np, rc,
              secs, nres);
  for (int i = 0; i < np; i++)
    if (res[i].rank >= 0) log_res("mpi kill", &res[i]);
  cr_expect_neq(rc, 124, "the job hung until the limit:\n%s", out);
  cr_expect_lt(secs, 60.0, "the job took %.2f s:\n%s", secs, out);
  for (int i = 0; i < np; i++) {
    if (res[i].rank < 0 || res[i].victim) continue;
    cr_expect(res[i].status == MPG_ERR_TIMEOUT || res[i].status == MPG_ERR_ABORTED,
              "rank %d: %s -> %s: %s", i, res[i].stage, mpg_status_name(res[i].status),
              res[i].msg);
    expect_in_time("mpi kill", &res[i], np);
  }
}

Test(faults_mpi, killed_rank_4, .timeout = 150) { mpi_kill(4); }
Test(faults_mpi, killed_rank_8, .timeout = 150) { mpi_kill(8); }

/* Segments of the shared-memory sync in /dev/shm ("meshpg-<pid>-..."). */
static int shm_segments(void) {
  int n = 0;
  FILE *p = popen("ls /dev/shm 2>/dev/null", "r");
  char line[512];
  while (p && fgets(line, sizeof line, p))
    if (strncmp(line, "meshpg-", 7) == 0) n++;
  if (p) pclose(p);
  return n;
}

/* A rank SIGKILLed in the middle of a step whose buckets run in shared
 * memory (the whole world is one node's dp_cp group), with mpirun told to
 * let the others live (--enable-recovery): every survivor reports, with
 * TIMEOUT or ABORTED within the timeout + 1 s, its gradients invalid and
 * clean destroys, and the segments are gone from /dev/shm (unlinked as
 * soon as every rank mapped them). */
static void mpi_kill_survivors(int np) {
  fault_res res[MAX_RANKS];
  int nres = 0, before = shm_segments();
  double secs = 0;
  /* With a dead peer, Open MPI's MPI_Finalize may never return (after
   * every survivor reported): the job's exit is not meshpg's to judge. */
  mpirun_extra = "--enable-recovery";
  mpi_limit = 45;
  int rc = mpi_job(np, "MESHPG_SHM=1", "kill", res, &nres, &secs);
  mpirun_extra = "";
  mpi_limit = 120;
  cr_log_info("mpi -np %d kill (recovery): exit %d after %.2f s", np, rc, secs);
  cr_assert_eq(nres, np - 1, "%d of %d survivors reported:\n%s", nres, np - 1, out);
  /* The victim is the last rank: the first np - 1 are the survivors. */
  check_survivors("mpi kill (recovery)", res, np - 1, "finish", MPG_OK, 0);
  for (int i = 0; i < np - 1; i++) {
    cr_expect(strstr(res[i].msg, "shared-memory reduction"),
              "rank %d did not sync in shared memory: %s", i, res[i].msg);
  }
  expect_names_missing("mpi kill (recovery)", &res[0], np - 1);
  cr_expect_eq(shm_segments(), before, "segments left in /dev/shm: %d before, %d after",
               before, shm_segments());
}

Test(faults_mpi, killed_rank_survivors_4, .timeout = 150) { mpi_kill_survivors(4); }
Test(faults_mpi, killed_rank_survivors_8, .timeout = 150) { mpi_kill_survivors(8); }
