/*
 * cover.c: every held box is covered by written chunks. Replicas hold the
 * same boxes, so each distinct box is checked once: sorted by its identity
 * (name, dtype, dimensions, global shape, offset, shape). A box some rank
 * wrote whole is found by a binary search among its tensor's chunks (the
 * usual case: a rank's own box, or a replica written whole); only a box
 * written in pieces has the chunks of its tensor subtracted from it until
 * nothing is left (covered) or they run out (a hole). The subtractions are
 * bounded (COVER_MAX_PIECES boxes left at once, COVER_MAX_WORK overlaps
 * tried in all): parts are input from other nodes.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layout/box.h"
#include "layout/cover.h"

#define COVER_MAX_WORK 50000000ull /* box overlaps tried, all boxes together */

struct held {
	const struct manifest_tensor *h; /* one chunk: the box */
	int rank;
};

/* The box's identity: name, dtype, dimensions, global shape, offset, shape. */
static int cmp_box(const struct manifest_tensor *a, const struct manifest_tensor *b)
{
	int c = strcmp(a->name, b->name);

	if (!c && a->dtype != b->dtype)
		c = a->dtype < b->dtype ? -1 : 1;
	if (!c && a->ndim != b->ndim)
		c = a->ndim < b->ndim ? -1 : 1;
	if (!c)
		c = memcmp(a->global_shape, b->global_shape, sizeof(a->global_shape));
	if (!c)
		c = memcmp(a->chunks[0].global_offset, b->chunks[0].global_offset,
		           sizeof(a->chunks[0].global_offset));
	if (!c)
		c = memcmp(a->chunks[0].shape, b->chunks[0].shape, sizeof(a->chunks[0].shape));
	return c;
}

static int cmp_held(const void *x, const void *y)
{
	const struct held *a = x, *b = y;
	int c = cmp_box(a->h, b->h);

	return c ? c : a->rank - b->rank;
}

/* Chunks of one tensor by (offset, shape), for the binary search. */
static int cmp_chunk(const void *x, const void *y)
{
	const struct manifest_chunk *a = *(const struct manifest_chunk *const *)x;
	const struct manifest_chunk *b = *(const struct manifest_chunk *const *)y;
	int c = memcmp(a->global_offset, b->global_offset, sizeof(a->global_offset));

	return c ? c : memcmp(a->shape, b->shape, sizeof(a->shape));
}

struct left {
	int64_t (*off)[IPC_MAX_NDIM], (*shape)[IPC_MAX_NDIM];
	size_t n;
};

struct cover {
	const struct manifest *m;
	struct left l, tmp;
	const struct manifest_chunk **by; /* the chunks of `of`, sorted */
	const struct manifest_tensor *of;
	uint64_t work;
};

/* What is left of the box, less chunk c, into tmp; -E2BIG past the bounds. */
static int subtract(struct cover *cv, size_t nd, const struct manifest_chunk *c)
{
	struct left *l = &cv->l, *tmp = &cv->tmp;
	size_t n = 0;

	cv->work += l->n;
	if (cv->work > COVER_MAX_WORK)
		return -E2BIG;
	for (size_t i = 0; i < l->n; i++) {
		int64_t ooff[IPC_MAX_NDIM], oshape[IPC_MAX_NDIM];
		int64_t roff[2 * IPC_MAX_NDIM][IPC_MAX_NDIM],
		    rshape[2 * IPC_MAX_NDIM][IPC_MAX_NDIM];
		size_t k;

		if (!box_intersect(nd, l->off[i], l->shape[i], c->global_offset, c->shape, ooff,
		                   oshape)) {
			if (n == COVER_MAX_PIECES)
				return -E2BIG;
			memcpy(tmp->off[n], l->off[i], sizeof(l->off[i]));
			memcpy(tmp->shape[n++], l->shape[i], sizeof(l->shape[i]));
			continue;
		}
		k = box_subtract(nd, l->off[i], l->shape[i], ooff, oshape, roff, rshape);
		for (size_t j = 0; j < k; j++) {
			if (n == COVER_MAX_PIECES)
				return -E2BIG;
			memcpy(tmp->off[n], roff[j], sizeof(roff[j]));
			memcpy(tmp->shape[n++], rshape[j], sizeof(rshape[j]));
		}
	}
	tmp->n = n;
	return 0;
}

