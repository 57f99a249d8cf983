/* The launch environment: torchrun, Open MPI, PMI and Slurm variables, and
 * the errors for missing or contradictory ones.  Criterion runs each test in
 * its own process, so setenv() does not leak between tests. */
#include <criterion/criterion.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "meshpg.h"
#include "mesh_util.h"

static const char *const all_vars[] = {
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
    "MASTER_PORT", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", "PMI_RANK",
    "PMI_SIZE", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
    "SLURM_NTASKS_PER_NODE", "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE",
    "SLURM_NODEID"};

static void clean_env(void) {
  for (size_t i = 0; i < sizeof all_vars / sizeof all_vars[0]; i++)
    unsetenv(all_vars[i]);
}

TestSuite(launch, .init = clean_env);

/* Sets each "NAME=VALUE" of the space-separated list `env`. */
static void set_env(const char *env) {
  char buf[512];
  snprintf(buf, sizeof buf, "%s", env);
  for (char *save = NULL, *kv = strtok_r(buf, " ", &save); kv; kv = strtok_r(NULL, " ", &save)) {
    char *eq = strchr(kv, '=');
    cr_assert_not_null(eq, "\"%s\" is not NAME=VALUE", kv);
    *eq = '\0';
    setenv(kv, eq + 1, 1);
  }
}

/* mpg_launch_from_env under `env` succeeds; returns what it read. */
static mpg_launch launch_with(const char *env) {
  set_env(env);
  mpg_launch l = MPG_LAUNCH_INIT;
  cr_assert_eq(mpg_launch_from_env(&l), MPG_OK, "%s: %s", env, mpg_last_error());
  return l;
}

/* The launch found rank of world, local_rank of local_world, by source. */
static void expect_launch(const mpg_launch *l, int rank, int world, int local_rank,
                          int local_world, const char *source) {
  cr_assert_eq(l->rank, rank);
  cr_assert_eq(l->world_size, world);
  cr_assert_eq(l->local_rank, local_rank);
  cr_assert_eq(l->local_world_size, local_world);
  cr_assert_str_eq(l->source, source);
}

/* mpg_launch_from_env under `env` fails (MPG_ERR_ENV); its message contains
 * every piece of the NULL-ended list. */
static void env_fails(const char *env, ...) {
  set_env(env);
  mpg_launch l = MPG_LAUNCH_INIT;
  cr_assert_eq(mpg_launch_from_env(&l), MPG_ERR_ENV, "%s accepted", env);
  va_list ap;
  va_start(ap, env);
  for (const char *piece; (piece = va_arg(ap, const char *));)
    cr_assert(strstr(mpg_last_error(), piece), "%s: %s", env, mpg_last_error());
  va_end(ap);
}

Test(launch, empty_environment_leaves_everything_unset) {
  mpg_launch l = MPG_LAUNCH_INIT;
  cr_assert_eq(mpg_launch_from_env(&l), MPG_OK);
  cr_assert_eq(l.rank, -1);
  cr_assert_eq(l.world_size, -1);
  cr_assert_eq(l.local_rank, -1);
  cr_assert_eq(l.master_port, -1);
  cr_assert_str_empty(l.source);
}

Test(launch, torchrun_variables) {
  mpg_launch l = launch_with("RANK=5 WORLD_SIZE=16 LOCAL_RANK=1 LOCAL_WORLD_SIZE=4 "
                             "MASTER_ADDR=10.1.2.3 MASTER_PORT=29500");
  expect_launch(&l, 5, 16, 1, 4, "torchrun");
  cr_assert_str_eq(l.master_addr, "10.1.2.3");
  cr_assert_eq(l.master_port, 29500);
}

Test(launch, openmpi_variables) {
  mpg_launch l = launch_with("OMPI_COMM_WORLD_RANK=3 OMPI_COMM_WORLD_SIZE=8 "
                             "OMPI_COMM_WORLD_LOCAL_RANK=3 OMPI_COMM_WORLD_LOCAL_SIZE=8");
  expect_launch(&l, 3, 8, 3, 8, "openmpi");
}

Test(launch, pmi_and_slurm_variables) {
  mpg_launch l = launch_with("PMI_RANK=2 PMI_SIZE=4 SLURM_PROCID=2 SLURM_NTASKS=4 "
                             "SLURM_LOCALID=0 SLURM_NTASKS_PER_NODE=2(x2)");
  expect_launch(&l, 2, 4, 0, 2, "pmi");
}

/* srun without --ntasks-per-node: this node's entry of the step's list. */
static int slurm_local_world(const char *step, const char *job, const char *node) {
  if (step) setenv("SLURM_STEP_TASKS_PER_NODE", step, 1);
  if (job) setenv("SLURM_TASKS_PER_NODE", job, 1);
  if (node) setenv("SLURM_NODEID", node, 1);
  mpg_launch l = launch_with("SLURM_PROCID=0 SLURM_NTASKS=64 SLURM_LOCALID=0");
  cr_assert_str_eq(l.source, "slurm");
  return l.local_world_size;
}

