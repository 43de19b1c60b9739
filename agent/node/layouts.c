/*
 * Replicas written once (docs/DESIGN.md §7.4): what each of this node's plans
 * writes of what it holds, from the plans files every node publishes.
 *
 * On the commit thread, after this node's plans file is published, while
 * a run's plan set is not complete (a poll: every 200 ms, then every
 * second) and as a step of the job ends (checkpoint.c says when), where the
 * job's plans generation (one small object every publisher renews after
 * its file) moved since the last look:
 *
 * - The node of rank 0 reads every node's plans summary (plans/<node>.sum:
 *   ranks and signatures, ~60 bytes a rank; other nodes' files are hostile
 *   input: parsed and checked by storage/). Where those of this run hold
 *   every rank of the world exactly once and the set is new, it reads the
 *   files whole (their tensors), once per plan set, layout/assign.c gives
 *   each rank the rows it writes, and it writes every node's share of that
 *   (plans/<node>.share). After each look it writes the run's set mark
 *   (plans/<run>.set: the set it found, under which generation), once the
 *   shares of that set are written.
 * - Every other node reads the mark and its own share: two small objects
 *   at any size of the job. It takes them only where the mark is of the
 *   generation just read and the share of the mark's set, each of its
 *   ranks' entries checked against its live plan (assign_rank_of_share).
 *   Otherwise it looks again at the next poll or step end; after half the
 *   commit deadline of that (rank 0's node is gone, or cannot write), it
 *   reads the plans itself as the node of rank 0 does, without writing.
 * - A look that fails (a plans file that cannot be read, or whose file
 *   whole is not the set its summary says; shares or the mark not put), or
 *   that has no generation to follow, is made again after a back-off
 *   (2 s, doubled while they fail, up to 60 s; never under twice what the
 *   look took), not at every poll: at thousands of nodes rank 0's node's
 *   look reads every file.
 *
 * Each plan of this node whose rank writes less than it holds gets a shard
 * layout of its own (struct shard_layout: the pieces, a header), made once
 * per plan set and kept until the set changes; saves admitted from then on
 * use it.
 *
 * A run's first save waits for the set (park.c: at most --plans-wait;
 * layouts_plan_waits says which plans wait). A save that waited in vain
 * writes every replica it holds, says so, and the plan's next saves do
 * not wait.
 *
 * The plan set is named by its content (every rank's tensors signature,
 * and its node), so equal files on two nodes give equal assignments. Two
 * nodes that looked at different sets (one saw a rank's new plan, the
 * other not yet) may leave a row that no rank wrote: the commit refuses
 * such a step (layout/cover.c), and the step's end reads every file again;
 * every other step's end looks at the generation, and reads the files
 * where it moved. A node that has no complete set
 * writes whole plans: a superset never leaves a hole. Only where every
 * node's file says its agent writes replicas once (`writes_once`: an
 * older agent's does not) do the plans use it. Copies as many as the
 * replicas (CKPT_COPIES_ALL) need no assignment.
 *
 * Invariants:
 * - A plan's layout is replaced, never changed: a save keeps the one it
 *   was admitted with (a reference under agent.mu).
 * - This node's own ranks are taken from its published file (or its share)
 *   only where that says what the live plan holds; otherwise the plan
 *   writes everything (a superset never leaves a hole).
 * - The generation is read before the files: a file written after them
 *   moves it after, and the next look reads again. A set mark names the
 *   generation its node read before the summaries, and is written after
 *   the shares of its set: a mark of the generation a reader just read
 *   says the set as it is, and the reader's share of it is there.
 *
 * This file: the looks, and what they decide (when the plans are read
 * again, by whom, what each plan follows and whether it waits), and the
 * layouts installed. layouts_files.c: the mechanism they use (reading the
 * plans files, making a layout from an assignment or a share, putting the
 * shares and the set mark).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/node/node.h"
#include "agent/node/plan.h"
#include "agent/node/layouts.h"
#include "agent/node/layouts_int.h"
#include "ipc/base/log.h"
#include "layout/assign.h"
#include "commit/shares.h"

/* Under mu: p takes layout l (NULL: its whole plan) of plan set key (as: its assignment, if made
 * here). */
