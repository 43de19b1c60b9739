/*
 * The writers of replicated boxes (assign.h). Greedy by size, as
 * veScale/ByteCheckpoint balance their dedup: each rank starts with the
 * bytes it must write anyway (its private tensors, and boxes no other rank
 * holds); each replicated box is cut into as many pieces of whole rows
 * (its first dimension) as its replicas can take (R / copies), its rows
 * allow and its size over ASSIGN_MIN_PIECE says; then the pieces, largest first, each go
 * to the replica that has the fewest bytes so far and writes no piece of
 * that box yet (ties: the lowest rank). Each further copy of a piece goes
 * to a replica on a node that holds no copy of it yet where one exists.
 *
 * Order independence: entries are sorted by box then rank, and pieces of
 * equal size by their box's key and row, so only the plans' contents decide.
 */
#define _GNU_SOURCE /* qsort_r */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "layout/assign.h"
#include "ipc/base/base.h"

/* One rank's tensor that is part of a box (it has a global offset). */
struct entry {
	const struct manifest_tensor *t;
	size_t ri; /* its rank's index in the assignment */
	size_t ti; /* the tensor's in the rank's plan */
	uint64_t nbytes;
};

/* A piece of a box held by several ranks: entries [first, first + n) of the sorted array. */
struct piece {
	size_t first, n;
	int64_t row0, rows;
	uint64_t nbytes;
};

static int cmp_dims(const int64_t *a, const int64_t *b, size_t n)
{
	for (size_t d = 0; d < n; d++)
		if (a[d] != b[d])
			return a[d] < b[d] ? -1 : 1;
	return 0;
}

/* The box's identity: name, dtype, rank of the shape, global shape, offset, local shape. */
static int cmp_key(const struct manifest_tensor *a, const struct manifest_tensor *b)
{
	int c = strcmp(a->name, b->name);

	if (c)
		return c;
	if (a->dtype != b->dtype)
		return a->dtype < b->dtype ? -1 : 1;
	if (a->ndim != b->ndim)
		return a->ndim < b->ndim ? -1 : 1;
	if ((c = cmp_dims(a->global_shape, b->global_shape, a->ndim)) ||
	    (c = cmp_dims(a->chunks[0].global_offset, b->chunks[0].global_offset, a->ndim)))
		return c;
	return cmp_dims(a->chunks[0].shape, b->chunks[0].shape, a->ndim);
}

static int cmp_entry(const void *pa, const void *pb)
{
	const struct entry *a = pa, *b = pb;
	int c = cmp_key(a->t, b->t);

	if (c)
		return c;
	return a->ri < b->ri ? -1 : a->ri > b->ri;
}

/* Largest first; equal sizes by box (the entries are sorted, so by index), then row. */
static int cmp_piece(const void *pa, const void *pb)
{
	const struct piece *a = pa, *b = pb;

	if (a->nbytes != b->nbytes)
		return a->nbytes > b->nbytes ? -1 : 1;
	if (a->first != b->first)
		return a->first < b->first ? -1 : 1;
	return a->row0 < b->row0 ? -1 : a->row0 > b->row0;
}

static int cmp_input(const void *pa, const void *pb)
{
	const struct assign_input *a = pa, *b = pb;

	return a->rank->rank < b->rank->rank ? -1 : a->rank->rank > b->rank->rank;
}

static bool same_node(const char *a, const char *b)
{
	return a && b && strcmp(a, b) == 0;
}

static int64_t rows_of(const struct manifest_tensor *t)
{
	return t->ndim ? t->chunks[0].shape[0] : 1;
}

/*
 * The next writer of piece p, whose writers so far are the entries
 * w[0, nw): a replica writing no piece of its box yet, on a node with no
 * copy yet if any is, the least loaded, the lowest rank. Its index in the
 * entries, or (size_t)-1 when no replica is left.
 */
