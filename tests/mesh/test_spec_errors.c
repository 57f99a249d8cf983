/* test_spec_errors.c - the catalogue of bad spec files.
 *
 * Every file under tests/data/bad/ is one fault.  For each, the table below
 * says what mpg_spec_load_file (and, for world-size faults, mpg_mesh_create)
 * must return, where the message must point ("path:line:col: " with the path
 * exactly as passed) and a piece of text the message must contain: the key
 * path with what was expected and found, or the "did you mean" hint.
 *
 * Fixture paths come from MESHPG_TEST_DATA (meson sets it to the tests/
 * source dir); without it they are found relative to this source file.
 */
#if !defined(_GNU_SOURCE) && !defined(_POSIX_C_SOURCE)
#define _POSIX_C_SOURCE 200809L /* opendir */
#endif

#include <criterion/criterion.h>
#include <criterion/parameterized.h>

#include <meshpg.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The world column: 0 = only load the file; > 0 = the file loads, then
 * mpg_mesh_create with that world size fails; NO_WORLD = the file loads,
 * then mpg_mesh_create with world size 0 ("the product") fails. */
#define NO_WORLD (-1)

/* Criterion runs each parameter in a fresh process that gets a byte copy of
 * the row, so the row holds its strings rather than pointers to them. */
struct row {
  char file[64];      /* under data/bad/ */
  mpg_status status;  /* the exact status */
  int line, col;      /* the exact location the message starts with */
  int world;          /* see above */
  char substr[200];   /* text the message must contain */
};

