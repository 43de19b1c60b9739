/*
 * Who writes each replicated box (layout/assign.c), on plans that mimic
 * transformer models split DP x TP x PP (Megatron's rank order: tensor
 * parallel fastest, then data parallel, then pipeline stages; column-
 * parallel weights cut on dimension 0, row-parallel ones on dimension 1,
 * the vocabulary on dimension 0, layer norms whole on every rank; one
 * private tensor per rank):
 *   - every box is written whole, each row once, by ranks that hold it;
 *     written bytes = unique bytes
 *   - balanced within 5 % (max/mean bytes written), where "the lowest rank
 *     writes" (DCP's first dedup) and DCP's in-order greedy
 *     (dedup_save_plans) are printed beside it, the first far worse
 *   - the same assignment whatever order the plans come in
 *   - copies = 2: each piece on two ranks of different nodes; more copies
 *     than replicas: the pieces are counted short
 *   - private tensors and boxes one rank holds are their rank's; a rank
 *     twice is refused
 *   - each rank's share (what rank 0's node writes for its node) gives its
 *     entry back exactly; one that cannot be of the rank's plan is refused
 */
#include <check.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layout/assign.h"
#include "support/check_main.h"

#define F32 12
#define BF16 9
#define U8 2
#define MAXT 256

/* A job's plans: its ranks, their nodes. */
struct job {
	int world;
	struct plans_rank *r;
	struct assign_input *in;
	char (*node)[16];
};

static char err[IPC_ERRLEN];

static void add(struct plans_rank *r, const char *name, int dtype, size_t ndim,
                const int64_t *gshape, const int64_t *goff, const int64_t *shape, bool sharded)
{
	struct manifest_tensor *t = &r->tensors[r->ntensors++];

	ck_assert(r->ntensors <= MAXT);
	t->name = strdup(name);
	t->dtype = dtype;
	t->ndim = ndim;
	t->sharded = sharded;
	t->nchunks = 1;
	t->chunks = calloc(1, sizeof(*t->chunks));
	t->chunks[0].rank = r->rank;
	for (size_t d = 0; d < ndim; d++) {
		t->global_shape[d] = gshape[d];
		t->chunks[0].global_offset[d] = sharded ? goff[d] : 0;
		t->chunks[0].shape[d] = shape[d];
	}
}

/* A 2-d weight [g0, g1] cut tp ways on dimension dim (-1: whole on every rank). */
static void weight(struct plans_rank *r, const char *name, int dtype, int64_t g0, int64_t g1,
                   int dim, int tp, int t)
{
	int64_t g[2] = {g0, g1}, off[2] = {0, 0}, s[2] = {g0, g1};

	if (dim >= 0) {
		s[dim] = g[dim] / tp;
		off[dim] = s[dim] * t;
	}
	add(r, name, dtype, 2, g, off, s, true);
}

/*
 * dp x tp x pp ranks, `per_node` to a node; `layers` transformer layers of
 * width h over the stages, a vocabulary of v on the first and last.
 */
static void make_job(struct job *j, int dp, int tp, int pp, int layers, int64_t h, int64_t v,
                     int dtype, int per_node)
{
	j->world = dp * tp * pp;
	j->r = calloc((size_t)j->world, sizeof(*j->r));
	j->in = calloc((size_t)j->world, sizeof(*j->in));
	j->node = calloc((size_t)j->world, sizeof(*j->node));
	for (int rank = 0; rank < j->world; rank++) {
		struct plans_rank *r = &j->r[rank];
		int t = rank % tp, stage = rank / (dp * tp);
		char name[64];
		int64_t rng = 16;

		r->rank = rank;
		r->tensors = calloc(MAXT, sizeof(*r->tensors));
		snprintf(j->node[rank], sizeof(j->node[rank]), "n%d", rank / per_node);
		j->in[rank] = (struct assign_input){j->node[rank], r};
		if (stage == 0)
			weight(r, "embedding", dtype, v, h, 0, tp, t);
		for (int l = stage * layers / pp; l < (stage + 1) * layers / pp; l++) {
			snprintf(name, sizeof(name), "layers.%d.qkv", l);
			weight(r, name, dtype, 3 * h, h, 0, tp, t);
			snprintf(name, sizeof(name), "layers.%d.proj", l);
			weight(r, name, dtype, h, h, 1, tp, t);
			snprintf(name, sizeof(name), "layers.%d.up", l);
			weight(r, name, dtype, 4 * h, h, 0, tp, t);
			snprintf(name, sizeof(name), "layers.%d.down", l);
			weight(r, name, dtype, h, 4 * h, 1, tp, t);
			snprintf(name, sizeof(name), "layers.%d.norm", l);
			weight(r, name, dtype, 1, h, -1, tp, t);
		}
		if (stage == pp - 1)
			weight(r, "output", dtype, v, h, 0, tp, t);
		add(r, "rng_state", U8, 1, &rng, NULL, &rng, false); /* private */
	}
}

