/*
 * Trainers ride through agent restarts: the agent SIGKILLed, or stopped and
 * started as a newer build, under a trainer that keeps saving; the trainer's
 * code does nothing but save, and its next saves commit; restores after are
 * byte-exact and older checkpoints untouched. Versions: an agent and a
 * client of different protocols refuse each other, naming both versions.
 * The bound on attaching again ($CKPT_RECONNECT_SECONDS), and calls that
 * only tidy up while the agent is away.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <check.h>

#include "tests/integration/harness.h"
#include "support/check_main.h"

#define JOB "rs"

static void commit(struct ckpt_plan *p, struct h_model *m, int64_t step)
{
	struct ckpt_save *s;

	h_model_fill(m, (uint64_t)step);
	ck_assert_int_eq(ckpt_save(p, step, NULL, &s), 0);
	ck_assert_msg(ckpt_save_wait(s, CKPT_COMMITTED, 60000) == 0, "step %lld: %s",
	              (long long)step, ckpt_save_reason(s));
	ckpt_save_release(s);
}

/*
 * The trainer's loop after the agent went: one save per 100 ms, each with
 * new values, until one commits (what a training loop does, with nothing
 * special for the restart). Saves that do not commit must say the agent
 * went away. The step that committed.
 */
static int64_t save_until_committed(struct ckpt_plan *p, struct h_model *m, int64_t step)
{
	for (int i = 0; i < 600; i++, step++) {
		struct ckpt_save *s;
		int rc;

		h_model_fill(m, (uint64_t)step);
		rc = ckpt_save(p, step, NULL, &s);
		ck_assert_msg(rc == 0, "save of step %lld: %d (%s)", (long long)step, rc,
		              ckpt_last_error(NULL));
		rc = ckpt_save_wait(s, CKPT_COMMITTED, 60000);
		if (rc == 0) {
			ckpt_save_release(s);
			return step;
		}
		ck_assert_msg(rc == -EIO && strstr(ckpt_save_reason(s), "ckptd"),
		              "step %lld: %d (%s)", (long long)step, rc, ckpt_save_reason(s));
		ckpt_save_release(s);
		usleep(100000);
	}
	ck_abort_msg("no save committed within a minute of the agent's return");
	return -1;
}

/*
 * Saves once per 100 ms from `step` while each is FAILED at once (the agent
 * away), until ckpt_save itself refuses: its return (30 s at most).
 */
static int save_until_refused(struct ckpt_plan *p, int64_t step)
{
	struct ckpt_save *s;
	int rc = 0;

	for (int i = 0; i < 300 && rc == 0; i++) {
		rc = ckpt_save(p, step + i, NULL, &s);
		if (rc)
			break;
		ck_assert_int_eq(ckpt_save_wait(s, CKPT_COMMITTED, 60000), -EIO);
		ckpt_save_release(s);
		usleep(100000);
	}
	return rc;
}

/* Restores LATEST over scribbled memory: it is `step`, byte for byte. */
static void restores(struct ckpt_plan *p, struct h_model *m, int64_t want, int64_t step)
{
	int64_t got = -1;
	size_t bad = 0;

	h_model_fill(m, 0xdead);
	ck_assert_int_eq(ckpt_restore(p, step, &got, NULL), 0);
	ck_assert_int_eq(got, want);
	ck_assert_msg(h_model_check(m, (uint64_t)want, &bad), "step %lld: tensor %zu differs",
	              (long long)want, bad);
}

