/* meshpg ckpt info / export on hostile or odd inputs (issue 45, items 5,
 * 6 and 10), run as the real program (MESHPG_CLI): an export is complete
 * or absent and never writes inside the checkpoint or through a symbolic
 * link; names that JSON cannot carry are escaped in the text, valid in the
 * JSON and refused by export; totals do not wrap; a FIFO or a huge sparse
 * meta.mpgc is refused at once. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../../../sync/ckpt_format.h"
#include "../../support/run_util.h"

static char root[64], dir[96], file[128];

static void setup(void) {
  snprintf(root, sizeof root, "/tmp/mpg_ckpt_guard_XXXXXX");
  cr_assert_not_null(mkdtemp(root));
  snprintf(dir, sizeof dir, "%s/ck", root);
  snprintf(file, sizeof file, "%s/out.safetensors", root);
}

static void teardown(void) {
  char cmd[256];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
  run(cmd, NULL);
}

static int ckpt(const char *args, double *seconds) {
  char cmd[4096];
  snprintf(cmd, sizeof cmd, "timeout 20 '%s' ckpt %s", env_program("MESHPG_CLI"), args);
  return run(cmd, seconds);
}

static void write_file(const char *path, const void *p, size_t n) {
  FILE *f = fopen(path, "wb");
  cr_assert_not_null(f, "%s: %s", path, strerror(errno));
  cr_assert_eq(fwrite(p, 1, n, f), n);
  fclose(f);
}

/* The whole file into a malloc'ed buffer (*n bytes); NULL when absent. */
static unsigned char *slurp(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  fseek(f, 0, SEEK_SET);
  unsigned char *b = malloc((size_t)len + 1);
  *n = fread(b, 1, (size_t)len, f);
  fclose(f);
  return b;
}

