/* What libmeshpg.so exports: exactly the functions the header declares
 * with MPG_API, each with the symbol version MESHPG_<major>.<minor>, no
 * internal mpg__ symbol and nothing else; and the soname carries
 * major.minor.  Reads `nm -D` and `readelf -d` of the built library
 * (MESHPG_LIB) and the header (MESHPG_HEADER). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "meshpg.h"

#define MAX_SYMS 512

typedef struct names {
  int n;
  char name[MAX_SYMS][64];
} names;

static const char *env(const char *var) {
  const char *v = getenv(var);
  cr_assert(v && *v, "%s is not set", var);
  return v;
}

static void add(names *s, const char *name) {
  cr_assert_lt(s->n, MAX_SYMS);
  snprintf(s->name[s->n++], sizeof s->name[0], "%s", name);
}

static int has(const names *s, const char *name) {
  for (int i = 0; i < s->n; i++)
    if (strcmp(s->name[i], name) == 0) return 1;
  return 0;
}

/* Defined dynamic symbols as "name@@VERSION" (nm -D --with-symbol-versions). */
static void exported(names *out) {
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "nm -D --defined-only --with-symbol-versions '%s'",
           env("MESHPG_LIB"));
  FILE *p = popen(cmd, "r");
  cr_assert(p, "cannot run %s", cmd);
  char line[512];
  while (fgets(line, sizeof line, p)) {
    char addr[64], type[8], sym[256];
    if (sscanf(line, "%63s %7s %255s", addr, type, sym) != 3) continue;
    add(out, sym);
  }
  cr_assert_eq(pclose(p), 0, "%s failed", cmd);
}

/* The functions declared "MPG_API <type> mpg_name(" in the header. */
static void declared(names *out) {
  FILE *f = fopen(env("MESHPG_HEADER"), "r");
  cr_assert(f, "cannot open the header");
  char line[512];
  while (fgets(line, sizeof line, f)) {
    if (strncmp(line, "MPG_API ", 8) != 0) continue;
    char *paren = strchr(line, '(');
    cr_assert(paren, "MPG_API line without '(': %s", line);
    char *start = paren;
    while (start > line && (start[-1] == '_' || (start[-1] >= 'a' && start[-1] <= 'z') ||
                            (start[-1] >= '0' && start[-1] <= '9')))
      start--;
    *paren = '\0';
    add(out, start);
  }
  fclose(f);
}

Test(exports, only_the_declared_api_each_with_its_version) {
  names *syms = calloc(1, sizeof *syms), *decl = calloc(1, sizeof *decl);
  exported(syms);
  declared(decl);
  cr_assert_gt(decl->n, 100, "only %d MPG_API declarations found", decl->n);
  /* Each symbol under the node of the release that brought it:
   * MESHPG_1.0 for the 1.0 API, MESHPG_1.1 for the checkpoints, MESHPG_1.2
   * for the flight recorder. */
  char v10[32], v11[32], v12[32];
  snprintf(v10, sizeof v10, "@@MESHPG_%d.0", MPG_VERSION_MAJOR);
  snprintf(v11, sizeof v11, "@@MESHPG_%d.1", MPG_VERSION_MAJOR);
  snprintf(v12, sizeof v12, "@@MESHPG_%d.2", MPG_VERSION_MAJOR);
  names *bare = calloc(1, sizeof *bare);
  for (int i = 0; i < syms->n; i++) {
    const char *s = syms->name[i];
    /* The version node itself is listed as an absolute symbol. */
    if (strncmp(s, "MESHPG_", 7) == 0) continue;
    cr_assert(strncmp(s, "mpg_", 4) == 0 && strncmp(s, "mpg__", 5) != 0,
              "exported symbol %s is not public API", s);
    const char *at = strstr(s, "@@");
    const char *version = strncmp(s, "mpg_ckpt_", 9) == 0          ? v11
                          : strncmp(s, "mpg_ctx_trace_dump@", 19) == 0 ? v12
                                                                       : v10;
    cr_assert(at && strcmp(at, version) == 0, "%s: expected version %s", s, version + 2);
    char name[64];
    snprintf(name, sizeof name, "%.*s", (int)(at - s), s);
    add(bare, name);
  }
  for (int i = 0; i < decl->n; i++)
    cr_assert(has(bare, decl->name[i]), "%s is declared MPG_API but not exported",
              decl->name[i]);
  for (int i = 0; i < bare->n; i++)
    cr_assert(has(decl, bare->name[i]), "%s is exported but not declared MPG_API",
              bare->name[i]);
  cr_assert_eq(bare->n, decl->n);
  free(syms);
  free(decl);
  free(bare);
}

/* The soname carries the major version from 1.0 on (major.minor before),
 * and every export the symbol version node MESHPG_<major>.0 or later. */
Test(exports, soname_carries_the_major_version) {
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "readelf -d '%s'", env("MESHPG_LIB"));
  FILE *p = popen(cmd, "r");
  cr_assert(p);
  char line[512], want[64];
  if (MPG_VERSION_MAJOR == 0)
    snprintf(want, sizeof want, "[libmeshpg.so.0.%d]", MPG_VERSION_MINOR);
  else
    snprintf(want, sizeof want, "[libmeshpg.so.%d]", MPG_VERSION_MAJOR);
  int found = 0;
  while (fgets(line, sizeof line, p))
    if (strstr(line, "SONAME") && strstr(line, want)) found = 1;
  pclose(p);
  cr_assert(found, "no SONAME %s in %s", want, cmd);
}

Test(exports, header_has_no_placeholders) {
  FILE *f = fopen(env("MESHPG_HEADER"), "r");
  cr_assert(f);
  char line[512];
  int n = 0;
  while (fgets(line, sizeof line, f)) {
    n++;
    cr_assert(!strstr(line, "@@"), "line %d of the installed header: %s", n, line);
  }
  fclose(f);
}
