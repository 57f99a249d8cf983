/* The shared-memory path's failures are never reported as a success
 * (issue 35, groups/shm/).  Each case forces, through a seam, a state in
 * which the engine used to return MPG_OK on wrong data, and drives the
 * public API on the thread backend (two ranks as threads, one "dp" group,
 * a sync with MESHPG_SHM=1, op sum, integer-valued f32 gradients so that
 * every sum is exact).  Every case asserts, for every rank and step: the
 * step returns an error, or MPG_OK with exactly the reference sums, and
 * mpg_sync_grads_valid() is 1 only with exactly the reference sums.
 *
 *  - abort_window: the two-step abort.  Rank 1 holds back its post;
 *    rank 0's worker times out, wins the abort word and stalls right after
 *    winning (the seam mpg__shm_seams.abort_claimed), while rank 0's main
 *    thread times out too and loses.  Before, the loser read the status
 *    before the winner stored it, 0, and returned MPG_OK, unreduced (three
 *    steps in a row); the abort is now one atomic word.
 *  - post_nomem: rank 0's handle allocation fails (a wrapped calloc: the
 *    test links with -Wl,--wrap=calloc) in the post of step 1.  Before,
 *    nothing was published and nothing aborted, and rank 0's next post
 *    reused the operation number: the ranks paired step 2 with step 1,
 *    MPG_OK on wrong sums.  Now the failed post aborts the segment: every
 *    later operation of every member fails.
 *  - counter_wrap: the operation counters start at 2^32 - 2 (the seam
 *    first_q) with three buckets (ring depth 3): the third bucket is
 *    operation 0.  Before, slot q % 3 put operations 2^32 - 1 and 0 in
 *    one slot, and the slot-reuse wait (q >= depth) was skipped after the
 *    wrap: bucket B unreduced and C summed twice, MPG_OK.  Now every step
 *    succeeds with exact sums.
 *  - claim: rank 0's group "dp" is held by another thread of rank 0 (a
 *    blocking mpg_all_reduce) when its sync posts: the post fails with
 *    MPG_ERR_STATE naming the group in use, and rank 1 fails too
 *    (MPG_ERR_ABORTED naming rank 0's reason), instead of the ranks
 *    going on with one operation apart.
 *
 * And the all-gather (issue 34, mpg__shm_all_gather) on the engine itself,
 * segments made with mpg__shm_create on the thread backend:
 *
 *  - gather_values: every dtype, slices below and above the size that
 *    switches to non-temporal stores, three gathers in flight at once, a
 *    counter start just before the 32-bit wrap: every member's range
 *    equals, byte for byte, the backend's mpg_all_gather of the same
 *    slices, and the elements around the range are untouched;
 *  - gather_mismatch: member 0 posts an all-gather where member 1 posts a
 *    reduce-scatter of the same range: MPG_ERR_INVALID on both, naming the
 *    two members and the different operations;
 *  - gather_missing_member: of three members, the last never posts: the
 *    other two fail within the timeout + 1 s (tests/support/time_bound.h) with
 *    MPG_ERR_TIMEOUT or MPG_ERR_ABORTED naming it by position and rank;
 *  - gather_across_hosts: the hierarchical all-gather (simulated hosts,
 *    init opts host_id): 2 hosts x 2 members (by halves, and interleaved
 *    with the counters at the wrap) and 3 hosts x 2 (interleaved), every
 *    dtype, three gathers in flight, byte for byte the backend's
 *    mpg_all_gather, the elements around the range untouched;
 *  - gather_across_hosts_chunked: slices larger than the stage (a small
 *    segment gathered over its region's slack), so that the step across
 *    hosts runs in several chunks: still the backend's bytes;
 *  - gather_across_hosts_missing_member: 2 hosts x 2, the last member
 *    never posts: its host partner times out naming it by position and
 *    rank, the other host's members fail in their all-gather across hosts
 *    (MPG_ERR_TIMEOUT or MPG_ERR_ABORTED), all within the timeout + 1 s.
 *
 * Links the static library (the seams, and struct mpg_work's size for the
 * wrapped calloc). */
#include <criterion/criterion.h>

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "meshpg.h"
#include "shm_internal.h" /* mpg__shm_seams, struct mpg_work */
#include "../support/rank_check.h"
#include "../support/time_bound.h"

#define WORLD 2
#define MAX_STEPS 8
#define MAX_PARAMS 3
#define CAP_S 20.0 /* the longest any wait of a rank on another may take */

