/* One simulated rank of `meshpg sim`: its state, shared by its two files,
 * and what sim_rank_setup.c defines for sim_rank.c (joining the world,
 * groups, syncs, buffers, initial weights; the first failure; teardown).
 * sim_rank.c (the training loop, the comparison with the reference, the
 * thread's entry point) calls down into sim_rank_setup.c, never the
 * reverse, so the header is named for the file that defines it
 * (tests/layout/check_layout.py, rule 2b: a header belongs to the .c of
 * its stem).
 *
 * Each rank is a thread that receives its init options from mpg_thread_run
 * and only uses the public API.  The ranks share, read-only, the mesh, the
 * job description and the reference; each writes only its own result slot;
 * only rank 0 prints, and only while the main thread waits. */
#ifndef TOOLS_SIM_RANK_SETUP_H
#define TOOLS_SIM_RANK_SETUP_H

#include "sim_internal.h"

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

/* Record the rank's first failure, "<where>: <what>: <why of st>", in its
 * result, and its status (MPG_ERR_STATE for st == MPG_OK).  Returns that
 * status. */
mpg_status sim_rank_fail(sim_rank *r, mpg_status st, const char *fmt, ...)
    TOOL_PRINTF(3, 4);

/* Return sim_rank_fail(r, st, ...) from the calling function when the
 * call fails with st. */
#define TRY(call, ...)                                                     \
  do {                                                                     \
    mpg_status st_ = (call);                                               \
    if (st_ != MPG_OK) return sim_rank_fail(r, st_, __VA_ARGS__);          \
  } while (0)

/* Where element e of parameter k of this tp rank sits in the full model:
 * row i, column j of a matrix with `cols` columns. */
void sim_rank_global_index(const sim_rank *r, int k, long e, int *i, int *j,
                           int *cols);

/* Join the world and set the rank up for training: its groups checked
 * against the mesh, its syncs with the params registered, its buffers, its
 * params at their initial values. */
mpg_status sim_rank_setup(sim_rank *r);

/* Free what sim_rank_setup made (not r itself). */
void sim_rank_free(sim_rank *r);

#endif
