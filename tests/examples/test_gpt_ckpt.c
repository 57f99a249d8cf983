/* Checkpoints of the GPT example (examples/gpt/ckpt.h: gpt --save DIR
 * --save-at K [--async-save], gpt --resume DIR).
 *
 * Each pair trains 10 steps under one mesh and saves, then resumes under
 * another mesh and trains to step 20; the resumed run must equal the
 * single-process reference trained 20 steps without a stop (the losses of
 * steps 11..20 to 1e-4, every final parameter shard to 1e-3: gpt_main.c's
 * tolerances), and the saving run's 10 losses the reference's first 10.
 * The pairs change dp, tp, cp, pp, ep and etp, replicate / shard / HSDP,
 * and uneven shards; each runs on thread ranks and as mpirun jobs of the
 * gpt program (--mpi).  An async save (training going on while it is
 * written) resumed under the same mesh continues bit for bit; resuming
 * from a directory that is no checkpoint fails cleanly.  The layout each
 * tensor is registered with (its global shape and its tp / etp split) is
 * checked element by element against the model's own shard mapping
 * (gpt_shard_to_full), and `meshpg ckpt export` of a save of tp and etp
 * shards gives the reference's whole tensors.
 *
 * Built again on the CUDA/NCCL test double (GPT_CKPT_ON_DOUBLE,
 * test_gpt_ckpt_on_double): a run with --nccl (device buffers) saves, a
 * run on thread ranks (host buffers) resumes; and an NCCL run in
 * replicate mode saves, one in shard mode resumes. */
#define _XOPEN_SOURCE 700
#include <criterion/criterion.h>

#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ckpt.h"
#include "moe.h"
#include "train.h"
#include "gpt_data.h"
#include "../support/clock.h"
#include "../support/run_util.h"

#ifdef GPT_CKPT_ON_DOUBLE
#include "double.h"
#endif

enum { SAVE_AT = 10, STEPS = 20 };

/* The smallest configs of test_gpt.c / test_gpt_moe.c. */
static const gpt_config base_cfg = {.n_layer = 2, .d_model = 32, .n_head = 4, .seq = 16,
                                    .batch = 4, .micro = 2, .lr = 3e-3f, .seed = 7};
#ifndef GPT_CKPT_ON_DOUBLE
static const gpt_config moe_cfg = {.n_layer = 2, .d_model = 32, .n_head = 4, .seq = 16,
                                   .batch = 8, .micro = 2, .lr = 3e-3f, .seed = 7,
                                   .moe = 4, .topk = 2, .dense_layers = 0,
                                   .aux_coef = 0.05f, .aux_seqs = 0, .ep = 1, .etp = 0};
#endif

/* One side of a pair: a mesh and how it trains. */
typedef struct side {
  const char *mesh;
  int sp, shard, ep, etp, nccl;
} side;

static void side_name(const side *s, char *buf, size_t n) {
  snprintf(buf, n, "%s%s%s%s", s->mesh, s->sp ? " --sp" : "", s->shard ? " --shard" : "",
           s->nccl ? " --nccl" : "");
  if (s->ep || s->etp)
    snprintf(buf + strlen(buf), n - strlen(buf), " --ep %d --etp %d", s->ep, s->etp);
}

/* ---- temporary directories ------------------------------------------------ */

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *f) {
  (void)sb, (void)flag, (void)f;
  return remove(p);
}

/* A fresh directory; the checkpoint goes to <dir>/ck. */
static void temp_dir(char *dir, size_t n, char *ck, size_t m) {
  const char *tmp = getenv("TMPDIR");
  snprintf(dir, n, "%s/gpt_ckpt_XXXXXX", tmp && *tmp ? tmp : "/tmp");
  cr_assert_not_null(mkdtemp(dir), "mkdtemp(%s) failed", dir);
  snprintf(ck, m, "%s/ck", dir);
}

static void rm_tree(const char *dir) { nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS); }

#ifndef GPT_CKPT_ON_DOUBLE
/* ---- the registered layouts ----------------------------------------------- */

/* The box of shard r of `parts` of tensor id, row-major in the box, mapped
 * into the global shape, must be gpt_shard_to_full's element for every
 * element of the shard. */
