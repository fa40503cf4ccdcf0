/*
 * bench_nwcd.c - starting and stopping a real nwcd for the benchmarks, and removing their
 * temporary stores afterwards (bench.h: nwc_bench_nwcd_start, nwc_bench_nwcd_stop,
 * nwc_bench_remove_dir): nwc-bench's daemon subcommands and nwc_gpu_map_bench link it.
 */
#include "bench.h"

#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <stdio.h>
#include <stdbool.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

static bool connectable(const char *path) {
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  if (strlen(path) >= sizeof sa.sun_path) return 0;
  memcpy(sa.sun_path, path, strlen(path) + 1);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  bool ok = connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0;
  close(fd);
  return ok;
}

pid_t nwc_bench_nwcd_start(const char *nwcd, const char *store, const char *sock,
                           const char *backend, const char *log) {
  const char *argv[10] = {nwcd, "--store", store, "--socket", sock}, **a = argv + 5;
  if (backend) *a++ = "--backend", *a++ = backend;
  *a = log ? log : "--quiet";
  pid_t pid = fork();
  if (pid == 0) {
    int nul = open("/dev/null", O_WRONLY);
    dup2(nul, 1);
    if (!log) dup2(nul, 2);
    execv(nwcd, (char *const *)argv);
    _exit(127);
  }
  for (int i = 0; pid > 0 && i < 1000 && !connectable(sock); i++) {
    if (waitpid(pid, NULL, WNOHANG) == pid) return -1; /* it exited: a bad path or option */
    usleep(10000);
  }
  return pid;
}

void nwc_bench_nwcd_stop(pid_t pid) {
  fflush(NULL); /* what was printed reaches a pipe even if what follows hangs or is killed */
  if (pid <= 0) return; /* a failed fork: kill(-1) would signal everything */
  kill(pid, SIGTERM);
  for (int i = 0; i < 3000; i++) { /* nwcd ends its requests in flight: 30 s at most */
    if (waitpid(pid, NULL, WNOHANG) == pid) return;
    usleep(10000);
  }
  fprintf(stderr, "nwc-bench: nwcd (pid %d) did not stop within 30 s of SIGTERM; killed\n",
          (int)pid);
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
}

static int remove_entry(const char *path, const struct stat *st, int type, struct FTW *ftw) {
  (void)st, (void)type, (void)ftw;
  return remove(path);
}

void nwc_bench_remove_dir(const char *dir) {
  if (nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS) != 0)
    fprintf(stderr, "could not remove %s\n", dir);
}
