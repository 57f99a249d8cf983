/* Crash safety of mpg_ckpt_save: a child process (4 thread ranks) holds a
 * complete checkpoint A in DIR, then saves B (other values, another step)
 * into DIR and then into DIR2; the parent SIGKILLs it after a random delay
 * within the measured duration of those two saves.  Then, 20 times out of
 * 20:
 *  - DIR loads (under another mesh, 3 ranks) as exactly A or exactly B:
 *    every element holds the values of the step it reports, and its files
 *    pass the on-disk checks (every element once, checksums, values);
 *  - DIR2 is absent or loads as exactly B (a DIR2.partial does not count);
 *  - a new save C over each of them (over whatever a kill left, a
 *    .partial included) succeeds, loads as C and leaves no .partial.
 * The log counts the kills that landed before DIR's publish, between the
 * two publishes and after both. */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../support/clock.h"
#include "ckpt_check.h"
#include "ckpt_fs.h"

static char g_root[4096];

static void root_fini(void) {
  if (g_root[0]) ckf_rm_rf(g_root);
}

/* A case of about 8 MB over 4 ranks (save) and 3 (load). */
static void kill_case(ck_case *c) {
  ck_case_make(c, 4242, 4, 3, 1);
  size_t bytes = ck_case_bytes(c);
  size_t f = (8u << 20) / (bytes ? bytes : 1) + 1;
  for (int k = 0; k < c->ntensors; k++)
    if (!c->t[k].bytes) c->t[k].shape[0] *= f;
}

typedef struct child_arg {
  const ck_case *c;
  const char *dir, *dir2;
  int fd; /* the pipe to the parent */
  pthread_barrier_t filled;
} child_arg;

/* One rank of the child: A into dir; B into the buffers; once every rank
 * is there, tell the parent and save B into dir, then dir2. */
static mpg_status child_rank(const mpg_init_opts *opts, void *arg) {
  child_arg *a = arg;
  ck_rank *s = calloc(1, sizeof *s);
  mpg_status st = s ? ck_open(s, opts, a->c, &a->c->mesh[0], NULL) : MPG_ERR_NOMEM;
  if (!st) {
    ck_fill(s, 1);
    st = mpg_ckpt_save(s->ck, a->dir, 1, NULL);
  }
  if (!st) ck_fill(s, 2);
  pthread_barrier_wait(&a->filled); /* every rank: no mpg call may fail before */
  if (!st && s->rank == 0 && write(a->fd, "A", 1) != 1) st = MPG_ERR_IO;
  if (!st) st = mpg_ckpt_save(s->ck, a->dir, 2, NULL);
  if (!st) st = mpg_ckpt_save(s->ck, a->dir2, 2, NULL);
  if (!st && s->rank == 0 && write(a->fd, "B", 1) != 1) st = MPG_ERR_IO;
  if (st && s && s->msg[0]) fprintf(stderr, "child: %s\n", s->msg);
  if (st) fprintf(stderr, "child rank %d: %s: %s\n", opts->rank, mpg_status_name(st),
                  mpg_last_error());
  if (s) ck_close(s);
  free(s);
  return st;
}

/* Fork the child; kill it `delay` s after A is complete (delay < 0: let
 * it finish).  Returns the seconds from A to B (0 when killed first). */
static double run_child(const ck_case *c, const char *dir, const char *dir2, double delay) {
  int fds[2];
  cr_assert_eq(pipe(fds), 0);
  pid_t pid = fork();
  cr_assert_geq(pid, 0);
  if (pid == 0) {
    close(fds[0]);
    child_arg a = {c, dir, dir2, fds[1], {{0}}};
    pthread_barrier_init(&a.filled, NULL, (unsigned)c->mesh[0].world);
    _exit(mpg_thread_run(c->mesh[0].world, 120, child_rank, &a, NULL) == MPG_OK ? 0 : 1);
  }
  close(fds[1]);
  char ch = 0;
  cr_assert_eq(read(fds[0], &ch, 1), 1, "the child did not save A");
  double t0 = now_s(), took = 0;
  if (delay >= 0) {
    sleep_s(delay);
    kill(pid, SIGKILL);
  } else {
    cr_assert_eq(read(fds[0], &ch, 1), 1, "the child did not save B");
    took = now_s() - t0;
  }
  close(fds[0]);
  int st;
  waitpid(pid, &st, 0);
  if (delay < 0) cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the child failed");
  return took;
}

/* Load dir under mesh 1 into zeroed buffers, whatever its step: every
 * element must hold that step's values, and the files pass the on-disk
 * checks.  Returns the step. */
static long load_any(const ck_case *c, const char *dir) {
  ck_job *j = calloc(1, sizeof *j);
  cr_assert_not_null(j);
  *j = (ck_job){.c = c, .which = 1, .dir = dir, .version = CK_BY_STEP};
  mpg_status rc = mpg_thread_run(c->mesh[1].world, 120, ck_job_thread, j, NULL);
  char fails[8192];
  cr_assert_eq(rc, MPG_OK, "load of %s after the kill: %s", dir,
               ck_job_failures(j, c->mesh[1].world, fails, sizeof fails));
  long step = j->got_step[0];
  for (int r = 1; r < c->mesh[1].world; r++) cr_assert_eq(j->got_step[r], step);
  free(j);
  char msg[2048];
  cr_assert(step == 1 || step == 2, "%s has step %ld", dir, step);
  cr_assert_eq(ckf_meta_check(c, 0, dir, step, (int)step, CKF_ALLOW_PARTIAL, NULL, NULL, msg,
                              sizeof msg),
               0, "%s: %s", dir, msg);
  return step;
}

