/* Placement of this process on its node: local rank -> GPU -> CPUs, and the
 * hwloc binding calls.  Also the host identity used to find node-mates. */
#include "topo_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The CPUs of NUMA node `numa` (OS index), or NULL. */
static hwloc_const_cpuset_t numa_cpuset(const mpg_topo *tp, int numa) {
  hwloc_obj_t n = hwloc_get_numanode_obj_by_os_index(tp->t, (unsigned)numa);
  return n ? n->cpuset : NULL;
}

/* The NUMA-mode domain of GPU g (or, with g < 0, of CPU rank r of lw). */
static hwloc_const_cpuset_t domain_of(const mpg_topo *tp, int g, int r, int lw,
                                      int *numa) {
  if (g >= 0) {
    const mpg__gpu *gpu = &tp->gpus[g];
    *numa = gpu->numa;
    hwloc_const_cpuset_t s = gpu->numa >= 0 ? numa_cpuset(tp, gpu->numa) : NULL;
    return s ? s : gpu->cpuset;
  }
  int nn = hwloc_get_nbobjs_by_type(tp->t, HWLOC_OBJ_NUMANODE);
  if (nn <= 0) {
    *numa = -1;
    return hwloc_topology_get_topology_cpuset(tp->t);
  }
  hwloc_obj_t n = hwloc_get_obj_by_type(tp->t, HWLOC_OBJ_NUMANODE,
                                        (unsigned)((long)r * nn / lw));
  *numa = (int)n->os_index;
  return n->cpuset;
}

/* Split `avail` into m disjoint blocks of whole cores (or of PUs when there
 * are fewer cores than m) and put block k into out.  Returns 0, or -1 when
 * even the PUs are fewer than m. */
static int split_block(const mpg_topo *tp, hwloc_const_cpuset_t avail, int m,
                       int k, hwloc_cpuset_t out) {
  hwloc_bitmap_zero(out);
  int ncores = mpg__topo_count_inside(tp->t, avail, HWLOC_OBJ_CORE);
  hwloc_obj_type_t unit = HWLOC_OBJ_CORE;
  int n = ncores;
  if (ncores < m) {
    unit = HWLOC_OBJ_PU;
    n = mpg__topo_count_inside(tp->t, avail, HWLOC_OBJ_PU);
  }
  if (n < m) return -1;
  /* Block k: units [k*base + min(k, extra), ...), the first `extra` blocks
   * take one more. */
  int base = n / m, extra = n % m;
  int first = k * base + (k < extra ? k : extra);
  int count = base + (k < extra ? 1 : 0);
  for (int i = first; i < first + count; i++) {
    hwloc_obj_t o =
        hwloc_get_obj_inside_cpuset_by_type(tp->t, avail, unit, (unsigned)i);
    if (o) hwloc_bitmap_or(out, out, o->cpuset);
  }
  return 0;
}

/* Core mode: the units (ranks or GPUs) are numbered 0..nunits-1, unit u has
 * GPU gpu_of[u] (or is CPU rank u when gpu_of is NULL).  Units with equal
 * domains split them; domains are handed out in unit order, and cores
 * already taken by an earlier domain are not given again. */
