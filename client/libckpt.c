/*
 * libckpt: the API of ckpt.h over the connection in rpc.c (the calls in
 * rpc.h, typed in the library's own types: rpc_*.c).
 *
 * A connected client holds the Attach stream open; a thread of its own reads
 * the stream and records each save's state changes, so ckpt_save_wait only
 * waits on a condition variable (no polling, no extra call). Every other
 * call is one unary RPC on the caller's thread.
 *
 * When the stream ends without our asking (the agent restarted, was
 * upgraded, crashed), the same thread fails the saves in flight, attaches
 * again with a bounded back-off, and hands the new agent every region and
 * plan (c->register_again, trainer_register.c's): the trainer's next save
 * works as before. Calls made meanwhile wait for it (cl_enter); a save is
 * refused at once.
 *
 * This file: connect and disconnect (cl_open starts the session thread of
 * session_thread.c after rpc_attach.c's Attach), the gate every API call passes
 * while the agent is away (cl_enter and friends), and the calls of ckpt.h
 * that talk to no agent (errors, state names).
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

#include "client/client.h"

/* How long a client tries to attach again to an agent that went away. */
#define RECONNECT_DEFAULT_S 300
#define RECONNECT_MAX_S 86400

/* Why the last connect of this thread failed: ckpt_last_error(NULL). */
static __thread char open_error[1024];

/* Under c->mu: -ENOTCONN with why, recorded for ckpt_last_error. */
static int not_connected(struct ckpt_client *c)
{
	if (cl_session_thread != c)
		snprintf(c->last_error, sizeof(c->last_error), "%s",
		         c->closing ? "the client is disconnecting" : c->away_why);
	return -ENOTCONN;
}

int cl_enter(struct ckpt_client *c)
{
	int rc = 0;

	if (!c->attached)
		return 0;
	pthread_mutex_lock(&c->mu);
	/* counted as a waiter: ckpt_disconnect lets it out before c goes */
	c->waiters++;
	while (c->away && !c->closing)
		pthread_cond_wait(&c->cv, &c->mu);
	if (--c->waiters == 0)
		pthread_cond_broadcast(&c->idle);
	if (c->gone || c->closing)
		rc = not_connected(c);
	else
		c->calls++;
	pthread_mutex_unlock(&c->mu);
	return rc;
}

int cl_try_enter(struct ckpt_client *c)
{
	int rc = 0;

	if (!c->attached)
		return 0;
	pthread_mutex_lock(&c->mu);
	if (c->gone || c->closing)
		rc = not_connected(c);
	else if (c->away)
		rc = -EAGAIN;
	else
		c->calls++;
	pthread_mutex_unlock(&c->mu);
	return rc;
}

bool cl_enter_tidy(struct ckpt_client *c)
{
	if (!c->attached)
		return true;
	pthread_mutex_lock(&c->reg_mu);
	pthread_mutex_lock(&c->mu);
	if (c->away || c->gone) {
		pthread_mutex_unlock(&c->mu);
		return false; /* reg_mu held: the session thread keeps off the lists */
	}
	c->calls++;
	pthread_mutex_unlock(&c->mu);
	pthread_mutex_unlock(&c->reg_mu);
	return true;
}

void cl_leave_local(struct ckpt_client *c)
{
	if (c->attached)
		pthread_mutex_unlock(&c->reg_mu);
}

void cl_leave(struct ckpt_client *c)
{
	if (!c->attached)
		return;
	pthread_mutex_lock(&c->mu);
	if (--c->calls == 0)
		pthread_cond_broadcast(&c->cv);
	pthread_mutex_unlock(&c->mu);
}

void cl_away_reason(struct ckpt_client *c, char *buf, size_t len)
{
	pthread_mutex_lock(&c->mu);
	snprintf(buf, len, "%s", c->away_why);
	pthread_mutex_unlock(&c->mu);
}

/* ---- connect / disconnect -------------------------------------------- */

/* $CKPT_RECONNECT_SECONDS into reconnect_ms: how long to attach again. */
static int reconnect_window(struct ckpt_client *c)
{
	const char *v = getenv("CKPT_RECONNECT_SECONDS");
	char *end;
	long n;

	c->reconnect_ms = RECONNECT_DEFAULT_S * 1000;
	if (!v || !*v)
		return 0;
	errno = 0;
	n = strtol(v, &end, 10);
	if (errno || *end || end == v || n < 0 || n > RECONNECT_MAX_S)
		return cl_fail(c, -EINVAL,
		               "$CKPT_RECONNECT_SECONDS is '%.32s': a number of seconds, 0 (never "
		               "attach again) to %d",
		               v, RECONNECT_MAX_S);
	c->reconnect_ms = (int)n * 1000;
	return 0;
}