static const struct row rows[] = {
    /* --- [mesh].dims: sizes ------------------------------------------- */
    {"size_zero.toml", MPG_ERR_SPEC, 3, 59, 0,
     "mesh.dims[1].size: expected a positive integer or -1 for dim \"tp\", found 0"},
    {"size_negative.toml", MPG_ERR_SPEC, 3, 32, 0,
     "mesh.dims[0].size: expected a positive integer or -1 for dim \"dp\", found -3"},
    {"two_auto.toml", MPG_ERR_SPEC, 3, 91, 0,
     "mesh.dims[2].size: only one dim may be -1 (inferred), but \"tp\" is -1 "
     "and \"dp\" already is"},
    {"size_float.toml", MPG_ERR_SPEC, 3, 32, 0,
     "mesh.dims[0].size: expected an integer, -1 or \"auto\", found float 2.5"},
    /* Expected to fail until describe() keeps the ".0" of 2.0 (see report). */
    {"size_float_integral.toml", MPG_ERR_SPEC, 3, 32, 0,
     "mesh.dims[0].size: expected an integer, -1 or \"auto\", found float 2.0"},
    {"size_string.toml", MPG_ERR_SPEC, 3, 32, 0,
     "mesh.dims[0].size: expected an integer, -1 or \"auto\", found string \"two\""},
    {"size_bool.toml", MPG_ERR_SPEC, 3, 32, 0,
     "mesh.dims[0].size: expected an integer, -1 or \"auto\", found boolean true"},
    {"size_too_big.toml", MPG_ERR_SPEC, 3, 32, 0,
     "mesh.dims[0].size: expected an integer, -1 or \"auto\", found integer 3000000000"},
    {"dims_table_array_size_zero.toml", MPG_ERR_SPEC, 8, 8, 0,
     "mesh.dims[1].size: expected a positive integer or -1 for dim \"tp\", found 0"},

    /* --- [mesh].dims: names ------------------------------------------- */
    {"dup_name.toml", MPG_ERR_SPEC, 6, 12, 0,
     "mesh.dims[2].name: duplicate dim name \"dp\" (already mesh.dims[0])"},
    {"name_bad_chars.toml", MPG_ERR_SPEC, 3, 19, 0,
     "mesh.dims[0].name: expected a name of letters, digits and '_' not "
     "starting with a digit, at most 31 chars, found \"d-p\""},
    {"name_starts_digit.toml", MPG_ERR_SPEC, 3, 19, 0,
     "mesh.dims[0].name: expected a name of letters, digits and '_' not "
     "starting with a digit, at most 31 chars, found \"2d\""},
    {"name_empty.toml", MPG_ERR_SPEC, 3, 19, 0,
     "mesh.dims[0].name: expected a name of letters, digits and '_' not "
     "starting with a digit, at most 31 chars, found \"\""},
    {"name_world.toml", MPG_ERR_SPEC, 3, 46, 0,
     "mesh.dims[1].name: \"world\" is reserved for the group of all ranks"},
    {"name_too_long.toml", MPG_ERR_SPEC, 3, 19, 0,
     "mesh.dims[0].name: expected at most 31 chars, found "
     "\"data_parallel_replicas_over_node\""},
    {"name_not_string.toml", MPG_ERR_SPEC, 3, 19, 0,
     "mesh.dims[0].name: expected a string, found integer 0"},

    /* --- [mesh].dims: shape ------------------------------------------- */
    {"missing_size.toml", MPG_ERR_SPEC, 3, 37, 0, "mesh.dims[1]: missing key \"size\""},
    {"missing_name.toml", MPG_ERR_SPEC, 3, 10, 0, "mesh.dims[0]: missing key \"name\""},
    {"dims_table_array_missing_size.toml", MPG_ERR_SPEC, 6, 1, 0,
     "mesh.dims[1]: missing key \"size\""},
    {"empty_dims.toml", MPG_ERR_SPEC, 3, 8, 0, "mesh.dims: expected 1 to 8 dims, found []"},
    {"nine_dims.toml", MPG_ERR_SPEC, 6, 55, 0, "mesh.dims: expected at most 8 dims, found 9"},
    {"dims_not_array.toml", MPG_ERR_SPEC, 3, 8, 0,
     "mesh.dims: expected an array of tables like { name = \"dp\", size = 2 }, "
     "found string \"dp=2,tp=2\""},
    {"dim_not_table.toml", MPG_ERR_SPEC, 3, 37, 0,
     "mesh.dims[1]: expected a table like { name = \"dp\", size = 2 }, found string \"tp\""},
    {"typo_dim_key.toml", MPG_ERR_SPEC, 3, 52, 0,
     "mesh.dims[1].sise: unknown key (did you mean \"size\"?); expected one of name, size"},

    /* --- [mesh] itself -------------------------------------------------- */
    {"missing_mesh.toml", MPG_ERR_SPEC, 1, 1, 0,
     "mesh: missing section [mesh] with dims = [...]"},
    {"empty_file.toml", MPG_ERR_SPEC, 1, 1, 0,
     "mesh: missing section [mesh] with dims = [...]"},
    {"missing_dims.toml", MPG_ERR_SPEC, 2, 1, 0, "mesh: missing key \"dims\""},
    {"mesh_not_table.toml", MPG_ERR_SPEC, 2, 8, 0,
     "mesh: expected a table, found string \"dp=2,tp=2\""},
    {"unknown_mesh_key.toml", MPG_ERR_SPEC, 4, 1, 0,
     "mesh.flattened: unknown key (did you mean \"flatten\"?); expected one of "
     "dims, flatten, order"},

    /* --- [mesh].flatten ------------------------------------------------- */
    {"flatten_unknown_dim.toml", MPG_ERR_SPEC, 4, 28, 0,
     "mesh.flatten.dp_cp[1]: unknown dim \"expert\"; the mesh has dp, cp, tp"},
    {"flatten_did_you_mean.toml", MPG_ERR_SPEC, 4, 36, 0,
     "mesh.flatten.data_tensor[1]: unknown dim \"tensr\" (did you mean "
     "\"tensor\"?); the mesh has pipe, data, tensor"},
    {"flatten_out_of_order.toml", MPG_ERR_SPEC, 4, 28, 0,
     "mesh.flatten.dp_cp[1]: dims must be listed in mesh order (outermost "
     "first: dp, cp, tp), but \"dp\" comes after \"cp\""},
    {"flatten_repeat.toml", MPG_ERR_SPEC, 4, 34, 0,
     "mesh.flatten.dp_cp[2]: dim \"dp\" is listed twice"},
    {"flatten_clash.toml", MPG_ERR_SPEC, 6, 1, 0,
     "mesh.flatten.cp: the name \"cp\" clashes with a mesh dim"},
    {"flatten_world.toml", MPG_ERR_SPEC, 4, 13, 0,
     "mesh.flatten.world: the name \"world\" clashes with the reserved group \"world\""},
    {"flatten_empty.toml", MPG_ERR_SPEC, 4, 21, 0,
     "mesh.flatten.dp_cp: expected a list of 1 to 8 dims, found 0"},
    {"flatten_not_table.toml", MPG_ERR_SPEC, 4, 11, 0,
     "mesh.flatten: expected a table, found an array"},
    {"flatten_not_list.toml", MPG_ERR_SPEC, 4, 21, 0,
     "mesh.flatten.dp_cp: expected a list of dim names like [\"dp\", \"cp\"], "
     "found string \"dp,cp\""},
    {"flatten_bad_name.toml", MPG_ERR_SPEC, 4, 13, 0,
     "mesh.flatten: expected a set name of letters, digits and '_' not "
     "starting with a digit, at most 31 chars, found \"dp-cp\""},
    {"flatten_dim_not_string.toml", MPG_ERR_SPEC, 4, 28, 0,
     "mesh.flatten.dp_cp[1]: expected a string, found integer 1"},

    /* --- [mesh].order --------------------------------------------------- */
    {"order_unknown_dim.toml", MPG_ERR_SPEC, 4, 9, 0,
     "mesh.order \"tp-expert-dp\": unknown dim \"expert\"; the mesh has dp, cp, tp"},
    {"order_did_you_mean.toml", MPG_ERR_SPEC, 4, 9, 0,
     "mesh.order \"tensor-dta-pipe\": unknown dim \"dta\" (did you mean \"data\"?)"},
    {"order_missing_dim.toml", MPG_ERR_SPEC, 4, 9, 0,
     "mesh.order \"tp-dp\": dim \"cp\" of the mesh is missing"},
    {"order_repeat.toml", MPG_ERR_SPEC, 4, 9, 0,
     "mesh.order \"tp-dp-tp\": dim \"tp\" is named twice"},
    {"order_not_string.toml", MPG_ERR_SPEC, 4, 9, 0,
     "mesh.order: expected a Megatron order string like \"tp-cp-dp-pp\", found an array"},

    /* --- unknown sections and keys -------------------------------------- */
    {"unknown_section.toml", MPG_ERR_SPEC, 5, 2, 0,
     "optimizer: unknown key; expected one of mesh, topology, sync, backend"},
    {"unknown_section_did_you_mean.toml", MPG_ERR_SPEC, 5, 2, 0,
     "topolgy: unknown key (did you mean \"topology\"?)"},
    {"typo_key_did_you_mean.toml", MPG_ERR_SPEC, 6, 1, 0,
     "topology.gpus_per_nod: unknown key (did you mean \"gpus_per_node\"?); "
     "expected one of nodes, gpus_per_node, bind, rank_order, strict"},
    {"top_level_key.toml", MPG_ERR_SPEC, 1, 1, 0,
     "world_size: unknown key; expected one of mesh, topology, sync, backend"},
    {"sync_not_table.toml", MPG_ERR_SPEC, 2, 8, 0,
     "sync: expected a table, found string \"default\""},

    /* --- TOML syntax ---------------------------------------------------- */
    {"syntax_error.toml", MPG_ERR_PARSE, 3, 32, 0, "TOML syntax error: "},
    {"unterminated_string.toml", MPG_ERR_PARSE, 3, 36, 0, "TOML syntax error: "},
    {"duplicate_key.toml", MPG_ERR_PARSE, 7, 6, 0, "TOML syntax error: "},

    /* --- [topology] ----------------------------------------------------- */
    {"bind_bad_value.toml", MPG_ERR_SPEC, 6, 8, 0,
     "topology.bind: expected one of \"none\", \"numa\", \"core\", found string "
     "\"numaa\" (did you mean \"numa\"?)"},
    {"bind_not_string.toml", MPG_ERR_SPEC, 6, 8, 0,
     "topology.bind: expected one of \"none\", \"numa\", \"core\", found boolean true"},
    {"rank_order_bad.toml", MPG_ERR_SPEC, 6, 14, 0,
     "topology.rank_order: expected one of \"block\", \"cyclic\", found string "
     "\"round-robin\""},
    {"nodes_negative.toml", MPG_ERR_SPEC, 6, 9, 0,
     "topology.nodes: expected an integer >= 0, found -2"},
    {"gpus_per_node_float.toml", MPG_ERR_SPEC, 6, 17, 0,
     "topology.gpus_per_node: expected an integer >= 0, found float 7.5"},
    {"strict_not_bool.toml", MPG_ERR_SPEC, 6, 10, 0,
     "topology.strict: expected true or false, found string \"yes\""},

    /* --- [sync] --------------------------------------------------------- */
    {"bucket_negative.toml", MPG_ERR_SPEC, 6, 13, 0,
     "sync.bucket_mb: expected a number > 0, found -5"},
    {"bucket_string.toml", MPG_ERR_SPEC, 6, 13, 0,
     "sync.bucket_mb: expected a number, found string \"25MB\""},
    {"first_bucket_zero.toml", MPG_ERR_SPEC, 6, 19, 0,
     "sync.first_bucket_mb: expected a number > 0, found 0"},
    {"op_bad_value.toml", MPG_ERR_SPEC, 6, 6, 0,
     "sync.op: expected one of \"avg\", \"sum\", found string \"mean\""},
    {"reduce_dtype_bad.toml", MPG_ERR_SPEC, 6, 16, 0,
     "sync.reduce_dtype: expected one of \"native\", \"f32\", found string \"bf16\""},
    {"fsdp_not_bool.toml", MPG_ERR_SPEC, 6, 16, 0,
     "sync.fsdp_owns_dp: expected true or false, found integer 1"},
    /* Expected to fail until the reader records where fsdp_owns_dp was set
     * and the check uses it (today the message has no location; see report). */
    {"fsdp_without_dp.toml", MPG_ERR_SPEC, 6, 16, 0,
     "sync.fsdp_owns_dp: true needs a \"dp\" dim; the mesh has fsdp, tp"},

    /* --- [backend] ------------------------------------------------------ */
    {"backend_name_bad.toml", MPG_ERR_SPEC, 6, 8, 0,
     "backend.name: expected one of \"thread\", \"mpi\", \"nccl\", found string "
     "\"ncll\" (did you mean \"nccl\"?)"},
    {"timeout_zero.toml", MPG_ERR_SPEC, 6, 13, 0,
     "backend.timeout_s: expected a number > 0, found 0"},
    {"timeout_nan.toml", MPG_ERR_SPEC, 6, 13, 0,
     "backend.timeout_s: expected a number > 0, found nan"},
    {"timeout_inf.toml", MPG_ERR_SPEC, 6, 13, 0,
     "backend.timeout_s: expected a finite number below 1e9, found inf"},
    {"lazy_groups_not_bool.toml", MPG_ERR_SPEC, 6, 15, 0,
     "backend.lazy_groups: expected true or false, found string \"false\""},

    /* --- world size (the file is valid; mpg_mesh_create rejects it) ----- */
    {"world_mismatch.toml", MPG_ERR_SPEC, 3, 19, 16,
     "mesh.dims: world size 16 does not equal 8, the product of the sizes "
     "(dp=2 x cp=2 x tp=2)"},
    {"world_not_divisible.toml", MPG_ERR_SPEC, 3, 19, 12,
     "mesh.dims: world size 12 is not divisible by 8, the product of the "
     "known sizes (dp=-1 x cp=2 x tp=4)"},
    {"world_overflow.toml", MPG_ERR_SPEC, 3, 19, 8,
     "mesh.dims: the product of the sizes (dp=65536 x tp=65536) exceeds 2147483647 ranks"},
    {"auto_without_world.toml", MPG_ERR_SPEC, 3, 32, NO_WORLD,
     "mesh.dims[0].size: dim \"pp\" is -1 (inferred) but no world size was given"},
};