static mpg_status plan_core(const mpg_topo *tp, int nunits, const int *gpu_of,
                            int me, hwloc_cpuset_t out) {
  mpg_status st = MPG_OK;
  hwloc_bitmap_t taken = hwloc_bitmap_alloc();
  hwloc_bitmap_t avail = hwloc_bitmap_alloc();
  hwloc_const_cpuset_t *dom = malloc(sizeof *dom * (size_t)nunits);
  unsigned char *done = calloc((size_t)nunits, 1);
  if (!taken || !avail || !dom || !done) {
    st = mpg__fail(MPG_ERR_NOMEM, "bind: out of memory");
    goto out;
  }
  for (int u = 0; u < nunits; u++) {
    int numa;
    dom[u] = domain_of(tp, gpu_of ? gpu_of[u] : -1, u, nunits, &numa);
  }
  for (int u = 0; u < nunits && !done[me]; u++) {
    if (done[u]) continue;
    /* Everyone sharing u's domain, in unit order. */
    int m = 0, k = -1;
    for (int v = u; v < nunits; v++)
      if (!done[v] && hwloc_bitmap_isequal(dom[v], dom[u])) {
        if (v == me) k = m;
        m++;
      }
    hwloc_bitmap_andnot(avail, dom[u], taken);
    if (k >= 0) {
      if (split_block(tp, avail, m, k, out) != 0) {
        char list[MPG_CPUSET_STR_MAX];
        hwloc_bitmap_list_snprintf(list, sizeof list, avail);
        st = mpg__fail(MPG_ERR_TOPO,
                       "bind=core: %d ranks share the CPUs %s of topology %s, "
                       "which has only %d PUs there; use bind=numa or fewer "
                       "ranks",
                       m, list, tp->source, hwloc_bitmap_weight(avail));
        goto out;
      }
    }
    hwloc_bitmap_or(taken, taken, avail);
    for (int v = u; v < nunits; v++)
      if (!done[v] && hwloc_bitmap_isequal(dom[v], dom[u])) done[v] = 1;
  }
out:
  hwloc_bitmap_free(taken);
  hwloc_bitmap_free(avail);
  free(dom);
  free(done);
  return st;
}

static void fill_cpuset_text(char *buf, size_t cap, hwloc_const_bitmap_t set) {
  int n = hwloc_bitmap_list_snprintf(buf, cap, set);
  if (n >= (int)cap && cap > 4) strcpy(buf + cap - 4, "...");
}

/* Compute the binding into *r and the cpuset into `set`. */
static mpg_status plan(const mpg_topo *tp, int local_rank, int local_world,
                       int gpu, mpg_bind mode, mpg_binding *r,
                       hwloc_cpuset_t set) {
  if (local_world < 1)
    return mpg__fail(MPG_ERR_RANGE,
                     "bind: local world size must be >= 1, found %d",
                     local_world);
  if (local_rank < 0 || local_rank >= local_world)
    return mpg__fail(MPG_ERR_RANGE, "bind: local rank %d is outside 0..%d",
                     local_rank, local_world - 1);
  if (mode != MPG_BIND_NONE && mode != MPG_BIND_NUMA && mode != MPG_BIND_CORE)
    return mpg__fail(MPG_ERR_INVALID,
                     "bind: unknown mode %d (expected none, numa or core)",
                     (int)mode);
  if (gpu < -1 || gpu >= tp->ngpus) {
    if (tp->ngpus == 0)
      return mpg__fail(MPG_ERR_RANGE,
                       "bind: GPU %d was asked for, but topology %s has no GPU",
                       gpu, tp->source);
    return mpg__fail(MPG_ERR_RANGE,
                     "bind: GPU %d is outside 0..%d (topology %s has %d GPUs)",
                     gpu, tp->ngpus - 1, tp->source, tp->ngpus);
  }
  int explicit_gpu = gpu >= 0;
  if (gpu == -1 && tp->ngpus > 0) {
    if (local_world > tp->ngpus)
      return mpg__fail(MPG_ERR_TOPO,
                       "bind: %d local ranks but topology %s has %d GPUs "
                       "(local rank i takes GPU i); start at most %d ranks "
                       "per node or give each rank its GPU explicitly",
                       local_world, tp->source, tp->ngpus, tp->ngpus);
    gpu = local_rank;
  }
  memset(r, 0, sizeof *r);
  r->local_rank = local_rank;
  r->gpu = gpu;
  r->mode = mode;
  if (gpu >= 0) snprintf(r->gpu_bus_id, sizeof r->gpu_bus_id, "%s", tp->gpus[gpu].bus_id);
  int numa = -1;
  hwloc_const_cpuset_t dom = domain_of(tp, gpu, local_rank, local_world, &numa);
  r->numa_node = numa;
  hwloc_bitmap_zero(set);
  if (mode == MPG_BIND_NONE) return MPG_OK;
  if (mode == MPG_BIND_NUMA) {
    hwloc_bitmap_copy(set, dom);
  } else if (gpu < 0) {
    mpg_status st = plan_core(tp, local_world, NULL, local_rank, set);
    if (st) return st;
  } else {
    /* Default mapping: the sharers are local ranks 0..local_world-1 (rank
     * u on GPU u).  Explicit GPU: every GPU of the node is a sharer. */
    int n = explicit_gpu ? tp->ngpus : local_world;
    int me = explicit_gpu ? gpu : local_rank;
    int *gpu_of = malloc(sizeof(int) * (size_t)n);
    if (!gpu_of) return mpg__fail(MPG_ERR_NOMEM, "bind: out of memory");
    for (int u = 0; u < n; u++) gpu_of[u] = u;
    mpg_status st = plan_core(tp, n, gpu_of, me, set);
    free(gpu_of);
    if (st) return st;
  }
  fill_cpuset_text(r->cpuset, sizeof r->cpuset, set);
  r->num_pus = hwloc_bitmap_weight(set);
  r->num_cores = mpg__topo_count_inside(tp->t, set, HWLOC_OBJ_CORE);
  return MPG_OK;
}

