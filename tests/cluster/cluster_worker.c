/* One rank of the cluster tests (test_cluster.c), started on the hosts of a
 * tests/cluster/cluster.sh cluster by `mpirun` through the nsenter agent.
 * Every host has its own hostname, /dev/shm, pid numbers and network, so
 * what the library sees is what it would see on separate machines.
 *
 *   cluster_worker place MESH    mesh MESH on the mpi backend, placement by
 *                                the real hostnames: the context counts as
 *                                many nodes as there are hostnames, and every
 *                                tp and cp group has all its members on one
 *                                host, whatever the launcher's numbering
 *                                (the test runs --map-by slot and node)
 *   cluster_worker sync MESH     replicate, shard and (with dp and cp) HSDP
 *                                syncs of f32 and bf16 params, some reduced
 *                                over dp or cp alone, with MESHPG_SHM as
 *                                launched; every result bit for bit equal to
 *                                the documented order, worked out here from
 *                                the groups' hosts (sync.md, "Shared
 *                                memory"): position order on one host; on
 *                                H hosts with n >= 2 members each, each
 *                                host's sum in position order, then the two
 *                                hosts' sums added; a group the path
 *                                declines (uneven hosts, one member a host)
 *                                equal to the same sync with MESHPG_SHM=0 in
 *                                a second context; and stats.shm_buffers the
 *                                number of buffers the rules put in shared
 *                                memory
 *   cluster_worker samehost MESH the same, every rank claiming one host id
 *                                (opts.host_id "one-host") while the ranks
 *                                are on two hosts with two /dev/shm: the
 *                                path must turn itself off (no buffer in
 *                                shared memory) and the results equal
 *                                MESHPG_SHM=0's
 *   cluster_worker a2a MESH      random mpg_all_to_all_v (and equal
 *                                mpg_all_to_all) calls on every group of the
 *                                mesh and the world, blocking and async, on
 *                                malloc'ed and mpg_ctx_mem_alloc buffers,
 *                                every byte of every block and gap checked:
 *                                a group on one host through its
 *                                shared-memory channel, one across hosts
 *                                through the backend's MPI_Ialltoallv
 *   cluster_worker a2a-samehost MESH  the same, every rank claiming one
 *                                host id while on two hosts: the channel
 *                                of a group across them turns itself off
 *   cluster_worker steps MESH N T  N replicate steps of a 4 MiB f32 param over
 *                                the world with timeout T s, each printing
 *                                "STEP s rank R"; the test kills or cuts
 *                                something in the middle.  A step that fails
 *                                prints "END rank R status NAME ms MS: MSG"
 *                                (MS: how long the failing call took), then
 *                                the rank destroys its context and prints
 *                                "DESTROYED rank R status NAME"
 *
 * Every rank prints "HOST rank R launcher L host NAME", then "OK <mode> rank
 * R" or "FAIL <mode> rank R: ..." lines; exit code 0 / 1 (worker_main.h). */
#include <mpi.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "meshpg.h"
#include "../support/sync_util.h"
#include "../support/values.h"
#include "../support/mesh_util.h"
#include "../support/worker_main.h"

enum { MAXR = 64, HOSTLEN = 64 };

/* hostname of every context (mesh) rank */
static char g_host[MAXR][HOSTLEN];


static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

/* ------------------------------------------------------------------ */
/* Values                                                              */
/* ------------------------------------------------------------------ */

/* Rank r's gradient element i of param p at step s (values.h's tv_grad
 * under this worker's seed), and as it writes it in dtype dt. */
#define GEN_SEED 0xc1u
static float gen(int r, int p, int s, size_t i) { return tv_grad(GEN_SEED, r, p, s, i); }

static float input(mpg_dtype dt, int r, int p, int s, size_t i) {
  return tv_grad_in(GEN_SEED, dt == MPG_BF16, r, p, s, i);
}

/* How a group is reduced, by the rules of sync.md ("Shared memory"). */
enum { PATH_FLAT, PATH_HIER, PATH_BACKEND };

