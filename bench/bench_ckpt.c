/*
 * bench_ckpt - checkpoint save and load against the file system's floor
 * (issue 31).
 *
 *   bench_ckpt [PARAMS] [--np N[,N...]] [--dir DIR] [--rounds R] [--steps K]
 *   mpirun -np N bench_ckpt [PARAMS] --mpi [--dir DIR] [--rounds R] [--steps K]
 *
 * The state of a trainer with a distributed optimizer: every tensor of the
 * parameter list PARAMS (default bench/gpt-small.params; `name elements
 * shape` lines, read as bench_sync_mpi reads them) is an f32 parameter of
 * one mpg_sync in shard mode over the mesh dp=N (dp_cp = dp), and each has
 * two AdamW moments, exp_avg and exp_avg_sq, of which each rank holds its
 * owned range (mpg_sync_get_shard).  The checkpoint registers, on every
 * rank, each parameter whole (its view in the sync's parameter buffer:
 * replicated, so stored once) and both moments through
 * mpg_ckpt_add_state: 3 x 4 bytes per parameter element in all
 * (gpt-small: 347.7 MB).  Ranks are threads of this process (--np, default
 * 2,4) or, with --mpi under mpirun, processes.
 *
 * Per np, R rounds (default 3), each timing, every rank at once after a
 * barrier, the time of the slowest rank:
 *   (a) write floor: every rank writes bytes/N (its share of the
 *       checkpoint) with plain write(2) calls from one buffer into a file
 *       of its own in DIR, then fsync and close;
 *   (b) mpg_ckpt_save, synchronous, into DIR/ckpt (removed before);
 *   (c) mpg_ckpt_load of DIR/ckpt into the registered buffers;
 *   (r) read floor: every rank pread(2)s as many bytes as its registered
 *       buffers hold (every parameter plus its moments' owned ranges: what
 *       (c) reads) from the floor files of (a), starting with its own,
 *       into one buffer; like (c) it reads from the page cache the writes
 *       just filled;
 *   (d) async save: the mean time of a stand-in training step (one
 *       mpg_sync_all, an AdamW update of the owned elements, one
 *       mpg_sync_gather_begin + mpg_sync_gather_all) over K steps (default
 *       10) without a save, then a save with opts.async (its blocking part,
 *       staging, is timed apart) followed by just enough steps to cover
 *       the synchronous save's time of this round, ceil((b) / step) + 1,
 *       their mean, and mpg_ckpt_wait (timed: what the steps did not
 *       hide); the minor page
 *       faults of the blocking part are counted (getrusage: the process's,
 *       with thread ranks all of them);
 *   (s) staging floor: before (d)'s save, every rank memcpy's what the
 *       async save stages (every parameter, its moments' owned ranges)
 *       into a buffer written before timing (no page faults).
 * Each figure is the best of the rounds; GB/s = checkpoint bytes / time
 * for (a) and (b), the registered bytes summed over the ranks / time for
 * (c), (r), (s) and the blocking part.  The ratios are (b)/(a), (c)/(r),
 * blocking part/(s) and step with save in flight / step without.
 *
 * Output (stdout): "#" lines, one table per np, a summary with one row per
 * np, and per np one line for scripts:
 *   RESULT np=N bytes=.. floor_s=.. save_s=.. load_s=.. read_floor_s=..
 *          step_s=.. step_async_s=.. stage_s=.. wait_s=.. stage_faults=..
 *          stage_floor_s=.. async_steps=..
 * The directory is DIR (--dir), else $MESHPG_BENCH_DIR, else /tmp (put it
 * on the file system to measure); the program
 * works in DIR/bench-ckpt-PID (under mpirun: mpirun's PID, the parent of
 * every rank) and removes it at the end.
 *
 *   bench_ckpt --add N [--rounds R]
 *
 * (issue 45, item 11) times mpg_ckpt_add of N one-element tensors
 * ("layer.I.w") on one thread rank, best of R rounds, a fresh handle each:
 *   RESULT add tensors=N add_s=.. per_tensor_us=..
 * Exit status 0; 1 when a meshpg call or a file operation fails; 2 on a
 * usage error.
 */
#include "meshpg.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench_util.h"

