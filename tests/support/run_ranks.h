/* run_ranks: N thread ranks over a mesh, each with its own context, and
 * their failures on the test thread (tests/support/run_ranks.c).  The
 * runner the thread-backend suites share instead of each making the mesh,
 * calling mpg_thread_run, creating and destroying contexts and collecting
 * statuses by hand:
 *
 *   static mpg_status sum_rank(rr_rank *r) {
 *     mpg_group *g;
 *     RCALL(mpg_ctx_group(r->ctx, "tp", &g));      // rank_check.h
 *     ...
 *     RCHECK(y == 6, "sum %d", y);
 *     return MPG_OK;
 *   }
 *   Test(s, sum) { run_ranks("dp=2,tp=2", 4, sum_rank, NULL); }
 *
 * Each rank runs on its own thread (mpg_thread_run): run_ranks sets tl_rank
 * and tl_ctx (rank_check.h) around fn, so RCHECK / RCALL record the run's
 * first failure and abort the rank's context; fn must not use Criterion's
 * asserts.  The context fn receives is destroyed after it returns (fn may
 * destroy it itself and set r->ctx to NULL).  On the test thread,
 * run_ranks asserts that every rank returned MPG_OK, naming the first
 * failure (fail_msg) and every failing rank's status and message. */
#ifndef MPG_TESTS_SUPPORT_RUN_RANKS_H
#define MPG_TESTS_SUPPORT_RUN_RANKS_H

#include "meshpg.h"
#include "rank_check.h"
#include "time_bound.h"

/* What a rank function receives. */
typedef struct rr_rank {
  int rank, world;
  const mpg_init_opts *opts; /* mpg_thread_run's, for a context of fn's own */
  const mpg_mesh *mesh;      /* the run's mesh (NULL when dims was NULL) */
  mpg_ctx *ctx;              /* this rank's context (NULL: no mesh, or no_ctx) */
  void *arg;                 /* run_ranks' arg */
  char msg[512];             /* a failing rank's message (set by fn, or
                                mpg_last_error() after it failed) */
} rr_rank;

typedef mpg_status (*rr_fn)(rr_rank *r);

/* The settings of run_ranks_ex; {0} is run_ranks'. */
typedef struct rr_opts {
  const char *flatten;  /* flatten items, mesh_build's: "dp_cp=dp,cp;..." */
  double timeout_s;     /* each rank's collective timeout; 0: 20 s */
  double bound_s;       /* > 0: assert the whole run ends within
                           tb_bound(bound_s, nranks) (time_bound.h) */
  int no_ctx;           /* 1: no context (fn makes its own from r->opts) */
  int lazy_groups;      /* the context's backend.lazy_groups */
  mpg_status *statuses; /* nranks entries receive each rank's status, or NULL */
  rr_rank *ranks;       /* nranks entries receive each rank's rr_rank (the
                           messages), or NULL */
} rr_opts;

/* Run fn on nranks thread ranks over the mesh `dims` (0 ranks: the world
 * dims implies; NULL dims: no mesh and no context).  The mesh is made on
 * the test thread (asserted); the ranks' outcome is not asserted:
 * returns mpg_thread_run's status (MPG_OK when every rank gave MPG_OK).
 * fail_msg is cleared first. */
mpg_status run_ranks_ex(const char *dims, int nranks, rr_fn fn, void *arg, const rr_opts *o);

/* run_ranks_ex with default settings, asserting that every rank passed. */
void run_ranks(const char *dims, int nranks, rr_fn fn, void *arg);

/* run_ranks_ex, asserting that every rank passed. */
void run_ranks_ok(const char *dims, int nranks, rr_fn fn, void *arg, const rr_opts *o);

#endif
