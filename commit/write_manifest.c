/*
 * write_manifest.c: the manifest of a step (commit.h, commit_int.h): found
 * by exact name and judged for this run and this node's files
 * (find_manifest); the parts merged and checked (one run, each rank once,
 * every shard there at its size, the held boxes covered); written
 * create-once, and LATEST moved forward (write_manifest).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commit/commit_int.h"
#include "commit/shares.h"
#include "layout/cover.h"

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
 * A manifest of another run, or of this run at another world: the step
 * FAILED for this node (r says why). true: so.
 */
static bool not_this_run(const struct commit *c, const struct manifest *m, struct commit_result *r)
{
	const struct part *own = c->own;

	if (strcmp(m->run, own->run) == 0 && m->world != own->world) {
		r->state = COMMIT_FAILED;
		snprintf(r->reason, sizeof(r->reason),
		         "step %" PRId64 " was committed with world %d, this node's ranks are of "
		         "world %d",
		         c->step, m->world, own->world);
		return true;
	}
	if (strcmp(m->run, own->run) != 0) {
		r->state = COMMIT_FAILED;
		r->superseded = true; /* nothing can name this node's files now */
		snprintf(r->reason, sizeof(r->reason),
		         "step %" PRId64 " was committed by run %s of the job, without this save "
		         "(run %s)",
		         c->step, m->run, own->run);
		return true;
	}
	return false;
}

/*
 * 1: the manifest is there, and r says what it means for this run; 0: not
 * there, or not readable (then problem says why: it may be an NFS cache,
 * and the deadline decides).
 */
int find_manifest(struct commit *c, struct commit_result *r)
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
	if (not_this_run(c, m, r)) {
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
bool write_manifest(struct committer *cm, struct part *const *v, size_t n,
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
