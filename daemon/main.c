/*
 * main.c - nwcd: flags into an nwcd_config, then the startup order that makes failures clean:
 * backend (refuses what this build lacks), a probe of the socket path (a daemon already serving
 * it, or a file in its place, is refused before the store is created), store (its lock makes a
 * second daemon on the same store fail with EBUSY before it touches any socket), residency,
 * workers, and finally the socket and the loop (server.c).  SIGINT/SIGTERM stop accepting, finish what is in flight,
 * release everything and exit 0.  Runs in the foreground, logging to stderr.
 */
#include "clock.h"
#include "config.h"
#include "log.h"
#include "nwcd.h"
#include "ops.h"
#include "server.h"

#include <errno.h>
#include <getopt.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A whole number in [min, max] given to flag (unit: how the message names it, e.g.
 * "microseconds "): 0 and *out, or -1 after a line saying what was expected. */
static int flag_count(const char *flag, const char *unit, const char *arg, long min, long max,
                      unsigned *out) {
  char *end;
  long v = strtol(arg, &end, 10);
  if (!*arg || *end || v < min || v > max) {
    fprintf(stderr, "nwcd: %s: expected %s%ld..%ld, got '%s'\n", flag, unit, min, max, arg);
    return -1;
  }
  *out = (unsigned)v;
  return 0;
}

/* A size given to flag, more than 0: 0 and *out, or -1 after a line saying what was wrong. */
static int flag_size(const char *flag, const char *arg, uint64_t *out) {
  if (nwcd_parse_size(arg, out) < 0) {
    fprintf(stderr, "nwcd: %s: %s\n", flag, nwc_error_detail());
    return -1;
  }
  if (!*out) {
    fprintf(stderr, "nwcd: %s must be more than 0 (e.g. 512M, 2G; leave it out for the default)\n",
            flag);
    return -1;
  }
  return 0;
}

/* Large buffers are mapped for themselves and unmapped when freed, at a fixed size.  glibc's
 * default raises its mmap threshold (up to 32 MiB) each time such a buffer is freed, after which
 * buffers of that size come from the arena of the thread that asks: nwcd's workers and each
 * import's encoder threads (a new set per import) each fill an arena of their own with
 * megabytes of transient copies, reply frames and import buffers, and freed, that memory stays
 * there, arena after arena, far above the heap in use and growing (docs/results.md, "Soak";
 * test_daemon_memory).  Setting the threshold turns its adjustment off (the trim threshold's
 * too). */
#define MMAP_THRESHOLD (256 << 10)

static void usage(FILE *f) {
  char def[256];
  fprintf(f,
          "usage: nwcd --store DIR [--socket PATH] [--backend auto|cpu|cuda] [--budget SIZE]\n"
          "            [--gpu-budget SIZE] [--threads N] [--max-conn-per-uid N] [--poll-us N]\n"
          "            [--verbose] [--quiet] [--discard-unexplained]\n"
          "            [--config FILE] [--log-level error|warning|info|debug]\n"
          "Serves the nwc store in DIR on a Unix socket, in the foreground.\n"
          "  --store DIR       the store (created if missing); one daemon per store\n"
          "  --socket PATH     listening socket (default %s;\n"
          "                    NWC_SOCKET overrides the default for daemon and clients)\n"
          "  --backend B       compute backend: auto (cuda where a GPU exists, else cpu), cpu,\n"
          "                    cuda\n"
          "  --budget SIZE     bytes of host-resident tensors (e.g. 512M, 4G; default half of RAM)\n"
          "  --gpu-budget SIZE bytes of tensors per GPU (default 90%% of its free memory)\n"
          "  --threads N       worker threads (default: online cores)\n"
          "  --max-conn-per-uid N\n"
          "                    connections one client uid may hold at once (default 64)\n"
          "  --poll-us N       after a request, poll this long for the next one before sleeping,\n"
          "                    yielding to other threads (default 300; 0: always sleep)\n"
          "  --config FILE     settings file (default $NWCD_CONFIG, else " NWCD_CONFIG_DEFAULT "\n"
          "                    where it exists; NWCD_CONFIG= for none);\n"
          "                    flags override it; SIGHUP re-reads it\n"
          "  --log-level L     error, warning, info (default) or debug\n"
          "  --verbose         --log-level debug\n"
          "  --quiet           --log-level warning\n"
          "  --discard-unexplained\n"
          "                    delete container files the catalog does not explain (a lost or\n"
          "                    emptied catalog: nwcd refuses such a store without this flag)\n"
          "SIGINT/SIGTERM: stop accepting, finish requests in flight, exit 0.\n",
          nwc_proto_default_socket(def, sizeof def));
}

