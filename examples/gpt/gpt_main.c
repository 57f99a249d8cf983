/* gpt: train a small byte-level GPT on thread ranks with tensor, sequence,
 * context, data (replicated, sharded or HSDP) and pipeline parallelism
 * through meshpg, next to the single-process reference on the same global
 * batches, and compare them.
 *
 *   gpt [--mesh pp=2,dp=2,cp=2,tp=2] [--sp] [--shard] [--mpi | --nccl] [--steps N]
 *       [--layers L] [--dmodel C] [--heads H] [--seq T] [--batch B]
 *       [--microbatches M] [--lr LR] [--seed S] [--data FILE] [--svg FILE]
 *       [--tol X] [--ptol X] [--every K] [--tensors]
 *       [--moe E [--topk K] [--ep N] [--etp N] [--dense-layers D] [--aux-coef A]]
 *       [--save DIR --save-at K [--async-save]] [--resume DIR] [--trace DIR]
 *
 * --every K prints every K-th step of the loss table (and the last; default
 * 1 up to 30 steps, else about 20 rows); --tensors adds the per-tensor
 * error table.
 *
 * Mesh dims: pp, dp, cp, tp, or for HSDP (with --shard) dp_replicate and
 * dp_shard in place of dp.  --shard: sharded data parallel (a distributed
 * optimizer: mpg_sync in MPG_SYNC_SHARD mode).  --mpi: this process is one
 * rank of an mpirun job (as many processes as the mesh has ranks); every
 * process runs the reference, rank 0 prints the comparison:
 *   mpirun -np 8 build/examples/gpt/gpt --mpi --mesh pp=2,dp=2,tp=2
 * --nccl: thread ranks on the NCCL backend, rank r on CUDA device r % count
 * (on real GPUs: as many GPUs as ranks, see usage()); the model computes
 * on host arrays and every collective, p2p batch and the gradient sync is
 * staged through device memory (stage.h).
 *
 * Mixture of experts (moe.h): --moe E replaces the MLP of every layer
 * from --dense-layers D on (default 0; the first D stay dense, DeepSeek's
 * layout) by a router (C x E, no bias) and E expert MLPs; each token goes
 * to its --topk K experts (default 2; ties to the lower index), weighted
 * by the chosen router probabilities renormalised to sum 1.  The Switch /
 * GShard load-balancing loss, --aux-coef A (default 0.01) x E x sum_e f_e
 * P_e per micro-batch of a dp rank (counts and probabilities all-reduced
 * over its tp and cp ranks), is added to the loss: the table shows it
 * ("aux") and the tokens-per-expert imbalance (max / mean over experts,
 * worst MoE layer, whole batch).  Parallel: Megatron's AlltoAll
 * dispatcher on the mesh's expert grid (mpg_spec_set_experts): --ep N
 * ranks split the experts (default 1; E % N == 0), --etp N split each
 * expert's fc / fc2 column / row parallel (default tp; 4C % N == 0); tp > 1
 * needs --sp (each rank routes its own rows).  Tokens go out by
 * mpg_all_to_all_v over "ep", are all-gathered over "etp", and come back
 * by reduce-scatter and the reverse all-to-all.  Expert gradients are
 * averaged over "edp" (scale derived in train.c); with --shard they are
 * sharded over "edp" (the sync's expert domain), dense ones over dp_cp.
 * Pipeline stages may mix dense and MoE layers.  The reference computes
 * all experts in one process, with the same load-balancing groups; the
 * comparison covers the router and each rank's expert shards ("h1.router.w",
 * "h1.e3.fc.w" in --tensors):
 *   gpt --mesh dp=4,tp=2 --sp --moe 8 --ep 4 --etp 1 --tensors
 *
 * Checkpoints (ckpt.h): --save DIR --save-at K saves, after the K-th step's
 * optimizer update, every rank's parameters (global names and shapes, the
 * tp / etp split as a box of the global tensor), AdamW's moments and the
 * trainer's step into DIR through mpg_ckpt (--async-save: written in the
 * background while training goes on).  --resume DIR loads such a
 * checkpoint, saved under any mesh, into this run's mesh and trains from
 * its step up to --steps; the comparison then covers the steps after the
 * checkpoint and the final parameters, against the reference trained from
 * step 0 without a stop:
 *   gpt --mesh tp=2,cp=2,dp=2 --sp --shard --steps 10 --save ck --save-at 10
 *   gpt --mesh dp=8 --shard --steps 20 --resume ck
 *
 * Flight recorder (docs/trace.md): --trace DIR makes DIR (one level) and
 * sets it as every context's trace directory with a ring of
 * GPT_TRACE_ENTRIES operations, so that a fault dumps there; after a
 * healthy run every rank writes DIR/rank-R.trace and the root draws them
 * (tools/trace_draw.c): DIR/trace.svg, one row per rank, and DIR/trace.json
 * for Perfetto or chrome://tracing, and prints the straggler report's verdict
 * (tools/trace_stragglers.c: the ranks that issue their collectives last,
 * marked in the drawing; `meshpg trace --stragglers DIR` gives the table).
 *
 * Tolerances: the parallel run computes the same f32 arithmetic as the
 * reference but sums in another order (tp partial sums added by an
 * all-reduce, dp gradients averaged, micro-batches accumulated, the grad
 * norm summed per shard).  Each such sum differs by a few f32 ulps (~1e-7
 * relative), so --tol (1e-4 relative) is ample for the loss of every step
 * and for the gradients of step 1 (before any optimizer step), while a real
 * bug (a missing reduction, a wrong shard, a factor of tp) gives far larger
 * errors.  Each tensor shard is compared in the 2-norm, ||a - ref|| /
 * ||ref||.  The parameters after the last step get --ptol (1e-3): AdamW's
 * m / sqrt(v) is of order 1 whatever the size of the gradient, so an
 * element whose gradient is near zero (a cancellation) moves by about lr
 * in a direction set by rounding noise; small tensors that start at zero
 * (biases) then differ by ~1e-4 relative after tens of steps, more with
 * small batches.  The key part of qkv.b is left out of the parameter
 * comparison: its gradient is zero in exact arithmetic, so both runs' key
 * biases are pure AdamW-scaled rounding noise (see gpt_shard_error in
 * train.h).
 */
