/*
 * Failures, for real: corrupt bytes found by restore and verify (naming the
 * tensor and the file), the agent SIGKILLed in the middle of a save, trainers
 * killed before and after CAPTURED (the latter while its save still writes),
 * and a full staging pool under the skip policy.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <check.h>
#include <jansson.h>

#include "tests/integration/harness.h"
#include "support/check_main.h"

static void commit(struct ckpt_plan *p, int64_t step)
{
	struct ckpt_save *s;

	ck_assert_int_eq(ckpt_save(p, step, NULL, &s), 0);
	ck_assert_msg(ckpt_save_wait(s, CKPT_COMMITTED, 60000) == 0, "step %lld: %s",
	              (long long)step, ckpt_save_reason(s));
	ckpt_save_release(s);
}

/* The byte range of tensor `name` of rank 0 in step's shard, from the manifest. */
static void tensor_range(const struct agent_proc *a, const char *job, int64_t step,
                         const char *name, uint64_t *begin, uint64_t *end)
{
	static char out[1 << 20];
	json_t *j, *r;

	ck_assert_int_eq(h_ctl(a, out, sizeof(out), "--json show %s %lld", job, (long long)step),
	                 0);
	j = json_loads(out, 0, NULL);
	ck_assert_ptr_nonnull(j);
	r = json_object_get(
	    json_array_get(
	        json_object_get(json_object_get(json_object_get(j, "tensors"), name), "chunks"), 0),
	    "byte_range");
	ck_assert_ptr_nonnull(r);
	*begin = (uint64_t)json_integer_value(json_array_get(r, 0));
	*end = (uint64_t)json_integer_value(json_array_get(r, 1));
	json_decref(j);
}

START_TEST(corrupt_byte)
{
	struct agent_proc a;
	struct ckpt_client *c;
	struct ckpt_plan *p;
	struct h_model m;
	char out[16384], shard[512];
	uint64_t b, e;
	int64_t step = -1;
	int rc;

	h_agent_start(&a, NULL);
	c = h_connect(&a);
	h_model_make(&m, c, 6, 200003);
	ck_assert_int_eq(ckpt_plan_create(c, "cor", 0, 1, m.t, m.n, &p), 0);
	h_model_fill(&m, 1);
	commit(p, 1);
	h_model_fill(&m, 2);
	commit(p, 2);
	ck_assert_int_eq(h_ctl(&a, out, sizeof(out), "verify cor 2"), 0);
	ck_assert_msg(strstr(out, "OK"), "%s", out);

	/* one flipped bit in the middle of tensor 2 of step 2 */
	tensor_range(&a, "cor", 2, m.name[2], &b, &e);
	h_shard(&a, shard, sizeof(shard), "cor", 2, 0);
	h_flip_byte(shard, b + (e - b) / 2);

	rc = ckpt_restore(p, 2, NULL, NULL);
	ck_assert_int_eq(rc, -EBADMSG);
	ck_assert_msg(strstr(ckpt_last_error(c), m.name[2]) &&
	                  strstr(ckpt_last_error(c), strrchr(shard, '/') + 1) &&
	                  strstr(ckpt_last_error(c), "cor") && strstr(ckpt_last_error(c), "step 2"),
	              "restore names job, step, tensor and file: %s", ckpt_last_error(c));
	rc = h_ctl(&a, out, sizeof(out), "verify cor 2");
	ck_assert_int_eq(rc, 1);
	ck_assert_msg(strstr(out, "CORRUPT") && strstr(out, m.name[2]) &&
	                  strstr(out, "checksum mismatch") && strstr(out, shard),
	              "verify names the tensor and the file: %s", out);
	/* only that tensor */
	ck_assert_msg(!strstr(out, m.name[1]) && !strstr(out, m.name[3]), "%s", out);

	/* LATEST with fallback passes over the damaged step to the newest good one */
	h_model_fill(&m, 9);
	rc = ckpt_restore2(p, CKPT_LATEST, 1, &step, NULL);
	ck_assert_msg(rc == 0, "fallback: %s", ckpt_last_error(c));
	ck_assert_int_eq(step, 1);
	ck_assert(h_model_check(&m, 1, NULL));
	/* so does the default, saying which step it passed over and why */
	{
		struct ckpt_restore_opts o = CKPT_RESTORE_OPTS_INIT;

		h_model_fill(&m, 9);
		step = -1;
		ck_assert_int_eq(ckpt_restore_opts(p, CKPT_LATEST, &o, &step, NULL), 0);
		ck_assert_int_eq(step, 1);
		ck_assert(h_model_check(&m, 1, NULL));
		ck_assert_msg(o.skipped && strstr(o.skipped, "step 2: ") &&
		                  strstr(o.skipped, m.name[2]) &&
		                  strstr(o.skipped, "checksum mismatch"),
		              "%s", o.skipped ? o.skipped : "(none)");
		free(o.skipped);
		/* strict: the error, not a silent older step */
		o.fallback = CKPT_FALLBACK_NEVER;
		ck_assert_int_eq(ckpt_restore_opts(p, CKPT_LATEST, &o, &step, NULL), -EBADMSG);
		ck_assert_msg(strstr(ckpt_last_error(c), "step 2") &&
		                  strstr(ckpt_last_error(c), m.name[2]),
		              "%s", ckpt_last_error(c));
		ck_assert_ptr_null(o.skipped);
	}

	/* a damaged header: restore still reads the bytes it checks; verify says */
	h_shard(&a, shard, sizeof(shard), "cor", 1, 0);
	h_flip_byte(shard, 12);
	ck_assert_int_eq(h_ctl(&a, out, sizeof(out), "verify cor 1"), 1);
	ck_assert_msg(strstr(out, strrchr(shard, '/') + 1), "%s", out);
	/* and the agent is still fine */
	ck_assert_int_eq(h_ctl(&a, out, sizeof(out), "status"), 0);
	ckpt_plan_destroy(p);
	h_model_free(&m);
	ckpt_disconnect(c);
	h_agent_cleanup(&a);
}
END_TEST

