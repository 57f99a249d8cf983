/* The shared-memory sync path (issue 23, groups/shm/): on the CPU backends
 * a sync buffer whose reduce group (shard mode: shard group) has all its
 * members on one host lives in node-local shared memory, and each bucket
 * is reduced in one pass by every member's worker thread.  Its arithmetic
 * must equal the thread backend's ordinary path (groups/thread/coll.c,
 * reduce_all) bit for bit, which is what MESHPG_SHM=0 gives.  (A buffer,
 * all-reduced or sharded, whose group has the same number >= 2 of members
 * on each of several hosts is reduced hierarchically: per host in shared
 * memory, then across hosts; its order is node by node.)
 *
 * Built twice (tests/sync/meson.build):
 *  - test_sync_shm (thread backend, ranks are threads):
 *      shm_props    random meshes and param lists, replicate and shard
 *                   modes: every rank's gradients (shard mode: its owned
 *                   slices, and the gathered params) after each step are
 *                   memcmp-equal between MESHPG_SHM=1 and MESHPG_SHM=0;
 *                   all-reduced gradients also equal, bit for bit, a
 *                   reference computed here (position-order sum); and
 *                   mpg_sync_stats.shm_buffers counts exactly the buffers
 *                   whose group has >= 2 members on this host (0 off);
 *                   shard mode on one host gathers the params in a second
 *                   segment (shm_bytes counts both), bit for bit the
 *                   backend's gather (shard_gather_in_shared_memory);
 *      shm_hosts    the same with ranks on two "hosts" (init opts
 *                   host_id): a group spanning both is shared only with
 *                   the same number >= 2 on each host (hierarchical: its
 *                   own summation order, checked against its reference;
 *                   a sharded buffer's owned slices also against replicate
 *                   mode's hierarchical all-reduce of the same data, and
 *                   HSDP's against the two-level oracle), else (3 + 1, one
 *                   per host) reduced by the backend, as MESHPG_SHM=0;
 *                   shard mode across hosts gathers the params in a
 *                   second, hierarchical segment, bit for bit
 *                   MESHPG_SHM=0's (shard_gather_across_hosts; every
 *                   sharded hierarchical case compares its gathered
 *                   params, set apart from the sums);
 *      shm_env      MESHPG_SHM=2 fails every member's commit with
 *                   MPG_ERR_ENV naming MESHPG_SHM;
 *      shm_faults   a rank that stalls past the timeout in the middle of a
 *                   step (one host; two hosts, replicate and shard mode):
 *                   the others fail in time, grads invalid, clean
 *                   destroys; a rank that never posts its gather (shard
 *                   mode, params in shared memory): the others fail in
 *                   time naming it;
 *      shm_segment  an anonymous mapping the kernel refuses (4 TiB per
 *                   rank): commit fails naming it, its size and the errno.
 *  - test_sync_shm_mpi (SHM_TEST_MPI, only with MPI): real `mpirun -np 2 /
 *    -np 4` processes of shm_mpi_worker: results equal to the position-order
 *    f32 sum computed in the worker, two hosts (host_id) in the hierarchical
 *    form and its order, shard mode's gather in shared memory equal to the
 *    MPI backend's (random cases), nothing left in /dev/shm, a segment larger than
 *    /dev/shm's free space, or without the slack for Open MPI's own shared
 *    memory, fails commit with MPG_ERR_ENV; the creator killed in the
 *    middle of commit leaves nothing in /dev/shm; names an earlier job left
 *    there do not fail commit.
 * test_sync_shm's cases, their steps and the run with the path on against
 * the run with it off are in test_sync_shm_cases.c (test_sync_shm.h). */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef SHM_TEST_MPI
#include <dirent.h>

#include "../support/mpirun_util.h"
#else
#include "../support/time_bound.h"
#include "shard_check.h"
#include "test_sync_shm.h"
#endif
#include "../support/clock.h"
#include "../support/mesh_util.h"

#ifndef SHM_TEST_MPI
/* 30 random cases in replicate mode, 30 in shard mode (2..16 ranks). */
Test(shm_props, replicate_mode_bit_identical_to_no_shm, .timeout = 240) {
  pc_tally t = {0};
  run_random(1, 30, 0, 1, &t);
  cr_log_info("%d cases, %ld elements checked against the reference", t.cases, t.exact);
  cr_assert_gt(t.exact, 100000, "only %ld elements checked against the reference", t.exact);
  /* the path was taken, and not trivially */
  cr_assert_geq(t.with_shm, 24, "only %d of %d cases had a buffer on the shared path",
                t.with_shm, t.cases);
}

Test(shm_props, shard_mode_bit_identical_to_no_shm, .timeout = 240) {
  pc_tally t = {0};
  run_random(101, 30, 1, 1, &t);
  cr_assert_geq(t.with_shm, 24, "only %d of %d cases had a buffer on the shared path",
                t.with_shm, t.cases);
}

/* ------------------------------------------------------------------ */
/* Fixed cases, one row each                                           */
/* ------------------------------------------------------------------ */

/* A fixed case: what differs from pc_init's defaults (a zero field keeps
 * the default), its params (up to the first of count 0), and the buffers
 * of each kind it must make (checked by the shm_hosts tests). */
#define ROW_PARAMS 8
typedef struct pc_row {
  const char *name, *mesh, *flatten;
  int world, hosts, shard, param_shm;
  const char *shard_dims, *replicate_dims;
  int sum, native;                   /* MPG_OP_SUM; MPG_REDUCE_NATIVE */
  double grad_scale;                 /* 0: 1.0 */
  double bucket_mb, first_bucket_mb; /* 0: pc_init's */
  unsigned seed;                     /* 0: pc_init's */
  pc_param params[ROW_PARAMS];
  int local, hier, spanning;         /* expect_kinds */
} pc_row;

/* shm_buffers counts exactly the buffers on one host plus the
 * hierarchical ones (see the shm_hosts tests below). */
static void expect_kinds(const pc_tally *t, const pc_tally *before, int local, int hier,
                         int spanning, const char *name) {
  cr_assert_eq(t->local - before->local, local, "%s: one-host shared buffers: %d, expected %d",
               name, t->local - before->local, local);
  cr_assert_eq(t->hier - before->hier, hier, "%s: hierarchical buffers: %d, expected %d", name,
               t->hier - before->hier, hier);
  cr_assert_eq(t->spanning - before->spanning, spanning,
               "%s: unshared buffers across hosts: %d, expected %d", name,
               t->spanning - before->spanning, spanning);
}

