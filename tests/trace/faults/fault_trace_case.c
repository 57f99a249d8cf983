/* Fault injection for the flight recorder (fault_trace.h): the program's
 * slots, the cases, and the judgement of a case's dumps. */
#include "fault_trace.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../../tools/trace_analyze.h"
#include "../../support/time_bound.h"

const char *const tf_kind_names[TF_NKINDS] = {"hang", "skip", "swap"};

const char *tf_backend_name(int backend) {
  static const char *const names[3] = {"thread", "mpi", "nccl"};
  return backend >= 0 && backend < 3 ? names[backend] : "?";
}

static const tf_slot stage_slots[2][TF_SLOTS] = {
    {{TO_TP, 0}, {TO_TP, 1}, {TO_A2A, 0}, {TO_SEND, 0}, {TO_RECV, 0}, {TO_BUCKET, 0},
     {TO_TP, 2}, {TO_BUCKET, 1}, {TO_BUCKET, 2}},
    {{TO_RECV, 0}, {TO_TP, 0}, {TO_TP, 1}, {TO_A2A, 0}, {TO_TP, 2}, {TO_BUCKET, 0},
     {TO_SEND, 0}, {TO_BUCKET, 1}, {TO_BUCKET, 2}}};

tf_slot tf_slot_of(int stage, int k) { return stage_slots[stage != 0][k]; }

const char *tf_slot_name(int stage, int k, char *buf, size_t cap) {
  if (k < 0 || k >= TF_SLOTS) {
    snprintf(buf, cap, "%s", k == TF_SLOTS ? "mpg_sync_finish" : "the set-up");
    return buf;
  }
  tf_slot s = tf_slot_of(stage, k);
  switch (s.op) {
    case TO_TP: snprintf(buf, cap, "all_reduce %c on tp", 'A' + s.arg); break;
    case TO_A2A: snprintf(buf, cap, "all_to_all on dp"); break;
    case TO_SEND: snprintf(buf, cap, "send on pp"); break;
    case TO_RECV: snprintf(buf, cap, "recv on pp"); break;
    default: snprintf(buf, cap, "sync bucket %d (dp)", s.arg); break;
  }
  return buf;
}

/* ------------------------------------------------------------------ */
/* Cases                                                               */
/* ------------------------------------------------------------------ */

static uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

typedef struct rng {
  uint64_t s;
} rng;

static unsigned below(rng *r, unsigned n) {
  r->s += 0x9e3779b97f4a7c15ull;
  return n ? (unsigned)(mix(r->s) % n) : 0;
}

/* May `kind` strike slot k of `stage` on `backend`? */
static int allowed(int backend, tf_kind kind, int stage, int k) {
  tf_slot s = tf_slot_of(stage, k);
  if (kind == TF_HANG) return 1;
  if (kind == TF_SKIP) {
    /* A bucket cannot be skipped (finish launches what was not marked);
     * an all-to-all skipped meets another collective on dp: only the
     * thread backend compares. */
    if (s.op == TO_BUCKET) return 0;
    return s.op != TO_A2A || backend == TF_THREAD;
  }
  /* Swap k and k + 1: not two all-reduces of one signature (invisible),
   * nor two buckets (they launch in bucket order whatever the marks). */
  if (k + 1 >= TF_SLOTS) return 0;
  tf_slot n = tf_slot_of(stage, k + 1);
  if (s.op == TO_TP && n.op == TO_TP) return 0;
  if (s.op == TO_BUCKET && n.op == TO_BUCKET) return 0;
  return 1;
}

void tf_case_make(unsigned seed, int backend, int index, const char *base, tf_case *c) {
  memset(c, 0, sizeof *c);
  rng r = {mix(((uint64_t)seed << 24) ^ ((uint64_t)(unsigned)backend << 20) ^
               (uint64_t)(unsigned)index ^ 0x32u)};
  c->seed = seed;
  c->index = index;
  c->backend = backend;
  c->victim = (int)below(&r, TF_WORLD);
  c->step = (int)below(&r, TF_STEPS);
  int stage = c->victim / 4;
  for (;;) {
    c->kind = (tf_kind)below(&r, TF_NKINDS);
    int cand[TF_SLOTS], n = 0;
    for (int k = 0; k < TF_SLOTS; k++)
      if (allowed(backend, c->kind, stage, k)) cand[n++] = k;
    if (!n) continue;
    c->slot = cand[below(&r, (unsigned)n)];
    break;
  }
  c->nodump = c->kind == TF_HANG && below(&r, 3) == 0;
  c->shm = backend != TF_NCCL && below(&r, 2);
  double f = tb_sanitizer_factor();
  c->timeout_s = 1.0 * f;
  c->hang_s = c->timeout_s + 0.6 * f;
  c->compute_s = tf_env_int("MESHPG_TF_COMPUTE_MS", 0) * 1e-3;
  snprintf(c->dir, sizeof c->dir, "%s/case-%d", base, index);
}

