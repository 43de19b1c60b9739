/*
 * What a trainer does right after something returned: a save sent as soon
 * as a restore returned is taken (300 times); a step whose save FAILED is
 * saved again at once; a wait with a timeout returns within about that
 * timeout even when the agent does not answer (SIGSTOP).
 */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <check.h>

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

/*
 * ckpt_restore returns, and the trainer saves at once: the save is never
 * refused because the restore still looks in progress (it is done: its
 * reply came). 300 pairs, each save taken and captured.
 */
START_TEST(save_right_after_restore)
{
	struct agent_proc a;
	struct ckpt_client *c;
	struct ckpt_plan *p;
	struct ckpt_save *s;
	struct h_model m;
	char out[4096];
	int refused = 0;

	h_agent_start(&a, "--staging-mb 64 --chunk-mb 1 --keep-last 2");
	c = h_connect(&a);
	h_model_make(&m, c, 3, 4099);
	ck_assert_int_eq(ckpt_plan_create(c, "rs", 0, 1, m.t, m.n, &p), 0);
	h_model_fill(&m, 1);
	commit(p, 1);
	/* kept whatever retention says of the 300 steps after it */
	ck_assert_int_eq(h_ctl(&a, out, sizeof(out), "pin rs 1"), 0);
	for (int i = 0; i < 300; i++) {
		int rc;

		ck_assert_msg(ckpt_restore(p, 1, NULL, NULL) == 0, "restore %d: %s", i,
		              ckpt_last_error(c));
		rc = ckpt_save(p, 100 + i, NULL, &s);
		if (rc) {
			ck_assert_msg(rc == -EBUSY, "save %d: %s", i, ckpt_last_error(c));
			refused++;
			usleep(10000); /* the restore's end, before the next one */
			continue;
		}
		ck_assert_msg(ckpt_save_wait(s, CKPT_CAPTURED, 60000) == 0, "save %d: %s", i,
		              ckpt_save_reason(s));
		ckpt_save_release(s);
	}
	ck_assert_msg(refused == 0,
	              "%d of 300 saves sent right after a restore returned were "
	              "refused as if it were still writing",
	              refused);
	ck_assert(h_model_check(&m, 1, NULL));
	ckpt_plan_destroy(p);
	h_model_free(&m);
	ckpt_disconnect(c);
	h_agent_cleanup(&a);
}
END_TEST

/* Files in dir whose name starts with prefix. */
static int count_files(const char *dir, const char *prefix)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	int n = 0;

	ck_assert_msg(d, "%s: %s", dir, strerror(errno));
	while ((e = readdir(d)))
		n += strncmp(e->d_name, prefix, strlen(prefix)) == 0;
	closedir(d);
	return n;
}

/*
 * World 2 on this node: rank 0 saves step 5, rank 1's plan is dropped
 * before it saves it, so step 5 FAILS. Rank 1 comes back, and both save
 * step 5 again at once: taken (not "already saved (FAILED)"), committed from
 * the new attempt's files; the failed attempt's file goes.
 */
