/*
 * Save and restore through a real agent: odd sizes and every dtype, the
 * trainer rewriting its tensors right after CAPTURED, a save larger than the
 * staging pool, 4 ranks of one job (run from a path longer than 64 bytes:
 * the log names them by their program all the same), and LATEST after the
 * agent restarts.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <check.h>
#include <jansson.h>

#include "tests/integration/harness.h"
#include "support/check_main.h"

static void save_and_wait(struct ckpt_plan *p, int64_t step, const char *meta,
                          enum ckpt_state until)
{
	struct ckpt_save *s;
	int rc = ckpt_save(p, step, meta, &s);

	ck_assert_msg(rc == 0, "save %lld: %s", (long long)step, ckpt_strerror(rc));
	rc = ckpt_save_wait(s, until, 60000);
	ck_assert_msg(rc == 0, "save %lld to %s: %s (%s)", (long long)step, ckpt_state_name(until),
	              ckpt_strerror(rc), ckpt_save_reason(s));
	ckpt_save_release(s);
}

START_TEST(roundtrip_odd_sizes)
{
	struct agent_proc a;
	struct ckpt_client *c;
	struct ckpt_plan *p;
	struct h_model m;
	int64_t step = -1;
	char *meta = NULL;
	size_t bad = 0;
	int rc;

	h_agent_start(&a, NULL);
	c = h_connect(&a);
	h_model_make(&m, c, 13, 100003); /* 13 tensors, ~100 KB each, 8 dtypes, some empty */
	for (size_t i = 0; i < m.n; i++)
		ck_assert_msg(h_tensor_bytes(&m, i) % 4096 != 0 || h_tensor_bytes(&m, i) == 0,
		              "tensor %zu is a multiple of 4096", i);
	rc = ckpt_plan_create(c, "rt", 0, 1, m.t, m.n, &p);
	ck_assert_msg(rc == 0, "plan: %s", ckpt_last_error(c));
	h_model_fill(&m, 7);
	save_and_wait(p, 42, "{\"lr\": 0.5, \"epoch\": 3}", CKPT_COMMITTED);
	h_model_fill(&m, 8); /* whatever is there now must be replaced */
	rc = ckpt_restore(p, 42, &step, &meta);
	ck_assert_msg(rc == 0, "restore: %s", ckpt_last_error(c));
	ck_assert_int_eq(step, 42);
	ck_assert_msg(h_model_check(&m, 7, &bad), "tensor %s differs after restore", m.name[bad]);
	ck_assert_ptr_nonnull(meta);
	{
		json_t *j = json_loads(meta, 0, NULL);

		ck_assert_ptr_nonnull(j);
		ck_assert_int_eq(json_integer_value(json_object_get(j, "epoch")), 3);
		ck_assert(json_real_value(json_object_get(j, "lr")) == 0.5);
		json_decref(j);
	}
	free(meta);
	/* CKPT_LATEST is that step; a step that does not exist is -ENOENT */
	h_model_fill(&m, 9);
	ck_assert_int_eq(ckpt_restore(p, CKPT_LATEST, &step, NULL), 0);
	ck_assert_int_eq(step, 42);
	ck_assert(h_model_check(&m, 7, NULL));
	rc = ckpt_restore(p, 41, NULL, NULL);
	ck_assert_int_eq(rc, -ENOENT);
	ck_assert_msg(strstr(ckpt_last_error(c), "rt") && strstr(ckpt_last_error(c), "41"),
	              "the error names job and step: %s", ckpt_last_error(c));
	/* the same step twice is refused, and says so */
	{
		struct ckpt_save *s;

		rc = ckpt_save(p, 42, NULL, &s);
		ck_assert_int_eq(rc, -EEXIST);
		ck_assert_msg(strstr(ckpt_last_error(c), "already committed"), "%s",
		              ckpt_last_error(c));
	}
	ckpt_plan_destroy(p);
	h_model_free(&m);
	ckpt_disconnect(c);
	h_agent_cleanup(&a);
}
END_TEST

