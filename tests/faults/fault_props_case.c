/* The fault property (fault_props.h): random numbers, cases, plans and
 * values, counts, and the ranks' shared control. */
#include "fault_props.h"

/* ------------------------------------------------------------------ */
/* Random numbers                                                      */
/* ------------------------------------------------------------------ */

uint64_t fp_mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t fp_next(fp_rng *r) {
  r->s += 0x9e3779b97f4a7c15ull;
  return fp_mix(r->s);
}

unsigned fp_below(fp_rng *r, unsigned n) {
  return n ? (unsigned)(fp_next(r) % n) : 0;
}

double fp_unit(fp_rng *r) { return (double)(fp_next(r) >> 11) * 0x1p-53; }

double fp_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void fp_sleep(double s) {
  if (s <= 0) return;
  struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  while (nanosleep(&ts, &ts) != 0) {
  }
}

/* ------------------------------------------------------------------ */
/* Cases                                                               */
/* ------------------------------------------------------------------ */

/* The backend as messages name it. */
const char *fp_name(const fp_case *c) {
  if (c->backend == FP_NCCL && c->procs) return "nccl-processes";
  return fp_backend_names[c->backend];
}

/* Draw case `seed` of `backend` with `steps` steps; procs: the ranks are
 * processes under mpirun (mpi always; nccl on the double's processes), and
 * then kill: one SIGKILL in the last steps (the job ends with it). */
void fp_case_make(unsigned seed, int backend, int procs, int steps, int kill,
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
  /* Drawn last: the cases' other draws are those from before issue 45. */
  c->a2a = backend != FP_NCCL && fp_below(&r, 2) == 0;
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
void fp_seams_apply(const fp_case *c) {
#ifdef FP_SHM_SEAMS
  mpg__shm_seams.first_q = c->first_q;
  mpg__shm_seams.abort_claimed = c->slow_abort ? fp_abort_claimed : NULL;
#else
  (void)c;
#endif
}

void fp_describe(const fp_case *c, char *buf, size_t cap) {
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
  if (c->a2a && n < cap)
    n += (size_t)snprintf(buf + n, cap - n, ", an all-to-all across each step");
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

void fp_plan_of(const fp_case *c, int step, fp_plan *p) {
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
int fp_val(const fp_case *c, int q, int step, int mb, int p, size_t i) {
  uint64_t h = fp_mix(((uint64_t)c->seed << 40) ^ ((uint64_t)(unsigned)step << 12) ^
                      ((uint64_t)(unsigned)q << 4) ^ (uint64_t)(unsigned)mb);
  h = fp_mix(h ^ ((uint64_t)(unsigned)p << 32) ^ (uint64_t)i);
  return (int)(h % 13) - 6;
}

/* What member q holds in param p, element i, when the step is reduced. */
int fp_input(const fp_case *c, int q, int step, int accum, int p, size_t i) {
  return fp_val(c, q, step, 1, p, i) + (accum ? fp_val(c, q, step, 0, p, i) : 0);
}

/* Small exact values in the param's dtype. */
void fp_put(void *buf, mpg_dtype dt, size_t i, double v) {
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

double fp_get(const void *buf, mpg_dtype dt, size_t i) {
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

/* One line: "name=value ..." (every field). */
void fp_tally_print(FILE *f, const fp_tally *t) {
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
int fp_tally_add_kv(fp_tally *t, const char *key, long v) {
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

void fp_tally_sum(fp_tally *into, const fp_tally *t) {
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

void fp_ctl_reset(fp_ctl *ctl) {
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
int fp_ctl_next_step(fp_ctl *ctl, int world) {
  long m = -1;
  for (int r = 0; r < world; r++) {
    long v = atomic_load(&ctl->last_step[r]);
    if (v > m) m = v;
  }
  return (int)(m + 1);
}

/* A process of the job that is gone (SIGKILL, a crash): its rank, or -1. */
int fp_ctl_dead_rank(fp_ctl *ctl, int world) {
  for (int r = 0; r < world; r++) {
    int pid = atomic_load(&ctl->pid[r]);
    if (pid > 0 && kill(pid, 0) != 0 && errno == ESRCH) return r;
  }
  return -1;
}

/* A barrier of `world` processes on shared memory; returns -1 when a rank
 * was killed or its process is gone (looked at every 0.1 s), or after
 * `limit_s`. */
int fp_ctl_barrier(fp_ctl *ctl, int world, double limit_s) {
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
