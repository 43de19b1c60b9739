/*
 * The Attach call of a trainer's client: the channel (no keepalive pings),
 * opening the stream and reading the session id and the agent's version
 * before the session thread starts (cl_open, on the caller's thread) or
 * when it attaches again (session_thread.c), and closing the call and its
 * queue (the session thread, or at free), and the stream's messages as
 * the session thread handles them (cl_rpc_next_event: struct cl_event). Calls
 * only the connection's own files (rpc.c, cred_client.c, fail.c).
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
#include "client/rpc_call.h"

#define ATTACH_TIMEOUT_MS 10000

/* ckpt.h's states are the protocol's State, number for number: events pass them on as they are. */
#define SAME(a, b) _Static_assert((int)(a) == (int)(b), #a " is not " #b)
SAME(CKPT_QUEUED, CKPT__V1__STATE__STATE_QUEUED);
SAME(CKPT_CAPTURED, CKPT__V1__STATE__STATE_CAPTURED);
SAME(CKPT_DURABLE, CKPT__V1__STATE__STATE_DURABLE);
SAME(CKPT_COMMITTED, CKPT__V1__STATE__STATE_COMMITTED);
SAME(CKPT_UPLOADED, CKPT__V1__STATE__STATE_UPLOADED);
SAME(CKPT_FAILED, CKPT__V1__STATE__STATE_FAILED);
SAME(CKPT_SKIPPED, CKPT__V1__STATE__STATE_SKIPPED);

/* A completion of one of the Attach call's own batches: noted (cl_close_call waits for each). */
void cl_note_tag(struct attach_tags *t, void *tag)
{
	if (tag == &t->start)
		t->start = true;
	else if (tag == &t->status)
		t->status = true;
	else if (tag == &t->recv)
		t->recv = true;
}

/*
 * Waits on the session queue until *flag is set (or the deadline); whether it
 * was. Every completion on the way is recorded, whichever batch it is: they
 * come in any order.
 */
bool cl_wait_flag(struct ckpt_client *c, struct attach_tags *t, bool *flag, gpr_timespec deadline)
{
	while (!*flag) {
		grpc_event e = grpc_completion_queue_next(c->scq, deadline, NULL);

		if (e.type != GRPC_OP_COMPLETE)
			return false;
		cl_note_tag(t, e.tag);
	}
	return true;
}

/* Ends the session's call and its queue (the session thread, or at free). */
void cl_close_call(struct ckpt_client *c)
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
		cl_wait_flag(c, t, &t->start, gpr_inf_future(GPR_CLOCK_MONOTONIC));
		cl_wait_flag(c, t, &t->status, gpr_inf_future(GPR_CLOCK_MONOTONIC));
		cl_wait_flag(c, t, &t->recv, gpr_inf_future(GPR_CLOCK_MONOTONIC));
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
grpc_channel *cl_channel_new(const char *endpoint)
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
 * Starts the Attach call on a new queue: the request sent and closed, the
 * stream's opening, its status and its first message asked for (into *in),
 * each batch noted in c->atags as it completes.
 */
static void attach_start(struct ckpt_client *c, grpc_byte_buffer **in)
{
	Ckpt__V1__AttachRequest req = CKPT__V1__ATTACH_REQUEST__INIT;
	struct attach_tags *t = &c->atags;
	char prog[64];
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
	ops[0].data.recv_message.recv_message = in;
	grpc_call_start_batch(c->scall, ops, 1, &t->recv, NULL);
}

/*
 * The stream's first message (ev, NULL if it was none such): the session id
 * and the agent's version kept, or why the agent will not do (its protocol).
 */
static int attach_answer(struct ckpt_client *c, const Ckpt__V1__SessionEvent *ev)
{
	char err[IPC_ERRLEN];
	int rc;

	if (!ev || !ev->session_id)
		return cl_fail(c, -EPROTO, "%s does not speak ckpt.v1", c->endpoint);
	if ((rc = ipc_compatible(false, ev->agent_version, ev->protocol, err)))
		return cl_fail(c, rc, "%s", err);
	pthread_mutex_lock(&c->mu); /* ckpt_agent_version reads it from any thread */
	c->session_id = ev->session_id;
	snprintf(c->agent_version, sizeof(c->agent_version), "%s",
	         ev->agent_version && *ev->agent_version ? ev->agent_version : "(older than 0.1)");
	pthread_mutex_unlock(&c->mu);
	return 0;
}

