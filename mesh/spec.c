/* The mesh specification: defaults, string forms (--mesh, --flatten,
 * --order) and validation.  TOML reading lives in spec_toml.cc. */
#include "spec_internal.h"
#include "mesh_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The caller's spec as one of this library's size (mesh/base/abi.c's rule). */
const mpg_spec mpg__spec_defaults = MPG_SPEC_INIT;

static mpg_status spec_in(const mpg_spec *caller, mpg_spec *full, const char *fn) {
  memcpy(full, &mpg__spec_defaults, sizeof *full);
  char what[64];
  snprintf(what, sizeof what, "%s: spec", fn);
  return mpg__abi_in(full, MPG__ABI_END(mpg_spec), caller, MPG_SPEC_MAGIC, what, "MPG_SPEC_INIT");
}

mpg_status mpg_spec_init(mpg_spec *spec) {
  mpg_status st = mpg__abi_check(spec, MPG_SPEC_MAGIC, "mpg_spec_init: spec",
                                 "MPG_SPEC_INIT");
  if (st) return st;
  mpg__abi_out(spec, &mpg__spec_defaults, MPG__ABI_END(mpg_spec));
  return MPG_OK;
}

static int parse_int(const char *s, long *out) {
  char *end;
  if (!*s) return 0;
  long v = strtol(s, &end, 10);
  if (*end) return 0;
  *out = v;
  return 1;
}

/* The edits below take (spec, a, b) so that one frame runs them all; b is
 * used by add_flatten only. */
static mpg_status set_mesh(mpg_spec *spec, const char *dims, const char *unused) {
  (void)unused;
  if (!dims) return mpg__fail(MPG_ERR_INVALID, "mpg_spec_set_mesh: dims is NULL");
  if (!*dims)
    return mpg__fail(MPG_ERR_SPEC, "mesh: expected dims like \"dp=2,cp=2,tp=2\", found \"\"");
  mpg_dim out[MPG_MAX_DIMS];
  int n = 0;
  const char *p = dims;
  char item[128];
  int got;
  while ((got = mpg__list_next(&p, ',', item, sizeof item))) {
    if (got < 0)
      return mpg__fail(MPG_ERR_SPEC, "mesh \"%s\": item %d is longer than %zu chars",
                       dims, n + 1, sizeof item - 1);
    char *eq = strchr(item, '=');
    if (!eq)
      return mpg__fail(MPG_ERR_SPEC,
                       "mesh \"%s\": item %d \"%s\": expected NAME=SIZE", dims,
                       n + 1, item);
    if (n == MPG_MAX_DIMS)
      return mpg__fail(MPG_ERR_SPEC,
                       "mesh \"%s\": expected at most %d dims, found more",
                       dims, MPG_MAX_DIMS);
    *eq = '\0';
    const char *name = item, *val = eq + 1;
    while (*val == ' ') val++;
    size_t nl = strlen(name);
    while (nl && name[nl - 1] == ' ') item[--nl] = '\0';
    long v;
    if (strcmp(val, "auto") == 0)
      v = -1;
    else if (!parse_int(val, &v) || v < -2147483647L || v > 2147483647L)
      return mpg__fail(MPG_ERR_SPEC,
                       "mesh \"%s\": dim \"%s\": expected an integer size or "
                       "\"auto\", found \"%s\"",
                       dims, name, val);
    if (strlen(name) >= MPG_NAME_MAX)
      return mpg__fail(MPG_ERR_SPEC,
                       "mesh \"%s\": dim name \"%s\" is longer than %d chars",
                       dims, name, MPG_NAME_MAX - 1);
    memset(&out[n], 0, sizeof out[n]);
    strcpy(out[n].name, name);
    out[n].size = (int)v;
    n++;
  }
  memcpy(spec->dims, out, sizeof(mpg_dim) * (size_t)n);
  spec->ndims = n;
  return MPG_OK;
}

