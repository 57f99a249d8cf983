/* The GPT model: parameters, forward, manual backward, AdamW, data, and
 * the single-process reference.  See model.h. */
#include "model.h"
#include "moe.h"
#include "stage.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- deterministic hashing (splitmix64 finaliser) ---------------------- */
static uint64_t mix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
static uint64_t hash4(uint64_t seed, uint64_t a, uint64_t b, uint64_t c) {
  return mix(mix(mix(mix(seed) ^ a) ^ b) ^ c);
}
enum { TAG_INIT = 1, TAG_DATA = 2 };

/* ---- tensors ------------------------------------------------------------ */
int gpt_num_tensors(const gpt_config *c) {
  return gpt_moe_base(c) + gpt_moe_num_layers(c) * (1 + 4 * c->moe);
}
int gpt_tensor_id(int layer, int kind) { return GPT_NGLOBAL + L_NPER * layer + kind; }
int gpt_tensor_layer(int id) { return id < GPT_NGLOBAL ? -1 : (id - GPT_NGLOBAL) / L_NPER; }
int gpt_tensor_kind(int id) { return id < GPT_NGLOBAL ? id : (id - GPT_NGLOBAL) % L_NPER; }

void gpt_tensor_name(int id, char *buf, size_t n) {
  static const char *g[] = {"wte", "wpe", "lnf.g", "lnf.b"};
  static const char *l[] = {"ln1.g", "ln1.b", "qkv.w", "qkv.b", "proj.w", "proj.b",
                            "ln2.g", "ln2.b", "fc.w",  "fc.b",  "fc2.w",  "fc2.b"};
  if (id < GPT_NGLOBAL) snprintf(buf, n, "%s", g[id]);
  else snprintf(buf, n, "h%d.%s", gpt_tensor_layer(id), l[gpt_tensor_kind(id)]);
}

void gpt_tensor_name_cfg(const gpt_config *c, int id, char *buf, size_t n) {
  static const char *k[] = {"router.w", "fc.w", "fc.b", "fc2.w", "fc2.b"};
  int layer, e, kind;
  if (!gpt_moe_decode(c, id, &layer, &e, &kind)) gpt_tensor_name(id, buf, n);
  else if (kind == M_ROUTER) snprintf(buf, n, "h%d.%s", layer, k[kind]);
  else snprintf(buf, n, "h%d.e%d.%s", layer, e, k[kind]);
}

/* The dense kind that gives a tensor its shape, split and init: an
 * expert's tensors are shaped as the dense MLP's (L_FCW .. L_FC2B); the
 * router is K_ROUTER; -1 for the global tensors. */
enum { K_ROUTER = L_NPER };
static int shape_kind(const gpt_config *c, int id) {
  static const int of_moe[] = {K_ROUTER, L_FCW, L_FCB, L_FC2W, L_FC2B};
  int layer, e, kind;
  if (id < GPT_NGLOBAL) return -1;
  if (gpt_moe_decode(c, id, &layer, &e, &kind)) return of_moe[kind];
  return gpt_tensor_kind(id);
}

int gpt_tensor_split(const gpt_config *c, int id) {
  switch (shape_kind(c, id)) {
  case L_QKVW: case L_QKVB: case L_PROJW: return GPT_SPLIT_TP;
  case L_FCW: case L_FCB: case L_FC2W:
    return gpt_tensor_expert(c, id) ? GPT_SPLIT_ETP : GPT_SPLIT_TP;
  default: return GPT_REPLICATED;
  }
}

int gpt_tensor_decays(const gpt_config *c, int id) {
  if (id < GPT_NGLOBAL) return id == GPT_WTE || id == GPT_WPE;
  switch (shape_kind(c, id)) {
  case L_QKVW: case L_PROJW: case L_FCW: case L_FC2W: case K_ROUTER: return 1;
  default: return 0;
  }
}

size_t gpt_tensor_count(const gpt_config *c, int id, int parts) {
  size_t C = (size_t)c->d_model, Cl = C / (size_t)parts;
  if (id < GPT_NGLOBAL) {
    if (id == GPT_WTE) return GPT_VOCAB * C;
    if (id == GPT_WPE) return (size_t)c->seq * C;
    return C;
  }
  if (gpt_tensor_split(c, id) == GPT_REPLICATED) Cl = C;
  switch (shape_kind(c, id)) {
  case L_QKVW: return C * 3 * Cl;
  case L_QKVB: return 3 * Cl;
  case L_PROJW: return Cl * C;
  case L_FCW: return C * 4 * Cl;
  case L_FCB: return 4 * Cl;
  case L_FC2W: return 4 * Cl * C;
  case K_ROUTER: return C * (size_t)c->moe;
  default: return C;
  }
}

/* Column-parallel QKV: rank r holds the q, k and v columns of its heads
 * (C/tp columns of each); column-parallel fc: a contiguous 4C/tp block of
 * columns; row-parallel proj and fc2: a contiguous block of input rows.
 * An expert's fc / fc2 the same over etp. */
size_t gpt_shard_to_full(const gpt_config *c, int id, int parts, int r, size_t i) {
  size_t C = (size_t)c->d_model, Cl = C / (size_t)parts;
  if (gpt_tensor_split(c, id) == GPT_REPLICATED) return i;
  switch (shape_kind(c, id)) {
  case L_QKVW: {
    size_t row = i / (3 * Cl), j = i % (3 * Cl);
    return row * 3 * C + (j / Cl) * C + (size_t)r * Cl + j % Cl;
  }
  case L_QKVB: return (i / Cl) * C + (size_t)r * Cl + i % Cl;
  case L_PROJW: return (size_t)r * Cl * C + i;
  case L_FCW: {
    size_t row = i / (4 * Cl), j = i % (4 * Cl);
    return row * 4 * C + (size_t)r * 4 * Cl + j;
  }
  case L_FCB: return (size_t)r * 4 * Cl + i;
  case L_FC2W: return (size_t)r * 4 * Cl * C + i;
  default: return i;
  }
}

