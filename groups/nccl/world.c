/* Joining the world on the NCCL backend: how the ranks agree on the NCCL
 * unique id, the choice of CUDA device and the init call.  See
 * nccl_internal.h.
 *
 * Unique-id bootstrap, first match wins:
 *   1. the caller's 128-byte id (opts.nccl_id);
 *   2. a world of one rank: ncclGetUniqueId locally;
 *   3. launched by mpirun and built with MPI (MPI initialised, or
 *      OMPI_COMM_WORLD_SIZE set): MPI rank 0 calls ncclGetUniqueId and
 *      broadcasts it (MPI_Ibcast on MPI_COMM_WORLD or *args->mpi_comm);
 *   4. NCCL_COMM_ID set by the user: NCCL's own rendezvous (every rank's
 *      ncclGetUniqueId returns the same id; rank 0's init starts the root);
 *   5. MASTER_ADDR and MASTER_PORT (torchrun style): rank 0 calls
 *      ncclGetUniqueId and hands the id to the others through meshpg's own
 *      rendezvous (groups/rendezvous.h) on MESHPG_NCCL_PORT when set, else
 *      MASTER_PORT + 1: under torchrun the agent's TCPStore already listens
 *      on MASTER_PORT on the master host.
 *   Nothing usable gives MPG_ERR_ENV naming MASTER_ADDR / MASTER_PORT.
 * The library never writes the environment; it reads NCCL_COMM_ID and
 * OMPI_COMM_WORLD_SIZE once per world init.
 *
 * Communicators per device.  The world and every group live on the same
 * device.  NCCL's user guide ("Using multiple NCCL communicators
 * concurrently") requires, before 2.26, one total global order of all
 * their operations, and from 2.26 offers NCCL_LAUNCH_ORDER_IMPLICIT=1,
 * which orders them by host issue order (overlapping them on CUDA 12.3+).
 * meshpg issues every collective in the same order on every rank (its
 * rule, checked by the issue-order checker), from one thread per context
 * (enforced: groups/issuer.c, mpg__ctx_check_issuer; with the variable set,
 * NCCL fails two threads launching on one device at once).  Without the
 * variable, meshpg imposes that order itself: each launch of the context
 * waits for the previous one to finish (reg.c, mpg__nccl_family_order_*),
 * as NCCL does with the variable on CUDA before 12.3.  splitShare is 0
 * by default, like torch: with 1 ("the child communicator can share
 * internal resources of the parent"; NCCL's ncclConfig_t docs) every group
 * of the context runs its kernels through the world's one internal device
 * stream, strictly in host issue order, so a dp bucket could not overlap a
 * tp collective on another stream.  MESHPG_NCCL_SPLIT_SHARE=1 trades that
 * overlap for the memory of each group's own channels.
 *
 * MPI (bootstrap 3) has one owner, groups/mpi: this file goes through
 * groups/mpi_owner.h and calls MPI only to ask whether it runs and for
 * the communicator's rank and size. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device.h"
#include "mpg_config.h"
#include "nccl_internal.h"
#include "rendezvous.h"

#if MPG_HAVE_MPI
#include <mpi.h>

#include "mpi_owner.h"
#endif

_Static_assert(sizeof(ncclUniqueId) == 128,
               "opts.nccl_id is documented as 128 bytes");

/* ------------------------------------------------------------------ */
/* Unique id bootstrap                                                */
/* ------------------------------------------------------------------ */

enum boot { BOOT_NONE, BOOT_CALLER, BOOT_LOCAL, BOOT_MPI, BOOT_ENV, BOOT_MASTER };

/* What the bootstrap reads from the environment, once per world init. */
typedef struct boot_env {
  char comm_id[256]; /* NCCL_COMM_ID, "" when unset */
  int ompi;          /* OMPI_COMM_WORLD_SIZE is set */
} boot_env;

static void boot_env_read(boot_env *e) {
  const char *id = getenv("NCCL_COMM_ID"), *ompi = getenv("OMPI_COMM_WORLD_SIZE");
  snprintf(e->comm_id, sizeof e->comm_id, "%s", id ? id : "");
  e->ompi = ompi && ompi[0];
}

#if MPG_HAVE_MPI
/* MPI is initialised, or this process was started by mpirun. */
static int mpi_launched(const boot_env *e) {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (fin) return 0;
  return init || e->ompi;
}

