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

#include "train.h"

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

/* The data (load_data, its length in *len) and the single-process
 * reference run of c over `steps`: its model in *ref, the losses in
 * rloss[0..steps) and, when g1 is not NULL, the gradients of step 1. */
static inline uint8_t *reference_run(const gpt_config *c, int steps, size_t *len, gpt_model *ref,
                                     double *rloss, float ***g1) {
  uint8_t *data = load_data(len);
  cr_assert_eq(gpt_reference_train(c, data, *len, steps, ref, rloss, g1), 0);
  return data;
}

#endif
