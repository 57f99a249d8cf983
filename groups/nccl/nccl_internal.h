/* The NCCL backend's internal header: the structs its files share and
 * their mpg__nccl_* functions.  The backend puts communicators on CUDA
 * devices, buffers in device memory and work ordered on the caller's
 * cudaStream_t; it fills `const struct mpg__backend_ops mpg__backend_nccl`
 * (groups/backend.h).  One job per file:
 *
 *   comm.c       the communicator object: config, creation, references,
 *                polling its async state against the deadline, marking it
 *                aborted with its lock held; and the helpers every file uses (error
 *                text, device switch, pacing of polls).
 *   world.c      joining the world: how the ranks agree on the NCCL unique
 *                id (the caller's id, a local one, MPI, NCCL_COMM_ID,
 *                meshpg's rendezvous at MASTER_ADDR), the
 *                CUDA device (chosen by groups/device.c) and the init call.
 *   lifecycle.c  split, abort, with NCCL's part on a thread of its own,
 *                destroy; the function table.
 *   ops.c        operations: post, post_batch (sends and receives as one
 *                NCCL group), test, wait, free; dtype and op mapping,
 *                pre-multiplied sums.
 *   local.c      size-1 groups: a copy, or a scale kernel (PTX), on the
 *                caller's stream.
 *   widen.c      f16/bf16 collectives with f32 accumulation
 *                (mpg__coll.acc_f32): widen and narrow kernels (PTX) and
 *                the stream-ordered f32 buffer around ops.c's collective.
 *   mem.c        device memory (cudaMalloc, or ncclMemAlloc registered
 *                through reg.c) and streams (create, destroy, order).
 *   reg.c        the communicators of a context (its "family"): every one
 *                has every registered buffer registered, and their
 *                launches keep one order when NCCL does not.
 * Every file uses comm.c; lifecycle.c, through the function table, uses
 * every other file but widen.c; ops.c uses widen.c; mem.c, world.c, ops.c
 * and lifecycle.c use reg.c; no other file uses another.
 *
 * Threads.  Each communicator has a mutex held around every NCCL call on it
 * (released while polling), so abort never runs while another of our
 * threads is inside NCCL for that communicator.  "Lock held" in a comment
 * means the caller holds c->lock.  The abort op raises the flags and
 * returns: ncclCommAbort runs on a thread of its own (lifecycle.c).
 *
 * Exactly these external calls are used:
 *   NCCL:  ncclGetUniqueId, ncclCommInitRankConfig, ncclCommSplit,
 *          ncclCommGetAsyncError, ncclCommCount, ncclCommUserRank,
 *          ncclCommFinalize, ncclCommDestroy, ncclCommAbort,
 *          ncclGetErrorString, ncclGetLastError, ncclAllReduce,
 *          ncclBroadcast, ncclAllGather, ncclReduceScatter, ncclSend,
 *          ncclRecv, ncclGroupStart, ncclGroupEnd, ncclRedOpCreatePreMulSum,
 *          ncclRedOpDestroy, ncclMemAlloc, ncclMemFree, ncclCommRegister,
 *          ncclCommDeregister.
 *   CUDA runtime:  cudaGetDeviceCount, cudaGetDevice, cudaSetDevice,
 *          cudaGetLastError, cudaGetErrorString, cudaEventCreateWithFlags,
 *          cudaEventRecord, cudaEventQuery, cudaEventDestroy, cudaMalloc,
 *          cudaMemset, cudaMemsetAsync, cudaFree, cudaMemcpy, cudaMemcpyAsync,
 *          cudaMallocAsync, cudaFreeAsync (widen.c's f32 buffer),
 *          cudaLibraryLoadData, cudaLibraryGetKernel, cudaLaunchKernel,
 *          cudaStreamCreateWithFlags, cudaStreamDestroy,
 *          cudaStreamWaitEvent, cudaStreamSynchronize (mem.c's zeroing).
 *   MPI (bootstrap 3 only, when built with MPI):  MPI_Initialized,
 *          MPI_Finalized, MPI_Comm_rank, MPI_Comm_size.  MPI itself has
 *          one owner, groups/mpi (groups/mpi_owner.h): world.c asks
 *          it to initialise MPI if needed (mpg__mpi_acquire; MPI_Finalize
 *          then runs at exit) and to broadcast the id
 *          (mpg__mpi_bcast_bytes: MPI_Ibcast, MPI_Test).
 *   libc:  getenv (NCCL_COMM_ID, OMPI_COMM_WORLD_SIZE and
 *          CUDA_VISIBLE_DEVICES, read once per world init; the library
 *          never writes the environment), pthread mutex and
 *          once, pthread_create of a detached thread (lifecycle.c's
 *          aborter), sched_yield, nanosleep. */
