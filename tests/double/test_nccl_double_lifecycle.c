/* The NCCL half of the test double (test_nccl_double.c): argument errors
 * with NCCL's wording, the life cycle, fault injection, registration. */

#include "test_nccl_double.h"

/* ------------------------------------------------------------------------ */
/* Argument errors, with NCCL's wording                                     */
/* ------------------------------------------------------------------------ */

static int arg_errors(struct rank *rk) {
  float host[4] = {0};
  /* `other` is device 1's, allocated before the ranks started: a
   * cudaMalloc on device 1 now would wait for rank 1's kernel. */
  void *dev = NULL, *freed = NULL, *other = rk->arg;
  CUDA_OK(cudaMalloc(&dev, 64));
  CUDA_OK(cudaMalloc(&freed, 64)); /* freed last: no allocation reuses it */
  CUDA_OK(cudaFree(freed));
  char want[128];
  snprintf(want, sizeof want, "AllReduce : sendbuff %p is not a valid pointer", (void *)host);
  EXPECT_ERR(ncclAllReduce(host, dev, 4, ncclFloat32, ncclSum, rk->comm, 0), ncclInvalidArgument, want);
  snprintf(want, sizeof want, "AllReduce : recvbuff %p is not a valid pointer", freed);
  EXPECT_ERR(ncclAllReduce(dev, freed, 4, ncclFloat32, ncclSum, rk->comm, 0), ncclInvalidArgument, want);
  EXPECT_ERR(ncclAllReduce(other, dev, 4, ncclFloat32, ncclSum, rk->comm, 0), ncclInvalidArgument,
             "AllReduce : sendbuff allocated on device 1 mismatchs with NCCL device 0");
  EXPECT_ERR(ncclBroadcast(dev, dev, 4, ncclFloat32, 2, rk->comm, 0), ncclInvalidArgument,
             "Broadcast : invalid root 2 (root should be in the 0..2 range)");
  EXPECT_ERR(ncclSend(dev, 4, ncclFloat32, -1, rk->comm, 0), ncclInvalidArgument,
             "Send : invalid root -1");
  EXPECT_ERR(ncclAllReduce(dev, dev, 4, (ncclDataType_t)12, ncclSum, rk->comm, 0), ncclInvalidArgument,
             "AllReduce : invalid type 12");
  EXPECT_ERR(ncclAllReduce(dev, dev, 4, ncclFloat32, (ncclRedOp_t)-3, rk->comm, 0), ncclInvalidArgument,
             "AllReduce : invalid reduction operation -3");
  EXPECT_ERR(ncclAllReduce(dev, dev, 4, ncclFloat32, (ncclRedOp_t)77, rk->comm, 0), ncclInvalidArgument,
             "AllReduce : reduction operation 77 unknown to this communicator");
  EXPECT_ERR(ncclAllReduce(dev, dev, 4, ncclFloat8e4m3, ncclSum, rk->comm, 0), ncclInvalidArgument,
             "FP8 reduction support begins with sm90 capable devices.");
  float one = 1;
  ncclRedOp_t op;
  NCCL_OK(ncclRedOpCreatePreMulSum(&op, &one, ncclFloat32, ncclScalarHostImmediate, rk->comm));
  EXPECT_ERR(ncclAllReduce(dev, dev, 4, ncclFloat64, op, rk->comm, 0), ncclInvalidArgument,
             "Data type supplied to user-created ncclRedOp_t does not match type given to reduction operation");
  NCCL_OK(ncclRedOpDestroy(op, rk->comm));
  EXPECT_ERR(ncclRedOpDestroy(op, rk->comm), ncclInvalidArgument,
             "ncclRedOpDestroy : operator unknown to this communicator.");
  EXPECT_ERR(ncclRedOpDestroy(ncclSum, rk->comm), ncclInvalidArgument,
             "ncclRedOpDestroy : operator is a NCCL builtin.");
  EXPECT_ERR(ncclAllReduce(dev, dev, 4, ncclFloat32, ncclSum, NULL, 0), ncclInvalidArgument,
             "AllReduce : comm argument is NULL");
  /* fp8 moves without reducing; empty collectives are dropped */
  NCCL_OK(ncclAllGather((char *)dev + 4 * rk->rank, dev, 4, ncclFloat8e5m2, rk->comm, 0));
  NCCL_OK(ncclAllReduce(NULL, NULL, 0, ncclFloat32, ncclSum, rk->comm, 0));
  CUDA_OK(cudaStreamSynchronize(0));
  cudaFree(dev);
  return 0;
}

