/* The fault property (fault_props.h): one rank's steps and epochs, its
 * faults, checks and notes, and the hang monitor. */
#include "fault_props.h"

/* ------------------------------------------------------------------ */
/* One rank                                                            */
/* ------------------------------------------------------------------ */

__attribute__((format(printf, 2, 3))) void fp_note(fp_rank *R, const char *fmt,
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

void fp_busy(fp_rank *R, const char *what, int step) {
  atomic_store(&R->busy_step, step);
  atomic_store(&R->busy_since_ns, (long long)(fp_now() * 1e9));
  atomic_store(&R->busy_what, what);
}

void fp_idle(fp_rank *R) { atomic_store(&R->busy_what, (const char *)NULL); }

void *fp_monitor_main(void *arg) {
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

void fp_monitor_start(fp_monitor *m, fp_rank **ranks, int n, double limit_s) {
  m->ranks = ranks;
  m->n = n;
  m->limit_s = limit_s;
  atomic_store(&m->stop, 0);
  m->up = pthread_create(&m->th, NULL, fp_monitor_main, m) == 0;
}

void fp_monitor_stop(fp_monitor *m) {
  atomic_store(&m->stop, 1);
  if (m->up) pthread_join(m->th, NULL);
  m->up = 0;
}

void *fp_watchdog_main(void *arg) {
  fp_watchdog *w = arg;
  fp_sleep(w->delay);
  w->at = fp_now();
  if (w->nomem) fa_arm(1);
  mpg_ctx_abort(w->ctx);
  w->nomem_fired = fa_disarm();
  return NULL;
}

/* Write micro-batch `mb` of param p (added to what is there when add). */
int fp_write(fp_rank *R, const fp_view *v, int p, int step, int mb, int add,
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
const void *fp_read(fp_rank *R, const fp_view *v, int p, fp_stream stream) {
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

void fp_count_status(fp_rank *R, mpg_status st) {
  if ((unsigned)st < MPG_STATUS_COUNT) R->t.status[st]++;
}

/* Check every param of a step that finished OK with valid gradients. */
void fp_check(fp_rank *R, const fp_view *views, int step, const fp_plan *P,
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
mpg_status fp_mesh(const fp_case *c, mpg_mesh **mesh) {
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
int fp_inject(fp_rank *R, const fp_plan *P, int step, mpg_ctx *ctx,
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

/* The all-to-all of fp_case.a2a: FP_A2A_COUNT i32 a block (on mpi its
 * mem_alloc buffers are memfds, read in place by the peers). */
#define FP_A2A_COUNT 8192

static int32_t fp_a2a_val(const fp_case *c, int step, int from, int to, size_t k) {
  uint64_t h = fp_mix(((uint64_t)c->seed << 40) ^ ((uint64_t)(unsigned)step << 16) ^
                      ((uint64_t)(unsigned)from << 8) ^ (uint64_t)(unsigned)to);
  return (int32_t)(uint32_t)(h + k);
}

/* Post this step's all-to-all (*aw NULL when it failed: counted). */
static void fp_a2a_post(fp_rank *R, mpg_group *g, int32_t *send, int32_t *recv, int step,
                        mpg_work **aw) {
  const fp_case *c = R->c;
  for (int j = 0; j < c->world; j++)
    for (size_t k = 0; k < FP_A2A_COUNT; k++)
      send[(size_t)j * FP_A2A_COUNT + k] = fp_a2a_val(c, step, R->rank, j, k);
  memset(recv, 0xff, sizeof *recv * FP_A2A_COUNT * (size_t)c->world);
  *aw = NULL;
  mpg_status st = mpg_all_to_all(g, send, recv, FP_A2A_COUNT, MPG_I32, NULL, aw);
  if (st) {
    *aw = NULL;
    R->t.a2a_err++;
    if (R->verbose)
      fp_note(R, "A2A seed %u step %d rank %d: posting: %s", c->seed, step, R->rank,
              mpg_last_error());
  }
}

/* Wait for it: MPG_OK must hold every block exactly; on an error the send
 * buffer is this member's again at once, and is reused. */
static void fp_a2a_wait(fp_rank *R, mpg_work **aw, int32_t *send, const int32_t *recv,
                        int step, const fp_plan *P) {
  const fp_case *c = R->c;
  mpg_status st = mpg_work_wait(*aw);
  *aw = NULL;
  if (st) {
    R->t.a2a_err++;
    if (R->verbose)
      fp_note(R, "A2A seed %u step %d rank %d: waiting: %s", c->seed, step, R->rank,
              mpg_last_error());
    for (size_t i = 0; i < FP_A2A_COUNT * (size_t)c->world; i++) send[i] = ~send[i];
    return;
  }
  R->t.a2a_ok++;
  for (int j = 0; j < c->world; j++)
    for (size_t k = 0; k < FP_A2A_COUNT; k++) {
      int32_t got = recv[(size_t)j * FP_A2A_COUNT + k], want = fp_a2a_val(c, step, j, R->rank, k);
      if (got == want) continue;
      R->t.violations++;
      fp_note(R, "VIOLATION seed %u %s step %d rank %d: the all-to-all on the world group "
              "returned MPG_OK, but element %zu of the block from rank %d is %d, not %d; "
              "the step's fault: %s on rank %d at moment %d of %d", c->seed, fp_name(c),
              step, R->rank, k, j, (int)got, (int)want, fp_kind_names[P->kind], P->victim,
              P->moment, c->nparams);
      return;
    }
}

/* The sync of case c: its op, scale, reduce dtype, buckets and, sharded,
 * its shard and replicate dims. */
static mpg_sync_opts case_sync_opts(const fp_case *c) {
  mpg_sync_opts so = MPG_SYNC_OPTS_INIT;
  mpg_sync_settings *s = &so.sync;
  so.grad_scale = c->grad_scale;
  s->op = c->op;
  s->reduce_dtype = c->reduce_dtype;
  s->bucket_mb = c->bucket_mb;
  s->first_bucket_mb = c->first_bucket_mb;
  if (c->shard) {
    s->mode = MPG_SYNC_SHARD;
    snprintf(s->shard_dims, sizeof s->shard_dims, "%s", c->shard_dims ? c->shard_dims : "");
    snprintf(s->replicate_dims, sizeof s->replicate_dims, "%s",
             c->replicate_dims ? c->replicate_dims : "");
  }
  return so;
}

/* One epoch of rank R: a fresh context from `start` until the steps end,
 * its context dies, or another rank's did.  Returns 1 when the rank left
 * (FP_KILL on thread / nccl). */
int fp_epoch(fp_rank *R, int start) {
  const fp_case *c = R->c;
  int rank = R->rank, left = 0;
  mpg_mesh *mesh = NULL;
  mpg_ctx *ctx = NULL;
  mpg_sync *s = NULL;
  fp_view views[FP_MAX_PARAMS];
  int order[FP_MAX_PARAMS];
  fp_stream stream = 0;
  mpg_group *ag = NULL; /* fp_case.a2a: the world group */
  int32_t *asend = NULL, *arecv = NULL;
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
  mpg_sync_opts so = case_sync_opts(c);
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
  if (c->a2a && !st) {
    size_t bytes = sizeof(int32_t) * FP_A2A_COUNT * (size_t)c->world;
    what = "the all-to-all's group and buffers";
    st = mpg_ctx_group(ctx, "world", &ag);
    if (!st) st = mpg_ctx_mem_alloc(ctx, bytes, 0, (void **)&asend);
    if (!st) st = mpg_ctx_mem_alloc(ctx, bytes, 0, (void **)&arecv);
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
    mpg_work *aw = NULL; /* fp_case.a2a: in flight across the step */
    pthread_t dog;
    int dog_up = 0;
    double slept = 0, ts = fp_now(), tf0 = 0, tf1 = 0;
    mpg_status fst = MPG_OK; /* the step's result: its first error */
    mpg_status fin = MPG_ERR_STATE; /* what mpg_sync_finish returned */
    int mark_err = 0, alloc_where = 0, valid = 0, began = 0;
    /* First on every rank (the issue-order check sees it before the
     * step's buckets, launched in each rank's own order). */
    if (ag) fp_a2a_post(R, ag, asend, arecv, step, &aw);
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
      if (aw) (void)mpg_work_wait(aw); /* released before the context goes */
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
    if (aw) fp_a2a_wait(R, &aw, asend, arecv, step, &P);
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
  if (ctx) {
    (void)mpg_ctx_mem_free(ctx, asend);
    (void)mpg_ctx_mem_free(ctx, arecv);
  }
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