#ifndef BENCH_DEFAULT_PARAMS
#define BENCH_DEFAULT_PARAMS "bench/gpt-small.params"
#endif
#define MAX_NP 8
#define MAX_ROUNDS 20
#define MAX_STEPS 1000

typedef struct opts {
  const char *params, *dir;
  int nps[MAX_NP], nnp, rounds, steps, mpi;
  long add; /* --add N: time the registration of N tensors instead */
} opts;

/* One round's figures (max over ranks). */
typedef struct round_res {
  double floor, save, load, read_floor, step, step_async, stage, wait;
  double stage_floor;  /* memcpy of the registered bytes, pre-touched */
  double stage_faults; /* minor page faults during the blocking part (the
                          process's: with thread ranks, every rank's) */
  int async_steps;
} round_res;

/* What the ranks share (threads) or each process holds (mpi). */
typedef struct shared {
  const opts *o;
  pdesc *params;
  int nparams;
  size_t elems;
  double ckpt_bytes, read_bytes; /* read_bytes: the largest over ranks */
  char work[4096];
  int np, failed;
  round_res r[MAX_ROUNDS];
} shared;

/* One rank's state. */
typedef struct rank_st {
  shared *sh;
  int rank, np;
  mpg_mesh *mesh;
  mpg_ctx *ctx;
  mpg_group *world;
  mpg_sync *sync;
  mpg_ckpt *ck, *cka;
  float **pv, **gv, *m, *v;
  mpg_shard_info *own;
  size_t shard_elems, share, mine_read;
  unsigned char *buf, *stg; /* the floors' buffers (stg: mine_read bytes) */
} rank_st;

#define TRY(call)                                                                   \
  do {                                                                              \
    mpg_status st_ = (call);                                                        \
    if (st_ != MPG_OK) {                                                            \
      fprintf(stderr, "bench_ckpt: rank %d: %s: %s: %s\n", R->rank, #call,          \
              mpg_status_name(st_), mpg_last_error());                              \
      return st_;                                                                   \
    }                                                                               \
  } while (0)

/* ------------------------------------------------------------------ */
/* Files                                                               */
/* ------------------------------------------------------------------ */

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st;
  (void)flag;
  (void)ftw;
  remove(path);
  return 0;
}

static void rm_rf(const char *path) { nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS); }

static void floor_path(const shared *sh, int rank, char *buf, size_t cap) {
  snprintf(buf, cap, "%s/floor-%05d.bin", sh->work, rank);
}

/* (a): buf[0..n) into the rank's own file, fsync, close.  0 or -1. */
static int write_floor(const shared *sh, int rank, const unsigned char *buf, size_t n) {
  char path[4200];
  floor_path(sh, rank, path, sizeof path);
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return -1;
  size_t done = 0;
  while (done < n) {
    ssize_t k = write(fd, buf + done, n - done);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) break;
    done += (size_t)k;
  }
  int ok = done == n && fsync(fd) == 0;
  return close(fd) == 0 && ok ? 0 : -1;
}

/* (r): `want` bytes from the floor files, the rank's own first, into buf
 * (cap bytes, reused in 8 MiB reads).  0 or -1. */
static int read_floor(const shared *sh, int rank, unsigned char *buf, size_t cap, size_t want) {
  const size_t chunk = (size_t)8 << 20;
  for (int f = 0; want > 0 && f < sh->np; f++) {
    char path[4200];
    floor_path(sh, (rank + f) % sh->np, path, sizeof path);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    size_t at = 0;
    for (;;) {
      size_t n = want < chunk ? want : chunk, into = at % (cap > chunk ? cap - chunk : 1);
      ssize_t k = pread(fd, buf + into, n, (off_t)at);
      if (k < 0 && errno == EINTR) continue;
      if (k <= 0) break;
      at += (size_t)k;
      want -= (size_t)k;
      if (!want) break;
    }
    close(fd);
  }
  return want == 0 ? 0 : -1;
}

/* ------------------------------------------------------------------ */
/* A rank's trainer state                                              */
/* ------------------------------------------------------------------ */

/* The sync (shard mode over dp_cp), the parameters' and gradients' views,
 * both moments and their owned ranges. */
