/*
 * A live agent is never taken for gone. A trainer saving back to back
 * beside CPU hogs (the agent and the trainer below them in priority) while
 * the agent and the trainer are stalled in turn (SIGSTOP, SIGCONT: a
 * machine that stops answering for seconds) sees every save commit and its
 * session never end: libckpt never says "attaching again", and the agent
 * saw one attach. A session that ends while the agent still runs (it is
 * stopping, a save past CAPTURED still writing) is said to have ended so,
 * never that the agent went away.
 */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <check.h>

#include "tests/integration/harness.h"
#include "support/check_main.h"

#define JOB "stall"
#define SAVE_MB 8
#define PAUSES 4
#define PAUSE_MS 3000
/* The agent and the trainer run this far below the hogs (nice). */
#define LOWER 10

static void sleep_ms(long ms)
{
	struct timespec ts = {ms / 1000, (ms % 1000) * 1000000};

	nanosleep(&ts, NULL);
}

/* ---- the trainer, in a process of its own ---------------------------------- */

/* Whether the test closed our stdin: time to stop saving. */
static bool told_to_stop(void)
{
	struct pollfd p = {.fd = 0, .events = POLLIN};
	char b;

	return poll(&p, 1, 0) > 0 && read(0, &b, 1) <= 0;
}

/* Saves step after step, each waited for until COMMITTED; prints how many. */
static int trainer_main(const char *endpoint)
{
	int64_t shape[1] = {SAVE_MB << 20};
	struct ckpt_tensor t = {"w", CKPT_U8, 1, shape, NULL, NULL, NULL};
	struct ckpt_client *c;
	struct ckpt_plan *p;
	struct ckpt_save *s;
	long long step;

	/* below the hogs, with every thread it starts (gRPC's, the session's) */
	if (setpriority(PRIO_PROCESS, 0, LOWER))
		return fprintf(stderr, "trainer: setpriority: %s\n", strerror(errno)), 9;
	if (ckpt_connect(endpoint, &c))
		return 10;
	if (ckpt_host_alloc(c, (size_t)shape[0], &t.data) ||
	    ckpt_plan_create(c, JOB, 0, 1, &t, 1, &p))
		return fprintf(stderr, "trainer: %s\n", ckpt_last_error(c)), 11;
	for (step = 1; !told_to_stop(); step++) {
		memset(t.data, (int)step, (size_t)shape[0]);
		if (ckpt_save(p, step, NULL, &s))
			return fprintf(stderr, "trainer: save of step %lld: %s\n", step,
			               ckpt_last_error(c)),
			       12;
		if (ckpt_save_wait(s, CKPT_COMMITTED, 300000))
			return fprintf(stderr, "trainer: step %lld: %s\n", step,
			               ckpt_save_reason(s)),
			       13;
		ckpt_save_release(s);
	}
	printf("%lld\n", step - 1);
	ckpt_plan_destroy(p);
	ckpt_host_free(c, t.data);
	ckpt_disconnect(c);
	return 0;
}

/* The trainer: stdin the pipe whose end stops it, stdout into *out, stderr into err_path. */
static pid_t trainer(const struct agent_proc *a, const char *err_path, int *stop, int *out)
{
	int in[2], o[2];
	pid_t pid;

	ck_assert(pipe(in) == 0 && pipe(o) == 0);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		int e = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);

		if (e < 0 || dup2(in[0], 0) < 0 || dup2(o[1], 1) < 0 || dup2(e, 2) < 0)
			_exit(126);
		close(in[1]);
		close(o[0]);
		execl("/proc/self/exe", "test_stall", "--trainer", a->endpoint, (char *)NULL);
		_exit(127);
	}
	close(in[0]);
	close(o[1]);
	*stop = in[1];
	*out = o[0];
	return pid;
}

/* ---- load --------------------------------------------------------------- */

/* Every thread of pid below the hogs (nice is per thread on Linux). */
static void lower(pid_t pid)
{
	char path[64];
	struct dirent *e;
	DIR *d;

	snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
	d = opendir(path);
	ck_assert_msg(d, "%s: %s", path, strerror(errno));
	while ((e = readdir(d)))
		if (e->d_name[0] != '.')
			ck_assert_msg(setpriority(PRIO_PROCESS, (id_t)atoi(e->d_name), LOWER) == 0,
			              "setpriority of thread %s of %d: %s", e->d_name, (int)pid,
			              strerror(errno));
	closedir(d);
}

/* A process spinning on a core until killed (or its parent goes, or 5 minutes pass). */
static pid_t hog(void)
{
	pid_t parent = getpid(), pid = fork();

	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		time_t end = time(NULL) + 300;

		prctl(PR_SET_PDEATHSIG, SIGKILL);
		for (int fd = 3; fd < 1024; fd++) /* the trainer's stdin pipe among them */
			close(fd);
		while (getppid() == parent && time(NULL) < end)
			;
		_exit(0);
	}
	return pid;
}

/* How many times needle is in the agent's log. */
static int log_count(const struct agent_proc *a, const char *needle)
{
	static char buf[1 << 20];
	int fd = open(a->log, O_RDONLY), n = 0;

	ck_assert_msg(fd >= 0, "%s: %s", a->log, strerror(errno));
	h_read_all(fd, buf, sizeof(buf));
	for (const char *at = buf; (at = strstr(at, needle)); at += strlen(needle))
		n++;
	return n;
}

/* ---- the tests ------------------------------------------------------------ */

