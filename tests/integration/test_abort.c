/*
 * Saves that end early, read from the agent's own counters (/metrics): a
 * trainer SIGKILLed before CAPTURED stops the copies within a chunk or two
 * and the next trainer's save commits; a failed step missing a rank that
 * never comes is let go of (ckptd_checkpoints_held back to 0); a save still writing when the agent
 * is told to stop commits before it exits.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <check.h>

#include "tests/integration/harness.h"
#include "support/check_main.h"

#define MIB (1024.0 * 1024.0)

/*
 * The MiB of the big saves. Under TSan each byte a process touches costs
 * four of shadow: a 1 GiB save took 5 GiB in the trainer and up to 9 GiB in
 * the agent (its pool and the trainer's memory it read), and the TSan stage
 * runs test_abort_stop beside the other tests. Two such saves at once
 * outgrew a 24 GiB machine, and the kernel killed an agent mid-save (its
 * trainer rightly saw it go). The sanitizer builds check memory and races,
 * not sizes: a quarter there.
 */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define BIG_MB 256
#else
#define BIG_MB 1024
#endif

static void sleep_ms(long ms)
{
	struct timespec ts = {ms / 1000, (ms % 1000) * 1000000};

	nanosleep(&ts, NULL);
}

/* ---- /metrics ------------------------------------------------------------ */

/* Polls until the sample `name` is at least (or, !above, at most) v; whether it got there. */
static bool metric_reaches(unsigned port, const char *name, double v, bool above, int timeout_ms)
{
	for (int waited = 0; waited <= timeout_ms; waited += 20) {
		double now = h_metric(port, name);

		if (above ? now >= v : now <= v)
			return true;
		sleep_ms(20);
	}
	return false;
}

static void start_with_metrics(struct agent_proc *a, unsigned *port, const char *args)
{
	char all[400];

	*port = h_free_port();
	snprintf(all, sizeof(all), "%s --metrics-listen 127.0.0.1:%u", args, *port);
	h_agent_start(a, all);
}

/* ---- trainers in their own processes ------------------------------------- */

/* One U8 tensor of mb MiB filled with `step`, and its plan for (job, rank 0 of 1). */
static int blob_plan(struct ckpt_client *c, const char *job, long step, long mb,
                     struct ckpt_plan **p)
{
	int64_t shape[1] = {mb << 20};
	struct ckpt_tensor t = {"blob", CKPT_U8, 1, shape, NULL, NULL, NULL};

	if (ckpt_host_alloc(c, (size_t)shape[0], &t.data))
		return fprintf(stderr, "trainer: %s\n", ckpt_last_error(c)), 10;
	memset(t.data, (int)step, (size_t)shape[0]);
	if (ckpt_plan_create(c, job, 0, 1, &t, 1, p))
		return fprintf(stderr, "trainer: %s\n", ckpt_last_error(c)), 11;
	return 0;
}

/*
 * A trainer saving `step` of mb MiB: "commit" waits for COMMITTED (exit 0);
 * "two-die" saves job-a and then job-b, mb MiB each (both ready before the
 * first save), drops job-b's plan as soon as its save is queued, and dies.
 */
static int trainer_main(const char *endpoint, const char *job, long step, long mb, const char *mode)
{
	struct ckpt_client *c;
	struct ckpt_plan *p[2];
	struct ckpt_save *s;
	char name[64];

	if (ckpt_connect(endpoint, &c))
		return 10;
	if (strcmp(mode, "two-die") == 0) {
		for (int i = 0; i < 2; i++) {
			snprintf(name, sizeof(name), "%s-%c", job, 'a' + i);
			if (blob_plan(c, name, step, mb, &p[i]))
				return 11;
		}
		if (ckpt_save(p[0], step, NULL, &s) || ckpt_save(p[1], step, NULL, &s))
			return fprintf(stderr, "trainer: %s\n", ckpt_last_error(c)), 12;
		/* job-b's save aborted before its copy begins: the drop returns after it */
		ckpt_plan_destroy(p[1]);
		raise(SIGKILL);
	}
	if (blob_plan(c, job, step, mb, &p[0]) || ckpt_save(p[0], step, NULL, &s))
		return 12;
	if (ckpt_save_wait(s, CKPT_COMMITTED, 120000))
		return fprintf(stderr, "trainer: %s\n", ckpt_save_reason(s)), 13;
	ckpt_save_release(s);
	ckpt_plan_destroy(p[0]); /* its memory goes with the client */
	ckpt_disconnect(c);
	return 0;
}

