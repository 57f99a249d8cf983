/* Reading the flight recorder's dumps (docs/trace.md, "The dump format
 * (version 1)"): one file or a directory of them.  For `meshpg trace`
 * (tools/cmd_trace.c) and its fuzz target; the library only writes them
 * (groups/trace.c). */
#ifndef TOOLS_TRACE_READ_H
#define TOOLS_TRACE_READ_H

#include <stddef.h>
#include <stdint.h>

/* The limits the library's writer shares (groups/trace_format.h). */
#include "../groups/trace_format.h"

#define TR_NAME (MPG__TRACE_NAME_MAX + 1) /* bytes of a decoded name field, NUL included */
#define TR_MESH (MPG__TRACE_MESH_MAX + 1)
#define TR_STATUS (MPG__TRACE_STATUS_MAX + 1)

typedef struct tr_group {
  char name[TR_NAME];
  int index, position, size;
  int *ranks; /* size world ranks */
  int *sorted; /* the same, ascending (membership by binary search) */
} tr_group;

typedef struct tr_op {
  /* (the 8-byte fields first, then the arrays, then the ints: no padding
   * between them; 8M ops of 4,096 full rings are held at once) */
  uint64_t seq;
  uint64_t gseq;
  uint64_t count;
  long step;
  int64_t issue_ns, start_ns, end_ns;
  /* Strings of the rank's table (tr_rank.strings: each distinct value
   * once, so that a ring of 2^24 ops of one bucket name holds it once),
   * never NULL. */
  const char *status; /* "ok", "pending" or a status name */
  const char *first, *last; /* "" for "-" */
  char kind[16];
  char dtype[8]; /* "" for "-" */
  int group;     /* index into tr_rank.groups */
  int peer;      /* world rank or -1 */
  int bucket;
} tr_op;

typedef struct tr_rank {
  int rank, world;
  char host[TR_NAME];
  long pid;
  char backend[MPG__TRACE_BACKEND_MAX + 1];
  char mesh[TR_MESH];
  char job[17];
  int64_t dump_ns;
  char reason[TR_STATUS]; /* a status name or "request" */
  char *message;     /* decoded, "" for "-" */
  long capacity;
  uint64_t total;
  int ngroups;
  tr_group *groups;
  int nops;
  tr_op *ops;
  struct tr_strings *strings; /* what the ops' strings point into (owned) */
} tr_rank;

/* Parse one dump held in buf[0..len) into *out (zeroed first; free with
 * tr_rank_free, also after a failure).  Returns 0, or -1 with a message in
 * err naming the line number, the field and the value. */
int tr_parse(const char *buf, size_t len, tr_rank *out, char *err, size_t errlen);
/* The same for a file: a regular file only (a symlink, a FIFO, a device or
 * a directory is refused without being read), read to the size it had
 * when opened. */
int tr_read_file(const char *path, tr_rank *out, char *err, size_t errlen);
void tr_rank_free(tr_rank *r);

/* Every rank-R.trace of dir: ranks[0..*n) sorted by rank (a file that
 * fails to parse is an error naming it; so are a file whose rank is not
 * its name's R, two files of one rank, and none at all).  When the files
 * are of several jobs (a directory reused by a later run), only the
 * newest job's are returned: the job whose latest dump (DUMP_NS) is the
 * latest.  Returns 0 or -1 with err (then *ranks NULL, *n 0). */
int tr_read_dir(const char *dir, tr_rank **ranks, int *n, char *err, size_t errlen);
/* The same, and *ignored: NULL, or (malloc'ed) one line per file of an
 * older job left out, "rank-3.trace: job 00000000000000aa (older)". */
int tr_read_dir_newest(const char *dir, tr_rank **ranks, int *n, char **ignored, char *err,
                       size_t errlen);
void tr_ranks_free(tr_rank *ranks, int n);

#endif
