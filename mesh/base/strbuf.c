/* The growing string buffer (internal.h, "mpg__strbuf"): the text of the
 * flight recorder's dump (groups/trace_dump.c), and the CLI's JSON and
 * reports (tools/cmd_ckpt.c, tools/trace_analyze*.c).  Its error is
 * sticky, so that a writer appends without checking each step and looks
 * once at the end. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* The bound of a buffer made with max 0: half the address space, so that
 * doubling the capacity never overflows. */
#define STRBUF_HARD_MAX (SIZE_MAX / 4)

static size_t bound_of(const mpg__strbuf *b) {
  return b->max && b->max < STRBUF_HARD_MAX ? b->max : STRBUF_HARD_MAX;
}

void mpg__strbuf_vadd(mpg__strbuf *b, const char *fmt, va_list ap) {
  if (b->st) return;
  for (;;) {
    va_list aq;
    va_copy(aq, ap);
    size_t room = b->cap - b->len;
    int n = vsnprintf(b->s ? b->s + b->len : NULL, room, fmt, aq);
    va_end(aq);
    if (n < 0) {
      b->st = MPG_ERR_INVALID; /* an encoding error: nothing is appended */
      break;
    }
    if ((size_t)n > bound_of(b) || b->len > bound_of(b) - (size_t)n) {
      if (b->s) b->s[b->len] = '\0'; /* the cut text stays a string */
      b->st = MPG_ERR_RANGE;
      break;
    }
    if ((size_t)n < room) {
      b->len += (size_t)n;
      break;
    }
    size_t cap = b->cap ? b->cap : 256;
    while (cap <= b->len + (size_t)n) cap *= 2;
    char *s = realloc(b->s, cap);
    if (!s) {
      b->st = MPG_ERR_NOMEM;
      break;
    }
    b->s = s;
    b->cap = cap;
  }
}

void mpg__strbuf_add(mpg__strbuf *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  mpg__strbuf_vadd(b, fmt, ap);
  va_end(ap);
}

char *mpg__strbuf_take(mpg__strbuf *b) {
  char *s = b->s;
  if (b->st || !s) {
    free(s);
    s = b->st ? NULL : strdup("");
  }
  b->s = NULL;
  b->len = b->cap = 0;
  return s;
}

void mpg__strbuf_free(mpg__strbuf *b) {
  free(b->s);
  b->s = NULL;
  b->len = b->cap = 0;
}
