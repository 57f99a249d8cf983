/* The NCCL backend (groups/nccl/) on a real CUDA device.
 *
 * Without a GPU every GPU test skips with one line ("no CUDA GPU on this
 * machine: NCCL tests skipped ..."); the two tests of the paths that need no
 * GPU (the "no CUDA device" error, and the missing-rendezvous error) run
 * everywhere.
 *
 * On a GPU:
 *  - the public API on a world of one rank (mesh "dp=1"): every collective
 *    of a size-1 group is the backend's `local` op (a copy on the stream, or
 *    the PTX scale kernel for a scaled sum); mpg_p2p_batch's argument
 *    checks and n == 0 only, since a world of one has no peer;
 *  - the backend ops called directly on a one-rank NCCL world communicator,
 *    so that ncclAllReduce & co. really run: every dtype and op, broadcast,
 *    all_gather, reduce_scatter, barrier, async test/wait, an explicit
 *    stream, split, abort; post_batch as one NCCL group of sends to and
 *    receives from the rank itself;
 *  - two ranks as two threads sharing a caller-made unique id (one per GPU
 *    when there are two; on one GPU NCCL refuses two ranks per device and
 *    the test skips saying so), with a 64 MiB two-way mpg_p2p_batch.
 *
 * Run on a GPU machine:
 *   meson setup build-nccl && ninja -C build-nccl &&
 *   meson test -C build-nccl test_nccl --print-errorlogs -v
 *   (or ./build-nccl/tests/groups/test_nccl --verbose to see each
 *   cr_log_info line of what ran on the GPU). */
#include "test_nccl.h"

#include "mesh_util.h"

/* The backend's world_init as rank `rank` of `world` (local rank `rank` of
 * `local_world`, no device chosen, no NCCL id) with master_addr and
 * master_port, in a call that must fail before NCCL makes a communicator:
 * asserts that it leaves none and returns its status. */
static mpg_status nogpu_world_init(int rank, int world, int local_world,
                                   const char *master_addr, int master_port) {
  mpg__world_args a;
  memset(&a, 0, sizeof a);
  static mpg__settings set; /* the variables, as mpg_ctx_create reads them */
  mpg__settings_read(&set);
  a.settings = &set;
  a.rank = rank;
  a.world_size = world;
  a.local_rank = rank;
  a.local_world_size = local_world;
  a.timeout_s = 5;
  a.device = -1;
  a.master_addr = master_addr;
  a.master_port = master_port;
  mpg__comm *w = (mpg__comm *)0x1;
  mpg_status st = mpg__backend_nccl.world_init(&a, &w);
  cr_assert_null(w);
  return st;
}

/* st is want and the message holds piece, and piece2 unless it is NULL. */
static void expect_fail(mpg_status st, mpg_status want, const char *piece, const char *piece2) {
  cr_assert_eq(st, want, "got %s: %s", mpg_status_name(st), mpg_last_error());
  cr_assert(strstr(mpg_last_error(), piece) && (!piece2 || strstr(mpg_last_error(), piece2)),
            "message: %s", mpg_last_error());
}

Test(nccl_nogpu, world_init_reports_missing_device) {
  if (gpu_count(NULL) > 0)
    cr_skip_test("a CUDA GPU is present: the no-device error path cannot be "
                 "shown here");
  mpg_status st = nogpu_world_init(0, 1, 0, "", -1);
  expect_fail(st, MPG_ERR_UNSUPPORTED, "no CUDA device", "cudaGetDeviceCount");

  /* The same through the public API. */
  mpg_mesh *mesh = make_dims_mesh("dp=1");
  mpg_init_opts o = nccl_opts(0, 1, 0, 0);
  mpg_ctx *ctx = (mpg_ctx *)0x1;
  st = mpg_ctx_create(mesh, &o, &ctx);
  cr_assert_eq(st, MPG_ERR_UNSUPPORTED, "got %s: %s", mpg_status_name(st),
               mpg_last_error());
  cr_assert_null(ctx);
  cr_assert(strstr(mpg_last_error(), "no CUDA device"), "message: %s",
            mpg_last_error());
  mpg_mesh_destroy(mesh);
}

