/*
 * A crash loop: three agents (nodes n0..n2) on one shared root, a job of
 * world 6 (two ranks per node, this process's clients), one save after
 * another; after each, a random agent is SIGKILLed at a random moment and
 * started again, its ranks reconnecting. At least 100 kills
 * (CKPT_CRASH_KILLS=N for more). Then every agent is up and one more step
 * must commit; and in the root: every checkpoint that is visible (has a
 * manifest) verifies byte for byte, LATEST names the newest, and every rank
 * restores it exactly. Nothing partial or torn may be visible, ever.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <check.h>
#include <jansson.h>

#include "tests/integration/harness.h"
#include "support/check_main.h"

#define NODES 3
#define WORLD 6
#define ELEMS 16384 /* floats per rank: 64 KiB */

struct rank {
	int r;
	struct ckpt_client *c;
	struct ckpt_plan *p;
	float *mem;
};

static char dir[256], root[300];
static struct agent_proc ag[NODES];
static struct rank rk[WORLD];

static float value(long step, int rank, int i)
{
	return (float)((step * 31 + rank * 7 + i) % 65521);
}

static int node_of(int r)
{
	return r % NODES;
}

/* Connects rank r to its node's agent and makes its plan; false if the agent is not there. */
static bool join(struct rank *k)
{
	int64_t gshape[1] = {(int64_t)WORLD * ELEMS}, lshape[1] = {ELEMS},
	        goff[1] = {(int64_t)k->r * ELEMS};
	struct ckpt_plan_opts o = CKPT_PLAN_OPTS_INIT;
	struct ckpt_tensor t;

	if (ckpt_connect(ag[node_of(k->r)].endpoint, &k->c))
		return false;
	if (ckpt_host_alloc(k->c, ELEMS * sizeof(float), (void **)&k->mem))
		goto fail;
	t = (struct ckpt_tensor){"w", CKPT_F32, 1, lshape, k->mem, gshape, goff};
	o.run = "loop";
	if (ckpt_plan_create_opts(k->c, "crash", k->r, WORLD, &t, 1, &o, &k->p))
		goto fail;
	return true;
fail:
	ckpt_disconnect(k->c);
	k->c = NULL;
	return false;
}

static void leave(struct rank *k)
{
	if (k->c)
		ckpt_disconnect(k->c); /* its agent is gone: nothing left to release there */
	ckpt_plan_destroy(k->p); /* what is left of it here */
	k->c = NULL;
	k->p = NULL;
}

/* Every rank saves `step` (those whose agent is down skip it); waits for CAPTURED. */
static unsigned save_step(long step, struct ckpt_save **out)
{
	char meta[48];
	unsigned n = 0;

	for (int r = 0; r < WORLD; r++) {
		struct rank *k = &rk[r];

		out[r] = NULL;
		if (!k->c && !join(k))
			continue;
		for (int i = 0; i < ELEMS; i++)
			k->mem[i] = value(step, r, i);
		snprintf(meta, sizeof(meta), "{\"step\": %ld}", step);
		if (ckpt_save(k->p, step, meta, &out[r])) {
			leave(k);
			continue;
		}
		n++;
	}
	return n;
}

static void sleep_ms(long ms)
{
	struct timespec ts = {ms / 1000, (ms % 1000) * 1000000};

	nanosleep(&ts, NULL);
}

/* The steps with a manifest in the root, ascending (the visible checkpoints). */
static size_t visible(long *v, size_t max)
{
	char p[400];
	struct dirent *de;
	size_t n = 0;
	DIR *d;

	snprintf(p, sizeof(p), "%s/crash", root);
	d = opendir(p);
	ck_assert_ptr_nonnull(d);
	while ((de = readdir(d)) && n < max) {
		char m[700];
		long step;

		if (sscanf(de->d_name, "step-%ld", &step) != 1 || strlen(de->d_name) != 17)
			continue;
		snprintf(m, sizeof(m), "%s/%s/manifest.json", p, de->d_name);
		if (access(m, F_OK) == 0)
			v[n++] = step;
	}
	closedir(d);
	for (size_t i = 1; i < n; i++)
		for (size_t j = i; j > 0 && v[j - 1] > v[j]; j--) {
			long t = v[j];

			v[j] = v[j - 1];
			v[j - 1] = t;
		}
	return n;
}

