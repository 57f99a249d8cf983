/* meshpg sim: N simulated ranks (threads of this process, the thread
 * backend) train a Megatron-style MLP with tp, cp and dp, synchronising
 * gradients with mpg_sync exactly like a real trainer (replicated, or in
 * the library's shard mode: distributed optimizer, HSDP, FSDP); the result
 * is checked against the same model trained in one process.
 *
 * Each rank is a thread that receives its init options from mpg_thread_run
 * and only uses the public API.  The ranks share, read-only, the mesh, the
 * job description and the reference; each writes only its own result slot;
 * only rank 0 prints, and only while the main thread waits. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cmd.h"
#include "sim_model.h"

static const char sim_usage[] =
    "usage: meshpg sim [SPEC.toml] [--mesh dp=2,tp=2,cp=2] [--flatten NAME=d1,d2]...\n"
    "                  [--order tp-cp-dp] [--world N] [--steps K]\n"
    "                  [--shard | --hsdp R | --fsdp] [--optim adam|sgd]\n"
    "                  [--microbatches M] [--seed S] [--timeout SEC] [--quiet]\n"
    "                  [--batch B] [--seq T] [--hidden H] [--lr LR]\n"
    "                  [--bucket-mb MB] [--tol TOL] [--fail-rank R[:STEP]]\n"
    "\n"
    "Run one simulated rank per thread (thread backend): together they train\n"
    "a Megatron-style MLP (column-parallel W1, tanh, row-parallel W2 over tp;\n"
    "tokens split over cp; samples split over dp) with meshpg's gradient sync,\n"
    "then compare every rank's parameters with single-process training.\n"
    "\n"
    "  SPEC.toml          mesh and [sync] settings from a spec file\n"
    "  --mesh DIMS        the dims, outermost first; replaces the spec's dims\n"
    "                     (default without spec or --mesh: dp=2,tp=2,cp=2,\n"
    "                     or dp=auto,tp=2,cp=2 when --world is given); the\n"
    "                     data dims are dp, or dp_replicate and dp_shard\n"
    "  --flatten N=D,..   add a flattened dim set (repeatable)\n"
    "  --order ORDER      reorder the dims by a Megatron order string\n"
    "  --world N          number of ranks; resolves a -1 dim\n"
    "                     (default: the product of the sizes)\n"
    "  --steps K          optimizer steps (default 20)\n"
    "  --shard            sharded data parallel (distributed optimizer): the\n"
    "                     sync's shard mode reduce-scatters every bucket over\n"
    "                     dp_cp, each rank updates (and keeps Adam state for)\n"
    "                     only the elements it owns, and the params are\n"
    "                     all-gathered before their first use in forward\n"
    "                     (also set by [sync] mode = \"shard\" in the spec,\n"
    "                     with its shard_dims and replicate_dims)\n"
    "  --hsdp R           HSDP: dp is split into dp_replicate=R x dp_shard=dp/R;\n"
    "                     shard mode over dp_shard,cp, the owned shards\n"
    "                     all-reduced over dp_replicate\n"
    "  --fsdp             FSDP owns dp: one sync (fsdp_owns_dp) averages the\n"
    "                     gradients over cp only, a second one in shard mode\n"
    "                     reduce-scatters them over dp and gathers the params\n"
    "                     (also set by fsdp_owns_dp = true in the spec)\n"
    "  --optim OPT        adam (default) or sgd, the same in the reference\n"
    "  --microbatches M   gradient accumulation over M micro-batches (default 1)\n"
    "  --seed S           seed of the data and the initial weights (default 1)\n"
    "  --timeout SEC      collective timeout of every rank (default: the spec's\n"
    "                     [backend] timeout_s, 600)\n"
    "  --quiet            print only the verdict line (and errors)\n"
    "  --batch B          samples per step (default 2 * dp * M)\n"
    "  --seq T            tokens per sample (default 4 * cp)\n"
    "  --hidden H         hidden units, a multiple of tp (default: 32 rounded\n"
    "                     up to a multiple of tp)\n"
    "  --lr LR            learning rate (default 0.01 for adam, 0.5 for sgd)\n"
    "  --bucket-mb MB     gradient bucket size in MiB, also caps the first\n"
    "                     bucket (default: the spec's bucket_mb, 25)\n"
    "  --tol TOL          largest relative error that passes (default 1e-5)\n"
    "  --fail-rank R[:S]  testing: rank R stops at step S (default 0) without\n"
    "                     a word to its peers, like a crashed process; they\n"
    "                     must fail with a timeout (see --timeout), not hang\n"
    "\n"
    "Exit status: 0 every rank matches the reference; 1 a rank differs or\n"
    "failed, or the spec is invalid; 2 usage error.\n";

#define D_IN 16
#define D_OUT 8
#define MAX_SETS (MPG_MAX_DIMS + MPG_MAX_FLATTEN)
#define GROUP_STR 48
#define MSG_MAX 400
#define TABLE_ALL_UP_TO 64
#define TABLE_EDGE 16

static const char *const param_names[SIM_NPARAMS] = {"w1", "b1", "w2", "b2"};

/* How the ranks keep gradients and parameters. */
typedef enum sim_mode {
  SIM_REPLICATE = 0, /* one sync, all-reduce over dp_cp, full optimizer */
  SIM_SHARD = 1,     /* one sync in shard mode (--shard, --hsdp, the spec) */
  SIM_FSDP = 2       /* fsdp_owns_dp sync over cp + shard-mode sync over dp */
} sim_mode;

/* What one rank reports back; written only by that rank. */
typedef struct sim_result {
  mpg_status status;
  int done;                        /* reached the comparison */
  int injected;                    /* stopped by --fail-rank */
  int started;                     /* its thread ran */
  char msg[MSG_MAX];               /* first failure */
  int coord[MPG_MAX_DIMS];
  char group[MAX_SETS][GROUP_STR]; /* members of its group of each dim set */
  char reduce[GROUP_STR];          /* its sync reduce group, "dp_cp(4)" */
  double err;                      /* max relative error over its params */
  int worst_param;
  mpg_sync_stats stats;            /* of its (first) sync */
  mpg_sync_stats shard_stats;      /* shard modes: of the sharded sync */
  long owned[SIM_NPARAMS];         /* shard modes: owned elements per param */
} sim_result;

/* The job: read-only while the ranks run (results aside). */
typedef struct sim_job {
  const mpg_mesh *mesh;
  sim_model model;
  int steps, microbatches, quiet, lazy_groups;
  sim_mode mode;
  int fail_rank, fail_step;   /* --fail-rank; -1: none */
  mpg_sync_opts sync_opts;    /* the (first) sync */
  mpg_sync_opts shard_opts;   /* SIM_FSDP: the sharded sync over dp */
  /* mesh dim indices: data dims dp, or dp_replicate x dp_shard (-1 when
   * absent), then cp and tp */
  int dim_dp, dim_dpr, dim_dps, dim_cp, dim_tp;
  int dp, dpr, dps, cp, tp;   /* dp: every data-parallel rank (dpr * dps) */
  int nsets;                  /* dim sets shown: every one but "world" */
  double grad_factor;         /* the library's divisor, undone in advance */
  double b2_factor;           /* extra factor of b2's gradient (see setup) */
  const char *b2_dims;        /* shard modes: b2's own reduce dims */
  const sim_reference *ref;
  sim_result *results;
} sim_job;