/* The checkpoint holds the step's values even if the trainer writes right after CAPTURED. */
/*
 * Meta comes back byte for byte as the trainer gave it (spaces, 0.1, 1e-3,
 * an escaped character, 1.0): from the agent that saved it, and from one
 * that read the manifest from the disk again after a restart; ckptctl show
 * prints it so.
 */
START_TEST(meta_byte_for_byte)
{
	static const char given[] =
	    "{ \"lr\": 0.1, \"wd\": 1e-3,\n  \"name\": \"caf\\u00e9\", \"k\": [1.0, 2] }";
	struct agent_proc a;

	h_agent_start(&a, NULL);
	for (int pass = 0; pass < 2; pass++) {
		struct ckpt_client *c = h_connect(&a);
		struct ckpt_plan *p;
		struct h_model m;
		char *meta = NULL;

		h_model_make(&m, c, 2, 4096);
		ck_assert_int_eq(ckpt_plan_create(c, "meta", 0, 1, m.t, m.n, &p), 0);
		if (pass == 0)
			save_and_wait(p, 5, given, CKPT_COMMITTED);
		ck_assert_int_eq(ckpt_restore(p, 5, NULL, &meta), 0);
		ck_assert_msg(meta && strcmp(meta, given) == 0, "pass %d: meta given: %s\nback: %s",
		              pass, given, meta ? meta : "(none)");
		free(meta);
		{ /* ckptctl show says it as given too */
			char out[16384];

			ck_assert_int_eq(h_ctl(&a, out, sizeof(out), "show --full meta 5"), 0);
			ck_assert_msg(strstr(out, given), "show: %s", out);
		}
		ckpt_plan_destroy(p);
		h_model_free(&m);
		ckpt_disconnect(c);
		if (pass == 0) {
			ck_assert_int_eq(h_agent_stop(&a), 0);
			h_agent_restart(&a);
		}
	}
	h_agent_cleanup(&a);
}
END_TEST

START_TEST(rewrite_after_captured)
{
	struct agent_proc a;
	struct ckpt_client *c;
	struct ckpt_plan *p;
	struct ckpt_save *s[3];
	struct h_model m;
	size_t bad = 0;

	/* 1 write in flight of 1 MiB: persisting takes a while after CAPTURED */
	h_agent_start(&a, "--staging-mb 64 --chunk-mb 1 --queue-depth 1");
	c = h_connect(&a);
	h_model_make(&m, c, 6, 6 << 20); /* ~36 MiB: fits in the pool */
	ck_assert_int_eq(ckpt_plan_create(c, "rw", 0, 1, m.t, m.n, &p), 0);
	for (int k = 0; k < 3; k++) {
		h_model_fill(&m, 100 + (uint64_t)k);
		ck_assert_int_eq(ckpt_save(p, k + 1, NULL, &s[k]), 0);
		ck_assert_int_eq(ckpt_save_wait(s[k], CKPT_CAPTURED, 60000), 0);
		/* the next step's values, at once, while the agent still writes */
		h_model_fill(&m, 900 + (uint64_t)k);
	}
	for (int k = 0; k < 3; k++) {
		ck_assert_int_eq(ckpt_save_wait(s[k], CKPT_COMMITTED, 60000), 0);
		ckpt_save_release(s[k]);
	}
	for (int k = 0; k < 3; k++) {
		ck_assert_int_eq(ckpt_restore(p, k + 1, NULL, NULL), 0);
		ck_assert_msg(h_model_check(&m, 100 + (uint64_t)k, &bad),
		              "step %d: tensor %s does not hold the saved values", k + 1,
		              m.name[bad]);
	}
	ckpt_plan_destroy(p);
	h_model_free(&m);
	ckpt_disconnect(c);
	h_agent_cleanup(&a);
}
END_TEST

