/* Random jobs whose ranks disagree (issue 29), shared by test_agree.c (the
 * thread backend) and agree_mpi_worker.c (real mpirun processes): case i
 * of seed s is the same on every rank and in both programs.
 *
 * A case is a world size, two jobs A and B over it (mesh dims, in order,
 * with sizes, and at most two flattened sets) that differ in what the
 * ranks must share (dims, order, sizes or flattened sets), and which world
 * ranks build B (at least one, never all). */
#ifndef MESHPG_TESTS_AGREE_CASES_H
#define MESHPG_TESTS_AGREE_CASES_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "meshpg.h"

#define AGREE_MAX_WORLD 16

typedef struct agree_job {
  char dims[96];      /* "dp=2,tp=4" */
  char flatten[2][32];/* "dims" of X and Y, "" when absent */
} agree_job;

typedef struct agree_case {
  int world;
  agree_job job[2];
  unsigned char uses_b[AGREE_MAX_WORLD]; /* 1: world rank r builds job B */
} agree_case;

static inline uint64_t agree_rand(uint64_t *s) { /* splitmix64 */
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* Each flattened set (X, Y) of j present half the time, over two of the
 * nd dims `name` in mesh order; Y is dropped when it repeats X. */
static inline void agree_random_sets(uint64_t *s, const char *const *name, int nd,
                                     agree_job *j) {
  memset(j->flatten, 0, sizeof j->flatten);
  for (int f = 0; f < 2 && nd >= 2; f++) {
    if (agree_rand(s) % 2) continue;
    int a = (int)(agree_rand(s) % (uint64_t)nd), b = (int)(agree_rand(s) % (uint64_t)nd);
    if (a == b) b = (a + 1) % nd;
    if (a > b) {
      int t = a;
      a = b;
      b = t;
    }
    snprintf(j->flatten[f], sizeof j->flatten[f], "%s,%s", name[a], name[b]);
  }
  if (!strcmp(j->flatten[0], j->flatten[1])) j->flatten[1][0] = '\0'; /* one set a list */
}

/* A random job of `world` ranks: 1 to 3 dims named from a pool, sizes
 * multiplying to world, each flattened set (X, Y) present half the time
 * over two dims in mesh order. */
static inline void agree_random_job(uint64_t *s, int world, agree_job *j) {
  static const char *const pool[] = {"dp", "cp", "tp", "pp", "ep", "sp"};
  memset(j, 0, sizeof *j);
  int nd = 1 + (int)(agree_rand(s) % 3), size[3], left = world;
  const char *name[3];
  for (int d = 0; d < nd; d++) {
    int again;
    do {
      name[d] = pool[agree_rand(s) % 6];
      again = 0;
      for (int e = 0; e < d; e++) again |= strcmp(name[e], name[d]) == 0;
    } while (again);
    if (d == nd - 1) {
      size[d] = left;
    } else {
      int divs[AGREE_MAX_WORLD], nv = 0;
      for (int v = 1; v <= left; v++)
        if (left % v == 0) divs[nv++] = v;
      size[d] = divs[agree_rand(s) % (uint64_t)nv];
      left /= size[d];
    }
  }
  size_t len = 0;
  for (int d = 0; d < nd; d++)
    len += (size_t)snprintf(j->dims + len, sizeof j->dims - len, "%s%s=%d", d ? "," : "",
                            name[d], size[d]);
  agree_random_sets(s, name, nd, j);
}

static inline int agree_same_job(const agree_job *a, const agree_job *b) {
  return !strcmp(a->dims, b->dims) && !strcmp(a->flatten[0], b->flatten[0]) &&
         !strcmp(a->flatten[1], b->flatten[1]);
}

/* Case i of seed `seed`, over `world` ranks (0: a random world size). */
static inline void agree_make_case(uint64_t seed, int i, int world, agree_case *c) {
  static const int worlds[] = {2, 3, 4, 6, 8, 12, 16};
  uint64_t s = seed * 1000003ull + (uint64_t)i;
  memset(c, 0, sizeof *c);
  c->world = worlds[agree_rand(&s) % 7];
  if (world > 0) c->world = world;
  agree_random_job(&s, c->world, &c->job[0]);
  agree_random_job(&s, c->world, &c->job[1]);
  if (agree_rand(&s) % 3 == 0) {
    /* The same dims, other flattened sets (or none). */
    c->job[1] = c->job[0];
    char names[96], *name[3], *save = NULL;
    int nd = 0;
    snprintf(names, sizeof names, "%s", c->job[0].dims);
    for (char *t = strtok_r(names, ",", &save); t && nd < 3; t = strtok_r(NULL, ",", &save)) {
      *strchr(t, '=') = '\0';
      name[nd++] = t;
    }
    for (int k = 0; k < 50 && nd >= 2 && agree_same_job(&c->job[0], &c->job[1]); k++)
      agree_random_sets(&s, (const char *const *)name, nd, &c->job[1]);
  }
  while (agree_same_job(&c->job[0], &c->job[1]))
    agree_random_job(&s, c->world, &c->job[1]);
  int nb = 0;
  for (int r = 0; r < c->world; r++) nb += c->uses_b[r] = (unsigned char)(agree_rand(&s) % 2);
  if (nb == 0) c->uses_b[agree_rand(&s) % (uint64_t)c->world] = 1;
  if (nb == c->world) c->uses_b[agree_rand(&s) % (uint64_t)c->world] = 0;
}

/* A create that should have failed but did not: an all-gather over the
 * first dim set into a buffer sized by this rank's own mesh (under ASan a
 * write past it shows), then the context is destroyed. */
static inline void agree_probe(mpg_ctx *ctx) {
  mpg_group *g = NULL;
  if (!mpg_ctx_group_at(ctx, 0, &g)) {
    int n = mpg_group_size(g);
    int32_t *recv = calloc((size_t)n, sizeof *recv), one = 1;
    (void)mpg_all_gather(g, &one, recv, 1, MPG_I32, NULL, NULL);
    free(recv);
  }
  mpg_ctx_destroy(ctx);
}

/* Build job j into a mesh of `world` ranks. */
static inline mpg_status agree_build(const agree_job *j, int world, mpg_mesh **mesh) {
  mpg_spec spec = MPG_SPEC_INIT;
  mpg_status st = mpg_spec_init(&spec);
  if (!st) st = mpg_spec_set_mesh(&spec, j->dims);
  if (!st && j->flatten[0][0]) st = mpg_spec_add_flatten(&spec, "X", j->flatten[0]);
  if (!st && j->flatten[1][0]) st = mpg_spec_add_flatten(&spec, "Y", j->flatten[1]);
  if (!st) st = mpg_mesh_create(&spec, world, mesh);
  return st;
}

#endif
