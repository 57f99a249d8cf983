/* The NCCL half of the test double (nccl_double.c): the kernels, one launch
 * per communicator per group run on a user stream: collectives, sends and
 * receives, and the deadlock reports of the watchdog. */

#include "nccl_double_internal.h"

/* ------------------------------------------------------------------ */
/* Kernels: one launch per communicator per group, on a user stream   */
/* ------------------------------------------------------------------ */

static uint64_t posv(uint64_t seq, uint64_t w) { return (seq << 32) | w; }

/* Socket communicators (nccl_double_net.c): a rank's writes to its part of
 * the segment go to its peers' replicas, data before the word that
 * publishes it, in program order.  No-ops on a shared segment. */
static void pub_desc(struct shm_hdr *h, struct shm_desc *d) {
  net_pub(h, PUB_A64, -1, &d->seq, 3 * sizeof(uint64_t));
  net_pub(h, PUB_A32, -1, &d->func, 6 * sizeof(int32_t));
}
static void pub64(struct shm_hdr *h, int dest, _Atomic uint64_t *w) {
  net_pub(h, PUB_A64, dest, w, sizeof *w);
}
static uint64_t round32(uint64_t x) { return (x + 31) & ~(uint64_t)31; }

void desc_store(struct shm_desc *d, const struct task *t, uint64_t scalar) {
  atomic_store_explicit(&d->func, t->func, memory_order_relaxed);
  atomic_store_explicit(&d->count, t->count, memory_order_relaxed);
  atomic_store_explicit(&d->dtype, t->dtype, memory_order_relaxed);
  atomic_store_explicit(&d->op, t->opc, memory_order_relaxed);
  atomic_store_explicit(&d->root, t->root, memory_order_relaxed);
  atomic_store_explicit(&d->reg, t->reg, memory_order_relaxed);
  atomic_store_explicit(&d->scalar, scalar, memory_order_relaxed);
  atomic_store_explicit(&d->seq, t->seq, memory_order_relaxed);
}

static void desc_load(struct shm_desc *d, struct dsc *o) {
  o->seq = atomic_load_explicit(&d->seq, memory_order_relaxed);
  o->count = atomic_load_explicit(&d->count, memory_order_relaxed);
  o->scalar = atomic_load_explicit(&d->scalar, memory_order_relaxed);
  o->func = atomic_load_explicit(&d->func, memory_order_relaxed);
  o->dtype = atomic_load_explicit(&d->dtype, memory_order_relaxed);
  o->op = atomic_load_explicit(&d->op, memory_order_relaxed);
  o->root = atomic_load_explicit(&d->root, memory_order_relaxed);
  o->reg = atomic_load_explicit(&d->reg, memory_order_relaxed);
}

/* "ncclAllReduce(count 1024, ncclFloat32, ncclSum)" */
static void dsc_text(const struct dsc *d, char *b, size_t n) {
  if (d->func == F_NONE) {
    snprintf(b, n, "nothing");
  } else if (is_reduction(d->func) && d->func != F_RED) {
    snprintf(b, n, "%s(count %" PRIu64 ", %s, %s)", func_name(d->func), d->count,
             dt_name(d->dtype), op_name(d->op));
  } else if (d->func == F_RED) {
    snprintf(b, n, "%s(count %" PRIu64 ", %s, %s, root %d)", func_name(d->func), d->count,
             dt_name(d->dtype), op_name(d->op), d->root);
  } else if (d->func == F_BC) {
    snprintf(b, n, "%s(count %" PRIu64 ", %s, root %d)", func_name(d->func), d->count,
             dt_name(d->dtype), d->root);
  } else if (d->func == F_SEND || d->func == F_RECV) {
    snprintf(b, n, "%s(count %" PRIu64 ", %s, peer %d)", func_name(d->func), d->count,
             dt_name(d->dtype), d->root);
  } else {
    snprintf(b, n, "%s(count %" PRIu64 ", %s)", func_name(d->func), d->count, dt_name(d->dtype));
  }
}

void task_text(const struct task *t, char *b, size_t n) {
  struct dsc d = {t->seq, t->count, 0, t->func, t->dtype, t->opc, t->root, t->reg};
  dsc_text(&d, b, n);
}

