/* mpi_worker's collectives on one group (the mode "collectives", run by
 * run_collectives in mpi_worker.c): every collective x dtype x op, async,
 * group membership and the DESIGN dp_cp check. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include <mpi.h>

#include "internal.h" /* MPG__OP_PREMUL_SUM */
#include "../support/clock.h"
#include "../support/time_bound.h"
#include "mpi_worker.h"

/* ------------------------------------------------------------------ */
/* Collectives on one group                                            */
/* ------------------------------------------------------------------ */

static void check_buf(const grp *G, const char *what, mpg_dtype dt, const void *buf,
                      size_t n, const double *expect) {
  for (size_t i = 0; i < n; i++) {
    double got = get(dt, buf, i);
    if (got != expect[i]) {
      fail("group %s (size %d, position %d): %s dtype %s: element %zu is %.17g, "
           "expected %.17g",
           G->name, G->size, G->pos, what, mpg_dtype_name(dt), i, got, expect[i]);
      return;
    }
  }
}

void test_all_reduce(const grp *G) {
  static const mpg_op ops[] = {MPG_OP_SUM, MPG_OP_AVG, MPG_OP_MAX, MPG_OP_MIN,
                               MPG__OP_PREMUL_SUM};
  unsigned char send[COUNT * 8], recv[COUNT * 8];
  double expect[COUNT];
  for (int d = 0; d < NDTYPES; d++) {
    mpg_dtype dt = all_dtypes[d];
    for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++) {
      mpg_op op = ops[o];
      if (op == MPG__OP_PREMUL_SUM && !is_float(dt)) continue;
      double scale = 0.25;
      for (size_t i = 0; i < COUNT; i++)
        expect[i] = reduce_ref(dt, op, G->members, G->size, i, scale);
      for (int inplace = 0; inplace < 2; inplace++) {
        void *s = inplace ? recv : send;
        for (size_t i = 0; i < COUNT; i++) put(dt, s, i, val(dt, g_rank, i));
        if (!inplace)
          for (size_t i = 0; i < COUNT; i++) put(dt, recv, i, 99);
        char what[96];
        snprintf(what, sizeof what, "all_reduce op %s%s", op_name(op),
                 inplace ? " in place" : "");
        mpg_status st = op == MPG__OP_PREMUL_SUM
            ? mpg_all_reduce_scaled(G->g, s, recv, COUNT, dt, scale, NULL, NULL)
            : mpg_all_reduce(G->g, s, recv, COUNT, dt, op, NULL, NULL);
        if (st) {
          fail("group %s: %s dtype %s -> %s: %s", G->name, what,
               mpg_dtype_name(dt), mpg_status_name(st), mpg_last_error());
          continue;
        }
        check_buf(G, what, dt, recv, COUNT, expect);
      }
    }
  }
  /* An empty all_reduce completes. */
  CHECK(mpg_all_reduce(G->g, send, recv, 0, MPG_F32, MPG_OP_SUM, NULL, NULL));
}

void test_async(const grp *G) {
  /* Every dtype in flight at once, then waited in reverse order. */
  static unsigned char bufs[NDTYPES][COUNT * 8];
  mpg_work *w[NDTYPES];
  double expect[COUNT];
  for (int d = 0; d < NDTYPES; d++) {
    for (size_t i = 0; i < COUNT; i++) put(all_dtypes[d], bufs[d], i, val(all_dtypes[d], g_rank, i));
    mpg_status st = mpg_all_reduce(G->g, bufs[d], bufs[d], COUNT, all_dtypes[d],
                                   MPG_OP_SUM, NULL, &w[d]);
    if (st) {
      fail("group %s: async all_reduce %s -> %s: %s", G->name,
           mpg_dtype_name(all_dtypes[d]), mpg_status_name(st), mpg_last_error());
      w[d] = NULL;
    }
  }
  /* Poll the first with mpg_work_test until done. */
  int done = 0;
  double t0 = now_s();
  while (!done && now_s() - t0 < 30) {
    mpg_status st = mpg_work_test(w[0], &done);
    if (st) {
      fail("group %s: mpg_work_test -> %s: %s", G->name, mpg_status_name(st),
           mpg_last_error());
      break;
    }
  }
  if (!done) fail("group %s: mpg_work_test never reported completion", G->name);
  for (int d = NDTYPES - 1; d >= 0; d--) {
    mpg_status st = mpg_work_wait(w[d]);
    if (st) {
      fail("group %s: mpg_work_wait %s -> %s: %s", G->name,
           mpg_dtype_name(all_dtypes[d]), mpg_status_name(st), mpg_last_error());
      continue;
    }
    for (size_t i = 0; i < COUNT; i++)
      expect[i] = reduce_ref(all_dtypes[d], MPG_OP_SUM, G->members, G->size, i, 1);
    check_buf(G, "async all_reduce sum", all_dtypes[d], bufs[d], COUNT, expect);
  }
}

