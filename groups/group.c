/* The groups of a context: one per dim set (created eagerly or on first
 * use by one split of the world), groups over any union of dims, and
 * sub-groups at chosen positions.  See core.h. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"

/* After a split: the communicator the backend made has the size, this
 * rank's position and (where the backend can tell) the members that the
 * mesh says (defence in depth behind agree.c: a group of another size
 * would make collectives write past the caller's buffers).  On a mismatch
 * the context is aborted, so that no rank goes on with groups it does not
 * share. */
static mpg_status check_shape(mpg_ctx *ctx, mpg_group *g) {
  if (!g->comm || !ctx->ops->comm_shape) return MPG_OK;
  int pos = -1, size = -1;
  ctx->ops->comm_shape(g->comm, &pos, &size);
  char why[160] = "";
  if (pos != g->position || size != g->size) {
    snprintf(why, sizeof why, "of %d members with this rank at position %d, but the mesh "
             "says %d members and position %d", size, pos, g->size, g->position);
  } else if (ctx->ops->comm_members) {
    /* Its members, as world positions (= mesh ranks: the world is in mesh
     * order, placement renumbered it), against the mesh's. */
    int *at = malloc(sizeof *at * (size_t)size);
    if (at && ctx->ops->comm_members(g->comm, ctx->world_comm, at) == 0) {
      for (int p = 0; p < size && !why[0]; p++) {
        int want = -1;
        mpg_group_member(g, p, &want);
        if (at[p] != want)
          snprintf(why, sizeof why, "whose member at position %d is world rank %d, but the "
                   "mesh says world rank %d", p, at[p], want);
      }
    }
    free(at);
  }
  if (!why[0]) return MPG_OK;
  mpg__ctx_abort_all(ctx, MPG_ERR_ABORTED);
  (void)ctx->ops->destroy(g->comm); /* never blocks after the abort */
  g->comm = NULL;
  return mpg__fail(MPG_ERR_STATE,
                   "group \"%s\" index %d (rank %d): the %s backend made a communicator %s: "
                   "the ranks do not agree on the mesh (context aborted)",
                   g->name, g->index, ctx->rank, ctx->ops->name, why);
}

void mpg__group_op_label(const mpg_group *g, const mpg__op_id *c, char *buf, size_t n) {
  char label[160];
  mpg__group_label(g, label, sizeof label);
  if (!c || c->kind < 0) {
    snprintf(buf, n, "%s", label);
    return;
  }
  char num[32] = "", peer[48] = "";
  if (c->gseq) snprintf(num, sizeof num, " #%llu", (unsigned long long)c->gseq);
  if ((c->kind == MPG__SEND || c->kind == MPG__RECV) && c->peer >= 0 && c->peer < g->size)
    snprintf(peer, sizeof peer, " %s world rank %d", c->kind == MPG__SEND ? "to" : "from",
             mpg__group_world_rank(g, c->peer));
  snprintf(buf, n, "%s%s%s on %s", mpg__kind_name((mpg__coll_kind)c->kind), num, peer, label);
}

/* Give the backend g's label for its messages (set_label, optional). */
static void label_comm(mpg_ctx *ctx, mpg_group *g) {
  if (!g->comm || !ctx->ops->set_label || g->comm == ctx->world_comm) return;
  char label[160];
  mpg__group_label(g, label, sizeof label);
  ctx->ops->set_label(g->comm, label);
}

/* Put g's new communicator in its transport list (transport.h). */
static void attach_comm(mpg_ctx *ctx, mpg_group *g) {
  g->comm_link.ops = &ctx->ops->transport;
  g->comm_link.comm = g->comm;
  mpg__group_attach(g, &g->comm_link);
}

/* Make g's communicator: nothing for size 1, the world's for "world",
 * else one split of the world (collective over the world). */
static mpg_status create_one(mpg_ctx *ctx, mpg_group *g) {
  if (g->created) return MPG_OK;
  mpg_status st = MPG_OK;
  if (g->size == 1 && g->dimset >= 0) {
    g->comm = NULL;
  } else if (g->size == ctx->world && strcmp(g->name, "world") == 0) {
    g->comm = ctx->world_comm;
  } else {
    if (atomic_load(&ctx->aborted))
      return mpg__fail((mpg_status)atomic_load(&ctx->aborted), "group \"%s\": the context was aborted",
                       g->name);
    /* A split issues on the world: nccl's issuing thread only. */
    st = mpg__ctx_check_issuer(ctx, "creating the group", g->name);
    if (st) return st;
    ctx->setup_collectives++;
    mpg__order_note_split(g);
    st = ctx->ops->split(ctx->world_comm, g->index, g->position, &g->comm);
    if (st == MPG_OK && !g->comm)
      st = mpg__fail(MPG_ERR_BACKEND,
                     "group \"%s\": split gave rank %d no communicator",
                     g->name, ctx->rank);
    if (!st) st = check_shape(ctx, g);
    if (st) return st;
    label_comm(ctx, g);
    attach_comm(ctx, g);
  }
  g->created = 1;
  mpg__log(2, "rank %d: group %s #%d, position %d of %d", ctx->rank, g->name,
           g->index, g->position, g->size);
  return MPG_OK;
}

