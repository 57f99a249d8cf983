/* A small byte-level GPT (pre-LayerNorm transformer) in plain C11 f32, with a
 * manual backward pass, written so that one code path serves both the
 * single-process reference (tp = 1, one pipeline stage, no communication)
 * and a rank of a parallel job (a tensor-parallel shard of a pipeline
 * stage, Megatron style, every communication through meshpg groups).
 *
 * Activations are "token rows" laid out sequence-major: row t * nb + b is
 * position t of sequence b of a micro-batch of nb sequences.  So splitting
 * the rows in tp contiguous chunks splits along the sequence (sequence
 * parallel), as Megatron's [s, b, h] layout does.
 *
 * Tensor parallel: QKV and fc are column-parallel (heads split over tp),
 * proj and fc2 row-parallel.  The embeddings, the LayerNorms, the
 * row-parallel biases and the (tied) LM head are replicated over tp: the
 * simplest correct choice (a vocabulary-parallel head would save memory
 * and compute, not change the result).
 *
 * Mixture of experts (gpt_config.moe > 0): the layers from dense_layers on
 * replace their MLP by a router and experts, dispatched over the expert
 * parallel groups (moe.h). */
#ifndef GPT_MODEL_H
#define GPT_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "meshpg.h"

#define GPT_VOCAB 256

typedef struct gpt_config {
  int n_layer;
  int d_model;
  int n_head;
  int seq;          /* T */
  int batch;        /* global batch, sequences per step */
  int micro;        /* micro-batches per step (pipeline) */
  float lr;
  uint64_t seed;
  /* Mixture of experts (moe.h).  moe = 0 (a zeroed field): a dense model,
   * the fields below unused. */
  int moe;          /* experts per MoE layer */
  int topk;         /* experts per token, 1 .. moe */
  int dense_layers; /* the first dense_layers layers keep a dense MLP */
  float aux_coef;   /* load-balancing loss coefficient A (0: none) */
  int aux_seqs;     /* sequences per load-balancing group: in a parallel
                       run it must be the sequences of one micro-batch of
                       one dp rank, batch / (dp * micro) */
  /* The expert grid of a parallel run (the reference ignores them):
   * expert parallel size (0: 1) and expert tensor parallel size (0: tp),
   * given to mpg_spec_set_experts. */
  int ep, etp;
  /* Tests only: multiplies the parallel run's expert-gradient scale (0:
   * 1), a deliberate bug that the comparison must catch. */
  float expert_grad_bug;
} gpt_config;

/* Tensors: 4 global ones, then 12 per layer.  id = 4 + 12 * layer + kind;
 * with MoE the MoE tensors follow (moe.h), and an MoE layer does not hold
 * its dense fc / fc2 ids. */
enum { GPT_WTE, GPT_WPE, GPT_LNFG, GPT_LNFB, GPT_NGLOBAL };
enum {
  L_LN1G, L_LN1B, L_QKVW, L_QKVB, L_PROJW, L_PROJB,
  L_LN2G, L_LN2B, L_FCW, L_FCB, L_FC2W, L_FC2B, L_NPER
};

int gpt_num_tensors(const gpt_config *c);
/* The dense layout's ids (any config; id < gpt_moe_base(c)): */
int gpt_tensor_id(int layer, int kind);
int gpt_tensor_layer(int id); /* -1 for the global tensors */
int gpt_tensor_kind(int id);  /* L_* for layer tensors, GPT_* for globals */
/* Name of a tensor of the dense layout ("h1.fc.w"); for any id of a
 * config, MoE tensors too ("h1.router.w", "h1.e3.fc.w"), use
 * gpt_tensor_name_cfg. */
void gpt_tensor_name(int id, char *buf, size_t n);
void gpt_tensor_name_cfg(const gpt_config *c, int id, char *buf, size_t n);
/* How a tensor is split over the ranks of a stage: replicated, over tp
 * (column- or row-parallel weight or column bias), or over the expert
 * tensor parallel group etp (an expert's fc.w, fc.b, fc2.w). */
