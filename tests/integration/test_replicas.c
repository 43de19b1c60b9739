/*
 * Replicas written once from a run's first save (docs/DESIGN.md §7.4):
 * data-parallel replicas on agents of one shared root, the agents started
 * one after another, each node's trainers as soon as their agent serves,
 * every trainer saving at once.
 *
 *   - 4 replicas on 4 agents, and 8 on 4 (two a node): the first save of
 *     the run waits for every rank's plan, and its shards hold each
 *     replicated box once (the manifest's shard bytes within 5 % of the
 *     unique bytes, no box in an extra copy); rank 0's node alone reads
 *     the plans, writes each node's share, and commits by the assignment
 *     it made, reading no part whole
 *   - a node that comes after --plans-wait: the first node's save goes on
 *     writing every replica it holds and says so; the step commits (the
 *     other node's share is covered), and the first node learns the plan
 *     set before its trainer's next save
 *   - a step's end where no plans file changed reads none: one look at the
 *     job's plans generation
 *   - a save parked for its plan set is answered when the agent stops
 *   - with faults put in (CKPT_FAULTS): rank 0's node that cannot write the
 *     shares leaves the others to read the plans themselves after half the
 *     commit deadline, and tries again after a back-off that grows; one that
 *     fails once to read a summary, to write a share or to put its own
 *     plans file tries again, and the replicas are still written once
 */
#define _GNU_SOURCE
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

#define ROWS 1024
#define COLS 4096 /* "emb" [ROWS, COLS] F32, replicated on every rank: 16 MiB */
#define OWN 1000 /* "own.rankR" [OWN] F32, each rank's alone */
#define EMB_BYTES ((long long)ROWS * COLS * 4)

/* ---- a trainer rank: --rank ENDPOINT JOB RANK WORLD LAST ------------- */

/* Plans emb and its own tensor, saves steps 1 to LAST, each to COMMITTED. */
static int rank_main(char **v)
{
	const char *endpoint = v[0], *job = v[1];
	const int rank = atoi(v[2]), world = atoi(v[3]);
	const long last = atol(v[4]);
	int64_t shape[2] = {ROWS, COLS}, off[2] = {0, 0}, oshape[1] = {OWN};
	struct ckpt_tensor t[2];
	struct ckpt_client *c;
	struct ckpt_plan *p;
	struct ckpt_save *s;
	char name[32];
	float *mem;

	snprintf(name, sizeof(name), "own.rank%d", rank);
	if (ckpt_connect(endpoint, &c) ||
	    ckpt_host_alloc(c, (size_t)EMB_BYTES + OWN * 4, (void **)&mem))
		return 10;
	for (size_t i = 0; i < (size_t)ROWS * COLS + OWN; i++)
		mem[i] = (float)(i % 9973) + (i >= (size_t)ROWS * COLS ? (float)rank : 0);
	t[0] = (struct ckpt_tensor){"emb", CKPT_F32, 2, shape, mem, shape, off};
	t[1] = (struct ckpt_tensor){name, CKPT_F32, 1, oshape, mem + ROWS * COLS, NULL, NULL};
	if (ckpt_plan_create(c, job, rank, world, t, 2, &p))
		return fprintf(stderr, "rank %d: %s\n", rank, ckpt_last_error(c)), 11;
	for (long k = 1; k <= last; k++) {
		if (ckpt_save(p, k, NULL, &s))
			return fprintf(stderr, "rank %d step %ld: %s\n", rank, k,
			               ckpt_last_error(c)),
			       12;
		if (ckpt_save_wait(s, CKPT_COMMITTED, 120000))
			return fprintf(stderr, "rank %d step %ld: %s\n", rank, k,
			               ckpt_save_reason(s)),
			       13;
		ckpt_save_release(s);
	}
	/* RP_HOLD=PATH: the plan stays while PATH is there (at most 2 minutes) */
	for (int i = 0; getenv("RP_HOLD") && access(getenv("RP_HOLD"), F_OK) == 0 && i < 1200; i++)
		usleep(100000);
	ckpt_plan_destroy(p);
	ckpt_disconnect(c);
	return 0;
}

