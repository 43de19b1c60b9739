/*
 * cover.c: every held box is covered by written chunks. Replicas hold the
 * same boxes, so each distinct box is checked once: sorted by (name,
 * offset, shape), then the chunks of its tensor are subtracted from it
 * until nothing (covered) or the chunks run out (a hole).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "box.h"
#include "cover.h"

struct held {
	const struct manifest_tensor *h; /* one chunk: the box */
	int rank;
};

static int cmp_held(const void *x, const void *y)
{
	const struct held *a = x, *b = y;
	int c = strcmp(a->h->name, b->h->name);

	if (!c)
		c = memcmp(a->h->chunks[0].global_offset, b->h->chunks[0].global_offset,
		           sizeof(a->h->chunks[0].global_offset));
	if (!c)
		c = memcmp(a->h->chunks[0].shape, b->h->chunks[0].shape,
		           sizeof(a->h->chunks[0].shape));
	return c ? c : a->rank - b->rank;
}

static bool same_box(const struct held *a, const struct held *b)
{
	return strcmp(a->h->name, b->h->name) == 0 &&
	       !memcmp(a->h->chunks[0].global_offset, b->h->chunks[0].global_offset,
	               sizeof(a->h->chunks[0].global_offset)) &&
	       !memcmp(a->h->chunks[0].shape, b->h->chunks[0].shape, sizeof(a->h->chunks[0].shape));
}

struct left {
	int64_t (*off)[IPC_MAX_NDIM], (*shape)[IPC_MAX_NDIM];
	size_t n;
};

/* Box e's rows still uncovered, less chunk c; -E2BIG past COVER_MAX_PIECES. */
static int subtract(struct left *l, struct left *tmp, size_t nd, const struct manifest_chunk *c)
{
	size_t n = 0;

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

/* Box e of a held tensor against the chunks of its tensor in m. */
static int cover_one(const struct manifest *m, const struct held *e, struct left *l,
                     struct left *tmp, char *err)
{
	const struct manifest_tensor *h = e->h, *t = manifest_find(m, h->name);
	char off[128], shape[128];
	int rc = 0;

	if (t && (t->dtype != h->dtype || t->ndim != h->ndim ||
	          memcmp(t->global_shape, h->global_shape, t->ndim * sizeof(int64_t))))
		t = NULL;
	memcpy(l->off[0], h->chunks[0].global_offset, sizeof(l->off[0]));
	memcpy(l->shape[0], h->chunks[0].shape, sizeof(l->shape[0]));
	l->n = box_volume(h->ndim, h->chunks[0].shape) ? 1 : 0;
	for (size_t j = 0; t && j < t->nchunks && l->n && !rc; j++) {
		struct left swap;

		rc = subtract(l, tmp, t->ndim, &t->chunks[j]);
		swap = *l;
		*l = *tmp;
		*tmp = swap;
	}
	if (!rc && !l->n)
		return 0;
	off[0] = shape[0] = '\0';
	for (size_t d = 0, po = 0, ps = 0; d < h->ndim; d++) {
		po += (size_t)snprintf(off + po, po < sizeof(off) ? sizeof(off) - po : 0, "%s%lld",
		                       d ? "," : "", (long long)h->chunks[0].global_offset[d]);
		ps += (size_t)snprintf(shape + ps, ps < sizeof(shape) ? sizeof(shape) - ps : 0,
		                       "%s%lld", d ? "," : "", (long long)h->chunks[0].shape[d]);
	}
	if (rc)
		return ipc_errf(err, rc,
		                "tensor '%s' box at [%s] shape [%s] (held by rank %d): its chunks "
		                "cut it into more than %u pieces",
		                h->name, off, shape, e->rank, COVER_MAX_PIECES);
	return ipc_errf(err, -EINVAL,
	                "tensor '%s' box at [%s] shape [%s], held by rank %d, was %s (the "
	                "nodes assigned the writers of replicas from different plans)",
	                h->name, off, shape, e->rank,
	                t ? "written only in part" : "written by no rank");
}

int cover_check(const struct manifest *m, char *err)
{
	struct left l = {0}, tmp = {0};
	struct held *v;
	size_t n = 0, k = 0;
	int rc = 0;

	for (size_t r = 0; r < m->nranks; r++)
		n += m->ranks[r].holds ? m->ranks[r].nholds : 0;
	if (!n)
		return 0;
	v = calloc(n, sizeof(*v));
	l.off = calloc(COVER_MAX_PIECES, sizeof(*l.off));
	l.shape = calloc(COVER_MAX_PIECES, sizeof(*l.shape));
	tmp.off = calloc(COVER_MAX_PIECES, sizeof(*tmp.off));
	tmp.shape = calloc(COVER_MAX_PIECES, sizeof(*tmp.shape));
	if (!v || !l.off || !l.shape || !tmp.off || !tmp.shape) {
		rc = ipc_errf(err, -ENOMEM, "out of memory checking the chunks cover every box");
		goto out;
	}
	for (size_t r = 0; r < m->nranks; r++)
		for (size_t j = 0; m->ranks[r].holds && j < m->ranks[r].nholds; j++)
			v[k++] = (struct held){&m->ranks[r].holds[j], m->ranks[r].rank};
	qsort(v, k, sizeof(*v), cmp_held);
	for (size_t i = 0; i < k && !rc; i++)
		if (i == 0 || !same_box(&v[i - 1], &v[i]))
			rc = cover_one(m, &v[i], &l, &tmp, err);
out:
	free(v);
	free(l.off);
	free(l.shape);
	free(tmp.off);
	free(tmp.shape);
	return rc;
}
