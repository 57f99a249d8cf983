/* The named N-D mesh: row-major rank layout, dim sets and their groups.
 * Every lookup is arithmetic over at most MPG_MAX_DIMS strides, so memory
 * is O(ndims) whatever the world size. */
#include "mesh_internal.h"
#include "spec_internal.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A rank grid over the world: the mesh's dims (grid 0) or the expert grid
 * (grid 1), each dim with its mask bit (mesh_internal.h).  Mask bits
 * 0..ndims-1 are the mesh dims; the expert grid's etp, ep and edp have
 * their own bits (MPG__MASK_ETP..+2, above every mesh dim's) and its pp
 * the mesh's pp bit (the pipeline groups of both grids are the same). */
typedef struct grid {
  int n;
  int sizes[MPG_MAX_DIMS];
  int strides[MPG_MAX_DIMS];
  unsigned bits[MPG_MAX_DIMS]; /* 0 for a size-1 dim without a bit */
} grid;

typedef struct dimset {
  char name[MPG_NAME_MAX];
  int grid;                 /* 0: the mesh, 1: the expert grid */
  int nin;                  /* grid dims inside the set, grid order */
  int in[MPG_MAX_DIMS];
  int nout;                 /* grid dims outside the set, grid order */
  int out[MPG_MAX_DIMS];
  unsigned mask;            /* bit b: mask bit b is inside */
  int group_size;
  int num_groups;
} dimset;


struct mpg_mesh {
  int world;
  int ndims;
  char names[MPG_MAX_DIMS][MPG_NAME_MAX];
  int sizes[MPG_MAX_DIMS];
  int strides[MPG_MAX_DIMS]; /* rank stride of each dim */
  int nsets;
  dimset sets[MPG__MAX_DIMSETS];
  grid grids[2];
  int experts;                          /* 1: grids[1] is the expert grid */
  unsigned expert_bits;                 /* the bits of etp, ep, edp */
  unsigned pp_bit;                      /* the mesh's pp bit, 0 without pp */
  char enames[4][MPG_NAME_MAX];         /* expert grid dims, outermost first */
  char bitnames[MPG__MASK_BITS][MPG_NAME_MAX]; /* the name of each mask bit */
};

static int mask_grid(const mpg_mesh *m, unsigned mask) {
  return (mask & m->expert_bits) ? 1 : 0;
}

static void dimset_fill(mpg_mesh *m, dimset *s, const char *name,
                        unsigned mask) {
  memset(s, 0, sizeof *s);
  strcpy(s->name, name);
  s->group_size = 1;
  s->mask = mask;
  s->grid = mask_grid(m, mask);
  const grid *g = &m->grids[s->grid];
  for (int d = 0; d < g->n; d++) {
    if (mask & g->bits[d]) {
      s->in[s->nin++] = d;
      s->group_size *= g->sizes[d];
    } else {
      s->out[s->nout++] = d;
    }
  }
  s->num_groups = m->world / s->group_size;
}

static mpg_status resolve_sizes(const mpg_spec *spec, int world, int *sizes) {
  mpg_srcpos at = spec->dims[0].name_pos;
  long long known = 1;
  int auto_dim = -1;
  char shape[512];
  size_t n = 0;
  for (int i = 0; i < spec->ndims; i++) {
    sizes[i] = spec->dims[i].size;
    n += (size_t)snprintf(shape + n, n < sizeof shape ? sizeof shape - n : 0,
                          "%s%s=%d", i ? " x " : "", spec->dims[i].name,
                          spec->dims[i].size);
    if (n >= sizeof shape) n = sizeof shape - 1;
    if (sizes[i] == -1) {
      auto_dim = i;
      continue;
    }
    known *= sizes[i];
    if (known > INT_MAX)
      return mpg__fail_at(MPG_ERR_SPEC, spec->source, at,
                          "mesh.dims: the product of the sizes (%s) exceeds "
                          "%d ranks",
                          shape, INT_MAX);
  }
  if (world < 0)
    return mpg__fail(MPG_ERR_SPEC, "world size: expected a positive integer, found %d",
                     world);
  if (world == 0) {
    if (auto_dim >= 0)
      return mpg__fail_at(MPG_ERR_SPEC, spec->source, spec->dims[auto_dim].size_pos,
                          "mesh.dims[%d].size: dim \"%s\" is -1 (inferred) but "
                          "no world size was given",
                          auto_dim, spec->dims[auto_dim].name);
    return MPG_OK;
  }
  if (auto_dim >= 0) {
    if (world % known != 0)
      return mpg__fail_at(MPG_ERR_SPEC, spec->source, at,
                          "mesh.dims: world size %d is not divisible by %lld, "
                          "the product of the known sizes (%s)",
                          world, known, shape);
    sizes[auto_dim] = (int)(world / known);
  } else if (known != world) {
    return mpg__fail_at(MPG_ERR_SPEC, spec->source, at,
                        "mesh.dims: world size %d does not equal %lld, the "
                        "product of the sizes (%s)",
                        world, known, shape);
  }
  return MPG_OK;
}

static int dim_size(const mpg_mesh *m, const char *name, int *index) {
  for (int d = 0; d < m->ndims; d++)
    if (strcmp(m->names[d], name) == 0) {
      if (index) *index = d;
      return m->sizes[d];
    }
  if (index) *index = -1;
  return 1;
}

/* "tp-ep-dp-pp" for messages (the expert grid's order, cp left out). */
static void order_str(const int *tok, int n, char *buf, size_t cap) {
  size_t k = 0;
  buf[0] = '\0';
  for (int i = 0; i < n && k < cap; i++)
    k += (size_t)snprintf(buf + k, cap - k, "%s%s", i ? "-" : "", mpg__tok_names[tok[i]]);
}

/* The expert sizes {etp, 1, ep, edp, pp} (token order) that the world leaves, or why not. */
static mpg_status expert_sizes(const mpg_mesh *m, const mpg_spec *spec, mpg_srcpos at,
                               int pp, int size_of[MPG__TOK_COUNT]) {
  const char *src = spec->source;
  int world = m->world;
  int etp = spec->experts.tp ? spec->experts.tp : dim_size(m, "tp", NULL);
  int ep = spec->experts.ep;
  long long etp_pp = (long long)etp * pp;
  if (ep == -1) {
    if (world % etp_pp != 0)
      return mpg__fail_at(MPG_ERR_SPEC, src, at,
                          "experts.ep: -1 (inferred), but world size %d is not "
                          "divisible by etp x pp = %d x %d = %lld; change experts.tp",
                          world, etp, pp, etp_pp);
    ep = (int)(world / etp_pp);
  }
  long long etp_ep_pp = etp_pp * ep;
  if (etp_ep_pp > world || world % etp_ep_pp != 0)
    return mpg__fail_at(MPG_ERR_SPEC, src, at,
                        "experts: world size %d is not divisible by etp x ep x pp = "
                        "%d x %d x %d = %lld (experts.tp = %d%s, experts.ep = %d); "
                        "choose experts.tp and experts.ep whose product with pp divides %d",
                        world, etp, ep, pp, etp_ep_pp, etp,
                        spec->experts.tp ? "" : ", the mesh's tp", ep, world);
  size_of[MPG__TOK_TP] = etp;
  size_of[MPG__TOK_CP] = 1;
  size_of[MPG__TOK_EP] = ep;
  size_of[MPG__TOK_DP] = (int)(world / etp_ep_pp);
  size_of[MPG__TOK_PP] = pp;
  return MPG_OK;
}

/* Megatron appends the tokens an order leaves out (cp aside); they must be of size 1. */
static mpg_status append_left_out(const mpg_spec *spec, const int named[MPG__TOK_COUNT],
                                  const int size_of[MPG__TOK_COUNT], int tok[4], int *ntok) {
  static const char *const key_of[MPG__TOK_COUNT] = {
      "experts.tp", "", "experts.ep", "the expert dp (world / (etp x ep x pp))",
      "the mesh's pp"};
  for (int token = 0; token < MPG__TOK_COUNT; token++) {
    if (token == MPG__TOK_CP || named[token]) continue;
    if (size_of[token] != 1)
      return mpg__fail_at(MPG_ERR_SPEC, spec->source, spec->experts.order_pos,
                          "experts.order \"%s\": \"%s\" is left out but %s is %d; "
                          "name \"%s\" in the order (only tokens of size 1 may be left out)",
                          spec->experts.order, mpg__tok_names[token], key_of[token],
                          size_of[token], mpg__tok_names[token]);
    tok[(*ntok)++] = token;
  }
  return MPG_OK;
}

/* Grid 1 from the tokens (innermost first) with their sizes and mask bits. */
static void fill_expert_grid(mpg_mesh *m, const int *tok, int ntok,
                             const int size_of[MPG__TOK_COUNT],
                             const unsigned bit_of[MPG__TOK_COUNT]) {
  static const char *const ename[MPG__TOK_COUNT] = {"etp", "", "ep", "edp", "pp"};
  grid *egrid = &m->grids[1];
  egrid->n = ntok;
  int stride = 1;
  for (int i = 0; i < ntok; i++) {
    int dim = ntok - 1 - i, token = tok[i];
    egrid->sizes[dim] = size_of[token];
    egrid->strides[dim] = stride;
    egrid->bits[dim] = bit_of[token];
    strcpy(m->enames[dim], ename[token]);
    stride *= size_of[token];
  }
}

/* Megatron's rule reads the order string: does it end with pp (no order: is pp outermost)? */
static int order_ends_with_pp(const mpg_mesh *m, const mpg_spec *spec) {
  if (!spec->experts.order[0]) return strcmp(m->names[0], "pp") == 0;
  const char *dash = strrchr(spec->experts.order, '-');
  const char *last_token = dash ? dash + 1 : spec->experts.order;
  while (*last_token == ' ' || *last_token == '\t') last_token++;
  return strncmp(last_token, "pp", 2) == 0 &&
         strspn(last_token + 2, " \t") == strlen(last_token + 2);
}

/* With pp > 1: the expert grid's pipeline groups equal the mesh's, and Megatron's edp rule. */
static mpg_status check_expert_pp(const mpg_mesh *m, const mpg_spec *spec, mpg_srcpos at,
                                  const char *order_text, int pp_dim, int edp) {
  mpg_srcpos order_at = spec->experts.order_pos.line ? spec->experts.order_pos : at;
  char shape[256];
  size_t len = 0;
  for (int d = 0; d < m->ndims && len < sizeof shape; d++)
    len += (size_t)snprintf(shape + len, sizeof shape - len, "%s%s=%d", d ? " x " : "",
                            m->names[d], m->sizes[d]);
  const grid *egrid = &m->grids[1];
  int expert_stride = 0;
  for (int d = 0; d < egrid->n; d++)
    if (strcmp(m->enames[d], "pp") == 0) expert_stride = egrid->strides[d];
  if (expert_stride != m->strides[pp_dim])
    return mpg__fail_at(MPG_ERR_SPEC, spec->source, order_at,
                        "experts.order \"%s\": the expert grid's pipeline groups "
                        "differ from the mesh's (pp stride %d in the expert grid, %d in "
                        "the mesh %s); the pipeline groups of both must "
                        "be the same: place pp so that the product of the expert sizes "
                        "inside it equals that of the mesh dims inside pp (e.g. pp "
                        "outermost in both)",
                        order_text, expert_stride, m->strides[pp_dim], shape);
  int tp_cp = dim_size(m, "tp", NULL) * dim_size(m, "cp", NULL);
  int dp = m->world / (tp_cp * m->sizes[pp_dim]);
  if (!order_ends_with_pp(m, spec) && edp != dp)
    return mpg__fail_at(MPG_ERR_SPEC, spec->source, order_at,
                        "experts.order \"%s\": pp is not the outermost token, so the "
                        "expert data parallel size (edp = %d) must equal the mesh's "
                        "(dp = world / (tp x cp x pp) = %d) as Megatron requires; put pp "
                        "last (outermost) or choose experts.tp x experts.ep = %d",
                        order_text, edp, dp, tp_cp);
  return MPG_OK;
}

/* The expert mask bits' names and the expert dim sets (etp, ep, edp and their unions). */
static void add_expert_sets(mpg_mesh *m, const unsigned bit_of[MPG__TOK_COUNT]) {
  m->experts = 1;
  m->expert_bits = bit_of[MPG__TOK_TP] | bit_of[MPG__TOK_EP] | bit_of[MPG__TOK_DP];
  m->pp_bit = bit_of[MPG__TOK_PP];
  strcpy(m->bitnames[MPG__MASK_ETP], "etp");
  strcpy(m->bitnames[MPG__MASK_ETP + 1], "ep");
  strcpy(m->bitnames[MPG__MASK_ETP + 2], "edp");
  unsigned etp_bit = bit_of[MPG__TOK_TP], ep_bit = bit_of[MPG__TOK_EP];
  dimset_fill(m, &m->sets[m->nsets++], "etp", etp_bit);
  dimset_fill(m, &m->sets[m->nsets++], "ep", ep_bit);
  dimset_fill(m, &m->sets[m->nsets++], "edp", bit_of[MPG__TOK_DP]);
  dimset_fill(m, &m->sets[m->nsets++], "etp_ep", etp_bit | ep_bit);
  dimset_fill(m, &m->sets[m->nsets++], "etp_ep_pp", etp_bit | ep_bit | m->pp_bit);
}

/* The expert grid of a mesh whose dense dims are set (mpg_mesh_create). */
static mpg_status build_experts(mpg_mesh *m, const mpg_spec *spec) {
  int tok[4], ntok, named[MPG__TOK_COUNT];
  mpg_status st = mpg__expert_order(spec, tok, &ntok, named);
  if (st) return st;
  int pp_dim;
  int pp = dim_size(m, "pp", &pp_dim);
  mpg_srcpos at = spec->experts.ep_pos.line ? spec->experts.ep_pos : spec->experts.pos;
  int size_of[MPG__TOK_COUNT];
  if ((st = expert_sizes(m, spec, at, pp, size_of))) return st;
  char order_text[64];
  order_str(tok, ntok, order_text, sizeof order_text);
  if ((st = append_left_out(spec, named, size_of, tok, &ntok))) return st;
  unsigned bit_of[MPG__TOK_COUNT] = {1u << MPG__MASK_ETP, 0, 1u << (MPG__MASK_ETP + 1),
                                     1u << (MPG__MASK_ETP + 2),
                                     pp_dim >= 0 ? 1u << pp_dim : 0};
  fill_expert_grid(m, tok, ntok, size_of, bit_of);
  /* The pipeline groups must be the same in both grids: same pp stride. */
  if (pp > 1 && (st = check_expert_pp(m, spec, at, order_text, pp_dim, size_of[MPG__TOK_DP])))
    return st;
  add_expert_sets(m, bit_of);
  mpg__log(1, "mesh: expert grid %s = etp %d, ep %d, edp %d, pp %d", order_text,
           size_of[MPG__TOK_TP], size_of[MPG__TOK_EP], size_of[MPG__TOK_DP], pp);
  return MPG_OK;
}

mpg_status mpg_mesh_create(const mpg_spec *caller, int world_size,
                           mpg_mesh **out) {
  if (!out) return mpg__fail(MPG_ERR_INVALID, "mpg_mesh_create: out is NULL");
  *out = NULL;
  mpg_spec full = MPG_SPEC_INIT;
  mpg_status st = mpg__abi_in(&full, MPG__ABI_END(mpg_spec), caller, MPG_SPEC_MAGIC,
                              "mpg_mesh_create: spec", "MPG_SPEC_INIT");
  if (st) return st;
  const mpg_spec *spec = &full;
  st = mpg_spec_validate(spec);
  if (st) return st;
  int sizes[MPG_MAX_DIMS];
  st = resolve_sizes(spec, world_size, sizes);
  if (st) return st;
  mpg_mesh *m = calloc(1, sizeof *m);
  if (!m) return mpg__fail(MPG_ERR_NOMEM, "mpg_mesh_create: out of memory");
  m->ndims = spec->ndims;
  m->world = 1;
  for (int d = 0; d < m->ndims; d++) {
    strcpy(m->names[d], spec->dims[d].name);
    m->sizes[d] = sizes[d];
    m->world *= sizes[d];
  }
  int stride = 1;
  for (int d = m->ndims - 1; d >= 0; d--) {
    m->strides[d] = stride;
    stride *= m->sizes[d];
  }
  grid *g0 = &m->grids[0];
  g0->n = m->ndims;
  for (int d = 0; d < m->ndims; d++) {
    g0->sizes[d] = m->sizes[d];
    g0->strides[d] = m->strides[d];
    g0->bits[d] = 1u << d;
    strcpy(m->bitnames[d], m->names[d]);
  }
  for (int d = 0; d < m->ndims; d++)
    dimset_fill(m, &m->sets[m->nsets++], m->names[d], 1u << d);
  for (int k = 0; k < spec->nflatten; k++) {
    unsigned mask = 0;
    for (int i = 0; i < spec->flatten[k].ndims; i++)
      for (int d = 0; d < m->ndims; d++)
        if (strcmp(m->names[d], spec->flatten[k].dims[i]) == 0) mask |= 1u << d;
    dimset_fill(m, &m->sets[m->nsets++], spec->flatten[k].name, mask);
  }
  if (spec->experts.ep != 0 && (st = build_experts(m, spec))) {
    free(m);
    return st;
  }
  dimset_fill(m, &m->sets[m->nsets++], "world", (1u << m->ndims) - 1);
  mpg__log(1, "mesh: %d ranks, %d dims, %d dim sets", m->world, m->ndims,
           m->nsets);
  *out = m;
  return MPG_OK;
}

mpg_status mpg_mesh_destroy(mpg_mesh *mesh) {
  free(mesh);
  return MPG_OK;
}

int mpg_mesh_world_size(const mpg_mesh *mesh) { return mesh ? mesh->world : 0; }
int mpg_mesh_ndims(const mpg_mesh *mesh) { return mesh ? mesh->ndims : 0; }
int mpg_mesh_num_dimsets(const mpg_mesh *mesh) { return mesh ? mesh->nsets : 0; }

mpg_status mpg_mesh_dim(const mpg_mesh *mesh, int dim, const char **name,
                        int *size) {
  if (!mesh) return mpg__fail(MPG_ERR_INVALID, "mpg_mesh_dim: mesh is NULL");
  if (dim < 0 || dim >= mesh->ndims)
    return mpg__fail(MPG_ERR_RANGE, "mpg_mesh_dim: dim %d is outside 0..%d", dim,
                     mesh->ndims - 1);
  if (name) *name = mesh->names[dim];
  if (size) *size = mesh->sizes[dim];
  return MPG_OK;
}

/* The NOT_FOUND message for an unknown dim-set name. */
static mpg_status dimset_find_fail(const mpg_mesh *mesh, const char *name) {
  char known[1024];
  size_t n = 0;
  const char *cands[MPG__MAX_DIMSETS];
  for (int i = 0; i < mesh->nsets; i++) {
    cands[i] = mesh->sets[i].name;
    n += (size_t)snprintf(known + n, sizeof known - n, "%s%s", i ? ", " : "",
                          mesh->sets[i].name);
    if (n >= sizeof known) n = sizeof known - 1;
  }
  const char *c = mpg__closest(name, cands, mesh->nsets);
  return mpg__fail(MPG_ERR_NOT_FOUND,
                   "no dim or flattened set named \"%s\"%s%s%s; the mesh has %s",
                   name, c ? " (did you mean \"" : "", c ? c : "", c ? "\"?)" : "",
                   known);
}

mpg_status mpg_mesh_dimset_find(const mpg_mesh *mesh, const char *name,
                                int *dimset) {
  if (!mesh || !name || !dimset)
    return mpg__fail(MPG_ERR_INVALID, "mpg_mesh_dimset_find: NULL argument");
  for (int i = 0; i < mesh->nsets; i++)
    if (strcmp(mesh->sets[i].name, name) == 0) {
      *dimset = i;
      return MPG_OK;
    }
  return dimset_find_fail(mesh, name);
}

static mpg_status check_set(const mpg_mesh *mesh, int set, const char *fn) {
  if (!mesh) return mpg__fail(MPG_ERR_INVALID, "%s: mesh is NULL", fn);
  if (set < 0 || set >= mesh->nsets)
    return mpg__fail(MPG_ERR_RANGE, "%s: dim set %d is outside 0..%d", fn, set,
                     mesh->nsets - 1);
  return MPG_OK;
}

mpg_status mpg_mesh_dimset_info(const mpg_mesh *mesh, int set,
                                const char **name, int *group_size,
                                int *num_groups) {
  mpg_status st = check_set(mesh, set, "mpg_mesh_dimset_info");
  if (st) return st;
  const dimset *s = &mesh->sets[set];
  if (name) *name = s->name;
  if (group_size) *group_size = s->group_size;
  if (num_groups) *num_groups = s->num_groups;
  return MPG_OK;
}

mpg_status mpg_mesh_dimset_dims(const mpg_mesh *mesh, int set,
                                int dims[MPG_MAX_DIMS], int *ndims) {
  mpg_status st = check_set(mesh, set, "mpg_mesh_dimset_dims");
  if (st) return st;
  if (!dims || !ndims)
    return mpg__fail(MPG_ERR_INVALID, "mpg_mesh_dimset_dims: NULL argument");
  const dimset *s = &mesh->sets[set];
  /* Mask bits: the mesh's dims in mesh order, then etp, ep, edp, which
   * the API numbers ndims + 0, 1, 2. */
  int n = 0;
  for (int b = 0; b < MPG__MASK_BITS; b++)
    if (s->mask & (1u << b))
      dims[n++] = b < MPG__MASK_ETP ? b : mesh->ndims + (b - MPG__MASK_ETP);
  *ndims = n;
  return MPG_OK;
}

int mpg_mesh_expert_ndims(const mpg_mesh *mesh) {
  return mesh && mesh->experts ? mesh->grids[1].n : 0;
}

mpg_status mpg_mesh_expert_dim(const mpg_mesh *mesh, int dim, const char **name,
                               int *size) {
  if (!mesh) return mpg__fail(MPG_ERR_INVALID, "mpg_mesh_expert_dim: mesh is NULL");
  if (!mesh->experts)
    return mpg__fail(MPG_ERR_NOT_FOUND,
                     "mpg_mesh_expert_dim: the mesh has no expert grid (its spec has no "
                     "[experts] section; see mpg_spec_set_experts)");
  if (dim < 0 || dim >= mesh->grids[1].n)
    return mpg__fail(MPG_ERR_RANGE, "mpg_mesh_expert_dim: dim %d is outside 0..%d", dim,
                     mesh->grids[1].n - 1);
  if (name) *name = mesh->enames[dim];
  if (size) *size = mesh->grids[1].sizes[dim];
  return MPG_OK;
}

static mpg_status check_rank(const mpg_mesh *mesh, int rank, const char *fn) {
  if (rank < 0 || rank >= mesh->world)
    return mpg__fail(MPG_ERR_RANGE, "%s: rank %d is outside 0..%d", fn, rank,
                     mesh->world - 1);
  return MPG_OK;
}

mpg_status mpg_mesh_coord_of(const mpg_mesh *mesh, int rank, int coord[]) {
  if (!mesh || !coord)
    return mpg__fail(MPG_ERR_INVALID, "mpg_mesh_coord_of: NULL argument");
  mpg_status st = check_rank(mesh, rank, "mpg_mesh_coord_of");
  if (st) return st;
  for (int d = 0; d < mesh->ndims; d++)
    coord[d] = (rank / mesh->strides[d]) % mesh->sizes[d];
  return MPG_OK;
}

mpg_status mpg_mesh_rank_of(const mpg_mesh *mesh, const int coord[],
                            int *rank) {
  if (!mesh || !coord || !rank)
    return mpg__fail(MPG_ERR_INVALID, "mpg_mesh_rank_of: NULL argument");
  int r = 0;
  for (int d = 0; d < mesh->ndims; d++) {
    if (coord[d] < 0 || coord[d] >= mesh->sizes[d])
      return mpg__fail(MPG_ERR_RANGE,
                       "mpg_mesh_rank_of: coordinate %d of dim \"%s\" is "
                       "outside 0..%d",
                       coord[d], mesh->names[d], mesh->sizes[d] - 1);
    r += coord[d] * mesh->strides[d];
  }
  *rank = r;
  return MPG_OK;
}

mpg_status mpg_mesh_group_of(const mpg_mesh *mesh, int set, int rank,
                             int *group_index, int *position,
                             int *group_size) {
  mpg_status st = check_set(mesh, set, "mpg_mesh_group_of");
  if (st) return st;
  if ((st = check_rank(mesh, rank, "mpg_mesh_group_of"))) return st;
  const dimset *s = &mesh->sets[set];
  mpg__mesh_mask_place(mesh, s->mask, rank, group_index, position, NULL);
  if (group_size) *group_size = s->group_size;
  return MPG_OK;
}

/* Spread a row-major index over the listed dims of grid g into a rank
 * offset. */
static int spread(const grid *g, const int *dims, int n, int index) {
  int r = 0;
  for (int i = n - 1; i >= 0; i--) {
    int d = dims[i];
    r += (index % g->sizes[d]) * g->strides[d];
    index /= g->sizes[d];
  }
  return r;
}

mpg_status mpg_mesh_group_member(const mpg_mesh *mesh, int set, int group_index,
                               int position, int *rank) {
  mpg_status st = check_set(mesh, set, "mpg_mesh_group_member");
  if (st) return st;
  if (!rank) return mpg__fail(MPG_ERR_INVALID, "mpg_mesh_group_member: rank is NULL");
  const dimset *s = &mesh->sets[set];
  if (group_index < 0 || group_index >= s->num_groups)
    return mpg__fail(MPG_ERR_RANGE,
                     "mpg_mesh_group_member: group %d of \"%s\" is outside 0..%d",
                     group_index, s->name, s->num_groups - 1);
  if (position < 0 || position >= s->group_size)
    return mpg__fail(MPG_ERR_RANGE,
                     "mpg_mesh_group_member: position %d in \"%s\" is outside 0..%d",
                     position, s->name, s->group_size - 1);
  const grid *g = &mesh->grids[s->grid];
  *rank = spread(g, s->out, s->nout, group_index) + spread(g, s->in, s->nin, position);
  return MPG_OK;
}

mpg_status mpg_mesh_group_members(const mpg_mesh *mesh, int set,
                                  int group_index, int *ranks) {
  mpg_status st = check_set(mesh, set, "mpg_mesh_group_members");
  if (st) return st;
  if (!ranks)
    return mpg__fail(MPG_ERR_INVALID, "mpg_mesh_group_members: ranks is NULL");
  const dimset *s = &mesh->sets[set];
  if (group_index < 0 || group_index >= s->num_groups)
    return mpg__fail(MPG_ERR_RANGE,
                     "mpg_mesh_group_members: group %d of \"%s\" is outside 0..%d",
                     group_index, s->name, s->num_groups - 1);
  const grid *g = &mesh->grids[s->grid];
  int base = spread(g, s->out, s->nout, group_index);
  /* Odometer over the set's dims: one add per member. */
  int idx[MPG_MAX_DIMS] = {0};
  int r = base;
  for (int p = 0; p < s->group_size; p++) {
    ranks[p] = r;
    for (int i = s->nin - 1; i >= 0; i--) {
      int d = s->in[i];
      if (++idx[i] < g->sizes[d]) {
        r += g->strides[d];
        break;
      }
      r -= (g->sizes[d] - 1) * g->strides[d];
      idx[i] = 0;
    }
  }
  return MPG_OK;
}

/* ------------------------------------------------------------------ */
/* Internal: dim lists and groups over any mask (mesh_internal.h)      */
/* ------------------------------------------------------------------ */

mpg_status mpg__mesh_parse_dims(const mpg_mesh *mesh, const char *list,
                                int flags, const char *what, unsigned *mask,
                                int *dims, int *ndims) {
  int nd = 0;
  *mask = 0;
  const char *p = list;
  char name[MPG_NAME_MAX];
  int got;
  /* "" is no item at all; otherwise every item must be a name. */
  if (!*p) p = NULL;
  while ((got = mpg__list_next(&p, ',', name, sizeof name))) {
    if (got < 0)
      return mpg__fail(MPG_ERR_INVALID,
                       "%s \"%s\": name \"%s\" is longer than %d chars", what,
                       list, name, MPG_NAME_MAX - 1);
    if (!name[0])
      return mpg__fail(MPG_ERR_INVALID,
                       "%s \"%s\": empty name; expected comma-separated dim "
                       "or set names such as \"dp_cp,tp\"",
                       what, list);
    int set = -1;
    for (int i = 0; i < mesh->nsets; i++)
      if (strcmp(mesh->sets[i].name, name) == 0) set = i;
    if (set < 0) {
      if (flags & MPG__DIMS_SKIP_UNKNOWN) continue;
      dimset_find_fail(mesh, name);
      return mpg__fail_wrap(MPG_ERR_NOT_FOUND, "%s \"%s\"", what, list);
    }
    const dimset *s = &mesh->sets[set];
    if (dims && (s->mask & mesh->expert_bits)) {
      if (flags & MPG__DIMS_SKIP_UNKNOWN) continue;
      return mpg__fail(MPG_ERR_INVALID,
                       "%s \"%s\": \"%s\" is a dim set of the expert grid; only the "
                       "mesh's dims (%s) are allowed here",
                       what, list, name, mesh->ndims ? mesh->names[0] : "");
    }
    /* Bits in mesh order (then etp, ep, edp), each once. */
    for (int b = 0; b < MPG__MASK_BITS; b++) {
      unsigned bit = 1u << b;
      if (!(s->mask & bit) || (*mask & bit)) continue;
      *mask |= bit;
      if (dims) dims[nd] = b;
      nd++;
    }
  }
  if (ndims) *ndims = nd;
  if ((*mask & mesh->expert_bits) && (*mask & ~mesh->expert_bits & ~mesh->pp_bit)) {
    char dense[256], expert[128];
    mpg__mesh_mask_names(mesh, *mask & ~mesh->expert_bits & ~mesh->pp_bit, ", ", dense,
                         sizeof dense);
    mpg__mesh_mask_names(mesh, *mask & mesh->expert_bits, ", ", expert, sizeof expert);
    return mpg__fail(MPG_ERR_INVALID,
                     "%s \"%s\": names dims of the mesh (%s) and of the expert grid "
                     "(%s); a group lies in one grid (only pp is in both): name mesh "
                     "dims only, or etp, ep, edp and pp only",
                     what, list, dense, expert);
  }
  if (!*mask && mesh->ndims > 0 && !(flags & MPG__DIMS_ALLOW_EMPTY) &&
      !(flags & MPG__DIMS_SKIP_UNKNOWN))
    return mpg__fail(MPG_ERR_INVALID,
                     "%s \"%s\": no dims named; expected comma-separated dim "
                     "or set names such as \"dp_cp,tp\"",
                     what, list);
  return MPG_OK;
}

unsigned mpg__mesh_mask_slot(const mpg_mesh *mesh, unsigned mask) {
  if (!(mask & MPG__MASK_EXPERT)) return mask;
  unsigned expert = (mask & MPG__MASK_EXPERT) >> MPG__MASK_ETP;
  return (1u << MPG_MAX_DIMS) + 2u * expert + ((mask & mesh->pp_bit) ? 1u : 0u);
}

unsigned mpg__mesh_slot_mask(const mpg_mesh *mesh, unsigned slot) {
  if (slot < (1u << MPG_MAX_DIMS)) return slot;
  unsigned e = slot - (1u << MPG_MAX_DIMS);
  return ((e >> 1) << MPG__MASK_ETP) | ((e & 1u) ? mesh->pp_bit : 0u);
}

unsigned mpg__mesh_dimset_mask(const mpg_mesh *mesh, int set) {
  return mesh && set >= 0 && set < mesh->nsets ? mesh->sets[set].mask : 0;
}

void mpg__mesh_mask_place(const mpg_mesh *mesh, unsigned mask, int rank,
                          int *index, int *position, int *size) {
  const grid *g = &mesh->grids[mask_grid(mesh, mask)];
  int gi = 0, pos = 0, n = 1;
  for (int d = 0; d < g->n; d++) {
    int c = (rank / g->strides[d]) % g->sizes[d];
    if (mask & g->bits[d]) {
      pos = pos * g->sizes[d] + c;
      n *= g->sizes[d];
    } else {
      gi = gi * g->sizes[d] + c;
    }
  }
  if (index) *index = gi;
  if (position) *position = pos;
  if (size) *size = n;
}

int mpg__mesh_mask_member(const mpg_mesh *mesh, unsigned mask, int rank,
                          int position) {
  const grid *g = &mesh->grids[mask_grid(mesh, mask)];
  int r = 0;
  for (int d = g->n - 1; d >= 0; d--) {
    int c = (rank / g->strides[d]) % g->sizes[d];
    if (mask & g->bits[d]) {
      c = position % g->sizes[d];
      position /= g->sizes[d];
    }
    r += c * g->strides[d];
  }
  return r;
}

void mpg__mesh_mask_names(const mpg_mesh *mesh, unsigned mask,
                          const char *sep, char *buf, size_t cap) {
  size_t k = 0;
  buf[0] = '\0';
  for (int b = 0; b < MPG__MASK_BITS; b++) {
    if (!(mask & (1u << b)) || !mesh->bitnames[b][0]) continue;
    if (k < cap)
      k += (size_t)snprintf(buf + k, cap - k, "%s%s", k ? sep : "", mesh->bitnames[b]);
  }
}

void mpg__mesh_text(const mpg_mesh *mesh, char *buf, size_t cap) {
  size_t len = 0;
  if (!cap) return;
  buf[0] = 0;
  for (int d = 0; d < mpg_mesh_ndims(mesh) && len < cap; d++) {
    const char *name = "";
    int size = 0;
    (void)mpg_mesh_dim(mesh, d, &name, &size);
    len += (size_t)snprintf(buf + len, cap - len, "%s%s=%d", d ? "," : "", name, size);
  }
  for (int d = 0; d < mpg_mesh_expert_ndims(mesh) && len < cap; d++) {
    const char *name = "";
    int size = 0;
    (void)mpg_mesh_expert_dim(mesh, d, &name, &size);
    len += (size_t)snprintf(buf + len, cap - len, "%s%s=%d", d ? "," : " experts:", name, size);
  }
}