float gpt_init_value(const gpt_config *c, int id, size_t full_index) {
  int k = shape_kind(c, id);
  double std;
  if (id < GPT_NGLOBAL) {
    if (id == GPT_LNFG) return 1.0f;
    if (id == GPT_LNFB) return 0.0f;
    std = id == GPT_WTE ? 0.02 : 0.01;
  } else {
    switch (k) {
    case L_LN1G: case L_LN2G: return 1.0f;
    case L_QKVW: case L_FCW: case K_ROUTER: std = 0.02; break;
    case L_PROJW: case L_FC2W: std = 0.02 / sqrt(2.0 * c->n_layer); break;
    default: return 0.0f; /* biases */
    }
  }
  uint64_t h = hash4(c->seed, TAG_INIT, (uint64_t)id, (uint64_t)full_index);
  double u = (double)(h >> 40) * (1.0 / 8388608.0) - 1.0; /* [-1, 1) */
  return (float)(u * std * sqrt(3.0));
}

const char *gpt_config_check(const gpt_config *c, int tp, int pp, int dp, int cp, int sp) {
  if (c->n_layer < 1 || c->d_model < 1 || c->n_head < 1 || c->seq < 1 || c->batch < 1 ||
      c->micro < 1)
    return "sizes must be positive";
  if (c->d_model % c->n_head) return "dmodel must be a multiple of heads";
  if (c->n_head % tp) return "heads must be a multiple of tp";
  if (c->n_layer % pp) return "layers must be a multiple of pp";
  if (c->batch % (dp * c->micro)) return "batch must be a multiple of dp * microbatches";
  if (c->seq % cp) return "seq must be a multiple of cp";
  if (sp && (c->seq / cp) % tp) return "with --sp, seq / cp must be a multiple of tp";
  if (c->moe < 0) return "experts must be >= 0";
  if (c->moe > 0) {
    if (c->topk < 1 || c->topk > c->moe) return "topk must be 1 .. experts";
    if (c->dense_layers < 0 || c->dense_layers >= c->n_layer)
      return "dense layers must be 0 .. layers - 1 (at least one MoE layer)";
    if (!(c->aux_coef >= 0.0f)) return "the aux loss coefficient must be >= 0";
    if (c->aux_seqs < 1 || c->batch % c->aux_seqs)
      return "aux_seqs (sequences per load-balancing group) must divide the batch";
  }
  return NULL;
}

/* ---- data --------------------------------------------------------------- */
void gpt_sequence(const gpt_config *c, const uint8_t *data, size_t len, long step,
                  long g, uint8_t *tok) {
  size_t span = len - (size_t)c->seq - 1; /* len > seq + 1 checked by callers */
  size_t off = (size_t)(hash4(c->seed, TAG_DATA, (uint64_t)step, (uint64_t)g) % (span + 1));
  memcpy(tok, data + off, (size_t)c->seq + 1);
}

double gpt_unigram_entropy(const uint8_t *data, size_t len) {
  double cnt[256] = {0}, h = 0.0;
  for (size_t i = 0; i < len; i++) cnt[data[i]] += 1.0;
  for (int i = 0; i < 256; i++)
    if (cnt[i] > 0) h -= cnt[i] / (double)len * log(cnt[i] / (double)len);
  return h;
}

/* ---- activations -------------------------------------------------------- */
typedef struct layer_act {
  float *h1, *h1f, *mu1, *rs1, *qkv, *kv, *att, *y, *x2, *h2, *h2f, *mu2, *rs2, *pre, *gel;
  gpt_moe_act *moe; /* an MoE layer's (then no h2f, pre, gel) */
} layer_act;

struct gpt_act {
  uint8_t *tok, *tgt; /* N rows */
  float loss_scale;
  float **xs;         /* nl + 1 buffers of R x C: block inputs, last output */
  layer_act *L;
  float *hf, *muf, *rsf, *prob;
};

static int use_sp(const gpt_model *m) { return m->comm.sp && m->comm.tp_size > 1; }

static float *falloc(size_t n) { return calloc(n ? n : 1, sizeof(float)); }

static int act_alloc(gpt_model *m, gpt_act *a) {
  size_t C = (size_t)m->cfg.d_model, N = (size_t)m->rows, R = (size_t)m->rows_local;
  size_t Cl = C / (size_t)m->comm.tp_size, T = (size_t)m->cfg.seq, Tl = (size_t)m->tl;
  size_t Hl = (size_t)m->cfg.n_head / (size_t)m->comm.tp_size;
  int nl = m->layer_hi - m->layer_lo, ok = 1, sp = use_sp(m);
  a->tok = malloc(N);
  a->tgt = malloc(N);
  a->xs = calloc((size_t)nl + 1, sizeof(float *));
  a->L = calloc((size_t)nl + 1, sizeof(layer_act));
  ok = a->tok && a->tgt && a->xs && a->L;
  if (!ok) return -1;
  for (int i = 0; i <= nl; i++) ok = ok && (a->xs[i] = falloc(R * C));
  for (int i = 0; i < nl && ok; i++) {
    layer_act *l = &a->L[i];
    l->h1 = falloc(R * C); l->mu1 = falloc(R); l->rs1 = falloc(R);
    l->h1f = sp ? falloc(N * C) : l->h1;
    l->qkv = falloc(N * 3 * Cl);
    l->kv = falloc(T * (size_t)m->nb * 2 * Cl);
    l->att = falloc((size_t)m->nb * Hl * Tl * T);
    l->y = falloc(N * Cl);
    l->x2 = falloc(R * C);
    l->h2 = falloc(R * C); l->mu2 = falloc(R); l->rs2 = falloc(R);
    ok = l->h1 && l->mu1 && l->rs1 && l->h1f && l->qkv && l->kv && l->att && l->y && l->x2 &&
         l->h2 && l->mu2 && l->rs2;
    if (gpt_moe_layer(&m->cfg, m->layer_lo + i)) {
      l->h2f = l->h2; /* the MoE layer routes this rank's own rows */
      ok = ok && (l->moe = gpt__moe_act_new());
    } else {
      l->h2f = sp ? falloc(N * C) : l->h2;
      l->pre = falloc(N * 4 * Cl);
      l->gel = falloc(N * 4 * Cl);
      ok = ok && l->h2f && l->pre && l->gel;
    }
  }
  if (m->last) {
    a->hf = falloc(R * C); a->muf = falloc(R); a->rsf = falloc(R);
    a->prob = falloc(R * GPT_VOCAB);
    ok = ok && a->hf && a->muf && a->rsf && a->prob;
  }
  return ok ? 0 : -1;
}

