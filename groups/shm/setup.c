/* mpg__shm_segment_create (mpg__shm_create's body, with the group's setup
 * callbacks: groups/shm_group.c) and mpg__shm_destroy: deciding whether a
 * group's members share a node, and the segment they share (see
 * shm_internal.h).
 *
 * Three all-gathers over the group, issued by every member in this order
 * whatever happens (a failure travels in the words, never as a skipped
 * collective): A, host identity, process and MESHPG_SHM; B, the creator's
 * (each node's first member's) account of its segment; C, each member's
 * outcome of opening it.  The creator's descriptor stays open until C, so
 * that the others can open /proc/<its pid>/fd/<fd>; after C it closes it,
 * and the segment lives as long as a mapping of it. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/random.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "shm_internal.h"
#include "channel.h"

#define SHM_DIR "/dev/shm"
/* The free space a segment leaves in /dev/shm for the MPI transport's own
 * shared memory (Open MPI's vader keeps its backing files there, and its
 * processes get SIGBUS when those cannot grow): max(64 MiB, 1/16 of the
 * segment). */
#define SLACK_MIN ((uint64_t)64 << 20)
#define SLACK_DIV 16

enum { ENV_OFF = 0, ENV_ON = 1, ENV_BAD = 2 };

/* What each member tells the others first (int32 words). */
enum { A_HASH_LO, A_HASH_HI, A_PROC_LO, A_PROC_HI, A_ENV, A_WORDS };
/* What the creator (local position 0) tells them next: how it made the
 * segment, or what failed; where the others open it (/proc/PID/fd/FD) and
 * what they must find there (device and inode). */
enum { B_STATUS, B_STEP, B_ERRNO, B_KIND, B_PID, B_FD, B_PTR_LO, B_PTR_HI, B_NEED_LO,
       B_NEED_HI, B_FREE_LO, B_FREE_HI, B_SLACK_LO, B_SLACK_HI, B_DEV_LO, B_DEV_HI,
       B_INO_LO, B_INO_HI, B_WORDS };
/* What every member tells the others last: its outcome (its creator's
 * when the creator failed). */
enum { C_STATUS, C_STEP, C_ERRNO, C_WORDS };

/* The kinds of segment (B_KIND). */
enum { K_NONE, K_ANON, K_TMPFILE, K_MEMFD };
/* What failed (B_STEP, C_STEP): the creator's steps, then a member's. */
enum { F_NONE, F_BOOK, F_SPACE, F_TMPFILE, F_MEMFD, F_TRUNCATE, F_FALLOCATE, F_FSTAT, F_MMAP,
       F_ANON, F_NOPROC, F_OPEN, F_NOT_IT, F_MAP, F_MAGIC };

/* This process, told apart from every other: a random number drawn once
 * (a pid alone is not enough: two containers on one host id may both run
 * pid 1, and only threads of one process may share a pointer). */
static _Atomic uint64_t process_nonce;

static uint64_t process_id(void) {
  uint64_t v = atomic_load(&process_nonce);
  if (v) return v;
  uint64_t r = 0;
  if (getrandom(&r, sizeof r, 0) != (ssize_t)sizeof r) r = 0;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  r ^= (uint64_t)getpid() << 32 ^ (uint64_t)ts.tv_nsec ^ (uint64_t)(uintptr_t)&process_nonce;
  if (!r) r = 1;
  uint64_t zero = 0;
  atomic_compare_exchange_strong(&process_nonce, &zero, r);
  return atomic_load(&process_nonce);
}

/* MESHPG_SHM as mpg_ctx_create read it (groups/settings.c refuses any
 * value but 0 and 1 there; ENV_BAD stays in the protocol for a member
 * whose word is neither). */
static int env_value(const mpg_ctx *ctx) { return ctx->settings.shm ? ENV_ON : ENV_OFF; }

static void put64(int32_t *w, uint64_t v) {
  w[0] = (int32_t)(uint32_t)v;
  w[1] = (int32_t)(uint32_t)(v >> 32);
}

static uint64_t get64(const int32_t *w) {
  return (uint64_t)(uint32_t)w[0] | (uint64_t)(uint32_t)w[1] << 32;
}

static size_t round_up(size_t v, size_t to) { return (v + to - 1) / to * to; }

/* Lay out the control area and the regions over s->base. */
static void carve(mpg__shm *s) {
  char *p = s->base;
  s->ctl = (shm_ctl *)p;
  p += SHM_LINE;
  s->posted = (shm_word *)p;
  p += sizeof(shm_word) * (size_t)s->n;
  s->finished = (shm_word *)p;
  p += sizeof(shm_word) * (size_t)s->n;
  s->desc = (shm_desc *)p;
  char *data = s->base + (s->map_bytes - s->region_bytes * (size_t)s->n);
  for (int i = 0; i < s->n; i++) s->region[i] = data + s->region_bytes * (size_t)i;
}