static pid_t spawn(const struct agent_proc *a, const char *job, int rank, int world, int last)
{
	char r[8], w[8], l[8];

	snprintf(r, sizeof(r), "%d", rank);
	snprintf(w, sizeof(w), "%d", world);
	snprintf(l, sizeof(l), "%d", last);
	return h_spawn(
	    NULL, H_OUT_KEEP, NULL,
	    (const char *[]){"test_replicas", "--rank", a->endpoint, job, r, w, l, NULL});
}

/* ---- nodes on one root --------------------------------------------------- */

struct nodes {
	char dir[256], root[300];
	struct agent_proc a[4];
	pid_t pid[8];
	int n, world, last; /* the ranks save steps 1 to last */
};

static void nodes_init(struct nodes *c, int world)
{
	const char *tmp = getenv("CK_TMPDIR") ? getenv("CK_TMPDIR") : "/tmp";

	memset(c, 0, sizeof(*c));
	snprintf(c->dir, sizeof(c->dir), "%s/ckrp.XXXXXX", tmp);
	ck_assert(mkdtemp(c->dir));
	snprintf(c->root, sizeof(c->root), "%s/shared", c->dir);
	c->world = world;
	c->last = 2;
}

/* Node i's agent started, then its trainers (ranks i, i + nodes, ...) at once. */
static void node_up(struct nodes *c, int i, int nodes, const char *job, const char *args)
{
	char name[8];

	snprintf(name, sizeof(name), "n%d", i);
	h_agent_start_node(&c->a[i], c->root, name, args);
	c->n = i + 1 > c->n ? i + 1 : c->n;
	for (int r = i; r < c->world; r += nodes)
		c->pid[r] = spawn(&c->a[i], job, r, c->world, c->last);
}

static void nodes_wait(struct nodes *c)
{
	for (int r = 0; r < c->world; r++)
		ck_assert_msg(h_reap(c->pid[r]) == 0, "rank %d failed (agent logs: %s ...)", r,
		              c->a[0].log);
}

static void nodes_cleanup(struct nodes *c)
{
	char cmd[400];

	for (int i = 0; i < c->n; i++)
		h_agent_cleanup(&c->a[i]);
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", c->dir);
	ck_assert_int_eq(system(cmd), 0);
}

/*
 * Whether the agent's log says `needle` (or `or`, where not NULL) within
 * `s` seconds: an event awaited, no timing.
 */
static bool log_within2(const struct agent_proc *a, const char *needle, const char * or, int s)
{
	for (int i = 0; i < s * 10; i++) {
		if (h_log_has(a, needle) || (or &&h_log_has(a, or)))
			return true;
		usleep(100000);
	}
	return false;
}

static bool log_within(const struct agent_proc *a, const char *needle, int s)
{
	return log_within2(a, needle, NULL, s);
}

/* show --json of job step: the shards' bytes, a rank's, bytes in extra copies. */
static void step_bytes(const struct agent_proc *a, const char *job, int step, long long *bytes,
                       long long *extra, long long *rank0)
{
	static char out[1 << 20];
	json_t *j, *l;

	ck_assert_int_eq(h_ctl(a, out, sizeof(out), "--json show %s %d", job, step), 0);
	j = json_loads(out, 0, NULL);
	ck_assert_msg(j, "%.400s", out);
	l = json_object_get(j, "layout");
	*bytes = json_integer_value(json_object_get(j, "bytes"));
	*extra = json_integer_value(json_object_get(l, "bytes_in_extra_copies"));
	*rank0 = json_integer_value(
	    json_object_get(json_array_get(json_object_get(l, "ranks"), 0), "bytes"));
	json_decref(j);
}

/* How many lines of the agent's log hold `what`. */
static int count_lines(const struct agent_proc *a, const char *what)
{
	char line[4096];
	FILE *f = fopen(a->log, "r");
	int n = 0;

	ck_assert_ptr_nonnull(f);
	while (fgets(line, sizeof(line), f))
		n += strstr(line, what) != NULL;
	fclose(f);
	return n;
}

