/* test_nccl, part 2 (the helpers: test_nccl.h): two ranks as two threads
 * with a caller-made unique id, the rendezvous from MASTER_ADDR, and a
 * peer that never arrives. */
#include "test_nccl.h"

#include "mesh_util.h"

/* ------------------------------------------------------------------------ */
/* Two ranks as two threads with a caller-made unique id                     */
/* ------------------------------------------------------------------------ */

typedef struct {
  nccl_job h;
  mpg_status create_st;
  char create_msg[1024];
  char fail[1024]; /* first failed check after create, "" if none */
} rank_job;

#define JOB_CHECK(job, cond, ...)                                              \
  do {                                                                         \
    if (!(cond) && !(job)->fail[0])                                            \
      snprintf((job)->fail, sizeof (job)->fail, __VA_ARGS__);                  \
  } while (0)

static void job_expect(rank_job *j, const char *what, mpg_dtype dt,
                       const void *dev, size_t n, double (*want)(size_t, void *),
                       void *arg) {
  size_t bytes = n * mpg_dtype_size(dt);
  void *host = malloc(bytes);
  if (!host || cudaDeviceSynchronize() != cudaSuccess ||
      cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost) != cudaSuccess) {
    JOB_CHECK(j, 0, "rank %d: %s: copy back failed", j->h.rank, what);
    free(host);
    return;
  }
  for (size_t i = 0; i < n; i++) {
    double got = get(dt, host, i), exp = want(i, arg);
    JOB_CHECK(j, got == exp, "rank %d: %s (%s): element %zu is %g, want %g",
              j->h.rank, what, mpg_dtype_name(dt), i, got, exp);
  }
  free(host);
}

static double want_bcast1(size_t i, void *p) {
  (void)p;
  return pattern(i, 1);
}

static double want_gather2(size_t i, void *p) {
  size_t n = *(size_t *)p;
  return pattern(i % n, (int)(i / n));
}

#define JOB_OK(job, expr)                                                      \
  do {                                                                         \
    mpg_status st_ = (expr);                                                   \
    JOB_CHECK(job, st_ == MPG_OK, "rank %d: %s: %s: %s", (job)->h.rank, #expr,   \
              mpg_status_name(st_), mpg_last_error());                         \
  } while (0)