static int group_path(const int *m, int n, int shm_on, int *nhosts) {
  int first[MAXR], count[MAXR], h = 0;
  for (int k = 0; k < n; k++) {
    int j = 0;
    while (j < h && strcmp(g_host[first[j]], g_host[m[k]])) j++;
    if (j == h) first[h] = m[k], count[h++] = 0;
    count[j]++;
  }
  *nhosts = h;
  if (!shm_on || n < 2) return PATH_BACKEND;
  if (h == 1) return PATH_FLAT;
  for (int j = 0; j < h; j++)
    if (count[j] != count[0] || count[j] < 2) return PATH_BACKEND;
  return PATH_HIER;
}

/* The f32 sum over members m[0..n) of their (pre-multiplied) inputs in the
 * documented order of `path`; *known 0 when that order is the backend's
 * with more than two addends (then only a second run can tell). */
static float group_sum(mpg_dtype dt, const int *m, int n, int path, int p, int s, size_t i,
                       int premul, float f, int *known) {
  if (path == PATH_HIER) {
    float part[MAXR] = {0};
    int first[MAXR], h = 0;
    for (int k = 0; k < n; k++) {
      int j = 0;
      while (j < h && strcmp(g_host[first[j]], g_host[m[k]])) j++;
      volatile float x = input(dt, m[k], p, s, i);
      if (premul) x = x * f;
      if (j == h) first[h] = m[k], part[h++] = x;
      else part[j] = part[j] + x;
    }
    if (h > 2) *known = 0;
    float acc = part[0];
    for (int j = 1; j < h; j++) acc = acc + part[j];
    return acc;
  }
  if (path == PATH_BACKEND && n > 2) *known = 0;
  float acc = 0;
  for (int k = 0; k < n; k++) {
    volatile float x = input(dt, m[k], p, s, i);
    if (premul) x = x * f;
    acc = k == 0 ? x : acc + x;
  }
  return acc;
}

static uint32_t to_bits(mpg_dtype dt, float acc) {
  if (dt == MPG_BF16) return tv_f32_to_bf16(acc);
  uint32_t u;
  memcpy(&u, &acc, 4);
  return u;
}

typedef sync_param vparam; /* sync_util.h */

static const vparam PS[] = {
    {"f0", 701, MPG_F32, NULL},  {"b0", 1501, MPG_BF16, NULL}, {"f1", 3001, MPG_F32, NULL},
    {"b1", 777, MPG_BF16, NULL}, {"fcp", 37, MPG_F32, "cp"},   {"bdp", 515, MPG_BF16, "dp"},
    {"f3", 1, MPG_F32, NULL},
};
enum { NP = sizeof PS / sizeof PS[0], NMODES = 3 };

/* One run's results: every param's owned elements' bits, per mode. */
typedef struct run {
  uint32_t *bits[NMODES][NP];
} run;

static int has_dim(const mpg_mesh *mesh, const char *name) {
  int ds;
  return mpg_mesh_dimset_find(mesh, name, &ds) == MPG_OK;
}

/* The members of the group of dim set `dims` that holds `rank`. */
static int members_of(const mpg_mesh *mesh, const char *dims, int rank, int *m) {
  int ds, gi, size;
  if (mpg_mesh_dimset_find(mesh, dims, &ds) || mpg_mesh_group_of(mesh, ds, rank, &gi, NULL, &size) ||
      mpg_mesh_group_members(mesh, ds, gi, m))
    return 0;
  return size;
}

/* Mode 0 replicate (avg), 1 shard (avg x 0.37), 2 HSDP (shard over cp,
 * replicated over dp, x 0.37).  Fills out (NULL: only checks). */