/* ---- the tests ------------------------------------------------------------ */

/*
 * 1 GiB (BIG_MB) in two saves of 512 MiB, each of which fits in the staging
 * pool (all its chunks reserved at once: no wait for room, where an abort
 * was always seen), copied one after the other by a single capture worker without
 * helpers. While the first is being copied the trainer drops the second's
 * plan (its save aborted before its copy begins) and dies (the first aborted
 * too, if the agent sees it before that copy ends). The second copies at most
 * a chunk or two, and the agent writes no more than it copied.
 */
START_TEST(abort_stops_copies)
{
	const double half = BIG_MB / 2 * MIB;
	struct agent_proc a;
	double captured, written;
	unsigned port;
	char args[160];

	snprintf(args, sizeof(args),
	         "--staging-mb %d --chunk-mb 1 --capture-threads 1 --copy-threads 0 "
	         "--queue-depth 1 --no-lock",
	         BIG_MB + 64);
	start_with_metrics(&a, &port, args);
	ck_assert_int_eq(
	    h_reap(h_spawn_trainer("test_abort", &a, "doomed", 1, BIG_MB / 2, "two-die")),
	    128 + SIGKILL);
	ck_assert_msg(metric_reaches(port, "ckptd_saves_in_flight", 0, false, 120000),
	              "the dead trainer's saves did not end");
	ck_assert(h_metric(port, "ckptd_saves_total{state=\"failed\"}") >= 1);
	/* per job too: what the CkptdSavesFailing alert reads */
	ck_assert(h_metric(port, "ckptd_job_saves_total{job=\"doomed-b\",state=\"failed\"}") == 1);
	ck_assert(h_log_has(&a, "doomed-b step 1 rank 0 FAILED") &&
	          h_log_has(&a, "before its save was CAPTURED"));
	ck_assert_msg(metric_reaches(port, "ckptd_checkpoints_held", 0, false, 60000),
	              "the steps were not let go");
	captured = h_metric(port, "ckptd_captured_bytes_total");
	written = h_metric(port, "ckptd_written_bytes_total");
	fprintf(stderr, "abort_stops_copies: %.1f MiB copied of the two saves' %d, %.1f written\n",
	        captured / MIB, BIG_MB, written / MIB);
	ck_assert_msg(captured <= half + 2 * MIB,
	              "%g MiB copied of the two saves' %d: the copies went on after the abort",
	              captured / MIB, BIG_MB);
	ck_assert_msg(written <= captured, "%g MiB written, %g MiB copied", written / MIB,
	              captured / MIB);
	ck_assert(h_metric(port, "ckptd_pool_used_bytes") == 0);
	/* the next trainer's save of the job commits */
	ck_assert_int_eq(h_reap(h_spawn_trainer("test_abort", &a, "doomed-b", 2, 8, "commit")), 0);
	h_agent_cleanup(&a);
}
END_TEST

/*
 * A step of a world of 2 on this node where rank 1 never saves: it fails at
 * the commit deadline, and is let go of (with its save) instead of being
 * held for a rank 1 that never comes; the next step, saved by both, commits.
 */
START_TEST(failed_step_let_go)
{
	int64_t shape[1] = {100003};
	char name[2][16];
	struct ckpt_tensor t[2];
	struct agent_proc a;
	struct ckpt_client *c;
	struct ckpt_plan *p[2];
	struct ckpt_save *s[2];
	unsigned port;
	void *mem;

	start_with_metrics(&a, &port, "--staging-mb 64 --chunk-mb 1 --commit-deadline 2");
	ck_assert_int_eq(ckpt_connect(a.endpoint, &c), 0);
	ck_assert_int_eq(ckpt_host_alloc(c, 2 * (size_t)shape[0], &mem), 0);
	for (int r = 0; r < 2; r++) {
		snprintf(name[r], sizeof(name[r]), "rank%d.w", r);
		t[r] = (struct ckpt_tensor){name[r], CKPT_U8, 1, shape, (char *)mem + r * shape[0],
		                            NULL,    NULL};
		ck_assert_msg(ckpt_plan_create(c, "half", r, 2, &t[r], 1, &p[r]) == 0, "%s",
		              ckpt_last_error(c));
	}
	ck_assert_int_eq(ckpt_save(p[0], 1, NULL, &s[0]), 0);
	ck_assert_int_eq(ckpt_save_wait(s[0], CKPT_COMMITTED, 60000), -EIO);
	ck_assert_msg(strstr(ckpt_save_reason(s[0]), "no save from rank 1"), "%s",
	              ckpt_save_reason(s[0]));
	ckpt_save_release(s[0]);
	ck_assert_msg(metric_reaches(port, "ckptd_checkpoints_held", 0, false, 30000),
	              "the failed step is still held (%g), waiting for a rank 1 that never "
	              "saves it",
	              h_metric(port, "ckptd_checkpoints_held"));
	for (int r = 0; r < 2; r++)
		ck_assert_int_eq(ckpt_save(p[r], 2, NULL, &s[r]), 0);
	for (int r = 0; r < 2; r++) {
		ck_assert_msg(ckpt_save_wait(s[r], CKPT_COMMITTED, 60000) == 0, "rank %d: %s", r,
		              ckpt_save_reason(s[r]));
		ckpt_save_release(s[r]);
	}
	ck_assert(metric_reaches(port, "ckptd_checkpoints_held", 0, false, 30000));
	for (int r = 0; r < 2; r++)
		ckpt_plan_destroy(p[r]);
	ckpt_host_free(c, mem);
	ckpt_disconnect(c);
	h_agent_cleanup(&a);
}
END_TEST

