/* The API misuse catalogue: every public function of include/meshpg.h is
 * called wrongly (NULL arguments, structs not set up by their initializer
 * or with odd sizes, foreign handles, calls in the wrong order, counts that
 * overflow, negative ranks, positions and indices) and must return its
 * documented status with a precise, non-empty mpg_last_error() message,
 * never crash.  `every_function_of_the_header_is_exercised` reads the
 * header (MESHPG_HEADER) and this file (MESHPG_MISUSE_SRC) so that a new
 * MPG_API function without a misuse case fails the suite.
 *
 * What is detected and what is not:
 *  - Detected: NULL handles and out pointers; a versioned struct whose magic
 *    is wrong (never set up by its initializer); bad enum values; negative
 *    or too large ranks, positions, indices and counts; count x element
 *    size (x group size for all_gather / reduce_scatter / all_to_all, or
 *    displacement + count for all_to_all_v) overflowing size_t,
 *    before any memory is touched; calls in the wrong order on a mpg_sync
 *    (add_param after commit, commit twice, grad / begin / zero_grads /
 *    param_group before commit, mark_ready or finish without begin,
 *    mark_ready twice, begin twice); mpg_ctx_destroy while a mpg_sync
 *    still uses the context (MPG_ERR_STATE, nothing freed); a tied_group
 *    that belongs to another context; send/recv to oneself.
 *  - Accepted by design (the ABI rule): any `size` in a versioned struct,
 *    0 or 1 included: the library reads only what fits and defaults the rest.
 *  - Not detected (undefined behaviour, documented in the header): a
 *    destroyed handle (mesh, topo, placement, ctx, sync, work) - C gives no
 *    safe way to tell freed memory, and reading it would be the bug; a
 *    collective on a group of a destroyed context; buffers shorter than
 *    count elements. */
#include <criterion/criterion.h>
#include <math.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "meshpg.h"
#include "../support/mesh_util.h"
#include "../support/run_ranks.h"

/* ------------------------------------------------------------------ */
/* Checks                                                              */
/* ------------------------------------------------------------------ */

