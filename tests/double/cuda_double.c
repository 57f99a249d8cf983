/* The CUDA runtime half of the CUDA/NCCL test double (see double.h): the
 * cuda* functions meshpg's NCCL backend, its tests and nccl_double.c call,
 * defined here with NVIDIA's own signatures (cuda_runtime_api.h, CUDA 13)
 * so that the real backend code runs, multi-rank, on a machine without a
 * GPU.  The PTX kernels' CPU twins and cudaLibrary* / cudaLaunchKernel are
 * in cuda_twins.c, a client of the same contract.
 *
 * What is modelled, and why it is strict:
 *   - devices: MESHPG_DOUBLE_DEVICES of them (default 8), seen through
 *     CUDA_VISIBLE_DEVICES like the real runtime; the current device is per
 *     host thread;
 *   - device memory: every allocation is registered; freed memory is
 *     poisoned (0xDB) and kept reserved in a bounded quarantine so that a
 *     use after free is recognised; new memory is filled with 0xCA, as real
 *     device memory holds garbage;
 *   - streams: one executor thread each (created with the first work), late
 *     on purpose (a random 0..MESHPG_DOUBLE_LATE_US us before each item) so
 *     that missing synchronisation shows as wrong values, ordered by the
 *     legacy default stream rules, events and cudaStreamWaitEvent;
 *   - which calls return before their work lands, per the CUDA docs (cited
 *     at each rule); where the real GPU would hang the double reports after
 *     MESHPG_DOUBLE_HANG_S seconds, where it would corrupt or fault it
 *     aborts at once (dbl_fatal).
 *
 * Locks.  `G` guards every stream, event and device; `M` guards the memory
 * registry; a thread may take M while holding G, never G while holding M.
 * Work items run with neither held.  Waits use one condition variable per
 * waiting thread, registered on what it waits for, so a completion wakes
 * only the threads that wait for it.
 *
 * Citations.  [API-SYNC] is the CUDA Runtime API section "API
 * synchronization behavior" (docs.nvidia.com/cuda/cuda-runtime-api/
 * api-sync-behavior.html); [STREAM-SYNC] its section "Stream
 * synchronization behavior" (stream-sync-behavior.html); [IMPLICIT] the
 * CUDA C++ Programming Guide, "Asynchronous Concurrent Execution", "Streams",
 * "Implicit Synchronization"; "cudaX docs" is that function's reference
 * text (as in cuda_runtime_api.h of CUDA 13).  "Seen on an H100" marks
 * behaviour measured with CUDA 13 on an H100 when this file was written. */
#include "double.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_DEVICES 64
#define POISON_FREED 0xDB
#define FILL_NEW 0xCA
#define ALLOC_ALIGN 256 /* cudaMalloc's alignment guarantee */

/* ------------------------------------------------------------------ */
/* Configuration (read once per process)                               */
/* ------------------------------------------------------------------ */

static struct {
  int ndev;                 /* MESHPG_DOUBLE_DEVICES: the "node" */
  int nvis;                 /* devices this process sees */
  int phys[MAX_DEVICES];    /* visible ordinal -> physical device */
  cudaError_t init_error;   /* what every device call answers when nvis == 0 */
  unsigned late_us;         /* MESHPG_DOUBLE_LATE_US */
  uint64_t seed;            /* MESHPG_DOUBLE_SEED */
  double hang_s;            /* MESHPG_DOUBLE_HANG_S */
  size_t quarantine;        /* bytes of freed memory kept reserved */
  int log;                  /* MESHPG_DOUBLE_LOG=1 */
} cfg;
static pthread_once_t cfg_once = PTHREAD_ONCE_INIT;

static long env_long(const char *name, long dflt, long lo, long hi) {
  const char *v = getenv(name);
  if (!v || !*v) return dflt;
  char *end;
  errno = 0;
  long x = strtol(v, &end, 10);
  if (errno || *end || x < lo || x > hi) {
    fprintf(stderr, "meshpg double: %s=\"%s\" is not an integer in %ld..%ld\n", name, v, lo, hi);
    abort();
  }
  return x;
}

/* CUDA_VISIBLE_DEVICES as the runtime reads it (seen on an H100): decimal
 * indices, the list ending at the first entry that is not one or is past
 * the last device; "" or no usable entry is cudaErrorNoDevice; a repeated
 * index makes the whole list invalid (cudaErrorInvalidDevice). */
static void read_visible(void) {
  const char *v = getenv("CUDA_VISIBLE_DEVICES");
  cfg.init_error = cudaSuccess;
  if (!v) {
    cfg.nvis = cfg.ndev;
    for (int i = 0; i < cfg.ndev; i++) cfg.phys[i] = i;
    return;
  }
  cfg.nvis = 0;
  const char *p = v;
  while (*p) {
    char *end;
    errno = 0;
    long x = strtol(p, &end, 10);
    if (end == p || errno || (*end && *end != ',') || x < 0 || x >= cfg.ndev) break;
    for (int i = 0; i < cfg.nvis; i++)
      if (cfg.phys[i] == x) {
        cfg.nvis = 0;
        cfg.init_error = cudaErrorInvalidDevice;
        return;
      }
    cfg.phys[cfg.nvis++] = (int)x;
    p = *end ? end + 1 : end;
  }
  if (cfg.nvis == 0) cfg.init_error = cudaErrorNoDevice;
}

static void cfg_read(void) {
  cfg.ndev = (int)env_long("MESHPG_DOUBLE_DEVICES", 8, 1, MAX_DEVICES);
  cfg.late_us = (unsigned)env_long("MESHPG_DOUBLE_LATE_US", 300, 0, 1000000);
  cfg.seed = (uint64_t)env_long("MESHPG_DOUBLE_SEED", 1, 0, 0x7fffffffL);
  cfg.hang_s = (double)env_long("MESHPG_DOUBLE_HANG_S", 20, 1, 86400);
  cfg.quarantine = (size_t)env_long("MESHPG_DOUBLE_QUARANTINE_MB", 256, 0, 1 << 20) << 20;
  cfg.log = getenv("MESHPG_DOUBLE_LOG") && !strcmp(getenv("MESHPG_DOUBLE_LOG"), "1");
  read_visible();
}

static void cfg_init(void) { pthread_once(&cfg_once, cfg_read); }

/* ------------------------------------------------------------------ */
/* Per-thread state                                                    */
/* ------------------------------------------------------------------ */

struct dstream;

static _Thread_local int tl_device;           /* cudaSetDevice's, default 0 */
static _Thread_local cudaError_t tl_error;     /* cudaGetLastError's */
static _Thread_local int tl_rank = -1;         /* dbl_set_world_rank's */
static _Thread_local struct dstream *tl_executor; /* set on executor threads */
static _Thread_local struct dstream **tl_ptds;    /* per-thread streams by device */
static _Thread_local pthread_cond_t tl_cv;     /* this thread's host waits */
static _Thread_local int tl_cv_ready;

/* The runtime keeps the last error per host thread and cudaGetLastError
 * returns and clears it (cudaGetLastError / cudaPeekAtLastError docs).
 * cudaErrorNotReady is a status, not an error, and is not kept. */
static cudaError_t ret(cudaError_t e) {
  if (e != cudaSuccess && e != cudaErrorNotReady) tl_error = e;
  return e;
}

cudaError_t dbl_cuda_error(cudaError_t e) { return ret(e); }

static void cond_init_monotonic(pthread_cond_t *cv) {
  pthread_condattr_t a;
  pthread_condattr_init(&a);
  pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
  pthread_cond_init(cv, &a);
  pthread_condattr_destroy(&a);
}

static pthread_cond_t *my_cv(void) {
  if (!tl_cv_ready) {
    cond_init_monotonic(&tl_cv);
    tl_cv_ready = 1;
  }
  return &tl_cv;
}

/* ------------------------------------------------------------------ */
/* Reports                                                             */
/* ------------------------------------------------------------------ */

double dbl_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void dbl_fatal(const char *fmt, ...) {
  char msg[8192];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  fprintf(stderr, "meshpg double: [pid %d, device %d%s] %s\n", (int)getpid(), tl_device,
          tl_executor ? ", stream executor" : "", msg);
  fflush(stderr);
  abort();
}

