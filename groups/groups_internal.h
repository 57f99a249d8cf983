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

#ifdef __cplusplus
}
#endif
#endif