static mpg_status add_flatten(mpg_spec *spec, const char *name, const char *dims) {
  if (!name || !dims)
    return mpg__fail(MPG_ERR_INVALID, "mpg_spec_add_flatten: NULL argument");
  if (strlen(name) >= MPG_NAME_MAX)
    return mpg__fail(MPG_ERR_SPEC,
                     "flatten \"%s\": name is longer than %d chars", name,
                     MPG_NAME_MAX - 1);
  mpg_flatten f;
  memset(&f, 0, sizeof f);
  strcpy(f.name, name);
  const char *p = dims;
  char item[128];
  int got;
  while ((got = mpg__list_next(&p, ',', item, sizeof item))) {
    if (got < 0)
      return mpg__fail(MPG_ERR_SPEC, "flatten %s=\"%s\": item %d is longer than %zu chars",
                       name, dims, f.ndims + 1, sizeof item - 1);
    if (f.ndims == MPG_MAX_DIMS)
      return mpg__fail(MPG_ERR_SPEC,
                       "flatten %s=\"%s\": expected at most %d dims", name,
                       dims, MPG_MAX_DIMS);
    if (!item[0] || strlen(item) >= MPG_NAME_MAX)
      return mpg__fail(MPG_ERR_SPEC,
                       "flatten %s=\"%s\": item %d: expected a dim name, "
                       "found \"%s\"",
                       name, dims, f.ndims + 1, item);
    strcpy(f.dims[f.ndims++], item);
  }
  for (int i = 0; i < spec->nflatten; i++)
    if (strcmp(spec->flatten[i].name, name) == 0) {
      spec->flatten[i] = f;
      return MPG_OK;
    }
  if (spec->nflatten == MPG_MAX_FLATTEN)
    return mpg__fail(MPG_ERR_SPEC,
                     "flatten %s: expected at most %d flattened sets", name,
                     MPG_MAX_FLATTEN);
  spec->flatten[spec->nflatten++] = f;
  return MPG_OK;
}

static int find_dim(const mpg_spec *spec, const char *name) {
  for (int i = 0; i < spec->ndims; i++)
    if (strcmp(spec->dims[i].name, name) == 0) return i;
  return -1;
}

/* "dp, cp, tp" into buf. */
static void dim_list(const mpg_spec *spec, char *buf, size_t cap) {
  size_t n = 0;
  buf[0] = '\0';
  for (int i = 0; i < spec->ndims && n < cap; i++)
    n += (size_t)snprintf(buf + n, cap - n, "%s%s", i ? ", " : "",
                          spec->dims[i].name);
}

static const char *suggest_dim(const mpg_spec *spec, const char *name,
                               char *buf, size_t cap) {
  const char *cands[MPG_MAX_DIMS];
  for (int i = 0; i < spec->ndims; i++) cands[i] = spec->dims[i].name;
  const char *c = mpg__closest(name, cands, spec->ndims);
  if (c)
    snprintf(buf, cap, " (did you mean \"%s\"?)", c);
  else
    buf[0] = '\0';
  return buf;
}

static mpg_status apply_order(mpg_spec *spec, const char *order, const char *unused) {
  (void)unused;
  if (!order) return mpg__fail(MPG_ERR_INVALID, "mpg_spec_apply_order: order is NULL");
  char names[MPG_MAX_DIMS][MPG_NAME_MAX];
  int n = 0;
  const char *p = order;
  char item[128], known[512], hint[64];
  dim_list(spec, known, sizeof known);
  int got;
  while ((got = mpg__list_next(&p, '-', item, sizeof item))) {
    if (got < 0 || strlen(item) >= MPG_NAME_MAX)
      return mpg__fail(MPG_ERR_SPEC, "order \"%s\": unknown dim \"%s\"; the mesh has %s",
                       order, item, known);
    if (n == MPG_MAX_DIMS)
      return mpg__fail(MPG_ERR_SPEC,
                       "order \"%s\": names more dims than the mesh has (%s)", order,
                       known);
    strcpy(names[n++], item);
  }
  for (int i = 0; i < n; i++) {
    if (find_dim(spec, names[i]) < 0)
      return mpg__fail(MPG_ERR_SPEC,
                       "order \"%s\": unknown dim \"%s\"%s; the mesh has %s",
                       order, names[i], suggest_dim(spec, names[i], hint, sizeof hint),
                       known);
    for (int j = 0; j < i; j++)
      if (strcmp(names[i], names[j]) == 0)
        return mpg__fail(MPG_ERR_SPEC, "order \"%s\": dim \"%s\" is named twice",
                         order, names[i]);
  }
  for (int d = 0; d < spec->ndims; d++) {
    int seen = 0;
    for (int i = 0; i < n; i++) seen |= strcmp(names[i], spec->dims[d].name) == 0;
    if (!seen)
      return mpg__fail(MPG_ERR_SPEC,
                       "order \"%s\": dim \"%s\" of the mesh is missing (an "
                       "order names every dim, innermost first)",
                       order, spec->dims[d].name);
  }
  /* Fewer distinct names than dims: the mesh names a dim twice (which
   * mpg_spec_validate rejects); no permutation can be taken from it. */
  if (n != spec->ndims)
    return mpg__fail(MPG_ERR_SPEC,
                     "order \"%s\": names %d dims but the mesh has %d (%s): "
                     "a dim name is repeated in the mesh",
                     order, n, spec->ndims, known);
  /* Megatron lists innermost first; the mesh lists outermost first. */
  mpg_dim old[MPG_MAX_DIMS];
  memcpy(old, spec->dims, sizeof old);
  for (int i = 0; i < n; i++)
    for (int d = 0; d < n; d++)
      if (strcmp(old[d].name, names[i]) == 0) spec->dims[n - 1 - i] = old[d];
  return MPG_OK;
}

