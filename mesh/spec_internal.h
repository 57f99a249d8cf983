/* Spec internals shared by spec.c and the TOML reader. */
#ifndef MPG_SPEC_INTERNAL_H
#define MPG_SPEC_INTERNAL_H

#include "internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Scalar options whose range mpg_spec_validate checks. */
enum {
  MPG__OPT_NODES,
  MPG__OPT_GPUS_PER_NODE,
  MPG__OPT_BUCKET_MB,
  MPG__OPT_FIRST_BUCKET_MB,
  MPG__OPT_TIMEOUT_S,
  MPG__OPT_FSDP_OWNS_DP, /* not numeric: position only */
  MPG__OPT_SYNC_MODE,    /* not numeric: position only */
  MPG__OPT_COUNT
};

/* MPG_SPEC_INIT in static storage, so its padding is zero too: what a
 * reset copies, making a reset spec equal byte for byte to another. */
extern const mpg_spec mpg__spec_defaults;

/* mpg_spec_validate, with the source position of each scalar option
 * (opt_pos may be NULL). */
mpg_status mpg__spec_validate_at(const mpg_spec *spec,
                                 const mpg_srcpos *opt_pos);

#ifdef __cplusplus
}
#endif
#endif
