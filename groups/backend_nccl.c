/* The NCCL backend: communicators on CUDA devices, buffers in device memory,
 * work ordered on the caller's cudaStream_t.  Fills
 * `const struct mpg__backend_ops mpg__backend_nccl` (groups/backend.h).
 *
 * Every communicator is non-blocking (config.blocking = 0) and shares its
 * resources with the communicators split from it (config.splitShare = 1), so
 * that init, split and enqueue can be bounded by the timeout and aborted.
 * After each call that may answer ncclInProgress we poll
 * ncclCommGetAsyncError until the state leaves ncclInProgress or the
 * deadline passes; then the communicator is aborted and the call fails with
 * MPG_ERR_TIMEOUT.  We poll after ncclSuccess too: ncclCommSplit on a
 * non-blocking communicator answers ncclSuccess while its job still runs
 * (seen with NCCL 2.28.3 on an H100), and one ncclCommGetAsyncError costs
 * nothing when all is done.
 *
 * Unique-id bootstrap, without a server of our own, first match wins:
 *   1. the caller's 128-byte id (opts.nccl_id);
 *   2. a world of one rank: ncclGetUniqueId locally;
 *   3. launched by mpirun and built with MPI (MPI initialised, or
 *      OMPI_COMM_WORLD_SIZE set): MPI rank 0 calls ncclGetUniqueId and
 *      broadcasts it (MPI_Ibcast on MPI_COMM_WORLD or *args->mpi_comm);
 *   4. NCCL's own rendezvous: NCCL_COMM_ID (as set by the user, or set here
 *      to MASTER_ADDR:MASTER_PORT for the duration of the id and init calls).
 *      Every rank's ncclGetUniqueId then returns the same id and rank 0's
 *      init starts the root, listening on that port.
 *   Nothing usable gives MPG_ERR_ENV naming MASTER_ADDR / MASTER_PORT.
 *   Note: under torchrun the agent's store already listens on MASTER_PORT
 *   on the master host; set NCCL_COMM_ID=host:otherport there.
 *
 * Every group after the world is made by ncclCommSplit of the world (no id).
 *
 * Abort: ncclCommAbort.  With splitShare the communicators of one family
 * share NCCL's abort flag, so aborting one of them stops the kernels of all
 * of them: the generic layer (groups.c, abort_all) therefore always aborts
 * the whole context, never one group.  Each communicator has a mutex held
 * around every NCCL call on it (released while polling), so abort never
 * runs while another of our threads is inside NCCL for that communicator.
 *
 * Size-1 groups (backend op `local`) have no communicator: the copy is a
 * cudaMemcpyAsync on the caller's stream, and a scaled sum runs a small
 * elementwise kernel written in PTX below, loaded once with
 * cudaLibraryLoadData (no nvcc needed).  Both return once enqueued: the
 * result is ordered on the stream like any other CUDA work.
 *
 * Exactly these external calls are used:
 *   NCCL:  ncclGetUniqueId, ncclCommInitRankConfig, ncclCommSplit,
 *          ncclCommGetAsyncError, ncclCommCount, ncclCommUserRank,
 *          ncclCommFinalize, ncclCommDestroy, ncclCommAbort,
 *          ncclGetErrorString, ncclGetLastError, ncclAllReduce,
 *          ncclBroadcast, ncclAllGather, ncclReduceScatter, ncclSend,
 *          ncclRecv, ncclGroupStart, ncclGroupEnd, ncclRedOpCreatePreMulSum,
 *          ncclRedOpDestroy.
 *   CUDA runtime:  cudaGetDeviceCount, cudaGetDevice, cudaSetDevice,
 *          cudaGetLastError, cudaGetErrorString, cudaEventCreateWithFlags,
 *          cudaEventRecord, cudaEventQuery, cudaEventDestroy, cudaMalloc,
 *          cudaMemset, cudaFree, cudaMemcpyAsync, cudaLibraryLoadData,
 *          cudaLibraryGetKernel, cudaLaunchKernel.
 *   MPI (bootstrap 3 only, when built with MPI):  MPI_Initialized,
 *          MPI_Finalized, MPI_Comm_rank, MPI_Comm_size.  MPI itself has
 *          one owner, groups/mpi (groups/mpi/mpi_owner.h): this file asks
 *          it to initialise MPI if needed (mpg__mpi_acquire; MPI_Finalize
 *          then runs at exit) and to broadcast the id
 *          (mpg__mpi_bcast_bytes: MPI_Ibcast, MPI_Test).
 *   libc:  getenv, setenv, unsetenv (NCCL_COMM_ID), pthread mutex and
 *          once, sched_yield, nanosleep. */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "backend.h"
#include "mpg_config.h"

#if MPG_HAVE_MPI
#include <mpi.h>

#include "mpi/mpi_owner.h"
#endif

_Static_assert(sizeof(ncclUniqueId) == 128,
               "opts.nccl_id is documented as 128 bytes");

struct mpg__comm {
  ncclComm_t nccl;       /* NULL once aborted or destroyed */
  pthread_mutex_t lock;  /* held around every NCCL call on `nccl` */
  atomic_int aborted;    /* MPG_OK, or the reason given to abort */
  atomic_int refs;       /* 1 for the communicator + 1 per live request */
  int rank, size;        /* this rank's position and the group size */
  int device;            /* CUDA device of the communicator */
  double timeout_s;
  int *scratch;          /* one int on the device for barrier, lazily */
  struct nccl_reg *regs; /* buffers from mem_alloc(registered = 1) */
};

/* A buffer from ncclMemAlloc registered with a communicator. */
struct nccl_reg {
  void *ptr;
  void *handle;
  struct nccl_reg *next;
};

struct mpg__req {
  mpg__comm *comm;
  cudaEvent_t event;     /* recorded on the stream after the enqueue */
  mpg__coll_kind kind;
  mpg_dtype dtype;
  mpg_op op;
  size_t count;
  int done;
  mpg_status status;
};

/* ------------------------------------------------------------------ */
/* Small helpers                                                       */
/* ------------------------------------------------------------------ */

static int map_dtype(mpg_dtype dt, ncclDataType_t *out) {
  switch (dt) {
    case MPG_F32: *out = ncclFloat32; return 1;
    case MPG_F64: *out = ncclFloat64; return 1;
    case MPG_F16: *out = ncclFloat16; return 1;
    case MPG_BF16: *out = ncclBfloat16; return 1;
    case MPG_I32: *out = ncclInt32; return 1;
    case MPG_I64: *out = ncclInt64; return 1;
  }
  return 0;
}

/* Native ops; MPG_OP_PREMUL_SUM is created per call. */
static int map_op(mpg_op op, ncclRedOp_t *out) {
  switch (op) {
    case MPG_OP_SUM: *out = ncclSum; return 1;
    case MPG_OP_AVG: *out = ncclAvg; return 1;
    case MPG_OP_MAX: *out = ncclMax; return 1;
    case MPG_OP_MIN: *out = ncclMin; return 1;
    case MPG_OP_PREMUL_SUM: return 0;
  }
  return 0;
}

static int uses_op(mpg__coll_kind k) {
  return k == MPG__ALL_REDUCE || k == MPG__REDUCE_SCATTER;
}

