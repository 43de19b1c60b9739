/*
 * A checkpoint's state machine and its commit (agent/node/checkpoint.c,
 * checkpoint_commit.c) and a save's states (save.c), on a node without its
 * process (support/fake_node.h): a real commit thread and committer over
 * an in-memory root, the pipeline played by hand, every save state and
 * checkpoint end seen as the hub publishes them. What a trainer would see:
 * a step commits only once every rank of the node is DURABLE, its saves go
 * forward only and end COMMITTED, its end published once; a failure fails
 * every rank, naming the checkpoint, and one while committing is the
 * commit's to decide; a plan dropped fails what lost its source and steps
 * waiting for its rank, not a step it captured; the deadline names the
 * ranks that never saved, and a failed step is let go only once its files
 * are gone and no rank may still come; one world per step, one checkpoint
 * per run; a store that refuses the part fails the step with its reason;
 * a save never moves back, nor fails once committed.
 */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "agent/node/checkpoint.h"
#include "support/check_main.h"
#include "support/fake_node.h"

#define JOB "j"
#define RUN "r"
#define DEADLINE_S 5
#define S 1000000000LL

static struct fake_node *n;
static char err[IPC_ERRLEN];

static void setup(void)
{
	n = fn_create("n0", DEADLINE_S);
}

static void teardown(void)
{
	fn_destroy(n);
}

/* p's save of step, started and captured where asked. */
static struct save *save_of(struct plan *p, int64_t step, bool start, bool capture)
{
	struct save *s;

	ck_assert_msg(fn_save(n, p, step, &s, err) == 0, "%s", err);
	if (start)
		fn_start(n, s);
	if (capture)
		fn_captured(n, s);
	return s;
}

static enum save_state state_of(struct save *s)
{
	enum save_state st;

	fn_lock(n);
	st = s->state;
	fn_unlock(n);
	return st;
}

static void assert_states(struct save *s, const char *want)
{
	char buf[256];

	ck_assert_str_eq(fn_states(n, s, buf, sizeof(buf)), want);
}

static void assert_reason(struct save *s, const char *part)
{
	ck_assert_msg(strstr(s->reason, part), "rank %d's reason '%s' lacks '%s'", s->rank,
	              s->reason, part);
}

static bool manifest_of(int64_t step)
{
	char key[128];

	snprintf(key, sizeof(key), JOB "/step-%012lld/manifest.json", (long long)step);
	return fake_get(n->fs, key, NULL) != NULL;
}

/* The step commits once every rank is durable; its saves go forward, its end once. */
START_TEST(commits_once_every_rank_durable)
{
	struct plan *p0 = fn_plan(n, JOB, RUN, 0, 2), *p1 = fn_plan(n, JOB, RUN, 1, 2);
	struct save *s0 = save_of(p0, 10, true, true), *s1 = save_of(p1, 10, true, true);
	struct checkpoint *cp;

	fn_durable(n, s0);
	ck_assert(fn_settle(n));
	fn_lock(n);
	cp = fn_ckpt(n, JOB, 10);
	ck_assert_ptr_nonnull(cp);
	ck_assert(!cp->committing);
	ck_assert_int_eq(cp->state, SAVE_QUEUED);
	fn_unlock(n);
	ck_assert(!manifest_of(10));
	ck_assert_int_eq(state_of(s0), SAVE_DURABLE);
	ck_assert_int_eq(state_of(s1), SAVE_CAPTURED);
	ck_assert_uint_eq(fn_ends(n, JOB, 10, SAVE_COMMITTED), 0);

	fn_durable(n, s1);
	ck_assert(fn_settle(n));
	ck_assert(manifest_of(10));
	assert_states(s0, "QUEUED CAPTURED DURABLE COMMITTED");
	assert_states(s1, "QUEUED CAPTURED DURABLE COMMITTED");
	ck_assert_uint_eq(fn_ends(n, JOB, 10, SAVE_COMMITTED), 1);
	fn_lock(n);
	ck_assert_ptr_null(fn_ckpt(n, JOB, 10)); /* committed: let go */
	fn_unlock(n);
}
END_TEST