static void check_layout(const gpt_config *c, int id, int parts, int r) {
  mpg_tensor_layout L;
  char name[48];
  gpt_tensor_name_cfg(c, id, name, sizeof name);
  const int nd = gpt_tensor_layout(c, id, &L);
  cr_assert(nd >= 1 && nd <= MPG_CKPT_MAX_NDIM && nd == L.ndim, "%s: ndim %d", name, nd);
  size_t total = 1, off[MPG_CKPT_MAX_NDIM] = {0}, box[MPG_CKPT_MAX_NDIM];
  for (int a = 0; a < nd; a++) total *= L.shape[a], box[a] = L.shape[a];
  cr_assert_eq(total, gpt_tensor_count(c, id, 1), "%s: global shape of %zu elements, not %zu",
               name, total, gpt_tensor_count(c, id, 1));
  const int split = gpt_tensor_split(c, id);
  if (split == GPT_REPLICATED) {
    cr_assert_null(L.split_dims, "%s is replicated", name);
    if (parts > 1) return;
  } else {
    cr_assert_str_eq(L.split_dims, split == GPT_SPLIT_ETP ? "etp" : "tp", "%s", name);
    cr_assert(L.split_axis >= 0 && L.split_axis < nd, "%s: split axis %d", name, L.split_axis);
    cr_assert_eq(L.shape[L.split_axis] % (size_t)parts, 0, "%s", name);
    box[L.split_axis] = L.shape[L.split_axis] / (size_t)parts;
    off[L.split_axis] = (size_t)r * box[L.split_axis];
  }
  const size_t n = gpt_tensor_count(c, id, parts);
  size_t bn = 1;
  for (int a = 0; a < nd; a++) bn *= box[a];
  cr_assert_eq(bn, n, "%s shard %d of %d: box of %zu elements, shard of %zu", name, r, parts,
               bn, n);
  for (size_t i = 0; i < n; i++) {
    size_t rest = i, g = 0, stride = 1;
    for (int a = nd - 1; a >= 0; a--) {
      g += (off[a] + rest % box[a]) * stride;
      rest /= box[a], stride *= L.shape[a];
    }
    const size_t f = gpt_shard_to_full(c, id, parts, r, i);
    if (g != f)
      cr_assert_fail("%s shard %d of %d: element %zu is global %zu in the box, %zu in the "
                     "model", name, r, parts, i, g, f);
  }
}

Test(gpt_ckpt, layout_matches_shards) {
  gpt_config cs[2] = {base_cfg, moe_cfg};
  cs[1].dense_layers = 1, cs[1].aux_seqs = 1; /* a dense layer, then an MoE one */
  int checked = 0;
  for (int k = 0; k < 2; k++)
    for (int id = 0; id < gpt_num_tensors(&cs[k]); id++)
      for (int parts = 1; parts <= 4; parts *= 2)
        for (int r = 0; r < parts; r++, checked++) check_layout(&cs[k], id, parts, r);
  cr_log_info("%d (tensor, shard) layouts checked", checked);
}

/* The trainer record: equal configs pass, another one is named. */
Test(gpt_ckpt, trainer_record) {
  size_t len;
  uint8_t *data = load_data(&len);
  gpt_ckpt_trainer a, b;
  char why[320];
  gpt_config c = base_cfg;
  gpt_ckpt_trainer_init(&a, &c, data, len);
  gpt_ckpt_trainer_init(&b, &c, data, len);
  cr_expect_null(gpt_ckpt_trainer_check(&a, &b, why, sizeof why));
  c.d_model = 20;
  gpt_ckpt_trainer_init(&b, &c, data, len);
  cr_expect_not_null(gpt_ckpt_trainer_check(&a, &b, why, sizeof why));
  cr_expect(strstr(why, "--dmodel 32") && strstr(why, "has 20"), "%s", why);
  gpt_ckpt_trainer_init(&b, &base_cfg, data, len - 1);
  cr_expect_not_null(gpt_ckpt_trainer_check(&a, &b, why, sizeof why));
  free(data);
}
#endif

/* ---- pairs on thread ranks (and NCCL on the double) ----------------------- */

typedef struct reference {
  gpt_model model;
  double loss[STEPS], aux[STEPS], imb[STEPS];
} reference;

static int mesh_dp(const char *mesh) {
  gpt_dims d;
  cr_assert_eq(gpt_parse_mesh(mesh, &d), 0, "bad mesh %s", mesh);
  return d.dp;
}

