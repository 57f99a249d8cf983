/* What the tests of meshpg's NCCL backend on the double with ranks as
 * threads (test_nccl_env.c, test_nccl_rules.c, test_double_vs_thread.c,
 * test_nccl_ops_on_double.c: one program each) share. */
#ifndef MESHPG_TESTS_ON_DOUBLE_H
#define MESHPG_TESTS_ON_DOUBLE_H

#include <criterion/criterion.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <pthread.h>
#include <stdio.h>

#include "clock.h"     /* now_s, sleep_s (tests/support) */
#include "mesh_util.h" /* mesh_build */
#include "meshpg.h"

/* The options of rank `rank` of `world` thread ranks of the NCCL backend,
 * on device `rank` (one process: local rank = rank), joined by the unique
 * id `id` (NULL: the MASTER_ADDR rendezvous), with timeout_s (<= 0: the
 * backend's default). */
static inline mpg_init_opts nccl_thread_opts(int rank, int world, const ncclUniqueId *id,
                                             double timeout_s) {
  mpg_init_opts o = MPG_INIT_OPTS_INIT;
  o.backend.name = MPG_BACKEND_NCCL;
  o.rank = o.local_rank = o.device = rank;
  o.world_size = o.local_world_size = world;
  o.nccl_id = id;
  if (timeout_s > 0) o.backend.timeout_s = timeout_s;
  return o;
}

/* One rank thread of nccl_thread_run. */
struct nccl_thread {
  mpg_rank_main fn;
  void *arg;
  const ncclUniqueId *id;
  int rank, world;
  double timeout_s;
};

static inline void *nccl_thread_main(void *p) {
  const struct nccl_thread *t = p;
  mpg_init_opts o = nccl_thread_opts(t->rank, t->world, t->id, t->timeout_s);
  cudaSetDevice(t->rank);
  (void)t->fn(&o, t->arg);
  return NULL;
}

#define NCCL_THREADS_MAX 16

/* mpg_thread_run's counterpart for the NCCL backend on the double, on the
 * test thread: `world` rank threads (at most NCCL_THREADS_MAX) share a new
 * unique id, each sets its device (= its rank) and runs
 * fn(nccl_thread_opts(rank, world, &id, timeout_s), arg); returns when all
 * have.  fn's status is the rank's own business (it records what the test
 * checks). */
static inline void nccl_thread_run(int world, double timeout_s, mpg_rank_main fn, void *arg) {
  cr_assert(world > 0 && world <= NCCL_THREADS_MAX, "world %d", world);
  ncclUniqueId id;
  cr_assert_eq(ncclGetUniqueId(&id), ncclSuccess);
  pthread_t th[NCCL_THREADS_MAX];
  struct nccl_thread t[NCCL_THREADS_MAX];
  for (int r = 0; r < world; r++) {
    t[r] = (struct nccl_thread){fn, arg, &id, r, world, timeout_s};
    cr_assert_eq(pthread_create(&th[r], NULL, nccl_thread_main, &t[r]), 0);
  }
  for (int r = 0; r < world; r++) pthread_join(th[r], NULL);
}

/* On the test thread: the mesh of dims ("dp=2,tp=2") over world ranks. */
static inline mpg_mesh *mesh_of(const char *dims, int world) {
  mpg_mesh *m = NULL;
  cr_assert_eq(mesh_build(dims, NULL, world, &m), MPG_OK, "%s: %s", dims, mpg_last_error());
  return m;
}

/* A rank keeps its first failed check in fail, a char array: the test
 * thread asserts it empty. */
#define FIRST_FAIL(fail, cond, ...)                                 \
  do {                                                              \
    if (!(cond) && !(fail)[0]) snprintf((fail), sizeof(fail), __VA_ARGS__); \
  } while (0)

#endif
