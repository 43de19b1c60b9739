/*
 * Many nodes on one machine: several real agents, each its own node name,
 * socket and staging pool, on one shared root directory; trainer ranks in
 * their own processes, each talking to its node's agent.
 *
 *   - world 8 over 4 agents: every save commits; the manifest lists 8 ranks
 *     and 4 parts; every rank restores LATEST byte-exact, with its own meta
 *   - a node killed in the middle of a save: the others' ranks FAIL at the
 *     deadline naming it; LATEST stays; once it is back the next step commits
 *   - the rank-0 node gone after every part is durable: another node commits
 *     after half the deadline, the same bytes `ckptctl commit --finish` writes
 *   - an agent started on the root while others save removes none of their work
 *   - a part of another run is not merged; a late writer of an old run cannot
 *     change a byte of a committed checkpoint
 *   - hostile input: bad node names; plans and parts files with bad JSON,
 *     wrong sizes, a rank twice: errors name the file, the agents keep serving
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <check.h>
#include <jansson.h>

#include "tests/integration/harness.h"
#include "support/check_main.h"

#define ROWS 1024 /* each rank's rows of "emb", a [world * ROWS, 16] F32 tensor */

/* ---- a trainer rank, in a process of its own --------------------------- */

static float value(long step, int rank, size_t i)
{
	return (float)((step * 131 + rank * 17 + (long)i) % 100003);
}

static uint8_t opt_value(long step, int rank, size_t i)
{
	return (uint8_t)(step * 7 + rank * 3 + (long)i);
}

static void fill(float *emb, uint8_t *opt, size_t optn, long step, int rank)
{
	for (size_t i = 0; i < ROWS * 16; i++)
		emb[i] = value(step, rank, i);
	for (size_t i = 0; i < optn; i++)
		opt[i] = opt_value(step, rank, i);
}

static bool holds(const float *emb, const uint8_t *opt, size_t optn, long step, int rank)
{
	for (size_t i = 0; i < ROWS * 16; i++)
		if (emb[i] != value(step, rank, i))
			return false;
	for (size_t i = 0; i < optn; i++)
		if (opt[i] != opt_value(step, rank, i))
			return false;
	return true;
}

/*
 * --rank ENDPOINT JOB RUN RANK WORLD FIRST LAST MB MODE: saves steps
 * FIRST..LAST, each with meta {"rank": R, "step": S}, and then
 *   commit       waits for COMMITTED each time (exit 20 + what went wrong)
 *   upload       waits for UPLOADED each time (an agent with an upload tier)
 *   expect-fail  waits for FAILED and prints the reason (one step)
 *   hold         does not wait: sleeps until killed
 *   late         as commit, but sleeps 3 s after its plan is made (published)
 *   restore      (no save) restores LATEST (or FIRST, where it is not 0),
 *                checks every byte and its meta, prints the step; where the
 *                restore fails, prints "error -ERRNO: why" and exits 12
 */
static int rank_main(char **v)
{
	const char *endpoint = v[0], *job = v[1], *run = v[2], *mode = v[8];
	int rank = atoi(v[3]), world = atoi(v[4]);
	long first = atol(v[5]), last = atol(v[6]);
	size_t optn = (size_t)atol(v[7]) << 20;
	int64_t gshape[2] = {(int64_t)world * ROWS, 16}, lshape[2] = {ROWS, 16};
	int64_t goff[2] = {(int64_t)rank * ROWS, 0}, oshape[1] = {(int64_t)optn};
	struct ckpt_plan_opts o = CKPT_PLAN_OPTS_INIT;
	struct ckpt_tensor t[2];
	struct ckpt_client *c;
	struct ckpt_plan *p;
	struct ckpt_save *s;
	char name[32], meta[64], *back = NULL;
	int64_t step = -1;
	float *emb;
	uint8_t *opt;
	void *mem;
	int rc;

	snprintf(name, sizeof(name), "opt.rank%d", rank);
	if (ckpt_connect(endpoint, &c) || ckpt_host_alloc(c, ROWS * 16 * 4 + optn, &mem))
		return 10;
	emb = mem;
	opt = (uint8_t *)mem + ROWS * 16 * 4;
	t[0] = (struct ckpt_tensor){"emb", CKPT_F32, 2, lshape, emb, gshape, goff};
	t[1] = (struct ckpt_tensor){name, CKPT_U8, 1, oshape, opt, NULL, NULL};
	o.run = run;
	if (ckpt_plan_create_opts(c, job, rank, world, t, 2, &o, &p))
		return fprintf(stderr, "rank %d: %s\n", rank, ckpt_last_error(c)), 11;
	if (strcmp(mode, "restore") == 0) {
		memset(mem, 0, ROWS * 16 * 4 + optn);
		rc = ckpt_restore(p, first > 0 ? first : CKPT_LATEST, &step, &back);
		if (rc) {
			printf("error %d: %s\n", rc, ckpt_last_error(c));
			return fprintf(stderr, "rank %d: %s\n", rank, ckpt_last_error(c)), 12;
		}
		/* as saved, byte for byte (below) */
		snprintf(meta, sizeof(meta), "{\"rank\": %d, \"step\": %lld}", rank,
		         (long long)step);
		if (!back || strcmp(back, meta) != 0)
			return fprintf(stderr, "rank %d: meta %s, want %s\n", rank,
			               back ? back : "-", meta),
			       13;
		if (!holds(emb, opt, optn, step, rank))
			return fprintf(stderr, "rank %d: bytes differ from step %lld\n", rank,
			               (long long)step),
			       14;
		printf("%lld\n", (long long)step);
		free(back);
		ckpt_plan_destroy(p);
		ckpt_disconnect(c);
		return 0;
	}
	if (strcmp(mode, "late") == 0)
		sleep(3);
	for (long k = first; k <= last; k++) {
		fill(emb, opt, optn, k, rank);
		snprintf(meta, sizeof(meta), "{\"rank\": %d, \"step\": %ld}", rank, k);
		if (ckpt_save(p, k, meta, &s))
			return fprintf(stderr, "rank %d step %ld: %s\n", rank, k,
			               ckpt_last_error(c)),
			       15;
		if (strcmp(mode, "hold") == 0) {
			for (;;)
				pause();
		}
		rc = ckpt_save_wait(s, strcmp(mode, "upload") ? CKPT_COMMITTED : CKPT_UPLOADED,
		                    120000);
		if (strcmp(mode, "expect-fail") == 0) {
			printf("%s\n", rc == -EIO ? ckpt_save_reason(s) : "NOT FAILED");
			fflush(stdout);
			return rc == -EIO ? 0 : 21;
		}
		if (rc)
			return fprintf(stderr, "rank %d step %ld: %d %s\n", rank, k, rc,
			               ckpt_save_reason(s)),
			       20;
		/* the tensors may change once CAPTURED; COMMITTED is later still */
		ckpt_save_release(s);
	}
	ckpt_plan_destroy(p);
	ckpt_disconnect(c);
	return 0;
}

