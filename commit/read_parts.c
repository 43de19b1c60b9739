/*
 * read_parts.c: the other nodes' parts of a step, read and judged (commit.h,
 * commit_int.h). Where this node commits, each part not in yet is read (its
 * summary first, where the roster knows what its ranks hold), COMMIT_READ_WIDTH
 * at once, and joins only if it is of this run, holds the ranks the roster
 * gives its node, the tensors its plans name, and files stamped as it says;
 * its tensors are counted under the poll's mutex, then let go.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commit/commit_int.h"
#include "storage/io/fanout.h"

/* What the step looked at under its roster (the others' parts read, seen, bad): gone. */
void forget_parts(struct commit *c)
{
	for (size_t i = 0; c->parts && c->roster && i < c->roster->nnodes; i++)
		if (c->parts[i] != c->own)
			part_free(c->parts[i]);
	free(c->parts);
	free(c->seen);
	free(c->bad);
	names_free(c->names);
	c->parts = NULL;
	c->seen = NULL;
	c->bad = NULL;
	c->names = NULL;
	c->holds = false;
	c->merge[0] = '\0';
}

static bool same_ranks(const struct part *p, const struct rnode *n)
{
	if (p->nranks != n->nranks)
		return false;
	for (size_t i = 0; i < n->nranks; i++)
		if (p->ranks[i].rank != n->ranks[i])
			return false;
	return true;
}

/* Whether a part's ranks hold the tensors sigs say (0), or which rank does not (its index). */
static int sigs_differ(const struct part *p, const uint64_t *sigs, size_t *at)
{
	for (size_t j = 0; j < p->nranks; j++) {
		uint64_t sig;
		int rc = part_rank_signature(&p->ranks[j], &sig);

		if (rc)
			return rc;
		if (sig != sigs[j]) {
			*at = j;
			return 1;
		}
	}
	return 0;
}

/*
 * A part holds, for each rank, the tensors its node's plans file names (one
 * lost, renamed or reshaped would commit a checkpoint that cannot load),
 * checked against the plans file as it is. A plans file of another run or
 * other ranks (the node moved on) cannot say: then, by hand (!need),
 * nothing is checked.
 * 0: they agree; else why is said.
 */
int plans_file_disagrees(struct storage *s, const struct part *p, bool need, char *why)
{
	struct plans_file *f = NULL;
	uint64_t *sigs = NULL;
	char msg[IPC_ERRLEN];
	size_t at = 0;
	int rc = store_read_plans(s, p->job, p->node, &f, msg);

	if (rc == 0 &&
	    (strcmp(f->run, p->run) != 0 || f->world != p->world || f->nranks != p->nranks))
		rc = -ESTALE;
	for (size_t j = 0; rc == 0 && j < f->nranks; j++)
		if (f->ranks[j].rank != p->ranks[j].rank)
			rc = -ESTALE;
	if (rc == 0)
		rc = plans_sigs(f, &sigs);
	if (rc == 0)
		rc = sigs_differ(p, sigs, &at);
	plans_free(f);
	free(sigs);
	if (rc == 0 || (!need && rc != 1 && rc != -ENOMEM))
		return 0; /* by hand, a plans file that cannot say (the node moved on) checks
		             nothing */
	if (rc == 1)
		return ipc_errf(
		    why, -EINVAL,
		    "parts/%s.json: rank %d's tensors are not those its plans "
		    "(plans/%s.json) name (a tensor lost, renamed or reshaped): it cannot "
		    "join a checkpoint",
		    p->node, p->ranks[at].rank, p->node);
	return ipc_errf(why, rc == -ENOMEM ? rc : -EINVAL,
	                "parts/%s.json: its ranks are not those of plans/%s.json%s%s", p->node,
	                p->node, rc == -ESTALE ? "" : ": ", rc == -ESTALE ? "" : msg);
}

/*
 * The same, against the roster's copy of the plans first (read once per
 * run). 0: they agree; 1: not (why); -ESTALE: the node's plans changed
 * since the roster was read, and the part holds what they say now: the
 * roster, and the tensors it counted, are read again.
 */
static int plans_disagree(struct commit *c, const struct rnode *n, const struct part *p, char *why)
{
	size_t at = 0;
	int rc;

	if (!n->sigs || (rc = sigs_differ(p, n->sigs, &at)) == 0)
		return 0;
	if (rc < 0) {
		ipc_errf(why, rc, "out of memory");
		return 1;
	}
	if (plans_file_disagrees(c->cm->o.store, p, true, why))
		return 1;
	snprintf(why, IPC_ERRLEN,
	         "plans/%s.json changed since this run's roster was read: read again", n->name);
	return -ESTALE;
}

/*
 * Whether each of a part's files is what the part says (store_check_file:
 * there, its size, its header stamped with this step and the part's save):
 * a part copied from another step or attempt (a replay, a stale writer)
 * names files whose headers say otherwise, and never joins; its node's own
 * part replaces it (store_put_part). One small read per rank of the part,
 * each time it is read. 0, or why not into why.
 */
