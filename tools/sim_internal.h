/* What the files of `meshpg sim` share: its flags, the job the ranks run,
 * what each rank reports back, and the entry points of each file.
 *
 *   cmd_sim.c          the command: the steps below in order, and the run
 *   sim_args.c         flags, usage text, their checks against each other
 *   sim_report.c       what the command prints: header, table, verdict
 *   sim_rank.c         one simulated rank: its training loop (sim_rank_setup.h)
 *   sim_rank_setup.c   one simulated rank: its setup and teardown
 *   sim_job.c          the job: the model and the options of its syncs
 *   sim_mesh.c         the spec and the mesh the model runs on
 *   sim_model.c        the model itself and the single-process reference
 *
 * A file calls only files below it in this list (and the shared tools/
 * files), so they call each other in no cycle. */
#ifndef TOOLS_SIM_INTERNAL_H
#define TOOLS_SIM_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "cmd.h"
#include "sim_model.h"

#define SIM_D_IN 16
#define SIM_D_OUT 8
#define SIM_MAX_SETS (MPG_MAX_DIMS + MPG_MAX_FLATTEN)
#define SIM_GROUP_STR 48
#define SIM_MSG_MAX 400

/* Names of the parameters, in SIM_W1 .. SIM_B2 order (sim_job.c). */
extern const char *const sim_param_names[SIM_NPARAMS];

/* The flags of the command line (sim_args.c); 0 where not given unless
 * said otherwise. */
typedef struct sim_args {
  tool_spec spec;          /* SPEC.toml, --mesh, --flatten, --order, --world */
  int steps;               /* default 20 */
  int fsdp, shard, hsdp;   /* --fsdp, --shard, --hsdp R */
  int micro;               /* --microbatches, default 1 */
  int quiet;
  int batch, seq, hidden;
  int adam;                /* --optim: 1 adam (default), 0 sgd */
  double timeout, lr, bucket_mb;
  double tol;              /* default 1e-5 */
  uint64_t seed;           /* default 1 */
  int fail_rank, fail_step; /* --fail-rank R[:S]; fail_rank -1: none */
} sim_args;

/* How the ranks keep gradients and parameters. */
typedef enum sim_mode {
  SIM_REPLICATE = 0, /* one sync, all-reduce over dp_cp, full optimizer */
  SIM_SHARD = 1,     /* one sync in shard mode (--shard, --hsdp, the spec) */
  SIM_FSDP = 2       /* fsdp_owns_dp sync over cp + shard-mode sync over dp */
} sim_mode;

/* What one rank reports back; written only by that rank. */
typedef struct sim_result {
  mpg_status status;
  int done;                        /* reached the comparison */
  int injected;                    /* stopped by --fail-rank */
  int started;                     /* its thread ran */
  char msg[SIM_MSG_MAX];           /* first failure */
  int coord[MPG_MAX_DIMS];
  char group[SIM_MAX_SETS][SIM_GROUP_STR]; /* members of its group of each dim set */
  char reduce[SIM_GROUP_STR];      /* its sync reduce group, "dp_cp(4)" */
  double err;                      /* max relative error over its params */
  int worst_param;
  mpg_sync_stats stats;            /* of its (first) sync */
  mpg_sync_stats shard_stats;      /* shard modes: of the sharded sync */
  long owned[SIM_NPARAMS];         /* shard modes: owned elements per param */
} sim_result;

/* The job: read-only while the ranks run (results aside). */
typedef struct sim_job {
  const mpg_mesh *mesh;
  sim_model model;
  int steps, microbatches, quiet, lazy_groups;
  sim_mode mode;
  int fail_rank, fail_step;   /* --fail-rank; -1: none */
  mpg_sync_opts sync_opts;    /* the (first) sync */
  mpg_sync_opts shard_opts;   /* SIM_FSDP: the sharded sync over dp */
  /* mesh dim indices: data dims dp, or dp_replicate x dp_shard (-1 when
   * absent), then cp and tp */
  int dim_dp, dim_dpr, dim_dps, dim_cp, dim_tp;
  int dp, dpr, dps, cp, tp;   /* dp: every data-parallel rank (dpr * dps) */
  int nsets;                  /* dim sets shown: every one but "world" */
  double grad_factor;         /* the library's divisor, undone in advance */
  double b2_factor;           /* extra factor of b2's gradient (see setup) */
  const char *b2_dims;        /* shard modes: b2's own reduce dims */
  const sim_reference *ref;
  sim_result *results;
} sim_job;

/* sim_args.c: parse the command line into *a.  Returns -1 to go on, or the
 * exit code to return at once: TOOL_EXIT_OK after --help, TOOL_EXIT_USAGE
 * after a usage error (already reported). */
int sim_args_parse(int argc, char **argv, sim_args *a);

/* sim_mesh.c: the spec (a file, --mesh, or the default mesh), checked
 * against the mode flags, completed with what the model needs and, with
 * --hsdp, its dp split; then its mesh in *mesh.  `added` and `note` say
 * what was added and split, for the header ("" when nothing).  Returns
 * TOOL_EXIT_OK, or TOOL_EXIT_FAIL after an error message (*mesh NULL). */
int sim_mesh_build(const sim_args *a, mpg_spec *spec, mpg_mesh **mesh,
                   char *added, size_t added_cap, char *note, size_t note_cap);

/* sim_mesh.c: the mesh must be the model's (data dims dp, or dp_replicate
 * and dp_shard; cp and tp; other dims of size 1; dp_cp exactly the data
 * dims and cp): fills the dims and sizes of *job.  Returns 1, or 0 after an
 * error message. */
int sim_mesh_check(const mpg_mesh *mesh, sim_job *job);

/* sim_mesh.c: "dims (N ranks)" of a dims list, into buf. */
void sim_dims_label(const mpg_mesh *mesh, const char *dims, char *buf, size_t cap);

/* sim_job.c: fill *job (its mesh already set) from the flags and the spec:
 * the mesh checked, the model, the mode and the options of its syncs.
 * Returns 1, or 0 after an error message. */
int sim_job_setup(sim_job *job, const sim_args *a, const mpg_spec *spec);

/* sim_rank.c: one simulated rank, run by mpg_thread_run with the job as
 * `arg`: sets up, trains, compares with the reference, reports in its
 * slot of job->results. */
mpg_status sim_rank_main(const mpg_init_opts *opts, void *arg);

/* sim_report.c: what the job is about to do (the lines before training). */
void sim_report_header(const sim_job *job, const mpg_spec *spec,
                       const char *added, const char *split_note, double tol);

/* sim_report.c: after mpg_thread_run returned st with at least one rank
 * run: the table and statistics (unless quiet), then the verdict.  Sets
 * the status of a rank that did not finish.  Returns the exit code. */
int sim_report_results(sim_job *job, int world_size, mpg_status st, double tol,
                       double t_run, double t_ref);

#endif
