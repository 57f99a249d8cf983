/* The one internal interface behind which the three backends (thread, mpi,
 * nccl) live.  Each backend is one directory, groups/thread/, groups/mpi/
 * and groups/nccl/, that fills one `struct mpg__backend_ops`
 * (mpg__backend_<name>; its files and their jobs are listed in
 * <name>/<name>_internal.h).  The generic layer (groups/ctx.c, group.c,
 * coll.c; see core.h) owns the public API: argument checks, size-1
 * groups, timeouts and abort, work handles.  A backend only moves data.
 * The table begins with the transport table (transport.h), so that a
 * backend's communicators are transports like the shared-memory segment
 * and channel below: held in their group's list, aborted and destroyed
 * the same way (docs/groups.md, "Layers"). */
#ifndef MPG_GROUPS_BACKEND_H
#define MPG_GROUPS_BACKEND_H

#include "internal.h"
#include "transport.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A backend communicator (one per group this rank belongs to), one posted
 * operation, and the collective call: transport.h (a backend's
 * communicators are transports). */

/* Every MESHPG_* variable the library reads, parsed once by
 * mpg_ctx_create (groups/settings.c, one rule for all: docs/launchers.md)
 * and handed to the backends through mpg__world_args; none of them reads
 * the environment itself.  MESHPG_LOG is also read once per process by
 * mesh/base/log.c, since it works before any context exists; mpg_ctx_create
 * sets the log level from this read.  NCCL_LAUNCH_ORDER_IMPLICIT is
 * NCCL's, read here as NCCL reads it. */
typedef struct mpg__settings {
  int log;                  /* MESHPG_LOG: 0 off, 1 info, 2 debug */
  int check_order;          /* MESHPG_CHECK_ORDER (build default when unset) */
  int shm;                  /* MESHPG_SHM: 1 (default) or 0 */
  size_t thread_inbox_msgs; /* MESHPG_THREAD_INBOX_MSGS (1024) */
  size_t thread_inbox_bytes;/* MESHPG_THREAD_INBOX_BYTES (256 MiB) */
  int mpi_progress;         /* MESHPG_MPI_PROGRESS: 1 thread (default), 0 off */
  int mpi_window;           /* MESHPG_MPI_WINDOW: 1..8, 0 unset (automatic) */
  long mpi_max_count;       /* MESHPG_MPI_MAX_COUNT: 0 unset (INT_MAX) */
  size_t mpi_piece_bytes;   /* MESHPG_MPI_PIECE_BYTES: 0 unset (1 MiB) */
  int nccl_port;            /* MESHPG_NCCL_PORT: 0 unset (MASTER_PORT + 1) */
  int nccl_split_share;     /* MESHPG_NCCL_SPLIT_SHARE: 0 (default) or 1 */
  /* NCCL's own NCCL_LAUNCH_ORDER_IMPLICIT, read as NCCL reads it (an
   * integer, not 0: on; anything else: off) and never validated here. */
  int nccl_launch_order_implicit;
  long trace_entries;       /* MESHPG_TRACE_ENTRIES: -1 unset (2048), 0 off */
  char trace_dir[1024];     /* MESHPG_TRACE_DIR: "" unset */
  /* The first variable that broke the rule: MPG_OK, or MPG_ERR_ENV with
   * `error` the message (its field keeps the default). */
  mpg_status status;
  const char *bad_var; /* that variable's name (a literal), or NULL */
  char error[256];
} mpg__settings;

/* settings.c: read every variable into *out.  Never fails: a bad value
 * leaves its default in place and is reported in out->status and
 * out->error (the first one), so that the rank still joins the world and
 * every rank learns of it (groups/agree.c). */
void mpg__settings_read(mpg__settings *out);

/* What world_init needs, resolved from options and environment. */
typedef struct mpg__world_args {
  int rank, world_size, local_rank, local_world_size;
  double timeout_s;
  int device;                     /* nccl */
  const void *nccl_id;            /* nccl: 128 bytes or NULL */
  const char *master_addr;        /* nccl rendezvous: "" if unknown */
  int master_port;                /* -1 if unknown */
  void *mpi_comm;                 /* mpi (and nccl bootstrap): MPI_Comm * */
  mpg_thread_world *thread_world; /* thread */
  const mpg__settings *settings;  /* lives as long as the context */
} mpg__world_args;

