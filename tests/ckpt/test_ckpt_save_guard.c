/* The guards of mpg_ckpt_save (issue 45; sync/ckpt_lock.c, ckpt_write.c,
 * ckpt_overlap.c) on thread ranks: one saver per directory (two jobs at
 * once), no symbolic link followed and no foreign file removed, the same
 * status on every rank at once (a failure on one rank after the exchange;
 * a write error), overlapping boxes that differ, and a status that says
 * whether the save was published.  Every test starts from a good
 * checkpoint that must survive every refused or failed save. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ckpt_check.h"
#include "ckpt_fs.h"
#include "ckpt_root.h"
#include "ckpt_save_shared.h" /* mpg__ckpt_fault: a failure injected on one rank */

#define G_RANKS 4
#define G_MAXT 3


static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The 1 s of the issue, x3 in a sanitizer build. */
static double one_second(void) { return getenv("MESHPG_SANITIZER") ? 3.0 : 1.0; }

/* ------------------------------------------------------------------ */
/* A job: every rank registers its tensors (f32), then saves or loads  */
/* ------------------------------------------------------------------ */

typedef struct g_tensor {
  char name[32];
  int ndim;
  size_t shape[2], box_off[2], box_shape[2];
  size_t range_off, range_count; /* 0: the whole box */
} g_tensor;

typedef struct g_job {
  int world, load, async;
  const char *dir;
  long step;              /* saved; a load's step comes back in got_step */
  double timeout_s;
  double rank_timeout_s[G_RANKS]; /* > 0: this rank's opts.timeout_s */
  int nt[G_RANKS];        /* per rank: its tensors */
  g_tensor t[G_RANKS][G_MAXT];
  float value[G_RANKS];   /* what a save writes: every element */
  int odd_elem[G_RANKS];  /* >= 0: that element of the rank's first buffer is -1 */
  float *buf[G_RANKS][G_MAXT];
  mpg_status st[G_RANKS], save_st[G_RANKS];
  double t0[G_RANKS], t1[G_RANKS];
  long got_step[G_RANKS];
  int bad_values[G_RANKS]; /* a load: elements that are not value[rank] */
  char err[G_RANKS][1024];
} g_job;

static size_t elems_of(const g_tensor *t) {
  size_t n = 1;
  for (int d = 0; d < t->ndim; d++) n *= t->box_shape[d];
  return t->range_count ? t->range_count : n;
}

static mpg_status g_rank(const mpg_init_opts *opts, void *arg) {
  g_job *j = arg;
  int r = opts->rank;
  ck_case *c = calloc(1, sizeof *c);
  ck_rank *s = calloc(1, sizeof *s);
  if (!c || !s) return MPG_ERR_NOMEM;
  char dims[32];
  snprintf(dims, sizeof dims, "dp=%d", j->world);
  ck_mesh_plain(&c->mesh[0], dims, "dp_cp=dp", j->world, 0);
  mpg_ckpt_opts co = MPG_CKPT_OPTS_INIT;
  co.async = j->async;
  co.timeout_s = j->rank_timeout_s[r] > 0 ? j->rank_timeout_s[r]
                 : j->timeout_s > 0      ? j->timeout_s
                                         : 60;
  co.block_bytes = 1 << 16;
  mpg_status st = ck_open(s, opts, c, &c->mesh[0], &co);
  for (int k = 0; k < j->nt[r] && !st; k++) {
    const g_tensor *t = &j->t[r][k];
    size_t n = elems_of(t);
    float *b = j->buf[r][k] = malloc(n * sizeof *b);
    if (!b) {
      st = MPG_ERR_NOMEM;
      break;
    }
    for (size_t i = 0; i < n; i++) b[i] = j->load ? -7.0f : j->value[r];
    if (!j->load && k == 0 && j->odd_elem[r] >= 0 && (size_t)j->odd_elem[r] < n)
      b[j->odd_elem[r]] = -1.0f;
    mpg_tensor_layout l = MPG_TENSOR_LAYOUT_INIT;
    l.ndim = t->ndim;
    for (int d = 0; d < t->ndim; d++) {
      l.shape[d] = t->shape[d];
      l.box_offset[d] = t->box_off[d];
      l.box_shape[d] = t->box_shape[d];
    }
    l.range_offset = t->range_off;
    l.range_count = t->range_count;
    st = mpg_ckpt_add(s->ck, t->name, MPG_F32, &l, b, NULL);
  }
  if (st) {
    snprintf(j->err[r], sizeof j->err[r], "setup: %s", mpg_last_error());
    j->st[r] = st;
  } else {
    j->t0[r] = now_s();
    if (j->load) {
      st = mpg_ckpt_load(s->ck, j->dir, &j->got_step[r], NULL);
    } else {
      st = j->save_st[r] = mpg_ckpt_save(s->ck, j->dir, j->step, NULL);
      if (!st && j->async) {
        for (int k = 0; k < j->nt[r]; k++) /* the buffers change at once */
          for (size_t i = 0; i < elems_of(&j->t[r][k]); i++) j->buf[r][k][i] = -3.0f;
        st = mpg_ckpt_wait(s->ck);
      }
    }
    j->t1[r] = now_s();
    j->st[r] = st;
    if (st) snprintf(j->err[r], sizeof j->err[r], "%s", mpg_last_error());
    for (int k = 0; k < j->nt[r] && j->load && !st; k++)
      for (size_t i = 0; i < elems_of(&j->t[r][k]); i++)
        j->bad_values[r] += j->buf[r][k][i] != (float)j->got_step[r];
  }
  ck_close(s);
  for (int k = 0; k < j->nt[r]; k++) free(j->buf[r][k]);
  free(s);
  free(c);
  return MPG_OK;
}