static void free_job(struct job *j)
{
	for (int i = 0; i < j->world; i++) {
		for (size_t t = 0; t < j->r[i].ntensors; t++) {
			free(j->r[i].tensors[t].name);
			free(j->r[i].tensors[t].chunks);
		}
		free(j->r[i].tensors);
	}
	free(j->r);
	free(j->in);
	free(j->node);
}

static uint64_t nbytes(const struct manifest_tensor *t)
{
	uint64_t n = t->dtype == F32 ? 4 : t->dtype == BF16 ? 2 : 1;

	for (size_t d = 0; d < t->ndim; d++)
		n *= (uint64_t)t->chunks[0].shape[d];
	return n;
}

/* A box's identity; a private tensor's is its rank's alone. */
static void key(const struct manifest_tensor *t, char *buf, size_t len)
{
	int n = snprintf(buf, len, "%s|%d", t->name, t->dtype);

	if (!t->sharded)
		n += snprintf(buf + n, len - (size_t)n, "|private to %d", t->chunks[0].rank);
	for (size_t d = 0; d < t->ndim; d++)
		n += snprintf(buf + n, len - (size_t)n, "|%" PRId64 ":%" PRId64 ":%" PRId64,
		              t->global_shape[d], t->chunks[0].global_offset[d],
		              t->chunks[0].shape[d]);
}

/* max/mean of per-rank bytes. */
static double balance_of(const uint64_t *bytes, int n)
{
	uint64_t max = 0, sum = 0;

	for (int i = 0; i < n; i++) {
		max = bytes[i] > max ? bytes[i] : max;
		sum += bytes[i];
	}
	return (double)max / ((double)sum / n);
}

/*
 * The baselines: lowest = the lowest rank holding a box writes it (DCP's
 * dedup_tensors); else DCP's dedup_save_plans, the plans in rank order and
 * each new box to the replica with the fewest bytes so far.
 */
static double baseline(const struct job *j, bool lowest)
{
	uint64_t *bytes = calloc((size_t)j->world, sizeof(*bytes));
	char(*seen)[256] = calloc(4096, sizeof(*seen));
	size_t nseen = 0;
	double b;

	for (int i = 0; i < j->world; i++)
		for (size_t t = 0; t < j->r[i].ntensors; t++) {
			const struct manifest_tensor *mt = &j->r[i].tensors[t];
			char k[256], k2[256];
			int best = i;
			bool dup = false;

			key(mt, k, sizeof(k));
			for (size_t s = 0; s < nseen && !dup; s++)
				dup = strcmp(seen[s], k) == 0;
			if (dup)
				continue;
			ck_assert(nseen < 4096);
			snprintf(seen[nseen++], sizeof(seen[0]), "%s", k);
			for (int o = i + 1; mt->sharded && !lowest && o < j->world; o++)
				for (size_t u = 0; u < j->r[o].ntensors; u++) {
					key(&j->r[o].tensors[u], k2, sizeof(k2));
					if (strcmp(k, k2) == 0 && bytes[o] < bytes[best])
						best = o;
				}
			bytes[best] += nbytes(mt);
		}
	b = balance_of(bytes, j->world);
	free(seen);
	free(bytes);
	return b;
}

static struct assignment *compute(struct job *j, unsigned copies)
{
	struct assignment *a;

	ck_assert_msg(assign_compute(j->in, (size_t)j->world, copies, &a, err) == 0, "%s", err);
	return a;
}

/* A piece written: its box and rows. */
struct written {
	char key[256];
	int64_t row0, rows, total; /* total: the box's rows */
	int rank;
};

static int cmp_written(const void *pa, const void *pb)
{
	const struct written *a = pa, *b = pb;
	int c = strcmp(a->key, b->key);

	return c ? c : a->row0 < b->row0 ? -1 : a->row0 > b->row0;
}

