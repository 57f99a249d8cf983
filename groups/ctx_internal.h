/* The groups layer's own state, shared by its three parts: ctx.c (the
 * context: launch, placement, binding, memory), group.c (the groups of a
 * context) and coll.c (collectives and work handles); calls go one way,
 * from ctx.c and coll.c to group.c.  The backends (backend.h) only move
 * data: this layer checks arguments, turns size-1 groups into local
 * copies, applies the context's timeout and aborts the whole context when
 * a peer never arrives. */
#ifndef MPG_GROUPS_CTX_INTERNAL_H
#define MPG_GROUPS_CTX_INTERNAL_H

#include <stdatomic.h>

#include "backend.h"
#include "groups_internal.h"
#include "mesh_internal.h"

#define MAX_SETS (MPG_MAX_DIMS + MPG_MAX_FLATTEN + 1)

#define MAX_SELECT 64

struct mpg_group {
  mpg_ctx *ctx;
  int dimset;       /* named dim set, or -1 for groups made by dims/select */
  const char *name; /* the mesh's name, or extra_name */
  unsigned mask;    /* mesh dims of the group */
  int index, position, size;
  int nselect;      /* > 0: only these positions of the mask group */
  int select[MAX_SELECT];
  int created;      /* communicator made (or not needed) */
  int member;       /* extra groups: this rank belongs to it */
  mpg__comm *comm;  /* NULL for size-1 groups; the world comm for "world" */
  char extra_name[128];
  struct mpg_group *next; /* extra groups of the context */
};

struct mpg_ctx {
  int syncs; /* live mpg_sync on this context (mpg__ctx_sync_count) */
  const mpg_mesh *mesh;
  const struct mpg__backend_ops *ops;
  mpg_backend_kind kind;
  int rank, world, local_rank;
  int launcher_rank, num_nodes;
  mpg_binding binding;
  mpg__comm *launch_comm; /* the launcher-ordered world, kept when placement
                             renumbered the ranks (freed last) */
  double timeout_s;
  int lazy;
  atomic_int aborted; /* MPG_OK while healthy, else the reason; atomic so
                        that a watchdog thread may call mpg_ctx_abort */
  mpg__comm *world_comm;
  long setup_collectives;
  int nsets;
  mpg_group groups[MAX_SETS];
  mpg_group *extra; /* groups made by mpg_ctx_group_dims / _select */
};

struct mpg_work {
  mpg_group *group;
  mpg__req *req;
  double deadline;
  mpg_status status; /* a failure seen by mpg_work_test */
};

/* group.c: abort every communicator of the context (once; later calls do
 * nothing) with `reason`, MPG_ERR_TIMEOUT or MPG_ERR_ABORTED. */
void mpg__ctx_abort_all(mpg_ctx *ctx, mpg_status reason);

/* group.c: create g's communicator if it has none yet (collective over the
 * world for groups of two or more). */
mpg_status mpg__group_create(mpg_ctx *ctx, mpg_group *g);

#endif