/* ------------------------------------------------------------------ */
/* The expert grid ([experts], mpg_spec_set_experts)                   */
/* ------------------------------------------------------------------ */

const char *const mpg__tok_names[MPG__TOK_COUNT] = {"tp", "cp", "ep", "dp", "pp"};

/* Names an expert grid takes; no mesh dim or flattened set may use them. */
static const char *const expert_names[] = {"etp", "ep", "edp", "etp_ep", "etp_ep_pp"};
#define EXPERT_NAMES 5

mpg_status mpg__expert_order(const mpg_spec *spec, int tok[4], int *ntok,
                             int named[MPG__TOK_COUNT]) {
  int n = 0;
  for (int t = 0; t < MPG__TOK_COUNT; t++) named[t] = 0;
  if (!spec->experts.order[0]) {
    /* The mesh's dims innermost first: tp, dp and pp where they are, ep
     * just inside dp (Megatron's tp-cp-ep-dp-pp); a missing tp goes
     * first, a missing dp (with ep) just inside pp, a missing pp last. */
    int has[MPG__TOK_COUNT] = {0};
    for (int d = spec->ndims - 1; d >= 0; d--) {
      const char *nm = spec->dims[d].name;
      /* Each token once, whatever the spec (a repeated dim is reported by
       * validation; here it must not overrun tok[], which the fuzzer
       * found). */
      if (strcmp(nm, "tp") == 0 && !has[MPG__TOK_TP])
        tok[n++] = MPG__TOK_TP, has[MPG__TOK_TP] = 1;
      if (strcmp(nm, "pp") == 0 && !has[MPG__TOK_PP])
        tok[n++] = MPG__TOK_PP, has[MPG__TOK_PP] = 1;
      if (strcmp(nm, "dp") == 0 && !has[MPG__TOK_DP]) {
        tok[n++] = MPG__TOK_EP;
        tok[n++] = MPG__TOK_DP;
        has[MPG__TOK_DP] = 1;
      }
    }
    if (!has[MPG__TOK_TP]) {
      memmove(tok + 1, tok, sizeof(int) * (size_t)n);
      tok[0] = MPG__TOK_TP;
      n++;
    }
    if (!has[MPG__TOK_DP]) {
      int at = n;
      for (int i = 0; i < n; i++)
        if (tok[i] == MPG__TOK_PP) at = i;
      memmove(tok + at + 2, tok + at, sizeof(int) * (size_t)(n - at));
      tok[at] = MPG__TOK_EP;
      tok[at + 1] = MPG__TOK_DP;
      n += 2;
    }
    if (!has[MPG__TOK_PP]) tok[n++] = MPG__TOK_PP;
    for (int i = 0; i < n; i++) named[tok[i]] = 1;
    *ntok = n;
    return MPG_OK;
  }
  const char *order = spec->experts.order;
  const char *p = order;
  char item[64];
  int got, seen[MPG__TOK_COUNT] = {0};
  while ((got = mpg__list_next(&p, '-', item, sizeof item))) {
    int t = -1;
    for (int k = 0; k < MPG__TOK_COUNT && got > 0; k++)
      if (strcmp(item, mpg__tok_names[k]) == 0) t = k;
    if (t < 0) {
      const char *c = got > 0 ? mpg__closest(item, mpg__tok_names, MPG__TOK_COUNT) : NULL;
      return mpg__fail_at(MPG_ERR_SPEC, spec->source, spec->experts.order_pos,
                          "experts.order \"%s\": unknown token \"%s\"%s%s%s; expected "
                          "Megatron's names tp, cp, ep, dp, pp separated by '-', "
                          "innermost first (tp is the expert tp, dp the expert dp)",
                          order, item, c ? " (did you mean \"" : "", c ? c : "",
                          c ? "\"?)" : "");
    }
    if (seen[t])
      return mpg__fail_at(MPG_ERR_SPEC, spec->source, spec->experts.order_pos,
                          "experts.order \"%s\": \"%s\" is named twice", order, item);
    seen[t] = 1;
    named[t] = 1;
    if (t != MPG__TOK_CP) tok[n++] = t;
  }
  *ntok = n;
  return MPG_OK;
}