#include "moe.h"
#include "train.h"
#include "trace_draw.h"
#include "trace_read.h"
#include "trace_stragglers.h"

#include <errno.h>
#include <sys/stat.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifndef GPT_DEFAULT_DATA
#define GPT_DEFAULT_DATA "include/meshpg.h"
#endif

static uint8_t *read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  uint8_t *buf = NULL;
  size_t cap = 0, n = 0;
  for (;;) {
    if (n == cap) {
      cap = cap ? 2 * cap : 65536;
      uint8_t *nb = realloc(buf, cap);
      if (!nb) { free(buf); fclose(f); return NULL; }
      buf = nb;
    }
    size_t k = fread(buf + n, 1, cap - n, f);
    if (k == 0) break;
    n += k;
  }
  fclose(f);
  *len = n;
  return buf;
}

/* The loss curves of steps first .. first + n - 1 (1-based). */
static void write_svg(const char *path, const double *a, const double *b, int n, int first,
                      double base) {
  FILE *f = fopen(path, "w");
  if (!f) { fprintf(stderr, "gpt: cannot write %s\n", path); return; }
  const double W = 640, H = 400, L = 60, Rm = 20, Tm = 30, Bm = 50;
  double lo = base, hi = base;
  for (int i = 0; i < n; i++) {
    lo = fmin(lo, fmin(a[i], b[i]));
    hi = fmax(hi, fmax(a[i], b[i]));
  }
  if (hi - lo < 1e-9) hi = lo + 1;
  double pad = 0.05 * (hi - lo);
  lo -= pad, hi += pad;
#define X(i) (L + (n > 1 ? (double)(i) / (n - 1) : 0.5) * (W - L - Rm))
#define Y(v) (Tm + (hi - (v)) / (hi - lo) * (H - Tm - Bm))
  fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%g\" height=\"%g\">\n"
             "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n", W, H);
  fprintf(f, "<line x1=\"%g\" y1=\"%g\" x2=\"%g\" y2=\"%g\" stroke=\"black\"/>\n", L,
          H - Bm, W - Rm, H - Bm);
  fprintf(f, "<line x1=\"%g\" y1=\"%g\" x2=\"%g\" y2=\"%g\" stroke=\"black\"/>\n", L, Tm,
          L, H - Bm);
  for (int k = 0; k <= 4; k++) {
    double v = lo + (hi - lo) * k / 4;
    fprintf(f, "<text x=\"%g\" y=\"%g\" font-size=\"11\" text-anchor=\"end\">%.2f</text>\n",
            L - 4, Y(v) + 4, v);
  }
  fprintf(f, "<text x=\"%g\" y=\"%g\" font-size=\"12\" text-anchor=\"middle\">step (%d..%d)"
             "</text>\n", (L + W - Rm) / 2, H - 15, first, first + n - 1);
  fprintf(f, "<text x=\"%g\" y=\"18\" font-size=\"13\">loss: parallel (blue), reference "
             "(red, dashed), unigram entropy (grey)</text>\n", L);
  fprintf(f, "<line x1=\"%g\" y1=\"%g\" x2=\"%g\" y2=\"%g\" stroke=\"grey\" "
             "stroke-dasharray=\"2,4\"/>\n", L, Y(base), W - Rm, Y(base));
  const double *s[2] = {a, b};
  const char *style[2] = {"stroke=\"blue\" stroke-width=\"2\"",
                          "stroke=\"red\" stroke-width=\"1.5\" stroke-dasharray=\"6,4\""};
  for (int k = 0; k < 2; k++) {
    fprintf(f, "<polyline fill=\"none\" %s points=\"", style[k]);
    for (int i = 0; i < n; i++) fprintf(f, "%.1f,%.1f ", X(i), Y(s[k][i]));
    fprintf(f, "\"/>\n");
  }
  fprintf(f, "</svg>\n");
