/*
 * A run's dedup assignment through the shared root (commit/shares.c), on
 * the fake backend: rank 0's node puts every node's share of the
 * assignment, then the set mark; another node takes its share only where
 * the mark is of the plans generation it read and the share of the mark's
 * set, and each rank's entry comes back exactly as computed. A put that
 * fails is counted and said; a mark of another generation or world, a
 * share of another set, and neither there are told apart. The assignment
 * tells its committer which parts cover every box without reading them.
 */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/fake_store.h"
#include "commit/shares.h"
#include "support/check_main.h"

#define ROWS 1024
#define COLS 4096 /* "emb" [ROWS, COLS] F32 on every rank: 16 MiB, cut in pieces */

static struct fake_store *fs;
static struct storage *st;
static char err[IPC_ERRLEN];
static struct plans_file files[2]; /* n0: ranks 0, 1; n1: ranks 2, 3 */
static struct plans_file *fv[2] = {&files[0], &files[1]};
static struct assignment *as;

/* Rank r: "emb" replicated on every rank, and "own" its alone. */
static void rank_of(struct plans_rank *k, int r)
{
	struct manifest_tensor *t = calloc(2, sizeof(*t));

	ck_assert_ptr_nonnull(t);
	k->rank = r;
	k->copies = 1;
	k->ntensors = 2;
	k->tensors = t;
	t[0] = (struct manifest_tensor){.name = strdup("emb"),
	                                .dtype = ipc_dtype_from_name("F32"),
	                                .ndim = 2,
	                                .global_shape = {ROWS, COLS},
	                                .sharded = true,
	                                .nchunks = 1,
	                                .chunks = calloc(1, sizeof(struct manifest_chunk))};
	t[0].chunks[0] = (struct manifest_chunk){.rank = r, .shape = {ROWS, COLS}};
	t[1] = (struct manifest_tensor){.name = strdup("own"),
	                                .dtype = ipc_dtype_from_name("F32"),
	                                .ndim = 1,
	                                .global_shape = {16},
	                                .nchunks = 1,
	                                .chunks = calloc(1, sizeof(struct manifest_chunk))};
	t[1].chunks[0] = (struct manifest_chunk){.rank = r, .shape = {16}};
}

static void setup(void)
{
	struct assign_input in[4];

	fs = fake_create();
	st = fake_storage(fs);
	for (int n = 0; n < 2; n++) {
		files[n] = (struct plans_file){.version = PLANS_VERSION,
		                               .job = strdup("j"),
		                               .node = strdup(n ? "n1" : "n0"),
		                               .run = strdup("r"),
		                               .world = 4,
		                               .writes_once = true,
		                               .nranks = 2,
		                               .ranks = calloc(2, sizeof(struct plans_rank))};
		for (int i = 0; i < 2; i++) {
			rank_of(&files[n].ranks[i], 2 * n + i);
			in[2 * n + i] = (struct assign_input){files[n].node, &files[n].ranks[i]};
		}
	}
	ck_assert_msg(assign_compute(in, 4, 1, &as, err) == 0, "%s", err);
}

static void teardown(void)
{
	assign_free(as);
	for (int n = 0; n < 2; n++) {
		for (size_t i = 0; i < files[n].nranks; i++)
			plans_rank_clear(&files[n].ranks[i]);
		free(files[n].ranks);
		free(files[n].job);
		free(files[n].node);
		free(files[n].run);
	}
	fake_destroy(fs);
}

static void mark(uint64_t set, uint64_t gen, bool all)
{
	struct set_mark m = {"j", "r", 4, set, gen, all};

	ck_assert_msg(store_put_set_mark(st, &m, err) == 0, "%s", err);
}

START_TEST(put_then_taken)
{
	struct fake_counts c;
	struct set_mark *m;
	struct plans_share *sh;

	ck_assert_msg(shares_put(st, fv, 2, "r", 4, 0x42, as, err) == 0, "%s", err);
	fake_counts(fs, &c);
	ck_assert_uint_eq(c.puts, 2);
	mark(0x42, 7, false);
	ck_assert_msg(shares_get(st, "j", "r", "n1", 4, 7, &m, &sh, err) == 0, "%s", err);
	ck_assert(m->set == 0x42 && sh && sh->nranks == 2 && sh->set == 0x42);
	for (size_t i = 0; i < 2; i++) {
		const struct assign_rank *want = assign_rank(as, 2 + (int)i);
		struct assign_rank got;

		ck_assert_int_eq(sh->ranks[i].rank, 2 + (int)i);
		ck_assert_msg(assign_rank_of_share(&sh->ranks[i], &files[1].ranks[i], &got, err) ==
		                  0,
		              "%s", err);
		ck_assert_uint_eq(got.bytes, want->bytes);
		ck_assert(want->bytes < want->held_bytes); /* emb is cut: it writes a piece */
		ck_assert(memcmp(got.piece, want->piece, 2 * sizeof(*got.piece)) == 0);
		free(got.piece);
	}
	set_mark_free(m);
	share_free(sh);
}
END_TEST