/* A rank process of this program; its stdout on *out_fd if asked. */
static pid_t spawn_rank(const struct agent_proc *a, const char *job, const char *run, int rank,
                        int world, long first, long last, long mb, const char *mode, int *out_fd)
{
	return h_spawn_rank("/proc/self/exe", a, job, run, rank, world, first, last, mb, mode,
	                    out_fd, false);
}

#define read_all h_read_all

/* ---- a cluster on one machine ------------------------------------------ */

#define MAXN 8

struct cluster {
	char dir[256], root[300];
	struct agent_proc a[MAXN];
	int n;
};

static void cluster_start(struct cluster *c, int n, const char *args)
{
	const char *tmp = getenv("CK_TMPDIR") ? getenv("CK_TMPDIR") : "/tmp";

	memset(c, 0, sizeof(*c));
	snprintf(c->dir, sizeof(c->dir), "%s/ckcl.XXXXXX", tmp);
	ck_assert_msg(mkdtemp(c->dir), "mkdtemp: %s", strerror(errno));
	snprintf(c->root, sizeof(c->root), "%s/shared", c->dir);
	c->n = n;
	for (int i = 0; i < n; i++) {
		char node[16];

		snprintf(node, sizeof(node), "n%d", i);
		h_agent_start_node(&c->a[i], c->root, node, args);
	}
}

static void cluster_cleanup(struct cluster *c)
{
	char cmd[400];

	for (int i = 0; i < c->n; i++)
		h_agent_cleanup(&c->a[i]);
	if (getenv("CKPT_TEST_KEEP"))
		return;
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", c->dir);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", c->dir);
}

/* Ranks 2i and 2i+1 on node i: saves first..last, waits for COMMITTED. */
static void save_all(struct cluster *c, const char *job, const char *run, int world, long first,
                     long last)
{
	pid_t pid[2 * MAXN];

	for (int r = 0; r < world; r++)
		pid[r] = spawn_rank(&c->a[r * c->n / world], job, run, r, world, first, last, 1,
		                    "commit", NULL);
	for (int r = 0; r < world; r++)
		ck_assert_msg(h_reap(pid[r]) == 0,
		              "rank %d of job %s (steps %ld..%ld) did not commit", r, job, first,
		              last);
}

/* Every rank restores LATEST through its own agent; the step they all got. */
static long restore_all(struct cluster *c, const char *job, const char *run, int world)
{
	pid_t pid[2 * MAXN];
	int fd[2 * MAXN];
	char out[64];
	long step = -2;

	for (int r = 0; r < world; r++)
		pid[r] = spawn_rank(&c->a[r * c->n / world], job, run, r, world, 0, 0, 1, "restore",
		                    &fd[r]);
	for (int r = 0; r < world; r++) {
		read_all(fd[r], out, sizeof(out));
		ck_assert_msg(h_reap(pid[r]) == 0, "rank %d could not restore LATEST byte-exact",
		              r);
		ck_assert_msg(step == -2 || step == atol(out), "ranks restored different steps");
		step = atol(out);
	}
	return step;
}

static json_t *manifest_of(struct cluster *c, const char *job, long step)
{
	char p[512];

	snprintf(p, sizeof(p), "%s/%s/step-%012ld/manifest.json", c->root, job, step);
	return h_manifest_load(p);
}

