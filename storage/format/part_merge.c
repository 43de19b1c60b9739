/*
 * part_merge.c: the merge of the parts of one run into the step's manifest
 * (format.h: manifest_merge, manifest_merge_some; docs/DESIGN.md §6.4).
 * The parts are read and checked by part.c first; the merge reads no clock
 * and sorts everything (parts by node, tensors by name, chunks by rank), so
 * any agent merging the same parts writes the same bytes.
 *
 * Pure functions; any thread.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "storage/format/fmt.h"

/* ---- merging ----------------------------------------------------------- */

/* A tensor of one rank, while the merge groups them by name. */
struct entry {
	const struct manifest_tensor *t;
	int rank;
};

static int cmp_entry(const void *x, const void *y)
{
	const struct entry *a = x, *b = y;
	int c = strcmp(a->t->name, b->t->name);

	return c ? c : a->rank - b->rank;
}

static int cmp_part(const void *x, const void *y)
{
	return strcmp((*(struct part *const *)x)->node, (*(struct part *const *)y)->node);
}

/* One manifest tensor from e[0..n) (one name, ranks ascending). */
static int merge_tensor(struct manifest_tensor *mt, const struct entry *e, size_t n, char *err)
{
	const struct manifest_tensor *t0 = e[0].t;

	mt->name = strdup(t0->name);
	mt->chunks = calloc(n, sizeof(*mt->chunks));
	if (!mt->name || !mt->chunks)
		return ipc_errf(err, -ENOMEM, "merge: out of memory");
	mt->dtype = t0->dtype;
	mt->ndim = t0->ndim;
	mt->sharded = t0->sharded;
	memcpy(mt->global_shape, t0->global_shape, sizeof(mt->global_shape));
	for (size_t i = 0; i < n; i++) {
		const struct manifest_tensor *t = e[i].t;

		if (i > 0 &&
		    (!t->sharded || !t0->sharded || t->dtype != t0->dtype || t->ndim != t0->ndim ||
		     memcmp(t->global_shape, t0->global_shape, t->ndim * sizeof(int64_t))))
			return ipc_errf(err, -EINVAL,
			                "tensor '%s' is saved by ranks %d and %d, not as chunks of "
			                "one sharded tensor",
			                t->name, e[0].rank, e[i].rank);
		mt->chunks[mt->nchunks++] = t->chunks[0];
	}
	return 0;
}

static int check_set(struct part *const *v, size_t n, bool whole, char *err);

int merge_check_set(struct part *const *v, size_t n, char *err)
{
	return check_set(v, n, true, err);
}

/* The parts agree on what step of which run they are; each rank once (whole: every one). */
static int check_set(struct part *const *v, size_t n, bool whole, char *err)
{
	const struct part *p0 = v[0];
	unsigned char *seen = calloc((size_t)p0->world, 1);
	int rc = 0;

	if (!seen)
		return ipc_errf(err, -ENOMEM, "merge: out of memory");
	for (size_t i = 0; i < n && !rc; i++) {
		const struct part *p = v[i];

		if (strcmp(p->job, p0->job) || p->step != p0->step || p->world != p0->world)
			rc = ipc_errf(err, -EINVAL,
			              "the part of node %s is of job %s step %" PRId64
			              " world %d, not job %s step %" PRId64 " world %d",
			              p->node, p->job, p->step, p->world, p0->job, p0->step,
			              p0->world);
		else if (strcmp(p->run, p0->run))
			rc = ipc_errf(
			    err, -ESTALE,
			    "the part of node %s is of run %s, not run %s: a part of another "
			    "run never joins a checkpoint",
			    p->node, p->run, p0->run);
		else if (i > 0 && strcmp(v[i - 1]->node, p->node) == 0)
			rc = ipc_errf(err, -EINVAL, "two parts of node %s", p->node);
		for (size_t j = 0; j < p->nranks && !rc; j++)
			if (seen[p->ranks[j].rank]++)
				rc = ipc_errf(err, -EINVAL,
				              "rank %d is in two parts (one of them node %s's)",
				              p->ranks[j].rank, p->node);
	}
	for (int r = 0; r < p0->world && !rc && whole; r++)
		if (!seen[r])
			rc = ipc_errf(err, -ENOENT, "rank %d is in no part", r);
	free(seen);
	return rc;
}

int merge_summary(struct manifest *m, struct part *const *v, size_t n, char *err)
{
	int64_t t0 = INT64_MAX, cap = 0, dur = 0, last = 0;
	const char *meta = NULL;

	m->bytes = 0;
	for (size_t i = 0; i < n; i++) {
		const struct part *p = v[i];

		last = p->time_unix_ns > last ? p->time_unix_ns : last;
		for (size_t j = 0; j < p->nranks; j++) {
			const struct part_rank *k = &p->ranks[j];

			m->bytes += k->size;
			t0 = k->queued_unix_ns < t0 ? k->queued_unix_ns : t0;
			cap = k->captured_unix_ns > cap ? k->captured_unix_ns : cap;
			dur = k->durable_unix_ns > dur ? k->durable_unix_ns : dur;
			meta = k->rank == 0 ? k->meta_json : meta;
		}
	}
	/* Times from the parts, never a clock: every merger writes the same bytes. */
	m->time_unix_ns = last;
	m->capture_seconds = cap > t0 ? (double)(cap - t0) / 1e9 : 0;
	m->durable_seconds = dur > t0 ? (double)(dur - t0) / 1e9 : 0;
	m->commit_seconds = last > t0 ? (double)(last - t0) / 1e9 : 0;
	if (meta && !(m->meta_json = strdup(meta)))
		return ipc_errf(err, -ENOMEM, "merge: out of memory");
	return 0;
}