static int needs_split(const mpg_ctx *ctx, const mpg_group *g) {
  return !g->created && g->size > 1 &&
         !(g->size == ctx->world && strcmp(g->name, "world") == 0);
}

/* Lazy groups.  NCCL (and any backend) matches splits of the world by call
 * order, and which group a rank needs first depends on its code path (a
 * pipeline stage, its own reduce_dims).  So a rank never splits one lazy
 * group alone: the first use of any group that needs a split is a world
 * all-reduce (max) of "the dim sets I need now", and every rank then
 * creates the union, in dim-set order.  Ranks that first use different
 * groups at the same point thus make the same splits in the same order;
 * a rank that never arrives makes the others time out on the all-reduce,
 * which names no group, rather than deadlock inside a split. */
mpg_status mpg__group_create(mpg_ctx *ctx, mpg_group *g) {
  if (g->created) return MPG_OK;
  if (!ctx->lazy || g->dimset < 0 || !needs_split(ctx, g)) return create_one(ctx, g);
  if (atomic_load(&ctx->aborted))
    return mpg__fail((mpg_status)atomic_load(&ctx->aborted),
                     "group \"%s\": the context was aborted", g->name);
  int32_t want[MPG__MAX_DIMSETS], agreed[MPG__MAX_DIMSETS];
  memset(want, 0, sizeof want);
  want[g->dimset] = 1;
  mpg__coll c = {MPG__ALL_REDUCE, want, agreed, (size_t)ctx->nsets, MPG_I32, MPG_OP_MAX,
                 1.0, 0, 0, NULL, 0};
  ctx->setup_collectives++;
  mpg_status st = mpg__ctx_setup_coll(ctx, ctx->world_comm, ctx->world, &c);
  if (st)
    return mpg__fail_wrap(st, "lazy group \"%s\": agreeing over the world which groups "
                          "to create", g->name);
  int made = 0;
  for (int s = 0; s < ctx->nsets && !st; s++)
    if (agreed[s] && needs_split(ctx, &ctx->groups[s])) {
      st = create_one(ctx, &ctx->groups[s]);
      made++;
    }
  if (!st && !g->created)
    st = mpg__fail(MPG_ERR_BACKEND, "lazy group \"%s\": not among the %d groups agreed",
                   g->name, made);
  if (!st && made > 1)
    mpg__log(2, "rank %d: lazy groups: %d created together (first asked: %s)", ctx->rank,
             made, g->name);
  return st;
}

mpg_status mpg_ctx_group_at(mpg_ctx *ctx, int dimset, mpg_group **out) {
  if (!out) return mpg__fail(MPG_ERR_INVALID, "mpg_ctx_group_at: out is NULL");
  *out = NULL;
  if (!ctx) return mpg__fail(MPG_ERR_INVALID, "mpg_ctx_group_at: ctx is NULL");
  if (dimset < 0 || dimset >= ctx->nsets)
    return mpg__fail(MPG_ERR_RANGE, "mpg_ctx_group_at: dim set %d is outside 0..%d",
                     dimset, ctx->nsets - 1);
  mpg_group *g = &ctx->groups[dimset];
  mpg_status st = mpg__group_create(ctx, g);
  if (st) {
    if (st == MPG_ERR_TIMEOUT) mpg__ctx_abort_all(ctx, st);
    return st;
  }
  *out = g;
  return MPG_OK;
}

mpg_status mpg_ctx_group(mpg_ctx *ctx, const char *name, mpg_group **out) {
  if (!out) return mpg__fail(MPG_ERR_INVALID, "mpg_ctx_group: out is NULL");
  *out = NULL;
  if (!ctx || !name) return mpg__fail(MPG_ERR_INVALID, "mpg_ctx_group: NULL argument");
  int s;
  mpg_status st = mpg_mesh_dimset_find(ctx->mesh, name, &s);
  if (st) return st;
  return mpg_ctx_group_at(ctx, s, out);
}

const char *mpg_group_name(const mpg_group *g) { return g ? g->name : ""; }
int mpg_group_position(const mpg_group *g) { return g ? g->position : -1; }
int mpg_group_size(const mpg_group *g) { return g ? g->size : 0; }
int mpg_group_index(const mpg_group *g) { return g ? g->index : -1; }
const mpg_ctx *mpg__group_ctx(const mpg_group *g) { return g ? g->ctx : NULL; }

