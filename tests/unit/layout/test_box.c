/*
 * Boxes (layout/box.c): overlaps of random boxes in 1 to 4 dimensions, and
 * the overlap copied run by run from a chunk into the rank's box, against
 * an element-by-element copy; a split along dimension 0 is one run; 0-d.
 */
#include <check.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "layout/box.h"
#include "support/check_main.h"

/* The flat index of global coordinates g in a box (off, shape). */
static uint64_t flat(size_t nd, const int64_t *g, const int64_t *off, const int64_t *shape)
{
	uint64_t i = 0;

	for (size_t d = 0; d < nd; d++)
		i = i * (uint64_t)shape[d] + (uint64_t)(g[d] - off[d]);
	return i;
}

/* The global tensor's element at g: its own coordinates, coded. */
static uint32_t value(size_t nd, const int64_t *g)
{
	uint32_t v = 1;

	for (size_t d = 0; d < nd; d++)
		v = v * 131 + (uint32_t)g[d];
	return v;
}

static void random_box(unsigned *seed, size_t nd, const int64_t *gs, int64_t *off, int64_t *shape)
{
	for (size_t d = 0; d < nd; d++) {
		off[d] = rand_r(seed) % gs[d];
		shape[d] = 1 + rand_r(seed) % (gs[d] - off[d]);
	}
}

START_TEST(random_overlaps_copy_exactly)
{
	unsigned seed = 11;
	int copies = 0;

	for (int round = 0; round < 3000; round++) {
		size_t nd = 1 + (size_t)(rand_r(&seed) % 4);
		int64_t gs[4], co[4], cs[4], dof[4], dsh[4], oo[4], os[4], g[4];
		uint32_t *chunk, *dst, *want;
		uint64_t cv, dv, src, at;
		struct box_copy bc;
		bool hit;

		for (size_t d = 0; d < nd; d++)
			gs[d] = 1 + rand_r(&seed) % 9;
		random_box(&seed, nd, gs, co, cs);
		random_box(&seed, nd, gs, dof, dsh);
		if (round % 4 == 0) /* often the same split in the trailing dimensions */
			for (size_t d = 1; d < nd; d++)
				co[d] = dof[d] = 0, cs[d] = dsh[d] = gs[d];
		hit = box_intersect(nd, co, cs, dof, dsh, oo, os);
		cv = box_volume(nd, cs);
		dv = box_volume(nd, dsh);
		chunk = calloc(cv, 4);
		dst = calloc(dv, 4);
		want = calloc(dv, 4);
		/* the chunk holds its box of the global tensor; the reference copy */
		for (uint64_t i = 0; i < cv; i++) {
			uint64_t r = i;

			for (size_t d = nd; d-- > 0;) {
				g[d] = co[d] + (int64_t)(r % (uint64_t)cs[d]);
				r /= (uint64_t)cs[d];
			}
			chunk[i] = value(nd, g);
			if (box_contains(nd, dof, dsh, g, (int64_t[4]){1, 1, 1, 1}))
				want[flat(nd, g, dof, dsh)] = chunk[i];
		}
		ck_assert_int_eq(hit, memcmp(want, dst, dv * 4) != 0);
		if (hit) {
			box_copy_init(&bc, nd, 4, co, cs, dof, dsh, oo, os);
			ck_assert_uint_eq(bc.nruns * bc.run, box_volume(nd, os) * 4);
			src = 0;
			for (uint64_t k = 0; k < bc.nruns; k++) {
				box_copy_run(&bc, k, &at, &(uint64_t){0});
				ck_assert_msg(k == 0 || at > src, "runs out of order");
				src = at;
				box_copy_run(&bc, k, &src, &at);
				ck_assert_uint_le(src + bc.run, cv * 4);
				ck_assert_uint_le(at + bc.run, dv * 4);
				memcpy((char *)dst + at, (char *)chunk + src, bc.run);
			}
			copies++;
		}
		ck_assert(memcmp(want, dst, dv * 4) == 0);
		free(chunk);
		free(dst);
		free(want);
	}
	ck_assert_int_gt(copies, 1000);
}
END_TEST