/* A world of 2 so that root 2 is out of range; rank 0 checks, rank 1 waits
 * for the two collectives that succeed. */
static int arg_errors_2(struct rank *rk) {
  if (rk->rank == 0) return arg_errors(rk);
  void *dev = NULL;
  CUDA_OK(cudaMalloc(&dev, 64));
  NCCL_OK(ncclAllGather((char *)dev + 4 * rk->rank, dev, 4, ncclFloat8e5m2, rk->comm, 0));
  CUDA_OK(cudaStreamSynchronize(0));
  cudaFree(dev);
  return 0;
}

Test(errors, nccl_argument_checks_and_wording) {
  void *other = NULL;
  cr_assert_eq(cudaSetDevice(1), cudaSuccess);
  cr_assert_eq(cudaMalloc(&other, 64), cudaSuccess);
  cr_assert_eq(cudaSetDevice(0), cudaSuccess);
  run_world(2, arg_errors_2, other);
  cr_assert_eq(cudaFree(other), cudaSuccess);
}

/* On a non-blocking communicator a failed enqueue becomes its error
 * (enqueue.cc:2660-2662): later calls report it. */
static int nonblocking_error_sticks(struct rank *rk) {
  float host[4] = {0};
  ncclResult_t r = ncclAllReduce(host, host, 4, ncclFloat32, ncclSum, rk->comm, 0);
  RCHECK(r == ncclInvalidArgument, "got %s", ncclGetErrorString(r));
  ncclResult_t st;
  NCCL_OK(ncclCommGetAsyncError(rk->comm, &st));
  RCHECK(st == ncclInvalidArgument && strstr(ncclGetLastError(NULL), "is not a valid pointer"),
         "async %s: %s", ncclGetErrorString(st), ncclGetLastError(NULL));
  int n = 0;
  RCHECK(ncclCommCount(rk->comm, &n) == ncclInvalidArgument, "count after the error");
  NCCL_OK(ncclCommAbort(rk->comm));
  rk->comm = NULL;
  return 0;
}

Test(errors, nonblocking_communicator_keeps_the_error) {
  run_world_cfg(1, 0, nonblocking_error_sticks, NULL);
}

/* ------------------------------------------------------------------------ */
/* Life cycle                                                                */
/* ------------------------------------------------------------------------ */

static int lifecycle(struct rank *rk) {
  int32_t *buf = NULL, v = rk->rank + 1;
  CUDA_OK(cudaMalloc((void **)&buf, 4));
  CUDA_OK(cudaMemcpy(buf, &v, 4, cudaMemcpyHostToDevice));
  ncclResult_t r = ncclAllReduce(buf, buf, 1, ncclInt32, ncclSum, rk->comm, 0);
  RCHECK(r == ncclInProgress, "non-blocking all-reduce answered %s", ncclGetErrorString(r));
  ncclResult_t st = ncclInProgress;
  while (st == ncclInProgress) NCCL_OK(ncclCommGetAsyncError(rk->comm, &st));
  RCHECK(st == ncclSuccess, "%s", ncclGetErrorString(st));
  r = ncclCommFinalize(rk->comm);
  RCHECK(r == ncclInProgress || r == ncclSuccess, "finalize: %s", ncclGetErrorString(r));
  st = ncclInProgress;
  while (st == ncclInProgress) NCCL_OK(ncclCommGetAsyncError(rk->comm, &st));
  RCHECK(st == ncclSuccess, "after finalize: %s", ncclGetErrorString(st));
  CUDA_OK(cudaMemcpy(&v, buf, 4, cudaMemcpyDeviceToHost));
  RCHECK(v == 3, "sum %d", v);
  EXPECT_ERR(ncclCommFinalize(rk->comm), ncclInvalidArgument, "called twice");
  /* the double finalize made the communicator's state an error: abort */
  NCCL_OK(ncclCommAbort(rk->comm));
  EXPECT_ERR(ncclCommGetAsyncError(rk->comm, &st), ncclInvalidArgument,
             "Error: corrupted comm object detected");
  EXPECT_ERR(ncclCommAbort(rk->comm), ncclInvalidArgument, "has already been destroyed");
  rk->comm = NULL;
  cudaFree(buf);
  return 0;
}