static long latest_of(struct cluster *c, const char *job)
{
	char p[512], buf[32] = "";
	FILE *f;

	snprintf(p, sizeof(p), "%s/%s/LATEST", c->root, job);
	f = fopen(p, "r");
	if (!f)
		return -1;
	if (!fgets(buf, sizeof(buf), f))
		buf[0] = '\0';
	fclose(f);
	return atol(buf);
}

/* Whether <root>/<job>/step-<step>/<leaf> is there. */
static bool in_step(struct cluster *c, const char *job, long step, const char *leaf)
{
	char p[600];
	struct stat st;

	snprintf(p, sizeof(p), "%s/%s/step-%012ld/%s", c->root, job, step, leaf);
	return lstat(p, &st) == 0;
}

static bool part_exists(struct cluster *c, const char *job, long step, const char *node)
{
	char leaf[128];

	snprintf(leaf, sizeof(leaf), "parts/%s.json", node);
	return in_step(c, job, step, leaf);
}

/* Waits (polling) up to ms for a node's part of (job, step) to be in the root. */
static bool wait_part(struct cluster *c, const char *job, long step, const char *node, int ms)
{
	for (int i = 0; i < ms / 5; i++) {
		if (part_exists(c, job, step, node))
			return true;
		usleep(5000);
	}
	return false;
}

static char *slurp(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	char *buf = NULL;
	long n;

	if (!f)
		return NULL;
	fseek(f, 0, SEEK_END);
	n = ftell(f);
	fseek(f, 0, SEEK_SET);
	buf = malloc((size_t)n + 1);
	if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
		free(buf);
		buf = NULL;
	}
	if (buf)
		buf[n] = '\0';
	*len = (size_t)n;
	fclose(f);
	return buf;
}

/* ---- world 8 over 4 nodes ---------------------------------------------- */

/* How many ranks of a manifest (h_manifest_load) hold a chunk of "emb". */
static size_t emb_chunks(json_t *m)
{
	size_t i, n = 0;
	json_t *k;

	json_array_foreach(json_object_get(m, "ranks"), i, k) n +=
	    json_object_get(json_object_get(k, "tensors"), "emb") != NULL;
	return n;
}

START_TEST(world8_four_nodes)
{
	struct cluster c;
	char out[65536];
	json_t *m, *parts;

	cluster_start(&c, 4, NULL);
	save_all(&c, "w8", "r1", 8, 1, 3);
	for (long step = 1; step <= 3; step++) {
		m = manifest_of(&c, "w8", step);
		ck_assert_int_eq(json_array_size(json_object_get(m, "ranks")), 8);
		parts = json_object_get(m, "parts");
		ck_assert_int_eq(json_array_size(parts), 4);
		ck_assert_str_eq(
		    json_string_value(json_object_get(json_array_get(parts, 2), "node")), "n2");
		ck_assert_int_eq(
		    json_array_size(json_object_get(json_array_get(parts, 2), "ranks")), 2);
		ck_assert_str_eq(json_string_value(json_object_get(m, "run")), "r1");
		/* a head: its parts named by their bytes, each rank's chunk of emb in its part */
		ck_assert_int_eq(json_integer_value(json_object_get(m, "version")), 4);
		ck_assert(json_is_string(json_object_get(json_array_get(parts, 2), "xxh3")));
		ck_assert_int_eq(emb_chunks(m), 8);
		/* each rank's meta is its own */
		ck_assert_int_eq(
		    json_integer_value(json_object_get(
		        json_object_get(json_array_get(json_object_get(m, "ranks"), 5), "meta"),
		        "rank")),
		    5);
		json_decref(m);
	}
	ck_assert_int_eq(latest_of(&c, "w8"), 3);
	ck_assert_int_eq(restore_all(&c, "w8", "r1", 8), 3);
	/* every node lists the commits, and shows the nodes and ranks in them */
	for (int i = 0; i < 4; i++) {
		ck_assert(h_wait_state(&c.a[i], "w8", 3, "COMMITTED", 10000));
		ck_assert_int_eq(h_ctl(&c.a[i], out, sizeof(out), "show w8 3"), 0);
		ck_assert_msg(strstr(out, "n3 (ranks 6,7)"), "%s", out);
	}
	ck_assert_int_eq(h_ctl(&c.a[1], out, sizeof(out), "verify w8 2"), 0);
	cluster_cleanup(&c);
}
END_TEST

/* ---- a node killed mid-save -------------------------------------------- */

