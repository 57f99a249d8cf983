/* The mesh `meshpg sim` runs on: the spec completed with the dims the
 * model needs (dp, cp, tp and the flattened set dp_cp), --hsdp's split of
 * dp, the check that the mesh is the model's, and dim masks of dim lists. */
#include <stdio.h>
#include <string.h>

#include "sim_internal.h"

static int find_dim(const mpg_spec *spec, const char *name) {
  for (int d = 0; d < spec->ndims; d++)
    if (strcmp(spec->dims[d].name, name) == 0) return d;
  return -1;
}

/* The data dims present in the spec, in mesh order, as "dp,cp" or
 * "dp_replicate,dp_shard,cp". */
static void data_dims_list(const mpg_spec *spec, char *buf, size_t cap) {
  static const char *const data[4] = {"dp", "dp_replicate", "dp_shard", "cp"};
  int idx[4], order[4], n = 0;
  for (int k = 0; k < 4; k++) {
    idx[k] = find_dim(spec, data[k]);
    if (idx[k] >= 0) order[n++] = k;
  }
  for (int a = 1; a < n; a++) /* insertion sort by mesh position */
    for (int b = a; b > 0 && idx[order[b]] < idx[order[b - 1]]; b--) {
      int t = order[b];
      order[b] = order[b - 1];
      order[b - 1] = t;
    }
  size_t len = 0;
  buf[0] = '\0';
  for (int k = 0; k < n && len < cap; k++) {
    int w = snprintf(buf + len, cap - len, "%s%s", k ? "," : "", data[order[k]]);
    if (w < 0) break;
    len += (size_t)w;
  }
}

/* Give the spec what the model needs: the data dims (dp, or dp_replicate
 * and dp_shard), cp and tp (a missing one is added with size 1, innermost)
 * and the flattened set dp_cp of every data dim and cp. */
static int complete_spec(mpg_spec *spec, char *added, size_t cap) {
  static const char *const need[3] = {"dp", "cp", "tp"};
  int hsdp_named = find_dim(spec, "dp_replicate") >= 0 || find_dim(spec, "dp_shard") >= 0;
  added[0] = '\0';
  for (int k = 0; k < 3; k++) {
    if (find_dim(spec, need[k]) >= 0) continue;
    if (k == 0 && hsdp_named) continue; /* dp_replicate x dp_shard are the data dims */
    if (spec->ndims >= MPG_MAX_DIMS) {
      tool_error("the mesh has no dim \"%s\" and no room to add one "
                 "(at most %d dims)", need[k], MPG_MAX_DIMS);
      return 0;
    }
    mpg_dim *d = &spec->dims[spec->ndims++];
    memset(d, 0, sizeof *d);
    snprintf(d->name, sizeof d->name, "%s", need[k]);
    d->size = 1;
    size_t len = strlen(added);
    snprintf(added + len, cap - len, "%s%s=1", len ? ", " : "", need[k]);
  }
  int have = 0;
  for (int f = 0; f < spec->nflatten; f++)
    if (strcmp(spec->flatten[f].name, "dp_cp") == 0) have = 1;
  if (!have) {
    char dims[80];
    data_dims_list(spec, dims, sizeof dims);
    mpg_status st = mpg_spec_add_flatten(spec, "dp_cp", dims);
    if (st != MPG_OK) {
      tool_fail(st, NULL);
      return 0;
    }
    size_t len = strlen(added);
    snprintf(added + len, cap - len, "%sdp_cp=[%s]", len ? ", " : "", dims);
  }
  mpg_status st = mpg_spec_validate(spec);
  if (st != MPG_OK) {
    tool_fail(st, NULL);
    return 0;
  }
  return 1;
}

/* --hsdp R: replace the dim dp (size D, resolved by `mesh`) with
 * dp_replicate = R and dp_shard = D / R at its place, in the dims and in
 * every flattened set that names dp; every other size is fixed to the
 * mesh's (a -1 is resolved).  A mesh that already names dp_replicate and
 * dp_shard is kept when its dp_replicate is R.  Returns 1, or 0 after an
 * error message. */
