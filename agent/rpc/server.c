/*
 * The agent's gRPC server over the core C API (see server.h for the model).
 *
 * Every completion-queue tag is a struct tag inside a struct rpc; the control
 * thread (server_run) calls tag->fn with the batch's success. Each method
 * always has one call requested from gRPC; when it arrives we request the
 * next one, decode the payload and run the handler.
 *
 * Lifetimes: a call is freed when its last batch completes and nobody owns
 * it (refs). Unary calls have one final batch; a held stream has a
 * RECV_CLOSE_ON_SERVER batch for its whole life, at most one send batch, the
 * final status batch, and the owner's reference.
 */
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>
#include <pthread.h>

#include <grpc/grpc.h>
#include <grpc/grpc_posix.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>

#include "ipc/base/log.h"
#include "agent/rpc/server.h"

/* A stream whose reader falls this far behind is cut off, as if it had left. */
#define STREAM_MAX_QUEUED 4096

struct rpc;

struct tag {
	void (*fn)(struct rpc *c, bool ok);
	struct rpc *c;
};

struct outmsg {
	grpc_byte_buffer *bb;
	size_t len;
	struct outmsg *next;
};

struct rpc {
	struct server *srv;
	enum ipc_method method; /* IPC_NMETHODS: a method we do not have */
	grpc_call_details details_in; /* unknown methods only */
	grpc_call *call;
	gpr_timespec deadline;
	grpc_metadata_array md;
	grpc_byte_buffer *payload;
	int cancelled;
	struct tag t_new, t_send, t_close, t_final;
	grpc_byte_buffer *reply;
	grpc_slice details;
	/* streams, under srv->mu */
	bool stream, meta_sent, sending, ended, closed, released, final_started;
	int end_status;
	struct outmsg *head, *tail;
	unsigned queued;
	size_t queued_bytes, max_bytes; /* max_bytes 0: only STREAM_MAX_QUEUED */
	char *cut_msg; /* the status a reader falling past max_bytes gets */
	pthread_cond_t room; /* a queued message went out, or the stream ended */
	rpc_close_fn on_close;
	void *ctx;
	int refs;
	struct peer peer; /* who called, from the call's token */
};

struct server {
	grpc_server *gs;
	grpc_completion_queue *cq;
	void *methods[IPC_NMETHODS];
	rpc_handler_fn handlers[IPC_NMETHODS];
	int (*identify)(void *ctx, const char *hex, size_t len, struct peer *p);
	void (*tick)(void *ctx);
	void *ctx;
	char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
	bool bound; /* the socket at path is ours (sock_dev, sock_ino): removed at the end */
	int lfd; /* its listener, accepted from by server_adopt's caller */
	grpc_server_credentials *creds;
	bool closing; /* under mu: shutting down, no more connections adopted */
	dev_t sock_dev;
	ino_t sock_ino;
	pthread_mutex_t mu;
	int live; /* calls not yet freed, requested ones included */
	bool shutdown_done;
	struct tag t_shutdown;
};

static void on_new(struct rpc *c, bool ok);
static void on_final(struct rpc *c, bool ok);
static void on_send(struct rpc *c, bool ok);
static void on_close(struct rpc *c, bool ok);
static void finish_unary(struct rpc *c, grpc_status_code code, const char *msg);

static const char *path_of(const struct rpc *c)
{
	return c->method < IPC_NMETHODS ? ipc_methods[c->method].path : "(unknown method)";
}

static void rpc_free(struct rpc *c)
{
	struct server *s = c->srv;

	while (c->head) {
		struct outmsg *m = c->head;

		c->head = m->next;
		grpc_byte_buffer_destroy(m->bb);
		free(m);
	}
	if (c->payload)
		grpc_byte_buffer_destroy(c->payload);
	if (c->reply)
		grpc_byte_buffer_destroy(c->reply);
	grpc_slice_unref(c->details);
	grpc_metadata_array_destroy(&c->md);
	free(c->cut_msg);
	pthread_cond_destroy(&c->room);
	if (c->method == IPC_NMETHODS)
		grpc_call_details_destroy(&c->details_in);
	if (c->call)
		grpc_call_unref(c->call);
	free(c);
	pthread_mutex_lock(&s->mu);
	s->live--;
	pthread_mutex_unlock(&s->mu);
}

