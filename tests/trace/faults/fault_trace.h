/* Fault injection for the flight recorder (issue 32): a small training
 * loop on 8 real ranks of mesh pp=2,dp=2,tp=2 (rank = pp * 4 + dp * 2 +
 * tp), one fault on one rank, the ranks' dumps read back and analyzed
 * (tools/trace_analyze.h): the culprits must be exactly the faulty rank.
 *
 * One rank's program (tf_rank_run): steps 0 to TF_STEPS, per step, stage 0
 * (pp 0) and stage 1:
 *
 *   slot  stage 0                    stage 1
 *   0     all_reduce A on tp         recv activations from stage 0 (pp)
 *   1     all_reduce B on tp         all_reduce A on tp
 *   2     all_to_all on dp           all_reduce B on tp
 *   3     send activations (pp)      all_to_all on dp
 *   4     recv gradients (pp)        all_reduce C on tp
 *   5     sync bucket 0 (dp)         sync bucket 0 (dp)
 *   6     all_reduce C on tp         send gradients to stage 0 (pp)
 *   7     sync bucket 1 (dp)         sync bucket 1 (dp)
 *   8     sync bucket 2 (dp)         sync bucket 2 (dp)
 *
 * between mpg_sync_begin and mpg_sync_finish (the issue-order check at the
 * end of every step when MESHPG_CHECK_ORDER=1, as meson test sets).
 * Step 0 is the warm-up, healthy, under the set-up's timeout; the case's
 * timeout is then the larger of timeout_s and 2 times the warm-up's
 * length on that rank, so that a loaded machine's slow steps do not time
 * out (issue 46, item 8: the timeout comes from the run, not from luck).
 * The fault strikes one of steps 1 to TF_STEPS.  A
 * bucket slot marks its two params ready (6 params of f32, registered p0..p5,
 * laid out backward: bucket 0 = p5,p4, 1 = p3,p2, 2 = p1,p0); the bucket
 * launches at the mark of its last param.  The tp all-reduces have one
 * count (64), C's is 48 on the thread backend only.
 *
 * The fault (tf_case), on rank `victim` in step `step` at slot `slot`:
 *   TF_HANG  sleep hang_s (the timeout + 0.6 s) before the slot (a bucket:
 *            before the mark of its last param), and on until another
 *            rank's failure dump is in the case's directory (at most 10
 *            timeouts more), then go on: it resumes after the others
 *            failed however late a loaded machine let them time out
 *            (issue 46, item 8), not by a margin of luck; with `nodump`
 *            the rank never writes a dump (trace_dir "", no dump on
 *            request: a rank that still hangs);
 *   TF_SKIP  never issue the slot (tp all-reduces, send, recv, the
 *            all-to-all);
 *   TF_SWAP  issue slot + 1 before the slot (two operations of different
 *            groups, or the send and receive of stage 0);
 *   TF_COUNT issue the slot's tp all-reduce with twice its count (thread,
 *            mpi).
 * Since issue 46 meshpg's MPI communicators return errors, so on mpi a
 * fault that truncates a message (a count mismatch, a skipped all-to-all
 * meeting an all-reduce on dp) is a status like any other; only the nccl
 * double still ends the process on collectives of different signatures,
 * so nccl draws no count mismatch and no skipped all-to-all.  A skip may
 * run without the issue-order checker (`check` 0: MESHPG_CHECK_ORDER=0 for
 * the case, its victim dumps at mpg_ctx_destroy only: `noreq`).
 *
 * A rank stops at its first error (the library dumps it then, once);
 * a rank that ends without a dump (every call OK: a silent fault, or a
 * rank that finished before the others failed) dumps on request, except
 * a `nodump` victim and a `noreq` victim (whose record is the one the
 * library writes at mpg_ctx_destroy when a trace directory is set, reason
 * "end").  Used by test_trace_faults.c (ranks as threads: the thread
 * backend, and with TF_ON_DOUBLE the nccl backend on the CUDA/NCCL test
 * double) and trace_fault_worker.c (mpirun processes: mpi).
 *
 * Draws (tf_draw): TF_DRAW_ANY is the random property (every kind the
 * backend takes); the others draw only victims and steps of one fault of
 * issue 46 and ask the analyzer for its evidence too (tf_judge):
 *   TF_DRAW_SKIP_CHECK    a skipped tp all-reduce whose successor on tp has
 *                         its count (the pair goes on), MESHPG_CHECK_ORDER=1:
 *                         the victim is named as having skipped it (item 1);
 *   TF_DRAW_SKIP_NOCHECK  the same with MESHPG_CHECK_ORDER=0 and a victim
 *                         that dumps only at its end (item 2);
 *   TF_DRAW_COUNT         a tp all-reduce with twice its partner's count:
 *                         the victim is named for the differing operation
 *                         (item 3);
 *   TF_DRAW_LOAD          a hang (even cases) or a count mismatch (odd) on
 *                         a loaded machine: stage 1 sleeps 0.2 s (x 2
 *                         under a sanitizer) before each of slots 1 to 6
 *                         in steps 0 (the warm-up) and 1, so stage 0's
 *                         receive waits longer than the least timeout
 *                         (item 8). */