static int cmp_names(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* A checkpoint in `dir` of n one-axis tensors (dtype, `elems` elements
 * each, names sorted here), each one chunk in data-00000.bin with bytes
 * (i + k) & 0xff, 1 MiB checksum blocks.  elems 0: huge tensors of
 * 2^62 elements without chunks (info only). */
static void make_ckpt(const char *const *names_in, int n, int dtype, uint64_t elems) {
  mkdir(dir, 0755);
  const char *names[16];
  memcpy(names, names_in, (size_t)n * sizeof *names);
  qsort(names, (size_t)n, sizeof *names, cmp_names);
  size_t es = mpg__ckpt_dtype_size(dtype), bytes = elems * es;
  mpg__ckpt_meta m;
  memset(&m, 0, sizeof m);
  m.version = 1, m.save_id = 77, m.step = 5, m.world = 1, m.block_bytes = 1 << 20;
  m.mesh = strdup("dp=1 world=1");
  m.nfiles = 1;
  m.files = calloc(1, sizeof *m.files);
  m.files[0].bytes = elems ? (uint64_t)n * bytes : 0;
  m.ntensors = (uint32_t)n;
  m.tensors = calloc((size_t)n, sizeof *m.tensors);
  m.chunks = calloc((size_t)n, sizeof *m.chunks);
  uint64_t nb = elems ? mpg__ckpt_nblocks(bytes, m.block_bytes) : 0;
  m.hashes = calloc((size_t)(n * nb) + 1, sizeof *m.hashes);
  unsigned char *data = malloc(elems ? (size_t)n * bytes : 1);
  for (int k = 0; k < n; k++) {
    mpg__ckpt_tensor *t = &m.tensors[k];
    t->name = strdup(names[k]);
    t->dtype = dtype, t->kind = MPG_CKPT_PARAM, t->ndim = 1;
    t->shape[0] = elems ? elems : (uint64_t)1 << 62;
    t->first_chunk = m.nchunks;
    if (!elems) continue;
    t->nchunks = 1;
    mpg__ckpt_chunk *c = &m.chunks[m.nchunks++];
    c->tensor = (uint32_t)k, c->file = 0;
    c->box_shape[0] = elems, c->range_count = elems;
    c->file_off = (uint64_t)k * bytes;
    c->first_hash = m.nhashes;
    unsigned char *p = data + c->file_off;
    for (size_t i = 0; i < bytes; i++) p[i] = (unsigned char)(i + (size_t)k);
    for (uint64_t at = 0; at < bytes; at += m.block_bytes)
      m.hashes[m.nhashes++] =
          mpg__xxh64(p + at, bytes - at < m.block_bytes ? bytes - at : m.block_bytes, 0);
  }
  unsigned char *meta = NULL;
  size_t len = 0;
  cr_assert_eq(mpg__ckpt_meta_encode(&m, &meta, &len), MPG_OK, "%s", mpg_last_error());
  char path[256];
  mpg__ckpt_data_path(dir, 0, path, sizeof path);
  write_file(path, data, elems ? (size_t)n * bytes : 0);
  snprintf(path, sizeof path, "%s/meta.mpgc", dir);
  write_file(path, meta, len);
  free(meta);
  free(data);
  mpg__ckpt_meta_free(&m);
}

/* Entries of root other than ck and `keep` (temp files left behind). */
static int strays(const char *keep) {
  char cmd[256];
  snprintf(cmd, sizeof cmd, "ls -A '%s'", root);
  run(cmd, NULL);
  int n = 0;
  for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n"))
    n += strcmp(line, "ck") != 0 && (!keep || strcmp(line, keep) != 0);
  return n;
}

TestSuite(ckpt_export_guard, .init = setup, .fini = teardown, .timeout = 120);

/* ------------------------------------------------------------------ */
/* Item 5                                                               */
/* ------------------------------------------------------------------ */

/* A failed export leaves an existing FILE as it was (and no file of its
 * own); a symbolic link is not written through; a FILE inside the
 * checkpoint is refused with the checkpoint untouched; an export killed
 * at any moment leaves FILE as it was or complete. */
Test(ckpt_export_guard, export_complete_or_absent) {
  const char *names[] = {"w", "v"};
  make_ckpt(names, 2, MPG_F32, 1 << 16);
  char args[1024], path[256], meta[256], data[256];
  snprintf(meta, sizeof meta, "%s/meta.mpgc", dir);
  mpg__ckpt_data_path(dir, 0, data, sizeof data);
  snprintf(args, sizeof args, "export '%s' --safetensors '%s'", dir, file);
  cr_assert_eq(ckpt(args, NULL), 0, "%s", out);
  size_t good_n, n;
  unsigned char *good = slurp(file, &good_n), *now;
  cr_assert_not_null(good);
  /* a failed export: FILE stays */
  size_t dn;
  unsigned char *d = slurp(data, &dn);
  d[1000] ^= 0xff;
  write_file(data, d, dn);
  cr_assert_eq(ckpt(args, NULL), 1, "%s", out);
  cr_expect(strstr(out, "checksum mismatch"), "%s", out);
  now = slurp(file, &n);
  cr_expect(now && n == good_n && !memcmp(now, good, n), "the failed export changed %s", file);
  free(now);
  cr_expect_eq(strays("out.safetensors"), 0, "a failed export left a file: %s", out);
  d[1000] ^= 0xff;
  write_file(data, d, dn);
  free(d);
  /* a symbolic link: refused, its target untouched */
  char target[256], link[256];
  snprintf(target, sizeof target, "%s/target", root);
  snprintf(link, sizeof link, "%s/link.safetensors", root);
  write_file(target, "keep", 4);
  cr_assert_eq(symlink(target, link), 0);
  snprintf(args, sizeof args, "export '%s' --safetensors '%s'", dir, link);
  cr_expect_eq(ckpt(args, NULL), 1, "%s", out);
  cr_expect(strstr(out, "symbolic link"), "%s", out);
  now = slurp(target, &n);
  cr_expect(now && n == 4 && !memcmp(now, "keep", 4), "the link's target was written");
  free(now);
  struct stat sb;
  cr_expect(lstat(link, &sb) == 0 && S_ISLNK(sb.st_mode));
  /* inside the checkpoint: refused, the checkpoint untouched */
  size_t meta_n, data_n;
  unsigned char *meta0 = slurp(meta, &meta_n), *data0 = slurp(data, &data_n);
  const char *inside[] = {data, meta, "new.safetensors"};
  for (int i = 0; i < 3; i++) {
    if (i == 2) snprintf(path, sizeof path, "%s/%s", dir, inside[i]);
    else snprintf(path, sizeof path, "%s", inside[i]);
    snprintf(args, sizeof args, "export '%s' --safetensors '%s'", dir, path);
    cr_expect_eq(ckpt(args, NULL), 1, "%s: %s", path, out);
    cr_expect(strstr(out, "is inside the checkpoint"), "%s", out);
  }
  snprintf(path, sizeof path, "%s/../ck/./data-00000.bin", dir); /* another spelling */
  snprintf(args, sizeof args, "export '%s/' --safetensors '%s'", dir, path);
  cr_expect_eq(ckpt(args, NULL), 1, "%s", out);
  now = slurp(meta, &n);
  cr_expect(now && n == meta_n && !memcmp(now, meta0, n), "meta.mpgc changed");
  free(now);
  now = slurp(data, &n);
  cr_expect(now && n == data_n && !memcmp(now, data0, n), "data-00000.bin changed");
  free(now);
  snprintf(path, sizeof path, "%s/new.safetensors", dir);
  cr_expect_neq(access(path, F_OK), 0);
  snprintf(args, sizeof args, "info '%s'", dir);
  cr_expect_eq(ckpt(args, NULL), 0, "%s", out);
  free(meta0);
  free(data0);
  /* SIGKILL at random moments: FILE is the old one or the whole new one */
  const char *big[] = {"big"};
  make_ckpt(big, 1, MPG_F32, 1 << 23); /* 32 MiB */
  snprintf(args, sizeof args, "export '%s' --safetensors '%s.ref'", dir, file);
  double t = 0;
  cr_assert_eq(ckpt(args, &t), 0, "%s", out);
  char ref[160];
  snprintf(ref, sizeof ref, "%s.ref", file);
  size_t ref_n;
  unsigned char *refb = slurp(ref, &ref_n);
  unsigned seed = 5;
  int old_seen = 0, new_seen = 0;
  for (int it = 0; it < 8; it++) {
    write_file(file, good, good_n);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
      execl(env_program("MESHPG_CLI"), "meshpg", "ckpt", "export", dir, "--safetensors", file,
            (char *)NULL);
      _exit(127);
    }
    seed = seed * 1103515245u + 12345u; /* spread over 0 .. 1.5 t, jittered */
    usleep((useconds_t)(1e6 * t * 1.5 * (it + (seed >> 8) % 1000 / 1000.0) / 8));
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    now = slurp(file, &n);
    int is_old = now && n == good_n && !memcmp(now, good, n);
    int is_new = now && n == ref_n && !memcmp(now, refb, n);
    cr_expect(is_old || is_new, "kill %d: %s is %zu bytes, neither the old file nor the export",
              it, file, now ? n : 0);
    old_seen += is_old, new_seen += is_new;
    free(now);
  }
  fprintf(stderr, "export_complete_or_absent: export of 32 MiB in %.3f s; killed: %d old, %d "
          "complete\n", t, old_seen, new_seen);
  free(refb);
  free(good);
}