#ifndef MPG_GROUPS_NCCL_INTERNAL_H
#define MPG_GROUPS_NCCL_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "backend.h"

struct mpg__comm {
  ncclComm_t nccl;       /* NULL once aborted or destroyed */
  pthread_mutex_t lock;  /* held around every NCCL call on `nccl` */
  int settling;          /* a call's job is still in progress (lock guards) */
  atomic_int aborted;    /* MPG_OK, or the reason given to abort */
  atomic_int abort_state; /* lifecycle.c: none, pending (its aborter thread
                             runs ncclCommAbort), done, or orphaned (destroy
                             stopped waiting; the aborter frees the rest) */
  _Atomic double abort_deadline; /* destroy waits for a pending abort until
                                    then (the abort's start + timeout_s) */
  atomic_int refs;       /* 1 for the communicator + 1 per live request
                            + 1 while an aborter thread holds it */
  int rank, size;        /* this rank's position and the group size */
  int device;            /* CUDA device of the communicator */
  int split_share;       /* splitShare of its children (MESHPG_NCCL_SPLIT_SHARE) */
  double timeout_s;
  int *scratch;          /* one int on the device for barrier, lazily */
  struct nccl_reg *regs; /* this communicator's registrations (reg.c) */
  struct nccl_family *family; /* the context's communicators and registered
                                 buffers (reg.c); guarded by its lock */
  mpg__comm *family_next;
};

/* A buffer from ncclMemAlloc registered with a communicator. */
struct nccl_reg {
  void *ptr;
  void *handle;
  struct nccl_reg *next;
};

struct mpg__req {
  mpg__comm *comm;
  cudaEvent_t start;     /* recorded on the stream just before the operation */
  cudaEvent_t event;     /* recorded on the stream after the enqueue */
  double posted;         /* mpg__now() when the post began */
  double started;        /* when start was first seen complete; 0 until then
                            (ops.c: the timeout counts from here) */
  double ended;          /* when event was first seen complete; 0 until then */
  double timeout_s;      /* the communicator's timeout at the post: test's
                            own clock (mpg_work_test never calls wait on
                            this backend; see backend.h test_keeps_time) */
  mpg__coll_kind kind;
  mpg_dtype dtype;
  mpg_op op;
  size_t count;
  int nops;              /* > 0: a batch of nops sends/receives (post_batch) */
  int done;
  mpg_status status;
};

/* comm.c: helpers every file uses. */
/* NCCL's own detail for the last failure ("" when it has none). */
const char *mpg__nccl_detail(void);
/* Record "what: call: error[: detail]" and return st. */
mpg_status mpg__nccl_fail(mpg_status st, const char *what, const char *call,
                          ncclResult_t r);
mpg_status mpg__nccl_fail_cuda(mpg_status st, const char *what,
                               const char *call, cudaError_t e);
/* One pause of a polling loop; *spins counts them (start at 0). */
void mpg__nccl_backoff(unsigned *spins);
/* Make `dev` current, remembering the caller's device in *old; give it
 * back. */
cudaError_t mpg__nccl_dev_enter(int dev, int *old);
void mpg__nccl_dev_leave(int dev, int old);

/* The PTX of an elementwise kernel (dst, src, n, scale as f64), one
 * grid-stride loop over i < n, the scale in %f1 as f32; BODY computes the
 * element addresses (%rd8 source, %rd9 destination) from i (%rd4) and
 * does the work (local.c, widen.c).  Target sm_52 / PTX 6.0 so any driver
 * can JIT it. */
