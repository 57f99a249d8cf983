/* A simulated job for the analyzer's tests (test_trace_analyze.c): 8 ranks
 * of mesh pp=2,dp=2,tp=2 (rank = pp * 4 + dp * 2 + tp) run a small
 * training program step by step, on a simulated clock, with one fault:
 * a hang (a sleep before an operation), a skipped operation, two
 * operations swapped, or a killed rank.  Collectives complete when every
 * member has issued them (a different signature fails them all with
 * MPG_ERR_STATE), a send completes at once, a receive when its send was
 * issued, and an operation pending for the timeout fails its rank with
 * MPG_ERR_TIMEOUT; a rank that fails writes its dump, a rank that ends its
 * program writes one on request (or with reason "end": end_dumps), a
 * killed rank none.  check_order: each step ends with the issue-order
 * check's all-reduce on "world" (MESHPG_CHECK_ORDER=1).  The dumps are
 * written in the format of docs/trace.md and read back with tr_parse. */
#ifndef TESTS_TRACE_SIM_H
#define TESTS_TRACE_SIM_H

#include <stdint.h>

#include "../../../tools/trace_read.h"

#define SIM_WORLD 8
#define SIM_MAXOPS 512

typedef struct sim_op {
  const char *group; /* "tp", "dp", "pp", "world" */
  const char *kind;  /* all_reduce, all_to_all, send, recv */
  int count, bucket, peerpos;
} sim_op;

typedef enum sim_fault { SIM_NONE, SIM_HANG, SIM_SKIP, SIM_SWAP, SIM_KILL } sim_fault;

typedef struct sim_job {
  int steps;
  sim_fault fault;
  int victim, step, op;  /* the fault: rank, step, op index in the step */
  double timeout_s, hang_s;
  int same_counts;       /* tp all-reduces of one count (skip: a shift) */
  long capacity;         /* ring size (0: 4096) */
  int check_order;       /* an issue-order check (all_reduce on world) ends each step */
  int end_dumps;         /* a rank that ends its program dumps with reason "end" */
  /* out */
  tr_rank ranks[SIM_WORLD];
  char *text[SIM_WORLD]; /* each dump's text */
  int nranks;
} sim_job;

/* Run the job; fills ranks[0..nranks) (free with sim_free).  0, or -1 with
 * a message in err. */
int sim_run(sim_job *j, char *err, size_t errlen);
void sim_free(sim_job *j);
/* Issue 46's job, items 1 and 2: 4 ranks of mesh dp=2,tp=2 (rank = dp * 2
 * + tp), `steps` steps of 8 tp all-reduces (count 100 on tp[0], `tp1_count`
 * on tp[1]: an uneven batch) each, and with `check_order` the issue-order
 * check's all-reduce on world at each step's end.  World rank 2 skips its
 * `skip`-th tp all-reduce (0..7) of step `step`.  Operations complete when
 * every member issued them; what is left pending fails with
 * MPG_ERR_TIMEOUT 1 s after its issue and its rank dumps then; a rank
 * that ends its program dumps with reason "end".  Fills ranks[0..4) (free
 * each with tr_rank_free).  0, or -1 with a message in err. */
int sim_dp2tp2_skip(int steps, int step, int skip, int check_order, int tp1_count,
                    tr_rank ranks[4], char *err, size_t errlen);

/* Write the dumps into dir as rank-R.trace.  0 or -1. */
int sim_write(sim_job *j, const char *dir);

#endif
