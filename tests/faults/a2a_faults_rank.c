/* One member's part of a scenario of the all-to-all's fault property
 * (a2a_faults.h), for threads and processes alike. */
#include "a2a_faults.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../support/clock.h"

static const char *const kinds[AF_KINDS] = {"slow", "stop", "kill", "abort"};

const char *af_name(const af_scen *s, char *buf, size_t cap) {
  snprintf(buf, cap, "%s-%s", kinds[s->kind], s->async ? "async" : "blocking");
  return buf;
}

int af_parse(const char *name, af_scen *s) {
  for (int k = 0; k < AF_KINDS; k++)
    for (int a = 0; a < 2; a++) {
      af_scen t = {k, a, s->count};
      char b[32];
      if (!strcmp(name, af_name(&t, b, sizeof b))) {
        *s = t;
        return 0;
      }
    }
  return -1;
}

/* Element k of the block position `from` sends position `to`. */
static int32_t val(int from, int to, size_t k) {
  return (int32_t)(((uint32_t)from * 131u + (uint32_t)to * 7u + 1u) << 20 ^ (uint32_t)k);
}

static void fill(int32_t *send, int me, size_t count, int reuse) {
  for (int j = 0; j < AF_N; j++)
    for (size_t k = 0; k < count; k++)
      send[(size_t)j * count + k] = reuse ? ~val(me, j, k) : val(me, j, k);
}

static long wrong(const int32_t *recv, int me, size_t count) {
  long bad = 0;
  for (int j = 0; j < AF_N; j++)
    for (size_t k = 0; k < count; k++) bad += recv[(size_t)j * count + k] != val(j, me, k);
  return bad;
}

/* The faulted call: async (post, the fault, wait) or blocking. */
static mpg_status call(mpg_ctx *ctx, mpg_group *g, const af_scen *s, int victim,
                       int32_t *send, int32_t *recv) {
  if (!s->async) {
    if (victim && s->kind == AF_SLOW) sleep_s(AF_SLOW_S);
    if (victim && s->kind == AF_ABORT) (void)mpg_ctx_abort(ctx);
    return mpg_all_to_all(g, send, recv, s->count, MPG_I32, NULL, NULL);
  }
  mpg_work *w = NULL;
  mpg_status st = mpg_all_to_all(g, send, recv, s->count, MPG_I32, NULL, &w);
  if (st) return st;
  if (victim) {
    if (s->kind == AF_SLOW) sleep_s(AF_SLOW_S);
    if (s->kind == AF_STOP) raise(SIGSTOP);
    if (s->kind == AF_KILL) raise(SIGKILL);
    if (s->kind == AF_ABORT) (void)mpg_ctx_abort(ctx);
  }
  return mpg_work_wait(w);
}

mpg_status af_run(mpg_ctx *ctx, mpg_group *g, const af_scen *s, const af_hooks *h,
                  void (*barrier)(void *), void *barrier_arg, af_out *o) {
  memset(o, 0, sizeof *o);
  int me = mpg_group_position(g), victim = me == AF_N - 1;
  size_t bytes = sizeof(int32_t) * AF_N * s->count;
  int32_t *send = NULL, *recv = NULL;
  mpg_status st = mpg_ctx_mem_alloc(ctx, bytes, 0, (void **)&send);
  if (!st) st = mpg_ctx_mem_alloc(ctx, bytes, 0, (void **)&recv);
  if (st) return st;
  fill(send, me, s->count, 0);
  /* The channel, made and checked. */
  st = mpg_all_to_all(g, send, recv, s->count, MPG_I32, NULL, NULL);
  if (!st && wrong(recv, me, s->count)) {
    snprintf(o->msg, sizeof o->msg, "the first all-to-all received wrong values");
    st = MPG_ERR_BACKEND;
  }
  if (st) goto out;
  memset(recv, 0xff, bytes);
  int thread_leaves = !h && s->kind == AF_KILL;
  /* Signals inside a blocking call: the others come a little later, so
   * that the victim waits for them in the channel when it is stopped. */
  int inside = h && !s->async && (s->kind == AF_STOP || s->kind == AF_KILL);
  double t0 = now_s();
  if (victim && thread_leaves) {
    o->returned = 0; /* it never calls: a member that left */
    if (barrier) barrier(barrier_arg);
    goto out;
  }
  if (inside && !victim) {
    sleep_s(0.1);
    if (me == 0) h->signal_victim(h->arg, s->kind == AF_STOP ? SIGSTOP : SIGKILL);
    sleep_s(0.1);
  }
  o->st = call(ctx, g, s, victim, send, recv);
  o->secs = now_s() - t0;
  o->returned = 1;
  snprintf(o->msg, sizeof o->msg, "%s", o->st ? mpg_last_error() : "");
  o->wrong = o->st ? 0 : wrong(recv, me, s->count);
  if (!victim) fill(send, me, s->count, 1); /* its buffer again, at once */
  if (barrier) barrier(barrier_arg);
  if (h && me == 0 && s->kind == AF_STOP) {
    sleep_s(0.3); /* the others reused theirs too */
    h->signal_victim(h->arg, SIGCONT);
  }
out:
  (void)mpg_ctx_mem_free(ctx, send);
  (void)mpg_ctx_mem_free(ctx, recv);
  return st;
}

const char *af_judge(const af_scen *s, const af_out *o, char *why, size_t cap) {
  char name[32];
  af_name(s, name, sizeof name);
  int ok = 0, failed = -1;
  why[0] = '\0';
  for (int r = 0; r < AF_N; r++) {
    if (!o[r].returned) continue;
    if (o[r].st == MPG_OK) {
      ok++;
      if (o[r].wrong) {
        snprintf(why, cap, "%s: position %d returned MPG_OK with %ld of %zu elements wrong",
                 name, r, o[r].wrong, (size_t)(AF_N * s->count));
        return why;
      }
    } else if (failed < 0) {
      failed = r;
    }
  }
  if (ok && failed >= 0) {
    int r = 0;
    while (!o[r].returned || o[r].st) r++;
    snprintf(why, cap, "%s: position %d returned MPG_OK while position %d failed (%s: %s)",
             name, r, failed, mpg_status_name(o[failed].st), o[failed].msg);
  }
  return why;
}
