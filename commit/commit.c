/*
 * commit.c: the many-nodes commit of one step (commit.h), as a state
 * machine over the storage interface.
 *
 * Per step, each poll, in this order:
 *   1. this node's part, written once (store_put_part)
 *   2. the manifest, by exact name: there, the step is COMMITTED (of this
 *      run) or FAILED (committed by another run, without this save)
 *   3. the roster (which node holds which rank of this run: roster.c),
 *      cached per job and run once complete
 *   4. the other nodes' parts by exact name: read and checked where this
 *      node commits, only looked at otherwise (for the progress shown)
 *   5. this node commits (it hosts rank 0, or half the deadline passed):
 *      all parts in, one run, each rank once, every shard there at its
 *      size: merge, manifest create-once (EEXIST: step 2's answer), LATEST
 *   6. the deadline: FAILED naming the nodes (and their ranks) whose parts
 *      are missing, and what was wrong with those that were there
 *
 * This file: the committer, a step, and its polls (the decisions); the
 * others' parts are read and judged in read_parts.c, the manifest found and
 * written in write_manifest.c, a step committed by hand in by_hand.c
 * (commit_int.h).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commit/commit.h"
#include "commit/commit_int.h"
#include "commit/roster.h"
#include "commit/shares.h"

/* The roster of c's run (see roster_build), this node's ranks from its part. */
static int roster_get(struct commit *c, char *why)
{
	const struct part *p = c->own;
	int *local, rc;

	if (c->roster && roster_complete(c->roster))
		return 0;
	if (c->roster) { /* incomplete: again from the files */
		roster_put(c->roster);
		c->roster = NULL;
	}
	local = malloc((p->nranks + 1) * sizeof(int));
	if (!local)
		return -ENOMEM;
	for (size_t i = 0; i < p->nranks; i++)
		local[i] = p->ranks[i].rank;
	rc = roster_build(&c->cm->rosters, p->job, p->run, p->world, local, p->nranks, c->whole,
	                  false, &c->roster, why);
	free(local);
	return rc;
}

int commit_unclaimed(struct committer *cm, const char *job, const char *run, int world,
                     const int *local, size_t nlocal, bool patient, int *out, size_t max, size_t *n,
                     char *why)
{
	struct roster *r = NULL;
	int rc;

	*n = 0;
	if (world < 1 || world > IPC_MAX_WORLD)
		return ipc_errf(why, -EINVAL, "world %d", world);
	for (size_t i = 0; i < nlocal; i++)
		if (local[i] < 0 || local[i] >= world || (i && local[i] <= local[i - 1]))
			return ipc_errf(why, -EINVAL,
			                "this node's ranks are not ascending ranks of "
			                "world %d",
			                world);
	rc = roster_build(&cm->rosters, job, run, world, local, nlocal, false, patient, &r, why);
	if (rc)
		return rc;
	if (!roster_complete(r))
		rc = roster_unclaimed(r, out, max, n);
	roster_put(r);
	return rc;
}

/*
 * The roster was wrong (a part disagrees with it): out of the cache, and
 * this step lets go of it; other steps holding it keep theirs until they
 * find out themselves.
 */
static void roster_drop(struct commit *c)
{
	c->whole = true; /* a summary may have said what its file does not: the files say */
	roster_uncache(&c->cm->rosters, c->roster);
	forget_parts(c);
	roster_put(c->roster);
	c->roster = NULL;
}

/* ---- the committer ----------------------------------------------------- */

int committer_create(const struct commit_opts *o, struct committer **out, char *err)
{
	struct committer *cm;
	int rc;

	*out = NULL;
	if (!o || !o->store)
		return ipc_errf(err, -EINVAL, "committer: no storage");
	if ((rc = ipc_check_node(o->node, err)))
		return rc;
	cm = calloc(1, sizeof(*cm));
	if (!cm)
		return ipc_errf(err, -ENOMEM, "out of memory");
	cm->o = *o;
	snprintf(cm->node, sizeof(cm->node), "%s", o->node);
	cm->o.node = cm->node;
	cm->rosters = (struct roster_cache){cm->o.store, cm->node, NULL};
	*out = cm;
	return 0;
}

void committer_destroy(struct committer *cm)
{
	if (!cm)
		return;
	roster_cache_clear(&cm->rosters);
	for (size_t i = 0; i < cm->nassigned; i++)
		assigned_free(cm->assigned[i]);
	free(cm->assigned);
	free(cm);
}