/* Drops a reference taken under srv->mu; frees on the last. Call unlocked. */
static void rpc_unref(struct rpc *c)
{
	int left;

	pthread_mutex_lock(&c->srv->mu);
	left = --c->refs;
	pthread_mutex_unlock(&c->srv->mu);
	if (left == 0)
		rpc_free(c);
}

static int request_call(struct server *s, enum ipc_method m)
{
	struct rpc *c = calloc(1, sizeof(*c));
	grpc_call_error e;

	if (!c)
		return -ENOMEM;
	c->srv = s;
	c->method = m;
	c->details = grpc_empty_slice();
	c->t_new = (struct tag){on_new, c};
	c->t_send = (struct tag){on_send, c};
	c->t_close = (struct tag){on_close, c};
	c->t_final = (struct tag){on_final, c};
	pthread_cond_init(&c->room, NULL);
	grpc_metadata_array_init(&c->md);
	pthread_mutex_lock(&s->mu);
	s->live++;
	pthread_mutex_unlock(&s->mu);
	if (m == IPC_NMETHODS) {
		/* Calls to methods nobody registered wait for this, or forever. */
		grpc_call_details_init(&c->details_in);
		e = grpc_server_request_call(s->gs, &c->call, &c->details_in, &c->md, s->cq, s->cq,
		                             &c->t_new);
	} else {
		e = grpc_server_request_registered_call(s->gs, s->methods[m], &c->call,
		                                        &c->deadline, &c->md, &c->payload, s->cq,
		                                        s->cq, &c->t_new);
	}
	if (e != GRPC_CALL_OK) {
		log_msg(LOG_ERR, "gRPC: requesting a call failed (%d)", e);
		rpc_free(c);
		return -EIO;
	}
	return 0;
}

/* The peer the call's token stands for, into c->peer; whether there is one. */
static bool identify(struct rpc *c)
{
	struct server *s = c->srv;

	for (size_t i = 0; s->identify && i < c->md.count; i++) {
		const grpc_metadata *m = &c->md.metadata[i];

		if (grpc_slice_str_cmp(m->key, IPC_CRED_META) == 0)
			return s->identify(s->ctx, (const char *)GRPC_SLICE_START_PTR(m->value),
			                   GRPC_SLICE_LENGTH(m->value), &c->peer) == 0;
	}
	return false;
}

const struct peer *rpc_peer(const struct rpc *c)
{
	return &c->peer;
}

static void on_new(struct rpc *c, bool ok)
{
	struct server *s = c->srv;
	ProtobufCMessage *req;
	char err[IPC_ERRLEN];
	int rc;

	if (!ok) { /* the server is shutting down */
		rpc_free(c);
		return;
	}
	if (!s->shutdown_done)
		request_call(s, c->method);
	if (c->method == IPC_NMETHODS) {
		char *path = grpc_slice_to_c_string(c->details_in.method);

		finish_unary(c, GRPC_STATUS_UNIMPLEMENTED, "ckpt.v1 has no such method");
		log_msg(LOG_DEBUG, "call to unknown method %.128s refused", path);
		gpr_free(path);
		return;
	}
	if (!identify(c) && c->method != IPC_STATUS) {
		rpc_fail(
		    c, -EACCES,
		    "%s: the call carries no credentials: connect to the agent's socket "
		    "PATH%s first and send its token as '%s' metadata (libckpt and ckptctl do)",
		    ipc_methods[c->method].path, IPC_CRED_SUFFIX, IPC_CRED_META);
		return;
	}
	/* strings with NUL or control characters are refused here, naming the field */
	rc = ipc_decode(ipc_methods[c->method].request, c->payload, &req, err);
	if (rc) {
		rpc_fail(c, rc, "%s: %s", ipc_methods[c->method].path, err);
		return;
	}
	s->handlers[c->method](c, req, s->ctx);
}

enum ipc_method rpc_method(const struct rpc *c)
{
	return c->method;
}

bool rpc_deadline_passed(const struct rpc *c)
{
	return gpr_time_cmp(gpr_convert_clock_type(c->deadline, GPR_CLOCK_MONOTONIC),
	                    gpr_now(GPR_CLOCK_MONOTONIC)) <= 0;
}