static size_t pick(const struct assignment *a, const struct entry *e, const struct piece *p,
                   const size_t *w, unsigned nw)
{
	size_t best = (size_t)-1;
	bool best_fresh = false;

	for (size_t i = p->first; i < p->first + p->n; i++) {
		const struct assign_rank *r = &a->r[e[i].ri];
		bool fresh = true;

		if (r->piece[e[i].ti].writes)
			continue;
		for (unsigned j = 0; j < nw && fresh; j++)
			if (same_node(a->r[e[w[j]].ri].node, r->node))
				fresh = false;
		/* entries ascend by rank: on a tie the lower stays */
		if (best == (size_t)-1 || (fresh && !best_fresh) ||
		    (fresh == best_fresh && r->bytes < a->r[e[best].ri].bytes))
			best = i, best_fresh = fresh;
	}
	return best;
}

static void give(struct assignment *a, const struct entry *e, int64_t row0, int64_t rows,
                 uint64_t nbytes)
{
	struct assign_rank *r = &a->r[e->ri];

	r->piece[e->ti] = (struct assign_piece){true, row0, rows, nbytes};
	r->bytes += nbytes;
	a->written_bytes += nbytes;
}

/* The ranks, sorted, with what they must write; the entries of their boxes into *ents. */
static int collect(struct assignment *a, struct assign_input *in, size_t n, struct entry **ents,
                   size_t *nents, char *err)
{
	uint64_t total = 0; /* every count of bytes below is at most this: none wraps */
	size_t cap = 0, k = 0;
	char msg[IPC_ERRLEN];
	struct entry *e;

	qsort(in, n, sizeof(*in), cmp_input);
	for (size_t i = 0; i < n; i++) {
		if (i && in[i].rank->rank == in[i - 1].rank->rank)
			return ipc_errf(err, -EINVAL,
			                "rank %d is in the plans twice (nodes %s and %s)",
			                in[i].rank->rank, in[i - 1].node ? in[i - 1].node : "?",
			                in[i].node ? in[i].node : "?");
		cap += in[i].rank->ntensors;
	}
	e = calloc(cap ? cap : 1, sizeof(*e));
	if (!e)
		return ipc_errf(err, -ENOMEM, "out of memory");
	*ents = e;
	for (size_t i = 0; i < n; i++) {
		const struct plans_rank *pr = in[i].rank;
		struct assign_rank *r = &a->r[i];

		r->rank = pr->rank;
		r->node = in[i].node;
		r->ntensors = pr->ntensors;
		r->piece = calloc(pr->ntensors ? pr->ntensors : 1, sizeof(*r->piece));
		if (!r->piece)
			return ipc_errf(err, -ENOMEM, "out of memory");
		a->nranks = i + 1;
		for (size_t t = 0; t < pr->ntensors; t++) {
			const struct manifest_tensor *mt = &pr->tensors[t];
			uint64_t nb;
			int rc;

			if (mt->nchunks != 1)
				return ipc_errf(err, -EINVAL,
				                "rank %d, tensor '%s': %zu pieces in a plan",
				                r->rank, mt->name, mt->nchunks);
			rc = ipc_tensor_nbytes(mt->name, mt->dtype, mt->ndim, mt->chunks[0].shape,
			                       &nb, msg);
			if (rc)
				return ipc_errf(err, rc, "rank %d: %s", r->rank, msg);
			/* rows x pieces too: a box's rows are at most its bytes, its pieces its
			 * ranks */
			if (__builtin_add_overflow(total, nb, &total))
				return ipc_errf(
				    err, -EOVERFLOW,
				    "rank %d, tensor '%s': the plans hold more bytes in all "
				    "than can be counted",
				    r->rank, mt->name);
			r->held_bytes += nb;
			e[k] = (struct entry){mt, i, t, nb};
			if (mt->sharded) {
				k++;
				continue;
			}
			give(a, &e[k], 0, rows_of(mt), nb); /* private: its own */
			r->private_bytes += nb;
			a->unique_bytes += nb;
		}
	}
	*nents = k;
	return 0;
}