static mpg_status make_state(rank_st *R) {
  shared *sh = R->sh;
  mpg_sync_opts so = MPG_SYNC_OPTS_INIT;
  so.sync.mode = MPG_SYNC_SHARD;
  TRY(mpg_sync_create(R->ctx, &so, &R->sync));
  for (int p = 0; p < sh->nparams; p++) {
    int id;
    TRY(mpg_sync_add_param(R->sync, sh->params[p].name, sh->params[p].count, MPG_F32, NULL,
                           &id));
  }
  TRY(mpg_sync_commit(R->sync));
  mpg_sync_stats stats = MPG_SYNC_STATS_INIT;
  TRY(mpg_sync_get_stats(R->sync, &stats));
  R->shard_elems = stats.shard_elems;
  R->pv = calloc((size_t)sh->nparams, sizeof *R->pv);
  R->gv = calloc((size_t)sh->nparams, sizeof *R->gv);
  R->own = calloc((size_t)sh->nparams, sizeof *R->own);
  R->m = calloc(R->shard_elems + 1, sizeof *R->m);
  R->v = calloc(R->shard_elems + 1, sizeof *R->v);
  if (!R->pv || !R->gv || !R->own || !R->m || !R->v) return MPG_ERR_NOMEM;
  size_t owned = 0;
  for (int p = 0; p < sh->nparams; p++) {
    R->own[p] = (mpg_shard_info)MPG_SHARD_INFO_INIT;
    TRY(mpg_sync_get_shard(R->sync, p, &R->own[p]));
    TRY(mpg_sync_param(R->sync, p, (void **)&R->pv[p]));
    TRY(mpg_sync_grad(R->sync, p, (void **)&R->gv[p]));
    for (size_t i = 0; i < sh->params[p].count; i++) {
      R->pv[p][i] = 0.01f * (float)(i % 97);
      R->gv[p][i] = 1e-3f;
    }
    owned += R->own[p].count;
  }
  for (size_t i = 0; i < R->shard_elems; i++) R->m[i] = R->v[i] = 1e-4f;
  R->mine_read = (sh->elems + 2 * owned) * 4;
  return MPG_OK;
}

/* Register every parameter whole and both moments with checkpoint ck. */
static mpg_status register_all(rank_st *R, mpg_ckpt *ck) {
  shared *sh = R->sh;
  for (int p = 0; p < sh->nparams; p++) {
    mpg_tensor_layout lay = MPG_TENSOR_LAYOUT_INIT;
    lay.ndim = 1;
    lay.shape[0] = sh->params[p].count;
    char name[BENCH_NAME_CAP + 16];
    TRY(mpg_ckpt_add(ck, sh->params[p].name, MPG_F32, &lay, R->pv[p], NULL));
    snprintf(name, sizeof name, "%s.exp_avg", sh->params[p].name);
    TRY(mpg_ckpt_add_state(ck, name, MPG_F32, &lay, R->sync, p, R->m));
    snprintf(name, sizeof name, "%s.exp_avg_sq", sh->params[p].name);
    TRY(mpg_ckpt_add_state(ck, name, MPG_F32, &lay, R->sync, p, R->v));
  }
  return MPG_OK;
}

static mpg_status rank_setup(rank_st *R, const mpg_init_opts *io) {
  shared *sh = R->sh;
  mpg_spec *spec = malloc(sizeof *spec);
  if (!spec) return MPG_ERR_NOMEM;
  *spec = (mpg_spec)MPG_SPEC_INIT;
  char dims[32];
  snprintf(dims, sizeof dims, "dp=%d", sh->np);
  mpg_status st = mpg_spec_init(spec);
  if (!st) st = mpg_spec_set_mesh(spec, dims);
  if (!st) st = mpg_spec_add_flatten(spec, "dp_cp", "dp");
  if (!st) st = mpg_spec_validate(spec);
  if (!st) st = mpg_mesh_create(spec, sh->np, &R->mesh);
  free(spec);
  TRY(st);
  TRY(mpg_ctx_create(R->mesh, io, &R->ctx));
  R->rank = mpg_ctx_rank(R->ctx);
  TRY(mpg_ctx_group(R->ctx, "world", &R->world));
  TRY(make_state(R));
  mpg_ckpt_opts co = MPG_CKPT_OPTS_INIT;
  TRY(mpg_ckpt_create(R->ctx, &co, &R->ck));
  co.async = 1;
  TRY(mpg_ckpt_create(R->ctx, &co, &R->cka));
  TRY(register_all(R, R->ck));
  TRY(register_all(R, R->cka));
  R->share = (size_t)(sh->ckpt_bytes / sh->np);
  size_t cap = R->share > ((size_t)16 << 20) ? R->share : (size_t)16 << 20;
  R->buf = malloc(cap);
  if (!R->buf) return MPG_ERR_NOMEM;
  memset(R->buf, 0x5a, cap); /* touched before any timing */
  R->stg = malloc(R->mine_read);
  if (!R->stg) return MPG_ERR_NOMEM;
  memset(R->stg, 0x5a, R->mine_read);
  return MPG_OK;
}

