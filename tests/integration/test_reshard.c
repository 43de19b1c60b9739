/*
 * Restore into another layout, through a real agent. A job of world 4
 * saves "w0" [24, 10] split on dimension 0, "w1" [6, 40] split on
 * dimension 1, "bias" [7] replicated on every rank, and a tensor of each
 * rank's own; `ckptctl show` says each rank's bytes and boxes, the balance
 * and the bias's four copies; then, each rank a process of its own:
 *   - world 2 and world 8 restore every box byte-exact (w0's rows and w1's
 *     columns from several ranks' files), and their own tensors where the
 *     rank saved one
 *   - world 1 restores w0 and w1 unsplit (declared without a global shape)
 *   - a rank asking for w1 alone gets it
 *   - the same across two agents on one shared root (each rank's boxes from
 *     files the other node wrote)
 *   - a dtype or a global shape that differs, a tensor the checkpoint lacks,
 *     a box the checkpoint covers only in part: refused, naming the tensor
 *     (and the box)
 *   - rank 0 saved part of a tensor, rank 1 all of it: rank 0 restores all
 *     of it from both; a plan the newest step does not cover is -EINVAL,
 *     never an older step restored instead (even with fallback)
 *   - the bias's chunk corrupt in rank 1's file: rank 1 restores it from
 *     another rank's copy (in world 4 and world 2) and the log says so;
 *     verify names the bad copy and the 3 good ones; its own tensor corrupt
 *     there too (no other copy): rank 1's restore fails naming that one
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <check.h>
#include <jansson.h>

#include "tests/integration/harness.h"
#include "support/check_main.h"

#define R0 24
#define C0 10
#define R1 6
#define C1 40
#define NB 7
#define RE 4096 /* "emb" [RE, CE] f32, replicated on every rank: 16 MiB, cut in 4 pieces */
#define CE 1024

static float v_w0(int64_t i, int64_t j)
{
	return (float)(1000 * i + j) + 0.5f;
}
static float v_w1(int64_t i, int64_t j)
{
	return (float)(100000 + 100 * i + j);
}
static float v_bias(int64_t k)
{
	return (float)(7 * k + 1);
}
static float v_emb(int64_t i, int64_t j)
{
	return (float)(i * 7 + j % 13);
}

static float v_own(int rank, int64_t k)
{
	return (float)(rank * 10 + k) - 0.25f;
}

/*
 * The ranks' processes meet: each leaves a file in dir, then waits for all
 * world of them; false if they did not come within 60 s.
 */
static bool barrier(const char *dir, int rank, int world)
{
	char path[512];
	FILE *f;
	int n = 0;

	snprintf(path, sizeof(path), "%s/%d", dir, rank);
	if (!(f = fopen(path, "w")))
		return false;
	fclose(f);
	for (int tries = 0; n < world && tries < 60000; tries++) {
		n = 0;
		for (int r = 0; r < world; r++) {
			snprintf(path, sizeof(path), "%s/%d", dir, r);
			n += access(path, F_OK) == 0;
		}
		if (n < world)
			usleep(1000);
	}
	return n == world;
}

/*
 * One rank: mode "save" (every replica writes its copy: copies
 * CKPT_COPIES_ALL), "restore" (every tensor; split ones as in the save's
 * scheme for this world), "unsplit" (w0 and w1 without a global shape),
 * "w1" (w1 alone), or "fail:WHAT" (a plan that must be refused, its error
 * holding the words the test gives). "dsave", "dsave2" and "drestore" add
 * the replicated "emb" and save with copies 1 (the default) or 2: step 4,
 * then step 5 (by then the plan set is complete: replicas written once).
 */
