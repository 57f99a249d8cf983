/* The simulated job of trace_sim.h. */
#include "trace_sim.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MS 1000000LL
#define T0 1700000000000000000LL

typedef struct rec {
  int g;           /* 0 tp, 1 dp, 2 pp, 3 world */
  sim_op op;
  long step;
  uint64_t gseq;
  int peer;        /* world */
  int64_t issue, end;
  const char *status;
} rec;

typedef struct srank {
  sim_op prog[SIM_MAXOPS];
  long pstep[SIM_MAXOPS];
  int nprog, pc, active, pending, dumped, hung;
  int64_t ready, dump_ns;
  const char *reason;
  rec recs[SIM_MAXOPS];
  int nrecs;
  uint64_t cseq[4], pseq[3][2][2]; /* per group; p2p per peer position and direction */
} srank;

static const char *const gnames[4] = {"tp", "dp", "pp", "world"};

/* Members of group g of rank r (2 each, world: SIM_WORLD) and its index;
 * returns how many. */
static int members(int g, int r, int m[SIM_WORLD], int *index) {
  int pp = r / 4, dp = (r / 2) % 2, tp = r % 2;
  if (g == 3) {
    for (int k = 0; k < SIM_WORLD; k++) m[k] = k;
    *index = 0;
    return SIM_WORLD;
  }
  if (g == 0) {
    m[0] = r / 2 * 2;
    m[1] = m[0] + 1;
    *index = r / 2;
  } else if (g == 1) {
    m[0] = pp * 4 + tp;
    m[1] = m[0] + 2;
    *index = pp * 2 + tp;
  } else {
    m[0] = dp * 2 + tp;
    m[1] = m[0] + 4;
    *index = dp * 2 + tp;
  }
  return 2;
}

static int gidx(const char *name) {
  return !strcmp(name, "tp") ? 0 : !strcmp(name, "dp") ? 1 : !strcmp(name, "pp") ? 2 : 3;
}
static int pos_of(int g, int r) {
  int m[SIM_WORLD], ix, n = members(g, r, m, &ix);
  for (int k = 0; k < n; k++)
    if (m[k] == r) return k;
  return -1;
}

/* Operations per step: six, and the issue-order check's collective on
 * world at the end of the step when check_order. */
static int per_step(const sim_job *j) { return 6 + (j->check_order ? 1 : 0); }

static void program(const sim_job *j, int r, srank *s) {
  int tp2 = j->same_counts ? 100 : 300;
  sim_op st0[6] = {{"tp", "all_reduce", 100, -1, -1}, {"pp", "send", 50, -1, 1},
                   {"tp", "all_reduce", tp2, -1, -1}, {"pp", "recv", 50, -1, 1},
                   {"dp", "all_reduce", 200, 0, -1},  {"dp", "all_to_all", 64, -1, -1}};
  sim_op st1[6] = {{"pp", "recv", 50, -1, 0},       {"tp", "all_reduce", 100, -1, -1},
                   {"tp", "all_reduce", tp2, -1, -1}, {"pp", "send", 50, -1, 0},
                   {"dp", "all_reduce", 200, 0, -1},  {"dp", "all_to_all", 64, -1, -1}};
  const sim_op *p = r < 4 ? st0 : st1;
  const sim_op check = {"world", "all_reduce", 4, -1, -1};
  s->nprog = 0;
  for (int step = 0; step < j->steps; step++)
    for (int o = 0; o < per_step(j); o++) {
      int victim = r == j->victim && step == j->step;
      if (victim && j->fault == SIM_SKIP && o == j->op) continue;
      int oo = o;
      if (victim && j->fault == SIM_SWAP && (o == j->op || o == j->op + 1))
        oo = o == j->op ? o + 1 : o - 1;
      s->prog[s->nprog] = oo < 6 ? p[oo] : check;
      s->pstep[s->nprog++] = step;
    }
}

static void stop(srank *s, int64_t t, const char *reason) {
  s->active = 0;
  s->dumped = 1;
  s->dump_ns = t;
  s->reason = reason;
}

