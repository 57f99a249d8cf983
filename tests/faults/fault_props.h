/* The fault property of issue 35, shared by test_fault_props.c (ranks as
 * threads: the thread backend, and the nccl backend on the CUDA/NCCL test
 * double when built with FP_ON_DOUBLE) and fault_props_mpi_worker.c (ranks
 * as processes under mpirun: the mpi backend, and with FP_ON_DOUBLE the
 * nccl backend on the double's processes).
 *
 * The property: whatever fault strikes at whatever moment, a rank whose
 * mpg_sync_finish returned MPG_OK with mpg_sync_grads_valid() == 1 holds
 * exactly the reference sum of its group's gradients for that step.  An
 * error is always allowed; a silent wrong result never is, and neither is
 * a hang or a dead process.
 *
 * A case is drawn from a seed (fp_case_make): a world of 2..4 ranks, a mesh
 * of dp, cp (and maybe tp) in a random order with dp_cp flattened and at
 * least 2 members, replicate or shard mode (half of it HSDP over cp and
 * dp), sum or average (average only where every group size is a power of
 * two), grad_scale 1, 1/2 or 1/4, reduce_dtype f32 or native, small random
 * buckets, 2..8 params of f32, f64, bf16 and f16 with random sizes, some
 * reduced over their own dims, the shared-memory path on or off
 * (MESHPG_SHM), the issue-order checker on or off (MESHPG_CHECK_ORDER);
 * mpi: sometimes meshpg's own ring (MESHPG_MPI_PIECE_BYTES) and small MPI
 * calls (MESHPG_MPI_MAX_COUNT); thread and mpi: sometimes the
 * shared-memory path's seams (counters near their wrap, a slow abort
 * winner; FP_SHM_SEAMS builds).  Gradients are small integers (|g| <= 6
 * per micro-batch), so every sum over <= 4 members, times 1/2 or 1/4 or
 * divided by 2 or 4, is exact in every dtype and in every summation order:
 * the reference is exact and compared with ==.  Half the thread and mpi
 * cases also run an all-to-all in every step, in flight across the step
 * (fp_case.a2a): its MPG_OK must hold every block exactly (issue 45).
 *
 * The steps: every rank runs the same steps 0 .. steps-1 (some with two
 * micro-batches: the first accumulates, nothing launched), writes each
 * param's gradient right before marking it ready, in its own random order
 * (sometimes marking half, finish launching the rest), with random pauses
 * of a few milliseconds.  The plan of a step (fp_plan_of) is a function of
 * the seed and the step, the same on every rank: most steps are clean; a
 * tenth has one fault on one victim rank at a random moment (before mark
 * k, before finish, or after finish), while another rank lags a little:
 *   FP_ABORT  a watchdog thread calls mpg_ctx_abort after 0, < 2 or
 *             < 20 ms (a third of them aimed inside finish; a third with
 *             the watchdog's first allocation in the abort failing);
 *   FP_STALL  the victim sleeps past the timeout (timeout + 0.1..0.3 s), or
 *             (a third) near it (0.8..1.2 x the timeout);
 *   FP_ALLOC  the victim's 1st..3rd allocation from then on fails
 *             (fault_alloc.h: only that rank's own thread);
 *   FP_KILL   processes: SIGKILL of the victim (once per job, in its last
 *             steps); thread ranks: the victim leaves (destroys its sync
 *             and context mid-step and sits the epoch out).
 * A context that died (timeout, abort) ends the rank's epoch; every rank
 * then ends it (the shared `epoch_over` flag, looked at before each step),
 * they agree on the next step (the largest step any rank began, plus one)
 * and start a fresh context.
 *
 * Counted per rank (fp_tally): steps, OK steps (values checked), errors by
 * status, per fault kind how often it was planned, injected (it really
 * happened on the victim), and how the faulted steps ended, where an
 * abort landed (during the marks, inside finish, after finish), where a
 * failed allocation hit, and every violation of the property (a
 * "VIOLATION" line naming seed, backend, step, rank, the fault, and the
 * first wrong element with the members' inputs).  A step that takes
 * longer than its own sleeps plus 2 x (timeout + 1 s) plus the scheduler's
 * allowance is "SLOW"; a rank inside one phase for FP_HANG_S is a "HANG"
 * (fp_monitor: the process aborts at once).
 *
 * The cases, plans, values, counts and the shared control are defined in
 * fault_props_case.c, one rank's steps, epochs and the hang monitor in
 * fault_props_rank.c; each executable that includes this header compiles
 * both with its own FP_ON_DOUBLE / FP_SHM_SEAMS. */
#ifndef MESHPG_TESTS_FAULT_PROPS_H
#define MESHPG_TESTS_FAULT_PROPS_H

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "meshpg.h"
#include "../support/time_bound.h"
#include "fault_alloc.h"

#ifdef FP_ON_DOUBLE
#include <cuda_runtime_api.h>
#endif
#ifdef FP_SHM_SEAMS
#include "shm_internal.h" /* mpg__shm_seams: the shared-memory path's test seams */
#endif

