/* The NCCL half of the test double (nccl_double.c, which lists its files):
 * what its files share.  Not part of the double's interface (double.h):
 * everything declared at the end is hidden, so the shared library exports
 * the NCCL API and the dbl_ functions only, as before the split. */
#ifndef MESHPG_TESTS_NCCL_DOUBLE_INTERNAL_H
#define MESHPG_TESTS_NCCL_DOUBLE_INTERNAL_H

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime.h>
#include <nccl.h>

#include "double.h"

/* The reductions must round exactly like meshpg's thread backend: never
 * fuse a multiply and an add (clang contracts within expressions by
 * default, GCC in its GNU modes when the target has FMA). */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2 && ATOMIC_INT_LOCK_FREE == 2,
               "shared-memory atomics must be lock-free (address-free)");
_Static_assert(sizeof(ncclUniqueId) == NCCL_UNIQUE_ID_BYTES, "ncclUniqueId size");

#define COMM_LIVE 0x6d7067636f6d6d31ULL /* "mpgcomm1" */
#define COMM_DEAD 0x6465616463636f6dULL
#define SHM_MAGIC 0x6d70676462736d31ULL
#define MSG_MAGIC 0x6d7067646d736731ULL
#define ID_MARK "MPGDBLid"

#define FNV_START 14695981039346656037ULL

/* Operation classes.  Builtins keep NCCL's numbers (nccl.h ncclRedOp_t);
 * OPC_PREMUL is a user op from ncclRedOpCreatePreMulSum. */
enum { OPC_SUM = 0, OPC_PROD = 1, OPC_MAX = 2, OPC_MIN = 3, OPC_AVG = 4, OPC_PREMUL = 5 };

/* A word that sleepers wait on and publishers bump; `shared` selects a
 * futex across processes (the word is in a MAP_SHARED segment). */
struct wakeword {
  _Atomic uint32_t seq;
  _Atomic uint32_t waiters;
};

/* Functions, as in the descriptors. */
enum { F_NONE = 0, F_AR, F_BC, F_RED, F_AG, F_RS, F_SEND, F_RECV };

/* An operation as a rank published it.  Every field is atomic: the owner
 * writes it while peers may read it for reports. */
struct shm_desc {
  _Atomic uint64_t seq, count, scalar;
  _Atomic int32_t func, dtype, op, root, reg, pad_;
};

/* Member states. */
enum { RS_EMPTY = 0, RS_CLAIMED, RS_JOINED, RS_LEFT, RS_ABORTED };

struct shm_rank {
  _Atomic int32_t state;
  /* Written once before state = RS_JOINED (release), read after it. */
  int32_t pid, device, world_rank;
  uint64_t host_hash;
  int64_t busid;
  /* Collective position: (collective number << 32) | chunks written. */
  _Atomic uint64_t pos;
  _Atomic uint64_t launches;   /* kernels started (reports) */
  struct shm_desc desc[2];     /* collective k's call, by k % 2 */
  struct shm_desc issued;      /* the last operation the host issued */
  _Atomic uint64_t colls_issued;
  _Atomic uint64_t split_seq;  /* splits published */
  _Atomic int32_t split_color[2], split_key[2];
  char pad_[64];
};

/* One direction of a pair of ranks: a byte ring written by the sender
 * (head) and consumed by the receiver (tail), cumulative counts. */
struct shm_chan {
  _Atomic uint64_t head, tail;
  _Atomic uint64_t sends_started, recvs_started;
  char pad_[32];
};

enum { SEG_JOINING = 0, SEG_COMPLETE = 1 };

struct shm_hdr {
  _Atomic uint64_t magic; /* set last by the creator (release) */
  int32_t nranks, version;
  uint64_t bytes, bank, ring;
  uint64_t off_ranks, off_slots, off_chans;
  uint64_t nonce; /* random, per segment: names the children */
  struct wakeword wake;
  _Atomic int32_t joined, status, unlinked, pad_;
  char name[48];
  /* NULL in a shared segment; in a socket communicator's private replica
   * (nccl_double_net.c), its connections. */
  void *net;
};

