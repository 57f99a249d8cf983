/* Mesh builders that assert nothing: see mesh_util.h. */
#include "mesh_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

mpg_status mesh_build(const char *dims, const char *flatten, int world, mpg_mesh **mesh) {
  *mesh = NULL;
  /* on the heap: rank threads have small stacks */
  mpg_spec *spec = malloc(sizeof *spec);
  if (!spec) return MPG_ERR_NOMEM;
  *spec = (mpg_spec)MPG_SPEC_INIT;
  mpg_status st = mpg_spec_init(spec);
  if (!st) st = mpg_spec_set_mesh(spec, dims);
  if (!st && flatten && flatten[0]) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", flatten);
    char *save = NULL;
    for (char *tok = strtok_r(buf, ";", &save); tok && !st; tok = strtok_r(NULL, ";", &save)) {
      char *eq = strchr(tok, '=');
      if (!eq) {
        st = MPG_ERR_SPEC;
        break;
      }
      *eq = '\0';
      st = mpg_spec_add_flatten(spec, tok, eq + 1);
    }
  }
  if (!st) st = mpg_spec_validate(spec);
  if (!st) st = mpg_mesh_create(spec, world, mesh);
  free(spec);
  return st;
}
