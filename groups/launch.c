/* The launch environment: torchrun, Open MPI, PMI and Slurm variables,
 * merged into one mpg_launch with contradictions reported by name. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

enum { F_RANK, F_WORLD, F_LOCAL_RANK, F_LOCAL_WORLD, F_COUNT };

/* Each launcher's variable for each field (NULL: it has none). */
static const struct launcher {
  const char *name;
  const char *var[F_COUNT];
} launchers[] = {
    {"torchrun", {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"}},
    {"openmpi",
     {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
      "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"}},
    {"pmi", {"PMI_RANK", "PMI_SIZE", NULL, NULL}},
    {"slurm",
     {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"}},
};

static const char *const field_names[F_COUNT] = {"rank", "world size",
                                                 "local rank", "local world size"};

/* Parse a non-negative int.  Slurm's SLURM_NTASKS_PER_NODE may read
 * "4(x2)": the leading count is taken. */
static int parse_count(const char *s, int allow_suffix, int *out) {
  char *end;
  if (!*s) return 0;
  long v = strtol(s, &end, 10);
  if (end == s || v < 0 || v > 2147483647L) return 0;
  if (*end && !(allow_suffix && *end == '(')) return 0;
  *out = (int)v;
  return 1;
}

/* This node's task count under srun when SLURM_NTASKS_PER_NODE (set only
 * for --ntasks-per-node) is absent: srun lists the tasks of every node of
 * the step in node order, "2(x3),1" (three nodes of 2, then one of 1), in
 * SLURM_STEP_TASKS_PER_NODE (the job's in SLURM_TASKS_PER_NODE, read when
 * the step's is unset), and SLURM_NODEID is this node's position.  Sets
 * *n and *var (the list's variable), or leaves them when either variable
 * is unset.  MPG_ERR_ENV naming the variable when one is malformed. */
static mpg_status slurm_tasks_here(int *n, const char **var) {
  const char *name = "SLURM_STEP_TASKS_PER_NODE", *list = getenv(name);
  if (!list) list = getenv(name = "SLURM_TASKS_PER_NODE");
  const char *node_s = getenv("SLURM_NODEID");
  if (!list || !node_s) return MPG_OK;
  int node, left;
  if (!parse_count(node_s, 0, &node))
    return mpg__fail(MPG_ERR_ENV,
                     "SLURM_NODEID=\"%s\": expected a non-negative integer (this "
                     "node's position in the step)", node_s);
  left = node;
  int here = -1; /* this node's count, once passed; the rest is checked too */
  for (const char *p = list;;) {
    char *end = (char *)p;
    long count = *p >= '0' && *p <= '9' ? strtol(p, &end, 10) : -1, times = 1;
    if (count >= 1 && count <= 2147483647L && end[0] == '(' && end[1] == 'x') {
      const char *t = end + 2;
      times = *t >= '0' && *t <= '9' ? strtol(t, &end, 10) : -1;
      if (end[0] == ')') end++;
      else times = -1;
    }
    if (count < 1 || count > 2147483647L || times < 1 || (*end && *end != ','))
      return mpg__fail(MPG_ERR_ENV,
                       "%s=\"%s\": expected task counts per node such as "
                       "\"2(x3),1\"", name, list);
    if (here < 0 && left < times) here = (int)count;
    if (here < 0) left -= (int)times;
    if (!*end) break;
    p = end + 1;
  }
  if (here >= 1) {
    *n = here;
    *var = name;
    return MPG_OK;
  }
  return mpg__fail(MPG_ERR_ENV, "SLURM_NODEID=%d but %s=\"%s\" lists only %d nodes",
                   node, name, list, node - left);
}

/* Read the environment into *out, a full struct holding the defaults. */
static mpg_status read_env(mpg_launch *out) {
  int value[F_COUNT];
  const char *from[F_COUNT] = {NULL};
  for (int f = 0; f < F_COUNT; f++) value[f] = -1;

  for (size_t l = 0; l < sizeof launchers / sizeof launchers[0]; l++) {
    for (int f = 0; f < F_COUNT; f++) {
      const char *var = launchers[l].var[f];
      const char *s = var ? getenv(var) : NULL;
      if (!s) continue;
      int v;
      if (!parse_count(s, strcmp(var, "SLURM_NTASKS_PER_NODE") == 0, &v))
        return mpg__fail(MPG_ERR_ENV,
                         "%s=\"%s\": expected a non-negative integer (the %s)",
                         var, s, field_names[f]);
      if ((f == F_WORLD || f == F_LOCAL_WORLD) && v == 0)
        return mpg__fail(MPG_ERR_ENV, "%s=0: the %s must be at least 1", var,
                         field_names[f]);
      if (!out->source[0]) snprintf(out->source, sizeof out->source, "%s",
                                    launchers[l].name);
      if (from[f] && value[f] != v)
        return mpg__fail(MPG_ERR_ENV,
                         "contradictory %s: %s=%d but %s=%d", field_names[f],
                         from[f], value[f], var, v);
      if (!from[f]) {
        value[f] = v;
        from[f] = var;
      }
    }
  }
  if (value[F_LOCAL_WORLD] < 0 && getenv("SLURM_LOCALID")) {
    mpg_status st = slurm_tasks_here(&value[F_LOCAL_WORLD], &from[F_LOCAL_WORLD]);
    if (st) return st;
  }
  if (value[F_RANK] >= 0 && value[F_WORLD] > 0 && value[F_RANK] >= value[F_WORLD])
    return mpg__fail(MPG_ERR_ENV, "%s=%d is not below %s=%d", from[F_RANK],
                     value[F_RANK], from[F_WORLD], value[F_WORLD]);
  if (value[F_LOCAL_RANK] >= 0 && value[F_LOCAL_WORLD] > 0 &&
      value[F_LOCAL_RANK] >= value[F_LOCAL_WORLD])
    return mpg__fail(MPG_ERR_ENV, "%s=%d is not below %s=%d", from[F_LOCAL_RANK],
                     value[F_LOCAL_RANK], from[F_LOCAL_WORLD], value[F_LOCAL_WORLD]);
  if (value[F_RANK] >= 0 && value[F_WORLD] < 0)
    return mpg__fail(MPG_ERR_ENV, "%s=%d is set but no world size is (set WORLD_SIZE)",
                     from[F_RANK], value[F_RANK]);
  if (value[F_WORLD] > 0 && value[F_RANK] < 0)
    return mpg__fail(MPG_ERR_ENV, "%s=%d is set but no rank is (set RANK)",
                     from[F_WORLD], value[F_WORLD]);
  out->rank = value[F_RANK];
  out->world_size = value[F_WORLD];
  out->local_rank = value[F_LOCAL_RANK];
  out->local_world_size = value[F_LOCAL_WORLD];
  out->master_port = -1;

  const char *addr = getenv("MASTER_ADDR"), *port = getenv("MASTER_PORT");
  if (addr) {
    if (!*addr || strlen(addr) >= sizeof out->master_addr)
      return mpg__fail(MPG_ERR_ENV, "MASTER_ADDR=\"%s\": expected a host name or address",
                       addr);
    snprintf(out->master_addr, sizeof out->master_addr, "%s", addr);
  }
  if (port) {
    int p;
    if (!parse_count(port, 0, &p) || p < 1 || p > 65535)
      return mpg__fail(MPG_ERR_ENV, "MASTER_PORT=\"%s\": expected a port 1..65535", port);
    out->master_port = p;
  }
  if ((addr != NULL) != (port != NULL))
    return mpg__fail(MPG_ERR_ENV, "%s is set but %s is not: set both or neither",
                     addr ? "MASTER_ADDR" : "MASTER_PORT",
                     addr ? "MASTER_PORT" : "MASTER_ADDR");
  return MPG_OK;
}

mpg_status mpg_launch_from_env(mpg_launch *out) {
  mpg_status st = mpg__abi_check(out, MPG_LAUNCH_MAGIC, "mpg_launch_from_env: out",
                                 "MPG_LAUNCH_INIT");
  if (st) return st;
  mpg_launch full = MPG_LAUNCH_INIT;
  st = read_env(&full);
  if (!st) mpg__abi_out(out, &full, MPG__ABI_END(mpg_launch));
  return st;
}