/* "all_reduce(f32, sum, count 1024) on rank 3 of a group of 8" */
static void describe(char *buf, size_t n, const mpg__comm *c,
                     mpg__coll_kind kind, mpg_dtype dt, mpg_op op,
                     size_t count) {
  if (kind == MPG__BARRIER)
    snprintf(buf, n, "nccl barrier on rank %d of a group of %d", c->rank,
             c->size);
  else if (uses_op(kind))
    snprintf(buf, n, "nccl %s(%s, %s, count %zu) on rank %d of a group of %d",
             mpg__kind_name(kind), mpg_dtype_name(dt), mpg__op_name(op), count, c->rank,
             c->size);
  else
    snprintf(buf, n, "nccl %s(%s, count %zu) on rank %d of a group of %d",
             mpg__kind_name(kind), mpg_dtype_name(dt), count, c->rank, c->size);
}

/* NCCL's own detail for the last failure ("" when it has none). */
static const char *nccl_detail(void) {
  const char *s = ncclGetLastError(NULL); /* comm is unused by NCCL */
  return s ? s : "";
}

static mpg_status fail_nccl(mpg_status st, const char *what, const char *call,
                            ncclResult_t r) {
  const char *d = nccl_detail();
  return mpg__fail(st, "%s: %s: %s%s%s", what, call, ncclGetErrorString(r),
                   d[0] ? ": " : "", d);
}

static mpg_status fail_cuda(mpg_status st, const char *what, const char *call,
                            cudaError_t e) {
  (void)cudaGetLastError(); /* clear a non-sticky error for the caller */
  return mpg__fail(st, "%s: %s: %s", what, call, cudaGetErrorString(e));
}

/* Yield for the first polls, then sleep 2 us doubling up to about 1 ms. */
static void backoff(unsigned *spins) {
  if (*spins < 64) {
    sched_yield();
  } else {
    unsigned k = *spins - 64;
    long ns = 2000L << (k < 9 ? k : 9);
    struct timespec ts = {0, ns};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
  }
  (*spins)++;
}

/* Make `dev` current, remembering the caller's device in *old. */
static cudaError_t dev_enter(int dev, int *old) {
  cudaError_t e = cudaGetDevice(old);
  if (e != cudaSuccess) return e;
  return *old == dev ? cudaSuccess : cudaSetDevice(dev);
}

static void dev_leave(int dev, int old) {
  if (old != dev) (void)cudaSetDevice(old);
}

static ncclConfig_t make_config(void) {
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;   /* init, split and enqueue may answer ncclInProgress */
  cfg.splitShare = 1; /* children split from this one share its resources */
  return cfg;
}

static mpg__comm *comm_new(int device, double timeout_s) {
  mpg__comm *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  if (pthread_mutex_init(&c->lock, NULL) != 0) {
    free(c);
    return NULL;
  }
  atomic_init(&c->aborted, MPG_OK);
  atomic_init(&c->refs, 1);
  c->device = device;
  c->timeout_s = timeout_s > 0 ? timeout_s : 600.0;
  return c;
}

static void comm_unref(mpg__comm *c) {
  if (atomic_fetch_sub(&c->refs, 1) != 1) return;
  pthread_mutex_destroy(&c->lock);
  free(c);
}

/* Poll the async state of `h` until it leaves ncclInProgress.  h is c->nccl
 * or a handle c's lock guards (a split parent).  Called and returns with
 * c->lock held; releases it while sleeping so the abort op can get in.
 * Returns MPG_OK with the final state in *res; MPG_ERR_TIMEOUT when still
 * in progress at `deadline`; or the abort reason when c was aborted in the
 * meantime (h is then gone). */
static mpg_status settle_locked(mpg__comm *c, ncclComm_t h, double deadline,
                                ncclResult_t *res) {
  unsigned spins = 0;
  for (;;) {
    ncclResult_t state = ncclInProgress;
    ncclResult_t r = ncclCommGetAsyncError(h, &state);
    if (r != ncclSuccess) {
      *res = r;
      return MPG_OK;
    }
    if (state != ncclInProgress) {
      *res = state;
      return MPG_OK;
    }
    if (mpg__now() > deadline) {
      *res = ncclInProgress;
      return MPG_ERR_TIMEOUT;
    }
    pthread_mutex_unlock(&c->lock);
    backoff(&spins);
    pthread_mutex_lock(&c->lock);
    int why = atomic_load(&c->aborted);
    if (why != MPG_OK) {
      *res = ncclInProgress;
      return (mpg_status)why;
    }
  }
}

/* Abort with c->lock held.  Returns 1 if this call did the abort. */
static int abort_locked(mpg__comm *c, mpg_status reason) {
  int expected = MPG_OK;
  if (reason == MPG_OK) reason = MPG_ERR_ABORTED;
  int first = atomic_compare_exchange_strong(&c->aborted, &expected, (int)reason);
  if (c->nccl) {
    (void)ncclCommAbort(c->nccl);
    c->nccl = NULL;
  }
  return first;
}

/* ------------------------------------------------------------------ */
/* Unique id bootstrap                                                 */
/* ------------------------------------------------------------------ */

enum boot { BOOT_NONE, BOOT_CALLER, BOOT_LOCAL, BOOT_MPI, BOOT_ENV, BOOT_MASTER };

/* Serialises the NCCL_COMM_ID window (setenv .. init .. unsetenv). */
static pthread_mutex_t env_lock = PTHREAD_MUTEX_INITIALIZER;

#if MPG_HAVE_MPI
/* MPI is initialised, or this process was started by mpirun. */
static int mpi_launched(void) {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (fin) return 0;
  if (init) return 1;
  const char *s = getenv("OMPI_COMM_WORLD_SIZE");
  return s && s[0];
}

/* Bootstrap 3.  MPI has one owner, groups/mpi (the rule is in
 * groups/mpi/mpi_owner.h): it initialises MPI here if nobody has, and then
 * finalises it at exit, never earlier; a broadcast that times out counts
 * as a fault there, and MPI, which may still complete it, writes into
 * memory that groups/mpi keeps on its orphan list. */
static mpg_status mpi_bcast_id(const mpg__world_args *a, ncclUniqueId *id,
                               double deadline) {
  if (mpg__mpi_acquire(MPI_THREAD_MULTIPLE) != MPI_SUCCESS)
    return mpg__fail(MPG_ERR_ENV,
                     "nccl bootstrap: OMPI_COMM_WORLD_SIZE is set but "
                     "MPI_Init_thread failed on rank %d",
                     a->rank);
  MPI_Comm comm = a->mpi_comm ? *(MPI_Comm *)a->mpi_comm : MPI_COMM_WORLD;
  int me = -1, n = 0;
  MPI_Comm_rank(comm, &me);
  MPI_Comm_size(comm, &n);
  if (n != a->world_size)
    return mpg__fail(MPG_ERR_ENV,
                     "nccl bootstrap: the MPI communicator has %d processes "
                     "but the world has %d ranks",
                     n, a->world_size);
  memset(id, 0, sizeof *id);
  if (me == 0) {
    pthread_mutex_lock(&env_lock);
    ncclResult_t r = ncclGetUniqueId(id);
    pthread_mutex_unlock(&env_lock);
    if (r != ncclSuccess)
      return fail_nccl(MPG_ERR_BACKEND, "nccl bootstrap (MPI rank 0)",
                       "ncclGetUniqueId", r);
  }
  switch (mpg__mpi_bcast_bytes(comm, id, (int)sizeof *id, deadline)) {
    case MPG__MPI_BCAST_DONE:
      return MPG_OK;
    case MPG__MPI_BCAST_POST_FAILED:
      return mpg__fail(MPG_ERR_BACKEND,
                       "nccl bootstrap: MPI_Ibcast of the unique id failed on "
                       "MPI rank %d",
                       me);
    case MPG__MPI_BCAST_TEST_FAILED:
      return mpg__fail(MPG_ERR_BACKEND,
                       "nccl bootstrap: MPI_Test on the unique id broadcast "
                       "failed on MPI rank %d",
                       me);
    case MPG__MPI_BCAST_TIMEOUT:
      break;
  }
  return mpg__fail(MPG_ERR_TIMEOUT,
                   "nccl bootstrap: MPI rank %d did not receive the "
                   "unique id from MPI rank 0 within the timeout",
                   me);
}
#endif