/*
 * World `world` over 4 agents started one after another; the last only
 * once the first node's save of step 1 waits for the plan set. Step 1's
 * shards hold emb once.
 */
static void first_save_once(int world)
{
	const long long unique = EMB_BYTES + (long long)world * OWN * 4;
	long long bytes, extra, r0;
	struct nodes c;
	char job[16], captured[64];

	snprintf(job, sizeof(job), "rp%d", world);
	snprintf(captured, sizeof(captured), "capture of job %s step 1 rank 0: ", job);
	nodes_init(&c, world);
	for (int i = 0; i < 4; i++) {
		/*
		 * The last node comes once the first one's save is in: waiting
		 * for it, or (where it does not wait) captured.
		 */
		if (i == 3)
			ck_assert_msg(log_within2(&c.a[0], "save of step 1 waits for the plans",
			                          captured, 60),
			              "node n0's first save never came (%s)", c.a[0].log);
		else if (i > 0)
			sleep(1); /* the nodes start at different times */
		node_up(&c, i, 4, job, "--staging-mb 96 --plans-wait 30");
	}
	nodes_wait(&c);
	step_bytes(&c.a[0], job, 1, &bytes, &extra, &r0);
	ck_assert_msg(extra == 0, "step 1: %lld bytes in extra copies", extra);
	ck_assert_msg(bytes <= unique + unique / 20,
	              "step 1 wrote %lld bytes for %lld unique (%.2fx)", bytes, unique,
	              (double)bytes / (double)unique);
	/* it waited, and went on once the set was complete, not at the end of the wait */
	ck_assert(h_log_has(&c.a[0], "rank 0: save of step 1 waits for the plans"));
	ck_assert(h_log_has(&c.a[0], "rank 0: save of step 1 waited"));
	ck_assert(!h_log_has(&c.a[0], "(--plans-wait)"));
	step_bytes(&c.a[0], job, 2, &bytes, &extra, &r0);
	ck_assert_msg(extra == 0 && bytes <= unique + unique / 20, "step 2: %lld bytes", bytes);
	/*
	 * Rank 0's node alone read the plans: it wrote every node's share; the
	 * others read their own, never a plans file or summary.
	 */
	ck_assert_msg(h_log_has(&c.a[0], "written (4 nodes)"), "no shares written (%s)",
	              c.a[0].log);
	for (int i = 1; i < 4; i++) {
		ck_assert_msg(!h_log_has(&c.a[i], "plans summaries of run") &&
		                  !h_log_has(&c.a[i], "plans files of run"),
		              "node n%d read the plans of every node (%s)", i, c.a[i].log);
		ck_assert_msg(h_log_has(&c.a[i], "(its share from rank 0's node)"),
		              "node n%d took no share (%s)", i, c.a[i].log);
	}
	/* and it committed both steps by the assignment it made, reading no part whole */
	ck_assert_msg(
	    count_lines(&c.a[0], "(replicas covered by the assignment: no part read whole)") == 2,
	    "a step's parts were read whole (%s)", c.a[0].log);
	nodes_cleanup(&c);
}

START_TEST(first_save_four_replicas)
{
	first_save_once(4);
}
END_TEST

START_TEST(first_save_eight_replicas)
{
	first_save_once(8);
}
END_TEST

/*
 * Node n1 comes only after n0's first save waited --plans-wait (1 s) in
 * vain: that save writes all rank 0 holds, and says so; n1's rank writes
 * its share of the complete set. The step commits (nothing is left
 * unwritten), and n0 goes on looking until it has the set.
 */
