/* A caller of the shared library, compiled three times: against
 * include/meshpg.h, against a copy whose versioned structs are one field
 * shorter (a program built against an older header) and against one with a
 * field appended (a program built against a newer header), see
 * variant_header.py.  Every build must work: the library reads only the
 * fields inside the caller's size, writes only inside it (a canary after
 * each struct checks), and leaves fields it does not know alone. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include MPG_ABI_HEADER

#if defined(MPG_ABI_VARIANT_SHORT)
#define VARIANT "short"
#elif defined(MPG_ABI_VARIANT_LONG)
#define VARIANT "long"
#else
#define VARIANT "same"
#endif

#define CANARY 0x5a
#define CANARY_BYTES 64

/* A struct followed by bytes that no call may touch. */
#define GUARDED(type) \
  struct {            \
    type v;           \
    unsigned char canary[CANARY_BYTES]; \
  }

static void canary_set(unsigned char *c) { memset(c, CANARY, CANARY_BYTES); }
static void canary_check(const unsigned char *c, const char *what) {
  for (int i = 0; i < CANARY_BYTES; i++)
    cr_assert_eq(c[i], CANARY, "%s (%s header): byte %d after the struct was written",
                 what, VARIANT, i);
}

#define OK(call) cr_assert_eq((call), MPG_OK, "%s: %s", #call, mpg_last_error())

#if defined(MPG_ABI_VARIANT_LONG)
#define APPENDED_KEPT(s, what) \
  cr_assert_eq((s).abi_appended, 7, "%s: the appended field was overwritten", what)
#else
#define APPENDED_KEPT(s, what) (void)(s)
#endif

static const char *spec_toml =
    "[mesh]\n"
    "dims = [ { name = \"dp\", size = -1 }, { name = \"tp\", size = 2 } ]\n"
    "[sync]\n"
    "bucket_mb = 3\n"
    "op = \"sum\"\n";

static void data_path(char *buf, size_t cap, const char *rel) {
  const char *d = getenv("MESHPG_TEST_DATA");
  cr_assert(d, "MESHPG_TEST_DATA is not set");
  snprintf(buf, cap, "%s/%s", d, rel);
}

Test(abi, version_matches_header) {
  cr_assert_eq(mpg_version(), (unsigned)MPG_VERSION_HEX);
  char want[32];
  snprintf(want, sizeof want, "%d.%d.%d", MPG_VERSION_MAJOR, MPG_VERSION_MINOR,
           MPG_VERSION_PATCH);
  cr_assert_str_eq(mpg_version_string(), want);
}

Test(abi, spec_is_read_and_written_within_its_size) {
  GUARDED(mpg_spec) g = {MPG_SPEC_INIT, {0}};
  canary_set(g.canary);
  OK(mpg_spec_load_string(spec_toml, "abi.toml", &g.v));
  canary_check(g.canary, "mpg_spec_load_string");
  cr_assert_eq(g.v.ndims, 2);
  cr_assert_eq(g.v.dims[0].size, -1);
  cr_assert_eq(g.v.sync.bucket_mb, 3.0);
  cr_assert_eq(g.v.sync.op, MPG_OP_SUM);
  cr_assert_eq(g.v.backend.timeout_s, 600.0); /* a default */
  APPENDED_KEPT(g.v, "mpg_spec_load_string");
  OK(mpg_spec_apply_order(&g.v, "dp-tp"));
  canary_check(g.canary, "mpg_spec_apply_order");
  cr_assert_str_eq(g.v.dims[0].name, "tp");
  OK(mpg_spec_add_flatten(&g.v, "all", "tp,dp"));
  canary_check(g.canary, "mpg_spec_add_flatten");
  OK(mpg_spec_validate(&g.v));
  mpg_mesh *m = NULL;
  OK(mpg_mesh_create(&g.v, 8, &m));
  cr_assert_eq(mpg_mesh_world_size(m), 8);
  int set = -1;
  OK(mpg_mesh_dimset_find(m, "all", &set));
  mpg_mesh_destroy(m);
  /* A failed load resets the spec to the defaults, inside the size only. */
  cr_assert_eq(mpg_spec_load_string("[mesh]\ndims = 3\n", "bad.toml", &g.v), MPG_ERR_SPEC);
  cr_assert(strstr(mpg_last_error(), "bad.toml:2:"), "%s", mpg_last_error());
  canary_check(g.canary, "failed mpg_spec_load_string");
  cr_assert_eq(g.v.ndims, 0);
  cr_assert_eq(g.v.sync.bucket_mb, 25.0);
  OK(mpg_spec_init(&g.v));
  canary_check(g.canary, "mpg_spec_init");
}

