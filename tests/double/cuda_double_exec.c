/* The CUDA half of the test double (cuda_double.c): streams, their items
 * and executor threads, the ordering rules of submission, host waits and
 * the hang reports. */

#include "cuda_double_internal.h"

/* ------------------------------------------------------------------ */
/* Streams, items and devices: the data                               */
/* ------------------------------------------------------------------ */

pthread_mutex_t G = PTHREAD_MUTEX_INITIALIZER;
static struct ddev dev[MAX_DEVICES];
static struct dstream **stab; /* every stream ever made: handles stay checkable */
static int nstab, capstab;
struct devent *etab;
int netab;
int capetab;
int efree_head = -1;
int *efree_next;

cudaStream_t stream_handle(const struct dstream *s) {
  return (cudaStream_t)(STREAM_BASE + (uintptr_t)s->idx * 64);
}

cudaEvent_t event_handle(int idx) {
  uint64_t g = etab[idx].gen & 0xfffffu;
  return (cudaEvent_t)(EVENT_BASE + ((g << 24 | (uint64_t)idx) << 4));
}

/* ------------------------------------------------------------------ */
/* Waiting                                                             */
/* ------------------------------------------------------------------ */

static void wake_all(struct waiter *w) {
  for (; w; w = w->next) pthread_cond_signal(w->cv);
}

/* Sleep on cv (G held) until signalled through *list or, with deadline >
 * 0, until then.  Returns 0, or ETIMEDOUT. */
static int wait_on(struct waiter **list, pthread_cond_t *cv, double deadline) {
  struct waiter me = {cv, *list};
  *list = &me;
  int rc = 0;
  if (deadline > 0) {
    struct timespec ts;
    ts.tv_sec = (time_t)deadline;
    ts.tv_nsec = (long)((deadline - (double)ts.tv_sec) * 1e9);
    rc = pthread_cond_timedwait(cv, &G, &ts);
  } else {
    pthread_cond_wait(cv, &G);
  }
  for (struct waiter **p = list; *p; p = &(*p)->next)
    if (*p == &me) {
      *p = me.next;
      break;
    }
  return rc;
}

/* ------------------------------------------------------------------ */
/* Devices and streams: creation                                       */
/* ------------------------------------------------------------------ */

struct dstream *stream_new(int device, enum skind kind, unsigned flags) {
  if (nstab == capstab) {
    int cap = capstab ? 2 * capstab : 64;
    struct dstream **t = realloc(stab, (size_t)cap * sizeof *t);
    if (!t) return NULL;
    stab = t;
    capstab = cap;
  }
  struct dstream *s = calloc(1, sizeof *s);
  if (!s) return NULL;
  s->idx = nstab;
  s->device = device;
  s->kind = kind;
  s->flags = flags;
  s->blocking = !(flags & cudaStreamNonBlocking);
  s->rng = (cfg.seed * 0x9e3779b97f4a7c15ull) ^ ((uint64_t)(s->idx + 1) * 0xd1b54a32d192ed03ull);
  if (!s->rng) s->rng = 1;
  cond_init_monotonic(&s->cv);
  if (kind == S_LEGACY) snprintf(s->name, sizeof s->name, "legacy default stream");
  else if (kind == S_PER_THREAD) snprintf(s->name, sizeof s->name, "per-thread stream #%d", s->idx);
  else snprintf(s->name, sizeof s->name, "stream #%d%s", s->idx, s->blocking ? "" : " (non-blocking)");
  s->dev_next = dev[device].streams;
  dev[device].streams = s;
  s->on_dev_list = 1;
  stab[nstab++] = s;
  return s;
}

void dev_unlink(struct dstream *s) {
  if (!s->on_dev_list) return;
  for (struct dstream **p = &dev[s->device].streams; *p; p = &(*p)->dev_next)
    if (*p == s) {
      *p = s->dev_next;
      break;
    }
  s->on_dev_list = 0;
}

