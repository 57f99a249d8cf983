/* Checkpoint save, steps 4-5 (ckpt_shared.h): each rank writes its file
 * and its state on the board (dir.lock, ckpt_lock.c); rank 0 waits for
 * every state, writes the metadata, publishes the directory by one rename
 * and writes its verdict; the others wait for the verdict.  A failure on
 * any rank ends every rank's writing at once.  No communication: a save in
 * the background never touches the context (its thread uses the file
 * system only), and every rank agrees on the result in
 * mpg__ckpt_save_finish.  Only rank 0 decides the outcome: a save is
 * published exactly when it returns MPG_OK (or the MPG_ERR_IO that says
 * "is published"). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt_save_shared.h"
#include "groups_internal.h"

/* Every rank polls the board at most every poll_s() while it writes, and
 * naps at most nap_max_ms() while it waits: 50 ms and 10 ms up to 64
 * ranks, longer with more (each poll opens dir.lock: a shared file
 * system's metadata server sees world / nap opens a second), at most 0.5 s
 * and 0.2 s. */
static double world_factor(const mpg__ckpt_save *sv) {
  return sv->world > 64 ? sv->world / 64.0 : 1.0;
}
static double poll_s(const mpg__ckpt_save *sv) {
  double t = 0.05 * world_factor(sv);
  return t < 0.5 ? t : 0.5;
}
static double nap_max_ms(const mpg__ckpt_save *sv) {
  double t = 10.0 * world_factor(sv);
  return t < 200.0 ? t : 200.0;
}

/* While writing: another rank's failure ends this rank's writing at once
 * (rank 0 reads every state, the others rank 0's verdict). */
static mpg_status others_failed(mpg__ckpt_save *sv, unsigned char *states) {
  char verdict = 0, msg[MPG__CKPT_MSG];
  if (sv->rank) {
    mpg_status st = mpg__ckpt_board_read(sv, NULL, &verdict);
    if (st) return st;
    if (verdict != 'A') return MPG_OK;
    sv->relayed = 1;
    st = mpg__ckpt_board_slot(sv, 0, msg, sizeof msg);
    return mpg__fail(st, "%s", msg);
  }
  mpg_status st = mpg__ckpt_board_read(sv, states, NULL);
  for (int r = 0; r < sv->world && !st; r++)
    if (states[r] == 'F') {
      sv->relayed = 1;
      st = mpg__ckpt_board_slot(sv, r, msg, sizeof msg);
      return mpg__fail(st, "world rank %d: %s", r, msg);
    }
  return st;
}

/* This rank's data file (when it writes a chunk), made durable; written in
 * pieces of at most 8 MiB, between which another rank's failure stops it. */
static mpg_status write_data(mpg__ckpt_save *sv, unsigned char *states) {
  if (!sv->nwrites) return MPG_OK;
  char path[4200];
  mpg__ckpt_data_path(sv->partial, (uint32_t)sv->rank, path, sizeof path);
  int fd = openat(sv->partial_fd, strrchr(path, '/') + 1,
                  O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) return mpg__fail(MPG_ERR_IO, "%s: create: %s", path, strerror(errno));
  mpg_status st = MPG_OK;
  double last = mpg__now();
  const uint64_t piece = (uint64_t)8 << 20;
  for (int i = 0; i < sv->nwrites && !st; i++) {
    const mpg__ckpt_write *w = &sv->writes[i];
    for (uint64_t at = 0; at < w->nbytes && !st; at += piece) {
      uint64_t n = w->nbytes - at < piece ? w->nbytes - at : piece;
      st = mpg__file_pwrite_all(fd, w->bytes + at, (size_t)n, w->off + at, path);
      if (!st && mpg__now() - last > poll_s(sv)) {
        st = others_failed(sv, states);
        last = mpg__now();
      }
    }
  }
  if (!st && fsync(fd)) st = mpg__fail(MPG_ERR_IO, "%s: fsync: %s", path, strerror(errno));
  if (close(fd) && !st) st = mpg__fail(MPG_ERR_IO, "%s: close: %s", path, strerror(errno));
  return st;
}

/* Rank 0: wait until every rank's state is 'D'; an 'F' or the timeout ends
 * the wait with that rank's error. */