/* run_pair on each row; with check_kinds, expect_kinds after each. */
static void run_rows(const pc_row *rows, int n, int check_kinds, pc_tally *t) {
  pcase *c = malloc(sizeof *c);
  cr_assert_not_null(c);
  for (const pc_row *w = rows; w < rows + n; w++) {
    pc_init(c, w->name, w->mesh, w->flatten, w->world);
    c->hosts = w->hosts;
    c->shard = w->shard;
    c->param_shm = w->param_shm;
    if (w->shard_dims) snprintf(c->shard_dims, sizeof c->shard_dims, "%s", w->shard_dims);
    if (w->replicate_dims)
      snprintf(c->replicate_dims, sizeof c->replicate_dims, "%s", w->replicate_dims);
    if (w->sum) c->op = MPG_OP_SUM;
    if (w->native) c->reduce_dtype = MPG_REDUCE_NATIVE;
    if (w->grad_scale) c->grad_scale = w->grad_scale;
    if (w->bucket_mb) c->bucket_mb = w->bucket_mb;
    if (w->first_bucket_mb) c->first_bucket_mb = w->first_bucket_mb;
    if (w->seed) c->seed = w->seed;
    for (const pc_param *p = w->params; p < w->params + ROW_PARAMS && p->count; p++)
      pc_add(c, p->count, p->dtype, p->reduce_dims, p->tied);
    pc_tally before = *t;
    run_pair(c, t);
    if (check_kinds) expect_kinds(t, &before, w->local, w->hier, w->spanning, c->name);
  }
  free(c);
}

#define NROWS(a) ((int)(sizeof(a) / sizeof(a)[0]))
/* A row's param: count elements of dtype dt over the sync's reduce group
 * (P), over reduce dims rd (PD), tied over the first and last stage (PT). */
#define P(count, dt) {count, dt, NULL, 0}
#define PD(count, dt, rd) {count, dt, rd, 0}
#define PT(count, dt) {count, dt, NULL, 1}
#define HSDP_DIMS .shard_dims = "dp_shard,cp", .replicate_dims = "dp_replicate"

/* Fixed cases: HSDP with the shard group inside a node, a tied embedding,
 * every dtype in many buckets, 16 ranks in one group. */
static const pc_row fixed_rows[] = {
    /* 16 ranks in one group, every dtype, many buckets, avg x 0.37 */
    {.name = "dp16", .mesh = "dp=16", .flatten = "dp_cp=dp", .world = 16, .grad_scale = 0.37,
     .seed = 7,
     .params = {P(4099, MPG_F32), P(3001, MPG_BF16), P(2047, MPG_F16), P(1023, MPG_F64),
                P(3, MPG_F32), P(777, MPG_BF16)}},
    /* 12 ranks (not a power of two), sum, native halves */
    {.name = "dp3cp4", .mesh = "dp=3,cp=4", .flatten = "dp_cp=dp,cp", .world = 12, .sum = 1,
     .native = 1, .seed = 8,
     .params = {P(1001, MPG_F16), PD(999, MPG_BF16, "cp"), PD(555, MPG_F32, "dp"), P(9, MPG_F64)}},
    /* pipeline with a tied embedding and SP norms */
    {.name = "tied", .mesh = "pp=2,dp=2,cp=2,tp=2", .flatten = "dp_cp=dp,cp", .world = 16,
     .grad_scale = 0.37, .seed = 9,
     .params = {PT(1536, MPG_BF16), P(700, MPG_F32), PD(33, MPG_F32, "dp_cp,tp"),
                P(1200, MPG_BF16)}},
    /* HSDP: shard over dp_shard,cp, all-reduce over dp_replicate; avg x 0.37 */
    {.name = "hsdp", .mesh = "dp_replicate=2,dp_shard=2,cp=2,tp=2",
     .flatten = "dp_cp=dp_replicate,dp_shard,cp", .world = 16, .shard = 1, HSDP_DIMS,
     .grad_scale = 0.37, .seed = 10,
     .params = {P(2500, MPG_F32), P(1701, MPG_BF16), P(301, MPG_F16), PD(17, MPG_F32, "dp_cp,tp"),
                P(129, MPG_F64)}},
    /* shard mode with a tied param (kept replicated) and one param per bucket */
    {.name = "shard_tied", .mesh = "dp=2,pp=2,cp=2", .flatten = "dp_cp=dp,cp", .world = 8,
     .shard = 1, .bucket_mb = 1e-6, .first_bucket_mb = 1e-6, .seed = 11,
     .params = {PT(640, MPG_BF16), P(129, MPG_F32), P(1, MPG_F16), P(1000, MPG_F64)}},
};

Test(shm_props, fixed_cases_bit_identical_to_no_shm, .timeout = 120) {
  pc_tally t = {0};
  run_rows(fixed_rows, NROWS(fixed_rows), 0, &t);
  cr_assert_eq(t.with_shm, t.cases, "%d of %d fixed cases used the shared path", t.with_shm,
               t.cases);
}

/* Shard mode on one host (issue 34): the params live in a second segment
 * (stats.shm_bytes counts both, checked in prop_rank) and each bucket is
 * gathered there in one pass; every rank's gathered params equal
 * MESHPG_SHM=0's (the backend's mpg_all_gather) bit for bit, every dtype,
 * many buckets, 4 ranks and a shard group of 3 inside 6 ranks, avg and
 * avg x 0.37, slices above the size that switches the copy to
 * non-temporal stores (1 MiB). */
static const pc_row gather_rows[] = {
    {.name = "gather_dp4", .mesh = "dp=4", .flatten = "dp_cp=dp", .world = 4, .shard = 1,
     .param_shm = 1, .bucket_mb = 0.3, .first_bucket_mb = 0.3, .seed = 21,
     .params = {P(70001, MPG_F32), P(50003, MPG_BF16), P(40000, MPG_F16), P(30001, MPG_F64),
                P(5, MPG_F32), P(90017, MPG_BF16)}},
    {.name = "gather_shard3", .mesh = "dp=3,cp=2", .flatten = "dp_cp=dp,cp", .world = 6,
     .shard = 1, .param_shm = 1, .shard_dims = "dp", .grad_scale = 0.37, .bucket_mb = 4.0,
     .first_bucket_mb = 0.05, .seed = 22,
     /* a 1.2 MB slice per rank */
     .params = {P(900001, MPG_F32), P(20001, MPG_F64), P(333, MPG_BF16)}},
};

Test(shm_props, shard_gather_in_shared_memory, .timeout = 120) {
  pc_tally t = {0};
  run_rows(gather_rows, NROWS(gather_rows), 0, &t);
  cr_assert_eq(t.with_shm, 2, "%d of 2 cases used the shared path", t.with_shm);
  cr_assert_eq(t.local, 4 + 3, "%d buffers on one host, expected 7", t.local);
}

