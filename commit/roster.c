/*
 * roster.c: who holds which rank of one run of a job (roster.h), read from
 * the shared root: the run's roster file, the plans summaries, or the plans
 * files whole (docs/DESIGN.md §6.5). Rank 0's node reads the summaries,
 * counts the tensors from the files and writes the roster file; the other
 * nodes read that file. What other nodes wrote is hostile input: a
 * summary or roster that says otherwise than the files sends the roster to
 * the files.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "storage/io/fanout.h"
#include "commit/roster.h"

static void roster_free(struct roster *r)
{
	if (!r)
		return;
	roster_file_clear(&r->pending);
	for (size_t i = 0; i < r->nnodes; i++) {
		free(r->nodes[i].name);
		free(r->nodes[i].ranks);
		free(r->nodes[i].sigs);
	}
	free(r->nodes);
	names_free(r->names);
	free(r);
}

void roster_put(struct roster *r)
{
	if (r && atomic_fetch_sub(&r->refs, 1) == 1)
		roster_free(r);
}

bool roster_complete(const struct roster *r)
{
	size_t n = 0;

	for (size_t i = 0; i < r->nnodes; i++)
		n += r->nodes[i].nranks;
	return n == (size_t)r->world;
}

static int add_node(struct roster *r, const char *name, const int *ranks, size_t n)
{
	struct rnode *v = realloc(r->nodes, (r->nnodes + 1) * sizeof(*v));

	if (!v)
		return -ENOMEM;
	r->nodes = v;
	v = &r->nodes[r->nnodes];
	v->name = strdup(name);
	v->ranks = malloc((n ? n : 1) * sizeof(int));
	v->sigs = NULL;
	if (!v->name || !v->ranks) {
		free(v->name);
		free(v->ranks);
		return -ENOMEM;
	}
	memcpy(v->ranks, ranks, n * sizeof(int));
	v->nranks = n;
	r->nnodes++;
	return 0;
}

/*
 * What each rank of a plans file (or its summary) holds (tensors_signature),
 * malloc'd into *out.
 */
int plans_sigs(const struct plans_file *f, uint64_t **out)
{
	uint64_t *sigs = malloc((f->nranks ? f->nranks : 1) * sizeof(*sigs));
	int rc = sigs ? 0 : -ENOMEM;

	for (size_t j = 0; rc == 0 && j < f->nranks; j++)
		rc = plans_rank_signature(&f->ranks[j], &sigs[j]);
	if (rc) {
		free(sigs);
		sigs = NULL;
	}
	*out = sigs;
	return rc;
}

/* Another node, from its plans (or their summary): its ranks, and what each rank's tensors are. */
static int add_plans_node(struct roster *r, const char *name, const struct plans_file *f)
{
	int *ranks = malloc((f->nranks ? f->nranks : 1) * sizeof(int));
	uint64_t *sigs = NULL;
	int rc = ranks ? plans_sigs(f, &sigs) : -ENOMEM;

	for (size_t j = 0; rc == 0 && j < f->nranks; j++)
		ranks[j] = f->ranks[j].rank;
	if (rc == 0)
		rc = add_node(r, name, ranks, f->nranks);
	if (rc == 0) {
		r->nodes[r->nnodes - 1].sigs = sigs;
		sigs = NULL;
	}
	free(ranks);
	free(sigs);
	return rc;
}

/* `owner`[rank]: the node index holding each rank, -1 if none; a clash is -EEXIST. */
static int claim(const struct roster *r, int *owner, size_t idx, char *why)
{
	const struct rnode *n = &r->nodes[idx];

	for (size_t j = 0; j < n->nranks; j++) {
		int k = n->ranks[j];

		if (owner[k] >= 0)
			return ipc_errf(
			    why, -EEXIST,
			    "rank %d of run %s is claimed by nodes %s and %s (their plans "
			    "files): a rank runs on one node (a plans file of an earlier "
			    "incarnation under the same run? give each restart its own "
			    "CKPT_RUN)",
			    k, r->run, r->nodes[owner[k]].name, n->name);
		owner[k] = (int)idx;
	}
	return 0;
}

