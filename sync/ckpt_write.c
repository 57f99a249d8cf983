/* Checkpoint save, steps 4-5 (ckpt_internal.h): each rank writes its file
 * and a marker; rank 0 waits for every marker, writes the metadata and
 * publishes the directory by one rename; the others wait for that
 * publication.  No communication: a save in the background never touches
 * the context (its thread uses the file system only), and every rank
 * agrees on the result in mpg__ckpt_save_finish. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt_save.h"
#include "groups_internal.h"

static void marker_path(const mpg__ckpt_save *sv, const char *kind, int r, char *buf,
                        size_t cap) {
  snprintf(buf, cap, "%s/.%s-%05d", sv->partial, kind, r);
}

/* This rank's data file (when it writes a chunk), made durable. */
static mpg_status write_data(mpg__ckpt_save *sv) {
  if (!sv->nwrites) return MPG_OK;
  char path[4200];
  mpg__ckpt_data_path(sv->partial, (uint32_t)sv->rank, path, sizeof path);
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return mpg__fail(MPG_ERR_IO, "%s: create: %s", path, strerror(errno));
  mpg_status st = MPG_OK;
  for (int i = 0; i < sv->nwrites && !st; i++)
    st = mpg__ckpt_write_all(fd, sv->writes[i].bytes, (size_t)sv->writes[i].nbytes,
                             sv->writes[i].off, path);
  if (!st && fsync(fd)) st = mpg__fail(MPG_ERR_IO, "%s: fsync: %s", path, strerror(errno));
  if (close(fd) && !st) st = mpg__fail(MPG_ERR_IO, "%s: close: %s", path, strerror(errno));
  return st;
}

static int exists(const char *path) {
  struct stat sb;
  return stat(path, &sb) == 0;
}

/* Read a marker's message (best effort). */
static void read_text(const char *path, char *buf, size_t cap) {
  buf[0] = 0;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  ssize_t n = read(fd, buf, cap - 1);
  buf[n > 0 ? n : 0] = 0;
  close(fd);
}

/* Rank 0: wait until every rank's .done marker is there; a .fail marker
 * or the timeout ends the wait with that rank's error. */
static mpg_status wait_markers(mpg__ckpt_save *sv, double deadline) {
  char path[4200], msg[MPG__CKPT_MSG];
  double nap = 0.1;
  for (int r = 0; r < sv->world;) {
    marker_path(sv, "done", r, path, sizeof path);
    if (exists(path)) {
      r++;
      continue;
    }
    marker_path(sv, "fail", r, path, sizeof path);
    if (exists(path)) {
      read_text(path, msg, sizeof msg);
      sv->relayed = 1;
      return mpg__fail(MPG_ERR_IO, "world rank %d: %s", r,
                       msg[0] ? msg : "its files failed (its message could not be written)");
    }
    if (mpg__ckpt_now() > deadline)
      return mpg__fail(MPG_ERR_TIMEOUT,
                       "world rank %d's files were not durable within %g s (timeout_s); the "
                       "checkpoint was not published",
                       r, sv->timeout);
    mpg__ckpt_sleep_ms(nap);
    nap = nap < 5 ? 2 * nap : 5;
  }
  return MPG_OK;
}

static void parent_of(const char *dir, char *buf, size_t cap) {
  snprintf(buf, cap, "%s", dir);
  char *slash = strrchr(buf, '/');
  if (!slash) snprintf(buf, cap, ".");
  else if (slash == buf) buf[1] = 0;
  else *slash = 0;
}

/* Rank 0: the metadata into dir.partial, then dir.partial becomes dir:
 * a rename, or an atomic swap with the checkpoint already there. */
static mpg_status publish(mpg__ckpt_save *sv) {
  char tmp[4200], meta[4200], parent[4096];
  snprintf(tmp, sizeof tmp, "%s/%s.tmp", sv->partial, MPG__CKPT_META);
  snprintf(meta, sizeof meta, "%s/%s", sv->partial, MPG__CKPT_META);
  mpg_status st = mpg__ckpt_write_file(tmp, sv->meta, sv->meta_len);
  if (!st && rename(tmp, meta))
    st = mpg__fail(MPG_ERR_IO, "%s: rename: %s", tmp, strerror(errno));
  for (int r = 0; r < sv->world && !st; r++) {
    marker_path(sv, "done", r, tmp, sizeof tmp);
    (void)unlink(tmp);
  }
  if (!st) st = mpg__ckpt_fsync_dir(sv->partial);
  if (st) return st;
  int swapped = 0;
  if (rename(sv->partial, sv->dir)) {
    if ((errno != ENOTEMPTY && errno != EEXIST) || !mpg__ckpt_is_checkpoint(sv->dir))
      return mpg__fail(MPG_ERR_IO, "publishing %s as %s: rename: %s", sv->partial, sv->dir,
                       strerror(errno));
    if (renameat2(AT_FDCWD, sv->partial, AT_FDCWD, sv->dir, RENAME_EXCHANGE))
      return mpg__fail(MPG_ERR_IO, "publishing %s over the checkpoint %s: renameat2: %s",
                       sv->partial, sv->dir, strerror(errno));
    swapped = 1;
  }
  parent_of(sv->dir, parent, sizeof parent);
  st = mpg__ckpt_fsync_dir(parent);
  if (swapped) (void)mpg__ckpt_remove_tree(sv->partial); /* the old checkpoint */
  return st;
}

