/* The issue-order checker (groups/order.c) under every policy scenario of
 * sync_scenarios.h on the thread backend: with MESHPG_CHECK_ORDER=1 the
 * checks at commit, at the end of every step and at the destroys must pass
 * for correct code, with placement off and on (two simulated nodes, ranks
 * dealt round-robin, so that placement renumbers them) and with eager and
 * lazy groups.  The pipeline scenarios (tied_pp2, tied_pp3) issue
 * different buckets on different stages: groups that share no member may
 * differ. */
#include <criterion/criterion.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../groups/order_cases.h"
#include "../support/rank_check.h"
#include "sync_scenarios.h"

typedef struct sarg {
  scenario *sc;
  int placement;
  sc_out out[SC_MAX_RANKS];
} sarg;

static mpg_status scenario_rank(const mpg_init_opts *in, void *arg) {
  sarg *a = arg;
  mpg_init_opts opts = *in;
  char host[32];
  if (a->placement) {
    snprintf(host, sizeof host, "node%d:boot", in->rank % 2);
    opts.host_id = host;
    opts.placement = 1;
  }
  return sc_run(&opts, a->sc, &a->out[in->rank]);
}

/* Every scenario for every world size it exists for; returns how many ran. */
static int run_all(int placement, int lazy) {
  sarg *a = calloc(1, sizeof *a);
  scenario *sc = malloc(sizeof *sc);
  cr_assert(a && sc);
  int ran = 0;
  static const int worlds[] = {4, 6, 8, 12};
  for (int k = 0; sc_names[k]; k++)
    for (size_t w = 0; w < sizeof worlds / sizeof worlds[0]; w++) {
      if (sc_build(sc, sc_names[k], worlds[w]) != 0) continue;
      sc->lazy = lazy;
      a->sc = sc;
      a->placement = placement;
      mpg_status st[SC_MAX_RANKS];
      mpg_status rc = mpg_thread_run(worlds[w], 20.0, scenario_rank, a, st);
      char all[8192];
      cr_assert_eq(rc, MPG_OK, "scenario %s on %d ranks (placement %d, lazy %d): %s%s",
                   sc_names[k], worlds[w], placement, lazy, mpg_last_error(),
                   rank_failures(all, sizeof all, worlds[w], st,
                                 (const char *)a->out + offsetof(sc_out, msg), sizeof a->out[0]));
      ran++;
    }
  free(sc);
  free(a);
  return ran;
}

/* The checker is on in this process: an extra collective fails a step. */
typedef struct oarg {
  char msg[OC_WORLD][2048];
} oarg;

static mpg_status extra_rank(const mpg_init_opts *opts, void *arg) {
  oarg *a = arg;
  return oc_run(opts, "sync_extra", a->msg[opts->rank], sizeof a->msg[0]);
}

static void check_order_on(void) {
  setenv("MESHPG_CHECK_ORDER", "1", 1);
  oarg *a = calloc(1, sizeof *a);
  cr_assert_not_null(a);
  mpg_status rc = mpg_thread_run(OC_WORLD, 20.0, extra_rank, a, NULL);
  cr_assert_eq(rc, MPG_OK, "the checker did not catch an extra collective: %s\n%s\n%s",
               mpg_last_error(), a->msg[0], a->msg[3]);
  free(a);
}

static void sweep(int placement, int lazy) {
  check_order_on();
  int ran = run_all(placement, lazy);
  cr_assert_geq(ran, 20, "only %d scenario runs", ran);
  cr_log_info("%d scenario runs with the checker on (placement %d, lazy %d)", ran,
              placement, lazy);
}

Test(sync_order, every_scenario_passes_eager, .timeout = 300) { sweep(0, 0); }
Test(sync_order, every_scenario_passes_lazy, .timeout = 300) { sweep(0, 1); }
Test(sync_order, every_scenario_passes_placed_eager, .timeout = 300) { sweep(1, 0); }
Test(sync_order, every_scenario_passes_placed_lazy, .timeout = 300) { sweep(1, 1); }