static void *rank_main(void *p) {
  rank_job *j = p;
  mpg_init_opts o = nccl_job_opts(&j->h, 60);
  mpg_ctx *ctx = NULL;
  j->create_st = mpg_ctx_create(j->h.mesh, &o, &ctx);
  if (j->create_st != MPG_OK) {
    snprintf(j->create_msg, sizeof j->create_msg, "%s", mpg_last_error());
    return NULL;
  }
  mpg_group *dp = NULL;
  JOB_OK(j, mpg_ctx_group(ctx, "dp", &dp));
  if (!dp) {
    mpg_ctx_destroy(ctx);
    return NULL;
  }
  const size_t n = 1 << 12;
  for (size_t d = 0; d < sizeof all_dtypes / sizeof *all_dtypes; d++) {
    mpg_dtype dt = all_dtypes[d];
    for (size_t q = 0; q < sizeof all_ops / sizeof *all_ops; q++) {
      void *send = dev_fill(dt, n, j->h.rank), *recv = dev_zero(dt, n);
      JOB_OK(j, mpg_all_reduce(dp, send, recv, n, dt, all_ops[q], NULL, NULL));
      expect_arg a = {dt, all_ops[q], 2, 1.0, 0};
      job_expect(j, op_names[all_ops[q]], dt, recv, n, want_reduce, &a);
      cudaFree(send);
      cudaFree(recv);
    }
    if (dt != MPG_I32 && dt != MPG_I64) {
      void *buf = dev_fill(dt, n, j->h.rank);
      mpg_work *w = NULL;
      JOB_OK(j, mpg_all_reduce_scaled(dp, buf, buf, n, dt, 0.5, NULL, &w));
      JOB_OK(j, mpg_work_wait(w));
      expect_arg a = {dt, MPG__OP_PREMUL_SUM, 2, 0.5, 0};
      job_expect(j, "scaled 0.5 (async)", dt, buf, n, want_reduce, &a);
      cudaFree(buf);
    }
  }
  /* f16/bf16 with f32 accumulation (widen.c) over two ranks: all_reduce
   * (sum, avg, scaled) and reduce_scatter in place, where each rank's f32
   * result is its block of the widened buffer. */
  for (int h = 0; h < 2; h++) {
    mpg_dtype dt = h ? MPG_BF16 : MPG_F16;
    for (int q = 0; q < 3; q++) {
      mpg_op op = q == 0 ? MPG_OP_SUM : q == 1 ? MPG_OP_AVG : MPG__OP_PREMUL_SUM;
      void *send = dev_fill(dt, n, j->h.rank), *recv = dev_zero(dt, n);
      JOB_OK(j, mpg__all_reduce_f32acc(dp, send, recv, n, dt, op, 0.5, NULL, NULL));
      expect_arg a = {dt, op, 2, 0.5, 0};
      job_expect(j, "f32acc all_reduce", dt, recv, n, want_reduce, &a);
      cudaFree(send);
      cudaFree(recv);
    }
    void *rs = dev_fill(dt, 2 * n, j->h.rank);
    char *mine = (char *)rs + (size_t)j->h.rank * n * 2;
    JOB_OK(j, mpg__reduce_scatter_f32acc(dp, rs, mine, n, dt, MPG_OP_SUM, 1.0, NULL, NULL));
    expect_arg a = {dt, MPG_OP_SUM, 2, 1.0, (size_t)j->h.rank * n};
    job_expect(j, "f32acc reduce_scatter in place", dt, mine, n, want_reduce, &a);
    cudaFree(rs);
  }
  /* broadcast from position 1, all_gather, reduce_scatter, send/recv. */
  void *b = dev_fill(MPG_F32, n, j->h.rank);
  JOB_OK(j, mpg_broadcast(dp, b, n, MPG_F32, 1, NULL, NULL));
  job_expect(j, "broadcast root 1", MPG_F32, b, n, want_bcast1, NULL);
  void *g = dev_zero(MPG_F32, 2 * n), *s = dev_fill(MPG_F32, n, j->h.rank);
  size_t nn = n;
  JOB_OK(j, mpg_all_gather(dp, s, g, n, MPG_F32, NULL, NULL));
  job_expect(j, "all_gather", MPG_F32, g, 2 * n, want_gather2, &nn);
  void *rs_in = dev_fill(MPG_F32, 2 * n, j->h.rank), *rs_out = dev_zero(MPG_F32, n);
  JOB_OK(j, mpg_reduce_scatter(dp, rs_in, rs_out, n, MPG_F32, MPG_OP_SUM, NULL, NULL));
  expect_arg ra = {MPG_F32, MPG_OP_SUM, 2, 1.0, (size_t)j->h.rank * n};
  job_expect(j, "reduce_scatter", MPG_F32, rs_out, n, want_reduce, &ra);
  JOB_OK(j, mpg_barrier(dp, NULL));
  void *p2p = j->h.rank == 0 ? dev_fill(MPG_I64, n, 0) : dev_zero(MPG_I64, n);
  if (j->h.rank == 0)
    JOB_OK(j, mpg_send(dp, p2p, n, MPG_I64, 1, NULL, NULL));
  else
    JOB_OK(j, mpg_recv(dp, p2p, n, MPG_I64, 0, NULL, NULL));
  job_expect(j, "send/recv", MPG_I64, p2p, n, want_pattern0, NULL);
  /* mpg_p2p_batch: both ranks send 64 MiB to each other and receive 64
   * MiB in one batch (sends listed first: as one NCCL group they cannot
   * wait for each other), plus a second, bf16 message to the same peer,
   * matched in order; then the same through a work handle. */
  {
    const size_t big = (size_t)16 << 20; /* int32: 64 MiB */
    int peer = 1 - j->h.rank, peer_b = peer + 10;
    void *sa = dev_fill(MPG_I32, big, j->h.rank), *ra = dev_zero(MPG_I32, big);
    void *sb = dev_fill(MPG_BF16, n, j->h.rank + 10), *rb = dev_zero(MPG_BF16, n);
    mpg_p2p_op ops[4] = {{MPG_P2P_SEND, peer, sa, big, MPG_I32},
                         {MPG_P2P_SEND, peer, sb, n, MPG_BF16},
                         {MPG_P2P_RECV, peer, ra, big, MPG_I32},
                         {MPG_P2P_RECV, peer, rb, n, MPG_BF16}};
    JOB_OK(j, mpg_p2p_batch(dp, ops, 4, NULL, NULL));
    job_expect(j, "p2p_batch 64 MiB", MPG_I32, ra, big, want_pattern_of, &peer);
    job_expect(j, "p2p_batch second message", MPG_BF16, rb, n, want_pattern_of, &peer_b);
    cudaMemset(ra, 0, big * 4);
    cudaDeviceSynchronize();
    mpg_work *w = NULL;
    JOB_OK(j, mpg_p2p_batch(dp, ops, 4, NULL, &w));
    JOB_OK(j, mpg_work_wait(w));
    job_expect(j, "p2p_batch (work)", MPG_I32, ra, big, want_pattern_of, &peer);
    cudaFree(sa);
    cudaFree(ra);
    cudaFree(sb);
    cudaFree(rb);
  }
  cudaFree(b);
  cudaFree(g);
  cudaFree(s);
  cudaFree(rs_in);
  cudaFree(rs_out);
  cudaFree(p2p);
  JOB_OK(j, mpg_ctx_destroy(ctx));
  return NULL;
}