#define MPG__PTX_GRID_LOOP(NAME, BODY)                                                     \
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

/* Load PTX pieces as one library and look up n kernels (kept loaded for
 * the life of the process); *call names the failing CUDA call. */
cudaError_t mpg__nccl_load_ptx(const char *const *pieces, size_t npieces,
                               const char *const *names, int n, cudaKernel_t *out,
                               const char **call);

/* Launch an elementwise kernel of MPG__PTX_GRID_LOOP over count elements
 * on stream s (current device); `call` names it in the error. */
mpg_status mpg__nccl_launch_elementwise(cudaKernel_t kernel, void *dst, const void *src,
                                        size_t count, double scale, cudaStream_t s,
                                        const char *what, const char *call);

/* comm.c: the communicator object. */
/* Non-blocking; split_share: children share the parent's resources. */
ncclConfig_t mpg__nccl_config(int split_share);
/* A communicator with no NCCL handle yet, one reference; NULL when out of
 * memory.  timeout_s <= 0 means 600 s. */
mpg__comm *mpg__nccl_comm_new(int device, double timeout_s);
/* Drop one reference; the last frees c. */
void mpg__nccl_comm_unref(mpg__comm *c);
/* comm.c: lock c for a new NCCL call (R2): NCCL's rule for non-blocking
 * communicators is that after ncclInProgress only ncclCommGetAsyncError
 * and ncclCommAbort may be called until the state settles, so wait (with
 * the lock released) while another thread's call on c is settling. */
void mpg__nccl_lock(mpg__comm *c);
/* Poll the async state of h until it leaves ncclInProgress (lock held,
 * released while sleeping); see comm.c. */
mpg_status mpg__nccl_settle_locked(mpg__comm *c, ncclComm_t h,
                                   double deadline, ncclResult_t *res);
/* Mark c aborted (lock held).  Returns 1 if this call set the flag. */
int mpg__nccl_abort_locked(mpg__comm *c, mpg_status reason);

/* lifecycle.c: aborter threads still running in this process (each runs
 * one abort's ncclCommAbort calls and ncclGroupEnd; see lifecycle.c).  For
 * tests: wait for 0 before checking for leaks. */
int mpg__nccl_aborts_running(void);

/* world.c */
mpg_status mpg__nccl_world_init(const mpg__world_args *a, mpg__comm **out);
/* The CUDA device world_init chose (groups/device.h) and every split
 * inherits; -1 for NULL. */
int mpg__nccl_comm_device(const mpg__comm *c);

/* ops.c */
mpg_status mpg__nccl_post(mpg__comm *c, const mpg__coll *k, mpg__req **out);
mpg_status mpg__nccl_post_batch(mpg__comm *c, const mpg__coll *list, int n,
                                mpg__req **out);
mpg_status mpg__nccl_test(mpg__req *q, int *done);
mpg_status mpg__nccl_wait(mpg__req *q, double deadline);
void mpg__nccl_req_free(mpg__req *q);
void mpg__nccl_req_times(const mpg__req *q, double *start, double *end);

/* local.c's f32 scale kernel, loaded on first use (the CUDA/NCCL test
 * double's tests launch it by hand: tests/double/test_cuda_double_twins.c). */
cudaError_t mpg__nccl_scale_kernel_f32(cudaKernel_t *out);

/* local.c */
mpg_status mpg__nccl_local(mpg__comm *world, const mpg__coll *k);
/* dst[i] = src[i] * scale on stream s (current device), the arithmetic in
 * f32 for f16/bf16 (f64 for f64), rounded once to nearest even; dst may
 * be src.  Floating dtypes only (MPG_ERR_INVALID otherwise).  A size-1
 * group's scaled sum (mpg__nccl_local); tests/double/test_cuda_double_twins.c
 * drives the kernels' twins through it.  (A scaled f16/bf16 sum of a
 * larger group goes through widen.c, not here.) */
mpg_status mpg__nccl_scale(void *dst, const void *src, size_t count, mpg_dtype dtype,
                           double scale, cudaStream_t s, const char *what);