/* One rank's state. */
typedef struct sim_rank {
  const sim_job *job;
  sim_result *res;
  mpg_init_opts opts;
  mpg_ctx *ctx;
  mpg_sync *sync;   /* the gradients of backward are marked here */
  mpg_sync *ssync;  /* the sharded sync that holds the params: sync itself
                       in SIM_SHARD, a second one in SIM_FSDP, NULL else */
  mpg_group *tp, *dp_cp;
  int rank, dp_pos, cp_pos, tp_pos, hl;
  long count[SIM_NPARAMS], off[SIM_NPARAMS], nparam;
  int pid[SIM_NPARAMS];
  float *grad[SIM_NPARAMS];  /* views into the sync's gradient buffers */
  float *sgrad[SIM_NPARAMS]; /* the gradients the optimizer reads (ssync's
                                in SIM_FSDP, else grad) */
  float *pv[SIM_NPARAMS];    /* the params: ssync's param views, or slices
                                of `param` in SIM_REPLICATE */
  float *param;              /* SIM_REPLICATE: w1 | b1 | w2 | b2 of this tp rank */
  /* The optimizer updates pv[k][lo[k] .. lo[k] + n[k]) with its state at
   * [st[k] .. st[k] + n[k]) of mom and var (nstate elements). */
  long lo[SIM_NPARAMS], n[SIM_NPARAMS], st[SIM_NPARAMS], nstate;
  double *mom, *var;
  int gather_open;           /* a gather started after the last step */
  int sharded[SIM_NPARAMS];  /* mpg_shard_info.sharded of each param */
  int last_sharded;          /* the last one in forward order; -1: none */
  /* one micro-batch */
  int max_tok;
  float *x, *t, *a, *yp;
  double *dy, *dh, *gacc, *tok;
  char where[96];
} sim_rank;

/* ------------------------------------------------------------------------ */
/* Small helpers                                                             */
/* ------------------------------------------------------------------------ */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int parse_double(const char *flag, const char *s, double lo,
                        int lo_inclusive, double *out) {
  char *end;
  double v = strtod(s, &end);
  if (!*s || *end || !isfinite(v) || v < lo || (!lo_inclusive && v == lo)) {
    tool_error("%s: expected a number %s %g, found \"%s\"", flag,
               lo_inclusive ? ">=" : ">", lo, s);
    return 0;
  }
  *out = v;
  return 1;
}

static int parse_seed(const char *s, uint64_t *out) {
  char *end;
  if (!*s || *s == '-') goto bad;
  unsigned long long v = strtoull(s, &end, 0);
  if (*end) goto bad;
  *out = (uint64_t)v;
  return 1;
bad:
  tool_error("--seed: expected a non-negative integer, found \"%s\"", s);
  return 0;
}

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

/* ------------------------------------------------------------------------ */
/* One rank                                                                  */
/* ------------------------------------------------------------------------ */