/* A save larger than the pool streams through it, and is still exact. */
START_TEST(larger_than_pool)
{
	struct agent_proc a;
	struct ckpt_client *c;
	struct ckpt_plan *p;
	struct h_model m;
	char out[8192];

	h_agent_start(&a, "--staging-mb 16 --chunk-mb 1");
	c = h_connect(&a);
	h_model_make(&m, c, 5, 9 << 20); /* ~45 MiB through a 16 MiB pool */
	ck_assert_int_eq(ckpt_plan_create(c, "big", 0, 1, m.t, m.n, &p), 0);
	ck_assert_uint_gt(ckpt_plan_bytes(p), 16u << 20);
	h_model_fill(&m, 5);
	save_and_wait(p, 1, NULL, CKPT_COMMITTED);
	h_model_fill(&m, 6);
	ck_assert_int_eq(ckpt_restore(p, 1, NULL, NULL), 0);
	ck_assert(h_model_check(&m, 5, NULL));
	ck_assert_int_eq(h_ctl(&a, out, sizeof(out), "verify big 1"), 0);
	ckpt_plan_destroy(p);
	h_model_free(&m);
	ckpt_disconnect(c);
	h_agent_cleanup(&a);
}
END_TEST

/* One rank of a 4-rank job: a sharded tensor's rows and a tensor of its own. */
static int rank_main(const char *endpoint, int rank, bool restore)
{
	int64_t gshape[2] = {400, 33}, lshape[2] = {100, 33}, goff[2] = {100 * rank, 0};
	int64_t own[1] = {1000 + rank};
	struct ckpt_tensor t[2];
	struct ckpt_client *c;
	struct ckpt_plan *p;
	struct ckpt_save *s;
	char name[32];
	float *mem;
	int rc;

	if (ckpt_connect(endpoint, &c))
		return 10;
	if (ckpt_host_alloc(c, sizeof(float) * (100 * 33 + 1000 + 4), (void **)&mem))
		return 11;
	snprintf(name, sizeof(name), "rank%d.state", rank);
	t[0] = (struct ckpt_tensor){"embed", CKPT_F32, 2, lshape, mem, gshape, goff};
	t[1] = (struct ckpt_tensor){name, CKPT_F32, 1, own, mem + 100 * 33, NULL, NULL};
	for (int i = 0; i < 100 * 33; i++)
		mem[i] = (float)(rank * 100 * 33 + i);
	for (int i = 0; i < own[0]; i++)
		mem[100 * 33 + i] = (float)(rank * 7 + i);
	if (ckpt_plan_create(c, "dp", rank, 4, t, 2, &p))
		return fprintf(stderr, "rank %d: %s\n", rank, ckpt_last_error(c)), 12;
	if (restore) {
		memset(mem, 0, sizeof(float) * (100 * 33 + 1000 + 4));
		if (ckpt_restore(p, CKPT_LATEST, NULL, NULL))
			return fprintf(stderr, "rank %d: %s\n", rank, ckpt_last_error(c)), 13;
		for (int i = 0; i < 100 * 33; i++)
			if (mem[i] != (float)(rank * 100 * 33 + i))
				return 14;
		for (int i = 0; i < own[0]; i++)
			if (mem[100 * 33 + i] != (float)(rank * 7 + i))
				return 15;
	} else {
		if (ckpt_save(p, 10, rank == 0 ? "{\"ranks\":4}" : NULL, &s))
			return fprintf(stderr, "rank %d: %s\n", rank, ckpt_last_error(c)), 16;
		rc = ckpt_save_wait(s, CKPT_COMMITTED, 60000);
		if (rc)
			return fprintf(stderr, "rank %d: %s\n", rank, ckpt_save_reason(s)), 17;
		ckpt_save_release(s);
	}
	ckpt_plan_destroy(p);
	ckpt_disconnect(c);
	return 0;
}

/*
 * Each rank is a fresh process (this program again, with --rank): a trainer
 * per process, as on a real node, and no gRPC state carried across fork.
 * From `prog`, a copy of it, where given.
 */
