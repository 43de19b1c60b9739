/*
 * Checkpoints in flight: (job, step) with one save per rank. When the last
 * rank is DURABLE the commit thread builds the manifest from the plans and
 * the checksums the I/O thread computed, and the storage makes it durable
 * (manifest, then LATEST). A checkpoint that fails takes every rank's save
 * with it, and once no rank is still writing, its step directory is removed
 * (on the commit thread): a failed checkpoint is never half visible.
 *
 * cp_* calls run under agent.mu on whatever thread; commit_run and
 * cleanup_run are the commit thread's jobs.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent.h"

static void commit_run(struct work *w);
static void cleanup_run(struct work *w);

int cp_get(struct agent *a, const char *job, int64_t step, int world, struct checkpoint **out,
	   char *err)
{
	struct checkpoint *cp;
	struct list *pos;

	list_for_each(pos, &a->ckpts)
	{
		cp = container_of(pos, struct checkpoint, link);
		if (cp->step == step && strcmp(cp->job, job) == 0) {
			if (cp->world != world)
				return ipc_errf(err, -EINVAL,
						"job %s step %lld is being saved with world %d, this "
						"plan says %d",
						job, (long long)step, cp->world, world);
			*out = cp;
			return 0;
		}
	}
	cp = calloc(1, sizeof(*cp));
	if (!cp || !(cp->rank = calloc((size_t)world, sizeof(*cp->rank)))) {
		free(cp);
		return ipc_errf(err, -ENOMEM, "out of memory");
	}
	cp->a = a;
	snprintf(cp->job, sizeof(cp->job), "%s", job);
	cp->step = step;
	cp->world = world;
	cp->state = CKPT__V1__STATE__STATE_QUEUED;
	cp->t_first = ipc_mono_ns();
	list_add_tail(&a->ckpts, &cp->link);
	*out = cp;
	return 0;
}

void cp_release(struct agent *a, struct checkpoint *cp)
{
	if (cp->state == CKPT__V1__STATE__STATE_QUEUED || cp->nrunning || cp->committing)
		return;
	if (cp->state == CKPT__V1__STATE__STATE_FAILED) {
		/* Kept while ranks may still arrive, so they learn it failed at once. */
		if (!cp->cleaned || (int)cp->nsaved < cp->world)
			return;
	}
	cp_free(a, cp);
	save_trim(a);
}

void cp_free(struct agent *a, struct checkpoint *cp)
{
	for (int r = 0; r < cp->world; r++)
		if (cp->rank[r])
			save_detach(a, cp->rank[r]);
	list_del(&cp->link);
	free(cp->rank);
	free(cp->meta);
	free(cp);
}

static void queue_cleanup(struct agent *a, struct checkpoint *cp)
{
	cp->cleaning = true;
	cp->work.fn = cleanup_run;
	workq_push(a->commit, &cp->work);
}

void cp_fail(struct agent *a, struct checkpoint *cp, const char *reason)
{
	char why[IPC_ERRLEN + 64];

	/* Every rank is durable and the commit is under way: it decides. */
	if (cp->state != CKPT__V1__STATE__STATE_QUEUED || cp->committing)
		return;
	cp->state = CKPT__V1__STATE__STATE_FAILED;
	snprintf(cp->reason, sizeof(cp->reason), "%s", reason);
	snprintf(why, sizeof(why), "checkpoint %s step %lld failed: %s", cp->job,
		 (long long)cp->step, reason);
	for (int r = 0; r < cp->world; r++) {
		struct save *s = cp->rank[r];

		if (!s)
			continue;
		atomic_store(&s->abort, true);
		save_set_state(a, s, CKPT__V1__STATE__STATE_FAILED, why);
	}
	pool_wake(a->pool);
	if (cp->nrunning == 0 && !cp->cleaning && !cp->cleaned)
		queue_cleanup(a, cp);
}

void cp_rank_durable(struct agent *a, struct checkpoint *cp)
{
	if (++cp->ndurable == (unsigned)cp->world && cp->state == CKPT__V1__STATE__STATE_QUEUED) {
		cp->committing = true;
		cp->work.fn = commit_run;
		workq_push(a->commit, &cp->work);
	}
}

void cp_rank_gone(struct agent *a, const char *job, int rank)
{
	struct list *pos, *tmp;
	char why[96];

	list_for_each_safe(pos, tmp, &a->ckpts)
	{
		struct checkpoint *cp = container_of(pos, struct checkpoint, link);

		if (cp->state != CKPT__V1__STATE__STATE_QUEUED || strcmp(cp->job, job) != 0 ||
		    rank >= cp->world || cp->rank[rank])
			continue;
		snprintf(why, sizeof(why), "rank %d left (its plan was dropped) before saving this "
					   "step", rank);
		cp_fail(a, cp, why);
	}
}