static void g_run(g_job *j) {
  mpg_status sts[G_RANKS];
  mpg_status rc = mpg_thread_run(j->world, 120.0, g_rank, j, sts);
  cr_assert_eq(rc, MPG_OK, "mpg_thread_run: %s", mpg_last_error());
}

/* A 1-D tensor of n elements whole on every rank of j, value `v`. */
static void g_whole(g_job *j, int world, const char *name, size_t n) {
  for (int r = 0; r < world; r++) {
    g_tensor *t = &j->t[r][j->nt[r]++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->ndim = 1;
    t->shape[0] = t->box_shape[0] = n;
  }
}

/* A fresh job of `world` ranks, every element of rank r's buffers step. */
static g_job *g_new(int world, const char *dir, long step) {
  g_job *j = calloc(1, sizeof *j);
  cr_assert_not_null(j);
  j->world = world;
  j->dir = dir;
  j->step = step;
  for (int r = 0; r < G_RANKS; r++) {
    j->value[r] = (float)step;
    j->odd_elem[r] = -1;
  }
  return j;
}

/* Every rank got `want` (MPG_OK or a failure) within one second of each
 * other; each message holds needle (NULL: none). */
static void expect_all(const g_job *j, mpg_status want, const char *needle) {
  double lo = 1e30, hi = 0;
  for (int r = 0; r < j->world; r++) {
    cr_assert_eq(j->st[r], want, "rank %d: %s instead of %s: %s", r, mpg_status_name(j->st[r]),
                 mpg_status_name(want), j->err[r]);
    if (needle)
      cr_assert(strstr(j->err[r], needle), "rank %d's message does not name \"%s\": %s", r,
                needle, j->err[r]);
    if (j->t1[r] < lo) lo = j->t1[r];
    if (j->t1[r] > hi) hi = j->t1[r];
  }
  cr_assert_leq(hi - lo, one_second(), "the ranks returned %.2f s apart", hi - lo);
}

/* Load j's registrations from j->dir: every rank MPG_OK, step `step`,
 * every element the step's value. */
static void expect_holds(const g_job *like, long step) {
  g_job *l = calloc(1, sizeof *l);
  cr_assert_not_null(l);
  *l = *like;
  l->load = 1;
  l->async = 0;
  l->timeout_s = 60;
  memset(l->st, 0, sizeof l->st);
  g_run(l);
  for (int r = 0; r < l->world; r++) {
    cr_assert_eq(l->st[r], MPG_OK, "loading %s, rank %d: %s", l->dir, r, l->err[r]);
    cr_assert_eq(l->got_step[r], step, "%s holds step %ld, expected %ld", l->dir,
                 l->got_step[r], step);
    cr_assert_eq(l->bad_values[r], 0, "%s: rank %d: %d elements not of step %ld", l->dir, r,
                 l->bad_values[r], step);
  }
  free(l);
}


static void put_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  cr_assert_not_null(f, "%s: %s", path, strerror(errno));
  fputs(text, f);
  fclose(f);
}

