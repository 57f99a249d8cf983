/* The CUDA half of the test double (cuda_double.c): the CUDA runtime API of
 * streams, events and host functions. */

#include "cuda_double_internal.h"

/* ------------------------------------------------------------------ */
/* Streams                                                             */
/* ------------------------------------------------------------------ */

/* A stream belongs to the device current at its creation (cudaSetDevice
 * docs); flags other than cudaStreamDefault / cudaStreamNonBlocking are
 * cudaErrorInvalidValue (seen on an H100). */
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags) {
  dbl_cuda_enter("cudaStreamCreateWithFlags");
  int d;
  cudaError_t e = current_device(&d);
  if (e) return ret(e);
  if (!pStream || (flags & ~(unsigned)cudaStreamNonBlocking)) return ret(cudaErrorInvalidValue);
  pthread_mutex_lock(&G);
  dev_get(d);
  struct dstream *s = stream_new(d, S_USER, flags);
  if (s) *pStream = stream_handle(s);
  pthread_mutex_unlock(&G);
  return s ? cudaSuccess : ret(cudaErrorMemoryAllocation);
}

cudaError_t cudaStreamCreate(cudaStream_t *pStream) {
  return cudaStreamCreateWithFlags(pStream, cudaStreamDefault);
}

/* Enters api, takes G and resolves the stream handle h; the caller ends
 * with unlock_ret, which releases G. */
static cudaError_t stream_lock(const char *api, cudaStream_t h, struct dstream **s) {
  dbl_cuda_enter(api);
  pthread_mutex_lock(&G);
  return stream_resolve(h, s);
}

static cudaError_t unlock_ret(cudaError_t e) {
  pthread_mutex_unlock(&G);
  return ret(e);
}

/* Mark s destroyed (G held, released and retaken to join).  Work already
 * queued still runs: the call returns at once and the resources go when the
 * work is done (cudaStreamDestroy docs). */
static void stream_retire_locked(struct dstream *s) {
  s->destroyed = 1;
  pthread_cond_signal(&s->cv);
  if (!s->started) {
    dev_unlink(s);
    return;
  }
  if (s->head) {
    s->exit_mode = EXIT_DETACH;
    return;
  }
  s->exit_mode = EXIT_JOIN;
  dev_unlink(s);
  pthread_mutex_unlock(&G);
  pthread_join(s->thread, NULL);
  pthread_mutex_lock(&G);
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  struct dstream *s;
  cudaError_t e = stream_lock("cudaStreamDestroy", stream, &s);
  if (!e && s->kind != S_USER) e = cudaErrorInvalidResourceHandle;
  if (!e) stream_retire_locked(s);
  return unlock_ret(e);
}

/* A thread's per-thread streams end with the thread. */
void ptds_release(void *arg) {
  struct dstream **v = arg;
  pthread_mutex_lock(&G);
  for (int d = 0; d < MAX_DEVICES; d++)
    if (v[d]) stream_retire_locked(v[d]);
  pthread_mutex_unlock(&G);
  free(v);
  tl_ptds = NULL;
}

/* Waits for the work queued so far.  For the legacy stream that is an
 * action in it, so it also waits for the blocking streams' earlier work
 * ([STREAM-SYNC], "Legacy default stream"). */
cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  struct dstream *s;
  cudaError_t e = stream_lock("cudaStreamSynchronize", stream, &s);
  if (!e) {
    if (s->kind == S_LEGACY) e = submit_and_wait(s, "cudaStreamSynchronize", noop, NULL,
                                                 "cudaStreamSynchronize");
    else host_wait(s, s->submitted, "cudaStreamSynchronize");
  }
  return unlock_ret(e);
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
  struct dstream *s;
  cudaError_t e = stream_lock("cudaStreamQuery", stream, &s);
  if (!e && s->completed < s->submitted) e = cudaErrorNotReady;
  return unlock_ret(e);
}

/* ------------------------------------------------------------------ */
/* Events                                                              */
/* ------------------------------------------------------------------ */

static struct devent *event_resolve(cudaEvent_t h) {
  uintptr_t v = (uintptr_t)h;
  if (v < EVENT_BASE || (v - EVENT_BASE) & 15) return NULL;
  uint64_t x = (v - EVENT_BASE) >> 4;
  uint64_t idx = x & 0xffffff, gen = x >> 24;
  if (idx >= (uint64_t)netab) return NULL;
  struct devent *ev = &etab[idx];
  return ev->live && (ev->gen & 0xfffffu) == gen ? ev : NULL;
}

/* Enters api, takes G and resolves the event handle (NULL: not a live
 * event); the caller ends with unlock_ret. */
static struct devent *event_lock(const char *api, cudaEvent_t event) {
  dbl_cuda_enter(api);
  pthread_mutex_lock(&G);
  return event_resolve(event);
}

static int event_slot(void) {
  if (efree_head >= 0) {
    int i = efree_head;
    efree_head = efree_next[i];
    return i;
  }
  if (netab == capetab) {
    int cap = capetab ? 2 * capetab : 256;
    if (cap > 0xffffff) return -1;
    struct devent *t = realloc(etab, (size_t)cap * sizeof *t);
    if (!t) return -1;
    etab = t;
    int *n = realloc(efree_next, (size_t)cap * sizeof *n);
    if (!n) return -1;
    efree_next = n;
    capetab = cap;
  }
  memset(&etab[netab], 0, sizeof etab[netab]);
  return netab++;
}

