/* meshpg: the command line program.  Dispatches to one subcommand. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd.h"

static const char usage[] =
    "usage: meshpg <command> [options]\n"
    "\n"
    "commands:\n"
    "  plan   show the dims, ranks and groups of a mesh spec\n"
    "  topo   show this machine's (or a fixture's) GPUs, NUMA nodes, NICs and bindings\n"
    "  sim    train a small 3D-parallel model on simulated ranks and check it\n"
    "\n"
    "Run 'meshpg <command> --help' for the options of one command.\n";

int mpg_tool_parse_int(const char *flag, const char *s, int lo, int *out) {
  char *end;
  long v = strtol(s, &end, 10);
  if (!*s || *end || v < lo || v > 2147483647L) {
    mpg_tool_error("%s: expected an integer >= %d, found \"%s\"", flag, lo, s);
    return 0;
  }
  *out = (int)v;
  return 1;
}

void mpg_tool_error(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("meshpg: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fputs(usage, stderr);
    return MPG_EXIT_USAGE;
  }
  const char *cmd = argv[1];
  if (strcmp(cmd, "plan") == 0) return mpg_cmd_plan(argc - 1, argv + 1);
  if (strcmp(cmd, "topo") == 0) return mpg_cmd_topo(argc - 1, argv + 1);
  if (strcmp(cmd, "sim") == 0) return mpg_cmd_sim(argc - 1, argv + 1);
  if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 ||
      strcmp(cmd, "help") == 0) {
    fputs(usage, stdout);
    return MPG_EXIT_OK;
  }
  if (strcmp(cmd, "--version") == 0) {
    printf("meshpg %d.%d.%d\n", MPG_VERSION_MAJOR, MPG_VERSION_MINOR,
           MPG_VERSION_PATCH);
    return MPG_EXIT_OK;
  }
  mpg_tool_error("unknown command \"%s\"", cmd);
  fputs(usage, stderr);
  return MPG_EXIT_USAGE;
}
