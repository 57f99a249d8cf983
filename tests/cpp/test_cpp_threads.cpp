/* test_cpp, part 2 (test_cpp.hpp): the templates' collectives, Group,
 * Work, Sync and run_threads on a thread world. */
#include "test_cpp.hpp"

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

/* Checkpoints through the C++ layer: save an 8-rank shard run (params
 * split over tp, the moment in the owned ranges), load it into a
 * replicate-mode run of the same mesh, every element back. */
Test(threads, checkpoint_through_the_cpp_layer, .timeout = 120) {
  meshpg::Spec spec = seed_spec();
  meshpg::Mesh mesh(spec);
  char dir[] = "/tmp/mpg-cpp-ckpt-XXXXXX";
  cr_assert_not_null(mkdtemp(dir));
  const std::string ck_dir = std::string(dir) + "/ck";
  for (int mode = 0; mode < 2; mode++) {
    meshpg::ThreadRun run = meshpg::run_threads(8, 30, [&](const mpg_init_opts& opts) {
      meshpg::Ctx ctx(mesh, opts);
      mpg_sync_opts so = MPG_SYNC_OPTS_INIT;
      so.sync.mode = mode == 0 ? MPG_SYNC_SHARD : MPG_SYNC_REPLICATE;
      meshpg::Sync sync(ctx, so);
      const int tp = ctx.group("tp").size(), tpos = ctx.group("tp").position();
      const std::size_t cols = 16 / static_cast<std::size_t>(tp);
      const int w = sync.add_param<float>("w", 8 * cols);
      sync.commit();
      std::vector<float> p(8 * cols), m(mode == 0 ? sync.stats().shard_elems : 8 * cols);
      auto value = [&](std::size_t local) {  // a pure function of the global index
        std::size_t r = local / cols, c = local % cols + static_cast<std::size_t>(tpos) * cols;
        return static_cast<float>(r * 16 + c);
      };
      meshpg::Checkpoint ck(ctx);
      mpg_tensor_layout l = meshpg::tensor_layout({8, 16}, "tp", 1);
      ck.add<float>("w", l, p.data());
      if (mode == 0) {
        ck.add_state("w.m", MPG_F32, l, sync, w, m.data());
        mpg_shard_info own = sync.shard(w);
        for (std::size_t i = 0; i < 8 * cols; i++) p[i] = value(i);
        for (std::size_t i = 0; i < own.count; i++)
          m[own.shard_offset + i] = -value(own.param_offset + i);
        ck.save(ck_dir, 7);
      } else {
        l.kind = MPG_CKPT_STATE;
        ck.add<float>("w.m", l, m.data());
        REQUIRE(ck.load(ck_dir) == 7);
        for (std::size_t i = 0; i < 8 * cols; i++) REQUIRE(p[i] == value(i) && m[i] == -value(i));
        expect_error(MPG_ERR_NOT_FOUND, [&] { ck.load(ck_dir + "-missing"); });
      }
    });
    EXPECT_RUN_OK(run);
  }
  cr_assert_eq(system((std::string("rm -rf ") + dir).c_str()), 0);
}
