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
 * Divisions: the committer; parts of the others; the manifest; polling; by
 * hand.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commit.h"
#include "cover.h"
#include "fanout.h"
#include "roster.h"
#include "shares.h"

struct committer {
	struct commit_opts o;
	char node[IPC_MAX_JOB + 1];
	struct roster_cache rosters; /* complete ones, per (job, run) */
	struct assigned **assigned; /* at most one per job (committer_assigned) */
	size_t nassigned;
};

struct commit {
	struct committer *cm;
	struct part *own;
	int64_t step;
	bool first;
	bool part_tried, part_done; /* this node's part: written (or tried), and known durable */
	int64_t t0, takeover_at, deadline;
	int64_t backoff;
	unsigned polls;
	struct roster *roster; /* complete: cached in cm; else ours to free */
	bool whole; /* a roster was wrong: the step's next one from the plans files whole */
	/*
	 * [roster->nnodes]: those read (where this node commits). Of several
	 * nodes, each part's tensors go once names counted and checked them
	 * (part_strip): the commit holds the parts' ranks, not their chunks.
	 */
	struct part **parts;
	struct names *names; /* the tensors of the parts read, counted */
	bool holds; /* a part read says what its ranks hold: the commit reads them whole */
	bool reading; /* this node commits (or took over): it reads the others' parts */
	char merge[IPC_ERRLEN]; /* the parts read cannot make one checkpoint: why */
	bool *seen; /* [roster->nnodes]: there (a stat is enough) */
	uint64_t *bad; /* [roster->nnodes]: the size of a part that did not parse; 0 */
	char problem[IPC_ERRLEN]; /* the last thing wrong with a part or plans file */
	bool unsynced; /* this node's put of the manifest failed after it was visible */
};

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

/* What the step looked at under its roster (the others' parts read, seen, bad): gone. */
static void forget_parts(struct commit *c)
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