static void expect_listing(const char *dir, const char *want) {
  char list[4096];
  ckf_list(dir, list, sizeof list);
  cr_assert_str_eq(list, want, "%s holds \"%s\", expected \"%s\"", dir, list, want);
}

/* A good checkpoint of step 1 (2 ranks, two tensors) in g_root/ck. */
static g_job *good_checkpoint(char *dir, size_t cap, int world) {
  path_in(dir, cap, "ck");
  g_job *j = g_new(world, dir, 1);
  g_whole(j, world, "a.w", 3000);
  g_whole(j, world, "b.w", 5000);
  g_run(j);
  expect_all(j, MPG_OK, NULL);
  return j;
}

/* ------------------------------------------------------------------ */
/* Item 1: two jobs saving to one directory                            */
/* ------------------------------------------------------------------ */

typedef struct g_result {
  mpg_status st[2];
  double secs[2];
  char err[2][400];
} g_result;

/* A child process: wait for the go, save step `step` (2 ranks, 16 MB),
 * report through the pipe. */
static void two_jobs_child(const char *dir, long step, int go, int out) {
  char c;
  if (read(go, &c, 1) != 1) _exit(3);
  g_job *j = g_new(2, dir, step);
  j->nt[0] = j->nt[1] = 0;
  g_whole(j, 2, "a.w", 3000);
  g_whole(j, 2, "b.w", 5000);
  g_whole(j, 2, "c.w", (size_t)2 << 20);
  mpg_status sts[2];
  if (mpg_thread_run(2, 120.0, g_rank, j, sts) != MPG_OK) _exit(4);
  g_result res;
  memset(&res, 0, sizeof res);
  for (int r = 0; r < 2; r++) {
    res.st[r] = j->st[r];
    res.secs[r] = j->t1[r] - j->t0[r];
    snprintf(res.err[r], sizeof res.err[r], "%.399s", j->err[r]);
  }
  _exit(write(out, &res, sizeof res) == (ssize_t)sizeof res ? 0 : 5);
}

Test(ckpt_guard, two_jobs_saving_to_one_dir, .timeout = 300, .fini = root_fini) {
  root_init("twojobs");
  char dir[4200];
  g_job *j = good_checkpoint(dir, sizeof dir, 2);
  g_whole(j, 2, "c.w", (size_t)2 << 20);
  long good = 1;
  int refused = 0;
  const int rounds = 6;
  for (int round = 0; round < rounds; round++) {
    long steps[2] = {10 + 2 * round, 11 + 2 * round};
    int go[2], out[2][2];
    cr_assert_eq(pipe(go), 0);
    pid_t pid[2];
    for (int k = 0; k < 2; k++) {
      cr_assert_eq(pipe(out[k]), 0);
      pid[k] = fork();
      cr_assert_geq(pid[k], 0);
      if (pid[k] == 0) {
        close(go[1]);
        close(out[k][0]);
        two_jobs_child(dir, steps[k], go[0], out[k][1]);
      }
      close(out[k][1]);
    }
    close(go[0]);
    cr_assert_eq(write(go[1], "gg", 2), 2); /* both at once */
    close(go[1]);
    g_result res[2];
    for (int k = 0; k < 2; k++) {
      ssize_t n = read(out[k][0], &res[k], sizeof res[k]);
      close(out[k][0]);
      int ws;
      waitpid(pid[k], &ws, 0);
      cr_assert(n == (ssize_t)sizeof res[k] && WIFEXITED(ws) && WEXITSTATUS(ws) == 0,
                "round %d: job %d died", round, k);
    }
    int ok[2];
    for (int k = 0; k < 2; k++) {
      cr_assert_eq(res[k].st[0], res[k].st[1], "round %d job %d: ranks differ: %s / %s", round,
                   k, res[k].err[0], res[k].err[1]);
      ok[k] = res[k].st[0] == MPG_OK;
      if (!ok[k]) {
        cr_assert_eq(res[k].st[0], MPG_ERR_STATE, "round %d job %d: %s", round, k,
                     res[k].err[0]);
        cr_assert(strstr(res[k].err[0], "another job is saving") && strstr(res[k].err[0], "pid"),
                  "round %d: the loser's message does not name the holder: %s", round,
                  res[k].err[0]);
        cr_assert_leq(res[k].secs[0], one_second(), "round %d: the loser took %.2f s", round,
                      res[k].secs[0]);
        refused++;
        if (round == 0) cr_log_info("the loser: %s", res[k].err[0]);
      }
    }
    /* DIR holds the data of a job that returned MPG_OK, or the last good one. */
    g_job *l = calloc(1, sizeof *l);
    *l = *j;
    l->load = 1;
    g_run(l);
    long got = l->got_step[0];
    for (int r = 0; r < 2; r++) {
      cr_assert_eq(l->st[r], MPG_OK, "round %d: DIR does not load: %s", round, l->err[r]);
      cr_assert_eq(l->bad_values[r], 0, "round %d: DIR's step %ld has other values", round, got);
    }
    int allowed = (ok[0] && got == steps[0]) || (ok[1] && got == steps[1]) ||
                  (!ok[0] && !ok[1] && got == good);
    cr_assert(allowed, "round %d: DIR holds step %ld; jobs %ld: %s, %ld: %s; last good %ld", round,
              got, steps[0], ok[0] ? "OK" : res[0].err[0], steps[1], ok[1] ? "OK" : res[1].err[0],
              good);
    good = got;
    free(l);
    expect_listing(g_root, "ck");
  }
  cr_log_info("two jobs at once, %d rounds: %d saves refused at once", rounds, refused);
  cr_assert_gt(refused, 0, "the two jobs never overlapped in %d rounds", rounds);
  free(j);
}