static int hsdp_split(mpg_spec *spec, const mpg_mesh *mesh, int R, char *note,
                      size_t cap) {
  note[0] = '\0';
  int dp = find_dim(spec, "dp");
  if (dp < 0) {
    int dr = find_dim(spec, "dp_replicate");
    int size = 0;
    if (dr >= 0) mpg_mesh_dim(mesh, dr, NULL, &size);
    if (dr < 0 || find_dim(spec, "dp_shard") < 0) {
      tool_error("--hsdp %d: the mesh has no dim \"dp\" to split (nor dims "
                 "dp_replicate and dp_shard)", R);
      return 0;
    }
    if (size != R) {
      tool_error("--hsdp %d: the mesh already has dp_replicate=%d", R, size);
      return 0;
    }
    return 1;
  }
  int D = 0;
  mpg_mesh_dim(mesh, dp, NULL, &D);
  if (D % R != 0) {
    tool_error("--hsdp %d: dp=%d does not split into %d replicas of equal size", R, D, R);
    return 0;
  }
  if (spec->ndims >= MPG_MAX_DIMS) {
    tool_error("--hsdp: no room for one more dim (at most %d)", MPG_MAX_DIMS);
    return 0;
  }
  for (int d = 0; d < spec->ndims; d++) mpg_mesh_dim(mesh, d, NULL, &spec->dims[d].size);
  memmove(&spec->dims[dp + 2], &spec->dims[dp + 1],
          sizeof spec->dims[0] * (size_t)(spec->ndims - dp - 1));
  spec->ndims++;
  memset(&spec->dims[dp], 0, sizeof spec->dims[0] * 2);
  snprintf(spec->dims[dp].name, MPG_NAME_MAX, "dp_replicate");
  spec->dims[dp].size = R;
  snprintf(spec->dims[dp + 1].name, MPG_NAME_MAX, "dp_shard");
  spec->dims[dp + 1].size = D / R;
  for (int f = 0; f < spec->nflatten; f++) {
    mpg_flatten *fl = &spec->flatten[f];
    for (int k = 0; k < fl->ndims; k++) {
      if (strcmp(fl->dims[k], "dp") != 0) continue;
      if (fl->ndims >= MPG_MAX_DIMS) {
        tool_error("--hsdp: no room for one more dim in the flattened set %s", fl->name);
        return 0;
      }
      memmove(&fl->dims[k + 2], &fl->dims[k + 1], sizeof fl->dims[0] * (size_t)(fl->ndims - k - 1));
      memmove(&fl->dim_pos[k + 2], &fl->dim_pos[k + 1],
              sizeof fl->dim_pos[0] * (size_t)(fl->ndims - k - 1));
      fl->ndims++;
      snprintf(fl->dims[k], MPG_NAME_MAX, "dp_replicate");
      snprintf(fl->dims[k + 1], MPG_NAME_MAX, "dp_shard");
      memset(&fl->dim_pos[k], 0, sizeof fl->dim_pos[0] * 2);
      break;
    }
  }
  mpg_status st = mpg_spec_validate(spec);
  if (st != MPG_OK) {
    tool_fail(st, NULL);
    return 0;
  }
  snprintf(note, cap, "dp=%d split into dp_replicate=%d x dp_shard=%d (--hsdp %d)", D, R,
           D / R, R);
  return 1;
}

/* The ranks of a group over the dims of `mask`. */
static int mask_size(const mpg_mesh *mesh, unsigned mask) {
  int n = 1;
  for (int d = 0; d < mpg_mesh_ndims(mesh); d++)
    if (mask & (1u << d)) {
      int size;
      mpg_mesh_dim(mesh, d, NULL, &size);
      n *= size;
    }
  return n;
}

/* The mesh must be the model's: data dims dp, or dp_replicate and dp_shard;
 * cp and tp; other dims of size 1; dp_cp exactly the data dims and cp. */
