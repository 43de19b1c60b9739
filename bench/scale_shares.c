/*
 * scale_shares.c: the dedup assignment of a run at cluster scale
 * (scale_bench.h, run_shares), with the project's own pieces:
 *
 *   shares       as the node of rank 0 (n00000) does once per plan set
 *                (agent/node/layouts.c): the job's plans generation, every
 *                node's plans summary, then every file whole; the
 *                assignment (layout/assign.h, one copy); every node's share
 *                put (commit/shares.h); the run's set mark
 *   share_watch  as every other node does: the generation, the set mark and
 *                its own share (shares_get), each of its ranks' entries
 *                made from the share against the rank's plan
 *                (assign_rank_of_share; the node's own plans file is read
 *                first, apart: an agent has its plans in memory)
 *
 * One JSON line each: wall and CPU time, peak memory, the storage's calls
 * and bytes (scale_store.h), and what the shares hold.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "bench/scale_bench.h"
#include "commit/shares.h"

/* Every node's plans of the job: summaries (whole: false) or files, as the agent reads them. */
static int read_all(struct storage *s, const struct opts *o, bool whole, struct plans_file ***files,
                    size_t *n, char *err)
{
	struct store_plans_read *rd = NULL;
	char **names = NULL;
	size_t nn = 0;
	int rc = store_list_nodes(s, o->job, &names, &nn, err);

	*files = NULL;
	*n = 0;
	if (!rc &&
	    (!(rd = calloc(nn + 1, sizeof(*rd))) || !(*files = calloc(nn + 1, sizeof(**files)))))
		rc = ipc_errf(err, -ENOMEM, "out of memory");
	if (!rc)
		store_read_plans_many(s, o->job, names, nn, whole, rd);
	for (size_t i = 0; i < nn; i++) {
		if (!rc && rd[i].rc)
			rc = ipc_errf(err, rd[i].rc, "plans of %s: %s", names[i], rd[i].msg);
		if (!rc)
			(*files)[(*n)++] = rd[i].f;
		else if (rd)
			plans_free(rd[i].f);
		free(names[i]);
	}
	free(names);
	free(rd);
	return rc;
}

static void files_free(struct plans_file **v, size_t n)
{
	for (size_t i = 0; i < n; i++)
		plans_free(v[i]);
	free(v);
}

/* The assignment of every rank of the files, one copy. */
static int assign_all(struct plans_file **v, size_t n, struct assignment **as, size_t *nranks,
                      char *err)
{
	struct assign_input *in;
	size_t k = 0;
	int rc;

	for (size_t i = 0; i < n; i++)
		k += v[i]->nranks;
	if (!(in = calloc(k + 1, sizeof(*in))))
		return ipc_errf(err, -ENOMEM, "out of memory");
	k = 0;
	for (size_t i = 0; i < n; i++)
		for (size_t j = 0; j < v[i]->nranks; j++)
			in[k++] = (struct assign_input){v[i]->node, &v[i]->ranks[j]};
	rc = assign_compute(in, k, 1, as, err);
	free(in);
	*nranks = k;
	return rc;
}

/* The line's end: the storage's calls since a, and what the phase says. */
static void line_end(struct storage *s, const struct cs_counts *a, const char *problem)
{
	struct cs_counts b, d;

	cs_counts(s, &b);
	cs_diff(&b, a, &d);
	printf(", \"ops\": ");
	printf(", \"calls\": %" PRIu64 ", \"problem\": ", cs_json(&d, stdout));
	json_str(stdout, problem);
	printf("}\n");
	fflush(stdout);
}

