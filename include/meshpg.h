/*
 * meshpg.h - the public C API of meshpg.
 *
 * meshpg turns a device-mesh description such as `dp=4, cp=2, tp=8` into the
 * process groups of a 3D-parallel training job.  The comment before each
 * declaration is its contract; how the library works inside is in docs/
 * (start with docs/c-api.md).
 *
 * Conventions (shared by every function below):
 *  - Statuses.  A function that can fail returns an mpg_status: MPG_OK (0)
 *    or an error, and mpg_last_error() then gives a message that names the
 *    field, the value and, for TOML input, file:line:col.  A scalar accessor
 *    cannot fail: it returns the value, or for a NULL handle the neutral
 *    value (0, -1, NULL or "") its comment gives.
 *  - Ownership.  Handles are opaque.  Constructors set *out = NULL on
 *    failure; mpg_<noun>_destroy(handle) frees one, accepts NULL and returns
 *    an mpg_status.  A returned string belongs to the library or to the
 *    handle its comment names.  Pointers passed in are used during the call
 *    only, unless the comment says what keeps them.
 *  - Communication.  "Local": the call exchanges nothing with other ranks.
 *    "Collective over G": every rank of G (the world, or the members of a
 *    group) must make the call, in the same order relative to its other
 *    collectives and group creations (docs/groups.md, "Issue order").
 *  - Threads.  "Any thread": may be called from any thread, also at the same
 *    time as other calls.  "Context thread": the calls on one context, its
 *    groups and the mpg_sync objects made on it must not overlap (the caller
 *    serialises them; on nccl the calls that issue work come from one
 *    thread, see "Collectives" below); other contexts may be used meanwhile.
 *    mpg_last_error() is per thread.
 *  - The library never exits, aborts or prints; it logs to stderr only when
 *    MESHPG_LOG is "info" or "debug".  Ranks, group indices and positions
 *    are 0-based ints.  Names read mpg_<noun>_<verb>; a getter that fills a
 *    struct is mpg_<noun>_get_<what>(handle, [index,] &out).
 *  - Dim lists (mpg_ctx_group_dims, mpg_param_opts.reduce_dims,
 *    mpg_sync_opts.default_dims, mpg_placement_opts.inner_dims): names of
 *    dims, flattened sets or "world", separated by commas, spaces and tabs
 *    around a name ignored ("dp_cp, tp"); a dim named twice counts once.  An
 *    empty name, or one of MPG_NAME_MAX chars or more, is MPG_ERR_INVALID;
 *    an unknown name is MPG_ERR_NOT_FOUND naming the mesh's names.
 *  - Versioned structs (the ABI rule; docs/c-api.md, "Versioned structs").
 *    Every struct passed by pointer begins with size, magic and version,
 *    set by its initializer macro (mpg_init_opts o = MPG_INIT_OPTS_INIT;).
 *    The library reads and writes only the fields that lie wholly within
 *    the caller's size (its defaults for the rest), so programs built
 *    against an older header keep working; a wrong magic is the only
 *    rejection (MPG_ERR_INVALID).  Fields are only ever appended, and an
 *    appended field's zero value means its default.  mpg_p2p_op, an element
 *    of a caller's array, has no header and never changes.
 *  - Misuse (NULL arguments, wrong magics, bad enums, out-of-range values,
 *    byte sizes that overflow size_t, calls out of order) is detected, with
 *    a message.  Undefined behaviour: a handle used after its destroy call, a
 *    collective on a group of a destroyed context, a buffer shorter than its
 *    count (docs/groups.md).
 */
#ifndef MESHPG_H
#define MESHPG_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Marks the exported functions (the library is built with hidden
 * visibility: anything not marked stays internal). */
#if defined(__GNUC__) || defined(__clang__)
#define MPG_API __attribute__((visibility("default")))
#else
#define MPG_API
#endif

/* The version of this header.  mpg_version() gives the library's. */
#define MPG_VERSION_MAJOR 1
#define MPG_VERSION_MINOR 2
#define MPG_VERSION_PATCH 0
/* 0xMMmmpp: compare with mpg_version(). */
#define MPG_VERSION_HEX \
  ((MPG_VERSION_MAJOR << 16) | (MPG_VERSION_MINOR << 8) | MPG_VERSION_PATCH)
/* The struct layout version that initializer macros write into `version`;
 * bumped whenever a public struct gains a field. */
#define MPG_API_VERSION 4

/* The library's version as 0xMMmmpp (the MPG_VERSION_HEX it was built
 * with), to compare with the header's.  Cannot fail.  Local; any thread. */
MPG_API unsigned mpg_version(void);

/* The library's version as text, "1.0.0", in static storage.  Cannot fail.
 * Local; any thread. */
MPG_API const char *mpg_version_string(void);

/* ------------------------------------------------------------------------ */
/* Status codes                                                              */
/* ------------------------------------------------------------------------ */

/* One list gives the enum, mpg_status_name() and mpg_strerror(). */
#define MPG_STATUS_MAP(XX)                                                    \
  XX(OK, "success")                                                           \
  XX(ERR_INVALID, "invalid argument")                                         \
  XX(ERR_SPEC, "invalid mesh specification")                                  \
  XX(ERR_PARSE, "syntax error in TOML input")                                 \
  XX(ERR_IO, "input/output error")                                            \
  XX(ERR_NOMEM, "out of memory")                                              \
  XX(ERR_NOT_FOUND, "no such name")                                           \
  XX(ERR_RANGE, "value out of range")                                         \
  XX(ERR_ENV, "missing or contradictory launch environment")                  \
  XX(ERR_BACKEND, "communication backend failure")                            \
  XX(ERR_UNSUPPORTED, "not supported by this build or backend")               \
  XX(ERR_TIMEOUT, "timed out waiting for peers")                              \
  XX(ERR_ABORTED, "communicator was aborted")                                 \
  XX(ERR_STATE, "call not valid in the current state")                        \
  XX(ERR_TOPO, "topology error")

typedef enum mpg_status {
#define MPG__STATUS_ENUM(name, text) MPG_##name,
  MPG_STATUS_MAP(MPG__STATUS_ENUM)
#undef MPG__STATUS_ENUM
  MPG_STATUS_COUNT
} mpg_status;

/* Fixed English text for a status ("timed out waiting for peers"), static
 * storage.  Never NULL; unknown codes give "unknown status".  Local; any
 * thread. */
MPG_API const char *mpg_strerror(mpg_status status);

/* Symbolic name of a status without the prefix ("ERR_TIMEOUT"), static
 * storage.  Never NULL; unknown codes give "UNKNOWN".  Local; any thread. */
MPG_API const char *mpg_status_name(mpg_status status);

/* The precise message of the last failed call on this thread, for example
 *   "spec.toml:4:30: mesh.dims[1].size: expected a positive integer or -1, found 0".
 * "" when no call has failed on this thread.  The string belongs to the
 * library and stays valid until the next meshpg call on this thread.
 * Local; any thread (each thread has its own message). */
MPG_API const char *mpg_last_error(void);

/* ------------------------------------------------------------------------ */
/* Vocabulary shared by every module                                         */
/* ------------------------------------------------------------------------ */

/* Element types of collective buffers. */
typedef enum mpg_dtype {
  MPG_F32 = 0,
  MPG_F64 = 1,
  MPG_F16 = 2,  /* IEEE binary16 */
  MPG_BF16 = 3, /* bfloat16 */
  MPG_I32 = 4,
  MPG_I64 = 5
} mpg_dtype;
#define MPG_DTYPE_COUNT 6

/* Reductions, for collectives and for gradient sync (spec [sync] op,
 * mpg_sync_settings.op, which take MPG_OP_AVG or MPG_OP_SUM).  MPG_OP_AVG
 * divides the sum by the group size (integer division for integer types);
 * mpg_all_reduce_scaled multiplies each input by a scale before summing. */
typedef enum mpg_op {
  MPG_OP_SUM = 0,
  MPG_OP_AVG = 1,
  MPG_OP_MAX = 2,
  MPG_OP_MIN = 3
} mpg_op;

/* ------------------------------------------------------------------------ */
/* Mesh specification                                                        */
/* ------------------------------------------------------------------------ */

#define MPG_MAX_DIMS 8       /* most dims in one mesh */
#define MPG_MAX_FLATTEN 16   /* most flattened dim sets in one mesh */
#define MPG_NAME_MAX 32      /* a name's buffer, including the NUL: 31 chars */
#define MPG_PATH_MAX 512     /* file names kept in the spec, with the NUL */

/* Where a value came from: 1-based line and column in spec->source.
 * line == 0 means the value did not come from a file (API or command line). */
typedef struct mpg_srcpos {
  int line;
  int col;
} mpg_srcpos;

typedef enum mpg_backend_kind {
  MPG_BACKEND_THREAD = 0, /* in-process simulated ranks */
  MPG_BACKEND_MPI = 1,    /* Open MPI */
  MPG_BACKEND_NCCL = 2    /* NCCL on CUDA devices */
} mpg_backend_kind;

typedef enum mpg_bind {
  MPG_BIND_NONE = 0, /* leave the process where the OS put it */
  MPG_BIND_NUMA = 1, /* bind to the cores of the GPU's NUMA node */
  MPG_BIND_CORE = 2  /* bind to disjoint cores near the GPU */
} mpg_bind;

typedef enum mpg_rank_order {
  MPG_RANK_ORDER_BLOCK = 0, /* launcher numbers ranks node by node */
  MPG_RANK_ORDER_CYCLIC = 1 /* launcher deals ranks round-robin over nodes */
} mpg_rank_order;

/* How bf16/f16 gradients are reduced (docs/spec.md, reduce_dtype). */
typedef enum mpg_reduce_dtype {
  MPG_REDUCE_NATIVE = 0, /* reduce in the gradient's own dtype */
  MPG_REDUCE_F32 = 1     /* reduce bf16/f16 gradients with f32 accumulation,
                            rounded once, on every backend */
} mpg_reduce_dtype;

/* How mpg_sync keeps gradients and parameters over the data-parallel
 * group (docs/sharding.md). */
typedef enum mpg_sync_mode {
  MPG_SYNC_REPLICATE = 0, /* every rank keeps every reduced gradient */
  MPG_SYNC_SHARD = 1      /* distributed optimizer / HSDP: each rank keeps
                             its shard of every bucket */
} mpg_sync_mode;

/* One named mesh dim.  size is > 0, or -1 to infer it from the world size. */
typedef struct mpg_dim {
  char name[MPG_NAME_MAX];
  int size;
  mpg_srcpos name_pos;
  mpg_srcpos size_pos;
} mpg_dim;

/* A named flattened dim set, e.g. dp_cp = [dp, cp].  The dims must exist,
 * be distinct and be listed in mesh order (outermost first). */
typedef struct mpg_flatten {
  char name[MPG_NAME_MAX];
  int ndims;
  char dims[MPG_MAX_DIMS][MPG_NAME_MAX];
  mpg_srcpos name_pos;
  mpg_srcpos dim_pos[MPG_MAX_DIMS];
} mpg_flatten;

/* Settings: what one section of a spec file says, as one plain struct.
 * Each setting has this one home: the spec holds the struct that its file
 * fills, and the options of the call that uses it hold the same struct, so
 * `opts.sync = spec.sync` honours a file (docs/c-api.md, "One home for
 * each setting").  Plain values (arrays, no pointers); frozen for 1.x. */

#define MPG_DIMS_LEN 128 /* a dim list's buffer ("dp_shard,cp"), with the NUL */

/* [topology]: mpg_spec.topology, mpg_placement_opts.topology and
 * mpg_init_opts.topology. */
typedef struct mpg_topology_settings {
  int nodes;                 /* 0: world size / gpus_per_node */
  int gpus_per_node;         /* 0: from hwloc on this machine */
  mpg_bind bind;             /* default MPG_BIND_NONE */
  mpg_rank_order rank_order; /* default MPG_RANK_ORDER_BLOCK */
  int strict;                /* 1: an inner (tp/cp) group crossing nodes is
                                an error, not a warning */
} mpg_topology_settings;
#define MPG_TOPOLOGY_SETTINGS_INIT \
  { 0, 0, MPG_BIND_NONE, MPG_RANK_ORDER_BLOCK, 0 }

/* [sync]: mpg_spec.sync and mpg_sync_opts.sync. */
typedef struct mpg_sync_settings {
  int fsdp_owns_dp;              /* 1: the default reduce group is "cp" */
  mpg_op op;                     /* MPG_OP_AVG (default) or MPG_OP_SUM */
  double bucket_mb;              /* bucket size in MiB (default 25) */
  double first_bucket_mb;        /* the first bucket launched (default 1) */
  mpg_reduce_dtype reduce_dtype; /* default MPG_REDUCE_F32 */
  mpg_sync_mode mode;            /* default MPG_SYNC_REPLICATE */
  char shard_dims[MPG_DIMS_LEN]; /* shard: "" = the default reduce group */
  char replicate_dims[MPG_DIMS_LEN];    /* shard (HSDP): "" = none */
  int pad_for_nccl;              /* shard: pad to lcm(S, 128, 65536) */
  char expert_shard_dims[MPG_DIMS_LEN]; /* shard: "" = "edp" with an expert
                                           grid, "none" = replicated */
  int optimizer_instances;       /* shard: 0 (the default) means 1 */
} mpg_sync_settings;
#define MPG_SYNC_SETTINGS_INIT \
  { 0, MPG_OP_AVG, 25.0, 1.0, MPG_REDUCE_F32, MPG_SYNC_REPLICATE, "", "", 0, "", 0 }

