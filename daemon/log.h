/*
 * log.h - nwcd's log (log.c): one line per message on stderr, "nwcd: LEVEL: text", with the
 * syslog priority in front ("<3>".."<7>") when stderr is the journal, so that journalctl -p
 * filters.
 *
 * The level is an atomic: the loop thread sets it (flags at start, the config file, a reload on
 * SIGHUP) while every thread reads it.  Any thread may log; a line is written with one call.
 */
#ifndef NWCD_LOG_H
#define NWCD_LOG_H

enum { NWCD_LOG_ERR = 0, NWCD_LOG_WARN = 1, NWCD_LOG_INFO = 2, NWCD_LOG_DEBUG = 3 };

/* Writes the message when level is at most the current level (any thread). */
void nwcd_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The current level (NWCD_LOG_INFO until set), and a new one (NWCD_LOG_ERR..NWCD_LOG_DEBUG). */
int nwcd_log_level(void);
void nwcd_log_set_level(int level);

#endif