#undef X
#undef Y
  fclose(f);
}

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void usage(void) {
  fprintf(stderr,
          "usage: gpt [--mesh pp=2,dp=2,cp=2,tp=2] [--sp] [--shard] [--mpi | --nccl]\n"
          "           [--steps N] [--layers L] [--dmodel C] [--heads H] [--seq T] [--batch B]\n"
          "           [--microbatches M] [--lr LR] [--seed S] [--data FILE]\n"
          "           [--svg FILE] [--tol X] [--ptol X] [--every K] [--tensors]\n"
          "           [--moe E [--topk K] [--ep N] [--etp N] [--dense-layers D]\n"
          "            [--aux-coef A]]\n"
          "           [--save DIR --save-at K [--async-save]] [--resume DIR]\n"
          "           [--trace DIR]\n"
          "  --moe   E experts per MoE layer (0: dense, the default); --topk experts\n"
          "          per token (2); --ep expert parallel size (1, E %% ep == 0);\n"
          "          --etp expert tensor parallel size (tp); --dense-layers D: the\n"
          "          first D layers keep a dense MLP (0); --aux-coef load-balancing\n"
          "          loss coefficient (0.01).  tp > 1 needs --sp; with --shard the\n"
          "          expert params shard over edp (a dp mesh, not dp_replicate)\n"
          "  --save  DIR: save a checkpoint there after step K (--save-at, 1 .. steps);\n"
          "          --async-save: written in the background while training goes on\n"
          "  --resume DIR: load a checkpoint (saved under any mesh) and train from its\n"
          "          step to --steps; compared with the reference after that step\n"
          "  --trace DIR: the flight recorder's directory (a fault dumps there); after\n"
          "          the run every rank writes DIR/rank-R.trace and DIR/trace.svg and\n"
          "          DIR/trace.json draw them\n"
          "  --mpi   one rank per process of an mpirun job (MPI backend)\n"
          "  --nccl  thread ranks on the NCCL backend, one CUDA device each\n"
          "          (device = rank %% device count); the math stays on the host and\n"
          "          every communication is staged through device memory.  NCCL\n"
          "          refuses two ranks of one process on one GPU (a distinct\n"
          "          NCCL_HOSTID per rank is impossible for threads), so on a real\n"
          "          machine --nccl needs as many GPUs as the mesh has ranks\n");
}

/* The command line. */
typedef struct args {
  gpt_config c;
  const char *mesh, *data_path, *svg, *trace;
  int sp, shard, mpi, nccl, steps, every, tensors;
  gpt_ckpt_opts ck;
  double tol, ptol;
} args;

