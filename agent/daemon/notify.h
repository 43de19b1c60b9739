/*
 * What the agent tells systemd (sd_notify(3), Type=notify): READY=1 once the
 * socket is served, a short STATUS= line with what it is doing, WATCHDOG=1
 * pings when the unit has WatchdogSec=, and STOPPING=1 at shutdown.
 *
 * Outside systemd (NOTIFY_SOCKET unset) every call does nothing. A failed
 * send is logged once and otherwise ignored: telling systemd is never a
 * reason to stop serving. Control thread only (agent.c's run, tick and
 * drain all run there), so the module keeps its state without a lock.
 */
#ifndef CKPT_AGENT_NOTIFY_H
#define CKPT_AGENT_NOTIFY_H

#define NOTIFY_STATUS_MAX 256 /* longer STATUS= text is cut */

/* READY=1 with a first STATUS= line; also learns whether the watchdog is on. */
void notify_ready(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* STATUS=<text>, sent only after notify_ready and when the text differs from the last. */
void notify_status(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* WATCHDOG=1 if systemd asked for pings (WatchdogSec=); else nothing. */
void notify_watchdog(void);
/* STOPPING=1 with a STATUS= line saying why it takes a while. */
void notify_stopping(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif /* CKPT_AGENT_NOTIFY_H */
