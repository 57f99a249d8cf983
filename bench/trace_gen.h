/*
 * trace_gen.h - synthetic flight-recorder dumps (docs/trace.md, "The dump
 * format (version 1)") of the two jobs issue 46 (items 6 and 7) measured
 * `meshpg trace` on; for bench/bench_trace_analyze.c and
 * tests/trace/faults/test_trace_scale.c.  Header-only C11.
 *
 * A hang (tg_hang_*): a pp x dp x tp mesh (world rank ((p*D)+d)*T + t)
 * running a pipeline program step after step (per step: forward recv from
 * the previous stage, two tp all-reduces, send to the next stage; backward
 * recv from the next stage, one tp all-reduce, send to the previous one;
 * two dp all-reduces, sync buckets 0 and 1), full rings of `entries`
 * operations (the older ones overwritten).  In the last step the culprit
 * issues nothing (it hangs computing); every other rank issues its ops
 * while the ones before completed (a collective completes when every
 * member issued it, a send/receive when both sides did), so that all of
 * them end up blocked on it, directly or through other blocked ranks.
 * One of the culprit's tp peers times out after 10 s (MPG_ERR_TIMEOUT), the
 * others' ops are pending at their dumps.  The expected verdict: the
 * culprit, as the root of the wait-for graph.
 *
 * A pipeline (tg_pipe_*): 2 ranks, one "pp" group, `pairs` steps of a
 * send 0 -> 1 and a send 1 -> 0 (each with its receive), rings of
 * `entries`; then rank 0 hangs and rank 1's receive #pairs+1 times out.
 * The verdict: world rank 0.
 */
#ifndef MESHPG_BENCH_TRACE_GEN_H
#define MESHPG_BENCH_TRACE_GEN_H

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TG_MS 1000000LL
#define TG_T0 1700000000000000000LL /* the first step's issue time (ns) */
#define TG_STEP_NS (100 * TG_MS)
#define TG_TIMEOUT_NS (10000 * TG_MS)

enum { TG_TP, TG_DP, TG_PP };

typedef struct tg_op {
  int dim;        /* TG_TP, TG_DP, TG_PP */
  int send, recv; /* point-to-point: which; else a collective */
  int dp_peer;    /* pp: +1 or -1 (the next or the previous stage) */
  int bucket;
} tg_op;

typedef struct tg_hang {
  int P, D, T, world, culprit, timed_out;
  long entries;
  long S;     /* the last (hung) step */
  int *pos;   /* per rank: how many ops of step S it issued */
} tg_hang;

static inline int tg_rank(const tg_hang *h, int p, int d, int t) { return (p * h->D + d) * h->T + t; }

/* The ops of one step of a rank at stage p, in issue order (out[0..n)). */
static inline int tg_step_ops(const tg_hang *h, int p, tg_op *out) {
  int n = 0;
  if (p > 0) out[n++] = (tg_op){TG_PP, 0, 1, -1, -1};
  out[n++] = (tg_op){TG_TP, 0, 0, 0, -1};
  out[n++] = (tg_op){TG_TP, 0, 0, 0, -1};
  if (p < h->P - 1) out[n++] = (tg_op){TG_PP, 1, 0, 1, -1};
  if (p < h->P - 1) out[n++] = (tg_op){TG_PP, 0, 1, 1, -1};
  out[n++] = (tg_op){TG_TP, 0, 0, 0, -1};
  if (p > 0) out[n++] = (tg_op){TG_PP, 1, 0, -1, -1};
  out[n++] = (tg_op){TG_DP, 0, 0, 0, 0};
  out[n++] = (tg_op){TG_DP, 0, 0, 0, 1};
  return n;
}

/* Op k of a step of stage p complete, given every rank's pos. */
static inline int tg_complete(const tg_hang *h, int r, int k) {
  int t = r % h->T, d = (r / h->T) % h->D, p = r / (h->T * h->D);
  tg_op ops[16];
  tg_step_ops(h, p, ops);
  const tg_op *o = &ops[k];
  if (o->dim == TG_TP) {
    for (int q = 0; q < h->T; q++)
      if (h->pos[tg_rank(h, p, d, q)] <= k) return 0;
    return 1;
  }
  if (o->dim == TG_DP) {
    for (int q = 0; q < h->D; q++)
      if (h->pos[tg_rank(h, p, q, t)] <= k) return 0;
    return 1;
  }
  int pp = p + o->dp_peer, m = tg_rank(h, pp, d, t);
  tg_op po[16];
  int pn = tg_step_ops(h, pp, po);
  for (int j = 0; j < pn; j++)
    if (po[j].dim == TG_PP && po[j].dp_peer == -o->dp_peer && po[j].send == o->recv)
      return h->pos[m] > j;
  return 0;
}