Test(lifecycle, nonblocking_finalize_destroy_and_use_after_abort) {
  run_world_cfg(2, 0, lifecycle, NULL);
}

static int dup_gpu(struct rank *rk) {
  CUDA_OK(cudaSetDevice(0));
  ncclComm_t c = NULL;
  ncclUniqueId *id = rk->arg;
  ncclResult_t r = ncclCommInitRank(&c, 2, *id, rk->rank);
  char want[128];
  snprintf(want, sizeof want, "Duplicate GPU detected : rank %d and rank %d both on CUDA device 10000",
           rk->rank, 1 - rk->rank);
  RCHECK(r == ncclInvalidUsage && !strcmp(ncclGetLastError(NULL), want), "got %s: \"%s\"",
         ncclGetErrorString(r), ncclGetLastError(NULL));
  RCHECK(c != NULL, "no handle to abort");
  NCCL_OK(ncclCommAbort(c));
  return 0;
}

Test(lifecycle, duplicate_gpu_refused) {
  ncclUniqueId id;
  cr_assert_eq(ncclGetUniqueId(&id), ncclSuccess);
  run_threads(2, dup_gpu, &id);
}

/* A kernel waiting for a peer that never issues its collective is freed by
 * ncclCommAbort, which then returns (no other kernel holds the device). */