/* ------------------------------------------------------------------ */
/* Item 2: DIR.partial a symbolic link; foreign entries                */
/* ------------------------------------------------------------------ */

Test(ckpt_guard, partial_is_a_symlink, .timeout = 120, .fini = root_fini) {
  root_init("symlink");
  char dir[4200], part[4300], target[4200], f1[4300], f2[4300], lock[4300];
  g_job *j = good_checkpoint(dir, sizeof dir, 2);
  path_in(target, sizeof target, "elsewhere");
  cr_assert_eq(mkdir(target, 0755), 0);
  snprintf(f1, sizeof f1, "%s/precious.txt", target);
  snprintf(f2, sizeof f2, "%s/data-00000.bin", target); /* a name a save writes */
  put_file(f1, "mine\n");
  put_file(f2, "mine too\n");
  snprintf(part, sizeof part, "%s.partial", dir);
  cr_assert_eq(symlink(target, part), 0);
  j->step = 2;
  j->value[0] = j->value[1] = 2;
  g_run(j);
  expect_all(j, MPG_ERR_INVALID, "symbolic link");
  cr_assert(strstr(j->err[0], "ck.partial"), "%s", j->err[0]);
  cr_log_info("DIR.partial a link: %s", j->err[0]);
  expect_listing(target, "data-00000.bin precious.txt");
  expect_holds(j, 1);
  /* DIR.lock a link to a user's file: refused, the file untouched. */
  cr_assert_eq(unlink(part), 0);
  snprintf(lock, sizeof lock, "%s.lock", dir);
  cr_assert_eq(symlink(f1, lock), 0);
  g_run(j);
  expect_all(j, MPG_ERR_INVALID, "ck.lock");
  struct stat sb;
  cr_assert_eq(stat(f1, &sb), 0);
  cr_assert_eq(sb.st_size, 5, "the link's target was written");
  cr_assert_eq(unlink(lock), 0);
  /* DIR itself a link to a checkpoint: refused, not followed. */
  char dir2[4200];
  path_in(dir2, sizeof dir2, "ck-link");
  cr_assert_eq(symlink(dir, dir2), 0);
  j->dir = dir2;
  g_run(j);
  expect_all(j, MPG_ERR_INVALID, "symbolic link");
  cr_assert_eq(unlink(dir2), 0);
  j->dir = dir;
  /* Then the save goes through. */
  g_run(j);
  expect_all(j, MPG_OK, NULL);
  expect_holds(j, 2);
  expect_listing(g_root, "ck elsewhere");
  free(j);
}

/* Try to make path immutable (chattr +i): 0, or -1 where the file system
 * has no such flag. */
static int make_immutable(const char *path, int on) {
  int fd = open(path, O_RDONLY | O_NONBLOCK);
  if (fd < 0) return -1;
  int flags = 0, rc = ioctl(fd, FS_IOC_GETFLAGS, &flags);
  if (!rc) {
    flags = on ? flags | FS_IMMUTABLE_FL : flags & ~FS_IMMUTABLE_FL;
    rc = ioctl(fd, FS_IOC_SETFLAGS, &flags);
  }
  close(fd);
  return rc ? -1 : 0;
}

