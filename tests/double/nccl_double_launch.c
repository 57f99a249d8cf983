/* The NCCL half of the test double (nccl_double.c): launching a group's
 * operations on one communicator (the launch race of two host threads on
 * one device) and the outermost ncclGroupEnd. */

#include "nccl_double_internal.h"

/* ------------------------------------------------------------------ */
/* Launching a group's operations on one communicator                 */
/* ------------------------------------------------------------------ */

ncclResult_t cuda_fail(cudaError_t e) {
  /* CUDACHECK's wording (include/checks.h:13-19). */
  warn("Cuda failure '%s'", cudaGetErrorString(e));
  return ncclUnhandledCudaError;
}

static ncclResult_t launch_plan_on_device(struct plan *p);

/* Two host threads launching on one device (v2.28.9): with
 * NCCL_LAUNCH_ORDER_IMPLICIT set (and not capturing a graph, which the
 * double does not model), ncclLaunchPrepare acquires the device's
 * launchOrder strong stream as not concurrent (enqueue.cc:1510-1515, "non-
 * captured cannot be concurrent because that would violate deterministic
 * program order of launches"), which records the acquiring thread
 * (strongstream.cc:170-172), and ncclLaunchFinish releases it
 * (enqueue.cc:1738-1742), where ncclStrongStreamRelease returns
 * ncclInvalidUsage with "Fatal: host threads racing to launch NCCL on same
 * device." when another thread acquired it in between
 * (strongstream.cc:158-162, 282-285; NCCL_LAUNCH_RACE_FATAL, default 1).
 * The kernel was launched all the same.  Both variables are read at the
 * process's first launch (NCCL_PARAM caches them). */
static pthread_once_t race_once = PTHREAD_ONCE_INIT;
static int race_on;
static _Thread_local char race_marker;
static _Atomic(void *) race_owner[MAX_DEV_TRACK];

static void race_read(void) {
  const char *o = getenv("NCCL_LAUNCH_ORDER_IMPLICIT"), *f = getenv("NCCL_LAUNCH_RACE_FATAL");
  race_on = o && atoi(o) != 0 && !(f && f[0] && atoi(f) == 0);
}

/* Test knob (test_nccl_rules.c): hold every launch this long inside its
 * acquired window, so that a second thread's launch falls in it. */
static _Atomic double launch_pause_s;
void dbl_fault_launch_pause(double seconds);
void dbl_fault_launch_pause(double seconds) { atomic_store(&launch_pause_s, seconds); }

static int launch_race_enter(struct plan *p) {
  pthread_once(&race_once, race_read);
  int d = p->comm->device;
  int on = race_on && p->n > 0 && d >= 0 && d < MAX_DEV_TRACK;
  if (on) atomic_store(&race_owner[d], (void *)&race_marker);
  double pause = atomic_load(&launch_pause_s);
  if (pause > 0) {
    struct timespec ts = {(time_t)pause, (long)((pause - (double)(time_t)pause) * 1e9)};
    nanosleep(&ts, NULL);
  }
  return on;
}

static ncclResult_t launch_race_leave(struct plan *p) {
  if (atomic_load(&race_owner[p->comm->device]) == (void *)&race_marker) return ncclSuccess;
  warn("Fatal: host threads racing to launch NCCL on same device.");
  return ncclInvalidUsage;
}

/* groupLaunch makes each communicator's device current before launching
 * its plan (group.cc:597; the blocking group end restores the caller's device,
 * group.cc:741-745), which is where stream 0 then points. */
static ncclResult_t launch_plan(struct plan *p) {
  int old = dbl_device_current();
  cudaError_t e = old == p->comm->device ? cudaSuccess : cudaSetDevice(p->comm->device);
  if (e != cudaSuccess) return cuda_fail(e);
  int race = launch_race_enter(p);
  ncclResult_t r = launch_plan_on_device(p);
  if (race && r == ncclSuccess) r = launch_race_leave(p);
  if (old != p->comm->device) (void)cudaSetDevice(old);
  return r;
}

