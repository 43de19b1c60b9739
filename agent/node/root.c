/*
 * The storage root's health: whether saves can go there now, since when,
 * and why not (ckptctl status, /metrics' ckptd_root_available, the log).
 * The check is the backend's (root_check: the root still there, the same
 * directory, writable, this node's lock on it held; a root made anew under
 * its name is opened again). It runs every few seconds on a thread of its
 * own (ckpt-root: a GC on maint or a verify must not hold it up), and at
 * once on a capture worker when a save's shard cannot be created.
 *
 * What a change does:
 *   -> missing           every committed checkpoint not being read leaves
 *                        the catalog: there is nothing of the root to list
 *   -> ok, or opened     the catalog of every job is synced from the root,
 *      again             and this node's plans files are published again
 *                        (a root made anew has none, and the many-nodes
 *                        commit needs them)
 * An unwritable root still lists and restores what it holds.
 *
 * Threads: root_check_now on the root thread or a capture worker, one at a
 * time (check_mu, taken before agent.mu); the state is under agent.mu; the
 * resync runs on the root thread, the plans files on the commit thread.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/node/node.h"
#include "agent/node/owners.h"
#include "agent/node/plan.h"
#include "agent/node/catalog.h"
#include "agent/node/root.h"
#include "storage/store.h"
#include "ipc/base/log.h"

#define CHECK_OK_NS (5LL * 1000000000) /* between checks of a root that is fine */
#define CHECK_BAD_NS (1LL * 1000000000) /* of one that is not: saves resume soon after */

struct root_watch {
	struct agent *a;
	struct workq *q;
	struct work check, sync;
	pthread_mutex_t check_mu; /* one check at a time, state changes in order */
	/* under agent.mu */
	bool stale; /* the catalog and plans files are to follow the root once it is ok */
	bool sync_queued; /* sync_run is queued or running */
};

const char *root_state_name(int state)
{
	switch (state) {
	case ROOT_OK:
		return "ok";
	case ROOT_MISSING:
		return "missing";
	default:
		return "unwritable";
	}
}

static int state_of(int rc)
{
	if (rc == 0)
		return ROOT_OK;
	return rc == -ENOENT || rc == -ESTALE || rc == -ENOTDIR ? ROOT_MISSING : ROOT_UNWRITABLE;
}

/* Under mu: what the root's state becomes (rc: the check's); what follows is done or queued. */
static void set_state(struct agent *a, int rc, bool reopened, const char *err)
{
	struct root_health *h = &a->root;
	struct root_watch *w = a->rootw;
	int state = state_of(rc), was = h->state;
	size_t dropped = 0;

	snprintf(h->error, sizeof(h->error), "%s", rc ? err : "");
	if (state != was)
		h->since_unix_ns = ipc_now_ns();
	h->state = state;
	/* What was listed lived in a directory that is gone. */
	if (reopened || (state == ROOT_MISSING && was != ROOT_MISSING))
		dropped = catalog_drop_unread(a->cat);
	if (reopened || state == ROOT_MISSING)
		w->stale = true;
	if (state != ROOT_OK && was == ROOT_OK)
		log_msg(LOG_ERR, "%s; %zu committed checkpoints no longer listed", err, dropped);
	else if (state == ROOT_OK && (was != ROOT_OK || reopened))
		log_msg(LOG_NOTICE, "storage root %s is usable again%s: saves resume", a->cfg.root,
		        reopened ? " (a new directory, opened again)" : "");
	if (state == ROOT_OK && w->stale && !w->sync_queued) {
		w->stale = false;
		w->sync_queued = true;
		workq_push(w->q, &w->sync);
	}
}

int root_check_now(struct agent *a, bool *reopened, char *err)
{
	struct root_watch *w = a->rootw;
	int rc;

	*reopened = false;
	if (!w || !a->store->ops->root_check)
		return 0;
	pthread_mutex_lock(&w->check_mu);
	rc = a->store->ops->root_check(a->store, reopened, err);
	pthread_mutex_lock(&a->mu);
	set_state(a, rc, *reopened, err);
	pthread_mutex_unlock(&a->mu);
	pthread_mutex_unlock(&w->check_mu);
	return rc;
}

