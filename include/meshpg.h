/*
 * meshpg.h - the public C API of meshpg.
 *
 * meshpg turns a device-mesh description such as `dp=4, cp=2, tp=8` into the
 * process groups of a 3D-parallel training job.  This header is the manual:
 * every function says what it does, what it returns and who owns what.
 *
 * Conventions (shared by every function below):
 *  - Every function that can fail returns an mpg_status.  MPG_OK is 0;
 *    anything else is an error, and mpg_last_error() then returns a message
 *    written at the failure site that names the field, the value and, for
 *    TOML input, file:line:col.
 *  - Accessors of one scalar property (mpg_mesh_world_size, mpg_ctx_rank,
 *    mpg_topo_num_gpus, ...) cannot fail: they return the value, and a
 *    documented neutral value (0, -1, NULL or "") for a NULL handle.
 *  - Names read mpg_<noun>_<verb>.  A getter that fills a struct is
 *    mpg_<noun>_get_<what>(handle, [index,] &out) and returns an mpg_status.
 *  - Constructors set *out = NULL on failure.  Every destroy function is
 *    mpg_<noun>_destroy(handle), returns an mpg_status and accepts NULL.
 *  - The library never exits, aborts or prints.  It logs to stderr only when
 *    the environment variable MESHPG_LOG is set to "info" or "debug".
 *  - Ranks, group indices and positions are 0-based ints.
 *  - Dim lists (mpg_ctx_group_dims, mpg_param_opts.reduce_dims,
 *    mpg_sync_opts.default_dims, mpg_placement_opts.inner_dims) follow one
 *    rule: names of dims, flattened sets or "world", separated by commas,
 *    with spaces and tabs around a name ignored ("dp_cp, tp").  An empty
 *    name, or one of MPG_NAME_MAX chars or more, is MPG_ERR_INVALID; an
 *    unknown name is MPG_ERR_NOT_FOUND naming the mesh's names; a dim named
 *    twice counts once.
 *
 * Versioned structs (the ABI rule).  Every struct passed by pointer in
 * either direction (options, specs, reports) begins with
 *     size_t size; uint32_t magic; uint32_t version;
 * which the caller sets with the struct's initializer macro
 * (mpg_init_opts o = MPG_INIT_OPTS_INIT;).  `size` is sizeof the struct in
 * the caller's build, `magic` identifies the struct, `version` is the
 * MPG_API_VERSION the caller was compiled against.
 *  - Input structs: the library reads only the fields that lie wholly
 *    within the caller's `size` and uses its defaults for the rest, so a
 *    program built against an older header (a shorter struct) keeps working.
 *    Bytes past the library's own struct (a caller built against a newer
 *    header) are ignored; with MESHPG_LOG=info a line says so when any of
 *    them is non-zero.
 *  - Output structs: the library writes only the fields that lie wholly
 *    within the caller's `size` and leaves the rest (and the three header
 *    fields) as the caller set them.
 *  - A wrong magic (a struct never set up by its initializer) is the only
 *    rejection: MPG_ERR_INVALID naming the struct and the initializer.
 *  - Fields are only ever appended, and an appended field's zero value
 *    means "the default", so that older libraries can ignore it.
 * The one exception is mpg_p2p_op, an element of a caller's array (its size
 * is the array's stride): it has no header and is frozen forever.
 * Handles (mpg_mesh, mpg_ctx, ...) are opaque; only mpg_* symbols are
 * exported, with the ELF symbol version MESHPG_<major>.<minor>.
 *
 * Misuse (tests/api/test_misuse.c calls every function wrongly).  Detected,
 * with the documented status and a message: NULL handles and pointers, a
 * struct with a wrong magic, bad enum values, negative or out-of-range
 * ranks, positions, indices and counts, byte sizes that overflow size_t,
 * calls out of order on a mpg_sync (MPG_ERR_STATE), a tied group of
 * another context.  Not detected, undefined behaviour: a handle used after
 * its destroy call (C cannot tell freed memory safely), a collective on a
 * group of a destroyed context, and buffers shorter than the count says.
 * Destroying a context before a mpg_sync made on it is refused
 * (MPG_ERR_STATE, see mpg_ctx_destroy).
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
#define MPG_VERSION_MAJOR 0
#define MPG_VERSION_MINOR 2
#define MPG_VERSION_PATCH 0
/* 0xMMmmpp: compare with mpg_version(). */
#define MPG_VERSION_HEX \
  ((MPG_VERSION_MAJOR << 16) | (MPG_VERSION_MINOR << 8) | MPG_VERSION_PATCH)
/* The struct layout version that initializer macros write into `version`;
 * bumped whenever a public struct gains a field. */
#define MPG_API_VERSION 2

/* The library's version as 0xMMmmpp (MPG_VERSION_HEX of the header it was
 * built from), to compare with the header a program was compiled against.
 * Cannot fail. */
MPG_API unsigned mpg_version(void);

/* The library's version as text, "0.2.0".  Static storage.  Cannot fail. */
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

/* Fixed English text for a status ("timed out waiting for peers").
 * Never NULL; unknown codes give "unknown status". */
MPG_API const char *mpg_strerror(mpg_status status);

/* Symbolic name of a status without the prefix ("ERR_TIMEOUT").
 * Never NULL; unknown codes give "UNKNOWN". */
MPG_API const char *mpg_status_name(mpg_status status);

/* The precise message of the last failed call on this thread, for example
 *   "spec.toml:4:30: mesh.dims[1].size: expected a positive integer or -1, found 0".
 * The string belongs to the library and stays valid until the next meshpg
 * call on this thread.  It is "" when no call has failed on this thread. */
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
 * mpg_sync_opts.op, which take MPG_OP_AVG or MPG_OP_SUM).  MPG_OP_AVG
 * divides the sum by the group size (integer division for integer types).
 * MPG_OP_PREMUL_SUM multiplies each input by a scale before summing; it is
 * only reached through mpg_all_reduce_scaled. */