void dbl_log(const char *fmt, ...) {
  cfg_init();
  if (!cfg.log) return;
  char msg[4096];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  fprintf(stderr, "meshpg double: [pid %d, device %d] %s\n", (int)getpid(), tl_device, msg);
}

/* Every cuda* entry point that touches devices, streams or memory starts
 * here: the cudaLaunchHostFunc docs forbid CUDA calls from a host function,
 * and the double's device work runs on the same executor threads. */
void dbl_cuda_enter(const char *api) {
  cfg_init();
  if (tl_executor)
    dbl_fatal("%s called from a stream's work (a host function or device work): CUDA "
              "calls are not allowed there (cudaLaunchHostFunc docs) and would deadlock",
              api);
}

/* ------------------------------------------------------------------ */
/* Statistics and world rank                                           */
/* ------------------------------------------------------------------ */

static atomic_uint_least64_t st_kernels, st_collectives, st_late, st_waits;

void dbl_stats(dbl_stats_t *out) {
  out->kernels = atomic_load(&st_kernels);
  out->collectives = atomic_load(&st_collectives);
  out->late_items = atomic_load(&st_late);
  out->device_waits = atomic_load(&st_waits);
}

void dbl_count_collective(void) { atomic_fetch_add(&st_collectives, 1); }

/* Progress of device work in this process (double.h). */
static _Atomic uint64_t st_progress;
void dbl_note_progress(void) { atomic_fetch_add_explicit(&st_progress, 1, memory_order_relaxed); }

/* The rank is per thread (ranks may be threads of one process); a thread
 * that never set one gets the process's rank when every setter agreed on
 * one, else MESHPG_DOUBLE_RANK, else -1. */
static atomic_int proc_rank = -1;
static atomic_int proc_rank_mixed;

void dbl_set_world_rank(int rank) {
  tl_rank = rank;
  int expect = -1;
  if (!atomic_compare_exchange_strong(&proc_rank, &expect, rank) && expect != rank)
    atomic_store(&proc_rank_mixed, 1);
}

int dbl_world_rank(void) {
  if (tl_rank >= 0) return tl_rank;
  int p = atomic_load(&proc_rank);
  if (p >= 0 && !atomic_load(&proc_rank_mixed)) return p;
  const char *v = getenv("MESHPG_DOUBLE_RANK");
  return v && *v ? atoi(v) : -1;
}

/* ------------------------------------------------------------------ */
/* Devices                                                             */
/* ------------------------------------------------------------------ */

int dbl_device_count(void) {
  cfg_init();
  return cfg.nvis;
}

int dbl_device_current(void) { return tl_device; }

/* Ordinal d of this process -> "0000:XX:00.0" with XX = 0x10 + the
 * physical device, so that two processes seeing one GPU through different
 * CUDA_VISIBLE_DEVICES agree on its bus id, as on a real node. */
void dbl_device_busid(int device, char *buf, size_t len) {
  cfg_init();
  int phys = device >= 0 && device < cfg.nvis ? cfg.phys[device] : device;
  snprintf(buf, len, "0000:%02x:00.0", 0x10 + phys);
}

uint64_t dbl_host_hash(void) {
  char name[256] = "";
  const char *id = getenv("NCCL_HOSTID");
  if (id && *id) snprintf(name, sizeof name, "%s", id);
  else if (gethostname(name, sizeof name - 1) != 0) snprintf(name, sizeof name, "unknown");
  uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
  for (const unsigned char *p = (const unsigned char *)name; *p; p++)
    h = (h ^ *p) * 0x100000001b3ull;
  return h;
}

/* The calling thread's device, or the error a device call answers. */
static cudaError_t current_device(int *d) {
  cfg_init();
  *d = 0;
  if (cfg.nvis == 0) return cfg.init_error;
  *d = tl_device < cfg.nvis ? tl_device : 0;
  return cudaSuccess;
}

/* ------------------------------------------------------------------ */
/* Streams, items and devices: the data                               */
/* ------------------------------------------------------------------ */

/* One thread waiting (its condition variable), linked on what it waits
 * for: a stream's completions or a device's kernel turns. */
struct waiter {
  pthread_cond_t *cv;
  struct waiter *next;
};

struct dep {
  struct dstream *s;
  uint64_t seq; /* wait until s->completed >= seq */
};

struct item {
  struct item *next;
  uint64_t seq;
  void (*run)(void *);
  void *arg;
  char what[160];
  int kernel, late, has_ticket;
  uint64_t ticket;
  double since; /* submitted */
  int ndeps;
  struct dep deps[];
};

enum skind { S_USER, S_LEGACY, S_PER_THREAD };
enum exit_mode { EXIT_NONE, EXIT_JOIN, EXIT_DETACH };

struct dstream {
  int idx, device;
  enum skind kind;
  int blocking;          /* synchronises with the legacy stream */
  unsigned flags;        /* cudaStreamCreateWithFlags's */
  uint64_t submitted;    /* seq of the last item queued */
  uint64_t completed;    /* seq of the last item finished (in order) */
  struct item *head, *tail;
  int running;           /* head is running */
  double running_since;
  int destroyed, started;
  enum exit_mode exit_mode;
  pthread_t thread;
  pthread_cond_t cv;     /* the executor's */
  struct waiter *waiters;
  struct dstream *dev_next; /* on its device's list while it may hold work */
  int on_dev_list;
  uint64_t rng;          /* the executor's lateness */
  char name[48];
};

struct ddev {
  int used, strict, strict_read;
  struct dstream *legacy;
  struct dstream *streams;      /* every stream that may hold work */
  uint64_t next_ticket, serving; /* strict mode's kernel turns */
  struct waiter *ticket_waiters;
};

struct devent {
  uint32_t gen;
  int live, device, recorded;
  unsigned flags;
  struct dstream *stream;
  uint64_t seq;
};

static pthread_mutex_t G = PTHREAD_MUTEX_INITIALIZER;
static struct ddev dev[MAX_DEVICES];
static struct dstream **stab; /* every stream ever made: handles stay checkable */
static int nstab, capstab;
static struct devent *etab;
static int netab, capetab, efree_head = -1;
static int *efree_next;

/* Handles are not pointers: a handle that is not ours, or stale, is
 * recognised without being dereferenced. */
#define STREAM_BASE ((uintptr_t)0x5d0000000000ull)
#define EVENT_BASE ((uintptr_t)0x5e0000000000ull)

static cudaStream_t stream_handle(const struct dstream *s) {
  return (cudaStream_t)(STREAM_BASE + (uintptr_t)s->idx * 64);
}

