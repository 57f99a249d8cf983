/* The NCCL half of the test double (nccl_double.c): argument checks and
 * enqueue, and the NCCL API of operations: collectives, sends and
 * receives, groups, pre-multiplied sums, memory and registration. */

#include "nccl_double_internal.h"

/* ------------------------------------------------------------------ */
/* Argument checks and enqueue (enqueue.cc:2620-2662)                 */
/* ------------------------------------------------------------------ */

/* CommCheck (misc/argcheck.cc:35-43).  A destroyed or aborted
 * communicator was poisoned by NCCL before being freed (init.cc:180-184,
 * 335), which CommCheck reports as corrupted. */
ncclResult_t comm_check(struct ncclComm *c, const char *opname) {
  if (!c) {
    warn("%s : comm argument is NULL", opname);
    return ncclInvalidArgument;
  }
  if (atomic_load(&c->magic) != COMM_LIVE) {
    warn("Error: corrupted comm object detected");
    return ncclInvalidArgument;
  }
  return ncclSuccess;
}

/* ncclCommEnsureReady (init.cc:373-389). */
ncclResult_t ensure_ready(struct ncclComm *c) {
  if (comm_aborted(c)) return ncclSuccess;
  ncclResult_t s = comm_state(c);
  if (s == ncclInProgress) {
    warn("Attempt to use communicator before the previous operation returned ncclSuccess");
    return ncclInvalidArgument;
  }
  if (s != ncclSuccess) show_async_msg(c);
  return s;
}

/* CudaPtrCheck (misc/argcheck.cc:10-26), on the double's memory registry. */
static ncclResult_t ptr_check(struct ncclComm *c, const void *p, size_t bytes, const char *name,
                              const char *opname) {
  int dev = -1;
  enum dbl_mem_kind k = dbl_mem_find(p, bytes, &dev);
  if (k == DBL_MEM_HOST || k == DBL_MEM_FREED) {
    warn("%s : %s %p is not a valid pointer", opname, name, p);
    dbl_log("nccl double: %s %p is %s", name, p, k == DBL_MEM_FREED ? "freed device memory"
                                                                     : "not device memory");
    return ncclInvalidArgument;
  }
  if (dev != c->device) {
    warn("%s : %s allocated on device %d mismatchs with NCCL device %d", opname, name, dev,
         c->device);
    return ncclInvalidArgument;
  }
  if (k == DBL_MEM_OVERRUN)
    dbl_fatal("nccl double: %s on rank %d of %s: %s %p + %zu bytes runs past the end of its "
              "device allocation (real NCCL would read or write out of bounds)",
              opname, c->rank, c->name, name, p, bytes);
  return ncclSuccess;
}

static int is_registered(struct ncclComm *c, const void *p, size_t bytes) {
  int yes = 0;
  pthread_mutex_lock(&c->mu);
  for (struct reg *r = c->regs; r && !yes; r = r->next)
    yes = (const char *)p >= r->ptr && (const char *)p + bytes <= r->ptr + r->bytes;
  pthread_mutex_unlock(&c->mu);
  return yes;
}

static int overlap(const void *a, size_t na, const void *b, size_t nb) {
  const char *x = a, *y = b;
  return na && nb && x < y + nb && y < x + na;
}

/* Enqueue one operation (ncclEnqueueCheck): comm check, readiness, the
 * checks of ArgsCheck (misc/argcheck.cc:45-83), then the task joins this
 * thread's group, launched at the outermost ncclGroupEnd. */