/* ------------------------------------------------------------------ */
/* Item 6                                                               */
/* ------------------------------------------------------------------ */

/* A strict JSON check (RFC 8259) of s: 1 when valid. */
static const char *jv_p;

static void jv_ws(void) {
  while (*jv_p == ' ' || *jv_p == '\n' || *jv_p == '\t' || *jv_p == '\r') jv_p++;
}

static int jv_string(void) {
  if (*jv_p++ != '"') return 0;
  while (*jv_p != '"') {
    unsigned char c = (unsigned char)*jv_p;
    if (c < 0x20) return 0;
    if (c == '\\') {
      jv_p++;
      if (*jv_p == 'u') {
        for (int i = 1; i <= 4; i++)
          if (!strchr("0123456789abcdefABCDEF", jv_p[i]) || !jv_p[i]) return 0;
        jv_p += 5;
      } else if (*jv_p && strchr("\"\\/bfnrt", *jv_p)) {
        jv_p++;
      } else {
        return 0;
      }
      continue;
    }
    size_t k = c < 0x80 ? 0 : (c & 0xE0) == 0xC0 ? 1 : (c & 0xF0) == 0xE0 ? 2
             : (c & 0xF8) == 0xF0 ? 3 : 9;
    if (k == 9 || (k == 1 && c < 0xC2)) return 0;
    for (size_t j = 1; j <= k; j++)
      if (((unsigned char)jv_p[j] & 0xC0) != 0x80) return 0;
    jv_p += k + 1;
  }
  jv_p++;
  return 1;
}

