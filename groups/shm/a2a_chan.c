/* The all-to-all channel of a group (a2a.c has the protocol): making it
 * at the group's first all-to-all, each member's outbox, and the peers'
 * memory mapped here.
 *
 * Making it (collective over the group; every member reaches it in the
 * same call): the segment (mpg__shm_channel_create: one host, a CPU
 * backend, MESHPG_SHM not 0), then for separate processes each member's
 * outbox (a memfd it keeps open, sealed against shrinking as mpi's
 * mem_alloc memfds are: a peer maps only a sealed memfd, so that its
 * mapping never outlives the file's end), and a check that every member can map
 * every other's outbox through /proc/<pid>/fd/<fd> (the segment's own
 * check covers its creator only).  Two host all-gathers carry the
 * outcome (every outbox written; every member's result), so that all
 * decide alike: the channel, or the backend's path for the group's
 * all-to-alls from then on (one log line says why). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "a2a_chan.h"

#define BOX_MIN ((size_t)1 << 20) /* an outbox's first size (no memory until touched) */

void mpg__a2a_unmap_peers(mpg__a2a *ch) {
  for (size_t i = 0; ch->maps && i < (size_t)ch->n * MAPS; i++)
    if (ch->maps[i].base) {
      munmap((void *)ch->maps[i].base, (size_t)ch->maps[i].len);
      ch->maps[i] = (a2a_map){0, 0, NULL};
    }
}

void mpg__a2a_shm_destroy(mpg__a2a *ch) {
  if (!ch) return;
  mpg__a2a_unmap_peers(ch);
  if (ch->box) munmap(ch->box, ch->box_len);
  if (ch->box_fd >= 0) close(ch->box_fd);
  free(ch->maps);
  free(ch->nmaps);
  mpg__shm_destroy(ch->seg);
  free(ch->area);
  free(ch->mine);
  free(ch->rdispl);
  free(ch->read);
  free(ch);
}

const char *mpg__a2a_map_peer(mpg__a2a *ch, int p, int pid, uint64_t fd, uint64_t id,
                              uint64_t len, size_t *mapped) {
  a2a_map *m = ch->maps + (size_t)p * MAPS, *slot = NULL;
  for (int i = 0; i < MAPS; i++)
    if (m[i].base && m[i].id == id) {
      if (m[i].len >= len) {
        *mapped = (size_t)m[i].len;
        return m[i].base;
      }
      slot = &m[i]; /* it grew: mapped again in its slot */
    }
  if (len == 0 || len > SIZE_MAX / 2 || fd > INT32_MAX) {
    errno = EINVAL; /* a corrupt descriptor */
    return NULL;
  }
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/fd/%d", pid, (int)fd);
  int f = open(path, O_RDONLY | O_CLOEXEC);
  if (f < 0) return NULL;
  struct stat st;
  void *base = MAP_FAILED;
  /* The file must hold what is mapped, and never shrink under the mapping
   * (a read past its end would be a SIGBUS): its creator sealed it so. */
  int seals = fcntl(f, F_GET_SEALS);
  if (fstat(f, &st) != 0) base = MAP_FAILED;
  else if ((uint64_t)st.st_ino != id || (uint64_t)st.st_size < len) errno = ESTALE;
  else if (seals < 0 || !(seals & F_SEAL_SHRINK)) errno = EPERM;
  else base = mmap(NULL, (size_t)len, PROT_READ, MAP_SHARED, f, 0);
  int e = errno;
  close(f);
  errno = e;
  if (base == MAP_FAILED) return NULL;
  if (!slot) slot = m + ch->nmaps[p]++ % MAPS;
  if (slot->base) munmap((void *)slot->base, (size_t)slot->len);
  *slot = (a2a_map){id, len, base};
  *mapped = (size_t)len;
  return base;
}

