/* Topology discovery on the hand-written XML fixtures and on synthetic
 * topologies: GPU count, NUMA affinity, cpusets, NICs, NVLink fabric; the
 * binding each local rank would get; and the errors for bad inputs. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "meshpg.h"

static char path_buf[1024];

static const char *fixture(const char *name) {
  const char *data = getenv("MESHPG_TEST_DATA");
  cr_assert_not_null(data, "MESHPG_TEST_DATA is not set (run through meson test)");
  snprintf(path_buf, sizeof path_buf, "%s/topologies/%s", data, name);
  return path_buf;
}

static mpg_topo *load(const char *name) {
  mpg_topo *t = NULL;
  mpg_status st = mpg_topo_load_xml(fixture(name), &t);
  cr_assert_eq(st, MPG_OK, "%s: %s", name, mpg_last_error());
  cr_assert_not_null(t);
  return t;
}

static mpg_gpu_info gpu(const mpg_topo *t, int i) {
  mpg_gpu_info g = MPG_GPU_INFO_INIT;
  cr_assert_eq(mpg_topo_get_gpu(t, i, &g), MPG_OK, "%s", mpg_last_error());
  return g;
}

/* The k-th nearest NIC of GPU i. */
static mpg_nic_info gnic(const mpg_topo *t, int i, int k) {
  mpg_nic_info n = MPG_NIC_INFO_INIT;
  cr_assert_eq(mpg_topo_get_gpu_nic(t, i, k, &n), MPG_OK, "%s", mpg_last_error());
  return n;
}

/* Parse a PU list "0-3,8" into a 64-bit mask (PUs < 64 in the fixtures). */
static unsigned long long mask_of(const char *list) {
  unsigned long long m = 0;
  const char *p = list;
  while (*p) {
    char *end;
    long a = strtol(p, &end, 10), b = a;
    if (*end == '-') b = strtol(end + 1, &end, 10);
    for (long i = a; i <= b; i++) m |= 1ull << i;
    p = *end == ',' ? end + 1 : end;
    if (end == p && *p) break;
  }
  return m;
}

/* What the topology counts, in the order gpus, packages, NUMA nodes, cores,
 * PUs, GPU fabric (0/1); -1: not checked. */
static void expect_counts(const mpg_topo *t, const int want[6]) {
  const int got[6] = {mpg_topo_num_gpus(t),       mpg_topo_num_packages(t),
                      mpg_topo_num_numa_nodes(t), mpg_topo_num_cores(t),
                      mpg_topo_num_pus(t),        mpg_topo_has_gpu_fabric(t)};
  static const char *const what[6] = {"gpus", "packages", "numa_nodes",
                                      "cores", "pus", "gpu_fabric"};
  for (int i = 0; i < 6; i++)
    if (want[i] >= 0) cr_assert_eq(got[i], want[i], "%s: %d, want %d", what[i], got[i], want[i]);
}

/* NIC i of t is name (netdev) at bus_id, on numa_node with cpuset. */
static void expect_nic(const mpg_topo *t, int i, const char *name, const char *netdev,
                       const char *bus_id, int numa_node, const char *cpuset) {
  mpg_nic_info n = MPG_NIC_INFO_INIT;
  cr_assert_eq(mpg_topo_get_nic(t, i, &n), MPG_OK);
  cr_assert_str_eq(n.name, name);
  cr_assert_str_eq(n.netdev, netdev);
  cr_assert_str_eq(n.bus_id, bus_id);
  cr_assert_eq(n.numa_node, numa_node);
  cr_assert_str_eq(n.cpuset, cpuset);
}

/* mpg_topo_bind(t, local, nlocal, gpu, mode, apply, b) returns want, with
 * piece in the message when piece is not NULL. */
static void bind_is(const mpg_topo *t, int local, int nlocal, int gpu, mpg_bind mode,
                    mpg_bind_apply apply, mpg_binding *b, mpg_status want, const char *piece) {
  mpg_status st = mpg_topo_bind(t, local, nlocal, gpu, mode, apply, b);
  cr_assert_eq(st, want, "mpg_topo_bind(local %d of %d, gpu %d, mode %d): %s, want %s: %s",
               local, nlocal, gpu, (int)mode, mpg_status_name(st), mpg_status_name(want),
               mpg_last_error());
  if (piece) cr_assert(strstr(mpg_last_error(), piece), "%s", mpg_last_error());
}