static size_t control_bytes(int n, int depth) {
  return round_up(SHM_LINE + 2 * sizeof(shm_word) * (size_t)n +
                      sizeof(shm_desc) * (size_t)n * (size_t)depth,
                  SHM_PAGE);
}

static void init_ctl(mpg__shm *s) {
  s->ctl->magic = SHM_MAGIC;
  s->ctl->n = (uint32_t)s->n;
  s->ctl->depth = (uint32_t)s->depth;
  atomic_store(&s->ctl->abort, 0);
  atomic_store(&s->ctl->refs, s->n);
  /* Operations are numbered from 0, or from the test seam's first_q (each
   * member starts at its posted word, the worker at its finished word). */
  for (int p = 0; p < s->n; p++) {
    atomic_store(&s->posted[p].v, mpg__shm_seams.first_q);
    atomic_store(&s->finished[p].v, mpg__shm_seams.first_q);
  }
}

/* The ring's slots: depth rounded up to a power of two, so that slot
 * q & (slots - 1) stays consecutive when q wraps at 2^32 (shm_internal.h);
 * depth <= SHM_MAX_DEPTH. */
static int ring_slots(int depth) {
  int slots = 1;
  while (slots < depth) slots <<= 1;
  return slots;
}

static uint64_t slack_bytes(uint64_t need) {
  return need / SLACK_DIV > SLACK_MIN ? need / SLACK_DIV : SLACK_MIN;
}

/* Note in the creator's account what failed; the status it stands for. */
static mpg_status failed_at(int32_t *acct, int step, int err) {
  acct[B_STEP] = step;
  acct[B_ERRNO] = err;
  return err == ENOMEM ? MPG_ERR_NOMEM : MPG_ERR_ENV;
}

/* The creator's segment, a file that never has a name, so that no kill of
 * any process at any moment leaves anything in /dev/shm: an O_TMPFILE in
 * /dev/shm (its size counts against /dev/shm, like the transport's
 * files), or where /dev/shm cannot hold one (no /dev/shm, not a tmpfs, a
 * kernel without O_TMPFILE there) a memfd.  Checked first against
 * /dev/shm's free space less the slack, reserved with posix_fallocate (so
 * that a full /dev/shm is an error now, not a SIGBUS in the middle of a
 * step), mapped.  Its descriptor stays open (*fdp) until every member
 * has opened it through /proc/<pid>/fd/<fd>. */
static mpg_status create_segment(mpg__shm *s, int32_t *acct, int *fdp) {
  uint64_t need = s->map_bytes, slack = slack_bytes(need);
  put64(acct + B_NEED_LO, need);
  put64(acct + B_SLACK_LO, slack);
  put64(acct + B_FREE_LO, UINT64_MAX);
  struct statvfs v;
  if (statvfs(SHM_DIR, &v) == 0) {
    uint64_t avail = (uint64_t)v.f_bavail * (uint64_t)v.f_frsize;
    put64(acct + B_FREE_LO, avail);
    if (avail < need || avail - need < slack) {
      acct[B_STEP] = F_SPACE;
      return MPG_ERR_ENV;
    }
  }
  acct[B_KIND] = K_TMPFILE;
  int fd = open(SHM_DIR, O_TMPFILE | O_RDWR | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0 && (errno == EOPNOTSUPP || errno == EISDIR || errno == EINVAL ||
                 errno == ENOENT || errno == ENOTDIR)) {
    acct[B_KIND] = K_MEMFD;
    fd = memfd_create("meshpg", MFD_CLOEXEC);
  }
  if (fd < 0) return failed_at(acct, acct[B_KIND] == K_MEMFD ? F_MEMFD : F_TMPFILE, errno);
  int step = F_NONE, rc = 0;
  struct stat st;
  void *p = MAP_FAILED;
  if (ftruncate(fd, (off_t)need)) step = F_TRUNCATE, rc = errno;
  else if ((rc = posix_fallocate(fd, 0, (off_t)need))) step = F_FALLOCATE;
  else if (fstat(fd, &st)) step = F_FSTAT, rc = errno;
  else if ((p = mmap(NULL, need, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED)
    step = F_MMAP, rc = errno;
  if (step) {
    close(fd);
    return failed_at(acct, step, rc ? rc : EINVAL);
  }
  put64(acct + B_DEV_LO, (uint64_t)st.st_dev);
  put64(acct + B_INO_LO, (uint64_t)st.st_ino);
  acct[B_PID] = (int32_t)getpid();
  acct[B_FD] = fd;
  *fdp = fd;
  s->base = p;
  return MPG_OK;
}

/* A member maps its creator's segment through /proc/<pid>/fd/<fd>, and
 * checks that it is that file (another pid namespace may have a process
 * of that pid, with some file at that descriptor). */
static mpg_status map_segment(mpg__shm *s, const int32_t *acct, int32_t *outcome) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)acct[B_PID], (int)acct[B_FD]);
  int fd = open(path, O_RDWR | O_CLOEXEC);
  int step = F_NONE, err = 0;
  struct stat st;
  void *p = MAP_FAILED;
  if (fd < 0) {
    err = errno;
    step = err == ENOENT && access("/proc/self/fd", F_OK) != 0 ? F_NOPROC : F_OPEN;
  } else if (fstat(fd, &st)) {
    step = F_FSTAT, err = errno;
  } else if ((uint64_t)st.st_dev != get64(acct + B_DEV_LO) ||
             (uint64_t)st.st_ino != get64(acct + B_INO_LO) || (size_t)st.st_size != s->map_bytes) {
    step = F_NOT_IT;
  } else if ((p = mmap(NULL, s->map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) ==
             MAP_FAILED) {
    step = F_MAP, err = errno;
  }
  if (fd >= 0) close(fd);
  if (step) {
    outcome[C_STEP] = step;
    outcome[C_ERRNO] = err;
    outcome[C_STATUS] = err == ENOMEM ? MPG_ERR_NOMEM : MPG_ERR_ENV;
    return (mpg_status)outcome[C_STATUS];
  }
  s->base = p;
  return MPG_OK;
}

