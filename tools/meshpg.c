/* meshpg: the command line program.  Dispatches to one subcommand. */
#include <stdio.h>
#include <string.h>

#include "cmd.h"

static const char usage[] =
    "usage: meshpg <command> [options]\n"
    "\n"
    "commands:\n"
    "  plan   show the dims, ranks and groups of a mesh spec\n"
    "  topo   show this machine's (or a fixture's) GPUs, NUMA nodes, NICs and bindings\n"
    "  sim    train a small 3D-parallel model on simulated ranks and check it\n"
    "  ckpt   show a checkpoint directory, or export it to safetensors\n"
    "  trace  merge the flight recorder's dumps: who is stuck where, and a timeline\n"
    "\n"
    "Run 'meshpg <command> --help' for the options of one command.\n";

int main(int argc, char **argv) {
  if (argc < 2) {
    fputs(usage, stderr);
    return TOOL_EXIT_USAGE;
  }
  const char *cmd = argv[1];
  if (strcmp(cmd, "plan") == 0) return cmd_plan(argc - 1, argv + 1);
  if (strcmp(cmd, "topo") == 0) return cmd_topo(argc - 1, argv + 1);
  if (strcmp(cmd, "sim") == 0) return cmd_sim(argc - 1, argv + 1);
  if (strcmp(cmd, "ckpt") == 0) return cmd_ckpt(argc - 1, argv + 1);
  if (strcmp(cmd, "trace") == 0) return cmd_trace(argc - 1, argv + 1);
  if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 ||
      strcmp(cmd, "help") == 0) {
    fputs(usage, stdout);
    return TOOL_EXIT_OK;
  }
  if (strcmp(cmd, "--version") == 0) {
    printf("meshpg %d.%d.%d\n", MPG_VERSION_MAJOR, MPG_VERSION_MINOR,
           MPG_VERSION_PATCH);
    return TOOL_EXIT_OK;
  }
  tool_error("unknown command \"%s\"", cmd);
  fputs(usage, stderr);
  return TOOL_EXIT_USAGE;
}
