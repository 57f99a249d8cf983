/* The CUDA half of the test double (cuda_double.c): the device memory
 * registry, and the CUDA runtime API of allocation, copies and memsets. */

#include "cuda_double_internal.h"

/* ------------------------------------------------------------------ */
/* Device memory registry                                              */
/* ------------------------------------------------------------------ */

static pthread_mutex_t M = PTHREAD_MUTEX_INITIALIZER;
static struct alloc **mtab; /* sorted by base */
static size_t nmtab, capmtab;
static struct alloc *q_head, *q_tail;
static size_t q_bytes;

/* Index of the last allocation with base <= p, or -1 (M held). */
static long mem_floor(uintptr_t p) {
  size_t lo = 0, hi = nmtab;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (mtab[mid]->base <= p) lo = mid + 1;
    else hi = mid;
  }
  return (long)lo - 1;
}

/* The allocation whose reserved range holds p, or NULL (M held). */
static struct alloc *mem_at(const void *p) {
  long i = mem_floor((uintptr_t)p);
  if (i < 0) return NULL;
  struct alloc *a = mtab[i];
  return (uintptr_t)p < a->base + a->cap ? a : NULL;
}

static int mem_insert(struct alloc *a) {
  if (nmtab == capmtab) {
    size_t cap = capmtab ? 2 * capmtab : 256;
    struct alloc **t = realloc(mtab, cap * sizeof *t);
    if (!t) return -1;
    mtab = t;
    capmtab = cap;
  }
  size_t at = (size_t)(mem_floor(a->base) + 1);
  memmove(mtab + at + 1, mtab + at, (nmtab - at) * sizeof *mtab);
  mtab[at] = a;
  nmtab++;
  return 0;
}

static void mem_remove(struct alloc *a) {
  long i = mem_floor(a->base);
  if (i < 0 || mtab[i] != a) dbl_fatal("memory registry corrupt at %p", (void *)a->base);
  memmove(mtab + i, mtab + i + 1, (nmtab - (size_t)i - 1) * sizeof *mtab);
  nmtab--;
}

/* A new registered block: device memory (fill FILL_NEW: real device memory
 * starts as garbage) or pinned host memory (zeroed, as calloc would). */
static cudaError_t mem_new(int device, size_t bytes, int pinned, int async, void **out) {
  size_t cap = (bytes + ALLOC_ALIGN - 1) / ALLOC_ALIGN * ALLOC_ALIGN + ALLOC_ALIGN;
  if (bytes > ((size_t)1 << 46)) return cudaErrorMemoryAllocation;
  struct alloc *a = calloc(1, sizeof *a);
  void *p = aligned_alloc(ALLOC_ALIGN, cap);
  if (!a || !p) {
    free(a);
    free(p);
    return cudaErrorMemoryAllocation;
  }
  memset(p, pinned ? 0 : FILL_NEW, cap);
  *a = (struct alloc){(uintptr_t)p, bytes, cap, device, pinned, async, 0, 0, 0, NULL};
  pthread_mutex_lock(&M);
  int rc = mem_insert(a);
  pthread_mutex_unlock(&M);
  if (rc) {
    free(a);
    free(p);
    return cudaErrorMemoryAllocation;
  }
  *out = p;
  return cudaSuccess;
}

/* Poison a block and keep it reserved; release the oldest quarantined
 * blocks beyond the bound (M held). */
static void mem_poison_locked(struct alloc *a) {
  memset((void *)a->base, POISON_FREED, a->cap);
  a->freed = 1;
  a->freed_at = dbl_now();
  if (q_tail) q_tail->qnext = a;
  else q_head = a;
  q_tail = a;
  q_bytes += a->cap;
  while (q_head && q_bytes > cfg.quarantine) {
    struct alloc *old = q_head;
    q_head = old->qnext;
    if (!q_head) q_tail = NULL;
    q_bytes -= old->cap;
    mem_remove(old);
    free((void *)old->base);
    free(old);
  }
}

