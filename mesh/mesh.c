/* The named N-D mesh: row-major rank layout, dim sets and their groups.
 * Every lookup is arithmetic over at most MPG_MAX_DIMS strides, so memory
 * is O(ndims) whatever the world size. */
#include "mesh_internal.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct dimset {
  char name[MPG_NAME_MAX];
  int nin;                  /* dims inside the set, mesh order */
  int in[MPG_MAX_DIMS];
  int nout;                 /* dims outside the set, mesh order */
  int out[MPG_MAX_DIMS];
  unsigned mask;            /* bit d: mesh dim d is inside */
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
  dimset sets[MPG_MAX_DIMS + MPG_MAX_FLATTEN + 1];
};

static void dimset_fill(mpg_mesh *m, dimset *s, const char *name,
                        unsigned mask) {
  memset(s, 0, sizeof *s);
  strcpy(s->name, name);
  s->group_size = 1;
  s->mask = mask;
  for (int d = 0; d < m->ndims; d++) {
    if (mask & (1u << d)) {
      s->in[s->nin++] = d;
      s->group_size *= m->sizes[d];
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
  for (int d = 0; d < m->ndims; d++)
    dimset_fill(m, &m->sets[m->nsets++], m->names[d], 1u << d);
  for (int k = 0; k < spec->nflatten; k++) {
    unsigned mask = 0;
    for (int i = 0; i < spec->flatten[k].ndims; i++)
      for (int d = 0; d < m->ndims; d++)
        if (strcmp(m->names[d], spec->flatten[k].dims[i]) == 0) mask |= 1u << d;
    dimset_fill(m, &m->sets[m->nsets++], spec->flatten[k].name, mask);
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
  const char *cands[MPG_MAX_DIMS + MPG_MAX_FLATTEN + 1];
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
  memcpy(dims, s->in, sizeof(int) * (size_t)s->nin);
  *ndims = s->nin;
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

/* Spread a row-major index over the listed dims into a rank offset. */
static int spread(const mpg_mesh *mesh, const int *dims, int n, int index) {
  int r = 0;
  for (int i = n - 1; i >= 0; i--) {
    int d = dims[i];
    r += (index % mesh->sizes[d]) * mesh->strides[d];
    index /= mesh->sizes[d];
  }
  return r;
}

mpg_status mpg_mesh_group_rank(const mpg_mesh *mesh, int set, int group_index,
                               int position, int *rank) {
  mpg_status st = check_set(mesh, set, "mpg_mesh_group_rank");
  if (st) return st;
  if (!rank) return mpg__fail(MPG_ERR_INVALID, "mpg_mesh_group_rank: rank is NULL");
  const dimset *s = &mesh->sets[set];
  if (group_index < 0 || group_index >= s->num_groups)
    return mpg__fail(MPG_ERR_RANGE,
                     "mpg_mesh_group_rank: group %d of \"%s\" is outside 0..%d",
                     group_index, s->name, s->num_groups - 1);
  if (position < 0 || position >= s->group_size)
    return mpg__fail(MPG_ERR_RANGE,
                     "mpg_mesh_group_rank: position %d in \"%s\" is outside 0..%d",
                     position, s->name, s->group_size - 1);
  *rank = spread(mesh, s->out, s->nout, group_index) +
          spread(mesh, s->in, s->nin, position);
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
  int base = spread(mesh, s->out, s->nout, group_index);
  /* Odometer over the set's dims: one add per member. */
  int idx[MPG_MAX_DIMS] = {0};
  int r = base;
  for (int p = 0; p < s->group_size; p++) {
    ranks[p] = r;
    for (int i = s->nin - 1; i >= 0; i--) {
      int d = s->in[i];
      if (++idx[i] < mesh->sizes[d]) {
        r += mesh->strides[d];
        break;
      }
      r -= (mesh->sizes[d] - 1) * mesh->strides[d];
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
    for (int i = 0; i < s->nin; i++) {
      int d = s->in[i];
      if (*mask & (1u << d)) continue;
      *mask |= 1u << d;
      if (dims) dims[nd] = d;
      nd++;
    }
  }
  if (ndims) *ndims = nd;
  if (!*mask && mesh->ndims > 0 && !(flags & MPG__DIMS_ALLOW_EMPTY) &&
      !(flags & MPG__DIMS_SKIP_UNKNOWN))
    return mpg__fail(MPG_ERR_INVALID,
                     "%s \"%s\": no dims named; expected comma-separated dim "
                     "or set names such as \"dp_cp,tp\"",
                     what, list);
  return MPG_OK;
}

unsigned mpg__mesh_dimset_mask(const mpg_mesh *mesh, int set) {
  return mesh && set >= 0 && set < mesh->nsets ? mesh->sets[set].mask : 0;
}

void mpg__mesh_mask_place(const mpg_mesh *mesh, unsigned mask, int rank,
                          int *index, int *position, int *size) {
  int gi = 0, pos = 0, n = 1;
  for (int d = 0; d < mesh->ndims; d++) {
    int c = (rank / mesh->strides[d]) % mesh->sizes[d];
    if (mask & (1u << d)) {
      pos = pos * mesh->sizes[d] + c;
      n *= mesh->sizes[d];
    } else {
      gi = gi * mesh->sizes[d] + c;
    }
  }
  if (index) *index = gi;
  if (position) *position = pos;
  if (size) *size = n;
}

int mpg__mesh_mask_member(const mpg_mesh *mesh, unsigned mask, int rank,
                          int position) {
  int r = 0;
  for (int d = mesh->ndims - 1; d >= 0; d--) {
    int c = (rank / mesh->strides[d]) % mesh->sizes[d];
    if (mask & (1u << d)) {
      c = position % mesh->sizes[d];
      position /= mesh->sizes[d];
    }
    r += c * mesh->strides[d];
  }
  return r;
}

void mpg__mesh_mask_names(const mpg_mesh *mesh, unsigned mask,
                          const char *sep, char *buf, size_t cap) {
  size_t k = 0;
  buf[0] = '\0';
  for (int d = 0; d < mesh->ndims; d++) {
    if (!(mask & (1u << d))) continue;
    if (k < cap)
      k += (size_t)snprintf(buf + k, cap - k, "%s%s", k ? sep : "", mesh->names[d]);
  }
}