START_TEST(sigkill_under_a_saving_trainer)
{
	struct agent_proc a;
	struct ckpt_client *c;
	struct ckpt_plan *p;
	struct ckpt_save *s;
	struct h_model m;
	int64_t step, got;

#ifdef CKPT_FAULT_INJECTION
	/* step 3's first chunk is held 30 s: the kill comes while it is surely in flight */
	h_agent_start_env(&a, NULL,
	                  "CKPT_FAULTS=capture:slow=30000:path=" JOB
	                  "/step-000000000003/rank-0/chunk-0:count=1");
#else
	h_agent_start(&a, NULL);
#endif
	c = h_connect(&a);
	h_model_make(&m, c, 4, 3 << 20);
	ck_assert_int_eq(ckpt_plan_create(c, JOB, 0, 1, m.t, m.n, &p), 0);
	commit(p, &m, 1);
	commit(p, &m, 2);
	h_model_fill(&m, 3);
	ck_assert_int_eq(ckpt_save(p, 3, NULL, &s), 0);
#ifdef CKPT_FAULT_INJECTION
	for (int i = 0;
	     i < 300 && !h_log_has(&a, "fault injected: capture(" JOB "/step-000000000003"); i++)
		usleep(100000);
	ck_assert_msg(h_log_has(&a, "fault injected: capture(" JOB "/step-000000000003"),
	              "step 3 never started (%s)", a.log);
#endif
	h_agent_kill(&a);
	/* the save in flight ends FAILED, saying why: its agent's process is gone */
	ck_assert_int_eq(ckpt_save_wait(s, CKPT_COMMITTED, 60000), -EIO);
	ck_assert_msg(strstr(ckpt_save_reason(s), "went away (its process ended"), "%s",
	              ckpt_save_reason(s));
	ckpt_save_release(s);
	a.env[0] = '\0';
	h_agent_restart(&a);
	step = save_until_committed(p, &m, 4);
	restores(p, &m, step, CKPT_LATEST);
	/* what was committed before is untouched; the step in flight is not there */
	restores(p, &m, 2, 2);
	ck_assert_int_eq(ckpt_restore(p, 3, &got, NULL), -ENOENT);

	/* and again, at once: a second restart in the same session */
	h_agent_kill(&a);
	h_agent_restart(&a);
	step = save_until_committed(p, &m, step + 1);
	restores(p, &m, step, CKPT_LATEST);
	ckpt_plan_destroy(p);
	h_model_free(&m);
	ckpt_disconnect(c);
	h_agent_cleanup(&a);
}
END_TEST

#ifdef CKPT_FAULT_INJECTION
/* systemctl stop, a newer build installed, systemctl start: the trainer goes on. */
START_TEST(stop_and_start_a_newer_build)
{
	struct agent_proc a;
	struct ckpt_client *c;
	struct ckpt_plan *p;
	struct h_model m;
	char old[64], newer[96], line[160];
	int64_t step;

	h_agent_start(&a, NULL);
	c = h_connect(&a);
	h_model_make(&m, c, 3, 1 << 20);
	ck_assert_int_eq(ckpt_plan_create(c, JOB, 0, 1, m.t, m.n, &p), 0);
	commit(p, &m, 1);
	snprintf(old, sizeof(old), "%s", ckpt_agent_version(c));
	ck_assert_msg(old[0] && strcmp(old, "(older than 0.1)"), "agent version '%s'", old);
	ck_assert_int_eq(h_agent_stop(&a), 0);
	snprintf(newer, sizeof(newer), "%s.1", old);
	snprintf(a.env, sizeof(a.env), "CKPT_TEST_VERSION=%s", newer);
	h_agent_restart(&a);
	step = save_until_committed(p, &m, 2);
	ck_assert_str_eq(ckpt_agent_version(c), newer);
	/* the new agent met the trainer's libckpt, by its version */
	snprintf(line, sizeof(line), "libckpt %s) attached", old);
	ck_assert_msg(h_log_has(&a, line), "no '%s' in %s", line, a.log);
	restores(p, &m, step, CKPT_LATEST);
	restores(p, &m, 1, 1);
	ckpt_plan_destroy(p);
	h_model_free(&m);
	ckpt_disconnect(c);
	h_agent_cleanup(&a);
}
END_TEST