/* Message header in a ring (32 bytes: messages are padded to 32). */
struct msg_hdr {
  uint64_t magic, seq, bytes;
  int32_t dtype, reg;
};
_Static_assert(sizeof(struct msg_hdr) == 32, "message header");

struct layout {
  uint64_t bank, ring, off_ranks, off_slots, off_chans, chan_stride, bytes;
};

static inline struct shm_rank *seg_rank(struct shm_hdr *h, int r) {
  return (struct shm_rank *)((char *)h + h->off_ranks) + r;
}
static inline char *seg_slot(struct shm_hdr *h, int r, int bank) {
  return (char *)h + h->off_slots + ((uint64_t)r * 2 + (uint64_t)bank) * h->bank;
}
static inline struct shm_chan *seg_chan(struct shm_hdr *h, int src, int dst) {
  return (struct shm_chan *)((char *)h + h->off_chans +
                             ((uint64_t)src * (uint64_t)h->nranks + (uint64_t)dst) *
                                 (sizeof(struct shm_chan) + h->ring));
}
static inline char *chan_ring(struct shm_chan *c) { return (char *)(c + 1); }

/* What a splitShare family shares (NCCL's sharedRes and abort flag,
 * init.cc:2580-2590): the abort flag, and the serialisation of kernels
 * (tickets in host issue order, enqueue.cc:1495-1502 and 1716-1723: a
 * communicator's launch waits on its device stream, which then waits on
 * the launch). */
struct dbl_shared {
  _Atomic int abort;
  _Atomic uint64_t tickets, done;
  struct wakeword wake; /* private futex: `done` moved, or abort */
  _Atomic int refs;
};

struct reg {
  char *ptr;
  size_t bytes;
  int refs;
  struct reg *next;
};

struct user_op {
  int live, dtype, residence;
  uint64_t bits;      /* ncclScalarHostImmediate: the value */
  const void *ptr;    /* ncclScalarDevice: read by the kernel */
};

struct job;

struct ncclComm {
  _Atomic uint64_t magic;      /* COMM_LIVE, COMM_DEAD once destroyed or aborted */
  struct ncclComm *all_next;   /* every communicator ever made (never freed) */
  pthread_mutex_t mu;          /* host-side state below */
  _Atomic int refs;            /* the handle, live kernels, a running job */
  char name[40];
  int rank, nranks, device, world_rank, blocking, split_share;
  uint64_t host_hash;
  int64_t busid;
  uint8_t salt;
  struct shm_hdr *shm;
  struct dbl_shared *sh;
  _Atomic int async;           /* ncclResult_t */
  char async_msg[1024];        /* guarded by mu */
  _Atomic int launch_pending;  /* non-blocking launch not yet observed */
  _Atomic int finalize_pending;
  _Atomic int revoke_pending;
  int finalize_called, revoked;
  int destroy_flag;            /* ncclCommAbort/Destroy called, reclaim pending */
  struct job *job;             /* init or split running for this comm (mu) */
  uint64_t colls_issued;       /* host side, mu */
  uint64_t *sends_issued, *recvs_issued;
  _Atomic uint64_t own_issued, own_done; /* launches, for finalize and destroy */
  uint64_t split_count;
  struct user_op *uops;
  int nuops;
  struct reg *regs;
};

#define MAX_DEV_TRACK 64

enum { FAULT_HANG = 1, FAULT_ASYNC, FAULT_KILL };
struct fault {
  int kind, rank;
  uint64_t nth;
};

#define MAX_WORLD 4096

struct task {
  int func;
  const void *send;
  void *recv;
  size_t count;
  int dtype, opc, root; /* root: also the peer of a send or receive */
  int scal_kind;        /* 0, or ncclScalarHostImmediate + 1 / ncclScalarDevice + 1 */
  uint64_t scal_bits;
  const void *scal_ptr;
  int reg;
  cudaStream_t stream;
  uint64_t seq; /* assigned at launch */
};

