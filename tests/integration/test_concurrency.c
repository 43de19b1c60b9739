/*
 * Concurrency and lifecycles: ranks of one step under the skip policy,
 * steps missing a rank (one that left, one that never came), many threads on
 * one client, a disconnect while another thread waits, a save during a
 * restore, and the agent stopped in the middle of a save.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <check.h>

#include "tests/integration/harness.h"
#include "support/check_main.h"

/* A rank process: this program again with --rank (no gRPC state across fork). */
static int rank_main(const char *endpoint, const char *job, int rank, int world, long step,
                     const char *mode)
{
	/* "big": 192 MiB, still in flight a while after it is queued */
	int64_t shape[1] = {strcmp(mode, "big") == 0 ? 192 << 20 : 3 << 20};
	struct ckpt_tensor t = {NULL, CKPT_U8, 1, shape, NULL, NULL, NULL};
	struct ckpt_client *c;
	struct ckpt_plan *p;
	struct ckpt_save *s;
	char name[32];
	int rc;

	snprintf(name, sizeof(name), "r%d", rank);
	t.name = name;
	if (ckpt_connect(endpoint, &c) || ckpt_host_alloc(c, (size_t)shape[0], &t.data))
		return 10;
	memset(t.data, rank + 1, (size_t)shape[0]);
	if (ckpt_plan_create(c, job, rank, world, &t, 1, &p))
		return fprintf(stderr, "rank %d: %s\n", rank, ckpt_last_error(c)), 11;
	if (strcmp(mode, "leave") == 0) { /* make a plan, then die without saving */
		sleep(1);
		raise(SIGKILL);
	}
	if (ckpt_save(p, step, NULL, &s))
		return fprintf(stderr, "rank %d: %s\n", rank, ckpt_last_error(c)), 12;
	rc = ckpt_save_wait(s, CKPT_COMMITTED, 60000);
	if (strcmp(mode, "expect-fail") == 0) {
		if (rc != -EIO)
			return fprintf(stderr, "rank %d: wait gave %d, want -EIO\n", rank, rc), 13;
		printf("%s\n", ckpt_save_reason(s));
		rc = 0;
	} else if (rc) {
		fprintf(stderr, "rank %d: %s\n", rank, ckpt_save_reason(s));
	}
	ckpt_save_release(s);
	ckpt_plan_destroy(p);
	ckpt_disconnect(c);
	return rc ? 14 : 0;
}

static pid_t spawn_rank(const struct agent_proc *a, const char *job, int rank, int world, long step,
                        const char *mode, int *out_fd)
{
	char r[8], w[8], st[24];

	snprintf(r, sizeof(r), "%d", rank);
	snprintf(w, sizeof(w), "%d", world);
	snprintf(st, sizeof(st), "%ld", step);
	return h_spawn(
	    NULL, H_OUT_PIPE, out_fd,
	    (const char *[]){"test_concurrency", "--rank", a->endpoint, job, r, w, st, mode, NULL});
}

/*
 * Four ranks of one step under the skip policy: they fit together, so none is
 * skipped. In step 4, rank 0's save (192 MiB, through the 64 MiB pool, its
 * writes slow) holds the whole pool when the other three ask: chunks of
 * their own step, so they are not skipped either (a save of another step
 * would be).
 */
START_TEST(skip_policy_ranks_together)
{
	const char *args = "--staging-mb 64 --chunk-mb 1 --backpressure skip";
	struct agent_proc a;
	pid_t pid[4];

#ifdef CKPT_FAULT_INJECTION
	h_agent_start_env(&a, args,
	                  "CKPT_FAULTS=io_write:slow=10:path=*/sk/step-000000000004/*:count=inf");
#else
	h_agent_start(&a, args);
#endif
	for (int step = 1; step <= 3; step++) {
		for (int r = 0; r < 4; r++)
			pid[r] = spawn_rank(&a, "sk", r, 4, step, "commit", NULL);
		for (int r = 0; r < 4; r++)
			ck_assert_msg(h_reap(pid[r]) == 0, "step %d rank %d did not commit", step,
			              r);
		ck_assert(h_wait_state(&a, "sk", step, "COMMITTED", 10000));
	}
	pid[0] = spawn_rank(&a, "sk", 0, 4, 4, "big", NULL);
	ck_assert(h_wait_state(&a, "sk", 4, "IN_FLIGHT", 30000));
	for (int r = 1; r < 4; r++)
		pid[r] = spawn_rank(&a, "sk", r, 4, 4, "commit", NULL);
	for (int r = 0; r < 4; r++)
		ck_assert_msg(h_reap(pid[r]) == 0, "step 4 rank %d did not commit (%s)", r, a.log);
	ck_assert(h_wait_state(&a, "sk", 4, "COMMITTED", 10000));
	h_agent_cleanup(&a);
}
END_TEST

