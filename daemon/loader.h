/*
 * loader.h - nwcd's loader (loader.c, the one module that owns io_uring; design comment there):
 * a tensor blob out of its container file, every chunk's checksum checked as it lands, into
 * memory, into a file (a memfd) or through a ring of pinned buffers to a sink (the GPU path).
 * Built with crew.c (crew.h) and, for CUDA builds, loader_cuda.c (loader_cuda.h) as the library
 * nwcd_loader, which the daemon, nwc-bench load and the loader tests call in-process.
 */
#ifndef NWCD_LOADER_H
#define NWCD_LOADER_H

#include "nwc_store.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct nwcd_split nwcd_split; /* crew.h */

typedef struct nwcd_load_info {
  bool direct;           /* some of it was read with O_DIRECT (from the disk, past the cache) */
  uint64_t bytes;        /* bytes loaded: the blob's length, a part's (nwcd_load_opts.from, .to)
                            or, once a crew offer is withdrawn, the owner's and its helpers' */
  uint64_t direct_bytes; /* of bytes, read with O_DIRECT; the rest came through the page cache */
  uint64_t micros;
  /* where the loading thread's time went (ns): in io_uring waiting for reads (hot loads: also
   * copying them), checking chunks (its share; helper threads check beside it), in the sink
   * (ring loads: consume and reclaim without waiting), waiting for the sink to give slots
   * back, and making the destination before (a device copy: allocating it, its lookup table) */
  uint64_t wait_ns, check_ns, sink_ns, drain_ns, alloc_ns;
} nwcd_load_info;
/* Adds li's time split (the *_ns fields) to sum's: several loads' time, taken apart. */
static inline void nwcd_load_info_add(nwcd_load_info *sum, const nwcd_load_info *li) {
  sum->wait_ns += li->wait_ns, sum->check_ns += li->check_ns, sum->sink_ns += li->sink_ns;
  sum->drain_ns += li->drain_ns, sum->alloc_ns += li->alloc_ns;
}

/* Bytes of a blob read and checked so far (monotonic, chunk by chunk), of total. */
typedef void (*nwcd_progress_fn)(void *ctx, uint64_t done, uint64_t total);

enum {
  NWCD_LOAD_AUTO = 0, /* page cache where the blob is cached (buffered reads, IOSQE_ASYNC),
                         O_DIRECT where it is not; blobs up to 4 MiB, and files that refuse
                         O_DIRECT, buffered */
  NWCD_LOAD_DIRECT,   /* O_DIRECT for everything the file system allows */
  NWCD_LOAD_BUFFERED, /* buffered reads only */
};

typedef struct nwcd_load_opts {
  unsigned mode;      /* NWCD_LOAD_* */
  unsigned depth;     /* reads in flight, 1..64; 0: 32 */
  uint64_t read_size; /* bytes per read, a multiple of the chunk size (1 MiB); 0: 1-4 MiB by
                         blob size (ring loads: the slot size) */
  unsigned checkers;  /* threads checking chunks, the loading one included, 1..4; 0: one more
                         per 8 online cores */
  bool hot;           /* page-cache reads one at a time, without IOSQE_ASYNC: the loading thread
                         copies each inside io_uring_enter and checks it while the bytes are in
                         its own cache (for loads that run in as many lanes as there are cores;
                         O_DIRECT reads still go many at a time) */
  uint64_t piece;     /* hot loads: page-cache bytes copied, then checked, this many at a time (a
                         multiple of the chunk size; 0: a whole read at once), so that a read
                         larger than a core's L2 is still checked while its bytes are there */
  nwcd_progress_fn progress; /* may be NULL */
  void *ctx;
  nwcd_split *split; /* an offer to a crew (crew.c): each read is claimed from it first, so the
                        load covers the blob's front and leaves the back to the crew's helpers
                        (its progress then ends short of the blob's length) */
  uint64_t from, to; /* only bytes [from, to) of the blob, at the same offsets of the destination
                        (from a multiple of the chunk size, to one or the blob's end; to 0: the
                        end): a crew helper's part, its chunks named as the blob's */
  bool queued;       /* ring loads: return once every slot is checked and with the sink, leaving
                        the slots whose sink work is still running with it (the ring's next load
                        reclaims them) instead of waiting for that work (a failed load still
                        waits) */
} nwcd_load_opts;