/* The unary call's one batch: metadata, message or not, status, close. */
static void finish_unary(struct rpc *c, grpc_status_code code, const char *msg)
{
	grpc_op ops[4];
	size_t n = 0;
	grpc_call_error e;
	grpc_call *call;

	memset(ops, 0, sizeof(ops));
	ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
	if (c->reply) {
		ops[n].op = GRPC_OP_SEND_MESSAGE;
		ops[n++].data.send_message.send_message = c->reply;
	}
	c->details = msg ? grpc_slice_from_copied_string(msg) : grpc_empty_slice();
	ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
	ops[n].data.send_status_from_server.status = code;
	ops[n++].data.send_status_from_server.status_details = &c->details;
	ops[n].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
	ops[n++].data.recv_close_on_server.cancelled = &c->cancelled;
	/*
	 * A worker may be answering: the completion thread will read and free
	 * this call. Publish our writes through the server's mutex (gRPC's own
	 * locks order them too, but tools and readers cannot see those).
	 */
	call = c->call; /* the last read of c before the hand-over */
	pthread_mutex_lock(&c->srv->mu);
	c->refs = 1;
	pthread_mutex_unlock(&c->srv->mu);
	e = grpc_call_start_batch(call, ops, n, &c->t_final, NULL);
	if (e != GRPC_CALL_OK) {
		log_msg(LOG_ERR, "gRPC: %s: reply batch refused (%d)", path_of(c), e);
		rpc_free(c);
	}
}

void rpc_reply(struct rpc *c, const ProtobufCMessage *reply)
{
	c->reply = ipc_pack(reply);
	finish_unary(c, GRPC_STATUS_OK, NULL);
}

void rpc_fail(struct rpc *c, int err, const char *fmt, ...)
{
	char msg[1024];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	log_msg(LOG_DEBUG, "%s: %s", path_of(c), msg);
	finish_unary(c, ipc_errno_to_status(err), msg);
}

static void on_final(struct rpc *c, bool ok)
{
	rpc_unref(c);
}

/* ---- streams ---------------------------------------------------------- */

/* With srv->mu held: starts the next send, or the status once all are out. */
static void stream_kick(struct rpc *c)
{
	grpc_op ops[2];
	size_t n = 0;

	if (c->sending || c->final_started || c->closed)
		return;
	memset(ops, 0, sizeof(ops));
	if (!c->meta_sent) {
		ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
		c->meta_sent = true;
	}
	if (c->head) {
		ops[n].op = GRPC_OP_SEND_MESSAGE;
		ops[n++].data.send_message.send_message = c->head->bb;
		c->sending = true;
		c->refs++;
		if (grpc_call_start_batch(c->call, ops, n, &c->t_send, NULL) != GRPC_CALL_OK) {
			c->sending = false;
			c->refs--;
		}
		return;
	}
	if (!c->ended)
		return;
	ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
	ops[n].data.send_status_from_server.status = c->end_status;
	ops[n++].data.send_status_from_server.status_details = &c->details;
	c->final_started = true;
	c->refs++;
	if (grpc_call_start_batch(c->call, ops, n, &c->t_final, NULL) != GRPC_CALL_OK)
		c->refs--;
}

void rpc_stream_hold(struct rpc *c, rpc_close_fn close_fn, void *ctx)
{
	grpc_op op;

	memset(&op, 0, sizeof(op));
	op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
	op.data.recv_close_on_server.cancelled = &c->cancelled;
	c->stream = true;
	c->on_close = close_fn;
	c->ctx = ctx;
	c->refs = 2; /* the owner, and the close batch */
	if (grpc_call_start_batch(c->call, &op, 1, &c->t_close, NULL) != GRPC_CALL_OK) {
		c->refs = 1;
		c->closed = true;
	}
}

void rpc_stream_limit(struct rpc *c, size_t bytes, const char *cut_msg)
{
	pthread_mutex_lock(&c->srv->mu);
	c->max_bytes = bytes;
	free(c->cut_msg);
	c->cut_msg = cut_msg ? strdup(cut_msg) : NULL;
	pthread_mutex_unlock(&c->srv->mu);
}

