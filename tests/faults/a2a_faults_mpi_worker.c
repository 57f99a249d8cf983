/* One MPI process of test_a2a_faults.c (issue 45, items 15-17: the
 * all-to-all through shared memory on the mpi backend), started under
 * mpirun:
 *
 *   a2a_faults_mpi_worker fault COUNT SCEN[,SCEN...]   (np 4)
 *     the fault property's scenarios (a2a_faults.h) one after another,
 *     each on a fresh context (timeout AF_TIMEOUT_S), COUNT i32 elements
 *     a block, the buffers from mpg_ctx_mem_alloc; one line per member and
 *     scenario: "OUT name rank returned status wrong secs msg".  A kill
 *     scenario must come last (the survivors then leave with _exit(0)).
 *   a2a_faults_mpi_worker memory ROUNDS MIB            (np 4)
 *     ROUNDS rounds of a fresh MIB MiB mpg_ctx_mem_alloc send buffer, an
 *     all-to-all from it, its free; then each rank sums the pages of the
 *     mem_alloc memfds it still maps (by inode, through
 *     /proc/self/map_files): "HELD rank bytes".
 *   a2a_faults_mpi_worker corrupt                      (np 2)
 *     position 1 posts an all-to-all, then writes a corrupt word into its
 *     own descriptor in the channel's segment (the offset of its region
 *     past its end or partly, a block's displacement, the count it sends,
 *     its dtype) before
 *     position 0 reads it: "CORRUPT case rank status msg".
 *
 * Prints "FAIL ..." on a setup failure; "DONE rank" last (worker_main.h). */
#include <mpi.h>

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "a2a_faults.h"
#include "../support/clock.h"
#include "../support/mesh_util.h"
#include "../support/worker_main.h"

/* Internals, for the corrupt mode only: the channel's segment. */
#include "core.h"
#include "a2a_chan.h"

static int g_world;
static int *g_pids;

static void signal_victim(void *arg, int sig) {
  (void)arg;
  kill(g_pids[AF_N - 1], sig);
}

static mpg_status open_ctx(const char *dims, mpg_mesh **mesh, mpg_ctx **ctx, mpg_group **g) {
  mpg_status st = mesh_build(dims, NULL, 0, mesh);
  if (st) return st;
  mpg_init_opts o = MPG_INIT_OPTS_INIT;
  o.backend.name = MPG_BACKEND_MPI;
  o.backend.timeout_s = AF_TIMEOUT_S;
  if ((st = mpg_ctx_create(*mesh, &o, ctx))) return st;
  return mpg_ctx_group(*ctx, "dp", g);
}

static void close_ctx(mpg_mesh *mesh, mpg_ctx *ctx) {
  (void)mpg_ctx_destroy(ctx);
  (void)mpg_mesh_destroy(mesh);
}

static int run_faults(size_t count, char *list) {
  for (char *save = NULL, *name = strtok_r(list, ",", &save); name;
       name = strtok_r(NULL, ",", &save)) {
    af_scen s = {0, 0, count};
    if (af_parse(name, &s)) {
      printf("FAIL rank %d: unknown scenario %s\n", g_rank, name);
      return 1;
    }
    mpg_mesh *mesh = NULL;
    mpg_ctx *ctx = NULL;
    mpg_group *g = NULL;
    mpg_status st = open_ctx("dp=4", &mesh, &ctx, &g);
    af_hooks h = {signal_victim, NULL};
    af_out o;
    if (!st) st = af_run(ctx, g, &s, &h, NULL, NULL, &o);
    if (st) {
      printf("FAIL rank %d: %s: setup: %s: %s %s\n", g_rank, name, mpg_status_name(st),
             mpg_last_error(), o.msg);
      return 1;
    }
    for (char *c = o.msg; *c; c++)
      if (*c == '\n') *c = ' ';
    printf("OUT %s %d %d %d %ld %.3f %s\n", name, g_rank, o.returned, (int)o.st, o.wrong,
           o.secs, o.msg);
    fflush(stdout);
    close_ctx(mesh, ctx);
    if (s.kind == AF_KILL) _exit(0); /* the victim is gone: no MPI_Finalize */
    MPI_Barrier(MPI_COMM_WORLD);
  }
  return 0;
}

