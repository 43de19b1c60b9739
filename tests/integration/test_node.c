/*
 * One node at full size: eight ranks whose step is several times the staging
 * pool, saved side by side (with block and with skip) and restored all at
 * once; and skip refusing a save only when other checkpoints hold the pool.
 *
 * Ranks are threads, each with its own client (as trainer processes would
 * be). The pool is 32 chunks of 1 MiB; each rank's shard is about 36 MiB,
 * larger than the whole pool, so the step is nine times the pool and every
 * rank streams.
 */
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <check.h>

#include "harness.h"

#define RANKS 8
#define POOL "--staging-mb 32 --chunk-mb 1"
#define SCALE (5u << 20) /* bytes per tensor, about: 8 tensors (one empty) ~ 36 MiB */

struct rank {
	const struct agent_proc *a;
	const char *job;
	int id;
	enum ckpt_backpressure backpressure;
	long steps;
	pthread_barrier_t *bar;
	int shards_at_durable; /* the step's shard files made when its first step was DURABLE */
	char err[512];
};

/* Shard files in the step's directory now. */
static int count_shards(const struct agent_proc *a, const char *job, long step)
{
	char dir[512];
	struct dirent *d;
	DIR *dp;
	int n = 0;

	h_path(a, dir, sizeof(dir), "%s/step-%012ld", job, step);
	dp = opendir(dir);
	if (!dp)
		return -1;
	while ((d = readdir(dp)))
		n += strncmp(d->d_name, "rank-", 5) == 0;
	closedir(dp);
	return n;
}

static void *rank_main(void *arg)
{
	struct rank *r = arg;
	struct ckpt_plan_opts o = {.size = sizeof(o), .backpressure = r->backpressure};
	struct ckpt_client *c = h_connect(r->a);
	struct ckpt_plan *p;
	struct h_model m;
	int waits = 0; /* barriers passed: every rank passes steps + 1 of them, whatever happens */
	size_t bad;

	h_model_make(&m, c, 8, SCALE);
	for (size_t i = 0; i < m.n; i++) /* each rank's tensors its own */
		snprintf(m.name[i], sizeof(m.name[i]), "rank%d.layer%02zu", r->id, i);
	if (ckpt_plan_create_opts(c, r->job, r->id, RANKS, m.t, m.n, &o, &p)) {
		snprintf(r->err, sizeof(r->err), "plan: %s", ckpt_last_error(c));
		goto out;
	}
	for (long step = 1; step <= r->steps && !r->err[0]; step++) {
		struct ckpt_save *s;
		int rc;

		h_model_fill(&m, (uint64_t)(step * 100 + r->id));
		pthread_barrier_wait(r->bar); /* every rank saves at once */
		waits++;
		if (ckpt_save(p, step, NULL, &s)) {
			snprintf(r->err, sizeof(r->err), "step %ld: save: %s", step,
			         ckpt_last_error(c));
			break;
		}
		if (step == 1) {
			rc = ckpt_save_wait(s, CKPT_DURABLE, 120000);
			r->shards_at_durable = count_shards(r->a, r->job, step);
		}
		rc = ckpt_save_wait(s, CKPT_COMMITTED, 120000);
		if (rc)
			snprintf(r->err, sizeof(r->err), "step %ld: %s: %s", step,
			         ckpt_state_name(ckpt_save_state(s)), ckpt_save_reason(s));
		ckpt_save_release(s);
	}
	/* All at once: the last step back into memory that holds something else. */
	h_model_fill(&m, 7);
	pthread_barrier_wait(r->bar);
	waits++;
	if (!r->err[0]) {
		int64_t got = -1;
		char *meta = NULL;

		if (ckpt_restore(p, r->steps, &got, &meta))
			snprintf(r->err, sizeof(r->err), "restore: %s", ckpt_last_error(c));
		else if (got != r->steps)
			snprintf(r->err, sizeof(r->err), "restore gave step %lld", (long long)got);
		else if (!h_model_check(&m, (uint64_t)(r->steps * 100 + r->id), &bad))
			snprintf(r->err, sizeof(r->err), "restored tensor %zu differs", bad);
		free(meta);
	}
	ckpt_plan_destroy(p);
out:
	for (; waits < r->steps + 1; waits++)
		pthread_barrier_wait(r->bar);
	h_model_free(&m);
	ckpt_disconnect(c);
	return NULL;
}

static void run_ranks(struct rank *rk, const struct agent_proc *a, const char *job,
                      enum ckpt_backpressure bp, long steps)
{
	pthread_barrier_t bar;
	pthread_t th[RANKS];

	pthread_barrier_init(&bar, NULL, RANKS);
	for (int i = 0; i < RANKS; i++) {
		rk[i] = (struct rank){
		    .a = a, .job = job, .id = i, .backpressure = bp, .steps = steps, .bar = &bar};
		ck_assert_int_eq(pthread_create(&th[i], NULL, rank_main, &rk[i]), 0);
	}
	for (int i = 0; i < RANKS; i++)
		pthread_join(th[i], NULL);
	pthread_barrier_destroy(&bar);
}

#ifdef CKPT_FAULT_INJECTION /* the slow disk: CKPT_FAULTS */
/*
 * Block: every rank streams at once. Writes are slowed so that no shard is
 * durable before every rank has started: the first rank to be DURABLE finds
 * all eight shard files made (saves that each took the whole pool, one
 * after another, would not have made theirs yet). Every step
 * commits, and the eight restores at once give every byte back.
 */