void cp_expire(struct agent *a, int64_t now)
{
	const int64_t limit = (int64_t)a->cfg.commit_deadline_s * 1000000000;
	struct list *pos, *tmp;
	char why[160];

	list_for_each_safe(pos, tmp, &a->ckpts)
	{
		struct checkpoint *cp = container_of(pos, struct checkpoint, link);

		if (cp->state != CKPT__V1__STATE__STATE_QUEUED || (int)cp->nsaved == cp->world ||
		    now - cp->t_first < limit)
			continue;
		snprintf(why, sizeof(why),
			 "%d of %d ranks did not save this step within %u s (--commit-deadline)",
			 cp->world - (int)cp->nsaved, cp->world, a->cfg.commit_deadline_s);
		cp_fail(a, cp, why);
	}
}

bool cp_any_busy(struct agent *a)
{
	struct list *pos;

	list_for_each(pos, &a->ckpts)
	{
		struct checkpoint *cp = container_of(pos, struct checkpoint, link);

		if (cp->nrunning || cp->committing || cp->cleaning)
			return true;
	}
	return false;
}

void cp_rank_stopped(struct agent *a, struct checkpoint *cp)
{
	if (--cp->nrunning)
		return;
	if (cp->state == CKPT__V1__STATE__STATE_FAILED && !cp->cleaning && !cp->cleaned)
		queue_cleanup(a, cp);
	else
		cp_release(a, cp);
}

/* ---- the manifest ----------------------------------------------------- */

struct entry {
	const struct plan_tensor *t;
	const struct save *s;
	size_t idx;
};

static int cmp_entry(const void *x, const void *y)
{
	const struct entry *a = x, *b = y;
	int c = strcmp(a->t->name, b->t->name);

	return c ? c : a->s->plan->rank - b->s->plan->rank;
}

/* One manifest tensor from entries e[0..n) (same name, ranks ascending). */
static int merge_tensor(struct manifest_tensor *mt, const struct entry *e, size_t n, char *err)
{
	const struct plan_tensor *t0 = e[0].t;

	mt->name = strdup(t0->name);
	mt->chunks = calloc(n, sizeof(*mt->chunks));
	if (!mt->name || !mt->chunks)
		return ipc_errf(err, -ENOMEM, "out of memory");
	mt->dtype = t0->dtype;
	mt->ndim = t0->ndim;
	mt->sharded = t0->sharded;
	memcpy(mt->global_shape, t0->global_shape, sizeof(mt->global_shape));
	for (size_t i = 0; i < n; i++) {
		const struct plan_tensor *t = e[i].t;
		struct manifest_chunk *ch = &mt->chunks[mt->nchunks++];

		if (i > 0 && (!t->sharded || !t0->sharded || t->dtype != t0->dtype ||
			      t->ndim != t0->ndim ||
			      memcmp(t->global_shape, t0->global_shape, t->ndim * sizeof(int64_t))))
			return ipc_errf(err, -EINVAL,
					"tensor '%s' is saved by ranks %d and %d, not as chunks of "
					"one sharded tensor",
					t->name, e[0].s->plan->rank, e[i].s->plan->rank);
		ch->rank = e[i].s->plan->rank;
		memcpy(ch->global_offset, t->global_offset, sizeof(ch->global_offset));
		memcpy(ch->shape, t->shape, sizeof(ch->shape));
		ch->begin = t->begin;
		ch->end = t->end;
		ch->xxh3 = e[i].s->digest[e[i].idx];
	}
	return 0;
}

static int fill_ranks(struct manifest *m, const struct checkpoint *cp, size_t *ntensors)
{
	m->ranks = calloc((size_t)cp->world, sizeof(*m->ranks));
	if (!m->ranks)
		return -ENOMEM;
	*ntensors = 0;
	for (int r = 0; r < cp->world; r++) {
		const struct save *s = cp->rank[r];
		char file[32];

		manifest_rank_file(r, file, sizeof(file));
		m->ranks[r].rank = r;
		m->ranks[r].file = strdup(file);
		if (!m->ranks[r].file)
			return -ENOMEM;
		m->nranks = (size_t)r + 1;
		m->ranks[r].size = s->plan->shard_bytes;
		m->ranks[r].header_bytes = s->plan->header_len;
		m->bytes += s->plan->shard_bytes;
		*ntensors += s->plan->n;
		if (s->t_captured - cp->t_first > m->capture_seconds * 1e9)
			m->capture_seconds = (double)(s->t_captured - cp->t_first) / 1e9;
		if (s->t_durable - cp->t_first > m->durable_seconds * 1e9)
			m->durable_seconds = (double)(s->t_durable - cp->t_first) / 1e9;
	}
	return 0;
}