START_TEST(node_killed_mid_save)
{
	struct cluster c;
	char why[4096], out[65536];
	pid_t pid[8];
	int fd[8];
	long step = 2;
	bool lost_race = true;

	cluster_start(&c, 4, "--staging-mb 32 --chunk-mb 1 --commit-deadline 4");
	save_all(&c, "k", "r", 8, 1, 1);
	/* node 2 saves a lot, slowly; the others little. Killed while its ranks write. */
	for (int tries = 0; lost_race && tries < 3; tries++, step++) {
		for (int r = 0; r < 8; r++)
			pid[r] = spawn_rank(&c.a[r / 2], "k", "r", r, 8, step, step,
			                    r / 2 == 2 ? 256 : 1,
			                    r / 2 == 2 ? "hold" : "expect-fail", &fd[r]);
		ck_assert(h_wait_state(&c.a[2], "k", step, "IN_FLIGHT", 30000));
		h_agent_kill(&c.a[2]);
		kill(pid[4], SIGKILL);
		kill(pid[5], SIGKILL);
		lost_race = part_exists(&c, "k", step, "n2"); /* it finished first: again */
		for (int r = 0; r < 8; r++) {
			read_all(fd[r], why, sizeof(why));
			h_reap(pid[r]);
			if (!lost_race && r / 2 != 2)
				ck_assert_msg(strstr(why, "no part from node n2 (ranks 4,5)") &&
				                  strstr(why, "after 4 s"),
				              "rank %d: %s", r, why);
		}
		h_agent_restart(&c.a[2]);
	}
	ck_assert_msg(!lost_race, "node 2 finished its save before every kill");
	step--;
	ck_assert_int_eq(latest_of(&c, "k"), 1);
	ck_assert(!in_step(&c, "k", step, "manifest.json"));
	/* never listed as committed */
	ck_assert_int_eq(h_ctl(&c.a[0], out, sizeof(out), "--json list k"), 0);
	{
		json_t *j = json_loads(out, 0, NULL), *e;
		size_t i;

		ck_assert_ptr_nonnull(j);
		json_array_foreach(json_object_get(j, "checkpoints"), i, e) ck_assert_msg(
		    json_integer_value(json_object_get(e, "step")) != step ||
		        strcmp(json_string_value(json_object_get(e, "state")), "COMMITTED") != 0,
		    "step %ld listed committed", step);
		json_decref(j);
	}
	/* metrics and counters aside: back, the next step commits */
	save_all(&c, "k", "r", 8, step + 1, step + 1);
	ck_assert_int_eq(latest_of(&c, "k"), step + 1);
	ck_assert_int_eq(restore_all(&c, "k", "r", 8), step + 1);
	cluster_cleanup(&c);
}
END_TEST

/* ---- the rank-0 node gone after every part is durable ------------------- */

START_TEST(rank0_node_lost_after_parts)
{
	struct cluster c;
	char mpath[512], moved[520], out[8192];
	char *first, *again;
	size_t len, len2;
	pid_t pid[4];

	cluster_start(&c, 2, "--staging-mb 32 --chunk-mb 1 --commit-deadline 6");
	save_all(&c, "t", "r", 4, 1, 1);
	/* n0 (ranks 0, 1) writes its part, then stops before anything else arrives */
	pid[0] = spawn_rank(&c.a[0], "t", "r", 0, 4, 2, 2, 1, "hold", NULL);
	pid[1] = spawn_rank(&c.a[0], "t", "r", 1, 4, 2, 2, 1, "hold", NULL);
	ck_assert(wait_part(&c, "t", 2, "n0", 30000));
	kill(c.a[0].pid, SIGSTOP);
	pid[2] = spawn_rank(&c.a[1], "t", "r", 2, 4, 2, 2, 1, "commit", NULL);
	pid[3] = spawn_rank(&c.a[1], "t", "r", 3, 4, 2, 2, 1, "commit", NULL);
	/* n1 commits, after half the deadline, without n0 */
	ck_assert_msg(h_reap(pid[2]) == 0 && h_reap(pid[3]) == 0, "n1's ranks did not commit");
	h_agent_kill(&c.a[0]);
	kill(pid[0], SIGKILL);
	kill(pid[1], SIGKILL);
	h_reap(pid[0]);
	h_reap(pid[1]);
	ck_assert_int_eq(latest_of(&c, "t"), 2);
	ck_assert(h_log_has(&c.a[1], "committed job t step 2 (run r): 4 ranks from 2 nodes"));
	/* by hand, from the same parts: the same bytes */
	snprintf(mpath, sizeof(mpath), "%s/t/step-%012d/manifest.json", c.root, 2);
	first = slurp(mpath, &len);
	ck_assert_ptr_nonnull(first);
	snprintf(moved, sizeof(moved), "%s.away", mpath);
	ck_assert_int_eq(rename(mpath, moved), 0);
	ck_assert_int_eq(h_ctl(&c.a[1], out, sizeof(out), "commit --finish t 2"), 0);
	ck_assert_msg(strstr(out, "committed: run r, world 4"), "%s", out);
	again = slurp(mpath, &len2);
	ck_assert_ptr_nonnull(again);
	ck_assert_uint_eq(len, len2);
	ck_assert_msg(memcmp(first, again, len) == 0, "commit --finish wrote other bytes");
	/* again: already committed, nothing written */
	ck_assert_int_eq(h_ctl(&c.a[1], out, sizeof(out), "commit --finish t 2"), 0);
	ck_assert_msg(strstr(out, "was already committed"), "%s", out);
	ck_assert_int_eq(h_ctl(&c.a[1], out, sizeof(out), "verify t 2"), 0);
	/* n0 back: it finds its saves of step 2 committed, the next step commits */
	h_agent_restart(&c.a[0]);
	save_all(&c, "t", "r", 4, 3, 3);
	ck_assert_int_eq(restore_all(&c, "t", "r", 4), 3);
	free(first);
	free(again);
	unlink(moved);
	cluster_cleanup(&c);
}
END_TEST

