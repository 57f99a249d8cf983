/* The C++ layer, include/meshpg.hpp, and the example trainer.
 *
 *  - error:     Error carries the status and mpg_last_error(); check().
 *  - spec/mesh: values and owners; move semantics; errors as exceptions.
 *  - topo/placement: the hwloc fixtures through the owners.
 *  - threads:   Group collectives through the templates (every dtype, raw
 *               f16/bf16), Work, Sync, and run_threads turning exceptions
 *               into statuses (a throwing rank aborts its context, so its
 *               peers fail at once instead of at their timeout).
 *  - trainer:   runs examples/trainer (MESHPG_TRAINER): simulated ranks on
 *               several specs, its errors and exit codes, under mpirun when
 *               MPI is built (MESHPG_HAVE_MPI=1), and under valgrind.
 *  - valgrind:  cpp_raii_worker (MESHPG_CPP_RAII_WORKER) walks every owner,
 *               move and exception path; valgrind must find no definite
 *               leak and no memory error.
 *
 * Ranks are threads: Criterion's asserts must not run on them, so a rank
 * checks with REQUIRE (which throws) and the test thread asserts on the
 * ThreadRun. */
#include "test_cpp.hpp"

/* ------------------------------------------------------------------------ */
/* Helpers                                                                   */
/* ------------------------------------------------------------------------ */

std::string env_or_fail(const char* var) {
  const char* v = std::getenv(var);
  cr_assert_not_null(v, "%s is not set (run through meson test)", var);
  return v;
}

std::string data_dir() { return env_or_fail("MESHPG_TEST_DATA"); }

/* Run a shell command with stderr joined; its exit code, output in *out. */
int run(const std::string& cmd, std::string* out) {
  std::string full = cmd + " 2>&1";
  FILE* p = popen(full.c_str(), "r");
  cr_assert_not_null(p, "popen(%s) failed", cmd.c_str());
  out->clear();
  char buf[4096];
  size_t k;
  while ((k = fread(buf, 1, sizeof buf, p)) > 0) out->append(buf, k);
  int st = pclose(p);
  cr_assert(WIFEXITED(st), "%s: did not exit normally\n%s", cmd.c_str(), out->c_str());
  return WEXITSTATUS(st);
}

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) n++;
  return n;
}

bool has(const std::string& text, const std::string& what) {
  return text.find(what) != std::string::npos;
}

/* The seed mesh of DESIGN.md: dp=2, tp=2, cp=2 with dp_cp = [dp, cp]. */
meshpg::Spec seed_spec() {
  meshpg::Spec s;
  s.set_mesh("dp=2,tp=2,cp=2").add_flatten("dp_cp", "dp,cp").validate();
  return s;
}

/* ------------------------------------------------------------------------ */
/* Compile-time facts                                                        */
/* ------------------------------------------------------------------------ */

static_assert(meshpg::dtype_v<float> == MPG_F32, "float is f32");
static_assert(meshpg::dtype_v<double> == MPG_F64, "double is f64");
static_assert(meshpg::dtype_v<std::int32_t> == MPG_I32, "int32_t is i32");
static_assert(meshpg::dtype_v<std::int64_t> == MPG_I64, "int64_t is i64");
static_assert(meshpg::dtype_v<const float> == MPG_F32, "cv-qualifiers are ignored");
static_assert(!meshpg::has_dtype_v<std::uint16_t>, "16-bit floats go through raw overloads");
static_assert(!meshpg::has_dtype_v<char>, "no dtype for char");
static_assert(std::is_base_of_v<std::runtime_error, meshpg::Error>, "Error is a runtime_error");

template <class T>
static constexpr bool move_only_v =
    !std::is_copy_constructible_v<T> && !std::is_copy_assignable_v<T> &&
    std::is_nothrow_move_constructible_v<T> && std::is_nothrow_move_assignable_v<T> &&
    std::is_nothrow_destructible_v<T> && std::is_nothrow_default_constructible_v<T>;
static_assert(move_only_v<meshpg::Mesh>, "Mesh is move-only");
static_assert(move_only_v<meshpg::Ctx>, "Ctx is move-only");
static_assert(move_only_v<meshpg::Sync>, "Sync is move-only");
static_assert(move_only_v<meshpg::Topo>, "Topo is move-only");
static_assert(move_only_v<meshpg::Placement>, "Placement is move-only");
static_assert(move_only_v<meshpg::Work>, "Work is move-only");
static_assert(std::is_trivially_copyable_v<meshpg::Group>, "Group is a view");
static_assert(std::is_copy_constructible_v<meshpg::Spec>, "Spec is a value");