/* One node's plans, read: its ranks into the roster where it is of this run. */
static int roster_add(struct roster *r, int *owner, const char *name, struct plans_file *f,
                      char *why)
{
	int rc = 0;

	if (strcmp(f->run, r->run) == 0 && f->world == r->world) {
		rc = add_plans_node(r, name, f);
		if (rc == 0)
			rc = claim(r, owner, r->nnodes - 1, why);
	} else if (strcmp(f->run, r->run) == 0) {
		snprintf(why, IPC_ERRLEN,
		         "plans/%s.json says world %d for run %s, this node's plans %d", name,
		         f->world, r->run, r->world);
	}
	return rc;
}

/*
 * A node's plans of the run, kept for the roster file: as a summary says
 * them (each rank's signature, no tensors). 0, or -ENOMEM (f freed).
 */
static int keep_summary(struct roster_file *keep, struct plans_file *f)
{
	if (plans_summarize(f)) {
		plans_free(f);
		return -ENOMEM;
	}
	keep->nodes[keep->nnodes++] = f;
	return 0;
}

/*
 * Every other node's plans summary (or file, where it has none),
 * FANOUT_WIDTH at once: a batch held parsed at a time, then only its ranks'
 * signatures are kept. keep (where not NULL, room for every node listed):
 * the summaries of this run's nodes, this node's among them, in name order.
 */
static int roster_read(struct roster_cache *cache, struct roster *r, int *owner,
                       struct roster_file *keep, char *why)
{
	char **names = NULL, msg[IPC_ERRLEN];
	size_t n = 0;
	struct store_plans_read *b = calloc(FANOUT_WIDTH, sizeof(*b));
	int rc = b ? 0 : -ENOMEM;

	if (!rc && (rc = store_list_nodes(cache->store, r->job, &names, &n, msg))) {
		ipc_errf(why, rc, "listing the plans of job %s: %s", r->job, msg);
		rc = rc == -EEXIST ? -EIO : rc; /* -EEXIST says: two nodes claim one rank */
		n = 0;
		goto out;
	}
	/* ours only for the roster file: this node's part says which ranks */
	for (size_t i = 0; !keep && i < n; i++)
		if (strcmp(names[i], cache->node) == 0) { /* the listing's order kept */
			free(names[i]);
			memmove(&names[i], &names[i + 1], (--n - i) * sizeof(*names));
			break;
		}
	if (keep && !(keep->nodes = calloc(n + 1, sizeof(*keep->nodes))))
		rc = -ENOMEM;
	for (size_t i = 0, k; !rc && i < n; i += k) {
		char *batch[FANOUT_WIDTH];

		for (k = 0; k < FANOUT_WIDTH && i + k < n; k++)
			batch[k] = names[i + k];
		store_read_plans_many(cache->store, r->job, batch, k, r->whole, b);
		for (size_t j = 0; j < k; j++) {
			struct plans_file *f = b[j].f;
			const bool ours = strcmp(batch[j], cache->node) == 0;

			if (rc == -EEXIST || rc == -ENOMEM)
				;
			else if (b[j].rc && !ours)
				snprintf(why, IPC_ERRLEN, "%s",
				         b[j].msg); /* the node stays unknown */
			else if (!b[j].rc && !ours)
				rc = roster_add(r, owner, batch[j], f, why);
			if (rc == 0 && keep && f && strcmp(f->run, r->run) == 0 &&
			    f->world == r->world)
				rc = keep_summary(keep, f); /* f is keep's */
			else
				plans_free(f);
		}
		rc = rc == -EEXIST || rc == -ENOMEM ? rc : 0;
	}
out:
	for (size_t i = 0; i < n; i++)
		free(names[i]);
	free(names);
	free(b);
	return rc;
}

/* Whether f (a node's plans) holds the ranks the roster gives node n. */
static bool ranks_of(const struct rnode *n, const struct plans_file *f)
{
	bool same = f->nranks == n->nranks;

	for (size_t j = 0; same && j < f->nranks; j++)
		same = f->ranks[j].rank == n->ranks[j];
	return same;
}

/*
 * The roster as the run's roster file says it (written by the node of rank
 * 0, store_read_roster), where the file is there, of this world, of the
 * plans generation as it is now, complete, and says of this node what its
 * part does. Else -ENOENT or -ESTALE with why (the summaries say), or
 * -ENOMEM.
 */
