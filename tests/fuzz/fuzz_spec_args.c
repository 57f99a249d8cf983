/* libFuzzer target: the string forms of a spec, as given to --mesh,
 * --flatten and --order (mpg_spec_set_mesh, mpg_spec_add_flatten,
 * mpg_spec_apply_order).  The input is lines:
 *   line 1: the --mesh string
 *   line 2..n-1: --flatten values NAME=d1,d2 (the name before the first
 *                '='; a line without '=' is a name with an empty list)
 *   last line (when there are at least 3): the --order string
 * A failing call changes nothing and leaves a message; a spec that then
 * validates builds a mesh that keeps the mesh invariants. */
#include "fuzz_common.h"

#define MAX_LINES 12

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *text = fuzz_strdup_lines(data, size);
  char *lines[MAX_LINES];
  int n = 0;
  for (char *p = text; n < MAX_LINES;) {
    lines[n++] = p;
    char *nl = strchr(p, '\n');
    if (!nl) break;
    *nl = '\0';
    p = nl + 1;
  }
  mpg_spec spec = MPG_SPEC_INIT, before;
  mpg_status st;

  before = spec;
  mpg__clear_error();
  st = mpg_spec_set_mesh(&spec, lines[0]);
  fuzz_check_status(st);
  FUZZ_CHECK(st == MPG_OK || st == MPG_ERR_SPEC);
  if (st) FUZZ_CHECK(memcmp(&spec, &before, sizeof spec) == 0);
  else FUZZ_CHECK(spec.ndims >= 1 && spec.ndims <= MPG_MAX_DIMS);

  int last_flatten = n >= 3 ? n - 1 : n;
  for (int i = 1; i < last_flatten; i++) {
    char *eq = strchr(lines[i], '=');
    const char *dims = "";
    if (eq) {
      *eq = '\0';
      dims = eq + 1;
    }
    before = spec;
    mpg__clear_error();
    st = mpg_spec_add_flatten(&spec, lines[i], dims);
    fuzz_check_status(st);
    FUZZ_CHECK(st == MPG_OK || st == MPG_ERR_SPEC);
    if (st) FUZZ_CHECK(memcmp(&spec, &before, sizeof spec) == 0);
    else FUZZ_CHECK(spec.nflatten >= 1 && spec.nflatten <= MPG_MAX_FLATTEN);
  }

  if (n >= 3) {
    before = spec;
    mpg__clear_error();
    st = mpg_spec_apply_order(&spec, lines[n - 1]);
    fuzz_check_status(st);
    FUZZ_CHECK(st == MPG_OK || st == MPG_ERR_SPEC);
    if (st) {
      FUZZ_CHECK(memcmp(&spec, &before, sizeof spec) == 0);
    } else {
      /* A permutation: the same dims, reversed in the order's listing. */
      FUZZ_CHECK(spec.ndims == before.ndims);
      for (int i = 0; i < before.ndims; i++) {
        int found = 0;
        for (int j = 0; j < spec.ndims; j++)
          found += strcmp(before.dims[i].name, spec.dims[j].name) == 0 &&
                   before.dims[i].size == spec.dims[j].size;
        FUZZ_CHECK(found >= 1);
      }
    }
  }

  mpg__clear_error();
  st = mpg_spec_validate(&spec);
  fuzz_check_status(st);
  FUZZ_CHECK(st == MPG_OK || st == MPG_ERR_SPEC);
  if (st == MPG_OK) fuzz_check_spec_mesh(&spec, (unsigned)size);
  free(text);
  return 0;
}