static int rank_main(const char *endpoint, const char *job, int rank, int world, const char *mode,
                     const char *expect)
{
	const int64_t r0 = R0 / world, c1 = C1 / world;
	int64_t g0[2] = {R0, C0}, s0[2] = {r0, C0}, o0[2] = {r0 * rank, 0};
	int64_t g1[2] = {R1, C1}, s1[2] = {R1, c1}, o1[2] = {0, c1 * rank};
	int64_t gb[1] = {NB}, ob[1] = {0}, sown[1] = {3};
	bool unsplit = strcmp(mode, "unsplit") == 0, only_w1 = strcmp(mode, "w1") == 0;
	bool dedup = mode[0] == 'd', fail = strncmp(mode, "fail:", 5) == 0;
	bool save = strcmp(mode + dedup, "save") == 0 || strcmp(mode, "dsave2") == 0;
	struct ckpt_plan_opts po = CKPT_PLAN_OPTS_INIT;
	int64_t ge[2] = {RE, CE}, oe[2] = {0, 0};
	struct ckpt_tensor t[6];
	struct ckpt_client *c;
	struct ckpt_plan *p;
	struct ckpt_save *s;
	char own[32];
	float *w0, *w1, *b, *o, *e;
	size_t n = 0;
	int rc;

	if (ckpt_connect(endpoint, &c))
		return 10;
	if (ckpt_host_alloc(c, sizeof(float) * (R0 * C0 + R1 * C1 + NB + 3 + RE * CE),
	                    (void **)&w0))
		return 11;
	w1 = w0 + r0 * C0;
	b = w1 + R1 * c1;
	o = b + NB;
	e = o + 3;
	snprintf(own, sizeof(own), "own.rank%d", rank);
	if (!only_w1)
		t[n++] = (struct ckpt_tensor){
		    "w0", CKPT_F32, 2, s0, w0, unsplit ? NULL : g0, unsplit ? NULL : o0};
	t[n++] = (struct ckpt_tensor){
	    "w1", CKPT_F32, 2, s1, w1, unsplit ? NULL : g1, unsplit ? NULL : o1};
	if (!only_w1 && !unsplit) {
		t[n++] = (struct ckpt_tensor){"bias", CKPT_F32, 1, gb, b, gb, ob};
		if (save || rank < 4) /* the saving world's ranks */
			t[n++] = (struct ckpt_tensor){own, CKPT_F32, 1, sown, o, NULL, NULL};
	}
	if (dedup)
		t[n++] = (struct ckpt_tensor){"emb", CKPT_F32, 2, ge, e, ge, oe};
	po.copies = !dedup ? CKPT_COPIES_ALL : strcmp(mode, "dsave2") == 0 ? 2 : 0;
	if (fail) { /* the first tensor changed as the mode says */
		if (strcmp(mode + 5, "dtype") == 0)
			t[0].dtype = CKPT_BF16;
		else if (strcmp(mode + 5, "gshape") == 0)
			g0[0] = R0 + world;
		else if (strcmp(mode + 5, "missing") == 0)
			t[0].name = "w9";
	}
	for (int64_t i = 0; i < r0; i++)
		for (int64_t j = 0; j < C0; j++)
			w0[i * C0 + j] = save ? v_w0(o0[0] + i, j) : -1;
	for (int64_t i = 0; i < R1; i++)
		for (int64_t j = 0; j < c1; j++)
			w1[i * c1 + j] = save ? v_w1(i, o1[1] + j) : -1;
	for (int64_t k = 0; k < NB; k++)
		b[k] = save ? v_bias(k) : -1;
	for (int64_t k = 0; k < 3; k++)
		o[k] = save ? v_own(rank, k) : -1;
	for (int64_t i = 0; i < RE * CE && dedup; i++)
		e[i] = save ? v_emb(i / CE, i % CE) : -1;
	if (ckpt_plan_create_opts(c, job, rank, world, t, n, &po, &p))
		return fprintf(stderr, "rank %d: %s\n", rank, ckpt_last_error(c)), 12;
	/* every rank's plan made before any restores */
	if (getenv("RESHARD_BARRIER") && !barrier(getenv("RESHARD_BARRIER"), rank, world))
		return fprintf(stderr, "rank %d: the other ranks never came\n", rank), 22;
	for (int64_t step = 4; save && dedup && step < 5; step++) {
		if (ckpt_save(p, step, NULL, &s))
			return fprintf(stderr, "rank %d: %s\n", rank, ckpt_last_error(c)), 13;
		if (ckpt_save_wait(s, CKPT_COMMITTED, 60000))
			return fprintf(stderr, "rank %d: %s\n", rank, ckpt_save_reason(s)), 14;
		ckpt_save_release(s);
	}
	if (save) {
		if (ckpt_save(p, 5, NULL, &s))
			return fprintf(stderr, "rank %d: %s\n", rank, ckpt_last_error(c)), 13;
		rc = ckpt_save_wait(s, CKPT_COMMITTED, 60000);
		if (rc)
			return fprintf(stderr, "rank %d: %s\n", rank, ckpt_save_reason(s)), 14;
		ckpt_save_release(s);
		goto out;
	}
	rc = ckpt_restore(p, CKPT_LATEST, NULL, NULL);
	if (fail) {
		if (!rc || !strstr(ckpt_last_error(c), expect))
			return fprintf(stderr, "rank %d: restore %s, said: %s\n", rank,
			               rc ? "failed" : "succeeded", rc ? ckpt_last_error(c) : "-"),
			       20;
		goto out;
	}
	if (rc)
		return fprintf(stderr, "rank %d: %s\n", rank, ckpt_last_error(c)), 15;
	for (int64_t i = 0; i < r0 && !only_w1; i++)
		for (int64_t j = 0; j < C0; j++)
			if (w0[i * C0 + j] != v_w0(o0[0] + i, j))
				return fprintf(stderr, "rank %d: w0[%ld][%ld] = %g\n", rank,
				               (long)i, (long)j, (double)w0[i * C0 + j]),
				       16;
	for (int64_t i = 0; i < R1; i++)
		for (int64_t j = 0; j < c1; j++)
			if (w1[i * c1 + j] != v_w1(i, o1[1] + j))
				return fprintf(stderr, "rank %d: w1[%ld][%ld] = %g\n", rank,
				               (long)i, (long)j, (double)w1[i * c1 + j]),
				       17;
	for (int64_t k = 0; k < NB && !only_w1 && !unsplit; k++)
		if (b[k] != v_bias(k))
			return 18;
	for (int64_t k = 0; k < 3 && !only_w1 && !unsplit && rank < 4; k++)
		if (o[k] != v_own(rank, k))
			return 19;
	for (int64_t i = 0; i < RE * CE && dedup; i++)
		if (e[i] != v_emb(i / CE, i % CE))
			return fprintf(stderr, "rank %d: emb[%ld] = %g\n", rank, (long)i,
			               (double)e[i]),
			       21;
out:
	ckpt_plan_destroy(p);
	ckpt_disconnect(c);
	return 0;
}