/* In core mode (nothing applied), local rank `local` of nlocal gets cpuset. */
static void core_cpuset_is(const mpg_topo *t, int local, int nlocal, const char *cpuset) {
  mpg_binding b = MPG_BINDING_INIT;
  bind_is(t, local, nlocal, -1, MPG_BIND_CORE, MPG_BIND_APPLY_NONE, &b, MPG_OK, NULL);
  cr_assert_str_eq(b.cpuset, cpuset, "local rank %d of %d", local, nlocal);
}

/* ------------------------------------------------------------------------ */
/* DGX-H100-like node                                                        */
/* ------------------------------------------------------------------------ */

Test(dgx, counts_and_fabric) {
  mpg_topo *t = load("dgx-h100.xml");
  expect_counts(t, (const int[6]){8, 2, 2, 16, 32, 1});
  cr_assert_eq(mpg_topo_is_this_system(t), 0);
  cr_assert(strstr(mpg_topo_source(t), "dgx-h100.xml"));
  mpg_topo_destroy(t);
}

Test(dgx, gpus_bus_ids_numa_cpusets) {
  static const char *bus[8] = {"0000:18:00.0", "0000:1a:00.0", "0000:38:00.0",
                               "0000:3a:00.0", "0000:98:00.0", "0000:9a:00.0",
                               "0000:b8:00.0", "0000:ba:00.0"};
  mpg_topo *t = load("dgx-h100.xml");
  for (int i = 0; i < 8; i++) {
    mpg_gpu_info g = gpu(t, i);
    char name[16];
    snprintf(name, sizeof name, "cuda%d", i);
    cr_assert_eq(g.index, i);
    cr_assert_str_eq(g.name, name);
    cr_assert_str_eq(g.bus_id, bus[i]);
    cr_assert_eq(g.vendor_id, 0x10de);
    cr_assert_eq(g.device_id, 0x2330);
    cr_assert_eq(g.numa_node, i < 4 ? 0 : 1, "GPU %d", i);
    cr_assert_str_eq(g.cpuset, i < 4 ? "0-7,16-23" : "8-15,24-31");
    cr_assert_eq(g.num_cores, 8);
    cr_assert_eq(g.pcie_group, i / 2, "GPU %d", i);
    cr_assert_eq(g.nvlink_peers, 7);
  }
  mpg_topo_destroy(t);
}

Test(dgx, nearest_nics_share_the_pcie_switch) {
  mpg_topo *t = load("dgx-h100.xml");
  for (int i = 0; i < 8; i++) {
    mpg_gpu_info g = gpu(t, i);
    cr_assert_eq(g.num_nics, 2, "GPU %d has %d NICs", i, g.num_nics);
    int sw = i / 2;
    char a[16], b[16];
    snprintf(a, sizeof a, "mlx5_%d", 2 * sw);
    snprintf(b, sizeof b, "mlx5_%d", 2 * sw + 1);
    cr_assert_str_eq(gnic(t, i, 0).name, a, "GPU %d", i);
    cr_assert_str_eq(gnic(t, i, 1).name, b, "GPU %d", i);
    cr_assert(strncmp(gnic(t, i, 0).netdev, "ibp", 3) == 0);
    /* The management NIC eno1 sits on another host bridge: never near. */
    for (int k = 0; k < g.num_nics; k++) cr_assert_str_neq(gnic(t, i, k).name, "eno1");
  }
  /* Every NIC of the node: eno1 and the 8 ConnectX-7, in PCI order. */
  cr_assert_eq(mpg_topo_num_nics(t), 9);
  mpg_nic_info n = MPG_NIC_INFO_INIT;
  cr_assert_eq(mpg_topo_get_nic(t, 0, &n), MPG_OK);
  cr_assert_str_eq(n.name, "eno1");
  cr_assert_eq(mpg_topo_get_nic(t, 8, &n), MPG_OK);
  cr_assert_str_eq(n.name, "mlx5_7");
  cr_assert_eq(n.numa_node, 1);
  cr_assert_str_eq(n.cpuset, "8-15,24-31");
  cr_assert_eq(gnic(t, 0, 0).numa_node, 0);
  cr_assert_str_eq(gnic(t, 0, 0).cpuset, "0-7,16-23");
  cr_assert_str_eq(gnic(t, 0, 0).bus_id, "0000:17:00.0");
  cr_assert_str_eq(gnic(t, 0, 0).netdev, "ibp23s0");
  cr_assert_str_eq(gnic(t, 0, 1).bus_id, "0000:19:00.0");
  mpg_topo_destroy(t);
}

