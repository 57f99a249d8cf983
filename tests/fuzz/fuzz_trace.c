/* libFuzzer target: the flight recorder's dump reader (tools/trace_read.c,
 * tr_parse; docs/trace.md, "The dump format (version 1)").  A failure
 * leaves a message that starts "line N: " and a rank that frees clean.  A
 * success gives a dump that holds every rule of the format, that this
 * target encodes back (percent-encoding its strings) and reads again to the
 * same values, and that the SVG and Chrome writers (tools/trace_draw.c)
 * draw to /dev/null without a fault. */
#include "fuzz_common.h"

#include <inttypes.h>

#include "trace_draw.h"
#include "trace_read.h"

static void check_str(const char *s, size_t cap) {
  FUZZ_CHECK(memchr(s, '\0', cap) != NULL);
}

static void check_rules(const tr_rank *r) {
  FUZZ_CHECK(r->world >= 1 && r->rank >= 0 && r->rank < r->world);
  FUZZ_CHECK(strlen(r->job) == 16 && r->message != NULL);
  check_str(r->host, sizeof r->host);
  check_str(r->backend, sizeof r->backend);
  check_str(r->mesh, sizeof r->mesh);
  check_str(r->reason, sizeof r->reason);
  FUZZ_CHECK(r->backend[0] && r->reason[0]);
  FUZZ_CHECK(r->nops >= 0 && r->nops <= r->capacity && (uint64_t)r->nops <= r->total);
  for (int g = 0; g < r->ngroups; g++) {
    const tr_group *gr = &r->groups[g];
    check_str(gr->name, sizeof gr->name);
    FUZZ_CHECK(gr->name[0] && gr->size >= 1 && gr->size <= r->world);
    FUZZ_CHECK(gr->position >= 0 && gr->position < gr->size && gr->index >= 0);
    FUZZ_CHECK(gr->ranks[gr->position] == r->rank);
    for (int k = 0; k < gr->size; k++) {
      FUZZ_CHECK(gr->ranks[k] >= 0 && gr->ranks[k] < r->world);
      for (int j = 0; j < k; j++) FUZZ_CHECK(gr->ranks[j] != gr->ranks[k]);
    }
  }
  for (int k = 0; k < r->nops; k++) {
    const tr_op *o = &r->ops[k];
    FUZZ_CHECK(o->group >= 0 && o->group < r->ngroups && o->gseq >= 1);
    FUZZ_CHECK(o->seq < r->total && (k == 0 || o->seq > r->ops[k - 1].seq));
    FUZZ_CHECK(o->kind[0] && o->status[0] && o->peer >= -1 && o->peer < r->world);
    FUZZ_CHECK(o->step >= -1 && o->bucket >= -1);
    FUZZ_CHECK(o->issue_ns >= 0 && o->start_ns >= 0 && o->end_ns >= 0);
    FUZZ_CHECK(strcmp(o->status, "pending") || o->end_ns == 0);
    FUZZ_CHECK(o->first != NULL && o->last != NULL); /* the rank's string table */
    FUZZ_CHECK(strlen(o->first) < TR_NAME && strlen(o->last) < TR_NAME);
  }
}

/* The format's string encoding. */
static void put(char **p, const char *s) {
  if (!*s) {
    *(*p)++ = '-';
    return;
  }
  if (!strcmp(s, "-")) {
    memcpy(*p, "%2D", 3);
    *p += 3;
    return;
  }
  for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
    if (*c <= 0x20 || *c == '%' || *c >= 0x7f) *p += sprintf(*p, "%%%02X", *c);
    else *(*p)++ = (char)*c;
  }
}

