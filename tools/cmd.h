/* Subcommands of the meshpg program.  Each returns the process exit code:
 * 0 success, 1 invalid input or a failed check, 2 usage error (the
 * TOOL_EXIT_* codes of tool_util.h). */
#ifndef TOOLS_CMD_H
#define TOOLS_CMD_H

#include "meshpg.h"
#include "tool_util.h"

int cmd_plan(int argc, char **argv);
int cmd_sim(int argc, char **argv);
int cmd_topo(int argc, char **argv);
/* meshpg ckpt info | export (tools/cmd_ckpt.c). */
int cmd_ckpt(int argc, char **argv);
/* meshpg trace DIR: the flight recorder's dumps merged (tools/cmd_trace.c). */
int cmd_trace(int argc, char **argv);

/* The spec options shared by plan and sim: SPEC.toml, --mesh, --flatten,
 * --order, --world, --experts (tools/spec_args.c). */
typedef struct tool_spec {
  const char *path;  /* SPEC.toml or NULL */
  const char *mesh;  /* --mesh or NULL */
  const char *order; /* --order or NULL */
  const char *flatten[MPG_MAX_FLATTEN]; /* --flatten values, NAME=d1,d2 */
  int nflatten;
  int world;         /* --world, 0 when not given */
  int experts;         /* --experts given: ep=N[,tp=N][,order=O] */
  int expert_tp, expert_ep;      /* its tp (0: the mesh's) and ep (-1: auto) */
  char expert_order[64];         /* its order ("": from the mesh) */
} tool_spec;

/* If argv[*i] is one of the shared spec options (or the positional spec
 * file), take it and its value: returns 1.  Returns 0 for an option that is
 * not one of them, -1 on a usage error (already reported). */
int tool_spec_arg(tool_spec *t, int argc, char **argv, int *i,
                  const char *usage);

/* The spec file, then --mesh (or default_mesh when neither is given; may
 * be NULL), --flatten, --order and --experts, applied in that order. */
mpg_status tool_spec_load(const tool_spec *t, const char *default_mesh,
                          mpg_spec *spec);

#endif
