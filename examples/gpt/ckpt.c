/* Checkpoints of the GPT example: the global layout of every tensor, the
 * trainer's record, and a rank's registration, save and resume (ckpt.h,
 * trainer.h).  Each rank registers once, after its model is built; a save
 * (after the step --save-at names) and a load (before the first step)
 * read and write the registered buffers in place. */
#include "ckpt.h"
#include "moe.h"
#include "trainer.h"

#include <string.h>
#include <sys/stat.h>

_Static_assert(sizeof(gpt_ckpt_trainer) == 96, "gpt_ckpt_trainer has padding");

int gpt_tensor_layout(const gpt_config *c, int id, mpg_tensor_layout *L) {
  const size_t C = (size_t)c->d_model;
  *L = (mpg_tensor_layout)MPG_TENSOR_LAYOUT_INIT;
  int layer, e, kind = -1, ax = -1;
  if (gpt_moe_decode(c, id, &layer, &e, &kind)) {
    static const int dense_of[] = {-1, L_FCW, L_FCB, L_FC2W, L_FC2B};
    kind = dense_of[kind]; /* an expert's tensors are shaped as the dense MLP's */
    if (kind < 0) L->ndim = 2, L->shape[0] = C, L->shape[1] = (size_t)c->moe; /* router */
  } else if (id >= GPT_NGLOBAL) {
    kind = gpt_tensor_kind(id);
  } else if (id == GPT_WTE || id == GPT_WPE) {
    L->ndim = 2, L->shape[0] = id == GPT_WTE ? GPT_VOCAB : (size_t)c->seq, L->shape[1] = C;
  } else {
    L->ndim = 1, L->shape[0] = C; /* lnf.g, lnf.b */
  }
  switch (kind) {
  case L_QKVW: L->ndim = 3, L->shape[0] = C, L->shape[1] = 3, L->shape[2] = C, ax = 2; break;
  case L_QKVB: L->ndim = 2, L->shape[0] = 3, L->shape[1] = C, ax = 1; break;
  case L_PROJW: L->ndim = 2, L->shape[0] = C, L->shape[1] = C, ax = 0; break;
  case L_FCW: L->ndim = 2, L->shape[0] = C, L->shape[1] = 4 * C, ax = 1; break;
  case L_FCB: L->ndim = 1, L->shape[0] = 4 * C, ax = 0; break;
  case L_FC2W: L->ndim = 2, L->shape[0] = 4 * C, L->shape[1] = C, ax = 0; break;
  case -1: break; /* set above */
  default: L->ndim = 1, L->shape[0] = C; /* LayerNorms, proj.b, fc2.b */
  }
  const int split = gpt_tensor_split(c, id);
  if (split != GPT_REPLICATED) {
    L->split_axis = ax;
    L->split_dims = split == GPT_SPLIT_ETP ? "etp" : "tp";
  }
  return L->ndim;
}