#define NROWS ((int)(sizeof rows / sizeof rows[0]))

/* ---------------------------------------------------------------------- */

/* Path of a fixture under tests/data/ ("bad/x.toml"), as the tests pass it. */
static void data_path(char *buf, size_t cap, const char *rel) {
  const char *env = getenv("MESHPG_TEST_DATA");
  if (env && *env) {
    snprintf(buf, cap, "%s/data/%s", env, rel);
    return;
  }
  const char *here = __FILE__; /* .../tests/mesh/test_spec_errors.c */
  const char *slash = strrchr(here, '/');
  if (slash)
    snprintf(buf, cap, "%.*s/../data/%s", (int)(slash - here), here, rel);
  else
    snprintf(buf, cap, "../data/%s", rel);
}

/* *spec equals a fresh mpg_spec_init, byte for byte up to its last field
 * (a reset writes every field and the padding between them). */
static void assert_defaults(const mpg_spec *spec, const char *what) {
  mpg_spec fresh = MPG_SPEC_INIT;
  cr_assert_eq(mpg_spec_init(&fresh), MPG_OK);
  cr_assert_eq(spec->ndims, 0, "%s: after the error ndims is %d, expected 0", what,
               spec->ndims);
  cr_assert_eq(spec->nflatten, 0, "%s: after the error nflatten is %d", what,
               spec->nflatten);
  cr_assert(spec->sync.bucket_mb == 25.0, "%s: after the error bucket_mb is %g, expected 25",
            what, spec->sync.bucket_mb);
  cr_assert_str_eq(spec->source, "", "%s: after the error source is \"%s\"", what,
                   spec->source);
  size_t end = offsetof(mpg_spec, source) + sizeof fresh.source;
  cr_assert(memcmp(spec, &fresh, end) == 0,
            "%s: after the error the spec does not equal mpg_spec_init's", what);
}