static enum boot pick_boot(const mpg__world_args *a) {
  if (a->nccl_id) return BOOT_CALLER;
  if (a->world_size == 1) return BOOT_LOCAL;
#if MPG_HAVE_MPI
  if (mpi_launched()) return BOOT_MPI;
#endif
  const char *env = getenv("NCCL_COMM_ID");
  if (env && env[0]) return BOOT_ENV;
  if (a->master_addr && a->master_addr[0] && a->master_port > 0)
    return BOOT_MASTER;
  return BOOT_NONE;
}

static void boot_name(enum boot b, const mpg__world_args *a, char *buf,
                      size_t n) {
  switch (b) {
    case BOOT_NONE: break;
    case BOOT_CALLER: snprintf(buf, n, "the caller (opts.nccl_id)"); return;
    case BOOT_LOCAL: snprintf(buf, n, "ncclGetUniqueId (world of one rank)"); return;
    case BOOT_MPI: snprintf(buf, n, "MPI_Ibcast from MPI rank 0"); return;
    case BOOT_ENV:
      snprintf(buf, n, "NCCL_COMM_ID=%s", getenv("NCCL_COMM_ID") ? getenv("NCCL_COMM_ID") : "");
      return;
    case BOOT_MASTER:
      snprintf(buf, n, "NCCL_COMM_ID from MASTER_ADDR=%s MASTER_PORT=%d",
               a->master_addr, a->master_port);
      return;
  }
  snprintf(buf, n, "?");
}

static void nccl_abort(mpg__comm *c, mpg_status reason);

/* ------------------------------------------------------------------ */
/* world_init / split                                                  */
/* ------------------------------------------------------------------ */

static mpg_status nccl_world_init(const mpg__world_args *a, mpg__comm **out) {
  *out = NULL;
  if (!a || a->world_size < 1 || a->rank < 0 || a->rank >= a->world_size)
    return mpg__fail(MPG_ERR_INVALID, "nccl world_init: rank %d outside a world of %d",
                     a ? a->rank : -1, a ? a->world_size : 0);
  double timeout = a->timeout_s > 0 ? a->timeout_s : 600.0;
  double deadline = mpg__now() + timeout;

  /* 1. How the ranks agree on the id.  Checked before touching CUDA. */
  enum boot how = pick_boot(a);
  if (how == BOOT_NONE)
    return mpg__fail(MPG_ERR_ENV,
                     "nccl: rank %d of %d has no way to agree on the NCCL "
                     "unique id: set MASTER_ADDR and MASTER_PORT (torchrun "
                     "style) or NCCL_COMM_ID=host:port, launch with mpirun "
                     "(meshpg built with MPI), or pass opts.nccl_id",
                     a->rank, a->world_size);
  char via[320];
  boot_name(how, a, via, sizeof via);

  /* 2. The device. */
  int ndev = 0;
  cudaError_t ce = cudaGetDeviceCount(&ndev);
  if (ce != cudaSuccess || ndev < 1) {
    (void)cudaGetLastError();
    return mpg__fail(MPG_ERR_UNSUPPORTED,
                     "nccl: no CUDA device for rank %d of %d "
                     "(cudaGetDeviceCount: %s)",
                     a->rank, a->world_size,
                     ce != cudaSuccess ? cudaGetErrorString(ce) : "0 devices");
  }
  int dev = a->device >= 0 ? a->device : a->local_rank;
  if (dev < 0 || dev >= ndev)
    return mpg__fail(a->device >= 0 ? MPG_ERR_INVALID : MPG_ERR_ENV,
                     "nccl: rank %d of %d wants CUDA device %d (%s) but this "
                     "machine has %d (0..%d)",
                     a->rank, a->world_size, dev,
                     a->device >= 0 ? "opts.device" : "the local rank", ndev,
                     ndev - 1);
  ce = cudaSetDevice(dev);
  if (ce != cudaSuccess) {
    char what[96];
    snprintf(what, sizeof what, "nccl world_init (rank %d of %d)", a->rank,
             a->world_size);
    return fail_cuda(MPG_ERR_BACKEND, what, "cudaSetDevice", ce);
  }

  mpg__comm *c = comm_new(dev, timeout);
  if (!c) return mpg__fail(MPG_ERR_NOMEM, "nccl world_init: out of memory");
  c->rank = a->rank;
  c->size = a->world_size;

  char what[480];
  snprintf(what, sizeof what,
           "nccl world init (rank %d of %d, CUDA device %d, id from %s)",
           a->rank, a->world_size, dev, via);

  /* 3. The id, and 4. the init call.  env_lock is held from the id to the
   * init call on every path, so that an NCCL_COMM_ID we set for one world
   * never reaches another world's ncclGetUniqueId or rank-0 init. */
  ncclUniqueId id;
  memset(&id, 0, sizeof id);
  mpg_status st = MPG_OK;
  ncclResult_t r = ncclSuccess;
  int env_set_here = 0;
#if MPG_HAVE_MPI
  if (how == BOOT_MPI) st = mpi_bcast_id(a, &id, deadline); /* may block */
#endif
  pthread_mutex_lock(&env_lock);
  switch (how) {
    case BOOT_NONE:
    case BOOT_MPI:
      break;
    case BOOT_CALLER:
      memcpy(&id, a->nccl_id, sizeof id);
      break;
    case BOOT_LOCAL:
      r = ncclGetUniqueId(&id);
      break;
    case BOOT_ENV:
    case BOOT_MASTER:
      if (!getenv("NCCL_COMM_ID")) {
        char hostport[320];
        int v6 = strchr(a->master_addr, ':') && a->master_addr[0] != '[';
        snprintf(hostport, sizeof hostport, v6 ? "[%s]:%d" : "%s:%d",
                 a->master_addr, a->master_port);
        if (setenv("NCCL_COMM_ID", hostport, 0) == 0) env_set_here = 1;
      }
      r = ncclGetUniqueId(&id);
      break;
  }
  if (st != MPG_OK || r != ncclSuccess) {
    if (env_set_here) unsetenv("NCCL_COMM_ID");
    pthread_mutex_unlock(&env_lock);
    comm_unref(c);
    return st != MPG_OK ? st : fail_nccl(MPG_ERR_BACKEND, what, "ncclGetUniqueId", r);
  }

  ncclConfig_t cfg = make_config();
  pthread_mutex_lock(&c->lock);
  r = ncclCommInitRankConfig(&c->nccl, a->world_size, id, a->rank, &cfg);
  /* NCCL reads NCCL_COMM_ID synchronously in the call above. */
  if (env_set_here) unsetenv("NCCL_COMM_ID");
  pthread_mutex_unlock(&env_lock);
  /* Poll even after ncclSuccess: a non-blocking call may return before its
   * background job has finished. */
  if ((r == ncclSuccess || r == ncclInProgress) && c->nccl)
    st = settle_locked(c, c->nccl, deadline, &r);
  if (st == MPG_OK && r == ncclSuccess) {
    pthread_mutex_unlock(&c->lock);
    mpg__log(1, "nccl: rank %d of %d up on CUDA device %d (unique id from %s)",
             a->rank, a->world_size, dev, via);
    *out = c;
    return MPG_OK;
  }
  if (c->nccl) (void)ncclCommAbort(c->nccl);
  c->nccl = NULL;
  pthread_mutex_unlock(&c->lock);
  comm_unref(c);
  if (st == MPG_ERR_TIMEOUT)
    return mpg__fail(MPG_ERR_TIMEOUT,
                     "%s: not every rank connected within %.3g s (did all %d "
                     "ranks start, with the same id?)",
                     what, timeout, a->world_size);
  if (st != MPG_OK) return mpg__fail(st, "%s: aborted while connecting", what);
  return fail_nccl(MPG_ERR_BACKEND, what, "ncclCommInitRankConfig", r);
}