static void layout_install(struct plan *p, struct shard_layout *l, uint64_t key,
                           const struct assignment *as)
{
	if (p->dedup)
		layout_put(p->dedup);
	p->dedup = l;
	p->dedup_key = key;
	if (l && as)
		log_msg(LOG_INFO,
		        "job %s rank %d: replicas written once: it writes %llu of the %llu bytes "
		        "it holds (%zu ranks, balance %.3f)",
		        p->job, p->rank, (unsigned long long)(l->shard_bytes - l->header_len),
		        (unsigned long long)l->held_bytes, as->nranks, assign_balance(as));
	else if (l)
		log_msg(LOG_INFO,
		        "job %s rank %d: replicas written once: it writes %llu of the %llu bytes "
		        "it holds (its share from rank 0's node)",
		        p->job, p->rank, (unsigned long long)(l->shard_bytes - l->header_len),
		        (unsigned long long)l->held_bytes);
}

/*
 * Under mu: this node's live plans of (job, run) whose layout is not of plan
 * set key: held. Every live plan of it has been looked at now, under
 * generation gen, with `ranks` of the world known (-1: not counted here)
 * and the set `missing` (a rank missing, or twice).
 */
static size_t stale_plans(struct agent *a, const char *job, const char *run, uint64_t key,
                          int ranks, bool missing, uint64_t gen, struct plan ***out)
{
	const int64_t now = ipc_mono_ns();
	struct list *pos;
	struct plan **v;
	size_t n = 0;

	list_for_each(pos, &a->plans) n++;
	*out = v = calloc(n + 1, sizeof(*v));
	if (!v)
		return 0;
	n = 0;
	list_for_each(pos, &a->plans)
	{
		struct plan *p = container_of(pos, struct plan, link);

		if (p->dropped || strcmp(p->job, job) != 0 || strcmp(p->run, run) != 0)
			continue;
		p->dedup_at = now;
		p->set_gen = gen;
		p->set_ranks = ranks;
		p->set_missing = missing;
		p->mark_since = 0;
		if (p->dedup_key != key) {
			/* its layout is made now, off mu: a save meanwhile waits for it */
			p->set_missing = p->set_missing || key;
			plan_get(p);
			v[n++] = p;
		}
	}
	return n;
}

/* Under mu: this node's live plan of rank 0 of (job, run), or NULL. */
static int world_of(struct agent *a, const char *job, const char *run)
{
	struct list *pos;

	list_for_each(pos, &a->plans)
	{
		const struct plan *p = container_of(pos, struct plan, link);

		if (!p->dropped && strcmp(p->job, job) == 0 && strcmp(p->run, run) == 0)
			return p->world;
	}
	return 0;
}

/* A failed look is made again after this, doubled while they fail, up to RELOOK_MAX_NS. */
#define RELOOK_MIN_NS 2000000000LL
#define RELOOK_MAX_NS 60000000000LL

/*
 * Under mu: whether every live plan of (job, run) was looked at under
 * generation gen (then nothing changed since: none is read again), or is
 * in the back-off of a failed look (relook_at not reached), whatever the
 * generation: a look that keeps failing (a plans file that never reads
 * right, a store that refuses the shares, no generation to follow) is not
 * made at every poll. A plan never looked at is looked at now.
 */
static bool all_seen(struct agent *a, const char *job, const char *run, uint64_t gen)
{
	const int64_t now = ipc_mono_ns();
	struct list *pos;

	list_for_each(pos, &a->plans)
	{
		const struct plan *p = container_of(pos, struct plan, link);

		if (p->dropped || strcmp(p->job, job) != 0 || strcmp(p->run, run) != 0)
			continue;
		if (p->relook_at ? now >= p->relook_at : !gen || p->set_gen != gen)
			return false;
	}
	list_for_each(pos, &a->plans)
	{
		struct plan *p = container_of(pos, struct plan, link);

		if (!p->dropped && strcmp(p->job, job) == 0 && strcmp(p->run, run) == 0)
			p->dedup_at = now;
	}
	return true;
}

