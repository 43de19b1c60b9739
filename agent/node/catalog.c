/*
 * The catalog: every committed checkpoint the agent knows, as a sorted array
 * of (job, step). Loaded from the disk at start (each manifest read back and
 * checked), then kept in step with commits and deletes. A committed step
 * that cannot be restored whole (its manifest unreadable; at start, a step
 * newer than LATEST whose files are not what its manifest says; later, what
 * a restore or verify met) stays listed, marked damaged with why: it is
 * never taken for a step that is not there. Pointers into it are only
 * valid under agent.mu until the next change.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/node/node.h"
#include "agent/node/owners.h"
#include "agent/node/checkpoint.h"
#include "agent/node/catalog.h"
#include "ipc/ipc.h"
#include "ipc/base/log.h"

struct catalog {
	struct cat_entry *v;
	size_t n, cap;
};

int catalog_create(struct catalog **out)
{
	*out = calloc(1, sizeof(**out));
	return *out ? 0 : -ENOMEM;
}

void catalog_destroy(struct catalog *c)
{
	if (c) {
		free(c->v);
		free(c);
	}
}

static int cmp_key(const char *job, int64_t step, const struct cat_entry *e)
{
	int r = strcmp(job, e->job);

	if (r)
		return r;
	return step < e->step ? -1 : step > e->step;
}

/* Index of the first entry >= (job, step). */
static size_t lower_bound(const struct catalog *c, const char *job, int64_t step)
{
	size_t lo = 0, hi = c->n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (cmp_key(job, step, &c->v[mid]) > 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

int catalog_add(struct catalog *c, const struct cat_entry *e)
{
	size_t i = lower_bound(c, e->job, e->step);

	if (i < c->n && cmp_key(e->job, e->step, &c->v[i]) == 0) {
		c->v[i] = *e;
		return 0;
	}
	if (c->n == c->cap) {
		size_t cap = c->cap ? c->cap * 2 : 64;
		struct cat_entry *v = realloc(c->v, cap * sizeof(*v));

		if (!v)
			return -ENOMEM;
		c->v = v;
		c->cap = cap;
	}
	memmove(&c->v[i + 1], &c->v[i], (c->n - i) * sizeof(*c->v));
	c->v[i] = *e;
	c->n++;
	return 0;
}

size_t catalog_drop_unread(struct catalog *c)
{
	size_t k = 0, n = c->n;

	for (size_t i = 0; i < c->n; i++)
		if (c->v[i].readers)
			c->v[k++] = c->v[i];
	c->n = k;
	return n - k;
}

struct cat_entry *catalog_find(struct catalog *c, const char *job, int64_t step)
{
	size_t i = lower_bound(c, job, step);

	return i < c->n && cmp_key(job, step, &c->v[i]) == 0 ? &c->v[i] : NULL;
}

struct cat_entry *catalog_newest(struct catalog *c, const char *job, int64_t below)
{
	size_t i = lower_bound(c, job, below);

	if (i == 0 || strcmp(c->v[i - 1].job, job) != 0)
		return NULL;
	return &c->v[i - 1];
}

struct cat_entry *catalog_newest_whole(struct catalog *c, const char *job, int64_t below)
{
	struct cat_entry *e;

	while ((e = catalog_newest(c, job, below)) && e->damage[0])
		below = e->step;
	return e;
}

bool catalog_set_damage(struct catalog *c, const char *job, int64_t step, const char *why)
{
	struct cat_entry *e = catalog_find(c, job, step);

	if (!e)
		return false;
	snprintf(e->damage, sizeof(e->damage), "%s", why ? why : "");
	return true;
}

size_t catalog_damaged(const struct catalog *c)
{
	size_t n = 0;

	for (size_t i = 0; i < c->n; i++)
		n += c->v[i].damage[0] != '\0';
	return n;
}

void catalog_remove(struct catalog *c, const char *job, int64_t step)
{
	struct cat_entry *e = catalog_find(c, job, step);

	if (e) {
		size_t i = (size_t)(e - c->v);

		memmove(&c->v[i], &c->v[i + 1], (c->n - i - 1) * sizeof(*c->v));
		c->n--;
	}
}

size_t catalog_list(struct catalog *c, const char *job, struct cat_entry ***out)
{
	size_t n = 0;

	*out = calloc(c->n ? c->n : 1, sizeof(**out));
	if (!*out)
		return 0;
	for (size_t i = 0; i < c->n; i++)
		if (!job || strcmp(job, c->v[i].job) == 0)
			(*out)[n++] = &c->v[i];
	return n;
}

void catalog_entry_from_manifest(const struct manifest *m, struct cat_entry *e)
{
	memset(e, 0, sizeof(*e));
	snprintf(e->job, sizeof(e->job), "%s", m->job);
	e->step = m->step;
	e->world = m->world;
	e->bytes = m->bytes;
	e->time_unix_ns = m->time_unix_ns;
	e->tensors = (uint32_t)manifest_tensor_count(m);
	e->capture_seconds = m->capture_seconds;
	e->durable_seconds = m->durable_seconds;
	e->commit_seconds = m->commit_seconds;
	snprintf(e->run, sizeof(e->run), "%s", m->run);
	e->nparts = (uint32_t)m->nparts;
}

/*
 * The entry of a committed step the root lists, from its manifest: 0; a
 * manifest there that cannot be read makes an entry that says so (1);
 * -ENOENT: gone meanwhile (removed), no entry.
 */
static int entry_from_root(struct storage *s, const char *job, const struct storage_step *st,
                           struct cat_entry *e)
{
	char err[IPC_ERRLEN];
	struct manifest *m;
	int rc = store_read_manifest_head(s, job, st->step, &m, err);

	if (rc == -ENOENT)
		return rc;
	if (rc) { /* there, but no checkpoint can be read from it: damaged, not absent */
		memset(e, 0, sizeof(*e));
		snprintf(e->job, sizeof(e->job), "%s", job);
		e->step = st->step;
		snprintf(e->damage, sizeof(e->damage), "its manifest cannot be read: %s", err);
		e->unreadable = true;
		e->pinned = st->pinned;
		log_msg(LOG_WARNING, "job %s step %lld is damaged: %s", job, (long long)st->step,
		        e->damage);
		return 1;
	}
	catalog_entry_from_manifest(m, e);
	manifest_free(m);
	e->pinned = st->pinned; /* pins live on disk: they survive restarts */
	return 0;
}

/*
 * At start: a step newer than LATEST (a commit whose LATEST a crash cut
 * short, or a manifest planted there) is whole only if its files are what
 * its manifest says (store_step_intact: a small read of each file's head).
 * Older steps were named LATEST once, when their files were checked.
 */
static void check_newer(struct storage *s, const char *job, int64_t latest, struct cat_entry *e)
{
	char why[IPC_ERRLEN];

	if (e->damage[0] || e->step <= latest ||
	    store_step_intact(s, job, e->step, why) != -EBADMSG)
		return;
	snprintf(e->damage, sizeof(e->damage), "%s", why);
	log_msg(LOG_WARNING, "job %s step %lld (newer than LATEST) is damaged: %s", job,
	        (long long)e->step, why);
}

static void load_job(struct catalog *c, struct storage *s, const char *job)
{
	struct storage_step *steps = NULL;
	char err[IPC_ERRLEN];
	int64_t latest = -1;
	size_t n = 0;

	if (s->ops->list_steps(s, job, &steps, &n, err)) {
		log_msg(LOG_WARNING, "job %s: %s", job, err);
		return;
	}
	if (store_latest_get(s, job, &latest, err))
		latest = -1;
	for (size_t i = 0; i < n; i++) {
		struct cat_entry e;

		if (!steps[i].committed || entry_from_root(s, job, &steps[i], &e) < 0)
			continue;
		check_newer(s, job, latest, &e);
		if (catalog_add(c, &e))
			log_msg(LOG_ERR, "out of memory listing job %s", job);
	}
	free(steps);
}

/*
 * Under mu: a step of job this node saves and has not seen committed (its
 * commit under way, or FAILED and not yet let go), or one it told FAILED
 * though its manifest is there: what the root holds of it is not listed
 * here (until its trainers here were told; until a restart).
 */
static bool in_flight_here(struct agent *a, const char *job, int64_t step)
{
	struct list *pos;

	for (unsigned i = 0; i < a->nunlisted && i < AGENT_UNLISTED; i++)
		if (a->unlisted[i].step == step && strcmp(a->unlisted[i].job, job) == 0)
			return true; /* told FAILED here, its manifest visible (node.h: unlisted) */
	list_for_each(pos, &a->ckpts)
	{
		const struct checkpoint *cp = container_of(pos, struct checkpoint, link);

		if (cp->step == step && cp->state != SAVE_COMMITTED && strcmp(cp->job, job) == 0)
			return true;
	}
	return false;
}

void catalog_sync_job(struct agent *a, const char *job)
{
	struct storage_step *steps = NULL;
	struct cat_entry **e = NULL, *e1, add;
	char err[IPC_ERRLEN];
	size_t n = 0, ne, ngone = 0;
	int64_t *gone;
	int rc;

	if (owner_load(a, job, err))
		log_msg(LOG_WARNING, "job %s: %s", job, err);
	rc = a->store->ops->list_steps(a->store, job, &steps, &n, err);
	if (rc && rc != -ENOENT) { /* -ENOENT: the job's directory is gone, and its steps */
		log_msg(LOG_WARNING, "job %s: %s", job, err);
		return;
	}
	/*
	 * Gone from the root (another node's retention removed it): gone from
	 * here. Pinned or unpinned through another node's agent: so here.
	 */
	pthread_mutex_lock(&a->mu);
	ne = catalog_list(a->cat, job, &e);
	gone = calloc(ne + 1, sizeof(*gone));
	for (size_t i = ne; gone && i-- > 0;) {
		const struct storage_step *there = NULL;

		for (size_t j = 0; j < n && !there; j++)
			if (steps[j].committed && steps[j].step == e[i]->step)
				there = &steps[j];
		if (there)
			e[i]->pinned = there->pinned;
		else if (!e[i]->readers)
			gone[ngone++] = e[i]->step;
	}
	free(e);
	pthread_mutex_unlock(&a->mu);
	/*
	 * Not in the listing: gone, or committed here since it was taken (this
	 * agent's commit thread does not wait for us). Its manifest says which.
	 */
	for (size_t i = 0; i < ngone; i++) {
		if (store_committed(a->store, job, gone[i]))
			continue;
		pthread_mutex_lock(&a->mu);
		e1 = catalog_find(a->cat, job, gone[i]);
		if (e1 && !e1->readers)
			catalog_remove(a->cat, job, gone[i]);
		pthread_mutex_unlock(&a->mu);
	}
	free(gone);
	/*
	 * Committed by another node and not known here yet: read its manifest.
	 * One whose manifest could not be read: again (an NFS hiccup passes).
	 */
	for (size_t j = 0; j < n; j++) {
		bool known;

		if (!steps[j].committed)
			continue;
		pthread_mutex_lock(&a->mu);
		e1 = catalog_find(a->cat, job, steps[j].step);
		known = e1 && !e1->unreadable;
		pthread_mutex_unlock(&a->mu);
		if (known || entry_from_root(a->store, job, &steps[j], &add) < 0)
			continue;
		pthread_mutex_lock(&a->mu);
		e1 = catalog_find(a->cat, job, steps[j].step);
		if (in_flight_here(a, job, steps[j].step)) {
			/* its trainers here hear how it ends (FAILED, say): not listed before */
		} else if (!e1 || (e1->unreadable && !add.unreadable)) {
			if (e1)
				add.readers = e1->readers;
			catalog_add(a->cat, &add);
		}
		pthread_mutex_unlock(&a->mu);
	}
	free(steps);
}

/*
 * The jobs the catalog lists and those the root holds, each named once
 * (malloc'd array of malloc'd names; an entry may be NULL where out of
 * memory); their number.
 */
static size_t catalog_jobs(struct agent *a, char ***out)
{
	char **listed = NULL, **v, err[IPC_ERRLEN];
	struct cat_entry **e = NULL;
	size_t nl = 0, ne, n = 0;

	if (a->store->ops->list_jobs(a->store, &listed, &nl, err))
		log_msg(LOG_WARNING, "the root's jobs cannot be listed: %s", err);
	pthread_mutex_lock(&a->mu);
	ne = catalog_list(a->cat, NULL, &e);
	v = calloc(nl + ne + 1, sizeof(*v));
	for (size_t i = 0; v && i < ne; i++)
		if (n == 0 || strcmp(v[n - 1], e[i]->job)) /* the catalog is sorted by job */
			v[n++] = strdup(e[i]->job);
	pthread_mutex_unlock(&a->mu);
	free(e);
	for (size_t i = 0; i < nl; i++) {
		bool known = false;

		for (size_t j = 0; v && j < n && !known; j++)
			known = v[j] && strcmp(v[j], listed[i]) == 0;
		if (v && !known)
			v[n++] = listed[i];
		else
			free(listed[i]);
	}
	free(listed);
	*out = v;
	return v ? n : 0;
}

void catalog_sync_all(struct agent *a)
{
	char **jobs;
	size_t n = catalog_jobs(a, &jobs);

	for (size_t i = 0; i < n; i++) {
		if (jobs[i])
			catalog_sync_job(a, jobs[i]);
		free(jobs[i]);
	}
	free(jobs);
}

int catalog_load(struct catalog *c, struct storage *s, char *err)
{
	char **jobs = NULL;
	size_t n = 0;
	int rc;

	rc = s->ops->list_jobs(s, &jobs, &n, err);
	if (rc)
		return rc;
	for (size_t i = 0; i < n; i++) {
		load_job(c, s, jobs[i]);
		free(jobs[i]);
	}
	free(jobs);
	return 0;
}