static int all_at(struct shm_hdr *h, uint64_t want) {
  for (int i = 0; i < h->nranks; i++)
    if (atomic_load_explicit(&seg_rank(h, i)->pos, memory_order_acquire) < want) return 0;
  return 1;
}

/* The pre-multiplier this rank contributes: host immediate, or read from
 * device memory by the kernel (ncclScalarDevice). */
static uint64_t my_scalar(struct launch *L, struct ktask *k) {
  uint64_t bits = 0;
  if (k->t.scal_kind == ncclScalarHostImmediate + 1) return k->t.scal_bits;
  if (k->t.scal_kind == ncclScalarDevice + 1) {
    size_t es = dt_size(k->t.dtype);
    int dev = -1;
    if (dbl_mem_find(k->t.scal_ptr, es, &dev) != DBL_MEM_DEVICE)
      dbl_fatal("nccl double: %s: the scalar of ncclRedOpCreatePreMulSum(..., "
                "ncclScalarDevice) at %p is not live device memory when the kernel reads it "
                "(real NCCL would fault)",
                L->what, k->t.scal_ptr);
    memcpy(&bits, k->t.scal_ptr, es);
  }
  return bits;
}

static void match_fatal(struct launch *L, const struct dsc *mine, int p, const struct dsc *his,
                        const char *why) {
  struct ncclComm *c = L->comm;
  char a[160], b[160];
  dsc_text(mine, a, sizeof a);
  dsc_text(his, b, sizeof b);
  dbl_fatal("nccl double: collective #%" PRIu64 " of communicator %s (%d ranks) does not "
            "match: rank %d called %s but rank %d called %s%s.  Every rank must issue the "
            "same collectives, with the same count, datatype, op and root, in the same order "
            "(real NCCL would hang or corrupt memory)",
            mine->seq, c->name, c->nranks, c->rank, a, p, b, why);
}

/* Compare every rank's call (they have all arrived) and collect their
 * pre-multipliers. */
static void coll_match(struct launch *L, struct ktask *k) {
  struct ncclComm *c = L->comm;
  struct shm_hdr *h = c->shm;
  int b = (int)(k->t.seq & 1);
  struct dsc mine, his;
  desc_load(&seg_rank(h, c->rank)->desc[b], &mine);
  for (int p = 0; p < c->nranks; p++) {
    desc_load(&seg_rank(h, p)->desc[b], &his);
    if (his.seq != mine.seq || his.func != mine.func || his.count != mine.count ||
        his.dtype != mine.dtype ||
        (is_reduction(mine.func) && his.op != mine.op) ||
        ((mine.func == F_BC || mine.func == F_RED) && his.root != mine.root))
      match_fatal(L, &mine, p, &his, "");
    if (his.reg != mine.reg)
      match_fatal(L, &mine, p, &his,
                  mine.reg ? " (with registered buffers on the first rank only: the NCCL user "
                             "guide, \"User Buffer Registration\", requires all ranks or none "
                             "to pass registered buffers; real NCCL would hang)"
                           : " (with registered buffers on the second rank only: the NCCL user "
                             "guide, \"User Buffer Registration\", requires all ranks or none "
                             "to pass registered buffers; real NCCL would hang)");
    if (k->scal) k->scal[p] = his.scalar;
  }
}

static void coll_geometry(struct launch *L, struct ktask *k) {
  struct shm_hdr *h = L->comm->shm;
  size_t es = dt_size(k->t.dtype), n = (size_t)h->nranks;
  k->ch = k->t.func == F_RS ? h->bank / (n * es) : h->bank / es;
  k->nchunks = (k->t.count + k->ch - 1) / k->ch;
}

/* This rank's staging slot of chunk k->chunk: the element size, the
 * chunk's first element and its length in elements come back too. */
static char *chunk_slot(struct launch *L, struct ktask *k, size_t *es, size_t *off,
                        size_t *len) {
  *es = dt_size(k->t.dtype);
  *off = (size_t)k->chunk * k->ch;
  *len = k->t.count - *off < k->ch ? k->t.count - *off : k->ch;
  return seg_slot(L->comm->shm, L->comm->rank, (int)(k->chunk & 1));
}