int rpc_stream_send(struct rpc *c, const ProtobufCMessage *msg)
{
	struct outmsg *m;
	int rc = 0;

	pthread_mutex_lock(&c->srv->mu);
	if (c->closed || c->ended) {
		rc = -EPIPE;
		goto out;
	}
	m = calloc(1, sizeof(*m));
	if (!m || !(m->bb = ipc_pack(msg))) {
		free(m);
		rc = -ENOMEM;
		goto out;
	}
	m->len = grpc_byte_buffer_length(m->bb);
	if (c->queued >= STREAM_MAX_QUEUED ||
	    (c->max_bytes && c->queued_bytes + m->len > c->max_bytes)) {
		/* Cancelled, the close callback tells the owner, who cleans up. */
		grpc_call_cancel_with_status(
		    c->call, GRPC_STATUS_RESOURCE_EXHAUSTED,
		    c->cut_msg ? c->cut_msg : "this stream's reader fell too far behind", NULL);
		grpc_byte_buffer_destroy(m->bb);
		free(m);
		rc = -ENOBUFS;
		goto out;
	}
	if (c->tail)
		c->tail->next = m;
	else
		c->head = m;
	c->tail = m;
	c->queued++;
	c->queued_bytes += m->len;
	stream_kick(c);
out:
	pthread_mutex_unlock(&c->srv->mu);
	return rc;
}

int rpc_stream_send_wait(struct rpc *c, const ProtobufCMessage *msg, size_t window, int timeout_ms)
{
	struct timespec until;
	int rc = 0;

	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += timeout_ms / 1000;
	until.tv_nsec += (long)(timeout_ms % 1000) * 1000000;
	if (until.tv_nsec >= 1000000000) {
		until.tv_sec++;
		until.tv_nsec -= 1000000000;
	}
	pthread_mutex_lock(&c->srv->mu);
	while (!rc && !c->closed && !c->ended && c->queued_bytes >= window)
		rc = pthread_cond_timedwait(&c->room, &c->srv->mu, &until) == ETIMEDOUT ? -ETIMEDOUT
		                                                                        : 0;
	pthread_mutex_unlock(&c->srv->mu);
	return rc ? rc : rpc_stream_send(c, msg);
}

static void on_send(struct rpc *c, bool ok)
{
	pthread_mutex_lock(&c->srv->mu);
	c->sending = false;
	if (c->head) {
		struct outmsg *m = c->head;

		c->head = m->next;
		if (!c->head)
			c->tail = NULL;
		c->queued--;
		c->queued_bytes -= m->len;
		grpc_byte_buffer_destroy(m->bb);
		free(m);
	}
	pthread_cond_broadcast(&c->room);
	if (ok)
		stream_kick(c);
	pthread_mutex_unlock(&c->srv->mu);
	rpc_unref(c);
}

void rpc_stream_end(struct rpc *c, int err, const char *msg)
{
	pthread_mutex_lock(&c->srv->mu);
	if (!c->ended && !c->closed) {
		c->ended = true;
		c->end_status = ipc_errno_to_status(err);
		c->details = msg ? grpc_slice_from_copied_string(msg) : grpc_empty_slice();
		stream_kick(c);
	}
	pthread_mutex_unlock(&c->srv->mu);
	rpc_release(c);
}

void rpc_release(struct rpc *c)
{
	pthread_mutex_lock(&c->srv->mu);
	c->released = true;
	pthread_mutex_unlock(&c->srv->mu);
	rpc_unref(c);
}

static void on_close(struct rpc *c, bool ok)
{
	bool tell;

	pthread_mutex_lock(&c->srv->mu);
	c->closed = true;
	tell = !c->released && !c->ended;
	pthread_cond_broadcast(&c->room);
	pthread_mutex_unlock(&c->srv->mu);
	if (tell && c->on_close)
		c->on_close(c, c->ctx);
	rpc_unref(c);
}

/* ---- the server ------------------------------------------------------- */

/*
 * A socket file left by an agent that died would make bind fail. The agent
 * holds the socket's lock file by now (agent.c), so no live agent owns this
 * one; still, remove it only if nobody answers on it (a filesystem without
 * locks): a second agent must not steal a live one's.
 */
