/* Issue 35's property under random faults (fault_props.h): random faults
 * (an abort from a watchdog thread, a rank stalled past the timeout, a
 * failed allocation on one rank's thread, a killed or departing member) at
 * random moments of random steps never yield MPG_OK with
 * mpg_sync_grads_valid() == 1 on gradients that differ from the exact
 * reference sum; no rank hangs.
 *
 * Built twice (tests/faults/meson.build), meshpg linked statically with
 * the allocation wrappers of fault_alloc.h:
 *  - test_fault_props: fault_props_thread (ranks as threads, the thread
 *    backend, its shared-memory path on in most cases) and fault_props_mpi
 *    (real `mpirun -np 2..4` jobs of fault_props_mpi_worker, the mpi
 *    backend and its shared-memory path; half the jobs end with a SIGKILL
 *    of one process, under --enable-recovery so that the survivors
 *    report);
 *  - test_fault_props_on_double (FP_ON_DOUBLE, only with the CUDA/NCCL
 *    headers): fault_props_double, the nccl backend on the test double,
 *    ranks as threads; with MPI also fault_props_double_mpi, the double's
 *    processes under mpirun (fault_props_mpi_worker_on_double), every job
 *    ending with a SIGKILL.
 * Each backend runs >= 1,000 steps (the double's processes 400) in the
 * plain build; the sanitizer builds (MESHPG_SANITIZER), which look for
 * memory errors and races rather than wrong sums, run a third of the cases
 * (and ask a third of the steps), to keep CI's time.  Every
 * case's counts are printed (on stderr); the test asserts that the
 * property held for every rank and step, that no step took longer than its
 * bound and no rank hung (fault_props.h's monitor), and, in the default
 * run, that every fault kind was injected and made some step fail, that
 * aborts landed inside finish and allocations failed.
 *
 * To replay one case: MESHPG_FP_SEED=<seed> (and MESHPG_FP_STEPS=<steps>,
 * MESHPG_FP_KILL=0|1 for processes) runs that case only; every VIOLATION
 * line names its seed, backend and step.  MESHPG_FP_CASES=<n> runs n cases
 * from the first seed, MESHPG_FP_KINDS=abort,stall,... draws only those
 * faults (the other faulted steps run clean), and MESHPG_FP_VERBOSE=1
 * prints a STEP line per rank and step.  With any of these set, only the
 * property (and the bounds) are judged, not the coverage. */
#include <criterion/criterion.h>
#include <criterion/logging.h>

#include "../support/mpirun_util.h"
#include "fault_props.h"

#ifdef FP_ON_DOUBLE
#include "../double/on_double.h" /* nccl_thread_run */
#endif

/* ------------------------------------------------------------------ */
/* Totals and the final judgement                                      */
/* ------------------------------------------------------------------ */

typedef struct fp_totals {
  fp_tally t;
  long case_steps; /* steps of the plans (each run by every rank) */
  int cases;
  double secs;
  char first_violation[2048];
  char first_slow[2048];
  char first_setup[2048];
} fp_totals;

static void keep_first(char *dst, size_t cap, const char *line) {
  if (!dst[0]) snprintf(dst, cap, "%s", line);
}

static void note_line(fp_totals *T, const char *line) {
  if (!strncmp(line, "VIOLATION", 9)) keep_first(T->first_violation, sizeof T->first_violation, line);
  if (!strncmp(line, "SLOW", 4) || !strncmp(line, "HANG", 4))
    keep_first(T->first_slow, sizeof T->first_slow, line);
  if (!strncmp(line, "SETUP", 5)) keep_first(T->first_setup, sizeof T->first_setup, line);
}

static void print_tally(const char *what, const fp_tally *t) {
  fprintf(stderr, "%s:", what);
  fp_tally_print(stderr, t);
  fprintf(stderr, "\n");
}

static int env_int(const char *name, int dflt) {
  const char *v = getenv(name);
  return v && *v ? atoi(v) : dflt;
}