/* ---- an agent started while others save -------------------------------- */

START_TEST(start_spares_others)
{
	struct cluster c;
	struct agent_proc late;
	char shard[600];
	pid_t p0, p1;

	cluster_start(&c, 2, NULL);
	/* n0's rank saves step 5 (its part written); n1's has made its plan, not saved yet */
	p1 = spawn_rank(&c.a[1], "s", "r", 1, 2, 5, 5, 1, "late", NULL);
	p0 = spawn_rank(&c.a[0], "s", "r", 0, 2, 5, 5, 1, "commit", NULL);
	ck_assert(wait_part(&c, "s", 5, "n0", 30000));
	snprintf(shard, sizeof(shard), "%s/s/step-%012d/rank-00000.n0.0.safetensors", c.root, 5);
	ck_assert(access(shard, F_OK) == 0);
	/* a third node starts on the root: it cleans up, and spares all of that */
	h_agent_start_node(&late, c.root, "n9", NULL);
	ck_assert_msg(access(shard, F_OK) == 0, "n0's shard of a step in flight was removed");
	ck_assert(part_exists(&c, "s", 5, "n0"));
	ck_assert_int_eq(h_reap(p0), 0);
	ck_assert_int_eq(h_reap(p1), 0);
	ck_assert_int_eq(restore_all(&c, "s", "r", 2), 5);
	h_agent_cleanup(&late);
	cluster_cleanup(&c);
}
END_TEST

/* ---- runs --------------------------------------------------------------- */

/* Another run's part (a test writes one) is not merged; the node's own replaces it. */
START_TEST(other_run_part_refused)
{
	struct cluster c;
	char p[600], q[600], out[65536];
	json_t *part, *m;
	pid_t p0, p1;

	cluster_start(&c, 2, NULL);
	save_all(&c, "o", "old", 2, 1, 1);
	/* n1's part of step 1 (run old), planted as its part of step 2 */
	snprintf(p, sizeof(p), "%s/o/step-%012d/parts/n1.json", c.root, 1);
	part = json_load_file(p, 0, NULL);
	ck_assert_ptr_nonnull(part);
	json_object_set_new(part, "step", json_integer(2));
	snprintf(q, sizeof(q), "%s/o/step-%012d", c.root, 2);
	ck_assert_int_eq(mkdir(q, 0755), 0);
	strcat(q, "/parts");
	ck_assert_int_eq(mkdir(q, 0755), 0);
	strcat(q, "/n1.json");
	ck_assert_int_eq(json_dump_file(part, q, 0), 0);
	json_decref(part);
	p1 = spawn_rank(&c.a[1], "o", "new", 1, 2, 2, 2, 1, "late", NULL);
	p0 = spawn_rank(&c.a[0], "o", "new", 0, 2, 2, 2, 1, "commit", NULL);
	ck_assert(wait_part(&c, "o", 2, "n0", 30000));
	usleep(300000);
	ck_assert(!in_step(&c, "o", 2, "manifest.json"));
	ck_assert_int_eq(h_ctl(&c.a[0], out, sizeof(out), "list o"), 0);
	ck_assert_msg(strstr(out, "missing: n1 (rank 1)"), "the old part is not counted: %s", out);
	ck_assert_int_eq(h_reap(p0), 0);
	ck_assert_int_eq(h_reap(p1), 0);
	m = manifest_of(&c, "o", 2);
	ck_assert_str_eq(json_string_value(json_object_get(m, "run")), "new");
	json_decref(m);
	ck_assert_int_eq(h_ctl(&c.a[1], out, sizeof(out), "verify o 2"), 0);
	cluster_cleanup(&c);
}
END_TEST

/*
 * A writer of an old run, stopped in the middle of a save, comes back after
 * a new run committed the step: it changes no byte of the checkpoint, and
 * its save fails saying why.
 */
