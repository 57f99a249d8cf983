/* Mixture of experts for the GPT example (gpt_config.moe > 0), as
 * Megatron-core's MoE layer with its AlltoAll token dispatcher.
 *
 * Model.  In an MoE layer (layer >= gpt_config.dense_layers) the MLP after
 * the second LayerNorm is replaced by
 *  - a router: logits = h . Wr, Wr of C x E, no bias, a dense parameter
 *    (replicated over tp, reduced like the LayerNorms);
 *  - E experts, each an MLP like the dense one: fc (C x 4C + bias) -> GELU
 *    -> fc2 (4C x C + bias).
 * Routing: p = softmax(logits) over the E experts; each token takes the
 * topk experts of largest p, ties broken by the lower expert index (a
 * strict comparison scanning from expert 0); gate weights are the chosen
 * probabilities renormalised to sum 1, g_j = p_{e_j} / sum_i p_{e_i}
 * (the same numbers as Mixtral's softmax over the top-k logits).  Output:
 * y = x2 + sum_j g_j expert_{e_j}(h), the choices summed in order j.
 *
 * Load balancing (Switch / GShard auxiliary loss): over a group G of
 * tokens, aux_G = A * E * sum_e f_e P_e, with f_e the fraction of the
 * group's (token, choice) assignments that go to expert e and P_e the mean
 * router probability of e over the group's tokens.  f_e is a count, not
 * differentiable; the backward goes through P_e only:
 * d aux_G / d p_e(token) = A * E * f_e / |G|.  A group is aux_seqs whole
 * sequences (all their positions): in a parallel run the sequences of one
 * micro-batch of one dp rank, whose tokens lie on the ranks of its tp (with
 * sp) x cp group, which all-reduce the per-expert counts and probability
 * sums (two small all-reduces, over "tp" then "cp"; Megatron reduces over
 * its tp-cp group).  The reference, with the whole batch in one forward,
 * cuts it into the same groups.  The step's aux loss is the mean over the
 * batch's groups, summed over the MoE layers, and is added to the
 * training loss: loss = mean token cross entropy + (aux_seqs / batch) *
 * sum over groups and MoE layers of aux_G.
 *
 * Parallel layout (the AlltoAll dispatcher).  The expert grid comes from
 * the mesh (mpg_spec_set_experts: dim sets "etp", "ep", "edp").  An ep rank
 * holds experts [ep_rank * E / ep, (ep_rank + 1) * E / ep); each expert's fc
 * is column-parallel and fc2 row-parallel over "etp" (fc2's bias is
 * replicated over etp).  Every rank routes its own token rows (with tp > 1
 * the run must be sequence parallel, so each rank holds distinct rows), then
 *  1. all-to-all over "ep" of the per-expert counts, then mpg_all_to_all_v
 *     of the token rows, ordered by destination, expert, then row;
 *  2. all-gather over "etp" of the received counts, then of the rows,
 *     padded to the largest member's count;
 *  3. the local experts on the gathered rows, in the order (etp member,
 *     source ep rank, source row): deterministic, not arrival order;
 *  4. reduce-scatter (sum) over "etp" of fc2's partial outputs, fc2's bias;
 *  5. the reverse mpg_all_to_all_v over "ep", and the gated sum at home.
 * Backward mirrors it: the gated output gradients go out by the forward
 * all-to-all, are all-gathered over etp (every etp member then computes
 * its weight shards' gradients, and the whole fc2 bias gradient, over the
 * same rows), the input gradients come back by reduce-scatter and the
 * reverse all-to-all.  Without groups (the reference, or size 1) every
 * step is a local copy.
 *
 * Tensor ids: the dense layout (4 + 12 per layer, model.h) is kept for
 * every layer (an MoE layer does not hold its fc / fc2 ids), and the MoE
 * tensors follow, 1 + 4E per MoE layer: router, then for each expert fc.w,
 * fc.b, fc2.w, fc2.b.  Names "h1.router.w", "h1.e3.fc.w". */
