/* The library's environment variables, parsed in one place with one rule
 * (issue 29).  mpg_ctx_create calls mpg__settings_read once; the backends,
 * the order checker and the shared-memory sync take their values from the
 * result (mpg__world_args.settings, mpg_ctx's copy) and never call getenv.
 *
 * The rule, for every variable (docs/launchers.md, "Environment"):
 *  - unset or empty: the default;
 *  - blanks around the value are an error, never trimmed (" 2" is not 2);
 *  - a choice is one of the documented words, exactly (case matters);
 *  - a number is decimal digits only (no sign, no 0x, no suffix) inside
 *    the documented range;
 *  - anything else is MPG_ERR_ENV naming the variable, the value and what
 *    was expected (mpg_ctx_create adds the rank). */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "mpg_config.h"

/* The first violation wins; later ones are not reported. */
static void bad(mpg__settings *s, const char *var, const char *value, const char *expected) {
  if (s->status) return;
  s->status = MPG_ERR_ENV;
  s->bad_var = var;
  snprintf(s->error, sizeof s->error, "%s=\"%s\": expected %s", var, value, expected);
}

/* The variable's value, or NULL when unset or empty (the default).  A value
 * with blanks around it is reported and treated as unset. */
static const char *value_of(mpg__settings *s, const char *var, const char *expected) {
  const char *v = getenv(var);
  if (!v || !v[0]) return NULL;
  size_t n = strlen(v);
  if (strchr(" \t\n\r\v\f", v[0]) || strchr(" \t\n\r\v\f", v[n - 1])) {
    char what[160];
    snprintf(what, sizeof what, "%s, without blanks around it", expected);
    bad(s, var, v, what);
    return NULL;
  }
  return v;
}

/* One of words[0..n) (NULL-terminated aliases map through codes[]), or
 * fallback. */
static int choice(mpg__settings *s, const char *var, const char *const *words,
                  const int *codes, int n, const char *expected, int fallback) {
  const char *v = value_of(s, var, expected);
  if (!v) return fallback;
  for (int i = 0; i < n; i++)
    if (strcmp(v, words[i]) == 0) return codes[i];
  bad(s, var, v, expected);
  return fallback;
}

/* A decimal number in [lo, hi], or fallback. */
static unsigned long long number(mpg__settings *s, const char *var, unsigned long long lo,
                                 unsigned long long hi, const char *expected,
                                 unsigned long long fallback) {
  const char *v = value_of(s, var, expected);
  if (!v) return fallback;
  unsigned long long x = 0;
  for (const char *c = v; *c; c++) {
    if (*c < '0' || *c > '9' || x > (ULLONG_MAX - 9) / 10) {
      bad(s, var, v, expected);
      return fallback;
    }
    x = x * 10 + (unsigned long long)(*c - '0');
  }
  if (x < lo || x > hi) {
    bad(s, var, v, expected);
    return fallback;
  }
  return x;
}

static int zero_one(mpg__settings *s, const char *var, int fallback) {
  static const char *const words[] = {"0", "1"};
  static const int codes[] = {0, 1};
  return choice(s, var, words, codes, 2, "0 (off) or 1 (on)", fallback);
}

void mpg__settings_read(mpg__settings *s) {
  memset(s, 0, sizeof *s);
  static const char *const log_words[] = {"off", "info", "debug"};
  static const int log_codes[] = {0, 1, 2};
  s->log = choice(s, "MESHPG_LOG", log_words, log_codes, 3, "off, info or debug", 0);
  s->check_order = zero_one(s, "MESHPG_CHECK_ORDER", MPG_CHECK_ORDER_DEFAULT);
  s->shm = zero_one(s, "MESHPG_SHM", 1);
  s->thread_inbox_msgs = (size_t)number(s, "MESHPG_THREAD_INBOX_MSGS", 1, 1000000000ull,
                                        "a whole number of messages from 1 to 1000000000",
                                        1024);
  s->thread_inbox_bytes = (size_t)number(s, "MESHPG_THREAD_INBOX_BYTES", 1, 1ull << 50,
                                         "a whole number of bytes from 1 to 2^50",
                                         (size_t)256 << 20);
  static const char *const prog_words[] = {"thread", "on", "1", "off", "0"};
  static const int prog_codes[] = {1, 1, 1, 0, 0};
  s->mpi_progress = choice(s, "MESHPG_MPI_PROGRESS", prog_words, prog_codes, 5,
                           "thread (also on, 1) or off (also 0)", 1);
  s->mpi_window = (int)number(s, "MESHPG_MPI_WINDOW", 1, 8,
                              "a whole number of ring pieces in flight from 1 to 8", 0);
  s->mpi_max_count = (long)number(s, "MESHPG_MPI_MAX_COUNT", 1, INT_MAX,
                                  "a whole number of elements per MPI call from 1 to "
                                  "2147483647", 0);
  s->mpi_piece_bytes = (size_t)number(s, "MESHPG_MPI_PIECE_BYTES", 8, 1ull << 40,
                                      "a whole number of bytes from 8 to 2^40", 0);
  s->nccl_port = (int)number(s, "MESHPG_NCCL_PORT", 1, 65535, "a TCP port from 1 to 65535", 0);
  s->nccl_split_share = zero_one(s, "MESHPG_NCCL_SPLIT_SHARE", 0);
  /* The flight recorder (groups/trace.c): 0 turns recording off. */
  s->trace_entries = (long)number(s, "MESHPG_TRACE_ENTRIES", 0, 1ull << 24,
                                  "a whole number of operations from 0 (off) to 16777216",
                                  (unsigned long long)-1);
  const char *trace_dir = value_of(s, "MESHPG_TRACE_DIR", "a directory");
  if (trace_dir && strlen(trace_dir) >= sizeof s->trace_dir)
    bad(s, "MESHPG_TRACE_DIR", trace_dir, "a directory name shorter than 1024 bytes");
  else if (trace_dir)
    snprintf(s->trace_dir, sizeof s->trace_dir, "%s", trace_dir);
  /* As NCCL reads it (v2.28.9 src/misc/param.cc:92-96): strtoll(value,
   * NULL, 0), the default 0 on a range error.  (NCCL also reads it from
   * /etc/nccl.conf, which meshpg does not: set it in the environment.) */
  const char *order = getenv("NCCL_LAUNCH_ORDER_IMPLICIT");
  if (order && order[0]) {
    errno = 0;
    long long v = strtoll(order, NULL, 0);
    s->nccl_launch_order_implicit = errno == 0 && v != 0;
  }
}