/* A save over DIR with `entry` (made by make) in DIR.partial or in DIR:
 * refused before any write, naming it, everything left as it was; once it
 * is gone, the save goes through. */
static void refused_with(g_job *j, const char *where, const char *entry, int kind) {
  char place[4300], path[4400], before[4096], after[4096];
  snprintf(place, sizeof place, "%s%s", j->dir, where);
  if (where[0]) mkdir(place, 0755);
  snprintf(path, sizeof path, "%s/%s", place, entry);
  if (kind == 0) {
    cr_assert_eq(mkdir(path, 0755), 0);
    char inner[4500];
    snprintf(inner, sizeof inner, "%s/inside.txt", path);
    put_file(inner, "x\n");
  } else {
    put_file(path, "a user's file\n");
  }
  if (kind == 2 && make_immutable(path, 1)) {
    cr_log_warn("no immutable files here (FS_IOC_SETFLAGS): the undeletable case is skipped");
    unlink(path);
    if (where[0]) rmdir(place);
    return;
  }
  ckf_list(place, before, sizeof before);
  j->step++;
  for (int r = 0; r < j->world; r++) j->value[r] = (float)j->step;
  g_run(j);
  expect_all(j, MPG_ERR_INVALID, entry);
  cr_log_info("%s in %s: %s", entry, where[0] ? "DIR.partial" : "DIR", j->err[0]);
  ckf_list(place, after, sizeof after);
  cr_assert_str_eq(before, after, "%s changed: \"%s\" -> \"%s\"", place, before, after);
  expect_holds(j, j->step - 1 - (where[0] ? 0 : 0));
  if (kind == 2) make_immutable(path, 0);
  ckf_rm_rf(path);
  g_run(j);
  expect_all(j, MPG_OK, NULL);
  expect_holds(j, j->step);
  expect_listing(g_root, "ck");
}

Test(ckpt_guard, foreign_entry_refused, .timeout = 120, .fini = root_fini) {
  root_init("foreign");
  char dir[4200];
  g_job *j = good_checkpoint(dir, sizeof dir, 2);
  j->step = 1;
  refused_with(j, ".partial", "subdir", 0);
  refused_with(j, ".partial", "notes.txt", 1);
  refused_with(j, "", "README", 1);
  refused_with(j, "", "extra", 0);
  refused_with(j, ".partial", "data-00001.bin", 2); /* immutable */
  refused_with(j, "", "data-00009.bin", 2);
  free(j);
}

/* ------------------------------------------------------------------ */
/* Item 3: every rank the same status, at once                         */
/* ------------------------------------------------------------------ */

static int g_fail_rank;
static mpg_status fail_one_rank(int rank, const char *where) {
  if (rank != g_fail_rank) return MPG_OK;
  return mpg__fail(MPG_ERR_RANGE, "injected failure of world rank %d at \"%s\"", rank, where);
}

Test(ckpt_guard, ranks_return_the_same_status, .timeout = 120, .fini = root_fini) {
  root_init("status");
  char dir[4200];
  g_job *j = good_checkpoint(dir, sizeof dir, 3);
  j->timeout_s = 30; /* a rank that waited it out would show */
  mpg__ckpt_fault = fail_one_rank;
  for (int async = 0; async < 2; async++)
    for (g_fail_rank = 0; g_fail_rank < 3; g_fail_rank += 2) {
      j->async = async;
      j->step = 2;
      g_run(j);
      char needle[64];
      snprintf(needle, sizeof needle, "world rank %d", g_fail_rank);
      expect_all(j, MPG_ERR_RANGE, needle);
      for (int r = 0; r < 3; r++) {
        cr_assert_eq(j->save_st[r], MPG_ERR_RANGE, "async %d: rank %d's save returned %s",
                     async, r, mpg_status_name(j->save_st[r]));
        cr_assert_leq(j->t1[r] - j->t0[r], one_second(), "rank %d took %.2f s", r,
                      j->t1[r] - j->t0[r]);
      }
      cr_log_info("async %d, rank %d fails: %s", async, g_fail_rank, j->err[1]);
      expect_listing(g_root, "ck");
    }
  mpg__ckpt_fault = NULL;
  j->async = 0;
  expect_holds(j, 1);
  free(j);
}

