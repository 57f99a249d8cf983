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

/* The tokens of a Megatron order string in an expert grid, and their
 * names ("tp", "cp", "ep", "dp", "pp"). */
enum { MPG__TOK_TP, MPG__TOK_CP, MPG__TOK_EP, MPG__TOK_DP, MPG__TOK_PP, MPG__TOK_COUNT };
extern const char *const mpg__tok_names[MPG__TOK_COUNT];

/* The expert grid's order of `spec` (spec->expert_order, or the default
 * derived from the mesh when it is ""), innermost first, as tokens without
 * cp: tok[] gets *ntok (<= 4) entries; named[t] is 1 for a token the order
 * names (the default names all four).  Returns MPG_OK or MPG_ERR_SPEC
 * (positioned at experts.order) for an unknown or repeated token. */
mpg_status mpg__expert_order(const mpg_spec *spec, int tok[4], int *ntok,
                             int named[MPG__TOK_COUNT]);

#ifdef __cplusplus
}
#endif
#endif
