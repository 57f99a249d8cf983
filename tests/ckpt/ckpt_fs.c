/* Checkpoint directories in the ckpt tests: see ckpt_fs.h. */
#include "ckpt_fs.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../../sync/ckpt_format.h"

static int fail(char *msg, size_t cap, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, cap, fmt, ap);
  va_end(ap);
  return -1;
}

int ckf_tmpdir(char *buf, size_t cap, const char *tag) {
  const char *base = getenv("MESHPG_CKPT_TEST_DIR");
  if (!base || !base[0]) base = getenv("TMPDIR");
  if (!base || !base[0]) base = "/tmp";
  snprintf(buf, cap, "%s/mpg-ckpt-%s-XXXXXX", base, tag);
  return mkdtemp(buf) ? 0 : -1;
}

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st;
  (void)flag;
  (void)ftw;
  return remove(path) == 0 || errno == ENOENT ? 0 : 0; /* best effort */
}

void ckf_rm_rf(const char *path) { nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS); }

int ckf_exists(const char *path) {
  struct stat st;
  return lstat(path, &st) == 0;
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

int ckf_list(const char *dir, char *buf, size_t cap) {
  DIR *d = opendir(dir);
  buf[0] = '\0';
  if (!d) return -1;
  char *names[512];
  int n = 0;
  for (struct dirent *e; (e = readdir(d)) && n < 512;)
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) names[n++] = strdup(e->d_name);
  closedir(d);
  qsort(names, (size_t)n, sizeof names[0], cmp_str);
  size_t len = 0;
  for (int i = 0; i < n; i++) {
    if (len < cap) len += (size_t)snprintf(buf + len, cap - len, "%s%s", i ? " " : "", names[i]);
    free(names[i]);
  }
  return n;
}

/* Global row-major index of element r (box row-major) of a chunk. */
static uint64_t chunk_global(const mpg__ckpt_tensor *t, const mpg__ckpt_chunk *ch, uint64_t r) {
  uint64_t idx[MPG_CKPT_MAX_NDIM], g = 0;
  for (int a = t->ndim - 1; a >= 0; a--) {
    idx[a] = r % ch->box_shape[a];
    r /= ch->box_shape[a];
  }
  for (int a = 0; a < t->ndim; a++) g = g * t->shape[a] + ch->box_off[a] + idx[a];
  return g;
}

/* The tensor list against the case's. */
static int check_tensors(const ck_case *c, const ck_mesh *m, const mpg__ckpt_meta *md,
                         char *msg, size_t cap) {
  uint32_t want = 0;
  for (int k = 0; k < c->ntensors; k++) {
    if (m->skip[k] == 1) continue;
    want++;
    const ck_tensor *t = &c->t[k];
    int i = mpg__ckpt_meta_find(md, t->name);
    if (i < 0) return fail(msg, cap, "tensor %s is not in the metadata", t->name);
    const mpg__ckpt_tensor *mt = &md->tensors[i];
    int dt = t->bytes ? MPG__CKPT_DT_U8 : (int)t->dtype;
    if (mt->dtype != dt || mt->kind != (int)t->kind || mt->ndim != t->ndim)
      return fail(msg, cap, "tensor %s: dtype %d kind %d ndim %d, expected %d %d %d", t->name,
                  mt->dtype, mt->kind, mt->ndim, dt, (int)t->kind, t->ndim);
    for (int a = 0; a < t->ndim; a++)
      if (mt->shape[a] != t->shape[a])
        return fail(msg, cap, "tensor %s: axis %d is %llu, expected %zu", t->name, a,
                    (unsigned long long)mt->shape[a], t->shape[a]);
  }
  if (md->ntensors != want)
    return fail(msg, cap, "%u tensors in the metadata, expected %u", md->ntensors, want);
  return 0;
}

/* Chunk `ci` of case tensor k: its blocks' hashes and its values; marks
 * its elements in cover (each once). */