ncclResult_t enqueue(const char *opname, const char *api, struct ncclComm *c,
                     struct task *t, ncclRedOp_t op) {
  check_poisoned(api);
  ncclResult_t ret = comm_check(c, opname);
  if (ret != ncclSuccess) return group_err(ret);
  if (c->revoked) { /* enqueue.cc:2624-2627 */
    warn("%s: communicator was revoked", opname);
    return group_err(ncclInvalidUsage);
  }
  g_depth++;
  ret = ensure_ready(c);
  int uop = -1;
  size_t es = dt_size(t->dtype), n = (size_t)c->nranks;
  if (ret == ncclSuccess && (t->root < 0 || t->root >= c->nranks)) {
    warn("%s : invalid root %d (root should be in the 0..%d range)", opname, t->root, c->nranks);
    ret = ncclInvalidArgument;
  }
  if (ret == ncclSuccess && (t->dtype < 0 || t->dtype >= ncclNumTypes)) {
    warn("%s : invalid type %d", opname, t->dtype);
    ret = ncclInvalidArgument;
  }
  if (ret == ncclSuccess) {
    int v = (int)op;
    t->opc = OPC_SUM;
    /* (op > ncclMaxRedOp cannot happen with a 32-bit enum; nccl.h:291-296) */
    if (v < 0) {
      warn("%s : invalid reduction operation %d", opname, v);
      ret = ncclInvalidArgument;
    } else if (v >= ncclNumOps) {
      unsigned u = (unsigned)(v - ncclNumOps);
      pthread_mutex_lock(&c->mu);
      int ix = (int)(u >> 8);
      if ((u & 255u) != c->salt || ix >= c->nuops || !c->uops[ix].live) {
        warn("%s : reduction operation %d unknown to this communicator", opname, v);
        ret = ncclInvalidArgument;
      } else {
        uop = ix;
        t->opc = OPC_PREMUL;
      }
      pthread_mutex_unlock(&c->mu);
    } else {
      t->opc = v;
    }
  }
  /* Pointers (misc/argcheck.cc:71-80), skipped for empty operations. */
  size_t sbytes = 0, rbytes = 0;
  if (ret == ncclSuccess) {
    switch (t->func) {
      case F_AR: case F_BC: case F_RED: sbytes = rbytes = t->count * es; break;
      case F_AG: sbytes = t->count * es; rbytes = n * t->count * es; break;
      case F_RS: sbytes = n * t->count * es; rbytes = t->count * es; break;
      case F_SEND: sbytes = t->count * es; break;
      case F_RECV: rbytes = t->count * es; break;
    }
    if (t->func == F_SEND || t->func == F_RECV) {
      if (t->count > 0)
        ret = ptr_check(c, t->func == F_SEND ? t->send : t->recv, t->count * es, "buff", opname);
    } else if (t->count > 0) {
      if (t->func != F_BC || c->rank == t->root)
        ret = ptr_check(c, t->send, sbytes, "sendbuff", opname);
      if (ret == ncclSuccess && (t->func != F_RED || c->rank == t->root))
        ret = ptr_check(c, t->recv, rbytes, "recvbuff", opname);
    }
  }
  /* taskAppend (enqueue.cc:2549-2576). */
  int discard = is_coll(t->func) && t->count == 0; /* enqueue.cc:2555-2556 */
  if (ret == ncclSuccess && !discard && is_reduction(t->func) &&
      (t->dtype == ncclFloat8e4m3 || t->dtype == ncclFloat8e5m2)) {
    /* enqueue.cc:2558-2561: the double's devices do not reduce fp8. */
    warn("FP8 reduction support begins with sm90 capable devices.");
    ret = ncclInvalidArgument;
  }
  if (ret == ncclSuccess && !discard && uop >= 0 && is_reduction(t->func)) {
    /* hostToDevRedOp copies the op's state now: it may be destroyed before
     * the group ends (enqueue.cc:2564-2566, 2325-2333). */
    pthread_mutex_lock(&c->mu);
    struct user_op u = c->uops[uop];
    pthread_mutex_unlock(&c->mu);
    if (u.dtype != t->dtype) {
      warn("Data type supplied to user-created ncclRedOp_t does not match type given to "
           "reduction operation");
      ret = ncclInvalidArgument;
    } else {
      t->scal_kind = u.residence + 1;
      t->scal_bits = u.bits;
      t->scal_ptr = u.ptr;
    }
  }
  if (!is_reduction(t->func)) t->opc = OPC_SUM;
  if (ret == ncclSuccess && !discard) {
    /* Partial overlaps are undefined (NCCL user guide, "In-place
     * Operations": all-gather is in place when sendbuff == recvbuff +
     * rank * sendcount, reduce-scatter when recvbuff == sendbuff + rank *
     * recvcount, the others when sendbuff == recvbuff). */
    int used_send = t->func != F_RECV && (t->func != F_BC || c->rank == t->root);
    int used_recv = t->func != F_SEND && (t->func != F_RED || c->rank == t->root);
    int inplace = t->send == t->recv;
    if (t->func == F_AG) inplace = (const char *)t->send == (char *)t->recv + (size_t)c->rank * sbytes;
    if (t->func == F_RS) inplace = (char *)t->recv == (const char *)t->send + (size_t)c->rank * rbytes;
    if (is_coll(t->func) && used_send && used_recv && !inplace &&
        overlap(t->send, sbytes, t->recv, rbytes))
      dbl_fatal("nccl double: %s on rank %d of %s: sendbuff %p (%zu bytes) and recvbuff %p (%zu "
                "bytes) overlap without being in place (NCCL user guide, \"In-place "
                "Operations\"): NCCL's result would be undefined",
                api, c->rank, c->name, t->send, sbytes, t->recv, rbytes);
    /* Registered buffers (NCCL user guide, "User Buffer Registration"). */
    t->reg = (!used_send || is_registered(c, t->send, sbytes)) &&
             (!used_recv || is_registered(c, t->recv, rbytes));
    ret = group_mode(c->blocking);
    if (ret == ncclSuccess) {
      struct plan *p = plan_for(c);
      if (!p) {
        ret = ncclSystemError;
      } else {
        if (p->n == p->cap) {
          int cap = p->cap ? 2 * p->cap : 8;
          struct task *nt = realloc(p->tasks, sizeof *nt * (size_t)cap);
          if (!nt) dbl_fatal("nccl double: out of memory");
          p->tasks = nt;
          p->cap = cap;
        }
        p->tasks[p->n++] = *t;
      }
    }
  }
  /* Non-blocking: a failed enqueue becomes the communicator's error
   * (enqueue.cc:2660-2662). */
  if (ret != ncclSuccess && !c->blocking) set_async(c, ret, tl_last_error);
  group_err(ret);
  ncclResult_t e = group_end_internal();
  if (e != ncclSuccess && e != ncclInProgress) return e;
  if (!c->blocking) ret = (ncclResult_t)atomic_load(&c->async); /* enqueue.cc:2658 */
  return ret;
}