static int abort_stuck(struct rank *rk) {
  void *b = NULL;
  CUDA_OK(cudaMalloc(&b, 64));
  if (rk->rank == 0) {
    NCCL_OK(ncclAllReduce(b, b, 16, ncclFloat32, ncclSum, rk->comm, 0));
    struct timespec ts = {0, 200 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  double t0 = now_s();
  NCCL_OK(ncclCommAbort(rk->comm));
  rk->comm = NULL;
  CUDA_OK(cudaStreamSynchronize(0));
  RCHECK(now_s() - t0 < 5, "abort took %.1f s", now_s() - t0);
  CUDA_OK(cudaFree(b));
  return 0;
}

Test(lifecycle, abort_unblocks_a_stuck_kernel) { run_world(2, abort_stuck, NULL); }

/* A comm_pair whose rank 0 has an all-reduce on B in flight. */
static int stuck_on_b(struct rank *rk, struct comm_pair *p) {
  if (comm_pair_open(rk, p)) return -1;
  if (rk->rank == 0) NCCL_OK(ncclAllReduce(p->x, p->x, 4, ncclFloat32, ncclSum, p->b, 0));
  return 0;
}

/* Two threads that open a comm_pair with fn. */
static void run_pair(rank_fn fn) {
  ncclUniqueId ids[2];
  cr_assert_eq(ncclGetUniqueId(&ids[0]), ncclSuccess);
  cr_assert_eq(ncclGetUniqueId(&ids[1]), ncclSuccess);
  run_threads(2, fn, ids);
}

#ifdef NCCL_REVOKE_DEFAULT /* ncclCommRevoke: nccl.h of 2.28.9 and later */
/* Rank 0's kernel on B waits for rank 1, which never issues it.  Aborting
 * A first would wait for that kernel (cudaFree); revoking B first stops it,
 * so that A's abort and B's destroy return at once. */
static int revoke_first(struct rank *rk) {
  struct comm_pair p = {0};
  if (stuck_on_b(rk, &p)) return -1;
  double t0 = now_s();
  NCCL_OK(ncclCommRevoke(p.b, NCCL_REVOKE_DEFAULT));
  EXPECT_ERR(ncclAllReduce(p.x, p.x, 4, ncclFloat32, ncclSum, p.b, 0), ncclInvalidUsage,
             "AllReduce: communicator was revoked");
  NCCL_OK(ncclCommAbort(p.a));
  NCCL_OK(ncclCommDestroy(p.b));
  RCHECK(now_s() - t0 < 2, "revoke, abort and destroy took %.1f s", now_s() - t0);
  CUDA_OK(cudaFree(p.x));
  return 0;
}
#endif

/* The same with meshpg's other way out: every abort in one group.  NCCL
 * sets each abort flag at the call and frees at the outermost ncclGroupEnd. */
static int grouped_aborts(struct rank *rk) {
  struct comm_pair p = {0};
  if (stuck_on_b(rk, &p)) return -1;
  double t0 = now_s();
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclCommAbort(p.a));
  NCCL_OK(ncclCommAbort(p.b));
  NCCL_OK(ncclGroupEnd());
  RCHECK(now_s() - t0 < 2, "grouped aborts took %.1f s", now_s() - t0);
  EXPECT_ERR(ncclCommAbort(p.b), ncclInvalidArgument, "has already been destroyed");
  CUDA_OK(cudaFree(p.x));
  return 0;
}

Test(lifecycle, grouped_aborts_never_wait) {
  run_pair(grouped_aborts);
}

#ifdef NCCL_REVOKE_DEFAULT
Test(lifecycle, revoke_before_abort_never_waits) {
  run_pair(revoke_first);
}
#endif

/* ------------------------------------------------------------------------ */
/* Fault injection                                                           */
/* ------------------------------------------------------------------------ */

static int hang_fault(struct rank *rk) {
  void *b = NULL;
  CUDA_OK(cudaMalloc(&b, 64));
  NCCL_OK(ncclAllReduce(b, b, 16, ncclFloat32, ncclSum, rk->comm, 0)); /* op 1 */
  CUDA_OK(cudaStreamSynchronize(0));
  NCCL_OK(ncclAllReduce(b, b, 16, ncclFloat32, ncclSum, rk->comm, 0)); /* op 2: rank 1 hangs */
  struct timespec ts = {0, 300 * 1000 * 1000};
  nanosleep(&ts, NULL);
  dbl_stats_t s;
  dbl_stats(&s);
  RCHECK(s.collectives == 2, "%llu collectives ran, want 2 (op 2 must hang on both ranks)",
         (unsigned long long)s.collectives);
  NCCL_OK(ncclCommAbort(rk->comm));
  rk->comm = NULL;
  CUDA_OK(cudaStreamSynchronize(0));
  CUDA_OK(cudaFree(b));
  return 0;
}

Test(faults, hang_until_abort) {
  setenv("MESHPG_DOUBLE_FAULT", "hang:1:2", 1);
  run_world(2, hang_fault, NULL);
}

static int async_fault(struct rank *rk) {
  void *b = NULL;
  CUDA_OK(cudaMalloc(&b, 64));
  NCCL_OK(ncclAllReduce(b, b, 16, ncclFloat32, ncclSum, rk->comm, 0));
  CUDA_OK(cudaStreamSynchronize(0));
  ncclResult_t st;
  NCCL_OK(ncclCommGetAsyncError(rk->comm, &st));
  if (rk->rank == 0) {
    RCHECK(st == ncclSystemError && strstr(ncclGetLastError(NULL), "async:0:1"), "%s: %s",
           ncclGetErrorString(st), ncclGetLastError(NULL));
    NCCL_OK(ncclCommAbort(rk->comm));
    rk->comm = NULL;
  } else {
    RCHECK(st == ncclSuccess, "%s", ncclGetErrorString(st));
  }
  CUDA_OK(cudaFree(b));
  return 0;
}

Test(faults, async_error) {
  setenv("MESHPG_DOUBLE_FAULT", "async:0:1", 1);
  run_world(2, async_fault, NULL);
}

/* ------------------------------------------------------------------------ */
/* Registration                                                              */
/* ------------------------------------------------------------------------ */

int registered(struct rank *rk) {
  int mismatch = rk->arg != NULL;
  void *b = NULL, *h = NULL;
  if (!mismatch || rk->rank == 0) {
    NCCL_OK(ncclMemAlloc(&b, 4096));
    NCCL_OK(ncclCommRegister(rk->comm, b, 4096, &h));
  } else {
    CUDA_OK(cudaMalloc(&b, 4096));
  }
  NCCL_OK(ncclAllReduce(b, (char *)b + 1024, 100, ncclFloat32, ncclSum, rk->comm, 0));
  CUDA_OK(cudaStreamSynchronize(0));
  if (h) {
    NCCL_OK(ncclCommDeregister(rk->comm, h));
    EXPECT_ERR(ncclCommDeregister(rk->comm, h), ncclInvalidUsage, "Deregister: Could not find handle");
    NCCL_OK(ncclMemFree(b));
  } else {
    CUDA_OK(cudaFree(b));
  }
  return 0;
}

Test(registration, every_rank_registered) { run_world(2, registered, NULL); }