/*
 * The boxes of the sorted entries: one a single rank holds is its to write,
 * counted before any choice; the others cut into pieces (into *out).
 */
static int cut(struct assignment *a, const struct entry *e, size_t ne, struct piece **out,
               size_t *nout, char *err)
{
	size_t np = 0, cap = 0;
	struct piece *p = NULL;

	for (size_t i = 0, j; i < ne; i = j) {
		int64_t rows = rows_of(e[i].t);
		uint64_t k, most;

		for (j = i + 1; j < ne && cmp_key(e[i].t, e[j].t) == 0; j++)
			if (e[j].ri == e[j - 1].ri) /* sorted by rank within a box */
				return ipc_errf(err, -EINVAL, "rank %d holds tensor '%s' twice",
				                a->r[e[j].ri].rank, e[j].t->name);
		a->unique_bytes += e[i].nbytes;
		if (j - i == 1) {
			give(a, &e[i], 0, rows, e[i].nbytes);
			a->r[e[i].ri].private_bytes += e[i].nbytes;
			continue;
		}
		a->nboxes++;
		k = (j - i) / a->copies;
		most = e[i].nbytes / ASSIGN_MIN_PIECE;
		k = k < most ? k : most;
		k = k < (uint64_t)rows ? k : (uint64_t)rows;
		k = k ? k : 1;
		if (np + k > cap) {
			size_t nc = (np + k) * 2;
			struct piece *q = realloc(p, nc * sizeof(*p));

			if (!q) {
				free(p);
				return ipc_errf(err, -ENOMEM, "out of memory");
			}
			p = q, cap = nc;
		}
		for (uint64_t s = 0; s < k; s++) {
			int64_t r0 = (int64_t)(s * (uint64_t)rows / k);
			int64_t r1 = (int64_t)((s + 1) * (uint64_t)rows / k);
			uint64_t row_bytes = rows ? e[i].nbytes / (uint64_t)rows : 0;

			p[np++] =
			    (struct piece){i, j - i, r0, r1 - r0,
			                   k == 1 ? e[i].nbytes : (uint64_t)(r1 - r0) * row_bytes};
		}
	}
	*out = p;
	*nout = np;
	return 0;
}

int assign_compute(const struct assign_input *in0, size_t n, unsigned copies,
                   struct assignment **out, char *err)
{
	struct assignment *a = calloc(1, sizeof(*a));
	struct assign_input *in = malloc((n ? n : 1) * sizeof(*in));
	struct entry *e = NULL;
	struct piece *p = NULL;
	size_t ne = 0, np = 0, *w = NULL;
	int rc;

	*out = NULL;
	if (!a || !in || !(a->r = calloc(n ? n : 1, sizeof(*a->r))) ||
	    !(w = calloc(n + 1, sizeof(*w)))) { /* a piece has at most n writers */
		rc = ipc_errf(err, -ENOMEM, "out of memory");
		goto fail;
	}
	a->copies = copies ? copies : 1;
	if (n)
		memcpy(in, in0, n * sizeof(*in));
	if ((rc = collect(a, in, n, &e, &ne, err)))
		goto fail;
	qsort(e, ne, sizeof(*e), cmp_entry);
	if ((rc = cut(a, e, ne, &p, &np, err)))
		goto fail;
	if (np) /* none: no piece array at all */
		qsort(p, np, sizeof(*p), cmp_piece);
	a->npieces = np;
	for (size_t i = 0; i < np; i++) {
		unsigned k;

		for (k = 0; k < a->copies; k++) {
			if ((w[k] = pick(a, e, &p[i], w, k)) == (size_t)-1)
				break;
			give(a, &e[w[k]], p[i].row0, p[i].rows, p[i].nbytes);
		}
		if (k < a->copies)
			a->nshort++;
	}
	rc = 0;
	*out = a;
	a = NULL;
fail:
	free(w);
	free(p);
	free(e);
	free(in);
	assign_free(a);
	return rc;
}