/* A run other than the default (MESHPG_FP_SEED, _CASES, _STEPS or _KINDS
 * set): the property is judged, its coverage is not. */
static int custom_run(void) {
  static const char *const vars[] = {"MESHPG_FP_SEED", "MESHPG_FP_CASES", "MESHPG_FP_STEPS",
                                     "MESHPG_FP_KINDS"};
  for (int i = 0; i < 4; i++)
    if (getenv(vars[i]) && *getenv(vars[i])) return 1;
  return 0;
}

/* One summary per backend, then the property and its coverage (the
 * default run only). */
static void judge(const char *backend, const fp_totals *T, int custom, long min_steps) {
  const fp_tally *t = &T->t;
  fprintf(stderr,
          "fault_props %s: %d cases, %ld steps (%ld rank-steps) in %.1f s: %ld OK with valid "
          "gradients (%ld elements checked, %ld violations), %ld errors (TIMEOUT %ld, ABORTED "
          "%ld, NOMEM %ld, INVALID %ld, STATE %ld, BACKEND %ld), %ld OK but invalid; %ld "
          "contexts; the slowest step %ld ms besides its sleeps, the slowest setup %ld ms\n",
          backend, T->cases, T->case_steps, t->steps, T->secs, t->ok_valid, t->elems,
          t->violations, t->errors, t->status[MPG_ERR_TIMEOUT], t->status[MPG_ERR_ABORTED],
          t->status[MPG_ERR_NOMEM], t->status[MPG_ERR_INVALID], t->status[MPG_ERR_STATE],
          t->status[MPG_ERR_BACKEND], t->ok_invalid, t->epochs, t->max_step_ms,
          t->max_setup_ms);
  for (int k = 1; k < FP_NKINDS; k++)
    fprintf(stderr,
            "fault_props %s: %-5s planned %ld, injected %ld; its steps: %ld rank-steps, %ld "
            "failed, %ld OK; %ld failures in the step after\n",
            backend, fp_kind_names[k], t->planned[k], t->injected[k], t->rank_steps[k],
            t->err[k], t->ok[k], t->next_err[k]);
  fprintf(stderr,
          "fault_props %s: aborts landed %ld during the marks, %ld inside finish, %ld after "
          "finish (%ld of them with an allocation in mpg_ctx_abort failing); failed "
          "allocations %ld in mark_ready, %ld in finish, %ld armed but never reached\n",
          backend, t->abort_in_marks, t->abort_in_finish, t->abort_after_finish,
          t->abort_nomem, t->alloc_in_mark, t->alloc_in_finish, t->alloc_unfired);

  fprintf(stderr, "fault_props %s: all-to-alls across the step (issue 45): %ld OK, values "
          "checked, %ld failed\n", backend, t->a2a_ok, t->a2a_err);

  /* The property. */
  cr_expect_eq(t->violations, 0,
               "%s: %ld steps returned MPG_OK with grads_valid 1 and gradients that differ "
               "from the reference; the first: %s",
               backend, t->violations, T->first_violation);
  /* No rank hung. */
  cr_expect_eq(t->slow, 0, "%s: %ld steps or teardowns exceeded their bound; the first: %s",
               backend, t->slow, T->first_slow);
  cr_expect_eq(t->mark_err_finish_ok + t->ok_invalid, 0,
               "%s: %ld steps whose mark_ready failed returned MPG_OK from finish, %ld "
               "steps returned MPG_OK with grads_valid 0 (see the ODD lines)",
               backend, t->mark_err_finish_ok, t->ok_invalid);
  cr_expect_eq(t->setup_errors, 0, "%s: %ld contexts could not be set up; the first: %s",
               backend, t->setup_errors, T->first_setup);
  if (custom) return;
  /* Coverage: enough steps, enough of them checked, every fault landed. */
  cr_expect_geq(T->case_steps, min_steps, "%s: only %ld steps", backend, T->case_steps);
  cr_expect_geq(t->ok_valid * 2, t->steps, "%s: only %ld of %ld rank-steps were checked",
                backend, t->ok_valid, t->steps);
  for (int k = 1; k < FP_NKINDS; k++) {
    cr_expect_gt(t->injected[k], 0, "%s: fault %s was never injected", backend,
                 fp_kind_names[k]);
    cr_expect_gt(t->err[k] + t->next_err[k], 0,
                 "%s: fault %s was injected %ld times but no step failed", backend,
                 fp_kind_names[k], t->injected[k]);
  }
  cr_expect_gt(t->abort_in_finish, 0, "%s: no abort landed inside mpg_sync_finish", backend);
  /* fp_case.a2a: no all-to-all on nccl, threads or processes (fault_props_case.c). */
  if (strncmp(backend, "nccl", 4))
    cr_expect(t->a2a_ok > 0 && t->a2a_err > 0, "%s: the all-to-alls across the step: %ld OK, "
              "%ld failed (both expected)", backend, t->a2a_ok, t->a2a_err);
  cr_expect_gt(t->alloc_in_mark + t->alloc_in_finish, 0, "%s: no allocation failed", backend);
}