static cudaEvent_t event_handle(int idx) {
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

static struct dstream *stream_new(int device, enum skind kind, unsigned flags) {
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

static void dev_unlink(struct dstream *s) {
  if (!s->on_dev_list) return;
  for (struct dstream **p = &dev[s->device].streams; *p; p = &(*p)->dev_next)
    if (*p == s) {
      *p = s->dev_next;
      break;
    }
  s->on_dev_list = 0;
}

/* The device's state, made at its first use (G held). */
static struct ddev *dev_get(int d) {
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

static void ptds_release(void *arg);
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
static cudaError_t stream_resolve(cudaStream_t h, struct dstream **out) {
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

static void noop(void *arg) { (void)arg; }

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
static cudaError_t submit_locked(struct dstream *s, const char *what, int kernel, int late,
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

static void host_wait(struct dstream *s, uint64_t seq, const char *why) {
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
static cudaError_t submit_and_wait(struct dstream *s, const char *what, void (*run)(void *),
                                   void *arg, const char *why) {
  uint64_t seq;
  cudaError_t e = submit_locked(s, what, 0, 1, run, arg, NULL, &seq);
  if (!e) host_wait(s, seq, why);
  return e;
}

/* ------------------------------------------------------------------ */
/* Device memory registry                                              */
/* ------------------------------------------------------------------ */

struct alloc {
  uintptr_t base;
  size_t size;          /* as asked */
  size_t cap;           /* reserved: rounded up, plus a guard */
  int device;           /* pinned host memory: the device current at its allocation */
  int pinned;           /* cudaMallocHost / cudaHostAlloc */
  int async;            /* from cudaMallocAsync */
  int freed, free_queued;
  double freed_at;
  struct alloc *qnext;  /* quarantine, oldest first */
};

static pthread_mutex_t M = PTHREAD_MUTEX_INITIALIZER;
static struct alloc **mtab; /* sorted by base */
static size_t nmtab, capmtab;
static struct alloc *q_head, *q_tail;
static size_t q_bytes;

/* Index of the last allocation with base <= p, or -1 (M held). */
static long mem_floor(uintptr_t p) {
  size_t lo = 0, hi = nmtab;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (mtab[mid]->base <= p) lo = mid + 1;
    else hi = mid;
  }
  return (long)lo - 1;
}

/* The allocation whose reserved range holds p, or NULL (M held). */
static struct alloc *mem_at(const void *p) {
  long i = mem_floor((uintptr_t)p);
  if (i < 0) return NULL;
  struct alloc *a = mtab[i];
  return (uintptr_t)p < a->base + a->cap ? a : NULL;
}

static int mem_insert(struct alloc *a) {
  if (nmtab == capmtab) {
    size_t cap = capmtab ? 2 * capmtab : 256;
    struct alloc **t = realloc(mtab, cap * sizeof *t);
    if (!t) return -1;
    mtab = t;
    capmtab = cap;
  }
  size_t at = (size_t)(mem_floor(a->base) + 1);
  memmove(mtab + at + 1, mtab + at, (nmtab - at) * sizeof *mtab);
  mtab[at] = a;
  nmtab++;
  return 0;
}

static void mem_remove(struct alloc *a) {
  long i = mem_floor(a->base);
  if (i < 0 || mtab[i] != a) dbl_fatal("memory registry corrupt at %p", (void *)a->base);
  memmove(mtab + i, mtab + i + 1, (nmtab - (size_t)i - 1) * sizeof *mtab);
  nmtab--;
}

/* A new registered block: device memory (fill FILL_NEW: real device memory
 * starts as garbage) or pinned host memory (zeroed, as calloc would). */
static cudaError_t mem_new(int device, size_t bytes, int pinned, int async, void **out) {
  size_t cap = (bytes + ALLOC_ALIGN - 1) / ALLOC_ALIGN * ALLOC_ALIGN + ALLOC_ALIGN;
  if (bytes > ((size_t)1 << 46)) return cudaErrorMemoryAllocation;
  struct alloc *a = calloc(1, sizeof *a);
  void *p = aligned_alloc(ALLOC_ALIGN, cap);
  if (!a || !p) {
    free(a);
    free(p);
    return cudaErrorMemoryAllocation;
  }
  memset(p, pinned ? 0 : FILL_NEW, cap);
  *a = (struct alloc){(uintptr_t)p, bytes, cap, device, pinned, async, 0, 0, 0, NULL};
  pthread_mutex_lock(&M);
  int rc = mem_insert(a);
  pthread_mutex_unlock(&M);
  if (rc) {
    free(a);
    free(p);
    return cudaErrorMemoryAllocation;
  }
  *out = p;
  return cudaSuccess;
}

/* Poison a block and keep it reserved; release the oldest quarantined
 * blocks beyond the bound (M held). */
static void mem_poison_locked(struct alloc *a) {
  memset((void *)a->base, POISON_FREED, a->cap);
  a->freed = 1;
  a->freed_at = dbl_now();
  if (q_tail) q_tail->qnext = a;
  else q_head = a;
  q_tail = a;
  q_bytes += a->cap;
  while (q_head && q_bytes > cfg.quarantine) {
    struct alloc *old = q_head;
    q_head = old->qnext;
    if (!q_head) q_tail = NULL;
    q_bytes -= old->cap;
    mem_remove(old);
    free((void *)old->base);
    free(old);
  }
}

/* Look up the live block that starts at p, for a free (M held). */
static struct alloc *mem_block(const void *p, int pinned) {
  struct alloc *a = mem_at(p);
  if (!a || a->base != (uintptr_t)p || a->freed || a->free_queued || a->pinned != pinned)
    return NULL;
  return a;
}

struct mem_info {
  enum dbl_mem_kind kind;
  int pinned;
  uintptr_t base;
  size_t size;
  int device;
  double freed_ago;
};

static void mem_classify(const void *p, size_t bytes, struct mem_info *mi) {
  memset(mi, 0, sizeof *mi);
  mi->device = -1;
  mi->kind = DBL_MEM_HOST;
  pthread_mutex_lock(&M);
  struct alloc *a = mem_at(p);
  if (a) {
    mi->base = a->base;
    mi->size = a->size;
    mi->pinned = a->pinned;
    mi->device = a->device;
    if (a->pinned) mi->kind = DBL_MEM_HOST;
    else if (a->freed) mi->kind = DBL_MEM_FREED, mi->freed_ago = dbl_now() - a->freed_at;
    else if ((uintptr_t)p + bytes > a->base + a->size || (uintptr_t)p + bytes < (uintptr_t)p)
      mi->kind = DBL_MEM_OVERRUN;
    else mi->kind = DBL_MEM_DEVICE;
  }
  pthread_mutex_unlock(&M);
}

enum dbl_mem_kind dbl_mem_find(const void *p, size_t bytes, int *device) {
  struct mem_info mi;
  mem_classify(p, bytes, &mi);
  if (device) *device = mi.kind == DBL_MEM_HOST ? -1 : mi.device;
  return mi.kind;
}

/* The range [p, p + bytes) that `api` is about to touch (`role`: "source",
 * "destination"): a freed block or an overrun aborts.  Work in a stream
 * would corrupt memory or fault on the real GPU; some synchronous checks of
 * the runtime answer cudaErrorInvalidValue instead (a cudaMemset past the
 * end of a block, seen on an H100), which callers tend to ignore, so the
 * double stops at once either way.  `when` says whether the check runs at
 * the call or when the stream reached the work. */
static void mem_require(const char *api, const char *role, const void *p, size_t bytes,
                        const char *when, struct mem_info *mi) {
  mem_classify(p, bytes, mi);
  if (mi->kind == DBL_MEM_FREED)
    dbl_fatal("%s: the %s [%p, +%zu) lies in device memory of device %d (block %p of %zu "
              "bytes) freed %.3f s before %s: use after free, which corrupts memory on a "
              "real GPU", api, role, p, bytes, mi->device, (void *)mi->base, mi->size,
              mi->freed_ago, when);
  if (mi->kind == DBL_MEM_OVERRUN)
    dbl_fatal("%s: the %s [%p, +%zu) overruns device %d's block %p of %zu bytes by %zu "
              "bytes (%s): the real GPU would corrupt memory or fault", api, role, p, bytes,
              mi->device, (void *)mi->base, mi->size,
              (size_t)((uintptr_t)p + bytes - (mi->base + mi->size)), when);
}

cudaError_t dbl_mem_alloc(int device, size_t bytes, void **out) {
  cfg_init();
  if (!out) return cudaErrorInvalidValue;
  if (device < 0 || device >= cfg.nvis) return cudaErrorInvalidDevice;
  if (!bytes) {
    *out = NULL;
    return cudaSuccess;
  }
  return mem_new(device, bytes, 0, 0, out);
}

/* Free a block now: wait device-wide unless it came from cudaMallocAsync
 * (cudaFree docs: no implicit synchronisation for those, "may" for the
 * others, modelled as a full device wait, [IMPLICIT]), then poison. */
static cudaError_t mem_free_block(void *p, int pinned, const char *api) {
  pthread_mutex_lock(&M);
  struct alloc *a = mem_block(p, pinned);
  int device = a ? a->device : -1, async = a ? a->async : 0;
  if (a) a->free_queued = 1; /* a second free of it fails from now on */
  pthread_mutex_unlock(&M);
  if (!a) {
    dbl_log("%s(%p): not the start of a live %s block", api, p, pinned ? "pinned" : "device");
    return cudaErrorInvalidValue; /* seen on an H100: freed twice, interior, host */
  }
  if (pinned) /* pinned memory may be read by any device's pending copies */
    for (int d = 0; d < cfg.nvis; d++) dbl_device_wait(d, api);
  else if (!async)
    dbl_device_wait(device, api);
  pthread_mutex_lock(&M);
  mem_poison_locked(a);
  pthread_mutex_unlock(&M);
  return cudaSuccess;
}

cudaError_t dbl_mem_free(void *p) {
  cfg_init();
  if (!p) return cudaSuccess;
  return mem_free_block(p, 0, "dbl_mem_free");
}

/* ------------------------------------------------------------------ */
/* Errors                                                              */
/* ------------------------------------------------------------------ */

/* Names and texts as libcudart 13.0 prints them. */
static const struct {
  cudaError_t code;
  const char *name, *text;
} errtab[] = {
#define E(code, text) {code, #code, text}
    E(cudaSuccess, "no error"),
    E(cudaErrorInvalidValue, "invalid argument"),
    E(cudaErrorMemoryAllocation, "out of memory"),
    E(cudaErrorInitializationError, "initialization error"),
    E(cudaErrorCudartUnloading, "driver shutting down"),
    E(cudaErrorProfilerDisabled, "profiler disabled while using external profiling tool"),
    E(cudaErrorProfilerNotInitialized,
      "profiler not initialized: call cudaProfilerInitialize()"),
    E(cudaErrorProfilerAlreadyStarted, "profiler already started"),
    E(cudaErrorProfilerAlreadyStopped, "profiler already stopped"),
    E(cudaErrorInvalidConfiguration, "invalid configuration argument"),
    E(cudaErrorInvalidPitchValue, "invalid pitch argument"),
    E(cudaErrorInvalidSymbol, "invalid device symbol"),
    E(cudaErrorInvalidHostPointer, "invalid host pointer"),
    E(cudaErrorInvalidDevicePointer, "invalid device pointer"),
    E(cudaErrorInvalidTexture, "invalid texture reference"),
    E(cudaErrorInvalidTextureBinding, "texture is not bound to a pointer"),
    E(cudaErrorInvalidChannelDescriptor, "invalid channel descriptor"),
    E(cudaErrorInvalidMemcpyDirection, "invalid copy direction for memcpy"),
    E(cudaErrorAddressOfConstant, "invalid address of constant"),
    E(cudaErrorTextureFetchFailed, "fetch from texture failed"),
    E(cudaErrorTextureNotBound, "cannot fetch from a texture that is not bound"),
    E(cudaErrorSynchronizationError, "incorrect use of __syncthreads()"),
    E(cudaErrorInvalidFilterSetting, "linear filtering not supported for non-float type"),
    E(cudaErrorInvalidNormSetting, "read as normalized float not supported for data type"),
    E(cudaErrorMixedDeviceExecution,
      "device emulation mode and device execution mode cannot be mixed"),
    E(cudaErrorNotYetImplemented, "feature not yet implemented"),
    E(cudaErrorMemoryValueTooLarge, "memory size or pointer value too large to fit in 32 bit"),
    E(cudaErrorStubLibrary, "CUDA driver is a stub library"),
    E(cudaErrorInsufficientDriver,
      "CUDA driver version is insufficient for CUDA runtime version"),
    E(cudaErrorCallRequiresNewerDriver, "API call is not supported in the installed CUDA driver"),
    E(cudaErrorInvalidSurface, "invalid surface reference"),
    E(cudaErrorDuplicateVariableName, "duplicate global variable looked up by string name"),
    E(cudaErrorDuplicateTextureName, "duplicate texture looked up by string name"),
    E(cudaErrorDuplicateSurfaceName, "duplicate surface looked up by string name"),
    E(cudaErrorDevicesUnavailable, "CUDA-capable device(s) is/are busy or unavailable"),
    E(cudaErrorIncompatibleDriverContext, "incompatible driver context"),
    E(cudaErrorMissingConfiguration, "__global__ function call is not configured"),
    E(cudaErrorPriorLaunchFailure, "unspecified launch failure in prior launch"),
    E(cudaErrorLaunchMaxDepthExceeded, "launch would exceed maximum depth of nested launches"),
    E(cudaErrorLaunchFileScopedTex,
      "launch failed because kernel uses unsupported, file-scoped textures (texture objects"
      " are supported)"),
    E(cudaErrorLaunchFileScopedSurf,
      "launch failed because kernel uses unsupported, file-scoped surfaces (surface objects"
      " are supported)"),
    E(cudaErrorSyncDepthExceeded,
      "cudaDeviceSynchronize failed because caller's grid depth exceeds"
      " cudaLimitDevRuntimeSyncDepth"),
    E(cudaErrorLaunchPendingCountExceeded,
      "launch failed because launch would exceed cudaLimitDevRuntimePendingLaunchCount"),
    E(cudaErrorInvalidDeviceFunction, "invalid device function"),
    E(cudaErrorNoDevice, "no CUDA-capable device is detected"),
    E(cudaErrorInvalidDevice, "invalid device ordinal"),
    E(cudaErrorDeviceNotLicensed, "device doesn't have valid Grid license"),
    E(cudaErrorSoftwareValidityNotEstablished, "integrity checks failed"),
    E(cudaErrorStartupFailure, "startup failure in cuda runtime"),
    E(cudaErrorInvalidKernelImage, "device kernel image is invalid"),
    E(cudaErrorDeviceUninitialized, "invalid device context"),
    E(cudaErrorMapBufferObjectFailed, "mapping of buffer object failed"),
    E(cudaErrorUnmapBufferObjectFailed, "unmapping of buffer object failed"),
    E(cudaErrorArrayIsMapped, "array is mapped"),
    E(cudaErrorAlreadyMapped, "resource already mapped"),
    E(cudaErrorNoKernelImageForDevice, "no kernel image is available for execution on the device"),
    E(cudaErrorAlreadyAcquired, "resource already acquired"),
    E(cudaErrorNotMapped, "resource not mapped"),
    E(cudaErrorNotMappedAsArray, "resource not mapped as array"),
    E(cudaErrorNotMappedAsPointer, "resource not mapped as pointer"),
    E(cudaErrorECCUncorrectable, "uncorrectable ECC error encountered"),
    E(cudaErrorUnsupportedLimit, "limit is not supported on this architecture"),
    E(cudaErrorDeviceAlreadyInUse, "exclusive-thread device already in use by a different thread"),
    E(cudaErrorPeerAccessUnsupported, "peer access is not supported between these two devices"),
    E(cudaErrorInvalidPtx, "a PTX JIT compilation failed"),
    E(cudaErrorInvalidGraphicsContext, "invalid OpenGL or DirectX context"),
    E(cudaErrorNvlinkUncorrectable, "uncorrectable NVLink error detected during the execution"),
    E(cudaErrorJitCompilerNotFound, "PTX JIT compiler library not found"),
    E(cudaErrorUnsupportedPtxVersion, "the provided PTX was compiled with an unsupported toolchain."),
    E(cudaErrorJitCompilationDisabled, "PTX JIT compilation was disabled"),
    E(cudaErrorUnsupportedExecAffinity, "the provided execution affinity is not supported"),
    E(cudaErrorUnsupportedDevSideSync,
      "the provided PTX contains unsupported call to cudaDeviceSynchronize"),
    E(cudaErrorContained, "Invalid access of peer GPU memory over nvlink or a hardware error"),
    E(cudaErrorInvalidSource, "device kernel image is invalid"),
    E(cudaErrorFileNotFound, "file not found"),
    E(cudaErrorSharedObjectSymbolNotFound, "shared object symbol not found"),
    E(cudaErrorSharedObjectInitFailed, "shared object initialization failed"),
    E(cudaErrorOperatingSystem, "OS call failed or operation not supported on this OS"),
    E(cudaErrorInvalidResourceHandle, "invalid resource handle"),
    E(cudaErrorIllegalState, "the operation cannot be performed in the present state"),
    E(cudaErrorLossyQuery, "attempted introspection would be semantically lossy"),
    E(cudaErrorSymbolNotFound, "named symbol not found"),
    E(cudaErrorNotReady, "device not ready"),
    E(cudaErrorIllegalAddress, "an illegal memory access was encountered"),
    E(cudaErrorLaunchOutOfResources, "too many resources requested for launch"),
    E(cudaErrorLaunchTimeout, "the launch timed out and was terminated"),
    E(cudaErrorLaunchIncompatibleTexturing, "launch uses incompatible texturing mode"),
    E(cudaErrorPeerAccessAlreadyEnabled, "peer access is already enabled"),
    E(cudaErrorPeerAccessNotEnabled, "peer access has not been enabled"),
    E(cudaErrorSetOnActiveProcess, "cannot set while device is active in this process"),
    E(cudaErrorContextIsDestroyed, "context is destroyed"),
    E(cudaErrorAssert, "device-side assert triggered"),
    E(cudaErrorTooManyPeers, "peer mapping resources exhausted"),
    E(cudaErrorHostMemoryAlreadyRegistered,
      "part or all of the requested memory range is already mapped"),
    E(cudaErrorHostMemoryNotRegistered,
      "pointer does not correspond to a registered memory region"),
    E(cudaErrorHardwareStackError, "hardware stack error"),
    E(cudaErrorIllegalInstruction, "an illegal instruction was encountered"),
    E(cudaErrorMisalignedAddress, "misaligned address"),
    E(cudaErrorInvalidAddressSpace, "operation not supported on global/shared address space"),
    E(cudaErrorInvalidPc, "invalid program counter"),
    E(cudaErrorLaunchFailure, "unspecified launch failure"),
    E(cudaErrorCooperativeLaunchTooLarge, "too many blocks in cooperative launch"),
    E(cudaErrorTensorMemoryLeak, "tensor memory not completely freed"),
    E(cudaErrorNotPermitted, "operation not permitted"),
    E(cudaErrorNotSupported, "operation not supported"),
    E(cudaErrorSystemNotReady, "system not yet initialized"),
    E(cudaErrorSystemDriverMismatch,
      "system has unsupported display driver / cuda driver combination"),
    E(cudaErrorCompatNotSupportedOnDevice,
      "forward compatibility was attempted on non supported HW"),
    E(cudaErrorMpsConnectionFailed,
      "MPS client failed to connect to the MPS control daemon or the MPS server"),
    E(cudaErrorMpsRpcFailure,
      "the remote procedural call between the MPS server and the MPS client failed"),
    E(cudaErrorMpsServerNotReady, "MPS server is not ready to accept new MPS client requests"),
    E(cudaErrorMpsMaxClientsReached,
      "the hardware resources required to create MPS client have been exhausted"),
    E(cudaErrorMpsMaxConnectionsReached,
      "the hardware resources required to support device connections have been exhausted"),
    E(cudaErrorMpsClientTerminated, "the MPS client has been terminated by the server"),
    E(cudaErrorCdpNotSupported,
      "is using CUDA Dynamic Parallelism, but the current configuration, like MPS, does not"
      " support it"),
    E(cudaErrorCdpVersionMismatch,
      "unsupported interaction between different versions of CUDA Dynamic Parallelism"),
    E(cudaErrorStreamCaptureUnsupported, "operation not permitted when stream is capturing"),
    E(cudaErrorStreamCaptureInvalidated,
      "operation failed due to a previous error during capture"),
    E(cudaErrorStreamCaptureMerge,
      "operation would result in a merge of separate capture sequences"),
    E(cudaErrorStreamCaptureUnmatched, "capture was not ended in the same stream as it began"),
    E(cudaErrorStreamCaptureUnjoined, "capturing stream has unjoined work"),
    E(cudaErrorStreamCaptureIsolation, "dependency created on uncaptured work in another stream"),
    E(cudaErrorStreamCaptureImplicit,
      "operation would make the legacy stream depend on a capturing blocking stream"),
    E(cudaErrorCapturedEvent,
      "operation not permitted on an event last recorded in a capturing stream"),
    E(cudaErrorStreamCaptureWrongThread,
      "attempt to terminate a thread-local capture sequence from another thread"),
    E(cudaErrorTimeout, "wait operation timed out"),
    E(cudaErrorGraphExecUpdateFailure,
      "the graph update was not performed because it included changes which violated"
      " constraints specific to instantiated graph update"),
    E(cudaErrorExternalDevice, "an async error has occured in external entity outside of CUDA"),
    E(cudaErrorInvalidClusterSize,
      "a kernel launch error has occurred due to cluster misconfiguration"),
    E(cudaErrorFunctionNotLoaded,
      "the function handle is not loaded when calling an API that requires a loaded function"),
    E(cudaErrorInvalidResourceType,
      "one or more resources passed in are not valid resource types for the operation"),
    E(cudaErrorInvalidResourceConfiguration,
      "one or more resources are insufficient or non-applicable for the operation"),
    E(cudaErrorUnknown, "unknown error"),
#undef E
};

const char *cudaGetErrorName(cudaError_t error) {
  for (size_t i = 0; i < sizeof errtab / sizeof *errtab; i++)
    if (errtab[i].code == error) return errtab[i].name;
  return "unrecognized error code";
}

const char *cudaGetErrorString(cudaError_t error) {
  for (size_t i = 0; i < sizeof errtab / sizeof *errtab; i++)
    if (errtab[i].code == error) return errtab[i].text;
  return "unrecognized error code";
}

cudaError_t cudaGetLastError(void) {
  cudaError_t e = tl_error;
  tl_error = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError(void) { return tl_error; }

/* ------------------------------------------------------------------ */
/* Device management                                                   */
/* ------------------------------------------------------------------ */

cudaError_t cudaGetDeviceCount(int *count) {
  cfg_init();
  if (!count) return ret(cudaErrorInvalidValue);
  if (cfg.nvis == 0) return ret(cfg.init_error); /* *count untouched, as seen on an H100 */
  *count = cfg.nvis;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device) {
  int d;
  cudaError_t e = current_device(&d);
  if (e) return ret(e);
  if (!device) return ret(cudaErrorInvalidValue);
  *device = d;
  return cudaSuccess;
}

/* Per host thread, no synchronisation (cudaSetDevice docs). */
cudaError_t cudaSetDevice(int device) {
  cfg_init();
  if (cfg.nvis == 0) return ret(cfg.init_error);
  if (device < 0 || device >= cfg.nvis) return ret(cudaErrorInvalidDevice);
  tl_device = device;
  return cudaSuccess;
}

/* Blocks until the device has done all work asked of it before
 * (cudaDeviceSynchronize docs): every stream of the device. */
cudaError_t cudaDeviceSynchronize(void) {
  dbl_cuda_enter("cudaDeviceSynchronize");
  int d;
  cudaError_t e = current_device(&d);
  if (e) return ret(e);
  dbl_device_wait(d, "cudaDeviceSynchronize");
  return cudaSuccess;
}

cudaError_t cudaDeviceGetPCIBusId(char *pciBusId, int len, int device) {
  cfg_init();
  if (cfg.nvis == 0) return ret(cfg.init_error);
  if (device < 0 || device >= cfg.nvis) return ret(cudaErrorInvalidDevice);
  if (!pciBusId || len < 13) return ret(cudaErrorInvalidValue); /* "0000:XX:00.0" + NUL */
  dbl_device_busid(device, pciBusId, (size_t)len);
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device) {
  cfg_init();
  if (cfg.nvis == 0) return ret(cfg.init_error);
  if (device < 0 || device >= cfg.nvis) return ret(cudaErrorInvalidDevice);
  if (!prop) return ret(cudaErrorInvalidValue);
  memset(prop, 0, sizeof *prop);
  snprintf(prop->name, sizeof prop->name, "meshpg test double (CPU) device %d", device);
  prop->totalGlobalMem = (size_t)80 << 30;
  prop->sharedMemPerBlock = 48 << 10;
  prop->warpSize = 32;
  prop->maxThreadsPerBlock = 1024;
  prop->maxThreadsDim[0] = prop->maxThreadsDim[1] = 1024;
  prop->maxThreadsDim[2] = 64;
  prop->maxGridSize[0] = 0x7fffffff;
  prop->maxGridSize[1] = prop->maxGridSize[2] = 65535;
  prop->major = 9;
  prop->minor = 0;
  prop->multiProcessorCount = 132;
  prop->concurrentKernels = 1;
  prop->unifiedAddressing = 1;
  prop->pciDomainID = 0;
  prop->pciBusID = 0x10 + cfg.phys[device];
  prop->pciDeviceID = 0;
  return cudaSuccess;
}

/* ------------------------------------------------------------------ */
/* Streams                                                             */
/* ------------------------------------------------------------------ */

/* A stream belongs to the device current at its creation (cudaSetDevice
 * docs); flags other than cudaStreamDefault / cudaStreamNonBlocking are
 * cudaErrorInvalidValue (seen on an H100). */
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags) {
  dbl_cuda_enter("cudaStreamCreateWithFlags");
  int d;
  cudaError_t e = current_device(&d);
  if (e) return ret(e);
  if (!pStream || (flags & ~(unsigned)cudaStreamNonBlocking)) return ret(cudaErrorInvalidValue);
  pthread_mutex_lock(&G);
  dev_get(d);
  struct dstream *s = stream_new(d, S_USER, flags);
  if (s) *pStream = stream_handle(s);
  pthread_mutex_unlock(&G);
  return s ? cudaSuccess : ret(cudaErrorMemoryAllocation);
}

cudaError_t cudaStreamCreate(cudaStream_t *pStream) {
  return cudaStreamCreateWithFlags(pStream, cudaStreamDefault);
}

/* Mark s destroyed (G held, released and retaken to join).  Work already
 * queued still runs: the call returns at once and the resources go when the
 * work is done (cudaStreamDestroy docs). */
static void stream_retire_locked(struct dstream *s) {
  s->destroyed = 1;
  pthread_cond_signal(&s->cv);
  if (!s->started) {
    dev_unlink(s);
    return;
  }
  if (s->head) {
    s->exit_mode = EXIT_DETACH;
    return;
  }
  s->exit_mode = EXIT_JOIN;
  dev_unlink(s);
  pthread_mutex_unlock(&G);
  pthread_join(s->thread, NULL);
  pthread_mutex_lock(&G);
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  dbl_cuda_enter("cudaStreamDestroy");
  pthread_mutex_lock(&G);
  struct dstream *s;
  cudaError_t e = stream_resolve(stream, &s);
  if (!e && s->kind != S_USER) e = cudaErrorInvalidResourceHandle;
  if (!e) stream_retire_locked(s);
  pthread_mutex_unlock(&G);
  return ret(e);
}

/* A thread's per-thread streams end with the thread. */
static void ptds_release(void *arg) {
  struct dstream **v = arg;
  pthread_mutex_lock(&G);
  for (int d = 0; d < MAX_DEVICES; d++)
    if (v[d]) stream_retire_locked(v[d]);
  pthread_mutex_unlock(&G);
  free(v);
  tl_ptds = NULL;
}

/* Waits for the work queued so far.  For the legacy stream that is an
 * action in it, so it also waits for the blocking streams' earlier work
 * ([STREAM-SYNC], "Legacy default stream"). */
cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  dbl_cuda_enter("cudaStreamSynchronize");
  pthread_mutex_lock(&G);
  struct dstream *s;
  cudaError_t e = stream_resolve(stream, &s);
  if (!e) {
    if (s->kind == S_LEGACY) e = submit_and_wait(s, "cudaStreamSynchronize", noop, NULL,
                                                 "cudaStreamSynchronize");
    else host_wait(s, s->submitted, "cudaStreamSynchronize");
  }
  pthread_mutex_unlock(&G);
  return ret(e);
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
  dbl_cuda_enter("cudaStreamQuery");
  pthread_mutex_lock(&G);
  struct dstream *s;
  cudaError_t e = stream_resolve(stream, &s);
  if (!e && s->completed < s->submitted) e = cudaErrorNotReady;
  pthread_mutex_unlock(&G);
  return ret(e);
}

/* ------------------------------------------------------------------ */
/* Events                                                              */
/* ------------------------------------------------------------------ */

static struct devent *event_resolve(cudaEvent_t h) {
  uintptr_t v = (uintptr_t)h;
  if (v < EVENT_BASE || (v - EVENT_BASE) & 15) return NULL;
  uint64_t x = (v - EVENT_BASE) >> 4;
  uint64_t idx = x & 0xffffff, gen = x >> 24;
  if (idx >= (uint64_t)netab) return NULL;
  struct devent *ev = &etab[idx];
  return ev->live && (ev->gen & 0xfffffu) == gen ? ev : NULL;
}

static int event_slot(void) {
  if (efree_head >= 0) {
    int i = efree_head;
    efree_head = efree_next[i];
    return i;
  }
  if (netab == capetab) {
    int cap = capetab ? 2 * capetab : 256;
    if (cap > 0xffffff) return -1;
    struct devent *t = realloc(etab, (size_t)cap * sizeof *t);
    if (!t) return -1;
    etab = t;
    int *n = realloc(efree_next, (size_t)cap * sizeof *n);
    if (!n) return -1;
    efree_next = n;
    capetab = cap;
  }
  memset(&etab[netab], 0, sizeof etab[netab]);
  return netab++;
}

/* cudaEventInterprocess must come with cudaEventDisableTiming
 * (cudaEventCreateWithFlags docs); unknown flags are cudaErrorInvalidValue
 * (seen on an H100).  The event belongs to the current device. */
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags) {
  dbl_cuda_enter("cudaEventCreateWithFlags");
  int d;
  cudaError_t e = current_device(&d);
  if (e) return ret(e);
  unsigned known = cudaEventBlockingSync | cudaEventDisableTiming | cudaEventInterprocess;
  if (!event || (flags & ~known) ||
      ((flags & cudaEventInterprocess) && !(flags & cudaEventDisableTiming)))
    return ret(cudaErrorInvalidValue);
  pthread_mutex_lock(&G);
  int i = event_slot();
  if (i >= 0) {
    struct devent *ev = &etab[i];
    ev->gen++;
    ev->live = 1;
    ev->device = d;
    ev->flags = flags;
    ev->recorded = 0;
    ev->stream = NULL;
    *event = event_handle(i);
  }
  pthread_mutex_unlock(&G);
  return i >= 0 ? cudaSuccess : ret(cudaErrorMemoryAllocation);
}

cudaError_t cudaEventCreate(cudaEvent_t *event) {
  return cudaEventCreateWithFlags(event, cudaEventDefault);
}

/* Captures the stream's contents at the call; later use of the stream does
 * not change the event; event and stream must be on one device
 * (cudaEventRecord docs).  The capture is a marker item, so that on the
 * legacy stream it also covers the blocking streams' earlier work. */
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  dbl_cuda_enter("cudaEventRecord");
  pthread_mutex_lock(&G);
  struct devent *ev = event_resolve(event);
  struct dstream *s = NULL;
  cudaError_t e = ev ? stream_resolve(stream, &s) : cudaErrorInvalidResourceHandle;
  if (!e && s->device != ev->device) e = cudaErrorInvalidResourceHandle;
  uint64_t seq = 0;
  if (!e) e = submit_locked(s, "cudaEventRecord", 0, 0, noop, NULL, NULL, &seq);
  if (!e) {
    ev->recorded = 1;
    ev->stream = s;
    ev->seq = seq;
  }
  pthread_mutex_unlock(&G);
  return ret(e);
}

/* Before the first record an event is an empty set of work, so a query
 * answers cudaSuccess (cudaEventRecord docs). */
cudaError_t cudaEventQuery(cudaEvent_t event) {
  dbl_cuda_enter("cudaEventQuery");
  pthread_mutex_lock(&G);
  struct devent *ev = event_resolve(event);
  cudaError_t e = !ev ? cudaErrorInvalidResourceHandle
                  : ev->recorded && ev->stream->completed < ev->seq ? cudaErrorNotReady
                                                                     : cudaSuccess;
  pthread_mutex_unlock(&G);
  return ret(e);
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  dbl_cuda_enter("cudaEventSynchronize");
  pthread_mutex_lock(&G);
  struct devent *ev = event_resolve(event);
  cudaError_t e = ev ? cudaSuccess : cudaErrorInvalidResourceHandle;
  if (ev && ev->recorded) host_wait(ev->stream, ev->seq, "cudaEventSynchronize");
  pthread_mutex_unlock(&G);
  return ret(e);
}

/* Destroying an event others still wait on is allowed: the waits keep the
 * captured point, not the event (cudaStreamWaitEvent below). */
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  dbl_cuda_enter("cudaEventDestroy");
  pthread_mutex_lock(&G);
  struct devent *ev = event_resolve(event);
  if (ev) {
    int i = (int)(ev - etab);
    ev->live = 0;
    efree_next[i] = efree_head;
    efree_head = i;
  }
  pthread_mutex_unlock(&G);
  return ev ? cudaSuccess : ret(cudaErrorInvalidResourceHandle);
}

/* All later work of the stream waits for the work the event captured, as
 * captured at this call (cudaStreamWaitEvent and cudaEventRecord docs); an
 * event never recorded captures nothing.  The event may be of another
 * device.  Only flags 0 outside graph capture (seen on an H100). */
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
  dbl_cuda_enter("cudaStreamWaitEvent");
  pthread_mutex_lock(&G);
  struct devent *ev = event_resolve(event);
  struct dstream *s = NULL;
  cudaError_t e = ev ? stream_resolve(stream, &s) : cudaErrorInvalidResourceHandle;
  if (!e && flags) e = cudaErrorInvalidValue;
  if (!e) {
    struct dep d = {ev->stream, ev->seq};
    e = submit_locked(s, "cudaStreamWaitEvent", 0, 0, noop, NULL, ev->recorded ? &d : NULL,
                      NULL);
  }
  pthread_mutex_unlock(&G);
  return ret(e);
}