void assign_free(struct assignment *a)
{
	if (!a)
		return;
	for (size_t i = 0; a->r && i < a->nranks; i++)
		free(a->r[i].piece);
	free(a->r);
	free(a);
}

const struct assign_rank *assign_rank(const struct assignment *a, int rank)
{
	size_t lo = 0, hi = a->nranks;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (a->r[mid].rank == rank)
			return &a->r[mid];
		if (a->r[mid].rank < rank)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

/* Whether p is all of t's rows. */
static bool whole(const struct assign_piece *p, const struct manifest_tensor *t)
{
	return p->writes && p->row0 == 0 && p->rows == rows_of(t);
}

static int cmp_by_name(const void *a, const void *b, void *tensors)
{
	const struct manifest_tensor *t = tensors;

	return strcmp(t[*(const size_t *)a].name, t[*(const size_t *)b].name);
}

/*
 * k's tensors in name order (a share's cuts name them so: the plan's own
 * order is not in its signature): ord[j] is the index in k of the j-th.
 * Names are unique within a plan. NULL: out of memory.
 */
static size_t *name_order(const struct plans_rank *k)
{
	size_t *ord = malloc((k->ntensors + 1) * sizeof(*ord));

	if (!ord)
		return NULL;
	for (size_t i = 0; i < k->ntensors; i++)
		ord[i] = i;
	qsort_r(ord, k->ntensors, sizeof(*ord), cmp_by_name, k->tensors);
	return ord;
}

int assign_share_of(const struct assign_rank *r, const struct plans_rank *k, struct share_rank *out)
{
	size_t n = 0, *ord;

	memset(out, 0, sizeof(*out));
	out->rank = r->rank;
	out->ntensors = k->ntensors;
	if (tensors_signature(k->tensors, k->ntensors, &out->sig))
		return -ENOMEM;
	if (r->bytes == r->held_bytes || r->ntensors != k->ntensors)
		return 0; /* it writes all it holds */
	for (size_t i = 0; i < k->ntensors; i++)
		n += !whole(&r->piece[i], &k->tensors[i]);
	if (!(ord = name_order(k)) || !(out->cuts = calloc(n + 1, sizeof(*out->cuts)))) {
		free(ord);
		return -ENOMEM;
	}
	for (size_t j = 0; j < k->ntensors; j++) {
		const struct assign_piece *p = &r->piece[ord[j]];

		if (!whole(p, &k->tensors[ord[j]]))
			out->cuts[out->ncuts++] =
			    (struct share_cut){j, p->writes ? p->row0 : 0, p->writes ? p->rows : 0};
	}
	free(ord);
	return 0;
}

/* Cut c of tensor t into piece p: -EINVAL with err where t cannot be cut so. */
static int piece_of_cut(const struct share_cut *c, const struct manifest_tensor *t, int rank,
                        struct assign_piece *p, char *err)
{
	const int64_t rows = rows_of(t);
	uint64_t nb;
	int rc;

	if (!t->sharded)
		return ipc_errf(err, -EINVAL,
		                "rank %d, tensor '%s': a share cuts a tensor its rank alone holds",
		                rank, t->name);
	if (c->row0 > rows || c->rows > rows - c->row0)
		return ipc_errf(
		    err, -EINVAL, "rank %d, tensor '%s': a share gives rows %lld+%lld of its %lld",
		    rank, t->name, (long long)c->row0, (long long)c->rows, (long long)rows);
	rc = ipc_tensor_nbytes(t->name, t->dtype, t->ndim, t->chunks[0].shape, &nb, err);
	if (rc)
		return rc;
	*p = (struct assign_piece){c->rows > 0, c->rows ? c->row0 : 0, c->rows,
	                           rows ? nb / (uint64_t)rows * (uint64_t)c->rows : 0};
	return 0;
}

int assign_rank_of_share(const struct share_rank *s, const struct plans_rank *k,
                         struct assign_rank *out, char *err)
{
	uint64_t sig;
	size_t c = 0, *ord;
	int rc = 0;

	memset(out, 0, sizeof(*out));
	if (tensors_signature(k->tensors, k->ntensors, &sig))
		return ipc_errf(err, -ENOMEM, "out of memory");
	if (s->rank != k->rank || s->sig != sig || s->ntensors != k->ntensors)
		return ipc_errf(err, -EINVAL,
		                "the share of rank %d is for other plans than rank %d's (%zu "
		                "tensors, signature %016llx; its plan: %zu, %016llx)",
		                s->rank, k->rank, s->ntensors, (unsigned long long)s->sig,
		                k->ntensors, (unsigned long long)sig);
	out->rank = k->rank;
	out->ntensors = k->ntensors;
	ord = name_order(k);
	if (!ord || !(out->piece = calloc(k->ntensors + 1, sizeof(*out->piece)))) {
		free(ord);
		return ipc_errf(err, -ENOMEM, "out of memory");
	}
	/* the cuts name the tensors in name order */
	for (size_t j = 0; !rc && j < k->ntensors; j++) {
		const struct manifest_tensor *t = &k->tensors[ord[j]];
		struct assign_piece *p = &out->piece[ord[j]];
		uint64_t nb = 0;

		if ((rc = ipc_tensor_nbytes(t->name, t->dtype, t->ndim, t->chunks[0].shape, &nb,
		                            err)))
			break;
		out->held_bytes += nb;
		*p = (struct assign_piece){true, 0, rows_of(t), nb};
		if (c < s->ncuts && s->cuts[c].tensor == j)
			rc = piece_of_cut(&s->cuts[c++], t, k->rank, p, err);
		out->bytes += p->nbytes;
	}
	free(ord);
	if (!rc && c < s->ncuts) /* cuts ascend, each below ntensors: all were met */
		rc = ipc_errf(err, -EINVAL, "rank %d: a share's cuts are out of order", k->rank);
	if (rc) {
		free(out->piece);
		out->piece = NULL;
	}
	return rc;
}

int assign_written_signature(const struct assign_rank *r, const struct plans_rank *k, uint64_t *sig)
{
	struct manifest_tensor *v = calloc(k->ntensors + 1, sizeof(*v));
	struct manifest_chunk *c = calloc(k->ntensors + 1, sizeof(*c));
	size_t n = 0;
	int rc;

	if (!v || !c) {
		free(v);
		free(c);
		return -ENOMEM;
	}
	for (size_t i = 0; i < k->ntensors && i < r->ntensors; i++) {
		const struct assign_piece *p = &r->piece[i];
		const struct manifest_tensor *t = &k->tensors[i];

		if (!p->writes)
			continue;
		v[n] = *t; /* its name and shape, borrowed */
		c[n] = t->chunks[0];
		v[n].chunks = &c[n];
		v[n].nchunks = 1;
		if (t->ndim && !whole(p, t)) {
			c[n].shape[0] = p->rows;
			c[n].global_offset[0] += p->row0;
		}
		n++;
	}
	rc = tensors_signature(v, n, sig);
	free(v);
	free(c);
	return rc;
}

double assign_balance(const struct assignment *a)
{
	uint64_t max = 0, sum = 0;
	size_t n = 0;

	for (size_t i = 0; i < a->nranks; i++) {
		const struct assign_rank *r = &a->r[i];

		if (!r->held_bytes)
			continue; /* an empty plan: nothing it could take */
		max = r->bytes > max ? r->bytes : max;
		sum += r->bytes;
		n++;
	}
	return n && sum ? (double)max / ((double)sum / (double)n) : 1.0;
}