size_t mpg__shm_mapped_bytes(const mpg__shm *s) { return s ? s->map_bytes : 0; }

mpg_status mpg__shm_destroy(mpg__shm *s) {
  if (!s) return MPG_OK;
  /* Out of its group's transport list (a channel's segment was never in
   * it), then freed. */
  mpg__group_detach(s->group, &s->link);
  mpg__shm_release(s);
  return MPG_OK;
}

/* One all-gather of int32 words over the group, through its setup callback. */
static mpg_status gather(const mpg__transport_setup *su, const int32_t *mine, int32_t *all,
                         size_t words) {
  return su->all_gather(su->arg, mine, all, words, MPG_I32);
}

/* The nodes of the group, from the gathered host hashes: node[p] (numbered
 * in the order of their first position), *nodes, and whether every node
 * holds the same number of members (*per, else 0). */
static void find_nodes(const int32_t *all, int n, int *node, int *nodes, int *per) {
  *nodes = 0;
  for (int p = 0; p < n; p++) {
    node[p] = -1;
    for (int q = 0; q < p && node[p] < 0; q++)
      if (get64(all + (size_t)q * A_WORDS + A_HASH_LO) ==
          get64(all + (size_t)p * A_WORDS + A_HASH_LO))
        node[p] = node[q];
    if (node[p] < 0) node[p] = (*nodes)++;
  }
  *per = n / *nodes;
  for (int k = 0; k < *nodes && *per; k++) {
    int c = 0;
    for (int p = 0; p < n; p++) c += node[p] == k;
    if (c != *per) *per = 0;
  }
}

static mpg_status fail_env(mpg_group *group, int bad, int pos) {
  int rank = -1;
  mpg_group_member(group, bad, &rank);
  return mpg__fail(MPG_ERR_ENV,
                   "MESHPG_SHM must be 0 (off) or 1 (on, the default) but rank %d has "
                   "another value%s",
                   rank, bad == pos ? " (this rank)" : "");
}

/* The error of a failed creation, alike on every member: position
 * `failed`'s outcome fc (its creator's, at position `fcreator`, when the
 * creator failed) and that creator's account fb.  MPG_OK when the members
 * only cannot share (the shared path is off for the group). */