/*
 * Data parallel 2 x tensor parallel 4 (world 8: rank r is TP shard r / 2 of
 * DP replica r % 2), or TP 4 alone (world 4: rank r is TP shard r): "tp.w"
 * [TPR, CE] split in 4 boxes of 8 MiB along dimension 0, "emb" [TPR, CE]
 * replicated on every rank (32 MiB), and a tensor of each rank's own. Mode
 * "tpsave" saves steps 4 and 5 (copies 1), "tprestore" restores and checks
 * every byte.
 */
#define TPR 8192

static int tp_main(const char *endpoint, const char *job, int rank, int world, const char *mode)
{
	const int64_t rows = TPR / 4, tp = world == 8 ? rank / 2 : rank;
	int64_t gw[2] = {TPR, CE}, sw[2] = {rows, CE}, ow[2] = {rows * tp, 0};
	int64_t ge[2] = {TPR, CE}, oe[2] = {0, 0}, sown[1] = {3};
	bool save = strcmp(mode, "tpsave") == 0;
	struct ckpt_tensor t[3];
	struct ckpt_client *c;
	struct ckpt_plan *p;
	struct ckpt_save *s;
	float *w, *e, *o;
	char own[32];

	if (ckpt_connect(endpoint, &c))
		return 10;
	if (ckpt_host_alloc(c, sizeof(float) * (rows * CE + TPR * CE + 3), (void **)&w))
		return 11;
	e = w + rows * CE;
	o = e + (int64_t)TPR * CE;
	snprintf(own, sizeof(own), "own.rank%d", rank);
	t[0] = (struct ckpt_tensor){"tp.w", CKPT_F32, 2, sw, w, gw, ow};
	t[1] = (struct ckpt_tensor){"emb", CKPT_F32, 2, ge, e, ge, oe};
	t[2] = (struct ckpt_tensor){own, CKPT_F32, 1, sown, o, NULL, NULL};
	for (int64_t i = 0; i < rows * CE; i++)
		w[i] = save ? v_emb(ow[0] + i / CE, i % CE + 1) : -1;
	for (int64_t i = 0; i < (int64_t)TPR * CE; i++)
		e[i] = save ? v_emb(i / CE, i % CE) : -1;
	for (int64_t k = 0; k < 3; k++)
		o[k] = save ? v_own(rank, k) : -1;
	if (ckpt_plan_create(c, job, rank, world, t, 3, &p))
		return fprintf(stderr, "rank %d: %s\n", rank, ckpt_last_error(c)), 12;
	for (int64_t step = 4; save && step <= 5; step++) {
		if (ckpt_save(p, step, NULL, &s))
			return fprintf(stderr, "rank %d: %s\n", rank, ckpt_last_error(c)), 13;
		if (ckpt_save_wait(s, CKPT_COMMITTED, 60000))
			return fprintf(stderr, "rank %d: %s\n", rank, ckpt_save_reason(s)), 14;
		ckpt_save_release(s);
	}
	if (!save && ckpt_restore(p, CKPT_LATEST, NULL, NULL))
		return fprintf(stderr, "rank %d: %s\n", rank, ckpt_last_error(c)), 15;
	for (int64_t i = 0; i < rows * CE; i++)
		if (w[i] != v_emb(ow[0] + i / CE, i % CE + 1))
			return fprintf(stderr, "rank %d: tp.w[%ld] = %g\n", rank, (long)i,
			               (double)w[i]),
			       16;
	for (int64_t i = 0; i < (int64_t)TPR * CE; i++)
		if (e[i] != v_emb(i / CE, i % CE))
			return fprintf(stderr, "rank %d: emb[%ld] = %g\n", rank, (long)i,
			               (double)e[i]),
			       17;
	for (int64_t k = 0; k < 3; k++)
		if (o[k] != v_own(rank, k))
			return 18;
	ckpt_plan_destroy(p);
	ckpt_disconnect(c);
	return 0;
}

/*
 * Ranks [from, to) of a job of world ranks, each this program again, rank r
 * through agent a[r % na]; every one must exit 0.
 */
