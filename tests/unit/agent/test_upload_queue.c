/*
 * Unit tests of the upload tier's account (agent/node/upload_queue.c): when the
 * store's refusals of a step count as "in a row", so that a step the store
 * refuses is given up after REFUSED_TRIES (3) tries and no sooner.
 */
#include <errno.h>

#include <check.h>

#include "agent/node/upload_int.h"
#include "support/check_main.h"

/* The count after each of n tries that ended in rc[i], from 0. */
static unsigned after(const int *rc, unsigned n)
{
	unsigned r = 0;

	for (unsigned i = 0; i < n; i++)
		r = up_refusals_after(r, rc[i]);
	return r;
}

START_TEST(refusals_count)
{
	const int rc[] = {-EACCES, -EINVAL, -EFBIG, -ENAMETOOLONG, -EPERM};

	ck_assert_uint_eq(after(rc, 5), 5);
}
END_TEST

/*
 * A refused PUT whose connection the server drops before the body is sent
 * fails as a send error (EIO), not as the 403: it is no answer, and must
 * not start the count again, or a step the store refuses is tried forever
 * whenever one try in three sees the dropped connection.
 */
START_TEST(no_answer_keeps_the_count)
{
	const int rc[] = {-EACCES, -EIO, -EACCES, -ECONNRESET, -ETIMEDOUT, -EACCES};

	ck_assert_uint_eq(after(rc, 6), 3);
	ck_assert_uint_eq(up_refusals_after(0, -EIO), 0);
	ck_assert_uint_eq(up_refusals_after(2, -ECONNREFUSED), 2);
	ck_assert_uint_eq(up_refusals_after(2, -EHOSTUNREACH), 2);
}
END_TEST

/* A try the store took further (the step waits for other nodes) starts it from 0. */
START_TEST(other_ends_start_again)
{
	const int rc[] = {-EACCES, -EACCES, -EAGAIN, -EACCES};

	ck_assert_uint_eq(after(rc, 4), 1);
	ck_assert_uint_eq(up_refusals_after(2, -EBUSY), 0);
	ck_assert_uint_eq(up_refusals_after(2, -ENOSPC), 0);
}
END_TEST

Suite *test_suite(void)
{
	Suite *s = suite_create("upload_queue");
	TCase *tc = tcase_create("refusals");

	tcase_add_test(tc, refusals_count);
	tcase_add_test(tc, no_answer_keeps_the_count);
	tcase_add_test(tc, other_ends_start_again);
	suite_add_tcase(s, tc);
	return s;
}
