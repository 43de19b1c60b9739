/*
 * Attach, RegisterRegion and DropRegion: the calls of a client's session.
 * Attach holds its stream for as long as the client is connected; the
 * stream's end ends the session (node/session.c, which holds the sessions,
 * their regions and what they are charged). Each new state of a save is
 * sent on its client's stream (session_on_save, a hub listener).
 *
 * Control thread only (the gRPC handlers and the stream's close callback),
 * but for session_on_save: any thread, under agent.mu.
 */
#include <errno.h>
#include <stdlib.h>
#include <unistd.h>

#include "agent/node/node.h"
#include "agent/node/save.h"
#include "agent/node/session.h"
#include "agent/rpc/cred_server.h"
#include "agent/rpc/handlers.h"
#include "agent/rpc/ops.h"
#include "agent/rpc/server.h"
#include "agent/rpc/session_rpc.h"
#include "ipc/base/log.h"

static void on_session_close(struct rpc *c, void *ctx)
{
	struct session *s = ctx;
	struct agent *a = s->a;

	pthread_mutex_lock(&a->mu);
	s->stream = NULL;
	session_end(a, s);
	pthread_mutex_unlock(&a->mu);
	rpc_release(c);
}

void rpc_attach(struct rpc *c, ProtobufCMessage *m, void *ctx)
{
	Ckpt__V1__AttachRequest *req = (Ckpt__V1__AttachRequest *)m;
	Ckpt__V1__SessionEvent ev = CKPT__V1__SESSION_EVENT__INIT;
	struct agent *a = ctx;
	char err[IPC_ERRLEN];
	struct session *s;
	int rc;

	if (ipc_compatible(true, req->version, req->protocol, err)) {
		log_msg(LOG_WARNING, "client %.64s (pid %u) refused: %s",
		        req->client && *req->client ? req->client : "?", req->pid, err);
		rpc_fail(c, -ENOTSUP, "%s", err);
		goto out;
	}
	pthread_mutex_lock(&a->mu);
	s = session_new(a, rpc_peer(c), req->pid, req->client, &rc, err);
	if (!s) {
		pthread_mutex_unlock(&a->mu);
		rpc_fail(c, rc, "%s", err);
		goto out;
	}
	s->stream = c;
	rpc_stream_hold(c, on_session_close, s);
	ev.session_id = s->id;
	ev.agent_version = (char *)ipc_release();
	ev.protocol = ipc_protocol();
	rpc_stream_send(c, &ev.base);
	pthread_mutex_unlock(&a->mu);
	log_msg(LOG_INFO, "client %s (pid %u, uid %u, libckpt %.32s) attached", s->client, s->pid,
	        (unsigned)s->who.uid, req->version && *req->version ? req->version : "?");
out:
	protobuf_c_message_free_unpacked(m, NULL);
}

void session_on_save(struct agent *a, struct save *s, enum save_state state)
{
	Ckpt__V1__SaveInfo info = CKPT__V1__SAVE_INFO__INIT;
	Ckpt__V1__SessionEvent ev = CKPT__V1__SESSION_EVENT__INIT;

	(void)a;
	(void)state; /* s->state */
	if (!s->sess || !s->sess->stream)
		return;
	save_info(s, &info);
	ev.session_id = s->sess->id;
	ev.save = &info;
	rpc_stream_send(s->sess->stream, &ev.base);
}

/* The region sent under ticket on the caller's credentials connection, mapped: 0, or fails c. */
static int region_map(struct agent *a, struct rpc *c, const Ckpt__V1__RegisterRegionRequest *req,
                      struct region **out)
{
	char err[IPC_ERRLEN];
	struct region *r;
	uint64_t said = 0;
	int rc, fd;

	fd = cred_take_fd(a->cred, rpc_peer(c), req->ticket, &said);
	if (fd < 0) {
		rpc_fail(c, -ENOENT,
		         "no region under ticket %llu on this client's credentials connection "
		         "(send it there first)",
		         (unsigned long long)req->ticket);
		return -ENOENT;
	}
	r = calloc(1, sizeof(*r));
	if (!r) {
		close(fd);
		rpc_fail(c, -ENOMEM, "out of memory for a region");
		return -ENOMEM;
	}
	/* Checking and mapping are quick system calls, no disk: fine on this thread. */
	rc = said == req->size
	         ? ipc_shm_map(fd, req->size, &r->shm, err)
	         : (close(fd), ipc_errf(err, -EINVAL, "region of %llu bytes, sent as %llu",
	                                (unsigned long long)req->size, (unsigned long long)said));
	if (rc) {
		free(r);
		rpc_fail(c, rc, "%s", err);
		return rc;
	}
	r->kind = CKPT__V1__REGION_KIND__REGION_HOST;
	*out = r;
	return 0;
}

void rpc_register_region(struct rpc *c, ProtobufCMessage *m, void *ctx)
{
	Ckpt__V1__RegisterRegionRequest *req = (Ckpt__V1__RegisterRegionRequest *)m;
	Ckpt__V1__RegisterRegionReply rep = CKPT__V1__REGISTER_REGION_REPLY__INIT;
	struct agent *a = ctx;
	char err[IPC_ERRLEN];
	struct session *s;
	struct region *r;
	int rc;

	if (region_map(a, c, req, &r))
		goto out;
	pthread_mutex_lock(&a->mu);
	s = session_of(a, rpc_peer(c)->uid, req->session_id, err);
	rc = s ? session_add_region(a, s, r, err) : -ENOENT;
	if (rc) {
		pthread_mutex_unlock(&a->mu);
		ipc_shm_unmap(&r->shm);
		free(r);
		rpc_fail(c, s ? -EAGAIN : -ENOENT, "%s", err);
		goto out;
	}
	rep.region_id = r->id;
	pthread_mutex_unlock(&a->mu);
	rpc_reply(c, &rep.base);
out:
	protobuf_c_message_free_unpacked(m, NULL);
}

void rpc_drop_region(struct rpc *c, ProtobufCMessage *m, void *ctx)
{
	Ckpt__V1__DropRegionRequest *req = (Ckpt__V1__DropRegionRequest *)m;
	Ckpt__V1__Empty rep = CKPT__V1__EMPTY__INIT;
	struct agent *a = ctx;
	int rc;

	pthread_mutex_lock(&a->mu);
	rc = session_drop_region(a, rpc_peer(c)->uid, req->session_id, req->region_id);
	pthread_mutex_unlock(&a->mu);
	if (!rc)
		rpc_reply(c, &rep.base);
	else
		rpc_fail(c, -ENOENT, "no region %llu in session %llu",
		         (unsigned long long)req->region_id, (unsigned long long)req->session_id);
	protobuf_c_message_free_unpacked(m, NULL);
}
