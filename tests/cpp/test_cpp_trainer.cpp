/* test_cpp, part 3 (test_cpp.hpp): the example trainer, under mpirun
 * and valgrind, and cpp_raii_worker under valgrind. */
#include "test_cpp.hpp"

/* ------------------------------------------------------------------------ */
/* The example trainer                                                       */
/* ------------------------------------------------------------------------ */

static std::string trainer() { return "'" + env_or_fail("MESHPG_TRAINER") + "'"; }
static std::string example(const char* name) { return "'" + data_dir() + "/../examples/" + name + "'"; }
static std::string fixture(const char* name) { return "'" + data_dir() + "/cpp/" + name + "'"; }

/* The trainer ran `steps` steps on `ranks` ranks and said OK. */
static void expect_trained(const std::string& cmd, const std::string& out, int rc, int ranks,
                           int steps) {
  cr_assert_eq(rc, 0, "%s\nexit %d\n%s", cmd.c_str(), rc, out.c_str());
  cr_assert(has(out, "\nOK\n"), "%s\n%s", cmd.c_str(), out.c_str());
  std::string ok = "grads ok on " + std::to_string(ranks) + " ranks";
  cr_assert_eq(count_of(out, ok), static_cast<size_t>(steps), "%s: want %d x '%s'\n%s",
               cmd.c_str(), steps, ok.c_str(), out.c_str());
  cr_assert_eq(count_of(out, "step "), static_cast<size_t>(steps), "%s", out.c_str());
}

/* `PREFIX trainer ARGS` trains `steps` steps on `ranks` ranks and says
 * `says`; its output comes back. */
static std::string trains(const std::string& prefix, const std::string& args, int ranks,
                          int steps, const char* says) {
  std::string out, cmd = prefix + trainer() + args;
  expect_trained(cmd, out, run(cmd, &out), ranks, steps);
  cr_assert(has(out, says), "%s", out.c_str());
  return out;
}

Test(trainer, default_seed_mesh_8_threads, .timeout = 120) {
  std::string out =
      trains("", " --steps 3", 8, 3, "mesh dp=2,tp=2,cp=2 on 8 ranks (thread backend)");
  cr_assert(has(out, "gradients over dp,cp"), "%s", out.c_str());
}

Test(trainer, explicit_threads_and_microbatches, .timeout = 120) {
  trains("", " " + example("seed.toml") + " --threads 8 --steps 2 --microbatches 3", 8, 2,
         "2 steps x 3 micro-batches");
}

Test(trainer, fsdp_reduces_over_cp_only, .timeout = 120) {
  trains("", " " + example("fsdp.toml") + " --steps 2", 8, 2, "gradients over cp");
}

Test(trainer, pipeline_mesh_16_threads, .timeout = 180) {
  trains("", " " + example("pp4d.toml") + " --threads 16 --steps 2", 16, 2,
         "mesh pp=2,dp=2,cp=2,tp=2");
}

Test(trainer, mesh_flag_with_an_inferred_dim, .timeout = 120) {
  trains("", " --mesh dp=-1,cp=2,tp=2 --threads 4 --steps 2", 4, 2, "mesh dp=1,cp=2,tp=2");
  // Without --threads the world size is unknown: a usage error.
  std::string out, cmd2 = trainer() + " --mesh dp=-1,cp=2,tp=2";
  int rc = run(cmd2, &out);
  cr_assert_eq(rc, 2, "%s\n%s", cmd2.c_str(), out.c_str());
  cr_assert(has(out, "--threads"), "%s", out.c_str());
}

Test(trainer, params_file_with_comments, .timeout = 120) {
  trains("", " --params " + fixture("tiny.params") + " --steps 2", 8, 2,
         "4 params (1090 floats per rank)");
}

Test(trainer, bad_params_file_names_file_and_line, .timeout = 60) {
  std::string out, cmd = trainer() + " --params " + fixture("bad.params");
  int rc = run(cmd, &out);
  cr_assert_eq(rc, 1, "%s\n%s", cmd.c_str(), out.c_str());
  cr_assert(has(out, "bad.params:4: param \"l0.w\": shape 16x16 has 256 elements, not 250"),
            "%s", out.c_str());
  cmd = trainer() + " --params /nonexistent/p.params";
  rc = run(cmd, &out);
  cr_assert_eq(rc, 1, "%s\n%s", cmd.c_str(), out.c_str());
  cr_assert(has(out, "/nonexistent/p.params: cannot open"), "%s", out.c_str());
}

