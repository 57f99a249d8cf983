/* Topology discovery with hwloc: load (live, XML, synthetic), list the GPUs
 * with their locality and nearest NICs, detect an all-to-all NVLink fabric. */
#include "topo_internal.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

enum source_kind { SRC_LIVE, SRC_XML, SRC_SYNTHETIC };

/* ------------------------------------------------------------------------ */
/* Small helpers                                                             */
/* ------------------------------------------------------------------------ */

static void format_bus_id(char *buf, const struct hwloc_pcidev_attr_s *a) {
  snprintf(buf, MPG_BUS_ID_MAX, "%04x:%02x:%02x.%01x", (unsigned)a->domain,
           (unsigned)a->bus, (unsigned)a->dev, (unsigned)a->func);
}

static int is_host_bridge(hwloc_obj_t o) {
  return o && o->type == HWLOC_OBJ_BRIDGE &&
         o->attr->bridge.upstream_type == HWLOC_OBJ_BRIDGE_HOST;
}

/* Is `anc` an ancestor of (or equal to) `o`? */
static int has_ancestor(hwloc_obj_t o, hwloc_obj_t anc) {
  for (; o; o = o->parent)
    if (o == anc) return 1;
  return 0;
}

/* The name index of "cuda3" / "nvml3" (prefix given), or -1. */
static int name_index(const char *name, const char *prefix) {
  size_t n = strlen(prefix);
  if (!name || strncmp(name, prefix, n) != 0 || !name[n]) return -1;
  char *end;
  long v = strtol(name + n, &end, 10);
  if (*end || v < 0 || v > 1000000) return -1;
  return (int)v;
}

static int osdev_is_cuda(hwloc_obj_t o) {
  if (o->attr->osdev.type != HWLOC_OBJ_OSDEV_COPROC) return 0;
  if (o->subtype && strcmp(o->subtype, "CUDA") == 0) return 1;
  return name_index(o->name, "cuda") >= 0;
}

static int osdev_is_nvml(hwloc_obj_t o) {
  if (o->attr->osdev.type != HWLOC_OBJ_OSDEV_GPU) return 0;
  if (o->subtype && strcmp(o->subtype, "NVML") == 0) return 1;
  return name_index(o->name, "nvml") >= 0;
}

/* The PCI device an OS device hangs below, or NULL. */
static hwloc_obj_t pci_parent(hwloc_obj_t o) {
  for (hwloc_obj_t p = o->parent; p; p = p->parent) {
    if (p->type == HWLOC_OBJ_PCI_DEVICE) return p;
    if (!hwloc_obj_type_is_io(p->type)) return NULL;
  }
  return NULL;
}

/* ------------------------------------------------------------------------ */
/* Loading                                                                   */
/* ------------------------------------------------------------------------ */

static void topo_free(mpg_topo *tp) {
  if (!tp) return;
  for (int i = 0; i < tp->ngpus; i++) {
    hwloc_bitmap_free(tp->gpus[i].cpuset);
    free(tp->gpus[i].cpuset_str);
    free(tp->gpus[i].nics);
  }
  free(tp->gpus);
  for (int i = 0; i < tp->nnics; i++) free(tp->nics[i].cpuset_str);
  free(tp->nics);
  if (tp->t) hwloc_topology_destroy(tp->t);
  free(tp);
}

mpg_status mpg_topo_destroy(mpg_topo *topo) {
  topo_free(topo);
  return MPG_OK;
}

/* NUMA node (OS index) of an I/O object's locality, -1 if several. */
static int numa_of(hwloc_obj_t locality) {
  if (locality->nodeset && hwloc_bitmap_weight(locality->nodeset) == 1)
    return hwloc_bitmap_first(locality->nodeset);
  return -1;
}

static void nic_fill(mpg_nic_info *ni, const mpg__nic *n) {
  ni->name = n->name;
  ni->netdev = n->netdev;
  ni->bus_id = n->bus_id;
  ni->numa_node = n->numa;
  ni->cpuset = n->cpuset_str;
}

