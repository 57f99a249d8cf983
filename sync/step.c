/* The step: begin, mark_ready (launch buckets in order as they fill),
 * finish (wait, sum tied buffers, order the caller's stream), zero_grads
 * (see sync_core.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sync_core.h"

/* Wait for (and release) every bucket still in flight. */
void mpg__sync_wait_all(mpg_sync *s) {
  for (int k = 0; k < s->layout.nbuckets; k++) {
    sbucket *b = &s->layout.buckets[k];
    if (b->launched && b->work) (void)mpg_work_wait(b->work);
    b->work = NULL;
    if (b->replicate_work) (void)mpg_work_wait(b->replicate_work);
    b->replicate_work = NULL;
  }
}

/* ------------------------------------------------------------------ */
/* The step                                                            */
/* ------------------------------------------------------------------ */

/* Fail the step: keep the first error (with `what` in front of the groups
 * layer's message), mark the gradients invalid, and remember a timeout or
 * abort, after which the context is unusable.
 *
 * A failed step launches nothing more (no further bucket, replicate
 * slice or tied sum), while the peers, whose step may be healthy, post
 * theirs.  Unless the failure is an argument error (MPG_ERR_INVALID,
 * _RANGE: the same on every member, which all stop at the same
 * operation), this rank's next step would pair its collectives with the
 * peers' pending ones and hand them a wrong sum with MPG_OK.  So such a
 * failure aborts the context (the groups layer already did for timeouts,
 * aborts and failed posts; this covers the rest: another thread holding
 * a group, a stream that could not be ordered), and every member fails
 * instead.  `more` is 0 for the step's last collective, the issue-order
 * check: its verdict (MPG_ERR_STATE) is every member's alike, with nothing
 * after it, and aborts nothing; its other failures (a post that failed on
 * this rank) abort. */
static mpg_status step_fail_as(mpg_sync *s, mpg_status st, const char *what, int more) {
  if (!s->step.status) {
    snprintf(s->step.msg, sizeof s->step.msg, "sync step %ld: %s: %s", s->step.number, what,
             mpg_last_error());
    s->step.status = st;
    if (more || st != MPG_ERR_STATE) mpg__sync_abort_after(s, st);
    if (mpg_ctx_status(s->ctx) != MPG_OK && !s->step.aborted) {
      s->step.aborted = st == MPG_ERR_TIMEOUT ? st : MPG_ERR_ABORTED;
      s->step.aborted_step = s->step.number;
      snprintf(s->step.aborted_msg, sizeof s->step.aborted_msg, "%s", s->step.msg);
    }
    mpg__log(1, "rank %d: %s", mpg_ctx_rank(s->ctx), s->step.msg);
  }
  s->step.grads_valid = 0;
  return mpg__fail(s->step.status, "%s", s->step.msg);
}

static mpg_status step_fail(mpg_sync *s, mpg_status st, const char *what) {
  return step_fail_as(s, st, what, 1);
}

static void describe_bucket(const mpg_sync *s, int k, char *buf, size_t n) {
  const sbucket *b = &s->layout.buckets[k];
  const sbuffer *f = &s->layout.buffers[b->buffer];
  snprintf(buf, n,
           "bucket %d of %d (%s, group \"%s\" index %d of %d ranks, %d params "
           "\"%s\"..\"%s\", %zu elements)",
           k, s->layout.nbuckets, mpg_dtype_name(f->dtype), mpg_group_name(f->group),
           mpg_group_index(f->group), mpg_group_size(f->group), b->nparams,
           s->layout.params[b->first_param].name,
           s->layout.params[b->last_param].name, b->count);
}