mpg_status mpg_group_member(const mpg_group *g, int position, int *rank) {
  if (!g || !rank) return mpg__fail(MPG_ERR_INVALID, "mpg_group_member: NULL argument");
  if (position < 0 || position >= g->size)
    return mpg__fail(MPG_ERR_RANGE, "mpg_group_member: position %d in \"%s\" is outside 0..%d",
                     position, g->name, g->size - 1);
  *rank = mpg__group_world_rank(g, position);
  return MPG_OK;
}

static mpg_group *find_extra(mpg_ctx *ctx, const char *key) {
  for (mpg_group *g = ctx->extra; g; g = g->next)
    if (strcmp(g->extra_name, key) == 0) return g;
  return NULL;
}

/* Make (collectively) and remember an extra group: the whole mask group,
 * the positions `select` of it (nselect > 0; other ranks enter the split
 * without joining), or with instances > 0 a partial group (inter: the
 * strided one). */
static mpg_status make_extra_part(mpg_ctx *ctx, const char *key, unsigned mask,
                                  const int *select, int nselect, int instances, int inter,
                                  mpg_group **out) {
  mpg_group *g = calloc(1, sizeof *g);
  if (!g) return mpg__fail(MPG_ERR_NOMEM, "group \"%s\": out of memory", key);
  g->ctx = ctx;
  g->dimset = -1;
  g->mask = mask;
  snprintf(g->extra_name, sizeof g->extra_name, "%s", key);
  g->name = g->extra_name;
  int base_pos, base_size;
  mpg__mesh_mask_place(ctx->mesh, mask, ctx->rank, &g->index, &base_pos, &base_size);
  int member = 1;
  g->position = base_pos;
  g->size = base_size;
  if (nselect > 0) {
    member = 0;
    g->nselect = nselect;
    memcpy(g->select, select, sizeof(int) * (size_t)nselect);
    for (int i = 0; i < nselect; i++)
      if (select[i] == base_pos) member = 1, g->position = i;
    g->size = nselect;
  } else if (instances > 0) {
    /* Megatron's create_hierarchical_groups with sizes [c, instances]:
     * part i holds positions [i c, (i + 1) c); the inter group j the
     * positions j, j + c, ...  The split's colour is unique over the
     * world: the mask group's index times the number of its parts. */
    int c = base_size / instances;
    if (inter) {
      g->pbase = base_pos % c;
      g->pstride = c;
      g->position = base_pos / c;
      g->size = instances;
      g->index = g->index * c + g->pbase;
    } else {
      g->pbase = base_pos / c * c;
      g->pstride = 1;
      g->position = base_pos % c;
      g->size = c;
      g->index = g->index * instances + base_pos / c;
    }
  }
  mpg_status st = MPG_OK;
  if (atomic_load(&ctx->aborted)) {
    free(g);
    return mpg__fail((mpg_status)atomic_load(&ctx->aborted),
                     "group \"%s\": the context was aborted", key);
  }
  g->member = member;
  if (g->size > 1) {
    /* Non-members enter the split too: it is collective over the world
     * (on nccl, from the issuing thread only). */
    st = mpg__ctx_check_issuer(ctx, "creating the group", key);
    if (st) {
      free(g);
      return st;
    }
    ctx->setup_collectives++;
    mpg__order_note_split(g); /* not for mpg_ctx_group_select's groups */
    st = ctx->ops->split(ctx->world_comm, member ? g->index : -1, g->position,
                         &g->comm);
    if (!st && member) st = check_shape(ctx, g);
    if (!st && member) label_comm(ctx, g);
    if (!st && member) attach_comm(ctx, g);
  }
  if (st) {
    free(g);
    if (st == MPG_ERR_TIMEOUT) mpg__ctx_abort_all(ctx, st);
    return st;
  }
  g->created = 1;
  mpg__ctx_add_group(ctx, g);
  mpg__log(2, "rank %d: extra group %s #%d, position %d of %d%s", ctx->rank, key,
           g->index, g->position, g->size, member ? "" : " (not a member)");
  *out = member ? g : NULL;
  return MPG_OK;
}

static mpg_status make_extra(mpg_ctx *ctx, const char *key, unsigned mask,
                             const int *select, int nselect, mpg_group **out) {
  return make_extra_part(ctx, key, mask, select, nselect, 0, 0, out);
}

mpg_status mpg_ctx_group_dims(mpg_ctx *ctx, const char *dims, mpg_group **out) {
  if (!out) return mpg__fail(MPG_ERR_INVALID, "mpg_ctx_group_dims: out is NULL");
  *out = NULL;
  if (!ctx || !dims) return mpg__fail(MPG_ERR_INVALID, "mpg_ctx_group_dims: NULL argument");
  unsigned mask;
  mpg_status st = mpg__mesh_parse_dims(ctx->mesh, dims, 0, "group dims", &mask,
                                       NULL, NULL);
  if (st) return st;
  /* A named dim set with the same dims is the same group. */
  for (int s = 0; s < ctx->nsets; s++)
    if (ctx->groups[s].mask == mask) return mpg_ctx_group_at(ctx, s, out);
  char key[128];
  mpg__mesh_mask_names(ctx->mesh, mask, "+", key, sizeof key);
  mpg_group *g = find_extra(ctx, key);
  if (g) {
    *out = g;
    return MPG_OK;
  }
  return make_extra(ctx, key, mask, NULL, 0, out);
}