/* ------------------------------------------------------------------ */
/* Host identities                                                     */
/* ------------------------------------------------------------------ */

/* Ranks on two "hosts" (host_id "nodeA" for the first half of the world,
 * "nodeB" for the second).  A group spanning both is not reduced in one
 * segment: an all-reduced buffer whose group has the same number >= 2 of
 * members on each host is reduced hierarchically (one segment per host,
 * then across hosts: groups/shm/shm_internal.h), all-reduced or sharded
 * (reduce-scattered), any other buffer (one member per host, uneven
 * hosts) through the backend's collectives.  shm_buffers counts exactly the buffers on one host plus
 * the hierarchical ones; every result equals MESHPG_SHM=0's bit for bit,
 * except the hierarchical ones, whose order differs: those equal their
 * own reference (node sums in position order, then across nodes). */
static const pc_row spanning_rows[] = {
    /* dp outermost: dp_cp spans the hosts with 2 on each (hierarchical), dp
     * has one member on each (not shared), cp and tp stay inside. */
    {.name = "dp_outer", .mesh = "dp=2,cp=2,tp=2", .flatten = "dp_cp=dp,cp", .world = 8,
     .hosts = 2, .grad_scale = 0.37,
     .params = {P(1500, MPG_F32),        /* dp_cp: hierarchical */
                PD(801, MPG_BF16, "cp"),  /* inside */
                PD(99, MPG_F32, "tp"),    /* inside */
                PD(64, MPG_F16, "dp")},   /* one per host */
     .local = 2, .hier = 1, .spanning = 1},
    /* HSDP, dp_replicate outermost: the shard group is on one host; the
     * slices are then all-reduced across hosts by the backend. */
    {.name = "hsdp_2hosts", .mesh = "dp_replicate=2,dp_shard=2,cp=2",
     .flatten = "dp_cp=dp_replicate,dp_shard,cp", .world = 8, .hosts = 2, .shard = 1, HSDP_DIMS,
     .params = {P(2000, MPG_F32), P(555, MPG_BF16),
                PD(40, MPG_F32, "dp_cp"),          /* the sync's own group: sharded */
                PD(41, MPG_F64, "dp_replicate")},  /* replicated, one per host */
     .local = 2, .hier = 0, .spanning = 1},
    /* Shard mode, the shard group across the hosts (2 on each): its
     * reduce-scatter hierarchical too; a replicated param over dp_cp,tp (4
     * per host) hierarchical. */
    {.name = "shard_across", .mesh = "dp=2,cp=2,tp=2", .flatten = "dp_cp=dp,cp", .world = 8,
     .hosts = 2, .shard = 1, .sum = 1,
     .params = {P(1000, MPG_F32), PD(333, MPG_BF16, "dp_cp,tp"), PD(17, MPG_F32, "tp")},
     .local = 1, .hier = 2, .spanning = 0},
    /* Hosts interleaved in the group's positions (even and odd ranks: the
     * tp coordinate): dp_cp,tp hierarchical with 4 per host, alternating;
     * dp_cp on one host; tp one per host. */
    {.name = "interleaved", .mesh = "dp=2,cp=2,tp=2", .flatten = "dp_cp=dp,cp", .world = 8,
     .hosts = 3, .grad_scale = 0.37,
     .params = {PD(1000, MPG_BF16, "dp_cp,tp"), PD(2001, MPG_F64, "dp_cp,tp"), P(77, MPG_F32),
                PD(50, MPG_F32, "tp")},
     .local = 1, .hier = 2, .spanning = 1},
};

Test(shm_hosts, groups_spanning_two_hosts, .timeout = 240) {
  pc_tally t = {0};
  run_rows(spanning_rows, NROWS(spanning_rows), 1, &t);
  /* and random cases, hosts by halves and by parity */
  run_random(201, 4, 0, 2, &t);
  run_random(211, 4, 0, 3, &t);
  run_random(301, 4, 1, 2, &t);
  run_random(311, 4, 1, 3, &t);
  cr_assert_gt(t.local_and_spanning, 4, "only %d cases mixed one-host and cross-host groups",
               t.local_and_spanning);
  cr_assert_gt(t.hier, 6, "only %d hierarchical buffers", t.hier);
  cr_assert_gt(t.spanning, 6, "only %d unshared buffers across hosts", t.spanning);
  cr_log_info("%d cases, %ld elements checked against the reference", t.cases, t.exact);
}

/* Shard mode across two hosts: the sharded buffers (every dtype, many
 * buckets, avg, avg x 0.37, sum) are reduce-scattered hierarchically
 * (stats.shm_buffers counts them), their owned slices bit for bit the
 * two-host oracle ((host A's members in position order) + (host B's), f32
 * or f64, divided once, rounded once) and replicate mode's hierarchical
 * all-reduce of the same data (run_pair); HSDP with its shard group
 * across the hosts, hosts by halves and interleaved, against the
 * two-level oracle; and a shard group 3 + 1 that keeps to the backend,
 * equal to MESHPG_SHM=0. */
/* dp_cp = dp,cp: 2 per host; dp alone: one per host (replicated) */
#define TWO_HOSTS_DTYPES                                                                   \
  .mesh = "dp=2,cp=2,tp=2", .flatten = "dp_cp=dp,cp", .world = 8, .hosts = 2, .shard = 1, \
  .params = {P(4099, MPG_F32), P(3001, MPG_BF16), P(2047, MPG_F16), P(1023, MPG_F64),         \
             P(3, MPG_F32), PD(64, MPG_F16, "dp")},                                           \
  .local = 0, .hier = 4, .spanning = 1
