/* The NCCL half of the CUDA/NCCL test double (see double.h): every NCCL
 * function groups/nccl/ and its tests call, with the exact signatures of
 * NVIDIA's nccl.h (2.28), so that the real backend code runs multi-rank on
 * machines without a GPU: ranks as threads of one process, and ranks as
 * processes (fork, mpirun).  Never installed.
 *
 * Every rule enforced here cites the NCCL 2.28.9 source (github.com/NVIDIA/
 * nccl, tag v2.28.9-1, paths under src/) or the NCCL user guide page it
 * models.  Where NCCL returns an error the double returns NCCL's code with
 * NCCL's wording in ncclGetLastError; where NCCL would hang or corrupt
 * memory the double calls dbl_fatal() with a report instead.
 *
 * How it works
 *   Communicators.  A communicator's state lives in a POSIX shared-memory
 *   segment "/mpgdbl-<16 hex digits>" named from a hash of the unique id
 *   (init) or of (the parent segment's random nonce, split number, colour)
 *   (ncclCommSplit), so that ranks find each other whether they are threads
 *   or processes.  The first rank creates it (O_CREAT|O_EXCL), every rank
 *   maps it, registers (pid, device, bus id, host hash) and waits for the
 *   others (in a job thread, as NCCL's init job).  Once all
 *   have arrived the name is unlinked (the mappings stay), so the same id
 *   (NCCL_COMM_ID) can make a new communicator later; a segment that never
 *   completes is unlinked by the last member to leave.
 *   Collectives run as stream work (dbl_stream_submit, kernel = 1): the
 *   item publishes this rank's arrival at its k-th collective, blocks until
 *   every rank has arrived (as an NCCL kernel spins), checks that all made
 *   the same call, then moves the data in chunks through per-rank staging
 *   slots in the segment (two banks, one barrier per chunk), reducing in
 *   rank order with the arithmetic of meshpg's thread backend.  Sends and
 *   receives go through one byte ring per ordered pair of ranks; a send
 *   completes when its receiver has consumed it.  A communicator's kernels
 *   run one after the other in issue order, as NCCL's.  All waits poll the
 *   communicator's abort flag, dead peer processes, and a watchdog.
 *   Groups: ncclGroupStart/End are per thread; operations, inits, splits,
 *   finalizes, aborts and destroys inside a group run at the outermost
 *   ncclGroupEnd, so aborting every communicator in one group sets every
 *   abort flag before any device memory is freed (NCCL 2.28 does the same).
 *
 * Functions: ncclGetVersion, ncclGetUniqueId, ncclCommInitRank,
 * ncclCommInitRankConfig, ncclCommInitAll, ncclCommSplit,
 * ncclCommFinalize, ncclCommDestroy, ncclCommAbort, ncclCommRevoke,
 * ncclCommGetAsyncError, ncclCommCount, ncclCommCuDevice, ncclCommUserRank,
 * ncclGetErrorString, ncclGetLastError, ncclAllReduce, ncclBroadcast,
 * ncclBcast, ncclReduce, ncclAllGather, ncclReduceScatter, ncclSend,
 * ncclRecv, ncclGroupStart, ncclGroupEnd, ncclRedOpCreatePreMulSum,
 * ncclRedOpDestroy, ncclMemAlloc, ncclMemFree, ncclCommRegister,
 * ncclCommDeregister.  Datatypes: every ncclDataType_t; fp8 moves but does
 * not reduce (refused with NCCL's pre-sm90 message).
 *
 * Environment
 *   MESHPG_DOUBLE_HANG_S=S   watchdog: a kernel (collective, send,
 *                            receive) that makes no progress for S seconds
 *                            (default 20) is reported as a deadlock
 *                            (dbl_fatal naming the ranks, the operations
 *                            they are at, the last ones they issued, and an
 *                            ncclCommAbort / ncclCommDestroy waiting for
 *                            the device); an init or split still waiting
 *                            for ranks after S seconds prints a warning
 *                            (meshpg's own timeout then aborts it).
 *   MESHPG_DOUBLE_FAULT=F[,F...] fault injection, F one of
 *      hang:R:N   world rank R's N-th NCCL operation never arrives: its
 *                 kernel blocks without publishing its arrival until the
 *                 communicator is aborted;
 *      async:R:N  world rank R's N-th operation completes, then its
 *                 communicator reports ncclSystemError through
 *                 ncclCommGetAsyncError;
 *      kill:R:N   the process of world rank R raises SIGKILL when its N-th
 *                 operation starts on its stream (ranks as processes only:
 *                 with ranks as threads it kills every rank).
 *      "World rank" is the rank a thread had in the first communicator it
 *      initialised (ncclCommInitRank*); operations are counted per world
 *      rank, 1-based, each collective, send and receive once, in issue
 *      order.  The double passes the world rank to the CUDA half
 *      (dbl_set_world_rank) for its cudaMallocAsync OOM fault.
 *   NCCL_COMM_ID             as in NCCL: ncclGetUniqueId returns the same
 *                            id in every process (bootstrap.cc:414-431).
 *   NCCL_HOSTID              as in NCCL: the host hash (else hostname and
 *                            boot id); ranks of different hosts talk over
 *                            sockets (nccl_double_net.c).
 *   NCCL_SOCKET_IFNAME       as in NCCL: the interface the bootstrap root
 *                            and every rank listen on.
 *   NCCL_DEBUG=WARN|INFO     print each WARN on stderr, as NCCL does.
 *   NCCL_LAUNCH_ORDER_IMPLICIT, NCCL_LAUNCH_RACE_FATAL  as in NCCL: two
 *                            threads launching on one device at once fail
 *                            with ncclInvalidUsage (launch_race_enter).
 *
 * Deliberate differences from NCCL, each for the tests' sake:
 *   - f16/bf16 reductions accumulate in f32 and round once; every
 *     reduction runs in rank order; ncclAvg of f32/f64 is a sum divided by
 *     the rank count at the end.  Real NCCL reduces f16/bf16 in their own
 *     precision, in ring or tree order, and implements float ncclAvg as a
 *     pre-multiplication by float(1/nranks) (enqueue.cc:2285-2320), which
 *     for f32/f64 is exact at power-of-two rank counts (barring underflow)
 *     and otherwise rounds each addend once more in the element's own
 *     precision, an effect of the size of the summation order's.  The
 *     double reproduces meshpg's thread backend (groups/thread/coll.c
 *     reduce_all), bit for bit, except where NCCL's arithmetic loses more
 *     than that: ncclAvg of f16/bf16 and pre-multiplied f16/bf16 addends
 *     are rounded to the half before the sum, as NCCL does (see
 *     DEFINE_RED_FLOAT), so that a backend passing them to NCCL shows it.
 *   - pointers are always checked (as with NCCL_CHECK_POINTERS=1,
 *     init.cc:452 / misc/argcheck.cc:10-26), and a buffer running past the
 *     end of its allocation is reported (real NCCL would fault).
 *   - ncclGetLastError is per thread: NCCL keeps one process-wide buffer
 *     (debug.cc:32, written at debug.cc:287) that ranks as threads would
 *     overwrite under each other.  An asynchronous error's text is kept with
 *     its communicator and copied into the caller's buffer by
 *     ncclCommGetAsyncError.
 *   - a send completes only once its receiver has consumed it (NCCL may
 *     complete a small send early into the receiver's buffers), so that a
 *     send without its receive is caught by the watchdog.
 *   - launching a group on a non-blocking communicator is done in the
 *     calling thread; the call still answers ncclInProgress and the
 *     communicator reports ncclInProgress until the next
 *     ncclCommGetAsyncError (group.cc:705-738 launches in a thread).
 *   - a call on a destroyed or aborted communicator gets ncclInvalidArgument
 *     ("Error: corrupted comm object detected", the poisoned magic of
 *     init.cc:180-184 seen by misc/argcheck.cc:38-41) instead of reading
 *     freed memory; the handle is never freed (a tombstone).
 *   - ncclCommDestroy returning early (already destroyed, or not ready)
 *     leaves NCCL's group depth raised (init.cc:2372-2381); the double
 *     reports the thread's next group-using NCCL call with dbl_fatal.
 *
 * Thread safety: ranks as threads may all be inside the double at once.
 * Everything shared between threads or processes is a C11 atomic or is
 * handed over through one (release/acquire), so the double is TSan-clean;
 * futexes only wake sleepers. */