/* ------------------------------------------------------------------ */
/* The wrapped calloc                                                   */
/* ------------------------------------------------------------------ */

void *__real_calloc(size_t n, size_t size);
void *__wrap_calloc(size_t n, size_t size);

/* > 0: the calloc of a work handle (1 x struct mpg_work) this many calls
 * from now on this thread fails. */
static _Thread_local int tl_fail_work_calloc;
static atomic_int calloc_failures;

void *__wrap_calloc(size_t n, size_t size) {
  if (tl_fail_work_calloc > 0 && n == 1 && size == sizeof(struct mpg_work) &&
      --tl_fail_work_calloc == 0) {
    atomic_fetch_add(&calloc_failures, 1);
    errno = ENOMEM;
    return NULL;
  }
  return __real_calloc(n, size);
}

/* ------------------------------------------------------------------ */
/* The job: WORLD thread ranks, one sync over "dp" on the shared path   */
/* ------------------------------------------------------------------ */

enum { CASE_WINDOW, CASE_NOMEM, CASE_WRAP, CASE_CLAIM };

typedef struct step_rec {
  int ran;      /* the step was attempted */
  mpg_status st;
  int valid;    /* mpg_sync_grads_valid after it */
  int exact;    /* every gradient equals the reference sum */
  char msg[768];
} step_rec;

typedef struct job {
  int kind;
  int steps, rounds;
  double timeout_s;
  int nparams;
  size_t count[MAX_PARAMS];
  double bucket_mb;
  step_rec rec[WORLD][MAX_STEPS]; /* the last round's (each round's checked) */
  int bad_round[WORLD];           /* first round with a wrong OK, -1: none */
  char bad_msg[WORLD][256];
  int shm_buffers[WORLD], num_buckets[WORLD];
  atomic_int r0_done;             /* rank 0 ran all its steps */
  atomic_int busy_held;           /* claim: rank 0's helper holds "dp" */
} job;

/* Rank r's gradient of param p, element i, at step t: integers below
 * 2^24, so that every sum over the ranks is exact in f32, and every
 * mispairing (another step, another bucket, a bucket twice or not at all)
 * gives another value. */
static float grad_value(int r, int t, int p, size_t i) {
  return (float)((r + 1) * 100000 + t * 1000 + p * 100 + (int)(i % 100));
}

static float ref_sum(int t, int p, size_t i) {
  float s = 0;
  for (int r = 0; r < WORLD; r++) s += grad_value(r, t, p, i);
  return s;
}

static mpg_status write_grads(mpg_sync *s, const job *j, int r, int t) {
  for (int p = 0; p < j->nparams; p++) {
    void *v = NULL;
    RCALL(mpg_sync_grad(s, p, &v));
    float *g = v;
    for (size_t i = 0; i < j->count[p]; i++) g[i] = grad_value(r, t, p, i);
  }
  return MPG_OK;
}

static int grads_exact(mpg_sync *s, const job *j, int t) {
  for (int p = 0; p < j->nparams; p++) {
    void *v = NULL;
    if (mpg_sync_grad(s, p, &v)) return 0;
    const float *g = v;
    for (size_t i = 0; i < j->count[p]; i++)
      if (g[i] != ref_sum(t, p, i)) return 0;
  }
  return 1;
}

static void wait_flag(atomic_int *f) {
  double t0 = now_s();
  while (!atomic_load(f) && now_s() - t0 < CAP_S) sleep_s(0.002);
}

/* claim: rank 0's helper, an all-reduce on "dp" that blocks (holding the
 * group) until rank 1 joins it. */
typedef struct holder {
  mpg_group *g;
  float x;
  mpg_status st;
} holder;

static void *hold_group(void *arg) {
  holder *h = arg;
  h->st = mpg_all_reduce(h->g, &h->x, &h->x, 1, MPG_F32, MPG_OP_SUM, NULL, NULL);
  return NULL;
}

/* One step t of rank r: gradients, then the sync's step (rank 1 of the
 * window case first waits, with its step open, until rank 0 is done). */