static const pc_row across_rows[] = {
    {.name = "shard_2hosts_avg", TWO_HOSTS_DTYPES, .seed = 40},
    {.name = "shard_2hosts_scaled", TWO_HOSTS_DTYPES, .seed = 41, .grad_scale = 0.37},
    {.name = "shard_2hosts_sum", TWO_HOSTS_DTYPES, .seed = 42, .sum = 1, .native = 1},
    /* Four per host (world 16), one param per bucket */
    {.name = "shard_4per_host", .mesh = "dp=4,cp=4", .flatten = "dp_cp=dp,cp", .world = 16,
     .hosts = 2, .shard = 1, .seed = 44, .bucket_mb = 1e-6, .first_bucket_mb = 1e-6,
     .params = {P(1001, MPG_BF16), P(515, MPG_F32), P(1, MPG_F16)},
     .local = 0, .hier = 3, .spanning = 0},
    /* HSDP: shard dp_shard,cp across the hosts (2 on each), replicate
     * dp_replicate inside a host; avg x 0.37 */
    {.name = "hsdp_shard_across", .mesh = "dp_shard=2,dp_replicate=2,cp=2",
     .flatten = "dp_cp=dp_shard,dp_replicate,cp", .world = 8, .hosts = 2, .shard = 1,
     .seed = 45, HSDP_DIMS, .grad_scale = 0.37,
     .params = {P(2500, MPG_F32), P(1701, MPG_BF16), P(301, MPG_F16), P(129, MPG_F64)},
     .local = 0, .hier = 4, .spanning = 0},
    /* HSDP, hosts interleaved (even and odd ranks: cp): the shard group
     * dp_shard,cp has its hosts alternating in position order; avg */
    {.name = "hsdp_interleaved", .mesh = "dp_replicate=2,dp_shard=2,cp=2",
     .flatten = "dp_cp=dp_replicate,dp_shard,cp", .world = 8, .hosts = 3, .shard = 1,
     .seed = 46, HSDP_DIMS,
     .params = {P(2000, MPG_BF16), P(999, MPG_F32), P(77, MPG_F64)},
     .local = 0, .hier = 3, .spanning = 0},
    /* Uneven hosts, 3 + 1: the shard group keeps to the backend's
     * reduce-scatter (not shared), equal to MESHPG_SHM=0 bit for bit. */
    {.name = "shard_3plus1", .mesh = "dp=4", .flatten = "dp_cp=dp", .world = 4, .hosts = 4,
     .shard = 1, .seed = 47, .grad_scale = 0.37,
     .params = {P(1500, MPG_F32), P(777, MPG_BF16)},
     .local = 0, .hier = 0, .spanning = 2},
};

Test(shm_hosts, shard_mode_across_two_hosts, .timeout = 240) {
  pc_tally t = {0};
  run_rows(across_rows, NROWS(across_rows), 1, &t);
  cr_log_info("%d cases, %ld elements checked against the references", t.cases, t.exact);
}

/* Shard mode's gather across hosts in shared memory: a shard group of
 * 2 + 2 (hosts by halves) and 3 + 3 (interleaved: even and odd ranks)
 * keeps its params in a second, hierarchical segment (stats.shm_bytes
 * counts it), and every rank's gathered params equal MESHPG_SHM=0's (the
 * backend's mpg_all_gather) bit for bit (first_difference: the owned
 * parts set independently of the hierarchical sums), every dtype, many
 * buckets, slices above the size that switches the copy to non-temporal
 * stores (1 MiB). */
static const pc_row gather_across_rows[] = {
    {.name = "gather_2x2", .mesh = "dp=4", .flatten = "dp_cp=dp", .world = 4, .hosts = 2,
     .shard = 1, .param_shm = 1, .bucket_mb = 0.3, .first_bucket_mb = 0.3, .seed = 51,
     .params = {P(70001, MPG_F32), P(50003, MPG_BF16), P(40000, MPG_F16), P(30001, MPG_F64),
                P(5, MPG_F32)},
     .local = 0, .hier = 4, .spanning = 0},
    {.name = "gather_2x3_interleaved", .mesh = "dp=6", .flatten = "dp_cp=dp", .world = 6,
     .hosts = 3, .shard = 1, .param_shm = 1, .grad_scale = 0.37, .bucket_mb = 8.0,
     .first_bucket_mb = 0.05, .seed = 52,
     /* a 1.2 MB slice per rank */
     .params = {P(1800001, MPG_F32), P(20001, MPG_F64), P(333, MPG_BF16)},
     .local = 0, .hier = 3, .spanning = 0},
};

Test(shm_hosts, shard_gather_across_hosts, .timeout = 240) {
  pc_tally t = {0};
  run_rows(gather_across_rows, NROWS(gather_across_rows), 1, &t);
  cr_assert_eq(t.with_shm, 2, "%d of 2 cases used the shared path", t.with_shm);
}

/* ------------------------------------------------------------------ */
/* MESHPG_SHM values                                                   */
/* ------------------------------------------------------------------ */

typedef struct env_job {
  const char *mesh, *flatten;
  size_t huge; /* 0: params "w" (1000 f32) and "h" (999 bf16); else one f32
                  param "huge" of that many elements */
  mpg_status commit[PC_MAX_RANKS];
  char msg[PC_MAX_RANKS][512];
  int shm_buffers[PC_MAX_RANKS];
} env_job;

static mpg_status env_rank(const mpg_init_opts *opts, void *arg) {
  env_job *j = arg;
  int r = opts->rank;
  mpg_mesh *mesh = NULL;
  mpg_ctx *ctx = NULL;
  mpg_sync *s = NULL;
  mpg_status st = mesh_build(j->mesh, j->flatten, 0, &mesh);
  if (!st && (st = mpg_ctx_create(mesh, opts, &ctx))) {
    /* MESHPG_SHM is read, by the rule of every variable, at create. */
    j->commit[r] = st;
    put_msg(j->msg[r], sizeof j->msg[r], "%s", mpg_last_error());
    mpg_mesh_destroy(mesh);
    return MPG_OK;
  }
  if (!st) st = mpg_sync_create(ctx, NULL, &s);
  int id;
  if (!st && j->huge) st = mpg_sync_add_param(s, "huge", j->huge, MPG_F32, NULL, &id);
  if (!st && !j->huge) st = mpg_sync_add_param(s, "w", 1000, MPG_F32, NULL, &id);
  if (!st && !j->huge) st = mpg_sync_add_param(s, "h", 999, MPG_BF16, NULL, &id);
  if (st) {
    put_msg(j->msg[r], sizeof j->msg[r], "setup: %s: %s", mpg_status_name(st),
            mpg_last_error());
    j->commit[r] = MPG_ERR_INVALID; /* not what the test looks for */
  } else {
    j->commit[r] = mpg_sync_commit(s);
    put_msg(j->msg[r], sizeof j->msg[r], "%s", j->commit[r] ? mpg_last_error() : "");
    mpg_sync_stats stats = MPG_SYNC_STATS_INIT;
    if (!j->commit[r] && !mpg_sync_get_stats(s, &stats)) j->shm_buffers[r] = stats.shm_buffers;
  }
  st = mpg_sync_destroy(s);
  mpg_status st2 = mpg_ctx_destroy(ctx);
  mpg_mesh_destroy(mesh);
  return st ? st : st2;
}

