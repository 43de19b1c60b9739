/*
 * A checkpoint's commit, the commit thread's jobs (checkpoint.c queues
 * them): cp_commit_work, once every rank of this node is DURABLE, waits
 * until every rank of the world is claimed (by a save here or another
 * node's plans), publishes this node's plans file, builds and writes its
 * part, and polls the many-nodes commit (commit/commit.h) until the
 * manifest is there (COMMITTED) or it failed; then it tells the saves,
 * removes this node's files no manifest names, and has the run's layouts
 * looked at (layouts.c) as the step ends. cp_cleanup_run removes a failed
 * checkpoint's files where its part was never written.
 *
 * Commit thread; what it reads or changes of the checkpoint and the saves
 * is under agent.mu, the storage I/O and the committer off it.
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
#include "agent/node/checkpoint_int.h"
#include "ipc/base/log.h"

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
		if (cp->state == SAVE_QUEUED && !cp->part_built && !cp_local_all_saved(a, cp)) {
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
	cp_free_texts(&cp->parts_done, &cp->nparts_done);
	cp_free_texts(&cp->parts_missing, &cp->nparts_missing);
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
 * Commit thread, every rank of the world claimed: the part goes on (1)
 * where the saves v[0..n) are still all of this node's, and all durable;
 * else the turn waits (0: again now, or at the joined save's durable), or
 * the checkpoint failed meanwhile (-ECANCELED, r says why).
 */
static int all_claimed(struct agent *a, struct checkpoint *cp, size_t n, int64_t now,
                       struct commit_result *r)
{
	int rc;

	pthread_mutex_lock(&a->mu);
	if (cp->abort[0]) { /* failed meanwhile: no part */
		r->state = COMMIT_FAILED;
		snprintf(r->reason, sizeof(r->reason), "%s", cp->abort);
		rc = -ECANCELED;
	} else if (cp->nsaved == n && cp_local_complete(a, cp)) {
		cp->part_built = true; /* no save of this step joins from here on */
		rc = 1;
	} else if (cp_local_complete(a, cp)) {
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

/*
 * Commit thread, ranks of the world unclaimed past the wait (free_ranks,
 * nfree of them), or the look failed (rc, why): FAILED, r says why; the
 * return is the commit's error.
 */
static int unclaimed_fails(struct agent *a, const struct checkpoint *cp, int rc, bool transient,
                           const int *free_ranks, size_t nfree, const char *why,
                           struct commit_result *r)
{
	char list[160];

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
	char why[IPC_ERRLEN] = "";
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
	if (rc == 0 && nfree == 0)
		return all_claimed(a, cp, *n, now, r);
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
	return unclaimed_fails(a, cp, rc, transient, free_ranks, nfree, why, r);
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
	hub_commit_end(&a->hub, a,
	               &(struct hub_commit){.latency_ns = r->wrote ? r->latency_ns : -1,
	                                    .parts_missing = r->missing_at_deadline});
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

void cp_commit_work(struct work *w)
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
void cp_cleanup_run(struct work *w)
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