static void run_on(const struct agent_proc *a, int na, const char *job, int world, int from, int to,
                   const char *mode, const char *expect)
{
	pid_t pid[8];

	for (int r = from; r < to; r++) {
		char rank[8], w[8];

		snprintf(rank, sizeof(rank), "%d", r);
		snprintf(w, sizeof(w), "%d", world);
		pid[r] = h_spawn(NULL, H_OUT_KEEP, NULL,
		                 (const char *[]){"test_reshard", "--rank", a[r % na].endpoint, job,
		                                  rank, w, mode, expect ? expect : "", NULL});
	}
	for (int r = from; r < to; r++) {
		int st;

		ck_assert_int_eq(waitpid(pid[r], &st, 0), pid[r]);
		ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0,
		              "%s world %d (%s): rank %d exited with %d", job, world, mode, r,
		              WEXITSTATUS(st));
	}
}

static void run_ranks(const struct agent_proc *a, const char *job, int world, int from, int to,
                      const char *mode, const char *expect)
{
	run_on(a, 1, job, world, from, to, mode, expect);
}

static void run_world(const struct agent_proc *a, const char *job, int world, const char *mode,
                      const char *expect)
{
	run_on(a, 1, job, world, 0, world, mode, expect);
}

/* The first byte of rank's chunk of tensor in step 5 of job, from show --json. */
static uint64_t chunk_at(const struct agent_proc *a, const char *job, const char *tensor, int rank)
{
	char out[65536];
	json_t *j, *c;
	size_t i;
	uint64_t at = 0;

	ck_assert_int_eq(h_ctl(a, out, sizeof(out), "--json show %s 5", job), 0);
	j = json_loads(out, 0, NULL);
	ck_assert_msg(j, "%s", out);
	json_array_foreach(
	    json_object_get(json_object_get(json_object_get(j, "tensors"), tensor), "chunks"), i, c)
	{
		if (json_integer_value(json_object_get(c, "rank")) == rank)
			at = (uint64_t)json_integer_value(
			    json_array_get(json_object_get(c, "byte_range"), 0));
	}
	json_decref(j);
	ck_assert_uint_gt(at, 0);
	return at;
}

/*
 * A replicated box's chunk corrupt in one rank's file: that rank restores
 * it from another rank's copy, and says so; a box with no other copy: the
 * restore fails naming the tensor and the checksum.
 */
START_TEST(other_copy_of_a_replica)
{
	struct agent_proc a;
	char path[512], out[16384];

	h_agent_start(&a, NULL);
	run_world(&a, "cp", 4, "save", NULL);
	h_shard(&a, path, sizeof(path), "cp", 5, 1);
	h_flip_byte(path, chunk_at(&a, "cp", "bias", 1) + 5);
	run_world(&a, "cp", 4, "restore", NULL);
	ck_assert_msg(h_log_has(&a, "restore of job cp rank 1: step 5: tensor 'bias'") &&
	                  h_log_has(&a, "restored from other copies"),
	              "the log does not say rank 1's bias came from another copy (%s)", a.log);
	/* verify: the file is corrupt, and the box has 3 good copies of 4 */
	ck_assert_int_ne(h_ctl(&a, out, sizeof(out), "verify cp 5"), 0);
	ck_assert_msg(strstr(out, "tensor 'bias', box [7] at [0]: rank 1's copy is bad; 3 of its 4 "
	                          "copies are good (a restore reads one of them)"),
	              "%s", out);
	/* the same restored into world 2: rank 0 assembles rows 0..11 of w0, bias from rank 0 */
	run_world(&a, "cp", 2, "restore", NULL);
	/*
	 * rank 1's own tensor corrupt too (no other copy), after the bias in its
	 * file: the bias is read from another copy, then the restore fails naming
	 * what cannot be read, not the bias it got back
	 */
	h_flip_byte(path, chunk_at(&a, "cp", "own.rank1", 1) + 3);
	run_ranks(&a, "cp", 4, 1, 2, "fail:", "tensor 'own.rank1'");
	run_ranks(&a, "cp", 4, 1, 2, "fail:", "checksum mismatch");
	/*
	 * The step is damaged now, for every rank of the node: rank 0, which
	 * needs nothing of rank 1's tensor, does not restore it as LATEST
	 * either (the ranks of one job never go on from different steps), and
	 * is told why; the list says so.
	 */
	run_ranks(&a, "cp", 4, 0, 1, "fail:", "own.rank1");
	ck_assert_int_eq(h_ctl(&a, out, sizeof(out), "list cp"), 0);
	ck_assert_msg(strstr(out, "DAMAGED") && strstr(out, "own.rank1"), "%s", out);
	h_agent_cleanup(&a);
}
END_TEST

