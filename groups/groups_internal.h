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

#ifdef __cplusplus
}
#endif
#endif