/* This rank's contribution to chunk k->chunk, into its staging bank. */
static void coll_write(struct launch *L, struct ktask *k) {
  struct ncclComm *c = L->comm;
  size_t es, off, len;
  char *slot = chunk_slot(L, k, &es, &off, &len);
  const char *send = k->t.send;
  switch (k->t.func) {
    case F_AR: case F_RED: case F_AG:
      memcpy(slot, send + off * es, len * es);
      break;
    case F_BC:
      if (c->rank == k->t.root) memcpy(slot, send + off * es, len * es);
      break;
    case F_RS:
      for (int d = 0; d < c->nranks; d++)
        memcpy(slot + (size_t)d * len * es, send + ((size_t)d * k->t.count + off) * es, len * es);
      break;
  }
}

/* A socket communicator: the chunk coll_write staged, to the peers that
 * read it (reduce-scatter: each its own block). */
static void coll_pub(struct launch *L, struct ktask *k) {
  struct ncclComm *c = L->comm;
  struct shm_hdr *h = c->shm;
  size_t es, off, len;
  char *slot = chunk_slot(L, k, &es, &off, &len);
  if (k->t.func == F_RS) {
    for (int d = 0; d < c->nranks; d++)
      if (d != c->rank) net_pub(h, PUB_COPY, d, slot + (size_t)d * len * es, len * es);
  } else if (k->t.func != F_BC || c->rank == k->t.root) {
    net_pub(h, PUB_COPY, -1, slot, len * es);
  }
}

/* Every rank wrote chunk k->chunk: combine into this rank's result. */
static void coll_read(struct launch *L, struct ktask *k) {
  struct ncclComm *c = L->comm;
  struct shm_hdr *h = c->shm;
  int n = c->nranks, bank = (int)(k->chunk & 1);
  size_t es = dt_size(k->t.dtype), off = (size_t)k->chunk * k->ch;
  size_t len = k->t.count - off < k->ch ? k->t.count - off : k->ch;
  char *recv = k->t.recv;
  switch (k->t.func) {
    case F_AR: case F_RED: case F_RS:
      if (k->t.func == F_RED && c->rank != k->t.root) break;
      for (int p = 0; p < n; p++)
        L->srcs[p] = seg_slot(h, p, bank) + (k->t.func == F_RS ? (size_t)c->rank * len * es : 0);
      reduce_elems(k->t.dtype, k->t.opc, n, L->srcs, recv + off * es, len, k->scal, L->acc);
      break;
    case F_BC:
      if (!(c->rank == k->t.root && k->t.send == k->t.recv))
        memcpy(recv + off * es, seg_slot(h, k->t.root, bank), len * es);
      break;
    case F_AG:
      for (int p = 0; p < n; p++)
        memcpy(recv + ((size_t)p * k->t.count + off) * es, seg_slot(h, p, bank), len * es);
      break;
  }
}

/* One step of a collective: 1 progressed, 0 blocked, 2 done. */
static int coll_step(struct launch *L, struct ktask *k) {
  struct ncclComm *c = L->comm;
  struct shm_hdr *h = c->shm;
  struct shm_rank *me = seg_rank(h, c->rank);
  uint64_t seq = k->t.seq;
  switch (k->st) {
    case CS_ARRIVE:
      desc_store(&me->desc[seq & 1], &k->t, my_scalar(L, k));
      atomic_store_explicit(&me->pos, posv(seq, 0), memory_order_release);
      if (h->net) {
        pub_desc(h, &me->desc[seq & 1]);
        pub64(h, -1, &me->pos);
      }
      ww_bump(&h->wake, 1);
      k->st = CS_MATCH;
      return 1;
    case CS_MATCH:
      if (!all_at(h, posv(seq, 0))) return 0;
      coll_match(L, k);
      coll_geometry(L, k);
      k->chunk = 0;
      k->st = CS_WRITE;
      return 1;
    case CS_WRITE:
      coll_write(L, k);
      atomic_store_explicit(&me->pos, posv(seq, k->chunk + 1), memory_order_release);
      if (h->net) {
        coll_pub(L, k);
        pub64(h, -1, &me->pos);
      }
      ww_bump(&h->wake, 1);
      k->st = CS_READ;
      return 1;
    case CS_READ:
      if (!all_at(h, posv(seq, k->chunk + 1))) return 0;
      coll_read(L, k);
      k->chunk++;
      k->st = k->chunk == k->nchunks ? CS_DONE : CS_WRITE;
      return k->st == CS_DONE ? 2 : 1;
  }
  return 2;
}

