/* Internal view of a loaded topology, shared by topo.c, bind.c and
 * placement.c. */
#ifndef MPG_TOPO_INTERNAL_H
#define MPG_TOPO_INTERNAL_H

#include "internal.h"

#include <hwloc.h>

/* A NIC: one PCI device with network and/or OpenFabrics OS devices. */
typedef struct mpg__nic {
  hwloc_obj_t pci;
  char bus_id[MPG_BUS_ID_MAX];
  const char *name;   /* OpenFabrics name, else netdev (hwloc's strings) */
  const char *netdev; /* network interface name or "" */
  int numa;
  char *cpuset_str;   /* owned */
} mpg__nic;

typedef struct mpg__gpu {
  hwloc_obj_t pci;
  hwloc_obj_t locality;   /* first non-I/O ancestor */
  const char *name;       /* OS device name (hwloc's string) or "" */
  int os_index;           /* N of cudaN / nvmlN, or -1 */
  char bus_id[MPG_BUS_ID_MAX];
  unsigned vendor, device;
  int numa;               /* NUMA OS index or -1 */
  hwloc_bitmap_t cpuset;  /* locality cpuset (owned) */
  char *cpuset_str;       /* owned */
  int num_cores;
  int host_bridge;        /* logical index of its host bridge, or -1 */
  int pcie_group;
  int nnics;
  mpg_nic_info *nics;     /* owned array; strings point into the NIC table */
  int nvlink_peers;
} mpg__gpu;

struct mpg_topo {
  hwloc_topology_t t;
  int this_system;
  char source[MPG_PATH_MAX + 64];
  int ngpus;
  mpg__gpu *gpus;
  int nnics;
  mpg__nic *nics;
  int fabric;
};

/* Sort key helpers for placement: GPUs in locality order (NUMA node, host
 * bridge, PCIe group, index).  order[] gets a permutation of 0..n-1 for
 * the first n GPUs (n <= ngpus). */
void mpg__topo_locality_order(const mpg_topo *topo, int n, int *order);

/* Objects of `type` inside `set`; 0 (not hwloc's -1) when the type sits
 * at several depths, as in a topology whose cores are not all at one level,
 * so such cores are simply not counted. */
int mpg__topo_count_inside(hwloc_topology_t t, hwloc_const_cpuset_t set,
                           hwloc_obj_type_t type);

/* xml_check.c: the line of the first <object> of an XML text (size chars)
 * that hwloc 2.9 would crash on instead of failing (a cpuset without its
 * complete_cpuset, a set that is not a bitmap, ...), 0 if none; *why then
 * says which rule it breaks. */
int mpg__topo_xml_bad_sets(const char *text, size_t size, const char **why);

#endif
