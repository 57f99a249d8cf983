/* Mesh builders of the suites (tests/support/mesh_util.c, mesh_check.c):
 * a mesh from its dims string and flatten items, checked or not. */
#ifndef MPG_TESTS_SUPPORT_MESH_UTIL_H
#define MPG_TESTS_SUPPORT_MESH_UTIL_H

#include "meshpg.h"

/* A mesh from dims "dp=2,cp=2" (sizes may be -1) and flatten
 * "dp_cp=dp,cp;tp_cp=tp,cp" (items separated by ';'; NULL or "" for none),
 * validated and created over `world` ranks (0: the world it implies).
 * MPG_OK and *mesh, or the first failing call's status and *mesh NULL.
 * Asserts nothing: usable on rank threads and in MPI workers. */
mpg_status mesh_build(const char *dims, const char *flatten, int world, mpg_mesh **mesh);

/* On the test thread (Criterion asserts): a mesh from dims and flatten
 * items "dp_cp=dp,cp" (a NULL-ended list, or NULL), over the world it
 * implies. */
mpg_mesh *make_mesh(const char *dims, const char *const *flat);

/* make_mesh(dims, NULL). */
mpg_mesh *make_dims_mesh(const char *dims);

#endif