Test(dgx, gpu_info_range_error) {
  mpg_topo *t = load("dgx-h100.xml");
  mpg_gpu_info g = MPG_GPU_INFO_INIT;
  cr_assert_eq(mpg_topo_get_gpu(t, 8, &g), MPG_ERR_RANGE);
  cr_assert(strstr(mpg_last_error(), "GPU 8 is outside 0..7"), "%s", mpg_last_error());
  cr_assert_eq(mpg_topo_get_gpu(t, -1, &g), MPG_ERR_RANGE);
  cr_assert_eq(mpg_topo_get_gpu(t, 0, NULL), MPG_ERR_INVALID);
  mpg_topo_destroy(t);
}

Test(dgx, bind_numa_each_rank_gets_its_gpus_numa_node) {
  mpg_topo *t = load("dgx-h100.xml");
  for (int r = 0; r < 8; r++) {
    mpg_binding b = MPG_BINDING_INIT;
    cr_assert_eq(mpg_topo_bind(t, r, 8, -1, MPG_BIND_NUMA, MPG_BIND_APPLY_NONE, &b), MPG_OK, "%s",
                 mpg_last_error());
    cr_assert_eq(b.gpu, r);
    cr_assert_eq(b.local_rank, r);
    cr_assert_eq(b.mode, MPG_BIND_NUMA);
    cr_assert_eq(b.numa_node, r < 4 ? 0 : 1);
    cr_assert_str_eq(b.cpuset, r < 4 ? "0-7,16-23" : "8-15,24-31");
    cr_assert_eq(b.num_cores, 8);
    cr_assert_eq(b.num_pus, 16);
    cr_assert_eq(b.applied, 0);
    gpu(t, r);
    cr_assert_str_eq(b.gpu_bus_id, gpu(t, r).bus_id);
  }
  mpg_topo_destroy(t);
}

Test(dgx, bind_core_gives_disjoint_cores_near_the_gpu) {
  mpg_topo *t = load("dgx-h100.xml");
  static const char *want[8] = {"0-1,16-17",   "2-3,18-19",   "4-5,20-21",
                                "6-7,22-23",   "8-9,24-25",   "10-11,26-27",
                                "12-13,28-29", "14-15,30-31"};
  unsigned long long seen = 0;
  for (int r = 0; r < 8; r++) {
    mpg_binding b = MPG_BINDING_INIT;
    cr_assert_eq(mpg_topo_bind(t, r, 8, -1, MPG_BIND_CORE, MPG_BIND_APPLY_NONE, &b), MPG_OK, "%s",
                 mpg_last_error());
    cr_assert_str_eq(b.cpuset, want[r], "rank %d: %s", r, b.cpuset);
    cr_assert_eq(b.num_cores, 2);
    unsigned long long m = mask_of(b.cpuset);
    cr_assert_eq(seen & m, 0, "rank %d overlaps", r);
    /* Inside the GPU's NUMA node. */
    cr_assert_eq(m & ~mask_of(r < 4 ? "0-7,16-23" : "8-15,24-31"), 0);
    seen |= m;
  }
  cr_assert_eq(seen, 0xffffffffull);
  mpg_topo_destroy(t);
}

