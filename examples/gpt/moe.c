/* The MoE layer of the GPT example: router, top-k gates, the
 * load-balancing loss, the AlltoAll token dispatcher over "ep" and the
 * expert tensor parallel group "etp", forward and manual backward.  See
 * moe.h. */
#include "moe.h"
#include "stage.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- tensor ids ----------------------------------------------------------- */
int gpt_moe_layer(const gpt_config *c, int layer) {
  return c->moe > 0 && layer >= c->dense_layers && layer < c->n_layer;
}

int gpt_moe_num_layers(const gpt_config *c) {
  if (c->moe <= 0) return 0;
  const int d = c->dense_layers > 0 ? c->dense_layers : 0;
  return c->n_layer > d ? c->n_layer - d : 0;
}

int gpt_moe_base(const gpt_config *c) { return GPT_NGLOBAL + L_NPER * c->n_layer; }

static int first_moe_layer(const gpt_config *c) {
  return c->dense_layers > 0 ? c->dense_layers : 0;
}

int gpt_moe_tensor_id(const gpt_config *c, int layer, int expert, int kind) {
  const int per = 1 + 4 * c->moe;
  const int base = gpt_moe_base(c) + (layer - first_moe_layer(c)) * per;
  return kind == M_ROUTER ? base : base + 1 + 4 * expert + (kind - M_FCW);
}

int gpt_moe_decode(const gpt_config *c, int id, int *layer, int *expert, int *kind) {
  const int base = gpt_moe_base(c), per = 1 + 4 * c->moe;
  if (c->moe <= 0 || id < base || id >= base + gpt_moe_num_layers(c) * per) return 0;
  const int j = (id - base) % per;
  *layer = first_moe_layer(c) + (id - base) / per;
  *expert = j == 0 ? -1 : (j - 1) / 4;
  *kind = j == 0 ? M_ROUTER : M_FCW + (j - 1) % 4;
  return 1;
}

int gpt_tensor_expert(const gpt_config *c, int id) {
  int l, e, k;
  return gpt_moe_decode(c, id, &l, &e, &k) && k != M_ROUTER;
}

const char *gpt_moe_check(const gpt_config *c, int tp, int pp, int dp, int cp, int sp,
                          int ep, int etp) {
  const char *why = gpt_config_check(c, tp, pp, dp, cp, sp);
  if (why) return why;
  if (c->moe <= 0) return ep == 1 && etp <= 1 ? NULL : "--ep and --etp need --moe";
  if (ep < 1 || etp < 1) return "ep and etp must be >= 1";
  if (c->moe % ep) return "experts (--moe) must be a multiple of ep";
  if ((4 * c->d_model) % etp) return "4 * dmodel must be a multiple of etp";
  if (tp > 1 && !sp)
    return "MoE with tp > 1 needs --sp (each rank routes its own token rows, as in Megatron)";
  if ((dp * cp * tp) % (ep * etp))
    return "ep * etp must divide dp * cp * tp (the ranks of one pipeline stage)";
  if (c->aux_seqs != c->batch / (dp * c->micro))
    return "aux_seqs must be batch / (dp * microbatches): the sequences of one micro-batch "
           "of one dp rank, the load-balancing group";
  return NULL;
}

double gpt_moe_imbalance(const gpt_config *c, const double *tokens) {
  double worst = 0.0;
  const int E = c->moe;
  for (int l = 0; tokens && l < gpt_moe_num_layers(c); l++) {
    double sum = 0.0, mx = 0.0;
    for (int e = 0; e < E; e++) {
      sum += tokens[(size_t)l * E + e];
      if (tokens[(size_t)l * E + e] > mx) mx = tokens[(size_t)l * E + e];
    }
    if (sum > 0 && mx / (sum / E) > worst) worst = mx / (sum / E);
  }
  return worst;
}

/* ---- buffers -------------------------------------------------------------- */
/* Grow *p to hold at least `bytes` (contents not kept).  Example code: out
 * of memory aborts, as gpt_backward does. */