typedef enum mpg_op {
  MPG_OP_SUM = 0,
  MPG_OP_AVG = 1,
  MPG_OP_MAX = 2,
  MPG_OP_MIN = 3,
  MPG_OP_PREMUL_SUM = 4
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

typedef enum mpg_reduce_dtype {
  MPG_REDUCE_NATIVE = 0, /* reduce in the gradient's own dtype */
  MPG_REDUCE_F32 = 1     /* reduce bf16/f16 gradients with f32 accumulation,
                            rounded once, on every backend (nccl: widened
                            into an f32 buffer, reduced by NCCL in f32,
                            twice the bytes on the wire, then narrowed) */
} mpg_reduce_dtype;

/* How mpg_sync keeps gradients and parameters over the data-parallel
 * group (see "Sharded data parallel" at mpg_sync_opts). */
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

/* Everything a spec file says.  A plain value type: it holds no pointers,
 * so it may be copied, and needs no destroy call.  A versioned struct
 * (input and output): always start from MPG_SPEC_INIT, which holds every
 * default.  Each section's keys and defaults are documented in docs/spec.md. */
typedef struct mpg_spec {
  size_t size;       /* sizeof(mpg_spec) of the caller's build */
  uint32_t magic;    /* MPG_SPEC_MAGIC */
  uint32_t version;  /* MPG_API_VERSION */

  /* [mesh] */
  int ndims;
  mpg_dim dims[MPG_MAX_DIMS]; /* outermost first; the last dim is contiguous */
  int nflatten;
  mpg_flatten flatten[MPG_MAX_FLATTEN];

  /* [topology] */
  int nodes;                 /* 0: unknown (one node, or from the launcher) */
  int gpus_per_node;         /* 0: from hwloc on this machine */
  mpg_bind bind;             /* default MPG_BIND_NONE */
  mpg_rank_order rank_order; /* default MPG_RANK_ORDER_BLOCK */
  int strict_placement;      /* 1: a group crossing nodes is an error */

  /* [sync] */
  int fsdp_owns_dp;               /* 1: gradients reduce over cp only */
  mpg_op op;                      /* MPG_OP_AVG (default) or MPG_OP_SUM */
  double bucket_mb;               /* default 25 */
  double first_bucket_mb;         /* default 1 */
  mpg_reduce_dtype reduce_dtype;  /* default MPG_REDUCE_F32 */

  /* [backend] */
  mpg_backend_kind backend;  /* default MPG_BACKEND_THREAD */
  double timeout_s;          /* default 600; > 0 and below 1e9 s */
  int lazy_groups;           /* 1: create groups on first use */

  /* The file this spec was read from (the name given to
   * mpg_spec_load_string, "<string>" without one, "" for the API);
   * prefixes every positioned error message. */
  char source[MPG_PATH_MAX];

  /* [sync], appended: */
  mpg_sync_mode sync_mode;        /* [sync] mode; default MPG_SYNC_REPLICATE */
  char shard_dims[128];           /* [sync] shard_dims; "" = the default group */
  char replicate_dims[128];       /* [sync] replicate_dims; "" = none */
  int pad_for_nccl;               /* [sync] pad_for_nccl; default 0 */

  /* [experts], appended: the expert grid of MoE layers, a second rank grid
   * over the same world (Megatron's expert RankGenerator); see
   * mpg_spec_set_experts and docs/pipeline-and-experts.md. */
  int expert_ep;                  /* [experts] ep: > 0, or -1 (inferred, then
                                     edp = 1); 0 = no expert grid */
  int expert_tp;                  /* [experts] tp: > 0; 0 = the size of the
                                     mesh's "tp" dim (1 without one) */
  char expert_order[64];          /* [experts] order, Megatron tokens
                                     innermost first; "" = from the mesh */
  mpg_srcpos expert_pos;          /* the [experts] table */
  mpg_srcpos expert_ep_pos;       /* [experts] ep */
  mpg_srcpos expert_tp_pos;       /* [experts] tp */
  mpg_srcpos expert_order_pos;    /* [experts] order */

  /* [sync], appended with the expert grid: */
  char expert_shard_dims[128];    /* [sync] expert_shard_dims; "" = the
                                     default ("edp" with an expert grid),
                                     "none" = expert params replicated */
  int optimizer_instances;        /* [sync] optimizer_instances; 0 (the
                                     default) = 1 */
} mpg_spec;

#define MPG_SPEC_MAGIC 0x6d706773u /* "mpgs" */
/* The defaults: an empty mesh, the sections' defaults, no source. */
#define MPG_SPEC_INIT                                                       \
  { sizeof(mpg_spec), MPG_SPEC_MAGIC, MPG_API_VERSION, 0,                   \
    {{"", 0, {0, 0}, {0, 0}}}, 0,                                           \
    {{"", 0, {{0}}, {0, 0}, {{0, 0}}}}, 0, 0, MPG_BIND_NONE,                \
    MPG_RANK_ORDER_BLOCK, 0, 0, MPG_OP_AVG, 25.0, 1.0, MPG_REDUCE_F32,      \
    MPG_BACKEND_THREAD, 600.0, 0, "", MPG_SYNC_REPLICATE, "", "", 0,        \
    0, 0, "", {0, 0}, {0, 0}, {0, 0}, {0, 0}, "", 0 }

/* Reset *spec (set up with MPG_SPEC_INIT) to the defaults and an empty
 * mesh, within the caller's size.  Every spec function below also takes a
 * spec from MPG_SPEC_INIT.
 * Returns MPG_ERR_INVALID if spec is NULL or was not set up with
 * MPG_SPEC_INIT. */
MPG_API mpg_status mpg_spec_init(mpg_spec *spec);

/* Read a TOML spec file into *spec (set up with MPG_SPEC_INIT; it is first
 * reset with mpg_spec_init) and validate it (mpg_spec_validate).  Unknown keys are
 * errors with a "did you mean" suggestion.
 * Returns MPG_OK; MPG_ERR_IO if the file cannot be read; MPG_ERR_PARSE for
 * TOML syntax; MPG_ERR_SPEC for a wrong key, type or value.  The error
 * message names file:line:col, the key path, what was expected and what
 * was found.  On error *spec holds defaults. */
MPG_API mpg_status mpg_spec_load_file(const char *path, mpg_spec *spec);

/* As mpg_spec_load_file, from TOML text.  name (may be NULL) is used as the
 * file name in messages; NULL gives "<string>". */
MPG_API mpg_status mpg_spec_load_string(const char *toml, const char *name,
                                        mpg_spec *spec);

/* Replace the mesh dims from "dp=2,cp=2,tp=2" (outermost first; a size may
 * be -1 or "auto").  Flattened sets are kept.
 * Returns MPG_ERR_SPEC with the offending item on a malformed string. */
MPG_API mpg_status mpg_spec_set_mesh(mpg_spec *spec, const char *dims);

/* Add (or replace) the flattened set `name` from "d1,d2,...".
 * Returns MPG_ERR_SPEC for a malformed list or too many sets.  Whether the
 * dims exist is checked by mpg_spec_validate. */
MPG_API mpg_status mpg_spec_add_flatten(mpg_spec *spec, const char *name,
                                        const char *dims);

/* Reorder the dims by a Megatron order string, which names dims innermost
 * first separated by '-': "tp-cp-dp-pp" gives the mesh (pp, dp, cp, tp).
 * The string must name every dim of the spec exactly once.
 * Returns MPG_ERR_SPEC naming the unknown, missing or repeated dim. */
MPG_API mpg_status mpg_spec_apply_order(mpg_spec *spec, const char *order);

/* Give the spec an expert grid (Megatron's expert RankGenerator): the
 * ranks of MoE layers laid out over expert tensor parallel (etp), expert
 * parallel (ep), expert data parallel (edp) and the mesh's pipeline dim
 * (pp), edp = world / (etp * ep * pp).  Its groups are the dim sets
 * "etp", "ep", "edp", "etp_ep" (Megatron's tp-ep) and "etp_ep_pp"
 * (tp-ep-pp) of every mesh built from the spec; the pipeline groups of
 * both grids must be the same.
 *  tp:    expert tensor parallel size > 0; 0 = the size of the mesh's
 *         "tp" dim (1 without one).
 *  ep:    expert parallel size > 0, or -1 to infer it (edp is then 1);
 *         0 removes the expert grid (tp and order must then be 0 / NULL).
 *  order: a Megatron order string over tp, cp, ep, dp, pp, innermost
 *         first ("tp-cp-ep-dp-pp"; tp means etp, dp means edp, cp is
 *         ignored: it has size 1 in the expert grid); a token may be left
 *         out when its size is 1.  NULL or "": derived from the mesh (its
 *         dims innermost first, tp, dp and pp kept, ep just inside dp).
 * The spec's mesh may then have at most 5 dims, and none of them or of the
 * flattened sets may be named etp, ep, edp, etp_ep or etp_ep_pp.  Sizes
 * are checked by mpg_mesh_create once the world size is known.
 * Returns MPG_OK; MPG_ERR_INVALID for a NULL spec or one not from
 * MPG_SPEC_INIT; MPG_ERR_SPEC naming the bad value (the spec is then left
 * as it was). */
MPG_API mpg_status mpg_spec_set_experts(mpg_spec *spec, int tp, int ep,
                                        const char *order);

/* Check everything that does not need the world size: dim count (1..8),
 * names ([A-Za-z_][A-Za-z0-9_]*, at most 31 chars, not "world", distinct),
 * sizes (> 0 or one -1), flattened sets (known dims, no repeats, mesh order,
 * no clash with a dim name or another set), the expert grid's keys (order
 * tokens, no clash with the expert names, at most 5 mesh dims) and the
 * other sections' values.
 * Returns MPG_OK or MPG_ERR_SPEC. */
MPG_API mpg_status mpg_spec_validate(const mpg_spec *spec);

/* ------------------------------------------------------------------------ */
/* Mesh                                                                      */
/* ------------------------------------------------------------------------ */

/* A mesh: named dims laid out row-major over ranks 0..world_size-1, plus its
 * dim sets.  Memory is O(ndims): no per-rank or per-group tables.  Immutable
 * after creation, so it may be shared between threads. */
typedef struct mpg_mesh mpg_mesh;

/* Build a mesh from a validated spec.  world_size > 0 resolves a -1 dim and
 * must equal the product of the sizes; world_size == 0 means "the product"
 * and is invalid when a dim is -1.  With an expert grid
 * (mpg_spec_set_experts) its sizes are resolved and checked as Megatron
 * does: etp * ep * pp divides the world; every token of size > 1 is named
 * by the order; the pipeline groups of the expert grid equal the mesh's
 * (same pp stride); and unless pp is 1 or the outermost token, edp equals
 * the mesh's data parallel size, world / (tp * cp * pp).
 * Returns MPG_OK; MPG_ERR_SPEC (message names the world size and the
 * product, or the experts key, its value and what to change);
 * MPG_ERR_INVALID for NULL arguments; MPG_ERR_NOMEM. */
MPG_API mpg_status mpg_mesh_create(const mpg_spec *spec, int world_size,
                                   mpg_mesh **out);

/* Free a mesh.  NULL is a no-op.  Always returns MPG_OK. */
MPG_API mpg_status mpg_mesh_destroy(mpg_mesh *mesh);

MPG_API int mpg_mesh_world_size(const mpg_mesh *mesh);
MPG_API int mpg_mesh_ndims(const mpg_mesh *mesh);

/* Name and size of dim `dim` (0 = outermost).  *name belongs to the mesh.
 * Returns MPG_ERR_RANGE for a bad index. */
MPG_API mpg_status mpg_mesh_dim(const mpg_mesh *mesh, int dim, const char **name,
                                int *size);

/* Dim sets: every dim (ids 0..ndims-1, mesh order), then every flattened
 * set (spec order), then with an expert grid its five sets "etp", "ep",
 * "edp", "etp_ep", "etp_ep_pp", then "world" (all dims, always the last).
 * An expert set's groups are the expert grid's (row-major over it, like a
 * mesh's), and its names join dim lists like any other: "etp,ep" is
 * etp_ep; "pp" may join them (its groups are the same in both grids), a
 * mesh dim other than pp may not.  Their count: */
MPG_API int mpg_mesh_num_dimsets(const mpg_mesh *mesh);

/* Find a dim set by dim name, flattened name or "world".
 * Returns MPG_ERR_NOT_FOUND naming the unknown name and listing known ones. */
MPG_API mpg_status mpg_mesh_dimset_find(const mpg_mesh *mesh, const char *name,
                                        int *dimset);

/* Describe dim set `dimset`: its name (belongs to the mesh), the size of
 * each of its groups, and how many groups it has.  Any out pointer may be
 * NULL.  Returns MPG_ERR_RANGE for a bad id. */
MPG_API mpg_status mpg_mesh_dimset_info(const mpg_mesh *mesh, int dimset,
                                        const char **name, int *group_size,
                                        int *num_groups);

/* The dims of a dim set as mesh dim indices, in mesh order; *ndims is set
 * and dims[] needs room for MPG_MAX_DIMS.  An expert set's etp, ep and edp
 * are numbered mpg_mesh_ndims + 0, + 1 and + 2 (after pp, if it has pp). */
MPG_API mpg_status mpg_mesh_dimset_dims(const mpg_mesh *mesh, int dimset,
                                        int dims[MPG_MAX_DIMS], int *ndims);

/* The expert grid's dim count: 4 (etp, ep, edp, pp in the grid's order)
 * for a mesh whose spec has an expert grid, else 0 (also for NULL). */
MPG_API int mpg_mesh_expert_ndims(const mpg_mesh *mesh);

/* Name ("etp", "ep", "edp" or "pp"; belongs to the mesh) and size of dim
 * `dim` of the expert grid, 0 = outermost (the last is contiguous).
 * Returns MPG_ERR_INVALID for a NULL mesh; MPG_ERR_NOT_FOUND when the mesh
 * has no expert grid; MPG_ERR_RANGE for a bad index. */
MPG_API mpg_status mpg_mesh_expert_dim(const mpg_mesh *mesh, int dim,
                                       const char **name, int *size);

/* rank -> coordinate (coord[] has mpg_mesh_ndims entries). */
MPG_API mpg_status mpg_mesh_coord_of(const mpg_mesh *mesh, int rank, int coord[]);

/* coordinate -> rank.  Returns MPG_ERR_RANGE naming the bad coordinate. */
MPG_API mpg_status mpg_mesh_rank_of(const mpg_mesh *mesh, const int coord[],
                                    int *rank);

/* The group of `rank` along dim set `dimset`: the group's index (groups are
 * numbered row-major over the dims outside the set, which is also the order
 * of their first ranks), the rank's position in it (row-major over the
 * set's dims), and the group size.  Out pointers may be NULL.  O(ndims). */
MPG_API mpg_status mpg_mesh_group_of(const mpg_mesh *mesh, int dimset, int rank,
                                     int *group_index, int *position,
                                     int *group_size);

/* The rank at `position` in group `group_index` of dim set `dimset`. */
MPG_API mpg_status mpg_mesh_group_rank(const mpg_mesh *mesh, int dimset,
                                       int group_index, int position, int *rank);

/* All members of group `group_index` of `dimset` in position order into
 * ranks[] (room for group_size ints). */
MPG_API mpg_status mpg_mesh_group_members(const mpg_mesh *mesh, int dimset,
                                          int group_index, int *ranks);

/* ------------------------------------------------------------------------ */
/* Topology (topo/)                                                          */
/* ------------------------------------------------------------------------ */
/*
 * Topology: the GPUs, NUMA nodes, cores and NICs of a machine, read with
 * hwloc 2 from this machine, from an hwloc XML file or from a synthetic
 * description.  I/O objects (PCI devices, OS devices) are kept for all three
 * (synthetic topologies have none, so they never have GPUs).
 *
 * GPUs are found through CUDA OS devices ("cuda0"; ordered by CUDA index, so
 * GPU i is CUDA device i), else NVML OS devices ("nvml0"), else as PCI
 * devices of vendor 0x10de with a display class (0x03xx, e.g. 0x0302 "3D")
 * in PCI bus order.  On the live machine, without CUDA OS devices,
 * CUDA_VISIBLE_DEVICES selects and orders the GPUs as CUDA would: entries
 * are indexes, GPU UUIDs or unique prefixes ("GPU-1a2b", read from the
 * NVIDIAUUID info of hwloc's NVML OS devices) and MIG devices as
 * "MIG-GPU-<gpu uuid>/<gi>/<ci>", which select the GPU the instance lives
 * on; an index outside 0..count-1 ("-1") ends the list, as in CUDA.  A mpg_topo is immutable after loading; its functions may be called
 * from several threads at once.
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
  int numa_node;      /* OS index of the NUMA node it is attached to; -1 when
                         hwloc attaches it above several NUMA nodes */
  const char *cpuset; /* the CPUs near it (the cpuset of its first non-I/O
                         ancestor), as a list of PU OS indexes: "0-7,16-23" */
  int num_cores;      /* cores inside that cpuset */
  int pcie_group;     /* GPUs with equal values sit below the same PCIe
                         switch or root port (numbered from 0) */
  int num_nics;       /* its nearest NICs: those that share its PCIe switch,
                         else its host bridge; none beyond that.  Read them
                         with mpg_topo_get_gpu_nic */
  int nvlink_peers;   /* other GPUs it reaches over NVLink, read from hwloc's
                         "NVLinkBandwidth" distances (directly or through an
                         NVSwitch); 0 when there is no such matrix */
} mpg_gpu_info;
#define MPG_GPU_INFO_MAGIC 0x6d706767u /* "mpgg" */
#define MPG_GPU_INFO_INIT                                                   \
  { sizeof(mpg_gpu_info), MPG_GPU_INFO_MAGIC, MPG_API_VERSION, -1, NULL,    \
    NULL, 0, 0, -1, NULL, 0, -1, 0, 0 }

/* Load this machine's topology (honours hwloc's HWLOC_XMLFILE / HWLOC_*
 * environment like every hwloc program).
 * Returns MPG_OK; MPG_ERR_TOPO if hwloc cannot read the machine, or when
 * CUDA_VISIBLE_DEVICES (see above) has a malformed or empty entry, lists a
 * GPU twice, has a UUID that matches no GPU or several, a UUID while the
 * GPUs are bare PCI devices (they carry no UUID: use indexes), or a
 * "MIG-<uuid>" instance id (hwloc lists no MIG instances, so it cannot be
 * mapped to its GPU): the message names the entry;
 * MPG_ERR_INVALID if out is NULL; MPG_ERR_NOMEM. */