static mpg_status rank_fail(sim_rank *r, mpg_status st, const char *fmt, ...) {
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

#define TRY(call, ...)                                                     \
  do {                                                                     \
    mpg_status st_ = (call);                                               \
    if (st_ != MPG_OK) return rank_fail(r, st_, __VA_ARGS__);              \
  } while (0)

/* Where element e of parameter k of this tp rank sits in the full model:
 * row i, column j of a matrix with `cols` columns. */
static void global_index(const sim_rank *r, int k, long e, int *i, int *j,
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
  if (!mine) return rank_fail(r, MPG_ERR_NOMEM, "group members");
  int *want = mine + world;
  mpg_status st = MPG_OK;
  for (int s = 0; s < job->nsets && st == MPG_OK; s++) {
    mpg_group *g;
    const char *name;
    int gi, pos, gsize;
    mpg_mesh_dimset_info(job->mesh, s, &name, NULL, NULL);
    st = mpg_ctx_group_at(r->ctx, s, &g);
    if (st != MPG_OK) {
      rank_fail(r, st, "group %s", name);
      break;
    }
    mpg_mesh_group_of(job->mesh, s, r->rank, &gi, &pos, &gsize);
    mpg_mesh_group_members(job->mesh, s, gi, want);
    int n = mpg_group_size(g);
    int same = n == gsize && mpg_group_rank(g) == pos && mpg_group_index(g) == gi;
    for (int p = 0; same && p < n; p++)
      same = mpg_group_member(g, p, &mine[p]) == MPG_OK && mine[p] == want[p];
    if (!same) {
      char a[GROUP_STR], b[GROUP_STR];
      format_members(a, sizeof a, mine, n < gsize ? n : gsize);
      format_members(b, sizeof b, want, gsize);
      st = rank_fail(r, MPG_ERR_STATE,
                     "group %s: the context gives index %d position %d of %d "
                     "%s, the mesh says index %d position %d of %d %s",
                     name, mpg_group_index(g), mpg_group_rank(g), n, a, gi, pos,
                     gsize, b);
      break;
    }
    format_members(r->res->group[s], GROUP_STR, mine, n);
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
    TRY(mpg_sync_add_param(sync, param_names[k], (size_t)r->count[k], MPG_F32,
                           &po, &id),
        "registering %s on the %s sync", param_names[k], which);
    if (id != r->pid[k])
      return rank_fail(r, MPG_ERR_STATE, "%s got id %d on the %s sync, %d on the first",
                       param_names[k], id, which, r->pid[k]);
  }
  TRY(mpg_sync_commit(sync), "mpg_sync_commit of the %s sync", which);
  return MPG_OK;
}

/* Shard modes: the range of each param this rank updates, and where its
 * optimizer state sits (mpg_sync_shard). */
static mpg_status rank_shard_ranges(sim_rank *r) {
  mpg_sync_stats ss = MPG_SYNC_STATS_INIT;
  TRY(mpg_sync_get_stats(r->ssync, &ss), "mpg_sync_get_stats");
  r->res->shard_stats = ss;
  r->last_sharded = -1;
  long extra = 0;
  for (int k = 0; k < SIM_NPARAMS; k++) {
    mpg_shard_info info = MPG_SHARD_INFO_INIT;
    TRY(mpg_sync_shard(r->ssync, r->pid[k], &info), "mpg_sync_shard(%s)",
        param_names[k]);
    if (info.sharded) {
      if (info.param_offset + info.count > (size_t)r->count[k] ||
          info.shard_offset + info.count > ss.shard_elems)
        return rank_fail(r, MPG_ERR_STATE,
                         "mpg_sync_shard(%s): [%zu, +%zu) of %ld elements at state "
                         "offset %zu of %zu",
                         param_names[k], info.param_offset, info.count,
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

static mpg_status rank_setup(sim_rank *r) {
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
        param_names[k]);
    r->grad[k] = r->sgrad[k] = v;
    if (r->ssync && r->ssync != r->sync) {
      TRY(mpg_sync_grad(r->ssync, r->pid[k], &v),
          "gradient view of %s in the sharded sync", param_names[k]);
      r->sgrad[k] = v;
    }
  }
  mpg_group *rg;
  TRY(mpg_sync_param_group(r->sync, r->pid[SIM_W1], &rg), "reduce group");
  int len = snprintf(r->res->reduce, GROUP_STR, "%s(%d)", mpg_group_name(rg),
                     mpg_group_size(rg));
  if (r->ssync && r->ssync != r->sync && len > 0 && len < GROUP_STR) {
    TRY(mpg_sync_param_group(r->ssync, r->pid[SIM_W1], &rg),
        "reduce group of the sharded sync");
    snprintf(r->res->reduce + len, GROUP_STR - (size_t)len, "+%s(%d)",
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
    return rank_fail(r, MPG_ERR_NOMEM, "buffers of %ld parameters", r->nparam);

  /* The params: the sharded sync's param buffer, or our own array.  The
   * optimizer's range of each, and its state (only the owned elements in
   * the shard modes). */
  if (r->ssync) {
    for (int k = 0; k < SIM_NPARAMS; k++) {
      void *v;
      TRY(mpg_sync_param(r->ssync, r->pid[k], &v), "mpg_sync_param(%s)",
          param_names[k]);
      r->pv[k] = v;
    }
    st = rank_shard_ranges(r);
    if (st != MPG_OK) return st;
  } else {
    r->param = calloc((size_t)r->nparam, sizeof(float));
    if (!r->param)
      return rank_fail(r, MPG_ERR_NOMEM, "buffers of %ld parameters", r->nparam);
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
      return rank_fail(r, MPG_ERR_NOMEM, "optimizer state of %ld elements", r->nstate);
  }
  /* Every rank computes its own slice of the initial weights (the same on
   * every rank of a shard group), so no broadcast is needed. */
  for (int k = 0; k < SIM_NPARAMS; k++)
    for (long e = 0; e < r->count[k]; e++) {
      int i, j, cols;
      global_index(r, k, e, &i, &j, &cols);
      r->pv[k][e] = (float)sim_init_param(m, k, i, j);
    }
  return MPG_OK;
}

/* Shard modes: at the first use of a param in the step's forward, wait for
 * its bucket of the gather started after the last update (which starts the
 * next bucket's gather). */
static mpg_status rank_first_use(sim_rank *r, int k) {
  if (!r->gather_open || !r->sharded[k]) return MPG_OK; /* replicated: nothing to wait for */
  TRY(mpg_sync_gather_wait(r->ssync, r->pid[k]), "mpg_sync_gather_wait(%s)",
      param_names[k]);
  /* The last sharded param in forward order sits in the last bucket, whose
   * wait ends the gather. */
  if (k == r->last_sharded) r->gather_open = 0;
  return MPG_OK;
}

#define FIRST_USE(k)                                                       \
  do {                                                                     \
    mpg_status fu_ = rank_first_use(r, (k));                               \
    if (fu_ != MPG_OK) return fu_;                                         \
  } while (0)

/* Forward and backward of micro-batch `mb` of step `step`: the sync's step
 * is begun between the two; gradients are added to the sync's views and
 * marked ready in backward order.  Adds the sum of squared errors to
 * *sse. */
static mpg_status rank_microbatch(sim_rank *r, long step, int mb, double *sse) {
  const sim_job *job = r->job;
  const sim_model *m = &job->model;
  const int din = m->d_in, dout = m->d_out, hl = r->hl;
  const float *w1 = r->pv[SIM_W1];
  const float *b1 = r->pv[SIM_B1];
  const float *w2 = r->pv[SIM_W2];
  const float *b2 = r->pv[SIM_B2];

  /* dp splits the samples, micro-batches split the rank's samples, cp
   * splits the tokens of every sample. */
  int s_lo, s_hi, m_lo, m_hi, t_lo, t_hi;
  sim_split(m->batch, job->dp, r->dp_pos, &s_lo, &s_hi);
  sim_split(s_hi - s_lo, job->microbatches, mb, &m_lo, &m_hi);
  sim_split(m->seq, job->cp, r->cp_pos, &t_lo, &t_hi);
  int ntok_s = t_hi - t_lo;
  int nt = (m_hi - m_lo) * ntok_s;

  /* Forward: column-parallel W1, tanh, row-parallel W2 (partial sums);
   * in the shard modes each param is waited for at its first use. */
  FIRST_USE(SIM_W1);
  FIRST_USE(SIM_B1);
  for (int n = 0; n < nt; n++) {
    int sample = s_lo + m_lo + n / ntok_s, token = t_lo + n % ntok_s;
    double *x = r->tok, *t = r->tok + din;
    sim_token(m, step, sample, token, x, t);
    for (int i = 0; i < din; i++) r->x[(size_t)n * din + i] = (float)x[i];
    for (int k = 0; k < dout; k++) r->t[(size_t)n * dout + k] = (float)t[k];
    float *a = r->a + (size_t)n * hl;
    for (int j = 0; j < hl; j++) {
      double h = b1[j];
      for (int i = 0; i < din; i++) h += x[i] * (double)w1[(size_t)i * hl + j];
      a[j] = (float)tanh(h);
    }
  }
  FIRST_USE(SIM_W2);
  for (int n = 0; n < nt; n++) {
    const float *a = r->a + (size_t)n * hl;
    for (int k = 0; k < dout; k++) {
      double y = 0.0;
      for (int j = 0; j < hl; j++) y += (double)a[j] * w2[(size_t)j * dout + k];
      r->yp[(size_t)n * dout + k] = (float)y;
    }
  }
  /* g: all-reduce the partial outputs over tp (its conjugate f, on the
   * input, is the identity in forward and an all-reduce of the input's
   * gradient in backward, which this model does not need).  An empty
   * micro-batch (more micro-batches than samples) still issues it, on one
   * token of zeros: every rank issues the same collectives in the same
   * order (the issue-order rule), only the counts of separate tp groups
   * differ. */
  if (nt == 0)
    for (int k = 0; k < dout; k++) r->yp[k] = 0.0f;
  TRY(mpg_all_reduce(r->tp, r->yp, r->yp, (size_t)(nt > 0 ? nt : 1) * dout, MPG_F32,
                     MPG_OP_SUM, NULL, NULL),
      "tp all-reduce of the MLP output");

  /* Loss, and dL/dy scaled so that the library's average over dp_cp (or
   * over cp and then dp with --fsdp) yields the gradient of the global
   * mean. */
  FIRST_USE(SIM_B2);
  const double dscale =
      2.0 * job->grad_factor / ((double)m->batch * m->seq * dout);
  for (size_t e = 0; e < (size_t)nt * dout; e++) {
    double y = (double)r->yp[e] + b2[e % (size_t)dout];
    double err = y - (double)r->t[e];
    *sse += err * err;
    r->dy[e] = dscale * err;
  }

  /* Backward, last layer first; each gradient goes straight into its view
   * and is marked ready at once, so its bucket can start reducing. */
  int last = mb == job->microbatches - 1;
  TRY(mpg_sync_begin(r->sync, step, last, NULL), "mpg_sync_begin");
  double *g = r->gacc;
  float *view;
  /* b2 (replicated over tp: the same on every tp rank; in the shard modes
   * registered with reduce dims that include tp, like a sequence-parallel
   * norm, so that it takes the replicated path) */
  view = r->grad[SIM_B2];
  for (int k = 0; k < dout; k++) g[k] = 0.0;
  for (int n = 0; n < nt; n++)
    for (int k = 0; k < dout; k++) g[k] += r->dy[(size_t)n * dout + k];
  for (int k = 0; k < dout; k++) view[k] += (float)(g[k] * job->b2_factor);
  TRY(mpg_sync_mark_ready(r->sync, r->pid[SIM_B2]), "marking b2 ready");
  /* W2 (rows of this tp rank) */
  view = r->grad[SIM_W2];
  for (long e = 0; e < r->count[SIM_W2]; e++) g[e] = 0.0;
  for (int n = 0; n < nt; n++) {
    const float *a = r->a + (size_t)n * hl;
    const double *dy = r->dy + (size_t)n * dout;
    for (int j = 0; j < hl; j++)
      for (int k = 0; k < dout; k++) g[(size_t)j * dout + k] += a[j] * dy[k];
  }
  for (long e = 0; e < r->count[SIM_W2]; e++) view[e] += (float)g[e];
  TRY(mpg_sync_mark_ready(r->sync, r->pid[SIM_W2]), "marking w2 ready");
  /* through tanh to h */
  for (int n = 0; n < nt; n++) {
    const float *a = r->a + (size_t)n * hl;
    const double *dy = r->dy + (size_t)n * dout;
    for (int j = 0; j < hl; j++) {
      double da = 0.0;
      for (int k = 0; k < dout; k++) da += (double)w2[(size_t)j * dout + k] * dy[k];
      r->dh[(size_t)n * hl + j] = da * (1.0 - (double)a[j] * a[j]);
    }
  }
  /* b1 (columns of this tp rank) */
  view = r->grad[SIM_B1];
  for (int j = 0; j < hl; j++) g[j] = 0.0;
  for (int n = 0; n < nt; n++)
    for (int j = 0; j < hl; j++) g[j] += r->dh[(size_t)n * hl + j];
  for (int j = 0; j < hl; j++) view[j] += (float)g[j];
  TRY(mpg_sync_mark_ready(r->sync, r->pid[SIM_B1]), "marking b1 ready");
  /* W1 (columns of this tp rank) */
  view = r->grad[SIM_W1];
  for (long e = 0; e < r->count[SIM_W1]; e++) g[e] = 0.0;
  for (int n = 0; n < nt; n++) {
    const float *x = r->x + (size_t)n * din;
    const double *dh = r->dh + (size_t)n * hl;
    for (int i = 0; i < din; i++)
      for (int j = 0; j < hl; j++) g[(size_t)i * hl + j] += x[i] * dh[j];
  }
  for (long e = 0; e < r->count[SIM_W1]; e++) view[e] += (float)g[e];
  TRY(mpg_sync_mark_ready(r->sync, r->pid[SIM_W1]), "marking w1 ready");
  return MPG_OK;
}

/* --fsdp: the gradients the first sync averaged over cp go through the
 * sharded sync, which reduce-scatters them over dp (each rank keeps the
 * averaged gradient of the elements it owns). */
static mpg_status rank_fsdp_reduce(sim_rank *r, long step) {
  TRY(mpg_sync_begin(r->ssync, step, 1, NULL), "mpg_sync_begin of the sharded sync");
  for (int k = SIM_NPARAMS - 1; k >= 0; k--) {
    memcpy(r->sgrad[k], r->grad[k], sizeof(float) * (size_t)r->count[k]);
    TRY(mpg_sync_mark_ready(r->ssync, r->pid[k]), "marking %s ready in the sharded sync",
        param_names[k]);
  }
  TRY(mpg_sync_finish(r->ssync), "mpg_sync_finish of the sharded sync");
  if (!mpg_sync_grads_valid(r->ssync))
    return rank_fail(r, MPG_ERR_STATE,
                     "mpg_sync_finish returned MPG_OK but the sharded gradients "
                     "are not valid");
  return MPG_OK;
}

/* The optimizer step on synchronised gradients: every param's range (all
 * of it when replicated, the owned part in the shard modes) from the
 * gradient at the same place, with the state of those elements; then, in
 * the shard modes, start gathering the updated params. */
static mpg_status rank_update(sim_rank *r, long step) {
  const sim_job *job = r->job;
  if (job->mode == SIM_FSDP) {
    mpg_status st = rank_fsdp_reduce(r, step);
    if (st != MPG_OK) return st;
  }
  double unused_m = 0.0, unused_v = 0.0;
  for (int k = 0; k < SIM_NPARAMS; k++) {
    float *p = r->pv[k] + r->lo[k];
    const float *g = r->sgrad[k] + r->lo[k];
    for (long e = 0; e < r->n[k]; e++) {
      double *mo = r->mom ? &r->mom[r->st[k] + e] : &unused_m;
      double *va = r->var ? &r->var[r->st[k] + e] : &unused_v;
      double d = sim_opt_delta(&job->model, step + 1, (double)g[e], mo, va);
      p[e] = (float)((double)p[e] - d);
    }
  }
  if (r->ssync) {
    TRY(mpg_sync_gather_begin(r->ssync, NULL), "mpg_sync_gather_begin");
    r->gather_open = 1;
  }
  return MPG_OK;
}

static mpg_status rank_train(sim_rank *r) {
  const sim_job *job = r->job;
  const sim_model *m = &job->model;
  int every = job->steps >= 10 ? job->steps / 10 : 1;
  for (long s = 0; s < job->steps; s++) {
    snprintf(r->where, sizeof r->where, "rank %d, step %ld", r->rank, s);
    if (r->rank == job->fail_rank && s == job->fail_step) {
      r->res->injected = 1;
      r->res->status = MPG_ERR_ABORTED;
      snprintf(r->res->msg, sizeof r->res->msg,
               "%s: stopped by --fail-rank without a word to its peers",
               r->where);
      return MPG_ERR_ABORTED;
    }
    double sse = 0.0;
    for (int mb = 0; mb < job->microbatches; mb++) {
      int last = mb == job->microbatches - 1;
      /* forward, mpg_sync_begin, backward */
      mpg_status st = rank_microbatch(r, s, mb, &sse);
      if (st != MPG_OK) return st;
      /* finish closes every micro-batch; it communicates (and waits) on
       * the last one only. */
      TRY(mpg_sync_finish(r->sync), "mpg_sync_finish");
      if (last) {
        if (!mpg_sync_grads_valid(r->sync))
          return rank_fail(r, MPG_ERR_STATE,
                           "mpg_sync_finish returned MPG_OK but the gradients "
                           "are not valid");
      }
    }
    if (!job->quiet && ((s + 1) % every == 0 || s + 1 == job->steps)) {
      /* The loss of the step: every dp_cp group covers every token once. */
      TRY(mpg_all_reduce(r->dp_cp, &sse, &sse, 1, MPG_F64, MPG_OP_SUM, NULL,
                         NULL),
          "loss all-reduce");
      if (r->rank == 0) {
        printf("step %ld/%d loss %.6g (reference %.6g)\n", s + 1, job->steps,
               sse / ((double)m->batch * m->seq * m->d_out), job->ref->loss[s]);
        fflush(stdout);
      }
    }
    mpg_status st = rank_update(r, s);
    if (st != MPG_OK) return st;
    TRY(mpg_sync_zero_grads(r->sync), "mpg_sync_zero_grads");
    if (r->ssync && r->ssync != r->sync)
      TRY(mpg_sync_zero_grads(r->ssync), "mpg_sync_zero_grads of the sharded sync");
  }
  snprintf(r->where, sizeof r->where, "rank %d, after training", r->rank);
  if (r->gather_open) {
    /* the params of the last update, for the comparison */
    TRY(mpg_sync_gather_all(r->ssync), "mpg_sync_gather_all");
    r->gather_open = 0;
  }
  return MPG_OK;
}

/* Compare with the matching slice of the reference. */
static void rank_compare(sim_rank *r) {
  const sim_reference *ref = r->job->ref;
  double worst = 0.0;
  int worst_k = 0;
  for (int k = 0; k < SIM_NPARAMS; k++) {
    double diff = 0.0, scale = 0.0;
    for (long e = 0; e < r->count[k]; e++) {
      int i, j, cols;
      global_index(r, k, e, &i, &j, &cols);
      double want = ref->param[k][(size_t)i * cols + j];
      double d = fabs((double)r->pv[k][e] - want);
      if (!(d <= diff)) diff = d; /* NaN sticks */
      if (fabs(want) > scale) scale = fabs(want);
    }
    double rel = diff / (scale > 1e-30 ? scale : 1e-30);
    if (!(rel <= worst)) {
      worst = rel;
      worst_k = k;
    }
  }
  r->res->err = worst;
  r->res->worst_param = worst_k;
}

static void rank_free(sim_rank *r) {
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

static mpg_status rank_main(const mpg_init_opts *opts, void *arg) {
  const sim_job *job = arg;
  sim_rank *r = calloc(1, sizeof *r); /* rank threads have small stacks */
  if (!r) {
    job->results[opts->rank].started = 1;
    job->results[opts->rank].status = MPG_ERR_NOMEM;
    snprintf(job->results[opts->rank].msg, MSG_MAX, "rank %d: out of memory",
             opts->rank);
    return MPG_ERR_NOMEM;
  }
  r->job = job;
  r->res = &job->results[opts->rank];
  r->res->started = 1;
  r->opts = *opts; /* as received from mpg_thread_run ... */
  r->opts.lazy_groups = job->lazy_groups; /* ... plus the spec's choice */
  r->rank = opts->rank;
  mpg_status st = rank_setup(r);
  if (st == MPG_OK) st = rank_train(r);
  if (st == MPG_OK) {
    rank_compare(r);
    mpg_sync_stats stats = MPG_SYNC_STATS_INIT;
    mpg_sync_get_stats(r->sync, &stats);
    r->res->stats = stats;
    if (r->ssync) {
      mpg_sync_stats ss = MPG_SYNC_STATS_INIT;
      mpg_sync_get_stats(r->ssync, &ss);
      r->res->shard_stats = ss;
    }
    r->res->done = 1;
  } else if (r->ctx && !r->res->injected) {
    /* Wake the peers now instead of letting them reach their timeout.  (A
     * rank stopped by --fail-rank leaves without a word, as a crashed
     * process would: its peers must find out by their timeout.) */
    mpg_ctx_abort(r->ctx);
  }
  r->res->status = st;
  rank_free(r);
  free(r);
  return st;
}

/* ------------------------------------------------------------------------ */
/* The command                                                               */
/* ------------------------------------------------------------------------ */

static int find_dim(const mpg_spec *spec, const char *name) {
  for (int d = 0; d < spec->ndims; d++)
    if (strcmp(spec->dims[d].name, name) == 0) return d;
  return -1;
}

/* The data dims present in the spec, in mesh order, as "dp,cp" or
 * "dp_replicate,dp_shard,cp". */
static void data_dims_list(const mpg_spec *spec, char *buf, size_t cap) {
  static const char *const data[4] = {"dp", "dp_replicate", "dp_shard", "cp"};
  int idx[4], order[4], n = 0;
  for (int k = 0; k < 4; k++) {
    idx[k] = find_dim(spec, data[k]);
    if (idx[k] >= 0) order[n++] = k;
  }
  for (int a = 1; a < n; a++) /* insertion sort by mesh position */
    for (int b = a; b > 0 && idx[order[b]] < idx[order[b - 1]]; b--) {
      int t = order[b];
      order[b] = order[b - 1];
      order[b - 1] = t;
    }
  size_t len = 0;
  buf[0] = '\0';
  for (int k = 0; k < n && len < cap; k++) {
    int w = snprintf(buf + len, cap - len, "%s%s", k ? "," : "", data[order[k]]);
    if (w < 0) break;
    len += (size_t)w;
  }
}

/* Give the spec what the model needs: the data dims (dp, or dp_replicate
 * and dp_shard), cp and tp (a missing one is added with size 1, innermost)
 * and the flattened set dp_cp of every data dim and cp. */
static int complete_spec(mpg_spec *spec, char *added, size_t cap) {
  static const char *const need[3] = {"dp", "cp", "tp"};
  int hsdp_named = find_dim(spec, "dp_replicate") >= 0 || find_dim(spec, "dp_shard") >= 0;
  added[0] = '\0';
  for (int k = 0; k < 3; k++) {
    if (find_dim(spec, need[k]) >= 0) continue;
    if (k == 0 && hsdp_named) continue; /* dp_replicate x dp_shard are the data dims */
    if (spec->ndims >= MPG_MAX_DIMS) {
      tool_error("the mesh has no dim \"%s\" and no room to add one "
                 "(at most %d dims)", need[k], MPG_MAX_DIMS);
      return 0;
    }
    mpg_dim *d = &spec->dims[spec->ndims++];
    memset(d, 0, sizeof *d);
    snprintf(d->name, sizeof d->name, "%s", need[k]);
    d->size = 1;
    size_t len = strlen(added);
    snprintf(added + len, cap - len, "%s%s=1", len ? ", " : "", need[k]);
  }
  int have = 0;
  for (int f = 0; f < spec->nflatten; f++)
    if (strcmp(spec->flatten[f].name, "dp_cp") == 0) have = 1;
  if (!have) {
    char dims[80];
    data_dims_list(spec, dims, sizeof dims);
    mpg_status st = mpg_spec_add_flatten(spec, "dp_cp", dims);
    if (st != MPG_OK) {
      tool_fail(st, NULL);
      return 0;
    }
    size_t len = strlen(added);
    snprintf(added + len, cap - len, "%sdp_cp=[%s]", len ? ", " : "", dims);
  }
  mpg_status st = mpg_spec_validate(spec);
  if (st != MPG_OK) {
    tool_fail(st, NULL);
    return 0;
  }
  return 1;
}

/* --hsdp R: replace the dim dp (size D, resolved by `mesh`) with
 * dp_replicate = R and dp_shard = D / R at its place, in the dims and in
 * every flattened set that names dp; every other size is fixed to the
 * mesh's (a -1 is resolved).  A mesh that already names dp_replicate and
 * dp_shard is kept when its dp_replicate is R.  Returns 1, or 0 after an
 * error message. */
static int hsdp_split(mpg_spec *spec, const mpg_mesh *mesh, int R, char *note,
                      size_t cap) {
  note[0] = '\0';
  int dp = find_dim(spec, "dp");
  if (dp < 0) {
    int dr = find_dim(spec, "dp_replicate");
    int size = 0;
    if (dr >= 0) mpg_mesh_dim(mesh, dr, NULL, &size);
    if (dr < 0 || find_dim(spec, "dp_shard") < 0) {
      tool_error("--hsdp %d: the mesh has no dim \"dp\" to split (nor dims "
                 "dp_replicate and dp_shard)", R);
      return 0;
    }
    if (size != R) {
      tool_error("--hsdp %d: the mesh already has dp_replicate=%d", R, size);
      return 0;
    }
    return 1;
  }
  int D = 0;
  mpg_mesh_dim(mesh, dp, NULL, &D);
  if (D % R != 0) {
    tool_error("--hsdp %d: dp=%d does not split into %d replicas of equal size", R, D, R);
    return 0;
  }
  if (spec->ndims >= MPG_MAX_DIMS) {
    tool_error("--hsdp: no room for one more dim (at most %d)", MPG_MAX_DIMS);
    return 0;
  }
  for (int d = 0; d < spec->ndims; d++) mpg_mesh_dim(mesh, d, NULL, &spec->dims[d].size);
  memmove(&spec->dims[dp + 2], &spec->dims[dp + 1],
          sizeof spec->dims[0] * (size_t)(spec->ndims - dp - 1));
  spec->ndims++;
  memset(&spec->dims[dp], 0, sizeof spec->dims[0] * 2);
  snprintf(spec->dims[dp].name, MPG_NAME_MAX, "dp_replicate");
  spec->dims[dp].size = R;
  snprintf(spec->dims[dp + 1].name, MPG_NAME_MAX, "dp_shard");
  spec->dims[dp + 1].size = D / R;
  for (int f = 0; f < spec->nflatten; f++) {
    mpg_flatten *fl = &spec->flatten[f];
    for (int k = 0; k < fl->ndims; k++) {
      if (strcmp(fl->dims[k], "dp") != 0) continue;
      if (fl->ndims >= MPG_MAX_DIMS) {
        tool_error("--hsdp: no room for one more dim in the flattened set %s", fl->name);
        return 0;
      }
      memmove(&fl->dims[k + 2], &fl->dims[k + 1], sizeof fl->dims[0] * (size_t)(fl->ndims - k - 1));
      memmove(&fl->dim_pos[k + 2], &fl->dim_pos[k + 1],
              sizeof fl->dim_pos[0] * (size_t)(fl->ndims - k - 1));
      fl->ndims++;
      snprintf(fl->dims[k], MPG_NAME_MAX, "dp_replicate");
      snprintf(fl->dims[k + 1], MPG_NAME_MAX, "dp_shard");
      memset(&fl->dim_pos[k], 0, sizeof fl->dim_pos[0] * 2);
      break;
    }
  }
  mpg_status st = mpg_spec_validate(spec);
  if (st != MPG_OK) {
    tool_fail(st, NULL);
    return 0;
  }
  snprintf(note, cap, "dp=%d split into dp_replicate=%d x dp_shard=%d (--hsdp %d)", D, R,
           D / R, R);
  return 1;
}

/* Mask of mesh dims named by "a,b" (dims or flattened sets); -1 after an
 * error message naming `what`. */
static int dims_mask(const mpg_mesh *mesh, const char *list, const char *what,
                     unsigned *mask) {
  char buf[256];
  snprintf(buf, sizeof buf, "%s", list);
  *mask = 0;
  char *save = NULL;
  for (char *tok = strtok_r(buf, ", ", &save); tok; tok = strtok_r(NULL, ", ", &save)) {
    int set, dims[MPG_MAX_DIMS], n;
    mpg_status st = mpg_mesh_dimset_find(mesh, tok, &set);
    if (st == MPG_OK) st = mpg_mesh_dimset_dims(mesh, set, dims, &n);
    if (st != MPG_OK) {
      tool_error("%s \"%s\": %s", what, list, mpg_last_error());
      return -1;
    }
    for (int k = 0; k < n; k++) *mask |= 1u << dims[k];
  }
  return 0;
}

/* The ranks of a group over the dims of `mask`. */
static int mask_size(const mpg_mesh *mesh, unsigned mask) {
  int n = 1;
  for (int d = 0; d < mpg_mesh_ndims(mesh); d++)
    if (mask & (1u << d)) {
      int size;
      mpg_mesh_dim(mesh, d, NULL, &size);
      n *= size;
    }
  return n;
}

/* The mesh must be the model's: data dims dp, or dp_replicate and dp_shard;
 * cp and tp; other dims of size 1; dp_cp exactly the data dims and cp. */
static int check_mesh(const mpg_mesh *mesh, sim_job *job) {
  int nd = mpg_mesh_ndims(mesh);
  job->dim_dp = job->dim_dpr = job->dim_dps = job->dim_cp = job->dim_tp = -1;
  for (int d = 0; d < nd; d++) {
    const char *name;
    int size;
    mpg_mesh_dim(mesh, d, &name, &size);
    if (strcmp(name, "dp") == 0) job->dim_dp = d, job->dp = size;
    else if (strcmp(name, "dp_replicate") == 0) job->dim_dpr = d, job->dpr = size;
    else if (strcmp(name, "dp_shard") == 0) job->dim_dps = d, job->dps = size;
    else if (strcmp(name, "cp") == 0) job->dim_cp = d, job->cp = size;
    else if (strcmp(name, "tp") == 0) job->dim_tp = d, job->tp = size;
    else if (size != 1) {
      tool_error("sim: the model is parallel over dp (or dp_replicate x dp_shard), "
                 "cp and tp only; dim \"%s\" must have size 1, found %d", name, size);
      return 0;
    }
  }
  unsigned data = 1u << job->dim_cp;
  if (job->dim_dp >= 0 && (job->dim_dpr >= 0 || job->dim_dps >= 0)) {
    tool_error("sim: the data-parallel dims are either dp or dp_replicate and "
               "dp_shard, not both");
    return 0;
  }
  if (job->dim_dp < 0) {
    if (job->dim_dpr < 0 || job->dim_dps < 0) {
      tool_error("sim: dim %s needs dim %s (HSDP names both)",
                 job->dim_dpr >= 0 ? "dp_replicate" : "dp_shard",
                 job->dim_dpr >= 0 ? "dp_shard" : "dp_replicate");
      return 0;
    }
    job->dp = job->dpr * job->dps;
    data |= (1u << job->dim_dpr) | (1u << job->dim_dps);
  } else {
    job->dpr = 1;
    job->dps = job->dp;
    data |= 1u << job->dim_dp;
  }
  unsigned dpcp;
  if (dims_mask(mesh, "dp_cp", "the flattened set", &dpcp) != 0) return 0;
  if (dpcp != data) {
    tool_error("sim: the flattened set dp_cp must hold exactly the dims %s "
               "(gradients are averaged over it)",
               job->dim_dp >= 0 ? "dp and cp" : "dp_replicate, dp_shard and cp");
    return 0;
  }
  job->nsets = mpg_mesh_num_dimsets(mesh) - 1; /* all but "world" */
  return 1;
}

static void print_row_sep(int width) {
  for (int i = 0; i < width; i++) putchar('-');
  putchar('\n');
}

static void print_table(const sim_job *job, int world) {
  const mpg_mesh *mesh = job->mesh;
  int nd = mpg_mesh_ndims(mesh);
  int wset[MAX_SETS], wred = 6;
  for (int s = 0; s < job->nsets; s++) {
    const char *name;
    mpg_mesh_dimset_info(mesh, s, &name, NULL, NULL);
    wset[s] = (int)strlen(name);
    for (int r = 0; r < world; r++) {
      int l = (int)strlen(job->results[r].group[s]);
      if (l > wset[s]) wset[s] = l;
    }
  }
  for (int r = 0; r < world; r++) {
    int l = (int)strlen(job->results[r].reduce);
    if (l > wred) wred = l;
  }
  int width = printf("%5s ", "rank");
  for (int d = 0; d < nd; d++) {
    const char *name;
    mpg_mesh_dim(mesh, d, &name, NULL);
    width += printf(" %3s", name);
  }
  width += printf("  ");
  for (int s = 0; s < job->nsets; s++) {
    const char *name;
    mpg_mesh_dimset_info(mesh, s, &name, NULL, NULL);
    width += printf(" %-*s", wset[s], name);
  }
  width += printf("  %-*s", wred, "reduce");
  if (job->mode != SIM_REPLICATE) width += printf("  %7s", "owned");
  width += printf("  %s\n", "max rel err") - 1;
  print_row_sep(width);
  for (int r = 0; r < world; r++) {
    const sim_result *res = &job->results[r];
    int failed = res->status != MPG_OK || !res->done;
    if (world > TABLE_ALL_UP_TO && r >= TABLE_EDGE && r < world - TABLE_EDGE &&
        !failed) {
      if (r == TABLE_EDGE) printf("  ... (ranks %d..%d not shown)\n", TABLE_EDGE,
                                  world - TABLE_EDGE - 1);
      continue;
    }
    printf("%5d ", r);
    for (int d = 0; d < nd; d++) printf(" %3d", res->coord[d]);
    printf("  ");
    for (int s = 0; s < job->nsets; s++)
      printf(" %-*s", wset[s], res->group[s][0] ? res->group[s] : "?");
    printf("  %-*s", wred, res->reduce[0] ? res->reduce : "?");
    if (job->mode != SIM_REPLICATE) {
      long owned = 0;
      for (int k = 0; k < SIM_NPARAMS; k++) owned += res->owned[k];
      if (res->done)
        printf("  %7ld", owned);
      else
        printf("  %7s", "?");
    }
    if (res->done)
      printf("  %.1e\n", res->err);
    else
      printf("  failed: %s\n", mpg_status_name(res->status));
  }
}

/* Print "name(size)" of a dims list into buf. */
static void dims_label(const mpg_mesh *mesh, const char *dims, char *buf, size_t cap) {
  unsigned mask = 0;
  if (dims_mask(mesh, dims, "dims", &mask) != 0) mask = 0;
  snprintf(buf, cap, "%s (%d rank%s)", dims, mask_size(mesh, mask),
           mask_size(mesh, mask) == 1 ? "" : "s");
}

int cmd_sim(int argc, char **argv) {
  tool_spec args = {0};
  int steps = 20, fsdp = 0, shard = 0, hsdp = 0, micro = 1, quiet = 0;
  int batch = 0, seq = 0, hidden = 0, adam = 1;
  double timeout = 0.0, lr = 0.0, bucket_mb = 0.0, tol = 1e-5;
  uint64_t seed = 1;
  int fail_rank = -1, fail_step = 0;

  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      fputs(sim_usage, stdout);
      return TOOL_EXIT_OK;
    } else if (strcmp(a, "--fsdp") == 0) {
      fsdp = 1;
    } else if (strcmp(a, "--shard") == 0) {
      shard = 1;
    } else if (strcmp(a, "--quiet") == 0 || strcmp(a, "-q") == 0) {
      quiet = 1;
    } else if (strcmp(a, "--steps") == 0 || strcmp(a, "--microbatches") == 0 ||
               strcmp(a, "--seed") == 0 || strcmp(a, "--timeout") == 0 ||
               strcmp(a, "--batch") == 0 || strcmp(a, "--seq") == 0 ||
               strcmp(a, "--hidden") == 0 || strcmp(a, "--lr") == 0 ||
               strcmp(a, "--bucket-mb") == 0 || strcmp(a, "--tol") == 0 ||
               strcmp(a, "--fail-rank") == 0 || strcmp(a, "--hsdp") == 0 ||
               strcmp(a, "--optim") == 0) {
      if (i + 1 >= argc) {
        tool_error("%s needs a value", a);
        fputs(sim_usage, stderr);
        return TOOL_EXIT_USAGE;
      }
      const char *v = argv[++i];
      int ok = 1;
      if (strcmp(a, "--steps") == 0) {
        ok = tool_parse_int(a, v, 1, &steps);
      } else if (strcmp(a, "--microbatches") == 0) {
        ok = tool_parse_int(a, v, 1, &micro);
      } else if (strcmp(a, "--batch") == 0) {
        ok = tool_parse_int(a, v, 1, &batch);
      } else if (strcmp(a, "--seq") == 0) {
        ok = tool_parse_int(a, v, 1, &seq);
      } else if (strcmp(a, "--hidden") == 0) {
        ok = tool_parse_int(a, v, 1, &hidden);
      } else if (strcmp(a, "--hsdp") == 0) {
        ok = tool_parse_int(a, v, 1, &hsdp);
      } else if (strcmp(a, "--optim") == 0) {
        if (strcmp(v, "adam") == 0) {
          adam = 1;
        } else if (strcmp(v, "sgd") == 0) {
          adam = 0;
        } else {
          tool_error("--optim: expected adam or sgd, found \"%s\"", v);
          ok = 0;
        }
      } else if (strcmp(a, "--seed") == 0) {
        ok = parse_seed(v, &seed);
      } else if (strcmp(a, "--timeout") == 0) {
        ok = parse_double(a, v, 0.0, 0, &timeout);
      } else if (strcmp(a, "--lr") == 0) {
        ok = parse_double(a, v, 0.0, 0, &lr);
      } else if (strcmp(a, "--fail-rank") == 0) {
        char rbuf[32];
        const char *colon = strchr(v, ':');
        size_t n = colon ? (size_t)(colon - v) : strlen(v);
        if (n >= sizeof rbuf) n = sizeof rbuf - 1;
        memcpy(rbuf, v, n);
        rbuf[n] = '\0';
        ok = tool_parse_int("--fail-rank", rbuf, 0, &fail_rank) &&
             (!colon || tool_parse_int("--fail-rank step", colon + 1, 0,
                                       &fail_step));
      } else if (strcmp(a, "--bucket-mb") == 0) {
        ok = parse_double(a, v, 0.0, 0, &bucket_mb);
      } else {
        ok = parse_double(a, v, 0.0, 1, &tol);
      }
      if (!ok) return TOOL_EXIT_USAGE;
    } else {
      int took = tool_spec_arg(&args, argc, argv, &i, sim_usage);
      if (took < 0) return TOOL_EXIT_USAGE;
      if (!took) {
        tool_error("unknown option \"%s\"", a);
        fputs(sim_usage, stderr);
        return TOOL_EXIT_USAGE;
      }
    }
  }
  if (fsdp + shard + (hsdp > 0) > 1) {
    tool_error("--shard, --hsdp and --fsdp exclude each other");
    fputs(sim_usage, stderr);
    return TOOL_EXIT_USAGE;
  }
  int world = args.world;

  /* The spec: a file, --mesh, or the seed mesh of DESIGN.md. */
  mpg_spec spec = MPG_SPEC_INIT;
  mpg_status st = tool_spec_load(
      &args, world ? "dp=-1,tp=2,cp=2" : "dp=2,tp=2,cp=2", &spec);
  if (st != MPG_OK) return tool_fail(st, NULL);
  if (spec.fsdp_owns_dp && (shard || hsdp)) {
    tool_error("%s: the spec sets [sync] fsdp_owns_dp = true (FSDP owns dp); "
               "the shard mode owns dp itself: drop one of them",
               shard ? "--shard" : "--hsdp");
    return TOOL_EXIT_FAIL;
  }
  if (fsdp && spec.sync_mode == MPG_SYNC_SHARD) {
    tool_error("--fsdp: the spec sets [sync] mode = \"shard\"; --fsdp runs its own "
               "pair of syncs: drop one of them");
    return TOOL_EXIT_FAIL;
  }
  char added[160], split_note[120] = "";
  if (!complete_spec(&spec, added, sizeof added)) return TOOL_EXIT_FAIL;
  mpg_mesh *mesh = NULL;
  st = mpg_mesh_create(&spec, world, &mesh);
  if (st != MPG_OK) return tool_fail(st, NULL);
  if (hsdp) {
    /* Split dp now that its size is known, and build the mesh again. */
    int ok = hsdp_split(&spec, mesh, hsdp, split_note, sizeof split_note);
    mpg_mesh_destroy(mesh);
    mesh = NULL;
    if (!ok) return TOOL_EXIT_FAIL;
    st = mpg_mesh_create(&spec, world, &mesh);
    if (st != MPG_OK) return tool_fail(st, NULL);
  }
  int world_size = mpg_mesh_world_size(mesh);

  sim_job job;
  memset(&job, 0, sizeof job);
  job.mesh = mesh;
  int rc = TOOL_EXIT_FAIL;
  sim_reference ref;
  memset(&ref, 0, sizeof ref);
  if (!check_mesh(mesh, &job)) goto out;

  /* The model and its data. */
  if (hidden == 0) hidden = (32 + job.tp - 1) / job.tp * job.tp;
  if (hidden % job.tp != 0) {
    tool_error("--hidden: %d hidden units do not split over tp=%d "
               "(give a multiple of %d)", hidden, job.tp, job.tp);
    goto out;
  }
  if (lr == 0.0) lr = adam ? 0.01 : 0.5;
  job.model.seed = seed;
  job.model.d_in = D_IN;
  job.model.d_out = D_OUT;
  job.model.hidden = hidden;
  job.model.batch = batch ? batch : 2 * job.dp * micro;
  job.model.seq = seq ? seq : 4 * job.cp;
  job.model.lr = lr;
  job.model.adam = adam;
  job.steps = steps;
  job.microbatches = micro;
  job.quiet = quiet;
  job.lazy_groups = spec.lazy_groups;
  job.mode = fsdp || spec.fsdp_owns_dp                            ? SIM_FSDP
             : shard || hsdp || spec.sync_mode == MPG_SYNC_SHARD ? SIM_SHARD
                                                                 : SIM_REPLICATE;
  job.fail_rank = fail_rank;
  job.fail_step = fail_step;
  if (fail_rank >= world_size) {
    tool_error("--fail-rank: rank %d is outside the world of %d ranks",
               fail_rank, world_size);
    goto out;
  }

  mpg_sync_opts sopts = MPG_SYNC_OPTS_INIT;
  st = mpg_sync_opts_from_spec(&spec, &sopts);
  if (st != MPG_OK) {
    tool_fail(st, NULL);
    goto out;
  }
  sopts.default_dims = NULL;
  if (bucket_mb > 0) {
    sopts.bucket_mb = bucket_mb;
    if (sopts.first_bucket_mb > bucket_mb) sopts.first_bucket_mb = bucket_mb;
  }
  job.b2_factor = 1.0;
  char shard_label[96] = "", rep_label[96] = "";
  if (job.mode == SIM_FSDP) {
    /* The first sync averages over cp only (FSDP owns dp); the second, in
     * shard mode over dp, does FSDP's part with the library. */
    if (job.dim_dp < 0) {
      tool_error("--fsdp: FSDP owns the dim dp, which this mesh does not have "
                 "(it has dp_replicate and dp_shard: use --shard or --hsdp)");
      goto out;
    }
    sopts.fsdp_owns_dp = 1;
    sopts.mode = MPG_SYNC_REPLICATE;
    sopts.shard_dims = sopts.replicate_dims = NULL;
    job.shard_opts = sopts;
    job.shard_opts.fsdp_owns_dp = 0;
    job.shard_opts.mode = MPG_SYNC_SHARD;
    job.shard_opts.shard_dims = "dp";
    job.b2_dims = "dp,tp";
    dims_label(mesh, "dp", shard_label, sizeof shard_label);
  } else if (job.mode == SIM_SHARD) {
    sopts.fsdp_owns_dp = 0;
    sopts.mode = MPG_SYNC_SHARD;
    if (hsdp) {
      sopts.shard_dims = "dp_shard,cp";
      sopts.replicate_dims = "dp_replicate";
    }
    /* Together the two must average over every data-parallel rank once. */
    unsigned smask, rmask = 0, data;
    if (dims_mask(mesh, "dp_cp", "dp_cp", &data) != 0 ||
        dims_mask(mesh, sopts.shard_dims ? sopts.shard_dims : "dp_cp",
                  "[sync] shard_dims", &smask) != 0 ||
        (sopts.replicate_dims &&
         dims_mask(mesh, sopts.replicate_dims, "[sync] replicate_dims", &rmask) != 0))
      goto out;
    if ((smask & rmask) != 0 || (smask | rmask) != data) {
      tool_error("sim: shard_dims \"%s\" and replicate_dims \"%s\" must together "
                 "name each data dim (those of dp_cp) exactly once, or the gradient "
                 "is not averaged over every data-parallel rank",
                 sopts.shard_dims ? sopts.shard_dims : "dp_cp",
                 sopts.replicate_dims ? sopts.replicate_dims : "");
      goto out;
    }
    job.b2_dims = "dp_cp,tp";
    dims_label(mesh, sopts.shard_dims ? sopts.shard_dims : "dp_cp", shard_label,
               sizeof shard_label);
    if (sopts.replicate_dims)
      dims_label(mesh, sopts.replicate_dims, rep_label, sizeof rep_label);
  } else {
    sopts.fsdp_owns_dp = 0;
  }
  /* b2 reduced over tp as well (shard modes): its tp copies are equal, so
   * an average leaves them as they are, and a sum needs 1/tp. */
  if (job.b2_dims && sopts.op == MPG_OP_SUM) job.b2_factor = 1.0 / job.tp;
  job.sync_opts = sopts;
  /* The divisor the reductions apply, which each rank's gradient carries
   * in advance: every data-parallel rank (dp x cp) once, whatever the
   * mode. */
  job.grad_factor = sopts.op == MPG_OP_AVG ? (double)job.dp * job.cp : 1.0;
  if (timeout <= 0) timeout = spec.timeout_s > 0 ? spec.timeout_s : 600.0;

  if (!quiet) {
    int nd = mpg_mesh_ndims(mesh);
    printf("meshpg sim: mesh");
    for (int d = 0; d < nd; d++) {
      const char *name;
      int size;
      mpg_mesh_dim(mesh, d, &name, &size);
      printf("%s%s=%d", d ? " x " : " ", name, size);
    }
    printf(" (world %d%s%s), %d rank%s as threads\n", world_size,
           spec.source[0] ? ", from " : "", spec.source, world_size,
           world_size == 1 ? "" : "s");
    if (added[0]) printf("  added for the model: %s\n", added);
    if (split_note[0]) printf("  %s\n", split_note);
    if (spec.backend != MPG_BACKEND_THREAD)
      printf("  (the spec's backend is not used: sim always runs the thread "
             "backend)\n");
    printf("model: MLP %d -> %d (tanh) -> %d; W1, b1 column-parallel and W2 "
           "row-parallel over tp=%d (%d hidden units each), b2 replicated%s\n",
           D_IN, hidden, D_OUT, job.tp, hidden / job.tp,
           job.b2_dims ? " (reduced over tp too, like a sequence-parallel norm)" : "");
    printf("data: %d samples x %d tokens per step (seed %llu): dp=%d splits "
           "the samples, cp=%d the tokens; %d micro-batch%s\n",
           job.model.batch, job.model.seq, (unsigned long long)seed, job.dp,
           job.cp, micro, micro == 1 ? "" : "es");
    const char *verb = sopts.op == MPG_OP_AVG ? "averages" : "sums";
    if (job.mode == SIM_FSDP) {
      printf("sync: meshpg %s gradients over cp (%d ranks) (fsdp_owns_dp); a "
             "second sync in shard mode reduce-scatters them over %s: each rank "
             "updates the elements it owns, and the params are gathered before "
             "their first use\n",
             verb, job.cp, shard_label);
    } else if (job.mode == SIM_SHARD) {
      printf("sync: shard mode: meshpg reduce-scatters (%s) every bucket over %s",
             sopts.op == MPG_OP_AVG ? "averaging" : "summing", shard_label);
      if (rep_label[0]) printf(", then all-reduces the owned shard over %s", rep_label);
      printf("; each rank updates the elements it owns, and the params are "
             "gathered before their first use\n");
    } else {
      printf("sync: meshpg %s gradients over dp_cp (%d ranks)\n", verb,
             job.dp * job.cp);
    }
    printf("training: %d %s steps, lr %g%s, compared with single-process f64 "
           "training (tolerance %.0e)\n",
           steps, adam ? "Adam" : "SGD", lr,
           adam && job.mode != SIM_REPLICATE ? " (state for the owned elements only)"
                                             : "",
           tol);
    fflush(stdout);
  }

  double t0 = now_s();
  if (sim_reference_train(&job.model, steps, &ref) != 0) {
    tool_error("out of memory for the reference model");
    goto out;
  }
  double t_ref = now_s() - t0;
  job.ref = &ref;
  job.results = calloc((size_t)world_size, sizeof(sim_result));
  if (!job.results) {
    tool_error("out of memory for %d ranks", world_size);
    goto out;
  }
  t0 = now_s();
  st = mpg_thread_run(world_size, timeout, rank_main, &job, NULL);
  double t_run = now_s() - t0;
  /* A rank that never got to run leaves its slot empty. */
  int started = 0;
  for (int r = 0; r < world_size; r++) started += job.results[r].started;
  if (st != MPG_OK && started == 0) {
    /* mpg_thread_run refused the world (size, threads): no rank ran */
    tool_fail(st, NULL);
    goto out;
  }
  int failed = 0, first_failed = -1, bad = 0, worst_rank = 0;
  double worst = 0.0;
  for (int r = 0; r < world_size; r++) {
    sim_result *res = &job.results[r];
    if (res->status != MPG_OK || !res->done) {
      if (res->status == MPG_OK) res->status = st != MPG_OK ? st : MPG_ERR_STATE;
      if (first_failed < 0) first_failed = r;
      failed++;
      continue;
    }
    if (!(res->err <= tol)) bad++;
    if (!(res->err <= worst)) {
      worst = res->err;
      worst_rank = r;
    }
  }
  if (st != MPG_OK && failed == 0) {
    /* every rank finished, yet the run failed */
    tool_fail(st, NULL);
    goto out;
  }

  if (!quiet) {
    putchar('\n');
    print_table(&job, world_size);
    const sim_result *r0 = &job.results[0];
    if (r0->done) {
      printf("\nsync on rank 0: %d params, %d buffer%s, %d bucket%s, %zu bytes "
             "of %s, %ld bucket launches\n",
             r0->stats.num_params, r0->stats.num_buffers,
             r0->stats.num_buffers == 1 ? "" : "s", r0->stats.num_buckets,
             r0->stats.num_buckets == 1 ? "" : "s", r0->stats.total_bytes,
             job.mode == SIM_SHARD ? "gradients and params" : "gradients",
             r0->stats.launched_buckets);
      if (job.mode != SIM_REPLICATE) {
        const mpg_sync_stats *ss = &r0->shard_stats;
        long total = 0;
        for (int k = 0; k < SIM_NPARAMS; k++)
          total += k == SIM_W1 ? (long)D_IN * (hidden / job.tp)
                   : k == SIM_B1 ? hidden / job.tp
                   : k == SIM_W2 ? (long)(hidden / job.tp) * D_OUT
                                 : D_OUT;
        long owned = 0;
        for (int k = 0; k < SIM_NPARAMS; k++) owned += r0->owned[k];
        printf("shard on rank 0: updates %ld of its %ld param elements, optimizer "
               "state of %zu elements (shard_elems), shard group of %d, %zu padding "
               "elements in %d bucket%s\n",
               owned, total, ss->shard_elems, ss->shard_size, ss->pad_elems,
               ss->num_buckets, ss->num_buckets == 1 ? "" : "s");
      }
    }
    printf("time: %d ranks x %d steps %.3f s (%.2f ms/step), reference %.3f s\n",
           world_size, steps, t_run, 1e3 * t_run / steps, t_ref);
  }
  if (failed) {
    /* The root cause first: a rank stopped on purpose, then one that
     * failed by itself, then the first timeout, then an abort. */
    int root = first_failed, best = 4;
    for (int r = 0; r < world_size; r++) {
      const sim_result *x = &job.results[r];
      if (x->status == MPG_OK) continue;
      int prio = x->injected                          ? 0
                 : x->status == MPG_ERR_ABORTED       ? 3
                 : x->status == MPG_ERR_TIMEOUT       ? 2
                 : x->msg[0]                          ? 1
                                                      : 3;
      if (prio < best) {
        best = prio;
        root = r;
      }
    }
    const sim_result *res = &job.results[root];
    printf("FAIL: %d of %d ranks failed; rank %d: %s\n", failed, world_size,
           root, res->msg[0] ? res->msg : mpg_status_name(res->status));
    fflush(stdout); /* the verdict before the details on stderr */
    int shown = 0;
    for (int r = 0; r < world_size && shown < 4; r++) {
      if (r == root || job.results[r].status == MPG_OK) continue;
      if (job.results[r].msg[0]) {
        tool_error("%s", job.results[r].msg);
        shown++;
      }
    }
  } else if (bad) {
    printf("FAIL: %d of %d ranks differ from the single-process reference "
           "(max rel err %.1e > %.0e at rank %d, param %s)\n",
           bad, world_size, worst, tol, worst_rank,
           param_names[job.results[worst_rank].worst_param]);
  } else {
    printf("PASS: all %d rank%s match%s the single-process reference "
           "(max rel err %.1e <= %.0e)\n",
           world_size, world_size == 1 ? "" : "s", world_size == 1 ? "es" : "",
           worst, tol);
    rc = TOOL_EXIT_OK;
  }

out:
  fflush(stdout);
  free(job.results);
  sim_reference_free(&ref);
  mpg_mesh_destroy(mesh);
  return rc;
}