static void act_free(gpt_model *m, gpt_act *a) {
  int nl = m->layer_hi - m->layer_lo;
  if (a->xs)
    for (int i = 0; i <= nl; i++) free(a->xs[i]);
  if (a->L)
    for (int i = 0; i < nl; i++) {
      layer_act *l = &a->L[i];
      if (l->h1f != l->h1) free(l->h1f);
      if (l->h2f != l->h2) free(l->h2f);
      free(l->h1); free(l->mu1); free(l->rs1); free(l->qkv); free(l->kv); free(l->att); free(l->y);
      free(l->x2); free(l->h2); free(l->mu2); free(l->rs2); free(l->pre); free(l->gel);
      gpt__moe_act_free(l->moe);
    }
  free(a->xs); free(a->L); free(a->tok); free(a->tgt);
  free(a->hf); free(a->muf); free(a->rsf); free(a->prob);
}

int gpt_tensor_held(const gpt_config *c, int id, int lo, int hi, int first, int last, int ep,
                    int ep_rank) {
  int l, e, kind;
  if (gpt_moe_decode(c, id, &l, &e, &kind)) {
    if (l < lo || l >= hi) return 0;
    return kind == M_ROUTER || e / (c->moe / ep) == ep_rank;
  }
  l = gpt_tensor_layer(id);
  if (l >= 0) {
    const int k = gpt_tensor_kind(id);
    if (gpt_moe_layer(c, l) && (k == L_FCW || k == L_FCB || k == L_FC2W || k == L_FC2B))
      return 0; /* replaced by the experts */
    return l >= lo && l < hi;
  }
  return id == GPT_WTE ? (first || last) : id == GPT_WPE ? first : last;
}

int gpt_model_init(gpt_model *m, const gpt_config *c, const gpt_comm *comm,
                   int layer_lo, int layer_hi, int first, int last, int nb,
                   int nslots, float **grads) {
  return gpt_model_init_views(m, c, comm, layer_lo, layer_hi, first, last, nb, nslots,
                              grads, NULL);
}

int gpt_model_init_views(gpt_model *m, const gpt_config *c, const gpt_comm *comm,
                         int layer_lo, int layer_hi, int first, int last, int nb,
                         int nslots, float **grads, float **params) {
  memset(m, 0, sizeof *m);
  m->cfg = *c;
  if (comm) m->comm = *comm;
  if (!m->comm.tp || m->comm.tp_size < 1) m->comm.tp_size = 1, m->comm.tp_rank = 0;
  if (!m->comm.cp || m->comm.cp_size < 1) m->comm.cp_size = 1, m->comm.cp_rank = 0;
  if (!m->comm.ep || m->comm.ep_size < 1) m->comm.ep_size = 1, m->comm.ep_rank = 0;
  if (!m->comm.etp || m->comm.etp_size < 1) m->comm.etp_size = 1, m->comm.etp_rank = 0;
  m->layer_lo = layer_lo, m->layer_hi = layer_hi, m->first = first, m->last = last;
  m->nt = gpt_num_tensors(c);
  m->nb = nb, m->nslots = nslots;
  m->tl = c->seq / m->comm.cp_size;
  m->t0 = m->comm.cp_rank * m->tl;
  m->rows = m->tl * nb;
  m->rows_local = use_sp(m) ? m->rows / m->comm.tp_size : m->rows;
  m->p = calloc((size_t)m->nt, sizeof(float *));
  m->g = calloc((size_t)m->nt, sizeof(float *));
  m->m = calloc((size_t)m->nt, sizeof(float *));
  m->v = calloc((size_t)m->nt, sizeof(float *));
  m->n = calloc((size_t)m->nt, sizeof(size_t));
  m->act = calloc((size_t)nslots, sizeof(gpt_act));
  m->own_grads = grads == NULL;
  m->own_params = params == NULL;
  if (c->moe > 0) {
    m->moe_tokens = calloc((size_t)gpt_moe_num_layers(c) * (size_t)c->moe, sizeof(double));
    if (!m->moe_tokens) return -1;
  }
  if (!m->p || !m->g || !m->m || !m->v || !m->n || !m->act) return -1;
  const int tp = m->comm.tp_size;
  for (int id = 0; id < m->nt; id++) {
    if (!gpt_tensor_held(c, id, layer_lo, layer_hi, first, last, m->comm.ep_size,
                         m->comm.ep_rank))
      continue;
    const int split = gpt_tensor_split(c, id);
    const int parts = split == GPT_SPLIT_TP ? tp : split == GPT_SPLIT_ETP ? m->comm.etp_size : 1;
    const int r = split == GPT_SPLIT_TP ? m->comm.tp_rank
                  : split == GPT_SPLIT_ETP ? m->comm.etp_rank : 0;
    size_t n = gpt_tensor_count(c, id, parts);
    m->n[id] = n;
    if (params) {
      m->p[id] = params[id];
    } else {
      m->p[id] = falloc(n);
      m->m[id] = falloc(n);
      m->v[id] = falloc(n);
      if (!m->m[id] || !m->v[id]) return -1;
    }
    m->g[id] = grads ? grads[id] : falloc(n);
    if (!m->p[id] || !m->g[id]) return -1;
    for (size_t i = 0; i < n; i++)
      m->p[id][i] = gpt_init_value(c, id, gpt_shard_to_full(c, id, parts, r, i));
  }
  size_t C = (size_t)c->d_model, N = (size_t)m->rows, R = (size_t)m->rows_local;
  size_t Cl = C / (size_t)tp;
  size_t big = N * (4 * Cl > C ? 4 * Cl : C);
  if (R * GPT_VOCAB > big) big = R * GPT_VOCAB;
  m->s_a = falloc(big); m->s_b = falloc(big); m->s_c = falloc(big);
  m->s_d = falloc(big); m->s_e = falloc(big);
  m->s_kv = falloc((size_t)c->seq * (size_t)nb * 2 * Cl + (size_t)c->seq);
  m->s_kvl = falloc(N * 2 * Cl);
  if (!m->s_a || !m->s_b || !m->s_c || !m->s_d || !m->s_e || !m->s_kv || !m->s_kvl)
    return -1;
  for (int s = 0; s < nslots; s++)
    if (act_alloc(m, &m->act[s])) return -1;
  return 0;
}