START_TEST(failed_step_saved_again_at_once)
{
	int64_t shape[1] = {300007};
	struct ckpt_tensor t[2];
	char name[2][16], dir[512], out[4096];
	struct agent_proc a;
	struct ckpt_client *c;
	struct ckpt_plan *p[2];
	struct ckpt_save *s[2];
	uint8_t *mem;
	int rc;

	h_agent_start(&a, "--staging-mb 64 --chunk-mb 1");
	c = h_connect(&a);
	ck_assert_int_eq(ckpt_host_alloc(c, 2 * (size_t)shape[0], (void **)&mem), 0);
	for (int r = 0; r < 2; r++) {
		snprintf(name[r], sizeof(name[r]), "rank%d.w", r);
		t[r] = (struct ckpt_tensor){name[r], CKPT_U8, 1, shape, mem + r * shape[0],
		                            NULL,    NULL};
		ck_assert_msg(ckpt_plan_create(c, "again", r, 2, &t[r], 1, &p[r]) == 0, "%s",
		              ckpt_last_error(c));
	}
	memset(mem, 1, 2 * (size_t)shape[0]);
	ck_assert_int_eq(ckpt_save(p[0], 5, NULL, &s[0]), 0);
	ck_assert_int_eq(ckpt_save_wait(s[0], CKPT_DURABLE, 60000), 0);
	ckpt_plan_destroy(p[1]); /* rank 1 leaves before saving step 5: it fails */
	ck_assert_int_eq(ckpt_save_wait(s[0], CKPT_COMMITTED, 60000), -EIO);
	ckpt_save_release(s[0]);
	ck_assert_msg(ckpt_plan_create(c, "again", 1, 2, &t[1], 1, &p[1]) == 0, "%s",
	              ckpt_last_error(c));
	memset(mem, 2, 2 * (size_t)shape[0]);
	for (int r = 0; r < 2; r++) {
		rc = ckpt_save(p[r], 5, NULL, &s[r]);
		ck_assert_msg(rc == 0, "rank %d's save of step 5 again: %s", r, ckpt_last_error(c));
	}
	for (int r = 0; r < 2; r++) {
		ck_assert_msg(ckpt_save_wait(s[r], CKPT_COMMITTED, 60000) == 0, "rank %d: %s", r,
		              ckpt_save_reason(s[r]));
		ckpt_save_release(s[r]);
	}
	ck_assert_int_eq(h_ctl(&a, out, sizeof(out), "verify again 5"), 0);
	memset(mem, 0, 2 * (size_t)shape[0]);
	ck_assert_int_eq(ckpt_restore(p[0], 5, NULL, NULL), 0);
	ck_assert_int_eq(mem[0], 2); /* the new attempt's bytes */
	/* one shard of each rank left: the failed attempt's is removed */
	h_path(&a, dir, sizeof(dir), "again/step-%012d", 5);
	for (int i = 0; i < 100 && count_files(dir, "rank-00000.") > 1; i++)
		usleep(50000);
	ck_assert_int_eq(count_files(dir, "rank-00000."), 1);
	ck_assert_int_eq(count_files(dir, "rank-00001."), 1);
	for (int r = 0; r < 2; r++)
		ckpt_plan_destroy(p[r]);
	ckpt_host_free(c, mem);
	ckpt_disconnect(c);
	h_agent_cleanup(&a);
}
END_TEST

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/*
 * The agent SIGSTOPped under a save in flight: a wait of T = 2 s returns
 * -ETIMEDOUT within 3 T, and the trainer giving up (its plan and memory
 * freed) is not held a minute per call on its way out: at most one tidy-up
 * call's 5 s, the others not sent to an agent that does not answer. (Bounds
 * on behaviour, far from the time it takes: minutes before.)
 */
START_TEST(waits_bounded_when_agent_stopped)
{
	const int T = 2000;
	struct agent_proc a;
	struct ckpt_client *c;
	struct ckpt_plan *p;
	struct ckpt_save *s;
	struct h_model m;
	double t0, took;
	int rc;

	h_agent_start(&a, "--staging-mb 16 --chunk-mb 1 --queue-depth 1");
	c = h_connect(&a);
	h_model_make(&m, c, 4, 64 << 20); /* 256 MiB through a 16 MiB pool */
	ck_assert_int_eq(ckpt_plan_create(c, "stalled", 0, 1, m.t, m.n, &p), 0);
	ck_assert_int_eq(ckpt_save(p, 1, NULL, &s), 0);
	ck_assert_int_eq(kill(a.pid, SIGSTOP), 0);
	t0 = now_s();
	rc = ckpt_save_wait(s, CKPT_COMMITTED, T);
	took = now_s() - t0;
	ck_assert_msg(rc == -ETIMEDOUT, "wait: %d (%s)", rc, ckpt_save_reason(s));
	ck_assert_msg(took < 3 * T / 1000.0, "a wait of %d ms returned after %.1f s", T, took);
	/* the trainer gives up */
	t0 = now_s();
	ckpt_save_release(s);
	ckpt_plan_destroy(p);
	h_model_free(&m);
	took = now_s() - t0;
	ck_assert_msg(took < 10, "giving up took %.1f s with the agent stopped", took);
	ck_assert_int_eq(kill(a.pid, SIGCONT), 0);
	ckpt_disconnect(c);
	/*
	 * The agent learns of the old trainer's end on its own connection, in its
	 * own time (the plan the trainer gave up is its until then): the new
	 * trainer of the same job and rank comes once it has.
	 */
	for (int i = 0; i < 300 && !h_log_has(&a, "left:"); i++)
		usleep(100000);
	ck_assert_msg(h_log_has(&a, "left:"), "the agent did not see the old trainer leave");
	/* the agent goes on: a new trainer commits */
	c = h_connect(&a);
	h_model_make(&m, c, 2, 4099);
	ck_assert_int_eq(ckpt_plan_create(c, "stalled", 0, 1, m.t, m.n, &p), 0);
	commit(p, 2);
	ckpt_plan_destroy(p);
	h_model_free(&m);
	ckpt_disconnect(c);
	h_agent_cleanup(&a);
}
END_TEST

Suite *test_suite(void)
{
	Suite *s = suite_create("retry");
	TCase *tc = tcase_create("agent");

	tcase_set_timeout(tc, 300);
	tcase_add_test(tc, save_right_after_restore);
	tcase_add_test(tc, failed_step_saved_again_at_once);
	tcase_add_test(tc, waits_bounded_when_agent_stopped);
	suite_add_tcase(s, tc);
	return s;
}