static mpg_status launch_bucket(mpg_sync *s, int k) {
  sbucket *b = &s->layout.buckets[k];
  const sbuffer *f = &s->layout.buffers[b->buffer];
  char what[512];
  /* The bucket's gradients were produced on the caller's stream before
   * mark_ready: order the sync's stream after everything queued there so
   * far (a fresh event for every bucket; once per step would miss the
   * gradients queued after the first launch). */
  mpg_status st = mpg_ctx_stream_order(s->ctx, s->stream, s->step.caller_stream);
  if (st) {
    describe_bucket(s, k, what, sizeof what);
    snprintf(what + strlen(what), sizeof what - strlen(what),
             ": ordering the sync's stream after the caller's");
    return step_fail(s, st, what);
  }
  s->step.stream_used = 1;
  if (f->sharded) {
    /* Shard mode: reduce-scatter (shard.c). */
    st = mpg__sync_shard_launch(s, k);
    if (st) {
      describe_bucket(s, k, what, sizeof what);
      return step_fail(s, st, what);
    }
    b->launched = 1;
    s->step.launched_buckets++;
    return MPG_OK;
  }
  void *data = (char *)f->data + b->offset * mpg_dtype_size(f->dtype);
  double scale = s->opts.grad_scale;
  if (s->opts.sync.op == MPG_OP_AVG) scale /= mpg_group_size(f->group);
  mpg_op op = s->opts.grad_scale != 1.0 ? MPG__OP_PREMUL_SUM
              : s->opts.sync.op == MPG_OP_AVG ? MPG_OP_AVG : MPG_OP_SUM;
  if (f->shm)
    /* Shared memory: this rank's bucket is ready; each member reduces its
     * shard of everyone's (groups/shm/). */
    st = mpg__shm_all_reduce(f->shm, b->offset, b->count, op, scale, &b->work);
  else if ((f->dtype == MPG_F16 || f->dtype == MPG_BF16) &&
           s->opts.sync.reduce_dtype == MPG_REDUCE_F32)
    /* f32 accumulation on every backend (nccl: widened, reduced in f32,
     * narrowed once; groups_internal.h). */
    st = mpg__all_reduce_f32acc(f->group, data, data, b->count, f->dtype, op, scale,
                                s->stream, &b->work);
  else if (op != MPG__OP_PREMUL_SUM)
    st = mpg_all_reduce(f->group, data, data, b->count, f->dtype, op, s->stream, &b->work);
  else
    st = mpg_all_reduce_scaled(f->group, data, data, b->count, f->dtype, scale,
                               s->stream, &b->work);
  if (st) {
    describe_bucket(s, k, what, sizeof what);
    return step_fail(s, st, what);
  }
  b->launched = 1;
  s->step.launched_buckets++;
  mpg__log(2, "sync: rank %d: step %ld: launched bucket %d", mpg_ctx_rank(s->ctx),
           s->step.number, k);
  return MPG_OK;
}

/* Launch every bucket, in order, from the next one while all its params
 * are ready (all of them with `force`). */
/* launch_bucket, its operations tagged with bucket k in the flight
 * recorder. */
static mpg_status launch(mpg_sync *s, int k) {
  mpg__sync_trace_tag(s, k);
  mpg_status st = launch_bucket(s, k);
  mpg__trace_tag(-1, 0, 0);
  return st;
}

static mpg_status launch_ready(mpg_sync *s, int force) {
  while (!s->step.status && s->step.next_launch < s->layout.nbuckets &&
         (force || s->layout.buckets[s->step.next_launch].pending == 0)) {
    mpg_status st = launch(s, s->step.next_launch);
    if (st) return st;
    s->step.next_launch++;
  }
  return s->step.status ? mpg__fail(s->step.status, "%s", s->step.msg) : MPG_OK;
}

/* Look at the buckets in flight, oldest first, so that backends which
 * progress only when called make headway, and failures show early. */
static mpg_status poll(mpg_sync *s) {
  while (!s->step.status && s->step.first_unfinished < s->step.next_launch) {
    sbucket *b = &s->layout.buckets[s->step.first_unfinished];
    int done = 0;
    mpg_status st = mpg_work_test(b->work, &done);
    if (st) {
      char what[512];
      describe_bucket(s, s->step.first_unfinished, what, sizeof what);
      return step_fail(s, st, what);
    }
    if (!done) break;
    s->step.first_unfinished++;
  }
  return MPG_OK;
}

