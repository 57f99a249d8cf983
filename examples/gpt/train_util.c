/* The parallel trainer's helpers that need no rank (train.h): the mesh
 * parser, and the comparison of a tensor shard with the reference. */
#include "moe.h"
#include "train.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

int gpt_parse_mesh(const char *s, gpt_dims *d) {
  memset(d, 0, sizeof *d);
  d->pp = d->dp = d->cp = d->tp = d->dp_rep = d->dp_shard = 1;
  int has_dp = 0;
  char buf[256];
  snprintf(buf, sizeof buf, "%s", s);
  for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
       tok = strtok_r(NULL, ",", &save)) {
    char name[32];
    int v;
    if (sscanf(tok, " %31[a-z_] = %d", name, &v) != 2 || v < 1) return -1;
    if (!strcmp(name, "pp")) d->pp = v;
    else if (!strcmp(name, "dp")) d->dp = v, has_dp = 1;
    else if (!strcmp(name, "cp")) d->cp = v;
    else if (!strcmp(name, "tp")) d->tp = v;
    else if (!strcmp(name, "dp_replicate")) d->dp_rep = v, d->hsdp = 1;
    else if (!strcmp(name, "dp_shard")) d->dp_shard = v, d->hsdp = 1;
    else return -1;
  }
  if (d->hsdp) {
    if (has_dp) return -1; /* dp or dp_replicate x dp_shard, not both */
    d->dp = d->dp_rep * d->dp_shard;
  }
  return 0;
}

double gpt_shard_error_at(const gpt_config *c, int id, int parts, int r, const float *a,
                          size_t off, size_t n, const float *ref_full, int skip_key_bias) {
  const size_t C = (size_t)c->d_model;
  const int kb = skip_key_bias && id < gpt_moe_base(c) && gpt_tensor_layer(id) >= 0 &&
                 gpt_tensor_kind(id) == L_QKVB;
  double e2 = 0.0, r2 = 0.0;
  if (n == 0) return -1.0;
  for (size_t i = off; i < off + n; i++) {
    size_t f = gpt_shard_to_full(c, id, parts, r, i);
    if (kb && f >= C && f < 2 * C) continue;
    double ref = ref_full[f], d = (double)a[i] - ref;
    e2 += d * d;
    r2 += ref * ref;
  }
  return r2 > 0 ? sqrt(e2 / r2) : sqrt(e2);
}

double gpt_shard_error(const gpt_config *c, int id, int parts, int r, const float *a,
                       size_t n, const float *ref_full, int skip_key_bias) {
  return gpt_shard_error_at(c, id, parts, r, a, 0, n, ref_full, skip_key_bias);
}
