/*
 * agent/node/session.h: clients (session.c) and the host regions they
 * register (region.c); their calls and the Attach stream are
 * rpc/session_rpc.c's.
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

struct session {
	struct list link;
	struct agent *a;
	uint64_t id;
	void *stream; /* the edge's Attach call (rpc/session_rpc.c); NULL once the client left */
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
/* Under mu: uid's own session (another user's is refused): NULL with why in err. */
struct session *session_of(struct agent *a, uid_t uid, uint64_t id, char *err);
/*
 * Under mu: a new session of who's (pid, the client's name as it gave it),
 * charged to its uid and listed; NULL with *rc (-EAGAIN: stopping or a limit,
 * -ENOMEM) and the whole message in err.
 */
struct session *session_new(struct agent *a, const struct peer *who, uint32_t pid,
                            const char *client, int *rc, char *err);
/* Under mu: the client is gone; releases what it held (plans, saves, regions) and frees s. */
void session_end(struct agent *a, struct session *s);
/*
 * Under mu: r (mapped, its shm and kind set) joins s, charged to its user:
 * 0 (r's id set), or -EAGAIN with why in err (a limit; r left as it was).
 */
int session_add_region(struct agent *a, struct session *s, struct region *r, char *err);
/* Under mu: uid's region of that id leaves its session: 0, or -ENOENT. */
int session_drop_region(struct agent *a, uid_t uid, uint64_t session_id, uint64_t region_id);
/* Under mu (region.c): s's region of that id, or NULL. */
struct region *region_find(struct session *s, uint64_t id);
/* Under mu (region.c): a reference let go; the last unmaps it. */
void region_put(struct region *r);

#endif /* CKPT_AGENT_NODE_SESSION_H */
