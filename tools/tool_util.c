/* Helpers every part of the meshpg program shares (see tool_util.h). */
#include "tool_util.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>

void tool_error(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("meshpg: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
}

int tool_mesh_fail(mpg_status st, const mpg_spec *spec, int world) {
  int inferred = 0;
  for (int d = 0; d < spec->ndims; d++) inferred |= spec->dims[d].size == -1;
  if (world <= 0 && inferred && st == MPG_ERR_SPEC) {
    fprintf(stderr, "meshpg: %s; give the world size with --world N\n", tool_why(st));
    return TOOL_EXIT_FAIL;
  }
  return tool_fail(st, NULL);
}

/* Mask of mesh dims named by "a,b" (dims or flattened sets); -1 after an
 * error message naming `what`. */
int tool_dims_mask(const mpg_mesh *mesh, const char *list, const char *what,
                   unsigned *mask) {
  char buf[256];
  snprintf(buf, sizeof buf, "%s", list);
  *mask = 0;
  char *save = NULL;
  for (char *tok = strtok_r(buf, ", ", &save); tok; tok = strtok_r(NULL, ", ", &save)) {
    int set, dims[MPG_MAX_DIMS], n;
    mpg_status st = mpg_mesh_dimset_find(mesh, tok, &set);
    if (st == MPG_OK) st = mpg_mesh_dimset_dims(mesh, set, dims, &n);
    if (st != MPG_OK) {
      tool_error("%s \"%s\": %s", what, list, mpg_last_error());
      return -1;
    }
    for (int k = 0; k < n; k++) *mask |= 1u << dims[k];
  }
  return 0;
}

void tool_usage_hint(const char *usage) {
  const char *prefix = "usage: meshpg ";
  char cmd[32] = "";
  if (usage && strncmp(usage, prefix, strlen(prefix)) == 0)
    sscanf(usage + strlen(prefix), "%31[a-z]", cmd);
  fprintf(stderr, "run 'meshpg %s%s--help' for the options\n", cmd, cmd[0] ? " " : "");
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
