/*
 * The agent's gRPC server: one completion queue, driven by one thread (the
 * "control" thread, main's), for every method of ckpt.v1.Ckpt.
 *
 * A call arrives already decoded; its handler either answers at once or
 * hands the call to a worker, which answers later (rpc_reply / rpc_fail work
 * from any thread, exactly once per unary call). Server-streaming calls are
 * kept open with rpc_stream_hold: messages are queued with rpc_stream_send
 * (one SEND_MESSAGE in flight at a time, as gRPC requires) and the owner
 * hears through its close callback when the client goes away.
 *
 * Locks: the server has one mutex for stream state. Callers may hold their
 * own lock while calling in (lock order: caller's, then the server's); the
 * server never calls back with its mutex held.
 */
#ifndef CKPT_AGENT_SERVER_H
#define CKPT_AGENT_SERVER_H

#include <stdatomic.h>
#include <stdbool.h>

#include "ipc/ipc.h"
#include "agent/node/peer.h"

struct server;
struct rpc;

/* Handles a decoded request; owns `req` (free it with protobuf_c_message_free_unpacked). */
typedef void (*rpc_handler_fn)(struct rpc *c, ProtobufCMessage *req, void *ctx);
/* The client of a held stream went away. Call rpc_release (here or later). */
typedef void (*rpc_close_fn)(struct rpc *c, void *ctx);

struct server_opts {
	const char *listen; /* "unix:/path" */
	void (*tick)(void *ctx); /* about once a second, on the control thread; may be NULL */
	unsigned socket_mode; /* chmod of the socket; 0: leave it */
	long socket_gid; /* chown group of the socket; < 0: leave it */
	rpc_handler_fn handlers[IPC_NMETHODS];
	/*
	 * The peer a call's token (its IPC_CRED_META metadata) stands for: 0, or
	 * -EACCES. A call without one reaches only Status; NULL: nobody is known.
	 */
	int (*identify)(void *ctx, const char *hex, size_t len, struct peer *p);
	void *ctx;
};

/* Binds and starts serving (calls queue until server_run). */
int server_create(const struct server_opts *o, struct server **out, char *err);
/*
 * Runs the completion queue on this thread until *stop is set, then stops
 * taking calls, cancels those open, and returns once `drained` says the
 * caller's work is done (polled as the queue keeps turning; NULL: at once).
 */
void server_run(struct server *s, atomic_bool *stop, bool (*drained)(void *ctx), void *ctx);
/*
 * The socket's listening descriptor: whoever accepts from it (the
 * credentials thread) hands each connection to server_adopt, which gives
 * it to gRPC (or closes it once the server is stopping). Any thread.
 */
int server_listen_fd(const struct server *s);
void server_adopt(struct server *s, int fd);
/* After server_run: frees everything, removes the socket it bound. NULL is fine. */
void server_destroy(struct server *s);

enum ipc_method rpc_method(const struct rpc *c);
/* Whether the caller's deadline for the call has passed (it no longer waits for the answer). */
bool rpc_deadline_passed(const struct rpc *c);
/* Who called (peer.known false: no credentials; only Status gets that far). */
const struct peer *rpc_peer(const struct rpc *c);

/* Unary: the reply, or the failure (negative errno, or -EINVAL etc.) with a message. */
void rpc_reply(struct rpc *c, const ProtobufCMessage *reply);
void rpc_fail(struct rpc *c, int err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Streaming: keep the call open; on_close runs (control thread) if the client leaves. */
void rpc_stream_hold(struct rpc *c, rpc_close_fn on_close, void *ctx);
/*
 * A held stream whose unsent messages would pass `bytes` is cut with
 * RESOURCE_EXHAUSTED and cut_msg (copied), as if its reader had left.
 */
void rpc_stream_limit(struct rpc *c, size_t bytes, const char *cut_msg);
/* Queues a message; -EPIPE once the stream has ended, -ENOBUFS when it is cut. */
int rpc_stream_send(struct rpc *c, const ProtobufCMessage *msg);
/*
 * rpc_stream_send for a worker that sends much (a manifest in pieces): waits,
 * at most timeout_ms, while `window` bytes or more wait to be sent, so that
 * what is queued stays bounded whatever the whole. -ETIMEDOUT when the
 * client read nothing meanwhile. Not on the control thread (it sends).
 */
int rpc_stream_send_wait(struct rpc *c, const ProtobufCMessage *msg, size_t window, int timeout_ms);
/* Ends the stream from our side (status OK, or err with a message) and releases it. */
void rpc_stream_end(struct rpc *c, int err, const char *msg);
/* The owner is done with a stream the client closed. */
void rpc_release(struct rpc *c);

#endif /* CKPT_AGENT_SERVER_H */