static mpg_status bind_common(const mpg_topo *tp, int local_rank,
                              int local_world, int gpu, mpg_bind mode,
                              mpg_binding *report, int apply, int thread,
                              const char *fn) {
  if (!tp) return mpg__fail(MPG_ERR_INVALID, "%s: topo is NULL", fn);
  char what[64];
  snprintf(what, sizeof what, "%s: report", fn);
  mpg_status bad = mpg__abi_check(report, MPG_BINDING_MAGIC, what, "MPG_BINDING_INIT");
  if (bad) return bad;
  hwloc_cpuset_t set = hwloc_bitmap_alloc();
  if (!set) return mpg__fail(MPG_ERR_NOMEM, "%s: out of memory", fn);
  mpg_binding r = MPG_BINDING_INIT;
  mpg_status st = plan(tp, local_rank, local_world, gpu, mode, &r, set);
  if (!st && apply && mode != MPG_BIND_NONE) {
    if (!tp->this_system) {
      st = mpg__fail(MPG_ERR_TOPO,
                     "bind: topology %s is not this machine's, so binding "
                     "would do nothing; load it with mpg_topo_load_live, or "
                     "use MPG_BIND_APPLY_NONE to only compute the binding",
                     tp->source);
    } else {
      int flags = thread ? HWLOC_CPUBIND_THREAD : HWLOC_CPUBIND_PROCESS;
      if (hwloc_set_cpubind(tp->t, set, flags) != 0) {
        int e = errno;
        st = mpg__fail(MPG_ERR_TOPO,
                       "bind: local rank %d: binding the %s to CPUs %s failed: %s",
                       local_rank, thread ? "thread" : "process", r.cpuset,
                       strerror(e));
      } else {
        r.applied = 1;
        r.thread = thread;
      }
    }
  }
  if (!st && apply && mode == MPG_BIND_NONE) r.thread = thread;
  hwloc_bitmap_free(set);
  if (st) return st;
  mpg__abi_out(report, &r, MPG__ABI_END(mpg_binding));
  if (mode != MPG_BIND_NONE)
    mpg__log(1, "bind: local rank %d -> GPU %d (%s), NUMA %d, CPUs %s%s",
             r.local_rank, r.gpu, r.gpu >= 0 ? r.gpu_bus_id : "none",
             r.numa_node, r.cpuset,
             r.applied ? (thread ? " (thread bound)" : " (process bound)")
                       : " (planned)");
  return MPG_OK;
}

mpg_status mpg_topo_bind(const mpg_topo *topo, int local_rank, int local_world,
                         int gpu, mpg_bind mode, mpg_bind_apply apply,
                         mpg_binding *report) {
  if (apply != MPG_BIND_APPLY_NONE && apply != MPG_BIND_APPLY_PROCESS &&
      apply != MPG_BIND_APPLY_THREAD)
    return mpg__fail(MPG_ERR_INVALID, "mpg_topo_bind: apply is %d, expected "
                     "MPG_BIND_APPLY_NONE (0), _PROCESS (1) or _THREAD (2)", (int)apply);
  return bind_common(topo, local_rank, local_world, gpu, mode, report,
                     apply != MPG_BIND_APPLY_NONE, apply == MPG_BIND_APPLY_THREAD,
                     "mpg_topo_bind");
}

