/* The issuing thread of a context on nccl: mpg__ctx_check_issuer
 * (core.h), called by every path that issues on a context (coll.c's
 * claim, group.c's splits, setup.c's setup collectives, order.c's check).
 * A file of its own, calling nothing of this module, so that those files
 * need not call each other. */
#include <stdatomic.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "core.h"

/* One issuing thread per context on nccl (core.h): the first
 * thread whose call issues becomes the context's issuer for its life (a
 * context created on one thread may be handed to another before its first
 * collective: mpg_ctx_create's own setup collectives pass this check and
 * create then forgets their thread, ctx.c).  NCCL_LAUNCH_ORDER_
 * IMPLICIT=1 (world.c) orders every kernel of the device by host launch
 * order, and NCCL then fails two threads launching at once:
 * ncclLaunchPrepare acquires the device's launchOrder strong stream as not
 * concurrent (src/enqueue.cc:1511-1515) and ncclStrongStreamRelease
 * returns ncclInvalidUsage, "host threads racing to launch NCCL on same
 * device", when another thread acquired it in between
 * (src/misc/strongstream.cc:158-162, 282-285); without the race, two
 * threads' calls still reach NCCL in an order no other rank shares.  Not
 * checked: mpg_work_test / mpg_work_wait (they post nothing: an event
 * query and ncclCommGetAsyncError under the communicator's lock, which
 * NCCL allows from any thread), mpg_ctx_abort (any thread, by design),
 * memory and stream calls. */
mpg_status mpg__ctx_check_issuer(mpg_ctx *ctx, const char *fn, const char *group) {
  if (ctx->kind != MPG_BACKEND_NCCL) return MPG_OK;
  long me = (long)syscall(SYS_gettid), owner = 0;
  if (atomic_compare_exchange_strong(&ctx->issuer, &owner, me) || owner == me) return MPG_OK;
  return mpg__fail(MPG_ERR_STATE,
                   "%s%s%s%s (world rank %d): called from thread %ld, but thread %ld issues this "
                   "context's calls (the first thread that issued a collective or point-to-"
                   "point call on it); on nccl one thread issues every collective, "
                   "point-to-point and all-to-all call of a context: NCCL orders a device's "
                   "kernels by host launch order (NCCL_LAUNCH_ORDER_IMPLICIT) and fails two "
                   "threads launching at once (\"host threads racing to launch NCCL on same "
                   "device\"), and two threads' calls cannot be in the same order on every "
                   "rank; mpg_work_test, mpg_work_wait and mpg_ctx_abort may come from any "
                   "thread; nothing was posted",
                   fn, group ? " on group \"" : "", group ? group : "", group ? "\"" : "",
                   ctx->rank, me, owner);
}