void tf_describe(const tf_case *c, char *buf, size_t cap) {
  char s0[64], s1[64];
  int stage = c->victim / 4;
  tf_slot_name(stage, c->slot, s0, sizeof s0);
  if (c->kind == TF_SWAP) tf_slot_name(stage, c->slot + 1, s1, sizeof s1);
  snprintf(buf, cap,
           "%s case %d (seed %u): %s world rank %d (stage %d), step %d, slot %d (%s%s%s)%s; "
           "MESHPG_SHM=%d, timeout %.1f s",
           tf_backend_name(c->backend), c->index, c->seed, tf_kind_names[c->kind], c->victim,
           stage, c->step, c->slot, s0, c->kind == TF_SWAP ? " after " : "",
           c->kind == TF_SWAP ? s1 : "",
           c->kind == TF_HANG
               ? (c->nodump ? ", sleeps past the timeout and never dumps" : ", sleeps past the timeout")
               : "",
           c->shm, c->timeout_s);
}

void tf_outcome_text(const tf_outcome *o, int rank, char *buf, size_t cap) {
  if (o->status == MPG_OK) {
    snprintf(buf, cap, "rank %d: all OK%s%s", rank, o->requested ? ", dumped on request" : "",
             o->injected ? " (fault injected)" : "");
    return;
  }
  snprintf(buf, cap, "rank %d: %s in step %d at %s%s%s: %s", rank, mpg_status_name(o->status),
           o->step, o->what, o->requested ? ", dumped on request" : "",
           o->injected ? " (fault injected)" : "", o->message);
}

/* ------------------------------------------------------------------ */
/* Judgement                                                           */
/* ------------------------------------------------------------------ */

int tf_judge(const tf_case *c, char *why, size_t cap) {
  tr_rank *ranks = NULL;
  int n = 0;
  char err[1024];
  why[0] = '\0';
  if (tr_read_dir(c->dir, &ranks, &n, err, sizeof err)) {
    snprintf(why, cap, "no dump could be read: %s", err);
    return -1;
  }
  ta_report rep;
  int ok = 0;
  if (ta_analyze(ranks, n, TF_WORLD, &rep, err, sizeof err)) {
    snprintf(why, cap, "the analyzer failed: %s", err);
    ok = -1;
  } else {
    ok = rep.nculprits > 0;
    size_t m = (size_t)snprintf(why, cap, "%d dumps; %s", rep.ndumps,
                                rep.fault ? "a fault" : "no fault (dumps on request)");
    for (int k = 0; k < rep.nculprits; k++) {
      if (rep.culprits[k].rank != c->victim) ok = 0;
      if (m < cap) m += (size_t)snprintf(why + m, cap - m, "\n    %s", rep.culprits[k].text);
    }
    if (!rep.nculprits && m < cap) snprintf(why + m, cap - m, "\n    no culprit");
  }
  ta_report_free(&rep);
  tr_ranks_free(ranks, n);
  return ok;
}

void tf_remove_dir(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *e;
  char path[1024];
  while ((e = readdir(d))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    struct stat st;
    if (!lstat(path, &st) && S_ISDIR(st.st_mode)) tf_remove_dir(path);
    else unlink(path);
  }
  closedir(d);
  rmdir(dir);
}

int tf_env_int(const char *name, int dflt) {
  const char *v = getenv(name);
  return v && *v ? atoi(v) : dflt;
}

unsigned tf_env_seed(void) {
  const char *v = getenv("MESHPG_TF_SEED");
  return v && *v ? (unsigned)strtoul(v, NULL, 10) : 32u;
}