static env_job *env_run(const char *value, const char *mesh, const char *flatten, int world,
                        size_t huge, double *secs) {
  env_job *j = calloc(1, sizeof *j);
  cr_assert_not_null(j);
  j->mesh = mesh;
  j->flatten = flatten;
  j->huge = huge;
  setenv("MESHPG_SHM", value, 1);
  double t0 = now_s();
  mpg_status rc = mpg_thread_run(world, 10.0, env_rank, j, NULL);
  *secs = now_s() - t0;
  cr_assert_eq(rc, MPG_OK, "MESHPG_SHM=%s: destroy failed: %s", value, mpg_last_error());
  return j;
}

/* A bad value fails mpg_ctx_create on every rank (groups/settings.c: every
 * MESHPG_* variable is read there, by one rule), before any commit. */
Test(shm_env, bad_value_fails_every_create_with_env, .timeout = 60) {
  static const char *const bad[] = {"2", "yes", "on", " 1"};
  for (int k = 0; k < 4; k++) {
    double secs;
    env_job *j = env_run(bad[k], "dp=2,cp=2", "dp_cp=dp,cp", 4, 0, &secs);
    for (int r = 0; r < 4; r++) {
      cr_assert_eq(j->commit[r], MPG_ERR_ENV, "MESHPG_SHM=\"%s\": rank %d: create -> %s: %s",
                   bad[k], r, mpg_status_name(j->commit[r]), j->msg[r]);
      cr_assert(strstr(j->msg[r], "MESHPG_SHM"), "MESHPG_SHM=\"%s\": rank %d: %s", bad[k], r,
                j->msg[r]);
    }
    /* The value is named by the rank that read it. */
    char quoted[16];
    snprintf(quoted, sizeof quoted, "\"%s\"", bad[k]);
    cr_assert(strstr(j->msg[0], quoted), "rank 0 does not quote the value %s: %s", quoted,
              j->msg[0]);
    /* No hang: one exchange fails it, far under the 10 s timeout. */
    cr_assert_lt(secs, tb_bound(5.0, 4), "MESHPG_SHM=%s: took %.2f s", bad[k], secs);
    free(j);
  }
  /* A default group of one member (dp=1): the bad value fails every rank
   * all the same. */
  {
    double secs;
    env_job *j = env_run("2", "dp=1,tp=2", NULL, 2, 0, &secs);
    for (int r = 0; r < 2; r++)
      cr_assert_eq(j->commit[r], MPG_ERR_ENV, "dp=1: rank %d: create -> %s: %s", r,
                   mpg_status_name(j->commit[r]), j->msg[r]);
    free(j);
  }
  /* 0, 1 and "" are accepted; "" is the default (on). */
  static const char *const good[] = {"0", "1", ""};
  for (int k = 0; k < 3; k++) {
    double secs;
    env_job *j = env_run(good[k], "dp=2,cp=2", "dp_cp=dp,cp", 4, 0, &secs);
    for (int r = 0; r < 4; r++) {
      cr_assert_eq(j->commit[r], MPG_OK, "MESHPG_SHM=\"%s\": rank %d: %s", good[k], r,
                   j->msg[r]);
      cr_assert_eq(j->shm_buffers[r], strcmp(good[k], "0") == 0 ? 0 : 2,
                   "MESHPG_SHM=\"%s\": rank %d: shm_buffers %d", good[k], r,
                   j->shm_buffers[r]);
    }
    free(j);
  }
}

/* ------------------------------------------------------------------ */
/* A stalled rank                                                      */
/* ------------------------------------------------------------------ */

#define STALL_TIMEOUT_S 1.0
#define STALL_RANKS 4

/* A job of STALL_RANKS thread ranks on dp=2,cp=2 in which the last rank
 * stalls past the timeout: in the middle of a step (stall_rank) or before
 * its gather (gstall_rank). */
typedef struct stall_job {
  int hosts; /* 1: ranks 0-1 on "hostA", 2-3 on "hostB" (the hierarchical form);
                2: the same in shard mode (the hierarchical reduce-scatter) */
  mpg_status finish[STALL_RANKS], gather[STALL_RANKS], late[STALL_RANKS],
      sync_destroy[STALL_RANKS], ctx_destroy[STALL_RANKS];
  int valid[STALL_RANKS], shm_buffers[STALL_RANKS];
  double secs[STALL_RANKS];
  size_t shm_bytes[STALL_RANKS], total_bytes[STALL_RANKS];
  char msg[STALL_RANKS][1024];
  char err[STALL_RANKS][512]; /* setup failures */
} stall_job;

/* A rank's objects, and the call that failed. */
typedef struct stall_env {
  mpg_mesh *mesh;
  mpg_ctx *ctx;
  mpg_sync *s;
  const char *where;
} stall_env;

/* The rank's context (its host per j->hosts) and a committed sync of
 * nparams params of count elements, f32 and bf16 alternating; records the
 * sync's stats. */
static mpg_status stall_setup(stall_job *j, const mpg_init_opts *opts, const mpg_sync_opts *so,
                              int nparams, size_t count, stall_env *e) {
  int r = opts->rank;
  e->where = "mesh";
  mpg_status st = mesh_build("dp=2,cp=2", "dp_cp=dp,cp", 0, &e->mesh);
  mpg_init_opts o = *opts;
  if (j->hosts) o.host_id = r < 2 ? "hostA" : "hostB";
  if (!st) e->where = "ctx_create", st = mpg_ctx_create(e->mesh, &o, &e->ctx);
  if (!st) e->where = "sync_create", st = mpg_sync_create(e->ctx, so, &e->s);
  for (int p = 0; p < nparams && !st; p++) {
    char name[16];
    int id;
    snprintf(name, sizeof name, "w%d", p);
    e->where = "add_param";
    st = mpg_sync_add_param(e->s, name, count, p % 2 ? MPG_BF16 : MPG_F32, NULL, &id);
  }
  if (!st) e->where = "commit", st = mpg_sync_commit(e->s);
  mpg_sync_stats stats = MPG_SYNC_STATS_INIT;
  if (!st) e->where = "get_stats", st = mpg_sync_get_stats(e->s, &stats);
  j->shm_buffers[r] = stats.shm_buffers;
  j->shm_bytes[r] = stats.shm_bytes;
  j->total_bytes[r] = stats.total_bytes;
  return st;
}

/* Records a setup failure (st != 0), then destroys the rank's objects. */
static mpg_status stall_teardown(stall_job *j, int r, mpg_status st, stall_env *e) {
  if (st)
    put_msg(j->err[r], sizeof j->err[r], "%s: %s: %s", e->where, mpg_status_name(st),
            mpg_last_error());
  j->sync_destroy[r] = mpg_sync_destroy(e->s);
  j->ctx_destroy[r] = mpg_ctx_destroy(e->ctx);
  mpg_mesh_destroy(e->mesh);
  return MPG_OK;
}

