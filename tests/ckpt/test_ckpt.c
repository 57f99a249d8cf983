/* Checkpoints (sync/ckpt*.c) on thread ranks: resharding property tests
 * over random meshes (ckpt_check.h: random global tensors, a random save
 * mesh and a random load mesh, replicate / shard / HSDP state through a
 * real mpg_sync, tp splits, explicit boxes, ranges, pipeline stages), the
 * files checked through the format's decoder (ckpt_fs.h: every element
 * stored once, checksums, the directory's entries), deduplication and the
 * spread of the writers, async saves, saving over a checkpoint, and the
 * bad inputs: every rank gets the same status, and a failed load leaves
 * every registered buffer as it was. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ckpt_check.h"
#include "ckpt_fs.h"
#include "ckpt_root.h"


/* Run one save (which 0) or load (which 1) of case c on its thread ranks;
 * assert that every rank got `expect` (and, for a load, the values).
 * Returns the job (free it). */
static ck_job *run_job_ex(const ck_case *c, int which, const char *dir, int version, long step,
                          int async, mpg_status expect, void (*before)(ck_rank *, ck_job *)) {
  ck_job *j = malloc(sizeof *j);
  cr_assert_not_null(j);
  *j = (ck_job){.c = c, .which = which, .dir = dir, .version = version, .step = step,
                .async = async, .expect = expect, .before = before};
  int world = c->mesh[which].world;
  mpg_status rc = mpg_thread_run(world, 120.0, ck_job_thread, j, NULL);
  if (rc != MPG_OK) {
    static char desc[4096], fails[16384];
    ck_mesh_describe(c, &c->mesh[which], desc, sizeof desc);
    cr_assert_fail("case %u: %s of %s over %d ranks failed: %s\n%s%s", c->seed,
                   which ? "load" : "save", dir, world, mpg_last_error(), desc,
                   ck_job_failures(j, world, fails, sizeof fails));
  }
  return j;
}

static void run_job(const ck_case *c, int which, const char *dir, int version, long step,
                    int async) {
  free(run_job_ex(c, which, dir, version, step, async, MPG_OK, NULL));
}

/* Under a new root (root_init(tag)): the random case of seed over ws,
 * then wl ranks (not big), to free; dir: the root's "ck". */
static ck_case *case_in_ck(const char *tag, unsigned seed, int ws, int wl, char *dir,
                           size_t cap) {
  root_init(tag);
  ck_case *c = malloc(sizeof *c);
  cr_assert_not_null(c);
  ck_case_make(c, seed, ws, wl, 0);
  path_in(dir, cap, "ck");
  return c;
}

/* The files of a save of mesh `which` of c (ckf_meta_check). */
static void check_files(const ck_case *c, int which, const char *dir, long step, int version) {
  char msg[2048], desc[4096];
  if (ckf_meta_check(c, which, dir, step, version, 0, NULL, NULL, msg, sizeof msg) != 0) {
    ck_mesh_describe(c, &c->mesh[which], desc, sizeof desc);
    cr_assert_fail("case %u: the files of %s: %s\n%s", c->seed, dir, msg, desc);
  }
}

/* Save c under mesh 0, check the files, load it under mesh 1. */
static void roundtrip(const ck_case *c, const char *dir, int version, int async) {
  long step = 1000 + version;
  run_job(c, 0, dir, version, step, async);
  check_files(c, 0, dir, step, version);
  run_job(c, 1, dir, version, step, 0);
}

static unsigned pick_world(unsigned seed, unsigned salt) {
  static const unsigned w[] = {1, 2, 2, 3, 4, 4, 5, 6, 6, 8, 8, 12, 16};
  return w[(seed * 2654435761u + salt * 40503u) % 13u];
}

/* The random case of seed over ws and wl ranks (ck_case_make's, big
 * included), made in c and round-tripped in a directory of its own under
 * g_root (removed after). */