/* The bytes of the mem_alloc memfds (meshpg-mem) this process maps, each
 * inode once: what their pages hold now. */
static long long held_bytes(void) {
  FILE *f = fopen("/proc/self/maps", "r");
  if (!f) return -1;
  char line[512];
  unsigned long long inos[512];
  int nino = 0;
  long long sum = 0;
  while (fgets(line, sizeof line, f)) {
    if (!strstr(line, "memfd:meshpg-mem")) continue;
    char range[64];
    if (sscanf(line, "%63s", range) != 1) continue;
    char path[128];
    snprintf(path, sizeof path, "/proc/self/map_files/%s", range);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
      printf("FAIL rank %d: %s: %s\n", g_rank, path, strerror(errno));
      if (fd >= 0) close(fd);
      fclose(f);
      return -1;
    }
    close(fd);
    int seen = 0;
    for (int i = 0; i < nino; i++) seen |= inos[i] == (unsigned long long)st.st_ino;
    if (seen) continue;
    if (nino < 512) inos[nino++] = (unsigned long long)st.st_ino;
    sum += (long long)st.st_blocks * 512;
  }
  fclose(f);
  return sum;
}

static int run_memory(int rounds, size_t mib) {
  mpg_mesh *mesh = NULL;
  mpg_ctx *ctx = NULL;
  mpg_group *g = NULL;
  mpg_status st = open_ctx("dp=4", &mesh, &ctx, &g);
  size_t bytes = mib << 20, count = bytes / sizeof(int32_t) / AF_N;
  int32_t *recv = malloc(bytes);
  if (!st) st = mpg_ctx_set_timeout(ctx, 60);
  for (int r = 0; !st && recv && r < rounds; r++) {
    int32_t *send = NULL;
    if ((st = mpg_ctx_mem_alloc(ctx, bytes, 0, (void **)&send))) break;
    for (size_t i = 0; i < bytes / sizeof *send; i++) send[i] = (int32_t)(i + (size_t)r);
    st = mpg_all_to_all(g, send, recv, count, MPG_I32, NULL, NULL);
    for (size_t i = 0; !st && i < bytes / sizeof *recv; i++) {
      size_t from = i / count;
      if (recv[i] != (int32_t)((size_t)g_rank * count + i % count + (size_t)r)) {
        printf("FAIL rank %d: round %d: element %zu (from %zu) is %d\n", g_rank, r, i, from,
               recv[i]);
        st = MPG_ERR_BACKEND;
      }
    }
    if (mpg_ctx_mem_free(ctx, send) && !st) st = MPG_ERR_BACKEND;
  }
  if (st || !recv) {
    printf("FAIL rank %d: memory: %s: %s\n", g_rank, mpg_status_name(st), mpg_last_error());
    return 1;
  }
  free(recv);
  MPI_Barrier(MPI_COMM_WORLD); /* every buffer freed everywhere */
  long long held = held_bytes();
  printf("HELD %d %lld\n", g_rank, held);
  close_ctx(mesh, ctx);
  return held < 0;
}

static const char *const corrupt_cases[] = {"offset", "offset-tail", "from", "count",
                                            "dtype"};

static void corrupt(mpg_group *g, int which) {
  mpg__a2a *ch = atomic_load(&g->a2a);
  a2a_head *h = ch->area[ch->me];
  switch (which) {
    case 0: h->offset = h->len * 8 + 4096; break;
    case 1: h->offset = h->len - 100; break; /* partly past the end */
    case 2: ENTRY(h, 0)[1] = (uint64_t)1 << 40; break; /* its displacement */
    case 3: ENTRY(h, 0)[0] = (uint64_t)1 << 62; break;
    case 4: h->dtype = 99; break;
  }
}