Test(nccl_two_ranks, threads_with_caller_unique_id, .timeout = 300) {
  int ndev = require_gpu();
  ncclUniqueId id;
  ncclResult_t r = ncclGetUniqueId(&id);
  cr_assert_eq(r, ncclSuccess, "ncclGetUniqueId: %s", ncclGetErrorString(r));
  mpg_mesh *mesh = make_dims_mesh("dp=2");
  rank_job jobs[2];
  run_nccl_threads(rank_main, jobs, sizeof jobs[0], 2, ndev, &id, mesh);
  mpg_mesh_destroy(mesh);
  if (ndev == 1 && (jobs[0].create_st != MPG_OK || jobs[1].create_st != MPG_OK)) {
    const char *msg = jobs[0].create_st ? jobs[0].create_msg : jobs[1].create_msg;
    cr_skip_test("NCCL refused two ranks on one GPU (%s); the two-rank test "
                 "needs two GPUs: %s",
                 mpg_status_name(jobs[0].create_st ? jobs[0].create_st
                                                   : jobs[1].create_st),
                 msg);
  }
  for (int i = 0; i < 2; i++) {
    cr_assert_eq(jobs[i].create_st, MPG_OK, "rank %d: mpg_ctx_create: %s: %s", i,
                 mpg_status_name(jobs[i].create_st), jobs[i].create_msg);
    cr_assert(jobs[i].fail[0] == '\0', "%s", jobs[i].fail);
  }
  cr_log_info("two ranks (threads, %s): every dtype/op all_reduce, scaled, "
              "broadcast, all_gather, reduce_scatter, barrier, send/recv "
              "checked",
              ndev > 1 ? "GPUs 0 and 1" : "one GPU");
}

/* The torchrun-style bootstrap: no id from the caller, MASTER_ADDR and
 * MASTER_PORT in the environment, so rank 0 hands its id to rank 1 through
 * meshpg's own rendezvous (groups/rendezvous.h), and NCCL_COMM_ID is never
 * set.  With two GPUs the world comes up; with one, NCCL's duplicate-GPU
 * check (which runs after every rank has met at the root) refuses it, which
 * still shows that the rendezvous itself worked. */
typedef struct {
  nccl_job h;
  mpg_status st;
  char msg[1024];
} rdv_job;

static void *rdv_main(void *p) {
  rdv_job *j = p;
  mpg_init_opts o = nccl_job_opts(&j->h, 30);
  mpg_ctx *ctx = NULL;
  j->st = mpg_ctx_create(j->h.mesh, &o, &ctx);
  snprintf(j->msg, sizeof j->msg, "%s", j->st ? mpg_last_error() : "");
  if (ctx) {
    mpg_group *dp = NULL;
    if (mpg_ctx_group(ctx, "dp", &dp) == MPG_OK) {
      void *x = dev_fill(MPG_F32, 256, j->h.rank);
      mpg_status st = mpg_all_reduce(dp, x, x, 256, MPG_F32, MPG_OP_SUM, NULL, NULL);
      if (st && !j->st) {
        j->st = st;
        snprintf(j->msg, sizeof j->msg, "all_reduce: %s", mpg_last_error());
      }
      cudaFree(x);
    }
    destroy_keep_first(ctx, &j->st, j->msg, sizeof j->msg);
  }
  return NULL;
}

