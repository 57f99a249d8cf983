/* Subcommands of the meshpg program.  Each returns the process exit code:
 * 0 success, 1 invalid input or a failed check, 2 usage error. */
#ifndef MPG_TOOLS_CMD_H
#define MPG_TOOLS_CMD_H

#include "meshpg.h"

int mpg_cmd_plan(int argc, char **argv);
int mpg_cmd_sim(int argc, char **argv);
int mpg_cmd_topo(int argc, char **argv);

/* Shared option parsing helpers. */
int mpg_tool_parse_int(const char *flag, const char *s, int lo, int *out);
void mpg_tool_error(const char *fmt, ...);

#define MPG_EXIT_OK 0
#define MPG_EXIT_FAIL 1
#define MPG_EXIT_USAGE 2

#endif
