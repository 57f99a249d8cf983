/* The thread-rank runner: see run_ranks.h. */
#include "run_ranks.h"

#include <stdio.h>
#include <stdlib.h>

typedef struct rr_job {
  rr_fn fn;
  void *arg;
  const mpg_mesh *mesh;
  const rr_opts *o;
  rr_rank *ranks;
} rr_job;

static mpg_status rr_main(const mpg_init_opts *opts, void *arg) {
  rr_job *j = arg;
  rr_rank *r = &j->ranks[opts->rank];
  r->rank = opts->rank;
  r->world = opts->world_size;
  r->opts = opts;
  r->mesh = j->mesh;
  r->arg = j->arg;
  tl_rank = opts->rank;
  tl_ctx = NULL;
  tl_fail_msg[0] = '\0';
  mpg_status st = MPG_OK;
  if (j->mesh && !j->o->no_ctx) {
    mpg_init_opts co = *opts;
    co.backend.lazy_groups = j->o->lazy_groups;
    mpg_status cs = mpg_ctx_create(j->mesh, &co, &r->ctx);
    if (cs) st = rank_fail(__FILE__, __LINE__, "mpg_ctx_create: %s: %s", mpg_status_name(cs),
                           mpg_last_error());
    tl_ctx = r->ctx;
  }
  if (!st) st = j->fn(r);
  if (st && !r->msg[0])
    snprintf(r->msg, sizeof r->msg, "%s", tl_fail_msg[0] ? tl_fail_msg : mpg_last_error());
  tl_ctx = NULL;
  if (r->ctx) {
    mpg_status ds = mpg_ctx_destroy(r->ctx);
    r->ctx = NULL;
    if (ds && !st) st = rank_fail(__FILE__, __LINE__, "mpg_ctx_destroy: %s: %s",
                                  mpg_status_name(ds), mpg_last_error());
    if (st && !r->msg[0])
    snprintf(r->msg, sizeof r->msg, "%s", tl_fail_msg[0] ? tl_fail_msg : mpg_last_error());
  }
  return st;
}

/* The run's result: what run_ranks_ok asserts on. */
typedef struct rr_result {
  mpg_status st;
  double secs;
  int world;
  rr_rank *ranks;
  mpg_status *statuses;
} rr_result;

static void rr_run(const char *dims, int nranks, rr_fn fn, void *arg, const rr_opts *o,
                   rr_result *res) {
  static const rr_opts defaults = {0};
  if (!o) o = &defaults;
  mpg_mesh *mesh = NULL;
  if (dims) {
    mpg_status ms = mesh_build(dims, o->flatten, nranks, &mesh);
    cr_assert_eq(ms, MPG_OK, "mesh %s (%s): %s: %s", dims, o->flatten ? o->flatten : "",
                 mpg_status_name(ms), mpg_last_error());
    if (nranks == 0) nranks = mpg_mesh_world_size(mesh);
  }
  res->world = nranks;
  res->ranks = calloc((size_t)nranks, sizeof *res->ranks);
  res->statuses = calloc((size_t)nranks, sizeof *res->statuses);
  cr_assert(res->ranks && res->statuses, "out of memory for %d ranks", nranks);
  rr_job j = {fn, arg, mesh, o, res->ranks};
  fail_msg[0] = '\0';
  double t0 = now_s();
  res->st = mpg_thread_run(nranks, o->timeout_s > 0 ? o->timeout_s : 20.0, rr_main, &j,
                           res->statuses);
  res->secs = now_s() - t0;
  mpg_mesh_destroy(mesh);
  if (o->statuses)
    for (int r = 0; r < nranks; r++) o->statuses[r] = res->statuses[r];
  if (o->ranks)
    for (int r = 0; r < nranks; r++) o->ranks[r] = res->ranks[r];
  if (o->bound_s > 0)
    cr_assert_leq(res->secs, tb_bound(o->bound_s, nranks),
                  "%d ranks over %s took %.2f s, bound %.2f s", nranks, dims ? dims : "no mesh",
                  res->secs, tb_bound(o->bound_s, nranks));
}

mpg_status run_ranks_ex(const char *dims, int nranks, rr_fn fn, void *arg, const rr_opts *o) {
  rr_result res;
  rr_run(dims, nranks, fn, arg, o, &res);
  free(res.ranks);
  free(res.statuses);
  return res.st;
}

void run_ranks_ok(const char *dims, int nranks, rr_fn fn, void *arg, const rr_opts *o) {
  rr_result res;
  rr_run(dims, nranks, fn, arg, o, &res);
  static char all[8192];
  if (res.st != MPG_OK)
    rank_failures(all, sizeof all, res.world, res.statuses, res.ranks[0].msg,
                  sizeof res.ranks[0]);
  mpg_status st = res.st;
  free(res.ranks);
  free(res.statuses);
  cr_assert_eq(st, MPG_OK, "%d ranks over %s: %s: %s | first rank failure: %s%s", res.world,
               dims ? dims : "no mesh", mpg_status_name(st), mpg_last_error(), fail_msg, all);
}

void run_ranks(const char *dims, int nranks, rr_fn fn, void *arg) {
  run_ranks_ok(dims, nranks, fn, arg, NULL);
}