START_TEST(other_worlds_and_splits)
{
	struct agent_proc a;
	char out[65536];
	json_t *j, *l;

	h_agent_start(&a, NULL);
	run_world(&a, "rs", 4, "save", NULL);
	/* show: each rank's bytes and boxes, the balance, the bias held by all four */
	ck_assert_int_eq(h_ctl(&a, out, sizeof(out), "show --full rs 5"), 0);
	ck_assert_msg(strstr(out, "balance: the largest rank's tensor bytes / the mean: 1.00") &&
	                  strstr(out, "12 written by 1 rank") &&
	                  strstr(out, "1 written by 4 ranks") &&
	                  strstr(out, "; 84 bytes in extra copies"),
	              "%s", out);
	ck_assert_int_eq(h_ctl(&a, out, sizeof(out), "--json show rs 5"), 0);
	j = json_loads(out, 0, NULL);
	ck_assert_msg(j, "%s", out);
	l = json_object_get(j, "layout");
	ck_assert_int_eq(json_array_size(json_object_get(l, "ranks")), 4);
	/* w0 60 + w1 60 + bias 7 + its own 3 floats */
	ck_assert_int_eq(json_integer_value(json_object_get(
	                     json_array_get(json_object_get(l, "ranks"), 3), "bytes")),
	                 4 * (60 + 60 + 7 + 3));
	ck_assert_int_eq(json_integer_value(json_object_get(
	                     json_array_get(json_object_get(l, "ranks"), 3), "boxes")),
	                 4);
	ck_assert_int_eq(
	    json_integer_value(json_object_get(json_object_get(l, "boxes_by_copies"), "4")), 1);
	json_decref(j);
	run_world(&a, "rs", 2, "restore", NULL);
	run_world(&a, "rs", 8, "restore", NULL);
	run_world(&a, "rs", 1, "unsplit", NULL);
	run_world(&a, "rs", 2, "w1", NULL);
	run_world(&a, "rs", 4, "restore", NULL); /* the saved layout, as before */
	run_world(&a, "rs", 2, "fail:dtype", "tensor 'w0'");
	run_world(&a, "rs", 2, "fail:gshape", "tensor 'w0'");
	run_world(&a, "rs", 2, "fail:missing", "'w9' is not in the checkpoint");
	/* one node: its ranks arriving one by one are no job spanning several nodes */
	ck_assert_msg(!h_log_has(&a, "spans several nodes"), "a many-nodes warning on one node");
	h_agent_cleanup(&a);
}
END_TEST

/* A box the checkpoint holds only in part: refused, naming the tensor and the box. */
START_TEST(box_not_covered)
{
	struct agent_proc a;
	struct ckpt_client *c;
	struct ckpt_plan *p;
	struct ckpt_save *s;
	int64_t g[1] = {8}, half[1] = {4}, off[1] = {0}, own[1] = {2};
	float *mem;
	struct ckpt_tensor t[2];

	h_agent_start(&a, NULL);
	c = h_connect(&a);
	ck_assert_int_eq(ckpt_host_alloc(c, 64, (void **)&mem), 0);
	/* world 1 saves the first half of "h" [8] only */
	t[0] = (struct ckpt_tensor){"h", CKPT_F32, 1, half, mem, g, off};
	t[1] = (struct ckpt_tensor){"x", CKPT_F32, 1, own, mem + 8, NULL, NULL};
	ck_assert_int_eq(ckpt_plan_create(c, "part", 0, 1, t, 2, &p), 0);
	ck_assert_int_eq(ckpt_save(p, 1, NULL, &s), 0);
	ck_assert_int_eq(ckpt_save_wait(s, CKPT_COMMITTED, 60000), 0);
	ckpt_save_release(s);
	ckpt_plan_destroy(p);
	/* a plan asking for all of it */
	t[0].shape = g;
	ck_assert_int_eq(ckpt_plan_create(c, "part", 0, 1, t, 2, &p), 0);
	ck_assert_int_ne(ckpt_restore(p, CKPT_LATEST, NULL, NULL), 0);
	ck_assert_msg(strstr(ckpt_last_error(c), "tensor 'h'") &&
	                  strstr(ckpt_last_error(c), "4 of the 8 elements") &&
	                  strstr(ckpt_last_error(c), "[8] at [0]"),
	              "%s", ckpt_last_error(c));
	ckpt_plan_destroy(p);
	ckpt_disconnect(c);
	h_agent_cleanup(&a);
}
END_TEST

/*
 * Rank 0 saved rows [2, 6) of "h" [8], rank 1 all of it: rank 0 restoring
 * all of it takes its own part and the rest from rank 1's copy.
 */
