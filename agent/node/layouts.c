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
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "agent/node/node.h"
#include "agent/node/plan.h"
#include "agent/node/layouts.h"
#include "commit.h"
#include "ipc/base/log.h"
#include "assign.h"
#include "shares.h"

/* Every node's plans of (job, run): the files read, their ranks as assign's input. */
struct plan_set {
	struct plans_file **files;
	size_t nfiles;
	struct assign_input *in;
	size_t n;
	unsigned copies; /* the largest any rank asks for, at most the world */
	uint64_t key; /* 0: not a complete set */
	bool older; /* a node's agent does not write replicas once: complete or not, no key */
};

static void set_free(struct plan_set *ps)
{
	for (size_t i = 0; i < ps->nfiles; i++)
		plans_free(ps->files[i]);
	free(ps->files);
	free(ps->in);
}

/*
 * The plans of (job, run) of world ranks: every node's summary (its file
 * where it has none), or where whole every node's file, whose tensors an
 * assignment needs. The key is the same either way. 0 with key 0 where they
 * do not hold each rank once (a node not published yet, a rank gone);
 * -errno when they cannot be read (why in err).
 */
static int set_read(struct agent *a, const char *job, const char *run, int world, bool whole,
                    struct plan_set *ps, char *err)
{
	struct store_plans_read *rd = NULL;
	char **names = NULL;
	unsigned char *seen = calloc((size_t)world, 1);
	size_t nnames = 0, total = 0;
	XXH3_state_t st;
	int rc;

	memset(ps, 0, sizeof(*ps));
	if (!seen)
		return ipc_errf(err, -ENOMEM, "out of memory");
	rc = store_list_nodes(a->store, job, &names, &nnames, err);
	if (!rc && (!(ps->files = calloc(nnames + 1, sizeof(*ps->files))) ||
	            !(rd = calloc(nnames + 1, sizeof(*rd)))))
		rc = ipc_errf(err, -ENOMEM, "out of memory");
	if (!rc)
		store_read_plans_many(a->store, job, names, nnames, whole, rd);
	for (size_t i = 0; !rc && i < nnames; i++) {
		struct plans_file *f = rd[i].f;

		rd[i].f = NULL;
		/*
		 * One gone since the listing, or that does not parse: its ranks are
		 * missing. One that could not be read (an I/O error, a timeout): the
		 * look fails, and the next reads it again (not a set without it).
		 */
		if (rd[i].rc && rd[i].rc != -ENOENT && rd[i].rc != -EINVAL)
			rc = ipc_errf(err, rd[i].rc, "plans of node %s: %s", names[i], rd[i].msg);
		else if (rd[i].rc)
			log_msg(LOG_DEBUG, "job %s: plans of node %s not used: %s", job, names[i],
			        rd[i].msg);
		else if (strcmp(f->run, run) != 0 || f->world != world)
			plans_free(f); /* another run's (a restart's, or one that ended) */
		else {
			ps->files[ps->nfiles++] = f;
			total += f->nranks;
			ps->older = ps->older || !f->writes_once;
		}
	}
	for (size_t i = 0; i < nnames; i++) {
		free(names[i]);
		if (rd)
			plans_free(rd[i].f);
	}
	free(names);
	free(rd);
	if (!rc && !(ps->in = calloc(total + 1, sizeof(*ps->in))))
		rc = ipc_errf(err, -ENOMEM, "out of memory");
	XXH3_64bits_reset(&st);
	for (size_t i = 0; !rc && i < ps->nfiles; i++)
		for (size_t j = 0; j < ps->files[i]->nranks; j++) {
			const struct plans_rank *k = &ps->files[i]->ranks[j];
			uint64_t sig;

			if (k->rank < 0 || k->rank >= world || seen[k->rank]++) {
				free(seen);
				return 0; /* a rank twice: not a set (the commit says more) */
			}
			if (plans_rank_signature(k, &sig)) {
				free(seen);
				return ipc_errf(err, -ENOMEM, "out of memory");
			}
			ps->in[ps->n++] = (struct assign_input){ps->files[i]->node, k};
			ps->copies = k->copies > ps->copies ? k->copies : ps->copies;
			XXH3_64bits_update(&st, ps->files[i]->node, strlen(ps->files[i]->node) + 1);
			XXH3_64bits_update(&st, &k->rank, sizeof(k->rank));
			XXH3_64bits_update(&st, &sig, sizeof(sig));
		}
	ps->copies = ps->copies < (unsigned)world ? ps->copies : (unsigned)world;
	XXH3_64bits_update(&st, &ps->copies, sizeof(ps->copies));
	if (!rc && ps->n == (size_t)world && !ps->older) {
		ps->key = XXH3_64bits_digest(&st);
		ps->key += ps->key == 0; /* 0 says "none" */
	}
	free(seen);
	return rc;
}