void test_broadcast(const grp *G) {
  unsigned char buf[COUNT * 8];
  double expect[COUNT];
  for (int d = 0; d < NDTYPES; d++) {
    mpg_dtype dt = all_dtypes[d];
    for (int root = 0; root < G->size; root++) {
      int rr = G->members[root];
      for (size_t i = 0; i < COUNT; i++) {
        expect[i] = val(dt, rr + 5, i);
        put(dt, buf, i, G->pos == root ? expect[i] : 99);
      }
      char what[64];
      snprintf(what, sizeof what, "broadcast root %d", root);
      mpg_status st = mpg_broadcast(G->g, buf, COUNT, dt, root, NULL, NULL);
      if (st) {
        fail("group %s: %s dtype %s -> %s: %s", G->name, what, mpg_dtype_name(dt),
             mpg_status_name(st), mpg_last_error());
        continue;
      }
      check_buf(G, what, dt, buf, COUNT, expect);
    }
  }
}

void test_all_gather(const grp *G) {
  size_t n = (size_t)G->size * COUNT;
  unsigned char send[COUNT * 8];
  unsigned char *recv = malloc(n * 8);
  double *expect = malloc(n * sizeof *expect);
  for (int d = 0; d < NDTYPES; d++) {
    mpg_dtype dt = all_dtypes[d];
    size_t es = mpg_dtype_size(dt);
    for (int p = 0; p < G->size; p++)
      for (size_t i = 0; i < COUNT; i++)
        expect[(size_t)p * COUNT + i] = val(dt, G->members[p], i);
    for (int mode = 0; mode < 3; mode++) {
      /* 0: separate buffers; 1: send is this rank's block of recv
       * (NCCL's in place); 2: send is another member's block of recv,
       * refused on every member before anything is posted. */
      if (mode == 2 && G->size == 1) continue;
      for (size_t i = 0; i < n; i++) put(dt, recv, i, 99);
      size_t other = (size_t)((G->pos + 1) % G->size);
      void *s = mode == 0 ? (void *)send
              : mode == 1 ? (void *)(recv + (size_t)G->pos * COUNT * es)
                          : (void *)(recv + other * COUNT * es);
      for (size_t i = 0; i < COUNT; i++) put(dt, s, i, val(dt, g_rank, i));
      char what[64];
      snprintf(what, sizeof what, "all_gather%s",
               mode == 1 ? " in place (own block)" : mode == 2 ? " send at another block" : "");
      mpg_status st = mpg_all_gather(G->g, s, recv, COUNT, dt, NULL, NULL);
      if (mode == 2) {
        if (st != MPG_ERR_INVALID || !strstr(mpg_last_error(), "position * count"))
          fail("group %s: %s dtype %s -> %s (expected ERR_INVALID): %s", G->name, what,
               mpg_dtype_name(dt), mpg_status_name(st), mpg_last_error());
        continue;
      }
      if (st) {
        fail("group %s: %s dtype %s -> %s: %s", G->name, what, mpg_dtype_name(dt),
             mpg_status_name(st), mpg_last_error());
        continue;
      }
      check_buf(G, what, dt, recv, n, expect);
    }
  }
  free(recv);
  free(expect);
}

void test_reduce_scatter(const grp *G) {
  static const mpg_op ops[] = {MPG_OP_SUM, MPG_OP_AVG, MPG_OP_MAX, MPG_OP_MIN};
  size_t n = (size_t)G->size * COUNT;
  unsigned char *send = malloc(n * 8);
  unsigned char recv[COUNT * 8];
  double expect[COUNT];
  for (int d = 0; d < NDTYPES; d++) {
    mpg_dtype dt = all_dtypes[d];
    for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++) {
      mpg_op op = ops[o];
      for (size_t i = 0; i < COUNT; i++)
        expect[i] = reduce_ref(dt, op, G->members, G->size,
                               (size_t)G->pos * COUNT + i, 1);
      for (int inplace = 0; inplace < 2; inplace++) {
        for (size_t i = 0; i < n; i++) put(dt, send, i, val(dt, g_rank, i));
        /* In place: recv is this rank's block of send (NCCL's rule). */
        void *r = inplace ? (void *)(send + (size_t)G->pos * COUNT * mpg_dtype_size(dt))
                          : (void *)recv;
        if (!inplace)
          for (size_t i = 0; i < COUNT; i++) put(dt, recv, i, 99);
        char what[96];
        snprintf(what, sizeof what, "reduce_scatter op %s%s", op_name(op),
                 inplace ? " in place (own block)" : "");
        mpg_status st = mpg_reduce_scatter(G->g, send, r, COUNT, dt, op, NULL, NULL);
        if (st) {
          fail("group %s: %s dtype %s -> %s: %s", G->name, what,
               mpg_dtype_name(dt), mpg_status_name(st), mpg_last_error());
          continue;
        }
        check_buf(G, what, dt, r, COUNT, expect);
      }
    }
  }
  free(send);
}