/* ------------------------------------------------------------------ */
/* Host functions                                                      */
/* ------------------------------------------------------------------ */

struct hostfn_job {
  cudaHostFn_t fn;
  void *data;
};

static void run_hostfn(void *arg) {
  struct hostfn_job *j = arg;
  j->fn(j->data);
  free(j);
}

/* Runs after the stream's earlier work and holds its later work
 * (cudaLaunchHostFunc docs); it runs on the stream's executor. */
cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void *userData) {
  dbl_cuda_enter("cudaLaunchHostFunc");
  if (!fn) return ret(cudaErrorInvalidValue);
  struct hostfn_job *j = malloc(sizeof *j);
  if (!j) return ret(cudaErrorMemoryAllocation);
  *j = (struct hostfn_job){fn, userData};
  cudaError_t e = dbl_stream_submit(stream, "cudaLaunchHostFunc", 0, run_hostfn, j);
  if (e) free(j);
  return ret(e);
}

/* ------------------------------------------------------------------ */
/* Memory: allocation                                                  */
/* ------------------------------------------------------------------ */

/* A device memory allocation issued between two commands keeps them from
 * running concurrently ([IMPLICIT]); the double models cudaMalloc as a
 * full device wait, like cudaFree. */
cudaError_t cudaMalloc(void **devPtr, size_t size) {
  dbl_cuda_enter("cudaMalloc");
  int d;
  cudaError_t e = current_device(&d);
  if (e) return ret(e);
  if (!devPtr) return ret(cudaErrorInvalidValue);
  dbl_device_wait(d, "cudaMalloc");
  if (!size) { /* seen on an H100: success and NULL */
    *devPtr = NULL;
    return cudaSuccess;
  }
  return ret(mem_new(d, size, 0, 0, devPtr));
}

