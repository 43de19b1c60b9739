/*
 * libckpt: the API of ckpt.h over the connection in rpc.c.
 *
 * A connected client holds the Attach stream open; a thread of its own reads
 * the stream and records each save's state changes, so ckpt_save_wait only
 * waits on a condition variable (no polling, no extra call). Every other
 * call is one unary RPC on the caller's thread.
 *
 * When the stream ends without our asking (the agent restarted, was
 * upgraded, crashed), the same thread fails the saves in flight, attaches
 * again with a bounded back-off, and hands the new agent every region and
 * plan (c->register_again, trainer_register.c's): the trainer's next save works as before. Calls
 * made meanwhile wait for it (cl_enter); a save is refused at once.
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

#define ATTACH_TIMEOUT_MS 10000
/* How long a client tries to attach again to an agent that went away. */
#define RECONNECT_DEFAULT_S 300
#define RECONNECT_MAX_S 86400
#define BACKOFF_FIRST_MS 50
#define BACKOFF_MAX_MS 1000
/* A stream that ended has its status within this; a dying agent closes our sockets within that. */
#define STATUS_WAIT_MS 5000
#define HANGUP_WAIT_MS 500

/* Why the last connect of this thread failed: ckpt_last_error(NULL). */
static __thread char open_error[1024];

_Static_assert((int)CKPT_BOOL == (int)CKPT__V1__DTYPE__DTYPE_BOOL &&
                   (int)CKPT_F32 == (int)CKPT__V1__DTYPE__DTYPE_F32 &&
                   (int)CKPT_U64 == (int)CKPT__V1__DTYPE__DTYPE_U64,
               "dtype numbers match the protocol");
_Static_assert((int)CKPT_QUEUED == (int)CKPT__V1__STATE__STATE_QUEUED &&
                   (int)CKPT_CAPTURED == (int)CKPT__V1__STATE__STATE_CAPTURED &&
                   (int)CKPT_SKIPPED == (int)CKPT__V1__STATE__STATE_SKIPPED,
               "state numbers match the protocol");

/* ---- the session stream ----------------------------------------------- */

/* Under c->mu: a state change for a save, known or not yet. */
static void apply_event(struct ckpt_client *c, const Ckpt__V1__SaveInfo *info)
{
	struct ckpt_save *s;
	struct cl_early *e;

	for (s = c->saves; s; s = s->next)
		if (s->id == info->save_id) {
			if ((int)info->state > s->state) {
				s->state = info->state;
				snprintf(s->reason, sizeof(s->reason), "%s",
				         info->reason ? info->reason : "");
			}
			if (info->upload_failed && !s->upload_failed) {
				s->upload_failed = true; /* a waiter for UPLOADED wakes to it */
				snprintf(s->reason, sizeof(s->reason), "%s",
				         info->reason ? info->reason : "");
			}
			return;
		}
	e = &c->early[c->nearly++ % CL_EARLY];
	e->save_id = info->save_id;
	e->state = info->state;
	snprintf(e->reason, sizeof(e->reason), "%s", info->reason ? info->reason : "");
}

static bool wait_flag(struct ckpt_client *c, struct attach_tags *t, bool *flag,
                      gpr_timespec deadline);

/* A completion of one of the Attach call's own batches: noted (close_call waits for each). */
static void note_tag(struct attach_tags *t, void *tag)
{
	if (tag == &t->start)
		t->start = true;
	else if (tag == &t->status)
		t->status = true;
	else if (tag == &t->recv)
		t->recv = true;
}