MPG_API mpg_status mpg_topo_load_live(mpg_topo **out);

/* Load an hwloc XML topology file (as written by `lstopo file.xml`).
 * Returns MPG_OK; MPG_ERR_IO if the file cannot be opened or read (missing,
 * no permission, a directory; the message names the path and the system
 * error); MPG_ERR_TOPO if it is empty or hwloc rejects its content (not XML,
 * not an hwloc topology, inconsistent objects); MPG_ERR_INVALID for NULL
 * arguments; MPG_ERR_NOMEM. */
MPG_API mpg_status mpg_topo_load_xml(const char *path, mpg_topo **out);

/* Build a topology from an hwloc synthetic description such as
 * "pack:2 numa:1 core:32 pu:2".  It has CPUs and NUMA nodes, never GPUs.
 * Returns MPG_OK; MPG_ERR_TOPO naming the description if hwloc rejects it;
 * MPG_ERR_INVALID for NULL arguments; MPG_ERR_NOMEM. */
MPG_API mpg_status mpg_topo_load_synthetic(const char *description, mpg_topo **out);

/* Free a topology and every string it handed out.  NULL is a no-op.
 * Always returns MPG_OK. */
MPG_API mpg_status mpg_topo_destroy(mpg_topo *topo);

/* Where the topology came from, for messages: "this machine (HOST)", the XML
 * path, or "synthetic \"DESC\"".  Belongs to the topology. */
MPG_API const char *mpg_topo_source(const mpg_topo *topo);

/* 1 if the topology is this machine's own (loaded live), so that binding
 * can be applied; 0 for XML and synthetic topologies (and NULL). */
MPG_API int mpg_topo_is_this_system(const mpg_topo *topo);

/* Counts; 0 for NULL. */
MPG_API int mpg_topo_num_gpus(const mpg_topo *topo);
MPG_API int mpg_topo_num_numa_nodes(const mpg_topo *topo);
MPG_API int mpg_topo_num_packages(const mpg_topo *topo);
MPG_API int mpg_topo_num_cores(const mpg_topo *topo);
MPG_API int mpg_topo_num_pus(const mpg_topo *topo);

/* 1 when every pair of GPUs is linked by NVLink (an all-to-all GPU fabric
 * such as NVSwitch), 0 otherwise (PCIe only, partial links, fewer than 2
 * GPUs, no NVLinkBandwidth matrix). */
MPG_API int mpg_topo_has_gpu_fabric(const mpg_topo *topo);

/* Describe GPU `gpu` (0..num_gpus-1) into *out (set up with
 * MPG_GPU_INFO_INIT).
 * Returns MPG_OK; MPG_ERR_RANGE naming the index and the GPU count;
 * MPG_ERR_INVALID for NULL arguments or an out struct with a wrong magic. */
MPG_API mpg_status mpg_topo_get_gpu(const mpg_topo *topo, int gpu, mpg_gpu_info *out);

/* The k-th nearest NIC (0..num_nics-1 of mpg_gpu_info) of GPU `gpu` into
 * *out (set up with MPG_NIC_INFO_INIT).
 * Returns MPG_OK; MPG_ERR_RANGE for a bad GPU or NIC index;
 * MPG_ERR_INVALID for NULL arguments or a wrong magic. */
MPG_API mpg_status mpg_topo_get_gpu_nic(const mpg_topo *topo, int gpu, int k,
                                        mpg_nic_info *out);

/* Every NIC of the topology (GPU or not), in PCI order: their count (0 for
 * NULL), and NIC `nic` (0..count-1) into *out (set up with
 * MPG_NIC_INFO_INIT).  mpg_topo_get_nic returns MPG_OK; MPG_ERR_RANGE for
 * a bad index; MPG_ERR_INVALID for NULL arguments or a wrong magic. */
MPG_API int mpg_topo_num_nics(const mpg_topo *topo);
MPG_API mpg_status mpg_topo_get_nic(const mpg_topo *topo, int nic, mpg_nic_info *out);

/* What a binding call chose (and, for mpg_topo_bind*, applied).  A plain
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
  char cpuset[MPG_CPUSET_STR_MAX];     /* the CPUs bound to, as a PU list
                                          ("0-3,16-19"); "" for
                                          MPG_BIND_NONE.  A list too long for
                                          the buffer ends with "..." */
  int num_cores;                       /* whole cores inside cpuset */
  int num_pus;                         /* PUs (hardware threads) in cpuset */
  int applied;                         /* 1: the OS binding was set */
  int thread;                          /* 1: only the calling thread */
} mpg_binding;
#define MPG_BINDING_MAGIC 0x6d706762u /* "mpgb" */
#define MPG_BINDING_INIT                                                    \
  { sizeof(mpg_binding), MPG_BINDING_MAGIC, MPG_API_VERSION, -1, -1, "",    \
    MPG_BIND_NONE, -1, "", 0, 0, 0, 0 }

/* Choose the GPU and the CPUs of local rank `local_rank` of `local_world`
 * ranks on this node, without binding anything (any topology).
 *  - GPU: `gpu` >= 0 takes that GPU; gpu == -1 gives local rank i GPU i, and
 *    then more local ranks than GPUs is an error.  On a node without GPUs a
 *    rank takes no GPU (gpu must be -1) and its NUMA node is
 *    local_rank * num_numa_nodes / local_world.
 *  - MPG_BIND_NONE: no CPUs.  MPG_BIND_NUMA: every CPU of the GPU's NUMA
 *    node (of its locality cpuset when hwloc attaches it above several).
 *  - MPG_BIND_CORE: the ranks that share a NUMA node split its cores into
 *    disjoint contiguous blocks (the first blocks take one extra core when
 *    they do not divide evenly; PUs are split instead when there are fewer
 *    cores than ranks).  With gpu == -1 the sharers are local ranks
 *    0..local_world-1; with an explicit gpu they are all the GPUs of that
 *    NUMA node, so ranks naming distinct GPUs get disjoint cores.
 * Returns MPG_OK; MPG_ERR_RANGE for a local rank outside 0..local_world-1,
 * local_world < 1 or a GPU index outside 0..num_gpus-1; MPG_ERR_TOPO when
 * local_world exceeds the GPU count (the message names both counts) or
 * when a NUMA node has fewer PUs than the ranks that share it;
 * MPG_ERR_INVALID for NULL arguments, an unknown mode or a report with a
 * wrong magic.  *report (set up with MPG_BINDING_INIT) is filled on
 * success (applied = 0). */
MPG_API mpg_status mpg_topo_bind_plan(const mpg_topo *topo, int local_rank,
                                      int local_world, int gpu, mpg_bind mode,
                                      mpg_binding *report);

/* As mpg_topo_bind_plan, then bind the whole calling process to the chosen
 * CPUs with hwloc_set_cpubind (MPG_BIND_NONE binds nothing).
 * Returns the errors of mpg_topo_bind_plan, and MPG_ERR_TOPO when the
 * topology is not this machine's (XML or synthetic: hwloc would silently do
 * nothing) or when the operating system refuses the binding (the message
 * has the system error).  On success report->applied is 1 unless the mode
 * is MPG_BIND_NONE. */
MPG_API mpg_status mpg_topo_bind(const mpg_topo *topo, int local_rank,
                                 int local_world, int gpu, mpg_bind mode,
                                 mpg_binding *report);

/* As mpg_topo_bind, binding only the calling thread (for ranks that are
 * threads of one process).  report->thread is 1. */
MPG_API mpg_status mpg_topo_bind_thread(const mpg_topo *topo, int local_rank,
                                        int local_world, int gpu, mpg_bind mode,
                                        mpg_binding *report);

/* Which ranks share a node.  Each rank calls mpg_topo_host_identity, the
 * world gathers the strings (the groups module does this at start-up), and
 * mpg_topo_node_ids numbers the nodes. */
#define MPG_HOST_ID_MAX 320 /* hostname + ':' + boot id, with the NUL */

/* Write this machine's identity, "HOSTNAME:BOOT_ID" (boot id from
 * /proc/sys/kernel/random/boot_id; just "HOSTNAME" where there is none), so
 * that two containers or hosts with one name still differ.
 * Returns MPG_OK; MPG_ERR_RANGE if cap is too small (MPG_HOST_ID_MAX is
 * always enough); MPG_ERR_IO if the host name cannot be read;
 * MPG_ERR_INVALID for NULL arguments. */
MPG_API mpg_status mpg_topo_host_identity(char *buf, size_t cap);

/* From host_ids[r] (one per rank, world_size of them) compute node_of[r]:
 * nodes are numbered 0,1,... in the order of their lowest rank; and, if
 * local_rank is not NULL, local_rank[r]: r's position among the ranks of
 * its node in rank order.  *num_nodes (may be NULL) gets the node count.
 * O(world_size log world_size).
 * Returns MPG_OK; MPG_ERR_INVALID for NULL arrays or a NULL id;
 * MPG_ERR_RANGE for world_size < 1; MPG_ERR_NOMEM. */
MPG_API mpg_status mpg_topo_node_ids(int world_size, const char *const *host_ids,
                                     int *node_of, int *local_rank, int *num_nodes);

/*
 * Placement: which launcher process sits at which mesh coordinate.
 *
 * The mesh keeps its row-major (torch / Megatron) semantics over mesh
 * ranks; placement only decides that mesh rank m runs as launcher rank
 * L (the RANK the launcher gave the process), on node n, with GPU g.
 * Mesh ranks are laid out over the node slots (node 0's GPUs, then node
 * 1's, ...) row-major in an order that puts the inner dims (by default tp,
 * then cp) innermost, so their groups stay inside a node whenever their
 * size divides the GPUs per node.  Inside a node without an all-to-all GPU
 * fabric, slots follow the GPUs sorted by NUMA node and PCIe switch, so
 * small groups also stay on one NUMA node or switch.  This holds whatever
 * the launcher's numbering: block (node by node) or cyclic (round-robin
 * over nodes, Slurm's cyclic distribution) or measured host identities.
 */
typedef struct mpg_placement mpg_placement;

typedef struct mpg_placement_opts {
  size_t size;       /* sizeof(mpg_placement_opts) of the caller's build */
  uint32_t magic;    /* MPG_PLACEMENT_MAGIC */
  uint32_t version;  /* MPG_API_VERSION */
  int nodes;         /* 0: world_size / gpus_per_node */
  int gpus_per_node; /* ranks per node; 0: world_size / nodes.  Both 0: the
                        topology's GPU count when it divides the world size,
                        else the whole world on one node */
  mpg_rank_order rank_order; /* how the launcher numbered the ranks */
  const int *node_of;        /* optional, world_size entries: launcher rank
                                -> node id (e.g. from mpg_topo_node_ids); replaces
                                nodes, gpus_per_node and rank_order */
  const int *local_rank;     /* optional with node_of: launcher rank -> its
                                local rank (= GPU); NULL: the order of the
                                ranks on their node */
  const mpg_topo *topo;      /* optional: the topology of every node, to
                                order GPUs by NUMA node and PCIe switch */
  const char *inner_dims;    /* dims kept inside a node, innermost first,
                                comma separated; NULL: "tp,cp" (names the
                                mesh lacks are skipped); "": none, plain mesh
                                order */
  int strict;                /* 1: an inner group crossing nodes is an error */
} mpg_placement_opts;

#define MPG_PLACEMENT_MAGIC 0x6d70706cu /* "mppl" */
#define MPG_PLACEMENT_OPTS_INIT                                              \
  { sizeof(mpg_placement_opts), MPG_PLACEMENT_MAGIC, MPG_API_VERSION, 0, 0, \
    MPG_RANK_ORDER_BLOCK, NULL, NULL, NULL, NULL, 0 }