int part_unbound(struct storage *s, const struct part *p, int64_t step, char *why)
{
	char msg[IPC_ERRLEN];
	int rc = 0;

	for (size_t j = 0; j < p->nranks && !rc; j++) {
		const struct part_rank *k = &p->ranks[j];
		const struct store_claim cl = {p->run,          step,   k->rank, k->file, k->size,
		                               k->header_bytes, k->save};

		rc = store_check_bound(s, p->job, &cl, msg);
		if (rc)
			ipc_errf(why, rc,
			         "parts/%s.json, rank %d: %s: it does not join (a part must be "
			         "of the files it names)",
			         p->node, k->rank, msg);
	}
	return rc == -ENOENT ? -EBADMSG : rc; /* a file it names is not there */
}

/*
 * What a part (or its summary) must be of before anything else: this run,
 * the ranks the roster gives its node, a time not ahead of this node's
 * clock. 1: so; 0: not (problem says why); -ESTALE: the roster is wrong.
 */
static int part_joins(const struct commit *c, const struct rnode *n, const struct part *p,
                      char *problem)
{
	const struct part *own = c->own;
	char ranks[128];

	if (strcmp(p->run, own->run) != 0) {
		/* a run that died left it; the node's part of this run replaces it */
		snprintf(problem, IPC_ERRLEN,
		         "parts/%s.json is of run %s, not run %s: a part of another run never "
		         "joins",
		         n->name, p->run, own->run);
		return 0;
	}
	if (p->world != own->world || !same_ranks(p, n)) {
		part_ranks_text(n->ranks, n->nranks, ranks, sizeof(ranks));
		snprintf(problem, IPC_ERRLEN,
		         "parts/%s.json (world %d) does not hold the ranks its plans name (%s of "
		         "world %d)",
		         n->name, p->world, ranks, own->world);
		return -ESTALE;
	}
	if (p->time_unix_ns > ipc_now_ns() + c->cm->o.deadline_ns) {
		snprintf(
		    problem, IPC_ERRLEN,
		    "parts/%s.json is stamped %.0f s ahead of this node's clock: are the nodes' "
		    "clocks in step (NTP)?",
		    n->name, (double)(p->time_unix_ns - ipc_now_ns()) / 1e9);
		return 0;
	}
	return 1;
}

/*
 * Node i's part, as its summary says it (read_part's checks, but what the
 * ranks hold: against the roster's plans, whose tensors the roster
 * counted; and its part there at the length it says, one stat). 1: in;
 * 0: not (then the part itself is read); -ESTALE: its plans changed since
 * the roster was read (the roster is read again, and the names with it).
 */
static int summary_in(struct commit *c, size_t i, struct part *p, char *problem)
{
	const struct rnode *n = &c->roster->nodes[i];
	struct storage *s = c->cm->o.store;
	char key[STORE_KEY_MAX], msg[IPC_ERRLEN];
	uint64_t size = 0;
	int rc = part_joins(c, n, p, problem), d;

	if (rc == 1 && (d = plans_disagree(c, n, p, problem)))
		rc = d == -ESTALE ? d : 0;
	/* the part it describes is there at the length it says (else the part says) */
	store_part_key(key, sizeof(key), p->job, p->step, p->node);
	if (rc == 1 && (s->ops->obj_stat(s, key, &size, msg) || size != p->file_size)) {
		snprintf(problem, IPC_ERRLEN,
		         "parts/%s.sum says its part is %" PRIu64 " bytes, parts/%s.json is %s",
		         n->name, p->file_size, n->name, size ? "another length" : "not there");
		rc = 0;
	}
	if (rc == 1 && part_unbound(c->cm->o.store, p, c->step, problem))
		rc = 0;
	if (rc == 1)
		c->parts[i] = p;
	else
		part_free(p);
	return rc;
}

/*
 * Node i's part, where this node commits: read and checked (this run, the
 * roster's ranks, the files' stamps). 1: in (parts[i]); 0: not (yet: what
 * was wrong, into problem); -ESTALE: the roster is wrong. Runs on several
 * threads at once, each its own i.
 */