/* The files of the NCCL half (their shared types and calls are in
 * nccl_double_internal.h, hidden from the library's exports):
 *   nccl_double.c          the NCCL API of communicators: version, error
 *                          texts, unique ids, init, split, finalize,
 *                          destroy, abort, revoke and their queries;
 *   nccl_double_reduce.c   environment, WARN, data types, the reductions'
 *                          arithmetic, futex wake words;
 *   nccl_double_segment.c  a communicator's shared-memory segment;
 *   nccl_double_net.c      the socket transport between hosts (NCCL's
 *                          NET): the bootstrap root, connections, and the
 *                          replicas of the segment they keep in step;
 *   nccl_double_comm.c     communicators' lifetime and async errors, fault
 *                          injection, groups, and the init and split jobs;
 *   nccl_double_kernel.c   the kernels: collectives, sends and receives,
 *                          deadlock reports;
 *   nccl_double_launch.c   launching a group's operations, the launch race,
 *                          ncclGroupEnd;
 *   nccl_double_ops.c      argument checks, enqueue, and the NCCL API of
 *                          operations: collectives, send/receive, groups,
 *                          pre-multiplied sums, memory and registration. */

#include "nccl_double_internal.h"

/* ------------------------------------------------------------------ */
/* The NCCL API                                                       */
/* ------------------------------------------------------------------ */

