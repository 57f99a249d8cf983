/* The CUDA/NCCL test double: the interface between its two halves.
 *
 *   cuda_double*.c, cuda_twins.c  the CUDA runtime functions meshpg calls
 *                  (simulated devices, the device-memory registry, streams
 *                  as executor threads, events, copies, memsets, the PTX
 *                  kernels' CPU twins, device-wide waits; cuda_double.c
 *                  lists the files).
 *   nccl_double*.c the NCCL functions meshpg calls (communicators across
 *                  the threads of one process and across processes through
 *                  shared memory, collectives as stream work that blocks
 *                  until every rank arrives, splits, groups, abort, async
 *                  errors, registration, fault injection; nccl_double.c
 *                  lists the files).
 *
 * Both are compiled against NVIDIA's own cuda_runtime.h and nccl.h, so every
 * signature, type and enum is theirs.  The double lives under tests/ and is
 * never installed.  Where the real library would hang or corrupt memory the
 * double reports loudly (dbl_fatal) instead.
 *
 * Nothing here is public: the dbl_ functions are the contract between the
 * two files, and the test programs may use dbl_fault_* and dbl_stats only. */
#ifndef MESHPG_TESTS_DOUBLE_H
#define MESHPG_TESTS_DOUBLE_H

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ */
/* Reports                                                            */
/* ------------------------------------------------------------------ */

/* Where the real library would hang or corrupt: print "meshpg double: "
 * and the message (with the process id and the calling thread's device) to
 * stderr, flush, and abort() the process. */
void dbl_fatal(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));

/* A diagnostic line on stderr when MESHPG_DOUBLE_LOG=1. */
void dbl_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Seconds on CLOCK_MONOTONIC. */
double dbl_now(void);

/* ------------------------------------------------------------------ */
/* Devices                                                            */
/* ------------------------------------------------------------------ */

/* The calling thread's current device (cudaSetDevice's, default 0). */
int dbl_device_current(void);

/* How many devices this process simulates: MESHPG_DOUBLE_DEVICES (1..64,
 * default 8). */
int dbl_device_count(void);

/* The device's PCI bus id string, "0000:XX:00.0", XX = 0x10 + device (the
 * same in every process, as on one real node), and the host hash that NCCL
 * would compare: hostname and boot id, or NCCL_HOSTID when set.  Ranks of
 * one communicator with different host hashes are connected over sockets
 * (nccl_double_net.c), as NCCL's NET transport.  Two ranks of one
 * communicator with the same host hash and bus id are one GPU. */
void dbl_device_busid(int device, char *buf, size_t len);
uint64_t dbl_host_hash(void);

/* How a joined communicator moves data: "shm" (every rank on one host: the
 * shared segment), "net" (host hashes differ: sockets, nccl_double_net.c),
 * "none" (not joined, or destroyed). */
struct ncclComm;
const char *dbl_nccl_transport(struct ncclComm *comm);

/* ------------------------------------------------------------------ */
/* Device memory                                                      */
/* ------------------------------------------------------------------ */

enum dbl_mem_kind {
  DBL_MEM_DEVICE = 0, /* [p, p + bytes) lies inside one live device allocation */
  DBL_MEM_HOST = 1,   /* no allocation of the double contains p */
  DBL_MEM_FREED = 2,  /* p lies in an allocation that was freed */
  DBL_MEM_OVERRUN = 3 /* p is inside a live allocation but p + bytes is not */
};

/* Classify [p, p + bytes); *device gets the allocation's device (or -1). */
enum dbl_mem_kind dbl_mem_find(const void *p, size_t bytes, int *device);

/* Allocate / free device memory on `device` outside any stream (used by
 * ncclMemAlloc / ncclMemFree).  dbl_mem_free waits, as cudaFree does, for
 * every stream of the device to be idle (see dbl_device_wait). */
cudaError_t dbl_mem_alloc(int device, size_t bytes, void **out);
cudaError_t dbl_mem_free(void *p);

