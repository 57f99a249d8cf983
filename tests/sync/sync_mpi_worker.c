/* One MPI process of the sync tests, started by mpirun from
 * test_sync_mpi.c.  The rank and world size come from the Open MPI
 * environment.
 *
 *   sync_mpi_worker all          every scenario of sync_scenarios.h that
 *                                exists for this world size, one context
 *                                after another (so this program initialises
 *                                MPI itself)
 *   sync_mpi_worker NAME...      just those scenarios
 *   sync_mpi_worker shard        the shard-mode cases of shard_check.h
 *                                (fixed ones for this world size, then 12
 *                                random ones): owned gradient values,
 *                                owned ranges that partition every param
 *                                over each shard group, gathered params
 *   sync_mpi_worker timeout      the last rank never marks one gradient
 *                                and skips finish: the others' finish must
 *                                fail with a timeout (or abort) within the
 *                                timeout + 1 s, mark the gradients invalid,
 *                                and the next begin must say the context
 *                                was aborted; everybody exits cleanly.
 *
 * Prints "OK <mode> rank R" on success, "FAIL <mode> rank R: ..." lines
 * otherwise; exit code 0 / 1. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "shard_check.h"
#include "../support/clock.h"
#include "../support/time_bound.h"


static int run_scenarios(int argc, char **argv, int rank, int world) {
  int failures = 0, ran = 0;
  scenario *sc = malloc(sizeof *sc);
  sc_out *out = malloc(sizeof *out);
  if (!sc || !out) return 1;
  int all = strcmp(argv[1], "all") == 0;
  int n = all ? (int)(sizeof sc_names / sizeof sc_names[0]) - 1 : argc - 1;
  for (int k = 0; k < n; k++) {
    const char *name = all ? sc_names[k] : argv[1 + k];
    if (sc_build(sc, name, world) != 0) {
      if (all) continue;
      printf("FAIL %s rank %d: no scenario %s for %d ranks\n", argv[1], rank, name, world);
      failures++;
      continue;
    }
    mpg_init_opts opts = MPG_INIT_OPTS_INIT;
    opts.backend.name = MPG_BACKEND_MPI;
    opts.backend.timeout_s = 60;
    double t0 = now_s();
    mpg_status st = sc_run(&opts, sc, out);
    ran++;
    if (st != MPG_OK) {
      printf("FAIL %s rank %d: scenario %s: %s: %s\n", argv[1], rank, name,
             mpg_status_name(st), out->msg);
      failures++;
    } else if (rank == 0) {
      printf("scenario %s: %d buckets in %d buffers, %.2f s\n", name, out->nbuckets,
             out->nbuffers, now_s() - t0);
    }
    fflush(stdout);
  }
  free(sc);
  free(out);
  if (!ran) {
    printf("FAIL %s rank %d: no scenario ran\n", argv[1], rank);
    failures++;
  }
  return failures;
}

/* Shard mode: the fixed cases for this world size, then random ones. */
static int run_shard(int rank, int world) {
  int failures = 0, ran = 0;
  shard_case *c = malloc(sizeof *c);
  sc_out *out = malloc(sizeof *out);
  if (!c || !out) return 1;
  int nfixed = (int)(sizeof shc_names / sizeof shc_names[0]) - 1;
  for (int k = 0; k < nfixed + 12; k++) {
    if (k < nfixed) {
      if (shc_build(c, shc_names[k], world) != 0) continue;
    } else {
      shc_random(c, 500u + (unsigned)k, world);
    }
    mpg_init_opts opts = MPG_INIT_OPTS_INIT;
    opts.backend.name = MPG_BACKEND_MPI;
    opts.backend.timeout_s = 60;
    double t0 = now_s();
    mpg_status st = shc_run(&opts, c, out);
    ran++;
    if (st != MPG_OK) {
      printf("FAIL shard rank %d: case %s (mesh %s, shard \"%s\", replicate \"%s\"): %s: %s\n",
             rank, c->name, c->mesh, c->shard_dims, c->replicate_dims, mpg_status_name(st),
             out->msg);
      failures++;
    } else if (rank == 0) {
      printf("shard case %s (mesh %s, shard \"%s\", replicate \"%s\"): %d buckets, %.2f s\n",
             c->name, c->mesh, c->shard_dims, c->replicate_dims, out->nbuckets, now_s() - t0);
    }
    fflush(stdout);
  }
  free(c);
  free(out);
  if (!ran) {
    printf("FAIL shard rank %d: no case ran\n", rank);
    failures++;
  }
  return failures;
}

#define T_FAIL(...)                                        \
  do {                                                     \
    printf("FAIL timeout rank %d: ", rank);                \
    printf(__VA_ARGS__);                                   \
    printf("\n");                                          \
    fflush(stdout);                                        \
    failures++;                                            \
    goto done;                                             \
  } while (0)