static int merge_ranks(struct manifest *m, struct part *const *v, size_t n, size_t *nent, char *err)
{
	if (!m->ranks)
		m->ranks = calloc((size_t)m->world, sizeof(*m->ranks));
	m->parts = calloc(n, sizeof(*m->parts));
	if (!m->ranks || !m->parts)
		return ipc_errf(err, -ENOMEM, "merge: out of memory");
	m->nranks = (size_t)m->world;
	*nent = 0;
	for (size_t i = 0; i < n; i++) {
		const struct part *p = v[i];
		struct manifest_part *mp = &m->parts[m->nparts++];

		mp->node = strdup(p->node);
		mp->ranks = calloc(p->nranks, sizeof(int));
		if (!mp->node || !mp->ranks)
			return ipc_errf(err, -ENOMEM, "merge: out of memory");
		for (size_t j = 0; j < p->nranks; j++) {
			const struct part_rank *k = &p->ranks[j];
			struct manifest_rank *mr = &m->ranks[k->rank];

			mp->ranks[mp->nranks++] = k->rank;
			*mr = (struct manifest_rank){.rank = k->rank,
			                             .file = strdup(k->file),
			                             .size = k->size,
			                             .header_bytes = k->header_bytes,
			                             .save = k->save};
			if (!mr->file ||
			    (k->meta_json && !(mr->meta_json = strdup(k->meta_json))) ||
			    fmt_tensors_dup(k->holds, k->nholds, &mr->holds))
				return ipc_errf(err, -ENOMEM, "merge: out of memory");
			mr->nholds = k->holds ? k->nholds : 0;
			if (k->holds && !mr->holds && !(mr->holds = calloc(1, sizeof(*mr->holds))))
				return ipc_errf(err, -ENOMEM, "merge: out of memory");
			if (k->holds)
				m->version = MANIFEST_VERSION_HOLDS; /* what it holds is said */
			*nent += k->ntensors;
		}
	}
	return merge_summary(m, v, n, err);
}

static int merge_tensors(struct manifest *m, struct part *const *v, size_t n, size_t nent,
                         char *err)
{
	struct entry *e = calloc(nent + 1, sizeof(*e));
	size_t k = 0;
	int rc = 0;

	m->tensors = calloc(nent + 1, sizeof(*m->tensors));
	if (!e || !m->tensors) {
		free(e);
		return ipc_errf(err, -ENOMEM, "merge: out of memory for %zu tensors", nent);
	}
	for (size_t i = 0; i < n; i++)
		for (size_t j = 0; j < v[i]->nranks; j++)
			for (size_t t = 0; t < v[i]->ranks[j].ntensors; t++)
				e[k++] =
				    (struct entry){&v[i]->ranks[j].tensors[t], v[i]->ranks[j].rank};
	qsort(e, k, sizeof(*e), cmp_entry);
	for (size_t i = 0, j; i < k && !rc; i = j) {
		for (j = i + 1; j < k && strcmp(e[j].t->name, e[i].t->name) == 0; j++)
			;
		rc = merge_tensor(&m->tensors[m->ntensors++], e + i, j - i, err);
	}
	free(e);
	return rc;
}

/* The merge of parts[0..n): whole, every rank (checked); else some (partial, unchecked). */
static int merge(struct part *const *parts, size_t n, bool whole, struct manifest **out, char *err)
{
	struct part **v = NULL;
	struct manifest *m = NULL;
	size_t nent = 0;
	int rc;

	*out = NULL;
	if (n < 1 || !parts)
		return ipc_errf(err, -EINVAL, "merge: no parts");
	v = malloc(n * sizeof(*v));
	m = calloc(1, sizeof(*m));
	if (!v || !m) {
		rc = ipc_errf(err, -ENOMEM, "merge: out of memory");
		goto out;
	}
	memcpy(v, parts, n * sizeof(*v));
	qsort(v, n, sizeof(*v), cmp_part);
	rc = check_set(v, n, whole, err);
	if (rc)
		goto out;
	m->version = MANIFEST_VERSION_PLAIN; /* merge_ranks: 3 if a rank says what it holds */
	m->partial = !whole;
	m->step = v[0]->step;
	m->world = v[0]->world;
	if (!(m->job = strdup(v[0]->job)) || !(m->run = strdup(v[0]->run))) {
		rc = ipc_errf(err, -ENOMEM, "merge: out of memory");
		goto out;
	}
	if (!whole) { /* the ranks no part here brings: -1, as a parse leaves them */
		m->ranks = calloc((size_t)m->world, sizeof(*m->ranks));
		if (!m->ranks) {
			rc = ipc_errf(err, -ENOMEM, "merge: out of memory");
			goto out;
		}
		for (int r = 0; r < m->world; r++)
			m->ranks[r].rank = -1;
	}
	rc = merge_ranks(m, v, n, &nent, err);
	if (!rc)
		rc = merge_tensors(m, v, n, nent, err);
	if (!rc && whole)
		rc = manifest_check(m, err);
out:
	free(v);
	if (rc)
		manifest_free(m);
	else
		*out = m;
	return rc;
}

int manifest_merge(struct part *const *parts, size_t n, struct manifest **out, char *err)
{
	return merge(parts, n, true, out, err);
}

int manifest_merge_some(struct part *const *parts, size_t n, struct manifest **out, char *err)
{
	return merge(parts, n, false, out, err);
}
