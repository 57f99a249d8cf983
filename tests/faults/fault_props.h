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
 * the reference is exact and compared with ==.
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
 * (fp_monitor: the process aborts at once). */
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

static inline uint64_t fp_mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

typedef struct fp_rng {
  uint64_t s;
} fp_rng;

static inline uint64_t fp_next(fp_rng *r) {
  r->s += 0x9e3779b97f4a7c15ull;
  return fp_mix(r->s);
}

static inline unsigned fp_below(fp_rng *r, unsigned n) {
  return n ? (unsigned)(fp_next(r) % n) : 0;
}

static inline double fp_unit(fp_rng *r) { return (double)(fp_next(r) >> 11) * 0x1p-53; }

static inline double fp_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline void fp_sleep(double s) {
  if (s <= 0) return;
  struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  while (nanosleep(&ts, &ts) != 0) {
  }
}

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
} fp_case;

/* The backend as messages name it. */
static inline const char *fp_name(const fp_case *c) {
  if (c->backend == FP_NCCL && c->procs) return "nccl-processes";
  return fp_backend_names[c->backend];
}

/* Draw case `seed` of `backend` with `steps` steps; procs: the ranks are
 * processes under mpirun (mpi always; nccl on the double's processes), and
 * then kill: one SIGKILL in the last steps (the job ends with it). */
static inline void fp_case_make(unsigned seed, int backend, int procs, int steps, int kill,
                                fp_case *c) {
  memset(c, 0, sizeof *c);
  fp_rng r = {fp_mix(((uint64_t)seed << 8) ^ (uint64_t)backend ^ 0x35u)};
  c->seed = seed;
  c->backend = backend;
  c->world = 2 + (int)fp_below(&r, 3);
  static const char *const names[3] = {"dp", "cp", "tp"};
  int size[3] = {1, 1, 1};
  /* The first prime factor to dp or cp (the default group has >= 2
   * members), the rest anywhere. */
  int w = c->world, dealt = 0;
  for (int f = 2; w > 1; f++)
    while (w % f == 0) {
      size[dealt++ == 0 ? fp_below(&r, 2) : fp_below(&r, 3)] *= f;
      w /= f;
    }
  int has_tp = size[2] > 1 || fp_below(&r, 3) == 0;
  int perm[3] = {0, 1, 2}, nd = has_tp ? 3 : 2;
  for (int k = nd - 1; k > 0; k--) {
    int j = (int)fp_below(&r, (unsigned)k + 1), t = perm[k];
    perm[k] = perm[j];
    perm[j] = t;
  }
  size_t n = 0, m = 0;
  for (int k = 0; k < nd; k++) {
    n += (size_t)snprintf(c->mesh + n, sizeof c->mesh - n, "%s%s=%d", k ? "," : "",
                          names[perm[k]], size[perm[k]]);
    if (perm[k] < 2)
      m += (size_t)snprintf(c->flatten + m, sizeof c->flatten - m, "%s%s", m ? "," : "",
                            names[perm[k]]);
  }
  c->shard = fp_below(&r, 3) == 0;
  /* Average only where every group size divides exactly (2 or 4). */
  c->op = c->world != 3 && fp_below(&r, 2) ? MPG_OP_AVG : MPG_OP_SUM;
  static const double scales[4] = {1.0, 1.0, 0.5, 0.25};
  c->grad_scale = scales[fp_below(&r, 4)];
  c->reduce_dtype = fp_below(&r, 4) == 0 ? MPG_REDUCE_NATIVE : MPG_REDUCE_F32;
  if (fp_below(&r, 5) == 0) {
    c->bucket_mb = c->first_bucket_mb = 1e-6; /* one param per bucket */
  } else {
    c->bucket_mb = 0.0005 + 0.0002 * (double)fp_below(&r, 40);
    c->first_bucket_mb = c->bucket_mb * (0.25 + 0.25 * (double)fp_below(&r, 4));
  }
  c->nparams = 2 + (int)fp_below(&r, FP_MAX_PARAMS - 1);
  static const mpg_dtype dts[6] = {MPG_F32, MPG_F32, MPG_F64, MPG_BF16, MPG_F16, MPG_F32};
  for (int p = 0; p < c->nparams; p++) {
    fp_param *pa = &c->params[p];
    unsigned k = fp_below(&r, 6);
    pa->count = k == 0 ? 1 + fp_below(&r, 9)
                : k == 1 ? 600 + fp_below(&r, FP_MAX_ELEMS - 600)
                         : 10 + fp_below(&r, 600);
    pa->dtype = dts[fp_below(&r, 6)];
    unsigned d = fp_below(&r, 10);
    pa->reduce_dims = d == 0 ? "dp" : d == 1 ? "cp" : d == 2 && has_tp ? "tp"
                      : d == 3 && has_tp ? "dp_cp,tp" : NULL;
  }
  c->shm = fp_below(&r, 4) != 0;
  c->check_order = (int)fp_below(&r, 2);
  /* mpi: buckets above a small piece run as meshpg's own ring (without
   * the shared-memory path), sometimes in MPI calls of few elements. */
  unsigned pc = fp_below(&r, 3);
  c->piece_bytes = backend == FP_MPI && pc ? (pc == 1 ? 512 : 4096) : 0;
  c->max_count = backend == FP_MPI && fp_below(&r, 4) == 0 ? 100 + fp_below(&r, 400) : 0;
  c->timeout_s = 0.2 + 0.05 * (double)fp_below(&r, 4);
  /* ThreadSanitizer runs everything several times slower: a healthy step
   * must not time out. */
  if (tb_sanitizer_factor() >= 4.0) c->timeout_s *= 2.0;
  c->steps = steps;
  c->fault_rate = 0.1;
  /* MESHPG_FP_KINDS=abort,stall,alloc,kill (a subset) draws only those:
   * to tell which fault a failure needs.  The plans stay the same, the
   * others' steps run clean. */
  c->kinds = ~0u;
  const char *only = getenv("MESHPG_FP_KINDS");
  if (only && *only) {
    c->kinds = 0;
    for (int k = 1; k < FP_NKINDS; k++)
      if (strstr(only, fp_kind_names[k])) c->kinds |= 1u << k;
  }
  c->procs = procs;
  c->kill_step = procs && kill ? steps - 1 - (int)fp_below(&r, 6) : -1;
  c->first_q = backend != FP_NCCL && fp_below(&r, 3) == 0 ? 0xffffffffu - fp_below(&r, 200) : 0;
  c->slow_abort = backend != FP_NCCL && fp_below(&r, 3) == 0;
  if (c->shard && fp_below(&r, 2)) {
    int cp_first = (int)fp_below(&r, 2);
    c->shard_dims = cp_first ? "cp" : "dp";
    c->replicate_dims = cp_first ? "dp" : "cp";
  }
}

