/* The flight recorder's dump reader (tools/trace_read.h): docs/trace.md,
 * "The dump format (version 1)".  Strict: every line, field and bound is
 * checked, and an error names the line number, the field and the value
 * (printed escaped, at most 40 bytes).  The input need not be
 * NUL-terminated: every scan is bounded by its length. */
#define _POSIX_C_SOURCE 200809L
#include "trace_read.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_FIELDS 17 /* an op line: the keyword and 16 fields */

typedef struct tok {
  const char *p;
  size_t n;
} tok;

typedef struct pstate {
  int line;
  const char *kw; /* the line's keyword, for messages */
  char *err;
  size_t errlen;
} pstate;

/* A token for a message: printable ASCII as it is, anything else \xHH,
 * cut at 40 bytes. */
static void show(tok t, char *out, size_t cap) {
  size_t o = 0;
  for (size_t i = 0; i < t.n && o + 5 < cap; i++) {
    unsigned char c = (unsigned char)t.p[i];
    if (i == 40) {
      o += (size_t)snprintf(out + o, cap - o, "...");
      break;
    }
    if (c > 0x20 && c < 0x7f && c != '\'' && c != '\\')
      out[o++] = (char)c;
    else
      o += (size_t)snprintf(out + o, cap - o, "\\x%02X", c);
  }
  out[o < cap ? o : cap - 1] = '\0';
}