/*
 * Two hogs a core, the agent and the trainer at nice 10, each save's
 * writes slow (100 ms a 1 MiB chunk: a save is always in flight), and the
 * agent and the trainer frozen in turn, PAUSES times for PAUSE_MS, while
 * the trainer saves: neither side's gRPC may give the other up.
 */
START_TEST(live_agent_under_load)
{
	long ncores = sysconf(_SC_NPROCESSORS_ONLN);
	pid_t hogs[64], tr;
	int nhogs = 0, stop, out;
	char err_path[400], err[8192], saved[64];
	struct agent_proc a;

	h_agent_start_env(&a, "--staging-mb 32 --chunk-mb 1",
	                  "CKPT_FAULTS=io_write:slow=100:path=*/" JOB "/*:count=inf");
	lower(a.pid);
	snprintf(err_path, sizeof(err_path), "%s/trainer.err", a.dir);
	tr = trainer(&a, err_path, &stop, &out);
	for (long i = 0; i < 2 * (ncores > 0 ? ncores : 1) && nhogs < 64; i++)
		hogs[nhogs++] = hog();
	for (int i = 0; i < 600 && !h_log_has(&a, "plan for job " JOB); i++)
		sleep_ms(100);
	ck_assert_msg(h_log_has(&a, "plan for job " JOB), "the trainer never planned (see %s)",
	              err_path);
	for (int i = 0; i < PAUSES; i++) { /* the agent, then the trainer, stalled in turn */
		pid_t who = i % 2 ? tr : a.pid;

		sleep_ms(1000);
		kill(who, SIGSTOP);
		sleep_ms(PAUSE_MS);
		kill(who, SIGCONT);
	}
	close(stop); /* the trainer ends after the save it is waiting for */
	h_read_all(out, saved, sizeof(saved));
	ck_assert_int_eq(h_reap(tr), 0);
	for (int i = 0; i < nhogs; i++) {
		kill(hogs[i], SIGKILL);
		waitpid(hogs[i], NULL, 0);
	}
	h_read_all(open(err_path, O_RDONLY), err, sizeof(err));
	saved[strcspn(saved, "\n")] = '\0';
	fprintf(stderr, "live_agent_under_load: %s saves committed\n", saved);
	ck_assert_msg(atoi(saved) >= 1, "no save committed");
	/* libckpt says nothing unless something went wrong ("attaching again", ...) */
	ck_assert_msg(!strstr(err, "libckpt:"), "libckpt took a live agent for gone: %s", err);
	ck_assert_int_eq(log_count(&a, ") attached"), 1);
	h_agent_cleanup(&a);
}
END_TEST

/*
 * Stopping, an agent ends the session of a trainer whose save is CAPTURED
 * and still writing (a minute a chunk: the agent surely still runs): the
 * save fails saying the session ended while the agent still runs, never
 * that it went away.
 */
START_TEST(stopping_agent_is_not_gone)
{
	int64_t shape[1] = {2 << 20};
	struct ckpt_tensor t = {"w", CKPT_U8, 1, shape, NULL, NULL, NULL};
	struct agent_proc a;
	struct ckpt_client *c;
	struct ckpt_plan *p;
	struct ckpt_save *s;
	char msg[256];

	h_agent_start_env(&a, "--staging-mb 32 --chunk-mb 1",
	                  "CKPT_FAULTS=io_write:slow=60000:path=*/" JOB "/*:count=inf");
	c = h_connect(&a);
	ck_assert_int_eq(ckpt_host_alloc(c, (size_t)shape[0], &t.data), 0);
	ck_assert_int_eq(ckpt_plan_create(c, JOB, 0, 1, &t, 1, &p), 0);
	ck_assert_int_eq(ckpt_save(p, 1, NULL, &s), 0);
	ck_assert_int_eq(ckpt_save_wait(s, CKPT_CAPTURED, 60000), 0);
	kill(a.pid, SIGTERM);
	/* a call wakes the control thread, which then sees the signal at once */
	h_raw_call(&a, "/ckpt.v1.Ckpt/Status", "", 0, msg, sizeof(msg));
	ck_assert_int_eq(ckpt_save_wait(s, CKPT_COMMITTED, 60000), -EIO);
	ck_assert_msg(strstr(ckpt_save_reason(s), "the session with ckptd") &&
	                  strstr(ckpt_save_reason(s), "still runs") &&
	                  !strstr(ckpt_save_reason(s), "went away"),
	              "%s", ckpt_save_reason(s));
	ckpt_save_release(s);
	h_agent_kill(&a); /* not the minute a chunk its stop would wait */
	ckpt_plan_destroy(p);
	ckpt_host_free(c, t.data);
	ckpt_disconnect(c);
	h_agent_cleanup(&a);
}
END_TEST

int test_before(int argc, char **argv)
{
	if (argc == 3 && strcmp(argv[1], "--trainer") == 0)
		return trainer_main(argv[2]);
#ifndef CKPT_FAULT_INJECTION
	fprintf(stderr, "ckptd built without fault injection: no slow writes, nothing tested\n");
	return TEST_SKIP;
#endif
	return TEST_RUN;
}

Suite *test_suite(void)
{
	Suite *s;
	TCase *tc;

	s = suite_create("stall");
	tc = tcase_create("agent");
	tcase_set_timeout(tc, 300);
	tcase_add_test(tc, live_agent_under_load);
	tcase_add_test(tc, stopping_agent_is_not_gone);
	suite_add_tcase(s, tc);
	return s;
}