static mpg_status wait_markers(mpg__ckpt_save *sv, unsigned char *states, double deadline) {
  double nap = 0.1;
  for (;;) {
    mpg_status st = others_failed(sv, states);
    if (st) return st;
    int r = 0;
    while (r < sv->world && states[r] == 'D') r++;
    if (r == sv->world) return MPG_OK;
    if (mpg__now() > deadline)
      return mpg__fail(MPG_ERR_TIMEOUT,
                       "world rank %d's files were not durable within %g s (timeout_s); the "
                       "checkpoint was not published",
                       r, sv->timeout);
    mpg__sleep_ms(nap);
    nap = nap < nap_max_ms(sv) / 2 ? 2 * nap : nap_max_ms(sv);
  }
}

/* Rank 0: the metadata into dir.partial, then dir.partial becomes dir:
 * a rename, or an atomic swap with the checkpoint already there.  From
 * the rename on, the save is published (sv->published): what fails after
 * it (the parent's fsync) says so. */
static mpg_status publish(mpg__ckpt_save *sv) {
  char shown[4200], pname[4200];
  snprintf(shown, sizeof shown, "%s/%s", sv->partial, MPG__CKPT_META);
  snprintf(pname, sizeof pname, "%s.partial", sv->base);
  /* The fixed temporary name: dir.partial is this save's own, and the
   * clean-up of a killed save removes only the names it knows
   * (ckpt_lock.c). */
  mpg_status st = mpg__file_write_whole(sv->partial_fd, MPG__CKPT_META, shown,
                                        MPG__CKPT_META ".tmp", sv->meta, sv->meta_len, 0644);
  if (st) return st;
  int p = sv->parent_fd;
  if (sv->had_old) {
    if (renameat2(p, pname, p, sv->base, RENAME_EXCHANGE))
      return mpg__fail(MPG_ERR_IO, "publishing %s over the checkpoint %s: renameat2: %s",
                       sv->partial, sv->dir, strerror(errno));
  } else if (renameat2(p, pname, p, sv->base, RENAME_NOREPLACE)) {
    /* Without RENAME_NOREPLACE (some network file systems), a rename: it
     * fails on a directory that appeared meanwhile unless it is empty. */
    if ((errno != EINVAL && errno != ENOSYS) || renameat(p, pname, p, sv->base))
      return mpg__fail(MPG_ERR_IO, "publishing %s as %s: rename: %s", sv->partial, sv->dir,
                       strerror(errno));
  }
  sv->published = 1;
  if (fsync(p) && errno != EINVAL && errno != EROFS)
    st = mpg__fail(MPG_ERR_IO,
                   "%s is published (the new checkpoint is in place) but the fsync of its "
                   "parent directory failed: %s; it may not survive a crash of the machine",
                   sv->dir, strerror(errno));
  if (sv->had_old) { /* the old checkpoint, now at dir.partial */
    mpg__saved_error keep;
    mpg__error_save(&keep);
    mpg_status rs = mpg__ckpt_remove_ours(p, pname, sv->partial);
    if (rs) mpg__log(1, "ckpt save %s: the old checkpoint was left at %s: %s", sv->dir,
                     sv->partial, mpg_last_error());
    (void)mpg__error_restore(st, &keep);
  }
  return st;
}

/* Ranks other than 0: wait for rank 0's verdict, or the timeout (which
 * leaves the outcome to rank 0: relayed 2). */
static mpg_status wait_verdict(mpg__ckpt_save *sv, double deadline) {
  double nap = 0.1;
  char verdict = 0, msg[MPG__CKPT_MSG];
  for (;;) {
    mpg_status st = mpg__ckpt_board_read(sv, NULL, &verdict);
    if (st) return st;
    if (verdict == 'P') return MPG_OK;
    if (verdict == 'A') {
      sv->relayed = 1;
      st = mpg__ckpt_board_slot(sv, 0, msg, sizeof msg);
      return mpg__fail(st, "%s", msg);
    }
    if (mpg__now() > deadline) {
      sv->relayed = 2;
      return mpg__fail(MPG_ERR_TIMEOUT,
                       "world rank 0 did not publish %s within %g s (timeout_s)", sv->dir,
                       sv->timeout);
    }
    mpg__sleep_ms(nap);
    nap = nap < nap_max_ms(sv) / 2 ? 2 * nap : nap_max_ms(sv);
  }
}

