/* Checkpoints under real MPI processes: mpirun starts ckpt_mpi_worker
 * (MESHPG_CKPT_MPI_WORKER, set by meson), which saves random cases of
 * ckpt_check.h at one world size and loads them at another, checking every
 * element (save at np 4, load at np 2 and 3; save at np 2 and 3, load at
 * np 4; an async save at np 4 whose buffers change before the wait).
 * Between the two jobs this process checks the files through the format's
 * decoder (ckpt_fs.h: every element stored once, checksums, values, the
 * directory's entries). */
#include <string.h>

#include "../support/mpirun_util.h"
#include "ckpt_check.h"
#include "ckpt_fs.h"

static char g_root[4096];

static void root_fini(void) {
  if (g_root[0]) ckf_rm_rf(g_root);
}

/* mpirun -np N worker MODE ROOT WS WL VERSION SEEDS; expect every rank's OK
 * (mpirun_ok). */
static void run_worker(int np, const char *mode, int ws, int wl, const char *seeds) {
  char args[2200];
  snprintf(args, sizeof args, "%s '%.1000s' %d %d 1 %.1000s", mode, g_root, ws, wl, seeds);
  mpirun_ok(&(mpirun_job){.np = np, .worker = env_program("MESHPG_CKPT_MPI_WORKER"),
                          .args = args, .limit_s = 280});
  cr_log_info("%s", out);
}

/* One test: save the seeds' cases at ws ranks (mode "save" or
 * "save-async"), check the files through the format's decoder, load them
 * at wl.  The uneven worlds (3) repeat the even ones' code paths; a
 * sanitizer build (MESHPG_SANITIZER) runs only the rows without
 * plain_only (4 -> 2, 2 -> 4 and the async case), for CI's time. */
typedef struct ckpt_mpi_row {
  const char *tag; /* the temporary root's */
  const char *mode;
  int ws, wl, plain_only;
  unsigned seeds[8];
  int n;
} ckpt_mpi_row;

static void save_then_load(const ckpt_mpi_row *row) {
  if (row->plain_only && getenv("MESHPG_SANITIZER"))
    cr_skip_test("a sanitizer build (%s): the np 3 worlds run in the plain build",
                 getenv("MESHPG_SANITIZER"));
  cr_assert_eq(ckf_tmpdir(g_root, sizeof g_root, row->tag), 0);
  char list[256] = "";
  for (int k = 0; k < row->n; k++)
    snprintf(list + strlen(list), sizeof list - strlen(list), " %u", row->seeds[k]);
  run_worker(row->ws, row->mode, row->ws, row->wl, list);
  ck_case *c = malloc(sizeof *c);
  cr_assert_not_null(c);
  for (int k = 0; k < row->n; k++) {
    char dir[4200], msg[2048];
    unsigned seed = row->seeds[k];
    snprintf(dir, sizeof dir, "%s/ck%u", g_root, seed);
    ck_case_make(c, seed, row->ws, row->wl, 1);
    cr_assert_eq(ckf_meta_check(c, 0, dir, (long)seed, 1, 0, NULL, NULL, msg, sizeof msg), 0,
                 "case %u saved by %d processes: %s", seed, row->ws, msg);
  }
  free(c);
  run_worker(row->wl, "load", row->ws, row->wl, list);
}

static const ckpt_mpi_row rows[] = {
    {"mpi42", "save", 4, 2, 0, {11, 12, 13, 14, 15, 16, 17, 18}, 8},
    {"mpi43", "save", 4, 3, 1, {21, 22, 23, 24, 25, 26, 27, 28}, 8},
    {"mpi24", "save", 2, 4, 0, {31, 32, 33, 34, 35, 36, 37, 38}, 8},
    {"mpi34", "save", 3, 4, 1, {41, 42, 43, 44, 45, 46, 47, 48}, 8},
    /* Async saves by real processes: the buffers change before the wait. */
    {"mpiasync", "save-async", 4, 3, 0, {51, 52, 53, 54, 55, 56}, 6},
};

Test(ckpt_mpi, save_np4_load_np2, .timeout = 600, .fini = root_fini) { save_then_load(&rows[0]); }
Test(ckpt_mpi, save_np4_load_np3, .timeout = 600, .fini = root_fini) { save_then_load(&rows[1]); }
Test(ckpt_mpi, save_np2_load_np4, .timeout = 600, .fini = root_fini) { save_then_load(&rows[2]); }
Test(ckpt_mpi, save_np3_load_np4, .timeout = 600, .fini = root_fini) { save_then_load(&rows[3]); }
Test(ckpt_mpi, async_save_np4_load_np3, .timeout = 600, .fini = root_fini) {
  save_then_load(&rows[4]);
}