/* Bootstrap 3.  MPI has one owner, groups/mpi (the rule is in
 * groups/mpi_owner.h): it initialises MPI here if nobody has, and then
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
    ncclResult_t r = ncclGetUniqueId(id);
    if (r != ncclSuccess)
      return mpg__nccl_fail(MPG_ERR_BACKEND, "nccl bootstrap (MPI rank 0)",
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

/* The port of NCCL's root for bootstrap 4 from MASTER_ADDR: MESHPG_NCCL_PORT
 * (as mpg_ctx_create parsed it: 1..65535, 0 when unset), else MASTER_PORT +
 * 1.  -1 with the error set when MASTER_PORT + 1 is past 65535. */
static int master_boot_port(const mpg__world_args *a) {
  if (a->settings && a->settings->nccl_port > 0) return a->settings->nccl_port;
  if (a->master_port + 1 > 65535) {
    mpg__fail(MPG_ERR_ENV,
              "MASTER_PORT=%d: NCCL's root would listen on MASTER_PORT + 1, past 65535; "
              "set MESHPG_NCCL_PORT (or NCCL_COMM_ID=host:port)",
              a->master_port);
    return -1;
  }
  return a->master_port + 1;
}


static enum boot pick_boot(const mpg__world_args *a, const boot_env *e) {
  if (a->nccl_id) return BOOT_CALLER;
  if (a->world_size == 1) return BOOT_LOCAL;
#if MPG_HAVE_MPI
  if (mpi_launched(e)) return BOOT_MPI;
#endif
  if (e->comm_id[0]) return BOOT_ENV;
  if (a->master_addr && a->master_addr[0] && a->master_port > 0)
    return BOOT_MASTER;
  return BOOT_NONE;
}

static void boot_name(enum boot b, const mpg__world_args *a, const boot_env *e, char *buf,
                      size_t n) {
  switch (b) {
    case BOOT_NONE: break;
    case BOOT_CALLER: snprintf(buf, n, "the caller (opts.nccl_id)"); return;
    case BOOT_LOCAL: snprintf(buf, n, "ncclGetUniqueId (world of one rank)"); return;
    case BOOT_MPI: snprintf(buf, n, "MPI_Ibcast from MPI rank 0"); return;
    case BOOT_ENV: snprintf(buf, n, "NCCL_COMM_ID=%s", e->comm_id); return;
    case BOOT_MASTER: {
      if (a->settings && a->settings->nccl_port > 0)
        snprintf(buf, n, "rank 0 at MASTER_ADDR=%s, MESHPG_NCCL_PORT=%d", a->master_addr,
                 a->settings->nccl_port);
      else
        snprintf(buf, n, "rank 0 at MASTER_ADDR=%s, port MASTER_PORT + 1 = %d",
                 a->master_addr, a->master_port + 1);
      return;
    }
  }
  snprintf(buf, n, "?");
}

/* The id by the chosen bootstrap (steps 3 to 5 may block). */
static mpg_status get_id(enum boot how, const mpg__world_args *a, int root_port,
                         double deadline, ncclUniqueId *id, const char *what) {
  memset(id, 0, sizeof *id);
  ncclResult_t r = ncclSuccess;
  switch (how) {
    case BOOT_NONE:
      break;
    case BOOT_MPI:
#if MPG_HAVE_MPI
      return mpi_bcast_id(a, id, deadline);
#else
      break;
#endif
    case BOOT_CALLER:
      memcpy(id, a->nccl_id, sizeof *id);
      break;
    case BOOT_LOCAL:
    case BOOT_ENV:
      r = ncclGetUniqueId(id);
      break;
    case BOOT_MASTER:
      if (a->rank == 0) r = ncclGetUniqueId(id);
      if (r != ncclSuccess) break;
      return mpg__rendezvous_bcast("nccl bootstrap", a->master_addr, root_port, a->rank,
                                   a->world_size, id, sizeof *id, deadline);
  }
  if (r != ncclSuccess) return mpg__nccl_fail(MPG_ERR_BACKEND, what, "ncclGetUniqueId", r);
  return MPG_OK;
}

/* ------------------------------------------------------------------ */
/* world_init                                                         */
/* ------------------------------------------------------------------ */

/* st, with the device choice appended to the thread's message when it was
 * ambiguous (several local ranks per GPU): NCCL's "Duplicate GPU detected"
 * then says how the ranks got there. */