/* [backend]: mpg_spec.backend and mpg_init_opts.backend. */
typedef struct mpg_backend_settings {
  mpg_backend_kind name; /* default MPG_BACKEND_THREAD */
  double timeout_s;      /* every wait's limit: > 0, below 1e9 (default 600) */
  int lazy_groups;       /* 1: create a group's communicator on first use,
                            collective over the world (docs/groups.md) */
} mpg_backend_settings;
#define MPG_BACKEND_SETTINGS_INIT { MPG_BACKEND_THREAD, 600.0, 0 }

/* [experts]: the MoE expert grid (mpg_spec.experts, mpg_spec_set_experts). */
typedef struct mpg_expert_settings {
  int ep;              /* > 0, or -1 (inferred, then edp = 1); 0 = none */
  int tp;              /* > 0; 0 = the size of the mesh's "tp" (1 without) */
  char order[64];      /* Megatron tokens, innermost first; "" = the mesh's */
  mpg_srcpos pos;      /* where the file said it: the [experts] table, */
  mpg_srcpos ep_pos;   /* ep, */
  mpg_srcpos tp_pos;   /* tp */
  mpg_srcpos order_pos;/* and order (line 0: not from a file) */
} mpg_expert_settings;
#define MPG_EXPERT_SETTINGS_INIT { 0, 0, "", {0, 0}, {0, 0}, {0, 0}, {0, 0} }

/* Everything a spec file says; each key's meaning and default is in
 * docs/spec.md.  A plain value type: it holds no pointers, so it may be
 * copied, and needs no destroy call.  A versioned struct (input and output):
 * always start from MPG_SPEC_INIT, which holds every default. */
typedef struct mpg_spec {
  size_t size;       /* sizeof(mpg_spec) of the caller's build */
  uint32_t magic;    /* MPG_SPEC_MAGIC */
  uint32_t version;  /* MPG_API_VERSION */
  int ndims;                            /* [mesh] dims, */
  mpg_dim dims[MPG_MAX_DIMS];           /* outermost first: the last dim is
                                           contiguous */
  int nflatten;                         /* [mesh] flatten */
  mpg_flatten flatten[MPG_MAX_FLATTEN];
  mpg_topology_settings topology;       /* [topology] */
  mpg_sync_settings sync;               /* [sync] */
  mpg_backend_settings backend;         /* [backend] */
  mpg_expert_settings experts;          /* [experts] */
  /* The file read (the name given to mpg_spec_load_string, "<string>"
   * without one, "" for the API); prefixes positioned error messages. */
  char source[MPG_PATH_MAX];
} mpg_spec;

#define MPG_SPEC_MAGIC 0x6d706773u /* "mpgs" */
/* The defaults: an empty mesh, the sections' defaults, no source. */
#define MPG_SPEC_INIT                                                       \
  { sizeof(mpg_spec), MPG_SPEC_MAGIC, MPG_API_VERSION, 0,                   \
    {{"", 0, {0, 0}, {0, 0}}}, 0,                                           \
    {{"", 0, {{0}}, {0, 0}, {{0, 0}}}}, MPG_TOPOLOGY_SETTINGS_INIT,         \
    MPG_SYNC_SETTINGS_INIT, MPG_BACKEND_SETTINGS_INIT,                      \
    MPG_EXPERT_SETTINGS_INIT, "" }

/* Every spec function below takes a spec set up with MPG_SPEC_INIT and
 * returns MPG_ERR_INVALID for a NULL argument or a spec with a wrong magic.
 * A failed call leaves *spec unchanged, except mpg_spec_load_*. */

/* Reset *spec to the defaults and an empty mesh, within the caller's size.
 * Returns MPG_OK; MPG_ERR_INVALID if spec is NULL or was not set up with
 * MPG_SPEC_INIT.  Local; any thread. */
MPG_API mpg_status mpg_spec_init(mpg_spec *spec);

/* Read a TOML spec file into *spec (reset first, as by mpg_spec_init) and
 * validate it (mpg_spec_validate).  Unknown keys are errors with a "did you
 * mean" suggestion.
 * Returns MPG_OK; MPG_ERR_IO if the file cannot be read; MPG_ERR_PARSE for
 * TOML syntax; MPG_ERR_SPEC for a wrong key, type or value (the message
 * names file:line:col, the key path, what was expected and what was
 * found); MPG_ERR_INVALID as above.  On error *spec holds the defaults.
 * Local; any thread. */
MPG_API mpg_status mpg_spec_load_file(const char *path, mpg_spec *spec);

/* As mpg_spec_load_file, from TOML text.  name (may be NULL) is used as the
 * file name in messages; NULL gives "<string>".  Local; any thread. */
MPG_API mpg_status mpg_spec_load_string(const char *toml, const char *name,
                                        mpg_spec *spec);

/* Replace the mesh dims from "dp=2,cp=2,tp=2" (outermost first; a size may
 * be -1 or "auto").  Flattened sets are kept.
 * Returns MPG_OK; MPG_ERR_SPEC naming the offending item of a malformed
 * string.  Local; any thread. */
MPG_API mpg_status mpg_spec_set_mesh(mpg_spec *spec, const char *dims);

/* Add (or replace) the flattened set `name` from "d1,d2,...".  Whether the
 * dims exist is checked by mpg_spec_validate.
 * Returns MPG_OK; MPG_ERR_SPEC for a malformed list or too many sets.
 * Local; any thread. */
MPG_API mpg_status mpg_spec_add_flatten(mpg_spec *spec, const char *name,
                                        const char *dims);

/* Reorder the dims by a Megatron order string, which names dims innermost
 * first separated by '-': "tp-cp-dp-pp" gives the mesh (pp, dp, cp, tp).
 * The string must name every dim of the spec exactly once.
 * Returns MPG_OK; MPG_ERR_SPEC naming the unknown, missing or repeated dim.
 * Local; any thread. */
MPG_API mpg_status mpg_spec_apply_order(mpg_spec *spec, const char *order);

/* Give the spec an expert grid (Megatron's expert RankGenerator): etp x ep
 * x edp x pp over the same world, edp = world / (etp * ep * pp), adding the
 * dim sets "etp", "ep", "edp", "etp_ep" and "etp_ep_pp" to every mesh built
 * from it (docs/pipeline-and-experts.md).  tp: expert tensor parallel size
 * > 0, 0 = the mesh's "tp" size (1 without one).  ep: expert parallel size
 * > 0, -1 to infer it (edp is then 1), or 0 to remove the grid (tp and
 * order must then be 0 / NULL).  order: a Megatron order string over tp,
 * cp, ep, dp, pp, innermost first; NULL or "": derived from the mesh.  Sizes
 * are checked by mpg_mesh_create.  Returns MPG_OK; MPG_ERR_SPEC naming the
 * bad value; MPG_ERR_INVALID as above.  Local; any thread. */
MPG_API mpg_status mpg_spec_set_experts(mpg_spec *spec, int tp, int ep,
                                        const char *order);

/* Check everything that does not need the world size: dim count (1..8),
 * names ([A-Za-z_][A-Za-z0-9_]*, at most 31 chars, not "world", distinct),
 * sizes (> 0 or one -1), flattened sets (known dims, no repeats, mesh order,
 * no clash with a dim name or another set), the expert grid's keys (order
 * tokens, no clash with the expert names, at most 19 dims and flattened
 * sets together) and the other sections' values.
 * Returns MPG_OK or MPG_ERR_SPEC; MPG_ERR_INVALID as above.  Local; any
 * thread. */
MPG_API mpg_status mpg_spec_validate(const mpg_spec *spec);

/* ------------------------------------------------------------------------ */
/* Mesh                                                                      */
/* ------------------------------------------------------------------------ */

/* A mesh: named dims laid out row-major over ranks 0..world_size-1, plus its
 * dim sets.  Memory is O(ndims): no per-rank or per-group tables.  Immutable
 * after creation, so it may be shared between threads. */
typedef struct mpg_mesh mpg_mesh;

/* Build a mesh from a validated spec; the caller frees *out with
 * mpg_mesh_destroy.  world_size > 0 resolves a -1 dim and must equal the
 * product of the sizes; world_size == 0 means "the product" and is invalid
 * when a dim is -1.  An expert grid's sizes are resolved and checked as
 * Megatron does (docs/pipeline-and-experts.md).
 * Returns MPG_OK; MPG_ERR_SPEC (the message names the world size and the
 * product, or the experts key, its value and what to change);
 * MPG_ERR_INVALID for NULL arguments or a spec not from MPG_SPEC_INIT;
 * MPG_ERR_NOMEM.  Local; any thread. */
MPG_API mpg_status mpg_mesh_create(const mpg_spec *spec, int world_size,
                                   mpg_mesh **out);

/* Free a mesh, once no context or placement uses it.  NULL is a no-op.
 * Always returns MPG_OK.  Local; any thread. */
MPG_API mpg_status mpg_mesh_destroy(mpg_mesh *mesh);

/* The number of ranks; 0 for NULL.  Local; any thread. */
MPG_API int mpg_mesh_world_size(const mpg_mesh *mesh);
/* The number of dims; 0 for NULL.  Local; any thread. */
MPG_API int mpg_mesh_ndims(const mpg_mesh *mesh);

/* Name and size of dim `dim` (0 = outermost); either out pointer may be
 * NULL, and *name belongs to the mesh.  Returns MPG_OK; MPG_ERR_RANGE for a
 * bad index; MPG_ERR_INVALID for a NULL mesh.  Local; any thread. */
MPG_API mpg_status mpg_mesh_dim(const mpg_mesh *mesh, int dim, const char **name,
                                int *size);

/* The number of dim sets (0 for NULL).  Dim set ids: every dim (0..ndims-1,
 * mesh order), then every flattened set (spec order), then with an expert
 * grid its sets "etp", "ep", "edp", "etp_ep", "etp_ep_pp" (their groups are
 * the expert grid's, row-major over it), then "world" (all dims, always the
 * last).  Local; any thread. */
MPG_API int mpg_mesh_num_dimsets(const mpg_mesh *mesh);

/* Find a dim set by name (a dim, a flattened or expert set, "world").
 * Returns MPG_OK; MPG_ERR_NOT_FOUND naming the unknown name and listing the
 * known ones; MPG_ERR_INVALID for NULL arguments.  Local; any thread. */
MPG_API mpg_status mpg_mesh_dimset_find(const mpg_mesh *mesh, const char *name,
                                        int *dimset);

/* Describe dim set `dimset`: its name (belongs to the mesh), the size of
 * each of its groups, and how many groups it has.  Any out pointer may be
 * NULL.  Returns MPG_OK; MPG_ERR_RANGE for a bad id; MPG_ERR_INVALID for a
 * NULL mesh.  Local; any thread. */
MPG_API mpg_status mpg_mesh_dimset_info(const mpg_mesh *mesh, int dimset,
                                        const char **name, int *group_size,
                                        int *num_groups);

/* The dims of a dim set as mesh dim indices, in mesh order; *ndims is set
 * and dims[] needs room for MPG_MAX_DIMS.  An expert set's etp, ep and edp
 * are numbered mpg_mesh_ndims + 0, + 1 and + 2 (after pp, if it has pp).
 * Returns MPG_OK; MPG_ERR_RANGE for a bad id; MPG_ERR_INVALID for NULL
 * arguments.  Local; any thread. */
MPG_API mpg_status mpg_mesh_dimset_dims(const mpg_mesh *mesh, int dimset,
                                        int dims[MPG_MAX_DIMS], int *ndims);

/* The expert grid's dim count: 4 (etp, ep, edp, pp in the grid's order)
 * for a mesh whose spec has an expert grid, else 0 (also for NULL).
 * Local; any thread. */
MPG_API int mpg_mesh_expert_ndims(const mpg_mesh *mesh);

/* Name ("etp", "ep", "edp" or "pp"; belongs to the mesh) and size of dim
 * `dim` of the expert grid, 0 = outermost (the last is contiguous); either
 * out pointer may be NULL.
 * Returns MPG_OK; MPG_ERR_INVALID for a NULL mesh; MPG_ERR_NOT_FOUND when
 * the mesh has no expert grid; MPG_ERR_RANGE for a bad index.  Local; any
 * thread. */
MPG_API mpg_status mpg_mesh_expert_dim(const mpg_mesh *mesh, int dim,
                                       const char **name, int *size);

/* rank -> coordinate (coord[] has mpg_mesh_ndims entries).  Returns MPG_OK;
 * MPG_ERR_RANGE for a rank outside 0..world_size-1; MPG_ERR_INVALID for
 * NULL arguments.  Local; any thread. */
MPG_API mpg_status mpg_mesh_coord_of(const mpg_mesh *mesh, int rank, int coord[]);