static void *grow(void *p, size_t *cap, size_t bytes) {
  if (bytes == 0) bytes = 1;
  if (bytes <= *cap) return p;
  free(p);
  p = malloc(bytes);
  if (!p) {
    fprintf(stderr, "gpt: out of memory (MoE buffer of %zu bytes)\n", bytes);
    abort();
  }
  *cap = bytes;
  return p;
}
/* obj->field grown to n elements; its old contents are lost. */
#define GROW(obj, field, n) \
  ((obj)->field = grow((obj)->field, &(obj)->field##_cap, (size_t)(n) * sizeof *(obj)->field))

/* One micro-batch's saved state of one MoE layer. */
struct gpt_moe_act {
  int R, aux_seqs;   /* rows; sequences per load-balancing group */
  size_t nmax;       /* rows received for the local experts: the largest
                        count over the etp members (>= 1) */
  float *prob; size_t prob_cap;   /* R x E router probabilities */
  int *sel; size_t sel_cap;       /* R x K chosen experts */
  float *gate; size_t gate_cap;   /* R x K gate weights */
  int *spos; size_t spos_cap;     /* R x K: row of (r, j) in the send order */
  int64_t *scnt; size_t scnt_cap; /* E: this rank's assignments per expert */
  int64_t *gcnt; size_t gcnt_cap; /* etp x ep x El: rows of etp member q from
                                     ep rank s for local expert le */
  size_t *cnt; size_t cnt_cap;    /* 4 x ep: send counts, displacements,
                                     receive counts, displacements (elements) */
  double *coef; size_t coef_cap;  /* groups x E: d aux_G / d p_e */
  float *X; size_t X_cap;         /* etp * nmax x C gathered expert inputs */
  float *pre; size_t pre_cap;     /* etp * nmax x Cx */
  float *gel; size_t gel_cap;     /* etp * nmax x Cx */
  float *out; size_t out_cap;     /* R*K x C expert outputs, send order */
};

/* Scratch shared by the MoE layers of a model (reused call to call). */
typedef struct gpt_moe_ws {
  float *a; size_t a_cap;
  float *b; size_t b_cap;
  float *c; size_t c_cap;
  float *d; size_t d_cap;
  double *st; size_t st_cap;
  int64_t *i; size_t i_cap;
} gpt_moe_ws;

gpt_moe_act *gpt__moe_act_new(void) { return calloc(1, sizeof(gpt_moe_act)); }

void gpt__moe_act_free(gpt_moe_act *a) {
  if (!a) return;
  free(a->prob); free(a->sel); free(a->gate); free(a->spos); free(a->scnt); free(a->gcnt);
  free(a->cnt); free(a->coef); free(a->X); free(a->pre); free(a->gel); free(a->out);
  free(a);
}

static gpt_moe_ws *ws_of(gpt_model *m) {
  if (!m->moe_ws) {
    m->moe_ws = calloc(1, sizeof(gpt_moe_ws));
    if (!m->moe_ws) {
      fprintf(stderr, "gpt: out of memory (MoE scratch)\n");
      abort();
    }
  }
  return m->moe_ws;
}

void gpt__moe_ws_free(gpt_model *m) {
  gpt_moe_ws *w = m->moe_ws;
  if (!w) return;
  free(w->a); free(w->b); free(w->c); free(w->d); free(w->st); free(w->i);
  free(w);
  m->moe_ws = NULL;
}

uint64_t gpt__moe_act_hash(const gpt_moe_act *a, int K, uint64_t h) {
  for (size_t i = 0; a && a->sel && i < (size_t)a->R * (size_t)K; i++)
    h = (h ^ (uint64_t)(a->sel[i] + 1)) * 0x100000001b3ull;
  return h;
}

/* ---- communication -------------------------------------------------------- */
/* Each helper is a local copy without the group (the reference) or with a
 * group of one. */
static int gsize(const mpg_group *g) { return g ? mpg_group_size(g) : 1; }

static void a2a_v(gpt_model *m, mpg_group *g, const float *send, const size_t *sc,
                  const size_t *sd, float *recv, const size_t *rc, const size_t *rd) {
  if (gsize(g) == 1) {
    if (sc[0]) memcpy(recv + rd[0], send + sd[0], sc[0] * sizeof(float));
    return;
  }
  gpt__note(m, gpt_stage_all_to_all_v(m->comm.stage, g, send, sc, sd, recv, rc, rd, MPG_F32));
}

static void gather(gpt_model *m, mpg_group *g, const void *send, void *recv, size_t count,
                   mpg_dtype dt) {
  if (gsize(g) == 1) {
    if (count) memcpy(recv, send, count * mpg_dtype_size(dt));
    return;
  }
  gpt__note(m, gpt_stage_all_gather(m->comm.stage, g, send, recv, count, dt));
}

/* Rows to the experts' ep rank (the all-to-all over "ep"), then, with
 * etp > 1, gathered over "etp" into `out` (etp x `count` floats: each
 * member's rows padded to count / C, the padding zero); with etp == 1 the
 * all-to-all writes `out` itself.  `loc`: count floats of scratch. */
static void to_experts(gpt_model *m, int etp, const float *send, const size_t *sc,
                       const size_t *sd, const size_t *rc, const size_t *rd, float *loc,
                       float *out, size_t count) {
  if (etp == 1) {
    a2a_v(m, m->comm.ep, send, sc, sd, out, rc, rd);
    return;
  }
  memset(loc, 0, count * sizeof(float));
  a2a_v(m, m->comm.ep, send, sc, sd, loc, rc, rd);
  gather(m, m->comm.etp, loc, out, count, MPG_F32);
}

static void scatter_sum(gpt_model *m, mpg_group *g, const float *send, float *recv,
                        size_t count) {
  if (gsize(g) == 1) {
    if (count) memcpy(recv, send, count * sizeof(float));
    return;
  }
  gpt__note(m, gpt_stage_reduce_scatter(m->comm.stage, g, send, recv, count, MPG_F32,
                                        MPG_OP_SUM));
}

/* ---- forward ---------------------------------------------------------------- */
static int use_sp(const gpt_model *m) { return m->comm.sp && m->comm.tp_size > 1; }

/* Sequences per load-balancing group in this model's micro-batches. */
static int group_seqs(const gpt_model *m) {
  const int as = m->cfg.aux_seqs;
  return as > 0 && m->nb % as == 0 ? as : m->nb;
}

void gpt__moe_fwd(gpt_model *m, gpt_moe_act *a, int layer, const float *h, const float *x2,
                  float *Y) {
  const gpt_config *c = &m->cfg;
  const int C = c->d_model, E = c->moe, K = c->topk, R = m->rows_local, nb = m->nb;
  const int ep = m->comm.ep_size, etp = m->comm.etp_size, El = E / ep, Cx = 4 * C / etp;
  const int e0 = m->comm.ep_rank * El;
  const int r0 = use_sp(m) ? m->comm.tp_rank * R : 0; /* first of this rank's rows */
  gpt_moe_ws *w = ws_of(m);
  float *const *P = m->p;
  const int rid = gpt_moe_tensor_id(c, layer, 0, M_ROUTER);
  gpt__use(m, rid);
  for (int le = 0; le < El; le++)
    for (int k = M_FCW; k <= M_FC2B; k++) gpt__use(m, gpt_moe_tensor_id(c, layer, e0 + le, k));
  a->R = R;

  /* Router: softmax over the E logits, top-k (ties: lower index), gates. */
  float *prob = GROW(a, prob, (size_t)R * E);
  int *sel = GROW(a, sel, (size_t)R * K);
  float *gate = GROW(a, gate, (size_t)R * K);
  int *spos = GROW(a, spos, (size_t)R * K);
  gpt__mm_fwd(prob, h, P[rid], NULL, R, C, E);
  for (int r = 0; r < R; r++) {
    float *p = prob + (size_t)r * E, mx = -INFINITY, sum = 0.0f, S = 0.0f;
    for (int e = 0; e < E; e++) mx = p[e] > mx ? p[e] : mx;
    for (int e = 0; e < E; e++) sum += (p[e] = expf(p[e] - mx));
    for (int e = 0; e < E; e++) p[e] /= sum;
    int *s = sel + (size_t)r * K;
    for (int j = 0; j < K; j++) {
      int best = -1;
      for (int e = 0; e < E; e++) {
        int taken = 0;
        for (int i = 0; i < j; i++) taken |= s[i] == e;
        if (!taken && (best < 0 || p[e] > p[best])) best = e;
      }
      s[j] = best;
      S += p[best];
    }
    for (int j = 0; j < K; j++) gate[(size_t)r * K + j] = p[s[j]] / S;
  }

  /* Load-balancing statistics of each group: assignments and probability
   * sums per expert, over the group's tokens on the tp (sp) x cp ranks. */
  const int as = group_seqs(m), ng = nb / as;
  a->aux_seqs = as;
  double *st = GROW(w, st, 2 * (size_t)ng * E);
  memset(st, 0, 2 * (size_t)ng * E * sizeof(double));
  double *tok = m->moe_tokens + (size_t)(layer - first_moe_layer(c)) * E;
  for (int r = 0; r < R; r++) {
    const int g = ((r0 + r) % nb) / as;
    for (int e = 0; e < E; e++) st[(size_t)(ng + g) * E + e] += prob[(size_t)r * E + e];
    for (int j = 0; j < K; j++) {
      st[(size_t)g * E + sel[(size_t)r * K + j]] += 1.0;
      tok[sel[(size_t)r * K + j]] += 1.0;
    }
  }
  if (use_sp(m))
    gpt__note(m, gpt_stage_all_reduce(m->comm.stage, m->comm.tp, st, st, 2 * (size_t)ng * E,
                                      MPG_F64, MPG_OP_SUM));
  if (m->comm.cp_size > 1)
    gpt__note(m, gpt_stage_all_reduce(m->comm.stage, m->comm.cp, st, st, 2 * (size_t)ng * E,
                                      MPG_F64, MPG_OP_SUM));
  double *coef = GROW(a, coef, (size_t)ng * E);
  const double A = c->aux_coef, ntok = (double)as * c->seq;
  for (int g = 0; g < ng; g++) {
    double aux = 0.0;
    for (int e = 0; e < E; e++) {
      const double f = st[(size_t)g * E + e] / (ntok * K), Pm = st[(size_t)(ng + g) * E + e] / ntok;
      aux += f * Pm;
      coef[(size_t)g * E + e] = A * E * f / ntok;
    }
    m->aux_sum += A * E * aux;
  }

  /* Dispatch order: by expert (so by destination ep rank, then local
   * expert), then by row. */
  int64_t *scnt = GROW(a, scnt, E);
  memset(scnt, 0, (size_t)E * sizeof(int64_t));
  for (size_t i = 0; i < (size_t)R * K; i++) scnt[sel[i]]++;
  int64_t *ib = GROW(w, i, (size_t)E + (size_t)ep * El + 1);
  int64_t *cursor = ib;
  for (int e = 0, o = 0; e < E; e++) cursor[e] = o, o += (int)scnt[e];
  for (int r = 0; r < R; r++)
    for (int j = 0; j < K; j++) spos[(size_t)r * K + j] = (int)cursor[sel[(size_t)r * K + j]]++;
  const size_t tot = (size_t)R * K;
  float *send = GROW(w, a, tot * C);
  for (int r = 0; r < R; r++)
    for (int j = 0; j < K; j++)
      memcpy(send + (size_t)spos[(size_t)r * K + j] * C, h + (size_t)r * C, C * sizeof(float));

  /* Counts: scnt[d * El + le] goes to ep rank d; rcnt[s * El + le] comes
   * from ep rank s; then gathered over etp into gcnt[q][s][le]. */
  int64_t *rcnt = ib + E;
  if (gsize(m->comm.ep) == 1) memcpy(rcnt, scnt, (size_t)E * sizeof(int64_t));
  else
    gpt__note(m, gpt_stage_all_to_all(m->comm.stage, m->comm.ep, scnt, rcnt, (size_t)El,
                                      MPG_I64));
  int64_t *gcnt = GROW(a, gcnt, (size_t)etp * ep * El);
  gather(m, m->comm.etp, rcnt, gcnt, (size_t)ep * El, MPG_I64);
  size_t *cnt = GROW(a, cnt, 4 * (size_t)ep);
  size_t *ssc = cnt, *sdis = cnt + ep, *rsc = cnt + 2 * ep, *rdis = cnt + 3 * ep;
  size_t so = 0, ro = 0;
  for (int d = 0; d < ep; d++) {
    size_t sn = 0, rn = 0;
    for (int le = 0; le < El; le++) {
      sn += (size_t)scnt[d * El + le];
      rn += (size_t)rcnt[d * El + le];
    }
    ssc[d] = sn * C, sdis[d] = so, so += sn * C;
    rsc[d] = rn * C, rdis[d] = ro, ro += rn * C;
  }
  size_t nmax = 1;
  for (int q = 0; q < etp; q++) {
    size_t n = 0;
    for (int i = 0; i < ep * El; i++) n += (size_t)gcnt[(size_t)q * ep * El + i];
    if (n > nmax) nmax = n;
  }
  a->nmax = nmax;

  /* Token rows to the experts' ep rank, then gathered over etp (padded to
   * nmax rows each). */
  const size_t NG = (size_t)etp * nmax;
  float *X = GROW(a, X, NG * C);
  to_experts(m, etp, send, ssc, sdis, rsc, rdis, GROW(w, b, nmax * C), X, nmax * C);

  /* The local experts, segment by segment: (etp member q, source s,
   * expert le) in that order. */
  float *pre = GROW(a, pre, NG * Cx), *gel = GROW(a, gel, NG * Cx);
  float *Yg = GROW(w, c, NG * C);
  memset(Yg, 0, NG * C * sizeof(float)); /* padding rows stay 0 for the reduce */
  for (int q = 0; q < etp; q++) {
    size_t off = (size_t)q * nmax;
    for (int s = 0; s < ep; s++)
      for (int le = 0; le < El; le++) {
        const int n = (int)gcnt[((size_t)q * ep + s) * El + le];
        if (!n) continue;
        const int e = e0 + le;
        gpt__mm_fwd(pre + off * Cx, X + off * C, P[gpt_moe_tensor_id(c, layer, e, M_FCW)],
                    P[gpt_moe_tensor_id(c, layer, e, M_FCB)], n, C, Cx);
        for (size_t i = off * Cx; i < (off + (size_t)n) * Cx; i++) gel[i] = gpt__gelu(pre[i]);
        gpt__mm_fwd(Yg + off * C, gel + off * Cx, P[gpt_moe_tensor_id(c, layer, e, M_FC2W)],
                    NULL, n, Cx, C);
        off += (size_t)n;
      }
  }
  /* fc2's partial sums over etp, back to the member that received the
   * rows; then fc2's bias. */
  float *Ym = Yg;
  if (etp > 1) {
    Ym = GROW(w, d, nmax * C);
    scatter_sum(m, m->comm.etp, Yg, Ym, nmax * C);
  }
  {
    size_t off = 0;
    for (int s = 0; s < ep; s++)
      for (int le = 0; le < El; le++) {
        const float *b2 = P[gpt_moe_tensor_id(c, layer, e0 + le, M_FC2B)];
        for (int n = 0; n < (int)rcnt[s * El + le]; n++, off++)
          for (int i = 0; i < C; i++) Ym[off * C + i] += b2[i];
      }
  }
  /* Back home (the reverse all-to-all), then the gated sum. */
  float *out = GROW(a, out, tot * C);
  a2a_v(m, m->comm.ep, Ym, rsc, rdis, out, ssc, sdis);
  for (int r = 0; r < R; r++)
    for (int i = 0; i < C; i++) {
      float acc = 0.0f;
      for (int j = 0; j < K; j++)
        acc += gate[(size_t)r * K + j] * out[(size_t)spos[(size_t)r * K + j] * C + i];
      Y[(size_t)r * C + i] = x2[(size_t)r * C + i] + acc;
    }
}

/* ---- backward --------------------------------------------------------------- */
void gpt__moe_bwd(gpt_model *m, gpt_moe_act *a, int layer, const float *h, const float *dY,
                  float *dh, float loss_scale) {
  const gpt_config *c = &m->cfg;
  const int C = c->d_model, E = c->moe, K = c->topk, R = a->R, nb = m->nb;
  const int ep = m->comm.ep_size, etp = m->comm.etp_size, El = E / ep, Cx = 4 * C / etp;
  const int e0 = m->comm.ep_rank * El;
  const int r0 = use_sp(m) ? m->comm.tp_rank * R : 0;
  const size_t tot = (size_t)R * K, nmax = a->nmax, NG = (size_t)etp * nmax;
  const size_t *ssc = a->cnt, *sdis = a->cnt + ep, *rsc = a->cnt + 2 * ep,
               *rdis = a->cnt + 3 * ep;
  gpt_moe_ws *w = ws_of(m);
  float *const *P = m->p, *const *G = m->g;

  /* Gated sum: d out = gate * dY to the experts, d gate = dY . out. */
  float *dsend = GROW(w, a, tot * C);
  float *dp = GROW(w, b, (size_t)E + tot), *dgate = dp + E; /* dp: the router's, below */
  for (int r = 0; r < R; r++)
    for (int j = 0; j < K; j++) {
      const size_t p = (size_t)a->spos[(size_t)r * K + j];
      const float gt = a->gate[(size_t)r * K + j];
      const float *o = a->out + p * C, *d = dY + (size_t)r * C;
      float s = 0.0f;
      for (int i = 0; i < C; i++) {
        s += d[i] * o[i];
        dsend[p * C + i] = gt * d[i];
      }
      dgate[(size_t)r * K + j] = s;
    }
  /* To the experts' ep rank, gathered over etp: every etp member then has
   * the output gradients of all the rows its expert shards saw. */
  float *dG = GROW(w, c, NG * C);
  to_experts(m, etp, dsend, ssc, sdis, rsc, rdis, GROW(w, d, nmax * C), dG, nmax * C);
  /* Expert backward, segment by segment as in forward.  dXg: the input
   * gradients' partial sums over etp (padding rows 0). */
  float *dgel = GROW(w, a, NG * Cx); /* dsend is consumed */
  float *dXg = GROW(w, d, NG * C);   /* the gather's loc is consumed */
  memset(dXg, 0, NG * C * sizeof(float));
  for (int q = 0; q < etp; q++) {
    size_t off = (size_t)q * nmax;
    for (int s = 0; s < ep; s++)
      for (int le = 0; le < El; le++) {
        const int n = (int)a->gcnt[((size_t)q * ep + s) * El + le];
        if (!n) continue;
        const int e = e0 + le;
        const int i1w = gpt_moe_tensor_id(c, layer, e, M_FCW);
        const int i1b = gpt_moe_tensor_id(c, layer, e, M_FCB);
        const int i2w = gpt_moe_tensor_id(c, layer, e, M_FC2W);
        const int i2b = gpt_moe_tensor_id(c, layer, e, M_FC2B);
        float *db2 = G[i2b];
        for (size_t r = off; r < off + (size_t)n; r++)
          for (int i = 0; i < C; i++) db2[i] += dG[r * C + i];
        gpt__mm_bwd(dgel + off * Cx, G[i2w], NULL, a->gel + off * Cx, P[i2w], dG + off * C, n,
                    Cx, C);
        for (size_t i = off * Cx; i < (off + (size_t)n) * Cx; i++)
          dgel[i] *= gpt__gelu_grad(a->pre[i]);
        gpt__mm_bwd(dXg + off * C, G[i1w], G[i1b], a->X + off * C, P[i1w], dgel + off * Cx, n,
                    C, Cx);
        off += (size_t)n;
      }
  }
  for (int le = 0; le < El; le++)
    for (int k = M_FC2B; k >= M_FCW; k--) gpt__ready(m, gpt_moe_tensor_id(c, layer, e0 + le, k));
  /* Input gradients: summed over etp to the receiving member, then home. */
  float *dXm = dXg;
  if (etp > 1) {
    dXm = GROW(w, c, nmax * C); /* dG is consumed */
    scatter_sum(m, m->comm.etp, dXg, dXm, nmax * C);
  }
  float *dXs = GROW(w, a, tot * C); /* dgel is consumed */
  a2a_v(m, m->comm.ep, dXm, rsc, rdis, dXs, ssc, sdis);
  for (int r = 0; r < R; r++)
    for (int i = 0; i < C; i++) {
      float acc = 0.0f;
      for (int j = 0; j < K; j++) acc += dXs[(size_t)a->spos[(size_t)r * K + j] * C + i];
      dh[(size_t)r * C + i] = acc;
    }

  /* Router: gates g_j = p_{e_j} / S give dp_{e_i} = (dg_i - sum_j dg_j g_j)
   * / S; the aux loss adds (its scale) * A * E * f_e / |G| to every dp_e;
   * then the softmax backward. */
  const int rid = gpt_moe_tensor_id(c, layer, 0, M_ROUTER);
  const double aux_scale = (double)loss_scale * a->aux_seqs * c->seq;
  float *dl = GROW(w, d, (size_t)R * E); /* dXg is consumed */
  for (int r = 0; r < R; r++) {
    const float *p = a->prob + (size_t)r * E;
    const int *s = a->sel + (size_t)r * K, g = ((r0 + r) % nb) / a->aux_seqs;
    const float *gt = a->gate + (size_t)r * K, *dg = dgate + (size_t)r * K;
    float S = 0.0f, t = 0.0f, dot = 0.0f;
    for (int j = 0; j < K; j++) S += p[s[j]];
    for (int j = 0; j < K; j++) t += dg[j] * gt[j];
    for (int e = 0; e < E; e++) dp[e] = (float)(aux_scale * a->coef[(size_t)g * E + e]);
    for (int j = 0; j < K; j++) dp[s[j]] += (dg[j] - t) / S;
    for (int e = 0; e < E; e++) dot += p[e] * dp[e];
    for (int e = 0; e < E; e++) dl[(size_t)r * E + e] = p[e] * (dp[e] - dot);
  }
  float *tmp = GROW(w, c, (size_t)R * C);
  gpt__mm_bwd(tmp, G[rid], NULL, h, P[rid], dl, R, C, E);
  for (size_t i = 0; i < (size_t)R * C; i++) dh[i] += tmp[i];
  gpt__ready(m, rid);
}