/* Every box of the job written whole, each row `copies` times, by ranks holding it. */
static void covers(const struct job *j, const struct assignment *a, unsigned copies)
{
	struct written *w = calloc(65536, sizeof(*w));
	size_t n = 0;
	uint64_t sum = 0;

	for (int i = 0; i < j->world; i++) {
		const struct assign_rank *r = assign_rank(a, i);

		ck_assert_ptr_nonnull(r);
		ck_assert_int_eq(r->ntensors, j->r[i].ntensors);
		for (size_t t = 0; t < r->ntensors; t++) {
			const struct manifest_tensor *mt = &j->r[i].tensors[t];

			if (!r->piece[t].writes)
				continue;
			ck_assert(n < 65536);
			key(mt, w[n].key, sizeof(w[n].key));
			w[n].row0 = r->piece[t].row0;
			w[n].rows = r->piece[t].rows;
			w[n].total = mt->chunks[0].shape[0];
			w[n].rank = i;
			ck_assert_uint_eq(r->piece[t].nbytes, nbytes(mt) /
			                                          (uint64_t)mt->chunks[0].shape[0] *
			                                          (uint64_t)w[n].rows);
			sum += r->piece[t].nbytes;
			n++;
		}
	}
	ck_assert_uint_eq(sum, a->written_bytes);
	qsort(w, n, sizeof(*w), cmp_written);
	/* per box: copies runs of rows from 0 to its end, each run contiguous */
	for (size_t i = 0, e; i < n; i = e) {
		int64_t covered[8] = {0};
		unsigned want = strstr(w[i].key, "|private") ? 1 : copies; /* not a box */

		for (e = i; e < n && strcmp(w[e].key, w[i].key) == 0; e++) {
			unsigned c = 0;

			/* the first copy whose rows end where this piece begins */
			while (c < want && covered[c] != w[e].row0)
				c++;
			ck_assert_msg(c < want, "%s: rows from %" PRId64 " written too often",
			              w[e].key, w[e].row0);
			covered[c] += w[e].rows;
			for (size_t o = i; o < e; o++) /* one piece of a box per rank */
				ck_assert_msg(w[o].rank != w[e].rank,
				              "%s: rank %d writes two pieces", w[e].key, w[e].rank);
		}
		for (unsigned c = 0; c < want; c++)
			ck_assert_msg(covered[c] == w[i].total,
			              "%s: copy %u holds %" PRId64 " rows of %" PRId64, w[i].key, c,
			              covered[c], w[i].total);
	}
	free(w);
}

static void balanced(int dp, int tp, int pp, int dtype)
{
	struct job j;
	struct assignment *a;
	double ours, low, dcp;

	make_job(&j, dp, tp, pp, 8, 1024, 32000, dtype, 8);
	a = compute(&j, 1);
	covers(&j, a, 1);
	ck_assert_uint_eq(a->written_bytes, a->unique_bytes);
	ours = assign_balance(a);
	low = baseline(&j, true);
	dcp = baseline(&j, false);
	printf("DP%d x TP%d x PP%d (%s, %zu boxes in %zu pieces, %.1f MiB unique): max/mean "
	       "bytes written: ckptd %.3f, DCP in-order greedy %.3f, lowest rank writes %.3f\n",
	       dp, tp, pp, dtype == F32 ? "f32" : "bf16", a->nboxes, a->npieces,
	       (double)a->unique_bytes / (1 << 20), ours, dcp, low);
	ck_assert_msg(ours <= 1.05, "max/mean %.3f", ours);
	ck_assert_msg(low >= 2.0 * ours, "lowest rank writes: %.3f", low);
	ck_assert_msg(dcp >= ours, "DCP's greedy %.3f beat ours %.3f", dcp, ours);
	assign_free(a);
	free_job(&j);
}

START_TEST(dp8_tp2_balanced)
{
	balanced(8, 2, 1, F32);
}
END_TEST

START_TEST(dp4_tp2_pp2_balanced)
{
	balanced(4, 2, 2, BF16);
}
END_TEST

START_TEST(dp16_tp1_balanced)
{
	balanced(16, 1, 1, F32);
}
END_TEST

/* Two assignments of one job are the same. */
static void same(const struct assignment *a, const struct assignment *b)
{
	ck_assert_uint_eq(a->nranks, b->nranks);
	ck_assert_uint_eq(a->npieces, b->npieces);
	for (size_t i = 0; i < a->nranks; i++) {
		ck_assert_int_eq(a->r[i].rank, b->r[i].rank);
		ck_assert_uint_eq(a->r[i].bytes, b->r[i].bytes);
		ck_assert(memcmp(a->r[i].piece, b->r[i].piece,
		                 a->r[i].ntensors * sizeof(*a->r[i].piece)) == 0);
	}
}

