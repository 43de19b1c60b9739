/*
 * shares.c: a run's dedup assignment through the shared root (shares.h).
 * Writing: each node's share made from the assignment and its plans file,
 * a batch at a time. Reading: the set mark first (one small object), then
 * the node's own share, each checked to be of what the reader asked.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commit/shares.h"

/* What the ranks of node file f write of the assignment as, as its share of set. */
static int share_make(const struct plans_file *f, const char *run, int world, uint64_t set,
                      const struct assignment *as, struct plans_share **out)
{
	struct plans_share *sh = calloc(1, sizeof(*sh));
	int rc = 0;

	*out = sh;
	if (!sh || !(sh->ranks = calloc(f->nranks + 1, sizeof(*sh->ranks))))
		return -ENOMEM;
	sh->job = strdup(f->job);
	sh->node = strdup(f->node);
	sh->run = strdup(run);
	sh->world = world;
	sh->set = set;
	if (!sh->job || !sh->node || !sh->run)
		return -ENOMEM;
	for (size_t i = 0; !rc && i < f->nranks; i++) {
		const struct assign_rank *r = assign_rank(as, f->ranks[i].rank);

		if (!r)
			return -EINVAL; /* a rank the assignment was not made of */
		rc = assign_share_of(r, &f->ranks[i], &sh->ranks[sh->nranks++]);
	}
	return rc;
}

int shares_put(struct storage *s, struct plans_file *const *files, size_t n, const char *run,
               int world, uint64_t set, const struct assignment *as, char *err)
{
	struct plans_share *v[SHARES_AT_ONCE];
	char why[IPC_ERRLEN] = "";
	size_t failed = 0;
	int rc = 0;

	for (size_t at = 0; !rc && at < n; at += SHARES_AT_ONCE) {
		const size_t k = n - at < SHARES_AT_ONCE ? n - at : SHARES_AT_ONCE;
		size_t made;

		for (made = 0; !rc && made < k; made++)
			rc = share_make(files[at + made], run, world, set, as, &v[made]);
		if (!rc)
			failed += store_put_shares(s, v, k, why);
		for (size_t i = 0; i < made; i++)
			share_free(v[i]);
	}
	if (rc)
		return ipc_errf(err, rc, "the shares cannot be made: %s", strerror(-rc));
	if (failed)
		return ipc_errf(err, -EIO, "%zu of %zu nodes' shares not put (%s)", failed, n, why);
	return 0;
}

int shares_get(struct storage *s, const char *job, const char *run, const char *node, int world,
               uint64_t gen, struct set_mark **mark, struct plans_share **share, char *err)
{
	struct set_mark *m = NULL;
	struct plans_share *sh = NULL;
	int rc = store_read_set_mark(s, job, run, &m, err);

	*mark = NULL;
	*share = NULL;
	if (!rc && (m->world != world || m->generation != gen))
		rc = ipc_errf(err, -ESTALE, "its set mark is of generation %016llx (world %d)",
		              (unsigned long long)m->generation, m->world);
	if (!rc && m->set && !m->writes_all && !(rc = store_read_share(s, job, node, &sh, err)) &&
	    (sh->set != m->set || strcmp(sh->run, run) != 0 || sh->world != world))
		rc = ipc_errf(err, -ESTALE, "this node's share is of plan set %016llx of run %s",
		              (unsigned long long)sh->set, sh->run);
	if (rc) {
		share_free(sh);
		if (rc != -ESTALE || !m || m->generation == gen) /* only a mark of before is kept */
			set_mark_free(m);
		else
			*mark = m;
		return rc;
	}
	*mark = m;
	*share = sh;
	return 0;
}

/* ---- what rank 0's node assigned, for its committer ---------------------- */

int assigned_make(const struct assign_input *in, size_t n, const struct assignment *as,
                  const char *job, const char *run, int world, uint64_t set, struct assigned **out)
{
	struct assigned *x = calloc(1, sizeof(*x));
	int rc = 0;

	*out = NULL;
	if (!x || !(x->holds = calloc((size_t)world, sizeof(*x->holds))) ||
	    !(x->writes = calloc((size_t)world, sizeof(*x->writes)))) {
		assigned_free(x);
		return -ENOMEM;
	}
	snprintf(x->job, sizeof(x->job), "%s", job);
	snprintf(x->run, sizeof(x->run), "%s", run);
	x->world = world;
	x->set = set;
	for (size_t i = 0; !rc && i < n; i++) {
		const struct plans_rank *k = in[i].rank;
		const struct assign_rank *r = assign_rank(as, k->rank);

		if (k->rank < 0 || k->rank >= world || !r)
			rc = -EINVAL;
		else if (!(rc = plans_rank_signature(k, &x->holds[k->rank])) &&
		         r->bytes != r->held_bytes)
			rc = assign_written_signature(r, k, &x->writes[k->rank]);
	}
	if (rc) {
		assigned_free(x);
		return rc;
	}
	*out = x;
	return 0;
}

void assigned_free(struct assigned *x)
{
	if (!x)
		return;
	free(x->holds);
	free(x->writes);
	free(x);
}

bool assigned_covers(const struct assigned *x, struct part *const *v, size_t n, char *why)
{
	for (size_t i = 0; i < n; i++)
		for (size_t j = 0; j < v[i]->nranks; j++) {
			const struct part_rank *k = &v[i]->ranks[j];
			uint64_t held, wrote;

			if (k->rank < 0 || k->rank >= x->world || part_rank_signature(k, &held) ||
			    held != x->holds[k->rank]) {
				ipc_errf(why, -ESTALE,
				         "rank %d holds other plans than the set assigned",
				         k->rank);
				return false;
			}
			if (!k->holds && !k->wrote_less)
				continue; /* all it holds: whatever the assignment gave it */
			if (!x->writes[k->rank] || part_rank_written_signature(k, &wrote) ||
			    wrote != x->writes[k->rank]) {
				ipc_errf(
				    why, -ESTALE,
				    "rank %d wrote other pieces than the set assigned, or does "
				    "not say which",
				    k->rank);
				return false;
			}
		}
	return true;
}