static mpg_status describe_failure(mpg_group *group, const char *gname, int n, size_t bytes,
                                   int failed, int fcreator, const int32_t *fc,
                                   const int32_t *fb) {
  mpg_ctx *ctx = group->ctx;
  int frank = -1, crank = -1;
  mpg_group_member(group, failed, &frank);
  mpg_group_member(group, fcreator, &crank);
  mpg_status why = (mpg_status)fc[C_STATUS];
  int step = fc[C_STEP], err = fc[C_ERRNO];
  const char *e = err ? strerror(err) : mpg_status_name(why);
  unsigned long long need = get64(fb + B_NEED_LO), free_b = get64(fb + B_FREE_LO),
                     slack = get64(fb + B_SLACK_LO);
  char proc[64];
  snprintf(proc, sizeof proc, "/proc/%d/fd/%d", (int)fb[B_PID], (int)fb[B_FD]);
  const char *what = fb[B_KIND] == K_ANON    ? "an anonymous shared mapping"
                     : fb[B_KIND] == K_MEMFD ? "a memfd"
                                             : "an unnamed file in " SHM_DIR;
  switch (step) {
  case F_SPACE:
    return mpg__fail(MPG_ERR_ENV,
                     "shared memory for group %s: the segment of rank %d's host needs %llu "
                     "bytes (%d ranks x %zu bytes of gradients, plus control), plus %llu bytes "
                     "of slack for the MPI transport's own shared memory (max(64 MiB, 1/%d of "
                     "the segment)), but " SHM_DIR " there has %llu bytes free; make " SHM_DIR
                     " larger (docker run --shm-size=...) or set MESHPG_SHM=0",
                     gname, crank, need, n, bytes, slack, SLACK_DIV, free_b);
  case F_TMPFILE:
  case F_MEMFD:
  case F_TRUNCATE:
  case F_FALLOCATE:
  case F_MMAP:
  case F_ANON: {
    const char *call = step == F_TMPFILE    ? "open(" SHM_DIR ", O_TMPFILE)"
                       : step == F_MEMFD    ? "memfd_create"
                       : step == F_TRUNCATE ? "ftruncate"
                       : step == F_FALLOCATE ? "posix_fallocate"
                                             : "mmap";
    char room[160] = "";
    if (err == ENOSPC && free_b != UINT64_MAX)
      snprintf(room, sizeof room, " (" SHM_DIR " had %llu bytes free, %llu bytes of slack "
               "kept)", free_b, slack);
    return mpg__fail(why, "shared memory for group %s: rank %d could not create its segment "
                     "(%s of %llu bytes): %s: %s%s%s",
                     gname, crank, what, need, call, e, room,
                     err == ENOSPC ? "; make " SHM_DIR " larger (docker run --shm-size=...) or "
                                     "set MESHPG_SHM=0"
                     : fb[B_KIND] == K_ANON ? ""
                                            : "; or set MESHPG_SHM=0");
  }
  case F_OPEN:
    if (err == ENOENT || err == ENXIO || err == ENODEV || err == EISDIR) {
      /* The creator's pid is not this member's (another pid namespace:
       * containers that report one host): no such process or descriptor,
       * or another process's socket, device or directory there.  Not
       * shared, then, on any. */
      mpg__log(1, "rank %d: shared memory off for group %s (rank %d cannot open %s, the "
               "segment of rank %d: another pid namespace?): it keeps to the %s "
               "backend's collectives", ctx->rank, gname, frank, proc, crank, ctx->ops->name);
      return MPG_OK;
    }
    return mpg__fail(why, "shared memory for group %s: rank %d could not open %s, the "
                     "segment of rank %d (%s): %s; the processes of a host must run as one "
                     "user and may open each other's /proc/<pid>/fd, or set MESHPG_SHM=0",
                     gname, frank, proc, crank, what, e);
  case F_NOT_IT:
    mpg__log(1, "rank %d: shared memory off for group %s (%s is not the segment of rank %d "
             "for rank %d: another pid namespace?): it keeps to the %s backend's "
             "collectives", ctx->rank, gname, proc, crank, frank, ctx->ops->name);
    return MPG_OK;
  case F_NOPROC:
    return mpg__fail(why, "shared memory for group %s: rank %d could not open %s, the "
                     "segment of rank %d: %s: /proc is not mounted; mount it or set "
                     "MESHPG_SHM=0", gname, frank, proc, crank, e);
  case F_FSTAT:
  case F_MAP:
    if (failed == fcreator) /* the creator's own fstat */
      return mpg__fail(why, "shared memory for group %s: rank %d could not create its "
                       "segment (%s of %llu bytes): fstat: %s", gname, crank, what, need, e);
    return mpg__fail(why, "shared memory for group %s: rank %d could not map %s, the "
                     "segment of rank %d (%llu bytes): %s: %s", gname, frank, proc, crank,
                     need, step == F_MAP ? "mmap" : "fstat", e);
  case F_MAGIC:
    return mpg__fail(why, "shared memory for group %s: rank %d found no segment header "
                     "(%d members) in %s, the segment of rank %d", gname, frank, n, proc,
                     crank);
  case F_BOOK:
    return mpg__fail(why, "shared memory for group %s: rank %d: out of memory", gname,
                     frank);
  default:
    return mpg__fail(why, "shared memory for group %s: rank %d failed: %s", gname, frank, e);
  }
}

/* The three exchanges' words, kept until mpg__shm_create returns: words
 * holds each gather's (A_WORDS, then B_WORDS, then C_WORDS per position:
 * sized for the largest), accounts the creators' accounts (B, kept for the
 * message of a failure), node each position's node. */
