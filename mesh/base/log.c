/* The logging switch: the library prints only here, and only when
 * MESHPG_LOG=info|debug.
 *
 * The level is one process-wide atomic: read from MESHPG_LOG once, at the
 * first log line of the process, and set again by each mpg_ctx_create from
 * the value it reads with the other variables (groups/settings.c), so that
 * no log line calls getenv (which would race a caller's setenv). */
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static _Atomic int level = -1; /* -1: not read yet */
static pthread_once_t read_once = PTHREAD_ONCE_INIT;

static void read_env(void) {
  const char *v = getenv("MESHPG_LOG");
  int l = 0;
  if (v && strcmp(v, "debug") == 0) l = 2;
  else if (v && strcmp(v, "info") == 0) l = 1;
  int unread = -1;
  atomic_compare_exchange_strong(&level, &unread, l);
}

int mpg__log_level(void) {
  if (atomic_load_explicit(&level, memory_order_relaxed) < 0) pthread_once(&read_once, read_env);
  return atomic_load_explicit(&level, memory_order_relaxed);
}

void mpg__log_set_level(int l) {
  pthread_once(&read_once, read_env);
  atomic_store(&level, l < 0 ? 0 : l > 2 ? 2 : l);
}

void mpg__log(int l, const char *fmt, ...) {
  if (mpg__log_level() < l) return;
  char line[1200];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  fprintf(stderr, "meshpg[%s]: %s\n", l >= 2 ? "debug" : "info", line);
}