#ifdef CKPT_FAULT_INJECTION /* the stop tests need a slow disk: CKPT_FAULTS */

/* Waits up to timeout_s for the agent, told to stop, to exit; its exit code. */
static int wait_exit(struct agent_proc *a, int timeout_s)
{
	int status;

	for (int i = 0; i < timeout_s * 10; i++) {
		if (waitpid(a->pid, &status, WNOHANG) == a->pid) {
			a->pid = 0;
			return h_exit_code(status);
		}
		sleep_ms(100);
	}
	ck_abort_msg("ckptd did not exit within %d s of SIGTERM", timeout_s);
	return -1;
}

/* Polls the agent's log for needle, every millisecond, up to timeout_ms; whether it came. */
static bool log_soon(const struct agent_proc *a, const char *needle, int timeout_ms)
{
	for (int waited = 0; waited <= timeout_ms; waited++) {
		if (h_log_has(a, needle))
			return true;
		sleep_ms(1);
	}
	return false;
}

struct stopped {
	bool committed; /* the log says so, and ckptctl verify after a restart agrees */
	bool waited; /* the stop logged what it waited for after the freeze */
	bool cut; /* the save FAILED at stop_timeout with bytes left to write */
};

/*
 * A trainer's save of 1 GiB (BIG_MB), one 8 MiB write at a time, CAPTURED with some
 * of it still to write; SIGTERM, and once the stop has begun the agent is
 * frozen (SIGSTOP) for freeze_ms: a disk that stalls, its writes standing
 * still while its clock runs on.
 */
/*
 * The save's writes are made slow (a fault plan: each 8 MiB write's result
 * 50 ms late, 6.4 s for the 1 GiB), so the stop always comes while it
 * writes, however fast the disk and however loaded the machine. Under a
 * sanitizer the copy into staging is slow too (it overlaps the writes):
 * 800 ms each, 26 s for its 256 MiB, so that writes are still left at
 * CAPTURED.
 */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SLOW_WRITES "CKPT_FAULTS=io_write:slow=800:path=*/big/*:count=inf"
#else
#define SLOW_WRITES "CKPT_FAULTS=io_write:slow=50:path=*/big/*:count=inf"
#endif

static struct stopped save_then_stop(const char *more_args, long step, int freeze_ms)
{
	int64_t shape[1] = {(int64_t)BIG_MB << 20};
	struct ckpt_tensor t = {"blob", CKPT_U8, 1, shape, NULL, NULL, NULL};
	struct stopped r = {false, false, false};
	struct agent_proc a;
	struct ckpt_client *c;
	struct ckpt_plan *p;
	struct ckpt_save *s;
	char out[8192], want[128], args[160];

