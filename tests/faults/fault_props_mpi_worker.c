/* One MPI process of the fault property (fault_props.h), started by
 * test_fault_props.c under mpirun:
 *
 *   fault_props_mpi_worker SEED STEPS KILL
 *
 * draws case SEED of the mpi backend (KILL = 1: the job ends with a SIGKILL
 * of one rank), sets MESHPG_SHM and MESHPG_CHECK_ORDER as the case says,
 * initialises MPI itself (meshpg then creates one context after another on
 * it) and runs the case's epochs.  Between epochs the ranks meet in a
 * barrier on an MPI shared-memory window (fp_ctl), not in an MPI
 * collective: after a SIGKILL the survivors see the `killed` flag there
 * and stop instead of waiting for the dead rank.
 *
 * Prints VIOLATION / SLOW / SETUP / KILLED / ... lines as they happen and,
 * last, one "TALLY rank R name=value ..." line per surviving rank.  Exits
 * 0 after MPI_Finalize; after a kill the survivors leave with _exit(0)
 * (with a dead peer Open MPI's MPI_Finalize may never return). */
#include <mpi.h>

#include "fault_props.h"

static void print_note(fp_rank *R, const char *line) {
  (void)R;
  printf("%s\n", line);
  fflush(stdout);
}

int main(int argc, char **argv) {
  if (argc < 4) {
    printf("FAIL usage: fault_props_mpi_worker SEED STEPS KILL\n");
    return 2;
  }
  setvbuf(stdout, NULL, _IOLBF, 0);
  fp_case c;
#ifdef FP_ON_DOUBLE
  int backend = FP_NCCL;
#else
  int backend = FP_MPI;
#endif
  fp_case_make((unsigned)strtoul(argv[1], NULL, 10), backend, 1, atoi(argv[2]), atoi(argv[3]),
               &c);
  setenv("MESHPG_SHM", c.shm ? "1" : "0", 1);
  setenv("MESHPG_CHECK_ORDER", c.check_order ? "1" : "0", 1);
  char v[32];
  snprintf(v, sizeof v, "%ld", c.piece_bytes);
  if (c.piece_bytes) setenv("MESHPG_MPI_PIECE_BYTES", v, 1);
  else unsetenv("MESHPG_MPI_PIECE_BYTES");
  snprintf(v, sizeof v, "%ld", c.max_count);
  if (c.max_count) setenv("MESHPG_MPI_MAX_COUNT", v, 1);
  else unsetenv("MESHPG_MPI_MAX_COUNT");
  fp_seams_apply(&c);
  int provided = 0, rank = 0, world = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (world != c.world || provided < MPI_THREAD_MULTIPLE) {
    printf("FAIL seed %u: world %d (the case has %d), thread level %d\n", c.seed, world,
           c.world, provided);
    MPI_Finalize();
    return 1;
  }
  /* The control block, shared by the processes of this node (the whole
   * job: mpirun runs it on one host). */
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  MPI_Win win;
  fp_ctl *ctl = NULL;
  MPI_Win_allocate_shared(rank == 0 ? (MPI_Aint)sizeof(fp_ctl) : 0, 1, MPI_INFO_NULL, node,
                          &ctl, &win);
  MPI_Aint size;
  int disp;
  MPI_Win_shared_query(win, 0, &size, &disp, &ctl);
  if (rank == 0) fp_ctl_reset(ctl);
  MPI_Barrier(MPI_COMM_WORLD);
  atomic_store(&ctl->pid[rank], (int)getpid());
  MPI_Barrier(MPI_COMM_WORLD);

  fp_rank *R = calloc(1, sizeof *R);
  if (!R) return 1;
  R->c = &c;
  R->rank = rank;
  R->ctl = ctl;
  R->note = print_note;
  R->verbose = getenv("MESHPG_FP_VERBOSE") && atoi(getenv("MESHPG_FP_VERBOSE"));
  R->base = (mpg_init_opts)MPG_INIT_OPTS_INIT;
#ifdef FP_ON_DOUBLE
  /* NCCL: rank and world from the launcher; device = rank (one node). */
  R->base.backend.name = MPG_BACKEND_NCCL;
  R->base.device = rank;
  R->host = malloc(FP_MAX_ELEMS * 8);
  if (!R->host) return 1;
#else
  R->base.backend.name = MPG_BACKEND_MPI;
#endif
  fp_monitor mon;
  fp_monitor_start(&mon, &R, 1, FP_HANG_S);
  int start = 0, stuck = 0, killed = 0;
  /* Between epochs: generous, but bounded (a rank that never comes). */
  double limit = 4 * FP_SETUP_TIMEOUT_S;
  while (start < c.steps) {
    fp_epoch(R, start);
    if (fp_ctl_barrier(ctl, world, limit) < 0) {
      killed = 1;
      break;
    }
    int next = fp_ctl_next_step(ctl, world);
    if (fp_ctl_barrier(ctl, world, limit) < 0) {
      killed = 1;
      break;
    }
    if (rank == 0) atomic_store(&ctl->epoch_over, 0);
    if (fp_ctl_barrier(ctl, world, limit) < 0) {
      killed = 1;
      break;
    }
    if (next <= start && ++stuck >= 3) {
      printf("FAIL seed %u rank %d: three epochs in a row began no step\n", c.seed, rank);
      break;
    }
    if (next > start) stuck = 0;
    start = next > start ? next : start;
  }
  if (killed && !atomic_load(&ctl->killed)) {
    int dead = fp_ctl_dead_rank(ctl, world);
    if (dead >= 0)
      printf("FAIL seed %u rank %d: the process of rank %d died (not the planned SIGKILL)\n",
             c.seed, rank, dead);
    else
      printf("FAIL seed %u rank %d: a barrier between epochs timed out after %.0f s\n",
             c.seed, rank, limit);
  }
  fp_monitor_stop(&mon);
  printf("TALLY rank %d", rank);
  fp_tally_print(stdout, &R->t);
  printf("\n");
  fflush(stdout);
  free(R->host);
  free(R);
  if (killed) _exit(0);
  MPI_Win_free(&win);
  MPI_Comm_free(&node);
  MPI_Finalize();
  return 0;
}
