/* What `meshpg sim` prints: the header that says what the job is about to
 * do, and after the run the table of the ranks, the sync's statistics on
 * rank 0, the timings and the verdict. */
#include <stdio.h>
#include <string.h>

#include "sim_internal.h"

#define TABLE_ALL_UP_TO 64
#define TABLE_EDGE 16

void sim_report_header(const sim_job *job, const mpg_spec *spec,
                       const char *added, const char *split_note, double tol) {
  const mpg_mesh *mesh = job->mesh;
  const mpg_sync_opts *sopts = &job->sync_opts;
  const int world_size = mpg_mesh_world_size(mesh), hidden = job->model.hidden;
  const int micro = job->microbatches, steps = job->steps, adam = job->model.adam;
  const double lr = job->model.lr;
  const uint64_t seed = job->model.seed;
  /* The groups of the shard modes, checked by sim_job_setup. */
  char shard_label[96] = "", rep_label[96] = "";
  if (job->mode == SIM_FSDP) {
    sim_dims_label(mesh, job->shard_opts.sync.shard_dims, shard_label, sizeof shard_label);
  } else if (job->mode == SIM_SHARD) {
    sim_dims_label(mesh, sopts->sync.shard_dims[0] ? sopts->sync.shard_dims : "dp_cp", shard_label,
                   sizeof shard_label);
    if (sopts->sync.replicate_dims[0])
      sim_dims_label(mesh, sopts->sync.replicate_dims, rep_label, sizeof rep_label);
  }

  int nd = mpg_mesh_ndims(mesh);
  printf("meshpg sim: mesh");
  for (int d = 0; d < nd; d++) {
    const char *name;
    int size;
    mpg_mesh_dim(mesh, d, &name, &size);
    printf("%s%s=%d", d ? " x " : " ", name, size);
  }
  printf(" (world %d%s%s), %d rank%s as threads\n", world_size,
         spec->source[0] ? ", from " : "", spec->source, world_size,
         world_size == 1 ? "" : "s");
  if (added[0]) printf("  added for the model: %s\n", added);
  if (split_note[0]) printf("  %s\n", split_note);
  if (spec->backend.name != MPG_BACKEND_THREAD)
    printf("  (the spec's backend is not used: sim always runs the thread "
           "backend)\n");
  printf("model: MLP %d -> %d (tanh) -> %d; W1, b1 column-parallel and W2 "
         "row-parallel over tp=%d (%d hidden units each), b2 replicated%s\n",
         SIM_D_IN, hidden, SIM_D_OUT, job->tp, hidden / job->tp,
         job->b2_dims ? " (reduced over tp too, like a sequence-parallel norm)" : "");
  printf("data: %d samples x %d tokens per step (seed %llu): dp=%d splits "
         "the samples, cp=%d the tokens; %d micro-batch%s\n",
         job->model.batch, job->model.seq, (unsigned long long)seed, job->dp,
         job->cp, micro, micro == 1 ? "" : "es");
  const char *verb = sopts->sync.op == MPG_OP_AVG ? "averages" : "sums";
  if (job->mode == SIM_FSDP) {
    printf("sync: meshpg %s gradients over cp (%d ranks) (fsdp_owns_dp); a "
           "second sync in shard mode reduce-scatters them over %s: each rank "
           "updates the elements it owns, and the params are gathered before "
           "their first use\n",
           verb, job->cp, shard_label);
  } else if (job->mode == SIM_SHARD) {
    printf("sync: shard mode: meshpg reduce-scatters (%s) every bucket over %s",
           sopts->sync.op == MPG_OP_AVG ? "averaging" : "summing", shard_label);
    if (rep_label[0]) printf(", then all-reduces the owned shard over %s", rep_label);
    printf("; each rank updates the elements it owns, and the params are "
           "gathered before their first use\n");
  } else {
    printf("sync: meshpg %s gradients over dp_cp (%d ranks)\n", verb,
           job->dp * job->cp);
  }
  printf("training: %d %s steps, lr %g%s, compared with single-process f64 "
         "training (tolerance %.0e)\n",
         steps, adam ? "Adam" : "SGD", lr,
         adam && job->mode != SIM_REPLICATE ? " (state for the owned elements only)"
                                            : "",
         tol);
  fflush(stdout);
}