#ifdef FP_SHM_SEAMS
static atomic_uint fp_seam_calls;

static inline void fp_abort_claimed(int pos, mpg_status why, int peer, uint32_t q) {
  (void)pos;
  (void)why;
  (void)peer;
  (void)q;
  fp_sleep((double)(fp_mix(atomic_fetch_add(&fp_seam_calls, 1)) % 3000) * 1e-6);
}
#endif

/* Set the seams the case asks for (before its contexts are created). */
static inline void fp_seams_apply(const fp_case *c) {
#ifdef FP_SHM_SEAMS
  mpg__shm_seams.first_q = c->first_q;
  mpg__shm_seams.abort_claimed = c->slow_abort ? fp_abort_claimed : NULL;
#else
  (void)c;
#endif
}

static inline void fp_describe(const fp_case *c, char *buf, size_t cap) {
  size_t n = (size_t)snprintf(
      buf, cap,
      "seed %u (%s): world %d, mesh %s (dp_cp=%s), %s, %s x %g, reduce_dtype %s, "
      "bucket_mb %g first %g, MESHPG_SHM=%d%s MESHPG_CHECK_ORDER=%d, timeout %g s, %d steps%s",
      c->seed, fp_name(c), c->world, c->mesh, c->flatten,
      c->shard ? "shard" : "replicate", c->op == MPG_OP_AVG ? "avg" : "sum", c->grad_scale,
      c->reduce_dtype == MPG_REDUCE_F32 ? "f32" : "native", c->bucket_mb, c->first_bucket_mb,
      c->shm, c->backend == FP_NCCL ? " (no shared memory on nccl)" : "", c->check_order,
      c->timeout_s, c->steps, c->kill_step >= 0 ? ", a kill" : "");
  if (c->kill_step >= 0 && n < cap)
    n += (size_t)snprintf(buf + n, cap - n, " at step %d", c->kill_step);
  if (c->piece_bytes && n < cap)
    n += (size_t)snprintf(buf + n, cap - n, ", MESHPG_MPI_PIECE_BYTES=%ld", c->piece_bytes);
  if (c->max_count && n < cap)
    n += (size_t)snprintf(buf + n, cap - n, ", MESHPG_MPI_MAX_COUNT=%ld", c->max_count);
  if (c->first_q && n < cap)
    n += (size_t)snprintf(buf + n, cap - n, ", shm counters from 2^32 - %u",
                          (unsigned)(0u - c->first_q));
  if (c->shard_dims && n < cap)
    n += (size_t)snprintf(buf + n, cap - n, ", HSDP: shard over %s, replicate over %s",
                          c->shard_dims, c->replicate_dims);
  if (c->slow_abort && n < cap)
    n += (size_t)snprintf(buf + n, cap - n, ", shm abort winner sleeps 0..3 ms");
  n += (size_t)snprintf(buf + n, n < cap ? cap - n : 0, ", params");
  for (int p = 0; p < c->nparams && n < cap; p++)
    n += (size_t)snprintf(buf + n, cap - n, " p%d:%zux%s%s%s", p, c->params[p].count,
                          mpg_dtype_name(c->params[p].dtype),
                          c->params[p].reduce_dims ? "@" : "",
                          c->params[p].reduce_dims ? c->params[p].reduce_dims : "");
}

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