ncclResult_t ncclGetVersion(int *version) {
  if (!version) return ncclInvalidArgument; /* init.cc:151-155 */
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

/* NCCL's texts (init.cc:2683-2696): callers match on them. */
const char *ncclGetErrorString(ncclResult_t code) {
  switch (code) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}

const char *ncclGetLastError(ncclComm_t comm) {
  (void)comm; /* unused by NCCL too (init.cc:2698-2703) */
  return tl_last_error;
}

/* An id: a marker, random bytes, the pid and a counter; with NCCL_COMM_ID
 * every caller gets the same id for the same address, as NCCL's
 * bootstrapGetUniqueId (bootstrap.cc:414-431). */
ncclResult_t ncclGetUniqueId(ncclUniqueId *out) {
  env_init();
  if (!out) {
    warn("GetUniqueId : out argument is NULL"); /* init.cc:161 */
    return ncclInvalidArgument;
  }
  memset(out, 0, sizeof *out);
  memcpy(out->internal, ID_MARK, 8);
  const char *env = getenv("NCCL_COMM_ID");
  if (env) {
    /* NCCL takes "<host>:<port>" with the port read by atoi (misc/utils.cc:149,
     * misc/socket.cc:275-290), so any host and port text goes; the double
     * resolves no host name. */
    const char *colon = strrchr(env, ':');
    if (strlen(env) < 2 || !colon || colon == env || !colon[1]) {
      warn("Invalid NCCL_COMM_ID, please use format: <ipv4>:<port> or [<ipv6>]:<port> or "
           "<hostname>:<port>");
      return ncclInvalidArgument;
    }
    out->internal[8] = 'E';
    snprintf(out->internal + 16, sizeof out->internal - 16, "%s", env);
    return ncclSuccess;
  }
  static _Atomic uint64_t counter;
  uint64_t nonce[2] = {0, 0};
  if (getrandom(nonce, sizeof nonce, 0) != (ssize_t)sizeof nonce) {
    nonce[0] = (uint64_t)dbl_now() * 1000003u ^ (uint64_t)getpid();
    nonce[1] = (uint64_t)(uintptr_t)&nonce;
  }
  uint64_t cnt = atomic_fetch_add(&counter, 1) + 1;
  int32_t pid = (int32_t)getpid();
  memcpy(out->internal + 16, nonce, sizeof nonce);
  memcpy(out->internal + 32, &pid, sizeof pid);
  memcpy(out->internal + 40, &cnt, sizeof cnt);
  net_id_fill(out); /* the bootstrap root (nccl_double_net.c) */
  return ncclSuccess;
}

/* parseCommConfig's checks that matter here (init.cc:1804-1860). */
static ncclResult_t parse_config(const ncclConfig_t *cfg, int *blocking, int *split_share) {
  if (!cfg) return ncclSuccess;
  if (cfg->magic != 0xcafebeef) {
    warn("ncclConfig_t argument not initialized via NCCL_CONFIG_INITIALIZER");
    return ncclInvalidArgument;
  }
  if (cfg->blocking != NCCL_CONFIG_UNDEF_INT && cfg->blocking != 0 && cfg->blocking != 1) {
    warn("Invalid config blocking attribute value %d", cfg->blocking);
    return ncclInvalidArgument;
  }
  if (cfg->splitShare != NCCL_CONFIG_UNDEF_INT && cfg->splitShare != 0 && cfg->splitShare != 1) {
    warn("Invalid config splitShare attribute value %d", cfg->splitShare);
    return ncclInvalidArgument;
  }
  if (cfg->blocking != NCCL_CONFIG_UNDEF_INT) *blocking = cfg->blocking;
  if (cfg->splitShare != NCCL_CONFIG_UNDEF_INT) *split_share = cfg->splitShare;
  return ncclSuccess;
}

static struct job *job_new(int kind, struct ncclComm *comm) {
  struct job *j = calloc(1, sizeof *j);
  if (!j) dbl_fatal("nccl double: out of memory");
  j->kind = kind;
  j->comm = comm;
  comm_ref(comm);
  return j;
}

static void job_queue(struct job *j) {
  struct job **pp = &g_jobs;
  while (*pp) pp = &(*pp)->next;
  *pp = j;
}

/* ncclCommInitRankConfig (init.cc:2140-2170) and ncclCommInitRankDev
 * (init.cc:1964-2040): the handle is returned at once, the bootstrap runs
 * as a job at the outermost ncclGroupEnd. */
ncclResult_t ncclCommInitRankConfig(ncclComm_t *newcomm, int nranks, ncclUniqueId commId,
                                    int myrank, ncclConfig_t *config) {
  env_init();
  check_poisoned("ncclCommInitRankConfig");
  g_depth++;
  ncclResult_t ret = ncclSuccess;
  int blocking = 1, share = 0;
  struct ncclComm *c = NULL;
  if (!newcomm) {
    warn("CommInitRank : newcomm argument is NULL");
    ret = ncclInvalidArgument;
  }
  if (ret == ncclSuccess) ret = parse_config(config, &blocking, &share);
  if (ret == ncclSuccess && (nranks < 1 || myrank < 0 || myrank >= nranks)) {
    warn("Invalid rank requested : %d/%d", myrank, nranks);
    ret = ncclInvalidArgument;
  }
  if (ret == ncclSuccess) {
    /* The world rank for fault injection: this thread's first communicator. */
    if (tl_world_rank < 0) {
      tl_world_rank = myrank;
      dbl_set_world_rank(myrank);
    }
    c = comm_new();
    if (!c) dbl_fatal("nccl double: out of memory");
    c->rank = myrank;
    c->nranks = nranks;
    c->device = dbl_device_current();
    c->blocking = blocking;
    c->split_share = share;
    c->host_hash = dbl_host_hash();
    c->busid = busid_of(c->device);
    c->sh = shared_new();
    id_to_name(&commId, c->name, sizeof c->name);
    dbl_log("nccl double: ncclCommInitRankConfig rank %d/%d on %s (CUDA device %d, %s)", myrank,
            nranks, c->name, c->device, blocking ? "blocking" : "non-blocking");
    *newcomm = c;
    ret = group_mode(blocking);
    if (ret == ncclSuccess) {
      struct job *j = job_new(JOB_INIT, c);
      memcpy(j->id, commId.internal, sizeof j->id);
      if (commId.internal[8] == 'E')
        snprintf(j->env_id, sizeof j->env_id, "%s", commId.internal + 16);
      job_queue(j);
    } else {
      set_async(c, ret, tl_last_error);
    }
  } else if (newcomm) {
    *newcomm = NULL;
  }
  group_err(ret);
  ncclResult_t e = group_end_internal();
  if (e != ncclSuccess && e != ncclInProgress) return e;
  if (c && !blocking) ret = (ncclResult_t)atomic_load(&c->async);
  return ret;
}

ncclResult_t ncclCommInitRank(ncclComm_t *newcomm, int nranks, ncclUniqueId commId, int myrank) {
  return ncclCommInitRankConfig(newcomm, nranks, commId, myrank, NULL);
}

/* ncclCommInitAll (init.cc:2064-2125): one id, every device in a group. */
ncclResult_t ncclCommInitAll(ncclComm_t *comms, int ndev, const int *devlist) {
  if (!comms) {
    warn("CommInitAll : comms argument is NULL");
    return ncclInvalidArgument;
  }
  if (ndev < 0) {
    warn("Invalid device count requested : %d", ndev);
    return ncclInvalidArgument;
  }
  ncclUniqueId id;
  ncclResult_t r = ncclGetUniqueId(&id);
  if (r != ncclSuccess) return r;
  int old = dbl_device_current();
  ncclGroupStart();
  for (int i = 0; i < ndev; i++) {
    cudaError_t e = cudaSetDevice(devlist ? devlist[i] : i);
    if (e != cudaSuccess) {
      group_err(cuda_fail(e));
      break;
    }
    (void)ncclCommInitRankConfig(comms + i, ndev, id, i, NULL);
  }
  r = ncclGroupEnd();
  (void)cudaSetDevice(old);
  return r;
}

/* ncclCommSplit (init.cc:2666-2681, ncclCommInitChildComm 2546-2640).
 * Returns ncclSuccess even while the split still runs on a non-blocking
 * parent: the group end's ncclInProgress is passed over by NCCLCHECK
 * (include/checks.h:122-129); the parent reports the progress. */
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                           ncclConfig_t *config) {
  check_poisoned("ncclCommSplit");
  g_depth++;
  ncclResult_t ret = comm_check(comm, "ncclCommSplit");
  struct ncclComm *child = NULL;
  if (ret == ncclSuccess && !newcomm) {
    warn("ncclCommSplit : newcomm argument is NULL");
    ret = ncclInvalidArgument;
  }
  if (ret == ncclSuccess) ret = ensure_ready(comm);
  int blocking = ret == ncclSuccess ? comm->blocking : 1, share = 0;
  if (ret == ncclSuccess) {
    share = comm->split_share;
    if (config) ret = parse_config(config, &blocking, &share);
  }
  if (ret == ncclSuccess) {
    *newcomm = NULL;
    if (color != NCCL_SPLIT_NOCOLOR) {
      child = comm_new();
      if (!child) dbl_fatal("nccl double: out of memory");
      child->device = comm->device;
      child->blocking = blocking;
      child->split_share = share;
      child->host_hash = comm->host_hash;
      child->busid = comm->busid;
      child->world_rank = comm->world_rank;
      /* splitShare: the child shares the parent's abort flag and device
       * stream (init.cc:2580-2590). */
      if (comm->split_share) {
        child->sh = comm->sh;
        atomic_fetch_add(&comm->sh->refs, 1);
      } else {
        child->sh = shared_new();
      }
    }
    ret = group_mode(comm->blocking); /* the job is the parent's (init.cc:2626) */
    if (ret == ncclSuccess) {
      struct job *j = job_new(JOB_SPLIT, comm);
      j->child = child;
      if (child) comm_ref(child);
      j->newcomm = newcomm;
      j->color = color;
      j->key = key;
      pthread_mutex_lock(&comm->mu);
      j->split_seq = ++comm->split_count; /* init.cc:2620-2621 */
      pthread_mutex_unlock(&comm->mu);
      job_queue(j);
    } else if (child) {
      atomic_store(&child->magic, COMM_DEAD);
      comm_unref(child);
    }
  }
  group_err(ret);
  ncclResult_t e = group_end_internal();
  if (e != ncclSuccess && e != ncclInProgress) return e;
  return ret;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError) {
  ncclResult_t r = comm_check(comm, "ncclGetAsyncError");
  if (r != ncclSuccess) return r;
  if (!asyncError) {
    warn("ncclGetAsyncError : asyncError argument is NULL");
    return ncclInvalidArgument;
  }
  *asyncError = comm_state(comm);
  if (*asyncError != ncclSuccess && *asyncError != ncclInProgress) show_async_msg(comm);
  return ncclSuccess;
}