/* r written out again; the caller frees. */
static char *encode(const tr_rank *r, size_t *len) {
  /* Every string field at most 3 bytes per byte (%XX); the limits of
   * groups/trace_format.h bound them. */
  size_t cap = 1024 + 3 * (strlen(r->message) + strlen(r->mesh) + strlen(r->host) +
                           strlen(r->backend) + strlen(r->reason));
  for (int g = 0; g < r->ngroups; g++) cap += 3 * TR_NAME + 64 + 12 * (size_t)r->groups[g].size;
  cap += (size_t)r->nops * (6 * TR_NAME + 400);
  char *s = malloc(cap), *p = s;
  if (!s) abort();
  p += sprintf(p, "meshpg-trace 1\nrank %d %d\nprocess ", r->rank, r->world);
  put(&p, r->host);
  p += sprintf(p, " %ld\nbackend ", r->pid);
  put(&p, r->backend);
  p += sprintf(p, "\nmesh ");
  put(&p, r->mesh);
  p += sprintf(p, "\njob %s\nclock %" PRId64 "\nreason ", r->job, r->dump_ns);
  put(&p, r->reason);
  *p++ = ' ';
  put(&p, r->message);
  p += sprintf(p, "\nring %ld %" PRIu64 "\n", r->capacity, r->total);
  for (int g = 0; g < r->ngroups; g++) {
    const tr_group *gr = &r->groups[g];
    p += sprintf(p, "group %d ", g);
    put(&p, gr->name);
    p += sprintf(p, " %d %d %d ", gr->index, gr->position, gr->size);
    for (int k = 0; k < gr->size; k++) p += sprintf(p, k ? ",%d" : "%d", gr->ranks[k]);
    *p++ = '\n';
  }
  for (int k = 0; k < r->nops; k++) {
    const tr_op *o = &r->ops[k];
    p += sprintf(p, "op %" PRIu64 " %d %" PRIu64 " ", o->seq, o->group, o->gseq);
    put(&p, o->kind);
    *p++ = ' ';
    put(&p, o->dtype);
    p += sprintf(p, " %" PRIu64 " %d %ld %d %" PRId64 " %" PRId64 " %" PRId64 " ", o->count,
                 o->peer, o->step, o->bucket, o->issue_ns, o->start_ns, o->end_ns);
    put(&p, o->status);
    *p++ = ' ';
    put(&p, o->first);
    *p++ = ' ';
    put(&p, o->last);
    *p++ = '\n';
  }
  p += sprintf(p, "end %d\n", r->nops);
  FUZZ_CHECK((size_t)(p - s) < cap);
  *len = (size_t)(p - s);
  return s;
}

static void same(const tr_rank *a, const tr_rank *b) {
  FUZZ_CHECK(a->rank == b->rank && a->world == b->world && a->pid == b->pid);
  FUZZ_CHECK(!strcmp(a->host, b->host) && !strcmp(a->backend, b->backend));
  FUZZ_CHECK(!strcmp(a->mesh, b->mesh) && !strcmp(a->job, b->job) && a->dump_ns == b->dump_ns);
  FUZZ_CHECK(!strcmp(a->reason, b->reason) && !strcmp(a->message, b->message));
  FUZZ_CHECK(a->capacity == b->capacity && a->total == b->total);
  FUZZ_CHECK(a->ngroups == b->ngroups && a->nops == b->nops);
  for (int g = 0; g < a->ngroups; g++) {
    const tr_group *x = &a->groups[g], *y = &b->groups[g];
    FUZZ_CHECK(!strcmp(x->name, y->name) && x->index == y->index);
    FUZZ_CHECK(x->position == y->position && x->size == y->size);
    FUZZ_CHECK(!memcmp(x->ranks, y->ranks, sizeof(int) * (size_t)x->size));
  }
  for (int k = 0; k < a->nops; k++) {
    const tr_op *x = &a->ops[k], *y = &b->ops[k];
    FUZZ_CHECK(x->seq == y->seq && x->group == y->group && x->gseq == y->gseq);
    FUZZ_CHECK(!strcmp(x->kind, y->kind) && !strcmp(x->dtype, y->dtype));
    FUZZ_CHECK(x->count == y->count && x->peer == y->peer && x->step == y->step);
    FUZZ_CHECK(x->bucket == y->bucket && x->issue_ns == y->issue_ns);
    FUZZ_CHECK(x->start_ns == y->start_ns && x->end_ns == y->end_ns);
    FUZZ_CHECK(!strcmp(x->status, y->status) && !strcmp(x->first, y->first));
    FUZZ_CHECK(!strcmp(x->last, y->last));
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  /* An exact-size copy, so that ASan sees any read past the end. */
  char *buf = malloc(size ? size : 1);
  if (!buf) abort();
  memcpy(buf, data, size);
  tr_rank r;
  char err[512];
  err[0] = '\0';
  if (tr_parse(buf, size, &r, err, sizeof err) != 0) {
    FUZZ_CHECK(strncmp(err, "line ", 5) == 0 && strlen(err) > 7);
    tr_rank_free(&r);
    FUZZ_CHECK(r.ops == NULL && r.groups == NULL && r.message == NULL);
    free(buf);
    return 0;
  }
  check_rules(&r);
  size_t n = 0;
  char *again = encode(&r, &n);
  tr_rank r2;
  if (tr_parse(again, n, &r2, err, sizeof err) != 0) {
    dprintf(STDERR_FILENO, "re-encoded dump refused: %s\n", err);
    FUZZ_CHECK(0);
  }
  same(&r, &r2);
  /* The writers: no fault, whatever the times and names (a row per world
   * rank: small worlds only). */
  if (r.world <= 4096) {
    FUZZ_CHECK(tr_write_svg(&r, 1, 0, "/dev/null", err, sizeof err) == 0);
    FUZZ_CHECK(tr_write_chrome(&r, 1, 0, "/dev/null", err, sizeof err) == 0);
  }
  tr_rank_free(&r2);
  free(again);
  tr_rank_free(&r);
  free(buf);
  return 0;
}