START_TEST(eight_ranks_block)
{
	struct agent_proc a;
	struct rank rk[RANKS];

	h_agent_start_env(&a, POOL " --backpressure block",
	                  "CKPT_FAULTS=io_write:slow=20:path=*/nb/step-000000000001/*:count=inf");
	run_ranks(rk, &a, "nb", CKPT_BP_BLOCK, 2);
	for (int i = 0; i < RANKS; i++)
		ck_assert_msg(!rk[i].err[0], "rank %d: %s", i, rk[i].err);
	for (int i = 0; i < RANKS; i++)
		ck_assert_msg(rk[i].shards_at_durable >= 6,
		              "rank %d was DURABLE with only %d shard files of the step made: the "
		              "ranks did not stream side by side",
		              i, rk[i].shards_at_durable);
	ck_assert(h_wait_state(&a, "nb", 2, "COMMITTED", 10000));
	h_agent_cleanup(&a);
}
END_TEST
#endif

/* Skip: ranks of one step never skip each other, however large the step. */
START_TEST(eight_ranks_skip)
{
	struct agent_proc a;
	struct rank rk[RANKS];

	h_agent_start(&a, POOL " --backpressure skip");
	run_ranks(rk, &a, "ns", CKPT_BP_SKIP, 3);
	for (int i = 0; i < RANKS; i++)
		ck_assert_msg(!rk[i].err[0], "rank %d: %s", i, rk[i].err);
	for (long step = 1; step <= 3; step++)
		ck_assert(h_wait_state(&a, "ns", step, "COMMITTED", 10000));
	h_agent_cleanup(&a);
}
END_TEST

#ifdef CKPT_FAULT_INJECTION
/* The pool's chunks holding data now, from `ckptctl status --json`; -1 if unknown. */
static long long pool_used(const struct agent_proc *a)
{
	char out[8192], *p;

	if (h_ctl(a, out, sizeof(out), "--json status") != 0)
		return -1;
	p = strstr(out, "\"used_bytes\"");
	return p ? strtoll(strchr(p, ':') + 1, NULL, 10) : -1;
}

struct big {
	struct agent_proc *a;
	struct rank rk[RANKS];
};

static void *big_main(void *arg)
{
	struct big *b = arg;

	run_ranks(b->rk, b->a, "big", CKPT_BP_SKIP, 1);
	return NULL;
}

/*
 * Skip refuses a save only when other checkpoints hold the pool: while a
 * large step of another job streams through all of it (one slow write at a
 * time), a small job's save is SKIPPED with the reason; once that step has
 * committed, the small job saves again and commits.
 */
START_TEST(skip_only_when_it_must)
{
	struct agent_proc a;
	struct big b = {.a = &a};
	struct ckpt_plan_opts o = {.size = sizeof(o), .backpressure = CKPT_BP_SKIP};
	struct ckpt_client *c;
	struct ckpt_plan *p;
	struct ckpt_save *s;
	struct h_model m;
	pthread_t th;
	long long used = -1;
	int rc;

	h_agent_start_env(&a, POOL " --queue-depth 1 --backpressure skip",
	                  "CKPT_FAULTS=io_write:slow=40:path=*/big/*:count=inf");
	c = h_connect(&a);
	h_model_make(&m, c, 4, 2u << 20); /* about 6 MiB */
	ck_assert_int_eq(ckpt_plan_create_opts(c, "small", 0, 1, m.t, m.n, &o, &p), 0);
	ck_assert_int_eq(pthread_create(&th, NULL, big_main, &b), 0);
	for (int i = 0; i < 2000 && used < (31ll << 20); i++) {
		used = pool_used(&a);
		usleep(5000);
	}
	ck_assert_msg(used >= 31ll << 20, "the large step never filled the pool (%lld bytes)",
	              used);
	ck_assert_int_eq(ckpt_save(p, 1, NULL, &s), 0);
	rc = ckpt_save_wait(s, CKPT_COMMITTED, 60000);
	ck_assert_msg(rc == -ECANCELED && ckpt_save_state(s) == CKPT_SKIPPED,
	              "a save while another job holds the pool: %d, %s: %s", rc,
	              ckpt_state_name(ckpt_save_state(s)), ckpt_save_reason(s));
	ck_assert_msg(strstr(ckpt_save_reason(s), "staging pool full"), "%s", ckpt_save_reason(s));
	ckpt_save_release(s);
	pthread_join(th, NULL);
	for (int i = 0; i < RANKS; i++)
		ck_assert_msg(!b.rk[i].err[0], "big rank %d: %s", i, b.rk[i].err);
	ck_assert_int_eq(ckpt_save(p, 2, NULL, &s), 0);
	rc = ckpt_save_wait(s, CKPT_COMMITTED, 60000);
	ck_assert_msg(rc == 0, "with the pool free again: %s", ckpt_save_reason(s));
	ckpt_save_release(s);
	ckpt_plan_destroy(p);
	h_model_free(&m);
	ckpt_disconnect(c);
	h_agent_cleanup(&a);
}
END_TEST
#endif

int main(void)
{
	Suite *s = suite_create("node");
	TCase *tc = tcase_create("agent");
	SRunner *sr;
	int failed;

	tcase_set_timeout(tc, 300);
#ifdef CKPT_FAULT_INJECTION /* the slow disk: CKPT_FAULTS */
	tcase_add_test(tc, eight_ranks_block);
	tcase_add_test(tc, skip_only_when_it_must);
#endif
	tcase_add_test(tc, eight_ranks_skip);
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
