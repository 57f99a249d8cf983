/*
 * meshpg.h - the public C API of meshpg.
 *
 * meshpg turns a device-mesh description such as `dp=4, cp=2, tp=8` into the
 * process groups of a 3D-parallel training job.  This header is the manual:
 * every function says what it does, what it returns and who owns what.
 *
 * Conventions (shared by every function below):
 *  - Every function returns an mpg_status.  MPG_OK is 0; anything else is an
 *    error, and mpg_last_error() then returns a message written at the failure
 *    site that names the field, the value and, for TOML input, file:line:col.
 *  - Constructors set *out = NULL on failure.  Destroy functions accept NULL.
 *  - The library never exits, aborts or prints.  It logs to stderr only when
 *    the environment variable MESHPG_LOG is set to "info" or "debug".
 *  - Ranks, group indices and positions are 0-based ints.
 */
#ifndef MESHPG_H
#define MESHPG_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MPG_VERSION_MAJOR 0
#define MPG_VERSION_MINOR 1
#define MPG_VERSION_PATCH 0
/* Version of the option/spec structs; bumped when fields are appended. */
#define MPG_API_VERSION 1

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
const char *mpg_strerror(mpg_status status);

/* Symbolic name of a status without the prefix ("ERR_TIMEOUT").
 * Never NULL; unknown codes give "UNKNOWN". */
const char *mpg_status_name(mpg_status status);

/* The precise message of the last failed call on this thread, for example
 *   "spec.toml:4:30: mesh.dims[1].size: expected a positive integer or -1, found 0".
 * The string belongs to the library and stays valid until the next meshpg
 * call on this thread.  It is "" when no call has failed on this thread. */
const char *mpg_last_error(void);

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

typedef enum mpg_sync_op {
  MPG_SYNC_AVG = 0, /* gradients are averaged over their reduce group */
  MPG_SYNC_SUM = 1  /* gradients are summed */
} mpg_sync_op;

typedef enum mpg_reduce_dtype {
  MPG_REDUCE_NATIVE = 0, /* reduce in the gradient's own dtype */
  MPG_REDUCE_F32 = 1     /* reduce bf16/f16 gradients with f32 accumulation */
} mpg_reduce_dtype;

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
 * so it may be copied, and needs no destroy call.  Always start from
 * mpg_spec_init(); fields are only ever appended (ABI: size/magic/version).
 * Each section's keys and defaults are documented in README.md. */
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
  mpg_sync_op op;                 /* default MPG_SYNC_AVG */
  double bucket_mb;               /* default 25 */
  double first_bucket_mb;         /* default 1 */
  mpg_reduce_dtype reduce_dtype;  /* default MPG_REDUCE_F32 */

  /* [backend] */
  mpg_backend_kind backend;  /* default MPG_BACKEND_THREAD */
  double timeout_s;          /* default 600 */
  int lazy_groups;           /* 1: create groups on first use */

  /* The file this spec was read from ("" for strings and the API);
   * prefixes every positioned error message. */
  char source[MPG_PATH_MAX];
} mpg_spec;

#define MPG_SPEC_MAGIC 0x6d706773u /* "mpgs" */

/* Fill *spec with defaults and an empty mesh.
 * Returns MPG_ERR_INVALID if spec is NULL. */
mpg_status mpg_spec_init(mpg_spec *spec);

/* Read a TOML spec file into *spec (which is first reset with
 * mpg_spec_init) and validate it (mpg_spec_validate).  Unknown keys are
 * errors with a "did you mean" suggestion.
 * Returns MPG_OK; MPG_ERR_IO if the file cannot be read; MPG_ERR_PARSE for
 * TOML syntax; MPG_ERR_SPEC for a wrong key, type or value.  The error
 * message names file:line:col, the key path, what was expected and what
 * was found.  On error *spec holds defaults. */
mpg_status mpg_spec_load_file(const char *path, mpg_spec *spec);

/* As mpg_spec_load_file, from TOML text.  name (may be NULL) is used as the
 * file name in messages; NULL gives "<string>". */
mpg_status mpg_spec_load_string(const char *toml, const char *name,
                                mpg_spec *spec);

/* Replace the mesh dims from "dp=2,cp=2,tp=2" (outermost first; a size may
 * be -1 or "auto").  Flattened sets are kept.
 * Returns MPG_ERR_SPEC with the offending item on a malformed string. */
mpg_status mpg_spec_set_mesh(mpg_spec *spec, const char *dims);

/* Add (or replace) the flattened set `name` from "d1,d2,...".
 * Returns MPG_ERR_SPEC for a malformed list or too many sets.  Whether the
 * dims exist is checked by mpg_spec_validate. */
mpg_status mpg_spec_add_flatten(mpg_spec *spec, const char *name,
                                const char *dims);

/* Reorder the dims by a Megatron order string, which names dims innermost
 * first separated by '-': "tp-cp-dp-pp" gives the mesh (pp, dp, cp, tp).
 * The string must name every dim of the spec exactly once.
 * Returns MPG_ERR_SPEC naming the unknown, missing or repeated dim. */
