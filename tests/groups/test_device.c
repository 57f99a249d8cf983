/* The CUDA device choice of the nccl backend (groups/device.h), tested
 * without a GPU: the rules as a table and as properties over random node
 * shapes, the reading of CUDA_VISIBLE_DEVICES (indexes, UUIDs, MIG ids,
 * blanks, empty and unusable entries), Slurm-like jobs where every process
 * sees one GPU, requests out of range, and the agreement of the chosen
 * device with binding on a live-like topology (an XML fixture loaded as
 * this machine, CUDA_VISIBLE_DEVICES applied by topo). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "meshpg.h"
/* Internal: links the static library. */
#include "../../groups/device.h"

#define U0 "GPU-1a2b3c4d-0000-4000-8000-000000000001"
#define U1 "GPU-1a2b3c4d-0000-4000-8000-000000000002"
#define U2 "GPU-5e6f7a8b-0000-4000-8000-000000000003"
#define U3 "GPU-9c0d1e2f-0000-4000-8000-000000000004"
#define MIG "MIG-4f1c9b2e-7d3a-5e8f-9a0b-1c2d3e4f5a6b"
#define MIG_OLD "MIG-GPU-5e6f7a8b-0000-4000-8000-000000000003/1/0"

/* Choose and require success. */
static mpg__device_choice ok(int requested, int local_rank, int local_world, int count,
                             const char *visible) {
  mpg__device_choice c;
  mpg_status st = mpg__device_choose(requested, local_rank, local_world, count, visible, &c);
  cr_assert_eq(st, MPG_OK, "choose(%d, %d, %d, %d, %s): %s: %s", requested, local_rank,
               local_world, count, visible ? visible : "NULL", mpg_status_name(st),
               mpg_last_error());
  cr_assert(c.why[0], "why is empty");
  return c;
}

/* Choose and require failure `want`, with every `subs` in the message. */
static void fails(mpg_status want, int requested, int local_rank, int local_world, int count,
                  const char *visible, const char *const *subs, const char *const *absent) {
  mpg__device_choice c;
  mpg_status st = mpg__device_choose(requested, local_rank, local_world, count, visible, &c);
  const char *m = mpg_last_error();
  cr_assert_eq(st, want, "choose(%d, %d, %d, %d, %s): got %s (%s)", requested, local_rank,
               local_world, count, visible ? visible : "NULL", mpg_status_name(st), m);
  cr_assert_eq(c.device, -1);
  cr_assert_eq(c.ambiguous, 0);
  cr_assert_str_eq(c.why, m, "out->why and the error message differ");
  for (; subs && *subs; subs++)
    cr_assert(strstr(m, *subs), "message \"%s\" lacks \"%s\"", m, *subs);
  for (; absent && *absent; absent++)
    cr_assert(!strstr(m, *absent), "message \"%s\" has \"%s\"", m, *absent);
}

#define SUBS(...) ((const char *const[]){__VA_ARGS__, NULL})

/* ------------------------------------------------------------------------ */
/* The rules, as a table                                                     */
/* ------------------------------------------------------------------------ */