static void run_step(job *j, mpg_sync *s, mpg_group *dp, int r, int t, step_rec *rec) {
  rec->ran = 1;
  rec->st = write_grads(s, j, r, t);
  if (rec->st) return;
  if (j->kind == CASE_NOMEM && r == 0 && t == 1) tl_fail_work_calloc = 1;
  pthread_t helper;
  holder h = {dp, 1.0f, MPG_OK};
  int helping = 0;
  if (j->kind == CASE_CLAIM && r == 0 && t == 1) {
    helping = pthread_create(&helper, NULL, hold_group, &h) == 0;
    /* Until the helper holds the group (its busy flag, coll.c). */
    double t0 = now_s();
    while (helping && !atomic_load(&dp->busy) && now_s() - t0 < CAP_S) sleep_s(0.001);
    atomic_store(&j->busy_held, 1);
  }
  if (j->kind == CASE_CLAIM && r == 1 && t == 1) wait_flag(&j->busy_held);
  if (j->kind == CASE_WINDOW && r == 1 && t == 0) {
    rec->st = mpg_sync_begin(s, t, 1, NULL);
    if (!rec->st) {
      wait_flag(&j->r0_done);
      for (int p = j->nparams - 1; p >= 0 && !rec->st; p--) rec->st = mpg_sync_mark_ready(s, p);
      mpg_status fst = mpg_sync_finish(s);
      if (!rec->st) rec->st = fst;
    }
  } else {
    rec->st = mpg_sync_all(s, t, NULL);
  }
  snprintf(rec->msg, sizeof rec->msg, "%s", rec->st ? mpg_last_error() : "");
  tl_fail_work_calloc = 0;
  rec->valid = mpg_sync_grads_valid(s);
  rec->exact = grads_exact(s, j, t);
  if (j->kind == CASE_CLAIM && r == 1 && t == 1) {
    /* Join the helper's all-reduce (or fail at once on an aborted
     * context), so that it returns. */
    float x = 2.0f;
    (void)mpg_all_reduce(dp, &x, &x, 1, MPG_F32, MPG_OP_SUM, NULL, NULL);
  }
  if (helping) pthread_join(helper, NULL);
}

static mpg_status rank_main(const mpg_init_opts *opts, void *arg) {
  job *j = arg;
  int r = opts->rank;
  j->bad_round[r] = -1;
  mpg_mesh *mesh = make_dims_mesh("dp=2");
  mpg_ctx *ctx = NULL;
  mpg_group *dp = NULL;
  mpg_status st = rank_open(opts, mesh, &ctx, "dp", &dp);
  for (int round = 0; round < j->rounds && !st; round++) {
    mpg_sync *s = NULL;
    mpg_sync_opts so = MPG_SYNC_OPTS_INIT;
    so.sync.op = MPG_OP_SUM;
    so.default_dims = "dp";
    so.sync.bucket_mb = j->bucket_mb;
    so.sync.first_bucket_mb = j->bucket_mb;
    RCALL(mpg_sync_create(ctx, &so, &s));
    for (int p = 0; p < j->nparams; p++) {
      char name[16];
      int id;
      snprintf(name, sizeof name, "w%d", p);
      RCALL(mpg_sync_add_param(s, name, j->count[p], MPG_F32, NULL, &id));
    }
    RCALL(mpg_sync_commit(s));
    mpg_sync_stats stats = MPG_SYNC_STATS_INIT;
    RCALL(mpg_sync_get_stats(s, &stats));
    j->shm_buffers[r] = stats.shm_buffers;
    j->num_buckets[r] = stats.num_buckets;
    for (int t = 0; t < j->steps; t++) {
      step_rec *rec = &j->rec[r][t];
      memset(rec, 0, sizeof *rec);
      run_step(j, s, dp, r, t, rec);
      if (j->bad_round[r] < 0 && ((rec->st == MPG_OK && !rec->exact) ||
                                  (rec->valid && !rec->exact))) {
        j->bad_round[r] = round;
        snprintf(j->bad_msg[r], sizeof j->bad_msg[r], "round %d step %d: %s, grads_valid %d",
                 round, t, mpg_status_name(rec->st), rec->valid);
      }
    }
    if (r == 0) atomic_store(&j->r0_done, 1);
    mpg_sync_destroy(s);
  }
  if (ctx) mpg_ctx_destroy(ctx);
  mpg_mesh_destroy(mesh);
  return st;
}

/* ------------------------------------------------------------------ */
/* Checks                                                               */
/* ------------------------------------------------------------------ */

static job *new_job(int kind, int steps, double timeout_s) {
  job *j = calloc(1, sizeof *j);
  cr_assert_not_null(j);
  j->kind = kind;
  j->steps = steps;
  j->rounds = 1;
  j->timeout_s = timeout_s;
  j->nparams = 1;
  j->count[0] = 256;
  j->bucket_mb = 25.0;
  setenv("MESHPG_SHM", "1", 1);
  /* The issue-order checker off, as by default outside the tests: it
   * would catch a mispairing of whole steps itself (the ranks' records
   * differ), and this is about the engine. */
  setenv("MESHPG_CHECK_ORDER", "0", 1);
  return j;
}

