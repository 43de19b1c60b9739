/*
 * Replicas written once, in the files: a part's rank says what it holds
 * apart from what it wrote (part version 2), the merge carries it into the
 * manifest (version 3), both survive their JSON, a hostile one is refused,
 * and cover_check finds a held box that no chunk covers.
 *
 * The job: world 2, one node; "v" [8] f32 held whole by both ranks
 * (replicated), "w" [8] f32 split in two boxes of 4. Rank 0 writes v rows
 * 0..3 and its w box, rank 1 v rows 4..7 and its w box.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <check.h>

#include "layout/cover.h"
#include "storage/format/format.h"
#include "support/check_main.h"

static char err[IPC_ERRLEN];

static char *xstrdup(const char *s)
{
	char *d = strdup(s);

	ck_assert_ptr_nonnull(d);
	return d;
}

/* A tensor of one chunk: [off, off + len) of an 8-element f32, bytes [b, b + 4 len). */
static void one(struct manifest_tensor *t, const char *name, int rank, int64_t off, int64_t len,
                uint64_t b)
{
	*t = (struct manifest_tensor){.name = xstrdup(name),
	                              .dtype = ipc_dtype_from_name("F32"),
	                              .ndim = 1,
	                              .global_shape = {8},
	                              .sharded = true,
	                              .nchunks = 1,
	                              .chunks = calloc(1, sizeof(struct manifest_chunk))};
	ck_assert_ptr_nonnull(t->chunks);
	t->chunks[0] = (struct manifest_chunk){.rank = rank,
	                                       .global_offset = {off},
	                                       .shape = {len},
	                                       .begin = b,
	                                       .end = b ? b + 4 * (uint64_t)len : 0,
	                                       .xxh3 = 7};
}

/* Rank r's part: it wrote v's rows [4r, 4r + vrows) and w's box; it holds all of v and w's box. */
static void fill(struct part_rank *k, int r, int64_t vrows)
{
	char file[SHARD_FILE_MAX];

	ck_assert_int_eq(shard_file_name(r, "n0", 0, file, sizeof(file)), 0);
	*k = (struct part_rank){.rank = r,
	                        .file = xstrdup(file),
	                        .size = 64 + 16 + 4 * (uint64_t)vrows,
	                        .header_bytes = 64,
	                        .tensors = calloc(2, sizeof(struct manifest_tensor)),
	                        .holds = calloc(2, sizeof(struct manifest_tensor))};
	ck_assert(k->tensors && k->holds);
	if (vrows)
		one(&k->tensors[k->ntensors++], "v", r, 4 * r, vrows, 64);
	one(&k->tensors[k->ntensors++], "w", r, 4 * r, 4, 64 + 4 * (uint64_t)vrows);
	one(&k->holds[k->nholds++], "v", r, 0, 8, 0);
	one(&k->holds[k->nholds++], "w", r, 4 * r, 4, 0);
}

static struct part *mk(int64_t vrows1)
{
	struct part *p = calloc(1, sizeof(*p));

	ck_assert_ptr_nonnull(p);
	*p = (struct part){.version = PART_VERSION,
	                   .job = xstrdup("job"),
	                   .run = xstrdup("r"),
	                   .node = xstrdup("n0"),
	                   .step = 3,
	                   .world = 2,
	                   .time_unix_ns = 10,
	                   .nranks = 2,
	                   .ranks = calloc(2, sizeof(struct part_rank))};
	fill(&p->ranks[0], 0, 4);
	fill(&p->ranks[1], 1, vrows1);
	return p;
}

START_TEST(test_part_and_manifest_carry_holds)
{
	struct part *p = mk(4), *back;
	struct manifest *m, *m2;
	uint64_t a, b;
	char *text;
	size_t len;

	ck_assert_msg(part_check(p, err) == 0, "%s", err);
	ck_assert_int_eq(part_to_json(p, &text, &len, err), 0);
	ck_assert_msg(part_from_json(text, len, &back, err) == 0, "%s", err);
	free(text);
	ck_assert_uint_eq(back->ranks[1].nholds, 2);
	ck_assert_int_eq(back->ranks[1].holds[0].chunks[0].shape[0], 8);
	/* the signature is of what it holds, as its plans file says */
	ck_assert_int_eq(part_rank_signature(&back->ranks[1], &a), 0);
	ck_assert_int_eq(tensors_signature(p->ranks[1].holds, 2, &b), 0);
	ck_assert_uint_eq(a, b);
	ck_assert_int_eq(tensors_signature(p->ranks[1].tensors, 2, &b), 0);
	ck_assert_uint_ne(a, b);

	ck_assert_msg(manifest_merge(&back, 1, &m, err) == 0, "%s", err);
	ck_assert_int_eq(m->version, 3);
	ck_assert_uint_eq(manifest_find(m, "v")->nchunks, 2);
	ck_assert_msg(cover_check(m, err) == 0, "%s", err);
	ck_assert_int_eq(manifest_to_json(m, &text, &len, err), 0);
	ck_assert_msg(manifest_from_json(text, len, &m2, err) == 0, "%s", err);
	free(text);
	ck_assert_uint_eq(m2->ranks[0].nholds, 2);
	ck_assert_str_eq(m2->ranks[0].holds[0].name, "v");
	ck_assert_msg(cover_check(m2, err) == 0, "%s", err);
	manifest_free(m);
	manifest_free(m2);
	part_free(back);
	part_free(p);
}
END_TEST