static int jv_value(void) {
  jv_ws();
  if (*jv_p == '"') return jv_string();
  if (*jv_p == '{' || *jv_p == '[') {
    char close = *jv_p == '{' ? '}' : ']', obj = *jv_p == '{';
    jv_p++;
    jv_ws();
    if (*jv_p == close) return jv_p++, 1;
    for (;;) {
      jv_ws();
      if (obj) {
        if (!jv_string()) return 0;
        jv_ws();
        if (*jv_p++ != ':') return 0;
      }
      if (!jv_value()) return 0;
      jv_ws();
      if (*jv_p == ',') {
        jv_p++;
        continue;
      }
      return *jv_p++ == close;
    }
  }
  if (*jv_p == '-' || (*jv_p >= '0' && *jv_p <= '9')) {
    jv_p++;
    while (*jv_p >= '0' && *jv_p <= '9') jv_p++;
    return 1;
  }
  return 0;
}

static int json_valid(const char *s) {
  jv_p = s;
  if (!jv_value()) return 0;
  jv_ws();
  return *jv_p == '\0';
}

/* Names saved by older versions (mpg_ckpt_add refuses them now): info
 * escapes them (no escape sequence reaches the terminal, no newline makes
 * a row), info --json stays valid UTF-8 JSON, export refuses what a
 * safetensors header cannot carry; totals of huge tensors do not wrap. */
Test(ckpt_export_guard, names_json_cannot_carry) {
  const char *names[] = {"a\nb", "\x1b[2Jx", "caf\xe9", "ok", "tab\there"};
  make_ckpt(names, 5, MPG_F32, 4);
  char args[1024];
  snprintf(args, sizeof args, "info '%s'", dir);
  cr_assert_eq(ckpt(args, NULL), 0, "%s", out);
  cr_expect(!strchr(out, '\x1b') && !strchr(out, '\xe9') && !strchr(out, '\t'),
            "a raw byte reached the terminal:\n%s", out);
  cr_expect(strstr(out, "  a\\nb ") && strstr(out, "  \\x1b[2Jx ") &&
                strstr(out, "  caf\\xe9 ") && strstr(out, "  tab\\there "),
            "%s", out);
  int rows = 0;
  for (const char *p = strstr(out, "\n  name "); p && (p = strchr(p + 1, '\n'));)
    rows += p[1] == ' ' && p[2] == ' ';
  cr_expect_eq(rows, 5, "5 tensors make %d rows:\n%s", rows, out);
  snprintf(args, sizeof args, "info '%s' --json", dir);
  cr_assert_eq(ckpt(args, NULL), 0, "%s", out);
  cr_expect(json_valid(out), "invalid JSON:\n%s", out);
  cr_expect(strstr(out, "\"a\\u000ab\"") && strstr(out, "\"caf\\u00e9\""), "%s", out);
  snprintf(args, sizeof args, "export '%s' --safetensors '%s'", dir, file);
  cr_expect_eq(ckpt(args, NULL), 1, "%s", out);
  cr_expect(strstr(out, "tensor caf\\xe9: a safetensors header cannot carry its name (it is "
                        "not UTF-8)"), "%s", out);
  cr_expect_neq(access(file, F_OK), 0);
  /* __metadata__ */
  teardown();
  setup();
  const char *meta_names[] = {"__metadata__", "ok"};
  make_ckpt(meta_names, 2, MPG_F32, 4);
  snprintf(args, sizeof args, "export '%s' --safetensors '%s'", dir, file);
  cr_expect_eq(ckpt(args, NULL), 1, "%s", out);
  cr_expect(strstr(out, "\"__metadata__\": a safetensors file cannot carry it"), "%s", out);
  cr_expect_neq(access(file, F_OK), 0);
  snprintf(args, sizeof args, "info '%s' --json", dir);
  cr_assert_eq(ckpt(args, NULL), 0, "%s", out);
  cr_expect(json_valid(out), "invalid JSON:\n%s", out);
  /* two tensors of 2^63 bytes: 2^64 in all, not 0 or 1 */
  teardown();
  setup();
  const char *huge[] = {"h1", "h2"};
  make_ckpt(huge, 2, MPG_F16, 0);
  snprintf(args, sizeof args, "info '%s'", dir);
  cr_assert_eq(ckpt(args, NULL), 0, "%s", out);
  cr_expect(strstr(out, "chunks, 18446744073709551616 bytes"), "%s", out);
  snprintf(args, sizeof args, "info '%s' --json", dir);
  cr_assert_eq(ckpt(args, NULL), 0, "%s", out);
  cr_expect(strstr(out, "\"bytes\": 18446744073709551616"), "%s", out);
  cr_expect(json_valid(out), "invalid JSON:\n%s", out);
}