static void run_job(job *j) {
  mpg_status rc = mpg_thread_run(WORLD, j->timeout_s, rank_main, j, NULL);
  EXPECT_RUN_OK(rc);
}

/* The rule of every case: an error, or MPG_OK with exactly the reference
 * sums; grads_valid only with them. */
static void check_never_wrong(const job *j) {
  for (int r = 0; r < WORLD; r++) {
    cr_assert_eq(j->shm_buffers[r], 1, "rank %d: %d buffers on the shared path, expected 1",
                 r, j->shm_buffers[r]);
    for (int t = 0; t < j->steps; t++) {
      const step_rec *x = &j->rec[r][t];
      cr_log_info("rank %d step %d: %s, grads_valid %d, exact %d: %s", r, t,
                  mpg_status_name(x->st), x->valid, x->exact, x->msg);
    }
    cr_assert_eq(j->bad_round[r], -1, "rank %d: a step returned MPG_OK or grads_valid 1 on "
                 "wrong gradients: %s", r, j->bad_msg[r]);
  }
}

/* ------------------------------------------------------------------ */
/* Cases                                                                */
/* ------------------------------------------------------------------ */

#define WINDOW_TIMEOUT_S 0.5

static atomic_int hook_calls, hook_stalls;
static atomic_int *hook_release;

/* Called right after an abort was won: stall a worker's timeout (one
 * naming the peer it waited for) until rank 0 has run all its steps. */
static void stall_winner(int pos, mpg_status why, int peer, uint32_t q) {
  (void)pos;
  (void)why;
  (void)q;
  atomic_fetch_add(&hook_calls, 1);
  if (peer < 0) return;
  atomic_fetch_add(&hook_stalls, 1);
  wait_flag(hook_release);
}

Test(shm_faults, abort_window, .timeout = 120) {
  job *j = new_job(CASE_WINDOW, 3, WINDOW_TIMEOUT_S);
  hook_release = &j->r0_done;
  mpg__shm_seams.abort_claimed = stall_winner;
  run_job(j);
  mpg__shm_seams.abort_claimed = NULL;
  cr_log_info("abort hook: %d calls, %d stalled", atomic_load(&hook_calls),
              atomic_load(&hook_stalls));
  check_never_wrong(j);
  cr_assert_geq(atomic_load(&hook_calls), 1, "no abort was claimed");
  if (!atomic_load(&hook_stalls))
    cr_log_warn("the main thread won the abort before the worker: the window was not held");
  for (int r = 0; r < WORLD; r++)
    for (int t = 0; t < j->steps; t++)
      cr_expect_neq(j->rec[r][t].st, MPG_OK, "rank %d step %d: MPG_OK", r, t);
  free(j);
}

/* Every rank's step 0 succeeds and no later step does (after the `how`
 * post of step 1). */
static void expect_fails_from_step_1(const job *j, const char *how) {
  for (int r = 0; r < WORLD; r++) {
    cr_expect_eq(j->rec[r][0].st, MPG_OK, "rank %d step 0: %s", r, j->rec[r][0].msg);
    for (int t = 1; t < j->steps; t++)
      cr_expect_neq(j->rec[r][t].st, MPG_OK, "rank %d step %d after the %s post: MPG_OK", r,
                    t, how);
  }
}

Test(shm_faults, post_nomem, .timeout = 120) {
  job *j = new_job(CASE_NOMEM, 4, 2.0);
  run_job(j);
  check_never_wrong(j);
  cr_assert_eq(atomic_load(&calloc_failures), 1, "the wrapped calloc failed %d times",
               atomic_load(&calloc_failures));
  expect_fails_from_step_1(j, "failed");
  cr_expect_eq(j->rec[0][1].st, MPG_ERR_NOMEM, "rank 0 step 1: %s: %s",
               mpg_status_name(j->rec[0][1].st), j->rec[0][1].msg);
  cr_expect_eq(j->rec[1][1].st, MPG_ERR_ABORTED, "rank 1 step 1: %s: %s",
               mpg_status_name(j->rec[1][1].st), j->rec[1][1].msg);
  cr_expect(strstr(j->rec[1][1].msg, "rank 0") && strstr(j->rec[1][1].msg, "ERR_NOMEM"),
            "rank 1 step 1 does not name rank 0 and its reason: %s", j->rec[1][1].msg);
  free(j);
}