/* ---- collectives ---- */

/* One task of the collective or point-to-point func (root: the root rank,
 * or the peer of a send or receive), enqueued under its NCCL names. */
static ncclResult_t enqueue_task(const char *name, const char *api, int func,
                                 const void *sendbuff, void *recvbuff, size_t count,
                                 ncclDataType_t datatype, int root, ncclRedOp_t op,
                                 ncclComm_t comm, cudaStream_t stream) {
  struct task t = {.func = func, .send = sendbuff, .recv = recvbuff, .count = count,
                   .dtype = datatype, .root = root, .stream = stream};
  return enqueue(name, api, comm, &t, op);
}

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream) {
  return enqueue_task("AllReduce", "ncclAllReduce", F_AR, sendbuff, recvbuff, count, datatype,
                      0, op, comm, stream);
}

ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm,
                           cudaStream_t stream) {
  return enqueue_task("Broadcast", "ncclBroadcast", F_BC, sendbuff, recvbuff, count, datatype,
                      root, ncclSum, comm, stream);
}

ncclResult_t ncclBcast(void *buff, size_t count, ncclDataType_t datatype, int root,
                       ncclComm_t comm, cudaStream_t stream) {
  return ncclBroadcast(buff, buff, count, datatype, root, comm, stream);
}

ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count,
                        ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
                        cudaStream_t stream) {
  return enqueue_task("Reduce", "ncclReduce", F_RED, sendbuff, recvbuff, count, datatype, root,
                      op, comm, stream);
}

ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  return enqueue_task("AllGather", "ncclAllGather", F_AG, sendbuff, recvbuff, sendcount,
                      datatype, 0, ncclSum, comm, stream);
}

ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream) {
  return enqueue_task("ReduceScatter", "ncclReduceScatter", F_RS, sendbuff, recvbuff, recvcount,
                      datatype, 0, op, comm, stream);
}

ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  return enqueue_task("Send", "ncclSend", F_SEND, sendbuff, NULL, count, datatype, peer, ncclSum,
                      comm, stream);
}

ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  return enqueue_task("Recv", "ncclRecv", F_RECV, NULL, recvbuff, count, datatype, peer, ncclSum,
                      comm, stream);
}

/* ---- groups (group.cc:93-110) ---- */

ncclResult_t ncclGroupStart(void) {
  env_init();
  check_poisoned("ncclGroupStart");
  g_depth++;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void) {
  check_poisoned("ncclGroupEnd");
  return group_end_internal();
}