mpg_status mpg_sync_begin(mpg_sync *s, long step, int is_last_microbatch,
                          void *stream) {
  if (!s) return mpg__fail(MPG_ERR_INVALID, "mpg_sync_begin: sync is NULL");
  if (!s->committed)
    return mpg__fail(MPG_ERR_STATE, "mpg_sync_begin step %ld: call mpg_sync_commit first",
                     step);
  if (s->step.open)
    return mpg__fail(MPG_ERR_STATE,
                     "mpg_sync_begin step %ld: step %ld is still open; end it with "
                     "mpg_sync_finish",
                     step, s->step.number);
  if (s->step.aborted)
    return mpg__fail(MPG_ERR_ABORTED,
                     "mpg_sync_begin step %ld: the context was aborted in step %ld "
                     "(%s); destroy the sync and the context and start again. "
                     "The failure was: %s",
                     step, s->step.aborted_step, mpg_status_name(s->step.aborted),
                     s->step.aborted_msg);
  if (s->step.zeroed_on_stream) {
    /* Gradients were zeroed on the sync's stream: the caller's writes come
     * after. */
    mpg_status st = mpg_ctx_stream_order(s->ctx, stream, s->stream);
    if (st)
      return mpg__fail_wrap(st, "mpg_sync_begin step %ld: ordering the caller's stream "
                            "after the zeroing", step);
    s->step.zeroed_on_stream = 0;
  }
  s->step.open = 1;
  s->step.number = step;
  mpg__trace_step(s->ctx, step); /* recorded with every later operation */
  s->step.last_microbatch = is_last_microbatch != 0;
  s->step.caller_stream = stream;
  s->step.stream_used = 0;
  s->step.next_launch = 0;
  s->step.first_unfinished = 0;
  s->step.status = MPG_OK;
  s->step.msg[0] = '\0';
  for (int i = 0; i < s->layout.nparams; i++) s->layout.params[i].ready = 0;
  for (int k = 0; k < s->layout.nbuckets; k++) {
    sbucket *b = &s->layout.buckets[k];
    b->pending = b->nparams;
    b->launched = 0;
    b->work = NULL;
  }
  return MPG_OK;
}

mpg_status mpg_sync_mark_ready(mpg_sync *s, int param) {
  if (!s) return mpg__fail(MPG_ERR_INVALID, "mpg_sync_mark_ready: sync is NULL");
  if (param < 0 || param >= s->layout.nparams)
    return mpg__fail(MPG_ERR_RANGE, "mpg_sync_mark_ready: param %d is outside 0..%d",
                     param, s->layout.nparams - 1);
  sparam *p = &s->layout.params[param];
  if (!s->step.open)
    return mpg__fail(MPG_ERR_STATE,
                     "mpg_sync_mark_ready \"%s\": no step is open; call mpg_sync_begin "
                     "first",
                     p->name);
  if (p->ready)
    return mpg__fail(MPG_ERR_STATE,
                     "mpg_sync_mark_ready \"%s\" (param %d): already marked ready in "
                     "step %ld",
                     p->name, param, s->step.number);
  p->ready = 1;
  if (!s->step.last_microbatch) return MPG_OK; /* accumulation: communicate on the last only */
  if (s->step.status) return mpg__fail(s->step.status, "%s", s->step.msg);
  s->layout.buckets[p->bucket].pending--;
  mpg_status st = launch_ready(s, 0);
  if (!st) st = poll(s);
  return st;
}