/* ------------------------------------------------------------------ */
/* Streams                                                            */
/* ------------------------------------------------------------------ */

/* Work for a stream: `run(arg)` is called on the stream's executor thread
 * when every earlier item of the stream, and of the streams it is ordered
 * after (legacy default stream rules, cudaStreamWaitEvent), has finished.
 * run may block (a collective waiting for its peers); it must then poll
 * its own abort condition.  `what` names the item in hang reports (copied).
 * `kernel` is 1 for device kernels (NCCL collectives and the PTX twins):
 * under NCCL_LAUNCH_ORDER_IMPLICIT=1 in the environment when the device
 * was first used, kernels of one device run one at a time in host issue
 * order (strict mode).  Returns cudaSuccess or the stream's error
 * (cudaErrorInvalidResourceHandle for a destroyed stream).
 * `stream` may be 0 (the legacy default stream) or cudaStreamLegacy /
 * cudaStreamPerThread. */
cudaError_t dbl_stream_submit(cudaStream_t stream, const char *what, int kernel,
                              void (*run)(void *arg), void *arg);

/* The device a stream belongs to (the current device for 0). */
int dbl_stream_device(cudaStream_t stream);

/* Wait until every stream of `device` has run all of its work, as
 * cudaFree, cudaMalloc and cudaDeviceSynchronize do.  `why` names the
 * caller for the hang report: when the wait lasts longer than
 * MESHPG_DOUBLE_HANG_S (default 20 s) with no device work of this process
 * making progress (dbl_note_progress), the double dbl_fatal()s, listing
 * every unfinished item of the device (stream, what, since when). */
void dbl_device_wait(int device, const char *why);

/* Long device work (a collective moving 64 MiB between 8 ranks under ASan
 * on 2 cores can run for more than MESHPG_DOUBLE_HANG_S) calls this each
 * time it moves data: a host wait whose work still moves is slow, not
 * hung, and its hang deadline starts again. */
void dbl_note_progress(void);

/* The item now running on each stream of `device`, for reports: writes
 * "stream S: WHAT (running X s); ..." into buf. */
void dbl_device_describe(int device, char *buf, size_t len);

/* ------------------------------------------------------------------ */
/* Fault injection and statistics (also for test programs)            */
/* ------------------------------------------------------------------ */

/* MESHPG_DOUBLE_OOM_RANK=R with MESHPG_DOUBLE_RANK=R (or NCCL rank R when
 * the process has one communicator world): cudaMallocAsync fails with
 * cudaErrorMemoryAllocation on that rank.  Read by cuda_double_mem.c through
 * this hook, which nccl_double.c sets to the process's world rank once it
 * knows it. */
void dbl_set_world_rank(int rank);
int dbl_world_rank(void); /* -1 until known */

typedef struct dbl_stats {
  uint64_t kernels;      /* kernel items run */
  uint64_t collectives;  /* NCCL operations run */
  uint64_t late_items;   /* items delayed on purpose */
  uint64_t device_waits; /* dbl_device_wait calls */
} dbl_stats_t;
void dbl_stats(dbl_stats_t *out);
void dbl_count_collective(void);

/* ------------------------------------------------------------------ */
/* Added for cuda_twins.c (cudaLibrary* and cudaLaunchKernel live there */
/* and reach cuda_double.c's per-thread state through these two)       */
/* ------------------------------------------------------------------ */

/* Every cuda* entry point that touches devices, streams or memory calls
 * this first: it dbl_fatal()s when called from a stream's executor thread
 * (CUDA forbids CUDA calls in host functions; here they would deadlock). */
void dbl_cuda_enter(const char *api);

/* Record e as the calling thread's last error (cudaGetLastError) unless it
 * is cudaSuccess or cudaErrorNotReady; returns e. */
cudaError_t dbl_cuda_error(cudaError_t e);

#ifdef __cplusplus
}
#endif

#endif