Test(dgx, bind_core_fewer_ranks_get_more_cores) {
  mpg_topo *t = load("dgx-h100.xml");
  /* 2 ranks: GPUs 0 and 1, both on NUMA 0: 4 cores each. */
  mpg_binding a = MPG_BINDING_INIT, b = MPG_BINDING_INIT;
  bind_is(t, 0, 2, -1, MPG_BIND_CORE, MPG_BIND_APPLY_NONE, &a, MPG_OK, NULL);
  bind_is(t, 1, 2, -1, MPG_BIND_CORE, MPG_BIND_APPLY_NONE, &b, MPG_OK, NULL);
  cr_assert_str_eq(a.cpuset, "0-3,16-19");
  cr_assert_str_eq(b.cpuset, "4-7,20-23");
  /* 3 ranks on NUMA 0 (8 cores): 3 + 3 + 2. */
  int cores[3];
  for (int r = 0; r < 3; r++) {
    mpg_binding x = MPG_BINDING_INIT;
    bind_is(t, r, 3, -1, MPG_BIND_CORE, MPG_BIND_APPLY_NONE, &x, MPG_OK, NULL);
    cores[r] = x.num_cores;
  }
  cr_assert_eq(cores[0], 3);
  cr_assert_eq(cores[1], 3);
  cr_assert_eq(cores[2], 2);
  mpg_topo_destroy(t);
}

Test(dgx, bind_explicit_gpu) {
  mpg_topo *t = load("dgx-h100.xml");
  mpg_binding b = MPG_BINDING_INIT;
  /* Local rank 0 of 1 asks for GPU 5: NUMA 1; core mode splits NUMA 1
   * among its 4 GPUs, GPU 5 is the second. */
  bind_is(t, 0, 1, 5, MPG_BIND_NUMA, MPG_BIND_APPLY_NONE, &b, MPG_OK, NULL);
  cr_assert_eq(b.gpu, 5);
  cr_assert_str_eq(b.gpu_bus_id, "0000:9a:00.0");
  cr_assert_eq(b.numa_node, 1);
  cr_assert_str_eq(b.cpuset, "8-15,24-31");
  bind_is(t, 0, 1, 5, MPG_BIND_CORE, MPG_BIND_APPLY_NONE, &b, MPG_OK, NULL);
  cr_assert_str_eq(b.cpuset, "10-11,26-27");
  /* Explicit GPUs allow more ranks than GPUs. */
  bind_is(t, 9, 12, 3, MPG_BIND_NONE, MPG_BIND_APPLY_NONE, &b, MPG_OK, NULL);
  cr_assert_eq(b.gpu, 3);
  cr_assert_str_eq(b.cpuset, "");
  bind_is(t, 0, 1, 8, MPG_BIND_NUMA, MPG_BIND_APPLY_NONE, &b, MPG_ERR_RANGE, "GPU 8 is outside 0..7");
  mpg_topo_destroy(t);
}

Test(dgx, binding_an_xml_topology_is_refused) {
  mpg_topo *t = load("dgx-h100.xml");
  mpg_binding b = MPG_BINDING_INIT;
  bind_is(t, 0, 8, -1, MPG_BIND_NUMA, MPG_BIND_APPLY_PROCESS, &b, MPG_ERR_TOPO, "not this machine's");
  bind_is(t, 0, 8, -1, MPG_BIND_CORE, MPG_BIND_APPLY_THREAD, &b, MPG_ERR_TOPO, NULL);
  /* bind = none binds nothing, so it is fine anywhere. */
  bind_is(t, 0, 8, -1, MPG_BIND_NONE, MPG_BIND_APPLY_PROCESS, &b, MPG_OK, NULL);
  cr_assert_eq(b.applied, 0);
  mpg_topo_destroy(t);
}

/* ------------------------------------------------------------------------ */
/* 4-GPU PCIe workstation                                                    */
/* ------------------------------------------------------------------------ */

Test(workstation, gpus_found_as_pci_devices) {
  mpg_topo *t = load("workstation-4gpu.xml");
  cr_assert_eq(mpg_topo_num_gpus(t), 4, "the ASPEED BMC VGA must not count");
  expect_counts(t, (const int[6]){-1, 1, 2, 12, -1, 0});
  static const char *bus[4] = {"0000:01:00.0", "0000:02:00.0", "0000:41:00.0",
                               "0000:42:00.0"};
  for (int i = 0; i < 4; i++) {
    mpg_gpu_info g = gpu(t, i);
    cr_assert_str_eq(g.name, "");
    cr_assert_str_eq(g.bus_id, bus[i]);
    cr_assert_eq(g.device_id, 0x2684);
    cr_assert_eq(g.numa_node, i < 2 ? 0 : 1);
    cr_assert_str_eq(g.cpuset, i < 2 ? "0-5" : "6-11");
    cr_assert_eq(g.num_cores, 6);
    cr_assert_eq(g.nvlink_peers, 0);
  }
  /* Each GPU has its own root port: no two share a PCIe group. */
  for (int i = 0; i < 4; i++)
    for (int j = i + 1; j < 4; j++)
      cr_assert_neq(gpu(t, i).pcie_group, gpu(t, j).pcie_group);
  mpg_topo_destroy(t);
}