Test(device, rules_table) {
  static const struct {
    int requested, local_rank, local_world, count;
    int device, ambiguous;
    const char *why_start;
  } rows[] = {
      /* one GPU per local rank */
      {-1, 0, 8, 8, 0, 0, "device 0 = local rank 0 (8 visible devices for 8 local ranks)"},
      {-1, 7, 8, 8, 7, 0, "device 7 = local rank 7 (8 visible devices for 8 local ranks)"},
      {-1, 2, 4, 8, 2, 0, "device 2 = local rank 2 (8 visible devices for 4 local ranks)"},
      /* each process was given its own GPU */
      {-1, 0, 8, 1, 0, 0, "device 0 = the only visible device"},
      {-1, 5, 8, 1, 0, 0, "device 0 = the only visible device"},
      {-1, 0, 1, 1, 0, 0, "device 0 = the only visible device"},
      /* fewer devices than local ranks: modulo, ambiguous */
      {-1, 3, 4, 2, 1, 1, "device 1 = local rank 3 % 2 visible devices"},
      {-1, 2, 4, 2, 0, 1, "device 0 = local rank 2 % 2 visible devices"},
      {-1, 7, 8, 3, 1, 1, "device 1 = local rank 7 % 3 visible devices"},
      /* the caller's device wins, never ambiguous */
      {1, 0, 8, 2, 1, 0, "device 1 = opts.device"},
      {0, 5, 8, 1, 0, 0, "device 0 = opts.device"},
      {3, 3, 8, 4, 3, 0, "device 3 = opts.device"},
      /* a local rank outside the local world counts as local_rank + 1 ranks */
      {-1, 3, 1, 8, 3, 0, "device 3 = local rank 3 (8 visible devices for 4 local ranks)"},
      {-1, 5, 1, 4, 1, 1, "device 1 = local rank 5 % 4 visible devices"},
  };
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
    mpg__device_choice c = ok(rows[i].requested, rows[i].local_rank, rows[i].local_world,
                              rows[i].count, NULL);
    cr_expect_eq(c.device, rows[i].device, "row %zu: device %d, want %d", i, c.device,
                 rows[i].device);
    cr_expect_eq(c.ambiguous, rows[i].ambiguous, "row %zu: ambiguous %d", i, c.ambiguous);
    cr_expect(strncmp(c.why, rows[i].why_start, strlen(rows[i].why_start)) == 0,
              "row %zu: why \"%s\" does not start \"%s\"", i, c.why, rows[i].why_start);
    cr_expect(strstr(c.why, "(CUDA_VISIBLE_DEVICES unset)"), "row %zu: %s", i, c.why);
    cr_expect_eq(c.visible_entries, -1, "row %zu", i);
    cr_expect_str_empty(c.entry, "row %zu", i);
    cr_expect_eq(strstr(c.why, "ambiguous") != NULL, rows[i].ambiguous, "row %zu: %s", i,
                 c.why);
  }
}

Test(device, ambiguous_explanation_in_full) {
  mpg__device_choice c = ok(-1, 3, 4, 2, "GPU-aa,GPU-bb");
  cr_assert_str_eq(c.why,
                   "device 1 = local rank 3 % 2 visible devices "
                   "(CUDA_VISIBLE_DEVICES=GPU-aa,GPU-bb: entry 1 = GPU-bb); "
                   "ambiguous: 4 local ranks share 2 devices (NCCL refuses two "
                   "ranks of one communicator on one GPU)");
  cr_assert_str_eq(c.entry, "GPU-bb");
  cr_assert_eq(c.visible_entries, 2);
}

Test(device, local_rank_above_the_visible_count) {
  /* Local rank 6 of 8 with 4 visible devices: device 2, shared with 2. */
  mpg__device_choice c = ok(-1, 6, 8, 4, "4,5,6,7");
  cr_assert_eq(c.device, 2);
  cr_assert(c.ambiguous);
  cr_assert_str_eq(c.entry, "6");
  cr_assert(strstr(c.why, "entry 2 = GPU 6"), "%s", c.why);
  cr_assert(strstr(c.why, "8 local ranks share 4 devices"), "%s", c.why);
  /* The local world unknown (1) but the rank says 6: still in range. */
  c = ok(-1, 6, 1, 4, NULL);
  cr_assert_eq(c.device, 2);
  cr_assert(c.ambiguous);
  cr_assert(strstr(c.why, "7 local ranks share 4 devices"), "%s", c.why);
}

/* ------------------------------------------------------------------------ */
/* Properties over random node shapes                                        */
/* ------------------------------------------------------------------------ */

