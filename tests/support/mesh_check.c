/* Mesh builders that assert (Criterion, on the test thread): see
 * mesh_util.h. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "mesh_util.h"

mpg_mesh *make_mesh(const char *dims, const char *const *flat) {
  mpg_spec spec = MPG_SPEC_INIT;
  cr_assert_eq(mpg_spec_init(&spec), MPG_OK);
  cr_assert_eq(mpg_spec_set_mesh(&spec, dims), MPG_OK, "%s", mpg_last_error());
  for (; flat && *flat; flat++) {
    char name[64];
    const char *eq = strchr(*flat, '=');
    cr_assert_not_null(eq);
    snprintf(name, sizeof name, "%.*s", (int)(eq - *flat), *flat);
    cr_assert_eq(mpg_spec_add_flatten(&spec, name, eq + 1), MPG_OK, "%s",
                 mpg_last_error());
  }
  mpg_mesh *m = NULL;
  mpg_status st = mpg_mesh_create(&spec, 0, &m);
  cr_assert_eq(st, MPG_OK, "mesh %s: %s", dims, mpg_last_error());
  return m;
}

mpg_mesh *make_dims_mesh(const char *dims) { return make_mesh(dims, NULL); }
