/*
 * Which saved chunks serve a plan's tensors on a restore: the extents the
 * reader (stream_read.c) reads. A tensor whose own saved chunk the
 * checkpoint has (the same rank, offset and shape) is that chunk, its bytes
 * as they are; any other (another world size or split, a tensor the rank
 * did not save, a chunk that failed and is left out) is assembled from the
 * saved chunks that overlap its box, each read whole so its checksum is
 * checked, its overlap copied run by run (layout/box.h). Runs on the
 * restore's thread; reads nothing but the manifest it is given.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/pipe/stream.h"
#include "agent/node/layouts.h"

static bool is_bad(const struct bad_chunk *b, size_t n, const struct manifest_chunk *c)
{
	for (size_t i = 0; i < n; i++)
		if (b[i].rank == c->rank && (b[i].begin == UINT64_MAX || b[i].begin == c->begin))
			return true;
	return false;
}

/* The extents being built for one restore: the reader's, grown as needed. */
struct extents {
	struct reader *r;
	size_t cap; /* of box */
	struct box_copy **box; /* what the extents' runs point to: the reader's, freed with it */
	size_t nbox;
	/* chunks that failed, left out: read the other copies of their boxes */
	const struct bad_chunk *bad;
	size_t nbad;
	unsigned start; /* a tensor's chunks are looked at from this one on (mod their number) */
};

static int ext_add(struct extents *x, const struct extent *e, const struct box_copy *bc)
{
	struct reader *r = x->r;

	if (r->n == r->cap) {
		size_t cap = r->cap * 2 + 8;
		struct extent *v = realloc(r->ext, cap * sizeof(*v));

		if (!v)
			return -ENOMEM;
		r->ext = v;
		r->cap = cap;
	}
	if (bc && x->nbox == x->cap) {
		size_t cap = x->cap * 2 + 8;
		struct box_copy **b = realloc(x->box, cap * sizeof(*b));

		if (!b)
			return -ENOMEM;
		x->box = b;
		x->cap = cap;
	}
	r->ext[r->n] = *e;
	if (bc) {
		if (!(x->box[x->nbox] = malloc(sizeof(*bc))))
			return -ENOMEM;
		*x->box[x->nbox] = *bc;
		r->ext[r->n].box = x->box[x->nbox++];
	}
	r->n++;
	return 0;
}

/* Saved chunk c read whole for the plan's tensor i: as it is, or its overlap's runs (bc). */
static int add_chunk(struct extents *x, const struct plan *p, size_t i,
                     const struct manifest_chunk *c, const struct box_copy *bc)
{
	const struct plan_tensor *t = &p->t[i];

	return ext_add(x,
	               &(struct extent){.rank = c->rank,
	                                .begin = c->begin,
	                                .end = c->end,
	                                .dst = t->dptr ? t->dptr : plan_tensor_addr(p, i),
	                                .device = t->dptr != NULL,
	                                .xxh3 = c->xxh3,
	                                .tensor = t->name},
	               bc);
}

/* Boxes of a tensor not yet covered by the chunks taken (assemble). */
struct uncovered {
	size_t n, cap;
	int64_t (*off)[IPC_MAX_NDIM], (*shape)[IPC_MAX_NDIM];
};

static int unc_push(struct uncovered *u, size_t nd, const int64_t *off, const int64_t *shape)
{
	if (u->n == u->cap) {
		size_t cap = u->cap * 2 + 8;
		int64_t(*o)[IPC_MAX_NDIM] = realloc(u->off, cap * sizeof(*o));
		int64_t(*s)[IPC_MAX_NDIM] = o ? realloc(u->shape, cap * sizeof(*s)) : NULL;

		if (o)
			u->off = o;
		if (s)
			u->shape = s;
		if (!o || !s)
			return -ENOMEM;
		u->cap = cap;
	}
	memcpy(u->off[u->n], off, nd * sizeof(*off));
	memcpy(u->shape[u->n], shape, nd * sizeof(*shape));
	u->n++;
	return 0;
}

/* The uncovered boxes less box (off, shape); whether it covered any of them. */
static int unc_cut(struct uncovered *u, size_t nd, const int64_t *off, const int64_t *shape,
                   bool *useful)
{
	int64_t io[IPC_MAX_NDIM], is[IPC_MAX_NDIM];
	int64_t ro[2 * IPC_MAX_NDIM][IPC_MAX_NDIM], rs[2 * IPC_MAX_NDIM][IPC_MAX_NDIM];
	size_t n = u->n;
	int rc = 0;

	*useful = false;
	for (size_t k = 0; k < n && !rc;) {
		size_t m;

		if (!box_intersect(nd, u->off[k], u->shape[k], off, shape, io, is)) {
			k++;
			continue;
		}
		*useful = true;
		m = box_subtract(nd, u->off[k], u->shape[k], io, is, ro, rs);
		/* box k goes: the last of the old ones takes its place, the rest comes after */
		if (k != n - 1) {
			memcpy(u->off[k], u->off[n - 1], sizeof(u->off[k]));
			memcpy(u->shape[k], u->shape[n - 1], sizeof(u->shape[k]));
		}
		memmove(u->off[n - 1], u->off[n], (u->n - n) * sizeof(*u->off));
		memmove(u->shape[n - 1], u->shape[n], (u->n - n) * sizeof(*u->shape));
		u->n--;
		n--;
		for (size_t j = 0; j < m && !rc; j++)
			rc = unc_push(u, nd, ro[j], rs[j]);
	}
	return rc;
}