void gpt_model_free(gpt_model *m) {
  if (m->act)
    for (int s = 0; s < m->nslots; s++) act_free(m, &m->act[s]);
  for (int id = 0; m->p && id < m->nt; id++) {
    if (m->own_params) free(m->p[id]);
    free(m->m[id]); free(m->v[id]);
    if (m->own_grads) free(m->g[id]);
  }
  free(m->p); free(m->g); free(m->m); free(m->v); free(m->n); free(m->act);
  free(m->s_a); free(m->s_b); free(m->s_c); free(m->s_d); free(m->s_e);
  free(m->s_kv); free(m->s_kvl);
  free(m->moe_tokens);
  gpt__moe_ws_free(m);
  memset(m, 0, sizeof *m);
}

void gpt_model_zero_grads(gpt_model *m) {
  for (int id = 0; id < m->nt; id++)
    if (m->g[id]) memset(m->g[id], 0, m->n[id] * sizeof(float));
}

void gpt_model_zero_stats(gpt_model *m) {
  m->aux_sum = 0.0;
  if (m->moe_tokens)
    memset(m->moe_tokens, 0,
           (size_t)gpt_moe_num_layers(&m->cfg) * (size_t)m->cfg.moe * sizeof(double));
}

/* ---- tensor-parallel communication -------------------------------------- */
/* Megatron's conjugate pair.  f (before a column-parallel layer): forward
 * identity / all-gather (sp), backward all-reduce / reduce-scatter (sp).
 * g (after a row-parallel layer): forward all-reduce / reduce-scatter (sp),
 * backward identity / all-gather (sp). */
void gpt__note(gpt_model *m, mpg_status st) {
  if (st != MPG_OK && m->comm.err == MPG_OK) {
    m->comm.err = st;
    fprintf(stderr, "gpt: tp/cp collective failed: %s\n", mpg_last_error());
  }
}
/* in: R x C -> out: N x C (sp only). */
static void comm_gather(gpt_model *m, const float *in, float *out) {
  gpt__note(m, gpt_stage_all_gather(m->comm.stage, m->comm.tp, in, out,
                               (size_t)m->rows_local * m->cfg.d_model, MPG_F32));
}
/* in: N x C partial sums -> out: R x C (sp), or in place over N x C. */
static void comm_reduce(gpt_model *m, float *in, float *out) {
  size_t C = (size_t)m->cfg.d_model;
  if (m->comm.tp_size == 1) {
    if (out != in) memcpy(out, in, (size_t)m->rows * C * sizeof(float));
  } else if (use_sp(m)) {
    gpt__note(m, gpt_stage_reduce_scatter(m->comm.stage, m->comm.tp, in, out,
                                     (size_t)m->rows_local * C, MPG_F32, MPG_OP_SUM));
  } else {
    gpt__note(m, gpt_stage_all_reduce(m->comm.stage, m->comm.tp, in, in, (size_t)m->rows * C,
                                 MPG_F32, MPG_OP_SUM));
    if (out != in) memcpy(out, in, (size_t)m->rows * C * sizeof(float));
  }
}

/* ---- kernels ------------------------------------------------------------ */
/* out[N][O] = in[N][I] W[I][O] (+ b) */
void gpt__mm_fwd(float *out, const float *in, const float *W, const float *b, int N, int I,
                 int O) {
  for (int n = 0; n < N; n++) {
    float *o = out + (size_t)n * O;
    for (int j = 0; j < O; j++) o[j] = b ? b[j] : 0.0f;
    for (int i = 0; i < I; i++) {
      float x = in[(size_t)n * I + i];
      const float *w = W + (size_t)i * O;
      for (int j = 0; j < O; j++) o[j] += x * w[j];
    }
  }
}
/* dW += in^T dout, db += sum dout, din = dout W^T (din may be NULL) */
void gpt__mm_bwd(float *din, float *dW, float *db, const float *in, const float *W,
                 const float *dout, int N, int I, int O) {
  for (int n = 0; n < N; n++) {
    const float *d = dout + (size_t)n * O;
    if (db)
      for (int j = 0; j < O; j++) db[j] += d[j];
    for (int i = 0; i < I; i++) {
      float x = in[(size_t)n * I + i], s = 0.0f;
      float *dw = dW + (size_t)i * O;
      const float *w = W + (size_t)i * O;
      for (int j = 0; j < O; j++) {
        dw[j] += x * d[j];
        s += d[j] * w[j];
      }
      if (din) din[(size_t)n * I + i] = s;
    }
  }
}

static void ln_fwd(float *y, float *mu, float *rs, const float *x, const float *g,
                   const float *b, int R, int C) {
  for (int r = 0; r < R; r++) {
    const float *xr = x + (size_t)r * C;
    float mean = 0.0f, var = 0.0f;
    for (int i = 0; i < C; i++) mean += xr[i];
    mean /= (float)C;
    for (int i = 0; i < C; i++) var += (xr[i] - mean) * (xr[i] - mean);
    var /= (float)C;
    float s = 1.0f / sqrtf(var + 1e-5f);
    mu[r] = mean, rs[r] = s;
    for (int i = 0; i < C; i++) y[(size_t)r * C + i] = (xr[i] - mean) * s * g[i] + b[i];
  }
}
/* dx += LN backward of dy; dg, db accumulated. */
static void ln_bwd(float *dx, float *dg, float *db, const float *x, const float *mu,
                   const float *rs, const float *g, const float *dy, int R, int C) {
  for (int r = 0; r < R; r++) {
    const float *xr = x + (size_t)r * C, *d = dy + (size_t)r * C;
    float a = 0.0f, bsum = 0.0f;
    for (int i = 0; i < C; i++) {
      float xh = (xr[i] - mu[r]) * rs[r], dxh = d[i] * g[i];
      a += dxh;
      bsum += dxh * xh;
      dg[i] += d[i] * xh;
      db[i] += d[i];
    }
    a /= (float)C, bsum /= (float)C;
    for (int i = 0; i < C; i++) {
      float xh = (xr[i] - mu[r]) * rs[r];
      dx[(size_t)r * C + i] += rs[r] * (d[i] * g[i] - a - xh * bsum);
    }
  }
}

