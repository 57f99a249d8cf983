/* The CUDA half of the test double (cuda_double.c, which lists its files):
 * what its files share.  Not part of the double's interface (double.h):
 * everything declared at the end is hidden, so the shared library exports
 * the CUDA runtime API and the dbl_ functions only, as before the split. */
#ifndef MESHPG_TESTS_CUDA_DOUBLE_INTERNAL_H
#define MESHPG_TESTS_CUDA_DOUBLE_INTERNAL_H

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

/* The configuration (cuda_double.c), read once per process. */
struct dbl_cfg {
  int ndev;                 /* MESHPG_DOUBLE_DEVICES: the "node" */
  int nvis;                 /* devices this process sees */
  int phys[MAX_DEVICES];    /* visible ordinal -> physical device */
  cudaError_t init_error;   /* what every device call answers when nvis == 0 */
  unsigned late_us;         /* MESHPG_DOUBLE_LATE_US */
  uint64_t seed;            /* MESHPG_DOUBLE_SEED */
  double hang_s;            /* MESHPG_DOUBLE_HANG_S */
  size_t quarantine;        /* bytes of freed memory kept reserved */
  int log;                  /* MESHPG_DOUBLE_LOG=1 */
};

struct dstream;

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

/* Handles are not pointers: a handle that is not ours, or stale, is
 * recognised without being dereferenced. */
#define STREAM_BASE ((uintptr_t)0x5d0000000000ull)
#define EVENT_BASE ((uintptr_t)0x5e0000000000ull)

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

struct mem_info {
  enum dbl_mem_kind kind;
  int pinned;
  uintptr_t base;
  size_t size;
  int device;
  double freed_ago;
};

/* ------------------------------------------------------------------ */
/* Shared between the files of this half (hidden: not exported)     */
/* ------------------------------------------------------------------ */

#pragma GCC visibility push(hidden)

/* cuda_double.c */
extern struct dbl_cfg cfg;
void cfg_init(void);
extern _Thread_local int tl_device;
extern _Thread_local struct dstream *tl_executor;
extern _Thread_local struct dstream **tl_ptds;
cudaError_t ret(cudaError_t e);
void cond_init_monotonic(pthread_cond_t *cv);
pthread_cond_t *my_cv(void);
extern atomic_uint_least64_t st_kernels;
extern atomic_uint_least64_t st_late;
extern atomic_uint_least64_t st_waits;
extern _Atomic uint64_t st_progress;
cudaError_t current_device(int *d);

/* cuda_double_exec.c */
extern pthread_mutex_t G;
extern struct devent *etab;
extern int netab;
extern int capetab;
extern int efree_head;
extern int *efree_next;
cudaStream_t stream_handle(const struct dstream *s);
cudaEvent_t event_handle(int idx);
struct dstream *stream_new(int device, enum skind kind, unsigned flags);
void dev_unlink(struct dstream *s);
struct ddev *dev_get(int d);
void ptds_release(void *arg);
cudaError_t stream_resolve(cudaStream_t h, struct dstream **out);
void noop(void *arg);
cudaError_t submit_locked(struct dstream *s, const char *what, int kernel, int late,
                          void (*run)(void *), void *arg, const struct dep *extra,
                          uint64_t *seq);
void host_wait(struct dstream *s, uint64_t seq, const char *why);
cudaError_t submit_and_wait(struct dstream *s, const char *what, void (*run)(void *),
                            void *arg, const char *why);

#pragma GCC visibility pop

#endif