struct mpg__backend_ops {
  /* The transport table (transport.h): name, post, test,
   * test_keeps_time, wait, req_free, req_times, abort_comm, abort_comms
   * and destroy, reached by their names (ops->post) or whole as
   * &ops->transport, the table of the backend's communicators in the
   * groups' transport lists and in mpg_work. */
  union {
    struct mpg__transport_ops transport;
    struct {
      MPG__TRANSPORT_OPS_FIELDS
    };
  };
  /* Join the world.  Collective over all ranks.  Must give up with
   * MPG_ERR_TIMEOUT after args->timeout_s. */
  mpg_status (*world_init)(const mpg__world_args *args, mpg__comm **world);
  /* Split `parent`: collective over every rank of parent.  color >= 0 joins
   * the group of that colour, ordered by key (ties by parent rank); color
   * < 0 joins nothing and gets *out = NULL.  Bounded by the timeout. */
  mpg_status (*split)(mpg__comm *parent, int color, int key, mpg__comm **out);
  /* Optional: start n >= 1 sends and receives (kinds MPG__SEND and
   * MPG__RECV only, validated; one stream) as one group, with one request
   * for all of them: none may wait for another (nccl: ncclGroupStart ..
   * ncclGroupEnd).  Either every operation is started or none is.  NULL:
   * the generic layer (groups/p2p.c) posts the receives, then the sends,
   * with post, and keeps one request per operation. */
  mpg_status (*post_batch)(mpg__comm *comm, const mpg__coll *list, int n,
                           mpg__req **req);
  /* Optional: start an all-to-all (mpg_all_to_all, mpg_all_to_all_v) as
   * one operation with one request, never blocking past the timeout (the
   * post waits for no peer).  Counts and displacements are in elements
   * of dtype, one entry per member, already checked by the generic layer
   * (groups/alltoall.c: no byte size overflows, send and recv do not
   * overlap); the entries at this member's own position are 0 on both
   * sides (the generic layer copies that block itself, before the post).
   * The arrays are read during the call only.  Counts that differ
   * between two members fail where the backend sees them.  Returns
   * MPG_OK with *req NULL when the backend does not take this call: the
   * generic layer then posts it as point-to-point traffic (mpg__group_
   * post_p2p); a backend that declines must decide from what every member
   * knows alike (the mpi backend never declines: a pair too large for one
   * MPI call travels as its own messages inside the same request).  NULL:
   * every all-to-all is point to point. */
  mpg_status (*post_alltoallv)(mpg__comm *comm, const void *send, const size_t *scounts,
                               const size_t *sdispls, void *recv, const size_t *rcounts,
                               const size_t *rdispls, mpg_dtype dtype, mpg__req **req);
  /* Optional (NULL: mpg__local_host).  Run a collective of a size-1 group,
   * which has no communicator: every kind reduces to a copy of send into
   * recv (times scale for MPG__OP_PREMUL_SUM); barrier does nothing.  The
   * nccl backend copies on the caller's stream, on the device of `world`
   * (the context's world communicator). */
  mpg_status (*local)(mpg__comm *world, const mpg__coll *coll);
  /* Optional memory and stream hooks (NULL: host memory, no streams), used
   * by the nccl backend for device buffers and ordering between streams.
   * Each takes the world communicator, so that the backend works on its
   * device (the caller's current device is left as it was). */
  mpg_status (*mem_alloc)(mpg__comm *world, size_t bytes, int registered,
                          void **ptr); /* zeroed */
  mpg_status (*mem_free)(mpg__comm *world, void *ptr);
  mpg_status (*mem_zero)(mpg__comm *world, void *ptr, size_t bytes, void *stream);
  /* Copy bytes between host memory and memory from mem_alloc, either way,
   * and return when the copy is complete (setup collectives stage their
   * host data through it). */
  mpg_status (*mem_copy)(mpg__comm *world, void *dst, const void *src, size_t bytes);
  /* Optional (mpi): when [ptr, ptr + bytes) lies in one region from
   * mem_alloc that the node's other processes may map (a memfd of this
   * process, open at *fd, of *len bytes, *id its inode), 1 with *offset
   * the place of ptr in it; else 0.  Local; any thread. */
  int (*mem_share)(const void *ptr, size_t bytes, int *fd, uint64_t *offset, uint64_t *len,
                   uint64_t *id);
  /* Optional, for checkpoints (sync/ckpt*.c): pinned host staging
   * (cudaHostAlloc) and its free, a copy either way between host and
   * mem_alloc memory queued on `stream` (cudaMemcpyAsync), and a wait for
   * everything queued on a stream (cudaStreamSynchronize).  NULL: host
   * memory (malloc), memcpy, nothing to wait for. */
  mpg_status (*host_alloc)(mpg__comm *world, size_t bytes, void **ptr);
  mpg_status (*host_free)(mpg__comm *world, void *ptr);
  mpg_status (*copy_async)(mpg__comm *world, void *dst, const void *src, size_t bytes,
                           void *stream);
  mpg_status (*stream_sync)(mpg__comm *world, void *stream);
  mpg_status (*stream_create)(mpg__comm *world, void **stream);
  mpg_status (*stream_destroy)(mpg__comm *world, void *stream);
  mpg_status (*stream_order)(mpg__comm *world, void *waiter, void *waitee);
  /* Optional: this process's rank and size in the caller's communicator
   * (opts.mpi_comm, an MPI_Comm *), which then replace the launcher's
   * world rank and size.  Local: no communication. */
  mpg_status (*comm_identity)(void *mpi_comm, int *rank, int *size);
  /* Optional: the CUDA device (this process's ordinal) that comm runs on,
   * or -1.  nccl: the device world_init chose (groups/device.h), so that
   * binding pins the rank near that GPU. */
  int (*comm_device)(const mpg__comm *comm);
  /* Optional (NULL: the backend names no group in its messages).  The
   * mesh's name of the group comm serves ("tp[1]", "world", an extra
   * group's given name; mpg__group_label), for the backend's messages:
   * group.c calls it on this member's handle right after making the
   * communicator, before any operation on it.  Copied (cut to the
   * backend's room); local.  The generic layer names a failed operation
   * itself, with the flight recorder's number ("all_reduce #8 on tp[1]",
   * coll.c's on_failure): a backend's message gives no number or group
   * name of its own counting or naming (issue 46, item 4). */
  void (*set_label)(mpg__comm *comm, const char *label);
  /* Set the timeout of the operations (and splits) that start on comm from
   * now on; communicators split from it later inherit it.  Local. */
  void (*set_timeout)(mpg__comm *comm, double timeout_s);
  /* This member's position in comm and comm's size, as the backend made
   * them: group.c checks them against the mesh after every split.  Local. */
  void (*comm_shape)(const mpg__comm *comm, int *position, int *size);
  /* Optional: the position in `parent` (the communicator comm was split
   * from) of each of comm's members, in comm's position order, into
   * positions[] (room for comm's size): group.c checks them against the
   * mesh.  Local.  Returns 0, or -1 when the backend cannot tell (nothing
   * is checked then).  NULL: not checked (nccl says no member ids). */
  int (*comm_members)(const mpg__comm *comm, const mpg__comm *parent, int *positions);
  /* 1: the backend's collectives read and write host memory and its
   * ranks may be threads or processes of one host, so a node's members of
   * a group may reduce in a segment of shared memory instead
   * (groups/shm/, for sync's buffers: thread, mpi); 0: never (nccl). */
  int host_shm;
};

