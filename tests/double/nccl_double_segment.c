/* The NCCL half of the test double (nccl_double.c): the POSIX
 * shared-memory segment of a communicator (layout, creation, opening,
 * unlinking). */

#include "nccl_double_internal.h"

/* ------------------------------------------------------------------ */
/* The shared segment of a communicator                               */
/* ------------------------------------------------------------------ */

const char *func_name(int f) {
  static const char *const n[] = {"?", "ncclAllReduce", "ncclBroadcast", "ncclReduce",
                                  "ncclAllGather", "ncclReduceScatter", "ncclSend", "ncclRecv"};
  return f >= 0 && f <= F_RECV ? n[f] : "?";
}

/* Staging: two banks per rank of `bank` bytes (1 MiB / n, 16..256 KiB)
 * and a ring of 256 KiB / n (4..64 KiB) per ordered pair. */
static void seg_layout(int n, struct layout *l) {
  uint64_t bank = ((1u << 20) / (uint64_t)n) & ~(uint64_t)4095;
  if (bank < 16384) bank = 16384;
  if (bank > 262144) bank = 262144;
  uint64_t ring = ((256u << 10) / (uint64_t)n) & ~(uint64_t)4095;
  if (ring < 4096) ring = 4096;
  if (ring > 65536) ring = 65536;
  l->bank = bank;
  l->ring = ring;
  l->off_ranks = 4096;
  l->off_slots = (l->off_ranks + sizeof(struct shm_rank) * (uint64_t)n + 4095) & ~(uint64_t)4095;
  l->off_chans = l->off_slots + 2 * bank * (uint64_t)n;
  l->chan_stride = sizeof(struct shm_chan) + ring;
  l->bytes = l->off_chans + l->chan_stride * (uint64_t)n * (uint64_t)n;
}

/* Unlink the segment's name, once per segment whoever asks: the CAS makes
 * the winner the only one to unlink, so a newer segment that took the name
 * is never removed by mistake. */
void seg_unlink_once(struct shm_hdr *h) {
  int32_t zero = 0;
  if (atomic_compare_exchange_strong(&h->unlinked, &zero, 1)) {
    if (shm_unlink(h->name) != 0 && errno != ENOENT)
      dbl_log("nccl double: shm_unlink(%s): %s", h->name, strerror(errno));
    else
      dbl_log("nccl double: unlinked %s", h->name);
  }
}

/* The header fields of a new segment of n ranks laid out as l (the magic
 * is stored last, by the caller). */
static void seg_head(struct shm_hdr *h, const struct layout *l, int n, const char *name) {
  h->nranks = n;
  h->version = 1;
  h->bytes = l->bytes;
  h->bank = l->bank;
  h->ring = l->ring;
  h->off_ranks = l->off_ranks;
  h->off_slots = l->off_slots;
  h->off_chans = l->off_chans;
  snprintf(h->name, sizeof h->name, "%s", name);
}

/* Is the segment of inode `ino` no longer under `name`? */
static int seg_unlinked(const char *name, ino_t ino) {
  int fd = shm_open(name, O_RDONLY, 0);
  if (fd < 0) return errno == ENOENT;
  struct stat st;
  int gone = fstat(fd, &st) == 0 && st.st_ino != ino;
  close(fd);
  return gone;
}

/* Has process pid exited?  A zombie counts: its parent (a launcher, a
 * test) may not have reaped it yet, but it will never run again. */
int pid_dead(int32_t pid) {
  if (pid <= 0) return 0;
  if (kill(pid, 0) != 0) return errno == ESRCH;
  char path[64], buf[256];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return 0;
  buf[n] = '\0';
  const char *rp = strrchr(buf, ')'); /* "pid (comm) S ..." */
  return rp && rp[1] == ' ' && (rp[2] == 'Z' || rp[2] == 'X');
}

/* Open the segment `name` for a communicator of n ranks, creating it if
 * it does not exist.  A segment of an earlier communicator with the same
 * name that already completed (NCCL_COMM_ID reused) is waited out until its
 * name is unlinked.  Returns the mapping, or NULL with a warning. */