/* The expert keys of a spec (no world size needed). */
static mpg_status validate_experts(const mpg_spec *spec) {
  const char *src = spec->source;
  if (!memchr(spec->experts.order, '\0', sizeof spec->experts.order))
    return mpg__fail(MPG_ERR_SPEC, "experts.order: not a string of at most %zu chars",
                     sizeof spec->experts.order - 1);
  if (spec->experts.ep == 0) {
    if (spec->experts.tp != 0 || spec->experts.order[0])
      return mpg__fail_at(MPG_ERR_SPEC, src,
                          spec->experts.tp ? spec->experts.tp_pos : spec->experts.order_pos,
                          "experts.%s is set but experts.ep is 0 (no expert grid); "
                          "set experts.ep to a size > 0 or -1",
                          spec->experts.tp ? "tp" : "order");
    return MPG_OK;
  }
  if (spec->experts.ep < -1)
    return mpg__fail_at(MPG_ERR_SPEC, src, spec->experts.ep_pos,
                        "experts.ep: expected a positive integer or -1 (inferred), "
                        "found %d",
                        spec->experts.ep);
  if (spec->experts.tp < 0)
    return mpg__fail_at(MPG_ERR_SPEC, src, spec->experts.tp_pos,
                        "experts.tp: expected a positive integer (or 0: the size of "
                        "the mesh's tp dim), found %d",
                        spec->experts.tp);
  int tok[4], ntok, named[MPG__TOK_COUNT];
  mpg_status st = mpg__expert_order(spec, tok, &ntok, named);
  if (st) return st;
  /* The expert grid is a second grid over the world with its own mask bits
   * (mesh/include/mesh_internal.h): any mesh of up to MPG_MAX_DIMS dims may have
   * one; only the table of dim sets is shared. */
  if (spec->ndims + spec->nflatten > MPG_MAX_DIMS + MPG_MAX_FLATTEN - EXPERT_NAMES)
    return mpg__fail_at(MPG_ERR_SPEC, src, spec->experts.pos,
                        "experts: an expert grid adds %d dim sets, so the mesh may "
                        "have at most %d dims and flattened sets together, but it "
                        "has %d dims and %d sets; drop flattened sets",
                        EXPERT_NAMES, MPG_MAX_DIMS + MPG_MAX_FLATTEN - EXPERT_NAMES,
                        spec->ndims, spec->nflatten);
  for (int d = 0; d < spec->ndims; d++)
    for (int k = 0; k < EXPERT_NAMES; k++)
      if (strcmp(spec->dims[d].name, expert_names[k]) == 0)
        return mpg__fail_at(MPG_ERR_SPEC, src, spec->dims[d].name_pos,
                            "mesh.dims[%d].name: \"%s\" is a name of the expert grid "
                            "([experts] is set); rename the dim or drop [experts]",
                            d, expert_names[k]);
  for (int f = 0; f < spec->nflatten; f++)
    for (int k = 0; k < EXPERT_NAMES; k++)
      if (strcmp(spec->flatten[f].name, expert_names[k]) == 0)
        return mpg__fail_at(MPG_ERR_SPEC, src, spec->flatten[f].name_pos,
                            "mesh.flatten.%s: \"%s\" is a name of the expert grid "
                            "([experts] is set); rename the set or drop [experts]",
                            expert_names[k], expert_names[k]);
  return MPG_OK;
}