/* Train `steps` steps on side s with checkpoint options ck. */
static void train_side(const gpt_config *cfg, const side *s, const gpt_ckpt_opts *ck, int steps,
                       const reference *ref, int keep, gpt_par_result *res) {
  gpt_config c = *cfg;
  if (c.moe > 0) c.ep = s->ep, c.etp = s->etp;
  gpt_par_opts o = {s->sp, s->shard, 0, s->nccl, keep};
  char what[160];
  side_name(s, what, sizeof what);
  size_t len;
  uint8_t *data = load_data(&len);
  int rc = gpt_parallel_train_ckpt(&c, data, len, s->mesh, &o, ck, steps,
                                   ref ? &ref->model : NULL, NULL, res);
  free(data);
  cr_assert_eq(rc, 0, "%s: %s", what, res->error);
}

/* Largest relative error of losses [from, to) against the reference. */
static double loss_err(const char *what, const gpt_par_result *res, const reference *ref,
                       int from, int to) {
  double worst = 0;
  for (int s = from; s < to; s++) {
    const double e = fabs(res->loss[s] - ref->loss[s]) / fabs(ref->loss[s]);
    cr_expect_leq(e, 1e-4, "%s step %d: loss %.8f, reference %.8f", what, s + 1, res->loss[s],
                  ref->loss[s]);
    if (res->aux)
      cr_expect_leq(fabs(res->aux[s] - ref->aux[s]), 1e-4 * fabs(ref->aux[s]),
                    "%s step %d: aux loss %.8f, reference %.8f", what, s + 1, res->aux[s],
                    ref->aux[s]);
    worst = fmax(worst, e);
  }
  return worst;
}

/* The resumed run's final parameters: every tensor of the model compared
 * (held by some rank), within 1e-3; no step-1 gradients. */
static double param_err(const char *what, const gpt_config *c, const gpt_par_result *res,
                        const reference *ref) {
  double worst = 0;
  for (int id = 0; id < res->nt; id++) {
    char name[48];
    gpt_tensor_name_cfg(c, id, name, sizeof name);
    cr_expect(res->grad_err[id] < 0, "%s: step-1 gradient of %s compared after a resume",
              what, name);
    if (!ref->model.p[id]) continue; /* a dense MLP id of an MoE layer */
    cr_expect(res->param_err[id] >= 0 && res->param_err[id] <= 1e-3,
              "%s: %s after step %d: rel err %.3e", what, name, STEPS, res->param_err[id]);
    worst = fmax(worst, res->param_err[id]);
  }
  return worst;
}

static void ref_train(const gpt_config *c, reference *r) {
  size_t len;
  uint8_t *data = load_data(&len);
  memset(r, 0, sizeof *r);
  cr_assert_eq(gpt_reference_train_moe(c, data, len, STEPS, &r->model, r->loss, r->aux, r->imb,
                                       NULL), 0);
  free(data);
}

/* Save under a after SAVE_AT steps, resume under b to STEPS, compare. */
static void pair(const gpt_config *cfg, const side *a, const side *b) {
  gpt_config c = *cfg;
  if (c.moe > 0) {
    c.aux_seqs = c.batch / (mesh_dp(a->mesh) * c.micro);
    cr_assert_eq(c.aux_seqs, c.batch / (mesh_dp(b->mesh) * c.micro),
                 "the pair changes the load-balancing groups");
  }
  char na[160], nb[160], what[340], dir[256], ck[300];
  side_name(a, na, sizeof na);
  side_name(b, nb, sizeof nb);
  snprintf(what, sizeof what, "%s -> %s", na, nb);
  reference ref;
  ref_train(&c, &ref);
  temp_dir(dir, sizeof dir, ck, sizeof ck);
  gpt_par_result ra, rb;
  const gpt_ckpt_opts save = {ck, SAVE_AT, 0, NULL}, resume = {NULL, 0, 0, ck};
  train_side(&c, a, &save, SAVE_AT, NULL, 0, &ra);
  const double l_save = loss_err(na, &ra, &ref, 0, SAVE_AT);
  cr_expect_eq(ra.start, 0);
  train_side(&c, b, &resume, STEPS, &ref, 0, &rb);
  cr_expect_eq(rb.start, SAVE_AT, "%s: resumed at step %d", what, rb.start);
  const double l = loss_err(what, &rb, &ref, SAVE_AT, STEPS), p = param_err(what, &c, &rb, &ref);
  cr_log_info("%s: max rel err loss %.3e, params %.3e (saving run's loss %.3e)", what, l, p,
              l_save);
  fprintf(stderr, "ckpt pair %s: max rel err loss %.3e, params %.3e (saving run's loss %.3e)\n",
          what, l, p, l_save);
  gpt_par_result_free(&ra);
  gpt_par_result_free(&rb);
  gpt_model_free(&ref.model);
  rm_tree(dir);
}

