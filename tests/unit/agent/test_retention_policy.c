/*
 * Unit tests of the retention decision (agent/node/retention.c): which steps of a
 * job survive keep_last K, keep_every M, pins, readers, LATEST and the most
 * recently committed (a run that went back), and a randomised check of the
 * rules on many step sets.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <check.h>

#include "agent/node/retention.h"
#include "support/check_main.h"

#define MAXN 64

/* Steps from a list; the last is LATEST. */
static size_t steps(struct ret_step *v, const int64_t *s, size_t n)
{
	memset(v, 0, n * sizeof(*v));
	for (size_t i = 0; i < n; i++)
		v[i].step = s[i];
	if (n)
		v[n - 1].latest = true;
	return n;
}

static size_t range(struct ret_step *v, int64_t from, int64_t to)
{
	int64_t s[MAXN];
	size_t n = 0;

	for (int64_t i = from; i <= to; i++)
		s[n++] = i;
	return steps(v, s, n);
}

/* The surviving steps as "1,2,3". */
static const char *kept(const struct ret_step *v, size_t n)
{
	static char buf[1024];
	size_t o = 0;

	buf[0] = '\0';
	for (size_t i = 0; i < n; i++)
		if (v[i].why != RET_REMOVE)
			o += (size_t)snprintf(buf + o, sizeof(buf) - o, "%s%lld", o ? "," : "",
			                      (long long)v[i].step);
	return buf;
}

static enum ret_why why_of(const struct ret_step *v, size_t n, int64_t step)
{
	for (size_t i = 0; i < n; i++)
		if (v[i].step == step)
			return v[i].why;
	ck_abort_msg("no step %lld", (long long)step);
	return RET_REMOVE;
}

START_TEST(off_keeps_everything)
{
	struct ret_policy p = {0, 0};
	struct ret_step v[MAXN];
	size_t n = range(v, 1, 10);

	ck_assert_uint_eq(retention_decide(&p, v, n), 0);
	ck_assert_str_eq(kept(v, n), "1,2,3,4,5,6,7,8,9,10");
	ck_assert_int_eq(why_of(v, n, 3), RET_OFF);
	/* keep_every alone does not turn retention on */
	p.keep_every = 5;
	ck_assert_uint_eq(retention_decide(&p, v, n), 0);
}
END_TEST

START_TEST(keep_last)
{
	struct ret_policy p = {3, 0};
	struct ret_step v[MAXN];
	size_t n = range(v, 1, 10);

	ck_assert_uint_eq(retention_decide(&p, v, n), 7);
	ck_assert_str_eq(kept(v, n), "8,9,10");
	ck_assert_int_eq(why_of(v, n, 10), RET_LATEST);
	ck_assert_int_eq(why_of(v, n, 9), RET_LAST);
	ck_assert_int_eq(why_of(v, n, 8), RET_LAST);
	ck_assert_int_eq(why_of(v, n, 7), RET_REMOVE);
	/* fewer than K: nothing goes */
	n = range(v, 1, 3);
	ck_assert_uint_eq(retention_decide(&p, v, n), 0);
	n = range(v, 5, 4); /* none at all */
	ck_assert_uint_eq(retention_decide(&p, v, n), 0);
}
END_TEST

START_TEST(keep_last_uneven_steps)
{
	static const int64_t s[] = {0, 100, 150, 1000, 1001, 5000};
	struct ret_policy p = {2, 0};
	struct ret_step v[MAXN];
	size_t n = steps(v, s, 6);

	ck_assert_uint_eq(retention_decide(&p, v, n), 4);
	ck_assert_str_eq(kept(v, n), "1001,5000");
}
END_TEST

START_TEST(keep_every)
{
	struct ret_policy p = {2, 5};
	struct ret_step v[MAXN];
	size_t n = range(v, 1, 12);

	ck_assert_uint_eq(retention_decide(&p, v, n), 8);
	ck_assert_str_eq(kept(v, n), "5,10,11,12");
	ck_assert_int_eq(why_of(v, n, 5), RET_EVERY);
	ck_assert_int_eq(why_of(v, n, 10), RET_EVERY);
	/* step 0 is a multiple of every M */
	n = range(v, 0, 12);
	retention_decide(&p, v, n);
	ck_assert_str_eq(kept(v, n), "0,5,10,11,12");
	/* among the last K, the reason given is "last", not "multiple" */
	n = range(v, 1, 10);
	retention_decide(&p, v, n);
	ck_assert_str_eq(kept(v, n), "5,9,10");
	ck_assert_int_eq(why_of(v, n, 10), RET_LATEST);
}
END_TEST

