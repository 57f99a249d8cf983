/* mpg__shm_create and mpg__shm_destroy: deciding whether a group's members
 * share a node, and the segment they share (see shm_internal.h). */
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

#define SHM_DIR "/dev/shm"
#define NAME_MAX_ 64

enum { ENV_OFF = 0, ENV_ON = 1, ENV_BAD = 2 };

/* What each member tells the others first (int32 words). */
enum { A_HASH_LO, A_HASH_HI, A_PROC_LO, A_PROC_HI, A_ENV, A_WORDS };
/* What the creator (position 0) tells them next. */
enum { B_STATUS, B_PTR_LO, B_PTR_HI, B_NEED_LO, B_NEED_HI, B_FREE_LO, B_FREE_HI,
       B_ERRNO, B_NAME, B_WORDS = B_NAME + NAME_MAX_ / 4 };

static atomic_uint segment_seq;

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

static int env_value(void) {
  const char *v = getenv("MESHPG_SHM");
  if (!v || !*v || strcmp(v, "1") == 0) return ENV_ON;
  return strcmp(v, "0") == 0 ? ENV_OFF : ENV_BAD;
}

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
  atomic_store(&s->ctl->abort_by, -1);
  atomic_store(&s->ctl->abort_peer, -1);
  atomic_store(&s->ctl->refs, s->n);
}

/* The creator's segment: checked against /dev/shm's free space, reserved
 * with posix_fallocate (so that a full /dev/shm is an error now, not a
 * SIGBUS in the middle of a step), mapped. */
static mpg_status create_segment(mpg__shm *s, const char *name, int32_t *b) {
  struct statvfs v;
  uint64_t need = s->map_bytes, avail = 0;
  put64(b + B_NEED_LO, need);
  if (statvfs(SHM_DIR, &v) == 0) {
    avail = (uint64_t)v.f_bavail * (uint64_t)v.f_frsize;
    put64(b + B_FREE_LO, avail);
    if (avail < need) return MPG_ERR_ENV;
  } else {
    put64(b + B_FREE_LO, UINT64_MAX);
  }
  int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) {
    b[B_ERRNO] = errno;
    return MPG_ERR_ENV;
  }
  int rc = ftruncate(fd, (off_t)need);
  if (rc == 0) rc = posix_fallocate(fd, 0, (off_t)need);
  else rc = errno;
  void *p = MAP_FAILED;
  if (rc == 0) {
    p = mmap(NULL, need, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) rc = errno;
  }
  close(fd);
  if (rc) {
    shm_unlink(name);
    b[B_ERRNO] = rc;
    if (rc == ENOSPC && !avail) put64(b + B_FREE_LO, 0);
    return rc == ENOMEM ? MPG_ERR_NOMEM : MPG_ERR_ENV;
  }
  s->base = p;
  return MPG_OK;
}

static mpg_status map_segment(mpg__shm *s, const char *name, int *err) {
  int fd = shm_open(name, O_RDWR, 0);
  if (fd < 0) {
    *err = errno;
    return MPG_ERR_ENV;
  }
  struct stat st;
  void *p = MAP_FAILED;
  if (fstat(fd, &st) == 0 && (size_t)st.st_size == s->map_bytes)
    p = mmap(NULL, s->map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  *err = p == MAP_FAILED ? (errno ? errno : EINVAL) : 0;
  close(fd);
  if (p == MAP_FAILED) return MPG_ERR_ENV;
  s->base = p;
  return MPG_OK;
}

static void release(mpg__shm *s) {
  if (!s) return;
  const struct mpg__backend_ops *ops = s->group ? s->group->ctx->ops : NULL;
  /* A worker blocked in the all-reduce across nodes of a failed step
   * returns now. */
  if (s->inter && s->ctl && atomic_load(&s->ctl->abort_status))
    ops->abort_comm(s->inter, MPG_ERR_ABORTED);
  if (s->worker_up) {
    atomic_store(&s->stop, 1);
    mpg__shm_futex_wake(&s->posted[s->pos].v);
    pthread_join(s->worker, NULL);
  }
  if (s->base) {
    /* Anonymous: the threads share one mapping, freed by the last. */
    if (!s->anon || atomic_fetch_sub(&s->ctl->refs, 1) == 1) munmap(s->base, s->map_bytes);
  }
  if (s->inter) ops->destroy(s->inter);
  free(s->stage);
  free(s->members);
  free(s->scratch);
  free(s->region);
  free(s->deadline);
  free(s);
}

size_t mpg__shm_mapped_bytes(const mpg__shm *s) { return s ? s->map_bytes : 0; }

mpg_status mpg__shm_destroy(mpg__shm *s) {
  release(s);
  return MPG_OK;
}

static mpg_status gather(mpg_group *g, const int32_t *mine, int32_t *all, size_t words) {
  return mpg__group_host_all_gather(g, mine, all, words, MPG_I32);
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
                   "another value%s%s%s",
                   rank, bad == pos ? " (\"" : "", bad == pos ? getenv("MESHPG_SHM") : "",
                   bad == pos ? "\")" : "");
}

