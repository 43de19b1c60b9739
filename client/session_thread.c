/*
 * The session thread of a trainer's client (one per client, started by
 * cl_open): it reads the Attach stream and records each save's state
 * changes, so ckpt_save_wait only waits on a condition variable. When the
 * stream ends without our asking (the agent restarted, was upgraded,
 * crashed), it fails the saves in flight, opens the CUDA fences, attaches
 * again with a bounded back-off (rpc_attach.c), and hands the new agent every
 * region and plan through c->register_again (trainer_register.c's, set by
 * the trainer's first region or plan: a pointer, so this file calls no
 * trainer file by name). Calls made meanwhile wait for it (cl_enter).
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <pthread.h>

#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>

#include "client/rpc.h"

#define BACKOFF_FIRST_MS 50
#define BACKOFF_MAX_MS 1000
/* A stream that ended has its status within this; a dying agent closes our sockets within that. */
#define STATUS_WAIT_MS 5000
#define HANGUP_WAIT_MS 500

/* ---- the session stream ----------------------------------------------- */

/* Under c->mu: a state change for a save, known or not yet. */
static void apply_event(struct ckpt_client *c, const struct cl_event *info)
{
	struct ckpt_save *s;
	struct cl_early *e;

	for (s = c->saves; s; s = s->next)
		if (s->id == info->save_id) {
			if (info->state > s->state) {
				s->state = info->state;
				snprintf(s->reason, sizeof(s->reason), "%s", info->reason);
			}
			if (info->upload_failed && !s->upload_failed) {
				s->upload_failed = true; /* a waiter for UPLOADED wakes to it */
				snprintf(s->reason, sizeof(s->reason), "%s", info->reason);
			}
			return;
		}
	e = &c->early[c->nearly++ % CL_EARLY];
	e->save_id = info->save_id;
	e->state = info->state;
	snprintf(e->reason, sizeof(e->reason), "%s", info->reason);
}

/* Reads the session's events (rpc_attach.c's) until the stream ends. */
static void read_events(struct ckpt_client *c)
{
	struct cl_event ev;

	while (cl_rpc_next_event(c, &ev) > 0) {
		pthread_mutex_lock(&c->mu);
		if (ev.save)
			apply_event(c, &ev);
		pthread_cond_broadcast(&c->cv);
		pthread_mutex_unlock(&c->mu);
	}
}

/* Under c->mu: no agent moves the fences of CUDA plans now: the GPU must not wait. */
static void open_fences(struct ckpt_client *c)
{
	for (struct ckpt_plan *p = c->plans; p; p = p->next)
		if (p->cuda)
			cl_gpu_release(&p->gpu, p->last_seq);
	pthread_cond_broadcast(&c->cv);
}

/*
 * Under c->mu: the agent went away. Saves it had not committed end FAILED
 * with `why` (uploads it had not finished, likewise), and the fences of
 * CUDA plans open: no agent moves them now, and the GPU must not wait.
 */
static void session_lost(struct ckpt_client *c, const char *why)
{
	for (struct ckpt_save *s = c->saves; s; s = s->next) {
		if (s->state < CKPT_COMMITTED) {
			s->state = CKPT_FAILED;
			snprintf(s->reason, sizeof(s->reason), "%s", why);
		} else if (s->state == CKPT_COMMITTED && s->uploads && !s->upload_failed) {
			s->upload_failed = true;
			snprintf(s->reason, sizeof(s->reason), "%s", why);
		}
	}
	memset(c->early, 0, sizeof(c->early)); /* the next agent's ids are its own */
	c->nearly = 0;
	open_fences(c);
}

/*
 * The session stream ended without our asking: how, in words, into buf.
 * Its status, and whether the agent's process is gone: its end closes our
 * credentials connection in the same exit (a crash, a kill, the kernel out
 * of memory), while a live agent keeps it open (one stopping, or a
 * connection cut by either side). So a live agent is never said to have
 * gone away.
 */