/* Options that hold a spec's section (opts.sync = spec.sync) are read
 * within the caller's size by the call that takes them. */
static mpg_status sync_rank(const mpg_init_opts *io, void *arg) {
  const mpg_spec *s = arg;
  mpg_mesh *m = NULL;
  mpg_ctx *ctx = NULL;
  mpg_sync *sync = NULL;
  GUARDED(mpg_sync_opts) so = {MPG_SYNC_OPTS_INIT, {0}};
  canary_set(so.canary);
  so.v.sync = s->sync;
  so.v.grad_scale = 0.5;
  mpg_status st = mpg_mesh_create(s, 1, &m);
  if (!st) st = mpg_ctx_create(m, io, &ctx);
  if (!st) st = mpg_sync_create(ctx, &so.v, &sync);
  canary_check(so.canary, "mpg_sync_create");
  APPENDED_KEPT(so.v, "mpg_sync_create");
  mpg_sync_destroy(sync);
  mpg_ctx_destroy(ctx);
  mpg_mesh_destroy(m);
  return st;
}

Test(abi, options_holding_spec_sections_stay_inside) {
  mpg_spec s = MPG_SPEC_INIT;
  OK(mpg_spec_load_string(spec_toml, NULL, &s));
  cr_assert_eq(s.sync.bucket_mb, 3.0);
  cr_assert_eq(s.sync.op, MPG_OP_SUM);
  OK(mpg_spec_set_mesh(&s, "dp=1"));
  OK(mpg_thread_run(1, 30.0, sync_rank, &s, NULL));
  GUARDED(mpg_placement_opts) po = {MPG_PLACEMENT_OPTS_INIT, {0}};
  canary_set(po.canary);
  po.v.topology = s.topology;
  mpg_mesh *m = NULL;
  OK(mpg_mesh_create(&s, 1, &m));
  mpg_placement *pl = NULL;
  OK(mpg_placement_create(m, &po.v, &pl));
  canary_check(po.canary, "mpg_placement_create");
  APPENDED_KEPT(po.v, "mpg_placement_create");
  mpg_placement_destroy(pl);
  mpg_mesh_destroy(m);
}

Test(abi, placement_opts_are_read_within_their_size) {
  mpg_spec s = MPG_SPEC_INIT;
  OK(mpg_spec_set_mesh(&s, "dp=4,tp=2"));
  mpg_mesh *m = NULL;
  OK(mpg_mesh_create(&s, 0, &m));
  mpg_placement_opts po = MPG_PLACEMENT_OPTS_INIT;
  po.topology.nodes = 2;
  po.topology.rank_order = MPG_RANK_ORDER_CYCLIC;
  mpg_placement *pl = NULL;
  OK(mpg_placement_create(m, &po, &pl));
  cr_assert_eq(mpg_placement_num_nodes(pl), 2);
  /* tp stays inside a node: both members of mesh ranks 0,1 share node. */
  int n0 = -1, n1 = -2;
  OK(mpg_placement_of(pl, 0, NULL, &n0, NULL));
  OK(mpg_placement_of(pl, 1, NULL, &n1, NULL));
  cr_assert_eq(n0, n1);
  OK(mpg_placement_destroy(pl));
  OK(mpg_mesh_destroy(m));
}

