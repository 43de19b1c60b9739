/*
 * Each job's plans file (docs/DESIGN.md §6.5): what this node's live plans
 * of a run hold, written to the root when they change (a plan made, the
 * root back), and before a step's part (plans_put). While a run's plan set
 * is not complete, and while this node holds rank 0, the same job of the
 * commit thread looks at the other nodes' plans (layouts.c) again and
 * again: every 200 ms, then every second. A file that could not be put is
 * tried again after a back-off.
 *
 * plans_publish and the hub's subscribers run under agent.mu on whatever
 * thread; publish_run is the commit thread's job.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/node/node.h"
#include "agent/node/plan.h"
#include "agent/node/layouts.h"
#include "agent/node/park.h"
#include "agent/node/publish.h"
#include "storage/store.h"
#include "ipc/base/log.h"

/* A job whose plans file is to be written: at most one job queued per job. */
struct plans_pub {
	struct list link; /* agent->pubs */
	struct agent *a;
	struct work work;
	char job[IPC_MAX_JOB + 1], run[IPC_MAX_JOB + 1];
	bool again; /* changed since it was last written: written at the next run */
	bool polled; /* it ran once: a run after is a look at the others' plans alone */
	int64_t wait_since; /* waiting for the run's plan set to be complete since (0: not) */
	int64_t retry_ns; /* its last put failed: tried again after this (0: it did not) */
};

/* While a run's plan set is not complete, the root is looked at this often (layouts.c). */
#define PLANS_POLL_FAST_NS 200000000LL /* for its first PLANS_POLL_FAST_FOR_NS */
#define PLANS_POLL_FAST_FOR_NS 10000000000LL
#define PLANS_POLL_NS 1000000000LL /* then, up to --commit-deadline */

static int cmp_rank(const void *x, const void *y)
{
	return ((const struct plans_rank *)x)->rank - ((const struct plans_rank *)y)->rank;
}

/* Under mu: this node's live plans of (job, run), as its plans file. -ENOENT: none. */
static int plans_snapshot(struct agent *a, const char *job, const char *run,
                          struct plans_file **out)
{
	struct plans_file *f = calloc(1, sizeof(*f));
	struct list *pos;
	size_t n = 0;
	int rc = 0;

	*out = NULL;
	if (!f)
		return -ENOMEM;
	list_for_each(pos, &a->plans) n++;
	f->version = PLANS_VERSION;
	f->writes_once = true; /* layouts.c */
	f->job = strdup(job);
	f->node = strdup(a->cfg.node);
	f->run = strdup(run);
	f->ranks = calloc(n + 1, sizeof(*f->ranks));
	if (!f->job || !f->node || !f->run || !f->ranks)
		rc = -ENOMEM;
	list_for_each(pos, &a->plans)
	{
		const struct plan *p = container_of(pos, struct plan, link);
		struct plans_rank *k;

		if (rc || strcmp(p->job, job) != 0 || strcmp(p->run, run) != 0)
			continue;
		f->world = p->world;
		k = &f->ranks[f->nranks++];
		k->rank = p->rank;
		k->copies = p->copies;
		if ((rc = plan_holds(p, &k->tensors, &k->ntensors)))
			break;
	}
	if (!rc && f->nranks == 0)
		rc = -ENOENT;
	if (rc) {
		plans_free(f);
		return rc;
	}
	qsort(f->ranks, f->nranks, sizeof(*f->ranks), cmp_rank);
	*out = f;
	return 0;
}

/*
 * Whether another node has published plans for job (a listing: discovery
 * only, for a warning). False when the listing fails.
 */
static bool other_nodes(struct agent *a, const char *job)
{
	char **names = NULL, err[IPC_ERRLEN];
	size_t n = 0;
	bool other = false;

	if (store_list_nodes(a->store, job, &names, &n, err))
		return false;
	for (size_t i = 0; i < n; i++) {
		other = other || strcmp(names[i], a->cfg.node) != 0;
		free(names[i]);
	}
	free(names);
	return other;
}

int plans_put(struct agent *a, const char *job, const char *run, char *err)
{
	struct plans_file *f = NULL;
	bool written = false;
	int rc;

	pthread_mutex_lock(&a->mu);
	rc = plans_snapshot(a, job, run, &f);
	pthread_mutex_unlock(&a->mu);
	if (rc == -ENOENT)
		return 0; /* no plan of that run here any more */
	if (rc)
		return ipc_errf(err, rc, "out of memory");
	rc = store_put_plans(a->store, f, &written, err);
	if (!rc && written)
		log_msg(LOG_INFO,
		        "job %s: plans of node %s published (run %s, %zu ranks, digest %s)", job,
		        a->cfg.node, run, f->nranks, f->digest);
	/*
	 * The default run on many nodes: a restart under it fences nothing out.
	 * (Fewer ranks than the world alone may be ranks still arriving here.)
	 */
	if (!rc && written && strcmp(run, IPC_DEFAULT_RUN) == 0 && f->nranks < (size_t)f->world &&
	    other_nodes(a, job))
		log_msg(LOG_WARNING,
		        "job %s spans several nodes under the default run '%s': parts of a "
		        "restarted job's dead incarnation could join its checkpoints; give each "
		        "start its own CKPT_RUN (torchrun: $TORCHELASTIC_RUN_ID-"
		        "$TORCHELASTIC_RESTART_COUNT)",
		        job, run);
	plans_free(f);
	return rc;
}