/* The message starts with "where:line:col: " and contains substr. */
static void assert_message(const char *what, const char *where, int line, int col,
                           const char *substr) {
  char msg[1024], prefix[MPG_PATH_MAX + 64];
  snprintf(msg, sizeof msg, "%s", mpg_last_error());
  snprintf(prefix, sizeof prefix, "%s:%d:%d: ", where, line, col);
  cr_assert(strncmp(msg, prefix, strlen(prefix)) == 0,
            "%s: expected the message to start with\n  \"%s\"\ngot\n  \"%s\"", what,
            prefix, msg);
  cr_assert(strstr(msg, substr) != NULL,
            "%s: expected the message to contain\n  \"%s\"\ngot\n  \"%s\"", what,
            substr, msg);
}

/* ---------------------------------------------------------------------- */

ParameterizedTestParameters(spec_errors, bad_file) {
  return cr_make_param_array(struct row, (struct row *)rows, (size_t)NROWS);
}

ParameterizedTest(const struct row *r, spec_errors, bad_file) {
  char rel[256], path[MPG_PATH_MAX];
  snprintf(rel, sizeof rel, "bad/%s", r->file);
  data_path(path, sizeof path, rel);

  /* Start from a fully loaded spec so "reset to defaults" is visible. */
  char good[MPG_PATH_MAX];
  data_path(good, sizeof good, "good/full.toml");
  mpg_spec spec = MPG_SPEC_INIT;
  cr_assert_eq(mpg_spec_load_file(good, &spec), MPG_OK, "%s: good/full.toml: %s",
               r->file, mpg_last_error());

  mpg_status st = mpg_spec_load_file(path, &spec);
  if (r->world == 0) {
    cr_assert_eq(st, r->status, "%s: mpg_spec_load_file returned %s, expected %s (%s)",
                 r->file, mpg_status_name(st), mpg_status_name(r->status),
                 mpg_last_error());
    assert_message(r->file, path, r->line, r->col, r->substr);
    assert_defaults(&spec, r->file);
    return;
  }

  cr_assert_eq(st, MPG_OK, "%s: the file itself should load: %s (%s)", r->file,
               mpg_status_name(st), mpg_last_error());
  int world = r->world == NO_WORLD ? 0 : r->world;
  mpg_mesh *mesh = (mpg_mesh *)&spec; /* must be reset to NULL */
  st = mpg_mesh_create(&spec, world, &mesh);
  cr_assert_eq(st, r->status,
               "%s: mpg_mesh_create(world %d) returned %s, expected %s (%s)", r->file,
               world, mpg_status_name(st), mpg_status_name(r->status),
               mpg_last_error());
  cr_assert_null(mesh, "%s: *out was not set to NULL on failure", r->file);
  assert_message(r->file, path, r->line, r->col, r->substr);
}

