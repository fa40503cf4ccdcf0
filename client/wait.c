/*
 * wait.c - how libnwc-client waits for nwcd's next frame: poll the socket while nothing else
 * wants the CPU, then sleep in recv().
 *
 * Why: a call that sleeps in recv() until the reply comes pays for waking up, and that is not
 * small.  On a virtual machine an idle vCPU halts; once it has halted for longer than the host
 * polls for it (a few hundred microseconds), waking it takes the host's scheduler, and meanwhile
 * the host may hand the physical core's other hyperthread to another tenant, which slows the
 * daemon's own compute on the sibling: on the dev VM a 1-row gather between two processes took
 * twice as long with both sleeping as with the client polling (docs/results.md: waiting by
 * polling).  CUDA's cudaDeviceScheduleYield waits the same way for the same reason.
 *
 * The policy, per connection (nwc_client_set_spin, or NWC_CLIENT_SPIN_US in the environment):
 *   - poll only while this client is the daemon's only busy one: nwcd marks a final reply
 *     NWC_PF_ALONE when no other connection sent it a request in the last 2 ms (the rule that
 *     also lets it compute on its loop thread).  Concurrent clients then sleep, and the
 *     daemon's threads keep the CPUs: 16 clients polling on 16 cores had half the throughput
 *     of 16 sleeping ones (docs/results.md), and neither the yield test below nor the count of
 *     runnable threads stopped that;
 *   - poll: recv(MSG_DONTWAIT), then sched_yield(), for up to the current window;
 *   - a yield that took long (YIELD_RAN_US) means another thread ran on this CPU: polling now
 *     costs someone else's time, so the wait sleeps at once (concurrent clients, a busy machine);
 *   - the window adapts to how long replies take: a reply that came within spin_us (polling or
 *     not) sets it back to spin_us; one that took longer halves it, so a client whose replies
 *     always take longer (a large dequant) soon stops polling and costs nothing extra.
 * spin_us 0 sleeps at once, always.  Only the wait for the first bytes of a frame polls; the
 * rest of a frame that is on its way is read sleeping, as it arrives at once.
 */
#include "client_internal.h"
#include "nwc_number.h"

#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>

#define SPIN_DEFAULT_US 2000u
#define SPIN_MAX_US 1000000u
#define YIELD_RAN_US 20

static int64_t now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (int64_t)t.tv_sec * 1000000 + t.tv_nsec / 1000;
}

int nwc__waiter_init(nwc_waiter *w) {
  const char *env = getenv("NWC_CLIENT_SPIN_US");
  uint64_t us = SPIN_DEFAULT_US;
  if (env && *env && !nwc__u64_of(env, SPIN_MAX_US, &us)) return -EINVAL;
  w->spin_us = w->window_us = (uint32_t)us;
  return 0;
}

int nwc__waiter_set(nwc_waiter *w, unsigned spin_us) {
  if (spin_us > SPIN_MAX_US)
    return -EINVAL;
  w->spin_us = w->window_us = spin_us;
  return 0;
}

/* The next wait's poll: all of spin_us after a reply that came within it, half the last one
 * after a reply that took longer. */
static void adapt(nwc_waiter *w, int64_t waited_us) {
  w->window_us = waited_us <= (int64_t)w->spin_us ? w->spin_us : w->window_us / 2;
}

ssize_t nwc__wait_recv(nwc_waiter *w, bool poll, int fd, void *buf, size_t len) {
  int64_t t0 = now_us(), t = t0;
  ssize_t n;
  int64_t window = poll ? (int64_t)w->window_us : 0;
  while (t - t0 < window) {
    n = recv(fd, buf, len, MSG_DONTWAIT);
    if (n >= 0) return adapt(w, now_us() - t0), n;
    if (errno != EAGAIN && errno != EINTR) return n;
    sched_yield();
    int64_t t1 = now_us();
    if (t1 - t > YIELD_RAN_US) break; /* someone else wanted this CPU */
    t = t1;
  }
  do n = recv(fd, buf, len, 0);
  while (n < 0 && errno == EINTR);
  if (n >= 0) adapt(w, now_us() - t0);
  return n;
}