/* coordinate -> rank.  Returns MPG_OK; MPG_ERR_RANGE naming the bad
 * coordinate; MPG_ERR_INVALID for NULL arguments.  Local; any thread. */
MPG_API mpg_status mpg_mesh_rank_of(const mpg_mesh *mesh, const int coord[],
                                    int *rank);

/* The group of `rank` along dim set `dimset`: the group's index (groups are
 * numbered row-major over the dims outside the set, which is also the order
 * of their first ranks), the rank's position in it (row-major over the
 * set's dims), and the group size.  Out pointers may be NULL.  O(ndims).
 * Returns MPG_OK; MPG_ERR_RANGE for a bad dim set or rank; MPG_ERR_INVALID
 * for a NULL mesh.  Local; any thread. */
MPG_API mpg_status mpg_mesh_group_of(const mpg_mesh *mesh, int dimset, int rank,
                                     int *group_index, int *position,
                                     int *group_size);

/* The world rank at `position` in group `group_index` of dim set `dimset`.
 * Returns MPG_OK; MPG_ERR_RANGE for a bad dim set, group or position;
 * MPG_ERR_INVALID for NULL arguments.  Local; any thread. */
MPG_API mpg_status mpg_mesh_group_member(const mpg_mesh *mesh, int dimset,
                                       int group_index, int position, int *rank);

/* All members of group `group_index` of `dimset` in position order into
 * ranks[] (room for group_size ints).  Returns MPG_OK; MPG_ERR_RANGE for a
 * bad dim set or group; MPG_ERR_INVALID for NULL arguments.  Local; any
 * thread. */
MPG_API mpg_status mpg_mesh_group_members(const mpg_mesh *mesh, int dimset,
                                          int group_index, int *ranks);

/* ------------------------------------------------------------------------ */
/* Topology (topo/)                                                          */
/* ------------------------------------------------------------------------ */
/*
 * Topology: the GPUs, NUMA nodes, cores and NICs of a machine, read with
 * hwloc 2 from this machine, from an hwloc XML file or from a synthetic
 * description.  How GPUs are found and numbered (GPU i is CUDA device i; on
 * the live machine CUDA_VISIBLE_DEVICES applies): docs/topology.md, "What is
 * discovered".  A mpg_topo is immutable after loading; its functions may be
 * called from several threads at once.
 */
typedef struct mpg_topo mpg_topo;

#define MPG_BUS_ID_MAX 16      /* "0000:18:00.0" with the NUL */
#define MPG_CPUSET_STR_MAX 256 /* a cpuset as text, with the NUL */

/* A network device: a PCI device with network and/or OpenFabrics OS
 * devices.  A versioned output struct (MPG_NIC_INFO_INIT).  The strings
 * belong to the topology and stay valid until mpg_topo_destroy. */
typedef struct mpg_nic_info {
  size_t size;
  uint32_t magic;
  uint32_t version;
  const char *name;   /* the OpenFabrics device ("mlx5_0") if it has one,
                         else its network interface ("eth0") */
  const char *netdev; /* its network interface ("ibp23s0"), "" if none */
  const char *bus_id; /* its PCI bus id, "0000:17:00.0" */
  int numa_node;      /* as for GPUs: its NUMA node, -1 if several */
  const char *cpuset; /* the CPUs near it, "0-7,16-23" */
} mpg_nic_info;
#define MPG_NIC_INFO_MAGIC 0x6d70676eu /* "mpgn" */
#define MPG_NIC_INFO_INIT \
  { sizeof(mpg_nic_info), MPG_NIC_INFO_MAGIC, MPG_API_VERSION, NULL, NULL, NULL, -1, NULL }

/* One GPU.  A versioned output struct (MPG_GPU_INFO_INIT).  Every pointer
 * belongs to the topology and stays valid until mpg_topo_destroy. */
typedef struct mpg_gpu_info {
  size_t size;
  uint32_t magic;
  uint32_t version;
  int index;          /* 0..num_gpus-1; by default local rank i takes GPU i */
  const char *name;   /* OS device: "cuda0", "nvml0"; "" for a bare PCI GPU */
  const char *bus_id; /* PCI bus id, "0000:18:00.0" */
  unsigned vendor_id; /* 0x10de */
  unsigned device_id; /* e.g. 0x2330 (H100 SXM) */
  int numa_node;      /* OS index of its NUMA node; -1 when hwloc attaches
                         it above several NUMA nodes */
  const char *cpuset; /* the CPUs near it (its first non-I/O ancestor's), as
                         a list of PU OS indexes: "0-7,16-23" */
  int num_cores;      /* cores inside that cpuset */
  int pcie_group;     /* equal for GPUs below the same PCIe switch or root
                         port (numbered from 0) */
  int num_nics;       /* its nearest NICs (same PCIe switch, else host
                         bridge); read them with mpg_topo_get_gpu_nic */
  int nvlink_peers;   /* other GPUs it reaches over NVLink; 0 without hwloc's
                         "NVLinkBandwidth" matrix */
} mpg_gpu_info;
#define MPG_GPU_INFO_MAGIC 0x6d706767u /* "mpgg" */
#define MPG_GPU_INFO_INIT                                                   \
  { sizeof(mpg_gpu_info), MPG_GPU_INFO_MAGIC, MPG_API_VERSION, -1, NULL,    \
    NULL, 0, 0, -1, NULL, 0, -1, 0, 0 }

/* Load this machine's topology (hwloc's HWLOC_XMLFILE / HWLOC_* variables
 * apply, as for every hwloc program); free *out with mpg_topo_destroy.
 * Returns MPG_OK; MPG_ERR_TOPO if hwloc cannot read the machine, or for a
 * CUDA_VISIBLE_DEVICES entry that cannot be applied (malformed or empty, a
 * GPU listed twice, a UUID that matches no GPU or several, a UUID while the
 * GPUs are bare PCI devices, a "MIG-<uuid>" instance id: the message names
 * the entry; docs/topology.md); MPG_ERR_INVALID if out is NULL;
 * MPG_ERR_NOMEM.  Local; any thread. */
MPG_API mpg_status mpg_topo_load_live(mpg_topo **out);

/* Load an hwloc XML topology file (as written by `lstopo file.xml`); free
 * *out with mpg_topo_destroy.
 * Returns MPG_OK; MPG_ERR_IO if the file cannot be opened or read (missing,
 * no permission, a directory; the message names the path and the system
 * error); MPG_ERR_TOPO if it is empty or hwloc rejects its content (not XML,
 * not an hwloc topology, inconsistent objects); MPG_ERR_INVALID for NULL
 * arguments; MPG_ERR_NOMEM.  Local; any thread. */
MPG_API mpg_status mpg_topo_load_xml(const char *path, mpg_topo **out);

/* Build a topology from an hwloc synthetic description such as
 * "pack:2 numa:1 core:32 pu:2"; free *out with mpg_topo_destroy.  It has
 * CPUs and NUMA nodes, never GPUs.
 * Returns MPG_OK; MPG_ERR_TOPO naming the description if hwloc rejects it;
 * MPG_ERR_INVALID for NULL arguments; MPG_ERR_NOMEM.  Local; any thread. */
MPG_API mpg_status mpg_topo_load_synthetic(const char *description, mpg_topo **out);

/* Free a topology and every string it handed out.  NULL is a no-op.
 * Always returns MPG_OK.  Local; any thread, once nothing uses it. */
MPG_API mpg_status mpg_topo_destroy(mpg_topo *topo);

/* Where the topology came from, for messages: "this machine (HOST)", the XML
 * path, or "synthetic \"DESC\"".  Belongs to the topology; "" for NULL.
 * Local; any thread. */
MPG_API const char *mpg_topo_source(const mpg_topo *topo);

/* 1 if the topology is this machine's own (loaded live), so that binding
 * can be applied; 0 for XML and synthetic topologies (and NULL).  Local;
 * any thread. */
MPG_API int mpg_topo_is_this_system(const mpg_topo *topo);

/* The number of GPUs; 0 for NULL.  Local; any thread. */
MPG_API int mpg_topo_num_gpus(const mpg_topo *topo);
/* The number of NUMA nodes; 0 for NULL.  Local; any thread. */
MPG_API int mpg_topo_num_numa_nodes(const mpg_topo *topo);
/* The number of packages (sockets); 0 for NULL.  Local; any thread. */
MPG_API int mpg_topo_num_packages(const mpg_topo *topo);
/* The number of cores; 0 for NULL.  Local; any thread. */
MPG_API int mpg_topo_num_cores(const mpg_topo *topo);
/* The number of PUs (hardware threads); 0 for NULL.  Local; any thread. */
MPG_API int mpg_topo_num_pus(const mpg_topo *topo);

/* 1 when every pair of GPUs is linked by NVLink (an all-to-all GPU fabric
 * such as NVSwitch), 0 otherwise (PCIe only, partial links, fewer than 2
 * GPUs, no NVLinkBandwidth matrix, NULL).  Local; any thread. */
MPG_API int mpg_topo_has_gpu_fabric(const mpg_topo *topo);

/* Describe GPU `gpu` (0..num_gpus-1) into *out (set up with
 * MPG_GPU_INFO_INIT).
 * Returns MPG_OK; MPG_ERR_RANGE naming the index and the GPU count;
 * MPG_ERR_INVALID for NULL arguments or an out struct with a wrong magic.
 * Local; any thread. */
MPG_API mpg_status mpg_topo_get_gpu(const mpg_topo *topo, int gpu, mpg_gpu_info *out);

/* The k-th nearest NIC (0..num_nics-1 of mpg_gpu_info) of GPU `gpu` into
 * *out (set up with MPG_NIC_INFO_INIT).
 * Returns MPG_OK; MPG_ERR_RANGE for a bad GPU or NIC index;
 * MPG_ERR_INVALID for NULL arguments or a wrong magic.  Local; any thread. */
MPG_API mpg_status mpg_topo_get_gpu_nic(const mpg_topo *topo, int gpu, int k,
                                        mpg_nic_info *out);

/* The number of NICs of the topology, GPU or not; 0 for NULL.  Local; any
 * thread. */
MPG_API int mpg_topo_num_nics(const mpg_topo *topo);
/* NIC `nic` (0..count-1, in PCI order) into *out (set up with
 * MPG_NIC_INFO_INIT).  Returns MPG_OK; MPG_ERR_RANGE for a bad index;
 * MPG_ERR_INVALID for NULL arguments or a wrong magic.  Local; any thread. */
MPG_API mpg_status mpg_topo_get_nic(const mpg_topo *topo, int nic, mpg_nic_info *out);

/* What a binding call chose (and, unless MPG_BIND_APPLY_NONE, applied).  A plain
 * value: it holds no pointers.  A versioned output struct
 * (MPG_BINDING_INIT). */
typedef struct mpg_binding {
  size_t size;
  uint32_t magic;
  uint32_t version;
  int local_rank;
  int gpu;                             /* GPU taken; -1 on a GPU-less node */
  char gpu_bus_id[MPG_BUS_ID_MAX];     /* "" when gpu == -1 */
  mpg_bind mode;
  int numa_node;                       /* NUMA node of the GPU (or of the
                                          cpuset), -1 if several/unknown */
  char cpuset[MPG_CPUSET_STR_MAX];     /* the CPUs bound to, "0-3,16-19"; ""
                                          for MPG_BIND_NONE; "..." if cut */
  int num_cores;                       /* whole cores inside cpuset */
  int num_pus;                         /* PUs (hardware threads) in cpuset */
  int applied;                         /* 1: the OS binding was set */
  int thread;                          /* 1: only the calling thread */
} mpg_binding;
#define MPG_BINDING_MAGIC 0x6d706762u /* "mpgb" */
#define MPG_BINDING_INIT                                                    \
  { sizeof(mpg_binding), MPG_BINDING_MAGIC, MPG_API_VERSION, -1, -1, "",    \
    MPG_BIND_NONE, -1, "", 0, 0, 0, 0 }

/* What mpg_topo_bind applies its choice to. */
typedef enum mpg_bind_apply {
  MPG_BIND_APPLY_NONE = 0,    /* choose only (any topology) */
  MPG_BIND_APPLY_PROCESS = 1, /* bind the whole calling process */
  MPG_BIND_APPLY_THREAD = 2   /* bind the calling thread only (ranks that
                                 are threads of one process) */
} mpg_bind_apply;

/* Choose the GPU and CPUs of local rank `local_rank` of `local_world` ranks
 * on this node, and bind them as `apply` says.  gpu >= 0 takes that GPU;
 * -1 gives local rank i GPU i (none on a node without GPUs).  mode:
 * MPG_BIND_NONE no CPUs, MPG_BIND_NUMA the GPU's NUMA node, MPG_BIND_CORE a
 * disjoint block of its cores (docs/topology.md, "Binding").  *report (from
 * MPG_BINDING_INIT) is filled on success; applied = 1 when CPUs were bound.
 * Returns MPG_OK; MPG_ERR_RANGE (local rank, local_world < 1, GPU); MPG_ERR_TOPO
 * (more local ranks than GPUs, a NUMA node with fewer PUs than its ranks; to
 * apply: a topology not this machine's, or the system refuses, with its
 * error); MPG_ERR_INVALID (NULL, unknown mode or apply, wrong magic);
 * MPG_ERR_NOMEM.  Local; any thread (a thread binding binds the caller). */