static int fail(pstate *ps, const char *fmt, ...) {
  char msg[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (ps->err && ps->errlen)
    snprintf(ps->err, ps->errlen, "line %d: %s%s%s", ps->line, ps->kw ? ps->kw : "",
             ps->kw ? ": " : "", msg);
  return -1;
}

/* "field F: value 'V' <why>" */
static int bad(pstate *ps, const char *field, tok t, const char *why) {
  char v[256];
  show(t, v, sizeof v);
  return fail(ps, "field %s: value '%s' %s", field, v, why);
}

/* Decimal integer in [lo, hi]: an optional '-', then 1 to 19 digits. */
static int get_int(pstate *ps, tok t, const char *field, int64_t lo, int64_t hi, int64_t *out) {
  size_t i = 0;
  int neg = 0;
  if (t.n > 0 && t.p[0] == '-') neg = 1, i = 1;
  if (i == t.n || t.n - i > 19) return bad(ps, field, t, "is not a decimal integer");
  uint64_t v = 0;
  for (; i < t.n; i++) {
    if (t.p[i] < '0' || t.p[i] > '9') return bad(ps, field, t, "is not a decimal integer");
    v = v * 10 + (uint64_t)(t.p[i] - '0');
  }
  if (v > (uint64_t)INT64_MAX) return bad(ps, field, t, "is out of range");
  int64_t s = neg ? -(int64_t)v : (int64_t)v;
  if (s < lo || s > hi) {
    char why[96];
    snprintf(why, sizeof why, "is out of range [%" PRId64 ", %" PRId64 "]", lo, hi);
    return bad(ps, field, t, why);
  }
  *out = s;
  return 0;
}

/* Unsigned decimal, 1 to 20 digits, up to UINT64_MAX. */
static int get_u64(pstate *ps, tok t, const char *field, uint64_t *out) {
  if (t.n == 0 || t.n > 20) return bad(ps, field, t, "is not an unsigned decimal integer");
  uint64_t v = 0;
  for (size_t i = 0; i < t.n; i++) {
    if (t.p[i] < '0' || t.p[i] > '9') return bad(ps, field, t, "is not an unsigned decimal integer");
    unsigned d = (unsigned)(t.p[i] - '0');
    if (v > (UINT64_MAX - d) / 10) return bad(ps, field, t, "is out of range");
    v = v * 10 + d;
  }
  *out = v;
  return 0;
}

static int hexval(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/* Percent-decode a string field into out[0..cap) (NUL-terminated; "-" is
 * ""; no NUL byte inside).  Returns the decoded length or -1. */
static long get_str_n(pstate *ps, tok t, const char *field, char *out, size_t cap) {
  if (t.n == 1 && t.p[0] == '-') {
    out[0] = '\0';
    return 0;
  }
  size_t o = 0;
  for (size_t i = 0; i < t.n; i++) {
    unsigned char c = (unsigned char)t.p[i];
    if (c == '%') {
      int hi = i + 2 < t.n ? hexval(t.p[i + 1]) : -1, lo = hi >= 0 ? hexval(t.p[i + 2]) : -1;
      if (lo < 0) return bad(ps, field, t, "has a bad percent escape (expected %XX, upper-case hex)");
      c = (unsigned char)(hi * 16 + lo);
      if (c == 0) return bad(ps, field, t, "encodes a NUL byte (%00)");
      i += 2;
    } else if (c <= 0x20 || c >= 0x7f) {
      return bad(ps, field, t, "has a byte that must be percent-encoded");
    }
    if (o + 1 >= cap) {
      char why[64];
      snprintf(why, sizeof why, "is longer than %zu bytes", cap - 1);
      return bad(ps, field, t, why);
    }
    out[o++] = (char)c;
  }
  out[o] = '\0';
  return (long)o;
}

static int get_str(pstate *ps, tok t, const char *field, char *out, size_t cap, int nonempty) {
  long n = get_str_n(ps, t, field, out, cap);
  if (n < 0) return -1;
  if (nonempty && n == 0) return bad(ps, field, t, "is empty");
  return 0;
}

static int one_of(const char *s, const char *const *set) {
  for (; *set; set++)
    if (!strcmp(s, *set)) return 1;
  return 0;
}

static const char *const kinds[] = {"all_reduce", "broadcast", "all_gather", "reduce_scatter",
                                    "barrier", "send", "recv", "all_to_all", "all_to_all_v", NULL};
static const char *const dtypes[] = {"f32", "f64", "f16", "bf16", "i32", "i64", NULL};

/* A status: "ok", "pending", "request" or "end" (reason lines only) or MPG_<NAME>. */
static int get_status(pstate *ps, tok t, const char *field, char *out, size_t cap, int request) {
  if (get_str(ps, t, field, out, cap, 1)) return -1;
  if (request ? !strcmp(out, "request") || !strcmp(out, "end")
              : (!strcmp(out, "ok") || !strcmp(out, "pending")))
    return 0;
  if (strncmp(out, "MPG_", 4) || !out[4]) {
    return bad(ps, field, t,
               request ? "is not a status name (MPG_...) nor 'request' nor 'end'"
                       : "is not 'ok', 'pending' nor a status name (MPG_...)");
  }
  for (const char *c = out + 4; *c; c++)
    if (!((*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') || *c == '_'))
      return bad(ps, field, t, "is not a status name (MPG_[A-Z0-9_]+)");
  return 0;
}

/* The rank's string table: each distinct string once, in blocks that
 * never move (the ops point into them), found again by an open-addressing
 * hash (FNV-1a) while the dump is parsed. */
typedef struct tr_block {
  struct tr_block *next;
  size_t used, cap;
  char data[];
} tr_block;

struct tr_strings {
  tr_block *blocks;
  const char **slot; /* nslot (a power of 2) entries, NULL: free */
  size_t nslot, n;
};

static void strings_free(struct tr_strings *t) {
  if (!t) return;
  for (tr_block *b = t->blocks, *nx; b; b = nx) {
    nx = b->next;
    free(b);
  }
  free(t->slot);
  free(t);
}

static uint64_t str_hash(const char *s) {
  uint64_t h = 1469598103934665603ull;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

/* s (NUL-terminated) in r's table: its copy there, "" for "", or NULL when
 * out of memory. */
static const char *intern(tr_rank *r, const char *s) {
  if (!s[0]) return "";
  struct tr_strings *t = r->strings;
  if (!t && !(t = r->strings = calloc(1, sizeof *t))) return NULL;
  if (2 * (t->n + 1) > t->nslot) {
    size_t ns = t->nslot ? 2 * t->nslot : 64;
    const char **sl = calloc(ns, sizeof *sl);
    if (!sl) return NULL;
    for (size_t k = 0; k < t->nslot; k++) {
      if (!t->slot[k]) continue;
      size_t h = (size_t)str_hash(t->slot[k]) & (ns - 1);
      while (sl[h]) h = (h + 1) & (ns - 1);
      sl[h] = t->slot[k];
    }
    free(t->slot);
    t->slot = sl;
    t->nslot = ns;
  }
  size_t h = (size_t)str_hash(s) & (t->nslot - 1);
  for (; t->slot[h]; h = (h + 1) & (t->nslot - 1))
    if (!strcmp(t->slot[h], s)) return t->slot[h];
  size_t len = strlen(s) + 1;
  tr_block *b = t->blocks;
  if (!b || b->cap - b->used < len) {
    size_t cap = len > 16384 ? len : 16384;
    if (!(b = malloc(sizeof *b + cap))) return NULL;
    b->used = 0;
    b->cap = cap;
    b->next = t->blocks;
    t->blocks = b;
  }
  char *c = memcpy(b->data + b->used, s, len);
  b->used += len;
  t->n++;
  return t->slot[h] = c;
}

static int cmp_int(const void *a, const void *b) {
  int x = *(const int *)a, y = *(const int *)b;
  return (x > y) - (x < y);
}

/* "r0,r1,...": exactly size world ranks in [0, world), distinct, with
 * this rank at position. */
static int get_ranks(pstate *ps, tok t, tr_group *g, int world, int self) {
  size_t commas = 0;
  for (size_t i = 0; i < t.n; i++) commas += t.p[i] == ',';
  if (commas + 1 != (size_t)g->size) {
    char why[96];
    snprintf(why, sizeof why, "lists %zu ranks, SIZE is %d", commas + 1, g->size);
    return bad(ps, "RANKS", t, why);
  }
  g->ranks = malloc(sizeof(int) * (size_t)g->size);
  int *sorted = malloc(sizeof(int) * (size_t)g->size);
  if (!g->ranks || !sorted) {
    free(sorted);
    return fail(ps, "out of memory");
  }
  size_t a = 0;
  for (int k = 0; k < g->size; k++) {
    size_t b = a;
    while (b < t.n && t.p[b] != ',') b++;
    tok r = {t.p + a, b - a};
    int64_t v;
    if (get_int(ps, r, "RANKS", 0, world - 1, &v)) {
      free(sorted);
      return -1;
    }
    g->ranks[k] = sorted[k] = (int)v;
    a = b + 1;
  }
  qsort(sorted, (size_t)g->size, sizeof(int), cmp_int);
  int dup = 0;
  for (int k = 1; k < g->size; k++) dup |= sorted[k] == sorted[k - 1];
  g->sorted = sorted;
  if (dup) return bad(ps, "RANKS", t, "lists a rank twice");
  if (g->ranks[g->position] != self) {
    char why[96];
    snprintf(why, sizeof why, "has rank %d at POSITION %d, not this rank %d",
             g->ranks[g->position], g->position, self);
    return bad(ps, "RANKS", t, why);
  }
  return 0;
}

static int parse_group(pstate *ps, const tok *f, tr_rank *r) {
  int64_t v;
  if (get_int(ps, f[1], "GID", r->ngroups, r->ngroups, &v)) return -1;
  if (r->ngroups >= MPG__TRACE_MAX_GROUPS)
    return fail(ps, "more than %d group lines", MPG__TRACE_MAX_GROUPS);
  if (r->ngroups % 16 == 0) {
    tr_group *g = realloc(r->groups, sizeof(tr_group) * (size_t)(r->ngroups + 16));
    if (!g) return fail(ps, "out of memory");
    r->groups = g;
  }
  tr_group *g = &r->groups[r->ngroups];
  memset(g, 0, sizeof *g);
  r->ngroups++;
  if (get_str(ps, f[2], "NAME", g->name, sizeof g->name, 1)) return -1;
  if (get_int(ps, f[3], "INDEX", 0, INT32_MAX, &v)) return -1;
  g->index = (int)v;
  if (get_int(ps, f[5], "SIZE", 1, r->world, &v)) return -1;
  g->size = (int)v;
  if (get_int(ps, f[4], "POSITION", 0, g->size - 1, &v)) return -1;
  g->position = (int)v;
  return get_ranks(ps, f[6], g, r->world, r->rank);
}

static int parse_op(pstate *ps, const tok *f, tr_rank *r, uint64_t *next_seq) {
  if (r->nops >= 64 && (r->nops & (r->nops - 1)) == 0) {
    /* doubling (a ring of 2^24 ops is not 2^18 copies of a growing array) */
    tr_op *o = realloc(r->ops, sizeof(tr_op) * (size_t)r->nops * 2);
    if (!o) return fail(ps, "out of memory");
    r->ops = o;
  } else if (r->nops == 0) {
    tr_op *o = malloc(sizeof(tr_op) * 64);
    if (!o) return fail(ps, "out of memory");
    r->ops = o;
  }
  tr_op *o = &r->ops[r->nops];
  memset(o, 0, sizeof *o);
  int64_t v;
  if (get_u64(ps, f[1], "SEQ", &o->seq)) return -1;
  if (o->seq < *next_seq) return bad(ps, "SEQ", f[1], "is not above the previous op's");
  if (o->seq >= r->total) return bad(ps, "SEQ", f[1], "is not below the ring's TOTAL");
  *next_seq = o->seq + 1;
  if (r->ngroups == 0) return bad(ps, "GID", f[2], "names a group, but the file has none");
  if (get_int(ps, f[2], "GID", 0, r->ngroups - 1, &v)) return -1;
  o->group = (int)v;
  if (get_u64(ps, f[3], "GSEQ", &o->gseq)) return -1;
  if (o->gseq == 0) return bad(ps, "GSEQ", f[3], "is 0 (numbers start at 1)");
  if (get_str(ps, f[4], "KIND", o->kind, sizeof o->kind, 1)) return -1;
  if (!one_of(o->kind, kinds)) return bad(ps, "KIND", f[4], "is not an operation kind");
  if (get_str(ps, f[5], "DTYPE", o->dtype, sizeof o->dtype, 0)) return -1;
  if (o->dtype[0] && !one_of(o->dtype, dtypes)) return bad(ps, "DTYPE", f[5], "is not a dtype");
  if (get_u64(ps, f[6], "COUNT", &o->count)) return -1;
  int p2p = !strcmp(o->kind, "send") || !strcmp(o->kind, "recv");
  int peered = p2p || !strcmp(o->kind, "broadcast");
  if (get_int(ps, f[7], "PEER", peered ? 0 : -1, peered ? r->world - 1 : -1, &v)) return -1;
  o->peer = (int)v;
  if (peered) {
    const tr_group *g = &r->groups[o->group];
    int peer = o->peer;
    if (!bsearch(&peer, g->sorted, (size_t)g->size, sizeof(int), cmp_int))
      return bad(ps, "PEER", f[7], "is not a member of the op's group");
  }
  if (get_int(ps, f[8], "STEP", -1, INT64_MAX, &v)) return -1;
  o->step = (long)v;
  if (get_int(ps, f[9], "BUCKET", -1, INT32_MAX, &v)) return -1;
  o->bucket = (int)v;
  if (get_int(ps, f[10], "ISSUE_NS", 0, INT64_MAX, &o->issue_ns)) return -1;
  if (get_int(ps, f[11], "START_NS", 0, INT64_MAX, &o->start_ns)) return -1;
  if (get_int(ps, f[12], "END_NS", 0, INT64_MAX, &o->end_ns)) return -1;
  char st[TR_STATUS], first[TR_NAME], last[TR_NAME];
  if (get_status(ps, f[13], "STATUS", st, sizeof st, 0)) return -1;
  if (!strcmp(st, "pending") && o->end_ns != 0)
    return bad(ps, "END_NS", f[12], "is set on a pending op (must be 0)");
  if (!strcmp(st, "ok") && o->end_ns == 0)
    return bad(ps, "END_NS", f[12], "is 0 on an op with STATUS ok");
  if (get_str(ps, f[14], "FIRST", first, sizeof first, 0)) return -1;
  if (get_str(ps, f[15], "LAST", last, sizeof last, 0)) return -1;
  if (!(o->status = intern(r, st)) || !(o->first = intern(r, first)) ||
      !(o->last = intern(r, last)))
    return fail(ps, "out of memory");
  r->nops++;
  if (r->nops > r->capacity) return fail(ps, "more op lines than the ring's CAPACITY %ld", r->capacity);
  return 0;
}

/* The header lines, in this order, with their field counts. */
static const char *const header[] = {"meshpg-trace", "rank", "process", "backend", "mesh",
                                     "job", "clock", "reason", "ring"};
static const int header_fields[] = {1, 2, 2, 1, 1, 1, 1, 2, 2};
#define NHEADER 9

static int parse_header(pstate *ps, int h, const tok *f, tr_rank *r) {
  int64_t v;
  switch (h) {
  case 0:
    if (get_int(ps, f[1], "version", 1, INT32_MAX, &v)) return -1;
    if (v > MPG__TRACE_VERSION) return bad(ps, "version", f[1], "is newer than this reader's (1)");
    return 0;
  case 1:
    if (get_int(ps, f[2], "WORLD", 1, MPG__TRACE_MAX_WORLD, &v)) return -1;
    r->world = (int)v;
    if (get_int(ps, f[1], "R", 0, r->world - 1, &v)) return -1;
    r->rank = (int)v;
    return 0;
  case 2:
    if (get_str(ps, f[1], "HOST", r->host, sizeof r->host, 0)) return -1;
    if (get_int(ps, f[2], "PID", 0, INT32_MAX, &v)) return -1;
    r->pid = (long)v;
    return 0;
  case 3:
    return get_str(ps, f[1], "NAME", r->backend, sizeof r->backend, 1);
  case 4:
    return get_str(ps, f[1], "MESH", r->mesh, sizeof r->mesh, 0);
  case 5:
    if (f[1].n != 16) return bad(ps, "JOB", f[1], "is not 16 hex digits");
    for (size_t i = 0; i < 16; i++) {
      char c = f[1].p[i];
      if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')))
        return bad(ps, "JOB", f[1], "is not 16 hex digits");
    }
    memcpy(r->job, f[1].p, 16);
    r->job[16] = '\0';
    return 0;
  case 6:
    return get_int(ps, f[1], "DUMP_NS", 0, INT64_MAX, &r->dump_ns);
  case 7:
    if (get_status(ps, f[1], "STATUS", r->reason, sizeof r->reason, 1)) return -1;
    r->message = malloc(MPG__TRACE_MESSAGE_MAX + 1);
    if (!r->message) return fail(ps, "out of memory");
    return get_str(ps, f[2], "MESSAGE", r->message, MPG__TRACE_MESSAGE_MAX + 1, 0);
  default:
    if (get_int(ps, f[1], "CAPACITY", 0, MPG__TRACE_MAX_ENTRIES, &v)) return -1;
    r->capacity = (long)v;
    return get_u64(ps, f[2], "TOTAL", &r->total);
  }
}

int tr_parse(const char *buf, size_t len, tr_rank *out, char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  pstate ps = {0, NULL, err, errlen};
  if (err && errlen) err[0] = '\0';
  int h = 0, seen_op = 0, done = 0;
  uint64_t next_seq = 0;
  size_t pos = 0;
  while (pos < len) {
    ps.line++;
    ps.kw = NULL;
    const char *nl = memchr(buf + pos, '\n', len - pos);
    if (!nl) return fail(&ps, "no newline at the end of the file (truncated)");
    tok line = {buf + pos, (size_t)(nl - (buf + pos))};
    pos = (size_t)(nl - buf) + 1;
    if (done) return fail(&ps, "a line after 'end'");
    if (line.n == 0) return fail(&ps, "an empty line");
    /* Split on single spaces. */
    tok f[MAX_FIELDS];
    int nf = 0;
    size_t a = 0;
    for (size_t i = 0; i <= line.n; i++) {
      if (i < line.n && line.p[i] != ' ') continue;
      if (nf == MAX_FIELDS) {
        nf++;
        break;
      }
      f[nf++] = (tok){line.p + a, i - a};
      a = i + 1;
    }
    if (nf > MAX_FIELDS) return fail(&ps, "more than %d fields", MAX_FIELDS - 1);
    char kw[24];
    show(f[0], kw, sizeof kw);
    for (size_t i = 0; i < f[0].n && h == NHEADER; i++) {
      char c = f[0].p[i];
      if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-'))
        return fail(&ps, "keyword '%s' is not [a-z0-9_-]+", kw);
    }
    if (f[0].n == 0 && h == NHEADER) return fail(&ps, "the line starts with a space");
    int known = h < NHEADER || (f[0].n == 5 && !memcmp(f[0].p, "group", 5)) ||
                (f[0].n == 2 && !memcmp(f[0].p, "op", 2)) ||
                (f[0].n == 3 && !memcmp(f[0].p, "end", 3));
    if (!known) continue; /* a later version's record */
    for (int k = 1; k < nf; k++)
      if (f[k].n == 0) return fail(&ps, "field %d is empty (two spaces, or one at an end)", k);
    int want;
    if (h < NHEADER) {
      if (f[0].n != strlen(header[h]) || memcmp(f[0].p, header[h], f[0].n)) {
        if (h == 0) return fail(&ps, "not a meshpg trace (expected 'meshpg-trace 1', got '%s')", kw);
        return fail(&ps, "expected the '%s' line, got '%s'", header[h], kw);
      }
      want = header_fields[h] + 1;
    } else {
      want = kw[0] == 'g' ? 7 : kw[0] == 'o' ? 16 : 2;
    }
    ps.kw = kw;
    if (nf != want) return fail(&ps, "%d fields, expected %d", nf - 1, want - 1);
    if (h < NHEADER) {
      if (parse_header(&ps, h, f, out)) return -1;
      h++;
    } else if (kw[0] == 'g') {
      if (seen_op) return fail(&ps, "a group line after an op line");
      if (parse_group(&ps, f, out)) return -1;
    } else if (kw[0] == 'o') {
      seen_op = 1;
      if (parse_op(&ps, f, out, &next_seq)) return -1;
    } else {
      int64_t v;
      if (get_int(&ps, f[1], "NOPS", 0, INT32_MAX, &v)) return -1;
      if (v != out->nops) {
        char why[64];
        snprintf(why, sizeof why, "does not match the %d op lines", out->nops);
        return bad(&ps, "NOPS", f[1], why);
      }
      done = 1;
    }
  }
  ps.kw = NULL;
  ps.line++;
  if (h < NHEADER)
    return fail(&ps, "end of file before the '%s' line (truncated)", header[h]);
  if (!done) return fail(&ps, "end of file before the 'end' line (truncated)");
  return 0;
}

void tr_rank_free(tr_rank *r) {
  if (!r) return;
  for (int g = 0; g < r->ngroups; g++) {
    free(r->groups[g].ranks);
    free(r->groups[g].sorted);
  }
  free(r->groups);
  free(r->ops);
  free(r->message);
  strings_free(r->strings);
  memset(r, 0, sizeof *r);
}

int tr_read_file(const char *path, tr_rank *out, char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  /* O_NOFOLLOW: a symlink (to /dev/zero, to another file) is refused;
   * O_NONBLOCK: opening a FIFO does not wait for a writer.  fstat then
   * refuses anything but a regular file, before a byte is read. */
  int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    int e = errno;
    snprintf(err, errlen, "%s: %s", path,
             e == ELOOP ? "is a symbolic link, not a regular file (refused)" : strerror(e));
    return -1;
  }
  struct stat st;
  if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
    int e = errno;
    close(fd);
    snprintf(err, errlen, "%s: %s", path,
             S_ISFIFO(st.st_mode) ? "is a FIFO, not a regular file (refused)"
             : S_ISDIR(st.st_mode) ? "is a directory, not a regular file (refused)"
             : S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode)
                 ? "is a device, not a regular file (refused)"
                 : e ? strerror(e) : "is not a regular file (refused)");
    return -1;
  }
  /* The size it has now bounds what is read (a file that grows meanwhile
   * is read as it was, and found truncated). */
  size_t cap = (size_t)st.st_size, n = 0;
  if ((off_t)cap != st.st_size) {
    close(fd);
    snprintf(err, errlen, "%s: too large (%lld bytes)", path, (long long)st.st_size);
    return -1;
  }
  char *buf = malloc(cap ? cap : 1);
  int rerr = 0;
  while (buf && n < cap) {
    ssize_t k = read(fd, buf + n, cap - n);
    if (k > 0)
      n += (size_t)k;
    else if (k == 0)
      break;
    else if (errno != EINTR) {
      rerr = errno;
      break;
    }
  }
  close(fd);
  if (!buf || rerr) {
    snprintf(err, errlen, "%s: %s", path, buf ? strerror(rerr) : "out of memory");
    free(buf);
    return -1;
  }
  char msg[512];
  int rc = tr_parse(buf, n, out, msg, sizeof msg);
  free(buf);
  if (rc) snprintf(err, errlen, "%s: %s", path, msg);
  return rc;
}

void tr_ranks_free(tr_rank *ranks, int n) {
  if (!ranks) return;
  for (int i = 0; i < n; i++) tr_rank_free(&ranks[i]);
  free(ranks);
}

/* "rank-R.trace", R decimal: R, else -1. */
static long dump_rank(const char *name) {
  size_t n = strlen(name);
  if (n < 12 || strncmp(name, "rank-", 5) || strcmp(name + n - 6, ".trace")) return -1;
  long r = 0;
  for (size_t i = 5; i < n - 6; i++) {
    if (name[i] < '0' || name[i] > '9' || r > 100000000) return -1;
    r = r * 10 + (name[i] - '0');
  }
  return r;
}

static int cmp_rank(const void *a, const void *b) {
  const tr_rank *x = a, *y = b;
  return (x->rank > y->rank) - (x->rank < y->rank);
}

typedef struct job_of {
  const char *job;
  int i;
} job_of;

static int cmp_job(const void *a, const void *b) {
  return strcmp(((const job_of *)a)->job, ((const job_of *)b)->job);
}

/* Keep only the dumps of the newest job in rs[0..*cnt): the job whose
 * latest DUMP_NS is the latest.  The others are freed (their names moved
 * after the kept ones) and listed in *ignored (when not NULL).  0, or -1
 * when out of memory. */
static int keep_newest(tr_rank *rs, int *cnt, char **names, char **ignored) {
  int n = *cnt;
  job_of *idx = malloc(sizeof(job_of) * (size_t)n);
  if (!idx) return -1;
  for (int i = 0; i < n; i++) idx[i] = (job_of){rs[i].job, i};
  qsort(idx, (size_t)n, sizeof(job_of), cmp_job);
  int best = 0;
  int64_t best_ns = -1;
  for (int a = 0; a < n;) {
    int b = a;
    int64_t latest = -1;
    while (b < n && !strcmp(idx[b].job, idx[a].job)) {
      if (rs[idx[b].i].dump_ns > latest) latest = rs[idx[b].i].dump_ns;
      b++;
    }
    if (latest > best_ns) best_ns = latest, best = idx[a].i;
    a = b;
  }
  free(idx);
  char job[sizeof rs[0].job];
  memcpy(job, rs[best].job, sizeof job);
  size_t cap = 0, len = 0;
  char *text = NULL;
  int kept = 0, rc = 0;
  for (int i = 0; i < n; i++) {
    if (!strcmp(rs[i].job, job)) {
      if (kept != i) {
        rs[kept] = rs[i];
        char *t = names[kept];
        names[kept] = names[i];
        names[i] = t;
      }
      kept++;
      continue;
    }
    if (ignored && !rc) {
      const char *base = strrchr(names[i], '/');
      base = base ? base + 1 : names[i];
      size_t need = strlen(base) + 128;
      if (len + need > cap) {
        char *t = realloc(text, cap = 2 * (len + need));
        if (!t) rc = -1;
        else text = t;
      }
      if (!rc)
        len += (size_t)snprintf(text + len, cap - len, "%s%s: job %s, dumped %.1f s before the "
                                "last dump of job %s", len ? "\n" : "", base, rs[i].job,
                                (double)(best_ns - rs[i].dump_ns) / 1e9, job);
    }
    tr_rank_free(&rs[i]);
  }
  *cnt = kept;
  if (!ignored) free(text);
  else if (rc) free(text);
  else *ignored = text;
  return rc;
}

int tr_read_dir_newest(const char *dir, tr_rank **ranks, int *n, char **ignored, char *err,
                       size_t errlen) {
  *ranks = NULL;
  *n = 0;
  if (ignored) *ignored = NULL;
  DIR *d = opendir(dir);
  if (!d) {
    snprintf(err, errlen, "%s: %s", dir, strerror(errno));
    return -1;
  }
  tr_rank *rs = NULL;
  int cnt = 0, rc = 0;
  char **names = NULL;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    long want = dump_rank(e->d_name);
    if (want < 0) continue;
    if (cnt == 0 || (cnt >= 16 && (cnt & (cnt - 1)) == 0)) { /* 16, then doubling */
      size_t cap = cnt ? 2 * (size_t)cnt : 16;
      tr_rank *g = realloc(rs, sizeof(tr_rank) * cap);
      char **nm = realloc(names, sizeof(char *) * cap);
      if (nm) names = nm;
      if (g) rs = g;
      if (!g || !nm) {
        snprintf(err, errlen, "%s: out of memory", dir);
        rc = -1;
        break;
      }
    }
    size_t plen = strlen(dir) + strlen(e->d_name) + 2;
    char *path = malloc(plen);
    if (!path) {
      snprintf(err, errlen, "%s: out of memory", dir);
      rc = -1;
      break;
    }
    snprintf(path, plen, "%s/%s", dir, e->d_name);
    names[cnt] = path;
    rc = tr_read_file(path, &rs[cnt], err, errlen);
    cnt++;
    if (rc) break;
    if (rs[cnt - 1].rank != want) {
      snprintf(err, errlen, "%s: holds the dump of rank %d, not of rank %ld", path,
               rs[cnt - 1].rank, want);
      rc = -1;
      break;
    }
    for (int i = 0; i < cnt - 1; i++) {
      if (rs[i].rank == want) {
        snprintf(err, errlen, "%s and %s: two dumps of rank %ld", names[i], path, want);
        rc = -1;
        break;
      }
    }
    if (rc) break;
  }
  closedir(d);
  if (!rc && cnt == 0) {
    snprintf(err, errlen, "%s: no rank-R.trace file", dir);
    rc = -1;
  }
  int nnames = cnt;
  if (!rc && keep_newest(rs, &cnt, names, ignored)) {
    snprintf(err, errlen, "%s: out of memory", dir);
    rc = -1;
  }
  for (int i = 0; i < nnames; i++) free(names[i]);
  free(names);
  if (rc) {
    tr_ranks_free(rs, cnt);
    if (ignored) {
      free(*ignored);
      *ignored = NULL;
    }
    return -1;
  }
  qsort(rs, (size_t)cnt, sizeof(tr_rank), cmp_rank);
  *ranks = rs;
  *n = cnt;
  return 0;
}

int tr_read_dir(const char *dir, tr_rank **ranks, int *n, char *err, size_t errlen) {
  return tr_read_dir_newest(dir, ranks, n, NULL, err, errlen);
}
