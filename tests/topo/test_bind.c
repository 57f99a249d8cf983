/* Binding on the live machine: bind, then read the affinity back from the
 * kernel (sched_getaffinity), for the process and for one thread.  Works on
 * GPU nodes (ranks near their GPU) and on CPU-only machines (CPU ranks). */
#include <criterion/criterion.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "meshpg.h"

/* "0-3,8" -> cpu_set_t. */
static void parse_list(const char *list, cpu_set_t *set) {
  CPU_ZERO(set);
  const char *p = list;
  while (*p) {
    char *end;
    long a = strtol(p, &end, 10), b = a;
    cr_assert_neq(end, p, "bad list \"%s\"", list);
    if (*end == '-') b = strtol(end + 1, &end, 10);
    for (long i = a; i <= b; i++) CPU_SET((int)i, set);
    p = *end == ',' ? end + 1 : end;
  }
}

static void affinity(cpu_set_t *set) {
  CPU_ZERO(set);
  cr_assert_eq(sched_getaffinity(0, sizeof *set, set), 0);
}

static mpg_topo *live(void) {
  mpg_topo *t = NULL;
  cr_assert_eq(mpg_topo_load_live(&t), MPG_OK, "%s", mpg_last_error());
  cr_assert_eq(mpg_topo_is_this_system(t), 1);
  cr_assert_geq(mpg_topo_num_pus(t), 1);
  cr_assert_geq(mpg_topo_num_numa_nodes(t), 1);
  return t;
}

/* Ranks on this node for the test: one per GPU, or 2 CPU ranks. */
static int local_world(const mpg_topo *t) {
  int g = mpg_topo_num_gpus(t);
  return g > 0 ? g : 2;
}

Test(live, source_names_this_machine) {
  mpg_topo *t = live();
  cr_assert(strstr(mpg_topo_source(t), "this machine"), "%s", mpg_topo_source(t));
  for (int i = 0; i < mpg_topo_num_gpus(t); i++) {
    mpg_gpu_info g = MPG_GPU_INFO_INIT;
    cr_assert_eq(mpg_topo_get_gpu(t, i, &g), MPG_OK);
    cr_assert_eq(strlen(g.bus_id), 12, "%s", g.bus_id);
    cr_assert_gt(strlen(g.cpuset), 0);
    cr_log_info("GPU %d %s %s NUMA %d CPUs %s NICs %d", i, g.name, g.bus_id,
                g.numa_node, g.cpuset, g.num_nics);
  }
  mpg_topo_destroy(t);
}

Test(live, bind_numa_then_read_back) {
  mpg_topo *t = live();
  int lw = local_world(t);
  for (int r = 0; r < lw; r++) {
    mpg_binding b = MPG_BINDING_INIT;
    cr_assert_eq(mpg_topo_bind(t, r, lw, -1, MPG_BIND_NUMA, MPG_BIND_APPLY_PROCESS, &b), MPG_OK, "%s",
                 mpg_last_error());
    cr_assert_eq(b.applied, 1);
    cr_assert_eq(b.thread, 0);
    cr_assert_gt(b.num_pus, 0);
    cpu_set_t want, got;
    parse_list(b.cpuset, &want);
    affinity(&got);
    cr_assert(CPU_EQUAL(&want, &got), "rank %d: bound to %s, kernel says %d CPUs",
              r, b.cpuset, CPU_COUNT(&got));
  }
  mpg_topo_destroy(t);
}