/* ---- pre-multiplied sums (enqueue.cc:2664-2732) ---- */

ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t *op, void *scalar, ncclDataType_t datatype,
                                      ncclScalarResidence_t residence, ncclComm_t comm) {
  ncclResult_t r = comm_check(comm, "ncclRedOpCreatePreMulSum");
  if (r == ncclSuccess) r = ensure_ready(comm);
  if (r != ncclSuccess) return r;
  if (!op) {
    warn("ncclRedOpCreatePreMulSum : op argument is NULL");
    return ncclInvalidArgument;
  }
  size_t es = dt_size(datatype);
  if (residence == ncclScalarHostImmediate && es < 1) return ncclInternalError;
  pthread_mutex_lock(&comm->mu);
  int ix = 0;
  while (ix < comm->nuops && comm->uops[ix].live) ix++;
  if (ix == comm->nuops) {
    struct user_op *n = realloc(comm->uops, sizeof *n * (size_t)(comm->nuops + 4));
    if (!n) dbl_fatal("nccl double: out of memory");
    memset(n + comm->nuops, 0, sizeof *n * 4);
    comm->uops = n;
    comm->nuops += 4;
  }
  struct user_op *u = &comm->uops[ix];
  u->live = 1;
  u->dtype = datatype;
  u->residence = residence;
  u->bits = 0;
  u->ptr = NULL;
  if (residence == ncclScalarHostImmediate)
    memcpy(&u->bits, scalar, es);
  else
    u->ptr = scalar;
  *op = (ncclRedOp_t)(ncclNumOps + ((unsigned)ix << 8) + comm->salt);
  pthread_mutex_unlock(&comm->mu);
  return ncclSuccess;
}

ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm) {
  int v = (int)op;
  if (0 <= v && v < (int)ncclNumOps) {
    warn("ncclRedOpDestroy : operator is a NCCL builtin.");
    return ncclInvalidArgument;
  }
  if (v < 0) {
    warn("ncclRedOpDestroy :  operator is garbage.");
    return ncclInvalidArgument;
  }
  if (!comm) {
    warn("ncclRedOpDestroy : invalid communicator passed.");
    return ncclInvalidArgument;
  }
  /* ncclRedOpDestroy checks neither the handle nor the communicator's state
   * (enqueue.cc:2708-2736): it reads and writes comm->userRedOps, which
   * ncclCommAbort and ncclCommDestroy free with the communicator (commFree,
   * init.cc:264).  And after a call on a non-blocking communicator answered
   * ncclInProgress, the NCCL user guide ("Creating a communication with
   * options", non-blocking communicators) allows only ncclCommGetAsyncError
   * and ncclCommAbort until ncclCommGetAsyncError reports ncclSuccess.  The
   * double stops loudly in both cases. */
  if (atomic_load(&comm->magic) != COMM_LIVE || comm->destroy_flag)
    dbl_fatal("nccl double: ncclRedOpDestroy(%d) on rank %d of communicator %s after "
              "ncclCommAbort or ncclCommDestroy: NCCL frees the communicator's reduction "
              "operations with it (commFree, init.cc:264) and ncclRedOpDestroy checks "
              "neither the handle nor its state (enqueue.cc:2708-2736), so real NCCL would "
              "write freed memory; the abort already freed the operation",
              v, comm->rank, comm->name);
  if (!comm->blocking && atomic_load(&comm->async) == ncclInProgress)
    dbl_fatal("nccl double: ncclRedOpDestroy(%d) on rank %d of communicator %s while a "
              "call on it is still in progress (it answered ncclInProgress and "
              "ncclCommGetAsyncError has not reported ncclSuccess since): the NCCL user "
              "guide allows only ncclCommGetAsyncError and ncclCommAbort on a non-blocking "
              "communicator until then (an enqueue that timed out is aborted, and the "
              "abort frees the operation)",
              v, comm->rank, comm->name);
  unsigned u = (unsigned)(v - ncclNumOps);
  int ix = (int)(u >> 8);
  pthread_mutex_lock(&comm->mu);
  int known = (u & 255u) == comm->salt && ix < comm->nuops && comm->uops[ix].live;
  if (known) comm->uops[ix].live = 0;
  pthread_mutex_unlock(&comm->mu);
  if (!known) {
    warn("ncclRedOpDestroy : operator unknown to this communicator.");
    return ncclInvalidArgument;
  }
  return ncclSuccess;
}

/* ---- memory and registration (allocator.cc, register/register.cc) ---- */