mpg_status mpg_spec_set_experts(mpg_spec *caller, int tp, int ep, const char *order) {
  mpg_spec full;
  mpg_status st = spec_in(caller, &full, "mpg_spec_set_experts");
  if (st) return st;
  if (!order) order = "";
  if (strlen(order) >= sizeof full.experts.order)
    return mpg__fail(MPG_ERR_SPEC, "experts.order \"%.40s...\": longer than %zu chars",
                     order, sizeof full.experts.order - 1);
  if (ep == 0 && (tp != 0 || order[0]))
    return mpg__fail(MPG_ERR_SPEC,
                     "mpg_spec_set_experts: ep = 0 removes the expert grid, but tp = %d "
                     "and order = \"%s\" were given; pass tp = 0 and order = NULL, or "
                     "an ep > 0 or -1",
                     tp, order);
  mpg_srcpos nopos = {0, 0};
  full.experts.ep = ep;
  full.experts.tp = tp;
  strcpy(full.experts.order, order);
  full.experts.pos = full.experts.ep_pos = full.experts.tp_pos = full.experts.order_pos = nopos;
  /* Only the expert keys are checked here; a mesh set later is checked by
   * mpg_spec_validate. */
  if (ep < -1)
    return mpg__fail(MPG_ERR_SPEC,
                     "experts.ep: expected a positive integer or -1 (inferred), found %d",
                     ep);
  if (tp < 0)
    return mpg__fail(MPG_ERR_SPEC,
                     "experts.tp: expected a positive integer (or 0: the size of the "
                     "mesh's tp dim), found %d",
                     tp);
  int tok[4], ntok, named[MPG__TOK_COUNT];
  if (ep != 0 && (st = mpg__expert_order(&full, tok, &ntok, named))) return st;
  mpg__abi_out(caller, &full, MPG__ABI_END(mpg_spec));
  return MPG_OK;
}

static const char *const opt_keys[MPG__OPT_FSDP_OWNS_DP] = {
    "topology.nodes",          "topology.gpus_per_node", "sync.bucket_mb",
    "sync.first_bucket_mb",    "backend.timeout_s",
};

/* The position of option `which` in the source, or none without positions. */
static mpg_srcpos opt_at(const mpg_srcpos *opt_pos, int which) {
  mpg_srcpos nopos = {0, 0};
  return opt_pos ? opt_pos[which] : nopos;
}