START_TEST(late_writer_changes_nothing)
{
	struct cluster c;
	char mpath[512], file[600], why[4096], out[8192], *m1, *s1, *m2, *s2;
	size_t lm1, ls1, lm2, ls2;
	json_t *m;
	pid_t old, now;
	int fd;

	cluster_start(&c, 2, "--staging-mb 32 --chunk-mb 1 --commit-deadline 20");
	/* run "a" on n0: stopped once its shard exists */
	old = spawn_rank(&c.a[0], "l", "a", 0, 1, 5, 5, 64, "expect-fail", &fd);
	snprintf(file, sizeof(file), "%s/l/step-%012d/rank-00000.n0.0.safetensors", c.root, 5);
	for (int i = 0; i < 6000 && access(file, F_OK) != 0; i++)
		usleep(5000);
	kill(c.a[0].pid, SIGSTOP);
	ck_assert(!part_exists(&c, "l", 5, "n0"));
	/* run "b" on n1 saves the same step and commits it */
	now = spawn_rank(&c.a[1], "l", "b", 0, 1, 5, 5, 64, "commit", NULL);
	ck_assert_int_eq(h_reap(now), 0);
	m = manifest_of(&c, "l", 5);
	ck_assert_str_eq(json_string_value(json_object_get(m, "run")), "b");
	snprintf(file, sizeof(file), "%s/l/step-%012d/%s", c.root, 5,
	         json_string_value(
	             json_object_get(json_array_get(json_object_get(m, "ranks"), 0), "file")));
	json_decref(m);
	ck_assert_msg(strstr(file, ".n1.0.safetensors"), "%s", file);
	snprintf(mpath, sizeof(mpath), "%s/l/step-%012d/manifest.json", c.root, 5);
	m1 = slurp(mpath, &lm1);
	s1 = slurp(file, &ls1);
	kill(c.a[0].pid, SIGCONT);
	read_all(fd, why, sizeof(why));
	ck_assert_int_eq(h_reap(old), 0);
	ck_assert_msg(strstr(why, "committed by run b of the job, without this save (run a)"), "%s",
	              why);
	m2 = slurp(mpath, &lm2);
	s2 = slurp(file, &ls2);
	ck_assert(lm1 == lm2 && memcmp(m1, m2, lm1) == 0);
	ck_assert(ls1 == ls2 && memcmp(s1, s2, ls1) == 0);
	ck_assert_int_eq(h_ctl(&c.a[1], out, sizeof(out), "verify l 5"), 0);
	/* and the old run's files, named by nothing, are gone */
	snprintf(file, sizeof(file), "%s/l/step-%012d/rank-00000.n0.0.safetensors", c.root, 5);
	for (int i = 0; i < 200 && access(file, F_OK) == 0; i++)
		usleep(10000);
	ck_assert_msg(access(file, F_OK) != 0, "n0's dead shard stayed");
	free(m1);
	free(m2);
	free(s1);
	free(s2);
	cluster_cleanup(&c);
}
END_TEST

/*
 * A restart (a new run) comes back to a step the dead run was saving here:
 * the old run's save of it, failed, stands in nobody's way.
 */
START_TEST(new_run_same_step)
{
	struct cluster c;
	pid_t old, p0, p1;

	cluster_start(&c, 1, NULL);
	old = spawn_rank(&c.a[0], "nr", "a", 0, 2, 5, 5, 1, "hold", NULL);
	ck_assert(h_wait_state(&c.a[0], "nr", 5, "IN_FLIGHT", 30000));
	kill(old, SIGKILL);
	h_reap(old);
	p0 = spawn_rank(&c.a[0], "nr", "b", 0, 2, 5, 5, 1, "commit", NULL);
	p1 = spawn_rank(&c.a[0], "nr", "b", 1, 2, 5, 5, 1, "commit", NULL);
	ck_assert_int_eq(h_reap(p0), 0);
	ck_assert_int_eq(h_reap(p1), 0);
	ck_assert_int_eq(restore_all(&c, "nr", "b", 2), 5);
	cluster_cleanup(&c);
}
END_TEST

/* Waits up to ms for (job, step) to be gone from the root (a GC on some node). */
static bool wait_gone(struct cluster *c, const char *job, long step, int ms)
{
	for (int i = 0; i < ms / 10; i++) {
		if (!in_step(c, job, step, "manifest.json"))
			return true;
		usleep(10000);
	}
	return false;
}

/*
 * A pin set through one node's agent keeps the step from the retention of
 * the node that commits (and GCs); unpinned there, it goes at the next GC.
 */
START_TEST(pin_through_another_node)
{
	struct cluster c;
	char out[4096];

	cluster_start(&c, 2, "--staging-mb 32 --chunk-mb 1 --keep-last 1");
	save_all(&c, "pn", "r", 2, 1, 1);
	ck_assert_msg(h_ctl(&c.a[1], out, sizeof(out), "pin pn 1") == 0, "%s", out);
	save_all(&c, "pn", "r", 2, 2, 4);
	ck_assert_msg(wait_gone(&c, "pn", 3, 20000), "retention runs (step 3 goes)");
	ck_assert_msg(in_step(&c, "pn", 1, "manifest.json") && in_step(&c, "pn", 1, "pinned"),
	              "step 1, pinned through n1, is kept by n0's retention");
	ck_assert(!in_step(&c, "pn", 2, "manifest.json"));
	ck_assert_msg(h_ctl(&c.a[1], out, sizeof(out), "unpin pn 1") == 0, "%s", out);
	save_all(&c, "pn", "r", 2, 5, 5);
	ck_assert_msg(wait_gone(&c, "pn", 1, 20000), "unpinned through n1, step 1 goes");
	ck_assert(in_step(&c, "pn", 5, "manifest.json"));
	cluster_cleanup(&c);
}
END_TEST

/* ---- hostile input ------------------------------------------------------- */