static int roster_from_file(struct roster_cache *cache, struct roster *r, int *owner, char *why)
{
	struct roster_file *rf = NULL;
	char msg[IPC_ERRLEN];
	uint64_t gen = 0;
	bool mine = false;
	int rc = store_read_roster(cache->store, r->job, r->run, &rf, msg);

	if (rc)
		return ipc_errf(why, rc == -ENOMEM ? rc : -ENOENT, "%s", msg);
	if (rf->world != r->world)
		rc = ipc_errf(why, -ESTALE, "plans/%s.roster says world %d", r->run, rf->world);
	else if ((rc = store_plans_generation(cache->store, r->job, &gen, msg)) || !gen ||
	         gen != rf->generation) /* 0: none known, nothing says it is of the plans now */
		rc = ipc_errf(why, rc == -ENOMEM ? rc : -ESTALE,
		              "plans/%s.roster is of plans generation %016" PRIx64
		              ", not %016" PRIx64,
		              r->run, rf->generation, gen);
	for (size_t i = 0; !rc && i < rf->nnodes; i++) {
		struct plans_file *f = rf->nodes[i];

		if (strcmp(f->node, cache->node) != 0) {
			rc = roster_add(r, owner, f->node, f, why);
			continue;
		}
		if (!(mine = ranks_of(&r->nodes[0], f))) /* r->nodes as it is now: it grows */
			rc = ipc_errf(why, -ESTALE, "plans/%s.roster says other ranks of node %s",
			              r->run, cache->node);
	}
	if (rc == 0 && (!mine || !roster_complete(r)))
		rc =
		    ipc_errf(why, -ESTALE, "plans/%s.roster does not hold every rank once", r->run);
	roster_file_free(rf);
	return rc == -EEXIST ? -ESTALE : rc;
}

static int cmp_node(const void *a, const void *b)
{
	return strcmp((*(struct plans_file *const *)a)->node,
	              (*(struct plans_file *const *)b)->node);
}

/*
 * Where this node holds rank 0: the roster it read (keep: every node's
 * plans of the run, its own too), written as the run's roster file for the
 * other nodes, where it is complete, every file agreed with its summary and
 * counted its tensors (names, after roster_name) and it says of this node
 * what its part does (else -ESTALE). 0, or why it could not be written:
 * the others read the summaries meanwhile.
 */
static int roster_publish(struct roster_cache *cache, const struct roster *r,
                          struct roster_file *keep, char *why)
{
	bool mine = false;
	int rc;

	for (size_t i = 0; i < keep->nnodes; i++)
		if (strcmp(keep->nodes[i]->node, cache->node) == 0)
			mine = ranks_of(&r->nodes[0], keep->nodes[i]);
	if (!mine || !roster_complete(r) || !r->names || !keep->generation)
		return ipc_errf(why, -ESTALE, "plans/%s.roster not written: not one roster",
		                r->run);
	/* the listing's order is the keys' ("n-2.json" before "n.json"): the nodes' names' */
	qsort(keep->nodes, keep->nnodes, sizeof(*keep->nodes), cmp_node);
	keep->job = (char *)r->job;
	keep->run = (char *)r->run;
	keep->world = r->world;
	rc = store_put_roster(cache->store, keep, why);
	keep->job = keep->run = NULL;
	return rc;
}

/* Whether a plans file whole says what its node's roster entry (from a summary) says. */
static bool same_plans(const struct rnode *n, const struct roster *r, const struct plans_file *f)
{
	uint64_t *sigs = NULL;
	bool same = strcmp(f->run, r->run) == 0 && f->world == r->world && ranks_of(n, f) &&
	            n->sigs && plans_sigs(f, &sigs) == 0;

	for (size_t j = 0; same && j < f->nranks; j++)
		same = sigs[j] == n->sigs[j];
	free(sigs);
	return same;
}

/*
 * Node i's plans file, read whole (rd): its tensors counted into r->names.
 * 0; -ESTALE: it says other ranks or tensors than the summary the roster
 * was built from (a file that changed as it was read, or a summary not to
 * be trusted); -ENOMEM. A file that cannot be read or counted drops the
 * names: the parts say (read whole).
 */