mpg_status mpg__shm_create(mpg_group *group, size_t bytes, mpg_dtype dtype, int depth,
                           int scatter, mpg__shm **out, void **data) {
  *out = NULL;
  *data = NULL;
  mpg_ctx *ctx = group->ctx;
  int total = mpg_group_size(group), gpos = mpg_group_rank(group);
  char gname[128];
  snprintf(gname, sizeof gname, "\"%s\" index %d", mpg_group_name(group),
           mpg_group_index(group));
  int cpu = ctx->kind == MPG_BACKEND_THREAD || ctx->kind == MPG_BACKEND_MPI;
  int dt_ok = dtype == MPG_F32 || dtype == MPG_F64 || dtype == MPG_F16 || dtype == MPG_BF16;
  /* Decided from what every member knows alike: no collective then (a bad
   * MESHPG_SHM still fails a CPU rank: alone, it has no peer to wait). */
  if (total < 2 || !cpu || !dt_ok || depth < 1 || bytes == 0)
    return cpu && total < 2 && env_value() == ENV_BAD ? fail_env(group, gpos, gpos) : MPG_OK;
  char host[MPG_HOST_ID_MAX];
  if (ctx->host_id[0]) snprintf(host, sizeof host, "%s", ctx->host_id);
  else if (mpg_topo_host_identity(host, sizeof host)) snprintf(host, sizeof host, "?");
  int32_t a[A_WORDS] = {0}, *all = malloc(sizeof(int32_t) * B_WORDS * (size_t)total);
  int *node = malloc(sizeof(int) * (size_t)total);
  if (!all || !node) {
    free(all);
    free(node);
    return mpg__fail(MPG_ERR_NOMEM, "shared memory for group %s: out of memory", gname);
  }
  put64(a + A_HASH_LO, mpg__hash_str(host));
  put64(a + A_PROC_LO, process_id());
  a[A_ENV] = env_value();
  mpg_status st = gather(group, a, all, A_WORDS);
  if (st) {
    free(all);
    free(node);
    return mpg__fail_wrap(st, "shared memory for group %s: exchanging host identities", gname);
  }
  int off = -1, bad = -1, nodes = 0, per = 0;
  for (int p = 0; p < total; p++) {
    const int32_t *x = all + (size_t)p * A_WORDS;
    if (x[A_ENV] == ENV_OFF && off < 0) off = p;
    if (x[A_ENV] == ENV_BAD && bad < 0) bad = p;
  }
  find_nodes(all, total, node, &nodes, &per);
  /* The members on this node, in position order: local position pos of n;
   * the node's creator is its first; are they threads of one process? */
  int n = 0, pos = 0, creator = -1, pids_differ = 0;
  for (int p = 0; p < total; p++) {
    if (node[p] != node[gpos]) continue;
    if (creator < 0) creator = p;
    if (p == gpos) pos = n;
    n++;
    if (get64(all + (size_t)p * A_WORDS + A_PROC_LO) !=
        get64(all + (size_t)creator * A_WORDS + A_PROC_LO))
      pids_differ = 1;
  }
  int mynode = node[gpos];
  if (bad >= 0) {
    free(all);
    free(node);
    return fail_env(group, bad, gpos);
  }
  const char *why = NULL;
  if (off >= 0) why = "MESHPG_SHM=0";
  else if (nodes > 1 && !per) why = "its nodes hold different numbers of its members";
  else if (nodes > 1 && per < 2) why = "it has one member per node";
  else if (nodes > 1 && scatter) why = "a sharded buffer across nodes is not reduced hierarchically";
  if (why) {
    char at[48] = "";
    int rank = -1;
    if (off >= 0 && !mpg_group_member(group, off, &rank))
      snprintf(at, sizeof at, " at rank %d", rank);
    mpg__log(off >= 0 ? 1 : 2,
             "rank %d: shared memory off for group %s (%s%s): it syncs through the %s "
             "backend's collectives", ctx->rank, gname, why, at, ctx->ops->name);
    free(all);
    free(node);
    return MPG_OK;
  }
  /* This node's members share a segment. */
  mpg__shm *s = calloc(1, sizeof *s);
  if (s) {
    s->region = calloc((size_t)n, sizeof *s->region);
    s->members = calloc((size_t)n, sizeof *s->members);
    s->deadline = calloc((size_t)depth, sizeof *s->deadline);
    s->scratch = mpg__shm_scratch();
  }
  int32_t b[B_WORDS] = {0};
  char name[NAME_MAX_] = "";
  int ok = s && s->region && s->members && s->deadline && s->scratch;
  if (ok) {
    for (int p = 0, k = 0; p < total; p++)
      if (node[p] == mynode) s->members[k++] = p;
    s->group = group;
    s->n = n;
    s->pos = pos;
    s->total = total;
    s->anon = !pids_differ;
    s->depth = depth;
    s->dtype = dtype;
    /* Regions a page apart would put the n addends of an element, and
     * their stores, at one offset modulo 4 KiB, where the core's loads
     * wait on stores to other addresses that alias them: 5 more cache
     * lines per region give each of up to 64 members its own offset
     * (17.7 ms -> 14.8 ms for gpt-small at np 2 on the 2-core machine). */
    s->region_bytes = round_up(bytes, SHM_PAGE) + 5 * SHM_LINE;
    s->map_bytes = control_bytes(n, depth) + s->region_bytes * (size_t)n;
    snprintf(s->gname, sizeof s->gname, "%s", gname);
    if (nodes > 1) {
      s->stage_elems = mpg__shm_max_shard(s, bytes / mpg__dtype_size(dtype));
      s->stage = malloc(s->stage_elems * (dtype == MPG_F64 ? 8 : 4));
      ok = s->stage != NULL;
    }
  }
  free(node);
  if (!ok) b[B_STATUS] = MPG_ERR_NOMEM;
  if (pos == 0 && !b[B_STATUS]) {
    if (s->anon) {
      void *p = mmap(NULL, s->map_bytes, PROT_READ | PROT_WRITE,
                     MAP_SHARED | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) b[B_STATUS] = MPG_ERR_NOMEM;
      else s->base = p;
      put64(b + B_PTR_LO, (uint64_t)(uintptr_t)p);
      put64(b + B_NEED_LO, s->map_bytes);
    } else {
      /* Per job (the creator's pid), group and segment. */
      snprintf(name, sizeof name, "/meshpg-%d-%.20s-%d-%u", (int)getpid(),
               mpg_group_name(group), mpg_group_index(group),
               atomic_fetch_add(&segment_seq, 1));
      for (char *c = name + 1; *c; c++)
        if (*c == '/') *c = '_';
      snprintf((char *)(b + B_NAME), NAME_MAX_, "%s", name);
      b[B_STATUS] = create_segment(s, name, b);
    }
    if (!b[B_STATUS]) {
      carve(s);
      init_ctl(s);
    }
  }
  st = gather(group, b, all, B_WORDS);
  int32_t cb[B_WORDS]; /* this node's creator's (all is reused below) */
  memcpy(cb, all + (size_t)creator * B_WORDS, sizeof cb);
  int32_t c[2] = {0, 0};
  if (st) {
    c[0] = st;
  } else if (cb[B_STATUS]) {
    c[0] = cb[B_STATUS];
  } else if (!ok) {
    c[0] = MPG_ERR_NOMEM;
  } else if (pos != 0) {
    memcpy(name, cb + B_NAME, NAME_MAX_);
    name[NAME_MAX_ - 1] = '\0';
    if (s->anon) s->base = (char *)(uintptr_t)get64(cb + B_PTR_LO);
    else c[0] = map_segment(s, name, &c[1]);
    if (!c[0]) {
      carve(s);
      if (s->ctl->magic != SHM_MAGIC || s->ctl->n != (uint32_t)n) c[0] = MPG_ERR_STATE;
    }
  }
  mpg_status st2 = st ? st : gather(group, c, all, 2);
  /* Everyone mapped it (or gave up): the name goes now. */
  if (pos == 0 && s && !s->anon && !b[B_STATUS]) shm_unlink(name);
  int failed = -1;
  for (int p = 0; !st2 && p < total; p++)
    if (all[2 * p] && failed < 0) failed = p;
  /* Across nodes: the members at this local position on every node. */
  if (!st2 && failed < 0 && nodes > 1) {
    st2 = ctx->ops->split(group->comm, pos, mynode, &s->inter);
    if (st2) st2 = mpg__fail_wrap(st2, "splitting the group by local position");
  }
  if (!st2 && failed < 0) {
    free(all);
    if (pthread_create(&s->worker, NULL, mpg__shm_worker, s)) {
      /* The others fail at their first operation, at once. */
      mpg__shm_abort(s, MPG_ERR_NOMEM, -1, 0);
      release(s);
      return mpg__fail(MPG_ERR_NOMEM, "shared memory for group %s: cannot start its "
                       "worker thread", gname);
    }
    s->worker_up = 1;
    mpg__log(2, "rank %d: group %s shares %zu bytes of %s memory (%d members on this node%s)",
             ctx->rank, gname, s->map_bytes, s->anon ? "anonymous" : "POSIX shared", n,
             nodes > 1 ? ", hierarchical across nodes" : "");
    *out = s;
    *data = s->region[pos];
    return MPG_OK;
  }
  /* Failed, everyone alike (or the exchange itself failed). */
  int32_t why2 = st2 ? (int32_t)st2 : all[2 * failed], err = st2 ? 0 : all[2 * failed + 1];
  /* No worker runs yet: the creator unmaps an anonymous mapping alone. */
  if (s && s->anon && s->base && pos != 0) s->base = NULL;
  if (s && s->base && s->anon) atomic_store(&s->ctl->refs, 1);
  release(s);
  int not_there = !st2 && err == ENOENT; /* every member sees the same words */
  free(all);
  if (st2) return mpg__fail_wrap(st2, "shared memory for group %s", gname);
  if (not_there) {
    /* The creator made it, a member cannot see it: another /dev/shm (two
     * containers that report one host).  Not shared, then, on any. */
    int frank = -1;
    mpg_group_member(group, failed, &frank);
    mpg__log(1, "rank %d: shared memory off for group %s (rank %d cannot see the segment "
             "its host's first member made: another /dev/shm?): it syncs through the %s "
             "backend's collectives", ctx->rank, gname, frank, ctx->ops->name);
    return MPG_OK;
  }
  if (cb[B_STATUS] == MPG_ERR_ENV && (!cb[B_ERRNO] || cb[B_ERRNO] == ENOSPC))
    return mpg__fail(MPG_ERR_ENV,
                     "shared memory for group %s: its segment needs %llu bytes (%d ranks x "
                     "%zu bytes of gradients, plus control) but " SHM_DIR " has %llu bytes "
                     "free; make " SHM_DIR " larger (docker run --shm-size=...) or set "
                     "MESHPG_SHM=0",
                     gname, (unsigned long long)get64(cb + B_NEED_LO), n, bytes,
                     (unsigned long long)get64(cb + B_FREE_LO));
  int frank = -1;
  mpg_group_member(group, failed, &frank);
  return mpg__fail((mpg_status)why2,
                   "shared memory for group %s: rank %d could not %s its segment in " SHM_DIR
                   ": %s",
                   gname, frank, cb[B_STATUS] ? "create" : "map",
                   err ? strerror(err) : mpg_status_name((mpg_status)why2));
}
