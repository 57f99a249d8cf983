/* Subcommands of the meshpg program.  Each returns the process exit code:
 * 0 success, 1 invalid input or a failed check, 2 usage error. */
#ifndef MPG_TOOLS_CMD_H
#define MPG_TOOLS_CMD_H

#include "meshpg.h"

int mpg_cmd_plan(int argc, char **argv);
int mpg_cmd_sim(int argc, char **argv);
int mpg_cmd_topo(int argc, char **argv);

/* The spec options shared by plan and sim: SPEC.toml, --mesh, --flatten,
 * --order, --world (tools/spec_args.c). */
typedef struct mpg_tool_spec {
  const char *path;  /* SPEC.toml or NULL */
  const char *mesh;  /* --mesh or NULL */
  const char *order; /* --order or NULL */
  const char *flatten[MPG_MAX_FLATTEN]; /* --flatten values, NAME=d1,d2 */
  int nflatten;
  int world;         /* --world, 0 when not given */
} mpg_tool_spec;

/* If argv[*i] is one of the shared spec options (or the positional spec
 * file), take it and its value: returns 1.  Returns 0 for an option that is
 * not one of them, -1 on a usage error (already reported). */
int mpg_tool_spec_arg(mpg_tool_spec *t, int argc, char **argv, int *i,
                      const char *usage);

/* The spec file, then --mesh (or default_mesh when neither is given; may
 * be NULL), --flatten and --order, applied in that order. */
mpg_status mpg_tool_spec_load(const mpg_tool_spec *t, const char *default_mesh,
                              mpg_spec *spec);

/* Shared option parsing helpers. */
int mpg_tool_parse_int(const char *flag, const char *s, int lo, int *out);
void mpg_tool_error(const char *fmt, ...);

#define MPG_EXIT_OK 0
#define MPG_EXIT_FAIL 1
#define MPG_EXIT_USAGE 2

#endif