/* The output of a rank process (its save's reason). */
static void read_all(int fd, char *buf, size_t len)
{
	size_t n = 0;
	ssize_t r;

	while (n + 1 < len && (r = read(fd, buf + n, len - 1 - n)) > 0)
		n += (size_t)r;
	buf[n] = '\0';
	close(fd);
}

/* Rank 1 makes its plan and dies; rank 0's save of the step fails, it does not hang. */
START_TEST(rank_left_before_saving)
{
	struct agent_proc a;
	char why[2048];
	pid_t leaver, saver;
	int fd;

	h_agent_start(&a, NULL);
	leaver = spawn_rank(&a, "lv", 1, 2, 7, "leave", NULL);
	saver = spawn_rank(&a, "lv", 0, 2, 7, "expect-fail", &fd);
	ck_assert_int_eq(h_reap(leaver), 128 + SIGKILL);
	ck_assert_int_eq(h_reap(saver), 0);
	read_all(fd, why, sizeof(why));
	ck_assert_msg(strstr(why, "rank 1 left"), "the reason names the rank: %s", why);
	h_agent_cleanup(&a);
}
END_TEST

/* A rank that never comes at all: the step fails at the commit deadline, naming it. */
START_TEST(rank_never_came)
{
	struct agent_proc a;
	char why[2048];
	int fd;

	h_agent_start(&a, "--staging-mb 64 --chunk-mb 1 --commit-deadline 2");
	ck_assert_int_eq(h_reap(spawn_rank(&a, "nc", 0, 3, 9, "expect-fail", &fd)), 0);
	read_all(fd, why, sizeof(why));
	ck_assert_msg(strstr(why, "step 9: no save of ranks 1,2 here") &&
	                  strstr(why, "within 2 s (--commit-deadline)"),
	              "%s", why);
	h_agent_cleanup(&a);
}
END_TEST

/* ---- many threads, one client ------------------------------------------ */

struct worker {
	struct ckpt_plan *p;
	int errors;
	char last[512];
};

static void *save_loop(void *arg)
{
	struct worker *w = arg;

	for (int step = 1; step <= 15; step++) {
		struct ckpt_save *s;

		if (ckpt_save(w->p, step, NULL, &s) || ckpt_save_wait(s, CKPT_COMMITTED, 60000)) {
			w->errors++;
			continue;
		}
		ckpt_save_release(s);
	}
	return NULL;
}

START_TEST(many_threads_one_client)
{
	enum { N = 10 };
	struct agent_proc a;
	struct ckpt_client *c;
	struct worker w[N];
	pthread_t th[N];
	struct h_model m;

	h_agent_start(&a, NULL);
	c = h_connect(&a);
	h_model_make(&m, c, N, 4000);
	for (int i = 0; i < N; i++) {
		char job[16];

		snprintf(job, sizeof(job), "mt%d", i);
		memset(&w[i], 0, sizeof(w[i]));
		ck_assert_int_eq(ckpt_plan_create(c, job, 0, 1, &m.t[i], 1, &w[i].p), 0);
	}
	for (int i = 0; i < N; i++)
		ck_assert_int_eq(pthread_create(&th[i], NULL, save_loop, &w[i]), 0);
	for (int i = 0; i < N; i++) {
		pthread_join(th[i], NULL);
		ck_assert_msg(w[i].errors == 0, "thread %d: %d failed saves: %s", i, w[i].errors,
		              ckpt_last_error(c));
		ckpt_plan_destroy(w[i].p);
	}
	h_model_free(&m);
	ckpt_disconnect(c);
	h_agent_cleanup(&a);
}
END_TEST