MPG_API mpg_status mpg_topo_bind(const mpg_topo *topo, int local_rank,
                                 int local_world, int gpu, mpg_bind mode,
                                 mpg_bind_apply apply, mpg_binding *report);

/* Which ranks share a node.  Each rank calls mpg_topo_host_identity, the
 * world gathers the strings (the library does this itself where it needs
 * to, e.g. for mpg_init_opts.placement), and mpg_topo_node_ids numbers the
 * nodes. */
#define MPG_HOST_ID_MAX 320 /* hostname + ':' + boot id, with the NUL */

/* Write this machine's identity, "HOSTNAME:BOOT_ID" (boot id from
 * /proc/sys/kernel/random/boot_id; just "HOSTNAME" where there is none),
 * into buf (cap bytes), so that two containers or hosts with one name
 * still differ.
 * Returns MPG_OK; MPG_ERR_RANGE if cap is too small (MPG_HOST_ID_MAX is
 * always enough); MPG_ERR_IO if the host name cannot be read;
 * MPG_ERR_INVALID for NULL arguments.  Local; any thread. */
MPG_API mpg_status mpg_topo_host_identity(char *buf, size_t cap);

/* From host_ids[r] (one per rank, world_size of them) compute node_of[r]:
 * nodes are numbered 0,1,... in the order of their lowest rank; and, if
 * local_rank is not NULL, local_rank[r]: r's position among the ranks of
 * its node in rank order.  *num_nodes (may be NULL) gets the node count.
 * O(world_size log world_size).
 * Returns MPG_OK; MPG_ERR_INVALID for NULL arrays or a NULL id;
 * MPG_ERR_RANGE for world_size < 1; MPG_ERR_NOMEM.  Local; any thread. */
MPG_API mpg_status mpg_topo_node_ids(int world_size, const char *const *host_ids,
                                     int *node_of, int *local_rank, int *num_nodes);

/*
 * Placement: which launcher process runs at which mesh coordinate.  The
 * mesh keeps its row-major semantics over mesh ranks; placement decides
 * that mesh rank m runs as launcher rank L (the RANK the launcher gave the
 * process) on node n with GPU g, so that the groups of the inner dims (by
 * default tp, then cp) stay inside a node whatever the launcher's
 * numbering (docs/topology.md, "Placement across nodes").  A mpg_placement
 * is immutable; its functions may be called from several threads at once.
 */
typedef struct mpg_placement mpg_placement;

/* Options of mpg_placement_create (input, MPG_PLACEMENT_OPTS_INIT). */
typedef struct mpg_placement_opts {
  size_t size;       /* sizeof(mpg_placement_opts) of the caller's build */
  uint32_t magic;    /* MPG_PLACEMENT_MAGIC */
  uint32_t version;  /* MPG_API_VERSION */
  mpg_topology_settings topology; /* [topology]: nodes, gpus_per_node (both
                        0: the topo's GPU count if it divides the world, else
                        one node), rank_order, strict; bind is not used here */
  const int *node_of;        /* optional, world_size entries: launcher rank ->
                                node id; replaces nodes, gpus_per_node, rank_order */
  const int *local_rank;     /* optional with node_of: launcher rank -> its
                                local rank (= GPU); NULL: rank order on its node */
  const mpg_topo *topo;      /* optional: the topology of every node, to
                                order GPUs by NUMA node and PCIe switch */
  const char *inner_dims;    /* dims kept inside a node, innermost first; NULL:
                                "tp,cp" (those the mesh has); "": none */
} mpg_placement_opts;

#define MPG_PLACEMENT_MAGIC 0x6d70706cu /* "mppl" */
#define MPG_PLACEMENT_OPTS_INIT                                              \
  { sizeof(mpg_placement_opts), MPG_PLACEMENT_MAGIC, MPG_API_VERSION,       \
    MPG_TOPOLOGY_SETTINGS_INIT, NULL, NULL, NULL, NULL }

/* Place the ranks of `mesh` (opts NULL: MPG_PLACEMENT_OPTS_INIT, one node);
 * free *out with mpg_placement_destroy.  It keeps a pointer to mesh (none
 * to opts or its arrays): the mesh must outlive it.  Inner groups that
 * cross nodes are counted as by mpg_placement_check (a warning, or with
 * opts->topology.strict an error).  Returns MPG_OK; MPG_ERR_TOPO when nodes x
 * gpus_per_node is not the world size, or in strict mode (naming the dim
 * set, a crossing group and its nodes); MPG_ERR_RANGE for a negative count,
 * a node id or local rank out of range or repeated; MPG_ERR_NOT_FOUND for
 * an inner_dims name the mesh lacks; MPG_ERR_INVALID for NULL mesh/out or
 * opts not from MPG_PLACEMENT_OPTS_INIT; MPG_ERR_NOMEM.  Local; any
 * thread. */
MPG_API mpg_status mpg_placement_create(const mpg_mesh *mesh,
                                        const mpg_placement_opts *opts,
                                        mpg_placement **out);

/* Free a placement.  NULL is a no-op.  Always returns MPG_OK.  Local; any
 * thread, once nothing uses it. */
MPG_API mpg_status mpg_placement_destroy(mpg_placement *placement);

/* Node count; 0 for NULL.  Local; any thread. */
MPG_API int mpg_placement_num_nodes(const mpg_placement *placement);

/* Where mesh rank `mesh_rank` runs: its launcher rank, node and GPU (local
 * rank on the node).  Out pointers may be NULL.
 * Returns MPG_OK; MPG_ERR_RANGE for a rank outside 0..world_size-1;
 * MPG_ERR_INVALID for a NULL placement.  Local; any thread. */
MPG_API mpg_status mpg_placement_of(const mpg_placement *placement, int mesh_rank,
                                    int *launcher_rank, int *node, int *gpu);

/* The inverse: the mesh rank of launcher rank `launcher_rank`, i.e. which
 * coordinate this process takes.  Returns as mpg_placement_of.  Local; any
 * thread. */
MPG_API mpg_status mpg_placement_mesh_rank(const mpg_placement *placement,
                                           int launcher_rank, int *mesh_rank);

/* How many distinct nodes group `group_index` of `dimset` spans (1: it
 * stays inside a node).  Returns MPG_OK; MPG_ERR_RANGE for a bad dim set
 * or group; MPG_ERR_INVALID for NULL arguments; MPG_ERR_NOMEM.  Local; any
 * thread. */
MPG_API mpg_status mpg_placement_group_nodes(const mpg_placement *placement,
                                             int dimset, int group_index,
                                             int *num_nodes);

/* 1 if every dim of `dimset` is an inner dim (one the placement keeps
 * inside a node), else 0 (also for NULL or a bad id).  "world" is never
 * inner.  Local; any thread. */
MPG_API int mpg_placement_dimset_is_inner(const mpg_placement *placement,
                                          int dimset);

/* Count the misfits: groups of inner dim sets that span more than one node.
 * Each dim set with misfits is logged as a warning (MESHPG_LOG=info) with
 * its first crossing group.  *misfits (may be NULL) gets the count.
 * Returns MPG_OK; with strict != 0 and misfits, MPG_ERR_TOPO whose message
 * names the dim set, the group size, the GPUs per node, a crossing group
 * and its nodes; MPG_ERR_INVALID for NULL; MPG_ERR_NOMEM.  Local; any
 * thread. */
MPG_API mpg_status mpg_placement_check(const mpg_placement *placement, int strict,
                                       int *misfits);

/* ------------------------------------------------------------------------ */
/* Groups and collectives (groups/)                                          */
/* ------------------------------------------------------------------------ */
/* Size in bytes of one element; 0 for an unknown dtype.  Local; any
 * thread. */
MPG_API size_t mpg_dtype_size(mpg_dtype dtype);
/* "f32", "bf16", ... (static storage); "?" for an unknown dtype.  Local;
 * any thread. */
MPG_API const char *mpg_dtype_name(mpg_dtype dtype);

/* In-process simulated ranks (the thread backend).  A thread world is the
 * shared state of N ranks that run as threads of one process. */
typedef struct mpg_thread_world mpg_thread_world;

typedef struct mpg_init_opts mpg_init_opts;

/* The body of one simulated rank: it receives init options already filled
 * for its rank (backend, rank, world size, thread world) and calls the same
 * public API a real process would.  Its return value is the rank's status. */
typedef mpg_status (*mpg_rank_main)(const mpg_init_opts *opts, void *arg);

/* Run `nranks` ranks (1..4096) as threads of this process, each calling
 * main(opts, arg), and wait for all.  timeout_s (> 0) is the collective
 * timeout each rank's options carry.  statuses (may be NULL; else nranks
 * entries) receives each rank's return value.
 * Returns MPG_OK when every rank returned MPG_OK, else the first failing
 * rank's status (its message is kept in mpg_last_error()); MPG_ERR_INVALID
 * for bad arguments; MPG_ERR_NOMEM or MPG_ERR_BACKEND if the threads cannot
 * be started.  Local (its ranks communicate among themselves); any
 * thread. */
MPG_API mpg_status mpg_thread_run(int nranks, double timeout_s, mpg_rank_main main,
                                  void *arg, mpg_status *statuses);

/* How a process joins the world: input of mpg_ctx_create, a versioned
 * struct (MPG_INIT_OPTS_INIT).  A field left at -1 / NULL is read from the
 * launch environment (see mpg_launch_from_env). */
struct mpg_init_opts {
  size_t size;
  uint32_t magic;
  uint32_t version;
  mpg_backend_settings backend;   /* [backend]: name, timeout_s (<= 0: 600),
                                     lazy_groups */
  int rank;             /* -1: from the environment */
  int world_size;       /* -1: from the environment */
  int local_rank;       /* -1: from the environment (0 if absent) */
  int local_world_size; /* -1: from the environment (1 if absent) */
  int device;           /* NCCL: CUDA device (this process's ordinal); -1:
                           docs/nccl.md, "Choice of CUDA device" */
  const void *nccl_id;  /* NCCL: a 128-byte ncclUniqueId from the caller */
  void *mpi_comm;       /* MPI: pointer to the MPI_Comm to use as the world
                           (rank and size from it); NULL: MPI_COMM_WORLD */
  mpg_thread_world *thread_world; /* thread: set by mpg_thread_run */
  int placement;        /* 1: place the ranks across nodes (docs/topology.md)
                           and renumber: the context's rank is the mesh rank */
  mpg_topology_settings topology; /* [topology]: bind (bind the process, or
                           the calling thread on the thread backend, near its
                           GPU) and, with placement, strict; the node layout
                           is measured, so nodes, gpus_per_node and
                           rank_order are not used */
  const char *host_id;  /* this rank's host identity; NULL: the real one
                           (mpg_topo_host_identity); for tests of placement */
  /* 1.2: the flight recorder (docs/trace.md). */
  const char *trace_dir; /* where a fault dumps the ring; NULL:
                            MESHPG_TRACE_DIR; "": no automatic dumps */
  int trace_entries;     /* operations kept; 0: MESHPG_TRACE_ENTRIES, else
                            2048; < 0: recording off */
};
#define MPG_INIT_OPTS_MAGIC 0x6d706769u /* "mpgi" */
#define MPG_INIT_OPTS_INIT                                                  \
  { sizeof(mpg_init_opts), MPG_INIT_OPTS_MAGIC, MPG_API_VERSION,            \
    MPG_BACKEND_SETTINGS_INIT, -1, -1, -1, -1, -1, NULL, NULL, NULL, 0,     \
    MPG_TOPOLOGY_SETTINGS_INIT, NULL, NULL, 0 }

/* What the launcher said, read from the environment.  A versioned output
 * struct (MPG_LAUNCH_INIT). */
typedef struct mpg_launch {
  size_t size;
  uint32_t magic;
  uint32_t version;
  int rank;             /* -1 if no variable gave it */
  int world_size;       /* -1 if no variable gave it */
  int local_rank;       /* -1 if no variable gave it */
  int local_world_size; /* -1 if no variable gave it */
  char master_addr[256];/* MASTER_ADDR or "" */
  int master_port;      /* MASTER_PORT or -1 */
  char source[64];      /* "torchrun", "openmpi", "pmi", "slurm" or "" */
} mpg_launch;
#define MPG_LAUNCH_MAGIC 0x6d70676cu /* "mpgl" */
#define MPG_LAUNCH_INIT \
  { sizeof(mpg_launch), MPG_LAUNCH_MAGIC, MPG_API_VERSION, -1, -1, -1, -1, "", -1, "" }

/* Read the launch environment into *out (set up with MPG_LAUNCH_INIT): the
 * variables of torchrun, Open MPI, PMI and Slurm that docs/launchers.md
 * lists.  Several launchers may agree.
 * Returns MPG_OK (fields nobody set stay -1 / ""); MPG_ERR_ENV naming the
 * variable when one is not a number, out of range (RANK >= WORLD_SIZE), or
 * contradicts another (RANK=1 but OMPI_COMM_WORLD_RANK=2); MPG_ERR_INVALID
 * for NULL or a wrong magic.  Local; any thread. */
