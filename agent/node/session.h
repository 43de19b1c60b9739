/*
 * agent/node/session.h: clients (session.c) and the host regions they
 * register (region.c).
 *
 * Locks: a session and its regions are under agent.mu, every field; a
 * region's mapping (shm) is read without it while a plan holds a reference.
 */
#ifndef CKPT_AGENT_NODE_SESSION_H
#define CKPT_AGENT_NODE_SESSION_H

#include <stdbool.h>
#include <stdint.h>

#include "agent/node/node.h"
#include "agent/node/peer.h"
#include "ipc/ipc.h"

struct rpc;

struct session {
	struct list link;
	struct agent *a;
	uint64_t id;
	struct rpc *stream; /* the Attach call; NULL once the client left */
	char client[64];
	uint32_t pid;
	struct peer who; /* the credentials it attached with */
	struct list regions;
	struct list plans;
};

struct region {
	struct list link; /* session->regions while registered */
	uint64_t id;
	int kind;
	struct ipc_shm shm;
	unsigned refs; /* 1 while registered, + 1 per plan using it */
	uid_t uid; /* charged to */
};

/* Under mu. */
struct session *session_find(struct agent *a, uint64_t id);
/* The caller's own session (another user's is refused): NULL with why in err. */
struct session *session_of(struct agent *a, struct rpc *c, uint64_t id, char *err);
/* Under mu (region.c): s's region of that id, or NULL. */
struct region *region_find(struct session *s, uint64_t id);
/* Under mu (region.c): a reference let go; the last unmaps it. */
void region_put(struct region *r);
/* Under mu (a hub_save_fn): sends a save's new state to its client's Attach stream. */
void session_on_save(struct agent *a, struct save *s, enum save_state state);

#endif /* CKPT_AGENT_NODE_SESSION_H */
