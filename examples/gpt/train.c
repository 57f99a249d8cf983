/* The parallel trainer: one rank per thread (mpg_thread_run) or per
 * process (--mpi, the MPI backend under mpirun), each with its own meshpg
 * context on the mesh "pp=P,dp=D,cp=K,tp=T" (tp innermost; with HSDP
 * "pp=P,dp_replicate=R,dp_shard=S,cp=K,tp=T"), and the flattened set
 * dp_cp = (dp, cp) over which meshpg's default reduction averages.
 *
 *  - tp: Megatron tensor parallel inside gpt_forward / gpt_backward (model.c)
 *    over the "tp" group, optionally sequence parallel (--sp).
 *  - cp: each cp rank holds a contiguous chunk of seq / cp positions of
 *    every sequence; attention all-gathers K and V over "cp" (model.c).
 *    Its tokens' losses are scaled by cp so that the average over dp_cp is
 *    the gradient of the mean loss over the whole batch.
 *  - dp: each dp rank takes its slice of the global batch; gradients are
 *    averaged over dp_cp by mpg_sync, written straight into its views and
 *    marked ready as each layer's backward ends.  --shard: the sync in
 *    MPG_SYNC_SHARD mode (a distributed optimizer): each rank keeps the
 *    averaged gradient and the AdamW state of its owned ranges only,
 *    updates them, and the parameters (in the sync's parameter buffer) are
 *    all-gathered after the step, each layer waiting for its bucket at its
 *    first use in the next forward.  HSDP: shard over (dp_shard, cp),
 *    all-reduce the shards over dp_replicate.
 *  - pp: layers split over stages, 1F1B over the micro-batches, activations
 *    and their gradients moved with mpg_p2p_batch over "pp"; a send is
 *    batched with the next receive where the schedule has one (Megatron's
 *    send_forward_recv_backward / send_backward_recv_forward), so blocking
 *    MPI sends cannot deadlock; wte lives on the first stage (embedding)
 *    and the last (LM head), tied through mpg_ctx_group_select("pp",
 *    {0, P-1}) so the sync sums both gradients.
 *  - MoE (moe.h): the spec gets an expert grid (mpg_spec_set_experts(spec,
 *    etp, ep, NULL)); MoE layers dispatch tokens over "ep" and split each
 *    expert over "etp"; expert gradients are averaged over "edp" with the
 *    pre-multiplier derived at their registration below.
 *  - checkpoints (ckpt.c, --save / --resume): after the model is built
 *    every rank registers its tensors with an mpg_ckpt; a resume loads
 *    them (resharded to this mesh) before the first step, a save follows
 *    the optimizer step it names.  The structs below are in trainer.h,
 *    shared with ckpt.c; gpt_parse_mesh and the shard comparison are in
 *    train_util.c.
 */
#include "trainer.h"
#include "moe.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void on_ready(void *arg, int id) {
  rank_state *rs = arg;
  if (rs->param_of[id] < 0) return;
  /* A sequence-parallel replicated parameter's gradient is a partial sum
   * over tp (each tp rank saw its chunk of the sequence) reduced with
   * reduce_dims "dp_cp,tp"; the sync averages over dp x cp x tp, so
   * pre-multiply by tp to get the sum over tp and the mean over dp_cp.
   * (tp is a power of two in practice, so this is exact.)  Expert
   * tensors: see their registration. */
  if (rs->last_mb && rs->premul[id] != 1.0f)
    for (size_t i = 0; i < rs->count[id]; i++) rs->grad[id][i] *= rs->premul[id];
  mpg_status st = MPG_OK;
  /* Only the last micro-batch launches reductions: the gradient summed
   * over the micro-batches goes into the view then, before mark_ready. */
  if (rs->last_mb) {
    st = gpt_stage_in(rs->stage, rs->dgrad[id], rs->grad[id], rs->count[id] * sizeof(float));
    rs->up[id] = 1;
  }
  if (st == MPG_OK) st = mpg_sync_mark_ready(rs->sync, rs->param_of[id]);
  if (st != MPG_OK && rs->err == MPG_OK) rs->err = st;
}

/* Shard mode: before a tensor's first use in forward, wait for its
 * bucket's all-gather (and start the next bucket's). */