static void print_row_sep(int width) {
  for (int i = 0; i < width; i++) putchar('-');
  putchar('\n');
}

static void print_table(const sim_job *job, int world) {
  const mpg_mesh *mesh = job->mesh;
  int nd = mpg_mesh_ndims(mesh);
  int wset[SIM_MAX_SETS], wred = 6;
  for (int s = 0; s < job->nsets; s++) {
    const char *name;
    mpg_mesh_dimset_info(mesh, s, &name, NULL, NULL);
    wset[s] = (int)strlen(name);
    for (int r = 0; r < world; r++) {
      int l = (int)strlen(job->results[r].group[s]);
      if (l > wset[s]) wset[s] = l;
    }
  }
  for (int r = 0; r < world; r++) {
    int l = (int)strlen(job->results[r].reduce);
    if (l > wred) wred = l;
  }
  int width = printf("%5s ", "rank");
  for (int d = 0; d < nd; d++) {
    const char *name;
    mpg_mesh_dim(mesh, d, &name, NULL);
    width += printf(" %3s", name);
  }
  width += printf("  ");
  for (int s = 0; s < job->nsets; s++) {
    const char *name;
    mpg_mesh_dimset_info(mesh, s, &name, NULL, NULL);
    width += printf(" %-*s", wset[s], name);
  }
  width += printf("  %-*s", wred, "reduce");
  if (job->mode != SIM_REPLICATE) width += printf("  %7s", "owned");
  width += printf("  %s\n", "max rel err") - 1;
  print_row_sep(width);
  for (int r = 0; r < world; r++) {
    const sim_result *res = &job->results[r];
    int failed = res->status != MPG_OK || !res->done;
    if (world > TABLE_ALL_UP_TO && r >= TABLE_EDGE && r < world - TABLE_EDGE &&
        !failed) {
      if (r == TABLE_EDGE) printf("  ... (ranks %d..%d not shown)\n", TABLE_EDGE,
                                  world - TABLE_EDGE - 1);
      continue;
    }
    printf("%5d ", r);
    for (int d = 0; d < nd; d++) printf(" %3d", res->coord[d]);
    printf("  ");
    for (int s = 0; s < job->nsets; s++)
      printf(" %-*s", wset[s], res->group[s][0] ? res->group[s] : "?");
    printf("  %-*s", wred, res->reduce[0] ? res->reduce : "?");
    if (job->mode != SIM_REPLICATE) {
      long owned = 0;
      for (int k = 0; k < SIM_NPARAMS; k++) owned += res->owned[k];
      if (res->done)
        printf("  %7ld", owned);
      else
        printf("  %7s", "?");
    }
    if (res->done)
      printf("  %.1e\n", res->err);
    else
      printf("  failed: %s\n", mpg_status_name(res->status));
  }
}

/* The table, the statistics of rank 0 and the timings. */
static void print_stats(const sim_job *job, int world_size, double t_run, double t_ref) {
  const int hidden = job->model.hidden, steps = job->steps;
  putchar('\n');
  print_table(job, world_size);
  const sim_result *r0 = &job->results[0];
  if (r0->done) {
    printf("\nsync on rank 0: %d params, %d buffer%s, %d bucket%s, %zu bytes "
           "of %s, %ld bucket launches\n",
           r0->stats.num_params, r0->stats.num_buffers,
           r0->stats.num_buffers == 1 ? "" : "s", r0->stats.num_buckets,
           r0->stats.num_buckets == 1 ? "" : "s", r0->stats.total_bytes,
           job->mode == SIM_SHARD ? "gradients and params" : "gradients",
           r0->stats.launched_buckets);
    if (job->mode != SIM_REPLICATE) {
      const mpg_sync_stats *ss = &r0->shard_stats;
      long total = 0;
      for (int k = 0; k < SIM_NPARAMS; k++)
        total += k == SIM_W1 ? (long)SIM_D_IN * (hidden / job->tp)
                 : k == SIM_B1 ? hidden / job->tp
                 : k == SIM_W2 ? (long)(hidden / job->tp) * SIM_D_OUT
                               : SIM_D_OUT;
      long owned = 0;
      for (int k = 0; k < SIM_NPARAMS; k++) owned += r0->owned[k];
      printf("shard on rank 0: updates %ld of its %ld param elements, optimizer "
             "state of %zu elements (shard_elems), shard group of %d, %zu padding "
             "elements in %d bucket%s\n",
             owned, total, ss->shard_elems, ss->shard_size, ss->pad_elems,
             ss->num_buckets, ss->num_buckets == 1 ? "" : "s");
    }
  }
  printf("time: %d ranks x %d steps %.3f s (%.2f ms/step), reference %.3f s\n",
         world_size, steps, t_run, 1e3 * t_run / steps, t_ref);
}