static mpg_status find_nics(mpg_topo *tp) {
  int cap = 0;
  hwloc_obj_t o = NULL;
  while ((o = hwloc_get_next_osdev(tp->t, o)) != NULL) {
    hwloc_obj_osdev_type_t ty = o->attr->osdev.type;
    if (ty != HWLOC_OBJ_OSDEV_NETWORK && ty != HWLOC_OBJ_OSDEV_OPENFABRICS)
      continue;
    hwloc_obj_t pci = pci_parent(o);
    if (!pci) continue; /* virtual interfaces: not near any GPU */
    mpg__nic *nic = NULL;
    for (int i = 0; i < tp->nnics; i++)
      if (tp->nics[i].pci == pci) nic = &tp->nics[i];
    if (!nic) {
      if (tp->nnics == cap) {
        cap = cap ? 2 * cap : 8;
        mpg__nic *n = realloc(tp->nics, sizeof *n * (size_t)cap);
        if (!n) return mpg__fail(MPG_ERR_NOMEM, "topology: out of memory");
        tp->nics = n;
      }
      nic = &tp->nics[tp->nnics++];
      memset(nic, 0, sizeof *nic);
      nic->pci = pci;
      format_bus_id(nic->bus_id, &pci->attr->pcidev);
      nic->name = "";
      nic->netdev = "";
      hwloc_obj_t loc = hwloc_get_non_io_ancestor_obj(tp->t, pci);
      nic->numa = numa_of(loc);
      if (hwloc_bitmap_list_asprintf(&nic->cpuset_str, loc->cpuset) < 0) {
        nic->cpuset_str = NULL;
        return mpg__fail(MPG_ERR_NOMEM, "topology: out of memory");
      }
    }
    const char *nm = o->name ? o->name : "";
    if (ty == HWLOC_OBJ_OSDEV_OPENFABRICS) {
      nic->name = nm;
    } else {
      if (!nic->netdev[0]) nic->netdev = nm;
      if (!nic->name[0]) nic->name = nm;
    }
  }
  return MPG_OK;
}

typedef struct cand {
  hwloc_obj_t pci;
  const char *name;
  int index; /* sort key */
} cand;

static int cand_cmp(const void *a, const void *b) {
  const cand *x = a, *y = b;
  return (x->index > y->index) - (x->index < y->index);
}

/* Add pci (if not yet listed) with the given name/index. */
static mpg_status cand_add(cand **list, int *n, int *cap, hwloc_obj_t pci,
                           const char *name, int index) {
  for (int i = 0; i < *n; i++)
    if ((*list)[i].pci == pci) {
      if (index < (*list)[i].index) {
        (*list)[i].index = index;
        (*list)[i].name = name;
      }
      return MPG_OK;
    }
  if (*n == *cap) {
    *cap = *cap ? 2 * *cap : 8;
    cand *c = realloc(*list, sizeof *c * (size_t)*cap);
    if (!c) return mpg__fail(MPG_ERR_NOMEM, "topology: out of memory");
    *list = c;
  }
  (*list)[(*n)++] = (cand){pci, name, index};
  return MPG_OK;
}

/* The UUID hwloc's NVML plugin recorded for a GPU (the NVIDIAUUID info of
 * an OS device below its PCI device, "GPU-xxxxxxxx-..."), or NULL: bare
 * PCI devices carry none. */
static const char *gpu_uuid(hwloc_obj_t pci) {
  for (hwloc_obj_t o = pci->io_first_child; o; o = o->next_sibling) {
    if (o->type != HWLOC_OBJ_OS_DEVICE) continue;
    const char *u = hwloc_obj_get_info_by_name(o, "NVIDIAUUID");
    if (u && *u) return u;
  }
  return NULL;
}

/* Whether UUID u ("GPU-..." or bare) starts with the n hex chars at p
 * (given without "GPU-"), ignoring case as CUDA does. */
static int uuid_has_prefix(const char *u, const char *p, size_t n) {
  if (strncasecmp(u, "GPU-", 4) == 0) u += 4;
  return strlen(u) >= n && strncasecmp(u, p, n) == 0;
}

static int is_uuid_text(const char *p, size_t n) {
  if (n == 0) return 0;
  for (size_t i = 0; i < n; i++)
    if (!isxdigit((unsigned char)p[i]) && p[i] != '-') return 0;
  return 1;
}