/* Look up the live block that starts at p, for a free (M held). */
static struct alloc *mem_block(const void *p, int pinned) {
  struct alloc *a = mem_at(p);
  if (!a || a->base != (uintptr_t)p || a->freed || a->free_queued || a->pinned != pinned)
    return NULL;
  return a;
}

static void mem_classify(const void *p, size_t bytes, struct mem_info *mi) {
  memset(mi, 0, sizeof *mi);
  mi->device = -1;
  mi->kind = DBL_MEM_HOST;
  pthread_mutex_lock(&M);
  struct alloc *a = mem_at(p);
  if (a) {
    mi->base = a->base;
    mi->size = a->size;
    mi->pinned = a->pinned;
    mi->device = a->device;
    if (a->pinned) mi->kind = DBL_MEM_HOST;
    else if (a->freed) mi->kind = DBL_MEM_FREED, mi->freed_ago = dbl_now() - a->freed_at;
    else if ((uintptr_t)p + bytes > a->base + a->size || (uintptr_t)p + bytes < (uintptr_t)p)
      mi->kind = DBL_MEM_OVERRUN;
    else mi->kind = DBL_MEM_DEVICE;
  }
  pthread_mutex_unlock(&M);
}

enum dbl_mem_kind dbl_mem_find(const void *p, size_t bytes, int *device) {
  struct mem_info mi;
  mem_classify(p, bytes, &mi);
  if (device) *device = mi.kind == DBL_MEM_HOST ? -1 : mi.device;
  return mi.kind;
}

/* The range [p, p + bytes) that `api` is about to touch (`role`: "source",
 * "destination"): a freed block or an overrun aborts.  Work in a stream
 * would corrupt memory or fault on the real GPU; some synchronous checks of
 * the runtime answer cudaErrorInvalidValue instead (a cudaMemset past the
 * end of a block, seen on an H100), which callers tend to ignore, so the
 * double stops at once either way.  `when` says whether the check runs at
 * the call or when the stream reached the work. */
static void mem_require(const char *api, const char *role, const void *p, size_t bytes,
                        const char *when, struct mem_info *mi) {
  mem_classify(p, bytes, mi);
  if (mi->kind == DBL_MEM_FREED)
    dbl_fatal("%s: the %s [%p, +%zu) lies in device memory of device %d (block %p of %zu "
              "bytes) freed %.3f s before %s: use after free, which corrupts memory on a "
              "real GPU", api, role, p, bytes, mi->device, (void *)mi->base, mi->size,
              mi->freed_ago, when);
  if (mi->kind == DBL_MEM_OVERRUN)
    dbl_fatal("%s: the %s [%p, +%zu) overruns device %d's block %p of %zu bytes by %zu "
              "bytes (%s): the real GPU would corrupt memory or fault", api, role, p, bytes,
              mi->device, (void *)mi->base, mi->size,
              (size_t)((uintptr_t)p + bytes - (mi->base + mi->size)), when);
}

cudaError_t dbl_mem_alloc(int device, size_t bytes, void **out) {
  cfg_init();
  if (!out) return cudaErrorInvalidValue;
  if (device < 0 || device >= cfg.nvis) return cudaErrorInvalidDevice;
  if (!bytes) {
    *out = NULL;
    return cudaSuccess;
  }
  return mem_new(device, bytes, 0, 0, out);
}

/* Free a block now: wait device-wide unless it came from cudaMallocAsync
 * (cudaFree docs: no implicit synchronisation for those, "may" for the
 * others, modelled as a full device wait, [IMPLICIT]), then poison. */
static cudaError_t mem_free_block(void *p, int pinned, const char *api) {
  pthread_mutex_lock(&M);
  struct alloc *a = mem_block(p, pinned);
  int device = a ? a->device : -1, async = a ? a->async : 0;
  if (a) a->free_queued = 1; /* a second free of it fails from now on */
  pthread_mutex_unlock(&M);
  if (!a) {
    dbl_log("%s(%p): not the start of a live %s block", api, p, pinned ? "pinned" : "device");
    return cudaErrorInvalidValue; /* seen on an H100: freed twice, interior, host */
  }
  if (pinned) /* pinned memory may be read by any device's pending copies */
    for (int d = 0; d < cfg.nvis; d++) dbl_device_wait(d, api);
  else if (!async)
    dbl_device_wait(device, api);
  pthread_mutex_lock(&M);
  mem_poison_locked(a);
  pthread_mutex_unlock(&M);
  return cudaSuccess;
}