typedef struct {
  int32_t *words, *accounts;
  int *node;
} shm_exchange;

/* Free the exchanges' words. */
static void exchange_free(shm_exchange *x) {
  free(x->words);
  free(x->accounts);
  free(x->node);
}

/* Allocate the exchanges' words for `total` positions: 0, or -1 (none kept) if out of memory. */
static int exchange_alloc(shm_exchange *x, int total) {
  x->words = malloc(sizeof(int32_t) * B_WORDS * (size_t)total);
  x->accounts = malloc(sizeof(int32_t) * B_WORDS * (size_t)total);
  x->node = malloc(sizeof(int) * (size_t)total);
  if (x->words && x->accounts && x->node) return 0;
  exchange_free(x);
  return -1;
}

/* This host's identity: the context's host id, else the topology's, else "?". */
static void host_identity(const mpg_ctx *ctx, char *host, size_t cap) {
  if (ctx->host_id[0]) snprintf(host, cap, "%s", ctx->host_id);
  else if (mpg_topo_host_identity(host, cap)) snprintf(host, cap, "?");
}

/* The first exchange (A): every member's host, process and MESHPG_SHM. */
static mpg_status exchange_identities(mpg_group *group, const mpg__transport_setup *su,
                                      const char *host, int32_t *words) {
  int32_t ident[A_WORDS] = {0};
  put64(ident + A_HASH_LO, mpg__hash_str(host));
  put64(ident + A_PROC_LO, process_id());
  ident[A_ENV] = env_value(group->ctx);
  return gather(su, ident, words, A_WORDS);
}

/* Where this member stands, from the first exchange: the first positions
 * with MESHPG_SHM=0 (off) and with another bad value (bad), or -1; the
 * group's nodes (find_nodes); the members on this node, in position order
 * (n of them, this member at local position pos, the node's creator its
 * first, at group position creator); whether they are separate processes
 * (pids_differ, else threads of one); this node's number (mynode). */
typedef struct {
  int total, off, bad, nodes, per;
  int n, pos, creator, pids_differ, mynode;
} shm_place;

/* Find where the member at group position gpos stands; fills node. */
static void locate(const int32_t *words, int total, int gpos, int *node, shm_place *pl) {
  pl->total = total;
  pl->off = pl->bad = -1;
  pl->nodes = pl->per = 0;
  for (int p = 0; p < total; p++) {
    const int32_t *ident = words + (size_t)p * A_WORDS;
    if (ident[A_ENV] == ENV_OFF && pl->off < 0) pl->off = p;
    if (ident[A_ENV] == ENV_BAD && pl->bad < 0) pl->bad = p;
  }
  find_nodes(words, total, node, &pl->nodes, &pl->per);
  pl->n = pl->pos = pl->pids_differ = 0;
  pl->creator = -1;
  for (int p = 0; p < total; p++) {
    if (node[p] != node[gpos]) continue;
    if (pl->creator < 0) pl->creator = p;
    if (p == gpos) pl->pos = pl->n;
    pl->n++;
    if (get64(words + (size_t)p * A_WORDS + A_PROC_LO) !=
        get64(words + (size_t)pl->creator * A_WORDS + A_PROC_LO))
      pl->pids_differ = 1;
  }
  pl->mynode = node[gpos];
}

/* 1 (logged with why) when the group keeps to the backend's collectives, alike on every member. */
static int declined(mpg_group *group, const char *gname, const shm_place *pl, int depth,
                    int channel) {
  const mpg_ctx *ctx = group->ctx;
  const char *reason = NULL;
  if (pl->off >= 0) reason = "MESHPG_SHM=0";
  else if (channel && pl->nodes > 1) reason = "its members are on several hosts";
  else if (pl->nodes > 1 && !pl->per)
    reason = "its nodes hold different numbers of its members: not reduced hierarchically";
  else if (pl->nodes > 1 && pl->per < 2)
    reason = "it has one member per node: not reduced hierarchically";
  /* The bounds of the abort word's fields and of the ring
   * (shm_internal.h), decided alike on every member: n is the same on
   * each (one node, or the same number on each node), depth too. */
  char bound[128];
  int big = !reason && (pl->n > SHM_MAX_MEMBERS || depth > SHM_MAX_DEPTH);
  if (big) {
    if (pl->n > SHM_MAX_MEMBERS)
      snprintf(bound, sizeof bound, "%d members on one node, more than the %d a segment holds",
               pl->n, SHM_MAX_MEMBERS);
    else
      snprintf(bound, sizeof bound, "%d buckets in the buffer, more than the %d a segment's "
               "ring holds", depth, SHM_MAX_DEPTH);
    reason = bound;
  }
  if (!reason) return 0;
  char at[48] = "";
  int rank = -1;
  if (pl->off >= 0 && !mpg_group_member(group, pl->off, &rank))
    snprintf(at, sizeof at, " at rank %d", rank);
  mpg__log(pl->off >= 0 || big ? 1 : 2,
           "rank %d: shared memory off for group %s (%s%s): %s through the %s "
           "backend's collectives", ctx->rank, gname, reason, at,
           channel ? "its all-to-alls go" : "it syncs", ctx->ops->name);
  return 1;
}