START_TEST(crash_loop)
{
	const char *tmp = getenv("CK_TMPDIR") ? getenv("CK_TMPDIR") : "/tmp";
	long kills = getenv("CKPT_CRASH_KILLS") ? atol(getenv("CKPT_CRASH_KILLS")) : 100;
	struct ckpt_save *s[WORLD];
	static long steps[100000];
	char out[65536], cmd[400];
	long step = 0, final;
	size_t n;
	FILE *f;

	srand((unsigned)time(NULL));
	snprintf(dir, sizeof(dir), "%s/ckcr.XXXXXX", tmp);
	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(root, sizeof(root), "%s/shared", dir);
	for (int i = 0; i < NODES; i++) {
		char node[8];

		snprintf(node, sizeof(node), "n%d", i);
		h_agent_start_node(&ag[i], root, node,
		                   "--staging-mb 16 --chunk-mb 1 --commit-deadline 2 "
		                   "--abandon-after 4");
	}
	for (int r = 0; r < WORLD; r++)
		rk[r].r = r;
	for (long k = 0; k < kills; k++) {
		int victim = rand() % NODES;

		save_step(++step, s);
		sleep_ms(rand() % 25); /* somewhere in capture, write, part or commit */
		h_agent_kill(&ag[victim]);
		for (int r = 0; r < WORLD; r++) {
			if (s[r])
				ckpt_save_release(s[r]);
			if (node_of(r) == victim)
				leave(&rk[r]);
		}
		h_agent_restart(&ag[victim]);
	}
	/*
	 * Every agent up: a step commits. The node restarted last may still be
	 * starting (its start-up scan of the root, its run's first save waiting
	 * up to half the 2 s deadline for the plan set), and under load its
	 * part may come after the deadline: that step FAILS and leaves nothing
	 * visible (checked below). The one after it must commit.
	 */
	for (int tries = 0;; tries++) {
		char why[512] = "";
		int failed = -1;

		final = ++step;
		ck_assert_uint_eq(save_step(final, s), WORLD);
		for (int r = 0; r < WORLD; r++) {
			if (ckpt_save_wait(s[r], CKPT_COMMITTED, 60000) != 0 && failed < 0) {
				failed = r;
				snprintf(why, sizeof(why), "%s", ckpt_save_reason(s[r]));
			}
			ckpt_save_release(s[r]);
		}
		if (failed < 0)
			break;
		ck_assert_msg(tries == 0, "step %ld rank %d after the crash loop: %s", final,
		              failed, why);
		fprintf(stderr, "crash loop: step %ld failed (%s); the next must commit\n", final,
		        why);
	}
	/* what is visible verifies, every byte */
	n = visible(steps, sizeof(steps) / sizeof(steps[0]));
	ck_assert_uint_ge(n, 1);
	ck_assert_int_eq(steps[n - 1], final);
	for (size_t i = 0; i < n; i++)
		ck_assert_msg(
		    h_ctl(&ag[i % NODES], out, sizeof(out), "verify crash %ld", steps[i]) == 0,
		    "visible step %ld does not verify: %s", steps[i], out);
	snprintf(cmd, sizeof(cmd), "%s/crash/LATEST", root);
	f = fopen(cmd, "r");
	ck_assert_ptr_nonnull(f);
	ck_assert(fgets(cmd, sizeof(cmd), f));
	fclose(f);
	ck_assert_int_eq(atol(cmd), final);
	/* every rank restores it exactly */
	for (int r = 0; r < WORLD; r++) {
		int64_t got = -1;

		leave(&rk[r]);
		ck_assert(join(&rk[r]));
		memset(rk[r].mem, 0, ELEMS * sizeof(float));
		ck_assert_int_eq(ckpt_restore(rk[r].p, CKPT_LATEST, &got, NULL), 0);
		ck_assert_int_eq(got, final);
		for (int i = 0; i < ELEMS; i++)
			ck_assert(rk[r].mem[i] == value(final, r, i));
		leave(&rk[r]);
	}
	fprintf(stderr, "crash loop: %ld kills, %zu of %ld steps committed\n", kills, n, final);
	for (int i = 0; i < NODES; i++)
		h_agent_cleanup(&ag[i]);
	if (!getenv("CKPT_TEST_KEEP")) {
		snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
		ck_assert_int_eq(system(cmd), 0);
	}
}
END_TEST

int test_before(int argc, char **argv)
{
	(void)argc;
	(void)argv;
	signal(SIGPIPE, SIG_IGN);
	return TEST_RUN;
}

Suite *test_suite(void)
{
	Suite *s = suite_create("crashloop");
	TCase *tc = tcase_create("crashloop");

	tcase_set_timeout(tc, 3000);
	tcase_add_test(tc, crash_loop);
	suite_add_tcase(s, tc);
	return s;
}