/* Well past the timeout. */
static void stall(void) { sleep_s(STALL_TIMEOUT_S + 1.5); }

static mpg_status stall_rank(const mpg_init_opts *opts, void *arg) {
  stall_job *j = arg;
  int r = opts->rank;
  stall_env e = {0};
  j->finish[r] = MPG_ERR_INVALID;
  j->valid[r] = -1;
  mpg_sync_opts so = MPG_SYNC_OPTS_INIT;
  so.sync.bucket_mb = 0.001;
  so.sync.first_bucket_mb = 0.001;
  if (j->hosts == 2) so.sync.mode = MPG_SYNC_SHARD;
  mpg_status st = stall_setup(j, opts, &so, 6, 300, &e);
  if (!st) e.where = "step 0", st = mpg_sync_all(e.s, 0, NULL);
  if (!st) e.where = "begin", st = mpg_sync_begin(e.s, 1, 1, NULL);
  for (int p = 5; p >= 3 && !st; p--) e.where = "mark_ready", st = mpg_sync_mark_ready(e.s, p);
  if (!st) {
    mpg_status mst = MPG_OK;
    if (r == STALL_RANKS - 1) {
      stall(); /* with w2..w0 unmarked, then finishes */
    } else {
      for (int p = 2; p >= 0 && !mst; p--) mst = mpg_sync_mark_ready(e.s, p);
    }
    double t0 = now_s();
    j->finish[r] = mst ? mst : mpg_sync_finish(e.s);
    j->secs[r] = now_s() - t0;
    put_msg(j->msg[r], sizeof j->msg[r], "%s", mpg_last_error());
    j->valid[r] = mpg_sync_grads_valid(e.s);
  }
  return stall_teardown(j, r, st, &e);
}

/* A rank that never posts its gather (issue 34): shard mode, one host, the
 * params in shared memory; after a good step and gather, rank 3 stalls
 * past the timeout before mpg_sync_gather_begin.  The others' gathers fail
 * within the timeout + 1 s, naming it by position and rank; rank 3's late
 * gather fails too; every sync and context destroys cleanly. */
static mpg_status gstall_rank(const mpg_init_opts *opts, void *arg) {
  stall_job *j = arg;
  int r = opts->rank;
  stall_env e = {0};
  j->gather[r] = j->late[r] = MPG_ERR_INVALID;
  mpg_sync_opts so = MPG_SYNC_OPTS_INIT;
  so.sync.mode = MPG_SYNC_SHARD;
  so.sync.bucket_mb = so.sync.first_bucket_mb = 0.002;
  mpg_status st = stall_setup(j, opts, &so, 4, 900, &e);
  if (!st) e.where = "step 0", st = mpg_sync_all(e.s, 0, NULL);
  if (!st) e.where = "gather 0", st = mpg_sync_gather_begin(e.s, NULL);
  if (!st) st = mpg_sync_gather_all(e.s);
  if (!st) e.where = "step 1", st = mpg_sync_all(e.s, 1, NULL);
  if (!st) {
    mpg_status *out = r == STALL_RANKS - 1 ? &j->late[r] : &j->gather[r];
    if (r == STALL_RANKS - 1) stall();
    double t0 = now_s();
    *out = mpg_sync_gather_begin(e.s, NULL);
    if (!*out) *out = mpg_sync_gather_all(e.s);
    if (r != STALL_RANKS - 1) j->secs[r] = now_s() - t0;
    put_msg(j->msg[r], sizeof j->msg[r], "%s", mpg_last_error());
  }
  return stall_teardown(j, r, st, &e);
}

/* Runs the job with the shared path on; returns the bound of a failing
 * wait (the timeout + 1 s + the allowance). */
static double stall_run(stall_job *j, mpg_rank_main fn) {
  setenv("MESHPG_SHM", "1", 1);
  mpg_status rc = mpg_thread_run(STALL_RANKS, STALL_TIMEOUT_S, fn, j, NULL);
  cr_assert_eq(rc, MPG_OK, "%s", mpg_last_error());
  return tb_bound(STALL_TIMEOUT_S + 1.0, STALL_RANKS);
}

/* Rank r set up, and destroyed its sync and context cleanly. */
static void expect_setup_and_destroys(const stall_job *j, int r) {
  cr_assert_eq(j->err[r][0], '\0', "rank %d: %s", r, j->err[r]);
  cr_expect_eq(j->sync_destroy[r], MPG_OK, "rank %d: mpg_sync_destroy -> %s", r,
               mpg_status_name(j->sync_destroy[r]));
  cr_expect_eq(j->ctx_destroy[r], MPG_OK, "rank %d: mpg_ctx_destroy -> %s", r,
               mpg_status_name(j->ctx_destroy[r]));
}

static void stalled_rank(int hosts) {
  stall_job *j = calloc(1, sizeof *j);
  cr_assert_not_null(j);
  j->hosts = hosts;
  double bound = stall_run(j, stall_rank);
  for (int r = 0; r < STALL_RANKS; r++) {
    cr_log_info("rank %d: finish -> %s after %.3f s (bound %.3f s), grads_valid %d: %s", r,
                mpg_status_name(j->finish[r]), j->secs[r], bound, j->valid[r], j->msg[r]);
    expect_setup_and_destroys(j, r);
    cr_assert_eq(j->shm_buffers[r], 2, "rank %d: %d buffers on the shared path, expected 2",
                 r, j->shm_buffers[r]);
    cr_expect(j->finish[r] == MPG_ERR_TIMEOUT || j->finish[r] == MPG_ERR_ABORTED,
              "rank %d: finish -> %s, expected a timeout or abort: %s", r,
              mpg_status_name(j->finish[r]), j->msg[r]);
    cr_expect_eq(j->valid[r], 0, "rank %d: grads_valid %d after a failed step", r,
                 j->valid[r]);
    if (r == STALL_RANKS - 1) continue;
    cr_expect_leq(j->secs[r], bound,
                  "rank %d: finish failed after %.3f s, bound %.3f s = timeout %.1f s + 1 s "
                  "+ allowance %.3f s",
                  r, j->secs[r], bound, STALL_TIMEOUT_S, tb_allowance(STALL_RANKS));
    cr_expect(strstr(j->msg[r], "sync step 1: bucket"), "rank %d: %s", r, j->msg[r]);
    cr_expect(strstr(j->msg[r], "shared-memory reduction"),
              "rank %d did not fail in the shared-memory path: %s", r, j->msg[r]);
  }
  free(j);
}

Test(shm_faults, stalled_rank_fails_the_others_in_time, .timeout = 60) { stalled_rank(0); }