/* Parse argv into *A: -1 to go on, else the exit status (0: --help). */
static int parse_args(int argc, char **argv, args *A) {
  gpt_config *c = &A->c;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--sp")) { A->sp = 1; continue; }
    if (!strcmp(a, "--shard")) { A->shard = 1; continue; }
    if (!strcmp(a, "--mpi") || !strcmp(a, "--launcher")) { A->mpi = 1; continue; }
    if (!strcmp(a, "--nccl")) { A->nccl = 1; continue; }
    if (!strcmp(a, "--tensors")) { A->tensors = 1; continue; }
    if (!strcmp(a, "--async-save")) { A->ck.async_save = 1; continue; }
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(); return 0; }
    if (!v) { usage(); return 2; }
    i++;
    if (!strcmp(a, "--mesh")) A->mesh = v;
    else if (!strcmp(a, "--steps")) A->steps = atoi(v);
    else if (!strcmp(a, "--layers")) c->n_layer = atoi(v);
    else if (!strcmp(a, "--dmodel")) c->d_model = atoi(v);
    else if (!strcmp(a, "--heads")) c->n_head = atoi(v);
    else if (!strcmp(a, "--seq")) c->seq = atoi(v);
    else if (!strcmp(a, "--batch")) c->batch = atoi(v);
    else if (!strcmp(a, "--microbatches")) c->micro = atoi(v);
    else if (!strcmp(a, "--lr")) c->lr = (float)atof(v);
    else if (!strcmp(a, "--seed")) c->seed = strtoull(v, NULL, 0);
    else if (!strcmp(a, "--data")) A->data_path = v;
    else if (!strcmp(a, "--svg")) A->svg = v;
    else if (!strcmp(a, "--tol")) A->tol = atof(v);
    else if (!strcmp(a, "--ptol")) A->ptol = atof(v);
    else if (!strcmp(a, "--every")) A->every = atoi(v);
    else if (!strcmp(a, "--moe")) c->moe = atoi(v);
    else if (!strcmp(a, "--topk")) c->topk = atoi(v);
    else if (!strcmp(a, "--ep")) c->ep = atoi(v);
    else if (!strcmp(a, "--etp")) c->etp = atoi(v);
    else if (!strcmp(a, "--dense-layers")) c->dense_layers = atoi(v);
    else if (!strcmp(a, "--aux-coef")) c->aux_coef = (float)atof(v);
    else if (!strcmp(a, "--save")) A->ck.save_dir = v;
    else if (!strcmp(a, "--save-at")) A->ck.save_at = atoi(v);
    else if (!strcmp(a, "--resume")) A->ck.resume_dir = v;
    else if (!strcmp(a, "--trace")) A->trace = v;
    else { usage(); return 2; }
  }
  if (A->steps < 1 || A->every < 0 || (A->mpi && A->nccl)) { usage(); return 2; }
  char why[320];
  if (gpt_ckpt_check_opts(&A->ck, A->steps, why, sizeof why))
    return fprintf(stderr, "gpt: %s\n", why), 2;
  if (A->every == 0) A->every = A->steps <= 30 ? 1 : (A->steps + 19) / 20;
  if (A->trace && (!A->trace[0] || (mkdir(A->trace, 0777) && errno != EEXIST)))
    return fprintf(stderr, "gpt: --trace %s: %s\n", A->trace,
                   A->trace[0] ? strerror(errno) : "empty directory name"), 2;
  return -1;
}

/* --trace: DIR/trace.svg and DIR/trace.json from this run's dumps (those
 * of rank 0's job: an earlier run's files in DIR are left out), the
 * stragglers marked, and the straggler verdict printed.  0 or -1. */
