/*
 * libckpt's connection to the agent: the gRPC channel, unary calls (each on
 * the client's pluck queue, so any thread may call), and server streams.
 * Used by the API in libckpt.c and by ckptctl.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>

#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>

#include "client/rpc_call.h"

const char *cl_endpoint(const struct ckpt_client *c)
{
	return c->endpoint;
}

gpr_timespec cl_deadline(int timeout_ms)
{
	if (timeout_ms < 0)
		return gpr_inf_future(GPR_CLOCK_MONOTONIC);
	return gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
	                    gpr_time_from_millis(timeout_ms, GPR_TIMESPAN));
}

/* A failed status as errno and a message naming the agent. */
int cl_status(struct ckpt_client *c, const char *method, grpc_status_code st, grpc_slice details,
              const char *errstr)
{
	char *msg = grpc_slice_to_c_string(details);
	int err = ipc_status_errno(st, *msg ? msg : errstr);

	if (err == -EMSGSIZE &&
	    (strncmp(msg, "Sent ", 5) == 0 || strncmp(msg, "Received ", 9) == 0))
		/* gRPC's own words: say which call, and that a retry cannot help */
		cl_fail(c, err,
		        "%s: %s: the request or its answer is more than one gRPC message may "
		        "carry (%u MiB here); a retry fails the same way: ask for less at a time "
		        "(ckptctl show without --full, list of one job; a plan of fewer tensors "
		        "or shorter names), or use a ckptctl and ckptd that page the answer",
		        method, msg, IPC_MAX_MESSAGE >> 20);
	else if (st == GRPC_STATUS_UNAVAILABLE)
		cl_fail(c, -ECONNREFUSED, "cannot reach ckptd at %s (is it running?): %s",
		        c->endpoint,
		        *msg     ? msg
		        : errstr ? errstr
		                 : "unavailable");
	else if (st == GRPC_STATUS_DEADLINE_EXCEEDED && !*msg)
		cl_fail(c, err, "%s: no answer from ckptd in time", method);
	else
		cl_fail(c, err, "%s", *msg ? msg : errstr ? errstr : "failed");
	gpr_free(msg);
	return st == GRPC_STATUS_UNAVAILABLE ? -ECONNREFUSED : err;
}

/* One unary call's buffers: what gRPC writes into, and what is freed after. */
struct unary {
	grpc_byte_buffer *out, *in;
	grpc_metadata_array init_md, trail_md;
	grpc_status_code st;
	grpc_slice details;
	const char *errstr;
	grpc_op ops[6];
};

/* The call's one batch: the token, the request sent and closed, the answer and status asked. */
static void unary_ops(struct ckpt_client *c, struct unary *u)
{
	grpc_op *ops = u->ops;

	memset(ops, 0, sizeof(u->ops));
	ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
	cl_metadata(c, &ops[0]);
	ops[1].op = GRPC_OP_SEND_MESSAGE;
	ops[1].data.send_message.send_message = u->out;
	ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
	ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
	ops[3].data.recv_initial_metadata.recv_initial_metadata = &u->init_md;
	ops[4].op = GRPC_OP_RECV_MESSAGE;
	ops[4].data.recv_message.recv_message = &u->in;
	ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
	ops[5].data.recv_status_on_client.trailing_metadata = &u->trail_md;
	ops[5].data.recv_status_on_client.status = &u->st;
	ops[5].data.recv_status_on_client.status_details = &u->details;
	ops[5].data.recv_status_on_client.error_string = &u->errstr;
}