static mpg_status nccl_split(mpg__comm *p, int color, int key,
                             mpg__comm **out) {
  *out = NULL;
  char what[160];
  snprintf(what, sizeof what, "nccl split (colour %d, key %d) of rank %d of a group of %d",
           color, key, p->rank, p->size);
  int why = atomic_load(&p->aborted);
  if (why != MPG_OK)
    return mpg__fail(MPG_ERR_ABORTED, "%s: the parent communicator was aborted (%s)",
                     what, mpg_status_name((mpg_status)why));
  double deadline = mpg__now() + p->timeout_s;
  mpg__comm *c = NULL;
  if (color >= 0) {
    c = comm_new(p->device, p->timeout_s);
    if (!c) return mpg__fail(MPG_ERR_NOMEM, "%s: out of memory", what);
  }
  /* NCCL writes the new handle from its init thread when the job ends.
   * The cell is on the heap: after a timeout it is left to that thread
   * (a few bytes, once per aborted context) rather than freed under it. */
  ncclComm_t *cell = calloc(1, sizeof *cell);
  if (!cell) {
    if (c) comm_unref(c);
    return mpg__fail(MPG_ERR_NOMEM, "%s: out of memory", what);
  }
  ncclComm_t child = NULL;
  ncclConfig_t cfg = make_config();
  int old = -1;
  cudaError_t ce = dev_enter(p->device, &old);
  if (ce != cudaSuccess) {
    free(cell);
    if (c) comm_unref(c);
    return fail_cuda(MPG_ERR_BACKEND, what, "cudaSetDevice", ce);
  }
  mpg_status st = MPG_OK;
  pthread_mutex_lock(&p->lock);
  if (!p->nccl) {
    pthread_mutex_unlock(&p->lock);
    dev_leave(p->device, old);
    free(cell);
    if (c) comm_unref(c);
    return mpg__fail(MPG_ERR_ABORTED, "%s: the parent communicator is gone", what);
  }
  ncclResult_t r = ncclCommSplit(p->nccl, color >= 0 ? color : NCCL_SPLIT_NOCOLOR,
                                 key, cell, &cfg);
  /* The split runs as a job of the parent: poll the parent.  NCCL 2.28
   * answers ncclSuccess here while the job still runs, so always poll. */
  if (r == ncclSuccess || r == ncclInProgress)
    st = settle_locked(p, p->nccl, deadline, &r);
  if (st == MPG_ERR_TIMEOUT) abort_locked(p, MPG_ERR_TIMEOUT);
  pthread_mutex_unlock(&p->lock);

  /* NCCL stores the child from its init thread as the job ends; once the
   * parent has settled it is there.  Both waits below are bounded and run
   * without the parent's lock, so the abort op is never held up. */
  if (st == MPG_OK && r == ncclSuccess && color >= 0) {
    unsigned spins = 0;
    while (!__atomic_load_n(cell, __ATOMIC_ACQUIRE) && st == MPG_OK) {
      if (mpg__now() > deadline) st = MPG_ERR_TIMEOUT;
      else if (atomic_load(&p->aborted) != MPG_OK) st = (mpg_status)atomic_load(&p->aborted);
      else backoff(&spins);
    }
  }
  child = __atomic_load_n(cell, __ATOMIC_ACQUIRE);
  if (st == MPG_OK) free(cell); /* else NCCL may still write it */
  if (st == MPG_OK && r == ncclSuccess && child) {
    ncclResult_t state = ncclInProgress;
    unsigned spins = 0;
    while ((r = ncclCommGetAsyncError(child, &state)) == ncclSuccess &&
           state == ncclInProgress && st == MPG_OK) {
      if (mpg__now() > deadline) st = MPG_ERR_TIMEOUT;
      else backoff(&spins);
    }
    if (r == ncclSuccess) r = state == ncclInProgress ? ncclSuccess : state;
  }
  if (st == MPG_ERR_TIMEOUT) nccl_abort(p, MPG_ERR_TIMEOUT);

  if (st != MPG_OK || r != ncclSuccess) {
    if (child) (void)ncclCommAbort(child);
    dev_leave(p->device, old);
    if (c) comm_unref(c);
    if (st == MPG_ERR_TIMEOUT)
      return mpg__fail(MPG_ERR_TIMEOUT,
                       "%s: not every rank of the parent entered the split "
                       "within %.3g s (the context is being aborted)",
                       what, p->timeout_s);
    if (st != MPG_OK) return mpg__fail(st, "%s: aborted while splitting", what);
    return fail_nccl(MPG_ERR_BACKEND, what, "ncclCommSplit", r);
  }
  dev_leave(p->device, old);
  if (color < 0) {
    if (child) (void)ncclCommAbort(child); /* not expected with NOCOLOR */
    mpg__log(2, "nccl: rank %d joined no group in a split", p->rank);
    return MPG_OK;
  }
  if (!child) {
    comm_unref(c);
    return mpg__fail(MPG_ERR_BACKEND, "%s: ncclCommSplit gave no communicator",
                     what);
  }
  c->nccl = child;
  int n = 0, me = -1;
  r = ncclCommCount(child, &n);
  if (r == ncclSuccess) r = ncclCommUserRank(child, &me);
  if (r != ncclSuccess) {
    (void)ncclCommAbort(child);
    c->nccl = NULL;
    comm_unref(c);
    return fail_nccl(MPG_ERR_BACKEND, what, "ncclCommCount/ncclCommUserRank", r);
  }
  c->size = n;
  c->rank = me;
  mpg__log(2, "nccl: split colour %d key %d -> rank %d of %d", color, key, me, n);
  *out = c;
  return MPG_OK;
}