/* This member's bookkeeping of its node's segment, unmapped; *ok 0 when out of memory. */
static mpg__shm *book(mpg_group *group, const char *gname, const shm_place *pl,
                      const int *node, size_t bytes, mpg_dtype dtype, int depth, int *ok) {
  mpg__shm *s = calloc(1, sizeof *s);
  if (s) {
    s->region = calloc((size_t)pl->n, sizeof *s->region);
    s->members = calloc((size_t)pl->n, sizeof *s->members);
    s->deadline = calloc((size_t)ring_slots(depth), sizeof *s->deadline);
    s->scratch = aligned_alloc(64, MPG__REDUCE_SCRATCH);
    s->src = calloc((size_t)pl->n, sizeof *s->src);
    s->dst = calloc((size_t)pl->n, sizeof *s->dst);
    s->across = calloc((size_t)pl->nodes, sizeof *s->across);
  }
  *ok = s && s->region && s->members && s->deadline && s->scratch && s->src && s->dst &&
        s->across;
  if (!*ok) return s; /* what was allocated (or NULL), for release */
  for (int p = 0, k = 0; p < pl->total; p++)
    if (node[p] == pl->mynode) s->members[k++] = p;
  /* The member at this local position on each node (nodes are numbered
   * in the order of their first position, as the split below orders them). */
  for (int h = 0; h < pl->nodes; h++)
    for (int p = 0, k = 0; p < pl->total; p++)
      if (node[p] == h && k++ == pl->pos) s->across[h] = p;
  s->nodes = pl->nodes;
  s->node = pl->mynode;
  s->self.shm = s;
  s->group = group;
  s->n = pl->n;
  s->pos = pl->pos;
  s->total = pl->total;
  s->anon = !pl->pids_differ;
  s->depth = ring_slots(depth);
  s->dtype = dtype;
  /* Regions a page apart would put the n addends of an element, and
   * their stores, at one offset modulo 4 KiB, where the core's loads
   * wait on stores to other addresses that alias them: 5 more cache
   * lines per region give each of up to 64 members its own offset
   * (17.7 ms -> 14.8 ms for gpt-small at np 2 on the 2-core machine). */
  s->region_bytes = round_up(bytes, SHM_PAGE) + 5 * SHM_LINE;
  s->map_bytes = control_bytes(pl->n, s->depth) + s->region_bytes * (size_t)pl->n;
  snprintf(s->gname, sizeof s->gname, "%s", gname);
  if (pl->nodes > 1) {
    s->stage_elems = mpg__shm_max_shard(s, bytes / mpg__dtype_size(dtype));
    s->stage = malloc(s->stage_elems * (dtype == MPG_F64 ? 8 : 4));
    *ok = s->stage != NULL;
  }
  return s;
}

/* The creator makes, lays out and heads its node's segment, with its account in acct. */
static void creator_setup(mpg__shm *s, int32_t *acct, int *sfd) {
  /* Threads of one process share an anonymous mapping, processes create_segment's file. */
  if (s->anon) {
    acct[B_KIND] = K_ANON;
    put64(acct + B_NEED_LO, s->map_bytes);
    void *p = mmap(NULL, s->map_bytes, PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      acct[B_STATUS] = failed_at(acct, F_ANON, errno);
    } else {
      s->base = p;
      put64(acct + B_PTR_LO, (uint64_t)(uintptr_t)p);
    }
  } else {
    acct[B_STATUS] = create_segment(s, acct, sfd);
  }
  if (!acct[B_STATUS]) {
    carve(s);
    init_ctl(s);
  }
}