Test(workstation, nics_share_the_host_bridge_only) {
  mpg_topo *t = load("workstation-4gpu.xml");
  for (int i = 0; i < 2; i++) {
    mpg_gpu_info g = gpu(t, i);
    cr_assert_eq(g.num_nics, 1);
    cr_assert_str_eq(gnic(t, i, 0).name, "enp5s0");
    cr_assert_str_eq(gnic(t, i, 0).netdev, "enp5s0");
    cr_assert_str_eq(gnic(t, i, 0).bus_id, "0000:05:00.0");
  }
  for (int i = 2; i < 4; i++) cr_assert_eq(gpu(t, i).num_nics, 0);
  cr_assert_eq(mpg_topo_num_nics(t), 1);
  mpg_topo_destroy(t);
}

Test(workstation, bind_numa_and_core) {
  mpg_topo *t = load("workstation-4gpu.xml");
  static const char *core[4] = {"0-2", "3-5", "6-8", "9-11"};
  for (int r = 0; r < 4; r++) {
    mpg_binding b = MPG_BINDING_INIT;
    bind_is(t, r, 4, -1, MPG_BIND_NUMA, MPG_BIND_APPLY_NONE, &b, MPG_OK, NULL);
    cr_assert_str_eq(b.cpuset, r < 2 ? "0-5" : "6-11");
    cr_assert_eq(b.numa_node, r < 2 ? 0 : 1);
    bind_is(t, r, 4, -1, MPG_BIND_CORE, MPG_BIND_APPLY_NONE, &b, MPG_OK, NULL);
    cr_assert_str_eq(b.cpuset, core[r]);
    cr_assert_eq(b.num_cores, 3);
    cr_assert_eq(b.num_pus, 3);
  }
  mpg_topo_destroy(t);
}

Test(workstation, more_local_ranks_than_gpus_names_both_counts) {
  mpg_topo *t = load("workstation-4gpu.xml");
  mpg_binding b = MPG_BINDING_INIT;
  bind_is(t, 0, 5, -1, MPG_BIND_NUMA, MPG_BIND_APPLY_NONE, &b, MPG_ERR_TOPO, "5 local ranks");
  cr_assert(strstr(mpg_last_error(), "has 4 GPUs"), "%s", mpg_last_error());
  /* Also with bind = none: the GPU assignment itself is wrong. */
  bind_is(t, 4, 5, -1, MPG_BIND_NONE, MPG_BIND_APPLY_NONE, &b, MPG_ERR_TOPO, NULL);
  mpg_topo_destroy(t);
}

Test(interleaved, cuda_order_is_kept_and_numa_read_per_gpu) {
  mpg_topo *t = load("pcie-interleaved.xml");
  cr_assert_eq(mpg_topo_num_gpus(t), 4);
  static const char *bus[4] = {"0000:01:00.0", "0000:41:00.0", "0000:02:00.0",
                               "0000:42:00.0"};
  for (int i = 0; i < 4; i++) {
    mpg_gpu_info g = gpu(t, i);
    char name[8];
    snprintf(name, sizeof name, "cuda%d", i);
    cr_assert_str_eq(g.name, name);
    cr_assert_str_eq(g.bus_id, bus[i]);
    cr_assert_eq(g.numa_node, i % 2);
  }
  /* Core mode: GPUs 0 and 2 share NUMA 0 and split it. */
  core_cpuset_is(t, 2, 4, "3-5");
  core_cpuset_is(t, 1, 4, "6-8");
  mpg_topo_destroy(t);
}

/* ------------------------------------------------------------------------ */
/* CPU-only node                                                             */
/* ------------------------------------------------------------------------ */