cudaError_t cudaFree(void *devPtr) {
  dbl_cuda_enter("cudaFree");
  if (!devPtr) return cudaSuccess;
  return ret(mem_free_block(devPtr, 0, "cudaFree"));
}

cudaError_t cudaMallocHost(void **ptr, size_t size) {
  dbl_cuda_enter("cudaMallocHost");
  int d;
  cudaError_t e = current_device(&d);
  if (e) return ret(e);
  if (!ptr) return ret(cudaErrorInvalidValue);
  return ret(mem_new(d, size ? size : 1, 1, 0, ptr));
}

cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned int flags) {
  if (flags & ~(unsigned)(cudaHostAllocPortable | cudaHostAllocMapped |
                          cudaHostAllocWriteCombined))
    return ret(cudaErrorInvalidValue);
  return cudaMallocHost(pHost, size);
}

cudaError_t cudaFreeHost(void *ptr) {
  dbl_cuda_enter("cudaFreeHost");
  if (!ptr) return cudaSuccess;
  return ret(mem_free_block(ptr, 1, "cudaFreeHost"));
}

static void run_free_async(void *arg) {
  struct alloc *a = arg;
  pthread_mutex_lock(&M);
  mem_poison_locked(a);
  pthread_mutex_unlock(&M);
}