/* ------------------------------------------------------------------ */
/* post / test / wait                                                  */
/* ------------------------------------------------------------------ */

/* Host scalar of the collective's dtype for ncclRedOpCreatePreMulSum. */
typedef union {
  float f;
  double d;
  uint16_t h;
} scalar_t;

static int make_scalar(mpg_dtype dt, double scale, scalar_t *s) {
  switch (dt) {
    case MPG_F32: s->f = (float)scale; return 1;
    case MPG_F64: s->d = scale; return 1;
    case MPG_F16:
    case MPG_BF16: s->h = mpg__f32_to_half(dt, (float)scale); return 1;
    case MPG_I32:
    case MPG_I64: return 0;
  }
  return 0;
}

/* Enqueue the operation on c->nccl (lock held). */
static ncclResult_t enqueue(mpg__comm *c, const mpg__coll *k, ncclDataType_t dt,
                            ncclRedOp_t op, cudaStream_t s, const char **call) {
  switch (k->kind) {
    case MPG__ALL_REDUCE:
      *call = "ncclAllReduce";
      return ncclAllReduce(k->send, k->recv, k->count, dt, op, c->nccl, s);
    case MPG__BROADCAST:
      *call = "ncclBroadcast";
      return ncclBroadcast(k->send ? k->send : k->recv, k->recv, k->count, dt,
                           k->root, c->nccl, s);
    case MPG__ALL_GATHER:
      *call = "ncclAllGather";
      return ncclAllGather(k->send, k->recv, k->count, dt, c->nccl, s);
    case MPG__REDUCE_SCATTER:
      *call = "ncclReduceScatter";
      return ncclReduceScatter(k->send, k->recv, k->count, dt, op, c->nccl, s);
    case MPG__BARRIER:
      *call = "ncclAllReduce (barrier)";
      return ncclAllReduce(c->scratch, c->scratch, 1, ncclInt32, ncclMax,
                           c->nccl, s);
    case MPG__SEND:
    case MPG__RECV: {
      *call = k->kind == MPG__SEND ? "ncclSend" : "ncclRecv";
      ncclResult_t r = ncclGroupStart();
      if (r != ncclSuccess) {
        *call = "ncclGroupStart";
        return r;
      }
      if (k->kind == MPG__SEND)
        r = ncclSend(k->send, k->count, dt, k->peer, c->nccl, s);
      else
        r = ncclRecv(k->recv, k->count, dt, k->peer, c->nccl, s);
      ncclResult_t e = ncclGroupEnd(); /* always close the group */
      if (r != ncclSuccess) return r;
      if (e != ncclSuccess) *call = "ncclGroupEnd";
      return e;
    }
  }
  *call = "?";
  return ncclInvalidArgument;
}

static mpg_status nccl_post(mpg__comm *c, const mpg__coll *k, mpg__req **out) {
  *out = NULL;
  char what[200];
  mpg_dtype dtype = k->kind == MPG__BARRIER ? MPG_I32 : k->dtype;
  describe(what, sizeof what, c, k->kind, dtype, k->op, k->count);
  int why = atomic_load(&c->aborted);
  if (why != MPG_OK)
    return mpg__fail(MPG_ERR_ABORTED, "%s: the communicator was aborted (%s)",
                     what, mpg_status_name((mpg_status)why));
  ncclDataType_t dt;
  if (!map_dtype(dtype, &dt))
    return mpg__fail(MPG_ERR_INVALID, "%s: unknown dtype %d", what, (int)dtype);
  ncclRedOp_t op = ncclSum;
  scalar_t scalar;
  int premul = uses_op(k->kind) && k->op == MPG_OP_PREMUL_SUM;
  if (uses_op(k->kind) && !premul && !map_op(k->op, &op))
    return mpg__fail(MPG_ERR_INVALID, "%s: unknown op %d", what, (int)k->op);
  if (premul && !make_scalar(dtype, k->scale, &scalar))
    return mpg__fail(MPG_ERR_INVALID, "%s: a scaled sum needs a floating dtype",
                     what);

  mpg__req *req = calloc(1, sizeof *req);
  if (!req) return mpg__fail(MPG_ERR_NOMEM, "%s: out of memory", what);
  int old = -1;
  cudaError_t ce = dev_enter(c->device, &old);
  if (ce != cudaSuccess) {
    free(req);
    return fail_cuda(MPG_ERR_BACKEND, what, "cudaSetDevice", ce);
  }
  ce = cudaEventCreateWithFlags(&req->event, cudaEventDisableTiming);
  if (ce != cudaSuccess) {
    dev_leave(c->device, old);
    free(req);
    return fail_cuda(MPG_ERR_BACKEND, what, "cudaEventCreateWithFlags", ce);
  }
  cudaStream_t stream = (cudaStream_t)k->stream;
  double deadline = mpg__now() + c->timeout_s;
  mpg_status st = MPG_OK;
  ncclResult_t r = ncclSuccess;
  const char *call = "?";

  pthread_mutex_lock(&c->lock);
  if (!c->nccl) {
    st = mpg__fail(MPG_ERR_ABORTED, "%s: the communicator is gone", what);
    goto out_locked;
  }
  if (k->kind == MPG__BARRIER && !c->scratch) {
    void *p = NULL;
    ce = cudaMalloc(&p, sizeof(int));
    if (ce == cudaSuccess) ce = cudaMemset(p, 0, sizeof(int));
    if (ce != cudaSuccess) {
      if (p) (void)cudaFree(p);
      st = fail_cuda(MPG_ERR_BACKEND, what, "cudaMalloc (barrier scratch)", ce);
      goto out_locked;
    }
    c->scratch = p;
  }
  if (k->kind != MPG__BARRIER && k->count == 0) {
    /* Nothing to move; every member skips alike.  NCCL is not called, so
     * NULL buffers of zero elements are fine. */
    premul = 0;
    goto out_result;
  }
  if (premul) {
    call = "ncclRedOpCreatePreMulSum";
    r = ncclRedOpCreatePreMulSum(&op, &scalar, dt, ncclScalarHostImmediate, c->nccl);
    if (r == ncclSuccess || r == ncclInProgress)
      st = settle_locked(c, c->nccl, deadline, &r);
    if (st != MPG_OK || r != ncclSuccess) {
      premul = 0; /* nothing to destroy */
      goto out_result;
    }
  }
  r = enqueue(c, k, dt, op, stream, &call);
  if (r == ncclSuccess || r == ncclInProgress)
    st = settle_locked(c, c->nccl, deadline, &r);
out_result:
  if (premul && c->nccl) (void)ncclRedOpDestroy(op, c->nccl);
  if (st == MPG_ERR_TIMEOUT) {
    abort_locked(c, MPG_ERR_TIMEOUT);
    st = mpg__fail(MPG_ERR_TIMEOUT,
                   "%s: %s still in progress after %.3g s (the communicator "
                   "was aborted)",
                   what, call, c->timeout_s);
  } else if (st != MPG_OK) {
    st = mpg__fail(MPG_ERR_ABORTED, "%s: aborted during %s (%s)", what, call,
                   mpg_status_name(st));
  } else if (r != ncclSuccess) {
    st = fail_nccl(MPG_ERR_BACKEND, what, call, r);
  } else {
    ce = cudaEventRecord(req->event, stream);
    if (ce != cudaSuccess) st = fail_cuda(MPG_ERR_BACKEND, what, "cudaEventRecord", ce);
  }
out_locked:
  pthread_mutex_unlock(&c->lock);
  if (st != MPG_OK) {
    (void)cudaEventDestroy(req->event);
    dev_leave(c->device, old);
    free(req);
    return st;
  }
  dev_leave(c->device, old);
  atomic_fetch_add(&c->refs, 1);
  req->comm = c;
  req->kind = k->kind;
  req->dtype = dtype;
  req->op = k->op;
  req->count = k->count;
  *out = req;
  return MPG_OK;
}