/* The UUID text (no "GPU-") of a GPU-<uuid> or MIG-GPU-<uuid>/<gi>/<ci> entry, or why none. */
static mpg_status entry_uuid(const char *env, int entry, const char *item, const char **uuid,
                             size_t *uuid_len) {
  *uuid = NULL;
  *uuid_len = 0;
  if (strncasecmp(item, "GPU-", 4) == 0) {
    *uuid = item + 4;
    *uuid_len = strlen(*uuid);
  } else if (strncasecmp(item, "MIG-GPU-", 8) == 0 && strchr(item, '/')) {
    *uuid = item + 8;
    *uuid_len = (size_t)(strchr(item, '/') - *uuid);
  } else if (strncasecmp(item, "MIG-", 4) == 0) {
    return mpg__fail(MPG_ERR_TOPO,
                     "CUDA_VISIBLE_DEVICES=\"%s\": entry %d \"%s\" is a MIG "
                     "instance UUID, which cannot be mapped to its GPU (hwloc lists "
                     "no MIG instances); name the GPU (index or GPU-<uuid>) or use "
                     "MIG-GPU-<gpu uuid>/<gi>/<ci>",
                     env, entry, item);
  }
  if (!*uuid || !is_uuid_text(*uuid, *uuid_len))
    return mpg__fail(MPG_ERR_TOPO,
                     "CUDA_VISIBLE_DEVICES=\"%s\": entry %d \"%s\" is not a GPU "
                     "index, GPU-<uuid> or MIG-GPU-<uuid>/<gi>/<ci>",
                     env, entry, item);
  return MPG_OK;
}

/* The one GPU of list[0..total) whose UUID the UUID entry names, in *pick. */
static mpg_status pick_by_uuid(const cand *list, int total, const char *env, int entry,
                               const char *item, int *pick) {
  const char *uuid;
  size_t uuid_len;
  mpg_status st = entry_uuid(env, entry, item, &uuid, &uuid_len);
  if (st) return st;
  int with_uuid = 0, found = -1;
  for (int i = 0; i < total; i++) {
    const char *gpu_id = gpu_uuid(list[i].pci);
    if (!gpu_id) continue;
    with_uuid++;
    if (!uuid_has_prefix(gpu_id, uuid, uuid_len)) continue;
    if (found >= 0)
      return mpg__fail(MPG_ERR_TOPO,
                       "CUDA_VISIBLE_DEVICES=\"%s\": entry %d \"%s\" is ambiguous: "
                       "it matches GPU %d (%s) and GPU %d (%s)",
                       env, entry, item, found, gpu_uuid(list[found].pci), i, gpu_id);
    found = i;
  }
  if (!with_uuid)
    return mpg__fail(MPG_ERR_TOPO,
                     "CUDA_VISIBLE_DEVICES=\"%s\": entry %d \"%s\" names a GPU by "
                     "UUID, but these %d GPUs have no UUID (hwloc sees them as bare "
                     "PCI devices, without its NVML plugin): use GPU indexes",
                     env, entry, item, total);
  if (found < 0)
    return mpg__fail(MPG_ERR_TOPO,
                     "CUDA_VISIBLE_DEVICES=\"%s\": entry %d \"%s\" matches none of "
                     "the %d GPUs' UUIDs",
                     env, entry, item, total);
  *pick = found;
  return MPG_OK;
}

/* The GPU an index or UUID entry selects in *pick; -1 (an index out of range) ends the list. */
static mpg_status pick_entry(const cand *list, int total, const char *env, int entry,
                             const char *item, int *pick) {
  char *end;
  long index = strtol(item, &end, 10);
  if (end == item || *end != '\0') return pick_by_uuid(list, total, env, entry, item, pick);
  if (index < 0 || index >= total) {
    mpg__log(1, "topology: CUDA_VISIBLE_DEVICES=\"%s\": entry %d (%ld) is not a "
             "GPU index 0..%d; like CUDA, the list ends there", env, entry, index,
             total - 1);
    *pick = -1;
    return MPG_OK;
  }
  *pick = (int)index;
  return MPG_OK;
}

/* CUDA_VISIBLE_DEVICES for GPUs not found through CUDA (CUDA OS devices
 * already honour it): keep and reorder the GPUs it lists.  Entries are
 * indexes, GPU UUIDs or unique UUID prefixes ("GPU-1a2b"), or MIG devices
 * in the form MIG-GPU-<gpu uuid>/<gi>/<ci>, which select the GPU the
 * instance lives on (its locality).  As in CUDA, an index outside
 * 0..count-1 ("-1") ends the list.  Errors (MPG_ERR_TOPO): a malformed
 * entry, a UUID when the GPUs carry none (bare PCI devices), a UUID that
 * matches no GPU or several, a GPU listed twice, a MIG-<uuid> entry (hwloc
 * lists no MIG instances, so it cannot be mapped to its GPU). */