bool root_after_failure(struct agent *a, int rc, char *err)
{
	char why[IPC_ERRLEN];
	bool reopened;
	int now;

	if (rc != -ENOENT && rc != -ESTALE && rc != -ENOTDIR && rc != -EACCES && rc != -EPERM &&
	    rc != -EROFS && rc != -EIO)
		return false; /* not the root's doing */
	now = root_check_now(a, &reopened, why);
	if (now)
		snprintf(err, IPC_ERRLEN, "%s", why); /* names the root, and what to do */
	/*
	 * Usable now: opened again by this check, or by the periodic one since
	 * the shard's directory was looked for in the old one (nothing was made).
	 */
	return now == 0 && (reopened || rc == -ENOENT || rc == -ESTALE);
}

/* Root thread: every few seconds. */
static void check_run(struct work *wk)
{
	struct root_watch *w = container_of(wk, struct root_watch, check);
	char err[IPC_ERRLEN];
	bool reopened;
	int rc = root_check_now(w->a, &reopened, err);

	workq_push_at(w->q, &w->check, ipc_mono_ns() + (rc ? CHECK_BAD_NS : CHECK_OK_NS));
}

static void owners_follow(struct agent *a);

/* Root thread: the root is back (or new): the catalog and the plans files follow it. */
static void sync_run(struct work *wk)
{
	struct root_watch *w = container_of(wk, struct root_watch, sync);
	struct agent *a = w->a;

	pthread_mutex_lock(&a->mu);
	w->sync_queued = false;
	pthread_mutex_unlock(&a->mu);
	catalog_sync_all(a);
	/* what a root made anew lacks: this node's plans files (publish.c) */
	pthread_mutex_lock(&a->mu);
	hub_root_back(&a->hub, a);
	pthread_mutex_unlock(&a->mu);
	owners_follow(a);
}

/*
 * Root thread: the owners of the jobs this node plans, recorded again where
 * the root lost them (a root made anew): a job saved into must never be
 * left for the first user who names it after a restart.
 */
static void owners_follow(struct agent *a)
{
	struct list *pos;
	struct {
		char job[IPC_MAX_JOB + 1];
		uint32_t uid;
	} *v = NULL;
	size_t n = 0, cap = 0;
	char err[IPC_ERRLEN];

	pthread_mutex_lock(&a->mu);
	list_for_each(pos, &a->plans)
	{
		struct plan *p = container_of(pos, struct plan, link);

		if (p->dropped)
			continue;
		if (n == cap) {
			void *m = realloc(v, (cap = cap ? 2 * cap : 8) * sizeof(*v));

			if (!m)
				break;
			v = m;
		}
		snprintf(v[n].job, sizeof(v[n].job), "%s", p->job);
		v[n++].uid = (uint32_t)p->uid;
	}
	pthread_mutex_unlock(&a->mu);
	for (size_t i = 0; i < n; i++) {
		uint32_t owner;

		/*
		 * Memory may still say who owns it; the disk is what a restart reads.
		 * The claim writes nothing where an owner is recorded: it reads it.
		 */
		if (store_owner_claim(a->store, v[i].job, v[i].uid, &owner, err)) {
			log_msg(LOG_WARNING, "job %s: its owner cannot be recorded again: %s",
			        v[i].job, err);
			continue;
		}
		pthread_mutex_lock(&a->mu);
		owner_note(a, v[i].job, true, owner);
		pthread_mutex_unlock(&a->mu);
	}
	free(v);
}

int root_watch_start(struct agent *a, char *err)
{
	struct root_watch *w = calloc(1, sizeof(*w));
	int rc;

	if (!w)
		return ipc_errf(err, -ENOMEM, "out of memory");
	w->a = a;
	w->check.fn = check_run;
	w->sync.fn = sync_run;
	pthread_mutex_init(&w->check_mu, NULL);
	a->rootw = w;
	a->root.state = ROOT_OK; /* opened and locked at start */
	a->root.since_unix_ns = ipc_now_ns();
	rc = workq_create("ckpt-root", 1, &w->q, err);
	if (rc)
		return rc;
	workq_push_at(w->q, &w->check, ipc_mono_ns() + CHECK_OK_NS);
	return 0;
}

void root_watch_stop(struct agent *a)
{
	struct root_watch *w = a->rootw;

	if (!w)
		return;
	workq_destroy(w->q); /* a check waiting for its time is dropped */
	pthread_mutex_destroy(&w->check_mu);
	free(w);
	a->rootw = NULL;
}