static int clear_stale_socket(const char *path, char *err)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	struct stat st;
	int fd, rc = 0;

	if (lstat(path, &st))
		return errno == ENOENT ? 0 : ipc_errf(err, -errno, "%s: %s", path, strerror(errno));
	if (!S_ISSOCK(st.st_mode))
		return ipc_errf(err, -EEXIST,
		                "%s exists and is not a socket: remove it or listen "
		                "elsewhere",
		                path);
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return ipc_errf(err, -errno, "socket: %s", strerror(errno));
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0)
		rc = ipc_errf(err, -EADDRINUSE, "another ckptd is serving %s", path);
	else if (unlink(path) && errno != ENOENT)
		rc = ipc_errf(err, -errno, "removing the stale socket %s: %s", path,
		              strerror(errno));
	close(fd);
	return rc;
}

static int bind_socket(struct server *s, const struct server_opts *o, char *err)
{
	struct stat st;
	int rc;

	if (strncmp(o->listen, "unix:", 5) != 0 || !o->listen[5])
		return ipc_errf(err, -EINVAL, "listen address '%s': only unix:PATH is supported",
		                o->listen);
	if (strlen(o->listen + 5) >= sizeof(s->path))
		return ipc_errf(err, -ENAMETOOLONG, "socket path %s is longer than %zu bytes",
		                o->listen + 5, sizeof(s->path) - 1);
	snprintf(s->path, sizeof(s->path), "%s", o->listen + 5);
	rc = clear_stale_socket(s->path, err);
	if (rc)
		return rc;
	/*
	 * Our own listener, not gRPC's: connections are accepted by the
	 * credentials thread, which knows each one's uid and holds every user
	 * to [limits] connections_per_user (gRPC would take them all, and
	 * stop accepting for good once out of descriptors), then hands them
	 * to gRPC (server_adopt).
	 */
	{
		struct sockaddr_un sa = {.sun_family = AF_UNIX};

		snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", s->path);
		s->lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
		if (s->lfd < 0)
			return ipc_errf(err, -errno, "socket: %s", strerror(errno));
		if (bind(s->lfd, (struct sockaddr *)&sa, sizeof(sa)) || listen(s->lfd, 512))
			return ipc_errf(
			    err, -errno,
			    "cannot listen on %s: %s (does its directory exist and is it "
			    "writable?)",
			    o->listen, strerror(errno));
	}
	if (lstat(s->path, &st) == 0 && S_ISSOCK(st.st_mode)) {
		s->bound = true;
		s->sock_dev = st.st_dev;
		s->sock_ino = st.st_ino;
	}
	return 0;
}

/* Who may talk to the agent is who may open its socket. */
static int socket_access(struct server *s, const struct server_opts *o, char *err)
{
	if (o->socket_gid >= 0 && chown(s->path, (uid_t)-1, (gid_t)o->socket_gid))
		return ipc_errf(err, -errno, "chown group %ld of %s: %s", o->socket_gid, s->path,
		                strerror(errno));
	if (o->socket_mode && chmod(s->path, o->socket_mode))
		return ipc_errf(err, -errno, "chmod %o %s: %s", o->socket_mode, s->path,
		                strerror(errno));
	return 0;
}

static void on_shutdown(struct rpc *c, bool ok)
{
	/* c is unused: the tag lives in the server */
}

