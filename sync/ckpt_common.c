/* Checkpoints: what save and load share below the handle's functions
 * (ckpt.c calls save and load, so these cannot live there: check_layout
 * refuses the cycle; ckpt_shared.h): the agreement of every rank on a
 * result, and the handle's host staging. */
#include <stdio.h>
#include <string.h>

#include "ckpt_shared.h"
#include "groups_internal.h"

mpg_status mpg__ckpt_agree(mpg_ckpt *ck, mpg_status st, int relayed, const char *what) {
  mpg_group *world = NULL;
  mpg_status cs = mpg_ctx_group(ck->ctx, "world", &world);
  if (cs) return mpg__fail_wrap(cs, "%s: the world group", what);
  int rank = mpg_ctx_rank(ck->ctx), nw = mpg_group_size(world);
  /* A failure of its own ranks before one relayed from another rank;
   * "did not learn the outcome" (relayed 2) only when nothing else failed,
   * and then it is no failure. */
  int64_t none = 3 * (int64_t)nw;
  int64_t mine = st ? (int64_t)(relayed > 2 ? 2 : relayed) * nw + rank : none, first = none;
  cs = mpg__group_host_all_reduce(world, &mine, &first, 1, MPG_I64, MPG_OP_MIN);
  if (cs) return mpg__fail_wrap(cs, "%s: agreeing on the result", what);
  if (first >= 2 * (int64_t)nw) return MPG_OK;
  first %= nw;
  /* The first failing rank's status and message, summed from zeros. */
  enum { W = 1 + MPG__CKPT_MSG / 8 };
  int64_t msg[W], all[W];
  memset(msg, 0, sizeof msg);
  if (first == rank) {
    msg[0] = (int64_t)st;
    snprintf((char *)&msg[1], MPG__CKPT_MSG, "%s", mpg_last_error());
  }
  cs = mpg__group_host_all_reduce(world, msg, all, W, MPG_I64, MPG_OP_SUM);
  if (cs) return mpg__fail_wrap(cs, "%s: sharing the error of world rank %lld", what,
                                (long long)first);
  char text[MPG__CKPT_MSG];
  memcpy(text, &all[1], sizeof text);
  text[sizeof text - 1] = 0;
  mpg_status out = (mpg_status)all[0];
  if (out <= MPG_OK || out >= MPG_STATUS_COUNT) out = MPG_ERR_STATE;
  if (first == rank) return mpg__fail(out, "%s", text);
  return mpg__fail(out, "world rank %lld failed: %s", (long long)first, text);
}

mpg_status mpg__ckpt_stage(mpg_ckpt *ck, size_t bytes, void **out) {
  if (ck->stage && ck->stage_bytes >= bytes) {
    *out = ck->stage;
    return MPG_OK;
  }
  if (ck->stage) (void)mpg__ctx_host_free(ck->ctx, ck->stage);
  ck->stage = NULL;
  ck->stage_bytes = 0;
  mpg_status st = mpg__ctx_host_alloc(ck->ctx, bytes, &ck->stage);
  if (st) return mpg__fail_wrap(st, "host staging of %zu bytes", bytes);
  ck->stage_bytes = bytes;
  *out = ck->stage;
  return MPG_OK;
}