/* mesh.dims: 1 to MPG_MAX_DIMS dims, valid unique names, sizes > 0 or one -1. */
static mpg_status validate_dims(const mpg_spec *spec) {
  const char *src = spec->source;
  if (spec->ndims < 1)
    return mpg__fail(MPG_ERR_SPEC, "mesh.dims: expected 1 to %d dims, found 0",
                     MPG_MAX_DIMS);
  if (spec->ndims > MPG_MAX_DIMS)
    return mpg__fail(MPG_ERR_SPEC, "mesh.dims: expected 1 to %d dims, found %d",
                     MPG_MAX_DIMS, spec->ndims);
  int auto_dim = -1;
  for (int i = 0; i < spec->ndims; i++) {
    const mpg_dim *dim = &spec->dims[i];
    if (!mpg__name_valid(dim->name))
      return mpg__fail_at(MPG_ERR_SPEC, src, dim->name_pos,
                          "mesh.dims[%d].name: expected a name of letters, "
                          "digits and '_' not starting with a digit, at most "
                          "%d chars, found \"%s\"",
                          i, MPG_NAME_MAX - 1, dim->name);
    if (strcmp(dim->name, "world") == 0)
      return mpg__fail_at(MPG_ERR_SPEC, src, dim->name_pos,
                          "mesh.dims[%d].name: \"world\" is reserved for the "
                          "group of all ranks",
                          i);
    for (int j = 0; j < i; j++)
      if (strcmp(spec->dims[j].name, dim->name) == 0)
        return mpg__fail_at(MPG_ERR_SPEC, src, dim->name_pos,
                            "mesh.dims[%d].name: duplicate dim name \"%s\" "
                            "(already mesh.dims[%d])",
                            i, dim->name, j);
    if (dim->size == -1) {
      if (auto_dim >= 0)
        return mpg__fail_at(MPG_ERR_SPEC, src, dim->size_pos,
                            "mesh.dims[%d].size: only one dim may be -1 "
                            "(inferred), but \"%s\" is -1 and \"%s\" already is",
                            i, dim->name, spec->dims[auto_dim].name);
      auto_dim = i;
    } else if (dim->size <= 0) {
      return mpg__fail_at(MPG_ERR_SPEC, src, dim->size_pos,
                          "mesh.dims[%d].size: expected a positive integer or "
                          "-1 for dim \"%s\", found %d",
                          i, dim->name, dim->size);
    }
  }
  return MPG_OK;
}

/* The dims of one flatten set: known, listed once each, in mesh order. */
static mpg_status validate_flatten_dims(const mpg_spec *spec, const mpg_flatten *set,
                                        const char *known) {
  const char *src = spec->source;
  char hint[64];
  int prev_index = -1;
  for (int i = 0; i < set->ndims; i++) {
    int dim_index = find_dim(spec, set->dims[i]);
    mpg_srcpos pos = set->dim_pos[i];
    if (dim_index < 0)
      return mpg__fail_at(MPG_ERR_SPEC, src, pos,
                          "mesh.flatten.%s[%d]: unknown dim \"%s\"%s; the "
                          "mesh has %s",
                          set->name, i, set->dims[i],
                          suggest_dim(spec, set->dims[i], hint, sizeof hint),
                          known);
    for (int j = 0; j < i; j++)
      if (strcmp(set->dims[j], set->dims[i]) == 0)
        return mpg__fail_at(MPG_ERR_SPEC, src, pos,
                            "mesh.flatten.%s[%d]: dim \"%s\" is listed twice",
                            set->name, i, set->dims[i]);
    if (dim_index < prev_index)
      return mpg__fail_at(MPG_ERR_SPEC, src, pos,
                          "mesh.flatten.%s[%d]: dims must be listed in mesh "
                          "order (outermost first: %s), but \"%s\" comes "
                          "after \"%s\"",
                          set->name, i, known, set->dims[i], set->dims[i - 1]);
    prev_index = dim_index;
  }
  return MPG_OK;
}

/* Flatten set k: a valid name clashing with no dim or earlier set, 1 to MPG_MAX_DIMS dims. */
static mpg_status validate_flatten_set(const mpg_spec *spec, int k, const char *known) {
  const char *src = spec->source;
  const mpg_flatten *set = &spec->flatten[k];
  if (!mpg__name_valid(set->name))
    return mpg__fail_at(MPG_ERR_SPEC, src, set->name_pos,
                        "mesh.flatten: expected a set name of letters, "
                        "digits and '_' not starting with a digit, at most "
                        "%d chars, found \"%s\"",
                        MPG_NAME_MAX - 1, set->name);
  if (find_dim(spec, set->name) >= 0 || strcmp(set->name, "world") == 0)
    return mpg__fail_at(MPG_ERR_SPEC, src, set->name_pos,
                        "mesh.flatten.%s: the name \"%s\" clashes with %s",
                        set->name, set->name,
                        strcmp(set->name, "world") == 0 ? "the reserved group \"world\""
                                                         : "a mesh dim");
  for (int j = 0; j < k; j++)
    if (strcmp(spec->flatten[j].name, set->name) == 0)
      return mpg__fail_at(MPG_ERR_SPEC, src, set->name_pos,
                          "mesh.flatten.%s: the set is defined twice",
                          set->name);
  if (set->ndims < 1 || set->ndims > MPG_MAX_DIMS)
    return mpg__fail_at(MPG_ERR_SPEC, src, set->name_pos,
                        "mesh.flatten.%s: expected a list of 1 to %d dims, "
                        "found %d",
                        set->name, MPG_MAX_DIMS, set->ndims);
  return validate_flatten_dims(spec, set, known);
}