static int write_trace(const char *dir) {
  tr_rank *rs = NULL;
  int n = 0, k = 0, rc = -1;
  char err[600], svg[4096], js[4096];
  ts_report rep = {0};
  tr_slow *slow = NULL;
  if (tr_read_dir(dir, &rs, &n, err, sizeof err)) goto out;
  if (rs[0].rank != 0) {
    snprintf(err, sizeof err, "%s: no dump of rank 0", dir);
    goto out;
  }
  for (int i = 0; i < n; i++) /* keep this run's */
    if (!strcmp(rs[i].job, rs[0].job) && rs[i].world == rs[0].world) {
      if (k != i) {
        tr_rank tmp = rs[k];
        rs[k] = rs[i], rs[i] = tmp;
      }
      k++;
    }
  if (ts_analyze(rs, k, &rep, err, sizeof err)) goto out;
  if (!(slow = calloc((size_t)rep.nstragglers + 1, sizeof *slow))) {
    snprintf(err, sizeof err, "out of memory");
    goto out;
  }
  for (int i = 0; i < rep.nstragglers; i++) slow[i].rank = rep.stragglers[i];
  tr_marks marks = {.slow = slow, .nslow = rep.nstragglers};
  snprintf(svg, sizeof svg, "%s/trace.svg", dir);
  snprintf(js, sizeof js, "%s/trace.json", dir);
  if (tr_write_svg_marked(rs, k, rs[0].world, &marks, svg, err, sizeof err) ||
      tr_write_chrome_marked(rs, k, rs[0].world, &marks, js, err, sizeof err))
    goto out;
  printf("wrote %s (%d of %d ranks) and %s\n", svg, k, rs[0].world, js);
  printf("trace: %s\n", rep.verdict);
  rc = 0;
out:
  if (rc) fprintf(stderr, "gpt: --trace: %s\n", err);
  free(slow);
  ts_report_free(&rep);
  tr_ranks_free(rs, n);
  return rc;
}

/* The config on the mesh (MoE: one load-balancing group per micro-batch
 * of a dp rank; ep 1 and etp tp by default); NULL if fine, else why not. */
static const char *check_config(gpt_config *c, const gpt_dims *d, int sp, size_t len) {
  if (c->moe > 0) {
    c->aux_seqs = d->dp * c->micro > 0 ? c->batch / (d->dp * c->micro) : 0;
    if (c->ep < 1) c->ep = 1;
    if (c->etp < 1) c->etp = d->tp;
  }
  const char *why = gpt_config_check(c, d->tp, d->pp, d->dp, d->cp, sp);
  if (!why && c->moe > 0) {
    why = gpt_moe_check(c, d->tp, d->pp, d->dp, d->cp, sp, c->ep, c->etp);
    if (!why && d->hsdp) why = "--moe needs a \"dp\" dim (not dp_replicate / dp_shard)";
  } else if (!why && (c->ep > 1 || c->etp > 1)) {
    why = "--ep and --etp need --moe";
  }
  return why ? why : len < (size_t)c->seq + 2 ? "data too short" : NULL;
}

static void print_setup(const args *A, const gpt_dims *d, size_t len, double ent) {
  const gpt_config *c = &A->c;
  printf("data %s: %zu bytes, unigram entropy %.4f nats (uniform: %.4f)\n", A->data_path, len,
         ent, log(256.0));
  printf("model: layers %d, dmodel %d, heads %d, seq %d; batch %d, microbatches %d, lr %g, "
         "seed %llu\n", c->n_layer, c->d_model, c->n_head, c->seq, c->batch, c->micro,
         (double)c->lr, (unsigned long long)c->seed);
  if (d->hsdp)
    printf("mesh pp=%d,dp_replicate=%d,dp_shard=%d,cp=%d,tp=%d", d->pp, d->dp_rep, d->dp_shard,
           d->cp, d->tp);
  else
    printf("mesh pp=%d,dp=%d,cp=%d,tp=%d", d->pp, d->dp, d->cp, d->tp);
  printf("%s%s (%d %s)\n", A->sp ? " + sp" : "", A->shard ? " + shard" : "",
         d->pp * d->dp * d->cp * d->tp,
         A->mpi ? "MPI processes" : A->nccl ? "thread ranks on NCCL" : "thread ranks");
  if (c->moe > 0)
    printf("moe: %d experts, top-%d, layers %d..%d (%d dense first), aux coef %g over "
           "groups of %d sequences; expert grid ep=%d, etp=%d, edp=%d\n",
           c->moe, c->topk, c->dense_layers, c->n_layer - 1, c->dense_layers,
           (double)c->aux_coef, c->aux_seqs, c->ep, c->etp,
           d->pp * d->dp * d->cp * d->tp / (d->pp * c->ep * c->etp));
  fflush(stdout);
}

/* The reference's run: its final model, per-step losses and step 1's
 * gradients. */