/* Fault injection: MESHPG_DOUBLE_OOM_RANK=R fails the calling rank R's
 * stream-ordered allocations (read at each call, so a test can set it). */
static int oom_injected(void) {
  const char *v = getenv("MESHPG_DOUBLE_OOM_RANK");
  return v && *v && atoi(v) >= 0 && atoi(v) == dbl_world_rank();
}

/* Stream-ordered: no device-wide wait; the memory comes from the stream's
 * device (cudaMallocAsync docs). */
cudaError_t cudaMallocAsync(void **devPtr, size_t size, cudaStream_t hStream) {
  dbl_cuda_enter("cudaMallocAsync");
  int d = dbl_stream_device(hStream);
  if (d < 0) return ret(cudaErrorInvalidResourceHandle);
  if (!devPtr) return ret(cudaErrorInvalidValue);
  if (oom_injected()) {
    dbl_log("cudaMallocAsync(%zu bytes): out of memory injected on rank %d", size,
            dbl_world_rank());
    return ret(cudaErrorMemoryAllocation);
  }
  if (!size) {
    *devPtr = NULL;
    return cudaSuccess;
  }
  return ret(mem_new(d, size, 0, 1, devPtr));
}

/* The block is freed (poisoned) when the stream reaches the free; it must
 * not be touched after that point (cudaFreeAsync docs). */