#define GELU_K 0.7978845608028654f /* sqrt(2 / pi) */
float gpt__gelu(float x) {
  return 0.5f * x * (1.0f + tanhf(GELU_K * (x + 0.044715f * x * x * x)));
}
float gpt__gelu_grad(float x) {
  float th = tanhf(GELU_K * (x + 0.044715f * x * x * x));
  return 0.5f * (1.0f + th) +
         0.5f * x * (1.0f - th * th) * GELU_K * (1.0f + 3.0f * 0.044715f * x * x);
}

/* Causal attention over this rank's Hl heads and its tl query positions
 * (global positions t0 ..).  qkv: N x 3Cl (q | k | v) of its rows; kv:
 * seq * nb x 2Cl (k | v) of every position of the sequences (gathered over
 * cp), row u * nb + b for global position u; y: N x Cl; att: nb x Hl x tl
 * x seq probabilities (masked by global position). */
static void attn_fwd(const gpt_model *m, const float *qkv, const float *kv, float *att,
                     float *y) {
  const int T = m->cfg.seq, Tl = m->tl, t0 = m->t0, nb = m->nb, tp = m->comm.tp_size;
  const int Cl = m->cfg.d_model / tp, Hl = m->cfg.n_head / tp, hd = m->cfg.d_model / m->cfg.n_head;
  const float sc = 1.0f / sqrtf((float)hd);
  for (int b = 0; b < nb; b++)
    for (int h = 0; h < Hl; h++)
      for (int tl = 0; tl < Tl; tl++) {
        const int t = t0 + tl;
        const float *q = qkv + (size_t)(tl * nb + b) * 3 * Cl + h * hd;
        float *p = att + (((size_t)b * Hl + h) * Tl + tl) * T;
        float mx = -INFINITY, sum = 0.0f;
        for (int u = 0; u <= t; u++) {
          const float *k = kv + (size_t)(u * nb + b) * 2 * Cl + h * hd;
          float s = 0.0f;
          for (int i = 0; i < hd; i++) s += q[i] * k[i];
          p[u] = s * sc;
          if (p[u] > mx) mx = p[u];
        }
        for (int u = 0; u <= t; u++) sum += (p[u] = expf(p[u] - mx));
        for (int u = 0; u <= t; u++) p[u] /= sum;
        for (int u = t + 1; u < T; u++) p[u] = 0.0f;
        float *o = y + (size_t)(tl * nb + b) * Cl + h * hd;
        for (int i = 0; i < hd; i++) o[i] = 0.0f;
        for (int u = 0; u <= t; u++) {
          const float *v = kv + (size_t)(u * nb + b) * 2 * Cl + Cl + h * hd;
          for (int i = 0; i < hd; i++) o[i] += p[u] * v[i];
        }
      }
}

/* Backward of attn_fwd for dy (N x Cl): the q part of dqkv (N x 3Cl, the
 * k and v parts left zero) and dkv (seq * nb x 2Cl, the gradient of the
 * gathered K and V: this rank's queries' share). */
static void attn_bwd(const gpt_model *m, const float *qkv, const float *kv,
                     const float *att, const float *dy, float *dqkv, float *dkv,
                     float *tmp) {
  const int T = m->cfg.seq, Tl = m->tl, t0 = m->t0, nb = m->nb, tp = m->comm.tp_size;
  const int Cl = m->cfg.d_model / tp, Hl = m->cfg.n_head / tp, hd = m->cfg.d_model / m->cfg.n_head;
  const float sc = 1.0f / sqrtf((float)hd);
  memset(dqkv, 0, (size_t)m->rows * 3 * Cl * sizeof(float));
  memset(dkv, 0, (size_t)T * nb * 2 * Cl * sizeof(float));
  for (int b = 0; b < nb; b++)
    for (int h = 0; h < Hl; h++)
      for (int tl = 0; tl < Tl; tl++) {
        const int t = t0 + tl;
        const float *p = att + (((size_t)b * Hl + h) * Tl + tl) * T;
        const float *d = dy + (size_t)(tl * nb + b) * Cl + h * hd;
        const float *q = qkv + (size_t)(tl * nb + b) * 3 * Cl + h * hd;
        float *dq = dqkv + (size_t)(tl * nb + b) * 3 * Cl + h * hd;
        float dot = 0.0f;
        for (int u = 0; u <= t; u++) {
          const float *v = kv + (size_t)(u * nb + b) * 2 * Cl + Cl + h * hd;
          float *dv = dkv + (size_t)(u * nb + b) * 2 * Cl + Cl + h * hd;
          float s = 0.0f;
          for (int i = 0; i < hd; i++) {
            s += d[i] * v[i];
            dv[i] += p[u] * d[i];
          }
          tmp[u] = s;
          dot += p[u] * s;
        }
        for (int u = 0; u <= t; u++) {
          float ds = p[u] * (tmp[u] - dot) * sc;
          const float *k = kv + (size_t)(u * nb + b) * 2 * Cl + h * hd;
          float *dk = dkv + (size_t)(u * nb + b) * 2 * Cl + h * hd;
          for (int i = 0; i < hd; i++) {
            dq[i] += ds * k[i];
            dk[i] += ds * q[i];
          }
        }
      }
}

/* K | V of this rank's rows (N x 3Cl -> N x 2Cl) gathered over cp into
 * kv (seq * nb x 2Cl: contiguous chunks, so cp rank r's rows land at rows
 * r * N.., which are exactly the global rows t * nb + b). */