/* Reads ti's blob into buf (ti->length bytes, 4096-aligned) on the calling thread's io_uring
 * (created at its first load, kept for the next), checking every chunk's checksum as it lands.
 * Returns 0, or a negative errno with a detail (-EBADMSG naming the chunk, -EIO for a file that
 * ends early); it returns only with no read in flight, so buf is never written after it.  o may
 * be NULL (defaults); li may be NULL. */
int nwcd_load(const nwc_tensor_info *ti, void *buf, const nwcd_load_opts *o, nwcd_load_info *li);
/* The same with the default options. */
int nwcd_load_blob(const nwc_tensor_info *ti, void *buf, nwcd_load_info *li,
                   nwcd_progress_fn progress, void *ctx);
/* Reads ti's blob into the file fd (a memfd: host residency) at [0, ti->length) with pwrite,
 * through the calling thread's staging ring (8 MiB in slots of 1 MiB, the largest read_size;
 * made at its first call, kept until the thread exits), every chunk checked before it is
 * written.  Returns as nwcd_load (-EBADMSG,
 * -EIO, or the write's error, e.g. -ENOSPC); bytes may have been written when it fails. */
int nwcd_load_fd(const nwc_tensor_info *ti, int fd, const nwcd_load_opts *o, nwcd_load_info *li);
/* A host copy being written (backend_cpu.c makes it): through a writable mapping of its pages
 * (w, a reused spare's) or else into its memfd (fd) with pwrite. */
typedef struct nwcd_host_dst {
  void *w;
  int fd;
} nwcd_host_dst;

/* Loads on the calling thread also report to fn (ctx) until it is set back to NULL: how a
 * request handler sees the progress of loads that residency runs for it. */
void nwcd_load_observe(nwcd_progress_fn fn, void *ctx);

/* A bounded ring of pinned, io_uring-registered buffers (slots) that loads stream through to a
 * sink, e.g. the GPU path: the sink copies each checked slot to the device and gives the slot
 * back when the copy has completed. */
typedef struct nwcd_ring nwcd_ring;

typedef struct nwcd_slot {
  unsigned index;  /* for nwcd_ring_release */
  void *data;      /* the bytes [offset, offset + len) of the blob, checked */
  uint64_t offset, len;
} nwcd_slot;

typedef struct nwcd_sink {
  /* Takes a checked slot (on the loading thread; any order of offsets): 0, or a negative errno
   * that stops the load.  The slot is the sink's until it calls nwcd_ring_release. */
  int (*consume)(void *ctx, nwcd_ring *r, const nwcd_slot *s);
  /* Releases the slots whose use has finished; with wait, blocks until it has released at
   * least one (the loader has no free slot and no read in flight).  0, or a negative errno:
   * then the sink gives up all its slots (nothing of them is read any more). */
  int (*reclaim)(void *ctx, nwcd_ring *r, bool wait);
  void *ctx;
} nwcd_sink;

/* A ring of bytes (0: 256 MiB) in slots of slot_size (0: 4 MiB; a multiple of 1 MiB) of
 * memory mapped and locked here, registered with the ring's own io_uring (reads into a
 * registered buffer skip the page pinning of each read).  Free with nwcd_ring_free. */
int nwcd_ring_create(uint64_t bytes, uint64_t slot_size, nwcd_ring **out);
void nwcd_ring_free(nwcd_ring *r);
/* The ring's memory (e.g. for cudaHostRegister): its bytes and how many slots it holds. */
void *nwcd_ring_memory(const nwcd_ring *r, uint64_t *bytes, unsigned *slots);
/* Writes checked slot s of ti's blob into the host copy dst at its blob offset (nwcd_load_fd's
 * sink, and a load_places' host destination beside its devices): 0, or the write's error. */
int nwcd_slot_to_host(const nwcd_host_dst *dst, const nwc_tensor_info *ti, const nwcd_slot *s);
/* Gives a consumed slot back (on the loading thread: from the sink's consume or reclaim). */
void nwcd_ring_release(nwcd_ring *r, unsigned slot);
/* Streams ti's blob through r to sink (one load at a time per ring: others wait), chunks checked
 * before a slot is consumed.  Returns when every read has completed and every slot is back
 * (the sink's work on them has finished), 0 or the first error; a queued load (o->queued) that
 * succeeds returns with the slots still in the sink's work held by it, and a later load on r
 * reclaims them through its own sink, which must therefore release the same slots in the same
 * way (the GPU ring's sink: in the order their copies were queued on its one stream). */
int nwcd_ring_load(nwcd_ring *r, const nwc_tensor_info *ti, const nwcd_load_opts *o,
                   const nwcd_sink *sink, nwcd_load_info *li);

#endif