int sim_mesh_check(const mpg_mesh *mesh, sim_job *job) {
  int nd = mpg_mesh_ndims(mesh);
  job->dim_dp = job->dim_dpr = job->dim_dps = job->dim_cp = job->dim_tp = -1;
  for (int d = 0; d < nd; d++) {
    const char *name;
    int size;
    mpg_mesh_dim(mesh, d, &name, &size);
    if (strcmp(name, "dp") == 0) job->dim_dp = d, job->dp = size;
    else if (strcmp(name, "dp_replicate") == 0) job->dim_dpr = d, job->dpr = size;
    else if (strcmp(name, "dp_shard") == 0) job->dim_dps = d, job->dps = size;
    else if (strcmp(name, "cp") == 0) job->dim_cp = d, job->cp = size;
    else if (strcmp(name, "tp") == 0) job->dim_tp = d, job->tp = size;
    else if (size != 1) {
      tool_error("sim: the model is parallel over dp (or dp_replicate x dp_shard), "
                 "cp and tp only; dim \"%s\" must have size 1, found %d", name, size);
      return 0;
    }
  }
  unsigned data = 1u << job->dim_cp;
  if (job->dim_dp >= 0 && (job->dim_dpr >= 0 || job->dim_dps >= 0)) {
    tool_error("sim: the data-parallel dims are either dp or dp_replicate and "
               "dp_shard, not both");
    return 0;
  }
  if (job->dim_dp < 0) {
    if (job->dim_dpr < 0 || job->dim_dps < 0) {
      tool_error("sim: dim %s needs dim %s (HSDP names both)",
                 job->dim_dpr >= 0 ? "dp_replicate" : "dp_shard",
                 job->dim_dpr >= 0 ? "dp_shard" : "dp_replicate");
      return 0;
    }
    job->dp = job->dpr * job->dps;
    data |= (1u << job->dim_dpr) | (1u << job->dim_dps);
  } else {
    job->dpr = 1;
    job->dps = job->dp;
    data |= 1u << job->dim_dp;
  }
  unsigned dpcp;
  if (tool_dims_mask(mesh, "dp_cp", "the flattened set", &dpcp) != 0) return 0;
  if (dpcp != data) {
    tool_error("sim: the flattened set dp_cp must hold exactly the dims %s "
               "(gradients are averaged over it)",
               job->dim_dp >= 0 ? "dp and cp" : "dp_replicate, dp_shard and cp");
    return 0;
  }
  job->nsets = mpg_mesh_num_dimsets(mesh) - 1; /* all but "world" */
  return 1;
}

/* Print "name(size)" of a dims list into buf. */
void sim_dims_label(const mpg_mesh *mesh, const char *dims, char *buf, size_t cap) {
  unsigned mask = 0;
  if (tool_dims_mask(mesh, dims, "dims", &mask) != 0) mask = 0;
  snprintf(buf, cap, "%s (%d rank%s)", dims, mask_size(mesh, mask),
           mask_size(mesh, mask) == 1 ? "" : "s");
}

int sim_mesh_build(const sim_args *a, mpg_spec *spec, mpg_mesh **mesh_out,
                   char *added, size_t added_cap, char *note, size_t note_cap) {
  const int world = a->spec.world;
  *mesh_out = NULL;
  note[0] = '\0';
  /* The spec: a file, --mesh, or the seed mesh (examples/seed.toml). */
  mpg_status st = tool_spec_load(
      &a->spec, world ? "dp=-1,tp=2,cp=2" : "dp=2,tp=2,cp=2", spec);
  if (st != MPG_OK) return tool_fail(st, NULL);
  if (spec->sync.fsdp_owns_dp && (a->shard || a->hsdp)) {
    tool_error("%s: the spec sets [sync] fsdp_owns_dp = true (FSDP owns dp); "
               "the shard mode owns dp itself: drop one of them",
               a->shard ? "--shard" : "--hsdp");
    return TOOL_EXIT_FAIL;
  }
  if (a->fsdp && spec->sync.mode == MPG_SYNC_SHARD) {
    tool_error("--fsdp: the spec sets [sync] mode = \"shard\"; --fsdp runs its own "
               "pair of syncs: drop one of them");
    return TOOL_EXIT_FAIL;
  }
  if (!complete_spec(spec, added, added_cap)) return TOOL_EXIT_FAIL;
  mpg_mesh *mesh = NULL;
  st = mpg_mesh_create(spec, world, &mesh);
  if (st != MPG_OK) return tool_mesh_fail(st, spec, world);
  if (a->hsdp) {
    /* Split dp now that its size is known, and build the mesh again. */
    int ok = hsdp_split(spec, mesh, a->hsdp, note, note_cap);
    mpg_mesh_destroy(mesh);
    mesh = NULL;
    if (!ok) return TOOL_EXIT_FAIL;
    st = mpg_mesh_create(spec, world, &mesh);
    if (st != MPG_OK) return tool_fail(st, NULL);
  }
  *mesh_out = mesh;
  return TOOL_EXIT_OK;
}