/* The chunks of t sorted into cv->by (kept while the boxes are of t). */
static int index_chunks(struct cover *cv, const struct manifest_tensor *t)
{
	const struct manifest_chunk **by;

	if (cv->of == t)
		return 0;
	by = realloc(cv->by, (t->nchunks + 1) * sizeof(*by));
	if (!by)
		return -ENOMEM;
	cv->by = by;
	for (size_t j = 0; j < t->nchunks; j++)
		by[j] = &t->chunks[j];
	qsort(by, t->nchunks, sizeof(*by), cmp_chunk);
	cv->of = t;
	return 0;
}

/* Whether a chunk of cv->of is exactly box c. */
static bool written_whole(const struct cover *cv, const struct manifest_chunk *c)
{
	return bsearch(&c, cv->by, cv->of->nchunks, sizeof(*cv->by), cmp_chunk) != NULL;
}

/* Box e of a held tensor against the chunks of its tensor in m. */
static int cover_one(struct cover *cv, const struct held *e, char *err)
{
	const struct manifest_tensor *h = e->h, *t = manifest_find(cv->m, h->name);
	const struct manifest_chunk *b = &h->chunks[0];
	char off[128], shape[128];
	int rc = 0;

	if (t && (t->dtype != h->dtype || t->ndim != h->ndim ||
	          memcmp(t->global_shape, h->global_shape, t->ndim * sizeof(int64_t))))
		t = NULL;
	if (t && (rc = index_chunks(cv, t)))
		return ipc_errf(err, rc, "out of memory checking the chunks cover every box");
	if (t && written_whole(cv, b))
		return 0;
	memcpy(cv->l.off[0], b->global_offset, sizeof(cv->l.off[0]));
	memcpy(cv->l.shape[0], b->shape, sizeof(cv->l.shape[0]));
	cv->l.n = box_volume(h->ndim, b->shape) ? 1 : 0;
	for (size_t j = 0; t && j < t->nchunks && cv->l.n && !rc; j++) {
		struct left swap;

		rc = subtract(cv, t->ndim, &t->chunks[j]);
		swap = cv->l;
		cv->l = cv->tmp;
		cv->tmp = swap;
	}
	if (!rc && t && !cv->l.n)
		return 0;
	box_text(b->global_offset, h->ndim, off, sizeof(off));
	box_text(b->shape, h->ndim, shape, sizeof(shape));
	if (rc)
		return ipc_errf(err, rc,
		                "tensor '%s' box at %s shape %s (held by rank %d): its chunks "
		                "cut it into more pieces than are checked (%u at once)",
		                h->name, off, shape, e->rank, COVER_MAX_PIECES);
	/* a tensor nobody wrote is a hole even where the box holds no element */
	return ipc_errf(err, -EINVAL,
	                "tensor '%s' box at %s shape %s, held by rank %d, was %s (the "
	                "nodes assigned the writers of replicas from different plans)",
	                h->name, off, shape, e->rank,
	                t ? "written only in part" : "written by no rank");
}

int cover_check(const struct manifest *m, char *err)
{
	struct cover cv = {.m = m};
	struct held *v;
	size_t n = 0, k = 0;
	int rc = 0;

	for (size_t r = 0; r < m->nranks; r++)
		n += m->ranks[r].holds ? m->ranks[r].nholds : 0;
	if (!n)
		return 0;
	v = calloc(n, sizeof(*v));
	cv.l.off = calloc(COVER_MAX_PIECES, sizeof(*cv.l.off));
	cv.l.shape = calloc(COVER_MAX_PIECES, sizeof(*cv.l.shape));
	cv.tmp.off = calloc(COVER_MAX_PIECES, sizeof(*cv.tmp.off));
	cv.tmp.shape = calloc(COVER_MAX_PIECES, sizeof(*cv.tmp.shape));
	if (!v || !cv.l.off || !cv.l.shape || !cv.tmp.off || !cv.tmp.shape) {
		rc = ipc_errf(err, -ENOMEM, "out of memory checking the chunks cover every box");
		goto out;
	}
	for (size_t r = 0; r < m->nranks; r++)
		for (size_t j = 0; m->ranks[r].holds && j < m->ranks[r].nholds; j++)
			v[k++] = (struct held){&m->ranks[r].holds[j], m->ranks[r].rank};
	qsort(v, k, sizeof(*v), cmp_held);
	for (size_t i = 0; i < k && !rc; i++)
		if (i == 0 || cmp_box(v[i - 1].h, v[i].h) != 0)
			rc = cover_one(&cv, &v[i], err);
out:
	free(v);
	free(cv.by);
	free(cv.l.off);
	free(cv.l.shape);
	free(cv.tmp.off);
	free(cv.tmp.shape);
	return rc;
}