/* ------------------------------------------------------------------ */
/* Ranks as threads (thread backend; nccl on the double)               */
/* ------------------------------------------------------------------ */

#define FP_NOTES 16

typedef struct fp_job {
  fp_case c;
  fp_ctl ctl;
  fp_rank ranks[FP_MAX_RANKS];
  int start;
  pthread_mutex_t mu;
  fp_totals *T;
} fp_job;

static void job_note(fp_rank *R, const char *line) {
  fp_job *j = R->note_arg;
  pthread_mutex_lock(&j->mu);
  fprintf(stderr, "%s\n", line);
  note_line(j->T, line);
  pthread_mutex_unlock(&j->mu);
}

/* A rank of either backend (mpg_thread_run's, or nccl_thread_run's on the
 * double): its epoch from j->start. */
static mpg_status thread_rank(const mpg_init_opts *opts, void *arg) {
  fp_job *j = arg;
  fp_rank *R = &j->ranks[opts->rank];
  R->base = *opts;
  fp_epoch(R, j->start);
  return MPG_OK;
}

/* One epoch: every rank from j->start until the epoch ends. */
static void run_epoch(fp_job *j) {
  atomic_store(&j->ctl.epoch_over, 0);
#ifndef FP_ON_DOUBLE
  mpg_status st = mpg_thread_run(j->c.world, FP_SETUP_TIMEOUT_S, thread_rank, j, NULL);
  cr_assert_eq(st, MPG_OK, "mpg_thread_run: %s: %s", mpg_status_name(st), mpg_last_error());
#else
  nccl_thread_run(j->c.world, 0, thread_rank, j);
#endif
}