MPG_API mpg_status mpg_launch_from_env(mpg_launch *out);

/* A rank's view of the job: the world and every group of its mesh. */
typedef struct mpg_ctx mpg_ctx;
/* A communicator of one dim set, as seen by this rank.  Belongs to its
 * context: never freed by the caller. */
typedef struct mpg_group mpg_group;
/* An asynchronous collective in flight. */
typedef struct mpg_work mpg_work;

/* Join the world and create this rank's groups, one split of the world per
 * dim set of `mesh` (at first use with opts->backend.lazy_groups).  opts NULL: all
 * from the environment, thread backend.  The world size must equal
 * mpg_mesh_world_size(mesh); the mesh must outlive *out, which the caller
 * frees with mpg_ctx_destroy.  The ranks first check that they built the
 * same job (docs/launchers.md, "One job").  Returns MPG_OK; MPG_ERR_STATE
 * on every rank when they did not (naming the first difference), or when
 * MPI is finalized, or not initialised while opts->mpi_comm is set;
 * MPG_ERR_ENV (rank or world missing or contradictory; a bad MESHPG_* value
 * on any rank); MPG_ERR_INVALID; MPG_ERR_UNSUPPORTED (backend not built);
 * MPG_ERR_BACKEND; MPG_ERR_TIMEOUT (peers never came); MPG_ERR_NOMEM.
 * Collective over the world; any thread (each rank's own context). */
MPG_API mpg_status mpg_ctx_create(const mpg_mesh *mesh, const mpg_init_opts *opts,
                                  mpg_ctx **out);

/* Free every communicator and the context.  Release every work handle
 * (mpg_work_wait) and destroy every mpg_sync made on it first.  NULL is a
 * no-op.  After a timeout or abort it frees what it can without waiting for
 * peers; on nccl it first waits for the abort's thread (mpg_ctx_abort), at
 * most the context's timeout from the abort's start (docs/nccl.md, rule 5).
 * Returns MPG_OK or the first backend error met while freeing;
 * MPG_ERR_TIMEOUT (nccl) when that wait ran out, the context freed all the
 * same; MPG_ERR_STATE, freeing nothing, while a mpg_sync made on it lives.
 * Local: no issue-order check (call mpg_ctx_check_order first if wanted);
 * context thread. */
MPG_API mpg_status mpg_ctx_destroy(mpg_ctx *ctx);

/* MPG_OK while the context is healthy; after a timeout or abort, the reason
 * (MPG_ERR_TIMEOUT, MPG_ERR_ABORTED, ...); MPG_ERR_INVALID for NULL.
 * Local; any thread. */
MPG_API mpg_status mpg_ctx_status(const mpg_ctx *ctx);

/* Change the context's timeout (opts.backend.timeout_s at create) for every
 * operation, split and check that starts from now on, on every group of
 * the context, groups created later included; operations in flight keep
 * their deadline.  Typical use: a generous timeout for start-up, a short
 * one for the steps (docs/failures.md).  Each rank sets its own; ranks
 * should agree.  Returns MPG_OK; MPG_ERR_INVALID for a NULL ctx or a
 * timeout that is not > 0 (or is 1e9 s or more).  Local; context thread. */
MPG_API mpg_status mpg_ctx_set_timeout(mpg_ctx *ctx, double timeout_s);

/* Abort every communicator of the context (e.g. from a watchdog).  The
 * context and its communicators are marked aborted before it returns: this
 * rank's waiting calls fail with MPG_ERR_ABORTED within about 1 ms, later
 * calls at once, and waiting peers fail with MPG_ERR_ABORTED or
 * MPG_ERR_TIMEOUT.  Never blocks (on nccl NCCL's own abort runs on a thread
 * of its own: docs/nccl.md, rule 5).  The context must still be destroyed.
 * Returns MPG_OK; MPG_ERR_INVALID for NULL.  Local; any thread. */
MPG_API mpg_status mpg_ctx_abort(mpg_ctx *ctx);

/* Write the flight recorder's ring, this rank's last operations, to
 * dir/rank-R.trace (R: mpg_ctx_rank), replacing it; dir NULL: the
 * context's trace directory.  A fault (timeout, abort, desync) writes it
 * once by itself when a directory is set; `meshpg trace DIR` reads them
 * (docs/trace.md).  Returns MPG_OK; MPG_ERR_INVALID for a NULL ctx, no
 * dir and no directory set, or a dir over 1,023 bytes; MPG_ERR_STATE when
 * recording is off; MPG_ERR_IO naming the file.  Local; any thread, also
 * beside another dump of the same context (dumps are taken in turn). */
MPG_API mpg_status mpg_ctx_trace_dump(mpg_ctx *ctx, const char *dir);

/* This rank in the mesh (0..world-1): the launcher's rank unless
 * opts.placement renumbered it; -1 for NULL.  Local; any thread. */
MPG_API int mpg_ctx_rank(const mpg_ctx *ctx);
/* The rank the launcher gave this process (RANK, OMPI_COMM_WORLD_RANK...);
 * -1 for NULL.  Local; any thread. */
MPG_API int mpg_ctx_launcher_rank(const mpg_ctx *ctx);
/* Number of nodes found by placement (1 without opts.placement); 0 for
 * NULL.  Local; any thread. */
MPG_API int mpg_ctx_num_nodes(const mpg_ctx *ctx);
/* What opts.topology.bind did into *out (set up with MPG_BINDING_INIT; mode
 * MPG_BIND_NONE and applied 0 when nothing was asked).  Returns MPG_OK;
 * MPG_ERR_INVALID for NULL arguments or a wrong magic.  Local; any
 * thread. */
MPG_API mpg_status mpg_ctx_get_binding(const mpg_ctx *ctx, mpg_binding *out);
/* The world size; 0 for NULL.  Local; any thread. */
MPG_API int mpg_ctx_world_size(const mpg_ctx *ctx);
/* This process's rank on its node; -1 for NULL.  Local; any thread. */
MPG_API int mpg_ctx_local_rank(const mpg_ctx *ctx);
/* The context's backend; MPG_BACKEND_THREAD for NULL.  Local; any thread. */
MPG_API mpg_backend_kind mpg_ctx_backend(const mpg_ctx *ctx);
/* The mesh the context was created on (the caller's, not a copy); NULL for
 * NULL.  Local; any thread. */
MPG_API const mpg_mesh *mpg_ctx_mesh(const mpg_ctx *ctx);

/* Check that the ranks issued their collectives and group creations in one
 * order since the last check (NCCL needs one order on every device, or may
 * deadlock).  Only while the checker is on (MESHPG_CHECK_ORDER=1; unset: in
 * debug builds); what is recorded, the rule and the cost are in
 * docs/groups.md, "Issue order".  On a difference every rank fails alike,
 * the message naming the first differing call; either way the record starts
 * afresh.  Returns MPG_OK (at once while the checker is off); MPG_ERR_STATE
 * when the order differs, or (nccl) from another than the issuing thread;
 * MPG_ERR_ABORTED on an aborted context (nothing compared); MPG_ERR_TIMEOUT /
 * MPG_ERR_ABORTED when a peer never joins (the context is then aborted);
 * MPG_ERR_INVALID for NULL; MPG_ERR_NOMEM.  Collective over the world
 * (every rank calls it at the same point); context thread. */
MPG_API mpg_status mpg_ctx_check_order(mpg_ctx *ctx);

/* This rank's group of a dim set, by name ("dp", "tp", "dp_cp", "world");
 * it belongs to the context.  Returns MPG_OK; MPG_ERR_NOT_FOUND naming an
 * unknown name; MPG_ERR_INVALID for NULL arguments; with lazy groups the
 * errors of creating it (MPG_ERR_TIMEOUT, MPG_ERR_BACKEND, ...).  Local,
 * except with lazy groups: the first call for a dim set creates it and is
 * collective over the world (every rank asks for the same groups in the
 * same order); context thread. */
MPG_API mpg_status mpg_ctx_group(mpg_ctx *ctx, const char *name, mpg_group **out);

/* As mpg_ctx_group, by dim-set id (see mpg_mesh_dimset_find); a bad id is
 * MPG_ERR_RANGE.  Local or collective as mpg_ctx_group; context thread. */
MPG_API mpg_status mpg_ctx_group_at(mpg_ctx *ctx, int dimset, mpg_group **out);

/* The group of this rank over a union of dims and flattened sets (a dim
 * list, e.g. "dp_cp,tp" = dims dp, cp, tp), ordered row-major over those
 * dims like a flattened set; it belongs to the context.  Created by one
 * split of the world at the first call for a union, cached after.
 * Returns MPG_OK; the dim-list errors (MPG_ERR_INVALID, MPG_ERR_NOT_FOUND
 * naming an unknown name); the errors of creating the group.  The first
 * call for a union is collective over the world (every rank makes the same
 * calls in the same order), later ones are local; context thread. */
MPG_API mpg_status mpg_ctx_group_dims(mpg_ctx *ctx, const char *dims, mpg_group **out);

/* A sub-group along one dim (or set) `name`, holding only the members at
 * the given positions, ordered by position, e.g. the first and last
 * pipeline stage for tied embeddings: name "pp", positions {0, pp-1}.
 * *out (belongs to the context) is NULL on ranks at none of the positions.
 * Cached by (name, positions); not followed by the issue-order checker.
 * Returns MPG_OK; MPG_ERR_RANGE for a bad position; MPG_ERR_INVALID for
 * NULL arguments; the errors of finding `name` and creating the group.
 * Collective over the world: every rank calls it with the same arguments,
 * member or not; context thread. */
MPG_API mpg_status mpg_ctx_group_select(mpg_ctx *ctx, const char *name,
                                        const int *positions, int npositions,
                                        mpg_group **out);

/* Which of Megatron's partial data-parallel groups mpg_ctx_group_partial
 * makes. */
typedef enum mpg_partial {
  MPG_PARTIAL_INTRA = 0, /* the member's contiguous part of the group */
  MPG_PARTIAL_INTER = 1  /* the members at its place in every part */
} mpg_partial;

/* Megatron's partial data-parallel groups: the group of `dims` holding this
 * rank (size S) cut into `instances` contiguous parts of c = S / instances
 * members.  MPG_PARTIAL_INTRA: the part holding this rank, positions
 * [i c, (i + 1) c) of the group; MPG_PARTIAL_INTER: the members at this
 * rank's place j in every part, positions j, j + c, ..., j + (instances - 1)
 * c.  Ordered by position; named e.g. "edp/intra2"; cached; not followed by
 * the issue-order checker; instances = 1 gives the whole group (intra) or a
 * group of one (inter).  Returns MPG_OK; MPG_ERR_RANGE when instances < 1 or
 * does not divide S; MPG_ERR_INVALID for NULL arguments or an unknown
 * `which`; mpg_ctx_group_dims's errors for `dims`.  Collective over the
 * world (every rank calls it with the same arguments); context thread. */
MPG_API mpg_status mpg_ctx_group_partial(mpg_ctx *ctx, const char *dims, int instances,
                                         mpg_partial which, mpg_group **out);

/* Allocate `bytes` of zeroed memory where the backend's collectives want it
 * (host memory on thread and mpi; device memory on nccl: cudaMalloc, or
 * ncclMemAlloc registered with every communicator when registered = 1);
 * free it with mpg_ctx_mem_free.  On mpi, from 64 KiB (and while fewer
 * than 256 such buffers are live), it is shared memory (a memfd, page
 * aligned) that the other ranks of the host may map: an all-to-all whose
 * send blocks lie in it is copied once, by the receivers (docs/groups.md,
 * "All-to-all"); an in-place all_reduce on it runs without staging copies,
 * and after a failed or timed-out operation it holds unspecified values
 * (docs/groups.md, "The mpi backend in more detail").  Returns MPG_OK; MPG_ERR_INVALID for NULL arguments;
 * MPG_ERR_NOMEM; MPG_ERR_BACKEND (nccl).  Local; any thread. */
MPG_API mpg_status mpg_ctx_mem_alloc(mpg_ctx *ctx, size_t bytes, int registered,
                                     void **ptr);
/* Free memory from mpg_ctx_mem_alloc; NULL is a no-op.  On mpi a buffer an
 * unfinished or abandoned operation still uses is released once MPI is done
 * with it (MPG_OK at once).  Returns MPG_OK; MPG_ERR_INVALID for a NULL ctx,
 * or on mpi for a pointer that did not come from mpg_ctx_mem_alloc (or was
 * freed already); MPG_ERR_BACKEND (nccl).  Local; any thread. */
MPG_API mpg_status mpg_ctx_mem_free(mpg_ctx *ctx, void *ptr);
/* Zero `bytes` at ptr, on `stream` for nccl (synchronously elsewhere).
 * Returns MPG_OK; MPG_ERR_INVALID for a NULL ctx, or a NULL ptr with bytes
 * > 0; MPG_ERR_BACKEND (nccl).  Local; any thread. */
MPG_API mpg_status mpg_ctx_mem_zero(mpg_ctx *ctx, void *ptr, size_t bytes,
                                    void *stream);