static void run_mode(mpg_ctx *ctx, int mode, int shm_on, run *out, const run *ref) {
  const char *mname = mode == 0 ? "replicate" : mode == 1 ? "shard" : "hsdp";
  const mpg_mesh *mesh = mpg_ctx_mesh(ctx);
  const int me = mpg_ctx_rank(ctx);
  const double grad_scale = mode ? 0.37 : 1.0;
  mpg_sync *s = NULL;
  void *gv[NP];
  mpg_shard_info info[NP];
  mpg_group *gs[NP];
  int np = 0;
  const vparam *ps[NP];
  for (int p = 0; p < NP; p++)
    if (!PS[p].reduce_dims || has_dim(mesh, PS[p].reduce_dims)) ps[np++] = &PS[p];
  mpg_sync_opts so = MPG_SYNC_OPTS_INIT;
  so.sync.bucket_mb = 0.004;
  so.sync.first_bucket_mb = 0.001;
  so.grad_scale = grad_scale;
  if (mode) so.sync.mode = MPG_SYNC_SHARD;
  if (mode == 2) {
    snprintf(so.sync.shard_dims, sizeof so.sync.shard_dims, "cp");
    snprintf(so.sync.replicate_dims, sizeof so.sync.replicate_dims, "dp");
  }
  sync_param sel[NP]; /* HSDP: every param over the sync's dims */
  for (int p = 0; p < np; p++) {
    sel[p] = *ps[p];
    if (mode == 2) sel[p].reduce_dims = NULL;
  }
  TRY(sync_make_params(ctx, &so, sel, np, &s));
  /* The buffers the rules put in shared memory: distinct (dtype, group)
   * whose (shard) group takes the flat or hierarchical path. */
  int want = 0;
  struct {
    mpg_dtype dt;
    mpg_group *g;
  } keys[NP];
  int nkeys = 0;
  for (int p = 0; p < np; p++) {
    TRY(mpg_sync_param_group(s, p, &gs[p]));
    TRY(mpg_sync_grad(s, p, &gv[p]));
    info[p] = (mpg_shard_info)MPG_SHARD_INFO_INIT;
    if (mode) TRY(mpg_sync_get_shard(s, p, &info[p]));
    else info[p].count = ps[p]->count;
    int k = 0;
    while (k < nkeys && !(keys[k].dt == ps[p]->dtype && keys[k].g == gs[p])) k++;
    if (k < nkeys) continue;
    keys[nkeys].dt = ps[p]->dtype, keys[nkeys++].g = gs[p];
    int m[MAXR], n, h;
    n = mode == 2 ? members_of(mesh, "cp", me, m) : mpg_group_size(gs[p]);
    if (mode != 2)
      for (int q = 0; q < n; q++) TRY(mpg_group_member(gs[p], q, &m[q]));
    want += group_path(m, n, shm_on, &h) != PATH_BACKEND;
  }
  mpg_sync_stats stats = MPG_SYNC_STATS_INIT;
  TRY(mpg_sync_get_stats(s, &stats));
  if (stats.shm_buffers != want)
    fail("%s: shm_buffers %d, the rules give %d (of %d buffers)", mname, stats.shm_buffers,
         want, stats.num_buffers);
  if (me == 0)
    printf("%s: %d buffers, %d in shared memory (MESHPG_SHM=%d)\n", mname, stats.num_buffers,
           stats.shm_buffers, shm_on);

  long bad = 0, unknown = 0;
  const int step = 0;
  for (int p = 0; p < np; p++)
    for (size_t i = 0; i < ps[p]->count; i++) {
      float x = gen(me, (int)(ps[p] - PS), step, i);
      if (ps[p]->dtype == MPG_BF16) ((uint16_t *)gv[p])[i] = tv_f32_to_bf16(x);
      else ((float *)gv[p])[i] = x;
    }
  TRY(mpg_sync_all(s, step, NULL));
  if (!mpg_sync_grads_valid(s)) fail("%s: grads invalid", mname);
  for (int p = 0; p < np; p++) {
    const int pid = (int)(ps[p] - PS);
    mpg_dtype dt = ps[p]->dtype;
    int n = mpg_group_size(gs[p]);
    int premul = grad_scale != 1.0, avg = !premul;
    float f = (float)(grad_scale / n);
    /* The levels: HSDP sums over its cp (shard) group, then over dp in
     * position order (two members here); the others over their group. */
    int lv1[MAXR][MAXR], n1[MAXR], nrep = 1, path1[MAXR], h;
    if (mode == 2) {
      int rep[MAXR];
      nrep = members_of(mesh, "dp", me, rep);
      for (int j = 0; j < nrep; j++) {
        n1[j] = members_of(mesh, "cp", rep[j], lv1[j]);
        path1[j] = group_path(lv1[j], n1[j], shm_on, &h);
      }
    } else {
      n1[0] = n;
      for (int q = 0; q < n; q++) TRY(mpg_group_member(gs[p], q, &lv1[0][q]));
      path1[0] = group_path(lv1[0], n, shm_on, &h);
    }
    uint32_t *keep = out ? calloc(ps[p]->count, 4) : NULL;
    if (out) out->bits[mode][pid] = keep;
    for (size_t i = info[p].param_offset; i < info[p].param_offset + info[p].count; i++) {
      int known = nrep <= 2;
      float acc = 0;
      for (int j = 0; j < nrep; j++) {
        float part = group_sum(dt, lv1[j], n1[j], path1[j], pid, step, i, premul, f, &known);
        /* HSDP: the shard group's result is rounded to the buffer's dtype
         * before the replicate group's all-reduce adds it. */
        if (mode == 2 && dt == MPG_BF16) part = tv_bf16_to_f32(tv_f32_to_bf16(part));
        acc = j == 0 ? part : acc + part;
      }
      if (avg) acc = acc / (float)n;
      uint32_t got = dt == MPG_BF16 ? ((uint16_t *)gv[p])[i] : ((uint32_t *)gv[p])[i];
      if (keep) keep[i] = got;
      uint32_t want_bits = to_bits(dt, acc);
      if (!known) {
        unknown++;
        if (!ref || !ref->bits[mode][pid]) continue;
        want_bits = ref->bits[mode][pid][i];
      }
      if (got != want_bits && bad++ < 5)
        fail("%s: param %s (%zu x %s, group of %d) element %zu: got 0x%x, expected 0x%x (%s)",
             mname, ps[p]->name, ps[p]->count, mpg_dtype_name(dt), n, i, got, want_bits,
             known ? "the documented order" : "the MESHPG_SHM=0 run");
    }
  }
  if (bad) fail("%s: %ld elements differ", mname, bad);
  if (me == 0 && unknown)
    printf("%s: %ld elements in the backend's order%s\n", mname, unknown,
           ref ? ", equal to the MESHPG_SHM=0 run's" : "");
done:
  if (s) {
    mpg_status st = mpg_sync_destroy(s);
    if (st) fail("mpg_sync_destroy -> %s", mpg_status_name(st));
  }
}