static void kv_gather(gpt_model *m, const float *qkv, float *kv) {
  const size_t N = (size_t)m->rows, Cl = (size_t)m->cfg.d_model / (size_t)m->comm.tp_size;
  float *loc = m->comm.cp_size > 1 ? m->s_kvl : kv;
  for (size_t r = 0; r < N; r++)
    memcpy(loc + r * 2 * Cl, qkv + r * 3 * Cl + Cl, 2 * Cl * sizeof(float));
  if (m->comm.cp_size > 1)
    gpt__note(m, gpt_stage_all_gather(m->comm.stage, m->comm.cp, loc, kv, N * 2 * Cl, MPG_F32));
}
/* The gradient of the gathered K | V (seq * nb x 2Cl) summed over cp and
 * scattered back to each rank's rows, into the k and v parts of dqkv. */
static void kv_scatter(gpt_model *m, const float *dkv, float *dqkv) {
  const size_t N = (size_t)m->rows, Cl = (size_t)m->cfg.d_model / (size_t)m->comm.tp_size;
  const float *loc = dkv;
  if (m->comm.cp_size > 1) {
    gpt__note(m, gpt_stage_reduce_scatter(m->comm.stage, m->comm.cp, dkv, m->s_kvl, N * 2 * Cl,
                                     MPG_F32, MPG_OP_SUM));
    loc = m->s_kvl;
  }
  for (size_t r = 0; r < N; r++)
    memcpy(dqkv + r * 3 * Cl + Cl, loc + r * 2 * Cl, 2 * Cl * sizeof(float));
}

static void add_bias(float *x, const float *b, const float *res, int R, int C) {
  for (int r = 0; r < R; r++)
    for (int i = 0; i < C; i++) x[(size_t)r * C + i] += b[i] + res[(size_t)r * C + i];
}
static void col_sum(float *db, const float *d, int R, int C) {
  for (int r = 0; r < R; r++)
    for (int i = 0; i < C; i++) db[i] += d[(size_t)r * C + i];
}

/* ---- forward / backward -------------------------------------------------- */
void gpt__use(gpt_model *m, int id) {
  if (m->use) m->use(m->use_arg, id);
}

static void block_fwd(gpt_model *m, layer_act *a, int layer, const float *X, float *Y) {
  const int C = m->cfg.d_model, N = m->rows, R = m->rows_local;
  const int Cl = C / m->comm.tp_size, sp = use_sp(m);
  float *const *P = m->p;
#define W(k) P[gpt_tensor_id(layer, k)]
  for (int k = 0; k < L_NPER; k++) gpt__use(m, gpt_tensor_id(layer, k));
  ln_fwd(a->h1, a->mu1, a->rs1, X, W(L_LN1G), W(L_LN1B), R, C);
  if (sp) comm_gather(m, a->h1, a->h1f);
  gpt__mm_fwd(a->qkv, a->h1f, W(L_QKVW), W(L_QKVB), N, C, 3 * Cl);
  kv_gather(m, a->qkv, a->kv);
  attn_fwd(m, a->qkv, a->kv, a->att, a->y);
  gpt__mm_fwd(m->s_a, a->y, W(L_PROJW), NULL, N, Cl, C);
  comm_reduce(m, m->s_a, a->x2);
  add_bias(a->x2, W(L_PROJB), X, R, C);
  ln_fwd(a->h2, a->mu2, a->rs2, a->x2, W(L_LN2G), W(L_LN2B), R, C);
  if (a->moe) {
    gpt__moe_fwd(m, a->moe, layer, a->h2, a->x2, Y);
    return;
  }
  if (sp) comm_gather(m, a->h2, a->h2f);
  gpt__mm_fwd(a->pre, a->h2f, W(L_FCW), W(L_FCB), N, C, 4 * Cl);
  for (size_t i = 0; i < (size_t)N * 4 * Cl; i++) a->gel[i] = gpt__gelu(a->pre[i]);
  gpt__mm_fwd(m->s_a, a->gel, W(L_FC2W), NULL, N, 4 * Cl, C);
  comm_reduce(m, m->s_a, Y);
  add_bias(Y, W(L_FC2B), a->x2, R, C);
#undef W
}

void gpt__ready(gpt_model *m, int id) {
  if (m->ready) m->ready(m->ready_arg, id);
}

/* dY (R x C) -> dX (R x C); dY and dX distinct. */
static void block_bwd(gpt_model *m, layer_act *a, int layer, const float *X,
                      const float *dY, float *dX, float loss_scale) {
  const int C = m->cfg.d_model, N = m->rows, R = m->rows_local;
  const int Cl = C / m->comm.tp_size, sp = use_sp(m);
  float *const *P = m->p, *const *G = m->g;
#define W(k) P[gpt_tensor_id(layer, k)]
#define D(k) G[gpt_tensor_id(layer, k)]
  /* MLP (or the MoE layer: its rows are local, no tp reduction) */
  if (a->moe) {
    gpt__moe_bwd(m, a->moe, layer, a->h2, dY, m->s_d, loss_scale);
  } else {
    col_sum(D(L_FC2B), dY, R, C);
    const float *dYf = dY;
    if (sp) comm_gather(m, dY, m->s_a), dYf = m->s_a;
    gpt__mm_bwd(m->s_b, D(L_FC2W), NULL, a->gel, W(L_FC2W), dYf, N, 4 * Cl, C);
    for (size_t i = 0; i < (size_t)N * 4 * Cl; i++) m->s_b[i] *= gpt__gelu_grad(a->pre[i]);
    gpt__mm_bwd(m->s_c, D(L_FCW), D(L_FCB), a->h2f, W(L_FCW), m->s_b, N, C, 4 * Cl);
    comm_reduce(m, m->s_c, m->s_d); /* f backward */
    gpt__ready(m, gpt_tensor_id(layer, L_FC2B)); gpt__ready(m, gpt_tensor_id(layer, L_FC2W));
    gpt__ready(m, gpt_tensor_id(layer, L_FCB)); gpt__ready(m, gpt_tensor_id(layer, L_FCW));
  }
  float *dx2 = m->s_e;
  memcpy(dx2, dY, (size_t)R * C * sizeof(float));
  ln_bwd(dx2, D(L_LN2G), D(L_LN2B), a->x2, a->mu2, a->rs2, W(L_LN2G), m->s_d, R, C);
  gpt__ready(m, gpt_tensor_id(layer, L_LN2G)); gpt__ready(m, gpt_tensor_id(layer, L_LN2B));
  /* attention */
  col_sum(D(L_PROJB), dx2, R, C);
  const float *dx2f = dx2;
  if (sp) comm_gather(m, dx2, m->s_a), dx2f = m->s_a;
  gpt__mm_bwd(m->s_b, D(L_PROJW), NULL, a->y, W(L_PROJW), dx2f, N, Cl, C);
  attn_bwd(m, a->qkv, a->kv, a->att, m->s_b, m->s_c, m->s_kv,
           m->s_kv + (size_t)m->cfg.seq * m->nb * 2 * Cl);
  kv_scatter(m, m->s_kv, m->s_c);
  gpt__mm_bwd(m->s_a, D(L_QKVW), D(L_QKVB), a->h1f, W(L_QKVW), m->s_c, N, C, 3 * Cl);
  comm_reduce(m, m->s_a, m->s_d); /* f backward */
  gpt__ready(m, gpt_tensor_id(layer, L_PROJB)); gpt__ready(m, gpt_tensor_id(layer, L_PROJW));
  gpt__ready(m, gpt_tensor_id(layer, L_QKVB)); gpt__ready(m, gpt_tensor_id(layer, L_QKVW));
  memcpy(dX, dx2, (size_t)R * C * sizeof(float));
  ln_bwd(dX, D(L_LN1G), D(L_LN1B), X, a->mu1, a->rs1, W(L_LN1G), m->s_d, R, C);
  gpt__ready(m, gpt_tensor_id(layer, L_LN1G)); gpt__ready(m, gpt_tensor_id(layer, L_LN1B));
#undef W
#undef D
}