START_TEST(pinned_and_busy_stay)
{
	struct ret_policy p = {1, 0};
	struct ret_step v[MAXN];
	size_t n = range(v, 1, 6);

	v[1].pinned = true; /* step 2 */
	v[3].busy = true; /* step 4: a restore or verify reads it */
	ck_assert_uint_eq(retention_decide(&p, v, n), 3);
	ck_assert_str_eq(kept(v, n), "2,4,6");
	ck_assert_int_eq(why_of(v, n, 2), RET_PINNED);
	ck_assert_int_eq(why_of(v, n, 4), RET_BUSY);
	/* unpinned and idle again: they go */
	v[1].pinned = v[3].busy = false;
	ck_assert_uint_eq(retention_decide(&p, v, n), 5);
	ck_assert_str_eq(kept(v, n), "6");
}
END_TEST

START_TEST(latest_always_stays)
{
	struct ret_policy p = {1, 0};
	struct ret_step v[MAXN];
	size_t n = range(v, 1, 5);

	/* LATEST first in the order of reasons, pinned or not */
	v[4].pinned = true;
	retention_decide(&p, v, n);
	ck_assert_int_eq(why_of(v, n, 5), RET_LATEST);
	/* the newest step is kept even when the caller did not mark it */
	v[4].latest = false;
	v[4].pinned = false;
	retention_decide(&p, v, n);
	ck_assert_str_eq(kept(v, n), "5");
	/* and one marked latest that is not the newest is kept as well */
	v[2].latest = true;
	retention_decide(&p, v, n);
	ck_assert_str_eq(kept(v, n), "3,5");
	ck_assert_int_eq(why_of(v, n, 3), RET_LATEST);
}
END_TEST

/*
 * A run went back: the job reached 1000, a restart restored 500 and saved
 * 510 and 520 since. By step they are not the last 3; they are the newest
 * progress, and stay with the last 3 by step.
 */
START_TEST(a_run_that_went_back_keeps_its_saves)
{
	static const int64_t s[] = {500, 510, 520, 600, 700, 800, 998, 999, 1000};
	static const int64_t t[] = {1, 10, 11, 2, 3, 4, 5, 6, 7}; /* 510, 520: the latest */
	struct ret_policy p = {3, 0};
	struct ret_step v[MAXN];
	size_t n = steps(v, s, 9);

	for (size_t i = 0; i < n; i++)
		v[i].time_ns = t[i];
	ck_assert_uint_eq(retention_decide(&p, v, n), 4);
	ck_assert_str_eq(kept(v, n), "510,520,998,999,1000");
	ck_assert_int_eq(why_of(v, n, 510), RET_RECENT);
	ck_assert_int_eq(why_of(v, n, 520), RET_RECENT);
	ck_assert_int_eq(why_of(v, n, 998), RET_LAST);
}
END_TEST

START_TEST(reasons_read_well)
{
	struct ret_policy p = {3, 100};
	char buf[64];

	ck_assert_str_eq(retention_why(RET_LATEST, &p, buf, sizeof(buf)), "LATEST");
	ck_assert_str_eq(retention_why(RET_PINNED, &p, buf, sizeof(buf)), "pinned");
	ck_assert_str_eq(retention_why(RET_LAST, &p, buf, sizeof(buf)), "last 3");
	ck_assert_str_eq(retention_why(RET_RECENT, &p, buf, sizeof(buf)), "last 3 committed");
	ck_assert_str_eq(retention_why(RET_EVERY, &p, buf, sizeof(buf)), "multiple of 100");
	ck_assert_str_eq(retention_why(RET_BUSY, &p, buf, sizeof(buf)),
	                 "being restored or verified");
	ck_assert_str_eq(retention_why(RET_OFF, &p, buf, sizeof(buf)),
	                 "retention off (keep_last 0)");
}
END_TEST

/* Many random step sets: every rule holds for every step. */
/*
 * Damaged steps count for neither LATEST nor the last K: K steps that
 * restore whole stay. A damaged one newer than every whole step stays for
 * the operator; an older one goes like any other.
 */
