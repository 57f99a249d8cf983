/* The CUDA device choice: the rules and the reading of
 * CUDA_VISIBLE_DEVICES, without calling CUDA.  See device.h. */
#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "device.h"

/* How much of CUDA_VISIBLE_DEVICES the explanation quotes. */
#define QUOTE_MAX 64

enum rule { R_NONE, R_REQUESTED, R_ONLY, R_LOCAL_RANK, R_MODULO };

/* A bounded text being appended to. */
typedef struct text {
  char *buf;
  size_t cap, len;
} text;

static void add(text *t, const char *fmt, ...) MPG__PRINTF(2, 3);
static void add(text *t, const char *fmt, ...) {
  if (t->len + 1 >= t->cap) return;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(t->buf + t->len, t->cap - t->len, fmt, ap);
  va_end(ap);
  if (n > 0) t->len += (size_t)n;
  if (t->len >= t->cap) t->len = t->cap - 1;
}

/* Whether s starts with p, ignoring ASCII case (CUDA reads UUIDs so). */
static int has_prefix(const char *s, const char *p) {
  for (; *p; s++, p++)
    if (tolower((unsigned char)*s) != tolower((unsigned char)*p)) return 0;
  return 1;
}

/* 1 when t is a usable entry (an index, GPU-<hex>, MIG-<id>), 0 when CUDA
 * ends the list at it. */
static int entry_usable(const char *t) {
  size_t n = strlen(t);
  if (n == 0) return 0;
  if (strspn(t, "0123456789") == n) return 1;
  if (has_prefix(t, "GPU-"))
    return n > 4 && strspn(t + 4, "0123456789abcdefABCDEF-") == n - 4;
  if (!has_prefix(t, "MIG-") || n == 4) return 0;
  for (size_t i = 4; i < n; i++)
    if (!isalnum((unsigned char)t[i]) && t[i] != '-' && t[i] != '/') return 0;
  return 1;
}

/* What CUDA_VISIBLE_DEVICES says, read up to its first unusable entry. */
typedef struct scan {
  int usable;                        /* usable entries before the end */
  int cut;                           /* the entry that ends it, or -1 */
  char cut_text[MPG__DEVICE_ENTRY_MAX];
  char entry[MPG__DEVICE_ENTRY_MAX]; /* usable entry `want`, or "" */
} scan;

static void scan_visible(const char *v, int want, scan *s) {
  memset(s, 0, sizeof *s);
  s->cut = -1;
  char tok[MPG__DEVICE_ENTRY_MAX];
  const char *p = v;
  int r;
  while ((r = mpg__list_next(&p, ',', tok, sizeof tok)) != 0) {
    if (r < 0 || !entry_usable(tok)) {
      s->cut = s->usable;
      strcpy(s->cut_text, tok);
      return;
    }
    if (s->usable == want) strcpy(s->entry, tok);
    s->usable++;
  }
}

/* CUDA_VISIBLE_DEVICES as quoted: at most QUOTE_MAX chars. */
static void add_quote(text *t, const char *v) {
  size_t n = strlen(v);
  if (n > QUOTE_MAX) add(t, "%.*s...", QUOTE_MAX - 3, v);
  else add(t, "%s", v);
}

/* " (CUDA_VISIBLE_DEVICES=LIST: entry D = WHAT)" for the chosen device. */
static void add_visible(text *t, const char *v, int device, const scan *s) {
  if (!v) {
    add(t, " (CUDA_VISIBLE_DEVICES unset)");
    return;
  }
  add(t, " (CUDA_VISIBLE_DEVICES=");
  add_quote(t, v);
  if (s->entry[0])
    add(t, ": entry %d = %s%s)", device,
        isdigit((unsigned char)s->entry[0]) ? "GPU " : "", s->entry);
  else
    add(t, ": entry %d unknown, the list has %d usable entr%s)", device, s->usable,
        s->usable == 1 ? "y" : "ies");
}

/* Record the failure in out->why and as the thread's error. */
static mpg_status fail_with(mpg__device_choice *out, mpg_status st, text *t) {
  out->device = -1;
  out->ambiguous = 0;
  return mpg__fail(st, "%s", t->buf);
}