Test(nccl_nogpu, empty_cuda_visible_devices_is_explained) {
  /* CUDA reads the variable at its first call, here in world_init (each
   * test is its own process), so this runs with or without a GPU. */
  setenv("CUDA_VISIBLE_DEVICES", "", 1);
  expect_fail(nogpu_world_init(0, 1, 1, "", -1), MPG_ERR_UNSUPPORTED, "nccl: rank 0 of 1",
              "CUDA_VISIBLE_DEVICES=\"\" hides every GPU");
}

Test(nccl_nogpu, missing_rendezvous_names_master_addr) {
  /* A world of two without an id, MPI or MASTER_ADDR: refused before any
   * CUDA or network call. */
  unsetenv("NCCL_COMM_ID");
  unsetenv("MASTER_ADDR");
  unsetenv("MASTER_PORT");
  unsetenv("OMPI_COMM_WORLD_SIZE");
  expect_fail(nogpu_world_init(1, 2, 2, "", -1), MPG_ERR_ENV, "MASTER_ADDR", "MASTER_PORT");
}

/* torchrun's store holds MASTER_PORT: NCCL's root goes to MESHPG_NCCL_PORT
 * or MASTER_PORT + 1, and a bad value of either is refused before any CUDA
 * or network call, naming the variable. */
static mpg_status master_boot(int port) {
  unsetenv("NCCL_COMM_ID");
  unsetenv("OMPI_COMM_WORLD_SIZE");
  return nogpu_world_init(1, 2, 2, "127.0.0.1", port);
}

Test(nccl_nogpu, master_port_fallback_never_takes_master_port) {
  setenv("MESHPG_NCCL_PORT", "70000", 1);
  cr_assert_eq(master_boot(29500), MPG_ERR_ENV);
  cr_assert(strstr(mpg_last_error(), "MESHPG_NCCL_PORT=\"70000\""), "%s", mpg_last_error());
  setenv("MESHPG_NCCL_PORT", "12x", 1);
  cr_assert_eq(master_boot(29500), MPG_ERR_ENV);
  unsetenv("MESHPG_NCCL_PORT");
  cr_assert_eq(master_boot(65535), MPG_ERR_ENV);
  cr_assert(strstr(mpg_last_error(), "MASTER_PORT=65535") &&
                strstr(mpg_last_error(), "MESHPG_NCCL_PORT"),
            "%s", mpg_last_error());
}

/* ------------------------------------------------------------------------ */
/* Public API, world of one rank                                             */
/* ------------------------------------------------------------------------ */

/* R6: a group of one rank runs its copy or scale kernel on the context's
 * device, whatever device the caller has made current.  The context is on
 * device 1, the caller on device 0; the stream and buffers are device 1's.
 * (Needs two devices: the test double has 8.) */