/* A new stream of the context's device into *stream (nccl: a cudaStream_t;
 * other backends: NULL, and ordering calls are no-ops); destroy it with
 * mpg_ctx_stream_destroy.  Returns MPG_OK; MPG_ERR_INVALID for NULL
 * arguments; MPG_ERR_BACKEND (nccl).  Local; any thread. */
MPG_API mpg_status mpg_ctx_stream_create(mpg_ctx *ctx, void **stream);
/* Destroy a stream from mpg_ctx_stream_create; NULL is a no-op.  Returns
 * MPG_OK; MPG_ERR_INVALID for a NULL ctx; MPG_ERR_BACKEND (nccl).  Local;
 * any thread. */
MPG_API mpg_status mpg_ctx_stream_destroy(mpg_ctx *ctx, void *stream);
/* Make work queued later on `waiter` start after the work queued so far on
 * `waitee` (an event recorded on waitee, waited on by waiter; a no-op off
 * nccl).  Returns MPG_OK; MPG_ERR_INVALID for a NULL ctx; MPG_ERR_BACKEND
 * (nccl).  Local; any thread. */
MPG_API mpg_status mpg_ctx_stream_order(mpg_ctx *ctx, void *waiter, void *waitee);

/* The group's name ("tp", "dp_cp", ...; belongs to the group); "" for
 * NULL.  Local; any thread. */
MPG_API const char *mpg_group_name(const mpg_group *group);
/* This rank's position in the group; -1 for NULL.  Local; any thread. */
MPG_API int mpg_group_position(const mpg_group *group);
/* The number of members; 0 for NULL.  Local; any thread. */
MPG_API int mpg_group_size(const mpg_group *group);
/* Which group of its dim set this is (as mpg_mesh_group_of numbers them);
 * -1 for NULL.  Local; any thread. */
MPG_API int mpg_group_index(const mpg_group *group);
/* World rank of the member at `position`.  Returns MPG_OK; MPG_ERR_RANGE
 * for a position outside 0..size-1; MPG_ERR_INVALID for NULL arguments.
 * Local; any thread. */
MPG_API mpg_status mpg_group_member(const mpg_group *group, int position, int *rank);

/* Collectives.  Collective over the group: every member makes the same
 * calls, with the same counts and dtypes, in the same order.  Blocking when
 * work is NULL; otherwise the call returns at once with *work set (NULL for
 * work that finished already), to be passed to mpg_work_wait; the buffers
 * must stay valid and unchanged until the work completes.  Buffers are host
 * memory on the thread and mpi backends and device memory on nccl, where
 * `stream` is the caller's cudaStream_t (ignored elsewhere).  In place as in
 * NCCL, on every backend: all_reduce with send == recv; all_gather with
 * send == recv + position * count (this member's slot of recv);
 * reduce_scatter with recv == send + position * count (this member's block
 * of send); any other overlap is MPG_ERR_INVALID, nothing posted.  A group
 * of size 1 makes no communicator: collectives are local copies.
 * Threads: the calls that issue on a context's groups (these, point to
 * point, all-to-all) come from one thread at a time; a call made while
 * another on the same group has not returned fails with MPG_ERR_STATE,
 * posting and aborting nothing (docs/groups.md, "Threads").  On nccl the
 * first thread that issues on a context (or checks its order) is its
 * issuing thread for life; these calls from any other thread fail with
 * MPG_ERR_STATE, posting nothing (docs/nccl.md, rule 1).
 * Each returns MPG_OK; MPG_ERR_INVALID (NULL buffer, bad dtype, op, root,
 * peer, overlap); MPG_ERR_RANGE when count x element size (x the group size
 * for all_gather's recv and reduce_scatter's send) overflows size_t, checked
 * before any buffer is touched; MPG_ERR_STATE as above (nothing posted);
 * MPG_ERR_TIMEOUT when a peer did not arrive within the context's timeout,
 * and MPG_ERR_BACKEND when the backend failed the operation (either aborts
 * the context); MPG_ERR_ABORTED after an abort. */

/* recv[i] = op over members of send[i], count elements.  f16/bf16 are
 * accumulated in f32 where the backend has no native support.  Returns as
 * the collectives above.  Collective over the group; context thread. */
MPG_API mpg_status mpg_all_reduce(mpg_group *group, const void *send, void *recv,
                                  size_t count, mpg_dtype dtype, mpg_op op,
                                  void *stream, mpg_work **work);

/* recv[i] = sum over members of (scale * send[i]): a sum with pre-multiply,
 * e.g. scale = 1/(dp*cp*microbatches).  Floating dtypes only.  Returns as
 * the collectives above.  Collective over the group; context thread. */
MPG_API mpg_status mpg_all_reduce_scaled(mpg_group *group, const void *send,
                                         void *recv, size_t count, mpg_dtype dtype,
                                         double scale, void *stream, mpg_work **work);

/* buf on every member = buf of the member at position root.  Returns as
 * the collectives above.  Collective over the group; context thread. */
MPG_API mpg_status mpg_broadcast(mpg_group *group, void *buf, size_t count,
                                 mpg_dtype dtype, int root, void *stream,
                                 mpg_work **work);

/* recv (size * count elements) = concatenation of every member's send
 * (count elements), in position order.  Returns as the collectives above.
 * Collective over the group; context thread. */
MPG_API mpg_status mpg_all_gather(mpg_group *group, const void *send, void *recv,
                                  size_t count, mpg_dtype dtype, void *stream,
                                  mpg_work **work);

/* send has size * count elements; member p receives in recv (count
 * elements) the reduction of block p of every member's send.  Returns as
 * the collectives above.  Collective over the group; context thread. */
MPG_API mpg_status mpg_reduce_scatter(mpg_group *group, const void *send, void *recv,
                                      size_t count, mpg_dtype dtype, mpg_op op,
                                      void *stream, mpg_work **work);

/* Member p receives in recv the sum over members of (scale * block p of
 * send): a reduce-scatter with pre-multiply.  Floating dtypes only.
 * Returns as the collectives above.  Collective over the group; context
 * thread. */
MPG_API mpg_status mpg_reduce_scatter_scaled(mpg_group *group, const void *send,
                                             void *recv, size_t count, mpg_dtype dtype,
                                             double scale, void *stream, mpg_work **work);

/* Returns when every member has entered it.  Returns as the collectives
 * above.  Collective over the group; context thread. */
MPG_API mpg_status mpg_barrier(mpg_group *group, mpg_work **work);

/* All-to-all with equal blocks: send and recv hold size * count elements
 * each; the member at position i sends elements [j * count, (j + 1) *
 * count) of its send to the member at position j, which stores them at
 * [i * count, (i + 1) * count) of its recv (block i of its own send goes
 * to block i of its own recv, as a local copy).  count must be the same on
 * every member.  Otherwise as mpg_all_to_all_v with every count = count and
 * displacements j * count.  Collective over the group; context thread. */
MPG_API mpg_status mpg_all_to_all(mpg_group *group, const void *send, void *recv,
                                  size_t count, mpg_dtype dtype, void *stream,
                                  mpg_work **work);

/* All-to-all with a count and a displacement per peer, in elements, as
 * MPI_Alltoallv: position i sends send_counts[j] elements, from element
 * send_displs[j] of send, to position j, which stores them from element
 * recv_displs[i] of recv (recv_counts[i] expected).  The four arrays have
 * mpg_group_size entries and are read during the call only.  Blocks may lie
 * in any order, with gaps (left untouched); recv blocks must not overlap,
 * nor send and recv (not in place).  Counts must match pairwise; a buffer
 * may be NULL when all its counts are 0.  Returns as the collectives, and
 * MPG_ERR_INVALID for NULL arrays, overlap, this member's own two counts
 * differing, or counts that differ between members (docs/groups.md,
 * "All-to-all"); MPG_ERR_NOMEM.  Collective over the group (recorded by the
 * issue-order checker); context thread. */
MPG_API mpg_status mpg_all_to_all_v(mpg_group *group, const void *send,
                                    const size_t *send_counts, const size_t *send_displs,
                                    void *recv, const size_t *recv_counts,
                                    const size_t *recv_displs, mpg_dtype dtype, void *stream,
                                    mpg_work **work);

/* Send count elements of buf to the member at position `peer` of the group
 * (not this rank's own position: MPG_ERR_INVALID).  Messages from one peer
 * are received in the order they were sent.  A send may wait for its
 * receive: on mpi and nccl as in MPI / NCCL, on thread while the receiver's
 * inbox is full (docs/groups.md), failing with MPG_ERR_TIMEOUT (the context
 * aborted) after the context's timeout.  Returns as the collectives above.
 * Point to point (the peer posts the matching receive; not recorded by the
 * issue-order checker); context thread. */
MPG_API mpg_status mpg_send(mpg_group *group, const void *buf, size_t count,
                            mpg_dtype dtype, int peer, void *stream, mpg_work **work);
/* Receive count elements into buf from the member at position `peer`, the
 * match of its send (mpg_send or mpg_p2p_batch).  As mpg_send. */
MPG_API mpg_status mpg_recv(mpg_group *group, void *buf, size_t count,
                            mpg_dtype dtype, int peer, void *stream, mpg_work **work);

/* The direction of one operation of mpg_p2p_batch. */
typedef enum mpg_p2p_kind {
  MPG_P2P_SEND = 0, /* send buf to peer */
  MPG_P2P_RECV = 1  /* receive into buf from peer */
} mpg_p2p_kind;

/* One send or receive of mpg_p2p_batch, an element of the caller's array:
 * set every field, `{MPG_P2P_SEND, peer, buf, count, dtype}` in this order.
 * Frozen: it has no size/magic/version header and never changes
 * (docs/c-api.md).  A send only reads buf (a const buffer may be cast to
 * void *). */
typedef struct mpg_p2p_op {
  mpg_p2p_kind kind; /* MPG_P2P_SEND or MPG_P2P_RECV */
  int peer;          /* position of the peer in the group (not this rank's) */
  void *buf;         /* count elements; may be NULL when count is 0 */
  size_t count;      /* elements, not bytes */
  mpg_dtype dtype;
} mpg_p2p_op;

/* Issue ops[0..n), sends and receives on the group, as one batch (torch's
 * batch_isend_irecv): no operation waits for another, so a two-way exchange
 * of pipeline stages cannot deadlock.  Each operation is matched by the
 * peer's of the other direction with the same count and dtype (from
 * mpg_p2p_batch or mpg_send / mpg_recv), several to one peer in their order.
 * All are checked before any is posted; n == 0 does nothing; ops may be
 * reused on return; with work, one handle for the batch.  Returns as the
 * collectives; MPG_ERR_INVALID for n < 0, NULL ops, or an ops[i] with a bad
 * kind, a peer outside 0..size-1 or this rank's own, an unknown dtype or a
 * NULL buf with count > 0 (on a group of size 1, any); MPG_ERR_NOMEM.  A
 * post that fails part-way first waits for those already posted.  Point to
 * point (not recorded by the issue-order checker); context thread. */
MPG_API mpg_status mpg_p2p_batch(mpg_group *group, const mpg_p2p_op *ops, int n,
                                 void *stream, mpg_work **work);

/* Wait for `work` (up to the context's timeout) and release it, whatever
 * the outcome.  NULL is MPG_OK.  Returns the operation's status:
 * MPG_ERR_TIMEOUT (the context is then aborted), MPG_ERR_ABORTED, ...
 * Local; any thread, also while another thread issues on the group (on
 * nccl too), one thread at a time per handle. */
MPG_API mpg_status mpg_work_wait(mpg_work *work);

/* Non-blocking check: *done = 1 when the work has finished (successfully or
 * not); it must still be released with mpg_work_wait.  Returns the error if
 * the work failed.  NULL work (finished already) gives *done = 1 and
 * MPG_OK; a NULL done is MPG_ERR_INVALID.  Local; any thread, as
 * mpg_work_wait. */
MPG_API mpg_status mpg_work_test(mpg_work *work, int *done);

/* ------------------------------------------------------------------------ */
/* Gradient synchronisation (sync/)                                          */
/* ------------------------------------------------------------------------ */
/* Gradient synchronisation (docs/sync.md).  A trainer registers its
 * parameters, gets a view into one contiguous gradient buffer per (dtype,
 * reduce group, tied group), writes gradients straight into the views
 * during backward and marks each ready; buckets (slices of the buffers, no
 * copies) are all-reduced asynchronously as soon as all their gradients
 * are ready.
 *
 * Typical step:
 *   mpg_sync_begin(s, step, is_last_microbatch, stream);
 *   ... backward writes grads, calling mpg_sync_mark_ready(s, p) per param
 *   mpg_sync_finish(s);            // every bucket reduced (last microbatch)
 *
 * Ranks that share a reduce group must register the same layout (counts,
 * dtypes, reduce dims, tied or not, in the same order).  A mpg_sync is
 * used by one thread at a time; its context must outlive it. */
typedef struct mpg_sync mpg_sync;

/* Options of mpg_sync_create: a versioned input struct
 * (MPG_SYNC_OPTS_INIT).  mpg_sync_create copies its strings.  The spec keys
 * of the same names, and their meaning: docs/spec.md, "[sync]". */
