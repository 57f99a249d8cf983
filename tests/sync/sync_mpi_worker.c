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
 * otherwise; exit code 0 / 1 (worker_main.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shard_check.h"
#include "../support/clock.h"
#include "../support/sync_util.h"
#include "../support/time_bound.h"
#include "../support/worker_main.h"

/* The scenarios named (or "all": every one that exists for this world),
 * one context after another. */
static int run_scenarios(worker *w) {
  int ran = 0;
  scenario *sc = malloc(sizeof *sc);
  sc_out *out = malloc(sizeof *out);
  int all = strcmp(w->mode, "all") == 0;
  int n = all ? (int)(sizeof sc_names / sizeof sc_names[0]) - 1 : w->argc;
  for (int k = 0; k < n && sc && out; k++) {
    const char *name = all ? sc_names[k] : w->argv[k];
    if (sc_build(sc, name, w->world) != 0) {
      if (!all) fail("no scenario %s for %d ranks", name, w->world);
      continue;
    }
    double t0 = now_s();
    mpg_status st = sc_run(&w->opts, sc, out);
    ran++;
    if (st != MPG_OK)
      fail("scenario %s: %s: %s", name, mpg_status_name(st), out->msg);
    else if (w->rank == 0)
      printf("scenario %s: %d buckets in %d buffers, %.2f s\n", name, out->nbuckets,
             out->nbuffers, now_s() - t0);
  }
  free(sc);
  free(out);
  if (!ran) fail("no scenario ran");
  return 0;
}

/* Shard mode: the fixed cases for this world size, then random ones. */
static int run_shard(worker *w) {
  int ran = 0;
  shard_case *c = malloc(sizeof *c);
  sc_out *out = malloc(sizeof *out);
  int nfixed = (int)(sizeof shc_names / sizeof shc_names[0]) - 1;
  for (int k = 0; k < nfixed + 12 && c && out; k++) {
    if (k >= nfixed) shc_random(c, 500u + (unsigned)k, w->world);
    else if (shc_build(c, shc_names[k], w->world) != 0) continue;
    double t0 = now_s();
    mpg_status st = shc_run(&w->opts, c, out);
    ran++;
    if (st != MPG_OK)
      fail("case %s (mesh %s, shard \"%s\", replicate \"%s\"): %s: %s", c->name, c->mesh,
           c->shard_dims, c->replicate_dims, mpg_status_name(st), out->msg);
    else if (w->rank == 0)
      printf("shard case %s (mesh %s, shard \"%s\", replicate \"%s\"): %d buckets, %.2f s\n",
             c->name, c->mesh, c->shard_dims, c->replicate_dims, out->nbuckets, now_s() - t0);
  }
  free(c);
  free(out);
  if (!ran) fail("no case ran");
  return 0;
}

static int run_timeout(worker *w) {
  const double timeout = 1.0;
  int rank = w->rank, world = w->world;
  mpg_mesh *mesh = NULL;
  mpg_ctx *ctx = NULL;
  mpg_sync *s = NULL;
  TRY(mesh_build(world == 8 ? "dp=2,cp=2,tp=2" : "dp=2,cp=2", "dp_cp=dp,cp", 0, &mesh));
  mpg_init_opts opts = w->opts;
  opts.backend.timeout_s = timeout;
  TRY(mpg_ctx_create(mesh, &opts, &ctx));
  rank = mpg_ctx_rank(ctx);
  TRY(sync_make(ctx, 0.001, 6, 300, &s));
  TRY(mpg_sync_all(s, 0, NULL));
  TRY(mpg_sync_begin(s, 1, 1, NULL));
  for (int p = 5; p >= 1; p--) TRY(mpg_sync_mark_ready(s, p));
  if (rank == world - 1) {
    /* Never marks w0, never finishes: waits out the others, then leaves. */
    sleep_s(timeout + 1.5);
    TRY(mpg_sync_destroy(s));
    s = NULL;
  } else {
    TRY(mpg_sync_mark_ready(s, 0));
    double t0 = now_s();
    mpg_status st = mpg_sync_finish(s);
    double dt = now_s() - t0;
    if (st != MPG_ERR_TIMEOUT && st != MPG_ERR_ABORTED)
      FAIL_DONE("finish -> %s, expected a timeout: %s", mpg_status_name(st), mpg_last_error());
    if (!strstr(mpg_last_error(), "sync step 1: bucket"))
      FAIL_DONE("the message does not name the step and bucket: %s", mpg_last_error());
    if (dt > tb_bound(timeout + 1.0, world)) FAIL_DONE("finish failed after %.2f s", dt);
    printf("rank %d: %s after %.2f s: %s\n", rank, mpg_status_name(st), dt, mpg_last_error());
    if (mpg_sync_grads_valid(s) != 0) FAIL_DONE("grads_valid is 1 after a failed step");
    st = mpg_sync_begin(s, 2, 1, NULL);
    if (st != MPG_ERR_ABORTED || !strstr(mpg_last_error(), "aborted in step 1"))
      FAIL_DONE("begin after the failure -> %s: %s", mpg_status_name(st), mpg_last_error());
  }
done:
  mpg_sync_destroy(s);
  mpg_ctx_destroy(ctx);
  mpg_mesh_destroy(mesh);
  return 0;
}

/* timeout: one context, the library initialises (and finalises) MPI; the
 * others make several contexts one after another: MPI is ours. */
static const worker_case cases[] = {
    {"timeout", "", 0, 0, run_timeout, 0},
    {"shard", "", 0, 0, run_shard, WK_MPI_SERIALIZED},
    {NULL, "all | SCENARIO...", 1, -1, run_scenarios, WK_MPI_SERIALIZED},
};
WORKER_MAIN(cases)