/*
 * The set of the summaries ps, as the files whole say it (their tensors,
 * which the assignment needs): read once per plan set. -ESTALE where the
 * files make another set (one changed since its summary was read: its
 * writer renews the generation after, and the next look reads again).
 */
static int set_whole(struct agent *a, const char *job, const char *run, int world,
                     struct plan_set *ps, char *err)
{
	struct plan_set w;
	int rc = set_read(a, job, run, world, true, &w, err);

	if (rc == 0 && w.key != ps->key)
		rc = ipc_errf(err, -ESTALE,
		              "the plans files of run %s are not the set their summaries say (one "
		              "changed as they were read): every rank writes what it holds until "
		              "the next look",
		              run);
	if (rc) {
		log_msg(LOG_INFO, "job %s: %s", job, err);
		set_free(&w);
		return rc;
	}
	log_msg(LOG_DEBUG,
	        "job %s: plans files of run %s read whole (%zu nodes) for the assignment", job, run,
	        w.nfiles);
	set_free(ps);
	*ps = w;
	return 0;
}

/* Whether this node's file says of p's rank what p holds, tensor by tensor in order. */
static bool file_says(const struct plan_set *ps, const char *node, const struct plan *p)
{
	for (size_t i = 0; i < ps->n; i++) {
		const struct plans_rank *k = ps->in[i].rank;

		if (k->rank != p->rank)
			continue;
		if (strcmp(ps->in[i].node, node) != 0 || k->ntensors != p->n)
			return false;
		for (size_t j = 0; j < p->n; j++) {
			const struct manifest_tensor *f = &k->tensors[j];
			const struct plan_tensor *t = &p->t[j];

			if (strcmp(f->name, t->name) || f->dtype != t->dtype ||
			    f->ndim != t->ndim || f->sharded != t->sharded ||
			    memcmp(f->chunks[0].shape, t->shape, t->ndim * sizeof(int64_t)) ||
			    memcmp(f->global_shape, t->global_shape, t->ndim * sizeof(int64_t)) ||
			    (t->sharded && memcmp(f->chunks[0].global_offset, t->global_offset,
			                          t->ndim * sizeof(int64_t))))
				return false;
		}
		return true;
	}
	return false;
}

/*
 * p's layout for what r writes; NULL in *out when r writes all it holds.
 * The plan's tensors are copied under mu (a drop lets their regions go
 * there); the rest needs no lock (p is held).
 */
static int layout_make(struct agent *a, const struct plan *p, const struct assign_rank *r,
                       uint64_t key, struct shard_layout **out, char *err)
{
	struct shard_layout *l;
	int rc;

	*out = NULL;
	if (r->bytes == r->held_bytes)
		return 0;
	l = calloc(1, sizeof(*l));
	if (!l || !(l->t = calloc(p->n + 1, sizeof(*l->t)))) {
		free(l);
		return ipc_errf(err, -ENOMEM, "out of memory");
	}
	pthread_mutex_lock(&a->mu);
	for (size_t i = 0; i < p->n && i < r->ntensors; i++)
		if (r->piece[i].writes)
			l->t[l->n++] = p->t[i];
	pthread_mutex_unlock(&a->mu);
	for (size_t i = 0, j = 0; i < p->n && i < r->ntensors; i++) {
		const struct assign_piece *pc = &r->piece[i];
		struct plan_tensor *t = &l->t[j];
		uint64_t row;

		if (!pc->writes)
			continue;
		j++;
		if (t->ndim == 0 || (pc->row0 == 0 && pc->rows == t->shape[0]))
			continue; /* all of it */
		row = t->nbytes / (uint64_t)t->shape[0]; /* shape[0] > 0: it has rows to cut */
		t->shape[0] = pc->rows;
		t->global_offset[0] += pc->row0;
		t->offset += (uint64_t)pc->row0 * row;
		if (t->dptr)
			t->dptr = (char *)t->dptr + (uint64_t)pc->row0 * row;
		t->nbytes = (uint64_t)pc->rows * row;
	}
	l->held_bytes = p->whole.held_bytes;
	l->key = key;
	l->refs = 1;
	rc = shard_layout_header(l, p, err);
	if (rc) {
		layout_put(l);
		return rc;
	}
	*out = l;
	return 0;
}

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
static struct plan *rank0_plan(struct agent *a, const char *job, const char *run)
{
	struct list *pos;

