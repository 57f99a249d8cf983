/* CUDA_VISIBLE_DEVICES on a live topology whose GPUs hwloc finds without
 * CUDA OS devices: indexes, GPU UUIDs (and unique prefixes), MIG devices,
 * mixed lists, and precise errors for what cannot be honoured.  The "live"
 * machine is an XML fixture (HWLOC_XMLFILE with HWLOC_THISSYSTEM=1):
 * workstation-4gpu-nvml.xml has NVML OS devices with NVIDIAUUID infos,
 * workstation-4gpu.xml bare PCI GPUs (no UUIDs), dgx-h100.xml CUDA OS
 * devices (which CUDA numbers itself: the variable is not applied twice). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "meshpg.h"

#define U0 "GPU-1a2b3c4d-0000-4000-8000-000000000001"
#define U1 "GPU-1a2b3c4d-0000-4000-8000-000000000002"
#define U2 "GPU-5e6f7a8b-0000-4000-8000-000000000003"
#define U3 "GPU-9c0d1e2f-0000-4000-8000-000000000004"

static mpg_status live(const char *fixture, const char *visible, mpg_topo **t) {
  static char path[1024];
  const char *d = getenv("MESHPG_TEST_DATA");
  cr_assert_not_null(d, "MESHPG_TEST_DATA is not set");
  snprintf(path, sizeof path, "%s/topologies/%s", d, fixture);
  setenv("HWLOC_XMLFILE", path, 1);
  setenv("HWLOC_THISSYSTEM", "1", 1);
  setenv("CUDA_VISIBLE_DEVICES", visible, 1);
  *t = NULL;
  return mpg_topo_load_live(t);
}

/* The GPUs' bus ids, space separated. */
static void expect_gpus(const char *fixture, const char *visible, const char *buses) {
  mpg_topo *t;
  mpg_status st = live(fixture, visible, &t);
  cr_assert_eq(st, MPG_OK, "CUDA_VISIBLE_DEVICES=%s on %s: %s: %s", visible, fixture,
               mpg_status_name(st), mpg_last_error());
  cr_assert(mpg_topo_is_this_system(t), "the fixture was not loaded as this machine");
  char got[512] = "";
  for (int i = 0; i < mpg_topo_num_gpus(t); i++) {
    mpg_gpu_info g = MPG_GPU_INFO_INIT;
    cr_assert_eq(mpg_topo_get_gpu(t, i, &g), MPG_OK);
    if (i) strcat(got, " ");
    strcat(got, g.bus_id);
  }
  cr_expect_str_eq(got, buses, "CUDA_VISIBLE_DEVICES=%s on %s", visible, fixture);
  mpg_topo_destroy(t);
}

static void expect_error(const char *fixture, const char *visible, const char *sub1,
                         const char *sub2) {
  mpg_topo *t;
  mpg_status st = live(fixture, visible, &t);
  cr_expect_eq(st, MPG_ERR_TOPO, "CUDA_VISIBLE_DEVICES=%s: %s", visible,
               mpg_status_name(st));
  cr_expect_null(t);
  const char *m = mpg_last_error();
  cr_expect(strstr(m, "CUDA_VISIBLE_DEVICES") && strstr(m, sub1) && strstr(m, sub2),
            "CUDA_VISIBLE_DEVICES=%s: message \"%s\" lacks \"%s\" / \"%s\"", visible, m,
            sub1, sub2);
  mpg_topo_destroy(t);
}

#define NVML "workstation-4gpu-nvml.xml"
#define BARE "workstation-4gpu.xml"

Test(visible, every_gpu_without_the_variable) {
  expect_gpus(NVML, "0,1,2,3", "0000:01:00.0 0000:02:00.0 0000:41:00.0 0000:42:00.0");
}

Test(visible, full_uuids_select_and_order) {
  expect_gpus(NVML, U3 "," U2, "0000:42:00.0 0000:41:00.0");
}

Test(visible, unique_uuid_prefixes_ignore_case) {
  expect_gpus(NVML, "GPU-5e6f", "0000:41:00.0");
  expect_gpus(NVML, "gpu-9C0D1E2F, GPU-1a2b3c4d-0000-4000-8000-000000000002",
              "0000:42:00.0 0000:02:00.0");
}

Test(visible, indexes_and_uuids_mixed) {
  expect_gpus(NVML, "3," U0 ",2", "0000:42:00.0 0000:01:00.0 0000:41:00.0");
}

/* A MIG device selects the GPU it lives on (its locality: NUMA node,
 * cpuset, NICs); hwloc has no MIG objects of its own. */
Test(visible, mig_gpu_form_selects_the_parent_gpu) {
  expect_gpus(NVML, "MIG-" U2 "/1/0", "0000:41:00.0");
  expect_gpus(NVML, "MIG-GPU-9c0d/2/0,0", "0000:42:00.0 0000:01:00.0");
}

Test(visible, like_cuda_a_bad_index_ends_the_list) {
  expect_gpus(NVML, "-1", "");
  expect_gpus(NVML, "", "");
  expect_gpus(NVML, "2,7,0", "0000:41:00.0");
  expect_gpus(BARE, "2,0", "0000:41:00.0 0000:01:00.0");
}

Test(visible, mig_instance_uuid_cannot_be_mapped) {
  expect_error(NVML, "MIG-4f1e2d3c-0000-4000-8000-00000000000a", "entry 0",
               "cannot be mapped to its GPU");
}

Test(visible, ambiguous_prefix) {
  expect_error(NVML, "GPU-1a2b3c4d", "entry 0 \"GPU-1a2b3c4d\" is ambiguous", U1);
}

Test(visible, unknown_uuid) {
  expect_error(NVML, "0,GPU-ffff", "entry 1 \"GPU-ffff\"", "matches none of the 4 GPUs");
}

Test(visible, gpu_listed_twice) {
  expect_error(NVML, "1," U1, "entry 1", "selects GPU 1 again (entry 0 did)");
}

Test(visible, malformed_and_empty_entries) {
  expect_error(NVML, "0,foo", "entry 1 \"foo\"", "is not a GPU index");
  expect_error(NVML, "GPU-xyz", "entry 0 \"GPU-xyz\"", "is not a GPU index");
  expect_error(NVML, "0,,1", "entry 1 is empty", "GPU-<uuid>");
  expect_error(NVML, "0,", "entry 1 is empty", "GPU-<uuid>");
}

Test(visible, uuids_need_uuids_bare_pci_gpus_have_none) {
  expect_error(BARE, "GPU-1a2b", "entry 0 \"GPU-1a2b\"", "have no UUID");
  expect_error(BARE, "MIG-GPU-1a2b/1/0", "bare PCI devices", "use GPU indexes");
}

Test(visible, cuda_os_devices_are_numbered_by_cuda_already) {
  mpg_topo *t;
  cr_assert_eq(live("dgx-h100.xml", "3,GPU-nonsense", &t), MPG_OK, "%s", mpg_last_error());
  cr_expect_eq(mpg_topo_num_gpus(t), 8);
  mpg_topo_destroy(t);
}

Test(visible, xml_topologies_are_not_this_machine) {
  setenv("CUDA_VISIBLE_DEVICES", "GPU-nonsense", 1);
  mpg_topo *t = NULL;
  char path[1024];
  snprintf(path, sizeof path, "%s/topologies/%s", getenv("MESHPG_TEST_DATA"), NVML);
  cr_assert_eq(mpg_topo_load_xml(path, &t), MPG_OK, "%s", mpg_last_error());
  cr_expect_eq(mpg_topo_num_gpus(t), 4);
  mpg_topo_destroy(t);
}