enum { GPT_REPLICATED, GPT_SPLIT_TP, GPT_SPLIT_ETP };
int gpt_tensor_split(const gpt_config *c, int id);
/* Matrices get weight decay. */
int gpt_tensor_decays(const gpt_config *c, int id);
/* Elements of one of `parts` shards (parts: the size of the group the
 * tensor is split over, tp or etp; 1 for the full tensor). */
size_t gpt_tensor_count(const gpt_config *c, int id, int parts);
/* Local element index of shard r of `parts` -> index in the full tensor. */
size_t gpt_shard_to_full(const gpt_config *c, int id, int parts, int r, size_t i);
float gpt_init_value(const gpt_config *c, int id, size_t full_index);
/* Check a config for a given tp / pp / dp / cp / sp; NULL if fine, else
 * why not.  (For MoE on a mesh, gpt_moe_check in moe.h adds the expert
 * grid's checks.) */
const char *gpt_config_check(const gpt_config *c, int tp, int pp, int dp, int cp, int sp);

/* Tensor- and context-parallel communication of one rank.  tp == NULL:
 * none (tp = 1); cp == NULL: none (cp = 1).
 *
 * Context parallel (Megatron style): the sequence of every sample is cut
 * in cp contiguous chunks of seq / cp positions; cp rank r holds positions
 * [r * seq / cp, (r + 1) * seq / cp) of every sequence of its micro-batch
 * (all its activations, the embedding with global positions, its tokens'
 * losses).  Attention all-gathers K and V over "cp" and masks by global
 * position; backward reduce-scatters (sum) the gradients of the gathered K
 * and V over "cp".  Contiguous chunks are not load balanced (the last
 * chunk attends to the most keys); the result is the same. */
typedef struct gpt_comm {
  mpg_group *tp;
  int tp_size, tp_rank;
  int sp; /* sequence parallel */
  mpg_status err; /* first communication error */
  mpg_group *cp;
  int cp_size, cp_rank;
  /* Where the collectives' buffers are staged (stage.h): NULL, or a
   * host-backend stage, calls meshpg on the host arrays directly; an NCCL
   * stage copies them through device memory. */
  struct gpt_stage *stage;
  /* Expert parallel groups of the MoE layers (moe.h): "ep" and "etp";
   * NULL: size 1 (the reference). */
  mpg_group *ep, *etp;
  int ep_size, ep_rank, etp_size, etp_rank;
} gpt_comm;

typedef void (*gpt_ready_fn)(void *arg, int tensor);

typedef struct gpt_act gpt_act; /* one micro-batch's saved activations */

typedef struct gpt_model {
  gpt_config cfg;
  gpt_comm comm;
  int layer_lo, layer_hi; /* layers of this stage */
  int first, last;        /* holds the embedding / the LM head */
  int nt;
  float **p, **g, **m, **v; /* per tensor; NULL where absent */
  size_t *n;
  int own_grads;
  int own_params; /* p (and m, v) allocated by the model */
  gpt_ready_fn ready;
  void *ready_arg;
  gpt_ready_fn use; /* called before a tensor's first use in a forward */
  void *use_arg;
  int nb, nslots; /* sequences per micro-batch, activation slots */
  int tl, t0;     /* positions held (seq / cp) and the first one */
  int rows, rows_local; /* N = tl * nb, R = N / tp with sp else N */
  gpt_act *act;
  float *s_a, *s_b, *s_c, *s_d, *s_e; /* backward scratch */
  float *s_kv, *s_kvl; /* seq * nb x 2Cl and N x 2Cl (K | V) */
  long t; /* AdamW step */
  /* MoE (moe.h), accumulated by every forward until gpt_model_zero_stats:
   * aux_sum, the sum of the aux losses aux_G of the groups whose tokens
   * this rank holds, over its MoE layers (every rank of a group's tp x cp
   * ranks adds the same values); moe_tokens[moe layer x E], the
   * (token, choice) assignments of this rank's own rows to each expert,
   * by global MoE layer index (0 for the layers of other stages). */
  double aux_sum;
  double *moe_tokens;
  struct gpt_moe_ws *moe_ws; /* MoE scratch */
} gpt_model;

