/* EXPECT_ERR(call, status, text): the call returns `status` and
 * mpg_last_error() contains `text` (Criterion; tests/mesh). */
#ifndef MESH_EXPECT_ERR_H
#define MESH_EXPECT_ERR_H

#include <criterion/criterion.h>
#include <string.h>

#include "meshpg.h"

#define EXPECT_ERR(expr, want, sub)                                            \
  do {                                                                         \
    mpg_status st_ = (expr);                                                   \
    cr_assert_eq(st_, (want), "%s: got %s, want %s (message: \"%s\")", #expr,  \
                 mpg_status_name(st_), mpg_status_name(want),                  \
                 mpg_last_error());                                            \
    cr_assert(strstr(mpg_last_error(), (sub)) != NULL,                         \
              "%s: message \"%s\" does not contain \"%s\"", #expr,             \
              mpg_last_error(), (sub));                                        \
  } while (0)

#endif