static void ring_put(char *ring, uint64_t R, uint64_t at, const char *src, uint64_t n) {
  uint64_t o = at % R, first = R - o < n ? R - o : n;
  memcpy(ring + o, src, first);
  if (n > first) memcpy(ring, src + first, n - first);
}

static void ring_get(const char *ring, uint64_t R, uint64_t at, char *dst, uint64_t n) {
  uint64_t o = at % R, first = R - o < n ? R - o : n;
  memcpy(dst, ring + o, first);
  if (n > first) memcpy(dst + first, ring, n - first);
}

/* One step of a send or receive: 1 progressed, 0 blocked, 2 done. */
static int p2p_step(struct launch *L, struct ktask *k) {
  struct ncclComm *c = L->comm;
  struct shm_hdr *h = c->shm;
  uint64_t R = h->ring;
  int send = k->t.func == F_SEND;
  struct shm_chan *ch = send ? seg_chan(h, c->rank, k->t.root) : seg_chan(h, k->t.root, c->rank);
  char *ring = chan_ring(ch);
  switch (k->st) {
    case PS_START:
      atomic_fetch_add(send ? &ch->sends_started : &ch->recvs_started, 1);
      if (h->net) pub64(h, k->t.root, send ? &ch->sends_started : &ch->recvs_started);
      k->bytes = (uint64_t)k->t.count * dt_size(k->t.dtype);
      k->total = round32(k->bytes);
      k->done = 0;
      k->st = PS_HDR;
      ww_bump(&h->wake, 1);
      return 1;
    case PS_HDR:
      if (send) {
        uint64_t head = atomic_load_explicit(&ch->head, memory_order_relaxed);
        uint64_t tail = atomic_load_explicit(&ch->tail, memory_order_acquire);
        if (R - (head - tail) < sizeof(struct msg_hdr)) return 0;
        struct msg_hdr m = {MSG_MAGIC, k->t.seq, k->bytes, k->t.dtype, k->t.reg};
        ring_put(ring, R, head, (const char *)&m, sizeof m);
        atomic_store_explicit(&ch->head, head + sizeof m, memory_order_release);
        if (h->net) {
          net_pub_ring(h, k->t.root, ring, R, head, sizeof m);
          pub64(h, k->t.root, &ch->head);
        }
      } else {
        uint64_t tail = atomic_load_explicit(&ch->tail, memory_order_relaxed);
        uint64_t head = atomic_load_explicit(&ch->head, memory_order_acquire);
        if (head - tail < sizeof(struct msg_hdr)) return 0;
        struct msg_hdr m;
        ring_get(ring, R, tail, (char *)&m, sizeof m);
        if (m.magic != MSG_MAGIC || m.seq != k->t.seq)
          dbl_fatal("nccl double: ring from rank %d to rank %d of %s is out of step: receive "
                    "#%" PRIu64 " found message #%" PRIu64 " (a double bug)",
                    k->t.root, c->rank, c->name, k->t.seq, m.seq);
        if (m.bytes != k->bytes) {
          char mine[160];
          task_text(&k->t, mine, sizeof mine);
          dbl_fatal("nccl double: send/receive mismatch on communicator %s: rank %d's receive "
                    "#%" PRIu64 " from rank %d, %s, expects %" PRIu64 " bytes, but rank %d's "
                    "send #%" PRIu64 " to rank %d carries %" PRIu64 " bytes (%s); NCCL "
                    "requires matching sizes (real NCCL would hang or truncate)",
                    c->name, c->rank, k->t.seq, k->t.root, mine, k->bytes, k->t.root, m.seq,
                    c->rank, m.bytes, dt_name(m.dtype));
        }
        if (m.reg != k->t.reg)
          dbl_fatal("nccl double: registered-buffer mismatch on communicator %s: rank %d's "
                    "send #%" PRIu64 " to rank %d uses %s buffer but rank %d's receive uses %s "
                    "buffer; the NCCL user guide (\"User Buffer Registration\") requires all "
                    "ranks or none to pass registered buffers (real NCCL would hang)",
                    c->name, k->t.root, m.seq, c->rank, m.reg ? "a registered" : "an unregistered",
                    c->rank, k->t.reg ? "a registered" : "an unregistered");
        atomic_store_explicit(&ch->tail, tail + sizeof m, memory_order_release);
        if (h->net) pub64(h, k->t.root, &ch->tail);
      }
      ww_bump(&h->wake, 1);
      k->st = PS_DATA;
      return 1;
    case PS_DATA: {
      if (k->done == k->total) {
        if (!send) return 2;
        k->end = atomic_load_explicit(&ch->head, memory_order_relaxed);
        k->st = PS_ACK;
        return 1;
      }
      uint64_t head, tail, room;
      if (send) {
        head = atomic_load_explicit(&ch->head, memory_order_relaxed);
        tail = atomic_load_explicit(&ch->tail, memory_order_acquire);
        room = R - (head - tail);
      } else {
        tail = atomic_load_explicit(&ch->tail, memory_order_relaxed);
        head = atomic_load_explicit(&ch->head, memory_order_acquire);
        room = head - tail;
      }
      if (room == 0) return 0;
      uint64_t n = k->total - k->done < room ? k->total - k->done : room;
      /* Only the first `bytes` of the padded message carry data. */
      uint64_t data = k->done < k->bytes ? (k->bytes - k->done < n ? k->bytes - k->done : n) : 0;
      if (send) {
        if (data) ring_put(ring, R, head, (const char *)k->t.send + k->done, data);
        atomic_store_explicit(&ch->head, head + n, memory_order_release);
        if (h->net) {
          net_pub_ring(h, k->t.root, ring, R, head, data);
          pub64(h, k->t.root, &ch->head);
        }
      } else {
        if (data) ring_get(ring, R, tail, (char *)k->t.recv + k->done, data);
        atomic_store_explicit(&ch->tail, tail + n, memory_order_release);
        if (h->net) pub64(h, k->t.root, &ch->tail);
      }
      k->done += n;
      ww_bump(&h->wake, 1);
      if (!send && k->done == k->total) return 2;
      return 1;
    }
    case PS_ACK:
      /* Rendezvous: the send is complete once its receiver consumed it. */
      if (atomic_load_explicit(&ch->tail, memory_order_acquire) < k->end) return 0;
      return 2;
  }
  return 2;
}