/*
 * The plan's tensor i from the saved chunks that overlap its box, each
 * read whole (its checksum is checked) and its overlap copied into place:
 * another world size, another split, or a tensor the rank did not save.
 * Which chunks: this rank's own first, then one holding the whole box, then
 * any that covers what is still missing; replicas are tried from this
 * rank's position in the manifest's order, so ranks restoring together
 * spread over the copies. The box must be covered whole (-EINVAL: the plan
 * does not match the checkpoint).
 */
static int assemble(const struct plan *p, size_t i, const struct manifest_tensor *mt,
                    const int64_t *off, struct extents *x, char *err)
{
	const struct plan_tensor *t = &p->t[i];
	const size_t nd = t->ndim, nc = mt->nchunks;
	bool *taken = calloc(nc ? nc : 1, sizeof(*taken));
	struct uncovered u = {0};
	uint64_t want = box_volume(nd, t->shape), left = 0;
	char box[256], at[256];
	int rc = taken ? unc_push(&u, nd, off, t->shape) : -ENOMEM;

	for (int pass = 0; pass < 3 && !rc && u.n; pass++)
		for (size_t n = 0; n < nc && !rc && u.n; n++) {
			size_t j = (n + x->start) % nc;
			const struct manifest_chunk *c = &mt->chunks[j];
			int64_t oo[IPC_MAX_NDIM], os[IPC_MAX_NDIM];
			struct box_copy bc;
			bool useful;

			if (taken[j] || (pass == 0 && c->rank != p->rank) ||
			    (pass == 1 &&
			     !box_contains(nd, c->global_offset, c->shape, off, t->shape)) ||
			    is_bad(x->bad, x->nbad, c) ||
			    !box_intersect(nd, c->global_offset, c->shape, off, t->shape, oo, os))
				continue;
			if ((rc = unc_cut(&u, nd, oo, os, &useful)) || !useful)
				continue; /* out of memory, or all of it held already */
			taken[j] = true;
			/* the whole overlap, though part may be held already: the same bytes */
			box_copy_init(&bc, nd, ipc_dtype_size(t->dtype), c->global_offset, c->shape,
			              off, t->shape, oo, os);
			rc = add_chunk(x, p, i, c, &bc);
		}
	for (size_t k = 0; k < u.n; k++)
		left += box_volume(nd, u.shape[k]);
	free(u.off);
	free(u.shape);
	free(taken);
	if (rc)
		return ipc_errf(err, rc, "out of memory");
	if (left) {
		box_text(t->shape, nd, box, sizeof(box));
		box_text(off, nd, at, sizeof(at));
		return ipc_errf(
		    err, -EINVAL,
		    "tensor '%s': the checkpoint holds %llu of the %llu elements of this "
		    "rank's box %s at %s",
		    t->name, (unsigned long long)(want - left), (unsigned long long)want, box, at);
	}
	return 0;
}

/*
 * The plan's tensor i against the manifest: its own chunk, the bytes as
 * they are, where the checkpoint has it (the same rank, offset and shape);
 * else assembled from the chunks that overlap it.
 */
static int match_tensor(const struct plan *p, size_t i, const struct manifest *m, struct extents *x,
                        char *err)
{
	const struct plan_tensor *t = &p->t[i];
	const struct manifest_tensor *mt = manifest_find(m, t->name);
	const int64_t zero[IPC_MAX_NDIM] = {0}, *off = t->sharded ? t->global_offset : zero;
	char want[256], have[256];
	int rc;

	if (!mt)
		return ipc_errf(err, -EINVAL, "tensor '%s' is not in the checkpoint", t->name);
	box_text(t->global_shape, t->ndim, want, sizeof(want));
	box_text(mt->global_shape, mt->ndim, have, sizeof(have));
	if (mt->dtype != t->dtype || mt->ndim != t->ndim ||
	    memcmp(mt->global_shape, t->global_shape, t->ndim * sizeof(int64_t)))
		return ipc_errf(err, -EINVAL,
		                "tensor '%s': the checkpoint has %s %s, the plan %s %s", t->name,
		                ipc_dtype_name(mt->dtype), have, ipc_dtype_name(t->dtype), want);
	for (size_t j = 0; j < mt->nchunks; j++) {
		const struct manifest_chunk *ch = &mt->chunks[j];

		if (ch->rank != p->rank || is_bad(x->bad, x->nbad, ch) ||
		    memcmp(ch->shape, t->shape, t->ndim * sizeof(int64_t)) ||
		    memcmp(ch->global_offset, off, t->ndim * sizeof(int64_t)))
			continue;
		rc = add_chunk(x, p, i, ch, NULL);
		return rc ? ipc_errf(err, rc, "out of memory") : 0;
	}
	return assemble(p, i, mt, off, x, err);
}

int restore_map(struct reader *r, const struct plan *p, const struct manifest *m,
                const struct bad_chunk *bad, size_t nbad, unsigned start, char *err)
{
	struct extents x = {r, 0, NULL, 0, bad, nbad, start};
	int rc = 0;

	for (size_t i = 0; i < p->n && !rc; i++)
		rc = match_tensor(p, i, m, &x, err);
	r->boxes = x.box; /* freed with the reader */
	r->nboxes = x.nbox;
	return rc;
}
