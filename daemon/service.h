/*
 * service.h - nwcd as a service (issue 6): the config file, systemd glue and access policy.
 * Not installed; included by main.c and server.c at their hook points only.
 *
 *   config.c   /etc/nwc/nwcd.conf (inih): parsed at start under the command-line flags,
 *              re-read on SIGHUP; the file's settings that nwcd_config lacks live here
 *   notify.c   sd_listen_fds (socket activation), sd_notify (READY, STATUS, WATCHDOG,
 *              RELOADING, STOPPING), the SIGHUP handler and the service thread that preloads
 *   policy.c   who may change the store: root, the daemon's uid, the admin group
 *
 * One daemon per process: these modules keep their state in file-scope statics, touched by the
 * loop thread, except where a function says otherwise.
 */
#ifndef NWCD_SERVICE_H
#define NWCD_SERVICE_H

#include "nwcd.h"

#include <uv.h>

#define NWCD_CONFIG_DEFAULT "/etc/nwc/nwcd.conf"

/* ---- config.c ---------------------------------------------------------------------------- */

/* The file's settings (those nwcd_config has are copied into it). */
typedef struct nwcd_settings {
  char *store, *socket, *backend, *admin_group;
  unsigned socket_mode, threads, max_conn_per_uid, max_inflight, poll_us;
  uint64_t budget, gpu_budget, max_outq;
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
  NWCD_SET_GPU = 1u << 12, NWCD_SET_POLL = 1u << 13,
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
 * and the preload list (nwcd_service_preload); logs what needs a restart.  A file that does not
 * parse changes nothing (logged).  Returns 0 or the parse error. */
int nwcd_config_reload(nwcd *d);
/* A copy of the active preload list (any thread): 0 and *out (n strdup'ed names in a
 * malloc'ed array: free each and the array), or -ENOMEM. */
int nwcd_config_preload(char ***out, size_t *n);
/* "error", "warning", "info", "debug" (or 0..3): 0 and *level, or -EINVAL. */
int nwcd_parse_log_level(const char *s, int *level);
/* Frees the active settings (at exit). */
void nwcd_config_free(void);

/* ---- notify.c ---------------------------------------------------------------------------- */

/* The listening socket passed by systemd (LISTEN_FDS/LISTEN_PID): its descriptor (non-blocking,
 * close-on-exec) with its path in path[n]; -ENOENT when not socket-activated (bind our own);
 * -EINVAL (with a detail) when what was passed is not one listening AF_UNIX stream socket. */
int nwcd_service_listen_fd(char *path, size_t n);
/* After the socket listens (loop thread): SIGHUP handler, watchdog timer, and the service
 * thread, which makes the preload models resident and then sends READY=1. */
int nwcd_service_start(nwcd *d, uv_loop_t *loop);
/* SIGTERM/SIGINT seen: STOPPING=1, preloading stops at the next tensor. */
void nwcd_service_stopping(void);
/* Closes the handles and joins the service thread (before the loop ends). */
void nwcd_service_close(void);
/* Queues a preload pass for the active settings' list (after a reload); the service thread
 * unpins models no longer listed, loads and pins the listed ones, then sends READY=1. */
void nwcd_service_preload(void);
/* "<3>".."<7>" (the syslog priority of an NWCD_LOG_ level) when stderr is the journal
 * (JOURNAL_STREAM names its device and inode), so that journalctl -p filters; "" otherwise. */
const char *nwcd_journal_prefix(int level);
/* sd_notify wrapper: a no-op without NOTIFY_SOCKET; any thread. */
void nwcd_notify(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* ---- policy.c ---------------------------------------------------------------------------- */

/* Sets the admin group by name (NULL or "": none); -EINVAL with a detail when it is unknown. */
int nwcd_policy_set_admin_group(const char *name);
/* May the peer on fd (SO_PEERCRED uid/gid/pid) run request r?  0, or -EPERM with a detail for
 * the reply, after logging the refusal with uid, subject and the time the check took. */
int nwcd_policy_check(int fd, uid_t uid, gid_t gid, pid_t pid, const nwc_proto_req *r);

#endif