/* ------------------------------------------------------------------ */
/* Contexts                                                            */
/* ------------------------------------------------------------------ */

static mpg_ctx *open_ctx(const char *dims, const char *host_id, double timeout_s,
                         mpg_mesh **mesh) {
  mpg_ctx *ctx = NULL;
  int world;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  TRY(mesh_build(dims, NULL, world, mesh));
  mpg_init_opts opts = MPG_INIT_OPTS_INIT;
  opts.backend.name = MPG_BACKEND_MPI;
  opts.backend.timeout_s = timeout_s;
  opts.host_id = host_id;
  opts.placement = 1; /* inner dims inside hosts, by the real hostnames */
  TRY(mpg_ctx_create(*mesh, &opts, &ctx));
  /* Every context rank's hostname (the launcher's ranks, renumbered). */
  char mine[HOSTLEN] = "", all[MAXR][HOSTLEN];
  int ranks[MAXR], me = mpg_ctx_rank(ctx);
  gethostname(mine, sizeof mine - 1);
  MPI_Allgather(mine, HOSTLEN, MPI_CHAR, all, HOSTLEN, MPI_CHAR, MPI_COMM_WORLD);
  MPI_Allgather(&me, 1, MPI_INT, ranks, 1, MPI_INT, MPI_COMM_WORLD);
  for (int l = 0; l < world && l < MAXR; l++) memcpy(g_host[ranks[l]], all[l], HOSTLEN);
done:
  return ctx;
}

