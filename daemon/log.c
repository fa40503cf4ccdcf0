/*
 * log.c - nwcd's log lines on stderr (log.h).  The level is an atomic int, written by the loop
 * thread (flags, the config file, SIGHUP) and read by every thread before it formats a line;
 * relaxed ordering is enough, as the level guards no other memory.  Whether stderr is the
 * journal is found out once, at the first line (a race only computes it twice).
 */
#include "log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <systemd/sd-daemon.h>

static atomic_int level_now = NWCD_LOG_INFO;

int nwcd_log_level(void) { return atomic_load_explicit(&level_now, memory_order_relaxed); }

void nwcd_log_set_level(int level) {
  atomic_store_explicit(&level_now, level, memory_order_relaxed);
}

/* "<3>".."<7>" (the syslog priority of an NWCD_LOG_ level) when stderr is the journal
 * (JOURNAL_STREAM names its device and inode), "" otherwise. */
static const char *journal_prefix(int level) {
  static atomic_int journal = -1; /* unknown, 0 no, 1 yes; a race only computes it twice */
  int j = atomic_load(&journal);
  if (j < 0) {
    const char *env = getenv("JOURNAL_STREAM");
    unsigned long long dev = 0, ino = 0;
    struct stat st;
    j = env && sscanf(env, "%llu:%llu", &dev, &ino) == 2 && fstat(2, &st) == 0 &&
        (unsigned long long)st.st_dev == dev && (unsigned long long)st.st_ino == ino;
    atomic_store(&journal, j);
  }
  static const char *prio[] = {SD_ERR, SD_WARNING, SD_INFO, SD_DEBUG};
  return j && level >= 0 && level <= 3 ? prio[level] : "";
}

void nwcd_log(int level, const char *fmt, ...) {
  if (level > nwcd_log_level()) return;
  static const char *names[] = {"error", "warning", "info", "debug"};
  char buf[1200];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  fprintf(stderr, "%snwcd: %s: %s\n", journal_prefix(level), names[level], buf);
}