Test(abi, topology_reports_stay_inside) {
  char path[512];
  data_path(path, sizeof path, "topologies/dgx-h100.xml");
  mpg_topo *t = NULL;
  OK(mpg_topo_load_xml(path, &t));
  GUARDED(mpg_gpu_info) gi = {MPG_GPU_INFO_INIT, {0}};
  canary_set(gi.canary);
  OK(mpg_topo_get_gpu(t, 3, &gi.v));
  canary_check(gi.canary, "mpg_topo_get_gpu");
  cr_assert_eq(gi.v.index, 3);
  cr_assert_eq(gi.v.num_nics, 2);
  cr_assert_eq(gi.v.vendor_id, 0x10de);
  APPENDED_KEPT(gi.v, "mpg_topo_get_gpu");
  GUARDED(mpg_nic_info) ni = {MPG_NIC_INFO_INIT, {0}};
  canary_set(ni.canary);
  OK(mpg_topo_get_gpu_nic(t, 3, 1, &ni.v));
  canary_check(ni.canary, "mpg_topo_get_gpu_nic");
  cr_assert_str_eq(ni.v.name, "mlx5_3");
  APPENDED_KEPT(ni.v, "mpg_topo_get_gpu_nic");
  OK(mpg_topo_get_nic(t, 0, &ni.v));
  canary_check(ni.canary, "mpg_topo_get_nic");
  cr_assert_str_eq(ni.v.name, "eno1");
  GUARDED(mpg_binding) b = {MPG_BINDING_INIT, {0}};
  canary_set(b.canary);
  OK(mpg_topo_bind(t, 5, 8, -1, MPG_BIND_NUMA, MPG_BIND_APPLY_NONE, &b.v));
  canary_check(b.canary, "mpg_topo_bind");
  cr_assert_eq(b.v.gpu, 5);
  cr_assert_eq(b.v.numa_node, 1);
  cr_assert_eq(b.v.applied, 0);
  APPENDED_KEPT(b.v, "mpg_topo_bind");
  OK(mpg_topo_destroy(t));
}

Test(abi, launch_report_stays_inside) {
  setenv("RANK", "3", 1);
  setenv("WORLD_SIZE", "4", 1);
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", "29500", 1);
  GUARDED(mpg_launch) l = {MPG_LAUNCH_INIT, {0}};
  canary_set(l.canary);
  OK(mpg_launch_from_env(&l.v));
  canary_check(l.canary, "mpg_launch_from_env");
  cr_assert_eq(l.v.rank, 3);
  cr_assert_eq(l.v.world_size, 4);
  cr_assert_eq(l.v.local_rank, -1);
  cr_assert_eq(l.v.master_port, 29500);
  cr_assert_str_eq(l.v.master_addr, "127.0.0.1");
  APPENDED_KEPT(l.v, "mpg_launch_from_env");
}

Test(abi, a_struct_without_its_initializer_is_refused_by_name) {
  mpg_gpu_info gi;
  memset(&gi, 0, sizeof gi);
  mpg_topo *t = NULL;
  OK(mpg_topo_load_synthetic("pack:1 core:2 pu:1", &t));
  mpg_binding b;
  memset(&b, 0, sizeof b);
  cr_assert_eq(mpg_topo_bind(t, 0, 1, -1, MPG_BIND_NONE, MPG_BIND_APPLY_NONE, &b), MPG_ERR_INVALID);
  cr_assert(strstr(mpg_last_error(), "MPG_BINDING_INIT"), "%s", mpg_last_error());
  cr_assert_eq(mpg_topo_get_gpu(t, 0, &gi), MPG_ERR_INVALID);
  cr_assert(strstr(mpg_last_error(), "MPG_GPU_INFO_INIT"), "%s", mpg_last_error());
  OK(mpg_topo_destroy(t));
  mpg_spec s;
  memset(&s, 0, sizeof s);
  cr_assert_eq(mpg_spec_load_string(spec_toml, NULL, &s), MPG_ERR_INVALID);
  cr_assert(strstr(mpg_last_error(), "MPG_SPEC_INIT"), "%s", mpg_last_error());
}