int cl_call(struct ckpt_client *c, enum ipc_method m, const ProtobufCMessage *req,
            ProtobufCMessage **reply, int timeout_ms)
{
	const struct ipc_method_desc *d = &ipc_methods[m];
	struct unary u = {.out = ipc_pack(req), .in = NULL, .st = GRPC_STATUS_UNKNOWN};
	grpc_completion_queue *cq;
	grpc_call *call;
	grpc_event ev;
	int rc = 0;

	*reply = NULL;
	if (!u.out)
		return cl_fail(c, -ENOMEM, "out of memory");
	u.details = grpc_empty_slice();
	/*
	 * A queue per call: gRPC allows only 6 threads to pluck one queue at
	 * once, and the API promises any number of threads may call.
	 */
	cq = grpc_completion_queue_create_for_pluck(NULL);
	grpc_metadata_array_init(&u.init_md);
	grpc_metadata_array_init(&u.trail_md);
	call = grpc_channel_create_call(c->ch, NULL, GRPC_PROPAGATE_DEFAULTS, cq,
	                                grpc_slice_from_static_string(d->path), NULL,
	                                cl_deadline(timeout_ms), NULL);
	unary_ops(c, &u);
	if (grpc_call_start_batch(call, u.ops, 6, &u.ops, NULL) != GRPC_CALL_OK) {
		rc = cl_fail(c, -EIO, "%s: the call could not start", d->path);
		goto out;
	}
	ev = grpc_completion_queue_pluck(cq, &u.ops, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
	if (ev.type != GRPC_OP_COMPLETE || !ev.success) {
		rc = cl_fail(c, -EIO, "%s: the call failed", d->path);
		goto out;
	}
	pthread_mutex_lock(&c->mu);
	c->unanswered = u.st == GRPC_STATUS_DEADLINE_EXCEEDED;
	pthread_mutex_unlock(&c->mu);
	if (u.st != GRPC_STATUS_OK) {
		rc = cl_status(c, d->path, u.st, u.details, u.errstr);
		goto out;
	}
	*reply = ipc_unpack(d->reply, u.in);
	if (!*reply)
		rc = cl_fail(c, -EPROTO, "%s: the agent's reply is not a %s message", d->path,
		             d->reply->name);
out:
	grpc_byte_buffer_destroy(u.out);
	if (u.in)
		grpc_byte_buffer_destroy(u.in);
	grpc_slice_unref(u.details);
	gpr_free((void *)u.errstr);
	grpc_metadata_array_destroy(&u.init_md);
	grpc_metadata_array_destroy(&u.trail_md);
	grpc_call_unref(call);
	grpc_completion_queue_shutdown(cq);
	grpc_completion_queue_destroy(cq);
	return rc;
}

int cl_tidy_call(struct ckpt_client *c, enum ipc_method m, const ProtobufCMessage *req,
                 ProtobufCMessage **reply)
{
	bool skip;

	pthread_mutex_lock(&c->mu);
	skip = c->unanswered;
	pthread_mutex_unlock(&c->mu);
	*reply = NULL;
	if (skip)
		return cl_fail(c, -ETIMEDOUT,
		               "%s: not sent: ckptd at %s did not answer the last "
		               "call in time",
		               ipc_methods[m].path, c->endpoint);
	return cl_call(c, m, req, reply, CL_TIDY_TIMEOUT_MS);
}

/* ---- server streams ---------------------------------------------------- */

struct cl_stream {
	struct ckpt_client *c;
	const struct ipc_method_desc *d;
	grpc_completion_queue *cq;
	grpc_call *call;
	grpc_metadata_array init_md, trail_md;
	grpc_status_code st;
	grpc_slice details;
	const char *errstr;
	grpc_byte_buffer *in, *req; /* req: a send's buffer lives until the call ends */
	bool status_done, recv_pending, ended;
	int tag_start, tag_recv, tag_status;
};

/* Waits for one event on the stream's queue, up to deadline. */
static int stream_wait(struct cl_stream *s, gpr_timespec deadline)
{
	grpc_event ev = grpc_completion_queue_next(s->cq, deadline, NULL);

	if (ev.type == GRPC_QUEUE_TIMEOUT)
		return -ETIMEDOUT;
	if (ev.type != GRPC_OP_COMPLETE)
		return -EIO;
	if (ev.tag == &s->tag_status)
		s->status_done = true;
	else if (ev.tag == &s->tag_recv)
		s->recv_pending = false;
	return 0;
}

int cl_stream_open(struct ckpt_client *c, enum ipc_method m, const ProtobufCMessage *req,
                   struct cl_stream **out)
{
	struct cl_stream *s = calloc(1, sizeof(*s));
	grpc_byte_buffer *bb = ipc_pack(req);
	grpc_op ops[4];

	if (!s || !bb) {
		free(s);
		if (bb)
			grpc_byte_buffer_destroy(bb);
		return cl_fail(c, -ENOMEM, "out of memory");
	}
	s->c = c;
	s->d = &ipc_methods[m];
	s->details = grpc_empty_slice();
	grpc_metadata_array_init(&s->init_md);
	grpc_metadata_array_init(&s->trail_md);
	s->cq = grpc_completion_queue_create_for_next(NULL);
	s->call = grpc_channel_create_call(c->ch, NULL, GRPC_PROPAGATE_DEFAULTS, s->cq,
	                                   grpc_slice_from_static_string(s->d->path), NULL,
	                                   gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
	memset(ops, 0, sizeof(ops));
	ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
	cl_metadata(c, &ops[0]);
	ops[1].op = GRPC_OP_SEND_MESSAGE;
	ops[1].data.send_message.send_message = bb;
	ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
	ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
	ops[3].data.recv_initial_metadata.recv_initial_metadata = &s->init_md;
	grpc_call_start_batch(s->call, ops, 4, &s->tag_start, NULL);
	memset(ops, 0, sizeof(ops));
	ops[0].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
	ops[0].data.recv_status_on_client.trailing_metadata = &s->trail_md;
	ops[0].data.recv_status_on_client.status = &s->st;
	ops[0].data.recv_status_on_client.status_details = &s->details;
	ops[0].data.recv_status_on_client.error_string = &s->errstr;
	grpc_call_start_batch(s->call, ops, 1, &s->tag_status, NULL);
	s->req = bb;
	*out = s;
	return 0;
}

int cl_stream_next(struct cl_stream *s, ProtobufCMessage **msg, int timeout_ms)
{
	gpr_timespec deadline = cl_deadline(timeout_ms);
	grpc_op op;
	int rc;

	*msg = NULL;
	if (s->ended)
		return 0;
	if (!s->recv_pending) {
		memset(&op, 0, sizeof(op));
		op.op = GRPC_OP_RECV_MESSAGE;
		op.data.recv_message.recv_message = &s->in;
		s->in = NULL;
		if (grpc_call_start_batch(s->call, &op, 1, &s->tag_recv, NULL) != GRPC_CALL_OK)
			return cl_fail(s->c, -EIO, "%s: cannot read the stream", s->d->path);
		s->recv_pending = true;
	}
	while (s->recv_pending) {
		rc = stream_wait(s, deadline);
		if (rc)
			return rc;
	}
	if (!s->in) { /* the end: the status says how */
		s->ended = true;
		while (!s->status_done)
			if (stream_wait(s, gpr_inf_future(GPR_CLOCK_MONOTONIC)))
				break;
		if (s->st != GRPC_STATUS_OK)
			return cl_status(s->c, s->d->path, s->st, s->details, s->errstr);
		return 0;
	}
	*msg = ipc_unpack(s->d->reply, s->in);
	grpc_byte_buffer_destroy(s->in);
	s->in = NULL;
	if (!*msg)
		return cl_fail(s->c, -EPROTO, "%s: a message that is not a %s", s->d->path,
		               s->d->reply->name);
	return 1;
}

void cl_stream_close(struct cl_stream *s)
{
	grpc_event ev;

	if (!s)
		return;
	grpc_call_cancel(s->call, NULL);
	grpc_completion_queue_shutdown(s->cq);
	do
		ev = grpc_completion_queue_next(s->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
	while (ev.type != GRPC_QUEUE_SHUTDOWN);
	if (s->in)
		grpc_byte_buffer_destroy(s->in);
	grpc_byte_buffer_destroy(s->req);
	grpc_call_unref(s->call);
	grpc_completion_queue_destroy(s->cq);
	grpc_slice_unref(s->details);
	gpr_free((void *)s->errstr);
	grpc_metadata_array_destroy(&s->init_md);
	grpc_metadata_array_destroy(&s->trail_md);
	free(s);
}