/*
 * Under mu: the look at (job, run), which took `took` ns, failed (ok
 * false): the next is made after a back-off, no shorter than twice the
 * look's time (at thousands of nodes, minutes: rank 0's node reads every
 * file whole). Or it did not: no look is owed.
 */
static void relook(struct agent *a, const char *job, const char *run, bool ok, int64_t took)
{
	const int64_t now = ipc_mono_ns();
	struct list *pos;

	list_for_each(pos, &a->plans)
	{
		struct plan *p = container_of(pos, struct plan, link);
		int64_t ns = ipc_backoff_next(p->relook_ns, RELOOK_MIN_NS, RELOOK_MAX_NS);

		if (p->dropped || strcmp(p->job, job) != 0 || strcmp(p->run, run) != 0)
			continue;
		if (!ok && p->relook_at > now)
			continue; /* a look made meanwhile (a new plan, a failed step): as it was */
		ns = ns < 2 * took ? 2 * took : ns;
		p->relook_ns = ok ? 0 : ns;
		p->relook_at = ok ? 0 : now + ns;
	}
}

/* ---- every other node: the set as rank 0's node found it ------------- */

/*
 * Rank 0's node has not said the set of the generation read (yet), or this
 * node's share of it is not there: the plans of (job, run) are looked at
 * again at the next poll or step end. Meanwhile each writes all it holds
 * (the set may have changed: a superset leaves no hole); one that
 * followed no set yet goes on waiting for one, unless the run had a
 * complete set before (`known`: a plan made anew in a running job, whose
 * saves must not stall until rank 0's node looks). True while that has
 * lasted less than half the commit deadline (after it, as any other agent
 * takes over a commit, this node reads the plans itself).
 */
static bool mark_wait(struct agent *a, const char *job, const char *run, bool known,
                      const char *why)
{
	const int64_t now = ipc_mono_ns();
	const int64_t bound = (int64_t)a->cfg.commit_deadline_s * 500000000;
	struct list *pos;
	bool wait = false;

	pthread_mutex_lock(&a->mu);
	list_for_each(pos, &a->plans)
	{
		struct plan *p = container_of(pos, struct plan, link);

		if (p->dropped || strcmp(p->job, job) != 0 || strcmp(p->run, run) != 0)
			continue;
		p->mark_since = p->mark_since ? p->mark_since : now;
		wait = wait || now - p->mark_since < bound;
		p->dedup_at = now;
		p->set_gen = 0; /* looked at again, whatever the generation */
		p->set_ranks = -1;
		if (p->dedup_key) /* it followed a set: all it holds, no wait */
			layout_install(p, NULL, 0, NULL);
		else /* a run past its start (a plan made anew) does not wait either */
			p->set_missing = !known;
	}
	pthread_mutex_unlock(&a->mu);
	if (wait)
		log_msg(LOG_DEBUG, "job %s: waiting for rank 0's node's plan set of run %s: %s",
		        job, run, why);
	else
		log_msg(LOG_WARNING,
		        "job %s: rank 0's node has said no plan set of run %s for half the commit "
		        "deadline (%s): this node reads every node's plans itself",
		        job, run, why);
	return wait;
}

/*
 * The plans of (job, run) as rank 0's node found them under generation
 * gen: its set mark, and this node's share of that set (two reads). False
 * where this node must read the plans itself (mark_wait).
 */