Test(device, property_auto_choice) {
  srand(20240611u);
  for (int it = 0; it < 20000; it++) {
    int lw = 1 + rand() % 16, count = 1 + rand() % 16, lr = rand() % lw;
    mpg__device_choice c = ok(-1, lr, lw, count, NULL);
    cr_assert(c.device >= 0 && c.device < count, "lw %d count %d lr %d: device %d", lw,
              count, lr, c.device);
    if (count >= lw) cr_assert_eq(c.device, lr, "lw %d count %d lr %d", lw, count, lr);
    if (count == 1) cr_assert_eq(c.device, 0, "lw %d lr %d", lw, lr);
    cr_assert_eq(c.ambiguous, 1 < count && count < lw, "lw %d count %d lr %d: ambiguous %d",
                 lw, count, lr, c.ambiguous);
    if (count > 1 && count < lw) cr_assert_eq(c.device, lr % count);
    char start[32];
    snprintf(start, sizeof start, "device %d = ", c.device);
    cr_assert(strncmp(c.why, start, strlen(start)) == 0, "why \"%s\"", c.why);
  }
}

Test(device, property_every_local_rank_of_a_node) {
  /* Over one node: with count >= lw the devices are distinct; with fewer,
   * every device is used and no device takes more than ceil(lw/count). */
  for (int lw = 1; lw <= 16; lw++)
    for (int count = 1; count <= 16; count++) {
      int used[16] = {0};
      for (int lr = 0; lr < lw; lr++) used[ok(-1, lr, lw, count, NULL).device]++;
      int most = 0, distinct = 0;
      for (int d = 0; d < count; d++) {
        if (used[d] > most) most = used[d];
        distinct += used[d] > 0;
      }
      if (count == 1) cr_assert_eq(used[0], lw);
      else if (count >= lw) cr_assert_eq(most, 1, "lw %d count %d", lw, count);
      else {
        cr_assert_eq(distinct, count, "lw %d count %d", lw, count);
        cr_assert_eq(most, (lw + count - 1) / count, "lw %d count %d", lw, count);
      }
    }
}

Test(device, property_requested) {
  srand(777u);
  for (int it = 0; it < 5000; it++) {
    int lw = 1 + rand() % 16, count = 1 + rand() % 16, lr = rand() % lw;
    int req = rand() % 20;
    mpg__device_choice c;
    mpg_status st = mpg__device_choose(req, lr, lw, count, NULL, &c);
    if (req < count) {
      cr_assert_eq(st, MPG_OK, "req %d count %d: %s", req, count, mpg_last_error());
      cr_assert_eq(c.device, req);
      cr_assert_eq(c.ambiguous, 0);
    } else {
      cr_assert_eq(st, MPG_ERR_INVALID, "req %d count %d", req, count);
      cr_assert_eq(c.device, -1);
    }
  }
}

Test(device, property_visible_entry_names_the_device) {
  /* A list of `count` random entries: the chosen ordinal's entry is the
   * one CUDA_VISIBLE_DEVICES has at that position. */
  srand(4242u);
  static const char *const kinds[] = {"%d", "GPU-%08x-0000-4000-8000-00000000000%d",
                                      "MIG-%08x-1111-2222-3333-44444444444%d",
                                      "MIG-GPU-%08x-0000-4000-8000-00000000000%d/1/0"};
  for (int it = 0; it < 2000; it++) {
    int lw = 1 + rand() % 16, count = 1 + rand() % 8, lr = rand() % lw;
    char list[1024] = "", entries[8][80];
    for (int e = 0; e < count; e++) {
      int k = rand() % 4;
      if (k == 0) snprintf(entries[e], sizeof entries[e], kinds[0], rand() % 16);
      else snprintf(entries[e], sizeof entries[e], kinds[k], (unsigned)rand(), e);
      strcat(list, e ? (rand() % 2 ? ", " : ",") : (rand() % 2 ? " " : ""));
      strcat(list, entries[e]);
    }
    if (rand() % 3 == 0) strcat(list, ",-1,5"); /* CUDA ends the list at -1 */
    mpg__device_choice c = ok(-1, lr, lw, count, list);
    cr_assert_eq(c.visible_entries, count, "list \"%s\"", list);
    cr_assert_str_eq(c.entry, entries[c.device], "list \"%s\", device %d", list, c.device);
    cr_assert(strstr(c.why, entries[c.device]) || strlen(c.why) + 1 >= MPG__DEVICE_WHY_MAX,
              "why \"%s\" lacks \"%s\"", c.why, entries[c.device]);
  }
}