#ifndef GPT_CKPT_ON_DOUBLE
/* The pairs run on thread ranks (pair) and as mpirun jobs (mpirun_pair),
 * one row a test: the config (moe_cfg or base_cfg, with batch, micro and
 * d_model where not 0) and the saving and resuming sides. */
typedef struct pair_row {
  int moe, batch, micro, d_model;
  side a, b;
} pair_row;

static const pair_row pair_rows[] = {
    /* tp, cp and sp gone; the owned ranges of 8 dp shards */
    {0, 8, 1, 0, {"tp=2,cp=2,dp=2", 1, 1, 0, 0, 0}, {"dp=8", 0, 1, 0, 0, 0}},
    /* replicate mode with pp and the tied wte -> tp 4 in shard mode */
    {0, 0, 0, 0, {"pp=2,dp=2,tp=2", 1, 0, 0, 0, 0}, {"tp=4,dp=2", 1, 1, 0, 0, 0}},
    /* whole moments -> owned ranges, all-reduced over dp_replicate */
    {0, 8, 0, 0, {"dp=4", 0, 0, 0, 0, 0}, {"dp_replicate=2,dp_shard=2", 0, 1, 0, 0, 0}},
    /* experts over ep 2 (whole) -> ep 4, each split over etp 2 */
    {1, 0, 0, 0, {"dp=4,tp=2", 1, 1, 2, 1, 0}, {"dp=4,tp=2", 1, 1, 4, 2, 0}},
    /* three shards of sizes not divisible by 3 -> two */
    {0, 6, 1, 20, {"dp=3", 0, 1, 0, 0, 0}, {"dp=2", 0, 1, 0, 0, 0}},
};

/* Row k of pair_rows run by fn. */
static void run_pair_row(int k, void (*fn)(const gpt_config *, const side *, const side *)) {
  const pair_row *r = &pair_rows[k];
  gpt_config c = r->moe ? moe_cfg : base_cfg;
  if (r->batch) c.batch = r->batch;
  if (r->micro) c.micro = r->micro;
  if (r->d_model) c.d_model = r->d_model;
  fn(&c, &r->a, &r->b);
}

Test(gpt_ckpt, tp2_cp2_dp2_sp_shard_to_dp8_shard, .timeout = 300) { run_pair_row(0, pair); }
Test(gpt_ckpt, pp2_dp2_tp2_sp_to_tp4_dp2_sp_shard, .timeout = 300) { run_pair_row(1, pair); }
Test(gpt_ckpt, dp4_to_hsdp, .timeout = 300) { run_pair_row(2, pair); }
Test(gpt_ckpt, moe_ep2_etp1_to_ep4_etp2_shard, .timeout = 300) { run_pair_row(3, pair); }
Test(gpt_ckpt, dp3_uneven_shard_to_dp2_shard, .timeout = 300) { run_pair_row(4, pair); }

/* A saving job SIGKILLed at random moments while it writes a new
 * checkpoint over the old one (saved at step 5) in the same directory:
 * the directory then resumes, from step 5 or step 10, and PASSes against
 * the uninterrupted reference.  (tests/ckpt/test_ckpt_kill checks the
 * same on the library's own data, 20 moments.) */
static double timed_child(const gpt_config *c, const side *s, const gpt_ckpt_opts *o,
                          double kill_after) {
  fflush(NULL);
  double t0 = now_s();
  pid_t pid = fork();
  cr_assert_neq(pid, -1);
  if (pid == 0) {
    gpt_par_result r;
    train_side(c, s, o, o->save_at, NULL, 0, &r);
    _exit(0);
  }
  if (kill_after >= 0) {
    usleep((useconds_t)(kill_after * 1e6));
    kill(pid, SIGKILL);
  }
  int status = 0;
  cr_assert_eq(waitpid(pid, &status, 0), pid);
  if (kill_after < 0) cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  return now_s() - t0;
}

