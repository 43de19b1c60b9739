/*
 * Sessions and host regions. A client holds one Attach stream for as long as
 * it is connected; everything it registers (regions, plans) belongs to that
 * session, and goes when the stream ends: a trainer that dies leaves no
 * mapping behind in the agent and no shared-memory object on the node.
 *
 * Control thread only (the gRPC handlers and the stream's close callback),
 * but for session_on_save: any thread, under agent.mu.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "agent/node/node.h"
#include "agent/rpc/access.h"
#include "agent/node/session.h"
#include "agent/node/plan.h"
#include "agent/node/save.h"
#include "agent/rpc/handlers.h"
#include "agent/rpc/cred_server.h"
#include "agent/rpc/server.h"
#include "ipc/base/log.h"

#define MAX_SESSIONS 4096
/* Each region is a mapping: well under vm.max_map_count (65530) for all users together. */
#define MAX_REGIONS 32768

struct session *session_find(struct agent *a, uint64_t id)
{
	struct list *pos;

	list_for_each(pos, &a->sessions)
	{
		struct session *s = container_of(pos, struct session, link);

		if (s->id == id)
			return s;
	}
	return NULL;
}

/* Under mu: a region leaves its session (plans using it keep it mapped). */
static void region_unregister(struct agent *a, struct region *r)
{
	list_del(&r->link);
	a->nregions--;
	usage_release(a, r->uid, USE_REGIONS, 1);
	usage_release(a, r->uid, USE_REGION_BYTES, r->shm.size);
	region_put(r);
}

static unsigned count(const struct list *l)
{
	unsigned n = 0;

	for (const struct list *p = l->next; p != l; p = p->next)
		n++;
	return n;
}

/* Under mu: the client is gone; release what it held. */
static void session_end(struct agent *a, struct session *s)
{
	unsigned nplans = count(&s->plans), nregions = count(&s->regions);
	struct list *pos, *tmp;

	list_for_each_safe(pos, tmp, &s->plans) plan_drop(a, container_of(pos, struct plan, slink));
	save_forget_session(a, s);
	list_for_each_safe(pos, tmp, &s->regions)
	    region_unregister(a, container_of(pos, struct region, link));
	list_del(&s->link);
	a->nsessions--;
	usage_release(a, s->who.uid, USE_SESSIONS, 1);
	log_msg(LOG_INFO, "client %s (pid %u) left: %u plans and %u regions released", s->client,
	        s->pid, nplans, nregions);
	free(s);
}

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

	if (ipc_compatible(true, req->version, req->protocol, err)) {
		log_msg(LOG_WARNING, "client %.64s (pid %u) refused: %s",
		        req->client && *req->client ? req->client : "?", req->pid, err);
		rpc_fail(c, -ENOTSUP, "%s", err);
		goto out;
	}
	pthread_mutex_lock(&a->mu);
	if (a->nsessions >= MAX_SESSIONS || a->stopping) {
		pthread_mutex_unlock(&a->mu);
		if (a->stopping)
			rpc_fail(c, -EAGAIN, "the agent is stopping");
		else
			rpc_fail(c, -EAGAIN, "the agent has %u clients, its limit", a->nsessions);
		goto out;
	}
	if (usage_charge(a, rpc_peer(c)->uid, USE_SESSIONS, 1, err)) {
		pthread_mutex_unlock(&a->mu);
		rpc_fail(c, -EAGAIN, "attach: %s", err);
		goto out;
	}
	s = calloc(1, sizeof(*s));
	if (!s) {
		usage_release(a, rpc_peer(c)->uid, USE_SESSIONS, 1);
		pthread_mutex_unlock(&a->mu);
		rpc_fail(c, -ENOMEM, "out of memory for a session");
		goto out;
	}
	s->a = a;
	s->who = *rpc_peer(c);
	s->id = ipc_random_id();
	s->stream = c;
	s->pid = req->pid;
	snprintf(s->client, sizeof(s->client), "%s",
	         req->client && *req->client ? req->client : "?");
	for (char *p = s->client; *p; p++)
		if ((unsigned char)*p < 0x20 || *p == 0x7f)
			*p = '?';
	list_init(&s->regions);
	list_init(&s->plans);
	list_add_tail(&a->sessions, &s->link);
	a->nsessions++;
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