static int check_chunk(int k, const mpg__ckpt_meta *md, uint32_t ci,
                       const char *dir, int version, unsigned char *cover, char *msg,
                       size_t cap) {
  const mpg__ckpt_chunk *ch = &md->chunks[ci];
  const mpg__ckpt_tensor *mt = &md->tensors[ch->tensor];
  size_t es = mpg__ckpt_dtype_size(mt->dtype);
  uint64_t bytes = ch->range_count * es;
  char path[4200];
  mpg__ckpt_data_path(dir, md->files[ch->file].rank, path, sizeof path);
  unsigned char *buf = malloc(bytes ? bytes : 1);
  int fd = open(path, O_RDONLY);
  ssize_t got = fd >= 0 ? pread(fd, buf, bytes, (off_t)ch->file_off) : -1;
  if (fd >= 0) close(fd);
  int rc = 0;
  if (!buf || got != (ssize_t)bytes)
    rc = fail(msg, cap, "%s: chunk %u of %s: read %zd of %llu bytes at %llu", path, ci,
              mt->name, got, (unsigned long long)bytes, (unsigned long long)ch->file_off);
  for (uint64_t b = 0; !rc && b < mpg__ckpt_nblocks(bytes, md->block_bytes); b++) {
    uint64_t lo = b * md->block_bytes, n = bytes - lo < md->block_bytes ? bytes - lo
                                                                        : md->block_bytes;
    if (mpg__xxh64(buf + lo, n, 0) != md->hashes[ch->first_hash + b])
      rc = fail(msg, cap, "%s: chunk %u of %s: block %llu's hash differs", path, ci, mt->name,
                (unsigned long long)b);
  }
  for (uint64_t r = 0; !rc && r < ch->range_count; r++) {
    uint64_t g = chunk_global(mt, ch, ch->range_off + r), want = ck_bits(k, g, version);
    if (cover[g]++)
      rc = fail(msg, cap, "tensor %s element %llu is stored twice (again in chunk %u)",
                mt->name, (unsigned long long)g, ci);
    else if (memcmp(buf + r * es, &want, es))
      rc = fail(msg, cap, "%s: tensor %s element %llu: stored bits differ from version %d",
                path, mt->name, (unsigned long long)g, version);
  }
  free(buf);
  return rc;
}

/* Dedup: every tensor's elements once; bytes add up. */
static int check_chunks(const ck_case *c, const ck_mesh *m, const mpg__ckpt_meta *md,
                        const char *dir, int version, char *msg, size_t cap) {
  uint64_t chunk_bytes = 0, want_bytes = 0, file_bytes = 0;
  for (uint32_t f = 0; f < md->nfiles; f++) file_bytes += md->files[f].bytes;
  for (int k = 0; k < c->ntensors; k++) {
    if (m->skip[k]) continue; /* partly saved ones: not checked */
    const ck_tensor *t = &c->t[k];
    const mpg__ckpt_tensor *mt = &md->tensors[mpg__ckpt_meta_find(md, t->name)];
    uint64_t n = 1;
    for (int a = 0; a < t->ndim; a++) n *= t->shape[a];
    want_bytes += n * ck_esize(t);
    unsigned char *cover = calloc(n, 1);
    if (!cover) return fail(msg, cap, "out of memory");
    int rc = 0;
    for (uint32_t ci = mt->first_chunk; !rc && ci < mt->first_chunk + mt->nchunks; ci++) {
      chunk_bytes += md->chunks[ci].range_count * ck_esize(t);
      rc = check_chunk(k, md, ci, dir, version, cover, msg, cap);
    }
    for (uint64_t g = 0; !rc && g < n; g++)
      if (!cover[g])
        rc = fail(msg, cap, "tensor %s element %llu is in no chunk", t->name,
                  (unsigned long long)g);
    free(cover);
    if (rc) return rc;
  }
  if (chunk_bytes != want_bytes || file_bytes != want_bytes)
    return fail(msg, cap, "chunks hold %llu bytes, the data files %llu, the tensors %llu",
                (unsigned long long)chunk_bytes, (unsigned long long)file_bytes,
                (unsigned long long)want_bytes);
  return 0;
}

/* The directory: meta.mpgc and the listed data files (of those sizes). */
static int check_entries(const mpg__ckpt_meta *md, const char *dir, int flags, char *msg,
                         size_t cap) {
  char list[8192], path[4200];
  int n = ckf_list(dir, list, sizeof list);
  if (n != (int)md->nfiles + 1)
    return fail(msg, cap, "%s holds %d entries (%s), expected meta.mpgc and %u data files",
                dir, n, list, md->nfiles);
  for (uint32_t f = 0; f < md->nfiles; f++) {
    struct stat st;
    mpg__ckpt_data_path(dir, md->files[f].rank, path, sizeof path);
    if (stat(path, &st) != 0 || (uint64_t)st.st_size != md->files[f].bytes)
      return fail(msg, cap, "%s: missing or not %llu bytes (entries: %s)", path,
                  (unsigned long long)md->files[f].bytes, list);
  }
  snprintf(path, sizeof path, "%s.partial", dir);
  if (!(flags & CKF_ALLOW_PARTIAL) && ckf_exists(path))
    return fail(msg, cap, "%s is left after the save", path);
  return 0;
}