/* Two thread ranks, each with init, sync and param options of this
 * caller's layout. */
typedef struct job {
  const mpg_mesh *mesh;
} job;

static mpg_status rank_main(const mpg_init_opts *lib, void *arg) {
  const job *j = arg;
  /* The library hands its own struct: copy what a launcher would set into
   * one of this caller's layout. */
  mpg_init_opts o = MPG_INIT_OPTS_INIT;
  o.backend = lib->backend;
  o.rank = lib->rank;
  o.world_size = lib->world_size;
  o.backend.timeout_s = lib->backend.timeout_s;
  o.thread_world = lib->thread_world;
  mpg_ctx *ctx = NULL;
  mpg_status st = mpg_ctx_create(j->mesh, &o, &ctx);
  if (st) return st;
  int r = mpg_ctx_rank(ctx);
  mpg_sync *sync = NULL;
  GUARDED(mpg_binding) b = {MPG_BINDING_INIT, {0}};
  canary_set(b.canary);
  if ((st = mpg_ctx_get_binding(ctx, &b.v))) goto out;
  canary_check(b.canary, "mpg_ctx_get_binding");
  if (b.v.mode != MPG_BIND_NONE || b.v.applied != 0) {
    st = MPG_ERR_STATE;
    goto out;
  }
  mpg_sync_opts so = MPG_SYNC_OPTS_INIT;
  if ((st = mpg_sync_create(ctx, &so, &sync))) goto out;
  mpg_param_opts po = MPG_PARAM_OPTS_INIT;
  po.reduce_dims = "world";
  int pa = -1, pb = -1;
  if ((st = mpg_sync_add_param(sync, "a", 5, MPG_F32, NULL, &pa))) goto out;
  if ((st = mpg_sync_add_param(sync, "b", 3, MPG_F64, &po, &pb))) goto out;
  if ((st = mpg_sync_commit(sync))) goto out;
  float *ga;
  double *gb;
  if ((st = mpg_sync_grad(sync, pa, (void **)&ga))) goto out;
  if ((st = mpg_sync_grad(sync, pb, (void **)&gb))) goto out;
  for (int i = 0; i < 5; i++) ga[i] = (float)(r + i);
  for (int i = 0; i < 3; i++) gb[i] = r * 10.0;
  if ((st = mpg_sync_all(sync, 0, NULL))) goto out;
  /* a: default group dp (ranks r and r^1 on dp=2,tp=1) averaged;
   * b: over the world, averaged. */
  for (int i = 0; i < 5; i++)
    if (ga[i] != (float)(0.5 + i)) st = MPG_ERR_STATE;
  for (int i = 0; i < 3; i++)
    if (gb[i] != 5.0) st = MPG_ERR_STATE;
  if (st) goto out;
  GUARDED(mpg_sync_stats) ss = {MPG_SYNC_STATS_INIT, {0}};
  canary_set(ss.canary);
  if ((st = mpg_sync_get_stats(sync, &ss.v))) goto out;
  canary_check(ss.canary, "mpg_sync_get_stats");
  if (ss.v.num_params != 2 || ss.v.num_buffers != 2) st = MPG_ERR_STATE;
out:
  mpg_sync_destroy(sync);
  mpg_ctx_destroy(ctx);
  return st;
}

Test(abi, init_sync_and_param_opts_work_on_thread_ranks) {
  mpg_spec s = MPG_SPEC_INIT;
  OK(mpg_spec_set_mesh(&s, "dp=2"));
  mpg_mesh *m = NULL;
  OK(mpg_mesh_create(&s, 0, &m));
  job j = {m};
  mpg_status st[2];
  cr_assert_eq(mpg_thread_run(2, 30.0, rank_main, &j, st), MPG_OK,
               "rank statuses %s %s: %s", mpg_status_name(st[0]),
               mpg_status_name(st[1]), mpg_last_error());
  mpg_mesh_destroy(m);
}