START_TEST(truncated_shard)
{
	struct agent_proc a;
	struct ckpt_client *c;
	struct ckpt_plan *p;
	struct h_model m;
	char out[8192], shard[512];

	h_agent_start(&a, NULL);
	c = h_connect(&a);
	h_model_make(&m, c, 3, 100003);
	ck_assert_int_eq(ckpt_plan_create(c, "tr", 0, 1, m.t, m.n, &p), 0);
	h_model_fill(&m, 3);
	commit(p, 5);
	h_shard(&a, shard, sizeof(shard), "tr", 5, 0);
	ck_assert_int_eq(truncate(shard, 5000), 0);
	ck_assert_int_eq(ckpt_restore(p, 5, NULL, NULL), -EBADMSG);
	ck_assert_msg(strstr(ckpt_last_error(c), "5000 bytes"), "%s", ckpt_last_error(c));
	/* the file's length, and nothing of a header that was never read */
	ck_assert_int_eq(h_ctl(&a, out, sizeof(out), "verify tr 5"), 1);
	ck_assert_msg(strstr(out, "5000 bytes") && !strstr(out, "header"), "%s", out);
	ck_assert_int_eq(unlink(shard), 0);
	/* a committed step whose file is gone is damaged, not absent: never a fresh start */
	ck_assert_int_eq(ckpt_restore(p, 5, NULL, NULL), -EBADMSG);
	ck_assert_msg(strstr(ckpt_last_error(c), strrchr(shard, '/') + 1), "%s",
	              ckpt_last_error(c));
	ck_assert_int_eq(h_ctl(&a, out, sizeof(out), "verify tr 5"), 1);
	ck_assert_msg(strstr(out, strrchr(shard, '/') + 1) && !strstr(out, "header"), "%s", out);
	ckpt_plan_destroy(p);
	h_model_free(&m);
	ckpt_disconnect(c);
	h_agent_cleanup(&a);
}
END_TEST

/*
 * SIGKILL at three moments of a save: right after it is queued, right after
 * CAPTURED (while it is written), and a little later. After a restart,
 * nothing partial is visible: the step is either absent (its directory
 * removed at start) or committed and byte-exact; and LATEST loads.
 */