static int read_part(struct commit *c, size_t i, char *problem)
{
	const struct rnode *n = &c->roster->nodes[i];
	const struct part *own = c->own;
	struct storage *s = c->cm->o.store;
	char msg[IPC_ERRLEN], key[STORE_KEY_MAX];
	struct part *p = NULL;
	uint64_t size = 0;
	int rc;

	/*
	 * Its summary, where the roster knows what its ranks hold: small,
	 * whatever the part. Else (none yet, an older node's) the part itself.
	 */
	rc = c->roster->names && n->sigs
	         ? store_read_part_summary(s, own->job, c->step, n->name, &p, msg)
	         : -ENOENT;
	if (rc == 0 && (rc = summary_in(c, i, p, problem)) != 0)
		return rc;
	/* no summary, one that does not parse or does not join: the part says */
	if (rc && rc != -ENOENT)
		snprintf(problem, IPC_ERRLEN, "%s", msg);
	/* A part that did not parse is read again once it changed (or every 16th poll). */
	store_part_key(key, sizeof(key), own->job, c->step, n->name);
	if (c->bad[i] && c->polls % 16 && s->ops->obj_stat(s, key, &size, msg) == 0 &&
	    size == c->bad[i])
		return 0;
	rc = store_read_part(s, own->job, c->step, n->name, &p, msg);
	if (rc == -ENOENT)
		return 0;
	if (rc) {
		snprintf(problem, IPC_ERRLEN, "%s", msg);
		if ((rc == -EINVAL || rc == -EFBIG) && s->ops->obj_stat(s, key, &size, msg) == 0)
			c->bad[i] = size;
		return 0;
	}
	if ((rc = part_joins(c, n, p, problem)) != 1) {
		part_free(p);
		return rc;
	}
	if ((rc = plans_disagree(c, n, p, problem)) || part_unbound(s, p, c->step, problem)) {
		part_free(p);
		return rc == -ESTALE ? rc : 0;
	}
	c->parts[i] = p;
	return 1;
}

static bool has_holds(const struct part *p)
{
	for (size_t j = 0; j < p->nranks; j++)
		if (p->ranks[j].holds || p->ranks[j].wrote_less)
			return true;
	return false;
}

/* The parts of one look, read at once: each result, then the tensors counted under mu. */
struct reading {
	struct commit *c;
	pthread_mutex_t mu;
	const size_t *idx; /* the nodes whose parts are read */
	int rc; /* -ESTALE or -ENOMEM: the first such */
};

static void read_one(void *arg, size_t k)
{
	struct reading *rd = arg;
	struct commit *c = rd->c;
	size_t i = rd->idx[k];
	char problem[IPC_ERRLEN] = "", why[IPC_ERRLEN] = "";
	int rc = read_part(c, i, problem);
	struct part *p = rc == 1 ? c->parts[i] : NULL;

	pthread_mutex_lock(&rd->mu);
	if (p && !p->summary && !c->merge[0] && names_add(c->names, p, why))
		snprintf(c->merge, sizeof(c->merge), "%s", why);
	if (p && has_holds(p))
		c->holds = true;
	if (problem[0])
		snprintf(c->problem, sizeof(c->problem), "%s", problem);
	if (rc < 0 && !rd->rc)
		rd->rc = rc;
	c->seen[i] = rc == 1;
	pthread_mutex_unlock(&rd->mu);
	/* counted: of many nodes, what the head needs stays (holds: the commit reads again) */
	if (p && p != c->own)
		part_strip(p);
}

/* The parts not in yet, read at once (COMMIT_READ_WIDTH in flight). */
static int read_parts(struct commit *c)
{
	size_t n = c->roster->nnodes, k = 0;
	size_t *idx = malloc(n * sizeof(*idx));
	struct reading rd = {.c = c, .idx = idx};

	if (!idx)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++)
		if (!c->parts[i])
			idx[k++] = i;
	pthread_mutex_init(&rd.mu, NULL);
	fanout_run(k, COMMIT_READ_WIDTH, read_one, &rd);
	pthread_mutex_destroy(&rd.mu);
	free(idx);
	return rd.rc;
}

/*
 * Where this node commits, reads every part not in yet; else looks at none
 * (a watching node reads the manifest alone: O(1) per step, whatever the
 * nodes). *in: how many parts are in.
 */
int look_parts(struct commit *c, bool reading, size_t *in)
{
	size_t n = c->roster->nnodes;
	char why[IPC_ERRLEN];
	int rc = 0;

	if (!c->parts) {
		c->parts = calloc(n, sizeof(*c->parts));
		c->seen = calloc(n, sizeof(*c->seen));
		c->bad = calloc(n, sizeof(*c->bad));
		if (!c->parts || !c->seen || !c->bad) {
			forget_parts(c);
			return -ENOMEM;
		}
		c->parts[0] = c->own;
		c->seen[0] = true;
		c->holds = has_holds(c->own);
	}
	if (reading && !c->names) {
		/* the others' tensors as the roster's plans name them, where they agree */
		if (!c->own->file_size && (rc = part_bytes_id(c->own, why)))
			return rc;
		if (!c->roster->named && (rc = roster_name(&c->cm->rosters, c->roster, c->problem)))
			return rc; /* -ESTALE: the roster is read again */
		if (c->roster->names ? names_copy(c->roster->names, &c->names)
		                     : names_create(&c->names))
			return -ENOMEM;
		if (names_add(c->names, c->own, why))
			snprintf(c->merge, sizeof(c->merge), "%s", why);
	}
	c->reading = reading;
	if (reading)
		rc = read_parts(c);
	*in = 0;
	for (size_t i = 0; i < n; i++)
		*in += c->seen[i];
	return rc;
}