cudaError_t dbl_mem_free(void *p) {
  cfg_init();
  if (!p) return cudaSuccess;
  return mem_free_block(p, 0, "dbl_mem_free");
}

/* ------------------------------------------------------------------ */
/* Memory: allocation                                                  */
/* ------------------------------------------------------------------ */

/* Enters api: the current device into *d, or the error a device call
 * answers; then a NULL out pointer is cudaErrorInvalidValue. */
static cudaError_t alloc_enter(const char *api, void **out, int *d) {
  dbl_cuda_enter(api);
  cudaError_t e = current_device(d);
  return !e && !out ? cudaErrorInvalidValue : e;
}

/* The free calls: NULL is a no-op; pinned says which kind of block p must be. */
static cudaError_t free_api(const char *api, void *p, int pinned) {
  dbl_cuda_enter(api);
  return p ? ret(mem_free_block(p, pinned, api)) : cudaSuccess;
}

/* A device memory allocation issued between two commands keeps them from
 * running concurrently ([IMPLICIT]); the double models cudaMalloc as a
 * full device wait, like cudaFree. */
cudaError_t cudaMalloc(void **devPtr, size_t size) {
  int d;
  cudaError_t e = alloc_enter("cudaMalloc", devPtr, &d);
  if (e) return ret(e);
  dbl_device_wait(d, "cudaMalloc");
  if (!size) { /* seen on an H100: success and NULL */
    *devPtr = NULL;
    return cudaSuccess;
  }
  return ret(mem_new(d, size, 0, 0, devPtr));
}

cudaError_t cudaFree(void *devPtr) {
  return free_api("cudaFree", devPtr, 0);
}

cudaError_t cudaMallocHost(void **ptr, size_t size) {
  int d;
  cudaError_t e = alloc_enter("cudaMallocHost", ptr, &d);
  return e ? ret(e) : ret(mem_new(d, size ? size : 1, 1, 0, ptr));
}

cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned int flags) {
  if (flags & ~(unsigned)(cudaHostAllocPortable | cudaHostAllocMapped |
                          cudaHostAllocWriteCombined))
    return ret(cudaErrorInvalidValue);
  return cudaMallocHost(pHost, size);
}

cudaError_t cudaFreeHost(void *ptr) {
  return free_api("cudaFreeHost", ptr, 1);
}

static void run_free_async(void *arg) {
  struct alloc *a = arg;
  pthread_mutex_lock(&M);
  mem_poison_locked(a);
  pthread_mutex_unlock(&M);
}

/* Fault injection: MESHPG_DOUBLE_OOM_RANK=R fails the calling rank R's
 * stream-ordered allocations (read at each call, so a test can set it). */
static int oom_injected(void) {
  const char *v = getenv("MESHPG_DOUBLE_OOM_RANK");
  return v && *v && atoi(v) >= 0 && atoi(v) == dbl_world_rank();
}

/* Stream-ordered: no device-wide wait; the memory comes from the stream's
 * device (cudaMallocAsync docs). */
cudaError_t cudaMallocAsync(void **devPtr, size_t size, cudaStream_t hStream) {
  dbl_cuda_enter("cudaMallocAsync");
  int d = dbl_stream_device(hStream);
  if (d < 0) return ret(cudaErrorInvalidResourceHandle);
  if (!devPtr) return ret(cudaErrorInvalidValue);
  if (oom_injected()) {
    dbl_log("cudaMallocAsync(%zu bytes): out of memory injected on rank %d", size,
            dbl_world_rank());
    return ret(cudaErrorMemoryAllocation);
  }
  if (!size) {
    *devPtr = NULL;
    return cudaSuccess;
  }
  return ret(mem_new(d, size, 0, 1, devPtr));
}