static rec *find(srank *s, int g, const char *kind, int peer, uint64_t k) {
  for (int i = 0; i < s->nrecs; i++) {
    rec *c = &s->recs[i];
    if (c->g != g || c->gseq != k) continue;
    int p2p = !strcmp(c->op.kind, "send") || !strcmp(c->op.kind, "recv");
    if (kind ? p2p && !strcmp(c->op.kind, kind) && c->peer == peer : !p2p) return c;
  }
  return NULL;
}

static void dump_text(const sim_job *j, int r, srank *s, char *buf, size_t cap) {
  long capy = j->capacity > 0 ? j->capacity : 4096;
  int first = s->nrecs > capy ? s->nrecs - (int)capy : 0;
  size_t n = 0;
#define OUT(...) n += (size_t)snprintf(buf + n, n < cap ? cap - n : 0, __VA_ARGS__)
  OUT("meshpg-trace 1\nrank %d %d\nprocess host %d\nbackend thread\nmesh pp=2,dp=2,tp=2\n"
      "job 00000000000000aa\nclock %lld\nreason %s %s\nring %ld %d\n", r, SIM_WORLD, 100 + r,
      (long long)s->dump_ns, s->reason,
      strcmp(s->reason, "request") && strcmp(s->reason, "end") ? "failed" : "-", capy,
      s->nrecs);
  for (int g = 0; g < (j->check_order ? 4 : 3); g++) {
    int m[SIM_WORLD], ix, nm = members(g, r, m, &ix);
    OUT("group %d %s %d %d %d", g, gnames[g], ix, pos_of(g, r), nm);
    for (int k = 0; k < nm; k++) OUT("%c%d", k ? ',' : ' ', m[k]);
    OUT("\n");
  }
  for (int i = first; i < s->nrecs; i++) {
    rec *c = &s->recs[i];
    OUT("op %d %d %llu %s f32 %d %d %ld %d %lld %lld %lld %s %s %s\n", i, c->g,
        (unsigned long long)c->gseq, c->op.kind, c->op.count, c->peer, c->step, c->op.bucket,
        (long long)c->issue, (long long)c->issue, (long long)c->end, c->status,
        c->op.bucket >= 0 ? "p0" : "-", c->op.bucket >= 0 ? "p3" : "-");
  }
  OUT("end %d\n", s->nrecs - first);
#undef OUT
}

static srank *S; /* the ranks of the job being run */