static void roundtrip_seed(ck_case *c, unsigned seed, int ws, int wl, int big, int async) {
  ck_case_make(c, seed, ws, wl, big);
  char dir[4200];
  snprintf(dir, sizeof dir, "%s/ck%u", g_root, seed);
  roundtrip(c, dir, (int)seed, async);
  ckf_rm_rf(dir);
}

/* Under root (root_init): the round trips of seeds [first, end) over
 * pick_world(seed, salt) and pick_world(seed, salt + 1) ranks; big is
 * ck_case_make's (-1: every other seed); async saves or not. */
static void roundtrip_seeds(const char *root, unsigned first, unsigned end, unsigned salt,
                            int big, int async) {
  root_init(root);
  ck_case *c = malloc(sizeof *c);
  cr_assert_not_null(c);
  for (unsigned seed = first; seed < end; seed++)
    roundtrip_seed(c, seed, (int)pick_world(seed, salt), (int)pick_world(seed, salt + 1),
                   big < 0 ? (int)(seed % 2) : big, async);
  free(c);
}

/* ------------------------------------------------------------------ */
/* Properties                                                          */
/* ------------------------------------------------------------------ */

/* 500 random cases (200 in a sanitizer build, MESHPG_SANITIZER, to keep CI
 * in its time): save under one random mesh, load under another. */
Test(ckpt_props, random_meshes_reshard, .timeout = 900, .fini = root_fini) {
  root_init("props");
  ck_case *c = malloc(sizeof *c);
  cr_assert_not_null(c);
  int n_mode[4] = {0}, hsdp = 0, shard = 0, pp = 0, split = 0, ws_ne_wl = 0;
  const int n = getenv("MESHPG_SANITIZER") ? 200 : 500; /* the bounds below scale */
  for (unsigned seed = 1; seed <= (unsigned)n; seed++) {
    int ws = (int)pick_world(seed, 1), wl = (int)pick_world(seed, 2);
    roundtrip_seed(c, seed, ws, wl, seed % 5 == 0, 0);
    for (int w = 0; w < 2; w++) {
      const ck_mesh *m = &c->mesh[w];
      hsdp += strstr(m->dims, "dp_shard") != NULL;
      shard += m->sync_mode == MPG_SYNC_SHARD;
      pp += m->pp > 1;
      for (int k = 0; k < c->ntensors; k++) {
        n_mode[m->mode[k]]++;
        split += m->split[k];
      }
    }
    ws_ne_wl += ws != wl;
  }
  cr_log_info("modes whole %d box %d range %d state %d; hsdp %d shard %d pp %d split %d",
              n_mode[0], n_mode[1], n_mode[2], n_mode[3], hsdp, shard, pp, split);
  for (int k = 0; k < 4; k++)
    cr_assert_gt(n_mode[k], 120 * n / 500, "mode %d used %d times", k, n_mode[k]);
  cr_assert_gt(hsdp, 40 * n / 500);
  cr_assert_gt(shard, 120 * n / 500);
  cr_assert_gt(pp, 60 * n / 500);
  cr_assert_gt(split, 120 * n / 500);
  cr_assert_gt(ws_ne_wl, 240 * n / 500);
  free(c);
}

/* Larger tensors (10^3..10^4 elements on an axis) over 4 KiB .. 1 MiB
 * checksum blocks, so that chunks span many blocks and loads read parts
 * of them. */
Test(ckpt_props, large_tensors_many_blocks, .timeout = 600, .fini = root_fini) {
  roundtrip_seeds("large", 1000, 1040, 3, 1, 0);
}

/* Async saves: the buffers change as soon as save returns; the checkpoint
 * holds the values they had at the call. */
Test(ckpt_props, async_save_keeps_the_values_at_the_call, .timeout = 600, .fini = root_fini) {
  roundtrip_seeds("async", 2000, 2030, 5, -1, 1);
}

/* ------------------------------------------------------------------ */
/* Deduplication and writers                                           */
/* ------------------------------------------------------------------ */