static void run_ranks(const struct agent_proc *a, bool restore, const char *prog)
{
	pid_t pid[4];

	for (int r = 0; r < 4; r++) {
		char rank[8];

		snprintf(rank, sizeof(rank), "%d", r);
		pid[r] = h_spawn(prog, H_OUT_KEEP, NULL,
		                 (const char *[]){"test_roundtrip", "--rank", rank, a->endpoint,
		                                  restore ? "restore" : "save", NULL});
	}
	for (int r = 0; r < 4; r++) {
		int st;

		ck_assert_int_eq(waitpid(pid[r], &st, 0), pid[r]);
		ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "rank %d exited with %d", r,
		              WEXITSTATUS(st));
	}
}

/*
 * This program copied into a.dir where its path is longer than 64 bytes:
 * the agent's log names its clients by the program's file name, however
 * long the path (a name taken from a path cut short is cut too).
 */
static void copy_self_far(const struct agent_proc *a, char *prog, size_t len)
{
	char cmd[1200];

	snprintf(prog, len,
	         "%s/a-directory-whose-name-alone-is-longer-than-what-was-kept-of-a-path/"
	         "test_roundtrip",
	         a->dir);
	snprintf(cmd, sizeof(cmd), "mkdir -p \"$(dirname '%s')\" && cp /proc/%d/exe '%s'", prog,
	         (int)getpid(), prog);
	ck_assert_int_eq(system(cmd), 0);
}

START_TEST(four_ranks_one_checkpoint)
{
	struct agent_proc a;
	char out[65536], path[512], prog[512];
	json_t *j, *chunks, *embed;

	h_agent_start(&a, NULL);
	copy_self_far(&a, prog, sizeof(prog));
	run_ranks(&a, false, prog);
	ck_assert_msg(h_log_has(&a, "client test_roundtrip (pid"),
	              "the ranks run from %s are not named test_roundtrip in %s", prog, a.log);
	ck_assert_int_eq(h_ctl(&a, out, sizeof(out), "--json list dp"), 0);
	j = json_loads(out, 0, NULL);
	ck_assert_msg(j, "list --json is JSON: %s", out);
	ck_assert_int_eq(json_array_size(json_object_get(j, "checkpoints")), 1);
	ck_assert_int_eq(json_integer_value(json_object_get(
	                     json_array_get(json_object_get(j, "checkpoints"), 0), "world")),
	                 4);
	json_decref(j);
	ck_assert_int_eq(h_ctl(&a, out, sizeof(out), "--json show dp 10"), 0);
	j = json_loads(out, 0, NULL);
	ck_assert_msg(j, "show --json is JSON");
	ck_assert_int_eq(json_array_size(json_object_get(j, "ranks")), 4);
	embed = json_object_get(json_object_get(j, "tensors"), "embed");
	chunks = json_object_get(embed, "chunks");
	ck_assert_int_eq(json_array_size(chunks), 4);
	ck_assert_int_eq(
	    json_integer_value(json_array_get(json_object_get(embed, "global_shape"), 0)), 400);
	ck_assert_int_eq(json_integer_value(json_object_get(json_object_get(j, "meta"), "ranks")),
	                 4);
	json_decref(j);
	for (int r = 0; r < 4; r++) {
		h_shard(&a, path, sizeof(path), "dp", 10, r);
		ck_assert_msg(h_exists(path), "%s exists", path);
	}
	run_ranks(&a, true, NULL);
	h_agent_cleanup(&a);
}
END_TEST

