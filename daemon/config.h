/*
 * config.h - nwcd's settings (config.c): the command-line flags' nwcd_config, the config file
 * (/etc/nwc/nwcd.conf, inih) parsed at start under the flags and re-read on SIGHUP, the sizes and
 * log levels both take, and the default socket path.  The file's settings that nwcd_config lacks
 * live in config.c.
 *
 * One daemon per process: config.c keeps the active settings in file-scope statics, touched by
 * the loop thread, except where a function says otherwise.
 */
#ifndef NWCD_CONFIG_H
#define NWCD_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#define NWCD_CONFIG_DEFAULT "/etc/nwc/nwcd.conf"

/* What the flags fill; the config file adds what they leave out. */
typedef struct nwcd_config {
  const char *store_dir;
  const char *socket_path; /* NULL: nwc_proto_default_socket() */
  const char *backend;     /* "auto", "cpu", "cuda" */
  uint64_t budget;         /* bytes of resident tensors; 0: half of physical memory */
  uint64_t gpu_budget;     /* bytes of device copies per CUDA device; 0: 90% of its free memory */
  unsigned threads;        /* worker threads; 0: online cores */
  unsigned max_conn_per_uid;
  unsigned max_inflight;   /* requests in flight per connection before reading pauses */
  uint64_t max_outq;       /* queued reply bytes per connection before reading pauses */
  uint64_t max_outq_uid;   /* queued reply bytes of one uid's connections together, same */
  unsigned poll_us;        /* the loop polls this long after a request before it sleeps; 0 never */
  unsigned socket_mode;    /* 0660 */
  int verbose;
} nwcd_config;

/* Parses "512M", "2G", "1.5GiB", "1048576": 0 and *out, or -EINVAL. */
int nwcd_parse_size(const char *s, uint64_t *out);

struct nwcd;

/* The file's settings (those nwcd_config has are copied into it). */
typedef struct nwcd_settings {
  char *store, *socket, *backend, *admin_group;
  unsigned socket_mode, threads, max_conn_per_uid, max_inflight, poll_us;
  uint64_t budget, gpu_budget, max_outq, max_outq_uid;
  int log_level;        /* -1: not set */
  int admin_line;       /* the line of admin_group, for its error */
  char **preload;       /* model names, npreload of them */
  size_t npreload;
  unsigned set;         /* NWCD_SET_* bits of the keys the file sets */
} nwcd_settings;

enum {
  NWCD_SET_STORE = 1u << 0, NWCD_SET_SOCKET = 1u << 1, NWCD_SET_MODE = 1u << 2,
  NWCD_SET_BACKEND = 1u << 3, NWCD_SET_BUDGET = 1u << 4, NWCD_SET_THREADS = 1u << 5,
  NWCD_SET_CONN = 1u << 6, NWCD_SET_INFLIGHT = 1u << 7, NWCD_SET_OUTQ = 1u << 8,
  NWCD_SET_LOGLEVEL = 1u << 9, NWCD_SET_ADMIN = 1u << 10, NWCD_SET_PRELOAD = 1u << 11,
  NWCD_SET_GPU = 1u << 12, NWCD_SET_POLL = 1u << 13, NWCD_SET_OUTQ_UID = 1u << 14,
};

/* Called by main.c for every option getopt returns, before its own switch: records which
 * settings the command line gives (they win over the file, at start and on reload) and handles
 * the options of this module ('C' --config PATH, 'L' --log-level LEVEL).  Returns 0, or -EINVAL
 * after printing why (main exits 2). */
int nwcd_config_flag(nwcd_config *cfg, int opt, const char *arg);
/* After the flags: reads the config file (--config PATH, else /etc/nwc/nwcd.conf where it
 * exists) into cfg under the flags.  0, or -errno after printing "FILE:LINE: why". */
int nwcd_config_load(nwcd_config *cfg);
/* SIGHUP (loop thread): re-reads the file and applies budgets, limits, log level, admin group
 * and the preload list; logs what needs a restart.  A file that does not parse changes nothing
 * (logged).  Returns 0 (the caller, notify.c, then starts a preload pass) or the parse error. */
int nwcd_config_reload(struct nwcd *d);
/* A copy of the active preload list (any thread): 0 and *out (n strdup'ed names in a
 * malloc'ed array: free each and the array), or -ENOMEM. */
int nwcd_config_preload(char ***out, size_t *n);
/* Frees the active settings (at exit). */
void nwcd_config_free(void);

#endif