Test(shm_faults, counter_wrap, .timeout = 120) {
  job *j = new_job(CASE_WRAP, 3, 10.0);
  /* Launched in reverse registration order: w2 (large, operation
   * 2^32 - 2, so that the workers are busy with it while both ranks post
   * the small w1 and w0), w1 (2^32 - 1), w0 (0). */
  j->nparams = 3;
  j->count[0] = 256;
  j->count[1] = 256;
  j->count[2] = (size_t)1 << 20;
  j->bucket_mb = 0.0005; /* one param per bucket */
  j->rounds = 4;
  mpg__shm_seams.first_q = UINT32_MAX - 1;
  run_job(j);
  mpg__shm_seams.first_q = 0;
  for (int r = 0; r < WORLD; r++)
    cr_assert_eq(j->num_buckets[r], 3, "rank %d: %d buckets, expected 3", r,
                 j->num_buckets[r]);
  check_never_wrong(j);
  for (int r = 0; r < WORLD; r++)
    for (int t = 0; t < j->steps; t++)
      cr_expect(j->rec[r][t].st == MPG_OK && j->rec[r][t].exact && j->rec[r][t].valid,
                "rank %d step %d: %s, exact %d, grads_valid %d: %s", r, t,
                mpg_status_name(j->rec[r][t].st), j->rec[r][t].exact, j->rec[r][t].valid,
                j->rec[r][t].msg);
  free(j);
}

Test(shm_faults, claim, .timeout = 120) {
  job *j = new_job(CASE_CLAIM, 3, 2.0);
  run_job(j);
  check_never_wrong(j);
  expect_fails_from_step_1(j, "refused");
  cr_expect_eq(j->rec[0][1].st, MPG_ERR_STATE, "rank 0 step 1: %s: %s",
               mpg_status_name(j->rec[0][1].st), j->rec[0][1].msg);
  cr_expect(strstr(j->rec[0][1].msg, "must not be used from two threads at once"),
            "rank 0 step 1: %s", j->rec[0][1].msg);
  cr_expect_eq(j->rec[1][1].st, MPG_ERR_ABORTED, "rank 1 step 1: %s: %s",
               mpg_status_name(j->rec[1][1].st), j->rec[1][1].msg);
  cr_expect(strstr(j->rec[1][1].msg, "ERR_STATE"), "rank 1 step 1: %s", j->rec[1][1].msg);
  free(j);
}

/* ------------------------------------------------------------------ */
/* The all-gather (issue 34)                                            */
/* ------------------------------------------------------------------ */

#define AG_MAX 6
#define AG_TIMEOUT_S 1.0

enum { AG_VALUES, AG_MISMATCH, AG_MISSING, AG_CHUNKED };

typedef struct ag_job {
  int kind, world;
  int nhosts;          /* simulated hosts (host_id): 0 or 1, one */
  int interleave;      /* rank r on host r % nhosts, else by blocks */
  mpg_status st[AG_MAX];
  char msg[AG_MAX][768];
  double secs[AG_MAX];
  long checked[AG_MAX];
  int hosts[AG_MAX];   /* mpg__shm_hosts of the member's segment */
  atomic_int done;     /* members that finished their operations */
} ag_job;

/* Member p's element i of gather k: distinct bytes for every (k, p, i), so
 * that a slice copied to the wrong place or not at all shows. */
static void ag_fill(unsigned char *at, size_t bytes, int k, int p) {
  for (size_t b = 0; b < bytes; b++) at[b] = (unsigned char)(b * 7 + (size_t)p * 61 + (size_t)k * 17 + 1);
}

/* The gathers of AG_VALUES: (dtype, count per member, offset in elements). */
typedef struct ag_op {
  mpg_dtype dt;
  size_t count, offset;
} ag_op;

/* One dtype's segment: three gathers in flight, then checked against the
 * backend's mpg_all_gather of the same slices. */