Test(nccl_two_ranks, rendezvous_from_master_addr, .timeout = 120) {
  int ndev = require_gpu();
  char port[16];
  snprintf(port, sizeof port, "%d", 20000 + (int)(getpid() % 20000));
  unsetenv("NCCL_COMM_ID");
  unsetenv("OMPI_COMM_WORLD_SIZE");
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", port, 1);
  mpg_mesh *mesh = make_dims_mesh("dp=2");
  rdv_job jobs[2];
  run_nccl_threads(rdv_main, jobs, sizeof jobs[0], 2, ndev, NULL, mesh);
  mpg_mesh_destroy(mesh);
  cr_assert_null(getenv("NCCL_COMM_ID"),
                 "NCCL_COMM_ID was left set to %s", getenv("NCCL_COMM_ID"));
  for (int i = 0; i < 2; i++) {
    cr_assert(strstr(jobs[i].msg, "MASTER_ADDR=127.0.0.1") || jobs[i].st == MPG_OK,
              "rank %d: %s: %s", i, mpg_status_name(jobs[i].st), jobs[i].msg);
    if (ndev == 1) {
      /* Refused after the rendezvous: invalid usage, not a timeout. */
      cr_assert_eq(jobs[i].st, MPG_ERR_BACKEND, "rank %d: %s: %s", i,
                   mpg_status_name(jobs[i].st), jobs[i].msg);
      cr_assert(strstr(jobs[i].msg, "invalid usage"), "rank %d: %s", i, jobs[i].msg);
    } else {
      cr_assert_eq(jobs[i].st, MPG_OK, "rank %d: %s: %s", i,
                   mpg_status_name(jobs[i].st), jobs[i].msg);
    }
  }
  cr_log_info("meshpg's rendezvous at 127.0.0.1, MASTER_PORT %s + 1, reached both ranks%s",
              port, ndev == 1 ? " (then NCCL refused two ranks on one GPU, as expected)"
                              : " and all_reduce ran");
}

/* A peer that never arrives: init gives MPG_ERR_TIMEOUT after the timeout
 * (the half-made communicator is aborted), never a hang. */
Test(nccl_timeout, world_init_peer_never_arrives, .timeout = 120) {
  require_gpu();
  ncclUniqueId id;
  ncclResult_t r = ncclGetUniqueId(&id);
  cr_assert_eq(r, ncclSuccess, "ncclGetUniqueId: %s", ncclGetErrorString(r));

  /* The backend alone, as rank 1 of 2. */
  const mpg__world_args a = {.rank = 1, .world_size = 2, .local_rank = 0,
                             .local_world_size = 1, .timeout_s = 2, .device = 0,
                             .nccl_id = &id, .master_addr = "", .master_port = -1};
  mpg__comm *w = (mpg__comm *)0x1;
  double t0 = mpg__now();
  mpg_status st = mpg__backend_nccl.world_init(&a, &w);
  double took = mpg__now() - t0;
  cr_assert_eq(st, MPG_ERR_TIMEOUT, "got %s: %s", mpg_status_name(st), mpg_last_error());
  cr_assert_null(w);
  cr_assert(strstr(mpg_last_error(), "not every rank connected"), "%s", mpg_last_error());
  cr_assert(took < 30, "world_init took %.1f s with a 2 s timeout", took);
  cr_log_info("backend world_init, rank 1 of 2 alone: MPG_ERR_TIMEOUT after %.2f s", took);

  /* The public API, as rank 0 of 2 with a fresh id. */
  cr_assert_eq(ncclGetUniqueId(&id), ncclSuccess);
  mpg_mesh *mesh = make_dims_mesh("dp=2");
  mpg_init_opts o = nccl_opts(0, 2, 0, 2);
  o.nccl_id = &id;
  mpg_ctx *ctx = (mpg_ctx *)0x1;
  t0 = mpg__now();
  st = mpg_ctx_create(mesh, &o, &ctx);
  took = mpg__now() - t0;
  cr_assert_eq(st, MPG_ERR_TIMEOUT, "got %s: %s", mpg_status_name(st), mpg_last_error());
  cr_assert_null(ctx);
  cr_assert(took < 30, "mpg_ctx_create took %.1f s with a 2 s timeout", took);
  mpg_mesh_destroy(mesh);
  cr_log_info("mpg_ctx_create, rank 0 of 2 alone: MPG_ERR_TIMEOUT after %.2f s (%s)",
              took, mpg_last_error());
}