/* Whether this node's assignment of the parts' run tells that they cover every box. */
static bool by_assignment(const struct committer *cm, struct part *const *v, size_t n)
{
	char why[IPC_ERRLEN];

	for (size_t i = 0; n && i < cm->nassigned; i++) {
		const struct assigned *x = cm->assigned[i];

		if (strcmp(x->job, v[0]->job) == 0 && strcmp(x->run, v[0]->run) == 0)
			return assigned_covers(x, v, n, why);
	}
	return false;
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

/* ---- the others' parts ------------------------------------------------- */

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
static int plans_file_disagrees(struct storage *s, const struct part *p, bool need, char *why)
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
static int part_unbound(struct storage *s, const struct part *p, int64_t step, char *why)
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
static int look(struct commit *c, bool reading, size_t *in)
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

/* ---- the manifest ------------------------------------------------------ */

/*
 * A manifest of this run that names, for one of this node's ranks, a file
 * other than this save's: an earlier attempt's, which must be there at its
 * size, or the checkpoint cannot load. Then this node is not told COMMITTED
 * (and keeps its files). 0: every rank's file is there.
 */
static int own_files_missing(struct commit *c, const struct manifest *m, char *why)
{
	struct storage *s = c->cm->o.store;
	char msg[IPC_ERRLEN];
	uint64_t size;

	for (size_t i = 0; i < c->own->nranks; i++) {
		const struct part_rank *k = &c->own->ranks[i];
		const struct manifest_rank *mr =
		    k->rank < (int)m->nranks ? &m->ranks[k->rank] : NULL;
		int rc;

		if (mr && strcmp(mr->file, k->file) == 0)
			continue;
		rc = mr ? s->ops->shard_stat(s, m->job, m->step, mr->file, &size, msg) : -ENOENT;
		if (rc == 0 && size == mr->size)
			continue;
		if (rc &&
		    rc != -ENOENT) /* cannot tell now (an NFS hiccup?): the deadline decides */
			return ipc_errf(c->problem, rc, "the manifest names %s for rank %d: %s",
			                mr->file, k->rank, msg);
		return ipc_errf(why, -EIO,
		                "step %" PRId64 " was committed naming %s for rank %d, where this "
		                "node saved %s, and that file %s: the checkpoint cannot load "
		                "(ckptctl verify says more); this node's files are kept",
		                c->step, mr ? mr->file : "no file", k->rank, k->file,
		                rc ? "is not there" : "is not its size");
	}
	return 0;
}

/*
 * A head of this run names this node's part by its length and XXH3-64: the
 * part this node wrote (then its files are the checkpoint's), or -EIO with
 * why (another part of this node: its trainers are not told COMMITTED,
 * and its files stay).
 */
static int own_part_named(struct commit *c, const struct manifest *m, char *why)
{
	const struct manifest_part *mp = NULL;

	for (size_t i = 0; i < m->nparts && !mp; i++)
		if (strcmp(m->parts[i].node, c->own->node) == 0)
			mp = &m->parts[i];
	if (!c->own->file_size && part_bytes_id(c->own, why))
		return -ENOMEM;
	if (mp && mp->size == c->own->file_size && mp->xxh3 == c->own->file_xxh3)
		return 0;
	return ipc_errf(why, -EIO,
	                "step %" PRId64 " was committed naming %s of node %s, not the part this "
	                "node wrote: the checkpoint does not hold this save (ckptctl verify "
	                "says more); this node's files are kept",
	                c->step, mp ? "another part" : "no part", c->own->node);
}

/*
 * 1: the manifest is there, and r says what it means for this run; 0: not
 * there, or not readable (then problem says why: it may be an NFS cache,
 * and the deadline decides).
 */
static int find_manifest(struct commit *c, struct commit_result *r)
{
	const struct part *own = c->own;
	struct storage *s = c->cm->o.store;
	char msg[IPC_ERRLEN];
	struct manifest *m = NULL;
	int rc;

	/* of several nodes, the head alone: one read, whatever the world */
	rc = store_read_manifest_head(s, own->job, c->step, &m, msg);
	if (rc == -ENOENT)
		return 0;
	if (rc) {
		snprintf(c->problem, sizeof(c->problem), "the manifest cannot be read: %s", msg);
		return 0;
	}
	if (strcmp(m->run, own->run) == 0 && m->world != own->world) {
		r->state = COMMIT_FAILED;
		snprintf(r->reason, sizeof(r->reason),
		         "step %" PRId64 " was committed with world %d, this node's ranks are of "
		         "world %d",
		         c->step, m->world, own->world);
		manifest_free(m);
		return 1;
	}
	if (strcmp(m->run, own->run) != 0) {
		r->state = COMMIT_FAILED;
		r->superseded = true; /* nothing can name this node's files now */
		snprintf(r->reason, sizeof(r->reason),
		         "step %" PRId64 " was committed by run %s of the job, without this save "
		         "(run %s)",
		         c->step, m->run, own->run);
		manifest_free(m);
		return 1;
	}
	rc = m->head_only ? own_part_named(c, m, r->reason) : own_files_missing(c, m, r->reason);
	if (rc) {
		manifest_free(m);
		if (rc != -EIO)
			return 0; /* not known yet: problem says why */
		r->state = COMMIT_FAILED;
		return 1;
	}
	/*
	 * Made visible by this node's put, which then failed (the fsync of its
	 * directory): until that fsync succeeds a crash may lose it, and no
	 * trainer is told COMMITTED. Tried at each poll; the deadline ends it.
	 */
	if (c->unsynced) {
		if (store_sync_manifest(s, own->job, c->step, msg)) {
			snprintf(c->problem, sizeof(c->problem), "%s", msg);
			manifest_free(m);
			return 0;
		}
		c->unsynced = false;
	}
	r->state = COMMIT_COMMITTED;
	r->manifest = m;
	/*
	 * Whoever sees a commit moves LATEST up to it: the writer may have died
	 * before it did, or a writer of an older step may have passed over it.
	 * Where LATEST is there already, this is one read.
	 */
	if (store_latest_advance(s, m->job, m->step, msg))
		snprintf(r->reason, sizeof(r->reason), "committed, but LATEST was not moved: %s",
		         msg);
	return 1;
}

/* Every shard the manifest names is there at its size: a part may lie, or a file go. */
static int check_shards(struct committer *cm, const struct manifest *m, char *why)
{
	struct storage *s = cm->o.store;
	char msg[IPC_ERRLEN];
	uint64_t size;
	int rc;

	for (size_t i = 0; i < m->nranks; i++) {
		const struct manifest_rank *k = &m->ranks[i];

		rc = s->ops->shard_stat(s, m->job, m->step, k->file, &size, msg);
		if (rc == 0 && size != k->size)
			rc = -EIO;
		if (rc == -EIO)
			return ipc_errf(why, rc,
			                "rank %d's shard %s (node %s) is not the size its "
			                "part says: the step cannot be committed",
			                k->rank, k->file, manifest_node_of(m, k->rank) ?: "?");
		if (rc)
			return ipc_errf(why, rc,
			                "rank %d's shard (node %s): %s: the step cannot be "
			                "committed",
			                k->rank, manifest_node_of(m, k->rank) ?: "?", msg);
	}
	return 0;
}

static int64_t last_part_ns(struct part *const *v, size_t n)
{
	int64_t t = 0;

	for (size_t i = 0; i < n; i++)
		t = v[i]->time_unix_ns > t ? v[i]->time_unix_ns : t;
	return t;
}

/* The first part: every node's deadline counts from its own part, none earlier. */
static size_t first_part_of(struct part *const *v, size_t n)
{
	size_t k = 0;

	for (size_t i = 1; i < n; i++)
		k = v[i]->time_unix_ns < v[k]->time_unix_ns ? i : k;
	return k;
}

static int64_t first_part_ns(struct part *const *v, size_t n)
{
	return n ? v[first_part_of(v, n)]->time_unix_ns : INT64_MAX;
}

/*
 * The parts whole, merged (manifest_merge's checks) and their held boxes
 * covered (cover_check): for one node's part, the manifest itself (format
 * 2 or 3); of several, only where a rank says what it holds, the check
 * before the head (then *out is NULL). Parts let go of their tensors
 * (part_strip) are read again, each the same bytes as read before. 0;
 * -EINVAL: they cannot make a checkpoint (why); else not now (why).
 */
static int merge_whole(struct committer *cm, struct part *const *v, size_t n, bool keep,
                       struct manifest **out, char *why)
{
	struct part **w = calloc(n, sizeof(*w)), **fresh = calloc(n, sizeof(*fresh));
	char msg[IPC_ERRLEN];
	struct manifest *m = NULL;
	int rc = w && fresh ? 0 : -ENOMEM;

	*out = NULL;
	for (size_t i = 0; !rc && i < n; i++) {
		bool stripped = v[i]->nranks && !v[i]->ranks[0].tensors;

		w[i] = v[i];
		if (!stripped)
			continue;
		rc =
		    store_read_part(cm->o.store, v[i]->job, v[i]->step, v[i]->node, &fresh[i], msg);
		if (!rc && fresh[i]->file_xxh3 != v[i]->file_xxh3)
			rc = ipc_errf(msg, -ESTALE, "parts/%s.json changed while it was merged",
			              v[i]->node);
		w[i] = fresh[i];
	}
	if (rc) {
		ipc_errf(why, rc == -EINVAL ? -EIO : rc, "reading the parts again: %s",
		         rc == -ENOMEM ? "out of memory" : msg);
		rc = rc == -EINVAL ? -EIO : rc;
		goto out;
	}
	if ((rc = manifest_merge(w, n, &m, msg)))
		ipc_errf(why, -EINVAL, "the parts do not merge: %s", msg);
	else if ((rc = cover_check(m, msg)))
		ipc_errf(why, -EINVAL, "the parts leave a hole: %s", msg);
	rc = rc ? -EINVAL : 0;
	if (!rc && keep) {
		*out = m;
		m = NULL;
	}
out:
	manifest_free(m);
	for (size_t i = 0; fresh && i < n; i++)
		part_free(fresh[i]);
	free(fresh);
	free(w);
	return rc;
}

/* The tensors of whole parts, counted (and checked as a merge would). */
static int count_tensors(struct part *const *v, size_t n, size_t *count, char *why)
{
	struct names *t = NULL;
	int rc = names_create(&t);

	for (size_t i = 0; !rc && i < n; i++)
		rc = names_add(t, v[i], why);
	*count = names_count(t);
	names_free(t);
	return rc == -ENOMEM ? ipc_errf(why, rc, "out of memory") : rc;
}

/*
 * What parts[0..n) commit, checked: of one node, the whole manifest
 * (merged, covered, every shard there at its size); of several, the head
 * (format 4: each part's files were checked as it was read, the tensors
 * as they were counted into names; NULL: the parts are whole, counted
 * here). 0; -EINVAL: they cannot make a checkpoint; else not now.
 */
static int merge(struct committer *cm, struct part *const *v, size_t n, const struct names *names,
                 bool holds, struct manifest **out, bool *assigned, char *why)
{
	char msg[IPC_ERRLEN];
	size_t tensors = names_count(names);
	int rc;

	*out = NULL;
	*assigned = false;
	if (n == 1) {
		rc = merge_whole(cm, v, n, true, out, why);
		if (!rc && (rc = check_shards(cm, *out, why))) {
			manifest_free(*out);
			*out = NULL;
		}
		return rc;
	}
	if (!names && (rc = count_tensors(v, n, &tensors, msg)))
		return ipc_errf(why, rc, "the parts do not merge: %s", msg);
	*assigned = holds && by_assignment(cm, v, n);
	if (holds && !*assigned && (rc = merge_whole(cm, v, n, false, out, why)))
		return rc;
	if ((rc = manifest_merge_head(v, n, tensors, out, msg)))
		return ipc_errf(why, rc == -ENOMEM ? rc : -EINVAL, "the parts do not merge: %s",
		                msg);
	return 0;
}

/*
 * Merges parts[0..n) (merge), writes the manifest create-once and moves
 * LATEST. r: COMMITTED (written), FAILED (the parts cannot make a
 * checkpoint), or WAITING: another agent wrote it first (the caller reads
 * it), or something may pass (problem says what). deadline_ns: no manifest
 * later than that many ns after the first part (every node counts its
 * deadline from its own part, no earlier: none has given up before it);
 * 0: none (by hand). Returns true when the put failed after the manifest
 * became visible (problem says how): it is there, not known durable.
 */
static bool write_manifest(struct committer *cm, struct part *const *v, size_t n,
                           const struct names *names, bool holds, int64_t deadline_ns,
                           struct commit_result *r, char *problem)
{
	struct storage *s = cm->o.store;
	char msg[IPC_ERRLEN];
	struct manifest *m = NULL;
	bool unsynced = false;
	int rc;

	r->state = COMMIT_WAITING;
	rc = merge(cm, v, n, names, holds, &m, &r->by_assignment, msg);
	if (rc == -EINVAL) {
		r->state = COMMIT_FAILED;
		snprintf(r->reason, sizeof(r->reason), "%s", msg);
		return false;
	}
	if (!rc && deadline_ns && ipc_now_ns() > first_part_ns(v, n) + deadline_ns) {
		size_t k = first_part_of(v, n);

		/*
		 * Where an earlier try failed (a full disk, an I/O error on the
		 * manifest), that failure is why the deadline passed: it stays
		 * what the step's reason says.
		 */
		if (!problem[0])
			snprintf(problem, IPC_ERRLEN,
			         "node %s's part was written %.0f s ago by its clock, past the "
			         "commit deadline (%lld s): not committed (a node that gave up "
			         "may have removed its files; are the nodes' clocks in step?)",
			         v[k]->node, (double)(ipc_now_ns() - v[k]->time_unix_ns) / 1e9,
			         (long long)(deadline_ns / 1000000000));
		manifest_free(m);
		return false;
	}
	if (!rc)
		rc = store_put_manifest(s, m, msg);
	if (rc && rc != -EEXIST) {
		/* the link may have happened before the error: then it is there */
		unsynced = m && store_committed(s, m->job, m->step);
		snprintf(problem, IPC_ERRLEN, "%s", msg);
		if (unsynced)
			rc = -EEXIST;
	}
	if (rc) { /* EEXIST: written by someone (the caller reads it back) */
		manifest_free(m);
		return unsynced;
	}
	r->state = COMMIT_COMMITTED;
	r->wrote = true;
	r->latency_ns = ipc_now_ns() - last_part_ns(v, n);
	r->manifest = m;
	/* LATEST is a hint: a failure here is said, and the commit stands. */
	if (store_latest_advance(s, m->job, m->step, msg))
		snprintf(r->reason, sizeof(r->reason), "committed, but LATEST was not moved: %s",
		         msg);
	return false;
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

void commit_poll(struct commit *c, int64_t now, int64_t *next, struct commit_result *r)
{
	struct storage *s = c->cm->o.store;
	bool committing = c->first || now >= c->takeover_at;
	int64_t max;
	char msg[IPC_ERRLEN];
	size_t in = 0, before;
	int rc;

	memset(r, 0, sizeof(*r));
	r->state = COMMIT_WAITING;
	*next = now + c->backoff;
	c->polls++;
	if (!c->part_done) {
		/* tried: from here on, a commit elsewhere may name this node's files */
		c->part_tried = true;
		rc = store_put_part(s, c->own, msg);
		if (rc == -EFBIG || rc == -EOVERFLOW) { /* no poll makes it smaller: once */
			r->state = COMMIT_FAILED;
			snprintf(r->reason, sizeof(r->reason),
			         "step %" PRId64 ": this node's part cannot be written: %s",
			         c->step, msg);
			return;
		}
		if (rc)
			snprintf(c->problem, sizeof(c->problem), "writing this node's part: %s",
			         msg);
		/* EEXIST: the step is committed; the manifest says with which part */
		c->part_done = rc == 0 || rc == -EEXIST;
	}
	if (c->part_done && find_manifest(c, r))
		return;
	rc = c->part_done ? roster_get(c, c->problem) : -EAGAIN;
	if (rc == -EEXIST || rc == -ENOMEM) {
		r->state = COMMIT_FAILED;
		snprintf(r->reason, sizeof(r->reason), "step %" PRId64 ": %s", c->step,
		         rc == -ENOMEM ? "out of memory" : c->problem);
		return;
	}
	before = c->seen ? 0 : 1; /* this node's own part is in from the start */
	for (size_t i = 0; rc == 0 && c->seen && i < c->roster->nnodes; i++)
		before += c->seen[i];
	if (rc == 0 && roster_complete(c->roster))
		rc = look(c, committing, &in);
	if (rc == -ESTALE) {
		roster_drop(c); /* built again at the next poll */
	} else if (rc == 0 && committing && roster_complete(c->roster) && in == c->roster->nnodes) {
		if (c->merge[0]) {
			r->state = COMMIT_FAILED;
			snprintf(r->reason, sizeof(r->reason), "the parts do not merge: %s",
			         c->merge);
			return;
		}
		if (write_manifest(c->cm, c->parts, c->roster->nnodes, c->names, c->holds,
		                   c->cm->o.deadline_ns, r, c->problem))
			c->unsynced = true; /* find_manifest makes it durable first */
		if (r->state != COMMIT_WAITING || find_manifest(c, r))
			return;
	}
	if (c->roster)
		progress(c, r);
	if (now >= c->deadline) {
		expire(c, r);
		r->visible = c->unsynced;
		return;
	}
	/*
	 * Back-off: 20 ms doubling to 500 ms; again from 20 ms when a part comes
	 * in. A watching node sees no part come in: it looks for the manifest
	 * at least every 200 ms (one small request).
	 */
	max = c->reading ? COMMIT_BACKOFF_MAX_NS : COMMIT_WATCH_MAX_NS;
	c->backoff =
	    in > before ? COMMIT_BACKOFF_FIRST_NS : (c->backoff * 2 < max ? c->backoff * 2 : max);
	if (!c->first && now<c->takeover_at && * next> c->takeover_at)
		*next = c->takeover_at;
	if (*next > c->deadline)
		*next = c->deadline;
}

/* ---- by hand ----------------------------------------------------------- */

/* The parts in the root of (job, step), of every node that published plans. */
static int gather(struct committer *cm, const char *job, int64_t step, struct part ***out,
                  size_t *n, char *problems, size_t plen)
{
	char **names = NULL, msg[IPC_ERRLEN];
	struct part **v, *p;
	size_t cnt = 0, o = 0;
	int rc;

	*out = NULL;
	*n = 0;
	rc = store_list_nodes(cm->o.store, job, &names, &cnt, msg);
	if (rc)
		return ipc_errf(problems, rc, "%s", msg);
	v = calloc(cnt + 1, sizeof(*v));
	for (size_t i = 0; v && i < cnt; i++) {
		rc = store_read_part(cm->o.store, job, step, names[i], &p, msg);
		if (rc == 0 && ((rc = plans_file_disagrees(cm->o.store, p, false, msg)) ||
		                (rc = part_unbound(cm->o.store, p, step, msg))))
			part_free(p);
		if (rc == 0)
			v[(*n)++] = p;
		else if (rc != -ENOENT && o < plen)
			o += (size_t)snprintf(problems + o, plen - o, "%s%s", o ? "; " : "", msg);
	}
	for (size_t i = 0; i < cnt; i++)
		free(names[i]);
	free(names);
	*out = v;
	return v ? 0 : -ENOMEM;
}

/* Of the parts, those of one run that hold every rank once: into sel, how many. */
static size_t pick_run(struct part **v, size_t n, struct part **sel, char *why)
{
	size_t best = 0, bestn = 0;
	const char *bestrun = NULL;

	for (size_t i = 0; i < n; i++) {
		size_t k = 0, ranks = 0;

		for (size_t j = 0; j < n; j++)
			if (strcmp(v[j]->run, v[i]->run) == 0 && v[j]->world == v[i]->world) {
				sel[k++] = v[j];
				ranks += v[j]->nranks;
			}
		if (ranks == (size_t)v[i]->world)
			return k; /* merge checks that each rank is there once */
		if (ranks > best) {
			best = ranks;
			bestn = k;
			bestrun = v[i]->run;
		}
	}
	if (bestrun)
		snprintf(why, IPC_ERRLEN, "the parts of run %s hold %zu of %d ranks (%zu parts)",
		         bestrun, best, v[0]->world, bestn);
	else
		snprintf(why, IPC_ERRLEN, "no node has written a part of this step");
	return 0;
}

int commit_finish(struct committer *cm, const char *job, int64_t step, struct commit_result *r,
                  bool *already, char *err)
{
	char problems[IPC_ERRLEN] = "", why[IPC_ERRLEN];
	struct part **v = NULL, **sel = NULL;
	size_t n = 0, k;
	int rc;

	memset(r, 0, sizeof(*r));
	*already = false;
	if ((rc = ipc_check_job(job, err)) || (rc = ipc_check_step(step, err)))
		return rc;
	rc = store_read_manifest(cm->o.store, job, step, &r->manifest, why);
	if (rc == 0) {
		*already = true;
		r->state = COMMIT_COMMITTED;
		return 0;
	}
	if (rc != -ENOENT)
		return ipc_errf(err, rc, "%s", why);
	rc = gather(cm, job, step, &v, &n, problems, sizeof(problems));
	if (rc)
		return ipc_errf(err, rc, "job %s step %" PRId64 ": %s", job, step, problems);
	sel = calloc(n + 1, sizeof(*sel));
	k = sel ? pick_run(v, n, sel, why) : 0;
	if (!sel)
		rc = ipc_errf(err, -ENOMEM, "out of memory");
	else if (k == 0)
		rc = ipc_errf(err, -ENOENT, "job %s step %" PRId64 " cannot be committed: %s%s%s",
		              job, step, why, problems[0] ? "; " : "", problems);
	else {
		why[0] = '\0';
		/* there after a failed put: committed once it is durable */
		if (write_manifest(cm, sel, k, NULL, true, 0, r, why) &&
		    store_sync_manifest(cm->o.store, job, step, why) == 0)
			why[0] = '\0';
		if (r->state == COMMIT_WAITING && why[0]) {
			rc = ipc_errf(err, -EIO, "job %s step %" PRId64 ": %s", job, step, why);
		} else if (r->state == COMMIT_WAITING) { /* someone else was faster */
			rc = store_read_manifest(cm->o.store, job, step, &r->manifest, why);
			*already = rc == 0;
			r->state = rc == 0 ? COMMIT_COMMITTED : COMMIT_FAILED;
			if (rc)
				rc = ipc_errf(err, rc, "%s", why);
		} else if (r->state == COMMIT_FAILED) {
			rc = ipc_errf(err, -EIO, "job %s step %" PRId64 ": %s", job, step,
			              r->reason);
		}
	}
	for (size_t i = 0; i < n; i++)
		part_free(v[i]);
	free(v);
	free(sel);
	return rc;
}
