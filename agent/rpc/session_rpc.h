/*
 * agent/rpc/session_rpc.h: the session's Attach stream (session_rpc.c),
 * told of each new state of its client's saves.
 *
 * Locks: under agent.mu, on the publisher's thread.
 */
#ifndef CKPT_AGENT_RPC_SESSION_RPC_H
#define CKPT_AGENT_RPC_SESSION_RPC_H

#include "agent/node/node.h"
#include "agent/node/save.h"

/* Under mu (a hub_save_fn): sends a save's new state to its client's Attach stream. */
void session_on_save(struct agent *a, struct save *s, enum save_state state);

#endif /* CKPT_AGENT_RPC_SESSION_RPC_H */