/* This member's outcome after the second exchange (st), its creator's account acct. */
static void member_outcome(mpg__shm *s, int ok, mpg_status st, const int32_t *acct,
                           const shm_place *pl, int32_t *outcome) {
  /* The exchange's error, the creator's failure, this member's lack of
   * memory (ok 0), or (any but the creator) mapping the creator's segment
   * and finding its header. */
  if (st) {
    outcome[C_STATUS] = st;
  } else if (acct[B_STATUS]) {
    outcome[C_STATUS] = acct[B_STATUS];
    outcome[C_STEP] = acct[B_STEP];
    outcome[C_ERRNO] = acct[B_ERRNO];
  } else if (!ok) {
    outcome[C_STATUS] = MPG_ERR_NOMEM;
    outcome[C_STEP] = F_BOOK;
  } else if (pl->pos != 0) {
    if (s->anon) s->base = (char *)(uintptr_t)get64(acct + B_PTR_LO);
    else map_segment(s, acct, outcome);
    if (!outcome[C_STATUS]) {
      carve(s);
      if (s->ctl->magic != SHM_MAGIC || s->ctl->n != (uint32_t)pl->n)
        outcome[C_STATUS] = MPG_ERR_STATE, outcome[C_STEP] = F_MAGIC;
    }
  }
}

/* The first position whose outcome (the third exchange's words) is a failure, or -1. */
static int first_failed(const int32_t *words, int total) {
  for (int p = 0; p < total; p++)
    if (words[(size_t)p * C_WORDS + C_STATUS]) return p;
  return -1;
}

/* What the segment is, for the log (acct: the node's creator's account). */
static const char *segment_kind(const mpg__shm *s, const int32_t *acct) {
  return s->anon                  ? "anonymous shared memory"
         : acct[B_KIND] == K_MEMFD ? "shared memory in a memfd"
                                   : "shared memory in an unnamed file in " SHM_DIR;
}

/* Start this member's worker thread on the shared segment and hand out its region. */
static mpg_status start_worker(mpg__shm *s, const char *gname, const char *what,
                               int channel, mpg__shm **out, void **data) {
  const mpg_ctx *ctx = s->group->ctx;
  if (channel) {
    /* No ring and no worker: the caller runs its own protocol over the
     * members' regions (mpg__shm_channel_create). */
    mpg__log(2, "rank %d: group %s shares %zu bytes of %s for its all-to-alls (%d members)",
             ctx->rank, gname, s->map_bytes, what, s->n);
    *out = s;
    *data = s->region[s->pos];
    return MPG_OK;
  }
  /* This member's first operation: its posted word, as the creator set
   * it before the second exchange (only this member writes it). */
  atomic_store_explicit(&s->nposted, atomic_load(&s->posted[s->pos].v), memory_order_relaxed);
  if (pthread_create(&s->worker, NULL, mpg__shm_worker, s)) {
    /* The others fail at their first operation, at once. */
    mpg__shm_abort(s, MPG_ERR_NOMEM, -1, atomic_load(&s->nposted));
    mpg__shm_release(s);
    return mpg__fail(MPG_ERR_NOMEM, "shared memory for group %s: cannot start its "
                     "worker thread", gname);
  }
  s->worker_up = 1;
  mpg__log(2, "rank %d: group %s shares %zu bytes of %s (%d members on this node%s%s)",
           ctx->rank, gname, s->map_bytes, what, s->n,
           s->nodes > 1 ? ", hierarchical across nodes: " : "",
           s->nodes <= 1 ? "" : s->scatter ? "reduce-scatter, all-gather" : "all-reduce");
  *out = s;
  *data = s->region[s->pos];
  return MPG_OK;
}

/* Release what a creation that failed alike on every member left (s may be NULL). */
static void discard(mpg__shm *s, int pos) {
  /* No worker runs yet: the creator unmaps an anonymous mapping alone. */
  if (s && s->anon && s->base && pos != 0) s->base = NULL;
  if (s && s->base && s->anon) atomic_store(&s->ctl->refs, 1);
  mpg__shm_release(s);
}

/* The error of the failure at position `failed`, alike on every member; frees x's words. */
static mpg_status explain_failure(mpg_group *group, const char *gname, shm_exchange *x, int n,
                                  size_t bytes, int failed) {
  int32_t failed_outcome[C_WORDS];
  memcpy(failed_outcome, x->words + (size_t)failed * C_WORDS, sizeof failed_outcome);
  int fcreator = 0;
  while (x->node[fcreator] != x->node[failed]) fcreator++;
  int32_t creator_acct[B_WORDS];
  memcpy(creator_acct, x->accounts + (size_t)fcreator * B_WORDS, sizeof creator_acct);
  exchange_free(x);
  return describe_failure(group, gname, n, bytes, failed, fcreator, failed_outcome,
                          creator_acct);
}

/* mpg__shm_segment_create, or with channel 1 mpg__shm_channel_create:
 * the collectives through su, the group's setup callbacks. */