static bool from_rank0(struct agent *a, const char *job, const char *run, int world, uint64_t gen)
{
	struct plans_share *sh = NULL;
	struct set_mark *m = NULL;
	char err[IPC_ERRLEN];
	struct plan **v;
	size_t n;

	if (shares_get(a->store, job, run, a->cfg.node, world, gen, &m, &sh, err)) {
		/* a mark of before, of a complete set: the run is past its start */
		bool known = m && (m->set || m->writes_all);

		set_mark_free(m);
		return mark_wait(a, job, run, known, err);
	}
	log_msg(LOG_DEBUG,
	        "job %s: plan set %016llx of run %s from rank 0's node (generation %016llx%s)", job,
	        (unsigned long long)m->set, run, (unsigned long long)gen,
	        !m->set         ? ": not complete"
	        : m->writes_all ? ": every rank writes all"
	                        : "");
	pthread_mutex_lock(&a->mu);
	n = stale_plans(a, job, run, m->set, m->set ? world : -1, !m->set && !m->writes_all, gen,
	                &v);
	pthread_mutex_unlock(&a->mu);
	for (size_t i = 0; i < n; i++) {
		struct shard_layout *l = NULL;

		if (sh)
			lay_from_share(a, v[i], sh, m->set, &l);
		pthread_mutex_lock(&a->mu);
		if (m->set)
			v[i]->set_missing = false;
		if (!v[i]->dropped)
			layout_install(v[i], l, m->set, NULL);
		else if (l)
			layout_put(l);
		plan_put(a, v[i]);
		pthread_mutex_unlock(&a->mu);
	}
	free(v);
	set_mark_free(m);
	share_free(sh);
	pthread_mutex_lock(&a->mu);
	relook(a, job, run, true, 0);
	pthread_mutex_unlock(&a->mu);
	return true;
}

/* ---- the look at every node's plans ---------------------------------- */

/*
 * p, a stale plan of this node after a look: its layout made from the
 * assignment as of set ps (where its rank writes less than it holds and
 * this node's file says what p holds), and installed; `failed`: the set
 * not followed (every rank writes all it holds), `again`: the files did
 * not make the set their summaries did (the plan waits for the next look).
 */
static void layout_follow(struct agent *a, struct plan *p, const struct plan_set *ps,
                          const struct assignment *as, bool failed, bool again)
{
	struct shard_layout *l = NULL;
	const struct assign_rank *r = as ? assign_rank(as, p->rank) : NULL;
	char err[IPC_ERRLEN];

	if (r && lay_file_says(ps, a->cfg.node, p) && lay_layout_make(a, p, r, ps->key, &l, err))
		log_msg(LOG_WARNING, "job %s rank %d: writes all it holds: %s", p->job, p->rank,
		        err);
	pthread_mutex_lock(&a->mu);
	/* made (or not to be made): no more waiting, unless it is looked at again */
	if (ps->key)
		p->set_missing = again;
	if (!p->dropped)
		layout_install(p, l, failed ? 0 : ps->key, as);
	else if (l)
		layout_put(l);
	plan_put(a, p);
	pthread_mutex_unlock(&a->mu);
}

/*
 * The plans of (job, run) read under generation gen, by rank 0's node (r0)
 * or a node that reads them itself: every node's summary; where they make
 * a new complete set, the files whole, the assignment, and each stale
 * plan's layout; on rank 0's node the shares of the set and the run's set
 * mark. False where some of it failed: the next look is owed (relook).
 */