static void run_case_threads(const fp_case *c, fp_totals *T) {
  char what[2048];
  fp_describe(c, what, sizeof what);
  fprintf(stderr, "case %s\n", what);
  /* Set in the main thread before any rank starts; read at mpg_ctx_create. */
  setenv("MESHPG_SHM", c->shm ? "1" : "0", 1);
  setenv("MESHPG_CHECK_ORDER", c->check_order ? "1" : "0", 1);
  fp_seams_apply(c);
  fp_job *j = calloc(1, sizeof *j);
  cr_assert_not_null(j);
  j->c = *c;
  j->T = T;
  pthread_mutex_init(&j->mu, NULL);
  fp_ctl_reset(&j->ctl);
  for (int r = 0; r < c->world; r++) {
    fp_rank *R = &j->ranks[r];
    R->c = &j->c;
    R->rank = r;
    R->ctl = &j->ctl;
    R->note = job_note;
    R->note_arg = j;
    R->verbose = env_int("MESHPG_FP_VERBOSE", 0);
#ifdef FP_ON_DOUBLE
    R->host = malloc(FP_MAX_ELEMS * 8);
    cr_assert_not_null(R->host);
#endif
  }
  fp_rank *watched[FP_MAX_RANKS];
  for (int r = 0; r < c->world; r++) watched[r] = &j->ranks[r];
  fp_monitor mon;
  fp_monitor_start(&mon, watched, c->world, FP_HANG_S);
  double t0 = fp_now();
  int start = 0, stuck = 0;
  while (start < c->steps) {
    j->start = start;
    run_epoch(j);
    int next = fp_ctl_next_step(&j->ctl, c->world);
    if (next <= start) {
      /* No rank began a step: the set-up failed (counted and noted). */
      cr_assert_lt(++stuck, 3, "case %s: three epochs in a row began no step", what);
      continue;
    }
    stuck = 0;
    start = next;
  }
  double secs = fp_now() - t0;
  fp_monitor_stop(&mon);
  fp_tally sum = {0};
  for (int r = 0; r < c->world; r++) {
    fp_tally_sum(&sum, &j->ranks[r].t);
    free(j->ranks[r].host);
  }
  char head[64];
  snprintf(head, sizeof head, "case %u: %.2f s", c->seed, secs);
  print_tally(head, &sum);
  fp_tally_sum(&T->t, &sum);
  T->case_steps += c->steps;
  T->cases++;
  T->secs += secs;
  pthread_mutex_destroy(&j->mu);
  free(j);
}

/* 3 in a sanitizer build (a third of the cases and of the steps asked,
 * see the top of this file), else 1. */
static int sanitizer_share(void) {
  const char *s = getenv("MESHPG_SANITIZER");
  return s && *s ? 3 : 1;
}

/* `cases` random cases of `steps` steps from seed `first` (or the one of
 * MESHPG_FP_SEED). */
static void run_threads(int backend, unsigned first, int cases, int steps) {
  cr_assert(fa_linked(), "the allocation wrappers are not linked (-Wl,--wrap=malloc)");
  fp_totals *T = calloc(1, sizeof *T);
  cr_assert_not_null(T);
  int seed = env_int("MESHPG_FP_SEED", -1), share = sanitizer_share();
  steps = env_int("MESHPG_FP_STEPS", steps);
  cases = env_int("MESHPG_FP_CASES", (cases + share - 1) / share);
  fp_case c;
  for (int k = 0; k < (seed >= 0 ? 1 : cases); k++) {
    fp_case_make(seed >= 0 ? (unsigned)seed : first + (unsigned)k, backend, 0, steps, 0, &c);
    run_case_threads(&c, T);
  }
  judge(fp_backend_names[backend], T, custom_run(), 1000 / share);
  free(T);
}

#ifndef FP_ON_DOUBLE
/* 10 cases of 110 steps: worlds 2..4, the shared-memory path in most. */
Test(fault_props_thread, ok_and_valid_means_the_reference_sum, .timeout = 600) {
  run_threads(FP_THREAD, 1, 10, 110);
}
#else
Test(fault_props_double, ok_and_valid_means_the_reference_sum, .timeout = 600) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n < FP_MAX_RANKS)
    cr_skip_test("the double shows %d devices (MESHPG_DOUBLE_DEVICES)", n);
  run_threads(FP_NCCL, 1001, 10, 110);
}

/* Found by this test (case 19 of the nccl backend, 12 steps): world 4
 * (tp=2, cp=2), MESHPG_CHECK_ORDER=1, param p3 reduced over dp_cp,tp (the
 * world's communicator).  In step 7 rank 3's first allocation from before
 * finish fails: the issue-order check's all-reduce (i64, max, count 4)
 * fails on rank 3 alone with MPG_ERR_NOMEM, and its context stays alive;
 * in step 8 rank 3's ncclAllReduce of p3 (519 x f32, avg) meets the
 * peers' pending check (4 x i64, max) on one communicator: the double
 * stops the process ("does not match"; real NCCL would hang or corrupt
 * memory).  The same case as fault_props_mpi's
 * failed_post_in_the_issue_order_check; every rank must fail with an
 * error instead (025e93e). */