void committer_assigned(struct committer *cm, struct assigned *x)
{
	struct assigned **v;

	for (size_t i = 0; i < cm->nassigned; i++)
		if (strcmp(cm->assigned[i]->job, x->job) == 0) {
			assigned_free(cm->assigned[i]);
			cm->assigned[i] = x;
			return;
		}
	v = realloc(cm->assigned, (cm->nassigned + 1) * sizeof(*v));
	if (!v) { /* then the parts are read whole */
		assigned_free(x);
		return;
	}
	cm->assigned = v;
	v[cm->nassigned++] = x;
}

void commit_result_free(struct commit_result *r)
{
	manifest_free(r->manifest);
	for (size_t i = 0; i < r->ndone; i++)
		free(r->done[i]);
	for (size_t i = 0; i < r->nmissing; i++)
		free(r->missing[i]);
	free(r->done);
	free(r->missing);
	memset(r, 0, sizeof(*r));
}

int commit_create(struct committer *cm, struct part *part, bool first, int64_t t0,
                  struct commit **out, char *err)
{
	struct commit *c;
	int rc;

	*out = NULL;
	if (!part)
		return ipc_errf(err, -EINVAL, "commit: no part");
	if (strcmp(part->node, cm->node) != 0)
		return ipc_errf(err, -EINVAL, "commit: the part is node %s's, this is node %s",
		                part->node, cm->node);
	rc = part_check(part, err);
	if (rc)
		return rc;
	c = calloc(1, sizeof(*c));
	if (!c)
		return ipc_errf(err, -ENOMEM, "out of memory");
	c->cm = cm;
	c->own = part;
	c->step = part->step;
	c->first = first;
	c->t0 = t0;
	c->deadline = t0 + cm->o.deadline_ns;
	/* one writer where create-once is not atomic: rank 0's node, and no other */
	c->takeover_at = cm->o.single_writer ? INT64_MAX : t0 + cm->o.deadline_ns / 2;
	c->backoff = COMMIT_BACKOFF_FIRST_NS;
	*out = c;
	return 0;
}

bool commit_part_written(const struct commit *c)
{
	return c->part_tried;
}

void commit_destroy(struct commit *c)
{
	if (!c)
		return;
	forget_parts(c);
	roster_put(c->roster);
	part_free(c->own);
	free(c);
}

/* ---- polling ----------------------------------------------------------- */

static int add_text(char ***v, size_t *n, const char *text)
{
	char **nv = realloc(*v, (*n + 1) * sizeof(*nv));

	if (!nv)
		return -ENOMEM;
	*v = nv;
	if (!(nv[*n] = strdup(text)))
		return -ENOMEM;
	(*n)++;
	return 0;
}

/* Progress for people: nodes whose parts are in, and those missing with their ranks. */
static void progress(struct commit *c, struct commit_result *r)
{
	char text[IPC_MAX_JOB + 160], ranks[128];
	int free_ranks[64];
	size_t n;

	if (!c->roster)
		return;
	for (size_t i = 0; i < c->roster->nnodes; i++) {
		const struct rnode *nd = &c->roster->nodes[i];

		if (c->seen && c->seen[i]) {
			add_text(&r->done, &r->ndone, nd->name);
			continue;
		}
		if (!c->reading)
			continue; /* a watching node looks at no other part: it cannot say */
		part_node_text(nd->name, nd->ranks, nd->nranks, text, sizeof(text));
		add_text(&r->missing, &r->nmissing, text);
	}
	if (roster_unclaimed(c->roster, free_ranks, 64, &n) == 0 && n) {
		part_ranks_text(free_ranks, n < 64 ? n : 64, ranks, sizeof(ranks));
		snprintf(text, sizeof(text), "no node's plans (rank%s %s%s)", n == 1 ? "" : "s",
		         ranks, n > 64 ? ",..." : "");
		add_text(&r->missing, &r->nmissing, text);
	}
}

/* The deadline passed without a commit: FAILED, naming who is missing, or what was wrong. */
static void expire(struct commit *c, struct commit_result *r)
{
	int64_t secs = c->cm->o.deadline_ns / 1000000000;
	size_t o;

	r->state = COMMIT_FAILED;
	r->missing_at_deadline = (unsigned)r->nmissing;
	if (!r->nmissing) {
		snprintf(r->reason, sizeof(r->reason),
		         "step %" PRId64 ": not committed within %lld s%s%s", c->step,
		         (long long)secs, c->problem[0] ? ": " : "", c->problem);
		return;
	}
	o = (size_t)snprintf(r->reason, sizeof(r->reason), "step %" PRId64 ": no part from ",
	                     c->step);
	for (size_t i = 0; i < r->nmissing && o < sizeof(r->reason); i++)
		o += (size_t)snprintf(r->reason + o, sizeof(r->reason) - o, "%s%s%s", i ? ", " : "",
		                      strncmp(r->missing[i], "no node", 7) ? "node " : "",
		                      r->missing[i]);
	if (o < sizeof(r->reason))
		o += (size_t)snprintf(r->reason + o, sizeof(r->reason) - o, " after %lld s",
		                      (long long)secs);
	if (c->problem[0] && o < sizeof(r->reason))
		snprintf(r->reason + o, sizeof(r->reason) - o, "; %s", c->problem);
}

