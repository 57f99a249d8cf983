/* meshpg sim: N simulated ranks (threads of this process, the thread
 * backend) train a Megatron-style MLP with tp, cp and dp, synchronising
 * gradients with mpg_sync exactly like a real trainer (replicated, or in
 * the library's shard mode: distributed optimizer, HSDP, FSDP); the result
 * is checked against the same model trained in one process.
 *
 * This file is the command's entry point: the flags, the mesh, the job,
 * the reference and the ranks' run, the report, in that order.  The files
 * that do each step are listed in sim_internal.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sim_internal.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int cmd_sim(int argc, char **argv) {
  sim_args args;
  int rc = sim_args_parse(argc, argv, &args);
  if (rc >= 0) return rc;

  mpg_spec spec = MPG_SPEC_INIT;
  mpg_mesh *mesh = NULL;
  char added[160], split_note[120];
  rc = sim_mesh_build(&args, &spec, &mesh, added, sizeof added, split_note,
                      sizeof split_note);
  if (rc != TOOL_EXIT_OK) return rc;
  int world_size = mpg_mesh_world_size(mesh);

  sim_job job;
  memset(&job, 0, sizeof job);
  job.mesh = mesh;
  rc = TOOL_EXIT_FAIL;
  sim_reference ref;
  memset(&ref, 0, sizeof ref);
  if (!sim_job_setup(&job, &args, &spec)) goto out;
  double timeout = args.timeout;
  if (timeout <= 0) timeout = spec.backend.timeout_s > 0 ? spec.backend.timeout_s : 600.0;
  if (!args.quiet) sim_report_header(&job, &spec, added, split_note, args.tol);

  double t0 = now_s();
  if (sim_reference_train(&job.model, job.steps, &ref) != 0) {
    tool_error("out of memory for the reference model");
    goto out;
  }
  double t_ref = now_s() - t0;
  job.ref = &ref;
  job.results = calloc((size_t)world_size, sizeof(sim_result));
  if (!job.results) {
    tool_error("out of memory for %d ranks", world_size);
    goto out;
  }
  t0 = now_s();
  mpg_status st = mpg_thread_run(world_size, timeout, sim_rank_main, &job, NULL);
  double t_run = now_s() - t0;
  /* A rank that never got to run leaves its slot empty. */
  int started = 0;
  for (int r = 0; r < world_size; r++) started += job.results[r].started;
  if (st != MPG_OK && started == 0) {
    /* mpg_thread_run refused the world (size, threads): no rank ran */
    tool_fail(st, NULL);
    goto out;
  }
  rc = sim_report_results(&job, world_size, st, args.tol, t_run, t_ref);

out:
  fflush(stdout);
  free(job.results);
  sim_reference_free(&ref);
  mpg_mesh_destroy(mesh);
  return rc;
}