/* A live rank of the node that has not saved the step holds its commit. */
START_TEST(unsaved_rank_holds_the_commit)
{
	struct plan *p0 = fn_plan(n, JOB, RUN, 0, 2), *p1 = fn_plan(n, JOB, RUN, 1, 2);
	struct save *s0 = save_of(p0, 10, true, true), *s1;

	fn_durable(n, s0);
	ck_assert(fn_settle(n));
	ck_assert(!manifest_of(10));
	ck_assert_int_eq(state_of(s0), SAVE_DURABLE);
	fn_lock(n);
	ck_assert(!fn_ckpt(n, JOB, 10)->committing);
	fn_unlock(n);

	s1 = save_of(p1, 10, true, true);
	fn_durable(n, s1);
	ck_assert(fn_settle(n));
	assert_states(s0, "QUEUED CAPTURED DURABLE COMMITTED");
	assert_states(s1, "QUEUED CAPTURED DURABLE COMMITTED");
	ck_assert_uint_eq(fn_ends(n, JOB, 10, SAVE_COMMITTED), 1);
}
END_TEST

/* cp_fail fails every rank's save, each naming the checkpoint; its files go. */
START_TEST(fail_fails_every_rank)
{
	struct plan *p[3];
	struct save *s[3];
	struct fake_counts c;

	for (int r = 0; r < 3; r++)
		p[r] = fn_plan(n, JOB, RUN, r, 3);
	s[0] = save_of(p[0], 10, true, true);
	s[1] = save_of(p[1], 10, true, true);
	s[2] = save_of(p[2], 10, true, false);
	fn_durable(n, s[0]);
	fn_lock(n);
	cp_fail(&n->a, fn_ckpt(n, JOB, 10), "boom");
	fn_unlock(n);
	for (int r = 0; r < 3; r++) {
		ck_assert_int_eq(state_of(s[r]), SAVE_FAILED);
		assert_reason(s[r], "checkpoint j step 10 failed: boom");
	}
	assert_states(s[0], "QUEUED CAPTURED DURABLE FAILED");
	assert_states(s[1], "QUEUED CAPTURED FAILED");
	assert_states(s[2], "QUEUED FAILED");
	/* the pipelines stop; then this node's files go (its part was never written) */
	fn_stopped(n, s[1]);
	fn_captured(n, s[2]);
	fn_stopped(n, s[2]);
	ck_assert(fn_settle(n));
	fake_counts(n->fs, &c);
	ck_assert_uint_ge(c.shard_unlinks, 1);
	ck_assert_uint_eq(c.step_tidies, 1);
	ck_assert(!manifest_of(10));
	ck_assert_uint_eq(fn_ends(n, JOB, 10, SAVE_COMMITTED), 0);
	fn_lock(n);
	ck_assert_ptr_null(fn_ckpt(n, JOB, 10)); /* every rank saved, files gone: let go */
	fn_unlock(n);
}
END_TEST