START_TEST(order_independent)
{
	struct job j;
	struct assignment *a, *b;
	unsigned seed = 7;

	make_job(&j, 4, 2, 2, 6, 768, 5000, F32, 4);
	a = compute(&j, 1);
	for (int round = 0; round < 20; round++) {
		/* the plans in another order (round 0: reversed) */
		for (int i = j.world - 1; i > 0; i--) {
			int k = round ? (int)(rand_r(&seed) % (unsigned)(i + 1)) : 0;
			struct assign_input t = j.in[i];

			if (!round && i < j.world / 2)
				break;
			if (!round)
				k = j.world - 1 - i;
			j.in[i] = j.in[k];
			j.in[k] = t;
		}
		b = compute(&j, 1);
		same(a, b);
		assign_free(b);
	}
	assign_free(a);
	free_job(&j);
}
END_TEST

START_TEST(two_copies_on_two_nodes)
{
	struct job j;
	struct assignment *a;

	/* DP 4 x TP 2, two ranks per node: each box's replicas on 4 nodes */
	make_job(&j, 4, 2, 1, 4, 1024, 8000, F32, 2);
	a = compute(&j, 2);
	covers(&j, a, 2);
	ck_assert_uint_eq(a->nshort, 0);
	for (size_t i = 0; i < a->nranks; i++)
		for (size_t t = 0; t < a->r[i].ntensors; t++) {
			const struct assign_piece *p = &a->r[i].piece[t];

			if (!p->writes || !j.r[i].tensors[t].sharded)
				continue;
			/* the other copy of these rows: on another node */
			for (size_t o = 0; o < a->nranks; o++) {
				const struct assign_piece *q = &a->r[o].piece[t];

				if (o == i || !q->writes || q->row0 != p->row0 ||
				    strcmp(j.r[o].tensors[t].name, j.r[i].tensors[t].name) ||
				    j.r[o].tensors[t].chunks[0].global_offset[0] !=
				        j.r[i].tensors[t].chunks[0].global_offset[0] ||
				    j.r[o].tensors[t].chunks[0].global_offset[1] !=
				        j.r[i].tensors[t].chunks[0].global_offset[1])
					continue;
				ck_assert_msg(strcmp(a->r[o].node, a->r[i].node) != 0,
				              "%s rows %" PRId64 ": both copies on %s",
				              j.r[i].tensors[t].name, p->row0, a->r[i].node);
			}
		}
	ck_assert_msg(assign_balance(a) <= 1.05, "max/mean %.3f", assign_balance(a));
	assign_free(a);
	free_job(&j);

	/* DP 2: three copies asked, two replicas: every piece short, each written twice */
	make_job(&j, 2, 1, 1, 2, 256, 1000, F32, 1);
	a = compute(&j, 3);
	ck_assert_uint_eq(a->nshort, a->npieces);
	ck_assert_uint_gt(a->npieces, 0);
	ck_assert_uint_eq(a->written_bytes,
	                  2 * a->unique_bytes - a->r[0].private_bytes - a->r[1].private_bytes);
	assign_free(a);
	free_job(&j);
}
END_TEST

/*
 * Each rank's share, as rank 0's node writes it for the rank's node (its
 * JSON both ways), gives back the rank's entry of the assignment exactly;
 * a share that cannot be of the rank's plan is refused.
 */