START_TEST(own_part_and_another_copy)
{
	struct agent_proc a;
	struct ckpt_client *c;
	struct ckpt_plan *p0, *p1;
	struct ckpt_save *s0, *s1;
	int64_t g[1] = {8}, four[1] = {4}, two[1] = {2}, zero[1] = {0};
	struct ckpt_tensor t0, t1;
	float *mem;

	h_agent_start(&a, NULL);
	c = h_connect(&a);
	ck_assert_int_eq(ckpt_host_alloc(c, 256, (void **)&mem), 0);
	for (int i = 0; i < 8; i++)
		mem[16 + i] = (float)(100 + i), mem[i] = i >= 2 && i < 6 ? (float)(100 + i) : 0;
	memmove(mem, mem + 2, 4 * sizeof(float)); /* rank 0's rows 2..5 */
	t0 = (struct ckpt_tensor){"h", CKPT_F32, 1, four, mem, g, two};
	t1 = (struct ckpt_tensor){"h", CKPT_F32, 1, g, mem + 16, g, zero};
	ck_assert_int_eq(ckpt_plan_create(c, "ov", 0, 2, &t0, 1, &p0), 0);
	ck_assert_int_eq(ckpt_plan_create(c, "ov", 1, 2, &t1, 1, &p1), 0);
	ck_assert_int_eq(ckpt_save(p0, 1, NULL, &s0), 0);
	ck_assert_int_eq(ckpt_save(p1, 1, NULL, &s1), 0);
	ck_assert_int_eq(ckpt_save_wait(s0, CKPT_COMMITTED, 60000), 0);
	ck_assert_int_eq(ckpt_save_wait(s1, CKPT_COMMITTED, 60000), 0);
	ckpt_save_release(s0);
	ckpt_save_release(s1);
	ckpt_plan_destroy(p0);
	ckpt_plan_destroy(p1);
	memset(mem, 0, 8 * sizeof(float));
	t0.shape = g;
	t0.global_offset = zero;
	ck_assert_int_eq(ckpt_plan_create(c, "ov", 0, 2, &t0, 1, &p0), 0);
	ck_assert_msg(ckpt_restore(p0, CKPT_LATEST, NULL, NULL) == 0, "refused: %s",
	              ckpt_last_error(c));
	for (int i = 0; i < 8; i++)
		ck_assert_msg(mem[i] == (float)(100 + i), "h[%d] = %g", i, (double)mem[i]);
	ckpt_plan_destroy(p0);
	ckpt_disconnect(c);
	h_agent_cleanup(&a);
}
END_TEST

/*
 * A plan the newest checkpoint does not cover is an error of the plan
 * (-EINVAL), not a reason to restore an older step that happens to fit,
 * even with fallback asked for.
 */
START_TEST(uncovered_does_not_fall_back)
{
	struct agent_proc a;
	struct ckpt_client *c;
	struct ckpt_plan *p;
	struct ckpt_save *s;
	int64_t g[1] = {8}, half[1] = {4}, off[1] = {0}, step = -1;
	struct ckpt_tensor t = {"h", CKPT_F32, 1, g, NULL, g, off};
	float *mem;
	int rc;

	h_agent_start(&a, NULL);
	c = h_connect(&a);
	ck_assert_int_eq(ckpt_host_alloc(c, 64, (void **)&mem), 0);
	t.data = mem;
	for (int k = 1; k <= 2; k++) { /* step 1 all of "h", step 2 its first half */
		t.shape = k == 1 ? g : half;
		ck_assert_int_eq(ckpt_plan_create(c, "fb", 0, 1, &t, 1, &p), 0);
		ck_assert_int_eq(ckpt_save(p, k, NULL, &s), 0);
		ck_assert_int_eq(ckpt_save_wait(s, CKPT_COMMITTED, 60000), 0);
		ckpt_save_release(s);
		ckpt_plan_destroy(p);
	}
	t.shape = g;
	ck_assert_int_eq(ckpt_plan_create(c, "fb", 0, 1, &t, 1, &p), 0);
	rc = ckpt_restore2(p, CKPT_LATEST, 1, &step, NULL);
	ck_assert_msg(rc == -EINVAL, "restore: %d (step %lld): %s", rc, (long long)step,
	              ckpt_last_error(c));
	ck_assert_msg(strstr(ckpt_last_error(c), "4 of the 8 elements"), "%s", ckpt_last_error(c));
	ckpt_plan_destroy(p);
	ckpt_disconnect(c);
	h_agent_cleanup(&a);
}
END_TEST

/* n agents "n0".. on one shared root, in a new directory (dir: 256 bytes) of their own. */
static void nodes_start(struct agent_proc *a, int n, char *dir)
{
	const char *tmp = getenv("CK_TMPDIR") ? getenv("CK_TMPDIR") : "/tmp";
	char root[300];

	snprintf(dir, 256, "%s/ckrs.XXXXXX", tmp);
	ck_assert(mkdtemp(dir));
	snprintf(root, sizeof(root), "%s/shared", dir);
	for (int i = 0; i < n; i++) {
		char name[8];

		snprintf(name, sizeof(name), "n%d", i);
		h_agent_start_node(&a[i], root, name, NULL);
	}
}

static void nodes_cleanup(struct agent_proc *a, int n, const char *dir)
{
	char cmd[400];

	for (int i = 0; i < n; i++)
		h_agent_cleanup(&a[i]);
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	ck_assert_int_eq(system(cmd), 0);
}

/*
 * Two agents on one shared root: world 4 saved with ranks on both, then
 * restored as world 2 and world 8 with ranks on both, each assembling its
 * boxes from files the other node wrote.
 */