/* Shared memory behind this table (groups/shm/).  A node's segment and a
 * group's all-to-all channel are transports of their own (transport.h),
 * each with a transport table of its own (static in shm/engine.c and
 * shm/a2a.c), held in the group's transport list like the group's backend
 * communicator, so that the context aborts and destroys them the same way.
 * An operation on them runs through the generic layer like any collective
 * (coll.c's mpg__group_run_on and mpg__group_finish: the group claimed,
 * the arguments checked, the issue order noted, a work handle whose
 * mpg_work_test and mpg_work_wait go through the table that posted it, a
 * failure through mpg__group_on_failure).  shm/ decides from `host_shm`
 * whether it may serve a context, gets its setup collectives (the
 * all-gathers, the split by local position) from the group through the
 * callbacks it is given (struct mpg__transport_setup), and reduces only
 * through the one kernel below (mpg__reduce_sources): it reads no backend
 * kind and keeps no arithmetic of its own. */

/* The size-1 collective on host memory. */
mpg_status mpg__local_host(const mpg__coll *coll);

extern const struct mpg__backend_ops mpg__backend_thread;
extern const struct mpg__backend_ops mpg__backend_mpi;  /* built with MPI */
extern const struct mpg__backend_ops mpg__backend_nccl; /* built with NCCL */

