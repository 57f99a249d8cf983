/* Walks every owner, move and exception path of meshpg.hpp in one process,
 * for valgrind (tests/cpp/test_cpp.cpp runs it with --leak-check=full):
 * constructors that throw, moves and move-assignments that free the old
 * handle, Works destroyed while pending, a Sync destroyed with a step open
 * by an exception, and ranks that throw while their peers wait (their Ctx
 * aborts on unwinding).  Prints "raii_worker OK" and exits 0, or prints
 * what went wrong and exits 1.  MESHPG_TEST_DATA names tests/. */
#include <meshpg.hpp>

#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace {

void require(bool ok, const char* what) {
  if (!ok) throw std::runtime_error(what);
}

template <class F>
void expect_error(mpg_status want, F&& f, const char* what) {
  try {
    f();
  } catch (const meshpg::Error& e) {
    require(e.status() == want, what);
    return;
  }
  throw std::runtime_error(std::string(what) + ": nothing was thrown");
}

meshpg::Spec seed() {
  meshpg::Spec s;
  s.set_mesh("dp=2,tp=2,cp=2").add_flatten("dp_cp", "dp,cp");
  return s;
}

void owners(const std::string& data) {
  expect_error(MPG_ERR_SPEC, [] { meshpg::Spec::load_string("[mesh]\ndims = 3\n", "x.toml"); },
               "bad spec");
  expect_error(MPG_ERR_SPEC, [] { meshpg::Mesh m(seed(), 3); }, "bad world size");
  expect_error(MPG_ERR_IO, [] { meshpg::Topo::load_xml("/nonexistent.xml"); }, "missing xml");

  meshpg::Mesh a(seed());
  meshpg::Mesh b(meshpg::Spec().set_mesh("dp=4"));
  b = std::move(a);  // frees b's mesh
  meshpg::Mesh c(std::move(b));
  require(c.world_size() == 8 && !a && !b, "mesh moves");
  meshpg::Mesh d(c.release());
  require(!c && d, "mesh release");

  meshpg::Topo t = meshpg::Topo::load_synthetic("pack:2 numa:1 core:2 pu:1");
  meshpg::Topo x = meshpg::Topo::load_xml(data + "/topologies/dgx-h100.xml");
  require(x.gpu(0).bus_id != nullptr && x.num_nics() > 0, "xml topology");
  t = std::move(x);  // frees the synthetic one
  require(t.num_gpus() == 8 && !x, "topo moves");
  expect_error(MPG_ERR_RANGE, [&] { t.gpu(99); }, "gpu range");

  mpg_placement_opts po = MPG_PLACEMENT_OPTS_INIT;
  po.topology.gpus_per_node = 4;
  meshpg::Placement p(d, po);
  meshpg::Placement q(d);
  q = std::move(p);
  require(q.num_nodes() == 2 && !p, "placement moves");
  po.topology.strict = 1;
  po.topology.gpus_per_node = 1;  // tp and cp would cross nodes
  expect_error(MPG_ERR_TOPO, [&] { meshpg::Placement bad(d, po); }, "strict placement");
}

void ranks() {
  meshpg::Spec spec = seed();
  meshpg::Mesh mesh(spec);

  // A full life: groups, works (one destroyed pending), a sync.
  meshpg::ThreadRun ok = meshpg::run_threads(8, 30, [&](const mpg_init_opts& opts) {
    meshpg::Ctx last;  // declared first, destroyed last: it ends up owning the context
    meshpg::Ctx ctx(mesh, opts);
    meshpg::Group g = ctx.group("dp_cp");
    std::vector<float> v(64, 1.0f);
    g.all_reduce(v);
    { meshpg::Work pending = g.all_reduce_async(v.data(), v.data(), v.size()); }
    meshpg::Work w = g.barrier_async();
    meshpg::Work w2 = std::move(w);
    std::vector<double> all = g.all_gather(std::vector<double>{1.0, 2.0});
    meshpg::Group sel = ctx.group_select("dp", {1});
    meshpg::Group dims = ctx.group_dims("dp_cp,tp");
    void* mem = ctx.mem_alloc(1024);
    ctx.mem_free(mem);

    meshpg::Sync sync(ctx, spec.sync_opts());
    int a = sync.add_param<float>("a", 1000);
    sync.add_param<double>("b", 10);
    sync.commit();
    float* ga = sync.grad<float>(a);
    ga[0] = 1.0f;
    sync.all(0);
    meshpg::Sync moved(std::move(sync));
    sync = std::move(moved);
    last = std::move(ctx);  // the Syncs are destroyed before `last`
    (void)all;
    (void)sel;
    (void)dims;
  });
  require(ok.ok(), ok.message.c_str());

  // Every rank throws with a step open and its buckets in flight: the Sync
  // waits for them, the Ctx aborts.
  meshpg::ThreadRun open = meshpg::run_threads(8, 30, [&](const mpg_init_opts& opts) {
    meshpg::Ctx ctx(mesh, opts);
    meshpg::Sync sync(ctx);
    int a = sync.add_param<float>("a", 4096);
    sync.commit();
    sync.begin(0, true);
    sync.mark_ready(a);
    throw std::runtime_error("open step");
  });
  require(!open.ok() && open.status == MPG_ERR_STATE, "open step fails");

  // One rank throws while the others wait for it.
  meshpg::ThreadRun gone = meshpg::run_threads(4, 30, [&](const mpg_init_opts& opts) {
    meshpg::Spec s;
    s.set_mesh("dp=4");
    meshpg::Mesh m(s);
    meshpg::Ctx ctx(m, opts);
    meshpg::Group g = ctx.group("dp");
    if (ctx.rank() == 2) throw meshpg::Error(MPG_ERR_RANGE, "gone");
    std::vector<std::int64_t> v(16, 1);
    meshpg::Work w = g.all_reduce_async(v.data(), v.data(), v.size());
    w.wait();
  });
  require(gone.statuses[2] == MPG_ERR_RANGE && gone.statuses[0] == MPG_ERR_ABORTED,
          "a throwing rank aborts its peers");
}

}  // namespace

int main() {
  const char* data = std::getenv("MESHPG_TEST_DATA");
  if (!data) {
    std::fprintf(stderr, "raii_worker: MESHPG_TEST_DATA is not set\n");
    return 1;
  }
  try {
    owners(data);
    ranks();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "raii_worker: %s\n", e.what());
    return 1;
  }
  std::puts("raii_worker OK");
  return 0;
}
