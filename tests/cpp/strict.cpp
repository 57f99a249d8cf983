/* Compiled, never run: every template and member of meshpg.hpp, built with
 * the stricter warnings of tests/cpp/meson.build, so that the header stays
 * clean for C++ projects that use them. */
#include <meshpg.hpp>

#include <cstdint>
#include <vector>

namespace {

template <class T>
void every_collective(meshpg::Group& g, T* a, T* b, std::vector<T>& v) {
  g.all_reduce(a, b, 4);
  g.all_reduce(a, 4, MPG_OP_MAX);
  g.all_reduce(v, MPG_OP_MIN);
  (void)g.all_reduce_value(a[0], MPG_OP_SUM);
  g.all_reduce_async(a, b, 4).wait();
  g.all_reduce_scaled(a, b, 4, 0.5);
  g.all_reduce_scaled_async(a, b, 4, 0.5).wait();
  g.broadcast(a, 4, 0);
  g.broadcast(v, 0);
  g.broadcast_async(a, 4, 0).wait();
  g.all_gather(a, b, 2);
  std::vector<T> all = g.all_gather(v);
  g.all_gather_async(a, b, 2).wait();
  g.reduce_scatter(a, b, 2);
  g.reduce_scatter_async(a, b, 2, MPG_OP_AVG).wait();
  g.send(a, 4, 1);
  g.recv(b, 4, 1);
  g.send_async(a, 4, 1).wait();
  g.recv_async(b, 4, 1).wait();
  const T* ca = a;
  std::vector<mpg_p2p_op> ops = {meshpg::Group::send_op(ca, 4, 1),
                                 meshpg::Group::recv_op(b, 4, 1)};
  g.p2p_batch(ops);
  g.p2p_batch_async(ops).wait();
}

}  // namespace

void meshpg_strict_tu(meshpg::Group& g, meshpg::Sync& s, meshpg::Ctx& c,
                      const meshpg::Mesh& m, const meshpg::Topo& t,
                      const meshpg::Placement& p);

void meshpg_strict_tu(meshpg::Group& g, meshpg::Sync& s, meshpg::Ctx& c,
                      const meshpg::Mesh& m, const meshpg::Topo& t,
                      const meshpg::Placement& p) {
  float f[8] = {};
  double d[8] = {};
  std::int32_t i[8] = {};
  std::int64_t l[8] = {};
  std::vector<float> vf(4);
  std::vector<double> vd(4);
  std::vector<std::int32_t> vi(4);
  std::vector<std::int64_t> vl(4);
  every_collective(g, f, f + 4, vf);
  every_collective(g, d, d + 4, vd);
  every_collective(g, i, i + 4, vi);
  every_collective(g, l, l + 4, vl);
  std::uint16_t h[8] = {};
  g.all_reduce(h, h, 4, MPG_BF16, MPG_OP_SUM);
  g.all_reduce_async(h, h, 4, MPG_F16, MPG_OP_SUM).wait();
  g.all_reduce_scaled(h, h, 4, MPG_BF16, 0.5);
  g.all_reduce_scaled_async(h, h, 4, MPG_BF16, 0.5).wait();
  g.broadcast(h, 4, MPG_F16, 0);
  g.broadcast_async(h, 4, MPG_F16, 0).wait();
  g.all_gather(h, h + 4, 2, MPG_BF16);
  g.all_gather_async(h, h + 4, 2, MPG_BF16).wait();
  g.reduce_scatter(h, h, 2, MPG_BF16, MPG_OP_SUM);
  g.reduce_scatter_async(h, h, 2, MPG_BF16, MPG_OP_SUM).wait();
  g.send(h, 4, MPG_F16, 1);
  g.recv(h, 4, MPG_F16, 1);
  g.send_async(h, 4, MPG_F16, 1).wait();
  g.recv_async(h, 4, MPG_F16, 1).wait();
  g.p2p_batch({meshpg::Group::send_op(h, 4, MPG_F16, 1),
               meshpg::Group::recv_op(h, 4, MPG_F16, 1)}, nullptr);
  g.barrier();
  meshpg::Work w = g.barrier_async();
  (void)w.test();
  (void)w.pending();
  (void)mpg_work_wait(w.release());
  (void)g.name();
  (void)g.members();
  (void)g.index();

  int a = s.add_param<float>("a", 4);
  int b = s.add_param("b", 4, MPG_BF16);
  mpg_param_opts po = meshpg::param_opts("dp_cp,tp", c.group_select("pp", {0, 1}));
  (void)s.add_param<double>("c", 4, &po);
  s.commit();
  float* ga = s.grad<float>(a);
  (void)ga;
  (void)s.grad(b);
  s.begin(0, true);
  s.mark_ready(a);
  s.finish();
  s.all(1);
  s.zero_grads();
  (void)s.grads_valid();
  (void)s.stats();
  (void)s.param_group(a);
  if (s.stats().shard_size > 0) {
    (void)s.shard(a);
    (void)s.param<float>(a);
    (void)s.param(b);
    s.gather_begin();
    s.gather_wait(a);
    s.gather_all();
  }

  (void)c.group("tp");
  (void)c.group_at(0);
  (void)c.group_dims("dp_cp,tp");
  (void)c.binding();
  (void)c.status();
  void* mem = c.mem_alloc(64);
  c.mem_zero(mem, 64);
  c.mem_free(mem);
  void* st = c.stream_create();
  c.stream_order(st, st);
  c.stream_destroy(st);
  (void)c.mesh();

  for (const meshpg::Dim& dim : m.dims()) (void)dim.size;
  (void)m.dimset_info(m.dimset("dp"));
  (void)m.group_members(0, 0);
  (void)m.rank_of(m.coord_of(0));
  (void)m.group_member(0, 0, 0);
  (void)m.group_of(0, 0).position;

  (void)t.gpu(0).bus_id;
  (void)t.nic(0).name;
  (void)t.bind(0, 1, -1, MPG_BIND_NONE, MPG_BIND_APPLY_NONE);
  (void)t.source();

  (void)p.of(0).node;
  (void)p.check_misfits();
  (void)p.group_nodes(0, 0);
  (void)meshpg::node_ids({"a", "b"}).num_nodes;
  (void)meshpg::launch_from_env();
  (void)meshpg::host_identity();
  meshpg::ThreadRun run = meshpg::run_threads(2, 1.0, [](const mpg_init_opts&) {});
  (void)run.ok();
}