/* First row of this rank's rows (sequence parallel: its chunk). */
static int row0(const gpt_model *m) { return use_sp(m) ? m->comm.tp_rank * m->rows_local : 0; }

double gpt_forward(gpt_model *m, int slot, const uint8_t *seqs, const float *in,
                   float *out, float loss_scale) {
  gpt_act *a = &m->act[slot];
  const int C = m->cfg.d_model, T = m->cfg.seq, nb = m->nb, R = m->rows_local, r0 = row0(m);
  const int nl = m->layer_hi - m->layer_lo, Tl = m->tl, t0 = m->t0;
  for (int b = 0; b < nb; b++)
    for (int t = 0; t < Tl; t++) {
      a->tok[t * nb + b] = seqs[(size_t)b * (T + 1) + t0 + t];
      a->tgt[t * nb + b] = seqs[(size_t)b * (T + 1) + t0 + t + 1];
    }
  a->loss_scale = loss_scale;
  if (m->first) {
    gpt__use(m, GPT_WTE);
    gpt__use(m, GPT_WPE);
    for (int r = 0; r < R; r++) {
      int row = r0 + r, t = t0 + row / nb;
      const float *e = m->p[GPT_WTE] + (size_t)a->tok[row] * C;
      const float *pe = m->p[GPT_WPE] + (size_t)t * C;
      for (int i = 0; i < C; i++) a->xs[0][(size_t)r * C + i] = e[i] + pe[i];
    }
  } else {
    memcpy(a->xs[0], in, (size_t)R * C * sizeof(float));
  }
  for (int i = 0; i < nl; i++) block_fwd(m, &a->L[i], m->layer_lo + i, a->xs[i], a->xs[i + 1]);
  if (!m->last) {
    memcpy(out, a->xs[nl], (size_t)R * C * sizeof(float));
    return 0.0;
  }
  /* LM head, tied to wte: logits = h . wte^T.  Replicated over tp (each tp
   * rank computes it for its rows: all of them, or its sequence chunk). */
  gpt__use(m, GPT_WTE);
  gpt__use(m, GPT_LNFG);
  gpt__use(m, GPT_LNFB);
  ln_fwd(a->hf, a->muf, a->rsf, a->xs[nl], m->p[GPT_LNFG], m->p[GPT_LNFB], R, C);
  double loss = 0.0;
  for (int r = 0; r < R; r++) {
    float *lg = a->prob + (size_t)r * GPT_VOCAB, mx = -INFINITY, sum = 0.0f;
    const float *h = a->hf + (size_t)r * C;
    for (int v = 0; v < GPT_VOCAB; v++) {
      const float *e = m->p[GPT_WTE] + (size_t)v * C;
      float s = 0.0f;
      for (int i = 0; i < C; i++) s += h[i] * e[i];
      lg[v] = s;
      if (s > mx) mx = s;
    }
    for (int v = 0; v < GPT_VOCAB; v++) sum += (lg[v] = expf(lg[v] - mx));
    for (int v = 0; v < GPT_VOCAB; v++) lg[v] /= sum;
    loss -= log((double)lg[a->tgt[r0 + r]]);
  }
  return loss;
}

