/* A node's shared segment without a ring or a worker, for a protocol of
 * the caller's own (groups/shm/a2a.c, the all-to-all): the members'
 * regions, made by the same collective creation as the reductions'
 * segments (setup.c, three all-gathers over the group; shm_internal.h).
 * Only when every member of the group is on one host. */
#ifndef MPG_GROUPS_SHM_CHANNEL_H
#define MPG_GROUPS_SHM_CHANNEL_H

#include <stddef.h>
#include <stdint.h>

#include "groups_internal.h"
#include "transport.h"

/* Collective over the group: one segment holding a zeroed `bytes`-byte
 * region per member (64-byte aligned) when the group has two or more
 * members, all on one host, the backend's table allows shared memory
 * (host_shm) and MESHPG_SHM is not 0 on any; else *out NULL (one log line
 * says why).  Errors alike on every member, as mpg__shm_create's.  Free
 * with mpg__shm_destroy. */
mpg_status mpg__shm_channel_create(mpg_group *group, const mpg__transport_setup *setup,
                                   size_t bytes, mpg__shm **out);
/* setup.c: mpg__shm_create (groups_internal.h) with the group's setup
 * callbacks (the all-gathers, the split across nodes) passed in; the
 * segment joins the group's transport list.  groups/shm_group.c gives
 * sync this with the group's callbacks. */
mpg_status mpg__shm_segment_create(mpg_group *group, const mpg__transport_setup *setup,
                                   size_t bytes, mpg_dtype dtype, int depth, int scatter,
                                   mpg__shm **out, void **data);
/* The region of the member at position pos (the group's position). */
char *mpg__shm_channel_area(const mpg__shm *s, int pos);
/* 1 when the members are threads of this process (one address space). */
int mpg__shm_channel_threads(const mpg__shm *s);
/* copy.c: memcpy, or with stream 1 (x86-64) with stores that bypass the
 * cache, for copies larger than the cache can hold alongside the rest. */
void mpg__shm_copy(void *dst, const void *src, size_t bytes, int stream);
/* engine.c: futex wait while *w == val, at most timeout_s (after a short
 * spin); wake all.  Shared futexes: the words may be in a segment. */
void mpg__shm_futex_wait(_Atomic uint32_t *w, uint32_t val, double timeout_s);
void mpg__shm_futex_wake(_Atomic uint32_t *w);

#endif
