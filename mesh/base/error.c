/* Status tables, the thread-local last error, and name helpers. */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static _Thread_local char last_error[1024];

const char *mpg_strerror(mpg_status status) {
  switch (status) {
#define XX(name, text) \
  case MPG_##name:     \
    return text;
    MPG_STATUS_MAP(XX)
#undef XX
  default:
    return "unknown status";
  }
}

const char *mpg_status_name(mpg_status status) {
  switch (status) {
#define XX(name, text) \
  case MPG_##name:     \
    return #name;
    MPG_STATUS_MAP(XX)
#undef XX
  default:
    return "UNKNOWN";
  }
}

const char *mpg_last_error(void) { return last_error; }

void mpg__clear_error(void) { last_error[0] = '\0'; }

static void vrecord(const char *prefix, const char *fmt, va_list ap) {
  size_t n = 0;
  if (prefix) {
    n = (size_t)snprintf(last_error, sizeof last_error, "%s", prefix);
    if (n >= sizeof last_error) n = sizeof last_error - 1;
  }
  vsnprintf(last_error + n, sizeof last_error - n, fmt, ap);
  mpg__log(2, "error: %s", last_error);
}

mpg_status mpg__fail(mpg_status status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vrecord(NULL, fmt, ap);
  va_end(ap);
  return status;
}

mpg_status mpg__fail_wrap(mpg_status status, const char *fmt, ...) {
  /* The message is rebuilt in place, so keep the old one first. */
  char inner[sizeof last_error];
  snprintf(inner, sizeof inner, "%s", last_error[0] ? last_error : mpg_strerror(status));
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(last_error, sizeof last_error, fmt, ap);
  va_end(ap);
  size_t at = n < 0 ? 0 : (size_t)n;
  if (at > sizeof last_error - 1) at = sizeof last_error - 1;
  const char *parts[2] = {": ", inner};
  for (int i = 0; i < 2; i++) {
    size_t len = strlen(parts[i]);
    if (len > sizeof last_error - 1 - at) len = sizeof last_error - 1 - at;
    memcpy(last_error + at, parts[i], len);
    at += len;
  }
  last_error[at] = '\0';
  mpg__log(2, "error: %s", last_error);
  return status;
}

void mpg__error_save(mpg__saved_error *saved) {
  snprintf(saved->msg, sizeof saved->msg, "%s", last_error);
}

mpg_status mpg__error_restore(mpg_status status, const mpg__saved_error *saved) {
  snprintf(last_error, sizeof last_error, "%s", saved->msg);
  return status;
}

mpg_status mpg__fail_at(mpg_status status, const char *source, mpg_srcpos pos,
                        const char *fmt, ...) {
  char prefix[MPG_PATH_MAX + 32] = "";
  if (pos.line > 0)
    snprintf(prefix, sizeof prefix, "%s:%d:%d: ",
             (source && source[0]) ? source : "<string>", pos.line, pos.col);
  va_list ap;
  va_start(ap, fmt);
  vrecord(prefix, fmt, ap);
  va_end(ap);
  return status;
}

int mpg__name_valid(const char *name) {
  size_t n = strlen(name);
  if (n == 0 || n >= MPG_NAME_MAX) return 0;
  if (!((name[0] >= 'A' && name[0] <= 'Z') ||
        (name[0] >= 'a' && name[0] <= 'z') || name[0] == '_'))
    return 0;
  for (size_t i = 1; i < n; i++) {
    char c = name[i];
    if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
          (c >= '0' && c <= '9') || c == '_'))
      return 0;
  }
  return 1;
}

/* Edit distance counting an adjacent swap as one edit (optimal string
 * alignment), so "nmae" is one edit from "name". */
static int edit_distance(const char *a, const char *b) {
  size_t la = strlen(a), lb = strlen(b);
  if (la > 63 || lb > 63) return 99;
  int d[64][64];
  for (size_t i = 0; i <= la; i++) d[i][0] = (int)i;
  for (size_t j = 0; j <= lb; j++) d[0][j] = (int)j;
  for (size_t i = 1; i <= la; i++)
    for (size_t j = 1; j <= lb; j++) {
      int best = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
      if (d[i - 1][j] + 1 < best) best = d[i - 1][j] + 1;
      if (d[i][j - 1] + 1 < best) best = d[i][j - 1] + 1;
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] &&
          d[i - 2][j - 2] + 1 < best)
        best = d[i - 2][j - 2] + 1;
      d[i][j] = best;
    }
  return d[la][lb];
}

const char *mpg__closest(const char *word, const char *const *cands, int n) {
  const char *best = NULL;
  int bestd = 99;
  for (int i = 0; i < n; i++) {
    int d = edit_distance(word, cands[i]);
    if (d < bestd) bestd = d, best = cands[i];
  }
  /* Close enough: one edit for short words, two from five chars on. */
  int limit = strlen(word) >= 5 ? 2 : 1;
  return best && bestd > 0 && bestd <= limit ? best : NULL;
}

int mpg__list_next(const char **s, char sep, char *buf, size_t cap) {
  const char *p = *s;
  if (!p) return 0;
  const char *e = strchr(p, sep);
  size_t n = e ? (size_t)(e - p) : strlen(p);
  while (n && (*p == ' ' || *p == '\t')) p++, n--;
  while (n && (p[n - 1] == ' ' || p[n - 1] == '\t')) n--;
  *s = e ? e + 1 : NULL;
  if (n >= cap) {
    memcpy(buf, p, cap - 4);
    strcpy(buf + cap - 4, "...");
    return -1;
  }
  memcpy(buf, p, n);
  buf[n] = '\0';
  return 1;
}