mpg_status mpg_spec_apply_order(mpg_spec *spec, const char *order);

/* Check everything that does not need the world size: dim count (1..8),
 * names ([A-Za-z_][A-Za-z0-9_]*, at most 31 chars, not "world", distinct),
 * sizes (> 0 or one -1), flattened sets (known dims, no repeats, mesh order,
 * no clash with a dim name or another set), and the other sections' values.
 * Returns MPG_OK or MPG_ERR_SPEC. */
mpg_status mpg_spec_validate(const mpg_spec *spec);

/* ------------------------------------------------------------------------ */
/* Mesh                                                                      */
/* ------------------------------------------------------------------------ */

/* A mesh: named dims laid out row-major over ranks 0..world_size-1, plus its
 * dim sets.  Memory is O(ndims): no per-rank or per-group tables.  Immutable
 * after creation, so it may be shared between threads. */
typedef struct mpg_mesh mpg_mesh;

/* Build a mesh from a validated spec.  world_size > 0 resolves a -1 dim and
 * must equal the product of the sizes; world_size == 0 means "the product"
 * and is invalid when a dim is -1.
 * Returns MPG_OK; MPG_ERR_SPEC (message names the world size and the
 * product); MPG_ERR_INVALID for NULL arguments; MPG_ERR_NOMEM. */
mpg_status mpg_mesh_create(const mpg_spec *spec, int world_size,
                           mpg_mesh **out);

/* Free a mesh.  NULL is a no-op. */
void mpg_mesh_destroy(mpg_mesh *mesh);

int mpg_mesh_world_size(const mpg_mesh *mesh);
int mpg_mesh_ndims(const mpg_mesh *mesh);

/* Name and size of dim `dim` (0 = outermost).  *name belongs to the mesh.
 * Returns MPG_ERR_RANGE for a bad index. */
mpg_status mpg_mesh_dim(const mpg_mesh *mesh, int dim, const char **name,
                        int *size);

/* Dim sets: every dim (ids 0..ndims-1, mesh order), then every flattened
 * set (spec order), then "world" (all dims).  Their count: */
int mpg_mesh_num_dimsets(const mpg_mesh *mesh);

/* Find a dim set by dim name, flattened name or "world".
 * Returns MPG_ERR_NOT_FOUND naming the unknown name and listing known ones. */
mpg_status mpg_mesh_dimset_find(const mpg_mesh *mesh, const char *name,
                                int *dimset);

/* Describe dim set `dimset`: its name (belongs to the mesh), the size of
 * each of its groups, and how many groups it has.  Any out pointer may be
 * NULL.  Returns MPG_ERR_RANGE for a bad id. */
mpg_status mpg_mesh_dimset_info(const mpg_mesh *mesh, int dimset,
                                const char **name, int *group_size,
                                int *num_groups);

/* The dims of a dim set as mesh dim indices, in mesh order; *ndims is set
 * and dims[] needs room for MPG_MAX_DIMS. */
mpg_status mpg_mesh_dimset_dims(const mpg_mesh *mesh, int dimset,
                                int dims[MPG_MAX_DIMS], int *ndims);

/* rank -> coordinate (coord[] has mpg_mesh_ndims entries). */
mpg_status mpg_mesh_coord_of(const mpg_mesh *mesh, int rank, int coord[]);

/* coordinate -> rank.  Returns MPG_ERR_RANGE naming the bad coordinate. */
mpg_status mpg_mesh_rank_of(const mpg_mesh *mesh, const int coord[],
                            int *rank);

/* The group of `rank` along dim set `dimset`: the group's index (groups are
 * numbered row-major over the dims outside the set, which is also the order
 * of their first ranks), the rank's position in it (row-major over the
 * set's dims), and the group size.  Out pointers may be NULL.  O(ndims). */
mpg_status mpg_mesh_group_of(const mpg_mesh *mesh, int dimset, int rank,
                             int *group_index, int *position,
                             int *group_size);

/* The rank at `position` in group `group_index` of dim set `dimset`. */
mpg_status mpg_mesh_group_rank(const mpg_mesh *mesh, int dimset,
                               int group_index, int position, int *rank);

/* All members of group `group_index` of `dimset` in position order into
 * ranks[] (room for group_size ints). */
mpg_status mpg_mesh_group_members(const mpg_mesh *mesh, int dimset,
                                  int group_index, int *ranks);

/* ------------------------------------------------------------------------ */
/* Topology (topo/)                                                          */
/* ------------------------------------------------------------------------ */
/* @@topo-api@@ */

/* ------------------------------------------------------------------------ */
/* Groups and collectives (groups/)                                          */
/* ------------------------------------------------------------------------ */
/* @@groups-api@@ */

/* ------------------------------------------------------------------------ */
/* Gradient synchronisation (sync/)                                          */
/* ------------------------------------------------------------------------ */
/* @@sync-api@@ */

#ifdef __cplusplus
}
#endif
#endif /* MESHPG_H */