/* ---- disconnect while another thread waits ----------------------------- */

struct waiter {
	struct ckpt_save *s;
	int rc;
	atomic_bool done;
};

static void *wait_committed(void *arg)
{
	struct waiter *w = arg;

	w->rc = ckpt_save_wait(w->s, CKPT_COMMITTED, -1);
	atomic_store(&w->done, true);
	return NULL;
}

START_TEST(disconnect_while_waiting)
{
	struct agent_proc a;
	struct ckpt_client *c;
	struct ckpt_plan *p;
	struct h_model m;
	struct waiter w = {0};
	pthread_t th;

	/* a save that takes a while to commit: written 1 MiB at a time */
	h_agent_start(&a, "--staging-mb 64 --chunk-mb 1 --queue-depth 1");
	c = h_connect(&a);
	h_model_make(&m, c, 4, 12 << 20);
	ck_assert_int_eq(ckpt_plan_create(c, "dw", 0, 1, m.t, m.n, &p), 0);
	ck_assert_int_eq(ckpt_save(p, 1, NULL, &w.s), 0);
	ck_assert_int_eq(pthread_create(&th, NULL, wait_committed, &w), 0);
	/* CAPTURED: from here the checkpoint commits even without us */
	ck_assert_int_eq(ckpt_save_wait(w.s, CKPT_CAPTURED, 60000), 0);
	ckpt_host_free(c, m.base);
	m.base = NULL;
	ckpt_disconnect(c); /* the waiter must come out, not crash */
	pthread_join(th, NULL);
	ck_assert_msg(w.rc == -ENOTCONN || w.rc == 0, "waiter got %d", w.rc);
	/* what the user still holds is safe to use and release */
	ck_assert_int_eq(ckpt_save_wait(w.s, CKPT_COMMITTED, 0), -ENOTCONN);
	{
		struct ckpt_save *s2 = (struct ckpt_save *)&w; /* must be reset */

		ck_assert_int_eq(ckpt_save(p, 2, NULL, &s2), -ENOTCONN);
		ck_assert_ptr_null(s2);
	}
	ckpt_save_release(w.s);
	ckpt_plan_destroy(p);
	m.c = NULL;
	h_model_free(&m);
	/* the save was CAPTURED before the client left: it still commits */
	ck_assert(h_wait_state(&a, "dw", 1, "COMMITTED", 60000));
	h_agent_cleanup(&a);
}
END_TEST

/* ---- a save while a restore writes the same memory --------------------- */

struct restorer {
	struct ckpt_plan *p;
	int rc;
	atomic_bool done;
};

static void *restore_latest(void *arg)
{
	struct restorer *r = arg;

	r->rc = ckpt_restore(r->p, CKPT_LATEST, NULL, NULL);
	atomic_store(&r->done, true);
	return NULL;
}

START_TEST(save_during_restore_refused)
{
	struct agent_proc a;
	struct ckpt_client *c;
	struct ckpt_plan *p;
	struct ckpt_save *s;
	struct h_model m;
	struct restorer r = {0};
	pthread_t th;
	bool was_done;
	int rc;

#ifdef CKPT_FAULT_INJECTION
	/* reads made slow (64 of them, 20 ms late each): the save comes mid-restore */
	h_agent_start_env(&a, "--staging-mb 64 --chunk-mb 1 --queue-depth 1",
	                  "CKPT_FAULTS=io_read:slow=20:path=*/sr/*:count=inf");
#else
	h_agent_start(&a, "--staging-mb 64 --chunk-mb 1 --queue-depth 1");
#endif
	c = h_connect(&a);
	h_model_make(&m, c, 4, 16 << 20);
	ck_assert_int_eq(ckpt_plan_create(c, "sr", 0, 1, m.t, m.n, &p), 0);
	h_model_fill(&m, 1);
	ck_assert_int_eq(ckpt_save(p, 1, NULL, &s), 0);
	ck_assert_int_eq(ckpt_save_wait(s, CKPT_COMMITTED, 60000), 0);
	ckpt_save_release(s);
	r.p = p;
	ck_assert_int_eq(pthread_create(&th, NULL, restore_latest, &r), 0);
	usleep(30000); /* 64 MiB read 1 MiB at a time: the restore is still going */
	was_done = atomic_load(&r.done);
	rc = ckpt_save(p, 2, NULL, &s);
	pthread_join(th, NULL);
	ck_assert_int_eq(r.rc, 0);
	if (!was_done && !atomic_load(&r.done))
		ck_abort_msg("restore finished only after join");
#ifdef CKPT_FAULT_INJECTION
	ck_assert_msg(!was_done, "a restore of 1.3 s was over after 30 ms");
#endif
	if (!was_done) {
		ck_assert_msg(rc == -EBUSY, "save during restore: %d (%s)", rc, ckpt_last_error(c));
		ck_assert_msg(strstr(ckpt_last_error(c), "restore"), "%s", ckpt_last_error(c));
	} else if (rc == 0) {
		ckpt_save_release(s);
	}
	ck_assert(h_model_check(&m, 1, NULL));
	ckpt_plan_destroy(p);
	h_model_free(&m);
	ckpt_disconnect(c);
	h_agent_cleanup(&a);
}
END_TEST