static void *write_main(void *arg) {
  mpg__ckpt_save *sv = arg;
  double t0 = mpg__now(), deadline = t0 + sv->timeout;
  unsigned char *states = malloc((size_t)sv->world + 1);
  mpg_status st = states ? write_data(sv, states)
                         : mpg__fail(MPG_ERR_NOMEM, "checkpoint save: out of memory");
  double t1 = mpg__now();
  int own = st && !sv->relayed;
  if (st) snprintf(sv->msg, sizeof sv->msg, "%s", mpg_last_error());
  if (!st || (own && sv->rank)) { /* rank 0's failure is its verdict */
    mpg_status ms = mpg__ckpt_board_set(sv, st ? 'F' : 'D', st, sv->msg);
    if (!st && ms) {
      st = ms;
      own = 1;
      snprintf(sv->msg, sizeof sv->msg, "%s", mpg_last_error());
    }
  }
  if (sv->rank == 0) {
    if (!st) st = wait_markers(sv, states, deadline);
    if (!st) st = publish(sv);
    if (st && !sv->msg[0]) snprintf(sv->msg, sizeof sv->msg, "%s", mpg_last_error());
    /* The verdict: every other rank waits for it. */
    mpg_status vs = mpg__ckpt_board_set(sv, sv->published ? 'P' : 'A', st, sv->msg);
    if (vs && !st) st = vs;
  } else if (!sv->relayed) { /* also after its own failure: rank 0 aborts */
    mpg_status ws = wait_verdict(sv, deadline);
    if (!st) st = ws;
    if (own) sv->relayed = 0; /* its own failure, not the one relayed */
  }
  free(states);
  mpg__log(2, "ckpt save %s rank %d: wrote %llu bytes in %.1f ms, then %.1f ms until %s",
           sv->dir, sv->rank, (unsigned long long)sv->file_bytes, 1e3 * (t1 - t0),
           1e3 * (mpg__now() - t1), sv->published || sv->rank ? "the verdict" : "publishing");
  sv->result = st;
  if (st && !sv->msg[0]) snprintf(sv->msg, sizeof sv->msg, "%s", mpg_last_error());
  return NULL;
}

void mpg__ckpt_save_free(mpg_ckpt *ck, mpg__ckpt_save *sv) {
  if (!sv) return;
  for (int i = 0; i < ck->n && sv->pieces; i++) free(sv->pieces[i].hashes);
  free(sv->pieces);
  free(sv->all);
  free(sv->recs);
  free(sv->writes);
  free(sv->meta);
  mpg__ckpt_unlock(sv);
  if (sv->partial_fd >= 0) close(sv->partial_fd);
  if (sv->board_fd >= 0) close(sv->board_fd);
  if (sv->parent_fd >= 0) close(sv->parent_fd);
  free(sv);
}

mpg_status mpg__ckpt_write_start(mpg_ckpt *ck, mpg__ckpt_save *sv) {
  if (ck->opts.async && pthread_create(&sv->thread, NULL, write_main, sv) == 0) {
    sv->threaded = 1;
    return MPG_OK;
  }
  write_main(sv); /* synchronous, or no thread to be had */
  return MPG_OK;
}

mpg_status mpg__ckpt_save_finish(mpg_ckpt *ck) {
  mpg__ckpt_save *sv = ck->save;
  if (sv->threaded) pthread_join(sv->thread, NULL);
  mpg_status st = sv->result;
  if (st) (void)mpg__fail(st, "%s", sv->msg);
  /* A rank that gave up waiting for the verdict (relayed 2) does not know
   * the outcome: it counts only when no rank failed otherwise, i.e. when
   * rank 0 published; then the save is MPG_OK on every rank. */
  st = mpg__ckpt_agree(ck, st, sv->relayed, "mpg_ckpt_save");
  if (st) {
    mpg__saved_error keep;
    mpg__error_save(&keep);
    if (sv->rank == 0 && !sv->published) {
      char pname[4200];
      snprintf(pname, sizeof pname, "%s.partial", sv->base);
      (void)mpg__ckpt_remove_ours(sv->parent_fd, pname, sv->partial);
    }
    st = mpg__fail_wrap(mpg__error_restore(st, &keep), "mpg_ckpt_save(\"%s\")", sv->dir);
  }
  ck->save = NULL;
  mpg__ckpt_save_free(ck, sv);
  return st;
}