/* Builds the manifest; no lock needed: the plans and checksums no longer change. */
static int build_manifest(const struct checkpoint *cp, struct manifest **out, char *err)
{
	struct manifest *m = calloc(1, sizeof(*m));
	struct entry *e = NULL;
	size_t ne = 0, total;
	int rc = -ENOMEM;

	if (!m || !(m->job = strdup(cp->job)) || (cp->meta && !(m->meta_json = strdup(cp->meta))) ||
	    fill_ranks(m, cp, &total) || !(e = calloc(total ? total : 1, sizeof(*e))) ||
	    !(m->tensors = calloc(total ? total : 1, sizeof(*m->tensors)))) {
		ipc_errf(err, rc, "out of memory for the manifest");
		goto out;
	}
	m->version = MANIFEST_VERSION;
	m->step = cp->step;
	m->world = cp->world;
	m->time_unix_ns = ipc_now_ns();
	for (int r = 0; r < cp->world; r++)
		for (size_t i = 0; i < cp->rank[r]->plan->n; i++)
			e[ne++] = (struct entry){&cp->rank[r]->plan->t[i], cp->rank[r], i};
	qsort(e, ne, sizeof(*e), cmp_entry);
	for (size_t i = 0, j; i < ne; i = j) {
		for (j = i + 1; j < ne && strcmp(e[j].t->name, e[i].t->name) == 0; j++)
			;
		rc = merge_tensor(&m->tensors[m->ntensors++], e + i, j - i, err);
		if (rc)
			goto out;
	}
	rc = manifest_check(m, err);
out:
	free(e);
	if (rc) {
		manifest_free(m);
		m = NULL;
	}
	*out = m;
	return rc;
}

/* Under mu: an older step of the job still missing ranks never will have them now. */
static void supersede(struct agent *a, const struct checkpoint *done)
{
	struct list *pos, *tmp;
	char why[128];

	list_for_each_safe(pos, tmp, &a->ckpts)
	{
		struct checkpoint *cp = container_of(pos, struct checkpoint, link);

		if (cp == done || strcmp(cp->job, done->job) != 0 || cp->step >= done->step)
			continue;
		if (cp->state == CKPT__V1__STATE__STATE_QUEUED && (int)cp->nsaved < cp->world) {
			snprintf(why, sizeof(why),
				 "step %lld committed while %d of %d ranks had not saved this one",
				 (long long)done->step, cp->world - (int)cp->nsaved, cp->world);
			cp_fail(a, cp, why);
		} else if (cp->state == CKPT__V1__STATE__STATE_FAILED) {
			cp->nsaved = (unsigned)cp->world; /* nobody else is coming */
			cp_release(a, cp);
		}
	}
}

static void commit_run(struct work *w)
{
	struct checkpoint *cp = container_of(w, struct checkpoint, work);
	struct agent *a = cp->a;
	char err[IPC_ERRLEN];
	struct manifest *m;
	struct cat_entry ce;
	int rc;

	rc = build_manifest(cp, &m, err);
	if (!rc) {
		m->commit_seconds = (double)(ipc_mono_ns() - cp->t_first) / 1e9;
		rc = storage_commit(a->store, m, err);
	}
	if (!rc)
		catalog_entry_from_manifest(m, &ce);
	pthread_mutex_lock(&a->mu);
	cp->committing = false;
	if (rc) {
		cp_fail(a, cp, err);
	} else if (cp->state == CKPT__V1__STATE__STATE_QUEUED) {
		ce.commit_seconds = (double)(ipc_mono_ns() - cp->t_first) / 1e9;
		catalog_add(a->cat, &ce);
		cp->state = CKPT__V1__STATE__STATE_COMMITTED;
		for (int r = 0; r < cp->world; r++)
			save_set_state(a, cp->rank[r], CKPT__V1__STATE__STATE_COMMITTED, NULL);
		log_msg(LOG_INFO,
			"committed job %s step %lld: %d ranks, %llu bytes, captured %.3f s, "
			"durable %.3f s, committed %.3f s",
			cp->job, (long long)cp->step, cp->world, (unsigned long long)ce.bytes,
			ce.capture_seconds, ce.durable_seconds, ce.commit_seconds);
		supersede(a, cp);
		/* Retention: older checkpoints of the job may go now (maint thread). */
		gc_queue(a, cp->job);
	}
	cp_release(a, cp);
	pthread_mutex_unlock(&a->mu);
	manifest_free(m);
}

static void cleanup_run(struct work *w)
{
	struct checkpoint *cp = container_of(w, struct checkpoint, work);
	struct agent *a = cp->a;
	char err[IPC_ERRLEN];
	int rc;

	/* Out of sight first (the backend renames before deleting): no half checkpoint. */
	rc = a->store->ops->remove(a->store, cp->job, cp->step, err);
	if (rc && rc != -ENOENT)
		log_msg(LOG_WARNING, "removing failed checkpoint %s step %lld: %s", cp->job,
			(long long)cp->step, err);
	pthread_mutex_lock(&a->mu);
	cp->cleaning = false;
	cp->cleaned = true;
	cp_release(a, cp);
	pthread_mutex_unlock(&a->mu);
}
