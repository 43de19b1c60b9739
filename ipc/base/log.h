/*
 * Logging: one line per event that matters, to stderr. Under systemd
 * (JOURNAL_STREAM names our stderr) each line starts with its journald
 * priority, "<3>" ... "<7>"; elsewhere with a UTC timestamp and the level.
 * Nothing is logged per I/O: counters carry that. Any thread.
 */
#ifndef CKPT_AGENT_LOG_H
#define CKPT_AGENT_LOG_H

#include <stddef.h>
#include <syslog.h> /* LOG_ERR ... LOG_DEBUG */

/* Lines above `level` (a LOG_* priority) are dropped. */
void log_init(int level);
/* "error", "warning", "notice", "info", "debug" -> LOG_*; -1 if unknown. */
int log_level_from_name(const char *name);
const char *log_level_name(int level);
void log_msg(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The last error or warning logged, for the status ("" if none). */
void log_last_error(char *buf, size_t len);

#endif /* CKPT_AGENT_LOG_H */
