/* meshpg topo: the GPUs of this machine (or of an hwloc XML / synthetic
 * topology) with their NUMA nodes, cpusets and nearest NICs, and the
 * binding each local rank would get. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd.h"

int cmd_topo(int argc, char **argv);

static const char topo_usage[] =
    "usage: meshpg topo [--xml FILE | --synthetic DESC] [--local-ranks N]\n"
    "                   [--bind none|numa|core]\n"
    "\n"
    "Show the GPUs with their NUMA nodes, cpusets and nearest NICs, every\n"
    "NIC, and the CPUs each local rank would be bound to (nothing is bound).\n"
    "\n"
    "  --xml FILE        read an hwloc XML topology (`lstopo FILE.xml`)\n"
    "                    instead of this machine\n"
    "  --synthetic DESC  an hwloc synthetic topology, e.g.\n"
    "                    \"pack:2 numa:1 core:16 pu:2\" (it has no GPUs)\n"
    "  --local-ranks N   ranks on the node (default: one per GPU, or 1 on a\n"
    "                    node without GPUs); local rank i takes GPU i\n"
    "  --bind MODE       none | numa | core (default: numa)\n";

static int parse_bind(const char *v, mpg_bind *out) {
  if (strcmp(v, "none") == 0) *out = MPG_BIND_NONE;
  else if (strcmp(v, "numa") == 0) *out = MPG_BIND_NUMA;
  else if (strcmp(v, "core") == 0) *out = MPG_BIND_CORE;
  else return 0;
  return 1;
}

static const char *bind_name(mpg_bind b) {
  return b == MPG_BIND_CORE ? "core" : b == MPG_BIND_NUMA ? "numa" : "none";
}

static void print_gpus(const mpg_topo *t) {
  int n = mpg_topo_num_gpus(t);
  int any_nvlink = 0;
  for (int i = 0; i < n; i++) {
    mpg_gpu_info g = MPG_GPU_INFO_INIT;
    mpg_topo_get_gpu(t, i, &g);
    if (g.nvlink_peers) any_nvlink = 1;
  }
  printf("  %d GPU%s", n, n == 1 ? "" : "s");
  if (n > 1)
    printf(", NVLink: %s", mpg_topo_has_gpu_fabric(t) ? "all-to-all"
                           : any_nvlink               ? "partial"
                                                      : "none (PCIe only)");
  printf("\n");
  if (n == 0) return;
  printf("GPUs:\n  %-3s  %-12s  %-6s  %4s  %-16s  %5s  %4s  %s\n", "GPU", "bus id",
         "name", "NUMA", "cpuset", "cores", "PCIe", "NICs");
  for (int i = 0; i < n; i++) {
    mpg_gpu_info g = MPG_GPU_INFO_INIT;
    mpg_topo_get_gpu(t, i, &g);
    char numa[16];
    if (g.numa_node >= 0) snprintf(numa, sizeof numa, "%d", g.numa_node);
    else snprintf(numa, sizeof numa, "-");
    printf("  %-3d  %-12s  %-6s  %4s  %-16s  %5d  %4d  ", i, g.bus_id,
           g.name[0] ? g.name : "-", numa, g.cpuset, g.num_cores, g.pcie_group);
    if (g.num_nics == 0) printf("-");
    for (int k = 0; k < g.num_nics; k++) {
      mpg_nic_info nic = MPG_NIC_INFO_INIT;
      mpg_topo_get_gpu_nic(t, i, k, &nic);
      printf("%s%s", k ? ", " : "", nic.name);
      if (nic.netdev[0] && strcmp(nic.netdev, nic.name) != 0)
        printf(" (%s)", nic.netdev);
    }
    printf("\n");
  }
}

static void print_nics(const mpg_topo *t) {
  int n = mpg_topo_num_nics(t);
  if (n == 0) return;
  printf("NICs:\n  %-12s  %-10s  %-10s  %4s  %s\n", "bus id", "name", "netdev",
         "NUMA", "cpuset");
  for (int i = 0; i < n; i++) {
    mpg_nic_info nic = MPG_NIC_INFO_INIT;
    mpg_topo_get_nic(t, i, &nic);
    char numa[16];
    if (nic.numa_node >= 0) snprintf(numa, sizeof numa, "%d", nic.numa_node);
    else snprintf(numa, sizeof numa, "-");
    printf("  %-12s  %-10s  %-10s  %4s  %s\n", nic.bus_id, nic.name,
           nic.netdev[0] ? nic.netdev : "-", numa, nic.cpuset);
  }
}

int cmd_topo(int argc, char **argv) {
  const char *xml = NULL, *synthetic = NULL;
  int local_ranks = 0;
  mpg_bind bind = MPG_BIND_NUMA;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      fputs(topo_usage, stdout);
      return TOOL_EXIT_OK;
    }
    if (strcmp(a, "--xml") == 0 || strcmp(a, "--synthetic") == 0 ||
        strcmp(a, "--local-ranks") == 0 || strcmp(a, "--bind") == 0) {
      if (i + 1 >= argc) {
        tool_error("%s needs a value", a);
        tool_usage_hint(topo_usage);
        return TOOL_EXIT_USAGE;
      }
      const char *v = argv[++i];
      if (strcmp(a, "--xml") == 0) {
        xml = v;
      } else if (strcmp(a, "--synthetic") == 0) {
        synthetic = v;
      } else if (strcmp(a, "--local-ranks") == 0) {
        if (!tool_parse_int("--local-ranks", v, 1, &local_ranks))
          return TOOL_EXIT_USAGE;
      } else if (!parse_bind(v, &bind)) {
        tool_error("--bind: expected none, numa or core, found \"%s\"", v);
        return TOOL_EXIT_USAGE;
      }
    } else {
      tool_error("%s \"%s\"",
                 a[0] == '-' ? "unknown option" : "unexpected argument", a);
      tool_usage_hint(topo_usage);
      return TOOL_EXIT_USAGE;
    }
  }
  if (xml && synthetic) {
    tool_error("give either --xml or --synthetic, not both");
    return TOOL_EXIT_USAGE;
  }

  mpg_topo *t = NULL;
  mpg_status st = xml         ? mpg_topo_load_xml(xml, &t)
                  : synthetic ? mpg_topo_load_synthetic(synthetic, &t)
                              : mpg_topo_load_live(&t);
  if (st) return tool_fail(st, NULL);
  printf("topology: %s\n", mpg_topo_source(t));
  printf("  %d package%s, %d NUMA node%s, %d cores, %d PUs\n",
         mpg_topo_num_packages(t), mpg_topo_num_packages(t) == 1 ? "" : "s",
         mpg_topo_num_numa_nodes(t), mpg_topo_num_numa_nodes(t) == 1 ? "" : "s",
         mpg_topo_num_cores(t), mpg_topo_num_pus(t));
  print_gpus(t);
  print_nics(t);

  int ngpus = mpg_topo_num_gpus(t);
  int lw = local_ranks ? local_ranks : (ngpus ? ngpus : 1);
  /* Check every rank first, so an error comes before any binding line. */
  for (int r = 0; r < lw; r++) {
    mpg_binding b = MPG_BINDING_INIT;
    st = mpg_topo_bind(t, r, lw, -1, bind, MPG_BIND_APPLY_NONE, &b);
    if (st != MPG_OK) {
      fflush(stdout);
      tool_fail(st, NULL);
      mpg_topo_destroy(t);
      return TOOL_EXIT_FAIL;
    }
  }
  printf("binding (bind=%s, %d local rank%s%s):\n", bind_name(bind), lw,
         lw == 1 ? "" : "s", ngpus ? ", local rank i takes GPU i" : ", no GPU");
  for (int r = 0; r < lw; r++) {
    mpg_binding b = MPG_BINDING_INIT;
    mpg_topo_bind(t, r, lw, -1, bind, MPG_BIND_APPLY_NONE, &b);
    printf("  local rank %d -> ", r);
    if (b.gpu >= 0) printf("GPU %d (%s)", b.gpu, b.gpu_bus_id);
    else printf("no GPU");
    if (b.numa_node >= 0) printf(", NUMA %d", b.numa_node);
    if (bind == MPG_BIND_NONE)
      printf(", not bound\n");
    else
      printf(", CPUs %s (%d core%s, %d PU%s)\n", b.cpuset, b.num_cores,
             b.num_cores == 1 ? "" : "s", b.num_pus, b.num_pus == 1 ? "" : "s");
  }
  mpg_topo_destroy(t);
  return TOOL_EXIT_OK;
}