static int mode_place(worker *w) {
  const char *dims = w->argv[0];
  mpg_mesh *mesh;
  mpg_ctx *ctx = open_ctx(dims, NULL, 60, &mesh);
  if (!ctx) return 0;
  int world = mpg_ctx_world_size(ctx), hosts = 0;
  for (int r = 0; r < world; r++) {
    int k = 0;
    while (k < r && strcmp(g_host[k], g_host[r])) k++;
    hosts += k == r;
  }
  if (mpg_ctx_num_nodes(ctx) != hosts)
    fail("mpg_ctx_num_nodes %d, but the ranks are on %d hosts", mpg_ctx_num_nodes(ctx), hosts);
  const char *inner[] = {"tp", "cp"};
  for (int d = 0; d < 2; d++) {
    if (!has_dim(mesh, inner[d])) continue;
    int m[MAXR], n = members_of(mesh, inner[d], mpg_ctx_rank(ctx), m);
    for (int k = 1; k < n; k++)
      if (strcmp(g_host[m[k]], g_host[m[0]]))
        fail("%s group of rank %d spans hosts: rank %d on %s, rank %d on %s", inner[d],
             mpg_ctx_rank(ctx), m[0], g_host[m[0]], m[k], g_host[m[k]]);
  }
  printf("PLACE rank %d launcher %d host %s nodes %d\n", mpg_ctx_rank(ctx),
         mpg_ctx_launcher_rank(ctx), g_host[mpg_ctx_rank(ctx)], mpg_ctx_num_nodes(ctx));
  ctx_close(ctx, mesh);
  return 0;
}

static int mode_sync(worker *w) {
  const char *dims = w->argv[0], *host_id = strstr(w->mode, "samehost") ? "one-host" : NULL;
  const char *env = getenv("MESHPG_SHM");
  int shm_on = !(env && strcmp(env, "0") == 0);
  run a = {0}, b = {0};
  mpg_mesh *mesh;
  /* The sync with MESHPG_SHM=0 (read at create), then as launched. */
  char launched[8];
  snprintf(launched, sizeof launched, "%s", env ? env : "");
  setenv("MESHPG_SHM", "0", 1);
  mpg_ctx *ctx = open_ctx(dims, host_id, 60, &mesh);
  if (!ctx) return 0;
  int modes = has_dim(mesh, "cp") && has_dim(mesh, "dp") ? 3 : 2;
  for (int m = 0; m < modes; m++) run_mode(ctx, m, 0, &b, NULL);
  ctx_close(ctx, mesh);
  if (launched[0]) setenv("MESHPG_SHM", launched, 1);
  else unsetenv("MESHPG_SHM");
  /* one host id for ranks on two hosts: the path must turn itself off */
  int eff = host_id ? 0 : shm_on;
  ctx = open_ctx(dims, host_id, 60, &mesh);
  if (ctx)
    for (int m = 0; m < modes; m++) run_mode(ctx, m, eff, &a, &b);
  ctx_close(ctx, mesh);
  /* The first run against the second, element by element: where the
   * path is on, the orders differ by design (each run was checked against
   * its own); where it is off, not a bit may differ. */
  long diff = 0;
  for (int m = 0; m < modes; m++)
    for (int p = 0; p < NP; p++) {
      if (!a.bits[m][p] || !b.bits[m][p]) continue;
      for (size_t i = 0; i < PS[p].count; i++)
        diff += a.bits[m][p][i] != b.bits[m][p][i];
    }
  if (g_rank == 0) printf("%ld elements differ from the MESHPG_SHM=0 run\n", diff);
  if (!eff && diff) fail("%ld elements differ from the MESHPG_SHM=0 run with the path off", diff);
  for (int m = 0; m < NMODES; m++)
    for (int p = 0; p < NP; p++) free(a.bits[m][p]), free(b.bits[m][p]);
  return 0;
}