	list_for_each(pos, &a->plans)
	{
		struct plan *p = container_of(pos, struct plan, link);

		if (!p->dropped && p->rank == 0 && strcmp(p->job, job) == 0 &&
		    strcmp(p->run, run) == 0)
			return p;
	}
	return NULL;
}

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

/* ---- rank 0's node: every node's share, and the run's set mark --------- */

/*
 * Every node's share of the assignment as of the files whole ps (set
 * ps->key), put before the set mark names that set. 0 where all were put.
 */
static int shares_write(struct agent *a, const struct plan_set *ps, const char *run, int world,
                        const struct assignment *as)
{
	const char *job = ps->files[0]->job;
	char err[IPC_ERRLEN];
	int rc = shares_put(a->store, ps->files, ps->nfiles, run, world, ps->key, as, err);

	if (rc)
		log_msg(LOG_WARNING,
		        "job %s: shares of plan set %016llx of run %s not all written (tried again "
		        "after a back-off): the other nodes read every plans file themselves once "
		        "rank 0's node has said nothing for half the commit deadline: %s",
		        job, (unsigned long long)ps->key, run, err);
	else
		log_msg(LOG_INFO,
		        "job %s: shares of plan set %016llx of run %s written (%zu nodes)", job,
		        (unsigned long long)ps->key, run, ps->nfiles);
	return rc;
}

/*
 * Rank 0's node, the shares of set ps->key not written yet: written now
 * from the assignment as. False where they were not (tried again at a
 * later look, after the back-off).
 */
static bool shares_done(struct agent *a, const char *job, const char *run, int world,
                        const struct plan_set *ps, const struct assignment *as)
{
	const bool put = shares_write(a, ps, run, world, as) == 0;
	struct plan *p0;

	pthread_mutex_lock(&a->mu);
	if ((p0 = rank0_plan(a, job, run)) && put)
		p0->shares_key = ps->key;
	pthread_mutex_unlock(&a->mu);
	return put;
}

/*
 * The assignment made here, to this node's committer: a step's parts whose
 * ranks wrote what it gave them are checked by it, not read whole (the
 * commit thread's, as this is).
 */
static void give_committer(struct agent *a, const struct plan_set *ps, const char *job,
                           const char *run, int world, const struct assignment *as)
{
	struct assigned *x;
	int rc = assigned_make(ps->in, ps->n, as, job, run, world, ps->key, &x);

	if (rc)
		log_msg(LOG_WARNING,
		        "job %s: the assignment of run %s not kept for the commit (its parts are "
		        "read whole): %s",
		        job, run, strerror(-rc));
	else
		committer_assigned(a->cm, x);
}

/*
 * Rank 0's node, after a look at the summaries under generation gen: the
 * run's set mark says what that look found, once the shares of a complete
 * set are written (where they are not, it says nothing: the others wait).
 * `all`: no assignment (an older agent's node, copies as many as the
 * world, plans it could not assign): every rank writes all it holds.
 * True where the put failed.
 */
static bool mark_write(struct agent *a, const char *job, const char *run, int world,
                       const struct plan_set *ps, uint64_t gen, bool all)
{
	struct set_mark m = {(char *)job, (char *)run, world, ps->key, gen, all};
	char err[IPC_ERRLEN];
	struct plan *p;
	bool put;

	pthread_mutex_lock(&a->mu);
	p = rank0_plan(a, job, run);
	put = p && gen && (all || !ps->key || p->shares_key == ps->key);
	pthread_mutex_unlock(&a->mu);
	if (put && store_put_set_mark(a->store, &m, err)) {
		log_msg(LOG_WARNING, "job %s: set mark of run %s not written: %s", job, run, err);
		return true;
	}
	if (put)
		log_msg(
		    LOG_DEBUG,
		    "job %s: set mark of run %s written (plan set %016llx, generation %016llx%s)",
		    job, run, (unsigned long long)ps->key, (unsigned long long)gen,
		    all ? ", every rank writes all it holds" : "");
	return false;
}