/* u less i: disjoint boxes inside u, none meeting i, with i making up u's volume. */
START_TEST(subtract_leaves_the_rest)
{
	unsigned seed = 5;

	for (int round = 0; round < 3000; round++) {
		size_t nd = 1 + (size_t)(rand_r(&seed) % 4), n;
		int64_t gs[4], uo[4], us[4], bo[4], bs[4], io[4], is[4], o2[4], s2[4];
		int64_t off[8][IPC_MAX_NDIM], shape[8][IPC_MAX_NDIM];
		uint64_t v;

		for (size_t d = 0; d < nd; d++)
			gs[d] = 1 + rand_r(&seed) % 9;
		random_box(&seed, nd, gs, uo, us);
		random_box(&seed, nd, gs, bo, bs);
		if (!box_intersect(nd, uo, us, bo, bs, io, is))
			continue;
		n = box_subtract(nd, uo, us, io, is, off, shape);
		ck_assert_uint_le(n, 2 * nd);
		v = box_volume(nd, is);
		for (size_t k = 0; k < n; k++) {
			ck_assert(box_contains(nd, uo, us, off[k], shape[k]));
			ck_assert(!box_intersect(nd, off[k], shape[k], io, is, o2, s2));
			for (size_t l = 0; l < k; l++)
				ck_assert(
				    !box_intersect(nd, off[k], shape[k], off[l], shape[l], o2, s2));
			v += box_volume(nd, shape[k]);
		}
		ck_assert_uint_eq(v, box_volume(nd, us));
	}
}
END_TEST

START_TEST(split_on_rows_is_one_run)
{
	/* [12, 5] saved in rows 4..7, restored into rows 6..11 */
	int64_t co[2] = {4, 0}, cs[2] = {4, 5}, dof[2] = {6, 0}, dsh[2] = {6, 5}, oo[2], os[2];
	struct box_copy bc;
	uint64_t s, d;

	ck_assert(box_intersect(2, co, cs, dof, dsh, oo, os));
	box_copy_init(&bc, 2, 2, co, cs, dof, dsh, oo, os);
	ck_assert_uint_eq(bc.nruns, 1);
	ck_assert_uint_eq(bc.run, 2 * 5 * 2);
	box_copy_run(&bc, 0, &s, &d);
	ck_assert_uint_eq(s, 2 * 5 * 2); /* row 6 is the chunk's third */
	ck_assert_uint_eq(d, 0);
	/* split on columns: a run per row */
	co[0] = 0, cs[0] = 12, co[1] = 2, cs[1] = 3;
	dof[0] = 0, dsh[0] = 12, dof[1] = 0, dsh[1] = 5;
	ck_assert(box_intersect(2, co, cs, dof, dsh, oo, os));
	box_copy_init(&bc, 2, 2, co, cs, dof, dsh, oo, os);
	ck_assert_uint_eq(bc.nruns, 12);
	ck_assert_uint_eq(bc.run, 3 * 2);
	box_copy_run(&bc, 1, &s, &d);
	ck_assert_uint_eq(s, 3 * 2);
	ck_assert_uint_eq(d, 5 * 2 + 2 * 2);
	/* disjoint */
	dof[1] = 0, dsh[1] = 2;
	ck_assert(!box_intersect(2, co, cs, dof, dsh, oo, os));
	/* 0-d: one element */
	box_copy_init(&bc, 0, 8, NULL, NULL, NULL, NULL, NULL, NULL);
	ck_assert_uint_eq(bc.nruns, 1);
	ck_assert_uint_eq(bc.run, 8);
	ck_assert_uint_eq(box_volume(0, NULL), 1);
}
END_TEST

Suite *test_suite(void)
{
	Suite *s = suite_create("box");
	TCase *t = tcase_create("core");

	tcase_add_test(t, random_overlaps_copy_exactly);
	tcase_add_test(t, split_on_rows_is_one_run);
	tcase_add_test(t, subtract_leaves_the_rest);
	suite_add_tcase(s, t);
	return s;
}