/* ------------------------------------------------------------------------ */
/* CUDA_VISIBLE_DEVICES                                                      */
/* ------------------------------------------------------------------------ */

Test(device, visible_indexes) {
  mpg__device_choice c = ok(-1, 2, 4, 4, "4,5,6,7");
  cr_assert_eq(c.device, 2);
  cr_assert_str_eq(c.entry, "6");
  cr_assert_eq(c.visible_entries, 4);
  cr_assert(strstr(c.why, "(CUDA_VISIBLE_DEVICES=4,5,6,7: entry 2 = GPU 6)"), "%s", c.why);
}

Test(device, visible_uuids_and_mig_ids) {
  mpg__device_choice c = ok(-1, 1, 2, 2, U3 "," U2);
  cr_assert_str_eq(c.entry, U2);
  cr_assert(strstr(c.why, "entry 1 = " U2 ")"), "%s", c.why);
  c = ok(-1, 0, 2, 2, MIG "," MIG_OLD);
  cr_assert_str_eq(c.entry, MIG);
  c = ok(-1, 1, 2, 2, MIG "," MIG_OLD);
  cr_assert_str_eq(c.entry, MIG_OLD);
  /* Unique prefixes, any case. */
  c = ok(-1, 1, 2, 2, "GPU-5e6f,gpu-9C0D");
  cr_assert_str_eq(c.entry, "gpu-9C0D");
  cr_assert_eq(c.visible_entries, 2);
}

Test(device, visible_blanks_are_ignored) {
  const char *v = " 3 ,\t" U1 " , " MIG_OLD "\t";
  cr_assert_str_eq(ok(-1, 0, 3, 3, v).entry, "3");
  cr_assert_str_eq(ok(-1, 1, 3, 3, v).entry, U1);
  mpg__device_choice c = ok(-1, 2, 3, 3, v);
  cr_assert_str_eq(c.entry, MIG_OLD);
  cr_assert_eq(c.visible_entries, 3);
}

Test(device, visible_list_ends_at_the_first_unusable_entry) {
  static const struct {
    const char *visible;
    int usable;
  } rows[] = {
      {"0,1,-1,2", 2},      {"0,abc,2", 1},        {"0,,2", 1},
      {"0,1,", 2},          {"GPU-,0", 0},          {"GPU-xyz1,0", 0},
      {"MIG-,0", 0},        {"MIG-ab_c,0", 0},      {"2x,0", 0},
      {"+1,0", 0},          {" ", 0},               {"", 0},
      {"1,2,3,-1", 3},      {U0 ",1, -1 ," U2, 2},
  };
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
    mpg__device_choice c;
    int count = rows[i].usable > 0 ? rows[i].usable : 1;
    mpg_status st = mpg__device_choose(-1, 0, 1, count, rows[i].visible, &c);
    cr_assert_eq(st, MPG_OK, "\"%s\": %s", rows[i].visible, mpg_last_error());
    cr_expect_eq(c.visible_entries, rows[i].usable, "\"%s\": %d usable entries, want %d",
                 rows[i].visible, c.visible_entries, rows[i].usable);
  }
  /* An entry too long to be a device id ends the list too. */
  char longer[200] = "0,GPU-";
  for (int i = 0; i < 90; i++) strcat(longer, "a");
  cr_assert_eq(ok(-1, 0, 1, 1, longer).visible_entries, 1);
}

Test(device, visible_entry_unknown_when_cuda_shows_more) {
  /* CUDA shows 3 devices but the list names only one usable entry (it was
   * changed after CUDA read it, say): the entry is reported unknown. */
  mpg__device_choice c = ok(-1, 2, 3, 3, "0,-1,2");
  cr_assert_eq(c.device, 2);
  cr_assert_str_empty(c.entry);
  cr_assert(strstr(c.why, "entry 2 unknown, the list has 1 usable entry"), "%s", c.why);
}