START_TEST(latest_after_restart)
{
	struct agent_proc a;
	struct ckpt_client *c;
	struct ckpt_plan *p;
	struct h_model m;
	int64_t step = -1;

	h_agent_start(&a, NULL);
	c = h_connect(&a);
	h_model_make(&m, c, 4, 300001);
	ck_assert_int_eq(ckpt_plan_create(c, "rs", 0, 1, m.t, m.n, &p), 0);
	for (int k = 1; k <= 3; k++) {
		h_model_fill(&m, (uint64_t)k);
		save_and_wait(p, k * 100, NULL, CKPT_COMMITTED);
	}
	ckpt_plan_destroy(p);
	h_model_free(&m);
	ckpt_disconnect(c);
	ck_assert_int_eq(h_agent_stop(&a), 0);
	h_agent_restart(&a);
	c = h_connect(&a);
	h_model_make(&m, c, 4, 300001);
	ck_assert_int_eq(ckpt_plan_create(c, "rs", 0, 1, m.t, m.n, &p), 0);
	h_model_fill(&m, 99);
	ck_assert_int_eq(ckpt_restore(p, CKPT_LATEST, &step, NULL), 0);
	ck_assert_int_eq(step, 300);
	ck_assert(h_model_check(&m, 3, NULL));
	ck_assert_int_eq(ckpt_restore(p, 100, &step, NULL), 0);
	ck_assert(h_model_check(&m, 1, NULL));
	ckpt_plan_destroy(p);
	h_model_free(&m);
	ckpt_disconnect(c);
	h_agent_cleanup(&a);
}
END_TEST

/*
 * Ranks saving steps out of order: after step 1, rank 1 saves 3 before 2.
 * Step 3 commits once both ranks have it; step 2, still missing a rank
 * then, FAILS saying why, and stays failed when rank 1 saves it late.
 * LATEST is 3 in the listing and for a restore, and so after a restart.
 */