Test(fault_props_double, failed_post_in_the_issue_order_check, .timeout = 300) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n < FP_MAX_RANKS)
    cr_skip_test("the double shows %d devices (MESHPG_DOUBLE_DEVICES)", n);
  fp_totals *T = calloc(1, sizeof *T);
  cr_assert_not_null(T);
  fp_case c;
  fp_case_make(19, FP_NCCL, 0, 12, 0, &c);
  run_case_threads(&c, T);
  judge("nccl case 19", T, 1, 0);
  free(T);
}
#endif

/* ------------------------------------------------------------------ */
/* Ranks as processes (mpi backend)                                    */
/* ------------------------------------------------------------------ */

/* Parse one job's output: every "TALLY rank R k=v ..." line into *sum;
 * every other line of interest is printed and noted.  Returns the number
 * of TALLY lines. */
static int parse_job(fp_totals *T, fp_tally *sum, long *nviol, long *nfail) {
  int ntally = 0;
  *nviol = *nfail = 0;
  for (char *line = out; line && *line;) {
    char *end = strchr(line, '\n');
    if (end) *end = '\0';
    if (!strncmp(line, "TALLY rank ", 11)) {
      ntally++;
      char *save = NULL;
      for (char *tok = strtok_r(line + 11, " ", &save); tok; tok = strtok_r(NULL, " ", &save)) {
        char *eq = strchr(tok, '=');
        if (!eq) continue;
        *eq = '\0';
        if (!fp_tally_add_kv(sum, tok, atol(eq + 1)))
          cr_log_warn("unknown count %s in a TALLY line", tok);
      }
    } else if (!strncmp(line, "VIOLATION", 9) || !strncmp(line, "SLOW", 4) ||
               !strncmp(line, "SETUP", 5) || !strncmp(line, "KILLED", 6) ||
               !strncmp(line, "ODD", 3) || !strncmp(line, "DESTROY", 7) ||
               !strncmp(line, "LEFT", 4) || !strncmp(line, "FAIL", 4) ||
               !strncmp(line, "HANG", 4) || !strncmp(line, "STEP", 4)) {
      fprintf(stderr, "%s\n", line);
      note_line(T, line);
      if (!strncmp(line, "VIOLATION", 9)) (*nviol)++;
      if (!strncmp(line, "FAIL", 4) || !strncmp(line, "HANG", 4)) (*nfail)++;
    }
    line = end ? end + 1 : NULL;
  }
  return ntally;
}

static void run_case_mpi(int backend, unsigned seed, int steps, int kill, fp_totals *T) {
  const char *w = env_program("MESHPG_FP_MPI_WORKER");
  fp_case c;
  fp_case_make(seed, backend, 1, steps, kill, &c);
  char what[2048], cmd[4096];
  fp_describe(&c, what, sizeof what);
  fprintf(stderr, "case %s\n", what);
  /* After a SIGKILL, --enable-recovery lets the survivors report; they
   * then leave without MPI_Finalize (fault_props_mpi_worker.c). */
  int limit = 240;
  snprintf(cmd, sizeof cmd, "timeout -k 5 %d " MPIRUN "%s-np %d '%s' %u %d %d", limit,
           kill ? "--enable-recovery " : "", c.world, w, seed, steps, kill);
  double secs = 0;
  int rc = run(cmd, &secs);
  fp_tally sum = {0};
  long nviol = 0, nfail = 0;
  int ntally = parse_job(T, &sum, &nviol, &nfail);
  /* A rank that died before its TALLY line still printed its violations. */
  if (nviol > sum.violations) sum.violations = nviol;
  cr_expect_neq(rc, 124, "case %s: the job ran into the %d s limit (a hang):\n%s", what, limit,
                out);
  cr_expect_null(strstr(out, "core dumped"), "case %s:\n%s", what, out);
  cr_expect_eq(nfail, 0, "case %s: %ld FAIL or HANG lines (a rank died, hung or could not "
               "start):\n%s", what, nfail, out);
  /* Every rank reports, the killed one right before its SIGKILL. */
  cr_expect_eq(ntally, c.world, "case %s: %d of %d ranks reported (exit %d):\n%s", what,
               ntally, c.world, rc, out);
  if (!kill) cr_expect_eq(rc, 0, "case %s: exit %d:\n%s", what, rc, out);
  char head[96];
  snprintf(head, sizeof head, "case %u: mpirun exit %d after %.2f s", seed, rc, secs);
  print_tally(head, &sum);
  fp_tally_sum(&T->t, &sum);
  T->case_steps += steps;
  T->cases++;
  T->secs += secs;
}