static void stream_end(struct ckpt_client *c, char *buf, size_t len)
{
	struct attach_tags *t = &c->atags;
	char status[192] = "no status came";

	if (cl_wait_flag(c, t, &t->status, cl_deadline(STATUS_WAIT_MS))) {
		char *details = grpc_slice_to_c_string(c->sdetails);

		snprintf(status, sizeof(status), "gRPC status %d%s%.160s", (int)c->sstatus,
		         *details ? ": " : "", details);
		gpr_free(details);
	}
	if (cl_cred_peer_alive(c, HANGUP_WAIT_MS))
		snprintf(buf, len,
		         "the session with ckptd at %s ended (%s) while ckptd still runs (it is "
		         "stopping, or the connection was cut)",
		         c->endpoint, status);
	else
		snprintf(buf, len,
		         "ckptd at %s went away (its process ended: stopped, restarted, killed or "
		         "crashed; the session stream said %s)",
		         c->endpoint, status);
}

/*
 * One try: a new token, channel and session, then the regions and plans.
 * On success the client is back (`away` cleared) before the trainer's
 * tidy-up calls may take reg_mu: they then tell the new agent.
 */
static int attach_again(struct ckpt_client *c)
{
	int (*again)(struct ckpt_client * c);
	int rc;

	cl_cred_close(c);
	rc = cl_cred_connect(c);
	if (rc)
		return rc;
	grpc_channel_destroy(c->ch);
	c->ch = cl_channel_new(c->endpoint);
	rc = cl_attach(c);
	if (!rc) {
		pthread_mutex_lock(&c->reg_mu);
		pthread_mutex_lock(&c->mu);
		again = c->register_again;
		pthread_mutex_unlock(&c->mu);
		rc = again ? again(c) : 0; /* what the trainer registered (trainer.c) */
		if (!rc) {
			pthread_mutex_lock(&c->mu);
			c->away = false;
			c->reattached++;
			pthread_cond_broadcast(&c->cv);
			pthread_mutex_unlock(&c->mu);
		}
		pthread_mutex_unlock(&c->reg_mu);
	}
	if (rc)
		cl_close_call(c);
	return rc;
}

static int64_t mono_ms(void)
{
	return ipc_mono_ns() / 1000000;
}

/* Under c->mu: waits ms, or less if the client closes; whether it is closing. */
static bool pause_ms(struct ckpt_client *c, unsigned ms)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_nsec += (long)ms * 1000000;
	ts.tv_sec += ts.tv_nsec / 1000000000;
	ts.tv_nsec %= 1000000000;
	if (!c->closing)
		pthread_cond_timedwait(&c->cv, &c->mu, &ts);
	return c->closing;
}

/*
 * The stream ended and the client is to attach again: `away` from now on,
 * the GPU let go, every call in flight out, and every save told how the
 * session ended (stream_end's words), before the call goes. False, with
 * nothing done, when closing or told never to attach again.
 */
static bool go_away(struct ckpt_client *c)
{
	char how[IPC_ERRLEN];

	pthread_mutex_lock(&c->mu);
	if (c->closing || !c->reconnect_ms) {
		pthread_mutex_unlock(&c->mu);
		return false;
	}
	/* no call goes out from now on: saves are FAILED at once, meanwhile saying this */
	c->away = true;
	snprintf(c->away_why, sizeof(c->away_why),
	         "the session with ckptd at %s ended; libckpt attaches again: save again once it "
	         "has",
	         c->endpoint);
	open_fences(c); /* the GPU does not wait while stream_end looks */
	pthread_mutex_unlock(&c->mu);
	stream_end(c, how, sizeof(how));
	pthread_mutex_lock(&c->mu);
	/* calls in flight fail fast (nobody answers) or finish: none may see the swap */
	while (c->calls)
		pthread_cond_wait(&c->cv, &c->mu);
	/* then every save, a reply that came in meanwhile included, is told */
	snprintf(c->away_why, sizeof(c->away_why),
	         "%s, before this save was committed here (one past CAPTURED may still commit: "
	         "ckptctl list); libckpt attaches again: save again once it has",
	         how);
	session_lost(c, c->away_why);
	pthread_mutex_unlock(&c->mu);
	fprintf(stderr, "libckpt: %s: attaching again (for up to %d s)\n", how,
	        c->reconnect_ms / 1000);
	cl_close_call(c);
	return true;
}