/* "all_reduce", "broadcast", ... and "sum", "avg", ...; "?" when unknown. */
const char *mpg__kind_name(mpg__coll_kind kind);
const char *mpg__op_name(mpg_op op);

/* Element helpers shared by the CPU backends (groups/reduce.c). */
size_t mpg__dtype_size(mpg_dtype dt);
int mpg__dtype_is_half(mpg_dtype dt); /* f16 or bf16 */
int mpg__dtype_is_float(mpg_dtype dt);
float mpg__half_to_f32(mpg_dtype dt, uint16_t h);
uint16_t mpg__f32_to_half(mpg_dtype dt, float f); /* round to nearest even */
/* Widen n f16/bf16 elements to f32, or narrow them back. */
void mpg__half_widen(mpg_dtype dt, const void *src, float *dst, size_t n);
void mpg__half_narrow(mpg_dtype dt, const float *src, void *dst, size_t n);
/* The one reduction kernel (groups/reduce.c).  Every reduction the
 * library computes on the CPU goes through it: the thread backend's
 * all-reduce and reduce-scatter (thread/coll.c), the MPI ring's reduce
 * steps (mpi/ring.c) and the shared-memory reductions (shm/), so that
 * two paths that reduce the same addends in the same order give the same
 * bits by construction: there is no second copy of the arithmetic to keep
 * equal.
 *
 * mpg__reduce_step: over n elements of the work dtype wdt (f32, f64, i32,
 * i64; f16/bf16 are widened to f32 first), acc[i] = x[i] when first, else
 * acc[i] (op) x[i] (MAX and MIN compare; every other op adds), with x[i]
 * multiplied by (wdt's) scale first when premul (floats only); then, when
 * div > 0, acc[i] /= div in the same pass (floats: a power of two
 * multiplies by its exact inverse, the same quotient; integers truncate
 * toward zero).  The roundings are those of a scale pass, an add pass and
 * a divide pass one after the other (no fused multiply-add).  acc may be
 * x. */
void mpg__reduce_step(mpg_dtype wdt, mpg_op op, void *acc, const void *x, size_t n,
                      int first, int premul, double scale, int div);

/* mpg__reduce_sources: elements [lo, hi) of nsrc sources reduced in
 * source order into ndst destinations (element i of each at src[p] / dst[k]
 * + i elements of dtype), a block of MPG__REDUCE_BLOCK elements at a time
 * (every source's block is read before any destination's is written: a
 * destination may be a source, at the same address), with the next block
 * of every source prefetched.  f16/bf16 accumulate in f32 and round once,
 * to nearest even.  PREMUL_SUM multiplies source p by scales[p] (scales
 * NULL: by scale); AVG divides by divisor, fused into the last source's
 * step.  Two halves of the same reduction, for a sum formed in two places
 * (shm/'s hierarchical all-reduce): with ndst 0, the sums (work dtype,
 * not divided) go to acc[i - lo]; with nsrc 0, they are read from
 * acc[i - lo], divided and written out.  acc NULL otherwise.  scratch:
 * MPG__REDUCE_SCRATCH bytes of the caller's, any alignment (the kernel
 * allocates nothing and keeps no state: any thread may call it). */
#define MPG__REDUCE_BLOCK 2048 /* elements: 8 KiB of f32 per source */
#define MPG__REDUCE_SCRATCH (MPG__REDUCE_BLOCK * (sizeof(double) + sizeof(float) + 2))
typedef struct mpg__reduce_job {
  mpg_dtype dtype;      /* of the sources and destinations */
  mpg_op op;            /* SUM, AVG, MAX, MIN, PREMUL_SUM */
  double scale;         /* PREMUL_SUM, when scales is NULL */
  const double *scales; /* PREMUL_SUM: one per source, or NULL */
  int divisor;          /* AVG: the group's size */
  const void *const *src;
  int nsrc;
  void *const *dst;
  int ndst;
  void *acc;            /* the sums, when nsrc or ndst is 0 */
} mpg__reduce_job;
void mpg__reduce_sources(const mpg__reduce_job *job, size_t lo, size_t hi, void *scratch);
/* buf[i] *= factor (floats), for pre-multiply. */
void mpg__scale(mpg_dtype dt, void *buf, size_t n, double factor);
/* buf[i] /= divisor (floats divide; integers truncate toward zero), for
 * MPG_OP_AVG. */
void mpg__divide(mpg_dtype dt, void *buf, size_t n, int divisor);

#ifdef __cplusplus
}
#endif
#endif
