/* The setup of one simulated rank of `meshpg sim`: joining the world, its
 * groups checked against the mesh, its syncs with the model's params, the
 * range of each param its optimizer updates, its buffers and initial
 * weights; and its teardown.  See sim_rank_setup.h. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sim_rank_setup.h"

/* "[0,1,4,5]", or "[0,1,...,15] (16)" for long lists. */
static void format_members(char *buf, size_t cap, const int *m, int n) {
  size_t len = 0;
  buf[0] = '\0';
#define APPEND(...)                                                        \
  do {                                                                     \
    int w_ = snprintf(buf + len, cap - len, __VA_ARGS__);                  \
    if (w_ < 0 || (size_t)w_ >= cap - len) return;                         \
    len += (size_t)w_;                                                     \
  } while (0)
  APPEND("[");
  if (n <= 8) {
    for (int i = 0; i < n; i++) APPEND("%s%d", i ? "," : "", m[i]);
    APPEND("]");
  } else {
    APPEND("%d,%d,...,%d] (%d)", m[0], m[1], m[n - 1], n);
  }
#undef APPEND
}

mpg_status sim_rank_fail(sim_rank *r, mpg_status st, const char *fmt, ...) {
  if (!r->res->msg[0]) {
    char what[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    const char *why = tool_why(st);
    snprintf(r->res->msg, sizeof r->res->msg, "%s%s%s: %s", r->where,
             r->where[0] ? ": " : "", what, why);
  }
  r->res->status = st != MPG_OK ? st : MPG_ERR_STATE;
  return r->res->status;
}

void sim_rank_global_index(const sim_rank *r, int k, long e, int *i, int *j,
                           int *cols) {
  const sim_model *m = &r->job->model;
  int base = r->tp_pos * r->hl;
  switch (k) {
  case SIM_W1:
    *i = (int)(e / r->hl), *j = base + (int)(e % r->hl), *cols = m->hidden;
    break;
  case SIM_B1: *i = 0, *j = base + (int)e, *cols = m->hidden; break;
  case SIM_W2:
    *i = base + (int)(e / m->d_out), *j = (int)(e % m->d_out), *cols = m->d_out;
    break;
  default: *i = 0, *j = (int)e, *cols = m->d_out; break;
  }
}

/* The groups of this rank, as the context sees them, checked against the
 * mesh's arithmetic. */
static mpg_status rank_groups(sim_rank *r) {
  const sim_job *job = r->job;
  int world = mpg_mesh_world_size(job->mesh);
  int *mine = malloc(sizeof(int) * 2 * (size_t)world);
  if (!mine) return sim_rank_fail(r, MPG_ERR_NOMEM, "group members");
  int *want = mine + world;
  mpg_status st = MPG_OK;
  for (int s = 0; s < job->nsets && st == MPG_OK; s++) {
    mpg_group *g;
    const char *name;
    int gi, pos, gsize;
    mpg_mesh_dimset_info(job->mesh, s, &name, NULL, NULL);
    st = mpg_ctx_group_at(r->ctx, s, &g);
    if (st != MPG_OK) {
      sim_rank_fail(r, st, "group %s", name);
      break;
    }
    mpg_mesh_group_of(job->mesh, s, r->rank, &gi, &pos, &gsize);
    mpg_mesh_group_members(job->mesh, s, gi, want);
    int n = mpg_group_size(g);
    int same = n == gsize && mpg_group_position(g) == pos && mpg_group_index(g) == gi;
    for (int p = 0; same && p < n; p++)
      same = mpg_group_member(g, p, &mine[p]) == MPG_OK && mine[p] == want[p];
    if (!same) {
      char a[SIM_GROUP_STR], b[SIM_GROUP_STR];
      format_members(a, sizeof a, mine, n < gsize ? n : gsize);
      format_members(b, sizeof b, want, gsize);
      st = sim_rank_fail(r, MPG_ERR_STATE,
                         "group %s: the context gives index %d position %d of %d "
                         "%s, the mesh says index %d position %d of %d %s",
                         name, mpg_group_index(g), mpg_group_position(g), n, a, gi, pos,
                         gsize, b);
      break;
    }
    format_members(r->res->group[s], SIM_GROUP_STR, mine, n);
  }
  free(mine);
  return st;
}

/* Register the model's four params on `sync` (forward order) and commit.
 * b2_dims: b2's own reduce dims (NULL: the sync's default). */
static mpg_status rank_register(sim_rank *r, mpg_sync *sync, const char *b2_dims,
                                const char *which) {
  for (int k = 0; k < SIM_NPARAMS; k++) {
    mpg_param_opts po = MPG_PARAM_OPTS_INIT;
    po.reduce_dims = k == SIM_B2 ? b2_dims : NULL;
    int id;
    TRY(mpg_sync_add_param(sync, sim_param_names[k], (size_t)r->count[k], MPG_F32,
                           &po, &id),
        "registering %s on the %s sync", sim_param_names[k], which);
    if (id != r->pid[k])
      return sim_rank_fail(r, MPG_ERR_STATE, "%s got id %d on the %s sync, %d on the first",
                           sim_param_names[k], id, which, r->pid[k]);
  }
  TRY(mpg_sync_commit(sync), "mpg_sync_commit of the %s sync", which);
  return MPG_OK;
}

/* Shard modes: the range of each param this rank updates, and where its
 * optimizer state sits (mpg_sync_get_shard). */
static mpg_status rank_shard_ranges(sim_rank *r) {
  mpg_sync_stats ss = MPG_SYNC_STATS_INIT;
  TRY(mpg_sync_get_stats(r->ssync, &ss), "mpg_sync_get_stats");
  r->res->shard_stats = ss;
  r->last_sharded = -1;
  long extra = 0;
  for (int k = 0; k < SIM_NPARAMS; k++) {
    mpg_shard_info info = MPG_SHARD_INFO_INIT;
    TRY(mpg_sync_get_shard(r->ssync, r->pid[k], &info), "mpg_sync_get_shard(%s)",
        sim_param_names[k]);
    if (info.sharded) {
      if (info.param_offset + info.count > (size_t)r->count[k] ||
          info.shard_offset + info.count > ss.shard_elems)
        return sim_rank_fail(r, MPG_ERR_STATE,
                             "mpg_sync_get_shard(%s): [%zu, +%zu) of %ld elements at state "
                             "offset %zu of %zu",
                             sim_param_names[k], info.param_offset, info.count,
                             r->count[k], info.shard_offset, ss.shard_elems);
      r->sharded[k] = 1;
      r->last_sharded = k;
      r->lo[k] = (long)info.param_offset;
      r->n[k] = (long)info.count;
      r->st[k] = (long)info.shard_offset;
    } else {
      /* Replicated (its own reduce dims): the whole param, fully reduced. */
      r->lo[k] = 0;
      r->n[k] = r->count[k];
      if (info.count == (size_t)r->count[k] &&
          info.shard_offset + info.count <= ss.shard_elems) {
        r->st[k] = (long)info.shard_offset;
      } else { /* state of its own, after the sharded elements */
        r->st[k] = (long)ss.shard_elems + extra;
        extra += r->count[k];
      }
    }
    r->res->owned[k] = r->n[k];
  }
  r->nstate = (long)ss.shard_elems + extra;
  return MPG_OK;
}

mpg_status sim_rank_setup(sim_rank *r) {
  const sim_job *job = r->job;
  const sim_model *m = &job->model;
  snprintf(r->where, sizeof r->where, "rank %d", r->opts.rank);
  TRY(mpg_ctx_create(job->mesh, &r->opts, &r->ctx), "joining the world");
  r->rank = mpg_ctx_rank(r->ctx);
  TRY(mpg_mesh_coord_of(job->mesh, r->rank, r->res->coord), "coordinates");
  /* The data-parallel index: dp, or (dp_replicate, dp_shard) row-major. */
  r->dp_pos = job->dim_dp >= 0 ? r->res->coord[job->dim_dp]
                               : r->res->coord[job->dim_dpr] * job->dps +
                                     r->res->coord[job->dim_dps];
  r->cp_pos = r->res->coord[job->dim_cp];
  r->tp_pos = r->res->coord[job->dim_tp];
  mpg_status st = rank_groups(r);
  if (st != MPG_OK) return st;
  TRY(mpg_ctx_group(r->ctx, "tp", &r->tp), "group tp");
  TRY(mpg_ctx_group(r->ctx, "dp_cp", &r->dp_cp), "group dp_cp");

  /* Parameter shards of this tp rank. */
  r->hl = m->hidden / job->tp;
  r->count[SIM_W1] = (long)m->d_in * r->hl;
  r->count[SIM_B1] = r->hl;
  r->count[SIM_W2] = (long)r->hl * m->d_out;
  r->count[SIM_B2] = m->d_out;
  r->nparam = 0;
  for (int k = 0; k < SIM_NPARAMS; k++) {
    r->off[k] = r->nparam;
    r->nparam += r->count[k];
    r->pid[k] = k; /* registration order */
  }

  /* The synchronisers: registered in forward order, marked in backward.
   * Every rank creates them in the same order (creation may be
   * collective). */
  TRY(mpg_sync_create(r->ctx, &job->sync_opts, &r->sync), "mpg_sync_create");
  st = rank_register(r, r->sync, job->mode == SIM_SHARD ? job->b2_dims : NULL,
                     job->mode == SIM_FSDP ? "cp" : "gradient");
  if (st != MPG_OK) return st;
  if (job->mode == SIM_FSDP) {
    TRY(mpg_sync_create(r->ctx, &job->shard_opts, &r->ssync),
        "mpg_sync_create of the sharded sync over dp");
    st = rank_register(r, r->ssync, job->b2_dims, "sharded");
    if (st != MPG_OK) return st;
  } else if (job->mode == SIM_SHARD) {
    r->ssync = r->sync;
  }
  for (int k = 0; k < SIM_NPARAMS; k++) {
    void *v;
    TRY(mpg_sync_grad(r->sync, r->pid[k], &v), "gradient view of %s",
        sim_param_names[k]);
    r->grad[k] = r->sgrad[k] = v;
    if (r->ssync && r->ssync != r->sync) {
      TRY(mpg_sync_grad(r->ssync, r->pid[k], &v),
          "gradient view of %s in the sharded sync", sim_param_names[k]);
      r->sgrad[k] = v;
    }
  }
  mpg_group *rg;
  TRY(mpg_sync_param_group(r->sync, r->pid[SIM_W1], &rg), "reduce group");
  int len = snprintf(r->res->reduce, SIM_GROUP_STR, "%s(%d)", mpg_group_name(rg),
                     mpg_group_size(rg));
  if (r->ssync && r->ssync != r->sync && len > 0 && len < SIM_GROUP_STR) {
    TRY(mpg_sync_param_group(r->ssync, r->pid[SIM_W1], &rg),
        "reduce group of the sharded sync");
    snprintf(r->res->reduce + len, SIM_GROUP_STR - (size_t)len, "+%s(%d)",
             mpg_group_name(rg), mpg_group_size(rg));
  }

  /* Buffers of one micro-batch. */
  int lo, hi, tlo, thi;
  sim_split(m->batch, job->dp, 0, &lo, &hi); /* part 0 is the largest */
  int samples = hi - lo;
  sim_split(samples, job->microbatches, 0, &lo, &hi);
  sim_split(m->seq, job->cp, 0, &tlo, &thi);
  r->max_tok = (hi - lo) * (thi - tlo);
  size_t nt = (size_t)(r->max_tok > 0 ? r->max_tok : 1);
  r->x = malloc(sizeof(float) * nt * (size_t)m->d_in);
  r->t = malloc(sizeof(float) * nt * (size_t)m->d_out);
  r->a = malloc(sizeof(float) * nt * (size_t)r->hl);
  r->yp = malloc(sizeof(float) * nt * (size_t)m->d_out);
  r->dy = malloc(sizeof(double) * nt * (size_t)m->d_out);
  r->dh = malloc(sizeof(double) * nt * (size_t)r->hl);
  r->gacc = malloc(sizeof(double) * (size_t)r->nparam);
  r->tok = malloc(sizeof(double) * (size_t)(m->d_in + m->d_out));
  if (!r->x || !r->t || !r->a || !r->yp || !r->dy || !r->dh || !r->gacc || !r->tok)
    return sim_rank_fail(r, MPG_ERR_NOMEM, "buffers of %ld parameters", r->nparam);

  /* The params: the sharded sync's param buffer, or our own array.  The
   * optimizer's range of each, and its state (only the owned elements in
   * the shard modes). */
  if (r->ssync) {
    for (int k = 0; k < SIM_NPARAMS; k++) {
      void *v;
      TRY(mpg_sync_param(r->ssync, r->pid[k], &v), "mpg_sync_param(%s)",
          sim_param_names[k]);
      r->pv[k] = v;
    }
    st = rank_shard_ranges(r);
    if (st != MPG_OK) return st;
  } else {
    r->param = calloc((size_t)r->nparam, sizeof(float));
    if (!r->param)
      return sim_rank_fail(r, MPG_ERR_NOMEM, "buffers of %ld parameters", r->nparam);
    for (int k = 0; k < SIM_NPARAMS; k++) {
      r->pv[k] = r->param + r->off[k];
      r->lo[k] = 0;
      r->n[k] = r->count[k];
      r->st[k] = r->off[k];
    }
    r->nstate = r->nparam;
  }
  if (m->adam) {
    size_t ns = (size_t)(r->nstate > 0 ? r->nstate : 1);
    r->mom = calloc(ns, sizeof(double));
    r->var = calloc(ns, sizeof(double));
    if (!r->mom || !r->var)
      return sim_rank_fail(r, MPG_ERR_NOMEM, "optimizer state of %ld elements", r->nstate);
  }
  /* Every rank computes its own slice of the initial weights (the same on
   * every rank of a shard group), so no broadcast is needed. */
  for (int k = 0; k < SIM_NPARAMS; k++)
    for (long e = 0; e < r->count[k]; e++) {
      int i, j, cols;
      sim_rank_global_index(r, k, e, &i, &j, &cols);
      r->pv[k][e] = (float)sim_init_param(m, k, i, j);
    }
  return MPG_OK;
}

void sim_rank_free(sim_rank *r) {
  if (r->ssync && r->ssync != r->sync) mpg_sync_destroy(r->ssync);
  mpg_sync_destroy(r->sync);
  mpg_ctx_destroy(r->ctx);
  free(r->x);
  free(r->t);
  free(r->a);
  free(r->yp);
  free(r->dy);
  free(r->dh);
  free(r->gacc);
  free(r->tok);
  free(r->param);
  free(r->mom);
  free(r->var);
}