struct plan {
  struct ncclComm *comm;
  struct task *tasks;
  int n, cap;
  struct plan *next;
};

/* Jobs: init and split run in threads (NCCL's async jobs); finalize,
 * abort and destroy are reclaims run by the outermost ncclGroupEnd. */
enum { JOB_INIT = 1, JOB_SPLIT, JOB_FINALIZE, JOB_ABORT, JOB_DESTROY };
struct job {
  int kind;
  struct ncclComm *comm;   /* INIT: the new comm; SPLIT: the parent */
  struct ncclComm *child;  /* SPLIT, NULL for NCCL_SPLIT_NOCOLOR */
  ncclComm_t *newcomm;     /* SPLIT */
  int color, key;
  uint64_t split_seq;
  pthread_t thread;
  int started;
  _Atomic int done;
  _Atomic int joined;
  ncclResult_t result;
  char env_id[128];        /* INIT: the NCCL_COMM_ID text its id came from, or "" */
  char id[NCCL_UNIQUE_ID_BYTES]; /* INIT: the unique id (its bootstrap root) */
  struct job *next;        /* in the group */
};

/* Collective states: arrive (publish the call), match (every rank has
 * arrived, calls compared), then per chunk write (own contribution into
 * the staging bank) and read (every rank wrote: combine). */
enum { CS_ARRIVE = 0, CS_MATCH, CS_WRITE, CS_READ, CS_DONE };
/* Send/receive states. */
enum { PS_START = 0, PS_HDR, PS_DATA, PS_ACK, PS_DONE };

struct ktask {
  struct task t;
  int st;
  uint64_t chunk, nchunks;
  size_t ch;          /* elements per chunk (per rank block for reduce-scatter) */
  uint64_t *scal;     /* every rank's pre-multiplier (PreMulSum) */
  uint64_t bytes, total, done, end;
  int prev;           /* send/receive: the previous one on the same ring, or -1 */
};

struct launch {
  struct ncclComm *comm;
  _Atomic uint64_t ticket;
  int n;
  struct ktask *k;
  int world_rank;
  uint64_t nth_first, nth_last;
  const char **srcs;  /* n ranks' staging pointers for a reduction */
  int dead_reported;
  void *acc;          /* f32/f64 accumulator, 2 banks' worth */
  char what[256];
};

static inline int is_coll(int f) { return f >= F_AR && f <= F_RS; }
static inline int is_reduction(int f) { return f == F_AR || f == F_RED || f == F_RS; }

struct dsc {
  uint64_t seq, count, scalar;
  int func, dtype, op, root, reg;
};

/* A rank as the bootstrap root hands it out (nccl_double_net.c). */
struct net_peer {
  uint64_t host_hash;
  int64_t busid;
  int32_t pid, device, world_rank;
  uint32_t ip;   /* its listener, IPv4, network order */
  uint16_t port; /* network order */
  uint16_t pad_[3];
};

/* What a rank's write to its own part of a replica is sent as. */
enum { PUB_COPY = 1, PUB_A64, PUB_A32, PUB_BYE };

/* ------------------------------------------------------------------ */
/* Shared between the files of this half (hidden: not exported)     */
/* ------------------------------------------------------------------ */

#pragma GCC visibility push(hidden)

/* nccl_double.c */
void run_reclaim(struct job *j);

/* nccl_double_reduce.c */
extern _Thread_local char tl_last_error[1024];
void faults_parse(void);
void env_init(void);
void warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
double hang_seconds(void);
void sleep_us(long us);
uint64_t fnv1a(uint64_t h, const void *p, size_t n);
size_t dt_size(int dt);
const char *dt_name(int dt);
const char *op_name(int opc);
void reduce_elems(int dt, int opc, int n, const char *const *src, void *dst, size_t len,
                  const uint64_t *scal_bits, void *acc);