ncclResult_t ncclMemAlloc(void **ptr, size_t size) {
  if (!ptr) return cuda_fail(cudaErrorInvalidValue); /* falls back to cudaMalloc(NULL, ...) */
  if (size == 0) {
    *ptr = NULL;
    return ncclSuccess;
  }
  cudaError_t e = dbl_mem_alloc(dbl_device_current(), size, ptr);
  return e == cudaSuccess ? ncclSuccess : cuda_fail(e);
}

ncclResult_t ncclMemFree(void *ptr) {
  if (!ptr) return ncclSuccess;
  cudaError_t e = dbl_mem_free(ptr);
  return e == cudaSuccess ? ncclSuccess : cuda_fail(e);
}

/* ncclCommRegister / ncclRegister (register/register.cc:27-64, 116-126):
 * a registration covers [buff, buff + size), counted per communicator. */
/* NCCL's user guide, "Creating a communication with options"
 * (usage/communicators.html, non-blocking communicators): once a call on a
 * non-blocking communicator returned ncclInProgress, the application polls
 * ncclCommGetAsyncError and issues no other NCCL call on it until the state
 * is ncclSuccess.  The collectives and ncclCommSplit check this
 * (ncclCommEnsureReady, init.cc:373-389); ncclCommRegister and
 * ncclCommDeregister do not (register/register.cc:117-140) and would touch
 * the communicator's registration cache while its init or split job fills
 * it in NCCL's thread.  The double stops loudly instead (meshpg issue 19,
 * R2: a second thread that reached a communicator while the first one was
 * polling it). */
static void reg_ready_check(struct ncclComm *c, const char *opname) {
  if (comm_aborted(c)) return;
  if (comm_state(c) == ncclInProgress)
    dbl_fatal("nccl double: %s on rank %d of communicator %s while a previous call on it is "
              "still in progress (ncclInProgress): NCCL's user guide forbids any other call on "
              "a non-blocking communicator until ncclCommGetAsyncError reports ncclSuccess, "
              "and registration is not checked, so real NCCL would race the communicator's job",
              opname, c->rank, c->name);
}

ncclResult_t ncclCommRegister(const ncclComm_t comm, void *buff, size_t size, void **handle) {
  ncclResult_t r = comm_check(comm, "ncclCommRegister");
  if (r != ncclSuccess) return r;
  reg_ready_check(comm, "ncclCommRegister");
  if (!handle) {
    warn("ncclCommRegister : handle argument is NULL");
    return ncclInvalidArgument;
  }
  int dev = -1;
  enum dbl_mem_kind k = dbl_mem_find(buff, 1, &dev);
  if (k != DBL_MEM_DEVICE) {
    warn("ncclCommRegister : buff %p is not a valid pointer", buff);
    return ncclInvalidArgument;
  }
  if (dev != comm->device) {
    warn("ncclCommRegister : buff allocated on device %d mismatchs with NCCL device %d", dev,
         comm->device);
    return ncclInvalidArgument;
  }
  pthread_mutex_lock(&comm->mu);
  struct reg *g = comm->regs;
  while (g && !((char *)buff >= g->ptr && (char *)buff + size <= g->ptr + g->bytes)) g = g->next;
  if (g) {
    g->refs++;
  } else {
    g = calloc(1, sizeof *g);
    if (!g) dbl_fatal("nccl double: out of memory");
    g->ptr = buff;
    g->bytes = size;
    g->refs = 1;
    g->next = comm->regs;
    comm->regs = g;
  }
  pthread_mutex_unlock(&comm->mu);
  *handle = g;
  return ncclSuccess;
}

ncclResult_t ncclCommDeregister(const ncclComm_t comm, void *handle) {
  ncclResult_t r = comm_check(comm, "ncclCommRegister"); /* NCCL's opname, register.cc:140 */
  if (r != ncclSuccess || !handle) return r;
  reg_ready_check(comm, "ncclCommDeregister");
  pthread_mutex_lock(&comm->mu);
  struct reg **pp = &comm->regs;
  while (*pp && *pp != handle) pp = &(*pp)->next;
  int found = *pp != NULL;
  if (found && --(*pp)->refs == 0) {
    struct reg *g = *pp;
    *pp = g->next;
    free(g);
  }
  pthread_mutex_unlock(&comm->mu);
  if (!found) {
    warn("Deregister: Could not find handle"); /* register.cc:148-150 */
    return ncclInvalidUsage;
  }
  return ncclSuccess;
}