/* ------------------------------------------------------------------ */
/* Item 8: overlapping boxes with different values                     */
/* ------------------------------------------------------------------ */

/* A 1-D tensor of n elements, its box [off, off + len), its range
 * (ro, rc). */
static void box1(g_tensor *t, const char *name, size_t n, size_t off, size_t len, size_t ro,
                 size_t rc) {
  *t = (g_tensor){.ndim = 1, .shape = {n}, .box_off = {off}, .box_shape = {len},
                  .range_off = ro, .range_count = rc};
  snprintf(t->name, sizeof t->name, "%s", name);
}

/* A rows x cols tensor, its box rows [r0, r0 + nr). */
static void box2(g_tensor *t, const char *name, size_t rows, size_t cols, size_t r0, size_t nr) {
  *t = (g_tensor){.ndim = 2, .shape = {rows, cols}, .box_off = {r0}, .box_shape = {nr, cols}};
  snprintf(t->name, sizeof t->name, "%s", name);
}

/* Under a new root (root_init(tag)): a job of step 1 saving to dir
 * (root/ck) on 2 ranks, one tensor each (box1, box2). */
static g_job *two_ranks_one_tensor(const char *tag, char *dir, size_t cap) {
  root_init(tag);
  path_in(dir, cap, "ck");
  g_job *j = g_new(2, dir, 1);
  j->nt[0] = j->nt[1] = 1;
  return j;
}

Test(ckpt_guard, overlapping_boxes_that_differ, .timeout = 120, .fini = root_fini) {
  char dir[4200];
  g_job *j = two_ranks_one_tensor("overlap", dir, sizeof dir);
  /* [8]: rank 0 elements 0-5, rank 1 elements 2-7, equal: saved, loads. */
  box1(&j->t[0][0], "t", 8, 0, 6, 0, 0);
  box1(&j->t[1][0], "t", 8, 2, 6, 0, 0);
  g_run(j);
  expect_all(j, MPG_OK, NULL);
  expect_holds(j, 1);
  /* The case: 1 1 1 1 1 1 and 2 2 2 2 2 2. */
  j->step = 2;
  j->value[1] = 3;
  g_run(j);
  expect_all(j, MPG_ERR_INVALID, "world ranks 0 and 1");
  expect_all(j, MPG_ERR_INVALID, "element [2]");
  cr_log_info("1-D: %s", j->err[1]);
  j->value[0] = j->value[1] = 2;
  expect_holds(j, 1);
  /* 2-D [4, 5]: rows 0-2 and rows 1-3, equal but element [2, 1]. */
  box2(&j->t[0][0], "m", 4, 5, 0, 3);
  box2(&j->t[1][0], "m", 4, 5, 1, 3);
  j->odd_elem[1] = 6; /* row 1 of rank 1's box, column 1 */
  g_run(j);
  expect_all(j, MPG_ERR_INVALID, "element [2, 1]");
  cr_log_info("2-D: %s", j->err[0]);
  /* Ranges of one box: [0, 5) and [3, 8) of [8], differing at element 4. */
  box1(&j->t[0][0], "r", 8, 0, 8, 0, 5);
  box1(&j->t[1][0], "r", 8, 0, 8, 3, 5);
  j->odd_elem[1] = 1; /* element 4 */
  g_run(j);
  expect_all(j, MPG_ERR_INVALID, "element [4]");
  cr_log_info("ranges: %s", j->err[0]);
  j->odd_elem[1] = -1;
  box1(&j->t[0][0], "t", 8, 0, 6, 0, 0);
  box1(&j->t[1][0], "t", 8, 2, 6, 0, 0);
  j->step = 1;
  expect_holds(j, 1);
  expect_listing(g_root, "ck");
  free(j);
}

/* ------------------------------------------------------------------ */
/* Item 9: a published save returns MPG_OK; one not published leaves   */
/* the old checkpoint                                                  */
/* ------------------------------------------------------------------ */