void test_send_recv(const grp *G) {
  if (G->size < 2) return;
  int to = (G->pos + 1) % G->size, from = (G->pos + G->size - 1) % G->size;
  unsigned char sbuf[COUNT * 8], rbuf[COUNT * 8];
  double expect[COUNT];
  for (int d = 0; d < NDTYPES; d++) {
    mpg_dtype dt = all_dtypes[d];
    for (size_t i = 0; i < COUNT; i++) {
      put(dt, sbuf, i, val(dt, g_rank + 3, i));
      put(dt, rbuf, i, 99);
      expect[i] = val(dt, G->members[from] + 3, i);
    }
    mpg_work *wr = NULL, *ws = NULL;
    CHECK(mpg_recv(G->g, rbuf, COUNT, dt, from, NULL, &wr));
    CHECK(mpg_send(G->g, sbuf, COUNT, dt, to, NULL, &ws));
    mpg_status a = mpg_work_wait(ws), b = mpg_work_wait(wr);
    if (a || b) {
      fail("group %s: send/recv dtype %s -> %s / %s: %s", G->name,
           mpg_dtype_name(dt), mpg_status_name(a), mpg_status_name(b),
           mpg_last_error());
      continue;
    }
    check_buf(G, "recv", dt, rbuf, COUNT, expect);
  }
}

/* The communicator really joins the mesh's members: gather world ranks. */
void test_membership(const grp *G, const mpg_mesh *mesh, int s) {
  int index, pos, size;
  CHECK(mpg_mesh_group_of(mesh, s, g_rank, &index, &pos, &size));
  if (mpg_group_size(G->g) != size || mpg_group_position(G->g) != pos ||
      mpg_group_index(G->g) != index)
    fail("group %s: size/position/index %d/%d/%d, mesh says %d/%d/%d", G->name,
         mpg_group_size(G->g), mpg_group_position(G->g), mpg_group_index(G->g), size,
         pos, index);
  for (int p = 0; p < size; p++) {
    int r = -1;
    CHECK(mpg_group_member(G->g, p, &r));
    if (r != G->members[p])
      fail("group %s: member %d is %d, mesh says %d", G->name, p, r, G->members[p]);
  }
  int32_t me = g_rank, got[64];
  CHECK(mpg_all_gather(G->g, &me, got, 1, MPG_I32, NULL, NULL));
  for (int p = 0; p < size; p++)
    if (got[p] != G->members[p])
      fail("group %s: position %d holds world rank %d, mpg_mesh_group_members "
           "says %d", G->name, p, (int)got[p], G->members[p]);
  CHECK(mpg_barrier(G->g, NULL));
}

/* DESIGN: a dp_cp all_reduce on (dp=2, tp=2, cp=2) keeps tp-distinct
 * values apart. */
void test_design(mpg_ctx *ctx, const mpg_mesh *mesh) {
  int world = mpg_ctx_world_size(ctx), coord[8];
  mpg_group *dpcp = NULL, *wg = NULL;
  CHECK(mpg_ctx_group(ctx, "dp_cp", &dpcp));
  CHECK(mpg_ctx_group(ctx, "world", &wg));
  if (!dpcp || !wg) return;
  CHECK(mpg_mesh_coord_of(mesh, g_rank, coord));
  int tp = coord[1];
  double v = (tp + 1) * 1000.0 + g_rank, r = 0;
  CHECK(mpg_all_reduce(dpcp, &v, &r, 1, MPG_F64, MPG_OP_SUM, NULL, NULL));
  int ds, members[8];
  CHECK(mpg_mesh_dimset_find(mesh, "dp_cp", &ds));
  CHECK(mpg_mesh_group_members(mesh, ds, mpg_group_index(dpcp), members));
  double expect = 0;
  for (int p = 0; p < 4; p++) expect += (tp + 1) * 1000.0 + members[p];
  if (r != expect) fail("design: dp_cp sum is %g, expected %g", r, expect);
  double all[8];
  CHECK(mpg_all_gather(wg, &r, all, 1, MPG_F64, NULL, NULL));
  for (int a = 0; a < world; a++)
    for (int b = 0; b < world; b++) {
      int ca[8], cb[8], ga, gb;
      mpg_mesh_coord_of(mesh, a, ca);
      mpg_mesh_coord_of(mesh, b, cb);
      mpg_mesh_group_of(mesh, ds, a, &ga, NULL, NULL);
      mpg_mesh_group_of(mesh, ds, b, &gb, NULL, NULL);
      if (ca[1] != cb[1] && all[a] == all[b])
        fail("design: ranks %d (tp %d) and %d (tp %d) both ended with %g", a,
             ca[1], b, cb[1], all[a]);
      if (ga == gb && all[a] != all[b])
        fail("design: ranks %d and %d share dp_cp group %d but ended with %g "
             "and %g", a, b, ga, all[a], all[b]);
    }
}
