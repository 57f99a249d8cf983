/* The issue-order checker (groups/order.c): the cases of order_cases.h on
 * the thread backend (every rank a thread) and under real mpirun processes
 * of order_mpi_worker (MESHPG_ORDER_MPI_WORKER, set by meson when MPI is
 * built).  Each test sets MESHPG_CHECK_ORDER itself (one process per
 * test), whatever the build's default. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../support/mpirun_util.h"
#include "../support/rank_check.h"
#include "order_cases.h"

typedef struct oarg {
  const char *mode;
  char msg[OC_WORLD][2048];
} oarg;

static mpg_status rank_main(const mpg_init_opts *opts, void *arg) {
  oarg *a = arg;
  return oc_run(opts, a->mode, a->msg[opts->rank], sizeof a->msg[0]);
}

/* Run case `mode` on the thread backend and assert that every rank saw
 * the expected outcome. */
static void run_case(const char *mode, const char *check_order) {
  setenv("MESHPG_CHECK_ORDER", check_order, 1);
  oarg *a = calloc(1, sizeof *a);
  cr_assert_not_null(a);
  a->mode = mode;
  mpg_status st[OC_WORLD];
  mpg_status rc = mpg_thread_run(OC_WORLD, 20.0, rank_main, a, st);
  char all[8192];
  cr_assert_eq(rc, MPG_OK, "case %s: %s%s", mode, mpg_last_error(),
               rank_failures(all, sizeof all, OC_WORLD, st, a->msg, sizeof a->msg[0]));
  free(a);
}

Test(order_thread, same_collectives_pass_and_are_not_counted) { run_case("agree", "1"); }
Test(order_thread, dp_where_the_others_issue_tp_fails_everywhere) { run_case("swap", "1"); }
Test(order_thread, another_count_on_a_shared_group_fails_everywhere) {
  run_case("count", "1");
}
Test(order_thread, an_extra_collective_fails_everywhere) { run_case("extra", "1"); }
Test(order_thread, beyond_and_inside_a_wrapped_log) { run_case("wrap", "1"); }
Test(order_thread, splits_in_another_order_fail_everywhere) { run_case("split", "1"); }
Test(order_thread, sync_steps_pass) { run_case("sync", "1"); }
Test(order_thread, an_extra_collective_fails_the_step_on_every_rank) {
  run_case("sync_extra", "1");
}
Test(order_thread, off_passes_a_swap) { run_case("off", "0"); }

/* A value other than 0 or 1 is refused by mpg_ctx_create. */
static mpg_status bad_env_main(const mpg_init_opts *opts, void *arg) {
  (void)arg;
  mpg_spec spec = MPG_SPEC_INIT;
  mpg_mesh *mesh = NULL;
  mpg_ctx *ctx = NULL;
  mpg_status st = mpg_spec_init(&spec);
  if (!st) st = mpg_spec_set_mesh(&spec, "dp=1");
  if (!st) st = mpg_mesh_create(&spec, 1, &mesh);
  if (!st) st = mpg_ctx_create(mesh, opts, &ctx);
  mpg_ctx_destroy(ctx);
  mpg_mesh_destroy(mesh);
  return st;
}

Test(order_thread, a_bad_value_is_an_env_error) {
  setenv("MESHPG_CHECK_ORDER", "yes", 1);
  mpg_status st = mpg_thread_run(1, 5.0, bad_env_main, NULL, NULL);
  cr_assert_eq(st, MPG_ERR_ENV, "got %s: %s", mpg_status_name(st), mpg_last_error());
  cr_assert(strstr(mpg_last_error(), "MESHPG_CHECK_ORDER=\"yes\""), "%s", mpg_last_error());
}

/* mpirun -np 4 order_mpi_worker MODE with the checker on; every rank must
 * print "OK MODE rank R" (mpirun_ok). */
static void run_mpi(const char *mode) {
  const char *worker = getenv("MESHPG_ORDER_MPI_WORKER");
  if (!worker) cr_skip_test("built without MPI");
  mpirun_ok(&(mpirun_job){.np = OC_WORLD, .worker = worker, .args = mode, .limit_s = 200,
                          .opts = "-x MESHPG_CHECK_ORDER=1"});
}

Test(order_mpi, same_collectives_pass, .timeout = 240) { run_mpi("agree"); }
Test(order_mpi, dp_where_the_others_issue_tp_fails_everywhere, .timeout = 240) {
  run_mpi("swap");
}
Test(order_mpi, an_extra_collective_fails_everywhere, .timeout = 240) { run_mpi("extra"); }
Test(order_mpi, sync_steps_pass, .timeout = 240) { run_mpi("sync"); }
Test(order_mpi, an_extra_collective_fails_the_step_on_every_rank, .timeout = 240) {
  run_mpi("sync_extra");
}
