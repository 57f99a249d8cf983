/* The all-to-all's fault property (issue 45, item 15; issue 35's property
 * for the all-to-all through shared memory), shared by test_a2a_faults.c
 * (ranks as threads) and a2a_faults_mpi_worker.c (ranks as processes under
 * mpirun); the scenarios' rank body is a2a_faults_rank.c.
 *
 * The property: whatever happens to one member (the victim, the last
 * position of a group of 4) while an all-to-all is in flight, either every
 * member that returns gets MPG_OK with every element right, or none gets
 * MPG_OK: a member never returns OK for an operation another member gave up
 * on (timed out, aborted), and never OK with wrong data.  The members that
 * fail reuse their send buffers at once (they are theirs again), so a
 * victim that reads them afterwards reads other values.
 *
 * The faults, each asynchronous (posted with a work handle, the fault
 * before mpg_work_wait) and blocking:
 *   AF_SLOW   the victim sleeps past the others' timeout (async: after
 *             posting; blocking: before the call);
 *   AF_STOP   processes: SIGSTOP (async: the victim stops itself after
 *             posting; blocking: position 0 stops it inside the call), then
 *             SIGCONT once the others returned and reused their buffers;
 *   AF_KILL   processes: SIGKILL (async: after posting; blocking: inside
 *             the call, from position 0); the job ends with it.  Threads:
 *             the victim leaves (never calls; destroys its context once the
 *             others returned);
 *   AF_ABORT  the victim calls mpg_ctx_abort (async: after posting;
 *             blocking: before the call). */
#ifndef MESHPG_TESTS_A2A_FAULTS_H
#define MESHPG_TESTS_A2A_FAULTS_H

#include <stddef.h>
#include <stdint.h>

#include "meshpg.h"

enum { AF_SLOW, AF_STOP, AF_KILL, AF_ABORT, AF_KINDS };
#define AF_N 4          /* members; the victim is position AF_N - 1 */
#define AF_TIMEOUT_S 0.6
#define AF_SLOW_S 1.8   /* the victim's sleep (or stop): past the others'
                           timeout plus its grace, on a loaded machine */

typedef struct af_scen {
  int kind, async;
  size_t count;         /* elements per block (i32) */
} af_scen;

/* One member's outcome of the faulted all-to-all. */
typedef struct af_out {
  int returned;         /* it returned (the killed victim does not) */
  mpg_status st;
  long wrong;           /* OK: elements received that differ */
  double secs;          /* from its call to its return */
  char msg[400];
} af_out;

/* Hooks of the process runner (NULL for threads): signal the victim. */
typedef struct af_hooks {
  void (*signal_victim)(void *arg, int sig);
  void *arg;
} af_hooks;

/* "slow-async", ... */
const char *af_name(const af_scen *s, char *buf, size_t cap);
/* Parse "slow-async" etc.; 0 on success. */
int af_parse(const char *name, af_scen *s);

/* Run scenario s on group g (AF_N members) of a fresh context: a first
 * all-to-all (the channel made, checked), then the faulted one; *o filled
 * (for AF_KILL the victim process never returns).  `barrier` (may be NULL)
 * is called by every member except a leaving thread victim right after the
 * faulted call returned and its buffers were reused, and by the thread
 * victim of AF_KILL before it destroys nothing (it waits for the others).
 * Returns MPG_OK, or the error of the setup (the first all-to-all). */
mpg_status af_run(mpg_ctx *ctx, mpg_group *g, const af_scen *s, const af_hooks *h,
                  void (*barrier)(void *), void *barrier_arg, af_out *o);

/* The property over the AF_N outcomes of one scenario: "" when it holds,
 * else why not (into why). */
const char *af_judge(const af_scen *s, const af_out *o, char *why, size_t cap);

#endif
