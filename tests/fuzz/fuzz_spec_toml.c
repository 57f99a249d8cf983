/* libFuzzer target: the TOML spec loader (mpg_spec_load_string).  A spec
 * that loads validates, and the mesh built from it (a -1 dim resolved by a
 * world size, the world bounded by FUZZ_MAX_WORLD) keeps the mesh
 * invariants; a spec that does not load leaves the defaults and a message. */
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *text = fuzz_strdup(data, size);
  mpg_spec spec = MPG_SPEC_INIT;
  spec.ndims = 3; /* overwritten: load resets the spec */
  mpg__clear_error();
  mpg_status st = mpg_spec_load_string(text, "fuzz.toml", &spec);
  fuzz_check_status(st);
  FUZZ_CHECK(st == MPG_OK || st == MPG_ERR_PARSE || st == MPG_ERR_SPEC ||
             st == MPG_ERR_NOMEM);
  if (st == MPG_OK) {
    FUZZ_CHECK(strcmp(spec.source, "fuzz.toml") == 0);
    fuzz_check_spec_mesh(&spec, (unsigned)size);
    /* Reloading gives the same spec (the loader keeps no state). */
    mpg_spec again = MPG_SPEC_INIT;
    FUZZ_CHECK(mpg_spec_load_string(text, "fuzz.toml", &again) == MPG_OK);
    FUZZ_CHECK(memcmp(&again, &spec, sizeof spec) == 0);
  } else {
    /* On error *spec holds the defaults. */
    mpg_spec defaults = MPG_SPEC_INIT;
    FUZZ_CHECK(memcmp(&spec, &defaults, sizeof spec) == 0);
    /* The message names the file for positioned errors. */
    if (st == MPG_ERR_PARSE)
      FUZZ_CHECK(strstr(mpg_last_error(), "fuzz.toml") != NULL);
  }
  free(text);
  return 0;
}