void ww_bump(struct wakeword *w, int shared);
void ww_sleep(struct wakeword *w, uint32_t seen, int ms, int shared);

/* nccl_double_segment.c */
const char *func_name(int f);
void seg_unlink_once(struct shm_hdr *h);
int pid_dead(int32_t pid);
struct shm_hdr *seg_open(const char *name, int n, volatile _Atomic int *abort_flag);
struct shm_hdr *seg_private(const char *name, int n);

/* nccl_double_net.c */
void net_id_fill(ncclUniqueId *id);
int net_id_root(const char *id, uint32_t *ip, uint16_t *port);
ncclResult_t net_bootstrap(struct ncclComm *c, const char *id, struct net_peer **peers,
                           uint64_t *key, uint64_t *nonce, char *msg, size_t msglen);
ncclResult_t net_join(struct ncclComm *c, struct net_peer *peers, uint64_t key,
                      uint64_t nonce, volatile _Atomic int *parent_abort, char *msg,
                      size_t msglen);
void net_pub(struct shm_hdr *h, int kind, int dest, const volatile void *p, size_t n);
void net_pub_ring(struct shm_hdr *h, int dest, const char *ring, uint64_t R, uint64_t at,
                  uint64_t n);
int rank_dead(struct shm_hdr *h, int r);
int net_peer_left(struct shm_hdr *h, int r);
struct net_peer net_peer_of(struct shm_hdr *h, int i);
uint64_t net_key_of(struct shm_hdr *h);
void net_leave(struct shm_hdr *h);

/* nccl_double_comm.c */
extern _Thread_local int tl_world_rank;
extern pthread_mutex_t drain_mu;
extern char drain_what[MAX_DEV_TRACK][256];
void drain_device(int device, const char *call, struct ncclComm *c);
struct ncclComm *comm_new(void);
struct dbl_shared *shared_new(void);
void comm_ref(struct ncclComm *c);
void comm_unref(struct ncclComm *c);
void set_async(struct ncclComm *c, ncclResult_t r, const char *msg);
void show_async_msg(struct ncclComm *c);
int comm_aborted(struct ncclComm *c);
void wake_kernels(struct ncclComm *c);
extern _Atomic uint64_t ops_issued_by[MAX_WORLD];
const struct fault *fault_hit(int kind, int wr, uint64_t first, uint64_t last);
extern _Thread_local int g_depth;
extern _Thread_local ncclResult_t g_error;
extern _Thread_local int g_blocking;
extern _Thread_local struct plan *g_plans;
extern _Thread_local struct job *g_jobs;
extern _Thread_local char g_poisoned[512];
void check_poisoned(const char *call);
ncclResult_t group_err(ncclResult_t r);
ncclResult_t group_mode(int blocking);
struct plan *plan_for(struct ncclComm *c);
void plans_free(void);
void id_to_name(const ncclUniqueId *id, char *name, size_t n);
int64_t busid_of(int device);
void *job_main(void *arg);
void job_join(struct job *j);
void job_free(struct job *j);
ncclResult_t comm_state(struct ncclComm *c);
ncclResult_t comm_count_issued(struct ncclComm *c, int n, char *msg, size_t msglen);

/* nccl_double_kernel.c */
void desc_store(struct shm_desc *d, const struct task *t, uint64_t scalar);
void task_text(const struct task *t, char *b, size_t n);
void launch_free(struct launch *L);
void launch_run(void *arg);

/* nccl_double_launch.c */
ncclResult_t cuda_fail(cudaError_t e);
ncclResult_t group_end_internal(void);

/* nccl_double_ops.c */
ncclResult_t comm_check(struct ncclComm *c, const char *opname);
ncclResult_t ensure_ready(struct ncclComm *c);
ncclResult_t enqueue(const char *opname, const char *api, struct ncclComm *c,
                     struct task *t, ncclRedOp_t op);

#pragma GCC visibility pop

#endif
