/* Checkpoints of the GPT example (gpt --save DIR --save-at K [--async-save],
 * gpt --resume DIR), through meshpg's mpg_ckpt (docs/checkpoints.md).
 *
 * Every rank registers what it holds as pieces of global tensors, under
 * their global names (gpt_tensor_name_cfg: "h5.fc.w", "h1.e3.fc.w"):
 *  - each parameter with its global shape, and its tp (experts: etp)
 *    split as mpg_tensor_layout.split_dims / split_axis (gpt_tensor_layout
 *    below; the split is exactly gpt_shard_to_full's);
 *  - AdamW's moments as "<param>.exp_avg" and "<param>.exp_avg_sq" (kind
 *    MPG_CKPT_STATE): in shard mode with mpg_ckpt_add_state on the owned
 *    ranges of the sync's state arrays, in replicate mode the whole local
 *    m and v;
 *  - "trainer": gpt_ckpt_trainer below, the same bytes on every rank.
 * Save and load go through meshpg, which deduplicates the replicas and
 * reshards on load, so a run saved under one mesh (dp, tp, cp, pp, ep,
 * etp; replicate, shard, HSDP; thread ranks, MPI processes or NCCL) resumes
 * under another.  On NCCL the registered buffers are device memory: the
 * sync's parameter views in shard mode, else device copies of the host
 * arrays, staged before a save and after a load (stage.h). */
#ifndef GPT_CKPT_H
#define GPT_CKPT_H

#include <stdint.h>

#include "model.h"

/* A tensor's global shape, and how a rank's local array (gpt_tensor_count
 * elements, gpt_shard_to_full's layout) is a box of it: the global shape
 * with axis `split_axis` cut in `parts` equal pieces, piece r of the shard
 * of rank r of the group ("tp", or "etp" for an expert's tensors; parts =
 * that group's size).  qkv.w [C, 3, C] on axis 2 (the q, k and v columns
 * of the rank's heads); qkv.b [3, C] on axis 1; proj.w [C, C] on axis 0;
 * fc.w [C, 4C] on axis 1; fc.b [4C] on axis 0; fc2.w [4C, C] on axis 0;
 * replicated tensors whole (split_dims NULL).  Fills *L (from
 * MPG_TENSOR_LAYOUT_INIT: ndim, shape, split_axis, split_dims).  Returns
 * the number of axes. */
int gpt_tensor_layout(const gpt_config *c, int id, mpg_tensor_layout *L);

/* The trainer's own state in a checkpoint ("trainer", mpg_ckpt_add_bytes):
 * fixed-width fields in this order, host byte order, no padding (every
 * rank must hold the same bytes).  The step
 * is also the data position (gpt_sequence draws step s's batch from s);
 * the rest is what must match for the resumed run to continue the same
 * training and be compared with the reference: the model, the batch, the
 * optimizer and the data. */
#define GPT_CKPT_MAGIC 0x6b707467u /* "gptk" */
#define GPT_CKPT_VERSION 1u
typedef struct gpt_ckpt_trainer {
  uint32_t magic, version;
  int64_t step;   /* steps done: the next step to train */
  int64_t adam_t; /* AdamW's step counter (gpt_model.t) */
  uint64_t seed;
  uint64_t data_len, data_hash; /* the training bytes: length, FNV-1a */
  int32_t n_layer, d_model, n_head, seq, batch, moe, topk, dense_layers, aux_seqs;
  int32_t reserved; /* 0 */
  float lr, aux_coef;
} gpt_ckpt_trainer; /* 96 bytes */

/* The record of a run of config c on data (step and adam_t 0). */
void gpt_ckpt_trainer_init(gpt_ckpt_trainer *s, const gpt_config *c, const uint8_t *data,
                           size_t len);
/* Compare a loaded record with this run's (gpt_ckpt_trainer_init): NULL
 * when the run can continue it, else what differs, written into buf. */
const char *gpt_ckpt_trainer_check(const gpt_ckpt_trainer *saved,
                                   const gpt_ckpt_trainer *mine, char *buf, size_t n);

#endif
