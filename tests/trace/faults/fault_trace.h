/* Fault injection for the flight recorder (issue 32): a small training
 * loop on 8 real ranks of mesh pp=2,dp=2,tp=2 (rank = pp * 4 + dp * 2 +
 * tp), one fault on one rank, the ranks' dumps read back and analyzed
 * (tools/trace_analyze.h): the culprits must be exactly the faulty rank.
 *
 * One rank's program (tf_rank_run), per step, stage 0 (pp 0) and stage 1:
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
 * end of every step when MESHPG_CHECK_ORDER=1, as meson test sets).  A
 * bucket slot marks its two params ready (6 params of f32, registered p0..p5,
 * laid out backward: bucket 0 = p5,p4, 1 = p3,p2, 2 = p1,p0); the bucket
 * launches at the mark of its last param.  The tp all-reduces have one
 * count (64), C's is 48 on the thread backend only.
 *
 * The fault (tf_case), on rank `victim` in step `step` at slot `slot`:
 *   TF_HANG  sleep hang_s (the timeout + 0.6 s) before the slot (a bucket:
 *            before the mark of its last param), then go on; with `nodump`
 *            the rank never writes a dump (trace_dir "", no dump on
 *            request: a rank that still hangs);
 *   TF_SKIP  never issue the slot (tp all-reduces, send, recv; thread also
 *            the all-to-all);
 *   TF_SWAP  issue slot + 1 before the slot (two operations of different
 *            groups, or the send and receive of stage 0).
 * On mpi and nccl only faults that neither truncate an MPI message nor
 * pair collectives of different signatures are drawn (Open MPI's
 * MPI_ERR_TRUNCATE and the double's signature check kill the process
 * before any dump): a skip of a tp all-reduce (all of one count there), of
 * a send or a receive, and swaps.
 *
 * A rank stops at its first error (the library dumps it then, once);
 * a rank that ends without a dump (every call OK: a silent fault, or a
 * rank that finished before the others failed) dumps on request, except
 * a `nodump` victim.  Used by test_trace_faults.c (ranks as threads: the
 * thread backend, and with TF_ON_DOUBLE the nccl backend on the CUDA/NCCL
 * test double) and trace_fault_worker.c (mpirun processes: mpi). */
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

typedef enum tf_kind { TF_HANG, TF_SKIP, TF_SWAP, TF_NKINDS } tf_kind;
typedef enum tf_op { TO_TP, TO_A2A, TO_SEND, TO_RECV, TO_BUCKET } tf_op;

typedef struct tf_slot {
  tf_op op;
  int arg; /* tp: 0 A, 1 B, 2 C; bucket: its number */
} tf_slot;

typedef struct tf_case {
  unsigned seed;
  int index, backend;
  tf_kind kind;
  int victim, step, slot, nodump;
  int shm; /* MESHPG_SHM for the case */
  double timeout_s, hang_s;
  double compute_s; /* a sleep before every slot (MESHPG_TF_COMPUTE_MS) */
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
} tf_outcome;

const char *tf_backend_name(int backend);
extern const char *const tf_kind_names[TF_NKINDS];
/* Slot k of a stage's program. */
tf_slot tf_slot_of(int stage, int k);
/* "all_reduce B on tp", "sync bucket 1 (dp)", ... */
const char *tf_slot_name(int stage, int k, char *buf, size_t cap);

/* Draw case `index` of `backend` from `seed`; dir is base/case-INDEX.
 * The timeout is 1 s (x 2 under a sanitizer), the hang 0.6 s longer;
 * compute_s from MESHPG_TF_COMPUTE_MS. */
void tf_case_make(unsigned seed, int backend, int index, const char *base, tf_case *c);
void tf_describe(const tf_case *c, char *buf, size_t cap);

/* One rank of the case: base carries backend, rank and world (and
 * thread_world, nccl_id, device).  Fills *out.  Never blocks longer than
 * the faults' own sleeps and timeouts. */
void tf_rank_run(const tf_case *c, const mpg_init_opts *base, tf_outcome *out);
void tf_outcome_text(const tf_outcome *o, int rank, char *buf, size_t cap);

/* Analyze c->dir: 1 when the culprits are exactly {c->victim}, else 0 (or
 * -1: no dump could be read); why: the culprit lines, or the error. */
int tf_judge(const tf_case *c, char *why, size_t cap);

/* Remove c->dir and its files. */
void tf_remove_dir(const char *dir);

/* Environment: MESHPG_TF_SEED (default 32), MESHPG_TF_CASES, and
 * MESHPG_TF_COMPUTE_MS (default 0: the compute between operations, for a
 * picture of a case). */
unsigned tf_env_seed(void);
int tf_env_int(const char *name, int dflt);

#endif
