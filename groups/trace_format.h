/* The flight recorder's dump format (docs/trace.md, "The dump format
 * (version 1)"): the limits that the writer (groups/trace_dump.c) and the
 * reader of `meshpg trace` (tools/trace_read.c) share, so that every file
 * the library writes is one the reader takes (issue 45, item 13).  Plain
 * macros, no other include: tools/ includes this header, groups/ never
 * includes anything of tools/.
 *
 * String limits are in decoded bytes, without the NUL.  The writer cuts a
 * longer string to the limit (at a UTF-8 character boundary); the reader
 * refuses a longer one. */
#ifndef MPG_GROUPS_TRACE_FORMAT_H
#define MPG_GROUPS_TRACE_FORMAT_H

#define MPG__TRACE_VERSION 1

#define MPG__TRACE_NAME_MAX 255      /* group NAME, FIRST, LAST, HOST */
#define MPG__TRACE_MESH_MAX 1023     /* MESH */
#define MPG__TRACE_MESSAGE_MAX 4095  /* the reason's MESSAGE */
#define MPG__TRACE_BACKEND_MAX 15    /* backend NAME */
#define MPG__TRACE_STATUS_MAX 31     /* a status name (reason, op STATUS) */

#define MPG__TRACE_MAX_ENTRIES (1L << 24) /* ring CAPACITY */
#define MPG__TRACE_MAX_GROUPS 4096        /* group lines */
#define MPG__TRACE_MAX_WORLD (1 << 20)    /* WORLD */

/* The dump directory, in bytes (the file names inside it are added). */
#define MPG__TRACE_DIR_MAX 1023

#endif