static void rank_free(rank_st *R) {
  mpg_ckpt_destroy(R->cka);
  mpg_ckpt_destroy(R->ck);
  mpg_sync_destroy(R->sync);
  mpg_ctx_destroy(R->ctx);
  mpg_mesh_destroy(R->mesh);
  free(R->pv);
  free(R->gv);
  free(R->own);
  free(R->m);
  free(R->v);
  free(R->buf);
  free(R->stg);
}

/* ------------------------------------------------------------------ */
/* Rounds                                                              */
/* ------------------------------------------------------------------ */

/* The maximum of x over the ranks. */
static mpg_status max_over(rank_st *R, double x, double *out) {
  TRY(mpg_all_reduce(R->world, &x, out, 1, MPG_F64, MPG_OP_MAX, NULL, NULL));
  return MPG_OK;
}

/* The stand-in training step: sync, AdamW on the owned elements, gather. */
static mpg_status train_step(rank_st *R, long step) {
  TRY(mpg_sync_all(R->sync, step, NULL));
  const float b1 = 0.9f, b2 = 0.999f, lr = 1e-4f, wd = 0.01f;
  for (int p = 0; p < R->sh->nparams; p++) {
    float *w = R->pv[p] + R->own[p].param_offset, *g = R->gv[p] + R->own[p].param_offset;
    float *m = R->m + R->own[p].shard_offset, *v = R->v + R->own[p].shard_offset;
    for (size_t i = 0; i < R->own[p].count; i++) {
      m[i] = b1 * m[i] + (1 - b1) * g[i];
      v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
      w[i] -= lr * (m[i] / (sqrtf(v[i]) + 1e-8f) + wd * w[i]);
    }
  }
  TRY(mpg_sync_gather_begin(R->sync, NULL));
  TRY(mpg_sync_gather_all(R->sync));
  return MPG_OK;
}

/* k steps from *step; their mean time into *mean. */
static mpg_status steps(rank_st *R, long *step, int k, double *mean) {
  double t0 = now_s();
  for (int i = 0; i < k; i++) {
    mpg_status st = train_step(R, (*step)++);
    if (st) return st;
  }
  *mean = (now_s() - t0) / k;
  return MPG_OK;
}

/* A file-system step of a round failed: say so and stop every rank. */
static mpg_status io_fail(rank_st *R, const char *what) {
  fprintf(stderr, "bench_ckpt: rank %d: %s: %s\n", R->rank, what, strerror(errno));
  mpg_ctx_abort(R->ctx);
  return MPG_ERR_IO;
}

/* (a), (b), (c), (r): the slowest rank's times into *x. */
static mpg_status io_phases(rank_st *R, int round, round_res *x) {
  shared *sh = R->sh;
  char ck[4200], path[4200];
  snprintf(ck, sizeof ck, "%s/ckpt", sh->work);
  floor_path(sh, R->rank, path, sizeof path);
  remove(path);
  if (R->rank == 0) rm_rf(ck);
  TRY(mpg_barrier(R->world, NULL));
  double t0 = now_s();
  if (write_floor(sh, R->rank, R->buf, R->share)) return io_fail(R, "the write floor");
  TRY(max_over(R, now_s() - t0, &x->floor));
  TRY(mpg_barrier(R->world, NULL));
  t0 = now_s();
  TRY(mpg_ckpt_save(R->ck, ck, round, NULL));
  TRY(max_over(R, now_s() - t0, &x->save));
  TRY(mpg_barrier(R->world, NULL));
  t0 = now_s();
  long step = -1;
  TRY(mpg_ckpt_load(R->ck, ck, &step, NULL));
  TRY(max_over(R, now_s() - t0, &x->load));
  if (step != round) return io_fail(R, "the load gave another step");
  size_t cap = R->share > ((size_t)16 << 20) ? R->share : (size_t)16 << 20;
  TRY(mpg_barrier(R->world, NULL));
  t0 = now_s();
  if (read_floor(sh, R->rank, R->buf, cap, R->mine_read)) return io_fail(R, "the read floor");
  TRY(max_over(R, now_s() - t0, &x->read_floor));
  return MPG_OK;
}

