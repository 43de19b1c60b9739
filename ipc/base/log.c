/*
 * Logging to stderr, with journald priority prefixes under systemd (see log.h).
 * A line is formatted into one buffer and written with one write(2), so lines
 * from different threads never interleave.
 */
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <pthread.h>

#include "ipc/base/log.h"

static int max_level = LOG_INFO;
static bool journald;
static pthread_mutex_t last_mu = PTHREAD_MUTEX_INITIALIZER;
static char last_error[512];

static const char *const names[] = {
    [LOG_EMERG] = "emerg", [LOG_ALERT] = "alert",     [LOG_CRIT] = "critical",
    [LOG_ERR] = "error",   [LOG_WARNING] = "warning", [LOG_NOTICE] = "notice",
    [LOG_INFO] = "info",   [LOG_DEBUG] = "debug",
};

/* systemd sets JOURNAL_STREAM=<dev>:<ino> of the stream it gave us. */
static bool stderr_is_journal(void)
{
	const char *js = getenv("JOURNAL_STREAM");
	unsigned long long dev, ino;
	struct stat st;

	if (!js || sscanf(js, "%llu:%llu", &dev, &ino) != 2 || fstat(STDERR_FILENO, &st))
		return false;
	return (unsigned long long)st.st_dev == dev && (unsigned long long)st.st_ino == ino;
}

void log_init(int level)
{
	max_level = level;
	journald = stderr_is_journal();
}

int log_level_from_name(const char *name)
{
	for (int i = LOG_ERR; i <= LOG_DEBUG; i++)
		if (name && strcmp(name, names[i]) == 0)
			return i;
	return -1;
}

const char *log_level_name(int level)
{
	return level >= LOG_EMERG && level <= LOG_DEBUG ? names[level] : "?";
}

void log_msg(int level, const char *fmt, ...)
{
	char line[2048];
	size_t n = 0;
	va_list ap;

	if (level <= LOG_WARNING) {
		pthread_mutex_lock(&last_mu);
		va_start(ap, fmt);
		vsnprintf(last_error, sizeof(last_error), fmt, ap);
		va_end(ap);
		pthread_mutex_unlock(&last_mu);
	}
	if (level > max_level)
		return;
	if (journald) {
		n = (size_t)snprintf(line, sizeof(line), "<%d>", level);
	} else {
		struct timespec ts;
		struct tm tm;

		clock_gettime(CLOCK_REALTIME, &ts);
		gmtime_r(&ts.tv_sec, &tm);
		n = strftime(line, sizeof(line), "%Y-%m-%dT%H:%M:%S", &tm);
		n += (size_t)snprintf(line + n, sizeof(line) - n,
		                      ".%03ldZ ckptd %s: ", ts.tv_nsec / 1000000,
		                      log_level_name(level));
	}
	va_start(ap, fmt);
	vsnprintf(line + n, sizeof(line) - n - 1, fmt, ap);
	va_end(ap);
	n = strlen(line);
	line[n++] = '\n';
	if (write(STDERR_FILENO, line, n) < 0) {
		/* nowhere left to say it */
	}
}

void log_last_error(char *buf, size_t len)
{
	pthread_mutex_lock(&last_mu);
	snprintf(buf, len, "%s", last_error);
	pthread_mutex_unlock(&last_mu);
}