Test(live, bind_core_disjoint_then_read_back) {
  mpg_topo *t = live();
  int lw = local_world(t);
  if (lw > mpg_topo_num_pus(t)) lw = mpg_topo_num_pus(t);
  cpu_set_t all;
  CPU_ZERO(&all);
  for (int r = 0; r < lw; r++) {
    mpg_binding b = MPG_BINDING_INIT;
    cr_assert_eq(mpg_topo_bind(t, r, lw, -1, MPG_BIND_CORE, MPG_BIND_APPLY_PROCESS, &b), MPG_OK, "%s",
                 mpg_last_error());
    cr_assert_eq(b.applied, 1);
    cpu_set_t want, got, both;
    parse_list(b.cpuset, &want);
    affinity(&got);
    cr_assert(CPU_EQUAL(&want, &got), "rank %d: bound to %s", r, b.cpuset);
    CPU_AND(&both, &all, &want);
    cr_assert_eq(CPU_COUNT(&both), 0, "rank %d's CPUs %s overlap another's", r,
                 b.cpuset);
    CPU_OR(&all, &all, &want);
  }
  mpg_topo_destroy(t);
}

typedef struct thread_arg {
  const mpg_topo *t;
  int lw;
  mpg_status st;
  mpg_binding b;
  cpu_set_t got;
} thread_arg;

static void *bind_in_thread(void *p) {
  thread_arg *a = p;
  a->st = mpg_topo_bind(a->t, a->lw - 1, a->lw, -1, MPG_BIND_CORE, MPG_BIND_APPLY_THREAD, &a->b);
  CPU_ZERO(&a->got);
  sched_getaffinity(0, sizeof a->got, &a->got);
  return NULL;
}

Test(live, bind_thread_leaves_other_threads_alone) {
  mpg_topo *t = live();
  int lw = local_world(t);
  if (lw > mpg_topo_num_pus(t)) lw = mpg_topo_num_pus(t);
  cpu_set_t before, after;
  affinity(&before);
  thread_arg a = {.t = t, .lw = lw, .b = MPG_BINDING_INIT};
  pthread_t th;
  cr_assert_eq(pthread_create(&th, NULL, bind_in_thread, &a), 0);
  pthread_join(th, NULL);
  cr_assert_eq(a.st, MPG_OK, "%s", mpg_last_error());
  cr_assert_eq(a.b.thread, 1);
  cr_assert_eq(a.b.applied, 1);
  cpu_set_t want;
  parse_list(a.b.cpuset, &want);
  cr_assert(CPU_EQUAL(&want, &a.got), "thread bound to %s", a.b.cpuset);
  affinity(&after);
  cr_assert(CPU_EQUAL(&before, &after), "the main thread's affinity changed");
  mpg_topo_destroy(t);
}

Test(live, bind_none_changes_nothing) {
  mpg_topo *t = live();
  cpu_set_t before, after;
  affinity(&before);
  mpg_binding b = MPG_BINDING_INIT;
  cr_assert_eq(mpg_topo_bind(t, 0, 1, -1, MPG_BIND_NONE, MPG_BIND_APPLY_PROCESS, &b), MPG_OK);
  cr_assert_eq(b.applied, 0);
  cr_assert_str_eq(b.cpuset, "");
  affinity(&after);
  cr_assert(CPU_EQUAL(&before, &after));
  mpg_topo_destroy(t);
}

Test(live, too_many_local_ranks) {
  mpg_topo *t = live();
  int g = mpg_topo_num_gpus(t);
  mpg_binding b = MPG_BINDING_INIT;
  if (g > 0) {
    cr_assert_eq(mpg_topo_bind(t, 0, g + 1, -1, MPG_BIND_NUMA, MPG_BIND_APPLY_PROCESS, &b), MPG_ERR_TOPO);
    char want[64];
    snprintf(want, sizeof want, "%d local ranks", g + 1);
    cr_assert(strstr(mpg_last_error(), want), "%s", mpg_last_error());
  } else {
    /* More CPU ranks than PUs cannot get disjoint CPUs. */
    int n = mpg_topo_num_pus(t) * 4 + 1;
    cr_assert_eq(mpg_topo_bind(t, 0, n, -1, MPG_BIND_CORE, MPG_BIND_APPLY_PROCESS, &b), MPG_ERR_TOPO);
    cr_assert(strstr(mpg_last_error(), "ranks share"), "%s", mpg_last_error());
  }
  mpg_topo_destroy(t);
}