START_TEST(wait_bounded)
{
	long long bytes, extra, r0;
	struct nodes c;

	nodes_init(&c, 2);
	node_up(&c, 0, 2, "rw", "--staging-mb 96 --plans-wait 1");
	ck_assert_msg(log_within(&c.a[0], "waited 1 s (--plans-wait)", 60),
	              "n0's save did not say it waited in vain (%s)", c.a[0].log);
	node_up(&c, 1, 2, "rw", "--staging-mb 96 --plans-wait 1");
	nodes_wait(&c);
	step_bytes(&c.a[0], "rw", 1, &bytes, &extra, &r0);
	ck_assert_msg(r0 >= EMB_BYTES, "rank 0 wrote %lld bytes, not all it holds", r0);
	/* and rank 1 its share (a piece of emb both wrote: not a copy of one box) */
	ck_assert_msg(bytes > r0 && bytes < 2 * EMB_BYTES, "step 1: %lld bytes, rank 0's %lld",
	              bytes, r0);
	ck_assert(log_within(&c.a[0], "job rw rank 0: replicas written once", 60));
	ck_assert(h_log_has(&c.a[1], "job rw rank 1: replicas written once"));
	/* step 2: n0 knew the set before its trainer heard step 1 committed */
	step_bytes(&c.a[0], "rw", 2, &bytes, &extra, &r0);
	ck_assert_msg(extra == 0 && bytes <= (EMB_BYTES + 2 * OWN * 4) * 21 / 20,
	              "step 2: %lld bytes, %lld in extra copies", bytes, extra);
	nodes_cleanup(&c);
}
END_TEST

#ifdef CKPT_FAULT_INJECTION
/*
 * Rank 0's node cannot write the shares (every rename onto a .share
 * fails): it says so and writes no set mark; the other node waits for
 * one half the commit deadline (3 s), says so, then reads every node's
 * plans itself and writes its own share of the assignment. n0 tries
 * again, after a back-off that grows.
 */
START_TEST(shares_not_written)
{
	const char *args = "--staging-mb 96 --plans-wait 1 --commit-deadline 6";
	int tries, looks, whole;
	char hold[320];
	struct nodes c;
	FILE *f;

	nodes_init(&c, 2);
	snprintf(hold, sizeof(hold), "%s/hold", c.dir);
	ck_assert_ptr_nonnull(f = fopen(hold, "w"));
	fclose(f);
	setenv("RP_HOLD", hold, 1); /* the trainers stay while the test looks */
	h_agent_start_node_env(&c.a[0], c.root, "n0", args,
	                       "CKPT_FAULTS=renameat:EIO:path=*.share:count=inf");
	c.n = 1;
	c.pid[0] = spawn(&c.a[0], "rf", 0, 2, c.last);
	node_up(&c, 1, 2, "rf", args);
	unsetenv("RP_HOLD");
	ck_assert_msg(log_within(&c.a[0], "2 of 2 nodes' shares not put", 60),
	              "n0 did not say its shares are not written (%s)", c.a[0].log);
	ck_assert_msg(log_within(&c.a[1], "for half the commit deadline", 60),
	              "n1 did not say it waited in vain for rank 0's node (%s)", c.a[1].log);
	ck_assert_msg(log_within(&c.a[1], "job rf rank 1: replicas written once", 60),
	              "n1 made no share of its own (%s)", c.a[1].log);
	ck_assert(h_log_has(&c.a[1], "job rf: plans files of run 0 read whole (2 nodes)"));
	ck_assert(!h_log_has(&c.a[1], "(its share from rank 0's node)"));
	/*
	 * n0 tries the shares again after a back-off that grows (2, 4, 8, 16 s),
	 * not at each of its polls (every second): over 20 s, one to three tries,
	 * each one look at the summaries and one whole read.
	 */
	tries = count_lines(&c.a[0], "nodes' shares not put");
	looks = count_lines(&c.a[0], "job rf: plans summaries of run 0 read");
	whole = count_lines(&c.a[0], "job rf: plans files of run 0 read whole");
	sleep(20);
	tries = count_lines(&c.a[0], "nodes' shares not put") - tries;
	looks = count_lines(&c.a[0], "job rf: plans summaries of run 0 read") - looks;
	whole = count_lines(&c.a[0], "job rf: plans files of run 0 read whole") - whole;
	ck_assert_msg(tries >= 1 && tries <= 3 && looks <= 4 && whole <= 4,
	              "in 20 s: %d tries of the shares, %d looks, %d whole reads (%s)", tries,
	              looks, whole, c.a[0].log);
	unlink(hold);
	nodes_wait(&c);
	nodes_cleanup(&c);
}
END_TEST