/* Fill *opts (set up with MPG_PLACEMENT_OPTS_INIT) from a spec's
 * [topology] section: nodes, gpus_per_node, rank_order and strict; the
 * other fields get their defaults.
 * Returns MPG_OK; MPG_ERR_INVALID for NULL arguments, or a spec or opts
 * with a wrong magic (not from MPG_SPEC_INIT / MPG_PLACEMENT_OPTS_INIT). */
MPG_API mpg_status mpg_placement_opts_from_spec(const mpg_spec *spec,
                                                mpg_placement_opts *opts);

/* Place the ranks of `mesh`.  opts NULL means MPG_PLACEMENT_OPTS_INIT (one
 * node).  Every inner group that crosses nodes is counted as by
 * mpg_placement_check: a logged warning (MESHPG_LOG=info), or with
 * opts->strict the error MPG_ERR_TOPO.  The placement keeps a pointer to
 * mesh (and none to opts or its arrays): the mesh must outlive it.
 * Returns MPG_OK; MPG_ERR_TOPO when nodes x gpus_per_node differs from the
 * world size (or one of them does not divide it), or in strict mode
 * (the message names the dim set, a crossing group and its nodes);
 * MPG_ERR_RANGE for a negative count, node id or local rank out of range or
 * repeated; MPG_ERR_NOT_FOUND for an inner_dims name the mesh lacks (when
 * inner_dims is given); MPG_ERR_INVALID for NULL mesh/out or opts not set
 * up with MPG_PLACEMENT_OPTS_INIT; MPG_ERR_NOMEM. */
MPG_API mpg_status mpg_placement_create(const mpg_mesh *mesh,
                                        const mpg_placement_opts *opts,
                                        mpg_placement **out);

/* Free a placement.  NULL is a no-op.  Always returns MPG_OK. */
MPG_API mpg_status mpg_placement_destroy(mpg_placement *placement);

/* Node count; 0 for NULL. */
MPG_API int mpg_placement_num_nodes(const mpg_placement *placement);

/* Where mesh rank `mesh_rank` runs: its launcher rank, node and GPU (local
 * rank on the node).  Out pointers may be NULL.
 * Returns MPG_OK; MPG_ERR_RANGE for a rank outside 0..world_size-1;
 * MPG_ERR_INVALID for a NULL placement. */
MPG_API mpg_status mpg_placement_of(const mpg_placement *placement, int mesh_rank,
                                    int *launcher_rank, int *node, int *gpu);

/* The inverse: the mesh rank of launcher rank `launcher_rank`, i.e. which
 * coordinate this process takes.  Returns as mpg_placement_of. */
MPG_API mpg_status mpg_placement_mesh_rank(const mpg_placement *placement,
                                           int launcher_rank, int *mesh_rank);

/* How many distinct nodes group `group_index` of `dimset` spans (1: it
 * stays inside a node).  Returns MPG_OK; MPG_ERR_RANGE for a bad dim set
 * or group; MPG_ERR_INVALID for NULL arguments; MPG_ERR_NOMEM. */
MPG_API mpg_status mpg_placement_group_nodes(const mpg_placement *placement,
                                             int dimset, int group_index,
                                             int *num_nodes);

/* 1 if every dim of `dimset` is an inner dim (one the placement keeps
 * inside a node), else 0.  "world" is never inner. */
MPG_API int mpg_placement_dimset_is_inner(const mpg_placement *placement,
                                          int dimset);

/* Count the misfits: groups of inner dim sets that span more than one node.
 * Each dim set with misfits is logged as a warning (MESHPG_LOG=info) with
 * its first crossing group.  *misfits (may be NULL) gets the count.
 * Returns MPG_OK; with strict != 0 and misfits, MPG_ERR_TOPO whose message
 * names the dim set, the group size, the GPUs per node, a crossing group
 * and its nodes; MPG_ERR_INVALID for NULL; MPG_ERR_NOMEM. */
MPG_API mpg_status mpg_placement_check(const mpg_placement *placement, int strict,
                                       int *misfits);

/* ------------------------------------------------------------------------ */
/* Groups and collectives (groups/)                                          */
/* ------------------------------------------------------------------------ */
/* Size in bytes of one element; 0 for an unknown dtype. */
MPG_API size_t mpg_dtype_size(mpg_dtype dtype);
/* "f32", "bf16", ...; "?" for an unknown dtype. */
MPG_API const char *mpg_dtype_name(mpg_dtype dtype);

/* In-process simulated ranks (the thread backend).  A thread world is the
 * shared state of N ranks that run as threads of one process. */
typedef struct mpg_thread_world mpg_thread_world;

typedef struct mpg_init_opts mpg_init_opts;

/* The body of one simulated rank: it receives init options already filled
 * for its rank (backend, rank, world size, thread world) and calls the same
 * public API a real process would.  Its return value is the rank's status. */
typedef mpg_status (*mpg_rank_main)(const mpg_init_opts *opts, void *arg);

/* Run `nranks` ranks as threads (1..4096), each calling main(opts, arg), and
 * wait for all.  timeout_s (> 0) is the collective timeout each rank's
 * options carry.  statuses (may be NULL) receives each rank's return value.
 * Returns MPG_OK when every rank returned MPG_OK, else the first failing
 * rank's status (its message is kept in mpg_last_error()); MPG_ERR_NOMEM or
 * MPG_ERR_BACKEND if the threads cannot be started. */
MPG_API mpg_status mpg_thread_run(int nranks, double timeout_s, mpg_rank_main main,
                                  void *arg, mpg_status *statuses);

/* How a process joins the world.  Start from MPG_INIT_OPTS_INIT; a field
 * left at -1 / NULL is read from the launch environment (see
 * mpg_launch_from_env).  Fields are only appended. */
struct mpg_init_opts {
  size_t size;
  uint32_t magic;
  uint32_t version;
  mpg_backend_kind backend;
  int rank;             /* -1: from the environment */
  int world_size;       /* -1: from the environment */
  int local_rank;       /* -1: from the environment (0 if absent) */
  int local_world_size; /* -1: from the environment (1 if absent) */
  double timeout_s;     /* <= 0: 600 s; else below 1e9 s (NaN and inf are
                           MPG_ERR_INVALID) */
  int lazy_groups;      /* 1: create a group's communicator on first use.
                           That first use is collective over the world: a
                           world all-reduce agrees which dim sets any rank
                           needs now, and every rank creates them all, in
                           dim-set order (NCCL matches splits by order) */
  int device;           /* NCCL: CUDA device (this process's ordinal);
                           -1: chosen from the local rank and the devices
                           CUDA shows (docs/nccl.md, "Choice of CUDA device") */
  const void *nccl_id;  /* NCCL: a 128-byte ncclUniqueId from the caller */
  void *mpi_comm;       /* MPI: pointer to the MPI_Comm to use as world;
                           NULL: MPI_COMM_WORLD.  Rank and world size then
                           come from this communicator (not from
                           OMPI_COMM_WORLD_*); MPI must be initialised;
                           MPI_COMM_NULL is MPG_ERR_INVALID */
  mpg_thread_world *thread_world; /* thread: set by mpg_thread_run */
  int placement;        /* 1: gather host identities over the world, place
                           the ranks so tp then cp groups stay inside a node
                           (mpg_placement_create), and renumber: the
                           context's rank becomes this process's mesh rank */
  int strict_placement; /* 1: with placement, a tp/cp group that crosses
                           nodes fails mpg_ctx_create with MPG_ERR_TOPO
                           (default: a logged warning) */
  mpg_bind bind;        /* bind the process (the calling thread on the
                           thread backend) near its GPU with hwloc */
  const char *host_id;  /* this rank's host identity; NULL: the real one
                           (mpg_topo_host_identity).  For simulations and tests
                           of multi-node placement. */
};
#define MPG_INIT_OPTS_MAGIC 0x6d706769u /* "mpgi" */
#define MPG_INIT_OPTS_INIT                                                  \
  { sizeof(mpg_init_opts), MPG_INIT_OPTS_MAGIC, MPG_API_VERSION,            \
    MPG_BACKEND_THREAD, -1, -1, -1, -1, 0.0, 0, -1, NULL, NULL, NULL, 0, 0, \
    MPG_BIND_NONE, NULL }

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

/* Read the launch environment: torchrun (RANK, WORLD_SIZE, LOCAL_RANK,
 * LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), Open MPI
 * (OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE), PMI (PMI_RANK,
 * PMI_SIZE) and Slurm (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID,
 * SLURM_NTASKS_PER_NODE; without it, in an srun task (SLURM_LOCALID set)
 * and with no other local world size, this node's entry of
 * SLURM_STEP_TASKS_PER_NODE, else SLURM_TASKS_PER_NODE, such as "2(x3),1",
 * at position SLURM_NODEID).  Several launchers may agree.
 * *out must be set up with MPG_LAUNCH_INIT.
 * Returns MPG_OK (fields nobody set stay -1 / ""); MPG_ERR_ENV naming the
 * variable when one is not a number, out of range (RANK >= WORLD_SIZE), or
 * contradicts another (RANK=1 but OMPI_COMM_WORLD_RANK=2); MPG_ERR_INVALID
 * for NULL or a wrong magic. */
MPG_API mpg_status mpg_launch_from_env(mpg_launch *out);

/* A rank's view of the job: the world and every group of its mesh. */
typedef struct mpg_ctx mpg_ctx;
/* A communicator of one dim set, as seen by this rank.  Belongs to its
 * context: never freed by the caller. */
typedef struct mpg_group mpg_group;
/* An asynchronous collective in flight. */
typedef struct mpg_work mpg_work;

/* Copy what a spec says about joining the world into *opts (set up with
 * MPG_INIT_OPTS_INIT): [backend] name, timeout_s and lazy_groups, and
 * [topology] bind and strict; the other fields are left alone.  Pass the
 * result to mpg_ctx_create so that these keys are honoured.
 * Returns MPG_OK; MPG_ERR_INVALID for NULL arguments, or a spec or opts with
 * a wrong magic (not from MPG_SPEC_INIT / MPG_INIT_OPTS_INIT). */
MPG_API mpg_status mpg_init_opts_from_spec(const mpg_spec *spec,
                                           mpg_init_opts *opts);

/* Join the world and create this rank's groups: one split of the world per
 * dim set of `mesh` (colour = group index, key = position), each rank
 * joining only its own groups.  Collective over the world.  The mesh must
 * outlive the context.  opts may be NULL (all from the environment, thread
 * backend).  The world size must equal mpg_mesh_world_size(mesh).
 * Every rank must build the same job: right after joining the world the
 * ranks compare the mesh (dims, order, sizes, flattened sets, expert
 * grid), the backend, the library version, opts.placement,
 * opts.strict_placement, opts.lazy_groups and the MESHPG_* variables that
 * must match (docs/launchers.md, "One job").  The MESHPG_* variables are
 * read here, once (docs/launchers.md, "The library's variables").
 * Returns MPG_OK; MPG_ERR_STATE on every rank when the ranks differ (the
 * message names the first differing item, both values and the world ranks
 * on each side), also when MPI was already finalized or opts.mpi_comm is
 * set before MPI is initialised; MPG_ERR_ENV (rank or world missing or
 * contradictory; a MESHPG_* variable outside its documented values on any
 * rank, on every rank); MPG_ERR_INVALID (among others opts.timeout_s NaN,
 * inf or 1e9 s or more); MPG_ERR_UNSUPPORTED (backend not built);
 * MPG_ERR_BACKEND; MPG_ERR_TIMEOUT (peers never arrived). */
MPG_API mpg_status mpg_ctx_create(const mpg_mesh *mesh, const mpg_init_opts *opts,
                                  mpg_ctx **out);

/* Free every communicator and the context.  Every work handle must have
 * been released with mpg_work_wait first.  NULL is a no-op.  After a
 * timeout or abort it frees what can be freed without blocking on peers;
 * on nccl it first waits for the abort's thread (mpg_ctx_abort) to
 * finish, at most the context's timeout (mpg_ctx_set_timeout) from the
 * abort's start, and past that returns MPG_ERR_TIMEOUT with the context
 * freed all the same: what is left of the communicators is freed by that
 * thread when NCCL's abort returns.  It is
 * not collective (no issue-order check here: call mpg_ctx_check_order
 * before, if wanted).
 * Returns MPG_OK or the first backend error met while freeing;
 * MPG_ERR_TIMEOUT as above (nccl); MPG_ERR_STATE, freeing nothing, while
 * a mpg_sync made on it still lives (destroy the sync first, then the
 * context). */
