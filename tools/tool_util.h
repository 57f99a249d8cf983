/* Helpers every part of the meshpg program shares: exit codes, messages on
 * stderr, integer options.  Leaf of the tools/ call graph: it calls only the
 * library and libc, never a command. */
#ifndef TOOLS_TOOL_UTIL_H
#define TOOLS_TOOL_UTIL_H

#include "meshpg.h"

/* Process exit codes of every command. */
#define TOOL_EXIT_OK 0    /* success */
#define TOOL_EXIT_FAIL 1  /* invalid input or a failed check */
#define TOOL_EXIT_USAGE 2 /* usage error */

#if defined(__GNUC__)
#define TOOL_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define TOOL_PRINTF(f, a)
#endif

/* Print "meshpg: <message>\n" on stderr. */
void tool_error(const char *fmt, ...) TOOL_PRINTF(1, 2);

/* Why a library call failed with status st: the library's thread-local
 * message (mpg_last_error()), or mpg_strerror(st) when that is empty or st
 * is MPG_OK.  The string belongs to the library. */
const char *tool_why(mpg_status st);

/* Report a failed library call: "meshpg: <context>: <why>\n" on stderr, or
 * "meshpg: <why>\n" when fmt is NULL, with <why> = tool_why(st).  Returns
 * TOOL_EXIT_FAIL. */
int tool_fail(mpg_status st, const char *fmt, ...) TOOL_PRINTF(2, 3);
/* mpg_mesh_create's failure, as tool_fail, with "give the world size with
 * --world N" added when the spec has a -1 dim and no world size was given. */
int tool_mesh_fail(mpg_status st, const mpg_spec *spec, int world);
/* Mask of the mesh dims named by "a,b" (dims or flattened sets).  Returns
 * 0, or -1 after an error message naming `what` and the list. */
int tool_dims_mask(const mpg_mesh *mesh, const char *list, const char *what,
                   unsigned *mask);
/* After a usage error's one line: "run 'meshpg plan --help' for the
 * options" (the command taken from the usage text's first line), not the
 * whole help. */
void tool_usage_hint(const char *usage);

/* Parse s as a decimal int >= lo into *out: returns 1.  On a bad value,
 * reports "<flag>: expected an integer >= <lo>, found \"<s>\"" and
 * returns 0. */
int tool_parse_int(const char *flag, const char *s, int lo, int *out);

#endif