/* Plan the hang: the ranks' progress in the last step.  0, or -1 (out of
 * memory). */
static inline int tg_hang_plan(tg_hang *h, int P, int D, int T, long entries, int culprit) {
  memset(h, 0, sizeof *h);
  h->P = P, h->D = D, h->T = T, h->world = P * D * T, h->entries = entries;
  h->culprit = culprit;
  h->S = entries / 7 + 2; /* the rings wrapped */
  h->pos = calloc((size_t)h->world, sizeof(int));
  if (!h->pos) return -1;
  for (int changed = 1; changed;) {
    changed = 0;
    for (int r = 0; r < h->world; r++) {
      if (r == culprit) continue;
      tg_op ops[16];
      int n = tg_step_ops(h, r / (T * D), ops);
      while (h->pos[r] < n && (h->pos[r] == 0 || tg_complete(h, r, h->pos[r] - 1))) {
        h->pos[r]++;
        changed = 1;
      }
    }
  }
  /* The culprit's first tp peer times out. */
  int t = culprit % T, base = culprit - t;
  h->timed_out = base + (t == 0 ? 1 : 0);
  return 0;
}

static inline void tg_hang_free(tg_hang *h) { free(h->pos); }

typedef struct tg_buf {
  char *s;
  size_t n, cap;
} tg_buf;

__attribute__((format(printf, 2, 3))) static inline int tg_add(tg_buf *b, const char *fmt, ...) {
  va_list ap;
  for (;;) {
    va_start(ap, fmt);
    int k = vsnprintf(b->s ? b->s + b->n : NULL, b->s ? b->cap - b->n : 0, fmt, ap);
    va_end(ap);
    if (k < 0) return -1;
    if (b->s && b->n + (size_t)k < b->cap) {
      b->n += (size_t)k;
      return 0;
    }
    size_t cap = b->cap ? 2 * b->cap : 1 << 16;
    while (cap < b->n + (size_t)k + 1) cap *= 2;
    char *p = realloc(b->s, cap);
    if (!p) return -1;
    b->s = p, b->cap = cap;
  }
}