/* ------------------------------------------------------------------ */
/* Item 10                                                              */
/* ------------------------------------------------------------------ */

Test(ckpt_export_guard, fifo_and_sparse_meta_refused_fast) {
  const char *names[] = {"w"};
  make_ckpt(names, 1, MPG_F32, 64);
  char args[1024], meta[256], data[256];
  snprintf(meta, sizeof meta, "%s/meta.mpgc", dir);
  mpg__ckpt_data_path(dir, 0, data, sizeof data);
  double t;
  /* a FIFO as the data file */
  cr_assert_eq(unlink(data), 0);
  cr_assert_eq(mkfifo(data, 0600), 0);
  snprintf(args, sizeof args, "export '%s' --safetensors '%s'", dir, file);
  cr_expect_eq(ckpt(args, &t), 1, "%s", out);
  cr_expect(strstr(out, "not a regular file (a FIFO)"), "%s", out);
  cr_expect_lt(t, 5.0);
  cr_expect_neq(access(file, F_OK), 0);
  /* a FIFO as meta.mpgc */
  cr_assert_eq(unlink(meta), 0);
  cr_assert_eq(mkfifo(meta, 0600), 0);
  for (int i = 0; i < 2; i++) {
    if (i) snprintf(args, sizeof args, "info '%s'", dir);
    cr_expect_eq(ckpt(args, &t), 1, "%s", out);
    cr_expect(strstr(out, "not a regular file (a FIFO)"), "%s", out);
    cr_expect_lt(t, 5.0);
  }
  /* a symbolic link as meta.mpgc: not followed */
  cr_assert_eq(unlink(meta), 0);
  cr_assert_eq(symlink("/etc/hostname", meta), 0);
  cr_expect_eq(ckpt(args, NULL), 1, "%s", out);
  cr_expect(strstr(out, "is a symbolic link (not followed)"), "%s", out);
  /* a 2 GiB sparse meta.mpgc without the magic */
  cr_assert_eq(unlink(meta), 0);
  int fd = open(meta, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  cr_assert_geq(fd, 0);
  cr_assert_eq(ftruncate(fd, (off_t)1 << 31), 0);
  close(fd);
  cr_expect_eq(ckpt(args, &t), 1, "%s", out);
  cr_expect(strstr(out, "no \"MPGCKPT\\n\" magic"), "%s", out);
  cr_expect_lt(t, 1.0, "a 2 GiB sparse meta.mpgc refused in %.3f s", t);
}