	/* the whole save fits in the pool: CAPTURED once copied, whatever is left to write */
	snprintf(args, sizeof(args), "--staging-mb %d --chunk-mb 8 --queue-depth 1 --no-lock %s",
	         BIG_MB + 16, more_args);
	h_agent_start_env(&a, args, SLOW_WRITES);
	ck_assert_int_eq(ckpt_connect(a.endpoint, &c), 0);
	ck_assert_int_eq(ckpt_host_alloc(c, (size_t)shape[0], &t.data), 0);
	memset(t.data, 7, (size_t)shape[0]);
	ck_assert_int_eq(ckpt_plan_create(c, "big", 0, 1, &t, 1, &p), 0);
	ck_assert_int_eq(ckpt_save(p, step, NULL, &s), 0);
	ck_assert_int_eq(ckpt_save_wait(s, CKPT_CAPTURED, 120000), 0);
	kill(a.pid, SIGTERM);
	/* a call wakes the control thread, which then sees the signal at once */
	h_raw_call(&a, "/ckpt.v1.Ckpt/Status", "", 0, out, sizeof(out));
	ck_assert_msg(log_soon(&a, "stopping: ", 30000), "the stop never began (see %s)", a.log);
	kill(a.pid, SIGSTOP);
	sleep_ms(freeze_ms);
	kill(a.pid, SIGCONT);
	ck_assert_int_eq(wait_exit(&a, 600), 0);
	snprintf(want, sizeof(want), "committed job big step %ld", step);
	r.committed = h_log_has(&a, want);
	r.waited = h_log_has(&a, "s: 1 save in flight, ");
	r.cut = h_log_has(&a, "FAILED: checkpoint big step") &&
	        h_log_has(&a, "(stop_timeout) with") && !h_log_has(&a, "with 0.0 MiB");
	ckpt_save_release(s);
	ckpt_plan_destroy(p);
	ckpt_host_free(c, t.data);
	ckpt_disconnect(c);
	h_agent_restart(&a);
	ck_assert_int_eq(h_ctl(&a, out, sizeof(out), "verify big %ld", step), r.committed ? 0 : 1);
	h_agent_cleanup(&a);
	return r;
}

/*
 * Frozen for 125 s once its stop began, the agent still writes the save to
 * the end and commits it before it exits (it said what it waited for).
 */
START_TEST(stop_commits_captured_save)
{
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
	/* the sanitizer builds check memory and races, not the clock: a shorter freeze */
	const int freeze_ms = 6000;
#else
	const int freeze_ms = 125000; /* past the 120 s a stop used to give saves */
#endif
	struct stopped r = save_then_stop("", 1, freeze_ms);

	ck_assert_msg(r.committed,
	              "the save past CAPTURED was not committed before the agent exited");
	ck_assert_msg(r.waited, "the save was written before the stop began: nothing tested");
}
END_TEST

/*
 * The same with stop_timeout = 1 and a freeze of 1.5 s: the save still
 * writing when the agent thaws is past the limit: it FAILS, logged with the
 * reason and the bytes it had left, and is not committed.
 */
START_TEST(stop_timeout_fails_save)
{
	struct stopped r = save_then_stop("--stop-timeout 1", 2, 1500);

	ck_assert_msg(!r.committed, "a save still writing at stop_timeout was committed");
	ck_assert_msg(r.cut, "the save cut short at stop is logged FAILED with what was left");
}
END_TEST
#endif

/* CKPT_ABORT_TESTS=stop: the long stop alone (its own ctest entry, run beside others) */
static const char *tests_part(void)
{
	return getenv("CKPT_ABORT_TESTS") ? getenv("CKPT_ABORT_TESTS") : "all";
}

int test_before(int argc, char **argv)
{
	if (argc == 7 && strcmp(argv[1], "--trainer") == 0)
		return trainer_main(argv[2], argv[3], atol(argv[4]), atol(argv[5]), argv[6]);
#ifndef CKPT_FAULT_INJECTION /* the slow disk the stop tests need */
	fprintf(stderr, "note: ckptd built without fault injection: the stop tests are left out\n");
	if (strcmp(tests_part(), "stop") == 0)
		return TEST_SKIP;
#endif
	return TEST_RUN;
}

Suite *test_suite(void)
{
	const char *part = tests_part();
	Suite *s;
	TCase *tc;

	s = suite_create("abort");
	tc = tcase_create("agent");
	tcase_set_timeout(tc, 400); /* a stop frozen for 125 s */
	if (strcmp(part, "stop") != 0) {
		tcase_add_test(tc, abort_stops_copies);
		tcase_add_test(tc, failed_step_let_go);
	}
#ifdef CKPT_FAULT_INJECTION /* the slow disk they need */
	if (strcmp(part, "rest") != 0)
		tcase_add_test(tc, stop_commits_captured_save);
	if (strcmp(part, "stop") != 0)
		tcase_add_test(tc, stop_timeout_fails_save);
#endif
	suite_add_tcase(s, tc);
	return s;
}