cudaError_t cudaFreeAsync(void *devPtr, cudaStream_t hStream) {
  dbl_cuda_enter("cudaFreeAsync");
  if (dbl_stream_device(hStream) < 0) return ret(cudaErrorInvalidResourceHandle);
  if (!devPtr) return cudaSuccess;
  pthread_mutex_lock(&M);
  struct alloc *a = mem_block(devPtr, 0);
  if (a) a->free_queued = 1;
  pthread_mutex_unlock(&M);
  if (!a) return ret(cudaErrorInvalidValue);
  cudaError_t e = dbl_stream_submit(hStream, "cudaFreeAsync", 0, run_free_async, a);
  if (e) {
    pthread_mutex_lock(&M);
    a->free_queued = 0;
    pthread_mutex_unlock(&M);
  }
  return ret(e);
}

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *attributes, const void *ptr) {
  dbl_cuda_enter("cudaPointerGetAttributes");
  if (!attributes) return ret(cudaErrorInvalidValue);
  struct mem_info mi;
  mem_classify(ptr, 0, &mi);
  memset(attributes, 0, sizeof *attributes);
  if (mi.kind == DBL_MEM_DEVICE || mi.kind == DBL_MEM_OVERRUN) {
    attributes->type = cudaMemoryTypeDevice;
    attributes->device = mi.device;
    attributes->devicePointer = (void *)ptr;
  } else if (mi.pinned) {
    attributes->type = cudaMemoryTypeHost;
    attributes->device = mi.device;
    attributes->devicePointer = attributes->hostPointer = (void *)ptr;
  } else { /* host or freed: unregistered, device -2 (seen on an H100) */
    attributes->type = cudaMemoryTypeUnregistered;
    attributes->device = -2;
    attributes->hostPointer = (void *)ptr;
  }
  return cudaSuccess;
}

/* ------------------------------------------------------------------ */
/* Memory: copies and memsets                                          */
/* ------------------------------------------------------------------ */

struct copy_job {
  void *dst;
  const void *src;     /* the staging buffer when staged */
  size_t n;
  void *staging;
  int dst_dev, src_dev; /* was device memory at the call: check again */
  char api[24];
};

/* Runs when the stream reaches the copy: the memory must still be live. */
static void run_copy(void *arg) {
  struct copy_job *j = arg;
  struct mem_info mi;
  if (j->dst_dev) mem_require(j->api, "destination", j->dst, j->n, "the copy ran", &mi);
  if (j->src_dev) mem_require(j->api, "source", j->src, j->n, "the copy ran", &mi);
  memmove(j->dst, j->src, j->n);
  free(j->staging);
  free(j);
}

struct memset_job {
  void *p;
  int value;
  size_t n;
  char api[24];
};

static void run_memset(void *arg) {
  struct memset_job *j = arg;
  struct mem_info mi;
  mem_require(j->api, "destination", j->p, j->n, "the memset ran", &mi);
  memset(j->p, j->value, j->n);
  free(j);
}

enum where { W_DEVICE, W_PINNED, W_PAGEABLE };

static enum where where_of(const struct mem_info *mi) {
  return mi->kind == DBL_MEM_DEVICE ? W_DEVICE : mi->pinned ? W_PINNED : W_PAGEABLE;
}