Test(gpt_ckpt, sigkill_during_save_resumes_the_old_or_the_new, .timeout = 300) {
  const char *san = getenv("MESHPG_SANITIZER");
  if (san && strstr(san, "thread")) /* TSan cannot fork a process with threads */
    cr_skip_test("a TSan build: fork() of a multi-threaded process; the plain and ASan builds run it");
  gpt_config c = base_cfg;
  const side s = {"dp=2,tp=2", 1, 1, 0, 0, 0};
  reference ref;
  ref_train(&c, &ref);
  char dir[256], ck[300];
  temp_dir(dir, sizeof dir, ck, sizeof ck);
  const gpt_ckpt_opts first = {ck, 5, 0, NULL}, second = {ck, SAVE_AT, 0, NULL},
                      resume = {NULL, 0, 0, ck};
  const double T = timed_child(&c, &s, &second, -1); /* one whole run, saving at 10 */
  const int trials = getenv("MESHPG_SANITIZER") ? 1 : 6;
  int from5 = 0, from10 = 0;
  for (int t = 0; t < trials; t++) {
    rm_tree(dir);
    cr_assert_eq(mkdir(dir, 0755), 0);
    (void)timed_child(&c, &s, &first, -1);
    /* from well before the save to just after it: both outcomes occur */
    (void)timed_child(&c, &s, &second, T * (0.75 + 0.3 * t / (double)trials));
    gpt_par_result r;
    train_side(&c, &s, &resume, STEPS, &ref, 0, &r);
    cr_assert(r.start == 5 || r.start == SAVE_AT, "trial %d: resumed at step %d", t, r.start);
    from5 += r.start == 5, from10 += r.start == SAVE_AT;
    (void)loss_err("killed save", &r, &ref, r.start, STEPS);
    (void)param_err("killed save", &c, &r, &ref);
    gpt_par_result_free(&r);
  }
  cr_log_info("%d kills: resumed %d times from the old checkpoint, %d from the new", trials,
              from5, from10);
  gpt_model_free(&ref.model);
  rm_tree(dir);
}

/* --async-save: the save is written while steps 11..20 train on; resumed
 * under the same mesh, steps 11..20 and every rank's final parameters are
 * those of the run that saved, bit for bit. */
Test(gpt_ckpt, async_save_resumes_bit_for_bit, .timeout = 300) {
  const gpt_config c = base_cfg;
  const side s = {"tp=2,dp=2", 1, 1, 0, 0, 0};
  reference ref;
  ref_train(&c, &ref);
  char dir[256], ck[300];
  temp_dir(dir, sizeof dir, ck, sizeof ck);
  gpt_par_result ra, rb;
  const gpt_ckpt_opts save = {ck, SAVE_AT, 1, NULL}, resume = {NULL, 0, 0, ck};
  train_side(&c, &s, &save, STEPS, &ref, 1, &ra);
  const double la = loss_err("async save", &ra, &ref, 0, STEPS);
  train_side(&c, &s, &resume, STEPS, &ref, 1, &rb);
  const double l = loss_err("resumed from the async save", &rb, &ref, SAVE_AT, STEPS);
  const double p = param_err("resumed from the async save", &c, &rb, &ref);
  for (int k = SAVE_AT; k < STEPS; k++)
    cr_expect(memcmp(&ra.loss[k], &rb.loss[k], sizeof(double)) == 0,
              "step %d: loss %.17g after the resume, %.17g in the saving run", k + 1,
              rb.loss[k], ra.loss[k]);
  int tensors = 0;
  for (int i = 0; i < ra.world * ra.nt; i++) {
    cr_assert_eq(ra.rank_count[i], rb.rank_count[i]);
    if (!ra.rank_params[i]) continue;
    tensors++;
    cr_expect(memcmp(ra.rank_params[i], rb.rank_params[i], ra.rank_count[i] * sizeof(float)) == 0,
              "rank %d tensor %d differs after the resume", i / ra.nt, i % ra.nt);
  }
  cr_assert_gt(tensors, 0);
  cr_log_info("async save, %s -> same: max rel err loss %.3e, params %.3e (saving run %.3e); "
              "bit for bit", s.mesh, l, p, la);
  fprintf(stderr, "ckpt async %s --sp --shard: max rel err loss %.3e, params %.3e (saving run "
          "%.3e); %d rank tensors bit for bit\n", s.mesh, l, p, la, tensors);
  gpt_par_result_free(&ra);
  gpt_par_result_free(&rb);
  gpt_model_free(&ref.model);
  rm_tree(dir);
}

/* The checkpoint holds global tensors: `meshpg ckpt export` (no mesh, no
 * ranks) consolidates a save of tp 2 and etp 2 shards into whole tensors,
 * which must be the reference's after the same steps (params within 1e-3,
 * the key part of qkv.b left out as in the comparison of train.h). */