int sim_run(sim_job *j, char *err, size_t errlen) {
  S = calloc(SIM_WORLD, sizeof(srank));
  if (!S) return -1;
  int64_t T = (int64_t)(j->timeout_s * 1e9), t;
  for (int r = 0; r < SIM_WORLD; r++) {
    program(j, r, &S[r]);
    S[r].active = 1;
    S[r].ready = T0;
  }
  for (t = T0; t < T0 + 120000 * MS; t += MS) {
    int any = 0;
    for (int r = 0; r < SIM_WORLD; r++) {
      srank *s = &S[r];
      if (!s->active) continue;
      any = 1;
      if (s->pending || t < s->ready) continue;
      if (s->pc == s->nprog) {
        stop(s, t, j->end_dumps ? "end" : "request");
        continue;
      }
      int at_fault = r == j->victim && s->pstep[s->pc] == j->step &&
                     s->pc % per_step(j) == j->op && s->pc / per_step(j) == j->step;
      if (at_fault && j->fault == SIM_HANG && !s->hung) {
        s->hung = 1;
        s->ready = t + (int64_t)(j->hang_s * 1e9);
        continue;
      }
      if (at_fault && j->fault == SIM_KILL) {
        s->active = 0;
        continue;
      }
      rec *c = &s->recs[s->nrecs++];
      c->op = s->prog[s->pc];
      c->step = s->pstep[s->pc++];
      c->g = gidx(c->op.group);
      c->issue = t;
      c->status = "pending";
      c->peer = -1;
      int m[SIM_WORLD], ix;
      members(c->g, r, m, &ix);
      if (c->op.peerpos >= 0) {
        int dir = !strcmp(c->op.kind, "recv");
        c->peer = m[c->op.peerpos];
        c->gseq = ++s->pseq[c->g][c->op.peerpos][dir];
      } else {
        c->gseq = ++s->cseq[c->g];
      }
      if (!strcmp(c->op.kind, "send")) {
        c->end = t;
        c->status = "ok";
        s->ready = t + MS;
      } else {
        s->pending = 1;
      }
    }
    /* Completions. */
    for (int r = 0; r < SIM_WORLD; r++) {
      srank *s = &S[r];
      if (!s->active || !s->pending) continue;
      rec *c = &s->recs[s->nrecs - 1];
      int m[SIM_WORLD], ix, nm = members(c->g, r, m, &ix);
      if (!strcmp(c->op.kind, "recv")) {
        rec *snd = find(&S[c->peer], c->g, "send", r, c->gseq);
        if (snd) {
          c->end = t;
          c->status = "ok";
          s->pending = 0;
          s->ready = t + MS;
        }
        continue;
      }
      /* Every member pending in its #gseq on the group. */
      rec *all[SIM_WORLD];
      int same = 1, here = 1;
      for (int k = 0; k < nm && here; k++) {
        srank *q = &S[m[k]];
        rec *o = find(q, c->g, NULL, -1, c->gseq);
        here = o && q->active && q->pending && o == &q->recs[q->nrecs - 1];
        if (!here) break;
        all[k] = o;
        same &= !strcmp(o->op.kind, c->op.kind) && o->op.count == c->op.count &&
                o->op.bucket == c->op.bucket;
      }
      if (!here) continue;
      for (int k = 0; k < nm; k++) {
        srank *q = &S[m[k]];
        all[k]->end = t;
        all[k]->status = same ? "ok" : "MPG_ERR_STATE";
        q->pending = 0;
        q->ready = t + MS;
        if (!same) stop(q, t, "MPG_ERR_STATE");
      }
    }
    /* Timeouts. */
    for (int r = 0; r < SIM_WORLD; r++) {
      srank *s = &S[r];
      if (!s->active || !s->pending) continue;
      rec *c = &s->recs[s->nrecs - 1];
      if (t - c->issue < T) continue;
      c->end = t;
      c->status = "MPG_ERR_TIMEOUT";
      s->pending = 0;
      stop(s, t, "MPG_ERR_TIMEOUT");
    }
    if (!any) break;
  }
  if (t >= T0 + 120000 * MS) {
    snprintf(err, errlen, "the simulation did not end");
    return -1;
  }
  j->nranks = 0;
  size_t cap = 1 << 20;
  char *buf = malloc(cap);
  if (!buf) return -1;
  for (int r = 0; r < SIM_WORLD; r++) {
    if (!S[r].dumped) continue;
    dump_text(j, r, &S[r], buf, cap);
    j->text[j->nranks] = strdup(buf);
    if (tr_parse(buf, strlen(buf), &j->ranks[j->nranks], err, errlen)) {
      tr_rank_free(&j->ranks[j->nranks]);
      free(buf);
      return -1;
    }
    j->nranks++;
  }
  free(buf);
  free(S);
  S = NULL;
  return 0;
}

/* sim_dp2tp2_skip: one op of the job (g: 0 tp, 1 world). */
typedef struct op4 {
  int g;
  long step;
  uint64_t gseq;
  int64_t issue, end;
  const char *status;
} op4;

#define OPS4 512