/* The same across two hosts: the stalled rank's host partner times out
 * in the segment, the other host's ranks in their all-reduce between
 * hosts, all within the timeout + 1 s. */
Test(shm_faults, stalled_rank_across_hosts, .timeout = 60) { stalled_rank(1); }

/* The same in shard mode: the sharded buffers' hierarchical reduce-scatter
 * (its step across hosts is a reduce-scatter) fails alike. */
Test(shm_faults, stalled_rank_across_hosts_shard_mode, .timeout = 60) { stalled_rank(2); }

Test(shm_faults, stalled_gather_names_the_missing_rank, .timeout = 60) {
  stall_job *j = calloc(1, sizeof *j);
  cr_assert_not_null(j);
  double bound = stall_run(j, gstall_rank);
  for (int r = 0; r < STALL_RANKS; r++) {
    cr_log_info("rank %d: gather -> %s after %.3f s (bound %.3f s), late -> %s: %s", r,
                mpg_status_name(j->gather[r]), j->secs[r], bound, mpg_status_name(j->late[r]),
                j->msg[r]);
    expect_setup_and_destroys(j, r);
    cr_assert_geq(j->shm_bytes[r], (size_t)STALL_RANKS * j->total_bytes[r],
                  "rank %d: shm_bytes %zu, total_bytes %zu: the params are not in shared "
                  "memory", r, j->shm_bytes[r], j->total_bytes[r]);
    if (r == STALL_RANKS - 1) {
      cr_expect_neq(j->late[r], MPG_OK, "rank %d: the late gather succeeded", r);
      continue;
    }
    cr_expect(j->gather[r] == MPG_ERR_TIMEOUT || j->gather[r] == MPG_ERR_ABORTED,
              "rank %d: gather -> %s, expected a timeout or abort: %s", r,
              mpg_status_name(j->gather[r]), j->msg[r]);
    cr_expect_leq(j->secs[r], bound, "rank %d: the gather failed after %.3f s, bound %.3f s",
                  r, j->secs[r], bound);
    cr_expect(strstr(j->msg[r], "sync gather") && strstr(j->msg[r], "shared-memory all-gather"),
              "rank %d did not fail in the shared-memory gather: %s", r, j->msg[r]);
    cr_expect(strstr(j->msg[r], "missing position 3 (world rank 3)"),
              "rank %d does not name the missing rank: %s", r, j->msg[r]);
  }
  free(j);
}

/* ------------------------------------------------------------------ */
/* A segment that cannot be made (thread backend)                      */
/* ------------------------------------------------------------------ */

#define HUGE_COUNT ((size_t)1 << 40) /* f32: 4 TiB per rank */

/* Issue 29: thread ranks share an anonymous mapping, not a file in
 * /dev/shm.  When it cannot be made (4 TiB per rank, more than memory and
 * swap: the kernel refuses the mapping unless it overcommits always),
 * every member's commit fails naming what was asked for, an anonymous
 * shared mapping of that many bytes, and the errno text; it used to say
 * "could not create its segment in /dev/shm: ERR_NOMEM". */
Test(shm_segment, thread_failure_names_the_anonymous_mapping, .timeout = 60) {
  FILE *f = fopen("/proc/sys/vm/overcommit_memory", "r");
  int mode = -1;
  if (f) {
    if (fscanf(f, "%d", &mode) != 1) mode = -1;
    fclose(f);
  }
  if (mode == 1)
    cr_skip_test("vm.overcommit_memory = 1: the kernel grants any mapping, a 4 TiB one too");
  double secs;
  env_job *j = env_run("1", "dp=2", NULL, 2, HUGE_COUNT, &secs);
  char want[128];
  snprintf(want, sizeof want, ": mmap: %s", strerror(ENOMEM));
  for (int r = 0; r < 2; r++) {
    cr_log_info("rank %d: commit -> %s: %s", r, mpg_status_name(j->commit[r]), j->msg[r]);
    cr_assert_eq(j->commit[r], MPG_ERR_NOMEM, "rank %d: commit -> %s: %s", r,
                 mpg_status_name(j->commit[r]), j->msg[r]);
    const char *m = strstr(j->msg[r], "an anonymous shared mapping of ");
    unsigned long long bytes = 0;
    cr_assert(m && sscanf(m, "an anonymous shared mapping of %llu bytes", &bytes) == 1,
              "rank %d does not name the anonymous mapping and its size: %s", r, j->msg[r]);
    cr_assert_geq(bytes, 2ull * HUGE_COUNT * 4, "rank %d: %llu bytes, less than 2 x 4 TiB: %s",
                  r, bytes, j->msg[r]);
    cr_assert(strstr(j->msg[r], want), "rank %d does not name the errno (\"%s\"): %s", r, want,
              j->msg[r]);
    cr_assert_null(strstr(j->msg[r], "/dev/shm"), "rank %d names /dev/shm: %s", r, j->msg[r]);
  }
  free(j);
}

#else /* SHM_TEST_MPI */

/* ------------------------------------------------------------------ */
/* MPI: real processes                                                 */
/* ------------------------------------------------------------------ */

static const char *worker(void) { return env_program("MESHPG_SHM_MPI_WORKER"); }

/* Entries of /dev/shm named meshpg-<pid>-... (pid 0: any). */
static char shm_prefix[64];
static int has_shm_prefix(const struct dirent *e) {
  return strncmp(e->d_name, shm_prefix, strlen(shm_prefix)) == 0;
}
static int shm_files(long pid) {
  if (pid) snprintf(shm_prefix, sizeof shm_prefix, "meshpg-%ld-", pid);
  else snprintf(shm_prefix, sizeof shm_prefix, "meshpg-");
  struct dirent **list;
  int n = scandir("/dev/shm", &list, has_shm_prefix, NULL);
  for (int k = 0; k < n; k++) free(list[k]);
  if (n >= 0) free(list);
  return n < 0 ? 0 : n;
}

/* mpirun -np N shm_mpi_worker MODE with the shared path on; expect exit
 * 0, every rank's "OK MODE rank R" and no FAIL line.  Returns 1 when the
 * worker skipped. */
static int run_worker(int np, const char *mode, double limit_s) {
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "MESHPG_SHM=1 timeout -k 5 %d " MPIRUN "-np %d '%s' %s",
           (int)limit_s, np, worker(), mode);
  double secs = 0;
  int rc = run(cmd, &secs);
  cr_log_info("%s: exit %d after %.2f s\n%s", cmd, rc, secs, out);
  cr_assert_eq(rc, 0, "%s\nexit code %d after %.2f s; output:\n%s", cmd, rc, secs, out);
  if (strstr(out, "SKIP ")) return 1;
  for (int r = 0; r < np; r++) {
    char ok[96];
    snprintf(ok, sizeof ok, "OK %s rank %d", mode, r);
    cr_assert(strstr(out, ok), "%s\nno \"%s\" line; output:\n%s", cmd, ok, out);
  }
  cr_assert_null(strstr(out, "FAIL "), "%s\noutput:\n%s", cmd, out);
  return 0;
}

