/* The job fingerprint (issue 29): mpg_ctx_create's check, right after the
 * ranks join the world and before anything depends on the mesh, that every
 * rank built the same job.  Ranks that disagree on the mesh, its flattened
 * dims or expert grid, the backend, the library, or a setting that must
 * match would otherwise split the world into groups of other sizes than
 * each expects (wrong sums, writes past a buffer) or wait in different
 * collectives until the timeout.
 *
 * The items (item_names below) are strings every rank writes alike from
 * its own view; item "environment" is "valid" or the first variable that
 * broke groups/settings.c's rule, so that a bad value on one rank fails
 * every rank at once instead of leaving the others waiting for it.
 *
 * The check (collective over the world, host buffers through
 * mpg__ctx_setup_coll, not counted in mpg__ctx_setup_collectives):
 *  1. one all-reduce (max) of (h_i, ~h_i) for the items' 64-bit hashes:
 *     max(h) == ~max(~h) for every item means every rank has the same;
 *  2. otherwise every rank holds the same maxima, so every rank takes the
 *     same branch: the first differing item i is the same everywhere; an
 *     all-gather of h_i (8 bytes per rank) sorts the ranks into classes;
 *     two broadcasts bring the text of the first two classes (from their
 *     lowest world rank); every rank fails with the same message:
 *       mesh: world rank 0 has "tp=2,dp=2", world ranks 1-3 have "dp=2,tp=2"
 *     MPG_ERR_ENV for item "environment", MPG_ERR_STATE for the others.
 * The all-reduce carries one more word, each rank's random job id, whose
 * maximum becomes the context's (ctx->job, in the flight recorder's
 * dumps, groups/trace_dump.c).
 * World ranks here are the launcher's: placement has not renumbered yet. */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"

#define ITEM_TEXT 256 /* bytes of one item's text, NUL included */
#define ITEM_WORDS (ITEM_TEXT / 8)

enum {
  IT_LIBRARY,
  IT_BACKEND,
  IT_ENVIRONMENT,
  IT_MESH,
  IT_FLATTEN,
  IT_EXPERTS,
  IT_PLACEMENT,
  IT_LAZY,
  IT_CHECK_ORDER,
  IT_MPI_MAX_COUNT,
  IT_MPI_PIECE_BYTES,
  IT_NCCL_SPLIT_SHARE,
  IT_NCCL_PORT,
  NITEMS
};

static const char *const item_names[NITEMS] = {
    "library",          "backend",         "environment",
    "mesh",             "flattened dims",  "expert grid",
    "placement",        "lazy_groups",     "MESHPG_CHECK_ORDER",
    "MESHPG_MPI_MAX_COUNT", "MESHPG_MPI_PIECE_BYTES", "MESHPG_NCCL_SPLIT_SHARE",
    "MESHPG_NCCL_PORT",
};

/* Append to buf (cap bytes) at *len, truncating quietly. */
static void put(char *buf, size_t cap, size_t *len, const char *fmt, ...)
    MPG__PRINTF(4, 5);
static void put(char *buf, size_t cap, size_t *len, const char *fmt, ...) {
  if (*len + 1 >= cap) return;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf + *len, cap - *len, fmt, ap);
  va_end(ap);
  if (n > 0) *len = *len + (size_t)n < cap ? *len + (size_t)n : cap - 1;
}

/* "tp=2,dp=2": the mesh's dims, outermost first, with their sizes. */
static void describe_mesh(const mpg_mesh *mesh, char *buf, size_t cap) {
  size_t len = 0;
  buf[0] = '\0';
  for (int d = 0; d < mpg_mesh_ndims(mesh); d++) {
    const char *name = "?";
    int size = 0;
    mpg_mesh_dim(mesh, d, &name, &size);
    put(buf, cap, &len, "%s%s=%d", d ? "," : "", name, size);
  }
}

/* "dp_cp=dp+cp;..." (the sets between the dims and the expert sets), or
 * "none". */
static void describe_flatten(const mpg_mesh *mesh, char *buf, size_t cap) {
  size_t len = 0;
  buf[0] = '\0';
  int nd = mpg_mesh_ndims(mesh), ns = mpg_mesh_num_dimsets(mesh) - 1; /* world last */
  if (mpg_mesh_expert_ndims(mesh) > 0) ns -= 5;
  for (int s = nd; s < ns; s++) {
    const char *name = "?";
    int dims[MPG_MAX_DIMS], n = 0;
    mpg_mesh_dimset_info(mesh, s, &name, NULL, NULL);
    mpg_mesh_dimset_dims(mesh, s, dims, &n);
    put(buf, cap, &len, "%s%s=", s > nd ? ";" : "", name);
    for (int k = 0; k < n; k++) {
      const char *dn = "?";
      mpg_mesh_dim(mesh, dims[k], &dn, NULL);
      put(buf, cap, &len, "%s%s", k ? "+" : "", dn);
    }
  }
  if (!buf[0]) snprintf(buf, cap, "none");
}