/* (s): what an async save must copy (every parameter, the owned ranges of
 * both moments) into the pre-touched buffer stg. */
static void stage_floor(rank_st *R) {
  size_t at = 0;
  for (int p = 0; p < R->sh->nparams; p++) {
    size_t n = R->sh->params[p].count * 4, k = R->own[p].count * 4;
    memcpy(R->stg + at, R->pv[p], n);
    memcpy(R->stg + at + n, R->m + R->own[p].shard_offset, k);
    memcpy(R->stg + at + n + k, R->v + R->own[p].shard_offset, k);
    at += n + 2 * k;
  }
}

/* (d): steps without a save, then an async save and steps over it. */
static mpg_status async_phase(rank_st *R, int round, long *step, round_res *x) {
  shared *sh = R->sh;
  char cka[4200];
  snprintf(cka, sizeof cka, "%s/ckpt-async", sh->work);
  if (R->rank == 0) rm_rf(cka);
  double mean;
  TRY(steps(R, step, sh->o->steps, &mean));
  TRY(max_over(R, mean, &x->step));
  /* just enough steps to cover the synchronous save's time, so that a
   * save is in flight during most of them (the same count on every rank:
   * both figures are maxima over the ranks) */
  int k2 = (int)ceil(x->save / (x->step > 0 ? x->step : 1e-3)) + 1;
  k2 = k2 > MAX_STEPS ? MAX_STEPS : k2;
  TRY(mpg_barrier(R->world, NULL));
  double t0 = now_s();
  stage_floor(R);
  TRY(max_over(R, now_s() - t0, &x->stage_floor));
  TRY(mpg_barrier(R->world, NULL));
  t0 = now_s();
  double f0 = minor_faults();
  TRY(mpg_ckpt_save(R->cka, cka, round, NULL));
  double dt = now_s() - t0, df = minor_faults() - f0;
  TRY(max_over(R, dt, &x->stage));
  TRY(max_over(R, df, &x->stage_faults));
  TRY(steps(R, step, k2, &mean));
  TRY(max_over(R, mean, &x->step_async));
  t0 = now_s();
  TRY(mpg_ckpt_wait(R->cka));
  TRY(max_over(R, now_s() - t0, &x->wait));
  x->async_steps = k2;
  return MPG_OK;
}

static mpg_status rank_main(const mpg_init_opts *io, void *arg) {
  shared *sh = arg;
  rank_st *R = calloc(1, sizeof *R);
  if (!R) return MPG_ERR_NOMEM;
  R->sh = sh;
  R->np = sh->np;
  R->rank = io->rank;
  mpg_status st = rank_setup(R, io);
  double sum = 0;
  if (!st) st = mpg_all_reduce(R->world, &(double){(double)R->mine_read}, &sum, 1, MPG_F64,
                               MPG_OP_SUM, NULL, NULL);
  if (!st && R->rank == 0) sh->read_bytes = sum;
  long step = 0;
  if (!st) st = train_step(R, step++); /* warm-up: first touches, the gathers */
  for (int round = 0; !st && round < sh->o->rounds; round++) {
    round_res x = {0};
    st = io_phases(R, round, &x);
    if (!st) st = async_phase(R, round, &step, &x);
    if (!st && R->rank == 0) sh->r[round] = x;
  }
  char path[4200];
  floor_path(sh, R->rank, path, sizeof path);
  remove(path);
  if (!st) st = mpg_barrier(R->world, NULL);
  if (R->rank == 0) {
    snprintf(path, sizeof path, "%s/ckpt", sh->work);
    rm_rf(path);
    snprintf(path, sizeof path, "%s/ckpt-async", sh->work);
    rm_rf(path);
  }
  if (st && R->ctx) {
    mpg_ctx_abort(R->ctx);
    sh->failed = 1;
  }
  rank_free(R);
  free(R);
  return st;
}

