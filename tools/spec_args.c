/* The spec options every meshpg command shares: SPEC.toml, --mesh,
 * --flatten (repeatable), --order, --world and --experts. */
#include <stdio.h>
#include <string.h>

#include "cmd.h"

/* --experts "ep=4,tp=2,order=tp-cp-ep-dp-pp" (the keys of [experts], in
 * any order, each optional: ep defaults to 1).  Returns 0 after a usage
 * error message. */
static int experts_arg(tool_spec *t, const char *v) {
  t->experts = 1;
  t->expert_tp = 0;
  t->expert_ep = 1;
  t->expert_order[0] = '\0';
  char buf[256];
  if (strlen(v) >= sizeof buf) {
    tool_error("--experts: longer than %zu chars", sizeof buf - 1);
    return 0;
  }
  strcpy(buf, v);
  char *save = NULL;
  for (char *item = strtok_r(buf, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
    char *eq = strchr(item, '=');
    size_t kl = eq ? (size_t)(eq - item) : 0;
    if (kl == 5 && strncmp(item, "order", 5) == 0) {
      if (strlen(eq + 1) >= sizeof t->expert_order) {
        tool_error("--experts: order \"%s\" is longer than %zu chars", eq + 1,
                   sizeof t->expert_order - 1);
        return 0;
      }
      strcpy(t->expert_order, eq + 1);
    } else if (kl == 2 && strncmp(item, "tp", 2) == 0) {
      if (!tool_parse_int("--experts tp", eq + 1, 1, &t->expert_tp)) return 0;
    } else if (kl == 2 && strncmp(item, "ep", 2) == 0) {
      if (strcmp(eq + 1, "auto") == 0 || strcmp(eq + 1, "-1") == 0)
        t->expert_ep = -1;
      else if (!tool_parse_int("--experts ep", eq + 1, 1, &t->expert_ep))
        return 0;
    } else {
      tool_error("--experts: expected ep=N, tp=N or order=ORDER separated by commas, "
                 "found \"%s\"", item);
      return 0;
    }
  }
  return 1;
}

int tool_spec_arg(tool_spec *t, int argc, char **argv, int *i,
                  const char *usage) {
  const char *a = argv[*i];
  int takes_value = strcmp(a, "--mesh") == 0 || strcmp(a, "--flatten") == 0 ||
                    strcmp(a, "--order") == 0 || strcmp(a, "--world") == 0 ||
                    strcmp(a, "--experts") == 0;
  if (!takes_value) {
    if (a[0] == '-' && a[1] != '\0') return 0;
    if (t->path) {
      tool_error("only one spec file may be given (found \"%s\" and \"%s\")",
                 t->path, a);
      return -1;
    }
    t->path = a;
    return 1;
  }
  if (*i + 1 >= argc) {
    tool_error("%s needs a value", a);
    tool_usage_hint(usage);
    return -1;
  }
  const char *v = argv[++*i];
  if (strcmp(a, "--mesh") == 0) {
    t->mesh = v;
  } else if (strcmp(a, "--order") == 0) {
    t->order = v;
  } else if (strcmp(a, "--experts") == 0) {
    if (!experts_arg(t, v)) return -1;
  } else if (strcmp(a, "--world") == 0) {
    if (!tool_parse_int("--world", v, 1, &t->world)) return -1;
  } else {
    if (!strchr(v, '=')) {
      tool_error("--flatten: expected NAME=d1,d2, found \"%s\"", v);
      return -1;
    }
    if (t->nflatten == MPG_MAX_FLATTEN) {
      tool_error("--flatten: at most %d flattened sets", MPG_MAX_FLATTEN);
      return -1;
    }
    t->flatten[t->nflatten++] = v;
  }
  return 1;
}

mpg_status tool_spec_load(const tool_spec *t, const char *default_mesh,
                          mpg_spec *spec) {
  mpg_status st = mpg_spec_init(spec);
  if (!st && t->path) st = mpg_spec_load_file(t->path, spec);
  if (!st && t->mesh) st = mpg_spec_set_mesh(spec, t->mesh);
  if (!st && !t->path && !t->mesh && default_mesh)
    st = mpg_spec_set_mesh(spec, default_mesh);
  for (int k = 0; !st && k < t->nflatten; k++) {
    const char *v = t->flatten[k];
    char name[MPG_NAME_MAX * 2];
    size_t n = (size_t)(strchr(v, '=') - v);
    if (n >= sizeof name) n = sizeof name - 1;
    memcpy(name, v, n);
    name[n] = '\0';
    st = mpg_spec_add_flatten(spec, name, v + n + 1);
  }
  if (!st && t->order) st = mpg_spec_apply_order(spec, t->order);
  if (!st && t->experts)
    st = mpg_spec_set_experts(spec, t->expert_tp, t->expert_ep, t->expert_order);
  return st;
}