static mpg_status req_fail(mpg__req *q, mpg_status st, const char *fmt,
                           const char *detail) {
  char what[200];
  describe(what, sizeof what, q->comm, q->kind, q->dtype, q->op, q->count);
  q->done = 1;
  q->status = st;
  return mpg__fail(st, fmt, what, detail);
}

static mpg_status nccl_test(mpg__req *q, int *done) {
  *done = 0;
  if (q->done) {
    *done = 1;
    if (q->status == MPG_OK) return MPG_OK;
    char what[200];
    describe(what, sizeof what, q->comm, q->kind, q->dtype, q->op, q->count);
    return mpg__fail(q->status, "%s: failed earlier (%s)", what,
                     mpg_status_name(q->status));
  }
  mpg__comm *c = q->comm;
  cudaError_t ce = cudaEventQuery(q->event);
  if (ce == cudaSuccess) {
    q->done = 1;
    q->status = MPG_OK;
    *done = 1;
    return MPG_OK;
  }
  if (ce != cudaErrorNotReady) {
    (void)cudaGetLastError();
    *done = 1;
    return req_fail(q, MPG_ERR_BACKEND, "%s: cudaEventQuery: %s",
                    cudaGetErrorString(ce));
  }
  int why = atomic_load(&c->aborted);
  if (why != MPG_OK) {
    *done = 1;
    return req_fail(q, (mpg_status)why, "%s: the communicator was aborted (%s)",
                    mpg_status_name((mpg_status)why));
  }
  ncclResult_t state = ncclSuccess, r = ncclSuccess;
  pthread_mutex_lock(&c->lock);
  if (c->nccl) r = ncclCommGetAsyncError(c->nccl, &state);
  pthread_mutex_unlock(&c->lock);
  if (r == ncclSuccess && (state == ncclSuccess || state == ncclInProgress))
    return MPG_OK;
  ncclResult_t bad = r != ncclSuccess ? r : state;
  char detail[1024];
  const char *d = nccl_detail();
  snprintf(detail, sizeof detail, "%s%s%s", ncclGetErrorString(bad),
           d[0] ? ": " : "", d);
  *done = 1;
  return req_fail(q, MPG_ERR_BACKEND,
                  "%s: the communicator reported an asynchronous error "
                  "(ncclCommGetAsyncError): %s",
                  detail);
}

static mpg_status nccl_wait(mpg__req *q, double deadline) {
  unsigned spins = 0;
  for (;;) {
    int done = 0;
    mpg_status st = nccl_test(q, &done);
    if (st != MPG_OK || done) return st;
    if (mpg__now() > deadline) {
      char what[200];
      describe(what, sizeof what, q->comm, q->kind, q->dtype, q->op, q->count);
      return mpg__fail(MPG_ERR_TIMEOUT,
                       "%s: not complete within the %.3g s timeout (a peer "
                       "did not arrive?)",
                       what, q->comm->timeout_s);
    }
    backoff(&spins);
  }
}

static void nccl_req_free(mpg__req *q) {
  if (!q) return;
  /* Destroying an event still pending is allowed: CUDA frees it once it
   * completes. */
  (void)cudaEventDestroy(q->event);
  comm_unref(q->comm);
  free(q);
}

/* ------------------------------------------------------------------ */
/* abort / destroy                                                     */
/* ------------------------------------------------------------------ */

static void nccl_abort(mpg__comm *c, mpg_status reason) {
  if (!c) return;
  if (reason == MPG_OK) reason = MPG_ERR_ABORTED;
  /* Publish the flag first, so a thread polling under the lock lets go. */
  int expected = MPG_OK;
  atomic_compare_exchange_strong(&c->aborted, &expected, (int)reason);
  pthread_mutex_lock(&c->lock);
  if (c->nccl) {
    int old = -1;
    (void)dev_enter(c->device, &old);
    (void)ncclCommAbort(c->nccl);
    c->nccl = NULL;
    dev_leave(c->device, old);
    mpg__log(1, "nccl: rank %d of a group of %d aborted (%s)", c->rank, c->size,
             mpg_status_name(reason));
  }
  pthread_mutex_unlock(&c->lock);
}

static mpg_status nccl_destroy(mpg__comm *c) {
  if (!c) return MPG_OK;
  mpg_status st = MPG_OK;
  int old = -1;
  (void)dev_enter(c->device, &old);
  pthread_mutex_lock(&c->lock);
  if (c->nccl && atomic_load(&c->aborted) == MPG_OK) {
    char what[96];
    snprintf(what, sizeof what, "nccl destroy (rank %d of a group of %d)",
             c->rank, c->size);
    double deadline = mpg__now() + c->timeout_s;
    ncclResult_t r = ncclCommFinalize(c->nccl);
    if (r == ncclSuccess || r == ncclInProgress)
      st = settle_locked(c, c->nccl, deadline, &r);
    if (st == MPG_OK && r == ncclSuccess) {
      r = ncclCommDestroy(c->nccl);
      c->nccl = NULL;
      if (r != ncclSuccess && r != ncclInProgress)
        st = fail_nccl(MPG_ERR_BACKEND, what, "ncclCommDestroy", r);
    } else if (st == MPG_ERR_TIMEOUT) {
      abort_locked(c, MPG_ERR_TIMEOUT);
      st = mpg__fail(MPG_ERR_TIMEOUT,
                     "%s: ncclCommFinalize did not finish within %.3g s (the "
                     "communicator was aborted)",
                     what, c->timeout_s);
    } else if (st != MPG_OK) {
      st = mpg__fail(st, "%s: aborted during ncclCommFinalize", what);
    } else {
      st = fail_nccl(MPG_ERR_BACKEND, what, "ncclCommFinalize", r);
      abort_locked(c, MPG_ERR_ABORTED);
    }
  }
  /* After an abort there is nothing left to release in NCCL. */
  c->nccl = NULL;
  if (c->scratch) {
    (void)cudaFree(c->scratch);
    c->scratch = NULL;
  }
  pthread_mutex_unlock(&c->lock);
  dev_leave(c->device, old);
  comm_unref(c);
  return st;
}

/* ------------------------------------------------------------------ */
/* Size-1 groups: copy, or scale on the device                         */
/* ------------------------------------------------------------------ */

/* dst[i] = src[i] * s for i < n, one grid-stride loop per dtype.  Half
 * types compute in f32 and round to nearest even, like the CPU backends
 * (mpg__scale).  Target sm_52 / PTX 6.0 so any driver can JIT it. */
