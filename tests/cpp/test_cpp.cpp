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
#include <criterion/criterion.h>

#include <meshpg.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

/* ------------------------------------------------------------------------ */
/* Helpers                                                                   */
/* ------------------------------------------------------------------------ */

#define REQUIRE(cond)                                                         \
  do {                                                                        \
    if (!(cond))                                                              \
      throw std::runtime_error(std::string(__FILE__ ":") +                    \
                               std::to_string(__LINE__) + ": failed: " #cond); \
  } while (0)

/* Run f; it must throw meshpg::Error with status `want`.  Returns it. */
template <class F>
static meshpg::Error expect_error(mpg_status want, F&& f) {
  try {
    f();
  } catch (const meshpg::Error& e) {
    if (e.status() != want)
      throw std::runtime_error(std::string("expected ") + mpg_status_name(want) +
                               ", got " + e.what());
    return e;
  }
  throw std::runtime_error(std::string("expected ") + mpg_status_name(want) +
                           ", nothing was thrown");
}

static std::string env_or_fail(const char* var) {
  const char* v = std::getenv(var);
  cr_assert_not_null(v, "%s is not set (run through meson test)", var);
  return v;
}

static std::string data_dir() { return env_or_fail("MESHPG_TEST_DATA"); }

/* Run a shell command with stderr joined; its exit code, output in *out. */
static int run(const std::string& cmd, std::string* out) {
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

static size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) n++;
  return n;
}

static bool has(const std::string& text, const std::string& what) {
  return text.find(what) != std::string::npos;
}

/* The seed mesh of DESIGN.md: dp=2, tp=2, cp=2 with dp_cp = [dp, cp]. */
static meshpg::Spec seed_spec() {
  meshpg::Spec s;
  s.set_mesh("dp=2,tp=2,cp=2").add_flatten("dp_cp", "dp,cp").validate();
  return s;
}

#define EXPECT_RUN_OK(run)                                                      \
  cr_assert((run).ok(), "run_threads: %s (rank %d): %s", mpg_status_name((run).status), \
            (run).failed_rank, (run).message.c_str())

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