/* The catalogue is what the brief promised. */
Test(spec_errors, catalogue_size) {
  cr_assert_geq(NROWS, 36, "only %d bad specs", NROWS);
}

/* Every fixture under data/bad/ has its row, so none goes untested. */
Test(spec_errors, every_fixture_has_a_row) {
  char dir[MPG_PATH_MAX];
  data_path(dir, sizeof dir, "bad");
  DIR *d = opendir(dir);
  cr_assert_not_null(d, "cannot open %s", dir);
  int nfiles = 0;
  const char *missing = NULL;
  char missing_buf[256];
  for (struct dirent *e; (e = readdir(d)) != NULL;) {
    size_t n = strlen(e->d_name);
    if (n < 5 || strcmp(e->d_name + n - 5, ".toml") != 0) continue;
    nfiles++;
    int found = 0;
    for (int i = 0; i < NROWS && !found; i++) found = strcmp(rows[i].file, e->d_name) == 0;
    if (!found && !missing) {
      snprintf(missing_buf, sizeof missing_buf, "%s", e->d_name);
      missing = missing_buf;
    }
  }
  closedir(d);
  cr_assert_null(missing, "%s/%s has no row in the table", dir, missing);
  cr_assert_eq(nfiles, NROWS, "%d files in %s but %d rows", nfiles, dir, NROWS);
}

/* ---------------------------------------------------------------------- */

Test(spec_errors, missing_file_is_io_error) {
  char path[MPG_PATH_MAX];
  data_path(path, sizeof path, "bad/no_such_file.toml");
  mpg_spec spec = MPG_SPEC_INIT;
  /* Scribble over every field but the header: the error resets them. */
  memset((char *)&spec + 16, 0xab, sizeof spec - 16);
  mpg_status st = mpg_spec_load_file(path, &spec);
  cr_assert_eq(st, MPG_ERR_IO, "returned %s (%s)", mpg_status_name(st), mpg_last_error());
  char prefix[MPG_PATH_MAX + 8];
  snprintf(prefix, sizeof prefix, "%s: ", path);
  cr_assert(strncmp(mpg_last_error(), prefix, strlen(prefix)) == 0,
            "message \"%s\" does not start with the path \"%s\"", mpg_last_error(),
            prefix);
  cr_assert(strstr(mpg_last_error(), "No such file or directory") != NULL,
            "message \"%s\" does not give the reason", mpg_last_error());
  assert_defaults(&spec, "no_such_file.toml");
}

/* Expected to fail until a directory is rejected as unreadable (today it
 * reads as an empty file and reports a missing [mesh]; see report). */
Test(spec_errors, directory_is_io_error) {
  char path[MPG_PATH_MAX];
  data_path(path, sizeof path, "bad");
  mpg_spec spec = MPG_SPEC_INIT;
  mpg_status st = mpg_spec_load_file(path, &spec);
  cr_assert_eq(st, MPG_ERR_IO, "loading the directory %s returned %s (%s)", path,
               mpg_status_name(st), mpg_last_error());
  cr_assert(strstr(mpg_last_error(), path) != NULL, "message \"%s\" lacks the path",
            mpg_last_error());
  assert_defaults(&spec, "a directory");
}

/* ---------------------------------------------------------------------- */

Test(spec_errors, load_string_null_name_is_string) {
  mpg_spec spec = MPG_SPEC_INIT;
  mpg_status st = mpg_spec_load_string(
      "[mesh]\ndims = [ { name = \"dp\", size = 0 } ]\n", NULL, &spec);
  cr_assert_eq(st, MPG_ERR_SPEC, "returned %s", mpg_status_name(st));
  assert_message("string", "<string>", 2, 32,
                 "mesh.dims[0].size: expected a positive integer or -1 for dim "
                 "\"dp\", found 0");
  assert_defaults(&spec, "string");

  st = mpg_spec_load_string("[mesh]\ndims = [ { name = \"dp\" size = 2 } ]\n", NULL,
                            &spec);
  cr_assert_eq(st, MPG_ERR_PARSE, "returned %s", mpg_status_name(st));
  assert_message("string syntax", "<string>", 2, 24, "TOML syntax error: ");
  assert_defaults(&spec, "string syntax");

  st = mpg_spec_load_string("[mesh]\ndims = [ { name = \"dp\", size = 2 } ]\n\n"
                            "[backend]\nnam = \"mpi\"\n",
                            NULL, &spec);
  cr_assert_eq(st, MPG_ERR_SPEC, "returned %s", mpg_status_name(st));
  assert_message("string typo", "<string>", 5, 1,
                 "backend.nam: unknown key (did you mean \"name\"?)");
}