/* No segment of the job's processes is left, and no more meshpg-*
 * entries than before (an unrelated job's segment lives only while its
 * ranks map it: looked at again after a pause). */
static void expect_nothing_left(int np, int before) {
  int pids = 0;
  for (const char *p = strstr(out, "pid of rank "); p; p = strstr(p + 1, "pid of rank ")) {
    int r;
    long pid;
    if (sscanf(p, "pid of rank %d: %ld", &r, &pid) != 2) continue;
    pids++;
    cr_expect_eq(shm_files(pid), 0, "rank %d (pid %ld) left %d segment(s) in /dev/shm", r, pid,
                 shm_files(pid));
  }
  cr_assert_eq(pids, np, "%d pids reported, expected %d; output:\n%s", pids, np, out);
  int after = shm_files(0);
  for (int k = 0; k < 20 && after > before; k++) {
    struct timespec ts = {0, 100000000L};
    nanosleep(&ts, NULL);
    after = shm_files(0);
  }
  cr_expect_leq(after, before, "/dev/shm/meshpg-*: %d before the job, %d after", before, after);
}

/* run_worker(np, mode), its output naming what it checked (want), and
 * nothing left behind. */
static void checked(int np, const char *mode, const char *want) {
  int before = shm_files(0);
  run_worker(np, mode, 200);
  cr_assert(strstr(out, want), "%s", out);
  expect_nothing_left(np, before);
}
static void values(int np) { checked(np, "values", "shm buffers"); }

/* Random non-integer f32 and bf16 gradients: every result equals, bit for
 * bit, the position-order f32 sum (pre-multiplied, averaged, rounded once)
 * that the worker computes itself; replicate and shard mode. */
Test(shm_mpi, values_2_ranks, .timeout = 240) { values(2); }
Test(shm_mpi, values_4_ranks, .timeout = 240) { values(4); }

/* Shard mode's parameter gather in shared memory (issue 34): six random
 * cases per job, every rank's gathered params equal to every owner's
 * values and, byte for byte, to a context's with MESHPG_SHM=0 (the MPI
 * backend's all-gather); both segments counted in shm_bytes; nothing
 * left in /dev/shm. */
static void gather(int np) { checked(np, "gather", "checked the shared-memory gather"); }
Test(shm_mpi, gather_2_ranks, .timeout = 240) { gather(2); }
Test(shm_mpi, gather_4_ranks, .timeout = 240) { gather(4); }

/* Two "hosts" (mpg_init_opts.host_id) of two processes: the hierarchical
 * form, results bit for bit (x0 + x1) + (x2 + x3), in replicate mode and
 * in shard mode (the owned slices also equal to replicate mode's),
 * nothing left behind. */
Test(shm_mpi, two_hosts_hierarchical_4_ranks, .timeout = 240) {
  checked(4, "hosts", "checked the hierarchical shm buffers, replicate and shard mode");
}

/* A param larger than /dev/shm's free space, then one that fits in it
 * but not with the slack kept for Open MPI's own shared memory (issue 29:
 * taking all but a few KB made Open MPI's transport die of SIGBUS in the
 * next all-reduce): commit fails with MPG_ERR_ENV on both ranks, naming
 * the bytes needed, the slack max(64 MiB, 1/16 of the segment) and the
 * bytes free. */
Test(shm_mpi, segment_larger_than_dev_shm_fails_commit, .timeout = 120) {
  int before = shm_files(0);
  if (run_worker(2, "overflow", 100)) {
    const char *why = strstr(out, "SKIP ");
    cr_skip_test("%s", why ? why : out);
  }
  cr_assert(strstr(out, "bytes free"), "%s", out);
  if (strstr(out, "SKIP overflow (slack)"))
    cr_log_warn("%s", strstr(out, "SKIP overflow (slack)"));
  else
    cr_assert(strstr(out, "rank 0, slack:") && strstr(out, "rank 1, slack:") &&
                  strstr(out, "bytes of slack"),
              "the slack case did not run on both ranks:\n%s", out);
  expect_nothing_left(2, before);
}

/* Issue 29: the segment's creator killed (SIGKILL, SIGTERM) in the middle
 * of mpg_sync_commit, right after the segment is created and reserved,
 * while its peer waits in commit's next all-gather.  The segment never
 * has a name, so nothing named meshpg-* is left in /dev/shm (it used to
 * be /dev/shm/meshpg-<pid>-dp-0-0 until every member had mapped it; a
 * kill in that window left it there). */
static void killed_creator(const char *sig) {
  int before = shm_files(0);
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "MESHPG_SHM=1 timeout -k 5 60 " MPIRUN "-np 2 '%s' killed %s",
           worker(), sig);
  double secs = 0;
  int rc = run(cmd, &secs);
  cr_log_info("%s: exit %d after %.2f s\n%s", cmd, rc, secs, out);
  char raised[64];
  snprintf(raised, sizeof raised, "rank 0 raises SIG%s in mpg_sync_commit", sig);
  cr_assert(strstr(out, raised), "%s\nno \"%s\" line (the kill never happened); exit %d, "
            "output:\n%s", cmd, raised, rc, out);
  cr_assert_neq(rc, 0, "%s\nthe job succeeded although rank 0 died; output:\n%s", cmd, out);
  cr_assert_null(strstr(out, "FAIL "), "%s\noutput:\n%s", cmd, out);
  expect_nothing_left(2, before);
}

Test(shm_mpi, creator_sigkilled_in_commit_leaves_nothing, .timeout = 120) {
  killed_creator("KILL");
}
Test(shm_mpi, creator_sigtermed_in_commit_leaves_nothing, .timeout = 120) {
  killed_creator("TERM");
}

/* Issue 29: files named as an earlier job of the same pid would have left
 * them (/dev/shm/meshpg-<pid>-dp-0-<k>, the names the library used to
 * pick; commit then failed with EEXIST): commit succeeds, syncs in shared
 * memory, and leaves the files alone. */
Test(shm_mpi, existing_names_do_not_fail_commit, .timeout = 120) {
  run_worker(2, "existing", 100);
  cr_assert(strstr(out, "committed and synced next to 4 existing names"), "%s", out);
}

#endif /* SHM_TEST_MPI */