Test(nccl_public, size1_group_runs_on_the_contexts_device) {
  require_gpu();
  int n = 0;
  CUDA_OK(cudaGetDeviceCount(&n));
  if (n < 2) cr_skip_test("one CUDA device: the device switch needs two");
  world1 w = public_world1_on(1);
  void *stream = NULL, *a = NULL, *b = NULL;
  const size_t count = 4096;
  EXPECT_OK(mpg_ctx_stream_create(w.ctx, &stream));
  EXPECT_OK(mpg_ctx_mem_alloc(w.ctx, count * 4, 0, &a));
  EXPECT_OK(mpg_ctx_mem_alloc(w.ctx, count * 4, 0, &b));
  float *host = malloc(count * 4);
  cr_assert_not_null(host);
  for (size_t i = 0; i < count; i++) host[i] = (float)i;
  CUDA_OK(cudaSetDevice(1));
  CUDA_OK(cudaMemcpy(a, host, count * 4, cudaMemcpyHostToDevice));
  CUDA_OK(cudaDeviceSynchronize());
  CUDA_OK(cudaSetDevice(0));
  EXPECT_OK(mpg_all_reduce_scaled(w.dp, a, b, count, MPG_F32, 0.5, stream, NULL));
  int cur = -1;
  CUDA_OK(cudaGetDevice(&cur));
  cr_assert_eq(cur, 0, "the caller's device became %d", cur);
  CUDA_OK(cudaSetDevice(1));
  CUDA_OK(cudaDeviceSynchronize());
  CUDA_OK(cudaMemcpy(host, b, count * 4, cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < count; i++)
    cr_assert_eq(host[i], (float)i * 0.5f, "element %zu is %g", i, (double)host[i]);
  CUDA_OK(cudaSetDevice(0));
  free(host);
  EXPECT_OK(mpg_ctx_mem_free(w.ctx, a));
  EXPECT_OK(mpg_ctx_mem_free(w.ctx, b));
  EXPECT_OK(mpg_ctx_stream_destroy(w.ctx, stream));
  world1_free(&w);
}

Test(nccl_public, world1_all_reduce_every_dtype_and_op) {
  require_gpu();
  log_device();
  world1 w = public_world1();
  const size_t n = 1000;
  for (size_t d = 0; d < sizeof all_dtypes / sizeof *all_dtypes; d++) {
    mpg_dtype dt = all_dtypes[d];
    for (size_t o = 0; o < sizeof all_ops / sizeof *all_ops; o++) {
      void *send = dev_fill(dt, n, 0), *recv = dev_zero(dt, n);
      EXPECT_OK(mpg_all_reduce(w.dp, send, recv, n, dt, all_ops[o], NULL, NULL));
      expect_arg a = {dt, all_ops[o], 1, 1.0, 0};
      char what[64];
      snprintf(what, sizeof what, "public all_reduce %s", op_names[all_ops[o]]);
      expect_dev(what, dt, recv, n, want_reduce, &a);
      /* In place. */
      EXPECT_OK(mpg_all_reduce(w.world, send, send, n, dt, all_ops[o], NULL, NULL));
      expect_dev(what, dt, send, n, want_reduce, &a);
      cudaFree(send);
      cudaFree(recv);
    }
    if (dt == MPG_I32 || dt == MPG_I64) {
      void *buf = dev_fill(dt, n, 0);
      mpg_status st = mpg_all_reduce_scaled(w.dp, buf, buf, n, dt, 0.5, NULL, NULL);
      cr_assert_eq(st, MPG_ERR_INVALID, "scaled %s: %s", mpg_dtype_name(dt),
                   mpg_status_name(st));
      cudaFree(buf);
      continue;
    }
    /* The scaled sum runs the backend's PTX kernel on a size-1 group. */
    void *send = dev_fill(dt, n, 0), *recv = dev_zero(dt, n);
    EXPECT_OK(mpg_all_reduce_scaled(w.dp, send, recv, n, dt, 0.5, NULL, NULL));
    expect_arg a = {dt, MPG__OP_PREMUL_SUM, 1, 0.5, 0};
    expect_dev("public all_reduce_scaled 0.5", dt, recv, n, want_reduce, &a);
    EXPECT_OK(mpg_all_reduce_scaled(w.dp, send, send, n, dt, 0.5, NULL, NULL));
    expect_dev("public all_reduce_scaled 0.5 in place", dt, send, n, want_reduce, &a);
    cudaFree(send);
    cudaFree(recv);
  }
  cr_log_info("public API, world of 1: all_reduce sum/avg/max/min/scaled x "
              "f32/f64/f16/bf16/i32/i64 checked on the GPU");
  world1_free(&w);
}

Test(nccl_public, world1_other_collectives_async_and_stream) {
  require_gpu();
  world1 w = public_world1();
  const size_t n = 513;
  cudaStream_t s = nonblocking_stream();
  for (size_t d = 0; d < sizeof all_dtypes / sizeof *all_dtypes; d++) {
    mpg_dtype dt = all_dtypes[d];
    void *a = dev_fill(dt, n, 0), *b = dev_zero(dt, n);
    EXPECT_OK(mpg_broadcast(w.dp, a, n, dt, 0, s, NULL));
    EXPECT_OK(mpg_all_gather(w.dp, a, b, n, dt, s, NULL));
    CUDA_OK(cudaStreamSynchronize(s));
    expect_dev("public all_gather", dt, b, n, want_pattern0, NULL);
    CUDA_OK(cudaMemset(b, 0, n * mpg_dtype_size(dt)));
    CUDA_OK(cudaDeviceSynchronize());
    mpg_work *work = (mpg_work *)0x1;
    EXPECT_OK(mpg_reduce_scatter(w.dp, a, b, n, dt, MPG_OP_SUM, s, &work));
    int done = 0;
    EXPECT_OK(mpg_work_test(work, &done));
    cr_assert_eq(done, 1);
    EXPECT_OK(mpg_work_wait(work));
    CUDA_OK(cudaStreamSynchronize(s));
    expect_dev("public reduce_scatter", dt, b, n, want_pattern0, NULL);
    cudaFree(a);
    cudaFree(b);
  }
  EXPECT_OK(mpg_barrier(w.dp, NULL));
  EXPECT_OK(mpg_barrier(w.world, NULL));
  int peer_buf = 0;
  cr_assert_eq(mpg_send(w.dp, &peer_buf, 1, MPG_I32, 0, NULL, NULL), MPG_ERR_INVALID);
  cudaStreamDestroy(s);
  cr_log_info("public API, world of 1: broadcast, all_gather, reduce_scatter "
              "(async, explicit stream), barrier checked on the GPU");
  world1_free(&w);
}

/* ------------------------------------------------------------------------ */
/* The backend itself on a one-rank NCCL communicator                        */
/* ------------------------------------------------------------------------ */

Test(nccl_backend, world1_all_reduce_every_dtype_and_op) {
  require_gpu();
  log_device();
  mpg__comm *c = backend_world1();
  const size_t n = 4099;
  for (size_t d = 0; d < sizeof all_dtypes / sizeof *all_dtypes; d++) {
    mpg_dtype dt = all_dtypes[d];
    for (size_t o = 0; o < sizeof all_ops / sizeof *all_ops; o++) {
      void *send = dev_fill(dt, n, 0), *recv = dev_zero(dt, n);
      mpg__coll k = coll_of(MPG__ALL_REDUCE, send, recv, n, dt, all_ops[o], NULL);
      EXPECT_OK(backend_run(c, &k));
      expect_arg a = {dt, all_ops[o], 1, 1.0, 0};
      char what[64];
      snprintf(what, sizeof what, "ncclAllReduce %s", op_names[all_ops[o]]);
      expect_dev(what, dt, recv, n, want_reduce, &a);
      cudaFree(send);
      cudaFree(recv);
    }
    if (dt == MPG_I32 || dt == MPG_I64) continue;
    void *send = dev_fill(dt, n, 0), *recv = dev_zero(dt, n);
    mpg__coll k = coll_of(MPG__ALL_REDUCE, send, recv, n, dt, MPG__OP_PREMUL_SUM, NULL);
    k.scale = 0.25;
    EXPECT_OK(backend_run(c, &k));
    expect_arg a = {dt, MPG__OP_PREMUL_SUM, 1, 0.25, 0};
    expect_dev("ncclAllReduce premul_sum 0.25", dt, recv, n, want_reduce, &a);
    cudaFree(send);
    cudaFree(recv);
  }
  cr_log_info("backend direct, 1-rank NCCL comm: ncclAllReduce sum/avg/max/"
              "min/premul_sum x 6 dtypes checked");
  EXPECT_OK(mpg__backend_nccl.destroy(c));
}

Test(nccl_backend, world1_collectives_async_stream_split_abort) {
  require_gpu();
  mpg__comm *c = backend_world1();
  const size_t n = 1 << 16;
  cudaStream_t s = nonblocking_stream();
  for (size_t d = 0; d < sizeof all_dtypes / sizeof *all_dtypes; d++) {
    mpg_dtype dt = all_dtypes[d];
    void *a = dev_fill(dt, n, 0), *b = dev_zero(dt, n);
    mpg__coll k = coll_of(MPG__BROADCAST, a, a, n, dt, MPG_OP_SUM, s);
    EXPECT_OK(backend_run(c, &k));
    k = coll_of(MPG__ALL_GATHER, a, b, n, dt, MPG_OP_SUM, s);
    EXPECT_OK(backend_run(c, &k));
    expect_dev("ncclAllGather", dt, b, n, want_pattern0, NULL);
    CUDA_OK(cudaMemset(b, 0, n * mpg_dtype_size(dt)));
    CUDA_OK(cudaDeviceSynchronize());
    /* Async on an explicit stream: post, test until done, wait. */
    k = coll_of(MPG__REDUCE_SCATTER, a, b, n, dt, MPG_OP_MAX, s);
    mpg__req *req = NULL;
    EXPECT_OK(mpg__backend_nccl.post(c, &k, &req));
    int done = 0;
    double until = mpg__now() + 60;
    while (!done && mpg__now() < until) EXPECT_OK(mpg__backend_nccl.test(req, &done));
    cr_assert_eq(done, 1, "reduce_scatter never completed");
    EXPECT_OK(mpg__backend_nccl.wait(req, mpg__now() + 60));
    mpg__backend_nccl.req_free(req);
    expect_dev("ncclReduceScatter (async, stream)", dt, b, n, want_pattern0, NULL);
    cudaFree(a);
    cudaFree(b);
  }
  mpg__coll bar = coll_of(MPG__BARRIER, NULL, NULL, 0, MPG_I32, MPG_OP_SUM, NULL);
  EXPECT_OK(backend_run(c, &bar));
  EXPECT_OK(backend_run(c, &bar));
  cr_log_info("backend direct: ncclBroadcast, ncclAllGather, ncclReduceScatter "
              "(async on a stream), barrier checked");

  /* Split: colour 0 gives a one-rank child that works; NOCOLOR gives none. */
  mpg__comm *child = (mpg__comm *)0x1, *none = (mpg__comm *)0x1;
  EXPECT_OK(mpg__backend_nccl.split(c, 0, 0, &child));
  cr_assert_not_null(child);
  EXPECT_OK(mpg__backend_nccl.split(c, -1, 0, &none));
  cr_assert_null(none);
  void *x = dev_fill(MPG_F32, 100, 0), *y = dev_zero(MPG_F32, 100);
  mpg__coll k = coll_of(MPG__ALL_REDUCE, x, y, 100, MPG_F32, MPG_OP_SUM, NULL);
  EXPECT_OK(backend_run(child, &k));
  expect_dev("ncclAllReduce on a split child", MPG_F32, y, 100, want_pattern0, NULL);
  cr_log_info("backend direct: ncclCommSplit colour 0 -> working child, "
              "NCCL_SPLIT_NOCOLOR -> no communicator");

  /* Abort: every later post fails with MPG_ERR_ABORTED; destroy still works. */
  mpg__backend_nccl.abort_comm(child, MPG_ERR_ABORTED);
  mpg__backend_nccl.abort_comm(c, MPG_ERR_ABORTED);
  mpg__req *req = (mpg__req *)0x1;
  mpg_status st = mpg__backend_nccl.post(c, &k, &req);
  cr_assert_eq(st, MPG_ERR_ABORTED, "post after abort: %s", mpg_status_name(st));
  cr_assert_null(req);
  st = mpg__backend_nccl.post(child, &k, &req);
  cr_assert_eq(st, MPG_ERR_ABORTED, "post on child after abort: %s",
               mpg_status_name(st));
  EXPECT_OK(mpg__backend_nccl.destroy(child));
  EXPECT_OK(mpg__backend_nccl.destroy(c));
  cudaFree(x);
  cudaFree(y);
  cudaStreamDestroy(s);
  cr_log_info("backend direct: abort then post -> MPG_ERR_ABORTED; destroy ok");
}

Test(nccl_backend, request_outlives_destroy_and_finalize_is_clean) {
  require_gpu();
  mpg__comm *c = backend_world1();
  void *x = dev_fill(MPG_F64, 64, 0);
  mpg__coll k = coll_of(MPG__ALL_REDUCE, x, x, 64, MPG_F64, MPG_OP_SUM, NULL);
  mpg__req *req = NULL;
  EXPECT_OK(mpg__backend_nccl.post(c, &k, &req));
  EXPECT_OK(mpg__backend_nccl.wait(req, mpg__now() + 60));
  /* Destroy first, free the request after: the request keeps what it needs. */
  EXPECT_OK(mpg__backend_nccl.destroy(c));
  mpg__backend_nccl.req_free(req);
  cudaFree(x);
}

/* ------------------------------------------------------------------------ */
/* mpg_p2p_batch on one rank                                                 */
/* ------------------------------------------------------------------------ */

/* A world of one rank has no peer: through the public API only the
 * argument checks and n == 0 can run (the batch itself runs in the two-rank
 * test, which needs two GPUs).  The backend's post_batch is driven directly
 * below with sends to and receives from itself. */
Test(nccl_public, world1_p2p_batch_arguments_and_empty_batch) {
  require_gpu();
  world1 w = public_world1();
  void *buf = dev_zero(MPG_F32, 16);
  mpg_p2p_op op = {MPG_P2P_SEND, 0, buf, 16, MPG_F32};
  mpg_status st = mpg_p2p_batch(w.dp, &op, 1, NULL, NULL);
  cr_assert_eq(st, MPG_ERR_INVALID, "a send to itself: %s", mpg_status_name(st));
  cr_assert(strstr(mpg_last_error(), "ops[0] (send): peer 0 is not another member"), "%s",
            mpg_last_error());
  op.kind = MPG_P2P_RECV;
  op.peer = 1;
  st = mpg_p2p_batch(w.world, &op, 1, NULL, NULL);
  cr_assert_eq(st, MPG_ERR_INVALID, "a receive from position 1: %s", mpg_status_name(st));
  st = mpg_p2p_batch(w.dp, NULL, -1, NULL, NULL);
  cr_assert_eq(st, MPG_ERR_INVALID, "n = -1: %s", mpg_status_name(st));
  mpg_work *work = (mpg_work *)&work;
  EXPECT_OK(mpg_p2p_batch(w.dp, NULL, 0, NULL, &work));
  cr_assert_null(work, "n == 0 gave a work handle");
  cr_assert_eq(mpg_ctx_status(w.ctx), MPG_OK);
  cudaFree(buf);
  world1_free(&w);
}

/* post_batch on a one-rank NCCL communicator, sending to and receiving
 * from itself (NCCL allows a rank its own peer): one ncclGroupStart,
 * ncclSend x 2, ncclRecv x 2, ncclGroupEnd, on a stream, messages matched
 * in order and of two dtypes; an empty batch member is skipped. */
Test(nccl_backend, world1_post_batch_to_itself) {
  require_gpu();
  mpg__comm *c = backend_world1();
  const size_t n = 1 << 20;
  cudaStream_t s = nonblocking_stream();
  int r0 = 0, r5 = 5;
  void *a = dev_fill(MPG_F32, n, 0), *b = dev_fill(MPG_BF16, n, 5);
  void *ra = dev_zero(MPG_F32, n), *rb = dev_zero(MPG_BF16, n);
  mpg__coll list[5] = {
      coll_of(MPG__RECV, NULL, ra, n, MPG_F32, MPG_OP_SUM, s),
      coll_of(MPG__RECV, NULL, rb, n, MPG_BF16, MPG_OP_SUM, s),
      coll_of(MPG__RECV, NULL, NULL, 0, MPG_I64, MPG_OP_SUM, s),
      coll_of(MPG__SEND, a, NULL, n, MPG_F32, MPG_OP_SUM, s),
      coll_of(MPG__SEND, b, NULL, n, MPG_BF16, MPG_OP_SUM, s),
  };
  for (int i = 0; i < 5; i++) list[i].peer = 0;
  mpg__req *req = NULL;
  EXPECT_OK(mpg__backend_nccl.post_batch(c, list, 5, &req));
  cr_assert_not_null(req);
  EXPECT_OK(mpg__backend_nccl.wait(req, mpg__now() + 60));
  mpg__backend_nccl.req_free(req);
  expect_dev("post_batch f32 message", MPG_F32, ra, n, want_pattern_of, &r0);
  expect_dev("post_batch bf16 message", MPG_BF16, rb, n, want_pattern_of, &r5);
  /* Only empty operations: NCCL is not called, the request still completes. */
  req = NULL;
  EXPECT_OK(mpg__backend_nccl.post_batch(c, &list[2], 1, &req));
  EXPECT_OK(mpg__backend_nccl.wait(req, mpg__now() + 60));
  mpg__backend_nccl.req_free(req);
  cr_log_info("backend direct: ncclGroupStart / ncclSend x2 / ncclRecv x2 / ncclGroupEnd "
              "to itself checked");
  EXPECT_OK(mpg__backend_nccl.destroy(c));
  cudaFree(a);
  cudaFree(b);
  cudaFree(ra);
  cudaFree(rb);
  cudaStreamDestroy(s);
}
