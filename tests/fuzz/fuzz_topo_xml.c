/* libFuzzer target: hwloc XML topology loading (mpg_topo_load_xml).  The
 * library reads topologies from files only, so each input is written to a
 * private temporary file first.  A topology that loads answers every query
 * consistently (GPU and NIC indices, NUMA nodes, NVLink peers, binding
 * plans); one that does not load gives MPG_ERR_TOPO (or MPG_ERR_IO) with a
 * message, and *out = NULL. */
#include <unistd.h>

#include "fuzz_common.h"

static char path[4096];
/* A topology kept for the whole run: hwloc loads its plugins (libxml2) with
 * the first topology and unloads them with the last, so without it every
 * input would reload them (slow), and LeakSanitizer could not name the
 * plugin frames of a leak at exit. */
static mpg_topo *keep;

static void cleanup(void) {
  if (path[0]) unlink(path);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  fuzz_tmp_path(path, sizeof path, "meshpg-fuzz-topo-XXXXXX.xml");
  int fd = mkstemps(path, 4);
  if (fd < 0) {
    perror("fuzz_topo_xml: mkstemps");
    abort();
  }
  close(fd);
  atexit(cleanup);
  if (mpg_topo_load_synthetic("pack:1 core:1 pu:1", &keep) != MPG_OK) {
    fprintf(stderr, "fuzz_topo_xml: %s\n", mpg_last_error());
    abort();
  }
  return 0;
}

static void check_gpu(const mpg_topo *t, int g, int ngpus) {
  mpg_gpu_info gi = MPG_GPU_INFO_INIT;
  mpg__clear_error();
  mpg_status st = mpg_topo_get_gpu(t, g, &gi);
  fuzz_check_status(st);
  FUZZ_CHECK(st == MPG_OK);
  FUZZ_CHECK(gi.index == g);
  FUZZ_CHECK(gi.name && gi.bus_id && gi.cpuset);
  FUZZ_CHECK(strlen(gi.bus_id) < MPG_BUS_ID_MAX);
  FUZZ_CHECK(gi.numa_node >= -1 && gi.num_cores >= 0 && gi.pcie_group >= 0 &&
             gi.pcie_group < ngpus);
  FUZZ_CHECK(gi.num_nics >= 0 && gi.num_nics <= mpg_topo_num_nics(t));
  FUZZ_CHECK(gi.nvlink_peers >= 0 && gi.nvlink_peers < ngpus);
  for (int k = 0; k < gi.num_nics; k++) {
    mpg_nic_info ni = MPG_NIC_INFO_INIT;
    FUZZ_CHECK(mpg_topo_get_gpu_nic(t, g, k, &ni) == MPG_OK);
    FUZZ_CHECK(ni.name && ni.netdev && ni.bus_id && ni.cpuset);
  }
  mpg_nic_info ni = MPG_NIC_INFO_INIT;
  mpg__clear_error();
  st = mpg_topo_get_gpu_nic(t, g, gi.num_nics, &ni);
  FUZZ_CHECK(st == MPG_ERR_RANGE);
  fuzz_check_status(st);
}

static void check_topo(const mpg_topo *t) {
  FUZZ_CHECK(strcmp(mpg_topo_source(t), path) == 0);
  FUZZ_CHECK(mpg_topo_is_this_system(t) == 0);
  int ngpus = mpg_topo_num_gpus(t), nnics = mpg_topo_num_nics(t);
  FUZZ_CHECK(ngpus >= 0 && nnics >= 0);
  FUZZ_CHECK(mpg_topo_num_numa_nodes(t) >= 0 && mpg_topo_num_packages(t) >= 0 &&
             mpg_topo_num_cores(t) >= 0 && mpg_topo_num_pus(t) >= 0);
  int fabric = mpg_topo_has_gpu_fabric(t);
  FUZZ_CHECK(fabric == 0 || (fabric == 1 && ngpus >= 2));
  for (int g = 0; g < ngpus && g < 64; g++) check_gpu(t, g, ngpus);
  mpg_gpu_info gi = MPG_GPU_INFO_INIT;
  mpg__clear_error();
  mpg_status st = mpg_topo_get_gpu(t, ngpus, &gi);
  FUZZ_CHECK(st == MPG_ERR_RANGE);
  fuzz_check_status(st);
  for (int k = 0; k < nnics && k < 64; k++) {
    mpg_nic_info ni = MPG_NIC_INFO_INIT;
    FUZZ_CHECK(mpg_topo_get_nic(t, k, &ni) == MPG_OK);
    FUZZ_CHECK(ni.name && ni.netdev && ni.bus_id && ni.cpuset);
    FUZZ_CHECK(ni.numa_node >= -1);
  }
  /* Binding plans for every mode and a few local worlds: success or a
   * message, and a consistent report. */
  int worlds[] = {1, 2, ngpus > 0 ? ngpus : 3};
  for (int w = 0; w < 3; w++)
    for (int mode = MPG_BIND_NONE; mode <= MPG_BIND_CORE; mode++)
      for (int lr = 0; lr < worlds[w] && lr < 8; lr++) {
        mpg_binding b = MPG_BINDING_INIT;
        mpg__clear_error();
        st = mpg_topo_bind(t, lr, worlds[w], -1, (mpg_bind)mode, MPG_BIND_APPLY_NONE, &b);
        fuzz_check_status(st);
        if (st != MPG_OK) continue;
        FUZZ_CHECK(b.local_rank == lr && b.applied == 0 && (int)b.mode == mode);
        FUZZ_CHECK(b.gpu >= -1 && b.gpu < ngpus);
        FUZZ_CHECK(ngpus == 0 ? b.gpu == -1 : b.gpu == lr);
        FUZZ_CHECK(memchr(b.cpuset, '\0', sizeof b.cpuset) != NULL);
        FUZZ_CHECK(b.num_cores >= 0 && b.num_pus >= 0);
        if (mode == MPG_BIND_NONE) FUZZ_CHECK(b.cpuset[0] == '\0');
      }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  FILE *f = fopen(path, "wb");
  FUZZ_CHECK(f != NULL);
  FUZZ_CHECK(fwrite(data, 1, size, f) == size);
  FUZZ_CHECK(fclose(f) == 0);
  mpg_topo *t = (mpg_topo *)&path; /* must be reset to NULL on failure */
  mpg__clear_error();
  mpg_status st = mpg_topo_load_xml(path, &t);
  fuzz_check_status(st);
  FUZZ_CHECK(st == MPG_OK || st == MPG_ERR_TOPO || st == MPG_ERR_NOMEM);
  if (st != MPG_OK) {
    FUZZ_CHECK(t == NULL);
    if (size == 0) FUZZ_CHECK(st == MPG_ERR_TOPO);
    return 0;
  }
  FUZZ_CHECK(t != NULL);
  check_topo(t);
  FUZZ_CHECK(mpg_topo_destroy(t) == MPG_OK);
  return 0;
}