/* ------------------------------------------------------------------ */
/* Report                                                              */
/* ------------------------------------------------------------------ */

/* The best (smallest) of field `off` over the rounds. */
static double best(const shared *sh, size_t off) {
  double b = 0;
  for (int i = 0; i < sh->o->rounds; i++) {
    double v = *(const double *)((const char *)&sh->r[i] + off);
    if (i == 0 || v < b) b = v;
  }
  return b;
}
#define BEST(sh, field) best(sh, offsetof(round_res, field))

static void row(const char *what, double s, double bytes, const char *ratio, double r) {
  printf("  %-48s %9.1f", what, s * 1e3);
  if (bytes > 0) printf(" %9.1f %7.3f", bytes / 1e6, bytes / s / 1e9);
  else printf(" %9s %7s", "", "");
  if (ratio) printf("   %s = %.2f", ratio, r);
  printf("\n");
}

static void print_np(const shared *sh, const char *kind) {
  double fl = BEST(sh, floor), sv = BEST(sh, save), ld = BEST(sh, load);
  double rf = BEST(sh, read_floor), stp = BEST(sh, step), sta = BEST(sh, step_async);
  double stg = BEST(sh, stage), wt = BEST(sh, wait);
  int k2 = sh->r[0].async_steps;
  printf("\n# np %d (%s), best of %d rounds; time = the slowest rank\n", sh->np, kind,
         sh->o->rounds);
  printf("  %-48s %9s %9s %7s\n", "", "time_ms", "MB", "GB/s");
  row("(a) write floor: write + fsync, a file per rank", fl, sh->ckpt_bytes, NULL, 0);
  row("(b) mpg_ckpt_save, synchronous", sv, sh->ckpt_bytes, "(b)/(a)", sv / fl);
  row("(c) mpg_ckpt_load", ld, sh->read_bytes, "(c)/(r)", ld / rf);
  row("(r) read floor: pread what (c) fills", rf, sh->read_bytes, NULL, 0);
  row("(d) step, no save in flight", stp, 0, NULL, 0);
  char what[96];
  snprintf(what, sizeof what, "(d) step, async save in flight (%d steps)", k2);
  row(what, sta, 0, "ratio", sta / stp);
  double sfl = BEST(sh, stage_floor);
  row("    async save: mpg_ckpt_wait after the steps", wt, 0, NULL, 0);
  row("    async save: the blocking part (staging)", stg, sh->read_bytes, "/(s)", stg / sfl);
  printf("  %-48s %9.0f\n", "    page faults in the blocking part", BEST(sh, stage_faults));
  row("(s) staging floor: memcpy those bytes, no faults", sfl, sh->read_bytes, NULL, 0);
  printf("RESULT np=%d bytes=%.0f read_bytes=%.0f floor_s=%.6f save_s=%.6f load_s=%.6f "
         "read_floor_s=%.6f step_s=%.6f step_async_s=%.6f stage_s=%.6f wait_s=%.6f "
         "stage_faults=%.0f stage_floor_s=%.6f async_steps=%d\n",
         sh->np, sh->ckpt_bytes, sh->read_bytes, fl, sv, ld, rf, stp, sta, stg, wt,
         BEST(sh, stage_faults), sfl, k2);
  fflush(stdout);
}

static void print_summary(const shared *all, int n) {
  printf("\n# summary (best of the rounds)\n");
  printf("  %3s %11s %11s %9s %11s %9s %9s %13s %7s %11s\n", "np", "save GB/s", "floor GB/s",
         "(b)/(a)", "load GB/s", "(c)/(r)", "step ms", "step+save ms", "ratio", "staging/(s)");
  for (int i = 0; i < n; i++) {
    const shared *sh = &all[i];
    double fl = BEST(sh, floor), sv = BEST(sh, save), ld = BEST(sh, load);
    double rf = BEST(sh, read_floor), stp = BEST(sh, step), sta = BEST(sh, step_async);
    printf("  %3d %11.3f %11.3f %9.2f %11.3f %9.2f %9.1f %13.1f %7.2f %11.1f\n", sh->np,
           sh->ckpt_bytes / sv / 1e9, sh->ckpt_bytes / fl / 1e9, sv / fl,
           sh->read_bytes / ld / 1e9, ld / rf, stp * 1e3, sta * 1e3, sta / stp,
           BEST(sh, stage) / BEST(sh, stage_floor));
  }
}