Test(launch, slurm_tasks_per_node_list_gives_the_local_world) {
  cr_assert_eq(slurm_local_world("2(x3),1", NULL, "0"), 2);
  cr_assert_eq(slurm_local_world("2(x3),1", NULL, "2"), 2);
  cr_assert_eq(slurm_local_world("2(x3),1", NULL, "3"), 1);
  cr_assert_eq(slurm_local_world("8", NULL, "0"), 8);
  cr_assert_eq(slurm_local_world("4,3(x2),8", NULL, "3"), 8);
  /* The step's list wins over the job's; the job's serves alone. */
  cr_assert_eq(slurm_local_world("4", "8", "0"), 4);
  unsetenv("SLURM_STEP_TASKS_PER_NODE");
  cr_assert_eq(slurm_local_world(NULL, "3(x2)", "1"), 3);
}

Test(launch, slurm_tasks_per_node_list_is_a_fallback) {
  /* SLURM_NTASKS_PER_NODE (--ntasks-per-node) is read first. */
  setenv("SLURM_NTASKS_PER_NODE", "4", 1);
  cr_assert_eq(slurm_local_world("2(x2)", NULL, "0"), 4);
  /* Without SLURM_NODEID, or outside an srun task (no SLURM_LOCALID), the
   * list says nothing. */
  unsetenv("SLURM_NTASKS_PER_NODE");
  unsetenv("SLURM_NODEID");
  cr_assert_eq(slurm_local_world("2(x2)", NULL, NULL), -1);
  unsetenv("SLURM_LOCALID");
  setenv("SLURM_NODEID", "0", 1);
  mpg_launch l = MPG_LAUNCH_INIT;
  cr_assert_eq(mpg_launch_from_env(&l), MPG_OK, "%s", mpg_last_error());
  cr_assert_eq(l.local_world_size, -1);
  cr_assert_eq(l.local_rank, -1);
}

Test(launch, slurm_tasks_per_node_list_errors_name_the_variable) {
  static const char *const bad[] = {"", "x", "2(x", "2(3)", "2(x0)", "0", "2,", "2;1",
                                    "-2", "2(x2)3"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    setenv("SLURM_LOCALID", "0", 1);
    setenv("SLURM_STEP_TASKS_PER_NODE", bad[i], 1);
    setenv("SLURM_NODEID", "0", 1);
    mpg_launch l = MPG_LAUNCH_INIT;
    cr_assert_eq(mpg_launch_from_env(&l), MPG_ERR_ENV, "\"%s\" accepted", bad[i]);
    cr_assert(strstr(mpg_last_error(), "SLURM_STEP_TASKS_PER_NODE=\""),
              "\"%s\": %s", bad[i], mpg_last_error());
  }
  setenv("SLURM_STEP_TASKS_PER_NODE", "2(x2)", 1);
  setenv("SLURM_NODEID", "2", 1);
  mpg_launch l = MPG_LAUNCH_INIT;
  cr_assert_eq(mpg_launch_from_env(&l), MPG_ERR_ENV);
  cr_assert(strstr(mpg_last_error(), "SLURM_NODEID=2") &&
                strstr(mpg_last_error(), "lists only 2 nodes"),
            "%s", mpg_last_error());
  setenv("SLURM_NODEID", "one", 1);
  cr_assert_eq(mpg_launch_from_env(&l), MPG_ERR_ENV);
  cr_assert(strstr(mpg_last_error(), "SLURM_NODEID=\"one\""), "%s", mpg_last_error());
  /* A local rank at or past this node's count. */
  setenv("SLURM_NODEID", "1", 1);
  setenv("SLURM_LOCALID", "2", 1);
  cr_assert_eq(mpg_launch_from_env(&l), MPG_ERR_ENV);
  cr_assert(strstr(mpg_last_error(), "SLURM_LOCALID=2 is not below "
                                     "SLURM_STEP_TASKS_PER_NODE=2"),
            "%s", mpg_last_error());
}

Test(launch, contradiction_names_both_variables) {
  env_fails("RANK=1 WORLD_SIZE=4 OMPI_COMM_WORLD_RANK=2 OMPI_COMM_WORLD_SIZE=4", "RANK=1",
            "OMPI_COMM_WORLD_RANK=2", NULL);
}

Test(launch, not_a_number_names_the_variable) {
  env_fails("RANK=two WORLD_SIZE=4", "RANK=\"two\"", NULL);
}

Test(launch, rank_not_below_world) {
  env_fails("RANK=4 WORLD_SIZE=4", "RANK=4 is not below WORLD_SIZE=4", NULL);
}

Test(launch, rank_without_world) { env_fails("RANK=0", "WORLD_SIZE", NULL); }
Test(launch, zero_world_size) { env_fails("RANK=0 WORLD_SIZE=0", "WORLD_SIZE=0", NULL); }

Test(launch, master_port_out_of_range) {
  env_fails("MASTER_ADDR=localhost MASTER_PORT=70000", "MASTER_PORT=\"70000\"", NULL);
}

