/*
 * clock.h - nwcd's one clock: CLOCK_MONOTONIC in nanoseconds, for durations (load times, request
 * latencies, uptime) in every module of the daemon and its loader library.  Header-only, so that
 * no module depends on another for it.
 */
#ifndef NWCD_CLOCK_H
#define NWCD_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline uint64_t nwcd_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

#endif