/* A case of n tensors of `elems` f32 each, whole on every rank of `dims`. */
static void plain_case(ck_case *c, const char *dims, const char *flatten, int world, int n,
                       size_t elems) {
  memset(c, 0, sizeof *c);
  c->seed = 7;
  for (int k = 0; k < n; k++) {
    ck_tensor *t = &c->t[k];
    snprintf(t->name, sizeof t->name, "layer%02d.w", k);
    t->dtype = MPG_F32;
    t->kind = MPG_CKPT_PARAM;
    t->ndim = 1;
    t->shape[0] = elems;
    t->split_axis = -1;
  }
  c->ntensors = n;
  ck_mesh_plain(&c->mesh[0], dims, flatten, world, n);
  c->mesh[1] = c->mesh[0];
}

/* 8 equal tensors replicated on 4 ranks: each stored once, and the four
 * ranks write two each (a writer per chunk, spread over the ranks). */
Test(ckpt_dedup, replicas_once_writers_spread, .timeout = 120, .fini = root_fini) {
  root_init("dedup");
  ck_case *c = malloc(sizeof *c);
  cr_assert_not_null(c);
  plain_case(c, "dp=4", "dp_cp=dp", 4, 8, 16384);
  char dir[4200];
  path_in(dir, sizeof dir, "ck");
  run_job(c, 0, dir, 1, 5, 0);
  char msg[2048];
  int nfiles;
  uint64_t max_file;
  cr_assert_eq(ckf_meta_check(c, 0, dir, 5, 1, 0, &nfiles, &max_file, msg, sizeof msg), 0, "%s",
               msg);
  uint64_t total = ck_case_bytes(c);
  cr_log_info("8 x 64 KiB replicated on 4 ranks: %d data files, the largest %llu bytes", nfiles,
              (unsigned long long)max_file);
  cr_assert_eq(nfiles, 4, "%d ranks wrote the 8 replicated tensors, expected all 4", nfiles);
  cr_assert_leq(max_file, total / 2, "one rank wrote %llu of %llu bytes",
                (unsigned long long)max_file, (unsigned long long)total);
  /* Unequal tensors: still every rank writes, nobody more than twice the mean. */
  for (int k = 0; k < 8; k++) c->t[k].shape[0] = 1024 * (size_t)(1 + k);
  ckf_rm_rf(dir);
  run_job(c, 0, dir, 2, 6, 0);
  cr_assert_eq(ckf_meta_check(c, 0, dir, 6, 2, 0, &nfiles, &max_file, msg, sizeof msg), 0, "%s",
               msg);
  cr_log_info("unequal: %d files, the largest %llu of %zu bytes", nfiles,
              (unsigned long long)max_file, ck_case_bytes(c));
  cr_assert_eq(nfiles, 4);
  cr_assert_leq(max_file, 2 * ck_case_bytes(c) / 4);
  run_job(c, 1, dir, 2, 6, 0);
  free(c);
}

/* ------------------------------------------------------------------ */
/* Async: a second save, or a load, waits for the first                */
/* ------------------------------------------------------------------ */

typedef struct two_arg {
  const ck_case *c;
  const char *dir1, *dir2, *dir3;
  char msg[CK_MAX_RANKS][CK_MSG];
} two_arg;

#define TWO_TRY(call)                                                                 \
  do {                                                                                \
    mpg_status st_ = (call);                                                          \
    if (st_ != MPG_OK) {                                                              \
      snprintf(a->msg[r], sizeof a->msg[r], "line %d: %s -> %s: %s", __LINE__, #call, \
               mpg_status_name(st_), mpg_last_error());                               \
      rc = st_;                                                                       \
      goto done;                                                                      \
    }                                                                                 \
  } while (0)

/* save(dir1) v1, change, save(dir2) v2 without a wait, change, wait; then
 * save(dir3) v4 and at once load(dir3) into changed buffers: v4. */