/* The block is freed (poisoned) when the stream reaches the free; it must
 * not be touched after that point (cudaFreeAsync docs). */
cudaError_t cudaFreeAsync(void *devPtr, cudaStream_t hStream) {
  dbl_cuda_enter("cudaFreeAsync");
  if (dbl_stream_device(hStream) < 0) return ret(cudaErrorInvalidResourceHandle);
  if (!devPtr) return cudaSuccess;
  pthread_mutex_lock(&M);
  struct alloc *a = mem_block(devPtr, 0);
  if (a) a->free_queued = 1;
  pthread_mutex_unlock(&M);
  if (!a) return ret(cudaErrorInvalidValue);
  cudaError_t e = dbl_stream_submit(hStream, "cudaFreeAsync", 0, run_free_async, a);
  if (e) {
    pthread_mutex_lock(&M);
    a->free_queued = 0;
    pthread_mutex_unlock(&M);
  }
  return ret(e);
}

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *attributes, const void *ptr) {
  dbl_cuda_enter("cudaPointerGetAttributes");
  if (!attributes) return ret(cudaErrorInvalidValue);
  struct mem_info mi;
  mem_classify(ptr, 0, &mi);
  memset(attributes, 0, sizeof *attributes);
  if (mi.kind == DBL_MEM_DEVICE || mi.kind == DBL_MEM_OVERRUN) {
    attributes->type = cudaMemoryTypeDevice;
    attributes->device = mi.device;
    attributes->devicePointer = (void *)ptr;
  } else if (mi.pinned) {
    attributes->type = cudaMemoryTypeHost;
    attributes->device = mi.device;
    attributes->devicePointer = attributes->hostPointer = (void *)ptr;
  } else { /* host or freed: unregistered, device -2 (seen on an H100) */
    attributes->type = cudaMemoryTypeUnregistered;
    attributes->device = -2;
    attributes->hostPointer = (void *)ptr;
  }
  return cudaSuccess;
}

/* ------------------------------------------------------------------ */
/* Memory: copies and memsets                                          */
/* ------------------------------------------------------------------ */

struct copy_job {
  void *dst;
  const void *src;     /* the staging buffer when staged */
  size_t n;
  void *staging;
  int dst_dev, src_dev; /* was device memory at the call: check again */
  char api[24];
};

/* Runs when the stream reaches the copy: the memory must still be live. */
static void run_copy(void *arg) {
  struct copy_job *j = arg;
  struct mem_info mi;
  if (j->dst_dev) mem_require(j->api, "destination", j->dst, j->n, "the copy ran", &mi);
  if (j->src_dev) mem_require(j->api, "source", j->src, j->n, "the copy ran", &mi);
  memmove(j->dst, j->src, j->n);
  free(j->staging);
  free(j);
}

struct memset_job {
  void *p;
  int value;
  size_t n;
  char api[24];
};

static void run_memset(void *arg) {
  struct memset_job *j = arg;
  struct mem_info mi;
  mem_require(j->api, "destination", j->p, j->n, "the memset ran", &mi);
  memset(j->p, j->value, j->n);
  free(j);
}

enum where { W_DEVICE, W_PINNED, W_PAGEABLE };

static enum where where_of(const struct mem_info *mi) {
  return mi->kind == DBL_MEM_DEVICE ? W_DEVICE : mi->pinned ? W_PINNED : W_PAGEABLE;
}

/* The kind's promise against what the pointers are (seen on an H100: a
 * host pointer where the kind says device is cudaErrorInvalidValue; an
 * unknown kind is cudaErrorInvalidMemcpyDirection). */