/* Reads the session's events until the stream ends. */
static void read_events(struct ckpt_client *c)
{
	grpc_byte_buffer *in = NULL;
	int tag_recv;
	grpc_op op;

	for (;;) {
		grpc_event ev;

		memset(&op, 0, sizeof(op));
		op.op = GRPC_OP_RECV_MESSAGE;
		op.data.recv_message.recv_message = &in;
		if (grpc_call_start_batch(c->scall, &op, 1, &tag_recv, NULL) != GRPC_CALL_OK)
			return;
		do {
			ev = grpc_completion_queue_next(c->scq, gpr_inf_future(GPR_CLOCK_MONOTONIC),
			                                NULL);
			if (ev.type == GRPC_OP_COMPLETE)
				note_tag(&c->atags, ev.tag);
		} while (ev.type == GRPC_OP_COMPLETE && ev.tag != &tag_recv);
		if (ev.type != GRPC_OP_COMPLETE || !in)
			return; /* the stream ended: cancelled by us, or the agent went */
		Ckpt__V1__SessionEvent *m =
		    (Ckpt__V1__SessionEvent *)ipc_unpack(&ckpt__v1__session_event__descriptor, in);

		grpc_byte_buffer_destroy(in);
		in = NULL;
		if (!m)
			continue;
		pthread_mutex_lock(&c->mu);
		if (m->save)
			apply_event(c, m->save);
		pthread_cond_broadcast(&c->cv);
		pthread_mutex_unlock(&c->mu);
		protobuf_c_message_free_unpacked(&m->base, NULL);
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

	if (wait_flag(c, t, &t->status, cl_deadline(STATUS_WAIT_MS))) {
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

/* Ends the session's call and its queue (the session thread, or at free). */
static void close_call(struct ckpt_client *c)
{
	struct attach_tags *t = &c->atags;
	grpc_call *call;
	grpc_event ev;

	pthread_mutex_lock(&c->mu);
	call = c->scall;
	c->scall = NULL;
	pthread_mutex_unlock(&c->mu);
	if (call) {
		grpc_call_cancel(call, NULL);
		/* every batch of the call completes after a cancel: none may name it later */
		wait_flag(c, t, &t->start, gpr_inf_future(GPR_CLOCK_MONOTONIC));
		wait_flag(c, t, &t->status, gpr_inf_future(GPR_CLOCK_MONOTONIC));
		wait_flag(c, t, &t->recv, gpr_inf_future(GPR_CLOCK_MONOTONIC));
		grpc_call_unref(call);
	}
	if (c->scq) {
		grpc_completion_queue_shutdown(c->scq);
		do
			ev = grpc_completion_queue_next(c->scq, gpr_inf_future(GPR_CLOCK_MONOTONIC),
			                                NULL);
		while (ev.type != GRPC_QUEUE_SHUTDOWN);
		grpc_completion_queue_destroy(c->scq);
		c->scq = NULL;
	}
	if (c->sreq)
		grpc_byte_buffer_destroy(c->sreq);
	c->sreq = NULL;
	grpc_metadata_array_destroy(&c->smd);
	grpc_metadata_array_destroy(&c->strail);
	grpc_metadata_array_init(&c->smd);
	grpc_metadata_array_init(&c->strail);
	grpc_slice_unref(c->sdetails);
	c->sdetails = grpc_empty_slice();
}

/*
 * No keepalive pings, whatever gRPC's default: an agent that dies closes
 * its socket, and one stalled past a ping's timeout (a loaded machine) is
 * still the agent: the session must not end for it.
 */
static grpc_channel *channel_new(const char *endpoint)
{
	grpc_arg args[] = {
	    {.type = GRPC_ARG_INTEGER,
	     .key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH,
	     .value.integer = IPC_MAX_MESSAGE},
	    {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_KEEPALIVE_TIME_MS, .value.integer = INT_MAX},
	};
	grpc_channel_args cargs = {sizeof(args) / sizeof(args[0]), args};
	grpc_channel_credentials *creds = grpc_insecure_credentials_create();
	grpc_channel *ch = grpc_channel_create(endpoint, creds, &cargs);

	grpc_channel_credentials_release(creds);
	return ch;
}

static int attach(struct ckpt_client *c);

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
	c->ch = channel_new(c->endpoint);
	rc = attach(c);
	if (!rc) {
		pthread_mutex_lock(&c->reg_mu);
		pthread_mutex_lock(&c->mu);
		again = c->register_again;
		pthread_mutex_unlock(&c->mu);
		rc = again ? again(c) : 0; /* what the trainer registered (trainer_register.c) */
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
		close_call(c);
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
 * The stream ended. Unless we are closing (or told never to), fail what
 * was in flight and attach again until reconnect_ms have passed; whether
 * the session goes on. When not, the client is `gone` on return.
 */
static bool reattach(struct ckpt_client *c)
{
	int64_t t0 = mono_ms(), deadline = t0 + c->reconnect_ms;
	unsigned backoff = BACKOFF_FIRST_MS, nplans = 0, nregions = 0;
	char last[IPC_ERRLEN] = "", how[IPC_ERRLEN];
	bool closing;
	int rc;

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
	close_call(c);
	for (;;) {
		rc = attach_again(c);
		pthread_mutex_lock(&c->mu);
		if (rc)
			snprintf(last, sizeof(last), "%s", c->session_error);
		/* done, closing, out of time, or refused for good (another protocol) */
		if (!rc || rc == -ENOTSUP || c->closing || mono_ms() >= deadline ||
		    pause_ms(c, backoff) || mono_ms() >= deadline)
			break;
		pthread_mutex_unlock(&c->mu);
		backoff = (unsigned)ipc_backoff_next(backoff, BACKOFF_FIRST_MS, BACKOFF_MAX_MS);
	}
	/* under c->mu */
	closing = c->closing;
	if (rc) { /* gone, with why, in one step with the end of `away` */
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
	return rc == 0;
}

static void *session_thread(void *arg)
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

/*
 * Waits on the session queue until *flag is set (or the deadline); whether it
 * was. Every completion on the way is recorded, whichever batch it is: they
 * come in any order.
 */
static bool wait_flag(struct ckpt_client *c, struct attach_tags *t, bool *flag,
                      gpr_timespec deadline)
{
	while (!*flag) {
		grpc_event e = grpc_completion_queue_next(c->scq, deadline, NULL);

		if (e.type != GRPC_OP_COMPLETE)
			return false;
		note_tag(t, e.tag);
	}
	return true;
}

/*
 * The program's file name, for the agent's log ("libckpt" where unknown).
 * The whole path is read first: a path cut at the name's buffer cut the name.
 */
static void prog_name(char *out, size_t len)
{
	char exe[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	const char *base;

	if (n <= 0) {
		snprintf(out, len, "libckpt");
		return;
	}
	exe[n] = '\0'; /* readlink does not end it */
	base = strrchr(exe, '/');
	snprintf(out, len, "%s", base ? base + 1 : exe);
}

/*
 * Opens the Attach stream and reads the session id, before the thread
 * starts. The stream's status is asked for at once, so a refusal reaches the
 * caller in the agent's words.
 */
static int attach(struct ckpt_client *c)
{
	Ckpt__V1__AttachRequest req = CKPT__V1__ATTACH_REQUEST__INIT;
	struct attach_tags *t = &c->atags;
	int rc = 0;
	grpc_byte_buffer *in = NULL;
	Ckpt__V1__SessionEvent *ev = NULL;
	char prog[64], err[IPC_ERRLEN];
	grpc_call *call;
	grpc_op ops[4];

	prog_name(prog, sizeof(prog));
	req.client = prog;
	req.pid = (uint32_t)getpid();
	req.version = (char *)ipc_release();
	req.protocol = ipc_protocol();
	c->sreq = ipc_pack(&req.base);
	c->scq = grpc_completion_queue_create_for_next(NULL);
	call = grpc_channel_create_call(c->ch, NULL, GRPC_PROPAGATE_DEFAULTS, c->scq,
	                                grpc_slice_from_static_string(ipc_methods[IPC_ATTACH].path),
	                                NULL, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
	pthread_mutex_lock(&c->mu); /* ckpt_disconnect cancels it from another thread */
	c->scall = call;
	if (c->closing)
		grpc_call_cancel(call, NULL);
	pthread_mutex_unlock(&c->mu);
	memset(ops, 0, sizeof(ops));
	ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
	cl_metadata(c, &ops[0]);
	ops[1].op = GRPC_OP_SEND_MESSAGE;
	ops[1].data.send_message.send_message = c->sreq;
	ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
	ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
	ops[3].data.recv_initial_metadata.recv_initial_metadata = &c->smd;
	memset(t, 0, sizeof(*t));
	grpc_call_start_batch(c->scall, ops, 4, &t->start, NULL);
	memset(ops, 0, sizeof(ops));
	ops[0].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
	ops[0].data.recv_status_on_client.trailing_metadata = &c->strail;
	ops[0].data.recv_status_on_client.status = &c->sstatus;
	ops[0].data.recv_status_on_client.status_details = &c->sdetails;
	grpc_call_start_batch(c->scall, ops, 1, &t->status, NULL);
	memset(ops, 0, sizeof(ops));
	ops[0].op = GRPC_OP_RECV_MESSAGE;
	ops[0].data.recv_message.recv_message = &in;
	grpc_call_start_batch(c->scall, ops, 1, &t->recv, NULL);
	if (!wait_flag(c, t, &t->recv, cl_deadline(ATTACH_TIMEOUT_MS))) {
		/* No answer in time: cancel, and let the batch finish before `in` goes. */
		grpc_call_cancel(c->scall, NULL);
		wait_flag(c, t, &t->recv, gpr_inf_future(GPR_CLOCK_MONOTONIC));
		rc = cl_fail(c, -ETIMEDOUT, "ckptd at %s did not answer within %d s", c->endpoint,
		             ATTACH_TIMEOUT_MS / 1000);
	} else if (!in) {
		/* The stream ended at once: refused, or nobody there. */
		wait_flag(c, t, &t->status, gpr_inf_future(GPR_CLOCK_MONOTONIC));
		rc = cl_status(c, ipc_methods[IPC_ATTACH].path, c->sstatus, c->sdetails, NULL);
		if (rc == 0)
			rc = cl_fail(c, -EPROTO, "ckptd ended the session without a word");
	} else {
		ev = (Ckpt__V1__SessionEvent *)ipc_unpack(&ckpt__v1__session_event__descriptor, in);
		if (!ev || !ev->session_id)
			rc = cl_fail(c, -EPROTO, "%s does not speak ckpt.v1", c->endpoint);
		else if ((rc = ipc_compatible(false, ev->agent_version, ev->protocol, err)))
			cl_fail(c, rc, "%s", err);
		else {
			pthread_mutex_lock(
			    &c->mu); /* ckpt_agent_version reads it from any thread */
			c->session_id = ev->session_id;
			snprintf(c->agent_version, sizeof(c->agent_version), "%s",
			         ev->agent_version && *ev->agent_version ? ev->agent_version
			                                                 : "(older than 0.1)");
			pthread_mutex_unlock(&c->mu);
		}
	}
	if (ev)
		protobuf_c_message_free_unpacked(&ev->base, NULL);
	if (in)
		grpc_byte_buffer_destroy(in);
	return rc;
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
	close_call(c);
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
	c->ch = channel_new(c->endpoint);
	if (session) {
		rc = reconnect_window(c);
		if (!rc)
			rc = attach(c);
		if (!rc)
			rc = -pthread_create(&c->thread, NULL, session_thread, c);
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

const char *ckpt_agent_version(struct ckpt_client *c)
{
	static __thread char v[sizeof(c->agent_version)];

	if (!c)
		return "";
	pthread_mutex_lock(&c->mu);
	snprintf(v, sizeof(v), "%s", c->agent_version);
	pthread_mutex_unlock(&c->mu);
	return v;
}