typedef struct mpg_sync_opts {
  size_t size;
  uint32_t magic;
  uint32_t version;
  mpg_sync_settings sync;   /* [sync]: the spec's, or set here */
  const char *default_dims; /* NULL: by sync.fsdp_owns_dp; else a dim list,
                               e.g. "dp" */
  double grad_scale;      /* extra factor on every reduced gradient, e.g.
                             1/microbatches (default 1: plain avg op) */
  int register_buffers;   /* nccl: ncclMemAlloc + ncclCommRegister */
} mpg_sync_opts;
#define MPG_SYNC_OPTS_MAGIC 0x6d706779u /* "mpgy" */
#define MPG_SYNC_OPTS_INIT                                                  \
  { sizeof(mpg_sync_opts), MPG_SYNC_OPTS_MAGIC, MPG_API_VERSION,            \
    MPG_SYNC_SETTINGS_INIT, NULL, 1.0, 0 }

/* Per-parameter overrides: a versioned input struct (MPG_PARAM_OPTS_INIT). */
typedef struct mpg_param_opts {
  size_t size;
  uint32_t magic;
  uint32_t version;
  const char *reduce_dims; /* NULL: the sync's default; else a dim list,
                              e.g. "dp_cp,tp" (sequence-parallel norm), "edp" */
  mpg_group *tied_group;   /* NULL, or a group over which the reduced
                              gradient is then summed (mpg_ctx_group_select) */
} mpg_param_opts;
#define MPG_PARAM_OPTS_MAGIC 0x6d706770u /* "mpgp" */
#define MPG_PARAM_OPTS_INIT \
  { sizeof(mpg_param_opts), MPG_PARAM_OPTS_MAGIC, MPG_API_VERSION, NULL, NULL }

/* Create a gradient synchroniser on a context (opts NULL: the defaults);
 * free *out with mpg_sync_destroy, before the context.  The default reduce
 * group is opts->default_dims if set; else with sync.fsdp_owns_dp "cp" (a
 * one-rank group, nothing reduced, when the mesh has no cp); else "dp_cp",
 * or without that set the union of whichever of dp and cp the mesh has.
 * Returns MPG_OK; MPG_ERR_INVALID (NULL ctx/out, opts not from
 * MPG_SYNC_OPTS_INIT, unknown op, mode or reduce_dtype, bucket sizes not >
 * 0, grad_scale not finite, contradictory shard options); MPG_ERR_NOT_FOUND
 * (an unknown default_dims name, or a mesh with no dp_cp, dp or cp);
 * MPG_ERR_NOMEM; the groups layer's errors creating the group.  Collective
 * over the world when it creates the group (mpg_ctx_group_dims): every rank
 * calls it; context thread. */
MPG_API mpg_status mpg_sync_create(mpg_ctx *ctx, const mpg_sync_opts *opts,
                                   mpg_sync **out);

/* Register a parameter (before mpg_sync_commit): its name (copied), element
 * count, dtype and optional overrides.  *param receives its id (0, 1, ...
 * in registration order; -1 on failure).  Returns MPG_OK; MPG_ERR_STATE
 * after commit; MPG_ERR_INVALID (count 0, bad dtype, duplicate name, an
 * integer dtype with grad_scale != 1, malformed reduce_dims, opts with a
 * wrong magic, a tied_group of another context); MPG_ERR_NOT_FOUND
 * (reduce_dims names an unknown dim or set); MPG_ERR_RANGE (too large);
 * MPG_ERR_NOMEM.  A bf16/f16 parameter with reduce_dtype MPG_REDUCE_F32 is
 * accepted on every backend, nccl included.  Local; context thread. */
MPG_API mpg_status mpg_sync_add_param(mpg_sync *sync, const char *name, size_t count,
                                      mpg_dtype dtype, const mpg_param_opts *opts,
                                      int *param);

/* Lay out the gradient buffers and buckets (docs/sync.md, "Layout");
 * gradients start at zero.  The ranks first agree on the union of the
 * reduce_dims any rank registered and create those groups in one order, so
 * pipeline stages may register different parameters; the ranks of one
 * reduce or tied group must register the same layout, which commit checks
 * on thread and mpi (docs/failures.md, "Desync at commit"), then it checks
 * the issue order if the checker is on.  Returns MPG_OK; MPG_ERR_STATE if
 * already committed, when the issue order differs, or when the ranks of a
 * group registered different params (every rank fails; the sync stays
 * uncommitted, mpg_sync_grads_valid 0); MPG_ERR_TIMEOUT / MPG_ERR_ABORTED;
 * MPG_ERR_ENV (shared memory); MPG_ERR_NOMEM; the groups layer's errors.
 * Collective over the world: every rank calls it; context thread. */
MPG_API mpg_status mpg_sync_commit(mpg_sync *sync);

/* The gradient view of a parameter (count elements of its dtype) into
 * *grad, valid until mpg_sync_destroy: host memory, or device memory on
 * nccl.  The trainer writes (or accumulates) its gradient here.  Returns
 * MPG_OK; MPG_ERR_STATE before commit; MPG_ERR_RANGE for a bad id;
 * MPG_ERR_INVALID for NULL.  Local; context thread. */
MPG_API mpg_status mpg_sync_grad(mpg_sync *sync, int param, void **grad);

/* Start a step (micro-batch).  When is_last_microbatch is 0 nothing is
 * launched by mark_ready (gradient accumulation).  On nccl, `stream` is the
 * caller's stream that produces the gradients (NULL elsewhere).  Returns
 * MPG_OK; MPG_ERR_STATE before commit or while a step is open (finish it
 * first); MPG_ERR_ABORTED once a step failed with a timeout or an abort:
 * the context is aborted, and the message names that step and its error;
 * MPG_ERR_INVALID for NULL.  Local; context thread. */
MPG_API mpg_status mpg_sync_begin(mpg_sync *sync, long step, int is_last_microbatch,
                                  void *stream);

/* The gradient of `param` is complete for this micro-batch; its view must
 * not change after this until finish.  On the last micro-batch, every
 * bucket whose parameters are all ready is launched at once
 * (asynchronously), in bucket order, so that every rank issues the same
 * collectives in the same order.  Returns MPG_OK; MPG_ERR_STATE if no step
 * is open or the param was already marked in this step; MPG_ERR_RANGE for
 * a bad id; the step's error once it failed.  Starts collectives over the
 * buckets' groups; context thread. */
MPG_API mpg_status mpg_sync_mark_ready(mpg_sync *sync, int param);

/* Launch what is left (params never marked as they are), wait for every
 * bucket, then sum the tied buffers over their tied groups; on nccl the
 * caller's stream is then ordered after the reduction.  On success every
 * gradient is reduced over exactly its groups; on failure the gradients are
 * marked invalid (mpg_sync_grads_valid returns 0), never silently
 * half-reduced.  On the last micro-batch, with the checker on, it ends with
 * the issue-order check (mpg_ctx_check_order).  Returns MPG_OK;
 * MPG_ERR_STATE if no step is open or the issue order differs; the step's
 * first error (MPG_ERR_TIMEOUT, MPG_ERR_ABORTED, ...).  Collective over the
 * sync's groups (and the world, for the check); context thread. */
MPG_API mpg_status mpg_sync_finish(mpg_sync *sync);

/* begin(last microbatch) + mark every param ready + finish; returns the
 * first error.  Collective as mpg_sync_finish; context thread. */
MPG_API mpg_status mpg_sync_all(mpg_sync *sync, long step, void *stream);

/* Zero every gradient (e.g. after the optimizer step).  On nccl the
 * memsets come after the work queued so far on the stream given to the
 * last mpg_sync_begin, and the next begin orders that stream after them;
 * an optimizer on another stream must be ordered before this call by the
 * caller (mpg_ctx_stream_order).  Returns MPG_OK; MPG_ERR_STATE before
 * commit or while buckets of a step are in flight; MPG_ERR_INVALID for
 * NULL; MPG_ERR_BACKEND (nccl).  Local; context thread. */
MPG_API mpg_status mpg_sync_zero_grads(mpg_sync *sync);

/* 1 when the last finished step reduced every gradient (and before any
 * step), 0 after a failed step (until the next successful one) and for
 * NULL.  Local; context thread. */
MPG_API int mpg_sync_grads_valid(const mpg_sync *sync);

/* Layout facts for tools and tests.  A versioned output struct
 * (MPG_SYNC_STATS_INIT). */
typedef struct mpg_sync_stats {
  size_t size;
  uint32_t magic;
  uint32_t version;
  int num_params;
  int num_buffers;
  int num_buckets;
  size_t total_bytes;    /* of every buffer, the alignment padding included */
  long launched_buckets; /* over the sync's lifetime */
  size_t shard_elems;    /* shard mode (else 0): elements of this rank's
                            optimizer-state arrays (docs/sharding.md) */
  size_t pad_elems;      /* shard mode (else 0): padding elements of the
                            sharded buffers (param starts, bucket ends) */
  int shard_size;        /* shard mode (else 0): members of the shard group */
  int shm_buffers;       /* buffers reduced in node-local shared memory
                            (docs/sync.md, "Shared memory") */
  size_t shm_bytes;      /* the bytes this rank maps for them (with, in
                            shard mode, their params' segments) */
} mpg_sync_stats;
#define MPG_SYNC_STATS_MAGIC 0x6d706774u /* "mpgt" */
#define MPG_SYNC_STATS_INIT \
  { sizeof(mpg_sync_stats), MPG_SYNC_STATS_MAGIC, MPG_API_VERSION, 0, 0, 0, 0, 0, 0, 0, 0, \
    0, 0 }
/* Fill *stats (set up with MPG_SYNC_STATS_INIT).  Returns MPG_OK;
 * MPG_ERR_INVALID for NULL arguments or a wrong magic.  Local; context
 * thread. */
MPG_API mpg_status mpg_sync_get_stats(const mpg_sync *sync, mpg_sync_stats *stats);

/* The reduce group of a parameter into *group (belongs to the context).
 * Returns MPG_OK; MPG_ERR_STATE before commit; MPG_ERR_RANGE for a bad id;
 * MPG_ERR_INVALID for NULL.  Local; context thread. */
MPG_API mpg_status mpg_sync_param_group(const mpg_sync *sync, int param,
                                        mpg_group **group);

/* ------------------------------------------------------------------------ */
/* Sharded data parallel (opts.mode = MPG_SYNC_SHARD)                        */
/* ------------------------------------------------------------------------ */
/* A distributed optimizer (ZeRO-1/2, Megatron's distributed optimizer) and
 * HSDP.  A ready bucket of a sharded buffer is reduce-scattered over the
 * shard group (then, with replicate_dims, the owned slice is all-reduced
 * over the replicate group); the member at position r of the shard group
 * owns slice r of every bucket.  The optimizer updates the owned ranges
 * (mpg_sync_get_shard) of the parameter views (mpg_sync_param), then the
 * updated params are all-gathered bucket by bucket (mpg_sync_gather_*).
 * Layout, padding, the params that stay replicated and the loop step by
 * step: docs/sharding.md. */

/* The part of a param this rank owns.  A versioned output struct
 * (MPG_SHARD_INFO_INIT). */
typedef struct mpg_shard_info {
  size_t size;
  uint32_t magic;
  uint32_t version;
  int sharded;          /* 1: in a sharded buffer; 0: replicated (this
                           rank updates the whole param) */
  size_t param_offset;  /* first owned element, in the param */
  size_t count;         /* owned elements (0: none of this param) */
  size_t shard_offset;  /* where they sit in this rank's optimizer-state
                           arrays (0 .. mpg_sync_stats.shard_elems) */
} mpg_shard_info;
#define MPG_SHARD_INFO_MAGIC 0x6d706768u /* "mpgh" */
#define MPG_SHARD_INFO_INIT \
  { sizeof(mpg_shard_info), MPG_SHARD_INFO_MAGIC, MPG_API_VERSION, 0, 0, 0, 0 }

/* This rank's range of `param` into *info (set up with MPG_SHARD_INFO_INIT).
 * Valid after commit in shard mode.  Returns MPG_OK; MPG_ERR_STATE before
 * commit or in replicate mode; MPG_ERR_RANGE for a bad id; MPG_ERR_INVALID
 * for NULL or a wrong magic.  Local; context thread. */
MPG_API mpg_status mpg_sync_get_shard(const mpg_sync *sync, int param, mpg_shard_info *info);

/* The parameter view of `param` (count elements of its dtype) into *data, in
 * the parameter buffer, which mirrors the gradient buffer (host memory, or
 * device memory on nccl); valid until mpg_sync_destroy.  The trainer puts
 * the initial values there (every rank the same) and reads params from it
 * in forward.  Shard mode only.  Returns MPG_OK; MPG_ERR_STATE before commit
 * or in replicate mode; MPG_ERR_RANGE for a bad id; MPG_ERR_INVALID for
 * NULL.  Local; context thread. */
MPG_API mpg_status mpg_sync_param(mpg_sync *sync, int param, void **data);

