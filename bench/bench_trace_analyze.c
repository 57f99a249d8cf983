/*
 * bench_trace_analyze - what `meshpg trace` costs on a large hang and on a
 * long-lived pipeline (issue 46, items 6 and 7).
 *
 * Hang: N thread-backend-like ranks (a pp x dp x tp mesh, tp 8 (4 at 64
 * ranks), pp 4 (8 from 4,096 ranks), dp the rest) with full rings of
 * ENTRIES operations, one rank hung computing and every other one blocked
 * on it (bench/trace_gen.h).  Pipeline: 2 ranks exchanging a send and a
 * receive per step for PAIRS steps with a ring of ENTRIES, then a hang.
 * The dumps are generated in memory, one rank at a time, and parsed with
 * tr_parse (the reader of tr_read_dir, less the file I/O); then
 * ta_analyze.  Per case, in a child process of its own: the read (parse)
 * time, the analysis time, the peak RSS (the child's maxrss: dumps held
 * plus the analysis) and the first culprit line.  A case that runs past
 * --limit seconds is reported as such.
 *
 * --one-group: the hang's ranks are all in one dp group (pp 1, tp 1): the
 * wait-for graph's worst case (every rank waits in one all-reduce).
 *
 * Usage: bench_trace_analyze [--ranks 64,256,1024,4096] [--entries 2048]
 *          [--pairs 40000,160000,640000] [--limit SECONDS] [--one-group]
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../tools/trace_analyze.h"
#include "trace_gen.h"

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* This process's CPU time (the machine is shared: wall time is not). */
static double cpu(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Parse every rank (gen(r) writes its dump into b) and analyze. */
static int run_case(int n, int (*gen)(int r, tg_buf *b, void *arg), void *arg) {
  tr_rank *rs = calloc((size_t)n, sizeof(tr_rank));
  tg_buf b = {0};
  char err[512];
  double read_s = 0, read_cpu = 0;
  if (!rs) return 1;
  for (int r = 0; r < n; r++) {
    if (gen(r, &b, arg)) {
      fprintf(stderr, "out of memory\n");
      return 1;
    }
    double t0 = now(), c0 = cpu();
    int rc = tr_parse(b.s, b.n, &rs[r], err, sizeof err);
    read_s += now() - t0;
    read_cpu += cpu() - c0;
    if (rc) {
      fprintf(stderr, "rank %d: %s\n", r, err);
      return 1;
    }
  }
  free(b.s);
  ta_report rep;
  double t0 = now(), c0 = cpu();
  int rc = ta_analyze(rs, n, 0, &rep, err, sizeof err);
  double an_s = now() - t0, an_cpu = cpu() - c0;
  if (rc) {
    fprintf(stderr, "ta_analyze: %s\n", err);
    return 1;
  }
  printf("read %.2f s (CPU %.2f)  analysis %.2f s (CPU %.2f)  culprits %d: %.60s\n", read_s,
         read_cpu, an_s, an_cpu, rep.nculprits, rep.nculprits ? rep.culprits[0].text : "-");
  fflush(stdout);
  ta_report_free(&rep);
  tr_ranks_free(rs, n);
  return 0;
}

/* Run fn in a child; print its peak RSS, or that it ran out of time. */
static void in_child(const char *label, int limit, int (*fn)(void *), void *arg) {
  printf("%-28s ", label);
  fflush(stdout);
  double t0 = now();
  pid_t pid = fork();
  if (pid == 0) {
    alarm((unsigned)limit);
    _exit(fn(arg));
  }
  int st = 0;
  struct rusage ru;
  if (pid < 0 || wait4(pid, &st, 0, &ru) < 0) {
    printf("fork/wait failed\n");
    return;
  }
  if (WIFSIGNALED(st) && WTERMSIG(st) == SIGALRM)
    printf("did not finish in %d s\n", limit);
  else if (!WIFEXITED(st) || WEXITSTATUS(st))
    printf("failed\n");
  printf("%-28s peak RSS %.0f MB, wall %.1f s, CPU %.1f s (generation included)\n", "",
         (double)ru.ru_maxrss / 1024.0, now() - t0,
         (double)ru.ru_utime.tv_sec + 1e-6 * (double)ru.ru_utime.tv_usec +
             (double)ru.ru_stime.tv_sec + 1e-6 * (double)ru.ru_stime.tv_usec);
  fflush(stdout);
}

typedef struct hang_arg {
  int n;
  long entries;
  int one_group; /* every rank in one dp group (pp 1, tp 1) */
} hang_arg;

static int hang_gen(int r, tg_buf *b, void *arg) { return tg_hang_dump(arg, r, b); }

static int hang_main(void *arg) {
  const hang_arg *a = arg;
  int T = a->n >= 256 ? 8 : 4, P = a->n >= 4096 ? 8 : 4;
  if (a->one_group || a->n % (T * P)) T = 1, P = 1;
  tg_hang h;
  /* The culprit: a rank in the middle of stage 0. */
  if (tg_hang_plan(&h, P, a->n / (T * P), T, a->entries, (a->n / (T * P) / 2) * T + 1)) return 1;
  int rc = run_case(a->n, hang_gen, &h);
  tg_hang_free(&h);
  return rc;
}

typedef struct pipe_arg {
  long pairs, entries;
} pipe_arg;

static int pipe_gen(int r, tg_buf *b, void *arg) {
  const pipe_arg *a = arg;
  return tg_pipe_dump(a->pairs, a->entries, r, b);
}

static int pipe_main(void *arg) { return run_case(2, pipe_gen, arg); }

/* "64,256": the positive numbers of a comma-separated list (at most 16). */
static int parse_list(const char *s, long *v) {
  int n = 0;
  for (const char *p = s; *p && n < 16; p = strchr(p, ',') ? strchr(p, ',') + 1 : "")
    if ((v[n] = atol(p)) > 0) n++;
  return n;
}

int main(int argc, char **argv) {
  const char *ranks = "64,256,1024,4096", *pairs = "40000,160000,640000";
  long entries = 2048;
  int limit = 600, one_group = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--ranks") && i + 1 < argc) ranks = argv[++i];
    else if (!strcmp(argv[i], "--pairs") && i + 1 < argc) pairs = argv[++i];
    else if (!strcmp(argv[i], "--entries") && i + 1 < argc) entries = atol(argv[++i]);
    else if (!strcmp(argv[i], "--limit") && i + 1 < argc) limit = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--one-group")) one_group = 1;
    else {
      fprintf(stderr, "usage: %s [--ranks 64,256,1024,4096] [--entries 2048] "
              "[--pairs 40000,160000,640000] [--limit SECONDS] [--one-group]\n", argv[0]);
      return 2;
    }
  }
  long nr[16], np[16];
  int kr = parse_list(ranks, nr), kp = parse_list(pairs, np);
  char label[64];
  for (int k = 0; k < kr; k++) {
    hang_arg a = {(int)nr[k], entries, one_group};
    snprintf(label, sizeof label, "hang %d ranks x %ld%s", a.n, entries,
             one_group ? " (1 grp)" : "");
    in_child(label, limit, hang_main, &a);
  }
  for (int k = 0; k < kp; k++) {
    pipe_arg a = {np[k], entries};
    snprintf(label, sizeof label, "pipeline %ld pairs, ring %ld", a.pairs, entries);
    in_child(label, limit, pipe_main, &a);
  }
  return 0;
}
