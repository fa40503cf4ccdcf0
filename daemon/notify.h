/*
 * notify.h - nwcd as a systemd service (notify.c): sd_listen_fds (socket activation), sd_notify
 * (READY, STATUS, WATCHDOG, RELOADING, STOPPING), the SIGHUP handler and the service thread that
 * preloads.
 *
 * One daemon per process: notify.c keeps its state in file-scope statics, touched by the loop
 * thread, except where a function says otherwise.
 */
#ifndef NWCD_NOTIFY_H
#define NWCD_NOTIFY_H

#include <stddef.h>
#include <uv.h>

struct nwcd;

/* The listening socket passed by systemd (LISTEN_FDS/LISTEN_PID): its descriptor (non-blocking,
 * close-on-exec) with its path in path[n]; -ENOENT when not socket-activated (bind our own);
 * -EINVAL (with a detail) when what was passed is not one listening AF_UNIX stream socket. */
int nwcd_service_listen_fd(char *path, size_t n);
/* After the socket listens (loop thread): SIGHUP handler, watchdog timer, and the service
 * thread, which makes the preload models resident and then sends READY=1. */
int nwcd_service_start(struct nwcd *d, uv_loop_t *loop);
/* SIGTERM/SIGINT seen: STOPPING=1, preloading stops at the next tensor. */
void nwcd_service_stopping(void);
/* Closes the handles and joins the service thread (before the loop ends). */
void nwcd_service_close(void);

#endif
