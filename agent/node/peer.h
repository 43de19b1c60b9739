/*
 * Who is calling: what the kernel said about the process at the other end
 * of a credentials connection (cred.c), attached to each gRPC call
 * (server.c) and checked by the handlers (access.c).
 */
#ifndef CKPT_AGENT_PEER_H
#define CKPT_AGENT_PEER_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

struct peer {
	bool known; /* false: the call carried no valid token */
	bool super; /* root, or the agent's own user: every job */
	bool admin; /* a member of [agent] admin_group: sees, deletes, pins every job */
	uid_t uid;
	gid_t gid;
	pid_t pid;
	uint64_t conn; /* the credentials connection: whose descriptors it may claim */
};

#endif /* CKPT_AGENT_PEER_H */
