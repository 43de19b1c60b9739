/*
 * libckpt's calls as the protocol types them, shared with ckptctl: one unary
 * call, a server stream. Only the RPC layer (rpc*.c) and ckptctl use them;
 * the rest of the library calls rpc.h's functions, in its own types.
 */
#ifndef CKPT_CLIENT_RPC_CALL_H
#define CKPT_CLIENT_RPC_CALL_H

#include "client/client.h"

/*
 * One unary call. 0 and *reply (free with protobuf_c_message_free_unpacked),
 * or a negative errno with the agent's message in ckpt_last_error(c).
 */
int cl_call(struct ckpt_client *c, enum ipc_method m, const ProtobufCMessage *req,
            ProtobufCMessage **reply, int timeout_ms);
/* A call that only tidies up (CL_TIDY_TIMEOUT_MS); -ETIMEDOUT at once while unanswered. */
int cl_tidy_call(struct ckpt_client *c, enum ipc_method m, const ProtobufCMessage *req,
                 ProtobufCMessage **reply);

/* A server stream (Watch). */
struct cl_stream;
int cl_stream_open(struct ckpt_client *c, enum ipc_method m, const ProtobufCMessage *req,
                   struct cl_stream **out);
/* 1 and *msg; 0 at the end of the stream; -ETIMEDOUT; other negative errno. */
int cl_stream_next(struct cl_stream *s, ProtobufCMessage **msg, int timeout_ms);
void cl_stream_close(struct cl_stream *s);

#endif /* CKPT_CLIENT_RPC_CALL_H */