int server_create(const struct server_opts *o, struct server **out, char *err)
{
	/*
	 * No keepalive pings (gRPC's server sends one every 2 h and closes the
	 * connection when 20 s pass without its answer): on a Unix socket a
	 * client that dies is seen at once (its socket closes), and a trainer
	 * stalled past the 20 s (a loaded machine, a debugger) would lose its
	 * session, plans and saves in flight while both still run.
	 */
	grpc_arg args[] = {
	    {.type = GRPC_ARG_INTEGER,
	     .key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH,
	     .value.integer = IPC_MAX_MESSAGE},
	    {.type = GRPC_ARG_INTEGER,
	     .key = GRPC_ARG_MAX_SEND_MESSAGE_LENGTH,
	     .value.integer = IPC_MAX_MESSAGE},
	    {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_KEEPALIVE_TIME_MS, .value.integer = INT_MAX},
	};
	grpc_channel_args cargs = {sizeof(args) / sizeof(args[0]), args};
	struct server *s;
	int rc;

	s = calloc(1, sizeof(*s));
	if (!s)
		return ipc_errf(err, -ENOMEM, "out of memory");
	pthread_mutex_init(&s->mu, NULL);
	s->lfd = -1;
	memcpy(s->handlers, o->handlers, sizeof(s->handlers));
	s->tick = o->tick;
	s->identify = o->identify;
	s->ctx = o->ctx;
	grpc_init();
	s->gs = grpc_server_create(&cargs, NULL);
	s->creds = grpc_insecure_server_credentials_create();
	s->cq = grpc_completion_queue_create_for_next(NULL);
	grpc_server_register_completion_queue(s->gs, s->cq, NULL);
	for (int m = 0; m < IPC_NMETHODS; m++)
		s->methods[m] = grpc_server_register_method(
		    s->gs, ipc_methods[m].path, NULL, GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER, 0);
	rc = bind_socket(s, o, err);
	if (rc)
		goto fail;
	grpc_server_start(s->gs);
	rc = socket_access(s, o, err);
	if (rc)
		goto fail_started;
	for (int m = 0; m <= IPC_NMETHODS; m++) {
		rc = request_call(s, m);
		if (rc) {
			ipc_errf(err, rc, "cannot request gRPC calls");
			goto fail_started;
		}
	}
	*out = s;
	return 0;
fail_started : {
	atomic_bool stop = true;

	server_run(s, &stop, NULL, NULL);
}
fail:
	server_destroy(s);
	return rc;
}

void server_run(struct server *s, atomic_bool *stop, bool (*drained)(void *ctx), void *ctx)
{
	bool stopping = false, cq_down = false;
	gpr_timespec next_tick = gpr_now(GPR_CLOCK_MONOTONIC);

	s->t_shutdown = (struct tag){on_shutdown, NULL};
	for (;;) {
		if (s->tick && gpr_time_cmp(gpr_now(GPR_CLOCK_MONOTONIC), next_tick) >= 0) {
			next_tick = gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
			                         gpr_time_from_millis(1000, GPR_TIMESPAN));
			s->tick(s->ctx);
		}
		grpc_event ev = grpc_completion_queue_next(
		    s->cq,
		    gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
		                 gpr_time_from_millis(100, GPR_TIMESPAN)),
		    NULL);

		if (ev.type == GRPC_QUEUE_SHUTDOWN)
			break;
		if (ev.type == GRPC_OP_COMPLETE) {
			struct tag *t = ev.tag;

			if (t == &s->t_shutdown)
				s->shutdown_done = true;
			else
				t->fn(t->c, ev.success);
		}
		if (!stopping && atomic_load(stop)) {
			stopping = true;
			pthread_mutex_lock(&s->mu);
			s->closing = true;
			pthread_mutex_unlock(&s->mu);
			grpc_server_shutdown_and_notify(s->gs, s->cq, &s->t_shutdown);
			grpc_server_cancel_all_calls(s->gs);
		}
		if (stopping && !cq_down && s->shutdown_done && (!drained || drained(ctx))) {
			bool idle;

			pthread_mutex_lock(&s->mu);
			idle = s->live == 0;
			pthread_mutex_unlock(&s->mu);
			if (idle) {
				grpc_completion_queue_shutdown(s->cq);
				cq_down = true;
			}
		}
	}
}

int server_listen_fd(const struct server *s)
{
	return s->lfd;
}

void server_adopt(struct server *s, int fd)
{
	pthread_mutex_lock(&s->mu);
	if (s->closing)
		close(fd);
	else
		grpc_server_add_channel_from_fd(s->gs, fd, s->creds);
	pthread_mutex_unlock(&s->mu);
}

void server_destroy(struct server *s)
{
	struct stat st;

	if (!s)
		return;
	if (s->gs)
		grpc_server_destroy(s->gs);
	if (s->cq)
		grpc_completion_queue_destroy(s->cq);
	if (s->creds)
		grpc_server_credentials_release(s->creds);
	if (s->lfd >= 0)
		close(s->lfd);
	/* Only the socket this server bound: never one it was refused on, nor a newer one. */
	if (s->bound && lstat(s->path, &st) == 0 && st.st_dev == s->sock_dev &&
	    st.st_ino == s->sock_ino)
		unlink(s->path);
	grpc_shutdown();
	pthread_mutex_destroy(&s->mu);
	free(s);
}