/* The device's state, made at its first use (G held). */
struct ddev *dev_get(int d) {
  struct ddev *v = &dev[d];
  if (!v->used) {
    v->used = 1;
    v->legacy = stream_new(d, S_LEGACY, cudaStreamDefault);
    if (!v->legacy) dbl_fatal("out of memory making device %d's legacy stream", d);
  }
  return v;
}

/* Strict mode is read when the device runs its first kernel item: NCCL
 * reads NCCL_LAUNCH_ORDER_IMPLICIT at its first launch (NCCL_PARAM caches
 * it, src/enqueue.cc:1538), which may come after other CUDA calls on the
 * device. */
static int dev_strict(struct ddev *v) {
  if (!v->strict_read) {
    const char *e = getenv("NCCL_LAUNCH_ORDER_IMPLICIT");
    v->strict = e && !strcmp(e, "1");
    v->strict_read = 1;
  }
  return v->strict;
}

void ptds_release(void *arg);
static pthread_key_t ptds_key;
static pthread_once_t ptds_once = PTHREAD_ONCE_INIT;
static void ptds_key_make(void) { pthread_key_create(&ptds_key, ptds_release); }

/* The calling thread's per-thread default stream on device d (G held). */
static struct dstream *ptds_get(int d) {
  if (!tl_ptds) {
    pthread_once(&ptds_once, ptds_key_make);
    tl_ptds = calloc(MAX_DEVICES, sizeof *tl_ptds);
    if (!tl_ptds) return NULL;
    pthread_setspecific(ptds_key, tl_ptds);
  }
  if (!tl_ptds[d]) tl_ptds[d] = stream_new(d, S_PER_THREAD, cudaStreamDefault);
  return tl_ptds[d];
}

/* A handle -> its stream (G held).  0 and cudaStreamLegacy are the
 * current device's legacy default stream; cudaStreamPerThread the calling
 * thread's per-thread default stream on the current device
 * ([STREAM-SYNC], "Default stream"). */
cudaError_t stream_resolve(cudaStream_t h, struct dstream **out) {
  int d;
  cudaError_t e = current_device(&d);
  if (e) return e;
  uintptr_t v = (uintptr_t)h;
  if (!h || h == cudaStreamLegacy) {
    *out = dev_get(d)->legacy;
    return cudaSuccess;
  }
  if (h == cudaStreamPerThread) {
    dev_get(d);
    *out = ptds_get(d);
    return *out ? cudaSuccess : cudaErrorMemoryAllocation;
  }
  if (v < STREAM_BASE || (v - STREAM_BASE) % 64) return cudaErrorInvalidResourceHandle;
  uintptr_t idx = (v - STREAM_BASE) / 64;
  if (idx >= (uintptr_t)nstab || stab[idx]->destroyed || stab[idx]->kind != S_USER)
    return cudaErrorInvalidResourceHandle;
  *out = stab[idx];
  return cudaSuccess;
}

/* ------------------------------------------------------------------ */
/* Executors                                                           */
/* ------------------------------------------------------------------ */

static uint64_t rng_next(uint64_t *s) { /* xorshift64* */
  uint64_t x = *s;
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  *s = x;
  return x * 0x2545f4914f6cdd1dull;
}

/* Late on purpose: real streams start work at some later time, and a
 * program that forgot an ordering must see wrong values here too. */