START_TEST(share_gives_the_entry)
{
	struct job j;
	struct assignment *a;
	size_t cut = 0;

	make_job(&j, 4, 2, 1, 4, 1024, 8192, BF16, 2);
	a = compute(&j, 1);
	for (size_t i = 0; i < a->nranks; i++) {
		const struct assign_rank *r = &a->r[i];
		const struct plans_rank *k = &j.r[r->rank];
		struct share_rank sr;
		struct plans_share sh = {"j", j.node[r->rank], "0", j.world, 0x42, 1, &sr}, *rd;
		struct assign_rank back;
		char *text;
		size_t len;

		ck_assert_int_eq(assign_share_of(r, k, &sr), 0);
		cut += sr.ncuts;
		ck_assert_msg(share_to_json(&sh, &text, &len, err) == 0, "%s", err);
		ck_assert_msg(share_from_json(text, len, &rd, err) == 0, "%s", err);
		ck_assert_msg(assign_rank_of_share(&rd->ranks[0], k, &back, err) == 0, "%s", err);
		ck_assert_uint_eq(back.bytes, r->bytes);
		ck_assert_uint_eq(back.held_bytes, r->held_bytes);
		ck_assert_uint_eq(back.ntensors, r->ntensors);
		ck_assert(memcmp(back.piece, r->piece, r->ntensors * sizeof(*r->piece)) == 0);
		free(back.piece);
		/* the same plan, its tensors in another order: the same piece of each */
		{
			struct plans_rank rev = *k;
			struct assign_rank back2;

			rev.tensors = calloc(k->ntensors, sizeof(*rev.tensors));
			ck_assert_ptr_nonnull(rev.tensors);
			for (size_t t = 0; t < k->ntensors; t++)
				rev.tensors[t] = k->tensors[k->ntensors - 1 - t];
			ck_assert_msg(assign_rank_of_share(&rd->ranks[0], &rev, &back2, err) == 0,
			              "%s", err);
			ck_assert_uint_eq(back2.bytes, r->bytes);
			for (size_t t = 0; t < k->ntensors; t++)
				ck_assert(memcmp(&back2.piece[k->ntensors - 1 - t], &r->piece[t],
				                 sizeof(*r->piece)) == 0);
			free(back2.piece);
			free(rev.tensors);
		}
		/* another rank's plan: refused */
		ck_assert_int_eq(
		    assign_rank_of_share(&rd->ranks[0], &j.r[(r->rank + 1) % j.world], &back, err),
		    -EINVAL);
		share_free(rd);
		free(text);
		free(sr.cuts);
	}
	ck_assert_msg(cut > 0, "no rank writes less than it holds");
	/* rank 0's share, changed: each cannot be of its plan */
	{
		const struct plans_rank *k = &j.r[0];
		const size_t priv = k->ntensors - 1; /* rng_state: its own */
		struct share_cut c;
		struct share_rank sr = {0, 0, k->ntensors, 1, &c};
		struct assign_rank back;

		ck_assert_int_eq(tensors_signature(k->tensors, k->ntensors, &sr.sig), 0);
		/* cuts name tensors in name order: rng_state is last, embedding first, as here */
		c = (struct share_cut){priv, 0, 0}; /* a private tensor left unwritten */
		ck_assert_int_eq(assign_rank_of_share(&sr, k, &back, err), -EINVAL);
		ck_assert_msg(strstr(err, "alone holds"), "%s", err);
		c = (struct share_cut){0, 1, k->tensors[0].chunks[0].shape[0]}; /* past its rows */
		ck_assert_int_eq(assign_rank_of_share(&sr, k, &back, err), -EINVAL);
		c = (struct share_cut){0, 0, 1};
		ck_assert_int_eq(assign_rank_of_share(&sr, k, &back, err), 0);
		ck_assert(!back.piece[0].writes || back.piece[0].rows == 1);
		ck_assert(back.bytes < back.held_bytes);
		free(back.piece);
		sr.ntensors--; /* of fewer tensors */
		ck_assert_int_eq(assign_rank_of_share(&sr, k, &back, err), -EINVAL);
		sr.ntensors++;
		sr.sig ^= 1; /* of other tensors */
		ck_assert_int_eq(assign_rank_of_share(&sr, k, &back, err), -EINVAL);
	}
	assign_free(a);
	free_job(&j);
}
END_TEST