Test(cpu_only, no_gpus_numa_and_cores) {
  mpg_topo *t = load("cpu-only.xml");
  expect_counts(t, (const int[6]){0, -1, 2, 8, 16, 0});
  mpg_gpu_info g = MPG_GPU_INFO_INIT;
  cr_assert_eq(mpg_topo_get_gpu(t, 0, &g), MPG_ERR_RANGE);
  cr_assert(strstr(mpg_last_error(), "has no GPU"), "%s", mpg_last_error());
  mpg_topo_destroy(t);
}

Test(cpu_only, nics_with_their_numa_nodes) {
  mpg_topo *t = load("cpu-only.xml");
  cr_assert_eq(mpg_topo_num_nics(t), 2);
  expect_nic(t, 0, "eno1", "eno1", "0000:01:00.0", 0, "0-3,8-11");
  expect_nic(t, 1, "mlx5_0", "ib0", "0000:81:00.0", 1, "4-7,12-15");
  mpg_nic_info n = MPG_NIC_INFO_INIT;
  cr_assert_eq(mpg_topo_get_nic(t, 2, &n), MPG_ERR_RANGE);
  cr_assert_eq(mpg_topo_get_nic(t, 0, NULL), MPG_ERR_INVALID);
  mpg_topo_destroy(t);
}

Test(cpu_only, cpu_ranks_spread_over_numa_nodes) {
  mpg_topo *t = load("cpu-only.xml");
  mpg_binding b = MPG_BINDING_INIT;
  for (int r = 0; r < 4; r++) {
    cr_assert_eq(mpg_topo_bind(t, r, 4, -1, MPG_BIND_NUMA, MPG_BIND_APPLY_NONE, &b), MPG_OK, "%s",
                 mpg_last_error());
    cr_assert_eq(b.gpu, -1);
    cr_assert_str_eq(b.gpu_bus_id, "");
    cr_assert_eq(b.numa_node, r / 2);
    cr_assert_str_eq(b.cpuset, r < 2 ? "0-3,8-11" : "4-7,12-15");
  }
  unsigned long long seen = 0;
  for (int r = 0; r < 8; r++) {
    bind_is(t, r, 8, -1, MPG_BIND_CORE, MPG_BIND_APPLY_NONE, &b, MPG_OK, NULL);
    cr_assert_eq(b.num_cores, 1);
    cr_assert_eq(b.num_pus, 2);
    cr_assert_eq(seen & mask_of(b.cpuset), 0);
    seen |= mask_of(b.cpuset);
  }
  cr_assert_eq(seen, 0xffffull);
  /* No GPU to name. */
  bind_is(t, 0, 1, 0, MPG_BIND_NUMA, MPG_BIND_APPLY_NONE, &b, MPG_ERR_RANGE, "has no GPU");
  mpg_topo_destroy(t);
}

Test(cpu_only, core_mode_runs_out_of_pus) {
  mpg_topo *t = load("cpu-only.xml");
  mpg_binding b = MPG_BINDING_INIT;
  /* 16 ranks: one PU each (fewer cores than ranks per NUMA node). */
  bind_is(t, 3, 16, -1, MPG_BIND_CORE, MPG_BIND_APPLY_NONE, &b, MPG_OK, NULL);
  cr_assert_eq(b.num_pus, 1);
  /* 18 ranks: 9 on each NUMA node of 8 PUs. */
  bind_is(t, 0, 18, -1, MPG_BIND_CORE, MPG_BIND_APPLY_NONE, &b, MPG_ERR_TOPO, "9 ranks share");
  cr_assert(strstr(mpg_last_error(), "only 8 PUs"), "%s", mpg_last_error());
  mpg_topo_destroy(t);
}

/* ------------------------------------------------------------------------ */
/* Synthetic topologies: large CPU layouts                                   */
/* ------------------------------------------------------------------------ */

Test(synthetic, large_cpu_layout_counts) {
  mpg_topo *t = NULL;
  cr_assert_eq(mpg_topo_load_synthetic("pack:4 numa:2 core:32 pu:2", &t), MPG_OK,
               "%s", mpg_last_error());
  expect_counts(t, (const int[6]){-1, 4, 8, 256, 512, -1});
  cr_assert_eq(mpg_topo_num_gpus(t), 0, "synthetic topologies have no I/O");
  cr_assert(strstr(mpg_topo_source(t), "synthetic"));
  mpg_topo_destroy(t);
}