/* The dump of rank r of the hang into b (reset first).  0 or -1. */
static inline int tg_hang_dump(const tg_hang *h, int r, tg_buf *b) {
  int T = h->T, D = h->D, P = h->P;
  int t = r % T, d = (r / T) % D, p = r / (T * D);
  tg_op ops[16];
  int n = tg_step_ops(h, p, ops);
  long total = h->S * n + h->pos[r];
  long first = total > h->entries ? total - h->entries : 0;
  int64_t t_fail = TG_T0 + h->S * TG_STEP_NS + 2 * 5 * TG_MS + TG_TIMEOUT_NS;
  int me_fail = r == h->timed_out;
  b->n = 0;
  int rc = tg_add(b, "meshpg-trace 1\nrank %d %d\nprocess node%d %d\nbackend thread\n"
                  "mesh pp=%d,dp=%d,tp=%d\njob 00000000000000bb\nclock %lld\nreason %s %s\n"
                  "ring %ld %ld\n", r, h->world, r / 8, 1000 + r, P, D, T,
                  (long long)(t_fail + (r % 97) * TG_MS), me_fail ? "MPG_ERR_TIMEOUT" : "MPG_ERR_ABORTED",
                  me_fail ? "all_reduce%20timed%20out" : "the%20context%20was%20aborted", h->entries,
                  total);
  /* group lines: 0 tp, 1 dp, 2 pp */
  rc |= tg_add(b, "group 0 tp %d %d %d ", p * D + d, t, T);
  for (int q = 0; q < T; q++) rc |= tg_add(b, "%s%d", q ? "," : "", tg_rank(h, p, d, q));
  rc |= tg_add(b, "\ngroup 1 dp %d %d %d ", p * T + t, d, D);
  for (int q = 0; q < D; q++) rc |= tg_add(b, "%s%d", q ? "," : "", tg_rank(h, p, q, t));
  rc |= tg_add(b, "\ngroup 2 pp %d %d %d ", d * T + t, p, P);
  for (int q = 0; q < P; q++) rc |= tg_add(b, "%s%d", q ? "," : "", tg_rank(h, q, d, t));
  rc |= tg_add(b, "\n");
  int ntp = 0, ndp = 0;
  for (int k = 0; k < n; k++) ntp += ops[k].dim == TG_TP, ndp += ops[k].dim == TG_DP;
  for (long seq = first; seq < total && !rc; seq++) {
    long s = seq / n;
    int k = (int)(seq % n), ctp = 0, cdp = 0;
    for (int j = 0; j < k; j++) ctp += ops[j].dim == TG_TP, cdp += ops[j].dim == TG_DP;
    const tg_op *o = &ops[k];
    int64_t issue = TG_T0 + s * TG_STEP_NS + k * 5 * TG_MS, end = issue + 3 * TG_MS;
    const char *st = "ok";
    if (s == h->S && k == h->pos[r] - 1 && !tg_complete(h, r, k)) {
      end = me_fail ? issue + TG_TIMEOUT_NS : 0;
      st = me_fail ? "MPG_ERR_TIMEOUT" : "pending";
    }
    if (o->dim == TG_PP) {
      int peer = tg_rank(h, p + o->dp_peer, d, t);
      rc |= tg_add(b, "op %ld 2 %ld %s f32 65536 %d %ld -1 %lld %lld %lld %s - -\n", seq, s + 1,
                   o->send ? "send" : "recv", peer, s, (long long)issue, (long long)issue,
                   (long long)end, st);
    } else if (o->dim == TG_TP) {
      rc |= tg_add(b, "op %ld 0 %ld all_reduce bf16 1048576 -1 %ld -1 %lld %lld %lld %s - -\n",
                   seq, s * ntp + ctp + 1, s, (long long)issue, (long long)issue, (long long)end,
                   st);
    } else {
      rc |= tg_add(b, "op %ld 1 %ld all_reduce f32 4194304 -1 %ld %d %lld %lld %lld %s "
                   "layers.%d.mlp.fc.weight layers.%d.attn.qkv.weight\n", seq, s * ndp + cdp + 1,
                   s, o->bucket, (long long)issue, (long long)issue, (long long)end, st,
                   11 - 6 * o->bucket, 6 - 6 * o->bucket);
    }
  }
  rc |= tg_add(b, "end %ld\n", total - first);
  return rc;
}

/* The pipeline's dump of rank r (0 or 1) after `pairs` steps.  0 or -1. */
static inline int tg_pipe_dump(long pairs, long entries, int r, tg_buf *b) {
  /* per step: rank 0 send #s to 1, recv #s from 1; rank 1 recv, send */
  long total = 2 * pairs + (r == 1 ? 1 : 0);
  long first = total > entries ? total - entries : 0;
  int64_t last_issue = TG_T0 + pairs * TG_STEP_NS, t_fail = last_issue + TG_TIMEOUT_NS;
  b->n = 0;
  int rc = tg_add(b, "meshpg-trace 1\nrank %d 2\nprocess node0 %d\nbackend thread\nmesh pp=2\n"
                  "job 00000000000000cc\nclock %lld\nreason %s %s\nring %ld %ld\n"
                  "group 0 pp 0 %d 2 0,1\n", r, 1000 + r, (long long)(t_fail + TG_MS),
                  r ? "MPG_ERR_TIMEOUT" : "MPG_ERR_ABORTED",
                  r ? "recv%20timed%20out" : "aborted", entries, total, r);
  for (long seq = first; seq < total && !rc; seq++) {
    long s = seq / 2;
    int k = (int)(seq % 2);
    int send = r == 0 ? k == 0 : k == 1;
    int64_t issue = TG_T0 + s * TG_STEP_NS + k * 5 * TG_MS, end = issue + 3 * TG_MS;
    const char *st = "ok";
    if (s == pairs) {
      issue = last_issue;
      end = t_fail;
      st = "MPG_ERR_TIMEOUT";
    }
    rc |= tg_add(b, "op %ld 0 %ld %s f32 65536 %d %ld -1 %lld %lld %lld %s - -\n", seq, s + 1,
                 send ? "send" : "recv", 1 - r, s, (long long)issue, (long long)issue,
                 (long long)end, st);
  }
  rc |= tg_add(b, "end %ld\n", total - first);
  return rc;
}

#endif
