/* libFuzzer target: the launch environment reader (mpg_launch_from_env).
 * The input is one value per line, for the variables below in order; a
 * line that is exactly "-" (and every variable past the last line) leaves
 * the variable unset.  A read that succeeds gives consistent fields: rank
 * below world size when both are set, local rank below local world size,
 * both or neither of rank and world size, a port in 1..65535 exactly when
 * MASTER_ADDR is set; a failed one a message and an untouched struct. */
#include "fuzz_common.h"

static const char *const vars[] = {
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "PMI_RANK",
    "PMI_SIZE",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_LOCALID",
    "SLURM_NTASKS_PER_NODE",
};
#define NVARS (sizeof vars / sizeof vars[0])

/* "NAME=value" of each variable (values longer than 4096 bytes are cut),
 * and whether it is the one in the environment now. */
static char entry[NVARS][32 + 4097];
static int in_env[NVARS];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *text = fuzz_strdup_lines(data, size);
  char *p = text;
  for (size_t v = 0; v < NVARS; v++) {
    const char *val = NULL;
    if (p) {
      char *nl = strchr(p, '\n');
      if (nl) *nl = '\0';
      val = p;
      p = nl ? nl + 1 : NULL;
    }
    if (val && strcmp(val, "-") != 0) {
      /* putenv with one buffer per variable, rewritten in place: glibc's
       * setenv never frees a replaced value, which would grow the memory
       * of a long run without bound. */
      snprintf(entry[v], sizeof entry[v], "%s=%s", vars[v], val);
      if (!in_env[v]) FUZZ_CHECK(putenv(entry[v]) == 0);
      in_env[v] = 1;
    } else {
      FUZZ_CHECK(unsetenv(vars[v]) == 0);
      in_env[v] = 0;
    }
  }
  mpg_launch l = MPG_LAUNCH_INIT;
  l.rank = 12345; /* must be left alone on failure */
  mpg__clear_error();
  mpg_status st = mpg_launch_from_env(&l);
  fuzz_check_status(st);
  FUZZ_CHECK(st == MPG_OK || st == MPG_ERR_ENV);
  if (st == MPG_OK) {
    FUZZ_CHECK(l.rank >= -1 && l.world_size >= -1 && l.local_rank >= -1 &&
               l.local_world_size >= -1);
    FUZZ_CHECK(l.world_size != 0 && l.local_world_size != 0);
    FUZZ_CHECK((l.rank >= 0) == (l.world_size >= 1));
    if (l.rank >= 0 && l.world_size >= 0) FUZZ_CHECK(l.rank < l.world_size);
    if (l.local_rank >= 0 && l.local_world_size >= 0)
      FUZZ_CHECK(l.local_rank < l.local_world_size);
    FUZZ_CHECK(memchr(l.master_addr, '\0', sizeof l.master_addr) != NULL);
    FUZZ_CHECK(memchr(l.source, '\0', sizeof l.source) != NULL);
    const char *addr = getenv("MASTER_ADDR");
    if (addr) {
      FUZZ_CHECK(strcmp(l.master_addr, addr) == 0);
      FUZZ_CHECK(l.master_port >= 1 && l.master_port <= 65535);
    } else {
      FUZZ_CHECK(l.master_addr[0] == '\0' && l.master_port == -1);
    }
    if (l.rank >= 0 || l.world_size >= 0 || l.local_rank >= 0 ||
        l.local_world_size >= 0)
      FUZZ_CHECK(l.source[0] != '\0');
  } else {
    FUZZ_CHECK(l.rank == 12345 && l.world_size == -1 && l.master_port == -1);
  }
  free(text);
  return 0;
}