#define PTX_KERNEL(NAME, BODY)                                                \
  ".visible .entry " NAME "(.param .u64 p_dst, .param .u64 p_src,\n"          \
  "    .param .u64 p_n, .param .f64 p_s)\n"                                   \
  "{\n"                                                                       \
  "  .reg .pred %p<3>;\n  .reg .b16 %h<3>;\n  .reg .b32 %r<10>;\n"           \
  "  .reg .b64 %rd<12>;\n  .reg .f32 %f<4>;\n  .reg .f64 %fd<4>;\n"          \
  "  ld.param.u64 %rd1, [p_dst];\n  ld.param.u64 %rd2, [p_src];\n"           \
  "  ld.param.u64 %rd3, [p_n];\n  ld.param.f64 %fd1, [p_s];\n"               \
  "  cvta.to.global.u64 %rd1, %rd1;\n  cvta.to.global.u64 %rd2, %rd2;\n"     \
  "  mov.u32 %r1, %ctaid.x;\n  mov.u32 %r2, %ntid.x;\n"                      \
  "  mov.u32 %r3, %tid.x;\n  mov.u32 %r4, %nctaid.x;\n"                      \
  "  mul.wide.u32 %rd4, %r1, %r2;\n  cvt.u64.u32 %rd5, %r3;\n"               \
  "  add.s64 %rd4, %rd4, %rd5;\n  mul.wide.u32 %rd6, %r4, %r2;\n"            \
  "  cvt.rn.f32.f64 %f1, %fd1;\n"                                            \
  NAME "_loop:\n"                                                             \
  "  setp.ge.u64 %p1, %rd4, %rd3;\n  @%p1 bra " NAME "_done;\n"              \
  BODY                                                                        \
  "  add.s64 %rd4, %rd4, %rd6;\n  bra.uni " NAME "_loop;\n"                  \
  NAME "_done:\n  ret;\n}\n"

#define PTX_ADDR(SHIFT)                                                       \
  "  shl.b64 %rd7, %rd4, " SHIFT ";\n  add.s64 %rd8, %rd2, %rd7;\n"          \
  "  add.s64 %rd9, %rd1, %rd7;\n"

/* Pieces, each under C's 4095-character literal limit, joined at load. */
static const char *const scale_ptx[] = {
    ".version 6.0\n.target sm_52\n.address_size 64\n\n",
    PTX_KERNEL("mpg_scale_f32",
               PTX_ADDR("2")
               "  ld.global.f32 %f2, [%rd8];\n  mul.rn.f32 %f3, %f2, %f1;\n"
               "  st.global.f32 [%rd9], %f3;\n"),
    PTX_KERNEL("mpg_scale_f64",
               PTX_ADDR("3")
               "  ld.global.f64 %fd2, [%rd8];\n  mul.rn.f64 %fd3, %fd2, %fd1;\n"
               "  st.global.f64 [%rd9], %fd3;\n"),
    PTX_KERNEL("mpg_scale_f16",
               PTX_ADDR("1")
               "  ld.global.b16 %h1, [%rd8];\n  cvt.f32.f16 %f2, %h1;\n"
               "  mul.rn.f32 %f3, %f2, %f1;\n  cvt.rn.f16.f32 %h2, %f3;\n"
               "  st.global.b16 [%rd9], %h2;\n"),
    PTX_KERNEL("mpg_scale_bf16",
               PTX_ADDR("1")
               "  ld.global.b16 %h1, [%rd8];\n  cvt.u32.u16 %r5, %h1;\n"
               "  shl.b32 %r5, %r5, 16;\n  mov.b32 %f2, %r5;\n"
               "  mul.rn.f32 %f3, %f2, %f1;\n  mov.b32 %r6, %f3;\n"
               /* round to nearest even: r6 + 0x7fff + ((r6 >> 16) & 1) */
               "  shr.u32 %r7, %r6, 16;\n  and.b32 %r7, %r7, 1;\n"
               "  add.u32 %r7, %r7, 32767;\n  add.u32 %r8, %r6, %r7;\n"
               "  shr.u32 %r8, %r8, 16;\n"
               "  setp.nan.f32 %p2, %f3, %f3;\n  @%p2 mov.u32 %r8, 32704;\n"
               "  cvt.u16.u32 %h2, %r8;\n  st.global.b16 [%rd9], %h2;\n")};

static pthread_once_t scale_once = PTHREAD_ONCE_INIT;
static cudaError_t scale_load_error = cudaSuccess;
static const char *scale_load_call = "";
static cudaKernel_t scale_kernels[4]; /* f32, f64, f16, bf16 */

static void scale_load(void) {
  static const char *const names[4] = {"mpg_scale_f32", "mpg_scale_f64",
                                       "mpg_scale_f16", "mpg_scale_bf16"};
  size_t len = 1;
  for (size_t i = 0; i < sizeof scale_ptx / sizeof *scale_ptx; i++)
    len += strlen(scale_ptx[i]);
  char *ptx = malloc(len);
  if (!ptx) {
    scale_load_error = cudaErrorMemoryAllocation;
    scale_load_call = "malloc (scale kernels)";
    return;
  }
  ptx[0] = '\0';
  for (size_t i = 0; i < sizeof scale_ptx / sizeof *scale_ptx; i++)
    strcat(ptx, scale_ptx[i]);
  cudaLibrary_t lib;
  cudaError_t e = cudaLibraryLoadData(&lib, ptx, NULL, NULL, 0, NULL, NULL, 0);
  free(ptx);
  if (e != cudaSuccess) {
    scale_load_error = e;
    scale_load_call = "cudaLibraryLoadData (scale kernels)";
    return;
  }
  /* The library stays loaded for the life of the process. */
  for (int i = 0; i < 4; i++) {
    e = cudaLibraryGetKernel(&scale_kernels[i], lib, names[i]);
    if (e != cudaSuccess) {
      scale_load_error = e;
      scale_load_call = "cudaLibraryGetKernel (scale kernels)";
      return;
    }
  }
}