/* Under mu: the caller's session, refused when it is another user's. */
struct session *session_of(struct agent *a, struct rpc *c, uint64_t id, char *err)
{
	struct session *s = session_find(a, id);

	if (!s) {
		ipc_errf(err, -ENOENT, "no session %llu: attach first (or the agent restarted)",
		         (unsigned long long)id);
		return NULL;
	}
	if (s->who.uid != rpc_peer(c)->uid) { /* another user's: as good as none */
		ipc_errf(err, -ENOENT, "no session %llu: attach first (or the agent restarted)",
		         (unsigned long long)id);
		return NULL;
	}
	return s;
}

void rpc_register_region(struct rpc *c, ProtobufCMessage *m, void *ctx)
{
	Ckpt__V1__RegisterRegionRequest *req = (Ckpt__V1__RegisterRegionRequest *)m;
	Ckpt__V1__RegisterRegionReply rep = CKPT__V1__REGISTER_REGION_REPLY__INIT;
	struct agent *a = ctx;
	const struct peer *who = rpc_peer(c);
	char err[IPC_ERRLEN];
	struct session *s;
	struct region *r;
	uint64_t said = 0;
	int rc, fd;

	fd = cred_take_fd(a->cred, who, req->ticket, &said);
	if (fd < 0) {
		rpc_fail(c, -ENOENT,
		         "no region under ticket %llu on this client's credentials connection "
		         "(send it there first)",
		         (unsigned long long)req->ticket);
		goto out;
	}
	r = calloc(1, sizeof(*r));
	if (!r) {
		close(fd);
		rpc_fail(c, -ENOMEM, "out of memory for a region");
		goto out;
	}
	/* Checking and mapping are quick system calls, no disk: fine on this thread. */
	rc = said == req->size
	         ? ipc_shm_map(fd, req->size, &r->shm, err)
	         : (close(fd), ipc_errf(err, -EINVAL, "region of %llu bytes, sent as %llu",
	                                (unsigned long long)req->size, (unsigned long long)said));
	if (rc) {
		free(r);
		rpc_fail(c, rc, "%s", err);
		goto out;
	}
	pthread_mutex_lock(&a->mu);
	s = session_of(a, c, req->session_id, err);
	rc = s ? usage_charge(a, who->uid, USE_REGIONS, 1, err) : -ENOENT;
	if (!rc && a->nregions >= MAX_REGIONS) {
		usage_release(a, who->uid, USE_REGIONS, 1);
		rc = ipc_errf(err, -EAGAIN, "the agent maps %u regions, its limit for all users",
		              a->nregions);
	}
	if (!rc && (rc = usage_charge(a, who->uid, USE_REGION_BYTES, r->shm.size, err)))
		usage_release(a, who->uid, USE_REGIONS, 1);
	if (rc) {
		pthread_mutex_unlock(&a->mu);
		ipc_shm_unmap(&r->shm);
		free(r);
		rpc_fail(c, s ? -EAGAIN : -ENOENT, "%s", err);
		goto out;
	}
	r->id = ipc_random_id();
	r->kind = CKPT__V1__REGION_KIND__REGION_HOST;
	r->refs = 1;
	r->uid = who->uid;
	a->nregions++;
	list_add_tail(&s->regions, &r->link);
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
	struct session *s;
	struct region *r = NULL;

	pthread_mutex_lock(&a->mu);
	s = session_find(a, req->session_id);
	if (s && s->who.uid == rpc_peer(c)->uid)
		r = region_find(s, req->region_id);
	if (r) /* plans still using it keep it mapped until they are dropped */
		region_unregister(a, r);
	pthread_mutex_unlock(&a->mu);
	if (r)
		rpc_reply(c, &rep.base);
	else
		rpc_fail(c, -ENOENT, "no region %llu in session %llu",
		         (unsigned long long)req->region_id, (unsigned long long)req->session_id);
	protobuf_c_message_free_unpacked(m, NULL);
}