static mpg_status ag_values(ag_job *j, mpg_group *dp, int r, mpg_dtype dt, const ag_op *ops,
                            int nops, size_t create_elems) {
  size_t es = mpg_dtype_size(dt), elems = 0;
  for (int k = 0; k < nops; k++) {
    size_t end = ops[k].offset + ops[k].count * (size_t)j->world;
    if (end > elems) elems = end;
  }
  elems += create_elems ? 16 : 64; /* a guard after the last range */
  /* create_elems: a smaller segment, gathered over its region's slack
   * (a whole page and more), so that a slice outgrows the stage */
  mpg__shm *shm = NULL;
  void *data = NULL;
  RCALL(mpg__shm_create(dp, (create_elems ? create_elems : elems) * es, dt, 4, 1, &shm, &data));
  RCHECK(shm && data, "no segment for %s", mpg_dtype_name(dt));
  j->hosts[r] = mpg__shm_hosts(shm);
  unsigned char *mine = data, *ref = malloc(elems * es);
  RCHECK(ref, "out of memory");
  memset(mine, 0xA5, elems * es); /* the guard, and the slices to be gathered */
  mpg_work *w[8] = {0};
  for (int k = 0; k < nops; k++) {
    size_t bytes = ops[k].count * es, at = (ops[k].offset + (size_t)r * ops[k].count) * es;
    ag_fill(mine + at, bytes, k, r);
  }
  for (int k = 0; k < nops; k++) RCALL(mpg__shm_all_gather(shm, ops[k].offset, ops[k].count, &w[k]));
  for (int k = 0; k < nops; k++) RCALL(mpg_work_wait(w[k]));
  /* The reference: the backend's gather of the same slices. */
  memset(ref, 0xA5, elems * es);
  for (int k = 0; k < nops; k++) {
    size_t bytes = ops[k].count * es, at = ops[k].offset * es;
    ag_fill(ref + at + (size_t)r * bytes, bytes, k, r);
    RCALL(mpg_all_gather(dp, ref + at + (size_t)r * bytes, ref + at, ops[k].count, dt, NULL,
                         NULL));
  }
  for (size_t b = 0; b < elems * es; b++)
    RCHECK(mine[b] == ref[b], "%s: byte %zu of the segment: 0x%02x, the backend's gather "
           "0x%02x", mpg_dtype_name(dt), b, mine[b], ref[b]);
  j->checked[r] += (long)(elems * es);
  free(ref);
  return mpg__shm_destroy(shm);
}

static mpg_status ag_rank(const mpg_init_opts *opts, void *arg) {
  ag_job *j = arg;
  int r = opts->rank;
  char dims[32];
  snprintf(dims, sizeof dims, "dp=%d", j->world);
  mpg_mesh *mesh = make_dims_mesh(dims);
  mpg_init_opts o = *opts;
  static const char *const host_names[] = {"hostA", "hostB", "hostC"};
  if (j->nhosts > 1)
    o.host_id = host_names[j->interleave ? r % j->nhosts : r / (j->world / j->nhosts)];
  mpg_ctx *ctx = NULL;
  mpg_group *dp = NULL;
  mpg_status st = rank_open(&o, mesh, &ctx, "dp", &dp);
  if (st) return st;
  if (j->kind == AG_VALUES) {
    /* f32 slices of 2^18 + 3 elements: above the non-temporal size. */
    static const ag_op big[] = {{MPG_F32, 17, 6}, {MPG_F32, 262147, 120}, {MPG_F32, 1, 0}};
    for (int d = 0; d < 4 && !st; d++) {
      static const mpg_dtype dts[] = {MPG_F32, MPG_BF16, MPG_F16, MPG_F64};
      /* disjoint ranges (for up to 6 members): in flight at once */
      ag_op ops[3] = {{dts[d], 1000, 0}, {dts[d], 77, 6001}, {dts[d], 3, 6500}};
      st = ag_values(j, dp, r, dts[d], d ? ops : big, 3, 0);
    }
  } else if (j->kind == AG_CHUNKED) {
    /* 64-element segments (a region of 4096 + 320 bytes): the stage holds
     * 160 f32 (f16: 320 f16), i.e. 80 or 53 elements of each of 2 or 3
     * nodes (f16: 192 or 128), so these slices go across in 2 to 3
     * chunks, a second gather in flight. */
    ag_op f32[2] = {{MPG_F32, 150, 0}, {MPG_F32, 3, 905}};
    ag_op f16[2] = {{MPG_F16, 300, 0}, {MPG_F16, 5, 1850}};
    st = ag_values(j, dp, r, MPG_F32, f32, 2, 64);
    if (!st) st = ag_values(j, dp, r, MPG_F16, f16, 2, 64);
  } else {
    mpg__shm *shm = NULL;
    void *data = NULL;
    RCALL(mpg__shm_create(dp, 4096 * 4 * (size_t)j->world, MPG_F32, 4, 1, &shm, &data));
    RCHECK(shm, "no segment");
    j->hosts[r] = mpg__shm_hosts(shm);
    mpg_work *w = NULL;
    double t0 = now_s();
    if (j->kind == AG_MISSING && r == j->world - 1) {
      /* Never posts: waits until the others are done, then leaves. */
      double until = now_s() + CAP_S;
      while (atomic_load(&j->done) < j->world - 1 && now_s() < until) sleep_s(0.002);
      j->st[r] = MPG_OK;
    } else {
      j->st[r] = j->kind == AG_MISMATCH && r == 1
                     ? mpg__shm_reduce_scatter(shm, 0, 4096, MPG_OP_SUM, 1.0, &w)
                     : mpg__shm_all_gather(shm, 0, 4096, &w);
      if (!j->st[r]) j->st[r] = mpg_work_wait(w);
      snprintf(j->msg[r], sizeof j->msg[r], "%s", j->st[r] ? mpg_last_error() : "");
    }
    j->secs[r] = now_s() - t0;
    atomic_fetch_add(&j->done, 1);
    st = mpg__shm_destroy(shm);
  }
  tl_ctx = NULL;
  mpg_ctx_destroy(ctx);
  mpg_mesh_destroy(mesh);
  return st;
}