Test(trainer, bad_spec_exits_1_with_position, .timeout = 60) {
  char path[] = "/tmp/meshpg_cpp_spec_XXXXXX";
  int fd = mkstemp(path);
  cr_assert_geq(fd, 0);
  const char bad[] = "[mesh]\ndims = [ { name = \"dp\", size = 0 } ]\n";
  cr_assert_eq(write(fd, bad, sizeof bad - 1), static_cast<ssize_t>(sizeof bad - 1));
  close(fd);
  std::string out, cmd = trainer() + " " + path;
  int rc = run(cmd, &out);
  unlink(path);
  cr_assert_eq(rc, 1, "%s\n%s", cmd.c_str(), out.c_str());
  cr_assert(has(out, "trainer: ERR_SPEC: " + std::string(path) + ":2:"), "%s", out.c_str());
}

Test(trainer, usage_errors_exit_2_and_help_lists_every_flag, .timeout = 60) {
  std::string out;
  for (const char* args : {"--bogus", "--threads 0", "--steps x", "--backend nccl",
                           "--backend mpi --threads 2", "--timeout -1", "a.toml b.toml",
                           "--params"}) {
    std::string cmd = trainer() + " " + args;
    int rc = run(cmd, &out);
    cr_assert_eq(rc, 2, "%s: exit %d\n%s", cmd.c_str(), rc, out.c_str());
    cr_assert(has(out, "usage: trainer"), "%s", out.c_str());
  }
  int rc = run(trainer() + " --help", &out);
  cr_assert_eq(rc, 0);
  for (const char* flag : {"--threads", "--backend", "--mesh", "--params", "--steps",
                           "--microbatches", "--timeout", "--help"})
    cr_assert(has(out, flag), "--help does not mention %s:\n%s", flag, out.c_str());
}

Test(trainer, mpi_backend_without_launcher_fails, .timeout = 60) {
  std::string out, cmd = trainer() + " --backend mpi";
  int rc = run(cmd, &out);
  cr_assert_eq(rc, 1, "%s\n%s", cmd.c_str(), out.c_str());
  cr_assert(has(out, "mpirun"), "%s", out.c_str());
}

/* Shared-memory transports only, no binding: small shared machines. */
#define MPIRUN "timeout -k 5 240 mpirun --oversubscribe --bind-to none --mca btl self,vader " \
               "--mca btl_vader_single_copy_mechanism none "

static void require_mpi() {
  const char* m = std::getenv("MESHPG_HAVE_MPI");
  if (!m || std::strcmp(m, "1") != 0) cr_skip_test("the MPI backend is not built");
}

Test(trainer, mpirun_4_ranks_mpi_backend, .timeout = 300) {
  require_mpi();
  std::string out = trains(MPIRUN "-np 4 ", " --backend mpi --mesh dp=-1,cp=2,tp=2 --steps 3", 4,
                           3, "on 4 ranks (mpi backend)");
  cr_assert_eq(count_of(out, "OK"), 1u, "only rank 0 says OK:\n%s", out.c_str());
}

Test(trainer, mpirun_picks_the_mpi_backend_by_default, .timeout = 300) {
  require_mpi();
  trains(MPIRUN "-np 2 ", " " + example("fsdp.toml") + " --mesh dp=-1,cp=2 --steps 2", 2, 2,
         "(mpi backend)");
}

/* ------------------------------------------------------------------------ */
/* valgrind                                                                  */
/* ------------------------------------------------------------------------ */

static std::string valgrind() {
  if (const char *san = std::getenv("MESHPG_SANITIZER"))
    cr_skip_test("a sanitizer build (-Db_sanitize=%s): valgrind cannot run it", san);
  if (std::system("command -v valgrind >/dev/null 2>&1") != 0)
    cr_skip_test("valgrind is not installed");
  return "valgrind -q --error-exitcode=3 --leak-check=full --errors-for-leak-kinds=definite "
         "--show-leak-kinds=definite --num-callers=40 --suppressions='" +
         data_dir() + "/topo/valgrind-hwloc.supp' ";
}

Test(valgrind, raii_worker_frees_everything, .timeout = 600) {
  std::string out, cmd = valgrind() + "'" + env_or_fail("MESHPG_CPP_RAII_WORKER") + "'";
  int rc = run(cmd, &out);
  cr_assert_eq(rc, 0, "%s: exit %d\n%s", cmd.c_str(), rc, out.c_str());
  cr_assert(has(out, "raii_worker OK"), "%s", out.c_str());
  cr_assert_not(has(out, "definitely lost"), "%s", out.c_str());
}

Test(valgrind, trainer_threads_are_memory_clean, .timeout = 600) {
  std::string out, cmd = valgrind() + trainer() + " --mesh dp=-1,cp=2,tp=2 --threads 4 " +
                         "--params " + fixture("tiny.params") + " --steps 2";
  int rc = run(cmd, &out);
  expect_trained(cmd, out, rc, 4, 2);
  cr_assert_not(has(out, "definitely lost"), "%s", out.c_str());
}