/* Start gathering the updated params after the optimizer step (`stream`:
 * the caller's on nccl, NULL elsewhere): the first bucket in forward order
 * is all-gathered over the shard group.  Returns MPG_OK; MPG_ERR_STATE
 * before commit, in replicate mode, inside a step, or while a gather is
 * open; MPG_ERR_ABORTED after an earlier failure aborted the context; the
 * groups layer's errors.  Collective over every shard group (its members
 * then wait for every bucket, in the same order); context thread. */
MPG_API mpg_status mpg_sync_gather_begin(mpg_sync *sync, void *stream);

/* At the first use of `param` in forward: wait until its bucket (and every
 * bucket before it in forward order) is gathered, then start the next
 * bucket's gather.  The last bucket ends the gather.  Returns MPG_OK, at
 * once for a replicated param, a bucket gathered already, or params that
 * are current (gathered, or no step finished yet); MPG_ERR_STATE after a
 * finished step with no gather begun; MPG_ERR_RANGE for a bad id; the
 * groups layer's errors (a timeout aborts the context).  Collective over
 * the shard group; context thread. */
MPG_API mpg_status mpg_sync_gather_wait(mpg_sync *sync, int param);

/* Gather every remaining bucket and end the gather (also right after
 * mpg_sync_gather_begin, for a trainer that gathers all before forward).
 * Returns MPG_OK, at once when the params are current; MPG_ERR_STATE after
 * a finished step with no gather begun; the groups layer's errors.
 * Collective over the shard group; context thread. */
MPG_API mpg_status mpg_sync_gather_all(mpg_sync *sync);

/* Free the buffers and the synchroniser (before the context).  NULL is a
 * no-op.  Call mpg_sync_finish first: with a step still open it waits for
 * the buckets in flight (up to the context's timeout) so that nothing
 * writes into freed memory.  Returns MPG_OK, or the backend's error freeing
 * device memory.  Local (not collective); context thread. */
MPG_API mpg_status mpg_sync_destroy(mpg_sync *sync);

/* ------------------------------------------------------------------------ */
/* Checkpoints (sync/ckpt*.c)                                                */
/* ------------------------------------------------------------------------ */
/* Save a run under one mesh and load it under another (docs/checkpoints.md).
 * Each rank registers the tensors it holds, each as a piece of a global
 * tensor: the global shape, the box of it that the local buffer is (whole,
 * an axis split evenly over a dim set such as "tp", or an explicit box),
 * and the range of the box this rank keeps (the owned range of a sharded
 * optimizer's state).  Save stores every global tensor once, as chunks
 * with their offsets: replicas are deduplicated, one writer per chunk,
 * spread over the ranks.  Load reads, on each rank, the byte ranges its
 * registered pieces need from whatever chunks hold them, so any change of
 * mesh that leaves the global tensors the same (dp, tp, cp, pp, ep sizes;
 * replicate, shard, HSDP) reshards on load.
 *
 * A checkpoint is a directory: one data file per writing rank and a
 * metadata file written last, after every rank's data is durable; the
 * directory appears by one atomic rename (an existing checkpoint of the
 * same name is swapped out atomically), so a crash at any moment leaves
 * the previous checkpoint whole and the new one whole or absent.  Every
 * block of every chunk carries a checksum.
 *
 * Typical use (every rank):
 *   mpg_ckpt_create(ctx, &opts, &ck);
 *   mpg_ckpt_add(ck, "h3.fc.w", MPG_F32, &layout, param_view, NULL);
 *   mpg_ckpt_add_state(ck, "h3.fc.w.exp_avg", MPG_F32, &layout, sync, p, m);
 *   mpg_ckpt_add_bytes(ck, "trainer", &trainer_state, sizeof trainer_state);
 *   mpg_ckpt_save(ck, "run/step-1000", 1000, stream); ... mpg_ckpt_wait(ck);
 *   mpg_ckpt_load(ck, "run/step-1000", &step, stream);
 * The registered buffers are the trainer's (not copied at registration):
 * save reads them, load overwrites them.  On nccl they are device memory
 * (mpg_ckpt_add_bytes: host memory), copied through pinned host staging on
 * `stream`; elsewhere host memory. */
typedef struct mpg_ckpt mpg_ckpt;

#define MPG_CKPT_MAX_NDIM 8 /* most axes of a tensor */

/* What a tensor is, for tools (meshpg ckpt export writes the params). */
typedef enum mpg_ckpt_kind {
  MPG_CKPT_PARAM = 0, /* a model parameter */
  MPG_CKPT_STATE = 1, /* optimizer state (mpg_ckpt_add_state) */
  MPG_CKPT_BYTES = 2  /* the trainer's own bytes (mpg_ckpt_add_bytes) */
} mpg_ckpt_kind;

/* How a local buffer sits in its global tensor: a versioned input struct
 * (MPG_TENSOR_LAYOUT_INIT).  The box is, first match wins:
 *  - split_dims set: the global shape with axis split_axis cut in S equal
 *    parts (S: the size of the groups of dim set split_dims, e.g. "tp",
 *    "etp", "ep"; it must divide shape[split_axis]); this rank holds part
 *    p, its position in its group (mpg_mesh_group_of);
 *  - any box_offset or box_shape field non-zero: the box at box_offset of
 *    shape box_shape, whose extent must be > 0 on every axis;
 *  - else (every box field 0) the whole tensor.
 * The local buffer is the box in row-major order.  range_count > 0: the
 * buffer holds only elements [range_offset, range_offset + range_count) of
 * the box, in that order (a sharded optimizer's owned range). */
typedef struct mpg_tensor_layout {
  size_t size;
  uint32_t magic;
  uint32_t version;
  int ndim;                                  /* 1 .. MPG_CKPT_MAX_NDIM */
  size_t shape[MPG_CKPT_MAX_NDIM];           /* the global shape */
  int split_axis;                            /* with split_dims */
  const char *split_dims;                    /* NULL: not split */
  size_t box_offset[MPG_CKPT_MAX_NDIM];      /* explicit box */
  size_t box_shape[MPG_CKPT_MAX_NDIM];
  size_t range_offset, range_count;          /* the held range of the box */
  mpg_ckpt_kind kind;                        /* default MPG_CKPT_PARAM */
} mpg_tensor_layout;
#define MPG_TENSOR_LAYOUT_MAGIC 0x6d70676bu /* "mpgk" */
#define MPG_TENSOR_LAYOUT_INIT                                               \
  { sizeof(mpg_tensor_layout), MPG_TENSOR_LAYOUT_MAGIC, MPG_API_VERSION, 1, {0}, -1, NULL, \
    {0}, {0}, 0, 0, MPG_CKPT_PARAM }

/* Options of mpg_ckpt_create: a versioned input struct (MPG_CKPT_OPTS_INIT). */
typedef struct mpg_ckpt_opts {
  size_t size;
  uint32_t magic;
  uint32_t version;
  int async;          /* 1: mpg_ckpt_save returns once the data is staged
                         in host memory; the files are written by a
                         thread of this rank meanwhile (mpg_ckpt_wait) */
  double timeout_s;   /* how long a save waits for every rank's files to be
                         durable, and a rank for the checkpoint to appear
                         (default 600) */
  size_t block_bytes; /* checksum block: each block of each chunk has its
                         own checksum, and load reads whole blocks
                         (default 1 MiB; a multiple of 4096) */
} mpg_ckpt_opts;
#define MPG_CKPT_OPTS_MAGIC 0x6d706763u /* "mpgc" */
#define MPG_CKPT_OPTS_INIT \
  { sizeof(mpg_ckpt_opts), MPG_CKPT_OPTS_MAGIC, MPG_API_VERSION, 0, 600.0, (size_t)1 << 20 }

/* Create an empty checkpoint handle on a context (opts NULL: defaults);
 * free it with mpg_ckpt_destroy, before the context.  Returns MPG_OK;
 * MPG_ERR_INVALID (NULL ctx/out, opts not from MPG_CKPT_OPTS_INIT,
 * timeout_s not > 0, block_bytes not a positive multiple of 4096);
 * MPG_ERR_NOMEM.  Local; context thread. */
MPG_API mpg_status mpg_ckpt_create(mpg_ctx *ctx, const mpg_ckpt_opts *opts,
                                   mpg_ckpt **out);

/* Register this rank's piece of global tensor `name` (copied; unique per
 * rank) of `dtype`, laid out as *layout, at `data` (the trainer's memory,
 * read at save, written at load).  *id (may be NULL) receives its index.
 * Ranks may register different tensors; those that share a name give the
 * same dtype, kind and global shape (docs/checkpoints.md).  Returns MPG_OK;
 * MPG_ERR_INVALID (NULL, a wrong magic, ndim, a zero extent, a box outside
 * the shape or range outside the box, a size in bytes over 64 bits,
 * split_axis, a duplicate name, a name over 255 bytes, not printable UTF-8
 * or "__metadata__"); MPG_ERR_NOT_FOUND (split_dims names no dim set);
 * MPG_ERR_RANGE (the group size does not divide the axis); MPG_ERR_STATE
 * while a save is in flight; MPG_ERR_NOMEM.  Local; context thread. */
MPG_API mpg_status mpg_ckpt_add(mpg_ckpt *ck, const char *name, mpg_dtype dtype,
                                const mpg_tensor_layout *layout, void *data, int *id);

/* Register an optimizer-state array of a sync's parameter `param`: its
 * global tensor `name` has the parameter's global shape and box (*layout,
 * whose range fields are ignored), and this rank holds the part it owns:
 * in shard mode the range mpg_sync_get_shard gives, at state +
 * info.shard_offset elements (state: this rank's optimizer-state array of
 * mpg_sync_stats.shard_elems elements), or nothing when it owns none; in
 * replicate mode the whole box at state.  The kind is MPG_CKPT_STATE.
 * Returns as mpg_ckpt_add; MPG_ERR_STATE before the sync's commit;
 * MPG_ERR_RANGE for a bad param; MPG_ERR_INVALID when the sync has
 * another context or the box's element count is not the param's count.
 * Local; context thread. */
MPG_API mpg_status mpg_ckpt_add_state(mpg_ckpt *ck, const char *name, mpg_dtype dtype,
                                      const mpg_tensor_layout *layout, mpg_sync *sync,
                                      int param, void *state);

/* Register `len` bytes of the trainer's own (RNG state, data position),
 * host memory on every backend, as a one-axis tensor of kind
 * MPG_CKPT_BYTES.  Every rank that registers a name must hold the same
 * bytes at save (save fails otherwise, naming the two ranks): per-rank
 * bytes take per-rank names.  Returns as mpg_ckpt_add. */
MPG_API mpg_status mpg_ckpt_add_bytes(mpg_ckpt *ck, const char *name, void *data,
                                      size_t len);

/* Save every registered tensor into `dir` (its parent must exist) at
 * `step`: written as `dir`.partial, published by one rename over an old
 * checkpoint (anything else at `dir` is refused).  On nccl the staging
 * copies are queued on `stream`; NULL elsewhere.  opts.async returns once
 * staged (end it with mpg_ckpt_wait).  Returns, the same on every rank,
 * MPG_OK (`dir` holds this save; any failure leaves the old `dir`, but an
 * MPG_ERR_IO that says "published"); MPG_ERR_INVALID (NULL, a link or a
 * foreign entry at `dir` or `dir`.partial, ranks that disagree on a name,
 * replicas or overlapping pieces that differ); MPG_ERR_IO (file, errno);
 * MPG_ERR_TIMEOUT (not durable within opts.timeout_s); MPG_ERR_STATE
 * (nothing registered; another save holds `dir`.lock, named);
 * MPG_ERR_NOMEM.  Collective (world). */
MPG_API mpg_status mpg_ckpt_save(mpg_ckpt *ck, const char *dir, long step, void *stream);

/* Wait for the save in flight (MPG_OK at once when there is none) and
 * return its result, the same on every rank, as mpg_ckpt_save.
 * Collective over the world when a save is in flight; context thread. */
MPG_API mpg_status mpg_ckpt_wait(mpg_ckpt *ck);

/* Load the checkpoint in `dir` into every registered buffer, resharded as
 * their layouts say, and its step into *step (may be NULL).  Each rank
 * reads the checksummed blocks holding its pieces; no buffer changes
 * unless every rank read all of its pieces.  On nccl the copies to device
 * memory go on `stream` and are waited for.  Returns, the same on every
 * rank, MPG_OK; MPG_ERR_NOT_FOUND (not a checkpoint; a tensor or part of
 * one missing: named); MPG_ERR_INVALID (a dtype, kind or shape unlike the
 * checkpoint's; corrupt metadata; a checksum mismatch naming the tensor,
 * file and offset); MPG_ERR_IO (a truncated file; read errors);
 * MPG_ERR_UNSUPPORTED (a newer format version); MPG_ERR_NOMEM.
 * Collective over the world; context thread. */
MPG_API mpg_status mpg_ckpt_load(mpg_ckpt *ck, const char *dir, long *step, void *stream);

/* Wait for a save in flight (its result is lost: call mpg_ckpt_wait first
 * to see it), then free the handle.  NULL is a no-op.  Returns MPG_OK.
 * Collective over the world when a save is in flight; context thread. */
MPG_API mpg_status mpg_ckpt_destroy(mpg_ckpt *ck);

#ifdef __cplusplus
}
#endif
#endif /* MESHPG_H */