int ckf_meta_check(const ck_case *c, int which, const char *dir, long step, int version,
                   int flags, int *nfiles, uint64_t *max_file, char *msg, size_t cap) {
  const ck_mesh *m = &c->mesh[which];
  mpg__ckpt_meta md;
  memset(&md, 0, sizeof md);
  int rc = 0;
  mpg_status st = mpg__ckpt_meta_read(dir, &md);
  if (st != MPG_OK)
    rc = fail(msg, cap, "mpg__ckpt_meta_read(%s): %s: %s", dir, mpg_status_name(st),
              mpg_last_error());
  else if (md.step != step || md.world != (uint32_t)m->world)
    rc = fail(msg, cap, "%s: step %lld world %u, expected %ld and %d", dir,
              (long long)md.step, md.world, step, m->world);
  if (!rc) rc = check_tensors(c, m, &md, msg, cap);
  if (!rc) rc = check_chunks(c, m, &md, dir, version, msg, cap);
  if (!rc) rc = check_entries(&md, dir, flags, msg, cap);
  if (nfiles) *nfiles = (int)md.nfiles;
  if (max_file) {
    *max_file = 0;
    for (uint32_t f = 0; f < md.nfiles; f++)
      if (md.files[f].bytes > *max_file) *max_file = md.files[f].bytes;
  }
  mpg__ckpt_meta_free(&md);
  return rc;
}

int ckf_flip(const char *path, uint64_t off) {
  int fd = open(path, O_RDWR);
  unsigned char b = 0;
  int ok = fd >= 0 && pread(fd, &b, 1, (off_t)off) == 1;
  b ^= 0xff;
  ok = ok && pwrite(fd, &b, 1, (off_t)off) == 1;
  if (fd >= 0) close(fd);
  return ok ? 0 : -1;
}

int ckf_patch_version(const char *dir, uint32_t version) {
  char path[4200];
  snprintf(path, sizeof path, "%s/%s", dir, MPG__CKPT_META);
  FILE *f = fopen(path, "r+b");
  if (!f) return -1;
  unsigned char buf[1 << 16];
  size_t n = fread(buf, 1, sizeof buf, f);
  int rc = -1;
  if (n > 24 && n < sizeof buf) {
    for (int i = 0; i < 4; i++) buf[8 + i] = (unsigned char)(version >> (8 * i));
    uint64_t h = mpg__xxh64(buf, n - 8, 0);
    for (int i = 0; i < 8; i++) buf[n - 8 + i] = (unsigned char)(h >> (8 * i));
    rewind(f);
    rc = fwrite(buf, 1, n, f) == n ? 0 : -1;
  }
  fclose(f);
  return rc;
}

int ckf_chunk_of(const char *dir, const char *name, char *path, size_t cap, uint64_t *off,
                 uint64_t *bytes) {
  mpg__ckpt_meta md;
  memset(&md, 0, sizeof md);
  int rc = -1;
  if (mpg__ckpt_meta_read(dir, &md) == MPG_OK) {
    int i = mpg__ckpt_meta_find(&md, name);
    if (i >= 0 && md.tensors[i].nchunks > 0) {
      const mpg__ckpt_chunk *ch = &md.chunks[md.tensors[i].first_chunk];
      mpg__ckpt_data_path(dir, md.files[ch->file].rank, path, cap);
      *off = ch->file_off;
      *bytes = ch->range_count * mpg__ckpt_dtype_size(md.tensors[i].dtype);
      rc = 0;
    }
  }
  mpg__ckpt_meta_free(&md);
  return rc;
}

int ckf_in_private_tmpfs(const char *mnt, const char *opts,
                         int (*fn)(const char *mnt, char *msg, size_t cap), char *msg,
                         size_t cap) {
  int fds[2];
  if (pipe(fds) != 0) return snprintf(msg, cap, "pipe: %s", strerror(errno)), -1;
  pid_t pid = fork();
  if (pid == 0) {
    static char text[4096];
    close(fds[0]);
    int rc = 77;
    if (unshare(CLONE_NEWNS) != 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0 ||
        mount("tmpfs", mnt, "tmpfs", 0, opts) != 0)
      snprintf(text, sizeof text, "mount tmpfs (%s) on %.3000s: %s", opts, mnt, strerror(errno));
    else
      rc = fn(mnt, text, sizeof text);
    if (write(fds[1], text, strlen(text)) < 0) rc = 3;
    _exit(rc);
  }
  close(fds[1]);
  if (pid < 0) {
    close(fds[0]);
    return snprintf(msg, cap, "fork: %s", strerror(errno)), -1;
  }
  ssize_t n = read(fds[0], msg, cap - 1);
  msg[n > 0 ? n : 0] = '\0';
  close(fds[0]);
  int st;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}