Test(launch, master_addr_without_port) {
  env_fails("MASTER_ADDR=localhost", "MASTER_PORT is not", NULL);
}

/* The context reads the same variables and names what is missing. */
Test(launch, ctx_create_without_rank_names_the_variables) {
  mpg_mesh *mesh = make_dims_mesh("dp=2");
  mpg_init_opts opts = MPG_INIT_OPTS_INIT;
  opts.backend.name = MPG_BACKEND_MPI;
  set_env("WORLD_SIZE=2 RANK=x");
  mpg_ctx *ctx = (mpg_ctx *)1;
  mpg_status st = mpg_ctx_create(mesh, &opts, &ctx);
  cr_assert_null(ctx);
  /* Without MPI built the backend is unsupported; otherwise the env error. */
  cr_assert(st == MPG_ERR_ENV || st == MPG_ERR_UNSUPPORTED, "%s", mpg_status_name(st));
  if (st == MPG_ERR_ENV)
    cr_assert(strstr(mpg_last_error(), "RANK=\"x\""), "%s", mpg_last_error());
  mpg_mesh_destroy(mesh);
}

Test(launch, thread_backend_needs_a_thread_world) {
  mpg_mesh *mesh = make_dims_mesh("dp=2");
  mpg_ctx *ctx = (mpg_ctx *)1;
  cr_assert_eq(mpg_ctx_create(mesh, NULL, &ctx), MPG_ERR_INVALID);
  cr_assert_null(ctx);
  cr_assert(strstr(mpg_last_error(), "mpg_thread_run"), "%s", mpg_last_error());
  mpg_mesh_destroy(mesh);
}

Test(launch, uninitialised_opts_are_rejected) {
  mpg_mesh *mesh = make_dims_mesh("dp=1");
  mpg_init_opts opts;
  memset(&opts, 0, sizeof opts);
  mpg_ctx *ctx;
  cr_assert_eq(mpg_ctx_create(mesh, &opts, &ctx), MPG_ERR_INVALID);
  cr_assert(strstr(mpg_last_error(), "MPG_INIT_OPTS_INIT"), "%s", mpg_last_error());
  mpg_mesh_destroy(mesh);
}

/* The file's [backend] and [topology] are the very structs that
 * mpg_ctx_create's options hold: one assignment each honours them and
 * leaves the launcher's fields. */
Test(launch, init_opts_hold_the_specs_backend_and_topology) {
  static const char toml[] =
      "[mesh]\ndims = [ { name = \"dp\", size = 2 } ]\n"
      "[topology]\nbind = \"numa\"\nstrict = true\n"
      "[backend]\nname = \"mpi\"\ntimeout_s = 2.5\nlazy_groups = true\n";
  mpg_spec spec = MPG_SPEC_INIT;
  cr_assert_eq(mpg_spec_load_string(toml, "init.toml", &spec), MPG_OK, "%s", mpg_last_error());
  mpg_init_opts o = MPG_INIT_OPTS_INIT;
  o.rank = 1;
  o.world_size = 2;
  o.backend = spec.backend;
  o.topology = spec.topology;
  cr_assert_eq(o.backend.name, MPG_BACKEND_MPI);
  cr_assert_eq(o.backend.timeout_s, 2.5);
  cr_assert_eq(o.backend.lazy_groups, 1);
  cr_assert_eq(o.topology.bind, MPG_BIND_NUMA);
  cr_assert_eq(o.topology.strict, 1);
  cr_assert_eq(o.rank, 1, "a field the spec does not set was changed");
  cr_assert_eq(o.world_size, 2);
  cr_assert_eq(o.device, -1);
}

/* A spec without [backend] leaves the thread backend, which only
 * mpg_thread_run starts; under a launcher the error says which [backend]
 * name to set (issue 30). */
Test(launch, thread_backend_under_a_launcher_names_the_backend_to_set) {
  set_env("OMPI_COMM_WORLD_RANK=1 OMPI_COMM_WORLD_SIZE=4");
  mpg_spec spec = MPG_SPEC_INIT;
  cr_assert_eq(mpg_spec_set_mesh(&spec, "dp=4"), MPG_OK);
  mpg_mesh *mesh = NULL;
  cr_assert_eq(mpg_mesh_create(&spec, 4, &mesh), MPG_OK);
  mpg_init_opts o = MPG_INIT_OPTS_INIT;
  o.backend = spec.backend;
  mpg_ctx *ctx = NULL;
  cr_assert_eq(mpg_ctx_create(mesh, &o, &ctx), MPG_ERR_INVALID);
  const char *e = mpg_last_error();
  cr_assert(strstr(e, "openmpi started this process as rank 1 of 4") &&
                strstr(e, "[backend] name = \"mpi\""),
            "%s", e);
  clean_env();
  cr_assert_eq(mpg_ctx_create(mesh, &o, &ctx), MPG_ERR_INVALID);
  cr_assert(strstr(mpg_last_error(), "mpg_thread_run") &&
                strstr(mpg_last_error(), "name = \"mpi\""),
            "%s", mpg_last_error());
  mpg_mesh_destroy(mesh);
}