#define T_TRY(call)                                                            \
  do {                                                                         \
    mpg_status st_ = (call);                                                   \
    if (st_ != MPG_OK)                                                         \
      T_FAIL("line %d: %s -> %s: %s", __LINE__, #call, mpg_status_name(st_),   \
             mpg_last_error());                                                \
  } while (0)

static int run_timeout(int rank, int world) {
  const double timeout = 1.0;
  int failures = 0;
  mpg_mesh *mesh = NULL;
  mpg_ctx *ctx = NULL;
  mpg_sync *s = NULL;
  scenario *sc = calloc(1, sizeof *sc);
  if (!sc) return 1;
  sc->mesh = world == 8 ? "dp=2,cp=2,tp=2" : "dp=2,cp=2";
  sc->flatten = "dp_cp=dp,cp";
  T_TRY(sc_make_mesh(sc, &mesh));
  mpg_init_opts opts = MPG_INIT_OPTS_INIT;
  opts.backend.name = MPG_BACKEND_MPI;
  opts.backend.timeout_s = timeout;
  T_TRY(mpg_ctx_create(mesh, &opts, &ctx));
  rank = mpg_ctx_rank(ctx);
  mpg_sync_opts so = MPG_SYNC_OPTS_INIT;
  so.sync.bucket_mb = 0.001;
  so.sync.first_bucket_mb = 0.001;
  T_TRY(mpg_sync_create(ctx, &so, &s));
  for (int p = 0; p < 6; p++) {
    char name[16];
    int id;
    snprintf(name, sizeof name, "w%d", p);
    T_TRY(mpg_sync_add_param(s, name, 300, MPG_F32, NULL, &id));
  }
  T_TRY(mpg_sync_commit(s));
  T_TRY(mpg_sync_all(s, 0, NULL));
  T_TRY(mpg_sync_begin(s, 1, 1, NULL));
  for (int p = 5; p >= 1; p--) T_TRY(mpg_sync_mark_ready(s, p));
  if (rank == world - 1) {
    /* Never marks w0, never finishes: waits out the others, then leaves. */
    struct timespec ts = {(time_t)(timeout + 1), 500000000L};
    nanosleep(&ts, NULL);
    T_TRY(mpg_sync_destroy(s));
    s = NULL;
  } else {
    T_TRY(mpg_sync_mark_ready(s, 0));
    double t0 = now_s();
    mpg_status st = mpg_sync_finish(s);
    double dt = now_s() - t0;
    if (st != MPG_ERR_TIMEOUT && st != MPG_ERR_ABORTED)
      T_FAIL("finish -> %s, expected a timeout: %s", mpg_status_name(st), mpg_last_error());
    if (!strstr(mpg_last_error(), "sync step 1: bucket"))
      T_FAIL("the message does not name the step and bucket: %s", mpg_last_error());
    if (dt > tb_bound(timeout + 1.0, world)) T_FAIL("finish failed after %.2f s", dt);
    printf("rank %d: %s after %.2f s: %s\n", rank, mpg_status_name(st), dt, mpg_last_error());
    if (mpg_sync_grads_valid(s) != 0) T_FAIL("grads_valid is 1 after a failed step");
    st = mpg_sync_begin(s, 2, 1, NULL);
    if (st != MPG_ERR_ABORTED || !strstr(mpg_last_error(), "aborted in step 1"))
      T_FAIL("begin after the failure -> %s: %s", mpg_status_name(st), mpg_last_error());
  }
done:
  mpg_sync_destroy(s);
  mpg_ctx_destroy(ctx);
  mpg_mesh_destroy(mesh);
  free(sc);
  return failures;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    printf("usage: sync_mpi_worker all | shard | timeout | SCENARIO...\n");
    return 2;
  }
  mpg_launch env = MPG_LAUNCH_INIT;
  if (mpg_launch_from_env(&env) != MPG_OK || env.world_size < 1) {
    printf("FAIL %s rank ?: no MPI launch environment: %s\n", argv[1], mpg_last_error());
    return 1;
  }
  int rank = env.rank, world = env.world_size, failures;
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (strcmp(argv[1], "timeout") == 0) {
    /* One context: the library initialises (and finalises) MPI. */
    failures = run_timeout(rank, world);
  } else {
    /* Several contexts one after another: MPI is ours to initialise. */
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
    failures = strcmp(argv[1], "shard") == 0 ? run_shard(rank, world)
                                             : run_scenarios(argc, argv, rank, world);
    MPI_Finalize();
  }
  if (!failures) printf("OK %s rank %d\n", argv[1], rank);
  fflush(stdout);
  return failures ? 1 : 0;
}
