/*
 * nwcd.h - the daemon as main.c assembles it: its settings, backend, store, residency, workers
 * and server, which the modules reach through the nwcd handle (not installed).  Each module has
 * a header of its own:
 *
 *   main.c          flags -> nwcd_config, signals, startup and shutdown order
 *   server.h        libuv loop: listening socket, connections, framing, back-pressure, replies
 *   job.h           a request between the server, the workers and the handlers
 *   ops.h           request handlers (ops*.c, on worker threads), replies, matvec batching rule
 *   pool.h          worker threads and their job queue (batching by a rule it is given)
 *   residency.h     resident tensors: states, budget, LRU, reference counts, client mappings
 *   loader.h        io_uring reads of blobs, chunk checksums checked as they land (crew.h: the
 *                   lanes of a model load; loader_cuda.h: its GPU end)
 *   backend.h       compute backends: cpu, cuda (backend_cuda.h, gpu_staging.h)
 *   config.h, notify.h, policy.h  flags and the config file, systemd glue, access policy
 *   log.h, clock.h  log lines and the monotonic clock, used by all of them
 *
 * Threads: the loop thread owns connections and sockets; worker threads run jobs.  The store is
 * safe to call from any thread (it serializes its writes, and answers reads on a connection of
 * their own from the last commit); nwcd.store_lock orders what must not interleave around it:
 * a removal (its resident tensors dropped, then its rows) against residency's lookups (a tensor's
 * row read, then its entry made), and a verify against both.  Residency has its own mutex.
 * Lock order: store_lock before the residency mutex, never the other way round.
 */
#ifndef NWCD_H
#define NWCD_H

#include "backend.h"
#include "config.h"
#include "nwc_store.h"
#include "pool.h"
#include "residency.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#define NWCD_VERSION "nwcd 0.1.0"

typedef struct nwcd_stats {
  atomic_uint_fast64_t requests, errors, conn_total, batched_passes, batched_columns;
  atomic_uint_fast64_t connections;
} nwcd_stats;

typedef struct nwcd {
  nwcd_config cfg;
  const nwcd_backend *backend;
  nwc_store *store;
  pthread_mutex_t store_lock;
  nwcd_res *res;
  struct nwcd_pool *pool;
  struct nwcd_server *server;
  nwcd_stats stats;
  uint64_t start_ns;
  struct nwcd_parked *parked; /* pulls that stopped part way (ops_registry.c), under parked_lock */
  pthread_mutex_t parked_lock;
} nwcd;

#endif