mpg_status mpg_ctx_group_select(mpg_ctx *ctx, const char *name,
                                const int *positions, int npositions,
                                mpg_group **out) {
  if (!out) return mpg__fail(MPG_ERR_INVALID, "mpg_ctx_group_select: out is NULL");
  *out = NULL;
  if (!ctx || !name || !positions)
    return mpg__fail(MPG_ERR_INVALID, "mpg_ctx_group_select: NULL argument");
  unsigned mask;
  mpg_status st = mpg__mesh_parse_dims(ctx->mesh, name, 0, "group dims", &mask,
                                       NULL, NULL);
  if (st) return st;
  int idx, pos, size;
  mpg__mesh_mask_place(ctx->mesh, mask, ctx->rank, &idx, &pos, &size);
  if (npositions < 1 || npositions > MAX_SELECT || npositions > size)
    return mpg__fail(MPG_ERR_RANGE,
                     "mpg_ctx_group_select \"%s\": expected 1 to %d positions, found %d",
                     name, size < MAX_SELECT ? size : MAX_SELECT, npositions);
  char key[128];
  size_t n = (size_t)snprintf(key, sizeof key, "%s[", name);
  for (int i = 0; i < npositions; i++) {
    if (positions[i] < 0 || positions[i] >= size)
      return mpg__fail(MPG_ERR_RANGE,
                       "mpg_ctx_group_select \"%s\": position %d is outside 0..%d",
                       name, positions[i], size - 1);
    for (int j = 0; j < i; j++)
      if (positions[j] >= positions[i])
        return mpg__fail(MPG_ERR_INVALID,
                         "mpg_ctx_group_select \"%s\": positions must be increasing, "
                         "found %d after %d", name, positions[i], positions[j]);
    if (n < sizeof key)
      n += (size_t)snprintf(key + n, sizeof key - n, "%s%d", i ? "," : "", positions[i]);
  }
  if (n < sizeof key) snprintf(key + n, sizeof key - n, "]");
  mpg_group *g = find_extra(ctx, key);
  if (g) {
    *out = g->member ? g : NULL;
    return MPG_OK;
  }
  return make_extra(ctx, key, mask, positions, npositions, out);
}

mpg_status mpg_ctx_group_partial(mpg_ctx *ctx, const char *dims, int instances,
                                 mpg_partial which, mpg_group **out) {
  if (!out) return mpg__fail(MPG_ERR_INVALID, "mpg_ctx_group_partial: out is NULL");
  *out = NULL;
  if (!ctx || !dims) return mpg__fail(MPG_ERR_INVALID, "mpg_ctx_group_partial: NULL argument");
  if (which != MPG_PARTIAL_INTRA && which != MPG_PARTIAL_INTER)
    return mpg__fail(MPG_ERR_INVALID,
                     "mpg_ctx_group_partial \"%s\": which is %d, expected MPG_PARTIAL_INTRA (0) "
                     "or MPG_PARTIAL_INTER (1)", dims, (int)which);
  unsigned mask;
  mpg_status st = mpg__mesh_parse_dims(ctx->mesh, dims, 0, "group dims", &mask, NULL, NULL);
  if (st) return st;
  int idx, pos, size;
  mpg__mesh_mask_place(ctx->mesh, mask, ctx->rank, &idx, &pos, &size);
  if (instances < 1 || size % instances != 0)
    return mpg__fail(MPG_ERR_RANGE,
                     "mpg_ctx_group_partial \"%s\": instances %d does not divide the group "
                     "size %d; choose a divisor of %d (Megatron's "
                     "num_distributed_optimizer_instances)", dims, instances, size, size);
  char names[96];
  mpg__mesh_mask_names(ctx->mesh, mask, "+", names, sizeof names);
  /* One instance: the intra group is the whole group, the inter group one
   * rank (no split needed for either; both stay separate groups so their
   * names say what they are). */
  char key[128];
  snprintf(key, sizeof key, "%s/%s%d", names, which == MPG_PARTIAL_INTER ? "inter" : "intra",
           instances);
  mpg_group *g = find_extra(ctx, key);
  if (g) {
    *out = g;
    return MPG_OK;
  }
  return make_extra_part(ctx, key, mask, NULL, 0, instances, which == MPG_PARTIAL_INTER, out);
}