/* "etp=1,ep=2,edp=2,pp=1" in the grid's order, or "none". */
static void describe_experts(const mpg_mesh *mesh, char *buf, size_t cap) {
  size_t len = 0;
  buf[0] = '\0';
  for (int d = 0; d < mpg_mesh_expert_ndims(mesh); d++) {
    const char *name = "?";
    int size = 0;
    mpg_mesh_expert_dim(mesh, d, &name, &size);
    put(buf, cap, &len, "%s%s=%d", d ? "," : "", name, size);
  }
  if (!buf[0]) snprintf(buf, cap, "none");
}

/* Every item's text, as this rank sees it. */
static void describe(const mpg_ctx *ctx, const mpg_init_opts *opts, const mpg__settings *set,
                     char text[NITEMS][ITEM_TEXT]) {
  const mpg_mesh *mesh = ctx->mesh;
  memset(text, 0, sizeof(char[NITEMS][ITEM_TEXT]));
  snprintf(text[IT_LIBRARY], ITEM_TEXT, "meshpg %s (API %d)", mpg_version_string(),
           MPG_API_VERSION);
  snprintf(text[IT_BACKEND], ITEM_TEXT, "%s", ctx->ops->name);
  snprintf(text[IT_ENVIRONMENT], ITEM_TEXT, "%s", set->status ? set->error : "valid");
  describe_mesh(mesh, text[IT_MESH], ITEM_TEXT);
  describe_flatten(mesh, text[IT_FLATTEN], ITEM_TEXT);
  describe_experts(mesh, text[IT_EXPERTS], ITEM_TEXT);
  snprintf(text[IT_PLACEMENT], ITEM_TEXT, "%s", !opts->placement ? "off"
           : opts->topology.strict ? "on, strict" : "on");
  snprintf(text[IT_LAZY], ITEM_TEXT, "%d", opts->backend.lazy_groups ? 1 : 0);
  snprintf(text[IT_CHECK_ORDER], ITEM_TEXT, "%d", set->check_order);
  /* Backend variables count on their backend only: elsewhere unread. */
  int mpi = ctx->kind == MPG_BACKEND_MPI, nccl = ctx->kind == MPG_BACKEND_NCCL;
  const char *na = "not read";
  if (mpi && set->mpi_max_count)
    snprintf(text[IT_MPI_MAX_COUNT], ITEM_TEXT, "%ld", set->mpi_max_count);
  else
    snprintf(text[IT_MPI_MAX_COUNT], ITEM_TEXT, "%s", mpi ? "unset" : na);
  if (mpi && set->mpi_piece_bytes)
    snprintf(text[IT_MPI_PIECE_BYTES], ITEM_TEXT, "%zu", set->mpi_piece_bytes);
  else
    snprintf(text[IT_MPI_PIECE_BYTES], ITEM_TEXT, "%s", mpi ? "unset" : na);
  snprintf(text[IT_NCCL_SPLIT_SHARE], ITEM_TEXT, "%s",
           !nccl ? na : set->nccl_split_share ? "1" : "0");
  if (nccl && set->nccl_port)
    snprintf(text[IT_NCCL_PORT], ITEM_TEXT, "%d", set->nccl_port);
  else
    snprintf(text[IT_NCCL_PORT], ITEM_TEXT, "%s", nccl ? "unset" : na);
}

/* "world rank 3" or "world ranks 0-2,5,7-9" for the ranks r with
 * in[r] != 0, shortened with "..." and the count past cap. */
static void rank_list(const unsigned char *in, int world, char *buf, size_t cap) {
  int n = 0;
  for (int r = 0; r < world; r++) n += in[r] != 0;
  size_t len = 0;
  buf[0] = '\0';
  put(buf, cap, &len, "world rank%s ", n == 1 ? "" : "s");
  int first = 1;
  for (int r = 0; r < world; r++) {
    if (!in[r]) continue;
    int e = r;
    while (e + 1 < world && in[e + 1]) e++;
    if (len + 40 >= cap) {
      put(buf, cap, &len, ",... (%d ranks)", n);
      return;
    }
    if (e == r)
      put(buf, cap, &len, "%s%d", first ? "" : ",", r);
    else
      put(buf, cap, &len, "%s%d-%d", first ? "" : ",", r, e);
    first = 0;
    r = e;
  }
}

static mpg_status coll(mpg_ctx *ctx, mpg__coll *c, const char *what) {
  mpg_status st = mpg__ctx_setup_coll(ctx, ctx->world_comm, ctx->world, c);
  if (st)
    return mpg__fail_wrap(st, "mpg_ctx_create: checking that the ranks built the same job "
                          "(rank %d of %d), %s", ctx->rank, ctx->world, what);
  return MPG_OK;
}

/* Text of item `it` at world rank `root`, into every rank's buf. */
static mpg_status fetch_text(mpg_ctx *ctx, char mine[ITEM_TEXT], int root,
                             uint64_t buf[ITEM_WORDS]) {
  memset(buf, 0, ITEM_TEXT);
  if (ctx->rank == root) memcpy(buf, mine, ITEM_TEXT);
  mpg__coll c = {MPG__BROADCAST, buf, buf, ITEM_WORDS, MPG_I64, MPG_OP_SUM, 1.0, root,
                 0, NULL, 0};
  mpg_status st = coll(ctx, &c, "broadcasting a differing value");
  ((char *)buf)[ITEM_TEXT - 1] = '\0';
  return st;
}