static mpg_status apply_cuda_visible(cand *list, int *n) {
  const char *env = getenv("CUDA_VISIBLE_DEVICES");
  if (!env) return MPG_OK;
  cand keep[256];
  int from[256]; /* entry number that selected keep[i] */
  int nkeep = 0, total = *n, entry = 0;
  const char *cursor = env;
  while (*cursor == ' ') cursor++;
  while (*cursor && nkeep < 256) {
    const char *comma = strchr(cursor, ',');
    size_t len = comma ? (size_t)(comma - cursor) : strlen(cursor);
    while (len && cursor[len - 1] == ' ') len--;
    char item[128];
    if (len == 0 || len >= sizeof item)
      return mpg__fail(MPG_ERR_TOPO,
                       "CUDA_VISIBLE_DEVICES=\"%s\": entry %d is %s; expected a GPU "
                       "index, GPU-<uuid> or MIG-GPU-<uuid>/<gi>/<ci>",
                       env, entry, len ? "too long" : "empty");
    memcpy(item, cursor, len);
    item[len] = '\0';
    int pick;
    mpg_status st = pick_entry(list, total, env, entry, item, &pick);
    if (st) return st;
    if (pick < 0) break;
    for (int i = 0; i < nkeep; i++)
      if (keep[i].pci == list[pick].pci)
        return mpg__fail(MPG_ERR_TOPO,
                         "CUDA_VISIBLE_DEVICES=\"%s\": entry %d \"%s\" selects GPU %d "
                         "again (entry %d did)",
                         env, entry, item, pick, from[i]);
    from[nkeep] = entry;
    keep[nkeep++] = list[pick];
    entry++;
    if (!comma) break;
    cursor = comma + 1;
    while (*cursor == ' ') cursor++;
    if (!*cursor)
      return mpg__fail(MPG_ERR_TOPO,
                       "CUDA_VISIBLE_DEVICES=\"%s\": entry %d is empty; expected a GPU "
                       "index, GPU-<uuid> or MIG-GPU-<uuid>/<gi>/<ci>",
                       env, entry);
  }
  memcpy(list, keep, sizeof *keep * (size_t)nkeep);
  *n = nkeep;
  mpg__log(1, "topology: CUDA_VISIBLE_DEVICES=\"%s\" leaves %d of %d GPUs", env,
           nkeep, total);
  return MPG_OK;
}

static mpg_status find_gpus(mpg_topo *tp) {
  cand *cuda = NULL, *nvml = NULL, *pci = NULL;
  int ncuda = 0, ccuda = 0, nnvml = 0, cnvml = 0, npci = 0, cpci = 0;
  mpg_status st = MPG_OK;
  hwloc_obj_t o = NULL;
  while (!st && (o = hwloc_get_next_osdev(tp->t, o)) != NULL) {
    hwloc_obj_t p = pci_parent(o);
    if (!p) continue;
    if (osdev_is_cuda(o))
      st = cand_add(&cuda, &ncuda, &ccuda, p, o->name,
                    name_index(o->name, "cuda") >= 0
                        ? name_index(o->name, "cuda")
                        : 1000000 + ncuda);
    else if (osdev_is_nvml(o))
      st = cand_add(&nvml, &nnvml, &cnvml, p, o->name,
                    name_index(o->name, "nvml") >= 0
                        ? name_index(o->name, "nvml")
                        : 1000000 + nnvml);
  }
  o = NULL;
  while (!st && (o = hwloc_get_next_pcidev(tp->t, o)) != NULL) {
    const struct hwloc_pcidev_attr_s *a = &o->attr->pcidev;
    if (a->vendor_id == 0x10de && (a->class_id >> 8) == 0x03)
      st = cand_add(&pci, &npci, &cpci, o, "", npci);
  }
  cand *list = NULL;
  int n = 0;
  const char *how = "PCI devices (vendor 0x10de, display class)";
  if (!st) {
    if (ncuda) {
      list = cuda, n = ncuda, how = "CUDA OS devices";
    } else if (nnvml) {
      list = nvml, n = nnvml, how = "NVML OS devices";
    } else {
      list = pci, n = npci;
    }
    /* qsort's base must not be NULL, even for zero items (C11 7.22.5). */
    if (n > 0) qsort(list, (size_t)n, sizeof *list, cand_cmp);
    if (!ncuda && tp->this_system) st = apply_cuda_visible(list, &n);
  }
  if (!st && n) {
    tp->gpus = calloc((size_t)n, sizeof *tp->gpus);
    if (!tp->gpus) st = mpg__fail(MPG_ERR_NOMEM, "topology: out of memory");
  }
  for (int i = 0; !st && i < n; i++) {
    mpg__gpu *g = &tp->gpus[tp->ngpus++];
    g->pci = list[i].pci;
    g->name = list[i].name ? list[i].name : "";
    g->os_index = list == pci ? -1 : list[i].index;
    const struct hwloc_pcidev_attr_s *a = &g->pci->attr->pcidev;
    format_bus_id(g->bus_id, a);
    g->vendor = a->vendor_id;
    g->device = a->device_id;
    g->locality = hwloc_get_non_io_ancestor_obj(tp->t, g->pci);
    g->cpuset = hwloc_bitmap_dup(g->locality->cpuset);
    if (!g->cpuset || hwloc_bitmap_list_asprintf(&g->cpuset_str, g->cpuset) < 0) {
      st = mpg__fail(MPG_ERR_NOMEM, "topology: out of memory");
      break;
    }
    g->numa = numa_of(g->locality);
    g->num_cores =
        mpg__topo_count_inside(tp->t, g->cpuset, HWLOC_OBJ_CORE);
  }
  if (!st)
    mpg__log(2, "topology %s: %d GPUs found through %s", tp->source, tp->ngpus,
             how);
  free(cuda);
  free(nvml);
  free(pci);
  return st;
}