static ncclResult_t launch_plan_on_device(struct plan *p) {
  struct ncclComm *c = p->comm;
  int nself_send = 0, nself_recv = 0;
  for (int i = 0; i < p->n; i++) {
    if (p->tasks[i].func == F_SEND && p->tasks[i].root == c->rank) nself_send++;
    if (p->tasks[i].func == F_RECV && p->tasks[i].root == c->rank) nself_recv++;
  }
  /* enqueue.cc:1066-1076: a send to self needs its receive in the same
   * group, and the other way round. */
  if (nself_send > nself_recv) {
    warn("Trying to send to self without a matching recv");
    return ncclInvalidUsage;
  }
  if (nself_recv > nself_send) {
    warn("Trying to recv to self without a matching send");
    return ncclInvalidUsage;
  }
  if (p->n == 0) return ncclSuccess;
  /* Each stream must be one of the communicator's device: the kernel is
   * launched there (a stream of another device fails the launch). */
  cudaStream_t streams[64];
  int ns = 0;
  for (int i = 0; i < p->n; i++) {
    cudaStream_t s = p->tasks[i].stream;
    if (dbl_stream_device(s) != c->device) return cuda_fail(cudaErrorInvalidResourceHandle);
    int seen = 0;
    for (int j = 0; j < ns; j++) seen |= streams[j] == s;
    if (!seen && ns < 64) streams[ns++] = s;
  }

  struct launch *L = calloc(1, sizeof *L);
  if (!L) return ncclSystemError;
  L->n = p->n;
  L->k = calloc((size_t)p->n, sizeof *L->k);
  L->srcs = calloc((size_t)c->nranks, sizeof *L->srcs);
  L->acc = malloc(2 * c->shm->bank);
  if (!L->k || !L->srcs || !L->acc) {
    launch_free(L);
    return ncclSystemError;
  }
  pthread_mutex_lock(&c->mu);
  uint64_t colls0 = c->colls_issued;
  for (int i = 0; i < p->n; i++) {
    struct ktask *k = &L->k[i];
    k->t = p->tasks[i];
    k->prev = -1;
    if (is_coll(k->t.func)) {
      k->t.seq = ++c->colls_issued;
      if (k->t.opc == OPC_PREMUL) {
        k->scal = calloc((size_t)c->nranks, sizeof(uint64_t));
        if (!k->scal) dbl_fatal("nccl double: out of memory");
      }
    } else {
      uint64_t *ctr = k->t.func == F_SEND ? c->sends_issued : c->recvs_issued;
      k->t.seq = ++ctr[k->t.root];
      for (int j = i - 1; j >= 0; j--)
        if (L->k[j].t.func == k->t.func && L->k[j].t.root == k->t.root) {
          k->prev = j;
          break;
        }
    }
  }
  pthread_mutex_unlock(&c->mu);

  int wr = c->world_rank;
  L->world_rank = wr;
  if (wr >= 0 && wr < MAX_WORLD) {
    L->nth_last = atomic_fetch_add(&ops_issued_by[wr], (uint64_t)p->n) + (uint64_t)p->n;
    L->nth_first = L->nth_last - (uint64_t)p->n + 1;
  }
  char t0[160];
  task_text(&L->k[0].t, t0, sizeof t0);
  if (p->n == 1)
    snprintf(L->what, sizeof L->what, "%s #%" PRIu64 " [rank %d/%d of %s]", t0, L->k[0].t.seq,
             c->rank, c->nranks, c->name);
  else
    snprintf(L->what, sizeof L->what, "NCCL group of %d operations: %s #%" PRIu64 ", ... "
             "[rank %d/%d of %s]", p->n, t0, L->k[0].t.seq, c->rank, c->nranks, c->name);

  /* Several streams in one group: the first waits for the others, which
   * then wait for the kernel (enqueue.cc:1497-1502 and 1725-1729). */
  cudaError_t e = cudaSuccess;
  for (int i = 1; i < ns && e == cudaSuccess; i++) {
    cudaEvent_t ev;
    e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    if (e != cudaSuccess) break;
    e = cudaEventRecord(ev, streams[i]);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(streams[0], ev, 0);
    (void)cudaEventDestroy(ev);
  }
  if (e == cudaSuccess) {
    comm_ref(c);
    L->comm = c;
    e = dbl_stream_submit(streams[0], L->what, 1, launch_run, L);
    if (e != cudaSuccess) comm_unref(c);
  }
  if (e != cudaSuccess) {
    /* Nothing was published: give the sequence numbers back. */
    pthread_mutex_lock(&c->mu);
    c->colls_issued = colls0;
    for (int i = p->n - 1; i >= 0; i--)
      if (!is_coll(L->k[i].t.func))
        (L->k[i].t.func == F_SEND ? c->sends_issued : c->recvs_issued)[L->k[i].t.root]--;
    pthread_mutex_unlock(&c->mu);
    launch_free(L);
    return cuda_fail(e);
  }
  /* Published for the reports of the peers' watchdogs. */
  struct shm_rank *me = seg_rank(c->shm, c->rank);
  struct task last = p->tasks[p->n - 1];
  last.seq = L->k[p->n - 1].t.seq;
  desc_store(&me->issued, &last, 0);
  atomic_store(&me->colls_issued, c->colls_issued);
  if (c->shm->net) { /* to the peers' replicas (nccl_double_net.c) */
    net_pub(c->shm, PUB_A64, -1, &me->issued.seq, 3 * sizeof(uint64_t));
    net_pub(c->shm, PUB_A32, -1, &me->issued.func, 6 * sizeof(int32_t));
    net_pub(c->shm, PUB_A64, -1, &me->colls_issued, sizeof(uint64_t));
  }
  atomic_fetch_add(&c->own_issued, 1);
  atomic_store(&L->ticket, atomic_fetch_add(&c->sh->tickets, 1) + 1);
  for (int i = 1; i < ns && e == cudaSuccess; i++) {
    cudaEvent_t ev;
    e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    if (e != cudaSuccess) break;
    e = cudaEventRecord(ev, streams[0]);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(streams[i], ev, 0);
    (void)cudaEventDestroy(ev);
  }
  return e == cudaSuccess ? ncclSuccess : cuda_fail(e);
}