static mpg_status nccl_local(const mpg__coll *k) {
  size_t bytes = k->count * mpg__dtype_size(k->dtype);
  cudaStream_t s = (cudaStream_t)k->stream;
  char what[160];
  snprintf(what, sizeof what, "nccl %s(%s, count %zu) in a group of one rank",
           mpg__kind_name(k->kind), mpg_dtype_name(k->dtype), k->count);
  switch (k->kind) {
    case MPG__BARRIER:
    case MPG__BROADCAST:
      return MPG_OK;
    case MPG__SEND:
    case MPG__RECV:
      return mpg__fail(MPG_ERR_INVALID, "%s: point-to-point needs a peer", what);
    case MPG__ALL_REDUCE:
    case MPG__ALL_GATHER:
    case MPG__REDUCE_SCATTER:
      break;
  }
  int scaled = k->kind != MPG__ALL_GATHER && k->op == MPG_OP_PREMUL_SUM &&
               k->scale != 1.0 && k->count > 0;
  if (!scaled) {
    if (bytes == 0 || k->recv == k->send) return MPG_OK;
    cudaError_t e = cudaMemcpyAsync(k->recv, k->send, bytes, cudaMemcpyDefault, s);
    return e == cudaSuccess ? MPG_OK : fail_cuda(MPG_ERR_BACKEND, what, "cudaMemcpyAsync", e);
  }
  int which;
  switch (k->dtype) {
    case MPG_F32: which = 0; break;
    case MPG_F64: which = 1; break;
    case MPG_F16: which = 2; break;
    case MPG_BF16: which = 3; break;
    default:
      return mpg__fail(MPG_ERR_INVALID, "%s: a scaled sum needs a floating dtype",
                       what);
  }
  pthread_once(&scale_once, scale_load);
  if (scale_load_error != cudaSuccess)
    return mpg__fail(MPG_ERR_BACKEND, "%s: %s: %s", what, scale_load_call,
                     cudaGetErrorString(scale_load_error));
  void *dst = k->recv;
  const void *src = k->send;
  uint64_t n = k->count;
  double scale = k->scale;
  void *args[4] = {&dst, &src, &n, &scale};
  uint64_t blocks = (n + 255) / 256;
  dim3 grid = {(unsigned)(blocks < 4096 ? blocks : 4096), 1, 1};
  dim3 block = {256, 1, 1};
  cudaError_t e = cudaLaunchKernel((const void *)scale_kernels[which], grid,
                                   block, args, 0, s);
  return e == cudaSuccess ? MPG_OK
                          : fail_cuda(MPG_ERR_BACKEND, what, "cudaLaunchKernel (scale)", e);
}

/* ------------------------------------------------------------------ */
/* Device memory and streams (hooks for mpg_ctx_mem_* / stream_*)      */
/* ------------------------------------------------------------------ */

/* Zeroed device memory on the communicator's device.  registered = 1:
 * ncclMemAlloc + ncclCommRegister with this (world) communicator, which
 * lets NCCL use zero-copy paths; every rank must then register too. */
static mpg_status nccl_mem_alloc(mpg__comm *c, size_t bytes, int registered,
                                 void **ptr) {
  int old;
  cudaError_t e = dev_enter(c->device, &old);
  if (e != cudaSuccess) return fail_cuda(MPG_ERR_BACKEND, "mem_alloc", "cudaSetDevice", e);
  mpg_status st = MPG_OK;
  *ptr = NULL;
  if (bytes == 0) bytes = 1;
  if (registered) {
    struct nccl_reg *r = calloc(1, sizeof *r);
    ncclResult_t nr = r ? ncclMemAlloc(ptr, bytes) : ncclSystemError;
    if (nr != ncclSuccess) {
      free(r);
      st = fail_nccl(MPG_ERR_NOMEM, "mem_alloc", "ncclMemAlloc", nr);
    } else {
      pthread_mutex_lock(&c->lock);
      nr = c->nccl ? ncclCommRegister(c->nccl, *ptr, bytes, &r->handle) : ncclInvalidUsage;
      if (nr == ncclSuccess) {
        r->ptr = *ptr;
        r->next = c->regs;
        c->regs = r;
      }
      pthread_mutex_unlock(&c->lock);
      if (nr != ncclSuccess) {
        st = fail_nccl(MPG_ERR_BACKEND, "mem_alloc", "ncclCommRegister", nr);
        (void)ncclMemFree(*ptr);
        *ptr = NULL;
        free(r);
      }
    }
  } else {
    e = cudaMalloc(ptr, bytes);
    if (e != cudaSuccess) {
      *ptr = NULL;
      st = fail_cuda(MPG_ERR_NOMEM, "mem_alloc", "cudaMalloc", e);
    }
  }
  if (!st) {
    e = cudaMemset(*ptr, 0, bytes);
    if (e != cudaSuccess) st = fail_cuda(MPG_ERR_BACKEND, "mem_alloc", "cudaMemset", e);
  }
  dev_leave(c->device, old);
  return st;
}

static mpg_status nccl_mem_free(mpg__comm *c, void *ptr) {
  struct nccl_reg *r = NULL, **pp;
  pthread_mutex_lock(&c->lock);
  for (pp = &c->regs; *pp; pp = &(*pp)->next)
    if ((*pp)->ptr == ptr) {
      r = *pp;
      *pp = r->next;
      break;
    }
  if (r && c->nccl) (void)ncclCommDeregister(c->nccl, r->handle);
  pthread_mutex_unlock(&c->lock);
  if (r) {
    free(r);
    ncclResult_t nr = ncclMemFree(ptr);
    return nr == ncclSuccess ? MPG_OK : fail_nccl(MPG_ERR_BACKEND, "mem_free", "ncclMemFree", nr);
  }
  cudaError_t e = cudaFree(ptr);
  return e == cudaSuccess ? MPG_OK : fail_cuda(MPG_ERR_BACKEND, "mem_free", "cudaFree", e);
}

static mpg_status nccl_mem_zero(void *ptr, size_t bytes, void *stream) {
  cudaError_t e = cudaMemsetAsync(ptr, 0, bytes, (cudaStream_t)stream);
  return e == cudaSuccess ? MPG_OK : fail_cuda(MPG_ERR_BACKEND, "mem_zero", "cudaMemsetAsync", e);
}

static mpg_status nccl_stream_create(void **stream) {
  cudaStream_t s;
  cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  if (e != cudaSuccess)
    return fail_cuda(MPG_ERR_BACKEND, "stream_create", "cudaStreamCreateWithFlags", e);
  *stream = s;
  return MPG_OK;
}

static mpg_status nccl_stream_destroy(void *stream) {
  cudaError_t e = cudaStreamDestroy((cudaStream_t)stream);
  return e == cudaSuccess ? MPG_OK
                          : fail_cuda(MPG_ERR_BACKEND, "stream_destroy", "cudaStreamDestroy", e);
}

/* waiter waits for what is queued on waitee so far: one event. */
static mpg_status nccl_stream_order(void *waiter, void *waitee) {
  if (waiter == waitee) return MPG_OK;
  cudaEvent_t ev;
  cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
  if (e != cudaSuccess) return fail_cuda(MPG_ERR_BACKEND, "stream_order", "cudaEventCreate", e);
  e = cudaEventRecord(ev, (cudaStream_t)waitee);
  if (e == cudaSuccess) e = cudaStreamWaitEvent((cudaStream_t)waiter, ev, 0);
  (void)cudaEventDestroy(ev); /* released once the wait has been satisfied */
  return e == cudaSuccess ? MPG_OK
                          : fail_cuda(MPG_ERR_BACKEND, "stream_order", "cudaStreamWaitEvent", e);
}

const struct mpg__backend_ops mpg__backend_nccl = {
    .name = "nccl",
    .world_init = nccl_world_init,
    .split = nccl_split,
    .post = nccl_post,
    .test = nccl_test,
    .wait = nccl_wait,
    .req_free = nccl_req_free,
    .abort_comm = nccl_abort,
    .destroy = nccl_destroy,
    .local = nccl_local,
    .mem_alloc = nccl_mem_alloc,
    .mem_free = nccl_mem_free,
    .mem_zero = nccl_mem_zero,
    .stream_create = nccl_stream_create,
    .stream_destroy = nccl_stream_destroy,
    .stream_order = nccl_stream_order,
};