Test(ckpt_guard, published_means_ok, .timeout = 120, .fini = root_fini) {
  /* Rank 0 writes 48 MB, rank 1 a little and waits for the verdict with a
   * timeout far shorter than rank 0's writing: rank 1 gives up waiting,
   * rank 0 publishes. */
  char dir[4200];
  g_job *j = two_ranks_one_tensor("published", dir, sizeof dir);
  box1(&j->t[0][0], "big0", (size_t)12 << 20, 0, (size_t)12 << 20, 0, 0);
  box1(&j->t[1][0], "small1", 1000, 0, 1000, 0, 0);
  g_run(j);
  expect_all(j, MPG_OK, NULL);
  j->step = 2;
  j->value[0] = j->value[1] = 2;
  j->rank_timeout_s[1] = 0.005;
  g_run(j);
  for (int r = 0; r < 2; r++)
    cr_assert_eq(j->st[r], j->st[0], "rank %d: %s, rank 0: %s", r, j->err[r], j->err[0]);
  cr_log_info("rank 0 slow: %s (rank 0 %.3f s, rank 1 %.3f s)", mpg_status_name(j->st[0]),
              j->t1[0] - j->t0[0], j->t1[1] - j->t0[1]);
  cr_assert_eq(j->st[0], MPG_OK, "a published save: %s", j->err[0]);
  j->rank_timeout_s[1] = 0;
  expect_holds(j, 2);
  /* Now rank 1 writes the 48 MB and rank 0 (a short timeout) gives up on
   * it: nothing published, the old checkpoint stays. */
  box1(&j->t[1][0], "big1", (size_t)12 << 20, 0, (size_t)12 << 20, 0, 0);
  box1(&j->t[0][0], "small0", 1000, 0, 1000, 0, 0);
  g_run(j); /* the checkpoint of these names, step 2 */
  expect_all(j, MPG_OK, NULL);
  j->step = 3;
  j->value[0] = j->value[1] = 3;
  j->rank_timeout_s[0] = 0.005;
  g_run(j);
  expect_all(j, MPG_ERR_TIMEOUT, "world rank 1");
  cr_log_info("rank 1 slow: %s", j->err[0]);
  j->rank_timeout_s[0] = 0;
  j->value[0] = j->value[1] = 2;
  expect_holds(j, 2);
  expect_listing(g_root, "ck");
  free(j);
}

/* ------------------------------------------------------------------ */
/* Item 10: a write error reaches every rank at once                    */
/* ------------------------------------------------------------------ */

/* Out of inodes: a tmpfs of 4 inodes (its root, ck.lock, ck.partial, one
 * data file), in a child process (ckf_in_private_tmpfs); each of 4 ranks
 * writes a file of its own. */
static int inodes_child(const char *mnt, char *msg, size_t cap) {
  char dir[4300];
  snprintf(dir, sizeof dir, "%.4200s/ck", mnt);
  g_job *j = g_new(4, dir, 1);
  for (int r = 0; r < 4; r++) {
    char name[16];
    snprintf(name, sizeof name, "rank%d", r);
    j->nt[r] = 1;
    box1(&j->t[r][0], name, 1000, 0, 1000, 0, 0);
  }
  j->timeout_s = 30; /* waiting it out would show */
  mpg_status sts[4];
  if (mpg_thread_run(4, 120, g_rank, j, sts) != MPG_OK)
    return snprintf(msg, cap, "mpg_thread_run: %s", mpg_last_error()), 1;
  double lo = 1e30, hi = 0;
  for (int r = 0; r < 4; r++) {
    if (j->st[r] != MPG_ERR_IO || !strstr(j->err[r], "No space left") ||
        !strstr(j->err[r], "data-"))
      return snprintf(msg, cap, "rank %d: %s: %s", r, mpg_status_name(j->st[r]), j->err[r]), 1;
    if (j->t1[r] - j->t0[r] > hi) hi = j->t1[r] - j->t0[r];
    if (j->t1[r] - j->t0[r] < lo) lo = j->t1[r] - j->t0[r];
  }
  char list[1024];
  ckf_list(mnt, list, sizeof list);
  snprintf(msg, cap, "%s | every rank within %.3f s (%.3f s apart) | left: \"%s\"", j->err[0], hi,
           hi - lo, list);
  if (hi > one_second()) return 1;
  return list[0] ? 2 : 0;
}

Test(ckpt_guard, write_error_reaches_every_rank, .timeout = 120, .fini = root_fini) {
  root_init("inodes");
  expect_tmpfs_child("size=4m,nr_inodes=4", inodes_child, "", "out of inodes",
                     "the failed save left files behind");
}