/* PCIe grouping: the top-most bridge below the host bridge (a root port or a
 * switch's upstream port), else the host bridge itself. */
static void find_pcie_groups(mpg_topo *tp) {
  hwloc_obj_t keys[512];
  int nkeys = 0;
  for (int i = 0; i < tp->ngpus; i++) {
    mpg__gpu *g = &tp->gpus[i];
    hwloc_obj_t top = NULL, hb = NULL;
    for (hwloc_obj_t p = g->pci->parent; p && p->type == HWLOC_OBJ_BRIDGE;
         p = p->parent) {
      if (is_host_bridge(p)) {
        hb = p;
        break;
      }
      top = p;
    }
    g->host_bridge = hb ? (int)hb->logical_index : -1;
    hwloc_obj_t key = top ? top : (hb ? hb : g->pci);
    int k = 0;
    while (k < nkeys && keys[k] != key) k++;
    if (k == nkeys && nkeys < 512) keys[nkeys++] = key;
    g->pcie_group = k;
  }
}

/* Nearest NICs: climb the bridges above the GPU, stop at the first that has
 * NICs below it, never above the host bridge. */
static mpg_status find_near_nics(mpg_topo *tp) {
  for (int i = 0; i < tp->ngpus; i++) {
    mpg__gpu *g = &tp->gpus[i];
    for (hwloc_obj_t p = g->pci->parent; p && p->type == HWLOC_OBJ_BRIDGE;
         p = p->parent) {
      int n = 0;
      for (int k = 0; k < tp->nnics; k++)
        if (has_ancestor(tp->nics[k].pci, p)) n++;
      if (n) {
        g->nics = calloc((size_t)n, sizeof *g->nics);
        if (!g->nics) return mpg__fail(MPG_ERR_NOMEM, "topology: out of memory");
        for (int k = 0; k < tp->nnics; k++)
          if (has_ancestor(tp->nics[k].pci, p)) {
            nic_fill(&g->nics[g->nnics++], &tp->nics[k]);
          }
        break;
      }
      if (is_host_bridge(p)) break;
    }
  }
  return MPG_OK;
}

static int gpu_of_obj(const mpg_topo *tp, hwloc_obj_t o) {
  hwloc_obj_t pci = o->type == HWLOC_OBJ_PCI_DEVICE ? o
                    : o->type == HWLOC_OBJ_OS_DEVICE ? pci_parent(o)
                                                     : NULL;
  if (!pci) return -1;
  for (int i = 0; i < tp->ngpus; i++)
    if (tp->gpus[i].pci == pci) return i;
  return -1;
}

/* NVLink: GPUs i and j are linked when the NVLinkBandwidth matrix has a
 * non-zero value between them, or both reach one I/O hub (an NVSwitch). */