static ag_job *ag_run_on(int kind, int world, int nhosts, int interleave) {
  ag_job *j = calloc(1, sizeof *j);
  cr_assert_not_null(j);
  j->kind = kind;
  j->world = world;
  j->nhosts = nhosts;
  j->interleave = interleave;
  setenv("MESHPG_SHM", "1", 1);
  setenv("MESHPG_CHECK_ORDER", "0", 1);
  fail_msg[0] = '\0';
  mpg_status rc = mpg_thread_run(world, AG_TIMEOUT_S, ag_rank, j, NULL);
  EXPECT_RUN_OK(rc);
  for (int r = 0; r < world; r++)
    cr_log_info("member %d: %s after %.3f s: %s", r, mpg_status_name(j->st[r]), j->secs[r],
                j->msg[r]);
  return j;
}

static ag_job *ag_run(int kind, int world) { return ag_run_on(kind, world, 1, 0); }

Test(shm_gather, gather_values, .timeout = 120) {
  ag_job *j = ag_run(AG_VALUES, 3);
  mpg__shm_seams.first_q = UINT32_MAX - 1; /* each segment's third gather is #0 */
  ag_job *w = ag_run(AG_VALUES, 2);
  mpg__shm_seams.first_q = 0;
  for (int r = 0; r < 3; r++) {
    cr_assert_eq(j->hosts[r], 1, "member %d: its segment spans %d hosts", r, j->hosts[r]);
    cr_assert_gt(j->checked[r], 3 * 262147 * 4, "member %d checked %ld bytes", r,
                 j->checked[r]);
  }
  for (int r = 0; r < 2; r++)
    cr_assert_gt(w->checked[r], 0, "member %d (counters at the wrap) checked nothing", r);
  free(j);
  free(w);
}

Test(shm_gather, gather_mismatch, .timeout = 120) {
  ag_job *j = ag_run(AG_MISMATCH, 2);
  for (int r = 0; r < 2; r++) {
    cr_expect_eq(j->st[r], MPG_ERR_INVALID, "member %d: %s: %s", r, mpg_status_name(j->st[r]),
                 j->msg[r]);
    cr_expect(strstr(j->msg[r], "posted different operations") &&
                  strstr(j->msg[r], "position 0 (world rank 0)") &&
                  strstr(j->msg[r], "position 1 (world rank 1)"),
              "member %d does not name both members and the mismatch: %s", r, j->msg[r]);
  }
  cr_expect(strstr(j->msg[0], "shared-memory all-gather"), "member 0: %s", j->msg[0]);
  cr_expect(strstr(j->msg[1], "shared-memory reduction"), "member 1: %s", j->msg[1]);
  free(j);
}

Test(shm_gather, gather_missing_member, .timeout = 120) {
  ag_job *j = ag_run(AG_MISSING, 3);
  double bound = tb_bound(AG_TIMEOUT_S + 1.0, 3);
  for (int r = 0; r < 2; r++) {
    cr_expect(j->st[r] == MPG_ERR_TIMEOUT || j->st[r] == MPG_ERR_ABORTED,
              "member %d: %s: %s", r, mpg_status_name(j->st[r]), j->msg[r]);
    cr_expect(strstr(j->msg[r], "missing position 2 (world rank 2)"),
              "member %d does not name the missing member: %s", r, j->msg[r]);
    cr_expect(strstr(j->msg[r], "shared-memory all-gather"), "member %d: %s", r, j->msg[r]);
    cr_expect_leq(j->secs[r], bound, "member %d failed after %.3f s, bound %.3f s", r,
                  j->secs[r], bound);
    cr_expect_geq(j->secs[r], AG_TIMEOUT_S * 0.9, "member %d failed after %.3f s, before the "
                  "%.1f s timeout", r, j->secs[r], AG_TIMEOUT_S);
  }
  cr_expect(j->st[0] == MPG_ERR_TIMEOUT || j->st[1] == MPG_ERR_TIMEOUT,
            "no member reported the timeout itself: %s | %s", j->msg[0], j->msg[1]);
  free(j);
}