/* ------------------------------------------------------------------------ */
/* Errors                                                                    */
/* ------------------------------------------------------------------------ */

Test(error, check_ok_does_not_throw) {
  meshpg::check(MPG_OK);
}

Test(error, carries_status_and_last_error_with_position) {
  const char* toml = "[mesh]\ndims = [ { name = \"dp\", size = 0 } ]\n";
  try {
    meshpg::Spec::load_string(toml, "bad.toml");
    cr_assert_fail("a size of 0 must be rejected");
  } catch (const meshpg::Error& e) {
    cr_assert_eq(e.status(), MPG_ERR_SPEC, "%s", e.what());
    cr_assert_str_eq(e.name(), "ERR_SPEC");
    cr_assert(has(e.detail(), "bad.toml:2:"), "detail: %s", e.detail().c_str());
    cr_assert_str_eq(e.detail().c_str(), mpg_last_error());
    cr_assert_eq(std::string(e.what()), "ERR_SPEC: " + e.detail());
  }
}

Test(error, is_a_runtime_error_and_check_throws_the_status) {
  try {
    meshpg::check(MPG_ERR_TIMEOUT);
    cr_assert_fail("check must throw");
  } catch (const std::runtime_error& e) {
    const meshpg::Error* me = dynamic_cast<const meshpg::Error*>(&e);
    cr_assert_not_null(me);
    cr_assert_eq(me->status(), MPG_ERR_TIMEOUT);
  }
}

Test(error, empty_detail_falls_back_to_strerror) {
  meshpg::Error e(MPG_ERR_TIMEOUT, "");
  cr_assert_str_eq(e.detail().c_str(), "timed out waiting for peers");
  cr_assert_str_eq(e.what(), "ERR_TIMEOUT: timed out waiting for peers");
  meshpg::Error copy = e;  // exceptions copy
  cr_assert_eq(copy.status(), MPG_ERR_TIMEOUT);
  cr_assert_str_eq(copy.what(), e.what());
}

Test(error, parse_and_io_errors) {
  meshpg::Error p = expect_error(MPG_ERR_PARSE, [] { meshpg::Spec::load_string("[mesh\n"); });
  cr_assert(has(p.detail(), "<string>:1:"), "%s", p.what());
  meshpg::Error io =
      expect_error(MPG_ERR_IO, [] { meshpg::Spec::load_file("/nonexistent/spec.toml"); });
  cr_assert(has(io.detail(), "/nonexistent/spec.toml"), "%s", io.what());
}

/* ------------------------------------------------------------------------ */
/* Spec                                                                      */
/* ------------------------------------------------------------------------ */

Test(spec, mutators_chain_and_fields_are_reachable) {
  meshpg::Spec s;
  s.set_mesh("tp=2,cp=2,dp=2,pp=2").apply_order("tp-cp-dp-pp").add_flatten("dp_cp", "dp,cp");
  s.validate();
  cr_assert_eq(s->ndims, 4);
  cr_assert_str_eq(s->dims[0].name, "pp");
  cr_assert_str_eq(s->dims[3].name, "tp");
  cr_assert_eq(s->nflatten, 1);
  s->backend.timeout_s = 5;
  cr_assert_eq(s.get()->backend.timeout_s, 5.0);
}

Test(spec, errors_are_exceptions) {
  meshpg::Spec s;
  expect_error(MPG_ERR_SPEC, [&] { s.set_mesh("dp=two"); });
  s.set_mesh("dp=2,tp=2");
  meshpg::Error e = expect_error(MPG_ERR_SPEC, [&] { s.apply_order("tp-xx"); });
  cr_assert(has(e.detail(), "xx"), "%s", e.what());
  s.add_flatten("dp_cp", "dp,cp");  // cp is unknown: only validate sees it
  expect_error(MPG_ERR_SPEC, [&] { s.validate(); });
}

Test(spec, load_file_and_section_options) {
  meshpg::Spec s = meshpg::Spec::load_file(data_dir() + "/../examples/fsdp.toml");
  cr_assert_eq(s->ndims, 3);
  mpg_sync_opts so = s.sync_opts();
  cr_assert_eq(so.sync.fsdp_owns_dp, 1);
  cr_assert_eq(so.magic, MPG_SYNC_OPTS_MAGIC);
  meshpg::Spec l = meshpg::Spec::load_file(data_dir() + "/../examples/llama64.toml");
  mpg_placement_opts po = l.placement_opts();
  cr_assert_eq(po.topology.nodes, 8);
  cr_assert_eq(po.topology.gpus_per_node, 8);
}