static int run_corrupt(void) {
  int bad = 0;
  size_t count = 1 << 16; /* 256 KiB blocks: in place, from mem_alloc */
  for (int c = 0; c < (int)(sizeof corrupt_cases / sizeof *corrupt_cases); c++) {
    mpg_mesh *mesh = NULL;
    mpg_ctx *ctx = NULL;
    mpg_group *g = NULL;
    int32_t *send = NULL, *recv = NULL;
    mpg_status st = open_ctx("dp=2", &mesh, &ctx, &g);
    if (!st) st = mpg_ctx_mem_alloc(ctx, 2 * count * 4, 0, (void **)&send);
    if (!st) st = mpg_ctx_mem_alloc(ctx, 2 * count * 4, 0, (void **)&recv);
    if (!st) st = mpg_all_to_all(g, send, recv, count, MPG_I32, NULL, NULL); /* the channel */
    if (st) {
      printf("FAIL rank %d: corrupt %s: setup: %s\n", g_rank, corrupt_cases[c],
             mpg_last_error());
      return 1;
    }
    if (g_rank == 1) {
      mpg_work *w = NULL;
      st = mpg_all_to_all(g, send, recv, count, MPG_I32, NULL, &w);
      if (!st) corrupt(g, c);
      MPI_Barrier(MPI_COMM_WORLD);
      if (!st) st = mpg_work_wait(w);
    } else {
      MPI_Barrier(MPI_COMM_WORLD);
      st = mpg_all_to_all(g, send, recv, count, MPG_I32, NULL, NULL);
    }
    char msg[600];
    snprintf(msg, sizeof msg, "%s", st ? mpg_last_error() : "");
    for (char *m = msg; *m; m++)
      if (*m == '\n') *m = ' ';
    printf("CORRUPT %s %d %d %s\n", corrupt_cases[c], g_rank, (int)st, msg);
    fflush(stdout);
    (void)mpg_ctx_mem_free(ctx, send);
    (void)mpg_ctx_mem_free(ctx, recv);
    close_ctx(mesh, ctx);
    MPI_Barrier(MPI_COMM_WORLD);
  }
  return bad;
}

/* Every rank's pid, for the scenarios that signal the victim. */
static int gather_pids(worker *w) {
  g_world = w->world;
  g_pids = calloc((size_t)g_world, sizeof *g_pids);
  int pid = (int)getpid();
  MPI_Allgather(&pid, 1, MPI_INT, g_pids, 1, MPI_INT, MPI_COMM_WORLD);
  return 0;
}

/* A mode's last line, "DONE rank rc", after "FAIL ... usage" when the
 * job is not of the `want` ranks the mode needs (rc 2). */
static int done_line(int want, int rc) {
  if (g_world != want) printf("FAIL rank %d: usage (world %d)\n", g_rank, g_world);
  printf("DONE %d %d\n", g_rank, rc);
  free(g_pids);
  return rc;
}

static int mode_fault(worker *w) {
  return done_line(AF_N, g_world != AF_N ? 2
                                         : run_faults((size_t)strtoull(w->argv[0], NULL, 10),
                                                      w->argv[1]));
}

static int mode_memory(worker *w) {
  return done_line(AF_N, g_world != AF_N ? 2
                                         : run_memory(atoi(w->argv[0]),
                                                      (size_t)strtoull(w->argv[1], NULL, 10)));
}

static int mode_corrupt(worker *w) {
  (void)w;
  return done_line(2, g_world != 2 ? 2 : run_corrupt());
}

static const worker_case cases[] = {
    {"fault", "COUNT SCEN[,SCEN...]", 2, -1, mode_fault, WK_MPI | WK_OWN_LINES},
    {"memory", "ROUNDS MIB", 2, -1, mode_memory, WK_MPI | WK_OWN_LINES},
    {"corrupt", "", 0, -1, mode_corrupt, WK_MPI | WK_OWN_LINES},
};
WORKER_MAIN_WITH(cases, gather_pids)