mpg_status mpg_sync_finish(mpg_sync *s) {
  if (!s) return mpg__fail(MPG_ERR_INVALID, "mpg_sync_finish: sync is NULL");
  if (!s->step.open)
    return mpg__fail(MPG_ERR_STATE, "mpg_sync_finish: no step is open; call "
                     "mpg_sync_begin first");
  if (!s->step.last_microbatch) {
    s->step.open = 0;
    return MPG_OK;
  }
  /* Launch what is left (params never marked are taken as they are). */
  launch_ready(s, 1);
  /* Wait for everything launched, even after a failure: never leave a
   * collective writing into the buffers. */
  for (int k = 0; k < s->layout.nbuckets; k++) {
    sbucket *b = &s->layout.buckets[k];
    if (!b->launched || !b->work) continue;
    mpg_status st = mpg_work_wait(b->work);
    b->work = NULL;
    if (st && !s->step.status) {
      char what[512];
      describe_bucket(s, k, what, sizeof what);
      step_fail(s, st, what);
    }
  }
  /* Shard mode with a replicate group: the slices' all-reduces (those not
   * posted at launch), then wait for them. */
  if (s->shard.any_replicate) {
    int bad = -1;
    mpg_status st = mpg__sync_shard_finish(s, &bad);
    if (st && !s->step.status) {
      char what[512];
      describe_bucket(s, bad >= 0 ? bad : 0, what, sizeof what);
      snprintf(what + strlen(what), sizeof what - strlen(what),
               ": all-reduce of the shard over its replicate group");
      step_fail(s, st, what);
    }
  }
  /* Tied groups: sum the averaged gradients (e.g. first + last stage). */
  for (int t = 0; t < s->layout.ntied && !s->step.status; t++) {
    const sbuffer *f = &s->layout.buffers[s->layout.tied_order[t]];
    if (t == 0) {
      mpg_status st = mpg_ctx_stream_order(s->ctx, s->stream, s->step.caller_stream);
      if (st) {
        step_fail(s, st, "tied sums: ordering the sync's stream after the caller's");
        break;
      }
      s->step.stream_used = 1;
    }
    mpg_status st = mpg_all_reduce(f->tied, f->data, f->data, f->count, f->dtype,
                                   MPG_OP_SUM, s->stream, &s->step.tied_works[t]);
    if (st) {
      char what[512];
      snprintf(what, sizeof what,
               "tied sum of buffer %d (%s, %zu elements, reduce group \"%s\") over "
               "tied group \"%s\" of %d ranks",
               s->layout.tied_order[t], mpg_dtype_name(f->dtype), f->count,
               mpg_group_name(f->group),
               mpg_group_name(f->tied), mpg_group_size(f->tied));
      step_fail(s, st, what);
    }
  }
  for (int t = 0; t < s->layout.ntied; t++) {
    if (!s->step.tied_works[t]) continue;
    mpg_status st = mpg_work_wait(s->step.tied_works[t]);
    s->step.tied_works[t] = NULL;
    if (st && !s->step.status) {
      const sbuffer *f = &s->layout.buffers[s->layout.tied_order[t]];
      char what[512];
      snprintf(what, sizeof what, "tied sum of buffer %d (%s) over tied group \"%s\"",
               s->layout.tied_order[t], mpg_dtype_name(f->dtype), mpg_group_name(f->tied));
      step_fail(s, st, what);
    }
  }
  /* The caller's later work (the optimizer) comes after the reduction. */
  if (s->step.stream_used) {
    mpg_status st = mpg_ctx_stream_order(s->ctx, s->step.caller_stream, s->stream);
    if (st && !s->step.status) step_fail(s, st, "ordering the caller's stream after the sync's");
  }
  /* The end of the step: the issue-order check, on every rank whatever
   * its step status (a collective: no rank may skip it). */
  mpg_status ost = mpg__ctx_check_order(s->ctx, "mpg_sync_finish");
  if (ost && !s->step.status) step_fail_as(s, ost, "issue-order check", 0);
  s->step.open = 0;
  if (s->step.status) {
    s->step.grads_valid = 0;
    return mpg__fail(s->step.status, "%s", s->step.msg);
  }
  s->step.grads_valid = 1;
  s->shard.gather_due = s->opts.sync.mode == MPG_SYNC_SHARD; /* the optimizer, then a gather */
  return MPG_OK;
}

mpg_status mpg_sync_all(mpg_sync *s, long step, void *stream) {
  mpg_status st = mpg_sync_begin(s, step, 1, stream);
  if (st) return st;
  /* Backward order: the buckets launch one after another as they fill. */
  for (int id = s->layout.nparams - 1; id >= 0 && !s->step.status; id--) {
    st = mpg_sync_mark_ready(s, id);
    if (st) break;
  }
  return mpg_sync_finish(s);
}

mpg_status mpg_sync_zero_grads(mpg_sync *s) {
  if (!s) return mpg__fail(MPG_ERR_INVALID, "mpg_sync_zero_grads: sync is NULL");
  if (!s->committed)
    return mpg__fail(MPG_ERR_STATE, "mpg_sync_zero_grads: call mpg_sync_commit first");
  if (s->step.open && s->step.next_launch > 0)
    return mpg__fail(MPG_ERR_STATE,
                     "mpg_sync_zero_grads: step %ld has %d buckets in flight; zero "
                     "after mpg_sync_finish",
                     s->step.number, s->step.next_launch);
  /* The optimizer may still be reading the gradients on the caller's
   * stream (the one given to the last begin): the memsets on the sync's
   * stream come after everything queued there so far. */
  mpg_status ord = mpg_ctx_stream_order(s->ctx, s->stream, s->step.caller_stream);
  if (ord)
    return mpg__fail_wrap(ord, "mpg_sync_zero_grads: ordering the sync's stream after "
                          "the caller's");
  for (int b = 0; b < s->layout.nbuffers; b++) {
    const sbuffer *f = &s->layout.buffers[b];
    mpg_status st = mpg_ctx_mem_zero(s->ctx, f->data, f->count * mpg_dtype_size(f->dtype),
                                     s->stream);
    if (st)
      return mpg__fail_wrap(st, "mpg_sync_zero_grads: buffer %d (%s, group \"%s\")", b,
                            mpg_dtype_name(f->dtype), mpg_group_name(f->group));
  }
  s->step.zeroed_on_stream = 1;
  return MPG_OK;
}