static int name_node(struct roster *r, size_t i, const struct store_plans_read *rd, char *why)
{
	const struct plans_file *f = rd->f;
	char msg[IPC_ERRLEN];
	int rc = rd->rc == -ENOMEM ? rd->rc : 0;

	if (rc)
		return ipc_errf(why, rc, "%s", rd->msg);
	if (f && !same_plans(&r->nodes[i], r, f))
		return ipc_errf(why, -ESTALE,
		                "plans/%s.json says other ranks or tensors than plans/%s.sum: the "
		                "roster is read again, from the files whole",
		                f->node, f->node);
	for (size_t q = 0; rc == 0 && f && q < f->nranks; q++)
		rc = names_add_tensors(r->names, f->ranks[q].tensors, f->ranks[q].ntensors,
		                       f->ranks[q].rank, msg);
	if (rc == -EINVAL || (rc == 0 && !f)) {
		names_free(r->names);
		r->names = NULL;
		rc = 0;
	}
	return rc;
}

/*
 * Where this node commits: the tensors of the other nodes' plans, counted
 * (names_add_tensors), their files read whole FANOUT_WIDTH at once; once per
 * roster (named). -ESTALE: a file disagrees with its summary: the roster is
 * read again, from the files (name_node). Names NULL: the parts say.
 */
int roster_name(struct roster_cache *cache, struct roster *r, char *why)
{
	struct store_plans_read *b = calloc(FANOUT_WIDTH, sizeof(*b));
	int rc = b ? names_create(&r->names) : -ENOMEM;

	for (size_t i = 1, k; rc == 0 && r->names && i < r->nnodes; i += k) {
		char *batch[FANOUT_WIDTH];

		for (k = 0; k < FANOUT_WIDTH && i + k < r->nnodes; k++)
			batch[k] = r->nodes[i + k].name;
		store_read_plans_many(cache->store, r->job, batch, k, true, b);
		for (size_t j = 0; j < k; j++) {
			if (rc == 0 && r->names)
				rc = name_node(r, i + j, &b[j], why);
			plans_free(b[j].f);
		}
	}
	free(b);
	if (rc) {
		names_free(r->names);
		r->names = NULL;
	}
	r->named = rc == 0;
	return rc;
}

/* Where a roster is read from. */
enum roster_src {
	FROM_FILE, /* the run's roster file, which rank 0's node writes */
	FROM_SUMMARIES, /* every node's plans summary (its file where it has none) */
	FROM_WHOLE, /* every node's plans file whole */
};

/*
 * One roster of (job, run, world) where this node holds `local`, read from
 * src: its ranks claimed, the others' read; where this node holds rank 0
 * (it commits), from the summaries, written as the run's roster file, and
 * the tensors counted. Complete or not; -errno with why.
 */
static int roster_make(struct roster_cache *cache, const char *job, const char *run, int world,
                       const int *local, size_t nlocal, enum roster_src src, struct roster **out,
                       char *why)
{
	struct roster *r = calloc(1, sizeof(*r));
	int *owner = malloc((size_t)world * sizeof(int)), rc;
	const bool first = nlocal && local[0] == 0;
	struct roster_file keep = {0};
	char msg[IPC_ERRLEN];
	int pub;

	*out = NULL;
	if (!r || !owner) {
		free(r);
		free(owner);
		return -ENOMEM;
	}
	snprintf(r->job, sizeof(r->job), "%s", job);
	snprintf(r->run, sizeof(r->run), "%s", run);
	r->world = world;
	r->whole = src == FROM_WHOLE;
	atomic_init(&r->refs, 1);
	memset(owner, -1, (size_t)world * sizeof(int));
	rc = add_node(r, cache->node, local, nlocal);
	if (rc == 0)
		rc = claim(r, owner, 0, why);
	/* A node that holds every rank needs to read nobody's plans. */
	if (rc == 0 && !roster_complete(r) && src == FROM_FILE)
		rc = roster_from_file(cache, r, owner, why);
	else if (rc == 0 && !roster_complete(r) && first) {
		/* the generation before the plans: a file written after moves it */
		rc = store_plans_generation(cache->store, job, &keep.generation, why);
		if (rc == 0)
			rc = roster_read(cache, r, owner, &keep, why);
	} else if (rc == 0 && !roster_complete(r))
		rc = roster_read(cache, r, owner, NULL, why);
	/* rank 0's node commits: the tensors counted before its part is written */
	if (rc == 0 && roster_complete(r) && first)
		rc = roster_name(cache, r, why);
	/*
	 * and the others read the roster it found; where the put failed, it is
	 * tried again at the next use (one that cannot be written is not kept)
	 */
	if (rc == 0 && keep.nodes && (pub = roster_publish(cache, r, &keep, msg)) &&
	    pub != -ESTALE) {
		r->pending = keep;
		keep = (struct roster_file){0};
	}
	roster_file_clear(&keep);
	free(owner);
	if (rc) {
		roster_free(r);
		return rc;
	}
	*out = r;
	return 0;
}