/* ------------------------------------------------------------------ */
/* Main                                                                */
/* ------------------------------------------------------------------ */

static int parse_nps(const char *s, opts *o) {
  o->nnp = 0;
  for (const char *p = s; *p && o->nnp < MAX_NP;) {
    char *end;
    long v = strtol(p, &end, 10);
    if (end == p || v < 1 || v > 64) return -1;
    o->nps[o->nnp++] = (int)v;
    p = *end == ',' ? end + 1 : end;
    if (*end && *end != ',') return -1;
  }
  return o->nnp ? 0 : -1;
}

static int parse(int argc, char **argv, opts *o) {
  *o = (opts){BENCH_DEFAULT_PARAMS, getenv("MESHPG_BENCH_DIR"), {2, 4}, 2, 3, 10, 0, 0};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--mpi")) o->mpi = 1;
    else if (!strcmp(a, "--np") && v && !parse_nps(v, o)) i++;
    else if (!strcmp(a, "--dir") && v) o->dir = argv[++i];
    else if (!strcmp(a, "--rounds") && v) o->rounds = atoi(argv[++i]);
    else if (!strcmp(a, "--steps") && v) o->steps = atoi(argv[++i]);
    else if (!strcmp(a, "--add") && v) o->add = atol(argv[++i]);
    else if (a[0] != '-') o->params = a;
    else return -1;
  }
  if (!o->dir || !o->dir[0]) o->dir = "/tmp";
  if (o->add < 0 || o->add > 100000000) return -1;
  return o->rounds >= 1 && o->rounds <= MAX_ROUNDS && o->steps >= 1 && o->steps <= MAX_STEPS
             ? 0 : -1;
}

/* The parameter list and the work directory into sh. */
static int prepare(shared *sh, const opts *o, int announce) {
  memset(sh, 0, sizeof *sh);
  sh->o = o;
  if (bench_load_params(announce ? "bench_ckpt" : NULL, o->params, &sh->params, &sh->nparams))
    return 1;
  for (int p = 0; p < sh->nparams; p++) sh->elems += sh->params[p].count;
  sh->ckpt_bytes = 3.0 * 4.0 * (double)sh->elems;
  /* under mpirun every process of the job shares its parent, mpirun */
  snprintf(sh->work, sizeof sh->work, "%s/bench-ckpt-%ld", o->dir,
           (long)(o->mpi ? getppid() : getpid()));
  if (mkdir(sh->work, 0755) && errno != EEXIST) {
    fprintf(stderr, "bench_ckpt: %s: %s\n", sh->work, strerror(errno));
    return 1;
  }
  if (announce)
    printf("# bench_ckpt: %s: %d tensors, %zu parameters; checkpoint = parameters + "
           "exp_avg + exp_avg_sq, f32, shard mode over dp: %.1f MB; directory %s\n",
           o->params, sh->nparams, sh->elems, sh->ckpt_bytes / 1e6, sh->work);
  return 0;
}

/* --add: one rank registers o->add one-element tensors, R times. */
typedef struct add_run {
  const opts *o;
  double best;
} add_run;