/* ------------------------------------------------------------------------ */
/* Host identity and node numbering                                          */
/* ------------------------------------------------------------------------ */

mpg_status mpg_topo_host_identity(char *buf, size_t cap) {
  if (!buf) return mpg__fail(MPG_ERR_INVALID, "mpg_topo_host_identity: buf is NULL");
  char host[256];
  if (gethostname(host, sizeof host) != 0)
    return mpg__fail(MPG_ERR_IO, "host identity: gethostname failed: %s",
                     strerror(errno));
  host[sizeof host - 1] = '\0';
  char boot[64] = "";
  FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
  if (f) {
    if (!fgets(boot, sizeof boot, f)) boot[0] = '\0';
    fclose(f);
    boot[strcspn(boot, "\r\n")] = '\0';
  }
  int n = boot[0] ? snprintf(buf, cap, "%s:%s", host, boot)
                  : snprintf(buf, cap, "%s", host);
  if (n < 0 || (size_t)n >= cap) {
    if (cap) buf[0] = '\0';
    return mpg__fail(MPG_ERR_RANGE,
                     "host identity: needs %d bytes, the buffer has %zu", n + 1,
                     cap);
  }
  return MPG_OK;
}

typedef struct id_item {
  const char *id;
  int rank;
} id_item;

static int id_cmp(const void *a, const void *b) {
  const id_item *x = a, *y = b;
  int c = strcmp(x->id, y->id);
  if (c) return c;
  return (x->rank > y->rank) - (x->rank < y->rank);
}

mpg_status mpg_topo_node_ids(int world_size, const char *const *host_ids,
                        int *node_of, int *local_rank, int *num_nodes) {
  if (!host_ids || !node_of)
    return mpg__fail(MPG_ERR_INVALID, "mpg_topo_node_ids: NULL argument");
  if (world_size < 1)
    return mpg__fail(MPG_ERR_RANGE, "mpg_topo_node_ids: world size %d is < 1",
                     world_size);
  for (int r = 0; r < world_size; r++)
    if (!host_ids[r])
      return mpg__fail(MPG_ERR_INVALID, "mpg_topo_node_ids: host id of rank %d is NULL",
                       r);
  id_item *it = malloc(sizeof *it * (size_t)world_size);
  int *first = malloc(sizeof(int) * (size_t)world_size);
  int *grp = malloc(sizeof(int) * (size_t)world_size);
  int *node_id = malloc(sizeof(int) * (size_t)world_size);
  if (!it || !first || !grp || !node_id) {
    free(it);
    free(first);
    free(grp);
    free(node_id);
    return mpg__fail(MPG_ERR_NOMEM, "mpg_topo_node_ids: out of memory");
  }
  for (int r = 0; r < world_size; r++) it[r] = (id_item){host_ids[r], r};
  qsort(it, (size_t)world_size, sizeof *it, id_cmp);
  /* Runs of equal ids: each run is one node; its first item is its lowest
   * rank.  grp[rank] = run number, first[run] = lowest rank. */
  int nruns = 0;
  for (int i = 0; i < world_size; i++) {
    if (i == 0 || strcmp(it[i].id, it[i - 1].id) != 0) first[nruns++] = it[i].rank;
    grp[it[i].rank] = nruns - 1;
    if (local_rank)
      local_rank[it[i].rank] =
          (i == 0 || strcmp(it[i].id, it[i - 1].id) != 0)
              ? 0
              : local_rank[it[i - 1].rank] + 1;
  }
  /* Number the runs by their lowest rank: walk ranks in order, a rank that
   * is its run's first gets the next node id. */
  int next = 0;
  for (int r = 0; r < world_size; r++)
    if (first[grp[r]] == r) node_id[grp[r]] = next++;
  for (int r = 0; r < world_size; r++) node_of[r] = node_id[grp[r]];
  if (num_nodes) *num_nodes = nruns;
  free(it);
  free(first);
  free(grp);
  free(node_id);
  return MPG_OK;
}
