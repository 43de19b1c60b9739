/*
 * agent/rpc/handlers.h: every call of the protocol (ipc/ckpt.proto), as
 * server.c dispatches it: (call, request decoded and checked, the agent).
 * Each handler checks who may (access.h), acts on the node's objects, and
 * answers the call, or hands it to a worker that does.
 *
 * Locks: called on the control thread, agent.mu not held.
 */
#ifndef CKPT_AGENT_RPC_HANDLERS_H
#define CKPT_AGENT_RPC_HANDLERS_H

#include "ipc/ipc.h"

struct rpc;

/* Sessions and their host regions (session_rpc.c; the objects in node/session.c). */
void rpc_attach(struct rpc *c, ProtobufCMessage *req, void *ctx);
void rpc_register_region(struct rpc *c, ProtobufCMessage *req, void *ctx);
void rpc_drop_region(struct rpc *c, ProtobufCMessage *req, void *ctx);
/* Plans made from a request, or dropped (plan_rpc.c). */
void rpc_create_plan(struct rpc *c, ProtobufCMessage *req, void *ctx);
void rpc_drop_plan(struct rpc *c, ProtobufCMessage *req, void *ctx);
/* A save admitted, or parked for its run's plan set; GetSave (save_rpc.c). */
void rpc_save(struct rpc *c, ProtobufCMessage *req, void *ctx);
void rpc_get_save(struct rpc *c, ProtobufCMessage *req, void *ctx);
/* `ckptctl commit --finish` (checkpoint_rpc.c). */
void rpc_commit(struct rpc *c, ProtobufCMessage *req, void *ctx);
/* Restore and verify (restore_rpc.c, verify_rpc.c; the work in node/restore.c, node/verify.c). */
void rpc_restore(struct rpc *c, ProtobufCMessage *req, void *ctx);
void rpc_verify(struct rpc *c, ProtobufCMessage *req, void *ctx);
/* Status and list (ops.c); show, delete and watch (show.c). */
void rpc_status(struct rpc *c, ProtobufCMessage *req, void *ctx);
void rpc_list(struct rpc *c, ProtobufCMessage *req, void *ctx);
void rpc_show(struct rpc *c, ProtobufCMessage *req, void *ctx);
void rpc_show_detail(struct rpc *c, ProtobufCMessage *req, void *ctx);
void rpc_delete(struct rpc *c, ProtobufCMessage *req, void *ctx);
void rpc_watch(struct rpc *c, ProtobufCMessage *req, void *ctx);
/* Retention on request and pins (gc_rpc.c; the work in node/gc.c). */
void rpc_gc(struct rpc *c, ProtobufCMessage *req, void *ctx);
void rpc_pin(struct rpc *c, ProtobufCMessage *req, void *ctx);

#endif /* CKPT_AGENT_RPC_HANDLERS_H */