static cudaError_t check_kind(enum cudaMemcpyKind kind, enum where dw, enum where sw) {
  switch (kind) {
    case cudaMemcpyHostToHost:
    case cudaMemcpyDefault: return cudaSuccess;
    case cudaMemcpyHostToDevice: return dw == W_DEVICE ? cudaSuccess : cudaErrorInvalidValue;
    case cudaMemcpyDeviceToHost: return sw == W_DEVICE ? cudaSuccess : cudaErrorInvalidValue;
    case cudaMemcpyDeviceToDevice:
      return dw == W_DEVICE && sw == W_DEVICE ? cudaSuccess : cudaErrorInvalidValue;
  }
  return cudaErrorInvalidMemcpyDirection;
}

/* Both ends of a copy, checked at the call, and its kind against them. */
static cudaError_t copy_ends(const char *api, void *dst, const void *src, size_t count,
                             enum cudaMemcpyKind kind, enum where *dw, enum where *sw) {
  struct mem_info md, ms;
  mem_require(api, "destination", dst, count, "the call", &md);
  mem_require(api, "source", src, count, "the call", &ms);
  *dw = where_of(&md);
  *sw = where_of(&ms);
  return check_kind(kind, *dw, *sw);
}

static struct copy_job *copy_job(const char *api, void *dst, const void *src, size_t n,
                                 enum where dw, enum where sw, int stage) {
  struct copy_job *j = calloc(1, sizeof *j);
  if (!j) return NULL;
  j->dst = dst;
  j->src = src;
  j->n = n;
  j->dst_dev = dw == W_DEVICE;
  j->src_dev = sw == W_DEVICE;
  snprintf(j->api, sizeof j->api, "%s", api);
  if (stage) {
    if (!(j->staging = malloc(n))) {
      free(j);
      return NULL;
    }
    memcpy(j->staging, src, n);
    j->src = j->staging;
  }
  return j;
}

/* How cudaMemcpy meets the host, by direction ([API-SYNC], "Memcpy",
 * synchronous functions):
 *   pageable host -> device: a stream sync first, then the source is
 *     staged and the call returns; the device write lands later;
 *   pinned host -> device: synchronous with the host;
 *   device -> host: returns once the copy is done;
 *   device -> device: no host synchronisation;
 *   host -> host: fully synchronous.
 * All of it is work of the legacy default stream of the current device,
 * so it is ordered with blocking streams and not with non-blocking ones
 * ([STREAM-SYNC]). */
cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind) {
  dbl_cuda_enter("cudaMemcpy");
  int d;
  cudaError_t e = current_device(&d);
  if (e) return ret(e);
  if (!count) return (unsigned)kind <= cudaMemcpyDefault ? cudaSuccess
                                                          : ret(cudaErrorInvalidMemcpyDirection);
  enum where dw, sw;
  if ((e = copy_ends("cudaMemcpy", dst, src, count, kind, &dw, &sw))) return ret(e);
  int pageable_h2d = dw == W_DEVICE && sw == W_PAGEABLE;
  int async = dw == W_DEVICE && sw != W_PINNED; /* pageable -> device, device -> device */
  pthread_mutex_lock(&G);
  struct dstream *l = dev_get(d)->legacy;
  if (pageable_h2d) host_wait(l, l->submitted, "cudaMemcpy (stream sync before staging)");
  struct copy_job *j = copy_job("cudaMemcpy", dst, src, count, dw, sw, pageable_h2d);
  if (!j) e = cudaErrorMemoryAllocation;
  else if (async) e = submit_locked(l, "cudaMemcpy", 0, 1, run_copy, j, NULL, NULL);
  else e = submit_and_wait(l, "cudaMemcpy", run_copy, j, "cudaMemcpy");
  pthread_mutex_unlock(&G);
  if (e && j) {
    free(j->staging);
    free(j);
  }
  return ret(e);
}