Test(device, visible_cut_by_cuda_past_the_count) {
  /* "0,9,1" on a 4-GPU node: CUDA stops at 9, count is 1; ordinal 0 is
   * entry "0" whatever follows. */
  mpg__device_choice c = ok(-1, 3, 4, 1, "0,9,1");
  cr_assert_eq(c.device, 0);
  cr_assert_str_eq(c.entry, "0");
  cr_assert_eq(c.visible_entries, 3);
}

Test(device, long_visible_list_is_shortened_but_names_the_entry) {
  const char *v = U0 "," U1 "," U2 "," U3 "," U0 "," U1 "," U2 "," U3;
  mpg__device_choice c = ok(-1, 11, 16, 8, v);
  cr_assert_eq(c.device, 3);
  cr_assert(c.ambiguous);
  cr_assert(strstr(c.why, "...: entry 3 = " U3 ")"), "%s", c.why);
  const char *tail = "(NCCL refuses two ranks of one communicator on one GPU)";
  cr_assert(strlen(c.why) > strlen(tail) &&
                strcmp(c.why + strlen(c.why) - strlen(tail), tail) == 0,
            "why was cut: %s", c.why);
}

/* ------------------------------------------------------------------------ */
/* Slurm-like: every process sees one GPU                                    */
/* ------------------------------------------------------------------------ */

Test(device, slurm_each_process_sees_one_gpu) {
  /* srun --gpus-per-task=1 (or a CUDA_VISIBLE_DEVICES per rank): local
   * ranks 0..7, each with its own one-entry list. */
  for (int lr = 0; lr < 8; lr++) {
    char v[8];
    snprintf(v, sizeof v, "%d", lr);
    mpg__device_choice c = ok(-1, lr, 8, 1, v);
    cr_assert_eq(c.device, 0, "local rank %d", lr);
    cr_assert_eq(c.ambiguous, 0, "local rank %d", lr);
    cr_assert_str_eq(c.entry, v);
    char want[96];
    snprintf(want, sizeof want, "local rank %d of 8)", lr);
    cr_assert(strstr(c.why, "the only visible device") && strstr(c.why, want), "%s",
              c.why);
    snprintf(want, sizeof want, "(CUDA_VISIBLE_DEVICES=%d: entry 0 = GPU %d)", lr, lr);
    cr_assert(strstr(c.why, want), "%s lacks %s", c.why, want);
  }
  /* Slurm's cgroup may hide the other GPUs without the variable. */
  mpg__device_choice c = ok(-1, 5, 8, 1, NULL);
  cr_assert_eq(c.device, 0);
  cr_assert(strstr(c.why, "CUDA_VISIBLE_DEVICES unset"), "%s", c.why);
}

/* ------------------------------------------------------------------------ */
/* Errors                                                                    */
/* ------------------------------------------------------------------------ */

Test(device, requested_out_of_range_names_what_it_should) {
  fails(MPG_ERR_INVALID, 4, 0, 8, 2, "2,3",
        SUBS("opts.device=4", "sees 2", "(0..1)", "CUDA_VISIBLE_DEVICES=\"2,3\""), NULL);
  fails(MPG_ERR_INVALID, 1, 0, 1, 1, NULL, SUBS("opts.device=1", "sees 1", "(0..0)"),
        SUBS("CUDA_VISIBLE_DEVICES"));
  fails(MPG_ERR_INVALID, -2, 0, 1, 4, NULL, SUBS("opts.device=-2", "0..3", "-1"), NULL);
}

Test(device, no_device) {
  fails(MPG_ERR_UNSUPPORTED, -1, 2, 4, 0, NULL,
        SUBS("no CUDA device for local rank 2", "CUDA shows this process 0 devices"),
        SUBS("CUDA_VISIBLE_DEVICES"));
  fails(MPG_ERR_UNSUPPORTED, -1, 0, 1, 0, "",
        SUBS("CUDA_VISIBLE_DEVICES=\"\" hides every GPU"), NULL);
  fails(MPG_ERR_UNSUPPORTED, -1, 0, 1, 0, "-1",
        SUBS("CUDA_VISIBLE_DEVICES=\"-1\" has no usable entry", "its first, \"-1\""), NULL);
  fails(MPG_ERR_UNSUPPORTED, -1, 0, 1, 0, "7",
        SUBS("CUDA_VISIBLE_DEVICES=\"7\" lists 1 entry but CUDA found none"), NULL);
  /* No device at all outranks a requested one. */
  fails(MPG_ERR_UNSUPPORTED, 0, 0, 1, 0, NULL, SUBS("no CUDA device"), NULL);
}