START_TEST(bad_node_names)
{
	static const char *const bad[] = {"a/b", "..", "", "n\x01"};
	char cmd[12000], node[10001];

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]) + 1; i++) {
		const char *n = i < sizeof(bad) / sizeof(bad[0]) ? bad[i] : node;
		FILE *p;
		int st;

		memset(node, 'n', sizeof(node) - 1);
		node[sizeof(node) - 1] = '\0';
		snprintf(cmd, sizeof(cmd),
		         "%s --config /dev/null --root /nonexistent/x --listen unix:/nonexistent/s "
		         "--node '%s' 2>&1",
		         CKPTD_BIN, n);
		p = popen(cmd, "r");
		ck_assert_ptr_nonnull(p);
		cmd[fread(cmd, 1, sizeof(cmd) - 1, p)] = '\0';
		st = pclose(p);
		ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 2, "node '%.20s': %d", n, st);
		ck_assert_msg(strstr(cmd, "node name"), "node '%.20s': %s", n, cmd);
		ck_assert_uint_lt(strlen(cmd), 600);
	}
}
END_TEST

/* A second agent under a node name already running on the root is refused; others go on. */
START_TEST(same_node_refused)
{
	struct cluster c;
	char cmd[2000];
	FILE *p;
	int st;

	cluster_start(&c, 1, NULL);
	/* one that starts anyway is stopped after 30 s (timeout's 124), not waited for */
	snprintf(cmd, sizeof(cmd),
	         "timeout 30 %s --config /dev/null --root '%s' --listen 'unix:%s/second.sock' "
	         "--node n0 --staging-mb 16 2>&1",
	         CKPTD_BIN, c.root, c.dir);
	p = popen(cmd, "r");
	ck_assert_ptr_nonnull(p);
	cmd[fread(cmd, 1, sizeof(cmd) - 1, p)] = '\0';
	st = pclose(p);
	ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) != 0 && WEXITSTATUS(st) != 124,
	              "a second n0 started: %s", cmd);
	ck_assert_msg(strstr(cmd, "another agent runs as node n0"), "%s", cmd);
	save_all(&c, "sn", "r", 1, 1, 1); /* the first is unharmed */
	cluster_cleanup(&c);
}
END_TEST

/* Writes text as <root>/<job>/<rel>, making the directories. */
static void plant(struct cluster *c, const char *job, const char *rel, const char *text)
{
	char p[700], cmd[800];
	FILE *f;

	snprintf(p, sizeof(p), "%s/%s/%s", c->root, job, rel);
	snprintf(cmd, sizeof(cmd), "mkdir -p \"$(dirname '%s')\"", p);
	ck_assert_int_eq(system(cmd), 0);
	f = fopen(p, "w");
	ck_assert_ptr_nonnull(f);
	fputs(text, f);
	fclose(f);
}

/*
 * What another node left in the root is input: garbage plans, garbage or
 * lying parts. Each save fails at the deadline with the file named; the
 * agents keep serving; a good step commits afterwards.
 */
START_TEST(hostile_files)
{
	static const struct {
		const char *rel, *text, *says;
	} cases[] = {
	    {"plans/n1.json", "{not json", "no node has published plans for them (run r)"},
	    {"step-000000000004/parts/n1.json", "[1,2]",
	     "parts/n1.json: part: is not a JSON object"},
	    {NULL, "ranks", "parts/n1.json: part: rank 1 is outside world 2, or twice"},
	    {NULL, "size", "rank-00001.n1.0.safetensors is "}, /* N bytes, not M */
	};
	struct cluster c;
	char why[4096], out[4096], p[600];
	int fd;

	cluster_start(&c, 2, "--staging-mb 32 --chunk-mb 1 --commit-deadline 3");
	save_all(&c, "h", "r", 2, 1, 1);
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		long step = 3 + (long)i;
		pid_t pr;

		if (i == 0) {
			/*
			 * n1's plans and their summary unreadable: n0, just started,
			 * cannot tell where rank 1 is (a summary that reads well is
			 * enough: the parts hold the data)
			 */
			plant(&c, "h", cases[i].rel, cases[i].text);
			plant(&c, "h", "plans/n1.sum", cases[i].text);
			h_agent_stop(&c.a[0]);
			h_agent_restart(&c.a[0]);
		} else if (i == 1) {
			plant(&c, "h", cases[i].rel, cases[i].text);
		} else {
			/* n1's part of step 1, edited: a rank twice, or a size that lies */
			json_t *part;

			snprintf(p, sizeof(p), "%s/h/step-%012d/parts/n1.json", c.root, 1);
			part = json_load_file(p, 0, NULL);
			ck_assert_ptr_nonnull(part);
			json_object_set_new(part, "step", json_integer(step));
			{ /* written now, as its node would have */
				struct timespec ts;

				clock_gettime(CLOCK_REALTIME, &ts);
				json_object_set_new(
				    part, "time_unix_ns",
				    json_integer((json_int_t)ts.tv_sec * 1000000000 + ts.tv_nsec));
			}
			if (i == 2)
				json_array_append(
				    json_object_get(part, "ranks"),
				    json_array_get(json_object_get(part, "ranks"), 0));
			else {
				json_t *k = json_array_get(json_object_get(part, "ranks"), 0);

				json_object_set_new(
				    k, "size",
				    json_integer(json_integer_value(json_object_get(k, "size")) +
				                 4096));
			}
			snprintf(p, sizeof(p), "step-%012ld/parts/n1.json", step);
			{
				char *text = json_dumps(part, 0);

				plant(&c, "h", p, text);
				free(text);
			}
			json_decref(part);
			if (i == 3) { /* and the shards it names */
				char cmd[1400];

				snprintf(cmd, sizeof(cmd),
				         "cp %s/h/step-%012d/rank-00001.n1.0.safetensors "
				         "%s/h/step-%012ld/",
				         c.root, 1, c.root, step);
				ck_assert_int_eq(system(cmd), 0);
			}
		}
		pr = spawn_rank(&c.a[0], "h", "r", 0, 2, step, step, 1, "expect-fail", &fd);
		read_all(fd, why, sizeof(why));
		ck_assert_int_eq(h_reap(pr), 0);
		ck_assert_msg(strstr(why, cases[i].says), "case %zu: %s", i, why);
		if (i == 0)
			ck_assert_msg(strstr(why, "plans/n1.json: plans: not valid JSON"), "%s",
			              why);
		ck_assert_int_eq(h_ctl(&c.a[0], out, sizeof(out), "status"), 0);
		if (i == 0) { /* plans back: n1 publishes them again when a plan of its changes */
			snprintf(p, sizeof(p), "%s/h/plans/n1.json", c.root);
			unlink(p);
			save_all(&c, "h", "r", 2, 2, 2);
		}
	}
	save_all(&c, "h", "r", 2, 10, 10);
	ck_assert_int_eq(restore_all(&c, "h", "r", 2), 10);
	cluster_cleanup(&c);
}
END_TEST