/* grads: NULL (the model allocates zeroed gradients) or one view per
 * tensor (NULL for the tensors this stage does not hold). */
int gpt_model_init(gpt_model *m, const gpt_config *c, const gpt_comm *comm,
                   int layer_lo, int layer_hi, int first, int last, int nb,
                   int nslots, float **grads);
/* The same with parameter views too: params (may be NULL: allocated) is
 * one view per tensor, filled here with the initial values; with params
 * the model allocates no AdamW state (use gpt_adamw_range). */
int gpt_model_init_views(gpt_model *m, const gpt_config *c, const gpt_comm *comm,
                         int layer_lo, int layer_hi, int first, int last, int nb,
                         int nslots, float **grads, float **params);
void gpt_model_free(gpt_model *m);
void gpt_model_zero_grads(gpt_model *m);
/* Zero aux_sum and moe_tokens. */
void gpt_model_zero_stats(gpt_model *m);
/* Does a stage with layers [lo, hi) hold tensor id, on expert parallel
 * rank ep_rank of ep? */
int gpt_tensor_held(const gpt_config *c, int id, int lo, int hi, int first, int last, int ep,
                    int ep_rank);

/* The tokens of global sequence g of step `step`: tok[0..seq] (seq + 1
 * bytes, inputs then targets shifted by one). */
void gpt_sequence(const gpt_config *c, const uint8_t *data, size_t len, long step,
                  long g, uint8_t *tok);
/* Unigram entropy of the data in nats. */
double gpt_unigram_entropy(const uint8_t *data, size_t len);

/* Forward of one micro-batch into activation slot `slot`.  seqs: nb
 * sequences of seq + 1 bytes (gpt_sequence).  in: this rank's input rows
 * (R x C) when not first; out: its output rows when not last.  On the last
 * stage returns the sum of the token losses of this rank's rows and keeps
 * loss_scale (d loss / d token loss) for backward. */
double gpt_forward(gpt_model *m, int slot, const uint8_t *seqs, const float *in,
                   float *out, float loss_scale);
/* Backward of slot: dout (R x C) when not last; dx (R x C) when not first.
 * Accumulates into the gradients; calls m->ready(arg, tensor) as each
 * tensor's gradient for this micro-batch is complete. */
void gpt_backward(gpt_model *m, int slot, const float *dout, float *dx);

/* Sum of squares of tensor id's gradient (f64). */
double gpt_grad_sumsq(const gpt_model *m, int id);
/* AdamW step over every held tensor, gradients multiplied by gscale
 * (clipping) first. */
void gpt_adamw(gpt_model *m, float gscale);
/* Sharded AdamW: gpt_adamw_tick once per step, then gpt_adamw_range for
 * each owned range: elements [off, off + n) of tensor id, with the state
 * mo[0..n), va[0..n). */
void gpt_adamw_tick(gpt_model *m);
void gpt_adamw_range(gpt_model *m, int id, size_t off, size_t n, float *mo, float *va,
                     float gscale);

/* Single-process reference training.  losses[steps] (the mean token loss
 * plus, with MoE, the aux loss); grads1 (may be NULL): per-tensor copies
 * of the gradients of step 0 (full tensors, before clipping), allocated.
 * On return *model holds the final parameters. */
int gpt_reference_train(const gpt_config *c, const uint8_t *data, size_t len,
                        int steps, gpt_model *model, double *losses,
                        float ***grads1);
/* The same, with MoE statistics (may be NULL): aux[steps], the aux loss
 * part of losses[]; imbalance[steps], gpt_moe_imbalance of the step's
 * tokens per expert. */
int gpt_reference_train_moe(const gpt_config *c, const uint8_t *data, size_t len,
                            int steps, gpt_model *model, double *losses, double *aux,
                            double *imbalance, float ***grads1);

#define GPT_CLIP 1.0
#endif