#ifndef GPT_MOE_H
#define GPT_MOE_H

#include "model.h"

enum { M_ROUTER, M_FCW, M_FCB, M_FC2W, M_FC2B };

/* Is layer an MoE layer?  (moe > 0 and layer >= dense_layers) */
int gpt_moe_layer(const gpt_config *c, int layer);
/* Number of MoE layers. */
int gpt_moe_num_layers(const gpt_config *c);
/* Id of the first MoE tensor (= the dense layout's tensor count). */
int gpt_moe_base(const gpt_config *c);
/* Id of a MoE tensor of MoE layer `layer`: kind M_ROUTER (expert ignored)
 * or M_FCW .. M_FC2B of expert `expert`. */
int gpt_moe_tensor_id(const gpt_config *c, int layer, int expert, int kind);
/* 1 when id is a MoE tensor, with its layer, expert (-1 for the router)
 * and kind; 0 otherwise (outputs untouched). */
int gpt_moe_decode(const gpt_config *c, int id, int *layer, int *expert, int *kind);
/* 1 for an expert's tensor (reduced over "edp"), 0 otherwise. */
int gpt_tensor_expert(const gpt_config *c, int id);

/* The checks of an MoE config on a mesh (tp, pp, dp, cp, sp, expert
 * parallel ep and expert tensor parallel etp sizes); NULL if fine (also
 * for a dense config), else why not. */
const char *gpt_moe_check(const gpt_config *c, int tp, int pp, int dp, int cp, int sp,
                          int ep, int etp);

/* Tokens-per-expert imbalance of per-expert counts tokens[moe layers x E]:
 * the largest over the MoE layers of max_e / mean_e (1 = balanced; 0
 * without MoE layers or tokens). */
double gpt_moe_imbalance(const gpt_config *c, const double *tokens);

/* A fingerprint of the routing decisions (every token's chosen experts)
 * of activation slot `slot` over the MoE layers this model holds: equal
 * fingerprints mean (up to hash collisions) the same routing.  For tests
 * that perturb parameters and must not cross a routing discontinuity. */
uint64_t gpt_moe_routing_hash(const gpt_model *m, int slot);

/* ---- internal, shared by model.c and moe.c --------------------------- */
typedef struct gpt_moe_act gpt_moe_act;
gpt_moe_act *gpt__moe_act_new(void);
void gpt__moe_act_free(gpt_moe_act *a);
/* Y = x2 + moe(h) for this rank's R rows (R x C each). */
void gpt__moe_fwd(gpt_model *m, gpt_moe_act *a, int layer, const float *h, const float *x2,
                  float *Y);
/* dh (R x C, overwritten) = d loss / d h for dY = d loss / d Y; expert and
 * router gradients accumulated and marked ready.  loss_scale: the slot's
 * (d loss / d token loss), which also scales the aux loss's gradient. */
void gpt__moe_bwd(gpt_model *m, gpt_moe_act *a, int layer, const float *h, const float *dY,
                  float *dh, float loss_scale);
void gpt__moe_ws_free(gpt_model *m);
/* Fold the routing of a (R x topk chosen experts) into hash h (FNV-1a). */
uint64_t gpt__moe_act_hash(const gpt_moe_act *a, int topk, uint64_t h);

/* Kernels of model.c used by moe.c. */
void gpt__mm_fwd(float *out, const float *in, const float *W, const float *b, int N, int I,
                 int O);
void gpt__mm_bwd(float *din, float *dW, float *db, const float *in, const float *W,
                 const float *dout, int N, int I, int O);
float gpt__gelu(float x);
float gpt__gelu_grad(float x);
void gpt__note(gpt_model *m, mpg_status st);
void gpt__use(gpt_model *m, int id);
void gpt__ready(gpt_model *m, int id);

#endif