START_TEST(agent_killed_mid_save)
{
	const int delays_ms[] = {-1, 0, 15};
	struct agent_proc a;
	char out[65536], dir[512];
	unsigned removed = 0;

	h_agent_start(&a, "--staging-mb 64 --chunk-mb 1 --queue-depth 1");
	for (int k = 0; k < 3; k++) {
		struct ckpt_client *c = h_connect(&a);
		struct ckpt_plan *p;
		struct ckpt_save *s;
		struct h_model m;
		int64_t step = -1;
		json_t *j;

		h_model_make(&m, c, 4, 10 << 20); /* ~40 MiB, written 1 MiB at a time */
		ck_assert_int_eq(ckpt_plan_create(c, "kill", 0, 1, m.t, m.n, &p), 0);
		h_model_fill(&m, 10 + (uint64_t)k);
		commit(p, 10 * k + 1);
		h_model_fill(&m, 20 + (uint64_t)k);
		ck_assert_int_eq(ckpt_save(p, 10 * k + 2, NULL, &s), 0);
		if (delays_ms[k] >= 0) {
			struct timespec ts = {0, delays_ms[k] * 1000000L};

			ck_assert_int_eq(ckpt_save_wait(s, CKPT_CAPTURED, 60000), 0);
			nanosleep(&ts, NULL);
		}
		h_agent_kill(&a);
		ckpt_save_release(s);
		ckpt_plan_destroy(p);
		h_model_free(&m);
		ckpt_disconnect(c);

		h_agent_restart(&a);
		/*
		 * The manifest, not the step's directory: a kill between the part and
		 * the manifest leaves a directory holding a part, which start-up keeps
		 * (on a shared root it may be another node's, still committing).
		 */
		h_path(&a, dir, sizeof(dir), "kill/step-%012d/manifest.json", 10 * k + 2);
		ck_assert_int_eq(h_ctl(&a, out, sizeof(out), "--json status"), 0);
		j = json_loads(out, 0, NULL);
		removed += (unsigned)json_integer_value(json_object_get(j, "removed_at_start"));
		json_decref(j);
		if (h_exists(dir)) { /* it finished before the kill: then it must be whole */
			ck_assert_int_eq(h_ctl(&a, out, sizeof(out), "verify kill %d", 10 * k + 2),
			                 0);
		} else {
			ck_assert_int_eq(h_ctl(&a, out, sizeof(out), "show kill %d", 10 * k + 2),
			                 1);
		}
		/* LATEST loads, and is byte-exact for its step */
		c = h_connect(&a);
		h_model_make(&m, c, 4, 10 << 20);
		ck_assert_int_eq(ckpt_plan_create(c, "kill", 0, 1, m.t, m.n, &p), 0);
		ck_assert_int_eq(ckpt_restore(p, CKPT_LATEST, &step, NULL), 0);
		ck_assert(step == 10 * k + 1 || step == 10 * k + 2);
		ck_assert(h_model_check(
		    &m, step == 10 * k + 1 ? 10 + (uint64_t)k : 20 + (uint64_t)k, NULL));
		ckpt_plan_destroy(p);
		h_model_free(&m);
		ckpt_disconnect(c);
	}
	/* 40 MiB at one 1 MiB write at a time: at least one kill lands mid-write */
	ck_assert_msg(removed >= 1, "a partial step was found and removed at restart");
	ck_assert_msg(h_log_has(&a, "uncommitted step directories"),
	              "the restart logs its cleanup");
	h_agent_cleanup(&a);
}
END_TEST

/* ---- trainers in their own processes ----------------------------------- */