static mpg_status explain(mpg_status st, const mpg__device_choice *pick) {
  if (!pick->ambiguous) return st;
  mpg__saved_error e;
  mpg__error_save(&e);
  return mpg__fail(st, "%.600s; CUDA %s", e.msg, pick->why);
}

int mpg__nccl_comm_device(const mpg__comm *c) { return c ? c->device : -1; }

/* Step 1: how the ranks agree on the id (*how, *root_port, named in via); no CUDA call. */
static mpg_status choose_boot(const mpg__world_args *a, enum boot *how, int *root_port,
                              char *via, size_t via_size) {
  boot_env env;
  boot_env_read(&env);
  *how = pick_boot(a, &env);
  if (*how == BOOT_NONE)
    return mpg__fail(MPG_ERR_ENV,
                     "nccl: rank %d of %d has no way to agree on the NCCL "
                     "unique id: set MASTER_ADDR and MASTER_PORT (torchrun "
                     "style) or NCCL_COMM_ID=host:port, launch with mpirun "
                     "(meshpg built with MPI), or pass opts.nccl_id",
                     a->rank, a->world_size);
  /* A bad MESHPG_NCCL_PORT cannot fall back to a default: the rendezvous
   * itself needs it.  Refused here, before any CUDA or network call (the
   * other ranks then time out in the rendezvous).  Other bad variables
   * are reported on every rank once the world is joined (agree.c). */
  if (a->settings && a->settings->status && a->settings->bad_var &&
      !strcmp(a->settings->bad_var, "MESHPG_NCCL_PORT"))
    return mpg__fail(MPG_ERR_ENV, "nccl: rank %d: %s (the rendezvous needs it)", a->rank,
                     a->settings->error);
  *root_port = *how == BOOT_MASTER ? master_boot_port(a) : -1;
  if (*how == BOOT_MASTER && *root_port < 0) return MPG_ERR_ENV;
  boot_name(*how, a, &env, via, via_size);
  return MPG_OK;
}

/* Step 2: the CUDA device of this rank (*pick), made current. */
static mpg_status choose_device(const mpg__world_args *a, mpg__device_choice *pick) {
  /* opts.device, else from the local rank and what CUDA shows this
   * process (groups/device.h). */
  int ndev = 0;
  cudaError_t ce = cudaGetDeviceCount(&ndev);
  if (ce != cudaSuccess) {
    (void)cudaGetLastError();
    ndev = 0;
  }
  /* Args without a local world (0: tests of this table) count as 1. */
  mpg_status chosen = mpg__device_choose(
      a->device, a->local_rank, a->local_world_size > 0 ? a->local_world_size : 1, ndev,
      getenv("CUDA_VISIBLE_DEVICES"), pick);
  if (chosen)
    return mpg__fail_wrap(chosen, "nccl: rank %d of %d%s%s%s", a->rank, a->world_size,
                          ce != cudaSuccess ? " (cudaGetDeviceCount: " : "",
                          ce != cudaSuccess ? cudaGetErrorString(ce) : "",
                          ce != cudaSuccess ? ")" : "");
  mpg__log(1, "nccl: rank %d of %d takes CUDA %s", a->rank, a->world_size, pick->why);
  ce = cudaSetDevice(pick->device);
  if (ce != cudaSuccess) {
    char what[96];
    snprintf(what, sizeof what, "nccl world_init (rank %d of %d)", a->rank,
             a->world_size);
    return mpg__nccl_fail_cuda(MPG_ERR_BACKEND, what, "cudaSetDevice", ce);
  }
  return MPG_OK;
}

/* Step 4: ncclCommInitRankConfig into c->nccl, settled (lock held). */
static mpg_status init_locked(mpg__comm *c, const mpg__world_args *a, ncclUniqueId id,
                              ncclConfig_t *cfg, double deadline, ncclResult_t *res) {
  mpg_status st = MPG_OK;
  *res = ncclCommInitRankConfig(&c->nccl, a->world_size, id, a->rank, cfg);
  /* Poll even after ncclSuccess: a non-blocking call may return before its
   * background job has finished. */
  if ((*res == ncclSuccess || *res == ncclInProgress) && c->nccl)
    st = mpg__nccl_settle_locked(c, c->nccl, deadline, res);
  return st;
}

