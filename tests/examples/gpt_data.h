/* The training data of the GPT example's tests: the first MiB of
 * GPT_DEFAULT_DATA (include/meshpg.h, set by examples/gpt/meson.build),
 * read once per test.  Criterion asserts that it opens and holds more
 * than 1000 bytes. */
#ifndef MESHPG_TESTS_GPT_DATA_H
#define MESHPG_TESTS_GPT_DATA_H

#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static inline uint8_t *load_data(size_t *len) {
  FILE *f = fopen(GPT_DEFAULT_DATA, "rb");
  cr_assert_not_null(f, "cannot open %s", GPT_DEFAULT_DATA);
  uint8_t *buf = malloc(1 << 20);
  cr_assert_not_null(buf);
  *len = fread(buf, 1, 1 << 20, f);
  fclose(f);
  cr_assert_gt(*len, 1000);
  return buf;
}

#endif