enum { FP_THREAD = 0, FP_MPI = 1, FP_NCCL = 2 };
static const char *const fp_backend_names[3] = {"thread", "mpi", "nccl"};

#define FP_MAX_RANKS 4
#define FP_MAX_PARAMS 8
#define FP_MAX_ELEMS 3000
#define FP_SETUP_TIMEOUT_S 30.0

typedef enum fp_kind { FP_NONE, FP_ABORT, FP_STALL, FP_ALLOC, FP_KILL, FP_NKINDS } fp_kind;
static const char *const fp_kind_names[FP_NKINDS] = {"none", "abort", "stall", "alloc", "kill"};

/* ------------------------------------------------------------------ */
/* Random numbers                                                      */
/* ------------------------------------------------------------------ */

uint64_t fp_mix(uint64_t x);

typedef struct fp_rng {
  uint64_t s;
} fp_rng;

uint64_t fp_next(fp_rng *r);
unsigned fp_below(fp_rng *r, unsigned n);
double fp_unit(fp_rng *r);
double fp_now(void);
void fp_sleep(double s);

/* ------------------------------------------------------------------ */
/* Cases                                                               */
/* ------------------------------------------------------------------ */

typedef struct fp_param {
  size_t count;
  mpg_dtype dtype;
  const char *reduce_dims; /* NULL: the sync's default (dp_cp) */
} fp_param;

typedef struct fp_case {
  unsigned seed;
  int backend;
  int world;
  char mesh[64], flatten[32];
  int shard;
  mpg_op op;
  double grad_scale;
  mpg_reduce_dtype reduce_dtype;
  double bucket_mb, first_bucket_mb;
  int nparams;
  fp_param params[FP_MAX_PARAMS];
  int shm, check_order;
  long piece_bytes, max_count; /* mpi: MESHPG_MPI_PIECE_BYTES, _MAX_COUNT (0: unset) */
  double timeout_s;
  int steps;
  double fault_rate;
  unsigned kinds; /* the fault kinds drawn (bit k: kind k); MESHPG_FP_KINDS */
  int procs;     /* ranks are processes under mpirun (FP_KILL: SIGKILL) */
  int kill_step; /* procs: the step whose fault is the SIGKILL; -1: none */
  /* The shared-memory path's seams (FP_SHM_SEAMS builds): every segment's
   * operation counters start at first_q (0: as usual; else 2^32 - 1 - k,
   * so that they wrap within the first steps of every context), and
   * slow_abort: the member that wins a segment's abort word sleeps
   * 0..3 ms before it wakes the others (the window of the abort race). */
  uint32_t first_q;
  int slow_abort;
  /* shard mode: NULL, or HSDP: reduce-scatter over shard_dims, then the
   * slice all-reduced over replicate_dims ("cp" and "dp" in either role) */
  const char *shard_dims, *replicate_dims;
  /* thread and mpi (issue 45, item 15): every step also runs an all-to-all
   * on the world group (through its shared-memory channel unless
   * MESHPG_SHM=0), from mpg_ctx_mem_alloc buffers, posted asynchronously
   * first in the step and waited after the moment `after finish`, so that
   * every fault of the step strikes it in flight; a member whose wait
   * fails reuses its send buffer at once.  Its MPG_OK must hold every
   * block exactly. */
  int a2a;
} fp_case;

const char *fp_name(const fp_case *c);
void fp_case_make(unsigned seed, int backend, int procs, int steps, int kill, fp_case *c);
void fp_seams_apply(const fp_case *c);
void fp_describe(const fp_case *c, char *buf, size_t cap);

/* ------------------------------------------------------------------ */
/* Plans and values                                                    */
/* ------------------------------------------------------------------ */

typedef struct fp_plan {
  fp_kind kind;
  int victim;
  int moment;    /* 0..n-1: before the k-th mark; n: before finish; n+1: after */
  double delay;  /* abort: the watchdog's delay */
  int abort_nomem; /* abort: the watchdog's first allocation in mpg_ctx_abort fails */
  long alloc_n;  /* alloc: the n-th allocation from the moment fails */
  double stall_s;
  int accum;     /* two micro-batches */
  int laggard, lag_at; /* faulted steps: this rank sleeps lag_s before mark lag_at */
  double lag_s;
} fp_plan;

void fp_plan_of(const fp_case *c, int step, fp_plan *p);
int fp_val(const fp_case *c, int q, int step, int mb, int p, size_t i);
int fp_input(const fp_case *c, int q, int step, int accum, int p, size_t i);
void fp_put(void *buf, mpg_dtype dt, size_t i, double v);
double fp_get(const void *buf, mpg_dtype dt, size_t i);

/* ------------------------------------------------------------------ */
/* Counts                                                              */
/* ------------------------------------------------------------------ */

#define FP_SCALARS(X)                                                                   \
  X(steps) X(ok_valid) X(ok_invalid) X(errors) X(violations) X(elems) X(epochs)         \
  X(setup_errors) X(mark_err_finish_ok) X(slow) X(begin_errors) X(abort_in_marks)       \
  X(abort_in_finish) X(abort_after_finish) X(alloc_in_mark) X(alloc_in_finish)          \
  X(alloc_unfired) X(abort_nomem) X(max_step_ms) X(max_setup_ms) X(a2a_ok) X(a2a_err)