static mpg_status two_saves_rank(const mpg_init_opts *opts, void *arg) {
  two_arg *a = arg;
  int r = opts->rank;
  mpg_status rc = MPG_OK;
  ck_rank *s = calloc(1, sizeof *s);
  if (!s) return MPG_ERR_NOMEM;
  mpg_ckpt_opts o = MPG_CKPT_OPTS_INIT;
  o.async = 1;
  o.block_bytes = 4096;
  o.timeout_s = 60;
  TWO_TRY(ck_open(s, opts, a->c, &a->c->mesh[0], &o));
  ck_fill(s, 1);
  TWO_TRY(mpg_ckpt_save(s->ck, a->dir1, 1, NULL));
  ck_fill(s, 2);
  TWO_TRY(mpg_ckpt_save(s->ck, a->dir2, 2, NULL));
  ck_fill(s, 3);
  TWO_TRY(mpg_ckpt_wait(s->ck));
  TWO_TRY(mpg_ckpt_wait(s->ck)); /* none in flight: MPG_OK at once */
  ck_fill(s, 4);
  TWO_TRY(mpg_ckpt_save(s->ck, a->dir3, 4, NULL));
  ck_fill(s, 5);
  long step = 0;
  TWO_TRY(mpg_ckpt_load(s->ck, a->dir3, &step, NULL));
  if (step != 4 || ck_check(s, 4) != 0) {
    snprintf(a->msg[r], sizeof a->msg[r], "load right after an async save: step %ld: %.1400s", step,
             s->msg);
    rc = MPG_ERR_STATE;
  }
done:
  if (rc && s->ctx) mpg_ctx_abort(s->ctx);
  ck_close(s);
  free(s);
  return rc;
}

Test(ckpt_async, second_save_and_load_wait_for_the_first, .timeout = 300, .fini = root_fini) {
  root_init("two");
  ck_case *c = malloc(sizeof *c);
  two_arg *a = calloc(1, sizeof *a);
  cr_assert(c && a);
  char d1[4200], d2[4200], d3[4200];
  path_in(d1, sizeof d1, "one");
  path_in(d2, sizeof d2, "two");
  path_in(d3, sizeof d3, "three");
  for (unsigned seed = 400; seed < 406; seed++) {
    ck_case_make(c, seed, (int)pick_world(seed, 7), (int)pick_world(seed, 8), 1);
    memset(a, 0, sizeof *a);
    a->c = c;
    a->dir1 = d1;
    a->dir2 = d2;
    a->dir3 = d3;
    mpg_status st[CK_MAX_RANKS];
    mpg_status rc = mpg_thread_run(c->mesh[0].world, 120.0, two_saves_rank, a, st);
    char all[8192] = "";
    for (int r = 0; r < c->mesh[0].world; r++)
      if (st[r]) snprintf(all + strlen(all), sizeof all - strlen(all), "\n rank %d: %s", r,
                          a->msg[r]);
    cr_assert_eq(rc, MPG_OK, "case %u (%s): %s", seed, c->mesh[0].dims, all);
    check_files(c, 0, d1, 1, 1);
    check_files(c, 0, d2, 2, 2);
    check_files(c, 0, d3, 4, 4);
    run_job(c, 1, d1, 1, 1, 0);
    run_job(c, 1, d2, 2, 2, 0);
    ckf_rm_rf(d1);
    ckf_rm_rf(d2);
    ckf_rm_rf(d3);
  }
  free(a);
  free(c);
}

/* ------------------------------------------------------------------ */
/* The directory                                                       */
/* ------------------------------------------------------------------ */

static void expect_listing(const char *dir, const char *want) {
  char list[4096];
  ckf_list(dir, list, sizeof list);
  cr_assert_str_eq(list, want, "%s holds \"%s\", expected \"%s\"", dir, list, want);
}

/* A 4-rank checkpoint, then another case saved by 2 ranks over it: only
 * the new files (no data file of ranks 2, 3 left), nothing beside it; then
 * an async save over it again. */