/* FNV-1a, 64 bits. */
static uint64_t fnv1a(const uint8_t *p, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

void gpt_ckpt_trainer_init(gpt_ckpt_trainer *s, const gpt_config *c, const uint8_t *data,
                           size_t len) {
  memset(s, 0, sizeof *s);
  s->magic = GPT_CKPT_MAGIC, s->version = GPT_CKPT_VERSION;
  s->seed = c->seed, s->data_len = len, s->data_hash = fnv1a(data, len);
  s->n_layer = c->n_layer, s->d_model = c->d_model, s->n_head = c->n_head;
  s->seq = c->seq, s->batch = c->batch, s->moe = c->moe;
  if (c->moe > 0) {
    s->topk = c->topk, s->dense_layers = c->dense_layers, s->aux_seqs = c->aux_seqs;
    s->aux_coef = c->aux_coef;
  }
  s->lr = c->lr;
}

const char *gpt_ckpt_trainer_check(const gpt_ckpt_trainer *a, const gpt_ckpt_trainer *b,
                                   char *buf, size_t n) {
  if (a->magic != GPT_CKPT_MAGIC || a->version != GPT_CKPT_VERSION) {
    snprintf(buf, n, "its \"trainer\" record is not the GPT example's (magic %#x, version %u)",
             (unsigned)a->magic, (unsigned)a->version);
    return buf;
  }
#define DIFF(f, what, fmt, cast)                                                             \
  if (a->f != b->f) {                                                                        \
    snprintf(buf, n, "it was trained with " what " " fmt ", this run has " fmt, (cast)a->f,  \
             (cast)b->f);                                                                    \
    return buf;                                                                              \
  }
  DIFF(n_layer, "--layers", "%d", int) DIFF(d_model, "--dmodel", "%d", int)
  DIFF(n_head, "--heads", "%d", int) DIFF(seq, "--seq", "%d", int)
  DIFF(batch, "--batch", "%d", int) DIFF(moe, "--moe", "%d", int)
  DIFF(topk, "--topk", "%d", int) DIFF(dense_layers, "--dense-layers", "%d", int)
  DIFF(aux_seqs, "load-balancing groups (batch / (dp x microbatches)) of", "%d sequences", int)
  DIFF(lr, "--lr", "%g", double) DIFF(aux_coef, "--aux-coef", "%g", double)
  DIFF(seed, "--seed", "%llu", unsigned long long)
  DIFF(data_len, "data (--data) of", "%llu bytes", unsigned long long)
  DIFF(data_hash, "data (--data) of FNV-1a hash", "%#llx", unsigned long long)
#undef DIFF
  if (a->step < 0 || a->adam_t != a->step) {
    snprintf(buf, n, "its step %lld and AdamW step %lld do not match", (long long)a->step,
             (long long)a->adam_t);
    return buf;
  }
  return NULL;
}

const char *gpt_ckpt_check_opts(const gpt_ckpt_opts *o, int steps, char *buf, size_t n) {
  struct stat sb;
  if (o->save_dir && (o->save_at < 1 || o->save_at > steps))
    snprintf(buf, n, "--save-at %d: want a step 1 .. %d (--steps)", o->save_at, steps);
  else if (!o->save_dir && (o->save_at || o->async_save))
    snprintf(buf, n, "--save-at and --async-save need --save DIR");
  else if (o->save_dir && !o->save_dir[0])
    snprintf(buf, n, "--save: empty directory name");
  else if (o->resume_dir && (stat(o->resume_dir, &sb) != 0 || !S_ISDIR(sb.st_mode)))
    snprintf(buf, n, "--resume %s: no such directory", o->resume_dir);
  else
    return NULL;
  return buf;
}

/* ---- one rank ----------------------------------------------------------- */

struct gpt_ck {
  mpg_ckpt *ck;
  gpt_ckpt_trainer rec; /* registered: saved from, loaded into */
  gpt_ckpt_trainer mine;
  /* NCCL: device copies of the host arrays meshpg must read and write in
   * device memory (one block): replicate mode p, m, v of each tensor;
   * shard mode the state arrays (the parameters are the sync's views). */
  float *block, **dp, **dm, **dv, *dst_m, *dst_v;
  size_t state_elems;
};

/* The device copies (NCCL only). */
static mpg_status alloc_mirrors(trainer *t, struct gpt_ck *k) {
  rank_state *rs = &t->rs;
  size_t total = 0;
  if (rs->shard) {
    mpg_sync_stats sst = MPG_SYNC_STATS_INIT;
    CHECK(mpg_sync_get_stats(rs->sync, &sst));
    k->state_elems = sst.shard_elems;
    total = 2 * sst.shard_elems;
  } else {
    for (int id = 0; id < t->nt; id++) total += rs->param_of[id] >= 0 ? 3 * rs->count[id] : 0;
  }
  if (!TALLOC(k->dp, t->nt) || !TALLOC(k->dm, t->nt) || !TALLOC(k->dv, t->nt))
    return MPG_ERR_NOMEM;
  void *b = NULL;
  CHECK(gpt_stage_alloc(&t->stage, total * sizeof(float), &b));
  float *f = k->block = b;
  if (rs->shard) {
    k->dst_m = f, k->dst_v = f + k->state_elems;
    return MPG_OK;
  }
  for (int id = 0; id < t->nt; id++)
    if (rs->param_of[id] >= 0) {
      const size_t n = rs->count[id];
      k->dp[id] = f, k->dm[id] = f + n, k->dv[id] = f + 2 * n;
      f += 3 * n;
    }
  return MPG_OK;
}

/* Every held tensor, its two moments and the trainer's record. */
static mpg_status register_all(trainer *t, struct gpt_ck *k) {
  rank_state *rs = &t->rs;
  gpt_model *m = &t->m;
  for (int id = 0; id < t->nt; id++) {
    if (rs->param_of[id] < 0) continue;
    char name[64], mname[80], vname[80];
    gpt_tensor_name_cfg(t->c, id, name, sizeof name);
    snprintf(mname, sizeof mname, "%s.exp_avg", name);
    snprintf(vname, sizeof vname, "%s.exp_avg_sq", name);
    mpg_tensor_layout L;
    gpt_tensor_layout(t->c, id, &L);
    if (rs->shard) {
      float *sm = t->nccl ? k->dst_m : t->st_m, *sv = t->nccl ? k->dst_v : t->st_v;
      CHECK(mpg_ckpt_add(k->ck, name, MPG_F32, &L, rs->dparam[id], NULL));
      CHECK(mpg_ckpt_add_state(k->ck, mname, MPG_F32, &L, rs->sync, rs->param_of[id], sm));
      CHECK(mpg_ckpt_add_state(k->ck, vname, MPG_F32, &L, rs->sync, rs->param_of[id], sv));
      continue;
    }
    CHECK(mpg_ckpt_add(k->ck, name, MPG_F32, &L, t->nccl ? k->dp[id] : m->p[id], NULL));
    L.kind = MPG_CKPT_STATE;
    CHECK(mpg_ckpt_add(k->ck, mname, MPG_F32, &L, t->nccl ? k->dm[id] : m->m[id], NULL));
    CHECK(mpg_ckpt_add(k->ck, vname, MPG_F32, &L, t->nccl ? k->dv[id] : m->v[id], NULL));
  }
  CHECK(mpg_ckpt_add_bytes(k->ck, "trainer", &k->rec, sizeof k->rec));
  return MPG_OK;
}

/* NCCL: the host arrays into their device copies (to_dev) or back. */
static mpg_status stage_mirrors(trainer *t, struct gpt_ck *k, int to_dev) {
  rank_state *rs = &t->rs;
  gpt_stage *s = &t->stage;
  const size_t fs = sizeof(float);
  if (!t->nccl) return MPG_OK;
  if (rs->shard) {
    float *h[2] = {t->st_m, t->st_v}, *d[2] = {k->dst_m, k->dst_v};
    for (int i = 0; i < 2; i++)
      CHECK(to_dev ? gpt_stage_in(s, d[i], h[i], k->state_elems * fs)
                   : gpt_stage_out(s, h[i], d[i], k->state_elems * fs));
    /* the loaded parameters, from the sync's views to the host arrays */
    for (int id = 0; !to_dev && id < t->nt; id++)
      if (rs->param_of[id] >= 0)
        CHECK(gpt_stage_out(s, rs->param[id], rs->dparam[id], rs->count[id] * fs));
    return MPG_OK;
  }
  for (int id = 0; id < t->nt; id++) {
    if (rs->param_of[id] < 0) continue;
    float *h[3] = {t->m.p[id], t->m.m[id], t->m.v[id]}, *d[3] = {k->dp[id], k->dm[id], k->dv[id]};
    for (int i = 0; i < 3; i++)
      CHECK(to_dev ? gpt_stage_in(s, d[i], h[i], rs->count[id] * fs)
                   : gpt_stage_out(s, h[i], d[i], rs->count[id] * fs));
  }
  return MPG_OK;
}

/* Why a resume failed, into the job (rank 0 of thread ranks; every MPI
 * process has its own job). */
static void resume_error(trainer *t, const char *fmt, const char *a, const char *b) {
  if (t->rank == 0 || t->J->o.mpi)
    snprintf(t->J->ck_error, sizeof t->J->ck_error, fmt, t->J->ck.resume_dir, a, b);
}

/* Load the checkpoint, check its record, continue from its step. */
static mpg_status resume(trainer *t, struct gpt_ck *k) {
  long step = -1;
  char why[320], at[24];
  mpg_status st = mpg_ckpt_load(k->ck, t->J->ck.resume_dir, &step, t->stage.stream);
  if (st != MPG_OK) {
    resume_error(t, "--resume %s: cannot load it: %s: %s", mpg_status_name(st),
                 mpg_last_error());
    return st;
  }
  const char *bad = gpt_ckpt_trainer_check(&k->rec, &k->mine, why, sizeof why);
  if (!bad && step != k->rec.step)
    bad = "the checkpoint's step differs from its trainer record's";
  if (!bad && step >= t->J->steps)
    bad = "it is at or past --steps: nothing left to train";
  if (!bad && t->J->ck.save_dir && t->J->ck.save_at <= step)
    bad = "--save-at is not after its step";
  if (bad) {
    snprintf(at, sizeof at, "%ld", step);
    resume_error(t, "--resume %s (step %s): %s", at, bad);
    return MPG_ERR_INVALID;
  }
  t->start = (int)step;
  t->m.t = (long)k->rec.adam_t;
  if (t->rank == 0) t->J->res->start = t->start;
  k->rec = k->mine;
  return stage_mirrors(t, k, 0);
}

mpg_status gpt_ckpt_begin(trainer *t) {
  const gpt_ckpt_opts *o = &t->J->ck;
  if (!o->save_dir && !o->resume_dir) return MPG_OK;
  struct gpt_ck *k = t->ck = calloc(1, sizeof *k);
  if (!k) return MPG_ERR_NOMEM;
  gpt_ckpt_trainer_init(&k->mine, t->c, t->J->data, t->J->len);
  k->rec = k->mine;
  mpg_ckpt_opts co = MPG_CKPT_OPTS_INIT;
  co.async = o->async_save;
  CHECK(mpg_ckpt_create(t->ctx, &co, &k->ck));
  if (t->nccl) PASS(alloc_mirrors(t, k));
  PASS(register_all(t, k));
  return o->resume_dir ? resume(t, k) : MPG_OK;
}

mpg_status gpt_ckpt_step_done(trainer *t, int done) {
  struct gpt_ck *k = t->ck;
  if (!k || !t->J->ck.save_dir || done != t->J->ck.save_at) return MPG_OK;
  CHECK(mpg_ckpt_wait(k->ck)); /* a save still in flight */
  /* Shard mode: the whole parameters, not only the owned ranges just
   * updated: gather what the optimizer step began to gather (the next
   * forward's waits then return at once). */
  if (t->rs.shard) CHECK(mpg_sync_gather_all(t->rs.sync));
  PASS(stage_mirrors(t, k, 1));
  k->rec.step = done, k->rec.adam_t = t->m.t;
  CHECK(mpg_ckpt_save(k->ck, t->J->ck.save_dir, done, t->stage.stream));
  return MPG_OK;
}

mpg_status gpt_ckpt_end(trainer *t) {
  if (t->ck) CHECK(mpg_ckpt_wait(t->ck->ck));
  return MPG_OK;
}

void gpt_ckpt_free(trainer *t) {
  struct gpt_ck *k = t->ck;
  if (!k) return;
  if (k->ck) mpg_ckpt_destroy(k->ck);
  gpt_stage_release(&t->stage, k->block);
  free(k->dp), free(k->dm), free(k->dv), free(k);
  t->ck = NULL;
}
