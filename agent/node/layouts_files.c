/*
 * Replicas written once (layouts.c says when and why): the mechanism of a
 * look at the plans files. Reading every node's plans summary, or its file
 * whole, as one plan set with its key; making a plan's shard layout from
 * the assignment or from this node's share; on rank 0's node, putting
 * every node's share and the run's set mark, and giving the assignment to
 * the committer.
 *
 * Commit thread (layouts_refresh's looks); the plans it reads and the
 * layouts it makes are under agent.mu where a plan's fields are, the
 * storage I/O off it.
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
#include "agent/node/layouts_int.h"
#include "ipc/base/log.h"
#include "commit/commit.h"
#include "layout/assign.h"
#include "commit/shares.h"

void lay_set_free(struct plan_set *ps)
{
	for (size_t i = 0; i < ps->nfiles; i++)
		plans_free(ps->files[i]);
	free(ps->files);
	free(ps->in);
}

/*
 * Every node's plans summary of (job, run) of world ranks (whole: its file)
 * into ps->files; *total: their ranks. -errno where one could not be read.
 */
static int set_files(struct agent *a, const char *job, const char *run, int world, bool whole,
                     struct plan_set *ps, size_t *total, char *err)
{
	struct store_plans_read *rd = NULL;
	char **names = NULL;
	size_t nnames = 0;
	int rc = store_list_nodes(a->store, job, &names, &nnames, err);

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
			*total += f->nranks;
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
	return rc;
}

/*
 * The ranks of ps->files as assign's input (ps->in, room for all), and the
 * set's key where they hold each of the world's ranks once (seen: world
 * bytes, zero). 0, key 0 where a rank is there twice; -ENOMEM.
 */
static int set_key(struct plan_set *ps, int world, unsigned char *seen, char *err)
{
	XXH3_state_t st;

	XXH3_64bits_reset(&st);
	for (size_t i = 0; i < ps->nfiles; i++)
		for (size_t j = 0; j < ps->files[i]->nranks; j++) {
			const struct plans_rank *k = &ps->files[i]->ranks[j];
			uint64_t sig;

			if (k->rank < 0 || k->rank >= world || seen[k->rank]++)
				return 0; /* a rank twice: not a set (the commit says more) */
			if (plans_rank_signature(k, &sig))
				return ipc_errf(err, -ENOMEM, "out of memory");
			ps->in[ps->n++] = (struct assign_input){ps->files[i]->node, k};
			ps->copies = k->copies > ps->copies ? k->copies : ps->copies;
			XXH3_64bits_update(&st, ps->files[i]->node, strlen(ps->files[i]->node) + 1);
			XXH3_64bits_update(&st, &k->rank, sizeof(k->rank));
			XXH3_64bits_update(&st, &sig, sizeof(sig));
		}
	ps->copies = ps->copies < (unsigned)world ? ps->copies : (unsigned)world;
	XXH3_64bits_update(&st, &ps->copies, sizeof(ps->copies));
	if (ps->n == (size_t)world && !ps->older) {
		ps->key = XXH3_64bits_digest(&st);
		ps->key += ps->key == 0; /* 0 says "none" */
	}
	return 0;
}

/*
 * The plans of (job, run) of world ranks: every node's summary (its file
 * where it has none), or where whole every node's file, whose tensors an
 * assignment needs. The key is the same either way. 0 with key 0 where they
 * do not hold each rank once (a node not published yet, a rank gone);
 * -errno when they cannot be read (why in err).
 */
int lay_set_read(struct agent *a, const char *job, const char *run, int world, bool whole,
                 struct plan_set *ps, char *err)
{
	unsigned char *seen = calloc((size_t)world, 1);
	size_t total = 0;
	int rc;

	memset(ps, 0, sizeof(*ps));
	if (!seen)
		return ipc_errf(err, -ENOMEM, "out of memory");
	rc = set_files(a, job, run, world, whole, ps, &total, err);
	if (!rc && !(ps->in = calloc(total + 1, sizeof(*ps->in))))
		rc = ipc_errf(err, -ENOMEM, "out of memory");
	if (!rc)
		rc = set_key(ps, world, seen, err);
	free(seen);
	return rc;
}

/*
 * The set of the summaries ps, as the files whole say it (their tensors,
 * which the assignment needs): read once per plan set. -ESTALE where the
 * files make another set (one changed since its summary was read: its
 * writer renews the generation after, and the next look reads again).
 */
int lay_set_whole(struct agent *a, const char *job, const char *run, int world, struct plan_set *ps,
                  char *err)
{
	struct plan_set w;
	int rc = lay_set_read(a, job, run, world, true, &w, err);

	if (rc == 0 && w.key != ps->key)
		rc = ipc_errf(err, -ESTALE,
		              "the plans files of run %s are not the set their summaries say (one "
		              "changed as they were read): every rank writes what it holds until "
		              "the next look",
		              run);
	if (rc) {
		log_msg(LOG_INFO, "job %s: %s", job, err);
		lay_set_free(&w);
		return rc;
	}
	log_msg(LOG_DEBUG,
	        "job %s: plans files of run %s read whole (%zu nodes) for the assignment", job, run,
	        w.nfiles);
	lay_set_free(ps);
	*ps = w;
	return 0;
}

/* Whether this node's file says of p's rank what p holds, tensor by tensor in order. */
bool lay_file_says(const struct plan_set *ps, const char *node, const struct plan *p)
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
int lay_layout_make(struct agent *a, const struct plan *p, const struct assign_rank *r,
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
bool lay_shares_done(struct agent *a, const char *job, const char *run, int world,
                     const struct plan_set *ps, const struct assignment *as)
{
	const bool put = shares_write(a, ps, run, world, as) == 0;
	struct plan *p0;

	pthread_mutex_lock(&a->mu);
	if ((p0 = plan_rank0(a, job, run)) && put)
		p0->shares_key = ps->key;
	pthread_mutex_unlock(&a->mu);
	return put;
}

/*
 * The assignment made here, to this node's committer: a step's parts whose
 * ranks wrote what it gave them are checked by it, not read whole (the
 * commit thread's, as this is).
 */
void lay_give_committer(struct agent *a, const struct plan_set *ps, const char *job,
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
bool lay_mark_write(struct agent *a, const char *job, const char *run, int world,
                    const struct plan_set *ps, uint64_t gen, bool all)
{
	struct set_mark m = {(char *)job, (char *)run, world, ps->key, gen, all};
	char err[IPC_ERRLEN];
	struct plan *p;
	bool put;

	pthread_mutex_lock(&a->mu);
	p = plan_rank0(a, job, run);
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
void lay_from_share(struct agent *a, struct plan *p, const struct plans_share *sh, uint64_t key,
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
		rc = lay_layout_make(a, p, &r, key, l, err);
	if (rc)
		log_msg(LOG_WARNING, "job %s rank %d: writes all it holds: %s", p->job, p->rank,
		        err);
	free(r.piece);
	plans_rank_clear(&k);
}
