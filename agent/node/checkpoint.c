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
 * This file: the state machine of a checkpoint as its saves join, become
 * durable, fail or stop (cp_get, cp_join, cp_fail, cp_expire, cp_release):
 * it decides when the commit starts and when a checkpoint is let go. The
 * commit itself (the part, the polls, the outcome) and the removal of a
 * failed checkpoint's files are the commit thread's jobs, in
 * checkpoint_commit.c.
 *
 * Each job's plans file is publish.c's, `ckptctl commit --finish`
 * checkpoint_rpc.c's.
 *
 * cp_* run under agent.mu on whatever thread; cp_commit_work and
 * cp_cleanup_run are the commit thread's jobs, and only the commit
 * thread's jobs touch the committer and cp->commit.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/node/node.h"
#include "agent/node/plan.h"
#include "agent/node/checkpoint.h"
#include "agent/node/save.h"
#include "agent/node/checkpoint_int.h"

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

void cp_free_texts(char ***v, size_t *n)
{
	for (size_t i = 0; i < *n; i++)
		free((*v)[i]);
	free(*v);
	*v = NULL;
	*n = 0;
}

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
		if (!cp->cleaned || (!cp->retired && !cp_local_all_saved(a, cp)))
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
	cp_free_texts(&cp->parts_done, &cp->nparts_done);
	cp_free_texts(&cp->parts_missing, &cp->nparts_missing);
	free(cp->rank);
	free(cp);
}

static void queue_cleanup(struct agent *a, struct checkpoint *cp)
{
	cp->cleaning = true;
	cp->work.fn = cp_cleanup_run;
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
bool cp_local_all_saved(struct agent *a, const struct checkpoint *cp)
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
bool cp_local_complete(struct agent *a, const struct checkpoint *cp)
{
	if (cp->nsaved == 0 || cp->ndurable != cp->nsaved)
		return false;
	return cp_local_all_saved(a, cp);
}

void cp_rank_durable(struct agent *a, struct checkpoint *cp)
{
	cp->ndurable++;
	if (cp->state == SAVE_QUEUED && !cp->committing && cp_local_complete(a, cp)) {
		cp->committing = true;
		cp->work.fn = cp_commit_work;
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
