/*
 * The owners of jobs and what each user holds: node state, under agent.mu.
 *
 * Every job belongs to the user who first planned it: <root>/<job>/OWNER
 * holds that uid, written once (storage/store.c), so ownership survives
 * restarts and is the same on every node sharing the root. The agent keeps
 * what it has read in memory (owners); a job it has not seen yet is looked
 * up on the disk by a worker before anything is decided on it. Who may do
 * what with them is decided at the edge (rpc/access.c).
 *
 * Usage (usage_charge / usage_release): per uid, what it holds now, against
 * [limits]; a refusal names the limit and the key that raises it.
 *
 * Under agent.mu, every function here, unless it says otherwise.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/node/node.h"
#include "agent/node/owners.h"
#include "ipc/base/log.h"
#include "storage/store.h"

struct owner {
	char job[IPC_MAX_JOB + 1];
	uint32_t uid;
	bool none; /* looked up: nobody owns it (yet) */
};

struct usage {
	uid_t uid;
	uint64_t held[USE_NKINDS];
};

static struct owner *owner_find(struct agent *a, const char *job)
{
	for (size_t i = 0; i < a->nowners; i++)
		if (strcmp(a->owners[i].job, job) == 0)
			return &a->owners[i];
	return NULL;
}

void owner_note(struct agent *a, const char *job, bool found, uint32_t uid)
{
	struct owner *o = owner_find(a, job);

	if (!o) {
		struct owner *v = realloc(a->owners, (a->nowners + 1) * sizeof(*v));

		if (!v)
			return; /* looked up again next time */
		a->owners = v;
		o = &v[a->nowners++];
		snprintf(o->job, sizeof(o->job), "%s", job);
	}
	o->uid = uid;
	o->none = !found;
}

int owner_lookup(struct agent *a, const char *job, uint32_t *uid)
{
	const struct owner *o = owner_find(a, job);

	if (!o)
		return -EAGAIN;
	if (o->none)
		return -ENOENT;
	*uid = o->uid;
	return 0;
}

/* Any thread, not under mu: reads the job's owner from the root into memory. */
int owner_load(struct agent *a, const char *job, char *err)
{
	uint32_t uid = 0;
	int rc = store_owner_get(a->store, job, &uid, err);

	if (rc && rc != -ENOENT)
		return rc;
	pthread_mutex_lock(&a->mu);
	owner_note(a, job, rc == 0, uid);
	pthread_mutex_unlock(&a->mu);
	return 0;
}

int owners_load_all(struct agent *a, char *err)
{
	char **jobs = NULL, why[IPC_ERRLEN];
	size_t n = 0;
	int rc = a->store->ops->list_jobs(a->store, &jobs, &n, err);

	if (rc)
		return rc;
	for (size_t i = 0; i < n; i++) {
		if (owner_load(a, jobs[i], why))
			log_msg(LOG_WARNING, "job %s: %s", jobs[i], why);
		free(jobs[i]);
	}
	free(jobs);
	return 0;
}

void owners_free(struct agent *a)
{
	free(a->owners);
	a->owners = NULL;
	a->nowners = 0;
	free(a->usage);
	a->usage = NULL;
	a->nusage = 0;
}

/* ---- usage ------------------------------------------------------------- */

static const struct {
	const char *what, *key;
} kinds[USE_NKINDS] = {
    [USE_SESSIONS] = {"sessions", "sessions_per_user"},
    [USE_PLANS] = {"plans", "plans_per_user"},
    [USE_TENSORS] = {"tensors in plans", "tensors_per_user"},
    [USE_REGIONS] = {"host regions", "regions_per_user"},
    [USE_REGION_BYTES] = {"bytes of host regions", "region_mb_per_user"},
    [USE_WATCHERS] = {"Watch streams", "watchers_per_user"},
};

static uint64_t limit_of(const struct agent *a, enum use_kind k)
{
	const struct agent_limits *l = &a->cfg.lim;

	switch (k) {
	case USE_SESSIONS:
		return l->sessions;
	case USE_PLANS:
		return l->plans;
	case USE_TENSORS:
		return l->tensors;
	case USE_REGIONS:
		return l->regions;
	case USE_REGION_BYTES:
		return l->region_bytes;
	case USE_WATCHERS:
		return l->watchers;
	default:
		return 0;
	}
}

static struct usage *usage_of(struct agent *a, uid_t uid, bool add)
{
	struct usage *v;

	for (size_t i = 0; i < a->nusage; i++)
		if (a->usage[i].uid == uid)
			return &a->usage[i];
	if (!add)
		return NULL;
	v = realloc(a->usage, (a->nusage + 1) * sizeof(*v));
	if (!v)
		return NULL;
	a->usage = v;
	memset(&v[a->nusage], 0, sizeof(*v));
	v[a->nusage].uid = uid;
	return &v[a->nusage++];
}

int usage_charge(struct agent *a, uid_t uid, enum use_kind k, uint64_t n, char *err)
{
	struct usage *u = usage_of(a, uid, true);
	uint64_t lim = limit_of(a, k);

	if (!u)
		return ipc_errf(err, -ENOMEM, "out of memory");
	if (u->held[k] + n > lim || u->held[k] + n < n)
		return ipc_errf(err, -EAGAIN,
		                "uid %u holds %llu %s, and %llu more would pass the limit of %llu "
		                "([limits] %s)",
		                (unsigned)uid, (unsigned long long)u->held[k], kinds[k].what,
		                (unsigned long long)n, (unsigned long long)lim, kinds[k].key);
	u->held[k] += n;
	return 0;
}

void usage_release(struct agent *a, uid_t uid, enum use_kind k, uint64_t n)
{
	struct usage *u = usage_of(a, uid, false);

	if (u)
		u->held[k] = u->held[k] > n ? u->held[k] - n : 0;
}

uint64_t usage_held(struct agent *a, uid_t uid, enum use_kind k)
{
	struct usage *u = usage_of(a, uid, false);

	return u ? u->held[k] : 0;
}
