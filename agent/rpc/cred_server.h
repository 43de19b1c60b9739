/*
 * The credentials socket (ipc.h: PATH.cred): who each client is, from the
 * kernel, and the host regions it hands over as file descriptors. One
 * thread of its own accepts connections, answers each with a token, and
 * keeps the descriptors a client sends until RegisterRegion claims them.
 * It accepts the gRPC socket's connections too, so that no user holds more
 * than [limits] connections_per_user of either kind.
 *
 * Locks: its own mutex, taken after the agent's (never calls out under it).
 */
#ifndef CKPT_AGENT_CRED_H
#define CKPT_AGENT_CRED_H

#include <stddef.h>
#include <stdint.h>

#include "agent/node/peer.h"

struct cred;

struct cred_opts {
	const char *endpoint; /* "unix:PATH": the socket is PATH.cred */
	unsigned socket_mode; /* as the gRPC socket's; 0: leave it */
	long socket_gid; /* < 0: leave it */
	long admin_gid; /* [agent] admin_group; < 0: none */
	unsigned conns_per_user; /* [limits] connections_per_user */
	unsigned fds_per_conn; /* descriptors sent and not yet claimed */
	/*
	 * The gRPC socket's listener: its connections are accepted here too,
	 * counted per uid with these, and handed to adopt (server_adopt).
	 */
	int grpc_lfd;
	void (*adopt)(void *ctx, int fd);
	void *adopt_ctx;
};

int cred_create(const struct cred_opts *o, struct cred **out, char *err);
/* Stops the thread, closes every connection and descriptor, removes the socket. */
/*
 * Stops the thread: no connection is taken, and none handed to the server,
 * from here on (before the server goes). cred_destroy stops it too.
 */
void cred_stop(struct cred *c);
void cred_destroy(struct cred *c);

/* The peer a token (hex, as the call's metadata carried it) stands for; -EACCES. */
int cred_identify(struct cred *c, const char *hex, size_t len, struct peer *p);
/*
 * The descriptor a peer's connection sent under `ticket`, and the size it
 * said; the caller owns it. -ENOENT when there is none.
 */
int cred_take_fd(struct cred *c, const struct peer *p, uint64_t ticket, uint64_t *size);
/* Connections open now (status). */
unsigned cred_count(struct cred *c);

#endif /* CKPT_AGENT_CRED_H */
