/* Checkpoint save (ckpt_shared.h, steps 1-3): stage and hash this
 * rank's pieces, take the lock and make dir.partial (rank 0, ckpt_lock.c),
 * exchange the descriptors, plan who writes what, agree on it.  The
 * writing and publishing (steps 4-5) are ckpt_write.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ckpt_save_shared.h"
#include "groups_internal.h"

/* Step 1: every piece into host memory (staged when needed) and hashed. */
static mpg_status stage(mpg_ckpt *ck, mpg__ckpt_save *sv, void *stream) {
  int device = mpg__ctx_device_buffers(ck->ctx);
  size_t total = 0;
  for (int i = 0; i < ck->n; i++) {
    const mpg__ckpt_entry *e = &ck->e[i];
    sv->pieces[i].nbytes = e->range_count * mpg__ckpt_esz(e);
    if (device || ck->opts.async) total += (sv->pieces[i].nbytes + 63) & ~(size_t)63;
  }
  mpg_status st = MPG_OK;
  if (total) {
    st = mpg__ckpt_stage(ck, total, &sv->staging);
    if (st) return st;
  }
  size_t at = 0;
  for (int i = 0; i < ck->n && !st; i++) {
    mpg__ckpt_piece *p = &sv->pieces[i];
    const mpg__ckpt_entry *e = &ck->e[i];
    if (!total) {
      p->bytes = e->data;
      continue;
    }
    unsigned char *dst = (unsigned char *)sv->staging + at;
    at += (p->nbytes + 63) & ~(size_t)63;
    p->bytes = dst;
    if (e->host || !device) memcpy(dst, e->data, p->nbytes);
    else st = mpg__ctx_copy(ck->ctx, dst, e->data, p->nbytes, stream);
  }
  if (!st && total && device) st = mpg__ctx_stream_sync(ck->ctx, stream);
  if (st) return mpg__fail_wrap(st, "copying the pieces to host staging");
  uint64_t bb = ck->opts.block_bytes;
  for (int i = 0; i < ck->n; i++) {
    mpg__ckpt_piece *p = &sv->pieces[i];
    p->nblocks = mpg__ckpt_nblocks(p->nbytes, bb);
    p->hashes = malloc((size_t)p->nblocks * 8 + 8);
    if (!p->hashes) return mpg__fail(MPG_ERR_NOMEM, "block checksums: out of memory");
    for (uint64_t b = 0; b < p->nblocks; b++) {
      uint64_t off = b * bb, n = p->nbytes - off < bb ? p->nbytes - off : bb;
      p->hashes[b] = mpg__xxh64(p->bytes + off, (size_t)n, 0);
    }
    p->hash = mpg__xxh64(p->hashes, (size_t)p->nblocks * 8, 0);
  }
  return MPG_OK;
}

/* The descriptor words of this rank (ckpt_save_shared.h, "Descriptors"). */
static mpg_status encode_desc(const mpg_ckpt *ck, const mpg__ckpt_save *sv, mpg_status st,
                              int64_t **out, size_t *nwords) {
  size_t n = MPG__DESC_HEAD;
  for (int i = 0; i < ck->n && !st; i++)
    n += MPG__DESC_ENTRY + (strlen(ck->e[i].name) + 8) / 8 + sv->pieces[i].nblocks;
  int64_t *w = calloc(n, 8);
  if (!w) return mpg__fail(MPG_ERR_NOMEM, "checkpoint descriptors: out of memory");
  w[0] = st;
  w[1] = (int64_t)sv->save_id;
  w[2] = st ? 0 : ck->n;
  w[3] = (int64_t)sv->partial_ino;
  if (st) snprintf((char *)&w[MPG__DESC_MSG], MPG__CKPT_MSG, "%s", mpg_last_error());
  size_t at = MPG__DESC_HEAD;
  for (int i = 0; i < ck->n && !st; i++) {
    const mpg__ckpt_entry *e = &ck->e[i];
    const mpg__ckpt_piece *p = &sv->pieces[i];
    size_t len = strlen(e->name);
    w[at++] = (int64_t)len;
    memcpy(&w[at], e->name, len); /* NUL from calloc */
    at += (len + 8) / 8;
    w[at++] = e->dtype;
    w[at++] = e->kind;
    w[at++] = e->ndim;
    for (int k = 0; k < MPG_CKPT_MAX_NDIM; k++) w[at + k] = (int64_t)e->shape[k];
    for (int k = 0; k < MPG_CKPT_MAX_NDIM; k++) w[at + 8 + k] = (int64_t)e->box_off[k];
    for (int k = 0; k < MPG_CKPT_MAX_NDIM; k++) w[at + 16 + k] = (int64_t)e->box_shape[k];
    at += 24;
    w[at++] = (int64_t)e->range_off;
    w[at++] = (int64_t)e->range_count;
    w[at++] = (int64_t)p->hash;
    w[at++] = (int64_t)p->nblocks;
    memcpy(&w[at], p->hashes, (size_t)p->nblocks * 8);
    at += p->nblocks;
  }
  *out = w;
  *nwords = n;
  return MPG_OK;
}

/* Step 2: all-gather every rank's descriptor words (padded to the
 * longest) into sv->all (world x sv->stride words). */
