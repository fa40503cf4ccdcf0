/*
 * loader.c - reads a tensor blob from its container file into a resident buffer with io_uring,
 * checking each 1 MiB chunk's XXH3 checksum as it lands (nwc_store_chunk_check).
 *
 * States of one load:
 *
 *   OPEN ──(O_DIRECT refused: EINVAL)──► OPEN buffered
 *    │
 *    ▼
 *   READING: up to QD chunk reads in flight; a completion either finishes its chunk (checked at
 *    │       once) or was short (the rest is resubmitted); EINVAL from an O_DIRECT read restarts
 *    │       the whole load buffered (some file systems accept the flag and refuse the reads)
 *    ▼
 *   DONE (every chunk read and checked) or FAILED (first error; reads in flight are reaped
 *         before returning, so the buffer is never written after the call returns)
 *
 * Invariants: blob offsets and lengths are multiples of 4096 (the store guarantees it) and the
 * buffer is 4096-aligned, so every read is O_DIRECT-legal; a chunk is checked only after all of
 * its bytes arrived; the function returns only with no read in flight.
 */
#include "nwcd.h"

#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <string.h>
#include <unistd.h>

#define QD 8

typedef struct chunk_state {
  uint64_t done, len;
} chunk_state;

static int load_once(const nwc_tensor_info *ti, void *buf, bool direct, bool *retry_buffered,
                     void (*progress)(void *, uint64_t, uint64_t), void *ctx) {
  int fd = open(ti->path, O_RDONLY | O_CLOEXEC | (direct ? O_DIRECT : 0));
  if (fd < 0 && direct && errno == EINVAL) {
    *retry_buffered = true;
    return -EINVAL;
  }
  NWC_RETURN_IF(fd < 0, -errno, "open %s: %s", ti->path, strerror(errno));
  struct io_uring ring;
  int rc = io_uring_queue_init(QD, &ring, 0);
  if (rc < 0) {
    close(fd);
    return nwc__fail(rc, "io_uring_queue_init: %s", strerror(-rc));
  }
  uint64_t cs = ti->chunk_size ? ti->chunk_size : NWC_STORE_CHUNK;
  uint64_t n = ti->nchunks, next = 0, finished = 0, inflight = 0, bytes = 0;
  chunk_state st[QD];
  uint64_t slot_chunk[QD];
  unsigned free_slots[QD], nfree = QD;
  for (unsigned i = 0; i < QD; i++) free_slots[i] = i;
  int err = 0;
  uint8_t *base = buf;
  while (finished < n) {
    while (!err && next < n && nfree) {
      unsigned s = free_slots[--nfree];
      slot_chunk[s] = next;
      st[s].done = 0;
      st[s].len = next + 1 < n ? cs : ti->length - next * cs;
      struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
      io_uring_prep_read(sqe, fd, base + next * cs, (unsigned)st[s].len, ti->offset + next * cs);
      io_uring_sqe_set_data64(sqe, s);
      next++, inflight++;
    }
    if (!inflight) break;
    rc = io_uring_submit_and_wait(&ring, 1);
    if (rc < 0 && rc != -EINTR) {
      err = nwc__fail(rc, "io_uring_submit: %s", strerror(-rc));
      break; /* nothing new was submitted; what is in flight is reaped below */
    }
    struct io_uring_cqe *cqe;
    unsigned head, seen = 0;
    io_uring_for_each_cqe(&ring, head, cqe) {
      seen++;
      unsigned s = (unsigned)io_uring_cqe_get_data64(cqe);
      uint64_t c = slot_chunk[s];
      int res = cqe->res;
      inflight--;
      if (err) {
        free_slots[nfree++] = s, finished++;
        continue;
      }
      if (res < 0) {
        if (res == -EINVAL && direct) *retry_buffered = true;
        err = nwc__fail(res, "read %s at %llu: %s", ti->path,
                        (unsigned long long)(ti->offset + c * cs), strerror(-res));
        free_slots[nfree++] = s, finished++;
        continue;
      }
      if (res == 0) {
        err = nwc__fail(-EIO, "%s ends before the blob of %s/%s (offset %llu)", ti->path,
                        ti->model, ti->name, (unsigned long long)(ti->offset + c * cs + st[s].done));
        free_slots[nfree++] = s, finished++;
        continue;
      }
      st[s].done += (uint64_t)res;
      bytes += (uint64_t)res;
      if (st[s].done < st[s].len) { /* short read: ask for the rest */
        struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
        io_uring_prep_read(sqe, fd, base + c * cs + st[s].done, (unsigned)(st[s].len - st[s].done),
                           ti->offset + c * cs + st[s].done);
        io_uring_sqe_set_data64(sqe, s);
        inflight++;
        continue;
      }
      int crc = nwc_store_chunk_check(ti, c, base + c * cs);
      if (crc < 0) err = crc;
      free_slots[nfree++] = s, finished++;
      if (progress) progress(ctx, bytes, ti->length);
    }
    io_uring_cq_advance(&ring, seen);
    if (err && !inflight) break;
  }
  while (inflight) { /* reap what an error left in flight */
    struct io_uring_cqe *cqe;
    if (io_uring_submit_and_wait(&ring, 1) < 0 || io_uring_peek_cqe(&ring, &cqe) < 0) break;
    io_uring_cqe_seen(&ring, cqe);
    inflight--;
  }
  io_uring_queue_exit(&ring);
  close(fd);
  return err;
}

int nwcd_load_blob(const nwc_tensor_info *ti, void *buf, nwcd_load_info *li,
                   void (*progress)(void *, uint64_t, uint64_t), void *ctx) {
  uint64_t t0 = nwcd_now_ns();
  bool retry = false;
  int rc = load_once(ti, buf, true, &retry, progress, ctx);
  bool direct = true;
  if (rc < 0 && retry) {
    direct = false;
    bool again = false;
    rc = load_once(ti, buf, false, &again, progress, ctx);
  }
  if (li) {
    li->direct = direct;
    li->bytes = ti->length;
    li->micros = (nwcd_now_ns() - t0) / 1000;
  }
  return rc;
}