static void on_use(void *arg, int id) {
  rank_state *rs = arg;
  if (!rs->shard || rs->param_of[id] < 0) return;
  double t0 = gpt_stage_now();
  mpg_status st = mpg_sync_gather_wait(rs->sync, rs->param_of[id]);
  rs->stage->comm_s += gpt_stage_now() - t0; /* exposed gather */
  /* The gathered tensor into the host array, once a step (the caller's
   * stream is ordered after the gather by gather_wait). */
  if (st == MPG_OK && !rs->down[id]) {
    st = gpt_stage_out(rs->stage, rs->param[id], rs->dparam[id], rs->count[id] * sizeof(float));
    rs->down[id] = 1;
  }
  if (st != MPG_OK && rs->err == MPG_OK) rs->err = st;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* This rank's coordinates and groups. */
static mpg_status setup_groups(trainer *t) {
  const job *J = t->J;
  const gpt_config *c = t->c;
  int coord[MPG_MAX_DIMS];
  CHECK(mpg_mesh_coord_of(J->mesh, t->rank, coord));
  t->P = J->d.pp, t->D = J->d.dp, t->K = J->d.cp, t->T = J->d.tp, t->sp = J->o.sp;
  const int h = t->h = J->d.hsdp;
  t->ps = coord[0], t->dr = h ? coord[1] * J->d.dp_shard + coord[2] : coord[1];
  t->rep = h ? coord[1] : 0, t->cr = coord[2 + h], t->tr = coord[3 + h];
  CHECK(mpg_ctx_group(t->ctx, "tp", &t->g_tp));
  CHECK(mpg_ctx_group(t->ctx, "cp", &t->g_cp));
  CHECK(mpg_ctx_group(t->ctx, "pp", &t->g_pp));
  CHECK(mpg_ctx_group(t->ctx, "world", &t->g_world));
  if (t->P > 1) {
    int pos[2] = {0, t->P - 1};
    CHECK(mpg_ctx_group_select(t->ctx, "pp", pos, 2, &t->tied));
  }
  /* The expert grid (MoE): ep and etp carry the tokens, edp reduces the
   * expert gradients. */
  t->moe = c->moe > 0, t->EP = c->ep, t->ETP = c->etp, t->EDP = 1;
  if (t->moe) {
    CHECK(mpg_ctx_group(t->ctx, "ep", &t->g_ep));
    CHECK(mpg_ctx_group(t->ctx, "etp", &t->g_etp));
    CHECK(mpg_ctx_group(t->ctx, "edp", &t->g_edp));
    t->epr = mpg_group_position(t->g_ep), t->etr = mpg_group_position(t->g_etp);
    t->edr = mpg_group_position(t->g_edp), t->EDP = mpg_group_size(t->g_edp);
  }
  t->nt = gpt_num_tensors(c);
  t->lo = t->ps * (c->n_layer / t->P), t->hi = t->lo + c->n_layer / t->P;
  t->first = t->ps == 0, t->last = t->ps == t->P - 1;
  t->nmoe = gpt_moe_num_layers(c), t->nred = 3 + t->nmoe * c->moe;
  t->M = c->micro, t->nb = c->batch / (t->D * t->M), t->per_dp = c->batch / t->D;
  return MPG_OK;
}

/* The sync, the per-tensor state, and every held tensor registered. */
static mpg_status register_params(trainer *t) {
  const gpt_config *c = t->c;
  rank_state *rs = &t->rs;
  const int nt = t->nt, T = t->T;
  mpg_sync_opts so = MPG_SYNC_OPTS_INIT; /* default: average over dp_cp */
  if (rs->shard) {
    so.sync.mode = MPG_SYNC_SHARD;
    if (t->h) {
      snprintf(so.sync.shard_dims, sizeof so.sync.shard_dims, "%s", "dp_shard,cp");
      snprintf(so.sync.replicate_dims, sizeof so.sync.replicate_dims, "%s", "dp_replicate");
    }
  }
  CHECK(mpg_sync_create(t->ctx, &so, &rs->sync));
  rs->T = T, rs->stage = &t->stage;
  if (!(TALLOC(rs->param_of, nt) & TALLOC(rs->premul, nt) & TALLOC(rs->grad, nt) &
        TALLOC(rs->param, nt) & TALLOC(rs->dgrad, nt) & TALLOC(rs->dparam, nt) &
        TALLOC(rs->up, nt) & TALLOC(rs->down, nt) & TALLOC(rs->count, nt) &
        TALLOC(rs->sharded, nt) & TALLOC(rs->own_off, nt) & TALLOC(rs->own_cnt, nt) &
        TALLOC(rs->own_state, nt) & TALLOC(t->errs, 2 * nt + 1) & TALLOC(t->red, t->nred)))
    return MPG_ERR_NOMEM;
  for (int i = 0; i < 2 * nt + 1; i++) t->errs[i] = -1.0;
  /* Register in forward order, with each rank's local shard size.
   * Embeddings, LayerNorms, row-parallel biases and the LM head are
   * replicated over tp (the simplest correct choice): without sp every tp
   * rank computes the same gradient for them, so they are reduced over
   * dp_cp only; with sp each tp rank sees only its chunk of the sequence,
   * so they are reduced over "dp_cp,tp" (and stay unsharded in shard mode,
   * as do the tied wte copies).  The MoE router is such a replicated
   * tensor.
   *
   * Expert tensors are reduced over "edp", pre-multiplied by
   * escale = edp / (dp * cp).  Derivation: every rank computes with the
   * loss scale dp * cp / (batch * seq), dp * cp times the true one (the
   * dp_cp average of the dense gradients divides it back).  A token's
   * contribution to an expert shard is computed exactly once, on the etp
   * group holding that expert in the token's own edp slice: the ep group
   * of the token's rank keeps its edp coordinate, so the stage's
   * dp * cp * tp = etp * ep * edp ranks' tokens split over the edp copies
   * of the expert.  The sum over the copies is thus dp * cp times the true
   * gradient, the sync's average over edp makes it dp * cp / edp times,
   * and escale = edp / (dp * cp) (= tp / (etp * ep)) gives the true one. */
  const float escale = (float)((double)t->EDP / ((double)t->D * t->K)) *
                       (c->expert_grad_bug != 0.0f ? c->expert_grad_bug : 1.0f);
  for (int id = 0; id < nt; id++) {
    rs->param_of[id] = -1;
    rs->premul[id] = 1.0f;
    if (!gpt_tensor_held(c, id, t->lo, t->hi, t->first, t->last, t->EP, t->epr)) continue;
    mpg_param_opts po = MPG_PARAM_OPTS_INIT;
    const int split = gpt_tensor_split(c, id);
    if (gpt_tensor_expert(c, id)) {
      po.reduce_dims = "edp";
      rs->premul[id] = escale;
    } else if (t->sp && T > 1 && split != GPT_SPLIT_TP) {
      po.reduce_dims = "dp_cp,tp";
      rs->premul[id] = (float)T;
    }
    if (id == GPT_WTE && t->P > 1) po.tied_group = t->tied;
    char name[48];
    gpt_tensor_name_cfg(c, id, name, sizeof name);
    rs->count[id] = gpt_tensor_count(c, id, split_parts(split, T, t->ETP));
    CHECK(mpg_sync_add_param(rs->sync, name, rs->count[id], MPG_F32, &po, &rs->param_of[id]));
  }
  CHECK(mpg_sync_commit(rs->sync));
  return MPG_OK;
}

/* The sync's views of the held tensors; shard mode: the owned ranges and
 * their AdamW state. */
static mpg_status bind_views(trainer *t) {
  rank_state *rs = &t->rs;
  size_t state_elems = 0;
  for (int id = 0; id < t->nt; id++)
    if (rs->param_of[id] >= 0) {
      void *v;
      CHECK(mpg_sync_grad(rs->sync, rs->param_of[id], &v));
      /* NCCL: the views are device memory; the model computes on host
       * arrays staged in and out of them. */
      rs->dgrad[id] = v;
      rs->grad[id] = t->nccl ? calloc(rs->count[id] ? rs->count[id] : 1, sizeof(float)) : v;
      if (!rs->grad[id]) return MPG_ERR_NOMEM;
      if (rs->shard) {
        CHECK(mpg_sync_param(rs->sync, rs->param_of[id], &v));
        rs->dparam[id] = v;
        rs->param[id] = t->nccl ? calloc(rs->count[id] ? rs->count[id] : 1, sizeof(float)) : v;
        if (!rs->param[id]) return MPG_ERR_NOMEM;
        mpg_shard_info si = MPG_SHARD_INFO_INIT;
        CHECK(mpg_sync_get_shard(rs->sync, rs->param_of[id], &si));
        rs->sharded[id] = si.sharded, rs->own_off[id] = si.param_offset;
        rs->own_cnt[id] = si.count, rs->own_state[id] = si.shard_offset;
        if (si.shard_offset + si.count > state_elems) state_elems = si.shard_offset + si.count;
      }
    }
  if (rs->shard) {
    mpg_sync_stats sst = MPG_SYNC_STATS_INIT;
    CHECK(mpg_sync_get_stats(rs->sync, &sst));
    if (sst.shard_elems < state_elems) {
      fprintf(stderr, "gpt rank %d: owned ranges beyond shard_elems\n", t->rank);
      return MPG_ERR_STATE;
    }
    /* AdamW state for the owned ranges only */
    const size_t se = sst.shard_elems ? sst.shard_elems : 1;
    if (!TALLOC(t->st_m, se) || !TALLOC(t->st_v, se)) return MPG_ERR_NOMEM;
  }
  return MPG_OK;
}

/* The model on the views, the stage sized for the largest message, and
 * the step's buffers. */
static mpg_status init_model(trainer *t) {
  const gpt_config *c = t->c;
  rank_state *rs = &t->rs;
  gpt_comm comm = {.tp = t->g_tp, .tp_size = t->T, .tp_rank = t->tr, .sp = t->sp,
                   .err = MPG_OK, .cp = t->g_cp, .cp_size = t->K, .cp_rank = t->cr,
                   .ep = t->g_ep, .etp = t->g_etp, .ep_size = t->EP, .ep_rank = t->epr,
                   .etp_size = t->ETP, .etp_rank = t->etr};
  if (gpt_model_init_views(&t->m, c, &comm, t->lo, t->hi, t->first, t->last, t->nb, t->M,
                           rs->grad, rs->shard ? rs->param : NULL))
    return MPG_ERR_NOMEM;
  t->m.ready = on_ready, t->m.ready_arg = rs;
  t->m.use = on_use, t->m.use_arg = rs;
  const size_t hsz = t->hsz = (size_t)t->m.rows_local * c->d_model;
  /* The largest message of any communication: tp's all-reduce /
   * all-gather / reduce-scatter of N x C rows, cp's gathered K | V
   * (seq * nb x 2C/tp), the pipeline's R x C activations, and the world
   * all-reduces of 2 x nt doubles. */
  const size_t C = (size_t)c->d_model, Cl = C / (size_t)t->T, nt = (size_t)t->nt;
  size_t cap = (size_t)t->m.rows * C;
  if ((size_t)c->seq * (size_t)t->nb * 2 * Cl > cap) cap = (size_t)c->seq * (size_t)t->nb * 2 * Cl;
  if (hsz > cap) cap = hsz;
  if (t->moe) {
    /* MoE: a rank sends R * topk rows, receives at most ep * R *
     * min(topk, E / ep) (R rows per local expert and source, topk per
     * row), and the etp gather holds etp times that. */
    const size_t R = (size_t)t->m.rows_local, k = (size_t)c->topk, El = (size_t)(c->moe / t->EP);
    const size_t recv_rows = (size_t)t->EP * R * (k < El ? k : El);
    if ((size_t)t->ETP * recv_rows * C > cap) cap = (size_t)t->ETP * recv_rows * C;
    if (R * k * C > cap) cap = R * k * C;
  }
  cap *= sizeof(float);
  /* the world all-reduces: errs, red, and the MoE statistics */
  if ((2 * nt + 1) * sizeof(double) > cap) cap = (2 * nt + 1) * sizeof(double);
  if ((size_t)t->nred * sizeof(double) > cap) cap = (size_t)t->nred * sizeof(double);
  if (2 * (size_t)c->moe * sizeof(double) > cap) cap = 2 * (size_t)c->moe * sizeof(double);
  CHECK(gpt_stage_init(&t->stage, t->ctx, cap));
  t->m.comm.stage = &t->stage;
  /* Shard mode: the initial values (every rank the same) into the sync's
   * parameter buffer (a no-op where the model wrote into it directly). */
  for (int id = 0; rs->shard && id < t->nt; id++)
    if (rs->param_of[id] >= 0)
      CHECK(gpt_stage_in(&t->stage, rs->dparam[id], rs->param[id], rs->count[id] * sizeof(float)));
  if (!TALLOC(t->seqs, (size_t)t->nb * (c->seq + 1)) || !TALLOC(t->buf_in, hsz) ||
      !TALLOC(t->buf_out, hsz))
    return MPG_ERR_NOMEM;
  /* The loss is the mean over the batch's batch * seq tokens; the sync
   * averages over dp x cp, and each cp rank holds seq / cp of the tokens
   * of its dp rank's per_dp sequences: scale by cp / (per_dp * seq). */
  t->scale = (float)((double)t->K / ((double)t->per_dp * c->seq));
  return MPG_OK;
}

/* One micro-batch's forward; its activations' send waits to be batched
 * with the next receive. */
static mpg_status forward_mb(trainer *t, int step, int fi, double *loss) {
  const gpt_config *c = t->c;
  for (int b = 0; b < t->nb; b++)
    gpt_sequence(c, t->J->data, t->J->len, step, (long)t->dr * t->per_dp + (long)fi * t->nb + b,
                 t->seqs + (size_t)b * (c->seq + 1));
  double l = gpt_forward(&t->m, fi, t->seqs, t->buf_in, t->buf_out, t->scale);
  PASS(MODEL_ERR(t));
  if (t->sp || t->tr == 0) *loss += l; /* without sp tp ranks repeat the loss */
  if (!t->last)
    t->pend = (mpg_p2p_op){MPG_P2P_SEND, t->ps + 1, t->buf_out, t->hsz, MPG_F32}, t->npend = 1;
  return MPG_OK;
}

/* One micro-batch's backward, the gradient sync's begin and finish around
 * it; after the last one the reduced gradients are in the host arrays. */
static mpg_status backward_mb(trainer *t, int step, int bi) {
  rank_state *rs = &t->rs;
  gpt_stage *stage = &t->stage;
  rs->last_mb = bi == t->M - 1;
  CHECK(mpg_sync_begin(rs->sync, step, rs->last_mb, stage->stream));
  gpt_backward(&t->m, bi, t->buf_in, t->buf_out);
  PASS(MODEL_ERR(t));
  if (!t->first) {
    t->pend = (mpg_p2p_op){MPG_P2P_SEND, t->ps - 1, t->buf_out, t->hsz, MPG_F32}, t->npend = 1;
    /* The last backward's send goes now: the last micro-batch's
     * finish sums the tied wte over the end stages, which waits for
     * the first stage's backward, which needs this gradient. */
    if (rs->last_mb) {
      CHECK(gpt_stage_p2p(stage, t->g_pp, &t->pend, 1));
      t->npend = 0;
    }
  }
  /* A held tensor that backward never marked ready is launched by
   * finish as its view is: stage it first. */
  if (rs->last_mb)
    for (int id = 0; id < t->nt; id++)
      if (rs->param_of[id] >= 0 && !rs->up[id])
        CHECK(gpt_stage_in(stage, rs->dgrad[id], rs->grad[id], rs->count[id] * sizeof(float)));
  double tf = gpt_stage_now();
  CHECK(mpg_sync_finish(rs->sync));
  stage->comm_s += gpt_stage_now() - tf; /* the buckets not hidden by backward */
  /* The reduced gradients (finish ordered the stream after the
   * sync's) back into the host arrays for the norm and AdamW. */
  if (rs->last_mb)
    for (int id = 0; id < t->nt; id++)
      if (rs->param_of[id] >= 0) {
        rs->up[id] = 0;
        CHECK(gpt_stage_out(stage, rs->grad[id], rs->dgrad[id], rs->count[id] * sizeof(float)));
      }
  return MPG_OK;
}

/* The step's micro-batches over the pipeline, 1F1B: warm-up forwards,
 * then one forward one backward, then the remaining backwards (op k of 2M
 * is a forward when it is one of the warm-up ones or falls on the F of an
 * (F, B) pair). */
static mpg_status pipeline(trainer *t, int step, double *loss) {
  const int ps = t->ps, M = t->M, warm = t->P - ps - 1 < M ? t->P - ps - 1 : M;
  int fi = 0, bi = 0;
  t->pend = (mpg_p2p_op){MPG_P2P_SEND, 0, NULL, 0, MPG_F32}, t->npend = 0;
  for (int k = 0; k < 2 * M; k++) {
    const int do_fwd = k < warm || (k < 2 * M - warm && (k - warm) % 2 == 0);
    mpg_p2p_op ops[2];
    int n = 0;
    if (t->npend) ops[n++] = t->pend, t->npend = 0;
    if (do_fwd && !t->first)
      ops[n++] = (mpg_p2p_op){MPG_P2P_RECV, ps - 1, t->buf_in, t->hsz, MPG_F32};
    if (!do_fwd && !t->last)
      ops[n++] = (mpg_p2p_op){MPG_P2P_RECV, ps + 1, t->buf_in, t->hsz, MPG_F32};
    if (n) CHECK(gpt_stage_p2p(&t->stage, t->g_pp, ops, n));
    PASS(do_fwd ? forward_mb(t, step, fi++, loss) : backward_mb(t, step, bi++));
  }
  if (t->npend) CHECK(gpt_stage_p2p(&t->stage, t->g_pp, &t->pend, 1));
  return MPG_OK;
}

/* Global grad norm, every element counted once: after the sync the
 * dp_cp ranks hold equal gradients (replicate mode; shard mode: of the
 * unsharded tensors), so count dp_cp rank 0 only; in shard mode each
 * rank counts its owned ranges of the sharded tensors (distinct over the
 * shard group, repeated over dp_replicate: count replica 0 only); tp
 * shards each once, replicated tensors on tp rank 0 only, the tied wte
 * on the first stage only.  Expert tensors: equal over edp after the
 * sync, count edp rank 0 (shard mode: each edp member its owned range);
 * etp shards each once, fc2's bias (the same on every etp member) on
 * etp rank 0; each ep rank's experts are its own.  red: the loss, the
 * squared norm, the aux loss and the tokens per expert, summed over the
 * world. */
static mpg_status reduce_stats(trainer *t, double loss) {
  const gpt_config *c = t->c;
  rank_state *rs = &t->rs;
  double *red = t->red;
  memset(red, 0, (size_t)t->nred * sizeof(double));
  red[0] = loss;
  /* MoE: the aux loss (every rank of a group's tp x cp ranks computed
   * the same), and the tokens per expert of this rank's own rows. */
  if (t->tr == 0 && t->cr == 0) red[2] = t->m.aux_sum;
  for (int i = 0; i < t->nmoe * c->moe; i++) red[3 + i] = t->m.moe_tokens[i];
  for (int id = 0; id < t->nt; id++) {
    if (!rs->grad[id]) continue;
    const int split = gpt_tensor_split(c, id);
    if (gpt_tensor_expert(c, id)) {
      if (split != GPT_SPLIT_ETP && t->etr != 0) continue;
      if (rs->shard && rs->sharded[id]) {
        /* Shard mode: sharded over edp, each member counts its range. */
        const float *g = rs->grad[id] + rs->own_off[id];
        for (size_t i = 0; i < rs->own_cnt[id]; i++) red[1] += (double)g[i] * g[i];
      } else if (t->edr == 0) {
        red[1] += gpt_grad_sumsq(&t->m, id);
      }
      continue;
    }
    if (split != GPT_SPLIT_TP && t->tr != 0) continue;
    if (id == GPT_WTE && !t->first) continue;
    if (rs->shard && rs->sharded[id]) {
      if (t->rep != 0) continue;
      const float *g = rs->grad[id] + rs->own_off[id];
      for (size_t i = 0; i < rs->own_cnt[id]; i++) red[1] += (double)g[i] * g[i];
    } else if (t->dr == 0 && t->cr == 0) {
      red[1] += gpt_grad_sumsq(&t->m, id);
    }
  }
  CHECK(gpt_stage_all_reduce(&t->stage, t->g_world, red, red, (size_t)t->nred, MPG_F64,
                             MPG_OP_SUM));
  /* With the issue-order checker on (MESHPG_CHECK_ORDER=1), close the
   * checked interval here, so that this world collective (the same call
   * on every rank) never shares an interval with the stages' differing
   * programs: only the end stages have the wte gradient to reduce.  A
   * no-op when the checker is off. */
  CHECK(mpg_ctx_check_order(t->ctx));
  return MPG_OK;
}

/* AdamW on the clipped gradients (shard mode: on the owned ranges, then
 * the parameters' all-gather begins), and the gradients zeroed. */
static mpg_status optimizer_step(trainer *t) {
  rank_state *rs = &t->rs;
  double norm = sqrt(t->red[1]);
  const float gscale = norm > GPT_CLIP ? (float)(GPT_CLIP / norm) : 1.0f;
  if (rs->shard) {
    gpt_adamw_tick(&t->m);
    for (int id = 0; id < t->nt; id++)
      if (rs->param_of[id] >= 0) {
        gpt_adamw_range(&t->m, id, rs->own_off[id], rs->own_cnt[id], t->st_m + rs->own_state[id],
                        t->st_v + rs->own_state[id], gscale);
        /* the updated owned range into the parameter buffer */
        CHECK(gpt_stage_in(&t->stage, rs->dparam[id] + rs->own_off[id],
                           rs->param[id] + rs->own_off[id], rs->own_cnt[id] * sizeof(float)));
      }
  } else {
    gpt_adamw(&t->m, gscale);
  }
  CHECK(mpg_sync_zero_grads(rs->sync));
  if (t->nccl) gpt_model_zero_grads(&t->m); /* the host arrays too */
  if (rs->shard) {
    CHECK(mpg_sync_gather_begin(rs->sync, t->stage.stream));
    for (int id = 0; id < t->nt; id++) rs->down[id] = 0;
  }
  return MPG_OK;
}

/* One training step: the pipeline, the first step's gradient errors, the
 * norm, the optimizer, rank 0's loss. */
static mpg_status train_step(trainer *t, int step) {
  const gpt_config *c = t->c;
  rank_state *rs = &t->rs;
  if (step == t->start + 1) t->t_first = now_s(), t->comm_first = t->stage.comm_s;
  double loss = 0.0;
  gpt_model_zero_stats(&t->m);
  PASS(pipeline(t, step, &loss));
  if (step == 0 && t->J->ref_grads1)
    for (int id = 0; id < t->nt; id++)
      if (rs->grad[id]) {
        size_t off = 0, cnt = rs->count[id];
        if (rs->shard && rs->sharded[id]) off = rs->own_off[id], cnt = rs->own_cnt[id];
        const int split = gpt_tensor_split(c, id);
        t->errs[t->nt + id] = gpt_shard_error_at(c, id, split_parts(split, t->T, t->ETP),
                                                 split_rank(split, t->tr, t->etr), rs->grad[id],
                                                 off, cnt, t->J->ref_grads1[id], 0);
      }
  PASS(reduce_stats(t, loss));
  PASS(optimizer_step(t));
  if (t->rank == 0) {
    /* the aux loss: the mean over the batch's groups (moe.h) */
    const double aux = t->moe ? t->red[2] * c->aux_seqs / c->batch : 0.0;
    t->J->res->loss[step] = t->red[0] / ((double)c->batch * c->seq) + aux;
    if (t->moe) {
      t->J->res->aux[step] = aux;
      t->J->res->imbalance[step] = gpt_moe_imbalance(c, t->red + 3);
    }
  }
  return MPG_OK;
}

/* After the steps: the timings, the final parameters (kept, and compared
 * with the reference), the errors' max over the ranks into the result. */
static mpg_status finish(trainer *t) {
  const job *J = t->J;
  const int nt = t->nt;
  rank_state *rs = &t->rs;
  gpt_model *m = &t->m;
  const int n = J->steps - t->start; /* the steps this run trained */
  if (t->rank == 0 && n > 1) J->res->step_s = (now_s() - t->t_first) / (n - 1);
  /* This rank's exposed communication over the steps after the first. */
  if (n > 1) t->errs[2 * nt] = (t->stage.comm_s - t->comm_first) / (now_s() - t->t_first);
  if (rs->shard) {
    CHECK(mpg_sync_gather_all(rs->sync));
    for (int id = 0; id < nt; id++)
      if (rs->param_of[id] >= 0)
        CHECK(gpt_stage_out(&t->stage, rs->param[id], rs->dparam[id],
                            rs->count[id] * sizeof(float)));
  }
  if (J->o.keep_params && J->res->rank_params)
    for (int id = 0; id < nt; id++)
      if (m->p[id]) {
        float *keep = malloc(m->n[id] * sizeof(float));
        if (!keep) return MPG_ERR_NOMEM;
        memcpy(keep, m->p[id], m->n[id] * sizeof(float));
        J->res->rank_params[(size_t)t->rank * nt + id] = keep;
        J->res->rank_count[(size_t)t->rank * nt + id] = m->n[id];
      }
  for (int id = 0; J->ref && id < nt; id++) {
    const int split = gpt_tensor_split(t->c, id);
    if (m->p[id])
      t->errs[id] = gpt_shard_error(t->c, id, split_parts(split, t->T, t->ETP),
                                    split_rank(split, t->tr, t->etr), m->p[id], m->n[id],
                                    J->ref->p[id], 1);
  }
  /* max over ranks, on every rank */
  CHECK(gpt_stage_all_reduce(&t->stage, t->g_world, t->errs, t->errs, 2 * (size_t)nt + 1, MPG_F64,
                             MPG_OP_MAX));
  if (t->rank == 0) {
    memcpy(J->res->param_err, t->errs, sizeof(double) * (size_t)nt);
    memcpy(J->res->grad_err, t->errs + nt, sizeof(double) * (size_t)nt);
    J->res->comm_frac = t->errs[2 * nt];
  }
  return MPG_OK;
}

static void teardown(trainer *t, mpg_status st) {
  rank_state *rs = &t->rs;
  gpt_ckpt_free(t);
  gpt_model_free(&t->m);
  if (t->nccl)
    for (int id = 0; rs->grad && rs->param && id < gpt_num_tensors(t->c); id++) {
      free(rs->grad[id]);
      free(rs->param[id]);
    }
  void *arrays[] = {t->seqs, t->buf_in, t->buf_out, t->st_m, t->st_v, t->errs, t->red,
                    rs->dgrad, rs->dparam, rs->up, rs->down, rs->param_of, rs->premul,
                    rs->grad, rs->param, rs->count, rs->sharded, rs->own_off, rs->own_cnt,
                    rs->own_state};
  for (size_t i = 0; i < sizeof arrays / sizeof arrays[0]; i++) free(arrays[i]);
  if (rs->sync) mpg_sync_destroy(rs->sync);
  if (st != MPG_OK) mpg_ctx_abort(t->ctx);
  gpt_stage_free(&t->stage);
  mpg_ctx_destroy(t->ctx);
}

static const char *trace_dir; /* gpt_set_trace */

void gpt_set_trace(const char *dir) { trace_dir = dir; }

/* --trace, after a healthy run: this rank's ring to DIR/rank-R.trace, then
 * a barrier, so that every dump is there when the run returns. */
static mpg_status trace_dump(trainer *t) {
  mpg_status st = mpg_ctx_trace_dump(t->ctx, trace_dir);
  if (st != MPG_OK) {
    fprintf(stderr, "gpt rank %d: --trace: %s\n", t->rank, mpg_last_error());
    return st;
  }
  return mpg_barrier(t->g_world, NULL);
}

static mpg_status rank_main(const mpg_init_opts *opts, void *arg) {
  trainer self;
  memset(&self, 0, sizeof self);
  trainer *t = &self;
  t->J = arg, t->c = &t->J->cfg;
  mpg_init_opts io = *opts;
  if (trace_dir) {
    io.trace_dir = trace_dir;
    io.trace_entries = GPT_TRACE_ENTRIES;
  }
  mpg_status st = mpg_ctx_create(t->J->mesh, &io, &t->ctx);
  if (st != MPG_OK) return st;
  t->rank = mpg_ctx_rank(t->ctx);
  t->nccl = mpg_ctx_backend(t->ctx) == MPG_BACKEND_NCCL;
  t->rs.shard = t->J->o.shard;
  st = setup_groups(t);
  if (st == MPG_OK) st = register_params(t);
  if (st == MPG_OK) st = bind_views(t);
  if (st == MPG_OK) st = init_model(t);
  if (st == MPG_OK) st = gpt_ckpt_begin(t); /* --save, --resume (ckpt.c) */
  for (int step = t->start; st == MPG_OK && step < t->J->steps; step++) {
    st = train_step(t, step);
    if (st == MPG_OK) st = gpt_ckpt_step_done(t, step + 1);
  }
  if (st == MPG_OK) st = gpt_ckpt_end(t);
  if (st == MPG_OK) st = finish(t);
  if (st == MPG_OK && trace_dir) st = trace_dump(t);
  teardown(t, st);
  return st;
}

/* --nccl: one thread per rank, each on its own CUDA device (device = rank
 * % device count), all joining one NCCL world through a shared
 * ncclUniqueId. */
typedef struct nccl_rank_arg {
  job *J;
  int rank, world, device;
  const void *id;
  mpg_status st;
  char msg[320]; /* the rank's mpg_last_error() (thread-local) on failure */
} nccl_rank_arg;

static void *nccl_rank_main(void *p) {
  nccl_rank_arg *a = p;
  mpg_init_opts io = MPG_INIT_OPTS_INIT;
  io.backend.name = MPG_BACKEND_NCCL;
  io.rank = io.local_rank = a->rank;
  io.world_size = io.local_world_size = a->world;
  io.device = a->device, io.nccl_id = a->id;
  io.backend.timeout_s = 120.0;
  if (gpt_stage_set_device(a->device)) {
    fprintf(stderr, "gpt rank %d: cannot make CUDA device %d current\n", a->rank, a->device);
    a->st = MPG_ERR_BACKEND;
    return NULL;
  }
  a->st = rank_main(&io, a->J);
  if (a->st != MPG_OK) snprintf(a->msg, sizeof a->msg, "%s", mpg_last_error());
  return NULL;
}

static mpg_status nccl_run(job *J, int world, char *err, size_t errlen) {
  const int ndev = gpt_stage_device_count();
  if (ndev < 1)
    return snprintf(err, errlen, "--nccl: no CUDA device (or a build without NCCL)"),
           MPG_ERR_UNSUPPORTED;
  if (world > ndev)
    fprintf(stderr, "gpt: --nccl: %d ranks on %d CUDA devices: ranks share a device, "
            "which NCCL refuses within one process (Duplicate GPU detected)\n", world, ndev);
  unsigned char id[128];
  if (gpt_stage_nccl_id(id))
    return snprintf(err, errlen, "--nccl: ncclGetUniqueId failed"), MPG_ERR_BACKEND;
  nccl_rank_arg *a = calloc((size_t)world, sizeof *a);
  pthread_t *t = calloc((size_t)world, sizeof *t);
  int *started = calloc((size_t)world, sizeof *started);
  mpg_status st = MPG_OK;
  if (!a || !t || !started) {
    snprintf(err, errlen, "out of memory");
    st = MPG_ERR_NOMEM;
  }
  for (int r = 0; st == MPG_OK && r < world; r++) {
    a[r] = (nccl_rank_arg){J, r, world, r % ndev, id, MPG_OK, ""};
    if (pthread_create(&t[r], NULL, nccl_rank_main, &a[r])) {
      /* The ranks started already wait for this one until their timeout. */
      snprintf(err, errlen, "--nccl: cannot start the thread of rank %d", r);
      st = MPG_ERR_NOMEM;
    } else {
      started[r] = 1;
    }
  }
  for (int r = 0; t && started && r < world; r++)
    if (started[r]) {
      pthread_join(t[r], NULL);
      if (st == MPG_OK && a[r].st != MPG_OK) {
        st = a[r].st;
        snprintf(err, errlen, "parallel run failed: rank %d: %s: %s", r, mpg_status_name(st),
                 a[r].msg);
      }
    }
  free(a), free(t), free(started);
  return st;
}

/* The run's error into res->error; -1. */
static int fail(gpt_par_result *res, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(res->error, sizeof res->error, fmt, ap);
  va_end(ap);
  return -1;
}

int gpt_parallel_train_opts(const gpt_config *c, const uint8_t *data, size_t len,
                            const char *mesh_str, const gpt_par_opts *o, int steps,
                            const gpt_model *ref, float *const *ref_grads1,
                            gpt_par_result *res) {
  return gpt_parallel_train_ckpt(c, data, len, mesh_str, o, NULL, steps, ref, ref_grads1, res);
}

int gpt_parallel_train_ckpt(const gpt_config *c, const uint8_t *data, size_t len,
                            const char *mesh_str, const gpt_par_opts *o,
                            const gpt_ckpt_opts *ck, int steps, const gpt_model *ref,
                            float *const *ref_grads1, gpt_par_result *res) {
  memset(res, 0, sizeof *res);
  job J;
  memset(&J, 0, sizeof J);
  J.cfg = *c, J.data = data, J.len = len, J.o = *o, J.steps = steps;
  if (ck) J.ck = *ck;
  J.ref = ref, J.ref_grads1 = ref_grads1, J.res = res;
  res->root = 1;
  if (gpt_parse_mesh(mesh_str, &J.d))
    return fail(res, "bad mesh \"%s\" (want e.g. pp=2,dp=2,cp=2,tp=2 or "
                "dp_replicate=2,dp_shard=2,tp=2)", mesh_str);
  if (o->nccl && o->mpi) return fail(res, "--nccl runs thread ranks: not with --mpi");
  if (J.d.hsdp && !o->shard) return fail(res, "dp_replicate / dp_shard need --shard");
  if (gpt_ckpt_check_opts(&J.ck, steps, res->error, sizeof res->error)) return -1;
  /* MoE: ep defaults to 1, etp to tp (resolved in the job's copy). */
  if (J.cfg.ep < 1) J.cfg.ep = 1;
  if (J.cfg.etp < 1) J.cfg.etp = c->moe > 0 ? J.d.tp : 1;
  const char *why =
      gpt_moe_check(c, J.d.tp, J.d.pp, J.d.dp, J.d.cp, o->sp, J.cfg.ep, J.cfg.etp);
  if (why) return fail(res, "%s", why);
  if (c->moe > 0 && J.d.hsdp)
    return fail(res, "--moe with dp_replicate / dp_shard dims: the expert grid needs a \"dp\" "
                "dim; use --shard on a dp mesh (expert params shard over edp)");
  if (len < (size_t)c->seq + 2) return fail(res, "data shorter than seq + 2 bytes");
  res->pp = J.d.pp, res->dp = J.d.dp, res->cp = J.d.cp, res->tp = J.d.tp;
  const int nt = gpt_num_tensors(c), world = J.d.pp * J.d.dp * J.d.cp * J.d.tp;
  res->steps = steps, res->nt = nt;
  res->loss = calloc((size_t)steps + 1, sizeof(double));
  res->param_err = malloc(sizeof(double) * (size_t)nt);
  res->grad_err = malloc(sizeof(double) * (size_t)nt);
  res->world = world;
  if (c->moe > 0) {
    res->ep = J.cfg.ep, res->etp = J.cfg.etp;
    res->edp = world / (J.d.pp * J.cfg.ep * J.cfg.etp);
    res->aux = calloc((size_t)steps + 1, sizeof(double));
    res->imbalance = calloc((size_t)steps + 1, sizeof(double));
    if (!res->aux || !res->imbalance) return fail(res, "out of memory");
  }
  if (o->keep_params) {
    res->rank_params = calloc((size_t)world * (size_t)nt, sizeof(float *));
    res->rank_count = calloc((size_t)world * (size_t)nt, sizeof(size_t));
    if (!res->rank_params || !res->rank_count) return fail(res, "out of memory");
  }
  if (!res->loss || !res->param_err || !res->grad_err) return fail(res, "out of memory");
  for (int id = 0; id < nt; id++) res->param_err[id] = res->grad_err[id] = -1.0;
  char canon[160];
  if (J.d.hsdp)
    snprintf(canon, sizeof canon, "pp=%d,dp_replicate=%d,dp_shard=%d,cp=%d,tp=%d", J.d.pp,
             J.d.dp_rep, J.d.dp_shard, J.d.cp, J.d.tp);
  else
    snprintf(canon, sizeof canon, "pp=%d,dp=%d,cp=%d,tp=%d", J.d.pp, J.d.dp, J.d.cp, J.d.tp);
  mpg_spec spec = MPG_SPEC_INIT;
  int rc = -1;
  if (mpg_spec_set_mesh(&spec, canon) != MPG_OK ||
      mpg_spec_add_flatten(&spec, "dp_cp",
                           J.d.hsdp ? "dp_replicate,dp_shard,cp" : "dp,cp") != MPG_OK ||
      (c->moe > 0 && mpg_spec_set_experts(&spec, J.cfg.etp, J.cfg.ep, NULL) != MPG_OK) ||
      mpg_spec_validate(&spec) != MPG_OK || mpg_mesh_create(&spec, world, &J.mesh) != MPG_OK) {
    snprintf(res->error, sizeof res->error, "mesh %s: %s", canon, mpg_last_error());
    goto done;
  }
  mpg_status st;
  if (o->mpi) {
    mpg_launch L = MPG_LAUNCH_INIT;
    if (mpg_launch_from_env(&L) != MPG_OK || L.rank < 0 || L.world_size < 0) {
      snprintf(res->error, sizeof res->error, "--mpi: no launcher environment (%s)",
               mpg_last_error());
      goto done;
    }
    if (L.world_size != world) {
      snprintf(res->error, sizeof res->error, "--mpi: %d processes, mesh %s needs %d",
               L.world_size, canon, world);
      goto done;
    }
    mpg_init_opts io = MPG_INIT_OPTS_INIT;
    io.backend.name = MPG_BACKEND_MPI;
    io.backend.timeout_s = 120.0;
    /* Across hosts, tp and cp stay inside one (a no-op on one host). */
    io.placement = 1;
    res->root = L.rank == 0;
    st = rank_main(&io, &J);
  } else if (o->nccl) {
    st = nccl_run(&J, world, res->error, sizeof res->error);
    if (st != MPG_OK) goto done;
  } else {
    st = mpg_thread_run(world, 120.0, rank_main, &J, NULL);
  }
  if (st != MPG_OK) {
    if (J.ck_error[0]) snprintf(res->error, sizeof res->error, "%s", J.ck_error);
    else snprintf(res->error, sizeof res->error, "parallel run failed: %s", mpg_last_error());
    goto done;
  }
  rc = 0;
done:
  mpg_mesh_destroy(J.mesh);
  return rc;
}

int gpt_parallel_train(const gpt_config *c, const uint8_t *data, size_t len,
                       const char *mesh, int sp, int steps, const gpt_model *ref,
                       float *const *ref_grads1, gpt_par_result *res) {
  gpt_par_opts o = {sp, 0, 0, 0, 0};
  return gpt_parallel_train_opts(c, data, len, mesh, &o, steps, ref, ref_grads1, res);
}

void gpt_par_result_free(gpt_par_result *res) {
  if (res->rank_params)
    for (size_t i = 0; i < (size_t)res->world * (size_t)res->nt; i++) free(res->rank_params[i]);
  free(res->rank_params), free(res->rank_count), free(res->loss), free(res->param_err);
  free(res->grad_err), free(res->aux), free(res->imbalance);
  memset(res, 0, sizeof *res);
}