Test(synthetic, core_binding_partitions_every_core) {
  mpg_topo *t = NULL;
  cr_assert_eq(mpg_topo_load_synthetic("pack:4 numa:2 core:32 pu:2", &t), MPG_OK);
  /* 64 CPU ranks: 8 per NUMA node, 4 cores each, all disjoint. */
  int per_numa[8] = {0};
  int total_cores = 0;
  char prev[MPG_CPUSET_STR_MAX] = "";
  for (int r = 0; r < 64; r++) {
    mpg_binding b = MPG_BINDING_INIT;
    cr_assert_eq(mpg_topo_bind(t, r, 64, -1, MPG_BIND_CORE, MPG_BIND_APPLY_NONE, &b), MPG_OK, "%s",
                 mpg_last_error());
    cr_assert_eq(b.num_cores, 4, "rank %d: %s", r, b.cpuset);
    cr_assert_eq(b.num_pus, 8);
    cr_assert_str_neq(b.cpuset, prev);
    snprintf(prev, sizeof prev, "%s", b.cpuset);
    per_numa[b.numa_node]++;
    total_cores += b.num_cores;
  }
  for (int n = 0; n < 8; n++) cr_assert_eq(per_numa[n], 8);
  cr_assert_eq(total_cores, 256);
  /* Rank 9 is the second rank of NUMA node 1 (PUs 64-127): cores 4-7. */
  core_cpuset_is(t, 9, 64, "72-79");
  mpg_topo_destroy(t);
}

Test(synthetic, uneven_split_and_no_core_level) {
  mpg_topo *t = NULL;
  cr_assert_eq(mpg_topo_load_synthetic("pack:2 numa:1 core:5 pu:1", &t), MPG_OK);
  /* 2 ranks per NUMA node of 5 cores: 3 + 2. */
  mpg_binding b = MPG_BINDING_INIT;
  core_cpuset_is(t, 0, 4, "0-2");
  core_cpuset_is(t, 1, 4, "3-4");
  mpg_topo_destroy(t);
  /* Without a core level, PUs are split. */
  cr_assert_eq(mpg_topo_load_synthetic("pack:1 numa:1 pu:4", &t), MPG_OK);
  cr_assert_eq(mpg_topo_bind(t, 3, 4, -1, MPG_BIND_CORE, MPG_BIND_APPLY_NONE, &b), MPG_OK, "%s",
               mpg_last_error());
  cr_assert_str_eq(b.cpuset, "3");
  mpg_topo_destroy(t);
}

Test(synthetic, long_cpuset_text_is_marked_truncated) {
  mpg_topo *t = NULL;
  /* PUs numbered alternately over the 2 packages (package 0 has the even
   * ones): a NUMA node's list "0,2,4,...,510" does not fit the buffer. */
  cr_assert_eq(mpg_topo_load_synthetic("pack:2 numa:1 core:256 pu:1(indexes=256*2:1*256)", &t),
               MPG_OK, "%s", mpg_last_error());
  mpg_binding b = MPG_BINDING_INIT;
  cr_assert_eq(mpg_topo_bind(t, 0, 2, -1, MPG_BIND_NUMA, MPG_BIND_APPLY_NONE, &b), MPG_OK, "%s",
               mpg_last_error());
  cr_assert_eq(b.num_pus, 256);
  cr_assert_eq(strlen(b.cpuset), (size_t)MPG_CPUSET_STR_MAX - 1);
  cr_assert(strncmp(b.cpuset, "0,2,4,6,", 8) == 0, "%s", b.cpuset);
  cr_assert_str_eq(b.cpuset + strlen(b.cpuset) - 3, "...");
  /* Core mode on the same machine: 128 cores each, still disjoint. */
  mpg_binding c = MPG_BINDING_INIT;
  bind_is(t, 1, 4, -1, MPG_BIND_CORE, MPG_BIND_APPLY_NONE, &c, MPG_OK, NULL);
  cr_assert_eq(c.num_cores, 128);
  mpg_topo_destroy(t);
}

