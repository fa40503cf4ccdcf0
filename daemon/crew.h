/*
 * crew.h - the lanes of one model load help each other finish (crew.c): a lane that has run out
 * of tensors takes parts of the large blobs other lanes are still loading.
 */
#ifndef NWCD_CREW_H
#define NWCD_CREW_H

#include "loader.h"

#include <stdint.h>

/* A model's tensors load in this many lanes at once (ops_load.c): into host memory 8, into GPU
 * memory 16, and the cuda backend keeps as many staging rings per device (gpu_staging.c).  A
 * warm load into GPU memory is bound by the CPU: each lane copies the page cache into its ring
 * and checks the chunks (a hot load), at a few GB/s per core on the H200 host, so its lanes are
 * as many as that host's 16 cores (docs/results.md). */
#define NWCD_LOAD_LANES 8
#define NWCD_GPU_LOAD_LANES 16
/* The most bytes a lane that has run out of tensors takes of another's at once (crew.c), onto a
 * device or into host memory: a GPU ring's slot, 4 MiB. */
#define NWCD_CREW_PART (4u << 20)

/* crew.c: the lanes of one model load help each other finish.  A crew is made per load, each
 * lane joins it (a thread-local) for its loads; a lane's load of a large blob offers it, reads it
 * from the front and withdraws the offer when done; a lane with no tensor left helps, taking
 * parts from the back of the offers through the offer's part function. */
typedef struct nwcd_crew nwcd_crew;
/* Loads bytes [off, off + len) of an offered blob for a helper: 0 or -errno with a detail. */
typedef int (*nwcd_part_fn)(void *ctx, uint64_t off, uint64_t len, nwcd_load_info *li);
/* A crew whose helpers take parts of at most part bytes; NULL without memory. */
nwcd_crew *nwcd_crew_new(uint64_t part);
void nwcd_crew_free(nwcd_crew *c);
/* The calling thread's loads offer their blobs to c from now on (NULL: to none). */
void nwcd_crew_join(nwcd_crew *c);
nwcd_crew *nwcd_crew_joined(void);
/* Offers a blob of length bytes (parts at multiples of align, the chunk size) to c; NULL when
 * it is too small to share (under three parts) or c is NULL: the owner then loads it all. */
nwcd_split *nwcd_crew_offer(nwcd_crew *c, uint64_t length, uint64_t align, nwcd_part_fn fn,
                            void *ctx);
/* The owner's next read, [from, from + len): the bytes of it still the owner's (0: helpers took
 * the rest of the blob). */
uint64_t nwcd_split_claim(nwcd_split *s, uint64_t from, uint64_t len);
/* Ends the offer after the owner's load (rc its result, li its nwcd_load_info or NULL): waits
 * for the parts helpers are loading, then loads itself (the offer's function, on this thread)
 * each part a helper failed to load; returns rc, else that load's error, else 0 (every byte of
 * the blob loaded; the helpers' bytes, O_DIRECT bytes and the wait added to li). */
int nwcd_crew_withdraw(nwcd_split *s, int rc, nwcd_load_info *li);
/* Takes and loads spare parts of c's offers until none has one; their time split adds to sum
 * (nwcd_load_info_add; sum may be NULL). */
void nwcd_crew_help(nwcd_crew *c, nwcd_load_info *sum);
/* Parts and bytes that helpers took so far. */
void nwcd_crew_taken(const nwcd_crew *c, uint64_t *parts, uint64_t *bytes);

#endif
