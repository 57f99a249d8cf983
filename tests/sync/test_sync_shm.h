/* Private to test_sync_shm (test_sync_shm.c, test_sync_shm_cases.c): the
 * random and fixed cases of shm_props and shm_hosts, each run with the
 * shared-memory path on and off (run_pair: every rank's results equal byte
 * for byte), defined in test_sync_shm_cases.c. */
#ifndef MESHPG_TEST_SYNC_SHM_H
#define MESHPG_TEST_SYNC_SHM_H

#include <stddef.h>

#include "meshpg.h"

#define PC_MAX_PARAMS 16
#define PC_MAX_RANKS 16
#define PC_STEPS 3

typedef struct pc_param {
  size_t count;
  mpg_dtype dtype;
  const char *reduce_dims; /* NULL: the sync's default */
  int tied;                /* tied over the first and last pp stage */
} pc_param;

typedef struct pcase {
  char name[48];
  char mesh[96], flatten[96];
  int world;
  int hosts;               /* 0: real identity; 1: all "nodeA"; 2: two nodes, the
                              first and second half of the world; 3: two
                              nodes, even and odd ranks */
  int shard;               /* mode MPG_SYNC_SHARD */
  char shard_dims[48], replicate_dims[48];
  mpg_op op;
  double grad_scale;
  mpg_reduce_dtype reduce_dtype;
  double bucket_mb, first_bucket_mb;
  unsigned seed;
  int nparams;
  pc_param params[PC_MAX_PARAMS];
  int param_shm;           /* shard mode, every buffer sharded over one shard
                              group on one host: its params must live in a
                              second segment (stats.shm_bytes >= shard size x
                              total_bytes with the shared path on) */
} pcase;

/* Buffers of each kind over the cases run_pair ran. */
typedef struct pc_tally {
  int cases, with_shm, local, hier, spanning, local_and_spanning;
  long exact;
} pc_tally;

/* vsnprintf through a helper (GCC's -Wformat-truncation would flag the
 * intended truncation of long messages). */
__attribute__((format(printf, 3, 4))) void put_msg(char *buf, size_t size,
                                                   const char *fmt, ...);
void pc_add(pcase *c, size_t count, mpg_dtype dt, const char *rd, int tied);
void pc_init(pcase *c, const char *name, const char *mesh, const char *flatten, int world);
void run_pair(const pcase *c, pc_tally *tally);
void run_random(unsigned first_seed, int n, int shard, int hosts, pc_tally *tally);

#endif