static const float *safetensor(const unsigned char *f, size_t size, const char *name,
                               size_t n) {
  uint64_t hl = 0;
  for (int i = 7; i >= 0; i--) hl = hl << 8 | f[i];
  cr_assert(hl + 8 <= size, "safetensors header of %llu bytes", (unsigned long long)hl);
  char *hdr = strndup((const char *)f + 8, (size_t)hl), key[80];
  snprintf(key, sizeof key, "\"%s\":{", name);
  const char *at = strstr(hdr, key), *off = at ? strstr(at, "\"data_offsets\":[") : NULL;
  unsigned long long a = 0, b = 0;
  cr_assert(off && sscanf(off, "\"data_offsets\":[%llu,%llu]", &a, &b) == 2,
            "%s is not in the export", name);
  cr_assert(strstr(at, "\"dtype\":\"F32\"") < off, "%s is not F32", name);
  free(hdr);
  cr_assert_eq(b - a, n * sizeof(float), "%s: %llu bytes, the model has %zu elements", name,
               b - a, n);
  cr_assert(8 + hl + b <= size);
  return (const float *)(f + 8 + hl + a);
}

Test(gpt_ckpt, export_holds_global_tensors, .timeout = 300) {
  enum { K = 3 };
  gpt_config c = moe_cfg;
  c.dense_layers = 1, c.aux_seqs = c.batch / (4 * c.micro);
  const side s = {"dp=4,tp=2", 1, 1, 2, 2, 0};
  char dir[256], ck[300], st[320], cmd[4096];
  temp_dir(dir, sizeof dir, ck, sizeof ck);
  gpt_par_result res;
  const gpt_ckpt_opts save = {ck, K, 0, NULL};
  train_side(&c, &s, &save, K, NULL, 0, &res);
  gpt_par_result_free(&res);
  snprintf(st, sizeof st, "%s/all.safetensors", dir);
  snprintf(cmd, sizeof cmd, "'%s' ckpt export '%s' --safetensors '%s'",
           env_program("MESHPG_CLI"), ck, st);
  cr_assert_eq(run(cmd, NULL), 0, "%s:\n%s", cmd, out);
  FILE *f = fopen(st, "rb");
  cr_assert_not_null(f);
  static unsigned char file[1 << 22];
  const size_t size = fread(file, 1, sizeof file, f);
  fclose(f);
  size_t len;
  gpt_model ref;
  double rloss[K];
  uint8_t *data = reference_run(&c, K, &len, &ref, rloss, NULL);
  double worst = 0;
  int tensors = 0;
  for (int id = 0; id < ref.nt; id++) {
    if (!ref.p[id]) continue;
    char name[48];
    gpt_tensor_name_cfg(&c, id, name, sizeof name);
    const float *g = safetensor(file, size, name, ref.n[id]);
    const double e = gpt_shard_error(&c, id, 1, 0, g, ref.n[id], ref.p[id], 1);
    cr_expect_leq(e, 1e-3, "exported %s after step %d: rel err %.3e", name, K, e);
    worst = fmax(worst, e), tensors++;
  }
  cr_assert_eq(tensors, 4 + 12 + 8 + 1 + 4 * 4); /* globals, h0, h1 without fc: router, experts */
  cr_log_info("meshpg ckpt export: %d global tensors, max rel err %.3e", tensors, worst);
  fprintf(stderr, "ckpt export of %s --sp --shard --ep 2 --etp 2: %d global tensors equal the "
          "reference's, max rel err %.3e\n", s.mesh, tensors, worst);
  gpt_model_free(&ref);
  free(data);
  rm_tree(dir);
}

/* A directory that is no checkpoint: the run fails with the library's
 * error, on every rank, without a crash; a missing one before any rank
 * starts. */
Test(gpt_ckpt, resume_from_no_checkpoint_fails, .timeout = 120) {
  char dir[256], ck[300];
  temp_dir(dir, sizeof dir, ck, sizeof ck);
  FILE *f = fopen(ck, "w"); /* <dir>/ck: a plain file in the directory */
  cr_assert_not_null(f);
  fputs("not a checkpoint\n", f);
  fclose(f);
  const side s = {"dp=2", 0, 1, 0, 0, 0};
  gpt_par_opts o = {s.sp, s.shard, 0, 0, 0};
  const gpt_ckpt_opts resume = {NULL, 0, 0, dir}, missing = {NULL, 0, 0, ck};
  size_t len;
  uint8_t *data = load_data(&len);
  gpt_par_result res;
  int rc = gpt_parallel_train_ckpt(&base_cfg, data, len, s.mesh, &o, &resume, 4, NULL, NULL,
                                   &res);
  cr_expect_eq(rc, -1, "resumed from %s, which holds no checkpoint", dir);
  cr_expect(strlen(res.error) > 0);
  cr_log_info("resume from %s: %s", dir, res.error);
  fprintf(stderr, "resume from a directory that is no checkpoint: %s\n", res.error);
  gpt_par_result_free(&res);
  rc = gpt_parallel_train_ckpt(&base_cfg, data, len, s.mesh, &o, &missing, 4, NULL, NULL, &res);
  cr_expect_eq(rc, -1);
  cr_expect(strstr(res.error, "no such directory"), "%s", res.error);
  gpt_par_result_free(&res);
  free(data);
  rm_tree(dir);
}
#else
/* ---- NCCL on the double ----------------------------------------------------- */