static mpg_status add_rank(const mpg_init_opts *io, void *arg) {
  add_run *a = arg;
  mpg_spec *spec = malloc(sizeof *spec);
  if (!spec) return MPG_ERR_NOMEM;
  *spec = (mpg_spec)MPG_SPEC_INIT;
  mpg_mesh *mesh = NULL;
  mpg_ctx *ctx = NULL;
  mpg_status st = mpg_spec_init(spec);
  if (!st) st = mpg_spec_set_mesh(spec, "dp=1");
  if (!st) st = mpg_spec_validate(spec);
  if (!st) st = mpg_mesh_create(spec, 1, &mesh);
  free(spec);
  if (!st) st = mpg_ctx_create(mesh, io, &ctx);
  static float one;
  mpg_tensor_layout l = MPG_TENSOR_LAYOUT_INIT;
  l.ndim = 1, l.shape[0] = 1;
  a->best = 1e30;
  for (int r = 0; r < a->o->rounds && !st; r++) {
    mpg_ckpt *ck = NULL;
    st = mpg_ckpt_create(ctx, NULL, &ck);
    char name[32];
    double t0 = now_s();
    for (long i = 0; i < a->o->add && !st; i++) {
      snprintf(name, sizeof name, "layer.%ld.w", i);
      st = mpg_ckpt_add(ck, name, MPG_F32, &l, &one, NULL);
    }
    double t = now_s() - t0;
    if (t < a->best) a->best = t;
    mpg_ckpt_destroy(ck);
  }
  if (ctx) mpg_ctx_destroy(ctx);
  mpg_mesh_destroy(mesh);
  return st;
}

static int run_add(const opts *o) {
  add_run a = {o, 0};
  mpg_status st = mpg_thread_run(1, 600.0, add_rank, &a, NULL);
  if (st) {
    fprintf(stderr, "bench_ckpt: --add: %s: %s\n", mpg_status_name(st), mpg_last_error());
    return 1;
  }
  printf("# bench_ckpt --add: mpg_ckpt_add of %ld one-element tensors, best of %d rounds\n",
         o->add, o->rounds);
  printf("  %-48s %9.1f ms\n", "add (duplicate check: a hash set)", a.best * 1e3);
  printf("RESULT add tensors=%ld add_s=%.6f per_tensor_us=%.3f\n", o->add, a.best,
         o->add ? a.best * 1e6 / (double)o->add : 0.0);
  return 0;
}

static int run_mpi(const opts *o) {
  mpg_launch env = MPG_LAUNCH_INIT;
  if (mpg_launch_from_env(&env) != MPG_OK || env.world_size < 1) {
    fprintf(stderr, "bench_ckpt: --mpi: no launcher found (mpirun -np N ...)\n");
    return 2;
  }
  shared *sh = malloc(sizeof *sh);
  if (!sh || prepare(sh, o, env.rank == 0)) return 1;
  sh->np = env.world_size;
  mpg_init_opts io = MPG_INIT_OPTS_INIT;
  io.backend.name = MPG_BACKEND_MPI;
  io.rank = env.rank;
  io.world_size = env.world_size;
  mpg_status st = rank_main(&io, sh);
  if (!st && env.rank == 0) {
    print_np(sh, "MPI processes");
    print_summary(sh, 1);
    rmdir(sh->work);
  }
  free(sh->params);
  free(sh);
  return st ? 1 : 0;
}

int main(int argc, char **argv) {
  opts o;
  if (parse(argc, argv, &o)) {
    fprintf(stderr, "usage: bench_ckpt [PARAMS] [--np N[,N...]] [--dir DIR] [--rounds R] "
                    "[--steps K]\n       mpirun -np N bench_ckpt [PARAMS] --mpi [--dir DIR] "
                    "[--rounds R] [--steps K]\n       bench_ckpt --add N [--rounds R]\n");
    return 2;
  }
  if (o.add) return run_add(&o);
  if (o.mpi) return run_mpi(&o);
  setvbuf(stdout, NULL, _IOLBF, 0);
  shared *all = calloc((size_t)o.nnp, sizeof *all);
  if (!all) return 1;
  int rc = 0;
  for (int i = 0; i < o.nnp && !rc; i++) {
    if (prepare(&all[i], &o, i == 0)) return 1;
    all[i].np = o.nps[i];
    mpg_status st = mpg_thread_run(o.nps[i], 600.0, rank_main, &all[i], NULL);
    if (st != MPG_OK || all[i].failed) {
      fprintf(stderr, "bench_ckpt: np %d: %s: %s\n", o.nps[i], mpg_status_name(st),
              mpg_last_error());
      rc = 1;
    } else {
      print_np(&all[i], "thread ranks");
    }
  }
  if (!rc) print_summary(all, o.nnp);
  if (o.nnp) rmdir(all[0].work);
  for (int i = 0; i < o.nnp; i++) free(all[i].params);
  free(all);
  return rc;
}
