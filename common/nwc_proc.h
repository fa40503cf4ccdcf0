/*
 * nwc_proc.h - a process's memory as /proc tells it, for the tests and benchmarks that watch
 * nwcd from outside (test_daemon_slowread, nwc-bench soak).  Linux only.
 */
#ifndef NWC_PROC_H
#define NWC_PROC_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

/* The value in kB of field key ("VmRSS", "VmHWM", ...) of /proc/PID/status, or -1. */
static inline long nwc__proc_status_kb(pid_t pid, const char *key) {
  char path[64], line[256];
  snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
  FILE *f = fopen(path, "r");
  long kb = -1;
  size_t n = strlen(key);
  while (f && fgets(line, sizeof line, f))
    if (!strncmp(line, key, n) && line[n] == ':') kb = strtol(line + n + 1, NULL, 10);
  if (f) fclose(f);
  return kb;
}

#endif