Test(spec, is_a_copyable_value) {
  meshpg::Spec a = seed_spec();
  meshpg::Spec b = a;
  b.set_mesh("dp=4,tp=2,cp=1");
  cr_assert_eq(a->dims[0].size, 2);
  cr_assert_eq(b->dims[0].size, 4);
  meshpg::Spec c(*a.get());
  cr_assert_str_eq(c->dims[1].name, "tp");
}

/* ------------------------------------------------------------------------ */
/* Mesh                                                                      */
/* ------------------------------------------------------------------------ */

static std::vector<std::vector<int>> all_groups(const meshpg::Mesh& m, const char* name) {
  int set = m.dimset(name);
  std::vector<std::vector<int>> out;
  for (int g = 0; g < m.dimset_info(set).num_groups; g++) out.push_back(m.group_members(set, g));
  return out;
}

Test(mesh, design_example_groups) {
  meshpg::Mesh m(seed_spec());
  cr_assert_eq(m.world_size(), 8);
  cr_assert_eq(m.ndims(), 3);
  using G = std::vector<std::vector<int>>;
  cr_assert(all_groups(m, "dp") == G({{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  cr_assert(all_groups(m, "tp") == G({{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  cr_assert(all_groups(m, "cp") == G({{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  cr_assert(all_groups(m, "dp_cp") == G({{0, 1, 4, 5}, {2, 3, 6, 7}}));
  std::vector<meshpg::Dim> dims = m.dims();
  cr_assert_eq(dims.size(), 3u);
  cr_assert(dims[1].name == "tp" && dims[1].size == 2);
  cr_assert_eq(m.num_dimsets(), 5);  // dp tp cp dp_cp world
  cr_assert(m.dimset_dims(m.dimset("dp_cp")) == std::vector<int>({0, 2}));
  cr_assert(m.dimset_info(m.dimset("world")).name == "world");
}

Test(mesh, coordinates_and_group_of) {
  meshpg::Mesh m(seed_spec());
  for (int r = 0; r < 8; r++) cr_assert_eq(m.rank_of(m.coord_of(r)), r);
  cr_assert(m.coord_of(5) == std::vector<int>({1, 0, 1}));
  meshpg::GroupOf g = m.group_of(m.dimset("dp_cp"), 5);
  cr_assert_eq(g.index, 0);
  cr_assert_eq(g.position, 3);
  cr_assert_eq(g.size, 4);
  cr_assert_eq(m.group_member(m.dimset("dp_cp"), 1, 2), 6);
}

Test(mesh, errors_are_exceptions) {
  meshpg::Mesh m(seed_spec());
  meshpg::Error e = expect_error(MPG_ERR_NOT_FOUND, [&] { m.dimset("xyz"); });
  cr_assert(has(e.detail(), "xyz"), "%s", e.what());
  cr_assert(m.has("dp_cp"));
  cr_assert(m.has("world"));
  cr_assert_not(m.has("xyz"));
  expect_error(MPG_ERR_RANGE, [&] { m.dim(3); });
  expect_error(MPG_ERR_RANGE, [&] { m.coord_of(8); });
  expect_error(MPG_ERR_INVALID, [&] { m.rank_of({0, 0}); });
  meshpg::Error w = expect_error(MPG_ERR_SPEC, [] { meshpg::Mesh bad(seed_spec(), 7); });
  cr_assert(has(w.detail(), "7"), "%s", w.what());
}

Test(mesh, infers_a_dim_from_the_world_size) {
  meshpg::Spec s;
  s.set_mesh("dp=-1,tp=2");
  meshpg::Mesh m(s, 8);
  cr_assert_eq(m.dim(0).size, 4);
}

Test(mesh, move_semantics) {
  meshpg::Mesh a(seed_spec());
  mpg_mesh* raw = a.get();
  cr_assert(a);
  meshpg::Mesh b(std::move(a));
  cr_assert_null(a.get());
  cr_assert_not(a);
  cr_assert_eq(b.get(), raw);
  meshpg::Mesh c;
  cr_assert_not(c);
  c = std::move(b);
  cr_assert_eq(c.get(), raw);
  cr_assert_null(b.get());
  meshpg::Mesh d(meshpg::Spec().set_mesh("dp=2"));
  d = std::move(c);  // d's old mesh is freed
  cr_assert_eq(d.get(), raw);
  meshpg::Mesh& alias = d;
  d = std::move(alias);  // self-move keeps it
  cr_assert_eq(d.get(), raw);
  mpg_mesh* released = d.release();
  cr_assert_eq(released, raw);
  cr_assert_null(d.get());
  meshpg::Mesh adopted(released);
  cr_assert_eq(adopted.world_size(), 8);
}

/* ------------------------------------------------------------------------ */
/* Topology and placement                                                    */
/* ------------------------------------------------------------------------ */

Test(topo, synthetic_counts_and_plan) {
  meshpg::Topo t = meshpg::Topo::load_synthetic("pack:2 numa:1 core:4 pu:2");
  cr_assert_eq(t.num_packages(), 2);
  cr_assert_eq(t.num_numa_nodes(), 2);
  cr_assert_eq(t.num_cores(), 8);
  cr_assert_eq(t.num_pus(), 16);
  cr_assert_eq(t.num_gpus(), 0);
  cr_assert_not(t.is_this_system());
  cr_assert(has(t.source(), "synthetic"), "%s", t.source().c_str());
  mpg_binding b = t.bind(1, 2, -1, MPG_BIND_NUMA, MPG_BIND_APPLY_NONE);
  cr_assert_eq(b.gpu, -1);
  cr_assert_eq(b.numa_node, 1);
  expect_error(MPG_ERR_TOPO, [&] { t.bind(0, 2, -1, MPG_BIND_NUMA, MPG_BIND_APPLY_PROCESS); });
}

Test(topo, xml_fixture_gpus_and_nics) {
  meshpg::Topo t = meshpg::Topo::load_xml(data_dir() + "/topologies/dgx-h100.xml");
  cr_assert_eq(t.num_gpus(), 8);
  cr_assert(t.has_gpu_fabric());
  mpg_gpu_info g = t.gpu(4);
  cr_assert_str_eq(g.bus_id, "0000:98:00.0");
  cr_assert_eq(g.numa_node, 1);
  cr_assert_eq(t.num_nics(), 9);
  cr_assert_str_eq(t.nic(1).name, "mlx5_0");
  meshpg::Error e = expect_error(MPG_ERR_RANGE, [&] { t.gpu(8); });
  cr_assert(has(e.detail(), "8"), "%s", e.what());
  meshpg::Topo moved = std::move(t);
  cr_assert_null(t.get());
  cr_assert_eq(moved.num_gpus(), 8);
  expect_error(MPG_ERR_IO, [] { meshpg::Topo::load_xml("/nonexistent/topo.xml"); });
}

// The mesh of dims, and placement options of 8 GPUs a node (strict: a
// misfit throws).
static meshpg::Mesh dims_mesh(const char* dims) {
  meshpg::Spec s;
  s.set_mesh(dims);
  return meshpg::Mesh(s);
}

static mpg_placement_opts eight_per_node(int strict) {
  mpg_placement_opts o = MPG_PLACEMENT_OPTS_INIT;
  o.topology.gpus_per_node = 8;
  o.topology.strict = strict;
  return o;
}

Test(placement, two_nodes_keep_tp_inside) {
  meshpg::Mesh m = dims_mesh("dp=2,tp=8");
  mpg_placement_opts o = eight_per_node(0);
  meshpg::Placement p(m, o);
  cr_assert_eq(p.num_nodes(), 2);
  cr_assert_eq(p.check_misfits(), 0);
  cr_assert(p.dimset_is_inner(m.dimset("tp")));
  cr_assert_not(p.dimset_is_inner(m.dimset("dp")));
  cr_assert_eq(p.group_nodes(m.dimset("tp"), 0), 1);
  cr_assert_eq(p.group_nodes(m.dimset("dp"), 0), 2);
  for (int r = 0; r < 16; r++) {
    meshpg::Slot slot = p.of(r);
    cr_assert_eq(p.mesh_rank(slot.launcher_rank), r);
    cr_assert_eq(slot.node, r / 8);
  }
  expect_error(MPG_ERR_RANGE, [&] { p.of(16); });
  meshpg::Placement q;
  q = std::move(p);
  cr_assert_null(p.get());
  cr_assert_eq(q.num_nodes(), 2);
  meshpg::Placement one(m);
  cr_assert_eq(one.num_nodes(), 1);
}

Test(placement, strict_misfit_throws) {
  meshpg::Mesh m = dims_mesh("dp=1,tp=16");
  mpg_placement_opts o = eight_per_node(1);
  meshpg::Error e = expect_error(MPG_ERR_TOPO, [&] { meshpg::Placement p(m, o); });
  cr_assert(has(e.detail(), "tp"), "%s", e.what());
}

Test(launch, env_host_and_node_ids) {
  mpg_launch l = meshpg::launch_from_env();
  (void)l;
  cr_assert_not(meshpg::host_identity().empty());
  meshpg::NodeIds n = meshpg::node_ids({"a", "b", "a", "b"});
  cr_assert_eq(n.num_nodes, 2);
  cr_assert(n.node_of == std::vector<int>({0, 1, 0, 1}));
  cr_assert(n.local_rank == std::vector<int>({0, 0, 1, 1}));
}