/*
 * Tries to attach until done, closing, past the deadline, or refused for
 * good (another protocol), with a doubling pause between tries. Its last
 * try's result; the last failure's words in `last`. Returns with c->mu held.
 */
static int attach_tries(struct ckpt_client *c, int64_t deadline, char *last, size_t len)
{
	unsigned backoff = BACKOFF_FIRST_MS;
	int rc;

	for (;;) {
		rc = attach_again(c);
		pthread_mutex_lock(&c->mu);
		if (rc)
			snprintf(last, len, "%s", c->session_error);
		/* done, closing, out of time, or refused for good (another protocol) */
		if (!rc || rc == -ENOTSUP || c->closing || mono_ms() >= deadline ||
		    pause_ms(c, backoff) || mono_ms() >= deadline)
			return rc;
		pthread_mutex_unlock(&c->mu);
		backoff = (unsigned)ipc_backoff_next(backoff, BACKOFF_FIRST_MS, BACKOFF_MAX_MS);
	}
}

/*
 * Under c->mu, released here: the tries' end. Given up (rc): `gone`, with
 * why, in one step with the end of `away`, the fences open. Back: said, with
 * what was handed again since t0.
 */
static void attach_ended(struct ckpt_client *c, int rc, const char *last, int64_t t0)
{
	unsigned nplans = 0, nregions = 0;
	bool closing = c->closing;

	if (rc) {
		if (rc == -ENOTSUP)
			snprintf(c->away_why, sizeof(c->away_why), "ckptd at %s came back, but: %s",
			         c->endpoint, last);
		else if (!closing)
			snprintf(c->away_why, sizeof(c->away_why),
			         "ckptd at %s went away and libckpt could not attach again "
			         "within %d s: %s",
			         c->endpoint, c->reconnect_ms / 1000, last);
		c->gone = true;
		c->away = false;
		open_fences(c);
	} else {
		for (struct ckpt_plan *p = c->plans; p; p = p->next)
			nplans += !p->lost[0];
		for (struct cl_alloc *a = c->allocs; a; a = a->next)
			nregions++;
	}
	pthread_cond_broadcast(&c->cv);
	pthread_mutex_unlock(&c->mu);
	if (rc && !closing)
		fprintf(stderr, "libckpt: %s\n", c->away_why);
	else if (!rc)
		fprintf(stderr,
		        "libckpt: attached again to ckptd %s at %s after %.1f s: %u regions and "
		        "%u plans registered again\n",
		        ckpt_agent_version(c), c->endpoint, (mono_ms() - t0) / 1000.0, nregions,
		        nplans);
}

/*
 * The stream ended. Unless we are closing (or told never to), fail what
 * was in flight and attach again until reconnect_ms have passed; whether
 * the session goes on. When not, the client is `gone` on return.
 */
static bool reattach(struct ckpt_client *c)
{
	int64_t t0 = mono_ms(), deadline = t0 + c->reconnect_ms;
	char last[IPC_ERRLEN] = "";
	int rc;

	if (!go_away(c))
		return false;
	rc = attach_tries(c, deadline, last, sizeof(last));
	attach_ended(c, rc, last, t0);
	return rc == 0;
}

void *cl_session_main(void *arg)
{
	struct ckpt_client *c = arg;
	char how[IPC_ERRLEN] = "";
	bool said;

	cl_session_thread = c;
	do
		read_events(c);
	while (reattach(c));
	/*
	 * Closing, told never to attach again, or given up (reattach did it all):
	 * the user's saves keep their states and waits return -ENOTCONN.
	 */
	pthread_mutex_lock(&c->mu);
	said = c->gone || c->closing;
	pthread_mutex_unlock(&c->mu);
	if (!said) /* $CKPT_RECONNECT_SECONDS=0: calls are told how it ended */
		stream_end(c, how, sizeof(how));
	pthread_mutex_lock(&c->mu);
	if (!c->gone) {
		c->gone = true;
		if (how[0])
			snprintf(c->away_why, sizeof(c->away_why), "%s", how);
		else
			snprintf(c->away_why, sizeof(c->away_why),
			         "the connection to ckptd at %s was lost", c->endpoint);
		open_fences(c);
	}
	pthread_mutex_unlock(&c->mu);
	return NULL;
}
