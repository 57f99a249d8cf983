/* Shared helpers of the libFuzzer targets (tests/fuzz/README in
 * tests/fuzz/meson.build): the invariants every target asserts.  Test code:
 * a violated invariant traps, and libFuzzer saves the input. */
#ifndef TESTS_FUZZ_COMMON_H
#define TESTS_FUZZ_COMMON_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "meshpg.h"

/* Internal (mesh/base/error.c): the targets link the static fuzz library, where
 * mpg__ symbols are visible.  Clearing before a call proves that a failure
 * writes its own message rather than leaving an old one. */
void mpg__clear_error(void);

#define FUZZ_CHECK(cond)                                                   \
  do {                                                                     \
    if (!(cond)) {                                                         \
      /* fd 2: the CLI target swaps the stderr stream for /dev/null. */  \
      dprintf(STDERR_FILENO, "%s:%d: invariant failed: %s\n", __FILE__,  \
              __LINE__, #cond);                                            \
      __builtin_trap();                                                    \
    }                                                                      \
  } while (0)

/* A NUL-terminated copy of the input (caller frees). */
static inline char *fuzz_strdup(const uint8_t *data, size_t size) {
  char *s = malloc(size + 1);
  if (!s) abort();
  memcpy(s, data, size);
  s[size] = '\0';
  return s;
}

/* As fuzz_strdup, for the targets that read one item per line: a final
 * newline ends the last line rather than starting an empty one. */
static inline char *fuzz_strdup_lines(const uint8_t *data, size_t size) {
  char *s = fuzz_strdup(data, size);
  if (size && s[size - 1] == '\n') s[size - 1] = '\0';
  return s;
}

/* "$TMPDIR/<pattern>" (TMPDIR defaulting to /tmp) into buf, for mkstemps
 * and mkdtemp: run_fuzz.sh points TMPDIR into its own temporary folder. */
static inline void fuzz_tmp_path(char *buf, size_t cap, const char *pattern) {
  const char *tmp = getenv("TMPDIR");
  snprintf(buf, cap, "%s/%s", tmp && *tmp ? tmp : "/tmp", pattern);
}

/* The status is a known one and, if an error, came with a message. */
static inline void fuzz_check_status(mpg_status st) {
  FUZZ_CHECK(strcmp(mpg_status_name(st), "UNKNOWN") != 0);
  FUZZ_CHECK(strcmp(mpg_strerror(st), "unknown status") != 0);
  if (st != MPG_OK) {
    const char *why = mpg_last_error();
    FUZZ_CHECK(why != NULL && why[0] != '\0');
  }
}

/* Largest world a target builds a mesh for, so that every run stays fast. */
#define FUZZ_MAX_WORLD 4096

/* The world size that resolves the spec's -1 dim (the known product times
 * a small factor taken from `pick`), or 0 when there is no -1 dim; -1 when
 * the known product exceeds FUZZ_MAX_WORLD. */
static inline int fuzz_world_for(const mpg_spec *spec, unsigned pick) {
  long long known = 1;
  int has_auto = 0;
  for (int i = 0; i < spec->ndims; i++) {
    if (spec->dims[i].size == -1) {
      has_auto = 1;
      continue;
    }
    known *= spec->dims[i].size;
    if (known > FUZZ_MAX_WORLD) return -1;
  }
  if (!has_auto) return 0;
  long long w = known * (long long)(1 + pick % 4);
  return w > FUZZ_MAX_WORLD ? (int)known : (int)w;
}

/* The mesh invariants, for up to `samples` ranks spread over the world:
 * rank <-> coordinate round-trips, group_of / group_rank agree, and the
 * group members list the same ranks. */
static inline void fuzz_check_mesh(const mpg_spec *spec, const mpg_mesh *m,
                                   int samples) {
  int world = mpg_mesh_world_size(m), nd = mpg_mesh_ndims(m);
  FUZZ_CHECK(world >= 1 && world <= FUZZ_MAX_WORLD);
  FUZZ_CHECK(nd == spec->ndims);
  long long prod = 1;
  for (int d = 0; d < nd; d++) {
    const char *name = NULL;
    int size = 0;
    FUZZ_CHECK(mpg_mesh_dim(m, d, &name, &size) == MPG_OK);
    FUZZ_CHECK(name && strcmp(name, spec->dims[d].name) == 0);
    FUZZ_CHECK(size >= 1);
    FUZZ_CHECK(spec->dims[d].size == -1 || spec->dims[d].size == size);
    prod *= size;
  }
  FUZZ_CHECK(prod == world);
  int nsets = mpg_mesh_num_dimsets(m);
  /* An expert grid adds its five sets: etp, ep, edp, etp_ep, etp_ep_pp. */
  int expert_sets = mpg_mesh_expert_ndims(m) > 0 ? 5 : 0;
  FUZZ_CHECK(nsets == nd + spec->nflatten + 1 + expert_sets);
  int *members = malloc(sizeof(int) * (size_t)world);
  if (!members) abort();
  for (int s = 0; s < nsets; s++) {
    const char *name = NULL;
    int gsize = 0, ngroups = 0, found = -1;
    FUZZ_CHECK(mpg_mesh_dimset_info(m, s, &name, &gsize, &ngroups) == MPG_OK);
    FUZZ_CHECK(gsize >= 1 && ngroups >= 1);
    FUZZ_CHECK((long long)gsize * ngroups == world);
    FUZZ_CHECK(mpg_mesh_dimset_find(m, name, &found) == MPG_OK && found == s);
    int step = world / samples + 1;
    for (int r = 0; r < world; r += step) {
      int coord[MPG_MAX_DIMS], back = -1;
      FUZZ_CHECK(mpg_mesh_coord_of(m, r, coord) == MPG_OK);
      for (int d = 0; d < nd; d++) FUZZ_CHECK(coord[d] >= 0);
      FUZZ_CHECK(mpg_mesh_rank_of(m, coord, &back) == MPG_OK && back == r);
      int gi = -1, pos = -1, gs = -1, rr = -1;
      FUZZ_CHECK(mpg_mesh_group_of(m, s, r, &gi, &pos, &gs) == MPG_OK);
      FUZZ_CHECK(gs == gsize && gi >= 0 && gi < ngroups && pos >= 0 &&
                 pos < gsize);
      FUZZ_CHECK(mpg_mesh_group_member(m, s, gi, pos, &rr) == MPG_OK && rr == r);
      FUZZ_CHECK(mpg_mesh_group_members(m, s, gi, members) == MPG_OK);
      FUZZ_CHECK(members[pos] == r);
    }
  }
  /* Out-of-range queries fail with a message, never crash. */
  int coord[MPG_MAX_DIMS];
  mpg__clear_error();
  mpg_status st = mpg_mesh_coord_of(m, world, coord);
  FUZZ_CHECK(st != MPG_OK);
  fuzz_check_status(st);
  mpg__clear_error();
  st = mpg_mesh_group_of(m, nsets, 0, NULL, NULL, NULL);
  FUZZ_CHECK(st != MPG_OK);
  fuzz_check_status(st);
  free(members);
}

/* Build the mesh of a spec that validated and check it. */
static inline void fuzz_check_spec_mesh(const mpg_spec *spec, unsigned pick) {
  mpg__clear_error();
  mpg_status st = mpg_spec_validate(spec);
  fuzz_check_status(st);
  FUZZ_CHECK(st == MPG_OK);
  int world = fuzz_world_for(spec, pick);
  if (world < 0) return;
  mpg_mesh *m = NULL;
  mpg__clear_error();
  st = mpg_mesh_create(spec, world, &m);
  fuzz_check_status(st);
  if (st != MPG_OK) {
    FUZZ_CHECK(m == NULL);
    /* Only the expert grid's checks that need the world (divisibility,
     * pipeline groups, edp: docs/pipeline-and-experts.md, "Checked when a
     * mesh is built") may fail here; a product over FUZZ_MAX_WORLD was
     * caught above. */
    FUZZ_CHECK(spec->experts.ep != 0 && st == MPG_ERR_SPEC && strstr(mpg_last_error(), "expert"));
    return;
  }
  fuzz_check_mesh(spec, m, 16);
  mpg_mesh_destroy(m);
}

#endif
