/*
 * import_write.c - the import's writer thread: encoders queue writes (a blob head, a raw-plane
 * chunk) and go on encoding while it writes them to the container file; writes that continue
 * each other in the file go out in one pwritev, large ones through O_DIRECT where the file system
 * takes it.  A buffer stays busy until its write is done.  The first error stops the import.
 */
#include "import_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

/* The most queued writes one pwritev takes. */
#define IOV_MAX_WRITE 16

/* Writes n buffers at off, one after the other (a short write goes on where it stopped). */
static int pwritev_full(int fd, struct iovec *iov, int n, uint64_t off) {
  while (n > 0) {
    ssize_t w = pwritev(fd, iov, n, (off_t)off);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return -errno;
    off += (uint64_t)w;
    for (; n > 0 && (size_t)w >= iov->iov_len; iov++, n--) w -= (ssize_t)iov->iov_len;
    if (n > 0) iov->iov_base = (uint8_t *)iov->iov_base + w, iov->iov_len -= (size_t)w;
  }
  return 0;
}

/* Writes n buffers of len bytes in all to off.  Large writes go through O_DIRECT where the file
 * system takes it (no copy into the page cache; a refusal, EINVAL, turns it off); small ones, and
 * all without it, through the page cache. */
#define DIRECT_MIN_BYTES NWC_STORE_CHUNK

static int write_at(imp *im, struct iovec *iov, int n, uint64_t len, uint64_t off) {
  if (im->dfd >= 0 && len >= DIRECT_MIN_BYTES) {
    struct iovec keep[IOV_MAX_WRITE];
    memcpy(keep, iov, (size_t)n * sizeof *iov);
    int rc = pwritev_full(im->dfd, iov, n, off);
    if (rc != -EINVAL) return rc;
    close(im->dfd);
    im->dfd = -1;
    memcpy(iov, keep, (size_t)n * sizeof *iov);
  }
  int rc = pwritev_full(im->fd, iov, n, off);
  /* Buffered: start writeback of big writes now, so that the fsync before publishing has little
   * left to do (small ones are left to that fsync: a syscall each would cost more). */
  if (rc == 0 && len >= NWC_STORE_CHUNK)
    (void)sync_file_range(im->fd, (off64_t)off, (off64_t)len, SYNC_FILE_RANGE_WRITE);
  return rc;
}

void nwc__imp_set_error(imp *im, int rc) {
  if (rc < 0 && !im->err) {
    im->err = rc;
    snprintf(im->errmsg, sizeof im->errmsg, "%s", nwc_error_detail());
  }
}

void *nwc__imp_writer(void *arg) {
  imp *im = arg;
  pthread_mutex_lock(&im->mu);
  for (;;) {
    while (!im->wq_len && !im->writer_stop) pthread_cond_wait(&im->cv, &im->mu);
    if (!im->wq_len) break;
    /* The queued writes that continue each other in the file go out in one call. */
    wreq q[IOV_MAX_WRITE];
    struct iovec iov[IOV_MAX_WRITE];
    int n = 0;
    uint64_t len = 0;
    while (n < IOV_MAX_WRITE && im->wq_len &&
           (n == 0 || im->wq[im->wq_head].off == q[n - 1].off + q[n - 1].len)) {
      q[n] = im->wq[im->wq_head];
      iov[n] = (struct iovec){(void *)q[n].p, q[n].len};
      len += q[n++].len;
      im->wq_head = (im->wq_head + 1) % im->wq_cap;
      im->wq_len--;
    }
    int skip = im->err != 0;
    pthread_mutex_unlock(&im->mu);
    int rc = skip ? 0 : write_at(im, iov, n, len, q[0].off);
    if (rc < 0)
      rc = nwc__fail(rc, "%s/containers: writing tensor '%s': %s", im->s->dir, q[0].j->st->name,
                     strerror(-rc));
    pthread_mutex_lock(&im->mu);
    nwc__imp_set_error(im, rc);
    for (int k = 0; k < n; k++) *q[k].busy = 0;
    pthread_cond_broadcast(&im->cv);
  }
  pthread_mutex_unlock(&im->mu);
  return NULL;
}

/* Queues a write (im->mu held); *busy stays set until it is done. */
void nwc__imp_enqueue(imp *im, const uint8_t *p, uint64_t len, uint64_t off, const job *j,
                      int *busy) {
  while (im->wq_len == im->wq_cap) pthread_cond_wait(&im->cv, &im->mu);
  im->wq[(im->wq_head + im->wq_len++) % im->wq_cap] = (wreq){p, len, off, j, busy};
  *busy = 1;
  pthread_cond_broadcast(&im->cv);
}

/* Waits (im->mu held) until no write is pending from b. */
void nwc__imp_wbuf_wait(imp *im, wbuf *b) {
  while (b->busy) pthread_cond_wait(&im->cv, &im->mu);
}