/* Every member's segment spans nhosts hosts and every byte checked. */
static void ag_check_hosts(const ag_job *j, int nhosts, const char *what) {
  for (int r = 0; r < j->world; r++) {
    cr_assert_eq(j->hosts[r], nhosts, "%s, member %d: its segment spans %d hosts", what, r,
                 j->hosts[r]);
    cr_assert_gt(j->checked[r], 0, "%s, member %d checked nothing", what, r);
  }
}

/* ag_run_on(kind, world, nhosts, interleave), then ag_check_hosts. */
static void ag_hosts_case(int kind, int world, int nhosts, int interleave, const char *what) {
  ag_job *j = ag_run_on(kind, world, nhosts, interleave);
  ag_check_hosts(j, nhosts, what);
  free(j);
}

Test(shm_gather, gather_across_hosts, .timeout = 120) {
  ag_job *j = ag_run_on(AG_VALUES, 4, 2, 0);
  ag_check_hosts(j, 2, "2 hosts x 2");
  for (int r = 0; r < 4; r++)
    cr_assert_gt(j->checked[r], 3 * 262147 * 4, "member %d checked %ld bytes", r,
                 j->checked[r]);
  free(j);
  mpg__shm_seams.first_q = UINT32_MAX - 1; /* each segment's third gather is #0 */
  ag_hosts_case(AG_VALUES, 4, 2, 1, "2 hosts x 2 interleaved, counters at the wrap");
  mpg__shm_seams.first_q = 0;
  ag_hosts_case(AG_VALUES, 6, 3, 1, "3 hosts x 2 interleaved");
  ag_hosts_case(AG_VALUES, 6, 3, 0, "3 hosts x 2");
}

Test(shm_gather, gather_across_hosts_chunked, .timeout = 120) {
  ag_hosts_case(AG_CHUNKED, 4, 2, 0, "2 hosts x 2");
  ag_hosts_case(AG_CHUNKED, 6, 3, 1, "3 hosts x 2 interleaved");
}

/* Hosts by halves: members 0, 1 on hostA, 2, 3 on hostB; member 3 never
 * posts.  Member 2 (its host partner) names it; members 0 and 1 only see
 * their all-gather across hosts fail (their partners on hostB never reach
 * it): the backend's timeout, naming the ranks across hosts. */
Test(shm_gather, gather_across_hosts_missing_member, .timeout = 120) {
  ag_job *j = ag_run_on(AG_MISSING, 4, 2, 0);
  double bound = tb_bound(AG_TIMEOUT_S + 1.0, 4);
  for (int r = 0; r < 3; r++) {
    cr_expect_eq(j->hosts[r], 2, "member %d: its segment spans %d hosts", r, j->hosts[r]);
    cr_expect(j->st[r] == MPG_ERR_TIMEOUT || j->st[r] == MPG_ERR_ABORTED,
              "member %d: %s: %s", r, mpg_status_name(j->st[r]), j->msg[r]);
    cr_expect(strstr(j->msg[r], "shared-memory all-gather"), "member %d: %s", r, j->msg[r]);
    cr_expect_leq(j->secs[r], bound, "member %d failed after %.3f s, bound %.3f s", r,
                  j->secs[r], bound);
    cr_expect_geq(j->secs[r], AG_TIMEOUT_S * 0.9, "member %d failed after %.3f s, before the "
                  "%.1f s timeout", r, j->secs[r], AG_TIMEOUT_S);
  }
  cr_expect_eq(j->st[2], MPG_ERR_TIMEOUT, "member 2: %s: %s", mpg_status_name(j->st[2]),
               j->msg[2]);
  cr_expect(strstr(j->msg[2], "missing position 3 (world rank 3)"),
            "member 2 does not name the missing member: %s", j->msg[2]);
  for (int r = 0; r < 2; r++)
    cr_expect(strstr(j->msg[r], "all-gather across nodes"),
              "member %d does not name the step across hosts: %s", r, j->msg[r]);
  free(j);
}