static inline void fp_plan_of(const fp_case *c, int step, fp_plan *p) {
  fp_rng r = {fp_mix(((uint64_t)c->seed << 32) ^ (uint64_t)(unsigned)step ^ 0x51ull)};
  memset(p, 0, sizeof *p);
  p->accum = fp_below(&r, 6) == 0;
  if (step == c->kill_step) {
    p->kind = FP_KILL;
  } else if (fp_unit(&r) < c->fault_rate) {
    /* abort 3, stall 2, alloc 4, (ranks as threads) leave 1 */
    unsigned w = fp_below(&r, c->procs ? 9 : 10);
    p->kind = w < 3 ? FP_ABORT : w < 5 ? FP_STALL : w < 9 ? FP_ALLOC : FP_KILL;
  }
  p->victim = (int)fp_below(&r, (unsigned)c->world);
  p->moment = (int)fp_below(&r, (unsigned)c->nparams + (p->kind == FP_ALLOC ? 1u : 2u));
  /* Right away, within 2 ms, or within 20 ms of the moment. */
  unsigned d = fp_below(&r, 3);
  p->delay = d == 0 ? 0.0 : (d == 1 ? 0.002 : 0.02) * fp_unit(&r);
  p->abort_nomem = fp_below(&r, 3) == 0;
  p->alloc_n = 1 + (long)fp_below(&r, 3);
  p->stall_s = c->timeout_s + 0.1 + 0.2 * fp_unit(&r);
  /* Another rank lags in a faulted step (so that the victim may wait
   * inside finish when its fault strikes). */
  p->laggard = c->world > 1 ? (p->victim + 1 + (int)fp_below(&r, (unsigned)c->world - 1)) %
                                  c->world
                            : -1;
  p->lag_at = (int)fp_below(&r, (unsigned)c->nparams + 1);
  p->lag_s = 0.001 + 0.009 * fp_unit(&r);
  if (!(c->kinds & (1u << p->kind))) p->kind = FP_NONE;
  /* A third of the stalls end near the deadline (0.8..1.2 x the timeout):
   * some members may give up while the victim is already back. */
  if (fp_below(&r, 3) == 0) p->stall_s = c->timeout_s * (0.8 + 0.4 * fp_unit(&r));
  /* A third of the aborts aim inside finish: the watchdog starts right
   * before it with a delay of 0.5..3 ms while the laggard holds its first
   * bucket back for 5..15 ms. */
  if (p->kind == FP_ABORT && fp_below(&r, 3) == 0) {
    p->moment = c->nparams;
    p->delay = 0.0005 + 0.0025 * fp_unit(&r);
    p->lag_at = 0;
    p->lag_s = 0.005 + 0.01 * fp_unit(&r);
  }
}

/* Member q's gradient of param p, element i, micro-batch mb of a step:
 * an integer in [-6, 6]. */
static inline int fp_val(const fp_case *c, int q, int step, int mb, int p, size_t i) {
  uint64_t h = fp_mix(((uint64_t)c->seed << 40) ^ ((uint64_t)(unsigned)step << 12) ^
                      ((uint64_t)(unsigned)q << 4) ^ (uint64_t)(unsigned)mb);
  h = fp_mix(h ^ ((uint64_t)(unsigned)p << 32) ^ (uint64_t)i);
  return (int)(h % 13) - 6;
}

/* What member q holds in param p, element i, when the step is reduced. */
static inline int fp_input(const fp_case *c, int q, int step, int accum, int p, size_t i) {
  return fp_val(c, q, step, 1, p, i) + (accum ? fp_val(c, q, step, 0, p, i) : 0);
}

/* Small exact values in the param's dtype. */
static inline void fp_put(void *buf, mpg_dtype dt, size_t i, double v) {
  float f = (float)v;
  uint32_t u;
  memcpy(&u, &f, 4);
  switch (dt) {
    case MPG_F32: ((float *)buf)[i] = f; break;
    case MPG_F64: ((double *)buf)[i] = v; break;
    case MPG_BF16: ((uint16_t *)buf)[i] = (uint16_t)(u >> 16); break; /* exact */
    default: {
      uint16_t h = (uint16_t)((u >> 16) & 0x8000u);
      if (f != 0) {
        uint32_t e = (u >> 23) & 0xffu, man = u & 0x7fffffu;
        h = (uint16_t)(h | ((e - 112u) << 10) | (man >> 13));
      }
      ((uint16_t *)buf)[i] = h;
    }
  }
}

static inline double fp_get(const void *buf, mpg_dtype dt, size_t i) {
  switch (dt) {
    case MPG_F32: return ((const float *)buf)[i];
    case MPG_F64: return ((const double *)buf)[i];
    case MPG_BF16: {
      uint32_t u = (uint32_t)((const uint16_t *)buf)[i] << 16;
      float f;
      memcpy(&f, &u, 4);
      return f;
    }
    default: {
      uint16_t h = ((const uint16_t *)buf)[i];
      int e = (h >> 10) & 0x1f, m = h & 0x3ff;
      double v = e == 0 ? ldexp((double)m, -24)
                 : e == 31 ? (m ? NAN : INFINITY)
                           : ldexp((double)(m | 0x400), e - 25);
      return (h & 0x8000u) ? -v : v;
    }
  }
}

/* ------------------------------------------------------------------ */
/* Counts                                                              */
/* ------------------------------------------------------------------ */

#define FP_SCALARS(X)                                                                   \
  X(steps) X(ok_valid) X(ok_invalid) X(errors) X(violations) X(elems) X(epochs)         \
  X(setup_errors) X(mark_err_finish_ok) X(slow) X(begin_errors) X(abort_in_marks)       \
  X(abort_in_finish) X(abort_after_finish) X(alloc_in_mark) X(alloc_in_finish)          \
  X(alloc_unfired) X(abort_nomem) X(max_step_ms) X(max_setup_ms)
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