MPG_API mpg_status mpg_ctx_destroy(mpg_ctx *ctx);

/* MPG_OK while the context is healthy; after a timeout or abort, the
 * reason (MPG_ERR_TIMEOUT, MPG_ERR_ABORTED).  Safe from any thread. */
MPG_API mpg_status mpg_ctx_status(const mpg_ctx *ctx);

/* Change the context's timeout (opts.timeout_s at create) for every
 * operation, split and setup check that starts from now on, on every
 * group of the context, groups created later included.  Typical use: a
 * generous timeout while the job starts (process launch, first NCCL
 * connections, group creation and mpg_sync_commit can be slow on a loaded
 * machine) and a short one for the training steps, so that a dead peer is
 * found quickly.  Local (no communication); each rank sets its own, and
 * ranks should agree.  Operations already in flight keep the deadline they
 * started with.  Not to be called while another thread uses the context.
 * Returns MPG_ERR_INVALID for a NULL ctx or a timeout that is not > 0 (or
 * is 1e9 s or more). */
MPG_API mpg_status mpg_ctx_set_timeout(mpg_ctx *ctx, double timeout_s);

/* Abort every communicator of the context (safe from any thread, such as a
 * watchdog): the context and each of its communicators are marked aborted
 * before it returns, so this rank's waiting calls fail with MPG_ERR_ABORTED
 * within one poll (about 1 ms), later calls at once, and waiting peers fail
 * with MPG_ERR_ABORTED or MPG_ERR_TIMEOUT.  Never blocks: on nccl the NCCL
 * part (ncclCommAbort of every communicator, in one NCCL group) runs on a
 * thread of its own, since NCCL frees the communicators' device memory
 * there and cudaFree waits for every kernel of the device, which may never
 * end (another library's stuck kernel).  The context must still be
 * destroyed (mpg_ctx_destroy waits for that thread, bounded). */
MPG_API mpg_status mpg_ctx_abort(mpg_ctx *ctx);

/* This rank in the mesh (0..world-1).  Equal to the launcher's rank unless
 * opts.placement renumbered it. */
MPG_API int mpg_ctx_rank(const mpg_ctx *ctx);
/* The rank the launcher gave this process (RANK, OMPI_COMM_WORLD_RANK...). */
MPG_API int mpg_ctx_launcher_rank(const mpg_ctx *ctx);
/* Number of nodes found by placement (1 without opts.placement). */
MPG_API int mpg_ctx_num_nodes(const mpg_ctx *ctx);
/* What opts.bind did into *out (set up with MPG_BINDING_INIT; mode
 * MPG_BIND_NONE and applied 0 when nothing was asked).  Returns
 * MPG_ERR_INVALID for NULL arguments or a wrong magic. */
MPG_API mpg_status mpg_ctx_get_binding(const mpg_ctx *ctx, mpg_binding *out);
MPG_API int mpg_ctx_world_size(const mpg_ctx *ctx);
MPG_API int mpg_ctx_local_rank(const mpg_ctx *ctx);
MPG_API mpg_backend_kind mpg_ctx_backend(const mpg_ctx *ctx);
MPG_API const mpg_mesh *mpg_ctx_mesh(const mpg_ctx *ctx);

/* Number of collective operations this rank has entered to create groups
 * (splits and their set-up), for benchmarks.  The issue-order checker's
 * own collectives (mpg_ctx_check_order) are not counted. */
MPG_API long mpg_ctx_setup_collectives(const mpg_ctx *ctx);

/* Check that the ranks issued their collectives and group creations in
 * one order since the last check (NCCL needs one order that every device
 * follows, or it may deadlock on the GPU; the thread and mpi backends often
 * complete another order anyway).  Collective over the world: every rank
 * must call it at the same point.
 *
 * The checker is on when the environment has MESHPG_CHECK_ORDER=1, off
 * with MESHPG_CHECK_ORDER=0; unset, it is on in debug builds (meson
 * buildtype debug) and off otherwise, the default debugoptimized build
 * included.  The value must be the same on every rank (another value fails
 * mpg_ctx_create with MPG_ERR_ENV).  While it is on, each context records
 * in issue order every collective (all_reduce, all_reduce_scaled,
 * broadcast, all_gather, reduce_scatter, barrier, all_to_all,
 * all_to_all_v; groups of size 1 too) as (group name, kind, count, dtype,
 * op; all_to_all_v without a count, since its counts differ per member), the name being the dim set's
 * ("tp"), not the group index, and every group creation (a split: at
 * mpg_ctx_create, at first use with opts.lazy_groups, mpg_ctx_group_dims)
 * as (name, "split").  Not recorded: groups made by mpg_ctx_group_select
 * (their non-members do not issue on them) and mpg_ctx_group_partial
 * (their members are not those of their dims' groups), point-to-point traffic
 * (mpg_send, mpg_recv, mpg_p2p_batch: ranks legitimately differ there), and
 * the library's own checks.  The record costs a few hash mixes per call:
 * a 64-bit hash and a count of the calls since the last check, a hash per
 * dim set, and a log of the last 1024 calls.
 *
 * The rule: the members of every group that carried a collective since the
 * last check (for the world: also a split) issued the same calls in the
 * same order, on every dim set: the same group names, kinds, dtypes and
 * ops, and the same counts on the groups they all share (a group whose
 * dims include the group's).  Counts may differ between groups that share
 * no member (uneven batches), and ranks that share no group used since the
 * last check may run different programs (pipeline stages), as long as no
 * collective over a group spanning them falls between two checks.
 *
 * The check is one all-reduce (max) of four 64-bit words over the world
 * (host buffers; staged through device memory on nccl); when the full
 * records differ, two all-gathers compare every used group, and on a
 * difference two broadcasts of logs find the first differing call.  Every
 * rank then fails alike with MPG_ERR_STATE and the same message, e.g.
 *   mpg_ctx_check_order: issue order differs: call #12 since the last
 *   check: rank 2 issued all_reduce(f32, sum, count 4096) on "tp", rank 3
 *   issued all_reduce(f32, sum, count 4096) on "dp" (ranks 2 and 3 are
 *   members of group "tp" index 1; 2 groups disagree) ...
 * (calls are numbered from 1 after the previous check; "issued nothing (N
 * calls since the last check)" for a rank with fewer calls).  Either way
 * the record starts afresh.  While the checker is on, the library also
 * checks at mpg_sync_commit (after the layout check), at the end of each
 * step (mpg_sync_finish of the last micro-batch, mpg_sync_all); never at a
 * destroy (not collective).  None of these collectives is counted by
 * mpg_ctx_setup_collectives.
 *
 * Returns MPG_OK (at once, without communicating, when the checker is
 * off); MPG_ERR_STATE when the order differs, or (nccl) when called from
 * another thread than the context's issuing thread (see the collectives;
 * nothing compared); MPG_ERR_INVALID for NULL;
 * MPG_ERR_ABORTED when the context was aborted (nothing is compared);
 * MPG_ERR_TIMEOUT / MPG_ERR_ABORTED when a peer never joins the check (the
 * context is then aborted); MPG_ERR_NOMEM. */
MPG_API mpg_status mpg_ctx_check_order(mpg_ctx *ctx);

/* This rank's group of a dim set, by name ("dp", "tp", "dp_cp", "world").
 * With lazy groups the first call creates it and is collective over the
 * world: every rank must ask for the same groups in the same order.
 * Returns MPG_ERR_NOT_FOUND naming the unknown name. */
MPG_API mpg_status mpg_ctx_group(mpg_ctx *ctx, const char *name, mpg_group **out);

/* The same by dim-set id (see mpg_mesh_dimset_find). */
MPG_API mpg_status mpg_ctx_group_at(mpg_ctx *ctx, int dimset, mpg_group **out);

/* The group of this rank over an arbitrary union of dims and flattened
 * sets, e.g. "dp_cp,tp" (= dims dp, cp, tp), ordered row-major over those
 * dims like a flattened set.  Created on first use by one split of the
 * world, so the first call is collective over the world: every rank must
 * make the same calls in the same order.  Cached: later calls are local.
 * Returns MPG_ERR_NOT_FOUND naming an unknown name. */
MPG_API mpg_status mpg_ctx_group_dims(mpg_ctx *ctx, const char *dims, mpg_group **out);

/* A sub-group along one dim (or set) `name`, holding only the members at
 * the given positions, e.g. the first and last pipeline stage for tied
 * embeddings: name "pp", positions {0, pp-1}.  Collective over the world
 * (every rank calls it, members or not); *out is NULL on ranks that are not
 * at one of the positions.  Members are ordered by position.  Cached by
 * (name, positions).  Returns MPG_ERR_RANGE for a bad position. */
MPG_API mpg_status mpg_ctx_group_select(mpg_ctx *ctx, const char *name,
                                        const int *positions, int npositions,
                                        mpg_group **out);

/* Which of Megatron's partial data-parallel groups mpg_ctx_group_partial
 * makes. */
typedef enum mpg_partial {
  MPG_PARTIAL_INTRA = 0, /* the member's contiguous part of the group */
  MPG_PARTIAL_INTER = 1  /* the members at its place in every part */
} mpg_partial;

/* Megatron's partial data-parallel groups (num_distributed_optimizer_
 * instances, its create_hierarchical_groups): the group of `dims` on this
 * rank, of size S, cut into `instances` contiguous parts of c = S /
 * instances members.  MPG_PARTIAL_INTRA: the part holding this rank,
 * positions [i c, (i + 1) c) of the group (Megatron's intra-partial data
 * parallel group, e.g. of "edp" or "dp_cp"); MPG_PARTIAL_INTER: the
 * members at this rank's place j in every part, positions j, j + c, ...,
 * j + (instances - 1) c (the inter-partial group).  Members are ordered by
 * position, so position p of the intra group is position i c + p of the
 * group.  Every rank is a member of one intra and one inter group.
 * Collective over the world (one split; every rank calls it with the same
 * arguments).  Cached by (dims, instances, which); named e.g.
 * "edp/intra2".  Not followed by the issue-order checker.  instances = 1
 * gives the whole group (intra) or a group of one (inter).  Returns
 * MPG_ERR_RANGE when instances is < 1 or does not divide S,
 * MPG_ERR_INVALID for NULL arguments or an unknown `which`, and
 * mpg_ctx_group_dims's errors for `dims`.  Sharded data parallel uses them
 * for mpg_sync_opts.optimizer_instances. */
MPG_API mpg_status mpg_ctx_group_partial(mpg_ctx *ctx, const char *dims, int instances,
                                         mpg_partial which, mpg_group **out);

/* Memory and streams where the backend's collectives want them: host
 * memory for thread/mpi, device memory for nccl (cudaMalloc, or ncclMemAlloc
 * when registered = 1).  The memory is zeroed.  Free with mpg_ctx_mem_free.
 * Returns MPG_ERR_NOMEM.
 *
 * On the mpi backend this memory is also faster: an in-place all_reduce
 * (send == recv) on it runs without staging copies, MPI reducing the
 * buffer itself (other memory is copied in and out, see docs/groups.md,
 * "The mpi backend in more detail").  The price: after a failed or timed-out operation such a
 * buffer holds unspecified values (staged buffers keep their input), and
 * mpg_ctx_mem_free of a buffer that an unfinished or abandoned operation
 * still uses returns MPG_OK but defers the release until MPI is done with
 * it.  mpg_ctx_mem_free of a pointer that did not come from
 * mpg_ctx_mem_alloc (or was freed already) returns MPG_ERR_INVALID on
 * mpi. */
MPG_API mpg_status mpg_ctx_mem_alloc(mpg_ctx *ctx, size_t bytes, int registered,
                                     void **ptr);