static void be_late(struct dstream *s) {
  if (!cfg.late_us) return;
  unsigned us = (unsigned)(rng_next(&s->rng) % (cfg.late_us + 1u));
  if (!us) return;
  atomic_fetch_add(&st_late, 1);
  struct timespec ts = {0, (long)us * 1000};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

/* The first dependency of `it` not yet met, or NULL (G held). */
static const struct dep *unmet(const struct item *it) {
  for (int i = 0; i < it->ndeps; i++)
    if (it->deps[i].s->completed < it->deps[i].seq) return &it->deps[i];
  return NULL;
}

/* Wait (G held) until the head item may run; 0 when the stream is to end. */
static struct item *next_item(struct dstream *s) {
  for (;;) {
    struct item *it = s->head;
    if (!it) {
      if (s->destroyed) return NULL;
      pthread_cond_wait(&s->cv, &G);
      continue;
    }
    const struct dep *d = unmet(it);
    if (d) {
      wait_on(&d->s->waiters, &s->cv, 0);
      continue;
    }
    struct ddev *v = &dev[s->device];
    if (it->has_ticket && v->serving != it->ticket) {
      wait_on(&v->ticket_waiters, &s->cv, 0);
      continue;
    }
    return it;
  }
}

static void finish_item(struct dstream *s, struct item *it) {
  s->head = it->next;
  if (!s->head) s->tail = NULL;
  s->completed = it->seq;
  s->running = 0;
  if (it->has_ticket) {
    dev[s->device].serving++;
    wake_all(dev[s->device].ticket_waiters);
  }
  if (it->kernel) atomic_fetch_add(&st_kernels, 1);
  wake_all(s->waiters);
  free(it);
}

static void *executor(void *arg) {
  struct dstream *s = arg;
  tl_executor = s;
  tl_device = s->device;
  pthread_mutex_lock(&G);
  struct item *it;
  while ((it = next_item(s)) != NULL) {
    s->running = 1;
    s->running_since = dbl_now();
    int late = it->late;
    pthread_mutex_unlock(&G);
    if (late) be_late(s);
    it->run(it->arg);
    pthread_mutex_lock(&G);
    finish_item(s, it);
  }
  /* Destroyed and drained: cudaStreamDestroy returned at once and the
   * stream's resources go now (cudaStreamDestroy docs). */
  if (s->exit_mode == EXIT_DETACH) {
    dev_unlink(s);
    pthread_detach(pthread_self());
  }
  pthread_mutex_unlock(&G);
  return NULL;
}

static int stream_start(struct dstream *s) {
  if (s->started) return 0;
  pthread_attr_t a;
  pthread_attr_init(&a);
  pthread_attr_setstacksize(&a, 1 << 20);
  int rc = pthread_create(&s->thread, &a, executor, s);
  pthread_attr_destroy(&a);
  if (rc == 0) s->started = 1;
  return rc;
}

/* ------------------------------------------------------------------ */
/* Submission: the ordering rules                                      */
/* ------------------------------------------------------------------ */

void noop(void *arg) { (void)arg; }

/* The implicit dependencies of new work on s ([STREAM-SYNC], "Legacy
 * default stream"): an action in the legacy stream first waits for all
 * earlier work of every blocking stream of its device, and later work of
 * every blocking stream waits for it; streams made with
 * cudaStreamNonBlocking are ordered with neither.  The per-thread default
 * stream is not non-blocking and so synchronises with the legacy stream
 * like a blocking stream ([STREAM-SYNC], "Per-thread default stream").
 * Writes at most `room` deps; returns how many it needs. */
static int implicit_deps(const struct dstream *s, struct dep *out, int room) {
  int n = 0;
  struct ddev *v = &dev[s->device];
  if (s->kind == S_LEGACY) {
    for (struct dstream *t = v->streams; t; t = t->dev_next)
      if (t != s && t->blocking && t->completed < t->submitted) {
        if (n < room) out[n] = (struct dep){t, t->submitted};
        n++;
      }
  } else if (s->blocking) {
    struct dstream *l = v->legacy;
    if (l->completed < l->submitted) {
      if (n < room) out[n] = (struct dep){l, l->submitted};
      n++;
    }
  }
  return n;
}

/* Queue one item on s (G held) with the implicit dependencies, `extra`
 * (NULL or one more, cudaStreamWaitEvent's) and, for a kernel in strict
 * mode, a device-wide turn taken now, at submission ([NCCL], see
 * dbl_stream_submit).  *seq gets its place in the stream. */
cudaError_t submit_locked(struct dstream *s, const char *what, int kernel, int late,
                          void (*run)(void *), void *arg, const struct dep *extra,
                          uint64_t *seq) {
  int n = implicit_deps(s, NULL, 0) + (extra ? 1 : 0);
  struct item *it = calloc(1, sizeof *it + (size_t)n * sizeof(struct dep));
  if (!it) return cudaErrorMemoryAllocation;
  it->ndeps = implicit_deps(s, it->deps, n);
  if (extra) it->deps[it->ndeps++] = *extra;
  snprintf(it->what, sizeof it->what, "%s", what ? what : "?");
  it->run = run;
  it->arg = arg;
  it->kernel = kernel;
  it->late = late;
  it->since = dbl_now();
  struct ddev *v = &dev[s->device];
  if (kernel && dev_strict(v)) {
    it->has_ticket = 1;
    it->ticket = v->next_ticket++;
  }
  if (stream_start(s) != 0) {
    if (it->has_ticket) v->next_ticket--;
    free(it);
    return cudaErrorMemoryAllocation;
  }
  it->seq = ++s->submitted;
  if (s->tail) s->tail->next = it;
  else s->head = it;
  s->tail = it;
  pthread_cond_signal(&s->cv);
  if (seq) *seq = it->seq;
  return cudaSuccess;
}

/* Strict mode (kernel items): NCCL's user guide, "Using multiple NCCL
 * communicators concurrently", and its NCCL_LAUNCH_ORDER_IMPLICIT variable
 * (NCCL >= 2.26): with it set to 1, NCCL orders the kernels of one device by
 * the host program order of their launches.  The double takes the turn at
 * submission and runs kernel items one at a time in that order. */
cudaError_t dbl_stream_submit(cudaStream_t stream, const char *what, int kernel,
                              void (*run)(void *arg), void *arg) {
  cfg_init();
  pthread_mutex_lock(&G);
  struct dstream *s;
  cudaError_t e = stream_resolve(stream, &s);
  if (!e) e = submit_locked(s, what, kernel, 1, run, arg, NULL, NULL);
  pthread_mutex_unlock(&G);
  return e;
}

int dbl_stream_device(cudaStream_t stream) {
  cfg_init();
  pthread_mutex_lock(&G);
  struct dstream *s;
  int d = stream_resolve(stream, &s) ? -1 : s->device;
  pthread_mutex_unlock(&G);
  return d;
}

/* ------------------------------------------------------------------ */
/* Reports of unfinished work, host waits, hang detection              */
/* ------------------------------------------------------------------ */

static void append(char *buf, size_t len, size_t *at, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void append(char *buf, size_t len, size_t *at, const char *fmt, ...) {
  if (*at + 1 >= len) return;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf + *at, len - *at, fmt, ap);
  va_end(ap);
  if (n > 0) *at += (size_t)n;
  if (*at >= len) *at = len - 1;
}

/* What the head item of s is doing (G held). */
static void describe_stream(const struct dstream *s, double now, char *buf, size_t len,
                            size_t *at) {
  const struct item *it = s->head;
  int queued = 0;
  for (const struct item *q = it; q; q = q->next) queued++;
  append(buf, len, at, "stream %s: %s (", s->name, it->what);
  const struct dep *d;
  const struct ddev *v = &dev[s->device];
  if (s->running)
    append(buf, len, at, "running %.1f s", now - s->running_since);
  else if ((d = unmet(it)) != NULL)
    append(buf, len, at, "waiting %.1f s for %s of device %d to finish its item %llu, "
           "now at %llu", now - it->since, d->s->name, d->s->device,
           (unsigned long long)d->seq, (unsigned long long)d->s->completed);
  else if (it->has_ticket && v->serving != it->ticket)
    append(buf, len, at, "waiting %.1f s for its kernel turn %llu, the device serves %llu",
           now - it->since, (unsigned long long)it->ticket, (unsigned long long)v->serving);
  else
    append(buf, len, at, "about to start");
  append(buf, len, at, ")%s", queued > 1 ? "" : "; ");
  if (queued > 1) append(buf, len, at, " and %d more queued; ", queued - 1);
}

static void describe_locked(int device, char *buf, size_t len) {
  size_t at = 0;
  double now = dbl_now();
  buf[0] = '\0';
  if (device < 0 || device >= MAX_DEVICES) return;
  for (const struct dstream *s = dev[device].streams; s; s = s->dev_next)
    if (s->head) describe_stream(s, now, buf, len, &at);
  if (!at) append(buf, len, &at, "no unfinished work");
}

void dbl_device_describe(int device, char *buf, size_t len) {
  if (!len) return;
  pthread_mutex_lock(&G);
  describe_locked(device, buf, len);
  pthread_mutex_unlock(&G);
}

/* The hang report (G held; does not return). */
static void hang(const char *why, int device, const struct dep *d) {
  static char text[6000];
  describe_locked(device, text, sizeof text);
  char other[3000] = "";
  if (d && d->s->device != device) describe_locked(d->s->device, other, sizeof other);
  pthread_mutex_unlock(&G);
  dbl_fatal("%s waited %.0f s (MESHPG_DOUBLE_HANG_S) for work of device %d that never "
            "finished: it would hang forever on a real GPU.  Device %d: %s%s%s", why,
            cfg.hang_s, d ? d->s->device : device, device, text,
            other[0] ? " Device of the awaited stream: " : "", other);
}

/* Block the host (G held) until every dep is met, or report a hang: a
 * wait of MESHPG_DOUBLE_HANG_S during which no device work of this
 * process progressed (dbl_note_progress).  Work that still moves data is
 * slow (a sanitizer, an oversubscribed machine), and its wait goes on. */
static void host_wait_deps(const struct dep *deps, int n, const char *why, int device) {
  double deadline = dbl_now() + cfg.hang_s;
  uint64_t seen = atomic_load_explicit(&st_progress, memory_order_relaxed);
  pthread_cond_t *cv = my_cv();
  for (int i = 0; i < n; i++)
    while (deps[i].s->completed < deps[i].seq)
      if (wait_on(&deps[i].s->waiters, cv, deadline) == ETIMEDOUT &&
          deps[i].s->completed < deps[i].seq) {
        uint64_t now_seen = atomic_load_explicit(&st_progress, memory_order_relaxed);
        if (now_seen == seen) hang(why, device, &deps[i]);
        seen = now_seen;
        deadline = dbl_now() + cfg.hang_s;
      }
}

void host_wait(struct dstream *s, uint64_t seq, const char *why) {
  struct dep d = {s, seq};
  host_wait_deps(&d, 1, why, s->device);
}

/* Device-wide wait (G held): every stream of the device, the legacy and
 * per-thread ones and other threads' and communicators' streams included,
 * runs all the work queued so far. */
static void device_wait_locked(int device, const char *why) {
  atomic_fetch_add(&st_waits, 1);
  int n = 0;
  for (struct dstream *s = dev[device].streams; s; s = s->dev_next) n++;
  struct dep *deps = calloc((size_t)n + 1, sizeof *deps);
  if (!deps) dbl_fatal("%s: out of memory", why);
  int k = 0;
  for (struct dstream *s = dev[device].streams; s; s = s->dev_next)
    if (s->completed < s->submitted) deps[k++] = (struct dep){s, s->submitted};
  host_wait_deps(deps, k, why, device);
  free(deps);
}

void dbl_device_wait(int device, const char *why) {
  cfg_init();
  if (device < 0 || device >= cfg.nvis)
    dbl_fatal("dbl_device_wait(%d, %s): no such device (%d visible)", device, why, cfg.nvis);
  if (tl_executor) dbl_fatal("%s: a device-wide wait from a stream's own work would never end", why);
  pthread_mutex_lock(&G);
  dev_get(device);
  device_wait_locked(device, why);
  pthread_mutex_unlock(&G);
}

/* Queue on s (G held) and block the host until it ran. */
cudaError_t submit_and_wait(struct dstream *s, const char *what, void (*run)(void *),
                            void *arg, const char *why) {
  uint64_t seq;
  cudaError_t e = submit_locked(s, what, 0, 1, run, arg, NULL, &seq);
  if (!e) host_wait(s, seq, why);
  return e;
}
