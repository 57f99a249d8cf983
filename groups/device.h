/* Which CUDA device a rank takes (groups/device.c).  A pure function of
 * the caller's request, the rank's place on its node, the number of
 * devices CUDA shows this process and CUDA_VISIBLE_DEVICES: no CUDA call,
 * so it is tested without a GPU.  The nccl backend's world_init calls it
 * and binding follows the device it picked (groups/ctx.c, bind_rank). */
#ifndef MPG_GROUPS_DEVICE_H
#define MPG_GROUPS_DEVICE_H

#include "internal.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MPG__DEVICE_ENTRY_MAX 80 /* one CUDA_VISIBLE_DEVICES entry, NUL */
#define MPG__DEVICE_WHY_MAX 384  /* the explanation, NUL */

typedef struct mpg__device_choice {
  int device;          /* the CUDA ordinal taken, 0..count-1 (-1 on error) */
  int ambiguous;       /* 1: more local ranks than devices, so several
                          ranks of this node may land on this device */
  int visible_entries; /* usable CUDA_VISIBLE_DEVICES entries (those before
                          the first unusable one); -1 when it is unset */
  char entry[MPG__DEVICE_ENTRY_MAX]; /* the entry naming `device` ("3",
                          "GPU-1a2b...", "MIG-..."); "" when unset or
                          unknown */
  char why[MPG__DEVICE_WHY_MAX];     /* the rule used, in words, e.g.
                          "device 1 = local rank 3 % 2 visible devices
                          (CUDA_VISIBLE_DEVICES=GPU-aa,GPU-bb: entry 1 =
                          GPU-bb); ambiguous: 4 local ranks share 2
                          devices ..." */
} mpg__device_choice;

/* Choose the CUDA device of local rank `local_rank` of `local_world_size`
 * ranks on this node, when CUDA shows this process `count` devices
 * (cudaGetDeviceCount) and CUDA_VISIBLE_DEVICES is `visible` (NULL when
 * unset).  Ordinals are CUDA's: 0..count-1, in the order of
 * CUDA_VISIBLE_DEVICES when it is set.
 *
 * Rules, first match wins:
 *  1. count < 1: MPG_ERR_UNSUPPORTED (the message quotes
 *     CUDA_VISIBLE_DEVICES when set: "" hides every GPU).
 *  2. requested >= 0 (opts.device): that ordinal; MPG_ERR_INVALID when it
 *     is not below count, naming opts.device, count and
 *     CUDA_VISIBLE_DEVICES if set.  requested < -1 is MPG_ERR_INVALID.
 *  3. count == 1: device 0.  Each process was given its own GPU (Slurm's
 *     --gpus-per-task, or a CUDA_VISIBLE_DEVICES per rank), whatever its
 *     local rank.
 *  4. count >= local world size: device local_rank (one GPU per rank).
 *  5. otherwise: local_rank % count, and ambiguous = 1: several ranks of
 *     this node may share a GPU, which NCCL refuses inside one
 *     communicator ("Duplicate GPU detected").
 * A local rank at or above local_world_size (an explicit opts.local_rank
 * without opts.local_world_size) counts as local world size
 * local_rank + 1, so rule 4 never yields a device >= count.  Hence the
 * device is always in 0..count-1, and ambiguous is 1 iff
 * 1 < count < max(local_world_size, local_rank + 1) under rules 3-5.
 *
 * CUDA_VISIBLE_DEVICES is only read to explain the choice (out->entry,
 * out->why); the count already reflects it.  It is a comma-separated
 * list; blanks (spaces, tabs) around an entry are ignored.  A usable entry
 * is a decimal index >= 0, "GPU-" followed by hex digits and dashes (a
 * UUID or a unique prefix, any case), or "MIG-" followed by letters,
 * digits, dashes and slashes (an instance UUID, or the older
 * MIG-GPU-<uuid>/<gi>/<ci>).  Anything else (an empty entry, "-1", "abc",
 * an entry longer than MPG__DEVICE_ENTRY_MAX - 1 chars) ends the list, as
 * CUDA ends it at the first invalid entry; "" has no entry at all, so no
 * device.  CUDA also stops at entries only it can judge (an index past the
 * last GPU, an unknown UUID): the visible devices are then the first
 * `count` usable entries, and ordinal d is usable entry d.  When the list
 * has fewer usable entries than count, the entry of a device past them is
 * reported as unknown.  Duplicates are not looked for.
 *
 * out->why is always written (on failure it holds the same text as the
 * error message, which mpg__fail also records).  Returns MPG_OK;
 * MPG_ERR_UNSUPPORTED (rule 1); MPG_ERR_INVALID for rule 2, a negative
 * local_rank, local_world_size < 1 or a NULL out. */
mpg_status mpg__device_choose(int requested, int local_rank, int local_world_size,
                              int count, const char *visible,
                              mpg__device_choice *out);

#ifdef __cplusplus
}
#endif
#endif