/*
 * Opens the Attach stream and reads the session id, before the thread
 * starts. The stream's status is asked for at once, so a refusal reaches the
 * caller in the agent's words.
 */
int cl_attach(struct ckpt_client *c)
{
	struct attach_tags *t = &c->atags;
	grpc_byte_buffer *in = NULL;
	Ckpt__V1__SessionEvent *ev = NULL;
	int rc = 0;

	attach_start(c, &in);
	if (!cl_wait_flag(c, t, &t->recv, cl_deadline(ATTACH_TIMEOUT_MS))) {
		/* No answer in time: cancel, and let the batch finish before `in` goes. */
		grpc_call_cancel(c->scall, NULL);
		cl_wait_flag(c, t, &t->recv, gpr_inf_future(GPR_CLOCK_MONOTONIC));
		rc = cl_fail(c, -ETIMEDOUT, "ckptd at %s did not answer within %d s", c->endpoint,
		             ATTACH_TIMEOUT_MS / 1000);
	} else if (!in) {
		/* The stream ended at once: refused, or nobody there. */
		cl_wait_flag(c, t, &t->status, gpr_inf_future(GPR_CLOCK_MONOTONIC));
		rc = cl_status(c, ipc_methods[IPC_ATTACH].path, c->sstatus, c->sdetails, NULL);
		if (rc == 0)
			rc = cl_fail(c, -EPROTO, "ckptd ended the session without a word");
	} else {
		ev = (Ckpt__V1__SessionEvent *)ipc_unpack(&ckpt__v1__session_event__descriptor, in);
		rc = attach_answer(c, ev);
	}
	if (ev)
		protobuf_c_message_free_unpacked(&ev->base, NULL);
	if (in)
		grpc_byte_buffer_destroy(in);
	return rc;
}

/* A save's state as the session stream tells it (info->reason copied). */
static void event_of(const Ckpt__V1__SaveInfo *info, struct cl_event *ev)
{
	ev->save = true;
	ev->save_id = info->save_id;
	ev->state = (int)info->state;
	ev->upload_failed = info->upload_failed;
	snprintf(ev->reason, sizeof(ev->reason), "%s", info->reason ? info->reason : "");
}

/* Waits for the session queue's next message into *in; false once the stream ended. */
static bool next_message(struct ckpt_client *c, grpc_byte_buffer **in)
{
	int tag_recv;
	grpc_event ev;
	grpc_op op;

	memset(&op, 0, sizeof(op));
	op.op = GRPC_OP_RECV_MESSAGE;
	op.data.recv_message.recv_message = in;
	if (grpc_call_start_batch(c->scall, &op, 1, &tag_recv, NULL) != GRPC_CALL_OK)
		return false;
	do {
		ev = grpc_completion_queue_next(c->scq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
		if (ev.type == GRPC_OP_COMPLETE)
			cl_note_tag(&c->atags, ev.tag);
	} while (ev.type == GRPC_OP_COMPLETE && ev.tag != &tag_recv);
	return ev.type == GRPC_OP_COMPLETE && *in;
}

int cl_rpc_next_event(struct ckpt_client *c, struct cl_event *ev)
{
	grpc_byte_buffer *in = NULL;

	for (;;) {
		if (!next_message(c, &in))
			return 0; /* the stream ended: cancelled by us, or the agent went */
		Ckpt__V1__SessionEvent *m =
		    (Ckpt__V1__SessionEvent *)ipc_unpack(&ckpt__v1__session_event__descriptor, in);

		grpc_byte_buffer_destroy(in);
		in = NULL;
		if (!m)
			continue;
		memset(ev, 0, sizeof(*ev));
		if (m->save)
			event_of(m->save, ev);
		protobuf_c_message_free_unpacked(&m->base, NULL);
		return 1;
	}
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