void gpt_backward(gpt_model *m, int slot, const float *dout, float *dx) {
  gpt_act *a = &m->act[slot];
  const int C = m->cfg.d_model, nb = m->nb, R = m->rows_local, r0 = row0(m);
  const int nl = m->layer_hi - m->layer_lo, t0 = m->t0;
  /* two R x C buffers for the gradient flowing down, beyond the scratch */
  float *cur = malloc((size_t)R * C * sizeof(float));
  float *nxt = malloc((size_t)R * C * sizeof(float));
  if (!cur || !nxt) abort();
  if (m->last) {
    float *dl = m->s_a, *dh = m->s_b;
    for (int r = 0; r < R; r++) {
      const float *p = a->prob + (size_t)r * GPT_VOCAB;
      float *d = dl + (size_t)r * GPT_VOCAB;
      for (int v = 0; v < GPT_VOCAB; v++) d[v] = p[v] * a->loss_scale;
      d[a->tgt[r0 + r]] -= a->loss_scale;
    }
    float *dW = m->g[GPT_WTE];
    for (int r = 0; r < R; r++) {
      const float *d = dl + (size_t)r * GPT_VOCAB, *h = a->hf + (size_t)r * C;
      float *o = dh + (size_t)r * C;
      for (int i = 0; i < C; i++) o[i] = 0.0f;
      for (int v = 0; v < GPT_VOCAB; v++) {
        const float *e = m->p[GPT_WTE] + (size_t)v * C;
        float *de = dW + (size_t)v * C;
        for (int i = 0; i < C; i++) {
          o[i] += d[v] * e[i];
          de[i] += d[v] * h[i];
        }
      }
    }
    memset(cur, 0, (size_t)R * C * sizeof(float));
    ln_bwd(cur, m->g[GPT_LNFG], m->g[GPT_LNFB], a->xs[nl], a->muf, a->rsf, m->p[GPT_LNFG],
           dh, R, C);
    gpt__ready(m, GPT_LNFG); gpt__ready(m, GPT_LNFB);
    if (!m->first) gpt__ready(m, GPT_WTE);
  } else {
    memcpy(cur, dout, (size_t)R * C * sizeof(float));
  }
  for (int i = nl - 1; i >= 0; i--) {
    block_bwd(m, &a->L[i], m->layer_lo + i, a->xs[i], cur, nxt, a->loss_scale);
    float *t = cur; cur = nxt; nxt = t;
  }
  if (m->first) {
    for (int r = 0; r < R; r++) {
      int row = r0 + r, t = t0 + row / nb;
      float *de = m->g[GPT_WTE] + (size_t)a->tok[row] * C;
      float *dp = m->g[GPT_WPE] + (size_t)t * C;
      for (int i = 0; i < C; i++) {
        de[i] += cur[(size_t)r * C + i];
        dp[i] += cur[(size_t)r * C + i];
      }
    }
    gpt__ready(m, GPT_WTE); gpt__ready(m, GPT_WPE);
  } else {
    memcpy(dx, cur, (size_t)R * C * sizeof(float));
  }
  free(cur);
  free(nxt);
}

/* ---- optimizer ---------------------------------------------------------- */
double gpt_grad_sumsq(const gpt_model *m, int id) {
  double s = 0.0;
  if (!m->g[id]) return 0.0;
  for (size_t i = 0; i < m->n[id]; i++) s += (double)m->g[id][i] * m->g[id][i];
  return s;
}

static void adamw_span(const gpt_model *m, int id, float *p, const float *g, float *mo,
                       float *va, size_t n, float gscale) {
  const float b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f, lr = m->cfg.lr;
  const float c1 = 1.0f - powf(b1, (float)m->t), c2 = 1.0f - powf(b2, (float)m->t);
  const int decay = gpt_tensor_decays(&m->cfg, id);
  for (size_t i = 0; i < n; i++) {
    float gi = g[i] * gscale;
    mo[i] = b1 * mo[i] + (1.0f - b1) * gi;
    va[i] = b2 * va[i] + (1.0f - b2) * gi * gi;
    float upd = (mo[i] / c1) / (sqrtf(va[i] / c2) + eps);
    if (decay) upd += wd * p[i];
    p[i] -= lr * upd;
  }
}

void gpt_adamw(gpt_model *m, float gscale) {
  m->t++;
  for (int id = 0; id < m->nt; id++)
    if (m->p[id]) adamw_span(m, id, m->p[id], m->g[id], m->m[id], m->v[id], m->n[id], gscale);
}

void gpt_adamw_tick(gpt_model *m) { m->t++; }

void gpt_adamw_range(gpt_model *m, int id, size_t off, size_t n, float *mo, float *va,
                     float gscale) {
  if (m->p[id] && n) adamw_span(m, id, m->p[id] + off, m->g[id] + off, mo, va, n, gscale);
}

/* ---- the single-process reference --------------------------------------- */
int gpt_reference_train(const gpt_config *c, const uint8_t *data, size_t len,
                        int steps, gpt_model *m, double *losses, float ***grads1) {
  return gpt_reference_train_moe(c, data, len, steps, m, losses, NULL, NULL, grads1);
}

int gpt_reference_train_moe(const gpt_config *c, const uint8_t *data, size_t len,
                            int steps, gpt_model *m, double *losses, double *aux,
                            double *imbalance, float ***grads1) {
  if (gpt_model_init(m, c, NULL, 0, c->n_layer, 1, 1, c->batch, 1, NULL)) return -1;
  uint8_t *seqs = malloc((size_t)c->batch * (c->seq + 1));
  if (!seqs) return -1;
  const double ntok = (double)c->batch * c->seq;
  for (int s = 0; s < steps; s++) {
    for (int b = 0; b < c->batch; b++)
      gpt_sequence(c, data, len, s, b, seqs + (size_t)b * (c->seq + 1));
    gpt_model_zero_stats(m);
    double loss = gpt_forward(m, 0, seqs, NULL, NULL, (float)(1.0 / ntok));
    gpt_backward(m, 0, NULL, NULL);
    /* The aux loss: the mean over the batch's groups of aux_seqs sequences
     * (moe.h), summed over the MoE layers. */
    const double a = c->moe > 0 ? m->aux_sum * c->aux_seqs / c->batch : 0.0;
    losses[s] = loss / ntok + a;
    if (aux) aux[s] = a;
    if (imbalance) imbalance[s] = gpt_moe_imbalance(c, m->moe_tokens);
    if (s == 0 && grads1) {
      *grads1 = calloc((size_t)m->nt, sizeof(float *));
      for (int id = 0; *grads1 && id < m->nt; id++) {
        (*grads1)[id] = malloc((m->n[id] ? m->n[id] : 1) * sizeof(float));
        if ((*grads1)[id] && m->g[id]) memcpy((*grads1)[id], m->g[id], m->n[id] * sizeof(float));
      }
    }
    double ss = 0.0;
    for (int id = 0; id < m->nt; id++) ss += gpt_grad_sumsq(m, id);
    double norm = sqrt(ss);
    gpt_adamw(m, norm > GPT_CLIP ? (float)(GPT_CLIP / norm) : 1.0f);
    gpt_model_zero_grads(m);
  }
  free(seqs);
  return 0;
}

uint64_t gpt_moe_routing_hash(const gpt_model *m, int slot) {
  uint64_t h = 0xcbf29ce484222325ull;
  const gpt_act *a = &m->act[slot];
  for (int i = 0; i < m->layer_hi - m->layer_lo; i++)
    if (a->L[i].moe) h = gpt__moe_act_hash(a->L[i].moe, m->cfg.topk, h);
  return h;
}
