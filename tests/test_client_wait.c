/*
 * test_client_wait.c - libnwc-client's wait for replies (client/wait.c) on real sockets: the
 * bytes come through whatever the policy, a reply slower than the poll makes the connection
 * sleep instead of polling (and the poll shrink), a quick one restores it, a peer that closes
 * ends the wait, another thread that wants the CPU stops the poll at once, and bad settings are
 * refused.  CPU time is the waiting thread's own (CLOCK_THREAD_CPUTIME_ID); every bound leaves
 * a wide margin to what the failing behaviour would cost (polling the whole wait).
 */
#include "client_internal.h"
#include "nwc_client.h"

#include "test_util.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <sys/socket.h>

static double thread_cpu_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static void sleep_ms(double ms) {
  struct timespec t = {(time_t)(ms / 1e3), (long)((ms - (time_t)(ms / 1e3) * 1e3) * 1e6)};
  while (nanosleep(&t, &t) < 0 && errno == EINTR) {
  }
}

typedef struct peer {
  int fd;
  double delay_ms;
  bool close_instead; /* shut the socket instead of writing */
  uint8_t msg[64];
} peer;

static void *peer_main(void *arg) {
  peer *p = arg;
  sleep_ms(p->delay_ms);
  if (p->close_instead) shutdown(p->fd, SHUT_WR);
  else if (write(p->fd, p->msg, sizeof p->msg) != (ssize_t)sizeof p->msg) abort();
  return NULL;
}

/* One wait on a fresh socketpair whose peer answers (or closes) after delay_ms, or before the
 * wait starts when delay_ms is negative (a reply that is already there, whatever the machine's
 * load); returns what nwc__wait_recv returned and the waiting thread's CPU milliseconds. */
static ssize_t one_wait(nwc_waiter *w, double delay_ms, bool close_instead, double *cpu_ms) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) < 0) abort();
  peer p = {.fd = sv[1], .delay_ms = delay_ms, .close_instead = close_instead};
  for (size_t i = 0; i < sizeof p.msg; i++) p.msg[i] = (uint8_t)test_rand();
  pthread_t th;
  if (delay_ms < 0) p.delay_ms = 0, peer_main(&p);
  else pthread_create(&th, NULL, peer_main, &p);
  uint8_t got[256];
  double c0 = thread_cpu_ms();
  ssize_t n = nwc__wait_recv(w, true, sv[0], got, sizeof got);
  *cpu_ms = thread_cpu_ms() - c0;
  if (delay_ms >= 0) pthread_join(th, NULL);
  if (n == (ssize_t)sizeof p.msg) CHECK(!memcmp(got, p.msg, sizeof p.msg), "bytes changed on the way");
  else if (!close_instead) CHECK(0, "recv returned %zd, want %zu", n, sizeof p.msg);
  close(sv[0]), close(sv[1]);
  return n;
}

static atomic_bool busy_stop;
static void *busy_main(void *arg) {
  (void)arg;
  while (!atomic_load_explicit(&busy_stop, memory_order_relaxed)) {
  }
  return NULL;
}

static void pin_to(pthread_t th, int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  pthread_setaffinity_np(th, sizeof set, &set);
}

int main(void) {
  test_seed("test_client_wait");
  double cpu;
  nwc_waiter w;

  /* A reply already there: returned at once, and the poll stays whole. */
  CHECK(nwc__waiter_set(&w, 2000) == 0, "set 2000");
  CHECK(one_wait(&w, -1, false, &cpu) == 64, "immediate reply");
  CHECK(w.window_us == 2000, "poll after a quick reply: %u us, want 2000", w.window_us);

  /* A reply 60 ms away with a 2 ms poll: the thread polls at most ~2 ms, then sleeps. */
  CHECK(one_wait(&w, 60, false, &cpu) == 64, "slow reply");
  CHECK(cpu < 25, "waiting 60 ms with a 2 ms poll took %.1f ms of CPU (polled the whole wait?)", cpu);
  CHECK(w.window_us == 1000, "poll after a slow reply: %u us, want 1000 (halved)", w.window_us);
  CHECK(one_wait(&w, 60, false, &cpu) == 64, "slow reply");
  CHECK(w.window_us == 500, "poll after two slow replies: %u us, want 500", w.window_us);
  CHECK(one_wait(&w, -1, false, &cpu) == 64, "quick reply");
  CHECK(w.window_us == 2000, "a quick reply restores the poll: %u us, want 2000", w.window_us);

  /* The peer closes: the wait ends with 0, polling or sleeping. */
  CHECK(one_wait(&w, -1, true, &cpu) == 0, "close seen while polling");
  CHECK(nwc__waiter_set(&w, 1000) == 0, "set 1000");
  CHECK(one_wait(&w, 30, true, &cpu) == 0, "close seen while sleeping");

  /* spin 0: never polls. */
  CHECK(nwc__waiter_set(&w, 0) == 0, "set 0");
  CHECK(one_wait(&w, 60, false, &cpu) == 64, "reply with no poll");
  CHECK(cpu < 25, "a wait with no poll took %.1f ms of CPU", cpu);

  /* Another thread that wants this CPU: a 1 s poll stops at its first long yield.  Failing, the
   * waiter would poll the whole 200 ms, sharing the CPU (about 100 ms of CPU). */
  cpu_set_t mine;
  CHECK(pthread_getaffinity_np(pthread_self(), sizeof mine, &mine) == 0, "affinity");
  int cpu0 = 0;
  while (cpu0 < CPU_SETSIZE && !CPU_ISSET(cpu0, &mine)) cpu0++;
  pthread_t busy;
  pthread_create(&busy, NULL, busy_main, NULL);
  pin_to(busy, cpu0);
  pin_to(pthread_self(), cpu0);
  sleep_ms(20); /* let the busy thread start on that CPU */
  CHECK(nwc__waiter_set(&w, 1000000) == 0, "set 1 s");
  CHECK(one_wait(&w, 200, false, &cpu) == 64, "reply while the CPU is contended");
  CHECK(cpu < 50, "waiting 200 ms next to a busy thread took %.1f ms of CPU (kept polling?)", cpu);
  atomic_store(&busy_stop, true);
  pthread_join(busy, NULL);
  pthread_setaffinity_np(pthread_self(), sizeof mine, &mine);

  /* Bad settings: refused with a message. */
  CHECK(nwc__waiter_set(&w, 1000001) == -EINVAL, "a 1.000001 s poll must be refused");
  setenv("NWC_CLIENT_SPIN_US", "2ms", 1);
  nwc_client *c = NULL;
  int rc = nwc_client_connect("/nonexistent/nwcd.sock", &c);
  CHECK(rc == -EINVAL && strstr(nwc_client_last_error(), "NWC_CLIENT_SPIN_US"),
        "NWC_CLIENT_SPIN_US=2ms: connect returned %d (%s), want -EINVAL naming the variable", rc,
        nwc_client_last_error());
  setenv("NWC_CLIENT_SPIN_US", "300", 1);
  CHECK(nwc__waiter_init(&w) == 0 && w.spin_us == 300, "NWC_CLIENT_SPIN_US=300 read as %u",
        w.spin_us);
  unsetenv("NWC_CLIENT_SPIN_US");
  CHECK(nwc__waiter_init(&w) == 0 && w.spin_us == 2000, "default poll %u us, want 2000", w.spin_us);
  return test_exit("test_client_wait");
}
