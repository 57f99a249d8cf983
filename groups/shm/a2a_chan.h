/* The all-to-all channel's shared layout and bookkeeping, for its two
 * files: a2a.c (the protocol: posting, reading, completing) and
 * a2a_chan.c (making the channel, the outboxes, mapping the peers'
 * memory).  The protocol is described at the top of a2a.c.  a2a.c calls
 * down into a2a_chan.c, whose functions this header declares, never the
 * reverse: the header is a2a_chan.c's (tests/layout/check_layout.py, rule
 * 2b: an a2a_internal.h would belong to a2a.c). */
#ifndef MPG_GROUPS_SHM_A2A_CHAN_H
#define MPG_GROUPS_SHM_A2A_CHAN_H

#include <stdatomic.h>
#include <stdint.h>

#include "core.h"
#include "channel.h"

#define LINE 64
#define A2A_MAX_MEMBERS 256 /* descriptors grow with n x n */
#define POLL_S 0.1
#define GRACE_S 0.25

/* One member's region (the descriptor's entries follow it). */
typedef struct a2a_head {
  _Alignas(LINE) _Atomic uint32_t posted;
  _Alignas(LINE) _Atomic uint32_t finished;
  _Alignas(LINE) _Atomic uint64_t abort; /* member 0's: the channel's abort
                                           reason (who, why, which #) */
  _Alignas(LINE) _Atomic uint64_t done;  /* member 0's: the verdict word: the
                                            members' reads finished on this
                                            channel so far (each member adds
                                            1 per operation), FAILED once any
                                            member gave up (then frozen) */
  _Alignas(LINE) _Atomic uint32_t readers; /* threads: peers copying out of
                                              this member's send buffer now */
  _Alignas(LINE) uint64_t pid, base;
  /* Processes: where the blocks are for the other processes to map (a
   * memfd of this process at /proc/<pid>/fd/<fd>, of len bytes, its
   * inode id, in which address base lies at `offset`): the region of
   * mpg_ctx_mem_alloc holding the send buffer, or this member's outbox,
   * into which it copied its blocks (then base is 0 and the entries'
   * displacements are the outbox's). */
  uint64_t fd, id, len, offset;
  uint64_t box_fd, box_id, box_len; /* the outbox, as made (the check) */
  int32_t dtype, pad;
} a2a_head;

/* A peer's mem_alloc region mapped here (read only), by its inode. */
typedef struct a2a_map {
  uint64_t id, len;
  const char *base;
} a2a_map;
#define MAPS 8 /* per peer; the oldest is unmapped for a new one */
#define FAILED ((uint64_t)1 << 63) /* in the verdict word */
#define ENTRY(h, j) ((uint64_t *)((char *)(h) + sizeof(a2a_head)) + 3 * (size_t)(j))

/* The channel as the communicator of its transport table (a2a.c). */
struct mpg__comm {
  struct mpg__a2a *ch;
};

struct mpg__a2a {
  mpg__comm self;       /* this channel as its table's communicator */
  mpg__transport link;  /* in its group's transport list */
  mpg_group *g;
  mpg__shm *seg;
  int n, me, threads;
  size_t stream_min;  /* a member writing this many bytes in one call
                         (its recv blocks, its outbox) streams them past
                         the cache (mpg__shm_copy): the last-level cache
                         over 2 x n */
  int stream;         /* the call in flight does */
  int both_ways;      /* a mismatch fails both members of the pair (mpi),
                         else only the receiver (thread) */
  a2a_head **area;
  uint64_t ops;       /* operations posted on this channel (64 bits) */
  uint64_t target;    /* the verdict word's count at which the operation
                         in flight is complete: (its number + 1) x n */
  int counted;        /* this member added its 1 for it */
  _Atomic uint32_t next; /* the number of this member's next operation
                            (atomic, relaxed, only for a2a.c's abort_comm
                            from another thread) */
  /* The operation in flight (busy), at most one. */
  int busy;
  uint32_t q;
  double deadline;
  const char *fn;     /* the public call, for messages */
  mpg__req *req;      /* its request, while its work holds one */
  char *recv;
  size_t es;
  mpg_dtype dtype;
  uint64_t *mine;     /* 3 x n: this member's entries as posted (a copy) */
  int box_fd;         /* processes: this member's outbox (a memfd), */
  char *box;          /* mapped here, */
  size_t box_len;     /* of this many bytes (grown, never shrunk) */
  uint64_t box_id;
  a2a_map *maps;      /* n x MAPS: the peers' regions mapped here */
  int *nmaps;         /* n: next slot (round robin) */
  size_t *rdispl;     /* n */
  unsigned char *read; /* n: peers whose block was read */
  int nread, nbad;
  char mismatch[256];
};


/* a2a_chan.c: free a channel (NULL: nothing), out of its group's list.
 * Local. */
void mpg__a2a_shm_destroy(mpg__a2a *ch);
/* a2a_chan.c: the group's channel, made collectively at its first
 * all-to-all through the group's setup callbacks (*out NULL: its
 * all-to-alls go through the backend). */
mpg_status mpg__a2a_channel_make(mpg_group *g, const mpg__transport_setup *setup,
                                 mpg__a2a **out);
/* a2a_chan.c: peer p's memfd (fd in its process pid, inode id, len
 * bytes, sealed against shrinking) mapped here read only, *mapped its
 * length (at least len); NULL with errno when it cannot be. */
const char *mpg__a2a_map_peer(mpg__a2a *ch, int p, int pid, uint64_t fd, uint64_t id,
                              uint64_t len, size_t *mapped);
/* a2a_chan.c: every peer's memory mapped here unmapped (after a failed
 * operation: nothing more is read from it). */
void mpg__a2a_unmap_peers(mpg__a2a *ch);
/* a2a_chan.c: grow this member's outbox to at least `bytes` (its memfd
 * and mapping); MPG_ERR_NOMEM with the message when it cannot. */
mpg_status mpg__a2a_box_reserve(mpg__a2a *ch, size_t bytes);

#endif