START_TEST(taken_only_of_the_generation_and_set)
{
	struct set_mark *m;
	struct plans_share *sh;
	const char *key = "j/plans/n1.share";
	size_t len;
	char *forged;

	/* nothing there: -ENOENT; the mark alone: -ENOENT (its share is not there) */
	ck_assert_int_eq(shares_get(st, "j", "r", "n1", 4, 7, &m, &sh, err), -ENOENT);
	mark(0x42, 7, false);
	ck_assert_int_eq(shares_get(st, "j", "r", "n1", 4, 7, &m, &sh, err), -ENOENT);
	ck_assert_ptr_null(m);
	ck_assert_msg(shares_put(st, fv, 2, "r", 4, 0x42, as, err) == 0, "%s", err);
	/* a mark of another generation, or world: the plans changed since */
	ck_assert_int_eq(shares_get(st, "j", "r", "n1", 4, 8, &m, &sh, err), -ESTALE);
	ck_assert_msg(strstr(err, "generation 0000000000000007"), "%s", err);
	/* what the run had before is said all the same */
	ck_assert(m && m->generation == 7 && m->set == 0x42 && !sh);
	set_mark_free(m);
	ck_assert_int_eq(shares_get(st, "j", "r", "n1", 5, 7, &m, &sh, err), -ESTALE);
	ck_assert_ptr_null(m);
	/* a share of another set than the mark's */
	forged = strdup(fake_get(fs, key, &len));
	memcpy(strstr(forged, "\"set\":\"0000000000000042\"") + 22, "3", 1);
	fake_put(fs, key, forged, len);
	free(forged);
	ck_assert_int_eq(shares_get(st, "j", "r", "n1", 4, 7, &m, &sh, err), -ESTALE);
	ck_assert_msg(strstr(err, "plan set 0000000000000043"), "%s", err);
	ck_assert_ptr_null(sh);
	/* garbage: -EINVAL */
	fake_put(fs, key, "{", 1);
	ck_assert_int_eq(shares_get(st, "j", "r", "n1", 4, 7, &m, &sh, err), -EINVAL);
	/* a mark of no assignment, or of no complete set: no share read */
	mark(0x42, 7, true);
	ck_assert_msg(shares_get(st, "j", "r", "n1", 4, 7, &m, &sh, err) == 0, "%s", err);
	ck_assert(m->writes_all && !sh);
	set_mark_free(m);
	mark(0, 7, false);
	ck_assert_msg(shares_get(st, "j", "r", "n1", 4, 7, &m, &sh, err) == 0, "%s", err);
	ck_assert(m->set == 0 && !sh);
	set_mark_free(m);
}
END_TEST

START_TEST(a_put_that_fails_is_said)
{
	fake_fail_put(fs, "n1.share", -EIO);
	ck_assert_int_eq(shares_put(st, fv, 2, "r", 4, 0x42, as, err), -EIO);
	ck_assert_msg(strstr(err, "1 of 2 nodes' shares not put") && strstr(err, "n1.share"), "%s",
	              err);
	ck_assert_ptr_nonnull(fake_get(fs, "j/plans/n0.share", NULL));
}
END_TEST

/* Tensor t of rank r's plan as its part says it wrote rows [row0, row0 + rows) of it. */
static void wrote_rows(struct manifest_tensor *out, const struct manifest_tensor *t, int64_t row0,
                       int64_t rows)
{
	*out = *t;
	out->name = strdup(t->name);
	out->chunks = calloc(1, sizeof(*out->chunks));
	ck_assert(out->name && out->chunks);
	out->chunks[0] = t->chunks[0];
	out->chunks[0].shape[0] = rows;
	out->chunks[0].global_offset[0] = row0;
}

