/* Reading the flight recorder's dumps (docs/trace.md, "The dump format
 * (version 1)"): one file or a directory of them.  For `meshpg trace`
 * (tools/cmd_trace.c) and its fuzz target; the library only writes them
 * (groups/trace.c). */
#ifndef TOOLS_TRACE_READ_H
#define TOOLS_TRACE_READ_H

#include <stddef.h>
#include <stdint.h>

#define TR_NAME 128 /* bytes of a decoded name field, NUL included */

typedef struct tr_group {
  char name[TR_NAME];
  int index, position, size;
  int *ranks; /* size world ranks */
} tr_group;

typedef struct tr_op {
  uint64_t seq;
  int group;     /* index into tr_rank.groups */
  uint64_t gseq;
  char kind[16];
  char dtype[8]; /* "" for "-" */
  uint64_t count;
  int peer;      /* world rank or -1 */
  long step;
  int bucket;
  int64_t issue_ns, start_ns, end_ns;
  char status[32]; /* "ok", "pending" or a status name */
  char first[TR_NAME], last[TR_NAME]; /* "" for "-" */
} tr_op;

typedef struct tr_rank {
  int rank, world;
  char host[TR_NAME];
  long pid;
  char backend[16];
  char mesh[256];
  char job[17];
  int64_t dump_ns;
  char reason[32];   /* a status name or "request" */
  char *message;     /* decoded, "" for "-" */
  long capacity;
  uint64_t total;
  int ngroups;
  tr_group *groups;
  int nops;
  tr_op *ops;
} tr_rank;

/* Parse one dump held in buf[0..len) into *out (zeroed first; free with
 * tr_rank_free, also after a failure).  Returns 0, or -1 with a message in
 * err naming the line number, the field and the value. */
int tr_parse(const char *buf, size_t len, tr_rank *out, char *err, size_t errlen);
/* The same for a file. */
int tr_read_file(const char *path, tr_rank *out, char *err, size_t errlen);
void tr_rank_free(tr_rank *r);

/* Every rank-R.trace of dir: ranks[0..*n) sorted by rank (a file that
 * fails to parse is an error naming it; so are a file whose rank is not
 * its name's R, two files of one rank, and none at all).  Returns 0 or -1
 * with err (then *ranks NULL, *n 0). */
int tr_read_dir(const char *dir, tr_rank **ranks, int *n, char *err, size_t errlen);
void tr_ranks_free(tr_rank *ranks, int n);

#endif