MPG_API mpg_status mpg_ctx_mem_free(mpg_ctx *ctx, void *ptr);
/* Zero `bytes` at ptr, on `stream` for nccl (synchronously elsewhere). */
MPG_API mpg_status mpg_ctx_mem_zero(mpg_ctx *ctx, void *ptr, size_t bytes,
                                    void *stream);
/* A stream of the context's device (nccl: a new cudaStream_t; other
 * backends: NULL, and ordering calls are no-ops). */
MPG_API mpg_status mpg_ctx_stream_create(mpg_ctx *ctx, void **stream);
MPG_API mpg_status mpg_ctx_stream_destroy(mpg_ctx *ctx, void *stream);
/* Make work queued later on `waiter` start after the work queued so far on
 * `waitee` (an event recorded on waitee, waited on by waiter). */
MPG_API mpg_status mpg_ctx_stream_order(mpg_ctx *ctx, void *waiter, void *waitee);

MPG_API const char *mpg_group_name(const mpg_group *group);
MPG_API int mpg_group_rank(const mpg_group *group);  /* position in the group */
MPG_API int mpg_group_size(const mpg_group *group);
MPG_API int mpg_group_index(const mpg_group *group); /* which group of its dim set */
/* World rank of the member at `position`. */
MPG_API mpg_status mpg_group_member(const mpg_group *group, int position, int *rank);

/* Collectives.  Every one is blocking when work is NULL; otherwise it
 * returns at once with *work set (NULL for work that finished already) and
 * the caller must pass it to mpg_work_wait.  Buffers must stay valid and
 * unchanged until the work completes.  Buffers are host memory for the
 * thread and mpi backends and device memory for nccl, where `stream` is the
 * caller's cudaStream_t (ignored elsewhere).  In place follows NCCL's
 * convention on every backend: all_reduce with send == recv;
 * all_gather with send == recv + position * count (this member's slot of
 * recv); reduce_scatter with recv == send + position * count (this
 * member's block of send).  Any other overlap of send and recv is refused
 * with MPG_ERR_INVALID before anything is posted.  Every member of the
 * group must make the same calls, with the same counts and dtypes, in the
 * same order.  A group of size 1 makes no communicator: collectives are
 * local copies.
 * A group is used by one thread at a time: the caller serialises the calls
 * that issue on one group (these, mpg_send / mpg_recv, mpg_p2p_batch,
 * mpg_all_to_all(_v)).  A call made while another call on the same group
 * has not returned (in another thread) fails with MPG_ERR_STATE, posts
 * nothing and aborts nothing.  A call holds the group only while it runs,
 * so one thread may keep several async operations of a group in flight.
 * Only overlapping calls are caught: calls of two threads that alternate
 * may meet the other ranks' calls in another order.  Different groups of
 * one context must not be used from two threads at once either
 * (docs/groups.md, "Threads").  On nccl this is enforced per context: the
 * first thread that issues a collective, point-to-point or all-to-all call
 * on a context (or mpg_ctx_check_order) is its issuing thread for the
 * context's life, and the same calls from any other thread fail with
 * MPG_ERR_STATE, naming both threads, posting nothing (NCCL orders a
 * device's kernels by host launch order and fails two threads launching
 * at once).  mpg_work_test, mpg_work_wait, mpg_ctx_abort, memory and
 * stream calls may come from any thread.
 * Each returns MPG_OK; MPG_ERR_INVALID (NULL buffer, bad dtype, op, root,
 * peer); MPG_ERR_RANGE when count x element size (x the group size for
 * all_gather's recv and reduce_scatter's send) overflows size_t, checked
 * before any buffer is touched; MPG_ERR_STATE when another thread's call
 * on the group has not returned, or (nccl) when the calling thread is not
 * the context's issuing thread (nothing posted); MPG_ERR_TIMEOUT when a peer did not arrive within the context's
 * timeout (the context is then aborted); MPG_ERR_ABORTED after an abort;
 * MPG_ERR_BACKEND when the backend failed the operation (the context is
 * then aborted too: peers may be inside the same collective, and NCCL
 * requires a communicator that reported an asynchronous error to be
 * aborted). */

/* recv[i] = op over members of send[i], count elements.  f16/bf16 are
 * accumulated in f32 where the backend has no native support. */
MPG_API mpg_status mpg_all_reduce(mpg_group *group, const void *send, void *recv,
                                  size_t count, mpg_dtype dtype, mpg_op op,
                                  void *stream, mpg_work **work);

/* recv[i] = sum over members of (scale * send[i]): a sum with pre-multiply,
 * e.g. scale = 1/(dp*cp*microbatches).  Floating dtypes only. */
MPG_API mpg_status mpg_all_reduce_scaled(mpg_group *group, const void *send,
                                         void *recv, size_t count, mpg_dtype dtype,
                                         double scale, void *stream, mpg_work **work);

/* buf on every member = buf of the member at position root. */
MPG_API mpg_status mpg_broadcast(mpg_group *group, void *buf, size_t count,
                                 mpg_dtype dtype, int root, void *stream,
                                 mpg_work **work);

/* recv (size * count elements) = concatenation of every member's send
 * (count elements), in position order. */
MPG_API mpg_status mpg_all_gather(mpg_group *group, const void *send, void *recv,
                                  size_t count, mpg_dtype dtype, void *stream,
                                  mpg_work **work);

/* send has size * count elements; member p receives in recv (count
 * elements) the reduction of block p of every member's send. */
MPG_API mpg_status mpg_reduce_scatter(mpg_group *group, const void *send, void *recv,
                                      size_t count, mpg_dtype dtype, mpg_op op,
                                      void *stream, mpg_work **work);

/* Member p receives in recv the sum over members of (scale * block p of
 * send): a reduce-scatter with pre-multiply.  Floating dtypes only. */
MPG_API mpg_status mpg_reduce_scatter_scaled(mpg_group *group, const void *send,
                                             void *recv, size_t count, mpg_dtype dtype,
                                             double scale, void *stream, mpg_work **work);

/* Returns when every member has entered it. */
MPG_API mpg_status mpg_barrier(mpg_group *group, mpg_work **work);

/* All-to-all with equal blocks: send and recv hold size * count elements
 * each; the member at position i sends elements [j * count, (j + 1) *
 * count) of its send to the member at position j, which stores them at
 * [i * count, (i + 1) * count) of its recv (block i of its own send goes
 * to block i of its own recv, as a local copy).  count must be the same on
 * every member.  Same as mpg_all_to_all_v with every count = count and
 * displacements j * count; see there for everything else. */
MPG_API mpg_status mpg_all_to_all(mpg_group *group, const void *send, void *recv,
                                  size_t count, mpg_dtype dtype, void *stream,
                                  mpg_work **work);

/* All-to-all with a count and a displacement per peer, in elements, as
 * MPI_Alltoallv (MoE token dispatch and combine): the member at position i
 * sends send_counts[j] elements, starting at element send_displs[j] of
 * send, to the member at position j, which stores them at element
 * recv_displs[i] of its recv, where recv_counts[i] elements are expected.
 * The four arrays have one entry per member (mpg_group_size), are read
 * during the call only and may be reused when it returns; the blocks may
 * be laid out in any order, with gaps (recv elements outside every block
 * are left untouched), but the blocks of recv must not overlap each other.
 *
 * Counts must match pairwise: recv_counts[i] on member j equals
 * send_counts[j] on member i (dtype too).  Counts of 0 are fine in either
 * direction (a NULL buffer is allowed when all its counts are 0).  A
 * member checks its own pair (send_counts[position] ==
 * recv_counts[position]) before anything is posted; a mismatch between two
 * members is reported where the backend sees it: the thread backend fails
 * the receiving member with MPG_ERR_INVALID naming both sides' counts (no
 * element is written past or short of its block; the sending member
 * completes), on mpi the members exchange their counts before the data
 * and both members of a mismatched pair fail with MPG_ERR_INVALID naming
 * both sides' counts after the operation (the others complete, every
 * agreeing block is received, MPI never sees a message longer than its
 * receive), and on nccl, when the issue-order checker is on
 * (MESHPG_CHECK_ORDER=1), the members exchange their counts before the
 * data (two more NCCL operations per call) and every member fails with
 * MPG_ERR_INVALID naming the first mismatched pair and both counts,
 * before anything is sent or copied; with the checker off a mismatch on
 * nccl is undefined (it may hang until the timeout, or leave bytes on the
 * pair's connection for a later receive).
 *
 * Not in place: send and recv must not overlap (the span of the send
 * blocks against the span of the receive blocks), MPG_ERR_INVALID
 * otherwise, before anything is posted.  Like the other collectives:
 * blocking when work is NULL, otherwise *work (NULL when nothing is left
 * to wait for); host buffers on thread and mpi, device buffers and
 * `stream` on nccl; every member of the group must call it, in the same
 * order as its other collectives (the issue-order checker records it as a
 * collective of the group: kind and dtype, and the count of
 * mpg_all_to_all; mpg_ctx_check_order).  A group of size 1 copies its one
 * block.  On nccl it is one ncclGroupStart .. ncclGroupEnd of ncclSend /
 * ncclRecv on `stream` (pairs with 0 elements both ways exchange
 * nothing), on thread a receive from and a send to every peer
 * (mpg_p2p_batch's rules), on mpi a blocking exchange of the counts (two
 * integers with every peer, point to point; also for an async call), then
 * one MPI_Ialltoallv on staging memory (none for a side in
 * mpg_ctx_mem_alloc memory), where a block of more than
 * MESHPG_MPI_MAX_COUNT / size elements (default INT_MAX / size) travels as
 * its own messages within the same operation.  Sends and receives of
 * mpg_send / mpg_recv / mpg_p2p_batch on the same group must not be left
 * unmatched across it.
 *
 * Returns MPG_OK; MPG_ERR_INVALID for a NULL group, an unknown dtype, a
 * NULL count or displacement array, a NULL send (recv) with a send (recv)
 * count > 0, this member's own counts that differ, overlapping send and
 * recv, or counts that differ between two members (thread; mpi; nccl with
 * MESHPG_CHECK_ORDER=1); MPG_ERR_STATE from a thread that may not issue
 * (see the collectives above);
 * MPG_ERR_RANGE when a block's end (displacement + count, or size * count
 * for mpg_all_to_all) in bytes overflows size_t, checked before any buffer
 * is touched; MPG_ERR_TIMEOUT when a peer did not arrive within the
 * context's timeout (the message names the member whose block never came;
 * the context is then aborted); MPG_ERR_ABORTED after an abort;
 * MPG_ERR_NOMEM; MPG_ERR_BACKEND (the context is then aborted). */
MPG_API mpg_status mpg_all_to_all_v(mpg_group *group, const void *send,
                                    const size_t *send_counts, const size_t *send_displs,
                                    void *recv, const size_t *recv_counts,
                                    const size_t *recv_displs, mpg_dtype dtype, void *stream,
                                    mpg_work **work);

/* Point to point with the member at position `peer` of the group (not
 * this rank's own position: MPG_ERR_INVALID).  Messages from one peer are
 * received in the order they were sent.  Buffering is bounded: on the
 * thread backend a send copies its message into the receiver's inbox,
 * which holds at most 1024 messages and 256 MiB not yet received (an empty
 * inbox takes one message of any size; MESHPG_THREAD_INBOX_MSGS and
 * MESHPG_THREAD_INBOX_BYTES change the limits).  A send to a full inbox,
 * async or not, blocks until the receiver takes a message or posts the
 * matching receive, and fails with MPG_ERR_TIMEOUT (the context is then
 * aborted) when that does not happen within the context's timeout.  On mpi
 * and nccl a send may wait for its receive as in MPI / NCCL. */
MPG_API mpg_status mpg_send(mpg_group *group, const void *buf, size_t count,
                            mpg_dtype dtype, int peer, void *stream, mpg_work **work);
MPG_API mpg_status mpg_recv(mpg_group *group, void *buf, size_t count,
                            mpg_dtype dtype, int peer, void *stream, mpg_work **work);

/* The direction of one operation of mpg_p2p_batch. */
typedef enum mpg_p2p_kind {
  MPG_P2P_SEND = 0, /* send buf to peer */
  MPG_P2P_RECV = 1  /* receive into buf from peer */
} mpg_p2p_kind;

