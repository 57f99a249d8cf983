/* The job of `meshpg sim`: the model's size and data from the flags and
 * the mesh, the sync mode (replicated, shard, FSDP), and the options of
 * its syncs: reduce dims, buckets and the gradient factors the ranks apply
 * in advance. */
#include <stdio.h>

#include "sim_internal.h"

const char *const sim_param_names[SIM_NPARAMS] = {"w1", "b1", "w2", "b2"};

/* The model and its data, the mode and --fail-rank.  Returns 1, or 0 after
 * an error message. */
static int model_setup(sim_job *job, const sim_args *a, const mpg_spec *spec) {
  int hidden = a->hidden;
  double lr = a->lr;
  if (hidden == 0) hidden = (32 + job->tp - 1) / job->tp * job->tp;
  if (hidden % job->tp != 0) {
    tool_error("--hidden: %d hidden units do not split over tp=%d "
               "(give a multiple of %d)", hidden, job->tp, job->tp);
    return 0;
  }
  if (lr == 0.0) lr = a->adam ? 0.01 : 0.5;
  job->model.seed = a->seed;
  job->model.d_in = SIM_D_IN;
  job->model.d_out = SIM_D_OUT;
  job->model.hidden = hidden;
  job->model.batch = a->batch ? a->batch : 2 * job->dp * a->micro;
  job->model.seq = a->seq ? a->seq : 4 * job->cp;
  job->model.lr = lr;
  job->model.adam = a->adam;
  job->steps = a->steps;
  job->microbatches = a->micro;
  job->quiet = a->quiet;
  job->lazy_groups = spec->backend.lazy_groups;
  job->mode = a->fsdp || spec->sync.fsdp_owns_dp                             ? SIM_FSDP
              : a->shard || a->hsdp || spec->sync.mode == MPG_SYNC_SHARD ? SIM_SHARD
                                                                         : SIM_REPLICATE;
  job->fail_rank = a->fail_rank;
  job->fail_step = a->fail_step;
  int world_size = mpg_mesh_world_size(job->mesh);
  if (a->fail_rank >= world_size) {
    tool_error("--fail-rank: rank %d is outside the world of %d ranks",
               a->fail_rank, world_size);
    return 0;
  }
  return 1;
}

/* The options of the syncs: the spec's [sync], --bucket-mb, and what the
 * mode needs.  Returns 1, or 0 after an error message. */
static int sync_setup(sim_job *job, const sim_args *a, const mpg_spec *spec) {
  const mpg_mesh *mesh = job->mesh;
  mpg_sync_opts sopts = MPG_SYNC_OPTS_INIT;
  sopts.sync = spec->sync;
  if (a->bucket_mb > 0) {
    sopts.sync.bucket_mb = a->bucket_mb;
    if (sopts.sync.first_bucket_mb > a->bucket_mb) sopts.sync.first_bucket_mb = a->bucket_mb;
  }
  job->b2_factor = 1.0;
  if (job->mode == SIM_FSDP) {
    /* The first sync averages over cp only (FSDP owns dp); the second, in
     * shard mode over dp, does FSDP's part with the library. */
    if (job->dim_dp < 0) {
      tool_error("--fsdp: FSDP owns the dim dp, which this mesh does not have "
                 "(it has dp_replicate and dp_shard: use --shard or --hsdp)");
      return 0;
    }
    sopts.sync.fsdp_owns_dp = 1;
    sopts.sync.mode = MPG_SYNC_REPLICATE;
    sopts.sync.shard_dims[0] = sopts.sync.replicate_dims[0] = '\0';
    job->shard_opts = sopts;
    job->shard_opts.sync.fsdp_owns_dp = 0;
    job->shard_opts.sync.mode = MPG_SYNC_SHARD;
    snprintf(job->shard_opts.sync.shard_dims, sizeof job->shard_opts.sync.shard_dims, "%s", "dp");
    job->b2_dims = "dp,tp";
  } else if (job->mode == SIM_SHARD) {
    sopts.sync.fsdp_owns_dp = 0;
    sopts.sync.mode = MPG_SYNC_SHARD;
    if (a->hsdp) {
      snprintf(sopts.sync.shard_dims, sizeof sopts.sync.shard_dims, "%s", "dp_shard,cp");
      snprintf(sopts.sync.replicate_dims, sizeof sopts.sync.replicate_dims, "%s", "dp_replicate");
    }
    /* Together the two must average over every data-parallel rank once. */
    unsigned smask, rmask = 0, data;
    if (tool_dims_mask(mesh, "dp_cp", "dp_cp", &data) != 0 ||
        tool_dims_mask(mesh, sopts.sync.shard_dims[0] ? sopts.sync.shard_dims : "dp_cp",
                      "[sync] shard_dims", &smask) != 0 ||
        (sopts.sync.replicate_dims[0] &&
         tool_dims_mask(mesh, sopts.sync.replicate_dims, "[sync] replicate_dims", &rmask) != 0))
      return 0;
    if ((smask & rmask) != 0 || (smask | rmask) != data) {
      tool_error("sim: shard_dims \"%s\" and replicate_dims \"%s\" must together "
                 "name each data dim (those of dp_cp) exactly once, or the gradient "
                 "is not averaged over every data-parallel rank",
                 sopts.sync.shard_dims[0] ? sopts.sync.shard_dims : "dp_cp",
                 sopts.sync.replicate_dims);
      return 0;
    }
    job->b2_dims = "dp_cp,tp";
  } else {
    sopts.sync.fsdp_owns_dp = 0;
  }
  /* b2 reduced over tp as well (shard modes): its tp copies are equal, so
   * an average leaves them as they are, and a sum needs 1/tp. */
  if (job->b2_dims && sopts.sync.op == MPG_OP_SUM) job->b2_factor = 1.0 / job->tp;
  job->sync_opts = sopts;
  /* The divisor the reductions apply, which each rank's gradient carries
   * in advance: every data-parallel rank (dp x cp) once, whatever the
   * mode. */
  job->grad_factor = sopts.sync.op == MPG_OP_AVG ? (double)job->dp * job->cp : 1.0;
  return 1;
}

int sim_job_setup(sim_job *job, const sim_args *a, const mpg_spec *spec) {
  return sim_mesh_check(job->mesh, job) && model_setup(job, a, spec) &&
         sync_setup(job, a, spec);
}