static void find_fabric(mpg_topo *tp) {
  tp->fabric = 0;
  if (tp->ngpus < 1) return;
  unsigned nr = 1;
  struct hwloc_distances_s *d = NULL;
  if (hwloc_distances_get_by_name(tp->t, "NVLinkBandwidth", &nr, &d, 0) != 0 ||
      nr == 0 || !d)
    return;
  int n = tp->ngpus;
  unsigned m = d->nbobjs;
  int *gi = malloc(sizeof(int) * m);
  unsigned char *link = calloc((size_t)n * (size_t)n, 1);
  if (!gi || !link) goto out;
  for (unsigned a = 0; a < m; a++) gi[a] = gpu_of_obj(tp, d->objs[a]);
  for (unsigned a = 0; a < m; a++)
    for (unsigned b = 0; b < m; b++) {
      if (a == b || gi[a] < 0 || gi[b] < 0 || gi[a] == gi[b]) continue;
      if (d->values[a * m + b] || d->values[b * m + a])
        link[gi[a] * n + gi[b]] = link[gi[b] * n + gi[a]] = 1;
    }
  for (unsigned h = 0; h < m; h++) {
    if (gi[h] >= 0 || !hwloc_obj_type_is_io(d->objs[h]->type)) continue;
    for (unsigned a = 0; a < m; a++) {
      if (gi[a] < 0 || !(d->values[a * m + h] || d->values[h * m + a])) continue;
      for (unsigned b = 0; b < m; b++) {
        if (gi[b] < 0 || gi[b] == gi[a]) continue;
        if (d->values[b * m + h] || d->values[h * m + b])
          link[gi[a] * n + gi[b]] = 1;
      }
    }
  }
  int all = n >= 2;
  for (int i = 0; i < n; i++) {
    int peers = 0;
    for (int j = 0; j < n; j++)
      if (j != i && link[i * n + j]) peers++;
    tp->gpus[i].nvlink_peers = peers;
    if (peers != n - 1) all = 0;
  }
  tp->fabric = all;
out:
  free(gi);
  free(link);
  hwloc_distances_release(tp->t, d);
}