/* cudaMemcpyAsync is stream-ordered.  With pageable host memory it "might
 * be synchronous" and the driver may stage pageable memory ([API-SYNC],
 * "Memcpy", asynchronous functions): the double stages a pageable source
 * at the call (so the caller may reuse it at once, as real drivers allow)
 * and writes a host destination only when the stream gets there (so a
 * caller who reads it before synchronising sees stale data).  Host to
 * host is fully synchronous. */
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                            cudaStream_t stream) {
  dbl_cuda_enter("cudaMemcpyAsync");
  if (dbl_stream_device(stream) < 0) return ret(cudaErrorInvalidResourceHandle);
  if (!count) return (unsigned)kind <= cudaMemcpyDefault ? cudaSuccess
                                                          : ret(cudaErrorInvalidMemcpyDirection);
  enum where dw, sw;
  cudaError_t e = copy_ends("cudaMemcpyAsync", dst, src, count, kind, &dw, &sw);
  if (e) return ret(e);
  int h2h = dw != W_DEVICE && sw != W_DEVICE;
  struct copy_job *j =
      copy_job("cudaMemcpyAsync", dst, src, count, dw, sw, sw == W_PAGEABLE && !h2h);
  if (!j) return ret(cudaErrorMemoryAllocation);
  pthread_mutex_lock(&G);
  struct dstream *s;
  e = stream_resolve(stream, &s);
  if (!e && h2h) e = submit_and_wait(s, "cudaMemcpyAsync", run_copy, j, "cudaMemcpyAsync");
  else if (!e) e = submit_locked(s, "cudaMemcpyAsync", 0, 1, run_copy, j, NULL, NULL);
  pthread_mutex_unlock(&G);
  if (e) {
    free(j->staging);
    free(j);
  }
  return ret(e);
}

/* Checks of a memset's target at the call: device memory, or pinned host
 * memory for the synchronous form; pageable host memory is
 * cudaErrorInvalidValue (seen on an H100). */
static cudaError_t memset_target(const char *api, void *p, size_t n, struct mem_info *mi) {
  mem_require(api, "destination", p, n, "the call", mi);
  if (mi->kind == DBL_MEM_DEVICE) return cudaSuccess;
  return mi->pinned ? cudaSuccess : cudaErrorInvalidValue;
}

static struct memset_job *memset_job(const char *api, void *p, int value, size_t n) {
  struct memset_job *j = malloc(sizeof *j);
  if (j) {
    *j = (struct memset_job){p, value, n, ""};
    snprintf(j->api, sizeof j->api, "%s", api);
  }
  return j;
}

/* The synchronous memset is asynchronous with respect to the host unless
 * its target is pinned host memory ([API-SYNC], "Memset"), and it is work
 * of the legacy default stream. */
cudaError_t cudaMemset(void *devPtr, int value, size_t count) {
  dbl_cuda_enter("cudaMemset");
  int d;
  cudaError_t e = current_device(&d);
  if (e) return ret(e);
  if (!count) return cudaSuccess;
  struct mem_info mi;
  if ((e = memset_target("cudaMemset", devPtr, count, &mi))) return ret(e);
  struct memset_job *j = memset_job("cudaMemset", devPtr, value, count);
  if (!j) return ret(cudaErrorMemoryAllocation);
  pthread_mutex_lock(&G);
  struct dstream *l = dev_get(d)->legacy;
  if (mi.pinned) e = submit_and_wait(l, "cudaMemset", run_memset, j, "cudaMemset");
  else e = submit_locked(l, "cudaMemset", 0, 1, run_memset, j, NULL, NULL);
  pthread_mutex_unlock(&G);
  if (e) free(j);
  return ret(e);
}

cudaError_t cudaMemsetAsync(void *devPtr, int value, size_t count, cudaStream_t stream) {
  dbl_cuda_enter("cudaMemsetAsync");
  if (dbl_stream_device(stream) < 0) return ret(cudaErrorInvalidResourceHandle);
  if (!count) return cudaSuccess;
  struct mem_info mi;
  cudaError_t e = memset_target("cudaMemsetAsync", devPtr, count, &mi);
  if (e) return ret(e);
  struct memset_job *j = memset_job("cudaMemsetAsync", devPtr, value, count);
  if (!j) return ret(cudaErrorMemoryAllocation);
  e = dbl_stream_submit(stream, "cudaMemsetAsync", 0, run_memset, j);
  if (e) free(j);
  return ret(e);
}
