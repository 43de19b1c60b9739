/*
 * sd_notify(3) for the agent (see notify.h). agent.c calls notify_ready from
 * agent_run just before the completion queue turns, notify_status and
 * notify_watchdog from the once-a-second tick, notify_stopping from the
 * first poll of the drain; all on the control thread.
 *
 * libsystemd's sd_notify returns 0 and sends nothing when NOTIFY_SOCKET is
 * unset, so a plain `ckptd` run from a shell pays one getenv per call.
 */
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <systemd/sd-daemon.h>

#include "ipc/base/log.h"
#include "agent/daemon/notify.h"

static char last_status[NOTIFY_STATUS_MAX];
/* STATUS= lines only after READY=1: before it they would describe a start that may yet fail. */
static bool ready;
static bool watchdog;
static bool send_failed; /* logged once; later failures stay quiet */

static void notify_send(const char *state)
{
	int rc = sd_notify(0, state);

	if (rc < 0 && !send_failed) {
		send_failed = true;
		log_msg(LOG_WARNING, "cannot notify systemd (NOTIFY_SOCKET): %s; serving anyway",
		        strerror(-rc));
	}
}

/* The STATUS= text: one line (a newline would start another assignment), bounded. */
__attribute__((format(printf, 2, 0))) static void format_text(char *text, const char *fmt,
                                                              va_list ap)
{
	vsnprintf(text, NOTIFY_STATUS_MAX, fmt, ap);
	for (char *p = text; *p; p++)
		if (*p == '\n')
			*p = ' ';
}

/* Sends "<prefix>STATUS=<text>" and remembers the text. */
static void send_status(const char *prefix, const char *text)
{
	char msg[NOTIFY_STATUS_MAX + 32];

	snprintf(msg, sizeof(msg), "%sSTATUS=%s", prefix, text);
	snprintf(last_status, sizeof(last_status), "%s", text);
	notify_send(msg);
}

void notify_ready(const char *fmt, ...)
{
	char text[NOTIFY_STATUS_MAX];
	uint64_t usec = 0;
	va_list ap;

	/* > 0 only if WATCHDOG_USEC is set and WATCHDOG_PID is ours (or unset). */
	watchdog = sd_watchdog_enabled(0, &usec) > 0;
	if (watchdog)
		log_msg(LOG_INFO, "systemd watchdog on: pinging every second (timeout %llu ms)",
		        (unsigned long long)(usec / 1000));
	va_start(ap, fmt);
	format_text(text, fmt, ap);
	va_end(ap);
	ready = true;
	send_status("READY=1\n", text);
}

void notify_status(const char *fmt, ...)
{
	char text[NOTIFY_STATUS_MAX];
	va_list ap;

	va_start(ap, fmt);
	format_text(text, fmt, ap);
	va_end(ap);
	if (ready && strcmp(text, last_status) != 0)
		send_status("", text);
}

void notify_watchdog(void)
{
	if (watchdog)
		notify_send("WATCHDOG=1");
}

void notify_stopping(const char *fmt, ...)
{
	char text[NOTIFY_STATUS_MAX];
	va_list ap;

	va_start(ap, fmt);
	format_text(text, fmt, ap);
	va_end(ap);
	send_status("STOPPING=1\n", text);
}