/* Saved from device buffers (the sync's parameter views, device copies of
 * the AdamW state) on NCCL, resumed into host buffers on thread ranks. */
Test(gpt_ckpt_nccl, tp2_dp2_shard_nccl_to_dp4_shard_thread, .timeout = 600) {
  dbl_stats_t before, after;
  dbl_stats(&before);
  gpt_config c = base_cfg;
  c.batch = 8;
  pair(&c, &(side){"tp=2,dp=2", 0, 1, 0, 0, 1}, &(side){"dp=4", 0, 1, 0, 0, 0});
  dbl_stats(&after);
  cr_assert_gt(after.collectives, before.collectives, "the saving run used no NCCL");
}
/* Replicate mode saved from device copies of the host arrays (pp, tied
 * wte), resumed on NCCL in shard mode: the loaded parameters and state
 * staged from device memory to the host arrays. */
Test(gpt_ckpt_nccl, pp2_dp2_nccl_to_tp2_dp2_shard_nccl, .timeout = 600) {
  gpt_config c = base_cfg;
  c.batch = 8;
  pair(&c, &(side){"pp=2,dp=2", 0, 0, 0, 0, 1}, &(side){"tp=2,dp=2", 0, 1, 0, 0, 1});
}
#endif

#ifndef GPT_CKPT_ON_DOUBLE
/* ---- the gpt program: mpirun jobs, and its errors --------------------------- */
#include "../support/mpirun_util.h"

#ifdef GPT_TEST_MPI
/* The gpt flags of a config and a side. */
static void cfg_args(const gpt_config *c, const side *s, char *buf, size_t n) {
  int k = snprintf(buf, n, "--mesh %s%s%s --layers %d --dmodel %d --heads %d --seq %d "
                   "--batch %d --microbatches %d --lr %.9g --seed %llu", s->mesh,
                   s->sp ? " --sp" : "", s->shard ? " --shard" : "", c->n_layer, c->d_model,
                   c->n_head, c->seq, c->batch, c->micro, (double)c->lr,
                   (unsigned long long)c->seed);
  if (c->moe > 0)
    snprintf(buf + k, n - (size_t)k, " --moe %d --topk %d --dense-layers %d --aux-coef %.9g "
             "--ep %d --etp %d", c->moe, c->topk, c->dense_layers, (double)c->aux_coef, s->ep,
             s->etp);
}

static int world_of(const char *mesh) {
  gpt_dims d;
  cr_assert_eq(gpt_parse_mesh(mesh, &d), 0);
  return d.pp * d.dp * d.cp * d.tp;
}

/* Run the gpt program under mpirun; PASS required; the max rel errors of
 * the loss and params from its summary line. */
static void mpirun_gpt(const gpt_config *c, const side *s, const char *extra, double *l,
                       double *p) {
  char args[512], cmd[4096];
  cfg_args(c, s, args, sizeof args);
  const int np = world_of(s->mesh);
  snprintf(cmd, sizeof cmd, "timeout -k 5 240 " MPIRUN "-np %d '%s' --mpi %s %s", np,
           env_program("MESHPG_GPT_EXE"), args, extra);
  double secs = 0;
  int rc = run(cmd, &secs);
  cr_log_info("%s: exit %d after %.2f s", cmd, rc, secs);
  cr_assert_eq(rc, 0, "%s\nexit code %d after %.2f s; output:\n%s", cmd, rc, secs, out);
  char procs[32];
  snprintf(procs, sizeof procs, "%d MPI processes", np);
  cr_assert(strstr(out, procs), "%s", out);
  cr_assert(strstr(out, "\nPASS\n"), "%s\nno PASS line; output:\n%s", cmd, out);
  const char *m = strstr(out, "max rel err: loss "), *q = m ? strstr(m, "; param ") : NULL;
  cr_assert(m && q && sscanf(m, "max rel err: loss %lf", l) == 1 &&
                sscanf(q, "; param %lf", p) == 1,
            "no summary line:\n%s", out);
}

#endif