/* One send or receive of mpg_p2p_batch, an element of the caller's array.
 * FROZEN: this struct never changes (no field is added, removed or
 * reordered, ever), because its size is the stride of the caller's array
 * and it carries no size/magic/version header like the option structs.  A
 * future need gets a new type and a new function.  Set every field;
 * `{MPG_P2P_SEND, peer, buf, count, dtype}` in this order.  A send only
 * reads buf (a const buffer may be cast to void *). */
typedef struct mpg_p2p_op {
  mpg_p2p_kind kind; /* MPG_P2P_SEND or MPG_P2P_RECV */
  int peer;          /* position of the peer in the group (not this rank's) */
  void *buf;         /* count elements; may be NULL when count is 0 */
  size_t count;      /* elements, not bytes */
  mpg_dtype dtype;
} mpg_p2p_op;

/* Issue n sends and receives on the group as one batch, like torch's
 * batch_isend_irecv or NCCL's ncclGroupStart / ncclSend / ncclRecv /
 * ncclGroupEnd: no operation of the batch waits for another, so a
 * two-way exchange between pipeline stages (every rank sends to the next
 * and the previous stage and receives from both, in one batch) cannot
 * deadlock, however large the messages.  Each operation is matched by the
 * peer's operation of the other direction, with the same count and dtype
 * (posted by mpg_p2p_batch or by mpg_send / mpg_recv; the issue-order
 * checker does not record point to point, see mpg_ctx_check_order).
 * Several operations
 * to the same peer are allowed: the sends to one peer are matched in their
 * order in ops, and so are the receives from one peer, as in NCCL and MPI;
 * a batch may mix dtypes.  On nccl the batch is one ncclGroupStart ..
 * ncclGroupEnd on `stream`; on thread and mpi every receive is posted
 * before any send, so a thread-backend send never waits for inbox room
 * while its own batch's receives are unposted.
 *
 * ops[0..n) are all checked before anything is posted: a bad operation
 * posts none.  n == 0 moves nothing (MPG_OK, *work = NULL).  A group of size
 * 1 has no peers, so every operation there is MPG_ERR_INVALID.  With work
 * NULL the call returns when every operation has completed; otherwise it
 * returns at once with one handle for the whole batch in *work, which
 * mpg_work_test reports done when all operations are and mpg_work_wait
 * waits for and releases (the buffers must stay valid and unchanged
 * until then).  The ops array itself may be reused as soon as the call
 * returns.
 * Returns MPG_OK; MPG_ERR_INVALID for a NULL group, n < 0, NULL ops with
 * n > 0, or an operation (named "ops[i]" with the field and its value)
 * with a bad kind, a peer outside 0..size-1 or equal to this rank's
 * position, an unknown dtype, or a NULL buf with count > 0; MPG_ERR_RANGE
 * when count x element size overflows size_t; MPG_ERR_STATE, nothing
 * posted, while another thread's call on the group has not returned, or
 * (nccl) from a thread that may not issue (see the collectives);
 * MPG_ERR_TIMEOUT when an
 * operation did not complete within the context's timeout (the context is
 * then aborted); MPG_ERR_ABORTED after an abort; MPG_ERR_NOMEM;
 * MPG_ERR_BACKEND.  When an operation fails to post after others were
 * posted, those are waited for (within the timeout) and released before
 * the failure is returned: nothing stays in flight. */
MPG_API mpg_status mpg_p2p_batch(mpg_group *group, const mpg_p2p_op *ops, int n,
                                 void *stream, mpg_work **work);

/* Wait for `work` (up to the context's timeout) and release it, whatever
 * the outcome.  NULL is MPG_OK.  May be called from another thread than
 * the one issuing on the group, also while it issues, on nccl too (so may
 * mpg_work_test); one work handle is used by one thread at a time.
 * Returns the collective's status:
 * MPG_ERR_TIMEOUT (the context is then aborted), MPG_ERR_ABORTED, ... */
MPG_API mpg_status mpg_work_wait(mpg_work *work);

/* Non-blocking check: *done = 1 when the work has finished (successfully or
 * not); it must still be released with mpg_work_wait.  Returns the error if
 * the work failed.  NULL work (finished already) gives *done = 1 and
 * MPG_OK; a NULL done is MPG_ERR_INVALID. */
MPG_API mpg_status mpg_work_test(mpg_work *work, int *done);

/* ------------------------------------------------------------------------ */
/* Gradient synchronisation (sync/)                                          */
/* ------------------------------------------------------------------------ */
/* Gradient synchronisation.  A trainer registers its parameters, gets a
 * view into one contiguous gradient buffer per (dtype, reduce group, tied
 * group), writes gradients straight into the views during backward and
 * marks each ready; buckets (slices of the buffers, no copies) are
 * all-reduced asynchronously as soon as all their gradients are ready.
 * Only the public groups API is used, so every backend behaves alike.
 *
 * Typical step:
 *   mpg_sync_begin(s, step, is_last_microbatch, stream);
 *   ... backward writes grads, calling mpg_sync_mark_ready(s, p) per param
 *   mpg_sync_finish(s);            // every bucket reduced (last microbatch)
 *
 * Every rank calls mpg_sync_create and mpg_sync_commit: both may create
 * groups, which is collective over the world.  Ranks that share a reduce
 * group must register the same layout (counts, dtypes, reduce dims, tied or
 * not, in the same order).  A mpg_sync is used by one thread at a time; its
 * context must outlive it. */
typedef struct mpg_sync mpg_sync;

typedef struct mpg_sync_opts {
  size_t size;
  uint32_t magic;
  uint32_t version;
  int fsdp_owns_dp;       /* 1: default reduce group is "cp", else "dp_cp" */
  const char *default_dims; /* NULL: as above; else e.g. "dp" (names as in
                               mpg_ctx_group_dims).  Copied at create. */
  mpg_op op;              /* MPG_OP_AVG (default) or MPG_OP_SUM */
  double grad_scale;      /* extra factor on every reduced gradient, e.g.
                             1/microbatches (default 1: plain avg op) */
  double bucket_mb;       /* bucket size in MiB (default 25) */
  double first_bucket_mb; /* the first bucket launched (default 1) */
  mpg_reduce_dtype reduce_dtype; /* f32 (default): bf16/f16 reduce with f32
                                    accumulation on every backend (nccl: an
                                    f32 collective, 2x the bytes on the wire;
                                    see mpg_reduce_dtype) */
  int register_buffers;   /* nccl: ncclMemAlloc + ncclCommRegister */
  /* Appended: sharded data parallel. */
  mpg_sync_mode mode;     /* MPG_SYNC_REPLICATE (default) or MPG_SYNC_SHARD */
  const char *shard_dims; /* shard: the dims each bucket is reduce-scattered
                             over; NULL: the default reduce group's (dp_cp).
                             Copied at create. */
  const char *replicate_dims; /* shard: dims the shard is then all-reduced
                             over (HSDP, Megatron's partial distributed
                             optimizer), e.g. "dp_replicate"; NULL: none.
                             Copied at create. */
  int pad_for_nccl;       /* shard: pad each bucket to lcm(shard group
                             size, 128, 65536) elements instead of
                             lcm(size, 128) (Megatron's option for NCCL
                             ring bandwidth) */
  /* Appended: expert parallelism. */
  const char *expert_shard_dims; /* shard: params whose reduce_dims name
                             exactly these dims (their group) are sharded
                             over it, Megatron's distributed optimizer for
                             expert params; NULL: "edp" when the mesh has an
                             expert grid (mpg_spec_set_experts), else none;
                             "": none (expert params stay replicated).
                             Copied at create. */
  int optimizer_instances; /* shard: Megatron's
                             num_distributed_optimizer_instances (0, the
                             default, means 1).  N > 1 cuts each sharded domain's group
                             (the data-parallel group, and the expert one)
                             into N contiguous parts (mpg_ctx_group_partial):
                             buckets are reduce-scattered over the intra
                             part and the slice all-reduced over the inter
                             group, HSDP without naming dims.  Not with
                             replicate_dims. */
} mpg_sync_opts;
#define MPG_SYNC_OPTS_MAGIC 0x6d706779u /* "mpgy" */
#define MPG_SYNC_OPTS_INIT                                                  \
  { sizeof(mpg_sync_opts), MPG_SYNC_OPTS_MAGIC, MPG_API_VERSION, 0, NULL,   \
    MPG_OP_AVG, 1.0, 25.0, 1.0, MPG_REDUCE_F32, 0, MPG_SYNC_REPLICATE, NULL, \
    NULL, 0, NULL, 0 }

/* Copy the [sync] section of a spec (fsdp_owns_dp, op, bucket_mb,
 * first_bucket_mb, reduce_dtype, mode, shard_dims, replicate_dims,
 * pad_for_nccl, expert_shard_dims ("none" becomes ""),
 * optimizer_instances; the dims strings point into the spec, which must outlive
 * opts until mpg_sync_create has copied them) into *opts, which must have been set from
 * MPG_SYNC_OPTS_INIT; its other fields are left alone.  Returns
 * MPG_ERR_INVALID for NULL arguments or structs not set up properly. */
MPG_API mpg_status mpg_sync_opts_from_spec(const mpg_spec *spec, mpg_sync_opts *opts);

/* Per-parameter overrides. */
typedef struct mpg_param_opts {
  size_t size;
  uint32_t magic;
  uint32_t version;
  const char *reduce_dims; /* NULL: the sync's default; else names for
                              mpg_ctx_group_dims, e.g. "dp_cp,tp" for a
                              sequence-parallel norm, "edp" for experts */
  mpg_group *tied_group;   /* NULL, or a group (e.g. first + last pp stage
                              from mpg_ctx_group_select) over which the
                              reduced gradient is then summed */
} mpg_param_opts;
#define MPG_PARAM_OPTS_MAGIC 0x6d706770u /* "mpgp" */
#define MPG_PARAM_OPTS_INIT \
  { sizeof(mpg_param_opts), MPG_PARAM_OPTS_MAGIC, MPG_API_VERSION, NULL, NULL }

/* Create a gradient synchroniser on a context.  opts may be NULL.
 * The default reduce group is opts->default_dims if set; else with
 * fsdp_owns_dp "cp" (a one-rank group, nothing reduced, when the mesh has
 * no cp); else "dp_cp", or without that set the union of whichever of dp
 * and cp the mesh has.  Creating it may be collective (see
 * mpg_ctx_group_dims).  Returns MPG_ERR_INVALID (NULL ctx/out, opts not
 * from MPG_SYNC_OPTS_INIT, unknown op or reduce_dtype, bucket sizes not
 * > 0, grad_scale not finite), MPG_ERR_NOT_FOUND (an unknown default_dims
 * name, or a mesh with no dp_cp, dp or cp: the message lists its dims),
 * MPG_ERR_NOMEM, and the groups layer's errors creating the group. */
MPG_API mpg_status mpg_sync_create(mpg_ctx *ctx, const mpg_sync_opts *opts,
                                   mpg_sync **out);

/* Register a parameter (before mpg_sync_commit): its name (copied), element
 * count, dtype and optional overrides.  *param receives its id (0, 1, ...
 * in registration order; -1 on failure).  Returns MPG_ERR_STATE after
 * commit, MPG_ERR_INVALID (count 0, bad dtype, duplicate name, an integer
 * dtype with grad_scale != 1, malformed reduce_dims, opts with a wrong
 * magic, a tied_group of another context), MPG_ERR_NOT_FOUND (reduce_dims names an unknown dim or set),
 * MPG_ERR_RANGE (too large).  A bf16/f16 parameter with reduce_dtype
 * MPG_REDUCE_F32 is accepted on every backend, nccl included. */
MPG_API mpg_status mpg_sync_add_param(mpg_sync *sync, const char *name, size_t count,
                                      mpg_dtype dtype, const mpg_param_opts *opts,
                                      int *param);