typedef struct refrun {
  gpt_model model;
  double *loss, *aux, *imb;
  float **g1;
  double secs;
} refrun;

/* The loss table from the first step this run trained (with MoE the aux
 * loss, part of the loss, compared on its own too, and the
 * tokens-per-expert imbalance, max / mean over experts in the worst MoE
 * layer); the largest errors of loss and aux into err[0], err[1]. */
static void loss_table(const args *A, const gpt_par_result *res, const refrun *R,
                       double err[2]) {
  const int moe = A->c.moe > 0, start = res->start, steps = A->steps;
  if (moe)
    printf("\n%6s %12s %12s %10s %12s %12s %10s %8s %8s\n", "step", "loss", "ref loss",
           "rel err", "aux", "ref aux", "rel err", "imbal", "ref");
  else
    printf("\n%6s %12s %12s %12s\n", "step", "loss", "ref loss", "rel err");
  err[0] = err[1] = 0.0;
  for (int s = start; s < steps; s++) {
    double e = fabs(res->loss[s] - R->loss[s]) / fabs(R->loss[s]);
    double ea = moe && R->aux[s] != 0 ? fabs(res->aux[s] - R->aux[s]) / fabs(R->aux[s]) : 0.0;
    if (moe && R->aux[s] == 0) ea = fabs(res->aux[s]);
    err[0] = fmax(err[0], e);
    err[1] = fmax(err[1], ea);
    if (s == start || (s + 1) % A->every == 0 || s == steps - 1) {
      if (moe)
        printf("%6d %12.6f %12.6f %10.3e %12.6f %12.6f %10.3e %8.3f %8.3f\n", s + 1,
               res->loss[s], R->loss[s], e, res->aux[s], R->aux[s], ea, res->imbalance[s],
               R->imb[s]);
      else
        printf("%6d %12.6f %12.6f %12.3e\n", s + 1, res->loss[s], R->loss[s], e);
    }
  }
}

/* The comparison, on the root; returns 1 on PASS. */
static int report(const args *A, const gpt_par_result *res, const refrun *R, double ent,
                  double par_s) {
  const gpt_config *c = &A->c;
  const int start = res->start, steps = A->steps;
  if (A->ck.save_dir)
    printf("\nsaved checkpoint %s after step %d%s\n", A->ck.save_dir, A->ck.save_at,
           A->ck.async_save ? " (async: written while training went on)" : "");
  if (A->ck.resume_dir)
    printf("\nresumed from checkpoint %s at step %d: steps %d..%d and the final parameters "
           "against the reference trained from step 0\n", A->ck.resume_dir, start, start + 1,
           steps);
  double err[2];
  loss_table(A, res, R, err);
  if (A->tensors)
    printf("\nrelative error ||a - ref|| / ||ref|| per tensor shard (max over ranks)\n"
           "  %-14s %10s  %12s  %12s\n", "tensor", "elements", "grad step 1", "param final");
  double max_param_err = 0.0, max_grad_err = 0.0;
  for (int id = 0; id < res->nt; id++) {
    char name[48];
    if (!R->model.p[id]) continue; /* the dense MLP ids of an MoE layer: no such tensor */
    gpt_tensor_name_cfg(c, id, name, sizeof name);
    if (A->tensors)
      printf("  %-14s %10zu  %12.3e  %12.3e\n", name, gpt_tensor_count(c, id, 1),
             res->grad_err[id], res->param_err[id]);
    max_param_err = fmax(max_param_err, res->param_err[id]);
    max_grad_err = fmax(max_grad_err, res->grad_err[id]);
  }
  if (A->tensors) printf("(param final: qkv.b without its key part, see train.h)\n");
  char gerr[32] = "n/a (resumed)"; /* step 1's gradients: not in a resumed run */
  if (start == 0) snprintf(gerr, sizeof gerr, "%.3e", max_grad_err);
  printf("\nmax rel err: loss %.3e, grad (step 1) %s (tolerance %.1e); param %.3e "
         "(tolerance %.1e)\n", err[0], gerr, A->tol, max_param_err, A->ptol);
  if (c->moe > 0)
    printf("moe: aux loss max rel err %.3e (tolerance %.1e); last step aux %.6f, tokens per "
           "expert max/mean %.3f (reference %.3f)\n", err[1], A->tol, res->aux[steps - 1],
           res->imbalance[steps - 1], R->imb[steps - 1]);
  printf("final loss %.4f vs unigram entropy %.4f; reference %.2f s, parallel %.2f s "
         "(%.1f ms per step after the first)\n",
         res->loss[steps - 1], ent, R->secs, par_s, 1e3 * res->step_s);
  if (res->comm_frac >= 0)
    printf("exposed communication: %.1f %% of a step on the most exposed rank (blocking "
           "collectives, p2p incl. pipeline bubbles, the sync's waits)\n",
           100.0 * res->comm_frac);
  const int pass = err[0] <= A->tol && max_grad_err <= A->tol && max_param_err <= A->ptol &&
                   err[1] <= A->tol;
  printf("%s\n", pass ? "PASS" : "FAIL");
  if (A->svg) {
    write_svg(A->svg, res->loss + start, R->loss + start, steps - start, start + 1, ent);
    printf("wrote %s\n", A->svg);
  }
  return pass;
}