/* The verdict when `failed` ranks failed (the first of them first_failed):
 * the root cause on stdout, then the messages of up to 4 others on
 * stderr. */
static void print_failure(const sim_job *job, int world_size, int failed,
                          int first_failed) {
  /* The root cause first: a rank stopped on purpose, then one that
   * failed by itself, then the first timeout, then an abort. */
  int root = first_failed, best = 4;
  for (int r = 0; r < world_size; r++) {
    const sim_result *x = &job->results[r];
    if (x->status == MPG_OK) continue;
    int prio = x->injected                          ? 0
               : x->status == MPG_ERR_ABORTED       ? 3
               : x->status == MPG_ERR_TIMEOUT       ? 2
               : x->msg[0]                          ? 1
                                                    : 3;
    if (prio < best) {
      best = prio;
      root = r;
    }
  }
  const sim_result *res = &job->results[root];
  printf("FAIL: %d of %d ranks failed; rank %d: %s\n", failed, world_size,
         root, res->msg[0] ? res->msg : mpg_status_name(res->status));
  fflush(stdout); /* the verdict before the details on stderr */
  int shown = 0;
  for (int r = 0; r < world_size && shown < 4; r++) {
    if (r == root || job->results[r].status == MPG_OK) continue;
    if (job->results[r].msg[0]) {
      tool_error("%s", job->results[r].msg);
      shown++;
    }
  }
}

int sim_report_results(sim_job *job, int world_size, mpg_status st, double tol,
                       double t_run, double t_ref) {
  int failed = 0, first_failed = -1, bad = 0, worst_rank = 0;
  double worst = 0.0;
  for (int r = 0; r < world_size; r++) {
    sim_result *res = &job->results[r];
    if (res->status != MPG_OK || !res->done) {
      if (res->status == MPG_OK) res->status = st != MPG_OK ? st : MPG_ERR_STATE;
      if (first_failed < 0) first_failed = r;
      failed++;
      continue;
    }
    if (!(res->err <= tol)) bad++;
    if (!(res->err <= worst)) {
      worst = res->err;
      worst_rank = r;
    }
  }
  if (st != MPG_OK && failed == 0) {
    /* every rank finished, yet the run failed */
    tool_fail(st, NULL);
    return TOOL_EXIT_FAIL;
  }
  if (!job->quiet) print_stats(job, world_size, t_run, t_ref);
  if (failed) {
    print_failure(job, world_size, failed, first_failed);
    return TOOL_EXIT_FAIL;
  }
  if (bad) {
    printf("FAIL: %d of %d ranks differ from the single-process reference "
           "(max rel err %.1e > %.0e at rank %d, param %s)\n",
           bad, world_size, worst, tol, worst_rank,
           sim_param_names[job->results[worst_rank].worst_param]);
    return TOOL_EXIT_FAIL;
  }
  printf("PASS: all %d rank%s match%s the single-process reference "
         "(max rel err %.1e <= %.0e)\n",
         world_size, world_size == 1 ? "" : "s", world_size == 1 ? "es" : "",
         worst, tol);
  return TOOL_EXIT_OK;
}