int main(int argc, char **argv) {
  /* SIGHUP is blocked until its handler is in place (nwcd_service_start, on this thread; the
   * threads started before keep it blocked): a reload asked for as soon as the socket answers
   * would otherwise kill nwcd by the default action. */
  sigset_t hup;
  sigemptyset(&hup);
  sigaddset(&hup, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &hup, NULL);
  nwcd d;
  memset(&d, 0, sizeof d);
  d.cfg = (nwcd_config){.backend = "auto", .max_conn_per_uid = 64, .max_inflight = 64,
                        .max_outq = 64u << 20, .max_outq_uid = 256u << 20, .socket_mode = 0660,
                        .poll_us = 300};
  static const struct option opts[] = {
      {"store", required_argument, 0, 's'},   {"socket", required_argument, 0, 'S'},
      {"backend", required_argument, 0, 'b'}, {"budget", required_argument, 0, 'B'},
      {"threads", required_argument, 0, 't'}, {"max-conn-per-uid", required_argument, 0, 'c'},
      {"verbose", no_argument, 0, 'v'},       {"quiet", no_argument, 0, 'q'},
      {"help", no_argument, 0, 'h'},          {"config", required_argument, 0, 'C'},
      {"log-level", required_argument, 0, 'L'}, {"gpu-budget", required_argument, 0, 'G'},
      {"poll-us", required_argument, 0, 'P'}, {"discard-unexplained", no_argument, 0, 'D'},
      {0, 0, 0, 0}};
  int o;
  unsigned discard = 0;
  opterr = 0; /* a bad flag is one line of ours, not getopt's and the whole usage */
  while ((o = getopt_long(argc, argv, ":s:S:b:B:t:c:vqh", opts, NULL)) != -1) {
    if (nwcd_config_flag(&d.cfg, o, optarg) < 0) return 2; /* config.h: flags over the file */
    switch (o) {
      case 'C': case 'L': break;
      case 's': d.cfg.store_dir = optarg; break;
      case 'S': d.cfg.socket_path = optarg; break;
      case 'b': d.cfg.backend = optarg; break;
      case 'B':
        if (flag_size("--budget", optarg, &d.cfg.budget) < 0) return 2;
        break;
      case 'G':
        if (flag_size("--gpu-budget", optarg, &d.cfg.gpu_budget) < 0) return 2;
        break;
      case 't':
        if (flag_count("--threads", "", optarg, 1, 1024, &d.cfg.threads) < 0) return 2;
        break;
      case 'c':
        if (flag_count("--max-conn-per-uid", "", optarg, 1, 100000, &d.cfg.max_conn_per_uid) < 0)
          return 2;
        break;
      case 'P':
        if (flag_count("--poll-us", "microseconds ", optarg, 0, 1000000, &d.cfg.poll_us) < 0)
          return 2;
        break;
      case 'D': discard = NWC_STORE_DISCARD; break;
      case 'v': d.cfg.verbose = 1, nwcd_log_set_level(NWCD_LOG_DEBUG); break;
      case 'q': nwcd_log_set_level(NWCD_LOG_WARN); break;
      case 'h': usage(stdout); return 0;
      case ':':
        fprintf(stderr, "nwcd: %s needs a value (nwcd --help lists the options)\n",
                argv[optind - 1]);
        return 2;
      default: { /* '?': a long option as written (--help=3 too), a short one by its letter */
        const char *arg = argv[optind - 1];
        char letter[3] = {'-', (char)optopt, 0};
        fprintf(stderr, "nwcd: bad option '%s' (nwcd --help lists the options)\n",
                !strncmp(arg, "--", 2) || !optopt ? arg : letter);
        return 2;
      }
    }
  }
  if (optind == argc && nwcd_config_load(&d.cfg) < 0) return 2;
  if (optind < argc || !d.cfg.store_dir) {
    if (optind < argc)
      fprintf(stderr, "nwcd: unexpected argument '%s' (nwcd --help lists the options)\n",
              argv[optind]);
    else fprintf(stderr, "nwcd: --store DIR (or store = in the config) is required\n");
    return 2;
  }
  int rc = nwcd_backend_get(d.cfg.backend, &d.backend);
  if (rc < 0) {
    fprintf(stderr, "nwcd: --backend %s: %s\n", d.cfg.backend, nwc_error_detail());
    return 1;
  }
  if (!d.cfg.threads) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    d.cfg.threads = n > 0 ? (unsigned)n : 1;
  }
  if (!d.cfg.budget) {
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    d.cfg.budget = pages > 0 && psz > 0 ? (uint64_t)pages * (uint64_t)psz / 2 : (1ull << 30);
  }
  signal(SIGPIPE, SIG_IGN);
  mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD); /* before any thread starts */
  d.start_ns = nwcd_now_ns();
  char def[256];
  const char *sock = d.cfg.socket_path ? d.cfg.socket_path
                                       : nwc_proto_default_socket(def, sizeof def);
  if (!getenv("LISTEN_FDS") && nwcd_server_probe(sock) < 0) { /* before creating the store */
    fprintf(stderr, "nwcd: %s\n", nwc_error_detail());
    return 1;
  }
  rc = nwc_store_open(d.cfg.store_dir, NWC_STORE_CREATE | discard, &d.store);
  if (rc < 0) {
    if (rc == -EBUSY)
      fprintf(stderr, "nwcd: store %s is in use by another daemon (its lock is held)\n",
              d.cfg.store_dir);
    else /* the detail names the path and what failed there */
      fprintf(stderr, "nwcd: store: %s\n", nwc_error_detail());
    if (rc == -EUCLEAN)
      fprintf(stderr, "nwcd: to delete the container files the catalog does not explain (their "
                      "models are lost), start once with --discard-unexplained\n");
    return 1;
  }
  for (uint64_t i = 0; i < nwc_store_swept(d.store); i++) {
    const char *f = nwc_store_swept_file(d.store, i);
    nwcd_log(NWCD_LOG_WARN, "store: removed %s", f ? f : "a file (out of memory for its name)");
  }
  pthread_mutex_init(&d.store_lock, NULL);
  pthread_mutex_init(&d.parked_lock, NULL);
  rc = nwcd_res_create(&d, d.cfg.budget, &d.res);
  if (rc == 0) nwcd_res_set_gpu_budget(d.res, d.cfg.gpu_budget);
  if (rc == 0) rc = nwcd_pool_create(d.cfg.threads, nwcd_ops_run, nwcd_ops_can_batch, &d.pool);
  if (rc == 0) {
    rc = nwcd_server_run(&d);
    if (rc < 0) fprintf(stderr, "nwcd: %s\n", nwc_error_detail());
  }
  nwcd_pool_free(d.pool);
  nwcd_res_free(d.res);
  nwcd_registry_free(&d);
  nwc_store_close(d.store);
  nwcd_config_free();
  pthread_mutex_destroy(&d.store_lock);
  pthread_mutex_destroy(&d.parked_lock);
  if (rc == 0) nwcd_log(NWCD_LOG_INFO, "stopped");
  return rc < 0 ? 1 : 0;
}