Test(ckpt_dir, save_over_a_checkpoint_replaces_it, .timeout = 300, .fini = root_fini) {
  char dir[4200];
  ck_case *a = case_in_ck("replace", 500, 4, 3, dir, sizeof dir), *b = malloc(sizeof *b);
  cr_assert_not_null(b);
  ck_case_make(b, 501, 2, 4, 0);
  run_job(a, 0, dir, 1, 10, 0);
  check_files(a, 0, dir, 10, 1);
  run_job(b, 0, dir, 2, 20, 0);
  check_files(b, 0, dir, 20, 2);
  expect_listing(g_root, "ck");
  run_job(b, 1, dir, 2, 20, 0);
  run_job(b, 0, dir, 3, 30, 1);
  check_files(b, 0, dir, 30, 3);
  expect_listing(g_root, "ck");
  run_job(b, 1, dir, 3, 30, 0);
  free(a);
  free(b);
}

/* An existing directory that is not a checkpoint (with a file, empty) or
 * an existing file: every rank MPG_ERR_INVALID, nothing touched. */
Test(ckpt_dir, refuses_what_is_not_a_checkpoint, .timeout = 120, .fini = root_fini) {
  char dir[4200], keep[4300];
  ck_case *a = case_in_ck("refuse", 510, 4, 2, dir, sizeof dir);
  snprintf(keep, sizeof keep, "%s/keep.txt", dir);
  cr_assert_eq(mkdir(dir, 0755), 0);
  FILE *f = fopen(keep, "w");
  cr_assert_not_null(f);
  fputs("not a checkpoint\n", f);
  fclose(f);
  ck_job *j = run_job_ex(a, 0, dir, 1, 1, 0, MPG_ERR_INVALID, NULL);
  cr_log_info("save into a directory with a file: %s", j->err[0]);
  free(j);
  expect_listing(dir, "keep.txt");
  expect_listing(g_root, "ck");
  cr_assert_eq(remove(keep), 0);
  free(run_job_ex(a, 0, dir, 1, 1, 0, MPG_ERR_INVALID, NULL));
  expect_listing(dir, "");
  expect_listing(g_root, "ck");
  cr_assert_eq(rmdir(dir), 0);
  f = fopen(dir, "w");
  cr_assert_not_null(f);
  fclose(f);
  free(run_job_ex(a, 0, dir, 1, 1, 0, MPG_ERR_INVALID, NULL));
  expect_listing(g_root, "ck");
  free(a);
}

/* ------------------------------------------------------------------ */
/* Bad inputs                                                          */
/* ------------------------------------------------------------------ */

/* Under a new root (root_init(tag)): a case saved in dir (the root's "ck")
 * by 4 ranks (version 1, step 7), to be loaded by 3; to free. */
static ck_case *bad_case(const char *tag, unsigned seed, char *dir, size_t cap) {
  root_init(tag);
  ck_case *c = malloc(sizeof *c);
  cr_assert_not_null(c);
  ck_case_make(c, seed, 4, 3, 1);
  snprintf(dir, cap, "%s/ck", g_root);
  run_job(c, 0, dir, 1, 7, 0);
  return c;
}

/* A load of c that must fail with `expect` on every rank, every message
 * holding the needles (NULL-ended), every buffer left as it was. */
static void load_fails(const ck_case *c, const char *dir, mpg_status expect,
                       const char *const *needles) {
  ck_job *j = run_job_ex(c, 1, dir, 1, 7, 0, expect, NULL);
  cr_log_info("%s: %s: %s", dir, mpg_status_name(expect), j->err[0]);
  for (int r = 0; r < c->mesh[1].world; r++)
    for (int k = 0; needles && needles[k]; k++)
      cr_assert(strstr(j->err[r], needles[k]), "rank %d's message does not name \"%s\": %s", r,
                needles[k], j->err[r]);
  free(j);
}

