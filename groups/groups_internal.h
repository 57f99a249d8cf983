/* What the groups layer tells the modules above it (sync/) beyond the
 * public API. */
#ifndef MPG_GROUPS_INTERNAL_H
#define MPG_GROUPS_INTERNAL_H

#include "internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 1 when the context's backend reduces f16/bf16 with f32 accumulation
 * (thread, mpi: they widen, reduce and round once), 0 when it reduces in
 * the element's own type (nccl). */
int mpg__ctx_half_reduces_in_f32(const mpg_ctx *ctx);

/* The context a group belongs to (NULL for NULL), so that a group of
 * another context can be refused. */
const mpg_ctx *mpg__group_ctx(const mpg_group *group);

/* Count the gradient synchronisers living on a context (+1 at
 * mpg_sync_create, -1 at mpg_sync_destroy): mpg_ctx_destroy refuses while
 * any remains, instead of leaving them with freed groups. */
void mpg__ctx_sync_count(mpg_ctx *ctx, int delta);

/* All-gather `count` elements of host memory from every member of the
 * group into host memory (recv holds size x count), blocking, within the
 * context's timeout: for the library's own checks (sync's layout
 * fingerprints), on any backend (NCCL gets them staged through device
 * memory).  Collective over the group; creates it if needed. */
mpg_status mpg__group_host_all_gather(mpg_group *group, const void *send,
                                      void *recv, size_t count, mpg_dtype dtype);

/* The issue-order check (groups/order.c) at `where` ("mpg_sync_finish"):
 * collective over the world when the checker is on (MESHPG_CHECK_ORDER),
 * nothing when it is off or the context was aborted.  MPG_ERR_STATE, on
 * every rank alike, naming the first call that differs, when the ranks
 * issued different collectives or group creations since the last check.
 * `teardown`: a failure of the check's own communication (a peer left or
 * failed) is logged and gives MPG_OK. */
mpg_status mpg__ctx_check_order(mpg_ctx *ctx, const char *where, int teardown);

#ifdef __cplusplus
}
#endif
#endif
