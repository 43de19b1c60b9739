/*
 * Checkpoints in flight on this node: (job, step), with the saves of this
 * node's ranks. Once all of them are DURABLE, the commit thread publishes
 * the node's plans (if they changed), writes its part, and runs the
 * many-nodes commit (commit/commit.h), polling with back-off until the
 * manifest is there (COMMITTED) or the deadline passed (FAILED). A
 * checkpoint that fails takes every rank's save with it; where this node's
 * part was never written, its shard files go (nothing can name them), else
 * they stay for a commit that may still use them.
 *
 * Each job's plans file is publish.c's, `ckptctl commit --finish`
 * checkpoint_rpc.c's.
 *
 * cp_* run under agent.mu on whatever thread; commit_work and cleanup_run
 * are the commit thread's jobs, and only the commit thread's jobs touch
 * the committer and cp->commit.
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
#include "agent/node/checkpoint.h"
#include "agent/node/save.h"
#include "agent/node/catalog.h"
#include "agent/rpc/ops.h"
#include "agent/daemon/metrics.h"
#include "ipc/base/log.h"

static void commit_work(struct work *w);
static void cleanup_run(struct work *w);

int cp_get(struct agent *a, const char *job, int64_t step, int world, const char *run,
           struct checkpoint **out, char *err)
{
	struct checkpoint *cp;
	struct list *pos;

	list_for_each(pos, &a->ckpts)
	{
		cp = container_of(pos, struct checkpoint, link);
		/*
		 * Another run's save of the step (a run that died) goes its own
		 * way; a retired failure waits for nobody: a save now starts anew.
		 */
		if (cp->step == step && strcmp(cp->job, job) == 0 && strcmp(cp->run, run) == 0 &&
		    !cp->retired) {
			if (cp->world != world)
				return ipc_errf(
				    err, -EINVAL,
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
	snprintf(cp->run, sizeof(cp->run), "%s", run);
	cp->step = step;
	cp->world = world;
	cp->state = SAVE_QUEUED;
	cp->t_first = ipc_mono_ns();
	list_add_tail(&a->ckpts, &cp->link);
	a->nckpts++;
	*out = cp;
	return 0;
}

static void free_texts(char ***v, size_t *n)
{
	for (size_t i = 0; i < *n; i++)
		free((*v)[i]);
	free(*v);
	*v = NULL;
	*n = 0;
}

static bool local_all_saved(struct agent *a, const struct checkpoint *cp);

void cp_release(struct agent *a, struct checkpoint *cp)
{
	if (cp->state == SAVE_QUEUED || cp->nrunning || cp->committing)
		return;
	if (cp->state == SAVE_FAILED) {
		/*
		 * Kept while this node's ranks may still arrive, so they learn it
		 * failed at once; not past its deadline (cp_expire): a rank that
		 * never comes must not keep it, and its saves, for ever.
		 */
		if (!cp->cleaned || (!cp->retired && !local_all_saved(a, cp)))
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
	a->nckpts--;
	commit_destroy(cp->commit); /* memory only: no I/O under the lock */
	free_texts(&cp->parts_done, &cp->nparts_done);
	free_texts(&cp->parts_missing, &cp->nparts_missing);
	free(cp->rank);
	free(cp);
}

static void queue_cleanup(struct agent *a, struct checkpoint *cp)
{
	cp->cleaning = true;
	cp->work.fn = cleanup_run;
	workq_push(a->commit, &cp->work);
}

/* Under mu: FAILED, every rank's save with it; this node's files go once nothing runs. */
static void fail_now(struct agent *a, struct checkpoint *cp, const char *reason)
{
	char why[IPC_ERRLEN + 64];

	cp->state = SAVE_FAILED;
	snprintf(cp->reason, sizeof(cp->reason), "%s", reason);
	snprintf(why, sizeof(why), "checkpoint %s step %lld failed: %s", cp->job,
	         (long long)cp->step, reason);
	for (int r = 0; r < cp->world; r++) {
		struct save *s = cp->rank[r];

		if (!s)
			continue;
		atomic_store(&s->abort, true);
		save_set_state(a, s, SAVE_FAILED, why);
	}
	pool_wake(a->pool);
	if (cp->nrunning == 0 && !cp->cleaning && !cp->cleaned)
		queue_cleanup(a, cp);
}

void cp_fail(struct agent *a, struct checkpoint *cp, const char *reason)
{
	if (cp->state != SAVE_QUEUED)
		return;
	/* The commit is under way: it decides, and stops at its next poll. */
	if (cp->committing) {
		if (!cp->abort[0])
			snprintf(cp->abort, sizeof(cp->abort), "%s", reason);
		return;
	}
	fail_now(a, cp, reason);
}

/* Under mu: every live plan of the job's run on this node has saved this step. */
static bool local_all_saved(struct agent *a, const struct checkpoint *cp)
{
	struct list *pos;

	list_for_each(pos, &a->plans)
	{
		const struct plan *p = container_of(pos, struct plan, link);

		if (strcmp(p->job, cp->job) == 0 && strcmp(p->run, cp->run) == 0 &&
		    p->rank < cp->world && !cp->rank[p->rank])
			return false;
	}
	return true;
}

/* Under mu: every live plan of the job's run on this node has saved, and all are durable. */
static bool local_complete(struct agent *a, const struct checkpoint *cp)
{
	if (cp->nsaved == 0 || cp->ndurable != cp->nsaved)
		return false;
	return local_all_saved(a, cp);
}

void cp_rank_durable(struct agent *a, struct checkpoint *cp)
{
	cp->ndurable++;
	if (cp->state == SAVE_QUEUED && !cp->committing && local_complete(a, cp)) {
		cp->committing = true;
		cp->work.fn = commit_work;
		workq_push(a->commit, &cp->work);
	}
}

void cp_rank_gone(struct agent *a, const char *job, const char *run, int rank)
{
	struct list *pos, *tmp;
	char why[96];

	list_for_each_safe(pos, tmp, &a->ckpts)
	{
		struct checkpoint *cp = container_of(pos, struct checkpoint, link);

		if (strcmp(cp->job, job) != 0 || strcmp(cp->run, run) != 0)
			continue;
		/* failed, and waiting for this node's ranks: one fewer to wait for */
		if (cp->state == SAVE_FAILED) {
			cp_release(a, cp);
			continue;
		}
		if (cp->state != SAVE_QUEUED || rank >= cp->world || cp->rank[rank] ||
		    cp->part_built)
			continue;
		snprintf(why, sizeof(why),
		         "rank %d left (its plan was dropped) before saving this "
		         "step",
		         rank);
		cp_fail(a, cp, why);
	}
}

/* This node's ranks of the job's run that have not saved cp's step, as "1,3". */
static void unsaved(struct agent *a, const struct checkpoint *cp, char *buf, size_t len)
{
	int v[64];
	size_t n = 0;
	struct list *pos;

	list_for_each(pos, &a->plans)
	{
		const struct plan *p = container_of(pos, struct plan, link);

		if (n < 64 && strcmp(p->job, cp->job) == 0 && strcmp(p->run, cp->run) == 0 &&
		    p->rank < cp->world && !cp->rank[p->rank])
			v[n++] = p->rank;
	}
	for (size_t i = 1; i < n; i++) /* a few: insertion sort */
		for (size_t j = i; j > 0 && v[j - 1] > v[j]; j--) {
			int t = v[j];

			v[j] = v[j - 1];
			v[j - 1] = t;
		}
	part_ranks_text(v, n, buf, len);
}

void cp_expire(struct agent *a, int64_t now)
{
	const int64_t limit = (int64_t)a->cfg.commit_deadline_s * 1000000000;
	struct list *pos, *tmp;
	char why[IPC_ERRLEN], ranks[128];

	list_for_each_safe(pos, tmp, &a->ckpts)
	{
		struct checkpoint *cp = container_of(pos, struct checkpoint, link);

		if (now - cp->t_first < limit)
			continue;
		/* Failed, and its ranks had their time: those still missing are not waited for. */
		if (cp->state == SAVE_FAILED && !cp->retired) {
			cp->retired = true;
			cp_release(a, cp);
			continue;
		}
		/*
		 * A rank of this node that never saved the step. (Saves that are
		 * only slow are waited for; once committing, the commit's own
		 * deadline for the other nodes' parts applies.)
		 */
		if (cp->state != SAVE_QUEUED || cp->committing)
			continue;
		unsaved(a, cp, ranks, sizeof(ranks));
		if (!ranks[0])
			continue;
		snprintf(
		    why, sizeof(why),
		    "step %lld: no save from rank%s %s on node %s within %u s (--commit-deadline)",
		    (long long)cp->step, strchr(ranks, ',') || strchr(ranks, '-') ? "s" : "", ranks,
		    a->cfg.node, a->cfg.commit_deadline_s);
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
	if (cp->state == SAVE_FAILED && !cp->cleaning && !cp->cleaned)
		queue_cleanup(a, cp);
	else
		cp_release(a, cp);
}

/* Under mu (save.tell): what a save of cp's tells it. */
static void cp_on_rank(struct agent *a, struct save *s, enum save_news what, const char *why)
{
	switch (what) {
	case SAVE_NEWS_FAILED:
		cp_fail(a, s->cp, why);
		break;
	case SAVE_NEWS_SKIPPED:
		cp_fail(a, s->cp, "a rank was SKIPPED (staging pool full)");
		break;
	case SAVE_NEWS_DURABLE:
		cp_rank_durable(a, s->cp);
		break;
	case SAVE_NEWS_STOPPED:
		cp_rank_stopped(a, s->cp);
		break;
	}
}

void cp_join(struct agent *a, struct checkpoint *cp, struct save *s)
{
	(void)a;
	s->cp = cp;
	s->tell = cp_on_rank;
	cp->rank[s->rank] = s;
	cp->nsaved++;
}

void cp_on_plan(struct agent *a, struct plan *p, bool dropped)
{
	struct list *pos;
	bool aborted = false;

	if (!dropped)
		return;
	/* Saves not yet CAPTURED lose their source: abort them. Later ones go on. */
	list_for_each(pos, &a->saves)
	{
		struct save *s = container_of(pos, struct save, link);

		if (s->plan == p && s->state == SAVE_QUEUED) {
			atomic_store(&s->abort, true);
			cp_fail(
			    a, s->cp,
			    "the plan was dropped (trainer gone?) before its save was CAPTURED");
			aborted = true;
		}
	}
	if (aborted)
		pool_wake(a->pool);
	/* Steps other ranks saved that this one had not: they can never commit now. */
	cp_rank_gone(a, p->job, p->run, p->rank);
}

/* ---- this node's part ---------------------------------------------------- */

static int cmp_tensor(const void *x, const void *y)
{
	return strcmp(((const struct manifest_tensor *)x)->name,
	              ((const struct manifest_tensor *)y)->name);
}

static int part_rank_of(struct part_rank *k, const struct save *s)
{
	const struct plan *p = s->plan;
	const struct shard_layout *l = s->lay;

	k->rank = p->rank;
	k->file = strdup(s->file);
	k->size = l->shard_bytes;
	k->header_bytes = l->header_len;
	k->meta_json = s->meta ? strdup(s->meta) : NULL;
	k->save = s->stamp.save; /* what its file's header says: the committer checks */
	k->queued_unix_ns = s->queued_unix_ns;
	k->captured_unix_ns = s->queued_unix_ns + (s->t_captured - s->t_queued);
	k->durable_unix_ns = s->queued_unix_ns + (s->t_durable - s->t_queued);
	k->tensors = calloc(l->n + 1, sizeof(*k->tensors));
	if (!k->file || (s->meta && !k->meta_json) || !k->tensors)
		return -ENOMEM;
	for (size_t i = 0; i < l->n; i++) {
		struct manifest_tensor *mt =
		    &k->tensors[k->ntensors++]; /* freed with k, half made */

		if (plan_tensor_entry(mt, &l->t[i], p->rank))
			return -ENOMEM;
		mt->chunks[0].begin = l->t[i].begin;
		mt->chunks[0].end = l->t[i].end;
		mt->chunks[0].xxh3 = s->digest[i];
	}
	qsort(k->tensors, k->ntensors, sizeof(*k->tensors), cmp_tensor);
	if (l == &p->whole)
		return 0;
	/* it wrote less than it holds: what it holds (its plan) is said too */
	if (plan_holds(p, &k->holds, &k->nholds))
		return -ENOMEM;
	qsort(k->holds, k->nholds, sizeof(*k->holds), cmp_tensor);
	return 0;
}

/*
 * This node's part from its saves v[0..n) (ascending ranks). No lock: a
 * durable save's plan, file and checksums no longer change.
 */
static int build_part(struct agent *a, const struct checkpoint *cp, struct save **v, size_t n,
                      struct part **out, char *err)
{
	struct part *p = calloc(1, sizeof(*p));
	int rc = 0;

	*out = NULL;
	if (!p || !(p->ranks = calloc(n, sizeof(*p->ranks))) || !(p->job = strdup(cp->job)) ||
	    !(p->run = strdup(cp->run)) || !(p->node = strdup(a->cfg.node)))
		rc = -ENOMEM;
	for (size_t i = 0; !rc && i < n; i++)
		rc = part_rank_of(&p->ranks[p->nranks++], v[i]); /* freed with p, half made */
	if (rc) {
		part_free(p);
		return ipc_errf(err, rc, "out of memory for the part");
	}
	p->version = 1; /* 2 where a rank says what it holds */
	for (size_t i = 0; i < p->nranks; i++)
		if (p->ranks[i].holds)
			p->version = PART_VERSION;
	p->step = cp->step;
	p->world = cp->world;
	p->time_unix_ns = ipc_now_ns();
	*out = p;
	return 0;
}

/* Commit thread: the plans file, the part, the commit's state machine. */
static int start_commit(struct agent *a, struct checkpoint *cp, struct save **v, size_t n,
                        char *why)
{
	struct part *p = NULL;
	char err[IPC_ERRLEN];
	int rc;

	/* Before the part: the other nodes learn from it which ranks to expect here. */
	rc = plans_put(a, cp->job, cp->run, err);
	if (rc)
		return ipc_errf(why, rc, "publishing this node's plans: %s", err);
	/* A damaged step this save replaces: uncommitted first, or its manifest stands */
	if (cp->replaces_damaged &&
	    (rc = store_retire_manifest(a->store, cp->job, cp->step, a->cfg.node, err)))
		return ipc_errf(why, rc, "retiring the damaged step's manifest: %s", err);
	if (cp->replaces_damaged)
		log_msg(LOG_WARNING,
		        "job %s step %lld: the damaged checkpoint's manifest is set aside "
		        "(manifest.damaged.%s.*.json): this save commits the step anew",
		        cp->job, (long long)cp->step, a->cfg.node);
	rc = build_part(a, cp, v, n, &p, why);
	if (!rc)
		rc = commit_create(a->cm, p, v[0]->rank == 0, ipc_mono_ns(), &cp->commit, why);
	if (rc && !cp->commit)
		part_free(p);
	return rc;
}

/* ---- the outcome -------------------------------------------------------- */

/*
 * Under mu: an older step of the job still missing ranks of this node never
 * will have them now (they went on to `done`). One every rank here saved
 * goes on to its commit: it may just be slower to be durable (LATEST only
 * moves up, so it stays on `done`).
 */
static void supersede(struct agent *a, const struct checkpoint *done)
{
	struct list *pos, *tmp;
	char why[128];

	list_for_each_safe(pos, tmp, &a->ckpts)
	{
		struct checkpoint *cp = container_of(pos, struct checkpoint, link);

		if (cp == done || strcmp(cp->job, done->job) != 0 || cp->step >= done->step)
			continue;
		if (cp->state == SAVE_QUEUED && !cp->part_built && !local_all_saved(a, cp)) {
			snprintf(why, sizeof(why),
			         "step %lld committed while this node's ranks had not all saved "
			         "this one",
			         (long long)done->step);
			cp_fail(a, cp, why);
		} else if (cp->state == SAVE_FAILED) {
			cp->retired = true; /* nobody else is coming */
			cp_release(a, cp);
		}
	}
}

/* Under mu: COMMITTED. The files of ours it does not name (an earlier attempt's) into *stale. */
static void committed(struct agent *a, struct checkpoint *cp, const struct commit_result *r,
                      char ***stale, size_t *nstale)
{
	const struct manifest *m = r->manifest;
	struct cat_entry ce;

	catalog_entry_from_manifest(m, &ce);
	catalog_add(a->cat, &ce);
	cp->state = SAVE_COMMITTED;
	for (int k = 0; k < cp->world; k++) {
		struct save *s = cp->rank[k];

		if (!s)
			continue;
		if ((size_t)k < m->nranks && strcmp(m->ranks[k].file, s->file) != 0) {
			char **v = realloc(*stale, (*nstale + 1) * sizeof(char *));

			if (v) { /* no memory: the file stays, harmless */
				*stale = v;
				v[(*nstale)++] = strdup(s->file);
			}
		}
		save_set_state(a, s, SAVE_COMMITTED, NULL);
	}
	if (r->wrote)
		log_msg(
		    LOG_INFO,
		    "committed job %s step %lld (run %s): %d ranks from %zu node%s, %llu bytes, "
		    "captured %.3f s, durable %.3f s, commit latency %.1f ms%s",
		    cp->job, (long long)cp->step, cp->run, cp->world, m->nparts,
		    m->nparts == 1 ? "" : "s", (unsigned long long)m->bytes, m->capture_seconds,
		    m->durable_seconds, (double)r->latency_ns / 1e6,
		    r->by_assignment ? " (replicas covered by the assignment: no part read whole)"
		                     : "");
	else
		log_msg(LOG_INFO, "job %s step %lld (run %s) committed (its manifest is there)",
		        cp->job, (long long)cp->step, cp->run);
	if (r->reason[0]) /* committed, with a note (LATEST not moved) */
		log_msg(LOG_WARNING, "job %s step %lld: %s", cp->job, (long long)cp->step,
		        r->reason);
	supersede(a, cp);
	/* the upload tier's copy (upload.c), retention (gc.c) */
	hub_ckpt(&a->hub, a,
	         &(struct hub_ckpt){cp->job, cp->run, cp->step, SAVE_COMMITTED, r->wrote, NULL});
}

/* Under mu: what the last poll saw, for list, status and watch. */
static void take_progress(struct checkpoint *cp, struct commit_result *r)
{
	if (!r->ndone && !r->nmissing)
		return;
	free_texts(&cp->parts_done, &cp->nparts_done);
	free_texts(&cp->parts_missing, &cp->nparts_missing);
	cp->parts_done = r->done;
	cp->nparts_done = r->ndone;
	cp->parts_missing = r->missing;
	cp->nparts_missing = r->nmissing;
	r->done = r->missing = NULL;
	r->ndone = r->nmissing = 0;
}

/* Under mu: this node's saves of cp, ascending ranks (malloc'd). */
static struct save **local_saves(struct checkpoint *cp, size_t *n)
{
	struct save **v = calloc(cp->nsaved + 1, sizeof(*v));

	*n = 0;
	for (int r = 0; v && r < cp->world; r++)
		if (cp->rank[r])
			v[(*n)++] = cp->rank[r];
	return v;
}

/*
 * How long a step's part waits for the run's roster file, which rank 0's
 * node writes once it has read every node's plans summary, before this
 * node reads them itself: 10 s, at most a quarter of the commit deadline.
 * One read a node in place of one per node (commit_unclaimed).
 */
static int64_t roster_wait_ns(const struct agent *a)
{
	const int64_t quarter = (int64_t)a->cfg.commit_deadline_s * 1000000000 / 4;

	return quarter < 10000000000LL ? quarter : 10000000000LL;
}

/*
 * Commit thread, before the part: every rank of the world must be claimed,
 * by this node (a save here) or by another node's plans. A rank nobody
 * claims may yet come here (a trainer that starts late): its save must be
 * in this node's part, so the part waits for it. 1: go on (*v, *n: the
 * saves, and the part is built from them); 0: wait (rescheduled); < 0:
 * failed, r says why.
 */
static int before_part(struct agent *a, struct checkpoint *cp, struct save ***v, size_t *n,
                       struct commit_result *r)
{
	int free_ranks[64], *ranks;
	size_t nfree = 0, k;
	int64_t now = ipc_mono_ns();
	char why[IPC_ERRLEN] = "", list[160];
	bool transient;
	int rc;

	pthread_mutex_lock(&a->mu);
	*v = local_saves(cp, n);
	pthread_mutex_unlock(&a->mu);
	ranks = calloc(*n + 1, sizeof(int));
	for (k = 0; ranks && k < *n; k++)
		ranks[k] = (*v)[k]->rank;
	rc = ranks && *v ? commit_unclaimed(a->cm, cp->job, cp->run, cp->world, ranks, *n,
	                                    now - cp->t_first < roster_wait_ns(a), free_ranks, 64,
	                                    &nfree, why)
	                 : -ENOMEM;
	free(ranks);
	if (rc == 0 && nfree == 0) {
		pthread_mutex_lock(&a->mu);
		if (cp->abort[0]) { /* failed meanwhile: no part */
			r->state = COMMIT_FAILED;
			snprintf(r->reason, sizeof(r->reason), "%s", cp->abort);
			rc = -ECANCELED;
		} else if (cp->nsaved == *n && local_complete(a, cp)) {
			cp->part_built = true; /* no save of this step joins from here on */
			rc = 1;
		} else if (local_complete(a, cp)) {
			/* a save joined during the look, and is durable already: again */
			workq_push_at(a->commit, &cp->work, now);
			rc = 0;
		} else {
			cp->committing = false; /* the joined save's durable restarts the commit */
			rc = 0;
		}
		pthread_mutex_unlock(&a->mu);
		return rc;
	}
	/* What may pass (an NFS hiccup listing plans/) waits for the deadline too. */
	transient = rc && rc != -EEXIST && rc != -ENOMEM && rc != -EINVAL;
	if ((rc == 0 || transient) && !a->stopping &&
	    now - cp->t_first < (int64_t)a->cfg.commit_deadline_s * 1000000000) {
		cp->backoff = cp->backoff ? cp->backoff * 2 : COMMIT_BACKOFF_FIRST_NS;
		if (cp->backoff > COMMIT_BACKOFF_MAX_NS)
			cp->backoff = COMMIT_BACKOFF_MAX_NS;
		pthread_mutex_lock(&a->mu);
		workq_push_at(a->commit, &cp->work, now + cp->backoff);
		pthread_mutex_unlock(&a->mu);
		return 0;
	}
	r->state = COMMIT_FAILED;
	if (transient && a->stopping) { /* waiting for the run's roster (or a store that failed) */
		snprintf(r->reason, sizeof(r->reason),
		         "step %lld: the agent stopped before the ranks of run %s were known (%s)",
		         (long long)cp->step, cp->run, why);
		return -ECANCELED;
	}
	if (rc) {
		snprintf(r->reason, sizeof(r->reason), "step %lld: %s", (long long)cp->step, why);
		return rc;
	}
	part_ranks_text(free_ranks, nfree < 64 ? nfree : 64, list, sizeof(list));
	if (a->stopping) {
		snprintf(r->reason, sizeof(r->reason),
		         "step %lld: the agent stopped while no node claimed rank%s %s",
		         (long long)cp->step, nfree == 1 ? "" : "s", list);
		return -ECANCELED;
	}
	snprintf(r->reason, sizeof(r->reason),
	         "step %lld: no save of rank%s %s%s here, and no node has published plans for "
	         "them (run %s), within %u s (--commit-deadline)%s%s",
	         (long long)cp->step, nfree == 1 ? "" : "s", list, nfree > 64 ? ",..." : "",
	         cp->run, a->cfg.commit_deadline_s, why[0] ? "; " : "", why);
	return -ETIMEDOUT;
}

/*
 * Commit thread, as a step ends: every node's plans are in the root by now
 * (each published before its part), so a run whose plan set was not
 * complete gets its layouts. That look, and a failed step's (which reads
 * every file again: it may have read plans that changed), come before the
 * trainers are told, so that their next save uses what they found; any
 * other after, off the way between the manifest and COMMITTED: where the
 * job's plans generation has not moved, one small read. *early: the look
 * was made before.
 */
static void step_end_layouts(struct agent *a, const char *job, const char *run, bool failed,
                             bool told, bool *early)
{
	bool now;

	if (!told) {
		pthread_mutex_lock(&a->mu);
		now = *early = failed || layouts_waiting(a, job, run);
		pthread_mutex_unlock(&a->mu);
	} else {
		now = !*early;
	}
	if (!now)
		return;
	layouts_refresh(a, job, run, failed);
	pthread_mutex_lock(&a->mu);
	park_release(a, false); /* saves waiting for this set */
	pthread_mutex_unlock(&a->mu);
}

/*
 * Commit thread: one turn of cp's commit: this node's part first, then a
 * poll. False where it was rescheduled (restarted by a durable save).
 */
static bool commit_turn(struct agent *a, struct checkpoint *cp, struct commit_result *r,
                        int64_t *next)
{
	struct save **v = NULL;
	size_t n = 0;
	int rc = 1;

	pthread_mutex_lock(&a->mu);
	if (cp->abort[0]) {
		r->state = COMMIT_FAILED;
		snprintf(r->reason, sizeof(r->reason), "%s", cp->abort);
	}
	pthread_mutex_unlock(&a->mu);
	if (r->state == COMMIT_WAITING && !cp->commit)
		rc = before_part(a, cp, &v, &n, r);
	if (rc == 0) {
		free(v);
		return false;
	}
	if (r->state == COMMIT_WAITING) {
		if (!cp->commit && start_commit(a, cp, v, n, r->reason))
			r->state = COMMIT_FAILED;
		else
			commit_poll(cp->commit, ipc_mono_ns(), next, r);
	}
	free(v);
	return true;
}

/* Under mu: a commit still waiting ends now where cp failed meanwhile or the agent stops. */
static void stop_waiting(struct agent *a, const struct checkpoint *cp, struct commit_result *r)
{
	if (r->state == COMMIT_WAITING && cp->abort[0]) {
		r->state = COMMIT_FAILED;
		snprintf(r->reason, sizeof(r->reason), "%s", cp->abort);
	} else if (r->state == COMMIT_WAITING && a->stopping) {
		/* waiting for other nodes is no reason to keep a stopping agent */
		r->state = COMMIT_FAILED;
		snprintf(r->reason, sizeof(r->reason),
		         "the agent stopped before the step was committed (this node's part is in "
		         "the root: another node may still commit it)");
	}
}

/*
 * Under mu: cp's commit ended (r): counted, its saves told, cp let go; this
 * node's files no manifest names into *stale.
 */
static void commit_ended(struct agent *a, struct checkpoint *cp, const struct commit_result *r,
                         char ***stale, size_t *nstale)
{
	cp->committing = false;
	/* before the trainers are told: a scrape after COMMITTED counts this commit */
	metrics_on_commit(a->metrics, r->wrote ? r->latency_ns : -1, r->missing_at_deadline);
	if (r->state == COMMIT_COMMITTED && cp->state == SAVE_QUEUED)
		committed(a, cp, r, stale, nstale);
	else if (r->state == COMMIT_FAILED)
		cp_fail(a, cp, r->reason);
	if (r->state == COMMIT_FAILED && r->visible) { /* not listed here as committed */
		unsigned k = a->nunlisted++ % AGENT_UNLISTED;

		snprintf(a->unlisted[k].job, sizeof(a->unlisted[k].job), "%s", cp->job);
		a->unlisted[k].step = cp->step;
	}
	cp_release(a, cp);
}

/* Ours, and named by no manifest: the step is committed without them (freed). */
static void unlink_stale(struct agent *a, const struct commit_result *r, char **stale, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		char err[IPC_ERRLEN];

		if (stale[i] && a->store->ops->shard_unlink(a->store, r->manifest->job,
		                                            r->manifest->step, stale[i], err))
			log_msg(LOG_WARNING, "%s", err);
		free(stale[i]);
	}
	free(stale);
}

static void commit_work(struct work *w)
{
	struct checkpoint *cp = container_of(w, struct checkpoint, work);
	struct agent *a = cp->a;
	struct commit_result r = {.state = COMMIT_WAITING};
	char job[IPC_MAX_JOB + 1], run[IPC_MAX_JOB + 1];
	bool early = false; /* the step's end looked at the plans before telling */
	char **stale = NULL;
	size_t nstale = 0;
	int64_t next = 0;

	if (!commit_turn(a, cp, &r, &next))
		return;
	snprintf(job, sizeof(job), "%s", cp->job); /* cp may go before the layouts' look */
	snprintf(run, sizeof(run), "%s", cp->run);
	if (r.state != COMMIT_WAITING)
		step_end_layouts(a, job, run, r.state == COMMIT_FAILED, false, &early);
	pthread_mutex_lock(&a->mu);
	/* whether a manifest may name this node's files: then they stay */
	cp->part_written = cp->commit && commit_part_written(cp->commit) && !r.superseded;
	take_progress(cp, &r);
	stop_waiting(a, cp, &r);
	if (r.state == COMMIT_WAITING) {
		workq_push_at(a->commit, &cp->work, next); /* still committing */
		pthread_mutex_unlock(&a->mu);
		commit_result_free(&r);
		return;
	}
	commit_ended(a, cp, &r, &stale, &nstale);
	pthread_mutex_unlock(&a->mu);
	unlink_stale(a, &r, stale, nstale);
	step_end_layouts(a, job, run, r.state == COMMIT_FAILED, true, &early);
	commit_result_free(&r);
}

/*
 * A failed checkpoint's files, where this node's part was never written:
 * no manifest can name them, so they go, and the step's directory if that
 * leaves it empty. With the part written, a commit may still use them:
 * they stay (a clean-up takes them once the step is abandoned).
 */
static void cleanup_run(struct work *w)
{
	struct checkpoint *cp = container_of(w, struct checkpoint, work);
	struct agent *a = cp->a;
	char err[IPC_ERRLEN];
	struct save **v;
	size_t n = 0;
	bool own;

	pthread_mutex_lock(&a->mu);
	own = !cp->part_written;
	v = own ? local_saves(cp, &n) : NULL;
	pthread_mutex_unlock(&a->mu);
	for (size_t i = 0; i < n; i++) {
		int rc = v[i]->file[0] ? a->store->ops->shard_unlink(a->store, cp->job, cp->step,
		                                                     v[i]->file, err)
		                       : 0;

		if (rc && rc != -ENOENT)
			log_msg(LOG_WARNING, "removing a failed save's file: %s", err);
	}
	if (own && a->store->ops->step_tidy(a->store, cp->job, cp->step, err))
		log_msg(LOG_WARNING, "job %s step %lld: %s", cp->job, (long long)cp->step, err);
	free(v);
	pthread_mutex_lock(&a->mu);
	cp->cleaning = false;
	cp->cleaned = true;
	cp_release(a, cp);
	pthread_mutex_unlock(&a->mu);
}