static ncclResult_t comm_attr(ncclComm_t comm, const void *out, const char *opname,
                              const char *outname) {
  ncclResult_t r = comm_check(comm, opname);
  if (r != ncclSuccess) return r;
  if (!out) {
    warn("%s : %s argument is NULL", opname, outname);
    return ncclInvalidArgument;
  }
  return ensure_ready(comm);
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int *count) {
  ncclResult_t r = comm_attr(comm, count, "CommCount", "count"); /* init.cc:2741-2752 */
  if (r == ncclSuccess) *count = comm->nranks;
  return r;
}

ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *devid) {
  ncclResult_t r = comm_attr(comm, devid, "CommCuDevice", "devid"); /* init.cc:2755-2765 */
  if (r == ncclSuccess) *devid = comm->device;
  return r;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank) {
  ncclResult_t r = comm_attr(comm, rank, "CommUserRank", "rank"); /* init.cc:2768-2778 */
  if (r == ncclSuccess) *rank = comm->rank;
  return r;
}

/* Wait until every kernel this communicator launched has finished (the
 * strong-stream synchronisation of commDestroySync, init.cc:2212-2230). */
static void wait_own_kernels(struct ncclComm *c) {
  while (atomic_load(&c->own_done) < atomic_load(&c->own_issued)) {
    uint32_t seen = atomic_load(&c->sh->wake.seq);
    if (atomic_load(&c->own_done) >= atomic_load(&c->own_issued)) break;
    ww_sleep(&c->sh->wake, seen, 20, 0);
  }
}