/*
 * The roster of (job, run, world) where this node holds `local`: cached when
 * complete; else read: the run's roster file first where this node does not
 * hold rank 0 (one read; patient: where it is not there yet, -EAGAIN, for
 * rank 0's node writes it), then the plans summaries (a node's may come
 * late: then it is incomplete, and asked again next time). Where the
 * summaries make two nodes claim one rank, or a file disagrees with its
 * summary, it is read again from the files whole (whole: from them at
 * once). -EEXIST: two nodes claim one rank. *out holds a reference for the
 * caller (roster_put).
 */
int roster_build(struct roster_cache *cache, const char *job, const char *run, int world,
                 const int *local, size_t nlocal, bool whole, bool patient, struct roster **out,
                 char *why)
{
	struct roster *r;
	char msg[IPC_ERRLEN];
	int rc = -ENOENT;

	*out = NULL;
	for (r = cache->list; r; r = r->next)
		if (strcmp(r->job, job) == 0 && strcmp(r->run, run) == 0 && r->world == world &&
		    (r->whole || !whole) && r->nodes[0].nranks == nlocal &&
		    memcmp(r->nodes[0].ranks, local, nlocal * sizeof(int)) == 0) {
			atomic_fetch_add(&r->refs, 1);
			*out = r;
			if (r->pending.nodes && !roster_publish(cache, r, &r->pending, msg))
				roster_file_clear(&r->pending);
			return 0;
		}
	if (!whole && !(nlocal && local[0] == 0)) {
		rc = roster_make(cache, job, run, world, local, nlocal, FROM_FILE, &r, msg);
		if (rc == -ENOMEM)
			return rc;
		if (rc && patient)
			return ipc_errf(
			    why, -EAGAIN,
			    "waiting for the roster of run %s that rank 0's node writes: %s", run,
			    msg);
	}
	if (rc)
		rc = roster_make(cache, job, run, world, local, nlocal,
		                 whole ? FROM_WHOLE : FROM_SUMMARIES, &r, why);
	if ((rc == -EEXIST || rc == -ESTALE) && !whole)
		rc = roster_make(cache, job, run, world, local, nlocal, FROM_WHOLE, &r, why);
	if (rc)
		return rc;
	if (roster_complete(r)) { /* the cache's reference */
		atomic_fetch_add(&r->refs, 1);
		r->next = cache->list;
		cache->list = r;
	}
	*out = r;
	return 0;
}

/*
 * Ranks of the world that no node of this run claims (this node's saves, the
 * others' plans): the first max into out, how many in all into *n.
 */
int roster_unclaimed(const struct roster *ro, int *out, size_t max, size_t *n)
{
	unsigned char *mine = calloc((size_t)ro->world, 1);
	size_t k = 0;

	*n = 0;
	if (!mine)
		return -ENOMEM;
	for (size_t i = 0; i < ro->nnodes; i++)
		for (size_t j = 0; j < ro->nodes[i].nranks; j++)
			mine[ro->nodes[i].ranks[j]] = 1;
	for (int r = 0; r < ro->world; r++)
		if (!mine[r] && k++ < max)
			out[k - 1] = r;
	free(mine);
	*n = k;
	return 0;
}

void roster_uncache(struct roster_cache *cache, struct roster *r)
{
	for (struct roster **pp = &cache->list; r && *pp; pp = &(*pp)->next)
		if (*pp == r) {
			*pp = r->next;
			roster_put(r); /* the cache's */
			return;
		}
}

void roster_cache_clear(struct roster_cache *cache)
{
	while (cache->list) {
		struct roster *r = cache->list;

		cache->list = r->next;
		roster_put(r);
	}
}