static int put_shares(const struct opts *o, struct storage *s, char *err)
{
	struct plans_file **sums = NULL, **files = NULL;
	struct assignment *as = NULL;
	size_t nsums = 0, nfiles = 0, nranks = 0;
	const double cpu0 = cpu_ms();
	struct cs_counts a;
	uint64_t gen = 0, key;
	int64_t t;
	int rc;

	cs_counts(s, &a);
	t = mono_ns();
	rc = store_plans_generation(s, o->job, &gen, err);
	if (!rc)
		rc = read_all(s, o, false, &sums, &nsums, err);
	if (!rc)
		rc = read_all(s, o, true, &files, &nfiles, err);
	if (!rc)
		rc = assign_all(files, nfiles, &as, &nranks, err);
	key = gen ^ 0x5ca1e5ca1e5ca1e5ull; /* any set key (the agent's names the plans) */
	if (!rc)
		rc = shares_put(s, files, nfiles, o->run, o->nodes * o->ranks, key, as, err);
	if (!rc) {
		struct set_mark m = {(char *)o->job, (char *)o->run, o->nodes * o->ranks, key, gen,
		                     false};

		rc = store_put_set_mark(s, &m, err);
	}
	line_head(o, "shares");
	printf(", \"replicas\": %d, \"wall_ms\": %.1f, \"cpu_ms\": %.1f, \"peak_rss_kb\": %ld, "
	       "\"rc\": %d, \"nodes_read\": %zu, \"ranks\": %zu, \"written_bytes\": %" PRIu64
	       ", \"unique_bytes\": %" PRIu64,
	       o->replicas, ms_since(t), cpu_ms() - cpu0, rss_peak_kb(), rc, nfiles, nranks,
	       as ? as->written_bytes : 0, as ? as->unique_bytes : 0);
	line_end(s, &a, rc ? err : "");
	assign_free(as);
	files_free(sums, nsums);
	files_free(files, nfiles);
	return rc;
}

static int take_share(const struct opts *o, struct storage *s, char *err)
{
	const int world = o->nodes * o->ranks;
	struct plans_share *sh = NULL;
	struct plans_file *own = NULL;
	struct set_mark *m = NULL;
	uint64_t gen = 0, writes = 0, holds = 0;
	struct cs_counts a;
	size_t ncuts = 0;
	char node[32];
	int64_t t;
	int rc;

	node_name(o->node, node, sizeof(node));
	rc = store_read_plans(s, o->job, node, &own, err); /* an agent's live plans: apart */
	cs_counts(s, &a);
	t = mono_ns();
	if (!rc)
		rc = store_plans_generation(s, o->job, &gen, err);
	if (!rc)
		rc = shares_get(s, o->job, o->run, node, world, gen, &m, &sh, err);
	if (!rc && !sh)
		rc = ipc_errf(err, -ENOENT, "the set mark names no shares");
	for (size_t i = 0; !rc && i < own->nranks; i++) {
		struct assign_rank r;

		if (i >= sh->nranks || sh->ranks[i].rank != own->ranks[i].rank) {
			rc = ipc_errf(err, -EINVAL, "rank %d is not in the share",
			              own->ranks[i].rank);
			break;
		}
		rc = assign_rank_of_share(&sh->ranks[i], &own->ranks[i], &r, err);
		writes += r.bytes;
		holds += r.held_bytes;
		ncuts += sh->ranks[i].ncuts;
		free(r.piece);
	}
	line_head(o, "share_watch");
	printf(", \"replicas\": %d, \"node\": \"%s\", \"wall_ms\": %.1f, \"rc\": %d, "
	       "\"cuts\": %zu, \"writes_bytes\": %" PRIu64 ", \"holds_bytes\": %" PRIu64,
	       o->replicas, node, ms_since(t), rc, ncuts, writes, holds);
	line_end(s, &a, rc ? err : "");
	set_mark_free(m);
	share_free(sh);
	plans_free(own);
	return rc;
}

int run_shares(const struct opts *o, bool writing, char *err)
{
	struct storage *s = NULL;
	struct ioeng *io = NULL;
	char node[32];
	int rc;

	node_name(writing ? 0 : o->node, node, sizeof(node));
	rc = open_store(o, node, &io, &s, err);
	if (!rc)
		rc = writing ? put_shares(o, s, err) : take_share(o, s, err);
	storage_destroy(s);
	ioeng_destroy(io);
	return rc;
}