Test(spec_errors, load_string_name_is_used) {
  mpg_spec spec = MPG_SPEC_INIT;
  mpg_status st = mpg_spec_load_string(
      "[mesh]\ndims = [ { name = \"dp\", size = 2 } ]\n[sync]\nop = \"max\"\n",
      "inline.toml", &spec);
  cr_assert_eq(st, MPG_ERR_SPEC, "returned %s", mpg_status_name(st));
  assert_message("named string", "inline.toml", 4, 6,
                 "sync.op: expected one of \"avg\", \"sum\", found string \"max\"");
}

/* A spec read from a string keeps its positions for mpg_mesh_create. */
Test(spec_errors, load_string_world_mismatch) {
  mpg_spec spec = MPG_SPEC_INIT;
  mpg_status st = mpg_spec_load_string(
      "[mesh]\ndims = [ { name = \"dp\", size = 2 }, { name = \"tp\", size = 4 } ]\n",
      NULL, &spec);
  cr_assert_eq(st, MPG_OK, "%s", mpg_last_error());
  mpg_mesh *mesh = NULL;
  st = mpg_mesh_create(&spec, 6, &mesh);
  cr_assert_eq(st, MPG_ERR_SPEC, "returned %s", mpg_status_name(st));
  cr_assert_null(mesh);
  assert_message("string world", "<string>", 2, 19,
                 "mesh.dims: world size 6 does not equal 8");
}

/* ---------------------------------------------------------------------- */

/* Every key of every section, each set to a non-default value. */
Test(spec_good, full) {
  char path[MPG_PATH_MAX];
  data_path(path, sizeof path, "good/full.toml");
  mpg_spec spec = MPG_SPEC_INIT;
  mpg_status st = mpg_spec_load_file(path, &spec);
  cr_assert_eq(st, MPG_OK, "%s: %s", mpg_status_name(st), mpg_last_error());
  cr_assert_eq(mpg_spec_validate(&spec), MPG_OK, "%s", mpg_last_error());
  cr_assert_str_eq(spec.source, path);

  /* [mesh]: dims written tp, cp, dp, pp; order "tp-cp-dp-pp" makes the
   * mesh pp, dp, cp, tp (outermost first).  Positions travel with dims. */
  static const char *const names[] = {"pp", "dp", "cp", "tp"};
  static const int sizes[] = {2, -1, 2, 4};
  static const int lines[] = {8, 7, 6, 5};
  cr_assert_eq(spec.ndims, 4);
  for (int i = 0; i < 4; i++) {
    cr_assert_str_eq(spec.dims[i].name, names[i], "dims[%d]", i);
    cr_assert_eq(spec.dims[i].size, sizes[i], "dims[%d].size", i);
    cr_assert_eq(spec.dims[i].name_pos.line, lines[i], "dims[%d].name_pos", i);
    cr_assert_eq(spec.dims[i].name_pos.col, 12, "dims[%d].name_pos", i);
    cr_assert_eq(spec.dims[i].size_pos.line, lines[i], "dims[%d].size_pos", i);
    cr_assert_eq(spec.dims[i].size_pos.col, 25, "dims[%d].size_pos", i);
  }
  cr_assert_eq(spec.nflatten, 2);
  cr_assert_str_eq(spec.flatten[0].name, "dp_cp");
  cr_assert_eq(spec.flatten[0].ndims, 2);
  cr_assert_str_eq(spec.flatten[0].dims[0], "dp");
  cr_assert_str_eq(spec.flatten[0].dims[1], "cp");
  cr_assert_eq(spec.flatten[0].name_pos.line, 10);
  cr_assert_eq(spec.flatten[0].name_pos.col, 13);
  cr_assert_eq(spec.flatten[0].dim_pos[1].line, 10);
  cr_assert_eq(spec.flatten[0].dim_pos[1].col, 28);
  cr_assert_str_eq(spec.flatten[1].name, "pp_dp");
  cr_assert_eq(spec.flatten[1].ndims, 2);
  cr_assert_str_eq(spec.flatten[1].dims[0], "pp");
  cr_assert_str_eq(spec.flatten[1].dims[1], "dp");

  /* [topology] */
  cr_assert_eq(spec.topology.nodes, 4);
  cr_assert_eq(spec.topology.gpus_per_node, 4);
  cr_assert_eq(spec.topology.bind, MPG_BIND_CORE);
  cr_assert_eq(spec.topology.rank_order, MPG_RANK_ORDER_CYCLIC);
  cr_assert_eq(spec.topology.strict, 1);

  /* [sync] */
  cr_assert_eq(spec.sync.fsdp_owns_dp, 1);
  cr_assert_eq(spec.sync.op, MPG_OP_SUM);
  cr_assert(spec.sync.bucket_mb == 50.5, "bucket_mb %g", spec.sync.bucket_mb);
  cr_assert(spec.sync.first_bucket_mb == 2.5, "first_bucket_mb %g", spec.sync.first_bucket_mb);
  cr_assert_eq(spec.sync.reduce_dtype, MPG_REDUCE_NATIVE);

  /* [backend] */
  cr_assert_eq(spec.backend.name, MPG_BACKEND_NCCL);
  cr_assert(spec.backend.timeout_s == 30.0, "timeout_s %g", spec.backend.timeout_s);
  cr_assert_eq(spec.backend.lazy_groups, 1);

  /* And it builds: 32 ranks give dp = 32 / (2 * 2 * 4) = 2. */
  mpg_mesh *mesh = NULL;
  st = mpg_mesh_create(&spec, 32, &mesh);
  cr_assert_eq(st, MPG_OK, "%s", mpg_last_error());
  const char *name = NULL;
  int size = 0;
  cr_assert_eq(mpg_mesh_dim(mesh, 1, &name, &size), MPG_OK);
  cr_assert_str_eq(name, "dp");
  cr_assert_eq(size, 2);
  mpg_mesh_destroy(mesh);
}