/*
 * Step 1: this node's part, written once. true: it never can be (the step
 * FAILED, r says why).
 */
static bool put_own_part(struct commit *c, struct commit_result *r)
{
	char msg[IPC_ERRLEN];
	int rc;

	/* tried: from here on, a commit elsewhere may name this node's files */
	c->part_tried = true;
	rc = store_put_part(c->cm->o.store, c->own, msg);
	if (rc == -EFBIG || rc == -EOVERFLOW) { /* no poll makes it smaller: once */
		r->state = COMMIT_FAILED;
		snprintf(r->reason, sizeof(r->reason),
		         "step %" PRId64 ": this node's part cannot be written: %s", c->step, msg);
		return true;
	}
	if (rc)
		snprintf(c->problem, sizeof(c->problem), "writing this node's part: %s", msg);
	/* EEXIST: the step is committed; the manifest says with which part */
	c->part_done = rc == 0 || rc == -EEXIST;
	return false;
}

/* How many parts the step has seen so far (this node's own is in from the start). */
static size_t parts_seen(const struct commit *c)
{
	size_t n = c->seen ? 0 : 1;

	for (size_t i = 0; c->seen && i < c->roster->nnodes; i++)
		n += c->seen[i];
	return n;
}

/*
 * Step 5, every part in where this node commits: the manifest written (or
 * found written). true: r is the poll's answer.
 */
static bool commit_now(struct commit *c, struct commit_result *r)
{
	if (c->merge[0]) {
		r->state = COMMIT_FAILED;
		snprintf(r->reason, sizeof(r->reason), "the parts do not merge: %s", c->merge);
		return true;
	}
	if (write_manifest(c->cm, c->parts, c->roster->nnodes, c->names, c->holds,
	                   c->cm->o.deadline_ns, r, c->problem))
		c->unsynced = true; /* find_manifest makes it durable first */
	return r->state != COMMIT_WAITING || find_manifest(c, r);
}

/*
 * When to poll again. Back-off: 20 ms doubling to 500 ms; again from 20 ms
 * when a part comes in. A watching node sees no part come in: it looks for
 * the manifest at least every 200 ms (one small request).
 */
static void next_poll(struct commit *c, int64_t now, bool came_in, int64_t *next)
{
	int64_t max = c->reading ? COMMIT_BACKOFF_MAX_NS : COMMIT_WATCH_MAX_NS;

	c->backoff =
	    came_in ? COMMIT_BACKOFF_FIRST_NS : (c->backoff * 2 < max ? c->backoff * 2 : max);
	if (!c->first && now<c->takeover_at && * next> c->takeover_at)
		*next = c->takeover_at;
	if (*next > c->deadline)
		*next = c->deadline;
}

void commit_poll(struct commit *c, int64_t now, int64_t *next, struct commit_result *r)
{
	bool committing = c->first || now >= c->takeover_at;
	size_t in = 0, before;
	int rc;

	memset(r, 0, sizeof(*r));
	r->state = COMMIT_WAITING;
	*next = now + c->backoff;
	c->polls++;
	if (!c->part_done && put_own_part(c, r))
		return;
	if (c->part_done && find_manifest(c, r))
		return;
	rc = c->part_done ? roster_get(c, c->problem) : -EAGAIN;
	if (rc == -EEXIST || rc == -ENOMEM) {
		r->state = COMMIT_FAILED;
		snprintf(r->reason, sizeof(r->reason), "step %" PRId64 ": %s", c->step,
		         rc == -ENOMEM ? "out of memory" : c->problem);
		return;
	}
	before = rc == 0 ? parts_seen(c) : 1;
	if (rc == 0 && roster_complete(c->roster))
		rc = look_parts(c, committing, &in);
	if (rc == -ESTALE) {
		roster_drop(c); /* built again at the next poll */
	} else if (rc == 0 && committing && roster_complete(c->roster) && in == c->roster->nnodes) {
		if (commit_now(c, r))
			return;
	}
	if (c->roster)
		progress(c, r);
	if (now >= c->deadline) {
		expire(c, r);
		r->visible = c->unsynced;
		return;
	}
	next_poll(c, now, in > before, next);
}