static void client_free(struct ckpt_client *c)
{
	/* The session thread stops, whether reading or attaching again. */
	pthread_mutex_lock(&c->mu);
	c->closing = true;
	if (c->scall)
		grpc_call_cancel(c->scall, NULL);
	pthread_cond_broadcast(&c->cv);
	pthread_mutex_unlock(&c->mu);
	if (c->attached)
		pthread_join(c->thread, NULL);
	/* Threads still in ckpt_save_wait leave (-ENOTCONN) before c goes. */
	pthread_mutex_lock(&c->mu);
	c->gone = true;
	pthread_cond_broadcast(&c->cv);
	while (c->waiters)
		pthread_cond_wait(&c->idle, &c->mu);
	pthread_mutex_unlock(&c->mu);
	cl_close_call(c);
	grpc_metadata_array_destroy(&c->smd);
	grpc_metadata_array_destroy(&c->strail);
	grpc_slice_unref(c->sdetails);
	if (c->ch)
		grpc_channel_destroy(c->ch);
	cl_cred_close(c); /* the agent forgets our token: after the last call */
	/*
	 * CUDA plans the user still holds: their fences open (no agent moves them
	 * now), then their pages are unregistered before they go.
	 */
	for (struct ckpt_plan *p = c->plans; p; p = p->next) {
		cl_gpu_release(&p->gpu, p->last_seq);
		cl_gpu_plan_free(&p->gpu);
		p->fence_mem = NULL;
	}
	while (c->allocs) {
		struct cl_alloc *a = c->allocs;

		c->allocs = a->next;
		ipc_shm_unmap(&a->shm);
		free(a);
	}
	/* Plans and saves the user still holds outlive us: they learn we are gone. */
	for (struct ckpt_save *s = c->saves; s; s = s->next)
		s->c = NULL;
	for (struct ckpt_plan *p = c->plans; p; p = p->next)
		p->c = NULL;
	pthread_mutex_destroy(&c->mu);
	pthread_mutex_destroy(&c->cred_mu);
	pthread_mutex_destroy(&c->reg_mu);
	pthread_cond_destroy(&c->cv);
	pthread_cond_destroy(&c->idle);
	free(c);
	grpc_shutdown();
}

int cl_open(const char *endpoint, bool session, struct ckpt_client **out)
{
	struct ckpt_client *c;
	int rc;

	if (!out)
		return -EINVAL;
	*out = NULL;
	if (!endpoint)
		endpoint = getenv("CKPT_ENDPOINT");
	if (!endpoint || !*endpoint)
		endpoint = IPC_DEFAULT_ENDPOINT;
	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	pthread_mutex_init(&c->mu, NULL);
	pthread_mutex_init(&c->cred_mu, NULL);
	pthread_mutex_init(&c->reg_mu, NULL);
	c->cred_sock = -1;
	pthread_cond_init(&c->cv, NULL);
	pthread_cond_init(&c->idle, NULL);
	grpc_metadata_array_init(&c->smd);
	grpc_metadata_array_init(&c->strail);
	c->sdetails = grpc_empty_slice();
	snprintf(c->endpoint, sizeof(c->endpoint), "%s", endpoint);
	grpc_init();
	rc = cl_cred_connect(c);
	if (rc) {
		if (session) /* ckpt_connect has no client to ask ckpt_last_error of */
			fprintf(stderr, "libckpt: %s\n", c->last_error);
		snprintf(open_error, sizeof(open_error), "%s", c->last_error);
		client_free(c);
		return rc;
	}
	c->ch = cl_channel_new(c->endpoint);
	if (session) {
		rc = reconnect_window(c);
		if (!rc)
			rc = cl_attach(c);
		if (!rc)
			rc = -pthread_create(&c->thread, NULL, cl_session_main, c);
		if (rc) {
			/* ckpt_connect has no client to ask ckpt_last_error of: say it here */
			fprintf(stderr, "libckpt: %s\n", c->last_error);
			snprintf(open_error, sizeof(open_error), "%s", c->last_error);
			client_free(c);
			return rc;
		}
		c->attached = true;
	}
	*out = c;
	return 0;
}

int ckpt_connect(const char *endpoint, struct ckpt_client **out)
{
	return cl_open(endpoint, true, out);
}

void ckpt_disconnect(struct ckpt_client *c)
{
	if (c)
		client_free(c);
}

const char *ckpt_last_error(struct ckpt_client *c)
{
	return c ? c->last_error : open_error;
}

const char *ckpt_strerror(int err)
{
	switch (err) {
	case -ECONNREFUSED:
		return "no ckptd answers at the endpoint (is it running?)";
	case -ECANCELED:
		return "the save was skipped: the staging pool was full";
	case -EBADMSG:
		return "checksum mismatch: the checkpoint is corrupt";
	case -ENOTCONN:
		return "the connection to ckptd was lost";
	case -ESTALE:
		return "the agent that came back refused the plan again: create it anew";
	default:
		return strerror(err < 0 ? -err : err);
	}
}

const char *ckpt_state_name(enum ckpt_state s)
{
	return ipc_state_name(s);
}