/* Only the mesh, as [[mesh.dims]] tables; every other field keeps its default. */
Test(spec_good, minimal) {
  char path[MPG_PATH_MAX];
  data_path(path, sizeof path, "good/minimal.toml");
  mpg_spec spec = MPG_SPEC_INIT, fresh = MPG_SPEC_INIT;
  mpg_status st = mpg_spec_load_file(path, &spec);
  cr_assert_eq(st, MPG_OK, "%s: %s", mpg_status_name(st), mpg_last_error());
  cr_assert_eq(mpg_spec_init(&fresh), MPG_OK);
  cr_assert_eq(spec.ndims, 2);
  cr_assert_str_eq(spec.dims[0].name, "dp");
  cr_assert_eq(spec.dims[0].size, -1);
  cr_assert_eq(spec.dims[0].size_pos.line, 4);
  cr_assert_eq(spec.dims[0].size_pos.col, 8);
  cr_assert_str_eq(spec.dims[1].name, "tp");
  cr_assert_eq(spec.dims[1].size, 8);
  cr_assert_eq(spec.dims[1].name_pos.line, 7);
  cr_assert_eq(spec.dims[1].name_pos.col, 8);
  cr_assert_eq(spec.nflatten, 0);
  cr_assert_str_eq(spec.source, path);

  /* Everything after the mesh is exactly the default. */
  cr_assert(memcmp(&spec.topology, &fresh.topology,
                   offsetof(mpg_spec, source) - offsetof(mpg_spec, topology)) == 0,
            "a field outside [mesh] is not its default");
  cr_assert_eq(spec.topology.bind, MPG_BIND_NONE);
  cr_assert_eq(spec.topology.rank_order, MPG_RANK_ORDER_BLOCK);
  cr_assert_eq(spec.sync.op, MPG_OP_AVG);
  cr_assert(spec.sync.bucket_mb == 25.0);
  cr_assert(spec.sync.first_bucket_mb == 1.0);
  cr_assert_eq(spec.sync.reduce_dtype, MPG_REDUCE_F32);
  cr_assert_eq(spec.backend.name, MPG_BACKEND_THREAD);
  cr_assert(spec.backend.timeout_s == 600.0);

  mpg_mesh *mesh = NULL;
  st = mpg_mesh_create(&spec, 16, &mesh);
  cr_assert_eq(st, MPG_OK, "%s", mpg_last_error());
  cr_assert_eq(mpg_mesh_world_size(mesh), 16);
  const char *name = NULL;
  int size = 0;
  cr_assert_eq(mpg_mesh_dim(mesh, 0, &name, &size), MPG_OK);
  cr_assert_str_eq(name, "dp");
  cr_assert_eq(size, 2);
  mpg_mesh_destroy(mesh);
}

/* Flattened sets keep the order the spec writes them in (meshpg.h: dim sets
 * are "every flattened set (spec order)").  Expected to fail until the
 * reader stops taking toml++'s key-sorted table order (see report). */