/* A failure while the commit is queued is noted and decided by the commit. */
START_TEST(fail_while_committing_is_the_commits)
{
	struct plan *p0 = fn_plan(n, JOB, RUN, 0, 2), *p1 = fn_plan(n, JOB, RUN, 1, 2);
	struct save *s0 = save_of(p0, 10, true, true), *s1 = save_of(p1, 10, true, true);
	struct checkpoint *cp;

	fn_durable(n, s0);
	fn_lock(n); /* the commit thread waits for the lock: its job runs after */
	fn_durable_held(n, s1);
	cp = fn_ckpt(n, JOB, 10);
	ck_assert(cp->committing);
	cp_fail(&n->a, cp, "late news");
	ck_assert_str_eq(cp->abort, "late news");
	ck_assert_int_eq(cp->state, SAVE_QUEUED);
	ck_assert_int_eq(s0->state, SAVE_DURABLE);
	ck_assert_int_eq(s1->state, SAVE_DURABLE);
	fn_unlock(n);
	ck_assert(fn_settle(n));
	ck_assert_int_eq(state_of(s0), SAVE_FAILED);
	ck_assert_int_eq(state_of(s1), SAVE_FAILED);
	assert_reason(s0, "checkpoint j step 10 failed: late news");
	assert_reason(s1, "checkpoint j step 10 failed: late news");
	assert_states(s1, "QUEUED CAPTURED DURABLE FAILED");
	ck_assert(!manifest_of(10));
	ck_assert_uint_eq(fn_ends(n, JOB, 10, SAVE_COMMITTED), 0);
}
END_TEST

/*
 * A plan dropped: its save not CAPTURED fails (and its step), a step waiting
 * for its rank fails naming it; a step whose save of it is CAPTURED commits.
 */
START_TEST(dropped_plan_fails_what_lost_its_source)
{
	struct plan *p0 = fn_plan(n, JOB, RUN, 0, 2), *p1 = fn_plan(n, JOB, RUN, 1, 2);
	struct save *a0 = save_of(p0, 10, true, true), *a1 = save_of(p1, 10, true, true);
	struct save *b0 = save_of(p0, 11, true, true);
	struct save *c0 = save_of(p0, 12, true, true), *c1 = save_of(p1, 12, true, false);

	fn_durable(n, a0);
	fn_drop(n, p1);
	/* step 12: rank 1's save lost its source, and the step with it */
	ck_assert_int_eq(state_of(c1), SAVE_FAILED);
	ck_assert_int_eq(state_of(c0), SAVE_FAILED);
	assert_reason(c1, "the plan was dropped");
	/* step 11: rank 1 never saved it, and never will */
	ck_assert_int_eq(state_of(b0), SAVE_FAILED);
	assert_reason(b0, "rank 1 left");
	/* step 10: captured by both: it goes on */
	ck_assert_int_eq(state_of(a0), SAVE_DURABLE);
	ck_assert_int_eq(state_of(a1), SAVE_CAPTURED);
	fn_durable(n, a1);
	fn_stopped(n, b0);
	fn_stopped(n, c0);
	fn_captured(n, c1);
	fn_stopped(n, c1);
	ck_assert(fn_settle(n));
	assert_states(a0, "QUEUED CAPTURED DURABLE COMMITTED");
	assert_states(a1, "QUEUED CAPTURED DURABLE COMMITTED");
	ck_assert_uint_eq(fn_ends(n, JOB, 10, SAVE_COMMITTED), 1);
	ck_assert_uint_eq(fn_ends(n, JOB, 11, SAVE_COMMITTED), 0);
	ck_assert_uint_eq(fn_ends(n, JOB, 12, SAVE_COMMITTED), 0);
}
END_TEST

/*
 * The deadline fails a step missing ranks, naming them; the failed step is
 * let go once its files are removed and its missing ranks are not waited
 * for any more, not before. A rank that comes meanwhile learns it failed.
 */
