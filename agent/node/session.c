/*
 * Sessions and host regions. A client holds one Attach stream for as long as
 * it is connected; everything it registers (regions, plans) belongs to that
 * session, and goes when the stream ends: a trainer that dies leaves no
 * mapping behind in the agent and no shared-memory object on the node.
 * The calls (Attach, RegisterRegion, DropRegion) and the stream are
 * rpc/session_rpc.c's; here the objects, what each holds and is charged.
 *
 * Under agent.mu, on the control thread.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/node/node.h"
#include "agent/node/owners.h"
#include "agent/node/session.h"
#include "agent/node/plan.h"
#include "agent/node/save.h"
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

void session_end(struct agent *a, struct session *s)
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

struct session *session_new(struct agent *a, const struct peer *who, uint32_t pid,
                            const char *client, int *rc, char *err)
{
	char why[IPC_ERRLEN];
	struct session *s;

	if (a->nsessions >= MAX_SESSIONS || a->stopping) {
		*rc = a->stopping ? ipc_errf(err, -EAGAIN, "the agent is stopping")
		                  : ipc_errf(err, -EAGAIN, "the agent has %u clients, its limit",
		                             a->nsessions);
		return NULL;
	}
	if (usage_charge(a, who->uid, USE_SESSIONS, 1, why)) {
		*rc = ipc_errf(err, -EAGAIN, "attach: %s", why);
		return NULL;
	}
	s = calloc(1, sizeof(*s));
	if (!s) {
		usage_release(a, who->uid, USE_SESSIONS, 1);
		*rc = ipc_errf(err, -ENOMEM, "out of memory for a session");
		return NULL;
	}
	s->a = a;
	s->who = *who;
	s->id = ipc_random_id();
	s->pid = pid;
	snprintf(s->client, sizeof(s->client), "%s", client && *client ? client : "?");
	for (char *p = s->client; *p; p++)
		if ((unsigned char)*p < 0x20 || *p == 0x7f)
			*p = '?';
	list_init(&s->regions);
	list_init(&s->plans);
	list_add_tail(&a->sessions, &s->link);
	a->nsessions++;
	return s;
}

/* Under mu: the caller's session, refused when it is another user's. */
struct session *session_of(struct agent *a, uid_t uid, uint64_t id, char *err)
{
	struct session *s = session_find(a, id);

	if (!s) {
		ipc_errf(err, -ENOENT, "no session %llu: attach first (or the agent restarted)",
		         (unsigned long long)id);
		return NULL;
	}
	if (s->who.uid != uid) { /* another user's: as good as none */
		ipc_errf(err, -ENOENT, "no session %llu: attach first (or the agent restarted)",
		         (unsigned long long)id);
		return NULL;
	}
	return s;
}

int session_add_region(struct agent *a, struct session *s, struct region *r, char *err)
{
	uid_t uid = s->who.uid;
	int rc = usage_charge(a, uid, USE_REGIONS, 1, err);

	if (!rc && a->nregions >= MAX_REGIONS) {
		usage_release(a, uid, USE_REGIONS, 1);
		rc = ipc_errf(err, -EAGAIN, "the agent maps %u regions, its limit for all users",
		              a->nregions);
	}
	if (!rc && (rc = usage_charge(a, uid, USE_REGION_BYTES, r->shm.size, err)))
		usage_release(a, uid, USE_REGIONS, 1);
	if (rc)
		return rc;
	r->id = ipc_random_id();
	r->refs = 1;
	r->uid = uid;
	a->nregions++;
	list_add_tail(&s->regions, &r->link);
	return 0;
}

int session_drop_region(struct agent *a, uid_t uid, uint64_t session_id, uint64_t region_id)
{
	struct session *s = session_find(a, session_id);
	struct region *r = NULL;

	if (s && s->who.uid == uid)
		r = region_find(s, region_id);
	if (!r)
		return -ENOENT;
	region_unregister(a, r); /* plans still using it keep it mapped until they are dropped */
	return 0;
}