/* The message for count < 1. */
static mpg_status fail_no_device(mpg__device_choice *out, text *t, int local_rank,
                                 int count, const char *v, const scan *s) {
  add(t, "no CUDA device for local rank %d: CUDA shows this process %d devices",
      local_rank, count);
  if (!v) return fail_with(out, MPG_ERR_UNSUPPORTED, t);
  if (!v[0]) {
    add(t, "; CUDA_VISIBLE_DEVICES=\"\" hides every GPU");
    return fail_with(out, MPG_ERR_UNSUPPORTED, t);
  }
  add(t, "; CUDA_VISIBLE_DEVICES=\"");
  add_quote(t, v);
  if (s->usable == 0)
    add(t, "\" has no usable entry: its first, \"%s\", is not an index, "
        "GPU-<uuid> or MIG-<id>, and CUDA ends the list there", s->cut_text);
  else
    add(t, "\" lists %d entr%s but CUDA found none of them (an index past the "
        "last GPU or an unknown UUID ends the list)", s->usable,
        s->usable == 1 ? "y" : "ies");
  return fail_with(out, MPG_ERR_UNSUPPORTED, t);
}

mpg_status mpg__device_choose(int requested, int local_rank, int local_world_size,
                              int count, const char *visible,
                              mpg__device_choice *out) {
  if (!out) return mpg__fail(MPG_ERR_INVALID, "device choice: out is NULL");
  memset(out, 0, sizeof *out);
  out->device = -1;
  out->visible_entries = -1;
  text t = {out->why, sizeof out->why, 0};
  if (local_rank < 0) {
    add(&t, "device choice: local rank %d is negative", local_rank);
    return fail_with(out, MPG_ERR_INVALID, &t);
  }
  if (local_world_size < 1) {
    add(&t, "device choice: local world size %d is below 1", local_world_size);
    return fail_with(out, MPG_ERR_INVALID, &t);
  }
  if (requested < -1) {
    add(&t, "opts.device=%d: expected a CUDA device 0..%d, or -1 to choose "
        "from the local rank", requested, count - 1);
    return fail_with(out, MPG_ERR_INVALID, &t);
  }
  /* A local rank outside the local world: the world holds it at least. */
  int local_world = local_world_size > local_rank ? local_world_size : local_rank + 1;
  enum rule rule = R_NONE;
  int dev = -1;
  if (count < 1) rule = R_NONE;
  else if (requested >= 0) rule = R_REQUESTED, dev = requested;
  else if (count == 1) rule = R_ONLY, dev = 0;
  else if (count >= local_world) rule = R_LOCAL_RANK, dev = local_rank;
  else rule = R_MODULO, dev = local_rank % count;

  scan s;
  memset(&s, 0, sizeof s);
  if (visible) {
    scan_visible(visible, dev, &s);
    out->visible_entries = s.usable;
    snprintf(out->entry, sizeof out->entry, "%s", s.entry);
  }
  if (rule == R_NONE) return fail_no_device(out, &t, local_rank, count, visible, &s);
  if (rule == R_REQUESTED && dev >= count) {
    add(&t, "opts.device=%d is not a CUDA device of this process: it sees %d "
        "(0..%d)", requested, count, count - 1);
    if (visible) {
      add(&t, ", numbered in the order of CUDA_VISIBLE_DEVICES=\"");
      add_quote(&t, visible);
      add(&t, "\"");
    }
    out->entry[0] = '\0';
    return fail_with(out, MPG_ERR_INVALID, &t);
  }

  out->device = dev;
  out->ambiguous = rule == R_MODULO;
  switch (rule) {
    case R_NONE: break;
    case R_REQUESTED: add(&t, "device %d = opts.device", dev); break;
    case R_ONLY:
      add(&t, "device 0 = the only visible device (one GPU per process, e.g. "
          "Slurm --gpus-per-task or CUDA_VISIBLE_DEVICES per rank; local rank "
          "%d of %d)", local_rank, local_world);
      break;
    case R_LOCAL_RANK:
      add(&t, "device %d = local rank %d (%d visible devices for %d local ranks)",
          dev, local_rank, count, local_world);
      break;
    case R_MODULO:
      add(&t, "device %d = local rank %d %% %d visible devices", dev, local_rank, count);
      break;
  }
  add_visible(&t, visible, dev, &s);
  if (out->ambiguous)
    add(&t, "; ambiguous: %d local ranks share %d devices (NCCL refuses two ranks "
        "of one communicator on one GPU)", local_world, count);
  return MPG_OK;
}