/* Another protocol on either side: refused at connect, both versions named. */
START_TEST(protocol_mismatch_names_both)
{
	struct agent_proc a;
	struct ckpt_client *c = NULL;
	struct ckpt_plan *p;
	struct h_model m;
	int rc = 0;

	/* an agent of protocol 2 */
	h_agent_start_env(&a, NULL, "CKPT_TEST_PROTOCOL=2");
	ck_assert_int_eq(ckpt_connect(a.endpoint, &c), -ENOTSUP);
	ck_assert_msg(strstr(ckpt_last_error(NULL), "libckpt ") &&
	                  strstr(ckpt_last_error(NULL), "speaks protocol 1; this ckptd ") &&
	                  strstr(ckpt_last_error(NULL), "speaks 2"),
	              "%s", ckpt_last_error(NULL));
	ck_assert_int_eq(h_agent_stop(&a), 0);

	/* a client of protocol 3 */
	a.env[0] = '\0';
	h_agent_restart(&a);
	setenv("CKPT_TEST_PROTOCOL", "3", 1);
	rc = ckpt_connect(a.endpoint, &c);
	unsetenv("CKPT_TEST_PROTOCOL");
	ck_assert_int_eq(rc, -ENOTSUP);
	ck_assert_msg(strstr(ckpt_last_error(NULL), "libckpt ") &&
	                  strstr(ckpt_last_error(NULL), "speaks protocol 3; this ckptd ") &&
	                  strstr(ckpt_last_error(NULL), "speaks 1"),
	              "%s", ckpt_last_error(NULL));
	ck_assert(h_log_has(&a, "refused: libckpt"));

	/* a trainer whose agent comes back speaking protocol 2: it stops trying, saying why */
	c = h_connect(&a);
	h_model_make(&m, c, 2, 4099);
	ck_assert_int_eq(ckpt_plan_create(c, JOB, 0, 1, m.t, m.n, &p), 0);
	commit(p, &m, 1);
	ck_assert_int_eq(h_agent_stop(&a), 0);
	snprintf(a.env, sizeof(a.env), "CKPT_TEST_PROTOCOL=2");
	h_agent_restart(&a);
	ck_assert_int_eq(save_until_refused(p, 2), -ENOTCONN);
	ck_assert_msg(strstr(ckpt_last_error(c), "speaks protocol 1; this ckptd ") &&
	                  strstr(ckpt_last_error(c), "speaks 2"),
	              "%s", ckpt_last_error(c));
	ckpt_plan_destroy(p);
	h_model_free(&m);
	ckpt_disconnect(c);
	h_agent_cleanup(&a);
}
END_TEST
#endif

/* $CKPT_RECONNECT_SECONDS bounds the trying; then calls say the agent is gone. */
START_TEST(gives_up_after_the_window)
{
	struct agent_proc a;
	struct ckpt_client *c = NULL;
	struct ckpt_plan *p;
	struct ckpt_save *s;
	struct h_model m;

	h_agent_start(&a, NULL);
	setenv("CKPT_RECONNECT_SECONDS", "soon", 1);
	ck_assert_int_eq(ckpt_connect(a.endpoint, &c), -EINVAL);
	ck_assert_msg(strstr(ckpt_last_error(NULL), "CKPT_RECONNECT_SECONDS"), "%s",
	              ckpt_last_error(NULL));
	setenv("CKPT_RECONNECT_SECONDS", "1", 1);
	c = h_connect(&a);
	unsetenv("CKPT_RECONNECT_SECONDS");
	h_model_make(&m, c, 2, 4099);
	ck_assert_int_eq(ckpt_plan_create(c, JOB, 0, 1, m.t, m.n, &p), 0);
	commit(p, &m, 1);
	h_agent_kill(&a);
	ck_assert_int_eq(save_until_refused(p, 2), -ENOTCONN);
	ck_assert_msg(strstr(ckpt_last_error(c), "could not attach again within 1 s"), "%s",
	              ckpt_last_error(c));
	/* an agent back now is not attached to: the client is done */
	h_agent_restart(&a);
	ck_assert_int_eq(ckpt_save(p, 50, NULL, &s), -ENOTCONN);
	ck_assert_int_eq(ckpt_host_alloc(c, 4096, (void **)&s), -ENOTCONN);
	ckpt_plan_destroy(p);
	h_model_free(&m);
	ckpt_disconnect(c);
	h_agent_cleanup(&a);
}
END_TEST