mpg_status mpg__a2a_box_reserve(mpg__a2a *ch, size_t bytes) {
  if (bytes <= ch->box_len) return MPG_OK;
  size_t len = ch->box_len * 2 > bytes ? ch->box_len * 2 : bytes;
  len = (len + BOX_MIN - 1) / BOX_MIN * BOX_MIN;
  void *p = MAP_FAILED;
  if (ftruncate(ch->box_fd, (off_t)len) == 0)
    p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, ch->box_fd, 0);
  if (p == MAP_FAILED)
    return mpg__fail(MPG_ERR_NOMEM, "all-to-all on \"%s\": growing this member's outbox to "
                     "%zu bytes: %s", ch->g->name, len, strerror(errno));
  if (ch->box) munmap(ch->box, ch->box_len);
  ch->box = p;
  ch->box_len = len;
  ch->area[ch->me]->box_len = len;
  return MPG_OK;
}

/* This member's outbox: a memfd of BOX_MIN bytes, mapped; 0 or errno. */
static int box_make(mpg__a2a *ch) {
  ch->box_fd = memfd_create("meshpg-a2a", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (ch->box_fd < 0) return errno;
  struct stat st;
  if (fcntl(ch->box_fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_SEAL) != 0) return errno;
  if (fstat(ch->box_fd, &st)) return errno;
  ch->box_id = (uint64_t)st.st_ino;
  a2a_head *h = ch->area[ch->me];
  h->box_fd = (uint64_t)ch->box_fd;
  h->box_id = ch->box_id;
  return mpg__a2a_box_reserve(ch, BOX_MIN) ? ENOMEM : 0;
}

/* Every member makes its outbox and maps every other's: two all-gathers,
 * so that all decide alike.  *ok 0 (one log line) when one cannot. */
static mpg_status check_boxes(mpg__a2a *ch, const mpg__transport_setup *su, int *ok) {
  mpg_group *g = ch->g;
  int32_t mine = box_make(ch), *all = malloc(sizeof *all * (size_t)ch->n);
  if (!all) return mpg__fail(MPG_ERR_NOMEM, "all-to-all on \"%s\": out of memory", g->name);
  int32_t made = mine;
  mpg_status st = su->all_gather(su->arg, &made, all, 1, MPG_I32); /* written */
  int bad = ch->me;
  for (int p = 0; !st && p < ch->n && !mine; p++) {
    if (p == ch->me || all[p]) continue; /* its own failure is its own to tell */
    const a2a_head *h = ch->area[p];
    size_t mapped;
    if (!mpg__a2a_map_peer(ch, p, (int)h->pid, h->box_fd, h->box_id, h->box_len, &mapped))
      mine = errno ? errno : EINVAL, bad = p;
  }
  int32_t word = mine ? (int32_t)((uint32_t)mine << 12 | (uint32_t)bad) : 0;
  if (!st) st = su->all_gather(su->arg, &word, all, 1, MPG_I32);
  *ok = 1;
  for (int p = 0; !st && p < ch->n && *ok; p++) {
    if (!all[p]) continue;
    int from = -1, to = -1, at = all[p] & 0xfff;
    mpg_group_member(g, p, &from);
    mpg_group_member(g, at, &to);
    char what[96];
    if (at == p) snprintf(what, sizeof what, "rank %d cannot make its outbox (memfd_create)",
                          from);
    else snprintf(what, sizeof what, "rank %d cannot map rank %d's outbox (/proc/<pid>/fd)",
                  from, to);
    mpg__log(1, "rank %d: shared memory off for the all-to-alls of group \"%s\" index %d: "
             "%s: %s: they go through the %s backend's point to point", g->ctx->rank,
             g->name, g->index, what, strerror((int)((uint32_t)all[p] >> 12)),
             g->ctx->ops->name);
    *ok = 0;
  }
  free(all);
  return st;
}

/* The last-level cache of this process's core, in bytes: what the kernel
 * says of cpu0's level-3 (else level-2) cache, which a virtual machine
 * sees as it is (glibc's sysconf may give the host's whole L3, 320 MiB
 * where a guest's is 32 MiB), else sysconf, else 32 MiB. */
static size_t last_level_cache(void) {
  for (int level = 3; level >= 2; level--)
    for (int i = 0; i < 8; i++) {
      char path[96], buf[32];
      snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/level", i);
      FILE *f = fopen(path, "r");
      int lv = 0;
      if (!f) break;
      if (fscanf(f, "%d", &lv) != 1) lv = 0;
      fclose(f);
      if (lv != level) continue;
      snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
      if (!(f = fopen(path, "r"))) continue;
      unsigned long long v = 0;
      char unit = 0;
      if (!fgets(buf, sizeof buf, f) || sscanf(buf, "%llu%c", &v, &unit) < 1) v = 0;
      fclose(f);
      if (v) return (size_t)v << (unit == 'K' ? 10 : unit == 'M' ? 20 : 0);
    }
  long llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
  return llc > 0 ? (size_t)llc : (size_t)32 << 20;
}

/* The bookkeeping of a channel over seg; NULL when out of memory. */
static mpg__a2a *book(mpg_group *g, mpg__shm *seg) {
  int n = g->size;
  mpg__a2a *ch = calloc(1, sizeof *ch);
  if (!ch) return NULL;
  ch->g = g;
  ch->seg = seg;
  ch->n = n;
  ch->me = g->position;
  ch->box_fd = -1;
  ch->threads = mpg__shm_channel_threads(seg);
  ch->both_ways = g->ctx->kind == MPG_BACKEND_MPI;
  /* Past the cache when the node's members together read and write more
   * than the last-level cache holds in one call (2 x n x what one writes):
   * at np 2 on the 2-core machine, 4 MiB a member copies fastest through
   * the cache (177 us against 352), 8 MiB past it (786 us against 1488). */
  ch->stream_min = last_level_cache() / 2 / (size_t)n;
  ch->area = calloc((size_t)n, sizeof *ch->area);
  ch->mine = calloc(3 * (size_t)n, sizeof *ch->mine);
  ch->rdispl = calloc((size_t)n, sizeof *ch->rdispl);
  ch->read = calloc((size_t)n, 1);
  ch->maps = calloc((size_t)n * MAPS, sizeof *ch->maps);
  ch->nmaps = calloc((size_t)n, sizeof *ch->nmaps);
  if (!ch->area || !ch->mine || !ch->rdispl || !ch->read || !ch->maps || !ch->nmaps) {
    ch->seg = NULL; /* the caller's */
    mpg__a2a_shm_destroy(ch);
    return NULL;
  }
  for (int p = 0; p < n; p++) ch->area[p] = (a2a_head *)mpg__shm_channel_area(seg, p);
  ch->area[ch->me]->pid = (uint64_t)getpid();
  ch->area[ch->me]->dtype = -1;
  return ch;
}

mpg_status mpg__a2a_channel_make(mpg_group *g, const mpg__transport_setup *su,
                                 mpg__a2a **out) {
  *out = NULL;
  int n = g->size;
  if (n > A2A_MAX_MEMBERS) {
    mpg__log(2, "rank %d: shared memory off for the all-to-alls of group \"%s\" (%d "
             "members, more than %d)", g->ctx->rank, g->name, n, A2A_MAX_MEMBERS);
    return MPG_OK;
  }
  mpg__shm *seg = NULL;
  mpg_status st = mpg__shm_channel_create(g, su, sizeof(a2a_head) + 3 * sizeof(uint64_t) *
                                                     (size_t)n, &seg);
  if (st == MPG_ERR_ENV) {
    /* Alike on every member (no room in /dev/shm, ...): the backend's path. */
    mpg__log(1, "rank %d: shared memory off for the all-to-alls of group \"%s\": %s",
             g->ctx->rank, g->name, mpg_last_error());
    return MPG_OK;
  }
  if (st || !seg) return st;
  mpg__a2a *ch = book(g, seg);
  if (!ch) mpg__shm_destroy(seg);
  /* Every member takes part in the exchanges alike; one without memory
   * says so through them. */
  int32_t nomem = !ch, *all = calloc((size_t)n, sizeof *all);
  st = all ? su->all_gather(su->arg, &nomem, all, 1, MPG_I32)
           : mpg__fail(MPG_ERR_NOMEM, "all-to-all on \"%s\": out of memory", g->name);
  for (int p = 0; !st && p < n; p++)
    if (all[p]) st = mpg__fail(MPG_ERR_NOMEM, "all-to-all on \"%s\": position %d is out of "
                               "memory for its shared-memory channel", g->name, p);
  free(all);
  int ok = 1;
  if (!st && !ch->threads) st = check_boxes(ch, su, &ok);
  if (st || !ok) {
    mpg__a2a_shm_destroy(ch);
    return st;
  }
  *out = ch;
  return MPG_OK;
}