START_TEST(damaged_steps_do_not_count)
{
	struct ret_policy p = {3, 0};
	struct ret_step v[MAXN];
	size_t n = range(v, 1, 10);

	v[9].damaged = true; /* 10: the newest, damaged (LATEST names it, say) */
	v[7].damaged = true; /* 8 */
	ck_assert_uint_eq(retention_decide(&p, v, n), 6);
	ck_assert_str_eq(kept(v, n), "6,7,9,10");
	ck_assert_int_eq(why_of(v, n, 10), RET_DAMAGED);
	ck_assert_int_eq(why_of(v, n, 9), RET_LATEST);
	ck_assert_int_eq(why_of(v, n, 7), RET_LAST);
	ck_assert_int_eq(why_of(v, n, 8), RET_REMOVE);
	/* pinned or read, a damaged one stays for that */
	v[7].pinned = true;
	retention_decide(&p, v, n);
	ck_assert_int_eq(why_of(v, n, 8), RET_PINNED);
	/* all damaged: nothing whole to keep, none removed but by age */
	for (size_t i = 0; i < n; i++)
		v[i] = (struct ret_step){.step = (int64_t)i + 1, .damaged = true};
	ck_assert_uint_eq(retention_decide(&p, v, n), 0);
	ck_assert_int_eq(why_of(v, n, 1), RET_DAMAGED);
}
END_TEST

START_TEST(random_sets_follow_the_rules)
{
	uint64_t seed = 0x9e3779b97f4a7c15ull;

	for (int round = 0; round < 20000; round++) {
		struct ret_step v[MAXN];
		struct ret_policy p;
		size_t n, removed, count = 0;
		int64_t step = 0;

		seed = seed * 6364136223846793005ull + 1442695040888963407ull;
		n = (size_t)(seed >> 33) % MAXN;
		p.keep_last = (unsigned)(seed >> 20) % 6;
		p.keep_every = (int64_t)((seed >> 12) % 5) * 3;
		memset(v, 0, sizeof(v));
		for (size_t i = 0; i < n; i++) {
			seed = seed * 6364136223846793005ull + 1442695040888963407ull;
			step += 1 + (int64_t)((seed >> 40) % 4);
			v[i].step = step;
			v[i].pinned = (seed >> 20) % 7 == 0;
			v[i].busy = (seed >> 24) % 9 == 0;
			v[i].time_ns = (int64_t)((seed >> 28) % 16); /* runs that went back */
		}
		if (n)
			v[n - 1].latest = true;
		removed = retention_decide(&p, v, n);
		for (size_t i = 0; i < n; i++) {
			size_t later = 0;
			bool keep;

			for (size_t j = 0; j < n; j++)
				later += v[j].time_ns > v[i].time_ns ||
				         (v[j].time_ns == v[i].time_ns && v[j].step > v[i].step);
			keep = p.keep_last == 0 || i + 1 == n || v[i].pinned || v[i].busy ||
			       n - i <= p.keep_last || later < p.keep_last ||
			       (p.keep_every && v[i].step % p.keep_every == 0);

			ck_assert_msg(keep == (v[i].why != RET_REMOVE),
			              "round %d: step %lld kept %d, why %d", round,
			              (long long)v[i].step, keep, v[i].why);
			count += v[i].why == RET_REMOVE;
		}
		ck_assert_uint_eq(removed, count);
		if (n)
			ck_assert_int_ne(v[n - 1].why, RET_REMOVE);
	}
}
END_TEST

Suite *test_suite(void)
{
	Suite *s = suite_create("retention");
	TCase *tc = tcase_create("decide");

	tcase_add_test(tc, off_keeps_everything);
	tcase_add_test(tc, keep_last);
	tcase_add_test(tc, keep_last_uneven_steps);
	tcase_add_test(tc, keep_every);
	tcase_add_test(tc, pinned_and_busy_stay);
	tcase_add_test(tc, latest_always_stays);
	tcase_add_test(tc, a_run_that_went_back_keeps_its_saves);
	tcase_add_test(tc, reasons_read_well);
	tcase_add_test(tc, damaged_steps_do_not_count);
	tcase_add_test(tc, random_sets_follow_the_rules);
	suite_add_tcase(s, tc);
	return s;
}
