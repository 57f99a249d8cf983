/* The logging switch: the library prints only here, and only when
 * MESHPG_LOG=info|debug. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

int mpg__log_level(void) {
  /* Read each time: cheap, and lets tests flip it. */
  const char *v = getenv("MESHPG_LOG");
  if (!v) return 0;
  if (strcmp(v, "debug") == 0) return 2;
  if (strcmp(v, "info") == 0) return 1;
  return 0;
}

void mpg__log(int level, const char *fmt, ...) {
  if (mpg__log_level() < level) return;
  char line[1200];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  fprintf(stderr, "meshpg[%s]: %s\n", level >= 2 ? "debug" : "info", line);
}