/* The world c joined: start its family, choose who orders its launches, hand it out. */
static mpg_status world_up(mpg__comm *c, const mpg__world_args *a, const char *via,
                           mpg__comm **out) {
  mpg_status st = mpg__nccl_family_join(c, NULL);
  if (st) {
    pthread_mutex_lock(&c->lock);
    (void)ncclCommAbort(c->nccl);
    c->nccl = NULL;
    pthread_mutex_unlock(&c->lock);
    mpg__nccl_comm_unref(c);
    return st;
  }
  int nccl_orders = a->settings && a->settings->nccl_launch_order_implicit;
  mpg__nccl_family_order(c, !nccl_orders);
  mpg__log(1, "nccl: rank %d of %d up on CUDA device %d (unique id from %s); kernels of "
           "its groups ordered by %s",
           a->rank, a->world_size, c->device, via,
           nccl_orders ? "NCCL (NCCL_LAUNCH_ORDER_IMPLICIT)"
                       : "meshpg, one at a time (set NCCL_LAUNCH_ORDER_IMPLICIT=1 to let "
                         "them overlap)");
  *out = c;
  return MPG_OK;
}

/* The error of a failed init call (st, else NCCL's res), explained by the device choice. */
static mpg_status init_failed(mpg_status st, ncclResult_t res, const char *what,
                              double timeout, int world_size, const mpg__device_choice *pick) {
  if (st == MPG_ERR_TIMEOUT)
    return explain(mpg__fail(MPG_ERR_TIMEOUT,
                             "%s: not every rank connected within %.3g s (did all "
                             "%d ranks start, with the same id?)",
                             what, timeout, world_size),
                   pick);
  if (st != MPG_OK) return explain(mpg__fail(st, "%s: aborted while connecting", what), pick);
  return explain(mpg__nccl_fail(MPG_ERR_BACKEND, what, "ncclCommInitRankConfig", res), pick);
}

mpg_status mpg__nccl_world_init(const mpg__world_args *a, mpg__comm **out) {
  *out = NULL;
  if (!a || a->world_size < 1 || a->rank < 0 || a->rank >= a->world_size)
    return mpg__fail(MPG_ERR_INVALID, "nccl world_init: rank %d outside a world of %d",
                     a ? a->rank : -1, a ? a->world_size : 0);
  double timeout = a->timeout_s > 0 ? a->timeout_s : 600.0;
  double deadline = mpg__now() + timeout;

  /* 1. How the ranks agree on the id.  Checked before touching CUDA. */
  enum boot how = BOOT_NONE;
  int root_port = -1;
  char via[320];
  mpg_status st = choose_boot(a, &how, &root_port, via, sizeof via);
  if (st != MPG_OK) return st;
  int share = a->settings ? a->settings->nccl_split_share : 0; /* MESHPG_NCCL_SPLIT_SHARE */

  /* 2. The device. */
  mpg__device_choice pick;
  st = choose_device(a, &pick);
  if (st != MPG_OK) return st;
  int dev = pick.device;

  mpg__comm *c = mpg__nccl_comm_new(dev, timeout);
  if (!c) return mpg__fail(MPG_ERR_NOMEM, "nccl world_init: out of memory");
  c->rank = a->rank;
  c->size = a->world_size;

  char what[480];
  snprintf(what, sizeof what,
           "nccl world init (rank %d of %d, CUDA device %d, id from %s)",
           a->rank, a->world_size, dev, via);

  /* 3. The id, and 4. the init call. */
  ncclUniqueId id;
  st = get_id(how, a, root_port, deadline, &id, what);
  if (st != MPG_OK) {
    mpg__nccl_comm_unref(c);
    return st;
  }
  ncclResult_t res = ncclSuccess;
  c->split_share = share;
  ncclConfig_t cfg = mpg__nccl_config(share);
  pthread_mutex_lock(&c->lock);
  st = init_locked(c, a, id, &cfg, deadline, &res);
  if (st == MPG_OK && res == ncclSuccess) {
    pthread_mutex_unlock(&c->lock);
    return world_up(c, a, via, out);
  }
  if (c->nccl) (void)ncclCommAbort(c->nccl); /* joins NCCL's init thread */
  c->nccl = NULL;
  pthread_mutex_unlock(&c->lock);
  mpg__nccl_comm_unref(c);
  return init_failed(st, res, what, timeout, a->world_size, &pick);
}