/* A job of c on its thread ranks; assert success. */
static void job(const ck_case *c, int which, const char *dir, int version) {
  ck_job *j = calloc(1, sizeof *j);
  cr_assert_not_null(j);
  *j = (ck_job){.c = c, .which = which, .dir = dir, .version = version, .step = version};
  mpg_status rc = mpg_thread_run(c->mesh[which].world, 120, ck_job_thread, j, NULL);
  char fails[8192];
  cr_assert_eq(rc, MPG_OK, "%s of %s: %s", which ? "load" : "save", dir,
               ck_job_failures(j, c->mesh[which].world, fails, sizeof fails));
  free(j);
}

Test(ckpt_kill, sigkill_during_save_leaves_a_or_b, .timeout = 600, .fini = root_fini) {
  cr_assert_eq(ckf_tmpdir(g_root, sizeof g_root, "kill"), 0, "%s", strerror(errno));
  ck_case *c = malloc(sizeof *c);
  cr_assert_not_null(c);
  kill_case(c);
  char dir[4200], dir2[4200], part[4300], part2[4300];
  snprintf(dir, sizeof dir, "%s/ck", g_root);
  snprintf(dir2, sizeof dir2, "%s/ck2", g_root);
  snprintf(part, sizeof part, "%s.partial", dir);
  snprintf(part2, sizeof part2, "%s.partial", dir2);
  double cal[3];
  const int ncal = getenv("MESHPG_SANITIZER") ? 1 : 3; /* CI's time, as the trials below */
  for (int i = 0; i < ncal; i++) {
    cal[i] = run_child(c, dir, dir2, -1);
    cr_assert_eq(load_any(c, dir), 2);
    cr_assert_eq(load_any(c, dir2), 2);
    ckf_rm_rf(dir);
    ckf_rm_rf(dir2);
  }
  if (ncal == 1) cal[1] = cal[2] = cal[0];
  double lo = cal[0] < cal[1] ? cal[0] : cal[1], hi = cal[0] < cal[1] ? cal[1] : cal[0];
  double T = cal[2] < lo ? lo : cal[2] > hi ? hi : cal[2]; /* the median */
  cr_log_info("%zu bytes, 4 ranks: B into DIR and DIR2 takes %.3f s (median of %.3f %.3f %.3f)",
              ck_case_bytes(c), T, cal[0], cal[1], cal[2]);
  unsigned rs = 12345;
  int before = 0, between = 0, after = 0, partials = 0;
  /* 20 kills in the plain build; 4 in a sanitizer build (MESHPG_SANITIZER),
   * which looks for memory and race errors, not for more moments, and
   * would take minutes of CI for the other 16. */
  const int trials = getenv("MESHPG_SANITIZER") ? 4 : 20;
  for (int trial = 0; trial < trials; trial++) {
    rs = rs * 1103515245u + 12345u;
    double delay = T * (double)((rs >> 8) % 1000) / 1000.0;
    run_child(c, dir, dir2, delay);
    long s1 = load_any(c, dir);
    int has2 = ckf_exists(dir2);
    partials += ckf_exists(part) + ckf_exists(part2);
    if (has2) cr_assert_eq(load_any(c, dir2), 2, "trial %d: %s", trial, dir2);
    cr_assert(!(s1 == 1 && has2), "trial %d: DIR2 was published before DIR", trial);
    before += s1 == 1;
    between += s1 == 2 && !has2;
    after += s1 == 2 && has2;
    cr_log_info("trial %2d: killed after %.3f s: DIR holds %s, DIR2 %s%s%s", trial, delay,
                s1 == 1 ? "A" : "B", has2 ? "B" : "absent",
                ckf_exists(part) ? ", DIR.partial left" : "",
                ckf_exists(part2) ? ", DIR2.partial left" : "");
    /* a new save over whatever the kill left */
    job(c, 0, dir2, 3);
    job(c, 1, dir2, 3);
    cr_assert(!ckf_exists(part2), "trial %d: %s left after a complete save", trial, part2);
    job(c, 0, dir, 4);
    job(c, 1, dir, 4);
    ckf_rm_rf(dir);
    ckf_rm_rf(dir2);
  }
  cr_log_info("%d kills: %d before DIR's publish (A), %d between the publishes (B, no DIR2), "
              "%d after both (B, B); %d .partial directories left by kills",
              trials, before, between, after, partials);
  printf("ckpt_kill: %d/%d ok: %d before DIR's publish, %d between, %d after both; "
         "%d .partial left\n", trials, trials, before, between, after, partials);
  cr_assert_eq(before + between + after, trials);
  free(c);
}