/*
 * While the agent is away, a trainer that gives up (destroys its plan, frees
 * its memory, disconnects) is not held until the agent comes back; the agent
 * that comes back has nothing of it, and another trainer takes its rank.
 */
START_TEST(leaving_while_the_agent_is_away)
{
	struct agent_proc a;
	struct ckpt_client *c;
	struct ckpt_plan *p;
	struct h_model m;

	h_agent_start(&a, NULL);
	c = h_connect(&a);
	h_model_make(&m, c, 2, 4099);
	ck_assert_int_eq(ckpt_plan_create(c, JOB, 0, 1, m.t, m.n, &p), 0);
	commit(p, &m, 1);
	h_agent_kill(&a);
	ckpt_plan_destroy(p);
	h_model_free(&m);
	ckpt_disconnect(c);
	h_agent_restart(&a);
	c = h_connect(&a);
	h_model_make(&m, c, 2, 4099);
	ck_assert_int_eq(ckpt_plan_create(c, JOB, 0, 1, m.t, m.n, &p), 0);
	commit(p, &m, 2);
	restores(p, &m, 1, 1);
	ckpt_plan_destroy(p);
	h_model_free(&m);
	ckpt_disconnect(c);
	h_agent_cleanup(&a);
}
END_TEST

/* A client that connects and disconnects until told to stop (what attaching again does). */
struct knocker {
	const char *endpoint;
	atomic_bool stop;
	atomic_int attached;
};

static void *knock(void *arg)
{
	struct knocker *k = arg;

	while (!atomic_load(&k->stop)) {
		struct ckpt_client *c;

		if (ckpt_connect(k->endpoint, &c) == 0) {
			atomic_fetch_add(&k->attached, 1);
			ckpt_disconnect(c);
		}
	}
	return NULL;
}

/*
 * Clients connecting while the agent stops: the agent's credentials thread
 * handed new connections to a server already freed (found under TSan by a
 * trainer attaching again during a stop). The stop is clean, every time.
 */
START_TEST(connections_while_stopping)
{
	struct agent_proc a;
	struct knocker k[2];
	pthread_t th[2];

	h_agent_start(&a, NULL);
	for (int round = 0; round < 5; round++) {
		for (int i = 0; i < 2; i++) {
			k[i] = (struct knocker){.endpoint = a.endpoint};
			atomic_init(&k[i].stop, false);
			atomic_init(&k[i].attached, 0);
			ck_assert_int_eq(pthread_create(&th[i], NULL, knock, &k[i]), 0);
		}
		while (atomic_load(&k[0].attached) + atomic_load(&k[1].attached) < 4)
			usleep(10000);
		ck_assert_int_eq(h_agent_stop(&a), 0);
		for (int i = 0; i < 2; i++) {
			atomic_store(&k[i].stop, true);
			pthread_join(th[i], NULL);
		}
		h_agent_restart(&a);
	}
	h_agent_cleanup(&a);
}
END_TEST

Suite *test_suite(void)
{
	Suite *s = suite_create("restart");
	TCase *tc = tcase_create("agent");

	tcase_set_timeout(tc, 300);
	tcase_add_test(tc, sigkill_under_a_saving_trainer);
#ifdef CKPT_FAULT_INJECTION
	tcase_add_test(tc, stop_and_start_a_newer_build);
	tcase_add_test(tc, protocol_mismatch_names_both);
#endif
	tcase_add_test(tc, gives_up_after_the_window);
	tcase_add_test(tc, leaving_while_the_agent_is_away);
	tcase_add_test(tc, connections_while_stopping);
	suite_add_tcase(s, tc);
	return s;
}