/* The kind's promise against what the pointers are (seen on an H100: a
 * host pointer where the kind says device is cudaErrorInvalidValue; an
 * unknown kind is cudaErrorInvalidMemcpyDirection). */
static cudaError_t check_kind(enum cudaMemcpyKind kind, enum where dw, enum where sw) {
  switch (kind) {
    case cudaMemcpyHostToHost:
    case cudaMemcpyDefault: return cudaSuccess;
    case cudaMemcpyHostToDevice: return dw == W_DEVICE ? cudaSuccess : cudaErrorInvalidValue;
    case cudaMemcpyDeviceToHost: return sw == W_DEVICE ? cudaSuccess : cudaErrorInvalidValue;
    case cudaMemcpyDeviceToDevice:
      return dw == W_DEVICE && sw == W_DEVICE ? cudaSuccess : cudaErrorInvalidValue;
  }
  return cudaErrorInvalidMemcpyDirection;
}

static struct copy_job *copy_job(const char *api, void *dst, const void *src, size_t n,
                                 enum where dw, enum where sw, int stage) {
  struct copy_job *j = calloc(1, sizeof *j);
  if (!j) return NULL;
  j->dst = dst;
  j->src = src;
  j->n = n;
  j->dst_dev = dw == W_DEVICE;
  j->src_dev = sw == W_DEVICE;
  snprintf(j->api, sizeof j->api, "%s", api);
  if (stage) {
    if (!(j->staging = malloc(n))) {
      free(j);
      return NULL;
    }
    memcpy(j->staging, src, n);
    j->src = j->staging;
  }
  return j;
}

/* How cudaMemcpy meets the host, by direction ([API-SYNC], "Memcpy",
 * synchronous functions):
 *   pageable host -> device: a stream sync first, then the source is
 *     staged and the call returns; the device write lands later;
 *   pinned host -> device: synchronous with the host;
 *   device -> host: returns once the copy is done;
 *   device -> device: no host synchronisation;
 *   host -> host: fully synchronous.
 * All of it is work of the legacy default stream of the current device,
 * so it is ordered with blocking streams and not with non-blocking ones
 * ([STREAM-SYNC]). */
cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind) {
  dbl_cuda_enter("cudaMemcpy");
  int d;
  cudaError_t e = current_device(&d);
  if (e) return ret(e);
  if (!count) return (unsigned)kind <= cudaMemcpyDefault ? cudaSuccess
                                                          : ret(cudaErrorInvalidMemcpyDirection);
  struct mem_info md, ms;
  mem_require("cudaMemcpy", "destination", dst, count, "the call", &md);
  mem_require("cudaMemcpy", "source", src, count, "the call", &ms);
  enum where dw = where_of(&md), sw = where_of(&ms);
  if ((e = check_kind(kind, dw, sw))) return ret(e);
  int pageable_h2d = dw == W_DEVICE && sw == W_PAGEABLE;
  int async = dw == W_DEVICE && sw != W_PINNED; /* pageable -> device, device -> device */
  pthread_mutex_lock(&G);
  struct dstream *l = dev_get(d)->legacy;
  if (pageable_h2d) host_wait(l, l->submitted, "cudaMemcpy (stream sync before staging)");
  struct copy_job *j = copy_job("cudaMemcpy", dst, src, count, dw, sw, pageable_h2d);
  if (!j) e = cudaErrorMemoryAllocation;
  else if (async) e = submit_locked(l, "cudaMemcpy", 0, 1, run_copy, j, NULL, NULL);
  else e = submit_and_wait(l, "cudaMemcpy", run_copy, j, "cudaMemcpy");
  pthread_mutex_unlock(&G);
  if (e && j) {
    free(j->staging);
    free(j);
  }
  return ret(e);
}

/* cudaMemcpyAsync is stream-ordered.  With pageable host memory it "might
 * be synchronous" and the driver may stage pageable memory ([API-SYNC],
 * "Memcpy", asynchronous functions): the double stages a pageable source
 * at the call (so the caller may reuse it at once, as real drivers allow)
 * and writes a host destination only when the stream gets there (so a
 * caller who reads it before synchronising sees stale data).  Host to
 * host is fully synchronous. */
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                            cudaStream_t stream) {
  dbl_cuda_enter("cudaMemcpyAsync");
  if (dbl_stream_device(stream) < 0) return ret(cudaErrorInvalidResourceHandle);
  if (!count) return (unsigned)kind <= cudaMemcpyDefault ? cudaSuccess
                                                          : ret(cudaErrorInvalidMemcpyDirection);
  struct mem_info md, ms;
  mem_require("cudaMemcpyAsync", "destination", dst, count, "the call", &md);
  mem_require("cudaMemcpyAsync", "source", src, count, "the call", &ms);
  enum where dw = where_of(&md), sw = where_of(&ms);
  cudaError_t e = check_kind(kind, dw, sw);
  if (e) return ret(e);
  int h2h = dw != W_DEVICE && sw != W_DEVICE;
  struct copy_job *j =
      copy_job("cudaMemcpyAsync", dst, src, count, dw, sw, sw == W_PAGEABLE && !h2h);
  if (!j) return ret(cudaErrorMemoryAllocation);
  pthread_mutex_lock(&G);
  struct dstream *s;
  e = stream_resolve(stream, &s);
  if (!e && h2h) e = submit_and_wait(s, "cudaMemcpyAsync", run_copy, j, "cudaMemcpyAsync");
  else if (!e) e = submit_locked(s, "cudaMemcpyAsync", 0, 1, run_copy, j, NULL, NULL);
  pthread_mutex_unlock(&G);
  if (e) {
    free(j->staging);
    free(j);
  }
  return ret(e);
}

/* Checks of a memset's target at the call: device memory, or pinned host
 * memory for the synchronous form; pageable host memory is
 * cudaErrorInvalidValue (seen on an H100). */
static cudaError_t memset_target(const char *api, void *p, size_t n, struct mem_info *mi) {
  mem_require(api, "destination", p, n, "the call", mi);
  if (mi->kind == DBL_MEM_DEVICE) return cudaSuccess;
  return mi->pinned ? cudaSuccess : cudaErrorInvalidValue;
}

static struct memset_job *memset_job(const char *api, void *p, int value, size_t n) {
  struct memset_job *j = malloc(sizeof *j);
  if (j) {
    *j = (struct memset_job){p, value, n, ""};
    snprintf(j->api, sizeof j->api, "%s", api);
  }
  return j;
}

/* The synchronous memset is asynchronous with respect to the host unless
 * its target is pinned host memory ([API-SYNC], "Memset"), and it is work
 * of the legacy default stream. */
cudaError_t cudaMemset(void *devPtr, int value, size_t count) {
  dbl_cuda_enter("cudaMemset");
  int d;
  cudaError_t e = current_device(&d);
  if (e) return ret(e);
  if (!count) return cudaSuccess;
  struct mem_info mi;
  if ((e = memset_target("cudaMemset", devPtr, count, &mi))) return ret(e);
  struct memset_job *j = memset_job("cudaMemset", devPtr, value, count);
  if (!j) return ret(cudaErrorMemoryAllocation);
  pthread_mutex_lock(&G);
  struct dstream *l = dev_get(d)->legacy;
  if (mi.pinned) e = submit_and_wait(l, "cudaMemset", run_memset, j, "cudaMemset");
  else e = submit_locked(l, "cudaMemset", 0, 1, run_memset, j, NULL, NULL);
  pthread_mutex_unlock(&G);
  if (e) free(j);
  return ret(e);
}

cudaError_t cudaMemsetAsync(void *devPtr, int value, size_t count, cudaStream_t stream) {
  dbl_cuda_enter("cudaMemsetAsync");
  if (dbl_stream_device(stream) < 0) return ret(cudaErrorInvalidResourceHandle);
  if (!count) return cudaSuccess;
  struct mem_info mi;
  cudaError_t e = memset_target("cudaMemsetAsync", devPtr, count, &mi);
  if (e) return ret(e);
  struct memset_job *j = memset_job("cudaMemsetAsync", devPtr, value, count);
  if (!j) return ret(cudaErrorMemoryAllocation);
  e = dbl_stream_submit(stream, "cudaMemsetAsync", 0, run_memset, j);
  if (e) free(j);
  return ret(e);
}