START_TEST(expire_names_missing_ranks)
{
	struct plan *p[4];
	struct save *s0, *s2, *s1;
	struct checkpoint *cp;
	struct fake_counts c;
	int64_t t0;

	for (int r = 0; r < 4; r++)
		p[r] = fn_plan(n, JOB, RUN, r, 4);
	s0 = save_of(p[0], 10, true, true);
	s2 = save_of(p[2], 10, true, true);
	fn_durable(n, s0);
	fn_durable(n, s2);
	ck_assert(fn_settle(n));
	fn_lock(n);
	cp = fn_ckpt(n, JOB, 10);
	t0 = cp->t_first;
	cp_expire(&n->a, t0 + DEADLINE_S * S - 1);
	ck_assert_int_eq(cp->state, SAVE_QUEUED);
	cp_expire(&n->a, t0 + DEADLINE_S * S);
	ck_assert_int_eq(cp->state, SAVE_FAILED);
	ck_assert_msg(strstr(cp->reason, "no save from ranks 1,3 on node n0"), "%s", cp->reason);
	ck_assert_int_eq(s0->state, SAVE_FAILED);
	assert_reason(s2, "ranks 1,3");
	fn_unlock(n);
	/* files removed, but ranks 1 and 3 may still come: kept, and told at once */
	ck_assert(fn_settle(n));
	fake_counts(n->fs, &c);
	ck_assert_uint_eq(c.shard_unlinks, 2);
	s1 = save_of(p[1], 10, false, false);
	ck_assert_int_eq(state_of(s1), SAVE_FAILED);
	assert_reason(s1, "checkpoint j step 10 failed: step 10: no save from ranks 1,3");
	fn_lock(n);
	ck_assert_ptr_eq(fn_ckpt(n, JOB, 10), cp);
	cp_expire(&n->a, t0 + DEADLINE_S * S); /* rank 3 is not waited for any more */
	ck_assert_ptr_null(fn_ckpt(n, JOB, 10));
	fn_unlock(n);
}
END_TEST

/* Not let go while its files are still being removed, whatever the deadline. */
START_TEST(failed_kept_until_cleaned)
{
	struct plan *p0 = fn_plan(n, JOB, RUN, 0, 2);
	struct save *s0 = save_of(p0, 10, true, true);
	struct checkpoint *cp;
	char key[128];
	int64_t t0;

	fn_plan(n, JOB, RUN, 1, 2);
	fn_durable(n, s0);
	ck_assert(fn_settle(n));
	fn_lock(n); /* the clean-up waits for the lock */
	cp = fn_ckpt(n, JOB, 10);
	t0 = cp->t_first;
	cp_expire(&n->a, t0 + DEADLINE_S * S); /* fails, its clean-up queued */
	ck_assert(cp->cleaning);
	cp_expire(&n->a, t0 + DEADLINE_S * S); /* retired: nobody is waited for */
	ck_assert(cp->retired);
	ck_assert_ptr_eq(fn_ckpt(n, JOB, 10), cp);
	fn_unlock(n);
	ck_assert(fn_settle(n));
	snprintf(key, sizeof(key), JOB "/step-000000000010/%s", s0->file);
	ck_assert_ptr_null(fake_get(n->fs, key, NULL)); /* removed first */
	fn_lock(n);
	ck_assert_ptr_null(fn_ckpt(n, JOB, 10));
	fn_unlock(n);
}
END_TEST

/* One world per step of a run; another run's save of the step is its own checkpoint. */
START_TEST(one_world_per_step_one_checkpoint_per_run)
{
	struct plan *p0 = fn_plan(n, JOB, RUN, 0, 2);
	struct plan *q0 = fn_plan(n, JOB, "other", 0, 2);
	struct plan *w4 = fn_plan(n, JOB, RUN, 3, 4);
	struct save *s0 = save_of(p0, 10, false, false), *t0, *u;
	struct checkpoint *cp;

	ck_assert_int_eq(fn_save(n, w4, 10, &u, err), -EINVAL);
	ck_assert_msg(strstr(err, "world 2") && strstr(err, "says 4"), "%s", err);
	ck_assert_ptr_null(u);
	fn_lock(n);
	ck_assert_int_eq(cp_get(&n->a, JOB, 10, 4, RUN, &cp, err), -EINVAL);
	fn_unlock(n);
	t0 = save_of(q0, 10, false, false);
	ck_assert_ptr_ne(t0->cp, s0->cp);
	ck_assert_str_eq(t0->cp->run, "other");
	ck_assert_str_eq(s0->cp->run, RUN);
	ck_assert_uint_eq(n->a.nckpts, 2);
	/* a failure of one is not the other's */
	fn_lock(n);
	cp_fail(&n->a, t0->cp, "that run died");
	fn_unlock(n);
	ck_assert_int_eq(state_of(t0), SAVE_FAILED);
	ck_assert_int_eq(state_of(s0), SAVE_QUEUED);
}
END_TEST

