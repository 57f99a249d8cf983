/* Property tests over random meshes.
 *
 * A fixed-seed splitmix64 generator draws meshes of 1 to 6 dims (world at
 * most 4096), random names and 0 to 4 random flattened sets.  For every dim
 * set the library's groups are checked against laws that hold for any mesh
 * and against an independent brute-force reference: bucket the ranks by
 * their coordinates outside the set, scanning ranks in increasing order. */
#include <criterion/criterion.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "meshpg.h"

#define SEED 0x6d65736870677331ull /* "meshpgs1" */
#define NUM_MESHES 2000
#define MAX_WORLD 4096

/* ------------------------------------------------------------------------ */
/* PRNG                                                                      */
/* ------------------------------------------------------------------------ */

static uint64_t rng_state;

static uint64_t splitmix64(void) {
  uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* Uniform in [lo, hi]. */
static int rnd(int lo, int hi) {
  return lo + (int)(splitmix64() % (uint64_t)(hi - lo + 1));
}

/* ------------------------------------------------------------------------ */
/* Random meshes                                                             */
/* ------------------------------------------------------------------------ */

typedef struct rmesh {
  int ndims;
  char names[MPG_MAX_DIMS][MPG_NAME_MAX];
  int sizes[MPG_MAX_DIMS];
  int world;
  int nflat;
  char flat_names[4][MPG_NAME_MAX];
  unsigned flat_mask[4];
  char mesh_str[512];  /* what went to mpg_spec_set_mesh */
  int world_arg;       /* what went to mpg_mesh_create */
  char desc[1024];     /* for failure messages */
} rmesh;

static int name_taken(const rmesh *rm, const char *name, int nd, int nf) {
  if (strcmp(name, "world") == 0) return 1;
  for (int i = 0; i < nd; i++)
    if (strcmp(rm->names[i], name) == 0) return 1;
  for (int i = 0; i < nf; i++)
    if (strcmp(rm->flat_names[i], name) == 0) return 1;
  return 0;
}

/* A random valid name: [A-Za-z_][A-Za-z0-9_]*, 1 to 31 chars (mostly short). */
static void random_name(char *out) {
  static const char first[] =
      "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_";
  static const char rest[] =
      "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_0123456789";
  int len = rnd(0, 9) == 0 ? rnd(1, MPG_NAME_MAX - 1) : rnd(1, 4);
  out[0] = first[rnd(0, (int)sizeof first - 2)];
  for (int i = 1; i < len; i++) out[i] = rest[rnd(0, (int)sizeof rest - 2)];
  out[len] = '\0';
}

static void random_mesh(rmesh *rm) {
  memset(rm, 0, sizeof *rm);
  rm->ndims = rnd(1, 6);
  rm->world = 1;
  for (int d = 0; d < rm->ndims; d++) {
    do random_name(rm->names[d]);
    while (name_taken(rm, rm->names[d], d, 0));
    int cap = MAX_WORLD / rm->world;
    if (cap > 8) cap = 8;
    /* Size 1 dims are common in practice (tp=1); keep them in the mix. */
    rm->sizes[d] = rnd(0, 5) == 0 ? 1 : rnd(1, cap);
    rm->world *= rm->sizes[d];
  }
  rm->nflat = rnd(0, 4);
  for (int k = 0; k < rm->nflat; k++) {
    do random_name(rm->flat_names[k]);
    while (name_taken(rm, rm->flat_names[k], rm->ndims, k));
    rm->flat_mask[k] = (unsigned)rnd(1, (1 << rm->ndims) - 1);
  }
  /* One dim may be inferred; the world may be given or left to the product. */
  int auto_dim = rnd(0, 3) == 0 ? rnd(0, rm->ndims - 1) : -1;
  size_t n = 0;
  for (int d = 0; d < rm->ndims; d++) {
    if (d == auto_dim)
      n += (size_t)snprintf(rm->mesh_str + n, sizeof rm->mesh_str - n,
                            "%s%s=%s", d ? "," : "", rm->names[d],
                            rnd(0, 1) ? "auto" : "-1");
    else
      n += (size_t)snprintf(rm->mesh_str + n, sizeof rm->mesh_str - n,
                            "%s%s=%d", d ? "," : "", rm->names[d],
                            rm->sizes[d]);
  }
  rm->world_arg = (auto_dim >= 0 || rnd(0, 1)) ? rm->world : 0;
  n = (size_t)snprintf(rm->desc, sizeof rm->desc, "mesh \"%s\" world %d",
                       rm->mesh_str, rm->world_arg);
  for (int k = 0; k < rm->nflat && n < sizeof rm->desc; k++)
    n += (size_t)snprintf(rm->desc + n, sizeof rm->desc - n, " %s=%#x",
                          rm->flat_names[k], rm->flat_mask[k]);
}

/* "d1,d2" in mesh order, sometimes with blanks around the commas. */
static void flat_list(const rmesh *rm, unsigned mask, char *out, size_t cap) {
  size_t n = 0;
  out[0] = '\0';
  int first = 1;
  for (int d = 0; d < rm->ndims; d++) {
    if (!(mask & (1u << d))) continue;
    n += (size_t)snprintf(out + n, cap - n, "%s%s", first ? "" :
                          (rnd(0, 3) == 0 ? " , " : ","), rm->names[d]);
    first = 0;
  }
}

static mpg_mesh *build(const rmesh *rm) {
  mpg_spec spec = MPG_SPEC_INIT;
  cr_assert_eq(mpg_spec_init(&spec), MPG_OK);
  mpg_status st = mpg_spec_set_mesh(&spec, rm->mesh_str);
  cr_assert_eq(st, MPG_OK, "%s: set_mesh: %s", rm->desc, mpg_last_error());
  for (int k = 0; k < rm->nflat; k++) {
    char list[512];
    flat_list(rm, rm->flat_mask[k], list, sizeof list);
    st = mpg_spec_add_flatten(&spec, rm->flat_names[k], list);
    cr_assert_eq(st, MPG_OK, "%s: add_flatten %s=%s: %s", rm->desc,
                 rm->flat_names[k], list, mpg_last_error());
  }
  st = mpg_spec_validate(&spec);
  cr_assert_eq(st, MPG_OK, "%s: validate: %s", rm->desc, mpg_last_error());
  mpg_mesh *m = NULL;
  st = mpg_mesh_create(&spec, rm->world_arg, &m);
  cr_assert_eq(st, MPG_OK, "%s: create: %s", rm->desc, mpg_last_error());
  cr_assert_not_null(m);
  return m;
}

/* ------------------------------------------------------------------------ */
/* Checks                                                                    */
/* ------------------------------------------------------------------------ */

/* Only fail-paths call into Criterion, so millions of checks stay cheap. */
#define CHECK(cond, ...)                                                       \
  do {                                                                         \
    if (!(cond)) cr_assert_fail(__VA_ARGS__);                                  \
  } while (0)

typedef struct scratch {
  int coord[MAX_WORLD][MPG_MAX_DIMS]; /* reference coordinates */
  int members[MAX_WORLD];             /* library: group g at g*gsize */
  int ref[MAX_WORLD];                 /* reference, same layout */
  int seen[MAX_WORLD];
  int bucket_of_key[MAX_WORLD];
  int bucket_fill[MAX_WORLD];
} scratch;

/* The mesh's dims, sizes, world, and rank <-> coordinate. */
static void check_layout(const rmesh *rm, const mpg_mesh *m, scratch *s) {
  CHECK(mpg_mesh_world_size(m) == rm->world, "%s: world %d, want %d",
        rm->desc, mpg_mesh_world_size(m), rm->world);
  CHECK(mpg_mesh_ndims(m) == rm->ndims, "%s: ndims %d", rm->desc,
        mpg_mesh_ndims(m));
  CHECK(mpg_mesh_num_dimsets(m) == rm->ndims + rm->nflat + 1,
        "%s: %d dim sets", rm->desc, mpg_mesh_num_dimsets(m));
  for (int d = 0; d < rm->ndims; d++) {
    const char *name = NULL;
    int size = -1;
    CHECK(mpg_mesh_dim(m, d, &name, &size) == MPG_OK, "%s: dim %d: %s",
          rm->desc, d, mpg_last_error());
    CHECK(strcmp(name, rm->names[d]) == 0, "%s: dim %d is %s", rm->desc, d,
          name);
    CHECK(size == rm->sizes[d], "%s: dim %s has size %d, want %d", rm->desc,
          name, size, rm->sizes[d]);
  }
  /* Reference coordinates: count up an odometer, last dim fastest. */
  int odo[MPG_MAX_DIMS] = {0};
  for (int r = 0; r < rm->world; r++) {
    memcpy(s->coord[r], odo, sizeof odo);
    for (int d = rm->ndims - 1; d >= 0; d--) {
      if (++odo[d] < rm->sizes[d]) break;
      odo[d] = 0;
    }
  }
  for (int r = 0; r < rm->world; r++) {
    int c[MPG_MAX_DIMS], back = -1;
    CHECK(mpg_mesh_coord_of(m, r, c) == MPG_OK, "%s: coord_of(%d): %s",
          rm->desc, r, mpg_last_error());
    for (int d = 0; d < rm->ndims; d++) {
      CHECK(c[d] >= 0 && c[d] < rm->sizes[d],
            "%s: rank %d coord[%d] = %d out of range", rm->desc, r, d, c[d]);
      CHECK(c[d] == s->coord[r][d], "%s: rank %d coord[%d] = %d, want %d",
            rm->desc, r, d, c[d], s->coord[r][d]);
    }
    CHECK(mpg_mesh_rank_of(m, c, &back) == MPG_OK, "%s: rank_of: %s",
          rm->desc, mpg_last_error());
    CHECK(back == r, "%s: rank %d -> coord -> rank %d", rm->desc, r, back);
  }
}

/* Everything about one dim set whose dims are `mask`. */
static void check_set(const rmesh *rm, const mpg_mesh *m, scratch *s, int set,
                      const char *want_name, unsigned mask) {
  const char *name = NULL;
  int gsize = -1, ngroups = -1;
  CHECK(mpg_mesh_dimset_info(m, set, &name, &gsize, &ngroups) == MPG_OK,
        "%s: dimset_info(%d): %s", rm->desc, set, mpg_last_error());
  CHECK(strcmp(name, want_name) == 0, "%s: set %d is %s, want %s", rm->desc,
        set, name, want_name);
  int found = -1;
  CHECK(mpg_mesh_dimset_find(m, want_name, &found) == MPG_OK && found == set,
        "%s: dimset_find(%s) = %d, want %d", rm->desc, want_name, found, set);

  /* dims of the set, mesh order */
  int dims[MPG_MAX_DIMS], nd = -1, want_gsize = 1, k = 0;
  CHECK(mpg_mesh_dimset_dims(m, set, dims, &nd) == MPG_OK,
        "%s: dimset_dims(%s): %s", rm->desc, name, mpg_last_error());
  for (int d = 0; d < rm->ndims; d++)
    if (mask & (1u << d)) {
      CHECK(k < nd && dims[k] == d, "%s: set %s: dims[%d] wrong", rm->desc,
            name, k);
      k++;
      want_gsize *= rm->sizes[d];
    }
  CHECK(nd == k, "%s: set %s has %d dims, want %d", rm->desc, name, nd, k);

  /* size laws */
  CHECK(gsize == want_gsize, "%s: set %s: group size %d, want %d", rm->desc,
        name, gsize, want_gsize);
  CHECK(ngroups * gsize == rm->world, "%s: set %s: %d groups x %d != %d",
        rm->desc, name, ngroups, gsize, rm->world);

  /* the groups partition the world */
  memset(s->seen, 0, sizeof(int) * (size_t)rm->world);
  for (int g = 0; g < ngroups; g++) {
    int *mem = &s->members[g * gsize];
    CHECK(mpg_mesh_group_members(m, set, g, mem) == MPG_OK,
          "%s: group_members(%s, %d): %s", rm->desc, name, g, mpg_last_error());
    for (int p = 0; p < gsize; p++) {
      CHECK(mem[p] >= 0 && mem[p] < rm->world,
            "%s: set %s group %d has rank %d", rm->desc, name, g, mem[p]);
      CHECK(++s->seen[mem[p]] == 1, "%s: set %s: rank %d in two groups",
            rm->desc, name, mem[p]);
    }
  }
  for (int r = 0; r < rm->world; r++)
    CHECK(s->seen[r] == 1, "%s: set %s: rank %d in no group", rm->desc, name,
          r);

  /* lookup by rank agrees with the enumeration */
  for (int r = 0; r < rm->world; r++) {
    int gi = -1, pos = -1, gs = -1, back = -1;
    CHECK(mpg_mesh_group_of(m, set, r, &gi, &pos, &gs) == MPG_OK,
          "%s: group_of(%s, %d): %s", rm->desc, name, r, mpg_last_error());
    CHECK(gi >= 0 && gi < ngroups && pos >= 0 && pos < gsize && gs == gsize,
          "%s: set %s: rank %d -> group %d position %d size %d", rm->desc,
          name, r, gi, pos, gs);
    CHECK(s->members[gi * gsize + pos] == r,
          "%s: set %s: rank %d -> (%d, %d) but members say %d", rm->desc,
          name, r, gi, pos, s->members[gi * gsize + pos]);
    CHECK(mpg_mesh_group_member(m, set, gi, pos, &back) == MPG_OK && back == r,
          "%s: set %s: group_rank(%d, %d) = %d, want %d", rm->desc, name, gi,
          pos, back, r);
  }

  /* Brute-force reference.  Key = the rank's coordinates outside the set
   * (any injective encoding will do).  Scanning ranks upwards, a new key
   * opens the next group (so groups are ordered by their first member) and
   * each rank is appended (so members are sorted by rank, which in a
   * row-major layout is row-major over the set's own coordinates). */
  for (int i = 0; i < ngroups; i++) s->bucket_of_key[i] = -1;
  int nb = 0;
  for (int r = 0; r < rm->world; r++) {
    int key = 0;
    for (int d = 0; d < rm->ndims; d++)
      if (!(mask & (1u << d))) key = key * rm->sizes[d] + s->coord[r][d];
    CHECK(key < ngroups, "%s: set %s: key %d", rm->desc, name, key);
    if (s->bucket_of_key[key] < 0) {
      CHECK(nb < ngroups, "%s: set %s: more than %d groups", rm->desc, name,
            ngroups);
      s->bucket_fill[nb] = 0;
      s->bucket_of_key[key] = nb++;
    }
    int b = s->bucket_of_key[key];
    CHECK(s->bucket_fill[b] < gsize, "%s: set %s: group %d overfull",
          rm->desc, name, b);
    s->ref[b * gsize + s->bucket_fill[b]++] = r;
  }
  CHECK(nb == ngroups, "%s: set %s: reference has %d groups, library %d",
        rm->desc, name, nb, ngroups);
  for (int i = 0; i < rm->world; i++)
    CHECK(s->members[i] == s->ref[i],
          "%s: set %s: group %d position %d is rank %d, reference says %d",
          rm->desc, name, i / gsize, i % gsize, s->members[i], s->ref[i]);
  /* Reference positions really are row-major over the set's coordinates. */
  for (int g = 0; g < ngroups; g++)
    for (int p = 0; p < gsize; p++) {
      const int *c = s->coord[s->ref[g * gsize + p]];
      int rm_pos = 0;
      for (int d = 0; d < rm->ndims; d++)
        if (mask & (1u << d)) rm_pos = rm_pos * rm->sizes[d] + c[d];
      CHECK(rm_pos == p, "%s: set %s: reference position %d is row-major %d",
            rm->desc, name, p, rm_pos);
    }
}

Test(props, random_meshes, .timeout = 240) {
  rng_state = SEED;
  scratch *s = malloc(sizeof *s);
  cr_assert_not_null(s);
  long sets_checked = 0, ranks_checked = 0;
  for (int i = 0; i < NUM_MESHES; i++) {
    rmesh rm;
    random_mesh(&rm);
    mpg_mesh *m = build(&rm);
    check_layout(&rm, m, s);
    int set = 0;
    for (int d = 0; d < rm.ndims; d++, set++)
      check_set(&rm, m, s, set, rm.names[d], 1u << d);
    for (int k = 0; k < rm.nflat; k++, set++)
      check_set(&rm, m, s, set, rm.flat_names[k], rm.flat_mask[k]);
    check_set(&rm, m, s, set, "world", (1u << rm.ndims) - 1);
    sets_checked += set + 1;
    ranks_checked += (long)rm.world * (set + 1);
    mpg_mesh_destroy(m);
  }
  free(s);
  cr_assert_geq(sets_checked, NUM_MESHES);
  cr_log_info("seed %#llx: %d meshes, %ld dim sets, %ld rank lookups",
              (unsigned long long)SEED, NUM_MESHES, sets_checked,
              ranks_checked);
}

/* A sanity check on the generator itself: it covers every dim count, sizes
 * of 1, inferred dims, world 0 and flattened sets, so the property test
 * above cannot silently degenerate. */
Test(props, generator_coverage) {
  rng_state = SEED;
  int by_ndims[7] = {0}, ones = 0, autos = 0, world0 = 0, flats = 0,
      big = 0, long_names = 0;
  for (int i = 0; i < NUM_MESHES; i++) {
    rmesh rm;
    random_mesh(&rm);
    cr_assert(rm.world >= 1 && rm.world <= MAX_WORLD, "%s", rm.desc);
    by_ndims[rm.ndims]++;
    for (int d = 0; d < rm.ndims; d++) {
      ones += rm.sizes[d] == 1;
      long_names += strlen(rm.names[d]) > 8;
    }
    autos += strstr(rm.mesh_str, "=-1") || strstr(rm.mesh_str, "=auto");
    world0 += rm.world_arg == 0;
    flats += rm.nflat;
    big += rm.world >= 512;
  }
  for (int n = 1; n <= 6; n++)
    cr_assert_gt(by_ndims[n], 50, "only %d meshes with %d dims", by_ndims[n],
                 n);
  cr_assert_gt(ones, 100);
  cr_assert_gt(autos, 100);
  cr_assert_gt(world0, 100);
  cr_assert_gt(flats, 1000);
  cr_assert_gt(big, 50);
  cr_assert_gt(long_names, 50);
}

/* mpg_spec_apply_order: a random permutation, read innermost first, lands
 * reversed in the mesh dims, carrying each dim's size (and the flattened
 * sets stay as they were). */
Test(props, apply_order_reverses) {
  rng_state = SEED ^ 0x6f72646572ull;
  for (int i = 0; i < 2000; i++) {
    int n = rnd(1, MPG_MAX_DIMS);
    mpg_spec spec = MPG_SPEC_INIT;
    cr_assert_eq(mpg_spec_init(&spec), MPG_OK);
    char names[MPG_MAX_DIMS][MPG_NAME_MAX], mesh[512] = "";
    int sizes[MPG_MAX_DIMS];
    size_t len = 0;
    rmesh taken;
    memset(&taken, 0, sizeof taken);
    for (int d = 0; d < n; d++) {
      do random_name(names[d]);
      while (name_taken(&taken, names[d], d, 0));
      strcpy(taken.names[d], names[d]);
      sizes[d] = rnd(0, 4) == 0 ? -1 : rnd(1, 9);
      len += (size_t)snprintf(mesh + len, sizeof mesh - len, "%s%s=%d",
                              d ? "," : "", names[d], sizes[d]);
    }
    cr_assert_eq(mpg_spec_set_mesh(&spec, mesh), MPG_OK, "%s: %s", mesh,
                 mpg_last_error());
    cr_assert_eq(mpg_spec_add_flatten(&spec, "the_flat", names[0]), MPG_OK);

    /* Fisher-Yates */
    int perm[MPG_MAX_DIMS];
    for (int d = 0; d < n; d++) perm[d] = d;
    for (int d = n - 1; d > 0; d--) {
      int j = rnd(0, d), t = perm[d];
      perm[d] = perm[j];
      perm[j] = t;
    }
    char order[512] = "";
    len = 0;
    for (int k = 0; k < n; k++)
      len += (size_t)snprintf(order + len, sizeof order - len, "%s%s",
                              k ? (rnd(0, 5) == 0 ? " - " : "-") : "",
                              names[perm[k]]);
    mpg_status st = mpg_spec_apply_order(&spec, order);
    cr_assert_eq(st, MPG_OK, "mesh %s order %s: %s", mesh, order,
                 mpg_last_error());
    cr_assert_eq(spec.ndims, n);
    for (int k = 0; k < n; k++) {
      const mpg_dim *got = &spec.dims[n - 1 - k];
      cr_assert_str_eq(got->name, names[perm[k]],
                       "mesh %s order %s: dims[%d] = %s, want %s", mesh, order,
                       n - 1 - k, got->name, names[perm[k]]);
      cr_assert_eq(got->size, sizes[perm[k]],
                   "mesh %s order %s: %s has size %d, want %d", mesh, order,
                   got->name, got->size, sizes[perm[k]]);
    }
    cr_assert_eq(spec.nflatten, 1);
    cr_assert_str_eq(spec.flatten[0].name, "the_flat");

    /* The current dims read innermost first is the identity order. */
    mpg_spec before = spec;
    len = 0;
    order[0] = '\0';
    for (int d = n - 1; d >= 0; d--)
      len += (size_t)snprintf(order + len, sizeof order - len, "%s%s",
                              d != n - 1 ? "-" : "", spec.dims[d].name);
    cr_assert_eq(mpg_spec_apply_order(&spec, order), MPG_OK, "%s: %s", order,
                 mpg_last_error());
    for (int d = 0; d < n; d++) {
      cr_assert_str_eq(spec.dims[d].name, before.dims[d].name);
      cr_assert_eq(spec.dims[d].size, before.dims[d].size);
    }

    /* Dropping a dim from the order is an error naming it, and leaves the
     * spec alone. */
    if (n > 1) {
      int drop = rnd(0, n - 1);
      len = 0;
      order[0] = '\0';
      for (int k = 0; k < n; k++)
        if (k != drop)
          len += (size_t)snprintf(order + len, sizeof order - len, "%s%s",
                                  len ? "-" : "", names[perm[k]]);
      cr_assert_eq(mpg_spec_apply_order(&spec, order), MPG_ERR_SPEC,
                   "order %s drops %s", order, names[perm[drop]]);
      char want[64];
      snprintf(want, sizeof want, "\"%s\" of the mesh is missing",
               names[perm[drop]]);
      cr_assert(strstr(mpg_last_error(), want) != NULL, "%s", mpg_last_error());
      for (int d = 0; d < n; d++)
        cr_assert_str_eq(spec.dims[d].name, before.dims[d].name);
    }
  }
}

/* A mesh reordered by a random Megatron order string has the groups that
 * Megatron's generate_masked_orthogonal_rank_groups computes: strides are
 * prefix products in order-string order (innermost first), and both the
 * rank in a group and the group index decompose innermost-first. */
static void megatron_groups(int n, const int *psize, unsigned mask, int world,
                            int *out) {
  int stride[MPG_MAX_DIMS], acc = 1;
  for (int i = 0; i < n; i++) stride[i] = acc, acc *= psize[i];
  int gsize = 1;
  for (int i = 0; i < n; i++)
    if (mask & (1u << i)) gsize *= psize[i];
  int ngroups = world / gsize;
  for (int g = 0; g < ngroups; g++)
    for (int p = 0; p < gsize; p++) {
      int rank = 0, gi = g, pi = p;
      for (int i = 0; i < n; i++) {
        if (mask & (1u << i)) {
          rank += (pi % psize[i]) * stride[i];
          pi /= psize[i];
        } else {
          rank += (gi % psize[i]) * stride[i];
          gi /= psize[i];
        }
      }
      out[g * gsize + p] = rank;
    }
}

Test(props, megatron_rank_generator) {
  rng_state = SEED ^ 0x6d656761ull;
  static int want[MAX_WORLD], got[MAX_WORLD];
  for (int it = 0; it < 300; it++) {
    int n = rnd(1, 5), psize[MPG_MAX_DIMS], world = 1;
    char names[MPG_MAX_DIMS][16], order[160] = "", mesh[128] = "";
    size_t ol = 0, ml = 0;
    for (int i = 0; i < n; i++) {
      snprintf(names[i], sizeof names[i], "p%d", i);
      psize[i] = rnd(1, 4);
      world *= psize[i];
      /* The order string lists innermost first; the mesh string may list
       * the dims in any order, say reversed. */
      ol += (size_t)snprintf(order + ol, sizeof order - ol, "%s%s",
                             i ? "-" : "", names[i]);
    }
    for (int i = n - 1; i >= 0; i--)
      ml += (size_t)snprintf(mesh + ml, sizeof mesh - ml, "%s%s=%d",
                             i != n - 1 ? "," : "", names[(i + it) % n],
                             psize[(i + it) % n]);
    unsigned mask = (unsigned)rnd(1, (1 << n) - 1);
    mpg_spec spec = MPG_SPEC_INIT;
    cr_assert_eq(mpg_spec_init(&spec), MPG_OK);
    cr_assert_eq(mpg_spec_set_mesh(&spec, mesh), MPG_OK, "%s", mpg_last_error());
    cr_assert_eq(mpg_spec_apply_order(&spec, order), MPG_OK, "%s",
                 mpg_last_error());
    /* Flattened set in mesh order = order-string order reversed. */
    char list[128] = "";
    size_t ll = 0;
    for (int i = n - 1; i >= 0; i--)
      if (mask & (1u << i))
        ll += (size_t)snprintf(list + ll, sizeof list - ll, "%s%s",
                               ll ? "," : "", names[i]);
    cr_assert_eq(mpg_spec_add_flatten(&spec, "sel", list), MPG_OK, "%s",
                 mpg_last_error());
    mpg_mesh *m = NULL;
    cr_assert_eq(mpg_mesh_create(&spec, world, &m), MPG_OK, "%s: %s", mesh,
                 mpg_last_error());
    int set = -1, gsize = 0, ngroups = 0;
    cr_assert_eq(mpg_mesh_dimset_find(m, "sel", &set), MPG_OK);
    cr_assert_eq(mpg_mesh_dimset_info(m, set, NULL, &gsize, &ngroups), MPG_OK);
    for (int g = 0; g < ngroups; g++)
      cr_assert_eq(mpg_mesh_group_members(m, set, g, &got[g * gsize]), MPG_OK);
    megatron_groups(n, psize, mask, world, want);
    for (int i = 0; i < world; i++)
      cr_assert_eq(got[i], want[i],
                   "mesh %s order %s set [%s]: group %d position %d is %d, "
                   "Megatron says %d",
                   mesh, order, list, i / gsize, i % gsize, got[i], want[i]);
    mpg_mesh_destroy(m);
  }
}