/* The first non-bytes tensor of c with the most elements. */
static int largest_tensor(const ck_case *c) {
  int best = 0;
  size_t most = 0;
  for (int k = 0; k < c->ntensors; k++) {
    size_t n = c->t[k].shape[0] * (c->t[k].ndim > 1 ? c->t[k].shape[1] : 1) *
               (c->t[k].ndim > 2 ? c->t[k].shape[2] : 1);
    if (!c->t[k].bytes && n > most) {
      most = n;
      best = k;
    }
  }
  return best;
}

/* The largest tensor of c (its index) and, in dir, the file and the bytes
 * [off, off + bytes) that hold its chunk (asserted). */
static int largest_chunk(const ck_case *c, const char *dir, char *path, size_t cap, uint64_t *off,
                         uint64_t *bytes) {
  int k = largest_tensor(c);
  cr_assert_eq(ckf_chunk_of(dir, c->t[k].name, path, cap, off, bytes), 0);
  return k;
}

Test(ckpt_bad, truncated_data_file, .timeout = 120, .fini = root_fini) {
  char dir[4200], path[4300];
  uint64_t off, bytes;
  ck_case *c = bad_case("trunc", 600, dir, sizeof dir);
  largest_chunk(c, dir, path, sizeof path, &off, &bytes);
  cr_assert_eq(truncate(path, (off_t)(off + bytes / 2)), 0);
  const char *needles[] = {strrchr(path, '/') + 1, NULL};
  load_fails(c, dir, MPG_ERR_IO, needles);
  free(c);
}

Test(ckpt_bad, flipped_byte_names_tensor_file_and_offset, .timeout = 120, .fini = root_fini) {
  char dir[4200], path[4300];
  uint64_t off, bytes;
  ck_case *c = bad_case("flip", 601, dir, sizeof dir);
  int k = largest_chunk(c, dir, path, sizeof path, &off, &bytes);
  cr_assert_eq(ckf_flip(path, off + bytes / 2), 0);
  /* the message names the damaged block's byte offset in the file */
  uint64_t bb = c->mesh[0].block_bytes, lo = off + bytes / 2 / bb * bb;
  char where[64];
  snprintf(where, sizeof where, "%llu", (unsigned long long)lo);
  const char *needles[] = {c->t[k].name, strrchr(path, '/') + 1, where, NULL};
  load_fails(c, dir, MPG_ERR_INVALID, needles);
  free(c);
}

Test(ckpt_bad, missing_tensor_and_missing_part, .timeout = 120, .fini = root_fini) {
  char dir[4200];
  ck_case *c = case_in_ck("missing", 602, 4, 3, dir, sizeof dir);
  c->mesh[0].skip[0] = 1; /* saved without tensor 0 */
  run_job(c, 0, dir, 1, 7, 0);
  const char *needles[] = {c->t[0].name, NULL};
  load_fails(c, dir, MPG_ERR_NOT_FOUND, needles);
  ckf_rm_rf(dir);
  /* Tensor 1 saved by dp_cp position 0 only, as a box or a range. */
  c->mesh[0].skip[0] = 0;
  c->mesh[0].skip[1] = 2;
  c->mesh[0].mode[1] = CK_RANGE;
  c->mesh[0].stage[1] = 0;
  snprintf(c->mesh[0].dims, sizeof c->mesh[0].dims, "dp=4");
  snprintf(c->mesh[0].flatten, sizeof c->mesh[0].flatten, "dp_cp=dp");
  c->mesh[0].pp = c->mesh[0].tp = 1;
  for (int k = 0; k < c->ntensors; k++) c->mesh[0].split[k] = 0;
  c->t[1].shape[0] = 64; /* enough for four parts */
  ck_job *j = run_job_ex(c, 0, dir, 1, 7, 0, MPG_OK, NULL);
  free(j);
  const char *part[] = {c->t[1].name, NULL};
  load_fails(c, dir, MPG_ERR_NOT_FOUND, part);
  free(c);
}