/*
 * A replayed part: n1's committed part of step 1, copied as step 2's with
 * its step and time rewritten, in the root before n1 writes its own (n1's
 * shard is written whole, its fsync held). Its sizes fit n1's step-2 file,
 * but the file's header is stamped with step 2's save: it never joins.
 * The step commits once n1's own part is in, with n1's save, and verifies.
 */
START_TEST(replayed_part_refused)
{
	struct cluster c;
	char p[600], out[8192];
	json_t *part, *m1, *m2;

	cluster_start(&c, 2, "--staging-mb 32 --chunk-mb 1 --commit-deadline 30");
	save_all(&c, "rp", "r", 2, 1, 1);
	ck_assert_int_eq(h_agent_stop(&c.a[1]), 0);
	snprintf(c.a[1].env, sizeof(c.a[1].env),
	         "CKPT_FAULTS=io_fsync:slow=4000:path=*/rp/step-000000000002/rank-00001*");
	h_agent_restart(&c.a[1]);
	snprintf(p, sizeof(p), "%s/rp/step-%012d/parts/n1.json", c.root, 1);
	part = json_load_file(p, 0, NULL);
	ck_assert_ptr_nonnull(part);
	json_object_set_new(part, "step", json_integer(2));
	{ /* written now, as its node would have */
		struct timespec ts;
		char *text;

		clock_gettime(CLOCK_REALTIME, &ts);
		json_object_set_new(part, "time_unix_ns",
		                    json_integer((json_int_t)ts.tv_sec * 1000000000 + ts.tv_nsec));
		text = json_dumps(part, 0);
		plant(&c, "rp", "step-000000000002/parts/n1.json", text);
		free(text);
	}
	json_decref(part);
	save_all(&c, "rp", "r", 2, 2, 2);
	m1 = manifest_of(&c, "rp", 1);
	m2 = manifest_of(&c, "rp", 2);
	ck_assert_str_ne(json_string_value(json_object_get(
	                     json_array_get(json_object_get(m2, "ranks"), 1), "save")),
	                 json_string_value(json_object_get(
	                     json_array_get(json_object_get(m1, "ranks"), 1), "save")));
	json_decref(m1);
	json_decref(m2);
	ck_assert_int_eq(h_ctl(&c.a[0], out, sizeof(out), "verify rp 2"), 0);
	ck_assert_msg(strstr(out, "OK"), "%s", out);
	ck_assert_msg(h_log_has(&c.a[0], "committed"), "%s", c.a[0].log);
	cluster_cleanup(&c);
}
END_TEST

int test_before(int argc, char **argv)
{
	if (argc == 11 && strcmp(argv[1], "--rank") == 0)
		return rank_main(argv + 2);
	signal(SIGPIPE, SIG_IGN);
	return TEST_RUN;
}

Suite *test_suite(void)
{
	Suite *s;
	TCase *tc;

	s = suite_create("cluster");
	tc = tcase_create("cluster");
	tcase_set_timeout(tc, 600);
	tcase_add_test(tc, world8_four_nodes);
	tcase_add_test(tc, node_killed_mid_save);
	tcase_add_test(tc, rank0_node_lost_after_parts);
	tcase_add_test(tc, start_spares_others);
	tcase_add_test(tc, other_run_part_refused);
	tcase_add_test(tc, late_writer_changes_nothing);
	tcase_add_test(tc, new_run_same_step);
	tcase_add_test(tc, pin_through_another_node);
	tcase_add_test(tc, bad_node_names);
	tcase_add_test(tc, same_node_refused);
	tcase_add_test(tc, hostile_files);
	tcase_add_test(tc, replayed_part_refused);
	suite_add_tcase(s, tc);
	return s;
}