/* Lay out the gradient buffers (reverse registration order, one buffer per
 * (dtype, reduce group, tied group), each view on a 64-byte boundary) and
 * the buckets (slices of one buffer, each up to bucket_mb, the buffer's
 * first up to first_bucket_mb; a larger parameter has its own).  Collective
 * over the world: every rank calls it.  The ranks first agree on the union
 * of the reduce_dims that any rank registered (one all-reduce over the
 * world, of a size that does not depend on the world), then every rank
 * creates those groups in the same order (sorted by their dims), whether
 * or not it has a parameter in them.  So pipeline stages may register
 * different parameters with different reduce_dims and tied groups: only
 * the ranks of one reduce group (or one tied group) must agree on its
 * layout (below).  Gradients start at zero.
 *
 * Commit also checks that the ranks agree (thread and mpi backends; not on
 * nccl, whose collectives need device memory): over each reduce group (the
 * default first, then the others sorted by their dims) and then each tied
 * group (by name), every member hashes the ordered list of its params in
 * that group: name, count, dtype and tied group for a reduce group; count,
 * dtype and reduce group for a tied group (whose stages may name their
 * copies differently).  One all-gather of the hashes per group; on a
 * mismatch a binary search over prefix hashes (one all-gather per round,
 * every member deciding from the same gathered values) finds the first
 * param that differs, and one more all-gather brings its description.
 * Every member of the group then fails with MPG_ERR_STATE, the message
 * naming the group (name, index), the param's position in the group, and
 * the param as this rank and as the first disagreeing rank registered it,
 * e.g. ... param #3 (registration order): on this rank (world rank 0,
 * position 0) "w3" (300 x f32), on world rank 7 (position 7) "w3" (301 x
 * f32).  Last, one all-gather over the world of a "mismatch" flag: a rank
 * whose own groups agree fails too (MPG_ERR_STATE naming the first world
 * rank that found a mismatch), since its later collectives would wait for
 * the failed ranks.  Without this check such a job would fail (or crash,
 * inside MPI) only at mpg_sync_finish.  A rank that never calls commit
 * makes the others fail here with MPG_ERR_TIMEOUT.
 *
 * With the issue-order checker on, commit then checks the issue order
 * (mpg_ctx_check_order).
 *
 * Returns MPG_ERR_STATE if already committed, when the issue order differs,
 * or when the ranks of a group
 * registered different params (see above; mpg_sync_grads_valid then
 * returns 0 and the sync stays uncommitted), MPG_ERR_NOMEM,
 * MPG_ERR_TIMEOUT / MPG_ERR_ABORTED from the check's collectives, and the
 * groups layer's errors (naming group and param). */
MPG_API mpg_status mpg_sync_commit(mpg_sync *sync);

/* The gradient view of a parameter (count elements of its dtype), valid
 * until mpg_sync_destroy.  Host memory, or device memory on nccl.  The
 * trainer writes (or accumulates) its gradient here.  Returns MPG_ERR_STATE
 * before commit, MPG_ERR_RANGE for a bad id. */
MPG_API mpg_status mpg_sync_grad(mpg_sync *sync, int param, void **grad);

/* Start a step (micro-batch).  When is_last_microbatch is 0 nothing is
 * launched by mark_ready (gradient accumulation).  On nccl, `stream` is the
 * caller's stream that produces the gradients (NULL elsewhere).  Returns
 * MPG_ERR_STATE before commit or while a step is open (finish it first);
 * MPG_ERR_ABORTED once a step failed with a timeout or an abort: the context
 * is aborted, and the message names that step and its error. */
MPG_API mpg_status mpg_sync_begin(mpg_sync *sync, long step, int is_last_microbatch,
                                  void *stream);

/* The gradient of `param` is complete for this micro-batch.  On the last
 * micro-batch, a bucket whose parameters are all ready is launched at once
 * (asynchronously), in bucket order: a bucket that fills early waits for
 * the ones before it, so every rank issues the same collectives in the
 * same order.  The view must not change after this until finish.  Returns
 * MPG_ERR_STATE if no step is open or the param was already marked in this
 * step, MPG_ERR_RANGE for a bad id, or the step's error once it failed. */
MPG_API mpg_status mpg_sync_mark_ready(mpg_sync *sync, int param);

/* Launch what is left (params never marked as they are) and wait for every
 * bucket, then sum the tied buffers over their tied groups.  On success
 * every gradient is reduced over exactly its groups.  On failure (timeout,
 * abort) the gradients are marked invalid (mpg_sync_grads_valid returns 0)
 * and the step's first error is returned: never silently half-reduced.  On
 * nccl the caller's stream is ordered after the reduction.  On the last
 * micro-batch, with the issue-order checker on, it ends by checking the
 * issue order (mpg_ctx_check_order: one small all-gather over the world
 * per step), and a difference fails the step with MPG_ERR_STATE.  Returns
 * MPG_ERR_STATE if no step is open. */
MPG_API mpg_status mpg_sync_finish(mpg_sync *sync);

/* begin(last microbatch) + mark every param ready + finish. */
MPG_API mpg_status mpg_sync_all(mpg_sync *sync, long step, void *stream);

/* Zero every gradient (e.g. after the optimizer step).  On nccl the
 * memsets run on the sync's stream, ordered after everything queued so far
 * on the caller's stream (the one given to the last mpg_sync_begin), so an
 * optimizer still reading the gradients there finishes first; the next
 * begin orders the caller's stream after the memsets.  An optimizer on
 * another stream must be ordered before this call by the caller
 * (mpg_ctx_stream_order).  Returns MPG_ERR_STATE before commit or while
 * buckets of a step are in flight. */
MPG_API mpg_status mpg_sync_zero_grads(mpg_sync *sync);

/* 1 when the last finished step reduced every gradient (and before any
 * step), 0 after a failed step (until the next successful one). */
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
  /* Appended: shard mode (0 in replicate mode). */
  size_t shard_elems;    /* the size of this rank's optimizer-state
                            arrays: its slice of every sharded bucket
                            (padding positions included, which no param's
                            range covers) plus every replicated param */
  size_t pad_elems;      /* padding elements of the sharded buffers (param
                            starts on 64 elements, bucket ends) */
  int shard_size;        /* members of the shard group */
  /* Appended: the shared-memory path (docs/sync.md, "Shared memory"). */
  int shm_buffers;       /* buffers whose buckets are reduced in node-local
                            shared memory (the one-pass path, or its
                            hierarchical form across nodes); 0 when
                            MESHPG_SHM=0, on nccl, or when no group of the
                            sync qualifies (docs/sync.md) */
  size_t shm_bytes;      /* the bytes this rank maps for them: every local
                            member's buffer plus the control areas */
} mpg_sync_stats;
#define MPG_SYNC_STATS_MAGIC 0x6d706774u /* "mpgt" */
#define MPG_SYNC_STATS_INIT \
  { sizeof(mpg_sync_stats), MPG_SYNC_STATS_MAGIC, MPG_API_VERSION, 0, 0, 0, 0, 0, 0, 0, 0, \
    0, 0 }
/* Fill *stats (set up with MPG_SYNC_STATS_INIT).  Returns MPG_ERR_INVALID
 * for NULL arguments or a wrong magic. */
MPG_API mpg_status mpg_sync_get_stats(const mpg_sync *sync, mpg_sync_stats *stats);

/* The reduce group of a parameter (belongs to the context).  Returns
 * MPG_ERR_STATE before commit. */
MPG_API mpg_status mpg_sync_param_group(const mpg_sync *sync, int param,
                                        mpg_group **group);

/* ------------------------------------------------------------------------ */
/* Sharded data parallel (opts.mode = MPG_SYNC_SHARD)                        */
/* ------------------------------------------------------------------------ */
/* A distributed optimizer (ZeRO-1/2, Megatron's distributed optimizer) and
 * HSDP.  Layout as in replicate mode, except that in the sharded buffers
 * (the default dtype buffers with no tied group) every param starts on a
 * 64-element boundary and every bucket's end is padded to a multiple of
 * lcm(S, 128) elements (lcm(S, 128, 65536) with pad_for_nccl), S the size
 * of the shard group; padding is zero and never reaches the optimizer.
 * Each bucket is cut into S equal slices; the member at position r of the
 * shard group owns slice r of every bucket (slices ignore param bounds).
 *
 * Step: when a bucket is ready it is reduce-scattered in place over the
 * shard group (scaled as in replicate mode: averaged, times grad_scale),
 * then, with replicate_dims, the owned slice is all-reduced over the
 * replicate group (sum: the scale already covers both).  Same bytes per
 * rank as one all-reduce.  After finish only the owned slices of the
 * sharded gradient buffers are meaningful.  Params whose reduce_dims name
 * other dims than the data-parallel group (shard + replicate dims), params
 * with a tied group and integer params keep replicate behaviour (fully
 * reduced gradients, optimizer on the whole param).  A step may begin
 * while a gather is open (forward waits for its buckets as it goes).
 *
 * Optimizer: for each param, mpg_sync_shard gives the range it owns; an
 * elementwise optimizer updates param[param_offset .. +count) from
 * grad[param_offset ..], with its state at [shard_offset .. +count) of
 * arrays of mpg_sync_stats.shard_elems elements.  Then mpg_sync_gather_begin
 * all-gathers the updated params bucket by bucket over the shard group (in
 * place, in forward order); mpg_sync_gather_wait(param) at a param's first
 * use in forward waits for its bucket (and those before it) and starts the
 * next one; mpg_sync_gather_all waits for everything.  Both do nothing
 * when no gather is open and the params are current (gathered already, or
 * no step finished yet), and fail with MPG_ERR_STATE when a step finished
 * and no gather was begun since (the other ranks' slices would be stale). */

/* The part of a param this rank owns.  A versioned output struct. */
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

/* This rank's range of `param` into *info (MPG_SHARD_INFO_INIT).  Valid
 * after commit in shard mode.  Returns MPG_ERR_STATE before commit or in
 * replicate mode, MPG_ERR_RANGE for a bad id, MPG_ERR_INVALID for NULL or
 * a wrong magic. */
MPG_API mpg_status mpg_sync_shard(const mpg_sync *sync, int param, mpg_shard_info *info);

/* The parameter view of `param` (count elements of its dtype) in the
 * parameter buffer, which mirrors the gradient buffer (host memory, or
 * device memory on nccl), valid until mpg_sync_destroy.  The trainer puts
 * the initial values there (every rank the same) and reads params from it
 * in forward.  Shard mode only: MPG_ERR_STATE before commit or in
 * replicate mode, MPG_ERR_RANGE for a bad id. */
MPG_API mpg_status mpg_sync_param(mpg_sync *sync, int param, void **data);

/* Start gathering the updated params (after the optimizer step, on the
 * caller's `stream` on nccl, NULL elsewhere): the first bucket in forward
 * order is all-gathered over the shard group.  Collective over every shard
 * group.  Returns MPG_ERR_STATE before commit, in replicate mode, inside a
 * step, or while a gather is open. */
MPG_API mpg_status mpg_sync_gather_begin(mpg_sync *sync, void *stream);

/* At the first use of `param` in forward: wait until its bucket (and every
 * bucket before it in forward order) is gathered, then start the next
 * bucket's gather.  A replicated param returns at once.  The last bucket
 * ends the gather.  Returns MPG_OK at once when the bucket was gathered
 * already or the params are current; MPG_ERR_STATE after a finished step
 * with no gather begun; the groups layer's errors (a timeout aborts the
 * context). */
MPG_API mpg_status mpg_sync_gather_wait(mpg_sync *sync, int param);

/* Gather every remaining bucket and end the gather (also right after
 * mpg_sync_gather_begin, for a trainer that gathers all before forward).
 * Returns MPG_OK at once when the params are current; MPG_ERR_STATE after
 * a finished step with no gather begun. */
MPG_API mpg_status mpg_sync_gather_all(mpg_sync *sync);

/* Free the buffers and the synchroniser (before the context).  Call
 * mpg_sync_finish first: with a step still open it waits for the buckets in
 * flight (up to the context's timeout) so that nothing writes into freed
 * memory.  Not collective.  NULL is a no-op.  Returns MPG_OK, or the
 * backend's error freeing device memory. */
MPG_API mpg_status mpg_sync_destroy(mpg_sync *sync);

#ifdef __cplusplus
}
#endif
#endif /* MESHPG_H */