/* `cases` jobs of `steps` steps from seed `first` (or the one of
 * MESHPG_FP_SEED), those with kill_every | k ending with a SIGKILL. */
static void run_procs(int backend, unsigned first, int cases, int steps, int kill_every,
                      long min_steps) {
  if (!getenv("MESHPG_FP_MPI_WORKER")) cr_skip_test("built without MPI");
  fp_totals *T = calloc(1, sizeof *T);
  cr_assert_not_null(T);
  int seed = env_int("MESHPG_FP_SEED", -1), share = sanitizer_share();
  steps = env_int("MESHPG_FP_STEPS", steps);
  cases = env_int("MESHPG_FP_CASES", (cases + share - 1) / share);
  min_steps /= share;
  if (seed >= 0)
    run_case_mpi(backend, (unsigned)seed, steps, env_int("MESHPG_FP_KILL", 0), T);
  else
    for (int k = 0; k < cases; k++)
      run_case_mpi(backend, first + (unsigned)k, steps, k % kill_every == kill_every - 1, T);
  fp_case c;
  fp_case_make(0, backend, 1, 1, 0, &c);
  judge(fp_name(&c), T, custom_run(), min_steps);
  free(T);
}

#ifndef FP_ON_DOUBLE
/* 8 jobs of 130 steps, every other one ending with a SIGKILL. */
Test(fault_props_mpi, ok_and_valid_means_the_reference_sum, .timeout = 900) {
  run_procs(FP_MPI, 501, 8, 130, 2, 1000);
}

/* Found by this test (case 1 of the mpi backend, 70 steps): world 3 (cp=3,
 * so dp_cp is the world's communicator), MESHPG_SHM=0,
 * MESHPG_CHECK_ORDER=1, MESHPG_MPI_PIECE_BYTES=512.  In step 64 rank 0's
 * first allocation from before finish fails: the issue-order check's
 * all-reduce (op max, i64, count 4) fails on rank 0 alone with
 * MPG_ERR_NOMEM ("out of memory for a request"), and its context stays
 * alive; rank 0's next collective on that communicator then meets ranks 1
 * and 2's pending check, and Open MPI fails it with MPI_ERR_TRUNCATE in
 * MPI_Test under MPI_ERRORS_ARE_FATAL: the whole job dies (exit 15).  Every
 * rank must instead fail with an error (the failed post aborting the
 * context, as every other collective's does: 025e93e). */
Test(fault_props_mpi, failed_post_in_the_issue_order_check, .timeout = 300) {
  if (!getenv("MESHPG_FP_MPI_WORKER")) cr_skip_test("built without MPI");
  fp_totals *T = calloc(1, sizeof *T);
  cr_assert_not_null(T);
  run_case_mpi(FP_MPI, 1, 70, 0, T);
  judge("mpi case 1", T, 1, 0);
  free(T);
}
#else
/* The nccl backend on the double's processes (each one a node of
 * MESHPG_DOUBLE_DEVICES devices; the ranks take devices 0..world-1 of
 * their own node): 4 jobs of 100 steps, each ending with a SIGKILL. */
Test(fault_props_double_mpi, ok_and_valid_means_the_reference_sum, .timeout = 900) {
  run_procs(FP_NCCL, 1501, 4, 100, 1, 400);
}
#endif