START_TEST(across_nodes)
{
	struct agent_proc a[2];
	char dir[256];

	nodes_start(a, 2, dir);
	run_on(a, 2, "xn", 4, 0, 4, "save", NULL);
	run_on(a, 2, "xn", 2, 0, 2, "restore", NULL);
	run_on(a, 2, "xn", 8, 0, 8, "restore", NULL);
	/* replicas written once across the nodes: each writes its pieces of emb */
	run_on(a, 2, "xd", 4, 0, 4, "dsave", NULL);
	for (int i = 0; i < 2; i++)
		ck_assert_msg(h_log_has(&a[i], "job xd rank") &&
		                  h_log_has(&a[i], "replicas written once: it writes"),
		              "agent %d does not say its ranks write replicas once (%s)", i,
		              a[i].log);
	run_on(a, 2, "xd", 2, 0, 2, "drestore", NULL);
	nodes_cleanup(a, 2, dir);
}
END_TEST

/* show --json's layout of job step 5: rank r's "bytes", "boxes_held"; boxes written n times. */
static json_t *layout_of(const struct agent_proc *a, const char *job, int *version)
{
	static char out[1 << 20];
	json_t *j, *l;

	ck_assert_int_eq(h_ctl(a, out, sizeof(out), "--json show %s 5", job), 0);
	j = json_loads(out, 0, NULL);
	ck_assert_msg(j, "%.400s", out);
	*version = (int)json_integer_value(json_object_get(j, "version"));
	l = json_incref(json_object_get(j, "layout"));
	json_decref(j);
	return l;
}

/* ckptctl status's restores: bytes read for them, bytes into trainers. */
static void status_restores(const struct agent_proc *a, json_int_t *read, json_int_t *delivered)
{
	char out[65536];
	json_t *j, *r;

	ck_assert_int_eq(h_ctl(a, out, sizeof(out), "--json status"), 0);
	j = json_loads(out, 0, NULL);
	ck_assert_msg(j, "%.400s", out);
	r = json_object_get(j, "restores");
	*read = json_integer_value(json_object_get(r, "read_bytes"));
	*delivered = json_integer_value(json_object_get(r, "delivered_bytes"));
	json_decref(j);
}

static json_int_t rank_field(json_t *l, int r, const char *key)
{
	return json_integer_value(
	    json_object_get(json_array_get(json_object_get(l, "ranks"), r), key));
}

/*
 * Replicas written once (the default, copies 1): the 16 MiB "emb" held by
 * all 4 ranks is written once, a quarter by each (step 5; step 4 made the
 * plan set complete); each rank still holds its 5 boxes, the manifest says
 * so (version 3), and world 4 and world 2 restore every byte. With copies
 * 2, each piece is written by two ranks: one copy corrupt, a restore reads
 * the other, and verify says 1 of its 2 copies is good.
 */