/* One all-to-all of case `key` on g: position s sends position t
 * tv_mix64-drawn counts (0..40, a quarter of them 0) of dtype dt, blocks
 * in order with a gap of one element; every byte received and every gap
 * checked.  mem: the buffers from mpg_ctx_mem_alloc. */
static void a2a_case(mpg_ctx *ctx, mpg_group *g, uint64_t key, int v, int async, int mem) {
  enum { MAXG = 16 };
  int me = mpg_group_position(g), n = mpg_group_size(g);
  mpg_dtype dt = (mpg_dtype)(key % MPG_DTYPE_COUNT);
  size_t es = mpg_dtype_size(dt), sc[MAXG], sd[MAXG], rc[MAXG], rd[MAXG], sn = 0, rn = 0;
  if (n > MAXG) return;
  for (int p = 0; p < n; p++) {
    uint64_t hs = tv_mix64(key ^ (uint64_t)(me * 64 + p)), hr = tv_mix64(key ^ (uint64_t)(p * 64 + me));
    sc[p] = v ? (hs % 4 ? hs % 41 : 0) : key % 23;
    rc[p] = v ? (hr % 4 ? hr % 41 : 0) : key % 23;
    sd[p] = v ? sn + 1 : (size_t)p * sc[0];
    rd[p] = v ? rn + 1 : (size_t)p * rc[0];
    sn = sd[p] + sc[p];
    rn = rd[p] + rc[p];
  }
  unsigned char *send = NULL, *recv = NULL;
  if (mem) {
    TRY(mpg_ctx_mem_alloc(ctx, sn * es + 1, 0, (void **)&send));
    TRY(mpg_ctx_mem_alloc(ctx, rn * es + 1, 0, (void **)&recv));
  } else if (!(send = malloc(sn * es + 1)) || !(recv = malloc(rn * es + 1))) {
    fail("out of memory");
    goto done;
  }
  memset(recv, 0xa5, rn * es + 1);
  for (int t = 0; t < n; t++)
    for (size_t b = 0; b < sc[t] * es; b++)
      send[sd[t] * es + b] = (unsigned char)tv_mix64(key + (uint64_t)(me * 64 + t) * 4096 + b);
  mpg_work *w = NULL;
  TRY(v ? mpg_all_to_all_v(g, send, sc, sd, recv, rc, rd, dt, NULL, async ? &w : NULL)
        : mpg_all_to_all(g, send, recv, sc[0], dt, NULL, async ? &w : NULL));
  if (async) TRY(mpg_work_wait(w));
  for (int s = 0; s < n; s++)
    for (size_t b = 0; b < rc[s] * es; b++) {
      unsigned char want = (unsigned char)tv_mix64(key + (uint64_t)(s * 64 + me) * 4096 + b);
      if (recv[rd[s] * es + b] != want) {
        fail("all-to-all on \"%s\" (case %llx): byte %zu from position %d is 0x%02x, "
             "expected 0x%02x", mpg_group_name(g), (unsigned long long)key, b, s,
             recv[rd[s] * es + b], want);
        goto done;
      }
    }
  for (int s = 0; s < n && v; s++)
    if (recv[rd[s] * es - 1] != 0xa5) fail("all-to-all on \"%s\": a gap was written",
                                            mpg_group_name(g));
done:
  if (mem) {
    if (send) mpg_ctx_mem_free(ctx, send);
    if (recv) mpg_ctx_mem_free(ctx, recv);
  } else {
    free(send);
    free(recv);
  }
}