static void oo_check(const struct agent_proc *a, struct ckpt_plan **p, unsigned char *mem)
{
	char out[8192];
	int64_t step = -1;
	int committed = 0;

	ck_assert_int_eq(h_ctl(a, out, sizeof(out), "list oo"), 0);
	for (char *save, *l = strtok_r(out, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
		long long st = -1;
		char state[32] = "";

		if (strncmp(l, "oo ", 3) != 0 || sscanf(l, "%*s %lld %31s", &st, state) != 2)
			continue;
		ck_assert_msg((strcmp(state, "COMMITTED") == 0) == (st != 2), "%s", l);
		ck_assert_msg((strstr(l, "LATEST") != NULL) == (st == 3), "LATEST: %s", l);
		committed += st != 2;
	}
	ck_assert_msg(committed == 2, "steps 1 and 3 committed, not %d", committed);
	memset(mem, 0, 2 * 4096);
	for (int r = 0; r < 2; r++) {
		ck_assert_int_eq(ckpt_restore(p[r], CKPT_LATEST, &step, NULL), 0);
		ck_assert_int_eq(step, 3);
		ck_assert_int_eq(mem[r * 4096], 30 + r);
		ck_assert_int_eq(mem[r * 4096 + 4095], 30 + r);
	}
	ck_assert_int_eq(ckpt_restore(p[0], 2, &step, NULL), -ENOENT);
}

static void oo_plans(struct ckpt_client *c, struct ckpt_plan **p, unsigned char *mem)
{
	static const int64_t shape[1] = {4096};

	for (int r = 0; r < 2; r++) {
		struct ckpt_tensor t = {r ? "r1.w" : "r0.w", CKPT_U8, 1,   shape,
		                        mem + r * 4096,      NULL,    NULL};

		ck_assert_int_eq(ckpt_plan_create(c, "oo", r, 2, &t, 1, &p[r]), 0);
	}
}

/* Each rank's plan dropped, the memory given back, the client gone. */
static void oo_close(struct ckpt_client *c, struct ckpt_plan **p, void *mem)
{
	ckpt_plan_destroy(p[0]);
	ckpt_plan_destroy(p[1]);
	ckpt_host_free(c, mem);
	ckpt_disconnect(c);
}

static struct ckpt_save *oo_save(struct ckpt_plan *p, void *mem, int r, int step)
{
	struct ckpt_save *s;

	memset((char *)mem + r * 4096, step * 10 + r, 4096);
	ck_assert_int_eq(ckpt_save(p, step, NULL, &s), 0);
	ck_assert_int_eq(ckpt_save_wait(s, CKPT_CAPTURED, 60000), 0);
	return s;
}

START_TEST(out_of_order_steps)
{
	struct agent_proc a;
	struct ckpt_client *c;
	struct ckpt_plan *p[2];
	struct ckpt_save *s0[3], *s1[3];
	void *mem;
	int rc;

	h_agent_start(&a, NULL);
	c = h_connect(&a);
	ck_assert_int_eq(ckpt_host_alloc(c, 2 * 4096, &mem), 0);
	oo_plans(c, p, mem);
	/* step 1 of both, committed before anything else is saved */
	s0[0] = oo_save(p[0], mem, 0, 1);
	s1[0] = oo_save(p[1], mem, 1, 1);
	ck_assert_int_eq(ckpt_save_wait(s0[0], CKPT_COMMITTED, 60000), 0);
	ck_assert_int_eq(ckpt_save_wait(s1[0], CKPT_COMMITTED, 60000), 0);
	/* rank 0 saves 2 and 3, rank 1 only 3: step 3 commits, step 2 cannot */
	s0[1] = oo_save(p[0], mem, 0, 2);
	s0[2] = oo_save(p[0], mem, 0, 3);
	s1[2] = oo_save(p[1], mem, 1, 3);
	ck_assert_int_eq(ckpt_save_wait(s0[2], CKPT_COMMITTED, 60000), 0);
	ck_assert_int_eq(ckpt_save_wait(s1[2], CKPT_COMMITTED, 60000), 0);
	rc = ckpt_save_wait(s0[1], CKPT_COMMITTED, 60000);
	ck_assert_msg(rc == -EIO && strstr(ckpt_save_reason(s0[1]), "step 3 committed"),
	              "step 2: %d %s", rc, ckpt_save_reason(s0[1]));
	/* rank 1's step 2, late: it cannot commit either */
	memset((char *)mem + 4096, 21, 4096);
	rc = ckpt_save(p[1], 2, NULL, &s1[1]);
	if (rc == 0) {
		ck_assert_int_ne(ckpt_save_wait(s1[1], CKPT_COMMITTED, 60000), 0);
		ckpt_save_release(s1[1]);
	}
	for (int k = 0; k < 3; k++) {
		ckpt_save_release(s0[k]);
		if (k != 1)
			ckpt_save_release(s1[k]);
	}
	oo_check(&a, p, mem);
	oo_close(c, p, mem);
	ck_assert_int_eq(h_agent_stop(&a), 0);
	h_agent_restart(&a);
	c = h_connect(&a);
	ck_assert_int_eq(ckpt_host_alloc(c, 2 * 4096, &mem), 0);
	oo_plans(c, p, mem);
	oo_check(&a, p, mem);
	oo_close(c, p, mem);
	h_agent_cleanup(&a);
}
END_TEST

int test_before(int argc, char **argv)
{
	if (argc == 5 && strcmp(argv[1], "--rank") == 0)
		return rank_main(argv[3], atoi(argv[2]), strcmp(argv[4], "restore") == 0);
	return TEST_RUN;
}

Suite *test_suite(void)
{
	Suite *s;
	TCase *tc;

	s = suite_create("roundtrip");
	tc = tcase_create("agent");
	tcase_set_timeout(tc, 240);
	tcase_add_test(tc, roundtrip_odd_sizes);
	tcase_add_test(tc, meta_byte_for_byte);
	tcase_add_test(tc, rewrite_after_captured);
	tcase_add_test(tc, larger_than_pool);
	tcase_add_test(tc, four_ranks_one_checkpoint);
	tcase_add_test(tc, latest_after_restart);
	tcase_add_test(tc, out_of_order_steps);
	suite_add_tcase(s, tc);
	return s;
}