static mpg_status exchange(mpg_ckpt *ck, mpg__ckpt_save *sv, const int64_t *mine, size_t n) {
  mpg_group *world = NULL;
  mpg_status st = mpg_ctx_group(ck->ctx, "world", &world);
  if (st) return st;
  int64_t len = (int64_t)n, *lens = calloc((size_t)sv->world, 8);
  if (!lens) return mpg__fail(MPG_ERR_NOMEM, "checkpoint descriptors: out of memory");
  st = mpg__group_host_all_gather(world, &len, lens, 1, MPG_I64);
  size_t stride = 0;
  for (int r = 0; r < sv->world && !st; r++)
    if ((size_t)lens[r] > stride) stride = (size_t)lens[r];
  free(lens);
  if (st) return st;
  int64_t *pad = calloc(stride, 8);
  sv->all = calloc(stride * (size_t)sv->world, 8);
  if (!pad || !sv->all) {
    free(pad);
    return mpg__fail(MPG_ERR_NOMEM, "checkpoint descriptors: %zu words", stride * sv->world);
  }
  memcpy(pad, mine, n * 8);
  st = mpg__group_host_all_gather(world, pad, sv->all, stride, MPG_I64);
  free(pad);
  sv->stride = stride;
  return st;
}

/* The first rank whose descriptor carries a failure, as this thread's
 * error (every rank computes the same). */
static mpg_status gathered_failure(const mpg__ckpt_save *sv) {
  for (int r = 0; r < sv->world; r++) {
    const int64_t *w = sv->all + (size_t)r * sv->stride;
    if (w[0]) {
      char msg[MPG__CKPT_MSG];
      memcpy(msg, &w[MPG__DESC_MSG], sizeof msg);
      msg[sizeof msg - 1] = 0;
      mpg_status st = (mpg_status)w[0];
      if (st <= MPG_OK || st >= MPG_STATUS_COUNT) st = MPG_ERR_STATE;
      return mpg__fail(st, "world rank %d: %s", r, msg);
    }
  }
  return MPG_OK;
}

static uint64_t make_save_id(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  uint64_t v = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
  v ^= (uint64_t)getpid() << 32;
  return mpg__xxh64(&v, sizeof v, (uint64_t)(uintptr_t)&v) | 1;
}

mpg_status mpg__ckpt_save_start(mpg_ckpt *ck, const char *dir, long step, void *stream) {
  mpg__ckpt_save *sv = calloc(1, sizeof *sv);
  if (!sv || !(sv->pieces = calloc((size_t)ck->n + 1, sizeof *sv->pieces))) {
    free(sv);
    return mpg__fail(MPG_ERR_NOMEM, "mpg_ckpt_save: out of memory");
  }
  sv->ck = ck;
  sv->rank = mpg_ctx_rank(ck->ctx);
  sv->world = mpg_ctx_world_size(ck->ctx);
  sv->step = step;
  sv->timeout = ck->opts.timeout_s;
  sv->parent_fd = sv->lock_fd = sv->partial_fd = sv->board_fd = -1;
  mpg_status st = MPG_OK;
  if (strlen(dir) + 16 > sizeof sv->dir)
    st = mpg__fail(MPG_ERR_INVALID, "mpg_ckpt_save: dir is %zu bytes long", strlen(dir));
  snprintf(sv->dir, sizeof sv->dir, "%s", dir);
  while (strlen(sv->dir) > 1 && sv->dir[strlen(sv->dir) - 1] == '/')
    sv->dir[strlen(sv->dir) - 1] = 0;
  snprintf(sv->partial, sizeof sv->partial, "%s.partial", sv->dir);
  snprintf(sv->lock, sizeof sv->lock, "%s.lock", sv->dir);
  if (sv->rank == 0) sv->save_id = make_save_id();
  double t0 = mpg__now();
  if (!st) st = stage(ck, sv, stream);
  double t1 = mpg__now();
  if (!st && sv->rank == 0) st = mpg__ckpt_lock(sv);
  int64_t *mine = NULL;
  size_t n = 0;
  mpg_status est = encode_desc(ck, sv, st, &mine, &n);
  if (est) st = est; /* out of memory: no descriptor to send */
  if (!est) st = exchange(ck, sv, mine, n);
  free(mine);
  if (!est && !st) {
    /* The same on every rank from here: a failure in a descriptor, or an
     * agreement on every rank's plan (rank 0's metadata included) and
     * opening of the board, so that no rank writes or waits unless every
     * rank can. */
    st = gathered_failure(sv);
    if (!st) {
      sv->save_id = (uint64_t)sv->all[1]; /* rank 0's */
      sv->partial_ino = (uint64_t)sv->all[3];
      st = mpg__ckpt_plan(ck, sv);
      if (!st && mpg__ckpt_fault) st = mpg__ckpt_fault(sv->rank, "plan");
      if (!st) st = mpg__ckpt_board_open(sv);
      st = mpg__ckpt_agree(ck, st, 0, "mpg_ckpt_save");
      if (!st) st = mpg__ckpt_check_overlaps(ck, sv);
    }
  }
  if (st) {
    mpg__saved_error keep;
    mpg__error_save(&keep);
    if (sv->rank == 0 && sv->partial_fd >= 0) {
      char pname[4200];
      snprintf(pname, sizeof pname, "%s.partial", sv->base);
      (void)mpg__ckpt_remove_ours(sv->parent_fd, pname, sv->partial);
    }
    mpg__ckpt_save_free(ck, sv);
    return mpg__fail_wrap(mpg__error_restore(st, &keep), "mpg_ckpt_save(\"%s\")", dir);
  }
  mpg__log(2, "ckpt save %s rank %d: staged and hashed in %.1f ms, agreed on the plan in "
           "%.1f ms", sv->dir, sv->rank, 1e3 * (t1 - t0), 1e3 * (mpg__now() - t1));
  ck->save = sv;
  return mpg__ckpt_write_start(ck, sv);
}