/* ---- SIGTERM in the middle of a save ----------------------------------- */

START_TEST(stop_mid_save)
{
	struct agent_proc a;
	char out[8192], dir[512], held[128];
	pid_t pid;

#ifdef CKPT_FAULT_INJECTION
	/*
	 * The copy of one chunk of each save is held 3 s (chunk 0 of step 10:
	 * before anything is written; chunk 100 of step 11: half-way): the
	 * stop comes while the save is surely in flight, whatever the machine.
	 */
	h_agent_start_env(&a, "--staging-mb 16 --chunk-mb 1 --queue-depth 1",
	                  "CKPT_FAULTS=capture:slow=3000:path=term/step-000000000010/rank-0/"
	                  "chunk-0:count=1;capture:slow=3000:path=term/step-000000000011/rank-0/"
	                  "chunk-100:count=1");
#else
	h_agent_start(&a, "--staging-mb 16 --chunk-mb 1 --queue-depth 1");
#endif
	for (int k = 0; k < 2; k++) {
		int i;

		pid = spawn_rank(&a, "term", 0, 1, 10 + k, "big", NULL);
		h_path(&a, dir, sizeof(dir), "term/step-%012d", 10 + k);
#ifdef CKPT_FAULT_INJECTION
		snprintf(held, sizeof(held),
		         "fault injected: capture(term/step-%012d/rank-0/chunk-%d)", 10 + k,
		         k * 100);
#else
		/* in flight once its step directory is there (its shard is being made) */
		snprintf(held, sizeof(held), "%s", "");
#endif
		for (i = 0; i < 30000 && !(held[0] ? h_log_has(&a, held) : h_exists(dir)); i++)
			usleep(1000);
		ck_assert_msg(i < 30000, "the save of step %d never started (%s)", 10 + k, a.log);
		/* a clean stop, whatever the save was doing: exit 0, nothing freed twice */
		ck_assert_int_eq(h_agent_stop(&a), 0);
		h_reap(pid);
		h_agent_restart(&a);
		if (h_exists(dir))
			ck_assert_int_eq(h_ctl(&a, out, sizeof(out), "verify term %d", 10 + k), 0);
	}
	h_agent_cleanup(&a);
}
END_TEST

int test_before(int argc, char **argv)
{
	if (argc == 8 && strcmp(argv[1], "--rank") == 0)
		return rank_main(argv[2], argv[3], atoi(argv[4]), atoi(argv[5]), atol(argv[6]),
		                 argv[7]);
	return TEST_RUN;
}

Suite *test_suite(void)
{
	Suite *s;
	TCase *tc;

	s = suite_create("concurrency");
	tc = tcase_create("agent");
	tcase_set_timeout(tc, 300);
	tcase_add_test(tc, skip_policy_ranks_together);
	tcase_add_test(tc, rank_left_before_saving);
	tcase_add_test(tc, rank_never_came);
	tcase_add_test(tc, many_threads_one_client);
	tcase_add_test(tc, disconnect_while_waiting);
	tcase_add_test(tc, save_during_restore_refused);
	tcase_add_test(tc, stop_mid_save);
	suite_add_tcase(s, tc);
	return s;
}