/* cudaEventInterprocess must come with cudaEventDisableTiming
 * (cudaEventCreateWithFlags docs); unknown flags are cudaErrorInvalidValue
 * (seen on an H100).  The event belongs to the current device. */
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags) {
  dbl_cuda_enter("cudaEventCreateWithFlags");
  int d;
  cudaError_t e = current_device(&d);
  if (e) return ret(e);
  unsigned known = cudaEventBlockingSync | cudaEventDisableTiming | cudaEventInterprocess;
  if (!event || (flags & ~known) ||
      ((flags & cudaEventInterprocess) && !(flags & cudaEventDisableTiming)))
    return ret(cudaErrorInvalidValue);
  pthread_mutex_lock(&G);
  int i = event_slot();
  if (i >= 0) {
    struct devent *ev = &etab[i];
    ev->gen++;
    ev->live = 1;
    ev->device = d;
    ev->flags = flags;
    ev->recorded = 0;
    ev->stream = NULL;
    *event = event_handle(i);
  }
  pthread_mutex_unlock(&G);
  return i >= 0 ? cudaSuccess : ret(cudaErrorMemoryAllocation);
}

cudaError_t cudaEventCreate(cudaEvent_t *event) {
  return cudaEventCreateWithFlags(event, cudaEventDefault);
}

/* Captures the stream's contents at the call; later use of the stream does
 * not change the event; event and stream must be on one device
 * (cudaEventRecord docs).  The capture is a marker item, so that on the
 * legacy stream it also covers the blocking streams' earlier work. */
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  struct devent *ev = event_lock("cudaEventRecord", event);
  struct dstream *s = NULL;
  cudaError_t e = ev ? stream_resolve(stream, &s) : cudaErrorInvalidResourceHandle;
  if (!e && s->device != ev->device) e = cudaErrorInvalidResourceHandle;
  uint64_t seq = 0;
  if (!e) e = submit_locked(s, "cudaEventRecord", 0, 0, noop, NULL, NULL, &seq);
  if (!e) {
    ev->recorded = 1;
    ev->stream = s;
    ev->seq = seq;
  }
  return unlock_ret(e);
}

/* Before the first record an event is an empty set of work, so a query
 * answers cudaSuccess (cudaEventRecord docs). */
cudaError_t cudaEventQuery(cudaEvent_t event) {
  struct devent *ev = event_lock("cudaEventQuery", event);
  return unlock_ret(!ev ? cudaErrorInvalidResourceHandle
                    : ev->recorded && ev->stream->completed < ev->seq ? cudaErrorNotReady
                                                                       : cudaSuccess);
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  struct devent *ev = event_lock("cudaEventSynchronize", event);
  if (ev && ev->recorded) host_wait(ev->stream, ev->seq, "cudaEventSynchronize");
  return unlock_ret(ev ? cudaSuccess : cudaErrorInvalidResourceHandle);
}

/* Destroying an event others still wait on is allowed: the waits keep the
 * captured point, not the event (cudaStreamWaitEvent below). */
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  struct devent *ev = event_lock("cudaEventDestroy", event);
  if (ev) {
    int i = (int)(ev - etab);
    ev->live = 0;
    efree_next[i] = efree_head;
    efree_head = i;
  }
  return unlock_ret(ev ? cudaSuccess : cudaErrorInvalidResourceHandle);
}

/* All later work of the stream waits for the work the event captured, as
 * captured at this call (cudaStreamWaitEvent and cudaEventRecord docs); an
 * event never recorded captures nothing.  The event may be of another
 * device.  Only flags 0 outside graph capture (seen on an H100). */
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
  struct devent *ev = event_lock("cudaStreamWaitEvent", event);
  struct dstream *s = NULL;
  cudaError_t e = ev ? stream_resolve(stream, &s) : cudaErrorInvalidResourceHandle;
  if (!e && flags) e = cudaErrorInvalidValue;
  if (!e) {
    struct dep d = {ev->stream, ev->seq};
    e = submit_locked(s, "cudaStreamWaitEvent", 0, 0, noop, NULL, ev->recorded ? &d : NULL,
                      NULL);
  }
  return unlock_ret(e);
}

/* ------------------------------------------------------------------ */
/* Host functions                                                      */
/* ------------------------------------------------------------------ */

struct hostfn_job {
  cudaHostFn_t fn;
  void *data;
};

static void run_hostfn(void *arg) {
  struct hostfn_job *j = arg;
  j->fn(j->data);
  free(j);
}

/* Runs after the stream's earlier work and holds its later work
 * (cudaLaunchHostFunc docs); it runs on the stream's executor. */
cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void *userData) {
  dbl_cuda_enter("cudaLaunchHostFunc");
  if (!fn) return ret(cudaErrorInvalidValue);
  struct hostfn_job *j = malloc(sizeof *j);
  if (!j) return ret(cudaErrorMemoryAllocation);
  *j = (struct hostfn_job){fn, userData};
  cudaError_t e = dbl_stream_submit(stream, "cudaLaunchHostFunc", 0, run_hostfn, j);
  if (e) free(j);
  return ret(e);
}