/* Main thread: the call returns `want` and mpg_last_error() contains sub. */
#define EXPECT(call, want, sub)                                                   \
  do {                                                                            \
    mpg_status st_ = (call);                                                      \
    const char *m_ = mpg_last_error();                                            \
    cr_expect_eq(st_, (want), "%s: expected %s, got %s (%s)", #call,              \
                 mpg_status_name(want), mpg_status_name(st_), m_);                \
    if ((want) != MPG_OK)                                                         \
      cr_expect(m_[0] && strstr(m_, (sub)), "%s: message \"%s\" lacks \"%s\"",    \
                #call, m_, (sub));                                                \
  } while (0)

/* Inside a rank of run_ranks (tests/support/run_ranks.h; not the test's
 * thread: no Criterion asserts): the first mismatch is recorded
 * (rank_fail, rank_check.h) and the rank returns; run_ranks asserts. */
#define R_EXPECT(call, want, sub)                                                 \
  do {                                                                            \
    mpg_status st_ = (call);                                                      \
    const char *m_ = mpg_last_error();                                            \
    if (st_ != (want) || ((want) != MPG_OK && !(m_[0] && strstr(m_, (sub)))))     \
      return rank_fail(__FILE__, __LINE__, "%s: expected %s with \"%s\", got %s (%s)", \
                       #call, mpg_status_name(want), (sub), mpg_status_name(st_), m_); \
  } while (0)

#define R_TRUE(cond) RCHECK(cond, "%s is false", #cond)

static char *slurp(const char *path) {
  FILE *f = fopen(path, "rb");
  cr_assert_not_null(f, "cannot open %s", path);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *s = malloc((size_t)n + 1);
  cr_assert_eq(fread(s, 1, (size_t)n, f), (size_t)n);
  s[n] = '\0';
  fclose(f);
  return s;
}

/* ------------------------------------------------------------------ */
/* The catalogue covers the header                                     */
/* ------------------------------------------------------------------ */

Test(api, every_function_of_the_header_is_exercised) {
  const char *hp = getenv("MESHPG_HEADER"), *sp = getenv("MESHPG_MISUSE_SRC");
  cr_assert(hp && sp, "MESHPG_HEADER / MESHPG_MISUSE_SRC not set (run via meson test)");
  char *header = slurp(hp), *src = slurp(sp);
  int declared = 0;
  char missing[4096] = "";
  for (char *line = header; line && *line;) {
    char *eol = strchr(line, '\n');
    if (eol) *eol = '\0';
    char *paren = strncmp(line, "MPG_API ", 8) == 0 ? strchr(line, '(') : NULL;
    if (paren) {
      char *start = paren;
      while (start > line && (start[-1] == '_' || (start[-1] >= 'a' && start[-1] <= 'z') ||
                              (start[-1] >= '0' && start[-1] <= '9')))
        start--;
      char call[80], arg[80];
      snprintf(call, sizeof call, "%.*s(", (int)(paren - start), start);
      snprintf(arg, sizeof arg, "%.*s,", (int)(paren - start), start);
      declared++;
      /* Called here, not only named in a comment: "name(" in the code, or
       * "name," passed to a checking macro such as EXPECT_FROM_SPEC. */
      if (!strstr(src, call) && !strstr(src, arg) &&
          strlen(missing) + strlen(call) + 2 < sizeof missing) {
        strcat(missing, " ");
        strcat(missing, call);
      }
    }
    line = eol ? eol + 1 : NULL;
  }
  cr_expect_gt(declared, 100, "only %d MPG_API functions found in %s", declared, hp);
  cr_expect_str_empty(missing, "functions without a misuse case:%s", missing);
  free(header);
  free(src);
}

/* ------------------------------------------------------------------ */
/* Versions, statuses, dtypes: cannot fail                             */
/* ------------------------------------------------------------------ */

Test(api, infallible_functions_give_their_neutral_values) {
  cr_expect_eq(mpg_version(), (unsigned)MPG_VERSION_HEX);
  cr_expect_str_eq(mpg_version_string(), "1.2.0");
  cr_expect_str_eq(mpg_strerror((mpg_status)-1), "unknown status");
  cr_expect_str_eq(mpg_strerror(MPG_STATUS_COUNT), "unknown status");
  cr_expect_str_eq(mpg_status_name((mpg_status)999), "UNKNOWN");
  cr_expect_str_eq(mpg_status_name((mpg_status)-5), "UNKNOWN");
  cr_expect_eq(mpg_dtype_size((mpg_dtype)-1), 0);
  cr_expect_eq(mpg_dtype_size((mpg_dtype)MPG_DTYPE_COUNT), 0);
  cr_expect_str_eq(mpg_dtype_name((mpg_dtype)-1), "?");
  cr_expect_str_eq(mpg_dtype_name((mpg_dtype)MPG_DTYPE_COUNT), "?");
  /* Nothing failed yet on this thread. */
  cr_expect_str_eq(mpg_last_error(), "");
}

/* ------------------------------------------------------------------ */
/* Spec                                                                */
/* ------------------------------------------------------------------ */

Test(api, spec_functions) {
  mpg_spec sp = MPG_SPEC_INIT, bad;
  memset(&bad, 0, sizeof bad); /* not from MPG_SPEC_INIT */
  EXPECT(mpg_spec_init(NULL), MPG_ERR_INVALID, "NULL");
  EXPECT(mpg_spec_init(&bad), MPG_ERR_INVALID, "MPG_SPEC_INIT");
  EXPECT(mpg_spec_load_file(NULL, &sp), MPG_ERR_INVALID, "NULL");
  EXPECT(mpg_spec_load_file("x.toml", NULL), MPG_ERR_INVALID, "NULL");
  EXPECT(mpg_spec_load_file("x.toml", &bad), MPG_ERR_INVALID, "MPG_SPEC_INIT");
  EXPECT(mpg_spec_load_file("/nonexistent/x.toml", &sp), MPG_ERR_IO, "/nonexistent/x.toml");
  EXPECT(mpg_spec_load_string(NULL, "n", &sp), MPG_ERR_INVALID, "NULL");
  EXPECT(mpg_spec_load_string("", "n", NULL), MPG_ERR_INVALID, "NULL");
  EXPECT(mpg_spec_load_string("", "n", &bad), MPG_ERR_INVALID, "MPG_SPEC_INIT");
  EXPECT(mpg_spec_set_mesh(NULL, "dp=2"), MPG_ERR_INVALID, "NULL");
  EXPECT(mpg_spec_set_mesh(&sp, NULL), MPG_ERR_INVALID, "NULL");
  EXPECT(mpg_spec_set_mesh(&bad, "dp=2"), MPG_ERR_INVALID, "MPG_SPEC_INIT");
  /* A size of -2 is well formed; validation refuses it. */
  EXPECT(mpg_spec_set_mesh(&sp, "dp=-2"), MPG_OK, "");
  EXPECT(mpg_spec_validate(&sp), MPG_ERR_SPEC, "-2");
  EXPECT(mpg_spec_set_mesh(&sp, "dp=99999999999"), MPG_ERR_SPEC, "99999999999");
  EXPECT(mpg_spec_add_flatten(NULL, "a", "dp"), MPG_ERR_INVALID, "NULL");
  EXPECT(mpg_spec_add_flatten(&sp, NULL, "dp"), MPG_ERR_INVALID, "NULL");
  EXPECT(mpg_spec_add_flatten(&sp, "a", NULL), MPG_ERR_INVALID, "NULL");
  EXPECT(mpg_spec_add_flatten(&bad, "a", "dp"), MPG_ERR_INVALID, "MPG_SPEC_INIT");
  EXPECT(mpg_spec_apply_order(NULL, "tp-dp"), MPG_ERR_INVALID, "NULL");
  EXPECT(mpg_spec_apply_order(&sp, NULL), MPG_ERR_INVALID, "NULL");
  EXPECT(mpg_spec_apply_order(&bad, "tp-dp"), MPG_ERR_INVALID, "MPG_SPEC_INIT");
  EXPECT(mpg_spec_set_experts(NULL, 1, 2, NULL), MPG_ERR_INVALID, "NULL");
  EXPECT(mpg_spec_set_experts(&bad, 1, 2, NULL), MPG_ERR_INVALID, "MPG_SPEC_INIT");
  EXPECT(mpg_spec_set_experts(&sp, 1, -2, NULL), MPG_ERR_SPEC, "experts.ep");
  EXPECT(mpg_spec_set_experts(&sp, -1, 2, NULL), MPG_ERR_SPEC, "experts.tp");
  EXPECT(mpg_spec_set_experts(&sp, 2, 0, NULL), MPG_ERR_SPEC, "ep = 0");
  EXPECT(mpg_spec_set_experts(&sp, 1, 2, "tp-xp-dp"), MPG_ERR_SPEC, "\"xp\"");
  EXPECT(mpg_spec_validate(NULL), MPG_ERR_INVALID, "NULL");
  EXPECT(mpg_spec_validate(&bad), MPG_ERR_INVALID, "MPG_SPEC_INIT");
  /* Odd sizes are the ABI rule at work, not errors: size 0 reads no
   * field (an empty mesh is then a spec error, not a crash). */
  mpg_spec odd = MPG_SPEC_INIT;
  cr_assert_eq(mpg_spec_set_mesh(&odd, "dp=2"), MPG_OK);
  odd.size = 0;
  EXPECT(mpg_spec_validate(&odd), MPG_ERR_SPEC, "dims");
  odd.size = 1;
  EXPECT(mpg_spec_validate(&odd), MPG_ERR_SPEC, "dims");
}

/* ------------------------------------------------------------------ */
/* Mesh                                                                */
/* ------------------------------------------------------------------ */

Test(api, mesh_functions) {
  mpg_spec sp = MPG_SPEC_INIT, bad;
  memset(&bad, 0, sizeof bad);
  cr_assert_eq(mpg_spec_set_mesh(&sp, "dp=2,tp=2"), MPG_OK);
  mpg_mesh *m = (mpg_mesh *)1;
  EXPECT(mpg_mesh_create(NULL, 0, &m), MPG_ERR_INVALID, "NULL");
  cr_expect_null(m, "*out is not NULL after a failure");
  EXPECT(mpg_mesh_create(&sp, 0, NULL), MPG_ERR_INVALID, "NULL");
  EXPECT(mpg_mesh_create(&bad, 0, &m), MPG_ERR_INVALID, "MPG_SPEC_INIT");
  EXPECT(mpg_mesh_create(&sp, -4, &m), MPG_ERR_SPEC, "-4");
  EXPECT(mpg_mesh_create(&sp, INT_MAX, &m), MPG_ERR_SPEC, "2147483647");
  EXPECT(mpg_mesh_destroy(NULL), MPG_OK, "");
  cr_expect_eq(mpg_mesh_world_size(NULL), 0);
  cr_expect_eq(mpg_mesh_ndims(NULL), 0);
  cr_expect_eq(mpg_mesh_num_dimsets(NULL), 0);
  cr_expect_eq(mpg_mesh_expert_ndims(NULL), 0);

  m = make_dims_mesh("dp=2,tp=2");
  const char *name;
  int size, set, dims[MPG_MAX_DIMS], nd, coord[2] = {0, 0}, rank, gi, pos, gs;
  EXPECT(mpg_mesh_dim(NULL, 0, &name, &size), MPG_ERR_INVALID, "mesh is NULL");
  EXPECT(mpg_mesh_dim(m, -1, &name, &size), MPG_ERR_RANGE, "dim -1");
  EXPECT(mpg_mesh_dim(m, 2, &name, &size), MPG_ERR_RANGE, "dim 2");
  EXPECT(mpg_mesh_expert_dim(NULL, 0, &name, &size), MPG_ERR_INVALID, "mesh is NULL");
  EXPECT(mpg_mesh_expert_dim(m, 0, &name, &size), MPG_ERR_NOT_FOUND, "no expert grid");
  cr_expect_eq(mpg_mesh_expert_ndims(m), 0);
  {
    mpg_spec es = MPG_SPEC_INIT;
    mpg_mesh *em = NULL;
    cr_assert_eq(mpg_spec_set_mesh(&es, "dp=2,tp=2"), MPG_OK);
    cr_assert_eq(mpg_spec_set_experts(&es, 1, 2, NULL), MPG_OK, "%s", mpg_last_error());
    cr_assert_eq(mpg_mesh_create(&es, 0, &em), MPG_OK, "%s", mpg_last_error());
    EXPECT(mpg_mesh_expert_dim(em, -1, &name, &size), MPG_ERR_RANGE, "dim -1");
    EXPECT(mpg_mesh_expert_dim(em, 4, &name, &size), MPG_ERR_RANGE, "dim 4");
    mpg_mesh_destroy(em);
  }
  EXPECT(mpg_mesh_dimset_find(NULL, "dp", &set), MPG_ERR_INVALID, "NULL");
  EXPECT(mpg_mesh_dimset_find(m, NULL, &set), MPG_ERR_INVALID, "NULL");
  EXPECT(mpg_mesh_dimset_find(m, "dp", NULL), MPG_ERR_INVALID, "NULL");
  EXPECT(mpg_mesh_dimset_find(m, "pp", &set), MPG_ERR_NOT_FOUND, "pp");
  EXPECT(mpg_mesh_dimset_info(NULL, 0, &name, &gs, &gi), MPG_ERR_INVALID, "mesh is NULL");
  EXPECT(mpg_mesh_dimset_info(m, -1, &name, &gs, &gi), MPG_ERR_RANGE, "dim set -1");
  EXPECT(mpg_mesh_dimset_info(m, INT_MAX, NULL, NULL, NULL), MPG_ERR_RANGE, "2147483647");
  EXPECT(mpg_mesh_dimset_dims(NULL, 0, dims, &nd), MPG_ERR_INVALID, "NULL");
  EXPECT(mpg_mesh_dimset_dims(m, 0, NULL, &nd), MPG_ERR_INVALID, "NULL");
  EXPECT(mpg_mesh_dimset_dims(m, -3, dims, &nd), MPG_ERR_RANGE, "dim set -3");
  EXPECT(mpg_mesh_coord_of(NULL, 0, coord), MPG_ERR_INVALID, "NULL");
  EXPECT(mpg_mesh_coord_of(m, 0, NULL), MPG_ERR_INVALID, "NULL");
  EXPECT(mpg_mesh_coord_of(m, -1, coord), MPG_ERR_RANGE, "rank -1");
  EXPECT(mpg_mesh_coord_of(m, 4, coord), MPG_ERR_RANGE, "rank 4");
  EXPECT(mpg_mesh_rank_of(NULL, coord, &rank), MPG_ERR_INVALID, "NULL");
  EXPECT(mpg_mesh_rank_of(m, NULL, &rank), MPG_ERR_INVALID, "NULL");
  EXPECT(mpg_mesh_rank_of(m, coord, NULL), MPG_ERR_INVALID, "NULL");
  int negc[2] = {0, -1};
  EXPECT(mpg_mesh_rank_of(m, negc, &rank), MPG_ERR_RANGE, "-1");
  EXPECT(mpg_mesh_group_of(NULL, 0, 0, &gi, &pos, &gs), MPG_ERR_INVALID, "mesh is NULL");
  EXPECT(mpg_mesh_group_of(m, -1, 0, &gi, &pos, &gs), MPG_ERR_RANGE, "dim set -1");
  EXPECT(mpg_mesh_group_of(m, 0, -1, &gi, &pos, &gs), MPG_ERR_RANGE, "rank -1");
  EXPECT(mpg_mesh_group_of(m, 0, INT_MAX, &gi, &pos, &gs), MPG_ERR_RANGE, "rank 2147483647");
  EXPECT(mpg_mesh_group_member(NULL, 0, 0, 0, &rank), MPG_ERR_INVALID, "NULL");
  EXPECT(mpg_mesh_group_member(m, 0, 0, 0, NULL), MPG_ERR_INVALID, "NULL");
  EXPECT(mpg_mesh_group_member(m, 0, -1, 0, &rank), MPG_ERR_RANGE, "-1");
  EXPECT(mpg_mesh_group_member(m, 0, 0, -1, &rank), MPG_ERR_RANGE, "-1");
  EXPECT(mpg_mesh_group_member(m, -2, 0, 0, &rank), MPG_ERR_RANGE, "-2");
  int ranks[4];
  EXPECT(mpg_mesh_group_members(NULL, 0, 0, ranks), MPG_ERR_INVALID, "NULL");
  EXPECT(mpg_mesh_group_members(m, 0, 0, NULL), MPG_ERR_INVALID, "NULL");
  EXPECT(mpg_mesh_group_members(m, 0, -1, ranks), MPG_ERR_RANGE, "-1");
  EXPECT(mpg_mesh_group_members(m, 0, 2, ranks), MPG_ERR_RANGE, "2");
  mpg_mesh_destroy(m);
}

/* ------------------------------------------------------------------ */
/* Topology                                                            */
/* ------------------------------------------------------------------ */

static const char *fixture(const char *name) {
  static char path[1024];
  const char *d = getenv("MESHPG_TEST_DATA");
  cr_assert_not_null(d);
  snprintf(path, sizeof path, "%s/topologies/%s", d, name);
  return path;
}

Test(api, topo_functions) {
  mpg_topo *t = (mpg_topo *)1;
  EXPECT(mpg_topo_load_live(NULL), MPG_ERR_INVALID, "NULL");
  EXPECT(mpg_topo_load_xml(NULL, &t), MPG_ERR_INVALID, "NULL");
  cr_expect_null(t);
  EXPECT(mpg_topo_load_xml("x.xml", NULL), MPG_ERR_INVALID, "NULL");
  EXPECT(mpg_topo_load_xml("/nonexistent.xml", &t), MPG_ERR_IO, "/nonexistent.xml");
  EXPECT(mpg_topo_load_synthetic(NULL, &t), MPG_ERR_INVALID, "NULL");
  EXPECT(mpg_topo_load_synthetic("pack:2", NULL), MPG_ERR_INVALID, "NULL");
  EXPECT(mpg_topo_load_synthetic("bogus:x", &t), MPG_ERR_TOPO, "bogus:x");
  EXPECT(mpg_topo_destroy(NULL), MPG_OK, "");
  cr_expect_str_eq(mpg_topo_source(NULL), "");
  cr_expect_eq(mpg_topo_is_this_system(NULL), 0);
  cr_expect_eq(mpg_topo_num_gpus(NULL), 0);
  cr_expect_eq(mpg_topo_num_numa_nodes(NULL), 0);
  cr_expect_eq(mpg_topo_num_packages(NULL), 0);
  cr_expect_eq(mpg_topo_num_cores(NULL), 0);
  cr_expect_eq(mpg_topo_num_pus(NULL), 0);
  cr_expect_eq(mpg_topo_has_gpu_fabric(NULL), 0);
  cr_expect_eq(mpg_topo_num_nics(NULL), 0);

  cr_assert_eq(mpg_topo_load_xml(fixture("dgx-h100.xml"), &t), MPG_OK, "%s",
               mpg_last_error());
  int ngpu = mpg_topo_num_gpus(t);
  cr_assert_gt(ngpu, 0);
  mpg_gpu_info gi = MPG_GPU_INFO_INIT, gbad;
  mpg_nic_info ni = MPG_NIC_INFO_INIT, nbad;
  mpg_binding b = MPG_BINDING_INIT, bbad;
  memset(&gbad, 0, sizeof gbad);
  memset(&nbad, 0, sizeof nbad);
  memset(&bbad, 0, sizeof bbad);
  EXPECT(mpg_topo_get_gpu(NULL, 0, &gi), MPG_ERR_INVALID, "NULL");
  EXPECT(mpg_topo_get_gpu(t, 0, NULL), MPG_ERR_INVALID, "NULL");
  EXPECT(mpg_topo_get_gpu(t, 0, &gbad), MPG_ERR_INVALID, "MPG_GPU_INFO_INIT");
  EXPECT(mpg_topo_get_gpu(t, -1, &gi), MPG_ERR_RANGE, "-1");
  EXPECT(mpg_topo_get_gpu(t, ngpu, &gi), MPG_ERR_RANGE, "GPU");
  /* An output struct of size 0 is left alone, and that is success. */
  mpg_gpu_info tiny = MPG_GPU_INFO_INIT;
  tiny.size = 0;
  EXPECT(mpg_topo_get_gpu(t, 0, &tiny), MPG_OK, "");
  cr_expect_eq(tiny.index, -1);
  EXPECT(mpg_topo_get_gpu_nic(NULL, 0, 0, &ni), MPG_ERR_INVALID, "NULL");
  EXPECT(mpg_topo_get_gpu_nic(t, 0, 0, NULL), MPG_ERR_INVALID, "NULL");
  EXPECT(mpg_topo_get_gpu_nic(t, 0, 0, &nbad), MPG_ERR_INVALID, "MPG_NIC_INFO_INIT");
  EXPECT(mpg_topo_get_gpu_nic(t, -1, 0, &ni), MPG_ERR_RANGE, "-1");
  EXPECT(mpg_topo_get_gpu_nic(t, 0, -1, &ni), MPG_ERR_RANGE, "-1");
  EXPECT(mpg_topo_get_gpu_nic(t, 0, 1000, &ni), MPG_ERR_RANGE, "1000");
  EXPECT(mpg_topo_get_nic(NULL, 0, &ni), MPG_ERR_INVALID, "NULL");
  EXPECT(mpg_topo_get_nic(t, 0, NULL), MPG_ERR_INVALID, "NULL");
  EXPECT(mpg_topo_get_nic(t, 0, &nbad), MPG_ERR_INVALID, "MPG_NIC_INFO_INIT");
  EXPECT(mpg_topo_get_nic(t, -1, &ni), MPG_ERR_RANGE, "-1");
  EXPECT(mpg_topo_get_nic(t, INT_MAX, &ni), MPG_ERR_RANGE, "2147483647");
  EXPECT(mpg_topo_bind(NULL, 0, 1, -1, MPG_BIND_NONE, MPG_BIND_APPLY_NONE, &b), MPG_ERR_INVALID, "NULL");
  EXPECT(mpg_topo_bind(t, 0, 1, -1, MPG_BIND_NONE, MPG_BIND_APPLY_NONE, NULL), MPG_ERR_INVALID, "NULL");
  EXPECT(mpg_topo_bind(t, 0, 1, -1, MPG_BIND_NONE, MPG_BIND_APPLY_NONE, &bbad), MPG_ERR_INVALID,
         "MPG_BINDING_INIT");
  EXPECT(mpg_topo_bind(t, 0, 1, -1, (mpg_bind)7, MPG_BIND_APPLY_NONE, &b), MPG_ERR_INVALID, "7");
  EXPECT(mpg_topo_bind(t, -1, 1, -1, MPG_BIND_NONE, MPG_BIND_APPLY_NONE, &b), MPG_ERR_RANGE, "-1");
  EXPECT(mpg_topo_bind(t, 1, 1, -1, MPG_BIND_NONE, MPG_BIND_APPLY_NONE, &b), MPG_ERR_RANGE, "1");
  EXPECT(mpg_topo_bind(t, 0, 0, -1, MPG_BIND_NONE, MPG_BIND_APPLY_NONE, &b), MPG_ERR_RANGE, "0");
  EXPECT(mpg_topo_bind(t, 0, -5, -1, MPG_BIND_NONE, MPG_BIND_APPLY_NONE, &b), MPG_ERR_RANGE, "-5");
  EXPECT(mpg_topo_bind(t, 0, 1, -2, MPG_BIND_NONE, MPG_BIND_APPLY_NONE, &b), MPG_ERR_RANGE, "-2");
  EXPECT(mpg_topo_bind(t, 0, 1, ngpu, MPG_BIND_NONE, MPG_BIND_APPLY_NONE, &b), MPG_ERR_RANGE, "GPU");
  EXPECT(mpg_topo_bind(t, 0, ngpu + 1, -1, MPG_BIND_NONE, MPG_BIND_APPLY_NONE, &b), MPG_ERR_TOPO, "GPU");
  EXPECT(mpg_topo_bind(NULL, 0, 1, -1, MPG_BIND_NONE, MPG_BIND_APPLY_PROCESS, &b), MPG_ERR_INVALID, "NULL");
  EXPECT(mpg_topo_bind(t, -1, 1, -1, MPG_BIND_NONE, MPG_BIND_APPLY_PROCESS, &b), MPG_ERR_RANGE, "-1");
  /* An XML topology is not this machine: binding it is refused. */
  EXPECT(mpg_topo_bind(t, 0, 1, -1, MPG_BIND_NUMA, MPG_BIND_APPLY_PROCESS, &b), MPG_ERR_TOPO, "not this machine");
  EXPECT(mpg_topo_bind(NULL, 0, 1, -1, MPG_BIND_NONE, MPG_BIND_APPLY_THREAD, &b), MPG_ERR_INVALID, "NULL");
  EXPECT(mpg_topo_bind(t, 0, 1, -1, MPG_BIND_NUMA, MPG_BIND_APPLY_THREAD, &bbad), MPG_ERR_INVALID,
         "MPG_BINDING_INIT");
  EXPECT(mpg_topo_bind(t, 0, 1, -1, MPG_BIND_NUMA, MPG_BIND_APPLY_THREAD, &b), MPG_ERR_TOPO,
         "not this machine");
  mpg_topo_destroy(t);

  char id[MPG_HOST_ID_MAX];
  EXPECT(mpg_topo_host_identity(NULL, sizeof id), MPG_ERR_INVALID, "NULL");
  EXPECT(mpg_topo_host_identity(id, 0), MPG_ERR_RANGE, "0");
  EXPECT(mpg_topo_host_identity(id, 1), MPG_ERR_RANGE, "1");
  const char *ids[2] = {"a", NULL};
  int node_of[2], lr[2], nn;
  EXPECT(mpg_topo_node_ids(0, ids, node_of, lr, &nn), MPG_ERR_RANGE, "0");
  EXPECT(mpg_topo_node_ids(-1, ids, node_of, lr, &nn), MPG_ERR_RANGE, "-1");
  EXPECT(mpg_topo_node_ids(2, NULL, node_of, lr, &nn), MPG_ERR_INVALID, "NULL");
  EXPECT(mpg_topo_node_ids(2, ids, NULL, lr, &nn), MPG_ERR_INVALID, "NULL");
  EXPECT(mpg_topo_node_ids(2, ids, node_of, lr, &nn), MPG_ERR_INVALID, "1");
}

/* ------------------------------------------------------------------ */
/* Placement                                                           */
/* ------------------------------------------------------------------ */

Test(api, placement_functions) {
  mpg_placement_opts po = MPG_PLACEMENT_OPTS_INIT, pbad;
  memset(&pbad, 0, sizeof pbad);
  mpg_mesh *m = make_dims_mesh("dp=2,tp=2");
  mpg_placement *p = (mpg_placement *)1;
  EXPECT(mpg_placement_create(NULL, &po, &p), MPG_ERR_INVALID, "NULL");
  cr_expect_null(p);
  EXPECT(mpg_placement_create(m, &po, NULL), MPG_ERR_INVALID, "NULL");
  EXPECT(mpg_placement_create(m, &pbad, &p), MPG_ERR_INVALID, "MPG_PLACEMENT_OPTS_INIT");
  po.topology.nodes = -2;
  EXPECT(mpg_placement_create(m, &po, &p), MPG_ERR_RANGE, "-2");
  po.topology.nodes = 0;
  po.topology.gpus_per_node = -1;
  EXPECT(mpg_placement_create(m, &po, &p), MPG_ERR_RANGE, "-1");
  po.topology.gpus_per_node = 0;
  int node_of[4] = {0, 0, -1, 1};
  po.node_of = node_of;
  EXPECT(mpg_placement_create(m, &po, &p), MPG_ERR_RANGE, "-1");
  po.node_of = NULL;
  po.inner_dims = "pp";
  EXPECT(mpg_placement_create(m, &po, &p), MPG_ERR_NOT_FOUND, "pp");
  po.inner_dims = NULL;
  EXPECT(mpg_placement_destroy(NULL), MPG_OK, "");
  cr_expect_eq(mpg_placement_num_nodes(NULL), 0);
  cr_expect_eq(mpg_placement_dimset_is_inner(NULL, 0), 0);

  po.topology.nodes = 2;
  cr_assert_eq(mpg_placement_create(m, &po, &p), MPG_OK, "%s", mpg_last_error());
  int lr, node, gpu, mr, nn, mis;
  EXPECT(mpg_placement_of(NULL, 0, &lr, &node, &gpu), MPG_ERR_INVALID, "NULL");
  EXPECT(mpg_placement_of(p, -1, &lr, &node, &gpu), MPG_ERR_RANGE, "-1");
  EXPECT(mpg_placement_of(p, 4, &lr, &node, &gpu), MPG_ERR_RANGE, "4");
  EXPECT(mpg_placement_mesh_rank(NULL, 0, &mr), MPG_ERR_INVALID, "NULL");
  EXPECT(mpg_placement_mesh_rank(p, -1, &mr), MPG_ERR_RANGE, "-1");
  EXPECT(mpg_placement_mesh_rank(p, INT_MAX, &mr), MPG_ERR_RANGE, "2147483647");
  EXPECT(mpg_placement_group_nodes(NULL, 0, 0, &nn), MPG_ERR_INVALID, "NULL");
  EXPECT(mpg_placement_group_nodes(p, 0, 0, NULL), MPG_ERR_INVALID, "NULL");
  EXPECT(mpg_placement_group_nodes(p, -1, 0, &nn), MPG_ERR_RANGE, "-1");
  EXPECT(mpg_placement_group_nodes(p, 0, -1, &nn), MPG_ERR_RANGE, "-1");
  cr_expect_eq(mpg_placement_dimset_is_inner(p, -1), 0);
  cr_expect_eq(mpg_placement_dimset_is_inner(p, 1000), 0);
  EXPECT(mpg_placement_check(NULL, 0, &mis), MPG_ERR_INVALID, "NULL");
  mpg_placement_destroy(p);
  mpg_mesh_destroy(m);
}

/* ------------------------------------------------------------------ */
/* Launch, init options, thread runs                                   */
/* ------------------------------------------------------------------ */

static mpg_status noop_rank(const mpg_init_opts *o, void *a) {
  (void)o;
  (void)a;
  return MPG_OK;
}

Test(api, launch_and_thread_run) {
  mpg_launch l = MPG_LAUNCH_INIT, lbad;
  memset(&lbad, 0, sizeof lbad);
  EXPECT(mpg_launch_from_env(NULL), MPG_ERR_INVALID, "NULL");
  EXPECT(mpg_launch_from_env(&lbad), MPG_ERR_INVALID, "MPG_LAUNCH_INIT");
  (void)l;
  EXPECT(mpg_thread_run(0, 1.0, noop_rank, NULL, NULL), MPG_ERR_INVALID, "nranks is 0");
  EXPECT(mpg_thread_run(-3, 1.0, noop_rank, NULL, NULL), MPG_ERR_INVALID, "nranks is -3");
  EXPECT(mpg_thread_run(4097, 1.0, noop_rank, NULL, NULL), MPG_ERR_INVALID, "4097");
  EXPECT(mpg_thread_run(1, 0.0, noop_rank, NULL, NULL), MPG_ERR_INVALID, "timeout_s");
  EXPECT(mpg_thread_run(1, -1.0, noop_rank, NULL, NULL), MPG_ERR_INVALID, "timeout_s");
  EXPECT(mpg_thread_run(1, 1.0, NULL, NULL, NULL), MPG_ERR_INVALID, "main is NULL");
}

Test(api, ctx_create_misuse) {
  mpg_mesh *m = make_dims_mesh("dp=2");
  mpg_ctx *c = (mpg_ctx *)1;
  mpg_init_opts io = MPG_INIT_OPTS_INIT, ibad;
  memset(&ibad, 0, sizeof ibad);
  EXPECT(mpg_ctx_create(m, &io, NULL), MPG_ERR_INVALID, "out is NULL");
  EXPECT(mpg_ctx_create(NULL, &io, &c), MPG_ERR_INVALID, "mesh is NULL");
  cr_expect_null(c);
  EXPECT(mpg_ctx_create(m, &ibad, &c), MPG_ERR_INVALID, "MPG_INIT_OPTS_INIT");
  /* The thread backend outside mpg_thread_run. */
  EXPECT(mpg_ctx_create(m, &io, &c), MPG_ERR_INVALID, "thread_world");
  /* Size 0 reads no field (the ABI rule): every default, the same error. */
  mpg_init_opts zero = MPG_INIT_OPTS_INIT;
  zero.size = 0;
  EXPECT(mpg_ctx_create(m, &zero, &c), MPG_ERR_INVALID, "thread_world");
  io.backend.name = (mpg_backend_kind)9;
  EXPECT(mpg_ctx_create(m, &io, &c), MPG_ERR_UNSUPPORTED, "backend");
  EXPECT(mpg_ctx_destroy(NULL), MPG_OK, "");
  cr_expect_eq(mpg_ctx_status(NULL), MPG_ERR_INVALID);
  EXPECT(mpg_ctx_abort(NULL), MPG_ERR_INVALID, "NULL");
  EXPECT(mpg_ctx_trace_dump(NULL, "/tmp"), MPG_ERR_INVALID, "NULL");
  EXPECT(mpg_ctx_set_timeout(NULL, 1), MPG_ERR_INVALID, "NULL");
  EXPECT(mpg_ctx_check_order(NULL), MPG_ERR_INVALID, "NULL");
  cr_expect_eq(mpg_ctx_rank(NULL), -1);
  cr_expect_eq(mpg_ctx_launcher_rank(NULL), -1);
  cr_expect_eq(mpg_ctx_num_nodes(NULL), 0);
  cr_expect_eq(mpg_ctx_world_size(NULL), 0);
  cr_expect_eq(mpg_ctx_local_rank(NULL), -1);
  cr_expect_eq(mpg_ctx_backend(NULL), MPG_BACKEND_THREAD);
  cr_expect_null(mpg_ctx_mesh(NULL));
  mpg_binding b = MPG_BINDING_INIT;
  EXPECT(mpg_ctx_get_binding(NULL, &b), MPG_ERR_INVALID, "NULL");
  mpg_group *g = (mpg_group *)1;
  EXPECT(mpg_ctx_group(NULL, "dp", &g), MPG_ERR_INVALID, "NULL");
  EXPECT(mpg_ctx_group_at(NULL, 0, &g), MPG_ERR_INVALID, "NULL");
  EXPECT(mpg_ctx_group_dims(NULL, "dp", &g), MPG_ERR_INVALID, "NULL");
  int pos0 = 0;
  EXPECT(mpg_ctx_group_select(NULL, "dp", &pos0, 1, &g), MPG_ERR_INVALID, "NULL");
  EXPECT(mpg_ctx_group_partial(NULL, "dp", 1, MPG_PARTIAL_INTRA, &g), MPG_ERR_INVALID, "NULL");
  void *ptr = NULL;
  EXPECT(mpg_ctx_mem_alloc(NULL, 8, 0, &ptr), MPG_ERR_INVALID, "NULL");
  EXPECT(mpg_ctx_mem_free(NULL, ptr), MPG_ERR_INVALID, "ctx is NULL");
  EXPECT(mpg_ctx_mem_zero(NULL, ptr, 8, NULL), MPG_ERR_INVALID, "NULL");
  EXPECT(mpg_ctx_stream_create(NULL, &ptr), MPG_ERR_INVALID, "NULL");
  EXPECT(mpg_ctx_stream_destroy(NULL, NULL), MPG_ERR_INVALID, "ctx is NULL");
  EXPECT(mpg_ctx_stream_order(NULL, NULL, NULL), MPG_ERR_INVALID, "ctx is NULL");
  cr_expect_str_eq(mpg_group_name(NULL), "");
  cr_expect_eq(mpg_group_position(NULL), -1);
  cr_expect_eq(mpg_group_size(NULL), 0);
  cr_expect_eq(mpg_group_index(NULL), -1);
  int r;
  EXPECT(mpg_group_member(NULL, 0, &r), MPG_ERR_INVALID, "NULL");
  float f[2];
  EXPECT(mpg_all_reduce(NULL, f, f, 2, MPG_F32, MPG_OP_SUM, NULL, NULL), MPG_ERR_INVALID,
         "group is NULL");
  EXPECT(mpg_all_reduce_scaled(NULL, f, f, 2, MPG_F32, 0.5, NULL, NULL), MPG_ERR_INVALID,
         "group is NULL");
  EXPECT(mpg_broadcast(NULL, f, 2, MPG_F32, 0, NULL, NULL), MPG_ERR_INVALID, "group is NULL");
  EXPECT(mpg_all_gather(NULL, f, f, 1, MPG_F32, NULL, NULL), MPG_ERR_INVALID, "group is NULL");
  EXPECT(mpg_reduce_scatter(NULL, f, f, 1, MPG_F32, MPG_OP_SUM, NULL, NULL), MPG_ERR_INVALID,
         "group is NULL");
  EXPECT(mpg_reduce_scatter_scaled(NULL, f, f, 1, MPG_F32, 0.5, NULL, NULL),
         MPG_ERR_INVALID, "group is NULL");
  EXPECT(mpg_barrier(NULL, NULL), MPG_ERR_INVALID, "group is NULL");
  size_t a2c[2] = {1, 1}, a2d[2] = {0, 1};
  EXPECT(mpg_all_to_all(NULL, f, f, 1, MPG_F32, NULL, NULL), MPG_ERR_INVALID,
         "group is NULL");
  EXPECT(mpg_all_to_all_v(NULL, f, a2c, a2d, f, a2c, a2d, MPG_F32, NULL, NULL),
         MPG_ERR_INVALID, "group is NULL");
  EXPECT(mpg_send(NULL, f, 2, MPG_F32, 1, NULL, NULL), MPG_ERR_INVALID, "group is NULL");
  EXPECT(mpg_recv(NULL, f, 2, MPG_F32, 1, NULL, NULL), MPG_ERR_INVALID, "group is NULL");
  mpg_p2p_op pop = {MPG_P2P_SEND, 1, f, 2, MPG_F32};
  EXPECT(mpg_p2p_batch(NULL, &pop, 1, NULL, NULL), MPG_ERR_INVALID, "group is NULL");
  EXPECT(mpg_p2p_batch(NULL, NULL, 0, NULL, NULL), MPG_ERR_INVALID, "group is NULL");
  EXPECT(mpg_work_wait(NULL), MPG_OK, "");
  int done;
  /* NULL is work that finished already: done, like mpg_work_wait(NULL). */
  done = 0;
  EXPECT(mpg_work_test(NULL, &done), MPG_OK, "");
  cr_expect_eq(done, 1);
  mpg_mesh_destroy(m);
}

/* ------------------------------------------------------------------ */
/* A context and its groups: 2 thread ranks, mesh dp=2                 */
/* ------------------------------------------------------------------ */

/* mpg_p2p_batch(g) of the two ops pb with ops[i] replaced by op. */
static mpg_status batch_with(mpg_group *g, const mpg_p2p_op *pb, int i, mpg_p2p_op op) {
  mpg_p2p_op ops[2] = {pb[0], pb[1]};
  ops[i] = op;
  return mpg_p2p_batch(g, ops, 2, NULL, NULL);
}

/* On run_ranks' context, which it destroys after (MPG_OK asserted). */
static mpg_status ctx_rank(rr_rank *rk) {
  int rank = rk->rank;
  mpg_ctx *c = rk->ctx;
  mpg_binding bbad;
  memset(&bbad, 0, sizeof bbad);
  R_EXPECT(mpg_ctx_get_binding(c, NULL), MPG_ERR_INVALID, "NULL");
  R_EXPECT(mpg_ctx_get_binding(c, &bbad), MPG_ERR_INVALID, "MPG_BINDING_INIT");
  mpg_group *g = (mpg_group *)1;
  R_EXPECT(mpg_ctx_group(c, NULL, &g), MPG_ERR_INVALID, "NULL");
  R_EXPECT(mpg_ctx_group(c, "dp", NULL), MPG_ERR_INVALID, "NULL");
  R_EXPECT(mpg_ctx_group(c, "pp", &g), MPG_ERR_NOT_FOUND, "pp");
  R_TRUE(g == NULL);
  R_EXPECT(mpg_ctx_group_at(c, -1, &g), MPG_ERR_RANGE, "-1");
  R_EXPECT(mpg_ctx_group_at(c, 1000, &g), MPG_ERR_RANGE, "1000");
  R_EXPECT(mpg_ctx_group_dims(c, NULL, &g), MPG_ERR_INVALID, "NULL");
  R_EXPECT(mpg_ctx_group_dims(c, "", &g), MPG_ERR_INVALID, "no dims named");
  R_EXPECT(mpg_ctx_group_dims(c, "dp,,dp", &g), MPG_ERR_INVALID, "empty");
  R_EXPECT(mpg_ctx_group_dims(c, "xx", &g), MPG_ERR_NOT_FOUND, "xx");
  int neg[2] = {-1, 0}, dec[2] = {1, 0}, big[1] = {2};
  R_EXPECT(mpg_ctx_group_select(c, "dp", NULL, 1, &g), MPG_ERR_INVALID, "NULL");
  R_EXPECT(mpg_ctx_group_select(c, "dp", neg, 2, &g), MPG_ERR_RANGE, "position -1");
  R_EXPECT(mpg_ctx_group_select(c, "dp", big, 1, &g), MPG_ERR_RANGE, "position 2");
  R_EXPECT(mpg_ctx_group_select(c, "dp", dec, 2, &g), MPG_ERR_INVALID, "increasing");
  R_EXPECT(mpg_ctx_group_select(c, "dp", big, 0, &g), MPG_ERR_RANGE, "found 0");
  R_EXPECT(mpg_ctx_group_select(c, "dp", big, -1, &g), MPG_ERR_RANGE, "found -1");
  R_EXPECT(mpg_ctx_group_partial(c, "dp", 1, MPG_PARTIAL_INTRA, NULL), MPG_ERR_INVALID, "NULL");
  R_EXPECT(mpg_ctx_group_partial(c, NULL, 1, MPG_PARTIAL_INTRA, &g), MPG_ERR_INVALID, "NULL");
  R_EXPECT(mpg_ctx_group_partial(c, "dp", 3, MPG_PARTIAL_INTRA, &g), MPG_ERR_RANGE,
           "instances 3 does not divide the group size 2");
  R_EXPECT(mpg_ctx_group_partial(c, "dp", 0, MPG_PARTIAL_INTER, &g), MPG_ERR_RANGE, "instances 0");
  R_EXPECT(mpg_ctx_group_partial(c, "dp", 1, (mpg_partial)7, &g), MPG_ERR_INVALID, "which is 7");
  R_EXPECT(mpg_ctx_group_partial(c, "xx", 1, MPG_PARTIAL_INTRA, &g), MPG_ERR_NOT_FOUND, "xx");
  R_EXPECT(mpg_ctx_mem_alloc(c, 8, 0, NULL), MPG_ERR_INVALID, "NULL");
  R_EXPECT(mpg_ctx_mem_zero(c, NULL, 8, NULL), MPG_ERR_INVALID, "NULL");
  R_EXPECT(mpg_ctx_stream_create(c, NULL), MPG_ERR_INVALID, "NULL");

  R_EXPECT(mpg_ctx_group(c, "dp", &g), MPG_OK, "");
  int r;
  R_EXPECT(mpg_group_member(g, 0, NULL), MPG_ERR_INVALID, "NULL");
  R_EXPECT(mpg_group_member(g, -1, &r), MPG_ERR_RANGE, "position -1");
  R_EXPECT(mpg_group_member(g, 2, &r), MPG_ERR_RANGE, "position 2");
  float f[4] = {0};
  int peer = 1 - rank;
  /* Bad buffers, dtypes, ops, roots and peers fail before anything moves. */
  R_EXPECT(mpg_all_reduce(g, NULL, f, 4, MPG_F32, MPG_OP_SUM, NULL, NULL), MPG_ERR_INVALID,
           "send buffer is NULL");
  R_EXPECT(mpg_all_reduce(g, f, NULL, 4, MPG_F32, MPG_OP_SUM, NULL, NULL), MPG_ERR_INVALID,
           "receive buffer is NULL");
  R_EXPECT(mpg_all_reduce(g, f, f, 4, (mpg_dtype)-1, MPG_OP_SUM, NULL, NULL),
           MPG_ERR_INVALID, "unknown dtype -1");
  R_EXPECT(mpg_all_reduce(g, f, f, 4, MPG_F32, (mpg_op)17, NULL, NULL), MPG_ERR_INVALID,
           "unknown op 17");
  R_EXPECT(mpg_all_reduce(g, f, f, 4, MPG_F32, (mpg_op)4 /* internal pre-multiplied sum */, NULL, NULL),
           MPG_ERR_INVALID, "mpg_all_reduce_scaled");
  R_EXPECT(mpg_all_reduce_scaled(g, f, f, 4, MPG_I32, 0.5, NULL, NULL), MPG_ERR_INVALID,
           "floating dtype");
  R_EXPECT(mpg_all_reduce_scaled(g, NULL, f, 4, MPG_F32, 0.5, NULL, NULL), MPG_ERR_INVALID,
           "NULL");
  R_EXPECT(mpg_broadcast(g, f, 4, MPG_F32, -1, NULL, NULL), MPG_ERR_INVALID, "root -1");
  R_EXPECT(mpg_broadcast(g, f, 4, MPG_F32, 2, NULL, NULL), MPG_ERR_INVALID, "root 2");
  R_EXPECT(mpg_broadcast(g, NULL, 4, MPG_F32, 0, NULL, NULL), MPG_ERR_INVALID, "NULL");
  R_EXPECT(mpg_all_gather(g, NULL, f, 2, MPG_F32, NULL, NULL), MPG_ERR_INVALID, "NULL");
  R_EXPECT(mpg_reduce_scatter(g, f, f, 2, MPG_F32, (mpg_op)4 /* internal pre-multiplied sum */, NULL, NULL),
           MPG_ERR_INVALID, "mpg_reduce_scatter_scaled");
  /* all_to_all: buffers, dtype, overlap (never in place), own counts;
   * nothing is posted, so nothing needs the peer. */
  float a2s[4] = {0}, a2r[4] = {0};
  size_t a2c[2] = {2, 2}, a2d[2] = {0, 2}, a2z[2] = {0, 0};
  R_EXPECT(mpg_all_to_all(g, NULL, a2r, 2, MPG_F32, NULL, NULL), MPG_ERR_INVALID,
           "send buffer is NULL");
  R_EXPECT(mpg_all_to_all(g, a2s, NULL, 2, MPG_F32, NULL, NULL), MPG_ERR_INVALID,
           "receive buffer is NULL");
  R_EXPECT(mpg_all_to_all(g, a2s, a2r, 2, (mpg_dtype)9, NULL, NULL), MPG_ERR_INVALID,
           "unknown dtype 9");
  R_EXPECT(mpg_all_to_all(g, f, f, 2, MPG_F32, NULL, NULL), MPG_ERR_INVALID,
           "never in place");
  R_EXPECT(mpg_all_to_all_v(g, a2s, NULL, a2d, a2r, a2c, a2d, MPG_F32, NULL, NULL),
           MPG_ERR_INVALID, "send_counts is NULL");
  R_EXPECT(mpg_all_to_all_v(g, a2s, a2c, a2d, a2r, a2c, NULL, MPG_F32, NULL, NULL),
           MPG_ERR_INVALID, "recv_displs is NULL");
  R_EXPECT(mpg_all_to_all_v(g, a2s, a2c, a2d, a2r, a2z, a2d, MPG_F32, NULL, NULL),
           MPG_ERR_INVALID, "sends itself");
  R_EXPECT(mpg_all_to_all_v(g, a2s, a2c, a2d, a2r, a2c, a2d, (mpg_dtype)-1, NULL, NULL),
           MPG_ERR_INVALID, "unknown dtype -1");
  R_EXPECT(mpg_send(g, f, 4, MPG_F32, -1, NULL, NULL), MPG_ERR_INVALID, "peer -1");
  R_EXPECT(mpg_send(g, f, 4, MPG_F32, rank, NULL, NULL), MPG_ERR_INVALID, "another member");
  R_EXPECT(mpg_send(g, NULL, 4, MPG_F32, peer, NULL, NULL), MPG_ERR_INVALID, "NULL");
  R_EXPECT(mpg_recv(g, f, 4, MPG_F32, 2, NULL, NULL), MPG_ERR_INVALID, "peer 2");
  R_EXPECT(mpg_recv(g, NULL, 4, MPG_F32, peer, NULL, NULL), MPG_ERR_INVALID, "NULL");
  /* mpg_p2p_batch: each bad operation is named by its index; the good
   * operation before it is never posted (the batch that follows, and the
   * peer's, would otherwise mismatch). */
  mpg_p2p_op pb[2] = {{MPG_P2P_SEND, peer, f, 4, MPG_F32}, {MPG_P2P_RECV, peer, f, 4, MPG_F32}};
  mpg_work *pw = (mpg_work *)&pw;
  R_EXPECT(mpg_p2p_batch(g, pb, -1, NULL, &pw), MPG_ERR_INVALID, "n is -1");
  R_TRUE(pw == NULL);
  R_EXPECT(mpg_p2p_batch(g, NULL, 2, NULL, NULL), MPG_ERR_INVALID, "ops is NULL");
  /* pb with one op replaced, one case a line. */
  const mpg_p2p_kind RECV = MPG_P2P_RECV;
  R_EXPECT(batch_with(g, pb, 1, (mpg_p2p_op){RECV, 2, f, 4, MPG_F32}), MPG_ERR_INVALID,
           "ops[1] (recv): peer 2");
  R_EXPECT(batch_with(g, pb, 1, (mpg_p2p_op){RECV, -1, f, 4, MPG_F32}), MPG_ERR_INVALID,
           "ops[1] (recv): peer -1");
  R_EXPECT(batch_with(g, pb, 1, (mpg_p2p_op){RECV, rank, f, 4, MPG_F32}), MPG_ERR_INVALID,
           "not another member");
  R_EXPECT(batch_with(g, pb, 1, (mpg_p2p_op){(mpg_p2p_kind)2, peer, f, 4, MPG_F32}),
           MPG_ERR_INVALID, "ops[1].kind is 2");
  R_EXPECT(batch_with(g, pb, 1, (mpg_p2p_op){RECV, peer, NULL, 4, MPG_F32}), MPG_ERR_INVALID,
           "ops[1] (recv): buf is NULL");
  R_EXPECT(batch_with(g, pb, 1, (mpg_p2p_op){RECV, peer, f, 4, (mpg_dtype)9}), MPG_ERR_INVALID,
           "unknown dtype 9");
  R_EXPECT(batch_with(g, pb, 0, (mpg_p2p_op){MPG_P2P_SEND, peer, f, SIZE_MAX / 2, MPG_F32}),
           MPG_ERR_RANGE, "ops[0] (send): count");
  R_EXPECT(mpg_p2p_batch(g, pb, 0, NULL, &pw), MPG_OK, ""); /* n == 0: a no-op */
  R_TRUE(pw == NULL);
  /* Counts whose byte size overflows size_t fail before touching the
   * (tiny) buffers; so do all_gather / reduce_scatter counts whose total
   * (x group size) overflows. */
  size_t huge = SIZE_MAX / 2;
  R_EXPECT(mpg_all_reduce(g, f, f, huge, MPG_F32, MPG_OP_SUM, NULL, NULL), MPG_ERR_RANGE,
           "overflows");
  R_EXPECT(mpg_all_reduce_scaled(g, f, f, SIZE_MAX, MPG_F64, 0.5, NULL, NULL), MPG_ERR_RANGE,
           "overflows");
  R_EXPECT(mpg_broadcast(g, f, huge, MPG_I64, 0, NULL, NULL), MPG_ERR_RANGE, "overflows");
  R_EXPECT(mpg_all_gather(g, f, f, SIZE_MAX / 6, MPG_F32, NULL, NULL), MPG_ERR_RANGE,
           "overflows");
  R_EXPECT(mpg_reduce_scatter(g, f, f, SIZE_MAX / 6, MPG_F32, MPG_OP_SUM, NULL, NULL),
           MPG_ERR_RANGE, "overflows");
  R_EXPECT(mpg_send(g, f, huge + 1, MPG_BF16, peer, NULL, NULL), MPG_ERR_RANGE,
           "overflows");
  R_EXPECT(mpg_all_to_all(g, f, f, SIZE_MAX / 6, MPG_F32, NULL, NULL), MPG_ERR_RANGE,
           "overflows");
  size_t a2big[2] = {SIZE_MAX / 8, 1}, a2one[2] = {1, 1};
  R_EXPECT(mpg_all_to_all_v(g, f, a2one, a2big, f + 2, a2one, a2c, MPG_F64, NULL, NULL),
           MPG_ERR_RANGE, "send_displs[0] + send_counts[0]");
  R_EXPECT(mpg_recv(g, f, SIZE_MAX, MPG_F16, peer, NULL, NULL), MPG_ERR_RANGE, "overflows");
  int done;
  R_EXPECT(mpg_work_test(NULL, NULL), MPG_ERR_INVALID, "NULL");
  mpg_work *w = NULL;
  R_EXPECT(mpg_barrier(g, &w), MPG_OK, "");
  R_EXPECT(mpg_work_test(w, NULL), MPG_ERR_INVALID, "done is NULL");
  R_EXPECT(mpg_work_wait(w), MPG_OK, "");
  (void)done;
  /* A timeout that is not > 0 (or not finite) is refused, and the old one
   * stays. */
  R_EXPECT(mpg_ctx_set_timeout(c, 0), MPG_ERR_INVALID, "timeout_s is 0");
  R_EXPECT(mpg_ctx_set_timeout(c, -2), MPG_ERR_INVALID, "expected > 0");
  R_EXPECT(mpg_ctx_set_timeout(c, NAN), MPG_ERR_INVALID, "timeout_s");
  R_EXPECT(mpg_ctx_set_timeout(c, 1e300), MPG_ERR_INVALID, "1e9");
  R_EXPECT(mpg_ctx_set_timeout(c, 30), MPG_OK, "");
  /* No directory given and none set: refused, nothing written. */
  R_EXPECT(mpg_ctx_trace_dump(c, NULL), MPG_ERR_INVALID, "no trace directory");
  R_EXPECT(mpg_ctx_trace_dump(c, "/proc/no-such-dir/x"), MPG_ERR_IO, "/proc/no-such-dir/x");
  /* After an abort every collective says so, and the context reports it. */
  R_EXPECT(mpg_barrier(g, NULL), MPG_OK, "");
  R_EXPECT(mpg_ctx_abort(c), MPG_OK, "");
  R_EXPECT(mpg_all_reduce(g, f, f, 1, MPG_F32, MPG_OP_SUM, NULL, NULL), MPG_ERR_ABORTED,
           "aborted");
  R_TRUE(mpg_ctx_status(c) == MPG_ERR_ABORTED);
  R_EXPECT(mpg_ctx_check_order(c), MPG_ERR_ABORTED, "aborted");
  return MPG_OK;
}

Test(api, ctx_groups_and_collectives) { run_ranks("dp=2", 0, ctx_rank, NULL); }

/* ------------------------------------------------------------------ */
/* Sync: arguments, wrong order, a foreign tied group                  */
/* ------------------------------------------------------------------ */

/* On run_ranks' context and a second one of its own. */
static mpg_status sync_rank(rr_rank *r) {
  mpg_ctx *c = r->ctx, *other = NULL;
  R_EXPECT(mpg_ctx_create(r->mesh, r->opts, &other), MPG_OK, "");
  mpg_sync *s = (mpg_sync *)1;
  mpg_sync_opts so = MPG_SYNC_OPTS_INIT, sobad;
  memset(&sobad, 0, sizeof sobad);
  R_EXPECT(mpg_sync_create(NULL, &so, &s), MPG_ERR_INVALID, "NULL");
  R_TRUE(s == NULL);
  R_EXPECT(mpg_sync_create(c, &so, NULL), MPG_ERR_INVALID, "NULL");
  R_EXPECT(mpg_sync_create(c, &sobad, &s), MPG_ERR_INVALID, "MPG_SYNC_OPTS_INIT");
  so.sync.bucket_mb = -1;
  R_EXPECT(mpg_sync_create(c, &so, &s), MPG_ERR_INVALID, "bucket");
  so.sync.bucket_mb = 25;
  so.sync.op = MPG_OP_MAX;
  R_EXPECT(mpg_sync_create(c, &so, &s), MPG_ERR_INVALID, "op");
  so.sync.op = MPG_OP_AVG;
  so.default_dims = "nope";
  R_EXPECT(mpg_sync_create(c, &so, &s), MPG_ERR_NOT_FOUND, "nope");
  so.default_dims = NULL;
  R_EXPECT(mpg_sync_create(c, &so, &s), MPG_OK, "");

  /* Before commit. */
  void *grad;
  mpg_group *g;
  R_EXPECT(mpg_sync_grad(s, 0, &grad), MPG_ERR_RANGE, "param 0");
  int p = -5;
  R_EXPECT(mpg_sync_add_param(NULL, "w", 4, MPG_F32, NULL, &p), MPG_ERR_INVALID, "NULL");
  R_EXPECT(mpg_sync_add_param(s, NULL, 4, MPG_F32, NULL, &p), MPG_ERR_INVALID, "NULL");
  R_EXPECT(mpg_sync_add_param(s, "w", 4, MPG_F32, NULL, NULL), MPG_ERR_INVALID, "NULL");
  R_EXPECT(mpg_sync_add_param(s, "w", 0, MPG_F32, NULL, &p), MPG_ERR_INVALID, "count");
  R_TRUE(p == -1);
  R_EXPECT(mpg_sync_add_param(s, "w", 4, (mpg_dtype)-2, NULL, &p), MPG_ERR_INVALID, "dtype");
  R_EXPECT(mpg_sync_add_param(s, "w", SIZE_MAX / 2, MPG_F32, NULL, &p), MPG_ERR_RANGE, "w");
  mpg_param_opts pob;
  memset(&pob, 0, sizeof pob);
  R_EXPECT(mpg_sync_add_param(s, "w", 4, MPG_F32, &pob, &p), MPG_ERR_INVALID,
           "MPG_PARAM_OPTS_INIT");
  mpg_param_opts po = MPG_PARAM_OPTS_INIT;
  po.reduce_dims = "dp,zz";
  R_EXPECT(mpg_sync_add_param(s, "w", 4, MPG_F32, &po, &p), MPG_ERR_NOT_FOUND, "zz");
  /* A tied group of another context. */
  mpg_group *foreign = NULL;
  R_EXPECT(mpg_ctx_group(other, "dp", &foreign), MPG_OK, "");
  po.reduce_dims = NULL;
  po.tied_group = foreign;
  R_EXPECT(mpg_sync_add_param(s, "w", 4, MPG_F32, &po, &p), MPG_ERR_INVALID,
           "another context");
  R_EXPECT(mpg_sync_add_param(s, "w", 4, MPG_F32, NULL, &p), MPG_OK, "");
  R_EXPECT(mpg_sync_add_param(s, "w", 4, MPG_F32, NULL, &p), MPG_ERR_INVALID,
           "already registered");
  R_EXPECT(mpg_sync_grad(s, 0, &grad), MPG_ERR_STATE, "mpg_sync_commit");
  R_EXPECT(mpg_sync_begin(s, 0, 1, NULL), MPG_ERR_STATE, "commit");
  R_EXPECT(mpg_sync_all(s, 0, NULL), MPG_ERR_STATE, "commit");
  R_EXPECT(mpg_sync_zero_grads(s), MPG_ERR_STATE, "commit");
  R_EXPECT(mpg_sync_param_group(s, 0, &g), MPG_ERR_STATE, "commit");
  R_EXPECT(mpg_sync_mark_ready(s, 0), MPG_ERR_STATE, "");
  R_EXPECT(mpg_sync_finish(s), MPG_ERR_STATE, "");

  R_EXPECT(mpg_sync_commit(NULL), MPG_ERR_INVALID, "NULL");
  R_EXPECT(mpg_sync_commit(s), MPG_OK, "");
  /* After commit. */
  R_EXPECT(mpg_sync_commit(s), MPG_ERR_STATE, "already");
  R_EXPECT(mpg_sync_add_param(s, "late", 4, MPG_F32, NULL, &p), MPG_ERR_STATE, "late");
  R_EXPECT(mpg_sync_grad(NULL, 0, &grad), MPG_ERR_INVALID, "NULL");
  R_EXPECT(mpg_sync_grad(s, 0, NULL), MPG_ERR_INVALID, "NULL");
  R_EXPECT(mpg_sync_grad(s, -1, &grad), MPG_ERR_RANGE, "param -1");
  R_EXPECT(mpg_sync_grad(s, 1, &grad), MPG_ERR_RANGE, "param 1");
  R_EXPECT(mpg_sync_param_group(NULL, 0, &g), MPG_ERR_INVALID, "NULL");
  R_EXPECT(mpg_sync_param_group(s, 0, NULL), MPG_ERR_INVALID, "NULL");
  R_EXPECT(mpg_sync_param_group(s, -1, &g), MPG_ERR_RANGE, "-1");
  R_EXPECT(mpg_sync_param_group(s, 0, &g), MPG_OK, "");
  R_TRUE(g != foreign);
  R_EXPECT(mpg_sync_mark_ready(s, 0), MPG_ERR_STATE, "no step");
  R_EXPECT(mpg_sync_finish(s), MPG_ERR_STATE, "no step");
  R_EXPECT(mpg_sync_begin(NULL, 0, 1, NULL), MPG_ERR_INVALID, "NULL");
  R_EXPECT(mpg_sync_begin(s, 0, 1, NULL), MPG_OK, "");
  R_EXPECT(mpg_sync_begin(s, 1, 1, NULL), MPG_ERR_STATE, "open");
  R_EXPECT(mpg_sync_mark_ready(NULL, 0), MPG_ERR_INVALID, "NULL");
  R_EXPECT(mpg_sync_mark_ready(s, -1), MPG_ERR_RANGE, "-1");
  R_EXPECT(mpg_sync_mark_ready(s, 7), MPG_ERR_RANGE, "7");
  R_EXPECT(mpg_sync_mark_ready(s, 0), MPG_OK, "");
  R_EXPECT(mpg_sync_mark_ready(s, 0), MPG_ERR_STATE, "already");
  R_EXPECT(mpg_sync_zero_grads(s), MPG_ERR_STATE, "flight");
  R_EXPECT(mpg_sync_finish(NULL), MPG_ERR_INVALID, "NULL");
  R_EXPECT(mpg_sync_finish(s), MPG_OK, "");
  R_EXPECT(mpg_sync_finish(s), MPG_ERR_STATE, "no step");
  R_EXPECT(mpg_sync_all(NULL, 1, NULL), MPG_ERR_INVALID, "NULL");
  R_EXPECT(mpg_sync_zero_grads(NULL), MPG_ERR_INVALID, "NULL");
  R_TRUE(mpg_sync_grads_valid(NULL) == 0);
  R_TRUE(mpg_sync_grads_valid(s) == 1);
  mpg_sync_stats stats = MPG_SYNC_STATS_INIT, stbad;
  memset(&stbad, 0, sizeof stbad);
  R_EXPECT(mpg_sync_get_stats(NULL, &stats), MPG_ERR_INVALID, "NULL");
  R_EXPECT(mpg_sync_get_stats(s, NULL), MPG_ERR_INVALID, "NULL");
  R_EXPECT(mpg_sync_get_stats(s, &stbad), MPG_ERR_INVALID, "MPG_SYNC_STATS_INIT");
  /* Shard-mode calls on a replicate sync, and bad arguments. */
  mpg_shard_info si = MPG_SHARD_INFO_INIT, sibad;
  memset(&sibad, 0, sizeof sibad);
  void *pv = NULL;
  R_EXPECT(mpg_sync_get_shard(NULL, 0, &si), MPG_ERR_INVALID, "NULL");
  R_EXPECT(mpg_sync_get_shard(s, 0, &si), MPG_ERR_STATE, "replicate mode");
  R_EXPECT(mpg_sync_param(NULL, 0, &pv), MPG_ERR_INVALID, "NULL");
  R_EXPECT(mpg_sync_param(s, 0, &pv), MPG_ERR_STATE, "replicate mode");
  R_EXPECT(mpg_sync_gather_begin(NULL, NULL), MPG_ERR_INVALID, "NULL");
  R_EXPECT(mpg_sync_gather_begin(s, NULL), MPG_ERR_STATE, "replicate mode");
  R_EXPECT(mpg_sync_gather_wait(s, 0), MPG_ERR_STATE, "replicate mode");
  R_EXPECT(mpg_sync_gather_all(NULL), MPG_ERR_INVALID, "NULL");
  {
    mpg_sync_opts sh = MPG_SYNC_OPTS_INIT;
    sh.sync.mode = MPG_SYNC_SHARD;
    sh.sync.fsdp_owns_dp = 1;
    mpg_sync *bad = NULL;
    R_EXPECT(mpg_sync_create(c, &sh, &bad), MPG_ERR_INVALID, "fsdp_owns_dp");
    sh.sync.fsdp_owns_dp = 0;
    sh.sync.mode = (mpg_sync_mode)7;
    R_EXPECT(mpg_sync_create(c, &sh, &bad), MPG_ERR_INVALID, "opts.sync.mode");
    sh.sync.mode = MPG_SYNC_REPLICATE;
    snprintf(sh.sync.shard_dims, sizeof sh.sync.shard_dims, "%s", "dp");
    R_EXPECT(mpg_sync_create(c, &sh, &bad), MPG_ERR_INVALID, "MPG_SYNC_SHARD");
    sh.sync.mode = MPG_SYNC_SHARD;
    snprintf(sh.sync.replicate_dims, sizeof sh.sync.replicate_dims, "%s", "dp");
    R_EXPECT(mpg_sync_create(c, &sh, &bad), MPG_ERR_INVALID, "share");
    sh.sync.shard_dims[0] = '\0';
    sh.sync.replicate_dims[0] = '\0';
    R_EXPECT(mpg_sync_create(c, &sh, &bad), MPG_OK, "");
    int q = -1;
    R_EXPECT(mpg_sync_add_param(bad, "w", 300, MPG_F32, NULL, &q), MPG_OK, "");
    R_EXPECT(mpg_sync_get_shard(bad, 0, &si), MPG_ERR_STATE, "commit");
    R_EXPECT(mpg_sync_commit(bad), MPG_OK, "");
    R_EXPECT(mpg_sync_get_shard(bad, 0, &sibad), MPG_ERR_INVALID, "MPG_SHARD_INFO_INIT");
    R_EXPECT(mpg_sync_get_shard(bad, 0, NULL), MPG_ERR_INVALID, "NULL");
    R_EXPECT(mpg_sync_get_shard(bad, 1, &si), MPG_ERR_RANGE, "param 1");
    R_EXPECT(mpg_sync_get_shard(bad, 0, &si), MPG_OK, "");
    R_TRUE(si.sharded == 1 && (si.count == 192 || si.count == 108)); /* 300 of 384 */
    R_EXPECT(mpg_sync_param(bad, 0, NULL), MPG_ERR_INVALID, "NULL");
    R_EXPECT(mpg_sync_param(bad, -1, &pv), MPG_ERR_RANGE, "-1");
    R_EXPECT(mpg_sync_gather_wait(bad, 3), MPG_ERR_RANGE, "param 3");
    R_EXPECT(mpg_sync_gather_all(bad), MPG_OK, "");
    R_EXPECT(mpg_sync_begin(bad, 0, 1, NULL), MPG_OK, "");
    R_EXPECT(mpg_sync_gather_begin(bad, NULL), MPG_ERR_STATE, "step 0 is open");
    R_EXPECT(mpg_sync_finish(bad), MPG_OK, "");
    /* A finished step whose update was never gathered. */
    R_EXPECT(mpg_sync_gather_wait(bad, 0), MPG_ERR_STATE, "mpg_sync_gather_begin");
    R_EXPECT(mpg_sync_gather_all(bad), MPG_ERR_STATE, "stale");
    R_EXPECT(mpg_sync_gather_begin(bad, NULL), MPG_OK, "");
    R_EXPECT(mpg_sync_gather_begin(bad, NULL), MPG_ERR_STATE, "still open");
    R_EXPECT(mpg_sync_gather_wait(bad, 0), MPG_OK, "");
    R_EXPECT(mpg_sync_destroy(bad), MPG_OK, "");
  }
  R_EXPECT(mpg_sync_destroy(NULL), MPG_OK, "");
  /* The required order: the sync before its context (mpg_sync_destroy
   * uses the context's groups and memory).  The reverse is refused and
   * frees nothing. */
  R_EXPECT(mpg_ctx_destroy(c), MPG_ERR_STATE, "mpg_sync_destroy first");
  R_EXPECT(mpg_sync_destroy(s), MPG_OK, "");
  R_EXPECT(mpg_ctx_destroy(other), MPG_OK, "");
  return MPG_OK; /* run_ranks destroys c, asserting MPG_OK */
}

Test(api, sync_wrong_order_and_foreign_handles) { run_ranks("dp=2", 0, sync_rank, NULL); }


/* ------------------------------------------------------------------ */
/* Checkpoints: arguments, layouts, state before commit, a missing dir */
/* ------------------------------------------------------------------ */

static mpg_status ckpt_rank(rr_rank *r) {
  mpg_ctx *c = r->ctx;
  mpg_ckpt *ck = (mpg_ckpt *)1;
  mpg_ckpt_opts co = MPG_CKPT_OPTS_INIT, cobad;
  memset(&cobad, 0, sizeof cobad);
  R_EXPECT(mpg_ckpt_create(NULL, &co, &ck), MPG_ERR_INVALID, "NULL");
  R_TRUE(ck == NULL);
  R_EXPECT(mpg_ckpt_create(c, &cobad, &ck), MPG_ERR_INVALID, "MPG_CKPT_OPTS_INIT");
  co.block_bytes = 1000;
  R_EXPECT(mpg_ckpt_create(c, &co, &ck), MPG_ERR_INVALID, "block_bytes");
  co.block_bytes = 4096;
  co.timeout_s = 0;
  R_EXPECT(mpg_ckpt_create(c, &co, &ck), MPG_ERR_INVALID, "timeout_s");
  co.timeout_s = 30;
  R_EXPECT(mpg_ckpt_create(c, &co, &ck), MPG_OK, "");
  float w[8] = {0};
  mpg_tensor_layout l = MPG_TENSOR_LAYOUT_INIT, lbad;
  memset(&lbad, 0, sizeof lbad);
  l.ndim = 2, l.shape[0] = 4, l.shape[1] = 4;
  R_EXPECT(mpg_ckpt_add(NULL, "w", MPG_F32, &l, w, NULL), MPG_ERR_INVALID, "NULL");
  R_EXPECT(mpg_ckpt_add(ck, "w", MPG_F32, &lbad, w, NULL), MPG_ERR_INVALID, "LAYOUT_INIT");
  l.split_dims = "nope", l.split_axis = 0;
  R_EXPECT(mpg_ckpt_add(ck, "w", MPG_F32, &l, w, NULL), MPG_ERR_NOT_FOUND, "nope");
  l.split_dims = "dp", l.split_axis = 2;
  R_EXPECT(mpg_ckpt_add(ck, "w", MPG_F32, &l, w, NULL), MPG_ERR_INVALID, "split_axis");
  l.split_axis = 0, l.shape[0] = 3;
  R_EXPECT(mpg_ckpt_add(ck, "w", MPG_F32, &l, w, NULL), MPG_ERR_RANGE, "divisible");
  l.shape[0] = 4, l.range_offset = 6, l.range_count = 4;
  R_EXPECT(mpg_ckpt_add(ck, "w", MPG_F32, &l, w, NULL), MPG_ERR_INVALID, "range");
  l.range_offset = 0, l.range_count = 0;
  int id = -5;
  R_EXPECT(mpg_ckpt_add(ck, "w", MPG_F32, &l, w, &id), MPG_OK, "");
  R_TRUE(id == 0);
  R_EXPECT(mpg_ckpt_add(ck, "w", MPG_F32, &l, w, &id), MPG_ERR_INVALID, "already");
  R_EXPECT(mpg_ckpt_add_bytes(ck, "b", NULL, 4), MPG_ERR_INVALID, "NULL");
  R_EXPECT(mpg_ckpt_add_bytes(ck, "b", w, 4), MPG_OK, "");
  mpg_sync *s = NULL;
  R_EXPECT(mpg_sync_create(c, NULL, &s), MPG_OK, "");
  int p = -1;
  R_EXPECT(mpg_sync_add_param(s, "w", 8, MPG_F32, NULL, &p), MPG_OK, "");
  R_EXPECT(mpg_ckpt_add_state(ck, "w.m", MPG_F32, &l, s, p, w), MPG_ERR_STATE, "commit");
  R_EXPECT(mpg_sync_commit(s), MPG_OK, "");
  R_EXPECT(mpg_ckpt_add_state(ck, "w.m", MPG_F32, &l, s, 7, w), MPG_ERR_RANGE, "param 7");
  R_EXPECT(mpg_ckpt_add_state(NULL, "w.m", MPG_F32, &l, s, p, w), MPG_ERR_INVALID, "NULL");
  R_EXPECT(mpg_ckpt_save(ck, NULL, 1, NULL), MPG_ERR_INVALID, "NULL");
  R_EXPECT(mpg_ckpt_save(ck, "/nonexistent-mpg/x/ck", 1, NULL), MPG_ERR_IO,
           "/nonexistent-mpg/x (the parent of /nonexistent-mpg/x/ck): open: No such file");
  R_EXPECT(mpg_ckpt_load(ck, "/nonexistent-mpg/ck", NULL, NULL), MPG_ERR_NOT_FOUND,
           "not a checkpoint");
  R_EXPECT(mpg_ckpt_wait(NULL), MPG_ERR_INVALID, "NULL");
  R_EXPECT(mpg_ckpt_wait(ck), MPG_OK, "");
  R_EXPECT(mpg_ckpt_destroy(NULL), MPG_OK, "");
  R_EXPECT(mpg_ckpt_destroy(ck), MPG_OK, "");
  R_EXPECT(mpg_sync_destroy(s), MPG_OK, "");
  return MPG_OK;
}

Test(api, ckpt_arguments_and_state) { run_ranks("dp=2", 0, ckpt_rank, NULL); }
