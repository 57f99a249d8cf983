/* The mesh arithmetic other modules need beyond the public API: lists of
 * dim names and groups over any set of dims (a bit mask of axes, below).
 * The one place where "dp_cp,tp" is parsed and where a rank's group over a
 * mask is computed; groups/, sync/ and topo/ use these. */
#ifndef MPG_MESH_INTERNAL_H
#define MPG_MESH_INTERNAL_H

#include "internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The dim sets a mesh can have: its dims, its flattened sets and "world"
 * (mesh.c's table of sets; a context's groups, groups/ctx_internal.h). */
#define MPG__MAX_DIMSETS (MPG_MAX_DIMS + MPG_MAX_FLATTEN + 1)

/* A mask names a set of axes of the mesh's two grids over the same world.
 * The mesh grid's dims own bits 0..MPG_MAX_DIMS-1 (bit d = mesh dim d);
 * the expert grid ([experts]: Megatron's second RankGenerator) owns its
 * own bits for etp, ep and edp, above those, and shares the mesh's pp bit
 * (mpg_mesh_create checks that both grids have the same pipeline groups).
 * A mask with an expert bit is a set of the expert grid (pp and expert
 * bits only); any other mask is one of the mesh grid.  So the expert grid
 * takes none of the mesh's bits, and a mesh of MPG_MAX_DIMS dims may have
 * one.  Every mask stays below MPG__MASK_LIMIT. */
#define MPG__MASK_ETP MPG_MAX_DIMS /* bit of etp; ep is the next, edp the one after */
#define MPG__MASK_BITS (MPG_MAX_DIMS + 3)
#define MPG__MASK_LIMIT (1u << MPG__MASK_BITS)
#define MPG__MASK_EXPERT (7u << MPG__MASK_ETP) /* the bits of etp, ep, edp */

/* A dense index of the masks a parse can give, for tables and flags that
 * every rank exchanges (sync's reduce groups, the issue-order checker):
 * a mesh-grid mask is its own slot (below 2^MPG_MAX_DIMS); an expert-grid
 * mask is 2^MPG_MAX_DIMS + 2 x (its etp/ep/edp bits) + (1 with pp).
 * Ascending slots are ascending masks.  slot_mask inverts it. */
#define MPG__MASK_SLOTS ((1u << MPG_MAX_DIMS) + 16u)
unsigned mpg__mesh_mask_slot(const mpg_mesh *mesh, unsigned mask);
unsigned mpg__mesh_slot_mask(const mpg_mesh *mesh, unsigned slot);

/* Flags of mpg__mesh_parse_dims. */
enum {
  MPG__DIMS_ALLOW_EMPTY = 1,  /* "" names no dims (mask 0) */
  MPG__DIMS_SKIP_UNKNOWN = 2  /* names the mesh lacks are skipped */
};

/* Parse a comma-separated list of dim names, flattened-set names and
 * "world", e.g. "dp_cp, tp".  The rules: items are separated by commas and
 * trimmed of spaces and tabs; an empty item, a name of MPG_NAME_MAX or
 * more chars, or (without MPG__DIMS_ALLOW_EMPTY) a list naming no dim is
 * MPG_ERR_INVALID; an unknown name is MPG_ERR_NOT_FOUND with the mesh's
 * names and a "did you mean" (unless MPG__DIMS_SKIP_UNKNOWN).  A dim named
 * twice counts once.  Messages start with `what` and the list.
 * *mask gets the union.  dims (may be NULL; room for MPG_MAX_DIMS) gets
 * each dim once in the order named, a set's dims in mesh order; *ndims
 * (may be NULL) their count.  An expert grid's sets (etp, ep, edp and their
 * unions) give the expert grid's bits, with the mesh's pp bit for pp; a
 * list that mixes them with mesh dims other than pp is MPG_ERR_INVALID,
 * and so is an expert set when dims is not NULL (the caller wants mesh dim
 * indices; with MPG__DIMS_SKIP_UNKNOWN it is skipped). */
mpg_status mpg__mesh_parse_dims(const mpg_mesh *mesh, const char *list,
                                int flags, const char *what, unsigned *mask,
                                int *dims, int *ndims);

/* The mesh as text into buf (cap bytes, truncated, NUL-terminated):
 * "pp=2,dp=2,tp=2", then " experts:ep=2,etp=1" with an expert grid.  For
 * messages, the checkpoint metadata and the flight recorder's dumps. */
void mpg__mesh_text(const mpg_mesh *mesh, char *buf, size_t cap);

/* The mask of dim set `dimset` (0 for a bad id). */
unsigned mpg__mesh_dimset_mask(const mpg_mesh *mesh, int dimset);

/* The group over `mask` that holds `rank`: its index (row-major over the
 * dims outside the mask), the rank's position (row-major over the mask's
 * dims) and the group size.  rank must be valid. */
void mpg__mesh_mask_place(const mpg_mesh *mesh, unsigned mask, int rank,
                          int *index, int *position, int *size);

/* The rank at `position` of the group over `mask` that holds `rank`. */
int mpg__mesh_mask_member(const mpg_mesh *mesh, unsigned mask, int rank,
                          int position);

/* The names of the mask's dims in mesh order joined by sep ("dp+cp"); an
 * expert grid's etp, ep, edp come last. */
void mpg__mesh_mask_names(const mpg_mesh *mesh, unsigned mask,
                          const char *sep, char *buf, size_t cap);

#ifdef __cplusplus
}
#endif
#endif