#define FP_PER_KIND(X) X(planned) X(injected) X(rank_steps) X(err) X(ok) X(next_err)

typedef struct fp_tally {
#define FP_FIELD(n) long n;
  FP_SCALARS(FP_FIELD)
#undef FP_FIELD
#define FP_FIELD(n) long n[FP_NKINDS];
  FP_PER_KIND(FP_FIELD)
#undef FP_FIELD
  long status[MPG_STATUS_COUNT];
} fp_tally;

void fp_tally_print(FILE *f, const fp_tally *t);
int fp_tally_add_kv(fp_tally *t, const char *key, long v);
void fp_tally_sum(fp_tally *into, const fp_tally *t);

/* ------------------------------------------------------------------ */
/* The ranks' shared control (thread: memory; mpi: a shared window)    */
/* ------------------------------------------------------------------ */

typedef struct fp_ctl {
  atomic_int epoch_over;            /* a rank's context died: end the epoch */
  atomic_int killed;                /* mpi: a rank raised SIGKILL */
  atomic_int arrived, generation;   /* mpi: the barrier between epochs */
  atomic_long last_step[FP_MAX_RANKS]; /* the last step each rank began */
  atomic_int pid[FP_MAX_RANKS];     /* mpi: each rank's process (0: unknown) */
} fp_ctl;

void fp_ctl_reset(fp_ctl *ctl);
int fp_ctl_next_step(fp_ctl *ctl, int world);
int fp_ctl_dead_rank(fp_ctl *ctl, int world);
int fp_ctl_barrier(fp_ctl *ctl, int world, double limit_s);

/* ------------------------------------------------------------------ */
/* One rank                                                            */
/* ------------------------------------------------------------------ */

typedef struct fp_rank fp_rank;
struct fp_rank {
  const fp_case *c;
  int rank;
  fp_ctl *ctl;
  mpg_init_opts base;  /* backend, rank, world, ... (timeout set here) */
  fp_tally t;
  /* A line for the test's output (VIOLATION, SLOW, SETUP, KILLED, ...). */
  void (*note)(fp_rank *r, const char *line);
  void *note_arg;
  int prev_kind;       /* the fault of the step before */
  int verbose;         /* a STEP line per step (MESHPG_FP_VERBOSE=1) */
  unsigned char *host; /* nccl: a param's staging copy */
  /* What the rank is doing, for the hang monitor (fp_monitor). */
  _Atomic(const char *) busy_what; /* NULL: between calls */
  atomic_llong busy_since_ns;
  atomic_int busy_step;
};

__attribute__((format(printf, 2, 3))) void fp_note(fp_rank *R, const char *fmt, ...);
void fp_busy(fp_rank *R, const char *what, int step);
void fp_idle(fp_rank *R);

/* The hang monitor: a thread that looks at ranks[0..n) every 0.2 s and,
 * when one has been inside one phase (set-up, a step, the teardown) for
 * more than limit_s (far beyond every bound the library promises), notes
 * a HANG line naming it and aborts the process, so that a hang fails the
 * test at once, with its place, instead of at the test's time limit. */
typedef struct fp_monitor {
  fp_rank **ranks;
  int n;
  double limit_s;
  atomic_int stop;
  pthread_t th;
  int up;
} fp_monitor;

void *fp_monitor_main(void *arg);
void fp_monitor_start(fp_monitor *m, fp_rank **ranks, int n, double limit_s);
void fp_monitor_stop(fp_monitor *m);

/* Longer than any phase may take: the set-up's timeout twice over, and
 * far beyond a step's bound. */
#define FP_HANG_S (3 * FP_SETUP_TIMEOUT_S)

/* A param's view and reference data for one context. */
typedef struct fp_view {
  void *grad;
  int n, members[FP_MAX_RANKS];
  size_t off, cnt; /* the range that must equal the reference */
  double scale;    /* the members' sum times this */
} fp_view;

typedef struct fp_watchdog {
  mpg_ctx *ctx;
  double delay, at;
  int nomem, nomem_fired; /* fail the watchdog's first allocation in the abort */
} fp_watchdog;

void *fp_watchdog_main(void *arg);

#ifdef FP_ON_DOUBLE
typedef cudaStream_t fp_stream;
#else
typedef void *fp_stream;
#endif

int fp_write(fp_rank *R, const fp_view *v, int p, int step, int mb, int add, fp_stream stream);
const void *fp_read(fp_rank *R, const fp_view *v, int p, fp_stream stream);
void fp_count_status(fp_rank *R, mpg_status st);
void fp_check(fp_rank *R, const fp_view *views, int step, const fp_plan *P, fp_stream stream);
mpg_status fp_mesh(const fp_case *c, mpg_mesh **mesh);
int fp_inject(fp_rank *R, const fp_plan *P, int step, mpg_ctx *ctx, fp_watchdog *wd,
              pthread_t *dog, int *dog_up, double *slept);

int fp_epoch(fp_rank *R, int start);

#endif