/* The save id in dir/meta.mpgc's header, 0 when unreadable. */
static uint64_t published_id(const mpg__ckpt_save *sv) {
  char path[4200];
  unsigned char h[32];
  snprintf(path, sizeof path, "%s/%s", sv->dir, MPG__CKPT_META);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  ssize_t n = pread(fd, h, sizeof h, 0);
  close(fd);
  if (n != (ssize_t)sizeof h) return 0;
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = v << 8 | h[24 + i];
  return v;
}

/* Ranks other than 0: wait for the publication of this save, or rank 0's
 * .abort, or the timeout. */
static mpg_status wait_publish(mpg__ckpt_save *sv, double deadline) {
  char path[4200], msg[MPG__CKPT_MSG];
  snprintf(path, sizeof path, "%s/.abort", sv->partial);
  double nap = 0.1;
  for (;;) {
    if (published_id(sv) == sv->save_id) return MPG_OK;
    if (exists(path)) {
      read_text(path, msg, sizeof msg);
      sv->relayed = 1;
      return mpg__fail(MPG_ERR_IO, "%s", msg[0] ? msg : "world rank 0 gave up this save");
    }
    if (mpg__ckpt_now() > deadline)
      return mpg__fail(MPG_ERR_TIMEOUT, "%s did not appear within %g s (timeout_s)", sv->dir,
                       sv->timeout);
    mpg__ckpt_sleep_ms(nap);
    nap = nap < 5 ? 2 * nap : 5;
  }
}

static void *write_main(void *arg) {
  mpg__ckpt_save *sv = arg;
  double t0 = mpg__ckpt_now(), deadline = t0 + sv->timeout;
  char path[4200];
  mpg_status st = write_data(sv);
  double t1 = mpg__ckpt_now();
  if (st) snprintf(sv->msg, sizeof sv->msg, "%s", mpg_last_error());
  marker_path(sv, st ? "fail" : "done", sv->rank, path, sizeof path);
  const char *text = st ? sv->msg : "";
  mpg_status ms = mpg__ckpt_write_file(path, text, strlen(text));
  if (!st) st = ms;
  if (sv->rank == 0) {
    if (!st) st = wait_markers(sv, deadline);
    if (!st) st = publish(sv);
    if (st) {
      if (!sv->msg[0]) snprintf(sv->msg, sizeof sv->msg, "%s", mpg_last_error());
      snprintf(path, sizeof path, "%s/.abort", sv->partial);
      (void)mpg__ckpt_write_file(path, sv->msg, strlen(sv->msg));
    }
  } else { /* also after a failure: rank 0 aborts, then every rank agrees */
    int own = st != MPG_OK;
    mpg_status ws = wait_publish(sv, deadline);
    if (!st) st = ws;
    if (own) sv->relayed = 0; /* its own failure, not the one relayed */
  }
  mpg__log(2, "ckpt save %s rank %d: wrote %llu bytes in %.1f ms, then %.1f ms until %s",
           sv->dir, sv->rank, (unsigned long long)sv->file_bytes, 1e3 * (t1 - t0),
           1e3 * (mpg__ckpt_now() - t1), sv->rank ? "published" : "publishing");
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
  st = mpg__ckpt_agree(ck, st, sv->relayed, "mpg_ckpt_save");
  if (st) {
    mpg__saved_error keep;
    mpg__error_save(&keep);
    if (sv->rank == 0) (void)mpg__ckpt_remove_tree(sv->partial);
    st = mpg__fail_wrap(mpg__error_restore(st, &keep), "mpg_ckpt_save(\"%s\")", sv->dir);
  }
  ck->save = NULL;
  mpg__ckpt_save_free(ck, sv);
  return st;
}