/* ncclCommFinalize (init.cc:2264-2300). */
ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  check_poisoned("ncclCommFinalize");
  g_depth++;
  ncclResult_t ret = ncclSuccess;
  if (comm) {
    ret = comm_check(comm, "ncclCommFinalize");
    if (ret == ncclSuccess) ret = ensure_ready(comm);
    if (ret == ncclSuccess && comm->finalize_called) {
      /* init.cc:2276-2280 refuses a second finalize without a WARN. */
      warn("meshpg double: ncclCommFinalize(%p) called twice (NCCL returns ncclInvalidArgument "
           "without a message)", (void *)comm);
      ret = ncclInvalidArgument;
    }
    if (ret == ncclSuccess) ret = group_mode(comm->blocking);
    if (ret == ncclSuccess) {
      comm->finalize_called = 1;
      if (comm->blocking) {
        job_queue(job_new(JOB_FINALIZE, comm)); /* waits at the group's end */
      } else {
        atomic_store(&comm->async, ncclInProgress);
        atomic_store(&comm->finalize_pending, 1);
      }
    } else if (atomic_load(&comm->magic) == COMM_LIVE && !comm->blocking) {
      set_async(comm, ret, tl_last_error);
    }
  }
  group_err(ret);
  ncclResult_t e = group_end_internal();
  if (e != ncclSuccess && e != ncclInProgress) return e;
  if (comm && atomic_load(&comm->magic) == COMM_LIVE && !comm->blocking)
    ret = (ncclResult_t)atomic_load(&comm->async);
  return ret;
}