/* ------------------------------------------------------------------------ */
/* Bad inputs                                                                */
/* ------------------------------------------------------------------------ */

Test(bad_input, missing_xml_file) {
  mpg_topo *t = (mpg_topo *)1;
  cr_assert_eq(mpg_topo_load_xml(fixture("no-such-topology.xml"), &t), MPG_ERR_IO);
  cr_assert_null(t);
  cr_assert(strstr(mpg_last_error(), "no-such-topology.xml"), "%s", mpg_last_error());
  cr_assert(strstr(mpg_last_error(), "No such file or directory"), "%s",
            mpg_last_error());
}

Test(bad_input, broken_xml_file) {
  mpg_topo *t = (mpg_topo *)1;
  cr_assert_eq(mpg_topo_load_xml(fixture("broken.xml"), &t), MPG_ERR_TOPO);
  cr_assert_null(t);
  cr_assert(strstr(mpg_last_error(), "broken.xml"), "%s", mpg_last_error());
  cr_assert(strstr(mpg_last_error(), "hwloc cannot load it"), "%s", mpg_last_error());
}

Test(bad_input, directory_and_empty_file) {
  mpg_topo *t = NULL;
  const char *data = getenv("MESHPG_TEST_DATA");
  char dir[1024];
  snprintf(dir, sizeof dir, "%s/topologies", data);
  cr_assert_eq(mpg_topo_load_xml(dir, &t), MPG_ERR_IO);
  cr_assert(strstr(mpg_last_error(), "Is a directory"), "%s", mpg_last_error());
  char tmp[] = "/tmp/mpg-empty-XXXXXX";
  int fd = mkstemp(tmp);
  cr_assert_geq(fd, 0);
  cr_assert_eq(mpg_topo_load_xml(tmp, &t), MPG_ERR_TOPO);
  cr_assert(strstr(mpg_last_error(), "is empty"), "%s", mpg_last_error());
  remove(tmp);
}

Test(bad_input, bad_synthetic_description) {
  mpg_topo *t = (mpg_topo *)1;
  cr_assert_eq(mpg_topo_load_synthetic("pack:2 bogus:3", &t), MPG_ERR_TOPO);
  cr_assert_null(t);
  cr_assert(strstr(mpg_last_error(), "\"pack:2 bogus:3\""), "%s", mpg_last_error());
}

Test(bad_input, null_arguments_and_ranges) {
  mpg_topo *t = NULL;
  cr_assert_eq(mpg_topo_load_xml(NULL, &t), MPG_ERR_INVALID);
  cr_assert_eq(mpg_topo_load_xml("x", NULL), MPG_ERR_INVALID);
  cr_assert_eq(mpg_topo_load_synthetic(NULL, &t), MPG_ERR_INVALID);
  cr_assert_eq(mpg_topo_load_live(NULL), MPG_ERR_INVALID);
  mpg_topo_destroy(NULL);
  cr_assert_eq(mpg_topo_num_gpus(NULL), 0);
  cr_assert_eq(mpg_topo_is_this_system(NULL), 0);
  t = load("dgx-h100.xml");
  mpg_binding b = MPG_BINDING_INIT;
  bind_is(t, 8, 8, -1, MPG_BIND_NUMA, MPG_BIND_APPLY_NONE, &b, MPG_ERR_RANGE, NULL);
  cr_assert(strstr(mpg_last_error(), "local rank 8 is outside 0..7"), "%s",
            mpg_last_error());
  bind_is(t, 0, 0, -1, MPG_BIND_NUMA, MPG_BIND_APPLY_NONE, &b, MPG_ERR_RANGE, NULL);
  bind_is(t, 0, 1, -1, (mpg_bind)7, MPG_BIND_APPLY_NONE, &b, MPG_ERR_INVALID, NULL);
  bind_is(t, 0, 1, -1, MPG_BIND_NUMA, MPG_BIND_APPLY_NONE, NULL, MPG_ERR_INVALID, NULL);
  bind_is(NULL, 0, 1, -1, MPG_BIND_NUMA, MPG_BIND_APPLY_NONE, &b, MPG_ERR_INVALID, NULL);
  mpg_topo_destroy(t);
}