/* A plans file that could not be put is tried again after this, doubled up to the poll's. */
#define PLANS_RETRY_NS 1000000000LL
#define PLANS_RETRY_MAX_NS 30000000000LL

static void publish_run(struct work *w)
{
	struct plans_pub *pub = container_of(w, struct plans_pub, work);
	struct agent *a = pub->a;
	char job[IPC_MAX_JOB + 1], run[IPC_MAX_JOB + 1], err[IPC_ERRLEN];
	const int64_t deadline = (int64_t)a->cfg.commit_deadline_s * 1000000000;
	int64_t now;
	bool put, ok = true, waiting;

	pthread_mutex_lock(&a->mu);
	put = pub->again || pub->retry_ns || !pub->polled; /* else a look at the others' alone */
	pub->again = false;
	snprintf(job, sizeof(job), "%s", pub->job);
	snprintf(run, sizeof(run), "%s", pub->run);
	pthread_mutex_unlock(&a->mu);
	if (put && (ok = plans_put(a, job, run, err) == 0) == false)
		log_msg(LOG_WARNING, "job %s: cannot publish this node's plans (tried again): %s",
		        job, err);
	if (ok) /* who writes which replica, as the plans say now */
		layouts_refresh(a, job, run, false);
	pthread_mutex_lock(&a->mu);
	park_release(a, false); /* saves waiting for this set */
	now = ipc_mono_ns();
	pub->polled = true;
	pub->retry_ns =
	    ok ? 0 : ipc_backoff_next(pub->retry_ns, PLANS_RETRY_NS, PLANS_RETRY_MAX_NS);
	waiting = ok && layouts_waiting(a, job, run);
	if (ok && !waiting)
		pub->wait_since = 0;
	if (pub->again) {
		workq_push(a->commit, &pub->work);
	} else if (a->stopping) {
		list_del(&pub->link);
		free(pub);
	} else if (!ok) {
		workq_push_at(a->commit, &pub->work, now + pub->retry_ns);
	} else if (waiting && (!pub->wait_since || now - pub->wait_since < deadline)) {
		/* the other nodes' plans are not all there: look again soon */
		pub->wait_since = pub->wait_since ? pub->wait_since : now;
		workq_push_at(a->commit, &pub->work,
		              now + (now - pub->wait_since < PLANS_POLL_FAST_FOR_NS
		                         ? PLANS_POLL_FAST_NS
		                         : PLANS_POLL_NS));
	} else if (layouts_rank0(a, job, run)) {
		/* rank 0's node: the set mark follows the other nodes' plans as they change */
		workq_push_at(a->commit, &pub->work, now + PLANS_POLL_NS);
	} else {
		list_del(&pub->link);
		free(pub);
	}
	pthread_mutex_unlock(&a->mu);
}

void plans_on_plan(struct agent *a, struct plan *p, bool dropped)
{
	if (!dropped)
		plans_publish(a, p->job, p->run);
}

void plans_on_root_back(struct agent *a)
{
	struct list *pos;

	list_for_each(pos, &a->plans)
	{
		struct plan *p = container_of(pos, struct plan, link);

		if (!p->dropped)
			plans_publish(a, p->job, p->run); /* written where they differ */
	}
}

void plans_publish(struct agent *a, const char *job, const char *run)
{
	struct plans_pub *pub;
	struct list *pos;

	list_for_each(pos, &a->pubs)
	{
		pub = container_of(pos, struct plans_pub, link);
		if (strcmp(pub->job, job) == 0) {
			snprintf(pub->run, sizeof(pub->run), "%s", run); /* the newest plan's */
			pub->again = true;
			/* a poll waiting for its time (or a failed put's back-off) runs now */
			workq_hurry(a->commit, &pub->work);
			return;
		}
	}
	pub = calloc(1, sizeof(*pub));
	if (!pub) {
		log_msg(LOG_ERR, "job %s: out of memory publishing plans", job);
		return;
	}
	pub->a = a;
	snprintf(pub->job, sizeof(pub->job), "%s", job);
	snprintf(pub->run, sizeof(pub->run), "%s", run);
	pub->work.fn = publish_run;
	list_add_tail(&a->pubs, &pub->link);
	workq_push(a->commit, &pub->work);
}
