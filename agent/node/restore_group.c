/*
 * Read-once: the ranks of this node restoring one step together
 * (stream.h, restore_read_together), for restore.c.
 *
 * The usual restart: every rank of a node restores the same step at about
 * the same time, and replicas (or a resharded layout) need the same saved
 * chunks. Their reads are done together: the first restore of (job, step)
 * that needs another rank's file gathers the others (host-memory plans of
 * the job on this node) until all of them are in, or those whose restore
 * is on its way are in and GATHER_NS passes with nobody new, or
 * GATHER_MAX_NS in all; then, where a quarter or more of their bytes are
 * wanted by more than one of them, one reader reads the union of their
 * extents, each saved chunk once, and hands its bytes to every rank that
 * needs it. A rank with only its own file to read never waits, and ranks
 * that share little read alone, side by side (one reader for all would
 * copy on one thread what several copy at once). Any problem in it (a bad
 * chunk, a file missing, a fault of one trainer's memory), and each rank
 * reads alone, as before, with its own retries from other copies: the
 * group is an optimisation, never another way to fail. The gathering waits
 * on capture workers (elastic: a waiting job lets another worker take the
 * next restore); plan.gathered says a rank is past it (nobody waits for it).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/pipe/stream.h"
#include "ipc/base/log.h"

#define GATHER_NS 50000000LL /* 50 ms with nobody new */
#define GATHER_MAX_NS 500000000LL /* 500 ms in all */

struct rgroup {
	struct list link; /* agent.rgroups while it gathers */
	char job[IPC_MAX_JOB + 1];
	int64_t step;
	struct reader **r; /* the members' readers, their extents mapped */
	size_t n, cap, left; /* left: members not yet gone (the last frees it) */
	int64_t t_first, t_last;
	bool done, ok;
	pthread_cond_t cv; /* with agent.mu: a member joined; the read is done */
	uint64_t read;
};

/*
 * Under mu: this node's live host-memory plans of job (those that may
 * join); *coming: how many of them are restoring and not yet past the
 * gathering (on their way to a group).
 */
static size_t host_plans(struct agent *a, const char *job, size_t *coming)
{
	struct list *pos;
	size_t n = 0, r = 0;

	list_for_each(pos, &a->plans)
	{
		const struct plan *p = container_of(pos, struct plan, link);

		if (p->dropped || p->gpu || strcmp(p->job, job) != 0)
			continue;
		n++;
		r += p->restoring > 0 && !p->gathered;
	}
	if (coming)
		*coming = r;
	return n;
}

/* Under mu: the gathering group of (job, step), r in it; NULL if out of memory. */
static struct rgroup *group_join(struct agent *a, const char *job, int64_t step, struct reader *r,
                                 bool *leader)
{
	struct rgroup *g = NULL;
	struct list *pos;
	pthread_condattr_t ca;

	list_for_each(pos, &a->rgroups)
	{
		struct rgroup *x = container_of(pos, struct rgroup, link);

		if (x->step == step && strcmp(x->job, job) == 0)
			g = x;
	}
	*leader = !g;
	if (!g) {
		if (!(g = calloc(1, sizeof(*g))))
			return NULL;
		snprintf(g->job, sizeof(g->job), "%s", job);
		g->step = step;
		g->t_first = ipc_mono_ns();
		pthread_condattr_init(&ca);
		pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
		pthread_cond_init(&g->cv, &ca);
		pthread_condattr_destroy(&ca);
		list_add_tail(&a->rgroups, &g->link);
	}
	if (g->n == g->cap) {
		size_t cap = g->cap ? 2 * g->cap : 8;
		struct reader **v = realloc(g->r, cap * sizeof(*v));

		if (!v) {
			if (*leader) {
				list_del(&g->link);
				pthread_cond_destroy(&g->cv);
				free(g);
			}
			return NULL;
		}
		g->r = v;
		g->cap = cap;
	}
	g->r[g->n++] = r;
	g->left++;
	g->t_last = ipc_mono_ns();
	pthread_cond_broadcast(&g->cv);
	return g;
}