static bool look(struct agent *a, const char *job, const char *run, int world, uint64_t gen,
                 bool r0)
{
	struct assignment *as = NULL;
	struct plan_set ps;
	struct plan **v, *p0;
	char err[IPC_ERRLEN];
	bool again = false, shares, due, ok = true;
	size_t n;
	int rc = lay_set_read(a, job, run, world, false, &ps, err);

	if (rc) { /* nothing marked as seen: the next look reads them again */
		log_msg(LOG_INFO, "job %s: plans of the other nodes not read: %s", job, err);
		lay_set_free(&ps);
		return false;
	}
	log_msg(LOG_DEBUG,
	        "job %s: plans summaries of run %s read (%zu nodes, %zu of %d ranks, generation "
	        "%016llx)",
	        job, run, ps.nfiles, ps.n, world, (unsigned long long)gen);
	pthread_mutex_lock(&a->mu);
	n = stale_plans(a, job, run, ps.key, (int)ps.n, ps.key == 0 && !ps.older, gen, &v);
	p0 = r0 ? plan_rank0(a, job, run) : NULL;
	/* rank 0's node: the shares of this set not written yet, and no back-off running */
	shares = p0 && ps.key && ps.copies < (unsigned)world && p0->shares_key != ps.key;
	due = shares && (!p0->relook_at || ipc_mono_ns() >= p0->relook_at);
	pthread_mutex_unlock(&a->mu);
	/* copies as many as the world: every replica writes its own, no assignment */
	if ((n || due) && ps.key && ps.copies < (unsigned)world &&
	    !(again = lay_set_whole(a, job, run, world, &ps, err) != 0) &&
	    (rc = assign_compute(ps.in, ps.n, ps.copies, &as, err)))
		log_msg(LOG_WARNING, "job %s: replicas are written by every rank: %s", job, err);
	if (as)
		lay_give_committer(a, &ps, job, run, world, as);
	/* plans that cannot be assigned: not tried again until they change */
	if (shares && (as ? !lay_shares_done(a, job, run, world, &ps, as) : again || !due))
		ok = false;
	rc = rc || again;
	for (size_t i = 0; i < n; i++)
		layout_follow(a, v[i], &ps, as, rc, again);
	if (r0 && !again &&
	    lay_mark_write(a, job, run, world, &ps, gen,
	                   ps.older || (ps.key && (ps.copies >= (unsigned)world || rc))))
		ok = false;
	free(v);
	assign_free(as);
	lay_set_free(&ps);
	return ok && !again;
}

void layouts_refresh(struct agent *a, const char *job, const char *run, bool force)
{
	const int64_t t0 = ipc_mono_ns();
	char err[IPC_ERRLEN];
	uint64_t gen = 0;
	bool seen, r0, ok;
	int world;

	pthread_mutex_lock(&a->mu);
	world = world_of(a, job, run);
	pthread_mutex_unlock(&a->mu);
	if (world < 2)
		return; /* nothing to share */
	/* one small object: where it has not moved, no plans file changed */
	if (store_plans_generation(a->store, job, &gen, err))
		log_msg(LOG_DEBUG, "job %s: plans generation not read (every file is): %s", job,
		        err);
	pthread_mutex_lock(&a->mu);
	seen = !force && all_seen(a, job, run, gen);
	r0 = plan_rank0(a, job, run) != NULL;
	pthread_mutex_unlock(&a->mu);
	if (seen) {
		log_msg(LOG_DEBUG,
		        "job %s: plans generation %016llx unchanged (or a failed look's back-off "
		        "running): no plans file read",
		        job, (unsigned long long)gen);
		return;
	}
	/* the node of rank 0 reads every node's plans; the others what it found */
	if (!r0 && gen && from_rank0(a, job, run, world, gen))
		return;
	/* without a generation nothing says when they change: looked at again after a while */
	ok = look(a, job, run, world, gen, r0) && gen;
	pthread_mutex_lock(&a->mu);
	relook(a, job, run, ok, ipc_mono_ns() - t0);
	pthread_mutex_unlock(&a->mu);
}

/* ---- whether a plan waits for its set --------------------------------- */

/*
 * Under mu: whether p's run has no complete plan set yet, and p holds a
 * tensor that may have replicas (one with a global offset: a tensor
 * without is its rank's alone).
 */
bool layouts_plan_waits(const struct plan *p)
{
	if (p->dropped || p->world < 2 || p->copies >= (unsigned)p->world || p->dedup_key)
		return false;
	if (p->dedup_at && !p->set_missing)
		return false; /* every rank known, and still no set: an older agent's node */
	for (size_t i = 0; i < p->n; i++)
		if (p->t[i].sharded)
			return true;
	return false;
}

bool layouts_rank0(struct agent *a, const char *job, const char *run)
{
	const struct plan *p = plan_rank0(a, job, run);

	return p && p->world > 1;
}

bool layouts_waiting(struct agent *a, const char *job, const char *run)
{
	struct list *pos;

	list_for_each(pos, &a->plans)
	{
		const struct plan *p = container_of(pos, struct plan, link);

		if (strcmp(p->job, job) == 0 && strcmp(p->run, run) == 0 && layouts_plan_waits(p))
			return true;
	}
	return false;
}