/* A trainer: one U8 tensor of mb MiB; saves `step` and then does `mode`. */
static int trainer_main(const char *endpoint, const char *job, long step, long mb, const char *mode)
{
	int64_t shape[1] = {mb << 20};
	struct ckpt_tensor t = {"blob", CKPT_U8, 1, shape, NULL, NULL, NULL};
	struct ckpt_client *c;
	struct ckpt_plan *p;
	struct ckpt_save *s;

	if (ckpt_connect(endpoint, &c) || ckpt_host_alloc(c, (size_t)shape[0], &t.data))
		return 10;
	memset(t.data, (int)step, (size_t)shape[0]);
	if (ckpt_plan_create(c, job, 0, 1, &t, 1, &p) || ckpt_save(p, step, NULL, &s))
		return fprintf(stderr, "trainer: %s\n", ckpt_last_error(c)), 11;
	if (strcmp(mode, "die-queued") == 0)
		raise(SIGKILL);
	if (strcmp(mode, "die-captured") == 0) {
		if (ckpt_save_wait(s, CKPT_CAPTURED, 60000))
			return 12;
		raise(SIGKILL);
	}
	if (ckpt_save_wait(s, CKPT_COMMITTED, 120000))
		return fprintf(stderr, "trainer: %s\n", ckpt_save_reason(s)), 13;
	ckpt_save_release(s);
	ckpt_plan_destroy(p);
	ckpt_host_free(c, t.data);
	ckpt_disconnect(c);
	return 0;
}

START_TEST(trainer_killed_after_captured_commits)
{
	struct agent_proc a;
	char out[8192];

#ifdef CKPT_FAULT_INJECTION
	/* its writes slow (40 x 50 ms): the save is still writing when its trainer dies */
	h_agent_start_env(&a, "--staging-mb 64 --chunk-mb 1 --queue-depth 1",
	                  "CKPT_FAULTS=io_write:slow=50:path=*/orphan/*:count=inf");
#else
	h_agent_start(&a, "--staging-mb 64 --chunk-mb 1 --queue-depth 1");
#endif
	ck_assert_int_eq(
	    h_reap(h_spawn_trainer("test_failures", &a, "orphan", 5, 40, "die-captured")),
	    128 + SIGKILL);
	ck_assert_msg(h_wait_state(&a, "orphan", 5, "COMMITTED", 60000),
	              "the save of a dead trainer commits");
	ck_assert_int_eq(h_ctl(&a, out, sizeof(out), "verify orphan 5"), 0);
	h_agent_cleanup(&a);
}
END_TEST

/*
 * A hog: a trainer whose save of mb MiB streams through a pool much smaller
 * than it, holding the whole pool while it is in flight. Returns its pid once
 * its save is seen in flight, or -1 (reaped) when it was done before anyone
 * could look: the caller tries again with a larger hog, since what it tests
 * needs a full pool.
 */
static pid_t hog_in_flight(const struct agent_proc *a, long step, long mb)
{
	pid_t hog = h_spawn_trainer("test_failures", a, "hog", step, mb, "commit");

	for (int waited = 0; waited < 30000; waited += 10) {
		if (h_wait_state(a, "hog", step, "IN_FLIGHT", 0))
			return hog;
		if (h_wait_state(a, "hog", step, "COMMITTED", 0))
			break;
		usleep(10000);
	}
	ck_assert_int_eq(h_reap(hog), 0);
	return -1;
}

START_TEST(trainer_killed_before_captured_aborts)
{
	struct agent_proc a;
	char out[8192], dir[512];
	bool queued = false;
	pid_t hog;

	/* A save streams through a 16 MiB pool, slowly: the victim waits for room. */
#ifdef CKPT_FAULT_INJECTION
	/* the hog's writes slow (20 ms each): the pool stays full, the victim queued */
	h_agent_start_env(&a, "--staging-mb 16 --chunk-mb 1 --queue-depth 1",
	                  "CKPT_FAULTS=io_write:slow=20:path=*/hog/*:count=inf");
#else
	h_agent_start(&a, "--staging-mb 16 --chunk-mb 1 --queue-depth 1");
#endif
	for (long mb = 256, step = 1; mb <= 2048 && !queued; mb *= 2, step++) {
		if ((hog = hog_in_flight(&a, step, mb)) < 0)
			continue;
		ck_assert_int_eq(
		    h_reap(h_spawn_trainer("test_failures", &a, "victim", 7, 8, "die-queued")),
		    128 + SIGKILL);
		ck_assert_int_eq(h_reap(hog), 0);
		ck_assert(h_wait_state(&a, "hog", step, "COMMITTED", 10000));
		/* the hog finished before the victim asked: the victim saved; again, larger */
		queued = h_log_has(&a, "before its save was CAPTURED");
		if (!queued && h_wait_state(&a, "victim", 7, "COMMITTED", 10000))
			ck_assert_int_eq(h_ctl(&a, out, sizeof(out), "delete --force victim 7"), 0);
	}
	ck_assert_msg(queued, "the victim's save was aborted while queued behind the hog");
	/* the victim's save was aborted: never committed, nothing on disk */
	h_path(&a, dir, sizeof(dir), "victim/step-000000000007");
	for (int i = 0; i < 600 && h_exists(dir); i++)
		usleep(100000);
	ck_assert_msg(!h_exists(dir), "%s is still there 60 s after the abort (see %s)", dir,
	              a.log);
	ck_assert_int_eq(h_ctl(&a, out, sizeof(out), "show victim 7"), 1);
	ck_assert_msg(h_log_has(&a, "client test_failures") && h_log_has(&a, "1 regions released"),
	              "the dead trainer's region is released");
	h_agent_cleanup(&a);
}
END_TEST