#ifndef MESHPG_TESTS_TRACE_FAULT_TRACE_H
#define MESHPG_TESTS_TRACE_FAULT_TRACE_H

#include <stddef.h>
#include <stdint.h>

#include "meshpg.h"

enum { TF_THREAD = 0, TF_MPI = 1, TF_NCCL = 2 };

#define TF_WORLD 8
#define TF_STEPS 4
#define TF_SLOTS 9
#define TF_MESH "pp=2,dp=2,tp=2"
#define TF_SETUP_TIMEOUT_S 60.0

typedef enum tf_kind { TF_HANG, TF_SKIP, TF_SWAP, TF_COUNT, TF_NKINDS } tf_kind;
typedef enum tf_draw {
  TF_DRAW_ANY,
  TF_DRAW_SKIP_CHECK,
  TF_DRAW_SKIP_NOCHECK,
  TF_DRAW_COUNT,
  TF_DRAW_LOAD,
  TF_NDRAWS
} tf_draw;
typedef enum tf_op { TO_TP, TO_A2A, TO_SEND, TO_RECV, TO_BUCKET } tf_op;

typedef struct tf_slot {
  tf_op op;
  int arg; /* tp: 0 A, 1 B, 2 C; bucket: its number */
} tf_slot;

typedef struct tf_case {
  unsigned seed;
  int index, backend;
  tf_draw draw;
  tf_kind kind;
  int victim, step, slot, nodump;
  int check; /* MESHPG_CHECK_ORDER for the case: 0, 1, -1 (the environment's) */
  int noreq; /* the victim does not dump on request (its end dump only) */
  int shm; /* MESHPG_SHM for the case */
  double timeout_s, hang_s;
  double compute_s; /* a sleep before every slot (MESHPG_TF_COMPUTE_MS) */
  double slow_s;    /* a sleep before slots 1 to 6 of steps 0 and 1 on
                       stage 1: a loaded stage (TF_DRAW_LOAD) */
  char dir[512];    /* the trace directory */
} tf_case;

/* What one rank saw. */
typedef struct tf_outcome {
  mpg_status status; /* the first error, MPG_OK */
  int step, slot;    /* where (slot TF_SLOTS: finish; -1: set-up) */
  char what[64];
  char message[512];
  int requested;     /* it dumped on request */
  int injected;      /* the victim reached its fault */
  double timeout_s;  /* the timeout after the warm-up */
} tf_outcome;

const char *tf_backend_name(int backend);
extern const char *const tf_kind_names[TF_NKINDS];
/* Slot k of a stage's program. */
tf_slot tf_slot_of(int stage, int k);
/* "all_reduce B on tp", "sync bucket 1 (dp)", ... */
const char *tf_slot_name(int stage, int k, char *buf, size_t cap);

/* Draw case `index` of `backend` from `seed` (what: `draw`); dir is
 * base/case-INDEX.  The least timeout is 1 s (x 2 under a sanitizer), the
 * hang 0.6 s longer; compute_s from MESHPG_TF_COMPUTE_MS. */
void tf_case_make(unsigned seed, int backend, int index, tf_draw draw, const char *base,
                  tf_case *c);
extern const char *const tf_draw_names[TF_NDRAWS];
/* Set the environment a case's context reads at mpg_ctx_create
 * (MESHPG_SHM, MESHPG_CHECK_ORDER; the latter back to its first value when
 * the case leaves it alone).  Call it while no rank runs. */
void tf_case_env(const tf_case *c);
void tf_describe(const tf_case *c, char *buf, size_t cap);

/* One rank of the case: base carries backend, rank and world (and
 * thread_world, nccl_id, device).  Fills *out.  Never blocks longer than
 * the faults' own sleeps and timeouts. */
void tf_rank_run(const tf_case *c, const mpg_init_opts *base, tf_outcome *out);
void tf_outcome_text(const tf_outcome *o, int rank, char *buf, size_t cap);

/* Analyze c->dir: 1 when the culprits are exactly {c->victim} (and, for
 * the draws of issue 46, one of them gives the evidence the fault calls
 * for: skipped, or an operation that differs), else 0 (or -1: no dump
 * could be read); why: the culprit lines, or the error. */
int tf_judge(const tf_case *c, char *why, size_t cap);

/* Remove c->dir and its files. */
void tf_remove_dir(const char *dir);

/* Environment: MESHPG_TF_SEED (default 32), MESHPG_TF_CASES, and
 * MESHPG_TF_COMPUTE_MS (default 0: the compute between operations, for a
 * picture of a case). */
unsigned tf_env_seed(void);
int tf_env_int(const char *name, int dflt);

#endif