static int mode_a2a(worker *w) {
  const char *dims = w->argv[0], *host_id = strstr(w->mode, "samehost") ? "one-host" : NULL;
  mpg_mesh *mesh;
  mpg_ctx *ctx = open_ctx(dims, host_id, 60, &mesh);
  if (!ctx) return 0;
  int nsets = mpg_mesh_num_dimsets(mesh), cases = 0;
  for (int d = 0; d < nsets && !failures; d++) {
    mpg_group *g = NULL;
    if (mpg_ctx_group_at(ctx, d, &g)) {
      fail("mpg_ctx_group_at(%d): %s", d, mpg_last_error());
      break;
    }
    for (int c = 0; c < 12 && !failures; c++, cases++)
      /* the same key on every member of the group */
      a2a_case(ctx, g, tv_mix64((uint64_t)d << 32 | (uint64_t)mpg_group_index(g) << 16 |
                                (uint64_t)c),
               c % 3 != 2, c % 2, c / 2 % 2);
  }
  if (g_rank == 0 && !failures) printf("A2A %d cases per rank\n", cases);
  ctx_close(ctx, mesh);
  return 0;
}

/* Leave without a collective finalize: the world may be cut in two (the
 * tests run these jobs with --enable-recovery, so that mpirun lets the
 * other ranks report). */
static void leave_cut(void) {
  fflush(stdout);
  _exit(0);
}

static int mode_steps(worker *w) {
  const char *dims = w->argv[0];
  int steps = atoi(w->argv[1]);
  double timeout_s = atof(w->argv[2]);
  mpg_mesh *mesh = NULL;
  mpg_ctx *ctx = open_ctx(dims, NULL, timeout_s, &mesh);
  mpg_sync *s = NULL;
  if (!ctx) leave_cut();
  const int me = mpg_ctx_rank(ctx);
  mpg_sync_opts so = MPG_SYNC_OPTS_INIT;
  so.sync.bucket_mb = 1;
  double t0 = now_ms();
  mpg_status st = mpg_sync_create(ctx, &so, &s);
  int id, k = -1;
  if (!st) st = mpg_sync_add_param(s, "w", (size_t)1 << 20, MPG_F32, NULL, &id);
  if (!st) st = mpg_sync_commit(s);
  for (k = 0; k < steps && !st; k++) {
    void *g;
    printf("STEP %d rank %d\n", k, me);
    fflush(stdout);
    t0 = now_ms();
    st = mpg_sync_grad(s, 0, &g);
    if (!st) {
      for (size_t i = 0; i < (size_t)1 << 20; i++) ((float *)g)[i] = (float)(me + k);
      st = mpg_sync_all(s, k, NULL);
    }
    if (!st) usleep(100000);
  }
  if (st) steps_end(me, g_host[me], st, now_ms() - t0, k - 1, mpg_last_error());
  else steps_end(me, g_host[me], MPG_OK, 0, steps, "all steps");
  steps_destroy(me, s, ctx, mesh);
  if (st != MPG_OK && st != MPG_ERR_ENV) leave_cut();
  return 0;
}

/* Every rank's host first; at most MAXR ranks. */
static int hello(worker *w) {
  char host[HOSTLEN] = "";
  gethostname(host, sizeof host - 1);
  printf("HOST rank %d host %s pid %ld\n", w->rank, host, (long)getpid());
  if (w->world > MAXR) fail("at most %d ranks", MAXR);
  return 0;
}

static const worker_case cases[] = {
    {"place", "MESH", 1, 1, mode_place, WK_MPI},
    {"sync", "MESH", 1, 1, mode_sync, WK_MPI},
    {"samehost", "MESH", 1, 1, mode_sync, WK_MPI},
    {"a2a", "MESH", 1, 1, mode_a2a, WK_MPI},
    {"a2a-samehost", "MESH", 1, 1, mode_a2a, WK_MPI},
    {"steps", "MESH N TIMEOUT_S", 3, 3, mode_steps, WK_MPI},
};
WORKER_MAIN_WITH(cases, hello)