struct shm_hdr *seg_open(const char *name, int n, volatile _Atomic int *abort_flag) {
  struct layout l;
  seg_layout(n, &l);
  double t0 = dbl_now();
  for (;;) {
    if (abort_flag && atomic_load(abort_flag)) {
      warn("meshpg double: communicator aborted while joining %s", name);
      return NULL;
    }
    int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd >= 0) {
      if (ftruncate(fd, (off_t)l.bytes) != 0) {
        warn("meshpg double: ftruncate(%s, %" PRIu64 "): %s", name, l.bytes, strerror(errno));
        close(fd);
        shm_unlink(name);
        return NULL;
      }
      /* Reserve the pages now when the segment is small, so that a full
       * /dev/shm fails here with a message rather than as SIGBUS later. */
      if (l.bytes <= (16u << 20)) {
        int e = posix_fallocate(fd, 0, (off_t)l.bytes);
        if (e != 0) {
          warn("meshpg double: posix_fallocate(%s, %" PRIu64 " bytes): %s (is /dev/shm full?)",
               name, l.bytes, strerror(e));
          close(fd);
          shm_unlink(name);
          return NULL;
        }
      }
      void *p = mmap(NULL, l.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      close(fd);
      if (p == MAP_FAILED) {
        warn("meshpg double: mmap(%s): %s", name, strerror(errno));
        shm_unlink(name);
        return NULL;
      }
      struct shm_hdr *h = p;
      seg_head(h, &l, n, name);
      if (getrandom(&h->nonce, sizeof h->nonce, 0) != (ssize_t)sizeof h->nonce)
        h->nonce = fnv1a(FNV_START, name, strlen(name)) ^ (uint64_t)getpid() ^
                   (uint64_t)(dbl_now() * 1e9);
      atomic_store_explicit(&h->magic, SHM_MAGIC, memory_order_release);
      dbl_log("nccl double: created %s (%d ranks, %" PRIu64 " bytes)", name, n, l.bytes);
      return h;
    }
    if (errno != EEXIST) {
      warn("meshpg double: shm_open(%s): %s", name, strerror(errno));
      return NULL;
    }
    fd = shm_open(name, O_RDWR, 0);
    if (fd < 0) {
      if (errno == ENOENT) continue; /* unlinked in between: create it */
      warn("meshpg double: shm_open(%s): %s", name, strerror(errno));
      return NULL;
    }
    struct stat st;
    int ok = 0;
    for (;;) {
      if (fstat(fd, &st) != 0) break;
      if ((uint64_t)st.st_size == l.bytes) {
        ok = 1;
        break;
      }
      if (st.st_size != 0) {
        close(fd);
        dbl_fatal("nccl double: communicator segment %s has %lld bytes but a communicator of "
                  "%d ranks needs %" PRIu64 ": ranks joining one unique id disagree on nranks "
                  "(real NCCL would hang or fail in bootstrap)",
                  name, (long long)st.st_size, n, l.bytes);
      }
      if (dbl_now() - t0 > 10) break; /* its creator died before sizing it */
      if (seg_unlinked(name, st.st_ino)) break; /* it gave up (ftruncate failed) */
      sleep_us(200);
    }
    if (!ok) {
      close(fd);
      warn("meshpg double: segment %s stays empty (its creator died?)", name);
      return NULL;
    }
    void *p = mmap(NULL, l.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
      warn("meshpg double: mmap(%s): %s", name, strerror(errno));
      return NULL;
    }
    struct shm_hdr *h = p;
    for (int spins = 0; atomic_load_explicit(&h->magic, memory_order_acquire) != SHM_MAGIC;
         spins++) {
      if (dbl_now() - t0 > 10) {
        munmap(p, l.bytes);
        warn("meshpg double: segment %s never got initialised (its creator died?)", name);
        return NULL;
      }
      /* A creator that could not reserve or map it unlinks it before
       * initialising it: its name is gone (or names another segment). */
      if (spins % 64 == 63 && seg_unlinked(name, st.st_ino)) {
        munmap(p, l.bytes);
        warn("meshpg double: the creator of segment %s gave up before initialising it (is "
             "/dev/shm full on this host?)", name);
        return NULL;
      }
      sleep_us(100);
    }
    if (h->nranks != n)
      dbl_fatal("nccl double: communicator %s was created for %d ranks, joined with nranks "
                "%d (real NCCL would hang in bootstrap)",
                name, h->nranks, n);
    if (atomic_load(&h->status) == SEG_COMPLETE) {
      /* An earlier communicator with the same name: its completer unlinks
       * it at once; if that one died in between, unlink it here. */
      if (dbl_now() - t0 > 2) seg_unlink_once(h);
      munmap(p, l.bytes);
      sleep_us(500);
      continue;
    }
    return h;
  }
}

/* A socket communicator's replica of the segment (nccl_double_net.c):
 * the same layout in private memory, never named in /dev/shm. */
struct shm_hdr *seg_private(const char *name, int n) {
  struct layout l;
  seg_layout(n, &l);
  void *p = mmap(NULL, l.bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return NULL;
  struct shm_hdr *h = p;
  seg_head(h, &l, n, name);
  atomic_store_explicit(&h->magic, SHM_MAGIC, memory_order_release);
  return h;
}