START_TEST(private_and_single_boxes)
{
	struct plans_rank r[3] = {{.rank = 2}, {.rank = 0}, {.rank = 1}};
	struct assign_input in[3] = {{"a", &r[0]}, {"a", &r[1]}, {"b", &r[2]}};
	int64_t g[1] = {1 << 20}, off0[1] = {0}, offh[1] = {1 << 19}, half[1] = {1 << 19};
	int64_t small[1] = {8};
	struct assignment *a;

	for (int i = 0; i < 3; i++)
		r[i].tensors = calloc(MAXT, sizeof(*r[i].tensors));
	/* "w": ranks 0 and 1 hold the first half, rank 2 alone the second */
	add(&r[1], "w", F32, 1, g, off0, half, true);
	add(&r[2], "w", F32, 1, g, off0, half, true);
	add(&r[0], "w", F32, 1, g, offh, half, true);
	/* "p": private to each, of the same name and shape: never deduplicated */
	for (int i = 0; i < 3; i++)
		add(&r[i], "p", F32, 1, small, NULL, small, false);
	ck_assert_int_eq(assign_compute(in, 3, 1, &a, err), 0);
	ck_assert_uint_eq(a->nboxes, 1);
	/* rank 2's half and every "p" are theirs; rank 0 and 1 share the first half */
	ck_assert(assign_rank(a, 2)->piece[0].writes && assign_rank(a, 2)->piece[1].writes);
	for (int k = 0; k < 3; k++)
		ck_assert(assign_rank(a, k)->piece[1].writes);
	ck_assert_uint_eq(assign_rank(a, 2)->private_bytes, (2u << 20) + 32);
	/* under ASSIGN_MIN_PIECE: not cut, one writer */
	ck_assert(assign_rank(a, 0)->piece[0].writes != assign_rank(a, 1)->piece[0].writes);
	ck_assert_uint_eq(a->written_bytes, a->unique_bytes);
	ck_assert_uint_eq(a->unique_bytes, (4u << 20) + 3 * 32);
	ck_assert_ptr_null(assign_rank(a, 3));
	assign_free(a);

	/* private tensors alone: nothing to choose, each written by its rank */
	{
		struct plans_rank q = {.rank = 0, .tensors = r[0].tensors + 1, .ntensors = 1};
		struct assign_input one = {"a", &q};

		ck_assert_int_eq(assign_compute(&one, 1, 1, &a, err), 0);
		ck_assert_uint_eq(a->npieces, 0);
		ck_assert(a->r[0].piece[0].writes);
		ck_assert_uint_eq(a->written_bytes, 32);
		assign_free(a);
	}

	/* boxes whose bytes in all no 64-bit count holds (a plans file that lies): refused */
	{
		struct plans_rank h[4] = {{.rank = 0}, {.rank = 1}, {.rank = 2}, {.rank = 3}};
		struct assign_input hin[4] = {
		    {"a", &h[0]}, {"b", &h[1]}, {"c", &h[2]}, {"d", &h[3]}};
		int64_t huge[1] = {INT64_C(1) << 62}, z[1] = {0};

		for (int i = 0; i < 4; i++) {
			h[i].tensors = calloc(MAXT, sizeof(*h[i].tensors));
			add(&h[i], "w", U8, 1, huge, z, huge, true);
		}
		ck_assert_int_eq(assign_compute(hin, 4, 1, &a, err), -EOVERFLOW);
		ck_assert_msg(strstr(err, "more bytes in all than can be counted"), "%s", err);
		ck_assert_ptr_null(a);
		for (int i = 0; i < 4; i++) {
			free(h[i].tensors[0].name);
			free(h[i].tensors[0].chunks);
			free(h[i].tensors);
		}
	}

	/* a box twice on one rank */
	add(&r[2], "w", F32, 1, g, off0, half, true);
	ck_assert_int_eq(assign_compute(in, 3, 2, &a, err), -EINVAL);
	ck_assert_msg(strstr(err, "rank 1 holds tensor 'w' twice"), "%s", err);
	ck_assert_ptr_null(a);
	free(r[2].tensors[--r[2].ntensors].name);
	free(r[2].tensors[r[2].ntensors].chunks);

	/* a rank twice */
	r[2].rank = 0;
	ck_assert_int_eq(assign_compute(in, 3, 1, &a, err), -EINVAL);
	ck_assert_msg(strstr(err, "rank 0") && strstr(err, "twice"), "%s", err);
	ck_assert_ptr_null(a);
	for (int i = 0; i < 3; i++) {
		for (size_t t = 0; t < r[i].ntensors; t++) {
			free(r[i].tensors[t].name);
			free(r[i].tensors[t].chunks);
		}
		free(r[i].tensors);
	}
}
END_TEST

Suite *test_suite(void)
{
	Suite *s = suite_create("assign");
	TCase *t = tcase_create("core");

	tcase_set_timeout(t, 60);
	tcase_add_test(t, dp8_tp2_balanced);
	tcase_add_test(t, dp4_tp2_pp2_balanced);
	tcase_add_test(t, dp16_tp1_balanced);
	tcase_add_test(t, order_independent);
	tcase_add_test(t, two_copies_on_two_nodes);
	tcase_add_test(t, private_and_single_boxes);
	tcase_add_test(t, share_gives_the_entry);
	suite_add_tcase(s, t);
	return s;
}