Test(placement, two_nodes_keep_tp_inside) {
  meshpg::Spec s;
  s.set_mesh("dp=2,tp=8");
  meshpg::Mesh m(s);
  mpg_placement_opts o = MPG_PLACEMENT_OPTS_INIT;
  o.topology.gpus_per_node = 8;
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
  meshpg::Spec s;
  s.set_mesh("dp=1,tp=16");
  meshpg::Mesh m(s);
  mpg_placement_opts o = MPG_PLACEMENT_OPTS_INIT;
  o.topology.gpus_per_node = 8;
  o.topology.strict = 1;
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

/* ------------------------------------------------------------------------ */
/* Collectives on a thread world                                             */
/* ------------------------------------------------------------------------ */

template <class T>
static T as(long v) {
  return static_cast<T>(v);
}

/* Every collective of T on the dp_cp group (and send/recv on tp), checked
 * against values computed from the members' ranks. */
template <class T>
static void typed_collectives(meshpg::Ctx& ctx) {
  const int rank = ctx.rank();
  meshpg::Group g = ctx.group("dp_cp");
  const std::vector<int> mem = g.members();
  const int n = g.size();
  REQUIRE(n == 4 && mem.size() == 4u && mem[static_cast<size_t>(g.position())] == rank);
  long msum = 0, mmax = 0, mmin = 1 << 30;
  for (int m : mem) {
    msum += m + 1;
    mmax = std::max<long>(mmax, m + 1);
    mmin = std::min<long>(mmin, m + 1);
  }

  // all_reduce: vector in place, pointers, one value; sum, max, min, avg.
  std::vector<T> v(5);
  for (size_t i = 0; i < v.size(); i++) v[i] = as<T>((rank + 1) * static_cast<long>(i + 1));
  std::vector<T> sum = v;
  g.all_reduce(sum);
  std::vector<T> mx(5);
  g.all_reduce(v.data(), mx.data(), 5, MPG_OP_MAX);
  for (size_t i = 0; i < 5; i++) {
    REQUIRE(sum[i] == as<T>(msum * static_cast<long>(i + 1)));
    REQUIRE(mx[i] == as<T>(mmax * static_cast<long>(i + 1)));
  }
  REQUIRE(g.all_reduce_value(as<T>(rank + 1), MPG_OP_MIN) == as<T>(mmin));
  REQUIRE(g.all_reduce_value(as<T>(4 * (g.position() + 1)), MPG_OP_AVG) == as<T>(10));
  std::vector<T> inplace = v;
  g.all_reduce(inplace.data(), inplace.size(), MPG_OP_SUM);
  REQUIRE(inplace == sum);

  // broadcast from position 1.
  T b[3] = {as<T>(rank), as<T>(rank), as<T>(rank)};
  g.broadcast(b, 3, 1);
  REQUIRE(b[0] == as<T>(mem[1]) && b[2] == as<T>(mem[1]));
  std::vector<T> bv(2, as<T>(rank));
  g.broadcast(bv, 3);
  REQUIRE(bv[1] == as<T>(mem[3]));

  // all_gather, vector and pointer forms.
  std::vector<T> all = g.all_gather(std::vector<T>{as<T>(rank), as<T>(2 * rank)});
  REQUIRE(all.size() == 8u);
  for (int p = 0; p < n; p++) {
    REQUIRE(all[2 * static_cast<size_t>(p)] == as<T>(mem[static_cast<size_t>(p)]));
    REQUIRE(all[2 * static_cast<size_t>(p) + 1] == as<T>(2 * mem[static_cast<size_t>(p)]));
  }
  T one = as<T>(rank);
  T gathered[4];
  g.all_gather(&one, gathered, 1);
  REQUIRE(gathered[3] == as<T>(mem[3]));

  // reduce_scatter: block p of every member's send, summed.
  std::vector<T> send(2 * static_cast<size_t>(n));
  for (size_t j = 0; j < send.size(); j++) send[j] = as<T>(static_cast<long>(j) + rank);
  T recv[2];
  g.reduce_scatter(send.data(), recv, 2);
  for (long k = 0; k < 2; k++) {
    long want = 0;
    for (int m : mem) want += 2 * g.position() + k + m;
    REQUIRE(recv[k] == as<T>(want));
  }

  // all_to_all: block j (2 elements) of position i's send is 10 i + j;
  // vector form, then the pointer form through a Work.
  const long me = g.position();
  std::vector<T> a2s(2 * static_cast<size_t>(n));
  for (size_t j = 0; j < a2s.size(); j++) a2s[j] = as<T>(10 * me + static_cast<long>(j / 2));
  std::vector<T> a2r = g.all_to_all(a2s);
  REQUIRE(a2r.size() == a2s.size());
  for (size_t j = 0; j < a2r.size(); j++) REQUIRE(a2r[j] == as<T>(10 * static_cast<long>(j / 2) + me));
  std::vector<T> a2p(a2s.size());
  g.all_to_all_async(a2s.data(), a2p.data(), 2).wait();
  REQUIRE(a2p == a2r);
  expect_error(MPG_ERR_INVALID, [&] { g.all_to_all(std::vector<T>(3)); });

  // all_to_all_v: position i sends i + j elements of value 100 i + j to
  // position j (0 from 0 to 0), packed; then the pointer form, async.
  std::vector<size_t> sc(static_cast<size_t>(n)), rc(sc.size()), sd(sc.size()), rd(sc.size());
  std::vector<T> vs;
  size_t rtot = 0;
  for (size_t j = 0; j < sc.size(); j++) {
    sc[j] = rc[j] = static_cast<size_t>(me) + j;
    sd[j] = vs.size();
    rd[j] = rtot;
    rtot += rc[j];
    for (size_t k = 0; k < sc[j]; k++) vs.push_back(as<T>(100 * me + static_cast<long>(j)));
  }
  std::vector<T> vr = g.all_to_all_v(vs, sc, rc);
  REQUIRE(vr.size() == rtot);
  for (size_t i = 0, at = 0; i < rc.size(); i++)
    for (size_t k = 0; k < rc[i]; k++) REQUIRE(vr[at++] == as<T>(100 * static_cast<long>(i) + me));
  std::vector<T> vp(rtot);
  g.all_to_all_v_async(vs.data(), sc.data(), sd.data(), vp.data(), rc.data(), rd.data()).wait();
  REQUIRE(vp == vr);

  // send / recv with the other member of tp.
  meshpg::Group tp = ctx.group("tp");
  const int peer = 1 - tp.position();
  T out[2] = {as<T>(rank), as<T>(rank + 100)};
  T in[2] = {};
  meshpg::Work r = tp.recv_async(in, 2, peer);
  tp.send(out, 2, peer);
  r.wait();
  REQUIRE(in[0] == as<T>(tp.member(peer)) && in[1] == as<T>(tp.member(peer) + 100));
  // The same exchange as one batch (both ways at once), blocking and async.
  T in2[2] = {};
  tp.p2p_batch({meshpg::Group::send_op(out, 2, peer), meshpg::Group::recv_op(in2, 2, peer)});
  REQUIRE(in2[0] == as<T>(tp.member(peer)) && in2[1] == as<T>(tp.member(peer) + 100));
  T in3[2] = {};
  tp.p2p_batch_async({meshpg::Group::recv_op(in3, 2, peer), meshpg::Group::send_op(out, 2, peer)})
      .wait();
  REQUIRE(in3[0] == in2[0] && in3[1] == in2[1]);
  expect_error(MPG_ERR_INVALID, [&] { tp.p2p_batch({meshpg::Group::send_op(out, 2, tp.position())}); });

  // Asynchronous: test() until done, then wait().
  std::vector<T> res(5);
  meshpg::Work w = g.all_reduce_async(v.data(), res.data(), 5, MPG_OP_SUM);
  while (!w.test()) {
  }
  w.wait();
  REQUIRE(!w.pending());
  REQUIRE(res == sum);

  if constexpr (std::is_floating_point_v<T>) {
    std::vector<T> scaled(5);
    g.all_reduce_scaled(v.data(), scaled.data(), 5, 0.5);
    REQUIRE(scaled[0] == as<T>(msum) / 2);
    g.all_reduce_scaled_async(v.data(), scaled.data(), 5, 0.25).wait();
    REQUIRE(scaled[0] == as<T>(msum) / 4);
  } else {
    std::vector<T> scaled(5);
    expect_error(MPG_ERR_INVALID, [&] { g.all_reduce_scaled(v.data(), scaled.data(), 5, 0.5); });
  }
}

Test(threads, typed_collectives_every_dtype, .timeout = 120) {
  meshpg::Mesh mesh(seed_spec());
  meshpg::ThreadRun run = meshpg::run_threads(8, 30, [&](const mpg_init_opts& opts) {
    meshpg::Ctx ctx(mesh, opts);
    typed_collectives<float>(ctx);
    typed_collectives<double>(ctx);
    typed_collectives<std::int32_t>(ctx);
    typed_collectives<std::int64_t>(ctx);
    ctx.group("world").barrier();
  });
  EXPECT_RUN_OK(run);
  cr_assert_eq(run.statuses.size(), 8u);
  for (size_t r = 0; r < 8; r++) {
    cr_assert_eq(run.statuses[r], MPG_OK);
    cr_assert(run.messages[r].empty());
  }
}

Test(threads, raw_dtype_overloads_for_half_types, .timeout = 120) {
  meshpg::Mesh mesh(seed_spec());
  meshpg::ThreadRun run = meshpg::run_threads(8, 30, [&](const mpg_init_opts& opts) {
    meshpg::Ctx ctx(mesh, opts);
    meshpg::Group g = ctx.group("dp_cp");
    // 1.0 in bf16 and f16; four members sum to 4.0.
    std::uint16_t bf[3] = {0x3F80, 0x3F80, 0x3F80};
    std::uint16_t bsum[3];
    g.all_reduce(bf, bsum, 3, MPG_BF16, MPG_OP_SUM);
    REQUIRE(bsum[0] == 0x4080 && bsum[2] == 0x4080);
    std::uint16_t hf[2] = {0x3C00, 0x3C00};
    g.all_reduce_async(hf, hf, 2, MPG_F16, MPG_OP_SUM).wait();
    REQUIRE(hf[0] == 0x4400 && hf[1] == 0x4400);
    g.all_reduce_scaled(bf, bsum, 3, MPG_BF16, 0.25);  // 4 x 0.25 = 1.0
    REQUIRE(bsum[1] == 0x3F80);
    std::uint16_t mine = static_cast<std::uint16_t>(ctx.rank());
    std::uint16_t all[4];
    g.all_gather(&mine, all, 1, MPG_BF16);
    REQUIRE(all[2] == g.member(2));
    std::uint16_t b = static_cast<std::uint16_t>(ctx.rank());
    g.broadcast(&b, 1, MPG_F16, 0);
    REQUIRE(b == g.member(0));
  });
  EXPECT_RUN_OK(run);
}

Test(threads, group_views_and_ctx_members, .timeout = 120) {
  meshpg::Mesh mesh(seed_spec());
  meshpg::ThreadRun run = meshpg::run_threads(8, 30, [&](const mpg_init_opts& opts) {
    meshpg::Ctx ctx(mesh, opts);
    REQUIRE(ctx);
    REQUIRE(ctx.rank() == opts.rank && ctx.world_size() == 8);
    REQUIRE(ctx.launcher_rank() == opts.rank && ctx.local_rank() == opts.rank);
    REQUIRE(ctx.backend() == MPG_BACKEND_THREAD);
    REQUIRE(ctx.mesh() == mesh.get());
    REQUIRE(ctx.num_nodes() == 1);
    REQUIRE(ctx.status() == MPG_OK);
    REQUIRE(ctx.binding().mode == MPG_BIND_NONE);

    meshpg::Group dp = ctx.group("dp");
    REQUIRE(dp.name() == "dp" && dp.size() == 2);
    REQUIRE(dp.index() == mesh.group_of(mesh.dimset("dp"), ctx.rank()).index);
    REQUIRE(dp.members() == mesh.group_members(mesh.dimset("dp"), dp.index()));
    REQUIRE(ctx.group_at(mesh.dimset("dp")).get() == dp.get());
    meshpg::Group big = ctx.group_dims("dp_cp,tp");
    REQUIRE(big.size() == 8);
    meshpg::Group first = ctx.group_select("dp", {0});
    REQUIRE(static_cast<bool>(first) == (dp.position() == 0));
    if (first) REQUIRE(first.size() == 1 && first.member(0) == ctx.rank());
    meshpg::Group intra = ctx.group_partial("dp_cp,tp", 2);
    meshpg::Group inter = ctx.group_partial("dp_cp,tp", 2, true);
    REQUIRE(intra.size() == 4 && inter.size() == 2);
    REQUIRE(intra.member(intra.position()) == ctx.rank() && inter.member(inter.position()) == ctx.rank());
    REQUIRE(intra.member(0) == big.member(big.position() / 4 * 4));
    REQUIRE(inter.member(1) == big.member(big.position() % 4 + 4));
    expect_error(MPG_ERR_RANGE, [&] { ctx.group_partial("dp", 3); });
    meshpg::Group none;
    REQUIRE(!none && none.get() == nullptr);
    expect_error(MPG_ERR_NOT_FOUND, [&] { ctx.group("xyz"); });
    expect_error(MPG_ERR_RANGE, [&] { dp.member(2); });
    expect_error(MPG_ERR_INVALID, [&] { dp.broadcast(static_cast<float*>(nullptr), 1, 0); });

    void* mem = ctx.mem_alloc(256);
    REQUIRE(mem != nullptr && static_cast<unsigned char*>(mem)[255] == 0);
    std::memset(mem, 1, 256);
    ctx.mem_zero(mem, 256);
    REQUIRE(static_cast<unsigned char*>(mem)[7] == 0);
    ctx.mem_free(mem);
    void* stream = ctx.stream_create();
    REQUIRE(stream == nullptr);
    ctx.stream_order(stream, stream);
    ctx.stream_destroy(stream);

    ctx.group("world").barrier();
    ctx.close();
    REQUIRE(!ctx && ctx.get() == nullptr);
  });
  EXPECT_RUN_OK(run);
}

Test(threads, work_move_and_destructor_waits, .timeout = 120) {
  meshpg::Spec s;
  s.set_mesh("dp=2");
  meshpg::Mesh mesh(s);
  meshpg::ThreadRun run = meshpg::run_threads(2, 30, [&](const mpg_init_opts& opts) {
    meshpg::Ctx ctx(mesh, opts);
    meshpg::Group g = ctx.group("dp");
    meshpg::Work empty;
    REQUIRE(!empty.pending() && empty.test());
    empty.wait();  // nothing to wait for

    std::int64_t x = ctx.rank() + 1, y = 0;
    {
      meshpg::Work a = g.all_reduce_async(&x, &y, 1, MPG_OP_SUM);
      meshpg::Work b(std::move(a));
      REQUIRE(!a.pending());
      // b goes out of scope without wait(): its destructor waits.
    }
    REQUIRE(y == 3);

    std::int64_t z = 0;
    meshpg::Work c = g.all_reduce_async(&x, &z, 1, MPG_OP_MAX);
    meshpg::Work d = g.barrier_async();
    c = std::move(d);  // waits for the all_reduce, then holds the barrier
    REQUIRE(z == 2);
    REQUIRE(!d.pending());
    c.wait();

    std::int64_t u = 0;
    meshpg::Work e = g.all_reduce_async(&x, &u, 1, MPG_OP_MIN);
    mpg_work* raw = e.release();
    REQUIRE(!e.pending());
    REQUIRE(mpg_work_wait(raw) == MPG_OK && u == 1);

    // A shorter timeout for what follows; a bad one throws ERR_INVALID.
    ctx.set_timeout(30);
    expect_error(MPG_ERR_INVALID, [&] { ctx.set_timeout(0); });

    // After an abort, collectives throw ERR_ABORTED.
    g.barrier();
    ctx.abort();
    REQUIRE(ctx.status() == MPG_ERR_ABORTED);
    expect_error(MPG_ERR_ABORTED, [&] { g.all_reduce_value(x); });
    expect_error(MPG_ERR_ABORTED, [&] { g.barrier_async().wait(); });
  });
  EXPECT_RUN_OK(run);
}

Test(threads, sync_through_the_cpp_layer, .timeout = 120) {
  meshpg::Spec spec = seed_spec();
  meshpg::Mesh mesh(spec);
  meshpg::ThreadRun run = meshpg::run_threads(8, 30, [&](const mpg_init_opts& opts) {
    meshpg::Ctx ctx(mesh, opts);
    const int rank = ctx.rank();
    meshpg::Sync sync(ctx, spec.sync_opts());
    const int w = sync.add_param<float>("w", 100);
    const int b = sync.add_param("b", 10, MPG_F64);
    const mpg_param_opts ln_opts = meshpg::param_opts("dp_cp,tp");
    const int ln = sync.add_param<float>("ln", 4, &ln_opts);
    REQUIRE(w == 0 && b == 1 && ln == 2);
    expect_error(MPG_ERR_STATE, [&] { sync.grad(w); });
    expect_error(MPG_ERR_INVALID, [&] { sync.add_param<float>("w", 3); });
    sync.commit();
    expect_error(MPG_ERR_STATE, [&] { sync.add_param<float>("late", 1); });
    expect_error(MPG_ERR_RANGE, [&] { sync.grad(99); });

    float* gw = sync.grad<float>(w);
    double* gb = sync.grad<double>(b);
    float* gl = static_cast<float*>(sync.grad(ln));
    meshpg::Group dpcp = sync.param_group(w);
    REQUIRE(dpcp.name() == "dp_cp" && dpcp.size() == 4);
    REQUIRE(sync.param_group(ln).size() == 8);
    double avg = 0;
    for (int m : dpcp.members()) avg += (m + 1) / 4.0;

    // One step, everything at once.
    for (int i = 0; i < 100; i++) gw[i] = static_cast<float>(rank + 1);
    for (int i = 0; i < 10; i++) gb[i] = rank + 1;
    for (int i = 0; i < 4; i++) gl[i] = static_cast<float>(rank + 1);
    sync.all(0);
    REQUIRE(sync.grads_valid());
    REQUIRE(gw[99] == static_cast<float>(avg) && gb[9] == avg && gl[3] == 4.5f);

    // Two micro-batches, marked ready in backward order.
    sync.zero_grads();
    for (int mb = 0; mb < 2; mb++) {
      sync.begin(1, mb == 1);
      for (int p : {ln, b, w}) {
        if (p == w) for (int i = 0; i < 100; i++) gw[i] += static_cast<float>(rank + 1);
        if (p == b) for (int i = 0; i < 10; i++) gb[i] += rank + 1;
        if (p == ln) for (int i = 0; i < 4; i++) gl[i] += static_cast<float>(rank + 1);
        sync.mark_ready(p);
      }
      sync.finish();
    }
    REQUIRE(gw[0] == static_cast<float>(2 * avg) && gb[0] == 2 * avg && gl[0] == 9.0f);
    mpg_sync_stats st = sync.stats();
    REQUIRE(st.num_params == 3 && st.num_buffers == 3 && st.launched_buckets >= 4);

    sync.begin(2, true);
    expect_error(MPG_ERR_STATE, [&] { sync.begin(3, true); });
    sync.finish();
    expect_error(MPG_ERR_STATE, [&] { sync.finish(); });

    meshpg::Sync moved = std::move(sync);
    REQUIRE(!sync && moved);
    moved.close();
    REQUIRE(!moved);
  });
  EXPECT_RUN_OK(run);
}

/* ------------------------------------------------------------------------ */
/* run_threads                                                               */
/* ------------------------------------------------------------------------ */

Test(run_threads, exceptions_become_statuses_and_messages, .timeout = 60) {
  meshpg::ThreadRun run = meshpg::run_threads(4, 30, [](const mpg_init_opts& opts) {
    if (opts.rank == 3) throw meshpg::Error(MPG_ERR_RANGE, "rank three is out of range");
  });
  cr_assert_not(run.ok());
  cr_assert_eq(run.status, MPG_ERR_RANGE);
  cr_assert_eq(run.failed_rank, 3);
  cr_assert_str_eq(run.message.c_str(), "ERR_RANGE: rank three is out of range");
  cr_assert_eq(run.statuses[3], MPG_ERR_RANGE);
  cr_assert_eq(run.statuses[0], MPG_OK);
  cr_assert(run.messages[0].empty());
  cr_assert_eq(run.messages[3], run.message);
}

Test(run_threads, other_exceptions, .timeout = 60) {
  meshpg::ThreadRun run = meshpg::run_threads(3, 30, [](const mpg_init_opts& opts) {
    if (opts.rank == 0) throw std::runtime_error("boom");
    if (opts.rank == 1) throw std::bad_alloc();
    if (opts.rank == 2) throw 42;
  });
  cr_assert_not(run.ok());
  cr_assert_eq(run.statuses[0], MPG_ERR_STATE);
  cr_assert_eq(run.messages[0], std::string("boom"));
  cr_assert_eq(run.statuses[1], MPG_ERR_NOMEM);
  cr_assert_eq(run.statuses[2], MPG_ERR_STATE);
  cr_assert_eq(run.messages[2], std::string("unknown exception"));
  cr_assert_eq(run.message, run.messages[static_cast<size_t>(run.failed_rank)]);
  cr_assert_eq(run.status, run.statuses[static_cast<size_t>(run.failed_rank)]);
}

Test(run_threads, invalid_arguments_are_statuses, .timeout = 60) {
  meshpg::ThreadRun run = meshpg::run_threads(0, 30, [](const mpg_init_opts&) {});
  cr_assert_eq(run.status, MPG_ERR_INVALID);
  cr_assert(has(run.message, "nranks"), "%s", run.message.c_str());
  cr_assert_eq(run.failed_rank, -1);
  meshpg::ThreadRun r2 = meshpg::run_threads(2, 0, [](const mpg_init_opts&) {});
  cr_assert_eq(r2.status, MPG_ERR_INVALID);
  cr_assert(has(r2.message, "timeout"), "%s", r2.message.c_str());
}

/* A rank that throws while its peers wait for it in a collective: its Ctx
 * is destroyed by the unwinding and aborts first, so the peers fail with
 * ERR_ABORTED at once, not after the 60 s timeout. */
Test(run_threads, a_throwing_rank_aborts_its_peers, .timeout = 60) {
  meshpg::Mesh mesh(seed_spec());
  auto t0 = std::chrono::steady_clock::now();
  meshpg::ThreadRun run = meshpg::run_threads(8, 60, [&](const mpg_init_opts& opts) {
    meshpg::Ctx ctx(mesh, opts);
    meshpg::Group world = ctx.group("world");
    if (ctx.rank() == 5) throw std::runtime_error("rank 5 gives up");
    float x = 1;
    world.all_reduce(&x, &x, 1);
  });
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  cr_assert_lt(secs, 20.0, "peers waited %.1f s", secs);
  cr_assert_not(run.ok());
  cr_assert_eq(run.statuses[5], MPG_ERR_STATE);
  cr_assert_eq(run.messages[5], std::string("rank 5 gives up"));
  for (size_t r = 0; r < 8; r++) {
    if (r == 5) continue;
    cr_assert_eq(run.statuses[r], MPG_ERR_ABORTED, "rank %zu: %s", r, run.messages[r].c_str());
  }
}

/* ------------------------------------------------------------------------ */
/* The example trainer                                                       */
/* ------------------------------------------------------------------------ */

static std::string trainer() { return "'" + env_or_fail("MESHPG_TRAINER") + "'"; }
static std::string example(const char* name) { return "'" + data_dir() + "/../examples/" + name + "'"; }
static std::string fixture(const char* name) { return "'" + data_dir() + "/cpp/" + name + "'"; }

/* The trainer ran `steps` steps on `ranks` ranks and said OK. */
static void expect_trained(const std::string& cmd, const std::string& out, int rc, int ranks,
                           int steps) {
  cr_assert_eq(rc, 0, "%s\nexit %d\n%s", cmd.c_str(), rc, out.c_str());
  cr_assert(has(out, "\nOK\n"), "%s\n%s", cmd.c_str(), out.c_str());
  std::string ok = "grads ok on " + std::to_string(ranks) + " ranks";
  cr_assert_eq(count_of(out, ok), static_cast<size_t>(steps), "%s: want %d x '%s'\n%s",
               cmd.c_str(), steps, ok.c_str(), out.c_str());
  cr_assert_eq(count_of(out, "step "), static_cast<size_t>(steps), "%s", out.c_str());
}

Test(trainer, default_seed_mesh_8_threads, .timeout = 120) {
  std::string out, cmd = trainer() + " --steps 3";
  int rc = run(cmd, &out);
  expect_trained(cmd, out, rc, 8, 3);
  cr_assert(has(out, "mesh dp=2,tp=2,cp=2 on 8 ranks (thread backend)"), "%s", out.c_str());
  cr_assert(has(out, "gradients over dp,cp"), "%s", out.c_str());
}

Test(trainer, explicit_threads_and_microbatches, .timeout = 120) {
  std::string out,
      cmd = trainer() + " " + example("seed.toml") + " --threads 8 --steps 2 --microbatches 3";
  expect_trained(cmd, out, run(cmd, &out), 8, 2);
  cr_assert(has(out, "2 steps x 3 micro-batches"), "%s", out.c_str());
}

Test(trainer, fsdp_reduces_over_cp_only, .timeout = 120) {
  std::string out, cmd = trainer() + " " + example("fsdp.toml") + " --steps 2";
  expect_trained(cmd, out, run(cmd, &out), 8, 2);
  cr_assert(has(out, "gradients over cp"), "%s", out.c_str());
}

Test(trainer, pipeline_mesh_16_threads, .timeout = 180) {
  std::string out, cmd = trainer() + " " + example("pp4d.toml") + " --threads 16 --steps 2";
  expect_trained(cmd, out, run(cmd, &out), 16, 2);
  cr_assert(has(out, "mesh pp=2,dp=2,cp=2,tp=2"), "%s", out.c_str());
}

Test(trainer, mesh_flag_with_an_inferred_dim, .timeout = 120) {
  std::string out, cmd = trainer() + " --mesh dp=-1,cp=2,tp=2 --threads 4 --steps 2";
  expect_trained(cmd, out, run(cmd, &out), 4, 2);
  cr_assert(has(out, "mesh dp=1,cp=2,tp=2"), "%s", out.c_str());
  // Without --threads the world size is unknown: a usage error.
  std::string cmd2 = trainer() + " --mesh dp=-1,cp=2,tp=2";
  int rc = run(cmd2, &out);
  cr_assert_eq(rc, 2, "%s\n%s", cmd2.c_str(), out.c_str());
  cr_assert(has(out, "--threads"), "%s", out.c_str());
}

Test(trainer, params_file_with_comments, .timeout = 120) {
  std::string out, cmd = trainer() + " --params " + fixture("tiny.params") + " --steps 2";
  expect_trained(cmd, out, run(cmd, &out), 8, 2);
  cr_assert(has(out, "4 params (1090 floats per rank)"), "%s", out.c_str());
}

Test(trainer, bad_params_file_names_file_and_line, .timeout = 60) {
  std::string out, cmd = trainer() + " --params " + fixture("bad.params");
  int rc = run(cmd, &out);
  cr_assert_eq(rc, 1, "%s\n%s", cmd.c_str(), out.c_str());
  cr_assert(has(out, "bad.params:4: param \"l0.w\": shape 16x16 has 256 elements, not 250"),
            "%s", out.c_str());
  cmd = trainer() + " --params /nonexistent/p.params";
  rc = run(cmd, &out);
  cr_assert_eq(rc, 1, "%s\n%s", cmd.c_str(), out.c_str());
  cr_assert(has(out, "/nonexistent/p.params: cannot open"), "%s", out.c_str());
}

Test(trainer, bad_spec_exits_1_with_position, .timeout = 60) {
  char path[] = "/tmp/meshpg_cpp_spec_XXXXXX";
  int fd = mkstemp(path);
  cr_assert_geq(fd, 0);
  const char bad[] = "[mesh]\ndims = [ { name = \"dp\", size = 0 } ]\n";
  cr_assert_eq(write(fd, bad, sizeof bad - 1), static_cast<ssize_t>(sizeof bad - 1));
  close(fd);
  std::string out, cmd = trainer() + " " + path;
  int rc = run(cmd, &out);
  unlink(path);
  cr_assert_eq(rc, 1, "%s\n%s", cmd.c_str(), out.c_str());
  cr_assert(has(out, "trainer: ERR_SPEC: " + std::string(path) + ":2:"), "%s", out.c_str());
}

Test(trainer, usage_errors_exit_2_and_help_lists_every_flag, .timeout = 60) {
  std::string out;
  for (const char* args : {"--bogus", "--threads 0", "--steps x", "--backend nccl",
                           "--backend mpi --threads 2", "--timeout -1", "a.toml b.toml",
                           "--params"}) {
    std::string cmd = trainer() + " " + args;
    int rc = run(cmd, &out);
    cr_assert_eq(rc, 2, "%s: exit %d\n%s", cmd.c_str(), rc, out.c_str());
    cr_assert(has(out, "usage: trainer"), "%s", out.c_str());
  }
  int rc = run(trainer() + " --help", &out);
  cr_assert_eq(rc, 0);
  for (const char* flag : {"--threads", "--backend", "--mesh", "--params", "--steps",
                           "--microbatches", "--timeout", "--help"})
    cr_assert(has(out, flag), "--help does not mention %s:\n%s", flag, out.c_str());
}

Test(trainer, mpi_backend_without_launcher_fails, .timeout = 60) {
  std::string out, cmd = trainer() + " --backend mpi";
  int rc = run(cmd, &out);
  cr_assert_eq(rc, 1, "%s\n%s", cmd.c_str(), out.c_str());
  cr_assert(has(out, "mpirun"), "%s", out.c_str());
}

/* Shared-memory transports only, no binding: small shared machines. */
#define MPIRUN "timeout -k 5 240 mpirun --oversubscribe --bind-to none --mca btl self,vader " \
               "--mca btl_vader_single_copy_mechanism none "

static void require_mpi() {
  const char* m = std::getenv("MESHPG_HAVE_MPI");
  if (!m || std::strcmp(m, "1") != 0) cr_skip_test("the MPI backend is not built");
}

Test(trainer, mpirun_4_ranks_mpi_backend, .timeout = 300) {
  require_mpi();
  std::string out, cmd = std::string(MPIRUN "-np 4 ") + trainer() +
                         " --backend mpi --mesh dp=-1,cp=2,tp=2 --steps 3";
  expect_trained(cmd, out, run(cmd, &out), 4, 3);
  cr_assert(has(out, "on 4 ranks (mpi backend)"), "%s", out.c_str());
  cr_assert_eq(count_of(out, "OK"), 1u, "only rank 0 says OK:\n%s", out.c_str());
}

Test(trainer, mpirun_picks_the_mpi_backend_by_default, .timeout = 300) {
  require_mpi();
  std::string out, cmd = std::string(MPIRUN "-np 2 ") + trainer() + " " + example("fsdp.toml") +
                         " --mesh dp=-1,cp=2 --steps 2";
  expect_trained(cmd, out, run(cmd, &out), 2, 2);
  cr_assert(has(out, "(mpi backend)"), "%s", out.c_str());
}

/* ------------------------------------------------------------------------ */
/* valgrind                                                                  */
/* ------------------------------------------------------------------------ */

static std::string valgrind() {
  if (const char *san = std::getenv("MESHPG_SANITIZER"))
    cr_skip_test("a sanitizer build (-Db_sanitize=%s): valgrind cannot run it", san);
  if (std::system("command -v valgrind >/dev/null 2>&1") != 0)
    cr_skip_test("valgrind is not installed");
  return "valgrind -q --error-exitcode=3 --leak-check=full --errors-for-leak-kinds=definite "
         "--show-leak-kinds=definite --num-callers=40 --suppressions='" +
         data_dir() + "/topo/valgrind-hwloc.supp' ";
}

Test(valgrind, raii_worker_frees_everything, .timeout = 600) {
  std::string out, cmd = valgrind() + "'" + env_or_fail("MESHPG_CPP_RAII_WORKER") + "'";
  int rc = run(cmd, &out);
  cr_assert_eq(rc, 0, "%s: exit %d\n%s", cmd.c_str(), rc, out.c_str());
  cr_assert(has(out, "raii_worker OK"), "%s", out.c_str());
  cr_assert_not(has(out, "definitely lost"), "%s", out.c_str());
}

Test(valgrind, trainer_threads_are_memory_clean, .timeout = 600) {
  std::string out, cmd = valgrind() + trainer() + " --mesh dp=-1,cp=2,tp=2 --threads 4 " +
                         "--params " + fixture("tiny.params") + " --steps 2";
  int rc = run(cmd, &out);
  expect_trained(cmd, out, rc, 4, 2);
  cr_assert_not(has(out, "definitely lost"), "%s", out.c_str());
}

/* Shard mode through the C++ layer: owned ranges, the parameter view and
 * the gathers. */
Test(threads, shard_mode_through_the_cpp_layer, .timeout = 120) {
  meshpg::Spec spec = seed_spec();
  meshpg::Mesh mesh(spec);
  meshpg::ThreadRun run = meshpg::run_threads(8, 30, [&](const mpg_init_opts& opts) {
    meshpg::Ctx ctx(mesh, opts);
    mpg_sync_opts so = MPG_SYNC_OPTS_INIT;
    so.sync.mode = MPG_SYNC_SHARD;
    meshpg::Sync sync(ctx, so);
    const int w = sync.add_param<float>("w", 1000);
    sync.commit();
    const int S = sync.stats().shard_size;
    REQUIRE(S == 4);
    meshpg::Group dpcp = sync.param_group(w);
    float* g = sync.grad<float>(w);
    float* p = sync.param<float>(w);
    for (int i = 0; i < 1000; i++) g[i] = static_cast<float>(dpcp.position());
    sync.all(0);
    mpg_shard_info mine = sync.shard(w);
    REQUIRE(mine.sharded == 1 && mine.count > 0);
    for (std::size_t i = mine.param_offset; i < mine.param_offset + mine.count; i++) {
      REQUIRE(g[i] == 1.5f);
      p[i] = static_cast<float>(i);
    }
    expect_error(MPG_ERR_STATE, [&] { sync.gather_wait(w); });
    sync.gather_begin();
    sync.gather_wait(w);
    for (int i = 0; i < 1000; i++) REQUIRE(p[i] == static_cast<float>(i));
  });
  EXPECT_RUN_OK(run);
}