/*
 * The parts of the 4 ranks as their agents write them under the
 * assignment: each wrote its own tensor and its rows of emb (none where it
 * writes none); `other` moves one rank's rows down by one.
 */
static struct part *parts_as_assigned(int node, bool other)
{
	struct part *p = calloc(1, sizeof(*p));

	ck_assert_ptr_nonnull(p);
	p->job = strdup("j");
	p->run = strdup("r");
	p->node = strdup(node ? "n1" : "n0");
	p->world = 4;
	p->nranks = 2;
	p->ranks = calloc(2, sizeof(*p->ranks));
	for (int i = 0; i < 2; i++) {
		const struct plans_rank *k = &files[node].ranks[i];
		const struct assign_rank *r = assign_rank(as, k->rank);
		struct part_rank *pr = &p->ranks[i];
		const int64_t shift = other && k->rank == 3 ? 1 : 0;

		pr->rank = k->rank;
		pr->tensors = calloc(2, sizeof(*pr->tensors));
		ck_assert_ptr_nonnull(pr->tensors);
		if (r->piece[0].writes)
			wrote_rows(&pr->tensors[pr->ntensors++], &k->tensors[0],
			           r->piece[0].row0 + shift, r->piece[0].rows - shift);
		wrote_rows(&pr->tensors[pr->ntensors++], &k->tensors[1], 0, 16);
		pr->wrote_less = r->bytes < r->held_bytes;
		pr->holds = calloc(2, sizeof(*pr->holds));
		ck_assert_ptr_nonnull(pr->holds);
		pr->nholds = 2;
		wrote_rows(&pr->holds[0], &k->tensors[0], 0, ROWS);
		wrote_rows(&pr->holds[1], &k->tensors[1], 0, 16);
	}
	return p;
}

/*
 * What rank 0's node assigned tells its committer whether parts cover
 * every box without reading them whole: the parts as assigned do; one rank
 * that wrote other rows, one that holds other plans, or a summary that
 * does not say what its rank wrote, do not (the parts are read whole).
 */
START_TEST(assigned_covers_the_parts)
{
	struct assign_input in[4];
	struct assigned *x;
	struct part *v[2];

	for (int n = 0; n < 2; n++)
		for (int i = 0; i < 2; i++)
			in[2 * n + i] = (struct assign_input){files[n].node, &files[n].ranks[i]};
	ck_assert_int_eq(assigned_make(in, 4, as, "j", "r", 4, 0x42, &x), 0);
	v[0] = parts_as_assigned(0, false);
	v[1] = parts_as_assigned(1, false);
	ck_assert_msg(assigned_covers(x, v, 2, err), "%s", err);
	part_free(v[1]);
	v[1] = parts_as_assigned(1, true); /* rank 3: other rows */
	ck_assert(!assigned_covers(x, v, 2, err));
	ck_assert_msg(strstr(err, "rank 3 wrote other pieces"), "%s", err);
	part_free(v[1]);
	v[1] = parts_as_assigned(1, false);
	v[1]->ranks[1].holds[1].chunks[0].shape[0] = 8; /* rank 3 holds less of "own" */
	ck_assert(!assigned_covers(x, v, 2, err));
	ck_assert_msg(strstr(err, "rank 3 holds other plans"), "%s", err);
	part_free(v[1]);
	/* a summary's rank: its signatures as said; without what it wrote, not told */
	v[1] = parts_as_assigned(1, false);
	for (int i = 0; i < 2; i++) {
		struct part_rank *k = &v[1]->ranks[i];

		ck_assert_int_eq(part_rank_signature(k, &k->sig), 0);
		ck_assert_int_eq(part_rank_written_signature(k, &k->wsig), 0);
		k->has_sig = k->has_wsig = true;
	}
	ck_assert_msg(assigned_covers(x, v, 2, err), "%s", err);
	v[1]->ranks[1].has_wsig = false;
	ck_assert(!assigned_covers(x, v, 2, err));
	part_free(v[0]);
	part_free(v[1]);
	assigned_free(x);
}
END_TEST

Suite *test_suite(void)
{
	Suite *s = suite_create("shares");
	TCase *tc = tcase_create("core");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, put_then_taken);
	tcase_add_test(tc, taken_only_of_the_generation_and_set);
	tcase_add_test(tc, a_put_that_fails_is_said);
	tcase_add_test(tc, assigned_covers_the_parts);
	suite_add_tcase(s, tc);
	return s;
}