static mpg_status create(mpg_group *group, const mpg__transport_setup *su, size_t bytes,
                         mpg_dtype dtype, int depth, int scatter, int channel,
                         mpg__shm **out, void **data) {
  *out = NULL;
  *data = NULL;
  mpg_ctx *ctx = group->ctx;
  int total = mpg_group_size(group), gpos = mpg_group_position(group);
  char gname[128];
  snprintf(gname, sizeof gname, "\"%s\" index %d", mpg_group_name(group),
           mpg_group_index(group));
  int cpu = ctx->ops->host_shm; /* the table says (backend.h), not the backend's kind */
  int dt_ok = dtype == MPG_F32 || dtype == MPG_F64 || dtype == MPG_F16 || dtype == MPG_BF16;
  /* Decided from what every member knows alike: no collective then. */
  if (total < 2 || !cpu || !dt_ok || depth < 1 || bytes == 0) return MPG_OK;
  char host[MPG_HOST_ID_MAX];
  host_identity(ctx, host, sizeof host);
  shm_exchange x;
  if (exchange_alloc(&x, total))
    return mpg__fail(MPG_ERR_NOMEM, "shared memory for group %s: out of memory", gname);
  mpg_status st = exchange_identities(group, su, host, x.words);
  if (st) {
    exchange_free(&x);
    return mpg__fail_wrap(st, "shared memory for group %s: exchanging host identities", gname);
  }
  shm_place pl;
  locate(x.words, total, gpos, x.node, &pl);
  if (pl.bad >= 0) {
    exchange_free(&x);
    return fail_env(group, pl.bad, gpos);
  }
  if (declined(group, gname, &pl, depth, channel)) {
    exchange_free(&x);
    return MPG_OK;
  }
  /* This node's members share a segment. */
  int ok = 0;
  mpg__shm *s = book(group, gname, &pl, x.node, bytes, dtype, depth, &ok);
  if (s) s->scatter = scatter;
  int32_t acct[B_WORDS] = {0}; /* this member's account (a creator's is read) */
  if (!ok) acct[B_STATUS] = MPG_ERR_NOMEM, acct[B_STEP] = F_BOOK;
  int sfd = -1; /* the creator's descriptor of its segment */
  if (pl.pos == 0 && !acct[B_STATUS]) creator_setup(s, acct, &sfd);
  st = gather(su, acct, x.accounts, B_WORDS);
  const int32_t *creator_acct = x.accounts + (size_t)pl.creator * B_WORDS;
  int32_t outcome[C_WORDS] = {0};
  member_outcome(s, ok, st, creator_acct, &pl, outcome);
  mpg_status setup_st = st ? st : gather(su, outcome, x.words, C_WORDS);
  /* Everyone opened it (or gave up): the creator's descriptor goes now,
   * the segment with the last mapping. */
  if (sfd >= 0) close(sfd);
  int failed = setup_st ? -1 : first_failed(x.words, total);
  /* Across nodes: the members at this local position on every node. */
  if (!setup_st && failed < 0 && pl.nodes > 1) {
    setup_st = su->split(su->arg, pl.pos, pl.mynode, &s->inter);
    if (!setup_st) s->inter_ops = su->split_ops;
    if (setup_st) setup_st = mpg__fail_wrap(setup_st, "splitting the group by local position");
  }
  if (!setup_st && failed < 0) {
    const char *what = segment_kind(s, creator_acct);
    exchange_free(&x);
    return start_worker(s, gname, what, channel, out, data);
  }
  /* Failed, everyone alike (or the exchange itself failed). */
  discard(s, pl.pos);
  if (setup_st) {
    exchange_free(&x);
    return mpg__fail_wrap(setup_st, "shared memory for group %s", gname);
  }
  /* Every member has the same words: the failed position's outcome, and
   * its node's creator's account. */
  return explain_failure(group, gname, &x, pl.n, bytes, failed);
}

mpg_status mpg__shm_segment_create(mpg_group *group, const mpg__transport_setup *su,
                                   size_t bytes, mpg_dtype dtype, int depth, int scatter,
                                   mpg__shm **out, void **data) {
  mpg_status st = create(group, su, bytes, dtype, depth, scatter, 0, out, data);
  if (!st && *out) {
    /* A transport of the group from now on (transport.h): the context's
     * abort reaches it at once, and its teardown frees what sync left. */
    (*out)->link.ops = &mpg__shm_ops;
    (*out)->link.comm = &(*out)->self;
    mpg__group_attach(group, &(*out)->link);
  }
  return st;
}

mpg_status mpg__shm_channel_create(mpg_group *group, const mpg__transport_setup *su,
                                   size_t bytes, mpg__shm **out) {
  void *data;
  return create(group, su, bytes, MPG_F64, 1, 0, 1, out, &data);
}

char *mpg__shm_channel_area(const mpg__shm *s, int pos) { return s->region[pos]; }

int mpg__shm_channel_threads(const mpg__shm *s) { return s->anon; }