/* ---- reports ---- */

struct sbuf {
  char *b;
  size_t len, cap;
};

static void sb_add(struct sbuf *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_add(struct sbuf *s, const char *fmt, ...) {
  if (s->len + 1 >= s->cap) return;
  va_list ap;
  va_start(ap, fmt);
  int w = vsnprintf(s->b + s->len, s->cap - s->len, fmt, ap);
  va_end(ap);
  if (w > 0) s->len = s->len + (size_t)w < s->cap ? s->len + (size_t)w : s->cap - 1;
}

static void peer_text(struct sbuf *s, struct ncclComm *c, int p) {
  struct shm_hdr *h = c->shm;
  struct shm_rank *q = seg_rank(h, p);
  int32_t st = atomic_load_explicit(&q->state, memory_order_acquire);
  struct dsc is;
  desc_load(&q->issued, &is);
  char issued[160];
  dsc_text(&is, issued, sizeof issued);
  uint64_t pos = atomic_load(&q->pos);
  sb_add(s, "    rank %d (pid %d, CUDA device %d, world rank %d)%s%s: its kernel is at "
         "collective #%" PRIu64 " (chunks written %" PRIu64 "), %" PRIu64 " kernels started; "
         "the last operation it issued on this communicator is %s #%" PRIu64
         " (collectives issued: %" PRIu64 ")\n",
         p, (int)q->pid, (int)q->device, (int)q->world_rank,
         st == RS_LEFT ? " [destroyed this communicator]" : st == RS_ABORTED ? " [aborted it]" : "",
         rank_dead(h, p) ? (h->net ? " [its connection closed: process exited or network "
                                     "error]" : " [process exited]")
         : net_peer_left(h, p) ? " [closed its connections]" : "", pos >> 32, pos & 0xffffffffu,
         (uint64_t)atomic_load(&q->launches), issued, is.seq,
         (uint64_t)atomic_load(&q->colls_issued));
  if (q->pid == getpid() && q->device != c->device) {
    char dev[2048] = "";
    dbl_device_describe(q->device, dev, sizeof dev);
    sb_add(s, "      its device %d runs: %s\n", (int)q->device, dev[0] ? dev : "nothing");
  }
}

static void report_hang(struct launch *L, double waited) {
  struct ncclComm *c = L->comm;
  struct shm_hdr *h = c->shm;
  struct sbuf s = {malloc(32768), 0, 32768};
  if (!s.b) dbl_fatal("nccl double: deadlock in %s (no memory for the report)", L->what);
  s.b[0] = '\0';
  sb_add(&s, "nccl double: deadlock: rank %d of communicator %s (%d ranks; pid %d, CUDA device "
         "%d, world rank %d) has made no progress for %.1f s in the kernel \"%s\":\n",
         c->rank, c->name, c->nranks, (int)getpid(), c->device, c->world_rank, waited, L->what);
  int coll_seen = 0;
  for (int i = 0; i < L->n; i++) {
    struct ktask *k = &L->k[i];
    char t[160];
    task_text(&k->t, t, sizeof t);
    if (is_coll(k->t.func)) {
      if (k->st == CS_DONE || coll_seen) continue;
      coll_seen = 1;
      uint64_t want = k->st <= CS_MATCH ? posv(k->t.seq, 0) : posv(k->t.seq, k->chunk + 1);
      sb_add(&s, "  it waits in collective #%" PRIu64 " %s (%s) for:\n", k->t.seq, t,
             k->st <= CS_MATCH ? "for every rank to arrive"
                               : "for every rank to write its next chunk");
      for (int p = 0; p < c->nranks; p++)
        if (atomic_load(&seg_rank(h, p)->pos) < want) peer_text(&s, c, p);
    } else if (k->st != PS_DONE && (k->prev < 0 || L->k[k->prev].st == PS_DONE)) {
      int send = k->t.func == F_SEND;
      struct shm_chan *ch = send ? seg_chan(h, c->rank, k->t.root) : seg_chan(h, k->t.root, c->rank);
      sb_add(&s, "  it waits in %s #%" PRIu64 " %s (%s); rank %d's kernels have started %" PRIu64
             " %s from rank %d:\n",
             send ? "send" : "receive", k->t.seq, t,
             send ? (k->st == PS_ACK ? "all data written, not yet received" : "the ring is full")
                  : "no data from the sender",
             k->t.root, (uint64_t)atomic_load(send ? &ch->recvs_started : &ch->sends_started),
             send ? "receives" : "sends", c->rank);
      peer_text(&s, c, k->t.root);
    }
  }
  char dev[2048] = "";
  dbl_device_describe(c->device, dev, sizeof dev);
  sb_add(&s, "  this rank's device %d runs: %s\n", c->device, dev[0] ? dev : "nothing");
  if (c->device >= 0 && c->device < MAX_DEV_TRACK) {
    pthread_mutex_lock(&drain_mu);
    if (drain_what[c->device][0])
      sb_add(&s, "  and %s waits for this kernel: it frees device memory, and cudaFree waits "
             "for every kernel of the device (NVIDIA/nccl PR 564, issues 829 and 1013): set "
             "every communicator's abort flag before freeing any\n", drain_what[c->device]);
    pthread_mutex_unlock(&drain_mu);
  }
  sb_add(&s, "Real NCCL would hang here: its kernels spin until the peers reach the same "
         "operation.  The ranks issued this communicator's operations in different orders, a "
         "peer never issued it, a send has no matching receive, or a peer's device is held by "
         "another communicator's kernel (NCCL user guide, \"Using multiple NCCL communicators "
         "concurrently\").");
  dbl_fatal("%s", s.b);
}

/* The position the first unfinished collective of this launch waits for
 * every rank to reach (0: none). */
static uint64_t coll_want(const struct launch *L) {
  for (int i = 0; i < L->n; i++) {
    const struct ktask *k = &L->k[i];
    if (!is_coll(k->t.func) || k->st == CS_DONE) continue;
    return k->st <= CS_MATCH ? posv(k->t.seq, 0) : posv(k->t.seq, k->chunk + 1);
  }
  return 0;
}

/* A peer process we wait for has exited: the kernel keeps waiting (as an
 * NCCL kernel does) but the communicator reports ncclRemoteError, the code
 * of a closed connection (misc/socket.cc:71-73), until someone aborts.
 * Over sockets a peer that closed its connections cleanly (it destroyed or
 * aborted the communicator) before reaching the collective this kernel
 * waits in counts too: NCCL's transports have no goodbye, and its proxy
 * sees the same closed connection (socket.cc:71-73). */
static void check_dead_peers(struct launch *L) {
  struct ncclComm *c = L->comm;
  struct shm_hdr *h = c->shm;
  if (L->dead_reported) return;
  char who[512] = "";
  size_t len = 0;
  uint64_t want = h->net ? coll_want(L) : 0;
  for (int p = 0; p < c->nranks && len < sizeof who - 64; p++) {
    struct shm_rank *q = seg_rank(h, p);
    int left = want && net_peer_left(h, p) && atomic_load(&q->pos) < want;
    if ((!h->net && q->pid == getpid()) || !(rank_dead(h, p) || left)) continue;
    len += (size_t)snprintf(who + len, sizeof who - len, "%srank %d (pid %d, CUDA device %d)",
                            len ? ", " : "", p, (int)q->pid, (int)q->device);
  }
  if (!len) return;
  char msg[1024];
  snprintf(msg, sizeof msg,
           "socketProgress: Connection closed by remote peer (meshpg double: %s of communicator "
           "%s exited or left it while rank %d's kernel \"%s\" waited for it; the kernel waits until "
           "ncclCommAbort)",
           who, c->name, c->rank, L->what);
  set_async(c, ncclRemoteError, msg);
  dbl_log("%s", msg);
  L->dead_reported = 1;
}

void launch_free(struct launch *L) {
  for (int i = 0; i < L->n; i++) free(L->k[i].scal);
  free(L->k);
  free(L->srcs);
  free(L->acc);
  free(L);
}

/* The kernel: runs on the stream's executor.
 *
 * An abort cuts it short, and the stream goes on: ncclCommAbort raises the
 * communicator's abort flags at once (setCommAbortFlags, init.cc:2394-2403,
 * called at init.cc:2515 before anything is freed); every wait of a device
 * primitive polls the flag (checkAbort, device/primitives.h:142-152, e.g.
 * waitPeer's loop, device/prims_simple.h:115-117), and once it is seen the
 * primitives move no more data ("if user abort the kernel, we don't need to
 * actually perform copy/reduce", prims_simple.h:238-240) and the kernel's
 * work loop ends (`while (ncclShmem.aborted == 0)`, device/common.h:385).
 * The kernel then returns like any other, so the stream's later work, an
 * event recorded after the collective included, completes: an event that
 * fired does not mean the data moved.  Here: an aborted kernel stops at its
 * next poll of sh->abort (or never starts), leaves the receive buffer as it
 * is, and finishes its stream item. */
void launch_run(void *arg) {
  struct launch *L = arg;
  struct ncclComm *c = L->comm;
  struct dbl_shared *sh = c->sh;
  struct shm_hdr *h = c->shm;
  uint64_t t;
  while ((t = atomic_load(&L->ticket)) == 0) sleep_us(20); /* set right after the submit */
  int aborted = 0;

  /* A communicator's kernels run one after the other in issue order
   * (enqueue.cc:1495-1502 and 1716-1723), aborted or not: `done` counts
   * the family's finished kernels in ticket order. */
  double since = dbl_now();
  for (;;) {
    uint32_t seen = atomic_load(&sh->wake.seq);
    if (atomic_load(&sh->done) >= t - 1) break;
    ww_sleep(&sh->wake, seen, 20, 0);
    if (dbl_now() - since > hang_seconds())
      dbl_fatal("nccl double: deadlock: kernel \"%s\" (rank %d of %s) waited %.1f s for the "
                "communicator's previous kernel to finish (NCCL runs a communicator's kernels "
                "in issue order, enqueue.cc:1495-1502); this device runs: see the CUDA half's "
                "report",
                L->what, c->rank, c->name, dbl_now() - since);
  }

  aborted = atomic_load(&sh->abort);
  if (!aborted) {
    if (fault_hit(FAULT_KILL, L->world_rank, L->nth_first, L->nth_last)) {
      fprintf(stderr, "meshpg double: MESHPG_DOUBLE_FAULT kill: world rank %d (pid %d) raises "
              "SIGKILL at its operation #%" PRIu64 "..%" PRIu64 " (%s)\n",
              L->world_rank, (int)getpid(), L->nth_first, L->nth_last, L->what);
      fflush(stderr);
      raise(SIGKILL);
    }
    if (fault_hit(FAULT_HANG, L->world_rank, L->nth_first, L->nth_last)) {
      dbl_log("nccl double: MESHPG_DOUBLE_FAULT hang: \"%s\" (world rank %d) never arrives",
              L->what, L->world_rank);
      while (!atomic_load(&sh->abort)) {
        uint32_t seen = atomic_load(&h->wake.seq);
        if (atomic_load(&sh->abort)) break;
        ww_sleep(&h->wake, seen, 50, 1);
      }
      aborted = 1;
    }
  }

  if (!aborted) {
    atomic_fetch_add(&seg_rank(h, c->rank)->launches, 1);
    if (h->net) pub64(h, -1, &seg_rank(h, c->rank)->launches);
    since = dbl_now();
    double last_dead = since;
    for (;;) {
      uint32_t seen = atomic_load(&h->wake.seq);
      if (atomic_load(&sh->abort)) {
        aborted = 1;
        break;
      }
      int pending = 0, progressed = 0, coll_busy = 0;
      for (int i = 0; i < L->n; i++) {
        struct ktask *k = &L->k[i];
        int r;
        if (is_coll(k->t.func)) {
          /* a launch's collectives run in order */
          if (k->st == CS_DONE) continue;
          pending = 1;
          if (coll_busy) continue;
          coll_busy = 1;
          while ((r = coll_step(L, k)) == 1) progressed = 1;
          if (r == 2) {
            progressed = 1;
            coll_busy = 0;
            k->st = CS_DONE;
          }
        } else {
          if (k->st == PS_DONE) continue;
          pending = 1;
          if (k->prev >= 0 && L->k[k->prev].st != PS_DONE) continue; /* ring order */
          while ((r = p2p_step(L, k)) == 1) progressed = 1;
          if (r == 2) {
            progressed = 1;
            k->st = PS_DONE;
          }
        }
      }
      if (!pending) break;
      double now = dbl_now();
      if (progressed) {
        since = now;
        dbl_note_progress(); /* the host's wait on this stream is not hung */
        continue;
      }
      ww_sleep(&h->wake, seen, 20, 1);
      now = dbl_now();
      if (now - last_dead > 0.1) {
        last_dead = now;
        check_dead_peers(L);
      }
      if (now - since > hang_seconds()) report_hang(L, now - since);
    }
  }

  if (!aborted) {
    for (int i = 0; i < L->n; i++) dbl_count_collective();
    const struct fault *f = fault_hit(FAULT_ASYNC, L->world_rank, L->nth_first, L->nth_last);
    if (f) {
      char msg[512];
      snprintf(msg, sizeof msg, "meshpg double: injected fault MESHPG_DOUBLE_FAULT=async:%d:%" PRIu64
               " in \"%s\" (rank %d of %s)", f->rank, f->nth, L->what, c->rank, c->name);
      set_async(c, ncclSystemError, msg);
    }
  }
  atomic_store(&sh->done, t); /* done was t - 1: nothing else moves it now */
  ww_bump(&sh->wake, 0);
  atomic_fetch_add(&c->own_done, 1);
  launch_free(L);
  comm_unref(c);
}