Test(device, bad_arguments) {
  fails(MPG_ERR_INVALID, -1, -1, 4, 4, NULL, SUBS("local rank -1 is negative"), NULL);
  fails(MPG_ERR_INVALID, -1, 0, 0, 4, NULL, SUBS("local world size 0 is below 1"), NULL);
  cr_assert_eq(mpg__device_choose(-1, 0, 1, 1, NULL, NULL), MPG_ERR_INVALID);
  cr_assert(strstr(mpg_last_error(), "out is NULL"), "%s", mpg_last_error());
}

/* ------------------------------------------------------------------------ */
/* The chosen device and binding agree                                       */
/* ------------------------------------------------------------------------ */

/* The fixture as this machine's live topology, with CUDA_VISIBLE_DEVICES. */
static mpg_topo *live(const char *visible) {
  static char path[1024];
  const char *d = getenv("MESHPG_TEST_DATA");
  cr_assert_not_null(d, "MESHPG_TEST_DATA is not set");
  snprintf(path, sizeof path, "%s/topologies/workstation-4gpu-nvml.xml", d);
  setenv("HWLOC_XMLFILE", path, 1);
  setenv("HWLOC_THISSYSTEM", "1", 1);
  setenv("CUDA_VISIBLE_DEVICES", visible, 1);
  mpg_topo *t = NULL;
  mpg_status st = mpg_topo_load_live(&t);
  cr_assert_eq(st, MPG_OK, "CUDA_VISIBLE_DEVICES=%s: %s", visible, mpg_last_error());
  return t;
}

/* Bind (plan) local rank lr of lw near the device the nccl backend picks
 * when CUDA shows `count` devices, as groups/ctx.c does; the bus id. */
static void expect_bus(const char *visible, int lr, int lw, int count, const char *bus) {
  mpg_topo *t = live(visible);
  cr_assert_eq(mpg_topo_num_gpus(t), count, "CUDA and topo disagree on the count");
  mpg__device_choice c = ok(-1, lr, lw, count, visible);
  mpg_binding b = MPG_BINDING_INIT;
  mpg_status st = mpg_topo_bind(t, lr, lw, c.device, MPG_BIND_NUMA, MPG_BIND_APPLY_NONE, &b);
  cr_assert_eq(st, MPG_OK, "%s", mpg_last_error());
  cr_assert_eq(b.gpu, c.device);
  cr_assert_str_eq(b.gpu_bus_id, bus, "CUDA_VISIBLE_DEVICES=%s, local rank %d of %d", visible,
                   lr, lw);
  mpg_topo_destroy(t);
}

Test(device, binding_follows_the_chosen_device) {
  /* One GPU per process: device 0 is physical GPU 3 (bus 42) whatever the
   * local rank, by index and by UUID. */
  expect_bus("3", 5, 8, 1, "0000:42:00.0");
  expect_bus(U2, 1, 8, 1, "0000:41:00.0");
  expect_bus(MIG_OLD, 7, 8, 1, "0000:41:00.0");
  /* A reordered list: local rank 1 of 2 takes device 1 = physical GPU 0. */
  expect_bus("2,0", 1, 2, 2, "0000:01:00.0");
  /* topo's default (-1) could not place local rank 5 of 8 on one GPU. */
  mpg_topo *t = live("3");
  mpg_binding b = MPG_BINDING_INIT;
  cr_assert_eq(mpg_topo_bind(t, 5, 8, -1, MPG_BIND_NUMA, MPG_BIND_APPLY_NONE, &b), MPG_ERR_TOPO);
  mpg_topo_destroy(t);
}
