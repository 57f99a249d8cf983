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

/* The files of the CUDA half (their shared types and calls are in
 * cuda_double_internal.h, hidden from the library's exports):
 *   cuda_double.c         configuration, per-thread state, reports,
 *                         statistics, devices, error texts and the device
 *                         management API;
 *   cuda_double_exec.c    streams' items and executors: creation, the
 *                         ordering rules of submission, host waits and
 *                         hang reports;
 *   cuda_double_stream.c  the API of streams, events and host functions;
 *   cuda_double_mem.c     the device memory registry and the API of
 *                         allocation, copies and memsets. */

#include "cuda_double_internal.h"

/* ------------------------------------------------------------------ */
/* Configuration (read once per process)                               */
/* ------------------------------------------------------------------ */

struct dbl_cfg cfg;

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

void cfg_init(void) { pthread_once(&cfg_once, cfg_read); }

/* ------------------------------------------------------------------ */
/* Per-thread state                                                    */
/* ------------------------------------------------------------------ */

_Thread_local int tl_device;           /* cudaSetDevice's, default 0 */
static _Thread_local cudaError_t tl_error;     /* cudaGetLastError's */
static _Thread_local int tl_rank = -1;         /* dbl_set_world_rank's */
_Thread_local struct dstream *tl_executor; /* set on executor threads */
_Thread_local struct dstream **tl_ptds;    /* per-thread streams by device */
static _Thread_local pthread_cond_t tl_cv;     /* this thread's host waits */
static _Thread_local int tl_cv_ready;

/* The runtime keeps the last error per host thread and cudaGetLastError
 * returns and clears it (cudaGetLastError / cudaPeekAtLastError docs).
 * cudaErrorNotReady is a status, not an error, and is not kept. */
cudaError_t ret(cudaError_t e) {
  if (e != cudaSuccess && e != cudaErrorNotReady) tl_error = e;
  return e;
}

cudaError_t dbl_cuda_error(cudaError_t e) { return ret(e); }

void cond_init_monotonic(pthread_cond_t *cv) {
  pthread_condattr_t a;
  pthread_condattr_init(&a);
  pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
  pthread_cond_init(cv, &a);
  pthread_condattr_destroy(&a);
}

pthread_cond_t *my_cv(void) {
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

atomic_uint_least64_t st_kernels;
static atomic_uint_least64_t st_collectives;
atomic_uint_least64_t st_late;
atomic_uint_least64_t st_waits;

void dbl_stats(dbl_stats_t *out) {
  out->kernels = atomic_load(&st_kernels);
  out->collectives = atomic_load(&st_collectives);
  out->late_items = atomic_load(&st_late);
  out->device_waits = atomic_load(&st_waits);
}

void dbl_count_collective(void) { atomic_fetch_add(&st_collectives, 1); }

/* Progress of device work in this process (double.h). */
_Atomic uint64_t st_progress;
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

/* NCCL's getHostHash (misc/utils.cc:69-113): a hash of NCCL_HOSTID when
 * set, else of the hostname followed by the kernel's boot id, so that two
 * containers or network namespaces with their own hostnames are two hosts. */
uint64_t dbl_host_hash(void) {
  char name[512] = "";
  const char *id = getenv("NCCL_HOSTID");
  if (id && *id) {
    snprintf(name, sizeof name, "%s", id);
  } else {
    if (gethostname(name, 255) != 0) snprintf(name, sizeof name, "unknown");
    name[255] = '\0';
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
      size_t len = strlen(name);
      if (fscanf(f, "%200s", name + len) != 1) name[len] = '\0';
      fclose(f);
    }
  }
  uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
  for (const unsigned char *p = (const unsigned char *)name; *p; p++)
    h = (h ^ *p) * 0x100000001b3ull;
  return h;
}

/* The calling thread's device, or the error a device call answers. */
cudaError_t current_device(int *d) {
  cfg_init();
  *d = 0;
  if (cfg.nvis == 0) return cfg.init_error;
  *d = tl_device < cfg.nvis ? tl_device : 0;
  return cudaSuccess;
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
  *prop = (struct cudaDeviceProp){
      .totalGlobalMem = (size_t)80 << 30, .sharedMemPerBlock = 48 << 10, .warpSize = 32,
      .maxThreadsPerBlock = 1024, .maxThreadsDim = {1024, 1024, 64},
      .maxGridSize = {0x7fffffff, 65535, 65535}, .major = 9, .minor = 0,
      .multiProcessorCount = 132, .concurrentKernels = 1, .unifiedAddressing = 1,
      .pciDomainID = 0, .pciBusID = 0x10 + cfg.phys[device], .pciDeviceID = 0};
  snprintf(prop->name, sizeof prop->name, "meshpg test double (CPU) device %d", device);
  return cudaSuccess;
}