/* A store that refuses the part: FAILED with the store's reason, never COMMITTED. */
START_TEST(store_refuses_the_part)
{
	struct plan *p0 = fn_plan(n, JOB, RUN, 0, 2), *p1 = fn_plan(n, JOB, RUN, 1, 2);
	struct save *s0 = save_of(p0, 10, true, true), *s1 = save_of(p1, 10, true, true);

	fake_fail_put(n->fs, "parts/n0.json", -EFBIG);
	fn_durable(n, s0);
	fn_durable(n, s1);
	ck_assert(fn_settle(n));
	ck_assert_int_eq(state_of(s0), SAVE_FAILED);
	ck_assert_int_eq(state_of(s1), SAVE_FAILED);
	assert_reason(s0, "this node's part cannot be written");
	assert_reason(s1, "injected");
	assert_states(s0, "QUEUED CAPTURED DURABLE FAILED");
	ck_assert(!manifest_of(10));
	ck_assert_uint_eq(fn_ends(n, JOB, 10, SAVE_COMMITTED), 0);
}
END_TEST

/*
 * A save's states only move forward: nothing moves a committed save back or
 * fails it; the upload tier's UPLOADED, heard on the hub, comes after.
 */
START_TEST(save_states_only_forward)
{
	struct plan *p0 = fn_plan(n, JOB, RUN, 0, 2), *p1 = fn_plan(n, JOB, RUN, 1, 2);
	struct save *s0 = save_of(p0, 10, true, true), *s1 = save_of(p1, 10, true, true);
	struct agent *a = &n->a;

	fn_lock(n);
	save_set_state(a, s0, SAVE_QUEUED, "back"); /* not published: it is CAPTURED */
	fn_unlock(n);
	fn_durable(n, s0);
	fn_durable(n, s1);
	ck_assert(fn_settle(n));
	fn_lock(n);
	save_set_state(a, s0, SAVE_DURABLE, NULL);
	save_set_state(a, s0, SAVE_FAILED, "too late");
	hub_ckpt(&a->hub, a, &(struct hub_ckpt){JOB, NULL, 10, SAVE_UPLOADED, false, NULL});
	fn_unlock(n);
	assert_states(s0, "QUEUED CAPTURED DURABLE COMMITTED UPLOADED");
	assert_states(s1, "QUEUED CAPTURED DURABLE COMMITTED UPLOADED");
	ck_assert_str_eq(s0->reason, "");
	ck_assert_int_eq(state_of(s0), SAVE_UPLOADED);
	ck_assert_uint_eq(a->finals[SAVE_FAILED], 0);
	ck_assert_uint_eq(a->inflight, 0);
}
END_TEST

Suite *test_suite(void)
{
	Suite *s = suite_create("checkpoint");
	TCase *tc = tcase_create("node");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, commits_once_every_rank_durable);
	tcase_add_test(tc, unsaved_rank_holds_the_commit);
	tcase_add_test(tc, fail_fails_every_rank);
	tcase_add_test(tc, fail_while_committing_is_the_commits);
	tcase_add_test(tc, dropped_plan_fails_what_lost_its_source);
	tcase_add_test(tc, expire_names_missing_ranks);
	tcase_add_test(tc, failed_kept_until_cleaned);
	tcase_add_test(tc, one_world_per_step_one_checkpoint_per_run);
	tcase_add_test(tc, store_refuses_the_part);
	tcase_add_test(tc, save_states_only_forward);
	suite_add_tcase(s, tc);
	return s;
}