int main(int argc, char **argv) {
  args A = {.c = {.n_layer = 2, .d_model = 32, .n_head = 4, .seq = 32, .batch = 8, .micro = 2,
                  .lr = 3e-3f, .seed = 1, .moe = 0, .topk = 2, .dense_layers = 0,
                  .aux_coef = 0.01f, .ep = 0, .etp = 0},
            .mesh = "pp=2,dp=2,tp=2", .data_path = GPT_DEFAULT_DATA, .steps = 20,
            .tol = 1e-4, .ptol = 1e-3};
  int rc = parse_args(argc, argv, &A);
  if (rc >= 0) return rc;
  gpt_dims d;
  if (gpt_parse_mesh(A.mesh, &d)) return fprintf(stderr, "gpt: bad --mesh \"%s\"\n", A.mesh), 2;
  size_t len = 0;
  uint8_t *data = read_file(A.data_path, &len);
  if (!data) return fprintf(stderr, "gpt: cannot read %s\n", A.data_path), 1;
  const char *why = check_config(&A.c, &d, A.sp, len);
  int root = 1; /* with --mpi only rank 0 prints (its rank from the launcher) */
  if (!why && A.mpi) {
    mpg_launch L = MPG_LAUNCH_INIT;
    if (mpg_launch_from_env(&L) != MPG_OK || L.rank < 0) why = "--mpi: no launcher environment";
    root = L.rank == 0;
  }
  if (why) return free(data), fprintf(stderr, "gpt: %s\n", why), 2;
  const double ent = gpt_unigram_entropy(data, len);
  if (root) print_setup(&A, &d, len, ent);

  refrun R = {.loss = calloc((size_t)A.steps, sizeof(double)),
              .aux = calloc((size_t)A.steps, sizeof(double)),
              .imb = calloc((size_t)A.steps, sizeof(double))};
  gpt_par_result res;
  memset(&res, 0, sizeof res);
  int pass = 0;
  double t0 = now();
  if (!R.loss || !R.aux || !R.imb ||
      gpt_reference_train_moe(&A.c, data, len, A.steps, &R.model, R.loss, R.aux, R.imb,
                              &R.g1) || !R.g1) {
    fprintf(stderr, "gpt: reference failed\n");
    goto out;
  }
  R.secs = now() - t0, t0 = now();
  gpt_par_opts po = {A.sp, A.shard, A.mpi, A.nccl, 0};
  gpt_set_trace(A.trace);
  if (gpt_parallel_train_ckpt(&A.c, data, len, A.mesh, &po, &A.ck, A.steps, &R.model, R.g1,
                              &res)) {
    fprintf(stderr, "gpt: %s\n", res.error);
    goto out;
  }
  /* only the root reports (--mpi) */
  pass = res.root ? report(&A, &res, &R, ent, now() - t0) : 1;
  if (res.root && A.trace && write_trace(A.trace)) pass = 0;
out:
  gpt_par_result_free(&res);
  for (int id = 0; R.g1 && id < R.model.nt; id++) free(R.g1[id]);
  free(R.g1), free(R.loss), free(R.aux), free(R.imb), free(data);
  gpt_model_free(&R.model);
  return pass ? 0 : 1;
}