/* One line: "name=value ..." (every field). */
static inline void fp_tally_print(FILE *f, const fp_tally *t) {
#define FP_OUT(n) fprintf(f, " " #n "=%ld", t->n);
  FP_SCALARS(FP_OUT)
#undef FP_OUT
#define FP_OUT(n)                                               \
  for (int k = 1; k < FP_NKINDS; k++)                           \
    fprintf(f, " %s." #n "=%ld", fp_kind_names[k], t->n[k]);
  FP_PER_KIND(FP_OUT)
#undef FP_OUT
  for (int s = 0; s < MPG_STATUS_COUNT; s++)
    if (t->status[s]) fprintf(f, " st.%s=%ld", mpg_status_name((mpg_status)s), t->status[s]);
}

/* Add one "name=value" of fp_tally_print to *t (max for the max_ ones).
 * Returns 0 when the name is unknown. */
static inline int fp_tally_add_kv(fp_tally *t, const char *key, long v) {
#define FP_IN(n)                                                           \
  if (!strcmp(key, #n)) {                                                  \
    if (!strncmp(#n, "max_", 4)) t->n = v > t->n ? v : t->n;               \
    else t->n += v;                                                        \
    return 1;                                                              \
  }
  FP_SCALARS(FP_IN)
#undef FP_IN
  char name[64];
#define FP_IN(n)                                                           \
  for (int k = 1; k < FP_NKINDS; k++) {                                    \
    snprintf(name, sizeof name, "%s." #n, fp_kind_names[k]);               \
    if (!strcmp(key, name)) {                                              \
      t->n[k] += v;                                                        \
      return 1;                                                            \
    }                                                                      \
  }
  FP_PER_KIND(FP_IN)
#undef FP_IN
  for (int s = 0; s < MPG_STATUS_COUNT; s++) {
    snprintf(name, sizeof name, "st.%s", mpg_status_name((mpg_status)s));
    if (!strcmp(key, name)) {
      t->status[s] += v;
      return 1;
    }
  }
  return 0;
}

static inline void fp_tally_sum(fp_tally *into, const fp_tally *t) {
#define FP_SUM(n)                                                          \
  if (!strncmp(#n, "max_", 4)) into->n = t->n > into->n ? t->n : into->n;  \
  else into->n += t->n;
  FP_SCALARS(FP_SUM)
#undef FP_SUM
#define FP_SUM(n) for (int k = 0; k < FP_NKINDS; k++) into->n[k] += t->n[k];
  FP_PER_KIND(FP_SUM)
#undef FP_SUM
  for (int s = 0; s < MPG_STATUS_COUNT; s++) into->status[s] += t->status[s];
}

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

static inline void fp_ctl_reset(fp_ctl *ctl) {
  atomic_store(&ctl->epoch_over, 0);
  atomic_store(&ctl->killed, 0);
  atomic_store(&ctl->arrived, 0);
  atomic_store(&ctl->generation, 0);
  for (int r = 0; r < FP_MAX_RANKS; r++) {
    atomic_store(&ctl->last_step[r], -1);
    atomic_store(&ctl->pid[r], 0);
  }
}

/* The step the next epoch starts at: one past the last any rank began. */
static inline int fp_ctl_next_step(fp_ctl *ctl, int world) {
  long m = -1;
  for (int r = 0; r < world; r++) {
    long v = atomic_load(&ctl->last_step[r]);
    if (v > m) m = v;
  }
  return (int)(m + 1);
}

/* A process of the job that is gone (SIGKILL, a crash): its rank, or -1. */
static inline int fp_ctl_dead_rank(fp_ctl *ctl, int world) {
  for (int r = 0; r < world; r++) {
    int pid = atomic_load(&ctl->pid[r]);
    if (pid > 0 && kill(pid, 0) != 0 && errno == ESRCH) return r;
  }
  return -1;
}

/* A barrier of `world` processes on shared memory; returns -1 when a rank
 * was killed or its process is gone (looked at every 0.1 s), or after
 * `limit_s`. */
static inline int fp_ctl_barrier(fp_ctl *ctl, int world, double limit_s) {
  int gen = atomic_load(&ctl->generation);
  if (atomic_fetch_add(&ctl->arrived, 1) == world - 1) {
    atomic_store(&ctl->arrived, 0);
    atomic_fetch_add(&ctl->generation, 1);
    return 0;
  }
  double until = fp_now() + limit_s, look = 0;
  while (atomic_load(&ctl->generation) == gen) {
    if (atomic_load(&ctl->killed) || fp_now() > until) return -1;
    if (fp_now() > look) {
      if (fp_ctl_dead_rank(ctl, world) >= 0) return -1;
      look = fp_now() + 0.1;
    }
    fp_sleep(0.001);
  }
  return 0;
}

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

__attribute__((format(printf, 2, 3))) static inline void fp_note(fp_rank *R, const char *fmt,
                                                                  ...) {
  char line[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  for (char *p = line; *p; p++)
    if (*p == '\n') *p = ' ';
  R->note(R, line);
}

static inline void fp_busy(fp_rank *R, const char *what, int step) {
  atomic_store(&R->busy_step, step);
  atomic_store(&R->busy_since_ns, (long long)(fp_now() * 1e9));
  atomic_store(&R->busy_what, what);
}

static inline void fp_idle(fp_rank *R) { atomic_store(&R->busy_what, (const char *)NULL); }

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

static inline void *fp_monitor_main(void *arg) {
  fp_monitor *m = arg;
  while (!atomic_load(&m->stop)) {
    fp_sleep(0.2);
    double now = fp_now();
    for (int i = 0; i < m->n; i++) {
      fp_rank *R = m->ranks[i];
      const char *what = atomic_load(&R->busy_what);
      double since = (double)atomic_load(&R->busy_since_ns) * 1e-9;
      if (!what || now - since <= m->limit_s) continue;
      fp_note(R, "HANG seed %u %s rank %d: %s (step %d) has not returned after %.1f s", R->c->seed,
              fp_name(R->c), R->rank, what, atomic_load(&R->busy_step),
              now - since);
      fflush(stdout);
      fflush(stderr);
      abort();
    }
  }
  return NULL;
}

static inline void fp_monitor_start(fp_monitor *m, fp_rank **ranks, int n, double limit_s) {
  m->ranks = ranks;
  m->n = n;
  m->limit_s = limit_s;
  atomic_store(&m->stop, 0);
  m->up = pthread_create(&m->th, NULL, fp_monitor_main, m) == 0;
}

static inline void fp_monitor_stop(fp_monitor *m) {
  atomic_store(&m->stop, 1);
  if (m->up) pthread_join(m->th, NULL);
  m->up = 0;
}

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

static inline void *fp_watchdog_main(void *arg) {
  fp_watchdog *w = arg;
  fp_sleep(w->delay);
  w->at = fp_now();
  if (w->nomem) fa_arm(1);
  mpg_ctx_abort(w->ctx);
  w->nomem_fired = fa_disarm();
  return NULL;
}

#ifdef FP_ON_DOUBLE
typedef cudaStream_t fp_stream;
#else
typedef void *fp_stream;
#endif

/* Write micro-batch `mb` of param p (added to what is there when add). */
static inline int fp_write(fp_rank *R, const fp_view *v, int p, int step, int mb, int add,
                           fp_stream stream) {
  const fp_case *c = R->c;
  const fp_param *pa = &c->params[p];
#ifdef FP_ON_DOUBLE
  unsigned char *buf = R->host;
  size_t bytes = pa->count * mpg_dtype_size(pa->dtype);
  for (size_t i = 0; i < pa->count; i++) {
    int x = fp_val(c, R->rank, step, mb, p, i) + (add ? fp_val(c, R->rank, step, 0, p, i) : 0);
    fp_put(buf, pa->dtype, i, (double)x);
  }
  if (cudaMemcpyAsync(v->grad, buf, bytes, cudaMemcpyHostToDevice, stream) != cudaSuccess ||
      cudaStreamSynchronize(stream) != cudaSuccess)
    return -1;
#else
  (void)stream;
  for (size_t i = 0; i < pa->count; i++) {
    double x = (double)fp_val(c, R->rank, step, mb, p, i);
    fp_put(v->grad, pa->dtype, i, add ? fp_get(v->grad, pa->dtype, i) + x : x);
  }
#endif
  return 0;
}

/* The param's reduced values, readable on the host (NULL: a copy failed). */
static inline const void *fp_read(fp_rank *R, const fp_view *v, int p, fp_stream stream) {
#ifdef FP_ON_DOUBLE
  const fp_param *pa = &R->c->params[p];
  size_t bytes = pa->count * mpg_dtype_size(pa->dtype);
  if (cudaMemcpyAsync(R->host, v->grad, bytes, cudaMemcpyDeviceToHost, stream) != cudaSuccess ||
      cudaStreamSynchronize(stream) != cudaSuccess)
    return NULL;
  return R->host;
#else
  (void)R;
  (void)p;
  (void)stream;
  return v->grad;
#endif
}

static inline void fp_count_status(fp_rank *R, mpg_status st) {
  if ((unsigned)st < MPG_STATUS_COUNT) R->t.status[st]++;
}

/* Check every param of a step that finished OK with valid gradients. */
static inline void fp_check(fp_rank *R, const fp_view *views, int step, const fp_plan *P,
                            fp_stream stream) {
  const fp_case *c = R->c;
  for (int p = 0; p < c->nparams; p++) {
    const fp_view *v = &views[p];
    const fp_param *pa = &c->params[p];
    const void *got = fp_read(R, v, p, stream);
    if (!got) {
      R->t.violations++;
      fp_note(R, "VIOLATION seed %u %s step %d rank %d: finish OK but the gradient of p%d "
              "cannot be read back", c->seed, fp_name(c), step, R->rank, p);
      return;
    }
    for (size_t i = v->off; i < v->off + v->cnt; i++) {
      long sum = 0;
      for (int k = 0; k < v->n; k++) sum += fp_input(c, v->members[k], step, P->accum, p, i);
      double want = (double)sum * v->scale, have = fp_get(got, pa->dtype, i);
      R->t.elems++;
      if (have == want) continue;
      char in[128];
      size_t n = 0;
      for (int k = 0; k < v->n && n < sizeof in; k++)
        n += (size_t)snprintf(in + n, sizeof in - n, "%s%d (rank %d)", k ? " + " : "",
                              fp_input(c, v->members[k], step, P->accum, p, i), v->members[k]);
      R->t.violations++;
      fp_note(R,
              "VIOLATION seed %u %s step %d rank %d: mpg_sync_finish returned MPG_OK with "
              "grads_valid 1, but p%d (%zu x %s, group of %d) element %zu is %.9g, the "
              "reference %.9g = (%s) x %g; the step's fault: %s on rank %d at moment %d of "
              "%d%s; the step before: %s",
              c->seed, fp_name(c), step, R->rank, p, pa->count,
              mpg_dtype_name(pa->dtype), v->n, i, have, want, in, v->scale,
              fp_kind_names[P->kind], P->victim, P->moment, c->nparams,
              P->accum ? ", two micro-batches" : "", fp_kind_names[R->prev_kind]);
      return; /* the first wrong element of the step is enough */
    }
  }
}

/* Build the mesh of the case. */
static inline mpg_status fp_mesh(const fp_case *c, mpg_mesh **mesh) {
  *mesh = NULL;
  mpg_spec *spec = malloc(sizeof *spec);
  if (!spec) return MPG_ERR_NOMEM;
  *spec = (mpg_spec)MPG_SPEC_INIT;
  mpg_status st = mpg_spec_init(spec);
  if (!st) st = mpg_spec_set_mesh(spec, c->mesh);
  if (!st) st = mpg_spec_add_flatten(spec, "dp_cp", c->flatten);
  if (!st) st = mpg_spec_validate(spec);
  if (!st) st = mpg_mesh_create(spec, c->world, mesh);
  free(spec);
  return st;
}

/* The victim's fault at its moment.  Returns 1 when the rank leaves
 * (thread/nccl FP_KILL). */
static inline int fp_inject(fp_rank *R, const fp_plan *P, int step, mpg_ctx *ctx,
                            fp_watchdog *wd, pthread_t *dog, int *dog_up, double *slept) {
  const fp_case *c = R->c;
  switch (P->kind) {
    case FP_ABORT:
      wd->ctx = ctx;
      wd->delay = P->delay;
      wd->at = 0;
      wd->nomem = P->abort_nomem;
      wd->nomem_fired = 0;
      if (pthread_create(dog, NULL, fp_watchdog_main, wd) == 0) *dog_up = 1;
      R->t.injected[FP_ABORT]++;
      return 0;
    case FP_STALL:
      fp_sleep(P->stall_s);
      *slept += P->stall_s;
      R->t.injected[FP_STALL]++;
      return 0;
    case FP_ALLOC:
      fa_arm(P->alloc_n);
      return 0;
    case FP_KILL:
      R->t.injected[FP_KILL]++;
      if (c->procs) {
        /* The counts so far go first: a killed process prints nothing. */
        fp_note(R, "KILLED seed %u rank %d at step %d, moment %d of %d", c->seed, R->rank,
                step, P->moment, c->nparams);
        printf("TALLY rank %d", R->rank);
        fp_tally_print(stdout, &R->t);
        printf("\n");
        fflush(stdout);
        atomic_store(&R->ctl->killed, 1);
        raise(SIGKILL);
      }
      return 1;
    default:
      return 0;
  }
}

/* One epoch of rank R: a fresh context from `start` until the steps end,
 * its context dies, or another rank's did.  Returns 1 when the rank left
 * (FP_KILL on thread / nccl). */
static inline int fp_epoch(fp_rank *R, int start) {
  const fp_case *c = R->c;
  int rank = R->rank, left = 0;
  mpg_mesh *mesh = NULL;
  mpg_ctx *ctx = NULL;
  mpg_sync *s = NULL;
  fp_view views[FP_MAX_PARAMS];
  int order[FP_MAX_PARAMS];
  fp_stream stream = 0;
  double t0 = fp_now();
  const char *what = "mesh";
  fp_busy(R, "the set-up (mpg_ctx_create .. mpg_sync_commit)", start);
  mpg_status st = fp_mesh(c, &mesh);
  mpg_init_opts o = R->base;
  o.backend.timeout_s = FP_SETUP_TIMEOUT_S;
#ifdef FP_ON_DOUBLE
  if (!st) {
    what = "cudaStreamCreate";
    cudaSetDevice(o.device >= 0 ? o.device : 0);
    if (cudaStreamCreate(&stream) != cudaSuccess) st = MPG_ERR_BACKEND;
  }
#endif
  if (!st) {
    what = "mpg_ctx_create";
    st = mpg_ctx_create(mesh, &o, &ctx);
  }
  mpg_sync_opts so = MPG_SYNC_OPTS_INIT;
  so.sync.op = c->op;
  so.grad_scale = c->grad_scale;
  so.sync.reduce_dtype = c->reduce_dtype;
  so.sync.bucket_mb = c->bucket_mb;
  so.sync.first_bucket_mb = c->first_bucket_mb;
  if (c->shard) {
    so.sync.mode = MPG_SYNC_SHARD;
    snprintf(so.sync.shard_dims, sizeof so.sync.shard_dims, "%s", c->shard_dims ? c->shard_dims : "");
    snprintf(so.sync.replicate_dims, sizeof so.sync.replicate_dims, "%s", c->replicate_dims ? c->replicate_dims : "");
  }
  if (!st) {
    what = "mpg_sync_create";
    st = mpg_sync_create(ctx, &so, &s);
  }
  for (int p = 0; p < c->nparams && !st; p++) {
    char name[16];
    snprintf(name, sizeof name, "p%d", p);
    mpg_param_opts po = MPG_PARAM_OPTS_INIT;
    po.reduce_dims = c->params[p].reduce_dims;
    int id;
    what = "mpg_sync_add_param";
    st = mpg_sync_add_param(s, name, c->params[p].count, c->params[p].dtype, &po, &id);
  }
  if (!st) {
    what = "mpg_sync_commit";
    st = mpg_sync_commit(s);
  }
  /* Views, groups and owned ranges. */
  for (int p = 0; p < c->nparams && !st; p++) {
    fp_view *v = &views[p];
    mpg_group *g = NULL;
    what = "views";
    st = mpg_sync_grad(s, p, &v->grad);
    if (!st) st = mpg_sync_param_group(s, p, &g);
    if (st) break;
    v->n = mpg_group_size(g);
    if (v->n < 1 || v->n > FP_MAX_RANKS) {
      st = MPG_ERR_STATE;
      break;
    }
    for (int k = 0; k < v->n && !st; k++) st = mpg_group_member(g, k, &v->members[k]);
    v->off = 0;
    v->cnt = c->params[p].count;
    if (c->shard && !st) {
      mpg_shard_info info = MPG_SHARD_INFO_INIT;
      st = mpg_sync_get_shard(s, p, &info);
      v->off = info.param_offset;
      v->cnt = info.count;
    }
    v->scale = c->op == MPG_OP_AVG ? c->grad_scale / v->n : c->grad_scale;
  }
  if (!st) {
    what = "mpg_ctx_set_timeout";
    st = mpg_ctx_set_timeout(ctx, c->timeout_s);
  }
  long setup_ms = (long)((fp_now() - t0) * 1000);
  if (setup_ms > R->t.max_setup_ms) R->t.max_setup_ms = setup_ms;
  if (st) {
    R->t.setup_errors++;
    fp_note(R, "SETUP seed %u %s rank %d, epoch from step %d: %s -> %s: %s", c->seed,
            fp_name(c), rank, start, what, mpg_status_name(st),
            mpg_last_error());
    atomic_store(&R->ctl->epoch_over, 1);
    goto done;
  }
  R->t.epochs++;
  fp_idle(R);

  for (int step = start; step < c->steps; step++) {
    if (atomic_load(&R->ctl->epoch_over)) break;
    fp_busy(R, "a step", step);
    atomic_store(&R->ctl->last_step[rank], step);
    fp_plan P;
    fp_plan_of(c, step, &P);
    int victim = P.kind != FP_NONE && P.victim == rank;
    fp_rng rr = {fp_mix(((uint64_t)c->seed << 24) ^ ((uint64_t)(unsigned)step << 4) ^
                        (uint64_t)(unsigned)rank)};
    int n = c->nparams;
    for (int p = 0; p < n; p++) order[p] = p;
    for (int k = n - 1; k > 0; k--) {
      int j = (int)fp_below(&rr, (unsigned)k + 1), tmp = order[k];
      order[k] = order[j];
      order[j] = tmp;
    }
    int jitter_at = fp_below(&rr, 4) == 0 ? (int)fp_below(&rr, (unsigned)n + 1) : -1;
    double jitter = 0.001 + 0.014 * fp_unit(&rr);
    if (P.kind && P.laggard == rank) {
      jitter_at = P.lag_at;
      jitter = P.lag_s;
    }
    /* Sometimes only the first half is marked: finish launches the rest. */
    int marks = fp_below(&rr, 4) == 0 ? n / 2 : n;
    R->t.steps++;
    if (P.kind) R->t.rank_steps[P.kind]++;
    if (victim) R->t.planned[P.kind]++;
    fp_watchdog wd = {NULL, 0, 0, 0, 0};
    pthread_t dog;
    int dog_up = 0;
    double slept = 0, ts = fp_now(), tf0 = 0, tf1 = 0;
    mpg_status fst = MPG_OK; /* the step's result: its first error */
    mpg_status fin = MPG_ERR_STATE; /* what mpg_sync_finish returned */
    int mark_err = 0, alloc_where = 0, valid = 0, began = 0;
    if (P.accum) {
      /* The first micro-batch: accumulated, nothing launched. */
      st = mpg_sync_begin(s, step, 0, stream);
      int open = st == MPG_OK;
      for (int p = 0; p < n && !st; p++) {
        if (fp_write(R, &views[p], p, step, 0, 0, stream)) st = MPG_ERR_BACKEND;
        if (!st) st = mpg_sync_mark_ready(s, p);
      }
      if (open) {
        mpg_status fs = mpg_sync_finish(s);
        if (!st) st = fs;
      }
      if (st) {
        fst = st;
        R->t.begin_errors++;
        goto judged;
      }
    }
    st = mpg_sync_begin(s, step, 1, stream);
    if (st) {
      fst = st;
      R->t.begin_errors++;
      goto judged;
    }
    began = 1;
    for (int k = 0; k <= n; k++) {
      if (victim && P.moment == k &&
          fp_inject(R, &P, step, ctx, &wd, &dog, &dog_up, &slept)) {
        left = 1;
        break;
      }
      if (jitter_at == k) {
        fp_sleep(jitter);
        slept += jitter;
      }
      if (k == n) break;
      int p = order[k];
      if (fp_write(R, &views[p], p, step, 1, P.accum, stream)) {
        mark_err = 1;
        fst = MPG_ERR_BACKEND;
      }
      if (!mark_err && k < marks) {
        st = mpg_sync_mark_ready(s, p);
        if (st) {
          mark_err = 1;
          fst = st;
        }
        if (!alloc_where && fa_fired()) alloc_where = 1;
      }
    }
    if (left) {
      /* Leave mid-step: destroy the sync (it waits for the buckets in
       * flight) and the context; this rank sits the epoch out. */
      if (dog_up) pthread_join(dog, NULL);
      fa_disarm();
      fp_note(R, "LEFT seed %u %s rank %d at step %d, moment %d of %d", c->seed,
              fp_name(c), rank, step, P.moment, n);
      break;
    }
    tf0 = fp_now();
    st = fin = mpg_sync_finish(s);
    tf1 = fp_now();
    if (!alloc_where && fa_fired()) alloc_where = 2;
    valid = mpg_sync_grads_valid(s);
    if (st && !fst) fst = st;
    if (!st && mark_err) {
      R->t.mark_err_finish_ok++;
      fp_note(R, "ODD seed %u %s step %d rank %d: mark_ready or a copy failed (%s), but "
              "mpg_sync_finish returned MPG_OK (grads_valid %d)", c->seed,
              fp_name(c), step, rank, mpg_status_name(fst), valid);
    }
    if (victim && P.moment == n + 1 && fp_inject(R, &P, step, ctx, &wd, &dog, &dog_up, &slept))
      left = 1;
  judged:
    if (dog_up) {
      pthread_join(dog, NULL);
      R->t.abort_nomem += wd.nomem_fired;
      if (wd.at < tf0 || !began) R->t.abort_in_marks++;
      else if (wd.at <= tf1) R->t.abort_in_finish++;
      else R->t.abort_after_finish++;
    }
    if (victim && P.kind == FP_ALLOC) {
      if (fa_disarm()) {
        R->t.injected[FP_ALLOC]++;
        if (alloc_where == 1) R->t.alloc_in_mark++;
        else R->t.alloc_in_finish++;
      } else {
        R->t.alloc_unfired++;
      }
    }
    /* The property: finish's MPG_OK with valid gradients means the
     * reference sums, whatever failed before it in the step. */
    if (began && fin == MPG_OK && valid == 1) fp_check(R, views, step, &P, stream);
    if (!fst && began && fin == MPG_OK) {
      if (valid == 1) R->t.ok_valid++;
      else R->t.ok_invalid++;
      if (P.kind) R->t.ok[P.kind]++;
    } else {
      R->t.errors++;
      fp_count_status(R, fst ? fst : st);
      if (P.kind) R->t.err[P.kind]++;
      else if (R->prev_kind) R->t.next_err[R->prev_kind]++;
    }
    if (R->verbose)
      fp_note(R, "STEP seed %u %s step %d rank %d: fault %s on rank %d at moment %d of %d%s: "
              "%s, grads_valid %d%s%s", c->seed, fp_name(c), step, rank,
              fp_kind_names[P.kind], P.victim, P.moment, n, P.accum ? " (two micro-batches)" : "",
              mpg_status_name(fst ? fst : st), valid, (fst || st) ? ": " : "",
              (fst || st) ? mpg_last_error() : "");
    R->prev_kind = P.kind;
    double took = fp_now() - ts, own = took - slept;
    long ms = (long)(own * 1000);
    if (ms > R->t.max_step_ms) R->t.max_step_ms = ms;
    double bound = 2 * (c->timeout_s + 1.0) + tb_allowance(2 * c->world);
    if (own > bound) {
      R->t.slow++;
      fp_note(R, "SLOW seed %u %s step %d rank %d: the step took %.3f s besides its own "
              "sleeps (%.3f s), bound %.3f s; status %s; fault %s on rank %d", c->seed,
              fp_name(c), step, rank, own, slept, bound,
              mpg_status_name(fst ? fst : st), fp_kind_names[P.kind], P.victim);
    }
    if (left) {
      fp_note(R, "LEFT seed %u %s rank %d after step %d", c->seed, fp_name(c),
              rank, step);
      break;
    }
    /* A dead context ends the epoch (for every rank). */
    if (mpg_ctx_status(ctx) != MPG_OK) {
      atomic_store(&R->ctl->epoch_over, 1);
      break;
    }
  }
done:
  fa_disarm();
  fp_busy(R, "the teardown (mpg_sync_destroy, mpg_ctx_destroy)", -1);
  t0 = fp_now();
  mpg_status sd = mpg_sync_destroy(s), cd = mpg_ctx_destroy(ctx);
  double dt = fp_now() - t0;
  if (sd || cd)
    fp_note(R, "DESTROY seed %u %s rank %d: mpg_sync_destroy -> %s, mpg_ctx_destroy -> %s: %s",
            c->seed, fp_name(c), rank, mpg_status_name(sd),
            mpg_status_name(cd), mpg_last_error());
  if (dt > c->timeout_s + 1.0 + tb_allowance(2 * c->world)) {
    R->t.slow++;
    fp_note(R, "SLOW seed %u %s rank %d: destroying the sync and context took %.3f s",
            c->seed, fp_name(c), rank, dt);
  }
  mpg_mesh_destroy(mesh);
#ifdef FP_ON_DOUBLE
  if (stream) cudaStreamDestroy(stream);
#endif
  fp_idle(R);
  if (left) return 1;
  return 0;
}

#endif