/* Under mu, the leader: until every host plan of the job is in, or the time is up. */
static void group_gather(struct agent *a, struct rgroup *g)
{
	for (;;) {
		const int64_t now = ipc_mono_ns(), cap = g->t_first + GATHER_MAX_NS;
		size_t coming, live = host_plans(a, g->job, &coming);
		struct timespec ts;
		int64_t until;

		/*
		 * Ranks whose restore was asked for are on their way: wait for them
		 * (to the cap). The others may ask soon: GATHER_NS from the last join.
		 */
		until = coming ? cap : g->t_last + GATHER_NS;
		until = until < cap ? until : cap;
		if (g->n >= live || now >= until)
			break;
		ts.tv_sec = (time_t)(until / 1000000000);
		ts.tv_nsec = (long)(until % 1000000000);
		pthread_cond_timedwait(&g->cv, &a->mu, &ts);
	}
	list_del(&g->link); /* closed: a restore that comes now starts a group of its own */
}

/*
 * The leader, no lock: the union of the members' extents, each chunk read
 * once. 1: done; 0: not worth it (they share little: each reads alone, side
 * by side, as fast); -1: a problem (each reads alone).
 */
static int group_read(struct agent *a, struct rgroup *g, const struct manifest *m)
{
	struct reader c;
	char err[IPC_ERRLEN] = "out of memory";
	uint64_t shared, all;
	size_t n = 0;
	bool ok;
	int rc;

	for (size_t i = 0; i < g->n; i++)
		n += g->r[i]->n;
	rc = reader_init(&c, a, g->job, g->step, n);
	c.q = a->capture;
	for (size_t i = 0; !rc && i < g->n; i++) {
		memcpy(c.ext + c.n, g->r[i]->ext, g->r[i]->n * sizeof(*c.ext));
		c.n += g->r[i]->n;
	}
	/* worth it where a quarter or more of the bytes are wanted by more than one */
	if (!rc && ((shared = reader_shared(&c, &all)) == 0 || shared < all / 4)) {
		reader_free(&c);
		return 0;
	}
	if (!rc)
		rc = reader_run(&c, m, READ_AHEAD);
	ok = !rc && !c.err;
	if (!rc && c.err)
		snprintf(err, sizeof(err), "%s", c.problems ? c.problems[0] : "read failed");
	else if (rc)
		snprintf(err, sizeof(err), "%s", strerror(-rc));
	g->read = c.bytes;
	if (ok)
		log_msg(LOG_INFO,
		        "job %s step %lld: %zu ranks of this node restored together: %llu bytes "
		        "read for %llu delivered",
		        g->job, (long long)g->step, g->n, (unsigned long long)c.bytes,
		        (unsigned long long)c.delivered);
	else
		log_msg(LOG_WARNING,
		        "job %s step %lld: %zu ranks restoring together: %s; each reads alone",
		        g->job, (long long)g->step, g->n, err);
	reader_free(&c);
	return ok ? 1 : -1;
}

bool restore_read_together(struct agent *a, struct plan *plan, struct reader *r, int64_t step,
                           const struct manifest *m, struct together *t)
{
	struct rgroup *g = NULL;
	bool leader = false, foreign = false, ok;
	uint64_t mine = 0;

	for (size_t i = 0; i < r->n; i++) {
		mine += r->ext[i].end - r->ext[i].begin;
		foreign = foreign || r->ext[i].rank != plan->rank;
	}
	workq_wait_begin(a->capture);
	pthread_mutex_lock(&a->mu);
	plan->gathered = true; /* in a group now, or reading alone: nobody waits for it */
	/* only its own file to read: what others need of it they read themselves */
	if (foreign && host_plans(a, plan->job, NULL) > 1)
		g = group_join(a, plan->job, step, r, &leader);
	if (g && leader) {
		group_gather(a, g);
		pthread_mutex_unlock(&a->mu);
		workq_wait_end(a->capture);
		ok = g->n > 1 && group_read(a, g, m) == 1;
		workq_wait_begin(a->capture);
		pthread_mutex_lock(&a->mu);
		g->ok = ok;
		g->done = true;
		pthread_cond_broadcast(&g->cv);
	}
	while (g && !g->done)
		pthread_cond_wait(&g->cv, &a->mu);
	ok = g && g->ok;
	t->read = g && leader ? g->read : 0; /* read, even where the group then failed */
	t->delivered = ok ? mine : 0;
	t->n = ok ? g->n : 0;
	if (g && --g->left == 0) {
		pthread_cond_destroy(&g->cv);
		free(g->r);
		free(g);
	}
	pthread_mutex_unlock(&a->mu);
	workq_wait_end(a->capture);
	if (!ok) /* read alone: its runs copied from the first */
		for (size_t i = 0; i < r->n; i++)
			if (r->ext[i].box)
				r->ext[i].box->next = 0;
	return ok;
}