int sim_dp2tp2_skip(int steps, int step, int skip, int check_order, int tp1_count,
                    tr_rank ranks[4], char *err, size_t errlen) {
  static op4 ops[4][OPS4];
  int n[4] = {0}, pc[4] = {0};
  if (steps * 9 > OPS4) {
    snprintf(err, errlen, "too many steps");
    return -1;
  }
  for (int r = 0; r < 4; r++) {
    uint64_t seq[2] = {0, 0};
    for (int s = 0; s < steps; s++) {
      for (int k = 0; k < 8; k++)
        if (!(r == 2 && s == step && k == skip)) ops[r][n[r]++] = (op4){0, s, ++seq[0], 0, 0, NULL};
      if (check_order) ops[r][n[r]++] = (op4){1, s, ++seq[1], 0, 0, NULL};
    }
  }
  /* Lockstep: each rank issues its next op when its last completed; a
   * collective completes when every member's current op is it. */
  int64_t t = T0, ended[4] = {0};
  int pend[4] = {0};
  for (int progress = 1; progress; t += MS) {
    progress = 0;
    for (int r = 0; r < 4; r++)
      if (!pend[r] && pc[r] < n[r]) {
        ops[r][pc[r]].issue = t;
        pend[r] = 1;
        progress = 1;
      } else if (!pend[r] && !ended[r]) {
        ended[r] = t;
      }
    for (int r = 0; r < 4; r++) {
      if (!pend[r]) continue;
      op4 *o = &ops[r][pc[r]];
      int m[4], nm = 0;
      if (o->g == 1)
        for (int x = 0; x < 4; x++) m[nm++] = x;
      else
        m[nm++] = r / 2 * 2, m[nm++] = r / 2 * 2 + 1;
      int all = 1;
      for (int x = 0; x < nm && all; x++) {
        const op4 *p = &ops[m[x]][pc[m[x]]];
        all = pend[m[x]] && p->g == o->g && p->gseq == o->gseq;
      }
      if (!all) continue;
      for (int x = 0; x < nm; x++) {
        ops[m[x]][pc[m[x]]].end = t + MS / 2;
        ops[m[x]][pc[m[x]]].status = "ok";
        pend[m[x]] = 0;
        pc[m[x]]++;
      }
      progress = 1;
    }
  }
  for (int r = 0; r < 4; r++) {
    int64_t dump = ended[r] ? ended[r] : t;
    const char *reason = "end";
    if (pend[r]) {
      op4 *o = &ops[r][pc[r]];
      o->end = dump = o->issue + 1000 * MS;
      o->status = reason = "MPG_ERR_TIMEOUT";
      pc[r]++;
    }
    char *buf = malloc(1 << 16);
    if (!buf) return -1;
    size_t k = 0, cap = 1 << 16;
#define OUT4(...) k += (size_t)snprintf(buf + k, k < cap ? cap - k : 0, __VA_ARGS__)
    OUT4("meshpg-trace 1\nrank %d 4\nprocess host %d\nbackend mpi\nmesh dp=2,tp=2\n"
         "job 00000000000000bb\nclock %lld\nreason %s %s\nring 4096 %d\n"
         "group 0 tp %d %d 2 %d,%d\n", r, 100 + r, (long long)dump, reason,
         strcmp(reason, "end") ? "timed%20out" : "-", pc[r], r / 2, r % 2, r / 2 * 2,
         r / 2 * 2 + 1);
    if (check_order) OUT4("group 1 world 0 %d 4 0,1,2,3\n", r);
    for (int x = 0; x < pc[r]; x++) {
      const op4 *o = &ops[r][x];
      OUT4("op %d %d %llu all_reduce f32 %d -1 %ld -1 %lld %lld %lld %s - -\n", x, o->g,
           (unsigned long long)o->gseq, o->g ? 4 : r < 2 ? 100 : tp1_count, o->step,
           (long long)o->issue, (long long)o->issue, (long long)o->end, o->status);
    }
    OUT4("end %d\n", pc[r]);
#undef OUT4
    int rc = k < cap ? tr_parse(buf, k, &ranks[r], err, errlen) : -1;
    free(buf);
    if (rc) {
      for (int x = 0; x <= r; x++) tr_rank_free(&ranks[x]);
      return -1;
    }
  }
  return 0;
}

int sim_write(sim_job *j, const char *dir) {
  for (int i = 0; i < j->nranks; i++) {
    char path[4096];
    snprintf(path, sizeof path, "%s/rank-%d.trace", dir, j->ranks[i].rank);
    FILE *f = fopen(path, "w");
    if (!f || !j->text[i]) {
      if (f) fclose(f);
      return -1;
    }
    fputs(j->text[i], f);
    if (fclose(f)) return -1;
  }
  return 0;
}

void sim_free(sim_job *j) {
  for (int i = 0; i < j->nranks; i++) {
    tr_rank_free(&j->ranks[i]);
    free(j->text[i]);
    j->text[i] = NULL;
  }
  j->nranks = 0;
}