/* ---- every other node: its share, as rank 0's node made it ------------- */

/* p's layout from this node's share sh of set key (*l NULL: it writes all it holds). */
static void from_share(struct agent *a, struct plan *p, const struct plans_share *sh, uint64_t key,
                       struct shard_layout **l)
{
	const struct share_rank *sr = NULL;
	struct plans_rank k = {.rank = p->rank};
	struct assign_rank r = {0};
	char err[IPC_ERRLEN];
	int rc;

	pthread_mutex_lock(&a->mu);
	rc = plan_holds(p, &k.tensors, &k.ntensors);
	pthread_mutex_unlock(&a->mu);
	for (size_t i = 0; i < sh->nranks && !sr; i++)
		if (sh->ranks[i].rank == p->rank)
			sr = &sh->ranks[i];
	if (rc)
		rc = ipc_errf(err, -ENOMEM, "out of memory");
	else if (!sr)
		rc = ipc_errf(err, -EINVAL, "rank %d is not in this node's share", p->rank);
	if (!rc && !(rc = assign_rank_of_share(sr, &k, &r, err)))
		rc = layout_make(a, p, &r, key, l, err);
	if (rc)
		log_msg(LOG_WARNING, "job %s rank %d: writes all it holds: %s", p->job, p->rank,
		        err);
	free(r.piece);
	plans_rank_clear(&k);
}

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
			from_share(a, v[i], sh, m->set, &l);
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

	if (r && file_says(ps, a->cfg.node, p) && layout_make(a, p, r, ps->key, &l, err))
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
	int rc = set_read(a, job, run, world, false, &ps, err);

	if (rc) { /* nothing marked as seen: the next look reads them again */
		log_msg(LOG_INFO, "job %s: plans of the other nodes not read: %s", job, err);
		set_free(&ps);
		return false;
	}
	log_msg(LOG_DEBUG,
	        "job %s: plans summaries of run %s read (%zu nodes, %zu of %d ranks, generation "
	        "%016llx)",
	        job, run, ps.nfiles, ps.n, world, (unsigned long long)gen);
	pthread_mutex_lock(&a->mu);
	n = stale_plans(a, job, run, ps.key, (int)ps.n, ps.key == 0 && !ps.older, gen, &v);
	p0 = r0 ? rank0_plan(a, job, run) : NULL;
	/* rank 0's node: the shares of this set not written yet, and no back-off running */
	shares = p0 && ps.key && ps.copies < (unsigned)world && p0->shares_key != ps.key;
	due = shares && (!p0->relook_at || ipc_mono_ns() >= p0->relook_at);
	pthread_mutex_unlock(&a->mu);
	/* copies as many as the world: every replica writes its own, no assignment */
	if ((n || due) && ps.key && ps.copies < (unsigned)world &&
	    !(again = set_whole(a, job, run, world, &ps, err) != 0) &&
	    (rc = assign_compute(ps.in, ps.n, ps.copies, &as, err)))
		log_msg(LOG_WARNING, "job %s: replicas are written by every rank: %s", job, err);
	if (as)
		give_committer(a, &ps, job, run, world, as);
	/* plans that cannot be assigned: not tried again until they change */
	if (shares && (as ? !shares_done(a, job, run, world, &ps, as) : again || !due))
		ok = false;
	rc = rc || again;
	for (size_t i = 0; i < n; i++)
		layout_follow(a, v[i], &ps, as, rc, again);
	if (r0 && !again &&
	    mark_write(a, job, run, world, &ps, gen,
	               ps.older || (ps.key && (ps.copies >= (unsigned)world || rc))))
		ok = false;
	free(v);
	assign_free(as);
	set_free(&ps);
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
	r0 = rank0_plan(a, job, run) != NULL;
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
	const struct plan *p = rank0_plan(a, job, run);

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