static void mpirun_pair(const gpt_config *c, const side *a, const side *b) {
#ifndef GPT_TEST_MPI
  (void)c, (void)a, (void)b;
  cr_skip_test("built without MPI");
#else
  if (system("command -v mpirun >/dev/null 2>&1") != 0) cr_skip_test("mpirun is not installed");
  /* The sanitizer builds run the same pairs on thread ranks above and the
   * library's checkpoints under mpirun (tests/ckpt/test_ckpt_mpi); these
   * 8-rank jobs would add minutes of CI there and find nothing more. */
  if (getenv("MESHPG_SANITIZER"))
    cr_skip_test("a sanitizer build (%s): the mpirun pairs run in the plain build",
                 getenv("MESHPG_SANITIZER"));
  char dir[256], ck[300], extra[400], na[160], nb[160];
  temp_dir(dir, sizeof dir, ck, sizeof ck);
  side_name(a, na, sizeof na);
  side_name(b, nb, sizeof nb);
  double ls, ps, l, p;
  snprintf(extra, sizeof extra, "--steps %d --save '%s' --save-at %d", SAVE_AT, ck, SAVE_AT);
  mpirun_gpt(c, a, extra, &ls, &ps);
  cr_assert(strstr(out, "saved checkpoint"), "%s", out);
  snprintf(extra, sizeof extra, "--steps %d --resume '%s'", STEPS, ck);
  mpirun_gpt(c, b, extra, &l, &p);
  cr_assert(strstr(out, "resumed from checkpoint"), "%s", out);
  cr_assert(strstr(out, "grad (step 1) n/a (resumed)"), "%s", out);
  cr_log_info("mpirun %s -> %s: max rel err loss %.3e, params %.3e", na, nb, l, p);
  fprintf(stderr, "ckpt mpirun %s -> %s: max rel err loss %.3e, params %.3e\n", na, nb, l, p);
  rm_tree(dir);
#endif
}

Test(gpt_ckpt, mpirun_tp2_cp2_dp2_sp_shard_to_dp8_shard, .timeout = 600) {
  run_pair_row(0, mpirun_pair);
}
Test(gpt_ckpt, mpirun_pp2_dp2_tp2_sp_to_tp4_dp2_sp_shard, .timeout = 600) {
  run_pair_row(1, mpirun_pair);
}
Test(gpt_ckpt, mpirun_dp4_to_hsdp, .timeout = 600) { run_pair_row(2, mpirun_pair); }
Test(gpt_ckpt, mpirun_moe_ep2_etp1_to_ep4_etp2_shard, .timeout = 600) {
  run_pair_row(3, mpirun_pair);
}
Test(gpt_ckpt, mpirun_dp3_uneven_shard_to_dp2_shard, .timeout = 600) {
  run_pair_row(4, mpirun_pair);
}

/* The program's errors: a directory that is no checkpoint (exit 1, the
 * library's message, no signal), a missing one and a bad --save-at (exit
 * 2, before any training). */
Test(gpt_ckpt, program_errors, .timeout = 120) {
  char dir[256], ck[300], cmd[4096];
  temp_dir(dir, sizeof dir, ck, sizeof ck);
  const char *gpt = env_program("MESHPG_GPT_EXE");
  snprintf(cmd, sizeof cmd, "timeout -k 5 60 '%s' --mesh dp=2 --steps 4 --resume '%s'", gpt,
           dir);
  int rc = run(cmd, NULL);
  cr_expect_eq(rc, 1, "%s: exit %d\n%s", cmd, rc, out);
  cr_expect(strstr(out, "--resume") && strstr(out, "cannot load"), "%s", out);
  cr_log_info("%s: exit %d:\n%s", cmd, rc, out);
  fprintf(stderr, "gpt --resume <a directory that is no checkpoint>: exit %d:\n%s", rc, out);
  snprintf(cmd, sizeof cmd, "'%s' --mesh dp=2 --steps 4 --resume '%s'", gpt, ck);
  rc = run(cmd, NULL);
  cr_expect_eq(rc, 2, "%s: exit %d\n%s", cmd, rc, out);
  cr_expect(strstr(out, "no such directory"), "%s", out);
  snprintf(cmd, sizeof cmd, "'%s' --mesh dp=2 --steps 4 --save '%s' --save-at 5", gpt, ck);
  rc = run(cmd, NULL);
  cr_expect_eq(rc, 2, "%s: exit %d\n%s", cmd, rc, out);
  cr_expect(strstr(out, "--save-at 5"), "%s", out);
  rm_tree(dir);
}
#endif