/* A dtype of the same size, another shape, another kind. */
Test(ckpt_bad, dtype_shape_kind_mismatch, .timeout = 120, .fini = root_fini) {
  char dir[4200];
  ck_case *c = bad_case("mismatch", 603, dir, sizeof dir), *c2 = malloc(sizeof *c2);
  int k = largest_tensor(c);
  static const mpg_dtype twin[6] = {MPG_I32, MPG_I64, MPG_BF16, MPG_F16, MPG_F32, MPG_F64};
  *c2 = *c;
  c2->t[k].dtype = twin[c->t[k].dtype];
  const char *needles[] = {c->t[k].name, NULL};
  load_fails(c2, dir, MPG_ERR_INVALID, needles);
  *c2 = *c;
  int a = c->t[k].split_axis == 0 && c->t[k].ndim > 1 ? 1 : 0;
  if (c->t[k].split_axis == a) c2->mesh[1].split[k] = 0;
  c2->t[k].shape[a] += 1;
  load_fails(c2, dir, MPG_ERR_INVALID, needles);
  *c2 = *c;
  c2->t[k].kind = c->t[k].kind == MPG_CKPT_PARAM ? MPG_CKPT_STATE : MPG_CKPT_PARAM;
  if (c2->mesh[1].mode[k] == CK_STATE) c2->mesh[1].mode[k] = CK_WHOLE;
  /* The kinds in the words `meshpg ckpt info` uses (issue 47). */
  const char *kinds[] = {c->t[k].name, " param [", " state [", NULL};
  load_fails(c2, dir, MPG_ERR_INVALID, kinds);
  free(c);
  free(c2);
}

Test(ckpt_bad, future_version_and_corrupt_metadata, .timeout = 120, .fini = root_fini) {
  char dir[4200], meta[4300];
  ck_case *c = bad_case("version", 604, dir, sizeof dir);
  cr_assert_eq(ckf_patch_version(dir, 2), 0);
  load_fails(c, dir, MPG_ERR_UNSUPPORTED, NULL);
  cr_assert_eq(ckf_patch_version(dir, 1), 0);
  run_job(c, 1, dir, 1, 7, 0); /* patched back: loads */
  snprintf(meta, sizeof meta, "%s/meta.mpgc", dir);
  cr_assert_eq(ckf_flip(meta, 60), 0); /* the trailer no longer matches */
  const char *needles[] = {"meta.mpgc", NULL};
  load_fails(c, dir, MPG_ERR_INVALID, needles);
  free(c);
}

Test(ckpt_bad, not_a_checkpoint, .timeout = 120, .fini = root_fini) {
  char dir[4200], meta[4300];
  ck_case *c = bad_case("notckpt", 605, dir, sizeof dir);
  snprintf(meta, sizeof meta, "%s/meta.mpgc", dir);
  cr_assert_eq(remove(meta), 0); /* the data files without metadata */
  load_fails(c, dir, MPG_ERR_NOT_FOUND, NULL);
  ckf_rm_rf(dir);
  cr_assert_eq(mkdir(dir, 0755), 0); /* empty */
  load_fails(c, dir, MPG_ERR_NOT_FOUND, NULL);
  path_in(dir, sizeof dir, "nothing-here");
  load_fails(c, dir, MPG_ERR_NOT_FOUND, NULL);
  free(c);
}

/* Rank 1 changes one element of its first registered tensor (whole on
 * every rank) or of the trainer's bytes before the save. */
static int g_tweak_reg;
static void tweak(ck_rank *s, ck_job *j) {
  (void)j;
  if (s->rank != 1) return;
  ck_reg *g = &s->reg[g_tweak_reg];
  g->alloc[g->piece_at * g->esize] ^= 0x40;
}