START_TEST(replicas_written_once)
{
	const json_int_t own = 4 * (60 + 60 + 3), emb = (json_int_t)RE * CE * 4;
	json_int_t read0, read1, delivered0, delivered1;
	struct agent_proc a;
	char path[512], out[16384], barrier_dir[400];
	json_int_t sum = 0, max = 0;
	json_t *l;
	int version;

	h_agent_start(&a, NULL);
	run_world(&a, "dd", 4, "dsave", NULL);
	l = layout_of(&a, "dd", &version);
	ck_assert_int_eq(version, 3);
	for (int r = 0; r < 4; r++) {
		json_int_t b = rank_field(l, r, "bytes");

		ck_assert_int_eq(rank_field(l, r, "boxes_held"), 5);
		ck_assert_msg(b >= own + emb / 4 && b <= own + emb / 4 + 4 * NB,
		              "rank %d writes %lld bytes", r, (long long)b);
		sum += b;
		max = b > max ? b : max;
	}
	ck_assert_int_eq(sum, 4 * own + emb + 4 * NB); /* every box once */
	ck_assert_ptr_null(json_object_get(json_object_get(l, "boxes_by_copies"), "4"));
	ck_assert_int_eq(json_integer_value(json_object_get(l, "bytes_in_extra_copies")), 0);
	json_decref(l);
	ck_assert(h_log_has(&a, "replicas written once: it writes 4194"));
	/*
	 * read-once: the 4 ranks (each plan made before any restores) restore
	 * together; the agent reads every saved byte once and hands emb to all 4
	 */
	status_restores(&a, &read0, &delivered0);
	snprintf(barrier_dir, sizeof(barrier_dir), "%s/barrier", a.dir);
	ck_assert_int_eq(mkdir(barrier_dir, 0700), 0);
	setenv("RESHARD_BARRIER", barrier_dir, 1);
	run_world(&a, "dd", 4, "drestore", NULL);
	unsetenv("RESHARD_BARRIER");
	status_restores(&a, &read1, &delivered1);
	ck_assert_int_eq(read1 - read0, 4 * own + emb + 4 * NB);
	ck_assert_int_eq(delivered1 - delivered0, 4 * (own + emb + 4 * NB));
	ck_assert(h_log_has(&a, "job dd step 5: 4 ranks of this node restored together"));
	ck_assert(h_log_has(&a, "(read once with 3 other ranks of this node"));
	run_world(&a, "dd", 2, "drestore", NULL);

	/* copies 2: two pieces of emb and the bias, each in two ranks' files */
	run_world(&a, "d2", 4, "dsave2", NULL);
	l = layout_of(&a, "d2", &version);
	ck_assert_int_eq(
	    json_integer_value(json_object_get(json_object_get(l, "boxes_by_copies"), "2")), 3);
	ck_assert_int_eq(json_integer_value(json_object_get(l, "bytes_in_extra_copies")),
	                 emb + 4 * NB);
	json_decref(l);
	h_shard(&a, path, sizeof(path), "d2", 5, 2);
	h_flip_byte(path, chunk_at(&a, "d2", "emb", 2) + 100);
	/* together: the shared read meets the bad chunk, and each rank reads alone after */
	snprintf(barrier_dir, sizeof(barrier_dir), "%s/barrier2", a.dir);
	ck_assert_int_eq(mkdir(barrier_dir, 0700), 0);
	setenv("RESHARD_BARRIER", barrier_dir, 1);
	run_world(&a, "d2", 4, "drestore", NULL);
	unsetenv("RESHARD_BARRIER");
	ck_assert_msg(h_log_has(&a, "job d2 step 5: 4 ranks restoring together: tensor 'emb'") &&
	                  h_log_has(&a, "checksum mismatch") && h_log_has(&a, "each reads alone"),
	              "%s", a.log);
	ck_assert(h_log_has(&a, "restored from other copies"));
	ck_assert_int_ne(h_ctl(&a, out, sizeof(out), "verify d2 5"), 0);
	ck_assert_msg(strstr(out, "tensor 'emb'") && strstr(out, "rank 2's copy is bad; 1 of its 2 "
	                                                         "copies are good"),
	              "%s", out);
	/* rank 2's file gone: the others still restore every byte of emb from the other copy */
	ck_assert_int_eq(unlink(path), 0);
	run_ranks(&a, "d2", 4, 0, 2, "drestore", NULL);
	run_ranks(&a, "d2", 4, 3, 4, "drestore", NULL);
	ck_assert_int_ne(h_ctl(&a, out, sizeof(out), "verify d2 5"), 0);
	ck_assert_msg(strstr(out, "rank 2's copy is bad; 1 of its 2 copies are good"), "%s", out);
	h_agent_cleanup(&a);
}
END_TEST

/*
 * 8 ranks over 4 agents on one shared root, 2 DP x 4 TP: every box written
 * once, by ranks of every node, balanced; world 8 and TP 4 alone restore
 * every byte from files all four nodes wrote.
 */
START_TEST(dp_tp_over_four_nodes)
{
	const json_int_t unique = 2 * (json_int_t)TPR * CE * 4 + 8 * 12;
	struct agent_proc a[4];
	char dir[256];
	json_t *l;
	json_int_t sum = 0;
	int version;

	nodes_start(a, 4, dir);
	run_on(a, 4, "tp", 8, 0, 8, "tpsave", NULL);
	l = layout_of(&a[0], "tp", &version);
	ck_assert_int_eq(version, 4); /* of four nodes, a head: the parts say what ranks hold */
	for (int r = 0; r < 8; r++)
		sum += rank_field(l, r, "bytes");
	ck_assert_int_eq(sum, unique);
	ck_assert_msg(json_real_value(json_object_get(l, "balance")) <= 1.05, "balance %f",
	              json_real_value(json_object_get(l, "balance")));
	json_decref(l);
	run_on(a, 4, "tp", 8, 0, 8, "tprestore", NULL);
	run_on(a, 4, "tp", 4, 0, 4, "tprestore", NULL);
	nodes_cleanup(a, 4, dir);
}
END_TEST

int test_before(int argc, char **argv)
{
	if (argc == 8 && strcmp(argv[1], "--rank") == 0 && strncmp(argv[6], "tp", 2) == 0)
		return tp_main(argv[2], argv[3], atoi(argv[4]), atoi(argv[5]), argv[6]);
	if (argc == 8 && strcmp(argv[1], "--rank") == 0)
		return rank_main(argv[2], argv[3], atoi(argv[4]), atoi(argv[5]), argv[6], argv[7]);
	return TEST_RUN;
}

Suite *test_suite(void)
{
	Suite *s;
	TCase *tc;

	s = suite_create("reshard");
	tc = tcase_create("agent");
	tcase_set_timeout(tc, 240);
	tcase_add_test(tc, other_worlds_and_splits);
	tcase_add_test(tc, box_not_covered);
	tcase_add_test(tc, other_copy_of_a_replica);
	tcase_add_test(tc, own_part_and_another_copy);
	tcase_add_test(tc, uncovered_does_not_fall_back);
	tcase_add_test(tc, across_nodes);
	tcase_add_test(tc, replicas_written_once);
	tcase_add_test(tc, dp_tp_over_four_nodes);
	suite_add_tcase(s, tc);
	return s;
}
