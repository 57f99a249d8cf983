/* Helpers every part of the meshpg program shares (see tool_util.h). */
#include "tool_util.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

void tool_error(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("meshpg: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
}

const char *tool_why(mpg_status st) {
  const char *why = st != MPG_OK ? mpg_last_error() : NULL;
  return why && why[0] ? why : mpg_strerror(st);
}

int tool_fail(mpg_status st, const char *fmt, ...) {
  const char *why = tool_why(st);
  fputs("meshpg: ", stderr);
  if (fmt) {
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputs(": ", stderr);
  }
  fprintf(stderr, "%s\n", why);
  return TOOL_EXIT_FAIL;
}

int tool_parse_int(const char *flag, const char *s, int lo, int *out) {
  char *end;
  long v = strtol(s, &end, 10);
  if (!*s || *end || v < lo || v > 2147483647L) {
    tool_error("%s: expected an integer >= %d, found \"%s\"", flag, lo, s);
    return 0;
  }
  *out = (int)v;
  return 1;
}