/* mesh.flatten: at most MPG_MAX_FLATTEN sets, each valid. */
static mpg_status validate_flatten(const mpg_spec *spec, const char *known) {
  if (spec->nflatten < 0 || spec->nflatten > MPG_MAX_FLATTEN)
    return mpg__fail(MPG_ERR_SPEC, "mesh.flatten: expected at most %d sets, found %d",
                     MPG_MAX_FLATTEN, spec->nflatten);
  for (int k = 0; k < spec->nflatten; k++) {
    mpg_status st = validate_flatten_set(spec, k, known);
    if (st) return st;
  }
  return MPG_OK;
}

/* The numeric options of the other sections: each in range and finite. */
static mpg_status validate_numbers(const mpg_spec *spec, const mpg_srcpos *opt_pos) {
  /* Every value finite: below hi (exclusive; the timeout's bound). */
  struct {
    double v;
    double lo, hi;
    int integer;
  } opts[MPG__OPT_FSDP_OWNS_DP] = {
      {spec->topology.nodes, 0, 1e300, 1},     {spec->topology.gpus_per_node, 0, 1e300, 1},
      {spec->sync.bucket_mb, 0, 1e300, 0}, {spec->sync.first_bucket_mb, 0, 1e300, 0},
      {spec->backend.timeout_s, 0, MPG__TIMEOUT_MAX, 0},
  };
  for (int i = 0; i < MPG__OPT_FSDP_OWNS_DP; i++) {
    int bad = opts[i].integer ? opts[i].v < opts[i].lo : !(opts[i].v > opts[i].lo);
    if (bad)
      return mpg__fail_at(MPG_ERR_SPEC, spec->source, opt_at(opt_pos, i),
                          "%s: expected %s, found %g", opt_keys[i],
                          opts[i].integer ? "an integer >= 0" : "a number > 0", opts[i].v);
    if (!(opts[i].v < opts[i].hi))
      return mpg__fail_at(MPG_ERR_SPEC, spec->source, opt_at(opt_pos, i),
                          "%s: expected a finite number%s, found %g", opt_keys[i],
                          opts[i].hi == MPG__TIMEOUT_MAX ? " below " MPG__TIMEOUT_MAX_TEXT : "",
                          opts[i].v);
  }
  return MPG_OK;
}

/* The enum options: each one of its known values. */
static mpg_status validate_enums(const mpg_spec *spec) {
  if (spec->topology.bind < MPG_BIND_NONE || spec->topology.bind > MPG_BIND_CORE)
    return mpg__fail(MPG_ERR_SPEC, "topology.bind: unknown value %d", (int)spec->topology.bind);
  if (spec->topology.rank_order < MPG_RANK_ORDER_BLOCK || spec->topology.rank_order > MPG_RANK_ORDER_CYCLIC)
    return mpg__fail(MPG_ERR_SPEC, "topology.rank_order: unknown value %d",
                     (int)spec->topology.rank_order);
  if (spec->sync.op != MPG_OP_AVG && spec->sync.op != MPG_OP_SUM)
    return mpg__fail(MPG_ERR_SPEC, "sync.op: unknown value %d", (int)spec->sync.op);
  if (spec->sync.reduce_dtype < MPG_REDUCE_NATIVE || spec->sync.reduce_dtype > MPG_REDUCE_F32)
    return mpg__fail(MPG_ERR_SPEC, "sync.reduce_dtype: unknown value %d",
                     (int)spec->sync.reduce_dtype);
  if (spec->backend.name < MPG_BACKEND_THREAD || spec->backend.name > MPG_BACKEND_NCCL)
    return mpg__fail(MPG_ERR_SPEC, "backend.name: unknown value %d", (int)spec->backend.name);
  if (spec->sync.mode != MPG_SYNC_REPLICATE && spec->sync.mode != MPG_SYNC_SHARD)
    return mpg__fail(MPG_ERR_SPEC, "sync.mode: unknown value %d", (int)spec->sync.mode);
  return MPG_OK;
}

