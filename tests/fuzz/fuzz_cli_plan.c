/* libFuzzer target: the argument parser of `meshpg plan` (tools/cmd_plan.c,
 * tools/spec_args.c, tools/plan_placement.c), linked from the tool's
 * sources.  The input is the argument list, one argument per line (argv[0]
 * "plan" is added).  The command's output goes to /dev/null: stdout and
 * stderr are swapped for a /dev/null stream around the call, while libFuzzer
 * and the sanitizers keep writing to the real stderr.
 *
 * Files: the target runs in a private temporary directory holding the
 * fixtures a.toml (a good spec), b.toml (a bad one), t.xml and c.xml (hwloc
 * topologies with and without GPUs); every '/' of the input becomes '_', so
 * that SPEC.toml, --xml and --svg only ever name files there, and an SVG the
 * command writes is removed after the call.
 *
 * Invariants: the command returns 0, 1 or 2 (it never exits: libFuzzer
 * reports a target that calls exit()); 2 exactly for the usage errors found
 * by the same option loop run beforehand; 1 when the spec or the mesh is
 * invalid (the library's message non-empty). Worlds over FUZZ_PLAN_MAX_WORLD
 * ranks are not run, to keep every input fast. */
#include <sys/stat.h>
#include <unistd.h>

#include "cmd.h"
#include "fuzz_common.h"
#include "plan_placement.h"

#define FUZZ_PLAN_MAX_WORLD 1024
#define MAX_ARGS 32

static FILE *devnull;
static char dir[4096];
/* Keeps hwloc's plugins loaded for the whole run (see fuzz_topo_xml.c). */
static mpg_topo *keep;

static const char good_spec[] =
    "[mesh]\n"
    "dims = [ { name = \"dp\", size = -1 }, { name = \"cp\", size = 2 },\n"
    "         { name = \"tp\", size = 2 } ]\n"
    "flatten = { dp_cp = [\"dp\", \"cp\"] }\n"
    "[topology]\n"
    "gpus_per_node = 4\n";
static const char bad_spec[] =
    "[mesh]\n"
    "dims = [ { name = \"dp\", size = 0 } ]\n";

static void write_file(const char *name, const char *text, size_t n) {
  FILE *f = fopen(name, "wb");
  if (!f || fwrite(text, 1, n, f) != n || fclose(f) != 0) {
    perror(name);
    abort();
  }
}

static void copy_file(const char *from, const char *to) {
  FILE *f = fopen(from, "rb");
  if (!f) {
    perror(from);
    abort();
  }
  static char buf[1 << 16];
  size_t n = fread(buf, 1, sizeof buf, f);
  fclose(f);
  write_file(to, buf, n);
}

static void write_fixtures(void) {
  write_file("a.toml", good_spec, sizeof good_spec - 1);
  write_file("b.toml", bad_spec, sizeof bad_spec - 1);
  copy_file(FUZZ_TOPOLOGIES "/workstation-4gpu.xml", "t.xml");
  copy_file(FUZZ_TOPOLOGIES "/cpu-only.xml", "c.xml");
}

static int is_fixture(const char *name) {
  return strcmp(name, "a.toml") == 0 || strcmp(name, "b.toml") == 0 ||
         strcmp(name, "t.xml") == 0 || strcmp(name, "c.xml") == 0;
}

/* Remove everything in the directory but the fixtures (a file that
 * --svg wrote), and rewrite the fixtures if one was overwritten. */
static void cleanup_files(int argc, char **argv) {
  for (int i = 0; i + 1 < argc; i++)
    if (strcmp(argv[i], "--svg") == 0) {
      if (is_fixture(argv[i + 1])) write_fixtures();
      else unlink(argv[i + 1]);
    }
}

static void remove_dir(void) {
  const char *names[] = {"a.toml", "b.toml", "t.xml", "c.xml"};
  for (size_t i = 0; i < sizeof names / sizeof *names; i++) unlink(names[i]);
  if (dir[0]) rmdir(dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  fuzz_tmp_path(dir, sizeof dir, "meshpg-fuzz-plan-XXXXXX");
  if (!mkdtemp(dir) || chdir(dir) != 0) {
    perror("fuzz_cli_plan: temporary directory");
    abort();
  }
  write_fixtures();
  atexit(remove_dir);
  devnull = fopen("/dev/null", "w");
  if (!devnull || mpg_topo_load_synthetic("pack:1 core:1 pu:1", &keep) != MPG_OK)
    abort();
  return 0;
}

/* What the option loop of cmd_plan decides before any output: 2 for a usage
 * error, 0 for --help, -1 to go on.  Fills *args and *rank. */
static int preparse(int argc, char **argv, tool_spec *args, int *rank) {
  plan_place_args pa;
  plan_place_args_init(&pa);
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    int placed = plan_place_parse(&pa, argc, argv, &i);
    if (placed < 0) return TOOL_EXIT_USAGE;
    if (placed) continue;
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) return TOOL_EXIT_OK;
    if (strcmp(a, "--json") == 0) continue;
    if (strcmp(a, "--rank") == 0) {
      if (i + 1 >= argc) return TOOL_EXIT_USAGE;
      if (!tool_parse_int("--rank", argv[++i], 0, rank)) return TOOL_EXIT_USAGE;
      continue;
    }
    int took = tool_spec_arg(args, argc, argv, &i, "");
    if (took <= 0) return TOOL_EXIT_USAGE;
  }
  if (!args->path && !args->mesh) return TOOL_EXIT_USAGE;
  return -1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *text = fuzz_strdup_lines(data, size);
  for (char *p = text; *p; p++)
    if (*p == '/') *p = '_';
  char *argv[MAX_ARGS + 2];
  int argc = 0;
  argv[argc++] = "plan";
  if (*text)
    for (char *p = text; argc <= MAX_ARGS;) {
      argv[argc++] = p;
      char *nl = strchr(p, '\n');
      if (!nl) break;
      *nl = '\0';
      p = nl + 1;
    }
  argv[argc] = NULL;

  FILE *out = stdout, *err = stderr;
  stdout = devnull;
  stderr = devnull;

  /* The expected outcome, and whether the run is small enough. */
  tool_spec args = {0};
  int rank = -1, expect = preparse(argc, argv, &args, &rank);
  int run = 1;
  if (expect < 0) {
    mpg_spec spec = MPG_SPEC_INIT;
    mpg__clear_error();
    mpg_status st = tool_spec_load(&args, NULL, &spec);
    mpg_mesh *mesh = NULL;
    if (!st) {
      mpg__clear_error();
      st = mpg_mesh_create(&spec, args.world, &mesh);
    }
    fuzz_check_status(st);
    if (st) {
      expect = TOOL_EXIT_FAIL;
    } else {
      int world = mpg_mesh_world_size(mesh);
      if (world > FUZZ_PLAN_MAX_WORLD) run = 0;
      else fuzz_check_mesh(&spec, mesh, 8);
      if (rank >= world) expect = TOOL_EXIT_FAIL;
      mpg_mesh_destroy(mesh);
    }
  }

  int rc = expect;
  if (run) {
    rc = cmd_plan(argc, argv);
    fflush(devnull);
  }
  stdout = out;
  stderr = err;
  if (run) {
    cleanup_files(argc, argv);
    FUZZ_CHECK(rc == TOOL_EXIT_OK || rc == TOOL_EXIT_FAIL || rc == TOOL_EXIT_USAGE);
    if (expect >= 0) FUZZ_CHECK(rc == expect);
    else FUZZ_CHECK(rc != TOOL_EXIT_USAGE);
  }
  free(text);
  return 0;
}