/* Item `it` differs: name it, both first values and the ranks on each side. */
static mpg_status report(mpg_ctx *ctx, int it, char mine[ITEM_TEXT], uint64_t h) {
  int world = ctx->world;
  uint64_t *all = malloc(sizeof *all * (size_t)world);
  unsigned char *in_a = calloc((size_t)world * 2, 1);
  char *ra = malloc(2 * 200);
  if (!all || !in_a || !ra) {
    free(all);
    free(in_a);
    free(ra);
    return mpg__fail(MPG_ERR_NOMEM, "mpg_ctx_create: the ranks did not build the same job "
                     "(their %s differs), and rank %d is out of memory to say more",
                     item_names[it], ctx->rank);
  }
  unsigned char *in_b = in_a + world;
  char *rb = ra + 200;
  mpg__coll c = {MPG__ALL_GATHER, &h, all, 1, MPG_I64, MPG_OP_SUM, 1.0, 0, 0, NULL, 0};
  mpg_status st = coll(ctx, &c, "gathering the differing item");
  uint64_t ta[ITEM_WORDS], tb[ITEM_WORDS];
  int a = 0, b = -1, others = 0, na = 0, nb = 0;
  if (!st) {
    for (int r = 0; r < world; r++) {
      if (all[r] == all[a]) {
        in_a[r] = 1;
        na++;
      } else if (b < 0 || all[r] == all[b]) {
        if (b < 0) b = r;
        in_b[r] = 1;
        nb++;
      } else {
        others++;
      }
    }
    if (b < 0) b = a; /* cannot happen: the maxima said they differ */
    st = fetch_text(ctx, mine, a, ta);
    if (!st) st = fetch_text(ctx, mine, b, tb);
  }
  if (!st) {
    rank_list(in_a, world, ra, 200);
    rank_list(in_b, world, rb, 200);
    char more[96] = "";
    if (others)
      snprintf(more, sizeof more, "; %d more rank%s ha%s other values", others,
               others == 1 ? "" : "s", others == 1 ? "s" : "ve");
    if (it == IT_ENVIRONMENT) {
      /* The class whose text is not "valid" broke the rule. */
      int a_bad = strcmp((char *)ta, "valid") != 0;
      st = mpg__fail(MPG_ERR_ENV,
                     "mpg_ctx_create: %s: %s (%s: %s%s); every rank fails, since they "
                     "cannot run one job",
                     a_bad ? ra : rb, a_bad ? (char *)ta : (char *)tb, a_bad ? rb : ra,
                     a_bad ? (char *)tb : (char *)ta, more);
    } else {
      st = mpg__fail(MPG_ERR_STATE,
                     "mpg_ctx_create: the ranks did not build the same job: %s: %s %s "
                     "\"%s\", %s %s \"%s\"%s. Every rank must create the same mesh with "
                     "the same options and settings (docs/launchers.md, \"One job\")",
                     item_names[it], ra, na == 1 ? "has" : "have", (char *)ta, rb,
                     nb == 1 ? "has" : "have",
                     (char *)tb, more);
    }
  }
  free(all);
  free(in_a);
  free(ra);
  return st;
}

mpg_status mpg__ctx_agree(mpg_ctx *ctx, const mpg_init_opts *opts, const mpg__settings *set) {
  if (ctx->world < 2) return MPG_OK;
  char(*text)[ITEM_TEXT] = malloc(sizeof(char[NITEMS][ITEM_TEXT]));
  if (!text)
    return mpg__fail(MPG_ERR_NOMEM, "mpg_ctx_create: rank %d: out of memory", ctx->rank);
  describe(ctx, opts, set, text);
  /* The last word is not compared: its maximum over the ranks, random on
   * each, names this job in the flight recorder's dumps (ctx->job). */
  uint64_t mine[2 * NITEMS + 1], max[2 * NITEMS + 1];
  for (int i = 0; i < NITEMS; i++) {
    mine[i] = mpg__hash_str(text[i]);
    mine[NITEMS + i] = ~mine[i];
  }
  mine[2 * NITEMS] = ctx->job;
  mpg__coll c = {MPG__ALL_REDUCE, mine, max, 2 * NITEMS + 1, MPG_I64, MPG_OP_MAX, 1.0, 0, 0,
                 NULL, 0};
  mpg_status st = coll(ctx, &c, "comparing fingerprints");
  if (!st) ctx->job = max[2 * NITEMS];
  int it = -1;
  for (int i = 0; !st && i < NITEMS && it < 0; i++)
    if (max[i] != ~max[NITEMS + i]) it = i;
  if (!st && it >= 0) st = report(ctx, it, text[it], mine[it]);
  if (!st)
    mpg__log(2, "rank %d: the %d ranks built the same job (mesh %s)", ctx->rank, ctx->world,
             text[IT_MESH]);
  free(text);
  return st;
}