/* The sync options that depend on each other or on the mesh's dims. */
static mpg_status validate_sync_combos(const mpg_spec *spec, const mpg_srcpos *opt_pos,
                                       const char *known) {
  const char *src = spec->source;
  if (spec->sync.mode == MPG_SYNC_SHARD && spec->sync.fsdp_owns_dp)
    return mpg__fail_at(MPG_ERR_SPEC, src, opt_at(opt_pos, MPG__OPT_SYNC_MODE),
                        "sync.mode: \"shard\" with sync.fsdp_owns_dp = true: the shard "
                        "mode owns dp itself (it reduce-scatters over dp_cp); drop "
                        "fsdp_owns_dp");
  if (spec->sync.mode != MPG_SYNC_SHARD && (spec->sync.shard_dims[0] || spec->sync.replicate_dims[0]))
    return mpg__fail(MPG_ERR_SPEC, "sync.%s = \"%s\" needs sync.mode = \"shard\"",
                     spec->sync.shard_dims[0] ? "shard_dims" : "replicate_dims",
                     spec->sync.shard_dims[0] ? spec->sync.shard_dims : spec->sync.replicate_dims);
  if (spec->sync.mode != MPG_SYNC_SHARD &&
      (spec->sync.expert_shard_dims[0] || spec->sync.optimizer_instances > 1))
    return mpg__fail(MPG_ERR_SPEC, "sync.%s needs sync.mode = \"shard\"",
                     spec->sync.expert_shard_dims[0] ? "expert_shard_dims" : "optimizer_instances");
  if (spec->sync.optimizer_instances < 0)
    return mpg__fail(MPG_ERR_SPEC, "sync.optimizer_instances: expected an integer >= 1, "
                     "found %d", spec->sync.optimizer_instances);
  if (spec->sync.fsdp_owns_dp && find_dim(spec, "dp") < 0)
    return mpg__fail_at(MPG_ERR_SPEC, src, opt_at(opt_pos, MPG__OPT_FSDP_OWNS_DP),
                        "sync.fsdp_owns_dp: true needs a \"dp\" dim; the mesh has %s",
                        known);
  return MPG_OK;
}

mpg_status mpg__spec_validate_at(const mpg_spec *spec,
                                 const mpg_srcpos *opt_pos) {
  char known[512];
  mpg_status st = validate_dims(spec);
  if (st) return st;
  dim_list(spec, known, sizeof known);
  if ((st = validate_flatten(spec, known))) return st;
  if ((st = validate_experts(spec))) return st;
  if ((st = validate_numbers(spec, opt_pos))) return st;
  if ((st = validate_enums(spec))) return st;
  return validate_sync_combos(spec, opt_pos, known);
}

/* The public spec functions: each works on a full copy of the caller's
 * spec and writes it back only on success. */
typedef mpg_status (*spec_edit_fn)(mpg_spec *spec, const char *a, const char *b);

static mpg_status edit(mpg_spec *caller, const char *fn, spec_edit_fn f,
                       const char *a, const char *b) {
  mpg_spec full;
  mpg_status st = spec_in(caller, &full, fn);
  if (!st) st = f(&full, a, b);
  if (!st) mpg__abi_out(caller, &full, MPG__ABI_END(mpg_spec));
  return st;
}

mpg_status mpg_spec_set_mesh(mpg_spec *spec, const char *dims) {
  return edit(spec, "mpg_spec_set_mesh", set_mesh, dims, NULL);
}

mpg_status mpg_spec_add_flatten(mpg_spec *spec, const char *name, const char *dims) {
  return edit(spec, "mpg_spec_add_flatten", add_flatten, name, dims);
}

mpg_status mpg_spec_apply_order(mpg_spec *spec, const char *order) {
  return edit(spec, "mpg_spec_apply_order", apply_order, order, NULL);
}

mpg_status mpg_spec_validate(const mpg_spec *spec) {
  mpg_spec full;
  mpg_status st = spec_in(spec, &full, "mpg_spec_validate");
  return st ? st : mpg__spec_validate_at(&full, NULL);
}