/*
 * Two nodes, n0's agent with the faults `faults`, n1 coming once n0's
 * first save waits; both steps' shards hold emb once.
 */
static void two_nodes_once(struct nodes *c, const char *job, const char *faults)
{
	const char *args = "--staging-mb 96 --plans-wait 30";
	long long bytes, extra, r0;
	char waits[96];

	nodes_init(c, 2);
	snprintf(waits, sizeof(waits), "job %s rank 0: save of step 1 waits for the plans", job);
	h_agent_start_node_env(&c->a[0], c->root, "n0", args, faults);
	c->n = 1;
	c->pid[0] = spawn(&c->a[0], job, 0, 2, c->last);
	ck_assert_msg(log_within(&c->a[0], waits, 60), "n0's save did not wait (%s)", c->a[0].log);
	node_up(c, 1, 2, job, args);
	nodes_wait(c);
	for (int step = 1; step <= 2; step++) {
		step_bytes(&c->a[0], job, step, &bytes, &extra, &r0);
		ck_assert_msg(extra == 0 && bytes <= (EMB_BYTES + 2 * OWN * 4) * 21 / 20,
		              "step %d: %lld bytes, %lld in extra copies (%s)", step, bytes, extra,
		              c->a[0].log);
	}
	ck_assert(!h_log_has(&c->a[1], "for half the commit deadline"));
	ck_assert(h_log_has(&c->a[1], "(its share from rank 0's node)"));
}

/*
 * A node's plans rank 0's node cannot read once (an I/O error on its
 * summary, then on its file): that look fails, and is made again, never taken for a set without
 * that node (which would have every node write every replica until the plans change).
 */
START_TEST(read_error_looked_again)
{
	struct nodes c;

	two_nodes_once(&c, "re", "CKPT_FAULTS=openat:EIO:path=*/plans/n1.*:count=2");
	ck_assert(h_log_has(&c.a[0], "/plans/n1.json) = EIO"));
	ck_assert(h_log_has(&c.a[0], "job re: plans of the other nodes not read"));
	nodes_cleanup(&c);
}
END_TEST

/*
 * A share rank 0's node cannot write once: it says so and writes them
 * again a moment later (it looks every second), before the other node
 * gives up waiting.
 */
START_TEST(shares_written_again)
{
	struct nodes c;

	two_nodes_once(&c, "ra", "CKPT_FAULTS=renameat:EIO:path=*/plans/n1.share");
	ck_assert(h_log_has(&c.a[0], "1 of 2 nodes' shares not put"));
	ck_assert(h_log_has(&c.a[0], "job ra: shares of plan set"));
	ck_assert(h_log_has(&c.a[0], "of run 0 written (2 nodes)"));
	nodes_cleanup(&c);
}
END_TEST

/*
 * This node's plans file that cannot be put twice (the link onto
 * plans/n0.json fails: the put as the plan is made, and the one its parked
 * save asks for): the put is tried again after a back-off, not only when
 * the plans change next, and the plan set comes together before the save
 * has waited in vain.
 */
START_TEST(publish_failed_tried_again)
{
	struct nodes c;

	two_nodes_once(&c, "rp", "CKPT_FAULTS=linkat:EIO:path=*/plans/n0.json:count=2");
	ck_assert(h_log_has(&c.a[0], "job rp: cannot publish this node's plans (tried again)"));
	ck_assert(h_log_has(&c.a[0], "job rp: plans of node n0 published"));
	nodes_cleanup(&c);
}
END_TEST
#endif

/*
 * In the agent's log, between the first line holding `from` and the first
 * after it holding `to`: how many lines hold `what`; -1 where `from` or
 * `to` is not there.
 */