void run_reclaim(struct job *j);

/* ncclGroupEndInternal (group.cc:646-760). */
ncclResult_t group_end_internal(void) {
  if (g_depth == 0) {
    warn("ncclGroupEnd: not in a group call.");
    return ncclInvalidUsage;
  }
  if (--g_depth > 0) return ncclSuccess;
  ncclResult_t ret = g_error;
  int nonblocking = g_blocking == 0;
  struct job *jobs = g_jobs;
  g_jobs = NULL;
  g_error = ncclSuccess;
  g_blocking = -1;
  if (ret != ncclSuccess) {
    /* groupCleanup: nothing is launched; non-blocking communicators take
     * the error (group.cc:380-392). */
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", tl_last_error);
    for (struct plan *p = g_plans; p; p = p->next)
      if (!p->comm->blocking) set_async(p->comm, ret, msg);
    plans_free();
    while (jobs) {
      struct job *j = jobs;
      jobs = j->next;
      set_async(j->kind == JOB_SPLIT && j->child ? j->child : j->comm, ret, msg);
      if (j->kind == JOB_SPLIT && !j->comm->blocking) set_async(j->comm, ret, msg);
      job_free(j);
    }
    return ret;
  }
  /* Finalize, abort and destroy run here, before any init or launch
   * (groupLaunch runs the async jobs first, group.cc:537): the abort flags
   * were all set at the calls, so a group of aborts frees nothing before
   * every kernel of those communicators has stopped. */
  for (struct job **pp = &jobs; *pp;) {
    struct job *j = *pp;
    if (j->kind < JOB_FINALIZE) {
      pp = &j->next;
      continue;
    }
    *pp = j->next;
    run_reclaim(j);
    job_free(j);
  }
  /* Init and split run in threads, as NCCL's async jobs. */
  for (struct job *j = jobs; j; j = j->next) {
    if (nonblocking) {
      atomic_store(&j->comm->async, ncclInProgress);
      pthread_mutex_lock(&j->comm->mu);
      /* A previous job of this communicator (its init, or an earlier
       * split of it) has published its result, which the caller saw, but
       * may not have been collected yet: job_main sets `done` just after
       * the result, so ncclCommGetAsyncError can report success first.
       * Collect it here rather than lose it (LSan found the leak). */
      struct job *old = j->comm->job;
      j->comm->job = j;
      pthread_mutex_unlock(&j->comm->mu);
      if (old) job_free(old);
    }
    if (pthread_create(&j->thread, NULL, job_main, j) != 0)
      dbl_fatal("nccl double: pthread_create for a communicator job: %s", strerror(errno));
    j->started = 1;
  }
  if (!nonblocking) {
    while (jobs) {
      struct job *j = jobs;
      jobs = j->next;
      job_join(j);
      if (ret == ncclSuccess && j->result != ncclSuccess) {
        ret = j->result;
        show_async_msg(j->kind == JOB_SPLIT && j->child ? j->child : j->comm);
        if (j->kind == JOB_SPLIT && !j->child) show_async_msg(j->comm);
      }
      job_free(j);
    }
  }
  for (struct plan *p = g_plans; p; p = p->next) {
    ncclResult_t r = launch_plan(p);
    if (r != ncclSuccess) {
      if (ret == ncclSuccess) ret = r;
      if (!p->comm->blocking) set_async(p->comm, r, tl_last_error);
    } else if (!p->comm->blocking) {
      int cur = ncclSuccess;
      if (atomic_compare_exchange_strong(&p->comm->async, &cur, ncclInProgress))
        atomic_store(&p->comm->launch_pending, 1);
    }
  }
  plans_free();
  if (nonblocking && ret == ncclSuccess) ret = ncclInProgress;
  return ret;
}