Test(spec_good, flatten_keeps_spec_order) {
  mpg_spec spec = MPG_SPEC_INIT;
  mpg_status st = mpg_spec_load_string(
      "[mesh]\n"
      "dims = [ { name = \"dp\", size = 2 }, { name = \"cp\", size = 2 }, "
      "{ name = \"tp\", size = 2 } ]\n"
      "flatten = { tp_only = [\"tp\"], dp_cp = [\"dp\", \"cp\"] }\n",
      NULL, &spec);
  cr_assert_eq(st, MPG_OK, "%s", mpg_last_error());
  cr_assert_eq(spec.nflatten, 2);
  cr_assert_str_eq(spec.flatten[0].name, "tp_only",
                   "flatten[0] is \"%s\", the spec writes tp_only first",
                   spec.flatten[0].name);
  cr_assert_str_eq(spec.flatten[1].name, "dp_cp");
}

/* [sync] shard mode keys: dims lists as arrays (DESIGN.md's form) or one
 * comma-separated string; wrong forms and combinations are refused. */
Test(spec_good, shard_mode_keys_in_both_forms) {
  const char *mesh = "[mesh]\ndims = [ { name = \"dp_replicate\", size = 2 }, "
                     "{ name = \"dp_shard\", size = 2 }, { name = \"cp\", size = 2 } ]\n";
  char text[1024];
  mpg_spec spec = MPG_SPEC_INIT;
  snprintf(text, sizeof text, "%s[sync]\nmode = \"shard\"\nshard_dims = [\"dp_shard\", \"cp\"]\n"
           "replicate_dims = [\"dp_replicate\"]\npad_for_nccl = true\n", mesh);
  cr_assert_eq(mpg_spec_load_string(text, NULL, &spec), MPG_OK, "%s", mpg_last_error());
  cr_assert_eq(spec.sync.mode, MPG_SYNC_SHARD);
  cr_assert_str_eq(spec.sync.shard_dims, "dp_shard,cp");
  cr_assert_str_eq(spec.sync.replicate_dims, "dp_replicate");
  cr_assert_eq(spec.sync.pad_for_nccl, 1);
  snprintf(text, sizeof text, "%s[sync]\nmode = \"shard\"\nshard_dims = \"dp_shard,cp\"\n", mesh);
  cr_assert_eq(mpg_spec_load_string(text, NULL, &spec), MPG_OK, "%s", mpg_last_error());
  cr_assert_str_eq(spec.sync.shard_dims, "dp_shard,cp");
  snprintf(text, sizeof text, "%s[sync]\nmode = \"shard\"\nshard_dims = [\"cp\", 3]\n", mesh);
  cr_assert_eq(mpg_spec_load_string(text, NULL, &spec), MPG_ERR_SPEC);
  cr_assert(strstr(mpg_last_error(), "sync.shard_dims[1]"), "%s", mpg_last_error());
  snprintf(text, sizeof text, "%s[sync]\nmode = \"sharded\"\n", mesh);
  cr_assert_eq(mpg_spec_load_string(text, NULL, &spec), MPG_ERR_SPEC);
  cr_assert(strstr(mpg_last_error(), "sync.mode") && strstr(mpg_last_error(), "\"shard\""),
            "%s", mpg_last_error());
  snprintf(text, sizeof text, "%s[sync]\nreplicate_dims = [\"dp_replicate\"]\n", mesh);
  cr_assert_eq(mpg_spec_load_string(text, NULL, &spec), MPG_ERR_SPEC);
  cr_assert(strstr(mpg_last_error(), "needs sync.mode"), "%s", mpg_last_error());
  /* The expert shard keys (issue 21). */
  snprintf(text, sizeof text, "%s[sync]\nmode = \"shard\"\nexpert_shard_dims = [\"edp\"]\n"
           "optimizer_instances = 2\n", mesh);
  cr_assert_eq(mpg_spec_load_string(text, NULL, &spec), MPG_OK, "%s", mpg_last_error());
  cr_assert_str_eq(spec.sync.expert_shard_dims, "edp");
  cr_assert_eq(spec.sync.optimizer_instances, 2);
  snprintf(text, sizeof text, "%s[sync]\nmode = \"shard\"\nexpert_shard_dims = \"none\"\n",
           mesh);
  cr_assert_eq(mpg_spec_load_string(text, NULL, &spec), MPG_OK, "%s", mpg_last_error());
  /* one spelling in C and TOML: "none" (the default is "") */
  cr_assert_str_eq(spec.sync.expert_shard_dims, "none");
  cr_assert_eq(spec.sync.optimizer_instances, 0); /* the default: one instance */
  snprintf(text, sizeof text, "%s[sync]\nmode = \"shard\"\noptimizer_instances = 0\n", mesh);
  cr_assert_eq(mpg_spec_load_string(text, NULL, &spec), MPG_ERR_SPEC);
  cr_assert(strstr(mpg_last_error(), ":5:23: sync.optimizer_instances") && strstr(mpg_last_error(), "found 0"), "%s",
            mpg_last_error());
  snprintf(text, sizeof text, "%s[sync]\noptimizer_instances = 2\n", mesh);
  cr_assert_eq(mpg_spec_load_string(text, NULL, &spec), MPG_ERR_SPEC);
  cr_assert(strstr(mpg_last_error(), "optimizer_instances needs sync.mode"), "%s",
            mpg_last_error());
}