/* widen.c: f16/bf16 all_reduce / reduce_scatter with f32 accumulation,
 * around ops.c's collective, on stream s (current device).  _widen checks
 * k (MPG_ERR_INVALID unless such a collective), allocates the f32 buffer
 * (cudaMallocAsync; size x count elements for a reduce-scatter, count for
 * an all-reduce) and widens k->send into it, each element times `scale` in
 * f32; *wide is then k on that buffer in f32 (in place; a reduce-scatter's
 * recv is block c->rank), to run in ncclFloat32 with the op's sum for a
 * pre-multiplied sum.  _narrow rounds wide->recv to nearest even into
 * k->recv when `narrow` (the collective was enqueued), then frees the
 * buffer (cudaFreeAsync) either way. */
mpg_status mpg__nccl_widen(const mpg__comm *c, const mpg__coll *k, double scale,
                           cudaStream_t s, const char *what, mpg__coll *wide);
mpg_status mpg__nccl_narrow(const mpg__coll *k, const mpg__coll *wide, int narrow,
                            cudaStream_t s, const char *what);

/* reg.c: registered buffers, shared by every communicator of a context. */
/* Join parent's family (NULL: start one, for the world), registering
 * every buffer of it with c; c must have its NCCL handle. */
mpg_status mpg__nccl_family_join(mpg__comm *c, const mpg__comm *parent);
/* R4: an asynchronous error on another member of c's family (one that
 * no request of this thread waits on): that member is marked aborted and
 * its error returned (ncclSuccess: none); *rank and *size describe it. */
ncclResult_t mpg__nccl_family_poll(mpg__comm *c, int *rank, int *size);
/* Deregister everything from c and leave its family (before destroy). */
void mpg__nccl_family_leave(mpg__comm *c);
/* Register a buffer from ncclMemAlloc with every member of c's family. */
mpg_status mpg__nccl_family_register(mpg__comm *c, void *ptr, size_t bytes);
/* Deregister ptr from every member; 1 if it was a registered buffer. */
int mpg__nccl_family_deregister(mpg__comm *c, void *ptr);
/* The launch order of the family's kernels.  by_meshpg 1 (the world's
 * init, when NCCL_LAUNCH_ORDER_IMPLICIT is not on): each launch waits for
 * the previous one to finish; 0: NCCL keeps the order.  ops.c calls
 * order_before on the stream before its start event and order_after once
 * the operation is enqueued (c->lock held, from the issuing thread). */
void mpg__nccl_family_order(mpg__comm *c, int by_meshpg);
cudaError_t mpg__nccl_family_order_before(mpg__comm *c, cudaStream_t s);
cudaError_t mpg__nccl_family_order_after(mpg__comm *c, cudaStream_t s);

/* mem.c */
mpg_status mpg__nccl_mem_alloc(mpg__comm *c, size_t bytes, int registered,
                               void **ptr);
mpg_status mpg__nccl_mem_free(mpg__comm *c, void *ptr);
mpg_status mpg__nccl_mem_zero(mpg__comm *c, void *ptr, size_t bytes, void *stream);
mpg_status mpg__nccl_mem_copy(mpg__comm *c, void *dst, const void *src, size_t bytes);
/* Checkpoint staging (backend.h): cudaHostAlloc / cudaFreeHost,
 * cudaMemcpyAsync (cudaMemcpyDefault) on a stream, cudaStreamSynchronize. */
mpg_status mpg__nccl_host_alloc(mpg__comm *c, size_t bytes, void **ptr);
mpg_status mpg__nccl_host_free(mpg__comm *c, void *ptr);
mpg_status mpg__nccl_copy_async(mpg__comm *c, void *dst, const void *src, size_t bytes,
                                void *stream);
mpg_status mpg__nccl_stream_sync(mpg__comm *c, void *stream);
mpg_status mpg__nccl_stream_create(mpg__comm *c, void **stream);
mpg_status mpg__nccl_stream_destroy(mpg__comm *c, void *stream);
mpg_status mpg__nccl_stream_order(mpg__comm *c, void *waiter, void *waitee);

#endif
