/*
 * Unit tests of the agent's work queues (ipc/base/work.c): a job waiting for
 * its time runs then, or at once where it is hurried (workq_hurry: a plans
 * file to publish is not held behind its job's next poll).
 */
#include <stdatomic.h>
#include <stdint.h>
#include <unistd.h>

#include <check.h>

#include "ipc/base/base.h"
#include "ipc/base/work.h"
#include "support/check_main.h"

struct job {
	struct work work;
	atomic_llong ran_at; /* monotonic ns; 0: not yet */
};

static void job_run(struct work *w)
{
	struct job *j = (struct job *)w;

	atomic_store(&j->ran_at, ipc_mono_ns());
}

static struct workq *make_q(void)
{
	char err[IPC_ERRLEN];
	struct workq *q = NULL;

	ck_assert_msg(workq_create("test", 1, &q, err) == 0, "%s", err);
	return q;
}

/* Polls j for up to 5 s: when it ran (0: not). */
static int64_t ran(struct job *j)
{
	for (int i = 0; i < 500 && !atomic_load(&j->ran_at); i++)
		usleep(10000);
	return atomic_load(&j->ran_at);
}

START_TEST(timed_job_waits_for_its_time)
{
	struct workq *q = make_q();
	struct job j = {.work.fn = job_run};
	const int64_t t0 = ipc_mono_ns();

	workq_push_at(q, &j.work, t0 + 300000000LL);
	ck_assert_int_ge(ran(&j), t0 + 300000000LL);
	workq_destroy(q);
}
END_TEST

START_TEST(hurried_job_runs_now)
{
	struct workq *q = make_q();
	struct job j = {.work.fn = job_run}, k = {.work.fn = job_run};
	const int64_t t0 = ipc_mono_ns();

	workq_push_at(q, &k.work, t0 + 3600LL * 1000000000);
	workq_push_at(q, &j.work, t0 + 3600LL * 1000000000);
	ck_assert(workq_hurry(q, &j.work));
	ck_assert_int_ne(ran(&j), 0);
	ck_assert_int_eq(atomic_load(&k.ran_at), 0); /* the other still waits */
	/* run, it is in no queue: nothing to hurry */
	ck_assert(!workq_hurry(q, &j.work));
	ck_assert(workq_hurry(q, &k.work));
	ck_assert_int_ne(ran(&k), 0);
	workq_destroy(q);
}
END_TEST

Suite *test_suite(void)
{
	Suite *s = suite_create("work");
	TCase *tc = tcase_create("queues");

	tcase_add_test(tc, timed_job_waits_for_its_time);
	tcase_add_test(tc, hurried_job_runs_now);
	suite_add_tcase(s, tc);
	return s;
}