static int count_between(const struct agent_proc *a, const char *from, const char *to,
                         const char *what)
{
	char line[4096];
	FILE *f = fopen(a->log, "r");
	int n = 0, at = 0; /* 0: before from, 1: between, 2: past to */

	ck_assert_ptr_nonnull(f);
	while (at < 2 && fgets(line, sizeof(line), f)) {
		if (at == 0 && strstr(line, from))
			at = 1;
		else if (at == 1 && strstr(line, to))
			at = 2;
		else if (at == 1 && strstr(line, what))
			n++;
	}
	fclose(f);
	return at == 2 ? n : -1;
}

/*
 * Where no node's plans changed, a step's end reads no plans file: the
 * agent looks at the job's plans generation after each step (steps 2 to
 * 5 here), finds it unchanged, and reads nothing more; nor between them.
 */
START_TEST(step_end_reads_unchanged_plans_once)
{
	struct nodes c;
	int looks, reads;

	nodes_init(&c, 2);
	c.last = 6;
	node_up(&c, 0, 2, "rs", "--staging-mb 96");
	node_up(&c, 1, 2, "rs", "--staging-mb 96");
	nodes_wait(&c);
	looks = count_between(&c.a[0], "committed job rs step 2 ", "committed job rs step 6 ",
	                      "job rs: plans generation");
	reads = count_between(&c.a[0], "committed job rs step 2 ", "committed job rs step 6 ",
	                      "job rs: plans summaries of run") +
	        count_between(&c.a[0], "committed job rs step 2 ", "committed job rs step 6 ",
	                      "job rs: plans files of run");
	ck_assert_msg(looks >= 4, "%d looks at the plans generation after steps 2 to 5 (%s)", looks,
	              c.a[0].log);
	ck_assert_msg(reads == 0, "plans files read %d times, none of them changed (%s)", reads,
	              c.a[0].log);
	/* the summaries were read, before: the first look of the run; the files once, whole */
	ck_assert(
	    h_log_has(&c.a[0], "job rs: plans summaries of run 0 read (2 nodes, 2 of 2 ranks"));
	ck_assert(h_log_has(&c.a[0], "job rs: plans files of run 0 read whole (2 nodes)"));
	nodes_cleanup(&c);
}
END_TEST

/*
 * A save parked for its plan set when the agent is told to stop: answered
 * (refused), and the agent stops, without waiting out --plans-wait (30 s).
 */
START_TEST(stop_answers_parked_save)
{
	struct agent_proc a;
	pid_t pid;

	h_agent_start(&a, "--staging-mb 96 --plans-wait 30");
	pid = spawn(&a, "rq", 0, 2, 1); /* rank 1 never comes */
	ck_assert_msg(log_within(&a, "rank 0: save of step 1 waits for the plans", 60),
	              "the save was not parked (%s)", a.log);
	ck_assert_int_eq(h_agent_stop(&a), 0);
	/* refused (its plan let go with its session, or the agent stopping) */
	ck_assert_msg(h_log_has(&a, "/ckpt.v1.Ckpt/Save: save: "), "%s", a.log);
	ck_assert(!h_log_has(&a, "(--plans-wait)"));
	kill(pid, SIGKILL);
	h_reap(pid);
	h_agent_cleanup(&a);
}
END_TEST

int test_before(int argc, char **argv)
{
	if (argc == 7 && strcmp(argv[1], "--rank") == 0)
		return rank_main(argv + 2);
	signal(SIGPIPE, SIG_IGN);
	return TEST_RUN;
}

Suite *test_suite(void)
{
	Suite *s;
	TCase *tc;

	s = suite_create("replicas");
	tc = tcase_create("replicas");
	tcase_set_timeout(tc, 600);
	tcase_add_test(tc, first_save_four_replicas);
	tcase_add_test(tc, first_save_eight_replicas);
	tcase_add_test(tc, wait_bounded);
	tcase_add_test(tc, step_end_reads_unchanged_plans_once);
	tcase_add_test(tc, stop_answers_parked_save);
#ifdef CKPT_FAULT_INJECTION
	tcase_add_test(tc, shares_not_written);
	tcase_add_test(tc, read_error_looked_again);
	tcase_add_test(tc, shares_written_again);
	tcase_add_test(tc, publish_failed_tried_again);
#endif
	suite_add_tcase(s, tc);
	return s;
}