START_TEST(skip_when_pool_full)
{
	struct agent_proc a;
	struct ckpt_client *c;
	struct ckpt_plan *p;
	struct ckpt_save *s;
	struct h_model m;
	bool skipped = false;
	long step = 3;
	pid_t hog;

#ifdef CKPT_FAULT_INJECTION
	/*
	 * The hog's writes slow (20 ms each): its chunks stay filled, waiting
	 * for the disk, so the pool is full whenever the skipper asks, however
	 * slow the copies are (under TSan they are slow enough for chunks to
	 * come free between them).
	 */
	h_agent_start_env(&a, "--staging-mb 16 --chunk-mb 1 --queue-depth 1 --backpressure skip",
	                  "CKPT_FAULTS=io_write:slow=20:path=*/hog/*:count=inf");
#else
	h_agent_start(&a, "--staging-mb 16 --chunk-mb 1 --queue-depth 1 --backpressure skip");
#endif
	c = h_connect(&a);
	h_model_make(&m, c, 2, 1 << 20);
	ck_assert_int_eq(ckpt_plan_create(c, "skipper", 0, 1, m.t, m.n, &p), 0);
	for (long mb = 256, hstep = 1; mb <= 2048; mb *= 2, hstep++, step++) {
		int rc;

		/* in flight: the hog's save holds the whole pool for a while */
		if ((hog = hog_in_flight(&a, hstep, mb)) < 0)
			continue;
		ck_assert_int_eq(ckpt_save(p, step, NULL, &s), 0);
		rc = ckpt_save_wait(s, CKPT_CAPTURED, 60000);
		ck_assert_int_eq(h_reap(hog), 0);
		if (rc == 0) {
			/* the hog was done first: the save found room; again, larger */
			ckpt_save_release(s);
			continue;
		}
		ck_assert_int_eq(rc, -ECANCELED);
		ck_assert_int_eq(ckpt_save_state(s), CKPT_SKIPPED);
		ck_assert_msg(strstr(ckpt_save_reason(s), "staging pool full"), "%s",
		              ckpt_save_reason(s));
		ckpt_save_release(s);
		skipped = true;
		break;
	}
	ck_assert_msg(skipped, "a save was skipped behind the hog");
	/* with room again, the same plan saves */
	commit(p, step + 1);
	ckpt_plan_destroy(p);
	h_model_free(&m);
	ckpt_disconnect(c);
	h_agent_cleanup(&a);
}
END_TEST

int test_before(int argc, char **argv)
{
	if (argc == 7 && strcmp(argv[1], "--trainer") == 0)
		return trainer_main(argv[2], argv[3], atol(argv[4]), atol(argv[5]), argv[6]);
	return TEST_RUN;
}

Suite *test_suite(void)
{
	Suite *s;
	TCase *tc;

	s = suite_create("failures");
	tc = tcase_create("agent");
	tcase_set_timeout(tc, 300);
	tcase_add_test(tc, corrupt_byte);
	tcase_add_test(tc, truncated_shard);
	tcase_add_test(tc, agent_killed_mid_save);
	tcase_add_test(tc, trainer_killed_after_captured_commits);
	tcase_add_test(tc, trainer_killed_before_captured_aborts);
	tcase_add_test(tc, skip_when_pool_full);
	suite_add_tcase(s, tc);
	return s;
}