/* Rank 1 wrote rows 4..5 of v (or none): rows 6..7 are nobody's. */
START_TEST(test_hole)
{
	struct part *p = mk(2), *q = mk(0);
	struct manifest *m;

	ck_assert_msg(manifest_merge(&p, 1, &m, err) == 0, "%s", err);
	ck_assert_int_eq(cover_check(m, err), -EINVAL);
	ck_assert_msg(strstr(err, "tensor 'v' box at [0] shape [8]") &&
	                  strstr(err, "written only in part"),
	              "%s", err);
	manifest_free(m);
	/* rank 1 wrote none of v: rows 4..7 are nobody's */
	ck_assert_msg(manifest_merge(&q, 1, &m, err) == 0, "%s", err);
	ck_assert_int_eq(cover_check(m, err), -EINVAL);
	manifest_free(m);
	/* an empty tensor rank 1 holds and nobody wrote: a hole all the same */
	p->ranks[1].holds = realloc(p->ranks[1].holds, 3 * sizeof(*p->ranks[1].holds));
	ck_assert_ptr_nonnull(p->ranks[1].holds);
	one(&p->ranks[1].holds[p->ranks[1].nholds++], "z", 1, 0, 0, 0);
	p->ranks[1].holds[2].global_shape[0] = 0;
	p->ranks[1].tensors[0].chunks[0].shape[0] = 4; /* v whole again: only z is missing */
	p->ranks[1].tensors[0].chunks[0].end = 64 + 16;
	p->ranks[1].tensors[1].chunks[0].begin = 64 + 16;
	p->ranks[1].tensors[1].chunks[0].end = 64 + 32;
	p->ranks[1].size = 64 + 32;
	ck_assert_msg(manifest_merge(&p, 1, &m, err) == 0, "%s", err);
	ck_assert_int_eq(cover_check(m, err), -EINVAL);
	ck_assert_msg(strstr(err, "tensor 'z'") && strstr(err, "written by no rank"), "%s", err);
	manifest_free(m);
	part_free(p);
	part_free(q);
}
END_TEST

START_TEST(test_refusals)
{
	struct part *p = mk(4);
	char *text;
	size_t len;

	/* holds in a version-1 part */
	p->version = 1;
	ck_assert_int_eq(part_check(p, err), -EINVAL);
	ck_assert_msg(strstr(err, "\"holds\" in a version-1 part"), "%s", err);
	p->version = PART_VERSION;
	/* a chunk written outside what the rank holds */
	p->ranks[1].holds[1].chunks[0].global_offset[0] = 0;
	ck_assert_int_eq(part_check(p, err), -EINVAL);
	ck_assert_msg(strstr(err, "rank 1 wrote a box of tensor 'w' that it does not hold"), "%s",
	              err);
	p->ranks[1].holds[1].chunks[0].global_offset[0] = 4;
	/* a held box outside the global shape */
	p->ranks[1].holds[0].chunks[0].shape[0] = 9;
	ck_assert_int_eq(part_check(p, err), -EINVAL);
	ck_assert_msg(strstr(err, "outside its global shape"), "%s", err);
	p->ranks[1].holds[0].chunks[0].shape[0] = 8;
	/* a held box of another rank */
	p->ranks[1].holds[0].chunks[0].rank = 0;
	ck_assert_int_eq(part_check(p, err), -EINVAL);
	p->ranks[1].holds[0].chunks[0].rank = 1;
	ck_assert_msg(part_check(p, err) == 0, "%s", err);
	ck_assert_int_eq(part_to_json(p, &text, &len, err), 0);
	/* a version-2 manifest saying what a rank holds is refused */
	{
		struct manifest *m;
		char *mt;
		size_t ml;

		ck_assert_int_eq(manifest_merge(&p, 1, &m, err), 0);
		m->version = 2;
		ck_assert_int_eq(manifest_to_json(m, &mt, &ml, err), -EINVAL);
		ck_assert_msg(strstr(err, "says what it holds in a version-2 manifest"), "%s", err);
		manifest_free(m);
	}
	free(text);
	part_free(p);
}
END_TEST

Suite *test_suite(void)
{
	Suite *s = suite_create("holds");
	TCase *tc = tcase_create("core");

	tcase_add_test(tc, test_part_and_manifest_carry_holds);
	tcase_add_test(tc, test_hole);
	tcase_add_test(tc, test_refusals);
	suite_add_tcase(s, tc);
	return s;
}