Test(ckpt_bad, replicas_that_differ, .timeout = 120, .fini = root_fini) {
  root_init("replicas");
  ck_case *c = malloc(sizeof *c);
  cr_assert_not_null(c);
  plain_case(c, "dp=2,tp=2", "dp_cp=dp", 4, 3, 1000);
  ck_tensor *bt = &c->t[3];
  snprintf(bt->name, sizeof bt->name, "trainer");
  bt->bytes = 1;
  bt->kind = MPG_CKPT_BYTES;
  bt->ndim = 1;
  bt->shape[0] = 40;
  bt->split_axis = -1;
  c->ntensors = 4;
  c->mesh[1] = c->mesh[0];
  char dir[4200];
  path_in(dir, sizeof dir, "ck");
  run_job(c, 0, dir, 1, 7, 0); /* a good checkpoint first */
  for (g_tweak_reg = 0; g_tweak_reg < 4; g_tweak_reg += 3) {
    ck_job *j = run_job_ex(c, 0, dir, 2, 8, 0, MPG_ERR_INVALID, tweak);
    const char *name = c->t[g_tweak_reg].name;
    cr_log_info("replicas of %s differ: %s", name, j->err[0]);
    for (int r = 0; r < 4; r++)
      cr_assert(strstr(j->err[r], name), "rank %d: %s", r, j->err[r]);
    free(j);
    expect_listing(g_root, "ck");
    check_files(c, 0, dir, 7, 1); /* the old checkpoint is whole */
    run_job(c, 1, dir, 1, 7, 0);
  }
  free(c);
}

/* ENOSPC: a 1 MiB tmpfs in a private mount namespace (root only). */
/* In a child with its own 1 MiB tmpfs at mnt (ckf_in_private_tmpfs). */
static int enospc_child(const char *mnt, char *msg, size_t cap) {
  ck_case *c = calloc(1, sizeof *c);
  plain_case(c, "dp=2,cp=2", "dp_cp=dp,cp", 4, 3, 2000); /* 24 KB: fits */
  char dir[4300];
  snprintf(dir, sizeof dir, "%.4200s/ck", mnt);
  ck_job *j = calloc(1, sizeof *j);
  *j = (ck_job){.c = c, .which = 0, .dir = dir, .version = 1, .step = 1};
  if (mpg_thread_run(4, 60, ck_job_thread, j, NULL) != MPG_OK)
    return snprintf(msg, cap, "the small save: %s", j->msg[0]), 1;
  for (int k = 0; k < 3; k++) c->t[k].shape[0] = 200000; /* 2.4 MB: does not fit */
  c->ntensors = 3;
  *j = (ck_job){.c = c, .which = 0, .dir = dir, .version = 2, .step = 2,
                .expect = MPG_ERR_IO};
  if (mpg_thread_run(4, 60, ck_job_thread, j, NULL) != MPG_OK)
    return snprintf(msg, cap, "the large save: %s", j->msg[0]), 1;
  /* the data file that did not fit, with errno's text */
  for (int r = 0; r < 4; r++)
    if (!strstr(j->err[r], "No space left") || !strstr(j->err[r], "/data-"))
      return snprintf(msg, cap, "rank %d's message does not name a data file and ENOSPC: %s",
                      r, j->err[r]), 1;
  char list[1024];
  ckf_list(mnt, list, sizeof list);
  struct statvfs vfs;
  statvfs(mnt, &vfs);
  int n = snprintf(msg, cap, "%s | left in the tmpfs: \"%s\", %lu of %lu blocks free",
                   j->err[0], list, (unsigned long)vfs.f_bfree, (unsigned long)vfs.f_blocks);
  for (int k = 0; k < 3; k++) c->t[k].shape[0] = 2000; /* the old one loads */
  *j = (ck_job){.c = c, .which = 1, .dir = dir, .version = 1, .step = 1};
  if (mpg_thread_run(4, 60, ck_job_thread, j, NULL) != MPG_OK)
    return snprintf(msg + n, cap - (size_t)n, " | the old checkpoint: %s", j->msg[0]), 1;
  return strcmp(list, "ck") ? 2 : 0;
}

Test(ckpt_bad, no_space_left, .timeout = 120, .fini = root_fini) {
  root_init("enospc");
  expect_tmpfs_child("size=1m", enospc_child, " for ENOSPC", "ENOSPC",
                     "ENOSPC left files behind in the tmpfs");
}