/* Release the communicator after destroy or abort: wait for the job, then
 * poison the handle and drop its reference. */
static void comm_release(struct ncclComm *c) {
  pthread_mutex_lock(&c->mu);
  struct job *j = c->job;
  c->job = NULL;
  pthread_mutex_unlock(&c->mu);
  if (j) job_free(j);
  atomic_store(&c->magic, COMM_DEAD);
  comm_unref(c);
}

/* The reclaim jobs, at the outermost ncclGroupEnd: commDestroySync waits
 * for the communicator's own kernels (init.cc:2212-2230, not after an
 * abort: they stopped), then commFree frees its device memory, and
 * cudaFree waits for the whole device (init.cc:296, include/alloc.h:380-392). */
void run_reclaim(struct job *j) {
  struct ncclComm *c = j->comm;
  switch (j->kind) {
    case JOB_FINALIZE:
      wait_own_kernels(c);
      break;
    case JOB_DESTROY:
      if (!c->finalize_called) wait_own_kernels(c);
      drain_device(c->device, "ncclCommDestroy", c);
      comm_release(c);
      break;
    case JOB_ABORT:
      drain_device(c->device, "ncclCommAbort", c);
      comm_release(c);
      break;
  }
}

/* ncclCommDestroy (init.cc:2358-2390): as a job of the group (forced
 * blocking, group.cc:52-54), run by the outermost ncclGroupEnd, which is
 * this call unless the caller opened a group. */
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (!comm) return ncclSuccess;
  check_poisoned("ncclCommDestroy");
  if (atomic_load(&comm->magic) != COMM_LIVE || comm->destroy_flag) {
    warn("comm %p has already been destroyed", (void *)comm);
    snprintf(g_poisoned, sizeof g_poisoned,
             "ncclCommDestroy(%p) of a communicator already destroyed or aborted", (void *)comm);
    return ncclInvalidArgument;
  }
  ncclResult_t r = ensure_ready(comm);
  if (r != ncclSuccess) {
    snprintf(g_poisoned, sizeof g_poisoned,
             "ncclCommDestroy(%p), which returned %s because the communicator was not ready "
             "(\"%.200s\"; abort a communicator with an error instead)",
             (void *)comm, ncclGetErrorString(r), tl_last_error);
    return r;
  }
  g_depth++;
  comm->destroy_flag = 1;
  job_queue(job_new(JOB_DESTROY, comm));
  g_blocking = 1;
  return group_end_internal();
}