static mpg_status topo_open(enum source_kind kind, const char *arg,
                            mpg_topo **out) {
  mpg_topo *tp = calloc(1, sizeof *tp);
  if (!tp) return mpg__fail(MPG_ERR_NOMEM, "topology: out of memory");
  if (hwloc_topology_init(&tp->t) != 0) {
    tp->t = NULL;
    topo_free(tp);
    return mpg__fail(MPG_ERR_TOPO, "topology: hwloc_topology_init failed: %s",
                     strerror(errno));
  }
  /* Keep GPUs, NICs and the bridges between them; drop the rest. */
  hwloc_topology_set_io_types_filter(tp->t, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
  int rc = 0;
  switch (kind) {
  case SRC_LIVE: {
    char host[256] = "";
    if (gethostname(host, sizeof host - 1) != 0) strcpy(host, "?");
    snprintf(tp->source, sizeof tp->source, "this machine (%s)", host);
    break;
  }
  case SRC_XML:
    snprintf(tp->source, sizeof tp->source, "%s", arg);
    rc = hwloc_topology_set_xml(tp->t, arg);
    break;
  case SRC_SYNTHETIC:
    snprintf(tp->source, sizeof tp->source, "synthetic \"%s\"", arg);
    rc = hwloc_topology_set_synthetic(tp->t, arg);
    if (rc != 0) {
      topo_free(tp);
      return mpg__fail(MPG_ERR_TOPO,
                       "topology: hwloc rejects the synthetic description "
                       "\"%s\" (expected levels like \"pack:2 numa:1 core:8 "
                       "pu:2\")",
                       arg);
    }
    break;
  }
  if (rc == 0) rc = hwloc_topology_load(tp->t);
  if (rc != 0) {
    int e = errno;
    char src[sizeof tp->source];
    memcpy(src, tp->source, sizeof src);
    topo_free(tp);
    if (kind == SRC_XML)
      return mpg__fail(MPG_ERR_TOPO,
                       "topology XML \"%s\": hwloc cannot load it (%s): not a "
                       "well-formed hwloc topology as written by `lstopo "
                       "FILE.xml` (HWLOC_XML_VERBOSE=1 shows hwloc's reason)",
                       src, strerror(e));
    return mpg__fail(MPG_ERR_TOPO, "topology %s: hwloc_topology_load failed: %s",
                     src, strerror(e));
  }
  tp->this_system = hwloc_topology_is_thissystem(tp->t);
  if (kind != SRC_LIVE) tp->this_system = 0;
  mpg_status st = find_nics(tp);
  if (!st) st = find_gpus(tp);
  if (!st) st = find_near_nics(tp);
  if (st) {
    topo_free(tp);
    return st;
  }
  find_pcie_groups(tp);
  find_fabric(tp);
  mpg__log(1,
           "topology %s: %d packages, %d NUMA nodes, %d cores, %d PUs, %d GPUs%s",
           tp->source, mpg_topo_num_packages(tp), mpg_topo_num_numa_nodes(tp),
           mpg_topo_num_cores(tp), mpg_topo_num_pus(tp), tp->ngpus,
           tp->fabric ? " (all-to-all NVLink)" : "");
  *out = tp;
  return MPG_OK;
}

mpg_status mpg_topo_load_live(mpg_topo **out) {
  if (!out) return mpg__fail(MPG_ERR_INVALID, "mpg_topo_load_live: out is NULL");
  *out = NULL;
  return topo_open(SRC_LIVE, NULL, out);
}

/* Does the tag text[0..n) have the attribute `name` (name, spaces, '=')? */
mpg_status mpg_topo_load_xml(const char *path, mpg_topo **out) {
  if (!out) return mpg__fail(MPG_ERR_INVALID, "mpg_topo_load_xml: out is NULL");
  *out = NULL;
  if (!path) return mpg__fail(MPG_ERR_INVALID, "mpg_topo_load_xml: path is NULL");
  /* hwloc reports a missing file only as a failed load; say it plainly. */
  FILE *f = fopen(path, "r");
  if (!f)
    return mpg__fail(MPG_ERR_IO, "topology XML \"%s\": cannot open: %s", path,
                     strerror(errno));
  errno = 0;
  char *text = NULL;
  size_t len = 0, cap = 0;
  for (size_t got = 1; got > 0; len += got) {
    if (cap - len < 4096) {
      char *t = realloc(text, cap = cap * 2 + 8192);
      if (!t) {
        free(text);
        fclose(f);
        return mpg__fail(MPG_ERR_NOMEM, "topology XML \"%s\": out of memory", path);
      }
      text = t;
    }
    got = fread(text + len, 1, cap - len - 1, f);
  }
  int e = ferror(f) ? errno : 0;
  fclose(f);
  text[len] = '\0';
  const char *why = "";
  int bad_line = len ? mpg__topo_xml_bad_sets(text, len, &why) : 0;
  free(text);
  if (e)
    return mpg__fail(MPG_ERR_IO, "topology XML \"%s\": cannot read: %s", path,
                     strerror(e));
  if (len == 0)
    return mpg__fail(MPG_ERR_TOPO, "topology XML \"%s\": the file is empty",
                     path);
  if (bad_line)
    return mpg__fail(MPG_ERR_TOPO, "topology XML \"%s\": line %d: %s, which hwloc cannot load",
                     path, bad_line, why);
  return topo_open(SRC_XML, path, out);
}

mpg_status mpg_topo_load_synthetic(const char *description, mpg_topo **out) {
  if (!out)
    return mpg__fail(MPG_ERR_INVALID, "mpg_topo_load_synthetic: out is NULL");
  *out = NULL;
  if (!description)
    return mpg__fail(MPG_ERR_INVALID,
                     "mpg_topo_load_synthetic: description is NULL");
  return topo_open(SRC_SYNTHETIC, description, out);
}

/* ------------------------------------------------------------------------ */
/* Queries                                                                   */
/* ------------------------------------------------------------------------ */

const char *mpg_topo_source(const mpg_topo *topo) {
  return topo ? topo->source : "";
}

int mpg_topo_is_this_system(const mpg_topo *topo) {
  return topo ? topo->this_system : 0;
}

int mpg__topo_count_inside(hwloc_topology_t t, hwloc_const_cpuset_t set,
                           hwloc_obj_type_t type) {
  int n = hwloc_get_nbobjs_inside_cpuset_by_type(t, set, type);
  return n < 0 ? 0 : n;
}

static int count_type(const mpg_topo *topo, hwloc_obj_type_t type) {
  if (!topo) return 0;
  int n = hwloc_get_nbobjs_by_type(topo->t, type);
  return n < 0 ? 0 : n;
}

int mpg_topo_num_gpus(const mpg_topo *topo) { return topo ? topo->ngpus : 0; }
int mpg_topo_num_numa_nodes(const mpg_topo *topo) {
  return count_type(topo, HWLOC_OBJ_NUMANODE);
}
int mpg_topo_num_packages(const mpg_topo *topo) {
  return count_type(topo, HWLOC_OBJ_PACKAGE);
}
int mpg_topo_num_cores(const mpg_topo *topo) {
  return count_type(topo, HWLOC_OBJ_CORE);
}
int mpg_topo_num_pus(const mpg_topo *topo) { return count_type(topo, HWLOC_OBJ_PU); }
int mpg_topo_has_gpu_fabric(const mpg_topo *topo) {
  return topo ? topo->fabric : 0;
}

/* GPU `gpu` of the topology, or an MPG_ERR_RANGE naming the count. */
static mpg_status check_gpu(const mpg_topo *topo, int gpu) {
  if (gpu < 0 || gpu >= topo->ngpus) {
    if (topo->ngpus == 0)
      return mpg__fail(MPG_ERR_RANGE, "GPU %d: topology %s has no GPU", gpu,
                       topo->source);
    return mpg__fail(MPG_ERR_RANGE,
                     "GPU %d is outside 0..%d (topology %s has %d GPUs)", gpu,
                     topo->ngpus - 1, topo->source, topo->ngpus);
  }
  return MPG_OK;
}

mpg_status mpg_topo_get_gpu(const mpg_topo *topo, int gpu, mpg_gpu_info *out) {
  if (!topo) return mpg__fail(MPG_ERR_INVALID, "mpg_topo_get_gpu: topo is NULL");
  mpg_status st = mpg__abi_check(out, MPG_GPU_INFO_MAGIC, "mpg_topo_get_gpu: out",
                                 "MPG_GPU_INFO_INIT");
  if (st || (st = check_gpu(topo, gpu))) return st;
  const mpg__gpu *g = &topo->gpus[gpu];
  mpg_gpu_info info = MPG_GPU_INFO_INIT;
  info.index = gpu;
  info.name = g->name;
  info.bus_id = g->bus_id;
  info.vendor_id = g->vendor;
  info.device_id = g->device;
  info.numa_node = g->numa;
  info.cpuset = g->cpuset_str;
  info.num_cores = g->num_cores;
  info.pcie_group = g->pcie_group;
  info.num_nics = g->nnics;
  info.nvlink_peers = g->nvlink_peers;
  mpg__abi_out(out, &info, MPG__ABI_END(mpg_gpu_info));
  return MPG_OK;
}

mpg_status mpg_topo_get_gpu_nic(const mpg_topo *topo, int gpu, int k,
                                mpg_nic_info *out) {
  if (!topo) return mpg__fail(MPG_ERR_INVALID, "mpg_topo_get_gpu_nic: topo is NULL");
  mpg_status st = mpg__abi_check(out, MPG_NIC_INFO_MAGIC, "mpg_topo_get_gpu_nic: out",
                                 "MPG_NIC_INFO_INIT");
  if (st || (st = check_gpu(topo, gpu))) return st;
  const mpg__gpu *g = &topo->gpus[gpu];
  if (k < 0 || k >= g->nnics)
    return mpg__fail(MPG_ERR_RANGE, "GPU %d: NIC %d is outside 0..%d (it has %d near NICs)",
                     gpu, k, g->nnics - 1, g->nnics);
  mpg__abi_out(out, &g->nics[k], MPG__ABI_END(mpg_nic_info));
  return MPG_OK;
}

int mpg_topo_num_nics(const mpg_topo *topo) { return topo ? topo->nnics : 0; }

mpg_status mpg_topo_get_nic(const mpg_topo *topo, int nic, mpg_nic_info *out) {
  if (!topo) return mpg__fail(MPG_ERR_INVALID, "mpg_topo_get_nic: topo is NULL");
  mpg_status st = mpg__abi_check(out, MPG_NIC_INFO_MAGIC, "mpg_topo_get_nic: out",
                                 "MPG_NIC_INFO_INIT");
  if (st) return st;
  if (nic < 0 || nic >= topo->nnics)
    return mpg__fail(MPG_ERR_RANGE, "NIC %d is outside 0..%d (topology %s has %d NICs)",
                     nic, topo->nnics - 1, topo->source, topo->nnics);
  mpg_nic_info info = MPG_NIC_INFO_INIT;
  nic_fill(&info, &topo->nics[nic]);
  mpg__abi_out(out, &info, MPG__ABI_END(mpg_nic_info));
  return MPG_OK;
}

typedef struct order_item {
  int numa, hb, group, index;
} order_item;

static int order_cmp(const void *a, const void *b) {
  const order_item *x = a, *y = b;
  if (x->numa != y->numa) return x->numa < y->numa ? -1 : 1;
  if (x->hb != y->hb) return x->hb < y->hb ? -1 : 1;
  if (x->group != y->group) return x->group < y->group ? -1 : 1;
  return (x->index > y->index) - (x->index < y->index);
}

void mpg__topo_locality_order(const mpg_topo *topo, int n, int *order) {
  order_item it[1024];
  if (!topo || n > topo->ngpus || n > 1024) {
    for (int i = 0; i < n; i++) order[i] = i;
    return;
  }
  for (int i = 0; i < n; i++) {
    const mpg__gpu *g = &topo->gpus[i];
    it[i] = (order_item){g->numa < 0 ? 1 << 30 : g->numa, g->host_bridge,
                         g->pcie_group, i};
  }
  qsort(it, (size_t)n, sizeof *it, order_cmp);
  for (int i = 0; i < n; i++) order[i] = it[i].index;
}