/* ncclCommAbort (init.cc:2503-2540): the abort flag, which the
 * communicator's kernels poll, is set at once and the init job joined;
 * freeing everything is a job of the group, run by the outermost
 * ncclGroupEnd.  Freeing device memory waits for the whole device
 * (cudaFree's implicit synchronisation, commFree init.cc:296), so an abort
 * outside a group hangs on any other communicator's kernel still stuck on
 * the device: NVIDIA/nccl PR 564 and issues 549, 829, 1013 (the deadlock
 * report of that kernel names the waiting abort).  Aborting every
 * communicator inside one ncclGroupStart/End sets every flag first. */
ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (!comm) return ncclSuccess;
  if (atomic_load(&comm->magic) != COMM_LIVE || comm->destroy_flag) {
    /* NCCL would read freed memory, or free twice; the double answers. */
    warn("comm %p has already been destroyed", (void *)comm);
    return ncclInvalidArgument;
  }
  g_depth++;
  atomic_store(&comm->sh->abort, 1);
  wake_kernels(comm);
  comm->destroy_flag = 1;
  dbl_log("nccl double: ncclCommAbort rank %d of %s", comm->rank, comm->name);
  pthread_mutex_lock(&comm->mu);
  struct job *j = comm->job;
  comm->job = NULL;
  pthread_mutex_unlock(&comm->mu);
  if (j) job_free(j); /* ncclCommEnsureReady joins the init job (init.cc:376-377) */
  job_queue(job_new(JOB_ABORT, comm));
  g_blocking = 1;
  return group_end_internal();
}

#ifdef NCCL_REVOKE_DEFAULT /* nccl.h of 2.28.9 and later */
/* ncclCommRevoke (init.cc:2446-2500): not called by groups/nccl today,
 * but the NCCL 2.28 primitive that avoids the hang of ncclCommAbort above:
 * it sets the abort flag (every kernel of the communicator stops) and
 * frees nothing; once the communicator is quiescent its state is
 * ncclSuccess again.  Revoking every communicator of a device first, then
 * destroying them, never leaves a kernel for cudaFree to wait for. */
ncclResult_t ncclCommRevoke(ncclComm_t comm, int revokeFlags) {
  if (!comm) return ncclSuccess;
  check_poisoned("ncclCommRevoke");
  ncclResult_t r = comm_check(comm, "ncclCommRevoke");
  if (r != ncclSuccess) return r;
  /* init.cc:2452-2464: only NCCL_REVOKE_DEFAULT; not after finalize or
   * destroy; not twice (no WARN in NCCL). */
  if (revokeFlags != NCCL_REVOKE_DEFAULT || comm->finalize_called || comm->revoked ||
      comm->destroy_flag) {
    warn("meshpg double: ncclCommRevoke(%p, %d) refused: %s (NCCL returns "
         "ncclInvalidArgument without a message)", (void *)comm, revokeFlags,
         revokeFlags != NCCL_REVOKE_DEFAULT ? "flags must be NCCL_REVOKE_DEFAULT"
         : comm->revoked ? "already revoked" : "after ncclCommFinalize");
    return ncclInvalidArgument;
  }
  atomic_store(&comm->sh->abort, 1);
  wake_kernels(comm);
  comm->revoked = 1;
  comm->finalize_called = 1; /* init.cc:2469-2471 */
  (void)comm_state(comm);   /* ncclCommEnsureReady, its result ignored */
  /* The revoke job's result becomes the state, whatever it was
   * (init.cc:2439-2441). */
  pthread_mutex_lock(&comm->mu);
  comm->async_msg[0] = '\0';
  pthread_mutex_unlock(&comm->mu);
  if (comm->blocking) {
    wait_own_kernels(comm);
    atomic_store(&comm->sh->abort, 0);
    atomic_store(&comm->async, ncclSuccess);
    return ncclSuccess;
  }
  atomic_store(&comm->async, ncclInProgress);
  atomic_store(&comm->revoke_pending, 1);
  return (ncclResult_t)atomic_load(&comm->async);
}
#endif
